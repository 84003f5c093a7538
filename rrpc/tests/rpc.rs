//! RPC over Rockets on the shm fabric: a server node and client threads in one process
//! (distinct node ids, real shared-memory rings, real server threads).

use rrpc::NodeId;
use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use rrpc::rocket::RocketConfig;
use rrpc::runtime::{CallError, Executor, RuntimeConfig, ThreadCtx};

mod common;
use common::{fabric, mem_node, server, ECHO, FAIL};

fn setup(name: &str) -> rrpc::fabric::shm::ClusterGuard {
    common::setup("rpc", name)
}

#[test]
fn many_coroutines_echo_through_small_rings() {
    let c = setup("echo");
    let srv = server(c.name(), 1);
    // A tiny ring forces wrap-around and credit stalls.
    let cfg = RuntimeConfig::default().with_rocket(RocketConfig::new(128, 4));
    let ctx = ThreadCtx::new(fabric(c.name(), 100), cfg).unwrap();
    let info = ctx.connect_rpc(srv.addr()).unwrap();
    let done = Rc::new(Cell::new(0u32));
    let mut ex = Executor::new(ctx.clone());
    for co in 0..8u32 {
        let (ctx, done) = (ctx.clone(), done.clone());
        ex.spawn(async move {
            for i in 0..500u32 {
                let len = ((co * 7 + i) % 90) as usize;
                let req: Vec<u8> = (0..len).map(|j| (j as u32 + i + co) as u8).collect();
                let resp = ctx.call(info.node, ECHO, &req).await.unwrap();
                assert_eq!(resp, req);
                done.set(done.get() + 1);
            }
        });
    }
    ex.run();
    assert_eq!(done.get(), 8 * 500);
    let st = ctx.stats();
    assert!(
        st.buckets < st.messages,
        "msg batching put several requests in a bucket: {st:?}"
    );
    assert!(
        st.credit_stalls > 0,
        "a 4-bucket ring must stall on credits: {st:?}"
    );
}

#[test]
fn errors_are_reported_not_hung() {
    let c = setup("errors");
    let srv = server(c.name(), 2);
    let ctx = ThreadCtx::new(
        fabric(c.name(), 101),
        RuntimeConfig::default().with_call_timeout(Duration::from_millis(300)),
    )
    .unwrap();
    let info = ctx.connect_rpc(srv.addr()).unwrap();
    let node = info.node;
    let results = Rc::new(std::cell::RefCell::new(Vec::new()));
    let mut ex = Executor::new(ctx.clone());
    {
        let (ctx, results) = (ctx.clone(), results.clone());
        ex.spawn(async move {
            let a = ctx.call(node, FAIL, b"x").await;
            let b = ctx.call(node, 999, b"x").await;
            let c = ctx.call(node, ECHO, &[0u8; 4096]).await;
            let d = ctx.call(NodeId(node.0 + 1), ECHO, b"x").await;
            results.borrow_mut().extend([a, b, c, d]);
        });
    }
    ex.run();
    let r = results.borrow();
    assert!(matches!(&r[0], Err(CallError::Remote { msg, .. }) if msg == "refused on purpose"));
    assert!(matches!(&r[1], Err(CallError::Remote { msg, .. }) if msg.contains("no handler 999")));
    // Larger than a bucket: sent by reference, the reply comes back by READ.
    assert!(matches!(&r[2], Ok(v) if v == &vec![0u8; 4096]));
    assert!(matches!(&r[3], Err(CallError::NotConnected { .. })));
    drop(r);

    // The server goes away: pending and new calls fail (dead peer or deadline), never hang.
    drop(srv);
    let outcome = Rc::new(Cell::new(None));
    let mut ex = Executor::new(ctx.clone());
    {
        let (ctx, outcome) = (ctx.clone(), outcome.clone());
        ex.spawn(async move {
            outcome.set(Some(ctx.call(node, ECHO, b"hello?").await.is_err()));
        });
    }
    ex.run();
    assert_eq!(outcome.get(), Some(true));
}

#[test]
fn one_sided_ops_batch_into_one_doorbell() {
    let c = setup("onesided");
    let (node, _mr) = mem_node(c.name(), 1, 4096);
    let ctx = ThreadCtx::new(fabric(c.name(), 102), RuntimeConfig::default()).unwrap();
    let info = ctx.connect(node.addr()).unwrap();
    let desc: rrpc::fabric::MrDesc = info.export("mr").unwrap();
    let mut ex = Executor::new(ctx.clone());
    for co in 0..16u64 {
        let ctx = ctx.clone();
        ex.spawn(async move {
            let a = desc.at(co * 8);
            ctx.write(info.node, a, &(co * 10).to_le_bytes())
                .await
                .unwrap();
            assert_eq!(ctx.faa(info.node, a, 1).await.unwrap(), co * 10);
            assert_eq!(
                ctx.cas(info.node, a, co * 10 + 1, 77).await.unwrap(),
                co * 10 + 1
            );
            let v = ctx.read(info.node, a, 8).await.unwrap();
            assert_eq!(u64::from_le_bytes(v.try_into().unwrap()), 77);
        });
    }
    ex.run();
    let st = ctx.stats();
    assert_eq!(st.wrs, 64);
    assert_eq!(
        st.doorbells, 4,
        "16 coroutines' ops go out together each round: {st:?}"
    );
}

#[test]
fn full_send_queue_defers_without_loss() {
    let c = setup("sqfull");
    let srv = server(c.name(), 1);
    // A 4-WR send queue: each round's WRs (16 coroutines' ops, buckets, credits) must
    // wait for room, in order, and nothing may be lost or duplicated.
    let ctx = ThreadCtx::new(
        fabric(c.name(), 103),
        RuntimeConfig::default().with_sq_depth(4),
    )
    .unwrap();
    let info = ctx.connect_rpc(srv.addr()).unwrap();
    // One-sided ops go to a memory node.
    let (mem_node, mr) = mem_node(c.name(), 2, 16 * 8);
    let minfo = ctx.connect(mem_node.addr()).unwrap();
    let desc: rrpc::fabric::MrDesc = minfo.export("mr").unwrap();
    let done = Rc::new(Cell::new(0u32));
    let mut ex = Executor::new(ctx.clone());
    for co in 0..16u64 {
        let (ctx, done) = (ctx.clone(), done.clone());
        ex.spawn(async move {
            for i in 0..20u64 {
                // FAA is not idempotent: a duplicated WR would show in the final count.
                ctx.faa(minfo.node, desc.at(co * 8), 1).await.unwrap();
                let req = (co * 1000 + i).to_le_bytes();
                assert_eq!(ctx.call(info.node, ECHO, &req).await.unwrap(), req);
                done.set(done.get() + 1);
            }
        });
    }
    ex.run();
    assert_eq!(done.get(), 16 * 20);
    for co in 0..16 {
        assert_eq!(mr.load_u64(co * 8), 20, "coroutine {co}'s counter");
    }
    assert!(
        ctx.stats().sq_full > 0,
        "the send queue never filled: {:?}",
        ctx.stats()
    );
}

/// Coroutines spawned through the context (by a coroutine, or outside any executor) run
/// on the executor, which returns only once they have finished too.
#[test]
fn spawned_coroutines_run_to_completion() {
    let c = setup("spawn");
    let srv = server(c.name(), 1);
    let ctx = ThreadCtx::new(fabric(c.name(), 100), RuntimeConfig::default()).unwrap();
    let info = ctx.connect_rpc(srv.addr()).unwrap();
    let log: Rc<std::cell::RefCell<Vec<String>>> = Rc::default();
    // Spawned before any executor runs: the first one picks it up.
    {
        let (c2, log) = (ctx.clone(), log.clone());
        ctx.spawn(async move {
            let r = c2.call(info.node, ECHO, b"early").await.unwrap();
            log.borrow_mut().push(String::from_utf8(r).unwrap());
        });
    }
    let mut ex = Executor::new(ctx.clone());
    {
        let (ctx, log) = (ctx.clone(), log.clone());
        ex.spawn(async move {
            for i in 0..3 {
                let (c2, log) = (ctx.clone(), log.clone());
                // The spawning coroutine finishes first; its children outlive it.
                ctx.spawn(async move {
                    c2.sleep(Duration::from_millis(5)).await;
                    let r = c2
                        .call(info.node, ECHO, format!("child {i}").as_bytes())
                        .await;
                    log.borrow_mut()
                        .push(String::from_utf8(r.unwrap()).unwrap());
                });
            }
            log.borrow_mut().push("parent done".into());
        });
    }
    ex.run();
    let mut got = log.borrow().clone();
    got.sort();
    assert_eq!(
        got,
        ["child 0", "child 1", "child 2", "early", "parent done"]
    );
}

/// A context driven by an executor other than its own (whose rounds never touch the
/// context's cached round clock) still starts each call on a fresh clock: after a long
/// sleep, a call with a short deadline that the server answers at once succeeds. With a
/// clock cached before the sleep, its deadline would lie in the past and it would time out.
#[test]
fn calls_on_a_context_driven_by_another_executor_start_on_a_fresh_clock() {
    let c = setup("foreign-exec");
    let srv = server(c.name(), 1);
    let ctx = ThreadCtx::new(fabric(c.name(), 100), RuntimeConfig::default()).unwrap();
    let node = ctx.connect_rpc(srv.addr()).unwrap().node;
    let foreign = rrpc::exec::Handle::new();
    let mut ex = rrpc::exec::Executor::new(foreign.clone());
    let out = Rc::new(Cell::new(None));
    let (c2, o2) = (ctx.clone(), out.clone());
    ex.spawn(async move {
        // Reads (and caches) the context's clock.
        c2.call(node, ECHO, b"first").await.unwrap();
        foreign.sleep(Duration::from_millis(300)).await;
        let opts = rrpc::runtime::CallOpts {
            timeout: Some(Duration::from_millis(100)),
            ..Default::default()
        };
        o2.set(Some(
            c2.call_with(node, ECHO, b"second", opts).await.is_ok(),
        ));
    });
    ex.run(&mut || ctx.progress());
    assert_eq!(out.get(), Some(true));
}

/// `write_ordered` lands its WRITEs in order: a reader at the node that sees the last
/// one (a flag) sees every earlier one (the payload), across many rounds; and a list
/// whose middle WRITE fails stops there: the one before it landed, the one after it
/// did not.
#[test]
fn ordered_writes_land_in_order_and_stop_at_a_failure() {
    use rrpc::fabric::{MrDesc, RemoteAddr};
    use rrpc::runtime::block_on;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    const ROUNDS: u64 = 300;
    const PAYLOAD: usize = 4096;
    const FLAG: usize = 8192;
    let c = setup("ordered");
    let (mem, mr) = mem_node(c.name(), 2, 16384);
    let ctx = ThreadCtx::new(fabric(c.name(), 102), RuntimeConfig::default()).unwrap();
    let info = ctx.connect(mem.addr()).unwrap();
    let node = info.node;
    let desc: MrDesc = info.export("mr").unwrap();
    let stop = AtomicBool::new(false);
    let checked = std::sync::Arc::new(AtomicU64::new(0));
    let written = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            // Watchdog: the writer sets `stop` when it is done, however it ends.
            while !stop.load(Ordering::Acquire) {
                let flag = mr.load_u64(FLAG);
                if flag == 0 {
                    continue;
                }
                for w in (0..PAYLOAD).step_by(8) {
                    let v = mr.load_u64(w);
                    assert!(
                        v >= flag,
                        "flag {flag} visible before payload word {w} ({v})"
                    );
                }
                checked.fetch_add(1, Ordering::Relaxed);
            }
        });
        let (c2, seen) = (ctx.clone(), checked.clone());
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            block_on(&ctx, async move {
                // At least ROUNDS, and on until the reader (a thread the scheduler may
                // not run for a while on a busy machine) has checked a flag.
                let mut v = 0;
                while v < ROUNDS || (seen.load(Ordering::Relaxed) == 0 && v < 100 * ROUNDS) {
                    v += 1;
                    let payload: Vec<u8> = (0..PAYLOAD / 8).flat_map(|_| v.to_le_bytes()).collect();
                    c2.write_ordered(
                        node,
                        &[
                            (desc.at(0), &payload[..]),
                            (desc.at(FLAG as u64), &v.to_le_bytes()[..]),
                        ],
                    )
                    .await
                    .unwrap();
                }
                v
            })
        }));
        stop.store(true, Ordering::Release);
        reader.join().unwrap();
        let written = r.unwrap();
        assert!(
            checked.load(Ordering::Relaxed) > 0,
            "the reader never saw a flag"
        );
        written
    });
    assert!(written >= ROUNDS);
    assert_eq!(mr.load_u64(FLAG), written);
    // A failing WRITE in the middle: no bad rkey is 0xdead_beef in this cluster.
    let bad = RemoteAddr {
        addr: desc.addr,
        rkey: 0xdead_beef,
    };
    let c2 = ctx.clone();
    let r = block_on(&ctx, async move {
        c2.write_ordered(
            node,
            &[
                (desc.at(16), &7u64.to_le_bytes()[..]),
                (bad, &8u64.to_le_bytes()[..]),
                (desc.at(24), &9u64.to_le_bytes()[..]),
            ],
        )
        .await
    });
    assert!(r.is_err(), "a WRITE to an unknown rkey succeeded");
    assert_eq!(mr.load_u64(16), 7, "the WRITE before the failure landed");
    assert_eq!(mr.load_u64(24), written, "a WRITE after the failure landed");
}

/// A requester that asks for server thread i (`ThreadCtx::ask_server_thread`, modulo
/// the server's threads) is served there; one that asks for nothing is spread round
/// robin. The handler answers with the name of the thread it runs on.
#[test]
fn a_rocket_pair_is_served_on_the_server_thread_it_asks_for() {
    use rrpc::server::Handlers;
    const WHO: u16 = Handlers::FIRST_APP_ID;
    let c = common::setup("rpc", "askthread");
    let mut h = Handlers::new();
    h.register(WHO, |_, out| {
        out.extend_from_slice(std::thread::current().name().unwrap_or("?").as_bytes());
        Ok(())
    });
    let srv = common::server_with(c.name(), h, 3);
    let addr = srv.addr();
    let mut served = Vec::new();
    for (i, ask) in [Some(2), Some(0), Some(4), None, None, None]
        .into_iter()
        .enumerate()
    {
        // A thread of its own per requester: one Rocket pair each.
        let name = c.name().to_string();
        served.push(
            std::thread::spawn(move || {
                let ctx = rrpc::runtime::ThreadCtx::new(
                    common::fabric(&name, 100 + i as u32),
                    rrpc::runtime::RuntimeConfig::default(),
                )
                .unwrap();
                ctx.ask_server_thread(ask);
                let node = ctx.connect_rpc(addr).unwrap().node;
                let c2 = ctx.clone();
                let who =
                    rrpc::runtime::block_on(&ctx, async move { c2.call(node, WHO, b"").await })
                        .unwrap();
                String::from_utf8(who).unwrap()
            })
            .join()
            .unwrap(),
        );
    }
    assert_eq!(
        &served[..3],
        ["rpc-server-2", "rpc-server-0", "rpc-server-1"],
        "asked for 2, 0 and 4 (= 1 of 3)"
    );
    // Round robin for the rest: three requesters, three different threads.
    let mut rest: Vec<&String> = served[3..].iter().collect();
    rest.sort();
    rest.dedup();
    assert_eq!(rest.len(), 3, "{served:?}");
}
