//! Scythe's hot-aware concurrency control on Takeout Locks (000_f3dba2ed893b246b.txt,
//! 4.2 to 4.4), over the CVT store (newest version only; the CVT lock words are unused:
//! the locks live in the lock service).
//!
//! Each attempt picks its mode when it first reads (4.2.1 (1)): if the lock service
//! last reported any of the objects hotter than ColdWatermark
//! ([`lockd::client::LockClient::mode_for`], heat seen by execution reads, Lock replies
//! and ticket polls), the attempt runs TOCC, else OCC. A refusal past ColdWatermark
//! therefore sends the retry to TOCC, and a cooled object brings it back.
//!
//! **OCC (low heat, 4.2.1, Fig. 12 (a))**:
//! - execution reads the CVT and record together with the object's Takeout Lock words;
//!   a lock held or queued aborts at once (4.2.1 (3));
//! - at commit, one timestamp (through the thread's TSO group), one cold-mode Lock RPC
//!   per 15 written objects (parallel locking, 4.2.1 (2)), tickets waited for with
//!   Hangout polling;
//! - validation ([`crate::validation`]): lock words of objects only read first, their
//!   CVT only after they were seen free (the two live on different nodes; the other order
//!   lets write skew commit); written objects' CVTs in the first round;
//! - write-back (version + 1), then every ticket released (FAA of `upper`).
//!
//! **TOCC (high heat, 4.2.2, Fig. 12 (b), 4.4)**: the timestamp is taken at the first
//! read; every read takes a hot-mode ticket on its object (one Lock RPC per round, the
//! lock service sorting a polling round's requests by (lock, timestamp)) and reads once
//! the ticket is served; writes are buffered and installed at commit under the tickets
//! already held: no validation (every object read stays locked until commit). Before a
//! hot request on an object whose last seen queue lies between ColdWatermark and
//! HotWatermark the coordinator waits [`crate::coordinator::TxnConfig::tocc_wait`] (4.4
//! (2), Aurogon's heuristic wait), so requests with smaller timestamps get there first.
//! A refusal (a newer timestamp already queued, or past HotWatermark) aborts.
//!
//! Deadlock freedom (4.4 (1)): a lock queue admits only timestamps at least its
//! `queued_ts`, so each queue is in timestamp order and a transaction waits only for
//! holders with smaller timestamps, in either mode.

use std::time::Instant;

use lockd::client::{Grant, LockError, LockRequest};
use lockd::takeout::{Mode, RefuseReason};
use rrpc::runtime::{join, join_all};
use tso::Timestamp;

use crate::coordinator::{AbortReason, Txn, TxnClient, TxnError};
use crate::occ_cas::{newest_version, write_back};
use crate::validation::{self, RecordSeen, Step, Validation};

fn locks(c: &TxnClient) -> &lockd::client::LockClient {
    c.locks
        .as_ref()
        .expect("Scythe clients connect a lock service")
}

/// True when lock `id` is held or queued (by anyone).
async fn lock_busy(c: &TxnClient, id: u64) -> Result<bool, TxnError> {
    Ok(locks(c).read_state(c.store.ctx(), id).await?.queued() > 0)
}

/// Execution reads of `want` (objects not in the read set yet).
pub(crate) async fn fetch(t: &mut Txn<'_>, want: &[(u32, u64, bool)]) -> Result<(), TxnError> {
    let c = t.c;
    if t.objs.is_empty() && t.tickets.is_empty() {
        t.tocc = want
            .iter()
            .any(|&(tb, k, _)| locks(c).mode_for(c.lock_id(tb, k)) == Mode::Hot);
    }
    if t.tocc {
        let ids: Vec<u64> = want.iter().map(|&(tb, k, _)| c.lock_id(tb, k)).collect();
        take_tickets(t, &ids, Mode::Hot).await?;
        let got = join_all(want.iter().map(|&(tb, k, _)| c.read_newest(tb, k, false))).await;
        for o in got {
            t.objs.push(o?);
        }
        return Ok(());
    }
    let got = join_all(want.iter().map(|&(tb, k, _)| async move {
        let (o, busy) = join(c.read_newest(tb, k, false), lock_busy(c, c.lock_id(tb, k))).await;
        if busy? {
            return Err(TxnError::Abort(AbortReason::LockedOnRead));
        }
        o
    }))
    .await;
    for o in got {
        t.objs.push(o?);
    }
    Ok(())
}

/// Take tickets on `ids` (those not held yet, deduplicated) in `mode` with the
/// transaction's timestamp (taken now if it has none), and wait until each is served.
/// Tickets taken are kept in the transaction, so that every path releases them.
async fn take_tickets(t: &mut Txn<'_>, ids: &[u64], mode: Mode) -> Result<(), TxnError> {
    let c = t.c;
    let lc = locks(c);
    let mut ids: Vec<u64> = ids
        .iter()
        .copied()
        .filter(|id| !t.tickets.iter().any(|(h, _)| h == id))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.is_empty() {
        return Ok(());
    }
    let ts = match t.start {
        Some(ts) => ts,
        None => *t.start.insert(c.timestamp().await?),
    };
    if mode == Mode::Hot && !c.cfg.tocc_wait.is_zero() {
        let (cold, hot) = (lc.export().cold_watermark, lc.export().hot_watermark);
        if ids
            .iter()
            .any(|&id| lc.heat(id).is_some_and(|h| h > cold && h <= hot))
        {
            c.store.ctx().sleep(c.cfg.tocc_wait).await;
        }
    }
    let first_new = t.tickets.len();
    let mut refused = None;
    for chunk in ids.chunks(lockd::wire::MAX_ENTRIES) {
        let reqs: Vec<LockRequest> = chunk
            .iter()
            .map(|&id| LockRequest {
                id,
                ts: ts.get(),
                mode,
            })
            .collect();
        for g in lc.lock(c.store.ctx(), &reqs).await? {
            match g {
                Grant::Queued(tk) => t.tickets.push((tk.id(), tk)),
                Grant::Refused(r) => {
                    refused.get_or_insert(match r.reason {
                        Some(RefuseReason::Timestamp) => AbortReason::LockRefusedTimestamp,
                        Some(RefuseReason::HotWatermark) => AbortReason::LockRefusedHot,
                        _ => AbortReason::LockRefusedCold,
                    });
                }
            }
        }
    }
    if let Some(reason) = refused {
        return Err(TxnError::Abort(reason));
    }
    let deadline = Instant::now() + c.cfg.lock_wait;
    let waits = join_all(
        t.tickets[first_new..]
            .iter_mut()
            .map(|(_, tk)| tk.wait(deadline)),
    )
    .await;
    if let Some(e) = waits.into_iter().find_map(Result::err) {
        // The tickets keep their places; the caller's release (or the transaction's
        // drop) hands each to a coroutine that releases it when its turn comes.
        return Err(match e {
            LockError::WaitTimeout { .. } => TxnError::Abort(AbortReason::LockWaitTimeout),
            e => e.into(),
        });
    }
    Ok(())
}

/// Commit: OCC (lock, validate, write back) or TOCC (write back under the tickets held).
/// The caller releases the tickets.
pub(crate) async fn commit(t: &mut Txn<'_>) -> Result<(), TxnError> {
    let c = t.c;
    let writes = t.objs.iter().any(|o| o.write.is_some());
    if !t.tocc && !writes && t.objs.len() <= 1 {
        t.record(None, Timestamp::ZERO);
        return Ok(());
    }
    if !t.tocc {
        let ids: Vec<u64> = t
            .objs
            .iter()
            .filter(|o| o.write.is_some())
            .map(|o| c.lock_id(o.table, o.key))
            .collect();
        take_tickets(t, &ids, Mode::Cold).await?;
    }
    // Inserted keys without a CVT get one now, under their ticket (no lock word).
    for i in 0..t.objs.len() {
        let o = &t.objs[i];
        if o.write.is_some() && o.loc.is_none() {
            let (loc, cvt) = c.store.create(o.table, o.key, 0, t.id).await?;
            let o = &mut t.objs[i];
            o.loc = Some(loc);
            o.cvt = Some(cvt);
        }
    }
    if t.tocc {
        // Every object was read under its served ticket: the CVTs read are current.
        if writes {
            write_back(t, |o| Timestamp(o.version.get() + 1)).await?;
        }
        t.record(None, Timestamp::ZERO);
        return Ok(());
    }
    validate(t).await?;
    if writes {
        write_back(t, |o| Timestamp(o.version.get() + 1)).await?;
    }
    t.record(None, Timestamp::ZERO);
    Ok(())
}

/// OCC validation with the write set's tickets served ([`crate::validation`]); keeps the
/// current CVTs of objects under our tickets for the write-back.
async fn validate(t: &mut Txn<'_>) -> Result<(), TxnError> {
    let c = t.c;
    let held: Vec<u64> = t.tickets.iter().map(|(id, _)| *id).collect();
    let mut index = Vec::with_capacity(t.objs.len());
    let mut entries = Vec::with_capacity(t.objs.len());
    for (i, o) in t.objs.iter().enumerate() {
        let locked_by_me = held.contains(&c.lock_id(o.table, o.key));
        #[cfg(feature = "fault-injection")]
        if !locked_by_me && crate::fault::skipping_read_only_validation() {
            continue;
        }
        index.push(i);
        entries.push(validation::Entry {
            version: o.version.get(),
            locked_by_me,
        });
    }
    let mut v = Validation::new(entries);
    let mut step = v.start();
    loop {
        let round = match step {
            Step::Done(r) => return r.map_err(TxnError::Abort),
            Step::Read(round) => round,
        };
        let objs = &t.objs;
        let busy = round.locks.iter().map(|&k| {
            let o = &objs[index[k]];
            lock_busy(c, c.lock_id(o.table, o.key))
        });
        let records = round.records.iter().map(|&k| {
            let o = &objs[index[k]];
            c.store.reread(o.table, o.key, o.loc)
        });
        let (busy, seen) = join(join_all(busy), join_all(records)).await;
        let busy = busy.into_iter().collect::<Result<Vec<bool>, _>>()?;
        let mut versions = Vec::with_capacity(seen.len());
        for (&k, cvt) in round.records.iter().zip(seen) {
            let cvt = cvt?;
            versions.push(RecordSeen::Version(
                cvt.as_ref().map_or(Timestamp::ZERO, newest_version).get(),
            ));
            let o = &mut t.objs[index[k]];
            if o.write.is_some() {
                o.cvt = cvt;
            }
        }
        step = v.observe(&round, &busy, &versions);
    }
}
