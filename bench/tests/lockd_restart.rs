//! The lock service killed and restarted mid-run (`txn-bench --kill-lockd-after`), with
//! Scythe's coordinators inside txn-bench (SmallBank: the money audit) and in two
//! coordinator processes (pairs: every group uniform). The restarted `lockd` opens a
//! larger epoch from its state directory and grants nothing for its grace period, longer
//! than the coordinators' ticket lease, so that no holder of a dead service's ticket
//! still writes when a lock is granted anew; the coordinators reconnect, commits go on,
//! and every check holds: the workload's, serializability over the whole run, and no
//! lock held at the end. Also a memory node that serves its partition's locks,
//! SIGSTOPped past the RPC timeout and continued.

mod common;

use std::time::Duration;

use bench::smallbank::TxnType;

/// SmallBank's transaction types, in report order.
fn smallbank() -> Vec<&'static str> {
    TxnType::ALL.iter().map(|t| t.name()).collect()
}

/// The `lockd restart` record of run `r`: a larger epoch, commits after the restart,
/// and every coordinator thread reconnected once.
fn assert_survived(r: &serde_json::Value, threads: usize, stdout: &str) {
    let l = &r["lockd_restart"];
    assert!(
        l["epoch_after"].as_u64().unwrap() > l["epoch_before"].as_u64().unwrap(),
        "{stdout}"
    );
    assert!(l["committed_after_ready"].as_u64().unwrap() > 0, "{stdout}");
    let reconnects: Vec<u64> = l["thread_reconnects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    assert_eq!(reconnects.len(), threads, "{stdout}");
    assert!(
        reconnects.iter().all(|&n| n >= 1),
        "{reconnects:?}\n{stdout}"
    );
    assert!(stdout.contains("lockd restart: SIGKILL at"), "{stdout}");
    assert!(stdout.contains(": survived"), "{stdout}");
}

#[test]
fn scythe_survives_a_lockd_restart_inside_txn_bench() {
    let args = [
        &[
            "--protocol",
            "scythe",
            "--workload",
            "smallbank",
            "--coroutines",
            "8",
            "--duration",
            "3.5",
            "--kill-lockd-after",
            "1",
            "--lockd-down-ms",
            "200",
        ][..],
        &common::model("cx5"),
    ]
    .concat();
    let (ok, stdout, sum) =
        common::txn_bench_watched("lockd-restart", &args, Duration::from_secs(300));
    assert!(ok, "{stdout}");
    let r = &sum["runs"][0];
    common::assert_checked_run(r, &smallbank(), &stdout);
    assert_survived(r, 1, &stdout);
}

#[test]
fn scythe_coordinator_processes_survive_a_lockd_restart() {
    let (ok, stdout, sum) = common::txn_bench_watched(
        "lockd-restart-cn",
        &[
            "--protocol",
            "scythe",
            "--workload",
            "pairs",
            "--groups",
            "2000",
            "--cnodes",
            "2",
            "--threads",
            "1",
            "--coroutines",
            "4",
            "--model",
            "cx5",
            "--duration",
            "3.5",
            "--kill-lockd-after",
            "1",
            "--lockd-down-ms",
            "200",
            "--timeline-ms",
            "100",
            // No false suspicion on a loaded machine: a coordinator declared dead would
            // leave before it reported its reconnects.
            "--lease-ms",
            "3000",
        ],
        Duration::from_secs(300),
    );
    assert!(ok, "{stdout}");
    let r = &sum["runs"][0];
    common::assert_checked_run(r, &["write-group", "read-group"], &stdout);
    assert_survived(r, 2, &stdout);
    assert!(
        stdout.contains("recovery: lockd killed at"),
        "no timeline recovery line\n{stdout}"
    );
}

/// A memory node serving its partition's Takeout Locks (`--lock-placement memnode`, the
/// default here) SIGSTOPped for 2.5 s, longer than the runtime's 2 s call timeout:
/// Lock RPCs to it wait, time out and are retried, and the requests given up on are
/// abandoned at the service once it runs again; after SIGCONT commits go on, and every
/// check holds (money, serializability, no lock left held).
#[test]
fn scythe_survives_a_stopped_memnode_that_serves_its_locks() {
    let args = [
        &[
            "--protocol",
            "scythe",
            "--workload",
            "smallbank",
            "--accounts",
            "10000",
            "--coroutines",
            "4",
            "--duration",
            "5",
            "--stop-memnode-after",
            "1",
            "--stop-ms",
            "2500",
            "--timeline-ms",
            "100",
        ][..],
        &common::model("cx5"),
    ]
    .concat();
    let (ok, stdout, sum) =
        common::txn_bench_watched("memnode-stop", &args, Duration::from_secs(300));
    assert!(ok, "{stdout}");
    assert!(
        stdout.contains("Scythe's locks on the memnodes"),
        "{stdout}"
    );
    assert!(
        stdout.contains("memnode stop: memory node 0 (pid "),
        "{stdout}"
    );
    let r = &sum["runs"][0];
    common::assert_checked_run(r, &smallbank(), &stdout);
    assert_eq!(r["lockd_locks_held"], 0, "{stdout}");
    // Commits after the memory node ran again (SIGCONT at 3.5 s).
    assert!(
        common::committed_from_ms(r, 3800) > 0,
        "nothing committed after SIGCONT: {stdout}"
    );
}
