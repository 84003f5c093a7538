//! FORD's commit over replicas (FORD, FAST '22, 3.3 and 3.4, as its public code does
//! it): what occ-cas does when the partitions have backups, so that a comparison with
//! Motor's MVCC (whose one-round commit writes every copy and needs no undo, Motor 5.1
//! and 5.3) pays what FORD pays.
//!
//! - **Parallel undo logging**: before any install, the old records of the written
//!   objects (with the transaction's id) are WRITTEN to the undo-log region of every
//!   memory node, and the commit waits for all of them (FORD updates in place, so its
//!   undo is the only old copy). Issued with the lock and validation rounds, awaited
//!   before the installs. The CVT store keeps old versions anyway, so recovery never
//!   reads these logs: they are the baseline's cost, written in full.
//! - **Coalescent commit**: per object and copy, one ordered WR list on one QP: the
//!   lock word WRITTEN to `id | INVISIBLE` on the primary (`INVISIBLE` alone on a
//!   backup), then the record and the cell. One round for all copies.
//! - **Visible and unlock**: the next round clears the lock word on every copy (the
//!   primary's with CAS from `id | INVISIBLE`, so a word recovery already released is
//!   left alone; the backups' with WRITE).
//! - **Readers wait for invisible items**: a read that finds [`INVISIBLE`] in a lock
//!   word READs the CVT again until it clears (FORD's blocked reads), where a plainly
//!   locked word aborts the reader as before.

use rrpc::fabric::RemoteAddr;
use rrpc::runtime::{join_all, ThreadCtx};
use rrpc::NodeId;
use tso::Timestamp;

use crate::client_core::ClientCore;
use crate::cvt::{Cvt, LOCK_OFFSET};
use crate::cvt_remote::{CvtLoc, CvtRemote, OwnedWrite};
use crate::error::TxnError;
pub use crate::txn_id::INVISIBLE;

/// Bytes of an undo log's header: the transaction id and the entry count.
const UNDO_HEADER_BYTES: usize = 16;

/// One written object's undo entry: `table:4 | len:4 | key:8 | version:8 | old record`
/// (`len` 0 when the object had no value: an insert, a tombstone).
fn push_entry(out: &mut Vec<u8>, table: u32, key: u64, version: Timestamp, old: Option<&[u8]>) {
    let old = old.unwrap_or(&[]);
    out.extend_from_slice(&table.to_le_bytes());
    out.extend_from_slice(&(old.len() as u32).to_le_bytes());
    out.extend_from_slice(&key.to_le_bytes());
    out.extend_from_slice(&version.get().to_le_bytes());
    out.extend_from_slice(old);
}

/// The undo log of transaction `id` writing `objs` (each `(table, key, version read,
/// old value)`): the header, then one entry per object.
pub fn undo_log<'a>(
    id: u64,
    objs: impl ExactSizeIterator<Item = (u32, u64, Timestamp, Option<&'a [u8]>)>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(UNDO_HEADER_BYTES + objs.len() * 64);
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&(objs.len() as u64).to_le_bytes());
    for (table, key, version, old) in objs {
        push_entry(&mut out, table, key, version, old);
    }
    out
}

/// WRITE `log` into slot `slot_no` of this node's row of the undo-log region of every
/// memory node, and wait for every ACK. A log larger than a slot wraps within it (its
/// bytes all travel: the cost is FORD's; nothing reads them back).
///
/// Errors: [`TxnError::Export`] for a memory node without an undo-log region;
/// [`TxnError::Usage`] for a slot number beyond the region's clients;
/// [`TxnError::Rpc`].
pub(crate) async fn write_undo(
    core: &ClientCore,
    slot_no: u16,
    log: &[u8],
) -> Result<(), TxnError> {
    let store = &core.store;
    let owner = core.owner();
    let mut writes: Vec<(NodeId, RemoteAddr, &[u8])> = Vec::new();
    for m in 0..store.memnode_count() {
        let node = store.memnode(m)?;
        if store.written_off(node) || !store.in_use(m) {
            // A dead memory node keeps nothing; a spare not called on holds no data.
            continue;
        }
        let region = store.undo(m).ok_or_else(|| {
            TxnError::Export(format!(
                "occ-cas over replicas writes FORD's undo logs, but memory node {m} keeps \
                 no undo-log region"
            ))
        })?;
        let at = region.slot(owner.node, slot_no).ok_or_else(|| {
            TxnError::Usage(format!(
                "undo log: more coordinators in flight on {owner} than the {} slots memory \
                 node {m} keeps per node (memnode --log-clients)",
                region.geometry.clients
            ))
        })?;
        for chunk in log.chunks(region.geometry.slot_bytes as usize) {
            writes.push((node, at, chunk));
        }
    }
    let ctx = store.ctx();
    let done = join_all(
        writes
            .iter()
            .map(|&(n, at, d)| async move { (n, crate::transient::write(ctx, n, at, d).await) }),
    )
    .await;
    // A copy on a memory node that died (being failed over) is lost with it.
    store.tolerate(done).await
}

/// One copy's WR list of the coalescent commit of one object: the lock word (`id |
/// INVISIBLE` on the primary, `INVISIBLE` on a backup), then the record and the cell.
/// Returns `(primary?, memory node, list)` per copy, primary first; `cvt` updated as
/// installed.
///
/// Errors: as [`CvtRemote::install_writes`].
pub(crate) fn invisible_install(
    store: &CvtRemote,
    loc: CvtLoc,
    cvt: &mut Cvt,
    victim: usize,
    version: Timestamp,
    value: Option<&[u8]>,
    id: u64,
) -> Result<Vec<(bool, NodeId, Vec<OwnedWrite>)>, TxnError> {
    let copies = store.install_writes(loc, cvt, victim, version, value)?;
    let locks = store.index_copies(loc.part, loc.table, loc.addr + LOCK_OFFSET as u64)?;
    let mut out = Vec::with_capacity(copies.len());
    for (node, [record, cell]) in copies {
        // A copy skipped by a planted fault has no lock word to mark either.
        let Some(i) = locks.iter().position(|&(n, _)| n == node) else {
            continue;
        };
        let primary = i == 0;
        let word = if primary { id | INVISIBLE } else { INVISIBLE };
        out.push((
            primary,
            node,
            vec![(locks[i].1, word.to_le_bytes().to_vec()), record, cell],
        ));
    }
    Ok(out)
}

/// Where the lock words of `locs` live: `(primary?, memory node, address)` for every
/// copy of each.
///
/// Errors: [`TxnError::Usage`] for an unknown table or partition.
pub(crate) fn lock_copies(
    store: &CvtRemote,
    locs: &[CvtLoc],
) -> Result<Vec<(bool, NodeId, RemoteAddr)>, TxnError> {
    let mut targets = Vec::with_capacity(locs.len() * store.replicas() as usize);
    for l in locs {
        let copies = store.index_copies(l.part, l.table, l.addr + LOCK_OFFSET as u64)?;
        for (i, (n, at)) in copies.into_iter().enumerate() {
            targets.push((i == 0, n, at));
        }
    }
    Ok(targets)
}

/// Release the lock words of `locs` that attempt `id` holds on every copy, in one round:
/// on the primary CAS from `id | INVISIBLE` to 0 (made visible and unlocked), or from
/// `id` when the install never marked it; on each backup WRITE 0 (clearing
/// `INVISIBLE`).
///
/// Errors: the first failed operation (the others were still issued).
pub(crate) async fn release(store: &CvtRemote, locs: &[CvtLoc], id: u64) -> Result<(), TxnError> {
    let targets = lock_copies(store, locs)?;
    let ctx = store.ctx();
    let done = join_all(targets.iter().map(|&(primary, n, at)| async move {
        let r = if primary {
            release_word(ctx, n, at, id).await.map(drop)
        } else {
            crate::transient::write(ctx, n, at, &0u64.to_le_bytes())
                .await
                .map_err(TxnError::from)
        };
        (n, r)
    }))
    .await;
    // A dead memory node's words died with it.
    let mut one_sided = Vec::new();
    for (n, r) in done {
        match r {
            Ok(()) => {}
            Err(TxnError::Rpc(rrpc::runtime::RpcError::OneSided(e))) => one_sided.push((n, Err(e))),
            Err(e) => return Err(e),
        }
    }
    store.tolerate(one_sided).await
}

/// [`release`] of the lock words at `targets` ([`lock_copies`]). A copy on a memory
/// node this thread's replica view writes off is skipped when its operation fails.
///
/// Errors: the first failed operation (the others were still issued).
pub(crate) async fn release_at(
    ctx: &ThreadCtx,
    targets: &[(bool, NodeId, RemoteAddr)],
    id: u64,
) -> Result<(), TxnError> {
    let done = join_all(targets.iter().map(|&(primary, n, at)| async move {
        let r = if primary {
            release_word(ctx, n, at, id).await.map(drop)
        } else {
            crate::transient::write(ctx, n, at, &0u64.to_le_bytes())
                .await
                .map_err(TxnError::from)
        };
        match r {
            // A memory node the replica view wrote off (it died) took its words with it.
            Err(_) if crate::transient::written_off(n) => Ok(()),
            r => r,
        }
    }))
    .await;
    done.into_iter().collect::<Result<Vec<()>, _>>().map(drop)
}

/// CAS the lock word at `at` from `id | INVISIBLE` to 0, or from `id` when it held
/// that; returns whether it was this holder's.
///
/// Errors: [`TxnError::Rpc`].
pub(crate) async fn release_word(
    ctx: &ThreadCtx,
    node: NodeId,
    at: RemoteAddr,
    id: u64,
) -> Result<bool, TxnError> {
    let prev = crate::transient::cas_owned(ctx, node, at, id | INVISIBLE, 0).await?;
    if prev == id | INVISIBLE {
        return Ok(true);
    }
    if prev == id {
        return Ok(crate::transient::cas_owned(ctx, node, at, id, 0).await? == id);
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_undo_log_carries_the_id_and_every_old_record() {
        let objs = [
            (1u32, 7u64, Timestamp(5), Some(&[9u8; 3][..])),
            (2, 8, Timestamp::ZERO, None),
        ];
        let log = undo_log(42, objs.into_iter());
        assert_eq!(&log[..8], &42u64.to_le_bytes());
        assert_eq!(&log[8..16], &2u64.to_le_bytes());
        // First entry: table 1, 3 bytes, key 7, version 5, the bytes.
        assert_eq!(&log[16..20], &1u32.to_le_bytes());
        assert_eq!(&log[20..24], &3u32.to_le_bytes());
        assert_eq!(&log[24..32], &7u64.to_le_bytes());
        assert_eq!(&log[32..40], &5u64.to_le_bytes());
        assert_eq!(&log[40..43], &[9, 9, 9]);
        // Second: no old value.
        assert_eq!(&log[47..51], &0u32.to_le_bytes());
        assert_eq!(log.len(), 16 + 24 + 3 + 24);
    }

    #[test]
    fn the_invisible_bit_is_outside_every_id() {
        let id = crate::txn_id::TxnId {
            owner: crate::txn_id::Owner::new(0xfff, 0xfff),
            client: 0xfff,
            seq: (1 << crate::txn_id::SEQ_BITS) - 1,
        }
        .pack();
        assert_eq!(id & INVISIBLE, 0);
        assert!(crate::txn_id::Owner::new(0xfff, 0xfff).owns(id | INVISIBLE));
    }
}
