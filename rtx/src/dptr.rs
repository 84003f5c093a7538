//! The data pointer (dptr) of a TXObj: where the object's current value lives
//! (Transactional Indexes on Disaggregated Memory with Repairable Transaction, 4.2, 4.4).
//!
//! One 8-byte word, installed only by CAS (copy-on-write: a committed update allocates a
//! new buffer and CASes the dptr from the old to the new one, which succeeds once):
//!
//! ```text
//! incarnation:8 | version:16 | block:40
//! ```
//!
//! `version` is incremented on every update of the object, so a buffer reused for the same
//! object yields a different word and a late TryCommit CAS of an old rTX fails (ABA, 4.4).
//! `incarnation` is the allocator incarnation that handed the block out (4.4, leak
//! prevention); 0 is reserved, so the all-zero word is the null dptr. `block` indexes the
//! data pool (see [`crate::layout::Layout::block_addr`]).

/// Bits of the block index.
pub const BLOCK_BITS: u32 = 40;
/// Largest block index.
pub const BLOCK_MAX: u64 = (1 << BLOCK_BITS) - 1;

/// A decoded data pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Dptr {
    /// Allocator incarnation that handed the block out (1..=255).
    pub incarnation: u8,
    /// Update count of the object, wrapping at 16 bits.
    pub version: u16,
    /// Data-pool block index (40 bits).
    pub block: u64,
}

impl Dptr {
    /// The null dptr word (no value).
    pub const NULL: u64 = 0;

    /// Encode. Panics on a block past 40 bits or incarnation 0 (reserved for null).
    pub fn word(self) -> u64 {
        assert!(self.block <= BLOCK_MAX, "block {} past 40 bits", self.block);
        assert!(self.incarnation != 0, "incarnation 0 is reserved");
        (self.incarnation as u64) << 56 | (self.version as u64) << BLOCK_BITS | self.block
    }

    /// Decode; `None` for the null word.
    pub fn decode(w: u64) -> Option<Self> {
        if w == Self::NULL {
            return None;
        }
        Some(Self {
            incarnation: (w >> 56) as u8,
            version: (w >> BLOCK_BITS) as u16,
            block: w & BLOCK_MAX,
        })
    }

    /// The dptr that replaces this one when an update writes `block`, handed out by
    /// allocator `incarnation`: the version moves on by one (wrapping).
    pub fn successor(self, block: u64, incarnation: u8) -> Self {
        Self {
            incarnation,
            version: self.version.wrapping_add(1),
            block,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_null() {
        for d in [
            Dptr {
                incarnation: 1,
                version: 0,
                block: 0,
            },
            Dptr {
                incarnation: 255,
                version: u16::MAX,
                block: BLOCK_MAX,
            },
            Dptr {
                incarnation: 3,
                version: 77,
                block: 123_456,
            },
        ] {
            assert_ne!(d.word(), Dptr::NULL);
            assert_eq!(Dptr::decode(d.word()), Some(d));
        }
        assert_eq!(Dptr::decode(Dptr::NULL), None);
    }

    #[test]
    fn successor_changes_the_word_even_for_the_same_block() {
        let d = Dptr {
            incarnation: 1,
            version: u16::MAX,
            block: 9,
        };
        let s = d.successor(9, 1);
        assert_eq!(s.version, 0);
        assert_ne!(s.word(), d.word());
    }
}
