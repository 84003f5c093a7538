//! FORD's backup-enabled reads (`--ford-backup-reads`, occ-cas over replicas) are kept to
//! read-only transactions because a backup's lock word never shows a writer's lock: a
//! read-write transaction that validates an object it only read on a backup passes
//! while another transaction holds that object locked at the primary, so write skew
//! commits. The control run (read-only transactions on backups, as built) is
//! serializable; with the fault switch that extends backup reads to read-write
//! transactions, the serializability check catches the write skew and the run fails.
//! The switch is process-wide, so this test has a binary of its own.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use bench::txnbench::{run, Args, Outcome};
use clap::Parser;

/// YCSB-A over 64 hot keys (Zipf 0.99), 4 operations a transaction (reads of some keys,
/// updates of others), two copies of each of two partitions, backup reads on.
fn args() -> Args {
    Args::parse_from([
        "txn-bench",
        "--workload",
        "ycsb-a",
        "--records",
        "64",
        "--theta",
        "0.99",
        "--protocol",
        "occ-cas",
        "--memnodes",
        "2",
        "--replicas",
        "2",
        "--ford-backup-reads",
        "--threads",
        "1",
        "--coroutines",
        "16",
        "--duration",
        "2",
    ])
}

#[test]
fn backup_reads_in_read_write_transactions_commit_write_skew_and_are_caught() {
    let (summary, outcome) = run(args(), Arc::new(AtomicBool::new(false))).expect("control run");
    let r = &summary.runs[0];
    assert_eq!(outcome, Outcome::Passed, "{:?}", r.serializability);
    assert_eq!(r.serializable, Some(true));
    let committed: u64 = r.types.iter().map(|t| t.committed).sum();
    assert!(
        committed > 300,
        "too few commits to mean anything: {committed}"
    );

    txn::fault::ford_backup_reads_in_read_write(true);
    let (summary, outcome) = run(args(), Arc::new(AtomicBool::new(false))).expect("planted run");
    txn::fault::ford_backup_reads_in_read_write(false);
    let r = &summary.runs[0];
    assert_eq!(
        outcome,
        Outcome::Failed,
        "the planted write skew went unnoticed"
    );
    assert_eq!(r.serializable, Some(false), "{:?}", r.serializability);
}
