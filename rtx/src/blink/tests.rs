//! Tests of the rTX B-link tree over [`LocalMem`]: random operations against a `BTreeMap`
//! oracle, concurrent clients interleaved at every one-sided operation, a planted split
//! bug caught by the checker, and clients crashed mid-split then repaired by others.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use futures::executor::{block_on, LocalPool};
use futures::task::LocalSpawnExt;

use super::check::{check_quiescent, check_tree, CheckError};
use super::{format_tree, Blink, FIRST_FREE_OBJ};
use crate::client::CrashPoint;
use crate::error::RtxError;
use crate::layout::Layout;
use crate::lease::ManualClock;
use crate::mem::{LocalMem, Mem, MemError};
use crate::{Client, Config};

const T0: u64 = 1_800_000_000_000;

pub(crate) fn layout(block_bytes: u64) -> Layout {
    Layout {
        ids: 8,
        max_entries: 16,
        objects: 2048,
        block_bytes,
        blocks: 64 * 256,
        reclaim_slots: 64,
    }
}

pub(crate) fn region(l: &Layout) -> LocalMem {
    let m = LocalMem::new(l.total_bytes() as usize);
    block_on(format_tree(l, &m, 7)).unwrap();
    m
}

pub(crate) fn client(l: &Layout, id: u16, clock: &ManualClock) -> Client<ManualClock> {
    let mut c = Client::new(*l, id, 2, clock.clone(), Config::default());
    c.allocator().min_reuse_ms = 0;
    c
}

/// Handle `i`'s object range (200 objects each).
pub(crate) fn objs(i: u64) -> std::ops::Range<u64> {
    FIRST_FREE_OBJ + 200 * i..FIRST_FREE_OBJ + 200 * (i + 1)
}

fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Random inserts, updates, deletes, lookups and scans by one client, each checked
/// against a `BTreeMap`; the tree checker and the oracle agree at the end.
fn oracle_run(block_bytes: u64, ops: usize, key_space: u64, seed: u64, pre_lock: bool) {
    let l = layout(block_bytes);
    let m = region(&l);
    let clock = ManualClock::new(T0);
    let mut c = client(&l, 0, &clock);
    let mut t = Blink::new(l, FIRST_FREE_OBJ..l.objects);
    t.pre_lock = pre_lock;
    let mut oracle = BTreeMap::new();
    let mut x = seed;
    block_on(async {
        for i in 0..ops {
            let k = next(&mut x) % key_space;
            match next(&mut x) % 10 {
                0..=4 => {
                    let v = next(&mut x);
                    let old = t.insert(&mut c, &m, k, v).await.unwrap();
                    assert_eq!(old, oracle.insert(k, v), "insert {k}");
                }
                5 | 6 => {
                    let old = t.delete(&mut c, &m, k).await.unwrap();
                    assert_eq!(old, oracle.remove(&k), "delete {k}");
                }
                7 | 8 => {
                    let got = t.lookup(&mut c, &m, k).await.unwrap();
                    assert_eq!(got, oracle.get(&k).copied(), "lookup {k}");
                }
                _ => {
                    let n = (next(&mut x) % 30) as usize;
                    let got = t.scan(&mut c, &m, k, n).await.unwrap();
                    let want: Vec<(u64, u64)> =
                        oracle.range(k..).take(n).map(|(a, b)| (*a, *b)).collect();
                    assert_eq!(got, want, "scan {k} {n}");
                }
            }
            if i % 500 == 0 {
                let all = check_tree(&m, &l).await.unwrap();
                assert_eq!(all.len(), oracle.len());
            }
        }
        let all = check_tree(&m, &l).await.unwrap();
        let want: Vec<(u64, u64)> = oracle.iter().map(|(a, b)| (*a, *b)).collect();
        assert_eq!(all, want);
        check_quiescent(&m, &l).await.unwrap();
    });
    let s = t.stats();
    assert!(s.splits > 10 && s.root_growths >= 2, "{s:?}");
}

#[test]
fn small_nodes_random_ops_match_a_btreemap() {
    oracle_run(128, 6000, 800, 0x9E37_79B9_7F4A_7C15, false);
}

#[test]
fn one_kilobyte_nodes_random_ops_match_a_btreemap() {
    oracle_run(1024, 12000, 1 << 40, 0x1234_5678_9ABC_DEF1, false);
}

#[test]
fn opt2_pre_locked_leaves_random_ops_match_a_btreemap() {
    oracle_run(128, 4000, 600, 0x0F0F_1234_5678_4321, true);
}

#[test]
fn single_leaf_updates_write_no_log_and_splits_are_logged() {
    let l = layout(128);
    let m = region(&l);
    let clock = ManualClock::new(T0);
    let mut c = client(&l, 0, &clock);
    let mut t = Blink::new(l, objs(0));
    block_on(async {
        for k in 0..5 {
            t.insert(&mut c, &m, k, k).await.unwrap();
        }
        t.insert(&mut c, &m, 3, 33).await.unwrap();
        t.delete(&mut c, &m, 4).await.unwrap();
        assert_eq!(c.stats().log_writes, 0, "Opt1: no log for one leaf");
        for k in 5..7 {
            t.insert(&mut c, &m, k, k).await.unwrap();
        }
        assert_eq!(c.stats().log_writes, 1, "the split is one logged rTX");
        assert_eq!(t.stats().root_growths, 1);
        assert_eq!(
            check_tree(&m, &l).await.unwrap(),
            vec![(0, 0), (1, 1), (2, 2), (3, 33), (5, 5), (6, 6)]
        );
    });
}

#[test]
fn a_split_that_forgets_the_sibling_link_is_caught_by_the_checker() {
    let l = layout(128);
    let m = region(&l);
    let clock = ManualClock::new(T0);
    let mut c = client(&l, 0, &clock);
    let mut t = Blink::new(l, objs(0));
    t.planted.no_sibling_link = true;
    block_on(async {
        for k in 0..40 {
            t.insert(&mut c, &m, k, k).await.unwrap();
        }
        let r = check_tree(&m, &l).await;
        assert!(matches!(r, Err(CheckError::Broken(_))), "{r:?}");
    });
    // The same run without the bug passes.
    let m = region(&l);
    let mut t = Blink::new(l, objs(0));
    block_on(async {
        for k in 0..40 {
            t.insert(&mut c, &m, k, k).await.unwrap();
        }
        assert_eq!(check_tree(&m, &l).await.unwrap().len(), 40);
    });
}

#[test]
fn a_split_that_skips_the_parent_is_caught_by_the_checker() {
    let l = layout(128);
    let m = region(&l);
    let clock = ManualClock::new(T0);
    let mut c = client(&l, 0, &clock);
    let mut t = Blink::new(l, objs(0));
    block_on(async {
        // Grow a root first, then split leaves without telling the parent.
        for k in 0..10 {
            t.insert(&mut c, &m, k, k).await.unwrap();
        }
        check_tree(&m, &l).await.unwrap();
        t.planted.no_parent_update = true;
        for k in 10..40 {
            t.insert(&mut c, &m, k, k).await.unwrap();
        }
        // Every key is still found (B-link: sideways), but the structure is broken.
        for k in 0..40 {
            assert_eq!(t.lookup(&mut c, &m, k).await.unwrap(), Some(k));
        }
        let r = check_tree(&m, &l).await;
        assert!(
            matches!(&r, Err(CheckError::Broken(s)) if s.contains("by parents")),
            "{r:?}"
        );
    });
}

/// A memory that counts one-sided operations, and round trips (an ordered list of WRITEs
/// is one).
struct CountMem {
    inner: LocalMem,
    reads: Cell<u64>,
    writes: Cell<u64>,
    cas: Cell<u64>,
    rounds: Cell<u64>,
}

impl CountMem {
    fn new(inner: LocalMem) -> Self {
        Self {
            inner,
            reads: Cell::new(0),
            writes: Cell::new(0),
            cas: Cell::new(0),
            rounds: Cell::new(0),
        }
    }

    fn bump(c: &Cell<u64>, by: u64) {
        c.set(c.get() + by);
    }
}

impl Mem for CountMem {
    async fn read(&self, off: u64, len: usize) -> Result<Vec<u8>, MemError> {
        Self::bump(&self.reads, 1);
        Self::bump(&self.rounds, 1);
        self.inner.read(off, len).await
    }
    async fn write(&self, off: u64, data: &[u8]) -> Result<(), MemError> {
        Self::bump(&self.writes, 1);
        Self::bump(&self.rounds, 1);
        self.inner.write(off, data).await
    }
    async fn cas(&self, off: u64, expected: u64, new: u64) -> Result<u64, MemError> {
        Self::bump(&self.cas, 1);
        Self::bump(&self.rounds, 1);
        self.inner.cas(off, expected, new).await
    }
    async fn write_ordered(&self, writes: &[(u64, &[u8])]) -> Result<(), MemError> {
        Self::bump(&self.writes, writes.len() as u64);
        Self::bump(&self.rounds, 1);
        self.inner.write_ordered(writes).await
    }
}

/// Operation counts with internal nodes cached (rTX Table 2, n = 1): a lookup is the
/// TXObj READ and the block READ (no validation round for one object); an update adds
/// the block WRITE and three CASes (lock, dptr, unlock), and no validation READ either
/// (its one read is the object it writes: the dptr CAS checks it).
#[test]
fn cached_lookup_and_update_cost_as_in_table_2() {
    let l = layout(1024);
    let m = CountMem::new(region(&l));
    let clock = ManualClock::new(T0);
    // Blocks wait out their reuse delay (the clock stands still): every new block comes
    // from this client's own chunks, so no reclamation-table WRITE (4.4) joins in.
    let mut c = Client::new(l, 0, 2, clock.clone(), Config::default());
    let mut t = Blink::new(l, objs(0));
    block_on(async {
        for k in 0..200 {
            t.insert(&mut c, &m, k * 7, k).await.unwrap();
        }
        // Warm the cache along key 700's path.
        t.lookup(&mut c, &m, 700).await.unwrap();
        let before = (m.reads.get(), m.writes.get(), m.cas.get());
        assert_eq!(t.lookup(&mut c, &m, 700).await.unwrap(), Some(100));
        assert_eq!(m.reads.get() - before.0, 2, "TXObj + block");
        assert_eq!((m.writes.get(), m.cas.get()), (before.1, before.2));
        // The first update replaces the loader's block (a reclamation-table WRITE); the
        // second replaces this client's own.
        t.insert(&mut c, &m, 700, 1).await.unwrap();
        let before = (m.reads.get(), m.writes.get(), m.cas.get());
        t.insert(&mut c, &m, 700, 2).await.unwrap();
        assert_eq!(
            (
                m.reads.get() - before.0,
                m.writes.get() - before.1,
                m.cas.get() - before.2
            ),
            (2, 1, 3),
            "READ TXObj + block, WRITE block, CAS lock + dptr + unlock"
        );
    });
}

/// Optimal's update with internal nodes cached is three round trips, as Sherman's: CAS the
/// leaf's lock, READ the leaf, and one ordered list of the write-back and the unlock
/// (command combination). Sent one after another, the last two would be four.
#[test]
fn optimal_update_is_three_round_trips_with_the_unlock_combined() {
    let l = layout(1024);
    let m = CountMem::new(region(&l));
    let mut t = super::optimal::Optimal::new(l, 0, objs(0));
    block_on(async {
        for k in 0..200 {
            t.insert(&m, k * 7, k).await.unwrap();
        }
        t.lookup(&m, 700).await.unwrap();
        let before = (m.reads.get(), m.writes.get(), m.cas.get(), m.rounds.get());
        assert_eq!(t.insert(&m, 700, 2).await.unwrap(), Some(100));
        assert_eq!(
            (
                m.reads.get() - before.0,
                m.writes.get() - before.1,
                m.cas.get() - before.2,
                m.rounds.get() - before.3
            ),
            (1, 2, 1, 3),
            "READ leaf, WRITE leaf + lock word, CAS lock; in three round trips"
        );
        assert_eq!(t.lookup(&m, 700).await.unwrap(), Some(2));
        check_quiescent(&m.inner, &l).await.unwrap();
    });
}

/// A memory that yields to the executor before some one-sided operations (chosen by a
/// shared xorshift), so several clients' rTXs interleave at operation granularity.
#[derive(Clone)]
struct YieldMem {
    inner: LocalMem,
    rng: Rc<Cell<u64>>,
    /// The longest pause, in turns of the other tasks.
    max_pause: u32,
}

/// Pending for this many polls, then ready.
struct YieldNow(u32);

impl Future for YieldNow {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 == 0 {
            return Poll::Ready(());
        }
        self.0 -= 1;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl YieldMem {
    /// Before an operation: no pause one time in three, else 1 to `max_pause` turns of
    /// the others (longer pauses let one client's few steps fall between two of
    /// another's).
    fn pause(&self) -> YieldNow {
        let mut x = self.rng.get();
        let r = next(&mut x);
        self.rng.set(x);
        YieldNow(if r.is_multiple_of(3) {
            0
        } else {
            1 + (r >> 8) as u32 % self.max_pause
        })
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

#[test]
fn concurrent_clients_inserting_disjoint_and_overlapping_keys() {
    const CLIENTS: u64 = 4;
    let l = layout(128);
    let base = region(&l);
    let m = YieldMem {
        inner: base.clone(),
        max_pause: 1,
        rng: Rc::new(Cell::new(0xDEAD_BEEF)),
    };
    let clock = ManualClock::new(T0);
    // Acknowledged (key, value) writes per client, in order.
    let acked: Rc<RefCell<Vec<(u64, u64, u64)>>> = Rc::default();
    let aborts: Rc<Cell<u64>> = Rc::default();
    let mut pool = LocalPool::new();
    for i in 0..CLIENTS {
        let (m, acked, aborts) = (m.clone(), acked.clone(), aborts.clone());
        let mut c = client(&l, i as u16, &clock);
        let mut t = Blink::new(l, objs(i));
        pool.spawner()
            .spawn_local(async move {
                let mut x = 77 + i;
                for j in 0..150u64 {
                    // Disjoint: i * 10_000 + j; overlapping: a shared range of 100 keys.
                    let k = if j % 2 == 0 {
                        i * 10_000 + j
                    } else {
                        50_000 + next(&mut x) % 100
                    };
                    let v = i << 32 | j;
                    t.insert(&mut c, &m, k, v).await.unwrap();
                    acked.borrow_mut().push((i, k, v));
                    if j % 10 == 0 {
                        let got = t.scan(&mut c, &m, k, 20).await.unwrap();
                        assert!(got.windows(2).all(|w| w[0].0 < w[1].0));
                    }
                }
                assert!(c.stats().commits >= 150);
                aborts.set(aborts.get() + c.stats().aborts);
            })
            .unwrap();
    }
    pool.run();
    assert!(
        aborts.get() > 0,
        "the clients never conflicted: the test shows nothing"
    );
    let all = block_on(check_tree(&base, &l)).unwrap();
    block_on(check_quiescent(&base, &l)).unwrap();
    let found: BTreeMap<u64, u64> = all.iter().copied().collect();
    assert_eq!(found.len(), all.len(), "every key once");
    let acked = acked.borrow();
    assert_eq!(acked.len(), 150 * CLIENTS as usize);
    for &(_, k, v) in acked.iter() {
        let got = found.get(&k).copied();
        assert!(got.is_some(), "acknowledged key {k} lost");
        if k < 50_000 {
            assert_eq!(got, Some(v));
        }
    }
    // An overlapping key holds one of the values acknowledged for it (acknowledgement
    // order need not be the order of installs: an owner acknowledges after its unlock
    // and log steps, in which another client may install).
    let mut written: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for &(_, k, v) in acked.iter() {
        written.entry(k).or_default().push(v);
    }
    for (k, vs) in &written {
        assert!(
            vs.contains(&found[k]),
            "key {k} holds {} never acknowledged",
            found[k]
        );
    }
    let expect_keys: std::collections::BTreeSet<u64> = acked.iter().map(|a| a.1).collect();
    assert_eq!(
        found.len(),
        expect_keys.len(),
        "no key that was never inserted"
    );
}

/// A client crashes at `at` inside the rTX that splits the root leaf (and grows the root);
/// after its lease expires, another client's operations on the same keys repair it.
/// Afterwards every acknowledged key is found once, the split key is present iff the rTX
/// reached DOING, the tree checks, and nothing stays locked or unfinished.
fn crash_in_split(at: CrashPoint, committed: bool) {
    let l = layout(128);
    let m = region(&l);
    let clock = ManualClock::new(T0);
    let mut a = client(&l, 0, &clock);
    let mut ta = Blink::new(l, objs(0));
    let mut b = client(&l, 1, &clock);
    let mut tb = Blink::new(l, objs(1));
    block_on(async {
        for k in 0..5 {
            ta.insert(&mut a, &m, k * 10, k).await.unwrap();
        }
        a.crash = Some(at);
        let r = ta.insert(&mut a, &m, 25, 99).await;
        assert!(
            matches!(
                r,
                Err(super::BlinkError::Rtx(RtxError::Mem(MemError::Crashed)))
            ),
            "{r:?}"
        );
        clock.advance(60_000);
        for k in 5..30 {
            tb.insert(&mut b, &m, k * 10, k).await.unwrap();
        }
        assert_eq!(
            tb.lookup(&mut b, &m, 25).await.unwrap(),
            committed.then_some(99)
        );
        assert!(b.stats().repairs >= 1, "{:?}", b.stats());
        let all = check_tree(&m, &l).await.unwrap();
        let mut want: Vec<(u64, u64)> = (0..30).map(|k| (k * 10, k)).collect();
        if committed {
            want.push((25, 99));
            want.sort();
        }
        assert_eq!(all, want);
        check_quiescent(&m, &l).await.unwrap();
    });
}

/// A crash after the split's log was written, before any lock: nothing is visible to
/// others; the restarted owner (same ID) settles its INIT log before its next rTX.
#[test]
fn crash_after_the_log_of_a_split_is_settled_by_the_owner() {
    let l = layout(128);
    let m = region(&l);
    let clock = ManualClock::new(T0);
    let mut a = client(&l, 0, &clock);
    let mut ta = Blink::new(l, objs(0));
    block_on(async {
        for k in 0..5 {
            ta.insert(&mut a, &m, k * 10, k).await.unwrap();
        }
        a.crash = Some(CrashPoint::LogWritten);
        assert!(ta.insert(&mut a, &m, 25, 99).await.is_err());
        a.crash = None;
        clock.advance(60_000);
        ta.insert(&mut a, &m, 25, 98).await.unwrap();
        let all = check_tree(&m, &l).await.unwrap();
        assert_eq!(
            all,
            vec![(0, 0), (10, 1), (20, 2), (25, 98), (30, 3), (40, 4)]
        );
        check_quiescent(&m, &l).await.unwrap();
    });
}

#[test]
fn crash_with_the_split_locked_is_aborted_by_repair() {
    crash_in_split(CrashPoint::Locked, false);
}

#[test]
fn crash_in_doing_is_committed_by_repair() {
    crash_in_split(CrashPoint::InDoing, true);
}

#[test]
fn crash_after_installing_is_finished_by_repair() {
    crash_in_split(CrashPoint::Installed, true);
}

/// The crash point as process-level tests arm it (`rtx::fault`): only an rTX that writes
/// a log fires it, so the single-leaf inserts (Opt1) before the split pass; the hook sees
/// the point and the client's ID once, and since it returns `false` the split stops there
/// as a crash (locks held, log DOING) that another client then commits.
#[test]
fn an_armed_crash_point_fires_in_the_first_logged_rtx_only() {
    thread_local! {
        static HITS: RefCell<Vec<(CrashPoint, u16)>> = const { RefCell::new(Vec::new()) };
    }
    fn hook(p: CrashPoint, id: u16) -> bool {
        HITS.with(|h| h.borrow_mut().push((p, id)));
        false
    }
    let l = layout(128);
    let m = region(&l);
    let clock = ManualClock::new(T0);
    let mut a = client(&l, 0, &clock);
    let mut ta = Blink::new(l, objs(0));
    let mut b = client(&l, 1, &clock);
    let mut tb = Blink::new(l, objs(1));
    // What `Client::arm_crash` sets (it refuses in builds without `fault-injection`).
    a.crash = Some(CrashPoint::InDoing);
    a.crash_hook = Some(hook);
    a.crash_logged_only = true;
    block_on(async {
        for k in 0..5 {
            ta.insert(&mut a, &m, k * 10, k).await.unwrap();
        }
        assert!(HITS.with(|h| h.borrow().is_empty()), "Opt1 inserts pass");
        let r = ta.insert(&mut a, &m, 25, 99).await;
        assert!(
            matches!(
                r,
                Err(super::BlinkError::Rtx(RtxError::Mem(MemError::Crashed)))
            ),
            "{r:?}"
        );
        assert_eq!(
            HITS.with(|h| h.borrow().clone()),
            [(CrashPoint::InDoing, 0)]
        );
        assert!(
            check_quiescent(&m, &l).await.is_err(),
            "the split holds its locks"
        );
        clock.advance(60_000);
        assert_eq!(tb.lookup(&mut b, &m, 25).await.unwrap(), Some(99));
        check_quiescent(&m, &l).await.unwrap();
    });
}

/// Planted bug (C.10 test 4), in process: a naive repair releases the locks of a live
/// owner's split in DOING without committing it; another client then changes the leaf,
/// the owner's late install of it fails while its other installs land, and the tree no
/// longer checks (or the owner's acknowledged key is gone).
#[test]
fn a_naive_repair_of_a_live_split_breaks_the_tree() {
    let l = layout(128);
    let m = region(&l);
    let clock = ManualClock::new(T0);
    let mut a = client(&l, 0, &clock);
    let mut ta = Blink::new(l, objs(0));
    let mut b = client(&l, 1, &clock);
    b.planted_naive_repair = true;
    let mut tb = Blink::new(l, objs(1));
    block_on(async {
        for k in 0..5 {
            ta.insert(&mut a, &m, k * 10, k).await.unwrap();
        }
        a.crash = Some(CrashPoint::InDoing);
        assert!(ta.insert(&mut a, &m, 25, 99).await.is_err());
        let log = m.read_now(l.log_addr(0), l.slot_bytes() as usize).unwrap();
        let img = crate::log::LogImage::decode(&log).unwrap();
        clock.advance(60_000);
        // The suspicious client repairs naively, then inserts into the leaf.
        tb.insert(&mut b, &m, 15, 1).await.unwrap();
        assert_eq!(b.stats().repairs, 1, "{:?}", b.stats());
        // The owner wakes up and finishes its TryCommit.
        let a = client(&l, 0, &clock);
        crate::trycommit::try_commit_steps(&a, &m, &img, m.word(l.log_addr(0)), None)
            .await
            .unwrap();
        let r = check_tree(&m, &l).await;
        let broken = match &r {
            Err(_) => true,
            Ok(all) => !all.contains(&(25, 99)) || !all.contains(&(15, 1)),
        };
        assert!(broken, "{r:?}");
    });
}

/// Planted bug (C.10 test 5): a repair that ignores DOING leaves the crashed split's locks
/// held forever, so a survivor's insert into that leaf never completes.
#[test]
fn a_repair_that_ignores_doing_leaves_the_leaf_locked_forever() {
    let l = layout(128);
    let m = region(&l);
    let clock = ManualClock::new(T0);
    let mut a = client(&l, 0, &clock);
    let mut ta = Blink::new(l, objs(0));
    let mut b = client(&l, 1, &clock);
    b.planted_ignore_doing = true;
    let mut tb = Blink::new(l, objs(1));
    block_on(async {
        for k in 0..5 {
            ta.insert(&mut a, &m, k * 10, k).await.unwrap();
        }
        a.crash = Some(CrashPoint::InDoing);
        assert!(ta.insert(&mut a, &m, 25, 99).await.is_err());
        clock.advance(60_000);
        let r = tb.insert(&mut b, &m, 15, 1).await;
        assert!(matches!(r, Err(super::BlinkError::Retries(_))), "{r:?}");
        assert!(check_quiescent(&m, &l).await.is_err());
    });
}

/// The Optimal baseline and its DTX-style variant: random operations against a
/// `BTreeMap` by one client.
#[test]
fn optimal_random_ops_match_a_btreemap() {
    for bb in [128u64, 1024] {
        let l = layout(bb);
        for dtx in [false, true] {
            let m = region(&l);
            let mut t = if dtx {
                super::optimal::Optimal::dtx(l, 0, FIRST_FREE_OBJ..l.objects)
            } else {
                super::optimal::Optimal::new(l, 0, FIRST_FREE_OBJ..l.objects)
            };
            let mut oracle = BTreeMap::new();
            let mut x = 0xABCD_EF01_2345_6789u64;
            block_on(async {
                for _ in 0..8000 {
                    let k = next(&mut x) % 3000;
                    match next(&mut x) % 10 {
                        0..=4 => {
                            let v = next(&mut x);
                            assert_eq!(t.insert(&m, k, v).await.unwrap(), oracle.insert(k, v));
                        }
                        5 | 6 => assert_eq!(t.delete(&m, k).await.unwrap(), oracle.remove(&k)),
                        7 | 8 => {
                            assert_eq!(t.lookup(&m, k).await.unwrap(), oracle.get(&k).copied())
                        }
                        _ => {
                            let n = (next(&mut x) % 30) as usize;
                            let want: Vec<(u64, u64)> =
                                oracle.range(k..).take(n).map(|(a, b)| (*a, *b)).collect();
                            assert_eq!(t.scan(&m, k, n).await.unwrap(), want);
                        }
                    }
                }
                let want: Vec<(u64, u64)> = oracle.iter().map(|(a, b)| (*a, *b)).collect();
                assert_eq!(check_tree(&m, &l).await.unwrap(), want);
                check_quiescent(&m, &l).await.unwrap();
            });
            assert!(t.stats().root_growths >= 1, "{:?}", t.stats());
        }
    }
}

/// Concurrent Optimal-family clients (`make(i)`) interleaved at every operation, each
/// inserting keys of its own (in leaves of its own, and interleaved with the others' in
/// shared leaves) and keys of a hot range of `hot`: every acknowledged key must
/// be found once with one of its acknowledged values, and no lock left held. Returns the
/// clients' aborts (lock retries, OCC aborts) or the first violation.
fn optimal_clients_keep_every_acknowledged_key(
    hot: u64,
    make: impl Fn(u64) -> super::optimal::Optimal,
) -> Result<u64, String> {
    const CLIENTS: u64 = 4;
    let l = layout(128);
    let base = region(&l);
    let m = YieldMem {
        inner: base.clone(),
        max_pause: 8,
        rng: Rc::new(Cell::new(0x5EED)),
    };
    let acked: Rc<RefCell<Vec<(u64, u64)>>> = Rc::default();
    let spins: Rc<Cell<u64>> = Rc::default();
    let mut pool = LocalPool::new();
    for i in 0..CLIENTS {
        let (m, acked, spins) = (m.clone(), acked.clone(), spins.clone());
        let mut t = make(i);
        pool.spawner()
            .spawn_local(async move {
                let mut x = 91 + i;
                for j in 0..150u64 {
                    let k = match j % 3 {
                        0 => i * 10_000 + j,
                        // Unique keys interleaved with the other clients': they share
                        // leaves, so a stale write-back loses one for good.
                        1 => 100_000 + j * CLIENTS + i,
                        _ => 50_000 + next(&mut x) % hot,
                    };
                    let v = i << 32 | j;
                    t.insert(&m, k, v).await.unwrap();
                    acked.borrow_mut().push((k, v));
                }
                spins.set(spins.get() + t.stats().aborts);
            })
            .unwrap();
    }
    pool.run();
    let all = block_on(check_tree(&base, &l)).map_err(|e| e.to_string())?;
    block_on(check_quiescent(&base, &l)).map_err(|e| e.to_string())?;
    let found: BTreeMap<u64, u64> = all.iter().copied().collect();
    let mut written: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for &(k, v) in acked.borrow().iter() {
        written.entry(k).or_default().push(v);
    }
    for (k, vs) in &written {
        let got = found.get(k).copied().ok_or(format!("key {k} lost"))?;
        if !vs.contains(&got) {
            return Err(format!("key {k} holds {got}, never acknowledged"));
        }
        if !(50_000..100_000).contains(k) && vs != &vec![got] {
            return Err(format!("unique key {k} holds {got}, wrote {vs:?}"));
        }
    }
    if found.len() != written.len() {
        return Err(format!(
            "{} keys found, {} acknowledged",
            found.len(),
            written.len()
        ));
    }
    Ok(spins.get())
}

/// The Optimal baseline under concurrent clients: lock-first (Sherman) clients beside
/// DTX and OCC clients (leaves READ, then locked and validated), and OCC clients alone.
#[test]
fn optimal_concurrent_clients_keep_every_acknowledged_key() {
    use super::optimal::Optimal;
    let mixed = optimal_clients_keep_every_acknowledged_key(100, |i| match i % 3 {
        0 => Optimal::new(layout(128), i as u16, objs(i)),
        1 => Optimal::dtx(layout(128), i as u16, objs(i)),
        _ => Optimal::occ(layout(128), i as u16, objs(i)),
    })
    .unwrap();
    assert!(
        mixed > 0,
        "the clients never conflicted: the test shows nothing"
    );
    let occ = optimal_clients_keep_every_acknowledged_key(12, |i| {
        Optimal::occ(layout(128), i as u16, objs(i))
    })
    .unwrap();
    assert!(occ > 0, "no OCC abort: the test shows nothing");
}

/// OCC's validation is what keeps a leaf's concurrent inserts: with it skipped (a leaf
/// locked and written back from its unlocked READ), another client's insert into the same
/// leaf is overwritten (or a split since undone) and the check above catches it.
#[test]
fn occ_without_validation_loses_an_acknowledged_key() {
    use super::optimal::Optimal;
    let r = optimal_clients_keep_every_acknowledged_key(12, |i| {
        let mut t = Optimal::occ(layout(128), i as u16, objs(i));
        t.planted_skip_validation = true;
        t
    });
    let e = r.expect_err("OCC without validation kept every key");
    // A stale write-back drops the keys inserted since its READ, or, over a split since,
    // restores the node's old fences and sibling pointer.
    assert!(
        e.contains("lost") || e.contains("tree invariant broken"),
        "{e}"
    );
}

/// An rTX ID reused by a restarted client (new incarnation, `Client::recover`) whose
/// handle allocates nodes from the same object range as its previous life, beside a
/// client that never stopped: the tree stays sound and equal to the oracle.
#[test]
fn a_restarted_id_reuses_its_object_range_soundly() {
    let l = layout(128);
    let m = region(&l);
    let clock = ManualClock::new(T0);
    let mut oracle = BTreeMap::new();
    let mut x = 7u64;
    let mut b = client(&l, 1, &clock);
    let mut tb = Blink::new(l, objs(1));
    block_on(async {
        for life in 0..4u8 {
            let mut a = Client::new(l, 0, 2 + life, clock.clone(), Config::default());
            a.allocator().min_reuse_ms = 0;
            a.recover(&m).await.unwrap();
            let mut ta = Blink::new(l, objs(0));
            for i in 0..150 {
                let k = next(&mut x) % 5000;
                let v = next(&mut x);
                if i % 2 == 0 {
                    ta.insert(&mut a, &m, k, v).await.unwrap();
                } else {
                    tb.insert(&mut b, &m, k, v).await.unwrap();
                }
                oracle.insert(k, v);
                clock.advance(1);
            }
            let all = check_tree(&m, &l).await.unwrap();
            let want: Vec<(u64, u64)> = oracle.iter().map(|(a, b)| (*a, *b)).collect();
            assert_eq!(all, want, "after life {life}");
        }
    });
}
