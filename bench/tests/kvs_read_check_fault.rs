//! The KVS check on every read catches a bad value: with every value a transaction reads
//! corrupted on its way in (a fault switch that exists only in test builds; the data in
//! memory stays intact), a ycsb-a run stops with a value-check failure and fails. The
//! switch is process-wide, so this test has a binary of its own.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use bench::txnbench::{run, Args, Outcome};
use clap::Parser;

#[test]
fn a_corrupted_read_fails_the_run() {
    txn::fault::corrupt_reads(true);
    let args = Args::parse_from([
        "txn-bench",
        "--workload",
        "ycsb-a",
        "--protocol",
        "occ-cas",
        "--records",
        "1000",
        "--threads",
        "1",
        "--coroutines",
        "4",
        "--duration",
        "1",
    ]);
    let (summary, outcome) = run(args, Arc::new(AtomicBool::new(false))).expect("run");
    assert_eq!(outcome, Outcome::Failed);
    assert!(!summary.passed);
    let report = &summary.runs[0];
    assert!(report.fatal_errors > 0, "the failure is reported");
    assert!(
        report
            .fatal_samples
            .iter()
            .any(|f| f.contains("value check failed: key ") && f.contains(": checksum ")),
        "{:?}",
        report.fatal_samples
    );
    assert!(!report.passed());
    // Nothing bad was written: the post-run check still finds every value intact.
    let check = report.workload_check.as_deref().unwrap();
    assert!(check.contains("checksums ok"), "{check}");
}
