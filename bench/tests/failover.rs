//! Memory-node failover (the replication design's B.6.4 and B.8), end to end: the real
//! `txn-bench` SIGKILLs memory node 0 (the primary of partition 0) mid-run and fails it
//! over to the partition's backup, under every protocol. A run passes only if the money
//! (or the pairs' groups) check out on the new primaries, the history is serializable,
//! no lock is left, every object written by a committed transaction holds its last
//! committed version (the durability check), and the surviving copies are identical.
//!
//! - With a planted bug that acknowledges commits whose backup install was skipped,
//!   the failover loses committed versions and the run fails.
//! - With one copy, the run stops and names the partition that died.

mod common;

use std::time::Duration;

use common::{txn_bench_watched, txn_bench_watched_env};

const LIMIT: Duration = Duration::from_secs(240);

fn failover_args<'a>(workload: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![
        "--workload",
        workload,
        "--protocol",
        "all",
        "--memnodes",
        "3",
        "--replicas",
        "2",
        "--kill-memnode-after",
        "1",
        "--memnode",
        "0",
        "--duration",
        "2.5",
        "--coroutines",
        "4",
        "--timeline-ms",
        "10",
        "--each-type-first",
    ];
    a.extend_from_slice(extra);
    a
}

fn assert_failed_over(stdout: &str, s: &serde_json::Value, n: usize) {
    assert_eq!(s["passed"], true, "{stdout}");
    let runs = s["runs"].as_array().unwrap();
    assert_eq!(runs.len(), n, "{stdout}");
    for r in runs {
        let p = r["protocol"].as_str().unwrap();
        let f = &r["failover"];
        assert_eq!(f["memnode"], 0, "{p}: {stdout}");
        assert_eq!(f["promoted"], serde_json::json!([0]), "{p}: {stdout}");
        assert_eq!(f["lost"], serde_json::json!([]), "{p}");
        assert_eq!(f["epoch"], 2, "{p}");
        assert_eq!(r["durable"], true, "{p}: {stdout}");
        assert_eq!(r["replicas_identical"], true, "{p}: {stdout}");
        assert_eq!(r["locks_held"], 0, "{p}: {stdout}");
        assert_eq!(r["serializable"], true, "{p}: {stdout}");
        // Commits went on after the failover.
        let line = r["durability"].as_str().unwrap();
        assert!(line.contains("hold their last committed version"), "{line}");
    }
    assert!(stdout.contains("failover: memnode 0 dead at "), "{stdout}");
    assert!(
        stdout.contains("replicas: 3 partitions x 0 backups"),
        "{stdout}"
    );
}

#[test]
fn a_killed_primary_loses_no_committed_money() {
    let args = failover_args("smallbank", &["--accounts", "10000"]);
    let (ok, stdout, s) = txn_bench_watched("fo-smallbank", &args, LIMIT);
    assert!(ok, "{stdout}");
    assert_failed_over(&stdout, &s, 3);
    for r in s["runs"].as_array().unwrap() {
        assert_eq!(r["invariant_holds"], true, "{stdout}");
    }
}

#[test]
fn a_killed_primary_leaves_every_group_uniform() {
    // occ-cas: over replicas it commits as FORD (undo logs, invisible marks).
    let args = failover_args(
        "pairs",
        &[
            "--groups",
            "2000",
            "--group-size",
            "3",
            "--protocol",
            "occ-cas",
        ],
    );
    let (ok, stdout, s) = txn_bench_watched("fo-pairs", &args, LIMIT);
    assert!(ok, "{stdout}");
    assert_failed_over(&stdout, &s, 1);
}

#[test]
fn commits_acknowledged_without_their_backup_are_lost_and_caught() {
    let args = failover_args("smallbank", &["--accounts", "10000", "--protocol", "mvcc"]);
    let (ok, stdout, s) = txn_bench_watched_env(
        "fo-planted",
        &args,
        &[("TXN_SKIP_BACKUP_INSTALL", "10")],
        LIMIT,
    );
    assert!(!ok, "the planted bug went unnoticed: {stdout}");
    let r = &s["runs"][0];
    assert_eq!(r["durable"], false, "{stdout}");
    assert!(
        stdout.contains("LOST their last committed version"),
        "{stdout}"
    );
}

#[test]
fn with_one_copy_the_run_stops_and_names_the_lost_partition() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_txn-bench"))
        .args([
            "--protocol",
            "occ-cas",
            "--memnodes",
            "2",
            "--kill-memnode-after",
            "0.5",
            "--memnode",
            "1",
            "--duration",
            "2",
            "--accounts",
            "10000",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("memory node 1 died and partition(s) [1] with it"),
        "{stderr}"
    );
}

#[test]
fn bad_failover_flags_are_refused() {
    for (args, want) in [
        (
            &[
                "--kill-memnode-after",
                "1",
                "--memnode",
                "3",
                "--memnodes",
                "3",
            ][..],
            "--memnode 3 must be below --memnodes 3",
        ),
        (
            &["--kill-memnode-after", "9", "--duration", "2"],
            "--kill-memnode-after must lie within the run",
        ),
        (
            &["--kill-memnode-after", "1", "--cnodes", "2"],
            "--kill-memnode-after runs with the coordinators inside txn-bench",
        ),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_txn-bench"))
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
}
