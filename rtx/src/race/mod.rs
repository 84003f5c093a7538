//! RACE hashing whose rehash is an rTX (Transactional Indexes on Disaggregated Memory with
//! Repairable Transaction, 5 "Case study: RaceHashing"; RACE hashing, ATC 21).
//!
//! A directory of subtables of buckets ([`table`] gives the bytes). Every subtable is one
//! TXObj; the directory is another. The common path is RACE's own and runs outside any
//! rTX: a lookup READs two buckets and the records their matching slots name, an insert,
//! update or delete is one CAS of a slot, which is failure atomic by itself. What the rTX
//! version adds to every operation is the paper's check of the subtable's LLLock, here
//! two READs of its TXObj (LLLock and dptr, 16 B), one before and one after the buckets
//! and the CAS:
//!
//! - before: a lock held by a live rehash makes the operation wait (retry); an expired one
//!   is repaired through [`Client::repair`] (its log tells abort or roll forward);
//! - after: if the TXObj words changed, a rehash locked the subtable after this
//!   operation's READs and may have copied the block before the CAS landed, so the
//!   operation is run again on the table as it is now (an upsert or delete run twice has
//!   the effect of one; the value returned is the one the first CAS replaced). The errata
//!   to the paper's design ask for this re-check after the slot CAS.
//!
//! Rehash (the only rTX, [`Race::split`]): pre-lock the full subtable (Opt2: the lock is
//! taken before its block is READ, so every slot CAS either landed before that READ or is
//! re-run by its post-check), READ the directory and a free object of the handle's range
//! in the rTX, split the block by the next hash bit ([`table::split_block`]), and commit a
//! logged rTX writing the old subtable, the new one and the directory (copy-on-write: a
//! new block each, installed by dptr CAS). A client that dies anywhere in it leaves locks
//! that the next operation on the subtable repairs once the lease expired.
//!
//! A slow operation whose CAS lands in a block that a rehash has replaced writes into a
//! retired block; the allocator reuses blocks only after
//! [`crate::alloc::Allocator::min_reuse_ms`] (4.4), far longer than one operation, the
//! same bound the crate's reads rely on.
//!
//! [`optimal`] is RACE's own rehash under a spinlock for comparison; [`check`] verifies a
//! quiescent table.

pub mod check;
pub mod cost;
pub mod optimal;
pub mod records;
pub mod table;

#[cfg(test)]
mod shm_tests;
#[cfg(test)]
mod tests;

use std::ops::Range;
use std::time::Instant;

use crate::dptr::Dptr;
use crate::error::RtxError;
use crate::layout::{format, Layout};
use crate::lease::Clock;
use crate::lllock::LockWord;
use crate::mem::{Mem, MemError};
use crate::txn::Tx;
use crate::Client;
use records::{block_addr_of, Objects, STALE_READ};
use table::{
    parse_record, split_block, Bucket, Directory, Geometry, GeometryError, Header, KeyHash, Slot,
    BUCKET_BYTES,
};

/// Object index of the directory.
pub const DIR_OBJ: u64 = 0;
/// Attempts (retries after a held lock, a stale directory, a failed CAS or post-check, an
/// aborted rehash) of one operation before [`RaceError::Retries`]; see
/// [`Race::max_attempts`].
pub const MAX_ATTEMPTS: u32 = 100_000;

/// The first object index free for handles of a table formatted with `depth`: the
/// directory and the `2^depth` initial subtables come first.
pub fn first_free_obj(depth: u8) -> u64 {
    1 + (1u64 << depth)
}

/// Errors of hash-table operations.
#[derive(Debug, thiserror::Error)]
pub enum RaceError {
    /// A rehash rTX failed other than by abort (aborts are retried); a memory error leaves
    /// its outcome to repair.
    #[error(transparent)]
    Rtx(#[from] RtxError),
    /// A one-sided operation outside an rTX failed.
    #[error(transparent)]
    Mem(#[from] MemError),
    /// The layout's block size cannot hold the table.
    #[error(transparent)]
    Geometry(#[from] GeometryError),
    /// The handle's object range has no free object left (new subtable or record page).
    #[error("no free object left in this handle's range")]
    OutOfObjects,
    /// A subtable is full and already at the largest depth the directory or the slots'
    /// hash bits allow.
    #[error("subtable full at local depth {depth}, the largest this table allows")]
    TableFull {
        /// The subtable's local depth.
        depth: u8,
    },
    /// The operation retried [`Race::max_attempts`] times (e.g. a dead client holds the
    /// subtable's lock and nobody can repair it, as in [`optimal`]).
    #[error("operation gave up after {0} attempts")]
    Retries(u32),
    /// The region holds no directory (not formatted), or the depth asked for does not fit.
    #[error("not a hash table region: {0}")]
    Format(String),
}

impl RaceError {
    fn is_abort(&self) -> bool {
        matches!(self, RaceError::Rtx(RtxError::Aborted(_)))
    }
}

fn subtable_blocks(g: &Geometry, depth: u8) -> impl Fn(u64) -> Option<Vec<u8>> + '_ {
    move |i| {
        (1..=1u64 << depth).contains(&i).then(|| {
            g.empty_subtable(Header {
                depth,
                suffix: (i - 1) as u32,
            })
        })
    }
}

fn check_depth(g: &Geometry, layout: &Layout, depth: u8) -> Result<(), RaceError> {
    if depth > g.max_depth || first_free_obj(depth) > layout.objects {
        return Err(RaceError::Format(format!(
            "initial depth {depth} (largest {}, objects {})",
            g.max_depth, layout.objects
        )));
    }
    Ok(())
}

/// Records are named by 40-bit indices of 16-byte units: the region must lie within
/// 16 TB.
pub(crate) fn check_region(layout: &Layout) -> Result<(), RaceError> {
    if layout.total_bytes() / table::RECORD_BYTES > table::REC_MAX {
        return Err(RaceError::Format(format!(
            "a region of {} bytes is past the 16 TB slots can name",
            layout.total_bytes()
        )));
    }
    Ok(())
}

fn initial_dir(layout: &Layout, depth: u8) -> Directory {
    Directory {
        depth,
        entries: (0..1u64 << depth).map(|s| layout.obj_addr(1 + s)).collect(),
    }
}

/// Format a zeroed region as an empty table of `2^depth` subtables (local depth `depth`):
/// object [`DIR_OBJ`] the directory, objects `1..=2^depth` the subtables, the rest free
/// (zero blocks); object `i` gets block `i` ([`crate::layout::format`], blocks claimed
/// for rTX ID `loader`). Errors: [`RaceError::Geometry`], [`RaceError::Format`] when
/// `depth` exceeds the directory or the objects, the first failed WRITE.
pub async fn format_table<M: Mem>(
    layout: &Layout,
    mem: &M,
    loader: u16,
    depth: u8,
) -> Result<(), RaceError> {
    let g = Geometry::new(layout.block_bytes)?;
    check_depth(&g, layout, depth)?;
    let bb = layout.block_bytes as usize;
    let dir = initial_dir(layout, depth).encode(bb);
    let sub = subtable_blocks(&g, depth);
    format(layout, mem, loader, |i| {
        if i == DIR_OBJ {
            dir.clone()
        } else {
            sub(i).unwrap_or_else(|| vec![0u8; bb])
        }
    })
    .await?;
    Ok(())
}

/// Turn a region freshly formatted by [`crate::host::host`] (object `i` holding block
/// `i`, zero values) into the empty table [`format_table`] lays out: one WRITE per block
/// (the directory and `2^depth` subtables). Run once, before any operation. Errors: as
/// [`format_table`].
pub async fn init_hosted<M: Mem>(layout: &Layout, mem: &M, depth: u8) -> Result<(), RaceError> {
    let g = Geometry::new(layout.block_bytes)?;
    check_depth(&g, layout, depth)?;
    let bb = layout.block_bytes as usize;
    mem.write(
        layout.block_addr(DIR_OBJ),
        &initial_dir(layout, depth).encode(bb),
    )
    .await?;
    let sub = subtable_blocks(&g, depth);
    for i in 1..=1u64 << depth {
        mem.write(layout.block_addr(i), &sub(i).expect("a subtable"))
            .await?;
    }
    Ok(())
}

/// Counters of one handle.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RaceStats {
    /// Operations completed.
    pub ops: u64,
    /// Attempts that met a subtable locked by a live rehash (or, in [`optimal`], any
    /// holder) and retried.
    pub waits: u64,
    /// Attempts whose post-check saw the subtable change after their READs (re-run).
    pub redos: u64,
    /// Expired locks this handle sent to repair.
    pub repairs: u64,
    /// Rehashes (subtable splits) this handle committed.
    pub rehashes: u64,
    /// Rehash rTXs that aborted (retried).
    pub rehash_aborts: u64,
    /// Directory READs (first use and after a stale entry).
    pub dir_reloads: u64,
    /// Slot CASes that failed (a concurrent writer) and retried.
    pub cas_failures: u64,
    /// Inserts that found another copy of their key (a concurrent insert of it) and
    /// removed their own.
    pub duplicates: u64,
    /// Keys moved one by one by this handle's rehashes ([`optimal`] only: 2 CASes each;
    /// the rTX rehash moves whole blocks).
    pub moves: u64,
    /// Attempts whose record READs came too long after their slot READs
    /// ([`records::STALE_READ`]: a record may have been reclaimed in between), re-run.
    pub stale_reads: u64,
    /// Records written into space reclaimed from replaced or deleted ones.
    pub records_reused: u64,
    /// Records retired and not yet written again (waiting out the reuse delay, or ready).
    pub records_retired: u64,
}

/// What one READ of a subtable gave an operation.
struct View {
    st: u64,
    /// The TXObj words (LLLock, dptr) read before the buckets.
    meta: Vec<u8>,
    base: u64,
    buckets: [Bucket; 2],
}

/// A slot holding the key: (index into the view's buckets, slot, word, value).
type Found = (usize, usize, u64, u64);

/// The operation a handle runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Get,
    Insert(u64),
    Update(u64),
    Delete,
}

/// READ the records of the slots in `buckets` whose fingerprint matches, and return the
/// one holding `key` (at most one, by the single-writer-per-key invariant the checker
/// verifies).
pub(crate) async fn find<M: Mem>(
    mem: &M,
    buckets: &[Bucket; 2],
    h: &KeyHash,
    key: u64,
) -> Result<Option<Found>, MemError> {
    for (i, b) in buckets.iter().enumerate() {
        for (j, &w) in b.slots.iter().enumerate() {
            let Some(s) = Slot::decode(w) else { continue };
            if !h.matches(s) {
                continue;
            }
            let (k, v) = parse_record(&mem.read(s.rec_addr(), 16).await?);
            if k == key {
                return Ok(Some((i, j, w, v)));
            }
        }
    }
    Ok(None)
}

/// Whether a slot other than bucket `bucket` (of the key's two) slot `slot` holds `key`:
/// two clients inserted it at once into different empty slots. RACE resolves this by
/// re-reading the buckets after the insert CAS; here every inserter that sees another
/// copy removes its own and runs again as an update (if both see each other both remove
/// theirs and retry, which loses nothing: neither was acknowledged).
pub(crate) async fn another_copy<M: Mem>(
    mem: &M,
    buckets: &[Bucket; 2],
    h: &KeyHash,
    key: u64,
    bucket: usize,
    slot: usize,
) -> Result<bool, MemError> {
    for (i, b) in buckets.iter().enumerate() {
        for (j, &w) in b.slots.iter().enumerate() {
            if h.buckets[i] == h.buckets[bucket] && j == slot {
                continue;
            }
            let Some(s) = Slot::decode(w) else { continue };
            if h.matches(s) && parse_record(&mem.read(s.rec_addr(), 16).await?).0 == key {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// The bucket of the two with a free slot and the fewest used (RACE's two-choice rule).
pub(crate) fn pick_free(buckets: &[Bucket; 2]) -> Option<(usize, usize)> {
    let mut best: Option<(usize, usize, usize)> = None;
    for (i, b) in buckets.iter().enumerate() {
        if let Some(j) = b.free_slot() {
            if best.is_none_or(|(_, _, u)| b.used() < u) {
                best = Some((i, j, b.used()));
            }
        }
    }
    best.map(|(i, j, _)| (i, j))
}

/// One client's handle on a hash table in an rTX region: its directory cache and the
/// range of objects it takes new subtables and record pages from (disjoint between
/// handles). Operations take the client whose rTXs (rehash, repair) they run.
#[derive(Debug)]
pub struct Race {
    layout: Layout,
    geo: Geometry,
    dir: Option<Directory>,
    objs: Objects,
    stats: RaceStats,
    /// Attempts of one operation before [`RaceError::Retries`] (default [`MAX_ATTEMPTS`]).
    pub max_attempts: u32,
    /// Planted bug (tests): a rehash leaves the moved slots in the old subtable too.
    #[cfg(test)]
    pub(crate) planted_keep_moved: bool,
}

impl Race {
    /// A handle on the table [`format_table`] laid out in `layout`'s region, taking new
    /// objects from indices `objs` (disjoint from every other handle's, within
    /// [`first_free_obj`]`(depth)..layout.objects`). Errors: [`RaceError::Geometry`],
    /// [`RaceError::Format`] for a range outside the objects, logs of fewer than 3
    /// entries, or a region past 16 TB.
    pub fn new(layout: Layout, objs: Range<u64>) -> Result<Self, RaceError> {
        let geo = Geometry::new(layout.block_bytes)?;
        check_region(&layout)?;
        if layout.max_entries < 3 {
            return Err(RaceError::Format(format!(
                "logs of {} entries; a rehash writes 3 objects",
                layout.max_entries
            )));
        }
        if objs.start == 0 || objs.end > layout.objects || objs.start > objs.end {
            return Err(RaceError::Format(format!(
                "object range {objs:?} outside 1..{}",
                layout.objects
            )));
        }
        Ok(Self {
            layout,
            geo,
            dir: None,
            objs: Objects::new(objs.start, objs.end),
            stats: RaceStats::default(),
            max_attempts: MAX_ATTEMPTS,
            #[cfg(test)]
            planted_keep_moved: false,
        })
    }

    /// Counters so far.
    pub fn stats(&self) -> RaceStats {
        self.objs.counted(self.stats)
    }

    /// Set the wait before a retired record is reused (tests: 0 with one handle, where
    /// no other reader can be on a record).
    #[cfg(test)]
    pub(crate) fn set_record_reuse_ms(&mut self, ms: u64) {
        self.objs.min_reuse_ms = ms;
    }

    /// The table's geometry (bucket count, largest depth).
    pub fn geometry(&self) -> Geometry {
        self.geo
    }

    async fn directory<M: Mem>(&mut self, mem: &M) -> Result<&Directory, RaceError> {
        if self.dir.is_none() {
            let d = read_directory(mem, &self.layout).await?;
            self.stats.dir_reloads += 1;
            self.dir = Some(d);
        }
        Ok(self.dir.as_ref().expect("loaded"))
    }

    /// READ the subtable `key` hashes to: TXObj, then its two buckets. `None`: retry
    /// (locked, repaired, stale directory).
    async fn view<C: Clock, M: Mem>(
        &mut self,
        c: &mut Client<C>,
        mem: &M,
        h: &KeyHash,
    ) -> Result<Option<View>, RaceError> {
        let d = self.directory(mem).await?;
        let st = d.entries[h.dir_index(d.depth)];
        let meta = mem.read(st, 16).await?;
        let lock = u64::from_le_bytes(meta[..8].try_into().expect("8 bytes"));
        if let LockWord::Locked(s) = LockWord::decode(lock) {
            if s.expired(c.clock().now_ms()) {
                c.repair(mem, st, lock).await?;
                self.stats.repairs += 1;
            } else {
                self.stats.waits += 1;
            }
            return Ok(None);
        }
        let dptr = u64::from_le_bytes(meta[8..16].try_into().expect("8 bytes"));
        let Some(base) = Dptr::decode(dptr)
            .filter(|d| d.block < self.layout.blocks)
            .map(|d| self.layout.block_addr(d.block))
        else {
            self.dir = None;
            return Ok(None);
        };
        let g = self.geo;
        let (a, b) = futures::join!(
            mem.read(base + g.bucket_off(h.buckets[0]), BUCKET_BYTES as usize),
            mem.read(base + g.bucket_off(h.buckets[1]), BUCKET_BYTES as usize)
        );
        let buckets = [Bucket::decode(&a?), Bucket::decode(&b?)];
        let fresh = buckets
            .iter()
            .all(|b| b.header.is_some_and(|x| h.belongs(x.depth, x.suffix)));
        if !fresh {
            // The cached directory named a subtable that no longer holds this key.
            self.dir = None;
            return Ok(None);
        }
        Ok(Some(View {
            st,
            meta,
            base,
            buckets,
        }))
    }

    /// The post-check: the subtable's TXObj words are still those read before.
    async fn unchanged<M: Mem>(&mut self, mem: &M, v: &View) -> Result<bool, RaceError> {
        let same = mem.read(v.st, 16).await? == v.meta;
        if !same {
            self.stats.redos += 1;
        }
        Ok(same)
    }

    /// The post-check of an insert into an empty slot (bucket `i` of the key's two, slot
    /// `j`): the TXObj READ with the two buckets in the same round. `None`: another copy
    /// of the key was found and this one removed (re-run as an update).
    async fn unchanged_insert<M: Mem>(
        &mut self,
        mem: &M,
        v: &View,
        h: &KeyHash,
        key: u64,
        (i, j, word): (usize, usize, u64),
    ) -> Result<Option<bool>, RaceError> {
        let g = self.geo;
        let (meta, a, b) = futures::join!(
            mem.read(v.st, 16),
            mem.read(v.base + g.bucket_off(h.buckets[0]), BUCKET_BYTES as usize),
            mem.read(v.base + g.bucket_off(h.buckets[1]), BUCKET_BYTES as usize)
        );
        let buckets = [Bucket::decode(&a?), Bucket::decode(&b?)];
        if another_copy(mem, &buckets, h, key, i, j).await? {
            self.stats.duplicates += 1;
            mem.cas(v.base + g.slot_off(h.buckets[i], j), word, 0)
                .await?;
            return Ok(None);
        }
        let same = meta? == v.meta;
        if !same {
            self.stats.redos += 1;
        }
        Ok(Some(same))
    }

    async fn run<C: Clock, M: Mem>(
        &mut self,
        c: &mut Client<C>,
        mem: &M,
        key: u64,
        op: Op,
    ) -> Result<Option<u64>, RaceError> {
        let h = KeyHash::new(key, self.geo.buckets);
        // The value the first landed CAS replaced (returned even if it must be re-run).
        let mut first: Option<Option<u64>> = None;
        // This attempt's record; reset after its CAS landed and the operation runs
        // again, so one held here was never named by a slot.
        let mut rec: Option<u64> = None;
        for _ in 0..self.max_attempts {
            let t0 = Instant::now();
            let Some(v) = self.view(c, mem, &h).await? else {
                continue;
            };
            let found = find(mem, &v.buckets, &h, key).await?;
            if t0.elapsed() >= STALE_READ {
                self.stats.stale_reads += 1;
                continue;
            }
            let (i, at, old, new, prev) = match (op, found) {
                (Op::Get, f) | (Op::Update(_) | Op::Delete, f @ None) => {
                    if self.unchanged(mem, &v).await? {
                        self.stats.ops += 1;
                        // Written, never named by a slot: no reader can have seen it.
                        rec.inspect(|&r| self.objs.give_back(r));
                        return Ok(first.unwrap_or(f.map(|f| f.3)));
                    }
                    continue;
                }
                (Op::Delete, Some((i, j, w, val))) => {
                    ((i, j), self.geo.slot_off(h.buckets[i], j), w, 0, Some(val))
                }
                (Op::Insert(val) | Op::Update(val), f) => {
                    let r = match rec {
                        Some(r) => r,
                        None => *rec.insert(self.objs.put(mem, &self.layout, key, val).await?),
                    };
                    match f {
                        Some((i, j, w, old)) => (
                            (i, j),
                            self.geo.slot_off(h.buckets[i], j),
                            w,
                            h.slot(r),
                            Some(old),
                        ),
                        None => match pick_free(&v.buckets) {
                            Some((i, j)) => (
                                (i, j),
                                self.geo.slot_off(h.buckets[i], j),
                                0,
                                h.slot(r),
                                None,
                            ),
                            None => {
                                self.split_subtable(c, mem, v.st).await?;
                                continue;
                            }
                        },
                    }
                }
            };
            if mem.cas(v.base + at, old, new).await? != old {
                self.stats.cas_failures += 1;
                continue;
            }
            let ok = if old == 0 {
                let t1 = Instant::now();
                match self
                    .unchanged_insert(mem, &v, &h, key, (i.0, i.1, new))
                    .await?
                {
                    // A stale duplicate check is run again, as a redo.
                    Some(ok) if t1.elapsed() < STALE_READ => ok,
                    Some(_) => {
                        self.stats.stale_reads += 1;
                        false
                    }
                    None => {
                        rec = None;
                        continue;
                    }
                }
            } else {
                self.unchanged(mem, &v).await?
            };
            let prev = *first.get_or_insert(prev);
            if ok {
                // This CAS replaced `old` in the live table: its record is free to reuse
                // once no reader can still be on it.
                self.objs.retire(old);
                self.stats.ops += 1;
                return Ok(prev);
            }
            // Run again with a new record: the landed word may since have been replaced
            // by another client, which then retired this record and may reuse it.
            rec = None;
        }
        Err(RaceError::Retries(self.max_attempts))
    }

    /// The value of `key`. Costs with the directory cached: READ TXObj, 2 bucket READs,
    /// a record READ per slot whose fingerprint matches, READ TXObj. Errors:
    /// [`RaceError::Retries`] (a subtable stays locked), [`RaceError::Rtx`] from a repair,
    /// [`RaceError::Mem`].
    pub async fn get<C: Clock, M: Mem>(
        &mut self,
        c: &mut Client<C>,
        mem: &M,
        key: u64,
    ) -> Result<Option<u64>, RaceError> {
        self.run(c, mem, key, Op::Get).await
    }

    /// Insert `key` or update its value (upsert): a 16-B record WRITE and one slot CAS,
    /// between the READs of [`Race::get`] (a fresh key's closing round READs the two
    /// buckets again with the TXObj, to find a concurrent insert of the same key into
    /// another slot, and removes its own copy if so); when both of the key's buckets are full, the
    /// subtable is split by a rehash rTX first. Returns the previous value. Errors: as
    /// [`Race::get`], [`RaceError::TableFull`], [`RaceError::OutOfObjects`].
    pub async fn insert<C: Clock, M: Mem>(
        &mut self,
        c: &mut Client<C>,
        mem: &M,
        key: u64,
        val: u64,
    ) -> Result<Option<u64>, RaceError> {
        self.run(c, mem, key, Op::Insert(val)).await
    }

    /// Set the value of `key` if present (nothing is written otherwise). Returns the
    /// previous value, `None` if absent. Errors: as [`Race::insert`].
    pub async fn update<C: Clock, M: Mem>(
        &mut self,
        c: &mut Client<C>,
        mem: &M,
        key: u64,
        val: u64,
    ) -> Result<Option<u64>, RaceError> {
        self.run(c, mem, key, Op::Update(val)).await
    }

    /// Remove `key` (one slot CAS to empty; the record is reclaimed, [`records`]).
    /// Returns the removed value. Errors: as [`Race::get`].
    pub async fn delete<C: Clock, M: Mem>(
        &mut self,
        c: &mut Client<C>,
        mem: &M,
        key: u64,
    ) -> Result<Option<u64>, RaceError> {
        self.run(c, mem, key, Op::Delete).await
    }

    /// Split the subtable that holds `key` now (one rehash rTX, retried on abort), whether
    /// or not it is full. Errors: [`RaceError::TableFull`] at the largest depth,
    /// [`RaceError::OutOfObjects`], [`RaceError::Retries`], [`RaceError::Rtx`],
    /// [`RaceError::Mem`].
    pub async fn split<C: Clock, M: Mem>(
        &mut self,
        c: &mut Client<C>,
        mem: &M,
        key: u64,
    ) -> Result<(), RaceError> {
        let h = KeyHash::new(key, self.geo.buckets);
        for _ in 0..self.max_attempts {
            self.dir = None;
            let d = self.directory(mem).await?;
            let st = d.entries[h.dir_index(d.depth)];
            if self.rehash_once(c, mem, st).await? {
                return Ok(());
            }
        }
        Err(RaceError::Retries(self.max_attempts))
    }

    /// An insert found its subtable full: split it (an abort only makes the insert retry).
    async fn split_subtable<C: Clock, M: Mem>(
        &mut self,
        c: &mut Client<C>,
        mem: &M,
        st: u64,
    ) -> Result<(), RaceError> {
        match self.rehash_once(c, mem, st).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_abort() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// A free object for the new subtable, read in the rTX (a concurrent use aborts it).
    async fn take_obj<C: Clock, M: Mem>(
        &self,
        tx: &mut Tx<'_, C>,
        mem: &M,
        cursor: &mut u64,
    ) -> Result<u64, RaceError> {
        while *cursor < self.objs.end {
            let m = self.layout.obj_addr(*cursor);
            *cursor += 1;
            let b = tx.read(mem, m).await?;
            if b[..8] == [0u8; 8] {
                return Ok(m);
            }
        }
        Err(RaceError::OutOfObjects)
    }

    /// One rehash rTX of the subtable `st`: `Ok(true)` committed, `Ok(false)` the
    /// directory no longer names `st` for its suffix (stale: retry with a fresh one),
    /// `Err` with an abort to retry, or a failure.
    async fn rehash_once<C: Clock, M: Mem>(
        &mut self,
        c: &mut Client<C>,
        mem: &M,
        st: u64,
    ) -> Result<bool, RaceError> {
        let bb = self.layout.block_bytes as usize;
        let dir_m = self.layout.obj_addr(DIR_OBJ);
        #[cfg(test)]
        let clear = !self.planted_keep_moved;
        #[cfg(not(test))]
        let clear = true;
        let mut tx = c.begin();
        let r = async {
            // Opt2: lock first, then READ the block (see the module doc).
            let blk = tx.pre_lock(mem, st).await?;
            let Some(h) = Bucket::decode(&blk[..BUCKET_BYTES as usize]).header else {
                return Ok(None);
            };
            let Some(dir) = Directory::decode(&tx.read(mem, dir_m).await?) else {
                return Err(RaceError::Format("directory unreadable".into()));
            };
            if h.depth > dir.depth || dir.entries.get(h.suffix as usize) != Some(&st) {
                return Ok(None);
            }
            if h.depth >= self.geo.max_depth {
                return Err(RaceError::TableFull { depth: h.depth });
            }
            let mut cursor = self.objs.next;
            let nm = self.take_obj(&mut tx, mem, &mut cursor).await?;
            let (old, new, _) = split_block(&self.geo, &blk, h, clear);
            let nd = dir.split(h, nm);
            tx.write(mem, st, old).await?;
            tx.write(mem, nm, new).await?;
            tx.write(mem, dir_m, nd.encode(bb)).await?;
            Ok(Some((cursor, nd)))
        }
        .await;
        match r {
            Ok(Some((cursor, nd))) => {
                tx.commit(mem).await?;
                self.objs.next = self.objs.next.max(cursor);
                self.dir = Some(nd);
                self.stats.rehashes += 1;
                Ok(true)
            }
            Ok(None) => {
                tx.abort(mem).await?;
                self.dir = None;
                Ok(false)
            }
            Err(e) => {
                if e.is_abort() {
                    self.stats.rehash_aborts += 1;
                }
                if !matches!(e, RaceError::Rtx(_) | RaceError::Mem(_)) || e.is_abort() {
                    tx.abort(mem).await?;
                }
                Err(e)
            }
        }
    }
}

/// READ the directory outside any rTX (its dptr, then its block). Errors:
/// [`RaceError::Format`] when object [`DIR_OBJ`] holds no directory, [`RaceError::Mem`].
pub async fn read_directory<M: Mem>(mem: &M, layout: &Layout) -> Result<Directory, RaceError> {
    let Some(base) = block_addr_of(mem, layout, layout.obj_addr(DIR_OBJ)).await? else {
        return Err(RaceError::Format("directory object has no block".into()));
    };
    let b = mem.read(base, layout.block_bytes as usize).await?;
    Directory::decode(&b).ok_or_else(|| RaceError::Format("no directory in object 0".into()))
}
