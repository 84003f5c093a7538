//! The version table cache (VTC) of a compute node (Lotus, 4.4; the spec's A.4 with its
//! errata item 2).
//!
//! A compute node keeps copies of the CVTs of data its own coordinators lock, so that a
//! transaction holding a lock on a key of this node's shards skips the CVT READ (one
//! memory-node round trip of E2). The record itself is still READ and checked against
//! the cached cell (A.4 rule 5: GC reuses record buffers).
//!
//! **Why an entry is never stale when it is used** (errata 2's "simplest correct rule",
//! without generations):
//!
//! 1. Only a coordinator that *holds* a lock (read or write) on the key, granted by this
//!    node's own lock table, reads or fills the cache ([`crate::lotus`]). Read-only
//!    transactions, snapshot reads (SI's read-only data) and keys whose shard another
//!    node serves never touch it.
//! 2. A fill happens right after the CVT READ, synchronously (no `await` between the
//!    READ's completion and the insert), while the filler still holds its lock: no
//!    writer can hold the key's write lock then, so the copy is current.
//! 3. A local writer, after its write-visible step (C3) and before it unlocks, replaces
//!    the entry with its updated CVT ([`VtCache::update`]); a writer that failed after
//!    C1 (some of its WRITEs may have landed) removes its keys' entries before it
//!    unlocks ([`VtCache::remove`]). A writer that wrote nothing leaves them alone.
//! 4. A write lock granted by this node's lock table to **another** node removes the
//!    entry before the grant is returned ([`VtCache::grant_hook`], installed with
//!    [`lockd::table_service::TableService::with_grant_hook`]; Lotus, Algorithm 1,
//!    line 15). From then until that writer unlocks, no local coordinator can hold the
//!    key's lock, so none can fill it; after it unlocks, the next local holder misses
//!    and READs the writer's CVT.
//!
//! So every change to a key's CVT in the memory pool happens under a write lock whose
//! holder either updates the entry (local) or had it removed (remote), and every fill
//! happens under a lock that excludes writers.
//!
//! **Keys.** Entries are keyed by the record's [`LockKey`] (what the grant hook knows)
//! and carry the record's `(table, key)`: a lookup whose entry belongs to another record
//! (two keys that share a lock key through the hashed `rest` field,
//! [`crate::lotus_site::rest_of`]) is a miss, and the fill replaces it. Invalidating by lock
//! key then removes whichever of the two is cached: safe.
//!
//! **Layout.** [`SUB_CACHES`] sub-caches, each behind its own `Mutex` and chosen by a hash
//! of the lock key, share the capacity (default [`DEFAULT_ENTRIES`], Lotus 8.1's 64 K
//! version tables). Eviction is **CLOCK** (second chance), an approximation of LRU: a
//! lookup sets an entry's reference bit; an insert into a full sub-cache sweeps the
//! hand, clearing set bits, and evicts the first entry whose bit is clear.
//!
//! The cache is volatile: losing it (a crash, [`VtCache::clear`]) is always safe (Lotus
//! 6). On resharding, the sender clears the moved range ([`VtCache::clear_range`], the
//! spec's A.3 item 6) when the move reaches `Transferring`.
//!
//! Deviation noted by errata 2: Lotus 8.2 also serves read-only transactions' reads from
//! the cache; here they never use it (they take no lock, so nothing would keep their
//! copy current), which makes the gain smaller on read-mostly workloads (TATP, KVS).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use lockd::shard::LockKey;
use lockd::table_service::GrantHook;

use crate::cvt::Cvt;
use crate::cvt_remote::CvtLoc;

/// Default capacity of a compute node's cache, entries (Lotus 8.1: 64 K version
/// tables).
pub const DEFAULT_ENTRIES: usize = 65_536;

/// Sub-caches per compute node, each behind its own mutex.
pub const SUB_CACHES: usize = 16;

/// One cached CVT.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cached {
    /// The record's table.
    pub table: u32,
    /// The record's key.
    pub key: u64,
    /// Where its CVT lives.
    pub loc: CvtLoc,
    /// The CVT as last read or written by a holder of its lock.
    pub cvt: Cvt,
}

/// A slot of a sub-cache's CLOCK ring.
struct Slot {
    lock_key: u64,
    entry: Cached,
    referenced: bool,
}

/// A hasher for lock keys that are already well mixed by [`sub_of`]'s multiply: one
/// multiply-xorshift of the 64-bit word.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, x: u64) {
        let h = (x ^ (x >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        self.0 = h ^ (h >> 32);
    }
}

/// One sub-cache: a CLOCK ring of at most `cap` slots and an index into it.
struct Sub {
    cap: usize,
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    index: HashMap<u64, usize, BuildHasherDefault<KeyHasher>>,
    hand: usize,
}

impl Sub {
    fn new(cap: usize) -> Self {
        Self {
            cap,
            slots: Vec::new(),
            free: Vec::new(),
            index: HashMap::default(),
            hand: 0,
        }
    }

    fn get(&mut self, lock_key: u64) -> Option<&Cached> {
        let &i = self.index.get(&lock_key)?;
        let s = self.slots[i].as_mut().expect("indexed slots are full");
        s.referenced = true;
        Some(&s.entry)
    }

    /// Insert or replace; returns whether an entry was evicted.
    fn put(&mut self, lock_key: u64, entry: Cached) -> bool {
        if self.cap == 0 {
            return false;
        }
        if let Some(&i) = self.index.get(&lock_key) {
            let s = self.slots[i].as_mut().expect("indexed slots are full");
            s.entry = entry;
            s.referenced = true;
            return false;
        }
        // A new entry starts unreferenced: one that is never looked up again is the
        // first the hand takes.
        let slot = Slot {
            lock_key,
            entry,
            referenced: false,
        };
        if let Some(i) = self.free.pop() {
            self.slots[i] = Some(slot);
            self.index.insert(lock_key, i);
            return false;
        }
        if self.slots.len() < self.cap {
            self.slots.push(Some(slot));
            self.index.insert(lock_key, self.slots.len() - 1);
            return false;
        }
        // Full (no free slot, every slot occupied): sweep. Terminates within two turns,
        // since the sweep clears every bit it passes.
        loop {
            let i = self.hand;
            self.hand = (self.hand + 1) % self.slots.len();
            let s = self.slots[i]
                .as_mut()
                .expect("a full ring has no empty slot");
            if s.referenced {
                s.referenced = false;
                continue;
            }
            self.index.remove(&s.lock_key);
            self.slots[i] = Some(slot);
            self.index.insert(lock_key, i);
            return true;
        }
    }

    fn remove(&mut self, lock_key: u64) -> bool {
        match self.index.remove(&lock_key) {
            Some(i) => {
                self.slots[i] = None;
                self.free.push(i);
                true
            }
            None => false,
        }
    }

    fn retain(&mut self, mut keep: impl FnMut(u64) -> bool) -> u64 {
        let mut removed = 0;
        for (i, s) in self.slots.iter_mut().enumerate() {
            if let Some(slot) = s {
                if !keep(slot.lock_key) {
                    self.index.remove(&slot.lock_key);
                    *s = None;
                    self.free.push(i);
                    removed += 1;
                }
            }
        }
        removed
    }
}

/// Counters of a [`VtCache`] since it was made (monotonic; every field a count of
/// events, `entries` the current size).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VtCacheStats {
    /// Lookups by lock holders that found the key's CVT (the CVT READ skipped).
    pub hits: u64,
    /// Lookups that found nothing (or another record's entry under the same lock key).
    pub misses: u64,
    /// Entries inserted after a miss ([`VtCache::fill`]).
    pub fills: u64,
    /// Entries replaced by local writers after their write-visible step
    /// ([`VtCache::update`]).
    pub updates: u64,
    /// Entries removed by remote write grants ([`VtCache::invalidate`], the grant hook).
    pub invalidations: u64,
    /// Entries removed otherwise: a writer that failed after C1, a cached cell whose
    /// record no longer matched, a clear.
    pub removals: u64,
    /// Entries evicted to make room.
    pub evictions: u64,
    /// Entries cached now.
    pub entries: u64,
}

impl VtCacheStats {
    /// The counters of two caches together (compute nodes of one run), entries
    /// included.
    pub fn add(&self, o: &Self) -> Self {
        Self {
            hits: self.hits + o.hits,
            misses: self.misses + o.misses,
            fills: self.fills + o.fills,
            updates: self.updates + o.updates,
            invalidations: self.invalidations + o.invalidations,
            removals: self.removals + o.removals,
            evictions: self.evictions + o.evictions,
            entries: self.entries + o.entries,
        }
    }

    /// Hits over lookups, 0 to 1 (0 without a lookup).
    pub fn hit_rate(&self) -> f64 {
        let n = self.hits + self.misses;
        if n == 0 {
            0.0
        } else {
            self.hits as f64 / n as f64
        }
    }

    /// The one-line summary txn-bench prints.
    pub fn line(&self) -> String {
        format!(
            "version table cache: {} hits, {} misses (hit rate {:.1}%), {} fills, {} updates, {} invalidations, {} evictions, {} entries",
            self.hits,
            self.misses,
            100.0 * self.hit_rate(),
            self.fills,
            self.updates,
            self.invalidations,
            self.evictions,
            self.entries
        )
    }
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    fills: AtomicU64,
    updates: AtomicU64,
    invalidations: AtomicU64,
    removals: AtomicU64,
    evictions: AtomicU64,
}

/// A compute node's version table cache (Lotus, 4.4): `LockKey -> (table, key, CvtLoc,
/// Cvt)` in [`SUB_CACHES`] mutex-guarded CLOCK sub-caches; shared by the node's threads
/// (`Arc`). The rules that keep it correct are the caller's and are listed in the module
/// docs.
pub struct VtCache {
    subs: Box<[Mutex<Sub>]>,
    capacity: usize,
    n: Counters,
    /// The replica-view epoch the entries' addresses belong to ([`Self::note_epoch`]).
    epoch: std::sync::atomic::AtomicU64,
    /// Taken by the one thread that clears for a new epoch.
    epoch_change: Mutex<()>,
}

impl std::fmt::Debug for VtCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VtCache")
            .field("capacity", &self.capacity)
            .field("stats", &self.stats())
            .finish()
    }
}

/// The sub-cache of a lock key (its low 12 bits are the shard: mix them all).
fn sub_of(lock_key: LockKey) -> usize {
    let h = lock_key.0.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (h >> 59) as usize % SUB_CACHES
}

impl VtCache {
    /// A cache of at most `entries` CVTs in all (each sub-cache holds
    /// `entries / SUB_CACHES`, rounded up). `entries == 0` makes a cache that holds
    /// nothing (txn-bench's `--vtc-entries 0` rather leaves the cache out).
    pub fn new(entries: usize) -> Self {
        let per = entries.div_ceil(SUB_CACHES);
        Self {
            subs: (0..SUB_CACHES).map(|_| Mutex::new(Sub::new(per))).collect(),
            capacity: per * SUB_CACHES,
            n: Counters::default(),
            epoch: Default::default(),
            epoch_change: Mutex::new(()),
        }
    }

    /// Note that the coordinators route by replica-view epoch `epoch` now: if it is
    /// newer than the one the entries were filled under, remove every entry (a cached
    /// [`CvtLoc`] is an address in the primary's image of its partition, and a failover
    /// moves the primary to another memory node whose image lies elsewhere). Call before
    /// each lookup with the epoch the caller's reads go by; returns whether it cleared.
    pub fn note_epoch(&self, epoch: u64) -> bool {
        if self.epoch.load(Ordering::Acquire) >= epoch {
            return false;
        }
        // The epoch is raised only after the clear, so that a thread that sees the new
        // epoch finds no entry of the old one.
        let _one = self.epoch_change.lock().unwrap_or_else(|e| e.into_inner());
        let was = self.epoch.load(Ordering::Acquire);
        if was >= epoch {
            return false;
        }
        if was != 0 {
            self.clear();
        }
        self.epoch.store(epoch, Ordering::Release);
        was != 0
    }

    /// Most entries the cache holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn sub(&self, lock_key: LockKey) -> MutexGuard<'_, Sub> {
        // A panic while holding a sub-cache cannot leave a wrong entry in place (every
        // operation replaces or removes whole entries): keep serving.
        self.subs[sub_of(lock_key)]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The cached CVT of `(table, key)`, whose lock key is `lock_key`, counting a hit or
    /// a miss. Only for a coordinator that holds `lock_key`'s lock on this node (rule 1).
    pub fn get(&self, lock_key: LockKey, table: u32, key: u64) -> Option<(CvtLoc, Cvt)> {
        let found = {
            let mut s = self.sub(lock_key);
            s.get(lock_key.0)
                .filter(|e| (e.table, e.key) == (table, key))
                .map(|e| (e.loc, e.cvt.clone()))
        };
        let c = if found.is_some() {
            &self.n.hits
        } else {
            &self.n.misses
        };
        c.fetch_add(1, Ordering::Relaxed);
        found
    }

    fn put(&self, lock_key: LockKey, entry: Cached, counter: &AtomicU64) {
        let evicted = self.sub(lock_key).put(lock_key.0, entry);
        counter.fetch_add(1, Ordering::Relaxed);
        if evicted {
            self.n.evictions.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Fill after a miss (rule 2): `cvt` at `loc` as READ from the memory node by a
    /// coordinator that holds `lock_key`'s lock and still holds it now (call it with no
    /// `await` since the READ completed).
    pub fn fill(&self, lock_key: LockKey, table: u32, key: u64, loc: CvtLoc, cvt: &Cvt) {
        let e = Cached {
            table,
            key,
            loc,
            cvt: cvt.clone(),
        };
        self.put(lock_key, e, &self.n.fills);
    }

    /// A local writer's update (rule 3): its CVT after the write-visible step (C3),
    /// before it unlocks.
    pub fn update(&self, lock_key: LockKey, table: u32, key: u64, loc: CvtLoc, cvt: &Cvt) {
        let e = Cached {
            table,
            key,
            loc,
            cvt: cvt.clone(),
        };
        self.put(lock_key, e, &self.n.updates);
    }

    /// A remote write grant on `lock_key` (rule 4, Lotus Algorithm 1, line 15): remove
    /// its entry. Returns whether there was one.
    pub fn invalidate(&self, lock_key: LockKey) -> bool {
        let removed = self.sub(lock_key).remove(lock_key.0);
        if removed {
            self.n.invalidations.fetch_add(1, Ordering::Relaxed);
        }
        removed
    }

    /// Remove `lock_key`'s entry for another reason than a remote grant (a writer that
    /// failed after C1; a cached cell whose record did not match). Returns whether there
    /// was one.
    pub fn remove(&self, lock_key: LockKey) -> bool {
        let removed = self.sub(lock_key).remove(lock_key.0);
        if removed {
            self.n.removals.fetch_add(1, Ordering::Relaxed);
        }
        removed
    }

    /// Remove the entries of keys in shards `shards` (resharding's sender, at
    /// `Transferring`: the spec's A.3 item 6, Lotus 4.3). Returns how many.
    pub fn clear_range(&self, shards: Range<u16>) -> u64 {
        let removed: u64 = self
            .subs
            .iter()
            .map(|s| {
                s.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .retain(|k| !shards.contains(&LockKey(k).shard()))
            })
            .sum();
        self.n.removals.fetch_add(removed, Ordering::Relaxed);
        removed
    }

    /// Remove every entry. Returns how many.
    pub fn clear(&self) -> u64 {
        self.clear_range(0..u16::MAX)
    }

    /// Entries cached now.
    pub fn len(&self) -> usize {
        self.subs
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).index.len())
            .sum()
    }

    /// Whether no entry is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The counters.
    pub fn stats(&self) -> VtCacheStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        VtCacheStats {
            hits: l(&self.n.hits),
            misses: l(&self.n.misses),
            fills: l(&self.n.fills),
            updates: l(&self.n.updates),
            invalidations: l(&self.n.invalidations),
            removals: l(&self.n.removals),
            evictions: l(&self.n.evictions),
            entries: self.len() as u64,
        }
    }

    /// The grant hook that invalidates this cache (rule 4): install it on this compute
    /// node's [`lockd::table_service::TableService`] with `with_grant_hook`; the service
    /// calls it for every write lock granted to another node, before the grant is
    /// returned.
    pub fn grant_hook(self: &Arc<Self>) -> GrantHook {
        let me = self.clone();
        Arc::new(move |key: LockKey, _node: u32| {
            me.invalidate(key);
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cvt::{Cell, Header};
    use lockd::lock_table::{LockMode, LockTable};
    use lockd::shard::{Ownership, ShardMap};
    use lockd::table_service::TableService;
    use lockd::table_wire::{OpKind, OpOutcome, TableOp};
    use tso::Timestamp;

    fn loc(addr: u64) -> CvtLoc {
        CvtLoc {
            part: 0,
            table: 1,
            addr,
        }
    }

    /// A CVT of `(1, key)` whose one valid cell holds `version`.
    fn cvt(key: u64, version: u64) -> Cvt {
        let mut c = Cvt {
            header: Header {
                table: 1,
                len: 8,
                key,
                lock: 0,
                state: crate::cvt::SLOT_IN_USE,
            },
            cells: vec![
                Cell {
                    cv: 1,
                    valid: false,
                    deleted: false,
                    version: Timestamp::ZERO,
                    addr: 0,
                };
                2
            ],
        };
        c.cells[0].valid = true;
        c.cells[0].version = Timestamp(version);
        c
    }

    fn lk(key: u64) -> LockKey {
        LockKey::compose(1, key, key).unwrap()
    }

    #[test]
    fn fill_then_lookup_hits_and_counts() {
        let c = VtCache::new(64);
        assert_eq!(c.get(lk(5), 1, 5), None);
        c.fill(lk(5), 1, 5, loc(100), &cvt(5, 7));
        assert_eq!(c.get(lk(5), 1, 5), Some((loc(100), cvt(5, 7))));
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.fills, s.entries), (1, 1, 1, 1));
        assert!((s.hit_rate() - 0.5).abs() < 1e-9);
        assert!(s.line().contains("hit rate 50.0%"), "{}", s.line());
    }

    #[test]
    fn a_new_replica_view_clears_every_address() {
        // After a failover the primary's image is on another memory node: entries
        // filled under the old view point into the dead node's address space.
        let c = VtCache::new(64);
        assert!(!c.note_epoch(1));
        c.fill(lk(5), 1, 5, loc(100), &cvt(5, 7));
        assert!(!c.note_epoch(1), "same view: kept");
        assert!(c.get(lk(5), 1, 5).is_some());
        assert!(c.note_epoch(2));
        assert_eq!(c.get(lk(5), 1, 5), None);
        c.fill(lk(5), 1, 5, loc(200), &cvt(5, 7));
        assert!(!c.note_epoch(1), "an older epoch seen late clears nothing");
        assert_eq!(c.get(lk(5), 1, 5), Some((loc(200), cvt(5, 7))));
    }

    #[test]
    fn another_record_under_the_same_lock_key_is_a_miss() {
        let c = VtCache::new(64);
        // Two keys whose hashed rest collided: one lock key.
        let shared = lk(9);
        c.fill(shared, 1, 1 << 50, loc(1), &cvt(1 << 50, 3));
        assert_eq!(c.get(shared, 1, (1 << 50) + 1), None);
        // The fill of the other replaces it; invalidating the lock key removes it.
        c.fill(shared, 1, (1 << 50) + 1, loc(2), &cvt((1 << 50) + 1, 4));
        assert_eq!(c.get(shared, 1, 1 << 50), None);
        assert!(c.get(shared, 1, (1 << 50) + 1).is_some());
        assert!(c.invalidate(shared));
        assert_eq!(c.get(shared, 1, (1 << 50) + 1), None);
    }

    #[test]
    fn a_full_sub_cache_evicts_unreferenced_entries_first() {
        let mut s = Sub::new(3);
        let e = |k: u64| Cached {
            table: 1,
            key: k,
            loc: loc(k),
            cvt: cvt(k, 1),
        };
        for k in 0..3 {
            assert!(!s.put(k, e(k)));
        }
        // 0 and 2 are used again; 1 is not: the hand passes 0, takes 1.
        assert!(s.get(0).is_some() && s.get(2).is_some());
        assert!(s.put(3, e(3)));
        assert!(s.get(1).is_none());
        assert!(s.get(0).is_some() && s.get(2).is_some() && s.get(3).is_some());
        // Everything referenced: one turn clears the bits, the next evicts.
        assert!(s.put(4, e(4)));
        assert_eq!(s.index.len(), 3);
        // A removed slot is reused before anything is evicted.
        assert!(s.remove(4));
        assert!(!s.put(5, e(5)));
        assert_eq!(s.index.len(), 3);
    }

    #[test]
    fn the_capacity_bounds_the_entries() {
        let c = VtCache::new(64);
        assert_eq!(c.capacity(), 64);
        for k in 0..10_000 {
            c.fill(lk(k), 1, k, loc(k), &cvt(k, 1));
        }
        let s = c.stats();
        assert!(s.entries <= 64, "{s:?}");
        assert_eq!(s.evictions, 10_000 - s.entries);
        // A zero-capacity cache holds nothing.
        let z = VtCache::new(0);
        z.fill(lk(1), 1, 1, loc(1), &cvt(1, 1));
        assert!(z.is_empty() && z.get(lk(1), 1, 1).is_none());
    }

    #[test]
    fn update_replaces_and_remove_and_invalidate_count_apart() {
        let c = VtCache::new(64);
        c.fill(lk(1), 1, 1, loc(1), &cvt(1, 1));
        c.update(lk(1), 1, 1, loc(1), &cvt(1, 2));
        assert_eq!(c.get(lk(1), 1, 1).unwrap().1, cvt(1, 2));
        assert!(c.remove(lk(1)));
        assert!(!c.remove(lk(1)) && !c.invalidate(lk(1)));
        c.fill(lk(1), 1, 1, loc(1), &cvt(1, 1));
        assert!(c.invalidate(lk(1)));
        let s = c.stats();
        assert_eq!((s.updates, s.removals, s.invalidations), (1, 1, 1));
    }

    #[test]
    fn clear_range_removes_only_the_moved_shards() {
        let c = VtCache::new(4096);
        for k in 0..200 {
            c.fill(lk(k), 1, k, loc(k), &cvt(k, 1));
        }
        // lk(k)'s shard is k's low 12 bits.
        assert_eq!(c.clear_range(50..100), 50);
        assert_eq!(c.len(), 150);
        assert!(c.get(lk(60), 1, 60).is_none());
        assert!(c.get(lk(10), 1, 10).is_some() && c.get(lk(150), 1, 150).is_some());
        assert_eq!(c.clear(), 150);
        assert!(c.is_empty());
    }

    // ---- With the lock table: the spec's A.9 test 1 and errata 2's local writer ----

    const ME: u32 = 1;
    const OTHER: u32 = 7;

    fn op(node: u32, key: LockKey, txn: u64, kind: OpKind) -> TableOp {
        TableOp {
            key,
            txn,
            node,
            kind,
        }
    }

    fn apply(svc: &TableService, ops: &[TableOp]) -> Vec<OpOutcome> {
        let mut out = Vec::new();
        svc.apply(ops, &mut out);
        out
    }

    /// This node's lock table serving every shard, with the cache's grant hook unless
    /// `planted_bug` (the hook left out).
    fn node(planted_bug: bool) -> (Arc<VtCache>, TableService) {
        let cache = Arc::new(VtCache::new(1024));
        let map = ShardMap::uniform(&[ME]).unwrap();
        let table = Arc::new(LockTable::with_bytes(1 << 16));
        let mut svc = TableService::new(table, Ownership::new(ME, map));
        if !planted_bug {
            svc = svc.with_grant_hook(cache.grant_hook());
        }
        (cache, svc)
    }

    /// What a lookup returns.
    type Lookup = Option<(CvtLoc, Cvt)>;

    const R: OpKind = OpKind::Lock(LockMode::Read);
    const W: OpKind = OpKind::Lock(LockMode::Write);

    /// A local holder caches K's CVT (version 1) and unlocks; a remote node's write
    /// grant on K; the remote writer installs version 2 and unlocks; a local locker then
    /// looks K up. Returns what the cache held right after the grant returned, and what
    /// the later local locker's lookup returned.
    fn remote_writer_scenario(planted_bug: bool) -> (Lookup, Lookup) {
        let (cache, svc) = node(planted_bug);
        let k = lk(42);
        // Local reader: lock, miss, READ (version 1), fill under the lock, unlock.
        assert_eq!(apply(&svc, &[op(ME, k, 1, R)]), [OpOutcome::Granted]);
        assert_eq!(cache.get(k, 1, 42), None);
        cache.fill(k, 1, 42, loc(42), &cvt(42, 1));
        assert_eq!(
            apply(&svc, &[op(ME, k, 1, OpKind::Unlock)]),
            [OpOutcome::Released]
        );
        // Remote writer: the grant (the hook runs inside apply).
        assert_eq!(apply(&svc, &[op(OTHER, k, 2, W)]), [OpOutcome::Granted]);
        // Peek without counting: what a local holder could find right now.
        let after_grant = cache.sub(k).get(k.0).map(|e| (e.loc, e.cvt.clone()));
        // ... it writes version 2 in the memory pool and unlocks.
        assert_eq!(
            apply(&svc, &[op(OTHER, k, 2, OpKind::Unlock)]),
            [OpOutcome::Released]
        );
        // The next local locker.
        assert_eq!(apply(&svc, &[op(ME, k, 3, R)]), [OpOutcome::Granted]);
        let seen = cache.get(k, 1, 42);
        (after_grant, seen)
    }

    /// The spec's A.9 test 1 (Lotus, Algorithm 1, line 15), at unit level: the entry is
    /// gone before `apply` returns the remote write grant, so the next local locker
    /// misses and READs the writer's CVT.
    #[test]
    fn a_remote_write_grant_removes_the_entry_before_apply_returns() {
        let (after_grant, seen) = remote_writer_scenario(false);
        assert_eq!(after_grant, None);
        assert_eq!(seen, None);
    }

    /// The planted bug (the hook not installed): the stale entry survives the remote
    /// write, and the next local locker is handed version 1, superseded by the remote
    /// writer's version 2. The test above would fail on it.
    #[test]
    fn without_the_hook_a_later_local_locker_reads_the_stale_cvt() {
        let (after_grant, seen) = remote_writer_scenario(true);
        assert_eq!(after_grant, Some((loc(42), cvt(42, 1))));
        assert_eq!(
            seen,
            Some((loc(42), cvt(42, 1))),
            "the planted bug must leave the superseded CVT in place"
        );
        // What the intact test checks would fail here.
        assert_ne!(seen, None);
    }

    /// The spec's A.3 item 6 (Lotus 4.3), at unit level: K's shard moves to another
    /// compute node and back. While the other node owns it, its table grants a writer
    /// that installs version 2; this node's table never sees that grant, so only the
    /// clear at the move (the lost-range hook on [`TableService::install`]) keeps this
    /// node from handing version 1 to its next local locker once the shard is back.
    /// Returns what that locker's lookup found.
    fn move_away_and_back(planted_bug: bool) -> Lookup {
        let (cache, svc) = node(false);
        if !planted_bug {
            let c = cache.clone();
            assert!(
                svc.set_lost_range_hook(Arc::new(move |r: std::ops::Range<u16>| {
                    c.clear_range(r);
                }))
            );
        }
        let k = lk(42);
        // A local holder fills K's CVT (version 1) under its lock and unlocks.
        assert_eq!(apply(&svc, &[op(ME, k, 1, R)]), [OpOutcome::Granted]);
        cache.fill(k, 1, 42, loc(42), &cvt(42, 1));
        apply(&svc, &[op(ME, k, 1, OpKind::Unlock)]);
        // K's shard moves to OTHER (drained: no lock held), and a writer there installs
        // version 2 under OTHER's lock, which this node's table does not grant.
        let shard = k.shard();
        let map = ShardMap::uniform(&[ME]).unwrap();
        let away = map.with_move(shard..shard + 1, OTHER);
        svc.install(&away);
        assert!(matches!(
            apply(&svc, &[op(ME, k, 2, R)])[..],
            [OpOutcome::WrongShard { .. }]
        ));
        // The shard comes back, and a local locker looks K up.
        svc.install(&away.with_move(shard..shard + 1, ME));
        assert_eq!(apply(&svc, &[op(ME, k, 3, R)]), [OpOutcome::Granted]);
        cache.get(k, 1, 42)
    }

    #[test]
    fn a_range_that_moved_away_and_back_is_read_again() {
        assert_eq!(move_away_and_back(false), None);
    }

    /// The planted bug (no clear when the range moves away): the locker is handed
    /// version 1, which the other node's writer superseded. The test above fails on it.
    #[test]
    fn without_the_clear_on_a_move_the_returned_range_serves_a_stale_cvt() {
        assert_eq!(move_away_and_back(true), Some((loc(42), cvt(42, 1))));
    }

    /// Local and remote read grants and this node's own write grants do not invalidate;
    /// a remote upgrade does.
    #[test]
    fn only_remote_write_grants_and_upgrades_invalidate() {
        let (cache, svc) = node(false);
        let (a, b) = (lk(1), lk(2));
        cache.fill(a, 1, 1, loc(1), &cvt(1, 1));
        cache.fill(b, 1, 2, loc(2), &cvt(2, 1));
        apply(&svc, &[op(ME, a, 1, W), op(OTHER, b, 2, R)]);
        assert_eq!(cache.len(), 2);
        // The remote reader upgrades: a write grant to another node.
        assert_eq!(apply(&svc, &[op(OTHER, b, 2, W)]), [OpOutcome::Granted]);
        assert_eq!(cache.len(), 1);
        assert!(cache.get(b, 1, 2).is_none());
        assert_eq!(cache.stats().invalidations, 1);
    }

    /// Errata 2's local-writer case (the spec's A.9.2 addition): a local writer replaces
    /// the entry with its CVT after C3 and before it unlocks; the next local locker sees
    /// the new version, never the one the writer overwrote. (With a deferred fill this is
    /// the lost update the errata describes: the next writer would pick its victim from
    /// the stale CVT.)
    #[test]
    fn a_local_writer_updates_the_entry_before_unlocking() {
        let (cache, svc) = node(false);
        let k = lk(5);
        // Writer: lock (local: no hook), miss, READ version 1, fill.
        assert_eq!(apply(&svc, &[op(ME, k, 1, W)]), [OpOutcome::Granted]);
        assert!(cache.get(k, 1, 5).is_none());
        cache.fill(k, 1, 5, loc(5), &cvt(5, 1));
        // C1..C3 install version 9 into cell 1; then the update, then the unlock.
        let mut new = cvt(5, 1);
        new.cells[1].valid = true;
        new.cells[1].version = Timestamp(9);
        cache.update(k, 1, 5, loc(5), &new);
        assert_eq!(
            apply(&svc, &[op(ME, k, 1, OpKind::Unlock)]),
            [OpOutcome::Released]
        );
        // The next local locker (a writer): hits, and its newest version is 9.
        assert_eq!(apply(&svc, &[op(ME, k, 2, W)]), [OpOutcome::Granted]);
        let (_, got) = cache.get(k, 1, 5).expect("a hit");
        assert_eq!(got, new);
        assert_eq!(
            got.newest().map(|i| got.cells[i].version),
            Some(Timestamp(9))
        );
    }

    /// Sub-caches are shared by threads: concurrent fills, lookups and invalidations
    /// keep the index and the ring consistent and within capacity.
    #[test]
    fn concurrent_use_stays_consistent() {
        let c = Arc::new(VtCache::new(256));
        let hs: Vec<_> = (0..4u64)
            .map(|t| {
                let c = c.clone();
                std::thread::spawn(move || {
                    for i in 0..5_000u64 {
                        let k = (i * 7 + t) % 600;
                        match i % 3 {
                            0 => c.fill(lk(k), 1, k, loc(k), &cvt(k, i)),
                            1 => {
                                if let Some((l, v)) = c.get(lk(k), 1, k) {
                                    assert_eq!((l, v.header.key), (loc(k), k));
                                }
                            }
                            _ => {
                                c.invalidate(lk(k));
                            }
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert!(c.len() <= c.capacity());
        for s in c.subs.iter() {
            let s = s.lock().unwrap();
            for (&k, &i) in &s.index {
                assert_eq!(s.slots[i].as_ref().unwrap().lock_key, k);
            }
        }
    }
}
