//! A write-skew workload for the isolation tests, run end to end: memory node, timestamp
//! oracle and (for Scythe) lock service as processes on the shm fabric, the real
//! coordinator of the protocol under test, the real checkers.
//!
//! Each transaction reads both balances of one account (SmallBank's savings and
//! checking), the one it writes for update and the other plainly, and adds one to the one
//! it writes, chosen at random: two such transactions on one account that write
//! different balances form the textbook write skew when the balance a transaction only
//! read is not validated (or, under snapshot isolation, by design).

#![allow(dead_code)] // each test binary uses its part

pub mod ssh;

use rrpc::NodeId;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bench::launcher::{default_bin_dir, LocalCluster};
use rand::{Rng, SeedableRng};
use rrpc::fabric::{Fabric, FabricConfig, FabricKind};
use rrpc::runtime::{Executor, RuntimeConfig, ThreadCtx};
use txn::coordinator::{ClusterAddrs, Protocol, TxnClient, TxnConfig, TxnError};
use txn::history::History;
use txn::smallbank::{CHECKING, SAVINGS};

/// One test at a time per test binary: each runs a cluster and spinning coordinators,
/// and the machine may have two cores.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a run of the workload committed.
pub struct Run {
    /// Every committed transaction (kind: the table written), with start and commit
    /// timestamps for MVCC.
    pub history: History,
    /// Commits counted by the coordinators.
    pub commits: u64,
}

/// The fault tests' body: with the validation of read-only objects switched off (the
/// fault switch of test builds, process-wide: call this from a test binary of its own),
/// the write-skew workload under `protocol` (4 accounts, 2 x 16 coordinators, 2 s) must
/// commit a history in which the serializability check reports a cycle.
pub fn assert_cycle_without_read_only_validation(name: &str, protocol: Protocol) {
    txn::fault::skip_read_only_validation(true);
    let run = write_skew(name, protocol, 4, 2, 16, Duration::from_secs(2));
    let v = txn::serializability::check(&run.history);
    eprintln!("{v} ({} commits)", run.commits);
    assert!(
        !v.is_serializable(),
        "no cycle in {} commits: {v}",
        run.commits
    );
    assert!(v.to_string().contains("CYCLE of "), "{v}");
}

/// Run the workload with `protocol` on `accounts` accounts with `threads` x
/// `coroutines` coordinators for `run_for`, recording the committed history.
pub fn write_skew(
    name: &str,
    protocol: Protocol,
    accounts: u64,
    threads: usize,
    coroutines: usize,
    run_for: Duration,
) -> Run {
    let (cluster, addrs, _tso_state) = start_cluster(
        name,
        protocol,
        &["--smallbank-accounts".into(), accounts.to_string()],
        2 * accounts,
    );
    let cluster_name = cluster.name().to_string();
    let kind = FabricKind::from_env().unwrap();
    // Lotus: the process is one compute node whose lock table every thread shares.
    let lotus = protocol
        .needs_lock_tables()
        .then(|| txn::lotus::LotusSite::single(100, 1 << 20));
    let handles: Vec<_> = (0..threads)
        .map(|tid| {
            let fabric = Fabric::open(&FabricConfig::new(
                kind,
                &cluster_name,
                NodeId(100 + tid as u32),
            ))
            .unwrap();
            let addrs = addrs.clone();
            // Each thread is its own node in the table (its fabric's node and
            // incarnation), as one compute node's threads share one fabric.
            let lotus = lotus.clone().map(|l| txn::lotus::LotusSite {
                node: 100 + tid as u32,
                ..l
            });
            std::thread::spawn(move || {
                coordinator(
                    fabric, addrs, protocol, lotus, accounts, coroutines, run_for, tid,
                )
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
    drop(cluster);
    Run { history, commits }
}

/// A local cluster for `protocol`: a memory node (node 10) loaded as `memnode_args`
/// say, a lock service with `locks` locks when the protocol needs one, and a timestamp
/// oracle with a state directory (kept alive by the returned guard). With a state
/// directory the oracle runs in epoch 1 or later.
pub fn start_cluster(
    name: &str,
    protocol: Protocol,
    memnode_args: &[String],
    locks: u64,
) -> (LocalCluster, ClusterAddrs, tempfile::TempDir) {
    let cluster_name = format!("{name}-{}", std::process::id());
    let mut cluster = LocalCluster::new(&cluster_name, default_bin_dir()).unwrap();
    let t = Duration::from_secs(60);
    let memnode = cluster.start("memnode", 10, memnode_args, t).unwrap();
    let lockd = protocol.needs_lockd().then(|| {
        cluster
            .start("lockd", 2, &["--locks".into(), locks.to_string()], t)
            .unwrap()
    });
    let tso_state = tempfile::tempdir().unwrap();
    let tso = cluster
        .start(
            "tso",
            3,
            &["--state-dir".into(), tso_state.path().display().to_string()],
            t,
        )
        .unwrap();
    let addrs = ClusterAddrs {
        memnodes: vec![memnode],
        lockd,
        tso,
    };
    (cluster, addrs, tso_state)
}

#[allow(clippy::too_many_arguments)]
fn coordinator(
    fabric: Fabric,
    addrs: ClusterAddrs,
    protocol: Protocol,
    lotus: Option<txn::lotus::LotusSite>,
    accounts: u64,
    coroutines: usize,
    run_for: Duration,
    tid: usize,
) -> (History, u64) {
    let ctx = ThreadCtx::new(fabric, RuntimeConfig::default()).unwrap();
    let cfg = TxnConfig::default()
        .with_protocol(protocol)
        .with_history_limit_bytes(Some(64 << 20))
        .with_lotus(lotus);
    let client = Rc::new(TxnClient::connect(ctx.clone(), &addrs, cfg).unwrap());
    let commits = Rc::new(RefCell::new(0u64));
    let until = Instant::now() + run_for;
    let mut ex = Executor::new(ctx);
    for co in 0..coroutines {
        let (client, commits) = (client.clone(), commits.clone());
        ex.spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64((tid * 1000 + co) as u64);
            // Randomized exponential backoff after an abort (as txn-bench's driver):
            // no-wait locking (Lotus's read and write locks taken in one round) can
            // otherwise livelock two transactions that retry in step.
            let mut backoff_us = 1u64;
            while Instant::now() < until {
                let a = rng.random_range(0..accounts);
                let side = if rng.random_bool(0.5) {
                    SAVINGS
                } else {
                    CHECKING
                };
                let mut t = client.begin_as(side as u16);
                let r: Result<(), TxnError> = async {
                    let v = t
                        .read_mixed(&[
                            (SAVINGS, a, side == SAVINGS),
                            (CHECKING, a, side == CHECKING),
                        ])
                        .await?;
                    let old = i64::from_le_bytes(v[side as usize].as_slice().try_into().unwrap());
                    t.write(side, a, (old + 1).to_le_bytes().to_vec())?;
                    t.commit().await
                }
                .await;
                match r {
                    Ok(()) => {
                        *commits.borrow_mut() += 1;
                        backoff_us = 1;
                    }
                    Err(TxnError::Abort(_)) => {
                        let d = rng.random_range(0..=backoff_us);
                        backoff_us = (backoff_us * 2).min(64);
                        client.ctx().sleep(Duration::from_micros(d)).await;
                    }
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

/// Run `coordinator(fabric, tid)` on `threads` threads, each with a fabric of its own
/// (nodes 100 and up) of `cluster`, and gather their histories and per-type outcome
/// counts `(first, second)` (summed per type).
pub fn run_coordinators<const N: usize>(
    cluster: &LocalCluster,
    threads: u64,
    coordinator: impl Fn(Fabric, u64) -> (History, [(u64, u64); N]) + Send + Clone + 'static,
) -> (History, [(u64, u64); N]) {
    let kind = FabricKind::from_env().unwrap();
    let handles: Vec<_> = (0..threads)
        .map(|tid| {
            let f = Fabric::open(&FabricConfig::new(
                kind,
                cluster.name(),
                NodeId(100 + tid as u32),
            ))
            .unwrap();
            let coordinator = coordinator.clone();
            std::thread::spawn(move || coordinator(f, tid))
        })
        .collect();
    let mut history = History::new(usize::MAX);
    let mut outcomes = [(0u64, 0u64); N];
    for h in handles {
        let (hist, o) = h.join().expect("coordinator thread");
        history.append(hist);
        for (a, b) in outcomes.iter_mut().zip(o) {
            a.0 += b.0;
            a.1 += b.1;
        }
    }
    (history, outcomes)
}

/// The isolation check of `protocol` on `history`: snapshot isolation for `mvcc-si`,
/// serializability (an acyclic graph) for the others.
pub fn assert_isolation(protocol: Protocol, history: &History) {
    match protocol {
        Protocol::Mvcc(txn::coordinator::Isolation::Snapshot) => {
            let v = txn::snapshot_isolation::check(history);
            assert!(v.holds(), "{protocol}: {v}");
        }
        _ => {
            let v = txn::serializability::check(history);
            assert!(v.is_serializable(), "{protocol}: {v}");
        }
    }
}

/// `--model <name>` on the shm fabric; nothing on verbs (`RRPC_FABRIC=verbs`, the
/// Soft-RoCE VM), whose NIC is real and refuses a model.
pub fn model(name: &'static str) -> Vec<&'static str> {
    if std::env::var("RRPC_FABRIC").is_ok_and(|f| f == "verbs") {
        Vec::new()
    } else {
        vec!["--model", name]
    }
}

/// The timing model the `txn-bench` runs of the tests take: `$RRPC_MODEL` if set, else
/// none (the binaries' default on shm is cx5; these tests check behaviour, not timing).
pub fn model_env() -> String {
    std::env::var("RRPC_MODEL").unwrap_or_else(|_| "none".into())
}

/// Check the latency fields of a point record: the percentiles, and `hdr` decoding to a
/// histogram of `count` values whose percentiles are the record's.
pub fn check_latency_fields(name: &str, p: &serde_json::Value) {
    for k in ["p50_ns", "p90_ns", "p99_ns", "p999_ns", "max_ns", "count"] {
        assert!(p[k].is_u64(), "{name}: {k}: {p}");
    }
    let h = bench::jsonl::decode_hdr(p["hdr"].as_str().expect("an hdr field"))
        .unwrap_or_else(|e| panic!("{name}: {e:#}: {p}"));
    assert_eq!(h.len(), p["count"].as_u64().unwrap(), "{name}: {p}");
    assert_eq!(h.max(), p["max_ns"].as_u64().unwrap(), "{name}: {p}");
    assert_eq!(
        h.value_at_quantile(0.99),
        p["p99_ns"].as_u64().unwrap(),
        "{name}: {p}"
    );
}

/// The records of a `--json` file (JSON Lines): every line parses, the first is the
/// metadata record of `binary`. Panics otherwise.
pub fn json_lines(text: &str, binary: &str) -> Vec<serde_json::Value> {
    let recs: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let meta = recs.first().expect("a metadata record");
    assert_eq!(meta["record"], "meta", "{meta}");
    assert_eq!(meta["binary"], binary, "{meta}");
    recs
}

/// The summary record of a `--json` file of `txn-bench` (JSON Lines), or `Null` when
/// the file is missing or has none.
pub fn txn_bench_summary(path: &std::path::Path) -> serde_json::Value {
    let Ok(text) = std::fs::read_to_string(path) else {
        return serde_json::Value::Null;
    };
    json_lines(&text, "txn-bench")
        .into_iter()
        .rfind(|r| r["record"] == "summary")
        .unwrap_or(serde_json::Value::Null)
}

/// Run the real `txn-bench` with `args` and `--json` to a temporary file, one at a time
/// per test binary ([`serial`]); it must succeed. Returns its stdout and JSON summary.
pub fn txn_bench(name: &str, args: &[&str]) -> (String, serde_json::Value) {
    let _one = serial();
    let json = std::env::temp_dir().join(format!("txn-bench-{name}-{}.json", std::process::id()));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_txn-bench"))
        .env("RRPC_MODEL", model_env())
        .args(args)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run txn-bench");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "txn-bench failed: {}\n{stdout}\n{stderr}",
        out.status
    );
    let summary = txn_bench_summary(&json);
    assert!(
        summary.is_object(),
        "no summary record in {}",
        json.display()
    );
    let _ = std::fs::remove_file(&json);
    (stdout, summary)
}

/// The commits a `txn-bench` run reported (its JSON report `r`), summed over its types.
pub fn committed(r: &serde_json::Value) -> u64 {
    r["types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["committed"].as_u64().unwrap())
        .sum()
}

/// Commits a `txn-bench` run (its JSON report `r`, run with `--timeline-ms`) made in the
/// timeline's intervals from `from_ms` on: a protocol stalled after a fault commits none.
pub fn committed_from_ms(r: &serde_json::Value, from_ms: u64) -> u64 {
    let t = &r["timeline"];
    let ms = t["interval_ms"].as_u64().expect("a run with --timeline-ms");
    t["total"]
        .as_array()
        .expect("the timeline's totals")
        .iter()
        .skip((from_ms / ms) as usize)
        .map(|x| x.as_u64().unwrap())
        .sum()
}

/// The checks every `txn-bench` run must pass, as its JSON report (`r`) has them: the
/// transaction kinds in order, each committed, the workload's invariant, no lock left,
/// no service failure, and the isolation check the protocol is judged by.
pub fn assert_checked_run(r: &serde_json::Value, kinds: &[&str], stdout: &str) {
    let p = r["protocol"].as_str().unwrap();
    let names: Vec<&str> = r["types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, kinds, "{p}");
    for t in r["types"].as_array().unwrap() {
        assert!(t["committed"].as_u64().unwrap() > 0, "{p}: {t}\n{stdout}");
    }
    assert_eq!(r["invariant_holds"], true, "{p}: {stdout}");
    assert_eq!(r["locks_held"], 0, "{p}: {stdout}");
    assert_eq!(r["fatal_errors"], 0, "{p}: {stdout}");
    if p.ends_with("-si") {
        assert_eq!(r["snapshot_isolation_holds"], true, "{p}: {stdout}");
    } else {
        assert_eq!(r["serializable"], true, "{p}: {stdout}");
    }
    if let Some(check) = r["workload_check"].as_str() {
        assert!(stdout.contains(check), "{stdout}");
    }
}

/// Run the real `txn-bench` with `args` (and `--json`), killed after `limit` (a
/// watchdog: the test fails instead of hanging). Returns whether it exited 0, its
/// stdout and its JSON summary.
pub fn txn_bench_watched(
    name: &str,
    args: &[&str],
    limit: Duration,
) -> (bool, String, serde_json::Value) {
    txn_bench_watched_env(name, args, &[], limit)
}

/// [`txn_bench_watched`] with environment variables `env` for `txn-bench` (and the
/// processes it starts).
pub fn txn_bench_watched_env(
    name: &str,
    args: &[&str],
    env: &[(&str, &str)],
    limit: Duration,
) -> (bool, String, serde_json::Value) {
    let _one = serial();
    let json = std::env::temp_dir().join(format!("txn-bench-{name}-{}.json", std::process::id()));
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_txn-bench"))
        .env("RRPC_MODEL", model_env())
        .envs(env.iter().copied())
        .args(args)
        .arg("--json")
        .arg(&json)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run txn-bench");
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut s);
        s
    });
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("txn-bench {args:?} still running after {limit:?}: killed");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = reader.join().unwrap();
    let summary = txn_bench_summary(&json);
    let _ = std::fs::remove_file(&json);
    (status.success(), stdout, summary)
}
