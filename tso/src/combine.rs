//! Weighted combining for the TSO proxy (Scythe, `shared/seeds/000_f3dba2ed893b246b.txt`
//! section 4.5 (3): "the proxy service sends a batch of incoming requests from the TSO
//! group to the TSO service").
//!
//! A proxy's requests are ranges, not single timestamps: each comes from a compute node's
//! TSO group leader and asks for its group's size. Concurrent requests, from every server
//! thread of the proxy and every compute node, are merged into one FAA on the oracle of
//! the sum of their counts; request `i` gets `first + (count_0 + .. + count_{i-1})`.
//!
//! The protocol is [`crate::group`]'s with weights (a [`crate::TsoGroup`] member always
//! asks for one timestamp, which is why the proxy cannot use it as it is):
//!
//! 1. A request that finds no FAA in flight **leads** a batch of one and takes its range
//!    at once (no waiting for company).
//! 2. A request that finds one in flight joins the **open** batch, in arrival order.
//! 3. When the in-flight FAA returns, its leader hands each member of its batch its
//!    sub-range, closes the open batch and wakes its members; the first of them to run
//!    leads it with one FAA of the batch's total.
//!
//! **No prefetching, no caching**: every range comes from an FAA issued after all its
//! batch's requests arrived. **Bounded wait**: a request waits for at most two FAAs.
//! **No lost wake-ups**: one mutex; a waiter registers its waker and checks its slot in
//! one critical section; a leader fills slots and collects wakers in one and wakes them
//! after unlocking.
//!
//! [`CombineCore`] is the state machine (no IO, no lock, no clock), [`Combiner`] its
//! async wrapper shared by the proxy's server threads.

use std::collections::HashMap;
use std::future::Future;
use std::task::{Poll, Waker};

use crate::group::{GroupFailure, LockFamily, StdLock};
use crate::timestamp::Timestamp;

/// Identifies one request within a combiner.
pub type RequestId = u64;

/// A closed batch: its requests in arrival order with their counts, and the one that
/// takes its range. Its leader must pass it to [`CombineCore::complete`] exactly once.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a closed batch must be completed, or its requests wait forever"]
pub struct Batch {
    members: Vec<(RequestId, u64)>,
    total: u64,
    leader: RequestId,
}

impl Batch {
    /// Timestamps the leader must take with one FAA (sum of the requests' counts).
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Requests in the batch.
    pub fn requests(&self) -> usize {
        self.members.len()
    }

    /// The request that takes the batch's range.
    pub fn leader(&self) -> RequestId {
        self.leader
    }
}

/// What [`CombineCore::join`] made of a new request.
#[derive(Debug, PartialEq, Eq)]
pub enum Joined {
    /// No FAA in flight: lead this batch (of one) now.
    Lead(RequestId, Batch),
    /// An FAA is in flight: wait in the open batch ([`CombineCore::poll`]).
    Follow(RequestId),
}

/// What [`CombineCore::poll`] found for a waiting request.
#[derive(Debug)]
pub enum Polled<E> {
    /// Still waiting (the waker was registered).
    Pending,
    /// The request leads its batch now: take the batch's range, then complete it.
    Lead(Batch),
    /// The first timestamp of the request's range, or why it has none.
    Done(Result<Timestamp, GroupFailure<E>>),
}

/// Counters of a combiner.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CombineStats {
    /// Batches completed (FAAs issued and returned).
    pub batches: u64,
    /// Requests served by those batches.
    pub requests: u64,
    /// Timestamps taken by those batches (sum of the requests' counts).
    pub timestamps: u64,
}

impl CombineStats {
    /// Mean requests per FAA; 0 before the first batch.
    pub fn mean_batch(&self) -> f64 {
        if self.batches == 0 {
            0.0
        } else {
            self.requests as f64 / self.batches as f64
        }
    }
}

enum Slot<E> {
    /// Waiting for its range or a promotion.
    Waiting(Option<Waker>),
    /// Leading (its FAA is in flight).
    Leading,
    /// Has its result, not yet seen.
    Done(Result<Timestamp, GroupFailure<E>>),
    /// Its future was dropped while its batch's FAA was in flight.
    Abandoned,
}

/// The combining state machine: plain data, no locking, no IO. Wakers it returns are to
/// be woken after the caller's lock is released.
pub struct CombineCore<E> {
    in_flight: bool,
    /// The open batch in arrival order, with counts. Non-empty only while `in_flight`.
    open: Vec<(RequestId, u64)>,
    /// A closed batch nobody leads yet; the first of its members to poll leads it.
    pending: Option<Vec<(RequestId, u64)>>,
    slots: HashMap<RequestId, Slot<E>>,
    next_id: RequestId,
    stats: CombineStats,
}

impl<E> Default for CombineCore<E> {
    fn default() -> Self {
        Self {
            in_flight: false,
            open: Vec::new(),
            pending: None,
            slots: HashMap::new(),
            next_id: 0,
            stats: CombineStats::default(),
        }
    }
}

fn batch(members: Vec<(RequestId, u64)>, leader: RequestId) -> Batch {
    let total = members.iter().map(|&(_, n)| n).sum();
    Batch {
        members,
        total,
        leader,
    }
}

impl<E: Clone> CombineCore<E> {
    /// A request for `count` timestamps arrives (`count >= 1`; the caller validates).
    pub fn join(&mut self, count: u64) -> Joined {
        debug_assert!(count >= 1);
        let id = self.next_id;
        self.next_id += 1;
        if self.in_flight {
            self.slots.insert(id, Slot::Waiting(None));
            self.open.push((id, count));
            Joined::Follow(id)
        } else {
            self.in_flight = true;
            self.slots.insert(id, Slot::Leading);
            Joined::Lead(id, batch(vec![(id, count)], id))
        }
    }

    /// A waiting request looks at its slot; with `waker`, it is registered to be woken
    /// when the slot changes.
    ///
    /// Panics if `id` is not a waiting request (a caller bug).
    pub fn poll(&mut self, id: RequestId, waker: Option<&Waker>) -> Polled<E> {
        let promoted = self
            .pending
            .as_ref()
            .is_some_and(|p| p.iter().any(|&(m, _)| m == id));
        let slot = self.slots.get_mut(&id).expect("poll of an unknown request");
        match slot {
            Slot::Waiting(_) if promoted => {
                *slot = Slot::Leading;
                let members = self.pending.take().expect("checked");
                Polled::Lead(batch(members, id))
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
            Slot::Leading | Slot::Abandoned => panic!("poll of a request that is not waiting"),
        }
    }

    /// The leader's FAA for `b` returned `first` (the first of `b.total()` consecutive
    /// timestamps) or failed. Hands each request its sub-range's first timestamp in
    /// arrival order, closes the open batch and lets the first of its requests to poll
    /// lead it. Returns the leader's own result and the wakers to wake after unlocking.
    pub fn complete(
        &mut self,
        b: Batch,
        first: Result<Timestamp, GroupFailure<E>>,
    ) -> (Result<Timestamp, GroupFailure<E>>, Vec<Waker>) {
        debug_assert!(self.in_flight);
        let mut wakers = Vec::with_capacity(b.members.len());
        self.stats.batches += 1;
        self.stats.requests += b.members.len() as u64;
        self.stats.timestamps += b.total;
        let mut mine = None;
        let mut offset = 0u64;
        for (id, n) in b.members {
            let r = first.clone().map(|t| Timestamp(t.0 + offset));
            offset += n;
            if id == b.leader {
                self.slots.remove(&id);
                mine = Some(r);
                continue;
            }
            match self.slots.insert(id, Slot::Done(r)) {
                Some(Slot::Waiting(w)) => wakers.extend(w),
                Some(Slot::Abandoned) => {
                    self.slots.remove(&id);
                }
                _ => unreachable!("a closed batch's follower is waiting or abandoned"),
            }
        }
        self.in_flight = false;
        self.start_next(&mut wakers);
        (mine.expect("the leader is a member"), wakers)
    }

    /// A waiting request's future was dropped. If it is in the open batch or in a closed
    /// batch nobody leads yet, it leaves it without costing timestamps; otherwise its
    /// range is discarded when it comes. Returns wakers to wake after unlocking.
    pub fn abandon(&mut self, id: RequestId) -> Vec<Waker> {
        let mut wakers = Vec::new();
        match self.slots.remove(&id) {
            Some(Slot::Waiting(_)) => {
                if let Some(pos) = self.open.iter().position(|&(m, _)| m == id) {
                    self.open.remove(pos);
                } else if let Some(p) = self
                    .pending
                    .as_mut()
                    .filter(|p| p.iter().any(|&(m, _)| m == id))
                {
                    p.retain(|&(m, _)| m != id);
                    if p.is_empty() {
                        self.pending = None;
                        self.in_flight = false;
                        self.start_next(&mut wakers);
                    }
                } else {
                    self.slots.insert(id, Slot::Abandoned);
                }
            }
            Some(Slot::Done(_)) | None => {}
            Some(Slot::Leading) | Some(Slot::Abandoned) => {
                panic!("abandon of a request that is not waiting")
            }
        }
        wakers
    }

    /// Counters so far.
    pub fn stats(&self) -> CombineStats {
        self.stats
    }

    /// Whether an FAA is in flight.
    pub fn in_flight(&self) -> bool {
        self.in_flight
    }

    fn start_next(&mut self, wakers: &mut Vec<Waker>) {
        debug_assert!(!self.in_flight && self.pending.is_none());
        if self.open.is_empty() {
            return;
        }
        let members = std::mem::take(&mut self.open);
        for (m, _) in &members {
            if let Some(Slot::Waiting(w)) = self.slots.get_mut(m) {
                wakers.extend(w.take());
            }
        }
        self.pending = Some(members);
        self.in_flight = true;
    }
}

/// A combiner shared by the threads of a process (`Send + Sync`; put it in an `Arc`).
/// `E` is the error of the range request; `L` the mutex its state lives in (std's in
/// production, loom's in `tests/loom_combine.rs`).
pub struct Combiner<E: Send, L: LockFamily = StdLock> {
    core: L::Lock<CombineCore<E>>,
    /// Test-only protocol break: leaders take extra timestamps and later requests are
    /// served from the surplus (the prefetching a proxy must never do).
    #[cfg(any(test, feature = "fault-injection"))]
    prefetch: Option<Prefetch>,
}

/// The surplus of a prefetching (broken) leader: `extra` per FAA, cached as one range.
#[cfg(any(test, feature = "fault-injection"))]
struct Prefetch {
    extra: u64,
    /// `(next, end)` of the cached surplus.
    cache: std::sync::Mutex<(u64, u64)>,
}

impl<E: Clone + Send, L: LockFamily> Default for Combiner<E, L> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E: Clone + Send, L: LockFamily> Combiner<E, L> {
    /// An idle combiner.
    pub fn new() -> Self {
        Self {
            core: L::new(CombineCore::default()),
            #[cfg(any(test, feature = "fault-injection"))]
            prefetch: None,
        }
    }

    /// **Broken on purpose** (test builds and feature `fault-injection` only): leaders
    /// take `extra` timestamps more than their batch needs and later requests that fit
    /// are served from the surplus without an FAA. Timestamps stay unique, but a request
    /// can get a range older than one another client already received, which the
    /// linearizability checker ([`crate::history`]) must report.
    #[cfg(any(test, feature = "fault-injection"))]
    pub fn prefetching(extra: u64) -> Self {
        Self {
            prefetch: Some(Prefetch {
                extra,
                cache: std::sync::Mutex::new((0, 0)),
            }),
            ..Self::new()
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut CombineCore<E>) -> R) -> R {
        L::with(&self.core, f)
    }

    /// Counters so far.
    pub fn stats(&self) -> CombineStats {
        self.with(|c| c.stats())
    }

    /// `count` consecutive timestamps (`count >= 1`) through the combiner; returns the
    /// first. If this request leads, it calls `take(total)` once, which must take
    /// `total` consecutive timestamps *now* (one FAA on the oracle) and return the first;
    /// otherwise it waits for its leader (at most the FAA in flight and its batch's).
    ///
    /// Errors: [`GroupFailure::Take`] when the leader's `take` failed,
    /// [`GroupFailure::LeaderCancelled`] when the leader's future was dropped mid-take.
    pub async fn take<F, Fut>(&self, count: u64, take: F) -> Result<Timestamp, GroupFailure<E>>
    where
        F: FnOnce(u64) -> Fut,
        Fut: Future<Output = Result<Timestamp, E>>,
    {
        #[cfg(any(test, feature = "fault-injection"))]
        if let Some(p) = &self.prefetch {
            let mut c = p.cache.lock().unwrap_or_else(|e| e.into_inner());
            if c.1 - c.0 >= count {
                c.0 += count;
                return Ok(Timestamp(c.0 - count));
            }
        }
        let (id, b) = match self.with(|c| c.join(count)) {
            Joined::Lead(id, b) => (id, b),
            Joined::Follow(id) => {
                let mut waiting = Waiting {
                    combiner: self,
                    id: Some(id),
                };
                let polled =
                    std::future::poll_fn(|cx| match self.with(|c| c.poll(id, Some(cx.waker()))) {
                        Polled::Pending => Poll::Pending,
                        other => Poll::Ready(other),
                    })
                    .await;
                waiting.id = None;
                match polled {
                    Polled::Done(r) => return r,
                    Polled::Lead(b) => (id, b),
                    Polled::Pending => unreachable!(),
                }
            }
        };
        debug_assert_eq!(b.leader(), id);
        let total = b.total();
        let mut leading = Leading {
            combiner: self,
            batch: Some(b),
        };
        #[cfg(any(test, feature = "fault-injection"))]
        let extra = self.prefetch.as_ref().map_or(0, |p| p.extra);
        #[cfg(not(any(test, feature = "fault-injection")))]
        let extra = 0;
        let first = take(total + extra).await.map_err(GroupFailure::Take);
        #[cfg(any(test, feature = "fault-injection"))]
        if let (Some(p), Ok(t)) = (&self.prefetch, &first) {
            *p.cache.lock().unwrap_or_else(|e| e.into_inner()) = (t.0 + total, t.0 + total + extra);
        }
        let b = leading.batch.take().expect("completed once");
        let (mine, wakers) = self.with(|c| c.complete(b, first));
        wakers.into_iter().for_each(Waker::wake);
        mine
    }
}

/// A follower's registration; dropping it before the result arrived abandons the slot.
struct Waiting<'a, E: Clone + Send, L: LockFamily> {
    combiner: &'a Combiner<E, L>,
    id: Option<RequestId>,
}

impl<E: Clone + Send, L: LockFamily> Drop for Waiting<'_, E, L> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            let wakers = self.combiner.with(|c| c.abandon(id));
            wakers.into_iter().for_each(Waker::wake);
        }
    }
}

/// A leader's batch; dropping it before the FAA returned fails the batch with
/// [`GroupFailure::LeaderCancelled`] so that no request waits forever.
struct Leading<'a, E: Clone + Send, L: LockFamily> {
    combiner: &'a Combiner<E, L>,
    batch: Option<Batch>,
}

impl<E: Clone + Send, L: LockFamily> Drop for Leading<'_, E, L> {
    fn drop(&mut self) {
        if let Some(b) = self.batch.take() {
            let (_, wakers) = self
                .combiner
                .with(|c| c.complete(b, Err(GroupFailure::LeaderCancelled)));
            wakers.into_iter().for_each(Waker::wake);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::tests::{block_on, with_watchdog};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::task::Context;

    type Core = CombineCore<&'static str>;

    fn follow(c: &mut Core, n: u64) -> RequestId {
        match c.join(n) {
            Joined::Follow(id) => id,
            j => panic!("{j:?}"),
        }
    }

    fn done(c: &mut Core, id: RequestId) -> u64 {
        match c.poll(id, None) {
            Polled::Done(r) => r.unwrap().get(),
            other => panic!("request {id} not done: {other:?}"),
        }
    }

    #[test]
    fn weighted_requests_get_disjoint_sub_ranges_in_arrival_order() {
        let mut c = Core::default();
        let Joined::Lead(_, b0) = c.join(3) else {
            panic!("first request must lead")
        };
        assert_eq!(b0.total(), 3);
        let x = follow(&mut c, 5);
        let y = follow(&mut c, 1);
        let z = follow(&mut c, 2);
        let (r, w) = c.complete(b0, Ok(Timestamp(100)));
        assert_eq!((r.unwrap().get(), w.len()), (100, 0));
        let b1 = match c.poll(y, None) {
            Polled::Lead(b) => b,
            p => panic!("{p:?}"),
        };
        assert_eq!((b1.total(), b1.requests(), b1.leader()), (8, 3, y));
        // A late request waits for the batch after.
        let late = follow(&mut c, 4);
        let (r, _) = c.complete(b1, Ok(Timestamp(103)));
        // x (5) gets 103..108, y (1) 108, z (2) 109..111.
        assert_eq!(r.unwrap().get(), 108);
        assert_eq!(done(&mut c, x), 103);
        assert_eq!(done(&mut c, z), 109);
        let b2 = match c.poll(late, None) {
            Polled::Lead(b) => b,
            p => panic!("{p:?}"),
        };
        assert_eq!(b2.total(), 4);
        let _ = c.complete(b2, Err(GroupFailure::Take("oracle gone")));
        assert!(!c.in_flight());
        let s = c.stats();
        assert_eq!((s.batches, s.requests, s.timestamps), (3, 5, 15));
    }

    #[test]
    fn abandoned_requests_cost_nothing_before_their_batch_is_taken() {
        let mut c = Core::default();
        let Joined::Lead(_, b0) = c.join(1) else {
            panic!()
        };
        let a = follow(&mut c, 7);
        let b = follow(&mut c, 2);
        assert!(c.abandon(a).is_empty());
        let _ = c.complete(b0, Ok(Timestamp(1)));
        let b1 = match c.poll(b, None) {
            Polled::Lead(b) => b,
            p => panic!("{p:?}"),
        };
        assert_eq!(b1.total(), 2, "the abandoned request's 7 are not taken");
        let _ = c.complete(b1, Ok(Timestamp(2)));
        // The only member of a promoted batch leaves: nothing is in flight any more.
        let Joined::Lead(_, b2) = c.join(1) else {
            panic!()
        };
        let d = follow(&mut c, 1);
        let _ = c.complete(b2, Ok(Timestamp(4)));
        let _ = c.abandon(d);
        assert!(!c.in_flight());
        assert!(matches!(c.join(1), Joined::Lead(..)));
    }

    #[test]
    fn threads_get_disjoint_ranges_covering_the_counter() {
        const THREADS: u64 = 4;
        const EACH: u64 = 1500;
        let (all, stats) = with_watchdog(|| {
            let comb = Arc::new(Combiner::<&'static str>::new());
            let counter = Arc::new(AtomicU64::new(0));
            let hs: Vec<_> = (0..THREADS)
                .map(|t| {
                    let (comb, counter) = (comb.clone(), counter.clone());
                    std::thread::spawn(move || {
                        (0..EACH)
                            .map(|i| {
                                let n = 1 + (t + i) % 4;
                                let first = block_on(comb.take(n, |total| {
                                    let c = counter.clone();
                                    async move {
                                        std::thread::yield_now();
                                        Ok(Timestamp(c.fetch_add(total, Ordering::SeqCst) + 1))
                                    }
                                }))
                                .unwrap();
                                (first.get(), n)
                            })
                            .collect::<Vec<(u64, u64)>>()
                    })
                })
                .collect();
            let all: Vec<Vec<(u64, u64)>> = hs.into_iter().map(|h| h.join().unwrap()).collect();
            (all, comb.stats())
        });
        for mine in &all {
            assert!(mine.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0));
        }
        let mut flat: Vec<u64> = all
            .concat()
            .into_iter()
            .flat_map(|(f, n)| f..f + n)
            .collect();
        let total = flat.len() as u64;
        flat.sort_unstable();
        assert_eq!(
            flat,
            (1..=total).collect::<Vec<u64>>(),
            "no gap, no overlap"
        );
        assert_eq!(stats.requests, THREADS * EACH);
        assert_eq!(stats.timestamps, total);
    }

    #[test]
    fn a_leader_dropped_mid_take_passes_leadership_on() {
        let comb = Combiner::<&'static str>::new();
        let mut cx = Context::from_waker(Waker::noop());
        let mut l = Box::pin(comb.take(1, |_| std::future::pending()));
        assert!(l.as_mut().poll(&mut cx).is_pending());
        let mut f = Box::pin(comb.take(2, |_| async { Ok(Timestamp(9)) }));
        assert!(f.as_mut().poll(&mut cx).is_pending());
        drop(l);
        // f was promoted to lead the next batch: it takes its own range.
        match f.as_mut().poll(&mut cx) {
            Poll::Ready(Ok(Timestamp(9))) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_prefetching_combiner_serves_from_its_surplus() {
        let comb = Combiner::<&'static str>::prefetching(10);
        let counter = AtomicU64::new(0);
        let take = |n| {
            let c = &counter;
            async move { Ok(Timestamp(c.fetch_add(n, Ordering::SeqCst) + 1)) }
        };
        assert_eq!(block_on(comb.take(2, take)).unwrap().get(), 1);
        // Served from the cached 3..=12 without an FAA.
        assert_eq!(block_on(comb.take(4, take)).unwrap().get(), 3);
        assert_eq!(counter.load(Ordering::SeqCst), 12);
    }
}
