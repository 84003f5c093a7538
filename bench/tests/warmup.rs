//! `--warmup` end to end: `txn-bench` runs warm-up + duration on its own cluster, and
//! reports the measured window only while its checks cover the whole run. Observable
//! without timing: the commits reported are fewer than those the serializability
//! check covered, the difference being the warm-up's (reported apart), and every
//! check passes; in-process, with coordinator processes and in the RCC suite.

mod common;

use std::process::Command;
use std::time::Duration;

/// The warm-up of these runs: long enough that a loaded machine running a debug build
/// still commits during it (the first transactions set up their connections).
const WARMUP: &str = "1s";

/// Run `r`'s warm-up as reported: 1 s, its commits apart from the measured ones, and
/// the check covering both.
fn assert_warmed_up(r: &serde_json::Value, stdout: &str) {
    assert_eq!(r["warmup_s"].as_f64(), Some(1.0), "{r}");
    let warm = r["warmup_committed"].as_u64().unwrap();
    let checked = r["checked_committed"].as_u64().unwrap();
    assert!(warm > 0, "nothing committed in the warm-up: {stdout}");
    assert!(common::committed(r) < checked, "{stdout}");
    assert_eq!(common::committed(r) + warm, checked, "{stdout}");
    assert!(
        stdout.contains("warm-up 1 s (not measured) + 1 s"),
        "{stdout}"
    );
    assert!(
        stdout.contains("warm-up: 1.0 s before the measured window"),
        "{stdout}"
    );
}

#[test]
fn in_process_coordinators_report_after_the_warm_up_and_check_everything() {
    let (stdout, s) = common::txn_bench(
        "warmup",
        &[
            "--fabric",
            "shm",
            "--model",
            "none",
            "--protocol",
            "occ-cas",
            "--threads",
            "2",
            "--coroutines",
            "4",
            "--accounts",
            "2000",
            "--warmup",
            WARMUP,
            "--duration",
            "1s",
            "--timeline-ms",
            "100",
        ],
    );
    assert_eq!(s["passed"], true, "{stdout}");
    let r = &s["runs"][0];
    let kinds: Vec<&str> = bench::smallbank::TxnType::ALL
        .iter()
        .map(|t| t.name())
        .collect();
    common::assert_checked_run(r, &kinds, &stdout);
    assert_warmed_up(r, &stdout);
    // The money audit covers the whole run: the net of every commit, the warm-up's too.
    assert_eq!(
        r["final_total"].as_i64().unwrap(),
        r["initial_total"].as_i64().unwrap() + r["net_committed"].as_i64().unwrap(),
        "{stdout}"
    );
    // The timeline counts the measured window's commits only.
    let timeline: u64 = r["timeline"]["total"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .sum();
    assert_eq!(timeline, common::committed(r), "{stdout}");
}

#[test]
fn coordinator_processes_take_the_warm_up_with_their_flags() {
    let (ok, stdout, s) = common::txn_bench_watched(
        "warmup-cnodes",
        &[
            "--fabric",
            "shm",
            "--model",
            "none",
            "--workload",
            "pairs",
            "--cnodes",
            "2",
            "--threads",
            "1",
            "--coroutines",
            "4",
            "--groups",
            "2000",
            "--warmup",
            WARMUP,
            "--duration",
            "1s",
        ],
        Duration::from_secs(300),
    );
    assert!(ok, "{stdout}");
    assert_eq!(s["passed"], true, "{stdout}");
    let r = &s["runs"][0];
    common::assert_checked_run(r, &["write-group", "read-group"], &stdout);
    assert_eq!(r["cnodes"], 2);
    assert_warmed_up(r, &stdout);
}

#[test]
fn the_rcc_suite_reports_after_the_warm_up_and_checks_everything() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("rcc.json");
    let out = Command::new(env!("CARGO_BIN_EXE_txn-bench"))
        .args(["--suite", "rcc", "--fabric", "shm", "--model", "none"])
        .args(["--protocol", "nowait,calvin", "--variant", "onesided"])
        .args(["--accounts", "5000", "--coroutines", "3"])
        .args(["--warmup", WARMUP, "--duration", "1s", "--json"])
        .arg(&json)
        .env_remove("RRPC_FABRIC")
        .env_remove("RRPC_MODEL")
        .output()
        .expect("txn-bench runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("warm-up 1 s (not measured) + 1 s per run"),
        "{stdout}"
    );
    let text = std::fs::read_to_string(&json).unwrap();
    let recs = common::json_lines(&text, "txn-bench --suite rcc");
    let runs: Vec<&serde_json::Value> = recs.iter().filter(|r| r["record"] == "run").collect();
    // NOWAIT's coordinators and CALVIN's sequencers (their own driver) alike.
    assert_eq!(runs.len(), 2, "{text}");
    for r in runs {
        assert!(r["checks"]["Ok"].is_array(), "{r}");
        assert_eq!(r["warmup_s"].as_f64(), Some(1.0), "{r}");
        let (measured, checked) = (
            r["committed"].as_u64().unwrap(),
            r["checked_committed"].as_u64().unwrap(),
        );
        assert!(measured > 0 && measured < checked, "{r}");
    }
}
