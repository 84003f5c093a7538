//! RPC server threads (Scythe, 4.6, Fig. 19 and 20).
//!
//! Each thread polls the request Rockets assigned to it and answers through response
//! Rockets, each a [`crate::channel`] endpoint, the same one callers use. A thread runs
//! an executor ([`crate::exec`]): plain handlers run inline in its polling round, async
//! handlers run as its coroutines and may await calls and one-sided operations on the
//! thread's runtime (installed by [`crate::node::Node`] through a [`ThreadHook`]), and
//! sorted-batch handlers see the requests of all the server's threads at once, sorted
//! by (key, timestamp) (Scythe 4.4, Fig. 16). The thread's round (see `worker`) has
//! three phases: receive and dispatch; sorted batches; flush, where per Rocket its
//! fetch READs, zero-copy data WRITEs, response buckets and credit return go out as one
//! WR list (one doorbell) on a QP of the requester's straw ([`crate::straw`]).
//!
//! Replies travel in the mode the request asks for ([`ReplyMode`], decided by the pure
//! function [`mode::route`]): inline in the response Rocket; RPC + one-sided READ (the
//! reply is placed in a server buffer framed by its generation and held until the
//! caller releases it or [`ServerConfig::read_hold`] passes); or zero-copy (the reply
//! and its generation are WRITten into the caller's buffer, and the
//! [`MsgKind::ZeroCopyDone`] message follows in the same ordered WR list). A request
//! too large for a bucket is READ from the caller's buffer before its handler runs.
//!
//! [`ReplyMode`]: crate::wire::ReplyMode
//! [`MsgKind::ZeroCopyDone`]: crate::wire::MsgKind::ZeroCopyDone

mod handlers;
pub mod mode;
mod worker;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use self::handlers::{
    ids, AsyncCallerHandler, AsyncHandler, BatchFn, BatchReq, Caller, CallerHandler, DuplicateId,
    Handler, HandlerFuture, Handlers, KeyFn,
};
use self::worker::{Cmd, NewConn, SortedHub, Worker};
use crate::arena::UnusedArena;
use crate::channel::ChannelSetup;
use crate::ctrl::{QpKind, RocketOffer, RpcAccept};
use crate::exec;
use crate::fabric::{Fabric, FabricError, QpEndpoint, RemoteAccess};
use crate::straw::{SharedQp, QP_CQ_DEPTH};
use crate::NodeId;

/// Settings of an [`RpcServer`]. As a TOML table the keys are kebab-case, durations
/// integer milliseconds, and every key may be left out for its default.
///
/// Non-exhaustive: outside rrpc, build one from [`ServerConfig::default`] with the
/// `with_*` setters (or assign fields on a `let mut` binding).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
#[non_exhaustive]
pub struct ServerConfig {
    /// Server threads (default 1, at least 1); Rockets are spread over them round robin.
    pub threads: usize,
    /// Registered buffer bytes per thread for RPC+READ replies, zero-copy WRITEs and
    /// fetched requests (default 64 MiB; untouched pages cost nothing).
    pub buffer_bytes: usize,
    /// Largest reply (READ and zero-copy modes) or fetched request in bytes (default
    /// 4 MiB).
    pub max_reply_bytes: usize,
    /// How long an RPC+READ reply buffer is held for a caller that never releases it
    /// (default 5 s).
    #[serde(rename = "read-hold-ms", with = "crate::ctrl::millis")]
    pub read_hold: Duration,
    /// CPU cores to pin the threads to, round robin (default none: not pinned).
    pub cores: Vec<usize>,
    /// Largest Rocket ring a requester may open, in bytes (default 4 MiB). Each Rocket
    /// pair costs the server a request ring and a staging copy of the response ring.
    pub max_ring_bytes: usize,
    /// Most Rocket pairs one requester process (straw) may hold open at once (default
    /// 1024): one per requester thread.
    pub max_rockets_per_straw: usize,
    /// Longest sleep of an idle server thread, in microseconds (default 0: an idle thread
    /// only yields its core). With a value, a thread idle for more than a few hundred
    /// polling rounds sleeps 1 us, then longer, up to this, so that on a machine with
    /// fewer cores than busy threads it gives its core back and is woken promptly by its
    /// timer ([`crate::exec::Executor::set_idle_sleep`]); a request that arrives while it
    /// sleeps waits at most this long.
    pub idle_sleep_us: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            threads: 1,
            buffer_bytes: 64 << 20,
            max_reply_bytes: 4 << 20,
            read_hold: Duration::from_secs(5),
            cores: Vec::new(),
            max_ring_bytes: 4 << 20,
            max_rockets_per_straw: 1024,
            idle_sleep_us: 0,
        }
    }
}

impl ServerConfig {
    /// Set [`ServerConfig::threads`]: server threads (at least 1).
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }

    /// Set [`ServerConfig::buffer_bytes`]: registered buffer per thread, in bytes.
    pub fn with_buffer_bytes(mut self, buffer_bytes: usize) -> Self {
        self.buffer_bytes = buffer_bytes;
        self
    }

    /// Set [`ServerConfig::max_reply_bytes`]: largest READ-mode or zero-copy reply or
    /// fetched request, in bytes.
    pub fn with_max_reply_bytes(mut self, max_reply_bytes: usize) -> Self {
        self.max_reply_bytes = max_reply_bytes;
        self
    }

    /// Set [`ServerConfig::read_hold`]: how long an unreleased RPC+READ reply buffer is held.
    pub fn with_read_hold(mut self, read_hold: Duration) -> Self {
        self.read_hold = read_hold;
        self
    }

    /// Set [`ServerConfig::cores`]: CPU cores to pin the threads to, round robin (empty:
    /// not pinned).
    pub fn with_cores(mut self, cores: Vec<usize>) -> Self {
        self.cores = cores;
        self
    }

    /// Set [`ServerConfig::max_ring_bytes`]: largest Rocket ring a requester may open, in
    /// bytes.
    pub fn with_max_ring_bytes(mut self, max_ring_bytes: usize) -> Self {
        self.max_ring_bytes = max_ring_bytes;
        self
    }

    /// Set [`ServerConfig::max_rockets_per_straw`]: most Rocket pairs one requester process
    /// may hold open.
    pub fn with_max_rockets_per_straw(mut self, max_rockets_per_straw: usize) -> Self {
        self.max_rockets_per_straw = max_rockets_per_straw;
        self
    }

    /// Set [`ServerConfig::idle_sleep_us`]: longest sleep of an idle server thread, in
    /// microseconds (0: never sleeps).
    pub fn with_idle_sleep_us(mut self, idle_sleep_us: u64) -> Self {
        self.idle_sleep_us = idle_sleep_us;
        self
    }

    /// Check the settings. Errors: [`FabricError::InvalidArgument`] naming the field.
    pub fn validate(&self) -> Result<(), FabricError> {
        let bad = |what: &str| {
            Err(FabricError::InvalidArgument {
                op: "server config",
                what: what.into(),
            })
        };
        if self.threads == 0 {
            return bad("threads must be at least 1");
        }
        if self.max_reply_bytes == 0 || self.max_reply_bytes > u32::MAX as usize {
            return bad("max-reply-bytes must be between 1 byte and 4 GiB");
        }
        if self.buffer_bytes < (self.max_reply_bytes + 16).next_power_of_two() {
            return bad("buffer-bytes must hold one max-reply-bytes chunk (plus 16 bytes, rounded up to a power of two)");
        }
        if self.max_ring_bytes < 128 {
            return bad("max-ring-bytes must be at least 128");
        }
        if self.max_rockets_per_straw == 0 {
            return bad("max-rockets-per-straw must be at least 1");
        }
        Ok(())
    }
}

/// Run on each server thread when it starts, with the thread's index and its executor
/// handle; returns the thread's extra I/O, polled once per round (the node installs a
/// runtime context there, so async handlers can make calls). An `Err` fails the start.
pub type ThreadHook =
    Arc<dyn Fn(usize, &exec::Handle) -> Result<Box<dyn FnMut() -> bool>, String> + Send + Sync>;

/// The server ends of one requester process's RPC QPs.
pub(crate) struct ServerStraw {
    pub(crate) id: u64,
    pub(crate) qps: RwLock<Vec<Arc<SharedQp>>>,
    /// Rocket pairs open over this straw.
    pub(crate) rockets: AtomicUsize,
}

impl ServerStraw {
    pub(crate) fn pick(&self, current: Option<&Arc<SharedQp>>) -> Option<Arc<SharedQp>> {
        let v = self.qps.read().unwrap_or_else(|p| p.into_inner());
        crate::straw::rebind(&v, current)
    }
    fn find(&self, qp_id: u64) -> Option<Arc<SharedQp>> {
        let v = self.qps.read().unwrap_or_else(|p| p.into_inner());
        v.iter().find(|q| q.id() == qp_id).cloned()
    }
}

pub(crate) type StrawMap = Arc<Mutex<HashMap<u64, Arc<ServerStraw>>>>;

/// The RPC server of a node: threads serving Rocket pairs, and the server ends of the
/// requesters' RPC QPs.
pub struct RpcServer {
    fabric: Fabric,
    cfg: ServerConfig,
    workers: Vec<Sender<Cmd>>,
    next: AtomicUsize,
    stop: Arc<AtomicBool>,
    joins: Mutex<Vec<JoinHandle<()>>>,
    straws: StrawMap,
}

/// Send-queue depth of a server QP, in WRs.
const SQ_DEPTH: usize = 1024;

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

    /// Start the server threads `cfg` asks for, without a runtime on them (async
    /// handlers run, but [`crate::runtime::ThreadCtx::current`] is `None` there).
    pub fn with_config(
        fabric: Fabric,
        handlers: Handlers,
        cfg: ServerConfig,
    ) -> Result<Self, FabricError> {
        Self::with_hook(fabric, handlers, cfg, None)
    }

    /// Start the server threads `cfg` asks for, running `hook` on each first. Errors:
    /// the config does not validate, buffers cannot be registered, a thread cannot be
    /// spawned, a hook failed.
    pub fn with_hook(
        fabric: Fabric,
        handlers: Handlers,
        cfg: ServerConfig,
        hook: Option<ThreadHook>,
    ) -> Result<Self, FabricError> {
        cfg.validate()?;
        let stop = Arc::new(AtomicBool::new(false));
        let straws: StrawMap = Arc::new(Mutex::new(HashMap::new()));
        let hub = Arc::new(SortedHub::new(cfg.threads));
        let mut workers = Vec::new();
        let mut joins = Vec::new();
        let (ready_tx, ready_rx) = channel::<Result<(), String>>();
        for i in 0..cfg.threads {
            let (tx, rx) = channel();
            // Registered here (errors reach the caller), started on its thread.
            // Requesters only READ replies sent by reference from here.
            let arena = UnusedArena::new_with(
                &fabric,
                cfg.buffer_bytes,
                cfg.max_reply_bytes + 16,
                RemoteAccess::READ,
            )?;
            let (handlers, max_reply, read_hold, straws, hub) = (
                handlers.clone(),
                cfg.max_reply_bytes,
                cfg.read_hold,
                straws.clone(),
                hub.clone(),
            );
            let s = stop.clone();
            let idle_sleep = Duration::from_micros(cfg.idle_sleep_us);
            let core = (!cfg.cores.is_empty()).then(|| cfg.cores[i % cfg.cores.len()]);
            let hook = hook.clone();
            let ready = ready_tx.clone();
            joins.push(
                std::thread::Builder::new()
                    .name(format!("rpc-server-{i}"))
                    .spawn(move || {
                        if let Some(c) = core {
                            pin_to(c);
                        }
                        let handle = exec::Handle::new();
                        let extra = match hook.map(|h| h(i, &handle)).transpose() {
                            Ok(x) => x,
                            Err(e) => {
                                let _ = ready.send(Err(e));
                                return;
                            }
                        };
                        let _ = ready.send(Ok(()));
                        drop(ready);
                        Worker::new(
                            i,
                            handlers,
                            arena.start(),
                            max_reply,
                            read_hold,
                            straws,
                            hub,
                            rx,
                        )
                        .run(handle, extra, idle_sleep, &s);
                    })
                    .map_err(|e| FabricError::Io {
                        op: "spawn RPC server thread",
                        source: e,
                    })?,
            );
            workers.push(tx);
        }
        drop(ready_tx);
        let server = Self {
            fabric,
            cfg,
            workers,
            next: AtomicUsize::new(0),
            stop,
            joins: Mutex::new(joins),
            straws,
        };
        for _ in 0..server.cfg.threads {
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(what)) => {
                    server.stop();
                    return Err(FabricError::InvalidArgument {
                        op: "server thread start",
                        what,
                    });
                }
                Err(_) => {
                    server.stop();
                    return Err(FabricError::InvalidArgument {
                        op: "server thread start",
                        what: "a server thread exited during start".into(),
                    });
                }
            }
        }
        Ok(server)
    }

    /// The settings.
    pub fn config(&self) -> &ServerConfig {
        &self.cfg
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
                rockets: AtomicUsize::new(0),
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
        // first): forget its straw; a later QP of the same pool starts a new one. Under
        // the map's lock, which `add_qp` holds while adding a QP.
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
    /// geometry or one above [`ServerConfig::max_ring_bytes`], more Rockets than
    /// [`ServerConfig::max_rockets_per_straw`], a response ring smaller than the
    /// geometry, memory exhausted.
    pub fn accept(&self, offer: RocketOffer) -> Result<RpcAccept, FabricError> {
        let RocketOffer {
            node: peer,
            incarnation,
            straw,
            geometry: cfg,
            batching,
            mode_threshold,
            resp_ring,
            req_credit,
            server_thread,
        } = offer;
        let bad = |what: String| FabricError::InvalidArgument {
            op: "accept Rocket",
            what,
        };
        if self.fabric.is_fenced(peer, incarnation) {
            return Err(FabricError::Fenced { peer, incarnation });
        }
        let s = self
            .straw(straw)
            .ok_or_else(|| bad(format!("straw {straw:#x} has no RPC QP here yet")))?;
        cfg.validate().map_err(|e| bad(e.to_string()))?;
        if cfg.ring_bytes() > self.cfg.max_ring_bytes {
            return Err(bad(format!(
                "Rocket ring of {} buckets x {} bytes exceeds this server's limit of {} bytes",
                cfg.buckets, cfg.bucket_size, self.cfg.max_ring_bytes
            )));
        }
        if (resp_ring.len as usize) < cfg.ring_bytes() {
            return Err(bad(format!(
                "response ring of {} bytes is smaller than {} buckets x {} bytes",
                resp_ring.len, cfg.buckets, cfg.bucket_size
            )));
        }
        let max = self.cfg.max_rockets_per_straw;
        if s.rockets
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .is_err()
        {
            return Err(bad(format!(
                "requester already holds {max} Rocket pairs here, this server's limit per process"
            )));
        }
        let undo = |e: FabricError| {
            s.rockets.fetch_sub(1, Ordering::AcqRel);
            e
        };
        // Requesters only WRITE requests and credits; the staging ring is a local source
        // of WRITEs.
        let req_ring = self
            .fabric
            .alloc_mr_with(cfg.ring_bytes(), RemoteAccess::WRITE)
            .map_err(undo)?;
        let resp_staging = self
            .fabric
            .alloc_mr_with(cfg.ring_bytes(), RemoteAccess::NONE)
            .map_err(undo)?;
        let words = self
            .fabric
            .alloc_mr_with(16, RemoteAccess::WRITE)
            .map_err(undo)?;
        // The serving thread: the one asked for, else round robin. The Rocket's id names
        // it (`id % threads`), which `close` relies on.
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        let n = self.workers.len();
        let thread = server_thread.map_or(seq % n, |t| t as usize % n);
        let id = seq * n + thread;
        let accept = RpcAccept {
            req_ring: req_ring.desc(),
            resp_credit: words.desc().at(0),
            rocket: id as u64,
        };
        let chan = ChannelSetup::new(
            cfg,
            batching,
            resp_staging,
            req_ring,
            words,
            resp_ring,
            req_credit,
        )
        .map_err(|e| undo(bad(e.to_string())))?;
        let caller = Caller {
            node: peer,
            incarnation,
        };
        let conn = NewConn::new(id as u64, s.clone(), caller, chan, mode_threshold);
        let tx = &self.workers[thread];
        if tx.send(Cmd::Add(Box::new(conn))).is_err() {
            return Err(bad("server is stopping".into()));
        }
        Ok(accept)
    }

    /// Close Rocket pair `rocket` (its requester thread is leaving); its server thread
    /// drops it at its next look at the command channel. Returns whether such a Rocket
    /// could exist.
    pub fn close(&self, rocket: u64) -> bool {
        let tx = &self.workers[rocket as usize % self.workers.len()];
        tx.send(Cmd::Close(rocket)).is_ok()
    }

    /// Stop serving incarnation `incarnation` of node `peer` ([`Fabric::fence`] moves
    /// its QPs to the error state and refuses new ones; this also refuses its Rocket
    /// offers and has each server thread drop its Rockets, unanswered, at its next look
    /// at the command channel). Returns how of this server's QPs were moved to error by
    /// the fabric's fence.
    pub fn fence(&self, peer: NodeId, incarnation: u64) -> usize {
        let n = self.fabric.fence(peer, incarnation);
        let caller = Caller {
            node: peer,
            incarnation,
        };
        for tx in &self.workers {
            let _ = tx.send(Cmd::Fence(caller));
        }
        n
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
