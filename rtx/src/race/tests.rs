//! Tests of the hash table over [`LocalMem`]: random operations of both variants against a
//! `HashMap` oracle across many rehashes, concurrent clients interleaved at every
//! one-sided operation, clients crashed inside a rehash rTX and repaired by others, the
//! Optimal baseline's dead spinlock holder blocking others, planted bugs caught by the
//! checker, and the rehash cost in one-sided operations.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use futures::executor::{block_on, LocalPool};
use futures::task::LocalSpawnExt;

use super::check::{check_quiescent, check_table, CheckError};
use super::cost::rehash_ops;
use super::optimal::Optimal;
use super::{first_free_obj, format_table, Race, RaceError};
use crate::client::CrashPoint;
use crate::error::RtxError;
use crate::layout::Layout;
use crate::lease::ManualClock;
use crate::mem::{LocalMem, Mem, MemError, OnRead};
use crate::{Client, Config};

const T0: u64 = 1_800_000_000_000;
const PER_HANDLE: u64 = 700;

fn layout(block_bytes: u64) -> Layout {
    Layout {
        ids: 8,
        max_entries: 8,
        objects: 4096,
        block_bytes,
        blocks: 64 * 160,
        reclaim_slots: 64,
    }
}

fn region(l: &Layout, depth: u8) -> LocalMem {
    let m = LocalMem::new(l.total_bytes() as usize);
    block_on(format_table(l, &m, 7, depth)).unwrap();
    m
}

fn client(l: &Layout, id: u16, clock: &ManualClock) -> Client<ManualClock> {
    let mut c = Client::new(*l, id, 2, clock.clone(), Config::default());
    c.allocator().min_reuse_ms = 0;
    c
}

/// Handle `i`'s object range.
fn objs(i: u64) -> std::ops::Range<u64> {
    let s = first_free_obj(1);
    s + PER_HANDLE * i..s + PER_HANDLE * (i + 1)
}

fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Either variant, behind one interface for the shared tests.
enum Handle {
    Rtx(Race, Box<Client<ManualClock>>),
    Opt(Optimal),
}

impl Handle {
    fn new(rtx: bool, l: &Layout, i: u64, clock: &ManualClock) -> Self {
        if rtx {
            Handle::Rtx(
                Race::new(*l, objs(i)).unwrap(),
                Box::new(client(l, i as u16, clock)),
            )
        } else {
            Handle::Opt(Optimal::new(*l, i as u16, objs(i)).unwrap())
        }
    }
    async fn get<M: Mem>(&mut self, m: &M, k: u64) -> Result<Option<u64>, RaceError> {
        match self {
            Handle::Rtx(t, c) => t.get(c, m, k).await,
            Handle::Opt(o) => o.get(m, k).await,
        }
    }
    async fn insert<M: Mem>(&mut self, m: &M, k: u64, v: u64) -> Result<Option<u64>, RaceError> {
        match self {
            Handle::Rtx(t, c) => t.insert(c, m, k, v).await,
            Handle::Opt(o) => o.insert(m, k, v).await,
        }
    }
    async fn update<M: Mem>(&mut self, m: &M, k: u64, v: u64) -> Result<Option<u64>, RaceError> {
        match self {
            Handle::Rtx(t, c) => t.update(c, m, k, v).await,
            Handle::Opt(o) => o.update(m, k, v).await,
        }
    }
    async fn delete<M: Mem>(&mut self, m: &M, k: u64) -> Result<Option<u64>, RaceError> {
        match self {
            Handle::Rtx(t, c) => t.delete(c, m, k).await,
            Handle::Opt(o) => o.delete(m, k).await,
        }
    }
    fn set_record_reuse_ms(&mut self, ms: u64) {
        match self {
            Handle::Rtx(t, _) => t.set_record_reuse_ms(ms),
            Handle::Opt(o) => o.set_record_reuse_ms(ms),
        }
    }
    fn stats(&self) -> super::RaceStats {
        match self {
            Handle::Rtx(t, _) => t.stats(),
            Handle::Opt(o) => o.stats(),
        }
    }
}

/// Random inserts, updates, deletes and gets by one handle, each checked against a
/// `HashMap`; the checker and the oracle agree at the end, after many rehashes. The
/// records that updates and deletes replace are reused at once (one handle: no other
/// reader can be on them), so every value read back also checks the reclamation.
fn oracle_run(rtx: bool, block_bytes: u64, ops: usize, key_space: u64, seed: u64) {
    let l = layout(block_bytes);
    let m = region(&l, 1);
    let clock = ManualClock::new(T0);
    let mut h = Handle::new(rtx, &l, 0, &clock);
    h.set_record_reuse_ms(0);
    let mut oracle = HashMap::new();
    let mut x = seed;
    block_on(async {
        for i in 0..ops {
            let k = next(&mut x) % key_space;
            match next(&mut x) % 10 {
                0..=4 => {
                    let v = next(&mut x);
                    assert_eq!(
                        h.insert(&m, k, v).await.unwrap(),
                        oracle.insert(k, v),
                        "insert {k}"
                    );
                }
                5 => {
                    let v = next(&mut x);
                    let want = oracle.get(&k).copied();
                    if want.is_some() {
                        oracle.insert(k, v);
                    }
                    assert_eq!(h.update(&m, k, v).await.unwrap(), want, "update {k}");
                }
                6 => assert_eq!(
                    h.delete(&m, k).await.unwrap(),
                    oracle.remove(&k),
                    "delete {k}"
                ),
                _ => assert_eq!(
                    h.get(&m, k).await.unwrap(),
                    oracle.get(&k).copied(),
                    "get {k}"
                ),
            }
            if i % 700 == 0 {
                assert_eq!(check_table(&m, &l).await.unwrap().len(), oracle.len());
            }
        }
        let mut want: Vec<(u64, u64)> = oracle.into_iter().collect();
        want.sort();
        assert_eq!(check_table(&m, &l).await.unwrap(), want);
        check_quiescent(&m, &l).await.unwrap();
    });
    let s = h.stats();
    assert!(s.rehashes >= 8, "{s:?}");
    assert!(s.records_reused > ops as u64 / 10, "{s:?}");
}

/// Updates of one key, each replacing the record before: with the default wait the
/// replaced records are held (none reused within it), and reused after it, so the
/// table's record space stays bounded; the value is right throughout.
#[test]
fn replaced_records_are_reused_only_after_the_wait() {
    for rtx in [true, false] {
        let l = layout(4096);
        let m = region(&l, 1);
        let clock = ManualClock::new(T0);
        let mut h = Handle::new(rtx, &l, 0, &clock);
        block_on(async {
            h.insert(&m, 5, 0).await.unwrap();
            for v in 1..=50 {
                assert_eq!(h.insert(&m, 5, v).await.unwrap(), Some(v - 1));
            }
            let s = h.stats();
            assert_eq!((s.records_reused, s.records_retired), (0, 50), "{s:?}");
            std::thread::sleep(std::time::Duration::from_millis(
                crate::alloc::MIN_REUSE_MS + 20,
            ));
            for v in 51..=100 {
                assert_eq!(h.insert(&m, 5, v).await.unwrap(), Some(v - 1));
            }
            assert_eq!(h.get(&m, 5).await.unwrap(), Some(100));
            assert_eq!(h.delete(&m, 5).await.unwrap(), Some(100));
            let s = h.stats();
            assert_eq!(s.records_reused, 50, "rtx {rtx}: {s:?}");
            assert_eq!(s.records_retired, 51, "rtx {rtx}: {s:?}");
            check_quiescent(&m, &l).await.unwrap();
        });
    }
}

/// A record READ that comes too long after its slot READ (the record may have been
/// reclaimed and rewritten meanwhile) is discarded and the operation run again.
#[test]
fn a_record_read_long_after_its_slot_is_run_again() {
    for rtx in [true, false] {
        let l = layout(4096);
        let m = region(&l, 1);
        let clock = ManualClock::new(T0);
        let mut h = Handle::new(rtx, &l, 0, &clock);
        block_on(h.insert(&m, 9, 90)).unwrap();
        // Records live past the table's subtables, in the handle's object range.
        let from = l.obj_addr(objs(0).start);
        let from = block_on(super::records::block_addr_of(&m, &l, from))
            .unwrap()
            .unwrap();
        // A reader descheduled (a real sleep) before its first record READ, which is a
        // 16-byte READ at or past `from`.
        let stalled = Cell::new(false);
        let s = OnRead {
            inner: m.clone(),
            before: |off: u64, len: usize| {
                if len == 16 && off >= from && !stalled.replace(true) {
                    std::thread::sleep(
                        super::records::STALE_READ + std::time::Duration::from_millis(5),
                    );
                }
            },
        };
        assert_eq!(block_on(h.get(&s, 9)).unwrap(), Some(90));
        assert!(stalled.get());
        assert_eq!(h.stats().stale_reads, 1, "rtx {rtx}");
    }
}

#[test]
fn rtx_random_ops_match_a_hashmap_across_rehashes() {
    oracle_run(true, 512, 5000, 900, 0x9E37_79B9_7F4A_7C15);
}

#[test]
fn rtx_one_kilobyte_subtables_match_a_hashmap() {
    oracle_run(true, 1024, 6000, 2500, 0x1234_5678_9ABC_DEF1);
}

#[test]
fn optimal_random_ops_match_a_hashmap_across_rehashes() {
    oracle_run(false, 512, 5000, 900, 0x0F0F_1234_5678_4321);
}

#[test]
fn a_full_table_at_the_largest_depth_is_an_error() {
    let l = layout(128); // 2 buckets, directory of 15 entries: depth <= 3
    let m = region(&l, 0);
    let clock = ManualClock::new(T0);
    let mut c = client(&l, 0, &clock);
    let mut t = Race::new(l, objs(0)).unwrap();
    let r = block_on(async {
        for k in 0..10_000 {
            t.insert(&mut c, &m, k, k).await?;
        }
        Ok::<_, RaceError>(())
    });
    assert!(matches!(r, Err(RaceError::TableFull { depth: 3 })), "{r:?}");
    let all = block_on(check_table(&m, &l)).unwrap();
    assert!(all.len() > 20 && all.iter().all(|&(k, v)| k == v));
    block_on(check_quiescent(&m, &l)).unwrap();
}

#[test]
fn bad_geometry_and_ranges_are_errors() {
    assert!(matches!(
        Race::new(layout(96), objs(0)),
        Err(RaceError::Geometry(_))
    ));
    assert!(matches!(
        Race::new(layout(512), 0..10),
        Err(RaceError::Format(_))
    ));
    let small_logs = Layout {
        max_entries: 2,
        ..layout(512)
    };
    assert!(matches!(
        Race::new(small_logs, objs(0)),
        Err(RaceError::Format(_))
    ));
    let l = layout(512);
    let m = LocalMem::new(l.total_bytes() as usize);
    assert!(matches!(
        block_on(format_table(&l, &m, 7, 9)),
        Err(RaceError::Format(_))
    ));
}

/// A memory that yields to the executor before some one-sided operations (chosen by a
/// shared xorshift), so several clients interleave at operation granularity.
#[derive(Clone)]
struct YieldMem {
    inner: LocalMem,
    rng: Rc<Cell<u64>>,
}

struct YieldNow(bool);

impl Future for YieldNow {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl YieldMem {
    fn pause(&self) -> YieldNow {
        let mut x = self.rng.get();
        let r = next(&mut x);
        self.rng.set(x);
        YieldNow(!r.is_multiple_of(3))
    }
}

impl Mem for YieldMem {
    async fn read(&self, off: u64, len: usize) -> Result<Vec<u8>, MemError> {
        self.pause().await;
        self.inner.read(off, len).await
    }
    async fn write(&self, off: u64, data: &[u8]) -> Result<(), MemError> {
        self.pause().await;
        self.inner.write(off, data).await
    }
    async fn cas(&self, off: u64, expected: u64, new: u64) -> Result<u64, MemError> {
        self.pause().await;
        self.inner.cas(off, expected, new).await
    }
}

/// Clients insert disjoint keys (forcing rehashes while others run) and update, delete and
/// read a shared set of preloaded keys, interleaved at every one-sided operation. Every
/// acknowledged insert is found once with its value; each shared key holds a value some
/// client wrote (or is absent if its last acknowledged operation was a delete by the
/// only writer); the table checks and nothing stays locked.
fn concurrent_run(rtx: bool, seed: u64) {
    const CLIENTS: u64 = 4;
    const PER: u64 = 150;
    let l = layout(512);
    let base = region(&l, 0);
    let m = YieldMem {
        inner: base.clone(),
        rng: Rc::new(Cell::new(seed)),
    };
    let clock = ManualClock::new(T0);
    // Shared keys, preloaded by one handle before the run.
    let shared: Vec<u64> = (0..40).map(|k| 1_000_000 + k).collect();
    let mut loader = Handle::new(rtx, &l, CLIENTS, &clock);
    block_on(async {
        for &k in &shared {
            loader.insert(&base, k, 0).await.unwrap();
        }
    });
    let acked: Rc<RefCell<Vec<(u64, u64)>>> = Rc::default();
    let written: Rc<RefCell<BTreeMap<u64, Vec<u64>>>> = Rc::default();
    let stats: Rc<RefCell<Vec<super::RaceStats>>> = Rc::default();
    let mut pool = LocalPool::new();
    for i in 0..CLIENTS {
        let (m, acked, written, stats, shared) = (
            m.clone(),
            acked.clone(),
            written.clone(),
            stats.clone(),
            shared.clone(),
        );
        let mut h = Handle::new(rtx, &l, i, &clock);
        pool.spawner()
            .spawn_local(async move {
                let mut x = 99 + i;
                for j in 0..PER {
                    let k = i * 10_000 + j;
                    let v = i << 32 | j;
                    assert_eq!(h.insert(&m, k, v).await.unwrap(), None);
                    acked.borrow_mut().push((k, v));
                    let s = shared[(next(&mut x) % shared.len() as u64) as usize];
                    let w = i << 32 | 1 << 31 | j;
                    written.borrow_mut().entry(s).or_default().push(w);
                    h.update(&m, s, w).await.unwrap();
                    let got = h.get(&m, s).await.unwrap();
                    assert!(got.is_some(), "shared key {s} vanished");
                    // Overlapping fresh keys: every client inserts the same ones.
                    let o = 2_000_000 + j;
                    let ov = i << 32 | 1 << 30 | j;
                    written.borrow_mut().entry(o).or_default().push(ov);
                    h.insert(&m, o, ov).await.unwrap();
                    if j % 7 == 0 {
                        let back = h.get(&m, i * 10_000 + j / 2).await.unwrap();
                        assert_eq!(back, Some((i << 32) | (j / 2)));
                    }
                }
                stats.borrow_mut().push(h.stats());
            })
            .unwrap();
    }
    pool.run();
    let stats = stats.borrow();
    assert_eq!(stats.len(), CLIENTS as usize, "a client panicked");
    let rehashes: u64 = stats.iter().map(|s| s.rehashes).sum();
    let conflicts: u64 = stats
        .iter()
        .map(|s| s.waits + s.redos + s.cas_failures + s.rehash_aborts + s.duplicates)
        .sum();
    assert!(rehashes >= 6, "{stats:?}");
    assert!(
        conflicts > 0,
        "the clients never met: the test shows nothing: {stats:?}"
    );
    let all = block_on(check_table(&base, &l)).unwrap();
    block_on(check_quiescent(&base, &l)).unwrap();
    let found: BTreeMap<u64, u64> = all.iter().copied().collect();
    for &(k, v) in acked.borrow().iter() {
        assert_eq!(found.get(&k), Some(&v), "acknowledged key {k}");
    }
    let written = written.borrow();
    for j in 0..PER {
        let o = 2_000_000 + j;
        let got = found.get(&o).copied();
        assert!(
            got.is_some_and(|g| written[&o].contains(&g)),
            "overlapping key {o} holds {got:?}"
        );
    }
    for &s in &shared {
        let got = found[&s];
        assert!(
            got == 0 || written.get(&s).is_some_and(|w| w.contains(&got)),
            "shared key {s} holds {got}, never written"
        );
    }
    assert_eq!(found.len(), (CLIENTS * PER + PER) as usize + shared.len());
}

#[test]
fn rtx_concurrent_clients_with_rehashes_keep_every_acknowledged_key() {
    concurrent_run(true, 0xDEAD_BEEF);
    concurrent_run(true, 0x5EED_0001);
}

#[test]
fn optimal_concurrent_clients_with_rehashes_keep_every_acknowledged_key() {
    concurrent_run(false, 0xDEAD_BEEF);
    concurrent_run(false, 0x5EED_0002);
}

/// Client A crashes at `at` inside the rehash rTX its insert triggers; after its lease
/// expires, client B's operations repair it. Afterwards every key A had acknowledged is
/// found exactly once with its value, B's inserts too, the table checks, and nothing
/// stays locked or unfinished.
fn crash_in_rehash(at: CrashPoint) {
    let l = layout(512);
    let m = region(&l, 0);
    let clock = ManualClock::new(T0);
    let mut a = client(&l, 0, &clock);
    let mut ta = Race::new(l, objs(0)).unwrap();
    let mut b = client(&l, 1, &clock);
    let mut tb = Race::new(l, objs(1)).unwrap();
    block_on(async {
        let mut acked = Vec::new();
        for k in 0..30 {
            ta.insert(&mut a, &m, k, k + 1).await.unwrap();
            acked.push(k);
        }
        a.crash = Some(at);
        let mut k = 30;
        let crashed = loop {
            match ta.insert(&mut a, &m, k, k + 1).await {
                Ok(_) => acked.push(k),
                Err(RaceError::Rtx(RtxError::Mem(MemError::Crashed))) => break k,
                Err(e) => panic!("{e:?}"),
            }
            k += 1;
        };
        assert!(
            check_quiescent(&m, &l).await.is_err(),
            "the crash left nothing held"
        );
        // While A's lease is valid, B waits (bounded here) instead of repairing.
        tb.max_attempts = 50;
        let r = tb.insert(&mut b, &m, crashed, 7).await;
        assert!(matches!(r, Err(RaceError::Retries(50))), "{r:?}");
        tb.max_attempts = super::MAX_ATTEMPTS;
        clock.advance(60_000);
        for &k in &acked {
            assert_eq!(tb.get(&mut b, &m, k).await.unwrap(), Some(k + 1), "key {k}");
        }
        assert!(tb.stats().repairs >= 1, "{:?}", tb.stats());
        for k in 1000..1200 {
            tb.insert(&mut b, &m, k, k).await.unwrap();
        }
        let all = check_table(&m, &l).await.unwrap();
        let mut want: Vec<(u64, u64)> = acked.iter().map(|&k| (k, k + 1)).collect();
        want.extend((1000..1200).map(|k| (k, k)));
        want.sort();
        assert_eq!(all, want);
        check_quiescent(&m, &l).await.unwrap();
    });
}

#[test]
fn crash_after_the_rehash_log_is_aborted_by_repair() {
    crash_in_rehash(CrashPoint::LogWritten);
}

#[test]
fn crash_with_the_rehash_locked_is_aborted_by_repair() {
    crash_in_rehash(CrashPoint::Locked);
}

#[test]
fn crash_in_doing_is_rolled_forward_by_repair() {
    crash_in_rehash(CrashPoint::InDoing);
}

#[test]
fn crash_after_installing_the_rehash_is_finished_by_repair() {
    crash_in_rehash(CrashPoint::Installed);
}

/// Planted bug: a rehash that leaves the moved slots in the old subtable too. Lookups
/// still work (the new subtable has them), but the checker finds keys in a subtable their
/// hash does not select.
#[test]
fn a_rehash_that_keeps_moved_keys_is_caught_by_the_checker() {
    let l = layout(512);
    let m = region(&l, 0);
    let clock = ManualClock::new(T0);
    let mut c = client(&l, 0, &clock);
    let mut t = Race::new(l, objs(0)).unwrap();
    t.planted_keep_moved = true;
    block_on(async {
        for k in 0..100 {
            t.insert(&mut c, &m, k, k).await.unwrap();
        }
        assert!(t.stats().rehashes >= 1);
        for k in 0..100 {
            assert_eq!(t.get(&mut c, &m, k).await.unwrap(), Some(k));
        }
        let r = check_table(&m, &l).await;
        assert!(
            matches!(&r, Err(CheckError::Broken(s)) if s.contains("does not select")),
            "{r:?}"
        );
    });
}

/// The Optimal baseline's point of comparison (C.10 test 6): a client that dies
/// mid-rehash leaves the subtables locked, and another client's operations on them make
/// no progress within a bounded number of retries, where the rTX table repairs.
#[test]
fn optimal_dead_rehash_holder_blocks_other_clients() {
    let l = layout(512);
    let m = region(&l, 0);
    let mut a = Optimal::new(l, 0, objs(0)).unwrap();
    let mut b = Optimal::new(l, 1, objs(1)).unwrap();
    a.crash_after_moves = Some(2);
    block_on(async {
        let mut acked = Vec::new();
        let mut k = 0;
        loop {
            match a.insert(&m, k, k).await {
                Ok(_) => acked.push(k),
                Err(RaceError::Mem(MemError::Crashed)) => break,
                Err(e) => panic!("{e:?}"),
            }
            k += 1;
        }
        b.max_attempts = 200;
        let mut blocked = 0;
        for &k in &acked {
            match b.get(&m, k).await {
                Ok(v) => assert_eq!(v, Some(k)),
                Err(RaceError::Retries(200)) => blocked += 1,
                Err(e) => panic!("{e:?}"),
            }
        }
        assert!(blocked > 0, "no operation met the dead holder's lock");
        assert!(check_quiescent(&m, &l).await.is_err());
    });
}

/// The rehash cost in one-sided operations (6, Fig. 15): the rTX rehash is a fixed
/// number of operations on whole blocks, the original 2 CASes per moved key; at 1 KB
/// subtables and more the rTX rehash takes at least 3x fewer operations.
#[test]
fn rtx_rehash_takes_fewer_operations_than_the_original() {
    for (bb, keys) in [(512u64, 40usize), (1024, 80), (4096, 320)] {
        let r = rehash_ops(bb, keys).unwrap();
        println!(
            "{bb}-B subtable, {keys} keys, {} moved: rTX {:?} ({} ops), original {:?} ({} ops)",
            r.moved,
            r.rtx,
            r.rtx.total(),
            r.optimal,
            r.optimal.total()
        );
        assert!(r.moved as usize > keys / 4, "{r:?}");
        assert!(r.rtx.total() < r.optimal.total(), "{r:?}");
        if bb >= 1024 {
            assert!(3 * r.rtx.total() <= r.optimal.total(), "{r:?}");
        }
    }
    assert!(matches!(rehash_ops(512, 57), Err(RaceError::Format(_))));
}

/// A memory that, at the first CAS into an empty slot, first lands another client's
/// insert of `key` (a record and a slot in the key's other bucket), as a concurrent
/// insert of the same key into a different empty slot would.
struct RacingInsert {
    inner: LocalMem,
    layout: Layout,
    key: u64,
    val: u64,
    /// Where the other client's record goes (an unused object's block).
    scratch: u64,
    armed: Cell<bool>,
}

impl Mem for RacingInsert {
    async fn read(&self, off: u64, len: usize) -> Result<Vec<u8>, MemError> {
        self.inner.read(off, len).await
    }
    async fn write(&self, off: u64, data: &[u8]) -> Result<(), MemError> {
        self.inner.write(off, data).await
    }
    async fn cas(&self, off: u64, expected: u64, new: u64) -> Result<u64, MemError> {
        if expected == 0 && off >= self.layout.data_base() && self.armed.replace(false) {
            let g = super::table::Geometry::new(self.layout.block_bytes).unwrap();
            let bb = self.layout.block_bytes;
            let base = off - (off - self.layout.data_base()) % bb;
            let h = super::table::KeyHash::new(self.key, g.buckets);
            let mine = ((off - base) / super::table::BUCKET_BYTES) as usize;
            let other = h.buckets.into_iter().find(|&b| b != mine).unwrap();
            let j = (0..super::table::SLOTS)
                .find(|&j| self.inner.word(base + g.slot_off(other, j)) == 0)
                .unwrap();
            self.inner
                .write_now(self.scratch, &super::table::record(self.key, self.val))?;
            let w = h.slot(super::table::rec_index(self.scratch));
            self.inner.set_word(base + g.slot_off(other, j), w);
        }
        self.inner.cas(off, expected, new).await
    }
}

/// Two inserts of one new key landing in different empty slots: the inserter that sees
/// the other copy removes its own and updates that one, so the key is found once.
#[test]
fn concurrent_inserts_of_one_key_leave_one_copy() {
    for rtx in [true, false] {
        let l = layout(512);
        let inner = region(&l, 1);
        let scratch = l.block_addr(objs(5).start) + 16;
        let m = RacingInsert {
            inner: inner.clone(),
            layout: l,
            key: 4242,
            val: 1,
            scratch,
            armed: Cell::new(false),
        };
        let clock = ManualClock::new(T0);
        let mut h = Handle::new(rtx, &l, 0, &clock);
        block_on(async {
            for k in 0..20 {
                h.insert(&m, k, k).await.unwrap();
            }
            m.armed.set(true);
            assert_eq!(h.insert(&m, 4242, 2).await.unwrap(), Some(1), "rtx {rtx}");
            assert!(!m.armed.get());
            assert_eq!(h.stats().duplicates, 1);
            assert_eq!(h.get(&m, 4242).await.unwrap(), Some(2));
            let all = check_table(&inner, &l).await.unwrap();
            assert_eq!(all.len(), 21);
            assert!(all.contains(&(4242, 2)));
            check_quiescent(&inner, &l).await.unwrap();
        });
    }
}

/// Per-operation cost with the directory cached: the rTX table READs the subtable's
/// TXObj before and after (the paper's "two READs"), where Optimal READs the lock word in
/// the bucket round and the bucket header after a CAS: one READ more for a get, the same
/// for an update or delete, and the same CASes.
#[test]
fn per_operation_cost_of_each_variant() {
    use super::cost::{CountMem, OpCount};
    let mut counts = Vec::new();
    for rtx in [true, false] {
        let l = layout(512);
        let m = CountMem {
            inner: region(&l, 1),
            n: Cell::new(OpCount::default()),
        };
        let clock = ManualClock::new(T0);
        let mut h = Handle::new(rtx, &l, 0, &clock);
        let c = block_on(async {
            for k in 0..20 {
                h.insert(&m, k, k).await.unwrap();
            }
            let mut per = Vec::new();
            let t0 = m.n.get();
            assert_eq!(h.get(&m, 7).await.unwrap(), Some(7));
            let t1 = m.n.get();
            assert_eq!(h.update(&m, 7, 70).await.unwrap(), Some(7));
            let t2 = m.n.get();
            assert_eq!(h.delete(&m, 7).await.unwrap(), Some(70));
            let t3 = m.n.get();
            for (a, b) in [(t0, t1), (t1, t2), (t2, t3)] {
                per.push((b.reads - a.reads, b.writes - a.writes, b.cas - a.cas));
            }
            per
        });
        counts.push(c);
    }
    let (r, o) = (&counts[0], &counts[1]);
    println!("(READ, WRITE, CAS) get/update/delete: rTX {r:?}, Optimal {o:?}");
    assert_eq!(r[0].0, o[0].0 + 1, "get");
    assert_eq!((r[1].0, r[1].2), (o[1].0, o[1].2), "update");
    assert_eq!((r[2].0, r[2].2), (o[2].0, o[2].2), "delete");
    assert_eq!(r[1].1, 1, "one record WRITE");
    assert_eq!(r[2].1, 0);
}
