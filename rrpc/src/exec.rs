//! A waker-driven single-thread executor: a thread's cost per polling round follows the
//! coroutines that are READY, not all the live ones (one active caller among 63 idle
//! coroutines costs about what the caller alone costs).
//!
//! # The round
//!
//! [`Executor::run`] repeats rounds; one round is:
//!
//! 1. start the round's clock: [`Handle::now`] reads [`Instant::now`] (one vDSO call)
//!    on its first use in the round and returns that value for the rest of it; it is
//!    read at once only when timers are pending, and it is what timers compare
//!    against;
//! 2. fire the timers due at that instant (wake their wakers), so that their tasks run in
//!    this round's pass;
//! 3. move the tasks spawned through [`Handle::spawn`] into the task slab and mark them
//!    ready;
//! 4. poll, once each, every task woken since the previous round's pass began;
//! 5. call `io()` once: it polls completion queues and rings and wakes the tasks whose
//!    operations completed, through the wakers they registered; it returns whether it
//!    did any work;
//! 6. a round in which no task was polled, no timer fired and `io()` did no work is idle;
//!    after [`IDLE_SPINS`] (256) consecutive idle rounds, every further idle round calls
//!    [`std::thread::yield_now`] (never a sleep: this runtime busy-polls RDMA queues, and
//!    the machines it runs on are often oversubscribed).
//!
//! Timers fire right after the clock read (step 2) rather than after `io()`: the previous
//! round's `io()` is what precedes them either way, but with the fresh clock a due timer's
//! task runs one round earlier, and the round still reads the clock only once.
//!
//! ## Why tasks woken during the pass wait for the next round
//!
//! The pass polls a snapshot of the ready set, taken before the first poll. A task woken
//! while the pass runs (by another task, or by itself, as [`Handle::yield_now`] does) is
//! polled in the next round's pass, after `io()`. That keeps a round's shape fixed: every
//! task issues its work requests (WRs) in the pass, and `io()` then posts all of them
//! together (one doorbell per queue pair for the whole round), before anyone is polled
//! again. It also bounds a round: a task that keeps waking itself cannot starve `io()`.
//!
//! # Wakers
//!
//! Each task gets one [`Waker`] when it is spawned (one `Arc` allocation per task, none
//! per wake; polls hand out that waker by reference, and whoever keeps it clones the
//! `Arc`). A waker holds its task's key (slot index and slot generation, 32 bits each)
//! and a `queued` flag:
//!
//! - **deduplication**: a wake sets `queued` and enqueues the key only if the flag was
//!   clear; the executor clears it just before polling the task. A task woken ten times
//!   in a round is queued and polled once; a wake that arrives while the task is being
//!   polled queues it for the next round.
//! - **thread safety**: wakers are `Send + Sync` ([`std::task::Wake`]). A wake on the
//!   thread whose running executor owns the task (a reply found by `io()`, a task waking
//!   another: nearly all of them) pushes the key onto a thread-local list the executor
//!   drains each round, with no lock; the executor marks itself the thread's owner while
//!   it runs, and one started inside a task (a `block_on` in a coroutine) puts the
//!   outer one's pending keys aside and gives them back when it returns. A wake from
//!   another OS thread pushes the key into the executor's queue, a `Mutex<Vec<u64>>` with
//!   an `AtomicBool` "non-empty" flag that the executor reads (one atomic load) before
//!   it takes the lock. The vectors keep their capacity, so pushing does not allocate in
//!   the steady state (a lock-free segmented queue such as `crossbeam-queue`'s `SegQueue`
//!   allocates a block every few dozen pushes). The lock-free local path gave TSO groups,
//!   whose leader wakes every member, 5 to 9% more timestamps per second.
//! - **stale wakes are harmless**: a task's slot gets a new generation when the task
//!   finishes, so the key of a finished task no longer matches; the executor drops such
//!   keys, and a reused slot's new task is not polled because of its predecessor's
//!   wakers. (The generation is 32 bits: a waker kept across exactly 2^32 reuses of its
//!   slot would cause one spurious poll, which every future must tolerate anyway.) Each
//!   executor has its own queue, so wakers of an executor that is gone cannot reach the
//!   next executor of the same [`Handle`].
//!
//! Why not the `async-task` crate (`spawn_local`, smol-rs, well kept)? It would work: it
//! deduplicates wakes with its own "scheduled" bit and keeps a finished task's header
//! alive for late wakers. But its schedule function still has to be our own `Send + Sync`
//! queue, the per-round snapshot, the spawn queue, timers and stats are ours either way,
//! and with `std::task::Wake` plus a slab the whole thing is about a hundred lines of
//! safe code and no new dependency. This module has no `unsafe`.
//!
//! # Timers
//!
//! [`Handle::sleep`], [`Handle::sleep_until`] and [`Handle::timeout`] register, when
//! first polled before their deadline, an entry in an ordered map keyed by
//! `(deadline, sequence number)` holding the waker. The executor fires due entries in
//! deadline order (ties in registration order) once per round, with the round's clock
//! (so a timer fires at the first round that starts at or after its deadline; its
//! resolution is one round, microseconds when the thread is busy). Dropping a [`Sleep`]
//! or [`Timeout`] before it fired REMOVES its entry (O(log n)): a runtime sets a deadline
//! per call and most calls finish first, so lazily deleted entries would pile up at
//! millions of calls per second. [`Handle::timers`] counts the entries, for leak checks.
//! Re-polling a `Sleep` with a different waker replaces the stored one.
//!
//! Durations are measured from the round's clock: `sleep(d)` ends at the first round
//! starting at or after `now() + d`, where `now()` is the current round's start (so it can
//! end up to one pass earlier than `d` after the call, and at most one round later).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

/// Consecutive idle rounds after which each further idle round yields the core
/// ([`std::thread::yield_now`]).
pub const IDLE_SPINS: u32 = 256;

type BoxFuture = Pin<Box<dyn Future<Output = ()>>>;

/// A timer entry's key: deadline, then registration order.
type TimerKey = (Instant, u64);

/// One thread's scheduler state shared by its [`Handle`]s.
struct Shared {
    /// The clock read at the start of the current round.
    /// The round's clock, read on first use in the round (`None` until then).
    now: Cell<Option<Instant>>,
    /// Tasks spawned through a [`Handle`], not yet in an executor's slab.
    spawned: RefCell<Vec<BoxFuture>>,
    /// Pending timers.
    timers: RefCell<BTreeMap<TimerKey, Waker>>,
    /// The next timer's sequence number.
    next_seq: Cell<u64>,
}

/// Shared, cloneable, `!Send` handle to one thread's scheduler state: the spawn queue,
/// the timers and the round's clock. Coroutines keep one to spawn, sleep, time out and
/// read the clock; the [`Executor`] running them owns another.
#[derive(Clone)]
pub struct Handle {
    shared: Rc<Shared>,
}

impl Default for Handle {
    fn default() -> Self {
        Self::new()
    }
}

impl Handle {
    /// Fresh scheduler state; [`Handle::now`] reads the clock of this call until an
    /// executor's first round.
    pub fn new() -> Self {
        Self {
            shared: Rc::new(Shared {
                now: Cell::new(None),
                spawned: RefCell::new(Vec::new()),
                timers: RefCell::new(BTreeMap::new()),
                next_seq: Cell::new(0),
            }),
        }
    }

    /// Run `f` as a task of its own: the executor running on this handle picks it up at
    /// the start of its next round (if none runs yet, the first one to run). Works from
    /// inside tasks, from `io()`, and before any [`Executor`] exists. A task waiting in
    /// this queue that holds a clone of the handle keeps the scheduler state alive (a
    /// reference cycle) until an executor takes it; tasks still in an executor are
    /// dropped with it.
    pub fn spawn(&self, f: impl Future<Output = ()> + 'static) {
        self.shared.spawned.borrow_mut().push(Box::pin(f));
    }

    /// A future ready at the first round starting at or after `self.now() + d`.
    pub fn sleep(&self, d: Duration) -> Sleep {
        self.sleep_until(self.now() + d)
    }

    /// A future ready at the first round starting at or after `t`.
    pub fn sleep_until(&self, t: Instant) -> Sleep {
        Sleep {
            handle: self.clone(),
            deadline: t,
            key: None,
        }
    }

    /// Run `f` until it finishes (`Ok` with its output) or until the first round starting
    /// at or after `deadline` (`Err(Elapsed)`; `f` is then dropped with the `Timeout`).
    /// The output is checked first: a future ready in the deadline's round still wins.
    pub fn timeout<F: Future>(&self, deadline: Instant, f: F) -> Timeout<F> {
        Timeout {
            fut: f,
            sleep: self.sleep_until(deadline),
        }
    }

    /// A future that is pending once and ready in the next round (the task re-wakes
    /// itself): gives the thread's other ready tasks and `io()` one turn.
    pub fn yield_now(&self) -> YieldNow {
        YieldNow { yielded: false }
    }

    /// The clock read at the start of the current round (a memory read, not a clock read).
    pub fn now(&self) -> Instant {
        match self.shared.now.get() {
            Some(t) => t,
            None => {
                let t = Instant::now();
                self.shared.now.set(Some(t));
                t
            }
        }
    }

    /// Forget the clock read cached for this round: the next [`Handle::now`] reads the
    /// clock. The executor does this at the start of each round; I/O driven without it
    /// (a `ThreadCtx` polled by hand or by another executor) does it after each poll, so
    /// the cached time is never older than one round of whoever drives it.
    pub fn tick(&self) {
        self.shared.now.set(None);
    }

    /// Pending timers (registered by polled, not yet fired, not dropped sleeps and
    /// timeouts).
    pub fn timers(&self) -> usize {
        self.shared.timers.borrow().len()
    }

    /// Move the timers due at `now` into `out` (in deadline order); returns how many.
    fn take_due(&self, now: Instant, out: &mut Vec<Waker>) -> usize {
        let mut timers = self.shared.timers.borrow_mut();
        let mut n = 0;
        while let Some(entry) = timers.first_entry() {
            if entry.key().0 > now {
                break;
            }
            out.push(entry.remove());
            n += 1;
        }
        n
    }
}

/// Future returned by [`Handle::sleep`] and [`Handle::sleep_until`]. Dropping it
/// removes its timer.
#[must_use = "futures do nothing unless awaited"]
pub struct Sleep {
    handle: Handle,
    deadline: Instant,
    /// The registered timer entry, if any.
    key: Option<TimerKey>,
}

impl Sleep {
    /// When this sleep ends.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Remove the timer entry, if registered.
    fn cancel(&mut self) {
        if let Some(k) = self.key.take() {
            self.handle.shared.timers.borrow_mut().remove(&k);
        }
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if this.handle.now() >= this.deadline {
            this.cancel();
            return Poll::Ready(());
        }
        let shared = &this.handle.shared;
        let mut timers = shared.timers.borrow_mut();
        match this.key {
            Some(k) => match timers.get_mut(&k) {
                Some(w) => {
                    if !w.will_wake(cx.waker()) {
                        w.clone_from(cx.waker());
                    }
                }
                // Fired without the clock having reached the deadline: cannot happen with
                // the executor's clock, re-arm anyway.
                None => {
                    timers.insert(k, cx.waker().clone());
                }
            },
            None => {
                let seq = shared.next_seq.get();
                shared.next_seq.set(seq.wrapping_add(1));
                let k = (this.deadline, seq);
                timers.insert(k, cx.waker().clone());
                this.key = Some(k);
            }
        }
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        self.cancel();
    }
}

/// Error of a [`Timeout`] whose deadline passed before its future finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("deadline elapsed")]
pub struct Elapsed;

pin_project_lite::pin_project! {
    /// Future returned by [`Handle::timeout`]: `Ok(output)` or `Err(Elapsed)`. Its timer
    /// is removed when it finishes either way, or when it is dropped.
    #[must_use = "futures do nothing unless awaited"]
    pub struct Timeout<F> {
        #[pin]
        fut: F,
        sleep: Sleep,
    }
}

impl<F: Future> Future for Timeout<F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(v) = this.fut.poll(cx) {
            this.sleep.cancel();
            return Poll::Ready(Ok(v));
        }
        match Pin::new(this.sleep).poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(Elapsed)),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Future returned by [`Handle::yield_now`].
#[must_use = "futures do nothing unless awaited"]
pub struct YieldNow {
    yielded: bool,
}

impl Future for YieldNow {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.yielded {
            Poll::Ready(())
        } else {
            self.yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}

/// The executor's ready queue as seen by wakers (any thread).
struct Remote {
    /// Whether `queue` may be non-empty; read without the lock.
    nonempty: AtomicBool,
    /// Keys of woken tasks.
    queue: Mutex<Vec<u64>>,
}

impl Remote {
    fn push(&self, key: u64) {
        let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        q.push(key);
        self.nonempty.store(true, Ordering::Release);
    }

    /// Append the queued keys to `out`.
    fn drain_into(&self, out: &mut Vec<u64>) {
        if self.nonempty.load(Ordering::Acquire) {
            let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            out.append(&mut q);
            self.nonempty.store(false, Ordering::Relaxed);
        }
    }
}

/// A task's waker state.
struct TaskWaker {
    /// Slot generation (high 32 bits) and slot index (low 32 bits).
    key: u64,
    /// Whether the task is queued to be polled (set by wakes, cleared before a poll).
    queued: AtomicBool,
    remote: Arc<Remote>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // AcqRel: the executor's clearing swap acquires what the waker wrote before
        // waking, so the poll that follows sees it even when this wake was deduplicated.
        if !self.queued.swap(true, Ordering::AcqRel) {
            let owner = Arc::as_ptr(&self.remote);
            // On the thread whose running executor owns the task (the common case: a
            // reply found by `io()`, a task waking another): no lock.
            let local = LOCAL
                .try_with(|l| {
                    let mine = l.owner.get() == owner;
                    if mine {
                        l.keys.borrow_mut().push(self.key);
                    }
                    mine
                })
                .unwrap_or(false);
            if !local {
                self.remote.push(self.key);
            }
        }
    }
}

/// Wakes from the thread of the executor they belong to, kept without a lock.
struct LocalWakes {
    /// The queue of the executor running on this thread ([`Executor::run`] or
    /// [`Executor::run_until`]); null when none is.
    owner: Cell<*const Remote>,
    /// Keys of its tasks woken from this thread since its last pass began.
    keys: RefCell<Vec<u64>>,
}

thread_local! {
    static LOCAL: LocalWakes = const {
        LocalWakes {
            owner: Cell::new(std::ptr::null()),
            keys: RefCell::new(Vec::new()),
        }
    };
}

/// Makes an executor the owner of this thread's [`LOCAL`] wakes while it runs; on drop
/// (also by a panic) hands its leftover local wakes to its own queue and gives the thread
/// back to the executor it interrupted (a `block_on` inside a task), whose pending keys
/// it had put aside.
struct LocalOwner {
    remote: Arc<Remote>,
    prev: *const Remote,
    prev_keys: Vec<u64>,
}

impl LocalOwner {
    fn enter(remote: &Arc<Remote>) -> Self {
        let (prev, prev_keys) = LOCAL.with(|l| {
            (
                l.owner.replace(Arc::as_ptr(remote)),
                std::mem::take(&mut *l.keys.borrow_mut()),
            )
        });
        Self {
            remote: remote.clone(),
            prev,
            prev_keys,
        }
    }
}

impl Drop for LocalOwner {
    fn drop(&mut self) {
        let _ = LOCAL.try_with(|l| {
            let mut keys = l.keys.borrow_mut();
            for &k in keys.iter() {
                self.remote.push(k);
            }
            keys.clear();
            keys.append(&mut self.prev_keys);
            l.owner.set(self.prev);
        });
    }
}

struct Task {
    fut: BoxFuture,
    waker: Waker,
    state: Arc<TaskWaker>,
    /// The round of the task's last poll (a second key in one pass is skipped).
    last_round: u64,
}

struct Slot {
    generation: u32,
    task: Option<Task>,
}

/// Counters of an [`Executor`] since its creation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExecStats {
    /// Rounds run.
    pub rounds: u64,
    /// Task polls.
    pub polls: u64,
    /// Rounds in which no task was polled, no timer fired and `io()` did no work.
    pub idle_rounds: u64,
}

/// A waker-driven executor for one thread's tasks; see the [module docs](self) for its
/// round.
pub struct Executor {
    handle: Handle,
    slots: Vec<Slot>,
    /// Free slot indices, reused last freed first.
    free: Vec<u32>,
    live: usize,
    remote: Arc<Remote>,
    /// Keys to poll in the next pass (kept for its capacity between rounds).
    ready: Vec<u64>,
    /// Wakers of fired timers (kept for its capacity).
    fired: Vec<Waker>,
    /// Swapped with the handle's spawn queue (kept for its capacity).
    spawn_buf: Vec<BoxFuture>,
    /// Consecutive idle rounds.
    idle: u32,
    /// Longest sleep of an idle round ([`Executor::set_idle_sleep`]); zero: yield only.
    idle_sleep: Duration,
    stats: ExecStats,
}

/// Idle rounds before a thread with an idle sleep ([`Executor::set_idle_sleep`]) sleeps.
pub const IDLE_SPINS_BEFORE_SLEEP: u32 = 16;

/// How long an idle round sleeps after `idle` consecutive idle rounds, with sleeps of
/// `max` (zero: never): nothing for the first [`IDLE_SPINS_BEFORE_SLEEP`] rounds, then
/// `max` each round. A sleeping server answers within `max`, drains what arrived in one
/// round, and costs its core nothing in between.
pub fn idle_backoff(idle: u32, max: Duration) -> Duration {
    if idle <= IDLE_SPINS_BEFORE_SLEEP || max.is_zero() {
        return Duration::ZERO;
    }
    max
}

impl Executor {
    /// An executor for `handle`'s tasks (it picks up those already spawned on it).
    pub fn new(handle: Handle) -> Self {
        Self {
            handle,
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
            remote: Arc::new(Remote {
                nonempty: AtomicBool::new(false),
                queue: Mutex::new(Vec::new()),
            }),
            ready: Vec::new(),
            fired: Vec::new(),
            spawn_buf: Vec::new(),
            idle: 0,
            idle_sleep: Duration::ZERO,
            stats: ExecStats::default(),
        }
    }

    /// Give the core back when idle: after [`IDLE_SPINS_BEFORE_SLEEP`] rounds without
    /// work, sleep `max` in each idle round instead of spinning and yielding
    /// ([`idle_backoff`]). For server threads on machines with fewer cores than busy
    /// threads: a thread that only yields stays runnable and is scheduled only when the
    /// kernel preempts a busy one (milliseconds), while one that sleeps is woken by its
    /// timer and preempts at once. Zero (the default) only yields. Sets the thread's
    /// timer slack to 1 us so that short sleeps are short.
    pub fn set_idle_sleep(&mut self, max: Duration) {
        self.idle_sleep = max;
        if !max.is_zero() {
            // SAFETY: prctl(PR_SET_TIMERSLACK) takes an integer and changes only this
            // thread's timer slack; no memory is passed.
            unsafe {
                libc::prctl(libc::PR_SET_TIMERSLACK, 1_000 as libc::c_ulong);
            }
        }
    }

    /// The handle this executor runs.
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Add a task; it is polled in the next round (after the tasks spawned on the
    /// [`Handle`] before it: tasks are first polled in spawn order).
    pub fn spawn(&mut self, f: impl Future<Output = ()> + 'static) {
        self.take_spawned();
        self.insert(Box::pin(f));
    }

    /// Tasks in this executor (spawned through the [`Handle`] ones count from the round
    /// that picked them up).
    pub fn live(&self) -> usize {
        self.live
    }

    /// Counters since creation.
    pub fn stats(&self) -> ExecStats {
        self.stats
    }

    /// Run rounds until every task has finished, including those spawned meanwhile.
    /// The round in which the last task finishes does not call `io()`.
    pub fn run(&mut self, io: &mut dyn FnMut() -> bool) {
        let _owner = LocalOwner::enter(&self.remote);
        while self.round(io, true) {}
    }

    /// Run rounds until `stop()` (checked before every round) returns true, even with
    /// tasks left or with none (server threads, whose `io()` may spawn). Tasks left stay
    /// in the executor.
    pub fn run_until(&mut self, io: &mut dyn FnMut() -> bool, stop: &mut dyn FnMut() -> bool) {
        let _owner = LocalOwner::enter(&self.remote);
        while !stop() {
            self.round(io, false);
        }
    }

    /// Move the tasks spawned on the handle into the slab.
    fn take_spawned(&mut self) {
        // Nearly every round: nothing spawned, so no buffer swap.
        if self.handle.shared.spawned.borrow().is_empty() {
            return;
        }
        let mut spawned = std::mem::take(&mut self.spawn_buf);
        std::mem::swap(&mut *self.handle.shared.spawned.borrow_mut(), &mut spawned);
        for f in spawned.drain(..) {
            self.insert(f);
        }
        self.spawn_buf = spawned;
    }

    fn insert(&mut self, fut: BoxFuture) {
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                let i = u32::try_from(self.slots.len()).expect("fewer than 2^32 tasks");
                self.slots.push(Slot {
                    generation: 0,
                    task: None,
                });
                i
            }
        };
        let slot = &mut self.slots[idx as usize];
        let key = (u64::from(slot.generation) << 32) | u64::from(idx);
        let state = Arc::new(TaskWaker {
            key,
            queued: AtomicBool::new(true),
            remote: self.remote.clone(),
        });
        slot.task = Some(Task {
            fut,
            waker: Waker::from(state.clone()),
            state,
            last_round: u64::MAX,
        });
        self.ready.push(key);
        self.live += 1;
    }

    /// One round; returns false if `exit_when_done` and no task is left (then `io()` was
    /// not called).
    fn round(&mut self, io: &mut dyn FnMut() -> bool, exit_when_done: bool) -> bool {
        self.stats.rounds += 1;
        let round = self.stats.rounds;
        // The clock is read lazily: at most once a round, and not at all in a round
        // that has no timer to fire and whose tasks and I/O do not ask for it.
        self.handle.shared.now.set(None);
        let fired = if self.handle.shared.timers.borrow().is_empty() {
            0
        } else {
            let now = self.handle.now();
            self.handle.take_due(now, &mut self.fired)
        };
        if fired > 0 {
            for w in self.fired.drain(..) {
                w.wake();
            }
        }

        self.take_spawned();

        LOCAL.with(|l| self.ready.append(&mut l.keys.borrow_mut()));
        self.remote.drain_into(&mut self.ready);
        let mut ready = std::mem::take(&mut self.ready);
        let mut polled = 0u64;
        for &key in &ready {
            polled += u64::from(self.poll_task(key, round));
        }
        ready.clear();
        self.ready = ready;
        self.stats.polls += polled;

        if exit_when_done && self.live == 0 && self.handle.shared.spawned.borrow().is_empty() {
            return false;
        }
        let did_io = io();
        if polled == 0 && fired == 0 && !did_io {
            self.stats.idle_rounds += 1;
            self.idle = self.idle.saturating_add(1);
            let nap = idle_backoff(self.idle, self.idle_sleep);
            if !nap.is_zero() {
                std::thread::sleep(nap);
            } else if self.idle > IDLE_SPINS {
                std::thread::yield_now();
            }
        } else {
            self.idle = 0;
        }
        true
    }

    /// Poll the task of `key` if it is still the slot's task and was not polled this
    /// round; returns whether it was polled.
    fn poll_task(&mut self, key: u64, round: u64) -> bool {
        let idx = (key & u64::from(u32::MAX)) as usize;
        let generation = (key >> 32) as u32;
        let Some(slot) = self.slots.get_mut(idx) else {
            return false;
        };
        if slot.generation != generation {
            return false;
        }
        let Some(task) = slot.task.as_mut() else {
            return false;
        };
        if task.last_round == round {
            return false;
        }
        task.last_round = round;
        task.state.queued.swap(false, Ordering::AcqRel);
        let mut cx = Context::from_waker(&task.waker);
        if task.fut.as_mut().poll(&mut cx).is_ready() {
            slot.task = None;
            slot.generation = slot.generation.wrapping_add(1);
            self.free.push(idx as u32);
            self.live -= 1;
        }
        true
    }
}

/// Run `f` on a new [`Executor`] of `handle` and return its output. Like
/// [`Executor::run`], it returns once every task of the executor has finished, including
/// tasks spawned on `handle` (before or meanwhile). For setup code, tests and simple
/// clients.
pub fn block_on<T: 'static>(
    handle: &Handle,
    io: &mut dyn FnMut() -> bool,
    f: impl Future<Output = T> + 'static,
) -> T {
    let out = Rc::new(Cell::new(None));
    let o = out.clone();
    let mut ex = Executor::new(handle.clone());
    ex.spawn(async move { o.set(Some(f.await)) });
    ex.run(io);
    out.take().expect("the task ran to completion")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;
    use std::sync::atomic::AtomicUsize;

    /// A manual future source: tasks wait until it is open; `open` wakes them.
    #[derive(Default)]
    struct Gate {
        open: Cell<bool>,
        wakers: RefCell<Vec<Waker>>,
    }

    impl Gate {
        async fn wait(&self) {
            poll_fn(|cx| {
                if self.open.get() {
                    Poll::Ready(())
                } else {
                    self.wakers.borrow_mut().push(cx.waker().clone());
                    Poll::Pending
                }
            })
            .await
        }

        fn open(&self) {
            self.open.set(true);
            for w in self.wakers.borrow_mut().drain(..) {
                w.wake();
            }
        }
    }

    /// A counter that tasks wait on (`wait(n)`: until it reaches n); `bump` wakes the
    /// one stored waker.
    #[derive(Default)]
    struct Signal {
        count: Cell<u32>,
        waker: RefCell<Option<Waker>>,
    }

    impl Signal {
        async fn wait(&self, n: u32) {
            poll_fn(|cx| {
                if self.count.get() >= n {
                    Poll::Ready(())
                } else {
                    *self.waker.borrow_mut() = Some(cx.waker().clone());
                    Poll::Pending
                }
            })
            .await
        }

        fn bump(&self) {
            self.count.set(self.count.get() + 1);
            if let Some(w) = self.waker.borrow_mut().take() {
                w.wake();
            }
        }
    }

    /// Wraps a future, counting its polls.
    async fn counted<F: Future>(polls: Rc<Cell<u32>>, f: F) -> F::Output {
        let mut f = std::pin::pin!(f);
        poll_fn(|cx| {
            polls.set(polls.get() + 1);
            f.as_mut().poll(cx)
        })
        .await
    }

    /// Poll `f` once, returning whether it was ready.
    async fn poll_once<F: Future + Unpin>(f: &mut F) -> bool {
        poll_fn(|cx| Poll::Ready(Pin::new(&mut *f).poll(cx).is_ready())).await
    }

    /// A waker counting its wakes.
    struct CountWaker(AtomicUsize);

    impl Wake for CountWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn idle_tasks_are_polled_once() {
        let h = Handle::new();
        let mut ex = Executor::new(h.clone());
        let gate = Rc::new(Gate::default());
        let sig = Rc::new(Signal::default());
        let done = Rc::new(Cell::new(false));
        let idle_polls: Vec<Rc<Cell<u32>>> = (0..63).map(|_| Rc::default()).collect();
        let active_polls = Rc::new(Cell::new(0));
        {
            let (sig, done) = (sig.clone(), done.clone());
            ex.spawn(counted(active_polls.clone(), async move {
                for k in 1..=100 {
                    sig.wait(k).await;
                }
                done.set(true);
            }));
        }
        for p in &idle_polls {
            let gate = gate.clone();
            ex.spawn(counted(p.clone(), async move { gate.wait().await }));
        }
        let mut io = || {
            if sig.count.get() < 100 {
                sig.bump();
                true
            } else {
                false
            }
        };
        ex.run_until(&mut io, &mut || done.get());
        assert!(idle_polls.iter().all(|p| p.get() == 1));
        assert_eq!(active_polls.get(), 101);
        assert_eq!(ex.stats().polls, 63 + 101);
        assert_eq!(ex.live(), 63);
        // The idle ones finish once opened, each polled a second time.
        gate.open();
        ex.run(&mut || false);
        assert!(idle_polls.iter().all(|p| p.get() == 2));
        assert_eq!(ex.live(), 0);
    }

    #[test]
    fn wakes_in_one_round_poll_once() {
        let h = Handle::new();
        let mut ex = Executor::new(h);
        let sig = Rc::new(Signal::default());
        let polls = Rc::new(Cell::new(0));
        {
            let sig = sig.clone();
            ex.spawn(counted(polls.clone(), async move { sig.wait(1).await }));
        }
        let mut io = || {
            let w = sig.waker.borrow().clone();
            if let Some(w) = w {
                sig.count.set(1);
                for _ in 0..10 {
                    w.wake_by_ref();
                }
            }
            true
        };
        ex.run(&mut io);
        assert_eq!(polls.get(), 2);
        assert_eq!(ex.stats().polls, 2);
        assert_eq!(ex.stats().rounds, 2);
    }

    #[test]
    fn woken_during_pass_runs_next_round() {
        let h = Handle::new();
        let mut ex = Executor::new(h.clone());
        // `io()` calls so far: the round a task is polled in.
        let rounds = Rc::new(Cell::new(0u32));
        let a_polls = Rc::new(RefCell::new(Vec::new()));
        let a_waker: Rc<RefCell<Option<Waker>>> = Rc::default();
        {
            let (rounds, a_polls, a_waker) = (rounds.clone(), a_polls.clone(), a_waker.clone());
            ex.spawn(poll_fn(move |cx| {
                a_polls.borrow_mut().push(rounds.get());
                if a_polls.borrow().len() == 2 {
                    Poll::Ready(())
                } else {
                    *a_waker.borrow_mut() = Some(cx.waker().clone());
                    Poll::Pending
                }
            }));
        }
        // B, polled after A in the same pass, wakes A.
        ex.spawn(async move {
            a_waker.borrow_mut().take().expect("A ran first").wake();
        });
        // Yielding (a self-wake) also waits for the next round.
        let y_polls = Rc::new(RefCell::new(Vec::new()));
        {
            let (h, rounds, y_polls) = (h.clone(), rounds.clone(), y_polls.clone());
            ex.spawn(async move {
                y_polls.borrow_mut().push(rounds.get());
                h.yield_now().await;
                y_polls.borrow_mut().push(rounds.get());
            });
        }
        ex.run(&mut || {
            rounds.set(rounds.get() + 1);
            false
        });
        assert_eq!(*a_polls.borrow(), [0, 1]);
        assert_eq!(*y_polls.borrow(), [0, 1]);
    }

    #[test]
    fn spawn_from_task_and_before_executor() {
        let h = Handle::new();
        let log = Rc::new(RefCell::new(Vec::new()));
        {
            let log = log.clone();
            h.spawn(async move { log.borrow_mut().push("early") });
        }
        let mut ex = Executor::new(h.clone());
        {
            let (h2, log) = (h.clone(), log.clone());
            ex.spawn(async move {
                let log2 = log.clone();
                let h3 = h2.clone();
                h2.spawn(async move {
                    for _ in 0..5 {
                        h3.yield_now().await;
                    }
                    log2.borrow_mut().push("child");
                });
                log.borrow_mut().push("parent");
            });
        }
        ex.run(&mut || false);
        assert_eq!(*log.borrow(), ["early", "parent", "child"]);
        assert_eq!(ex.live(), 0);
    }

    #[test]
    fn timers_fire_in_deadline_order() {
        let h = Handle::new();
        let order = Rc::new(RefCell::new(Vec::new()));
        let mut ex = Executor::new(h.clone());
        for (id, ms) in [(0, 3), (1, 1), (2, 2)] {
            let (h, order) = (h.clone(), order.clone());
            ex.spawn(async move {
                h.sleep(Duration::from_millis(ms)).await;
                order.borrow_mut().push(id);
            });
        }
        // Same deadline (both computed in the first round): registration order.
        for id in [3, 4] {
            let (h, order) = (h.clone(), order.clone());
            ex.spawn(async move {
                h.sleep_until(h.now() + Duration::from_millis(4)).await;
                order.borrow_mut().push(id);
            });
        }
        ex.run(&mut || false);
        assert_eq!(*order.borrow(), [1, 2, 0, 3, 4]);
        assert_eq!(h.timers(), 0);
    }

    #[test]
    fn dropped_sleep_removes_its_timer() {
        let h = Handle::new();
        let h2 = h.clone();
        block_on(&h, &mut || false, async move {
            let mut s = h2.sleep(Duration::from_secs(3600));
            assert!(!poll_once(&mut s).await);
            assert_eq!(h2.timers(), 1);
            // Re-polling does not add an entry.
            assert!(!poll_once(&mut s).await);
            assert_eq!(h2.timers(), 1);
            drop(s);
            assert_eq!(h2.timers(), 0);
        });
        assert_eq!(h.timers(), 0);
    }

    #[test]
    fn repolled_sleep_updates_its_waker() {
        let h = Handle::new();
        let mut s = h.sleep(Duration::from_millis(1));
        let a = Arc::new(CountWaker(AtomicUsize::new(0)));
        let b = Arc::new(CountWaker(AtomicUsize::new(0)));
        let (wa, wb) = (Waker::from(a.clone()), Waker::from(b.clone()));
        assert!(Pin::new(&mut s)
            .poll(&mut Context::from_waker(&wa))
            .is_pending());
        assert!(Pin::new(&mut s)
            .poll(&mut Context::from_waker(&wb))
            .is_pending());
        assert_eq!(h.timers(), 1);
        // No tasks: the rounds only fire timers.
        let mut ex = Executor::new(h.clone());
        ex.run_until(&mut || false, &mut || b.0.load(Ordering::SeqCst) > 0);
        assert_eq!(a.0.load(Ordering::SeqCst), 0);
        assert_eq!(b.0.load(Ordering::SeqCst), 1);
        assert_eq!(h.timers(), 0);
        assert!(Pin::new(&mut s)
            .poll(&mut Context::from_waker(&wb))
            .is_ready());
    }

    #[test]
    fn timeout_elapses_or_passes_output() {
        let h = Handle::new();
        let h2 = h.clone();
        block_on(&h, &mut || false, async move {
            let never = std::future::pending::<()>();
            let r = h2.timeout(h2.now() + Duration::from_millis(1), never).await;
            assert_eq!(r, Err(Elapsed));
            assert_eq!(h2.timers(), 0);

            let far = h2.now() + Duration::from_secs(3600);
            assert_eq!(h2.timeout(far, async { 5 }).await, Ok(5));
            assert_eq!(h2.timers(), 0);

            // Pending once (timer registered), then ready: the timer goes at once, even
            // while the Timeout itself is still alive.
            let h3 = h2.clone();
            let mut t = std::pin::pin!(h2.timeout(far, async move {
                h3.yield_now().await;
                7
            }));
            let polled = poll_fn(|cx| Poll::Ready(t.as_mut().poll(cx).is_ready())).await;
            assert!(!polled);
            assert_eq!(h2.timers(), 1);
            assert_eq!(t.as_mut().await, Ok(7));
            assert_eq!(h2.timers(), 0);
        });
    }

    #[test]
    fn wake_from_another_thread() {
        let h = Handle::new();
        let flag = Arc::new(AtomicBool::new(false));
        let slot: Arc<Mutex<Option<Waker>>> = Arc::default();
        let polls = Rc::new(Cell::new(0));
        let mut ex = Executor::new(h);
        {
            let (flag, slot) = (flag.clone(), slot.clone());
            ex.spawn(counted(
                polls.clone(),
                poll_fn(move |cx| {
                    if flag.load(Ordering::SeqCst) {
                        Poll::Ready(())
                    } else {
                        *slot.lock().unwrap() = Some(cx.waker().clone());
                        Poll::Pending
                    }
                }),
            ));
        }
        let t = std::thread::spawn(move || loop {
            if let Some(w) = slot.lock().unwrap().take() {
                flag.store(true, Ordering::SeqCst);
                w.wake();
                break;
            }
            std::thread::yield_now();
        });
        ex.run(&mut || false);
        t.join().unwrap();
        assert_eq!(polls.get(), 2);
    }

    #[test]
    fn stale_wake_after_slot_reuse_is_ignored() {
        let h = Handle::new();
        let mut ex = Executor::new(h);
        let stale: Rc<RefCell<Option<Waker>>> = Rc::default();
        {
            let stale = stale.clone();
            ex.spawn(poll_fn(move |cx| {
                *stale.borrow_mut() = Some(cx.waker().clone());
                Poll::Ready(())
            }));
        }
        ex.run(&mut || false);
        let stale = stale.borrow_mut().take().unwrap();
        // The new task reuses the slot.
        let gate = Rc::new(Gate::default());
        let polls = Rc::new(Cell::new(0));
        {
            let gate = gate.clone();
            ex.spawn(counted(polls.clone(), async move { gate.wait().await }));
        }
        assert_eq!(ex.slots.len(), 1);
        let calls = Cell::new(0);
        ex.run_until(
            &mut || {
                calls.set(calls.get() + 1);
                stale.wake_by_ref();
                false
            },
            &mut || calls.get() >= 5,
        );
        assert_eq!(polls.get(), 1);
        assert_eq!(ex.live(), 1);
        // A wake after the last task finished (slot freed, not reused) is harmless too.
        gate.open();
        ex.run(&mut || false);
        stale.wake();
        ex.run(&mut || false);
        assert_eq!(polls.get(), 2);
    }

    #[test]
    fn run_until_stops_with_tasks_left() {
        let h = Handle::new();
        let mut ex = Executor::new(h);
        for _ in 0..3 {
            ex.spawn(std::future::pending());
        }
        let mut rounds = 0;
        ex.run_until(&mut || false, &mut || {
            rounds += 1;
            rounds > 10
        });
        assert_eq!(ex.live(), 3);
        let s = ex.stats();
        assert_eq!(s.rounds, 10);
        assert_eq!(s.polls, 3);
        assert_eq!(s.idle_rounds, 9);
    }

    #[test]
    fn a_nested_executor_keeps_the_outer_executors_local_wakes() {
        let h = Handle::new();
        let mut ex = Executor::new(h.clone());
        let (b_sig, c_sig) = (Rc::new(Signal::default()), Rc::new(Signal::default()));
        let done = Rc::new(Cell::new(0u32));
        for sig in [b_sig.clone(), c_sig.clone()] {
            let done = done.clone();
            ex.spawn(async move {
                sig.wait(1).await;
                done.set(done.get() + 1);
            });
        }
        let (h2, d) = (h.clone(), done.clone());
        ex.spawn(async move {
            h2.yield_now().await; // B and C wait now
                                  // A wake from the outer executor's own thread: kept without the lock...
            b_sig.bump();
            // ...and put aside while a nested executor owns the thread; a wake of an
            // outer task from inside it goes through the outer executor's queue.
            let inner = Handle::new();
            let inner2 = inner.clone();
            let v = block_on(&inner, &mut || false, async move {
                inner2.yield_now().await;
                c_sig.bump();
                inner2.yield_now().await;
                7
            });
            assert_eq!(v, 7);
            d.set(d.get() + 10);
        });
        let mut rounds = 0;
        ex.run_until(&mut || false, &mut || {
            rounds += 1;
            rounds > 20 || done.get() == 12
        });
        assert_eq!(done.get(), 12, "a wake was lost across the nested executor");
        assert_eq!(ex.live(), 0);
    }

    #[test]
    fn block_on_returns_the_value() {
        let h = Handle::new();
        let h2 = h.clone();
        let v = block_on(&h, &mut || false, async move {
            h2.yield_now().await;
            h2.sleep(Duration::from_micros(10)).await;
            42
        });
        assert_eq!(v, 42);
        assert_eq!(h.timers(), 0);
    }
}
