//! DSLR as a plain state machine, without any fabric (Yoon, Chowdhury, Mozafari,
//! "Distributed Lock Management with RDMA: Decentralization without Starvation",
//! SIGMOD'18: section 4, Algorithms 1-3; counter reset in section 4.9; dynamic interval
//! polling in section 4.6; backoff in Appendix A.3).
//!
//! DSLR is Lamport's bakery algorithm on one 64-bit word per lock, driven only by RDMA
//! fetch-and-add, which (unlike CAS) always succeeds. The word holds four 16-bit counters
//! ([`DslrWord`], the paper's Figure 3): `max_x` and `max_s`, the next exclusive and shared
//! tickets; `n_x` and `n_s`, how many exclusive and shared tickets were released.
//!
//! - **Acquire**: one FAA of +1 on `max_x` (exclusive) or `max_s` (shared). The returned
//!   old word is the ticket's snapshot ([`Ticket`]): it says how many exclusive and shared
//!   tickets were drawn before ours.
//! - **Wait**: a shared ticket is served once `n_x == snapshot.max_x` (every earlier writer
//!   is done); an exclusive ticket once also `n_s == snapshot.max_s` (every earlier reader
//!   is done). The snapshot itself is the first observation; later ones are one-sided
//!   READs, each after a wait of (tickets ahead) x (poll unit) ([`Wait::Ahead`]).
//! - **Release**: one FAA of +1 on `n_x` or `n_s`.
//!
//! Tickets are served in the order of their FAAs, so no client starves. The word is only
//! ever modified by RDMA atomics (FAA, and the reset's CAS), never by a CPU, following the
//! workspace's rule for shared words.
//!
//! # Counter overflow and reset (section 4.9, Algorithm 1 lines 4-11, Algorithm 3 lines 6-7)
//!
//! The counters count up to `count_max` (the paper's `COUNT_MAX = 2^15`; smaller in tests,
//! [`COUNT_MAX`] is the default and the largest allowed). The protocol implemented here:
//!
//! 1. A client whose FAA returns a word with `max_x >= count_max` or `max_s >= count_max`
//!    has drawn from a **frozen** word ([`Draw::Frozen`]): it undoes its FAA with an FAA of
//!    -1 on the same counter ([`undo_add`]), backs off for a random, exponentially growing
//!    delay, and draws again.
//! 2. A client whose FAA moved its counter to exactly `count_max` (old value
//!    `count_max - 1`) is the **resetter** and freezes the word by that very FAA. It
//!    computes `reset_from` ([`Ticket::reset_from`]), the word as it will be once every
//!    ticket up to its own is released: for an exclusive resetter `{n_x: count_max, n_s:
//!    prev.max_s, max_x: count_max, max_s: prev.max_s}`, for a shared resetter `{n_x:
//!    prev.max_x, n_s: count_max, max_x: prev.max_x, max_s: count_max}`. It waits for its
//!    turn and uses the lock as any other ticket.
//! 3. After its release FAA, the resetter CASes `reset_from -> 0` until the CAS succeeds
//!    ([`reset_step`]), waiting (tickets still outstanding) x (poll unit) between attempts.
//!
//! This is the paper's protocol (its pseudocode's `ResetFrom`, `COUNT_MAX` checks and the
//! CAS loop of Algorithm 3), without the lease-based stall detection of section 4.7 (out of
//! scope, as is all crash recovery in this crate). Why it is correct:
//!
//! - *No ticket is drawn after the resetter's*: every FAA after the freezing FAA sees a
//!   counter `>= count_max` and is undone; between its FAA and its undo the word differs
//!   from `reset_from` (its counter is one higher), so the reset CAS cannot succeed while
//!   any such increment is outstanding, and an undo can never land on a reset word and
//!   borrow from a neighbouring counter.
//! - *Every ticket before the resetter's is released before the reset*: the word equals
//!   `reset_from` only when `n_x` and `n_s` have caught up with every ticket drawn before
//!   the freeze, and counters only grow between resets.
//! - So when the CAS succeeds, no ticket of the old generation is held or waiting, and the
//!   zero word is exactly the initial state.
//! - Counters never carry into a neighbour: tickets stop at `count_max <= 2^15`, and the
//!   transient increments of bouncing clients stay below `2^16` as long as fewer than
//!   `2^16 - count_max` clients bounce at once (the paper's assumption of fewer than
//!   2^15 concurrent requesters per lock).

use std::time::Duration;

/// The paper's `COUNT_MAX` (2^15): the default and the largest allowed counter limit.
pub const COUNT_MAX: u16 = 1 << 15;
/// Bytes per DSLR lock in a word table: the one 8-byte word.
pub const DSLR_STRIDE: u64 = 8;

/// Bit offset of `max_s` (next shared ticket) in the word.
pub const MAX_S_SHIFT: u32 = 0;
/// Bit offset of `max_x` (next exclusive ticket) in the word.
pub const MAX_X_SHIFT: u32 = 16;
/// Bit offset of `n_s` (released shared tickets) in the word.
pub const N_S_SHIFT: u32 = 32;
/// Bit offset of `n_x` (released exclusive tickets) in the word.
pub const N_X_SHIFT: u32 = 48;

/// The lock mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// Shared (read) mode: compatible with other shared holders.
    Shared,
    /// Exclusive (write) mode: compatible with nothing.
    Exclusive,
}

/// A DSLR lock word decoded into its four 16-bit counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DslrWord {
    /// Released exclusive tickets (bits 48..64).
    pub n_x: u16,
    /// Released shared tickets (bits 32..48).
    pub n_s: u16,
    /// Next exclusive ticket (bits 16..32).
    pub max_x: u16,
    /// Next shared ticket (bits 0..16).
    pub max_s: u16,
}

impl DslrWord {
    /// Decode a 64-bit lock word.
    pub fn decode(w: u64) -> Self {
        Self {
            n_x: (w >> N_X_SHIFT) as u16,
            n_s: (w >> N_S_SHIFT) as u16,
            max_x: (w >> MAX_X_SHIFT) as u16,
            max_s: (w >> MAX_S_SHIFT) as u16,
        }
    }

    /// Encode as a 64-bit lock word.
    pub fn encode(self) -> u64 {
        u64::from(self.n_x) << N_X_SHIFT
            | u64::from(self.n_s) << N_S_SHIFT
            | u64::from(self.max_x) << MAX_X_SHIFT
            | u64::from(self.max_s) << MAX_S_SHIFT
    }

    /// Whether a ticket counter reached `count_max`: the word is being reset.
    pub fn frozen(self, count_max: u16) -> bool {
        self.max_x >= count_max || self.max_s >= count_max
    }

    /// Tickets drawn and not yet released (exclusive plus shared), saturating.
    pub fn outstanding(self) -> u32 {
        u32::from(self.max_x.saturating_sub(self.n_x))
            + u32::from(self.max_s.saturating_sub(self.n_s))
    }
}

/// The FAA addend that draws a ticket in `access` mode (+1 on `max_x` or `max_s`).
pub fn ticket_add(access: Access) -> u64 {
    match access {
        Access::Exclusive => 1 << MAX_X_SHIFT,
        Access::Shared => 1 << MAX_S_SHIFT,
    }
}

/// The FAA addend that takes back a ticket drawn from a frozen word (-1 on the counter,
/// as a wrapping 64-bit add).
pub fn undo_add(access: Access) -> u64 {
    ticket_add(access).wrapping_neg()
}

/// The FAA addend that releases a ticket of `access` mode (+1 on `n_x` or `n_s`).
pub fn release_add(access: Access) -> u64 {
    match access {
        Access::Exclusive => 1 << N_X_SHIFT,
        Access::Shared => 1 << N_S_SHIFT,
    }
}

/// Check a counter limit: `1..=COUNT_MAX`.
pub fn validate_count_max(count_max: u16) -> Result<(), String> {
    if count_max == 0 || count_max > COUNT_MAX {
        return Err(format!(
            "DSLR counter limit {count_max} outside 1..={COUNT_MAX}"
        ));
    }
    Ok(())
}

/// The outcome of a ticket FAA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Draw {
    /// The word was frozen for a reset: undo the FAA ([`undo_add`]), back off, draw again.
    Frozen,
    /// A ticket was drawn.
    Ticket(Ticket),
}

/// Decide from the old word `prev` a ticket FAA in `access` mode returned.
pub fn draw(prev: u64, access: Access, count_max: u16) -> Draw {
    let p = DslrWord::decode(prev);
    if p.frozen(count_max) {
        return Draw::Frozen;
    }
    let mine = match access {
        Access::Exclusive => p.max_x,
        Access::Shared => p.max_s,
    };
    let reset_from = (mine.wrapping_add(1) == count_max).then(|| {
        match access {
            Access::Exclusive => DslrWord {
                n_x: count_max,
                n_s: p.max_s,
                max_x: count_max,
                max_s: p.max_s,
            },
            Access::Shared => DslrWord {
                n_x: p.max_x,
                n_s: count_max,
                max_x: p.max_x,
                max_s: count_max,
            },
        }
        .encode()
    });
    Draw::Ticket(Ticket {
        access,
        prev: p,
        reset_from,
    })
}

/// A drawn ticket: its mode, the snapshot its FAA returned, and whether it must reset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    access: Access,
    prev: DslrWord,
    reset_from: Option<u64>,
}

/// What a ticket should do after observing the lock word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// The ticket is served: the caller holds the lock.
    Go,
    /// Not served; this many tickets ahead still hold or wait (at least 1). DSLR waits
    /// `ahead x poll unit` before the next READ (section 4.6).
    Ahead(u32),
}

/// The lock word contradicts the protocol for this ticket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("DSLR word {observed:?} passed ticket {ticket:?} ({access:?})")]
pub struct DslrViolation {
    /// The ticket's snapshot.
    pub ticket: DslrWord,
    /// The word observed.
    pub observed: DslrWord,
    /// The ticket's mode.
    pub access: Access,
}

impl Ticket {
    /// The mode.
    pub fn access(&self) -> Access {
        self.access
    }

    /// The word the ticket FAA returned.
    pub fn snapshot(&self) -> DslrWord {
        self.prev
    }

    /// `Some(word)` for the resetter: after its release it CASes `word -> 0`.
    pub fn reset_from(&self) -> Option<u64> {
        self.reset_from
    }

    /// The release FAA's addend.
    pub fn release_add(&self) -> u64 {
        release_add(self.access)
    }

    /// Decide from an observed lock word (the snapshot itself, or a READ).
    ///
    /// Errors: [`DslrViolation`] when the released counters passed the ticket (`n_x` past
    /// the snapshot's `max_x`, or for an exclusive ticket `n_s` past its `max_s`): no
    /// correct client releases a ticket drawn after ours before we release.
    pub fn check(&self, observed: u64) -> Result<Wait, DslrViolation> {
        let w = DslrWord::decode(observed);
        let p = self.prev;
        let violation = DslrViolation {
            ticket: p,
            observed: w,
            access: self.access,
        };
        if w.n_x > p.max_x {
            return Err(violation);
        }
        let x_ahead = u32::from(p.max_x - w.n_x);
        let ahead = match self.access {
            Access::Shared => x_ahead,
            Access::Exclusive => {
                if w.n_s > p.max_s {
                    return Err(violation);
                }
                x_ahead + u32::from(p.max_s - w.n_s)
            }
        };
        Ok(if ahead == 0 {
            Wait::Go
        } else {
            Wait::Ahead(ahead)
        })
    }
}

/// The resetter's next step after a reset CAS `reset_from -> 0` returned `observed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResetStep {
    /// The CAS swapped: the word is zero, the reset is done.
    Done,
    /// Tickets before ours (or undos of bouncing clients) are outstanding: CAS again after
    /// `ahead x poll unit` (`ahead` at least 1).
    Wait {
        /// Outstanding tickets seen (bouncers' transient increments included).
        ahead: u32,
    },
}

/// Decide the resetter's next step from the word its CAS returned.
pub fn reset_step(reset_from: u64, observed: u64) -> ResetStep {
    if observed == reset_from {
        ResetStep::Done
    } else {
        let w = DslrWord::decode(observed);
        let r = DslrWord::decode(reset_from);
        let ahead = u32::from(r.n_x.saturating_sub(w.n_x))
            + u32::from(r.n_s.saturating_sub(w.n_s))
            + u32::from(w.max_x.saturating_sub(r.max_x))
            + u32::from(w.max_s.saturating_sub(r.max_s));
        ResetStep::Wait {
            ahead: ahead.max(1),
        }
    }
}

/// DSLR's polling wait, section 4.6: `ahead x unit`, saturating.
pub fn poll_wait(ahead: u32, unit: Duration) -> Duration {
    unit.checked_mul(ahead).unwrap_or(Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A lock word driven by local atomics standing in for the one-sided FAA and CAS.
    #[derive(Default)]
    struct Word(AtomicU64);

    impl Word {
        fn faa(&self, add: u64) -> u64 {
            self.0.fetch_add(add, Ordering::AcqRel)
        }
        fn get(&self) -> u64 {
            self.0.load(Ordering::Acquire)
        }
        fn cas(&self, compare: u64, swap: u64) -> u64 {
            match self
                .0
                .compare_exchange(compare, swap, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(v) | Err(v) => v,
            }
        }
        fn take(&self, access: Access, count_max: u16) -> Ticket {
            match draw(self.faa(ticket_add(access)), access, count_max) {
                Draw::Ticket(t) => t,
                Draw::Frozen => panic!("frozen"),
            }
        }
        fn served(&self, t: &Ticket) -> bool {
            t.check(self.get()).unwrap() == Wait::Go
        }
        fn release(&self, t: &Ticket) {
            self.faa(t.release_add());
        }
    }

    use Access::{Exclusive as X, Shared as S};

    #[test]
    fn word_layout_roundtrips() {
        let w = DslrWord {
            n_x: 1,
            n_s: 2,
            max_x: 3,
            max_s: 4,
        };
        assert_eq!(w.encode(), 0x0001_0002_0003_0004);
        assert_eq!(DslrWord::decode(w.encode()), w);
        assert_eq!(DslrWord::decode(ticket_add(X)).max_x, 1);
        assert_eq!(DslrWord::decode(ticket_add(S)).max_s, 1);
        assert_eq!(DslrWord::decode(release_add(X)).n_x, 1);
        assert_eq!(DslrWord::decode(release_add(S)).n_s, 1);
        assert_eq!(w.encode().wrapping_add(undo_add(X)), 0x0001_0002_0002_0004);
        assert_eq!(w.outstanding(), 2 + 2);
    }

    #[test]
    fn grants_in_fifo_order_with_reader_writer_exclusion() {
        let w = Word::default();
        // Arrival order: S1 S2 X3 S4 X5 S6.
        let order = [S, S, X, S, X, S];
        let t: Vec<Ticket> = order.iter().map(|&a| w.take(a, COUNT_MAX)).collect();
        let released = std::cell::RefCell::new(Vec::new());
        // Tickets served now, among those not released yet.
        let served = |w: &Word| {
            (0..t.len())
                .filter(|&i| !released.borrow().contains(&i) && w.served(&t[i]))
                .collect::<Vec<_>>()
        };
        let release = |i: usize| {
            w.release(&t[i]);
            released.borrow_mut().push(i);
        };
        // The first two readers share the lock; X3 waits for both.
        assert_eq!(served(&w), vec![0, 1]);
        assert_eq!(t[2].check(w.get()), Ok(Wait::Ahead(2)));
        assert_eq!(t[5].check(w.get()), Ok(Wait::Ahead(2)), "two writers ahead");
        release(1);
        assert_eq!(served(&w), vec![0], "X3 still waits for S1");
        release(0);
        assert_eq!(served(&w), vec![2], "X3 alone; S4 drawn after it waits");
        release(2);
        assert_eq!(served(&w), vec![3], "S4; X5 waits for S4");
        release(3);
        assert_eq!(served(&w), vec![4]);
        release(4);
        assert_eq!(served(&w), vec![5]);
        release(5);
        let end = DslrWord::decode(w.get());
        assert_eq!(
            end,
            DslrWord {
                n_x: 2,
                n_s: 4,
                max_x: 2,
                max_s: 4
            }
        );
        assert_eq!(end.outstanding(), 0);
    }

    #[test]
    fn released_counters_past_the_ticket_are_violations() {
        let t = match draw(0, X, COUNT_MAX) {
            Draw::Ticket(t) => t,
            Draw::Frozen => unreachable!(),
        };
        let passed_x = DslrWord {
            n_x: 1,
            max_x: 1,
            ..DslrWord::default()
        };
        assert!(t.check(passed_x.encode()).is_err());
        let passed_s = DslrWord {
            n_s: 1,
            max_s: 1,
            ..DslrWord::default()
        };
        assert!(t.check(passed_s.encode()).is_err());
        // A shared ticket tolerates n_s past its snapshot: readers drawn after it may have
        // been served alongside it and released first.
        let s = match draw(0, S, COUNT_MAX) {
            Draw::Ticket(t) => t,
            Draw::Frozen => unreachable!(),
        };
        assert_eq!(s.check(passed_s.encode()), Ok(Wait::Go));
        assert!(s.check(passed_x.encode()).is_err());
    }

    #[test]
    fn exclusive_overflow_freezes_then_resetter_resets_to_zero() {
        const LIMIT: u16 = 3;
        let w = Word::default();
        let a = w.take(X, LIMIT);
        let b = w.take(S, LIMIT);
        let c = w.take(X, LIMIT);
        assert_eq!(a.reset_from(), None);
        assert_eq!(b.reset_from(), None);
        let d = w.take(X, LIMIT); // max_x 2 -> 3: d is the resetter
        let reset_from = d.reset_from().expect("d resets");
        assert_eq!(
            DslrWord::decode(reset_from),
            DslrWord {
                n_x: 3,
                n_s: 1,
                max_x: 3,
                max_s: 1
            }
        );
        // Anyone drawing now bounces off the frozen word and undoes its FAA.
        for access in [X, S] {
            let prev = w.faa(ticket_add(access));
            assert_eq!(draw(prev, access, LIMIT), Draw::Frozen);
            // While the bouncer's increment is outstanding, the reset CAS cannot succeed.
            assert!(matches!(
                reset_step(reset_from, w.cas(reset_from, 0)),
                ResetStep::Wait { .. }
            ));
            w.faa(undo_add(access));
        }
        // Everyone is served in order; d resets after its release.
        for t in [&a, &b, &c] {
            assert!(w.served(t));
            assert!(!w.served(&d));
            w.release(t);
            if t != &c {
                assert_eq!(
                    reset_step(reset_from, w.cas(reset_from, 0)),
                    ResetStep::Wait {
                        ahead: DslrWord::decode(w.get()).outstanding()
                    }
                );
            }
        }
        assert!(w.served(&d));
        w.release(&d);
        assert_eq!(
            reset_step(reset_from, w.cas(reset_from, 0)),
            ResetStep::Done
        );
        assert_eq!(w.get(), 0, "fresh generation");
        assert!(w.served(&w.take(X, LIMIT)));
    }

    #[test]
    fn shared_overflow_and_resetter_waits_for_shared_predecessors() {
        const LIMIT: u16 = 2;
        let w = Word::default();
        let a = w.take(S, LIMIT);
        let b = w.take(S, LIMIT); // max_s 1 -> 2: resetter
        let reset_from = b.reset_from().expect("b resets");
        assert_eq!(
            DslrWord::decode(reset_from),
            DslrWord {
                n_x: 0,
                n_s: 2,
                max_x: 0,
                max_s: 2
            }
        );
        assert!(w.served(&a) && w.served(&b), "readers share");
        assert_eq!(
            draw(w.faa(ticket_add(X)), X, LIMIT),
            Draw::Frozen,
            "writer bounces"
        );
        w.faa(undo_add(X));
        // b releases first: the reset must wait for a.
        w.release(&b);
        assert_eq!(
            reset_step(reset_from, w.cas(reset_from, 0)),
            ResetStep::Wait { ahead: 1 }
        );
        w.release(&a);
        assert_eq!(
            reset_step(reset_from, w.cas(reset_from, 0)),
            ResetStep::Done
        );
        assert_eq!(w.get(), 0);
    }

    #[test]
    fn limit_one_makes_every_ticket_a_resetter() {
        let w = Word::default();
        for _ in 0..5 {
            let t = w.take(X, 1);
            assert!(w.served(&t));
            w.release(&t);
            let r = t.reset_from().expect("every ticket resets");
            assert_eq!(reset_step(r, w.cas(r, 0)), ResetStep::Done);
        }
        assert_eq!(w.get(), 0);
    }

    #[test]
    fn many_generations_at_the_real_limit_never_carry() {
        // Run two full generations at COUNT_MAX with mixed modes, one at a time: exclusive
        // tickets (two in three) reach the limit first, every 3/2 COUNT_MAX tickets.
        let w = Word::default();
        let mut resets = 0;
        for i in 0..(3 * u32::from(COUNT_MAX) + 10) {
            let a = if i % 3 == 0 { S } else { X };
            let t = loop {
                match draw(w.faa(ticket_add(a)), a, COUNT_MAX) {
                    Draw::Ticket(t) => break t,
                    Draw::Frozen => {
                        w.faa(undo_add(a));
                    }
                }
            };
            assert!(w.served(&t));
            w.release(&t);
            if let Some(r) = t.reset_from() {
                assert_eq!(reset_step(r, w.cas(r, 0)), ResetStep::Done);
                resets += 1;
            }
            let d = DslrWord::decode(w.get());
            assert!(d.max_x <= COUNT_MAX && d.max_s <= COUNT_MAX);
        }
        assert!(resets >= 2, "{resets} resets");
    }

    #[test]
    fn limits_and_waits() {
        assert!(validate_count_max(0).is_err());
        assert!(validate_count_max(COUNT_MAX + 1).is_err());
        assert!(validate_count_max(1).is_ok());
        assert!(validate_count_max(COUNT_MAX).is_ok());
        let u = Duration::from_micros(2);
        assert_eq!(poll_wait(3, u), Duration::from_micros(6));
        assert_eq!(poll_wait(0, u), Duration::ZERO);
        assert_eq!(poll_wait(u32::MAX, Duration::MAX), Duration::MAX);
    }
}
