//! Transaction ids: the 64-bit word a coordinator writes into the CVT lock words and
//! insert guards it holds and into its commit log, naming the compute node, its
//! incarnation, the client (one coroutine's coordinator) and the attempt.
//!
//! Layout, high bits first: `node:12 | incarnation:12 | client:12 | invisible:1 |
//! seq:27`. An id never has the [`INVISIBLE`] bit: FORD's commit (occ-cas over
//! replicas, [`crate::ford`]) sets it in a lock word it holds while its installs are
//! landing.
//!
//! The owner (node, incarnation) sits in the top 24 bits so that recovery can sweep
//! every lock word a dead incarnation held with one comparison, and a restarted node
//! (a new incarnation from the membership service) never reuses an id of its previous
//! life: recovery of the old incarnation cannot then release the new one's locks
//! (Lotus 6 and the recovery of Motor 5.3 assume exactly this; the errata of the
//! project's recovery design make it explicit). An id is never 0, the value of a free
//! lock word. The sequence wraps after 2^27 attempts of one client; only one attempt of
//! a client is in flight at a time, so a wrapped id cannot meet itself.

/// Bits of the node field.
pub const NODE_BITS: u32 = 12;
/// Bits of the incarnation field.
pub const INCARNATION_BITS: u32 = 12;
/// Bits of the client field.
pub const CLIENT_BITS: u32 = 12;
/// Bits of the sequence field.
pub const SEQ_BITS: u32 = 27;

/// FORD's invisible bit (FORD, FAST '22, 3.4, the coalescent commit): set in a lock
/// word whose holder is installing new data (with the holder's id on the primary; alone
/// on a backup); a reader that meets it reads again until it clears.
pub const INVISIBLE: u64 = 1 << SEQ_BITS;

const SEQ_SHIFT: u32 = 0;
const CLIENT_SHIFT: u32 = SEQ_BITS + 1;
const INC_SHIFT: u32 = CLIENT_SHIFT + CLIENT_BITS;
const NODE_SHIFT: u32 = INC_SHIFT + INCARNATION_BITS;
const _: () = assert!(NODE_SHIFT + NODE_BITS == 64);

const fn mask(bits: u32) -> u64 {
    (1u64 << bits) - 1
}

/// A compute node's life: its node id and the incarnation the membership service gave
/// this run of it (both truncated to their fields' widths).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Owner {
    /// Node id (low [`NODE_BITS`] bits).
    pub node: u16,
    /// Incarnation (low [`INCARNATION_BITS`] bits).
    pub incarnation: u16,
}

impl Owner {
    /// `node` and `incarnation`, truncated to their fields.
    pub fn new(node: u32, incarnation: u64) -> Self {
        Self {
            node: (u64::from(node) & mask(NODE_BITS)) as u16,
            incarnation: (incarnation & mask(INCARNATION_BITS)) as u16,
        }
    }

    /// The owner's bits as they sit in an id (`node:12 | incarnation:12`, shifted to the
    /// top of the word).
    pub fn prefix(self) -> u64 {
        (u64::from(self.node) << NODE_SHIFT) | (u64::from(self.incarnation) << INC_SHIFT)
    }

    /// Whether `word` (a lock word, a guard, an id) was written by this owner. 0 (free)
    /// belongs to nobody.
    pub fn owns(self, word: u64) -> bool {
        word != 0 && word & !mask(INC_SHIFT) == self.prefix()
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "node {} incarnation {}", self.node, self.incarnation)
    }
}

/// A transaction id's fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxnId {
    /// The compute node's life that ran it.
    pub owner: Owner,
    /// The client (coordinator) within that node (low [`CLIENT_BITS`] bits).
    pub client: u16,
    /// The attempt's sequence number within its client (low [`SEQ_BITS`] bits, never 0).
    pub seq: u32,
}

impl TxnId {
    /// The 64-bit word.
    pub fn pack(self) -> u64 {
        self.owner.prefix()
            | ((u64::from(self.client) & mask(CLIENT_BITS)) << CLIENT_SHIFT)
            | ((u64::from(self.seq) & mask(SEQ_BITS)) << SEQ_SHIFT)
    }

    /// The fields of `word`; `None` for 0 (a free word).
    pub fn unpack(word: u64) -> Option<Self> {
        (word != 0).then(|| Self {
            owner: Owner {
                node: ((word >> NODE_SHIFT) & mask(NODE_BITS)) as u16,
                incarnation: ((word >> INC_SHIFT) & mask(INCARNATION_BITS)) as u16,
            },
            client: ((word >> CLIENT_SHIFT) & mask(CLIENT_BITS)) as u16,
            seq: ((word >> SEQ_SHIFT) & mask(SEQ_BITS)) as u32,
        })
    }

    /// The next sequence number after `seq` (wrapping within [`SEQ_BITS`], skipping 0).
    pub fn next_seq(seq: u32) -> u32 {
        let s = (u64::from(seq) + 1) & mask(SEQ_BITS);
        s.max(1) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_and_owner_matches_only_its_own_words() {
        let owner = Owner::new(7, 3);
        let id = TxnId {
            owner,
            client: 41,
            seq: 99,
        };
        let w = id.pack();
        assert_eq!(TxnId::unpack(w), Some(id));
        assert!(owner.owns(w));
        assert!(
            !Owner::new(7, 4).owns(w),
            "a later incarnation is another owner"
        );
        assert!(!Owner::new(8, 3).owns(w));
        assert!(!owner.owns(0), "a free word belongs to nobody");
        assert_eq!(TxnId::unpack(0), None);
    }

    #[test]
    fn fields_truncate_and_sequence_skips_zero() {
        let o = Owner::new(0x1_007, 0x1_003);
        assert_eq!((o.node, o.incarnation), (7, 3));
        assert_eq!(TxnId::next_seq((1 << SEQ_BITS) - 1), 1);
        assert_eq!(TxnId::next_seq(5), 6);
        let id = TxnId {
            owner: Owner::new(0xfff, 0xfff),
            client: 0xfff,
            seq: (1 << SEQ_BITS) - 1,
        };
        assert_eq!(id.pack(), !INVISIBLE, "every bit but the invisible one");
        assert_eq!(TxnId::unpack(id.pack() | INVISIBLE), Some(id));
    }
}
