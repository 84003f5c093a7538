//! Where an attempt's time goes, as Scythe's latency decomposition splits it (Scythe,
//! 5.2): execution reads, timestamps, lock acquisition and waits, validation, the
//! commit's writes and the release of locks. A [`PhaseClock`] is a plain state machine
//! over caller-supplied instants: the attempt is always in exactly one phase, and a
//! switch charges the time since the last switch to the phase it leaves, so the phases
//! of an attempt add up to its wall time.

use std::fmt;
use std::time::Instant;

/// A phase of a transaction attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Execution: reads of the read/write set (and MVCC's CAS+READ of read-write data),
    /// the workload's own logic between them.
    Execute,
    /// Waiting for a timestamp from the TSO (through the thread's group).
    Timestamp,
    /// Taking locks: Lock RPCs and ticket waits (Scythe), lock CASes (OCC-CAS, MVCC's
    /// late locks), creating the CVTs of inserted keys.
    Lock,
    /// Validation of the read set.
    Validate,
    /// Installing the writes (records, then cells).
    WriteBack,
    /// Releasing locks and tickets.
    Unlock,
}

impl Phase {
    /// Number of phases.
    pub const COUNT: usize = 6;
    /// Every phase, in the order of an attempt.
    pub const ALL: [Phase; Self::COUNT] = [
        Self::Execute,
        Self::Timestamp,
        Self::Lock,
        Self::Validate,
        Self::WriteBack,
        Self::Unlock,
    ];

    /// Short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Execute => "read",
            Self::Timestamp => "ts",
            Self::Lock => "lock",
            Self::Validate => "validate",
            Self::WriteBack => "write",
            Self::Unlock => "unlock",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Time spent in each phase, in nanoseconds, indexed by [`Phase`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhaseTimes {
    /// Nanoseconds per phase, in [`Phase::ALL`] order.
    pub ns: [u64; Phase::COUNT],
}

impl PhaseTimes {
    /// Nanoseconds spent in `p`.
    pub fn get(&self, p: Phase) -> u64 {
        self.ns[p.index()]
    }

    /// Add `other`'s times to these (the attempts of one transaction).
    pub fn add(&mut self, other: &PhaseTimes) {
        for (a, b) in self.ns.iter_mut().zip(other.ns) {
            *a = a.saturating_add(b);
        }
    }

    /// Sum over every phase, in nanoseconds.
    pub fn total(&self) -> u64 {
        self.ns.iter().fold(0u64, |a, &b| a.saturating_add(b))
    }
}

/// The phase an attempt is in, and the time it spent in each so far.
#[derive(Clone, Debug)]
pub struct PhaseClock {
    current: Phase,
    since: Instant,
    times: PhaseTimes,
}

impl PhaseClock {
    /// A clock in [`Phase::Execute`] from `now`.
    pub fn new(now: Instant) -> Self {
        Self {
            current: Phase::Execute,
            since: now,
            times: PhaseTimes::default(),
        }
    }

    /// Enter `p` at `now`, charging the time since the last switch to the phase left;
    /// returns that phase, so a caller can go back to it. An instant earlier than the
    /// last switch charges nothing.
    pub fn enter(&mut self, p: Phase, now: Instant) -> Phase {
        let spent = now.saturating_duration_since(self.since).as_nanos();
        let slot = &mut self.times.ns[self.current.index()];
        *slot = slot.saturating_add(u64::try_from(spent).unwrap_or(u64::MAX));
        self.since = self.since.max(now);
        std::mem::replace(&mut self.current, p)
    }

    /// The phase the attempt is in.
    pub fn current(&self) -> Phase {
        self.current
    }

    /// The times so far, the current phase charged up to `now`.
    pub fn finish(&mut self, now: Instant) -> PhaseTimes {
        let p = self.current;
        self.enter(p, now);
        self.times
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn each_switch_charges_the_phase_left_and_the_phases_add_up() {
        let t0 = Instant::now();
        let at = |us: u64| t0 + Duration::from_micros(us);
        let mut c = PhaseClock::new(t0);
        assert_eq!(c.enter(Phase::Lock, at(10)), Phase::Execute);
        // A nested phase goes back to the one it interrupted.
        let prev = c.enter(Phase::Timestamp, at(12));
        assert_eq!(prev, Phase::Lock);
        c.enter(prev, at(15));
        c.enter(Phase::WriteBack, at(20));
        c.enter(Phase::Unlock, at(24));
        let t = c.finish(at(25));
        assert_eq!(t.get(Phase::Execute), 10_000);
        assert_eq!(t.get(Phase::Lock), 2_000 + 5_000);
        assert_eq!(t.get(Phase::Timestamp), 3_000);
        assert_eq!(t.get(Phase::Validate), 0);
        assert_eq!(t.get(Phase::WriteBack), 4_000);
        assert_eq!(t.get(Phase::Unlock), 1_000);
        assert_eq!(t.total(), 25_000);
    }

    #[test]
    fn an_instant_before_the_last_switch_charges_nothing() {
        let t0 = Instant::now() + Duration::from_secs(1);
        let mut c = PhaseClock::new(t0);
        c.enter(Phase::Lock, t0 - Duration::from_micros(5));
        assert_eq!(c.finish(t0).total(), 0);
    }

    #[test]
    fn the_attempts_of_a_transaction_add() {
        let mut a = PhaseTimes::default();
        a.ns[Phase::Lock as usize] = 7;
        let mut b = PhaseTimes::default();
        b.ns[Phase::Lock as usize] = 5;
        b.ns[Phase::Execute as usize] = 1;
        a.add(&b);
        assert_eq!(a.get(Phase::Lock), 12);
        assert_eq!(a.get(Phase::Execute), 1);
    }
}
