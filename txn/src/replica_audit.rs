//! The replica audit after a replicated run: every backup image equals its primary
//! (Motor 5.3's invariant that "the backups have the same updates as primary", which
//! promotion relies on).
//!
//! Compared, slot by slot of every CVT table of every partition: the valid cells
//! (version, tombstone, CV, and the record buffer's offset in the value region: a
//! backup's cell names its own region) and the key of every CVT with a valid cell;
//! and, for every valid cell, the record bytes (payload and CVs). Lock words are
//! excepted (they matter at the primary only), and so are invalid cells and the slot
//! state of CVTs with no valid cell: a roll-back invalidates victim cells, and a
//! killed inserter can leave a copy claimed or not, neither of which any reader sees.
//!
//! Cost: every index and value region of every copy is READ once, in READs of about
//! 1 MiB, the copies of a range side by side.

use rrpc::runtime::join_all;

use crate::cvt::{record_bytes, Cvt};
use crate::cvt_index::CVTS_PER_BUCKET;
use crate::cvt_remote::CvtRemote;
use crate::cvt_store::CvtTableExport;
use crate::error::TxnError;

/// Bytes of one READ (about: whole slots per READ).
const CHUNK_BYTES: usize = 1 << 20;

/// What the audit found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplicaAudit {
    /// Partitions audited.
    pub partitions: u32,
    /// Backups per partition (the fewest any partition has: after a failover, the
    /// partitions the dead node held a copy of have one less).
    pub backups: u32,
    /// CVTs with a valid version compared (over all partitions and backups).
    pub cvts: u64,
    /// Records (valid cells) compared.
    pub records: u64,
    /// The first difference: partition, memory node of the backup, table, slot, key,
    /// cell and field, with both values.
    pub difference: Option<String>,
}

impl ReplicaAudit {
    /// Whether every backup equals its primary.
    pub fn ok(&self) -> bool {
        self.difference.is_none()
    }

    /// `replicas: P partitions x F backups, N CVTs, M records: identical` or
    /// `...: DIFFERENT: <the first difference>`.
    pub fn line(&self) -> String {
        let head = format!(
            "replicas: {} partitions x {} backups, {} CVTs, {} records",
            self.partitions, self.backups, self.cvts, self.records
        );
        match &self.difference {
            None => format!("{head}: identical"),
            Some(d) => format!("{head}: DIFFERENT: {d}"),
        }
    }
}

/// Compare every backup of every partition with its primary through `store`. Run it
/// when no transaction is running (a commit in flight differs for a moment by design).
///
/// Errors: [`TxnError::Rpc`] when a READ fails; [`TxnError::Export`] for a CVT that
/// does not decode.
pub async fn audit_replicas(store: &CvtRemote) -> Result<ReplicaAudit, TxnError> {
    let mut a = ReplicaAudit {
        partitions: store.partitions(),
        backups: (0..store.partitions())
            .map(|p| store.backups(p).len() as u32)
            .min()
            .unwrap_or(0),
        ..ReplicaAudit::default()
    };
    for p in 0..store.partitions() {
        for (ti, t) in store.part_tables(p)?.iter().enumerate() {
            for b in store.backups(p) {
                let bt = b.tables.get(ti).ok_or_else(|| {
                    TxnError::Export(format!("memory node {}: no table {}", b.memnode, t.id))
                })?;
                let mut diff = None;
                compare_table(store, p, t, b.node, bt, &mut a, &mut diff).await?;
                if let Some(d) = diff {
                    a.difference = Some(format!(
                        "partition {p}, backup on memory node {}: table {} {d}",
                        b.memnode, t.name
                    ));
                    return Ok(a);
                }
            }
        }
    }
    Ok(a)
}

/// One table of partition `p` against one backup of it, chunk by chunk; the first
/// difference goes to `diff`.
async fn compare_table(
    store: &CvtRemote,
    p: u32,
    t: &CvtTableExport,
    backup: rrpc::NodeId,
    bt: &CvtTableExport,
    a: &mut ReplicaAudit,
    diff: &mut Option<String>,
) -> Result<(), TxnError> {
    let primary = store.primary_node(p)?;
    let (cvt, rec) = (t.cvt_bytes(), record_bytes(t.len));
    let per_slot_values = t.versions * rec;
    let slots = t.n_buckets as usize * CVTS_PER_BUCKET;
    let per_read = (CHUNK_BYTES / cvt.max(per_slot_values)).max(1);
    let ctx = store.ctx();
    for start in (0..slots).step_by(per_read) {
        let n = per_read.min(slots - start);
        let reads = join_all([
            ctx.read(primary, t.index.at((start * cvt) as u64), n * cvt),
            ctx.read(backup, bt.index.at((start * cvt) as u64), n * cvt),
            ctx.read(
                primary,
                t.values.at((start * per_slot_values) as u64),
                n * per_slot_values,
            ),
            ctx.read(
                backup,
                bt.values.at((start * per_slot_values) as u64),
                n * per_slot_values,
            ),
        ])
        .await;
        let mut reads = reads.into_iter();
        let mut next = || reads.next().expect("four READs");
        let (pi, bi, pv, bv) = (next()?, next()?, next()?, next()?);
        for i in 0..n {
            let decode = |img: &[u8]| {
                Cvt::decode(&img[i * cvt..(i + 1) * cvt])
                    .map_err(|e| TxnError::Export(format!("a CVT of table {}: {e}", t.name)))
            };
            let (pc, bc) = (decode(&pi)?, decode(&bi)?);
            let values = |v: &[u8], c: usize| {
                let o = i * per_slot_values + c * rec;
                v[o..o + rec].to_vec()
            };
            let slot = start + i;
            if let Some(d) = compare_cvt(t, bt, &pc, &bc, |c| (values(&pv, c), values(&bv, c))) {
                *diff = Some(format!("slot {slot}: {d}"));
                return Ok(());
            }
            if pc.cells.iter().any(|c| c.valid) {
                a.cvts += 1;
                a.records += pc.cells.iter().filter(|c| c.valid).count() as u64;
            }
        }
    }
    Ok(())
}

/// The first difference between a primary's CVT and a backup's (valid cells, their
/// records through `records(cell)` = (primary's, backup's), the key), if any.
fn compare_cvt(
    t: &CvtTableExport,
    bt: &CvtTableExport,
    p: &Cvt,
    b: &Cvt,
    records: impl Fn(usize) -> (Vec<u8>, Vec<u8>),
) -> Option<String> {
    let any_valid = p.cells.iter().chain(&b.cells).any(|c| c.valid);
    if !any_valid {
        return None;
    }
    let key = p.header.key;
    if p.header.key != b.header.key {
        return Some(format!(
            "key: primary {} backup {}",
            p.header.key, b.header.key
        ));
    }
    for (i, (pc, bc)) in p.cells.iter().zip(&b.cells).enumerate() {
        let at = format!("key {key} cell {i}");
        if pc.valid != bc.valid {
            return Some(format!(
                "{at} valid: primary {} backup {} (versions {} and {})",
                pc.valid,
                bc.valid,
                pc.version.get(),
                bc.version.get()
            ));
        }
        if !pc.valid {
            continue;
        }
        if pc.version != bc.version {
            return Some(format!(
                "{at} version: primary {} backup {}",
                pc.version.get(),
                bc.version.get()
            ));
        }
        if pc.deleted != bc.deleted || pc.cv != bc.cv {
            return Some(format!(
                "{at} tombstone/CV: primary {}/{} backup {}/{}",
                pc.deleted, pc.cv, bc.deleted, bc.cv
            ));
        }
        let (po, bo) = (
            pc.addr.wrapping_sub(t.values.addr),
            bc.addr.wrapping_sub(bt.values.addr),
        );
        if po != bo {
            return Some(format!("{at} record offset: primary {po} backup {bo}"));
        }
        let (pr, br) = records(i);
        if pr != br {
            return Some(format!(
                "{at} record bytes differ (version {})",
                pc.version.get()
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cvt::{Cell, Header, SLOT_IN_USE};
    use rrpc::fabric::MrDesc;
    use tso::Timestamp;

    fn table(values_addr: u64) -> CvtTableExport {
        let d = |addr| MrDesc {
            addr,
            len: 1 << 20,
            rkey: 1,
        };
        CvtTableExport {
            id: 1,
            name: "t".into(),
            versions: 2,
            len: 8,
            index: d(0x1000),
            n_buckets: 4,
            values: d(values_addr),
            guards: d(0x9000),
            records_loaded: 0,
        }
    }

    fn cvt(key: u64, lock: u64, cells: [(bool, u64, u64); 2]) -> Cvt {
        let mut c = Cvt::new(
            Header {
                table: 1,
                len: 8,
                key,
                lock,
                state: SLOT_IN_USE,
            },
            2,
        );
        for (i, (valid, version, addr)) in cells.into_iter().enumerate() {
            c.cells[i] = Cell {
                cv: 1,
                valid,
                deleted: false,
                version: Timestamp(version),
                addr,
            };
        }
        c
    }

    #[test]
    fn copies_compare_by_valid_cells_offsets_and_records_not_locks() {
        let (t, bt) = (table(0x10_0000), table(0x50_0000));
        let same = |_| (vec![1u8; 10], vec![1u8; 10]);
        let p = cvt(7, 42, [(true, 5, 0x10_0010), (false, 3, 0x10_0020)]);
        // Another lock word, another address (same offset), an invalid cell that differs.
        let b = cvt(7, 0, [(true, 5, 0x50_0010), (false, 9, 0)]);
        assert_eq!(compare_cvt(&t, &bt, &p, &b, same), None);
        // A backup that missed the install: its cell still holds the old version.
        let stale = cvt(7, 0, [(true, 4, 0x50_0010), (false, 9, 0)]);
        let d = compare_cvt(&t, &bt, &p, &stale, same).unwrap();
        assert!(d.contains("version: primary 5 backup 4"), "{d}");
        // Same cell, other record bytes.
        let d = compare_cvt(&t, &bt, &p, &b, |_| (vec![1; 10], vec![2; 10])).unwrap();
        assert!(d.contains("record bytes differ"), "{d}");
        // A cell naming another buffer.
        let off = cvt(7, 0, [(true, 5, 0x50_0030), (false, 9, 0)]);
        assert!(compare_cvt(&t, &bt, &p, &off, same)
            .unwrap()
            .contains("record offset"));
        // A slot with no valid cell anywhere is not compared (a rolled-back insert).
        let empty = cvt(3, 0, [(false, 0, 0), (false, 0, 0)]);
        let other = cvt(9, 0, [(false, 1, 0), (false, 0, 0)]);
        assert_eq!(compare_cvt(&t, &bt, &empty, &other, same), None);
    }
}
