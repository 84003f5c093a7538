//! Lotus lock tables over rrpc on the shm fabric: two lock-table nodes in this process
//! (nodes 1 and 2, half the shards each) and a client runtime (node 100), then the real
//! `lockd` binary as two processes.

use rrpc::NodeId;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockd::lock_table::{LockMode, LockTable, Refusal};
use lockd::shard::{LockKey, Move, MoveState, Ownership, ShardMap};
use lockd::table_service::{
    fetch_map, run_move, TableClient, TableClientConfig, TableError, TableService, TABLE_EXPORT,
};
use lockd::table_wire::{OpKind, OpOutcome, TableOp, TABLE_OPS_HANDLER};
use rrpc::fabric::shm::ClusterGuard;
use rrpc::node::Node;
use rrpc::runtime::{block_on, CallError, RuntimeConfig, ThreadCtx};

mod common;
use common::{lockd_node, ChildProc, CHILD_SHARD};

const CLIENT: u32 = 100;
const R: OpKind = OpKind::Lock(LockMode::Read);
const W: OpKind = OpKind::Lock(LockMode::Write);
const U: OpKind = OpKind::Unlock;

fn cluster(name: &str) -> ClusterGuard {
    let c = format!("lockd-table-{}-{name}", std::process::id());
    ClusterGuard::new(&c).unwrap().0
}

fn start(cluster: &ClusterGuard, me: u32, map: &ShardMap) -> (Arc<TableService>, Node) {
    let fabric = cluster.open(NodeId(me)).unwrap();
    let svc = Arc::new(TableService::new(
        Arc::new(LockTable::with_bytes(1 << 16)),
        Ownership::new(me, map.clone()),
    ));
    let mut exports = BTreeMap::new();
    exports.insert(TABLE_EXPORT.to_string(), svc.export());
    let node = lockd_node(fabric, exports, svc.handlers(), 1);
    (svc, node)
}

fn ctx(cluster: &ClusterGuard, addrs: &[SocketAddr]) -> Rc<ThreadCtx> {
    ctx_on(cluster.open(NodeId(CLIENT)).unwrap(), addrs)
}

/// A client runtime of node `node` as incarnation `incarnation` (its own connections).
fn ctx_as(
    cluster: &ClusterGuard,
    node: u32,
    incarnation: u64,
    addrs: &[SocketAddr],
) -> Rc<ThreadCtx> {
    ctx_on(common::open_as(cluster, node, incarnation), addrs)
}

fn ctx_on(fabric: rrpc::fabric::Fabric, addrs: &[SocketAddr]) -> Rc<ThreadCtx> {
    let ctx = ThreadCtx::new(
        fabric,
        RuntimeConfig::default().with_call_timeout(Duration::from_secs(5)),
    )
    .unwrap();
    for &a in addrs {
        ctx.connect_rpc(a).unwrap();
    }
    ctx
}

fn key(shard: u64, rest: u64) -> LockKey {
    LockKey::compose(1, shard, rest).unwrap()
}

fn op(key: LockKey, txn: u64, kind: OpKind) -> TableOp {
    TableOp {
        key,
        txn,
        node: CLIENT,
        kind,
    }
}

#[test]
fn batched_ops_across_two_nodes_are_idempotent() {
    let cl = cluster("idem");
    let map = ShardMap::uniform(&[1, 2]).unwrap();
    let (s1, n1) = start(&cl, 1, &map);
    let (s2, n2) = start(&cl, 2, &map);
    let ctx = ctx(&cl, &[n1.addr(), n2.addr()]);
    let c = ctx.clone();
    let (s1c, s2c) = (s1.clone(), s2.clone());
    let keys: Vec<LockKey> = (0..60)
        .map(|i| key(if i < 30 { 5 } else { 3000 }, i))
        .collect();
    let lock: Vec<TableOp> = keys.iter().map(|&k| op(k, 1, W)).collect();
    let unlock: Vec<TableOp> = keys.iter().map(|&k| op(k, 1, U)).collect();
    // Transaction 9 of compute node 55 write-locks every key.
    let dead: Vec<TableOp> = keys
        .iter()
        .map(|&k| TableOp {
            node: 55,
            ..op(k, 9, W)
        })
        .collect();
    let (ks, lk, ul, dd) = (keys, lock.clone(), unlock.clone(), dead.clone());
    let tc = block_on(&ctx, async move {
        let (keys, lock, unlock, dead) = (ks, lk, ul, dd);
        let tc = TableClient::connect(&c, &[1, 2], None, TableClientConfig::default())
            .await
            .unwrap();
        assert_eq!(tc.map(), map);
        // 30 keys on node 1 and 30 on node 2: two messages each (20 + 10).
        let o = tc.execute(&c, &lock).await.unwrap();
        assert!(o.iter().all(|&x| x == OpOutcome::Granted), "{o:?}");
        // A retried request: granted again, nothing changes.
        let o = tc.execute(&c, &lock).await.unwrap();
        assert!(o.iter().all(|&x| x == OpOutcome::Granted));
        assert_eq!(s1c.table().slots_in_use() + s2c.table().slots_in_use(), 60);
        // Another transaction conflicts; read locks of a third share a key.
        let o = tc
            .execute(
                &c,
                &[
                    op(keys[0], 2, R),
                    op(keys[59], 2, W),
                    op(key(6, 0), 2, R),
                    op(key(6, 0), 3, R),
                ],
            )
            .await
            .unwrap();
        assert_eq!(
            o,
            [
                OpOutcome::Refused(Refusal::Conflict),
                OpOutcome::Refused(Refusal::Conflict),
                OpOutcome::Granted,
                OpOutcome::Granted
            ]
        );
        let o = tc.execute(&c, &unlock).await.unwrap();
        assert!(o.iter().all(|&x| x == OpOutcome::Released));
        let o = tc.execute(&c, &unlock).await.unwrap();
        assert!(
            o.iter().all(|&x| x == OpOutcome::NotHeld),
            "second release: no-op"
        );
        // One message per op gives the same answers.
        let one = TableClient::new(tc.map(), None, TableClientConfig::default().with_batch(1));
        let o = one.execute(&c, &lock[..25]).await.unwrap();
        assert!(o.iter().all(|&x| x == OpOutcome::Granted));
        let o = one.execute(&c, &unlock[..25]).await.unwrap();
        assert!(o.iter().all(|&x| x == OpOutcome::Released));
        // A malformed message is a remote error; the node keeps serving.
        let e = c
            .call(NodeId(1), TABLE_OPS_HANDLER, &[0u8; 23])
            .await
            .unwrap_err();
        assert!(matches!(e, CallError::Remote { .. }), "{e}");
        // Node 100's connection cannot lock for node 55: refused, nothing taken.
        let e = tc.execute(&c, &dead).await.unwrap_err();
        assert!(
            matches!(
                e,
                TableError::Rpc {
                    cause: CallError::Remote { .. },
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(
            s1c.table().slots_in_use() + s2c.table().slots_in_use(),
            1,
            "key 6's readers"
        );
        tc
    });
    // Compute node 55, on connections of its own, locks every key; then it fails.
    let ctx55 = ctx_as(&cl, 55, 7, &[n1.addr(), n2.addr()]);
    let (c, d) = (ctx55.clone(), dead.clone());
    block_on(&ctx55, async move {
        let tc55 = TableClient::connect(&c, &[1, 2], None, TableClientConfig::default())
            .await
            .unwrap();
        let o = tc55.execute(&c, &d).await.unwrap();
        assert!(o.iter().all(|&x| x == OpOutcome::Granted), "{o:?}");
    });
    drop(ctx55);
    assert_eq!(s1.table().slots_in_use() + s2.table().slots_in_use(), 61);
    // release_node over RPC passes on every lock of the failed compute node.
    let c = ctx.clone();
    block_on(&ctx, async move {
        let o = tc.execute(&c, &lock).await.unwrap();
        assert!(
            o.iter()
                .all(|&x| x == OpOutcome::Refused(Refusal::Conflict)),
            "node 55 holds them: {o:?}"
        );
        let dead55 = lockd::owners::Owner {
            node: 55,
            incarnation: 7,
        };
        assert_eq!(tc.release_node(&c, dead55).await.unwrap(), 60);
        assert_eq!(tc.release_node(&c, dead55).await.unwrap(), 0);
        let o = tc.execute(&c, &lock).await.unwrap();
        assert!(o.iter().all(|&x| x == OpOutcome::Granted), "free again");
        tc.execute(&c, &unlock).await.unwrap();
    });
    assert_eq!(
        s1.table().slots_in_use() + s2.table().slots_in_use(),
        1,
        "key 6's readers"
    );
}

/// A move of shards 0..64 from node 1 to node 2 with a lock held: the move waits for
/// the release; meanwhile others are refused (moving); after it, a client with the old
/// map is told wrong-shard, refetches, and is served by node 2.
#[test]
fn resharding_with_a_lock_held_and_client_retry_after_the_map_change() {
    let cl = cluster("move");
    let map = ShardMap::uniform(&[1, 2]).unwrap();
    let (s1, n1) = start(&cl, 1, &map);
    let (s2, n2) = start(&cl, 2, &map);
    let ctx = ctx(&cl, &[n1.addr(), n2.addr()]);
    let c = ctx.clone();
    let (s1c, s2c) = (s1.clone(), s2.clone());
    let state = block_on(&ctx, async move {
        let cfg = TableClientConfig::default().with_max_retries(3);
        let holder = TableClient::connect(&c, &[1, 2], None, cfg).await.unwrap();
        let stale = TableClient::connect(&c, &[1, 2], None, cfg).await.unwrap();
        let k = key(7, 1);
        assert_eq!(
            holder.execute(&c, &[op(k, 1, W)]).await.unwrap(),
            [OpOutcome::Granted]
        );
        let mut mv = Move::new(1, 2, 0..64, 1, Instant::now());
        let (c2, s1d) = (c.clone(), s1c.clone());
        let (state, ()) = rrpc::runtime::join(
            async {
                run_move(
                    &c,
                    &mut mv,
                    &[],
                    Duration::from_millis(1),
                    Duration::from_secs(30),
                )
                .await
                .unwrap()
            },
            async move {
                // Wait until the drain began, then try to take the held lock: refused
                // (moving) at node 1, never granted by node 2 either.
                let deadline = Instant::now() + Duration::from_secs(30);
                while s1d.map().version() == 1
                    && holder.execute(&c2, &[op(k, 2, W)]).await.unwrap() != [OpOutcome::Moving]
                {
                    assert!(Instant::now() < deadline, "drain never began");
                    c2.sleep(Duration::from_micros(200)).await;
                }
                assert_eq!(s2c.held_in(0..64), 0, "node 2 granted nothing");
                c2.sleep(Duration::from_millis(5)).await;
                assert_eq!(s1d.map().version(), 1, "the held lock delays the move");
                assert_eq!(
                    holder.execute(&c2, &[op(k, 1, U)]).await.unwrap(),
                    [OpOutcome::Released]
                );
            },
        )
        .await;
        // The stale client (map version 1) goes to node 1, is told wrong-shard with
        // version 2, refetches and is served by node 2.
        assert_eq!(stale.map().version(), 1);
        assert_eq!(
            stale.execute(&c, &[op(k, 3, W)]).await.unwrap(),
            [OpOutcome::Granted]
        );
        assert_eq!(stale.map().version(), 2);
        assert_eq!(stale.map().owner(7), 2);
        stale.execute(&c, &[op(k, 3, U)]).await.unwrap();
        state
    });
    assert_eq!(state, MoveState::Published { version: 2 });
    assert_eq!(s1.map().version(), 2);
    assert_eq!(s2.map().owner(63), 2);
    assert_eq!(s2.map().owner(64), 1);

    // A lock held past the drain timeout cancels the move: node 1 serves the range again.
    let c = ctx.clone();
    let state = block_on(&ctx, async move {
        let tc = TableClient::connect(&c, &[1, 2], None, TableClientConfig::default())
            .await
            .unwrap();
        let k = key(100, 1);
        assert_eq!(
            tc.execute(&c, &[op(k, 1, W)]).await.unwrap(),
            [OpOutcome::Granted]
        );
        let mut mv = Move::new(1, 2, 100..101, 2, Instant::now());
        let st = run_move(
            &c,
            &mut mv,
            &[],
            Duration::from_millis(1),
            Duration::from_millis(5),
        )
        .await
        .unwrap();
        assert_eq!(
            tc.execute(&c, &[op(k, 1, U)]).await.unwrap(),
            [OpOutcome::Released]
        );
        assert_eq!(
            tc.execute(&c, &[op(k, 2, W)]).await.unwrap(),
            [OpOutcome::Granted]
        );
        st
    });
    assert_eq!(state, MoveState::Cancelled);
    assert_eq!(s1.map().version(), 2);
    assert_eq!(s1.map().owner(100), 1);
}

/// The embedded placement: a client whose process runs node 1's service calls it
/// directly, and node 2 over RPC, in one `execute`.
#[test]
fn embedded_service_and_remote_node_in_one_batch() {
    let cl = cluster("embed");
    let map = ShardMap::uniform(&[1, 2]).unwrap();
    let local = Arc::new(TableService::new(
        Arc::new(LockTable::with_bytes(1 << 16)),
        Ownership::new(1, map.clone()),
    ));
    let (s2, n2) = start(&cl, 2, &map);
    let ctx = ctx(&cl, &[n2.addr()]);
    let c = ctx.clone();
    let l = local.clone();
    block_on(&ctx, async move {
        let tc = TableClient::connect(&c, &[2], Some(l), TableClientConfig::default())
            .await
            .unwrap();
        let ops = [op(key(1, 1), 1, W), op(key(4000, 1), 1, W)];
        assert_eq!(
            tc.execute(&c, &ops).await.unwrap(),
            [OpOutcome::Granted, OpOutcome::Granted]
        );
        assert_eq!(tc.release_node(&c, me(&c)).await.unwrap(), 2);
    });
    assert_eq!(local.table().slots_in_use(), 0);
    assert_eq!(s2.table().slots_in_use(), 0);
}

struct Proc(Child);

impl Proc {
    fn spawn(cluster: &str, args: &[&str]) -> (Self, SocketAddr) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_lockd"))
            .args(["--cluster", cluster])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let line = out
            .lines()
            .map_while(Result::ok)
            .next()
            .expect("a READY line");
        let addr = line
            .strip_prefix("READY ")
            .unwrap_or_else(|| panic!("{line:?}"))
            .trim()
            .parse()
            .unwrap();
        (Self(child), addr)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Two real `lockd` processes, half the shards each (one from a TOML file): the client
/// merges their partial maps, locks on both in one call, and release_node frees them.
#[test]
fn two_lockd_processes_serve_their_shards() {
    let cl = cluster("procs");
    let dir = std::env::temp_dir().join(format!("lockd-table-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let toml = dir.join("lockd-12.toml");
    std::fs::write(&toml, "lock-table-slots = 4096\nshards = \"2048-4095\"\n").unwrap();
    let (_a, a) = Proc::spawn(
        cl.name(),
        &[
            "--node",
            "11",
            "--locks",
            "8",
            "--lock-table-slots",
            "4096",
            "--shards",
            "0-2047",
        ],
    );
    let (_b, b) = Proc::spawn(
        cl.name(),
        &[
            "--node",
            "12",
            "--locks",
            "8",
            "--config",
            toml.to_str().unwrap(),
        ],
    );
    let ctx = ctx(&cl, &[a, b]);
    let c = ctx.clone();
    block_on(&ctx, async move {
        let tc = TableClient::connect(&c, &[11, 12], None, TableClientConfig::default())
            .await
            .unwrap();
        assert_eq!(tc.map().owner(0), 11);
        assert_eq!(tc.map().owner(4095), 12);
        let ops: Vec<TableOp> = (0..40u64).map(|i| op(key(i * 100, i), 1, W)).collect();
        let o = tc.execute(&c, &ops).await.unwrap();
        assert!(o.iter().all(|&x| x == OpOutcome::Granted), "{o:?}");
        let o = tc.execute(&c, &[op(key(0, 0), 2, W)]).await.unwrap();
        assert_eq!(o, [OpOutcome::Refused(Refusal::Conflict)]);
        assert_eq!(tc.release_node(&c, me(&c)).await.unwrap(), 40);
        let o = tc
            .execute(&c, &[op(key(0, 0), 2, W), op(key(0, 0), 2, U)])
            .await
            .unwrap();
        assert_eq!(o, [OpOutcome::Granted, OpOutcome::Released]);
    });
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The child process body (see [`common::child_main`]); a no-op unless run as a child.
#[test]
fn child_process() {
    common::child_main();
}

/// The resharding loop (Lotus 4.3) across processes: node 1's coordinators report high
/// latencies and lock on shard 7 while node 2 idles, so after three intervals over the
/// loop moves shard 7 to node 2. A client process holds locks on shard 7 meanwhile: the
/// move drains (node 1 refuses new locks there, node 2 grants none) until the child
/// releases, then publishes the map, and a client is served by node 2.
#[test]
fn resharding_loop_moves_a_hot_shard_with_locks_held_by_another_process() {
    use lockd::reshard::{run_loop, LoopConfig, MoveReport};
    use lockd::shard::ReshardConfig;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;

    let cl = cluster("loop");
    let map = ShardMap::uniform(&[1, 2]).unwrap();
    let (s1, n1) = start(&cl, 1, &map);
    let (s2, n2) = start(&cl, 2, &map);
    let (mut child, held) = ChildProc::spawn(cl.name(), "table", 203, n1.addr(), 0);
    assert_eq!(held, 2);
    assert_eq!(s1.held_in(CHILD_SHARD as u16..CHILD_SHARD as u16 + 1), 2);

    let stop = Arc::new(AtomicBool::new(false));
    let reports: Arc<Mutex<Vec<MoveReport>>> = Arc::default();
    // Node 1's own coordinators (the embedded placement): lock and unlock keys of shard
    // 7 and report slow transactions.
    let feeder = {
        let (s1, stop) = (s1.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut i = 0;
            while !stop.load(Ordering::Acquire) {
                let k = key(CHILD_SHARD, 100 + i % 50);
                let mut o = Vec::new();
                s1.apply(
                    &[
                        TableOp {
                            key: k,
                            txn: 99,
                            node: 1,
                            kind: W,
                        },
                        TableOp {
                            key: k,
                            txn: 99,
                            node: 1,
                            kind: U,
                        },
                    ],
                    &mut o,
                );
                s1.meter().record_latency(Duration::from_millis(5));
                i += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let looper = {
        let (fabric, addrs, stop, reports) = (
            cl.open(NodeId(CLIENT)).unwrap(),
            [n1.addr(), n2.addr()],
            stop.clone(),
            reports.clone(),
        );
        std::thread::spawn(move || {
            let ctx = ThreadCtx::new(fabric, RuntimeConfig::default()).unwrap();
            for a in addrs {
                ctx.connect_rpc(a).unwrap();
            }
            let cfg = LoopConfig::default()
                // Long enough that the held locks delay the move, never cancel it.
                .with_policy(ReshardConfig::default().with_drain_timeout(Duration::from_secs(30)))
                .with_interval(Duration::from_millis(20))
                .with_drain_poll(Duration::from_millis(1));
            let c = ctx.clone();
            block_on(&ctx, async move {
                let deadline = Instant::now() + Duration::from_secs(60);
                let stop_fn = || stop.load(Ordering::Acquire) || Instant::now() > deadline;
                let mut on_move = |r: &MoveReport| {
                    reports.lock().unwrap().push(r.clone());
                    stop.store(true, Ordering::Release);
                };
                run_loop(&c, &[NodeId(1), NodeId(2)], cfg, &stop_fn, &mut on_move).await
            })
        })
    };
    // The loop decides and begins draining a range holding shard 7.
    let deadline = Instant::now() + Duration::from_secs(30);
    let range = loop {
        if let Some(r) = s1.draining() {
            break r;
        }
        assert!(Instant::now() < deadline, "the loop never began a move");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert!(range.contains(&(CHILD_SHARD as u16)), "{range:?}");
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(s1.map().version(), 1, "the held locks delay the move");
    assert_eq!(s2.held_in(range.clone()), 0, "node 2 granted nothing");
    child.release();
    let r = looper.join().unwrap();
    stop.store(true, Ordering::Release);
    feeder.join().unwrap();
    r.unwrap();
    let reports = reports.lock().unwrap().clone();
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert_eq!(
        (reports[0].from, reports[0].to, reports[0].state),
        (1, 2, MoveState::Published { version: 2 })
    );
    assert_eq!((s1.map().version(), s2.map().version()), (2, 2));
    assert_eq!(s2.map().owner(CHILD_SHARD as u16), 2);
    // A client with the old map is sent to node 2, which grants the child's old key.
    let ctx = ThreadCtx::new(
        cl.open(NodeId(CLIENT + 1)).unwrap(),
        RuntimeConfig::default(),
    )
    .unwrap();
    ctx.connect_rpc(n1.addr()).unwrap();
    ctx.connect_rpc(n2.addr()).unwrap();
    let c = ctx.clone();
    block_on(&ctx, async move {
        let tc = TableClient::new(map, None, TableClientConfig::default());
        let k = key(CHILD_SHARD, 1);
        let mine = TableOp {
            node: CLIENT + 1,
            ..op(k, 5, W)
        };
        assert_eq!(tc.execute(&c, &[mine]).await.unwrap(), [OpOutcome::Granted]);
        assert_eq!(tc.map().version(), 2);
    });
    assert_eq!(s2.held_in(range), 1);
}

/// The resharding loop in a real `lockd` process (`--reshard-nodes`): node 11 runs it over
/// itself and node 12. Clients lock only on node 12's shard 3000, so node 12 is the one
/// with latency while node 11 idles; after three intervals over, the loop moves a range
/// around shard 3000 to node 11, and the clients follow the new map. SIGTERM then stops
/// node 11, its loop thread included, cleanly.
#[test]
fn a_lockd_process_runs_the_resharding_loop() {
    let cl = cluster("procloop");
    let common = ["--locks", "8", "--lock-table-slots", "4096"];
    let (_b, b) = Proc::spawn(
        cl.name(),
        &[&["--node", "12", "--shards", "2048-4095"][..], &common].concat(),
    );
    let b_addr = b.to_string();
    let (mut a_proc, a) = Proc::spawn(
        cl.name(),
        &[
            &[
                "--node",
                "11",
                "--shards",
                "0-2047",
                "--reshard-nodes",
                &b_addr,
                "--reshard-interval-ms",
                "10",
            ][..],
            &common,
        ]
        .concat(),
    );
    let ctx = ctx(&cl, &[a, b]);
    let c = ctx.clone();
    let moved = block_on(&ctx, async move {
        let tc = TableClient::connect(&c, &[11, 12], None, TableClientConfig::default())
            .await
            .unwrap();
        assert_eq!(tc.map().owner(3000), 12);
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut i = 0u64;
        while Instant::now() < deadline {
            let k = key(3000, i % 1000);
            // Lock, then unlock (one `execute` may reorder what it retries).
            match tc.execute(&c, &[op(k, 1, W)]).await.unwrap()[..] {
                [OpOutcome::Granted] => {
                    let o = tc.execute(&c, &[op(k, 1, U)]).await.unwrap();
                    assert_eq!(o, [OpOutcome::Released]);
                }
                [OpOutcome::Moving] => {}
                ref o => panic!("{o:?}"),
            }
            i += 1;
            if i.is_multiple_of(64) {
                let m = fetch_map(&c, 11).await.unwrap();
                if m.owner(3000) == 11 {
                    return Some(m.version());
                }
            }
        }
        None
    });
    let version = moved.expect("the loop never moved shard 3000 to the idle node");
    assert!(version >= 2);
    // SAFETY: kill(2) has no memory-safety preconditions; the pid is our own child's.
    let rc = unsafe { libc::kill(a_proc.0.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = a_proc.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "lockd did not exit on SIGTERM");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "{status:?}");
}

/// The owner `ctx`'s connections announce: its fabric's node and incarnation.
fn me(ctx: &ThreadCtx) -> lockd::owners::Owner {
    lockd::owners::Owner {
        node: ctx.fabric().node().get(),
        incarnation: ctx.fabric().incarnation(),
    }
}

/// Node 100 restarted under the same id: its dead predecessor (incarnation 1, a fabric
/// of its own) holds a lock, and the restarted node (a new fabric of the same id,
/// incarnation 2) locked a key with the same transaction id. A connection of the
/// predecessor's incarnation is refused from then on, to lock or unlock; a late
/// `release_node` of the predecessor releases only its lock, and the live incarnation's
/// stays. (Before, holders named the node only: the release took the live lock too.)
#[test]
fn release_node_of_a_dead_incarnation_leaves_the_restarted_nodes_locks() {
    let cl = cluster("inc");
    let map = ShardMap::uniform(&[1]).unwrap();
    let (svc, n1) = start(&cl, 1, &map);
    // Node 100 as incarnation `inc`, on connections of its own: its runtime and fabric
    // are dropped after `f`, so that another incarnation can open the node id.
    let session = |inc: u64, f: &dyn Fn(Rc<ThreadCtx>, TableClient) -> Vec<OpOutcome>| {
        let ctx = ctx_as(&cl, CLIENT, inc, &[n1.addr()]);
        let c = ctx.clone();
        let tc = block_on(&ctx, async move {
            TableClient::connect(&c, &[1], None, TableClientConfig::default())
                .await
                .unwrap()
        });
        f(ctx, tc)
    };
    let run = |inc: u64, ops: Vec<TableOp>| {
        session(inc, &|ctx, tc| {
            let (c, ops) = (ctx.clone(), ops.clone());
            block_on(&ctx, async move { tc.execute(&c, &ops).await.unwrap() })
        })
    };
    assert_eq!(run(1, vec![op(key(5, 1), 7, W)]), [OpOutcome::Granted]);
    // Incarnation 1 died; the node restarts as incarnation 2.
    assert_eq!(run(2, vec![op(key(5, 2), 7, W)]), [OpOutcome::Granted]);
    // A late connection of the dead incarnation is refused, to lock or to unlock.
    let stale = OpOutcome::Refused(Refusal::StaleIncarnation);
    assert_eq!(
        run(1, vec![op(key(5, 3), 8, W), op(key(5, 1), 7, U)]),
        [stale, stale]
    );
    let dead = lockd::owners::Owner {
        node: CLIENT,
        incarnation: 1,
    };
    session(2, &|ctx, tc| {
        let c = ctx.clone();
        block_on(&ctx, async move {
            assert_eq!(tc.release_node(&c, dead).await.unwrap(), 1);
            assert_eq!(tc.release_node(&c, dead).await.unwrap(), 0, "idempotent");
        });
        Vec::new()
    });
    assert_eq!(svc.table().holders(key(5, 1).0), []);
    let live = svc.table().holders(key(5, 2).0);
    assert_eq!(live.len(), 1, "the live incarnation's lock stays");
    assert_eq!(live[0].incarnation, 2);
    assert_eq!(svc.table().holders(key(5, 3).0), []);
}

/// A lock-table request whose operations name another node than the caller the RPC
/// layer names is refused, and nothing runs.
#[test]
fn ops_naming_another_node_than_the_caller_are_refused() {
    let svc = TableService::new(
        Arc::new(LockTable::with_bytes(1 << 16)),
        Ownership::new(1, ShardMap::uniform(&[1]).unwrap()),
    );
    let mut req = Vec::new();
    lockd::table_wire::encode_ops(&[op(key(5, 1), 7, W)], 1, &mut req).unwrap();
    let caller = lockd::owners::Owner {
        node: CLIENT + 1,
        incarnation: 1,
    };
    assert!(svc.handle_ops_from(caller, &req, &mut Vec::new()).is_err());
    assert_eq!(svc.table().slots_in_use(), 0);
    let caller = lockd::owners::Owner {
        node: CLIENT,
        incarnation: 3,
    };
    svc.handle_ops_from(caller, &req, &mut Vec::new()).unwrap();
    assert_eq!(
        svc.table().holders(key(5, 1).0)[0].incarnation,
        3,
        "the caller's wins"
    );
}

/// A lock-table node restarts (a new service, a new epoch): the client's next call
/// there fails with `TableError::Restarted`, since the locks it took before are gone, and
/// the call after goes on in the new epoch.
#[test]
fn a_restarted_table_node_is_reported_and_its_old_locks_are_not_assumed_held() {
    let cl = cluster("restart");
    let map = ShardMap::uniform(&[1]).unwrap();
    let start = |epoch| {
        let fabric = cl.open(NodeId(1)).unwrap();
        let svc = Arc::new(
            TableService::new(
                Arc::new(LockTable::with_bytes(1 << 16)),
                Ownership::new(1, map.clone()),
            )
            .with_epoch(epoch),
        );
        let mut exports = BTreeMap::new();
        exports.insert(TABLE_EXPORT.to_string(), svc.export());
        let node = lockd_node(fabric, exports, svc.handlers(), 1);
        (svc, node)
    };
    let (old, n1) = start(1);
    // The thread's pool gives up reconnecting to the old node soon after it is gone, so
    // that `reconnect` below replaces the connection (a pool still retrying the old
    // address would keep it, and the next call would find the node gone).
    let ctx = ThreadCtx::new(
        cl.open(NodeId(CLIENT)).unwrap(),
        RuntimeConfig::default()
            .with_call_timeout(Duration::from_secs(5))
            .with_reconnect_give_up(Duration::from_millis(100)),
    )
    .unwrap();
    ctx.connect_rpc(n1.addr()).unwrap();
    let c = ctx.clone();
    let tc = Rc::new(block_on(&ctx, async move {
        TableClient::connect(&c, &[1], None, TableClientConfig::default())
            .await
            .unwrap()
    }));
    let (c, t) = (ctx.clone(), tc.clone());
    let o = block_on(&ctx, async move {
        t.execute(&c, &[op(key(5, 1), 7, W)]).await.unwrap()
    });
    assert_eq!(o, [OpOutcome::Granted]);
    drop(n1);
    drop(old);
    // The thread finds the old node gone.
    let (c, t) = (ctx.clone(), tc.clone());
    let gone = block_on(
        &ctx,
        async move { t.execute(&c, &[op(key(5, 2), 7, W)]).await },
    );
    assert!(matches!(gone, Err(TableError::Rpc { .. })), "{gone:?}");
    let (new, n1) = start(2);
    ctx.reconnect(n1.addr()).unwrap();
    ctx.connect_rpc(n1.addr()).unwrap();
    let (c, t) = (ctx.clone(), tc.clone());
    let e = block_on(&ctx, async move {
        t.execute(&c, &[op(key(5, 2), 7, W)]).await.unwrap_err()
    });
    assert!(
        matches!(
            e,
            TableError::Restarted {
                node: 1,
                was: 1,
                now: 2
            }
        ),
        "{e:?}"
    );
    let (c, t) = (ctx.clone(), tc.clone());
    let o = block_on(&ctx, async move {
        t.execute(&c, &[op(key(5, 3), 8, W)]).await.unwrap()
    });
    assert_eq!(o, [OpOutcome::Granted]);
    assert_eq!(
        new.table().holders(key(5, 1).0),
        [],
        "the new table never held it"
    );
}

/// The spec's A.6 step 1 at a client: a compute node marked down is not called. The
/// client's runtime has no connection to node 2, so any RPC there fails; once node 2 is
/// marked down, locks on its shards are answered down and unlocks not held, at once,
/// and `release_node` skips it. A write op of a sole reader over RPC is its upgrade.
#[test]
fn a_client_answers_ops_on_a_down_node_without_an_rpc() {
    let cl = cluster("down");
    let map = ShardMap::uniform(&[1, 2]).unwrap();
    let (s1, n1) = start(&cl, 1, &map);
    let ctx = ctx(&cl, &[n1.addr()]);
    let c = ctx.clone();
    let s1c = s1.clone();
    block_on(&ctx, async move {
        let tc = TableClient::new(map, None, TableClientConfig::default());
        let (mine, theirs) = (key(7, 1), key(4000, 1));
        let e = tc.execute(&c, &[op(theirs, 1, W)]).await.unwrap_err();
        assert!(
            matches!(
                e,
                TableError::Rpc {
                    node: 2,
                    cause: CallError::NotConnected { .. }
                }
            ),
            "{e:?}"
        );
        assert!(!tc.is_down(2));
        tc.mark_down(2);
        assert!(tc.is_down(2) && !tc.is_down(1));
        let o = tc
            .execute(
                &c,
                &[
                    op(theirs, 1, W),
                    op(theirs, 1, U),
                    op(mine, 1, R),
                    op(theirs, 1, R),
                ],
            )
            .await
            .unwrap();
        assert_eq!(
            o,
            [
                OpOutcome::Down,
                OpOutcome::NotHeld,
                OpOutcome::Granted,
                OpOutcome::Down
            ]
        );
        // The sole reader's write op is its upgrade, over the wire.
        let o = tc.execute(&c, &[op(mine, 1, W)]).await.unwrap();
        assert_eq!(o, [OpOutcome::Granted]);
        assert_eq!(s1c.table().holders(mine.0)[0].mode, LockMode::Write);
        // A second reader makes an upgrade impossible.
        let o = tc
            .execute(
                &c,
                &[
                    op(key(7, 2), 2, R),
                    op(key(7, 2), 3, R),
                    op(key(7, 2), 2, W),
                ],
            )
            .await
            .unwrap();
        assert_eq!(
            o,
            [
                OpOutcome::Granted,
                OpOutcome::Granted,
                OpOutcome::Refused(Refusal::NoUpgrade)
            ]
        );
        // release_node goes to node 1 only.
        assert_eq!(tc.release_node(&c, me(&c)).await.unwrap(), 3);
        tc.mark_up(2);
        assert!(!tc.is_down(2));
        assert!(tc.execute(&c, &[op(theirs, 1, W)]).await.is_err());
    });
    assert_eq!(s1.table().slots_in_use(), 0);
}

/// Lotus 5.1 (the spec's A.3 item 7): a detached unlock releases the local service's
/// keys before it returns, sends the remote ones from spawned coroutines that the
/// caller does not await, and counts the keys whose release failed (node 3 is in the
/// map but not connected); keys of a node marked down are skipped, not failures.
#[test]
fn a_detached_unlock_releases_local_keys_at_once_and_remote_ones_in_the_background() {
    let cl = cluster("detach");
    let map = ShardMap::uniform(&[1, 2, 3]).unwrap();
    let local = Arc::new(TableService::new(
        Arc::new(LockTable::with_bytes(1 << 16)),
        Ownership::new(1, map.clone()),
    ));
    let (s2, n2) = start(&cl, 2, &map);
    let ctx = ctx(&cl, &[n2.addr()]);
    let (c, l, s2c) = (ctx.clone(), local.clone(), s2.clone());
    let keys = [key(1, 1), key(1, 2), key(2000, 1), key(2000, 2)];
    let node3 = key(4000, 1);
    assert_eq!(map.node_of(keys[2]), 2);
    assert_eq!(map.node_of(node3), 3);
    let tc = block_on(&ctx, async move {
        let tc = TableClient::new(map, Some(l.clone()), TableClientConfig::default());
        let lock: Vec<TableOp> = keys.iter().map(|&k| op(k, 1, W)).collect();
        let o = tc.execute(&c, &lock).await.unwrap();
        assert_eq!(o, [OpOutcome::Granted; 4]);
        let all = [&keys[..], &[node3]].concat();
        tc.unlock_detached(&c, 1, CLIENT, &all);
        // Local keys: released by the CPU already. Remote ones: not sent yet (the
        // spawned coroutines run once this one yields).
        assert_eq!(l.table().slots_in_use(), 0);
        assert_eq!(s2c.table().slots_in_use(), 2);
        assert_eq!(tc.unlock_failures(), 0);
        tc
    });
    // block_on ran the spawned coroutines to their end.
    assert_eq!(s2.table().slots_in_use(), 0);
    assert_eq!(tc.unlock_failures(), 1, "node 3's key");
    // Node 3 marked down: its key is skipped; a key released twice is not a failure.
    tc.mark_down(3);
    let (c, l) = (ctx.clone(), local.clone());
    let tc = block_on(&ctx, async move {
        tc.unlock_detached(&c, 1, CLIENT, &[keys[0], keys[2], node3]);
        assert_eq!(l.table().slots_in_use(), 0);
        tc
    });
    assert_eq!(tc.unlock_failures(), 1);
    drop(n2);
}

/// A bad `--config` file stops `lockd` with exit code 2 before anything runs, naming the
/// file, the table and the key.
#[test]
fn a_bad_settings_file_exits_2_naming_file_table_and_key() {
    let cfg = std::env::temp_dir().join(format!("lockd-bad-cfg-{}.toml", std::process::id()));
    for (text, want) in [
        ("[fabric]\nbogus = 1\n", "[fabric]: unknown field `bogus`"),
        ("[server]\nbogus = 1\n", "[server]: unknown field `bogus`"),
        ("threads = \"two\"\n", "threads"),
    ] {
        std::fs::write(&cfg, text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_lockd"))
            .args(["--cluster", "lockd-bad-cfg", "--node", "3", "--config"])
            .arg(&cfg)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text:?}: {err}");
        assert!(
            err.contains(cfg.to_str().unwrap()) && err.contains(want),
            "{text:?}: {err}"
        );
    }
    std::fs::remove_file(&cfg).unwrap();
}
