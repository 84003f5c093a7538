//! End to end: the real `txn-bench` runs KVS / YCSB workloads on a local cluster over
//! the shm fabric for a short while at Zipf theta 0.99, and every check must pass: each
//! value read and each key after the run carries a valid checksum, the update counters
//! add up to the committed updates, no lock is left held, every kind committed, and the
//! history is serializable. `ycsb-e` scans through the range index, whose tree is
//! checked after the run, and a planted scan bug is caught.
//!
//! The Soft-RoCE VM (deploy/vm/verbs-tests.sh) runs `ycsb_a_passes_every_check_with_every_protocol`
//! and `ycsb_e_scans_through_the_range_index_and_passes_every_check` from this file, on verbs.

mod common;

use std::process::Command;

/// Run the real `txn-bench` with `args` and a small, skewed KVS; it must succeed.
/// Returns its stdout and JSON summary.
fn txn_bench(name: &str, args: &[&str]) -> (String, serde_json::Value) {
    let mut all = args.to_vec();
    all.extend([
        "--records",
        "1000",
        "--theta",
        "0.99",
        "--duration",
        "1",
        "--threads",
        "2",
    ]);
    common::txn_bench(name, &all)
}

/// Every check of one run, as the JSON and the report have them.
fn assert_run_passed(r: &serde_json::Value, kinds: &[&str], stdout: &str) {
    common::assert_checked_run(r, kinds, stdout);
    let p = r["protocol"].as_str().unwrap();
    // The counters found add up to the committed updates.
    assert_eq!(r["final_total"], r["net_committed"], "{p}: {stdout}");
    let check = r["workload_check"].as_str().unwrap();
    assert!(check.starts_with("kvs check: 1000 records"), "{check}");
    assert!(check.contains("checksums ok"), "{check}");
    assert!(!check.contains("FAILED"), "{check}");
}

#[test]
fn ycsb_a_passes_every_check_with_every_protocol() {
    let (stdout, s) = txn_bench("ycsb-a", &["--workload", "ycsb-a", "--protocol", "all"]);
    assert_eq!(s["workload"], "ycsb-a");
    assert_eq!(s["passed"], true, "{stdout}");
    let runs = s["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4);
    for r in runs {
        assert_run_passed(r, &["read-only", "update"], &stdout);
        assert!(r["net_committed"].as_i64().unwrap() > 0, "{stdout}");
    }
    assert!(stdout.contains("comparison: ycsb-a"), "{stdout}");
    assert!(stdout.contains("invariant (workload check)"), "{stdout}");
    assert!(stdout.contains("every run passed its checks"), "{stdout}");
}

#[test]
fn ycsb_d_inserts_and_passes_with_mvcc() {
    let (stdout, s) = txn_bench("ycsb-d", &["--workload", "ycsb-d", "--protocol", "mvcc"]);
    let r = &s["runs"][0];
    assert_run_passed(r, &["read-only", "insert"], &stdout);
    let check = r["workload_check"].as_str().unwrap();
    assert!(check.contains(" inserted, checksums ok"), "{check}");
    assert_eq!(r["net_committed"], 0, "ycsb-d does not update");
}

#[test]
fn kvs_passes_with_scythe() {
    let (stdout, s) = txn_bench("kvs", &["--workload", "kvs", "--protocol", "scythe"]);
    let r = &s["runs"][0];
    assert_run_passed(r, &["read", "update"], &stdout);
    assert_eq!(r["lockd_locks_held"], 0, "{stdout}");
    assert!(
        stdout.contains("1000 records x 40 B, 1 ops/txn"),
        "{stdout}"
    );
}

#[test]
fn ycsb_e_scans_through_the_range_index_and_passes_every_check() {
    // Each coroutine runs a scan and an insert first, so that the Soft-RoCE VM's debug
    // build (a few dozen transactions a second) commits both kinds in the short run.
    let (stdout, s) = txn_bench(
        "ycsb-e",
        &[
            "--workload",
            "ycsb-e",
            "--protocol",
            "all",
            "--each-type-first",
        ],
    );
    assert_eq!(s["passed"], true, "{stdout}");
    let runs = s["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4);
    for r in runs {
        assert_run_passed(r, &["scan", "insert"], &stdout);
        let check = r["workload_check"].as_str().unwrap();
        assert!(
            check.contains("tree sound, no rTX lock held or log unfinished, every row indexed"),
            "{check}"
        );
        assert_eq!(r["net_committed"], 0, "ycsb-e does not update");
    }
}

/// The scan check can fail: with every scan dropping its second key (a test build's
/// `--plant drop-scan-entries`), the run stops at the first scan of two records or
/// more and names the missed key.
#[test]
fn a_scan_that_misses_a_record_fails_the_run() {
    let (ok, stdout, s) = common::txn_bench_watched(
        "ycsb-e-planted",
        &[
            "--workload",
            "ycsb-e",
            "--protocol",
            "occ-cas",
            "--records",
            "1000",
            "--duration",
            "1",
            "--plant",
            "drop-scan-entries",
        ],
        std::time::Duration::from_secs(120),
    );
    assert!(!ok, "the planted run passed:\n{stdout}");
    let r = &s["runs"][0];
    assert!(r["fatal_errors"].as_u64().unwrap() > 0, "{stdout}");
    assert!(
        r.to_string().contains(" missed"),
        "no scan check failure named: {r}"
    );
}

#[test]
fn the_scan_plant_needs_ycsb_e() {
    let out = Command::new(env!("CARGO_BIN_EXE_txn-bench"))
        .args(["--workload", "ycsb-a", "--plant", "drop-scan-entries"])
        .output()
        .expect("run txn-bench");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("needs --workload ycsb-e"), "{err}");
}
