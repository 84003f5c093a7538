//! End to end: the real `txn-bench` starts memory nodes, a timestamp oracle and (for
//! Scythe) a lock service as processes over the shm fabric, runs SmallBank with each
//! protocol for a short while, and every check must pass: money audit, no lock left
//! held, every transaction type committed, a serializable history (snapshot isolation
//! for `mvcc-si`).
//!
//! The Soft-RoCE VM (deploy/vm/verbs-tests.sh) runs only
//! `all_protocols_pass_every_check_at_theta_0_99` from this file, on verbs.

mod common;

use std::process::Command;

use common::txn_bench;

/// Every check of one run's report, as the JSON has it.
fn assert_run_passed(r: &serde_json::Value, stdout: &str) {
    let kinds: Vec<&str> = bench::smallbank::TxnType::ALL
        .iter()
        .map(|t| t.name())
        .collect();
    common::assert_checked_run(r, &kinds, stdout);
    let p = r["protocol"].as_str().unwrap();
    let committed: u64 = r["types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["committed"].as_u64().unwrap())
        .sum();
    assert_eq!(r["cvt_locks_held"], 0, "{p}: {stdout}");
    assert_eq!(
        r["final_total"].as_i64().unwrap(),
        r["initial_total"].as_i64().unwrap() + r["net_committed"].as_i64().unwrap(),
        "{p}"
    );
    if p == "scythe" {
        assert_eq!(r["lockd_locks_held"], 0, "{p}: {stdout}");
    } else {
        assert!(r["lockd_locks_held"].is_null(), "{p}: {r}");
    }
    if p == "mvcc-si" {
        assert_eq!(r["serializability_required"], false);
    } else {
        assert_eq!(
            r["checked_committed"].as_u64().unwrap(),
            committed,
            "{p}: every committed transaction was checked"
        );
    }
    if p.starts_with("mvcc") || p.starts_with("lotus") {
        assert!(r["snapshot_isolation"].is_string(), "{p}: {r}");
    }
}

/// `--protocol all` at `args`: three passing runs in order, the comparison and both
/// ratios.
fn all_protocols(name: &str, args: &[&str]) -> (String, serde_json::Value) {
    let mut a = vec!["--protocol", "all", "--threads", "2"];
    a.extend_from_slice(args);
    let (stdout, s) = txn_bench(name, &a);
    let runs = s["runs"].as_array().unwrap();
    let names: Vec<&str> = runs
        .iter()
        .map(|r| r["protocol"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["occ-cas", "scythe", "mvcc", "lotus"], "{stdout}");
    for r in runs {
        assert_run_passed(r, &stdout);
    }
    assert_eq!(s["passed"], true, "{stdout}");
    assert!(
        stdout.contains("\ncomparison: SmallBank | timing model: "),
        "{stdout}"
    );
    assert!(stdout.contains("ratio p99 scythe/occ-cas = "), "{stdout}");
    assert!(
        stdout.contains("ratio throughput mvcc/occ-cas = "),
        "{stdout}"
    );
    assert!(
        stdout.contains("ratio throughput lotus/mvcc = "),
        "{stdout}"
    );
    assert!(stdout.contains("every run passed its checks"), "{stdout}");
    let ratios: Vec<&str> = s["ratios"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        ratios,
        [
            "throughput lotus/mvcc",
            "p50 lotus/mvcc",
            "p99 scythe/occ-cas",
            "throughput scythe/occ-cas",
            "throughput mvcc/occ-cas",
            "throughput lotus/occ-cas"
        ]
    );
    // One table row per protocol, each with its verdicts.
    for p in ["occ-cas", "scythe", "mvcc", "lotus"] {
        let row = stdout
            .lines()
            .find(|l| l.starts_with(&format!("{p} ")))
            .unwrap_or_else(|| panic!("no row for {p}: {stdout}"));
        assert!(
            row.contains("invariant holds") && row.contains("| passed |"),
            "{row}"
        );
        assert!(row.contains(" edges, acyclic"), "{row}");
    }
    (stdout, s)
}

#[test]
fn all_protocols_pass_every_check_at_theta_0_99() {
    all_protocols(
        "all-099",
        &[
            "--coroutines",
            "4",
            "--theta",
            "0.99",
            "--accounts",
            "10000",
            "--duration",
            "1.5",
        ],
    );
}

#[test]
fn all_protocols_pass_every_check_uniform_on_two_memnodes() {
    let (_, s) = all_protocols(
        "all-0",
        &[
            "--coroutines",
            "4",
            "--theta",
            "0",
            "--accounts",
            "10000",
            "--memnodes",
            "2",
            "--versions",
            "2",
            "--duration",
            "1",
        ],
    );
    for r in s["runs"].as_array().unwrap() {
        assert_eq!(
            (r["memnodes"].as_u64(), r["versions"].as_u64()),
            (Some(2), Some(2))
        );
    }
}

/// Three copies of every partition: each run ends with the replica audit, which must
/// find every backup equal to its primary.
#[test]
fn all_protocols_pass_every_check_with_three_replicas() {
    let (stdout, s) = all_protocols(
        "all-r3",
        &[
            "--coroutines",
            "4",
            "--accounts",
            "10000",
            "--memnodes",
            "3",
            "--replicas",
            "3",
            "--duration",
            "1",
        ],
    );
    assert!(
        stdout.contains(
            "| 3 memnode(s), 4 versions, 3 replicas (one commit round for all copies; occ-cas \
             commits as FORD"
        ),
        "{stdout}"
    );
    for r in s["runs"].as_array().unwrap() {
        assert_eq!(r["replicas"], 3, "{r}");
        assert_eq!(r["replicas_identical"], true, "{stdout}");
        let line = r["replica_audit"].as_str().unwrap();
        assert!(
            line.starts_with("replicas: 3 partitions x 2 backups, ")
                && line.ends_with(": identical"),
            "{line}"
        );
        assert!(stdout.contains(line), "{stdout}");
    }
}

/// The high-contention setting of the protocol comparison: 100 accounts, Zipf 1.2.
#[test]
fn all_protocols_pass_every_check_on_100_accounts_at_theta_1_2() {
    all_protocols(
        "all-12",
        &[
            "--coroutines",
            "8",
            "--theta",
            "1.2",
            "--accounts",
            "100",
            "--duration",
            "1.5",
        ],
    );
}

/// FORD's hot-account option: 20 hot accounts take 90% of the draws over a uniform
/// rest; the run shows the contention (aborts) and passes every check.
#[test]
fn hot_accounts_concentrate_the_conflicts_and_pass_every_check() {
    let (stdout, s) = txn_bench(
        "hot",
        &[
            "--protocol",
            "occ-cas",
            "--threads",
            "2",
            "--coroutines",
            "8",
            "--accounts",
            "10000",
            "--theta",
            "0",
            "--hot-accounts",
            "20",
            "--hot-fraction",
            "0.9",
            "--duration",
            "1.5",
        ],
    );
    let r = &s["runs"][0];
    assert_run_passed(r, &stdout);
    assert!(
        stdout.contains("| 10000 accounts, 20 hot for 90% of draws |"),
        "{stdout}"
    );
    assert!(r["abort_rate"].as_f64().unwrap() > 0.0, "{stdout}");
}

/// MVCC at snapshot isolation is judged by the SI check; its serializability line is
/// informative (SI allows write skew).
#[test]
fn mvcc_si_passes_the_snapshot_isolation_check() {
    let (stdout, s) = txn_bench(
        "si",
        &[
            "--protocol",
            "mvcc",
            "--isolation",
            "si",
            "--threads",
            "2",
            "--coroutines",
            "4",
            "--accounts",
            "1000",
            "--theta",
            "0.99",
            "--duration",
            "1.5",
        ],
    );
    let r = &s["runs"][0];
    assert_eq!(r["protocol"], "mvcc-si");
    assert_run_passed(r, &stdout);
    assert!(
        stdout.contains("snapshot isolation: ")
            && stdout.contains("checked: no lost update, no snapshot read violation"),
        "{stdout}"
    );
    assert!(
        stdout.contains("(informative, SI allows write skew) serializability: "),
        "{stdout}"
    );
}

/// At high contention, with a lock wait so short that waits time out: the timed-out
/// Scythe transactions abort, their tickets are released in the background when their
/// turn comes, and the run still passes every check.
#[test]
fn lock_wait_timeouts_release_their_tickets() {
    let (stdout, s) = txn_bench(
        "wait",
        &[
            "--protocol",
            "scythe",
            "--accounts",
            "100",
            "--theta",
            "1.2",
            "--threads",
            "2",
            "--coroutines",
            "16",
            "--duration",
            "1.5",
            "--lock-wait-us",
            "1",
        ],
    );
    let r = &s["runs"][0];
    let timeouts = r["abort_reasons"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r[0] == "lock-wait-timeout")
        .map_or(0, |r| r[1].as_u64().unwrap());
    assert!(timeouts > 0, "no wait timed out: {stdout}");
    assert_run_passed(r, &stdout);
}

/// A sweep runs each protocol at each point, prints the table with a point column and
/// per-point ratios, and draws the chart.
#[test]
fn a_clients_sweep_prints_a_table_and_draws_a_chart() {
    let chart = std::env::temp_dir().join(format!("txn-bench-sweep-{}.svg", std::process::id()));
    let (stdout, s) = txn_bench(
        "sweep",
        &[
            "--protocol",
            "all",
            "--sweep",
            "clients=1,4",
            "--threads",
            "1",
            "--accounts",
            "1000",
            "--theta",
            "0.5",
            "--duration",
            "0.7",
            "--chart",
            chart.to_str().unwrap(),
        ],
    );
    let runs = s["runs"].as_array().unwrap();
    let got: Vec<(&str, &str)> = runs
        .iter()
        .map(|r| {
            (
                r["point"].as_str().unwrap(),
                r["protocol"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("clients=1", "occ-cas"),
            ("clients=1", "scythe"),
            ("clients=1", "mvcc"),
            ("clients=1", "lotus"),
            ("clients=4", "occ-cas"),
            ("clients=4", "scythe"),
            ("clients=4", "mvcc"),
            ("clients=4", "lotus"),
        ]
    );
    assert_eq!(runs[4]["coroutines"], 4);
    assert_eq!(s["sweep"], "clients=1,4");
    assert!(
        stdout.contains("ratio p99 scythe/occ-cas = ") && stdout.contains(" (clients=4)\n"),
        "{stdout}"
    );
    // Per point: scythe's p99 and throughput, mvcc's and lotus's throughput over
    // occ-cas, lotus's throughput and p50 over mvcc.
    assert_eq!(s["ratios"].as_array().unwrap().len(), 12);
    let svg = std::fs::read_to_string(&chart).expect("chart written");
    let _ = std::fs::remove_file(&chart);
    assert!(
        svg.starts_with("<svg") && svg.contains("occ-cas") && svg.contains("mvcc"),
        "{svg:.200}"
    );
    // Each point says which sweep value it is.
    assert!(
        svg.contains("clients=1") && svg.contains("clients=4"),
        "no point labels: {svg:.200}"
    );
}

/// A sweep of short points (1 thread, 1,000 accounts, 0.7 s each) with `args`.
fn short_sweep(name: &str, args: &[&str]) -> (String, serde_json::Value) {
    let mut all = args.to_vec();
    all.extend(["--threads", "1", "--accounts", "1000", "--duration", "0.7"]);
    txn_bench(name, &all)
}

/// mvcc with one copy of each partition, then two, on 2 memory nodes.
const MVCC_REPLICAS_1_2: &[&str] = &[
    "--protocol",
    "mvcc",
    "--sweep",
    "replicas=1,2",
    "--memnodes",
    "2",
];

/// `--sweep replicas=1,2`: each point runs with its own copies (the replica audit only
/// at the replicated one), and each protocol's throughput there is compared with its
/// one-copy run.
#[test]
fn a_replicas_sweep_runs_each_point_with_its_copies() {
    let (stdout, s) = short_sweep("sweep-r", MVCC_REPLICAS_1_2);
    let runs = s["runs"].as_array().unwrap();
    let got: Vec<(&str, u64, bool)> = runs
        .iter()
        .map(|r| {
            assert_run_passed(r, &stdout);
            (
                r["point"].as_str().unwrap(),
                r["replicas"].as_u64().unwrap(),
                r["replicas_identical"] == true,
            )
        })
        .collect();
    assert_eq!(
        got,
        [("replicas=1", 1, false), ("replicas=2", 2, true)],
        "{stdout}"
    );
    // The comparison's header says the copies vary; each run's header says its own.
    assert!(stdout.contains("replicas per point"), "{stdout}");
    assert!(
        stdout.contains("| 2 memnode(s), 4 versions, 2 replicas ("),
        "{stdout}"
    );
    assert!(
        stdout.contains("\nratio throughput mvcc replicas 2/1 = "),
        "{stdout}"
    );
}

/// `--rounds 2`: the sweep's runs twice, the second round backward; each run says its
/// round, the ratio is taken within each round and judged by the median of the two, and
/// a table of medians follows the runs.
#[test]
fn rounds_run_the_plan_again_backward_and_judge_ratios_by_their_median() {
    let (stdout, s) = short_sweep("rounds", &[MVCC_REPLICAS_1_2, &["--rounds", "2"]].concat());
    let runs = s["runs"].as_array().unwrap();
    let got: Vec<(&str, u64)> = runs
        .iter()
        .map(|r| {
            assert_run_passed(r, &stdout);
            (r["point"].as_str().unwrap(), r["round"].as_u64().unwrap())
        })
        .collect();
    assert_eq!(
        got,
        [
            ("replicas=1", 1),
            ("replicas=2", 1),
            ("replicas=2", 2),
            ("replicas=1", 2)
        ],
        "{stdout}"
    );
    let tps = |i: usize| runs[i]["throughput_tps"].as_f64().unwrap();
    let ratio = &s["ratios"][0];
    assert_eq!(ratio["name"], "throughput mvcc replicas 2/1", "{ratio}");
    let each: Vec<f64> = ratio["rounds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let want = [tps(1) / tps(0), tps(2) / tps(3)];
    assert_eq!(each.len(), 2, "{ratio}");
    for (g, w) in each.iter().zip(want) {
        assert!((g - w).abs() < 1e-9, "{each:?} against {want:?}");
    }
    let median = ratio["value"].as_f64().unwrap();
    assert!((median - (want[0] + want[1]) / 2.0).abs() < 1e-9, "{ratio}");
    for line in [
        "\nratio throughput mvcc replicas 2/1 = ",
        "(median of 2 rounds: ",
        "2 rounds (runs forward, then backward)",
        "\nmedians over the rounds:\n",
    ] {
        assert!(stdout.contains(line), "no {line:?} in {stdout}");
    }
    assert_eq!(s["passed"], true, "{stdout}");
}

/// `--sweep max-backoff-us=0,2000`: each point runs with its own retry backoff cap, as
/// its header says, and the comparison says the cap varies.
#[test]
fn a_backoff_sweep_runs_each_point_with_its_cap() {
    let (stdout, s) = short_sweep(
        "sweep-b",
        &["--protocol", "occ-cas", "--sweep", "max-backoff-us=0,2000"],
    );
    let points: Vec<&str> = s["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert_run_passed(r, &stdout);
            r["point"].as_str().unwrap()
        })
        .collect();
    assert_eq!(
        points,
        ["max-backoff-us=0", "max-backoff-us=2000"],
        "{stdout}"
    );
    for cap in [
        "| backoff up to 0 us | check:",
        "| backoff up to 2000 us | check:",
    ] {
        assert!(stdout.contains(cap), "no run header with {cap:?}: {stdout}");
    }
    assert!(stdout.contains("| backoff cap swept\n"), "{stdout}");
}

#[test]
fn bad_arguments_fail_cleanly() {
    for (args, want) in [
        (&["--threads", "0"][..], "--threads"),
        (&["--protocol", "2pl"], "unknown protocol \"2pl\""),
        (
            &["--protocol", "occ-cas", "--isolation", "si"],
            "--isolation si applies to mvcc",
        ),
        (
            &["--protocol", "mvcc-si", "--isolation", "sr"],
            "contradicts --isolation sr",
        ),
        (&["--isolation", "rc"], "--isolation"),
        (
            &["--sweep", "theta"],
            "expected theta=V1,V2,..., clients=N1,N2,..., commit-log=off,on,ordered, \
             vtc-entries=N1,N2,..., lock-serving=coordinator,thread, range-index=off,on, \
             replicas=1,3 or max-backoff-us=100,1000",
        ),
        (&["--sweep", "theta=0,x"], "is not a Zipf theta"),
        (&["--sweep", "clients=0"], "is not a number of coroutines"),
        (
            &["--sweep", "max-backoff-us=-5"],
            "is not a number of microseconds",
        ),
        (
            &["--sweep", "commit-log=maybe"],
            "is not off, on or ordered",
        ),
        (
            &["--cnodes", "2", "--sweep", "commit-log=off,on"],
            "coordinator processes always log",
        ),
        (
            &["--sweep", "accounts=1,2"],
            "unknown parameter \"accounts\"",
        ),
        (&["--memnodes", "0"], "--memnodes must be 1 to"),
        (
            &["--memnodes", "2", "--replicas", "3"],
            "--replicas must be 1 to --memnodes (2)",
        ),
        (&["--versions", "0"], "--versions must be 1 to 64"),
        (&["--chart", "x.pdf"], "must end in .svg or .png"),
        (&["--theta=-1"], "theta must be >= 0"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_txn-bench"))
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}: nothing ran");
    }
}

/// Scythe with its Takeout Locks on a lockd node and on the memory nodes (`--sweep
/// lock-placement=lockd,memnode`, each of two memory nodes serving its partition's
/// locks; Scythe 4.3's placement): both runs pass every check, no lock of any memory
/// node's lock service is left held, and the comparison reports Scythe's throughput and
/// p99 with the locks on the memory nodes over on lockd.
#[test]
fn scythe_with_its_locks_on_the_memnodes_passes_every_check() {
    let (stdout, s) = txn_bench(
        "lock-placement",
        &[
            "--protocol",
            "scythe",
            "--sweep",
            "lock-placement=lockd,memnode",
            "--memnodes",
            "2",
            "--coroutines",
            "4",
            "--accounts",
            "10000",
            "--duration",
            "1",
            "--each-type-first",
        ],
    );
    let runs = s["runs"].as_array().unwrap();
    let points: Vec<&str> = runs.iter().map(|r| r["point"].as_str().unwrap()).collect();
    assert_eq!(
        points,
        ["lock-placement=lockd", "lock-placement=memnode"],
        "{stdout}"
    );
    for r in runs {
        assert_run_passed(r, &stdout);
    }
    assert_eq!(s["passed"], true, "{stdout}");
    assert!(
        stdout.contains("Scythe's locks on the memnodes"),
        "the memnode point's header says where the locks are: {stdout}"
    );
    for want in [
        "ratio throughput scythe memnode/lockd = ",
        "ratio p99 scythe memnode/lockd = ",
    ] {
        assert!(stdout.contains(want), "{want}: {stdout}");
    }
}
