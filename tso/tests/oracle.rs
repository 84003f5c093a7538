//! The oracle over the shm fabric: concurrent clients in-process, and the real `tso`
//! binary.

mod common;
use common::{signal, spawn_service, tagged, wait};
use rrpc::NodeId;
use std::cell::RefCell;
use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::time::Duration;

use rrpc::fabric::shm::ClusterGuard;
use rrpc::fabric::DmPlacement;
use rrpc::runtime::{Executor, RuntimeConfig, ThreadCtx};
use tso::{GroupedTso, Oracle, Timestamp, TsoClient, TsoError};

/// This test's cluster, removed when the test ends, however it ends.
fn cluster(name: &str) -> ClusterGuard {
    let c = format!("tso-test-{}-{name}", std::process::id());
    ClusterGuard::new(&c).unwrap().0
}

#[test]
fn concurrent_timestamps_are_unique_increasing_and_contiguous() {
    const THREADS: usize = 4;
    const COROS: usize = 8;
    const ROUNDS: u64 = 200;
    const BATCH: u64 = 5;
    let cluster = cluster("conc");
    let fabric = cluster.open(NodeId(1)).unwrap();
    let oracle = Oracle::new(&fabric).unwrap();
    assert!(matches!(
        oracle.placement(),
        DmPlacement::HostFallback { .. }
    ));
    let node = oracle
        .serve(fabric, "127.0.0.1:0".parse().unwrap())
        .unwrap();
    let addr = node.addr();
    let client_fabric = cluster.open(NodeId(100)).unwrap();

    let per_thread: Vec<Vec<u64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let f = client_fabric.clone();
                s.spawn(move || {
                    let ctx = ThreadCtx::new(f, RuntimeConfig::default()).unwrap();
                    let info = ctx.connect(addr).unwrap();
                    let tc = Rc::new(TsoClient::from_info(&info).unwrap());
                    assert!(tc.placement().starts_with("host-fallback"));
                    let all = Rc::new(RefCell::new(Vec::new()));
                    let mut ex = Executor::new(ctx.clone());
                    for _ in 0..COROS {
                        let (ctx, tc, all) = (ctx.clone(), tc.clone(), all.clone());
                        ex.spawn(async move {
                            let mut mine = Vec::new();
                            for i in 0..ROUNDS {
                                if i % 4 == 3 {
                                    let r = tc.timestamps(&ctx, BATCH).await.unwrap();
                                    let (first, last) = (r.first(), r.last_ts().unwrap());
                                    assert_eq!(last.get() - first.get() + 1, BATCH, "contiguous");
                                    mine.extend(r.map(Timestamp::get));
                                } else {
                                    mine.push(tc.timestamp(&ctx).await.unwrap().get());
                                }
                            }
                            assert!(
                                mine.windows(2).all(|w| w[0] < w[1]),
                                "each coroutine's timestamps strictly increase"
                            );
                            assert!(mine[0] >= 1);
                            assert!(matches!(
                                tc.timestamps(&ctx, 0).await,
                                Err(TsoError::ZeroCount)
                            ));
                            all.borrow_mut().extend(mine);
                        });
                    }
                    ex.run();
                    let v = all.borrow().clone();
                    v
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let total: usize = per_thread.iter().map(Vec::len).sum();
    let per_coro = (ROUNDS / 4) * (3 + BATCH);
    assert_eq!(total as u64, THREADS as u64 * COROS as u64 * per_coro);
    let unique: HashSet<u64> = per_thread.iter().flatten().copied().collect();
    assert_eq!(unique.len(), total, "all timestamps unique");
    // Nothing lost: exactly 1..=total were handed out.
    assert_eq!(unique.iter().min(), Some(&1));
    assert_eq!(unique.iter().max(), Some(&(total as u64)));
    assert_eq!(oracle.current().get(), total as u64);
    drop(node);
}

#[test]
fn tso_binary_reports_fallback_serves_and_exits_on_sigterm() {
    let cluster = cluster("bin");
    let (mut guard, before, addr) = spawn_service(
        Command::new(env!("CARGO_BIN_EXE_tso"))
            .args(["--cluster", cluster.name(), "--node", "3"])
            .stderr(Stdio::null()),
    );
    let placement = tagged(&before, "PLACEMENT ").expect("tso printed its placement before READY");
    assert!(placement.starts_with("host-fallback: "), "{placement}");

    let ctx = ThreadCtx::new(cluster.open(NodeId(100)).unwrap(), RuntimeConfig::default()).unwrap();
    let info = ctx.connect(addr).unwrap();
    assert_eq!((info.node, info.role.as_str()), (NodeId(3), "tso"));
    let tc = Rc::new(TsoClient::from_info(&info).unwrap());
    let got = Rc::new(RefCell::new(Vec::new()));
    let mut ex = Executor::new(ctx.clone());
    {
        let (ctx, tc, got) = (ctx.clone(), tc.clone(), got.clone());
        ex.spawn(async move {
            let t = tc.timestamp(&ctx).await.unwrap();
            got.borrow_mut().push(t.get());
            let r = tc.timestamps(&ctx, 10).await.unwrap();
            got.borrow_mut().extend(r.map(Timestamp::get));
        });
    }
    ex.run();
    assert_eq!(*got.borrow(), (1..=11).collect::<Vec<u64>>());

    signal(&mut guard, libc::SIGTERM);
    let status = wait(&mut guard, 20);
    assert!(status.success(), "{status:?}");

    // The oracle is gone: the next FAA fails (no hang).
    let res = Rc::new(RefCell::new(None));
    let mut ex = Executor::new(ctx.clone());
    {
        let (ctx, tc, res) = (ctx.clone(), tc.clone(), res.clone());
        ex.spawn(async move {
            // The shm QP notices a dead peer within its 1 ms liveness probe period.
            ctx.sleep(Duration::from_millis(5)).await;
            *res.borrow_mut() = Some(tc.timestamp(&ctx).await);
        });
    }
    ex.run();
    let r = res.borrow_mut().take().unwrap();
    assert!(matches!(r, Err(TsoError::Rpc(_))), "{r:?}");
}

#[test]
fn grouped_timestamps_over_the_fabric_are_unique_and_contiguous() {
    const THREADS: usize = 2;
    const COROS: usize = 8;
    const ROUNDS: usize = 300;
    let cluster = cluster("group");
    let fabric = cluster.open(NodeId(1)).unwrap();
    let oracle = Oracle::new(&fabric).unwrap();
    let node = oracle
        .serve(fabric, "127.0.0.1:0".parse().unwrap())
        .unwrap();
    let addr = node.addr();
    let client_fabric = cluster.open(NodeId(100)).unwrap();
    let probe = ThreadCtx::new(client_fabric.clone(), RuntimeConfig::default()).unwrap();
    let grouped = std::sync::Arc::new(GroupedTso::new(
        TsoClient::from_info(&probe.connect(addr).unwrap()).unwrap(),
    ));
    let all: Vec<u64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..THREADS)
            .map(|_| {
                let (f, g) = (client_fabric.clone(), grouped.clone());
                s.spawn(move || {
                    let ctx = ThreadCtx::new(f, RuntimeConfig::default()).unwrap();
                    ctx.connect(addr).unwrap();
                    let got = Rc::new(RefCell::new(Vec::new()));
                    let mut ex = Executor::new(ctx.clone());
                    for _ in 0..COROS {
                        let (ctx, g, got) = (ctx.clone(), g.clone(), got.clone());
                        ex.spawn(async move {
                            let mut last = Timestamp::ZERO;
                            for _ in 0..ROUNDS {
                                let t = g.timestamp(&ctx).await.unwrap();
                                assert!(t > last, "a coroutine's timestamps increase");
                                last = t;
                                got.borrow_mut().push(t.get());
                            }
                        });
                    }
                    ex.run();
                    let v = got.borrow().clone();
                    v
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let total = (THREADS * COROS * ROUNDS) as u64;
    let mut sorted = all.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (1..=total).collect::<Vec<u64>>(),
        "unique, none lost"
    );
    let st = grouped.stats();
    assert_eq!(st.members, total);
    assert_eq!(
        oracle.current().get(),
        total,
        "one FAA per group, of the group's size"
    );
    drop(node);
}

#[test]
fn an_oracle_in_host_memory_says_so_and_counts_the_same() {
    let cluster = cluster("host");
    let fabric = cluster.open(NodeId(1)).unwrap();
    let oracle = Oracle::in_host_memory(&fabric).unwrap();
    assert!(
        matches!(oracle.placement(), DmPlacement::HostFallback { reason } if reason.contains("asked for")),
        "{:?}",
        oracle.placement()
    );
    let node = oracle
        .serve(fabric, "127.0.0.1:0".parse().unwrap())
        .unwrap();
    let ctx = ThreadCtx::new(cluster.open(NodeId(100)).unwrap(), RuntimeConfig::default()).unwrap();
    let tc = TsoClient::from_info(&ctx.connect(node.addr()).unwrap()).unwrap();
    assert!(
        tc.placement().contains("host memory asked for"),
        "{}",
        tc.placement()
    );
    let c = ctx.clone();
    let got = rrpc::runtime::block_on(&ctx, async move {
        let a = tc.timestamp(&c).await.unwrap().get();
        let r = tc.timestamps(&c, 3).await.unwrap();
        (a, r.first().get(), r.last_ts().unwrap().get())
    });
    assert_eq!(got, (1, 2, 4));
    assert_eq!(oracle.current().get(), 4);
}
