//! A write-back that fails still passes every lock on: the run stops with a service
//! failure, and no lock is left held or queued. (A fault switch that exists only in test
//! builds makes write-back fail; it is process-wide, so this test has a binary of its own.)

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use bench::txnbench::{run, Args, Outcome};
use clap::Parser;

#[test]
fn failed_write_back_releases_its_locks() {
    txn::fault::fail_write_back(true);
    let args = Args::parse_from([
        "txn-bench",
        "--accounts",
        "1000",
        "--threads",
        "1",
        "--coroutines",
        "8",
        "--duration",
        "2",
    ]);
    let (report, outcome) = run(args, Arc::new(AtomicBool::new(false))).expect("run");
    assert_eq!(outcome, Outcome::Failed);
    assert!(report.fatal_errors > 0, "the failure is reported");
    assert!(
        report.fatal_samples.iter().any(|f| f.contains(
            "write-back failed: service failure: work request to node 1 failed: RemoteAccess"
        )),
        "{:?}",
        report.fatal_samples
    );
    assert_eq!(report.locks_held, 0, "every ticket was passed on");
    // Nothing was written, so the money is as loaded.
    assert_eq!(report.final_total, report.initial_total);
}
