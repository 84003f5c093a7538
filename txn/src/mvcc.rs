//! Motor's MVCC over CVTs (Motor, 5.1 and 5.2), serializable (SR) or
//! snapshot isolation (SI).
//!
//! - **Start**: a start timestamp `s` from the TSO (the thread's group) at the first read.
//! - **Read-only data**: READ the CVT, select the largest valid version below `s`
//!   ([`crate::cvt::Cvt::select`]), READ its record, check the anchors against the cell.
//!   No version below `s` while some cell is empty: the key did not exist at `s`; no
//!   version below `s` with every cell full: GC took it ([`AbortReason::VersionGone`]).
//! - **Read-write data** (`for_update`, inserts, deletes): CAS the CVT's lock word and
//!   READ the CVT in one round (Motor's CAS+READ; a READ that did not see our lock word
//!   came before the CAS and is repeated), then READ the record. A version newer than `s` aborts
//!   ([`AbortReason::NewerVersion`]): under SR Motor's early abort (the validation would
//!   fail), under SI first-committer-wins (installing over it would lose its update).
//!   An object read as read-only data and then written is locked at commit and must still
//!   show the version read.
//! - **Commit**: a commit timestamp `c`; under SR the read-only data of a read-write
//!   transaction is validated: its CVT must be unlocked and [`Cvt::select`]`(c)` must be
//!   the version read (Motor 5.1, phase 2); under SI nothing is validated. Each write
//!   goes to the victim cell (coordinator-active GC, Motor 4.3) as version `c`, then the
//!   locks are released. Read-only transactions commit at once, without validation.
//!
//! **Locked CVTs and read-only data.** Motor lets reads ignore locks. Alone, that is
//! unsafe for reads that are never validated (read-only transactions, and read-write
//! transactions under SI): a writer that took its commit timestamp `c < s` may have
//! installed some of its versions and not yet others, and a reader would see half of it
//! (a fractured read: a cycle in the serialization graph, a snapshot violation under
//! SI). Reads here ignore locks too, but remember that the CVT was locked (by another
//! transaction). Such a read, unless the SR validation at `c` covers it anyway, is
//! checked at commit: the CVT is READ again, and must be unlocked (a read-only
//! transaction, which holds no lock, waits up to
//! [`crate::coordinator::TxnConfig::read_wait`] for that; one holding locks aborts at
//! once, [`AbortReason::ValidationLocked`]) and must still show the version read at `s`
//! ([`AbortReason::ValidationVersion`] otherwise: a version below `s` landed after the
//! read). A read that saw the CVT unlocked needs no check: a writer takes its commit
//! timestamp after its lock, so one that locked later commits after `s`, and one that
//! unlocked earlier had installed everything (the lock word lies below the cells in the
//! one READ of the CVT, see [`crate::occ_cas`] on that order).
//!
//! **UNSAFE no-CAS variant** ([`crate::config::TxnConfig::unsafe_no_lock_cas`], for
//! Lotus's Fig. 3 premise only): a read-write object's CVT is READ without the lock CAS
//! and counted as held (`MvccObj::held_no_cas`); its lock word is never written, so
//! nothing is released for it. The validation of read-only data stays. Concurrent writers
//! of one object both commit: the histories it produces are not serializable.
//!
//! [`Cvt::select`]: crate::cvt::Cvt::select

use std::time::{Duration, Instant};

use rrpc::runtime::join_all;
use tso::Timestamp;

use crate::attempt;
use crate::client_core::ClientCore;
use crate::config::Isolation;
use crate::cvt::Cvt;
use crate::cvt_remote::CvtLoc;
use crate::error::{AbortReason, TxnError};
use crate::phase::Phase;
use crate::protocol::{AttemptOf, ConcurrencyControl, Want};

/// Motor's MVCC at one isolation level.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mvcc {
    /// Serializable or snapshot isolation.
    pub isolation: Isolation,
}

/// MVCC's state of an object read.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MvccObj {
    /// The CVT was locked by another transaction when this one read it (module docs,
    /// locked CVTs).
    seen_locked: bool,
    /// UNSAFE no-CAS variant (module docs): treated as locked by this transaction
    /// although its lock word was never CASed (so never released either).
    held_no_cas: bool,
}

/// The transaction treats `o` as locked: it holds the CVT's lock word, or (UNSAFE
/// no-CAS variant) read it for update without the CAS.
fn held(o: &Obj) -> bool {
    o.locked || o.cc.held_no_cas
}

type Obj = attempt::Obj<MvccObj>;
type A<'a> = AttemptOf<'a, Mvcc>;

impl ConcurrencyControl for Mvcc {
    type State = ();
    type ObjState = MvccObj;

    /// An object read as read-only data and now read for update is locked now.
    fn refetch(&self, o: &Obj, for_update: bool) -> bool {
        for_update && !held(o)
    }

    async fn fetch(&self, t: &mut A<'_>, want: &[Want]) -> Result<(), TxnError> {
        fetch(self.isolation, t, want).await
    }

    async fn commit(&self, t: &mut A<'_>) -> Result<(), TxnError> {
        commit(self.isolation, t).await
    }
}

/// The version of the CVT visible at `ts` (ZERO for none), and whether the CVT could
/// still hold an older one (some cell empty): `(version, cell)`, or `Err` when every
/// version is at or after `ts` and every cell is full (GC took the one wanted). Lotus
/// selects its versions the same way ([`crate::lotus`]).
pub(crate) fn visible(cvt: &Cvt, ts: Timestamp) -> Result<Option<usize>, AbortReason> {
    match cvt.select(ts) {
        Some(i) => Ok(Some(i)),
        None if cvt.cells.iter().any(|c| !c.valid) => Ok(None),
        None => Err(AbortReason::VersionGone),
    }
}

/// Fill `o` from `cvt` as seen at `ts`: version, value (READ of the record).
async fn read_at(
    c: &ClientCore,
    o: &mut Obj,
    loc: CvtLoc,
    cvt: Cvt,
    ts: Timestamp,
) -> Result<(), TxnError> {
    let cell = visible(&cvt, ts).map_err(TxnError::Abort)?;
    o.fill(c, loc, cvt, cell).await
}

/// A read of read-only data at `s` (see the module docs on locked CVTs).
async fn read_snapshot(
    c: &ClientCore,
    table: u32,
    key: u64,
    s: Timestamp,
    early_abort: bool,
) -> Result<Obj, TxnError> {
    let mut o = Obj::absent(table, key);
    let Some((loc, cvt)) = c.store.lookup(table, key).await? else {
        return Ok(o);
    };
    o.cc.seen_locked = cvt.header.lock != 0;
    if early_abort && cvt.newer_than(s) {
        return Err(TxnError::Abort(AbortReason::NewerVersion));
    }
    read_at(c, &mut o, loc, cvt, s).await?;
    Ok(o)
}

/// Lock `(table, key)`'s CVT (creating it, locked, if the key has none) and read it under
/// the lock at `s`: the newest version must be older than `s`. Returns the object
/// (`locked` when the lock was taken, so that the caller releases it on every path) and
/// the outcome.
async fn lock_and_read(
    c: &ClientCore,
    id: u64,
    table: u32,
    key: u64,
    loc: Option<CvtLoc>,
    s: Timestamp,
) -> (Obj, Result<(), TxnError>) {
    let mut o = Obj::absent(table, key);
    let r = async {
        let loc = match loc.or_else(|| c.store.cached(table, key)) {
            Some(l) => Some(l),
            None => c.store.lookup(table, key).await?.map(|(l, _)| l),
        };
        let (loc, cvt) = match loc {
            Some(loc) if c.cfg.unsafe_no_lock_cas => {
                // UNSAFE (module docs): the READ of the CAS+READ round only.
                let cvt = c.store.read_cvt(loc).await?;
                if (cvt.header.table, cvt.header.key) != (table, key) {
                    c.store.forget(table, key);
                    return Err(TxnError::Abort(AbortReason::TornRead));
                }
                o.loc = Some(loc);
                o.cc.held_no_cas = true;
                (loc, cvt)
            }
            Some(loc) => {
                // CAS and READ in one round (Motor's doorbell-batched CAS+READ); a READ
                // that did not see our lock word saw the CVT before the CAS and is
                // repeated.
                let (prev, cvt) =
                    rrpc::runtime::join(c.store.lock(loc, 0, id), c.store.read_cvt(loc)).await;
                if prev? != 0 {
                    return Err(TxnError::Abort(AbortReason::LockCas));
                }
                o.loc = Some(loc);
                o.locked = true;
                let mut cvt = cvt?;
                if cvt.header.lock != id {
                    cvt = c.store.read_cvt(loc).await?;
                }
                if (cvt.header.table, cvt.header.key) != (table, key) {
                    // A stale cache entry: we locked another key's CVT. Give it back
                    // and abort; the retry searches the index.
                    o.locked = false;
                    c.store.lock(loc, id, 0).await?;
                    c.store.forget(table, key);
                    return Err(TxnError::Abort(AbortReason::TornRead));
                }
                (loc, cvt)
            }
            None => {
                let (loc, cvt) = c.store.create(table, key, id, id).await?;
                o.loc = Some(loc);
                o.locked = true;
                (loc, cvt)
            }
        };
        if cvt.newer_than(s) {
            // Committed after this transaction began.
            return Err(TxnError::Abort(AbortReason::NewerVersion));
        }
        read_at(c, &mut o, loc, cvt, s).await
    }
    .await;
    (o, r)
}

/// Execution reads of `want` (read-only data read at `s`, read-write data locked), in one
/// round.
async fn fetch(iso: Isolation, t: &mut A<'_>, want: &[Want]) -> Result<(), TxnError> {
    let s = t.timestamp().await?;
    let c = t.core;
    let sr = iso == Isolation::Serializable;
    let holds = t.objs.iter().any(held) || want.iter().any(|w| w.2);
    let id = t.id;
    let existing: Vec<Option<usize>> = want.iter().map(|&(tb, k, _)| t.find(tb, k)).collect();
    let got = join_all(want.iter().zip(&existing).map(|(&(tb, k, upd), &ex)| {
        let loc = ex.and_then(|i| t.objs[i].loc);
        async move {
            if upd {
                lock_and_read(c, id, tb, k, loc, s).await
            } else {
                // SR aborts early on newer versions only in a transaction that writes.
                match read_snapshot(c, tb, k, s, sr && holds).await {
                    Ok(o) => (o, Ok(())),
                    Err(e) => (Obj::absent(tb, k), Err(e)),
                }
            }
        }
    }))
    .await;
    // Keep every lock taken before reporting any failure, so that it is released.
    let mut failed = None;
    for ((o, r), ex) in got.into_iter().zip(existing) {
        if let Err(e) = r {
            failed.get_or_insert(e);
        }
        match ex {
            Some(i) => {
                // Read before as read-only data, locked now: it must be unchanged.
                let prev = &mut t.objs[i];
                let took = held(&o);
                prev.locked |= o.locked;
                prev.cc.held_no_cas |= o.cc.held_no_cas;
                if took {
                    prev.loc = o.loc;
                    if o.cvt.is_some() && o.version != prev.version {
                        failed.get_or_insert(TxnError::Abort(AbortReason::NewerVersion));
                    }
                    prev.cvt = o.cvt;
                }
            }
            None if held(&o) || failed.is_none() => t.objs.push(o),
            None => {}
        }
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Commit (the caller releases the locks).
async fn commit(iso: Isolation, t: &mut A<'_>) -> Result<(), TxnError> {
    let c = t.core;
    let Some(s) = t.start else {
        return Ok(()); // Nothing read, nothing written.
    };
    if t.objs.iter().all(|o| o.write.is_none()) {
        // Read-only: a snapshot at `s` (Motor 5.1, "Processing Read-Only Transactions"),
        // once the reads that met a lock are known not to be fractured.
        t.enter(Phase::Validate);
        check_locked_reads(t, s, true).await?;
        t.record(Some((s, s)), Timestamp::ZERO);
        return Ok(());
    }
    // Written objects read as read-only data: lock them now.
    let late: Vec<(u32, u64, bool)> = t
        .objs
        .iter()
        .filter(|o| o.write.is_some() && !held(o))
        .map(|o| (o.table, o.key, true))
        .collect();
    if !late.is_empty() {
        t.enter(Phase::Lock);
        fetch(iso, t, &late).await?;
    }
    t.enter(Phase::Timestamp);
    let commit_ts = c.timestamp().await?;
    t.enter(Phase::Validate);
    match iso {
        Isolation::Serializable => validate(t, commit_ts).await?,
        Isolation::Snapshot => check_locked_reads(t, s, false).await?,
    }
    t.enter(Phase::WriteBack);
    t.write_back(|_| commit_ts).await?;
    t.record(Some((s, commit_ts)), commit_ts);
    Ok(())
}

/// The commit-time check of reads that met a locked CVT (module docs): READ the CVT
/// again until it is unlocked (waiting only with `wait`, up to the read wait), then the
/// version visible at `s` must be the one read.
async fn check_locked_reads(t: &mut A<'_>, s: Timestamp, wait: bool) -> Result<(), TxnError> {
    let c = t.core;
    let checks = t
        .objs
        .iter()
        .filter(|o| o.cc.seen_locked && !held(o))
        .filter_map(|o| o.loc.map(|l| (l, o.version)));
    let results = join_all(checks.map(|(loc, version)| async move {
        let deadline = Instant::now() + c.cfg.read_wait;
        let mut pause = Duration::from_micros(2);
        let mut cvt = c.store.read_cvt(loc).await?;
        while cvt.header.lock != 0 {
            if !wait || Instant::now() >= deadline {
                return Err(TxnError::Abort(AbortReason::ValidationLocked));
            }
            c.store.ctx().sleep(pause).await;
            pause = (pause * 2).min(Duration::from_micros(50));
            cvt = c.store.read_cvt(loc).await?;
        }
        let now = cvt
            .select(s)
            .map_or(Timestamp::ZERO, |i| cvt.cells[i].version);
        if now != version {
            return Err(TxnError::Abort(AbortReason::ValidationVersion));
        }
        Ok(())
    }))
    .await;
    results.into_iter().collect()
}

/// SR validation of read-only data at the commit timestamp (Motor 5.1, phase 2).
async fn validate(t: &mut A<'_>, commit_ts: Timestamp) -> Result<(), TxnError> {
    let c = t.core;
    #[cfg(feature = "fault-injection")]
    if crate::fault::skipping_read_only_validation() {
        return Ok(());
    }
    let seen = join_all(
        t.objs
            .iter()
            .filter(|o| !held(o))
            .map(|o| c.store.reread(o.table, o.key, o.loc)),
    )
    .await;
    for (o, cvt) in t.objs.iter().filter(|o| !held(o)).zip(seen) {
        let Some(cvt) = cvt? else { continue };
        if cvt.header.lock != 0 {
            return Err(TxnError::Abort(AbortReason::ValidationLocked));
        }
        let now = cvt
            .select(commit_ts)
            .map_or(Timestamp::ZERO, |i| cvt.cells[i].version);
        if now != o.version {
            return Err(TxnError::Abort(AbortReason::ValidationVersion));
        }
    }
    Ok(())
}
