//! Takeout Lock service over the shm fabric: an in-process lock service (node 1) and
//! client runtime (node 100), plus the real `lockd` binary.

use rrpc::NodeId;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockd::client::{Grant, LockClient, LockError, LockRequest, Mode, RefuseReason, Ticket};
use lockd::service::{LockOrder, LockTable, EXPORT_NAME};
use lockd::takeout::{Watermarks, UPPER_OFF};
use lockd::wire::LOCK_HANDLER;
use rrpc::fabric::shm::ClusterGuard;
use rrpc::fabric::{Fabric, FabricConfig, FabricKind};
use rrpc::node::Node;
use rrpc::runtime::{block_on, join_all, CallError, Executor, RuntimeConfig, ThreadCtx};
use rrpc::straw::QpKind;

mod common;
use common::lockd_node;

const SERVICE_NODE: u32 = 1;
const CLIENT_NODE: u32 = 100;

/// This test's cluster, removed when the test ends, however it ends.
fn cluster(name: &str) -> ClusterGuard {
    let c = format!("lockd-test-{}-{name}", std::process::id());
    ClusterGuard::new(&c).unwrap().0
}

struct Service {
    table: Arc<LockTable>,
    node: Node,
}

fn start_service(cluster: &ClusterGuard, n_locks: u64, threads: usize) -> Service {
    start_ordered(cluster, n_locks, threads, LockOrder::Arrival)
}

fn start_ordered(
    cluster: &ClusterGuard,
    n_locks: u64,
    threads: usize,
    order: LockOrder,
) -> Service {
    let fabric = cluster.open(NodeId(SERVICE_NODE)).unwrap();
    let table = Arc::new(LockTable::new(&fabric, n_locks, Watermarks::default()).unwrap());
    let mut exports = BTreeMap::new();
    exports.insert(EXPORT_NAME.to_string(), table.export());
    let mut handlers = rrpc::server::Handlers::new();
    table.register(&mut handlers, order);
    let node = lockd_node(fabric, exports, handlers, threads);
    Service { table, node }
}

fn client(cluster: &ClusterGuard, addr: SocketAddr) -> (Rc<ThreadCtx>, Rc<LockClient>) {
    let ctx = ThreadCtx::new(
        cluster.open(NodeId(CLIENT_NODE)).unwrap(),
        RuntimeConfig::default(),
    )
    .unwrap();
    let info = ctx.connect_rpc(addr).unwrap();
    assert_eq!(info.role, "lockd");
    let lc = Rc::new(LockClient::from_info(&info).unwrap());
    (ctx, lc)
}

#[test]
fn coroutines_contend_fifo_and_mutually_exclusive() {
    const COROS: u64 = 8;
    const ROUNDS: u64 = 40;
    const LOCK: u64 = 5;
    let cluster = cluster("contend");
    let svc = start_service(&cluster, 64, 2);
    let (ctx, lc) = client(&cluster, svc.node.addr());

    let next_ts = Rc::new(Cell::new(1u64));
    let inside = Rc::new(Cell::new(false));
    let acquisitions = Rc::new(Cell::new(0u64));
    let grants: Rc<RefCell<Vec<u64>>> = Rc::new(RefCell::new(Vec::new()));
    let queued_behind = Rc::new(Cell::new(0u64));
    let mut ex = Executor::new(ctx.clone());
    for _ in 0..COROS {
        let (ctx, lc) = (ctx.clone(), lc.clone());
        let (next_ts, inside, acq, grants, behind) = (
            next_ts.clone(),
            inside.clone(),
            acquisitions.clone(),
            grants.clone(),
            queued_behind.clone(),
        );
        ex.spawn(async move {
            let mut done = 0;
            while done < ROUNDS {
                let ts = next_ts.get();
                next_ts.set(ts + 1);
                let req = LockRequest {
                    id: LOCK,
                    ts,
                    mode: Mode::Hot,
                };
                let g = lc.lock(&ctx, &[req]).await.expect("lock RPC").remove(0);
                let r = *g.reply();
                // Only the hot watermark can refuse: 8 coroutines never queue 11 deep,
                // and timestamps taken in order reach the service in order on one thread.
                let Grant::Queued(mut t) = g else {
                    panic!("refused: {r:?}")
                };
                assert!(
                    r.ahead() < COROS,
                    "at most the other coroutines ahead: {r:?}"
                );
                if !r.holds_now() {
                    behind.set(behind.get() + 1);
                }
                let deadline = Instant::now() + Duration::from_secs(20);
                t.wait(deadline).await.expect("granted");
                assert!(t.is_served());
                assert!(!inside.get(), "two holders at once");
                inside.set(true);
                grants.borrow_mut().push(r.ticket);
                ctx.sleep(Duration::from_micros(3)).await;
                inside.set(false);
                acq.set(acq.get() + 1);
                t.release().await.expect("unlock");
                done += 1;
            }
        });
    }
    ex.run();
    assert_eq!(acquisitions.get(), COROS * ROUNDS);
    let g = grants.borrow();
    let expect: Vec<u64> = (0..COROS * ROUNDS).collect();
    assert_eq!(*g, expect, "grants in ticket order, every ticket once");
    let (lower, upper, queued_ts) = svc.table.words(LOCK);
    assert_eq!((lower, upper), (COROS * ROUNDS, COROS * ROUNDS));
    assert_eq!(queued_ts, next_ts.get() - 1);
    assert!(queued_behind.get() > 0, "the coroutines actually queued");
    assert!(lc.srtt() > Duration::ZERO, "READs sampled the RTT");
}

#[test]
fn refusals_batches_and_malformed_requests() {
    let cluster = cluster("misc");
    let svc = start_service(&cluster, 16, 1);
    let (ctx, lc) = client(&cluster, svc.node.addr());
    let table = svc.table.clone();
    let lc2 = lc.clone();
    let c = ctx.clone();
    block_on(&ctx, async move {
        let (ctx, lc) = (c, lc2);
        let req = |id, ts, mode| LockRequest { id, ts, mode };
        // Newer timestamp queued first; an older one is refused and changes nothing.
        let t1 = queued(lc.lock(&ctx, &[req(3, 50, Mode::Cold)]).await.unwrap());
        assert!(t1.is_served());
        let before = table.words(3);
        let g = lc
            .lock(&ctx, &[req(3, 49, Mode::Hot)])
            .await
            .unwrap()
            .remove(0);
        let Grant::Refused(r) = g else {
            panic!("older timestamp granted")
        };
        assert_eq!(r.reason, Some(RefuseReason::Timestamp));
        assert_eq!(r.queued_ts, 50);
        assert_eq!(r.ahead(), 1, "heat reported with the refusal");
        assert_eq!(table.words(3), before);
        // An equal timestamp queues behind us.
        let mut t2 = queued(lc.lock(&ctx, &[req(3, 50, Mode::Hot)]).await.unwrap());
        assert!(!t2.is_served());
        assert_eq!(t2.reply().ahead(), 1);
        let st = lc.read_state(&ctx, 3).await.unwrap();
        assert_eq!(
            (st.lower, st.upper, st.queued_ts, st.queued()),
            (2, 0, 50, 2)
        );
        // A waiter times out while the holder does not unlock, and keeps its place.
        let e = t2
            .wait(Instant::now() + Duration::from_millis(5))
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                LockError::WaitTimeout {
                    id: 3,
                    ticket: 1,
                    upper: 0
                }
            ),
            "{e}"
        );
        assert_eq!(lc.read_state(&ctx, 3).await.unwrap().queued(), 2);
        t1.release().await.unwrap();
        t2.wait(Instant::now() + Duration::from_secs(5))
            .await
            .unwrap();
        assert!(t2.is_served());
        t2.release().await.unwrap();
        assert_eq!(lc.read_state(&ctx, 3).await.unwrap().queued(), 0);

        // A batch of several locks in one RPC, replies in request order.
        let batch: Vec<_> = (4..10).map(|id| req(id, 60, Mode::Cold)).collect();
        let rs: Vec<Ticket> = lc
            .lock(&ctx, &batch)
            .await
            .unwrap()
            .into_iter()
            .map(|g| g.ticket().expect("granted"))
            .collect();
        assert_eq!(rs.len(), 6);
        assert!(rs.iter().all(Ticket::is_served));
        assert_eq!(
            rs.iter().map(Ticket::id).collect::<Vec<_>>(),
            (4..10).collect::<Vec<_>>()
        );
        // Lock 4 is now held: queue three more cold, then cold mode is refused at 4.
        let mut more = Vec::new();
        for i in 1..=3 {
            more.push(queued(
                lc.lock(&ctx, &[req(4, 60 + i, Mode::Cold)]).await.unwrap(),
            ));
        }
        let mut mixed = lc
            .lock(&ctx, &[req(4, 70, Mode::Cold), req(10, 70, Mode::Cold)])
            .await
            .unwrap();
        assert_eq!(mixed[0].reply().reason, Some(RefuseReason::ColdWatermark));
        assert_eq!(mixed[0].reply().ahead(), 4);
        let t10 = mixed.pop().unwrap().ticket().expect("lock 10 granted");
        // Releasing everything, the queued ones included: each release waits for its
        // ticket's turn, so all of them can be released at once.
        let all = rs.into_iter().chain(more).chain([t10]).map(Ticket::release);
        for r in join_all(all).await {
            r.unwrap();
        }
        for id in 4..=10 {
            assert_eq!(
                lc.read_state(&ctx, id).await.unwrap().queued(),
                0,
                "lock {id}"
            );
        }

        // Client-side validation.
        assert!(matches!(
            lc.lock(&ctx, &[req(16, 1, Mode::Hot)]).await,
            Err(LockError::InvalidRequest(_))
        ));
        let sixteen: Vec<_> = (0..16).map(|id| req(id % 16, 100, Mode::Hot)).collect();
        assert!(matches!(
            lc.lock(&ctx, &sixteen).await,
            Err(LockError::InvalidRequest(_))
        ));

        // Malformed requests straight through the RPC: remote errors, the server lives on.
        for bad in [
            vec![0u8; 23],
            Vec::new(),
            {
                let mut v = vec![0u8; 24];
                v[16] = 9;
                v
            },
            {
                let mut v = vec![0u8; 24];
                v[0] = 200; // lock id 200 >= 16
                v
            },
        ] {
            let e = ctx.call(lc.node(), LOCK_HANDLER, &bad).await.unwrap_err();
            assert!(
                matches!(
                    e,
                    CallError::Remote {
                        handler: LOCK_HANDLER,
                        ..
                    }
                ),
                "{e}"
            );
        }
        let t = queued(lc.lock(&ctx, &[req(0, 200, Mode::Hot)]).await.unwrap());
        assert!(t.is_served(), "server still serving");
        t.release().await.unwrap();
    });
    assert_eq!(svc.table.words(0), (1, 1, 200));
}

/// The real binary: start, READY line, lock/unlock, SIGTERM, and the client's next call
/// fails instead of hanging.
#[test]
fn lockd_binary_serves_and_exits_on_sigterm() {
    let cluster = cluster("bin");
    let mut child = LockdProc::spawn(cluster.name(), &["--node", "7", "--locks", "1024"]);
    let addr = child.ready();
    let ctx = ThreadCtx::new(
        cluster.open(NodeId(CLIENT_NODE)).unwrap(),
        RuntimeConfig::default().with_call_timeout(Duration::from_secs(2)),
    )
    .unwrap();
    let info = ctx.connect_rpc(addr).unwrap();
    assert_eq!(info.node, NodeId(7));
    let lc = Rc::new(LockClient::from_info(&info).unwrap());
    assert_eq!(lc.n_locks(), 1024);
    let (c, l) = (ctx.clone(), lc.clone());
    block_on(&ctx, async move {
        let t = queued(
            l.lock(
                &c,
                &[LockRequest {
                    id: 1023,
                    ts: 1,
                    mode: Mode::Cold,
                }],
            )
            .await
            .unwrap(),
        );
        assert!(t.is_served());
        t.release().await.unwrap();
        assert_eq!(l.read_state(&c, 1023).await.unwrap().queued(), 0);
    });
    // A held ticket and a queued one, kept across the service's death.
    let (c, l) = (ctx.clone(), lc.clone());
    let (held, waiting) = block_on(&ctx, async move {
        let req = |ts| LockRequest {
            id: 5,
            ts,
            mode: Mode::Cold,
        };
        let held = queued(l.lock(&c, &[req(3)]).await.unwrap());
        let waiting = queued(l.lock(&c, &[req(4)]).await.unwrap());
        (held, waiting)
    });
    assert!(held.is_served() && !waiting.is_served());

    // A node id in use is a one-line error with exit status 1 (found while starting; node
    // ids are registered by the shm fabric's liveness files, verbs has no such
    // registry), a bad flag one with exit status 2 (a usage error).
    if FabricKind::from_env().unwrap() == FabricKind::Shm {
        let out = Command::new(env!("CARGO_BIN_EXE_lockd"))
            .args(["--cluster", cluster.name(), "--node", "7", "--locks", "8"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("already running"), "{err}");
        assert!(out.stdout.is_empty());
    }
    let out = Command::new(env!("CARGO_BIN_EXE_lockd"))
        .args(["--node", "8", "--locks", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);

    let status = child.terminate();
    assert!(status.success(), "lockd exits 0 on SIGTERM: {status:?}");
    let (c, l) = (ctx.clone(), lc.clone());
    let started = Instant::now();
    let res = block_on(&ctx, async move {
        l.lock(
            &c,
            &[LockRequest {
                id: 1,
                ts: 2,
                mode: Mode::Cold,
            }],
        )
        .await
    });
    assert!(res.is_err(), "call to a dead lockd must fail: {res:?}");
    eprintln!(
        "call to the dead lockd: {:?} after {:?}",
        res,
        started.elapsed()
    );
    // Ended by the call's own deadline or the dead-peer check, never a hang.
    assert!(
        matches!(
            &res,
            Err(lockd::client::LockError::Rpc(
                rrpc::runtime::RpcError::Call(
                    CallError::Timeout { .. } | CallError::PeerGone { .. }
                )
            ))
        ),
        "{res:?}"
    );
    // Releasing into a dead service says the lock is lost, with the cause; a dropped
    // ticket's release coroutine counts it.
    let res = block_on(&ctx, held.release());
    match res {
        Err(LockError::Lost {
            id: 5,
            ticket: 0,
            cause,
        }) => {
            assert!(matches!(*cause, LockError::Rpc(_)), "{cause}")
        }
        r => panic!("expected a lost lock, got {r:?}"),
    }
    assert_eq!(lc.lost(), 0);
    drop(waiting);
    block_on(&ctx, async {});
    assert_eq!(
        lc.lost(),
        1,
        "the dropped ticket's release failed and was counted"
    );
}

/// The one grant of a single-entry Lock RPC, which must be a ticket.
fn queued(mut grants: Vec<Grant>) -> Ticket {
    assert_eq!(grants.len(), 1);
    match grants.remove(0) {
        Grant::Queued(t) => t,
        Grant::Refused(r) => panic!("refused: {r:?}"),
    }
}

/// Every path a ticket can leave by passes the lock on: a queued ticket dropped (released
/// when its turn comes), a held ticket dropped by an early return with `?`, and a
/// release of a queued ticket (waits for its turn).
#[test]
fn dropped_and_early_returned_tickets_pass_the_lock_on() {
    const LOCK: u64 = 2;
    let cluster = cluster("drops");
    let svc = start_service(&cluster, 8, 1);
    let (ctx, lc) = client(&cluster, svc.node.addr());
    let order: Rc<RefCell<Vec<&'static str>>> = Rc::default();
    let req = |ts| LockRequest {
        id: LOCK,
        ts,
        mode: Mode::Hot,
    };
    let mut ex = Executor::new(ctx.clone());
    {
        let (ctx, lc, order) = (ctx.clone(), lc.clone(), order.clone());
        ex.spawn(async move {
            // A holds; B and C queue behind it.
            let a = queued(lc.lock(&ctx, &[req(1)]).await.unwrap());
            let b = queued(lc.lock(&ctx, &[req(2)]).await.unwrap());
            let mut c = queued(lc.lock(&ctx, &[req(3)]).await.unwrap());
            assert_eq!(lc.read_state(&ctx, LOCK).await.unwrap().queued(), 3);
            // B is dropped while queued: its coroutine waits for its turn.
            drop(b);
            order.borrow_mut().push("b dropped");
            // An early return with `?` drops A, which holds the lock.
            let early: Result<(), LockError> = async {
                let _a = a;
                Err(LockError::Protocol("planted".into()))?;
                unreachable!()
            }
            .await;
            assert!(early.is_err());
            // C gets the lock once A's and B's releases ran, in ticket order.
            c.wait(Instant::now() + Duration::from_secs(10))
                .await
                .unwrap();
            order.borrow_mut().push("c served");
            // D queues behind C and releases before its turn: it waits for C.
            let d = queued(lc.lock(&ctx, &[req(4)]).await.unwrap());
            let (dr, cr) = rrpc::runtime::join(d.release(), async {
                ctx.sleep(Duration::from_millis(2)).await;
                order.borrow_mut().push("c releases");
                c.release().await
            })
            .await;
            dr.unwrap();
            cr.unwrap();
            order.borrow_mut().push("d released");
        });
    }
    ex.run();
    assert_eq!(
        *order.borrow(),
        ["b dropped", "c served", "c releases", "d released"]
    );
    assert_eq!(svc.table.words(LOCK).0, 4, "four tickets taken");
    assert_eq!(svc.table.words(LOCK).1, 4, "and all four passed on");
    assert_eq!(lc.lost(), 0);
}

/// A dropped ticket waits for its turn as long as the queue ahead of it moves: three
/// holders ahead of it hold 100 ms each, twice the client's release wait of 150 ms, and
/// its release still passes the lock on (a fixed deadline counted from the drop would
/// have given it up, and stalled the lock for good).
#[test]
fn a_dropped_ticket_waits_while_the_queue_ahead_moves() {
    const LOCK: u64 = 5;
    let cluster = cluster("moving-queue");
    let svc = start_service(&cluster, 8, 1);
    let (ctx, lc) = client(&cluster, svc.node.addr());
    let mut lc = Rc::try_unwrap(lc).ok().expect("one owner");
    lc.set_release_wait(Duration::from_millis(150));
    let lc = Rc::new(lc);
    let req = |ts| LockRequest {
        id: LOCK,
        ts,
        mode: Mode::Hot,
    };
    let mut ex = Executor::new(ctx.clone());
    {
        let (ctx, lc) = (ctx.clone(), lc.clone());
        ex.spawn(async move {
            let mut ahead = Vec::new();
            for ts in 1..=3 {
                ahead.push(queued(lc.lock(&ctx, &[req(ts)]).await.unwrap()));
            }
            drop(queued(lc.lock(&ctx, &[req(4)]).await.unwrap()));
            for mut t in ahead {
                t.wait(Instant::now() + Duration::from_secs(10))
                    .await
                    .unwrap();
                ctx.sleep(Duration::from_millis(100)).await;
                t.release().await.unwrap();
            }
        });
    }
    ex.run();
    assert_eq!(lc.lost(), 0, "the dropped ticket's release gave up");
    assert_eq!(svc.table.words(LOCK).0, 4, "four tickets taken");
    assert_eq!(svc.table.words(LOCK).1, 4, "and all four passed on");
}

/// A dropped ticket's release outlives broken QPs: while it polls, its thread's
/// one-sided QPs to the service are put into the error state again and again (every
/// WR on them completes flushed until the control thread connects new ones), and the
/// release still passes the lock on once the holder lets go.
#[test]
fn a_dropped_tickets_release_outlives_broken_qps() {
    const LOCK: u64 = 6;
    let cluster = cluster("broken-qps");
    let svc = start_service(&cluster, 8, 1);
    // On shm, the rxe timing model keeps WRs in flight long enough to be broken.
    let kind = FabricKind::from_env().unwrap();
    let cfg = FabricConfig::new(kind, cluster.name(), NodeId(CLIENT_NODE))
        .with_model((kind == FabricKind::Shm).then(|| "rxe".to_string()));
    let ctx = ThreadCtx::new(Fabric::open(&cfg).unwrap(), RuntimeConfig::default()).unwrap();
    let lc = Rc::new(LockClient::from_info(&ctx.connect_rpc(svc.node.addr()).unwrap()).unwrap());
    let req = |ts| LockRequest {
        id: LOCK,
        ts,
        mode: Mode::Hot,
    };
    let injected = Rc::new(Cell::new(0usize));
    let mut ex = Executor::new(ctx.clone());
    {
        let (ctx, lc, injected) = (ctx.clone(), lc.clone(), injected.clone());
        ex.spawn(async move {
            let mut a = queued(lc.lock(&ctx, &[req(1)]).await.unwrap());
            drop(queued(lc.lock(&ctx, &[req(2)]).await.unwrap()));
            a.wait(Instant::now() + Duration::from_secs(10))
                .await
                .unwrap();
            // Break the QPs while the release's polls are in flight on them.
            let node = NodeId(SERVICE_NODE);
            for _ in 0..20 {
                for _ in 0..10_000 {
                    if ctx.one_sided_in_flight(node) > 0 {
                        break;
                    }
                    ctx.yield_now().await;
                }
                if let Ok(n) = ctx.inject_qp_error(node, QpKind::OneSided) {
                    injected.set(injected.get() + n);
                }
                ctx.sleep(Duration::from_millis(2)).await;
            }
            a.release().await.unwrap();
        });
    }
    ex.run();
    assert!(injected.get() > 0, "no QP was broken");
    assert_eq!(lc.lost(), 0, "the dropped ticket's release gave up");
    assert_eq!(svc.table.words(LOCK).0, 2, "two tickets taken");
    assert_eq!(svc.table.words(LOCK).1, 2, "and both passed on");
}

struct LockdProc {
    child: Child,
}

impl LockdProc {
    fn spawn(cluster: &str, args: &[&str]) -> Self {
        let child = Command::new(env!("CARGO_BIN_EXE_lockd"))
            .args(["--cluster", cluster])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Self { child }
    }

    fn ready(&mut self) -> SocketAddr {
        let out = BufReader::new(self.child.stdout.take().unwrap());
        let lines: Vec<String> = out.lines().map_while(Result::ok).take(1).collect();
        let line = lines.first().expect("lockd printed a line");
        line.strip_prefix("READY ")
            .unwrap_or_else(|| panic!("expected READY, got {line:?}"))
            .trim()
            .parse()
            .unwrap()
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: kill(2) has no memory-safety preconditions; `pid` is our own child,
        // not yet reaped, so it cannot name another process.
        let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
        assert_eq!(rc, 0);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "lockd did not exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for LockdProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every observation of a lock tells the client its heat: a Lock RPC reply, a waiting
/// ticket's poll (one 16-byte READ of `lower` and `upper`), a state READ.
#[test]
fn replies_and_polls_report_the_heat() {
    const LOCK: u64 = 3;
    let cluster = cluster("heat");
    let svc = start_service(&cluster, 8, 1);
    let (ctx, lc) = client(&cluster, svc.node.addr());
    let req = |ts| LockRequest {
        id: LOCK,
        ts,
        mode: Mode::Hot,
    };
    let (c2, lc2, table) = (ctx.clone(), lc.clone(), svc.table.clone());
    block_on(&ctx, async move {
        assert_eq!(lc2.heat(LOCK), None, "never observed");
        let a = queued(lc2.lock(&c2, &[req(1)]).await.unwrap());
        assert_eq!(lc2.heat(LOCK), Some(1), "the reply: A alone, holding");
        let mut b = queued(lc2.lock(&c2, &[req(2)]).await.unwrap());
        assert_eq!(lc2.heat(LOCK), Some(2), "the reply: A holds, B queued");
        let c = queued(lc2.lock(&c2, &[req(3)]).await.unwrap());
        assert_eq!(lc2.heat(LOCK), Some(3));
        // An audit's count of busy locks, two locks per READ: lock 3 alone.
        assert_eq!(lc2.count_busy(&c2, 0..8, 64).await.unwrap(), 1);
        assert_eq!(lc2.count_busy(&c2, 4..8, 1 << 20).await.unwrap(), 0);
        assert!(
            lc2.count_busy(&c2, 0..9, 64).await.is_err(),
            "past the table"
        );
        // C leaves (its release coroutine passes the lock on in its turn), and a fourth
        // ticket is taken behind the client's back: only a poll can see it.
        drop(c);
        let d = table.lock_local(&req(4), 0);
        assert!(d.granted_queue);
        let r = b.wait(Instant::now() + Duration::from_millis(20)).await;
        assert!(matches!(r, Err(LockError::WaitTimeout { .. })), "{r:?}");
        assert_eq!(lc2.heat(LOCK), Some(4), "B's poll: lower 4 - upper 0");
        a.release().await.unwrap();
        b.wait(Instant::now() + Duration::from_secs(10))
            .await
            .unwrap();
        b.release().await.unwrap();
        // After C's release the fourth ticket is served; pass it on by hand.
        while lc2.read_state(&c2, LOCK).await.unwrap().upper != 3 {
            c2.sleep(Duration::from_micros(50)).await;
        }
        c2.faa(lc2.node(), lc2.lock_addr(LOCK).offset(UPPER_OFF), 1)
            .await
            .unwrap();
        assert_eq!(lc2.read_state(&c2, LOCK).await.unwrap().queued(), 0);
        assert_eq!(lc2.heat(LOCK), Some(0), "the state READ: cold again");
        assert_eq!(lc2.count_busy(&c2, 0..8, 64).await.unwrap(), 0);
    });
    assert_eq!(svc.table.words(LOCK), (4, 4, 4));
}

/// A request's timestamp and the ticket it got (`None`: refused).
type Outcome = (u64, Option<u64>);

/// Lock RPCs sent together by coroutines of one thread (one doorbell batch), newest
/// timestamp first. Served in timestamp order (Scythe 4.4, Fig. 16) they all queue, in
/// timestamp order; served in arrival order, every one behind the newest is refused by
/// the `queued_ts` rule.
#[test]
fn timestamp_order_queues_a_round_by_timestamp() {
    const LOCK: u64 = 2;
    const N: u64 = 6;
    for order in [LockOrder::Timestamp, LockOrder::Arrival] {
        let cluster = cluster(&format!("order-{order:?}"));
        let svc = start_ordered(&cluster, 8, 2, order);
        let (ctx, lc) = client(&cluster, svc.node.addr());
        let replies: Rc<RefCell<Vec<Outcome>>> = Rc::default();
        let tickets: Rc<RefCell<Vec<Ticket>>> = Rc::default();
        let mut ex = Executor::new(ctx.clone());
        for i in 0..N {
            let (ctx, lc, replies, tickets) =
                (ctx.clone(), lc.clone(), replies.clone(), tickets.clone());
            ex.spawn(async move {
                let ts = 100 - 10 * i;
                let req = LockRequest {
                    id: LOCK,
                    ts,
                    mode: Mode::Hot,
                };
                match lc.lock(&ctx, &[req]).await.unwrap().remove(0) {
                    Grant::Queued(t) => {
                        replies.borrow_mut().push((ts, Some(t.number())));
                        tickets.borrow_mut().push(t);
                    }
                    Grant::Refused(r) => {
                        assert_eq!(r.reason, Some(RefuseReason::Timestamp), "{r:?}");
                        replies.borrow_mut().push((ts, None));
                    }
                }
            });
        }
        ex.run();
        let mut got = replies.borrow().clone();
        got.sort_unstable();
        match order {
            LockOrder::Timestamp => {
                let want: Vec<Outcome> = (0..N).map(|i| (50 + 10 * i, Some(i))).collect();
                assert_eq!(
                    got, want,
                    "every request queued, tickets in timestamp order"
                );
            }
            LockOrder::Arrival => {
                let granted: Vec<u64> = got.iter().filter(|r| r.1.is_some()).map(|r| r.0).collect();
                assert_eq!(granted, vec![100], "only the first to arrive queues");
            }
        }
        // Pass every ticket on, in ticket order, before the service goes.
        let mut ts: Vec<Ticket> = tickets.borrow_mut().drain(..).collect();
        ts.sort_by_key(|t| t.number());
        let c = ctx.clone();
        block_on(&ctx, async move {
            for mut t in ts {
                t.wait(Instant::now() + Duration::from_secs(10))
                    .await
                    .unwrap();
                t.release().await.unwrap();
            }
            drop(c);
        });
        let (lower, upper, _) = svc.table.words(LOCK);
        assert_eq!(lower, upper);
    }
}

/// The client's heat estimate moves a lock between the modes (Scythe 4.2, 4.3): a cold
/// request refused above ColdWatermark makes [`LockClient::mode_for`] say hot; hot
/// requests queue up to HotWatermark; once the queue drains, cold again.
#[test]
fn heat_moves_a_lock_between_cold_and_hot_mode() {
    const LOCK: u64 = 6;
    let cluster = cluster("modes");
    let svc = start_service(&cluster, 8, 1);
    let (ctx, lc) = client(&cluster, svc.node.addr());
    let wm = svc.table.watermarks();
    let c = ctx.clone();
    block_on(&ctx, async move {
        let mut ts = 0;
        let mut held = Vec::new();
        assert_eq!(lc.mode_for(LOCK), Mode::Cold, "never observed");
        // Each request locks in the mode the client's heat estimate chooses.
        let refusal = loop {
            ts += 1;
            let mode = lc.mode_for(LOCK);
            let req = LockRequest { id: LOCK, ts, mode };
            match lc.lock(&c, &[req]).await.unwrap().remove(0) {
                Grant::Queued(t) => held.push((mode, t)),
                Grant::Refused(r) => break r,
            }
        };
        assert_eq!(refusal.reason, Some(RefuseReason::HotWatermark));
        let modes: Vec<Mode> = held.iter().map(|(m, _)| *m).collect();
        let cold = (wm.cold + 1) as usize;
        assert_eq!(
            &modes[..cold],
            &vec![Mode::Cold; cold][..],
            "cold while <= cold watermark"
        );
        assert!(modes[cold..].iter().all(|&m| m == Mode::Hot), "{modes:?}");
        assert_eq!(held.len() as u64, wm.hot + 1);
        assert_eq!(lc.mode_for(LOCK), Mode::Hot);
        // A cold request is refused at this heat, whatever the client thinks.
        ts += 1;
        let r = *lc
            .lock(
                &c,
                &[LockRequest {
                    id: LOCK,
                    ts,
                    mode: Mode::Cold,
                }],
            )
            .await
            .unwrap()[0]
            .reply();
        assert_eq!(r.reason, Some(RefuseReason::ColdWatermark));
        // Drain: each release, then a state READ, lowers the heat.
        for (_, t) in held.drain(..) {
            t.release().await.unwrap();
        }
        lc.read_state(&c, LOCK).await.unwrap();
        assert_eq!(lc.mode_for(LOCK), Mode::Cold, "drained: cold again");
    });
}

/// The smoothed RTT is the network's (doorbell to completion), not the time a poll waits
/// for its coroutine to run: with a coroutine that blocks its thread for a millisecond
/// every round, the READs' scheduling lag grows and their RTT does not. (shm only: there a
/// READ completes in the round that posts it; a slower fabric would fold the blocked
/// round into the network time.)
#[test]
fn srtt_measures_the_network_not_the_scheduler() {
    if FabricKind::from_env().unwrap() != FabricKind::Shm {
        return;
    }
    let cluster = cluster("srtt");
    let svc = start_service(&cluster, 8, 1);
    let (ctx, lc) = client(&cluster, svc.node.addr());
    let done = Rc::new(Cell::new(false));
    let mut ex = Executor::new(ctx.clone());
    {
        let (ctx, lc, done) = (ctx.clone(), lc.clone(), done.clone());
        ex.spawn(async move {
            for _ in 0..20 {
                lc.read_state(&ctx, 1).await.unwrap();
            }
            done.set(true);
        });
    }
    {
        let (ctx, done) = (ctx.clone(), done.clone());
        ex.spawn(async move {
            while !done.get() {
                // Hog the thread: every other coroutine of the round waits.
                std::thread::sleep(Duration::from_millis(1));
                ctx.yield_now().await;
            }
        });
    }
    ex.run();
    let (srtt, lag) = (lc.srtt(), lc.sched_lag());
    eprintln!("srtt {srtt:?}, scheduling lag {lag:?}");
    assert!(srtt > Duration::ZERO);
    assert!(
        lag > srtt,
        "the hog's millisecond per round is scheduling lag, not network: {srtt:?} vs {lag:?}"
    );
}

/// The lock-and-read RPC of a service hosted with its data (`LockService::start_hosted`
/// with a reader, as a memory node starts it): a ticket served at once comes back with
/// what the host read for the descriptor; one queued behind the holder comes back
/// without; a malformed request takes nothing; a lockd without a reader does not offer
/// it. The host's role and exports are published beside the locks'.
#[test]
fn lock_and_read_brings_the_object_with_a_grant_served_at_once() {
    use lockd::embed::{Hosting, LockService, LockServiceConfig};
    use lockd::wire::{LOCK_READ_HANDLER, READ_DESC_BYTES};
    let cluster = cluster("lock-read");
    let fabric = cluster.open(NodeId(SERVICE_NODE)).unwrap();
    let reader: lockd::service::GrantReader =
        Arc::new(|d: &[u8; READ_DESC_BYTES], out: &mut Vec<u8>| {
            out.extend_from_slice(b"object ");
            out.extend_from_slice(d);
        });
    let mut exports = BTreeMap::new();
    exports.insert("cvt".to_string(), serde_json::json!({"partition": 0}));
    let svc = LockService::start_hosted(
        fabric,
        "127.0.0.1:0".parse().unwrap(),
        &LockServiceConfig::default().with_locks(16),
        &rrpc::node::RpcSettings::default(),
        Hosting {
            role: "memnode",
            exports,
            reader: Some(reader),
        },
        |_| {},
    )
    .unwrap();
    let ctx = ThreadCtx::new(
        cluster.open(NodeId(CLIENT_NODE)).unwrap(),
        RuntimeConfig::default(),
    )
    .unwrap();
    let info = ctx.connect_rpc(svc.addr()).unwrap();
    assert_eq!(info.role, "memnode");
    assert!(info.exports.contains_key("cvt"), "{:?}", info.exports);
    let lc = Rc::new(LockClient::from_info(&info).unwrap());
    assert!(lc.serves_lock_read());
    let desc = [7u8; READ_DESC_BYTES];
    let req = |ts| LockRequest {
        id: 3,
        ts,
        mode: Mode::Hot,
    };
    let c = ctx.clone();
    block_on(&ctx, async move {
        let ctx = c;
        let (g, bytes) = lc.lock_read(&ctx, req(10), &desc).await.unwrap();
        assert!(g.reply().holds_now());
        assert_eq!(&bytes[..7], b"object ");
        assert_eq!(&bytes[7..], &desc);
        let Grant::Queued(held) = g else {
            panic!("granted")
        };
        // Behind the holder: queued, and nothing read.
        let (g2, bytes2) = lc.lock_read(&ctx, req(11), &desc).await.unwrap();
        assert!(!g2.reply().holds_now() && g2.reply().ahead() == 1);
        assert!(bytes2.is_empty(), "{bytes2:?}");
        // A request of two entries is refused whole: the lock's queue does not move.
        let node = lc.node();
        let mut two = Vec::new();
        let hdr = lockd::wire::RequestHeader {
            owner: lockd::owners::Owner {
                node: CLIENT_NODE,
                incarnation: ctx.fabric().incarnation(),
            },
            seq: 99,
            epoch: lc.epoch(),
        };
        lockd::wire::encode_request(&[req(12), LockRequest { id: 4, ..req(12) }], &hdr, &mut two)
            .unwrap();
        two.extend_from_slice(&desc);
        let r = ctx.call(node, LOCK_READ_HANDLER, &two).await;
        assert!(
            matches!(&r, Err(CallError::Remote { msg, .. }) if msg.contains("one lock entry")),
            "{r:?}"
        );
        let st = lc.read_state(&ctx, 3).await.unwrap();
        assert_eq!(st.queued(), 2, "the holder and one waiter: {st:?}");
        held.release().await.unwrap();
        let Grant::Queued(mut next) = g2 else {
            panic!("queued")
        };
        next.wait(Instant::now() + Duration::from_secs(5))
            .await
            .unwrap();
        next.release().await.unwrap();
    });
    // A lockd node holds no data: no lock-and-read.
    let cluster2 = self::cluster("lock-read-plain");
    let plain = start_service(&cluster2, 16, 1);
    let (ctx2, lc2) = client(&cluster2, plain.node.addr());
    assert!(!lc2.serves_lock_read());
    let c2 = ctx2.clone();
    block_on(&ctx2, async move {
        let e = lc2.lock_read(&c2, req(1), &desc).await.unwrap_err();
        assert!(matches!(e, LockError::InvalidRequest(_)), "{e}");
    });
}
