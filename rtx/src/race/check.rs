//! Structural checker of a quiescent hash table (for tests and `index-bench`), for both
//! [`super::Race`] and [`super::optimal::Optimal`].
//!
//! READs the directory and every subtable it names outside any rTX and verifies: the
//! directory decodes and its depth fits the geometry; every subtable's buckets carry the
//! same valid header (local depth `d` <= global depth, suffix below `2^d`); the directory
//! indices naming a subtable are exactly those whose low `d` bits equal its suffix; every
//! non-empty slot names a record whose key hashes to that subtable, to that bucket (one of
//! its two) and to the slot's fingerprint and directory bits; and every key is found
//! exactly once. [`check_quiescent`] adds that no LLLock (or spinlock) is held and no log
//! left unfinished.

use std::collections::BTreeMap;

use crate::layout::Layout;
use crate::mem::{Mem, MemError};

use super::records::block_addr_of;
use super::table::{parse_record, Bucket, Geometry, KeyHash, Slot, BUCKET_BYTES};
use super::{read_directory, RaceError};

/// What the checker found wrong, or a failed READ.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// An invariant does not hold; the text names the subtable, slot or key and the rule.
    #[error("hash table invariant broken: {0}")]
    Broken(String),
    /// A READ failed.
    #[error(transparent)]
    Mem(#[from] MemError),
}

fn broken<T>(s: String) -> Result<T, CheckError> {
    Err(CheckError::Broken(s))
}

/// Check the table of `layout`'s region while no operation runs. Returns every
/// (key, value) in key order. Errors: [`CheckError::Broken`] naming the first violation,
/// [`CheckError::Mem`].
pub async fn check_table<M: Mem>(mem: &M, layout: &Layout) -> Result<Vec<(u64, u64)>, CheckError> {
    let g = match Geometry::new(layout.block_bytes) {
        Ok(g) => g,
        Err(e) => return broken(e.to_string()),
    };
    let dir = match read_directory(mem, layout).await {
        Ok(d) => d,
        Err(RaceError::Mem(e)) => return Err(e.into()),
        Err(e) => return broken(e.to_string()),
    };
    if dir.depth > g.max_depth {
        return broken(format!("global depth {} > {}", dir.depth, g.max_depth));
    }
    // Subtable -> directory indices naming it.
    let mut named: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (i, &m) in dir.entries.iter().enumerate() {
        named.entry(m).or_default().push(i);
    }
    let mut out: BTreeMap<u64, (u64, u64, usize, usize)> = BTreeMap::new();
    for (&m, idx) in &named {
        if m < layout.meta_base()
            || !(m - layout.meta_base()).is_multiple_of(16)
            || m >= layout.bitmap_base()
        {
            return broken(format!("directory names {m}, not a TXObj"));
        }
        let Some(base) = block_addr_of(mem, layout, m).await? else {
            return broken(format!("subtable {m} has no block"));
        };
        let blk = mem.read(base, layout.block_bytes as usize).await?;
        let first = Bucket::decode(&blk[..BUCKET_BYTES as usize]).header;
        let Some(h) = first else {
            return broken(format!("subtable {m}: bucket 0 has no header"));
        };
        if h.depth > dir.depth || h.suffix >= 1 << h.depth {
            return broken(format!(
                "subtable {m}: depth {} suffix {} under global depth {}",
                h.depth, h.suffix, dir.depth
            ));
        }
        let want: Vec<usize> = (0..dir.entries.len())
            .filter(|&i| (i as u32) & super::table::mask(h.depth) == h.suffix)
            .collect();
        if *idx != want {
            return broken(format!(
                "subtable {m} (depth {} suffix {}) named by directory indices {idx:?}, want {want:?}",
                h.depth, h.suffix
            ));
        }
        for b in 0..g.buckets {
            let bk = Bucket::decode(&blk[g.bucket_off(b) as usize..][..BUCKET_BYTES as usize]);
            if bk.header != Some(h) {
                return broken(format!(
                    "subtable {m}: bucket {b} header {:?} != {h:?}",
                    bk.header
                ));
            }
            for (j, &w) in bk.slots.iter().enumerate() {
                let Some(s) = Slot::decode(w) else { continue };
                let (k, v) = parse_record(&mem.read(s.rec_addr(), 16).await?);
                let kh = KeyHash::new(k, g.buckets);
                if !kh.belongs(h.depth, h.suffix) {
                    return broken(format!(
                        "key {k} in subtable {m} (depth {} suffix {}) its hash does not select",
                        h.depth, h.suffix
                    ));
                }
                if !kh.buckets.contains(&b) || !kh.matches(s) {
                    return broken(format!(
                        "key {k} at bucket {b} slot {j} of {m}: wrong bucket or fingerprint"
                    ));
                }
                if let Some(&(_, _, m2, b2)) = out.get(&k) {
                    return broken(format!(
                        "key {k} found twice: subtable {m2} bucket {b2} and subtable {m} bucket {b}"
                    ));
                }
                out.insert(k, (k, v, m as usize, b));
            }
        }
    }
    Ok(out.values().map(|&(k, v, _, _)| (k, v)).collect())
}

/// Check that no object of `layout`'s region is locked (LLLock or Optimal spinlock) and
/// no log slot is left unfinished. Errors: [`CheckError::Broken`] naming the first,
/// [`CheckError::Mem`].
pub async fn check_quiescent<M: Mem>(mem: &M, layout: &Layout) -> Result<(), CheckError> {
    use crate::blink::check::{check_quiescent as q, CheckError as B};
    match q(mem, layout).await {
        Ok(()) => Ok(()),
        Err(B::Broken(s)) => broken(s),
        Err(B::Mem(e)) => Err(e.into()),
    }
}
