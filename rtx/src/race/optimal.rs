//! The "Optimal" baseline for the hash table (Transactional Indexes on Disaggregated
//! Memory with Repairable Transaction, 6: the original, non-transactional RaceHashing):
//! the same table, region and layout as [`super::Race`], with RACE's own rehash under
//! spinlocks and no logs, no leases and no copy-on-write.
//!
//! A lock is the first word of a TXObj (0 free, [`LOCK_HELD`] | id held, taken by CAS),
//! the value stays in place in the block its dptr names. Operations READ the subtable's
//! lock word with the two buckets in one round (one READ more than RACE's two, no extra
//! round trip), wait while it is held, CAS the slot, then READ the bucket header back
//! (a fresh insert READs both buckets, to find a concurrent insert of the same key, as
//! [`super::Race`] does): if a rehash changed the header meanwhile the slot may have been stranded in the old subtable, so
//! the operation waits for the rehash, runs again on the right subtable, and clears its
//! stranded slot.
//!
//! Rehash: lock the full subtable, lock the directory, lock and write the new subtable
//! (a free object of the handle's range), rewrite the old subtable's bucket headers (one
//! WRITE each) and write the directory's entries then its header (one ordered list of
//! WRITEs), unlock the directory, and
//! then move every slot whose next hash bit is set with 2 CASes (copy to the same
//! position in the new subtable, clear the old), rescanning until a pass moves nothing;
//! finally unlock both subtables. Its cost grows with the keys moved (2 CASes each),
//! where the rTX rehash is a fixed number of operations on whole blocks (6, Fig. 15: 1.3 s
//! against 200 ms). A client that dies mid-rehash leaves both subtables locked: every
//! other client's operation on them waits forever (here: until
//! [`Optimal::max_attempts`], then [`RaceError::Retries`]).

use std::collections::HashMap;
use std::ops::Range;
use std::time::Instant;

use crate::layout::Layout;
use crate::mem::{Mem, MemError};

use super::records::{block_addr_of, Objects, STALE_READ};
use super::table::{Bucket, Directory, Geometry, Header, KeyHash, Slot, BUCKET_BYTES, SLOTS};
use super::{
    another_copy, find, pick_free, read_directory, Op, RaceError, RaceStats, DIR_OBJ, MAX_ATTEMPTS,
};

/// Bit set in a held lock word (the low 16 bits name the holder): the LLLock's locked
/// bit, so [`super::check::check_quiescent`] reports a lock left held.
pub const LOCK_HELD: u64 = crate::lllock::LOCKED_BIT;

/// One client's handle on the Optimal table: lock id, directory and block-address caches,
/// and the object range it takes new subtables and record pages from (disjoint between
/// handles).
#[derive(Debug)]
pub struct Optimal {
    layout: Layout,
    geo: Geometry,
    id: u16,
    dir: Option<Directory>,
    bases: HashMap<u64, u64>,
    objs: Objects,
    stats: RaceStats,
    /// Attempts of one operation (and spins on the directory lock) before
    /// [`RaceError::Retries`] (default [`MAX_ATTEMPTS`]).
    pub max_attempts: u32,
    /// Test-only crash injection: die after this many key moves of a rehash.
    #[cfg(test)]
    pub(crate) crash_after_moves: Option<usize>,
    /// [`Optimal::arm_crash`]'s hook, called when a rehash holds both subtables' locks.
    #[cfg(feature = "fault-injection")]
    crash_hook: Option<crate::fault::CrashHook>,
}

impl Optimal {
    /// A handle for lock id `id` on the table [`super::format_table`] laid out, taking
    /// new objects from indices `objs` (disjoint between handles). Errors: as
    /// [`super::Race::new`].
    pub fn new(layout: Layout, id: u16, objs: Range<u64>) -> Result<Self, RaceError> {
        let geo = Geometry::new(layout.block_bytes)?;
        super::check_region(&layout)?;
        if objs.start == 0 || objs.end > layout.objects || objs.start > objs.end {
            return Err(RaceError::Format(format!(
                "object range {objs:?} outside 1..{}",
                layout.objects
            )));
        }
        Ok(Self {
            layout,
            geo,
            id,
            dir: None,
            bases: HashMap::new(),
            objs: Objects::new(objs.start, objs.end),
            stats: RaceStats::default(),
            max_attempts: MAX_ATTEMPTS,
            #[cfg(test)]
            crash_after_moves: None,
            #[cfg(feature = "fault-injection")]
            crash_hook: None,
        })
    }

    /// Call `hook` with [`crate::fault::CrashPoint::Locked`] and this handle's lock id
    /// each time a rehash of this handle holds the spinlocks of the old and the new
    /// subtable, with the directory published and no key moved yet: the point where a
    /// process-level test kills the RACE original's rehash (the rTX paper's point of
    /// comparison for a killed rehash, 6: its spinlocks stay held for good). It is this
    /// rehash's only crash point: it writes no log. A hook that returns `false` fails the
    /// rehash with [`MemError::Crashed`], the locks still held.
    ///
    /// Errors: [`crate::fault::NotEnabled`] without the `fault-injection` feature.
    pub fn arm_crash_locked(
        &mut self,
        hook: crate::fault::CrashHook,
    ) -> Result<(), crate::fault::NotEnabled> {
        #[cfg(feature = "fault-injection")]
        {
            self.crash_hook = Some(hook);
            Ok(())
        }
        #[cfg(not(feature = "fault-injection"))]
        {
            let _ = hook;
            Err(crate::fault::NotEnabled)
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> RaceStats {
        self.objs.counted(self.stats)
    }

    /// As [`super::Race::set_record_reuse_ms`].
    #[cfg(test)]
    pub(crate) fn set_record_reuse_ms(&mut self, ms: u64) {
        self.objs.min_reuse_ms = ms;
    }

    fn held(&self) -> u64 {
        LOCK_HELD | self.id as u64
    }

    /// The block of object `m` (it never moves here), READ once and cached.
    async fn base<M: Mem>(&mut self, mem: &M, m: u64) -> Result<u64, RaceError> {
        if let Some(&b) = self.bases.get(&m) {
            return Ok(b);
        }
        let b = block_addr_of(mem, &self.layout, m)
            .await?
            .ok_or_else(|| RaceError::Format(format!("object {m} has no block")))?;
        self.bases.insert(m, b);
        Ok(b)
    }

    async fn directory<M: Mem>(&mut self, mem: &M) -> Result<Directory, RaceError> {
        if self.dir.is_none() {
            self.dir = Some(read_directory(mem, &self.layout).await?);
            self.stats.dir_reloads += 1;
        }
        Ok(self.dir.clone().expect("loaded"))
    }

    async fn run<M: Mem>(&mut self, mem: &M, key: u64, op: Op) -> Result<Option<u64>, RaceError> {
        let g = self.geo;
        let h = KeyHash::new(key, g.buckets);
        let mut first: Option<Option<u64>> = None;
        // This attempt's record; reset after its CAS landed and the operation runs
        // again, so one held here was never named by a slot.
        let mut rec: Option<u64> = None;
        // A slot this operation CASed into a subtable a rehash was splitting: (address,
        // word, bucket header address).
        let mut stranded: Option<(u64, u64, u64)> = None;
        for _ in 0..self.max_attempts {
            let t0 = Instant::now();
            let d = self.directory(mem).await?;
            let st = d.entries[h.dir_index(d.depth)];
            if st < self.layout.meta_base() {
                // Read while a rehash doubled the directory in place: read it again.
                self.dir = None;
                continue;
            }
            let base = self.base(mem, st).await?;
            let (l, a, b) = futures::join!(
                mem.read_u64(st),
                mem.read(base + g.bucket_off(h.buckets[0]), BUCKET_BYTES as usize),
                mem.read(base + g.bucket_off(h.buckets[1]), BUCKET_BYTES as usize)
            );
            if l? & LOCK_HELD != 0 {
                self.stats.waits += 1;
                continue;
            }
            let buckets = [Bucket::decode(&a?), Bucket::decode(&b?)];
            let seen = buckets[0].header;
            if !buckets
                .iter()
                .all(|b| b.header.is_some_and(|x| h.belongs(x.depth, x.suffix)))
            {
                self.dir = None;
                continue;
            }
            let found = find(mem, &buckets, &h, key).await?;
            if t0.elapsed() >= STALE_READ {
                self.stats.stale_reads += 1;
                continue;
            }
            let ((i, j), at, old, new, prev) = match (op, found) {
                (Op::Get, f) | (Op::Update(_) | Op::Delete, f @ None) => {
                    self.clear_stranded(mem, &h, stranded).await?;
                    self.stats.ops += 1;
                    // Written, never named by a slot: no reader can have seen it.
                    rec.inspect(|&r| self.objs.give_back(r));
                    return Ok(first.unwrap_or(f.map(|f| f.3)));
                }
                (Op::Delete, Some((i, j, w, v))) => {
                    ((i, j), g.slot_off(h.buckets[i], j), w, 0, Some(v))
                }
                (Op::Insert(val) | Op::Update(val), f) => {
                    let r = match rec {
                        Some(r) => r,
                        None => *rec.insert(self.objs.put(mem, &self.layout, key, val).await?),
                    };
                    match f {
                        Some((i, j, w, v)) => {
                            ((i, j), g.slot_off(h.buckets[i], j), w, h.slot(r), Some(v))
                        }
                        None => match pick_free(&buckets) {
                            Some((i, j)) => {
                                ((i, j), g.slot_off(h.buckets[i], j), 0, h.slot(r), None)
                            }
                            None => {
                                // Spinning out on the directory lock only retries.
                                match self.rehash(mem, st).await {
                                    Ok(_) | Err(RaceError::Retries(_)) => {}
                                    Err(e) => return Err(e),
                                }
                                continue;
                            }
                        },
                    }
                }
            };
            if mem.cas(base + at, old, new).await? != old {
                self.stats.cas_failures += 1;
                continue;
            }
            let hdr_at = base + g.bucket_off(h.buckets[i]);
            let now = if old == 0 {
                // A fresh insert re-reads both buckets (RACE's duplicate check).
                let t1 = Instant::now();
                let (a, b) = futures::join!(
                    mem.read(base + g.bucket_off(h.buckets[0]), BUCKET_BYTES as usize),
                    mem.read(base + g.bucket_off(h.buckets[1]), BUCKET_BYTES as usize)
                );
                let bk = [Bucket::decode(&a?), Bucket::decode(&b?)];
                if another_copy(mem, &bk, &h, key, i, j).await? {
                    self.stats.duplicates += 1;
                    mem.cas(base + at, new, 0).await?;
                    rec = None;
                    continue;
                }
                if t1.elapsed() >= STALE_READ {
                    // A stale duplicate check: run again (the re-run finds this slot).
                    self.stats.stale_reads += 1;
                    rec = None;
                    continue;
                }
                bk[i].header
            } else {
                Header::decode(mem.read_u64(hdr_at).await?)
            };
            let prev = *first.get_or_insert(prev);
            if now == seen {
                // The header unchanged since the READs: no rehash moved a slot yet (it
                // rewrites the headers first), so this CAS replaced `old` in its one
                // live place, and its record is free to reuse once no reader can still
                // be on it.
                self.objs.retire(old);
                self.clear_stranded(mem, &h, stranded).await?;
                self.stats.ops += 1;
                return Ok(prev);
            }
            // A rehash began after this operation's READs: run it again once the rehash
            // is over, then clear the slot if it was left in the wrong subtable.
            self.stats.redos += 1;
            self.dir = None;
            if new != 0 {
                stranded = Some((base + at, new, hdr_at));
            }
            // As in [`super::Race`]: a landed record is never CASed in again.
            rec = None;
        }
        Err(RaceError::Retries(self.max_attempts))
    }

    async fn clear_stranded<M: Mem>(
        &mut self,
        mem: &M,
        h: &KeyHash,
        stranded: Option<(u64, u64, u64)>,
    ) -> Result<(), MemError> {
        if let Some((at, w, hdr)) = stranded {
            let x = Header::decode(mem.read_u64(hdr).await?);
            if x.is_none_or(|x| !h.belongs(x.depth, x.suffix)) {
                mem.cas(at, w, 0).await?;
            }
        }
        Ok(())
    }

    /// The value of `key`: one round (lock word and 2 buckets), then a record READ per
    /// matching fingerprint. Errors: [`RaceError::Retries`] while a lock stays held,
    /// [`RaceError::Mem`].
    pub async fn get<M: Mem>(&mut self, mem: &M, key: u64) -> Result<Option<u64>, RaceError> {
        self.run(mem, key, Op::Get).await
    }

    /// Insert `key` or update its value (upsert); a full subtable is rehashed first.
    /// Returns the previous value. Errors: as [`Optimal::get`], [`RaceError::TableFull`],
    /// [`RaceError::OutOfObjects`].
    pub async fn insert<M: Mem>(
        &mut self,
        mem: &M,
        key: u64,
        val: u64,
    ) -> Result<Option<u64>, RaceError> {
        self.run(mem, key, Op::Insert(val)).await
    }

    /// Set the value of `key` if present. Returns the previous value. Errors: as
    /// [`Optimal::insert`].
    pub async fn update<M: Mem>(
        &mut self,
        mem: &M,
        key: u64,
        val: u64,
    ) -> Result<Option<u64>, RaceError> {
        self.run(mem, key, Op::Update(val)).await
    }

    /// Remove `key`. Returns the removed value. Errors: as [`Optimal::get`].
    pub async fn delete<M: Mem>(&mut self, mem: &M, key: u64) -> Result<Option<u64>, RaceError> {
        self.run(mem, key, Op::Delete).await
    }

    /// Split the subtable holding `key` now (retrying while another client holds its
    /// lock). Errors: [`RaceError::TableFull`], [`RaceError::OutOfObjects`],
    /// [`RaceError::Retries`], [`RaceError::Mem`].
    pub async fn split<M: Mem>(&mut self, mem: &M, key: u64) -> Result<(), RaceError> {
        let h = KeyHash::new(key, self.geo.buckets);
        for _ in 0..self.max_attempts {
            self.dir = None;
            let d = self.directory(mem).await?;
            let st = d.entries[h.dir_index(d.depth)];
            if self.rehash(mem, st).await? {
                return Ok(());
            }
        }
        Err(RaceError::Retries(self.max_attempts))
    }

    async fn unlock<M: Mem>(&self, mem: &M, m: u64) -> Result<(), MemError> {
        mem.cas(m, self.held(), 0).await.map(drop)
    }

    /// A free object of the range (its block's word 0 is zero).
    async fn take_obj<M: Mem>(&mut self, mem: &M) -> Result<u64, RaceError> {
        while self.objs.next < self.objs.end {
            let m = self.layout.obj_addr(self.objs.next);
            self.objs.next += 1;
            let b = self.base(mem, m).await?;
            if mem.read_u64(b).await? == 0 {
                return Ok(m);
            }
        }
        Err(RaceError::OutOfObjects)
    }

    /// Rehash subtable `st` under its spinlock. `Ok(false)`: someone else holds it or the
    /// directory no longer names it (retry).
    async fn rehash<M: Mem>(&mut self, mem: &M, st: u64) -> Result<bool, RaceError> {
        let g = self.geo;
        if mem.cas(st, 0, self.held()).await? != 0 {
            self.stats.waits += 1;
            return Ok(false);
        }
        let base = self.base(mem, st).await?;
        let blk = mem.read(base, g.block_bytes as usize).await?;
        let Some(h) = Bucket::decode(&blk[..BUCKET_BYTES as usize]).header else {
            self.unlock(mem, st).await?;
            return Ok(false);
        };
        if h.depth >= g.max_depth {
            self.unlock(mem, st).await?;
            return Err(RaceError::TableFull { depth: h.depth });
        }
        let dir_m = self.layout.obj_addr(DIR_OBJ);
        let mut got = false;
        for _ in 0..self.max_attempts {
            if mem.cas(dir_m, 0, self.held()).await? == 0 {
                got = true;
                break;
            }
        }
        if !got {
            self.unlock(mem, st).await?;
            return Err(RaceError::Retries(self.max_attempts));
        }
        self.dir = None;
        let dir = self.directory(mem).await?;
        if h.depth > dir.depth || dir.entries.get(h.suffix as usize) != Some(&st) {
            self.unlock(mem, dir_m).await?;
            self.unlock(mem, st).await?;
            return Ok(false);
        }
        let nm = match self.take_obj(mem).await {
            Ok(m) => m,
            Err(e) => {
                self.unlock(mem, dir_m).await?;
                self.unlock(mem, st).await?;
                return Err(e);
            }
        };
        mem.cas(nm, 0, self.held()).await?;
        let nbase = self.base(mem, nm).await?;
        let lo = Header {
            depth: h.depth + 1,
            suffix: h.suffix,
        };
        let hi = Header {
            depth: h.depth + 1,
            suffix: h.suffix | 1 << h.depth,
        };
        let nd = dir.split(h, nm);
        let dbase = self.base(mem, dir_m).await?;
        let enc = nd.encode(g.block_bytes as usize);
        // One ordered list: the new subtable, the old one's bucket headers, then the
        // directory's entries and last its header.
        let new_st = g.empty_subtable(hi);
        let lo_word = lo.word().to_le_bytes();
        let mut list: Vec<(u64, &[u8])> = vec![(nbase, &new_st)];
        list.extend((0..g.buckets).map(|b| (base + g.bucket_off(b), &lo_word[..])));
        list.push((dbase + 8, &enc[8..8 + 8 * nd.entries.len()]));
        list.push((dbase, &enc[..8]));
        mem.write_ordered(&list).await?;
        self.unlock(mem, dir_m).await?;
        self.dir = Some(nd);
        #[cfg(feature = "fault-injection")]
        if let Some(hook) = self.crash_hook {
            if !hook(crate::fault::CrashPoint::Locked, self.id) {
                return Err(RaceError::Mem(MemError::Crashed));
            }
        }
        let mut moves = 0usize;
        loop {
            let blk = mem.read(base, g.block_bytes as usize).await?;
            let mut moved = 0;
            for b in 0..g.buckets {
                let bk = Bucket::decode(&blk[g.bucket_off(b) as usize..][..BUCKET_BYTES as usize]);
                for j in 0..SLOTS {
                    let Some(s) = Slot::decode(bk.slots[j]) else {
                        continue;
                    };
                    if (s.dir >> h.depth) & 1 == 0 {
                        continue;
                    }
                    #[cfg(test)]
                    if self.crash_after_moves == Some(moves) {
                        return Err(RaceError::Mem(MemError::Crashed));
                    }
                    let off = g.slot_off(b, j);
                    self.move_slot(mem, base + off, nbase + off, bk.slots[j])
                        .await?;
                    moved += 1;
                    moves += 1;
                }
            }
            if moved == 0 {
                break;
            }
        }
        self.unlock(mem, nm).await?;
        self.unlock(mem, st).await?;
        self.stats.rehashes += 1;
        self.stats.moves += moves as u64;
        Ok(true)
    }

    /// Move the slot word `w` from `from` to `to` with 2 CASes, following concurrent
    /// updates (re-copy) and deletes (undo the copy) of the old slot.
    async fn move_slot<M: Mem>(
        &self,
        mem: &M,
        from: u64,
        to: u64,
        mut w: u64,
    ) -> Result<(), MemError> {
        let mut there = 0u64;
        loop {
            let got = mem.cas(to, there, w).await?;
            if got != there && got != w {
                there = got;
                continue;
            }
            let old = mem.cas(from, w, 0).await?;
            if old == w {
                return Ok(());
            }
            if old == 0 {
                mem.cas(to, w, 0).await?;
                return Ok(());
            }
            (there, w) = (w, old);
        }
    }
}
