//! End to end: the real `txn-bench` starts memnode, lockd and tso as processes over the
//! shm fabric, runs SmallBank with Zipf 0.99 for a few seconds, and audits the bank.

use std::process::Command;

/// Run the real `txn-bench` with `args`; it must succeed. Returns its stdout and JSON
/// report.
fn txn_bench(name: &str, args: &[&str]) -> (String, serde_json::Value) {
    let json = std::env::temp_dir().join(format!("txn-bench-{name}-{}.json", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_txn-bench"))
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
    let report = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    (stdout, report)
}

#[test]
fn smallbank_short_run_keeps_the_money_invariant() {
    let (stdout, report) = txn_bench(
        "short",
        &[
            "--threads",
            "2",
            "--coroutines",
            "4",
            "--theta",
            "0.99",
            "--accounts",
            "10000",
            "--duration",
            "3",
        ],
    );
    assert!(stdout.contains("invariant holds"), "{stdout}");
    assert!(
        stdout.contains("serializability: ") && stdout.contains(" edges, acyclic"),
        "{stdout}"
    );
    let committed: u64 = report["types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["committed"].as_u64().unwrap())
        .sum();
    assert!(committed > 0, "no transaction committed: {stdout}");
    assert_eq!(report["invariant_holds"], true);
    assert_eq!(report["locks_held"], 0);
    assert_eq!(report["fatal_errors"], 0);
    assert_eq!(
        report["final_total"].as_i64().unwrap(),
        report["initial_total"].as_i64().unwrap() + report["net_committed"].as_i64().unwrap()
    );
    // Every type ran and Zipf 0.99 over 10k accounts produces some contention.
    for t in report["types"].as_array().unwrap() {
        assert!(t["committed"].as_u64().unwrap() > 0, "{t}");
    }
    assert_eq!(report["serializable"], true);
    assert_eq!(
        report["checked_committed"].as_u64().unwrap(),
        committed,
        "every committed transaction was checked"
    );
}

/// At the high-contention setting, with a lock wait so short that waits time
/// out: the timed-out transactions abort, their tickets are released in the background
/// when their turn comes, and the run still passes every check.
#[test]
fn lock_wait_timeouts_release_their_tickets() {
    let (stdout, report) = txn_bench(
        "wait",
        &[
            "--accounts",
            "100",
            "--theta",
            "1.2",
            "--threads",
            "2",
            "--coroutines",
            "16",
            "--duration",
            "2",
            "--lock-wait-us",
            "1",
        ],
    );
    let timeouts = report["abort_reasons"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r[0] == "lock-wait-timeout")
        .map_or(0, |r| r[1].as_u64().unwrap());
    assert!(timeouts > 0, "no wait timed out: {stdout}");
    assert_eq!(report["locks_held"], 0, "{stdout}");
    assert_eq!(report["invariant_holds"], true, "{stdout}");
    assert_eq!(report["serializable"], true, "{stdout}");
}

#[test]
fn bad_arguments_fail_cleanly() {
    let out = Command::new(env!("CARGO_BIN_EXE_txn-bench"))
        .args(["--threads", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--threads"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
