//! One-sided operations in flight on one thread: a slot per READ, WRITE, CAS or FAA
//! holding its local buffer until the WR completes, and the waker of the coroutine
//! waiting for it. Plain state, no I/O: the runtime posts the WRs and reports
//! completions here.

use std::task::{Poll, Waker};
use std::time::Instant;

use crate::arena::Chunk;

use super::OneSidedError;

enum State {
    Free,
    /// Posted or queued; no completion yet.
    Waiting,
    /// Completed; the waiting future has not looked yet. The error is boxed so that the
    /// outcome travels to the waiting future in a register.
    Done(Result<(), Box<OneSidedError>>),
}

struct Slot {
    state: State,
    chunk: Option<Chunk>,
    len: usize,
    /// The future was dropped before completion: the completion frees the slot.
    abandoned: bool,
    waker: Option<Waker>,
    /// Whether the op's issuer asked for its timing: only then is the clock read.
    timed: bool,
    /// When the WR was posted (its doorbell) and when this thread saw its completion.
    posted: Option<Instant>,
    completed: Option<Instant>,
}

/// When a one-sided operation's WR was posted (doorbell rung) and when the thread that
/// issued it saw its completion: their difference is the operation's time on the
/// network and the remote NIC, without the time the issuing coroutine waited to be
/// scheduled before the post or after the completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpTiming {
    /// The doorbell that posted the WR.
    pub posted: Instant,
    /// The polling round in which the issuing thread took the completion.
    pub completed: Instant,
}

impl OpTiming {
    /// `completed - posted`.
    pub fn network(&self) -> std::time::Duration {
        self.completed.saturating_duration_since(self.posted)
    }
}

/// The one-sided operations of a thread. See the module docs.
#[derive(Default)]
pub(crate) struct OpTable {
    slots: Vec<Slot>,
    free: Vec<usize>,
}

impl OpTable {
    /// A slot for an op of `len` bytes using local buffer `chunk`; `timed`: record when it
    /// was posted and completed ([`Self::timing`]).
    pub(crate) fn open(&mut self, chunk: Chunk, len: usize, timed: bool) -> usize {
        let slot = Slot {
            state: State::Waiting,
            chunk: Some(chunk),
            len,
            abandoned: false,
            waker: None,
            timed,
            posted: None,
            completed: None,
        };
        match self.free.pop() {
            Some(id) => {
                self.slots[id] = slot;
                id
            }
            None => {
                self.slots.push(slot);
                self.slots.len() - 1
            }
        }
    }

    /// Op `id` completed with `r`: wake its future, or, if the future is gone, free the
    /// slot (dropping its buffer: no NIC touches it any more).
    pub(crate) fn complete(&mut self, id: usize, r: Result<(), OneSidedError>) {
        let s = &mut self.slots[id];
        if s.abandoned {
            s.chunk = None;
            s.state = State::Free;
            s.abandoned = false;
            self.free.push(id);
            return;
        }
        if matches!(s.state, State::Waiting) {
            if s.timed {
                s.completed = Some(Instant::now());
            }
            s.state = State::Done(r.map_err(Box::new));
            if let Some(w) = s.waker.take() {
                w.wake();
            }
        }
    }

    /// Op `id`'s WR was posted. A timed op records the time, read once per list: `now`
    /// is the list's clock, read by its first timed op.
    pub(crate) fn posted(&mut self, id: usize, now: &mut Option<Instant>) {
        if let Some(s) = self.slots.get_mut(id) {
            if s.timed {
                s.posted = Some(*now.get_or_insert_with(Instant::now));
            }
        }
    }

    /// Op `id`'s post and completion times, once it completed (before [`Self::finish`]).
    pub(crate) fn timing(&self, id: usize) -> Option<OpTiming> {
        let s = self.slots.get(id)?;
        Some(OpTiming {
            posted: s.posted?,
            completed: s.completed?,
        })
    }

    /// Poll op `id`, registering `waker`. Ready with its outcome (the error boxed: see
    /// [`State::Done`]).
    #[inline]
    pub(crate) fn poll(
        &mut self,
        id: usize,
        waker: &Waker,
    ) -> Poll<Result<(), Box<OneSidedError>>> {
        let s = &mut self.slots[id];
        match std::mem::replace(&mut s.state, State::Waiting) {
            State::Done(r) => {
                s.state = State::Done(Ok(()));
                Poll::Ready(r)
            }
            other => {
                s.state = other;
                match &s.waker {
                    Some(w) if w.will_wake(waker) => {}
                    _ => s.waker = Some(waker.clone()),
                }
                Poll::Pending
            }
        }
    }

    /// End op `id` after its result was taken (or its future dropped): returns its buffer
    /// and length to copy out of (dropping the chunk frees it), or `None` when it is
    /// still in flight (then the completion frees it).
    pub(crate) fn finish(&mut self, id: usize) -> Option<(Chunk, usize)> {
        let s = &mut self.slots[id];
        match s.state {
            State::Waiting => {
                s.abandoned = true;
                s.waker = None;
                None
            }
            State::Done(_) => {
                let out = s.chunk.take().map(|c| (c, s.len));
                s.state = State::Free;
                self.free.push(id);
                out
            }
            State::Free => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arena::ChunkPool;

    #[test]
    fn complete_then_finish_returns_the_buffer_once() {
        let pool = ChunkPool::new(4096, 64);
        let mut t = OpTable::default();
        let c = pool.alloc(8).unwrap();
        let off = c.off();
        let id = t.open(c, 8, false);
        let w = Waker::noop();
        assert!(t.poll(id, w).is_pending());
        t.complete(id, Ok(()));
        assert_eq!(pool.in_use(), 1, "held until the future takes the result");
        assert!(matches!(t.poll(id, w), Poll::Ready(Ok(()))));
        let (c, len) = t.finish(id).unwrap();
        assert_eq!((c.off(), len), (off, 8));
        assert!(t.finish(id).is_none(), "once");
        drop(c);
        assert_eq!(pool.in_use(), 0);
        assert_eq!(
            t.open(pool.alloc(8).unwrap(), 8, false),
            id,
            "the slot is reused"
        );
    }

    #[test]
    fn timing_spans_post_to_completion_and_restarts_with_the_slot() {
        let pool = ChunkPool::new(4096, 64);
        let mut t = OpTable::default();
        let id = t.open(pool.alloc(8).unwrap(), 8, true);
        assert_eq!(t.timing(id), None, "not posted");
        let mut now = None;
        t.posted(id, &mut now);
        let posted = now.expect("a timed op reads the list's clock");
        assert_eq!(t.timing(id), None, "not completed");
        t.complete(id, Ok(()));
        let tm = t.timing(id).unwrap();
        assert_eq!(tm.posted, posted);
        assert!(tm.completed >= posted);
        assert_eq!(tm.network(), tm.completed - posted);
        t.finish(id);
        let id2 = t.open(pool.alloc(8).unwrap(), 8, false);
        assert_eq!(id2, id);
        assert_eq!(t.timing(id2), None, "a reused slot starts over");
        // An untimed op never reads the clock.
        let mut now = None;
        t.posted(id2, &mut now);
        t.complete(id2, Ok(()));
        assert_eq!((now, t.timing(id2)), (None, None));
    }

    #[test]
    fn abandoned_op_frees_at_completion() {
        let pool = ChunkPool::new(4096, 128);
        let mut t = OpTable::default();
        let id = t.open(pool.alloc(100).unwrap(), 100, false);
        assert!(t.finish(id).is_none());
        assert_eq!(pool.in_use(), 1, "the NIC may still write it");
        t.complete(id, Ok(()));
        assert_eq!(pool.in_use(), 0);
        assert_eq!(t.open(pool.alloc(1).unwrap(), 1, false), id);
    }
}
