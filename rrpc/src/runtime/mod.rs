//! The per-thread runtime: a waker-driven executor ([`crate::exec`]) running many
//! coroutines (async tasks, one transaction coordinator each) over one [`ThreadCtx`],
//! and [`Runtime`], which starts T such threads x C coroutines sharing one process-wide
//! set of QP pools ([`crate::straw`]).
//!
//! Coroutines issue one-sided operations ([`ThreadCtx::read`], [`ThreadCtx::write`],
//! [`ThreadCtx::cas`], [`ThreadCtx::faa`]) and RPC calls ([`ThreadCtx::call`],
//! [`ThreadCtx::call_with`]). Nothing is posted when they are issued: once the round's
//! ready coroutines have run, the executor calls [`ThreadCtx::progress`], which posts,
//! per remote node, the round's one-sided WRs as one list on a one-sided QP and the
//! round's Rocket buckets plus credit return as one list on an RPC QP, each with one
//! doorbell and only its last WR signaled (selective signaling; an RC QP completes in
//! order). It then polls the QPs and the response Rockets and wakes the coroutines whose
//! operations finished. This is the coroutine model of FaRM/FORD and Scythe's RRPC
//! (Scythe, 4.4 Fig. 16 and 4.6).
//!
//! Replies travel in one of Scythe's three modes (4.6 (2), Fig. 20), chosen per call
//! ([`ReplyMode`]): pure RPC, RPC + one-sided READ, or RPC zero-copy; [`ReplyMode::Auto`]
//! picks by size around [`RuntimeConfig::mode_threshold`] (512 B). A request larger than
//! a bucket travels by reference: the server READs it from the caller's registered
//! buffer (the mirror of RPC + READ).
//!
//! Inside: [`config`] (settings, per-call options, counters), `call` (one call's steps:
//! plan, credit, buffers, request, reply checks), `calls` (the call table, a state
//! machine taking the time as an argument), `credit` (the first-come, first-served
//! queue of calls waiting for ring credit), `onesided` (op slots), the per-node
//! connection state and the polling round in this file. A [`ThreadCtx`] is
//! single-threaded by construction (`Rc`, `RefCell`): one per OS thread. Control-plane
//! work (reconnecting a failed QP) runs on the straws' control thread; a runtime
//! thread never blocks on TCP after connecting.

mod call;
mod calls;
pub mod config;
mod credit;
mod error;
mod onesided;
mod regbuf;

use crate::NodeId;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

pub use futures::future::{join, join_all};

use self::calls::{CallTable, Late, Reply};
pub use self::config::{CallOpts, OpCounts, RuntimeConfig, Stats};
use self::credit::TicketQueue;
pub use self::error::{CallError, ConnectError, GoneReason, OneSidedError, RpcError};
use self::onesided::OpTable;
pub use self::onesided::OpTiming;
use self::regbuf::LocalBuf;
pub use self::regbuf::RegBuf;
use crate::arena::{Arena, Chunk};
use crate::channel::{post_items, Channel, Item, Lists};
use crate::ctrl::{node_info, CtrlRequest, NodeInfo, QpKind, RocketOffer, RpcAccept};
use crate::exec;
use crate::fabric::{Fabric, RemoteAccess, RemoteAddr, SendWr, WcStatus, WrOpcode};
use crate::rocket::{decode_batch, MsgHeader};
use crate::straw::{Mailbox, SharedQp, Straw, Straws};
use crate::wire::MsgKind;
pub use crate::wire::ReplyMode;

/// The RPC half of a connection: this thread's Rocket pair with the node.
struct RpcChan {
    chan: Channel,
    /// Control messages to send next round: READ-mode buffers to release, calls to
    /// cancel.
    control: Vec<(MsgKind, u64)>,
    /// The server's id of this Rocket pair (to close it).
    rocket: u64,
    /// Calls waiting for ring credit, served first come, first served: a call that
    /// finds the ring full, or others already waiting, takes the next ticket and pushes
    /// only when its ticket is the head. Without it, calls woken by their replies
    /// (which run first in a round) refill the ring each round and a waiting call can
    /// starve past its deadline.
    credit_q: TicketQueue,
}

/// This thread's state towards one node.
struct Conn {
    node: NodeId,
    straw: Arc<Straw>,
    /// One-sided WRs not yet posted, and the op each belongs to.
    os_pending: Vec<SendWr>,
    os_ops: Vec<usize>,
    /// Per pending WR: it and the next one must be posted in the same list
    /// ([`ThreadCtx::write_ordered`]).
    os_glue: Vec<bool>,
    os_qp: Option<Arc<SharedQp>>,
    os_lists: usize,
    rpc: Option<RpcChan>,
    attached: Vec<QpKind>,
    broken: Option<GoneReason>,
    /// Replaced by a newer connection to the same node id ([`ThreadCtx::reconnect`]):
    /// kept only so that lists still naming its index complete; its calls were failed
    /// when it was retired (calls are keyed by node id, which now names the successor).
    retired: bool,
}

/// What one posted list carried, to finish or replay it when its completion arrives.
enum Rec {
    OneSided { conn: usize, ops: Vec<usize> },
    Rocket { conn: usize, items: Vec<Item> },
}

struct Inner {
    conns: Vec<Conn>,
    by_node: HashMap<NodeId, usize, crate::wire::IdHash>,
    ops: OpTable,
    arena: Arena,
    calls: CallTable,
    stats: Stats,
    /// One-sided work requests posted, per target node.
    op_counts: std::collections::HashMap<NodeId, OpCounts>,
    lists: Lists<Rec>,
    wrs: Vec<SendWr>,
    items: Vec<Item>,
    batch: Vec<u8>,
    done: Vec<crate::straw::ListDone>,
    cancels: Vec<(NodeId, u64)>,
    /// Coroutines waiting for room (a free buffer, ring credit): woken after a round
    /// with work.
    stalled: Vec<Waker>,
    rounds: u64,
    /// Emptied op lists of finished records, reused (no allocation per list).
    vec_pool: Vec<Vec<usize>>,
}

impl Inner {
    /// Fail every call to `node` with [`CallError::PeerGone`] (`why`) and free the
    /// buffers the calls held that no server can touch any more.
    fn fail_calls(&mut self, node: NodeId, why: &GoneReason) {
        self.calls.fail_node(node, |_| CallError::PeerGone {
            node,
            why: why.clone(),
        });
    }
}

/// One thread's connections, buffers and in-flight work, and its executor's handle.
/// Shared by the thread's coroutines through `Rc`.
pub struct ThreadCtx {
    straws: Arc<Straws>,
    cfg: RuntimeConfig,
    exec: exec::Handle,
    mailbox: Arc<Mailbox>,
    inner: RefCell<Inner>,
    /// The index of the node's RPC server thread this context runs on, if it does.
    server_thread: Cell<Option<usize>>,
    /// The server thread this context's Rocket offers ask for
    /// ([`ThreadCtx::ask_server_thread`]).
    peer_server_thread: Cell<Option<u32>>,
}

thread_local! {
    static CURRENT: RefCell<Option<Weak<ThreadCtx>>> = const { RefCell::new(None) };
}

/// Restores the previous current context when dropped ([`ThreadCtx::enter`]).
pub struct EnterGuard {
    prev: Option<Weak<ThreadCtx>>,
}

impl Drop for EnterGuard {
    fn drop(&mut self) {
        let prev = self.prev.take();
        CURRENT.with(|c| *c.borrow_mut() = prev);
    }
}

impl ThreadCtx {
    /// A context on `fabric` with its own straws (QPs not shared with other threads).
    /// Use [`Runtime`] to share QP pools among threads. Errors: the config does not
    /// validate; the thread's buffer cannot be registered.
    pub fn new(fabric: Fabric, cfg: RuntimeConfig) -> Result<Rc<Self>, ConnectError> {
        let straws = Straws::new(fabric, cfg.straw_config());
        Self::with_straws(straws, cfg)
    }

    /// A context whose QPs come from the process-wide `straws`, with an executor handle
    /// of its own.
    pub fn with_straws(straws: Arc<Straws>, cfg: RuntimeConfig) -> Result<Rc<Self>, ConnectError> {
        Self::with_handle(straws, cfg, exec::Handle::new())
    }

    /// A context whose coroutines run on the executor of `handle` (a server thread
    /// shares its executor between its handlers and this context).
    pub fn with_handle(
        straws: Arc<Straws>,
        cfg: RuntimeConfig,
        handle: exec::Handle,
    ) -> Result<Rc<Self>, ConnectError> {
        cfg.validate()?;
        // Servers READ requests sent by reference and WRITE zero-copy replies here; no
        // atomics.
        let arena = Arena::new_with(
            straws.fabric(),
            cfg.buffer_bytes,
            cfg.max_transfer + 16,
            RemoteAccess::READ | RemoteAccess::WRITE,
        )?;
        Ok(Rc::new(Self {
            straws,
            cfg,
            exec: handle,
            mailbox: Mailbox::new(),
            server_thread: Cell::new(None),
            peer_server_thread: Cell::new(None),
            inner: RefCell::new(Inner {
                conns: Vec::new(),
                by_node: HashMap::default(),
                ops: OpTable::default(),
                arena,
                calls: CallTable::default(),
                stats: Stats::default(),
                op_counts: Default::default(),
                lists: Lists::default(),
                wrs: Vec::new(),
                items: Vec::new(),
                batch: Vec::new(),
                done: Vec::new(),
                cancels: Vec::new(),
                stalled: Vec::new(),
                rounds: 0,
                vec_pool: Vec::new(),
            }),
        }))
    }

    /// The context of the coroutine running now on this thread: set while an
    /// [`Executor`] of this module runs and on the server threads of a
    /// [`crate::node::Node`], whose async handlers use it to make calls and one-sided
    /// operations. `None` elsewhere.
    pub fn current() -> Option<Rc<ThreadCtx>> {
        CURRENT.with(|c| c.borrow().as_ref().and_then(Weak::upgrade))
    }

    /// Make `self` this thread's [`ThreadCtx::current`] until the guard drops.
    pub fn enter(self: &Rc<Self>) -> EnterGuard {
        let prev = CURRENT.with(|c| c.borrow_mut().replace(Rc::downgrade(self)));
        EnterGuard { prev }
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

    /// The executor handle this context's coroutines run on.
    pub fn exec(&self) -> &exec::Handle {
        &self.exec
    }

    /// Counters so far.
    pub fn stats(&self) -> Stats {
        self.inner.borrow().stats
    }

    /// The one-sided work requests this thread posted to `node` so far, by kind
    /// (RPCs not included).
    pub fn op_counts(&self, node: NodeId) -> OpCounts {
        self.inner
            .borrow()
            .op_counts
            .get(&node)
            .copied()
            .unwrap_or_default()
    }

    /// Calls in flight, and buffers held for abandoned calls the server may still touch.
    pub fn calls_in_flight(&self) -> (usize, usize) {
        let inner = self.inner.borrow();
        (inner.calls.len(), inner.calls.zombies())
    }

    /// Attach to the straw of the node at `addr` for one-sided operations. Returns the
    /// node's [`NodeInfo`]. Blocking (control plane); call before running coroutines.
    /// Errors: the node's control plane is unreachable or refuses; QPs cannot be
    /// created.
    pub fn connect(&self, addr: SocketAddr) -> Result<NodeInfo, ConnectError> {
        let info = node_info(addr, self.cfg.connect_timeout)
            .map_err(|source| ConnectError::Control { addr, source })?;
        self.attach(&info, addr, QpKind::OneSided)?;
        Ok(info)
    }

    /// Ask every node this context opens a Rocket pair with from now on to serve it on
    /// its server thread `thread` (modulo its server threads); `None`: the server's
    /// round robin (the default). Pairs opened before keep their thread. A node whose
    /// coordinator threads are its RPC server threads pairs them across nodes so, its
    /// i-th coordinator with every peer's i-th ([`ThreadCtx::server_thread`]; Lotus 4.1:
    /// "the i-th coordinator in one CN only sends RPCs to the i-th coordinator in another
    /// CN").
    pub fn ask_server_thread(&self, thread: Option<u32>) {
        self.peer_server_thread.set(thread);
    }

    /// The index (from 0) of the node's RPC server thread this context runs on, or
    /// `None` for a context of its own thread.
    pub fn server_thread(&self) -> Option<usize> {
        self.server_thread.get()
    }

    pub(crate) fn set_server_thread(&self, thread: usize) {
        self.server_thread.set(Some(thread));
    }

    /// Attach for one-sided operations and RPC: also opens this thread's Rocket pair (a
    /// request ring at the node, a response ring here). Errors as
    /// [`ThreadCtx::connect`], and a node that serves no RPCs or refuses the geometry.
    pub fn connect_rpc(&self, addr: SocketAddr) -> Result<NodeInfo, ConnectError> {
        let info = node_info(addr, self.cfg.connect_timeout)
            .map_err(|source| ConnectError::Control { addr, source })?;
        let ci = self.attach(&info, addr, QpKind::OneSided)?;
        if self.inner.borrow().conns[ci].rpc.is_some() {
            return Ok(info);
        }
        self.attach(&info, addr, QpKind::Rpc)?;
        let geometry = self.cfg.rocket;
        let fabric = self.straws.fabric();
        // The server only WRITEs responses and credits here; the staging ring is a
        // local source of WRITEs. No peer may READ either (on verbs).
        let staging = fabric.alloc_mr_with(geometry.ring_bytes(), RemoteAccess::NONE)?;
        let resp_ring = fabric.alloc_mr_with(geometry.ring_bytes(), RemoteAccess::WRITE)?;
        let words = fabric.alloc_mr_with(16, RemoteAccess::WRITE)?;
        let control = |source| ConnectError::Control { addr, source };
        // The Rocket pair's node id must be the one this connection proves (with a
        // cluster secret; see `crate::auth`).
        let auth = crate::bootstrap::ClientAuth::process(crate::auth::Identity::new(
            Some(fabric.node().get()),
            "runtime",
        ))
        .map_err(|e| control(e.into()))?;
        let mut c =
            crate::bootstrap::BootstrapClient::connect_with(addr, self.cfg.connect_timeout, &auth)
                .map_err(|e| control(e.into()))?;
        let accept: RpcAccept = c
            .call_typed(&CtrlRequest::ConnectRocket(RocketOffer {
                node: fabric.node(),
                incarnation: fabric.incarnation(),
                straw: self.straws.id(),
                geometry,
                batching: self.cfg.batching,
                mode_threshold: self.cfg.mode_threshold,
                resp_ring: resp_ring.desc(),
                req_credit: words.desc().at(0),
                server_thread: self.peer_server_thread.get(),
            }))
            .map_err(|e| control(e.into()))?;
        let chan = Channel::new(
            geometry,
            self.cfg.batching,
            staging,
            resp_ring,
            words,
            accept.req_ring,
            accept.resp_credit,
        )?;
        self.inner.borrow_mut().conns[ci].rpc = Some(RpcChan {
            chan,
            control: Vec::new(),
            rocket: accept.rocket,
            credit_q: TicketQueue::default(),
        });
        Ok(info)
    }

    /// Attach again, for one-sided operations, to the node now at `addr`: for a node that
    /// restarted (a new process under the same node id, possibly at a new address) or
    /// whose connection failed. Fetches the node's current [`NodeInfo`] (its exports may
    /// have changed: a restarted node registers new memory). If this thread's connection
    /// to that node id is broken (its pool found the node unreachable), it is retired and
    /// a new one is made over a fresh straw; its pending calls fail with
    /// [`CallError::PeerGone`]. A healthy connection is kept (a failed QP alone is
    /// repaired by its pool). Blocking (control plane, bounded by
    /// [`RuntimeConfig::connect_timeout`]). Errors as [`ThreadCtx::connect`].
    pub fn reconnect(&self, addr: SocketAddr) -> Result<NodeInfo, ConnectError> {
        let info = node_info(addr, self.cfg.connect_timeout)
            .map_err(|source| ConnectError::Control { addr, source })?;
        {
            let mut inner = self.inner.borrow_mut();
            let inner = &mut *inner;
            if let Some(&ci) = inner.by_node.get(&info.node) {
                let c = &mut inner.conns[ci];
                if c.broken.is_none() {
                    if let Some(e) = c.straw.dead() {
                        c.broken = Some(GoneReason::Reconnect(e));
                    }
                }
                if let Some(why) = c.broken.clone() {
                    c.retired = true;
                    inner.fail_calls(info.node, &why);
                    inner.by_node.remove(&info.node);
                }
            }
        }
        // A dead straw is replaced by `Straws::straw`.
        self.attach(&info, addr, QpKind::OneSided)?;
        Ok(info)
    }

    /// If this thread's connection to `node` failed because its pool found the node
    /// dead, and the node answers on its control plane again (a restarted process under
    /// the same id and address, seen by a probe off this thread: [`Straw::revived`]),
    /// connect anew as [`ThreadCtx::reconnect`] does (and open a Rocket pair again if the
    /// old connection had one). Blocks for that connection setup only once the node is
    /// back; otherwise costs an atomic load or two. Called as each call and one-sided op
    /// starts, so a node that comes back is reached on the next call instead of failing
    /// forever.
    fn revive(&self, node: NodeId) {
        let (addr, had_rpc) = {
            let inner = self.inner.borrow();
            let Some(&ci) = inner.by_node.get(&node) else {
                return;
            };
            let c = &inner.conns[ci];
            if c.straw.dead().is_none() || !c.straw.revived() {
                return;
            }
            (c.straw.addr(), c.rpc.is_some())
        };
        let r = self.reconnect(addr).and_then(|info| {
            if had_rpc && info.node == node {
                self.connect_rpc(addr)?;
            }
            Ok(info)
        });
        match r {
            Ok(_) => tracing::info!(%node, "reconnected to a node that came back"),
            Err(e) => tracing::debug!(%node, error = %e, "node came back; reconnecting failed"),
        }
    }

    /// Attach this thread to the straw of `info.node` for `kind`; returns the conn index.
    fn attach(
        &self,
        info: &NodeInfo,
        addr: SocketAddr,
        kind: QpKind,
    ) -> Result<usize, ConnectError> {
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
                    os_glue: Vec::new(),
                    os_qp: None,
                    os_lists: 0,
                    rpc: None,
                    attached: Vec::new(),
                    broken: None,
                    retired: false,
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

    /// RDMA READ of `len` bytes at `remote` on `node`. Errors:
    /// [`OneSidedError::TooLarge`] past [`RuntimeConfig::max_transfer`],
    /// [`OneSidedError::Completion`], [`OneSidedError::PeerGone`],
    /// [`OneSidedError::NotConnected`].
    pub async fn read(
        &self,
        node: NodeId,
        remote: RemoteAddr,
        len: usize,
    ) -> Result<Vec<u8>, OneSidedError> {
        self.one_sided(node, WrOpcode::Read, remote, len, None)
            .await
    }

    /// [`ThreadCtx::read`], also returning when its WR was posted and when this thread
    /// took its completion ([`OpTiming::network`]: the round trip without the time the
    /// calling coroutine waited to run). Errors as [`ThreadCtx::read`].
    pub async fn read_timed(
        &self,
        node: NodeId,
        remote: RemoteAddr,
        len: usize,
    ) -> Result<(Vec<u8>, OpTiming), OneSidedError> {
        let mut timing = None;
        let out = self
            .one_sided_timed(
                node,
                WrOpcode::Read,
                remote,
                len,
                None,
                self.cfg.max_transfer,
                Some(&mut timing),
            )
            .await?;
        let now = Instant::now();
        Ok((
            out,
            timing.unwrap_or(OpTiming {
                posted: now,
                completed: now,
            }),
        ))
    }

    /// RDMA WRITE of `data` to `remote` on `node`. Completes when the data is written.
    /// Errors as [`ThreadCtx::read`].
    pub async fn write(
        &self,
        node: NodeId,
        remote: RemoteAddr,
        data: &[u8],
    ) -> Result<(), OneSidedError> {
        // No copy of the bytes comes back: the op's buffer returns to the arena as it is
        // dropped.
        let max = self.cfg.max_transfer;
        let local = LocalBuf::Alloc(Some(data));
        let (r, _buf) = self
            .one_sided_op(node, WrOpcode::Write, remote, data.len(), local, max, None)
            .await;
        r.map_err(|e| *e)
    }

    /// RDMA WRITEs of `writes` (remote address, data) to `node`, in order, as one list on
    /// one QP, awaited as one operation: RC lands them in order, so once the last one is
    /// visible at the node every earlier one is (a commit record after its log entries,
    /// a flag after its payload). On shm they execute in order, each publishing its last
    /// 8 bytes with release ordering. If one fails the QP stops there: no later WRITE of
    /// the list lands after a failed one (earlier ones may have). Resolves when all
    /// have completed. Errors: [`OneSidedError::TooLarge`] when the total exceeds
    /// [`RuntimeConfig::max_transfer`] or the list is longer than
    /// [`RuntimeConfig::sq_depth`] WRs (nothing sent); otherwise as
    /// [`ThreadCtx::write`], the first error of the list.
    pub async fn write_ordered(
        &self,
        node: NodeId,
        writes: &[(RemoteAddr, &[u8])],
    ) -> Result<(), OneSidedError> {
        // Counted in buffer chunks (powers of two), which must all be held at once.
        let total: usize = writes
            .iter()
            .map(|(_, d)| d.len().max(crate::arena::MIN_CHUNK).next_power_of_two())
            .sum();
        let max = self.cfg.max_transfer;
        if total > max {
            return Err(OneSidedError::TooLarge { len: total, max });
        }
        if writes.len() > self.cfg.sq_depth {
            return Err(OneSidedError::TooLarge {
                len: writes.len(),
                max: self.cfg.sq_depth,
            });
        }
        if writes.is_empty() {
            return Ok(());
        }
        self.revive(node);
        let ids = std::future::poll_fn(|cx| {
            let mut inner = self.inner.borrow_mut();
            let inner = &mut *inner;
            let Some(&ci) = inner.by_node.get(&node) else {
                return Poll::Ready(Err(OneSidedError::NotConnected { node }));
            };
            if let Some(why) = &inner.conns[ci].broken {
                return Poll::Ready(Err(OneSidedError::PeerGone {
                    node,
                    why: why.clone(),
                }));
            }
            // All buffers or none (dropping the ones taken frees them).
            let mut chunks = Vec::with_capacity(writes.len());
            for (_, d) in writes {
                match inner.arena.alloc(d.len().max(1)) {
                    Some(c) => chunks.push(c),
                    None => {
                        inner.stalled.push(cx.waker().clone());
                        return Poll::Pending;
                    }
                }
            }
            let mut ids = Vec::with_capacity(writes.len());
            for (i, ((remote, d), chunk)) in writes.iter().zip(chunks).enumerate() {
                inner.arena.mr().write(chunk.off(), d);
                let wr = SendWr {
                    wr_id: 0,
                    opcode: WrOpcode::Write,
                    sge: inner.arena.mr().sge(chunk.off(), d.len()),
                    remote: *remote,
                    signaled: false,
                    inline: false,
                };
                let id = inner.ops.open(chunk, d.len(), false);
                inner.stats.bytes += d.len() as u64;
                inner.op_counts.entry(node).or_default().writes += 1;
                let conn = &mut inner.conns[ci];
                conn.os_pending.push(wr);
                conn.os_ops.push(id);
                conn.os_glue.push(i + 1 < writes.len());
                ids.push(id);
            }
            Poll::Ready(Ok(ids))
        })
        .await?;
        // Ops not awaited yet are released if this future is dropped.
        let mut rest = OpsLeft {
            ctx: self,
            ids: ids.into(),
        };
        let mut first_err = None;
        while let Some(id) = rest.ids.pop_front() {
            let r = OpWait {
                ctx: self,
                id,
                done: false,
            }
            .await;
            self.inner.borrow_mut().ops.finish(id);
            if let (Err(e), None) = (r, &first_err) {
                first_err = Some(e);
            }
        }
        first_err.map_or(Ok(()), |e| Err(*e))
    }

    /// 8-byte RDMA compare-and-swap at `remote` (8-byte aligned); returns the old value.
    /// Errors as [`ThreadCtx::read`].
    pub async fn cas(
        &self,
        node: NodeId,
        remote: RemoteAddr,
        compare: u64,
        swap: u64,
    ) -> Result<u64, OneSidedError> {
        self.atomic(node, WrOpcode::CmpSwap { compare, swap }, remote)
            .await
    }

    /// 8-byte RDMA fetch-and-add at `remote` (8-byte aligned); returns the old value.
    /// Errors as [`ThreadCtx::read`].
    pub async fn faa(
        &self,
        node: NodeId,
        remote: RemoteAddr,
        add: u64,
    ) -> Result<u64, OneSidedError> {
        self.atomic(node, WrOpcode::FetchAdd { add }, remote).await
    }

    async fn atomic(
        &self,
        node: NodeId,
        op: WrOpcode,
        remote: RemoteAddr,
    ) -> Result<u64, OneSidedError> {
        // The old value is read straight out of the op's buffer (no Vec per atomic).
        let max = self.cfg.max_transfer;
        let (r, buf) = self
            .one_sided_op(node, op, remote, 8, LocalBuf::Alloc(None), max, None)
            .await;
        r.map_err(|e| *e)?;
        let (c, _) = buf.expect("a completed op has its buffer");
        let mut old = [0u8; 8];
        self.inner.borrow().arena.mr().read(c.off(), &mut old);
        Ok(u64::from_le_bytes(old))
    }

    /// Queue one one-sided WR and wait for it; returns the local buffer's bytes.
    async fn one_sided(
        &self,
        node: NodeId,
        opcode: WrOpcode,
        remote: RemoteAddr,
        len: usize,
        data: Option<&[u8]>,
    ) -> Result<Vec<u8>, OneSidedError> {
        self.one_sided_up_to(node, opcode, remote, len, data, self.cfg.max_transfer)
            .await
    }

    /// [`ThreadCtx::one_sided`] with a limit of `max` bytes (READ-mode replies add their
    /// 16 bytes of generation words to the largest transfer).
    async fn one_sided_up_to(
        &self,
        node: NodeId,
        opcode: WrOpcode,
        remote: RemoteAddr,
        len: usize,
        data: Option<&[u8]>,
        max: usize,
    ) -> Result<Vec<u8>, OneSidedError> {
        self.one_sided_timed(node, opcode, remote, len, data, max, None)
            .await
    }

    /// [`ThreadCtx::one_sided_up_to`], setting `*timing` when the op completed. Only ops
    /// that ask for their timing read the clock (at their post and their completion).
    #[allow(clippy::too_many_arguments)]
    async fn one_sided_timed(
        &self,
        node: NodeId,
        opcode: WrOpcode,
        remote: RemoteAddr,
        len: usize,
        data: Option<&[u8]>,
        max: usize,
        timing: Option<&mut Option<OpTiming>>,
    ) -> Result<Vec<u8>, OneSidedError> {
        let (r, buf) = self
            .one_sided_op(
                node,
                opcode,
                remote,
                len,
                LocalBuf::Alloc(data),
                max,
                timing,
            )
            .await;
        let out = match buf {
            Some((c, len)) => {
                let mut out = vec![0u8; len];
                if r.is_ok() {
                    self.inner.borrow().arena.mr().read(c.off(), &mut out);
                }
                out
            }
            None => Vec::new(),
        };
        r.map(|()| out).map_err(|e| *e)
    }

    /// Queue one one-sided WR of `len` bytes on `buf` and wait for it. Returns the outcome
    /// and, unless the op was never queued, its local buffer (chunk and length); an op
    /// that cannot be queued fails with its buffer dropped (back to the arena). The error
    /// is boxed (the public ops unbox it) so that every op's outcome fits a register.
    #[allow(clippy::too_many_arguments)]
    async fn one_sided_op(
        &self,
        node: NodeId,
        opcode: WrOpcode,
        remote: RemoteAddr,
        len: usize,
        mut buf: LocalBuf<'_>,
        max: usize,
        timing: Option<&mut Option<OpTiming>>,
    ) -> (Result<(), Box<OneSidedError>>, Option<(Chunk, usize)>) {
        let timed = timing.is_some();
        self.revive(node);
        let queued = std::future::poll_fn(|cx| {
            let mut inner = self.inner.borrow_mut();
            let inner = &mut *inner;
            if len > max {
                return Poll::Ready(Err(Box::new(OneSidedError::TooLarge { len, max })));
            }
            let Some(&ci) = inner.by_node.get(&node) else {
                return Poll::Ready(Err(Box::new(OneSidedError::NotConnected { node })));
            };
            if let Some(why) = &inner.conns[ci].broken {
                return Poll::Ready(Err(Box::new(OneSidedError::PeerGone {
                    node,
                    why: why.clone(),
                })));
            }
            let chunk = match &mut buf {
                LocalBuf::Alloc(data) => {
                    // No local buffer free: wait for in-flight ops to complete.
                    let Some(chunk) = inner.arena.alloc(len) else {
                        inner.stalled.push(cx.waker().clone());
                        return Poll::Pending;
                    };
                    if let Some(d) = data {
                        inner.arena.mr().write(chunk.off(), d);
                    }
                    chunk
                }
                LocalBuf::Given(c) => match c.take() {
                    Some(c) if inner.arena.owns(&c) && c.bytes() >= len => c,
                    _ => return Poll::Ready(Err(Box::new(OneSidedError::ForeignBuffer))),
                },
            };
            let wr = SendWr {
                wr_id: 0,
                opcode,
                sge: inner.arena.mr().sge(chunk.off(), len),
                remote,
                signaled: false,
                inline: false,
            };
            let id = inner.ops.open(chunk, len, timed);
            inner.stats.bytes += len as u64;
            inner.op_counts.entry(node).or_default().count(&opcode);
            let conn = &mut inner.conns[ci];
            conn.os_pending.push(wr);
            conn.os_ops.push(id);
            conn.os_glue.push(false);
            Poll::Ready(Ok(id))
        })
        .await;
        let id = match queued {
            Ok(id) => id,
            Err(e) => return (Err(e), None),
        };
        let r = OpWait {
            ctx: self,
            id,
            done: false,
        }
        .await;
        let mut inner = self.inner.borrow_mut();
        if let Some(t) = timing {
            *t = inner.ops.timing(id);
        }
        (r, inner.ops.finish(id))
    }

    /// Queue a control message (Release, Cancel) to `node` (sent next round).
    fn queue_control(&self, node: NodeId, kind: MsgKind, arg: u64) {
        let mut inner = self.inner.borrow_mut();
        if let Some(&ci) = inner.by_node.get(&node) {
            if let Some(rpc) = inner.conns[ci].rpc.as_mut() {
                rpc.control.push((kind, arg));
            }
        }
    }

    /// A future that is ready once `d` has passed (a timer of this thread's executor).
    pub fn sleep(&self, d: Duration) -> exec::Sleep {
        self.exec.sleep(d)
    }

    /// Run `f` as a coroutine of its own on this thread's executor: for work that must
    /// finish although its owner is gone, such as passing on a lock whose guard was
    /// dropped (drop cannot await). The executor's `run` returns only after spawned
    /// coroutines have finished too. `f` should hold a `Weak` of the context, not an
    /// `Rc`, so that the context can be dropped.
    pub fn spawn(&self, f: impl Future<Output = ()> + 'static) {
        self.exec.spawn(f);
    }

    /// Give other coroutines of this thread one turn.
    pub fn yield_now(&self) -> exec::YieldNow {
        self.exec.yield_now()
    }

    /// Lists of one-sided WRs this thread has posted to `node` whose completions it has
    /// not taken yet (0 when not connected). For fault injection that must hit work in
    /// flight.
    pub fn one_sided_in_flight(&self, node: NodeId) -> usize {
        let inner = self.inner.borrow();
        inner
            .by_node
            .get(&node)
            .map_or(0, |&ci| inner.conns[ci].os_lists)
    }

    /// Inject a transport failure into the QPs of `kind` of this thread's straw to `node`
    /// (they go to the error state and are reconnected on the control thread). For
    /// fault tests and benchmarks. Returns how many QPs. Errors: not connected; the
    /// verbs call failed.
    pub fn inject_qp_error(&self, node: NodeId, kind: QpKind) -> Result<usize, RpcError> {
        let inner = self.inner.borrow();
        let &ci = inner
            .by_node
            .get(&node)
            .ok_or(OneSidedError::NotConnected { node })?;
        let qps = inner.conns[ci].straw.list(kind);
        for q in &qps {
            q.inject_error()?;
        }
        Ok(qps.len())
    }

    /// One polling round's I/O: post every node's pending WRs (one doorbell per QP
    /// used), poll the QPs and the response Rockets, replay what failed, expire calls
    /// past their deadline, notice dead peers, and wake the coroutines whose work
    /// finished. Returns whether anything happened.
    pub fn progress(&self) -> bool {
        let mut inner = self.inner.borrow_mut();
        let inner = &mut *inner;
        inner.rounds += 1;
        let check = inner.rounds.is_multiple_of(64);
        let mut work = false;
        // Completions of this thread's lists, in each QP's order: its own polls put them
        // here directly, and the mailbox (lists other threads' polls completed) after.
        inner.done.clear();
        for ci in 0..inner.conns.len() {
            if inner.conns[ci].broken.is_none() {
                if let Some(e) = inner.conns[ci].straw.dead() {
                    inner.conns[ci].broken = Some(GoneReason::Reconnect(e));
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
                    q.poll_into(&self.mailbox, &mut inner.done);
                }
            }
            if let Some(rpc) = &conn.rpc {
                if let Some(q) = &rpc.chan.qp {
                    if rpc.chan.lists > 0 || (check && !inner.calls.is_empty()) {
                        q.poll_into(&self.mailbox, &mut inner.done);
                        if check && q.is_broken() {
                            conn.straw.request_reconnect(q);
                        }
                    }
                }
            }
        }
        // Completions routed here by whichever other thread polled the QPs.
        self.mailbox.drain(&mut inner.done);
        for i in 0..inner.done.len() {
            work = true;
            let crate::straw::ListDone {
                token,
                status,
                failed_wr,
            } = inner.done[i];
            let Some(rec) = inner.lists.take(token) else {
                inner.stats.unmatched_completions += 1;
                continue;
            };
            if status != WcStatus::Success {
                inner.stats.failed_lists += 1;
            }
            match rec {
                Rec::OneSided { conn, mut ops } => {
                    inner.stats.one_sided_completions += 1;
                    let c = &mut inner.conns[conn];
                    c.os_lists -= 1;
                    let node = c.node;
                    // One op per WR, in list order: the WRs before a failed one
                    // completed, the failed one says why (a remote access error is
                    // not retried as a transport failure), the rest were flushed.
                    for (k, &id) in ops.iter().enumerate() {
                        let r = if status == WcStatus::Success || k < failed_wr {
                            Ok(())
                        } else if k == failed_wr {
                            Err(OneSidedError::Completion { node, status })
                        } else {
                            Err(OneSidedError::Completion {
                                node,
                                status: WcStatus::Flushed,
                            })
                        };
                        inner.ops.complete(id, r);
                    }
                    ops.clear();
                    inner.vec_pool.push(ops);
                }
                Rec::Rocket { conn, mut items } => {
                    if let Some(rpc) = inner.conns[conn].rpc.as_mut() {
                        rpc.chan.lists -= 1;
                        if rpc.chan.list_done(&items) {
                            rpc.credit_q.wake_all();
                        }
                        if status != WcStatus::Success {
                            rpc.chan.failed(items.drain(..));
                        }
                    }
                    items.clear();
                    inner.lists.pool.push(items);
                }
            }
        }
        // Deadlines, on the round's clock; expired calls that hold a buffer the
        // server may touch are cancelled there.
        // (Every 32 rounds: a deadline is late by at most that, microseconds on a busy
        // thread, and a call pays nothing for its deadline.)
        if inner.rounds.is_multiple_of(32) && !inner.calls.is_empty() {
            inner.cancels.clear();
            // Only an expiry is work: a scan that finds nothing leaves the round idle,
            // so a thread waiting for replies still yields its core.
            work |= inner.calls.expire(Instant::now(), &mut inner.cancels) > 0;
            for k in 0..inner.cancels.len() {
                let (node, id) = inner.cancels[k];
                if let Some(&ci) = inner.by_node.get(&node) {
                    if let Some(rpc) = inner.conns[ci].rpc.as_mut() {
                        rpc.control.push((MsgKind::Cancel, id));
                    }
                }
            }
        }
        // Fail everything aimed at unreachable nodes.
        for ci in 0..inner.conns.len() {
            let Some(why) = inner.conns[ci].broken.clone() else {
                continue;
            };
            let node = inner.conns[ci].node;
            let mut ops: Vec<usize> = std::mem::take(&mut inner.conns[ci].os_ops);
            inner.conns[ci].os_pending.clear();
            inner.conns[ci].os_glue.clear();
            for r in inner.lists.iter_mut() {
                if let Rec::OneSided { conn, ops: o } = r {
                    if *conn == ci {
                        ops.append(o);
                    }
                }
            }
            for id in ops {
                let e = OneSidedError::PeerGone {
                    node,
                    why: why.clone(),
                };
                inner.ops.complete(id, Err(e));
            }
            if inner.conns[ci].retired {
                // Its calls were failed at retirement; the node id now names its successor.
                continue;
            }
            inner.fail_calls(node, &why);
        }
        // Coroutines waiting for room look again after any round that freed some
        // (completions free buffers, credit frees buckets); otherwise the thread is
        // idle and its executor may yield the core.
        if work {
            for w in inner.stalled.drain(..) {
                w.wake();
            }
        }
        // Calls started before the next poll read a fresh clock (see `call_with`).
        self.exec.tick();
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
            // A glued run (an ordered WRITE list) goes out whole, as a list of its own;
            // other WRs up to the next run.
            let run = glued_run(&conn.os_glue[posted..]);
            let (end, whole) = if run > 1 {
                (posted + run, true)
            } else {
                let next_run = conn.os_glue[posted..]
                    .iter()
                    .position(|&g| g)
                    .map_or(total, |i| posted + i);
                (
                    posted
                        .saturating_add(per_list)
                        .min(total)
                        .min(next_run.max(posted + 1)),
                    false,
                )
            };
            let token = inner.lists.alloc();
            let n = qp
                .post_list(
                    &mut conn.os_pending[posted..end],
                    &self.mailbox,
                    token as u64,
                    whole,
                )
                .unwrap_or(0);
            if n == 0 {
                inner.lists.unused(token);
                break;
            }
            let mut ops = inner.vec_pool.pop().unwrap_or_default();
            ops.extend_from_slice(&conn.os_ops[posted..posted + n]);
            let mut now = None;
            for &id in &ops {
                inner.ops.posted(id, &mut now);
            }
            inner.lists.set(token, Rec::OneSided { conn: ci, ops });
            inner.stats.doorbells += 1;
            inner.stats.one_sided_lists += 1;
            inner.stats.wrs += n as u64;
            conn.os_lists += 1;
            posted += n;
        }
        if posted > 0 {
            conn.os_pending.drain(..posted);
            conn.os_ops.drain(..posted);
            conn.os_glue.drain(..posted);
        }
        if posted < total {
            inner.stats.sq_full += 1;
        }
    }

    /// A Rocket's round: credits in, control messages out, responses in, then the
    /// round's buckets and credit posted as one list. Returns whether anything happened.
    fn rocket_round(&self, inner: &mut Inner, ci: usize) -> bool {
        let mut work = false;
        let node = inner.conns[ci].node;
        let conn = &mut inner.conns[ci];
        let rpc = conn.rpc.as_mut().expect("rpc");
        // Freed buckets count as work and wake the calls waiting for credit, in order.
        if rpc.chan.take_credit().unwrap_or(false) {
            work = true;
            rpc.credit_q.wake_all();
        }
        while let Some(&(kind, arg)) = rpc.control.last() {
            let hdr = MsgHeader {
                len: 0,
                handler: 0,
                kind: kind as u8,
                flags: 0,
                call_id: arg,
            };
            if rpc.chan.push(hdr, &[&arg.to_le_bytes()]).is_err() {
                break; // ring full: next round
            }
            rpc.control.pop();
        }
        // Responses.
        loop {
            inner.batch.clear();
            match rpc.chan.poll(&mut inner.batch) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    conn.broken = Some(GoneReason::CorruptRing(e));
                    return true;
                }
            }
            work = true;
            for m in decode_batch(&inner.batch) {
                let (h, payload) = match m {
                    Ok(m) => m,
                    Err(e) => {
                        conn.broken = Some(GoneReason::CorruptBatch(e));
                        return true;
                    }
                };
                let Some(reply) = call::decode_reply(node, &h, payload) else {
                    continue;
                };
                match &reply {
                    Reply::Inline(_) => inner.stats.inline_replies += 1,
                    Reply::Read(_) => inner.stats.read_replies += 1,
                    Reply::ZeroCopy(_) => inner.stats.zero_copy_replies += 1,
                    Reply::Failed(_) => {}
                }
                let read = if let Reply::Read(r) = &reply {
                    Some(r.handle)
                } else {
                    None
                };
                match inner.calls.deliver(h.call_id, reply) {
                    Late::Delivered => {}
                    // A reply to a call that ended: free what it held.
                    Late::Free(_held) => {
                        if let Some(handle) = read {
                            rpc.control.push((MsgKind::Release, handle));
                        }
                    }
                }
            }
        }
        if !rpc.chan.has_work() {
            return work;
        }
        let straw = &conn.straw;
        let Some((qp, switched)) = rpc.chan.take_qp(|cur| straw.pick(QpKind::Rpc, cur)) else {
            return work;
        };
        if switched {
            inner.stats.qp_switches += 1;
        }
        inner.items.clear();
        rpc.chan.plan(&mut inner.items);
        if inner.items.is_empty() {
            rpc.chan.qp = Some(qp);
            return work;
        }
        work = true;
        inner.stats.buckets += inner
            .items
            .iter()
            .filter(|i| matches!(i, Item::Span(_)))
            .count() as u64;
        let per_list = if self.cfg.batching.doorbell() {
            usize::MAX
        } else {
            1
        };
        let p = post_items(
            &mut rpc.chan,
            &qp,
            &mut inner.items,
            None,
            per_list,
            &self.mailbox,
            &mut inner.lists,
            &mut inner.wrs,
            |items| Rec::Rocket { conn: ci, items },
        );
        rpc.chan.qp = Some(qp);
        inner.stats.doorbells += p.lists as u64;
        inner.stats.wrs += p.wrs as u64;
        if p.sq_full {
            inner.stats.sq_full += 1;
        }
        work
    }
}

impl Drop for ThreadCtx {
    fn drop(&mut self) {
        // This thread's rings and buffers are deregistered below; wait (up to 1 s) until
        // its lists on the shared QPs have completed, so no NIC still reads them.
        let until = Instant::now() + Duration::from_secs(1);
        while Instant::now() < until {
            let busy = {
                let inner = self.inner.borrow();
                inner.conns.iter().any(|c| {
                    c.broken.is_none()
                        && (c.os_lists > 0 || c.rpc.as_ref().is_some_and(|r| r.chan.lists > 0))
                })
            };
            if !busy {
                break;
            }
            self.progress();
        }
        let inner = self.inner.get_mut();
        for c in &inner.conns {
            // Tell the server this thread's Rockets are gone (on the control thread: a
            // server that is gone has nothing to close).
            if let (Some(rpc), None) = (&c.rpc, &c.broken) {
                c.straw
                    .request(CtrlRequest::CloseRocket { rocket: rpc.rocket });
            }
            if let Some(q) = &c.os_qp {
                crate::straw::unbind(q);
            }
            if let Some(q) = c.rpc.as_ref().and_then(|r| r.chan.qp.as_ref()) {
                crate::straw::unbind(q);
            }
            for &k in &c.attached {
                c.straw.detach(k);
            }
        }
    }
}

struct OpWait<'a> {
    ctx: &'a ThreadCtx,
    id: usize,
    done: bool,
}

impl Future for OpWait<'_> {
    type Output = Result<(), Box<OneSidedError>>;
    // Inlined into the op's future, with the outcome in a register: a one-sided op's
    // result read back through the stack cost a store-forwarding stall per op.
    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let r = self.ctx.inner.borrow_mut().ops.poll(self.id, cx.waker());
        self.done = r.is_ready();
        r
    }
}

impl Drop for OpWait<'_> {
    fn drop(&mut self) {
        if self.done {
            return; // the caller's `finish` frees the slot
        }
        // Dropped before its result was taken: free now, or at completion.
        self.ctx.inner.borrow_mut().ops.finish(self.id);
    }
}

/// One-sided ops a dropped future still held: each is released as an abandoned
/// [`OpWait`] is (freed now, or at its completion).
struct OpsLeft<'a> {
    ctx: &'a ThreadCtx,
    ids: std::collections::VecDeque<usize>,
}

impl Drop for OpsLeft<'_> {
    fn drop(&mut self) {
        let mut inner = self.ctx.inner.borrow_mut();
        for &id in &self.ids {
            inner.ops.finish(id);
        }
    }
}

/// How many WRs from the start of `glue` must be posted together: a run of glued WRs
/// and the one that ends it (1 for a WR not glued to the next).
fn glued_run(glue: &[bool]) -> usize {
    glue.iter().take_while(|&&g| g).count() + 1
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
    pub fn thread_ctx(&self) -> Result<Rc<ThreadCtx>, ConnectError> {
        ThreadCtx::with_straws(self.straws.clone(), self.cfg.clone())
    }

    /// Run `threads` OS threads with `coroutines` coroutines each and wait for all of
    /// them. On each thread `setup(ctx, thread)` runs first (connect here) and returns
    /// the coroutine body, called as `body(ctx, coroutine)` for each coroutine. Errors:
    /// the first setup error, or a thread that panicked.
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
            for (t, h) in handles.into_iter().enumerate() {
                let r = h
                    .join()
                    .unwrap_or_else(|_| Err(ConnectError::Panicked(t).into()));
                if first.is_ok() {
                    first = r;
                }
            }
            first
        })
    }
}

/// Runs a thread's coroutines to completion over its [`ThreadCtx`]: the thread's
/// [`exec::Executor`] with [`ThreadCtx::progress`] as its I/O, and the context as
/// [`ThreadCtx::current`] meanwhile.
pub struct Executor {
    ctx: Rc<ThreadCtx>,
    core: exec::Executor,
}

impl Executor {
    /// An executor for `ctx`'s thread.
    pub fn new(ctx: Rc<ThreadCtx>) -> Self {
        let core = exec::Executor::new(ctx.exec.clone());
        Self { ctx, core }
    }

    /// Add a coroutine.
    pub fn spawn(&mut self, f: impl Future<Output = ()> + 'static) {
        self.core.spawn(f);
    }

    /// Run until every coroutine has finished, including those spawned meanwhile
    /// through [`ThreadCtx::spawn`].
    pub fn run(&mut self) {
        let _g = self.ctx.enter();
        let ctx = self.ctx.clone();
        self.core.run(&mut || ctx.progress());
    }

    /// Executor counters (rounds, task polls, idle rounds).
    pub fn stats(&self) -> exec::ExecStats {
        self.core.stats()
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
