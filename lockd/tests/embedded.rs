//! The embedded placement (Lotus 4.1): the lock service as a value,
//! `LockService`, inside compute-node processes (here: this test process) rather than a
//! `lockd` process. The compute node's own coordinators use it (Takeout through its own
//! node, Lotus tables by direct calls) while another compute node's coordinators reach
//! it over the shm fabric; and the resharding loop runs on a compute node.

use rrpc::NodeId;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockd::client::{Grant, LockClient, LockRequest, Mode};
use lockd::embed::{LockService, LockServiceConfig, ReshardSettings};
use lockd::lock_table::{LockMode, Refusal};
use lockd::shard::{LockKey, ShardMap};
use lockd::table_service::{TableClient, TableClientConfig};
use lockd::table_wire::{OpKind, OpOutcome, TableOp};
use rrpc::fabric::shm::ClusterGuard;
use rrpc::runtime::{block_on, RuntimeConfig, ThreadCtx};

fn cluster(name: &str) -> ClusterGuard {
    let c = format!("lockd-embed-{}-{name}", std::process::id());
    ClusterGuard::new(&c).unwrap().0
}

fn small(shards: &str) -> LockServiceConfig {
    LockServiceConfig::default()
        .with_locks(16)
        .with_lock_table_slots(1 << 12)
        .with_shards(shards.into())
}

const LOOPBACK: &str = "127.0.0.1:0";
const ROUNDS: u64 = 200;
const LOCK: u64 = 4;

/// One coordinator thread of compute node `node`: see [`takeout_rounds_on`].
fn takeout_rounds(
    cl: &ClusterGuard,
    node: u32,
    addr: SocketAddr,
    ts: Arc<AtomicU64>,
    inside: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    takeout_rounds_on(cl.open(NodeId(node)).unwrap(), addr, ts, inside)
}

/// The service embedded in compute node 10: its own coordinator (node 10, connected to
/// its own node) and compute node 11's share one Takeout lock, mutually exclusive; a
/// Lotus lock taken by a direct call in node 10 is refused to node 11 until released.
#[test]
fn coordinators_of_the_host_and_of_another_node_share_the_embedded_service() {
    let cl = cluster("share");
    let svc = LockService::start(
        cl.open(NodeId(10)).unwrap(),
        LOOPBACK.parse().unwrap(),
        &small("0-4095"),
    )
    .unwrap();
    assert!(!svc.runs_reshard_loop());
    let ts = Arc::new(AtomicU64::new(1));
    let inside = Arc::new(AtomicBool::new(false));
    // Node 10's coordinator runs on the service's own fabric handle (same node id).
    let local = takeout_rounds_on(
        svc.node().fabric().clone(),
        svc.addr(),
        ts.clone(),
        inside.clone(),
    );
    let remote = takeout_rounds(&cl, 11, svc.addr(), ts, inside);
    assert_eq!(
        (local.join().unwrap(), remote.join().unwrap()),
        (ROUNDS, ROUNDS)
    );
    let (lower, upper, _) = svc.takeout().words(LOCK);
    assert_eq!((lower, upper), (2 * ROUNDS, 2 * ROUNDS));

    // Lotus: a direct call in the host, an RPC from node 11.
    let key = LockKey::compose(1, 9, 1).unwrap();
    let op = move |txn, node, kind| TableOp {
        key,
        txn,
        node,
        kind,
    };
    let host = TableClient::new(
        svc.lotus().map(),
        Some(svc.lotus().clone()),
        TableClientConfig::default(),
    );
    let ctx10 = ThreadCtx::new(svc.node().fabric().clone(), RuntimeConfig::default()).unwrap();
    let c = ctx10.clone();
    let o = block_on(&ctx10, async move {
        host.execute(&c, &[op(1, 10, OpKind::Lock(LockMode::Write))])
            .await
            .unwrap()
    });
    assert_eq!(o, [OpOutcome::Granted]);
    let ctx11 = ThreadCtx::new(cl.open(NodeId(11)).unwrap(), RuntimeConfig::default()).unwrap();
    ctx11.connect_rpc(svc.addr()).unwrap();
    let (c, lotus) = (ctx11.clone(), svc.lotus().clone());
    block_on(&ctx11, async move {
        let tc = TableClient::connect(&c, &[10], None, TableClientConfig::default())
            .await
            .unwrap();
        let w = OpKind::Lock(LockMode::Write);
        assert_eq!(
            tc.execute(&c, &[op(2, 11, w)]).await.unwrap(),
            [OpOutcome::Refused(Refusal::Conflict)]
        );
        let mut out = Vec::new();
        lotus.apply(&[op(1, 10, OpKind::Unlock)], &mut out);
        assert_eq!(out, [OpOutcome::Released]);
        assert_eq!(
            tc.execute(&c, &[op(2, 11, w)]).await.unwrap(),
            [OpOutcome::Granted]
        );
    });
}

/// A coordinator thread on `fabric`: `ROUNDS` Takeout acquisitions of [`LOCK`] on the
/// service at `addr`, checking that nobody else is inside.
fn takeout_rounds_on(
    fabric: rrpc::fabric::Fabric,
    addr: SocketAddr,
    ts: Arc<AtomicU64>,
    inside: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let ctx = ThreadCtx::new(fabric, RuntimeConfig::default()).unwrap();
        let info = ctx.connect_rpc(addr).unwrap();
        let lc = Rc::new(LockClient::from_info(&info).unwrap());
        let c = ctx.clone();
        block_on(&ctx, async move {
            let mut done = 0;
            while done < ROUNDS {
                let req = LockRequest {
                    id: LOCK,
                    ts: ts.fetch_add(1, Ordering::AcqRel),
                    mode: Mode::Hot,
                };
                let Grant::Queued(mut t) = lc.lock(&c, &[req]).await.unwrap().remove(0) else {
                    continue;
                };
                t.wait(Instant::now() + Duration::from_secs(20))
                    .await
                    .unwrap();
                assert!(!inside.swap(true, Ordering::AcqRel), "two holders at once");
                c.sleep(Duration::from_micros(2)).await;
                inside.store(false, Ordering::Release);
                t.release().await.unwrap();
                done += 1;
            }
            done
        })
    })
}

/// Two compute nodes embedding the service, each serving half the shards; node 20 runs
/// the resharding loop (`[reshard] nodes`). Node 21's coordinators report slow
/// transactions on its shard 3000, so the loop moves shard 3000 to node 20.
#[test]
fn the_resharding_loop_runs_on_an_embedding_compute_node() {
    let cl = cluster("loop");
    let b = LockService::start(
        cl.open(NodeId(21)).unwrap(),
        LOOPBACK.parse().unwrap(),
        &small("2048-4095"),
    )
    .unwrap();
    let mut cfg = small("0-2047");
    cfg.reshard = ReshardSettings::default()
        .with_nodes(vec![b.addr()])
        .with_interval_ms(10);
    let a = LockService::start(
        cl.open(NodeId(20)).unwrap(),
        LOOPBACK.parse().unwrap(),
        &cfg,
    )
    .unwrap();
    assert!(a.runs_reshard_loop());
    let key = LockKey::compose(1, 3000, 1).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    // Destination first, then the source install the new map.
    while a.lotus().map().owner(3000) != 20 || b.lotus().map().owner(3000) != 20 {
        assert!(Instant::now() < deadline, "the loop never moved shard 3000");
        let mut out = Vec::new();
        b.lotus().apply(
            &[
                TableOp {
                    key,
                    txn: 1,
                    node: 21,
                    kind: OpKind::Lock(LockMode::Write),
                },
                TableOp {
                    key,
                    txn: 1,
                    node: 21,
                    kind: OpKind::Unlock,
                },
            ],
            &mut out,
        );
        b.lotus().meter().record_latency(Duration::from_millis(5));
        std::thread::sleep(Duration::from_millis(1));
    }
    let (ma, mb) = (a.lotus().map(), b.lotus().map());
    assert_eq!(ma.version(), 2);
    assert_eq!(mb.version(), 2, "published at the source too");
    assert_eq!(
        ShardMap::merge(&ma, &mb).owner(2048),
        21,
        "only a range around 3000 moved"
    );
    drop(a);
    drop(b);
}

/// Lotus 4.1's placement of the lock RPCs: two compute nodes (30 and 31) each serve
/// their half of the shards on 2 server threads whose runtime runs the node's
/// coordinator coroutines too (`LockService::start_with_runtime`); each coroutine locks
/// and unlocks a key of the other node's half over RPC. Every round is granted, so
/// each node's handlers are polled between its own coroutines' awaits (a server thread
/// that only ran its coroutines would leave the other node's requests unanswered), and
/// the setup ran once on each server thread.
#[test]
fn coordinators_on_the_server_threads_lock_on_each_others_tables() {
    use rrpc::node::ServerRuntime;
    use std::sync::Mutex;

    const THREADS: u64 = 2;
    const PER_THREAD: u64 = 50;
    let cl = cluster("served");
    let mut cfg = small("0-2047");
    cfg.threads = THREADS;
    // Each node's peer address, known once both started.
    let peers: [Arc<Mutex<Option<SocketAddr>>>; 2] = Default::default();
    let granted = Arc::new(AtomicU64::new(0));
    let setups = Arc::new(AtomicU64::new(0));
    let runtime = |me: u32, peer_node: u32, peer: Arc<Mutex<Option<SocketAddr>>>| {
        let (granted, setups) = (granted.clone(), setups.clone());
        ServerRuntime::new(RuntimeConfig::default()).with_setup(move |ctx| {
            let thread = setups.fetch_add(1, Ordering::AcqRel);
            let (ctx, peer, granted) = (ctx.clone(), peer.clone(), granted.clone());
            ctx.clone().spawn(async move {
                let addr = loop {
                    if let Some(a) = *peer.lock().unwrap() {
                        break a;
                    }
                    ctx.sleep(Duration::from_millis(1)).await;
                };
                ctx.connect_rpc(addr).unwrap();
                let tc =
                    TableClient::connect(&ctx, &[peer_node], None, TableClientConfig::default())
                        .await
                        .unwrap();
                // A key of the peer's half (node 30 serves 0-2047, node 31 2048-4095).
                let shard = if peer_node == 30 { 7 } else { 3000 };
                for i in 0..PER_THREAD {
                    let key = LockKey::compose(1, shard, thread * 1000 + i).unwrap();
                    let op = |kind| TableOp {
                        key,
                        txn: thread * 1000 + i + 1,
                        node: me,
                        kind,
                    };
                    let o = tc
                        .execute(&ctx, &[op(OpKind::Lock(LockMode::Write))])
                        .await
                        .unwrap();
                    if o == [OpOutcome::Granted] {
                        granted.fetch_add(1, Ordering::AcqRel);
                    }
                    tc.execute(&ctx, &[op(OpKind::Unlock)]).await.unwrap();
                }
            });
            Ok(())
        })
    };
    let a = LockService::start_with_runtime(
        cl.open(NodeId(30)).unwrap(),
        LOOPBACK.parse().unwrap(),
        &cfg,
        &rrpc::node::RpcSettings::default(),
        |_| {},
        Some(runtime(30, 31, peers[0].clone())),
    )
    .unwrap();
    let mut cfg_b = small("2048-4095");
    cfg_b.threads = THREADS;
    let b = LockService::start_with_runtime(
        cl.open(NodeId(31)).unwrap(),
        LOOPBACK.parse().unwrap(),
        &cfg_b,
        &rrpc::node::RpcSettings::default(),
        |_| {},
        Some(runtime(31, 30, peers[1].clone())),
    )
    .unwrap();
    assert_eq!(setups.load(Ordering::Acquire), 2 * THREADS);
    assert_eq!(a.node().server_config().unwrap().threads, THREADS as usize);
    *peers[0].lock().unwrap() = Some(b.addr());
    *peers[1].lock().unwrap() = Some(a.addr());
    let want = 2 * THREADS * PER_THREAD;
    let deadline = Instant::now() + Duration::from_secs(60);
    while granted.load(Ordering::Acquire) < want {
        assert!(
            Instant::now() < deadline,
            "{} of {want} remote locks granted",
            granted.load(Ordering::Acquire)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(a);
    drop(b);
}
