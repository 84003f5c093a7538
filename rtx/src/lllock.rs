//! The LLLock word: a logged lease lock in one 8-byte word on the memory node
//! (Transactional Indexes on Disaggregated Memory with Repairable Transaction, 4.1 and 4.4).
//!
//! Layout (bit 63 is the lock bit):
//!
//! ```text
//! unlocked: 0 | version:63
//! locked:   1 | lease_ms:47 | owner:16      owner = no_log:1 | id:15
//! ```
//!
//! The paper has "only 48 bits" for the lease; this layout gives it 47 (the lock bit takes
//! one), ms since the Unix epoch, which lasts until the year 6429. The owner is the rTX ID
//! (one per client coroutine), which also names its log slot. A lock taken by a
//! single-object rTX that writes no log (Opt1, 4.5) sets the no-log bit but keeps its id, so
//! that its LockState stays unique: leases per id strictly increase (4.4), so
//! `(lease, id)` names one rTX ever, and a late CAS of a falsely suspected owner can never
//! match another rTX's lock.

/// The lock bit (bit 63).
pub const LOCKED_BIT: u64 = 1 << 63;
/// Bits of the lease field (ms since the Unix epoch).
pub const LEASE_BITS: u32 = 47;
/// Largest lease representable, in ms since the Unix epoch.
pub const LEASE_MAX_MS: u64 = (1 << LEASE_BITS) - 1;
/// The owner field's no-log bit (Opt1: this rTX wrote no log).
pub const NO_LOG: u16 = 0x8000;
/// Largest rTX ID (15 bits; the 16th is [`NO_LOG`]).
pub const MAX_ID: u16 = 0x7FFF;
/// Largest version an unlocked word can hold (63 bits).
pub const VERSION_MAX: u64 = LOCKED_BIT - 1;

/// The lock state of a held LLLock: the holder's lease and its owner id (4.1, "LockState").
/// Unique per rTX, so it is also the checksum of the rTX's log (4.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LockState {
    /// Absolute expiry in ms since the Unix epoch (47 bits).
    pub lease_ms: u64,
    /// rTX ID (15 bits), naming the owner's log slot.
    pub id: u16,
    /// Set by a single-object rTX that wrote no log (Opt1).
    pub no_log: bool,
}

impl LockState {
    /// The 8-byte locked word. Panics if `lease_ms` exceeds 47 bits or `id` 15 bits (both
    /// are guaranteed by [`crate::lease::LeaseIssuer`] and [`crate::layout::Layout`]).
    pub fn word(self) -> u64 {
        assert!(
            self.lease_ms <= LEASE_MAX_MS,
            "lease {} ms overflows",
            self.lease_ms
        );
        assert!(self.id <= MAX_ID, "rTX ID {} overflows", self.id);
        let owner = self.id | if self.no_log { NO_LOG } else { 0 };
        LOCKED_BIT | (self.lease_ms << 16) | owner as u64
    }

    /// Expired iff the lease lies strictly before `now_ms` (4.1). Expiry only triggers a
    /// repair; it never proves the holder failed.
    pub fn expired(self, now_ms: u64) -> bool {
        self.lease_ms < now_ms
    }
}

/// A decoded LLLock word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockWord {
    /// Free; the object's version (incremented by every committed update, used by
    /// validation against ABA when data buffers are reused, 4.4).
    Unlocked(u64),
    /// Held.
    Locked(LockState),
}

impl LockWord {
    /// Decode an 8-byte word.
    pub fn decode(w: u64) -> Self {
        if w & LOCKED_BIT == 0 {
            return LockWord::Unlocked(w);
        }
        let owner = (w & 0xFFFF) as u16;
        LockWord::Locked(LockState {
            lease_ms: (w >> 16) & LEASE_MAX_MS,
            id: owner & MAX_ID,
            no_log: owner & NO_LOG != 0,
        })
    }

    /// Encode to the 8-byte word.
    pub fn encode(self) -> u64 {
        match self {
            LockWord::Unlocked(v) => unlocked(v),
            LockWord::Locked(s) => s.word(),
        }
    }
}

/// The unlocked word for `version` (63 bits; the next version after [`VERSION_MAX`]
/// wraps to 0, which validation tolerates because it also compares the dptr).
pub fn unlocked(version: u64) -> u64 {
    version & VERSION_MAX
}

/// The version after a committed update of an object unlocked at `version`.
pub fn next_version(version: u64) -> u64 {
    version.wrapping_add(1) & VERSION_MAX
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip() {
        for s in [
            LockState {
                lease_ms: 0,
                id: 0,
                no_log: false,
            },
            LockState {
                lease_ms: 1_780_000_000_123,
                id: 7,
                no_log: false,
            },
            LockState {
                lease_ms: LEASE_MAX_MS,
                id: MAX_ID,
                no_log: true,
            },
            LockState {
                lease_ms: 1,
                id: 0,
                no_log: true,
            },
        ] {
            let w = s.word();
            assert_ne!(w & LOCKED_BIT, 0);
            assert_eq!(LockWord::decode(w), LockWord::Locked(s));
            assert_eq!(LockWord::Locked(s).encode(), w);
        }
        for v in [0, 1, 12345, VERSION_MAX] {
            assert_eq!(LockWord::decode(unlocked(v)), LockWord::Unlocked(v));
        }
        assert_eq!(next_version(VERSION_MAX), 0);
        assert_eq!(next_version(4), 5);
    }

    #[test]
    fn no_log_keeps_the_id_and_differs_from_the_logged_word() {
        let a = LockState {
            lease_ms: 99,
            id: 3,
            no_log: false,
        };
        let b = LockState { no_log: true, ..a };
        assert_ne!(a.word(), b.word());
        assert_eq!(LockWord::decode(b.word()), LockWord::Locked(b));
    }

    #[test]
    fn expired_iff_lease_before_now() {
        let s = LockState {
            lease_ms: 1000,
            id: 1,
            no_log: false,
        };
        assert!(!s.expired(999));
        assert!(!s.expired(1000));
        assert!(s.expired(1001));
    }

    #[test]
    #[should_panic(expected = "overflows")]
    fn lease_past_47_bits_is_refused() {
        LockState {
            lease_ms: LEASE_MAX_MS + 1,
            id: 0,
            no_log: false,
        }
        .word();
    }
}
