//! Lotus's lock table (Lotus, 4.1, Fig. 6 and Algorithm 1): a
//! fixed-size hash table of 8-byte slots, 8 slots to a bucket, with read and write locks,
//! held by the compute node that owns a shard of the keys and changed only by that node's
//! CPU (local coordinators directly, remote ones through its RPC handler).
//!
//! A slot is `fingerprint << 8 | counter`: a 56-bit fingerprint of the key (never 0) and
//! an 8-bit counter, 1 for a write lock and `2 x readers` for read locks; 0 is a free
//! slot. A key's fingerprint and bucket come from two independent hashes. To lock, the
//! bucket is scanned for the key's fingerprint (else its first free slot) and the slot is
//! changed with one CAS (Algorithm 1, lines 7 to 19). A full bucket, a conflicting lock
//! or a reader count past [`MAX_READERS`] refuses; Lotus aborts the transaction then
//! (no-wait). Two keys with one fingerprint in one bucket share a slot: more conflicts,
//! never fewer.
//!
//! **Publish, then check.** The scan reads 8 words one at a time, not as a snapshot, so
//! Algorithm 1 as printed admits a race: a writer of key A scans slot 0 (held by B), B
//! is released, A's last reader leaves slot 5, a new reader of A takes slot 0 (now the
//! first free one), and the writer, reaching slot 5, finds it free and takes it. Both
//! succeed. Here an acquirer that takes a free slot scans its bucket again after its CAS
//! (all accesses SeqCst): if another slot holds the same fingerprint, it undoes its CAS
//! and decides again. Of two such acquirers at least the later one sees the other. A test
//! below drives the race above by hand (without the check both hold A; with it the
//! writer backs off), and a `loom` model checks mutual exclusion of the same three
//! threads over the interleavings it explores (it does not reach this one by itself: the
//! releasing thread must run three operations between two of the writer's loads).
//!
//! **Read-to-write upgrade.** Lotus declares a transaction's read-only and read-write
//! keys up front (`AddRO`/`AddRW`), so Algorithm 1 never upgrades; the project's `read`
//! then `write` pattern needs it (an inference, not in the paper). A transaction holding
//! a key for read that asks for write gets it iff it is the key's only holder: its slot
//! counter is 2 and one CAS turns it into 1 ([`upgrade`]); with any other reader counted
//! it is refused ([`Refusal::NoUpgrade`]) and nothing changes. The upgrader's slot is
//! published before the upgrade begins, so a concurrent acquirer that takes another slot
//! of the bucket finds it in its check and backs off; a concurrent reader joining the
//! upgrader's slot and the upgrade's CAS exclude each other on the one word (a loom model
//! below). The scan insists on exactly one slot of the fingerprint, so that a twin taken
//! for an instant by such an acquirer (before it backs off) is never the one upgraded.
//!
//! The lock state (Algorithm 1, lines 5 and 21) records each lock's holders (transaction
//! id, compute node id, mode), so acquiring a lock already held and releasing one not
//! held are no-ops (requests may be retried), and [`LockTable::release_node`] can pass on
//! every lock of a compute node that failed (Lotus 6).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Slots per bucket (Lotus 4.1).
pub const SLOTS_PER_BUCKET: usize = 8;
/// Bytes per slot.
pub const SLOT_BYTES: usize = 8;
/// Counter of a write-locked slot.
pub const WRITE_COUNTER: u64 = 1;
/// Most readers one slot counts (`2 x 127 = 254` fits the 8-bit counter).
pub const MAX_READERS: u64 = 127;
/// How many times an acquire decides again after a lost CAS or a found twin slot before
/// it refuses with [`Refusal::Contended`].
pub const MAX_ATTEMPTS: usize = 64;

/// Lock mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LockMode {
    /// Shared.
    Read,
    /// Exclusive.
    Write,
}

/// Why an acquire was refused (the caller aborts its transaction).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum Refusal {
    /// A conflicting lock is held (read-write or write-write), by this key or by one
    /// sharing its fingerprint and bucket.
    #[error("conflicting lock held")]
    Conflict,
    /// The bucket has no free slot and none holds the key's fingerprint.
    #[error("lock bucket full")]
    BucketFull,
    /// The slot already counts [`MAX_READERS`] readers.
    #[error("too many readers")]
    ReaderOverflow,
    /// The slot kept changing under concurrent acquirers for [`MAX_ATTEMPTS`] tries.
    #[error("lock slot contended")]
    Contended,
    /// The transaction holds the lock in read mode and asked for write, and it is not
    /// the only holder (other readers are counted in the slot), so the read lock cannot
    /// be upgraded ([`upgrade`]). Nothing changed: the read lock is still held.
    #[error("read lock held by this transaction with other readers; no upgrade to write")]
    NoUpgrade,
    /// The operation comes from an incarnation of its node older than one the table has
    /// seen (the design's failure model: anything from an older incarnation is refused).
    #[error("an older incarnation of the node than one already seen")]
    StaleIncarnation,
}

/// Slot word of `fingerprint` (56 bits, nonzero) and `counter`.
pub fn slot_word(fingerprint: u64, counter: u64) -> u64 {
    debug_assert!(fingerprint != 0 && fingerprint < 1 << 56 && counter < 256);
    fingerprint << 8 | counter
}

/// The fingerprint of a slot word.
pub fn fingerprint_of(word: u64) -> u64 {
    word >> 8
}

/// The counter of a slot word.
pub fn counter_of(word: u64) -> u64 {
    word & 0xff
}

/// The slots of a table as 8-byte atomic words: the table's memory in production, loom
/// atomics in the model. All accesses are sequentially consistent.
pub trait SlotWords {
    /// Load slot `i`.
    fn load(&self, i: usize) -> u64;
    /// CAS slot `i` from `current` to `new`; `Err` with the value found.
    fn compare_exchange(&self, i: usize, current: u64, new: u64) -> Result<u64, u64>;
}

impl SlotWords for [AtomicU64] {
    fn load(&self, i: usize) -> u64 {
        self[i].load(Ordering::SeqCst)
    }
    fn compare_exchange(&self, i: usize, current: u64, new: u64) -> Result<u64, u64> {
        self[i].compare_exchange(current, new, Ordering::SeqCst, Ordering::SeqCst)
    }
}

/// What a scan of a bucket found.
enum Scan {
    /// A slot holding the fingerprint, with its word.
    Match(usize, u64),
    /// No slot holds it; the first free slot.
    Free(usize),
    /// No slot holds it and none is free.
    Full,
}

fn scan<S: SlotWords + ?Sized>(slots: &S, base: usize, width: usize, fp: u64) -> Scan {
    let mut free = None;
    for j in base..base + width {
        let w = slots.load(j);
        if w == 0 {
            free.get_or_insert(j);
        } else if fingerprint_of(w) == fp {
            return Scan::Match(j, w);
        }
    }
    free.map_or(Scan::Full, Scan::Free)
}

/// Acquire a `mode` lock on fingerprint `fp` in the bucket of slots
/// `base..base + width` (Algorithm 1, lines 7 to 19, with the check of the module docs).
///
/// Errors: [`Refusal::Conflict`], [`Refusal::BucketFull`], [`Refusal::ReaderOverflow`],
/// [`Refusal::Contended`].
pub fn acquire<S: SlotWords + ?Sized>(
    slots: &S,
    base: usize,
    width: usize,
    fp: u64,
    mode: LockMode,
) -> Result<(), Refusal> {
    acquire_inner(slots, base, width, fp, mode, true)
}

fn acquire_inner<S: SlotWords + ?Sized>(
    slots: &S,
    base: usize,
    width: usize,
    fp: u64,
    mode: LockMode,
    check: bool,
) -> Result<(), Refusal> {
    let add = match mode {
        LockMode::Write => WRITE_COUNTER,
        LockMode::Read => 2,
    };
    for _ in 0..MAX_ATTEMPTS {
        let (j, current) = match (scan(slots, base, width, fp), mode) {
            (Scan::Match(..), LockMode::Write) => return Err(Refusal::Conflict),
            (Scan::Match(j, w), LockMode::Read) => {
                let c = counter_of(w);
                if c == WRITE_COUNTER {
                    return Err(Refusal::Conflict);
                }
                if c / 2 >= MAX_READERS {
                    return Err(Refusal::ReaderOverflow);
                }
                (j, w)
            }
            (Scan::Free(j), _) => (j, 0),
            (Scan::Full, _) => return Err(Refusal::BucketFull),
        };
        let new = slot_word(fp, counter_of(current) + add);
        if slots.compare_exchange(j, current, new).is_err() {
            continue; // the slot changed under us: decide again
        }
        if current == 0 && check {
            // We took a free slot: publish, then check that no other slot of the bucket
            // holds the same fingerprint (see the module docs).
            let twin = (base..base + width)
                .any(|k| k != j && fingerprint_of(slots.load(k)) == fp && slots.load(k) != 0);
            if twin {
                unhold(slots, j, fp, add);
                continue;
            }
        }
        return Ok(());
    }
    Err(Refusal::Contended)
}

/// Upgrade the caller's read lock on fingerprint `fp` in the bucket `base..base + width`
/// to a write lock: one CAS of its slot from counter 2 (the caller the only reader) to
/// [`WRITE_COUNTER`] (see the module docs). The caller must hold a read lock on `fp`.
///
/// Errors: [`Refusal::NoUpgrade`] when the slot counts other readers (or a key sharing
/// the fingerprint holds it; more conflicts, never fewer), and also, with a debug
/// assertion, when no slot holds `fp` for read (the caller holds no read lock);
/// [`Refusal::Contended`] after [`MAX_ATTEMPTS`] lost CASes or transient twins.
pub fn upgrade<S: SlotWords + ?Sized>(
    slots: &S,
    base: usize,
    width: usize,
    fp: u64,
) -> Result<(), Refusal> {
    for _ in 0..MAX_ATTEMPTS {
        let (j, w) = match scan_sole(slots, base, width, fp) {
            Sole::One(j, w) => (j, w),
            Sole::Twins => continue, // a twin taken for an instant: its acquirer backs off
            Sole::Nothing => {
                debug_assert!(false, "no slot holds fingerprint {fp:#x}");
                return Err(Refusal::NoUpgrade);
            }
        };
        let c = counter_of(w);
        if c != 2 {
            debug_assert!(
                c >= 2 && c.is_multiple_of(2),
                "no read lock to upgrade: {w:#x}"
            );
            return Err(Refusal::NoUpgrade);
        }
        if slots
            .compare_exchange(j, w, slot_word(fp, WRITE_COUNTER))
            .is_ok()
        {
            return Ok(());
        }
    }
    Err(Refusal::Contended)
}

/// What [`scan_sole`] found.
enum Sole {
    /// Exactly one slot holds the fingerprint: its index and word.
    One(usize, u64),
    /// Two or more do (a twin taken for an instant by an acquirer that will back off).
    Twins,
    /// None does.
    Nothing,
}

/// The slots of the bucket `base..base + width` that hold `fp`, as far as one pass sees.
fn scan_sole<S: SlotWords + ?Sized>(slots: &S, base: usize, width: usize, fp: u64) -> Sole {
    let mut found = Sole::Nothing;
    for j in base..base + width {
        let w = slots.load(j);
        if w != 0 && fingerprint_of(w) == fp {
            if let Sole::One(..) = found {
                return Sole::Twins;
            }
            found = Sole::One(j, w);
        }
    }
    found
}

/// Take `sub` off the counter of slot `j` (which holds `fp`), freeing it at zero.
fn unhold<S: SlotWords + ?Sized>(slots: &S, j: usize, fp: u64, sub: u64) {
    loop {
        let w = slots.load(j);
        debug_assert!(fingerprint_of(w) == fp && counter_of(w) >= sub, "{w:#x}");
        let c = counter_of(w) - sub;
        let new = if c == 0 { 0 } else { slot_word(fp, c) };
        if slots.compare_exchange(j, w, new).is_ok() {
            return;
        }
    }
}

/// Release a `mode` lock on `fp` in the bucket `base..base + width`. Returns false when no
/// slot holds `fp` in that mode (the caller's lock state says what is held, so this
/// means the table and the state disagree).
pub fn release<S: SlotWords + ?Sized>(
    slots: &S,
    base: usize,
    width: usize,
    fp: u64,
    mode: LockMode,
) -> bool {
    let Scan::Match(j, w) = scan(slots, base, width, fp) else {
        return false;
    };
    let ok = match mode {
        LockMode::Write => counter_of(w) == WRITE_COUNTER,
        LockMode::Read => counter_of(w) >= 2 && counter_of(w).is_multiple_of(2),
    };
    if ok {
        unhold(slots, j, fp, if mode == LockMode::Write { 1 } else { 2 });
    }
    ok
}

/// Who holds a lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Holder {
    /// Transaction id (unique per compute node).
    pub txn: u64,
    /// Compute node the transaction runs on.
    pub node: u32,
    /// Incarnation of the node's process (0 for callers that name none).
    pub incarnation: u64,
    /// Mode held.
    pub mode: LockMode,
}

const STATE_SHARDS: usize = 64;

/// A compute node's lock table: slots plus the lock state. `Sync`; shared by the node's
/// threads.
pub struct LockTable {
    slots: Box<[AtomicU64]>,
    n_buckets: u64,
    /// Key -> holders, sharded by key. A shard's mutex is held across the slot operation
    /// of its key, so operations on one key are ordered with its state; keys that share
    /// a fingerprint in a bucket meet only in the slots.
    state: Vec<Mutex<HashMap<u64, Vec<Holder>>>>,
    /// Newest incarnation seen per node, sharded by node id.
    incarnations: Vec<Mutex<HashMap<u32, u64>>>,
}

impl LockTable {
    /// A table of at least `bytes` bytes of slots (rounded up to a power of two of
    /// buckets; Lotus evaluates 32 MiB).
    pub fn with_bytes(bytes: usize) -> Self {
        let per_bucket = SLOTS_PER_BUCKET * SLOT_BYTES;
        let n_buckets = bytes.div_ceil(per_bucket).max(1).next_power_of_two();
        Self {
            slots: (0..n_buckets * SLOTS_PER_BUCKET)
                .map(|_| AtomicU64::new(0))
                .collect(),
            n_buckets: n_buckets as u64,
            state: (0..STATE_SHARDS).map(|_| Mutex::default()).collect(),
            incarnations: (0..STATE_SHARDS).map(|_| Mutex::default()).collect(),
        }
    }

    /// Buckets in the table.
    pub fn n_buckets(&self) -> u64 {
        self.n_buckets
    }

    /// Fingerprint (56 bits, nonzero) and bucket of `key`, from two independent hashes.
    pub fn place(&self, key: u64) -> (u64, usize) {
        let fp = (mix(key ^ 0x5163_7ab9_c2d1_0e8f) >> 8).max(1);
        let bucket = (mix(key) & (self.n_buckets - 1)) as usize;
        (fp, bucket)
    }

    fn shard(&self, key: u64) -> std::sync::MutexGuard<'_, HashMap<u64, Vec<Holder>>> {
        let s = (mix(key ^ 0x9e37_79b9) as usize) % STATE_SHARDS;
        // A poisoned shard only means a panic elsewhere mid-update of plain data; the
        // map is still consistent at every await-free step, so keep serving.
        self.state[s].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Note incarnation `incarnation` of `node` as seen; refuse it if a newer one was.
    fn admit(&self, node: u32, incarnation: u64) -> Result<(), Refusal> {
        let shard = &self.incarnations[node as usize % STATE_SHARDS];
        let mut seen = shard.lock().unwrap_or_else(|e| e.into_inner());
        let newest = seen.entry(node).or_insert(incarnation);
        if *newest > incarnation {
            return Err(Refusal::StaleIncarnation);
        }
        *newest = incarnation;
        Ok(())
    }

    /// Acquire `key` in `mode` for transaction `txn` of compute node `node` (incarnation
    /// 0: [`Self::acquire_inc`]).
    ///
    /// Errors: as [`Self::acquire_inc`].
    pub fn acquire(&self, key: u64, mode: LockMode, txn: u64, node: u32) -> Result<(), Refusal> {
        self.acquire_inc(key, mode, txn, node, 0)
    }

    /// Acquire `key` in `mode` for transaction `txn` of incarnation `incarnation` of
    /// compute node `node`. Acquiring a lock the transaction already holds in that mode
    /// (or write when it asks for read) succeeds without change. Asking for write while
    /// holding read upgrades the lock iff the transaction is its only holder (slot
    /// counter 2, one CAS to 1; [`upgrade`]); its holder entry then shows
    /// [`LockMode::Write`] and one release frees the slot.
    ///
    /// Errors: the [`Refusal`]s of [`acquire`]; [`Refusal::NoUpgrade`] when the
    /// transaction holds `key` for read with other readers and asks for write (nothing
    /// changes; it still holds read); [`Refusal::StaleIncarnation`] when a newer
    /// incarnation of `node` was seen.
    pub fn acquire_inc(
        &self,
        key: u64,
        mode: LockMode,
        txn: u64,
        node: u32,
        incarnation: u64,
    ) -> Result<(), Refusal> {
        self.admit(node, incarnation)?;
        let mut st = self.shard(key);
        let holders = st.entry(key).or_default();
        let same = |h: &&mut Holder| h.txn == txn && h.node == node && h.incarnation == incarnation;
        let (fp, b) = self.place(key);
        if let Some(h) = holders.iter_mut().find(same) {
            if (h.mode, mode) != (LockMode::Read, LockMode::Write) {
                return Ok(()); // held in that mode, or write covers read
            }
            upgrade(&*self.slots, b * SLOTS_PER_BUCKET, SLOTS_PER_BUCKET, fp)?;
            h.mode = LockMode::Write;
            return Ok(());
        }
        let r = acquire(
            &*self.slots,
            b * SLOTS_PER_BUCKET,
            SLOTS_PER_BUCKET,
            fp,
            mode,
        );
        match r {
            Ok(()) => holders.push(Holder {
                txn,
                node,
                incarnation,
                mode,
            }),
            Err(_) if holders.is_empty() => {
                st.remove(&key);
            }
            Err(_) => {}
        }
        r
    }

    /// Release `key` held by (`txn`, `node`) (incarnation 0: [`Self::release_inc`]).
    pub fn release(&self, key: u64, txn: u64, node: u32) -> bool {
        self.release_inc(key, txn, node, 0).unwrap_or(false)
    }

    /// Release `key` held by transaction `txn` of incarnation `incarnation` of `node`.
    /// Returns false when it holds no such lock (a repeated release: a no-op).
    ///
    /// Errors: [`Refusal::StaleIncarnation`] when a newer incarnation of `node` was seen
    /// (its predecessor's locks are released by [`Self::release_incarnation`]).
    pub fn release_inc(
        &self,
        key: u64,
        txn: u64,
        node: u32,
        incarnation: u64,
    ) -> Result<bool, Refusal> {
        self.admit(node, incarnation)?;
        Ok(self.release_held(key, txn, node, incarnation))
    }

    fn release_held(&self, key: u64, txn: u64, node: u32, incarnation: u64) -> bool {
        let mut st = self.shard(key);
        let Some(holders) = st.get_mut(&key) else {
            return false;
        };
        let Some(i) = holders
            .iter()
            .position(|h| h.txn == txn && h.node == node && h.incarnation == incarnation)
        else {
            return false;
        };
        let h = holders.swap_remove(i);
        if holders.is_empty() {
            st.remove(&key);
        }
        let (fp, b) = self.place(key);
        let released = release(
            &*self.slots,
            b * SLOTS_PER_BUCKET,
            SLOTS_PER_BUCKET,
            fp,
            h.mode,
        );
        debug_assert!(released, "lock state and slots disagree on key {key}");
        released
    }

    /// Release every lock held by transactions of compute node `node`, of every
    /// incarnation (it failed; Lotus 6). Returns how many locks were released. Prefer
    /// [`Self::release_incarnation`]: this one also takes a restarted node's live locks.
    pub fn release_node(&self, node: u32) -> usize {
        self.release_where(|h| h.node == node)
    }

    /// Release every lock held by transactions of incarnation `incarnation` of compute
    /// node `node` (it failed; Lotus 6); a later incarnation's locks stay. Returns how
    /// many locks were released.
    pub fn release_incarnation(&self, node: u32, incarnation: u64) -> usize {
        self.release_where(|h| h.node == node && h.incarnation == incarnation)
    }

    fn release_where(&self, pred: impl Fn(&Holder) -> bool) -> usize {
        let mut held = Vec::new();
        for shard in &self.state {
            let st = shard.lock().unwrap_or_else(|e| e.into_inner());
            for (&key, hs) in st.iter() {
                held.extend(hs.iter().filter(|h| pred(h)).map(|h| (key, *h)));
            }
        }
        held.into_iter()
            .filter(|&(key, h)| self.release_held(key, h.txn, h.node, h.incarnation))
            .count()
    }

    /// How many (key, holder) pairs are held on keys for which `pred(key)` is true (a
    /// draining shard range asks how many locks it still holds).
    pub fn count_held(&self, mut pred: impl FnMut(u64) -> bool) -> usize {
        self.state
            .iter()
            .map(|shard| {
                let st = shard.lock().unwrap_or_else(|e| e.into_inner());
                st.iter()
                    .filter(|(&k, _)| pred(k))
                    .map(|(_, hs)| hs.len())
                    .sum::<usize>()
            })
            .sum()
    }

    /// The holders of `key`.
    pub fn holders(&self, key: u64) -> Vec<Holder> {
        self.shard(key).get(&key).cloned().unwrap_or_default()
    }

    /// Slots in use (for tests and reports).
    pub fn slots_in_use(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| s.load(Ordering::Relaxed) != 0)
            .count()
    }
}

/// SplitMix64 finalizer.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket() -> Vec<AtomicU64> {
        (0..SLOTS_PER_BUCKET).map(|_| AtomicU64::new(0)).collect()
    }

    #[test]
    fn read_and_write_locks_on_one_slot() {
        let s = bucket();
        let s = &*s;
        let acq = |fp, m| acquire(s, 0, SLOTS_PER_BUCKET, fp, m);
        assert_eq!(acq(7, LockMode::Read), Ok(()));
        assert_eq!(acq(7, LockMode::Read), Ok(()));
        assert_eq!(s.load(0), slot_word(7, 4), "two readers: counter 4");
        assert_eq!(acq(7, LockMode::Write), Err(Refusal::Conflict));
        assert!(release(s, 0, 8, 7, LockMode::Read));
        assert!(release(s, 0, 8, 7, LockMode::Read));
        assert_eq!(s.load(0), 0, "slot freed");
        assert_eq!(acq(7, LockMode::Write), Ok(()));
        assert_eq!(s.load(0), slot_word(7, 1));
        assert_eq!(acq(7, LockMode::Read), Err(Refusal::Conflict));
        assert_eq!(acq(7, LockMode::Write), Err(Refusal::Conflict));
        assert!(!release(s, 0, 8, 7, LockMode::Read), "mode must match");
        assert!(release(s, 0, 8, 7, LockMode::Write));
        assert!(!release(s, 0, 8, 7, LockMode::Write), "nothing held");
    }

    #[test]
    fn full_bucket_and_reader_overflow_refuse_cleanly() {
        let s = bucket();
        let s = &*s;
        for fp in 1..=8 {
            assert_eq!(acquire(s, 0, 8, fp, LockMode::Write), Ok(()));
        }
        assert_eq!(
            acquire(s, 0, 8, 9, LockMode::Read),
            Err(Refusal::BucketFull)
        );
        let before: Vec<u64> = (0..8).map(|i| s.load(i)).collect();
        assert_eq!(
            acquire(s, 0, 8, 9, LockMode::Write),
            Err(Refusal::BucketFull)
        );
        assert_eq!(
            before,
            (0..8).map(|i| s.load(i)).collect::<Vec<_>>(),
            "unchanged"
        );
        assert!(release(s, 0, 8, 3, LockMode::Write));
        for _ in 0..MAX_READERS {
            assert_eq!(acquire(s, 0, 8, 9, LockMode::Read), Ok(()));
        }
        assert_eq!(s.load(2), slot_word(9, 254));
        assert_eq!(
            acquire(s, 0, 8, 9, LockMode::Read),
            Err(Refusal::ReaderOverflow)
        );
        assert_eq!(s.load(2), slot_word(9, 254), "unchanged by the refusal");
    }

    #[test]
    fn a_fingerprint_found_anywhere_in_the_bucket_wins_over_a_free_slot() {
        let s = bucket();
        let s = &*s;
        acquire(s, 0, 8, 1, LockMode::Write).unwrap();
        acquire(s, 0, 8, 2, LockMode::Read).unwrap(); // slot 1
        release(s, 0, 8, 1, LockMode::Write); // slot 0 free again
        acquire(s, 0, 8, 2, LockMode::Read).unwrap();
        assert_eq!(
            (s.load(0), s.load(1)),
            (0, slot_word(2, 4)),
            "joined slot 1"
        );
        assert_eq!(acquire(s, 0, 8, 2, LockMode::Write), Err(Refusal::Conflict));
    }

    #[test]
    fn table_state_makes_acquire_and_release_idempotent() {
        let t = LockTable::with_bytes(4096);
        assert_eq!(t.n_buckets(), 64);
        t.acquire(10, LockMode::Write, 1, 100).unwrap();
        t.acquire(10, LockMode::Write, 1, 100).unwrap(); // a retried request
        t.acquire(10, LockMode::Read, 1, 100).unwrap(); // write covers read
        assert_eq!(t.slots_in_use(), 1);
        assert_eq!(
            t.acquire(10, LockMode::Write, 2, 100),
            Err(Refusal::Conflict)
        );
        assert_eq!(
            t.acquire(10, LockMode::Read, 1, 101),
            Err(Refusal::Conflict)
        );
        assert!(t.release(10, 1, 100));
        assert!(!t.release(10, 1, 100), "second release is a no-op");
        assert_eq!(t.slots_in_use(), 0);
        t.acquire(11, LockMode::Read, 5, 100).unwrap();
        t.acquire(11, LockMode::Read, 6, 101).unwrap();
        assert_eq!(
            t.acquire(11, LockMode::Write, 5, 100),
            Err(Refusal::NoUpgrade)
        );
        assert_eq!(t.holders(11).len(), 2);
        assert!(!t.release(11, 9, 100), "not a holder");
        assert_eq!(t.holders(11).len(), 2);
    }

    #[test]
    fn an_upgrade_with_another_reader_is_refused_and_changes_nothing() {
        let t = LockTable::with_bytes(4096);
        t.acquire(11, LockMode::Read, 5, 100).unwrap();
        t.acquire(11, LockMode::Read, 6, 101).unwrap();
        let (fp, b) = t.place(11);
        let word = |t: &LockTable| {
            t.slots[b * SLOTS_PER_BUCKET..][..SLOTS_PER_BUCKET]
                .iter()
                .map(|w| w.load(Ordering::SeqCst))
                .find(|&w| w != 0 && fingerprint_of(w) == fp)
        };
        let (before, holders) = (word(&t), t.holders(11));
        assert_eq!(before, Some(slot_word(fp, 4)), "two readers");
        assert_eq!(
            t.acquire(11, LockMode::Write, 5, 100),
            Err(Refusal::NoUpgrade)
        );
        assert_eq!(word(&t), before, "slot unchanged");
        assert_eq!(t.holders(11), holders, "holders unchanged");
        // The other reader leaves: now the sole reader may upgrade.
        assert!(t.release(11, 6, 101));
        t.acquire(11, LockMode::Write, 5, 100).unwrap();
        assert_eq!(word(&t), Some(slot_word(fp, WRITE_COUNTER)));
    }

    #[test]
    fn the_sole_reader_upgrades_to_write() {
        let t = LockTable::with_bytes(4096);
        t.acquire_inc(12, LockMode::Read, 5, 100, 3).unwrap();
        t.acquire_inc(12, LockMode::Write, 5, 100, 3).unwrap();
        assert_eq!(
            t.holders(12),
            [Holder {
                txn: 5,
                node: 100,
                incarnation: 3,
                mode: LockMode::Write
            }]
        );
        assert_eq!(t.slots_in_use(), 1);
        // Idempotent from here: write again, or read (write covers it).
        t.acquire_inc(12, LockMode::Write, 5, 100, 3).unwrap();
        t.acquire_inc(12, LockMode::Read, 5, 100, 3).unwrap();
        assert_eq!(t.holders(12).len(), 1);
        // A third party is refused in either mode.
        assert_eq!(
            t.acquire(12, LockMode::Read, 6, 101),
            Err(Refusal::Conflict)
        );
        assert_eq!(
            t.acquire(12, LockMode::Write, 6, 101),
            Err(Refusal::Conflict)
        );
        assert_eq!(t.holders(12).len(), 1);
        // One release frees the slot (the write counter, not a reader's 2).
        assert_eq!(t.release_inc(12, 5, 100, 3), Ok(true));
        assert_eq!(t.slots_in_use(), 0);
        assert_eq!(t.holders(12), []);
        t.acquire(12, LockMode::Read, 6, 101).unwrap();
        assert!(t.release(12, 6, 101));
        assert_eq!(t.slots_in_use(), 0);
    }

    #[test]
    fn an_upgrade_never_takes_a_twin_slot() {
        // Slot 0: a twin of A taken for an instant by an acquirer that will back off;
        // slot 1: the upgrader's read lock. With both there, the upgrade waits.
        let s = bucket();
        let s = &*s;
        s[0].store(slot_word(A, 2), Ordering::SeqCst);
        s[1].store(slot_word(A, 2), Ordering::SeqCst);
        assert_eq!(upgrade(s, 0, 8, A), Err(Refusal::Contended));
        assert_eq!((s.load(0), s.load(1)), (slot_word(A, 2), slot_word(A, 2)));
        unhold(s, 0, A, 2); // the twin backs off
        assert_eq!(upgrade(s, 0, 8, A), Ok(()));
        assert_eq!((s.load(0), s.load(1)), (0, slot_word(A, WRITE_COUNTER)));
        assert!(release(s, 0, 8, A, LockMode::Write));
        assert!((0..8).all(|i| s.load(i) == 0));
    }

    #[test]
    fn release_node_passes_on_every_lock_of_a_failed_node() {
        let t = LockTable::with_bytes(1 << 16);
        for k in 0..50 {
            t.acquire(k, LockMode::Write, k, 7).unwrap();
        }
        for k in 50..80 {
            t.acquire(k, LockMode::Read, k, 8).unwrap();
            t.acquire(k, LockMode::Read, k, 7).unwrap();
        }
        assert_eq!(t.release_node(7), 80);
        assert_eq!(t.release_node(7), 0);
        for k in 0..50 {
            t.acquire(k, LockMode::Write, 1000 + k, 9).unwrap();
        }
        for k in 50..80 {
            assert_eq!(
                t.holders(k),
                [Holder {
                    txn: k,
                    node: 8,
                    incarnation: 0,
                    mode: LockMode::Read
                }]
            );
        }
    }

    #[test]
    fn a_restarted_nodes_locks_survive_the_release_of_its_predecessor_which_is_refused() {
        let t = LockTable::with_bytes(1 << 16);
        // Node 7, incarnation 1, holds key 1; it restarts as incarnation 2 and locks key 2
        // with the same transaction id (ids restart with the process).
        t.acquire_inc(1, LockMode::Write, 5, 7, 1).unwrap();
        t.acquire_inc(2, LockMode::Write, 5, 7, 2).unwrap();
        // The predecessor (a zombie) is refused: it can neither lock nor unlock.
        assert_eq!(
            t.acquire_inc(3, LockMode::Write, 6, 7, 1),
            Err(Refusal::StaleIncarnation)
        );
        assert_eq!(t.release_inc(1, 5, 7, 1), Err(Refusal::StaleIncarnation));
        assert_eq!(t.holders(3), []);
        // A late cleanup of the predecessor releases only its lock.
        assert_eq!(t.release_incarnation(7, 1), 1);
        assert_eq!(t.holders(1), []);
        assert_eq!(t.holders(2).len(), 1, "the live incarnation's lock stays");
        assert_eq!(t.release_inc(2, 5, 7, 2), Ok(true));
        assert_eq!(t.slots_in_use(), 0);
    }

    #[test]
    fn colliding_fingerprints_share_a_slot_and_only_add_conflicts() {
        // Two keys forced onto one fingerprint in one bucket.
        let s = bucket();
        let s = &*s;
        acquire(s, 0, 8, 42, LockMode::Read).unwrap(); // key A
        acquire(s, 0, 8, 42, LockMode::Read).unwrap(); // key B, same fingerprint
        assert_eq!(
            acquire(s, 0, 8, 42, LockMode::Write),
            Err(Refusal::Conflict)
        );
        release(s, 0, 8, 42, LockMode::Read);
        assert_eq!(s.load(0), slot_word(42, 2), "B still counted");
        // Across threads: write locks on colliding keys exclude each other.
        let t = std::sync::Arc::new(LockTable::with_bytes(64));
        let (fa, ba) = t.place(1);
        let other = (2..u64::MAX).find(|&k| t.place(k).1 == ba).unwrap();
        assert_ne!(t.place(other).0, fa, "distinct fingerprints in one bucket");
        t.acquire(1, LockMode::Write, 1, 1).unwrap();
        t.acquire(other, LockMode::Write, 2, 1).unwrap();
        assert_eq!(t.slots_in_use(), 2);
    }

    #[test]
    fn threads_hammering_one_bucket_keep_mutual_exclusion() {
        use std::sync::atomic::AtomicUsize;
        let t = std::sync::Arc::new(LockTable::with_bytes(64)); // one bucket
        assert_eq!(t.n_buckets(), 1);
        let inside: std::sync::Arc<Vec<AtomicUsize>> =
            std::sync::Arc::new((0..12).map(|_| AtomicUsize::new(0)).collect());
        std::thread::scope(|sc| {
            for th in 0..4u64 {
                let (t, inside) = (t.clone(), inside.clone());
                sc.spawn(move || {
                    for i in 0..20_000u64 {
                        let key = (i * 7 + th) % 12;
                        let mode = if i % 3 == 0 {
                            LockMode::Write
                        } else {
                            LockMode::Read
                        };
                        if t.acquire(key, mode, i, th as u32).is_ok() {
                            let n = inside[key as usize].fetch_add(
                                if mode == LockMode::Write { 1000 } else { 1 },
                                Ordering::SeqCst,
                            );
                            // Readers count 1 each, a writer 1000: more than 1000 means a
                            // writer overlapped with anyone.
                            let now = n + if mode == LockMode::Write { 1000 } else { 1 };
                            assert!(now <= 1000, "key {key}: {now}");
                            inside[key as usize].fetch_sub(
                                if mode == LockMode::Write { 1000 } else { 1 },
                                Ordering::SeqCst,
                            );
                            assert!(t.release(key, i, th as u32));
                        }
                    }
                });
            }
        });
        assert_eq!(t.slots_in_use(), 0);
    }

    /// What runs between two loads of the acquirer under test.
    type Between<'a> = Box<dyn FnOnce(&[AtomicU64]) + 'a>;

    /// Slots whose first load by the thread under test runs `between` first: a hand-
    /// driven interleaving.
    struct Interposed<'a> {
        slots: &'a [AtomicU64],
        loads: std::cell::Cell<usize>,
        between: std::cell::RefCell<Option<Between<'a>>>,
    }
    impl SlotWords for Interposed<'_> {
        fn load(&self, i: usize) -> u64 {
            let v = self.slots.load(i);
            self.loads.set(self.loads.get() + 1);
            if self.loads.get() == 1 {
                if let Some(f) = self.between.borrow_mut().take() {
                    f(self.slots);
                }
            }
            v
        }
        fn compare_exchange(&self, i: usize, c: u64, n: u64) -> Result<u64, u64> {
            self.slots.compare_exchange(i, c, n)
        }
    }

    const A: u64 = 0xA;
    const B: u64 = 0xB;

    /// The race of the module docs, driven by hand: slot 0 holds B's write lock and
    /// slot 1 A's read lock (holder R1). The writer W of A loads slot 0 (B); then B is
    /// released, R1 releases A, and a new reader R2 acquires A (slot 0 is now the first
    /// free one); then W loads slot 1, finds it free and takes it. Returns (W got it,
    /// R2 got it).
    fn hand_driven_race(check: bool) -> (bool, bool) {
        let slots = [
            AtomicU64::new(slot_word(B, WRITE_COUNTER)),
            AtomicU64::new(slot_word(A, 2)),
        ];
        let r2 = std::cell::Cell::new(false);
        let w = Interposed {
            slots: &slots,
            loads: std::cell::Cell::new(0),
            between: std::cell::RefCell::new(Some(Box::new(|s: &[AtomicU64]| {
                assert!(release(s, 0, 2, B, LockMode::Write));
                assert!(release(s, 0, 2, A, LockMode::Read));
                r2.set(acquire_inner(s, 0, 2, A, LockMode::Read, check).is_ok());
            }))),
        };
        let w_ok = acquire_inner(&w, 0, 2, A, LockMode::Write, check).is_ok();
        (w_ok, r2.get())
    }

    #[test]
    fn the_bucket_scan_race_by_hand() {
        // Algorithm 1 as printed: both hold A, a reader and a writer.
        assert_eq!(hand_driven_race(false), (true, true));
        // With publish-then-check the writer finds R2's slot after its CAS and backs off.
        assert_eq!(hand_driven_race(true), (false, true));
    }

    /// Under loom: two acquirers of A (a reader and a writer) and a thread releasing B
    /// then R1's read lock of A, over every interleaving loom explores. Never both.
    #[test]
    fn loom_readers_and_writer_of_one_key_exclude_each_other() {
        use loom::sync::atomic::AtomicU64 as LoomU64;
        use loom::sync::Arc;

        struct Slots(Vec<LoomU64>);
        impl SlotWords for Slots {
            fn load(&self, i: usize) -> u64 {
                self.0[i].load(Ordering::SeqCst)
            }
            fn compare_exchange(&self, i: usize, c: u64, n: u64) -> Result<u64, u64> {
                self.0[i].compare_exchange(c, n, Ordering::SeqCst, Ordering::SeqCst)
            }
        }
        loom::model(|| {
            let s = Arc::new(Slots(vec![
                LoomU64::new(slot_word(B, WRITE_COUNTER)),
                LoomU64::new(slot_word(A, 2)),
            ]));
            let s1 = s.clone();
            let rel = loom::thread::spawn(move || {
                assert!(release(&*s1, 0, 2, B, LockMode::Write));
                assert!(release(&*s1, 0, 2, A, LockMode::Read));
            });
            let s2 = s.clone();
            let r2 = loom::thread::spawn(move || acquire(&*s2, 0, 2, A, LockMode::Read).is_ok());
            let w = acquire(&*s, 0, 2, A, LockMode::Write).is_ok();
            let r = r2.join().unwrap();
            rel.join().unwrap();
            assert!(!(w && r), "writer and reader of A both hold it");
            // Whatever won holds exactly its own slot; nothing leaked.
            let held: Vec<u64> = (0..2).map(|i| s.load(i)).filter(|&x| x != 0).collect();
            match (w, r) {
                (true, false) => assert_eq!(held, [slot_word(A, WRITE_COUNTER)]),
                (false, true) => assert_eq!(held, [slot_word(A, 2)]),
                _ => assert!(held.is_empty(), "{held:x?}"),
            }
        });
    }

    /// Under loom: the only reader of A (slot 1) upgrades while a second reader of A
    /// joins and a third thread releases B (slot 0, then free): exactly one of the
    /// upgrade and the second read succeeds, and the slot shows which.
    #[test]
    fn loom_an_upgrade_and_a_second_reader_exclude_each_other() {
        use loom::sync::atomic::AtomicU64 as LoomU64;
        use loom::sync::Arc;

        struct Slots(Vec<LoomU64>);
        impl SlotWords for Slots {
            fn load(&self, i: usize) -> u64 {
                self.0[i].load(Ordering::SeqCst)
            }
            fn compare_exchange(&self, i: usize, c: u64, n: u64) -> Result<u64, u64> {
                self.0[i].compare_exchange(c, n, Ordering::SeqCst, Ordering::SeqCst)
            }
        }
        loom::model(|| {
            let s = Arc::new(Slots(vec![
                LoomU64::new(slot_word(B, WRITE_COUNTER)),
                LoomU64::new(slot_word(A, 2)),
            ]));
            let s1 = s.clone();
            let rel = loom::thread::spawn(move || {
                assert!(release(&*s1, 0, 2, B, LockMode::Write));
            });
            let s2 = s.clone();
            let r2 = loom::thread::spawn(move || acquire(&*s2, 0, 2, A, LockMode::Read).is_ok());
            let u = upgrade(&*s, 0, 2, A);
            let r = r2.join().unwrap();
            rel.join().unwrap();
            let held: Vec<u64> = (0..2).map(|i| s.load(i)).filter(|&x| x != 0).collect();
            match (u, r) {
                (Ok(()), false) => assert_eq!(held, [slot_word(A, WRITE_COUNTER)]),
                (Err(Refusal::NoUpgrade), true) => assert_eq!(held, [slot_word(A, 4)]),
                other => panic!("upgrade and second reader: {other:?}, slots {held:x?}"),
            }
        });
    }
}
