//! Protocol tests over [`LocalMem`]: commit paths, aborts, and one test per log state a
//! repair can meet (acceptance test 3), each asserting the resulting MN words.

use futures::executor::block_on;

use crate::client::CrashPoint;
use crate::dptr::Dptr;
use crate::error::{AbortReason, RtxError};
use crate::layout::{format, Layout, DPTR_OFF};
use crate::lease::{ManualClock, SkewedClock};
use crate::lllock::{unlocked, LockState, LockWord};
use crate::log::{Header, LogImage, LogState};
use crate::mem::{LocalMem, MemError, OnRead};
use crate::repair::RepairOutcome;
use crate::{Client, Config};

pub(crate) const T0: u64 = 1_800_000_000_000;

pub(crate) fn layout() -> Layout {
    Layout {
        ids: 4,
        max_entries: 4,
        objects: 4,
        block_bytes: 8,
        blocks: 256,
        reclaim_slots: 16,
    }
}

/// A formatted region: object i holds the counter 10 * (i + 1).
pub(crate) fn region(l: &Layout) -> LocalMem {
    let m = LocalMem::new(l.total_bytes() as usize);
    block_on(format(l, &m, 3, |i| (10 * (i + 1)).to_le_bytes().to_vec())).unwrap();
    m
}

/// Client `id` with its own blocks (no MN refill needed): 16 per id from block 64 on.
pub(crate) fn client<C: crate::lease::Clock>(
    l: &Layout,
    id: u16,
    clock: C,
    cfg: Config,
) -> Client<C> {
    let mut c = Client::new(*l, id, 2, clock, cfg);
    let first = 64 + 16 * id as u64;
    c.allocator().add_free(first..first + 16);
    c
}

/// The counter object `i` holds now (through its dptr).
pub(crate) fn value(m: &LocalMem, l: &Layout, i: u64) -> u64 {
    let d = Dptr::decode(m.word(l.obj_addr(i) + DPTR_OFF)).expect("formatted");
    m.word(l.block_addr(d.block))
}

fn lock(m: &LocalMem, l: &Layout, i: u64) -> u64 {
    m.word(l.obj_addr(i))
}

fn dptr(m: &LocalMem, l: &Layout, i: u64) -> u64 {
    m.word(l.obj_addr(i) + DPTR_OFF)
}

/// Increment the counters of `objs` in one rTX.
pub(crate) async fn incr<C: crate::lease::Clock, M: crate::mem::Mem>(
    c: &mut Client<C>,
    m: &M,
    l: &Layout,
    objs: &[u64],
) -> Result<(), RtxError> {
    let mut tx = c.begin();
    for &i in objs {
        let v = u64::from_le_bytes(tx.read(m, l.obj_addr(i)).await?[..8].try_into().unwrap());
        tx.write(m, l.obj_addr(i), (v + 1).to_le_bytes().to_vec())
            .await?;
    }
    tx.commit(m).await
}

fn crashed(r: Result<(), RtxError>) {
    assert!(matches!(r, Err(RtxError::Mem(MemError::Crashed))), "{r:?}");
}

#[test]
fn logged_and_opt1_commits_update_counters_and_count_log_writes() {
    let l = layout();
    let m = region(&l);
    let clock = ManualClock::new(T0);
    let mut c = client(&l, 0, clock.clone(), Config::default());
    block_on(incr(&mut c, &m, &l, &[0, 1])).unwrap();
    block_on(incr(&mut c, &m, &l, &[2])).unwrap();
    block_on(incr(&mut c, &m, &l, &[2])).unwrap();
    assert_eq!(
        [value(&m, &l, 0), value(&m, &l, 1), value(&m, &l, 2)],
        [11, 21, 32]
    );
    assert_eq!(lock(&m, &l, 0), unlocked(1));
    assert_eq!(lock(&m, &l, 2), unlocked(2));
    assert_eq!(Dptr::decode(dptr(&m, &l, 2)).unwrap().version, 2);
    let s = c.stats();
    assert_eq!(
        (s.commits, s.log_writes),
        (3, 1),
        "Opt1 commits write no log"
    );
    let h = Header::decode(m.word(l.log_addr(0)));
    assert_eq!(h.state, LogState::Done);
    // Without Opt1 a single write is logged.
    let mut c = client(
        &l,
        1,
        clock,
        Config {
            opt1: false,
            ..Config::default()
        },
    );
    block_on(incr(&mut c, &m, &l, &[3])).unwrap();
    assert_eq!((value(&m, &l, 3), c.stats().log_writes), (41, 1));
}

/// An update of an object locked by a live rTX aborts (its read takes the committed
/// value, the write then refuses).
#[test]
fn read_of_an_object_locked_by_a_live_rtx_aborts() {
    let l = layout();
    let m = region(&l);
    let clock = ManualClock::new(T0);
    let mut a = client(&l, 0, clock.clone(), Config::default());
    a.crash = Some(CrashPoint::Locked);
    crashed(block_on(incr(&mut a, &m, &l, &[0, 1])));
    let mut b = client(&l, 1, clock, Config::default());
    let r = block_on(incr(&mut b, &m, &l, &[1]));
    assert!(
        matches!(r, Err(RtxError::Aborted(AbortReason::Locked))),
        "{r:?}"
    );
    assert!(matches!(
        LockWord::decode(lock(&m, &l, 1)),
        LockWord::Locked(_)
    ));
}

/// A one-object read-only rTX takes a live holder's object instead of aborting: the
/// committed value, before the holder's install and after it, and commits. Anything more
/// in that rTX aborts (a second object could come from the other side of the same
/// install), and a later read of a locked object still aborts.
#[test]
fn a_lone_read_of_a_live_holders_object_takes_its_committed_value() {
    let u64_of = |v: Vec<u8>| u64::from_le_bytes(v[..8].try_into().unwrap());
    for (at, want) in [(CrashPoint::Locked, 10), (CrashPoint::Installed, 11)] {
        let l = layout();
        let m = region(&l);
        let clock = ManualClock::new(T0);
        let mut a = client(&l, 0, clock.clone(), Config::default());
        a.crash = Some(at);
        crashed(block_on(incr(&mut a, &m, &l, &[0, 1])));
        let mut b = client(&l, 1, clock, Config::default());
        let mut tx = b.begin();
        let v = block_on(tx.read(&m, l.obj_addr(0))).unwrap();
        assert_eq!(u64_of(v), want, "{at:?}");
        block_on(tx.commit(&m)).unwrap();
        let mut tx = b.begin();
        block_on(tx.read(&m, l.obj_addr(0))).unwrap();
        let r = block_on(tx.read(&m, l.obj_addr(2)));
        assert!(
            matches!(r, Err(RtxError::Aborted(AbortReason::Locked))),
            "{at:?}: a second read after one under a lock: {r:?}"
        );
        let mut tx = b.begin();
        block_on(tx.read(&m, l.obj_addr(1))).unwrap();
        let r = block_on(tx.write(&m, l.obj_addr(1), 7u64.to_le_bytes().to_vec()));
        assert!(
            matches!(r, Err(RtxError::Aborted(AbortReason::Locked))),
            "{at:?}: a write after a read under a lock: {r:?}"
        );
        let mut tx = b.begin();
        block_on(tx.read(&m, l.obj_addr(2))).unwrap();
        let r = block_on(tx.read(&m, l.obj_addr(0)));
        assert!(
            matches!(r, Err(RtxError::Aborted(AbortReason::Locked))),
            "{at:?}: a second read of a locked object: {r:?}"
        );
        assert_eq!(b.stats().reads_under_lock, 3, "{at:?}");
        assert!(matches!(
            LockWord::decode(lock(&m, &l, 0)),
            LockWord::Locked(_)
        ));
    }
}

#[test]
fn validation_aborts_on_a_read_object_locked_by_another_rtx() {
    let l = layout();
    let m = region(&l);
    let clock = ManualClock::new(T0);
    let mut a = client(&l, 0, clock.clone(), Config::default());
    let mut b = client(&l, 1, clock, Config::default());
    let mut tx = b.begin();
    block_on(tx.read(&m, l.obj_addr(0))).unwrap();
    block_on(tx.write(&m, l.obj_addr(1), 7u64.to_le_bytes().to_vec())).unwrap();
    // a locks object 0 (and stays in its commit).
    a.crash = Some(CrashPoint::Locked);
    crashed(block_on(incr(&mut a, &m, &l, &[0, 2])));
    let r = block_on(tx.commit(&m));
    assert!(
        matches!(r, Err(RtxError::Aborted(AbortReason::Validation))),
        "{r:?}"
    );
    assert_eq!(
        (value(&m, &l, 1), lock(&m, &l, 1)),
        (20, unlocked(0)),
        "released unchanged"
    );
}

/// Another writer replaces object 0's buffer (block 200, value 99) and releases at the
/// same version, as an Opt1 repair may do: a lock CAS alone would not notice.
fn replace_buffer_under_an_equal_lock_word(m: &LocalMem, l: &Layout) {
    let moved = Dptr {
        incarnation: 1,
        version: 1,
        block: 200,
    };
    m.set_word(l.obj_addr(0) + DPTR_OFF, moved.word());
    m.set_word(l.block_addr(200), 99);
}

#[test]
fn validation_aborts_when_a_written_objects_dptr_changed_under_an_equal_lock_word() {
    let l = layout();
    let m = region(&l);
    let mut c = client(&l, 0, ManualClock::new(T0), Config::default());
    let mut tx = c.begin();
    block_on(tx.write(&m, l.obj_addr(0), 5u64.to_le_bytes().to_vec())).unwrap();
    block_on(tx.write(&m, l.obj_addr(1), 6u64.to_le_bytes().to_vec())).unwrap();
    replace_buffer_under_an_equal_lock_word(&m, &l);
    let r = block_on(tx.commit(&m));
    assert!(
        matches!(r, Err(RtxError::Aborted(AbortReason::Validation))),
        "{r:?}"
    );
    assert_eq!((value(&m, &l, 0), value(&m, &l, 1)), (99, 20));
    assert_eq!(
        (lock(&m, &l, 0), lock(&m, &l, 1)),
        (unlocked(0), unlocked(0))
    );
    assert_eq!(Header::decode(m.word(l.log_addr(0))).state, LogState::Done);
}

/// The same for an Opt1 update, which has no validation round (its one read is the
/// object it writes): the dptr CAS of its install finds the moved pointer and aborts it.
#[test]
fn an_opt1_update_aborts_when_its_dptr_changed_under_an_equal_lock_word() {
    let l = layout();
    let m = region(&l);
    let mut c = client(&l, 0, ManualClock::new(T0), Config::default());
    let mut tx = c.begin();
    block_on(tx.write(&m, l.obj_addr(0), 5u64.to_le_bytes().to_vec())).unwrap();
    replace_buffer_under_an_equal_lock_word(&m, &l);
    let r = block_on(tx.commit(&m));
    assert!(
        matches!(r, Err(RtxError::Aborted(AbortReason::AbortedByRepairer))),
        "{r:?}"
    );
    assert_eq!(value(&m, &l, 0), 99);
    assert!(!matches!(
        LockWord::decode(lock(&m, &l, 0)),
        LockWord::Locked(_)
    ));
    assert_eq!(c.stats().validations_skipped, 1);
}

/// An abandoned logged rTX stopped at `at`, object 0 and 1 written; returns its LockState.
fn abandoned(m: &LocalMem, l: &Layout, clock: &ManualClock, cfg: Config, at: CrashPoint) -> u64 {
    let mut a = client(l, 0, clock.clone(), cfg);
    a.crash = Some(at);
    crashed(block_on(incr(&mut a, m, l, &[0, 1])));
    let w = lock(m, l, 0);
    assert!(matches!(LockWord::decode(w), LockWord::Locked(_)));
    w
}

fn repairer(l: &Layout, clock: &ManualClock, cfg: Config) -> Client<ManualClock> {
    client(l, 1, clock.clone(), cfg)
}

fn lease_of(w: u64) -> u64 {
    match LockWord::decode(w) {
        LockWord::Locked(s) => s.lease_ms,
        LockWord::Unlocked(_) => panic!("not locked"),
    }
}

#[test]
fn repair_of_init_aborts_and_releases_at_the_old_version() {
    let (l, clock) = (layout(), ManualClock::new(T0));
    let m = region(&l);
    let w = abandoned(&m, &l, &clock, Config::default(), CrashPoint::Locked);
    let before = (dptr(&m, &l, 0), dptr(&m, &l, 1));
    clock.set(lease_of(w) + 1);
    let mut r = repairer(&l, &clock, Config::default());
    assert_eq!(
        block_on(r.repair(&m, l.obj_addr(0), w)).unwrap(),
        RepairOutcome::Aborted
    );
    assert_eq!(
        (lock(&m, &l, 0), lock(&m, &l, 1)),
        (unlocked(0), unlocked(0))
    );
    assert_eq!((dptr(&m, &l, 0), dptr(&m, &l, 1)), before);
    assert_eq!(
        m.word(l.log_addr(0)),
        Header::new(LogState::Done, lease_of(w)).word()
    );
    assert_eq!(r.stats().repairs, 1);
}

#[test]
fn repair_of_abort_releases_and_marks_done() {
    let (l, clock) = (layout(), ManualClock::new(T0));
    let m = region(&l);
    let w = abandoned(&m, &l, &clock, Config::default(), CrashPoint::Locked);
    // A first repairer moved it to ABORT and died before releasing.
    m.set_word(
        l.log_addr(0),
        Header::new(LogState::Abort, lease_of(w)).word(),
    );
    clock.set(lease_of(w) + 1);
    let mut r = repairer(&l, &clock, Config::default());
    assert_eq!(
        block_on(r.repair(&m, l.obj_addr(1), w)).unwrap(),
        RepairOutcome::Aborted
    );
    assert_eq!(
        (lock(&m, &l, 0), lock(&m, &l, 1)),
        (unlocked(0), unlocked(0))
    );
    assert_eq!((value(&m, &l, 0), value(&m, &l, 1)), (10, 20));
    assert_eq!(
        m.word(l.log_addr(0)),
        Header::new(LogState::Done, lease_of(w)).word()
    );
}

#[test]
fn repair_of_done_does_nothing_or_releases_a_late_lock_at_its_pre_lock_version() {
    let (l, clock) = (layout(), ManualClock::new(T0));
    let m = region(&l);
    let w = abandoned(&m, &l, &clock, Config::default(), CrashPoint::Locked);
    // The rTX was aborted and finished, but object 1's lock CAS landed late.
    m.set_word(
        l.log_addr(0),
        Header::new(LogState::Done, lease_of(w)).word(),
    );
    m.set_word(l.obj_addr(0), unlocked(0));
    clock.set(lease_of(w) + 1);
    let mut r = repairer(&l, &clock, Config::default());
    let snap = m.snapshot();
    // At object 0 (already released): nothing changes.
    assert_eq!(
        block_on(r.repair(&m, l.obj_addr(0), w)).unwrap(),
        RepairOutcome::Done
    );
    assert_eq!(m.snapshot(), snap);
    // At object 1 (still held): released at its pre-lock version, data untouched.
    assert_eq!(
        block_on(r.repair(&m, l.obj_addr(1), w)).unwrap(),
        RepairOutcome::Released
    );
    assert_eq!((lock(&m, &l, 1), value(&m, &l, 1)), (unlocked(0), 20));
    assert_eq!(
        m.word(l.log_addr(0)),
        Header::new(LogState::Done, lease_of(w)).word()
    );
}

#[test]
fn repair_of_doing_with_an_expired_repair_lease_finishes_the_commit() {
    let (l, clock) = (layout(), ManualClock::new(T0));
    let m = region(&l);
    let w = abandoned(&m, &l, &clock, Config::default(), CrashPoint::InDoing);
    let img =
        LogImage::decode(&m.read_now(l.log_addr(0), l.slot_bytes() as usize).unwrap()).unwrap();
    assert_eq!(img.header.state, LogState::Doing);
    clock.set(img.header.repair_deadline_ms() + 1);
    let mut r = repairer(&l, &clock, Config::default());
    assert_eq!(
        block_on(r.repair(&m, l.obj_addr(0), w)).unwrap(),
        RepairOutcome::Committed
    );
    for (i, e) in img.entries.iter().enumerate() {
        assert_eq!(dptr(&m, &l, i as u64), e.ndptr);
        assert_eq!(lock(&m, &l, i as u64), unlocked(1));
    }
    assert_eq!((value(&m, &l, 0), value(&m, &l, 1)), (11, 21));
    assert_eq!(
        m.word(l.log_addr(0)),
        Header::new(LogState::Done, lease_of(w)).word()
    );
    // A second repair with the same word is a no-op.
    let snap = m.snapshot();
    assert_eq!(
        block_on(r.repair(&m, l.obj_addr(0), w)).unwrap(),
        RepairOutcome::Done
    );
    assert_eq!(m.snapshot(), snap);
}

#[test]
fn repair_of_doing_after_a_partial_install_finishes_it() {
    let (l, clock) = (layout(), ManualClock::new(T0));
    let m = region(&l);
    let w = abandoned(&m, &l, &clock, Config::default(), CrashPoint::Installed);
    assert_eq!(
        (value(&m, &l, 0), value(&m, &l, 1)),
        (11, 21),
        "installed, locks held"
    );
    clock.set(lease_of(w) + 10_000);
    let mut r = repairer(&l, &clock, Config::default());
    assert_eq!(
        block_on(r.repair(&m, l.obj_addr(1), w)).unwrap(),
        RepairOutcome::Committed
    );
    assert_eq!(
        (lock(&m, &l, 0), lock(&m, &l, 1)),
        (unlocked(1), unlocked(1))
    );
    assert_eq!((value(&m, &l, 0), value(&m, &l, 1)), (11, 21));
}

#[test]
fn repair_of_doing_with_a_valid_repair_lease_leaves_everything() {
    let (l, clock) = (layout(), ManualClock::new(T0));
    let m = region(&l);
    let cfg = Config {
        repair_lease_ms: Some(50),
        ..Config::default()
    };
    let w = abandoned(&m, &l, &clock, cfg, CrashPoint::InDoing);
    clock.set(lease_of(w) + 1); // lock lease over, repair lease (now + 50 ms) not
    let snap = m.snapshot();
    let mut r = repairer(&l, &clock, Config::default());
    assert_eq!(
        block_on(r.repair(&m, l.obj_addr(0), w)).unwrap(),
        RepairOutcome::Busy
    );
    assert_eq!(m.snapshot(), snap);
    // A reader meeting the lock aborts and repairs nothing.
    let e = block_on(incr(&mut r, &m, &l, &[0]));
    assert!(
        matches!(e, Err(RtxError::Aborted(AbortReason::Repaired))),
        "{e:?}"
    );
    assert_eq!(m.snapshot(), snap);
}

#[test]
fn repair_with_a_checksum_mismatch_leaves_everything() {
    let (l, clock) = (layout(), ManualClock::new(T0));
    let m = region(&l);
    let w = abandoned(&m, &l, &clock, Config::default(), CrashPoint::Locked);
    // The slot was reused by the ID's next rTX (larger lease), as seen by a slow repairer.
    let next = LockState {
        lease_ms: lease_of(w) + 5,
        id: 0,
        no_log: false,
    };
    let img = LogImage {
        header: Header::new(LogState::Init, next.lease_ms),
        checksum: next.word(),
        entries: vec![],
    };
    m.write_now(l.log_addr(0), &img.encode()).unwrap();
    clock.set(lease_of(w) + 1);
    let snap = m.snapshot();
    let mut r = repairer(&l, &clock, Config::default());
    assert_eq!(
        block_on(r.repair(&m, l.obj_addr(0), w)).unwrap(),
        RepairOutcome::Stale
    );
    assert_eq!(m.snapshot(), snap);
    // Same identity, different checksum word (another ID's state): also refused.
    let other = LockState {
        id: 2,
        ..LockState {
            lease_ms: lease_of(w),
            id: 0,
            no_log: false,
        }
    };
    let img = LogImage {
        header: Header::new(LogState::Init, lease_of(w)),
        checksum: other.word(),
        entries: vec![],
    };
    m.write_now(l.log_addr(0), &img.encode()).unwrap();
    let snap = m.snapshot();
    assert_eq!(
        block_on(r.repair(&m, l.obj_addr(0), w)).unwrap(),
        RepairOutcome::Stale
    );
    assert_eq!(m.snapshot(), snap);
}

#[test]
fn opt1_repair_moves_the_value_to_a_fresh_buffer_and_the_owner_late_install_fails() {
    let (l, clock) = (layout(), ManualClock::new(T0));
    let m = region(&l);
    let mut a = client(&l, 0, clock.clone(), Config::default());
    a.crash = Some(CrashPoint::Locked);
    crashed(block_on(incr(&mut a, &m, &l, &[2])));
    let w = lock(&m, &l, 2);
    let LockWord::Locked(s) = LockWord::decode(w) else {
        panic!("locked")
    };
    assert!(s.no_log && s.id == 0);
    let old = dptr(&m, &l, 2);
    clock.set(s.lease_ms + 1);
    let mut r = repairer(&l, &clock, Config::default());
    assert_eq!(
        block_on(r.repair(&m, l.obj_addr(2), w)).unwrap(),
        RepairOutcome::Opt1Replaced
    );
    let new = Dptr::decode(dptr(&m, &l, 2)).unwrap();
    let o = Dptr::decode(old).unwrap();
    assert_ne!(new.block, o.block);
    assert_eq!(new.version, o.version + 1);
    assert_eq!(value(&m, &l, 2), 30, "the committed value, copied");
    // Released (at the repairer's own lease as version: the owner's is unknown).
    assert!(matches!(LockWord::decode(lock(&m, &l, 2)), LockWord::Unlocked(v) if v > s.lease_ms));
    // The owner's late install CAS expects the old dptr: it fails.
    assert_ne!(
        m.cas_now(l.obj_addr(2) + DPTR_OFF, old, 12345).unwrap(),
        old
    );
    assert_eq!(value(&m, &l, 2), 30);
}

#[test]
fn opt2_pre_lock_commits_and_an_abandoned_pre_lock_is_repaired() {
    let (l, clock) = (layout(), ManualClock::new(T0));
    let m = region(&l);
    let mut c = client(&l, 0, clock.clone(), Config::default());
    let mut tx = c.begin();
    let v = block_on(tx.pre_lock(&m, l.obj_addr(0))).unwrap();
    assert!(matches!(
        LockWord::decode(lock(&m, &l, 0)),
        LockWord::Locked(_)
    ));
    let img =
        LogImage::decode(&m.read_now(l.log_addr(0), l.slot_bytes() as usize).unwrap()).unwrap();
    assert_eq!((img.header.state, img.entries.len()), (LogState::Init, 1));
    let v0 = u64::from_le_bytes(v[..8].try_into().unwrap());
    block_on(tx.write(&m, l.obj_addr(0), (v0 + 1).to_le_bytes().to_vec())).unwrap();
    block_on(tx.write(&m, l.obj_addr(1), 77u64.to_le_bytes().to_vec())).unwrap();
    block_on(tx.commit(&m)).unwrap();
    assert_eq!((value(&m, &l, 0), value(&m, &l, 1)), (11, 77));
    assert_eq!(
        (lock(&m, &l, 0), lock(&m, &l, 1)),
        (unlocked(1), unlocked(1))
    );
    // Crash after the pre-lock, before commit: the lock expires, a reader repairs.
    let mut tx = c.begin();
    block_on(tx.pre_lock(&m, l.obj_addr(0))).unwrap();
    drop(tx);
    let w = lock(&m, &l, 0);
    clock.set(lease_of(w) + 1);
    let mut r = repairer(&l, &clock, Config::default());
    let e = block_on(incr(&mut r, &m, &l, &[0]));
    assert!(
        matches!(e, Err(RtxError::Aborted(AbortReason::Repaired))),
        "{e:?}"
    );
    assert_eq!((lock(&m, &l, 0), value(&m, &l, 0)), (unlocked(1), 11));
    block_on(incr(&mut r, &m, &l, &[0])).unwrap();
    assert_eq!(value(&m, &l, 0), 12);
}

#[test]
fn an_owner_finishes_its_own_open_log_before_reusing_it() {
    let (l, clock) = (layout(), ManualClock::new(T0));
    let m = region(&l);
    let mut a = client(&l, 0, clock.clone(), Config::default());
    a.crash = Some(CrashPoint::InDoing);
    crashed(block_on(incr(&mut a, &m, &l, &[0, 1])));
    a.crash = None;
    block_on(incr(&mut a, &m, &l, &[1, 2])).unwrap();
    assert_eq!(
        [value(&m, &l, 0), value(&m, &l, 1), value(&m, &l, 2)],
        [11, 22, 31]
    );
    assert!((0..3).all(|i| !matches!(LockWord::decode(lock(&m, &l, i)), LockWord::Locked(_))));
}

#[test]
fn a_restarted_client_recovers_its_log_leases_and_blocks() {
    let (l, clock) = (layout(), ManualClock::new(T0));
    let m = region(&l);
    let mut a = Client::new(l, 0, 1, clock.clone(), Config::default());
    block_on(incr(&mut a, &m, &l, &[0, 1])).unwrap();
    a.crash = Some(CrashPoint::InDoing);
    crashed(block_on(incr(&mut a, &m, &l, &[0, 1])));
    let last = lease_of(lock(&m, &l, 0));
    clock.set(T0 - 60_000); // the clock stepped back across the restart
    let mut a2 = Client::new(l, 0, 2, clock.clone(), Config::default());
    block_on(a2.recover(&m)).unwrap();
    assert_eq!((value(&m, &l, 0), value(&m, &l, 1)), (12, 22));
    block_on(incr(&mut a2, &m, &l, &[0, 3])).unwrap();
    let h = Header::decode(m.word(l.log_addr(0)));
    assert!(
        h.identity > last,
        "leases per ID keep increasing across a restart"
    );
    assert_eq!(value(&m, &l, 0), 13);
}

#[test]
fn a_skewed_reader_repairs_a_live_owner_safely() {
    // False suspicion: a reader 1 s ahead sees a live owner's DOING as expired and
    // finishes it; the owner's own TryCommit then runs as a no-op.
    let (l, clock) = (layout(), ManualClock::new(T0));
    let m = region(&l);
    let w = abandoned(&m, &l, &clock, Config::default(), CrashPoint::InDoing);
    let ahead = SkewedClock {
        inner: clock.clone(),
        skew_ms: 1000,
    };
    let mut r = client(&l, 1, ahead, Config::default());
    assert_eq!(
        block_on(r.repair(&m, l.obj_addr(0), w)).unwrap(),
        RepairOutcome::Committed
    );
    let snap = m.snapshot();
    // The owner resumes: re-running TryCommit's steps changes nothing.
    let img =
        LogImage::decode(&m.read_now(l.log_addr(0), l.slot_bytes() as usize).unwrap()).unwrap();
    let a = client(&l, 0, clock.clone(), Config::default());
    let doing = Header::new(LogState::Init, img.header.identity)
        .doing_until(T0 + 50)
        .word();
    block_on(crate::trycommit::try_commit_steps(
        &a, &m, &img, doing, None,
    ))
    .unwrap();
    assert_eq!(m.snapshot(), snap);
    assert_eq!((value(&m, &l, 0), value(&m, &l, 1)), (11, 21));
}

#[test]
fn an_owner_aborts_its_own_log_left_in_init_before_reusing_it() {
    let (l, clock) = (layout(), ManualClock::new(T0));
    let m = region(&l);
    let mut a = client(&l, 0, clock.clone(), Config::default());
    a.crash = Some(CrashPoint::LogWritten);
    crashed(block_on(incr(&mut a, &m, &l, &[0, 1])));
    let h = Header::decode(m.word(l.log_addr(0)));
    assert_eq!(h.state, LogState::Init);
    a.crash = None;
    block_on(incr(&mut a, &m, &l, &[2, 3])).unwrap();
    assert_eq!(
        [value(&m, &l, 0), value(&m, &l, 1), value(&m, &l, 2)],
        [10, 20, 31]
    );
    assert_eq!(a.stats().log_writes, 2);
}

#[test]
fn a_pre_locked_object_not_written_is_released_by_the_commit() {
    let (l, clock) = (layout(), ManualClock::new(T0));
    let m = region(&l);
    let mut c = client(&l, 0, clock, Config::default());
    let mut tx = c.begin();
    block_on(tx.pre_lock(&m, l.obj_addr(0))).unwrap();
    block_on(tx.write(&m, l.obj_addr(1), 5u64.to_le_bytes().to_vec())).unwrap();
    block_on(tx.commit(&m)).unwrap();
    assert_eq!((value(&m, &l, 0), value(&m, &l, 1)), (10, 5));
    assert!(matches!(
        LockWord::decode(lock(&m, &l, 0)),
        LockWord::Unlocked(_)
    ));
    assert!(matches!(
        LockWord::decode(lock(&m, &l, 1)),
        LockWord::Unlocked(_)
    ));
    // Pre-lock, write nothing: commit releases it at its version.
    let mut tx = c.begin();
    block_on(tx.pre_lock(&m, l.obj_addr(2))).unwrap();
    block_on(tx.commit(&m)).unwrap();
    assert_eq!(lock(&m, &l, 2), unlocked(0));
    assert_eq!(Header::decode(m.word(l.log_addr(0))).state, LogState::Done);
}

/// An update's read waits out a live holder's lock with TXObj READs and then commits,
/// where a plain read would have made its write abort; a holder that keeps the lock
/// past the polls still aborts it (a lock whose lease expires is repaired, as always).
#[test]
fn a_read_for_update_waits_out_a_live_holders_lock() {
    let l = layout();
    for (polls, ok) in [(5, true), (crate::txn::LOCK_POLLS + 10, false)] {
        let clock = ManualClock::new(T0);
        let m = region(&l);
        let mut a = client(&l, 0, clock.clone(), Config::default());
        a.crash = Some(CrashPoint::Locked);
        crashed(block_on(incr(&mut a, &m, &l, &[0, 1])));
        // The holder lets object 0's lock go (at version 0) after `polls` READs of its
        // TXObj.
        let (obj, after, region) = (l.obj_addr(0), std::cell::Cell::new(polls), m.clone());
        let w = OnRead {
            inner: m.clone(),
            before: |off: u64, len: usize| {
                if off == obj && len == 16 {
                    match after.get() {
                        0 => {}
                        1 => {
                            after.set(0);
                            region.set_word(obj, unlocked(0));
                        }
                        n => after.set(n - 1),
                    }
                }
            },
        };
        let mut b = client(&l, 1, clock, Config::default());
        let r = block_on(async {
            let mut tx = b.begin();
            let v = tx.read_for_update(&w, l.obj_addr(0)).await?;
            let v = u64::from_le_bytes(v[..8].try_into().unwrap());
            tx.write(&w, l.obj_addr(0), (v + 1).to_le_bytes().to_vec())
                .await?;
            tx.commit(&w).await
        });
        if ok {
            r.unwrap();
            assert_eq!(value(&m, &l, 0), 11);
            assert_eq!(b.stats().lock_polls, polls as u64 - 1);
        } else {
            assert!(
                matches!(r, Err(RtxError::Aborted(AbortReason::Locked))),
                "{r:?}"
            );
            assert_eq!(b.stats().lock_polls, crate::txn::LOCK_POLLS as u64);
            assert_eq!(value(&m, &l, 0), 10);
        }
    }
}

/// A memory node whose every READ takes `per_read_ms` on `clock` (a client stalled
/// between its READs).
fn slow_mem(m: &LocalMem, clock: &ManualClock, per_read_ms: u64) -> OnRead<impl Fn(u64, usize)> {
    let clock = clock.clone();
    OnRead {
        inner: m.clone(),
        before: move |_, _| clock.advance(per_read_ms),
    }
}

/// A read whose two READs (the TXObj, then the block it points at) span half the
/// blocks' reuse wait is discarded: the block may have been replaced and reused by then
/// (a client stopped between them read another object's value). Faster reads pass.
#[test]
fn a_read_that_outlasts_the_block_reuse_wait_is_discarded() {
    use crate::mem::Mem as _;
    let l = layout();
    let m = region(&l);
    let clock = ManualClock::new(1_700_000_000_000);
    let per_read_ms = crate::alloc::MIN_REUSE_MS / 4 - 1;
    let fast = slow_mem(&m, &clock, per_read_ms);
    let mut c = client(&l, 0, clock.clone(), Config::default());
    let mut tx = c.begin();
    let v = block_on(tx.read(&fast, l.obj_addr(1))).unwrap();
    assert_eq!(u64::from_le_bytes(v[..8].try_into().unwrap()), 20);
    drop(tx);
    let slow = slow_mem(&m, &clock, crate::alloc::MIN_REUSE_MS / 4);
    let mut tx = c.begin();
    let r = block_on(tx.read(&slow, l.obj_addr(1)));
    assert!(
        matches!(r, Err(RtxError::Aborted(AbortReason::StaleRead))),
        "{r:?}"
    );
    // Nothing was changed on the memory node.
    assert_eq!(value(&m, &l, 1), 20);
    assert!(block_on(m.read_u64(l.obj_addr(1))).is_ok());
}

/// A remembered data pointer sends the data READ beside the TXObj READ; the value is
/// kept only when the TXObj still points there. After another client's update the old
/// block is overwritten here (as a reuse would), so a read that trusted its stale
/// pointer would return 999.
#[test]
fn a_remembered_data_pointer_is_used_only_while_it_is_current() {
    let (l, clock) = (layout(), ManualClock::new(T0));
    let m = region(&l);
    let mut a = client(&l, 0, clock.clone(), Config::default());
    let mut b = client(&l, 1, clock.clone(), Config::default());
    let read = |c: &mut Client<ManualClock>| {
        let mut tx = c.begin();
        let v = block_on(tx.read(&m, l.obj_addr(2))).unwrap();
        block_on(tx.commit(&m)).unwrap();
        u64::from_le_bytes(v[..8].try_into().unwrap())
    };
    let hints = |c: &Client<ManualClock>| (c.stats().hint_hits, c.stats().hint_misses);
    assert_eq!(read(&mut a), 30);
    assert_eq!(hints(&a), (0, 0), "nothing remembered yet");
    assert_eq!(read(&mut a), 30);
    assert_eq!(hints(&a), (1, 0));
    let old = Dptr::decode(dptr(&m, &l, 2)).unwrap();
    block_on(incr(&mut b, &m, &l, &[2])).unwrap();
    m.write_now(l.block_addr(old.block), &999u64.to_le_bytes())
        .unwrap();
    assert_eq!(read(&mut a), 31, "a stale pointer's block is not the value");
    assert_eq!(hints(&a), (1, 1));
    assert_eq!(read(&mut a), 31);
    assert_eq!(hints(&a), (2, 1));
    // The writer remembers the pointer it installed.
    assert_eq!(read(&mut b), 31);
    assert_eq!(hints(&b), (1, 0));
    // Switched off, nothing is remembered.
    let mut c = client(
        &l,
        2,
        clock,
        Config {
            dptr_hints: 0,
            ..Config::default()
        },
    );
    assert_eq!((read(&mut c), read(&mut c)), (31, 31));
    assert_eq!(hints(&c), (0, 0));
}
