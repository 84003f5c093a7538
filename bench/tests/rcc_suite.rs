//! `txn-bench --suite rcc` as a user runs it: every protocol in both variants on SmallBank
//! and on RCC's YCSB, one table each with the ratios and the best protocol per variant,
//! JSON, TPC-C New-Order, a sweep with its chart, the doorbell-batching ablation and the
//! transport comparison (rrpc against tonic); bad flags fail with a message and exit code 2.

mod common;

use std::process::Command;

fn txn_bench(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_txn-bench"))
        .args(["--suite", "rcc", "--model", "none"])
        .args(args)
        .env_remove("RRPC_FABRIC")
        .env_remove("RRPC_MODEL")
        .output()
        .expect("txn-bench runs")
}

/// Every protocol has a row ending `ok` in both variants, and the verdict says every run
/// passed.
fn assert_every_protocol_passes(stdout: &str, stderr: &str) {
    for p in rcc::Proto::ALL {
        for v in ["rpc", "onesided"] {
            assert!(
                stdout
                    .lines()
                    .any(|l| l.starts_with(p.name()) && l.contains(v) && l.ends_with("ok")),
                "no passing row for {} {v}:\n{stdout}\n{stderr}",
                p.name()
            );
        }
    }
    assert!(
        stdout.contains("verdict: every run passed its checks"),
        "{stdout}"
    );
}

#[test]
fn the_suite_compares_every_protocol_in_both_variants() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("rcc.json");
    for wl in [
        vec!["--workload", "smallbank", "--accounts", "5000"],
        vec![
            "--workload",
            "ycsb-rcc",
            "--records",
            "20000",
            "--hot-records",
            "100",
            "--hot-prob",
            "0.2",
        ],
    ] {
        let mut a = vec![
            "--duration",
            "0.3",
            "--coroutines",
            "3",
            "--json",
            json.to_str().unwrap(),
        ];
        a.extend(wl);
        let out = txn_bench(&a);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stdout}\n{stderr}");
        assert_every_protocol_passes(&stdout, &stderr);
        for p in rcc::Proto::ALL {
            assert!(
                stdout.contains(&format!("ratio throughput onesided/rpc {} = ", p.name())),
                "{stdout}"
            );
        }
        assert!(
            stdout.contains("RPC here is rrpc over RC Rockets"),
            "{stdout}"
        );
        assert!(stdout.contains("best one-sided: ") && stdout.contains("best rpc: "));
        // JSON Lines: the metadata record, one record per run, the summary.
        let text = std::fs::read_to_string(&json).unwrap();
        let recs = common::json_lines(&text, "txn-bench --suite rcc");
        assert_eq!(recs[0]["model"], "none", "{text}");
        let runs: Vec<_> = recs.iter().filter(|r| r["record"] == "run").collect();
        assert_eq!(runs.len(), 2 * rcc::Proto::ALL.len());
        assert!(runs
            .iter()
            .all(|r| r["p99_ns"].is_u64() && r["hdr"].is_string()));
        let summary = recs.last().unwrap();
        assert_eq!(summary["record"], "summary", "{text}");
        let rows = summary["runs"].as_array().unwrap();
        assert_eq!(rows.len(), 2 * rcc::Proto::ALL.len());
        for r in rows {
            assert!(r["throughput"].as_f64().unwrap() > 0.0, "{r}");
            assert!(r["rounds_per_txn"].as_f64().unwrap() > 0.0, "{r}");
            assert!(r["checks"]["Ok"].is_array(), "{r}");
        }
    }
}

/// TPC-C New-Order (RCC, 5.1) in the suite: every protocol in both variants, CALVIN
/// included, passes its checks (the New-Order check of TPC-C, clause 3.3.2, locks free,
/// serializability) at a small scale.
#[test]
fn the_suite_runs_tpcc_new_order() {
    let out = txn_bench(&[
        "--workload",
        "tpcc-neworder",
        "--warehouses",
        "2",
        "--items",
        "2000",
        "--customers",
        "100",
        "--max-orders",
        "3000",
        "--coroutines",
        "3",
        "--duration",
        "0.3",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("=== RCC suite: tpcc-neworder"), "{stdout}");
    assert!(stdout.contains("tpcc-neworder: 2 warehouses"), "{stdout}");
    assert_every_protocol_passes(&stdout, &stderr);
    eprintln!("{stdout}");
}

#[test]
fn a_sweep_prints_a_table_per_point_and_draws_a_chart() {
    let dir = tempfile::tempdir().unwrap();
    let chart = dir.path().join("sweep.svg");
    let out = txn_bench(&[
        "--workload",
        "ycsb-rcc",
        "--records",
        "5000",
        "--hot-records",
        "50",
        "--protocol",
        "occ",
        "--variant",
        "onesided",
        "--coroutines",
        "2",
        "--duration",
        "0.2",
        "--doorbell-ablation",
        "--ts",
        "tso",
        "--sweep",
        "hot-prob=0.1,0.9",
        "--chart",
        chart.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert_eq!(stdout.matches("=== RCC suite").count(), 2, "{stdout}");
    assert!(stdout.contains("hot-prob = 0.9"), "{stdout}");
    assert!(
        stdout.contains("timestamps (WAITDIE, MVCC): the timestamp oracle"),
        "{stdout}"
    );
    assert_eq!(
        stdout
            .matches("ratio throughput doorbell-batching on/off occ = ")
            .count(),
        2,
        "{stdout}"
    );
    assert!(std::fs::metadata(&chart).unwrap().len() > 1000);
}

#[test]
fn transport_compare_adds_tcp_rows_and_the_rpc_tcp_ratio() {
    let out = txn_bench(&[
        "--workload",
        "smallbank",
        "--accounts",
        "2000",
        "--protocol",
        "nowait,occ,calvin",
        "--variant",
        "rpc",
        "--coroutines",
        "2",
        "--duration",
        "0.2",
        "--transport-compare",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("tcp = the RPC variant with every message over tonic"),
        "{stdout}"
    );
    for p in ["nowait", "occ", "calvin"] {
        for v in ["rpc", "tcp"] {
            assert!(
                stdout.lines().any(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    f.len() > 2 && f[0] == p && f[1] == v && l.ends_with("ok")
                }),
                "no passing row for {p} {v}:\n{stdout}"
            );
        }
        let ratio = stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("ratio throughput rpc/tcp {p} = ")))
            .unwrap_or_else(|| panic!("no rpc/tcp ratio for {p}:\n{stdout}"));
        assert!(ratio.parse::<f64>().unwrap() > 0.0, "{stdout}");
    }
    assert!(
        stdout.contains("verdict: every run passed its checks"),
        "{stdout}"
    );
}

#[test]
fn bad_flags_fail_with_a_message() {
    for (args, msg) in [
        (vec!["--protocol", "2pl"], "unknown value \"2pl\""),
        (vec!["--variant", "ud"], "unknown value \"ud\""),
        (vec!["--workload", "tatp"], "unknown workload"),
        (
            vec!["--workload", "tpcc-neworder", "--warehouses", "0"],
            "at least 1 warehouse",
        ),
        (
            vec!["--sweep", "theta=0,1"],
            "sweeps coroutines, hot-prob or compute-us",
        ),
        (vec!["--hot-prob", "2"], "probabilities"),
        (vec!["--coroutines", "0"], "at least one"),
        (vec!["--ts", "hlc"], "unknown timestamp source"),
        (
            vec!["--variant", "onesided", "--transport-compare"],
            "needs --variant rpc or both",
        ),
    ] {
        let out = txn_bench(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(msg), "{args:?}: {stderr}");
    }
}

/// `txn-bench --suite rcc --processes ...` on the fabric `$RRPC_FABRIC` names (the
/// Soft-RoCE VM sets verbs), without a model on verbs; returns its output and pid.
fn txn_bench_processes(args: &[&str]) -> (std::process::Output, u32) {
    let child = Command::new(env!("CARGO_BIN_EXE_txn-bench"))
        .args(["--suite", "rcc", "--processes"])
        .args(common::model("none"))
        .args(args)
        .env_remove("RRPC_MODEL")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("txn-bench runs");
    let pid = child.id();
    (child.wait_with_output().expect("txn-bench ends"), pid)
}

/// The `rcc-node` processes a `txn-bench` (by pid) started that still run: their
/// command lines name its clusters (`rccp-PID-K`).
fn rcc_nodes_of(pid: u32) -> Vec<String> {
    let tag = format!("rccp-{pid}-");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains("rcc-node") && c.contains(&tag))
        .collect()
}

/// Every protocol in both variants with each node an `rcc-node` process (its
/// partition, handlers and coordinators; every record reached through the network):
/// every run passes its checks (CALVIN's determinism against a serial replay of node
/// 0's sequence among them, the history merged from the processes' reports), and no
/// node process outlives the run.
#[test]
fn every_protocol_runs_with_its_nodes_as_processes() {
    let (out, pid) = txn_bench_processes(&[
        "--accounts",
        "2000",
        "--duration",
        "0.3",
        "--coroutines",
        "3",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("on 2 nodes (rcc-node processes)"),
        "{stdout}"
    );
    // The fabric that ran is the one asked for (verbs in the Soft-RoCE VM).
    let fabric = std::env::var("RRPC_FABRIC").unwrap_or_else(|_| "shm".into());
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with(&format!("fabric: {fabric}"))),
        "{stdout}"
    );
    assert_every_protocol_passes(&stdout, &stderr);
    assert_eq!(rcc_nodes_of(pid), Vec::<String>::new());
}

/// A node SIGKILLed mid-run: RCC keeps no replicas, so the run fails at once with a
/// message naming the node and the signal, the other nodes stopped; nothing hangs and
/// no node process is left behind.
#[test]
fn a_killed_node_fails_the_run_naming_it_and_leaves_no_process() {
    let (out, pid) = txn_bench_processes(&[
        "--protocol",
        "nowait",
        "--variant",
        "onesided",
        "--nodes",
        "3",
        "--accounts",
        "2000",
        "--duration",
        "20s",
        "--coroutines",
        "2",
        "--kill-node-after",
        "300ms",
        "--fault-node",
        "1",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("rcc-node 1 (pid")
            && stderr.contains("killed by signal 9, SIGKILL")
            && stderr.contains("RCC keeps no replicas"),
        "{stderr}"
    );
    assert!(!stderr.contains("verdict"), "{stderr}");
    assert_eq!(rcc_nodes_of(pid), Vec::<String>::new());
}

/// A node SIGSTOPped for 300 ms mid-run, then continued: the others' calls to it wait
/// (below rrpc's call timeout) and the run passes its checks; the events are reported.
#[test]
fn a_stopped_node_only_slows_the_run() {
    let (out, _) = txn_bench_processes(&[
        "--protocol",
        "nowait,occ",
        "--variant",
        "both",
        "--accounts",
        "2000",
        "--duration",
        "1s",
        "--coroutines",
        "2",
        "--stop-node-after",
        "200ms",
        "--stop-ms",
        "300",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(
        stderr.matches("stopped (SIGSTOP)").count(),
        4,
        "one stop per run:\n{stderr}"
    );
    assert_eq!(stderr.matches("continued (SIGCONT)").count(), 4, "{stderr}");
    assert!(
        stdout.contains("verdict: every run passed its checks"),
        "{stdout}"
    );
}

#[test]
fn process_flags_are_checked_before_anything_starts() {
    for (args, msg) in [
        (
            vec!["--kill-node-after", "1s"],
            "required arguments were not provided",
        ),
        (
            vec!["--processes", "--transport-compare"],
            "--transport-compare runs in one process",
        ),
        (
            vec!["--processes", "--fault-node", "2"],
            "--fault-node 2: the nodes are 0 to 1",
        ),
        (
            vec![
                "--processes",
                "--kill-node-after",
                "1s",
                "--stop-node-after",
                "1s",
            ],
            "one fault per run",
        ),
    ] {
        let out = txn_bench(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(msg), "{args:?}: {stderr}");
    }
}
