//! `loom` model of DSLR's word protocol (Yoon et al., SIGMOD'18, Algorithms 1-3 and the
//! section 4.9 counter reset) over every interleaving loom explores: threads acquire and
//! release through a loom `AtomicU64` standing in for the one-sided FAA, READ and CAS
//! (acquire-release FAA and CAS, acquire READ, as the shm fabric performs them), using the
//! crate's own decisions ([`lockd::dslr::draw`], [`Ticket::check`], [`reset_step`]).
//!
//! Exclusion is checked with a `loom::cell::UnsafeCell` that writers increment and readers
//! read under the lock: loom reports any two accesses not ordered by happens-before, so the
//! model checks mutual exclusion of writers, reader/writer exclusion, and that the lock's
//! acquire/release orderings publish the protected data. A test with a planted bug (an
//! exclusive ticket that ignores readers) shows the checker catches a violation.

use lockd::dslr::{
    draw, reset_step, ticket_add, undo_add, Access, Draw, DslrWord, ResetStep, Ticket, Wait,
    COUNT_MAX,
};
use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;

struct Lock {
    word: AtomicU64,
    data: UnsafeCell<u64>,
    count_max: u16,
    /// Test-only protocol break: exclusive tickets wait like shared ones (ignore readers).
    broken: bool,
}

impl Lock {
    fn new(count_max: u16, broken: bool) -> Self {
        Self {
            word: AtomicU64::new(0),
            data: UnsafeCell::new(0),
            count_max,
            broken,
        }
    }

    /// Algorithms 1 and 2: draw a ticket (bouncing off a frozen word), wait for its turn.
    fn acquire(&self, access: Access) -> Ticket {
        loop {
            let prev = self.word.fetch_add(ticket_add(access), Ordering::AcqRel);
            match draw(prev, access, self.count_max) {
                Draw::Frozen => {
                    self.word.fetch_add(undo_add(access), Ordering::AcqRel);
                    thread::yield_now();
                }
                Draw::Ticket(t) => {
                    let check = if self.broken && access == Access::Exclusive {
                        // The planted bug: decide as a shared ticket with the same snapshot.
                        let shared = match draw(prev, Access::Shared, COUNT_MAX) {
                            Draw::Ticket(s) => s,
                            Draw::Frozen => unreachable!(),
                        };
                        let snap = t.snapshot();
                        assert_eq!(shared.snapshot(), snap);
                        shared
                    } else {
                        t
                    };
                    let mut observed = prev;
                    while check.check(observed).expect("protocol") != Wait::Go {
                        thread::yield_now();
                        observed = self.word.load(Ordering::Acquire);
                    }
                    return t;
                }
            }
        }
    }

    /// Algorithm 3: FAA the released counter; the resetter then CASes the word to 0.
    fn release(&self, t: Ticket) {
        self.word.fetch_add(t.release_add(), Ordering::AcqRel);
        if let Some(r) = t.reset_from() {
            loop {
                let old =
                    match self
                        .word
                        .compare_exchange(r, 0, Ordering::AcqRel, Ordering::Acquire)
                    {
                        Ok(v) | Err(v) => v,
                    };
                if reset_step(r, old) == ResetStep::Done {
                    break;
                }
                thread::yield_now();
            }
        }
    }

    fn critical(&self, access: Access) {
        let t = self.acquire(access);
        match access {
            // SAFETY: the exclusive lock is held, so no other thread accesses the cell (the
            // claim under test: loom's cell reports any access not ordered before ours).
            Access::Exclusive => self.data.with_mut(|p| unsafe { *p += 1 }),
            // SAFETY: a shared lock is held, so no thread writes the cell (checked by loom
            // as above).
            Access::Shared => drop(self.data.with(|p| unsafe { *p })),
        }
        self.release(t);
    }

    fn writes(&self) -> u64 {
        // SAFETY: all threads joined; no other access remains.
        self.data.with(|p| unsafe { *p })
    }
}

/// Explore `threads` (each a plan of acquisitions) with preemption bound `bound`; returns
/// how many executions loom ran.
fn run(count_max: u16, broken: bool, threads: &'static [&'static [Access]], bound: usize) -> usize {
    let executions = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = executions.clone();
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(bound);
    // Waiting is spinning (READ polling), which takes many branches per execution.
    b.max_branches = 20_000;
    b.check(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let lock = Arc::new(Lock::new(count_max, broken));
        let hs: Vec<_> = threads
            .iter()
            .map(|plan| {
                let lock = lock.clone();
                thread::spawn(move || {
                    for &a in plan.iter() {
                        lock.critical(a);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let writes = threads
            .iter()
            .flat_map(|p| p.iter())
            .filter(|&&a| a == Access::Exclusive)
            .count() as u64;
        assert_eq!(lock.writes(), writes);
        let w = DslrWord::decode(lock.word.load(Ordering::Acquire));
        assert_eq!(w.outstanding(), 0, "{w:?}");
        assert!(!w.frozen(count_max), "{w:?}");
    });
    let n = executions.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("{threads:?} (limit {count_max}, bound {bound}): {n} executions");
    assert!(n > 1, "the model explored interleavings");
    n
}

use Access::{Exclusive as X, Shared as S};

#[test]
fn writers_exclude_each_other() {
    run(COUNT_MAX, false, &[&[X], &[X]], 3);
}

#[test]
fn reader_and_writer_exclude_each_other() {
    run(COUNT_MAX, false, &[&[S, X], &[X, S]], 2);
}

/// Three threads: two readers share while a writer waits for both (or they wait for it).
/// Preemption bound 1: with 2 the spinning waiters take minutes.
#[test]
fn readers_share_and_exclude_a_writer() {
    run(COUNT_MAX, false, &[&[S], &[S], &[X]], 1);
}

/// A counter limit of 2: the second exclusive ticket freezes the word and resets it after
/// its release; the other acquisitions bounce off the frozen word until then.
#[test]
fn counter_reset_with_bouncing_clients() {
    run(2, false, &[&[X, X], &[X]], 2);
}

#[test]
fn shared_resetter_waits_for_readers_and_writer() {
    run(2, false, &[&[S, X], &[S]], 2);
}

/// The checker catches a planted violation: exclusive tickets that do not wait for
/// readers let a writer in beside a reader.
#[test]
fn planted_reader_writer_overlap_is_caught() {
    let r = std::panic::catch_unwind(|| run(COUNT_MAX, true, &[&[S], &[X]], 2));
    let payload = r.expect_err("the broken protocol passed the model");
    let msg = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("");
    assert!(
        msg.contains("Causality violation"),
        "caught for another reason: {msg}"
    );
}
