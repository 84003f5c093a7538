//! TSO group: leader/follower combining of a process's concurrent timestamp requests
//! (Scythe, `shared/seeds/000_f3dba2ed893b246b.txt` section 4.5 (2) and Fig. 18; the
//! shape of tikv's TSO batching: a FIFO of waiters, one request for all, `base + i` in
//! arrival order).
//!
//! Requests of coroutines of one thread and of threads of one process that overlap form a
//! group. The protocol:
//!
//! 1. A request that finds no range request in flight becomes a **leader** and closes its
//!    group at once (a group of one when the oracle is idle): no waiting for company.
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
//! **Bounded wait.** A member waits for at most two range requests: the one in flight
//! when it arrived, and its own group's. No member is ever passed over: groups close
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

use std::collections::HashMap;
use std::future::Future;
use std::task::{Poll, Waker};

use crate::timestamp::Timestamp;

/// Identifies one request (member) within a group instance.
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
    members: Vec<MemberId>,
    leader: MemberId,
}

impl ClosedGroup {
    /// Timestamps the leader must take (members, the leader included).
    pub fn size(&self) -> u64 {
        self.members.len() as u64
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
    /// Members of completed groups (timestamps requested through the group).
    pub members: u64,
}

impl GroupStats {
    /// Mean members per range request; 0 before the first group.
    pub fn mean_group_size(&self) -> f64 {
        if self.groups == 0 {
            0.0
        } else {
            self.members as f64 / self.groups as f64
        }
    }
}

enum Slot<E> {
    /// In the open group or a closed one, waiting for its timestamp or a promotion.
    Waiting(Option<Waker>),
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
    /// Whether a range request is in flight (some member leads).
    in_flight: bool,
    /// The open group, in arrival order. Non-empty only while `in_flight`.
    open: Vec<MemberId>,
    /// A closed group whose range nobody has started to take yet: the first of its
    /// members to poll leads it (whichever thread runs first, so that a group never waits
    /// for one particular thread to be scheduled). Counts as in flight.
    pending: Option<Vec<MemberId>>,
    slots: HashMap<MemberId, Slot<E>>,
    next_id: MemberId,
    stats: GroupStats,
}

impl<E> Default for GroupCore<E> {
    fn default() -> Self {
        Self {
            in_flight: false,
            open: Vec::new(),
            pending: None,
            slots: HashMap::new(),
            next_id: 0,
            stats: GroupStats::default(),
        }
    }
}

impl<E: Clone> GroupCore<E> {
    /// A request arrives: it leads a group of one if no range request is in flight,
    /// else it joins the open group.
    pub fn join(&mut self) -> Joined {
        let id = self.next_id;
        self.next_id += 1;
        if self.in_flight {
            self.slots.insert(id, Slot::Waiting(None));
            self.open.push(id);
            Joined::Follow(id)
        } else {
            debug_assert!(self.open.is_empty());
            self.in_flight = true;
            self.slots.insert(id, Slot::Leading);
            Joined::Lead(
                id,
                ClosedGroup {
                    members: vec![id],
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
        let slot = self.slots.get_mut(&id).expect("poll of an unknown member");
        match slot {
            Slot::Waiting(_) if self.pending.as_ref().is_some_and(|p| p.contains(&id)) => {
                *slot = Slot::Leading;
                let members = self.pending.take().expect("checked");
                Polled::Lead(ClosedGroup {
                    members,
                    leader: id,
                })
            }
            Slot::Waiting(w) => {
                if let Some(new) = waker {
                    match w {
                        Some(old) if old.will_wake(new) => {}
                        _ => *w = Some(new.clone()),
                    }
                }
                Polled::Pending
            }
            Slot::Done(_) => match self.slots.remove(&id) {
                Some(Slot::Done(r)) => Polled::Done(r),
                _ => unreachable!(),
            },
            Slot::Leading | Slot::Abandoned => panic!("poll of a member that is not waiting"),
        }
    }

    /// The leader's range request for `group` returned `first` (the first of
    /// `group.size()` consecutive timestamps) or failed. Hands `first + i` to the `i`-th
    /// member, closes the open group and lets the first of its members to poll lead it.
    /// Returns the leader's
    /// own result and the wakers to wake once the lock is released.
    pub fn complete(
        &mut self,
        group: ClosedGroup,
        first: Result<Timestamp, GroupFailure<E>>,
    ) -> (Result<Timestamp, GroupFailure<E>>, Vec<Waker>) {
        debug_assert!(self.in_flight);
        let mut wakers = Vec::with_capacity(group.members.len());
        self.stats.groups += 1;
        self.stats.members += group.size();
        let leader = group.leader();
        let mut mine = None;
        for (i, id) in group.members.into_iter().enumerate() {
            let r = first.clone().map(|t| Timestamp(t.0 + i as u64));
            if id == leader {
                self.slots.remove(&id);
                mine = Some(r);
                continue;
            }
            match self.slots.insert(id, Slot::Done(r)) {
                Some(Slot::Waiting(w)) => wakers.extend(w),
                Some(Slot::Abandoned) => {
                    self.slots.remove(&id);
                }
                _ => unreachable!("a closed group's follower is waiting or abandoned"),
            }
        }
        self.in_flight = false;
        self.start_next(&mut wakers);
        (mine.expect("the leader is a member"), wakers)
    }

    /// A waiting member's future was dropped. Its timestamp, if one comes, is discarded;
    /// if it is in the open group or a closed group nobody leads yet, it leaves it without
    /// costing a timestamp. Returns wakers to wake once the lock is released.
    pub fn abandon(&mut self, id: MemberId) -> Vec<Waker> {
        let mut wakers = Vec::new();
        match self.slots.remove(&id) {
            Some(Slot::Waiting(_)) => {
                if let Some(pos) = self.open.iter().position(|&m| m == id) {
                    // Not in a closed group yet.
                    self.open.remove(pos);
                } else if let Some(p) = self.pending.as_mut().filter(|p| p.contains(&id)) {
                    // In a closed group whose range is not taken yet.
                    p.retain(|&m| m != id);
                    if p.is_empty() {
                        self.pending = None;
                        self.in_flight = false;
                        self.start_next(&mut wakers);
                    }
                } else {
                    // Its group's range is being taken: the timestamp will be discarded.
                    self.slots.insert(id, Slot::Abandoned);
                }
            }
            Some(Slot::Done(_)) | None => {}
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
        self.in_flight
    }

    /// With nothing in flight: close the open group and wake its members; the first to
    /// poll leads it.
    fn start_next(&mut self, wakers: &mut Vec<Waker>) {
        debug_assert!(!self.in_flight && self.pending.is_none());
        if self.open.is_empty() {
            return;
        }
        let members = std::mem::take(&mut self.open);
        for m in &members {
            if let Some(Slot::Waiting(w)) = self.slots.get_mut(m) {
                wakers.extend(w.take());
            }
        }
        self.pending = Some(members);
        self.in_flight = true;
    }
}

/// The kind of mutex a [`TsoGroup`] keeps its [`GroupCore`] in: [`StdLock`] in
/// production; the loom model checks supply loom's.
pub trait LockFamily: 'static {
    /// The mutex type.
    type Lock<T: Send>: Send + Sync;
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
    /// An idle group instance.
    pub fn new() -> Self {
        Self {
            core: L::new(GroupCore::default()),
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
        #[cfg(any(test, feature = "fault-injection"))]
        if let Some(p) = &self.prefetch {
            if let Some(t) = p.cache.lock().unwrap().pop_front() {
                return Ok(t);
            }
        }
        let (id, group) = match L::with(&self.core, |c| c.join()) {
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
