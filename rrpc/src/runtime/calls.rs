//! The caller's table of calls in flight: a plain state machine that takes the time as an
//! argument (no clock, no I/O), so deadlines, late replies and cancellation are tested
//! without a fabric.
//!
//! A call is opened when its request is pushed into the Rocket, gets its reply (or an
//! error) delivered by the polling round, or expires at its deadline; the future
//! waiting for it is woken in each case. A call whose future is dropped first, or that
//! expired, is *abandoned*. If it reserved a buffer the server may still WRITE into (a
//! zero-copy reply target) or READ from (a large request), that buffer becomes a
//! *zombie*: it is not reused until the server's late answer (its reply, `Done`, or
//! `Cancelled` after the caller's `Cancel`) says nothing more can touch it, or the node
//! is gone. No timer frees it: a slow server must never WRITE into a reused buffer.

use crate::NodeId;
use std::collections::HashMap;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use crate::arena::Chunk;
use crate::wire::{IdHash, ReadReply};

use super::CallError;

/// What the server answered.
#[derive(Debug)]
pub(crate) enum Reply {
    /// Inline payload.
    Inline(Vec<u8>),
    /// The call failed. Boxed: errors are rare, and a `Reply` is moved several times on
    /// every call (slot, poll, the caller's future), so it is kept to 32 bytes.
    Failed(Box<CallError>),
    /// RPC + READ: where the reply waits.
    Read(ReadReply),
    /// Zero-copy: the reply's length in the call's buffer.
    ZeroCopy(usize),
}

impl Reply {
    /// Whether this is the call's deadline error ([`CallError::Timeout`]).
    pub(crate) fn is_timeout(&self) -> bool {
        matches!(self, Reply::Failed(e) if matches!(**e, CallError::Timeout { .. }))
    }
}

struct Slot {
    node: NodeId,
    handler: u16,
    after: Duration,
    /// `None` until the first expiry scan after the call opened without one.
    deadline: Option<Instant>,
    result: Option<Reply>,
    /// Buffers the server may touch: the zero-copy target, the large request.
    chunks: Held,
    /// The waker of the task that polled the call last, kept when the slot is freed
    /// (in [`Entry::spare`]): a coroutine's next call usually takes the slot its last
    /// one freed, and `will_wake` then spares it a clone and a drop per call.
    waker: Option<Waker>,
    /// `waker` belongs to this call (its future polled and is waiting): wake it.
    armed: bool,
    /// The call expired, then its answer came (or its node died) before its future
    /// looked: the server is done with its buffers after all.
    settled: bool,
}

/// What to do with a reply that arrived ([`CallTable::deliver`]).
#[derive(Debug)]
pub(crate) enum Late {
    /// Delivered to a waiting call.
    Delivered,
    /// The call was abandoned; its buffers (dropped with this value) are free now that
    /// the server is done with them.
    Free(Held),
}

/// The buffers a call holds that its server may touch: the zero-copy reply target and
/// the buffer of a request sent by reference. Owns them: dropping it frees them, which
/// is right only once no server can touch them any more.
#[derive(Debug, Default)]
pub(crate) struct Held {
    /// Zero-copy reply target (reply bytes plus the 8-byte generation trailer).
    pub zc: Option<Chunk>,
    /// A request too large for a bucket, READ by the server.
    pub req: Option<Chunk>,
}

impl Held {
    /// Whether it holds nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.zc.is_none() && self.req.is_none()
    }
    /// The offsets of the buffers held (zero-copy target, request), for tests.
    #[cfg(test)]
    pub(crate) fn offsets(&self) -> (Option<usize>, Option<usize>) {
        (
            self.zc.as_ref().map(Chunk::off),
            self.req.as_ref().map(Chunk::off),
        )
    }
}

/// What to do about an abandoned call ([`CallTable::abandon`]).
#[derive(Debug, Default)]
pub(crate) struct Abandoned {
    /// Buffers free now (dropped with this value).
    pub free: Held,
    /// Send `Cancel` for the call.
    pub cancel: bool,
    /// Release this READ-mode reply buffer at the server.
    pub release: Option<u64>,
}

/// Calls in flight on one thread. See the module docs.
///
/// A slab: a call's id is its slot's index (low 32 bits) and the slot's generation
/// (high 32 bits, from 1, so no id is 0), bumped each time the slot is freed. A lookup
/// is an index and a compare, not a hash; a late reply to an ended call names an old
/// generation and finds nothing (ids repeat only after 2^32 calls through one slot).
#[derive(Default)]
pub(crate) struct CallTable {
    /// Calls in flight. Few (about one per coroutine), so expiry scans them all,
    /// every few rounds, instead of keeping an ordered index that every call would pay
    /// an insert and a remove into.
    slots: Vec<Entry>,
    /// Indices of free slots, reused last freed first (its lines are warm).
    free: Vec<u32>,
    /// Calls in `slots`.
    live: usize,
    /// Buffers of abandoned calls the server may still touch, by call id, with the node.
    zombies: HashMap<u64, (NodeId, Held), IdHash>,
}

struct Entry {
    generation: u32,
    call: Option<Slot>,
    /// The waker the slot's last call kept, handed to its next call (see `Slot::waker`).
    spare: Option<Waker>,
}

impl Slot {
    /// Wake the call's future if it is waiting (once; a later poll re-arms it).
    fn wake(&mut self) {
        if std::mem::take(&mut self.armed) {
            if let Some(w) = &self.waker {
                w.wake_by_ref();
            }
        }
    }
}

/// `now + after`, or about a century past `now` when that does not fit the clock: a
/// timeout too large to represent never ends, rather than panicking in the caller's
/// polling round (where the deadline scan runs).
pub(crate) fn deadline_after(now: Instant, after: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    now.checked_add(after).unwrap_or_else(|| now + CENTURY)
}

fn call_id(generation: u32, idx: usize) -> u64 {
    (u64::from(generation) << 32) | idx as u64
}

impl CallTable {
    /// The id the next [`CallTable::open`] returns (never 0).
    pub(crate) fn next_id(&self) -> u64 {
        match self.free.last() {
            Some(&i) => call_id(self.slots[i as usize].generation, i as usize),
            None => call_id(1, self.slots.len()),
        }
    }

    /// Open call `next_id()` to `node`'s `handler`, holding `chunks` until it ends.
    ///
    /// Its deadline is `deadline`, or, if `None`, `after` past the first
    /// [`CallTable::expire`] scan that sees it: the caller then opens the call without
    /// reading the clock (a clock read is a fair share of a small RPC on shared memory),
    /// and the deadline is late by at most the interval between scans, which already
    /// bounds how late an expiry is seen.
    #[inline]
    pub(crate) fn open(
        &mut self,
        node: NodeId,
        handler: u16,
        deadline: Option<Instant>,
        after: Duration,
        chunks: Held,
    ) -> u64 {
        let idx = match self.free.pop() {
            Some(i) => i as usize,
            None => {
                assert!(
                    self.slots.len() < u32::MAX as usize,
                    "fewer than 2^32 calls in flight"
                );
                self.slots.push(Entry {
                    generation: 1,
                    call: None,
                    spare: None,
                });
                self.slots.len() - 1
            }
        };
        let e = &mut self.slots[idx];
        e.call = Some(Slot {
            node,
            handler,
            after,
            deadline,
            result: None,
            chunks,
            waker: e.spare.take(),
            armed: false,
            settled: false,
        });
        self.live += 1;
        call_id(e.generation, idx)
    }

    /// The call of `id`, if it is still in the table.
    fn get_mut(&mut self, id: u64) -> Option<&mut Slot> {
        let e = self.slots.get_mut((id & u64::from(u32::MAX)) as usize)?;
        if u64::from(e.generation) != id >> 32 {
            return None;
        }
        e.call.as_mut()
    }

    /// Take the call of `id` out of the table, freeing its slot for a new generation.
    fn remove(&mut self, id: u64) -> Option<Slot> {
        let idx = (id & u64::from(u32::MAX)) as usize;
        let e = self.slots.get_mut(idx)?;
        if u64::from(e.generation) != id >> 32 {
            return None;
        }
        let s = e.call.take()?;
        self.release(idx);
        Some(s)
    }

    /// Empty slot `idx` (dropping what is left of its call in place) and free it under
    /// the next generation (0 is skipped, so that no id is 0).
    fn release(&mut self, idx: usize) {
        let e = &mut self.slots[idx];
        // The waker moves out alone: taking the whole call out would copy it.
        e.spare = e.call.as_mut().and_then(|s| s.waker.take());
        e.call = None;
        e.generation = e.generation.checked_add(1).unwrap_or(1);
        self.free.push(idx as u32);
        self.live -= 1;
    }

    /// Every call in the table, with its id.
    fn iter_mut(&mut self) -> impl Iterator<Item = (u64, &mut Slot)> {
        self.slots
            .iter_mut()
            .enumerate()
            .filter_map(|(i, e)| Some((call_id(e.generation, i), e.call.as_mut()?)))
    }

    /// Calls in flight (not yet taken by their futures).
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// Whether nothing is in flight.
    pub(crate) fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Buffers held for abandoned calls.
    pub(crate) fn zombies(&self) -> usize {
        self.zombies.len()
    }

    /// The reply to call `id` arrived (in the response ring, so the server is done with
    /// the call's buffer once `reply` is final).
    pub(crate) fn deliver(&mut self, id: u64, reply: Reply) -> Late {
        match self.get_mut(id) {
            Some(s) if s.result.is_none() => {
                s.result = Some(reply);
                s.wake();
                Late::Delivered
            }
            // Expired, not yet looked at: the timeout stands, but the server is done
            // with the buffers (a READ-mode buffer is released by the caller).
            Some(s) => {
                s.settled = true;
                Late::Free(Held::default())
            }
            None => Late::Free(self.zombies.remove(&id).map(|(_, c)| c).unwrap_or_default()),
        }
    }

    /// Poll call `id` for its result, registering `waker` to be woken when it comes.
    /// Ready with the reply and the call's buffer (which the caller frees after copying
    /// out), or with the call's deadline error.
    #[inline]
    pub(crate) fn poll(&mut self, id: u64, waker: &Waker) -> Poll<(Reply, Held)> {
        let Some(s) = self.get_mut(id) else {
            let e = CallError::Protocol {
                node: NodeId::MAX,
                what: "call polled after it ended",
            };
            return Poll::Ready((Reply::Failed(Box::new(e)), Held::default()));
        };
        if let Some(r) = s.result.take() {
            // Taken field by field: moving the whole slot out costs a copy per call.
            let (node, chunks, settled) = (s.node, std::mem::take(&mut s.chunks), s.settled);
            self.release((id & u64::from(u32::MAX)) as usize);
            // An expired call with a buffer the server may still touch keeps it.
            if r.is_timeout() && !settled {
                if !chunks.is_empty() {
                    self.zombies.insert(id, (node, chunks));
                }
                return Poll::Ready((r, Held::default()));
            }
            return Poll::Ready((r, chunks));
        }
        match &s.waker {
            Some(w) if w.will_wake(waker) => {}
            _ => s.waker = Some(waker.clone()),
        }
        s.armed = true;
        Poll::Pending
    }

    /// The future of call `id` was dropped before taking its result. Says what the
    /// runtime must do about it: free its buffer (the server's final answer came),
    /// cancel it at the server (no answer yet; the buffer is held as a zombie), and/or
    /// release a READ-mode reply buffer at the server.
    pub(crate) fn abandon(&mut self, id: u64) -> Abandoned {
        let mut out = Abandoned::default();
        let Some(s) = self.remove(id) else {
            return out;
        };
        if let Some(Reply::Read(r)) = &s.result {
            out.release = Some(r.handle);
        }
        let c = s.chunks;
        if c.is_empty() {
            return out;
        }
        match s.result {
            // No answer yet: the server may still touch the buffer.
            None => {
                self.zombies.insert(id, (s.node, c));
                out.cancel = true;
            }
            // Expired: `expire` asked for the cancel already.
            Some(r) if r.is_timeout() && !s.settled => {
                self.zombies.insert(id, (s.node, c));
            }
            // A final answer (or a gone node): nothing touches it any more.
            Some(_) => out.free = c,
        }
        out
    }

    /// Expire every call whose deadline is at or before `now`: its result becomes
    /// [`CallError::Timeout`] and its future is woken. A call opened without a deadline
    /// gets `now + after` (see [`CallTable::open`]). Appends to `cancel` the expired
    /// calls that hold a buffer the server may touch (the caller sends them `Cancel`);
    /// returns how many calls expired.
    pub(crate) fn expire(&mut self, now: Instant, cancel: &mut Vec<(NodeId, u64)>) -> usize {
        let mut n = 0;
        for (id, s) in self.iter_mut() {
            if s.result.is_some() {
                continue;
            }
            let deadline = *s
                .deadline
                .get_or_insert_with(|| deadline_after(now, s.after));
            if deadline > now {
                continue;
            }
            s.result = Some(Reply::Failed(Box::new(CallError::Timeout {
                node: s.node,
                handler: s.handler,
                after: s.after,
            })));
            if !s.chunks.is_empty() {
                cancel.push((s.node, id));
            }
            s.wake();
            n += 1;
        }
        n
    }

    /// The earliest deadline of a call still waiting (calls whose deadline no scan
    /// has set yet are left out).
    #[cfg(test)]
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.slots
            .iter()
            .filter_map(|e| e.call.as_ref())
            .filter(|s| s.result.is_none())
            .filter_map(|s| s.deadline)
            .min()
    }

    /// Fail every waiting call to `node` with `err(handler)`, and drop (free) the
    /// buffers of its abandoned calls: a gone node touches nothing any more.
    pub(crate) fn fail_node(&mut self, node: NodeId, err: impl Fn(u16) -> CallError) {
        for (_, s) in self.iter_mut() {
            if s.node == node {
                s.settled = true;
            }
            if s.node == node && s.result.is_none() {
                s.result = Some(Reply::Failed(Box::new(err(s.handler))));
                s.wake();
            }
        }
        self.zombies.retain(|_, (n, _)| *n != node);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arena::ChunkPool;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn waker() -> (Arc<Count>, Waker) {
        let c = Arc::new(Count(AtomicUsize::new(0)));
        (c.clone(), Waker::from(c))
    }

    /// A zero-copy target of `pool`, and its offset.
    fn zc(pool: &ChunkPool) -> (Held, usize) {
        let c = pool.alloc(8).unwrap();
        let off = c.off();
        (
            Held {
                zc: Some(c),
                req: None,
            },
            off,
        )
    }

    /// Whether `l` frees the zero-copy target at `off` (`None`: frees nothing).
    fn frees(l: Late, off: Option<usize>) -> bool {
        matches!(l, Late::Free(h) if h.offsets() == (off, None))
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn reply_wakes_and_is_taken_once() {
        let mut t = CallTable::default();
        let now = Instant::now();
        let id = t.open(NodeId(3), 9, Some(now + MS), MS, Held::default());
        let (c, w) = waker();
        assert!(t.poll(id, &w).is_pending());
        assert!(matches!(
            t.deliver(id, Reply::Inline(vec![1])),
            Late::Delivered
        ));
        assert_eq!(c.0.load(Ordering::Relaxed), 1);
        let Poll::Ready((Reply::Inline(v), _)) = t.poll(id, &w) else {
            panic!("no reply")
        };
        assert_eq!(v, vec![1]);
        assert!(t.is_empty());
        // The deadline of a delivered call is gone: nothing expires later.
        let mut cancel = Vec::new();
        t.expire(now + 10 * MS, &mut cancel);
        assert!(cancel.is_empty() && t.next_deadline().is_none());
    }

    /// A freed slot keeps its last waker for the next call (no clone when the same task
    /// calls again), but a reply wakes only the task of the call it answers, and only
    /// once that task has polled.
    #[test]
    fn a_kept_waker_wakes_only_the_task_of_its_own_call() {
        let mut t = CallTable::default();
        let (a, wa) = waker();
        let (b, wb) = waker();
        let id1 = t.open(NodeId(1), 1, None, MS, Held::default());
        assert!(t.poll(id1, &wa).is_pending());
        t.deliver(id1, Reply::Inline(vec![]));
        assert!(t.poll(id1, &wa).is_ready());
        assert_eq!(a.0.load(Ordering::Relaxed), 1);
        // The slot is reused by another task's call; a reply before that task polled
        // wakes nobody (the kept waker is task A's).
        let id2 = t.open(NodeId(1), 1, None, MS, Held::default());
        assert_eq!(id2 & u64::from(u32::MAX), id1 & u64::from(u32::MAX));
        t.deliver(id2, Reply::Inline(vec![]));
        assert_eq!(
            (a.0.load(Ordering::Relaxed), b.0.load(Ordering::Relaxed)),
            (1, 0)
        );
        assert!(t.poll(id2, &wb).is_ready());
        // Task B's call through the same slot, polled first: B is woken, A is not.
        let id3 = t.open(NodeId(1), 1, None, MS, Held::default());
        assert!(t.poll(id3, &wb).is_pending());
        t.deliver(id3, Reply::Inline(vec![]));
        assert_eq!(
            (a.0.load(Ordering::Relaxed), b.0.load(Ordering::Relaxed)),
            (1, 1)
        );
        // Woken once: a second wake source (the node failing) does not wake it again.
        t.fail_node(NodeId(1), |_| CallError::Protocol {
            node: NodeId(1),
            what: "test",
        });
        assert_eq!(b.0.load(Ordering::Relaxed), 1);
        assert!(t.poll(id3, &wb).is_ready());
    }

    #[test]
    fn a_reused_slot_gets_a_new_id_and_a_late_reply_misses_it() {
        let mut t = CallTable::default();
        let now = Instant::now();
        let (_c, w) = waker();
        assert_ne!(t.next_id(), 0);
        let a = t.open(NodeId(1), 1, Some(now + MS), MS, Held::default());
        assert!(matches!(
            t.deliver(a, Reply::Inline(vec![1])),
            Late::Delivered
        ));
        assert!(t.poll(a, &w).is_ready());
        // The slot is free again: the next call reuses it under another id.
        let next = t.next_id();
        let pool = ChunkPool::new(4096, 64);
        let (h, off) = zc(&pool);
        let b = t.open(NodeId(1), 1, Some(now + MS), MS, h);
        assert_eq!(b, next);
        assert_ne!(a, b);
        assert_eq!(a & u64::from(u32::MAX), b & u64::from(u32::MAX));
        // A duplicate of `a`'s reply is not `b`'s.
        assert!(frees(t.deliver(a, Reply::Inline(vec![9])), None));
        assert!(t.poll(b, &w).is_pending());
        assert_eq!(t.len(), 1);
        // `b` abandoned before its answer: its buffer is a zombie under its own id, and
        // the slot's next call cannot take its late reply.
        assert!(t.abandon(b).cancel);
        let c = t.open(NodeId(1), 1, Some(now + MS), MS, Held::default());
        assert_ne!(c, b);
        assert_eq!(pool.in_use(), 1);
        assert!(frees(t.deliver(b, Reply::Inline(vec![2])), Some(off)));
        assert_eq!(pool.in_use(), 0);
        assert!(t.poll(c, &w).is_pending());
    }

    #[test]
    fn deadlines_expire_in_order_and_only_when_due() {
        let mut t = CallTable::default();
        let now = Instant::now();
        let a = t.open(NodeId(1), 1, Some(now + 2 * MS), 2 * MS, Held::default());
        let b = t.open(NodeId(1), 1, Some(now + MS), MS, Held::default());
        let (c, w) = waker();
        assert!(t.poll(a, &w).is_pending() && t.poll(b, &w).is_pending());
        let mut cancel = Vec::new();
        t.expire(now, &mut cancel);
        assert_eq!(c.0.load(Ordering::Relaxed), 0);
        t.expire(now + MS, &mut cancel);
        assert_eq!(c.0.load(Ordering::Relaxed), 1);
        assert!(matches!(
            t.poll(b, &w),
            Poll::Ready((Reply::Failed(e), _)) if matches!(*e, CallError::Timeout { .. })
        ));
        assert!(t.poll(a, &w).is_pending());
        assert_eq!(t.next_deadline(), Some(now + 2 * MS));
    }

    #[test]
    fn a_call_opened_without_a_deadline_counts_it_from_the_first_scan() {
        let mut t = CallTable::default();
        let now = Instant::now();
        let id = t.open(NodeId(2), 1, None, MS, Held::default());
        let (c, w) = waker();
        assert!(t.poll(id, &w).is_pending());
        assert_eq!(t.next_deadline(), None);
        let mut cancel = Vec::new();
        // The first scan, however late, only sets the deadline.
        let scan = now + Duration::from_secs(3600);
        assert_eq!(t.expire(scan, &mut cancel), 0);
        assert_eq!(t.next_deadline(), Some(scan + MS));
        assert_eq!(
            t.expire(scan + MS - Duration::from_nanos(1), &mut cancel),
            0
        );
        assert_eq!(c.0.load(Ordering::Relaxed), 0);
        assert_eq!(t.expire(scan + MS, &mut cancel), 1);
        assert_eq!(c.0.load(Ordering::Relaxed), 1);
        assert!(matches!(
            t.poll(id, &w),
            Poll::Ready((Reply::Failed(e), _)) if matches!(*e, CallError::Timeout { .. })
        ));
    }

    #[test]
    fn a_timeout_too_large_for_the_clock_never_ends_and_does_not_panic() {
        let mut t = CallTable::default();
        let now = Instant::now();
        let id = t.open(NodeId(2), 1, None, Duration::MAX, Held::default());
        let (_c, w) = waker();
        assert!(t.poll(id, &w).is_pending());
        let mut cancel = Vec::new();
        assert_eq!(t.expire(now, &mut cancel), 0);
        assert_eq!(t.expire(now + Duration::from_secs(3600), &mut cancel), 0);
        assert!(t.poll(id, &w).is_pending());
    }

    #[test]
    fn expired_zero_copy_buffer_is_held_until_the_late_answer() {
        let mut t = CallTable::default();
        let now = Instant::now();
        let pool = ChunkPool::new(4096, 64);
        let (h, off) = zc(&pool);
        let id = t.open(NodeId(4), 2, Some(now + MS), MS, h);
        let (_c, w) = waker();
        assert!(t.poll(id, &w).is_pending());
        let mut cancel = Vec::new();
        t.expire(now + MS, &mut cancel);
        assert_eq!(cancel, vec![(NodeId(4), id)]);
        // The caller gets its timeout but not the buffer.
        assert!(matches!(t.poll(id, &w), Poll::Ready((_, h)) if h.is_empty()));
        assert_eq!(t.zombies(), 1);
        // Much later, still held: no timer frees it.
        t.expire(now + Duration::from_secs(3600), &mut cancel);
        assert_eq!(t.zombies(), 1);
        // The server's late Done (or Cancelled) frees it.
        assert_eq!(pool.in_use(), 1);
        assert!(frees(t.deliver(id, Reply::ZeroCopy(8)), Some(off)));
        assert_eq!((t.zombies(), pool.in_use()), (0, 0));
    }

    #[test]
    fn answer_after_expiry_but_before_the_future_looked_frees_the_buffer() {
        let mut t = CallTable::default();
        let now = Instant::now();
        let pool = ChunkPool::new(4096, 64);
        let (h, off) = zc(&pool);
        let id = t.open(NodeId(4), 2, Some(now + MS), MS, h);
        let mut cancel = Vec::new();
        t.expire(now + MS, &mut cancel);
        assert_eq!(cancel, vec![(NodeId(4), id)]);
        // The Done arrives before the caller's future runs again.
        assert!(frees(t.deliver(id, Reply::ZeroCopy(8)), None));
        let (_c, w) = waker();
        let Poll::Ready((Reply::Failed(e), held)) = t.poll(id, &w) else {
            panic!("want the timeout")
        };
        assert!(matches!(*e, CallError::Timeout { .. }), "{e}");
        assert_eq!(
            held.offsets(),
            (Some(off), None),
            "the caller frees it: no answer is coming any more"
        );
        assert_eq!(t.zombies(), 0);
    }

    #[test]
    fn dropped_future_with_buffer_asks_to_cancel_and_node_failure_frees() {
        let mut t = CallTable::default();
        let now = Instant::now();
        let pool = ChunkPool::new(4096, 64);
        let a = t.open(NodeId(5), 2, Some(now + MS), MS, zc(&pool).0);
        let b = t.open(NodeId(6), 2, Some(now + MS), MS, zc(&pool).0);
        let c = t.open(NodeId(6), 2, Some(now + MS), MS, Held::default());
        assert!(t.abandon(a).cancel);
        assert!(t.abandon(b).cancel);
        let ac = t.abandon(c);
        assert!(ac.free.is_empty() && !ac.cancel && ac.release.is_none());
        assert_eq!((t.zombies(), pool.in_use()), (2, 2));
        t.fail_node(NodeId(6), |_| CallError::NotConnected { node: NodeId(6) });
        assert_eq!(
            (t.zombies(), pool.in_use()),
            (1, 1),
            "node 6's buffer freed"
        );
    }

    #[test]
    fn dropped_future_after_final_answer_frees_and_releases() {
        let mut t = CallTable::default();
        let now = Instant::now();
        let pool = ChunkPool::new(4096, 64);
        let (h, off) = zc(&pool);
        let a = t.open(NodeId(5), 2, Some(now + MS), MS, h);
        t.deliver(a, Reply::ZeroCopy(3));
        let ab = t.abandon(a);
        assert_eq!(ab.free.offsets(), (Some(off), None));
        assert!(!ab.cancel && ab.release.is_none());
        drop(ab);
        assert_eq!(pool.in_use(), 0);
        let r = ReadReply {
            addr: 0,
            rkey: 1,
            len: 2,
            handle: 77,
        };
        let b = t.open(NodeId(5), 2, Some(now + MS), MS, Held::default());
        t.deliver(b, Reply::Read(r));
        assert_eq!(t.abandon(b).release, Some(77));
        assert_eq!(t.zombies(), 0);
    }

    #[test]
    fn node_failure_wakes_waiting_calls() {
        let mut t = CallTable::default();
        let now = Instant::now();
        let id = t.open(NodeId(7), 2, Some(now + MS), MS, Held::default());
        let (c, w) = waker();
        assert!(t.poll(id, &w).is_pending());
        t.fail_node(NodeId(7), |_| CallError::NotConnected { node: NodeId(7) });
        assert_eq!(c.0.load(Ordering::Relaxed), 1);
        assert!(matches!(
            t.poll(id, &w),
            Poll::Ready((Reply::Failed(e), _))
                if matches!(*e, CallError::NotConnected { node: NodeId(7) })
        ));
    }
}
