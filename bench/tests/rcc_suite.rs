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
        for p in rcc::Proto::ALL {
            for v in ["rpc", "onesided"] {
                assert!(
                    stdout
                        .lines()
                        .any(|l| l.starts_with(p.name()) && l.contains(v) && l.ends_with("ok")),
                    "no passing row for {} {v}:\n{stdout}",
                    p.name()
                );
            }
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
        assert!(
            stdout.contains("verdict: every run passed its checks"),
            "{stdout}"
        );
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
    for p in rcc::Proto::ALL {
        for v in ["rpc", "onesided"] {
            assert!(
                stdout
                    .lines()
                    .any(|l| l.starts_with(p.name()) && l.contains(v) && l.ends_with("ok")),
                "no passing row for {} {v}:\n{stdout}",
                p.name()
            );
        }
    }
    assert!(
        stdout.contains("verdict: every run passed its checks"),
        "{stdout}"
    );
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
