//! The KVS / YCSB table (the papers' key-value store: 8-byte keys, 40-byte values by
//! default) and its self-checking values.
//!
//! Every value carries its key's version counter and a checksum of (key, counter,
//! payload), so a read that returns another key's value, a torn value or a stale
//! mixture is caught on the spot:
//!
//! ```text
//! offset 0            8                      len - 8        len
//!        | counter u64 | payload (filler)     | checksum u64 |
//! ```
//!
//! The payload is a deterministic filler of (key, counter); the checksum is FNV-1a 64
//! over the key, the counter and the payload. The counter counts the committed updates
//! of the key since load (0 at load and at insert), so after a run the sum of counters
//! equals the number of committed updates.

use rrpc::fabric::{Fabric, MemoryRegion};

use crate::cvt_remote::partition_of;
use crate::cvt_store::{CvtTableBuilder, CvtTableExport};
use crate::smallbank::LOAD_VERSION;
use crate::store::{hash_key, StoreError};

/// Table id of the KVS table.
pub const TABLE: u32 = 0;
/// Name of the KVS table.
pub const TABLE_NAME: &str = "kvs";
/// Default value size, bytes (the papers' KVS).
pub const DEFAULT_VALUE_BYTES: usize = 40;
/// Smallest value size: the counter and the checksum.
pub const MIN_VALUE_BYTES: usize = 16;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a 64 of `bytes`, continuing from `h`.
fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

/// FNV-1a 64 of a `u64`'s little-endian bytes (YCSB's scrambling hash).
pub fn fnv64(x: u64) -> u64 {
    fnv1a(FNV_OFFSET, &x.to_le_bytes())
}

fn checksum(key: u64, body: &[u8]) -> u64 {
    fnv1a(fnv1a(FNV_OFFSET, &key.to_le_bytes()), body)
}

/// The value of `key` at update counter `counter`, `len` bytes (at least
/// [`MIN_VALUE_BYTES`]; panics below).
pub fn encode_value(key: u64, counter: u64, len: usize) -> Vec<u8> {
    assert!(len >= MIN_VALUE_BYTES, "KVS values hold at least 16 bytes");
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(&counter.to_le_bytes());
    let mut seed = hash_key(0, key ^ counter.rotate_left(32));
    while v.len() < len - 8 {
        seed = hash_key(1, seed);
        let take = (len - 8 - v.len()).min(8);
        v.extend_from_slice(&seed.to_le_bytes()[..take]);
    }
    let sum = checksum(key, &v);
    v.extend_from_slice(&sum.to_le_bytes());
    v
}

/// Check that `value` is a value of `key` ([`encode_value`]'s layout, checksum intact)
/// and return its update counter.
///
/// Errors: a description of what does not match (size, checksum).
pub fn check_value(key: u64, value: &[u8]) -> Result<u64, String> {
    if value.len() < MIN_VALUE_BYTES {
        return Err(format!(
            "key {key}: value of {} bytes, need at least {MIN_VALUE_BYTES}",
            value.len()
        ));
    }
    let (body, tail) = value.split_at(value.len() - 8);
    let counter = u64::from_le_bytes(body[..8].try_into().expect("8 bytes"));
    let found = u64::from_le_bytes(tail.try_into().expect("8 bytes"));
    let want = checksum(key, body);
    if found != want {
        return Err(format!(
            "key {key}: checksum {found:#018x} does not match {want:#018x} (counter {counter})"
        ));
    }
    Ok(counter)
}

/// Build the KVS table of partition `partition` of `partitions` for `records` records
/// (keys `0..records`, each on the partition [`partition_of`] gives it, counter 0) of
/// `value_bytes` bytes as a CVT table of `versions` cells, loaded at [`LOAD_VERSION`].
/// The index has room for twice its share plus 64 Ki keys, for inserts (YCSB D).
///
/// Errors: [`StoreError::ValueSize`] when `value_bytes` is below [`MIN_VALUE_BYTES`];
/// registering memory failed; the table filled up.
pub fn load(
    fabric: &Fabric,
    records: u64,
    value_bytes: usize,
    versions: usize,
    partition: u32,
    partitions: u32,
) -> Result<(CvtTableExport, [MemoryRegion; 3]), StoreError> {
    if value_bytes < MIN_VALUE_BYTES {
        return Err(StoreError::ValueSize {
            table: TABLE_NAME.into(),
            got: value_bytes,
            want: MIN_VALUE_BYTES,
        });
    }
    let share = records.div_ceil(u64::from(partitions.max(1))) * 2 + 65_536;
    let mut t = CvtTableBuilder::new(fabric, TABLE, TABLE_NAME, versions, value_bytes, share)?;
    for k in (0..records).filter(|&k| partition_of(TABLE, k, partitions) == partition) {
        t.insert(k, &encode_value(k, 0, value_bytes), LOAD_VERSION)?;
    }
    Ok(t.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_at_every_size() {
        for len in [16, 17, 24, 40, 41, 100] {
            for (key, counter) in [(0, 0), (1, 7), (u64::MAX, u64::MAX), (12345, 1 << 40)] {
                let v = encode_value(key, counter, len);
                assert_eq!(v.len(), len);
                assert_eq!(check_value(key, &v), Ok(counter), "len {len} key {key}");
            }
        }
        // Deterministic, and different for another counter.
        assert_eq!(encode_value(5, 1, 40), encode_value(5, 1, 40));
        assert_ne!(encode_value(5, 1, 40), encode_value(5, 2, 40));
    }

    #[test]
    fn corruption_and_wrong_keys_are_caught() {
        let v = encode_value(42, 3, 40);
        // Another key's value.
        let e = check_value(43, &v).unwrap_err();
        assert!(e.contains("key 43: checksum"), "{e}");
        // A flipped bit anywhere: counter, payload, checksum.
        for byte in [0, 7, 8, 20, 31, 32, 39] {
            let mut bad = v.clone();
            bad[byte] ^= 0x10;
            assert!(check_value(42, &bad).is_err(), "flip in byte {byte} missed");
        }
        // A torn value: the first half of counter 3, the second of counter 4.
        let w = encode_value(42, 4, 40);
        let mut torn = v[..20].to_vec();
        torn.extend_from_slice(&w[20..]);
        assert!(check_value(42, &torn).is_err());
        // Too short.
        assert!(check_value(42, &v[..15]).unwrap_err().contains("15 bytes"));
    }

    #[test]
    fn fnv64_scrambles() {
        assert_ne!(fnv64(0), fnv64(1));
        assert_eq!(fnv64(7), fnv64(7));
    }
}
