//! The three lock kinds through one client API over the shm fabric: a lock service node
//! (node 1: Takeout table, CAS and DSLR word tables, and a table of counters) and client
//! threads (node 100) hammering a few locks. Mutual exclusion is checked by a non-atomic
//! read-modify-write of a remote counter under the lock (READ, then WRITE of +1): any
//! overlap of two holders loses an increment, so the final counts must be exact. DSLR
//! readers also check that no writer changes the counter while they hold the lock.

use rrpc::NodeId;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lockd::baseline::BaselineConfig;
use lockd::cas::Release;
use lockd::client::LockError;
use lockd::dslr::{Access, DslrWord};
use lockd::kinds::{AnyLockClient, LockGuard, LockKind};
use lockd::service::{LockTable, EXPORT_NAME};
use lockd::takeout::Watermarks;
use lockd::words::{WordTable, CAS_EXPORT, DSLR_EXPORT};
use rrpc::fabric::shm::ClusterGuard;
use rrpc::fabric::{Fabric, FabricConfig, FabricKind, MemoryRegion, MrDesc};
use rrpc::node::Node;
use rrpc::runtime::{block_on, Runtime, RuntimeConfig, ThreadCtx};

mod common;
use common::lockd_node;

const SERVICE_NODE: u32 = 1;
const CLIENT_NODE: u32 = 100;
const N_LOCKS: u64 = 8;
/// The export holding one 8-byte counter per lock.
const COUNTERS: &str = "counters";

fn cluster(name: &str) -> ClusterGuard {
    let c = format!("lockd-kinds-{}-{name}", std::process::id());
    ClusterGuard::new(&c).unwrap().0
}

/// Open `node`: on the backend `$RRPC_FABRIC` names with `$RRPC_MODEL`, or on shm with
/// timing model `model` when given (`None` when that is impossible: verbs).
fn open(cluster: &ClusterGuard, node: u32, model: Option<&str>) -> Option<Fabric> {
    match model {
        None => Some(cluster.open(NodeId(node)).unwrap()),
        Some(m) => {
            if FabricKind::from_env().unwrap() != FabricKind::Shm {
                return None;
            }
            let mut cfg = FabricConfig::new(FabricKind::Shm, cluster.name(), NodeId(node));
            cfg.model = Some(m.into());
            Some(Fabric::open(&cfg).unwrap())
        }
    }
}

struct Service {
    table: Arc<LockTable>,
    cas: WordTable,
    dslr: WordTable,
    counters: MemoryRegion,
    node: Node,
}

impl Service {
    fn counter(&self, id: u64) -> u64 {
        self.counters
            .atomic_u64((id * 8) as usize)
            .load(Ordering::Acquire)
    }
}

fn start_service(fabric: Fabric) -> Service {
    let table = Arc::new(LockTable::new(&fabric, N_LOCKS, Watermarks::default()).unwrap());
    let cas = WordTable::new(&fabric, N_LOCKS).unwrap();
    let dslr = WordTable::new(&fabric, N_LOCKS).unwrap();
    let counters = fabric.alloc_mr((N_LOCKS * 8) as usize).unwrap();
    let mut exports = BTreeMap::new();
    exports.insert(EXPORT_NAME.to_string(), table.export());
    exports.insert(CAS_EXPORT.to_string(), cas.export());
    exports.insert(DSLR_EXPORT.to_string(), dslr.export());
    exports.insert(
        COUNTERS.to_string(),
        serde_json::to_value(counters.desc()).unwrap(),
    );
    let node = lockd_node(fabric, exports, table.handlers(), 2);
    Service {
        table,
        cas,
        dslr,
        counters,
        node,
    }
}

struct Hammer {
    kind: LockKind,
    threads: usize,
    coroutines: usize,
    rounds: u64,
    /// Locks used: 0..locks.
    locks: u64,
    /// Every `shared_every`-th acquisition is shared (DSLR only; 0: never).
    shared_every: u64,
    cfg: BaselineConfig,
}

/// What the hammer saw.
#[derive(Debug, Default)]
struct Outcome {
    /// Exclusive acquisitions per lock.
    writes: Vec<u64>,
    /// Shared acquisitions in total.
    reads: u64,
    /// Acquisitions that met contention ([`LockGuard::contended`]).
    contended: u64,
}

/// Run `h` against `svc` from a client runtime on `client`; returns the counts and checks
/// the counters and the lock words afterwards.
fn hammer(svc: &Service, client: Fabric, h: &Hammer) -> Outcome {
    let writes: Arc<Vec<AtomicU64>> = Arc::new((0..N_LOCKS).map(|_| AtomicU64::new(0)).collect());
    let reads = Arc::new(AtomicU64::new(0));
    let contended = Arc::new(AtomicU64::new(0));
    let addr = svc.node.addr();
    let rt = Runtime::new(client, RuntimeConfig::default());
    rt.run(h.threads, h.coroutines, |ctx, thread| {
        let info = ctx.connect_rpc(addr)?;
        let counters: MrDesc = info.export(COUNTERS).unwrap();
        let mut cfg = h.cfg.clone();
        cfg.seed = cfg.seed.wrapping_add(thread as u64);
        cfg.client = Some(thread as u16);
        let lc = Rc::new(AnyLockClient::from_info(h.kind, ctx, &info, &cfg).unwrap());
        let (writes, reads, contended) = (writes.clone(), reads.clone(), contended.clone());
        let (rounds, locks, shared_every, node) = (h.rounds, h.locks, h.shared_every, info.node);
        Ok(move |ctx: Rc<ThreadCtx>, coro: usize| {
            let (lc, writes, reads, contended) =
                (lc.clone(), writes.clone(), reads.clone(), contended.clone());
            async move {
                for r in 0..rounds {
                    // A thread's coroutines start on the same lock, so they contend from
                    // their first acquisition on, whatever the threads' timing.
                    let id = (r + thread as u64) % locks;
                    let n = r * 7 + coro as u64 + thread as u64;
                    let shared = shared_every > 0 && n.is_multiple_of(shared_every);
                    let access = if shared {
                        Access::Shared
                    } else {
                        Access::Exclusive
                    };
                    let g = lc.lock(&ctx, id, access).await.expect("lock");
                    assert_eq!(g.id(), id);
                    if g.contended() {
                        contended.fetch_add(1, Ordering::Relaxed);
                    }
                    let at = counters.at(id * 8);
                    let read = |ctx: Rc<ThreadCtx>| async move {
                        let b = ctx.read(node, at, 8).await.expect("READ counter");
                        u64::from_le_bytes(b[..8].try_into().unwrap())
                    };
                    let v = read(ctx.clone()).await;
                    // Stay inside long enough for the others to pile up.
                    ctx.sleep(Duration::from_micros(5)).await;
                    if shared {
                        assert_eq!(read(ctx.clone()).await, v, "a writer inside a read lock");
                        reads.fetch_add(1, Ordering::Relaxed);
                    } else {
                        ctx.write(node, at, &(v + 1).to_le_bytes())
                            .await
                            .expect("WRITE counter");
                        writes[id as usize].fetch_add(1, Ordering::Relaxed);
                    }
                    g.release().await.expect("release");
                }
                assert_eq!(lc.lost(), 0);
            }
        })
    })
    .unwrap();
    let out = Outcome {
        writes: writes.iter().map(|w| w.load(Ordering::Relaxed)).collect(),
        reads: reads.load(Ordering::Relaxed),
        contended: contended.load(Ordering::Relaxed),
    };
    assert!(
        out.contended > 0,
        "{}: the clients actually contended",
        h.kind
    );
    let total: u64 = out.writes.iter().sum::<u64>() + out.reads;
    assert_eq!(total, h.threads as u64 * h.coroutines as u64 * h.rounds);
    for id in 0..N_LOCKS {
        assert_eq!(
            svc.counter(id),
            out.writes[id as usize],
            "{}: lock {id}: increments lost, two holders overlapped",
            h.kind
        );
        match h.kind {
            LockKind::Takeout => {
                let (lower, upper, _) = svc.table.words(id);
                assert_eq!(lower, upper, "lock {id} drained");
            }
            LockKind::Cas => assert_eq!(svc.cas.word(id), 0, "lock {id} free"),
            LockKind::Dslr => {
                let w = DslrWord::decode(svc.dslr.word(id));
                assert_eq!(w.outstanding(), 0, "lock {id}: {w:?}");
                assert!(w.max_x < h.cfg.dslr_count_max && w.max_s < h.cfg.dslr_count_max);
            }
        }
    }
    out
}

fn hammer_kind(kind: LockKind, name: &str, model: Option<&str>, rounds: u64) {
    let cluster = cluster(name);
    let Some(sf) = open(&cluster, SERVICE_NODE, model) else {
        eprintln!("skipped: timing model {model:?} needs the shm fabric");
        return;
    };
    let svc = start_service(sf);
    let cf = open(&cluster, CLIENT_NODE, model).unwrap();
    let fabric_model = cf.model_name();
    let h = Hammer {
        kind,
        threads: 3,
        coroutines: 2,
        rounds,
        locks: 3,
        shared_every: if kind == LockKind::Dslr { 4 } else { 0 },
        cfg: BaselineConfig::default().with_seed(11),
    };
    let out = hammer(&svc, cf, &h);
    eprintln!(
        "{kind} (timing model {fabric_model}): {:?} writes, {} reads, {} contended",
        out.writes, out.reads, out.contended
    );
    if let Some(m) = model {
        assert_eq!(fabric_model, m);
    }
    if kind == LockKind::Dslr {
        assert!(out.reads > 0, "shared mode exercised");
    }
}

#[test]
fn cas_threads_mutually_exclusive() {
    hammer_kind(LockKind::Cas, "cas", None, 150);
}

#[test]
fn dslr_threads_mutually_exclusive_with_readers() {
    hammer_kind(LockKind::Dslr, "dslr", None, 150);
}

#[test]
fn takeout_threads_mutually_exclusive_through_the_common_api() {
    hammer_kind(LockKind::Takeout, "takeout", None, 150);
}

#[test]
fn all_kinds_mutually_exclusive_under_the_cx5_model() {
    for kind in LockKind::ALL {
        hammer_kind(kind, &format!("cx5-{kind}"), Some("cx5"), 60);
    }
}

/// A DSLR counter limit of 5 forces a reset every few tickets while six coroutines
/// contend: resetters wait for their predecessors, others bounce off frozen words.
#[test]
fn dslr_counter_resets_under_contention() {
    let cluster = cluster("dslr-reset");
    let svc = start_service(cluster.open(NodeId(SERVICE_NODE)).unwrap());
    let h = Hammer {
        kind: LockKind::Dslr,
        threads: 3,
        coroutines: 2,
        rounds: 120,
        locks: 2,
        shared_every: 3,
        cfg: BaselineConfig::default()
            .with_dslr_count_max(5)
            .with_seed(3),
    };
    let out = hammer(&svc, cluster.open(NodeId(CLIENT_NODE)).unwrap(), &h);
    // 720 tickets on 2 locks with a limit of 5: well over a hundred resets happened, and
    // every word ended below the limit (checked by `hammer`).
    assert_eq!(out.writes.iter().sum::<u64>() + out.reads, 720);
}

#[test]
fn cas_release_by_cas_is_exclusive_too() {
    let cluster = cluster("cas-by-cas");
    let svc = start_service(cluster.open(NodeId(SERVICE_NODE)).unwrap());
    let h = Hammer {
        kind: LockKind::Cas,
        threads: 2,
        coroutines: 3,
        rounds: 80,
        locks: 1,
        shared_every: 0,
        cfg: BaselineConfig::default().with_cas_release(Release::Cas),
    };
    let out = hammer(&svc, cluster.open(NodeId(CLIENT_NODE)).unwrap(), &h);
    eprintln!("cas, released by CAS: {out:?}");
}

/// Guards dropped unreleased (an early return, or a held guard simply dropped) are
/// released by their coroutines; a queued DSLR ticket whose acquire timed out is passed on
/// when its turn comes; a CAS waiter times out while the lock is held.
#[test]
fn dropped_guards_and_timeouts_pass_the_lock_on() {
    let cluster = cluster("drops");
    let svc = start_service(cluster.open(NodeId(SERVICE_NODE)).unwrap());
    let ctx = ThreadCtx::new(
        cluster.open(NodeId(CLIENT_NODE)).unwrap(),
        RuntimeConfig::default(),
    )
    .unwrap();
    let info = ctx.connect(svc.node.addr()).unwrap();
    // Acquires expected to succeed use the default timeout (10 s), so a loaded machine
    // cannot fail them; the one expected to time out uses a client with 20 ms.
    let short = BaselineConfig::default().with_acquire_timeout(Duration::from_millis(20));
    let client = |kind, cfg: &BaselineConfig| {
        Rc::new(AnyLockClient::from_info(kind, &ctx, &info, cfg).unwrap())
    };
    let pairs: Vec<(Rc<AnyLockClient>, Rc<AnyLockClient>)> = [LockKind::Cas, LockKind::Dslr]
        .into_iter()
        .map(|k| (client(k, &BaselineConfig::default()), client(k, &short)))
        .collect();
    let timeouts = Rc::new(Cell::new(0));
    let (c, p2, t2) = (ctx.clone(), pairs.clone(), timeouts.clone());
    block_on(&ctx, async move {
        let ctx = c;
        for (lc, impatient) in &p2 {
            // A held guard dropped by an early return.
            let early: Result<(), LockError> = async {
                let _g = lc.lock(&ctx, 4, Access::Exclusive).await?;
                Err(LockError::Protocol("planted".into()))?;
                unreachable!()
            }
            .await;
            assert!(early.is_err());
            // Its release coroutine runs on this thread's executor; acquiring again works.
            let g = lc.lock(&ctx, 4, Access::Exclusive).await.unwrap();
            // A second acquire times out while we hold the lock.
            match impatient.lock(&ctx, 4, Access::Exclusive).await {
                Err(LockError::Timeout { id: 4, .. }) => t2.set(t2.get() + 1),
                r => panic!("{}: expected a timeout, got {r:?}", lc.kind()),
            }
            drop(g);
            // The timed-out DSLR ticket was queued behind `g`: its coroutine released it
            // after `g`'s, so the lock is free again for a third acquire.
            let g = lc.lock(&ctx, 4, Access::Shared).await.unwrap();
            assert!(matches!(
                (&g, lc.kind()),
                (LockGuard::Cas(_), LockKind::Cas) | (LockGuard::Dslr(_), LockKind::Dslr)
            ));
            g.release().await.unwrap();
        }
    });
    assert_eq!(timeouts.get(), 2);
    for (lc, impatient) in &pairs {
        assert_eq!((lc.lost(), impatient.lost()), (0, 0), "{}", lc.kind());
    }
    assert_eq!(svc.cas.word(4), 0);
    let w = DslrWord::decode(svc.dslr.word(4));
    // Three exclusive tickets (early, g, the timed-out one) and one shared, all released.
    assert_eq!(
        w,
        DslrWord {
            n_x: 3,
            n_s: 1,
            max_x: 3,
            max_s: 1
        }
    );
}

/// The `lockd` binary exports the word tables with `--cas-locks` / `--dslr-locks`, and
/// only then.
#[test]
fn lockd_binary_exports_word_tables() {
    let cluster = cluster("bin");
    let child = Command::new(env!("CARGO_BIN_EXE_lockd"))
        .args(["--cluster", cluster.name(), "--node", "9", "--locks", "16"])
        .args(["--cas-locks", "32", "--dslr-locks", "64"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = Reap(child);
    let addr = ready(&mut child.0);
    let ctx = ThreadCtx::new(
        cluster.open(NodeId(CLIENT_NODE)).unwrap(),
        RuntimeConfig::default(),
    )
    .unwrap();
    let info = ctx.connect_rpc(addr).unwrap();
    let cfg = BaselineConfig::default();
    for (kind, n) in [
        (LockKind::Takeout, 16),
        (LockKind::Cas, 32),
        (LockKind::Dslr, 64),
    ] {
        let lc = Rc::new(AnyLockClient::from_info(kind, &ctx, &info, &cfg).unwrap());
        assert_eq!(lc.n_locks(), n);
        let c = ctx.clone();
        block_on(&ctx, async move {
            let g = lc.lock(&c, n - 1, Access::Exclusive).await.unwrap();
            g.release().await.unwrap();
            assert!(matches!(
                lc.lock(&c, n, Access::Exclusive).await,
                Err(LockError::InvalidRequest(_))
            ));
        });
    }
}

#[test]
fn missing_word_tables_are_export_errors() {
    let cluster = cluster("noexport");
    let fabric = cluster.open(NodeId(SERVICE_NODE)).unwrap();
    let table = Arc::new(LockTable::new(&fabric, 4, Watermarks::default()).unwrap());
    let mut exports = BTreeMap::new();
    exports.insert(EXPORT_NAME.to_string(), table.export());
    let node = lockd_node(fabric, exports, table.handlers(), 1);
    let ctx = ThreadCtx::new(
        cluster.open(NodeId(CLIENT_NODE)).unwrap(),
        RuntimeConfig::default(),
    )
    .unwrap();
    let info = ctx.connect(node.addr()).unwrap();
    for kind in [LockKind::Cas, LockKind::Dslr] {
        assert!(matches!(
            AnyLockClient::from_info(kind, &ctx, &info, &BaselineConfig::default()),
            Err(LockError::Export(_))
        ));
    }
    let bad = BaselineConfig::default().with_dslr_count_max(0);
    assert!(matches!(
        AnyLockClient::from_info(LockKind::Takeout, &ctx, &info, &bad),
        Err(LockError::InvalidRequest(_))
    ));
}

/// Kills and reaps the child however the test ends.
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn ready(child: &mut Child) -> SocketAddr {
    let out = BufReader::new(child.stdout.take().unwrap());
    let line = out
        .lines()
        .map_while(Result::ok)
        .next()
        .expect("lockd printed a line");
    line.strip_prefix("READY ")
        .unwrap_or_else(|| panic!("expected READY, got {line:?}"))
        .trim()
        .parse()
        .unwrap()
}

/// For every kind: a guard held by client A (node 100, its own thread) and dropped
/// without `release` while client B (node 101, another thread) waits for the same lock;
/// A's drop posts the release from a coroutine of its own (`Drop` cannot await), and B
/// acquires. Every wait has a deadline, so a lost release fails the test, never hangs it.
#[test]
fn a_dropped_guard_is_acquired_by_another_client() {
    use std::sync::atomic::AtomicU8;
    const LOCK: u64 = 6;
    // Steps: 0 start, 1 A holds, 2 B is acquiring, 3 A dropped its guard, 4 B holds.
    let cluster = cluster("drop-other");
    let svc = start_service(cluster.open(NodeId(SERVICE_NODE)).unwrap());
    for kind in LockKind::ALL {
        let step = Arc::new(AtomicU8::new(0));
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        // Wait on this thread's executor until `step` reaches `s` (false at the deadline).
        async fn until(
            ctx: &ThreadCtx,
            step: &AtomicU8,
            s: u8,
            deadline: std::time::Instant,
        ) -> bool {
            while step.load(Ordering::Acquire) < s {
                if std::time::Instant::now() > deadline {
                    return false;
                }
                ctx.sleep(Duration::from_micros(200)).await;
            }
            true
        }
        let spawn_client = |node: u32, is_a: bool| {
            let (fabric, addr, step) = (
                cluster.open(NodeId(node)).unwrap(),
                svc.node.addr(),
                step.clone(),
            );
            std::thread::spawn(move || -> Result<(), String> {
                let ctx = ThreadCtx::new(fabric, RuntimeConfig::default()).unwrap();
                let info = ctx.connect_rpc(addr).unwrap();
                let lc = AnyLockClient::from_info(kind, &ctx, &info, &BaselineConfig::default())
                    .unwrap();
                let c = ctx.clone();
                block_on(&ctx, async move {
                    let ctx = c;
                    if is_a {
                        let g = lc
                            .lock(&ctx, LOCK, Access::Exclusive)
                            .await
                            .map_err(|e| e.to_string())?;
                        step.store(1, Ordering::Release);
                        if !until(&ctx, &step, 2, deadline).await {
                            return Err("B never started".into());
                        }
                        // B is acquiring (or about to); give it time to queue or spin.
                        ctx.sleep(Duration::from_millis(5)).await;
                        drop(g);
                        step.store(3, Ordering::Release);
                        // Keep the executor running (it runs the release coroutine).
                        if !until(&ctx, &step, 4, deadline).await {
                            return Err(format!("{kind}: B never acquired the dropped lock"));
                        }
                        if lc.lost() != 0 {
                            return Err(format!("{kind}: the dropped guard's release failed"));
                        }
                        Ok(())
                    } else {
                        if !until(&ctx, &step, 1, deadline).await {
                            return Err("A never held".into());
                        }
                        step.store(2, Ordering::Release);
                        let g = lc
                            .lock(&ctx, LOCK, Access::Exclusive)
                            .await
                            .map_err(|e| e.to_string())?;
                        let after_drop = step.load(Ordering::Acquire) >= 3;
                        step.store(4, Ordering::Release);
                        g.release().await.map_err(|e| e.to_string())?;
                        if !after_drop {
                            return Err(format!("{kind}: B held while A's guard was live"));
                        }
                        Ok(())
                    }
                })
            })
        };
        let a = spawn_client(CLIENT_NODE, true);
        let b = spawn_client(CLIENT_NODE + 1, false);
        let (ra, rb) = (a.join().unwrap(), b.join().unwrap());
        assert_eq!((ra, rb), (Ok(()), Ok(())), "{kind}");
    }
    assert_eq!(svc.cas.word(LOCK), 0, "CAS lock free");
    let (lower, upper, _) = svc.table.words(LOCK);
    assert_eq!((lower, upper), (2, 2), "Takeout: both tickets passed on");
}
