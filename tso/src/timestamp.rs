//! The timestamp type and its bit layout (Scythe 4.5; the epoch is this crate's answer
//! to restarts).
//!
//! A [`Timestamp`] is the 64-bit value of the oracle's counter after a client's FAA:
//!
//! ```text
//!  63            48 47                                             0
//! +----------------+------------------------------------------------+
//! | epoch (16 bit) |              counter (48 bit)                  |
//! +----------------+------------------------------------------------+
//! ```
//!
//! - **epoch**: the oracle incarnation that handed the timestamp out. A (re)started oracle
//!   persists a larger epoch before it serves and starts its counter at `epoch << 48`,
//!   so every timestamp of a later incarnation is larger than every one of an earlier
//!   incarnation. 65 535 restarts per state directory.
//! - **counter**: timestamps of one incarnation, `1 ..= 2^48 - 1`. At the paper's peak
//!   of about 70 M timestamps/s (section 5.4) that lasts 46 days of uninterrupted peak
//!   load, and years at transaction rates. Clients refuse a timestamp whose epoch bits are
//!   not their oracle's epoch ([`crate::TsoError::Exhausted`]), so a counter that runs
//!   into the next epoch's range never hands out a value a later incarnation could
//!   repeat; restarting the oracle opens a fresh epoch.
//!
//! Ordering is plain `u64` ordering, which is (epoch, counter) lexicographic order.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Bits of the epoch field (high bits of a timestamp).
pub const EPOCH_BITS: u32 = 16;
/// Bit position of the epoch field: `ts >> EPOCH_SHIFT` is the epoch.
pub const EPOCH_SHIFT: u32 = 64 - EPOCH_BITS;
/// Mask of the counter field (low 48 bits).
pub const COUNTER_MASK: u64 = (1 << EPOCH_SHIFT) - 1;
/// Largest epoch; a state file at this epoch cannot be restarted again.
pub const MAX_EPOCH: u16 = u16::MAX;

/// A timestamp handed out by the oracle (Scythe 4.5): unique, and larger than every
/// timestamp whose request finished before this one's request started, across oracle
/// restarts. Layout: epoch in the high 16 bits, counter in the low 48 (module docs).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// Smaller than every timestamp the oracle hands out (epoch 0, counter 0).
    pub const ZERO: Timestamp = Timestamp(0);

    /// The timestamp with `epoch` in the high bits and `counter` in the low bits; `None`
    /// when `counter` does not fit in 48 bits.
    pub fn compose(epoch: u16, counter: u64) -> Option<Self> {
        (counter <= COUNTER_MASK).then_some(Self(((epoch as u64) << EPOCH_SHIFT) | counter))
    }

    /// The raw 64-bit value (what the counter word held).
    pub fn get(self) -> u64 {
        self.0
    }

    /// The oracle incarnation (high 16 bits).
    pub fn epoch(self) -> u16 {
        (self.0 >> EPOCH_SHIFT) as u16
    }

    /// The position within the incarnation (low 48 bits).
    pub fn counter(self) -> u64 {
        self.0 & COUNTER_MASK
    }
}

impl fmt::Display for Timestamp {
    /// `epoch.counter`, e.g. `3.1042`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.epoch(), self.counter())
    }
}

impl From<Timestamp> for u64 {
    fn from(t: Timestamp) -> u64 {
        t.0
    }
}

/// `n` consecutive timestamps `start, start + 1, ..` taken with one FAA of `n`; iterates
/// in increasing order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimestampRange {
    next: u64,
    end: u64,
}

impl TimestampRange {
    /// The timestamps `start .. start + n` (raw values; `start + n` must not overflow).
    pub fn new(start: Timestamp, n: u64) -> Self {
        Self {
            next: start.0,
            end: start.0 + n,
        }
    }

    /// The first timestamp not yet iterated (the range's start before iteration).
    pub fn first(&self) -> Timestamp {
        Timestamp(self.next)
    }

    /// The last timestamp of the range; `None` when empty.
    pub fn last_ts(&self) -> Option<Timestamp> {
        (self.next < self.end).then(|| Timestamp(self.end - 1))
    }

    /// Whether `t` is in the range (not yet iterated).
    pub fn contains(&self, t: Timestamp) -> bool {
        (self.next..self.end).contains(&t.0)
    }
}

impl Iterator for TimestampRange {
    type Item = Timestamp;

    fn next(&mut self) -> Option<Timestamp> {
        (self.next < self.end).then(|| {
            self.next += 1;
            Timestamp(self.next - 1)
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = (self.end - self.next) as usize;
        (n, Some(n))
    }
}

impl ExactSizeIterator for TimestampRange {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_epoch_high_counter_low() {
        let t = Timestamp::compose(3, 42).unwrap();
        assert_eq!(t.get(), (3 << 48) | 42);
        assert_eq!((t.epoch(), t.counter()), (3, 42));
        assert_eq!(t.to_string(), "3.42");
        assert!(Timestamp::compose(0, COUNTER_MASK + 1).is_none());
        let max = Timestamp::compose(MAX_EPOCH, COUNTER_MASK).unwrap();
        assert_eq!(max.get(), u64::MAX);
    }

    #[test]
    fn later_epoch_orders_after_every_counter_of_an_earlier_one() {
        let old = Timestamp::compose(1, COUNTER_MASK).unwrap();
        let new = Timestamp::compose(2, 1).unwrap();
        assert!(old < new);
        assert!(Timestamp::ZERO < Timestamp::compose(0, 1).unwrap());
    }

    #[test]
    fn range_iterates_in_order_and_knows_its_ends() {
        let r = TimestampRange::new(Timestamp(10), 3);
        assert_eq!(r.len(), 3);
        assert_eq!(r.first(), Timestamp(10));
        assert_eq!(r.last_ts(), Some(Timestamp(12)));
        assert!(r.contains(Timestamp(12)) && !r.contains(Timestamp(13)));
        let v: Vec<u64> = r.map(Timestamp::get).collect();
        assert_eq!(v, vec![10, 11, 12]);
        assert_eq!(TimestampRange::new(Timestamp(5), 0).last_ts(), None);
    }

    #[test]
    fn serde_is_the_bare_number() {
        let t = Timestamp(7);
        assert_eq!(serde_json::to_string(&t).unwrap(), "7");
        assert_eq!(serde_json::from_str::<Timestamp>("7").unwrap(), t);
    }
}
