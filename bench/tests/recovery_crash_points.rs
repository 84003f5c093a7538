//! Recovery of a dead coordinator's commits and locks (txn::recovery), at each crash
//! point of a commit, for every protocol (Lotus's lock table shared by the coordinators
//! of the process, as two compute nodes' tables would hold each other's locks), in one
//! process over the shm fabric: the
//! dying coordinator freezes at the point (its future never runs again and holds what
//! it holds, as a killed node's would), a survivor recovers its incarnation, and then:
//!
//! - the group it was writing is uniform (all old values, or all new), and which one
//!   follows the crash point (rolled back before all installs landed, forward after);
//! - no CVT lock word, insert guard or ticket of it is held (a survivor can write the
//!   whole group at once), and no slot it claimed stays claimed;
//! - planted bugs (no roll-back, a roll-back that ignores a later writer, no sweep) are
//!   each caught by these checks.
//!
//! The crash switches are process-wide, so the tests take turns (`SERIAL`).

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
use txn::cvt_remote::{MemnodeExport, EXPORT_KEY};
use txn::fault::{CrashAction, CrashPoint, RecoveryBug};
use txn::smallbank::SAVINGS;

static SERIAL: Mutex<()> = Mutex::new(());

const ACCOUNTS: u64 = 64;
/// The group: savings accounts spread over both partitions.
const GROUP: [u64; 3] = [3, 17, 40];
/// A group of twelve objects: its commit log has twelve entries (328 bytes).
const LONG_GROUP: [u64; 12] = [1, 6, 11, 16, 21, 26, 31, 36, 41, 46, 51, 56];
const PROTOCOLS: [Protocol; 4] = [
    Protocol::OccCas,
    Protocol::Scythe,
    Protocol::Mvcc(Isolation::Serializable),
    Protocol::Lotus(Isolation::Serializable),
];

struct Cluster {
    guard: ClusterGuard,
    addrs: ClusterAddrs,
    _mem: Vec<(Node, Vec<[MemoryRegion; 3]>, MemoryRegion, MemoryRegion)>,
    _lockd: LockService,
    _tso: (tso::Oracle, Node),
    /// Lotus's lock table (node 50's), which every client of the process shares.
    lotus: txn::lotus::LotusSite,
}

fn fabric(name: &str, node: u32) -> Fabric {
    Fabric::open(&FabricConfig::new(FabricKind::Shm, name, NodeId(node))).unwrap()
}

fn cluster(test: &str) -> Cluster {
    cluster_with(test, 1)
}

/// Two memory nodes, each partition with `replicas` copies (its backup on the other).
fn cluster_with(test: &str, replicas: u32) -> Cluster {
    let (guard, _) = ClusterGuard::new(&format!("rec-{test}-{}", std::process::id())).unwrap();
    let name = guard.name().to_string();
    let geometry = LogGeometry {
        nodes: 16,
        clients: 64,
        slot_bytes: 1024,
    };
    let (mut mem, mut memnodes) = (Vec::new(), Vec::new());
    for p in 0..2 {
        let f = fabric(&name, 1 + p);
        let loaded = txn::smallbank::load(&f, ACCOUNTS, 3, p, 2).unwrap();
        let (tables, mut regions): (Vec<_>, Vec<_>) = loaded.into_iter().unzip();
        let mut backups = Vec::new();
        for q in txn::cvt_remote::backup_partitions(p, replicas, 2) {
            let loaded = txn::smallbank::load(&f, ACCOUNTS, 3, q, 2).unwrap();
            let (bt, br): (Vec<_>, Vec<_>) = loaded.into_iter().unzip();
            regions.extend(br);
            backups.push(txn::cvt_remote::BackupImage {
                partition: q,
                tables: bt,
            });
        }
        let log = f.alloc_mr(geometry.region_bytes() as usize).unwrap();
        // FORD's undo logs (occ-cas over replicas) go to every memory node.
        let undo = f.alloc_mr(geometry.region_bytes() as usize).unwrap();
        let export = MemnodeExport {
            partition: p,
            partitions: 2,
            tables,
            replicas,
            backups,
            spare: false,
            log: Some(LogExport {
                region: log.desc(),
                geometry,
            }),
            undo: (replicas > 1).then(|| LogExport {
                region: undo.desc(),
                geometry,
            }),
        };
        let mut exports = BTreeMap::new();
        exports.insert(EXPORT_KEY.into(), serde_json::to_value(&export).unwrap());
        let node = Node::start(
            f,
            NodeConfig::new("memnode", "127.0.0.1:0".parse().unwrap()).with_exports(exports),
        )
        .unwrap();
        memnodes.push(node.addr());
        mem.push((node, regions, log, undo));
    }
    let lockd = LockService::start(
        fabric(&name, 8),
        "127.0.0.1:0".parse().unwrap(),
        &LockServiceConfig::default().with_locks(4 * ACCOUNTS),
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
        guard,
        _mem: mem,
        _lockd: lockd,
        _tso: (oracle, tso_node),
        lotus: txn::lotus::LotusSite::single(50, 1 << 16),
    }
}

impl Cluster {
    /// A client on node `node`, incarnation `inc`, with commit logs.
    fn client(&self, protocol: Protocol, node: u32, inc: u64) -> Rc<TxnClient> {
        client_on(
            &self.addrs,
            self.guard.name(),
            protocol,
            node,
            inc,
            &self.lotus,
        )
    }
}

fn client_on(
    addrs: &ClusterAddrs,
    name: &str,
    protocol: Protocol,
    node: u32,
    inc: u64,
    lotus: &txn::lotus::LotusSite,
) -> Rc<TxnClient> {
    // The node's life as the membership service would name it: the fabric's
    // incarnation, which the transaction ids and the lock service's tickets carry.
    let mut fcfg = FabricConfig::new(FabricKind::Shm, name, NodeId(node));
    fcfg.incarnation = inc;
    let ctx = ThreadCtx::new(Fabric::open(&fcfg).unwrap(), RuntimeConfig::default()).unwrap();
    let cfg = client_config(protocol, node, lotus);
    Rc::new(TxnClient::connect(ctx, addrs, cfg).unwrap())
}

/// The settings of every client here: commit logs on; Lotus's shared table, this
/// client's locks held as its node's.
fn client_config(protocol: Protocol, node: u32, lotus: &txn::lotus::LotusSite) -> TxnConfig {
    let lotus = protocol.needs_lock_tables().then(|| txn::lotus::LotusSite {
        node,
        ..lotus.clone()
    });
    TxnConfig::default()
        .with_protocol(protocol)
        .with_commit_log(true)
        .with_lock_wait(Duration::from_millis(300))
        .with_lotus(lotus)
}

fn val(v: u64) -> Vec<u8> {
    (v as i64).to_le_bytes().to_vec()
}

/// Write `v` to every object of the group in one transaction, retried on aborts for up
/// to 5 s. Errors: the last error when it never committed.
async fn write_group(c: &TxnClient, keys: &[u64], v: u64) -> Result<(), TxnError> {
    let t0 = Instant::now();
    loop {
        let mut t = c.begin();
        let r = async {
            t.read_many_for_update(&keys.iter().map(|&k| (SAVINGS, k)).collect::<Vec<_>>())
                .await?;
            for &k in keys {
                t.write(SAVINGS, k, val(v))?;
            }
            t.commit().await
        }
        .await;
        match r {
            Ok(()) => return Ok(()),
            Err(TxnError::Abort(r))
                if r != AbortReason::User && t0.elapsed() < Duration::from_secs(5) =>
            {
                c.ctx().sleep(Duration::from_micros(200)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

async fn group_values(c: &TxnClient, group: &[u64]) -> Vec<u64> {
    let mut out = Vec::new();
    for &k in group {
        let (_, v) = c.read_committed(SAVINGS, k).await.unwrap().unwrap();
        out.push(i64::from_le_bytes(v.try_into().unwrap()) as u64);
    }
    out
}

/// Run the dying coordinator (node 30, incarnation 1) writing `new` to the group until
/// it freezes at `point`, on a thread of its own that then parks for good: the frozen
/// coordinator is never polled again and nothing of it is dropped (a destructor would
/// release what it holds, which a killed node's cannot).
fn die_at(
    cl: &Cluster,
    protocol: Protocol,
    point: CrashPoint,
    new: u64,
    group: &'static [u64],
) -> (u32, u64) {
    die_at_after(cl, protocol, point, new, group, false)
}

/// [`die_at`]; with `finished_first`, another client of the same node and thread first
/// commits `new` to the group (its log stays in its slot), and the dying one writes
/// `new + 1` and freezes at `point`'s second occurrence.
fn die_at_after(
    cl: &Cluster,
    protocol: Protocol,
    point: CrashPoint,
    new: u64,
    group: &'static [u64],
    finished_first: bool,
) -> (u32, u64) {
    let nth = if finished_first { 2 } else { 1 };
    txn::fault::crash_at(Some((point, nth, CrashAction::Freeze)));
    let (addrs, name) = (cl.addrs.clone(), cl.guard.name().to_string());
    let lotus = cl.lotus.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let dying = client_on(&addrs, &name, protocol, 30, 1, &lotus);
        let owner = (30, 1);
        let ctx = dying.ctx().clone();
        let d = dying.clone();
        let first = finished_first.then(|| {
            let cfg = client_config(protocol, 30, &lotus);
            Rc::new(TxnClient::connect(ctx.clone(), &addrs, cfg).unwrap())
        });
        ctx.spawn(async move {
            // `first` lives as long as the frozen task: a dropped client's log slots go
            // to the next client, which would overwrite its log.
            let new = match &first {
                Some(f) => {
                    write_group(f, group, new).await.unwrap();
                    new + 1
                }
                None => new,
            };
            let _ = write_group(&d, group, new).await;
        });
        let c = ctx.clone();
        block_on(&ctx, async move {
            let t0 = Instant::now();
            while !txn::fault::frozen() {
                assert!(
                    t0.elapsed() < Duration::from_secs(10),
                    "never reached {point:?}"
                );
                c.sleep(Duration::from_micros(100)).await;
            }
            // Dead from here: the thread stops inside its executor, which never polls
            // the frozen coordinator (or anything) again.
            tx.send(owner).unwrap();
            loop {
                std::thread::park();
            }
        });
    });
    let owner = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the dying coordinator reached its crash point");
    txn::fault::crash_at(None);
    owner
}

/// What a survivor sees after recovering: the group's values, and whether it can write
/// the whole group at once (nothing of the dead coordinator held).
struct After {
    values: Vec<u64>,
    /// The later writer of the first object ran (the dead coordinator had released it).
    later_ran: bool,
    rolled: (usize, usize),
    writable: bool,
    locked_words: usize,
    /// The replica audit right after recovery.
    replicas: txn::replica_audit::ReplicaAudit,
}

fn crash_and_recover(
    name: &str,
    protocol: Protocol,
    point: CrashPoint,
    later_writes: u64,
) -> After {
    crash_and_recover_with(name, protocol, point, later_writes, 1, &GROUP, false)
}

/// [`crash_and_recover`] with `replicas` copies of each partition and `group`; with
/// `finished_first`, the dead node had committed 2 to the group before it died writing
/// 3 ([`die_at_after`]).
fn crash_and_recover_with(
    name: &str,
    protocol: Protocol,
    point: CrashPoint,
    later_writes: u64,
    replicas: u32,
    group: &'static [u64],
    finished_first: bool,
) -> After {
    let cl = cluster_with(name, replicas);
    let live = cl.client(protocol, 40, 1);
    let l = live.clone();
    block_on(&live.ctx().clone(), async move {
        write_group(&l, group, 1).await.unwrap()
    });
    let dead = die_at_after(&cl, protocol, point, 2, group, finished_first);
    let l = live.clone();
    let name = name.to_string();
    let addrs = cl.addrs.memnodes.clone();
    block_on(&live.ctx().clone(), async move {
        // A later writer of the first object, which the dead coordinator may have
        // released already (crash after its first unlock): enough writes to reuse the
        // dead coordinator's cell.
        let later_ran = later_writes > 0 && !l.cvt_locked(SAVINGS, group[0]).await.unwrap();
        if later_ran {
            for i in 0..later_writes {
                write_group(&l, &group[..1], 100 + i).await.unwrap();
            }
        }
        let rep = l.recover(dead.0, dead.1).await.unwrap();
        println!("{name}: recovery: {}", rep.summary());
        let values = group_values(&l, group).await;
        let mut locked_words = 0;
        for k in 0..ACCOUNTS {
            locked_words += usize::from(l.cvt_locked(SAVINGS, k).await.unwrap());
        }
        // The copies after recovery, before anything else writes (a roll-back must
        // have invalidated the victim cells on the backups too).
        let store = txn::cvt_remote::CvtRemote::connect(l.ctx().clone(), &addrs, 16).unwrap();
        let replicas = txn::replica_audit::audit_replicas(&store).await.unwrap();
        let writable = write_group(&l, group, 7).await.is_ok();
        After {
            values,
            later_ran,
            rolled: (rep.forward, rep.back),
            writable,
            locked_words,
            replicas,
        }
    })
}

/// The group's value after recovery from a crash at `point` (1 before, 2 after): rolled
/// back before every install landed; for Lotus before the write-visible step began (its
/// commit timestamp is taken only after every install landed).
fn expect_after(protocol: Protocol, point: CrashPoint) -> u64 {
    match point {
        CrashPoint::AfterLock | CrashPoint::AfterLog | CrashPoint::AfterFirstInstall => 1,
        CrashPoint::AfterInstalls if protocol.needs_lock_tables() => 1,
        CrashPoint::AfterInstalls | CrashPoint::AfterFirstPublish => 2,
        CrashPoint::AfterFirstUnlock => 2,
    }
}

#[test]
fn every_protocol_recovers_at_every_crash_point() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (i, p) in PROTOCOLS.into_iter().enumerate() {
        for (j, point) in CrashPoint::ALL.into_iter().enumerate() {
            if point.lotus_only() && !p.needs_lock_tables() {
                continue;
            }
            let a = crash_and_recover(&format!("all{i}{j}"), p, point, 0);
            let want = expect_after(p, point);
            assert_eq!(a.values, vec![want; GROUP.len()], "{p} at {point:?}");
            assert_eq!(a.locked_words, 0, "{p} at {point:?}: lock words left held");
            assert!(
                a.writable,
                "{p} at {point:?}: the group cannot be written after recovery"
            );
            if point == CrashPoint::AfterFirstInstall {
                assert_eq!(a.rolled, (0, 1), "{p}: one log, rolled back");
            }
            if point == CrashPoint::AfterFirstPublish {
                assert_eq!(a.rolled, (1, 0), "{p}: one log, rolled forward");
            }
        }
    }
}

/// A log of twelve objects is found and settled either way, every object rolled back
/// or every one forward.
#[test]
fn a_log_of_twelve_objects_is_settled_either_way() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (i, p) in [Protocol::OccCas, Protocol::Lotus(Isolation::Serializable)]
        .into_iter()
        .enumerate()
    {
        for (j, point) in [CrashPoint::AfterFirstInstall, CrashPoint::AfterInstalls]
            .into_iter()
            .enumerate()
        {
            let a =
                crash_and_recover_with(&format!("long{i}{j}"), p, point, 0, 1, &LONG_GROUP, false);
            let want = expect_after(p, point);
            assert_eq!(a.values, vec![want; LONG_GROUP.len()], "{p} at {point:?}");
            let rolled = if want == 2 { (1, 0) } else { (0, 1) };
            assert_eq!(
                a.rolled, rolled,
                "{p} at {point:?}: one log, found and settled"
            );
            assert_eq!(a.locked_words, 0, "{p} at {point:?}: lock words left held");
            assert!(
                a.writable,
                "{p} at {point:?}: the group cannot be written after recovery"
            );
        }
    }
}

#[test]
fn with_backups_recovery_settles_every_copy() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (i, p) in PROTOCOLS.into_iter().enumerate() {
        // Rolled back after the first install (which reached the primary and its
        // backup), rolled forward after all installs.
        for (j, point) in [
            CrashPoint::AfterFirstInstall,
            CrashPoint::AfterInstalls,
            CrashPoint::AfterFirstPublish,
        ]
        .into_iter()
        .enumerate()
        {
            if point.lotus_only() && !p.needs_lock_tables() {
                continue;
            }
            let a = crash_and_recover_with(&format!("repl{i}{j}"), p, point, 0, 2, &GROUP, false);
            let want = expect_after(p, point);
            assert_eq!(a.values, vec![want; GROUP.len()], "{p} at {point:?}");
            assert!(a.replicas.ok(), "{p} at {point:?}: {}", a.replicas.line());
            assert_eq!(a.replicas.backups, 1);
            assert_eq!(a.locked_words, 0, "{p} at {point:?}");
            assert!(a.writable, "{p} at {point:?}");
        }
    }
}

/// Two logs of the dead node name the same objects: one of a commit that finished (its
/// log still in its slot) and one of a commit that died after its first install, on
/// every copy of two. Settled side by side, the finished one rolls forward and changes
/// nothing, the other rolls back everywhere, and nothing stays locked.
#[test]
fn a_finished_and_a_dying_log_of_one_node_settle_side_by_side() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (i, p) in PROTOCOLS.into_iter().enumerate() {
        let a = crash_and_recover_with(
            &format!("two{i}"),
            p,
            CrashPoint::AfterFirstInstall,
            0,
            2,
            &GROUP,
            true,
        );
        assert_eq!(
            a.values,
            vec![2; GROUP.len()],
            "{p}: the finished commit stands"
        );
        assert_eq!(a.rolled, (1, 1), "{p}: both logs found, one each way");
        assert!(a.replicas.ok(), "{p}: {}", a.replicas.line());
        assert_eq!(a.locked_words, 0, "{p}");
        assert!(a.writable, "{p}");
    }
}

#[test]
fn a_later_writer_of_a_released_object_survives_recovery() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (i, p) in [Protocol::OccCas, Protocol::Mvcc(Isolation::Serializable)]
        .into_iter()
        .enumerate()
    {
        // Three later writes with 3 versions per CVT: the dead coordinator's cell of the
        // first object is reused.
        let a = crash_and_recover(&format!("late{i}"), p, CrashPoint::AfterFirstUnlock, 3);
        // When the dead coordinator had released the first object, its later writer's
        // last value stands and the others keep the dead commit.
        if a.later_ran {
            assert_eq!(a.values, vec![102, 2, 2], "{p}");
        } else {
            assert_eq!(a.values, vec![2, 2, 2], "{p}");
        }
    }
}

#[test]
fn planted_recovery_bugs_are_caught() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let p = Protocol::OccCas;
    txn::fault::recovery_bug(Some(RecoveryBug::NoRollBack));
    let a = crash_and_recover("bug-nrb", p, CrashPoint::AfterFirstInstall, 0);
    txn::fault::recovery_bug(None);
    assert_ne!(
        a.values,
        vec![a.values[0]; GROUP.len()],
        "no roll-back leaves a half install"
    );

    txn::fault::recovery_bug(Some(RecoveryBug::NoSweep));
    let a = crash_and_recover("bug-nsw", p, CrashPoint::AfterLock, 0);
    txn::fault::recovery_bug(None);
    assert!(
        a.locked_words > 0 && !a.writable,
        "without the sweep the locks stay held"
    );

    // Roll back unless every logged cell holds its version: after a later writer reused
    // the dead coordinator's cell of a released object, that writer's commit is lost.
    txn::fault::recovery_bug(Some(RecoveryBug::RollBackUnlessAllLanded));
    let a = crash_and_recover("bug-rb", p, CrashPoint::AfterFirstUnlock, 3);
    txn::fault::recovery_bug(None);
    assert!(
        a.later_ran,
        "the first object was released before the crash"
    );
    assert_ne!(
        a.values,
        vec![102, 2, 2],
        "a roll-back after the first unlock went unnoticed"
    );
}

/// An insert that died between its claim and its publish leaves its bucket's guard held
/// and a slot claimed. The claim carries the inserter's id in the slot's state word,
/// whatever lock word the protocol writes (0 for Lotus and Scythe), so the recovery frees
/// the slot on the primary and on the backup (to which the insert had already written its
/// copy), and releases the guard: Lotus through its sweep of the guards alone (its ids are
/// in no CVT lock word, so it READs no index and seeks the claim from the guard), Scythe
/// through the scan of the index. With the sweep planted away the guard stays held and
/// the slot claimed, lost to every later insert.
#[test]
fn a_dead_inserters_claim_is_freed_on_every_replica() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (i, p) in [Protocol::Lotus(Isolation::Serializable), Protocol::Scythe]
        .into_iter()
        .enumerate()
    {
        for planted in [false, true] {
            let cl = cluster_with(&format!("claim{i}{}", u8::from(planted)), 2);
            let live = cl.client(p, 40, 1);
            let addrs = cl.addrs.memnodes.clone();
            let l = live.clone();
            if planted {
                txn::fault::recovery_bug(Some(RecoveryBug::NoSweep));
            }
            let (states, claims) = block_on(&live.ctx().clone(), async move {
                let store =
                    txn::cvt_remote::CvtRemote::connect(l.ctx().clone(), &addrs, 16).unwrap();
                let key = ACCOUNTS + 5;
                let part = txn::cvt_remote::partition_of(SAVINGS, key, store.partitions());
                let t = store.part_tables(part).unwrap()[SAVINGS as usize].clone();
                let node = store.primary_node(part).unwrap();
                let id = txn::txn_id::TxnId {
                    owner: txn::txn_id::Owner::new(30, 1),
                    client: 7,
                    seq: 1,
                }
                .pack();
                // Node 30's first life, inserting `key`: its guard, then the first free
                // slot of the chain claimed, the header written on the primary and the
                // whole copy on the backup; then it dies.
                let home = t.home_bucket(key);
                assert_eq!(
                    store
                        .ctx()
                        .cas(node, t.guard_addr(home), 0, id)
                        .await
                        .unwrap(),
                    0
                );
                let (b, slot, was) = {
                    let mut b = home;
                    loop {
                        let img = store.ctx().read(node, t.bucket_addr(b), t.bucket_bytes());
                        let img = img.await.unwrap();
                        match txn::cvt_index::search(&img, t.versions, SAVINGS, key).unwrap() {
                            txn::cvt_index::Found::Absent { free } => {
                                break (b, free, txn::cvt_index::slot_state(&img, t.versions, free))
                            }
                            txn::cvt_index::Found::Next => b += 1,
                            f => panic!("{f:?}"),
                        }
                    }
                };
                let at = t.cvt_addr(b, slot);
                let state_at = at.offset(txn::cvt::STATE_OFFSET as u64);
                let claim = txn::cvt::claim_word(id);
                assert_eq!(
                    store.ctx().cas(node, state_at, was, claim).await.unwrap(),
                    was
                );
                let header = txn::cvt::Header {
                    table: SAVINGS,
                    len: t.len as u32,
                    key,
                    lock: 0,
                    state: txn::cvt::SLOT_IN_USE,
                };
                let copy = txn::cvt::Cvt::new(header, t.versions).encode();
                let copies = store.index_copies(part, SAVINGS, at.addr).unwrap();
                assert_eq!(copies.len(), 2, "a primary and a backup");
                let (bn, ba) = copies[1];
                store
                    .ctx()
                    .write(node, at, &copy[..txn::cvt::STATE_OFFSET])
                    .await
                    .unwrap();
                store.ctx().write(bn, ba, &copy).await.unwrap();
                let rep = l.recover(30, 1).await.unwrap();
                let word = |n, a: rrpc::fabric::RemoteAddr| {
                    let r = store
                        .ctx()
                        .read(n, a.offset(txn::cvt::STATE_OFFSET as u64), 8);
                    async move { u64::from_le_bytes(r.await.unwrap().try_into().unwrap()) }
                };
                // Freeing is for the claim's own word only: a second try, and a try on a
                // published slot, change nothing on any copy.
                let (loc, _) = store.lookup(SAVINGS, 3).await.unwrap().unwrap();
                let published = store.index_copies(loc.part, SAVINGS, loc.addr).unwrap();
                if !planted {
                    assert!(!store
                        .free_claim(part, SAVINGS, at.addr, claim)
                        .await
                        .unwrap());
                    let other = store.free_claim(loc.part, SAVINGS, loc.addr, claim).await;
                    assert!(!other.unwrap(), "{p}: a published slot is left alone");
                    for (n, a) in published {
                        assert_eq!(word(n, a).await, txn::cvt::SLOT_IN_USE, "{p}");
                    }
                }
                let guard = store.ctx().read(node, t.guard_addr(home), 8).await.unwrap();
                let guard = u64::from_le_bytes(guard.try_into().unwrap());
                (
                    (word(node, at).await, word(bn, ba).await, claim, guard),
                    (rep.claims, rep.guards),
                )
            });
            txn::fault::recovery_bug(None);
            let (primary, backup, claim, guard) = states;
            if planted {
                assert_eq!(primary, claim, "{p}: without the sweep the claim stays");
                assert_ne!(guard, 0, "{p}: and the guard stays held");
            } else {
                assert_eq!(claims, (1, 1), "{p}: one claim freed, one guard released");
                assert_eq!(guard, 0, "{p}: the dead inserter's guard is released");
                assert_eq!(
                    primary,
                    txn::cvt::SLOT_FREED,
                    "{p}: the primary's slot is free"
                );
                assert_eq!(backup, txn::cvt::SLOT_FREED, "{p}: so is the backup's copy");
            }
        }
    }
}

/// Lotus: a recovery that rolls back a commit whose write-visible step had begun (its
/// commit word set) leaves the cells already published beside invalidated ones, a
/// non-uniform group.
#[test]
fn lotus_rolled_back_after_its_first_publish_is_caught() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let p = Protocol::Lotus(Isolation::Serializable);
    txn::fault::recovery_bug(Some(RecoveryBug::RollBackUnlessAllLanded));
    let a = crash_and_recover("bug-lotus", p, CrashPoint::AfterFirstPublish, 0);
    txn::fault::recovery_bug(None);
    assert_ne!(
        a.values,
        vec![a.values[0]; GROUP.len()],
        "a roll-back after the first publish went unnoticed"
    );
}

/// Scythe's tickets must be handed on only after the dead node's logs are settled: a
/// writer waiting on them would otherwise read its half install. The correct order
/// makes the waiting writer read a uniform group; the planted reverse order is caught
/// by that writer's read.
#[test]
fn tickets_are_handed_on_only_after_the_logs_are_settled() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (name, bug) in [
        ("order-ok", None),
        ("order-bug", Some(RecoveryBug::ReleaseTicketsFirst)),
    ] {
        let cl = cluster(name);
        let p = Protocol::Scythe;
        let live = cl.client(p, 40, 1);
        let l = live.clone();
        block_on(&live.ctx().clone(), async move {
            write_group(&l, &GROUP, 1).await.unwrap()
        });
        let dead = die_at(&cl, p, CrashPoint::AfterFirstInstall, 2, &GROUP);
        txn::fault::recovery_bug(bug);
        let l = live.clone();
        let seen = block_on(&live.ctx().clone(), async move {
            // A writer that waits on the dead node's locks, and records what it read.
            let seen = Rc::new(std::cell::RefCell::new(Vec::new()));
            let (w, s) = (l.clone(), seen.clone());
            l.ctx().spawn(async move {
                let t0 = Instant::now();
                loop {
                    let mut t = w.begin();
                    let r = async {
                        let items: Vec<_> = GROUP.iter().map(|&k| (SAVINGS, k)).collect();
                        let vals = t.read_many_for_update(&items).await?;
                        for &k in &GROUP {
                            t.write(SAVINGS, k, val(7))?;
                        }
                        t.commit().await?;
                        Ok::<_, TxnError>(vals)
                    }
                    .await;
                    match r {
                        Ok(vals) => {
                            *s.borrow_mut() = vals
                                .iter()
                                .map(|v| i64::from_le_bytes(v[..8].try_into().unwrap()) as u64)
                                .collect();
                            return;
                        }
                        Err(_) if t0.elapsed() < Duration::from_secs(5) => {
                            w.ctx().sleep(Duration::from_micros(200)).await;
                        }
                        Err(e) => panic!("the waiting writer failed: {e}"),
                    }
                }
            });
            l.ctx().sleep(Duration::from_millis(5)).await;
            l.recover(dead.0, dead.1).await.unwrap();
            let t0 = Instant::now();
            while seen.borrow().is_empty() && t0.elapsed() < Duration::from_secs(10) {
                l.ctx().sleep(Duration::from_millis(1)).await;
            }
            let v = seen.borrow().clone();
            v
        });
        txn::fault::recovery_bug(None);
        eprintln!("{name}: the waiting writer read {seen:?}");
        let uniform = seen.iter().all(|&v| v == seen[0]);
        match bug {
            None => assert!(
                uniform && seen == vec![1, 1, 1],
                "{name}: the writer read {seen:?}"
            ),
            Some(_) => assert!(
                !uniform,
                "{name}: handing tickets on first went unnoticed ({seen:?})"
            ),
        }
    }
}
