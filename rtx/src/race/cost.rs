//! The cost of one rehash in one-sided operations, for each variant (Transactional
//! Indexes on Disaggregated Memory with Repairable Transaction, 6, Fig. 15: "rehash 200 ms
//! (rTX) vs 1.3 s (original)"). Counting operations on an in-memory region is a
//! machine-independent proxy for the rehash time: the rTX rehash moves whole blocks in a
//! fixed number of operations, the original moves keys with 2 CASes each.

use std::cell::Cell;

use futures::executor::block_on;

use crate::layout::Layout;
use crate::lease::ManualClock;
use crate::mem::{LocalMem, Mem, MemError};
use crate::{Client, Config};

use super::optimal::Optimal;
use super::table::{Geometry, KeyHash, SLOTS};
use super::{first_free_obj, format_table, Race, RaceError};

/// One-sided operations counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpCount {
    /// READs.
    pub reads: u64,
    /// WRITEs.
    pub writes: u64,
    /// CASes.
    pub cas: u64,
    /// Bytes moved by READs and WRITEs (8 per CAS not included).
    pub bytes: u64,
}

impl OpCount {
    /// All operations.
    pub fn total(&self) -> u64 {
        self.reads + self.writes + self.cas
    }
}

/// The operations of one rehash of a subtable holding `keys` keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RehashOps {
    /// Keys in the subtable before the split.
    pub keys: usize,
    /// Keys the split moved to the new subtable.
    pub moved: u64,
    /// The rTX rehash ([`Race::split`]).
    pub rtx: OpCount,
    /// The original rehash under a spinlock ([`Optimal::split`]).
    pub optimal: OpCount,
}

/// A memory that counts the one-sided operations it serves (tests and [`rehash_ops`]).
pub(crate) struct CountMem {
    pub(crate) inner: LocalMem,
    pub(crate) n: Cell<OpCount>,
}

impl CountMem {
    fn bump(&self, f: impl FnOnce(&mut OpCount)) {
        let mut c = self.n.get();
        f(&mut c);
        self.n.set(c);
    }
}

impl Mem for CountMem {
    async fn read(&self, off: u64, len: usize) -> Result<Vec<u8>, MemError> {
        self.bump(|c| {
            c.reads += 1;
            c.bytes += len as u64;
        });
        self.inner.read(off, len).await
    }
    async fn write(&self, off: u64, data: &[u8]) -> Result<(), MemError> {
        self.bump(|c| {
            c.writes += 1;
            c.bytes += data.len() as u64;
        });
        self.inner.write(off, data).await
    }
    async fn cas(&self, off: u64, expected: u64, new: u64) -> Result<u64, MemError> {
        self.bump(|c| c.cas += 1);
        self.inner.cas(off, expected, new).await
    }
}

/// `n` keys that one subtable of `g` holds without splitting, as an insert in this
/// order places them (the less used of the two buckets, the first on a tie).
fn keys_for_one_subtable(g: &Geometry, n: usize) -> Option<Vec<u64>> {
    let mut used = vec![0usize; g.buckets];
    let mut out = Vec::with_capacity(n);
    let mut k = 0u64;
    while out.len() < n && k < 1_000_000 {
        let [a, b] = KeyHash::new(k, g.buckets).buckets;
        let pick = [a, b]
            .into_iter()
            .filter(|&x| used[x] < SLOTS)
            .min_by_key(|&x| used[x]);
        if let Some(x) = pick {
            used[x] += 1;
            out.push(k);
        }
        k += 1;
    }
    (out.len() == n).then_some(out)
}

/// Build a one-subtable table of `block_bytes`-byte blocks holding `keys` keys, split it
/// with each variant on a fresh in-memory region, and count the split's one-sided
/// operations (the directory is cached; each variant's first record page is claimed
/// before counting). Errors: [`RaceError::Geometry`]; [`RaceError::Format`] when `keys`
/// exceed what one subtable holds; any error of the operations.
pub fn rehash_ops(block_bytes: u64, keys: usize) -> Result<RehashOps, RaceError> {
    let g = Geometry::new(block_bytes)?;
    let ks = keys_for_one_subtable(&g, keys).ok_or_else(|| {
        RaceError::Format(format!(
            "{keys} keys do not fit one subtable of {} slots",
            g.slots()
        ))
    })?;
    let layout = Layout {
        ids: 2,
        max_entries: 8,
        objects: 256,
        block_bytes,
        blocks: 64 * 8,
        reclaim_slots: 16,
    };
    let fresh = || -> Result<CountMem, RaceError> {
        let m = LocalMem::new(layout.total_bytes() as usize);
        block_on(format_table(&layout, &m, 1, 0))?;
        Ok(CountMem {
            inner: m,
            n: Cell::new(OpCount::default()),
        })
    };
    let objs = first_free_obj(0)..layout.objects;
    // rTX.
    let m = fresh()?;
    let clock = ManualClock::new(1_800_000_000_000);
    let mut c = Client::new(layout, 0, 2, clock, Config::default());
    let mut t = Race::new(layout, objs.clone())?;
    let rtx = block_on(async {
        for &k in &ks {
            t.insert(&mut c, &m, k, k).await?;
        }
        let before = m.n.get();
        t.split(&mut c, &m, ks[0]).await?;
        Ok::<_, RaceError>(diff(m.n.get(), before))
    })?;
    // Original.
    let m = fresh()?;
    let mut o = Optimal::new(layout, 0, objs)?;
    let optimal = block_on(async {
        for &k in &ks {
            o.insert(&m, k, k).await?;
        }
        let before = m.n.get();
        o.split(&m, ks[0]).await?;
        Ok::<_, RaceError>(diff(m.n.get(), before))
    })?;
    if t.stats().rehashes != 1 || o.stats().rehashes != 1 {
        return Err(RaceError::Format("the fill split the subtable".into()));
    }
    Ok(RehashOps {
        keys,
        moved: o.stats().moves,
        rtx,
        optimal,
    })
}

fn diff(a: OpCount, b: OpCount) -> OpCount {
    OpCount {
        reads: a.reads - b.reads,
        writes: a.writes - b.writes,
        cas: a.cas - b.cas,
        bytes: a.bytes - b.bytes,
    }
}
