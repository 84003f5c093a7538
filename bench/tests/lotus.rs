//! Lotus's lock-first protocol end to end (`txn::lotus`): SmallBank and the KVS on
//! `lotus` and `lotus-si` pass every check and post no atomic to a memory node (the
//! locks live in the compute node's lock table, Lotus 4.1; neither workload inserts),
//! where MVCC posts about one per written record; and two coordinator processes lock on
//! each other's tables over RPC (`--cnodes 2`) and pass every check. TATP and TPC-C on
//! Lotus are in their own files; the write-skew and INVISIBLE-rule tests in
//! `write_skew.rs`, `serializability_fault_lotus.rs` and `lotus_invisible_fault.rs`; the
//! resharding move away and back with the source's cache clear planted out in
//! `lotus_reshard_fault.rs`.

mod common;

use std::time::Duration;

/// Memory-node atomics per committed transaction of run `r`.
fn atomics(r: &serde_json::Value) -> f64 {
    r["memnode_ops_per_commit"][2].as_f64().unwrap()
}

#[test]
fn smallbank_on_lotus_takes_no_memory_node_atomics() {
    for (protocol, iso) in [("lotus", "sr"), ("lotus-si", "si")] {
        let (stdout, s) = common::txn_bench(
            &format!("lotus-smallbank-{iso}"),
            &[
                "--protocol",
                protocol,
                "--accounts",
                "2000",
                "--threads",
                "2",
                "--coroutines",
                "8",
                "--duration",
                "1",
            ],
        );
        assert_eq!(s["passed"], true, "{stdout}");
        let r = &s["runs"][0];
        let kinds: Vec<&str> = bench::smallbank::TxnType::ALL
            .iter()
            .map(|t| t.name())
            .collect();
        common::assert_checked_run(r, &kinds, &stdout);
        assert_eq!(atomics(r), 0.0, "{protocol}: {stdout}");
        assert!(
            stdout.contains("Lotus lock table 0"),
            "{protocol}: the lock table is audited\n{stdout}"
        );
    }
    // The baseline of the comparison takes them.
    let (stdout, s) = common::txn_bench(
        "lotus-smallbank-mvcc",
        &[
            "--protocol",
            "mvcc",
            "--accounts",
            "2000",
            "--duration",
            "1",
        ],
    );
    assert!(atomics(&s["runs"][0]) > 0.5, "{stdout}");
}

#[test]
fn kvs_on_lotus_passes_every_check() {
    let (stdout, s) = common::txn_bench(
        "lotus-kvs",
        &[
            "--workload",
            "kvs",
            "--records",
            "2000",
            "--protocol",
            "lotus",
            "--duration",
            "1",
        ],
    );
    assert_eq!(s["passed"], true, "{stdout}");
    common::assert_checked_run(&s["runs"][0], &["read", "update"], &stdout);
    assert_eq!(atomics(&s["runs"][0]), 0.0, "{stdout}");
}

/// Lotus on SmallBank (2,000 accounts) in two compute-node processes of 4 coroutines for
/// 2 s, with `extra` flags: the run passes every check of every type. Returns its
/// output and its report.
fn smallbank_on_two_cnodes(name: &str, extra: &[&str]) -> (String, serde_json::Value) {
    let mut args = vec![
        "--protocol",
        "lotus",
        "--cnodes",
        "2",
        "--accounts",
        "2000",
        "--coroutines",
        "4",
        "--duration",
        "2",
    ];
    args.extend_from_slice(extra);
    let (ok, stdout, s) = common::txn_bench_watched(name, &args, Duration::from_secs(300));
    assert!(ok, "{stdout}");
    let r = s["runs"][0].clone();
    assert_eq!(r["cnodes"], 2, "{stdout}");
    let kinds: Vec<&str> = bench::smallbank::TxnType::ALL
        .iter()
        .map(|t| t.name())
        .collect();
    common::assert_checked_run(&r, &kinds, &stdout);
    (stdout, r)
}

#[test]
fn two_compute_nodes_lock_on_each_others_tables() {
    let (stdout, r) = smallbank_on_two_cnodes("lotus-cnodes", &[]);
    assert_eq!(atomics(&r), 0.0, "{stdout}");
    // Each process's version table cache served its lock holders, and the other
    // node's write grants invalidated entries (the hook on its embedded table).
    let vtc = &r["vtc"];
    assert!(vtc["hits"].as_u64().unwrap_or(0) > 0, "{stdout}");
    assert!(vtc["invalidations"].as_u64().unwrap_or(0) > 0, "{stdout}");
    assert!(stdout.contains("version table cache: "), "{stdout}");
}

/// Lotus 4.3's hybrid routing: `--routing ideal` (each compute node draws read-write
/// transactions whose first account's lock shard it owns) and `--routing forward` (a
/// read-write transaction of the other node's shard is sent there and run by its home
/// coroutines). Every run passes every check (the forwarded transactions are in their
/// home node's history); under `ideal` draws are thrown away (about half the accounts
/// are the other node's) and none is run off its shard, and the lock requests sent to
/// the other node's table per commit fall well below those of `none` (a transaction's
/// first account now always locks locally); under `forward` transactions were
/// forwarded and timed from generation.
#[test]
fn ideal_routing_sends_fewer_lock_requests_to_the_other_compute_node() {
    let run = |routing: &str| {
        let (stdout, r) =
            smallbank_on_two_cnodes(&format!("lotus-routing-{routing}"), &["--routing", routing]);
        assert!(
            r["routing"].as_str().unwrap().starts_with(routing),
            "{stdout}"
        );
        (r, stdout)
    };
    let (none, _) = run("none");
    let (fwd, fwd_out) = run("forward");
    assert!(fwd["forwarded"].as_u64().unwrap_or(0) > 0, "{fwd_out}");
    assert!(
        fwd["forward_p50_p99_us"][1].as_f64().unwrap() > 0.0,
        "{fwd_out}"
    );
    assert!(fwd_out.contains("forwarded: "), "{fwd_out}");
    let (ideal, stdout) = run("ideal");
    assert!(ideal["route_redraws"].as_u64().unwrap_or(0) > 0, "{stdout}");
    assert!(ideal.get("route_misses").is_none(), "{stdout}");
    let msgs = |r: &serde_json::Value| r["rpc_messages_per_commit"].as_f64().unwrap();
    assert!(
        msgs(&ideal) < 0.8 * msgs(&none),
        "lock requests per commit: ideal {} vs none {}",
        msgs(&ideal),
        msgs(&none)
    );
}

/// Lotus 4.1: lock requests from other compute nodes are served on the coordinator
/// threads. With `--lock-serving coordinator` (the default) each compute node's RPC
/// server threads are its 2 coordinator threads (`--threads 2`) and it runs no
/// coordinator thread beside them, as its threads' names say; with `thread` its 2
/// coordinator threads run beside the lock service's own server thread. Both pass every
/// check with forwarding on (the forwarding RPC is served on those threads too), and
/// the header and the report name the placement.
#[test]
fn lock_rpcs_are_served_on_the_coordinator_threads() {
    for (serving, header, (servers, coordinators)) in [
        (
            "coordinator",
            "lock RPCs served on the coordinator threads",
            (2, 0),
        ),
        (
            "thread",
            "lock RPCs served on a server thread of its own",
            (1, 2),
        ),
    ] {
        let (stdout, r) = smallbank_on_two_cnodes(
            &format!("lotus-serving-{serving}"),
            &[
                "--threads",
                "2",
                "--routing",
                "forward",
                "--lock-serving",
                serving,
            ],
        );
        assert_eq!(r["lock_serving"], serving, "{stdout}");
        assert!(stdout.contains(header), "{serving}: {stdout}");
        let want = format!(
            ": {servers} RPC server thread(s), {coordinators} coordinator thread(s) of their own"
        );
        let census: Vec<&str> = r["cnode_events"]
            .as_array()
            .unwrap_or_else(|| panic!("no events: {stdout}"))
            .iter()
            .filter_map(|e| e.as_str())
            .filter(|e| e.contains("RPC server thread(s)"))
            .collect();
        assert_eq!(census.len(), 2, "one per compute node: {stdout}");
        for c in census {
            assert!(
                c.ends_with(&want),
                "{serving}: {c:?}, want {want:?}\n{stdout}"
            );
        }
        assert!(r["forwarded"].as_u64().unwrap_or(0) > 0, "{stdout}");
    }
}

/// Lotus's Fig. 14 ablation in one invocation (`--ablation`): mvcc, then lotus with
/// routing none and no cache, then forward routing, then the version table cache; every
/// row passes every check, each row runs what its label says (the routing line, the
/// forwarded transactions, the cache's hits only in the last row), and the table with
/// the paper's figures and the signs line is printed; two rounds run the rows forward,
/// then backward, and the table gives their medians.
#[test]
fn the_ablation_runs_its_four_rows_in_one_invocation() {
    let (ok, stdout, s) = common::txn_bench_watched(
        "lotus-ablation",
        &[
            "--ablation",
            "--cnodes",
            "2",
            "--accounts",
            "2000",
            "--coroutines",
            "4",
            "--duration",
            "1.5",
            "--ablation-rounds",
            "2",
        ],
        Duration::from_secs(600),
    );
    assert!(ok, "{stdout}");
    let runs = s["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 8, "two rounds of four rows\n{stdout}");
    let kinds: Vec<&str> = bench::smallbank::TxnType::ALL
        .iter()
        .map(|t| t.name())
        .collect();
    for r in runs {
        common::assert_checked_run(r, &kinds, &stdout);
    }
    let protocols: Vec<&str> = runs
        .iter()
        .map(|r| r["protocol"].as_str().unwrap())
        .collect();
    // The second round runs the rows backward.
    assert_eq!(
        protocols,
        ["mvcc", "lotus", "lotus", "lotus", "lotus", "lotus", "lotus", "mvcc"],
        "{stdout}"
    );
    let routing = |i: usize| runs[i]["routing"].as_str().unwrap_or("").to_string();
    assert!(routing(1).starts_with("none"), "{stdout}");
    assert!(routing(2).starts_with("forward"), "{stdout}");
    assert!(runs[2]["forwarded"].as_u64().unwrap_or(0) > 0, "{stdout}");
    let hits = |i: usize| runs[i]["vtc"]["hits"].as_u64().unwrap_or(0);
    assert_eq!(
        (hits(1), hits(2)),
        (0, 0),
        "cache rows before the cache\n{stdout}"
    );
    assert!(hits(3) > 0, "{stdout}");
    assert!(
        stdout.contains("Lotus ablation (Lotus Fig. 14): SmallBank"),
        "{stdout}"
    );
    assert!(stdout.contains("+36.5%"), "{stdout}");
    assert!(stdout.contains("signs: two-level routing "), "{stdout}");
    assert!(
        stdout.contains("| 2 rounds (rows forward, then backward): medians"),
        "{stdout}"
    );
    assert!(stdout.contains(" of 2 rounds)"), "{stdout}");
}

/// `--breakdown` across compute-node processes: each child sends its phase histograms
/// with its stats, and the report has one breakdown row per transaction type and the
/// CPU time of each compute node beside the services'.
#[test]
fn the_breakdown_comes_from_the_compute_node_processes() {
    let (stdout, r) = smallbank_on_two_cnodes("lotus-breakdown", &["--breakdown"]);
    assert!(
        stdout.contains("breakdown (lotus): mean/p99 us"),
        "{stdout}"
    );
    let rows = r["breakdown"].as_array().expect("breakdown rows");
    assert_eq!(rows.len(), 6, "every SmallBank type committed\n{stdout}");
    let committed: u64 = rows.iter().map(|t| t["committed"].as_u64().unwrap()).sum();
    assert!(committed > 0, "{stdout}");
    let cpu = stdout
        .lines()
        .find(|l| l.starts_with("cpu during the run: "))
        .unwrap_or_else(|| panic!("no cpu line\n{stdout}"));
    assert!(
        cpu.contains("txn-bench (parent)")
            && cpu.contains("cnode 0.0")
            && cpu.contains("cnode 1.0"),
        "{cpu}"
    );
}

/// `--reshard-loop`: Lotus 4.3's load-driven resharding loop runs over the two compute
/// nodes' lock services for the whole run (their load samples each 100 ms; the decision
/// itself is tested in lockd's `reshard` module); the run passes every check and the loop
/// reports what it moved.
#[test]
fn the_resharding_loop_runs_beside_lock_first_and_every_check_passes() {
    let (stdout, _) = smallbank_on_two_cnodes("lotus-reshard-loop", &["--reshard-loop"]);
    assert!(
        stdout.contains("reshard loop: ") && stdout.contains(" move(s) published, "),
        "{stdout}"
    );
}

/// Lotus 4.3's resharding under lock-first (the spec's A.9 test 10): 0.8 s into the
/// run, half of compute node 101's shards move to 102 (drain, then the next map on
/// both). Coordinators routing by the old map are told wrong-shard and follow; the run
/// passes every check, commits after the move, and prints the move with its pause.
#[test]
fn a_shard_range_moved_mid_run_passes_every_check() {
    let (stdout, r) = smallbank_on_two_cnodes(
        "lotus-reshard",
        &["--timeline-ms", "10", "--reshard-after", "0.8"],
    );
    assert!(
        stdout.contains(
            "reshard: shards 0..1024 of compute node 101 moved to compute node 102: pause "
        ),
        "{stdout}"
    );
    assert!(
        common::committed_from_ms(&r, 1200) > 0,
        "nothing committed after the move: {stdout}"
    );
}

/// Lotus 6 with a restart: of three coordinator processes one is killed (`kill -9`)
/// and restarted under the same node id. The survivors mark its shards down, one
/// recovers its logged commits and releases its locks in their tables, each confirms
/// once its own attempts from before the death ended, and the restarted node's empty
/// table serves only then (the handshake itself, with its planted bug, is tested in
/// `bench::lotus_cn`). The run passes every check (groups uniform, nothing held,
/// serializability over every life's history), prints the recovery line, and the
/// restarted life commits.
#[test]
fn a_killed_compute_node_restarts_and_serves_its_lock_table_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("history.jsonl");
    let (ok, stdout, s) = common::txn_bench_watched(
        "lotus-cn-restart",
        &[
            "--workload",
            "pairs",
            "--protocol",
            "lotus",
            "--cnodes",
            "3",
            "--coroutines",
            "4",
            "--groups",
            "2000",
            "--duration",
            "3",
            "--kill-cn-after",
            "1",
            "--restart",
            "--history-out",
            path.to_str().unwrap(),
        ],
        Duration::from_secs(300),
    );
    assert!(ok, "a check failed after the kill and restart:\n{stdout}");
    let r = &s["runs"][0];
    common::assert_checked_run(r, &["write-group", "read-group"], &stdout);
    let events: Vec<&str> = r["cnode_events"]
        .as_array()
        .unwrap_or_else(|| panic!("no events: {stdout}"))
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("recovery: cn 2 incarnation 0 dead at")
                && e.contains("locks free after")
                && e.contains("done in")),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e.contains("restarted") && e.contains("incarnation 1")),
        "{events:?}"
    );
    let mut per_incarnation = [0u64; 2];
    for l in std::fs::read_to_string(&path).unwrap().lines() {
        let l: bench::history_out::HistoryLine = serde_json::from_str(l).unwrap();
        if l.cnode == 2 {
            per_incarnation[l.incarnation as usize] += 1;
        }
    }
    assert!(
        per_incarnation.iter().all(|&n| n > 0),
        "the killed node's lives committed {per_incarnation:?}\n{stdout}"
    );
    assert_eq!(atomics(r), 0.0, "{stdout}");
}

/// Lotus 6 without a restart: the survivors recover the killed compute node and then
/// share its shards among themselves (once every survivor confirmed that no lock of
/// its table is in use), so transactions that need those shards commit again. Without
/// the takeover its shards stay down, every transaction on one of them aborts
/// (`cn-down`) and is retried for ever, and at Zipf 0.99 every coordinator soon
/// retries one: nothing commits after the kill.
#[test]
fn a_killed_compute_node_not_restarted_hands_its_shards_to_the_survivors() {
    let (ok, stdout, s) = common::txn_bench_watched(
        "lotus-cn-takeover",
        &[
            "--workload",
            "pairs",
            "--protocol",
            "lotus",
            "--cnodes",
            "3",
            "--coroutines",
            "4",
            "--groups",
            "2000",
            "--duration",
            "3",
            "--kill-cn-after",
            "1",
            "--timeline-ms",
            "100",
        ],
        Duration::from_secs(300),
    );
    assert!(ok, "a check failed after the kill:\n{stdout}");
    let r = &s["runs"][0];
    common::assert_checked_run(r, &["write-group", "read-group"], &stdout);
    // Commits in the last second (the kill came at 1 s of 3).
    let late = common::committed_from_ms(r, 2000);
    assert!(late > 0, "nothing committed after 2 s:\n{stdout}");
}

/// A compute node stopped (SIGSTOP) past its lease: its lock service answers nobody,
/// so the others' lock RPCs to it wait until its lease ends; then it is declared dead,
/// fenced, recovered and its shards taken over, and after SIGCONT it finds its lease
/// gone and exits without touching anything. Every check holds and the survivors commit
/// again before the run ends.
#[test]
fn a_compute_node_stopped_past_its_lease_is_recovered_and_replaced() {
    let (ok, stdout, s) = common::txn_bench_watched(
        "lotus-cn-stop",
        &[
            "--workload",
            "pairs",
            "--protocol",
            "lotus",
            "--cnodes",
            "3",
            "--coroutines",
            "4",
            "--groups",
            "2000",
            "--duration",
            "5",
            "--stop-cn-after",
            "1",
            "--stop-ms",
            "3000",
            "--timeline-ms",
            "100",
        ],
        Duration::from_secs(300),
    );
    assert!(ok, "a check failed after the stop:\n{stdout}");
    let r = &s["runs"][0];
    common::assert_checked_run(r, &["write-group", "read-group"], &stdout);
    let events = r["cnode_events"].to_string();
    assert!(events.contains("stopped (SIGSTOP)"), "{events}");
    assert!(
        events.contains("recovery: cn 2 incarnation 0 dead at"),
        "{events}"
    );
    let late = common::committed_from_ms(r, 4000);
    assert!(late > 0, "nothing committed after 4 s:\n{stdout}");
}
