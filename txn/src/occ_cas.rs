//! OCC-CAS: the FaRM / FORD baseline over the CVT store (FaRM, NSDI '14, 4; FORD, FAST
//! '22, 3), single-version in effect: every read takes the newest version.
//!
//! - **Execute**: READ the CVT (cached address), then the newest version's record. A CVT
//!   whose lock word is held aborts at once ([`AbortReason::LockedOnRead`]): it would
//!   fail validation anyway. Writes are buffered.
//! - **Lock**: one-sided CAS of each written object's lock word from 0 to the
//!   transaction's id, all in one round; a CAS that finds it held aborts (no waiting,
//!   so no deadlock). A key with no CVT yet (an insert) gets one, locked, now.
//! - **Validate**: one READ per object of the whole CVT: the newest version must be the
//!   one read, and an object only read must not be locked. The lock word and the cells
//!   travel in one READ of one CVT, as in Motor's validation (5.1, phase 2). That is the
//!   safe order (lock word no later than version) when a READ takes the CVT's bytes in
//!   ascending address order (the lock word sits below the cells): a writer holds the
//!   lock from before it installs until after, so a READ that sees the lock free and then
//!   the old cell saw a moment, after this transaction's locks were taken, when the
//!   object was unlocked and unchanged. The shm fabric copies in ascending order; RNICs
//!   fetch a small READ's cache lines in order in practice, which Motor relies on too.
//!   (Scythe keeps its locks on another node and needs two rounds.) Objects under our
//!   own lock are checked too: their CVT was read before the lock was taken.
//! - **Write back**: the new version (old + 1) in the victim cell (record, then cell),
//!   then every lock word WRITTEN back to 0.
//!
//! Over replicated partitions it commits as FORD does ([`crate::ford`]): undo logs of
//! the old records to every memory node (issued with the lock and validation rounds,
//! awaited before the installs), the coalescent commit with the invisible bit, and
//! readers that wait for invisible items. With
//! [`crate::config::TxnConfig::ford_backup_reads`], a read-only transaction reads
//! each object from a backup and validates it there (FORD's backup-enabled read).

use rrpc::runtime::join_all;
use tso::Timestamp;

use crate::attempt::Obj;
use crate::error::{AbortReason, TxnError};
use crate::phase::Phase;
use crate::protocol::{AttemptOf, ConcurrencyControl, Want};

/// OCC-CAS. Its attempts carry no state beyond the shared one; an object carries the
/// backup it was read from, if any ([`Backup`]).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct OccCas;

/// Where an object was read: `Some(m)` from backup memory node `m` (FORD's
/// backup-enabled read), validated there; `None` from its primary.
type Backup = Option<u32>;

type A<'a> = AttemptOf<'a, OccCas>;

impl ConcurrencyControl for OccCas {
    type State = ();
    type ObjState = Backup;

    /// Execution reads of `want`, in one round: from the primaries, or with FORD's
    /// backup-enabled reads on, a read-only transaction's from backups.
    async fn fetch(&self, t: &mut A<'_>, want: &[Want]) -> Result<(), TxnError> {
        let core = t.core;
        let read_only = t.read_only;
        #[cfg(feature = "fault-injection")]
        let read_only = read_only || crate::fault::ford_backup_reads_in_rw();
        let on_backup = read_only && core.cfg.ford_backup_reads && core.store.replicas() > 1;
        let id = t.id;
        let got = join_all(want.iter().map(|&(tb, k, u)| async move {
            if on_backup && !u {
                // Spread over the backups by key and attempt.
                let pick = k ^ id.rotate_left(17);
                if let Some((mut o, m)) = Obj::read_newest_on_backup(core, tb, k, pick).await? {
                    o.cc = Some(m);
                    return Ok(o);
                }
            }
            Obj::read_newest(core, tb, k, true).await
        }))
        .await;
        for (o, &(_, _, u)) in got.into_iter().zip(want) {
            let mut o: Obj<Backup> = o?;
            o.for_update = u;
            t.objs.push(o);
        }
        Ok(())
    }

    /// Lock, validate, write back (the caller releases the locks).
    async fn commit(&self, t: &mut A<'_>) -> Result<(), TxnError> {
        let writes = t.objs.iter().any(|o| o.write.is_some());
        if !writes && t.objs.len() <= 1 {
            // One object read once is a consistent snapshot by itself.
            t.record(None, Timestamp::ZERO);
            return Ok(());
        }
        let version = |o: &Obj<Backup>| Timestamp(o.version.get() + 1);
        if writes && t.core.store.replicas() > 1 {
            // FORD: the undo logs travel while the locks are taken and validated.
            let core = t.core;
            let undo = crate::ford::undo_log(
                t.id,
                t.objs
                    .iter()
                    .filter(|o| o.write.is_some())
                    .map(|o| (o.table, o.key, o.version, o.value.as_deref()))
                    .collect::<Vec<_>>()
                    .into_iter(),
            );
            let slot = t.log_slot_no();
            let checked = async {
                t.enter(Phase::Lock);
                lock_writes(t).await?;
                t.enter(Phase::Validate);
                validate(t).await
            };
            let (checked, logged) =
                rrpc::runtime::join(checked, crate::ford::write_undo(core, slot, &undo)).await;
            checked?;
            logged?;
            t.enter(Phase::WriteBack);
            t.write_back_invisible(version).await?;
            t.record(None, Timestamp::ZERO);
            return Ok(());
        }
        t.enter(Phase::Lock);
        lock_writes(t).await?;
        t.enter(Phase::Validate);
        validate(t).await?;
        if writes {
            t.enter(Phase::WriteBack);
            t.write_back(version).await?;
        }
        t.record(None, Timestamp::ZERO);
        Ok(())
    }

    /// Over replicas, FORD's visible-and-unlock round on every copy; else the lock
    /// words.
    async fn release(&self, t: &mut A<'_>) -> Result<(), TxnError> {
        if t.core.store.replicas() > 1 {
            t.release_invisible().await
        } else {
            t.release_cvt_locks().await
        }
    }
}

/// Lock the written objects (creating the CVTs of inserted keys), one round.
async fn lock_writes(t: &mut A<'_>) -> Result<(), TxnError> {
    let (core, id) = (t.core, t.id);
    let todo: Vec<usize> = (0..t.objs.len())
        .filter(|&i| t.objs[i].write.is_some() && !t.objs[i].locked)
        .collect();
    let results = join_all(todo.iter().map(|&i| {
        let o = &t.objs[i];
        let (table, key, loc) = (o.table, o.key, o.loc);
        async move {
            match loc {
                Some(loc) => {
                    let prev = core.store.lock(loc, 0, id).await?;
                    Ok((loc, None, prev == 0))
                }
                None => {
                    let (loc, cvt) = core.store.create(table, key, id, id).await?;
                    Ok::<_, TxnError>((loc, Some(cvt), true))
                }
            }
        }
    }))
    .await;
    let mut failed = None;
    for (&i, r) in todo.iter().zip(results) {
        match r {
            Ok((loc, cvt, got)) => {
                let o = &mut t.objs[i];
                o.loc = Some(loc);
                if cvt.is_some() {
                    o.cvt = cvt;
                }
                o.locked = got;
                if !got {
                    failed.get_or_insert(TxnError::Abort(AbortReason::LockCas));
                }
            }
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Re-read every object's CVT (for an object without one, its bucket chain) and check
/// it: the newest version is the one read, and an object not locked by us is not locked.
/// The CVTs of locked objects are kept for the write-back.
async fn validate(t: &mut A<'_>) -> Result<(), TxnError> {
    let store = &t.core.store;
    // An object read from a backup is validated on that backup (FORD's
    // `IssueRemoteValidate`): its own copy's version and INVISIBLE mark.
    let seen = join_all(t.objs.iter().map(|o| async move {
        match (o.cc, o.loc) {
            (Some(m), Some(loc)) => store.read_cvt_on(loc, m).await.map(Some),
            _ => store.reread(o.table, o.key, o.loc).await,
        }
    }))
    .await;
    let mut reason = None;
    #[cfg(feature = "fault-injection")]
    let skip = crate::fault::skipping_read_only_validation();
    #[cfg(not(feature = "fault-injection"))]
    let skip = false;
    for (o, cvt) in t.objs.iter_mut().zip(seen) {
        let cvt = cvt?;
        if skip && !o.locked {
            // Broken on purpose (fault injection): objects only read go unchecked.
            continue;
        }
        let (version, lock) = match &cvt {
            Some(cvt) => (cvt.newest_version(), cvt.header.lock),
            None => (Timestamp::ZERO, 0),
        };
        if version != o.version {
            reason.get_or_insert(AbortReason::ValidationVersion);
        } else if !o.locked && lock != 0 {
            reason.get_or_insert(AbortReason::ValidationLocked);
        }
        if o.locked {
            o.cvt = cvt;
        }
    }
    match reason {
        Some(r) => Err(TxnError::Abort(r)),
        None => Ok(()),
    }
}
