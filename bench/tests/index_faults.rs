//! `index-bench` with client processes (`--processes`), faulted for real: client process 0
//! is killed with SIGKILL, or stopped with SIGSTOP past its leases and continued, in the
//! middle of a workload's measured window. The other process goes on, repairing what
//! the faulted one left locked as it meets it; afterwards a killed process's clients are
//! restarted (their logs finished), and the tree must hold every acknowledged insert
//! (the killed clients' in-flight ones present or not), in order, with no lock held and
//! every log DONE (Transactional Indexes on Disaggregated Memory with Repairable
//! Transaction, 4.3 and 6.4). The driver itself checks that the killed process died of
//! SIGKILL and that the stopped one finished its run.

mod common;

use std::process::{Command, Output};

/// One run at a time: each runs a memory node and busy-polling clients (several
/// processes), and the machine may have two cores; runs side by side starve each other's
/// measured windows.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn index_bench(extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_index-bench"))
        .args([
            "--protocol",
            "rtx",
            "--keys",
            "2000",
            "--objects",
            "4096",
            "--coroutines",
            "4",
            "--processes",
            "2",
            "--duration",
            "1s",
            "--warmup",
            "100ms",
            "--model",
            "none",
        ])
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn a_killed_client_process_is_repaired_around_and_every_acknowledged_key_is_found() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("kill.jsonl");
    let out = index_bench(&[
        "--workload",
        "a,d",
        "--kill-client-after",
        "300ms",
        "--json",
        json.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(
        stdout.matches("client process 0 (pid ").count(),
        2,
        "{stdout}"
    );
    assert_eq!(
        stdout
            .matches("the killed clients' 4 logs finished")
            .count(),
        2,
        "{stdout}"
    );
    // The check counts D's inserts: every acknowledged one is there.
    assert!(
        stdout.contains("Rtx: tree check ok (")
            && stdout.contains("every acknowledged insert present"),
        "{stdout}"
    );
    let recs = common::json_lines(&std::fs::read_to_string(&json).unwrap(), "index-bench");
    let points: Vec<_> = recs.iter().filter(|r| r["record"] == "point").collect();
    assert_eq!(points.len(), 2, "{recs:?}");
    for p in points {
        assert_eq!(p["processes"], 2, "{p}");
        assert_eq!(p["fault"]["kind"], "kill", "{p}");
        assert!(
            p["fault"]["ops_per_s_before"].as_f64().unwrap() > 0.0,
            "{p}"
        );
        assert!(
            p["fault"]["survivors_ops_per_s_after"].as_f64().is_some(),
            "{p}"
        );
        common::check_latency_fields("index-bench", p);
    }
}

#[test]
fn a_client_process_stopped_past_its_leases_is_repaired_and_then_finishes() {
    let _one = serial();
    // Zipf 0.99: the other process meets the stopped one's locks on the hot keys.
    let out = index_bench(&[
        "--workload",
        "a",
        "--zipf",
        "0.99",
        "--stop-client-after",
        "300ms",
        "--stop-ms",
        "200",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("stopped at ") && stdout.contains("for 200 ms"),
        "{stdout}"
    );
    assert!(stdout.contains("Rtx: tree check ok ("), "{stdout}");
}

/// The same two faults on RACE hashing, with inserts that rehash (workload D on a
/// small table): a killed process's rehash, if one was in flight, is repaired by the
/// survivor's next operation on the subtable; a process stopped 40 ms (past its leases,
/// within the bound that keeps its late slot CAS out of reused blocks) is repaired
/// around and then finishes. Every acknowledged key is found exactly once where its
/// hash puts it, no lock is held and every log is DONE.
#[test]
fn race_survives_a_killed_and_a_stopped_client_process() {
    let _one = serial();
    for (fault, seen) in [
        (
            &["--kill-client-after", "300ms"][..],
            "client process 0 (pid ",
        ),
        (
            &["--stop-client-after", "300ms", "--stop-ms", "40"][..],
            "stopped at ",
        ),
    ] {
        let out = index_bench(&[&["--index", "race", "--workload", "a,d"][..], fault].concat());
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{fault:?}\n{stdout}\n{stderr}");
        assert_eq!(stdout.matches(seen).count(), 2, "{fault:?}\n{stdout}");
        assert!(
            stdout.contains("Rtx: table check ok (")
                && stdout.contains("every acknowledged insert present"),
            "{fault:?}\n{stdout}"
        );
    }
}

#[test]
fn fault_flags_without_their_preconditions_are_usage_errors() {
    let _one = serial();
    for (extra, want) in [
        (
            &["--kill-client-after", "300ms"][..],
            "--processes 2 or more",
        ),
        (
            &["--processes", "2", "--kill-client-after", "5s"][..],
            "must lie inside --duration",
        ),
        (
            &[
                "--processes",
                "2",
                "--kill-client-after",
                "100ms",
                "--stop-client-after",
                "100ms",
            ][..],
            "one fault per run",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_index-bench"))
            .args(["--protocol", "rtx", "--duration", "1s"])
            .args(extra)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {stderr}");
        assert!(stderr.contains(want), "{extra:?}: {stderr}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_index-bench"))
        .args([
            "--protocol",
            "all",
            "--processes",
            "2",
            "--kill-client-after",
            "100ms",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--protocol rtx only"), "{stderr}");
}

/// A client whose clock runs ahead by more than DRIFT (5 ms against 2) finds the others'
/// live locks expired and repairs them: false expiries, counted as repairs. Repair is
/// safe against a live owner (its commit is idempotent; the owner's late CASes fail), so
/// every check of the tree still holds.
#[test]
fn clients_with_a_clock_ahead_of_drift_repair_live_rtxs_and_every_check_holds() {
    let _one = serial();
    let out = Command::new(env!("CARGO_BIN_EXE_index-bench"))
        .args([
            "--protocol",
            "rtx",
            "--workload",
            "a",
            "--keys",
            "2000",
            "--objects",
            "4096",
            "--threads",
            "2",
            "--coroutines",
            "4",
            "--duration",
            "1s",
            "--warmup",
            "100ms",
            "--model",
            "none",
            "--zipf",
            "0.99",
            "--clock-skew-ms",
            "5",
            "--drift-ms",
            "2",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("DRIFT 2 ms, the first thread's clients' clocks +5 ms"),
        "{stdout}"
    );
    let repairs: u64 = stdout
        .lines()
        .find(|l| l.contains("Rtx ycsb-A:"))
        .and_then(|l| l.split("repairs ").nth(1))
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no repairs count in {stdout}"));
    assert!(repairs > 0, "false expiries repaired: {stdout}");
    // With no fault injected every repair is a false expiry: its share of the commits is
    // printed, and it is not zero.
    let share: f64 = stdout
        .split("(false expiries: ")
        .nth(1)
        .and_then(|t| t.split('%').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no false-expiry share in {stdout}"));
    assert!(share > 0.0, "{stdout}");
    assert!(stdout.contains("Rtx: tree check ok ("), "{stdout}");
}
