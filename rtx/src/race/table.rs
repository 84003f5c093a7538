//! Layout and codecs of the RACE hash table (sans-IO): how a key hashes, the slot word, the
//! bucket header, the directory and the key-value record (Transactional Indexes on
//! Disaggregated Memory with Repairable Transaction, 5 "Case study: RaceHashing"; RACE
//! hashing, ATC 21, for the original design this simplifies).
//!
//! Every part lives in the data block of a TXObj of an rTX region ([`crate::layout`]):
//!
//! ```text
//! directory (object 0)   word 0: 1:1 | 0:55 | global depth G:8
//!                        words 1..=2^G: mptr of the subtable for directory index i
//! subtable               block_bytes / 64 buckets of 64 B; bucket = 8 words:
//!                        word 0 header: 1:1 | 0:23 | local depth d:8 | suffix:32
//!                        words 1..8: slots (7 per bucket)
//! slot (8 B)             fp:8 | dirhash:16 | rec:40     (0 = empty)
//! record page            word 0: RECORD_PAGE magic, then 16-B records (key, value)
//! ```
//!
//! A key's 64-bit hash `h` gives its directory bits `h & 0xFFFF` (the subtable is
//! directory entry `h mod 2^G`, extendible hashing on the low bits), a fingerprint
//! `(h >> 16) & 0xFF` and two candidate buckets (RACE's two hash choices; its combined and overflow buckets
//! are left out). A subtable of local depth `d` holds exactly the keys whose low `d` hash
//! bits equal its suffix. The slot keeps the key's directory bits, so a rehash can split a
//! subtable by bit `d` without reading any record, and keeps each moved slot at the same
//! (bucket, slot) position in the new subtable (the buckets do not depend on `d`). The
//! key and the value live out of place in an immutable 16-B record (as RACE's KV blocks),
//! so that inserting or updating is one CAS of the slot from its old word to a word
//! naming a record written before it; a replaced record is reused after a wait, as RACE
//! frees its KV blocks ([`super::records`]). A subtable is **full** for a key when both of the
//! key's buckets have no empty slot; an insert then splits the subtable, again if the
//! split moved nothing out of those buckets, and fails with
//! [`super::RaceError::TableFull`] at the largest depth (RACE's overflow buckets, which
//! would absorb such a pile-up, are not built).

/// Bytes of a bucket (header word and 7 slots).
pub const BUCKET_BYTES: u64 = 64;
/// Slots per bucket (the 8th word is the header).
pub const SLOTS: usize = 7;
/// Bits of the key hash a slot keeps for splitting: the largest local depth. The
/// directory, one block, usually binds first: 4 KB blocks give depth 8 (256 subtables of
/// 448 slots), 16 KB blocks depth 10.
pub const DIR_BITS: u8 = 16;
/// Bytes of a key-value record (key, value).
pub const RECORD_BYTES: u64 = 16;
/// Word 0 of a block used as a record page ("RACEREC1"; bit 63 clear, so it is never a
/// bucket or directory header).
pub const RECORD_PAGE: u64 = 0x5241_4345_5245_4331;
/// The valid bit of bucket and directory headers.
pub const VALID: u64 = 1 << 63;
/// Largest record index a slot names (40 bits: records in the first 16 TB of the region).
pub const REC_MAX: u64 = (1 << 40) - 1;

/// Mix a key into 64 hash bits (splitmix64's finaliser).
pub fn hash64(key: u64) -> u64 {
    let mut z = key.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// What a key's hash selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyHash {
    /// The low [`DIR_BITS`] hash bits (directory index and subtable split bits).
    pub dir: u16,
    /// Fingerprint stored in the slot to skip records of other keys.
    pub fp: u8,
    /// The two candidate buckets (distinct when the subtable has 2 or more).
    pub buckets: [usize; 2],
}

impl KeyHash {
    /// Hash `key` for subtables of `nb` buckets (`nb >= 1`).
    pub fn new(key: u64, nb: usize) -> Self {
        let h = hash64(key);
        let b1 = ((h >> 24) & 0xF_FFFF) as usize % nb;
        let mut b2 = (h >> 44) as usize % nb;
        if b2 == b1 {
            b2 = (b1 + 1) % nb;
        }
        Self {
            dir: h as u16,
            fp: (h >> 16) as u8,
            buckets: [b1, b2],
        }
    }

    /// Whether a subtable of local depth `depth` and `suffix` holds this key.
    pub fn belongs(&self, depth: u8, suffix: u32) -> bool {
        (self.dir as u32) & mask(depth) == suffix
    }

    /// The directory index of this key under global depth `g`.
    pub fn dir_index(&self, g: u8) -> usize {
        ((self.dir as u32) & mask(g)) as usize
    }

    /// The slot word for this key naming record `rec` (1..=[`REC_MAX`]).
    pub fn slot(&self, rec: u64) -> u64 {
        debug_assert!(rec != 0 && rec <= REC_MAX);
        Slot {
            fp: self.fp,
            dir: self.dir,
            rec,
        }
        .word()
    }

    /// Whether a slot's fingerprint and directory bits are this key's.
    pub fn matches(&self, slot: Slot) -> bool {
        slot.fp == self.fp && slot.dir == self.dir
    }
}

/// The low-bit mask of `depth` bits (depth <= 32).
pub fn mask(depth: u8) -> u32 {
    if depth >= 32 {
        u32::MAX
    } else {
        (1u32 << depth) - 1
    }
}

/// A decoded non-empty slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// Fingerprint of the key.
    pub fp: u8,
    /// The key's directory bits.
    pub dir: u16,
    /// Record index: the record lives at byte offset `rec * 16` of the region.
    pub rec: u64,
}

impl Slot {
    /// Encode (`fp:8 | dir:16 | rec:40`).
    pub fn word(self) -> u64 {
        (self.fp as u64) << 56 | (self.dir as u64) << 40 | (self.rec & REC_MAX)
    }
    /// Decode; `None` for the empty word 0.
    pub fn decode(w: u64) -> Option<Self> {
        (w != 0).then_some(Self {
            fp: (w >> 56) as u8,
            dir: (w >> 40) as u16,
            rec: w & REC_MAX,
        })
    }
    /// Byte offset of the record.
    pub fn rec_addr(self) -> u64 {
        self.rec * RECORD_BYTES
    }
}

/// The record index of the record at byte offset `addr` (16-byte aligned, non-zero).
pub fn rec_index(addr: u64) -> u64 {
    debug_assert!(addr.is_multiple_of(RECORD_BYTES) && addr != 0);
    addr / RECORD_BYTES
}

/// The header of every bucket of a subtable: its local depth and suffix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Local depth (hash bits the subtable's keys share).
    pub depth: u8,
    /// Those bits' value.
    pub suffix: u32,
}

impl Header {
    /// Encode (valid bit set).
    pub fn word(self) -> u64 {
        VALID | (self.depth as u64) << 32 | self.suffix as u64
    }
    /// Decode; `None` unless the valid bit is set (a free or record-page block).
    pub fn decode(w: u64) -> Option<Self> {
        (w & VALID != 0).then_some(Self {
            depth: (w >> 32) as u8,
            suffix: w as u32,
        })
    }
}

/// The shape of a subtable and directory for one block size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Bytes of a block (a subtable, the directory, a record page).
    pub block_bytes: u64,
    /// Buckets per subtable.
    pub buckets: usize,
    /// Largest global depth the directory block holds (and at most [`DIR_BITS`]).
    pub max_depth: u8,
}

/// A block size the table cannot use.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{block_bytes}-byte blocks: the hash table needs a multiple of 64 of at least 128")]
pub struct GeometryError {
    /// The layout's block size in bytes.
    pub block_bytes: u64,
}

impl Geometry {
    /// The geometry for `block_bytes`-byte blocks. Errors: [`GeometryError`] unless a
    /// multiple of 64 of at least 128 (two buckets).
    pub fn new(block_bytes: u64) -> Result<Self, GeometryError> {
        if block_bytes < 2 * BUCKET_BYTES || !block_bytes.is_multiple_of(BUCKET_BYTES) {
            return Err(GeometryError { block_bytes });
        }
        let entries = (block_bytes - 8) / 8;
        let max_depth = (63 - entries.leading_zeros()).min(DIR_BITS as u32) as u8;
        Ok(Self {
            block_bytes,
            buckets: (block_bytes / BUCKET_BYTES) as usize,
            max_depth,
        })
    }

    /// Key slots per subtable.
    pub fn slots(&self) -> usize {
        self.buckets * SLOTS
    }

    /// Byte offset, inside a subtable's block, of bucket `b`.
    pub fn bucket_off(&self, b: usize) -> u64 {
        b as u64 * BUCKET_BYTES
    }

    /// Byte offset, inside a subtable's block, of slot `j` (0..7) of bucket `b`.
    pub fn slot_off(&self, b: usize, j: usize) -> u64 {
        self.bucket_off(b) + 8 + 8 * j as u64
    }

    /// An empty subtable's block.
    pub fn empty_subtable(&self, h: Header) -> Vec<u8> {
        let mut out = vec![0u8; self.block_bytes as usize];
        for b in 0..self.buckets {
            let o = self.bucket_off(b) as usize;
            out[o..o + 8].copy_from_slice(&h.word().to_le_bytes());
        }
        out
    }

    /// Records per record page (word 0 is the magic, so the first record is index 1).
    pub fn records_per_page(&self) -> u64 {
        self.block_bytes / RECORD_BYTES
    }
}

fn word(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().expect("8 bytes"))
}

/// A decoded bucket: header and slot words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bucket {
    /// The header; `None` if the bucket is not a valid subtable bucket.
    pub header: Option<Header>,
    /// The 7 slot words.
    pub slots: [u64; SLOTS],
}

impl Bucket {
    /// Decode 64 bytes.
    pub fn decode(b: &[u8]) -> Self {
        let mut slots = [0u64; SLOTS];
        for (j, s) in slots.iter_mut().enumerate() {
            *s = word(b, j + 1);
        }
        Self {
            header: Header::decode(word(b, 0)),
            slots,
        }
    }

    /// Index of the first empty slot.
    pub fn free_slot(&self) -> Option<usize> {
        self.slots.iter().position(|&s| s == 0)
    }

    /// Slots in use.
    pub fn used(&self) -> usize {
        self.slots.iter().filter(|&&s| s != 0).count()
    }
}

/// The directory: global depth and one subtable mptr per index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Directory {
    /// Global depth G (2^G entries).
    pub depth: u8,
    /// Subtable mptrs, `2^depth` of them.
    pub entries: Vec<u64>,
}

impl Directory {
    /// Encode into a block of `block_bytes` (entries must fit).
    pub fn encode(&self, block_bytes: usize) -> Vec<u8> {
        let mut out = vec![0u8; block_bytes];
        out[..8].copy_from_slice(&(VALID | self.depth as u64).to_le_bytes());
        for (i, e) in self.entries.iter().enumerate() {
            out[8 + 8 * i..16 + 8 * i].copy_from_slice(&e.to_le_bytes());
        }
        out
    }

    /// Decode a block; `None` if not a directory or its entries overrun the block.
    pub fn decode(b: &[u8]) -> Option<Self> {
        let h = word(b, 0);
        if h & VALID == 0 || h & !VALID > DIR_BITS as u64 {
            return None;
        }
        let depth = h as u8;
        let n = 1usize << depth;
        if 8 + 8 * n > b.len() {
            return None;
        }
        Some(Self {
            depth,
            entries: (0..n).map(|i| word(b, i + 1)).collect(),
        })
    }

    /// The directory after splitting the subtable of `h` (local depth `h.depth`) into
    /// itself (suffix unchanged) and `new_mptr` (suffix with bit `h.depth` set), doubling
    /// first when `h.depth` equals the global depth. The caller checks the depth limit.
    pub fn split(&self, h: Header, new_mptr: u64) -> Self {
        let mut d = self.clone();
        if h.depth >= d.depth {
            let copy = d.entries.clone();
            d.entries.extend(copy);
            d.depth += 1;
        }
        let hi = h.suffix | 1 << h.depth;
        for (i, e) in d.entries.iter_mut().enumerate() {
            if (i as u32) & mask(h.depth + 1) == hi {
                *e = new_mptr;
            }
        }
        d
    }
}

/// Split a subtable's block (header `h`) by hash bit `h.depth`: the old block without the
/// moved slots and the new subtable's block holding them at the same positions, both at
/// depth `h.depth + 1`. `clear_old = false` is a planted bug (tests): moved slots stay in
/// the old block too. Returns (old, new, slots moved).
pub fn split_block(
    g: &Geometry,
    block: &[u8],
    h: Header,
    clear_old: bool,
) -> (Vec<u8>, Vec<u8>, usize) {
    let lo = Header {
        depth: h.depth + 1,
        suffix: h.suffix,
    };
    let hi = Header {
        depth: h.depth + 1,
        suffix: h.suffix | 1 << h.depth,
    };
    let mut old = block.to_vec();
    let mut new = g.empty_subtable(hi);
    let mut moved = 0;
    for b in 0..g.buckets {
        let o = g.bucket_off(b) as usize;
        old[o..o + 8].copy_from_slice(&lo.word().to_le_bytes());
        for j in 0..SLOTS {
            let so = g.slot_off(b, j) as usize;
            let w = word(&old[so..so + 8], 0);
            if let Some(s) = Slot::decode(w) {
                if (s.dir >> h.depth) & 1 == 1 {
                    new[so..so + 8].copy_from_slice(&w.to_le_bytes());
                    if clear_old {
                        old[so..so + 8].fill(0);
                    }
                    moved += 1;
                }
            }
        }
    }
    (old, new, moved)
}

/// Encode a record.
pub fn record(key: u64, val: u64) -> [u8; 16] {
    let mut r = [0u8; 16];
    r[..8].copy_from_slice(&key.to_le_bytes());
    r[8..].copy_from_slice(&val.to_le_bytes());
    r
}

/// Decode a record into (key, value).
pub fn parse_record(b: &[u8]) -> (u64, u64) {
    (word(b, 0), word(b, 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip() {
        let s = Slot {
            fp: 0xAB,
            dir: 0x5C,
            rec: REC_MAX,
        };
        assert_eq!(Slot::decode(s.word()), Some(s));
        assert_eq!(Slot::decode(0), None);
        let h = Header {
            depth: 7,
            suffix: 0x55,
        };
        assert_eq!(Header::decode(h.word()), Some(h));
        assert_eq!(Header::decode(0), None);
        assert_eq!(Header::decode(RECORD_PAGE), None);
        let d = Directory {
            depth: 2,
            entries: vec![10, 20, 30, 40],
        };
        assert_eq!(Directory::decode(&d.encode(64)), Some(d.clone()));
        assert_eq!(Directory::decode(&d.encode(64)[..32]), None);
        assert_eq!(Directory::decode(&[0u8; 64]), None);
        assert_eq!(parse_record(&record(3, u64::MAX)), (3, u64::MAX));
    }

    #[test]
    fn geometry_bounds_and_offsets() {
        assert!(Geometry::new(64).is_err());
        assert!(Geometry::new(200).is_err());
        let g = Geometry::new(512).unwrap();
        assert_eq!((g.buckets, g.max_depth, g.slots()), (8, 5, 56));
        assert_eq!(Geometry::new(4096).unwrap().max_depth, 8);
        assert_eq!(Geometry::new(16384).unwrap().max_depth, 10);
        assert_eq!(g.slot_off(1, 6), 64 + 8 + 48);
        let e = g.empty_subtable(Header {
            depth: 1,
            suffix: 1,
        });
        for b in 0..g.buckets {
            let bk = Bucket::decode(&e[b * 64..b * 64 + 64]);
            assert_eq!(bk.header.map(|h| h.suffix), Some(1));
            assert_eq!(bk.free_slot(), Some(0));
        }
    }

    #[test]
    fn keys_spread_and_buckets_differ() {
        let mut seen = [0usize; 4];
        for k in 0..4000u64 {
            let h = KeyHash::new(k, 8);
            assert_ne!(h.buckets[0], h.buckets[1]);
            assert!(h.buckets.iter().all(|&b| b < 8));
            seen[h.dir_index(2)] += 1;
            assert!(h.belongs(2, h.dir as u32 & 3));
            assert!(h.belongs(0, 0));
        }
        assert!(seen.iter().all(|&n| n > 800), "{seen:?}");
    }

    #[test]
    fn directory_split_doubles_only_at_global_depth() {
        let d = Directory {
            depth: 1,
            entries: vec![100, 200],
        };
        // Local depth 1 = global: double, index 3 (suffix 1 | bit 1) goes to the new one.
        let s = d.split(
            Header {
                depth: 1,
                suffix: 1,
            },
            300,
        );
        assert_eq!(s.depth, 2);
        assert_eq!(s.entries, vec![100, 200, 100, 300]);
        // Local depth 1 < global 2: no doubling; index 2 goes to the new one.
        let t = s.split(
            Header {
                depth: 1,
                suffix: 0,
            },
            400,
        );
        assert_eq!(t.entries, vec![100, 200, 400, 300]);
    }

    #[test]
    fn split_moves_by_the_next_bit_to_the_same_positions() {
        let g = Geometry::new(128).unwrap();
        let h = Header {
            depth: 0,
            suffix: 0,
        };
        let mut b = g.empty_subtable(h);
        let a = KeyHash {
            dir: 0b10,
            fp: 1,
            buckets: [0, 1],
        }
        .slot(5);
        let c = KeyHash {
            dir: 0b11,
            fp: 2,
            buckets: [0, 1],
        }
        .slot(6);
        b[g.slot_off(0, 2) as usize..][..8].copy_from_slice(&a.to_le_bytes());
        b[g.slot_off(1, 4) as usize..][..8].copy_from_slice(&c.to_le_bytes());
        let (old, new, n) = split_block(&g, &b, h, true);
        assert_eq!(n, 1);
        let (o0, n1) = (Bucket::decode(&old[..64]), Bucket::decode(&new[64..]));
        assert_eq!(o0.slots[2], a);
        assert_eq!(n1.slots[4], c);
        assert_eq!(Bucket::decode(&old[64..]).slots[4], 0);
        assert_eq!(
            o0.header,
            Some(Header {
                depth: 1,
                suffix: 0
            })
        );
        assert_eq!(
            n1.header,
            Some(Header {
                depth: 1,
                suffix: 1
            })
        );
        let (old, _, _) = split_block(&g, &b, h, false);
        assert_eq!(
            Bucket::decode(&old[64..]).slots[4],
            c,
            "planted: not cleared"
        );
    }
}
