//! TSO proxies in-process over the shm fabric (Scythe 4.5 (3)): range requests merged into
//! one FAA, the QP limit on the oracle, refused requests, compute-node TSO groups whose
//! range request is a proxy RPC, and failover when a proxy stops answering.

use rrpc::NodeId;
use std::cell::RefCell;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rrpc::fabric::shm::ClusterGuard;
use rrpc::node::Node;
use rrpc::runtime::{block_on, CallError, Executor, RpcError, RuntimeConfig, ThreadCtx};
use tso::proxy::{ProxyClient, RANGE_HANDLER};
use tso::{
    Choice, GroupedTso, Oracle, Proxy, ProxyConfig, SourceConfig, Timestamp, TsoError, TsoSources,
};

/// This test's cluster, removed when the test ends, however it ends.
fn cluster(name: &str) -> ClusterGuard {
    let c = format!("tso-test-{}-px-{name}", std::process::id());
    ClusterGuard::new(&c).unwrap().0
}

/// An oracle (node 1) serving one-sided FAA only.
fn oracle(c: &ClusterGuard) -> (Oracle, Node) {
    let fabric = c.open(NodeId(1)).unwrap();
    let oracle = Oracle::new(&fabric).unwrap();
    let node = oracle
        .serve(fabric, "127.0.0.1:0".parse().unwrap())
        .unwrap();
    (oracle, node)
}

fn proxy(c: &ClusterGuard, node: u32, oracle: SocketAddr, threads: usize, qps: usize) -> Proxy {
    let cfg = ProxyConfig::default()
        .with_threads(threads)
        .with_oracle_qps(qps);
    Proxy::start(
        c.open(NodeId(node)).unwrap(),
        "127.0.0.1:0".parse().unwrap(),
        oracle,
        &cfg,
    )
    .unwrap()
}

/// `threads` client threads (nodes 100..) of `coros` coroutines each take timestamps
/// through one `GroupedTso` over `sources` until each has `rounds`; the first coroutine
/// of each thread calls `between(r)` after its `r`-th. Returns each coroutine's
/// timestamps in order.
fn grouped_clients(
    c: &ClusterGuard,
    sources: Arc<TsoSources>,
    threads: u32,
    coros: usize,
    rounds: usize,
    between: Arc<dyn Fn(usize) + Send + Sync>,
) -> Vec<Vec<Timestamp>> {
    let grouped = Arc::new(GroupedTso::with_sources(sources.clone()));
    let deadline = Instant::now() + Duration::from_secs(120);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (sources, grouped, between) =
                    (sources.clone(), grouped.clone(), between.clone());
                let fabric = c.open(NodeId(100 + t)).unwrap();
                s.spawn(move || {
                    let ctx = ThreadCtx::new(fabric, RuntimeConfig::default()).unwrap();
                    sources.connect_thread(&ctx).unwrap();
                    let out = Rc::new(RefCell::new(vec![Vec::new(); coros]));
                    let mut ex = Executor::new(ctx.clone());
                    for k in 0..coros {
                        let (ctx, g, out, between) =
                            (ctx.clone(), grouped.clone(), out.clone(), between.clone());
                        ex.spawn(async move {
                            for r in 0..rounds {
                                assert!(Instant::now() < deadline, "client deadline");
                                let t = g.timestamp(&ctx).await.unwrap();
                                out.borrow_mut()[k].push(t);
                                if k == 0 {
                                    between(r);
                                }
                            }
                        });
                    }
                    ex.run();
                    let v = out.borrow().clone();
                    v
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    })
}

fn assert_unique_and_increasing(per_coro: &[Vec<Timestamp>]) -> usize {
    for v in per_coro {
        assert!(v.windows(2).all(|w| w[0] < w[1]), "per client increasing");
    }
    let all: HashSet<Timestamp> = per_coro.iter().flatten().copied().collect();
    let n: usize = per_coro.iter().map(Vec::len).sum();
    assert_eq!(all.len(), n, "unique");
    n
}

#[test]
fn proxies_merge_group_ranges_into_few_faas_on_few_qps() {
    let c = cluster("merge");
    let (oracle, onode) = oracle(&c);
    // Four server threads, at most one QP on the oracle; and a second proxy with two.
    let p1 = proxy(&c, 10, onode.addr(), 4, 1);
    let p2 = proxy(&c, 11, onode.addr(), 4, 2);
    let cfg = SourceConfig::default(); // random among the proxies
    let sources = Arc::new(TsoSources::discover(None, &[p1.addr(), p2.addr()], &cfg).unwrap());
    assert_eq!(sources.sources().count(), 2);
    let per_coro = grouped_clients(&c, sources.clone(), 3, 8, 150, Arc::new(|_| {}));
    let n = assert_unique_and_increasing(&per_coro);
    assert_eq!(n, 3 * 8 * 150);
    let (s1, s2) = (p1.stats(), p2.stats());
    // Every timestamp came through a proxy and was taken by one of its FAAs.
    assert_eq!(s1.group.members + s2.group.members, n as u64);
    assert!(oracle.current().get() >= n as u64);
    assert_eq!(s1.regressions + s2.regressions, 0);
    // The QP limit holds (the pools open QPs on first use).
    assert_eq!(s1.oracle_qps, 1, "{s1:?}");
    assert!((1..=2).contains(&s2.oracle_qps), "{s2:?}");
    assert!(s1.highest.get() >= 1 && s1.highest <= oracle.current());
    assert_eq!(sources.failovers(), 0);
}

#[test]
fn proxy_range_requests_are_served_whole_and_bad_ones_refused() {
    let c = cluster("range");
    let (_oracle, onode) = oracle(&c);
    let cfg = ProxyConfig::default().with_max_range(100);
    let p = Proxy::start(
        c.open(NodeId(10)).unwrap(),
        "127.0.0.1:0".parse().unwrap(),
        onode.addr(),
        &cfg,
    )
    .unwrap();
    let ctx = ThreadCtx::new(c.open(NodeId(100)).unwrap(), RuntimeConfig::default()).unwrap();
    let info = ctx.connect_rpc(p.addr()).unwrap();
    assert_eq!(info.role, "tso-proxy");
    let pc = ProxyClient::from_info(&info, Duration::from_secs(10)).unwrap();
    assert_eq!(pc.export().max_range, 100);
    let c2 = ctx.clone();
    block_on(&ctx, async move {
        let a = pc.timestamps(&c2, 10).await.unwrap();
        assert_eq!((a.first().get(), a.len()), (1, 10));
        let b = pc.timestamps(&c2, 1).await.unwrap();
        assert_eq!(b.first().get(), 11);
        assert!(matches!(
            pc.timestamps(&c2, 0).await,
            Err(TsoError::ZeroCount)
        ));
        match pc.timestamps(&c2, 101).await {
            Err(TsoError::Rpc(RpcError::Call(CallError::Remote { msg, .. }))) => {
                assert!(msg.contains("1 ..= 100"), "{msg}")
            }
            r => panic!("{r:?}"),
        }
        // Malformed request bytes are refused, not a panic.
        let e = c2.call(pc.node(), RANGE_HANDLER, &[1, 2, 3]).await;
        assert!(matches!(e, Err(CallError::Remote { .. })), "{e:?}");
        // Still serving, and nothing was taken for the refused requests.
        let d = pc.timestamps(&c2, 2).await.unwrap();
        assert_eq!(d.first().get(), 12);
    });
    assert_eq!(p.stats().group.members, 13);
}

#[test]
fn clients_fail_over_when_a_proxy_stops_answering() {
    let c = cluster("failover");
    let (_oracle, onode) = oracle(&c);
    let p1 = proxy(&c, 10, onode.addr(), 1, 1);
    let p2 = proxy(&c, 11, onode.addr(), 1, 1);
    let cfg = SourceConfig::default()
        .with_choice(Choice::Random)
        .with_call_timeout_ms(200)
        .with_retry_after_ms(60_000);
    let sources =
        Arc::new(TsoSources::discover(Some(onode.addr()), &[p1.addr(), p2.addr()], &cfg).unwrap());
    let doomed = Arc::new(std::sync::Mutex::new(Some(p1)));
    let d = doomed.clone();
    // The first coroutine of the first thread stops proxy 1 after its 50th timestamp.
    let per_coro = grouped_clients(
        &c,
        sources.clone(),
        2,
        4,
        300,
        Arc::new(move |r| {
            if r == 50 {
                drop(d.lock().unwrap().take());
            }
        }),
    );
    let n = assert_unique_and_increasing(&per_coro);
    assert_eq!(n, 2 * 4 * 300);
    assert!(doomed.lock().unwrap().is_none());
    assert!(sources.failovers() >= 1, "nobody failed over");
    assert!(p2.stats().group.members > 0);
}

#[test]
fn choice_oracle_bypasses_proxies_and_no_live_source_is_an_error_not_a_hang() {
    let c = cluster("choice");
    let (oracle, onode) = oracle(&c);
    let p = proxy(&c, 10, onode.addr(), 1, 1);
    let cfg = SourceConfig::default()
        .with_choice(Choice::Oracle)
        .with_call_timeout_ms(200)
        .with_retry_after_ms(1000);
    let sources = Arc::new(TsoSources::discover(Some(onode.addr()), &[p.addr()], &cfg).unwrap());
    let per_coro = grouped_clients(&c, sources.clone(), 1, 4, 100, Arc::new(|_| {}));
    assert_eq!(assert_unique_and_increasing(&per_coro), 400);
    assert_eq!(
        p.stats().group.members,
        0,
        "the oracle answered every range"
    );
    assert!(oracle.current().get() >= 400);

    // Only a proxy, which stops: requests fail with the source's error after the call
    // deadline, never hang.
    let only = Rc::new(
        TsoSources::discover(
            None,
            &[p.addr()],
            &SourceConfig::default()
                .with_call_timeout_ms(200)
                .with_retry_after_ms(0),
        )
        .unwrap(),
    );
    let ctx = ThreadCtx::new(c.open(NodeId(110)).unwrap(), RuntimeConfig::default()).unwrap();
    only.connect_thread(&ctx).unwrap();
    let (c2, o2) = (ctx.clone(), only.clone());
    let ok = block_on(
        &ctx,
        async move { o2.timestamps(&c2, 3).await.map(|r| r.len()) },
    );
    assert_eq!(ok.unwrap(), 3);
    drop(p);
    let (c2, o2) = (ctx.clone(), only.clone());
    match block_on(&ctx, async move { o2.timestamps(&c2, 1).await }) {
        Err(TsoError::NoSource { tried: 1, last }) => {
            assert!(matches!(*last, TsoError::Rpc(_)), "{last}")
        }
        r => panic!("{r:?}"),
    }
}
