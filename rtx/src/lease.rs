//! Lease arithmetic for LLLocks (Transactional Indexes on Disaggregated Memory with
//! Repairable Transaction, 4.1, 4.4 and 6.4).
//!
//! One lease covers all locks of an rTX: `lease = now + estimated(TXEnd) + DRIFT`, where
//! the estimate is regulated by the number of objects read and written (a fixed lease
//! makes false expiries grow with the lock count, 6.4 Fig. 18b). The paper's platform used
//! 100 us per transactional update and DRIFT = 8 ms. Leases of rTXs that share an ID
//! strictly increase (4.4), which makes a LockState unique and so usable as the log's
//! checksum. Time comes from a [`Clock`], injectable so that tests can skew it.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::lllock::LEASE_MAX_MS;

/// A source of POSIX time in ms. Correctness never depends on it: leases only decide
/// when to repair, and repair is safe while the owner lives.
pub trait Clock {
    /// Current time in ms since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The host's wall clock (loosely synchronised by NTP in the paper's setting).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

/// Another clock shifted by `skew_ms` (positive: ahead), for clock-skew experiments.
#[derive(Clone, Debug)]
pub struct SkewedClock<C> {
    /// The clock being shifted.
    pub inner: C,
    /// Shift in ms, added to the inner clock's reading (saturating at 0).
    pub skew_ms: i64,
}

impl<C: Clock> Clock for SkewedClock<C> {
    fn now_ms(&self) -> u64 {
        self.inner.now_ms().saturating_add_signed(self.skew_ms)
    }
}

/// A clock that moves only when told to (tests and the model checker).
#[derive(Clone, Debug, Default)]
pub struct ManualClock(Rc<Cell<u64>>);

impl ManualClock {
    /// A clock reading `ms`.
    pub fn new(ms: u64) -> Self {
        Self(Rc::new(Cell::new(ms)))
    }
    /// Set the reading to `ms`.
    pub fn set(&self, ms: u64) {
        self.0.set(ms)
    }
    /// Advance by `ms`.
    pub fn advance(&self, ms: u64) {
        self.0.set(self.0.get() + ms)
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.get()
    }
}

impl<C: Clock + ?Sized> Clock for Rc<C> {
    fn now_ms(&self) -> u64 {
        (**self).now_ms()
    }
}

/// Lease parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    /// Tolerance for unsynchronised clocks and fly WRITEs, in ms. Default 8 (6.4: no
    /// false expiry for drift of 8 ms or more in their cluster, most removed at 8 ms).
    pub drift_ms: u64,
    /// Estimated commit time per written object, in us. Default 100 (6, setup).
    pub per_write_us: u64,
    /// Estimated commit time per read-only object (one validation READ), in us. Default
    /// 25 (inferred: the paper regulates by reads and writes but gives only the update figure).
    pub per_read_us: u64,
    /// Estimated execution time an Opt2 pre-lock must also cover, in us. Default 1000
    /// (inferred: a pre-locked leaf is held during execution, which the paper does not size).
    pub execution_us: u64,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self {
            drift_ms: 8,
            per_write_us: 100,
            per_read_us: 25,
            execution_us: 1000,
        }
    }
}

impl LeaseConfig {
    /// Estimated time to finish the commit of an rTX reading `reads` and writing `writes`
    /// objects, in ms (rounded up).
    pub fn estimate_ms(&self, reads: usize, writes: usize) -> u64 {
        let us = self.per_write_us * writes as u64 + self.per_read_us * reads as u64;
        us.div_ceil(1000)
    }

    /// The lease length in ms for such an rTX: estimate + DRIFT (4.3, Fig. 8 line 2).
    pub fn length_ms(&self, reads: usize, writes: usize) -> u64 {
        self.estimate_ms(reads, writes) + self.drift_ms
    }
}

/// Issues leases for one rTX ID, strictly increasing across the ID's rTXs even when the
/// clock steps back (4.4), so a LockState is never reused.
#[derive(Clone, Debug, Default)]
pub struct LeaseIssuer {
    last_ms: u64,
}

impl LeaseIssuer {
    /// An issuer that has issued nothing. After a restart, seed with [`Self::after`] the
    /// largest lease found in the ID's log, so leases keep increasing.
    pub fn new() -> Self {
        Self::default()
    }

    /// An issuer whose next lease is larger than `last_ms`.
    pub fn after(last_ms: u64) -> Self {
        Self { last_ms }
    }

    /// The last lease issued (ms), 0 if none.
    pub fn last_ms(&self) -> u64 {
        self.last_ms
    }

    /// The next lease of a logged rTX: `max(now + length, last + 1)` in ms since the
    /// epoch, where `last` is the ID's last logged lease. Panics when it would pass the
    /// 47-bit field (year 6429).
    pub fn issue(&mut self, now_ms: u64, length_ms: u64) -> u64 {
        let l = (now_ms + length_ms).max(self.last_ms + 1);
        assert!(l <= LEASE_MAX_MS, "lease {l} ms past the 47-bit field");
        self.last_ms = l;
        l
    }

    /// The lease of an rTX that writes no log (Opt1, and a repairer's takeover of an
    /// Opt1 lock): `now + length`, leaving the logged sequence alone. Strict increase
    /// exists only to make a LockState the unique checksum of the log it wrote (4.4);
    /// applied to every rTX, it lets an ID that runs more than one rTX per millisecond
    /// lock with leases ever further ahead of the clock (a thread finishing an update
    /// every 100 us would, after a second, hold locks seconds past their estimate), and a
    /// client that dies then blocks the others until those leases expire. Panics as
    /// [`LeaseIssuer::issue`].
    pub fn issue_unlogged(&self, now_ms: u64, length_ms: u64) -> u64 {
        let l = now_ms + length_ms;
        assert!(l <= LEASE_MAX_MS, "lease {l} ms past the 47-bit field");
        l
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unlogged leases follow the clock however many rTXs an ID runs per millisecond,
    /// and leave the logged sequence strictly increasing.
    #[test]
    fn unlogged_leases_follow_the_clock_and_leave_logged_ones_increasing() {
        let mut i = LeaseIssuer::new();
        let now = 1_700_000_000_000;
        for _ in 0..1000 {
            assert_eq!(
                i.issue_unlogged(now, 9),
                now + 9,
                "1000 Opt1 rTXs in one ms"
            );
        }
        let a = i.issue(now, 9);
        let b = i.issue(now, 9);
        assert_eq!((a, b), (now + 9, now + 10));
        assert_eq!(
            i.issue_unlogged(now, 9),
            now + 9,
            "not pushed by the logged ones"
        );
        assert_eq!(i.issue(now, 9), now + 11);
    }

    #[test]
    fn length_is_regulated_by_reads_and_writes_plus_drift() {
        let c = LeaseConfig::default();
        assert_eq!(c.length_ms(0, 1), 1 + 8);
        assert_eq!(c.length_ms(0, 10), 1 + 8);
        assert_eq!(c.length_ms(0, 80), 8 + 8);
        assert_eq!(c.length_ms(40, 80), 9 + 8);
        assert!(c.length_ms(0, 80) > c.length_ms(0, 20));
    }

    #[test]
    fn leases_per_id_strictly_increase_even_when_the_clock_steps_back() {
        let clock = ManualClock::new(1_000_000);
        let mut i = LeaseIssuer::new();
        let a = i.issue(clock.now_ms(), 9);
        let b = i.issue(clock.now_ms(), 9); // same ms
        clock.set(900_000); // NTP step back
        let c = i.issue(clock.now_ms(), 9);
        assert!(a < b && b < c, "{a} {b} {c}");
        // A restarted issuer seeded from the log keeps going up.
        let mut j = LeaseIssuer::after(c);
        assert!(j.issue(clock.now_ms(), 9) > c);
    }

    #[test]
    fn skewed_clock_shifts_both_ways() {
        let base = ManualClock::new(100);
        let ahead = SkewedClock {
            inner: base.clone(),
            skew_ms: 5,
        };
        let behind = SkewedClock {
            inner: base.clone(),
            skew_ms: -200,
        };
        assert_eq!(ahead.now_ms(), 105);
        assert_eq!(behind.now_ms(), 0);
        base.advance(10);
        assert_eq!(ahead.now_ms(), 115);
    }
}
