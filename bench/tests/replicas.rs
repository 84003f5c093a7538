//! Replication (Motor 5.3's 1 primary and f backups per partition, the project's
//! placement: partition p's backups on the next memory nodes), in one process over the
//! shm fabric, for every CVT protocol:
//!
//! - after transactions that update, insert and delete, every backup equals its
//!   primary (the replica audit, `txn::replica_audit`), and a planted commit that skips
//!   its backups now and then is caught by that audit;
//! - an install still goes out in one round, with R times the WRITEs of R = 1 (the
//!   one-sided WRs of one committed transaction counted at R = 1 and R = 3; occ-cas,
//!   which commits as FORD over replicas, adds its undo logs and invisible marks);
//! - a memory node export that does not fit the placement is refused.
//!
//! The planted switch is process-wide, so the tests take turns (`SERIAL`).

use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use lockd::embed::{LockService, LockServiceConfig};
use rrpc::fabric::shm::ClusterGuard;
use rrpc::fabric::{Fabric, FabricConfig, FabricKind, MemoryRegion};
use rrpc::node::{Node, NodeConfig};
use rrpc::runtime::{block_on, RuntimeConfig, ThreadCtx};
use rrpc::NodeId;
use txn::commit_log::{LogExport, LogGeometry};
use txn::coordinator::{
    AbortReason, ClusterAddrs, Isolation, Protocol, TxnClient, TxnConfig, TxnError,
};
use txn::cvt_remote::{backup_partitions, BackupImage, CvtRemote, MemnodeExport, EXPORT_KEY};
use txn::smallbank::{CHECKING, SAVINGS};

static SERIAL: Mutex<()> = Mutex::new(());

const ACCOUNTS: u64 = 300;
const MEMNODES: u32 = 3;
const PROTOCOLS: [Protocol; 3] = [
    Protocol::OccCas,
    Protocol::Scythe,
    Protocol::Mvcc(Isolation::Serializable),
];

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

struct Cluster {
    _guard: ClusterGuard,
    addrs: ClusterAddrs,
    name: String,
    _mem: Vec<(Node, Vec<[MemoryRegion; 3]>, Option<MemoryRegion>)>,
    _lockd: LockService,
    _tso: (tso::Oracle, Node),
}

fn fabric(name: &str, node: u32) -> Fabric {
    Fabric::open(&FabricConfig::new(FabricKind::Shm, name, NodeId(node))).unwrap()
}

/// A memory node's export as the memnode binary builds it: its own partition, then a
/// backup image of each partition `backup_partitions` names; `tamper` may change it.
fn memnode(
    f: &Fabric,
    m: u32,
    replicas: u32,
    tamper: &dyn Fn(&mut MemnodeExport),
) -> (MemnodeExport, Vec<[MemoryRegion; 3]>, Option<MemoryRegion>) {
    let (tables, mut regions): (Vec<_>, Vec<_>) = txn::smallbank::load(f, ACCOUNTS, 3, m, MEMNODES)
        .unwrap()
        .into_iter()
        .unzip();
    let mut backups = Vec::new();
    for q in backup_partitions(m, replicas, MEMNODES) {
        let (bt, br): (Vec<_>, Vec<_>) = txn::smallbank::load(f, ACCOUNTS, 3, q, MEMNODES)
            .unwrap()
            .into_iter()
            .unzip();
        regions.extend(br);
        backups.push(BackupImage {
            partition: q,
            tables: bt,
        });
    }
    // FORD's undo logs (occ-cas over replicas) go to every memory node.
    let undo_geometry = LogGeometry {
        nodes: 64,
        clients: 16,
        slot_bytes: 4096,
    };
    let undo_region =
        (replicas > 1).then(|| f.alloc_mr(undo_geometry.region_bytes() as usize).unwrap());
    let undo = undo_region.as_ref().map(|mr| LogExport {
        region: mr.desc(),
        geometry: undo_geometry,
    });
    let mut export = MemnodeExport {
        partition: m,
        partitions: MEMNODES,
        tables,
        replicas,
        backups,
        spare: false,
        log: None,
        undo,
    };
    tamper(&mut export);
    (export, regions, undo_region)
}

fn cluster(test: &str, replicas: u32, tamper: &dyn Fn(&mut MemnodeExport)) -> Cluster {
    let (guard, _) = ClusterGuard::new(&format!("repl-{test}-{}", std::process::id())).unwrap();
    let name = guard.name().to_string();
    let (mut mem, mut memnodes) = (Vec::new(), Vec::new());
    for m in 0..MEMNODES {
        let f = fabric(&name, 1 + m);
        let (export, regions, undo) = memnode(&f, m, replicas, tamper);
        let mut exports = BTreeMap::new();
        exports.insert(EXPORT_KEY.into(), serde_json::to_value(&export).unwrap());
        let node = Node::start(
            f,
            NodeConfig::new("memnode", "127.0.0.1:0".parse().unwrap()).with_exports(exports),
        )
        .unwrap();
        memnodes.push(node.addr());
        mem.push((node, regions, undo));
    }
    let lockd = LockService::start(
        fabric(&name, 8),
        "127.0.0.1:0".parse().unwrap(),
        &LockServiceConfig::default().with_locks(8 * ACCOUNTS),
    )
    .unwrap();
    let tf = fabric(&name, 9);
    let oracle = tso::Oracle::with_epoch(&tf, 1).unwrap();
    let tso_node = oracle.serve(tf, "127.0.0.1:0".parse().unwrap()).unwrap();
    Cluster {
        addrs: ClusterAddrs {
            memnodes,
            lockd: Some(lockd.addr()),
            tso: tso_node.addr(),
        },
        name,
        _guard: guard,
        _mem: mem,
        _lockd: lockd,
        _tso: (oracle, tso_node),
    }
}

impl Cluster {
    fn client(&self, protocol: Protocol, node: u32) -> Rc<TxnClient> {
        self.client_with(node, TxnConfig::default().with_protocol(protocol))
    }

    fn client_with(&self, node: u32, cfg: TxnConfig) -> Rc<TxnClient> {
        let ctx = ThreadCtx::new(fabric(&self.name, node), RuntimeConfig::default()).unwrap();
        Rc::new(TxnClient::connect(ctx, &self.addrs, cfg).unwrap())
    }

    /// The replica audit, as txn-bench runs it after a run.
    fn audit(&self) -> txn::replica_audit::ReplicaAudit {
        let ctx = ThreadCtx::new(fabric(&self.name, 60), RuntimeConfig::default()).unwrap();
        let store = CvtRemote::connect(ctx.clone(), &self.addrs.memnodes, 16).unwrap();
        block_on(&ctx, async move {
            txn::replica_audit::audit_replicas(&store).await.unwrap()
        })
    }
}

fn bal(v: &[u8]) -> i64 {
    i64::from_le_bytes(v.try_into().unwrap())
}

/// Run `f` as one transaction until it commits (aborts retried, for up to 10 s).
async fn retry<F>(c: &TxnClient, f: F)
where
    F: for<'t> AsyncTxn<'t>,
{
    let t0 = Instant::now();
    loop {
        let mut t = c.begin();
        let r = match f.run(&mut t).await {
            Ok(()) => t.commit().await,
            Err(e) => Err(e),
        };
        match r {
            Ok(()) => return,
            Err(TxnError::Abort(r))
                if r != AbortReason::User && t0.elapsed() < Duration::from_secs(10) =>
            {
                c.ctx().sleep(Duration::from_micros(100)).await;
            }
            Err(e) => panic!("a transaction failed: {e}"),
        }
    }
}

/// A transaction body (a closure over `&mut Txn` returning a future cannot name its
/// lifetime otherwise).
trait AsyncTxn<'t> {
    async fn run(&self, t: &mut txn::coordinator::Txn<'t>) -> Result<(), TxnError>;
}

/// Move `amount` from savings `from` to checking `to`.
struct Transfer(u64, u64, i64);
impl<'t> AsyncTxn<'t> for Transfer {
    async fn run(&self, t: &mut txn::coordinator::Txn<'t>) -> Result<(), TxnError> {
        let s = bal(&t.read_for_update(SAVINGS, self.0).await?);
        let c = bal(&t.read_for_update(CHECKING, self.1).await?);
        t.write(SAVINGS, self.0, (s - self.2).to_le_bytes().to_vec())?;
        t.write(CHECKING, self.1, (c + self.2).to_le_bytes().to_vec())
    }
}

/// Insert a savings account `k` (beyond the loaded ones) with balance `v`.
struct Insert(u64, i64);
impl<'t> AsyncTxn<'t> for Insert {
    async fn run(&self, t: &mut txn::coordinator::Txn<'t>) -> Result<(), TxnError> {
        t.insert(SAVINGS, self.0, self.1.to_le_bytes().to_vec())
            .await
    }
}

/// Delete savings account `k`.
struct Delete(u64);
impl<'t> AsyncTxn<'t> for Delete {
    async fn run(&self, t: &mut txn::coordinator::Txn<'t>) -> Result<(), TxnError> {
        t.delete(SAVINGS, self.0).await
    }
}

/// `n` transfers between pseudo-random accounts on 4 coroutines, then a few inserts and
/// deletes of accounts beyond the loaded ones.
fn workload(c: &Rc<TxnClient>, n: u64, round: u64) {
    let ctx = c.ctx().clone();
    let c = c.clone();
    block_on(&ctx, async move {
        let per = n / 4;
        let jobs = (0..4u64).map(|w| {
            let c = c.clone();
            async move {
                for i in 0..per {
                    let x = (w * 7919 + i * 104_729 + round * 31) % ACCOUNTS;
                    let y = (x * 13 + 5) % ACCOUNTS;
                    retry(&c, Transfer(x, y, 1 + (i % 5) as i64)).await;
                }
            }
        });
        rrpc::runtime::join_all(jobs).await;
        for k in 0..6 {
            retry(&c, Insert(ACCOUNTS + round * 100 + k, 1000 + k as i64)).await;
        }
        for k in 0..3 {
            retry(&c, Delete(ACCOUNTS + round * 100 + k)).await;
        }
    });
}

#[test]
fn backups_stay_identical_under_every_protocol_and_a_skipped_backup_install_is_caught() {
    let _s = serial();
    for (i, protocol) in PROTOCOLS.into_iter().enumerate() {
        let cl = cluster(&format!("same{i}"), 3, &|_| {});
        let c = cl.client(protocol, 30);
        workload(&c, 400, 0);
        let a = cl.audit();
        assert!(a.ok(), "{protocol:?}: {}", a.line());
        assert_eq!((a.partitions, a.backups), (3, 2));
        // Both tables' loaded rows on both backups of each partition, and more than
        // the loaded version of some (the transfers installed versions).
        assert!(a.cvts >= 2 * 2 * ACCOUNTS, "{}", a.line());
        assert!(a.records > a.cvts, "{}", a.line());
        assert!(a.line().ends_with("identical"), "{}", a.line());

        // The planted bug: every 7th install WRITEs the primary only.
        txn::fault::skip_backup_install(7);
        workload(&c, 100, 1);
        txn::fault::skip_backup_install(0);
        let a = cl.audit();
        assert!(
            !a.ok(),
            "{protocol:?}: the audit missed skipped backup installs"
        );
        let line = a.line();
        assert!(line.contains("DIFFERENT: partition"), "{line}");
        assert!(
            line.contains("version: primary") || line.contains("valid: primary"),
            "{line}"
        );
    }
}

/// WRs one committed transfer posts (on a warmed-up client, so no lookup misses).
fn wrs_of_one_transfer(cl: &Cluster, protocol: Protocol) -> u64 {
    let c = cl.client(protocol, 31);
    let ctx = c.ctx().clone();
    block_on(&ctx.clone(), async move {
        retry(&c, Transfer(11, 12, 1)).await;
        let before = c.ctx().stats().wrs;
        retry(&c, Transfer(11, 12, 1)).await;
        c.ctx().stats().wrs - before
    })
}

#[test]
fn an_install_to_three_copies_posts_three_times_its_writes() {
    let _s = serial();
    for (i, protocol) in PROTOCOLS.into_iter().enumerate() {
        let one = wrs_of_one_transfer(&cluster(&format!("r1-{i}"), 1, &|_| {}), protocol);
        let three = wrs_of_one_transfer(&cluster(&format!("r3-{i}"), 3, &|_| {}), protocol);
        // Two objects written, a record and a cell each: 4 WRITEs at R = 1, 12 at
        // R = 3; every other WR (reads, locks, validation, unlocks, RPCs) the same.
        // occ-cas over replicas commits as FORD: an undo log to each of the 3 memory
        // nodes, each copy's lock word marked invisible ahead of its record and cell
        // (3 WRs per copy instead of 2 per primary), and the unlock round clearing the
        // mark on the backups too (2 more WRs per object).
        let extra = match protocol {
            Protocol::OccCas => 3 + 2 * (3 * 3 - 2) + 2 * 2,
            _ => 2 * 2 * 2,
        };
        assert_eq!(
            three - one,
            extra,
            "{protocol:?}: {one} WRs at R = 1, {three} at R = 3"
        );
    }
}

/// READs one read-only transaction of savings `keys` posts to each memory node, and the
/// balances it read; the client's cache is warmed first (a read of each key).
fn ro_reads(c: &Rc<TxnClient>, keys: &[u64]) -> (Vec<u64>, Vec<i64>) {
    let ctx = c.ctx().clone();
    let c = c.clone();
    let keys = keys.to_vec();
    block_on(&ctx.clone(), async move {
        let read_all = |c: Rc<TxnClient>, keys: Vec<u64>| async move {
            let t0 = Instant::now();
            loop {
                let mut t = c.begin();
                t.declare_read_only();
                let mut got = Vec::new();
                let mut r = Ok(());
                for &k in &keys {
                    match t.read(SAVINGS, k).await {
                        Ok(v) => got.push(bal(&v)),
                        Err(e) => {
                            r = Err(e);
                            break;
                        }
                    }
                }
                match r.and(t.commit().await) {
                    Ok(()) => return got,
                    Err(TxnError::Abort(_)) if t0.elapsed() < Duration::from_secs(10) => {}
                    Err(e) => panic!("a read-only transaction failed: {e}"),
                }
            }
        };
        read_all(c.clone(), keys.clone()).await;
        let before: Vec<_> = (0..MEMNODES)
            .map(|m| c.ctx().op_counts(NodeId(1 + m)).reads)
            .collect();
        let got = read_all(c.clone(), keys).await;
        let reads = (0..MEMNODES)
            .map(|m| c.ctx().op_counts(NodeId(1 + m)).reads - before[m as usize])
            .collect();
        (reads, got)
    })
}

#[test]
fn ford_backup_reads_take_read_only_transactions_off_the_primaries() {
    let _s = serial();
    let cl = cluster("fbr", 3, &|_| {});
    // Four savings accounts of partition 0, whose primary is memory node 0.
    let keys: Vec<u64> = (0..ACCOUNTS)
        .filter(|&k| txn::cvt_remote::partition_of(SAVINGS, k, MEMNODES) == 0)
        .take(4)
        .collect();
    let writer = cl.client(Protocol::OccCas, 30);
    workload(&writer, 200, 0);
    let (on_primary, want) = ro_reads(&cl.client(Protocol::OccCas, 31), &keys);
    let backups = cl.client_with(
        32,
        TxnConfig::default()
            .with_protocol(Protocol::OccCas)
            .with_ford_backup_reads(true),
    );
    let (on_backups, got) = ro_reads(&backups, &keys);
    // The same balances, as committed.
    assert_eq!(got, want);
    // Without backup reads: the reads and the validation on the primary alone.
    assert!(on_primary[0] >= 2 * keys.len() as u64, "{on_primary:?}");
    assert_eq!(on_primary[1] + on_primary[2], 0, "{on_primary:?}");
    // With them: not one READ on the primary; a CVT, a record and a validation READ per
    // key on the backups (memory nodes 1 and 2).
    assert_eq!(on_backups[0], 0, "{on_backups:?}");
    assert_eq!(
        on_backups[1] + on_backups[2],
        3 * keys.len() as u64,
        "{on_backups:?}"
    );
}

#[test]
fn exports_that_do_not_fit_the_placement_are_refused() {
    let _s = serial();
    // A backup image of the wrong partition.
    let cl = cluster("badplace", 2, &|e| {
        if e.partition == 1 {
            e.backups[0].partition = 2;
        }
    });
    let ctx = ThreadCtx::new(fabric(&cl.name, 61), RuntimeConfig::default()).unwrap();
    let err = CvtRemote::connect(ctx, &cl.addrs.memnodes, 16)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("hosts backups of partitions [2], expected [0]"),
        "{err}"
    );
    // Memory nodes that disagree on the number of copies.
    let cl = cluster("badcount", 2, &|e| {
        if e.partition == 2 {
            e.replicas = 1;
            e.backups.clear();
        }
    });
    let ctx = ThreadCtx::new(fabric(&cl.name, 61), RuntimeConfig::default()).unwrap();
    let err = CvtRemote::connect(ctx, &cl.addrs.memnodes, 16)
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("replicas"), "{err}");
}
