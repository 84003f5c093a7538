//! TSO group: leader/follower combining of a process's concurrent timestamp requests
//! (Scythe, section 4.5 (2) and Fig. 18; the
//! shape of tikv's TSO batching: a FIFO of waiters, one request for all, `base + i` in
//! arrival order).
//!
//! Requests of coroutines of one thread and of threads of one process that overlap form a
//! group. The protocol:
//!
//! 1. A request that finds no range request in flight becomes a **leader** and closes its
//!    group at once (a group of one when the oracle is idle): no waiting for company.
//!    (With [`TsoGroup::with_limit`] `k`, a request leads while fewer than `k` are in
//!    flight; the thread tier, [`crate::ThreadTso`], lets two be in flight.)
//! 2. A request that finds one in flight joins the **open** group, in arrival order.
//! 3. When the in-flight range request returns, its leader hands `base + i` to the `i`-th
//!    member of its group, then closes the open group (if any) and wakes its members; the
//!    first of them to run leads it and takes one range of exactly the group's size (one
//!    FAA of `n`). Members arriving after that wait for the group after it. (Scythe makes
//!    the list's head the leader; letting whichever member runs first lead keeps a group
//!    from waiting for one particular thread to be scheduled, which on a machine with
//!    more busy threads than cores cost tso-bench's group mode most of its throughput.)
//!
//! **No prefetching, no caching.** Every timestamp comes from a range taken after its
//! request arrived: the closed group's members had all arrived when their leader took
//! the range. A leader that takes more than its group needs and serves later requests
//! from the surplus breaks real-time order (a request that starts after another
//! process's request finished could get a smaller timestamp); `crate::history`'s tests
//! show the checker catching exactly that.
//!
//! **Bounded wait.** A member waits for at most two range requests: the first of those
//! in flight when it arrived to return, and its own group's. No member is ever passed over: groups close
//! in arrival order, and the open group is closed as soon as the in-flight one returns.
//!
//! **No lost wake-ups.** The state lives under one mutex; a follower registers its waker
//! and checks its slot in the same critical section, and a leader fills slots and takes
//! the wakers in one critical section and wakes them after unlocking.
//!
//! [`GroupCore`] is the state machine (no IO, no locking, no clock); [`TsoGroup`] wraps it
//! in a mutex chosen by [`LockFamily`] (std's in production, loom's in the model checks of
//! `tests/loom_group.rs`) and runs the leader's range request, a caller-supplied async
//! closure (one-sided FAA on the oracle in [`crate::GroupedTso`]; a proxy RPC later).

use std::collections::VecDeque;
use std::future::Future;
use std::task::{Poll, Waker};

use crate::timestamp::Timestamp;

/// Identifies one request (member) within a group instance (opaque: its entry's index
/// and generation in the core's slab).
pub type MemberId = u64;

/// Why a member got no timestamp.
#[derive(Clone, Debug, thiserror::Error)]
pub enum GroupFailure<E> {
    /// The leader's range request (FAA or proxy RPC) failed; every member of its group
    /// gets this error.
    #[error("the TSO group leader's range request failed")]
    Take(#[source] E),
    /// The leader's future was dropped while its range request was in flight: whether
    /// the range was taken is unknown, so the group's members get no timestamp.
    #[error("the TSO group leader was cancelled with its range request in flight")]
    LeaderCancelled,
}

/// A closed group: its members in arrival order, and the one of them that leads it. Its
/// leader must pass it to [`GroupCore::complete`] exactly once.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a closed group must be completed, or its members wait forever"]
pub struct ClosedGroup {
    /// Members in arrival order, each with the timestamps it asked for.
    members: Vec<(MemberId, u64)>,
    leader: MemberId,
}

impl ClosedGroup {
    /// Timestamps the leader must take: the sum of its members' requests (one each for
    /// single requests; a thread-tier group asks for its own size, see [`LocalLock`]).
    pub fn size(&self) -> u64 {
        self.members.iter().map(|&(_, n)| n).sum()
    }

    /// The member that takes the group's range.
    pub fn leader(&self) -> MemberId {
        self.leader
    }
}

/// What [`GroupCore::join`] made of a new request.
#[derive(Debug, PartialEq, Eq)]
pub enum Joined {
    /// No range request was in flight: lead this group (of one) now.
    Lead(MemberId, ClosedGroup),
    /// A range request is in flight: wait in the open group ([`GroupCore::poll`]).
    Follow(MemberId),
}

/// What [`GroupCore::poll`] found for a waiting member.
#[derive(Debug)]
pub enum Polled<E> {
    /// Still waiting (the waker was registered).
    Pending,
    /// The member leads its group now: take the group's range, then complete it.
    Lead(ClosedGroup),
    /// The member's timestamp, or why it has none. The member is gone from the core.
    Done(Result<Timestamp, GroupFailure<E>>),
}

/// Counters of a group instance.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupStats {
    /// Groups completed (range requests issued and returned).
    pub groups: u64,
    /// Timestamps handed out by completed groups (one per member for single requests;
    /// a member asking for `n` counts `n`).
    pub members: u64,
}

impl GroupStats {
    /// Mean timestamps per range request; 0 before the first group.
    pub fn mean_group_size(&self) -> f64 {
        if self.groups == 0 {
            0.0
        } else {
            self.members as f64 / self.groups as f64
        }
    }
}

enum Slot<E> {
    /// In the open group or a closed one, waiting for its timestamp or a promotion; with
    /// the number of the batch (open group) it joined.
    Waiting(Option<Waker>, u64),
    /// Leading (its range request is in flight).
    Leading,
    /// Has its result, not yet seen by the member.
    Done(Result<Timestamp, GroupFailure<E>>),
    /// The member's future was dropped while it waited; its result is discarded.
    Abandoned,
}

/// The combining state machine of one group instance: plain data, no locking, no IO.
/// Wakers it returns are to be woken after the caller's lock is released.
pub struct GroupCore<E> {
    /// Range requests in flight (groups led, and closed groups awaiting their leader).
    in_flight: usize,
    /// Most range requests in flight at once (1: Scythe's one group at a time).
    limit: usize,
    /// The open group, in arrival order, with each member's count. Non-empty only while
    /// `in_flight == limit`.
    open: Vec<(MemberId, u64)>,
    /// Closed groups whose range nobody has started to take yet, with their batch
    /// numbers: the first of a group's members to poll leads it (whichever thread runs
    /// first, so that a group never waits for one particular thread to be scheduled).
    /// Each counts as in flight.
    pending: VecDeque<(u64, Vec<(MemberId, u64)>)>,
    /// Batch number of the open group: members record it when they join, so a member
    /// finds out that its group was closed and awaits a leader without scanning it.
    open_batch: u64,
    /// Members, in a slab: a member id is its entry's index (low 32 bits) and the
    /// entry's generation (high 32 bits), bumped when the member leaves, so a lookup is an
    /// index and a compare, not a hash, and a stale id finds nothing.
    slots: Vec<Entry<E>>,
    /// Free entries, last freed first.
    free: Vec<u32>,
    stats: GroupStats,
}

struct Entry<E> {
    generation: u32,
    slot: Option<Slot<E>>,
}

impl<E> Default for GroupCore<E> {
    fn default() -> Self {
        Self::with_limit(1)
    }
}

impl<E> GroupCore<E> {
    /// An idle core letting up to `limit` (at least 1) range requests be in flight at
    /// once: a request that finds fewer in flight leads at once, so with few concurrent
    /// requests nobody waits for another's range; with many, groups form as with one.
    pub fn with_limit(limit: usize) -> Self {
        Self {
            in_flight: 0,
            limit: limit.max(1),
            open: Vec::new(),
            pending: VecDeque::new(),
            open_batch: 0,
            slots: Vec::new(),
            free: Vec::new(),
            stats: GroupStats::default(),
        }
    }
}

impl<E> GroupCore<E> {
    /// A new member in `slot`; returns its id.
    fn add(&mut self, slot: Slot<E>) -> MemberId {
        let idx = match self.free.pop() {
            Some(i) => i as usize,
            None => {
                let i = self.slots.len();
                assert!(i < u32::MAX as usize, "fewer than 2^32 members at once");
                self.slots.push(Entry {
                    generation: 0,
                    slot: None,
                });
                i
            }
        };
        let e = &mut self.slots[idx];
        e.slot = Some(slot);
        (u64::from(e.generation) << 32) | idx as u64
    }

    /// The entry of member `id`, if it is still one.
    fn entry(&mut self, id: MemberId) -> Option<&mut Option<Slot<E>>> {
        let e = self.slots.get_mut((id & u64::from(u32::MAX)) as usize)?;
        (u64::from(e.generation) == id >> 32 && e.slot.is_some()).then_some(&mut e.slot)
    }

    /// The slot of member `id`.
    fn slot(&mut self, id: MemberId) -> Option<&mut Slot<E>> {
        self.entry(id)?.as_mut()
    }

    /// Member `id` leaves: its slot is returned and its entry freed under a new
    /// generation.
    fn remove(&mut self, id: MemberId) -> Option<Slot<E>> {
        let s = self.entry(id)?.take()?;
        let idx = (id & u64::from(u32::MAX)) as usize;
        let e = &mut self.slots[idx];
        e.generation = e.generation.wrapping_add(1);
        self.free.push(idx as u32);
        Some(s)
    }
}

impl<E: Clone> GroupCore<E> {
    /// A request for one timestamp arrives ([`GroupCore::join_n`] with 1).
    pub fn join(&mut self) -> Joined {
        self.join_n(1)
    }

    /// A request for `n >= 1` consecutive timestamps arrives: it leads a group of one if
    /// no range request is in flight, else it joins the open group. Its result is the
    /// first of its `n`.
    pub fn join_n(&mut self, n: u64) -> Joined {
        debug_assert!(n >= 1);
        if self.in_flight >= self.limit {
            let id = self.add(Slot::Waiting(None, self.open_batch));
            self.open.push((id, n));
            Joined::Follow(id)
        } else {
            debug_assert!(self.open.is_empty());
            self.in_flight += 1;
            let id = self.add(Slot::Leading);
            Joined::Lead(
                id,
                ClosedGroup {
                    members: vec![(id, n)],
                    leader: id,
                },
            )
        }
    }

    /// A waiting member looks at its slot; with `waker`, it is registered to be woken
    /// when the slot changes.
    ///
    /// Panics if `id` is not a waiting member (a caller bug).
    pub fn poll(&mut self, id: MemberId, waker: Option<&Waker>) -> Polled<E> {
        // In a closed group nobody leads yet (found by batch number, not by member).
        let batch = match self.slot(id).expect("poll of an unknown member") {
            Slot::Waiting(_, batch) => Some(*batch),
            _ => None,
        };
        let pending = batch.and_then(|batch| self.pending.iter().position(|&(b, _)| b == batch));
        let slot = self.slot(id).expect("checked");
        match slot {
            Slot::Waiting(..) if pending.is_some() => {
                *slot = Slot::Leading;
                let (_, members) = self
                    .pending
                    .remove(pending.expect("checked"))
                    .expect("in range");
                Polled::Lead(ClosedGroup {
                    members,
                    leader: id,
                })
            }
            Slot::Waiting(w, _) => {
                if let Some(new) = waker {
                    match w {
                        Some(old) if old.will_wake(new) => {}
                        _ => *w = Some(new.clone()),
                    }
                }
                Polled::Pending
            }
            Slot::Done(_) => match self.remove(id) {
                Some(Slot::Done(r)) => Polled::Done(r),
                _ => unreachable!(),
            },
            Slot::Leading | Slot::Abandoned => panic!("poll of a member that is not waiting"),
        }
    }

    /// The leader's range request for `group` returned `first` (the first of
    /// `group.size()` consecutive timestamps) or failed. Hands each member the first of
    /// its range, `first` plus the counts of the members before it (`first + i` for the
    /// `i`-th when each asked for one), closes the open group and lets the first of its
    /// members to poll lead it.
    /// Returns the leader's
    /// own result and the wakers to wake once the lock is released.
    pub fn complete(
        &mut self,
        group: ClosedGroup,
        first: Result<Timestamp, GroupFailure<E>>,
    ) -> (Result<Timestamp, GroupFailure<E>>, Vec<Waker>) {
        debug_assert!(self.in_flight > 0);
        let mut wakers = Vec::with_capacity(group.members.len());
        self.stats.groups += 1;
        self.stats.members += group.size();
        let leader = group.leader();
        let mut mine = None;
        let mut offset = 0u64;
        for (id, n) in group.members {
            let r = first.clone().map(|t| Timestamp(t.0 + offset));
            offset += n;
            if id == leader {
                self.remove(id);
                mine = Some(r);
                continue;
            }
            let slot = self.slot(id);
            match slot.map(|s| std::mem::replace(s, Slot::Done(r))) {
                Some(Slot::Waiting(w, _)) => wakers.extend(w),
                Some(Slot::Abandoned) => {
                    self.remove(id);
                }
                _ => unreachable!("a closed group's follower is waiting or abandoned"),
            }
        }
        self.in_flight -= 1;
        self.start_next(&mut wakers);
        (mine.expect("the leader is a member"), wakers)
    }

    /// A waiting member's future was dropped. Its timestamp, if one comes, is discarded;
    /// if it is in the open group or a closed group nobody leads yet, it leaves it without
    /// costing a timestamp. Returns wakers to wake once the lock is released.
    pub fn abandon(&mut self, id: MemberId) -> Vec<Waker> {
        let mut wakers = Vec::new();
        match self.slot(id) {
            Some(Slot::Waiting(..)) => {
                if let Some(pos) = self.open.iter().position(|&(m, _)| m == id) {
                    // Not in a closed group yet.
                    self.open.remove(pos);
                    self.remove(id);
                } else if let Some(pos) = self
                    .pending
                    .iter()
                    .position(|(_, p)| p.iter().any(|&(m, _)| m == id))
                {
                    // In a closed group whose range is not taken yet.
                    self.remove(id);
                    let p = &mut self.pending[pos].1;
                    p.retain(|&(m, _)| m != id);
                    if p.is_empty() {
                        self.pending.remove(pos);
                        self.in_flight -= 1;
                        self.start_next(&mut wakers);
                    }
                } else {
                    // Its group's range is being taken: the timestamp will be discarded
                    // (`complete` frees the entry).
                    *self.slot(id).expect("checked") = Slot::Abandoned;
                }
            }
            Some(Slot::Done(_)) => {
                self.remove(id);
            }
            None => {}
            Some(Slot::Leading) | Some(Slot::Abandoned) => {
                panic!("abandon of a member that is not waiting")
            }
        }
        wakers
    }

    /// Counters so far.
    pub fn stats(&self) -> GroupStats {
        self.stats
    }

    /// Members waiting in the open group (for tests and diagnostics).
    pub fn open_len(&self) -> usize {
        self.open.len()
    }

    /// Whether a range request is in flight.
    pub fn in_flight(&self) -> bool {
        self.in_flight > 0
    }

    /// Below the limit: close the open group and wake its members; the first to poll
    /// leads it.
    fn start_next(&mut self, wakers: &mut Vec<Waker>) {
        debug_assert!(self.in_flight < self.limit);
        if self.open.is_empty() {
            return;
        }
        let members = std::mem::take(&mut self.open);
        for (m, _) in &members {
            if let Some(Slot::Waiting(w, _)) = self.slot(*m) {
                wakers.extend(w.take());
            }
        }
        self.pending.push_back((self.open_batch, members));
        self.open_batch += 1;
        self.in_flight += 1;
    }
}

/// The kind of mutex a [`TsoGroup`] keeps its [`GroupCore`] in: [`StdLock`] for the
/// process tier (threads), [`LocalLock`] for the thread tier (coroutines of one thread);
/// the loom model checks supply loom's. A group is `Sync` exactly when its lock is.
pub trait LockFamily: 'static {
    /// The mutex type.
    type Lock<T: Send>;
    /// A mutex holding `t`.
    fn new<T: Send>(t: T) -> Self::Lock<T>;
    /// Run `f` under the lock.
    fn with<T: Send, R>(lock: &Self::Lock<T>, f: impl FnOnce(&mut T) -> R) -> R;
}

/// `std::sync::Mutex` (a poisoned lock is taken over: the core's invariants hold between
/// its calls, none of which panics short of a caller bug).
#[derive(Debug)]
pub struct StdLock;

impl LockFamily for StdLock {
    type Lock<T: Send> = std::sync::Mutex<T>;

    fn new<T: Send>(t: T) -> Self::Lock<T> {
        std::sync::Mutex::new(t)
    }

    fn with<T: Send, R>(lock: &Self::Lock<T>, f: impl FnOnce(&mut T) -> R) -> R {
        f(&mut lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}

/// A `RefCell`: the thread tier's lock. A [`TsoGroup`] over it is `!Sync`, so only the
/// coroutines of one thread share it, and their combining needs no atomic instruction
/// (no cache line moves between cores): [`crate::ThreadTso`].
#[derive(Debug)]
pub struct LocalLock;

impl LockFamily for LocalLock {
    type Lock<T: Send> = std::cell::RefCell<T>;

    fn new<T: Send>(t: T) -> Self::Lock<T> {
        std::cell::RefCell::new(t)
    }

    fn with<T: Send, R>(lock: &Self::Lock<T>, f: impl FnOnce(&mut T) -> R) -> R {
        // Never re-entered: the core's calls do not call back, and wakers are woken
        // after `f` returns.
        f(&mut lock.borrow_mut())
    }
}

/// A TSO group shared by the threads (and their coroutines) of a process: `Send + Sync`,
/// put it in an `Arc`. `E` is the error of the range request.
pub struct TsoGroup<E: Send, L: LockFamily = StdLock> {
    core: L::Lock<GroupCore<E>>,
    /// Test-only protocol break: leaders take this many extra timestamps and later
    /// requests are served from the surplus (the prefetching the protocol forbids).
    #[cfg(any(test, feature = "fault-injection"))]
    prefetch: Option<Prefetch>,
}

/// The surplus of a prefetching (broken) leader: `extra` per range, cached.
#[cfg(any(test, feature = "fault-injection"))]
struct Prefetch {
    extra: u64,
    cache: std::sync::Mutex<std::collections::VecDeque<Timestamp>>,
}

impl<E: Clone + Send, L: LockFamily> Default for TsoGroup<E, L> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E: Clone + Send, L: LockFamily> TsoGroup<E, L> {
    /// An idle group instance, one range request in flight at a time.
    pub fn new() -> Self {
        Self::with_limit(1)
    }

    /// An idle group instance letting up to `limit` range requests be in flight at once
    /// ([`GroupCore::with_limit`]).
    pub fn with_limit(limit: usize) -> Self {
        Self {
            core: L::new(GroupCore::with_limit(limit)),
            #[cfg(any(test, feature = "fault-injection"))]
            prefetch: None,
        }
    }

    /// **Broken on purpose** (test builds and feature `fault-injection` only): a group
    /// whose leaders take `extra` timestamps more than their group needs and serve later
    /// requests from the surplus without a range request. Timestamps stay unique but a
    /// request can get a timestamp older than one another client already received, which
    /// the linearizability checker ([`crate::history`]) must report.
    #[cfg(any(test, feature = "fault-injection"))]
    pub fn prefetching(extra: u64) -> Self {
        Self {
            prefetch: Some(Prefetch {
                extra,
                cache: Default::default(),
            }),
            ..Self::new()
        }
    }

    /// Counters so far (mean group size = members / groups).
    pub fn stats(&self) -> GroupStats {
        L::with(&self.core, |c| c.stats())
    }

    /// One timestamp through the group. If this request leads, it calls `take(n)` once,
    /// which must take `n` consecutive timestamps *now* (one FAA of `n`, or a proxy
    /// request) and return the first; otherwise it waits for its leader (at most the
    /// in-flight range request and its own group's).
    ///
    /// Errors: [`GroupFailure::Take`] when the leader's `take` failed,
    /// [`GroupFailure::LeaderCancelled`] when the leader's future was dropped mid-take.
    pub async fn take<F, Fut>(&self, take: F) -> Result<Timestamp, GroupFailure<E>>
    where
        F: FnOnce(u64) -> Fut,
        Fut: Future<Output = Result<Timestamp, E>>,
    {
        self.take_n(1, take).await
    }

    /// `n >= 1` consecutive timestamps through the group (one member asking for `n`):
    /// returns the first. A thread-tier leader asks the process tier for its group's size
    /// this way. `take` as in [`TsoGroup::take`]; the leader's range covers every
    /// member's count.
    ///
    /// Errors as [`TsoGroup::take`]. Panics if `n == 0`.
    pub async fn take_n<F, Fut>(&self, n: u64, take: F) -> Result<Timestamp, GroupFailure<E>>
    where
        F: FnOnce(u64) -> Fut,
        Fut: Future<Output = Result<Timestamp, E>>,
    {
        assert!(n >= 1, "take_n of zero timestamps");
        #[cfg(any(test, feature = "fault-injection"))]
        if let Some(p) = &self.prefetch {
            // The surplus is one consecutive range: `n` from its front are consecutive.
            let mut c = p.cache.lock().unwrap();
            if c.len() as u64 >= n {
                let first = c.pop_front().expect("n >= 1");
                c.drain(..(n - 1) as usize);
                return Ok(first);
            }
        }
        let (id, group) = match L::with(&self.core, |c| c.join_n(n)) {
            Joined::Lead(id, g) => (id, g),
            Joined::Follow(id) => {
                let mut waiting = Waiting {
                    group: self,
                    id: Some(id),
                };
                let polled = std::future::poll_fn(|cx| {
                    match L::with(&self.core, |c| c.poll(id, Some(cx.waker()))) {
                        Polled::Pending => Poll::Pending,
                        other => Poll::Ready(other),
                    }
                })
                .await;
                waiting.id = None;
                match polled {
                    Polled::Done(r) => return r,
                    Polled::Lead(g) => (id, g),
                    Polled::Pending => unreachable!(),
                }
            }
        };
        debug_assert_eq!(group.leader(), id);
        let n = group.size();
        let mut leading = Leading {
            group: self,
            closed: Some(group),
        };
        #[cfg(any(test, feature = "fault-injection"))]
        if let Some(p) = &self.prefetch {
            let first = take(n + p.extra).await.map_err(GroupFailure::Take);
            if let Ok(t) = &first {
                let surplus = (n..n + p.extra).map(|i| Timestamp(t.0 + i));
                p.cache.lock().unwrap().extend(surplus);
            }
            let closed = leading.closed.take().expect("completed once");
            let (mine, wakers) = L::with(&self.core, |c| c.complete(closed, first));
            wakers.into_iter().for_each(Waker::wake);
            return mine;
        }
        let first = take(n).await.map_err(GroupFailure::Take);
        let closed = leading.closed.take().expect("completed once");
        let (mine, wakers) = L::with(&self.core, |c| c.complete(closed, first));
        wakers.into_iter().for_each(Waker::wake);
        mine
    }
}

/// A follower's registration; dropping it before the result arrived abandons the slot.
struct Waiting<'a, E: Clone + Send, L: LockFamily> {
    group: &'a TsoGroup<E, L>,
    id: Option<MemberId>,
}

impl<E: Clone + Send, L: LockFamily> Drop for Waiting<'_, E, L> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            let wakers = L::with(&self.group.core, |c| c.abandon(id));
            wakers.into_iter().for_each(Waker::wake);
        }
    }
}

/// A leader's closed group; dropping it before the range returned fails the group with
/// [`GroupFailure::LeaderCancelled`] so that no member waits forever.
struct Leading<'a, E: Clone + Send, L: LockFamily> {
    group: &'a TsoGroup<E, L>,
    closed: Option<ClosedGroup>,
}

impl<E: Clone + Send, L: LockFamily> Drop for Leading<'_, E, L> {
    fn drop(&mut self) {
        if let Some(g) = self.closed.take() {
            let (_, wakers) = L::with(&self.group.core, |c| {
                c.complete(g, Err(GroupFailure::LeaderCancelled))
            });
            wakers.into_iter().for_each(Waker::wake);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Wake};

    type Core = GroupCore<&'static str>;

    fn ts(r: Result<Timestamp, GroupFailure<&'static str>>) -> u64 {
        r.unwrap().get()
    }

    fn done(c: &mut Core, id: MemberId) -> Result<Timestamp, GroupFailure<&'static str>> {
        match c.poll(id, None) {
            Polled::Done(r) => r,
            other => panic!("member {id} not done: {other:?}"),
        }
    }

    fn lead(c: &mut Core, id: MemberId) -> ClosedGroup {
        match c.poll(id, None) {
            Polled::Lead(g) => g,
            other => panic!("member {id} not promoted: {other:?}"),
        }
    }

    #[test]
    fn a_finished_members_entry_is_reused_under_a_new_id() {
        let mut c = Core::default();
        let Joined::Lead(a, ga) = c.join() else {
            panic!()
        };
        let Joined::Follow(b) = c.join() else {
            panic!()
        };
        // `b` gives up while `a`'s range is being taken: its entry stays until the
        // group completes, then is freed, and its timestamp is discarded.
        let Joined::Follow(x) = c.join() else {
            panic!()
        };
        let _ = c.complete(ga, Ok(Timestamp(10)));
        let g = lead(&mut c, b);
        c.abandon(x);
        let (r, _) = c.complete(g, Ok(Timestamp(20)));
        assert_eq!(ts(r), 20);
        assert_eq!(entries_in_use(&c), 0);
        // Every entry is free again: the next members reuse them under other ids.
        let Joined::Lead(d, gd) = c.join() else {
            panic!()
        };
        assert!(![a, b, x].contains(&d), "a reused entry gets a new id");
        let Joined::Follow(e) = c.join() else {
            panic!()
        };
        assert!(![a, b, x].contains(&e));
        let _ = c.complete(gd, Ok(Timestamp(30)));
        let ge = lead(&mut c, e);
        let _ = c.complete(ge, Ok(Timestamp(31)));
    }

    /// Entries in use (members the core still knows).
    fn entries_in_use(c: &Core) -> usize {
        c.slots.iter().filter(|e| e.slot.is_some()).count()
    }

    #[test]
    fn an_idle_group_lets_the_first_request_lead_alone() {
        let mut c = Core::default();
        let Joined::Lead(a, g) = c.join() else {
            panic!("first request must lead")
        };
        assert_eq!((g.size(), g.leader()), (1, a));
        assert!(c.in_flight());
        let (r, w) = c.complete(g, Ok(Timestamp(7)));
        assert_eq!((ts(r), w.len()), (7, 0));
        assert!(!c.in_flight());
        assert_eq!(
            c.stats(),
            GroupStats {
                groups: 1,
                members: 1
            }
        );
    }

    #[test]
    fn followers_get_base_plus_arrival_index_and_late_ones_wait_for_the_next_group() {
        let mut c = Core::default();
        let Joined::Lead(a, ga) = c.join() else {
            panic!()
        };
        let ids: Vec<MemberId> = (0..3)
            .map(|_| match c.join() {
                Joined::Follow(id) => id,
                j => panic!("{j:?}"),
            })
            .collect();
        assert!(matches!(c.poll(ids[0], None), Polled::Pending));
        // A's range returns: A gets its own; the open group (3) closes under ids[0].
        let (r, _) = c.complete(ga, Ok(Timestamp(100)));
        assert_eq!(ts(r), 100);
        assert_eq!(c.open_len(), 0);
        let g = lead(&mut c, ids[0]);
        assert_eq!(g.size(), 3, "one FAA of the group's size at closing");
        // A late arrival joins the next group, not the closed one.
        let Joined::Follow(late) = c.join() else {
            panic!()
        };
        assert!(matches!(c.poll(ids[1], None), Polled::Pending));
        let (r, _) = c.complete(g, Ok(Timestamp(200)));
        assert_eq!(ts(r), 200);
        assert_eq!(ts(done(&mut c, ids[1])), 201);
        assert_eq!(ts(done(&mut c, ids[2])), 202);
        // Bounded wait: the late one waited for the in-flight range and now leads its own.
        let g = lead(&mut c, late);
        assert_eq!(g.size(), 1);
        let (r, _) = c.complete(g, Ok(Timestamp(300)));
        assert_eq!(ts(r), 300);
        assert!(!c.in_flight());
        assert_eq!(
            c.stats(),
            GroupStats {
                groups: 3,
                members: 5
            }
        );
        assert!((c.stats().mean_group_size() - 5.0 / 3.0).abs() < 1e-9);
        let _ = a;
    }

    #[test]
    fn a_failed_range_fails_the_whole_group_and_the_next_group_still_runs() {
        let mut c = Core::default();
        let Joined::Lead(_, g1) = c.join() else {
            panic!()
        };
        let Joined::Follow(b) = c.join() else {
            panic!()
        };
        let (r, _) = c.complete(g1, Err(GroupFailure::Take("qp gone")));
        assert!(matches!(r, Err(GroupFailure::Take("qp gone"))));
        let g2 = lead(&mut c, b);
        let Joined::Follow(x) = c.join() else {
            panic!()
        };
        let (r, _) = c.complete(g2, Err(GroupFailure::LeaderCancelled));
        assert!(matches!(r, Err(GroupFailure::LeaderCancelled)));
        let g3 = lead(&mut c, x);
        let Joined::Follow(y) = c.join() else {
            panic!()
        };
        let (_, _) = c.complete(g3, Ok(Timestamp(1)));
        let g4 = lead(&mut c, y);
        let Joined::Follow(z) = c.join() else {
            panic!()
        };
        let _ = c.abandon(z);
        let (r, _) = c.complete(g4, Err(GroupFailure::Take("x")));
        assert!(r.is_err());
        assert!(!c.in_flight());
    }

    #[test]
    fn abandoning_costs_no_timestamp_in_the_open_group_and_passes_on_leadership() {
        let mut c = Core::default();
        let Joined::Lead(_, g) = c.join() else {
            panic!()
        };
        let [b, d, e] = [0; 3].map(|_| match c.join() {
            Joined::Follow(id) => id,
            j => panic!("{j:?}"),
        });
        // b leaves while in the open group: not counted in the next FAA.
        assert!(c.abandon(b).is_empty());
        let _ = c.complete(g, Ok(Timestamp(10)));
        let g = lead(&mut c, d);
        assert_eq!(g.size(), 2);
        let _ = c.complete(g, Ok(Timestamp(20)));
        assert_eq!(ts(done(&mut c, e)), 21);

        // A promoted member that leaves passes the group on to the next live member.
        let Joined::Lead(_, g) = c.join() else {
            panic!()
        };
        let [p, q, r] = [0; 3].map(|_| match c.join() {
            Joined::Follow(id) => id,
            j => panic!("{j:?}"),
        });
        let _ = c.complete(g, Ok(Timestamp(30)));
        // q leaves after its group closed: its slot is discarded, not reused.
        let _ = c.abandon(q);
        // p was promoted (not yet seen) and leaves: r leads the rest.
        let _ = c.abandon(p);
        let g = lead(&mut c, r);
        assert_eq!((g.size(), g.leader()), (1, r));
        let Joined::Follow(s) = c.join() else {
            panic!()
        };
        let (t, _) = c.complete(g, Ok(Timestamp(40)));
        assert_eq!(ts(t), 40);
        // The sole member of a promoted group leaves: the open group is promoted.
        let Joined::Follow(u) = c.join() else {
            panic!()
        };
        let _ = c.abandon(s);
        let _ = u;
        assert!(c.in_flight());
        let Joined::Follow(_) = c.join() else {
            panic!()
        };
        let g = lead(&mut c, u);
        assert_eq!(g.size(), 1, "the open group {{u}} was promoted when s left");
    }

    /// Blocks a std thread on a future, parking until woken (a real waker, so a lost
    /// wake-up hangs; the test's watchdog turns that into a failure).
    pub(crate) fn block_on<F: Future>(f: F) -> F::Output {
        struct Unpark(std::thread::Thread);
        impl Wake for Unpark {
            fn wake(self: Arc<Self>) {
                self.0.unpark();
            }
        }
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        let mut f = std::pin::pin!(f);
        loop {
            if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                return v;
            }
            std::thread::park_timeout(std::time::Duration::from_secs(1));
        }
    }

    /// Runs `f` on a thread; fails (instead of hanging) if it is not done in 60 s.
    pub(crate) fn with_watchdog<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(std::time::Duration::from_secs(60))
            .expect("watchdog: the test did not finish (lost wake-up or deadlock)")
    }

    #[test]
    fn threads_get_unique_contiguous_timestamps_through_one_group() {
        const THREADS: u64 = 4;
        const EACH: u64 = 2000;
        let (all, stats) = with_watchdog(|| {
            let group = Arc::new(TsoGroup::<&'static str>::new());
            let counter = Arc::new(AtomicU64::new(0));
            let hs: Vec<_> = (0..THREADS)
                .map(|_| {
                    let (group, counter) = (group.clone(), counter.clone());
                    std::thread::spawn(move || {
                        (0..EACH)
                            .map(|_| {
                                let t = block_on(group.take(|n| {
                                    let c = counter.clone();
                                    async move {
                                        std::thread::yield_now();
                                        Ok(Timestamp(c.fetch_add(n, Ordering::SeqCst) + 1))
                                    }
                                }));
                                t.unwrap().get()
                            })
                            .collect::<Vec<u64>>()
                    })
                })
                .collect();
            let all: Vec<Vec<u64>> = hs.into_iter().map(|h| h.join().unwrap()).collect();
            (all, group.stats())
        });
        for mine in &all {
            assert!(
                mine.windows(2).all(|w| w[0] < w[1]),
                "per thread increasing"
            );
        }
        let mut flat: Vec<u64> = all.concat();
        flat.sort_unstable();
        assert_eq!(flat, (1..=THREADS * EACH).collect::<Vec<u64>>());
        assert_eq!(stats.members, THREADS * EACH);
        assert!(stats.groups <= stats.members);
    }

    #[test]
    fn with_a_limit_of_two_the_second_request_leads_and_the_third_waits() {
        let mut c = Core::with_limit(2);
        let Joined::Lead(_, g1) = c.join() else {
            panic!("first leads")
        };
        let Joined::Lead(_, g2) = c.join() else {
            panic!("second leads: one range in flight is below the limit")
        };
        let [x, y] = [0; 2].map(|_| match c.join() {
            Joined::Follow(id) => id,
            j => panic!("{j:?}"),
        });
        // The second range returns first: the open group closes behind it.
        let (r, _) = c.complete(g2, Ok(Timestamp(20)));
        assert_eq!(ts(r), 20);
        let Joined::Follow(z) = c.join() else {
            panic!("x and y's closed group and g1 fill the limit")
        };
        let g = lead(&mut c, y);
        assert_eq!(g.size(), 2);
        let (r, _) = c.complete(g1, Ok(Timestamp(10)));
        assert_eq!(ts(r), 10);
        let gz = lead(&mut c, z);
        assert_eq!(gz.size(), 1);
        let (r, _) = c.complete(g, Ok(Timestamp(30)));
        assert_eq!(ts(r), 31, "y leads; x arrived first and gets the first");
        assert_eq!(ts(done(&mut c, x)), 30);
        let (r, _) = c.complete(gz, Ok(Timestamp(40)));
        assert_eq!(ts(r), 40);
        assert!(!c.in_flight());
        assert_eq!(c.stats().groups, 4);
    }

    #[test]
    fn counted_members_get_the_first_of_their_own_range() {
        let mut c = Core::default();
        let Joined::Lead(_, g) = c.join_n(3) else {
            panic!()
        };
        assert_eq!(g.size(), 3);
        let Joined::Follow(b) = c.join_n(5) else {
            panic!()
        };
        let Joined::Follow(d) = c.join() else {
            panic!()
        };
        let Joined::Follow(e) = c.join_n(2) else {
            panic!()
        };
        let (r, _) = c.complete(g, Ok(Timestamp(10)));
        assert_eq!(ts(r), 10);
        let g = lead(&mut c, b);
        assert_eq!(g.size(), 8, "one FAA covering every member's count");
        // d leaves once its group's leader has it: its timestamp is discarded, and e's
        // range stays where the leader's FAA of 8 puts it.
        let _ = c.abandon(d);
        assert_eq!(g.size(), 8);
        let (r, _) = c.complete(g, Ok(Timestamp(100)));
        assert_eq!(ts(r), 100, "b: 100..105");
        assert_eq!(
            ts(done(&mut c, e)),
            106,
            "e after b's 5 and d's 1: 106..108"
        );
        assert_eq!(c.stats().members, 3 + 8);
    }

    /// The thread tier: coroutines of one thread combine in a `LocalLock` group whose
    /// leader asks the process group for its whole group's count.
    #[test]
    fn thread_tier_groups_combine_into_one_process_request() {
        let process = TsoGroup::<&'static str>::new();
        let local = TsoGroup::<&'static str, LocalLock>::new();
        let counter = AtomicU64::new(0);
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let gate = std::cell::RefCell::new(Some(rx));
        let take = |n: u64| {
            let (process, counter, gate) = (&process, &counter, &gate);
            async move {
                process
                    .take_n(n, |m| async move {
                        // The first range request waits for the gate: the others pile up.
                        let rx = gate.borrow_mut().take();
                        if let Some(rx) = rx {
                            std::future::poll_fn(|_| match rx.try_recv() {
                                Ok(()) => Poll::Ready(()),
                                Err(_) => Poll::Pending,
                            })
                            .await;
                        }
                        Ok(Timestamp(counter.fetch_add(m, Ordering::SeqCst) + 1))
                    })
                    .await
                    .map_err(|_| "process tier failed")
            }
        };
        let mut futs: Vec<_> = (0..5).map(|_| Box::pin(local.take(take))).collect();
        for f in futs.iter_mut() {
            assert!(f.as_mut().poll(&mut cx).is_pending());
        }
        tx.send(()).unwrap();
        let mut got = vec![None; 5];
        for _ in 0..4 {
            for (i, f) in futs.iter_mut().enumerate() {
                if got[i].is_none() {
                    if let Poll::Ready(r) = f.as_mut().poll(&mut cx) {
                        got[i] = Some(r.unwrap().get());
                    }
                }
            }
        }
        let got: Vec<u64> = got.into_iter().map(Option::unwrap).collect();
        assert_eq!(got, vec![1, 2, 3, 4, 5], "arrival order, contiguous");
        assert_eq!(
            local.stats(),
            GroupStats {
                groups: 2,
                members: 5
            }
        );
        assert_eq!(
            process.stats(),
            GroupStats {
                groups: 2,
                members: 5
            },
            "one process request (and one FAA) per thread group: 1, then the other 4"
        );
    }

    #[test]
    fn a_leader_dropped_mid_take_fails_its_followers_instead_of_stranding_them() {
        let group = TsoGroup::<&'static str>::new();
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut first = Box::pin(group.take(|_| async { Ok(Timestamp(1)) }));
        // The first request completes at once; make one that stays in flight instead.
        assert!(matches!(
            first.as_mut().poll(&mut cx),
            Poll::Ready(Ok(Timestamp(1)))
        ));
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let gate = std::future::poll_fn(move |_| match rx.try_recv() {
            Ok(()) => Poll::Ready(Ok(Timestamp(10))),
            Err(_) => Poll::Pending,
        });
        let mut l1 = Box::pin(group.take(|_| gate));
        assert!(l1.as_mut().poll(&mut cx).is_pending());
        // Two followers form the next group; the first of them will lead it and hang.
        let never = std::future::pending::<Result<Timestamp, &'static str>>();
        let mut f1 = Box::pin(group.take(|_| never));
        let mut f2 = Box::pin(group.take(|_| async { Ok(Timestamp(99)) }));
        assert!(f1.as_mut().poll(&mut cx).is_pending());
        assert!(f2.as_mut().poll(&mut cx).is_pending());
        tx.send(()).unwrap();
        assert!(matches!(
            l1.as_mut().poll(&mut cx),
            Poll::Ready(Ok(Timestamp(10)))
        ));
        assert!(
            f1.as_mut().poll(&mut cx).is_pending(),
            "f1 leads, its take hangs"
        );
        assert!(f2.as_mut().poll(&mut cx).is_pending());
        drop(f1);
        match f2.as_mut().poll(&mut cx) {
            Poll::Ready(Err(GroupFailure::LeaderCancelled)) => {}
            other => panic!("{other:?}"),
        }
        // The group is usable afterwards.
        let mut next = Box::pin(group.take(|n| async move { Ok(Timestamp(50 + n)) }));
        assert!(matches!(
            next.as_mut().poll(&mut cx),
            Poll::Ready(Ok(Timestamp(51)))
        ));
    }

    #[test]
    fn a_follower_dropped_while_waiting_does_not_strand_the_group() {
        let group = TsoGroup::<&'static str>::new();
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let gate = std::future::poll_fn(move |_| match rx.try_recv() {
            Ok(()) => Poll::Ready(Ok(Timestamp(10))),
            Err(_) => Poll::Pending,
        });
        let mut leader = Box::pin(group.take(|_| gate));
        assert!(leader.as_mut().poll(&mut cx).is_pending());
        let mut b = Box::pin(group.take(|n| async move { Ok(Timestamp(20 + n)) }));
        let mut c = Box::pin(group.take(|n| async move { Ok(Timestamp(30 + n)) }));
        assert!(b.as_mut().poll(&mut cx).is_pending());
        assert!(c.as_mut().poll(&mut cx).is_pending());
        tx.send(()).unwrap();
        assert!(matches!(
            leader.as_mut().poll(&mut cx),
            Poll::Ready(Ok(Timestamp(10)))
        ));
        // b was promoted; it is dropped before it runs: c leads a group of one.
        drop(b);
        assert!(matches!(
            c.as_mut().poll(&mut cx),
            Poll::Ready(Ok(Timestamp(31)))
        ));
    }
}
