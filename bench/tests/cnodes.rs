//! Coordinator processes end to end (`txn-bench --cnodes N`): two `cnode` children
//! running the pairs workload pass every check of the merged report; one stopped and
//! continued loses nothing; with one of them killed and restarted the run still
//! finishes, reports the death, and merges the commits of both incarnations.

mod common;

use std::time::Duration;

use bench::history_out::HistoryLine;

#[test]
fn two_cnodes_pass_every_check() {
    let (ok, stdout, sum) = common::txn_bench_watched(
        "cnodes-2",
        &[
            "--workload",
            "pairs",
            "--cnodes",
            "2",
            "--memnodes",
            "2",
            "--threads",
            "1",
            "--coroutines",
            "4",
            "--groups",
            "2000",
            "--duration",
            "2",
            "--timeline-ms",
            "100",
        ],
        Duration::from_secs(300),
    );
    assert!(ok, "{stdout}");
    let r = &sum["runs"][0];
    common::assert_checked_run(r, &["write-group", "read-group"], &stdout);
    assert_eq!(r["cnodes"], 2);
    let rows = r["timeline"]["cnodes"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for row in rows {
        let n: u64 = row["commits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .sum();
        assert!(n > 0, "{row}");
    }
    assert!(common::committed(r) > 0);
}

#[test]
fn a_killed_and_restarted_cnode_is_reported_and_both_incarnations_count() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("history.jsonl");
    // Skewed groups: the killed coordinator dies holding locks (and
    // perhaps mid-commit); the parent recovers it before its next incarnation starts,
    // and every check must pass: the pairs (every group uniform, every committed group
    // read uniform), locks held after the run 0 (CVT words, tickets), serializability
    // over both incarnations' histories.
    let (ok, stdout, sum) = common::txn_bench_watched(
        "cnodes-kill",
        &[
            "--workload",
            "pairs",
            "--protocol",
            "mvcc",
            "--cnodes",
            "2",
            "--memnodes",
            "2",
            "--threads",
            "1",
            "--coroutines",
            "4",
            "--groups",
            "20000",
            "--theta",
            "0.9",
            "--duration",
            "3",
            "--kill-cn-after",
            "1",
            "--restart",
            "--timeline-ms",
            "100",
            "--history-out",
            path.to_str().unwrap(),
        ],
        Duration::from_secs(300),
    );
    assert!(
        ok,
        "a check failed after the kill and the recovery:\n{stdout}"
    );
    let runs = sum["runs"].as_array().unwrap();
    for r in runs {
        let events = cnode_events(r, &stdout);
        assert!(
            events
                .iter()
                .any(|e| e.starts_with("recovery: cn 1 incarnation 0 dead at")
                    && e.contains("lock words swept")
                    && e.contains("done in")),
            "{events:?}"
        );
        assert!(common::committed(r) > 0);
    }
    let r = &runs[0];
    let events = cnode_events(r, &stdout);
    assert!(
        events.iter().any(|e| e.starts_with("cnode 1 (pid ")
            && e.contains("died at")
            && e.contains("signal 9")),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e.contains("restarted") && e.contains("incarnation 1")),
        "{events:?}"
    );
    assert!(stdout.contains("recovery: cnode 1 killed at"), "{stdout}");
    let mut per_incarnation = [0u64; 2];
    for l in std::fs::read_to_string(&path).unwrap().lines() {
        let l: HistoryLine = serde_json::from_str(l).unwrap();
        if l.cnode == 1 {
            per_incarnation[l.incarnation as usize] += 1;
        }
    }
    assert!(
        per_incarnation.iter().all(|&n| n > 0),
        "{per_incarnation:?}\n{stdout}"
    );
    assert!(common::committed(r) > 0);
}

#[test]
fn a_stopped_and_continued_cnode_loses_nothing() {
    // SIGSTOP freezes a coordinator with whatever locks it holds; after SIGCONT it
    // finishes its transactions, so every check must pass, and the timeline says when
    // throughput came back.
    let (ok, stdout, sum) = common::txn_bench_watched(
        "cnodes-stop",
        &[
            "--workload",
            "pairs",
            "--protocol",
            "occ-cas",
            "--cnodes",
            "2",
            "--memnodes",
            "2",
            "--threads",
            "1",
            "--coroutines",
            "4",
            "--groups",
            "5000",
            "--theta",
            "0",
            "--duration",
            "2",
            "--stop-cn-after",
            "0.5",
            "--stop-ms",
            "300",
            "--cn",
            "0",
            "--timeline-ms",
            "50",
        ],
        Duration::from_secs(300),
    );
    assert!(ok, "{stdout}");
    let r = &sum["runs"][0];
    common::assert_checked_run(r, &["write-group", "read-group"], &stdout);
    let events = r["cnode_events"].to_string();
    assert!(
        events.contains("cnode 0 (pid ") && events.contains("stopped (SIGSTOP)"),
        "{events}"
    );
    assert!(events.contains("continued (SIGCONT)"), "{events}");
    assert!(!events.contains("died"), "{events}");
    let rec = &r["timeline"]["recovery"];
    assert_eq!(rec["fault"]["cnode"], 0, "{rec}");
    assert!(rec["survivors_pre_fault"].as_f64().unwrap() > 0.0, "{rec}");
}

/// SmallBank under every protocol with a coordinator process killed mid-run and
/// restarted: the dead life is recovered (its logged commits finished or undone, its
/// locks and tickets released) before its next incarnation starts, and every check
/// holds: money, locks held after the run 0, serializability over every incarnation.
#[test]
fn every_protocol_recovers_a_killed_cnode_on_smallbank() {
    // In the Soft-RoCE VM (verbs, a software-emulated CPU) a process can stall for
    // most of a second: a 1 s lease would declare live coordinators dead.
    let lease = if std::env::var("RRPC_FABRIC").as_deref() == Ok("verbs") {
        "4000"
    } else {
        "1000"
    };
    let (ok, stdout, sum) = common::txn_bench_watched(
        "cnodes-kill-sb",
        &[
            "--lease-ms",
            lease,
            "--workload",
            "smallbank",
            "--accounts",
            "10000",
            "--protocol",
            "all",
            "--cnodes",
            "3",
            "--threads",
            "1",
            "--coroutines",
            "4",
            "--duration",
            "3",
            "--kill-cn-after",
            "1",
            "--cn",
            "0",
            "--restart",
            // Every type once first: in the Soft-RoCE VM, Scythe committed 36
            // transactions in 3 s once and none of them a WriteCheck.
            "--each-type-first",
        ],
        Duration::from_secs(400),
    );
    assert!(
        ok,
        "a check failed after the kill and the recovery:\n{stdout}"
    );
    let runs = sum["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3, "{stdout}");
    for r in runs {
        let events = cnode_events(r, &stdout);
        // Recovered by a surviving coordinator process (chosen by its claim in etcd),
        // not by the launcher.
        assert!(
            events
                .iter()
                .any(|e| e.starts_with("recovery: cn 0 incarnation 0 dead at")
                    && (e.ends_with(", by cn 1") || e.ends_with(", by cn 2"))),
            "{events:?}"
        );
        assert!(common::committed(r) > 0);
    }
}

/// Scythe with its locks on the memory nodes (`--lock-placement memnode`: no lockd node,
/// each memory node serving its partition's Takeout Locks): a coordinator process
/// SIGKILLed mid-run holding tickets at both memory nodes' lock services is recovered
/// by a survivor, which releases its tickets at every service, and every check holds
/// (money, serializability over both incarnations, no lock left held anywhere).
#[test]
fn scythe_with_its_locks_on_the_memnodes_recovers_a_killed_cnode() {
    let lease = if std::env::var("RRPC_FABRIC").as_deref() == Ok("verbs") {
        "4000"
    } else {
        "1000"
    };
    let (ok, stdout, sum) = common::txn_bench_watched(
        "cnodes-kill-memnode-locks",
        &[
            "--lease-ms",
            lease,
            "--workload",
            "smallbank",
            "--accounts",
            "10000",
            "--protocol",
            "scythe",
            "--lock-placement",
            "memnode",
            "--memnodes",
            "2",
            "--cnodes",
            "3",
            "--threads",
            "1",
            "--coroutines",
            "4",
            "--duration",
            "3",
            "--kill-cn-after",
            "1",
            "--cn",
            "0",
            "--restart",
            "--each-type-first",
        ],
        Duration::from_secs(400),
    );
    assert!(
        ok,
        "a check failed after the kill and the recovery:\n{stdout}"
    );
    assert!(
        stdout.contains("Scythe's locks on the memnodes"),
        "{stdout}"
    );
    let runs = sum["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "{stdout}");
    let r = &runs[0];
    assert_eq!(r["lockd_locks_held"], 0, "{stdout}");
    let events = cnode_events(r, &stdout);
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("recovery: cn 0 incarnation 0 dead at")
                && (e.ends_with(", by cn 1") || e.ends_with(", by cn 2"))),
        "{events:?}"
    );
    assert!(common::committed(r) > 0);
}

/// A coordinator process stopped (SIGSTOP) past its lease: etcd declares it dead, the
/// memory nodes (and lockd) fence its incarnation, the parent recovers it while it is
/// still stopped; when it continues (SIGCONT) its late WRITEs, CASes and ticket
/// releases fail, it finds its lease gone and exits, and every check holds.
#[test]
fn a_cnode_stopped_past_its_lease_is_fenced_and_recovered() {
    let (ok, stdout, sum) = common::txn_bench_watched(
        "cnodes-stop-lease",
        &[
            "--workload",
            "pairs",
            "--protocol",
            "all",
            "--cnodes",
            "3",
            "--threads",
            "1",
            "--coroutines",
            "4",
            "--groups",
            "2000",
            "--duration",
            "6",
            "--stop-cn-after",
            "1",
            "--stop-ms",
            "3500",
        ],
        Duration::from_secs(400),
    );
    assert!(
        ok,
        "a check failed after the stop and the recovery:\n{stdout}"
    );
    let runs = sum["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3, "{stdout}");
    for r in runs {
        let events = cnode_events(r, &stdout);
        assert!(
            events.iter().any(|e| e.contains("lease ended at")),
            "{events:?}"
        );
        assert!(
            events
                .iter()
                .any(|e| e.starts_with("recovery: cn 2 incarnation 0 dead at")
                    && (e.ends_with(", by cn 0") || e.ends_with(", by cn 1"))),
            "{events:?}"
        );
        assert!(common::committed(r) > 0);
    }
}

/// A coordinator process that dies at each crash point of its commit (test builds:
/// `TXN_CRASH_AT`, aborting the process there, for compute node 1 only), under every
/// protocol: the recovery rolls its commit forward or back, and every check holds.
#[test]
fn a_cnode_killed_at_each_crash_point_is_recovered() {
    for point in [
        "after-lock",
        "after-log",
        "after-first-install",
        "after-installs",
        "after-first-unlock",
    ] {
        let crash = format!("{point}:300");
        let (ok, stdout, sum) = common::txn_bench_watched_env(
            &format!("cnodes-crash-{point}"),
            &[
                "--workload",
                "pairs",
                "--protocol",
                "all",
                "--cnodes",
                "2",
                "--threads",
                "1",
                "--coroutines",
                "4",
                "--groups",
                "2000",
                "--duration",
                "2",
            ],
            &[("TXN_CRASH_AT", &crash), ("TXN_CRASH_AT_CN", "1")],
            Duration::from_secs(300),
        );
        assert!(
            ok,
            "{point}: a check failed after the crash and the recovery:\n{stdout}"
        );
        for r in sum["runs"].as_array().unwrap() {
            let events = cnode_events(r, &stdout);
            assert!(
                events
                    .iter()
                    .any(|e| e.starts_with("cnode 1 (pid ") && e.contains("died")),
                "{point}: {events:?}"
            );
            assert!(
                events
                    .iter()
                    .any(|e| e.starts_with("recovery: cn 1 incarnation 0 dead at")),
                "{point}: {events:?}"
            );
        }
    }
}

/// A run's compute-node events (deaths, restarts, recovery lines) from its JSON report.
fn cnode_events<'a>(r: &'a serde_json::Value, stdout: &str) -> Vec<&'a str> {
    r["cnode_events"]
        .as_array()
        .unwrap_or_else(|| panic!("no events: {stdout}"))
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect()
}

/// With no other coordinator process alive, nobody can claim a dead life's recovery
/// but the launcher: it recovers the life itself (its recovery line says so), then
/// restarts the node, and every check holds.
#[test]
fn the_launcher_recovers_when_no_coordinator_survives() {
    let (ok, stdout, sum) = common::txn_bench_watched(
        "cnodes-alone",
        &[
            "--workload",
            "pairs",
            "--protocol",
            "scythe",
            "--cnodes",
            "1",
            "--threads",
            "1",
            "--coroutines",
            "4",
            "--groups",
            "2000",
            "--duration",
            "2",
            "--kill-cn-after",
            "0.7",
            "--restart",
        ],
        Duration::from_secs(300),
    );
    assert!(ok, "{stdout}");
    let r = &sum["runs"][0];
    common::assert_checked_run(r, &["write-group", "read-group"], &stdout);
    let events = cnode_events(r, &stdout);
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("recovery: cn 0 incarnation 0 dead at")
                && e.ends_with(", by the launcher")),
        "{events:?}"
    );
}

/// The commit log in the installs' round (`--log-placement ordered`: per memory node the
/// log WRITE and the installs as one ordered WR list): a coordinator process killed
/// mid-run under every protocol is recovered from such logs, and every check holds (the
/// groups uniform over two memory nodes, nothing held, serializability).
#[test]
fn a_killed_cnode_is_recovered_from_ordered_logs() {
    let (ok, stdout, sum) = common::txn_bench_watched(
        "cnodes-ordered-log",
        &[
            "--workload",
            "pairs",
            "--protocol",
            "all",
            "--log-placement",
            "ordered",
            "--memnodes",
            "2",
            "--cnodes",
            "2",
            "--threads",
            "1",
            "--coroutines",
            "4",
            "--groups",
            "2000",
            "--duration",
            "2.5",
            "--kill-cn-after",
            "1",
            "--restart",
        ],
        Duration::from_secs(400),
    );
    assert!(ok, "a check failed after the kill:\n{stdout}");
    let runs = sum["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3, "{stdout}");
    for r in runs {
        common::assert_checked_run(r, &["write-group", "read-group"], &stdout);
        let events = cnode_events(r, &stdout);
        assert!(
            events
                .iter()
                .any(|e| e.starts_with("recovery: cn 1 incarnation 0 dead at")),
            "{events:?}"
        );
    }
}

/// TPC-C through the range index on two coordinator processes, one of them disturbed
/// by `fault` (kill or stop flags), 3 s: the run must pass with consistency 1-4 and the
/// index audit (tree sound, every NEW_ORDER and ORDER_LINE row indexed). Returns the
/// run's cnode events.
fn range_index_run_with(name: &str, fault: &[&str]) -> Vec<String> {
    let mut args = vec![
        "--workload",
        "tpcc",
        "--range-index",
        "--warehouses",
        "2",
        "--versions",
        "2",
        "--protocol",
        "occ-cas",
        "--cnodes",
        "2",
        "--threads",
        "1",
        "--coroutines",
        "4",
        "--duration",
        "3",
    ];
    args.extend_from_slice(fault);
    let (ok, stdout, sum) = common::txn_bench_watched(name, &args, Duration::from_secs(300));
    assert!(ok, "a check failed after {fault:?}:\n{stdout}");
    let r = &sum["runs"][0];
    let check = r["workload_check"].as_str().unwrap();
    assert!(
        check.starts_with("consistency 1-4: ok (20 districts)"),
        "{check}"
    );
    assert!(check.contains("tree sound"), "{check}");
    assert!(check.ends_with("every row indexed"), "{check}");
    cnode_events(r, &stdout)
        .into_iter()
        .map(str::to_string)
        .collect()
}

/// TPC-C through the range index with a coordinator process killed and restarted: the
/// others repair what the dead life left as they meet it, the restarted life reuses its
/// rTX IDs at a new incarnation (`rtx::Client::recover`: its logs finished, its blocks
/// taken back), the other process keeps splitting leaves, and every check holds. This run
/// found three races in the allocator's restart, each of which corrupted the tree (a
/// block another client reused during the restart's scan; foreign blocks held past a full
/// reclamation table; a stale entry of the restarting ID's own table, naming a block the
/// chunk's owner was reusing), each now a unit test in `rtx::alloc`.
#[test]
fn a_killed_and_restarted_cnode_keeps_the_range_index_sound() {
    let events = range_index_run_with("cnodes-range-index", &["--kill-cn-after", "1", "--restart"]);
    assert!(
        events
            .iter()
            .any(|e| e.contains("restarted") && e.contains("incarnation 1")),
        "{events:?}"
    );
}

/// TPC-C through the range index with a coordinator process stopped (SIGSTOP) for
/// 300 ms, far past an rTX lease (8 ms plus the hold estimate) but within the process's
/// membership lease: the others repair any index lock it held (a false suspicion, rTX
/// 4.3), it continues, and every check holds.
#[test]
fn a_stopped_cnode_leaves_the_range_index_sound() {
    let events = range_index_run_with(
        "cnodes-range-index-stop",
        &["--stop-cn-after", "1", "--stop-ms", "300"],
    );
    assert!(
        events.iter().any(|e| e.contains("stopped (SIGSTOP)")),
        "{events:?}"
    );
}
