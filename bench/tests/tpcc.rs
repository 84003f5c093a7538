//! TPC-C's five transaction profiles end to end on every protocol: a memory node loaded
//! with one warehouse, the lock service for Scythe, the oracle; two coordinator threads
//! run the standard mix for a second; then the consistency conditions 1 to 4 must hold
//! (`txn::tpcc::check`), the history must pass the protocol's isolation check, and
//! every type must have committed.

mod common;

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bench::tpcc::{run, Generator, Outcome, TxnType};
use rand::SeedableRng;
use rrpc::fabric::{Fabric, FabricConfig, FabricKind};
use rrpc::runtime::{block_on, join_all, Executor, RuntimeConfig, ThreadCtx};
use rrpc::NodeId;
use txn::coordinator::{
    AbortReason, ClusterAddrs, Isolation, Protocol, TxnClient, TxnConfig, TxnError,
};
use txn::history::History;
use txn::tpcc::{
    district_key, get_u32, order_key, order_line_key, DELIVERY_CURSOR, DISTRICT, DISTRICTS,
    DISTRICT_YTD, NEW_ORDER, ORDER, ORDER_LINE, WAREHOUSE, WAREHOUSE_YTD,
};

/// Per type: (committed, rolled back or declined).
type Outcomes = [(u64, u64); 5];

fn coordinator(
    fabric: Fabric,
    addrs: ClusterAddrs,
    protocol: Protocol,
    tid: u64,
    run_for: Duration,
) -> (History, Outcomes) {
    let ctx = ThreadCtx::new(fabric, RuntimeConfig::default()).unwrap();
    let cfg = TxnConfig {
        protocol,
        history_limit_bytes: Some(256 << 20),
        ..TxnConfig::default()
    };
    let client = Rc::new(TxnClient::connect(ctx.clone(), &addrs, cfg).unwrap());
    let gen = Rc::new(Generator::new(1).unwrap());
    let outcomes = Rc::new(RefCell::new([(0u64, 0u64); 5]));
    let until = Instant::now() + run_for;
    let mut ex = Executor::new(ctx);
    for co in 0..4u64 {
        let (client, gen, outcomes) = (client.clone(), gen.clone(), outcomes.clone());
        ex.spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(tid * 100 + co);
            // Every coroutine runs each type once first, so that each type commits
            // however few transactions the run gets through; then the standard mix.
            let mut first = TxnType::ALL.into_iter();
            while Instant::now() < until {
                let args = match first.next() {
                    Some(ty) => gen.next_of(&mut rng, 1, ty),
                    None => gen.next(&mut rng, 1),
                };
                loop {
                    let r = run(client.begin_as(args.ty.index() as u16), &args).await;
                    let slot = |i: usize| {
                        let mut s = outcomes.borrow_mut();
                        let e = &mut s[args.ty.index()];
                        if i == 0 {
                            e.0 += 1
                        } else {
                            e.1 += 1
                        }
                    };
                    match r {
                        Ok(Outcome::Done) => slot(0),
                        Ok(Outcome::RolledBack) | Err(TxnError::Abort(AbortReason::User)) => {
                            slot(1)
                        }
                        Err(TxnError::Abort(r)) => {
                            // A transaction that cannot commit in seconds is a livelock:
                            // fail with its type and reason rather than hang.
                            assert!(
                                Instant::now() < until + Duration::from_secs(5),
                                "{} still aborting ({}) 5 s after the run",
                                args.ty.name(),
                                r.name()
                            );
                            client.ctx().sleep(Duration::from_micros(5)).await;
                            continue;
                        }
                        Err(e) => panic!("{}: {e}", args.ty.name()),
                    }
                    break;
                }
            }
        });
    }
    ex.run();
    let h = client.take_history().unwrap();
    let o = *outcomes.borrow();
    (h, o)
}

/// The rows the consistency check walks, as committed now.
fn snapshot(fabric: Fabric, addrs: &ClusterAddrs) -> HashMap<(u32, u64), Vec<u8>> {
    let ctx = ThreadCtx::new(fabric, RuntimeConfig::default()).unwrap();
    let client = Rc::new(TxnClient::connect(ctx.clone(), addrs, TxnConfig::default()).unwrap());
    block_on(&ctx, async move {
        let mut rows = HashMap::new();
        let get = |keys: Vec<(u32, u64)>| {
            let client = client.clone();
            async move {
                let mut out = Vec::new();
                for chunk in keys.chunks(512) {
                    let got =
                        join_all(chunk.iter().map(|&(t, k)| client.read_committed(t, k))).await;
                    for (&(t, k), r) in chunk.iter().zip(got) {
                        if let Some((_, v)) = r.unwrap() {
                            out.push(((t, k), v));
                        }
                    }
                }
                out
            }
        };
        let mut head = vec![(WAREHOUSE, 1), (WAREHOUSE_YTD, 1)];
        for d in 1..=DISTRICTS {
            let k = district_key(1, d);
            head.extend([(DISTRICT, k), (DISTRICT_YTD, k), (DELIVERY_CURSOR, k)]);
        }
        rows.extend(get(head).await);
        let mut keys = Vec::new();
        for d in 1..=DISTRICTS {
            let next = get_u32(&rows[&(DISTRICT, district_key(1, d))], 12);
            for o in 1..=next {
                keys.push((ORDER, order_key(1, d, o)));
                keys.push((NEW_ORDER, order_key(1, d, o)));
                keys.extend((1..=15).map(|ol| (ORDER_LINE, order_line_key(1, d, o, ol))));
            }
        }
        rows.extend(get(keys).await);
        rows
    })
}

fn tpcc_on(protocol: Protocol) {
    let _one = common::serial();
    let name = format!("tpcc-{}", protocol.name());
    let (cluster, addrs, _tso) = common::start_cluster(
        &name,
        protocol,
        &[
            "--tpcc-warehouses".into(),
            "1".into(),
            "--versions".into(),
            "2".into(),
        ],
        1 << 22,
    );
    let addrs2 = addrs.clone();
    let (history, outcomes) = common::run_coordinators(&cluster, 2, move |f, tid| {
        coordinator(f, addrs2.clone(), protocol, tid, Duration::from_secs(1))
    });
    let kind = FabricKind::from_env().unwrap();
    let fabric =
        |n: u32| Fabric::open(&FabricConfig::new(kind, cluster.name(), NodeId(n))).unwrap();
    let t0 = Instant::now();
    let rows = snapshot(fabric(150), &addrs);
    eprintln!("{protocol}: read {} rows in {:?}", rows.len(), t0.elapsed());
    drop(cluster);

    let c = txn::tpcc::check(1, |t, k| rows.get(&(t, k)).cloned());
    eprintln!("{protocol}: {}", c.line());
    assert!(c.holds(), "{protocol}: {}", c.line());
    common::assert_isolation(protocol, &history);
    for t in TxnType::ALL {
        let (done, other) = outcomes[t.index()];
        eprintln!(
            "{protocol}: {} committed {done}, rolled back {other}",
            t.name()
        );
        assert!(done > 0, "{protocol}: {} never committed", t.name());
    }
}

#[test]
fn tpcc_on_occ_cas() {
    tpcc_on(Protocol::OccCas);
}

#[test]
fn tpcc_on_scythe() {
    tpcc_on(Protocol::Scythe);
}

#[test]
fn tpcc_on_mvcc() {
    tpcc_on(Protocol::Mvcc(Isolation::Serializable));
}

#[test]
fn tpcc_on_mvcc_si() {
    tpcc_on(Protocol::Mvcc(Isolation::Snapshot));
}
