//! RdmaStraws: per remote node, a pool of RC QPs shared by all threads of a process,
//! split into QPs for RPC traffic (Rocket buckets, credits) and QPs for one-sided
//! operations, sized by the number of threads they serve (Scythe,
//! 4.6 (1) and Fig. 19: "Decoupling the RDMA QPs and ring buffers").
//!
//! Rockets (rings) belong to threads; QPs belong to the pool. A thread posts a round's WRs
//! for a node on the least-loaded usable QP of the right kind and *sticks* to that QP while
//! any of its lists there is still outstanding, so its WRITEs to one ring land in the
//! order they were posted (RC orders a QP's WRs; two QPs are not ordered). With nothing
//! outstanding it may move: everything it posted before has completed, so has landed.
//!
//! A [`SharedQp`] is one QP with its own CQ behind a mutex. Whichever thread polls it
//! routes each list's completion to the posting thread's [`Mailbox`], except the
//! poller's own lists: a runtime or server thread polls the QPs it posts on with
//! [`SharedQp::poll_into`], which hands its own completions straight to it (the
//! thread-owned fast path: no mailbox lock for a QP only one thread uses, which is the
//! common case of [`StrawConfig::threads_per_qp`] threads or fewer). A QP that fails
//! (error completion, or the state machine in error) is marked broken, every outstanding
//! list is reported failed to its owner (which replays Rocket buckets and fails one-sided
//! ops), and the pool reconnects it over the control plane: the peer destroys its end
//! first, so nothing from the old QP can land after the replay. While the peer's control
//! plane cannot be reached the reconnect is retried with exponential backoff (1 ms
//! doubling to 100 ms) for up to [`StrawConfig::reconnect_give_up`], so a link flap
//! shorter than that costs a replay, not the node; after it (or at once when the peer
//! answers but refuses: a restarted process) the node is dead and every user fails
//! with `PeerGone`, until [`Straw::revived`] finds it answering again and a caller
//! connects anew over a fresh straw (the runtime does so on its next call to it).
//!
//! Reconnecting runs on the pool's control thread, never on a runtime thread: a runtime
//! thread that finds a QP broken asks for the reconnect ([`Straw::request_reconnect`])
//! and posts on the straw's other QPs, or waits, meanwhile. Fire-and-forget control
//! requests (closing a departed thread's Rockets) go the same way ([`Straw::request`]).
//!
//! The pool grows when threads attach and the average number of threads per QP would
//! exceed [`StrawConfig::threads_per_qp`], and shrinks when they detach: a retired QP takes
//! no new lists, and is released (both ends) once its outstanding lists have completed.
//! Both run on the control thread too, with two exceptions at the ends of a pool's life:
//! a thread attaching to a pool with no usable QP of the kind it needs creates the first
//! QP itself, since it has nothing to send on meanwhile (inside `connect`, a control
//! call), and the last thread to detach tears the QPs down itself (at its teardown), so
//! no control job keeps the fabric and its node id alive after the process let go.

use crate::NodeId;
use std::collections::{HashMap, VecDeque};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};
use std::time::{Duration, Instant};

use crate::bootstrap::BootstrapClient;
use crate::ctrl::CtrlRequest;
pub use crate::ctrl::QpKind;
use crate::fabric::{
    CompletionQueue, Fabric, FabricError, QpEndpoint, QpState, QueuePair, SendWr, Wc, WcStatus,
};

/// Entries of each shared QP's CQ; also the most lists one QP may have outstanding
/// (one signaled completion per list).
pub const QP_CQ_DEPTH: usize = 1024;

/// How a posted list ended, as its owner's [`Mailbox`] receives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListDone {
    /// The token the list was posted with.
    pub token: u64,
    /// [`WcStatus::Success`]: every WR of the list completed. Otherwise WRs
    /// `0..failed_wr` completed, WR `failed_wr` ended with this status, and the rest
    /// were flushed (`WcStatus::Flushed` itself for a list flushed whole, from 0).
    pub status: WcStatus,
    /// Index in the list of the WR that failed (0 on success).
    pub failed_wr: usize,
}

/// Bits of a WR's `wr_id` that hold its index in its list; the rest hold the list's
/// sequence number.
const WR_INDEX_BITS: u32 = 20;

/// Where completions of one thread's lists are delivered: a [`ListDone`] per
/// posted list, in completion order per QP.
#[derive(Default)]
pub struct Mailbox {
    done: Mutex<Vec<ListDone>>,
    /// Set when `done` may be non-empty: lets an idle owner skip the lock.
    full: AtomicBool,
}

impl Mailbox {
    /// An empty mailbox.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }
    fn push(&self, token: u64, status: WcStatus, failed_wr: usize) {
        lock(&self.done).push(ListDone {
            token,
            status,
            failed_wr,
        });
        self.full.store(true, Ordering::Release);
    }
    /// Move the delivered completions into `out` (appending).
    pub fn drain(&self, out: &mut Vec<ListDone>) {
        if !self.full.load(Ordering::Acquire) {
            return;
        }
        let mut d = lock(&self.done);
        self.full.store(false, Ordering::Relaxed);
        if !d.is_empty() {
            out.append(&mut d);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves plain data behind; go on.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct Posted {
    seq: u64,
    n: usize,
    mailbox: Arc<Mailbox>,
    token: u64,
}

/// The polling thread's own completions and where they go ([`SharedQp::poll_into`]).
struct Direct<'a> {
    own: &'a Arc<Mailbox>,
    out: &'a mut Vec<ListDone>,
}

/// Hand list `p`'s completion to its owner: straight into the poller's `out` when the
/// poller owns it, else through the owner's mailbox.
fn deliver(direct: &mut Option<Direct<'_>>, p: Posted, status: WcStatus, failed_wr: usize) {
    match direct {
        Some(d) if Arc::ptr_eq(d.own, &p.mailbox) => d.out.push(ListDone {
            token: p.token,
            status,
            failed_wr,
        }),
        _ => p.mailbox.push(p.token, status, failed_wr),
    }
}

struct Slot {
    qp: QueuePair,
    cq: CompletionQueue,
    sq_depth: usize,
    outstanding: usize,
    lists: VecDeque<Posted>,
    next_seq: u64,
    wcs: Vec<Wc>,
}

/// One RC QP (and its own CQ) shared by the threads of a process. See the module docs.
pub struct SharedQp {
    id: u64,
    kind: QpKind,
    load: AtomicUsize,
    retiring: AtomicBool,
    broken: AtomicBool,
    fixing: AtomicBool,
    posted: AtomicU64,
    users: AtomicUsize,
    slot: Mutex<Slot>,
}

impl SharedQp {
    /// Wrap a connected `qp` completing into `cq` (used by nothing else).
    pub fn new(id: u64, kind: QpKind, qp: QueuePair, cq: CompletionQueue) -> Arc<Self> {
        let sq_depth = qp.sq_depth();
        Arc::new(Self {
            id,
            kind,
            load: AtomicUsize::new(0),
            retiring: AtomicBool::new(false),
            broken: AtomicBool::new(false),
            fixing: AtomicBool::new(false),
            posted: AtomicU64::new(0),
            users: AtomicUsize::new(0),
            slot: Mutex::new(Slot {
                qp,
                cq,
                sq_depth,
                outstanding: 0,
                lists: VecDeque::new(),
                next_seq: 0,
                wcs: Vec::with_capacity(64),
            }),
        })
    }

    /// The pair's id (chosen by the side that created it; the same at both ends).
    pub fn id(&self) -> u64 {
        self.id
    }
    /// RPC or one-sided.
    pub fn kind(&self) -> QpKind {
        self.kind
    }
    /// WRs posted and not yet completed: the load a Rocket compares when it picks a QP.
    pub fn load(&self) -> usize {
        self.load.load(Ordering::Relaxed)
    }
    /// Rockets (and threads' one-sided traffic) bound to this QP now.
    pub fn users(&self) -> usize {
        self.users.load(Ordering::Relaxed)
    }
    /// Lists posted on this QP so far (all its incarnations).
    pub fn lists_posted(&self) -> u64 {
        self.posted.load(Ordering::Relaxed)
    }
    /// Neither retiring nor broken: new lists may go here.
    pub fn usable(&self) -> bool {
        !self.retiring.load(Ordering::Relaxed) && !self.broken.load(Ordering::Relaxed)
    }
    /// Failed and not yet reconnected.
    pub fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Relaxed)
    }
    /// Take no new lists; release once drained.
    pub fn retire(&self) {
        self.retiring.store(true, Ordering::Relaxed);
    }
    /// This end's endpoint.
    pub fn endpoint(&self) -> QpEndpoint {
        lock(&self.slot).qp.endpoint()
    }

    /// Post the longest prefix of `wrs` the send queue has room for as one list (one
    /// doorbell, only its last WR signaled; `wr_id`s are overwritten). Its completion is
    /// delivered to `mailbox` as `(token, status)`. Returns how many WRs were posted (0 when
    /// the send queue is full). Errors: the QP refused the post (it is in error); it is then
    /// marked broken, its outstanding lists are reported failed, and nothing was posted.
    pub fn post(
        &self,
        wrs: &mut [SendWr],
        mailbox: &Arc<Mailbox>,
        token: u64,
    ) -> Result<usize, FabricError> {
        self.post_list(wrs, mailbox, token, false)
    }

    /// [`SharedQp::post`], and with `whole` all of `wrs` or nothing (0 when the send
    /// queue has no room for the whole list): for WRs that must go out as one list, on
    /// one QP, so that RC orders them and an error stops the rest of them.
    pub fn post_list(
        &self,
        wrs: &mut [SendWr],
        mailbox: &Arc<Mailbox>,
        token: u64,
        whole: bool,
    ) -> Result<usize, FabricError> {
        let mut s = lock(&self.slot);
        let s = &mut *s;
        if self.broken.load(Ordering::Relaxed) {
            return Err(FabricError::QpError {
                peer: s.qp.peer(),
                why: "shared QP is broken, reconnecting",
            });
        }
        let room = if s.lists.len() >= QP_CQ_DEPTH {
            0
        } else {
            s.sq_depth - s.outstanding
        };
        let n = wrs.len().min(room);
        if n == 0 || (whole && n < wrs.len()) {
            return Ok(0);
        }
        let seq = s.next_seq;
        s.next_seq += 1;
        debug_assert!(n < 1 << WR_INDEX_BITS);
        for (i, w) in wrs[..n].iter_mut().enumerate() {
            w.wr_id = seq << WR_INDEX_BITS | i as u64;
            w.signaled = false;
        }
        wrs[n - 1].signaled = true;
        if let Err(e) = s.qp.post_send(&wrs[..n]) {
            // Lists whose completions are already queued did complete.
            self.drain_cq(s, &mut None);
            if !self.broken.load(Ordering::Relaxed) {
                self.fail(s, &mut None);
            }
            return Err(e);
        }
        // Both counters change only under the slot's lock: plain stores, no locked
        // read-modify-write on every post (readers only want a recent value).
        self.posted
            .store(self.posted.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        s.outstanding += n;
        self.load.store(s.outstanding, Ordering::Relaxed);
        s.lists.push_back(Posted {
            seq,
            n,
            mailbox: mailbox.clone(),
            token,
        });
        Ok(n)
    }

    /// Poll this QP's CQ and route completions to their owners' mailboxes; notice a QP
    /// in error. Non-blocking: returns `false` at once when another thread is polling or
    /// posting. Returns whether anything was delivered.
    pub fn poll(&self) -> bool {
        self.poll_with(None)
    }

    /// [`SharedQp::poll`] by the thread whose lists go to `own`: its completions are
    /// appended to `out` directly instead of taking the hop through its mailbox (the
    /// thread-owned fast path: a thread that polls the QPs it posts on, which is every
    /// thread of a runtime, pays no mailbox lock for its own lists). Other threads' lists
    /// still go to their mailboxes.
    ///
    /// Order: a QP completes its lists in order, and so does `out`. Completions another
    /// thread routed to `own` earlier (before this call took the QP) are moved to `out`
    /// first, under the QP's lock; ones routed later are later in the QP's order, and
    /// the caller drains `own` after its polls. Returns whether anything was delivered.
    pub fn poll_into(&self, own: &Arc<Mailbox>, out: &mut Vec<ListDone>) -> bool {
        self.poll_with(Some(Direct { own, out }))
    }

    fn poll_with(&self, mut direct: Option<Direct<'_>>) -> bool {
        let Ok(mut s) = self.slot.try_lock() else {
            return false;
        };
        let s = &mut *s;
        if let Some(d) = direct.as_mut() {
            d.own.drain(d.out);
        }
        let mut any = self.drain_cq(s, &mut direct);
        if !self.broken.load(Ordering::Relaxed) && s.qp.state() == QpState::Error {
            // Completions that raced with the transition are still good.
            any |= self.drain_cq(s, &mut direct);
            if !self.broken.load(Ordering::Relaxed) {
                self.fail(s, &mut direct);
                any = true;
            }
        }
        any
    }

    fn drain_cq(&self, s: &mut Slot, direct: &mut Option<Direct<'_>>) -> bool {
        s.wcs.clear();
        s.cq.poll(&mut s.wcs, 256);
        let mut any = false;
        for i in 0..s.wcs.len() {
            let wc = s.wcs[i];
            if wc.recv {
                continue;
            }
            any = true;
            let (seq, index) = (
                wc.wr_id >> WR_INDEX_BITS,
                (wc.wr_id & ((1 << WR_INDEX_BITS) - 1)) as usize,
            );
            if wc.status != WcStatus::Success {
                tracing::debug!(qp = self.id, status = ?wc.status, "shared QP failed");
                // RC executes a QP's WRs in order and an error completion is generated
                // even for an unsignaled WR: the lists before the failed one completed,
                // and the failed list's owner learns why (a remote access error is not a
                // transport failure to retry: the region is gone). The rest are flushed.
                while let Some(p) = s.lists.pop_front() {
                    if p.seq > seq {
                        s.lists.push_front(p);
                        break;
                    }
                    s.outstanding -= p.n;
                    if p.seq == seq {
                        deliver(direct, p, wc.status, index);
                    } else {
                        deliver(direct, p, WcStatus::Success, 0);
                    }
                }
                self.fail(s, direct);
                return true;
            }
            // RC completes a QP's lists in order: this completion covers every list up
            // to its own sequence number.
            while s.lists.front().is_some_and(|p| p.seq <= seq) {
                let p = s.lists.pop_front().expect("front");
                s.outstanding -= p.n;
                deliver(direct, p, WcStatus::Success, 0);
            }
            self.load.store(s.outstanding, Ordering::Relaxed);
        }
        any
    }

    /// Mark broken and report every outstanding list failed (`Flushed`) to its owner.
    fn fail(&self, s: &mut Slot, direct: &mut Option<Direct<'_>>) {
        self.broken.store(true, Ordering::Relaxed);
        for p in s.lists.drain(..) {
            deliver(direct, p, WcStatus::Flushed, 0);
        }
        s.outstanding = 0;
        self.load.store(0, Ordering::Relaxed);
    }

    /// Put this QP in the error state, as a transport failure would (fault injection).
    /// Errors: the verbs transition failed.
    pub fn inject_error(&self) -> Result<(), FabricError> {
        lock(&self.slot).qp.to_error()
    }

    /// Swap in a new connected QP and CQ (after a reconnect): lists still outstanding on
    /// the old one are reported failed to their owners; the old QP is destroyed.
    pub fn replace(&self, qp: QueuePair, cq: CompletionQueue) {
        let mut s = lock(&self.slot);
        let s = &mut *s;
        self.fail(s, &mut None);
        s.sq_depth = qp.sq_depth();
        s.qp = qp;
        s.cq = cq;
        self.broken.store(false, Ordering::Relaxed);
    }

    /// Wait up to `timeout` for the outstanding lists to complete, polling meanwhile.
    /// Returns whether it drained.
    pub fn drain(&self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        while self.load() > 0 && !self.is_broken() {
            if Instant::now() >= end {
                return false;
            }
            if !self.poll() {
                std::thread::yield_now();
            }
        }
        true
    }
}

/// Rebind a user (a Rocket, or a thread's one-sided traffic) from `current` to the
/// least-loaded usable QP of `qps`: fewest outstanding WRs, then fewest users, `current`
/// winning ties (no needless moves). Returns the QP now bound, if any is usable.
pub fn rebind(qps: &[Arc<SharedQp>], current: Option<&Arc<SharedQp>>) -> Option<Arc<SharedQp>> {
    let is_cur = |q: &Arc<SharedQp>| current.is_some_and(|c| Arc::ptr_eq(c, q));
    let key = |q: &Arc<SharedQp>| {
        let users = q.users().saturating_sub(usize::from(is_cur(q)));
        (q.load(), users, !is_cur(q))
    };
    let best = qps.iter().filter(|q| q.usable()).min_by_key(|q| key(q))?;
    if !is_cur(best) {
        if let Some(c) = current {
            unbind(c);
        }
        best.users.fetch_add(1, Ordering::Relaxed);
    }
    Some(best.clone())
}

/// Drop a user's binding to `qp` (the user goes away or moves).
pub fn unbind(qp: &SharedQp) {
    let _ = qp
        .users
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| u.checked_sub(1));
}

/// Settings of a process's straws ([`crate::runtime::RuntimeConfig::straw_config`]).
///
/// Non-exhaustive: outside rrpc, build one from [`StrawConfig::default`] with the
/// `with_*` setters.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct StrawConfig {
    /// Threads one QP of each kind serves on average before the pool adds a QP (default
    /// 4, at least 1). With T attached threads a straw holds `ceil(T / threads_per_qp)`
    /// QPs of each kind.
    pub threads_per_qp: usize,
    /// Send-queue depth of each QP, in WRs (default 512).
    pub sq_depth: usize,
    /// Deadline of control-plane calls made to create, reconnect or release QPs.
    pub connect_timeout: Duration,
    /// How long a failed QP's reconnect keeps trying while the node's control plane is
    /// unreachable (default 10 s), before the node is reported dead. Attempts are
    /// spaced by [`RECONNECT_BACKOFF_MIN`], doubling up to [`RECONNECT_BACKOFF_MAX`].
    pub reconnect_give_up: Duration,
}

impl Default for StrawConfig {
    fn default() -> Self {
        Self {
            threads_per_qp: 4,
            sq_depth: 512,
            connect_timeout: Duration::from_secs(10),
            reconnect_give_up: Duration::from_secs(10),
        }
    }
}

impl StrawConfig {
    /// Set [`StrawConfig::threads_per_qp`]: threads one QP serves on average (at least 1).
    pub fn with_threads_per_qp(mut self, threads_per_qp: usize) -> Self {
        self.threads_per_qp = threads_per_qp;
        self
    }

    /// Set [`StrawConfig::sq_depth`]: send-queue depth of each QP, in WRs.
    pub fn with_sq_depth(mut self, sq_depth: usize) -> Self {
        self.sq_depth = sq_depth;
        self
    }

    /// Set [`StrawConfig::connect_timeout`]: deadline of the straw's control-plane calls.
    pub fn with_connect_timeout(mut self, connect_timeout: Duration) -> Self {
        self.connect_timeout = connect_timeout;
        self
    }

    /// Set [`StrawConfig::reconnect_give_up`]: how long a failed QP's reconnect keeps
    /// trying before the node is reported dead.
    pub fn with_reconnect_give_up(mut self, reconnect_give_up: Duration) -> Self {
        self.reconnect_give_up = reconnect_give_up;
        self
    }
}

/// First pause between reconnect attempts of a failed QP.
pub const RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(1);
/// Longest pause between reconnect attempts of a failed QP.
pub const RECONNECT_BACKOFF_MAX: Duration = Duration::from_millis(100);
/// Least time between two probes of a dead node's control plane ([`Straw::revived`]).
const REVIVE_PROBE_PERIOD: Duration = Duration::from_millis(20);

/// The pause after a failed reconnect attempt that followed a pause of `prev` (`None`:
/// the first attempt failed): [`RECONNECT_BACKOFF_MIN`], doubling, at most
/// [`RECONNECT_BACKOFF_MAX`].
pub fn next_backoff(prev: Option<Duration>) -> Duration {
    prev.map_or(RECONNECT_BACKOFF_MIN, |d| {
        (d * 2).clamp(RECONNECT_BACKOFF_MIN, RECONNECT_BACKOFF_MAX)
    })
}

/// Why one reconnect attempt failed: the node may come back (its control plane is
/// unreachable, or the QP could not be set up) or it answered and refused (a restarted
/// process that never knew this straw).
enum AttemptError {
    Unreachable(FabricError),
    Refused(FabricError),
}

/// The straws of one process: one [`Straw`] per remote node, shared by all threads.
pub struct Straws {
    fabric: Fabric,
    cfg: StrawConfig,
    id: u64,
    next_qp: Arc<AtomicU64>,
    nodes: Mutex<HashMap<NodeId, Arc<Straw>>>,
    ctl: Control,
}

/// Work for a pool's control thread.
enum Job {
    Reconnect(Arc<Straw>, Arc<SharedQp>),
    /// Weak: a straw its process dropped has nothing left to resize, and the job must
    /// not keep it (and its fabric, which holds the node id) alive.
    Resize(std::sync::Weak<Straw>, QpKind),
    Request(SocketAddr, std::time::Duration, CtrlRequest),
}

/// The pool's control thread, started on first use; it ends when the pool and all its
/// straws are gone (the last sender drops).
#[derive(Clone, Default)]
struct Control {
    tx: Arc<OnceLock<Mutex<Sender<Job>>>>,
}

impl Control {
    fn send(&self, job: Job) {
        let tx = self.tx.get_or_init(|| {
            let (tx, rx) = channel::<Job>();
            let spawned = std::thread::Builder::new()
                .name("rrpc-straw-ctl".into())
                .spawn(move || {
                    for job in rx {
                        match job {
                            // On a thread of its own: it may retry for seconds, and
                            // other straws' jobs must not wait behind it.
                            Job::Reconnect(straw, qp) => {
                                let spawned = std::thread::Builder::new()
                                    .name("rrpc-reconnect".into())
                                    .spawn({
                                        let (straw, qp) = (straw.clone(), qp.clone());
                                        move || straw.reconnect(&qp)
                                    });
                                if spawned.is_err() {
                                    straw.reconnect(&qp);
                                }
                            }
                            Job::Resize(straw, kind) => {
                                if let Some(s) = straw.upgrade() {
                                    s.resize(kind);
                                }
                            }
                            Job::Request(addr, timeout, req) => {
                                // Best effort: a peer that is gone has nothing to close.
                                if let Ok(mut c) = BootstrapClient::connect(addr, timeout) {
                                    let _ = c.call_typed::<_, serde_json::Value>(&req);
                                }
                            }
                        }
                    }
                });
            if let Err(e) = spawned {
                tracing::error!(error = %e, "cannot start the straws' control thread");
            }
            Mutex::new(tx)
        });
        if lock(tx).send(job).is_err() {
            tracing::warn!("straws' control thread is gone; control request dropped");
        }
    }
}

impl Straws {
    /// Straws for this process on `fabric`. `id` tells this pool apart at the servers:
    /// random per pool.
    pub fn new(fabric: Fabric, cfg: StrawConfig) -> Arc<Self> {
        let id = rand_id();
        Arc::new(Self {
            fabric,
            cfg,
            id,
            next_qp: Arc::new(AtomicU64::new(1)),
            nodes: Mutex::new(HashMap::new()),
            ctl: Control::default(),
        })
    }

    /// The fabric.
    pub fn fabric(&self) -> &Fabric {
        &self.fabric
    }

    /// The pool's id as servers know it.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Settings.
    pub fn config(&self) -> &StrawConfig {
        &self.cfg
    }

    /// The straw to `node` (control plane at `addr`), creating it on first use, and
    /// again once the old one is dead (the node was unreachable; a restarted node under
    /// the same id gets a fresh straw, while threads still holding the dead one fail
    /// with `PeerGone` until they reconnect, which the runtime does on their next call
    /// once [`Straw::revived`] finds the node back).
    pub fn straw(self: &Arc<Self>, node: NodeId, addr: SocketAddr) -> Arc<Straw> {
        let mut nodes = lock(&self.nodes);
        if let Some(s) = nodes.get(&node) {
            if s.dead().is_none() {
                return s.clone();
            }
        }
        nodes.insert(
            node,
            Arc::new(Straw {
                node,
                addr,
                pool: PoolRef {
                    fabric: self.fabric.clone(),
                    cfg: self.cfg.clone(),
                    id: self.id,
                    next_qp: self.next_qp.clone(),
                    ctl: self.ctl.clone(),
                },
                rpc: RwLock::new(Vec::new()),
                one_sided: RwLock::new(Vec::new()),
                threads: [AtomicUsize::new(0), AtomicUsize::new(0)],
                reconnects: AtomicU64::new(0),
                resize: Mutex::new(()),
                dead: Mutex::new(None),
                is_dead: AtomicBool::new(false),
                revive: Mutex::new(Revive::default()),
                revived: Arc::new(AtomicBool::new(false)),
            }),
        );
        nodes[&node].clone()
    }

    /// The straw to `node`, if some thread attached to it.
    pub fn get(&self, node: NodeId) -> Option<Arc<Straw>> {
        lock(&self.nodes).get(&node).cloned()
    }
}

fn rand_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish() | 1
}

/// A straw's copy of its pool's settings.
struct PoolRef {
    fabric: Fabric,
    cfg: StrawConfig,
    id: u64,
    next_qp: Arc<AtomicU64>,
    ctl: Control,
}

/// The QP pool to one remote node. See the module docs.
pub struct Straw {
    node: NodeId,
    addr: SocketAddr,
    /// What the straw needs of its pool. Not the pool itself: the pool holds its straws,
    /// and a straw holding the pool would keep both (and the fabric, with its node id)
    /// alive after the process dropped them.
    pool: PoolRef,
    rpc: RwLock<Vec<Arc<SharedQp>>>,
    one_sided: RwLock<Vec<Arc<SharedQp>>>,
    threads: [AtomicUsize; 2],
    reconnects: AtomicU64,
    resize: Mutex<()>,
    dead: Mutex<Option<Arc<FabricError>>>,
    is_dead: AtomicBool,
    /// Probing a dead node's control plane for its return ([`Straw::revived`]).
    revive: Mutex<Revive>,
    /// Set by a probe that found the dead node's control plane answering again.
    revived: Arc<AtomicBool>,
}

/// The state of [`Straw::revived`]'s probes.
#[derive(Default)]
struct Revive {
    /// A probe is running.
    probing: Option<Arc<AtomicBool>>,
    /// No new probe before this.
    next: Option<Instant>,
}

fn kind_index(k: QpKind) -> usize {
    match k {
        QpKind::Rpc => 0,
        QpKind::OneSided => 1,
    }
}

impl Straw {
    /// The remote node's id.
    pub fn node(&self) -> NodeId {
        self.node
    }

    /// The remote node's control plane.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The id of the pool this straw belongs to, as servers know it.
    pub fn pool_id(&self) -> u64 {
        self.pool.id
    }

    fn qps(&self, kind: QpKind) -> &RwLock<Vec<Arc<SharedQp>>> {
        match kind {
            QpKind::Rpc => &self.rpc,
            QpKind::OneSided => &self.one_sided,
        }
    }

    /// The QPs of `kind` now in the pool.
    pub fn list(&self, kind: QpKind) -> Vec<Arc<SharedQp>> {
        self.qps(kind)
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Threads attached for `kind`.
    pub fn threads(&self, kind: QpKind) -> usize {
        self.threads[kind_index(kind)].load(Ordering::Relaxed)
    }

    /// QPs of this straw reconnected after a failure so far.
    pub fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }

    /// Declare the node unreachable now, on the word of an authority that decided it is
    /// dead (a membership or replica-view service), without waiting out
    /// [`StrawConfig::reconnect_give_up`]: every thread using this straw then fails its
    /// operations and calls to the node with `PeerGone`, as after a failed reconnect.
    /// A node that comes back is reconnected as after any such failure.
    pub fn declare_dead(&self, why: &'static str) {
        lock(&self.dead).get_or_insert_with(|| {
            Arc::new(FabricError::QpError {
                peer: self.node,
                why,
            })
        });
        self.is_dead.store(true, Ordering::Release);
    }

    /// Why the node is unreachable, once it is: the reconnect that failed.
    pub fn dead(&self) -> Option<Arc<FabricError>> {
        if !self.is_dead.load(Ordering::Acquire) {
            return None;
        }
        lock(&self.dead).clone()
    }

    /// A thread starts using QPs of `kind`. When the pool has no usable QP of that kind,
    /// creates one now (the caller needs it to send anything); otherwise asks the control
    /// thread to grow the pool if the average number of threads per QP now exceeds the
    /// threshold, and the thread shares an existing QP meanwhile. Blocks on the peer's
    /// control plane only in the first case, and for at most a running shrink's drain
    /// (one second). Errors: the first QP could not be created (the node's control plane
    /// or the fabric failed).
    pub fn attach(self: &Arc<Self>, kind: QpKind) -> Result<(), FabricError> {
        // Under the resize lock, so a shrink on the control thread either saw this thread
        // in its target or finished before the check of usable QPs below.
        let g = lock(&self.resize);
        self.threads[kind_index(kind)].fetch_add(1, Ordering::Relaxed);
        let usable = self
            .qps(kind)
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|q| q.usable());
        if usable {
            drop(g);
            self.pool.ctl.send(Job::Resize(Arc::downgrade(self), kind));
            Ok(())
        } else {
            self.resize_locked(kind)
        }
    }

    /// A thread stops using QPs of `kind`. While other threads still use them, the
    /// control thread shrinks the pool when fewer QPs serve them within the threshold
    /// (draining the retired QP and releasing it at the peer), and this call does not
    /// block. The last thread to leave tears the kind's QPs down itself (draining them
    /// for at most a second each and releasing them at the peer), so that once the
    /// process has dropped its runtimes nothing holds the fabric and its node id can be
    /// opened again at once.
    pub fn detach(self: &Arc<Self>, kind: QpKind) {
        let left = self.threads[kind_index(kind)]
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| t.checked_sub(1))
            .map_or(0, |t| t - 1);
        if left == 0 {
            self.resize(kind);
        } else {
            self.pool.ctl.send(Job::Resize(Arc::downgrade(self), kind));
        }
    }

    /// Bring the pool of `kind` to its target size (on the control thread, or on the last
    /// thread to detach).
    fn resize(&self, kind: QpKind) {
        let _g = lock(&self.resize);
        if let Err(e) = self.resize_locked(kind) {
            tracing::debug!(node = %self.node, ?kind, error = %e, "resizing straw");
        }
    }

    /// `ceil(threads / threads_per_qp)`: no QP once no thread is attached.
    fn target(&self, kind: QpKind) -> usize {
        let t = self.threads(kind);
        t.div_ceil(self.pool.cfg.threads_per_qp.max(1))
    }

    /// [`Self::resize`] with the resize lock held by the caller.
    fn resize_locked(&self, kind: QpKind) -> Result<(), FabricError> {
        loop {
            let (len, last) = {
                let v = self.qps(kind).read().unwrap_or_else(|p| p.into_inner());
                (v.len(), v.last().cloned())
            };
            let target = self.target(kind);
            if len < target {
                let qp = self.create(kind)?;
                self.qps(kind)
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(qp);
            } else if len > target {
                let qp = last.expect("len > 0");
                qp.retire();
                if !qp.drain(Duration::from_secs(1)) {
                    tracing::warn!(node = %self.node, qp = qp.id, "retired QP did not drain");
                }
                self.qps(kind)
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .retain(|q| !Arc::ptr_eq(q, &qp));
                // Best effort: a peer that is gone has nothing left to release.
                let _ = self.ctrl::<serde_json::Value>(&CtrlRequest::ReleaseQp {
                    straw: self.pool.id,
                    qp_id: qp.id,
                });
            } else {
                return Ok(());
            }
        }
    }

    fn ctrl<R: serde::de::DeserializeOwned>(
        &self,
        req: &CtrlRequest,
    ) -> Result<(R, TcpStream), FabricError> {
        let io = |what: String| FabricError::InvalidArgument {
            op: "straw control plane",
            what,
        };
        let mut c = BootstrapClient::connect(self.addr, self.pool.cfg.connect_timeout)
            .map_err(|e| io(format!("{}: {e}", self.addr)))?;
        let r = c
            .call_typed(req)
            .map_err(|e| io(format!("{}: {e}", self.addr)))?;
        Ok((r, c.into_stream()))
    }

    fn new_qp(&self) -> Result<(QueuePair, CompletionQueue), FabricError> {
        let f = &self.pool.fabric;
        let cq = f.create_cq(QP_CQ_DEPTH)?;
        let qp = f.create_qp(&cq, self.pool.cfg.sq_depth)?;
        Ok((qp, cq))
    }

    fn create(&self, kind: QpKind) -> Result<Arc<SharedQp>, FabricError> {
        let (mut qp, cq) = self.new_qp()?;
        let qp_id = self.pool.next_qp.fetch_add(1, Ordering::Relaxed);
        let (ep, stream): (QpEndpoint, _) = self.ctrl(&CtrlRequest::ConnectQp {
            endpoint: qp.endpoint(),
            straw: self.pool.id,
            qp_id,
            kind,
        })?;
        qp.connect(&ep)?;
        qp.watch_peer(stream)?;
        tracing::debug!(node = %self.node, qp = qp_id, ?kind, "straw QP created");
        Ok(SharedQp::new(qp_id, kind, qp, cq))
    }

    /// Ask the control thread to reconnect broken QP `qp` of this straw (once: a
    /// reconnect already asked for or under way is not asked again). Non-blocking.
    pub fn request_reconnect(self: &Arc<Self>, qp: &Arc<SharedQp>) {
        if !qp.is_broken() || self.dead().is_some() || qp.fixing.swap(true, Ordering::Acquire) {
            return;
        }
        self.pool.ctl.send(Job::Reconnect(self.clone(), qp.clone()));
    }

    /// Send `req` to the node's control plane from the control thread, ignoring the
    /// answer (best effort, non-blocking).
    pub fn request(&self, req: CtrlRequest) {
        self.pool
            .ctl
            .send(Job::Request(self.addr, self.pool.cfg.connect_timeout, req));
    }

    /// Reconnect a broken QP of this straw (off the runtime threads): the peer destroys
    /// its end and creates a new one; lists outstanding on the old QP are reported
    /// failed to their owners. While the peer's control plane is unreachable the
    /// attempt is repeated with exponential backoff ([`next_backoff`]) for up to
    /// [`StrawConfig::reconnect_give_up`]; then, or at once when the peer answers but
    /// refuses (a restarted process that does not know this straw), the node is marked
    /// dead. A dead node that comes back is found by [`Straw::revived`].
    fn reconnect(&self, qp: &SharedQp) {
        let start = Instant::now();
        let mut pause = None;
        let failed = loop {
            if !qp.is_broken() || self.dead().is_some() {
                break None;
            }
            match self.reconnect_once(qp) {
                Ok((new, cq)) => {
                    tracing::info!(node = %self.node, qp = qp.id, kind = ?qp.kind, "QP reconnected");
                    qp.replace(new, cq);
                    self.reconnects.fetch_add(1, Ordering::Relaxed);
                    break None;
                }
                Err(AttemptError::Refused(e)) => break Some(e),
                Err(AttemptError::Unreachable(e)) => {
                    let p = next_backoff(pause);
                    if start.elapsed() + p > self.pool.cfg.reconnect_give_up {
                        break Some(e);
                    }
                    tracing::debug!(node = %self.node, error = %e, pause = ?p, "reconnect failed; retrying");
                    std::thread::sleep(p);
                    pause = Some(p);
                }
            }
        };
        if let Some(e) = failed {
            tracing::warn!(node = %self.node, error = %e, "reconnect failed; node unreachable");
            lock(&self.dead).get_or_insert_with(|| Arc::new(e));
            self.is_dead.store(true, Ordering::Release);
        }
        qp.fixing.store(false, Ordering::Release);
    }

    /// One attempt of [`Self::reconnect`], with the deadline of its control call cut to
    /// what is left of the give-up time.
    fn reconnect_once(&self, qp: &SharedQp) -> Result<(QueuePair, CompletionQueue), AttemptError> {
        let (mut new, cq) = self.new_qp().map_err(AttemptError::Unreachable)?;
        let req = CtrlRequest::ReconnectQp {
            endpoint: new.endpoint(),
            straw: self.pool.id,
            qp_id: qp.id,
        };
        let io = |what: String| FabricError::InvalidArgument {
            op: "straw control plane",
            what: format!("{}: {what}", self.addr),
        };
        let mut c = BootstrapClient::connect(self.addr, self.pool.cfg.connect_timeout)
            .map_err(|e| AttemptError::Unreachable(io(e.to_string())))?;
        let ep: QpEndpoint = c.call_typed(&req).map_err(|e| match e {
            crate::bootstrap::BootstrapError::Remote(_) => AttemptError::Refused(io(e.to_string())),
            e => AttemptError::Unreachable(io(e.to_string())),
        })?;
        new.connect(&ep).map_err(AttemptError::Unreachable)?;
        new.watch_peer(c.into_stream())
            .map_err(AttemptError::Unreachable)?;
        Ok((new, cq))
    }

    /// Whether this straw's node, found dead, answers on its control plane again (a
    /// restarted process under the same id and address): then a caller may connect to it
    /// anew ([`crate::runtime::ThreadCtx::reconnect`]) over a fresh straw. Never blocks:
    /// a probe (one `Info` call) runs on a thread of its own, at most one at a time and
    /// one per 20 ms; this reports what the last one found. `false` for a live straw.
    pub fn revived(&self) -> bool {
        if self.dead().is_none() {
            return false;
        }
        if self.revived.load(Ordering::Acquire) {
            return true;
        }
        let mut r = lock(&self.revive);
        if r.probing
            .as_ref()
            .is_some_and(|p| p.load(Ordering::Acquire))
        {
            return false;
        }
        let now = Instant::now();
        if r.next.is_some_and(|t| now < t) {
            return false;
        }
        r.next = Some(now + REVIVE_PROBE_PERIOD);
        let running = Arc::new(AtomicBool::new(true));
        r.probing = Some(running.clone());
        let (addr, timeout, revived) = (
            self.addr,
            self.pool.cfg.connect_timeout.min(Duration::from_secs(1)),
            self.revived.clone(),
        );
        let probe = move || {
            let up = BootstrapClient::connect(addr, timeout)
                .and_then(|mut c| c.call_typed::<_, serde_json::Value>(&CtrlRequest::Info))
                .is_ok();
            if up {
                revived.store(true, Ordering::Release);
            }
            running.store(false, Ordering::Release);
        };
        if std::thread::Builder::new()
            .name("rrpc-revive".into())
            .spawn(probe)
            .is_err()
        {
            r.probing = None;
        }
        false
    }

    /// The QP of `kind` a Rocket (or a thread's one-sided traffic) bound to `current`
    /// should post on now: see [`rebind`]. Broken QPs met on the way are handed to the
    /// control thread to reconnect; this never blocks. `None` when no QP is usable now
    /// (all broken and not reconnected yet, or the node is dead).
    pub fn pick(
        self: &Arc<Self>,
        kind: QpKind,
        current: Option<&Arc<SharedQp>>,
    ) -> Option<Arc<SharedQp>> {
        let v = self.qps(kind).read().unwrap_or_else(|p| p.into_inner());
        for b in v.iter().filter(|q| q.is_broken()) {
            self.request_reconnect(b);
        }
        rebind(&v, current)
    }
}
