//! A write-skew workload for the serializability tests, run end to end: memnode, lockd
//! and tso as processes on the shm fabric, the real OCC coordinator, the real checker.
//!
//! Each transaction reads both balances of one account (SmallBank's savings and
//! checking) and adds one to one of them, chosen at random: two such transactions on one
//! account that write different balances form the textbook write skew when the balance
//! a transaction only read is not validated.

use rrpc::NodeId;
use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bench::launcher::{default_bin_dir, LocalCluster};
use rand::{Rng, SeedableRng};
use rrpc::fabric::{Fabric, FabricConfig, FabricKind};
use rrpc::runtime::{Executor, RuntimeConfig, ThreadCtx};
use txn::history::History;
use txn::occ::{OccConfig, ServiceAddrs, TxnClient, TxnError};
use txn::serializability::{check, Verdict};
use txn::smallbank::{CHECKING, SAVINGS};

/// Run the workload on `accounts` accounts with `threads` x `coroutines` coordinators
/// for `run_for`, and check the committed history. Returns the verdict and the commits.
pub fn write_skew(
    name: &str,
    accounts: u64,
    threads: usize,
    coroutines: usize,
    run_for: Duration,
) -> (Verdict, u64) {
    let cluster_name = format!("{name}-{}", std::process::id());
    let mut cluster = LocalCluster::new(&cluster_name, default_bin_dir()).unwrap();
    let t = Duration::from_secs(60);
    let memnode = cluster
        .start(
            "memnode",
            1,
            &["--smallbank-accounts".into(), accounts.to_string()],
            t,
        )
        .unwrap();
    let lockd = cluster
        .start(
            "lockd",
            2,
            &["--locks".into(), (2 * accounts).to_string()],
            t,
        )
        .unwrap();
    let tso = cluster.start("tso", 3, &[], t).unwrap();
    let addrs = ServiceAddrs {
        memnode,
        lockd,
        tso,
    };
    let kind = FabricKind::from_env().unwrap();
    let handles: Vec<_> = (0..threads)
        .map(|tid| {
            let fabric = Fabric::open(&FabricConfig::new(
                kind,
                &cluster_name,
                NodeId(100 + tid as u32),
            ))
            .unwrap();
            std::thread::spawn(move || {
                coordinator(fabric, addrs, accounts, coroutines, run_for, tid)
            })
        })
        .collect();
    let mut history = History::new(usize::MAX);
    let mut commits = 0;
    for h in handles {
        let (hist, c) = h.join().expect("coordinator thread");
        history.append(hist);
        commits += c;
    }
    cluster.shutdown();
    (check(&history), commits)
}

fn coordinator(
    fabric: Fabric,
    addrs: ServiceAddrs,
    accounts: u64,
    coroutines: usize,
    run_for: Duration,
    tid: usize,
) -> (History, u64) {
    let ctx = ThreadCtx::new(fabric, RuntimeConfig::default()).unwrap();
    let cfg = OccConfig {
        history_limit_bytes: Some(64 << 20),
        ..OccConfig::default()
    };
    let client = Rc::new(TxnClient::connect(ctx.clone(), addrs, cfg).unwrap());
    let commits = Rc::new(RefCell::new(0u64));
    let until = Instant::now() + run_for;
    let mut ex = Executor::new(ctx);
    for co in 0..coroutines {
        let (client, commits) = (client.clone(), commits.clone());
        ex.spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64((tid * 1000 + co) as u64);
            while Instant::now() < until {
                let a = rng.random_range(0..accounts);
                let side = if rng.random_bool(0.5) {
                    SAVINGS
                } else {
                    CHECKING
                };
                let mut t = client.begin_as(side as u16);
                let r: Result<(), TxnError> = async {
                    let v = t.read_many(&[(SAVINGS, a), (CHECKING, a)]).await?;
                    let old = i64::from_le_bytes(v[side as usize].as_slice().try_into().unwrap());
                    t.write(side, a, (old + 1).to_le_bytes().to_vec())?;
                    t.commit().await
                }
                .await;
                match r {
                    Ok(()) => *commits.borrow_mut() += 1,
                    Err(TxnError::Abort(_)) => client.ctx().yield_now().await,
                    Err(e) => panic!("service failure: {e}"),
                }
            }
        });
    }
    ex.run();
    let h = client.take_history().unwrap();
    let c = *commits.borrow();
    (h, c)
}
