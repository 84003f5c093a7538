//! The hash index that holds CVTs (Motor 4.1, "Indexes Supports" and "CVT Address
//! Cache"): a bucket is [`CVTS_PER_BUCKET`] CVT slots read with one READ, searched
//! locally by key; compute nodes cache a CVT's address and detect a stale entry by the
//! key (or slot state) in the CVT they read through it, then refetch the bucket.
//!
//! Plain data and decisions: no fabric. A key hashes ([`crate::store::hash_key`]) to a
//! bucket; a full bucket overflows into the next (linear probing), so a search that finds
//! neither the key nor a free slot goes on to the next bucket.

use std::collections::HashMap;

use crate::cvt::{
    claimer, cvt_bytes, is_free, Cvt, CvtError, SLOT_FREE, SLOT_IN_USE, STATE_OFFSET,
};
use crate::store::hash_key;

/// CVT slots per hash bucket.
pub const CVTS_PER_BUCKET: usize = 4;

/// Bytes of a bucket of CVTs with `versions` cells each.
pub fn bucket_bytes(versions: usize) -> usize {
    CVTS_PER_BUCKET * cvt_bytes(versions)
}

/// The bucket `(table, key)` hashes to among `buckets` (at least 1).
pub fn home_bucket(table: u32, key: u64, buckets: u64) -> u64 {
    hash_key(table, key) % buckets.max(1)
}

/// What a bucket READ says about a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// The key's CVT, in slot `slot` of the bucket.
    At {
        /// Slot in the bucket.
        slot: usize,
        /// The CVT as read.
        cvt: Cvt,
    },
    /// Not here, and the bucket has a free slot (the first one): the key is absent, and an
    /// insert claims that slot (a CAS from the state it read, [`slot_state`]).
    Absent {
        /// The first free slot.
        free: usize,
    },
    /// Not here and the bucket is full: search the next bucket.
    Next,
}

/// Search a bucket READ for `(table, key)` among CVTs of `versions` cells. Errors: the
/// bucket is not [`bucket_bytes`]`(versions)` long, or the key's CVT is torn (read it
/// again). Other slots' torn cells do not matter and are skipped.
pub fn search(bucket: &[u8], versions: usize, table: u32, key: u64) -> Result<Found, CvtError> {
    check_bucket(bucket, versions)?;
    let each = cvt_bytes(versions);
    let mut free = None;
    for slot in 0..CVTS_PER_BUCKET {
        let b = &bucket[slot * each..(slot + 1) * each];
        let state = u64::from_le_bytes(b[STATE_OFFSET..STATE_OFFSET + 8].try_into().expect("8"));
        if is_free(state) {
            free.get_or_insert(slot);
            continue;
        }
        if claimer(state).is_some() {
            // An insert is writing this slot's header: not free, and not yet anyone's.
            continue;
        }
        let (t, k) = (
            u32::from_le_bytes(b[0..4].try_into().expect("4")),
            u64::from_le_bytes(b[8..16].try_into().expect("8")),
        );
        if (t, k) == (table, key) {
            return Ok(Found::At {
                slot,
                cvt: Cvt::decode(b)?,
            });
        }
    }
    Ok(match free {
        Some(free) => Found::Absent { free },
        None => Found::Next,
    })
}

/// A bucket READ is [`bucket_bytes`]`(versions)` long; else [`CvtError::BucketSize`].
fn check_bucket(bucket: &[u8], versions: usize) -> Result<(), CvtError> {
    let want = bucket_bytes(versions);
    if bucket.len() != want {
        return Err(CvtError::BucketSize {
            have: bucket.len(),
            want,
        });
    }
    Ok(())
}

/// The state word of slot `slot` of a bucket READ of CVTs of `versions` cells (the bucket
/// is [`bucket_bytes`]`(versions)` long, as [`search`] checked).
pub fn slot_state(bucket: &[u8], versions: usize, slot: usize) -> u64 {
    let at = slot * cvt_bytes(versions) + STATE_OFFSET;
    u64::from_le_bytes(bucket[at..at + 8].try_into().expect("8 bytes"))
}

/// What one bucket says in a recovery's search for the slot a dead inserter claimed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimSeek {
    /// Slot `slot` holds the claim.
    At {
        /// Slot in the bucket.
        slot: usize,
    },
    /// Not here, and the bucket holds a never-claimed ([`SLOT_FREE`]) slot: the
    /// inserter claimed nothing further on.
    Stop,
    /// Not here: search the next bucket.
    Next,
}

/// Search a bucket READ for the slot whose state is `word` (a [`crate::cvt::claim_word`]),
/// as recovery does from the home bucket of an insert guard a dead inserter held, bucket
/// after bucket. An insert claims in the first bucket from its home that has a free slot
/// and passes over full ones; a slot becomes free again only as [`crate::cvt::SLOT_FREED`]
/// (a recovery undid its claim), never as [`SLOT_FREE`]. So a bucket before the claim's
/// holds no [`SLOT_FREE`] slot, and the first bucket that does ends the search: if the
/// claim is not there, there is none. (A bucket whose only free slots are
/// [`crate::cvt::SLOT_FREED`] may lie before the claim: another dead inserter's claim,
/// undone since, made it look full then.)
///
/// Errors: the bucket is not [`bucket_bytes`]`(versions)` long.
pub fn seek_claim(bucket: &[u8], versions: usize, word: u64) -> Result<ClaimSeek, CvtError> {
    check_bucket(bucket, versions)?;
    let states = (0..CVTS_PER_BUCKET).map(|s| slot_state(bucket, versions, s));
    if let Some(slot) = states.clone().position(|s| s == word) {
        return Ok(ClaimSeek::At { slot });
    }
    Ok(if states.into_iter().any(|s| s == SLOT_FREE) {
        ClaimSeek::Stop
    } else {
        ClaimSeek::Next
    })
}

/// A compute node's cache of CVT addresses (Motor 4.1): `(table, key)` to the address
/// of its CVT, so that a read is one READ of the CVT rather than of its bucket. Bounded:
/// when full, an insert evicts an arbitrary entry.
#[derive(Debug, Default)]
pub struct AddrCache {
    map: HashMap<(u32, u64), u64>,
    capacity: usize,
    stats: CacheStats,
}

/// Counters of an [`AddrCache`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups that found an address.
    pub hits: u64,
    /// Lookups that found none.
    pub misses: u64,
    /// Entries found stale by the CVT read through them.
    pub stale: u64,
}

impl AddrCache {
    /// A cache of at most `capacity` addresses (at least 1).
    pub fn new(capacity: usize) -> Self {
        Self {
            map: HashMap::new(),
            capacity: capacity.max(1),
            stats: CacheStats::default(),
        }
    }

    /// The cached address of `(table, key)`'s CVT.
    pub fn get(&mut self, table: u32, key: u64) -> Option<u64> {
        let r = self.map.get(&(table, key)).copied();
        match r {
            Some(_) => self.stats.hits += 1,
            None => self.stats.misses += 1,
        }
        r
    }

    /// Remember that `(table, key)`'s CVT is at `addr` (after a bucket search found it).
    pub fn insert(&mut self, table: u32, key: u64, addr: u64) {
        if self.map.len() >= self.capacity && !self.map.contains_key(&(table, key)) {
            if let Some(&victim) = self.map.keys().next() {
                self.map.remove(&victim);
            }
        }
        self.map.insert((table, key), addr);
    }

    /// The CVT read through the cached address of `(table, key)` belongs to it: true.
    /// Otherwise (the slot was freed, or reused by another key after a delete) the entry
    /// is dropped and the caller searches the bucket again: false.
    pub fn confirm(&mut self, table: u32, key: u64, cvt: &Cvt) -> bool {
        let h = &cvt.header;
        if h.state == SLOT_IN_USE && (h.table, h.key) == (table, key) {
            return true;
        }
        self.map.remove(&(table, key));
        self.stats.stale += 1;
        false
    }

    /// Forget `(table, key)` (it was deleted).
    pub fn remove(&mut self, table: u32, key: u64) {
        self.map.remove(&(table, key));
    }

    /// Forget every address (they name regions of memory nodes no longer used).
    pub fn clear(&mut self) {
        self.map.clear();
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Counters so far.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cvt::{Header, SLOT_IN_USE};
    use tso::Timestamp;

    const N: usize = 2;

    fn cvt(table: u32, key: u64, state: u64) -> Cvt {
        let mut c = Cvt::new(
            Header {
                table,
                len: 16,
                key,
                lock: 0,
                state,
            },
            N,
        );
        if state != SLOT_FREE {
            c.install(0, Timestamp(5), 0x4000 + key, false);
        }
        c
    }

    fn bucket(slots: [Cvt; CVTS_PER_BUCKET]) -> Vec<u8> {
        slots.iter().flat_map(|c| c.encode()).collect()
    }

    #[test]
    fn a_bucket_search_finds_the_key_a_free_slot_or_sends_on() {
        let free = || cvt(0, 0, SLOT_FREE);
        let b = bucket([
            cvt(1, 10, SLOT_IN_USE),
            free(),
            cvt(1, 12, SLOT_IN_USE),
            free(),
        ]);
        assert_eq!(bucket_bytes(N), b.len());
        match search(&b, N, 1, 12).unwrap() {
            Found::At { slot, cvt } => assert_eq!((slot, cvt.header.key), (2, 12)),
            f => panic!("{f:?}"),
        }
        // Same key, other table: absent; the first free slot is offered.
        assert_eq!(search(&b, N, 2, 12).unwrap(), Found::Absent { free: 1 });
        let full = bucket([
            cvt(1, 1, SLOT_IN_USE),
            cvt(1, 2, SLOT_IN_USE),
            cvt(1, 3, SLOT_IN_USE),
            cvt(1, 4, SLOT_IN_USE),
        ]);
        assert_eq!(search(&full, N, 1, 5).unwrap(), Found::Next);
        assert!(matches!(
            search(&full[1..], N, 1, 5),
            Err(CvtError::BucketSize { .. })
        ));
    }

    #[test]
    fn a_claimed_slot_is_skipped_and_a_freed_one_is_free() {
        let id = crate::txn_id::TxnId {
            owner: crate::txn_id::Owner::new(3, 1),
            client: 2,
            seq: 9,
        }
        .pack();
        let claimed = crate::cvt::claim_word(id);
        assert_eq!(crate::cvt::claimer(claimed), Some(id));
        for plain in [SLOT_FREE, SLOT_IN_USE, crate::cvt::SLOT_FREED] {
            assert_eq!(crate::cvt::claimer(plain), None);
        }
        // The claimed slot holds the key's header already: it is skipped, not found.
        let b = bucket([
            cvt(1, 1, SLOT_IN_USE),
            cvt(1, 7, claimed),
            cvt(0, 0, crate::cvt::SLOT_FREED),
            cvt(0, 0, SLOT_FREE),
        ]);
        assert_eq!(search(&b, N, 1, 7).unwrap(), Found::Absent { free: 2 });
        assert_eq!(slot_state(&b, N, 2), crate::cvt::SLOT_FREED);
        assert_eq!(slot_state(&b, N, 1), claimed);
    }

    /// A recovery's search for a dead inserter's claim goes past full buckets and past
    /// buckets whose free slots were freed by a recovery, finds the claim, and stops at
    /// the first bucket with a never-claimed slot. Planted: a search that stopped at any
    /// free slot (a freed one included) would miss the claim behind a freed slot.
    #[test]
    fn a_claim_search_stops_only_at_a_never_claimed_slot() {
        let word = crate::cvt::claim_word(0x0030_0100_0000_0001);
        let other = crate::cvt::claim_word(0x0040_0100_0000_0001);
        let full = bucket([
            cvt(1, 1, SLOT_IN_USE),
            cvt(1, 2, SLOT_IN_USE),
            cvt(1, 3, other),
            cvt(1, 4, SLOT_IN_USE),
        ]);
        let freed = bucket([
            cvt(1, 5, SLOT_IN_USE),
            cvt(0, 0, crate::cvt::SLOT_FREED),
            cvt(1, 6, SLOT_IN_USE),
            cvt(1, 7, SLOT_IN_USE),
        ]);
        let holds = bucket([
            cvt(1, 8, SLOT_IN_USE),
            cvt(1, 9, word),
            cvt(0, 0, SLOT_FREE),
            cvt(0, 0, SLOT_FREE),
        ]);
        let open = bucket([
            cvt(1, 10, SLOT_IN_USE),
            cvt(0, 0, SLOT_FREE),
            cvt(0, 0, SLOT_FREE),
            cvt(0, 0, SLOT_FREE),
        ]);
        let walk = |chain: &[&Vec<u8>]| {
            for (i, b) in chain.iter().enumerate() {
                match seek_claim(b, N, word).unwrap() {
                    ClaimSeek::At { slot } => return Some((i, slot)),
                    ClaimSeek::Stop => return None,
                    ClaimSeek::Next => {}
                }
            }
            None
        };
        assert_eq!(walk(&[&full, &freed, &holds, &open]), Some((2, 1)));
        assert_eq!(
            walk(&[&full, &open, &holds]),
            None,
            "stops at a never-claimed slot"
        );
        // The planted rule: stop at any free slot.
        let planted = |b: &Vec<u8>| (0..CVTS_PER_BUCKET).any(|s| is_free(slot_state(b, N, s)));
        assert!(
            planted(&freed),
            "the planted rule would stop before the claim"
        );
        assert!(matches!(
            seek_claim(&full[1..], N, word),
            Err(CvtError::BucketSize { .. })
        ));
    }

    #[test]
    fn a_torn_cvt_matters_only_when_it_is_the_keys() {
        let b = bucket([
            cvt(1, 1, SLOT_IN_USE),
            cvt(1, 2, SLOT_IN_USE),
            cvt(1, 3, SLOT_IN_USE),
            cvt(0, 0, SLOT_FREE),
        ]);
        let mut torn = b.clone();
        let at = cvt_bytes(N) + 32; // slot 1's first cell, head CV
        torn[at] = torn[at].wrapping_add(1);
        assert!(matches!(
            search(&torn, N, 1, 2),
            Err(CvtError::TornCell { .. })
        ));
        assert!(matches!(
            search(&torn, N, 1, 3),
            Ok(Found::At { slot: 2, .. })
        ));
    }

    #[test]
    fn a_stale_cache_entry_is_detected_and_dropped() {
        let mut c = AddrCache::new(2);
        assert_eq!(c.get(1, 7), None);
        c.insert(1, 7, 0x100);
        assert_eq!(c.get(1, 7), Some(0x100));
        // Read through the cache: the key's own CVT confirms it.
        assert!(c.confirm(1, 7, &cvt(1, 7, SLOT_IN_USE)));
        // The slot now holds another key (deleted, then reused by an insert).
        assert!(!c.confirm(1, 7, &cvt(1, 8, SLOT_IN_USE)));
        assert_eq!(c.get(1, 7), None, "a stale entry is dropped");
        // A freed slot is stale too.
        c.insert(1, 7, 0x100);
        assert!(!c.confirm(1, 7, &cvt(0, 0, SLOT_FREE)));
        assert_eq!(
            c.stats(),
            CacheStats {
                hits: 1,
                misses: 2,
                stale: 2
            }
        );
        // Bounded.
        for k in 0..10 {
            c.insert(2, k, k);
        }
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn keys_spread_over_buckets() {
        let buckets = 64u64;
        let mut seen = vec![0u32; buckets as usize];
        for k in 0..6400 {
            seen[home_bucket(1, k, buckets) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| (50..=150).contains(&n)), "{seen:?}");
        assert_eq!(home_bucket(1, 5, 0), 0, "no buckets is treated as one");
    }
}
