//! The `pairs` atomicity workload (`--workload pairs`): `--groups` groups of
//! `--group-size` objects each on the KVS table ([`txn::kvs`], 16-byte values). A
//! read-write transaction picks a group and writes one fresh random nonzero `u64` to
//! all of its objects (reading each for update first); a read-only transaction reads a
//! whole group and, once it committed, fails the run if the values differ. After the
//! run every group must be uniform ([`check_groups`]).
//!
//! The check needs no per-coordinator bookkeeping, so it also sees a half-applied
//! transaction of a coordinator process that was killed (whose counters died with it),
//! which the money audit of SmallBank cannot.
//!
//! Placement: with `--memnodes P` the objects of group `g` are keys on partitions
//! `g mod P, g + 1 mod P, ...` ([`txn::cvt_remote::partition_of`]), so a group's
//! objects lie on different memory nodes whenever `P >= --group-size` (with fewer
//! memory nodes they cycle through them). With one memory node group `g` is keys
//! `g * K .. g * K + K`.
//!
//! Values: a written value is `v` little-endian, twice (16 bytes); a value as loaded
//! (KVS counter 0) reads as `v = 0`, so the loaded data is uniform too.

use std::sync::Arc;

use anyhow::bail;
use rand::rngs::StdRng;
use rand::Rng;
use rand_distr::{Distribution, Zipf};
use txn::coordinator::Txn;
use txn::cvt_remote::partition_of;
use txn::kvs::TABLE;

use crate::audit::audit;
use crate::report::WorkerStats;
use crate::txn_args::Args;
use crate::workload::{
    AuditCx, Audited, Finished, Mix, Profiles, RunError, Workload, WorkloadSpec,
};

/// Bytes of a value: `v` twice.
pub const VALUE_BYTES: usize = 16;
/// Most objects in a group.
pub const MAX_GROUP_SIZE: usize = 64;
/// Most objects over all groups (each a KVS record on some memory node).
pub const MAX_OBJECTS: u64 = 1 << 26;
/// The transaction kinds, in report order.
pub const KINDS: [&str; 2] = ["write-group", "read-group"];

/// The groups' keys: group `g` is `keys[g * size .. (g + 1) * size]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Groups {
    size: usize,
    keys: Vec<u64>,
    /// Keys loaded: `0..records` (some of them in no group when spread over several
    /// partitions).
    records: u64,
}

impl Groups {
    /// `groups` groups of `size` objects over `partitions` memory nodes (module docs).
    pub fn new(groups: u64, size: usize, partitions: u32) -> Self {
        let n = groups as usize * size;
        if partitions <= 1 {
            return Self {
                size,
                keys: (0..n as u64).collect(),
                records: n as u64,
            };
        }
        // Keys of each partition in key order, found by scanning the key space once.
        let p = partitions as usize;
        let mut queues: Vec<std::collections::VecDeque<u64>> = vec![Default::default(); p];
        let mut next = 0u64;
        let mut keys = Vec::with_capacity(n);
        for g in 0..groups as usize {
            for j in 0..size {
                let want = (g + j) % p;
                while queues[want].is_empty() {
                    queues[partition_of(TABLE, next, partitions) as usize].push_back(next);
                    next += 1;
                }
                keys.push(queues[want].pop_front().expect("filled"));
            }
        }
        Self {
            size,
            keys,
            records: next,
        }
    }

    /// Groups.
    pub fn len(&self) -> usize {
        self.keys.len() / self.size.max(1)
    }

    /// True without groups.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Objects per group.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Keys loaded (`0..records`).
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Group `g`'s keys.
    pub fn keys(&self, g: usize) -> &[u64] {
        &self.keys[g * self.size..(g + 1) * self.size]
    }

    /// Every group's keys as audit items, group by group.
    fn items(&self) -> Vec<(u32, u64)> {
        self.keys.iter().map(|&k| (TABLE, k)).collect()
    }
}

/// A value as written: `v` twice, little-endian.
pub fn encode(v: u64) -> Vec<u8> {
    let mut b = Vec::with_capacity(VALUE_BYTES);
    b.extend_from_slice(&v.to_le_bytes());
    b.extend_from_slice(&v.to_le_bytes());
    b
}

/// The `v` of `key`'s value `b`: a written one holds `v` twice, one as loaded is
/// KVS counter 0 with its checksum ([`txn::kvs::check_value`]) and reads as 0.
///
/// Errors: a value of another size, two copies that differ, a loaded value whose
/// checksum does not match.
pub fn decode(key: u64, b: &[u8]) -> Result<u64, String> {
    let Ok(b16) = <[u8; VALUE_BYTES]>::try_from(b) else {
        return Err(format!(
            "key {key}: value of {} bytes, expected {VALUE_BYTES}",
            b.len()
        ));
    };
    let v = u64::from_le_bytes(b16[..8].try_into().expect("8 bytes"));
    let copy = u64::from_le_bytes(b16[8..].try_into().expect("8 bytes"));
    if v == 0 {
        return txn::kvs::check_value(key, b).map(|_| 0);
    }
    if copy != v {
        return Err(format!("key {key}: value {v:#x} with a copy {copy:#x}"));
    }
    Ok(v)
}

/// A committed read of a group: every value decodes ([`decode`]) and they are all
/// equal; the error names the group, its keys and values.
pub fn check_read(group: usize, keys: &[u64], values: &[Vec<u8>]) -> Result<(), String> {
    let vals = keys
        .iter()
        .zip(values)
        .map(|(&k, v)| decode(k, v))
        .collect::<Result<Vec<u64>, String>>()
        .map_err(|e| format!("pairs: a committed read of group {group}: {e}"))?;
    if vals.iter().any(|v| *v != vals[0]) {
        return Err(format!(
            "pairs: a committed read of group {group} found it NOT UNIFORM: keys {keys:?} values {vals:?}"
        ));
    }
    Ok(())
}

/// What the audit of the groups found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PairsCheck {
    /// Groups audited.
    pub groups: usize,
    /// Objects per group.
    pub size: usize,
    /// Groups written at least once (their value is not the loaded 0).
    pub written: usize,
    /// Groups that are not uniform.
    pub bad: usize,
    /// The first non-uniform group: its index, keys and values (`None`: absent).
    pub first_bad: Option<(usize, Vec<u64>, Vec<Option<u64>>)>,
}

impl PairsCheck {
    /// Every group uniform.
    pub fn ok(&self) -> bool {
        self.bad == 0
    }

    /// `pairs: G groups of K: uniform (W written)`, or the first non-uniform group.
    pub fn line(&self) -> String {
        match &self.first_bad {
            None => format!(
                "pairs: {} groups of {}: uniform ({} written)",
                self.groups, self.size, self.written
            ),
            Some((g, keys, values)) => format!(
                "pairs: {} groups of {}: {} NOT UNIFORM (FAILED), first: group {g} keys {keys:?} values {values:?}",
                self.groups, self.size, self.bad
            ),
        }
    }
}

/// Check that every group's objects hold one value: `values` are the objects' values
/// in the order of the groups' keys (`None`: absent; absent and undecodable values
/// ([`decode`]) are never uniform).
pub fn check_groups(groups: &Groups, values: &[Option<Vec<u8>>]) -> PairsCheck {
    let mut c = PairsCheck {
        groups: groups.len(),
        size: groups.size(),
        written: 0,
        bad: 0,
        first_bad: None,
    };
    for g in 0..groups.len() {
        let vals: Vec<Option<u64>> = values
            .get(g * groups.size()..(g + 1) * groups.size())
            .map_or_else(
                || vec![None; groups.size()],
                |v| {
                    v.iter()
                        .zip(groups.keys(g))
                        .map(|(v, &k)| v.as_deref().and_then(|v| decode(k, v).ok()))
                        .collect()
                },
            );
        let uniform = vals[0].is_some() && vals.iter().all(|v| *v == vals[0]);
        if !uniform {
            c.bad += 1;
            if c.first_bad.is_none() {
                c.first_bad = Some((g, groups.keys(g).to_vec(), vals));
            }
        } else if vals[0] != Some(0) {
            c.written += 1;
        }
    }
    c
}

/// `--workload pairs`: `--groups` groups of `--group-size` objects, spread over
/// `--memnodes`.
#[derive(Clone, Debug)]
pub struct Pairs {
    groups: Arc<Groups>,
    partitions: u32,
}

impl Pairs {
    /// The workload of `args`. Errors: `--groups 0`, `--group-size` outside 2 to
    /// [`MAX_GROUP_SIZE`], more than [`MAX_OBJECTS`] objects, SmallBank's
    /// `--hot-accounts`.
    pub fn from_args(args: &Args) -> anyhow::Result<Self> {
        if args.groups == 0 {
            bail!("--groups must be at least 1");
        }
        if !(2..=MAX_GROUP_SIZE).contains(&args.group_size) {
            bail!(
                "--group-size must be 2 to {MAX_GROUP_SIZE} (got {})",
                args.group_size
            );
        }
        if args.groups.saturating_mul(args.group_size as u64) > MAX_OBJECTS {
            bail!(
                "--groups x --group-size must be at most {MAX_OBJECTS} objects (got {} x {})",
                args.groups,
                args.group_size
            );
        }
        crate::txn_args::refuse_hot_accounts(args)?;
        Ok(Self {
            groups: Arc::new(Groups::new(args.groups, args.group_size, args.memnodes)),
            partitions: args.memnodes,
        })
    }

    /// The groups' keys.
    pub fn groups(&self) -> &Groups {
        &self.groups
    }
}

/// Audit the groups of `groups` through `cx`: every group uniform, and the locks held.
pub fn audit_groups(cx: &AuditCx<'_>, groups: &Groups) -> anyhow::Result<Audited> {
    let a = audit(cx.fabric, cx.addrs, cx.protocol, &groups.items())?;
    let c = check_groups(groups, &a.values);
    Ok(Audited {
        total: None,
        cvt_locked: a.cvt_locked,
        lockd_held: a.lockd_held,
        check: Some((c.line(), c.ok())),
    })
}

impl WorkloadSpec for Pairs {
    fn workload(&self) -> Workload {
        Workload::Pairs
    }

    fn label(&self) -> &'static str {
        "pairs"
    }

    fn kinds(&self) -> Vec<&'static str> {
        KINDS.to_vec()
    }

    fn keys(&self) -> u64 {
        self.groups.len() as u64
    }

    fn scale(&self) -> String {
        let spread = if self.partitions as usize >= self.groups.size() {
            "each on different memnodes"
        } else if self.partitions > 1 {
            "cycling over the memnodes"
        } else {
            "on one memnode"
        };
        format!(
            "{} groups of {} objects, {spread}",
            self.groups.len(),
            self.groups.size()
        )
    }

    fn lockd_locks(&self) -> u64 {
        self.groups.records()
    }

    fn memnode_args(&self) -> Vec<String> {
        vec![
            "--kvs-records".into(),
            self.groups.records().to_string(),
            "--kvs-value-bytes".into(),
            VALUE_BYTES.to_string(),
        ]
    }

    /// Every group must be uniform as loaded (all 0).
    fn initial_total(&self, cx: &AuditCx<'_>) -> anyhow::Result<i64> {
        let a = audit_groups(cx, &self.groups)?;
        if let Some((line, false)) = a.check {
            bail!("loaded data: {line}");
        }
        Ok(0)
    }

    fn profiles(&self, theta: f64) -> anyhow::Result<Arc<dyn Mix>> {
        Ok(Arc::new(PairsGen::new(self.groups.clone(), theta)?))
    }

    fn audit_after(&self, cx: &AuditCx<'_>, _: &[WorkerStats]) -> anyhow::Result<Audited> {
        audit_groups(cx, &self.groups)
    }
}

/// Draws groups (Zipf over the group index) and the 50/50 mix.
pub struct PairsGen {
    groups: Arc<Groups>,
    zipf: Zipf<f64>,
}

impl PairsGen {
    /// Groups drawn with Zipf `theta` (0 = uniform). Errors: a bad theta.
    pub fn new(groups: Arc<Groups>, theta: f64) -> anyhow::Result<Self> {
        anyhow::ensure!(theta >= 0.0 && theta.is_finite(), "theta must be >= 0");
        let zipf =
            Zipf::new(groups.len() as f64, theta).map_err(|e| anyhow::anyhow!("zipf: {e}"))?;
        Ok(Self { groups, zipf })
    }
}

/// One transaction: write `value` to group `group` (`Some`), or read it (`None`).
#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize)]
pub struct PairsTxn {
    /// The group.
    pub group: usize,
    /// The value to write, nonzero; `None` for a read-only transaction.
    pub value: Option<u64>,
}

impl Profiles for PairsGen {
    type Txn = PairsTxn;

    fn draw(&self, rng: &mut StdRng, _home: u16) -> (PairsTxn, usize) {
        let group = (self.zipf.sample(rng) as usize - 1).min(self.groups.len() - 1);
        if rng.random_bool(0.5) {
            let value = rng.random_range(1..=u64::MAX);
            (
                PairsTxn {
                    group,
                    value: Some(value),
                },
                0,
            )
        } else {
            (PairsTxn { group, value: None }, 1)
        }
    }

    /// The group's first object, for a transaction that writes it.
    fn first_record(&self, t: &PairsTxn) -> Option<(u32, u64)> {
        t.value?;
        self.groups.keys(t.group).first().map(|&k| (TABLE, k))
    }

    async fn run<'t>(&'t self, mut txn: Txn<'t>, t: &'t PairsTxn) -> Result<Finished, RunError> {
        let keys = self.groups.keys(t.group);
        let items: Vec<(u32, u64)> = keys.iter().map(|&k| (TABLE, k)).collect();
        match t.value {
            Some(v) => {
                txn.read_many_for_update(&items).await?;
                for &k in keys {
                    txn.write(TABLE, k, encode(v))?;
                }
                txn.commit().await?;
            }
            None => {
                txn.declare_read_only();
                let vals = txn.read_many(&items).await?;
                txn.commit().await?;
                // Committed: the reads were one consistent snapshot.
                check_read(t.group, keys, &vals).map_err(RunError::Check)?;
            }
        }
        Ok(Finished::net(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_spread_over_partitions() {
        let g = Groups::new(100, 3, 1);
        assert_eq!(
            (g.len(), g.records(), g.keys(2)),
            (100, 300, &[6, 7, 8][..])
        );
        let g = Groups::new(500, 3, 3);
        let mut all: Vec<u64> = Vec::new();
        for i in 0..g.len() {
            let parts: Vec<u32> = g
                .keys(i)
                .iter()
                .map(|&k| partition_of(TABLE, k, 3))
                .collect();
            assert_eq!(
                parts,
                [i % 3, (i + 1) % 3, (i + 2) % 3].map(|p| p as u32),
                "group {i}"
            );
            all.extend(g.keys(i));
        }
        assert!(all.iter().all(|&k| k < g.records()));
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 1500, "every key in one group only");
    }

    fn loaded(g: &Groups) -> Vec<Option<Vec<u8>>> {
        (0..g.len())
            .flat_map(|i| g.keys(i).to_vec())
            .map(|k| Some(txn::kvs::encode_value(k, 0, VALUE_BYTES)))
            .collect()
    }

    #[test]
    fn the_check_passes_uniform_groups_and_reports_a_planted_violation() {
        let g = Groups::new(4, 3, 2);
        let mut v = loaded(&g);
        let c = check_groups(&g, &v);
        assert!(c.ok(), "{}", c.line());
        assert_eq!(c.line(), "pairs: 4 groups of 3: uniform (0 written)");
        // Group 1 written whole: still uniform.
        for x in &mut v[3..6] {
            *x = Some(encode(77));
        }
        let c = check_groups(&g, &v);
        assert_eq!((c.ok(), c.written), (true, 1));
        // Planted: one object of group 2 written alone, one of group 3 missing.
        v[7] = Some(encode(5));
        v[11] = None;
        let c = check_groups(&g, &v);
        assert!(!c.ok());
        assert_eq!(c.bad, 2);
        let line = c.line();
        assert!(line.contains("2 NOT UNIFORM (FAILED)"), "{line}");
        assert!(
            line.contains(&format!(
                "first: group 2 keys {:?} values [Some(0), Some(5), Some(0)]",
                g.keys(2)
            )),
            "{line}"
        );
    }

    #[test]
    fn a_committed_read_must_decode_and_be_uniform() {
        let loaded = |k| txn::kvs::encode_value(k, 0, VALUE_BYTES);
        assert_eq!(decode(4, &loaded(4)), Ok(0));
        assert_eq!(decode(4, &encode(9)), Ok(9));
        assert!(check_read(1, &[4, 5], &[loaded(4), loaded(5)]).is_ok());
        assert!(check_read(1, &[4, 5], &[encode(9), encode(9)]).is_ok());
        // Planted: a half-written group, a torn value, another key's loaded value.
        let e = check_read(1, &[4, 5], &[encode(9), loaded(5)]).unwrap_err();
        assert!(
            e.contains("group 1 found it NOT UNIFORM: keys [4, 5] values [9, 0]"),
            "{e}"
        );
        let mut torn = encode(9);
        torn[15] ^= 1;
        let e = check_read(1, &[4, 5], &[encode(9), torn]).unwrap_err();
        assert!(e.contains("key 5: value 0x9 with a copy"), "{e}");
        let e = check_read(1, &[4, 5], &[loaded(4), loaded(4)]).unwrap_err();
        assert!(e.contains("key 5: checksum"), "{e}");
        assert!(decode(4, &[0; 8]).is_err());
        assert!(decode(4, &[0; 24]).is_err());
    }

    #[test]
    fn draws_cover_both_kinds_with_nonzero_values() {
        use rand::SeedableRng;
        let p = PairsGen::new(Arc::new(Groups::new(10, 2, 1)), 0.0).unwrap();
        let mut rng = StdRng::seed_from_u64(3);
        let mut kinds = [0; 2];
        for _ in 0..1000 {
            let (t, k) = p.draw(&mut rng, 1);
            kinds[k] += 1;
            assert!(t.group < 10);
            assert_eq!(t.value.is_some(), k == 0);
            assert_ne!(t.value, Some(0));
        }
        assert!(kinds[0] > 400 && kinds[1] > 400, "{kinds:?}");
    }
}
