//! KVS and YCSB workloads over the KVS table ([`txn::kvs`]): presets `ycsb-a` (50%
//! reads / 50% updates), `ycsb-b` (95/5), `ycsb-c` (reads only), `ycsb-d` (95% reads of
//! the latest keys / 5% inserts of new keys), `ycsb-e` (95% scans of 1 to
//! [`MAX_SCAN`] records from a drawn key / 5% inserts of new keys), `ycsb-f` (50% reads /
//! 50% read-modify-writes) and `kvs` (the papers' KVS: one operation per transaction, a
//! read or an update, half each).
//!
//! `ycsb-e`'s scans run through the range index ([`txn::range_index`], a B-link tree on
//! a memory node, bulk-loaded with the records) and read their rows in the
//! transaction; each scan is checked ([`check_scan`]): keys in order from its start,
//! and no loaded record in its range missed or repeated.
//!
//! Keys are drawn with YCSB's scrambled Zipfian: a Zipf rank hashed (FNV-1a 64) into
//! the key space, so the hot keys are spread over the table rather than packed at its
//! start; `ycsb-d` draws ranks from the newest key down (YCSB's "latest"), unscrambled.
//!
//! Every update reads its value for update and writes `counter + 1`; every value read
//! is checked ([`txn::kvs::check_value`]), and a bad one is a [`RunError::Check`].
//! Transactions return how many updates they committed, so after a run the sum of all
//! counters must equal the sum over committed transactions.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::bail;
use rand::rngs::StdRng;
use rand::Rng;
use rand_distr::{Distribution, Zipf};
use txn::coordinator::Txn;
use txn::kvs::{check_value, encode_value, fnv64, TABLE};

use crate::audit::{audit, kvs_check, kvs_items};
use crate::report::WorkerStats;
use crate::txn_args::Args;
use crate::workload::Mix;
use crate::workload::{AuditCx, Audited, Finished, Profiles, Workload, WorkloadSpec};

/// One operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Op {
    /// Read the key (may be absent only in `ycsb-d`, whose latest keys may be in flight).
    Read(u64),
    /// Read the key for update and write its counter + 1.
    Update(u64),
    /// Insert the (new) key with counter 0.
    Insert(u64),
    /// Scan up to this many records from the key on (`ycsb-e`).
    Scan(u64, u32),
}

/// Longest `ycsb-e` scan, records (YCSB's `maxscanlength`; lengths are uniform from 1).
pub const MAX_SCAN: u32 = 100;

impl Op {
    fn key(self) -> u64 {
        match self {
            Self::Read(k) | Self::Update(k) | Self::Insert(k) | Self::Scan(k, _) => k,
        }
    }
}

/// One transaction's inputs.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct KvsTxn {
    /// Kind: index into [`kinds`] (0 for a transaction that only reads, 1 for one that
    /// writes).
    pub kind: usize,
    /// Operations, on distinct keys.
    pub ops: Vec<Op>,
}

/// Draws KVS / YCSB transactions.
pub struct KvsGenerator {
    workload: Workload,
    zipf: Zipf<f64>,
    records: u64,
    ops: usize,
    /// Next key `ycsb-d` and `ycsb-e` insert (keys above the loaded records).
    next_insert: AtomicU64,
}

/// Keys of one insert lane ([`KvsGenerator::with_insert_lane`]).
pub const LANE_KEYS: u64 = 1 << 32;

impl KvsGenerator {
    /// `workload` over keys `0..records` with Zipf exponent `theta` (0 = uniform),
    /// `ops` distinct keys per transaction (1 to `records / 2`).
    pub fn new(workload: Workload, records: u64, theta: f64, ops: usize) -> anyhow::Result<Self> {
        anyhow::ensure!(workload.is_kvs(), "{workload} is not a KVS workload");
        anyhow::ensure!(records >= 2, "need at least 2 records");
        anyhow::ensure!(
            ops >= 1 && ops as u64 <= records / 2,
            "--ops-per-txn must be 1 to records / 2 (got {ops} with {records} records)"
        );
        anyhow::ensure!(theta >= 0.0 && theta.is_finite(), "theta must be >= 0");
        let zipf = Zipf::new(records as f64, theta).map_err(|e| anyhow::anyhow!("zipf: {e}"))?;
        Ok(Self {
            workload,
            zipf,
            records,
            ops,
            next_insert: AtomicU64::new(records),
        })
    }

    /// Insert keys from `records + lane * 2^32` on: a coordinator process's own range
    /// of new keys (lane 0 is txn-bench's own coordinators). `ycsb-d`'s latest keys are
    /// then this process's latest. Lanes below 2^24 keep keys below 2^56 (the range
    /// index's limit).
    pub fn with_insert_lane(self, lane: u64) -> Self {
        let start = self.records + lane * LANE_KEYS;
        self.next_insert.store(start, Ordering::Relaxed);
        self
    }

    fn rank(&self, rng: &mut impl Rng) -> u64 {
        (self.zipf.sample(rng) as u64).saturating_sub(1)
    }

    /// A key: scrambled Zipfian over the records, or for `ycsb-d` the latest keys first.
    fn key(&self, rng: &mut impl Rng) -> u64 {
        let r = self.rank(rng);
        if self.workload == Workload::YcsbD {
            let top = self.next_insert.load(Ordering::Relaxed);
            top.saturating_sub(1 + r)
        } else {
            fnv64(r) % self.records
        }
    }

    /// Next transaction.
    pub fn next(&self, rng: &mut impl Rng) -> KvsTxn {
        let mut ops: Vec<Op> = Vec::with_capacity(self.ops);
        while ops.len() < self.ops {
            let write = rng.random_range(0..100u32) < self.workload.write_percent();
            let inserts = matches!(self.workload, Workload::YcsbD | Workload::YcsbE);
            let op = if write && inserts {
                Op::Insert(self.next_insert.fetch_add(1, Ordering::Relaxed))
            } else if self.workload == Workload::YcsbE {
                Op::Scan(self.key(rng), rng.random_range(1..=MAX_SCAN))
            } else {
                let k = self.key(rng);
                if ops.iter().any(|o| o.key() == k) {
                    continue;
                }
                if write {
                    Op::Update(k)
                } else {
                    Op::Read(k)
                }
            };
            ops.push(op);
        }
        let kind = usize::from(
            ops.iter()
                .any(|o| matches!(o, Op::Update(_) | Op::Insert(_))),
        );
        KvsTxn { kind, ops }
    }
}

pub use crate::workload::RunError;

/// What a committed KVS transaction did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Done {
    /// Updates committed (each added 1 to a counter).
    pub updates: u64,
    /// Keys inserted.
    pub inserted: Vec<u64>,
}

/// Run one attempt of `t` in `txn` and commit it: reads and updates in one round
/// (updates read for update), each value checked, updates written as counter + 1 at
/// `value_bytes`, then inserts. Keys below `records` (the loaded ones) must exist; a
/// read of a key above them (`ycsb-d`'s latest keys, which include inserts in flight or
/// aborted) may find it absent.
pub async fn run(
    mut txn: Txn<'_>,
    t: &KvsTxn,
    records: u64,
    value_bytes: usize,
) -> Result<Done, RunError> {
    let items: Vec<(u32, u64, bool)> = t
        .ops
        .iter()
        .filter_map(|&o| match o {
            Op::Read(k) => Some((TABLE, k, false)),
            Op::Update(k) => Some((TABLE, k, true)),
            Op::Insert(_) | Op::Scan(..) => None,
        })
        .collect();
    let vals = if items.is_empty() {
        Vec::new()
    } else {
        txn.get_mixed(&items).await?
    };
    let mut done = Done::default();
    for (&(_, key, update), v) in items.iter().zip(vals) {
        let Some(v) = v else {
            if !update && key >= records {
                continue;
            }
            return Err(RunError::Check(format!("key {key} not found")));
        };
        let counter = check_value(key, &v).map_err(RunError::Check)?;
        if update {
            txn.write(TABLE, key, encode_value(key, counter + 1, value_bytes))?;
            done.updates += 1;
        }
    }
    for &o in &t.ops {
        if let Op::Scan(from, len) = o {
            let rows = txn
                .scan(TABLE, from..1 << txn::range_index::KEY_BITS, len as usize)
                .await?;
            for (k, v) in &rows {
                check_value(*k, v).map_err(RunError::Check)?;
            }
            let keys: Vec<u64> = rows.iter().map(|r| r.0).collect();
            check_scan(from, len, records, &keys).map_err(RunError::Check)?;
        }
    }
    for &o in &t.ops {
        if let Op::Insert(k) = o {
            txn.insert(TABLE, k, encode_value(k, 0, value_bytes))
                .await?;
            done.inserted.push(k);
        }
    }
    txn.commit().await?;
    Ok(done)
}

/// Check a scan of up to `len` records from `from` that returned `keys`, over a table
/// loaded with keys `0..records` that only grows by inserts above them: keys strictly
/// increase from `from`, and the loaded keys among them are exactly
/// `from..min(from + len, records)` (none missed, none repeated). Inserted keys (at or
/// above `records`) may be missing (in flight or aborted inserts). Errors: the first
/// violation, named.
pub fn check_scan(from: u64, len: u32, records: u64, keys: &[u64]) -> Result<(), String> {
    if keys.len() > len as usize {
        return Err(format!(
            "scan from {from} of {len} returned {} keys",
            keys.len()
        ));
    }
    if let Some(w) = keys.windows(2).find(|w| w[0] >= w[1]) {
        return Err(format!(
            "scan from {from}: key {} after {}, out of order",
            w[1], w[0]
        ));
    }
    if keys.first().is_some_and(|&k| k < from) {
        return Err(format!("scan from {from} returned {}", keys[0]));
    }
    let loaded: Vec<u64> = keys.iter().copied().filter(|&k| k < records).collect();
    let want_end = from.saturating_add(u64::from(len)).min(records);
    let want = from.min(want_end)..want_end;
    if loaded.len() as u64 != want.end - want.start
        || loaded.iter().zip(want.clone()).any(|(&k, w)| k != w)
    {
        let missed = want.clone().find(|w| !loaded.contains(w));
        return Err(format!(
            "scan from {from} of {len} returned loaded keys {}..{} ({} of them) instead of \
             {}..{}{}",
            loaded.first().copied().unwrap_or(from),
            loaded.last().map_or(from, |k| k + 1),
            loaded.len(),
            want.start,
            want.end,
            missed
                .map(|m| format!(": key {m} missed"))
                .unwrap_or_default()
        ));
    }
    Ok(())
}

/// Transaction kinds of a KVS / YCSB preset as the report lists them (index = the
/// history's kind): read-only transactions first, then those that write. Empty for a
/// workload that is not a KVS one.
pub fn kinds(preset: Workload) -> Vec<&'static str> {
    match preset {
        Workload::Kvs => vec!["read", "update"],
        Workload::YcsbA | Workload::YcsbB => vec!["read-only", "update"],
        Workload::YcsbC => vec!["read-only"],
        Workload::YcsbD => vec!["read-only", "insert"],
        Workload::YcsbE => vec!["scan", "insert"],
        Workload::YcsbF => vec!["read-only", "read-modify-write"],
        Workload::SmallBank | Workload::Tatp | Workload::Tpcc | Workload::Pairs => Vec::new(),
    }
}

/// The KVS / YCSB family as `txn-bench` runs it (`--workload kvs`, `ycsb-a` ... `ycsb-f`):
/// `--records` keys of `--value-bytes` bytes, `--ops-per-txn` operations per
/// transaction; the check is every value's checksum and the update counters against the
/// committed updates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ycsb {
    preset: Workload,
    insert_lane: u64,
    records: u64,
    value_bytes: usize,
    ops: usize,
}

impl Ycsb {
    /// The workload of `args` (`args.workload` must be a KVS preset). Errors: a value
    /// too small for its counter and checksum, `--hot-accounts`. (A bad record or
    /// operation count is refused by [`WorkloadSpec::profiles`], with the generator's
    /// reason.)
    pub fn from_args(args: &Args) -> anyhow::Result<Self> {
        if !args.workload.is_kvs() {
            bail!("{} is not a KVS workload", args.workload);
        }
        if args.value_bytes < txn::kvs::MIN_VALUE_BYTES {
            bail!(
                "--value-bytes must be at least {} (got {})",
                txn::kvs::MIN_VALUE_BYTES,
                args.value_bytes
            );
        }
        crate::txn_args::refuse_hot_accounts(args)?;
        Ok(Self {
            preset: args.workload,
            insert_lane: args.insert_lane,
            records: args.records,
            value_bytes: args.value_bytes,
            ops: args
                .ops_per_txn
                .unwrap_or_else(|| args.workload.default_ops()),
        })
    }
}

impl WorkloadSpec for Ycsb {
    fn workload(&self) -> Workload {
        self.preset
    }

    fn label(&self) -> &'static str {
        self.preset.name()
    }

    fn kinds(&self) -> Vec<&'static str> {
        kinds(self.preset)
    }

    fn keys(&self) -> u64 {
        self.records
    }

    fn scale(&self) -> String {
        format!(
            "{} records x {} B, {} ops/txn",
            self.records, self.value_bytes, self.ops
        )
    }

    fn lockd_locks(&self) -> u64 {
        2 * self.records
    }

    fn memnode_args(&self) -> Vec<String> {
        vec![
            "--kvs-records".into(),
            self.records.to_string(),
            "--kvs-value-bytes".into(),
            self.value_bytes.to_string(),
        ]
    }

    /// Every loaded value must be valid at counter 0.
    fn initial_total(&self, cx: &AuditCx<'_>) -> anyhow::Result<i64> {
        let loaded = kvs_items(self.records, &[]);
        let before = audit(cx.fabric, cx.addrs, cx.protocol, &loaded)?;
        let c = kvs_check(&before, &loaded, self.records, 0);
        if !c.ok() || c.found != 0 {
            bail!("loaded KVS table: {}", c.line());
        }
        Ok(0)
    }

    fn profiles(&self, theta: f64) -> anyhow::Result<Arc<dyn Mix>> {
        Ok(Arc::new(KvsProfiles {
            gen: KvsGenerator::new(self.preset, self.records, theta, self.ops)?
                .with_insert_lane(self.insert_lane),
            records: self.records,
            value_bytes: self.value_bytes,
        }))
    }

    /// The loaded and inserted keys: every checksum valid, and the update counters sum
    /// to the updates the coordinators committed.
    fn audit_after(&self, cx: &AuditCx<'_>, workers: &[WorkerStats]) -> anyhow::Result<Audited> {
        let inserted: Vec<u64> = workers
            .iter()
            .flat_map(|w| w.inserted.iter().copied())
            .collect();
        let items = kvs_items(self.records, &inserted);
        let a = audit(cx.fabric, cx.addrs, cx.protocol, &items)?;
        let updates = u64::try_from(workers.iter().map(|w| w.net).sum::<i64>()).unwrap_or(0);
        let c = kvs_check(&a, &items, self.records, updates);
        let (mut line, mut ok) = (c.line(), c.ok() && c.found == updates);
        if self.preset.needs_range_index() {
            // Every row after the run: the loaded records and the committed inserts.
            let rows: Vec<(u32, u64)> = (0..self.records)
                .chain(inserted)
                .map(|k| (TABLE, k))
                .collect();
            let ix = crate::range_audit::audit_range_index(cx.fabric, cx.addrs, &[TABLE], &rows)?;
            line = format!("{line}; {}", ix.line());
            ok &= ix.ok();
        }
        Ok(Audited {
            total: Some(c.found as i64),
            cvt_locked: a.cvt_locked,
            lockd_held: a.lockd_held,
            check: Some((line, ok)),
        })
    }
}

/// The KVS profiles at one point: the generator, and what [`run`] needs besides.
struct KvsProfiles {
    gen: KvsGenerator,
    records: u64,
    value_bytes: usize,
}

impl Profiles for KvsProfiles {
    type Txn = KvsTxn;

    fn draw(&self, rng: &mut StdRng, _home: u16) -> (KvsTxn, usize) {
        let t = self.gen.next(rng);
        let kind = t.kind;
        (t, kind)
    }

    /// The first operation's key, for a transaction that writes.
    fn first_record(&self, t: &KvsTxn) -> Option<(u32, u64)> {
        if t.kind == 0 {
            return None;
        }
        t.ops.first().map(|o| (txn::kvs::TABLE, o.key()))
    }

    async fn run<'t>(&'t self, mut txn: Txn<'t>, t: &'t KvsTxn) -> Result<Finished, RunError> {
        if t.kind == 0 {
            txn.declare_read_only();
        }
        let d = run(txn, t, self.records, self.value_bytes).await?;
        Ok(Finished::Committed {
            net: d.updates as i64,
            inserted: d.inserted,
            failed_lookup: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn presets_mix_and_skew() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for (w, pct) in [
            (Workload::YcsbA, 50.0),
            (Workload::YcsbB, 5.0),
            (Workload::YcsbC, 0.0),
            (Workload::YcsbF, 50.0),
            (Workload::Kvs, 50.0),
        ] {
            let g = KvsGenerator::new(w, 1000, 0.99, w.default_ops()).unwrap();
            let (mut writes, mut ops, mut hot) = (0u64, 0u64, 0u64);
            let hottest = fnv64(0) % 1000;
            for _ in 0..20_000 {
                let t = g.next(&mut rng);
                assert_eq!(t.ops.len(), w.default_ops());
                let mut keys: Vec<u64> = t.ops.iter().map(|o| o.key()).collect();
                keys.sort_unstable();
                keys.dedup();
                assert_eq!(keys.len(), t.ops.len(), "distinct keys");
                assert!(keys.iter().all(|&k| k < 1000));
                let w_ops = t.ops.iter().filter(|o| matches!(o, Op::Update(_))).count();
                assert_eq!(t.kind, usize::from(w_ops > 0));
                assert!(t.kind < kinds(w).len());
                writes += w_ops as u64;
                ops += t.ops.len() as u64;
                hot += keys.iter().filter(|&&k| k == hottest).count() as u64;
            }
            let got = 100.0 * writes as f64 / ops as f64;
            assert!((got - pct).abs() < 2.0, "{w}: {got}% writes");
            // The hottest rank lands on fnv64(0) % records, far above a uniform share.
            assert!(
                hot as f64 > 0.05 * 20_000.0,
                "{w}: hottest key drawn {hot} times"
            );
        }
    }

    #[test]
    fn ycsb_d_inserts_new_keys_and_reads_the_latest() {
        let g = KvsGenerator::new(Workload::YcsbD, 1000, 0.99, 4).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(4);
        let mut inserted = Vec::new();
        let mut recent = 0;
        for _ in 0..10_000 {
            let t = g.next(&mut rng);
            for o in &t.ops {
                match *o {
                    Op::Insert(k) => inserted.push(k),
                    Op::Read(k) => {
                        recent += u64::from(k + 100 >= g.next_insert.load(Ordering::Relaxed))
                    }
                    o => panic!("ycsb-d drew {o:?}"),
                }
            }
            assert_eq!(
                t.kind,
                usize::from(t.ops.iter().any(|o| matches!(o, Op::Insert(_))))
            );
        }
        let n = inserted.len() as u64;
        assert!(n > 1000, "{n} inserts");
        assert_eq!(
            inserted,
            (1000..1000 + n).collect::<Vec<_>>(),
            "new, unique keys"
        );
        assert!(recent > 20_000, "reads favour the latest keys: {recent}");
    }

    #[test]
    fn ycsb_e_scans_from_drawn_keys_and_inserts_new_ones() {
        let g = KvsGenerator::new(Workload::YcsbE, 1000, 0.99, 1).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let (mut scans, mut inserts, mut lens) = (0u64, 0u64, Vec::new());
        for _ in 0..20_000 {
            let t = g.next(&mut rng);
            assert_eq!(t.ops.len(), 1);
            match t.ops[0] {
                Op::Scan(from, len) => {
                    assert!(from < 1000 && (1..=MAX_SCAN).contains(&len));
                    assert_eq!(t.kind, 0);
                    scans += 1;
                    lens.push(len);
                }
                Op::Insert(k) => {
                    assert!(k >= 1000);
                    assert_eq!(t.kind, 1);
                    inserts += 1;
                }
                o => panic!("ycsb-e drew {o:?}"),
            }
        }
        let pct = 100.0 * inserts as f64 / (scans + inserts) as f64;
        assert!((pct - 5.0).abs() < 1.0, "{pct}% inserts");
        let mean = lens.iter().map(|&l| f64::from(l)).sum::<f64>() / lens.len() as f64;
        assert!(
            (mean - 50.5).abs() < 2.0,
            "scan lengths uniform 1..=100: mean {mean}"
        );
    }

    #[test]
    fn the_scan_check_catches_missed_repeated_and_disordered_keys() {
        // A full scan inside the loaded keys, one across their end with inserts after
        // them (some in flight: missing is fine), one past them.
        assert_eq!(check_scan(10, 3, 100, &[10, 11, 12]), Ok(()));
        assert_eq!(check_scan(98, 5, 100, &[98, 99, 100, 102]), Ok(()));
        assert_eq!(check_scan(98, 5, 100, &[98, 99]), Ok(()));
        assert_eq!(check_scan(150, 5, 100, &[151]), Ok(()));
        let e = check_scan(10, 3, 100, &[10, 12]).unwrap_err();
        assert!(e.contains("key 11 missed"), "{e}");
        assert!(check_scan(10, 3, 100, &[10, 11]).is_err(), "short");
        assert!(check_scan(10, 3, 100, &[10, 11, 11]).is_err(), "repeated");
        assert!(check_scan(10, 3, 100, &[11, 10, 12]).is_err(), "disordered");
        assert!(
            check_scan(10, 3, 100, &[9, 10, 11]).is_err(),
            "before the start"
        );
        assert!(check_scan(10, 2, 100, &[10, 11, 12]).is_err(), "too many");
        assert!(check_scan(98, 5, 100, &[99, 100]).is_err(), "98 missed");
    }

    #[test]
    fn generator_refuses_non_kvs_workloads_and_tiny_tables() {
        assert!(KvsGenerator::new(Workload::SmallBank, 1000, 0.9, 4).is_err());
        assert!(KvsGenerator::new(Workload::YcsbA, 6, 0.9, 4).is_err());
    }
}
