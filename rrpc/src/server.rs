//! RPC server threads: each polls the request Rockets of the connections assigned to it,
//! dispatches messages to handlers registered by id, and answers through response
//! Rockets, posting all of a connection's ready buckets and its credit return as one
//! WR list (one doorbell) per polling round (Scythe 000_f3dba2ed893b246b.txt, 4.6, Fig. 19).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::fabric::{
    CompletionQueue, Fabric, FabricError, MemoryRegion, MrDesc, QpEndpoint, QpState, QueuePair,
    RemoteAddr, SendWr, Wc, WrOpcode,
};
use crate::node::RpcAccept;
use crate::rocket::{
    decode_batch, BucketSpan, MsgHeader, RingMem, RocketConfig, RocketReceiver, RocketSender,
};
use crate::wire::{MsgKind, IDLE_SPINS};

/// A request handler: reads the request payload, appends the response payload to `out`.
/// An `Err` is sent back to the caller as [`crate::runtime::RpcError::Remote`].
pub type Handler = Arc<dyn Fn(&[u8], &mut Vec<u8>) -> Result<(), String> + Send + Sync>;

/// Handlers by id.
#[derive(Clone, Default)]
pub struct Handlers {
    map: HashMap<u16, Handler>,
}

impl Handlers {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }
    /// Register `f` as handler `id`, replacing any earlier one.
    pub fn register(
        &mut self,
        id: u16,
        f: impl Fn(&[u8], &mut Vec<u8>) -> Result<(), String> + Send + Sync + 'static,
    ) -> &mut Self {
        self.map.insert(id, Arc::new(f));
        self
    }

    /// Run handler `id` on `req`, replacing `out` with its response payload. Returns
    /// [`MsgKind::Response`] on success; otherwise [`MsgKind::Error`] with a UTF-8 message in
    /// `out`: the handler's own error, "no handler N", or "handler N panicked" (a panicking
    /// handler fails its call, not the thread serving every connection assigned to it).
    pub fn call(&self, id: u16, req: &[u8], out: &mut Vec<u8>) -> MsgKind {
        out.clear();
        let Some(h) = self.map.get(&id) else {
            out.extend_from_slice(format!("no handler {id}").as_bytes());
            return MsgKind::Error;
        };
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| h(req, out))) {
            Ok(Ok(())) => MsgKind::Response,
            Ok(Err(msg)) => {
                out.clear();
                out.extend_from_slice(msg.as_bytes());
                MsgKind::Error
            }
            Err(_) => {
                tracing::error!(handler = id, "RPC handler panicked");
                out.clear();
                out.extend_from_slice(format!("handler {id} panicked").as_bytes());
                MsgKind::Error
            }
        }
    }
}

struct ServerConn {
    /// Stable id carried in `wr_id`: indices shift when dead channels are removed.
    id: u64,
    qp: QueuePair,
    peer: u32,
    req_ring: MemoryRegion,
    req_rx: RocketReceiver,
    req_credit: RemoteAddr,
    resp_staging: MemoryRegion,
    resp_tx: RocketSender,
    resp_ring: MrDesc,
    /// Word 0: response credits written by the client. Word 1: source of credit WRITEs.
    words: MemoryRegion,
    cfg: RocketConfig,
    /// WRs that did not fit in the send queue, posted first next round.
    unposted: Vec<SendWr>,
    /// WRs posted and not yet completed, and the size of each posted list (a list's
    /// slots free up when its signaled last WR completes). Never more than
    /// [`SQ_DEPTH`]: a post that fails may have posted part of its list.
    outstanding: usize,
    lists: VecDeque<usize>,
    backlog: VecDeque<(MsgHeader, Vec<u8>)>,
    dead: bool,
}

/// The RPC server of a node: `threads` threads, connections spread round robin.
pub struct RpcServer {
    fabric: Fabric,
    workers: Vec<(Sender<ServerConn>, CompletionQueue)>,
    next: AtomicUsize,
    stop: Arc<AtomicBool>,
    joins: Mutex<Vec<JoinHandle<()>>>,
}

impl RpcServer {
    /// Start `threads` (at least 1) server threads.
    pub fn start(fabric: Fabric, handlers: Handlers, threads: usize) -> Result<Self, FabricError> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut workers = Vec::new();
        let mut joins = Vec::new();
        for i in 0..threads.max(1) {
            let (tx, rx) = channel();
            let cq = fabric.create_cq(4096)?;
            let (h, s, c) = (handlers.clone(), stop.clone(), cq.clone());
            joins.push(
                std::thread::Builder::new()
                    .name(format!("rpc-server-{i}"))
                    .spawn(move || serve(rx, c, h, s))
                    .map_err(|e| FabricError::Io {
                        op: "spawn RPC server thread",
                        source: e,
                    })?,
            );
            workers.push((tx, cq));
        }
        Ok(Self {
            fabric,
            workers,
            next: AtomicUsize::new(0),
            stop,
            joins: Mutex::new(joins),
        })
    }

    /// Accept an RPC channel from a client (called by the control plane).
    pub fn accept(
        &self,
        endpoint: QpEndpoint,
        cfg: RocketConfig,
        resp_ring: MrDesc,
        req_credit: RemoteAddr,
    ) -> Result<RpcAccept, FabricError> {
        let bad = |what: String| FabricError::InvalidArgument {
            op: "accept RPC channel",
            what,
        };
        let req_rx = RocketReceiver::new(cfg).map_err(|e| bad(e.to_string()))?;
        let resp_tx = RocketSender::new(cfg).map_err(|e| bad(e.to_string()))?;
        if (resp_ring.len as usize) < cfg.ring_bytes() {
            return Err(bad(format!(
                "response ring of {} bytes is smaller than {} buckets x {} bytes",
                resp_ring.len, cfg.buckets, cfg.bucket_size
            )));
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let w = id % self.workers.len();
        let (tx, cq) = &self.workers[w];
        let mut qp = self.fabric.create_qp(cq, SQ_DEPTH)?;
        qp.connect(&endpoint)?;
        let req_ring = self.fabric.alloc_mr(cfg.ring_bytes())?;
        let resp_staging = self.fabric.alloc_mr(cfg.ring_bytes())?;
        let words = self.fabric.alloc_mr(16)?;
        let accept = RpcAccept {
            endpoint: qp.endpoint(),
            req_ring: req_ring.desc(),
            resp_credit: words.desc().at(0),
        };
        let conn = ServerConn {
            id: id as u64,
            qp,
            peer: endpoint.node,
            req_ring,
            req_rx,
            req_credit,
            resp_staging,
            resp_tx,
            resp_ring,
            words,
            cfg,
            unposted: Vec::new(),
            outstanding: 0,
            lists: VecDeque::new(),
            backlog: VecDeque::new(),
            dead: false,
        };
        tx.send(conn)
            .map_err(|_| bad("server is stopping".into()))?;
        Ok(accept)
    }

    /// Ask the threads to stop and join them.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Ok(mut j) = self.joins.lock() {
            for h in j.drain(..) {
                let _ = h.join();
            }
        }
    }
}

fn serve(rx: Receiver<ServerConn>, cq: CompletionQueue, handlers: Handlers, stop: Arc<AtomicBool>) {
    let mut conns: Vec<ServerConn> = Vec::new();
    let mut batch = Vec::with_capacity(4096);
    let mut out = Vec::with_capacity(4096);
    let mut spans: Vec<BucketSpan> = Vec::new();
    let mut wrs: Vec<SendWr> = Vec::new();
    let mut wcs: Vec<Wc> = Vec::new();
    let mut idle = 0u32;
    while !stop.load(Ordering::Relaxed) {
        while let Ok(c) = rx.try_recv() {
            tracing::debug!(peer = c.peer, "RPC channel accepted");
            conns.push(c);
        }
        let mut work = false;
        for c in conns.iter_mut() {
            if c.dead {
                continue;
            }
            if c.qp.state() == QpState::Error {
                tracing::debug!(peer = c.peer, "client gone; dropping RPC channel");
                c.dead = true;
                continue;
            }
            let _ = c
                .resp_tx
                .on_credit(crate::runtime::stable_word(&c.words, 0));
            while let Some((h, p)) = c.backlog.front() {
                if c.resp_tx.push(&c.resp_staging, *h, p).is_err() {
                    break;
                }
                c.backlog.pop_front();
            }
            // Take at most one ring's worth per round so one client cannot starve others.
            for _ in 0..c.cfg.buckets {
                if !c.backlog.is_empty() {
                    break; // back-pressure: stop consuming until responses fit
                }
                batch.clear();
                match c.req_rx.poll(&c.req_ring, &mut batch) {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => {
                        let off =
                            c.req_rx.consumed() % c.cfg.buckets as u64 * c.cfg.bucket_size as u64;
                        tracing::warn!(
                            peer = c.peer,
                            error = %e,
                            consumed = c.req_rx.consumed(),
                            label = format!("{:#x}", c.req_ring.load_u64(off as usize)),
                            "corrupt request ring; dropping channel"
                        );
                        c.dead = true;
                        break;
                    }
                }
                work = true;
                for m in decode_batch(&batch) {
                    let Ok((hdr, payload)) = m else {
                        tracing::warn!(peer = c.peer, "corrupt request batch");
                        c.dead = true;
                        break;
                    };
                    let kind = handlers.call(hdr.handler, payload, &mut out);
                    if out.len() > c.resp_tx.max_payload() {
                        let msg = format!(
                            "response of {} bytes exceeds the {}-byte message limit",
                            out.len(),
                            c.resp_tx.max_payload()
                        );
                        out.clear();
                        out.extend_from_slice(msg.as_bytes());
                    }
                    let rh = MsgHeader {
                        len: out.len() as u32,
                        handler: hdr.handler,
                        kind: kind as u8,
                        flags: 0,
                        call_id: hdr.call_id,
                    };
                    if c.resp_tx.push(&c.resp_staging, rh, &out).is_err() {
                        c.backlog.push_back((rh, out.clone()));
                    }
                }
            }
            if c.dead {
                continue;
            }
            // Flush: every ready response bucket plus the credit return, one doorbell.
            c.resp_tx.seal(&c.resp_staging);
            spans.clear();
            c.resp_tx.take_ready(&mut spans);
            wrs.clear();
            wrs.append(&mut c.unposted);
            for s in &spans {
                wrs.push(SendWr {
                    wr_id: c.id,
                    opcode: WrOpcode::Write,
                    sge: c.resp_staging.sge(s.offset, s.len),
                    remote: c.resp_ring.at(s.offset as u64),
                    signaled: false,
                    inline: false,
                });
            }
            if let Some(credit) = c.req_rx.credit_due(credit_every(&c.cfg)) {
                c.words.store_u64(8, credit);
                wrs.push(SendWr {
                    wr_id: c.id,
                    opcode: WrOpcode::Write,
                    sge: c.words.sge(8, 8),
                    remote: c.req_credit,
                    signaled: false,
                    inline: true,
                });
            }
            // Post what fits in the send queue; the rest goes first next round.
            let room = if c.lists.len() >= MAX_LISTS_IN_FLIGHT {
                0
            } else {
                SQ_DEPTH - c.outstanding
            };
            if wrs.len() > room {
                c.unposted = wrs.split_off(room);
            }
            for w in wrs.iter_mut() {
                w.signaled = false;
            }
            if let Some(last) = wrs.last_mut() {
                last.signaled = true;
                if let Err(e) = c.qp.post_send(&wrs) {
                    tracing::warn!(peer = c.peer, error = %e, "post failed; dropping channel");
                    c.dead = true;
                }
                c.outstanding += wrs.len();
                c.lists.push_back(wrs.len());
            }
        }
        wcs.clear();
        cq.poll(&mut wcs, 256);
        for wc in &wcs {
            let Some(c) = conns.iter_mut().find(|c| c.id == wc.wr_id) else {
                continue;
            };
            if wc.status == crate::fabric::WcStatus::Success {
                // RC completes in order: this is the oldest list's signaled WR.
                if let Some(n) = c.lists.pop_front() {
                    c.outstanding -= n;
                }
            } else {
                tracing::debug!(peer = c.peer, status = ?wc.status, "WR failed; dropping channel");
                c.dead = true;
            }
        }
        // Dropping a channel destroys its QP first (field order), which flushes any WR
        // still in flight, then frees its rings.
        conns.retain(|c| !c.dead);
        if work {
            idle = 0;
        } else {
            idle += 1;
            if idle > IDLE_SPINS {
                std::thread::yield_now();
            }
        }
    }
}

/// Send-queue depth of a server QP, in WRs.
const SQ_DEPTH: usize = 1024;
/// Posted lists in flight per channel at most: bounds what the thread's CQ (4096 entries)
/// must hold to 64 channels' worth.
const MAX_LISTS_IN_FLIGHT: usize = 64;

/// Return credits after a quarter of the ring has been consumed (and at least every bucket
/// for tiny rings), so the sender rarely stalls and credit WRITEs stay rare.
pub(crate) fn credit_every(cfg: &RocketConfig) -> u64 {
    (cfg.buckets as u64 / 4).max(1)
}
