//! RPC server threads (Scythe 000_f3dba2ed893b246b.txt, 4.6, Fig. 19 and 20).
//!
//! Each thread polls the request Rockets assigned to it, dispatches messages to handlers
//! registered by id, and answers through response Rockets. A polling round has three
//! phases: (1) drain every Rocket's ready buckets and run plain handlers; (2) run the
//! sorted-batch handlers once over all requests of the round, sorted by (key, timestamp)
//! (Scythe 4.4, Fig. 16); (3) flush: per Rocket, its ready response buckets, zero-copy
//! data WRITEs and credit return go out as one WR list (one doorbell) on a QP of the
//! requester's straw ([`crate::straw`]), the server side of "symmetric" RRPC.
//!
//! Replies travel in the mode the request asks for ([`ReplyMode`]): inline in the
//! response Rocket; RPC + one-sided READ (the reply is placed in a server buffer held
//! until the caller releases it or [`ServerConfig::read_hold`] passes); or zero-copy (the
//! reply is WRITten into the caller's buffer, and the small [`MsgKind::ZeroCopyDone`]
//! response is sent only once that WRITE has completed, so a failed WRITE can be replayed
//! while the caller's buffer is still reserved for it).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::arena::{Arena, Chunk};
use crate::ctrl::{RocketOffer, RpcAccept};
use crate::fabric::{
    Fabric, FabricError, MemoryRegion, MrDesc, QpEndpoint, RemoteAddr, SendWr, WcStatus, WrOpcode,
};
use crate::rocket::{
    decode_batch, BucketSpan, MsgHeader, RocketConfig, RocketReceiver, RocketSender,
};
use crate::straw::{Mailbox, QpKind, SharedQp, QP_CQ_DEPTH};
use crate::wire::{Batching, IdHash, MsgKind, ReadReply, ReplyMode, ZeroCopyPrefix, IDLE_SPINS};

/// A request handler: reads the request payload, appends the response payload to `out`.
/// An `Err` is sent back to the caller as [`crate::runtime::RpcError::Remote`].
pub type Handler = Arc<dyn Fn(&[u8], &mut Vec<u8>) -> Result<(), String> + Send + Sync>;

/// One request of a sorted batch.
#[derive(Clone, Copy, Debug)]
pub struct BatchReq<'a> {
    /// Object key the request is sorted by first.
    pub key: u64,
    /// Timestamp it is sorted by second.
    pub ts: u64,
    /// The request payload.
    pub payload: &'a [u8],
}

/// Extracts `(key, timestamp)` from a request payload; `None` rejects it as malformed.
pub type KeyFn = Arc<dyn Fn(&[u8]) -> Option<(u64, u64)> + Send + Sync>;
/// Handles a polling round's requests, sorted by (key, timestamp): pushes one result
/// per request, in the order given.
pub type BatchFn = Arc<dyn Fn(&[BatchReq<'_>], &mut Vec<Result<Vec<u8>, String>>) + Send + Sync>;

/// Handlers by id.
#[derive(Clone, Default)]
pub struct Handlers {
    map: HashMap<u16, Handler, IdHash>,
    sorted: HashMap<u16, (KeyFn, BatchFn), IdHash>,
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
        self.sorted.remove(&id);
        self.map.insert(id, Arc::new(f));
        self
    }

    /// Register a sorted-batch handler `id` (Scythe 4.4, Fig. 16): each server thread
    /// collects the round's requests for `id` from all its Rockets, sorts them by
    /// `key(payload)` = (object key, timestamp) (stable, so equal pairs keep arrival
    /// order), and calls `f` once with the batch. `f` pushes one result per request in
    /// batch order; a missing result fails that request, a request `key` rejects gets an
    /// error reply. Replaces any earlier handler `id`.
    pub fn register_sorted(
        &mut self,
        id: u16,
        key: impl Fn(&[u8]) -> Option<(u64, u64)> + Send + Sync + 'static,
        f: impl Fn(&[BatchReq<'_>], &mut Vec<Result<Vec<u8>, String>>) + Send + Sync + 'static,
    ) -> &mut Self {
        self.map.remove(&id);
        self.sorted.insert(id, (Arc::new(key), Arc::new(f)));
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

/// Settings of an [`RpcServer`].
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Server threads (at least 1); Rockets are spread over them round robin.
    pub threads: usize,
    /// Registered buffer bytes per thread for RPC+READ replies and zero-copy WRITEs
    /// (default 64 MiB; untouched pages cost nothing).
    pub buffer_bytes: usize,
    /// Largest reply in bytes the READ and zero-copy modes carry (default 4 MiB).
    pub max_reply_bytes: usize,
    /// How long an RPC+READ reply buffer is held for a caller that never releases it
    /// (default 5 s).
    pub read_hold: Duration,
    /// CPU cores to pin the threads to, round robin (default none: not pinned).
    pub cores: Vec<usize>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            threads: 1,
            buffer_bytes: 64 << 20,
            max_reply_bytes: 4 << 20,
            read_hold: Duration::from_secs(5),
            cores: Vec::new(),
        }
    }
}

/// The server ends of one requester process's RPC QPs.
struct ServerStraw {
    id: u64,
    qps: RwLock<Vec<Arc<SharedQp>>>,
}

impl ServerStraw {
    fn pick(&self, current: Option<&Arc<SharedQp>>) -> Option<Arc<SharedQp>> {
        let v = self.qps.read().unwrap_or_else(|p| p.into_inner());
        crate::straw::rebind(&v, current)
    }
    fn find(&self, qp_id: u64) -> Option<Arc<SharedQp>> {
        let v = self.qps.read().unwrap_or_else(|p| p.into_inner());
        v.iter().find(|q| q.id() == qp_id).cloned()
    }
}

/// A zero-copy reply WRITE waiting to be posted or completed.
struct DataWr {
    chunk: Chunk,
    len: usize,
    remote: RemoteAddr,
    resp: MsgHeader,
}

struct ServerConn {
    /// Stable id: indices shift when dead channels are removed.
    id: u64,
    straw: Arc<ServerStraw>,
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
    batching: Batching,
    /// The requester's [`ReplyMode::Auto`] threshold, bytes.
    mode_threshold: usize,
    /// Responses that did not fit in the response ring (back-pressure).
    backlog: VecDeque<(MsgHeader, Vec<u8>)>,
    /// Sealed response buckets to post (replays first).
    spans: VecDeque<BucketSpan>,
    /// Zero-copy WRITEs to post (replays first).
    data: VecDeque<DataWr>,
    force_credit: bool,
    /// The QP this Rocket's lists are outstanding on, and how many.
    qp: Option<Arc<SharedQp>>,
    lists: usize,
    /// Since when no QP of the straw was usable while work waited.
    stuck_since: Option<Instant>,
    dead: bool,
}

/// The RPC server of a node: threads serving Rocket pairs, and the server ends of the
/// requesters' RPC QPs.
pub struct RpcServer {
    fabric: Fabric,
    workers: Vec<Sender<Cmd>>,
    next: AtomicUsize,
    stop: Arc<AtomicBool>,
    joins: Mutex<Vec<JoinHandle<()>>>,
    straws: Arc<Mutex<HashMap<u64, Arc<ServerStraw>>>>,
}

/// Send-queue depth of a server QP, in WRs.
const SQ_DEPTH: usize = 1024;
/// How long a Rocket may find none of its straw's QPs usable before it is dropped (the
/// requester reconnects a failed QP within milliseconds; a dead one never does).
const STUCK_LIMIT: Duration = Duration::from_secs(2);

impl RpcServer {
    /// Start `threads` (at least 1) server threads with default buffers.
    pub fn start(fabric: Fabric, handlers: Handlers, threads: usize) -> Result<Self, FabricError> {
        Self::with_config(
            fabric,
            handlers,
            ServerConfig {
                threads,
                ..ServerConfig::default()
            },
        )
    }

    /// Start the server threads `cfg` asks for. Errors: buffers cannot be registered, a
    /// thread cannot be spawned.
    pub fn with_config(
        fabric: Fabric,
        handlers: Handlers,
        cfg: ServerConfig,
    ) -> Result<Self, FabricError> {
        let stop = Arc::new(AtomicBool::new(false));
        let straws = Arc::new(Mutex::new(HashMap::new()));
        let mut workers = Vec::new();
        let mut joins = Vec::new();
        for i in 0..cfg.threads.max(1) {
            let (tx, rx) = channel();
            let arena = Arena::new(&fabric, cfg.buffer_bytes, cfg.max_reply_bytes)?;
            let w = Worker {
                handlers: handlers.clone(),
                arena,
                read_hold: cfg.read_hold,
                holds: HashMap::default(),
                next_handle: 1,
                mailbox: Mailbox::new(),
                recs: Vec::new(),
                free_recs: Vec::new(),
                span_pool: Vec::new(),
                straws: straws.clone(),
            };
            let s = stop.clone();
            let core = (!cfg.cores.is_empty()).then(|| cfg.cores[i % cfg.cores.len()]);
            joins.push(
                std::thread::Builder::new()
                    .name(format!("rpc-server-{i}"))
                    .spawn(move || {
                        if let Some(c) = core {
                            pin_to(c);
                        }
                        serve(rx, w, s)
                    })
                    .map_err(|e| FabricError::Io {
                        op: "spawn RPC server thread",
                        source: e,
                    })?,
            );
            workers.push(tx);
        }
        Ok(Self {
            fabric,
            workers,
            next: AtomicUsize::new(0),
            stop,
            joins: Mutex::new(joins),
            straws,
        })
    }

    fn straw(&self, id: u64) -> Option<Arc<ServerStraw>> {
        self.straws.lock().ok()?.get(&id).cloned()
    }

    /// Create the server end of RPC QP `qp_id` of requester straw `straw`, connected to
    /// `endpoint`; returns its endpoint (called by the control plane).
    pub fn add_qp(
        &self,
        straw: u64,
        qp_id: u64,
        endpoint: &QpEndpoint,
    ) -> Result<QpEndpoint, FabricError> {
        let cq = self.fabric.create_cq(QP_CQ_DEPTH)?;
        let mut qp = self.fabric.create_qp(&cq, SQ_DEPTH)?;
        qp.connect(endpoint)?;
        let ep = qp.endpoint();
        let shared = SharedQp::new(qp_id, QpKind::Rpc, qp, cq);
        let mut map = self.straws.lock().map_err(|_| poisoned())?;
        let s = map.entry(straw).or_insert_with(|| {
            Arc::new(ServerStraw {
                id: straw,
                qps: RwLock::new(Vec::new()),
            })
        });
        s.qps
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(shared);
        Ok(ep)
    }

    /// Replace the server end of RPC QP `qp_id` with a new one connected to `endpoint`:
    /// the old end is destroyed, and lists outstanding on it are replayed by their
    /// threads. Errors: no such QP; the new QP cannot be created.
    pub fn reconnect_qp(
        &self,
        straw: u64,
        qp_id: u64,
        endpoint: &QpEndpoint,
    ) -> Result<QpEndpoint, FabricError> {
        let shared = self
            .straw(straw)
            .and_then(|s| s.find(qp_id))
            .ok_or_else(|| FabricError::InvalidArgument {
                op: "reconnect QP",
                what: format!("no QP {qp_id} of straw {straw:#x}"),
            })?;
        let cq = self.fabric.create_cq(QP_CQ_DEPTH)?;
        let mut qp = self.fabric.create_qp(&cq, SQ_DEPTH)?;
        qp.connect(endpoint)?;
        let ep = qp.endpoint();
        shared.replace(qp, cq);
        Ok(ep)
    }

    /// Retire the server end of RPC QP `qp_id`, wait (up to 1 s) for its lists to
    /// complete, and destroy it. Returns whether it existed.
    pub fn release_qp(&self, straw: u64, qp_id: u64) -> bool {
        let Some(s) = self.straw(straw) else {
            return false;
        };
        let Some(q) = s.find(qp_id) else {
            return false;
        };
        q.retire();
        q.drain(Duration::from_secs(1));
        s.qps
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|x| x.id() != qp_id);
        // The requester released its last QP here (its threads closed their Rockets
        // first): forget its straw; a later QP of the same pool starts a new one. Under the
        // map's lock, which `add_qp` holds while adding a QP.
        if let Ok(mut m) = self.straws.lock() {
            let empty = s.qps.read().unwrap_or_else(|p| p.into_inner()).is_empty();
            if empty && m.get(&straw).is_some_and(|x| Arc::ptr_eq(x, &s)) {
                m.remove(&straw);
            }
        }
        true
    }

    /// Accept a Rocket pair from a requester thread whose straw has at least one RPC QP
    /// here (called by the control plane). Errors: no RPC QP of that straw yet, a bad
    /// geometry, a response ring smaller than the geometry, memory exhausted.
    pub fn accept(&self, offer: RocketOffer) -> Result<RpcAccept, FabricError> {
        let RocketOffer {
            node: peer,
            straw,
            geometry: cfg,
            batching,
            mode_threshold,
            resp_ring,
            req_credit,
        } = offer;
        let bad = |what: String| FabricError::InvalidArgument {
            op: "accept Rocket",
            what,
        };
        let s = self
            .straw(straw)
            .ok_or_else(|| bad(format!("straw {straw:#x} has no RPC QP here yet")))?;
        let req_rx = RocketReceiver::new(cfg).map_err(|e| bad(e.to_string()))?;
        let resp_tx = RocketSender::new(cfg).map_err(|e| bad(e.to_string()))?;
        if (resp_ring.len as usize) < cfg.ring_bytes() {
            return Err(bad(format!(
                "response ring of {} bytes is smaller than {} buckets x {} bytes",
                resp_ring.len, cfg.buckets, cfg.bucket_size
            )));
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let tx = &self.workers[id % self.workers.len()];
        let req_ring = self.fabric.alloc_mr(cfg.ring_bytes())?;
        let resp_staging = self.fabric.alloc_mr(cfg.ring_bytes())?;
        let words = self.fabric.alloc_mr(16)?;
        let accept = RpcAccept {
            req_ring: req_ring.desc(),
            resp_credit: words.desc().at(0),
            rocket: id as u64,
        };
        let conn = ServerConn {
            id: id as u64,
            straw: s,
            peer,
            req_ring,
            req_rx,
            req_credit,
            resp_staging,
            resp_tx,
            resp_ring,
            words,
            cfg,
            batching,
            mode_threshold,
            backlog: VecDeque::new(),
            spans: VecDeque::new(),
            data: VecDeque::new(),
            force_credit: false,
            qp: None,
            lists: 0,
            stuck_since: None,
            dead: false,
        };
        tx.send(Cmd::Add(Box::new(conn)))
            .map_err(|_| bad("server is stopping".into()))?;
        Ok(accept)
    }

    /// Close Rocket pair `rocket` (its requester thread is leaving); its server thread
    /// drops it at its next look at the command channel. Returns whether such a Rocket
    /// could exist.
    pub fn close(&self, rocket: u64) -> bool {
        let tx = &self.workers[rocket as usize % self.workers.len()];
        tx.send(Cmd::Close(rocket)).is_ok()
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

/// Pin the calling thread to `core` (best effort: a core that does not exist is logged).
fn pin_to(core: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside it for any
    // core below CPU_SETSIZE, checked first.
    let r = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if core >= libc::CPU_SETSIZE as usize {
            -1
        } else {
            libc::CPU_SET(core, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
        }
    };
    if r != 0 {
        tracing::warn!(core, "could not pin RPC server thread");
    }
}

fn poisoned() -> FabricError {
    FabricError::InvalidArgument {
        op: "RPC server",
        what: "lock poisoned".into(),
    }
}

/// What one posted list carried, to finish or replay it when its completion arrives.
struct Rec {
    conn: u64,
    spans: Vec<BucketSpan>,
    credit: bool,
    data: Vec<DataWr>,
}

struct Worker {
    handlers: Handlers,
    arena: Arena,
    read_hold: Duration,
    /// RPC+READ reply buffers by handle, with their expiry.
    holds: HashMap<u64, (Chunk, Instant), IdHash>,
    next_handle: u64,
    mailbox: Arc<Mailbox>,
    recs: Vec<Option<Rec>>,
    free_recs: Vec<usize>,
    /// Emptied span lists of finished records, reused (no allocation per posted list).
    span_pool: Vec<Vec<BucketSpan>>,
    straws: Arc<Mutex<HashMap<u64, Arc<ServerStraw>>>>,
}

/// A request of a sorted-batch handler, held until the round's batch runs.
struct Deferred {
    conn: usize,
    hdr: MsgHeader,
    mode: ReplyMode,
    prefix: Vec<u8>,
    payload: Vec<u8>,
}

enum Item {
    Data(DataWr),
    Span(BucketSpan),
    Credit,
}

/// Commands from the control plane to a server thread.
enum Cmd {
    Add(Box<ServerConn>),
    Close(u64),
}

fn serve(rx: Receiver<Cmd>, mut w: Worker, stop: Arc<AtomicBool>) {
    let mut conns: Vec<ServerConn> = Vec::new();
    let mut batch = Vec::with_capacity(4096);
    let mut out = Vec::with_capacity(4096);
    let mut deferred: Vec<Deferred> = Vec::new();
    let mut done: Vec<(u64, WcStatus)> = Vec::new();
    let mut wrs: Vec<SendWr> = Vec::new();
    let mut items: Vec<Item> = Vec::new();
    let mut idle = 0u32;
    let mut rounds = 0u64;
    while !stop.load(Ordering::Relaxed) {
        rounds = rounds.wrapping_add(1);
        // Commands (new or closed Rockets) are rare: look every 64 rounds.
        if rounds.is_multiple_of(64) {
            while let Ok(cmd) = rx.try_recv() {
                match cmd {
                    Cmd::Add(c) => {
                        tracing::debug!(peer = c.peer, "Rocket accepted");
                        conns.push(*c);
                    }
                    Cmd::Close(id) => {
                        if let Some(c) = conns.iter_mut().find(|c| c.id == id) {
                            tracing::debug!(peer = c.peer, "Rocket closed by its requester");
                            c.dead = true;
                        }
                    }
                }
            }
            // Requesters that vanished without closing are noticed here too.
            if rounds.is_multiple_of(1 << 16) {
                check_requesters(&mut conns);
            }
        }
        let mut work = false;
        // Phase 1: requests.
        for (ci, c) in conns.iter_mut().enumerate() {
            if c.dead {
                continue;
            }
            let _ = c
                .resp_tx
                .on_credit(crate::runtime::stable_word(&c.words, 0));
            while let Some((h, p)) = c.backlog.front() {
                if c.resp_tx.push(&c.resp_staging, *h, p).is_err() {
                    break;
                }
                if !c.batching.msg() {
                    c.resp_tx.seal(&c.resp_staging);
                }
                c.backlog.pop_front();
            }
            // At most one ring's worth per round, so one client cannot starve others.
            for _ in 0..c.cfg.buckets {
                if !c.backlog.is_empty() {
                    break; // back-pressure: stop consuming until responses fit
                }
                batch.clear();
                match c.req_rx.poll(&c.req_ring, &mut batch) {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => {
                        tracing::warn!(peer = c.peer, error = %e, "corrupt request ring; dropping Rocket");
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
                    match MsgKind::from_u8(hdr.kind) {
                        Some(MsgKind::Release) => {
                            if let Some(h) = payload.get(..8) {
                                let h = u64::from_le_bytes(h.try_into().expect("8 bytes"));
                                if let Some((chunk, _)) = w.holds.remove(&h) {
                                    w.arena.free(chunk);
                                }
                            }
                        }
                        Some(MsgKind::Request) => {
                            let Some(mode) = ReplyMode::from_u8(hdr.flags) else {
                                let msg = format!("unknown reply mode {}", hdr.flags);
                                push_msg(c, reply_hdr(&hdr, MsgKind::Error), msg.as_bytes());
                                continue;
                            };
                            let pre = mode.prefix_bytes();
                            if payload.len() < pre {
                                let msg = format!("request shorter than its {pre}-byte prefix");
                                push_msg(c, reply_hdr(&hdr, MsgKind::Error), msg.as_bytes());
                                continue;
                            }
                            let (prefix, body) = payload.split_at(pre);
                            if w.handlers.sorted.contains_key(&hdr.handler) {
                                deferred.push(Deferred {
                                    conn: ci,
                                    hdr,
                                    mode,
                                    prefix: prefix.to_vec(),
                                    payload: body.to_vec(),
                                });
                                continue;
                            }
                            let kind = w.handlers.call(hdr.handler, body, &mut out);
                            respond(&mut w, c, &hdr, mode, prefix, kind, &out);
                        }
                        _ => tracing::debug!(peer = c.peer, kind = hdr.kind, "unexpected message"),
                    }
                }
            }
        }
        // Phase 2: sorted batches (Scythe 4.4, Fig. 16).
        if !deferred.is_empty() {
            run_sorted(&mut w, &mut conns, &mut deferred);
        }
        if rounds.is_multiple_of(4096) && !w.holds.is_empty() {
            let now = Instant::now();
            let arena = &mut w.arena;
            w.holds.retain(|_, (chunk, until)| {
                if *until <= now {
                    arena.free(*chunk);
                    false
                } else {
                    true
                }
            });
        }
        // Phase 3: flush.
        for c in conns.iter_mut() {
            if c.dead {
                continue;
            }
            if c.batching.msg() {
                c.resp_tx.seal(&c.resp_staging);
            }
            c.resp_tx.take_ready_deque(&mut c.spans);
            if c.req_rx.credit_due(credit_every(&c.cfg)).is_some() {
                c.force_credit = true;
            }
            if c.data.is_empty() && c.spans.is_empty() && !c.force_credit {
                continue;
            }
            work = true;
            flush(&mut w, c, &mut wrs, &mut items);
        }
        // Completions.
        for c in conns.iter() {
            if let Some(q) = &c.qp {
                if c.lists > 0 {
                    q.poll();
                }
            }
        }
        done.clear();
        w.mailbox.drain(&mut done);
        for &(token, status) in &done {
            work = true;
            let Some(rec) = w.recs[token as usize].take() else {
                continue;
            };
            w.free_recs.push(token as usize);
            let Some(c) = conns.iter_mut().find(|c| c.id == rec.conn) else {
                for d in rec.data {
                    w.arena.free(d.chunk);
                }
                continue;
            };
            c.lists -= 1;
            let mut spans = rec.spans;
            if status == WcStatus::Success {
                for d in rec.data {
                    w.arena.free(d.chunk);
                    push_msg(c, d.resp, &(d.len as u64).to_le_bytes());
                }
            } else {
                // Replay, oldest first, ahead of anything newer.
                for d in rec.data.into_iter().rev() {
                    c.data.push_front(d);
                }
                for s in spans.drain(..).rev() {
                    c.spans.push_front(s);
                }
                c.force_credit |= rec.credit;
            }
            spans.clear();
            w.span_pool.push(spans);
        }
        // Drop Rockets whose requester is gone: no QP of its straw usable for a while.
        for c in conns.iter_mut() {
            if c.dead || c.stuck_since.is_none_or(|t| t.elapsed() < STUCK_LIMIT) {
                continue;
            }
            tracing::debug!(
                peer = c.peer,
                "no usable QP to the requester; dropping Rocket"
            );
            c.dead = true;
        }
        if conns.iter().any(|c| c.dead) {
            for c in conns.iter_mut().filter(|c| c.dead) {
                for d in c.data.drain(..) {
                    w.arena.free(d.chunk);
                }
                if c.lists == 0 {
                    if let Some(q) = c.qp.take() {
                        crate::straw::unbind(&q);
                    }
                }
            }
            let gone: Vec<u64> = conns
                .iter()
                .filter(|c| c.dead)
                .map(|c| c.straw.id)
                .collect();
            // A dead Rocket's rings stay registered until its lists on the shared QP have
            // completed (or failed): a NIC may still be reading them.
            conns.retain(|c| {
                !c.dead || (c.lists > 0 && c.qp.as_ref().is_some_and(|q| !q.is_broken()))
            });
            if let Ok(mut m) = w.straws.lock() {
                for s in gone {
                    let dead = m.get(&s).is_some_and(|st| {
                        st.qps
                            .read()
                            .unwrap_or_else(|p| p.into_inner())
                            .iter()
                            .all(|q| q.is_broken())
                    });
                    if dead && !conns.iter().any(|c| c.straw.id == s) {
                        m.remove(&s);
                    }
                }
            }
        }
        if work {
            idle = 0;
        } else {
            idle += 1;
            if idle > IDLE_SPINS {
                // Idle: look at the QPs in use now and then, so a requester that died
                // is noticed (the QP's state probe) and its Rockets dropped.
                if idle.is_multiple_of(1024) {
                    check_requesters(&mut conns);
                }
                std::thread::yield_now();
            }
        }
    }
    for c in conns {
        for d in c.data {
            w.arena.free(d.chunk);
        }
    }
}

/// Look at the QPs of the requesters' straws (their state probe notices a requester that
/// died) and start the clock on Rockets left with no usable QP.
fn check_requesters(conns: &mut [ServerConn]) {
    for c in conns.iter_mut() {
        let qps = c
            .straw
            .qps
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for q in &qps {
            q.poll();
        }
        if qps.iter().any(|q| q.usable()) {
            c.stuck_since = None;
        } else {
            c.stuck_since.get_or_insert_with(Instant::now);
        }
    }
}

/// Post a Rocket's pending zero-copy WRITEs, response buckets and credit on its QP.
fn flush(w: &mut Worker, c: &mut ServerConn, wrs: &mut Vec<SendWr>, items: &mut Vec<Item>) {
    let qp = if c.lists > 0 {
        c.qp.clone().filter(|q| !q.is_broken())
    } else {
        c.straw.pick(c.qp.as_ref())
    };
    let Some(qp) = qp else {
        if c.lists == 0 {
            c.stuck_since.get_or_insert_with(Instant::now);
        }
        return;
    };
    c.stuck_since = None;
    c.qp = Some(qp.clone());
    wrs.clear();
    items.clear();
    let consumed = c.resp_tx.consumed();
    for d in c.data.drain(..) {
        wrs.push(SendWr {
            wr_id: 0,
            opcode: WrOpcode::Write,
            sge: w.arena.mr().sge(d.chunk.off, d.len),
            remote: d.remote,
            signaled: false,
            inline: false,
        });
        items.push(Item::Data(d));
    }
    let credit = c.force_credit.then(|| c.req_rx.consumed());
    c.force_credit = false;
    crate::runtime::rocket_wrs(
        crate::runtime::RocketOut {
            spans: &mut c.spans,
            consumed,
            staging: &c.resp_staging,
            ring: &c.resp_ring,
            credit,
            words: &c.words,
            credit_to: c.req_credit,
        },
        wrs,
        |s| items.push(s.map_or(Item::Credit, Item::Span)),
    );
    let per_list = if c.batching.doorbell() { wrs.len() } else { 1 };
    let mut at = 0;
    while at < wrs.len() {
        let end = (at + per_list).min(wrs.len());
        let token = match w.free_recs.pop() {
            Some(t) => t,
            None => {
                w.recs.push(None);
                w.recs.len() - 1
            }
        };
        let n = match qp.post(&mut wrs[at..end], &w.mailbox, token as u64) {
            Ok(n) => n,
            Err(e) => {
                tracing::debug!(peer = c.peer, error = %e, "post failed; will replay");
                0
            }
        };
        if n == 0 {
            w.free_recs.push(token);
            break;
        }
        let mut rec = Rec {
            conn: c.id,
            spans: w.span_pool.pop().unwrap_or_default(),
            credit: false,
            data: Vec::new(),
        };
        for it in items.drain(..n) {
            match it {
                Item::Data(d) => rec.data.push(d),
                Item::Span(s) => rec.spans.push(s),
                Item::Credit => rec.credit = true,
            }
        }
        w.recs[token] = Some(rec);
        c.lists += 1;
        at += n;
    }
    // What did not fit waits for the next round, in order.
    for it in items.drain(..) {
        match it {
            Item::Data(d) => c.data.push_back(d),
            Item::Span(s) => c.spans.push_back(s),
            Item::Credit => c.force_credit = true,
        }
    }
}

fn reply_hdr(req: &MsgHeader, kind: MsgKind) -> MsgHeader {
    MsgHeader {
        len: 0,
        handler: req.handler,
        kind: kind as u8,
        flags: 0,
        call_id: req.call_id,
    }
}

/// Queue a response message; a full ring defers it to the backlog (nothing is lost).
fn push_msg(c: &mut ServerConn, hdr: MsgHeader, payload: &[u8]) {
    if !c.backlog.is_empty() || c.resp_tx.push(&c.resp_staging, hdr, payload).is_err() {
        c.backlog.push_back((hdr, payload.to_vec()));
    } else if !c.batching.msg() {
        c.resp_tx.seal(&c.resp_staging);
    }
}

/// Send the handler's result in the mode the request asked for.
fn respond(
    w: &mut Worker,
    c: &mut ServerConn,
    req: &MsgHeader,
    mode: ReplyMode,
    prefix: &[u8],
    kind: MsgKind,
    out: &[u8],
) {
    let max_inline = c.resp_tx.max_payload();
    let error = |c: &mut ServerConn, msg: String| {
        let mut b = msg.into_bytes();
        b.truncate(max_inline);
        push_msg(c, reply_hdr(req, MsgKind::Error), &b);
    };
    if kind == MsgKind::Error {
        let mut b = out.to_vec();
        b.truncate(max_inline);
        push_msg(c, reply_hdr(req, MsgKind::Error), &b);
        return;
    }
    let read = match mode {
        ReplyMode::Inline => {
            if out.len() > max_inline {
                return error(
                    c,
                    format!(
                        "reply of {} bytes exceeds the {max_inline}-byte limit of pure RPC mode; \
                         call with the Read or ZeroCopy mode",
                        out.len()
                    ),
                );
            }
            false
        }
        ReplyMode::Auto => out.len() > c.mode_threshold.min(max_inline),
        ReplyMode::Read => true,
        ReplyMode::ZeroCopy => {
            let Some(z) = ZeroCopyPrefix::from_bytes(prefix) else {
                return error(c, "malformed zero-copy prefix".into());
            };
            if out.len() > z.capacity as usize {
                return error(
                    c,
                    format!(
                        "reply of {} bytes exceeds the caller's {}-byte zero-copy buffer",
                        out.len(),
                        z.capacity
                    ),
                );
            }
            let Some(chunk) = w.arena.alloc(out.len()) else {
                return error(c, buffer_error(out.len(), &w.arena));
            };
            if !out.is_empty() {
                w.arena.mr().write(chunk.off, out);
            }
            c.data.push_back(DataWr {
                chunk,
                len: out.len(),
                remote: RemoteAddr {
                    addr: z.addr,
                    rkey: z.rkey,
                },
                resp: reply_hdr(req, MsgKind::ZeroCopyDone),
            });
            return;
        }
    };
    if !read {
        push_msg(c, reply_hdr(req, MsgKind::Response), out);
        return;
    }
    let Some(chunk) = w.arena.alloc(out.len()) else {
        return error(c, buffer_error(out.len(), &w.arena));
    };
    if !out.is_empty() {
        w.arena.mr().write(chunk.off, out);
    }
    let handle = w.next_handle;
    w.next_handle += 1;
    w.holds
        .insert(handle, (chunk, Instant::now() + w.read_hold));
    let r = ReadReply {
        addr: w.arena.mr().addr() + chunk.off as u64,
        rkey: w.arena.mr().rkey(),
        len: out.len() as u32,
        handle,
    };
    push_msg(c, reply_hdr(req, MsgKind::ReadReply), &r.to_bytes());
}

fn buffer_error(len: usize, arena: &Arena) -> String {
    if len > arena.max_chunk() {
        format!(
            "reply of {len} bytes exceeds the server's {}-byte limit for READ and zero-copy replies",
            arena.max_chunk()
        )
    } else {
        format!(
            "server reply buffers exhausted ({} held); retry later",
            arena.in_use()
        )
    }
}

/// Phase 2 of a round: each sorted-batch handler over its requests, sorted by
/// (key, timestamp).
fn run_sorted(w: &mut Worker, conns: &mut [ServerConn], deferred: &mut Vec<Deferred>) {
    deferred.sort_by_key(|d| d.hdr.handler);
    let mut results = Vec::new();
    let mut out = Vec::new();
    let mut start = 0;
    while start < deferred.len() {
        let id = deferred[start].hdr.handler;
        let end = start + deferred[start..].partition_point(|d| d.hdr.handler == id);
        let group = &deferred[start..end];
        let (key, f) = w.handlers.sorted.get(&id).cloned().expect("registered");
        let mut keyed: Vec<(u64, u64, usize)> = Vec::with_capacity(group.len());
        for (i, d) in group.iter().enumerate() {
            match key(&d.payload) {
                Some((k, ts)) => keyed.push((k, ts, i)),
                None => {
                    let c = &mut conns[d.conn];
                    let msg = b"malformed request for a sorted-batch handler";
                    push_msg(c, reply_hdr(&d.hdr, MsgKind::Error), msg);
                }
            }
        }
        keyed.sort_by_key(|&(k, ts, _)| (k, ts));
        let reqs: Vec<BatchReq<'_>> = keyed
            .iter()
            .map(|&(key, ts, i)| BatchReq {
                key,
                ts,
                payload: &group[i].payload,
            })
            .collect();
        results.clear();
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&reqs, &mut results)))
            .is_ok();
        drop(reqs);
        for (j, &(_, _, i)) in keyed.iter().enumerate() {
            let d = &group[i];
            let c = &mut conns[d.conn];
            let (kind, body) = match results.get_mut(j) {
                Some(Ok(v)) if ok => (MsgKind::Response, std::mem::take(v)),
                Some(Err(e)) if ok => (MsgKind::Error, std::mem::take(e).into_bytes()),
                _ if !ok => (
                    MsgKind::Error,
                    format!("handler {id} panicked").into_bytes(),
                ),
                _ => (
                    MsgKind::Error,
                    format!("sorted-batch handler {id} returned no result").into_bytes(),
                ),
            };
            out.clear();
            out.extend_from_slice(&body);
            respond(w, c, &d.hdr, d.mode, &d.prefix, kind, &out);
        }
        start = end;
    }
    deferred.clear();
}

/// Return credits after a quarter of the ring has been consumed (and at least every bucket
/// for tiny rings), so the sender rarely stalls and credit WRITEs stay rare.
pub(crate) fn credit_every(cfg: &RocketConfig) -> u64 {
    (cfg.buckets as u64 / 4).max(1)
}
