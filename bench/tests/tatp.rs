//! TATP's seven transaction profiles end to end on every protocol: a memory node loaded
//! with the TATP population, the lock service for Scythe, the oracle; two coordinator
//! threads run the standard mix for a second; then the four tables must pass the
//! consistency check (`txn::tatp::check`), the history the protocol's isolation check,
//! and the outcomes must follow the specification's success rates.

mod common;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bench::tatp::{run, Generator, Outcome, TxnType};
use rand::SeedableRng;
use rrpc::fabric::{Fabric, FabricConfig, FabricKind};
use rrpc::runtime::{block_on, join_all, Executor, RuntimeConfig, ThreadCtx};
use rrpc::NodeId;
use txn::coordinator::{
    AbortReason, ClusterAddrs, Isolation, Protocol, TxnClient, TxnConfig, TxnError,
};
use txn::history::History;
use txn::tatp::{
    ai_key, cf_key, sf_key, ACCESS_INFO, CALL_FORWARDING, SPECIAL_FACILITY, SUBSCRIBER,
};

const SUBSCRIBERS: u64 = 2000;

/// Per type: (done, not found).
type Outcomes = [(u64, u64); 7];

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
        history_limit_bytes: Some(64 << 20),
        ..TxnConfig::default()
    };
    let client = Rc::new(TxnClient::connect(ctx.clone(), &addrs, cfg).unwrap());
    let gen = Rc::new(Generator::new(SUBSCRIBERS).unwrap());
    let outcomes = Rc::new(RefCell::new([(0u64, 0u64); 7]));
    let until = Instant::now() + run_for;
    let mut ex = Executor::new(ctx);
    for co in 0..8u64 {
        let (client, gen, outcomes) = (client.clone(), gen.clone(), outcomes.clone());
        ex.spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(tid * 100 + co);
            while Instant::now() < until {
                let args = gen.next(&mut rng);
                loop {
                    match run(client.begin_as(args.ty.index() as u16), args).await {
                        Ok(o) => {
                            let mut s = outcomes.borrow_mut();
                            let e = &mut s[args.ty.index()];
                            match o {
                                Outcome::Done => e.0 += 1,
                                Outcome::NotFound => e.1 += 1,
                            }
                            break;
                        }
                        Err(TxnError::Abort(r)) => {
                            assert_ne!(r, AbortReason::User, "rollbacks are outcomes");
                            client.ctx().sleep(Duration::from_micros(5)).await;
                        }
                        Err(e) => panic!("{}: {e}", args.ty.name()),
                    }
                }
            }
        });
    }
    ex.run();
    let h = client.take_history().unwrap();
    let o = *outcomes.borrow();
    (h, o)
}

/// Every row of the four tables as committed now, through a fresh client.
fn snapshot(
    fabric: Fabric,
    addrs: &ClusterAddrs,
) -> std::collections::HashMap<(u32, u64), Vec<u8>> {
    let ctx = ThreadCtx::new(fabric, RuntimeConfig::default()).unwrap();
    let client = Rc::new(TxnClient::connect(ctx.clone(), addrs, TxnConfig::default()).unwrap());
    block_on(&ctx, async move {
        let mut keys = Vec::new();
        for s in 1..=SUBSCRIBERS {
            keys.push((SUBSCRIBER, s));
            for ty in 1..=4u8 {
                keys.push((ACCESS_INFO, ai_key(s, ty)));
                keys.push((SPECIAL_FACILITY, sf_key(s, ty)));
                for st in txn::tatp::START_TIMES {
                    keys.push((CALL_FORWARDING, cf_key(s, ty, st)));
                }
            }
        }
        let mut rows = std::collections::HashMap::new();
        for chunk in keys.chunks(256) {
            let got = join_all(chunk.iter().map(|&(t, k)| client.read_committed(t, k))).await;
            for (&(t, k), r) in chunk.iter().zip(got) {
                if let Some((_, v)) = r.unwrap() {
                    rows.insert((t, k), v);
                }
            }
        }
        rows
    })
}

fn tatp_on(protocol: Protocol) {
    let _one = common::serial();
    let name = format!("tatp-{}", protocol.name());
    let (cluster, addrs, _tso) = common::start_cluster(
        &name,
        protocol,
        &["--tatp-subscribers".into(), SUBSCRIBERS.to_string()],
        16 * SUBSCRIBERS,
    );
    let addrs2 = addrs.clone();
    let (history, outcomes) = common::run_coordinators(&cluster, 2, move |f, tid| {
        coordinator(f, addrs2.clone(), protocol, tid, Duration::from_secs(1))
    });
    let kind = FabricKind::from_env().unwrap();
    let audit = Fabric::open(&FabricConfig::new(kind, cluster.name(), NodeId(150))).unwrap();
    let rows = snapshot(audit, &addrs);
    drop(cluster);

    let c = txn::tatp::check(SUBSCRIBERS, 1, |t, k| rows.get(&(t, k)).cloned());
    eprintln!("{protocol}: {}", c.line());
    assert!(c.holds(), "{protocol}: {}", c.line());
    common::assert_isolation(protocol, &history);
    for t in TxnType::ALL {
        let (done, missed) = outcomes[t.index()];
        eprintln!("{protocol}: {} done {done}, not found {missed}", t.name());
        assert!(done > 0, "{protocol}: {} never succeeded", t.name());
    }
    // The specification's 62.5% for GetAccessData (1 to 4 of 4 types present).
    let (d, m) = outcomes[TxnType::GetAccessData.index()];
    let rate = d as f64 / (d + m) as f64;
    assert!(
        (rate - 0.625).abs() < 0.06,
        "{protocol}: GetAccessData succeeded {rate}"
    );
    // Read-only types and UpdateLocation never fail their lookup.
    assert_eq!(outcomes[TxnType::GetSubscriberData.index()].1, 0);
    assert_eq!(outcomes[TxnType::UpdateLocation.index()].1, 0);
}

#[test]
fn tatp_on_occ_cas() {
    tatp_on(Protocol::OccCas);
}

#[test]
fn tatp_on_scythe() {
    tatp_on(Protocol::Scythe);
}

#[test]
fn tatp_on_mvcc() {
    tatp_on(Protocol::Mvcc(Isolation::Serializable));
}

#[test]
fn tatp_on_mvcc_si() {
    tatp_on(Protocol::Mvcc(Isolation::Snapshot));
}
