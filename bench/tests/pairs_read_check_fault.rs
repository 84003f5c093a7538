//! The pairs workload's check of every committed read fails the run: with every value a
//! transaction reads corrupted on its way in (a fault switch that exists only in test
//! builds; the data in memory stays intact), a read of a group no longer decodes, the
//! run stops with a value-check failure and fails. The post-run audit, which reads
//! outside transactions, still finds every group uniform. The switch is process-wide,
//! so this test has a binary of its own.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use bench::txnbench::{run, Args, Outcome};
use clap::Parser;

#[test]
fn a_corrupted_group_read_fails_the_run() {
    txn::fault::corrupt_reads(true);
    let args = Args::parse_from([
        "txn-bench",
        "--workload",
        "pairs",
        "--groups",
        "200",
        "--protocol",
        "occ-cas",
        "--threads",
        "1",
        "--coroutines",
        "4",
        "--duration",
        "1",
    ]);
    let (summary, outcome) = run(args, Arc::new(AtomicBool::new(false))).expect("run");
    assert_eq!(outcome, Outcome::Failed);
    let report = &summary.runs[0];
    assert!(report.fatal_errors > 0, "the failure is reported");
    assert!(
        report
            .fatal_samples
            .iter()
            .any(|f| f.contains("value check failed: pairs: a committed read of group ")),
        "{:?}",
        report.fatal_samples
    );
    assert!(!report.passed());
    let check = report.workload_check.as_deref().unwrap();
    assert!(
        check.starts_with("pairs: 200 groups of 3: uniform"),
        "{check}"
    );
}
