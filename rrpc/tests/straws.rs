//! RdmaStraws (Scythe, 4.6 (1), Fig. 19): QP pools shared by a
//! process's threads, growing and shrinking with them; a QP failing mid-stream is
//! reconnected without losing messages; every batching mode delivers. On `$RRPC_FABRIC`.

use rrpc::NodeId;
use std::cell::Cell;
use std::rc::Rc;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use rrpc::runtime::{Executor, Runtime, RuntimeConfig, ThreadCtx};
use rrpc::straw::QpKind;
use rrpc::wire::Batching;

mod common;
use common::{eventually, fabric, mem_node, server, setup, ECHO};

#[test]
fn pool_grows_and_shrinks_with_the_threads_it_serves() {
    let c = setup("straws", "pool");
    let srv = server(c.name(), 2);
    let addr = srv.addr();
    let rt = Arc::new(Runtime::new(
        fabric(c.name(), 100),
        RuntimeConfig::default().with_threads_per_qp(2),
    ));
    let attached = Arc::new(Barrier::new(6));
    let grown = Arc::new(Barrier::new(6));
    let called = Arc::new(Barrier::new(6));
    let counted = Arc::new(Barrier::new(6));
    let mut joins = Vec::new();
    // Thread t leaves after step t; the main thread counts QPs in between.
    // Step i has thread i leaving, threads i+1.. staying, and the main thread, which
    // counts QPs between the step's two barriers (nobody leaves meanwhile).
    let steps: Vec<(Barrier, Barrier)> = (0..5)
        .map(|i| (Barrier::new(6 - i), Barrier::new(6 - i)))
        .collect();
    let steps = Arc::new(steps);
    for t in 0..5u32 {
        let (rt, attached, grown, called, counted, steps) = (
            rt.clone(),
            attached.clone(),
            grown.clone(),
            called.clone(),
            counted.clone(),
            steps.clone(),
        );
        joins.push(std::thread::spawn(move || {
            let ctx = rt.thread_ctx().unwrap();
            let node = ctx.connect_rpc(addr).unwrap().node;
            echo_rounds(&ctx, node, 4, 50, t);
            attached.wait();
            // Calls again once the pool has grown: their flushes pick the least-loaded
            // QPs. (Calls made before may all have gone out on the first QP, if the
            // control thread grew the pool only after them.)
            grown.wait();
            echo_rounds(&ctx, node, 4, 50, t);
            called.wait();
            counted.wait();
            for (i, (left, read)) in steps.iter().enumerate() {
                if i == t as usize {
                    drop(ctx);
                    left.wait();
                    read.wait();
                    return;
                }
                left.wait();
                read.wait();
            }
        }));
    }
    attached.wait();
    let straw = rt.straws().get(NodeId(1)).unwrap();
    // 5 threads at 2 per QP: 3 QPs of each kind, and the Rockets spread over them. The
    // control thread grows the pool behind the first QP; the threads' first calls ran
    // meanwhile, their second ones after it.
    assert_eq!(straw.threads(QpKind::Rpc), 5);
    let full = || straw.list(QpKind::Rpc).len() == 3 && straw.list(QpKind::OneSided).len() == 3;
    assert!(eventually(Duration::from_secs(20), full));
    grown.wait();
    called.wait();
    let rpc = straw.list(QpKind::Rpc);
    assert_eq!(rpc.len(), 3);
    assert_eq!(straw.list(QpKind::OneSided).len(), 3);
    let used = rpc.iter().filter(|q| q.lists_posted() > 0).count();
    assert!(
        used >= 2,
        "least-loaded pick spreads Rockets over the QPs ({used} used)"
    );
    counted.wait();
    // 4, 3, 2, 1, 0 threads left: ceil(t / 2) QPs, once the control thread has shrunk
    // the pool (the leaving thread detached before the barrier released).
    let want = [2, 2, 1, 1, 0];
    let mut sizes = Vec::new();
    for ((left, read), w) in steps.iter().zip(want) {
        left.wait();
        eventually(Duration::from_secs(20), || {
            straw.list(QpKind::Rpc).len() == w
        });
        sizes.push(straw.list(QpKind::Rpc).len());
        read.wait();
    }
    for j in joins {
        j.join().unwrap();
    }
    assert_eq!(sizes, want);
}

/// `coroutines` x `calls` echo calls with unique payloads, checked.
fn echo_rounds(ctx: &Rc<ThreadCtx>, node: NodeId, coroutines: u32, calls: u32, tag: u32) {
    let done = Rc::new(Cell::new(0u32));
    let mut ex = Executor::new(ctx.clone());
    for co in 0..coroutines {
        let (ctx, done) = (ctx.clone(), done.clone());
        ex.spawn(async move {
            for i in 0..calls {
                let req: Vec<u8> = [tag, co, i].iter().flat_map(|x| x.to_le_bytes()).collect();
                assert_eq!(ctx.call(node, ECHO, &req).await.unwrap(), req);
                done.set(done.get() + 1);
            }
        });
    }
    ex.run();
    assert_eq!(done.get(), coroutines * calls);
}

#[test]
fn qp_error_mid_stream_reconnects_without_losing_messages() {
    let c = setup("straws", "qperr");
    let srv = server(c.name(), 1);
    let (mem, mr) = mem_node(c.name(), 2, 8 * 64);
    let ctx = ThreadCtx::new(
        fabric(c.name(), 100),
        // Small rings: many buckets in flight and credit stalls while QPs fail.
        RuntimeConfig::default().with_rocket(rrpc::rocket::RocketConfig::new(128, 8)),
    )
    .unwrap();
    let node = ctx.connect_rpc(srv.addr()).unwrap().node;
    let minfo = ctx.connect(mem.addr()).unwrap();
    let desc: rrpc::fabric::MrDesc = minfo.export("mr").unwrap();
    let done = Rc::new(Cell::new(0u32));
    let retries = Rc::new(Cell::new(0u32));
    let stop = Rc::new(Cell::new(false));
    let mut ex = Executor::new(ctx.clone());
    for co in 0..8u64 {
        let (ctx, done, retries, stop) = (ctx.clone(), done.clone(), retries.clone(), stop.clone());
        ex.spawn(async move {
            let mut i = 0u64;
            while !stop.get() {
                let req = (co << 32 | i).to_le_bytes();
                // Every message arrives, exactly once and intact, through the failures.
                assert_eq!(ctx.call(node, ECHO, &req).await.unwrap(), req);
                done.set(done.get() + 1);
                // One-sided ops on a failed QP fail (their outcome is unknown, as with
                // verbs); an idempotent WRITE is simply retried.
                let a = desc.at(co * 8);
                while ctx.write(minfo.node, a, &i.to_le_bytes()).await.is_err() {
                    retries.set(retries.get() + 1);
                }
                i += 1;
            }
            // The last value written stuck.
            let v = ctx.read(minfo.node, desc.at(co * 8), 8).await.unwrap();
            assert_eq!(u64::from_le_bytes(v.try_into().unwrap()), i - 1);
        });
    }
    {
        // Failures are injected as calls progress, not on a clock, so a slow machine (a
        // VM under load) sees the same stream: 15 calls between failures, 30 after.
        let (ctx, stop, done) = (ctx.clone(), stop.clone(), done.clone());
        ex.spawn(async move {
            let progress = |n: u32| {
                let (ctx, done) = (ctx.clone(), done.clone());
                async move {
                    let from = done.get();
                    while done.get() < from + n {
                        ctx.sleep(Duration::from_millis(1)).await;
                    }
                }
            };
            for k in 0..6 {
                progress(15).await;
                if k % 2 == 0 {
                    ctx.inject_qp_error(node, QpKind::Rpc).unwrap();
                } else {
                    ctx.inject_qp_error(minfo.node, QpKind::OneSided).unwrap();
                }
            }
            progress(30).await;
            stop.set(true);
        });
    }
    ex.run();
    assert!(done.get() > 8 * 10, "{} calls", done.get());
    let (srv_straw, mem_straw) = (
        ctx.straws().get(node).unwrap(),
        ctx.straws().get(minfo.node).unwrap(),
    );
    assert_eq!(
        (srv_straw.reconnects(), mem_straw.reconnects()),
        (3, 3),
        "every injected failure repaired once; stats {:?}",
        ctx.stats()
    );
    drop(mr);
}

#[test]
fn every_batching_mode_delivers_and_batches_as_named() {
    let c = setup("straws", "batching");
    let srv = server(c.name(), 1);
    for b in Batching::ALL {
        let ctx = ThreadCtx::new(
            fabric(c.name(), 100 + b as u32),
            RuntimeConfig::default().with_batching(b),
        )
        .unwrap();
        let node = ctx.connect_rpc(srv.addr()).unwrap().node;
        echo_rounds(&ctx, node, 16, 100, b as u32);
        let st = ctx.stats();
        if b.msg() {
            assert!(st.buckets < st.messages, "{b:?} packs buckets: {st:?}");
        } else {
            assert!(
                st.buckets >= st.messages,
                "{b:?}: one message per bucket: {st:?}"
            );
        }
        if b.doorbell() {
            assert!(st.wrs > st.doorbells, "{b:?} chains WRs: {st:?}");
        } else {
            assert_eq!(st.wrs, st.doorbells, "{b:?}: a doorbell per WR: {st:?}");
        }
    }
}

/// A node that goes away and comes back (a new process under the same node id, at the
/// same address): calls fail while it is gone, within the reconnect give-up time and
/// the call deadline (never hang), and the next calls after it is back reach it again
/// on the same thread, without the caller asking to reconnect.
#[test]
fn a_node_that_restarts_is_reached_again_by_the_next_calls() {
    use rrpc::node::{Node, NodeConfig};
    use rrpc::runtime::{block_on, CallError, OneSidedError};
    let c = setup("straws", "restart");
    let start_at = |listen: std::net::SocketAddr| {
        Node::start(
            fabric(c.name(), 1),
            NodeConfig::new("echo", listen).rpc(common::echo_handlers(), 1),
        )
    };
    let srv = start_at("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = srv.addr();
    let ctx = ThreadCtx::new(
        fabric(c.name(), 100),
        RuntimeConfig::default()
            .with_call_timeout(Duration::from_millis(500))
            .with_reconnect_give_up(Duration::from_millis(200)),
    )
    .unwrap();
    let node = ctx.connect_rpc(addr).unwrap().node;
    let call = |ctx: &Rc<ThreadCtx>| {
        let c2 = ctx.clone();
        block_on(ctx, async move { c2.call(node, ECHO, b"ping").await })
    };
    assert_eq!(call(&ctx).unwrap(), b"ping");
    drop(srv);
    // Gone: calls fail (the pool finds the node dead, or the deadline passes).
    assert!(
        eventually(Duration::from_secs(30), || matches!(
            call(&ctx),
            Err(CallError::PeerGone { .. })
        )),
        "calls to a stopped node never failed with PeerGone"
    );
    assert!(matches!(
        call(&ctx),
        Err(CallError::PeerGone { .. } | CallError::Timeout { .. })
    ));
    // Back under the same id and address (the old process's fabric is released once
    // its threads have stopped).
    let mut again = None;
    assert!(
        eventually(Duration::from_secs(30), || {
            again = start_at(addr).ok();
            again.is_some()
        }),
        "node 1 could not start again"
    );
    assert!(
        eventually(Duration::from_secs(30), || call(&ctx)
            .is_ok_and(|r| r == b"ping")),
        "calls never reached the restarted node"
    );
    // One-sided ops reach it again as well (the connection was made anew).
    let c2 = ctx.clone();
    let r = block_on(&ctx, async move {
        c2.read(node, rrpc::fabric::RemoteAddr { addr: 0, rkey: 0 }, 8)
            .await
    });
    assert!(
        matches!(r, Err(OneSidedError::Completion { .. })),
        "a bad rkey fails its op, not the connection: {r:?}"
    );
    assert_eq!(call(&ctx).unwrap(), b"ping");
    drop(again);
}

/// One doorbell list of one-sided ops whose middle WR names a region that is not there
/// (an rkey of a process that restarted): the ops before it completed, the failed one
/// says why (`RemoteAccess`: not a transport failure, so not retried as one), and only
/// the ops after it are reported flushed. (Reporting the whole list flushed made a
/// Takeout release retry its stale READ for its whole release wait.)
#[test]
fn a_failed_list_reports_the_failing_op_and_flushes_only_the_rest() {
    use rrpc::fabric::{RemoteAddr, WcStatus};
    use rrpc::runtime::{block_on, join_all, OneSidedError};
    let c = setup("straws", "failedlist");
    let (mem, mr) = mem_node(c.name(), 2, 8 * 64);
    let ctx = ThreadCtx::new(fabric(c.name(), 100), RuntimeConfig::default()).unwrap();
    let minfo = ctx.connect(mem.addr()).unwrap();
    let desc: rrpc::fabric::MrDesc = minfo.export("mr").unwrap();
    let bad = RemoteAddr {
        addr: desc.addr,
        rkey: desc.rkey ^ 0x5a5a,
    };
    let c2 = ctx.clone();
    let rs = block_on(&ctx, async move {
        // Queued in one round: one list, in this order.
        let addrs = [desc.at(0), desc.at(8), bad, desc.at(16), desc.at(24)];
        join_all(addrs.iter().map(|&a| c2.read(minfo.node, a, 8))).await
    });
    let status = |r: &Result<Vec<u8>, OneSidedError>| match r {
        Ok(_) => None,
        Err(OneSidedError::Completion { status, .. }) => Some(*status),
        Err(e) => panic!("unexpected error {e}"),
    };
    let got: Vec<Option<WcStatus>> = rs.iter().map(status).collect();
    assert_eq!(
        got,
        [
            None,
            None,
            Some(WcStatus::RemoteAccess),
            Some(WcStatus::Flushed),
            Some(WcStatus::Flushed)
        ],
        "stats {:?}",
        ctx.stats()
    );
    // The QP is reconnected and the next ops go through.
    let c2 = ctx.clone();
    assert!(eventually(Duration::from_secs(10), || {
        let c3 = c2.clone();
        block_on(&c2, async move { c3.read(minfo.node, desc.at(0), 8).await }).is_ok()
    }));
    drop(mr);
}

#[test]
fn reconnect_backoff_doubles_from_1ms_to_100ms() {
    use rrpc::straw::{next_backoff, RECONNECT_BACKOFF_MAX, RECONNECT_BACKOFF_MIN};
    let mut p = None;
    let mut seen = Vec::new();
    for _ in 0..10 {
        let d = next_backoff(p);
        seen.push(d.as_millis());
        p = Some(d);
    }
    assert_eq!(seen, [1, 2, 4, 8, 16, 32, 64, 100, 100, 100]);
    assert_eq!(next_backoff(None), RECONNECT_BACKOFF_MIN);
    assert_eq!(
        next_backoff(Some(Duration::from_secs(5))),
        RECONNECT_BACKOFF_MAX
    );
}

/// A TCP forwarder to `to` on `port` (0: pick one) that can stop accepting for a while:
/// the control plane of a node behind a flapping link. Connections already made stay.
struct Flappy {
    port: u16,
    up: Arc<std::sync::atomic::AtomicBool>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Flappy {
    fn start(to: std::net::SocketAddr) -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let up = Arc::new(AtomicBool::new(true));
        let stop = Arc::new(AtomicBool::new(false));
        let (u, s) = (up.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut listener = Some(l);
            while !s.load(Ordering::Relaxed) {
                if !u.load(Ordering::Relaxed) {
                    listener = None; // the port refuses connections
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                }
                let l = listener.get_or_insert_with(|| {
                    std::net::TcpListener::bind(("127.0.0.1", port)).unwrap()
                });
                l.set_nonblocking(true).unwrap();
                match l.accept() {
                    Ok((a, _)) => {
                        a.set_nonblocking(false).unwrap();
                        let b = std::net::TcpStream::connect(to).unwrap();
                        for (mut from, mut into) in
                            [(a.try_clone().unwrap(), b.try_clone().unwrap()), (b, a)]
                        {
                            std::thread::spawn(move || {
                                let _ = std::io::copy(&mut from, &mut into);
                                let _ = into.shutdown(std::net::Shutdown::Write);
                            });
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(1)),
                }
            }
        });
        Self { port, up, stop }
    }
    fn addr(&self) -> std::net::SocketAddr {
        ([127, 0, 0, 1], self.port).into()
    }
    fn set_up(&self, up: bool) {
        self.up.store(up, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for Flappy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A link flap shorter than the reconnect give-up time: the QPs fail while the node's
/// control plane refuses connections; the reconnect keeps trying with backoff, and once
/// the control plane is back the QPs are reconnected and the calls made meanwhile
/// complete. The node is never reported dead.
#[test]
fn a_control_plane_flap_is_bridged_by_reconnect_backoff() {
    use rrpc::runtime::block_on;
    let c = setup("straws", "flap");
    let srv = server(c.name(), 1);
    let link = Flappy::start(srv.addr());
    let ctx = ThreadCtx::new(
        fabric(c.name(), 100),
        RuntimeConfig::default().with_call_timeout(Duration::from_secs(20)),
    )
    .unwrap();
    let node = ctx.connect_rpc(link.addr()).unwrap().node;
    let c2 = ctx.clone();
    assert_eq!(
        block_on(&ctx, async move { c2.call(node, ECHO, b"a").await }).unwrap(),
        b"a"
    );
    link.set_up(false);
    std::thread::sleep(Duration::from_millis(20));
    ctx.inject_qp_error(node, QpKind::Rpc).unwrap();
    // The link comes back 300 ms later, while the call below waits for a usable QP.
    let up = {
        let up = link.up.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            up.store(true, std::sync::atomic::Ordering::Relaxed);
        })
    };
    let c2 = ctx.clone();
    let r = block_on(&ctx, async move { c2.call(node, ECHO, b"b").await });
    up.join().unwrap();
    assert_eq!(r.unwrap(), b"b");
    let straw = ctx.straws().get(node).unwrap();
    assert!(straw.dead().is_none(), "the node was reported dead");
    assert!(straw.reconnects() >= 1);
}

/// The thread-owned fast path ([`rrpc::straw::SharedQp::poll_into`]): the polling
/// thread's own completions go straight to its list, other threads' to their mailboxes,
/// and its list keeps the QP's completion order even when another thread's poll routed
/// its earlier completions through its mailbox meanwhile.
#[test]
fn poll_into_delivers_own_lists_directly_in_the_qps_order() {
    use rrpc::fabric::{SendWr, WcStatus, WrOpcode};
    use rrpc::straw::{ListDone, Mailbox};
    let c = setup("straws", "pollinto");
    let (mem, mr) = mem_node(c.name(), 2, 4096);
    let f = fabric(c.name(), 100);
    let local = f.alloc_mr(64).unwrap();
    let rt = Runtime::new(f, RuntimeConfig::default());
    let ctx = rt.thread_ctx().unwrap();
    let minfo = ctx.connect(mem.addr()).unwrap();
    let desc: rrpc::fabric::MrDesc = minfo.export("mr").unwrap();
    // One one-sided op makes the straw's one-sided QP.
    let c2 = ctx.clone();
    rrpc::runtime::block_on(
        &ctx,
        async move { c2.read(minfo.node, desc.at(0), 8).await },
    )
    .unwrap();
    let straw = rt.straws().get(minfo.node).unwrap();
    let qp = straw.list(QpKind::OneSided)[0].clone();
    let wr = |k: u64| SendWr {
        wr_id: 0,
        opcode: WrOpcode::Write,
        sge: local.sge(0, 8),
        remote: desc.at(8 * k),
        signaled: true,
        inline: false,
    };
    let (mine, other) = (Mailbox::new(), Mailbox::new());
    let post = |mb: &Arc<Mailbox>, token: u64| {
        let mut wrs = [wr(token)];
        assert_eq!(qp.post(&mut wrs, mb, token).unwrap(), 1);
    };
    // Lists 1 (mine) and 2 (another thread's), then a poll by that other thread: it
    // routes both through the mailboxes.
    post(&mine, 1);
    post(&other, 2);
    assert!(eventually(Duration::from_secs(10), || {
        qp.poll();
        qp.load() == 0
    }));
    // List 3 (mine), polled by me: list 1, which my mailbox holds, comes first.
    post(&mine, 3);
    let mut out = Vec::new();
    assert!(eventually(Duration::from_secs(10), || {
        qp.poll_into(&mine, &mut out);
        qp.load() == 0
    }));
    mine.drain(&mut out);
    let tokens: Vec<u64> = out.iter().map(|d: &ListDone| d.token).collect();
    assert_eq!(tokens, [1, 3], "my completions, in the QP's order");
    assert!(out.iter().all(|d| d.status == WcStatus::Success));
    let mut theirs = Vec::new();
    other.drain(&mut theirs);
    assert_eq!(theirs.iter().map(|d| d.token).collect::<Vec<_>>(), [2]);
    // A list polled by its own thread skips the mailbox entirely.
    post(&mine, 4);
    let mut out = Vec::new();
    assert!(eventually(Duration::from_secs(10), || {
        qp.poll_into(&mine, &mut out);
        !out.is_empty()
    }));
    assert_eq!(out.iter().map(|d| d.token).collect::<Vec<_>>(), [4]);
    let mut left = Vec::new();
    mine.drain(&mut left);
    assert!(
        left.is_empty(),
        "nothing went through the mailbox: {left:?}"
    );
    drop((ctx, mr));
}
