//! The per-thread runtime: an executor running many coroutines (async tasks, one
//! transaction coordinator each) over one [`ThreadCtx`], and [`Runtime`], which starts T
//! such threads x C coroutines sharing one process-wide set of QP pools
//! ([`crate::straw`]).
//!
//! Coroutines issue one-sided operations ([`ThreadCtx::read`], [`ThreadCtx::write`],
//! [`ThreadCtx::cas`], [`ThreadCtx::faa`]) and RPC calls ([`ThreadCtx::call`],
//! [`ThreadCtx::call_with`]). Nothing is posted when they are issued: at the end of each
//! polling round the executor posts, per remote node, the round's one-sided WRs as one
//! list on a one-sided QP and the round's sealed Rocket buckets plus credit return as one
//! list on an RPC QP, each with one doorbell and only its last WR signaled (selective
//! signaling; an RC QP completes in order). It then polls the QPs and the response
//! Rockets. This is the coroutine model of FaRM/FORD and Scythe's RRPC
//! (000_f3dba2ed893b246b.txt, 4.4 Fig. 16 and 4.6).
//!
//! Replies travel in one of Scythe's three modes (4.6 (2), Fig. 20), chosen per call
//! ([`Mode`]): pure RPC, RPC + one-sided READ, or RPC zero-copy; [`Mode::Auto`] picks by
//! size around [`RuntimeConfig::mode_threshold`] (512 B).
//!
//! Tasks are polled round robin with a no-op waker: every round polls every live task,
//! as a coroutine scheduler yielding on each remote access does. A [`ThreadCtx`] is
//! single-threaded by construction (`Rc`, `RefCell`): one per OS thread.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::arena::{Arena, Chunk};
use crate::ctrl::{node_info, CtrlRequest, NodeError, NodeInfo, RocketOffer, RpcAccept};
use crate::fabric::{
    Fabric, FabricError, MemoryRegion, MrDesc, RemoteAddr, SendWr, WcStatus, WrOpcode,
};
use crate::rocket::{
    decode_batch, BucketSpan, MsgHeader, RocketConfig, RocketError, RocketReceiver, RocketSender,
};
use crate::server::credit_every;
use crate::straw::{Mailbox, QpKind, SharedQp, Straw, StrawConfig, Straws};
use crate::wire::{Batching, IdHash, MsgKind, ReadReply, ReplyMode, ZeroCopyPrefix, IDLE_SPINS};

/// Runtime settings.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// Geometry of the request and response Rockets of each RPC channel (default 64
    /// buckets of 512 B).
    pub rocket: RocketConfig,
    /// Batching of RPC traffic, both directions (default [`Batching::Combined`]).
    pub batching: Batching,
    /// Default deadline of an RPC call, from issue to response (default 2 s);
    /// [`CallOpts::timeout`] overrides it per call.
    pub call_timeout: Duration,
    /// How long connection setup waits for a node's control plane (default 10 s).
    pub connect_timeout: Duration,
    /// Send-queue depth of each QP, in WRs (default 512). A polling round's WRs beyond
    /// the room left wait for the next round.
    pub sq_depth: usize,
    /// Threads per QP before a straw adds a QP (default 4); see [`StrawConfig`].
    pub threads_per_qp: usize,
    /// [`Mode::Auto`] sends replies up to this many bytes inline and larger ones by
    /// RPC + READ or zero-copy (default 512, Scythe 4.6 (2)).
    pub mode_threshold: usize,
    /// Registered buffer bytes per thread for one-sided ops and zero-copy replies
    /// (default 32 MiB; untouched pages cost nothing).
    pub buffer_bytes: usize,
    /// Largest single one-sided op, READ-mode reply or zero-copy reply in bytes (default
    /// 4 MiB).
    pub max_transfer: usize,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            rocket: RocketConfig::default(),
            batching: Batching::Combined,
            call_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(10),
            sq_depth: 512,
            threads_per_qp: 4,
            mode_threshold: 512,
            buffer_bytes: 32 << 20,
            max_transfer: 4 << 20,
        }
    }
}

impl RuntimeConfig {
    /// The straw settings these imply.
    pub fn straw_config(&self) -> StrawConfig {
        StrawConfig {
            threads_per_qp: self.threads_per_qp.max(1),
            sq_depth: self.sq_depth,
            connect_timeout: self.connect_timeout,
        }
    }
}

/// How a call's reply travels (Scythe 4.6 (2), Fig. 20).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// By size: a reply expected ([`CallOpts::reply_len`]) above the threshold goes
    /// zero-copy; otherwise the server sends it inline when it is at most the threshold,
    /// else by RPC + READ.
    #[default]
    Auto,
    /// Pure RPC: the reply rides in the response Rocket (at most `bucket_size - 32` bytes;
    /// a larger one is an error).
    Rpc,
    /// RPC + one-sided READ: the reply carries the server buffer's address and length; the
    /// caller READs it and then releases the buffer.
    Read,
    /// RPC zero-copy: the request carries a registered buffer of [`CallOpts::reply_len`]
    /// bytes (default [`RuntimeConfig::max_transfer`]); the server WRITEs the reply into it.
    ZeroCopy,
}

/// Per-call options.
#[derive(Clone, Copy, Debug, Default)]
pub struct CallOpts {
    /// Reply mode.
    pub mode: Mode,
    /// Expected (for [`Mode::ZeroCopy`]: largest) reply size in bytes, if known.
    pub reply_len: Option<usize>,
    /// Deadline from issue to reply; `None` uses [`RuntimeConfig::call_timeout`].
    pub timeout: Option<Duration>,
}

impl CallOpts {
    /// Options forcing `mode`.
    pub fn mode(mode: Mode) -> Self {
        Self {
            mode,
            ..Self::default()
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
    /// The WR completed with an error status (a one-sided op whose QP failed; the QP is
    /// reconnected, later ops go through).
    #[error("work request to node {node} failed: {status:?}")]
    Completion {
        /// Node id.
        node: u32,
        /// Completion status.
        status: WcStatus,
    },
    /// The peer is gone; pending work to it fails with this.
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
    /// A payload larger than the mode or operation can carry (nothing was sent).
    #[error("payload of {len} bytes exceeds the {max}-byte limit")]
    TooLarge {
        /// Payload bytes.
        len: usize,
        /// Limit in bytes.
        max: usize,
    },
    /// The handler answered with an error (including a reply too large for the mode).
    #[error("node {node} handler {handler}: {msg}")]
    Remote {
        /// Node id.
        node: u32,
        /// Handler id.
        handler: u16,
        /// The handler's message.
        msg: String,
    },
    /// A reply that breaks the protocol (e.g. a READ reply descriptor of the wrong size).
    #[error("node {node}: malformed reply: {what}")]
    Protocol {
        /// Node id.
        node: u32,
        /// What is wrong.
        what: String,
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
    /// Lists reported failed by a QP and replayed (Rocket buckets) or failed (one-sided).
    pub failed_lists: u64,
    /// Times a Rocket or the one-sided traffic moved to another QP of its straw.
    pub qp_switches: u64,
    /// Replies received inline in the response Rocket (pure RPC).
    pub inline_replies: u64,
    /// Replies fetched with a one-sided READ (RPC + READ mode).
    pub read_replies: u64,
    /// Replies the server WRITEs into the caller's buffer (zero-copy mode).
    pub zero_copy_replies: u64,
}

impl Stats {
    /// Messages per bucket WRITE (msg batching factor).
    pub fn messages_per_write(&self) -> f64 {
        self.messages as f64 / self.buckets.max(1) as f64
    }
    /// WRs per doorbell (doorbell batching factor).
    pub fn wrs_per_doorbell(&self) -> f64 {
        self.wrs as f64 / self.doorbells.max(1) as f64
    }
    /// Counter-wise sum (for totals over threads).
    pub fn add(&mut self, o: &Stats) {
        self.doorbells += o.doorbells;
        self.wrs += o.wrs;
        self.buckets += o.buckets;
        self.messages += o.messages;
        self.credit_stalls += o.credit_stalls;
        self.bytes += o.bytes;
        self.sq_full += o.sq_full;
        self.failed_lists += o.failed_lists;
        self.qp_switches += o.qp_switches;
        self.inline_replies += o.inline_replies;
        self.read_replies += o.read_replies;
        self.zero_copy_replies += o.zero_copy_replies;
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
    chunk: Option<Chunk>,
    len: usize,
    abandoned: bool,
}

struct RpcChan {
    tx: RocketSender,
    staging: MemoryRegion,
    req_ring: MrDesc,
    rx: RocketReceiver,
    resp_ring: MemoryRegion,
    /// Word 0: request credits written by the server. Word 1: source of credit WRITEs.
    words: MemoryRegion,
    resp_credit: RemoteAddr,
    credit_every: u64,
    /// Sealed buckets to post (replays first).
    spans: VecDeque<BucketSpan>,
    force_credit: bool,
    /// The QP this Rocket's lists are outstanding on, and how many.
    qp: Option<Arc<SharedQp>>,
    lists: usize,
    /// READ-mode reply buffers to release at the server.
    releases: Vec<u64>,
    /// The server's id of this Rocket pair (to close it).
    rocket: u64,
}

struct Conn {
    node: u32,
    straw: Arc<Straw>,
    /// One-sided WRs not yet posted, and the op each belongs to.
    os_pending: Vec<SendWr>,
    os_ops: Vec<usize>,
    os_qp: Option<Arc<SharedQp>>,
    os_lists: usize,
    rpc: Option<RpcChan>,
    attached: Vec<QpKind>,
    broken: Option<String>,
}

enum Reply {
    Inline(Result<Vec<u8>, RpcError>),
    Read(ReadReply),
    ZeroCopy(usize),
}

struct CallSlot {
    node: u32,
    result: Option<Reply>,
    chunk: Option<Chunk>,
}

/// What one posted list carried, to finish or replay it when its completion arrives.
enum Rec {
    OneSided {
        conn: usize,
        ops: Vec<usize>,
    },
    Rocket {
        conn: usize,
        spans: Vec<BucketSpan>,
        credit: bool,
    },
}

enum Item {
    Span(BucketSpan),
    Credit,
}

struct Inner {
    conns: Vec<Conn>,
    by_node: HashMap<u32, usize>,
    ops: Vec<OpSlot>,
    free_ops: Vec<usize>,
    arena: Arena,
    calls: HashMap<u64, CallSlot, IdHash>,
    /// Zero-copy buffers of calls that ended without their reply: the server may still
    /// WRITE into them, so they are freed when the late reply arrives or at the deadline.
    zombies: HashMap<u64, (Chunk, Instant)>,
    next_call: u64,
    stats: Stats,
    recs: Vec<Option<Rec>>,
    free_recs: Vec<usize>,
    wrs: Vec<SendWr>,
    items: Vec<Item>,
    batch: Vec<u8>,
    done: Vec<(u64, WcStatus)>,
    rounds: u64,
    /// Emptied op and span lists of finished records, reused (no allocation per list).
    vec_pool: Vec<Vec<usize>>,
    span_pool: Vec<Vec<BucketSpan>>,
}

/// One thread's connections, buffers and in-flight work. Shared by the thread's
/// coroutines through `Rc`.
pub struct ThreadCtx {
    straws: Arc<Straws>,
    cfg: RuntimeConfig,
    mailbox: Arc<Mailbox>,
    inner: RefCell<Inner>,
    /// Coroutines spawned by [`ThreadCtx::spawn`], not yet taken by the executor.
    spawned: RefCell<Vec<Task>>,
}

/// A coroutine as the executor holds it.
type Task = Pin<Box<dyn Future<Output = ()>>>;

/// How long a zero-copy buffer of an abandoned call stays reserved.
const ZOMBIE_GRACE: Duration = Duration::from_secs(30);

impl ThreadCtx {
    /// A context on `fabric` with its own straws (QPs not shared with other threads).
    /// Use [`Runtime`] to share QP pools among threads.
    pub fn new(fabric: Fabric, cfg: RuntimeConfig) -> Result<Rc<Self>, RpcError> {
        let straws = Straws::new(fabric, cfg.straw_config());
        Self::with_straws(straws, cfg)
    }

    /// A context whose QPs come from the process-wide `straws`.
    pub fn with_straws(straws: Arc<Straws>, cfg: RuntimeConfig) -> Result<Rc<Self>, RpcError> {
        cfg.rocket
            .validate()
            .map_err(|e| RpcError::Connect(e.to_string()))?;
        if cfg.sq_depth == 0 {
            return Err(RpcError::Connect("sq_depth must be at least 1".into()));
        }
        let arena = Arena::new(straws.fabric(), cfg.buffer_bytes, cfg.max_transfer)?;
        Ok(Rc::new(Self {
            straws,
            cfg,
            mailbox: Mailbox::new(),
            inner: RefCell::new(Inner {
                conns: Vec::new(),
                by_node: HashMap::new(),
                ops: Vec::new(),
                free_ops: Vec::new(),
                arena,
                calls: HashMap::default(),
                zombies: HashMap::new(),
                next_call: 1,
                stats: Stats::default(),
                recs: Vec::new(),
                free_recs: Vec::new(),
                wrs: Vec::new(),
                items: Vec::new(),
                batch: Vec::new(),
                done: Vec::new(),
                rounds: 0,
                vec_pool: Vec::new(),
                span_pool: Vec::new(),
            }),
            spawned: RefCell::new(Vec::new()),
        }))
    }

    /// The fabric this context runs on.
    pub fn fabric(&self) -> &Fabric {
        self.straws.fabric()
    }

    /// The settings.
    pub fn config(&self) -> &RuntimeConfig {
        &self.cfg
    }

    /// The straws this thread's QPs come from.
    pub fn straws(&self) -> &Arc<Straws> {
        &self.straws
    }

    /// Counters so far.
    pub fn stats(&self) -> Stats {
        self.inner.borrow().stats
    }

    /// Attach to the straw of the node at `addr` for one-sided operations. Returns the
    /// node's [`NodeInfo`]. Blocking; call before running coroutines. Errors: the node's
    /// control plane is unreachable or refuses; QPs cannot be created.
    pub fn connect(&self, addr: SocketAddr) -> Result<NodeInfo, RpcError> {
        let info = node_info(addr, self.cfg.connect_timeout)?;
        self.attach(&info, addr, QpKind::OneSided)?;
        Ok(info)
    }

    /// Attach for one-sided operations and RPC: also opens this thread's Rocket pair (a
    /// request ring at the node, a response ring here). Errors as [`ThreadCtx::connect`],
    /// and a node that serves no RPCs.
    pub fn connect_rpc(&self, addr: SocketAddr) -> Result<NodeInfo, RpcError> {
        let info = node_info(addr, self.cfg.connect_timeout)?;
        let ci = self.attach(&info, addr, QpKind::OneSided)?;
        if self.inner.borrow().conns[ci].rpc.is_some() {
            return Ok(info);
        }
        self.attach(&info, addr, QpKind::Rpc)?;
        let cfg = self.cfg.rocket;
        let fabric = self.straws.fabric();
        let staging = fabric.alloc_mr(cfg.ring_bytes())?;
        let resp_ring = fabric.alloc_mr(cfg.ring_bytes())?;
        let words = fabric.alloc_mr(16)?;
        let mut c = crate::bootstrap::BootstrapClient::connect(addr, self.cfg.connect_timeout)
            .map_err(|e| RpcError::Connect(format!("{addr}: {e}")))?;
        let accept: RpcAccept = c
            .call_typed(&CtrlRequest::ConnectRocket(RocketOffer {
                node: fabric.node(),
                straw: self.straws.id(),
                geometry: cfg,
                batching: self.cfg.batching,
                mode_threshold: self.cfg.mode_threshold,
                resp_ring: resp_ring.desc(),
                req_credit: words.desc().at(0),
            }))
            .map_err(|e| RpcError::Connect(format!("{addr}: {e}")))?;
        let chan = RpcChan {
            tx: RocketSender::new(cfg).map_err(|e| RpcError::Connect(e.to_string()))?,
            staging,
            req_ring: accept.req_ring,
            rx: RocketReceiver::new(cfg).map_err(|e| RpcError::Connect(e.to_string()))?,
            resp_ring,
            words,
            resp_credit: accept.resp_credit,
            credit_every: credit_every(&cfg),
            spans: VecDeque::new(),
            force_credit: false,
            qp: None,
            lists: 0,
            releases: Vec::new(),
            rocket: accept.rocket,
        };
        self.inner.borrow_mut().conns[ci].rpc = Some(chan);
        Ok(info)
    }

    /// Attach this thread to the straw of `info.node` for `kind`; returns the conn index.
    fn attach(&self, info: &NodeInfo, addr: SocketAddr, kind: QpKind) -> Result<usize, RpcError> {
        let existing = self.inner.borrow().by_node.get(&info.node).copied();
        let ci = match existing {
            Some(ci) => ci,
            None => {
                let straw = self.straws.straw(info.node, addr);
                let mut inner = self.inner.borrow_mut();
                let ci = inner.conns.len();
                inner.conns.push(Conn {
                    node: info.node,
                    straw,
                    os_pending: Vec::new(),
                    os_ops: Vec::new(),
                    os_qp: None,
                    os_lists: 0,
                    rpc: None,
                    attached: Vec::new(),
                    broken: None,
                });
                inner.by_node.insert(info.node, ci);
                ci
            }
        };
        let straw = {
            let inner = self.inner.borrow();
            if inner.conns[ci].attached.contains(&kind) {
                return Ok(ci);
            }
            inner.conns[ci].straw.clone()
        };
        straw.attach(kind)?;
        self.inner.borrow_mut().conns[ci].attached.push(kind);
        Ok(ci)
    }

    /// RDMA READ of `len` bytes at `remote` on `node`. Errors: [`RpcError::TooLarge`] past
    /// [`RuntimeConfig::max_transfer`], [`RpcError::Completion`], [`RpcError::PeerGone`].
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

    /// Call handler `handler` on `node` with `req` in [`Mode::Auto`] with the default
    /// deadline; resolves to the reply payload. See [`ThreadCtx::call_with`].
    pub async fn call(&self, node: u32, handler: u16, req: &[u8]) -> Result<Vec<u8>, RpcError> {
        self.call_with(node, handler, req, CallOpts::default())
            .await
    }

    /// Call handler `handler` on `node` with `req`; the reply travels as `opts.mode`
    /// says. Requests ride in the request Rocket, so `req` plus the mode's prefix (0, 8
    /// or 16 bytes) must fit one bucket (`bucket_size - 32` bytes). Errors:
    /// [`RpcError::TooLarge`] for such a request or a zero-copy buffer above
    /// [`RuntimeConfig::max_transfer`]; [`RpcError::Timeout`] after the deadline;
    /// [`RpcError::PeerGone`]; [`RpcError::Remote`] when the handler failed or its reply is
    /// too large for the mode (never truncated); [`RpcError::Completion`] when the READ of
    /// a READ-mode reply failed.
    pub async fn call_with(
        &self,
        node: u32,
        handler: u16,
        req: &[u8],
        opts: CallOpts,
    ) -> Result<Vec<u8>, RpcError> {
        let timeout = opts.timeout.unwrap_or(self.cfg.call_timeout);
        let deadline = Instant::now() + timeout;
        let threshold = self.cfg.mode_threshold;
        let (mode, zc_len) = match opts.mode {
            Mode::Rpc => (ReplyMode::Inline, 0),
            Mode::Read => (ReplyMode::Read, 0),
            Mode::ZeroCopy => (
                ReplyMode::ZeroCopy,
                opts.reply_len.unwrap_or(self.cfg.max_transfer),
            ),
            Mode::Auto => match opts.reply_len {
                Some(n) if n > threshold => (ReplyMode::ZeroCopy, n),
                _ => (ReplyMode::Auto, 0),
            },
        };
        if mode == ReplyMode::ZeroCopy && zc_len > self.cfg.max_transfer {
            return Err(RpcError::TooLarge {
                len: zc_len,
                max: self.cfg.max_transfer,
            });
        }
        let mut stalled = false;
        let mut chunk: Option<Chunk> = None;
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
            let max = chan.tx.max_payload();
            if req.len() + mode.prefix_bytes() > max {
                return Poll::Ready(Err(RpcError::TooLarge {
                    len: req.len() + mode.prefix_bytes(),
                    max,
                }));
            }
            if mode == ReplyMode::ZeroCopy && chunk.is_none() {
                match inner.arena.alloc(zc_len) {
                    Some(c) => chunk = Some(c),
                    None if Instant::now() < deadline => return Poll::Pending,
                    None => {
                        return Poll::Ready(Err(RpcError::Timeout {
                            node,
                            handler,
                            after: timeout,
                        }))
                    }
                }
            }
            let call_id = inner.next_call;
            let hdr = MsgHeader {
                len: 0,
                handler,
                kind: MsgKind::Request as u8,
                flags: mode as u8,
                call_id,
            };
            let mut pre = [0u8; 16];
            let pre: &[u8] = match mode {
                ReplyMode::Inline | ReplyMode::Auto | ReplyMode::Read => &[],
                ReplyMode::ZeroCopy => {
                    let c = chunk.expect("allocated above");
                    pre.copy_from_slice(
                        &ZeroCopyPrefix {
                            addr: inner.arena.mr().addr() + c.off as u64,
                            rkey: inner.arena.mr().rkey(),
                            capacity: zc_len as u32,
                        }
                        .to_bytes(),
                    );
                    &pre[..]
                }
            };
            match chan.tx.push_parts(&chan.staging, hdr, &[pre, req]) {
                Ok(()) => {
                    if !self.cfg.batching.msg() {
                        chan.tx.seal(&chan.staging);
                    }
                    inner.next_call += 1;
                    inner.stats.messages += 1;
                    inner.stats.bytes += req.len() as u64;
                    inner.calls.insert(
                        call_id,
                        CallSlot {
                            node,
                            result: None,
                            chunk: chunk.take(),
                        },
                    );
                    Poll::Ready(Ok(call_id))
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
                    after: timeout,
                })),
                Err(RocketError::TooLarge { len, max }) => {
                    Poll::Ready(Err(RpcError::TooLarge { len, max }))
                }
                Err(e) => Poll::Ready(Err(RpcError::Connect(e.to_string()))),
            }
        })
        .await;
        if let Some(c) = chunk {
            // Failed before the request went out: nobody will write into it.
            self.inner.borrow_mut().arena.free(c);
        }
        let id = id?;
        let reply = CallWait {
            ctx: self,
            polls: 0,
            id,
            node,
            handler,
            deadline,
            after: timeout,
        }
        .await;
        let (reply, chunk) = reply?;
        if let (Some(c), false) = (chunk, matches!(reply, Reply::ZeroCopy(_))) {
            // Not written through after all (e.g. an error reply): free it.
            self.inner.borrow_mut().arena.free(c);
        }
        match reply {
            Reply::Inline(r) => r,
            Reply::ZeroCopy(len) => {
                let mut inner = self.inner.borrow_mut();
                let Some(c) = chunk else {
                    return Err(RpcError::Protocol {
                        node,
                        what: "zero-copy reply to a call without a buffer".into(),
                    });
                };
                let r = if len > c.bytes() {
                    Err(RpcError::Protocol {
                        node,
                        what: format!("zero-copy reply of {len} bytes overruns the buffer"),
                    })
                } else {
                    let mut out = vec![0u8; len];
                    inner.arena.mr().read(c.off, &mut out);
                    Ok(out)
                };
                inner.arena.free(c);
                r
            }
            Reply::Read(r) => {
                let remote = RemoteAddr {
                    addr: r.addr,
                    rkey: r.rkey,
                };
                let data = self.read(node, remote, r.len as usize).await;
                self.release(node, r.handle);
                data
            }
        }
    }

    /// Queue a Release of READ-mode reply buffer `handle` at `node` (sent next round).
    fn release(&self, node: u32, handle: u64) {
        let mut inner = self.inner.borrow_mut();
        if let Some(&ci) = inner.by_node.get(&node) {
            if let Some(chan) = inner.conns[ci].rpc.as_mut() {
                chan.releases.push(handle);
            }
        }
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

    /// Run `f` as a coroutine of its own on this thread's [`Executor`]: the one running
    /// now picks it up after its current pass, otherwise the next one to run. For work
    /// that must finish although its owner is gone, such as passing on a lock whose
    /// guard was dropped (drop cannot await). The executor's `run` returns only after
    /// spawned coroutines have finished too. A context dropped with coroutines never
    /// run logs a warning; `f` should hold a `Weak` of the context, not an `Rc`, so that
    /// such a context can be dropped at all.
    pub fn spawn(&self, f: impl Future<Output = ()> + 'static) {
        self.spawned.borrow_mut().push(Box::pin(f));
    }

    fn take_spawned(&self) -> Vec<Task> {
        std::mem::take(&mut *self.spawned.borrow_mut())
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
            if len > inner.arena.max_chunk() {
                return Poll::Ready(Err(RpcError::TooLarge {
                    len,
                    max: inner.arena.max_chunk(),
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
            let Some(chunk) = inner.arena.alloc(len) else {
                return Poll::Pending;
            };
            if let Some(d) = data {
                inner.arena.mr().write(chunk.off, d);
            }
            let id = match inner.free_ops.pop() {
                Some(id) => id,
                None => {
                    inner.ops.push(OpSlot {
                        state: OpState::Free,
                        chunk: None,
                        len: 0,
                        abandoned: false,
                    });
                    inner.ops.len() - 1
                }
            };
            inner.ops[id] = OpSlot {
                state: OpState::Waiting,
                chunk: Some(chunk),
                len,
                abandoned: false,
            };
            let wr = SendWr {
                wr_id: 0,
                opcode,
                sge: inner.arena.mr().sge(chunk.off, len),
                remote,
                signaled: false,
                inline: false,
            };
            inner.stats.bytes += len as u64;
            let conn = &mut inner.conns[ci];
            conn.os_pending.push(wr);
            conn.os_ops.push(id);
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
        let inner = &mut *inner;
        let slot = &mut inner.ops[id];
        let len = slot.len;
        let chunk = slot.chunk.take();
        slot.state = OpState::Free;
        let mut out = vec![0u8; len];
        if let Some(c) = chunk {
            inner.arena.mr().read(c.off, &mut out);
            inner.arena.free(c);
        }
        inner.free_ops.push(id);
        out
    }

    /// Inject a transport failure into the QPs of `kind` of this thread's straw to `node`
    /// (they go to the error state and are reconnected by the next thread that posts).
    /// For fault tests and benchmarks. Errors: not connected; the verbs call failed.
    pub fn inject_qp_error(&self, node: u32, kind: QpKind) -> Result<usize, RpcError> {
        let inner = self.inner.borrow();
        let &ci = inner
            .by_node
            .get(&node)
            .ok_or(RpcError::NotConnected { node })?;
        let qps = inner.conns[ci].straw.list(kind);
        for q in &qps {
            q.inject_error()?;
        }
        Ok(qps.len())
    }

    /// One polling round's I/O: post every node's pending WRs (one doorbell per QP used),
    /// poll the QPs and the response Rockets, replay what failed, notice dead peers.
    /// Returns whether anything happened.
    pub fn progress(&self) -> bool {
        let mut inner = self.inner.borrow_mut();
        let inner = &mut *inner;
        inner.rounds += 1;
        let check = inner.rounds.is_multiple_of(64);
        let mut work = false;
        for ci in 0..inner.conns.len() {
            if inner.conns[ci].broken.is_none() {
                if let Some(why) = inner.conns[ci].straw.dead() {
                    inner.conns[ci].broken = Some(why);
                }
            }
            if inner.conns[ci].broken.is_some() {
                continue;
            }
            if !inner.conns[ci].os_pending.is_empty() {
                work = true;
                self.post_one_sided(inner, ci);
            }
            if inner.conns[ci].rpc.is_some() {
                work |= self.rocket_round(inner, ci);
            }
            let conn = &inner.conns[ci];
            if conn.os_lists > 0 {
                if let Some(q) = &conn.os_qp {
                    q.poll();
                }
            }
            if let Some(chan) = &conn.rpc {
                if let Some(q) = &chan.qp {
                    if chan.lists > 0 || (check && !inner.calls.is_empty()) {
                        q.poll();
                        if check && q.is_broken() {
                            conn.straw.reconnect(q);
                        }
                    }
                }
            }
        }
        // Completions routed here by whichever thread polled the QPs.
        inner.done.clear();
        self.mailbox.drain(&mut inner.done);
        for i in 0..inner.done.len() {
            work = true;
            let (token, status) = inner.done[i];
            let Some(rec) = inner.recs[token as usize].take() else {
                continue;
            };
            inner.free_recs.push(token as usize);
            if status != WcStatus::Success {
                inner.stats.failed_lists += 1;
            }
            match rec {
                Rec::OneSided { conn, mut ops } => {
                    let c = &mut inner.conns[conn];
                    c.os_lists -= 1;
                    let node = c.node;
                    for &id in &ops {
                        let r = if status == WcStatus::Success {
                            Ok(())
                        } else {
                            Err(RpcError::Completion { node, status })
                        };
                        complete(inner, id, r);
                    }
                    ops.clear();
                    inner.vec_pool.push(ops);
                }
                Rec::Rocket {
                    conn,
                    mut spans,
                    credit,
                } => {
                    let Some(chan) = inner.conns[conn].rpc.as_mut() else {
                        continue;
                    };
                    chan.lists -= 1;
                    if status != WcStatus::Success {
                        for s in spans.drain(..).rev() {
                            chan.spans.push_front(s);
                        }
                        chan.force_credit |= credit;
                    }
                    spans.clear();
                    inner.span_pool.push(spans);
                }
            }
        }
        if check && !inner.zombies.is_empty() {
            let now = Instant::now();
            let arena = &mut inner.arena;
            inner.zombies.retain(|_, (c, until)| {
                if *until <= now {
                    arena.free(*c);
                    false
                } else {
                    true
                }
            });
        }
        // Fail everything aimed at unreachable nodes.
        for ci in 0..inner.conns.len() {
            let Some(why) = inner.conns[ci].broken.clone() else {
                continue;
            };
            let node = inner.conns[ci].node;
            let gone = || RpcError::PeerGone {
                node,
                why: why.clone(),
            };
            let mut ops: Vec<usize> = std::mem::take(&mut inner.conns[ci].os_ops);
            inner.conns[ci].os_pending.clear();
            for r in inner.recs.iter_mut() {
                if let Some(Rec::OneSided { conn, ops: o }) = r {
                    if *conn == ci {
                        ops.append(o);
                    }
                }
            }
            for id in ops {
                complete(inner, id, Err(gone()));
            }
            for slot in inner.calls.values_mut() {
                if slot.node == node && slot.result.is_none() {
                    slot.result = Some(Reply::Inline(Err(gone())));
                }
            }
        }
        work
    }

    /// Post a node's pending one-sided WRs on a one-sided QP of its straw.
    fn post_one_sided(&self, inner: &mut Inner, ci: usize) {
        let conn = &mut inner.conns[ci];
        let qp = if conn.os_lists > 0 {
            // Stick while lists are outstanding: a coroutine's later WRs must not pass
            // its earlier ones on another QP.
            match &conn.os_qp {
                Some(q) if !q.is_broken() => q.clone(),
                _ => return,
            }
        } else {
            match conn.straw.pick(QpKind::OneSided, conn.os_qp.as_ref()) {
                Some(q) => q,
                None => return,
            }
        };
        if conn
            .os_qp
            .as_ref()
            .is_some_and(|old| !Arc::ptr_eq(old, &qp))
        {
            inner.stats.qp_switches += 1;
        }
        conn.os_qp = Some(qp.clone());
        let per_list = if self.cfg.batching.doorbell() {
            usize::MAX
        } else {
            1
        };
        let mut posted = 0;
        let total = conn.os_pending.len();
        while posted < total {
            let end = posted.saturating_add(per_list).min(total);
            let token = alloc_rec(&mut inner.recs, &mut inner.free_recs);
            let n = qp
                .post(
                    &mut conn.os_pending[posted..end],
                    &self.mailbox,
                    token as u64,
                )
                .unwrap_or(0);
            if n == 0 {
                inner.free_recs.push(token);
                break;
            }
            inner.recs[token] = Some(Rec::OneSided {
                conn: ci,
                ops: {
                    let mut v = inner.vec_pool.pop().unwrap_or_default();
                    v.extend_from_slice(&conn.os_ops[posted..posted + n]);
                    v
                },
            });
            inner.stats.doorbells += 1;
            inner.stats.wrs += n as u64;
            conn.os_lists += 1;
            posted += n;
        }
        if posted > 0 {
            conn.os_pending.drain(..posted);
            conn.os_ops.drain(..posted);
        }
        if posted < total {
            inner.stats.sq_full += 1;
        }
    }

    /// A Rocket's round: credits in, releases out, seal and post buckets and credit,
    /// receive responses. Returns whether anything happened.
    fn rocket_round(&self, inner: &mut Inner, ci: usize) -> bool {
        let mut work = false;
        let node = inner.conns[ci].node;
        let batching = self.cfg.batching;
        let conn = &mut inner.conns[ci];
        let chan = conn.rpc.as_mut().expect("rpc");
        let _ = chan.tx.on_credit(stable_word(&chan.words, 0));
        while let Some(&h) = chan.releases.last() {
            let hdr = MsgHeader {
                len: 0,
                handler: 0,
                kind: MsgKind::Release as u8,
                flags: 0,
                call_id: 0,
            };
            if chan.tx.push(&chan.staging, hdr, &h.to_le_bytes()).is_err() {
                break; // ring full: next round
            }
            if !batching.msg() {
                chan.tx.seal(&chan.staging);
            }
            chan.releases.pop();
        }
        chan.tx.seal(&chan.staging);
        let before = chan.spans.len();
        chan.tx.take_ready_deque(&mut chan.spans);
        inner.stats.buckets += (chan.spans.len() - before) as u64;
        // Responses.
        loop {
            inner.batch.clear();
            match chan.rx.poll(&chan.resp_ring, &mut inner.batch) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    conn.broken = Some(format!("corrupt response ring: {e}"));
                    return true;
                }
            }
            work = true;
            for m in decode_batch(&inner.batch) {
                let Ok((h, payload)) = m else {
                    conn.broken = Some("corrupt response batch".into());
                    return true;
                };
                let reply = match MsgKind::from_u8(h.kind) {
                    Some(MsgKind::Response) => Reply::Inline(Ok(payload.to_vec())),
                    Some(MsgKind::Error) => Reply::Inline(Err(RpcError::Remote {
                        node,
                        handler: h.handler,
                        msg: String::from_utf8_lossy(payload).into_owned(),
                    })),
                    Some(MsgKind::ReadReply) => match ReadReply::from_bytes(payload) {
                        Some(r) => Reply::Read(r),
                        None => Reply::Inline(Err(RpcError::Protocol {
                            node,
                            what: format!("READ reply of {} bytes", payload.len()),
                        })),
                    },
                    Some(MsgKind::ZeroCopyDone) => match payload.get(..8) {
                        Some(b) => {
                            Reply::ZeroCopy(u64::from_le_bytes(b.try_into().expect("8")) as usize)
                        }
                        None => Reply::Inline(Err(RpcError::Protocol {
                            node,
                            what: "zero-copy reply without a length".into(),
                        })),
                    },
                    _ => continue,
                };
                match &reply {
                    Reply::Inline(Ok(_)) => inner.stats.inline_replies += 1,
                    Reply::Read(_) => inner.stats.read_replies += 1,
                    Reply::ZeroCopy(_) => inner.stats.zero_copy_replies += 1,
                    Reply::Inline(Err(_)) => {}
                }
                match inner.calls.get_mut(&h.call_id) {
                    Some(slot) => slot.result = Some(reply),
                    // A reply to a call that ended (deadline): release what it holds.
                    None => match reply {
                        Reply::Read(r) => chan.releases.push(r.handle),
                        Reply::ZeroCopy(_) => {
                            if let Some((c, _)) = inner.zombies.remove(&h.call_id) {
                                inner.arena.free(c);
                            }
                        }
                        Reply::Inline(_) => {
                            if let Some((c, _)) = inner.zombies.remove(&h.call_id) {
                                inner.arena.free(c);
                            }
                        }
                    },
                }
            }
        }
        if chan.rx.credit_due(chan.credit_every).is_some() {
            chan.force_credit = true;
        }
        if chan.spans.is_empty() && !chan.force_credit {
            return work;
        }
        work = true;
        let qp = if chan.lists > 0 {
            match &chan.qp {
                Some(q) if !q.is_broken() => q.clone(),
                _ => return work,
            }
        } else {
            match conn.straw.pick(QpKind::Rpc, chan.qp.as_ref()) {
                Some(q) => q,
                None => return work,
            }
        };
        if chan.qp.as_ref().is_some_and(|old| !Arc::ptr_eq(old, &qp)) {
            inner.stats.qp_switches += 1;
        }
        chan.qp = Some(qp.clone());
        let wrs = &mut inner.wrs;
        let items = &mut inner.items;
        wrs.clear();
        items.clear();
        let credit = chan.force_credit.then(|| chan.rx.consumed());
        chan.force_credit = false;
        rocket_wrs(
            RocketOut {
                spans: &mut chan.spans,
                consumed: chan.tx.consumed(),
                staging: &chan.staging,
                ring: &chan.req_ring,
                credit,
                words: &chan.words,
                credit_to: chan.resp_credit,
            },
            wrs,
            |s| items.push(s.map_or(Item::Credit, Item::Span)),
        );
        let per_list = if batching.doorbell() { usize::MAX } else { 1 };
        let mut at = 0;
        while at < wrs.len() {
            let end = at.saturating_add(per_list).min(wrs.len());
            let token = alloc_rec(&mut inner.recs, &mut inner.free_recs);
            let n = qp
                .post(&mut wrs[at..end], &self.mailbox, token as u64)
                .unwrap_or(0);
            if n == 0 {
                inner.free_recs.push(token);
                inner.stats.sq_full += 1;
                break;
            }
            let mut spans = inner.span_pool.pop().unwrap_or_default();
            let mut credit = false;
            for it in items.drain(..n) {
                match it {
                    Item::Span(s) => spans.push(s),
                    Item::Credit => credit = true,
                }
            }
            inner.recs[token] = Some(Rec::Rocket {
                conn: ci,
                spans,
                credit,
            });
            inner.stats.doorbells += 1;
            inner.stats.wrs += n as u64;
            chan.lists += 1;
            at += n;
        }
        // What did not fit waits for the next round, in order.
        for it in items.drain(..) {
            match it {
                Item::Span(s) => chan.spans.push_back(s),
                Item::Credit => chan.force_credit = true,
            }
        }
        work
    }
}

impl Drop for ThreadCtx {
    fn drop(&mut self) {
        let never_ran = self.spawned.get_mut().len();
        if never_ran > 0 {
            tracing::warn!(
                never_ran,
                "thread context dropped with spawned coroutines no executor ran"
            );
        }
        // This thread's rings and buffers are deregistered below; wait (up to 1 s) until
        // its lists on the shared QPs have completed, so no NIC still reads them.
        let until = Instant::now() + Duration::from_secs(1);
        while Instant::now() < until {
            let busy = {
                let inner = self.inner.borrow();
                inner.conns.iter().any(|c| {
                    c.broken.is_none()
                        && (c.os_lists > 0 || c.rpc.as_ref().is_some_and(|r| r.lists > 0))
                })
            };
            if !busy {
                break;
            }
            self.progress();
        }
        let timeout = self.cfg.connect_timeout.min(Duration::from_secs(1));
        let inner = self.inner.get_mut();
        for c in &inner.conns {
            // Best effort: tell the server this thread's Rockets are gone, so it stops
            // polling them (a server that is gone has nothing to close).
            if let (Some(chan), None) = (&c.rpc, &c.broken) {
                let addr = c.straw.addr();
                if let Ok(mut b) = crate::bootstrap::BootstrapClient::connect(addr, timeout) {
                    let _ = b.call_typed::<_, serde_json::Value>(&CtrlRequest::CloseRocket {
                        rocket: chan.rocket,
                    });
                }
            }
            if let Some(q) = &c.os_qp {
                crate::straw::unbind(q);
            }
            if let Some(q) = c.rpc.as_ref().and_then(|r| r.qp.as_ref()) {
                crate::straw::unbind(q);
            }
            for &k in &c.attached {
                c.straw.detach(k);
            }
        }
    }
}

/// One direction of a Rocket pair, ready to flush: its sealed buckets and a credit to
/// return.
pub(crate) struct RocketOut<'a> {
    /// Sealed buckets to post (replays first).
    pub spans: &'a mut VecDeque<BucketSpan>,
    /// Buckets the receiver has consumed: a replayed bucket below needs no WRITE.
    pub consumed: u64,
    /// The sender's staging copy of the ring.
    pub staging: &'a MemoryRegion,
    /// The receiver's ring.
    pub ring: &'a MrDesc,
    /// Credit (buckets consumed of the other direction's ring) to return, if due.
    pub credit: Option<u64>,
    /// Word 1 of this is the source of the credit WRITE.
    pub words: &'a MemoryRegion,
    /// Where the peer reads credits.
    pub credit_to: RemoteAddr,
}

/// Append a Rocket's bucket WRITEs and credit WRITE to `wrs`, calling `item` with each
/// bucket (and `None` for the credit) in the same order, so the caller can record what
/// each posted list carried. Shared by the runtime and the server.
pub(crate) fn rocket_wrs(
    out: RocketOut<'_>,
    wrs: &mut Vec<SendWr>,
    mut item: impl FnMut(Option<BucketSpan>),
) {
    for s in out.spans.drain(..) {
        // A replayed bucket the receiver has already consumed needs no WRITE.
        if s.seq < out.consumed {
            continue;
        }
        wrs.push(SendWr {
            wr_id: 0,
            opcode: WrOpcode::Write,
            sge: out.staging.sge(s.offset, s.len),
            remote: out.ring.at(s.offset as u64),
            signaled: false,
            inline: false,
        });
        item(Some(s));
    }
    if let Some(c) = out.credit {
        out.words.store_u64(8, c);
        wrs.push(SendWr {
            wr_id: 0,
            opcode: WrOpcode::Write,
            sge: out.words.sge(8, 8),
            remote: out.credit_to,
            signaled: false,
            inline: true,
        });
        item(None);
    }
}

fn alloc_rec(recs: &mut Vec<Option<Rec>>, free: &mut Vec<usize>) -> usize {
    match free.pop() {
        Some(t) => t,
        None => {
            recs.push(None);
            recs.len() - 1
        }
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
        if let Some(c) = slot.chunk.take() {
            inner.arena.free(c);
        }
        slot.state = OpState::Free;
        slot.abandoned = false;
        inner.free_ops.push(id);
    } else if matches!(slot.state, OpState::Waiting) {
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
                if let Some(c) = slot.chunk.take() {
                    inner.arena.free(c);
                }
                slot.state = OpState::Free;
                inner.free_ops.push(self.id);
            }
            _ => {}
        }
    }
}

struct CallWait<'a> {
    ctx: &'a ThreadCtx,
    polls: u32,
    id: u64,
    node: u32,
    handler: u16,
    deadline: Instant,
    after: Duration,
}

impl Future for CallWait<'_> {
    type Output = Result<(Reply, Option<Chunk>), RpcError>;
    fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        self.polls = self.polls.wrapping_add(1);
        let mut inner = self.ctx.inner.borrow_mut();
        if let Some(r) = inner.calls.get_mut(&self.id).and_then(|s| s.result.take()) {
            // The slot goes; a zero-copy buffer goes to the caller, which copies out.
            let chunk = inner.calls.remove(&self.id).and_then(|s| s.chunk);
            return Poll::Ready(Ok((r, chunk)));
        }
        // The clock is read every 16th poll: a deadline is late by at most 16 rounds.
        if self.polls.is_multiple_of(16) && Instant::now() >= self.deadline {
            return Poll::Ready(Err(RpcError::Timeout {
                node: self.node,
                handler: self.handler,
                after: self.after,
            }));
        }
        Poll::Pending
    }
}

impl Drop for CallWait<'_> {
    fn drop(&mut self) {
        let mut inner = self.ctx.inner.borrow_mut();
        let inner = &mut *inner;
        if let Some(slot) = inner.calls.remove(&self.id) {
            if let Some(c) = slot.chunk {
                // The server may still WRITE into it: hold it until its reply comes.
                inner
                    .zombies
                    .insert(self.id, (c, Instant::now() + ZOMBIE_GRACE));
            }
        }
    }
}

/// A process's RPC runtime: straws (QP pools) shared by the threads it starts.
///
/// ```no_run
/// use rrpc::runtime::{Runtime, RuntimeConfig};
/// # fn f(fabric: rrpc::fabric::Fabric, server: std::net::SocketAddr) -> Result<(), rrpc::runtime::RpcError> {
/// let rt = Runtime::new(fabric, RuntimeConfig::default());
/// // 2 threads x 8 coroutines, each calling handler 1 on the server.
/// rt.run(2, 8, move |ctx, _thread| {
///     let node = ctx.connect_rpc(server)?.node;
///     Ok(move |ctx: std::rc::Rc<rrpc::runtime::ThreadCtx>, _coroutine| async move {
///         let reply = ctx.call(node, 1, b"ping").await;
///         assert!(reply.is_ok());
///     })
/// })?;
/// # Ok(()) }
/// ```
pub struct Runtime {
    straws: Arc<Straws>,
    cfg: RuntimeConfig,
}

impl Runtime {
    /// A runtime on `fabric`; threads created through it share QPs per remote node.
    pub fn new(fabric: Fabric, cfg: RuntimeConfig) -> Self {
        Self {
            straws: Straws::new(fabric, cfg.straw_config()),
            cfg,
        }
    }

    /// The shared straws.
    pub fn straws(&self) -> &Arc<Straws> {
        &self.straws
    }

    /// A [`ThreadCtx`] for the calling thread, sharing this runtime's straws.
    pub fn thread_ctx(&self) -> Result<Rc<ThreadCtx>, RpcError> {
        ThreadCtx::with_straws(self.straws.clone(), self.cfg.clone())
    }

    /// Run `threads` OS threads with `coroutines` coroutines each and wait for all of
    /// them. On each thread `setup(ctx, thread)` runs first (connect here) and returns the
    /// coroutine body, called as `body(ctx, coroutine)` for each coroutine. Errors: the
    /// first setup error, or a thread that panicked.
    pub fn run<S, B, F>(&self, threads: usize, coroutines: usize, setup: S) -> Result<(), RpcError>
    where
        S: Fn(&Rc<ThreadCtx>, usize) -> Result<B, RpcError> + Send + Sync,
        B: Fn(Rc<ThreadCtx>, usize) -> F,
        F: Future<Output = ()> + 'static,
    {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads.max(1))
                .map(|t| {
                    let setup = &setup;
                    s.spawn(move || -> Result<(), RpcError> {
                        let ctx = self.thread_ctx()?;
                        let body = setup(&ctx, t)?;
                        let mut ex = Executor::new(ctx.clone());
                        for c in 0..coroutines.max(1) {
                            ex.spawn(body(ctx.clone(), c));
                        }
                        ex.run();
                        Ok(())
                    })
                })
                .collect();
            let mut first = Ok(());
            for h in handles {
                let r = h
                    .join()
                    .unwrap_or_else(|_| Err(RpcError::Connect("runtime thread panicked".into())));
                if first.is_ok() {
                    first = r;
                }
            }
            first
        })
    }
}

/// Runs a thread's coroutines to completion over its [`ThreadCtx`].
pub struct Executor {
    ctx: Rc<ThreadCtx>,
    tasks: Vec<Option<Task>>,
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
    /// after each pass, until every coroutine has finished, including those spawned
    /// meanwhile through [`ThreadCtx::spawn`].
    pub fn run(&mut self) {
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut live = self.tasks.iter().filter(|t| t.is_some()).count();
        let mut idle = 0u32;
        loop {
            for slot in self.tasks.iter_mut() {
                if let Some(t) = slot {
                    if t.as_mut().poll(&mut cx).is_ready() {
                        *slot = None;
                        live -= 1;
                    }
                }
            }
            let spawned = self.ctx.take_spawned();
            if !spawned.is_empty() {
                live += spawned.len();
                self.tasks.retain(Option::is_some);
                self.tasks.extend(spawned.into_iter().map(Some));
            }
            if live == 0 {
                break;
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

/// Run one coroutine on `ctx` to completion and return its output (setup code, tests,
/// simple clients).
pub fn block_on<T: 'static>(ctx: &Rc<ThreadCtx>, f: impl Future<Output = T> + 'static) -> T {
    let out = Rc::new(RefCell::new(None));
    let o = out.clone();
    let mut ex = Executor::new(ctx.clone());
    ex.spawn(async move {
        *o.borrow_mut() = Some(f.await);
    });
    ex.run();
    let v = out
        .borrow_mut()
        .take()
        .expect("the coroutine ran to completion");
    v
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
