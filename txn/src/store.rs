//! Memory-node storage layout: tables of fixed-size records behind a hash index, both in
//! registered memory and read by compute nodes with one-sided READs.
//!
//! Record (`record_bytes = 24 + value_bytes` rounded up to 8):
//! ```text
//! [0, 8)                  version (start copy)
//! [8, 16)                 key
//! [16, 16 + value_bytes)  value (zero padded to 8)
//! [record_bytes - 8, ..)  version (end copy)
//! ```
//! A writer (holding the object's lock) writes the whole record with one WRITE whose
//! last 8 bytes (the end version) land last. A reader that sees the two copies differ
//! has read a record in the middle of a write (a torn read) and treats it as a conflict.
//! A torn read whose copies happen to agree is still caught: the writer held the lock
//! during its WRITE and bumped the version, so the reader's validation (version
//! unchanged, lock free) fails. This is FaRM's and FORD's version-at-both-ends check;
//! Motor 4.4 and Lotus 7.1 use the same idea with anchors and per-cacheline versions.
//!
//! Index bucket (128 bytes): 8 slots of `{ key + 1 (0 = empty): u64, record address: u64 }`.
//! A key hashes to a bucket; a full bucket overflows into the next (linear probing), so a
//! lookup that misses in a full bucket reads the next one.

use serde::{Deserialize, Serialize};

use rrpc::fabric::{MemoryRegion, MrDesc, RemoteAddr};

/// Slots per index bucket.
pub const SLOTS_PER_BUCKET: usize = 8;
/// Bytes per index slot.
pub const SLOT_BYTES: usize = 16;
/// Bytes per index bucket.
pub const BUCKET_BYTES: usize = SLOTS_PER_BUCKET * SLOT_BYTES;
/// Bytes of a record that are not the value: start version, key, end version.
pub const RECORD_OVERHEAD: usize = 24;

/// A table as a compute node sees it (exported by the memory node under `"tables"`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableExport {
    /// Table id.
    pub id: u32,
    /// Human-readable name.
    pub name: String,
    /// The hash index.
    pub index: MrDesc,
    /// Number of index buckets (a power of two).
    pub n_buckets: u64,
    /// The record array.
    pub records: MrDesc,
    /// Bytes per record.
    pub record_bytes: u64,
    /// Bytes of value per record.
    pub value_bytes: u64,
    /// Records in use.
    pub n_records: u64,
}

impl TableExport {
    /// Remote address of index bucket `b`.
    pub fn bucket_addr(&self, b: u64) -> RemoteAddr {
        self.index.at((b % self.n_buckets) * BUCKET_BYTES as u64)
    }
    /// Home bucket of `key`.
    pub fn home_bucket(&self, key: u64) -> u64 {
        hash_key(self.id, key) & (self.n_buckets - 1)
    }
}

/// Bytes per record for `value_bytes` of value.
pub fn record_bytes(value_bytes: usize) -> usize {
    RECORD_OVERHEAD + value_bytes.div_ceil(8) * 8
}

/// SplitMix64 of (table, key): the index hash.
pub fn hash_key(table: u32, key: u64) -> u64 {
    let mut z = key ^ (u64::from(table) << 56) ^ 0x9E37_79B9_7F4A_7C15;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Result of searching one index bucket image.
#[derive(Debug, PartialEq, Eq)]
pub enum BucketLookup {
    /// The key's record address.
    Found(u64),
    /// Not here and the bucket has a free slot: the key does not exist.
    Absent,
    /// Not here and the bucket is full: look in the next bucket.
    Next,
}

/// Search a 128-byte bucket image for `key`.
pub fn search_bucket(bucket: &[u8], key: u64) -> BucketLookup {
    for s in 0..SLOTS_PER_BUCKET {
        let k = u64::from_le_bytes(
            bucket[s * SLOT_BYTES..s * SLOT_BYTES + 8]
                .try_into()
                .expect("8"),
        );
        if k == 0 {
            return BucketLookup::Absent;
        }
        if k == key.wrapping_add(1) {
            let a = &bucket[s * SLOT_BYTES + 8..s * SLOT_BYTES + 16];
            return BucketLookup::Found(u64::from_le_bytes(a.try_into().expect("8")));
        }
    }
    BucketLookup::Next
}

/// A record image decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Version (start copy).
    pub version: u64,
    /// Key.
    pub key: u64,
    /// Value bytes (`value_bytes` long).
    pub value: Vec<u8>,
}

/// Why a record image is unusable.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// Start and end versions differ: read during a write.
    #[error("torn read: start version {start} != end version {end}")]
    Torn {
        /// Start copy.
        start: u64,
        /// End copy.
        end: u64,
    },
    /// The key in the record is not the one looked up (stale cached address).
    #[error("record holds key {found}, expected {expected}")]
    WrongKey {
        /// Expected key.
        expected: u64,
        /// Key found.
        found: u64,
    },
}

/// Decode a record image, checking both version copies and the key.
pub fn decode_record(img: &[u8], key: u64, value_bytes: usize) -> Result<Record, RecordError> {
    let n = img.len();
    let start = u64::from_le_bytes(img[0..8].try_into().expect("8"));
    let end = u64::from_le_bytes(img[n - 8..n].try_into().expect("8"));
    if start != end {
        return Err(RecordError::Torn { start, end });
    }
    let found = u64::from_le_bytes(img[8..16].try_into().expect("8"));
    if found != key {
        return Err(RecordError::WrongKey {
            expected: key,
            found,
        });
    }
    Ok(Record {
        version: start,
        key,
        value: img[16..16 + value_bytes].to_vec(),
    })
}

/// Encode a record image of `record_bytes(value.len())` bytes.
pub fn encode_record(version: u64, key: u64, value: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&key.to_le_bytes());
    out.extend_from_slice(value);
    out.resize(record_bytes(value.len()) - 8, 0);
    out.extend_from_slice(&version.to_le_bytes());
}

/// A table being built by the memory node in its own registered memory.
pub struct TableBuilder {
    export: TableExport,
    index: MemoryRegion,
    records: MemoryRegion,
    capacity: u64,
    buf: Vec<u8>,
}

/// Errors of table construction.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Registering memory failed.
    #[error(transparent)]
    Fabric(#[from] rrpc::fabric::FabricError),
    /// More records than the table's capacity.
    #[error("table {0} is full ({1} records)")]
    Full(String, u64),
    /// The key is already present.
    #[error("table {0}: duplicate key {1}")]
    Duplicate(String, u64),
    /// Value of the wrong size.
    #[error("table {table}: value of {got} bytes, expected {want}")]
    ValueSize {
        /// Table name.
        table: String,
        /// Bytes given.
        got: usize,
        /// Bytes expected.
        want: usize,
    },
}

impl TableBuilder {
    /// Allocate a table for up to `capacity` records of `value_bytes` each. The index
    /// has a power-of-two number of buckets at most half full on average.
    pub fn new(
        fabric: &rrpc::fabric::Fabric,
        id: u32,
        name: &str,
        value_bytes: usize,
        capacity: u64,
    ) -> Result<Self, StoreError> {
        let capacity = capacity.max(1);
        let n_buckets = (capacity * 2)
            .div_ceil(SLOTS_PER_BUCKET as u64)
            .next_power_of_two();
        let rb = record_bytes(value_bytes);
        let index = fabric.alloc_mr(n_buckets as usize * BUCKET_BYTES)?;
        let records = fabric.alloc_mr(capacity as usize * rb)?;
        Ok(Self {
            export: TableExport {
                id,
                name: name.into(),
                index: index.desc(),
                n_buckets,
                records: records.desc(),
                record_bytes: rb as u64,
                value_bytes: value_bytes as u64,
                n_records: 0,
            },
            index,
            records,
            capacity,
            buf: Vec::new(),
        })
    }

    /// Insert `key` with `value` at version 1.
    pub fn insert(&mut self, key: u64, value: &[u8]) -> Result<(), StoreError> {
        let e = &self.export;
        if value.len() != e.value_bytes as usize {
            return Err(StoreError::ValueSize {
                table: e.name.clone(),
                got: value.len(),
                want: e.value_bytes as usize,
            });
        }
        if e.n_records == self.capacity {
            return Err(StoreError::Full(e.name.clone(), self.capacity));
        }
        let slot_of_record = e.n_records;
        let rec_off = slot_of_record * e.record_bytes;
        let mut b = e.home_bucket(key);
        let slot_off = 'probe: loop {
            for s in 0..SLOTS_PER_BUCKET {
                let off = ((b % e.n_buckets) as usize) * BUCKET_BYTES + s * SLOT_BYTES;
                let k = self.index.load_u64(off);
                if k == 0 {
                    break 'probe off;
                }
                if k == key.wrapping_add(1) {
                    return Err(StoreError::Duplicate(e.name.clone(), key));
                }
            }
            b += 1;
        };
        encode_record(1, key, value, &mut self.buf);
        self.records.write(rec_off as usize, &self.buf);
        self.index.store_u64(slot_off + 8, e.records.addr + rec_off);
        self.index.store_u64(slot_off, key.wrapping_add(1));
        self.export.n_records += 1;
        Ok(())
    }

    /// The export describing the table, and the regions (which must outlive serving).
    pub fn finish(self) -> (TableExport, MemoryRegion, MemoryRegion) {
        (self.export, self.index, self.records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_roundtrip_and_torn_detection() {
        let mut img = Vec::new();
        encode_record(7, 42, &[1, 2, 3], &mut img);
        assert_eq!(img.len(), record_bytes(3));
        assert_eq!(img.len(), 32);
        let r = decode_record(&img, 42, 3).unwrap();
        assert_eq!(
            (r.version, r.key, r.value.as_slice()),
            (7, 42, &[1u8, 2, 3][..])
        );
        let n = img.len();
        img[n - 8] = 8; // end version from a newer write not yet... or an older one
        assert_eq!(
            decode_record(&img, 42, 3),
            Err(RecordError::Torn { start: 7, end: 8 })
        );
        encode_record(7, 41, &[0; 3], &mut img);
        assert!(matches!(
            decode_record(&img, 42, 3),
            Err(RecordError::WrongKey { .. })
        ));
    }

    #[test]
    fn bucket_search() {
        let mut b = vec![0u8; BUCKET_BYTES];
        assert_eq!(search_bucket(&b, 5), BucketLookup::Absent);
        for s in 0..SLOTS_PER_BUCKET {
            b[s * 16..s * 16 + 8].copy_from_slice(&(s as u64 + 1).to_le_bytes());
            b[s * 16 + 8..s * 16 + 16].copy_from_slice(&(1000 + s as u64).to_le_bytes());
        }
        assert_eq!(search_bucket(&b, 3), BucketLookup::Found(1003));
        assert_eq!(search_bucket(&b, 0), BucketLookup::Found(1000));
        assert_eq!(search_bucket(&b, 99), BucketLookup::Next);
    }
}
