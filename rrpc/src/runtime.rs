//! The per-thread runtime: an executor running many coroutines (async tasks, one
//! transaction coordinator each) over one [`ThreadCtx`].
//!
//! Coroutines issue one-sided operations ([`ThreadCtx::read`], [`ThreadCtx::write`],
//! [`ThreadCtx::cas`], [`ThreadCtx::faa`]) and RPC calls ([`ThreadCtx::call`]). Nothing is
//! posted when they are issued: at the end of each polling round the executor posts, for
//! each remote node, every WR issued since the last round plus every sealed Rocket bucket
//! and credit return as **one WR list with one doorbell**, only the last WR signaled
//! (selective signaling; an RC QP completes in order, so the last completion covers the
//! list). It then polls the CQ and the response Rockets. This is the coroutine model of
//! FaRM/FORD and Scythe's RRPC (000_f3dba2ed893b246b.txt, 4.4 Fig. 16 and 4.6).
//!
//! Tasks are polled round robin with a no-op waker: every round polls every live task,
//! as a coroutine scheduler yielding on each remote access does. The runtime is
//! single-threaded by construction (`Rc`, `RefCell`): run one per OS thread.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::bootstrap;
use crate::fabric::{
    CompletionQueue, Fabric, FabricError, MemoryRegion, MrDesc, QpState, QueuePair, RemoteAddr,
    SendWr, Wc, WcStatus, WrOpcode,
};
use crate::node::{node_info, CtrlRequest, NodeError, NodeInfo, RpcAccept};
use crate::rocket::{
    decode_batch, BucketSpan, MsgHeader, RingMem, RocketConfig, RocketError, RocketReceiver,
    RocketSender,
};
use crate::server::credit_every;
use crate::wire::{MsgKind, IDLE_SPINS};

/// Runtime settings.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// Geometry of the request and response Rockets of each RPC channel.
    pub rocket: RocketConfig,
    /// Deadline of an RPC call, from issue to response (default 2 s).
    pub call_timeout: Duration,
    /// How long connection setup waits for a node's control plane (default 10 s).
    pub connect_timeout: Duration,
    /// Send-queue depth of each QP, in WRs (default 512). A polling round's WRs beyond
    /// the room left wait for the next round.
    pub sq_depth: usize,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            rocket: RocketConfig::default(),
            call_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(10),
            sq_depth: 512,
        }
    }
}

/// Errors of one-sided operations and RPC calls.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RpcError {
    /// No connection to the node was set up on this thread.
    #[error("node {node} is not connected on this thread")]
    NotConnected {
        /// Node id.
        node: u32,
    },
    /// The WR completed with an error status.
    #[error("work request to node {node} failed: {status:?}")]
    Completion {
        /// Node id.
        node: u32,
        /// Completion status.
        status: WcStatus,
    },
    /// The peer is gone or its QP is in error; pending work to it fails with this.
    #[error("node {node} is unreachable: {why}")]
    PeerGone {
        /// Node id.
        node: u32,
        /// Reason.
        why: String,
    },
    /// The call got no response before its deadline.
    #[error("call to handler {handler} on node {node} timed out after {after:?}")]
    Timeout {
        /// Node id.
        node: u32,
        /// Handler id.
        handler: u16,
        /// The deadline that passed.
        after: Duration,
    },
    /// A request payload larger than one Rocket bucket can carry.
    #[error("payload of {len} bytes exceeds the {max}-byte limit")]
    TooLarge {
        /// Payload bytes.
        len: usize,
        /// Limit in bytes.
        max: usize,
    },
    /// The handler answered with an error.
    #[error("node {node} handler {handler}: {msg}")]
    Remote {
        /// Node id.
        node: u32,
        /// Handler id.
        handler: u16,
        /// The handler's message.
        msg: String,
    },
    /// Setting up a connection failed.
    #[error("connecting: {0}")]
    Connect(String),
}

impl From<NodeError> for RpcError {
    fn from(e: NodeError) -> Self {
        Self::Connect(e.to_string())
    }
}
impl From<FabricError> for RpcError {
    fn from(e: FabricError) -> Self {
        Self::Connect(e.to_string())
    }
}

/// Per-thread counters, readable by benchmarks.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    /// `post_send` calls (doorbells rung).
    pub doorbells: u64,
    /// WRs posted.
    pub wrs: u64,
    /// Rocket buckets written (one WRITE each).
    pub buckets: u64,
    /// RPC requests sent.
    pub messages: u64,
    /// Times a call waited because its Rocket had no free bucket (credit stall).
    pub credit_stalls: u64,
    /// Payload bytes moved by one-sided ops and RPC requests.
    pub bytes: u64,
    /// Rounds in which some WRs waited for send-queue room (posted the next round).
    pub sq_full: u64,
}

const SMALL_CHUNK: usize = 256;
const SMALL_CHUNKS: usize = 4096;
const BIG_CHUNK: usize = 64 << 10;
const BIG_CHUNKS: usize = 32;
/// Largest one-sided READ/WRITE a single op may move, in bytes.
pub const MAX_ONE_SIDED_BYTES: usize = BIG_CHUNK;

/// Local registered buffers for one-sided ops: fixed chunks in two size classes.
struct Scratch {
    mr: MemoryRegion,
    small: Vec<usize>,
    big: Vec<usize>,
}

impl Scratch {
    fn new(fabric: &Fabric) -> Result<Self, FabricError> {
        let mr = fabric.alloc_mr(SMALL_CHUNK * SMALL_CHUNKS + BIG_CHUNK * BIG_CHUNKS)?;
        let small = (0..SMALL_CHUNKS).rev().map(|i| i * SMALL_CHUNK).collect();
        let base = SMALL_CHUNK * SMALL_CHUNKS;
        let big = (0..BIG_CHUNKS)
            .rev()
            .map(|i| base + i * BIG_CHUNK)
            .collect();
        Ok(Self { mr, small, big })
    }
    fn alloc(&mut self, len: usize) -> Option<usize> {
        if len <= SMALL_CHUNK {
            self.small.pop()
        } else if len <= BIG_CHUNK {
            self.big.pop()
        } else {
            None
        }
    }
    fn free(&mut self, off: usize) {
        if off < SMALL_CHUNK * SMALL_CHUNKS {
            self.small.push(off)
        } else {
            self.big.push(off)
        }
    }
}

enum OpState {
    Free,
    /// Posted or queued; no completion yet.
    Waiting,
    /// Completed; the waiting future has not looked yet.
    Done(Result<(), RpcError>),
    /// The future took the result; `take_buf` frees the slot.
    Taken,
}

struct OpSlot {
    state: OpState,
    buf: usize,
    len: usize,
    abandoned: bool,
}

struct RpcChan {
    cfg: RocketConfig,
    tx: RocketSender,
    staging: MemoryRegion,
    req_ring: MrDesc,
    rx: RocketReceiver,
    resp_ring: MemoryRegion,
    /// Word 0: request credits written by the server. Word 1: source of credit WRITEs.
    words: MemoryRegion,
    resp_credit: RemoteAddr,
}

struct Conn {
    node: u32,
    qp: QueuePair,
    /// WRs not yet posted, and the op each belongs to (Rocket buckets and credits: none).
    pending: Vec<SendWr>,
    pending_ops: Vec<Option<usize>>,
    /// Posted lists: (sequence, ops, WRs). A list's send-queue slots free up when its
    /// signaled last WR completes.
    inflight: VecDeque<(u64, Vec<usize>, usize)>,
    /// WRs posted and not yet completed: never more than the QP's send queue holds, so a
    /// post never fails for lack of room (a failed post may have posted part of a list).
    outstanding: usize,
    next_seq: u64,
    rpc: Option<RpcChan>,
    broken: Option<String>,
}

struct CallSlot {
    node: u32,
    result: Option<Result<Vec<u8>, RpcError>>,
}

struct Inner {
    conns: Vec<Conn>,
    by_node: HashMap<u32, usize>,
    ops: Vec<OpSlot>,
    free_ops: Vec<usize>,
    scratch: Scratch,
    calls: HashMap<u64, CallSlot>,
    next_call: u64,
    stats: Stats,
    wrs: Vec<SendWr>,
    wr_ops: Vec<Option<usize>>,
    spans: Vec<BucketSpan>,
    batch: Vec<u8>,
    wcs: Vec<Wc>,
}

/// One thread's connections, buffers and in-flight work. Shared by the thread's
/// coroutines through `Rc`.
pub struct ThreadCtx {
    fabric: Fabric,
    cfg: RuntimeConfig,
    cq: CompletionQueue,
    inner: RefCell<Inner>,
}

const SEQ_BITS: u32 = 40;
/// Posted lists (one signaled completion each) in flight per QP at most: bounds what the
/// shared CQ (4096 entries) must hold to 64 connections' worth.
const MAX_LISTS_IN_FLIGHT: usize = 64;

impl ThreadCtx {
    /// A context on `fabric` with no connections yet.
    pub fn new(fabric: Fabric, cfg: RuntimeConfig) -> Result<Rc<Self>, RpcError> {
        cfg.rocket
            .validate()
            .map_err(|e| RpcError::Connect(e.to_string()))?;
        if cfg.sq_depth == 0 {
            return Err(RpcError::Connect("sq_depth must be at least 1".into()));
        }
        let cq = fabric.create_cq(4096)?;
        let scratch = Scratch::new(&fabric)?;
        Ok(Rc::new(Self {
            fabric,
            cfg,
            cq,
            inner: RefCell::new(Inner {
                conns: Vec::new(),
                by_node: HashMap::new(),
                ops: Vec::new(),
                free_ops: Vec::new(),
                scratch,
                calls: HashMap::new(),
                next_call: 1,
                stats: Stats::default(),
                wrs: Vec::new(),
                wr_ops: Vec::new(),
                spans: Vec::new(),
                batch: Vec::new(),
                wcs: Vec::new(),
            }),
        }))
    }

    /// The fabric this context runs on.
    pub fn fabric(&self) -> &Fabric {
        &self.fabric
    }

    /// Counters so far.
    pub fn stats(&self) -> Stats {
        self.inner.borrow().stats
    }

    /// Connect a QP for one-sided operations to the node whose control plane is at `addr`.
    /// Returns the node's [`NodeInfo`]. Blocking; call before running coroutines.
    pub fn connect(&self, addr: SocketAddr) -> Result<NodeInfo, RpcError> {
        let info = node_info(addr, self.cfg.connect_timeout)?;
        if self.inner.borrow().by_node.contains_key(&info.node) {
            return Ok(info);
        }
        let mut qp = self.fabric.create_qp(&self.cq, self.cfg.sq_depth)?;
        let (ep, ctrl): (crate::fabric::QpEndpoint, _) = self.ctrl_call(
            addr,
            &CtrlRequest::ConnectQp {
                endpoint: qp.endpoint(),
            },
        )?;
        qp.connect(&ep)?;
        qp.watch_peer(ctrl)?;
        self.add_conn(info.node, qp, None);
        Ok(info)
    }

    /// Connect a QP plus an RPC channel (request and response Rockets) to the node at `addr`.
    /// One-sided operations to that node use the same QP.
    pub fn connect_rpc(&self, addr: SocketAddr) -> Result<NodeInfo, RpcError> {
        let info = node_info(addr, self.cfg.connect_timeout)?;
        if let Some(&i) = self.inner.borrow().by_node.get(&info.node) {
            if self.inner.borrow().conns[i].rpc.is_some() {
                return Ok(info);
            }
            return Err(RpcError::Connect(format!(
                "node {} already connected without RPC on this thread",
                info.node
            )));
        }
        let cfg = self.cfg.rocket;
        let mut qp = self.fabric.create_qp(&self.cq, self.cfg.sq_depth)?;
        let staging = self.fabric.alloc_mr(cfg.ring_bytes())?;
        let resp_ring = self.fabric.alloc_mr(cfg.ring_bytes())?;
        let words = self.fabric.alloc_mr(16)?;
        let (accept, ctrl): (RpcAccept, _) = self.ctrl_call(
            addr,
            &CtrlRequest::ConnectRpc {
                endpoint: qp.endpoint(),
                geometry: cfg.into(),
                resp_ring: resp_ring.desc(),
                req_credit: words.desc().at(0),
            },
        )?;
        qp.connect(&accept.endpoint)?;
        qp.watch_peer(ctrl)?;
        let chan = RpcChan {
            cfg,
            tx: RocketSender::new(cfg).map_err(|e| RpcError::Connect(e.to_string()))?,
            staging,
            req_ring: accept.req_ring,
            rx: RocketReceiver::new(cfg).map_err(|e| RpcError::Connect(e.to_string()))?,
            resp_ring,
            words,
            resp_credit: accept.resp_credit,
        };
        self.add_conn(info.node, qp, Some(chan));
        Ok(info)
    }

    /// One control-plane request on a new connection, which is returned to serve as the
    /// QP's liveness channel ([`QueuePair::watch_peer`]).
    fn ctrl_call<R: serde::de::DeserializeOwned>(
        &self,
        addr: SocketAddr,
        req: &CtrlRequest,
    ) -> Result<(R, std::net::TcpStream), RpcError> {
        let connect = |e: bootstrap::BootstrapError| RpcError::Connect(format!("{addr}: {e}"));
        let mut c =
            bootstrap::BootstrapClient::connect(addr, self.cfg.connect_timeout).map_err(connect)?;
        let r = c.call_typed(req).map_err(connect)?;
        Ok((r, c.into_stream()))
    }

    fn add_conn(&self, node: u32, qp: QueuePair, rpc: Option<RpcChan>) {
        let mut inner = self.inner.borrow_mut();
        let idx = inner.conns.len();
        inner.conns.push(Conn {
            node,
            qp,
            pending: Vec::new(),
            pending_ops: Vec::new(),
            inflight: VecDeque::new(),
            outstanding: 0,
            next_seq: 0,
            rpc,
            broken: None,
        });
        inner.by_node.insert(node, idx);
    }

    /// RDMA READ of `len` bytes at `remote` on `node`. Errors: [`RpcError::TooLarge`] past
    /// [`MAX_ONE_SIDED_BYTES`], [`RpcError::Completion`], [`RpcError::PeerGone`].
    pub async fn read(
        &self,
        node: u32,
        remote: RemoteAddr,
        len: usize,
    ) -> Result<Vec<u8>, RpcError> {
        let id = self.submit(node, WrOpcode::Read, remote, len, None).await?;
        self.wait_op(id).await?;
        Ok(self.take_buf(id))
    }

    /// RDMA WRITE of `data` to `remote` on `node`. Completes when the data is written.
    pub async fn write(&self, node: u32, remote: RemoteAddr, data: &[u8]) -> Result<(), RpcError> {
        let id = self
            .submit(node, WrOpcode::Write, remote, data.len(), Some(data))
            .await?;
        self.wait_op(id).await?;
        self.take_buf(id);
        Ok(())
    }

    /// 8-byte RDMA compare-and-swap at `remote` (8-byte aligned); returns the old value.
    pub async fn cas(
        &self,
        node: u32,
        remote: RemoteAddr,
        compare: u64,
        swap: u64,
    ) -> Result<u64, RpcError> {
        let op = WrOpcode::CmpSwap { compare, swap };
        self.atomic(node, op, remote).await
    }

    /// 8-byte RDMA fetch-and-add at `remote` (8-byte aligned); returns the old value.
    pub async fn faa(&self, node: u32, remote: RemoteAddr, add: u64) -> Result<u64, RpcError> {
        self.atomic(node, WrOpcode::FetchAdd { add }, remote).await
    }

    async fn atomic(&self, node: u32, op: WrOpcode, remote: RemoteAddr) -> Result<u64, RpcError> {
        let id = self.submit(node, op, remote, 8, None).await?;
        self.wait_op(id).await?;
        let b = self.take_buf(id);
        Ok(u64::from_le_bytes(b[..8].try_into().expect("8 bytes")))
    }

    /// Call handler `handler` on `node` with `req`; resolves to the response payload.
    /// Errors: [`RpcError::TooLarge`], [`RpcError::Timeout`] after the configured deadline,
    /// [`RpcError::PeerGone`], [`RpcError::Remote`] when the handler failed.
    pub async fn call(&self, node: u32, handler: u16, req: &[u8]) -> Result<Vec<u8>, RpcError> {
        let deadline = Instant::now() + self.cfg.call_timeout;
        let mut stalled = false;
        let id = std::future::poll_fn(|_| {
            let mut inner = self.inner.borrow_mut();
            let inner = &mut *inner;
            let Some(&ci) = inner.by_node.get(&node) else {
                return Poll::Ready(Err(RpcError::NotConnected { node }));
            };
            let conn = &mut inner.conns[ci];
            if let Some(why) = &conn.broken {
                return Poll::Ready(Err(RpcError::PeerGone {
                    node,
                    why: why.clone(),
                }));
            }
            let Some(chan) = conn.rpc.as_mut() else {
                return Poll::Ready(Err(RpcError::NotConnected { node }));
            };
            let call_id = inner.next_call;
            let hdr = MsgHeader {
                len: req.len() as u32,
                handler,
                kind: MsgKind::Request as u8,
                flags: 0,
                call_id,
            };
            match chan.tx.push(&chan.staging, hdr, req) {
                Ok(()) => {
                    inner.next_call += 1;
                    inner.stats.messages += 1;
                    inner.stats.bytes += req.len() as u64;
                    inner.calls.insert(call_id, CallSlot { node, result: None });
                    Poll::Ready(Ok(call_id))
                }
                Err(RocketError::TooLarge { len, max }) => {
                    Poll::Ready(Err(RpcError::TooLarge { len, max }))
                }
                Err(RocketError::RingFull) if Instant::now() < deadline => {
                    if !stalled {
                        stalled = true;
                        inner.stats.credit_stalls += 1;
                    }
                    Poll::Pending
                }
                Err(RocketError::RingFull) => Poll::Ready(Err(RpcError::Timeout {
                    node,
                    handler,
                    after: self.cfg.call_timeout,
                })),
                Err(e) => Poll::Ready(Err(RpcError::Connect(e.to_string()))),
            }
        })
        .await?;
        CallWait {
            ctx: self,
            id,
            node,
            handler,
            deadline,
        }
        .await
    }

    /// A future that is ready once `d` has passed (polled by the executor; no timer thread).
    pub fn sleep(&self, d: Duration) -> impl Future<Output = ()> {
        let until = Instant::now() + d;
        std::future::poll_fn(move |_| {
            if Instant::now() >= until {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
    }

    /// Give other coroutines of this thread one turn.
    pub fn yield_now(&self) -> impl Future<Output = ()> {
        let mut yielded = false;
        std::future::poll_fn(move |_| {
            if yielded {
                Poll::Ready(())
            } else {
                yielded = true;
                Poll::Pending
            }
        })
    }

    fn submit<'a>(
        &'a self,
        node: u32,
        opcode: WrOpcode,
        remote: RemoteAddr,
        len: usize,
        data: Option<&'a [u8]>,
    ) -> impl Future<Output = Result<usize, RpcError>> + 'a {
        std::future::poll_fn(move |_| {
            let mut inner = self.inner.borrow_mut();
            let inner = &mut *inner;
            if len > MAX_ONE_SIDED_BYTES {
                return Poll::Ready(Err(RpcError::TooLarge {
                    len,
                    max: MAX_ONE_SIDED_BYTES,
                }));
            }
            let Some(&ci) = inner.by_node.get(&node) else {
                return Poll::Ready(Err(RpcError::NotConnected { node }));
            };
            if let Some(why) = &inner.conns[ci].broken {
                return Poll::Ready(Err(RpcError::PeerGone {
                    node,
                    why: why.clone(),
                }));
            }
            // No local buffer free: wait for in-flight ops to complete.
            let Some(buf) = inner.scratch.alloc(len) else {
                return Poll::Pending;
            };
            if let Some(d) = data {
                inner.scratch.mr.write(buf, d);
            }
            let id = match inner.free_ops.pop() {
                Some(id) => id,
                None => {
                    inner.ops.push(OpSlot {
                        state: OpState::Free,
                        buf: 0,
                        len: 0,
                        abandoned: false,
                    });
                    inner.ops.len() - 1
                }
            };
            inner.ops[id] = OpSlot {
                state: OpState::Waiting,
                buf,
                len,
                abandoned: false,
            };
            let wr = SendWr {
                wr_id: 0,
                opcode,
                sge: inner.scratch.mr.sge(buf, len),
                remote,
                signaled: false,
                inline: false,
            };
            inner.stats.bytes += len as u64;
            let conn = &mut inner.conns[ci];
            conn.pending.push(wr);
            conn.pending_ops.push(Some(id));
            Poll::Ready(Ok(id))
        })
    }

    /// Wait for op `id`; on error its slot and buffer are freed here.
    async fn wait_op(&self, id: usize) -> Result<(), RpcError> {
        let r = OpWait { ctx: self, id }.await;
        if r.is_err() {
            self.take_buf(id);
        }
        r
    }

    fn take_buf(&self, id: usize) -> Vec<u8> {
        let mut inner = self.inner.borrow_mut();
        let (buf, len) = (inner.ops[id].buf, inner.ops[id].len);
        let mut out = vec![0u8; len];
        inner.scratch.mr.read(buf, &mut out);
        inner.scratch.free(buf);
        inner.ops[id].state = OpState::Free;
        inner.free_ops.push(id);
        out
    }

    /// One polling round's I/O: post every connection's WRs (one doorbell each), poll the
    /// CQ, receive responses, notice dead peers. Returns whether anything happened.
    pub fn progress(&self) -> bool {
        let mut inner = self.inner.borrow_mut();
        let inner = &mut *inner;
        let mut work = false;
        for ci in 0..inner.conns.len() {
            let conn = &mut inner.conns[ci];
            if conn.broken.is_some() {
                continue;
            }
            inner.wrs.clear();
            inner.wr_ops.clear();
            // WRs left over last round (no room in the send queue) and one-sided ops
            // issued since, then this round's Rocket buckets and credit return.
            inner.wrs.append(&mut conn.pending);
            inner.wr_ops.append(&mut conn.pending_ops);
            if let Some(chan) = conn.rpc.as_mut() {
                let _ = chan.tx.on_credit(stable_word(&chan.words, 0));
                chan.tx.seal(&chan.staging);
                inner.spans.clear();
                chan.tx.take_ready(&mut inner.spans);
                inner.stats.buckets += inner.spans.len() as u64;
                for s in &inner.spans {
                    inner.wrs.push(SendWr {
                        wr_id: 0,
                        opcode: WrOpcode::Write,
                        sge: chan.staging.sge(s.offset, s.len),
                        remote: chan.req_ring.at(s.offset as u64),
                        signaled: false,
                        inline: false,
                    });
                    inner.wr_ops.push(None);
                }
                // Responses.
                loop {
                    inner.batch.clear();
                    match chan.rx.poll(&chan.resp_ring, &mut inner.batch) {
                        Ok(true) => {}
                        Ok(false) => break,
                        Err(e) => {
                            conn.broken = Some(format!("corrupt response ring: {e}"));
                            break;
                        }
                    }
                    work = true;
                    for m in decode_batch(&inner.batch) {
                        let Ok((h, payload)) = m else {
                            conn.broken = Some("corrupt response batch".into());
                            break;
                        };
                        // A response to a call that timed out is dropped here.
                        if let Some(slot) = inner.calls.get_mut(&h.call_id) {
                            slot.result = Some(if h.kind == MsgKind::Error as u8 {
                                Err(RpcError::Remote {
                                    node: conn.node,
                                    handler: h.handler,
                                    msg: String::from_utf8_lossy(payload).into_owned(),
                                })
                            } else {
                                Ok(payload.to_vec())
                            });
                        }
                    }
                }
                if let Some(c) = chan.rx.credit_due(credit_every(&chan.cfg)) {
                    chan.words.store_u64(8, c);
                    inner.wrs.push(SendWr {
                        wr_id: 0,
                        opcode: WrOpcode::Write,
                        sge: chan.words.sge(8, 8),
                        remote: chan.resp_credit,
                        signaled: false,
                        inline: true,
                    });
                    inner.wr_ops.push(None);
                }
            }
            // Post what fits in the send queue; keep the rest for the next round.
            let room = if conn.inflight.len() >= MAX_LISTS_IN_FLIGHT {
                0
            } else {
                self.cfg.sq_depth.saturating_sub(conn.outstanding)
            };
            if inner.wrs.len() > room {
                inner.stats.sq_full += 1;
                conn.pending = inner.wrs.split_off(room);
                conn.pending_ops = inner.wr_ops.split_off(room);
            }
            if !inner.wrs.is_empty() {
                work = true;
                let seq = conn.next_seq;
                conn.next_seq += 1;
                let tag = ((ci as u64) << SEQ_BITS) | (seq & ((1 << SEQ_BITS) - 1));
                for w in inner.wrs.iter_mut() {
                    w.wr_id = tag;
                    w.signaled = false;
                }
                inner.wrs.last_mut().expect("non-empty").signaled = true;
                inner.stats.doorbells += 1;
                inner.stats.wrs += inner.wrs.len() as u64;
                let ops: Vec<usize> = inner.wr_ops.drain(..).flatten().collect();
                let n = inner.wrs.len();
                if let Err(e) = conn.qp.post_send(&inner.wrs) {
                    tracing::warn!(node = conn.node, error = %e, "post failed; connection broken");
                    conn.broken = Some(e.to_string());
                }
                conn.outstanding += n;
                conn.inflight.push_back((seq, ops, n));
            }
            if conn.broken.is_none() && conn.qp.state() == QpState::Error {
                conn.broken = Some("queue pair in error (peer gone)".into());
            }
        }
        // Completions.
        inner.wcs.clear();
        self.cq.poll(&mut inner.wcs, 1024);
        for i in 0..inner.wcs.len() {
            work = true;
            let wc = inner.wcs[i];
            let ci = (wc.wr_id >> SEQ_BITS) as usize;
            let seq = wc.wr_id & ((1 << SEQ_BITS) - 1);
            let node = inner.conns[ci].node;
            let result = if wc.status == WcStatus::Success {
                Ok(())
            } else {
                inner.conns[ci]
                    .broken
                    .get_or_insert_with(|| format!("work request failed: {:?}", wc.status));
                Err(RpcError::Completion {
                    node,
                    status: wc.status,
                })
            };
            while let Some((s, _, _)) = inner.conns[ci].inflight.front() {
                if *s & ((1 << SEQ_BITS) - 1) > seq {
                    break;
                }
                let (_, ops, n) = inner.conns[ci].inflight.pop_front().expect("front");
                inner.conns[ci].outstanding -= n;
                for id in ops {
                    complete(inner, id, result.clone());
                }
            }
        }
        // Fail everything aimed at broken connections.
        for ci in 0..inner.conns.len() {
            let Some(why) = inner.conns[ci].broken.clone() else {
                continue;
            };
            let node = inner.conns[ci].node;
            let gone = || RpcError::PeerGone {
                node,
                why: why.clone(),
            };
            let mut ops: Vec<usize> = std::mem::take(&mut inner.conns[ci].pending_ops)
                .into_iter()
                .flatten()
                .collect();
            inner.conns[ci].pending.clear();
            for (_, o, _) in inner.conns[ci].inflight.drain(..) {
                ops.extend(o);
            }
            for id in ops {
                complete(inner, id, Err(gone()));
            }
            for slot in inner.calls.values_mut() {
                if slot.node == node && slot.result.is_none() {
                    slot.result = Some(Err(gone()));
                }
            }
        }
        work
    }
}

/// Read an 8-byte word a NIC writes, until two reads agree: Soft-RoCE places data with
/// `memcpy`, so a word can be seen half written for a moment. Used for credit words.
pub(crate) fn stable_word(mem: &MemoryRegion, off: usize) -> u64 {
    let mut a = mem.load_u64(off);
    loop {
        let b = mem.load_u64(off);
        if a == b {
            return a;
        }
        a = b;
    }
}

fn complete(inner: &mut Inner, id: usize, r: Result<(), RpcError>) {
    let slot = &mut inner.ops[id];
    if slot.abandoned {
        let buf = slot.buf;
        slot.state = OpState::Free;
        inner.scratch.free(buf);
        inner.free_ops.push(id);
    } else {
        slot.state = OpState::Done(r);
    }
}

struct OpWait<'a> {
    ctx: &'a ThreadCtx,
    id: usize,
}

impl Future for OpWait<'_> {
    type Output = Result<(), RpcError>;
    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        let mut inner = self.ctx.inner.borrow_mut();
        let slot = &mut inner.ops[self.id];
        match std::mem::replace(&mut slot.state, OpState::Taken) {
            OpState::Done(r) => Poll::Ready(r),
            other => {
                slot.state = other;
                Poll::Pending
            }
        }
    }
}

impl Drop for OpWait<'_> {
    fn drop(&mut self) {
        let mut inner = self.ctx.inner.borrow_mut();
        let inner = &mut *inner;
        let slot = &mut inner.ops[self.id];
        match slot.state {
            // Dropped before completion: the completion frees the slot.
            OpState::Waiting => slot.abandoned = true,
            // Completed but never looked at (or failed): free now.
            OpState::Done(_) => {
                let buf = slot.buf;
                slot.state = OpState::Free;
                inner.scratch.free(buf);
                inner.free_ops.push(self.id);
            }
            _ => {}
        }
    }
}

struct CallWait<'a> {
    ctx: &'a ThreadCtx,
    id: u64,
    node: u32,
    handler: u16,
    deadline: Instant,
}

impl Future for CallWait<'_> {
    type Output = Result<Vec<u8>, RpcError>;
    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        let mut inner = self.ctx.inner.borrow_mut();
        if let Some(r) = inner.calls.get_mut(&self.id).and_then(|s| s.result.take()) {
            inner.calls.remove(&self.id);
            return Poll::Ready(r);
        }
        if Instant::now() >= self.deadline {
            inner.calls.remove(&self.id);
            return Poll::Ready(Err(RpcError::Timeout {
                node: self.node,
                handler: self.handler,
                after: self.ctx.cfg.call_timeout,
            }));
        }
        Poll::Pending
    }
}

impl Drop for CallWait<'_> {
    fn drop(&mut self) {
        self.ctx.inner.borrow_mut().calls.remove(&self.id);
    }
}

/// Runs a thread's coroutines to completion over its [`ThreadCtx`].
pub struct Executor {
    ctx: Rc<ThreadCtx>,
    tasks: Vec<Option<Pin<Box<dyn Future<Output = ()>>>>>,
}

impl Executor {
    /// An executor for `ctx`'s thread.
    pub fn new(ctx: Rc<ThreadCtx>) -> Self {
        Self {
            ctx,
            tasks: Vec::new(),
        }
    }

    /// Add a coroutine.
    pub fn spawn(&mut self, f: impl Future<Output = ()> + 'static) {
        self.tasks.push(Some(Box::pin(f)));
    }

    /// Poll all coroutines round robin, with one I/O round ([`ThreadCtx::progress`])
    /// after each pass, until every coroutine has finished.
    pub fn run(&mut self) {
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut live = self.tasks.iter().filter(|t| t.is_some()).count();
        let mut idle = 0u32;
        while live > 0 {
            for slot in self.tasks.iter_mut() {
                if let Some(t) = slot {
                    if t.as_mut().poll(&mut cx).is_ready() {
                        *slot = None;
                        live -= 1;
                    }
                }
            }
            if self.ctx.progress() {
                idle = 0;
            } else {
                idle += 1;
                if idle > IDLE_SPINS {
                    std::thread::yield_now();
                }
            }
        }
        self.tasks.clear();
    }
}

/// Run `futs` concurrently within one coroutine; outputs in input order. Their WRs are
/// issued in the same polling round and so share doorbells (e.g. parallel locking or
/// reading a transaction's whole read set at once).
pub async fn join_all<F: Future>(futs: Vec<F>) -> Vec<F::Output> {
    let mut futs: Vec<Option<Pin<Box<F>>>> = futs.into_iter().map(|f| Some(Box::pin(f))).collect();
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(move |cx| {
        let mut pending = false;
        for (slot, o) in futs.iter_mut().zip(out.iter_mut()) {
            if let Some(f) = slot {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => {
                        *o = Some(v);
                        *slot = None;
                    }
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(
                out.iter_mut()
                    .map(|o| o.take().expect("every future finished"))
                    .collect(),
            )
        }
    })
    .await
}

/// Run two futures of different types concurrently within one coroutine.
pub async fn join<A: Future, B: Future>(a: A, b: B) -> (A::Output, B::Output) {
    let mut a = std::pin::pin!(a);
    let mut b = std::pin::pin!(b);
    let (mut ra, mut rb) = (None, None);
    std::future::poll_fn(|cx| {
        if ra.is_none() {
            if let Poll::Ready(v) = a.as_mut().poll(cx) {
                ra = Some(v);
            }
        }
        if rb.is_none() {
            if let Poll::Ready(v) = b.as_mut().poll(cx) {
                rb = Some(v);
            }
        }
        match (ra.take(), rb.take()) {
            (Some(x), Some(y)) => Poll::Ready((x, y)),
            (x, y) => {
                (ra, rb) = (x, y);
                Poll::Pending
            }
        }
    })
    .await
}
