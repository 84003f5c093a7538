//! A write-back that fails still releases every lock, in every protocol: each run stops
//! with a service failure, and no lock is left held (CVT lock words of OCC-CAS and MVCC,
//! Takeout tickets of Scythe, Lotus's lock table). (A fault switch that exists only in test builds makes
//! write-back fail; it is process-wide, so this test has a binary of its own.)

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use bench::txnbench::{run, Args, Outcome};
use clap::Parser;

#[test]
fn failed_write_back_releases_its_locks() {
    txn::fault::fail_write_back(true);
    let args = Args::parse_from([
        "txn-bench",
        "--protocol",
        "all",
        "--accounts",
        "1000",
        "--threads",
        "1",
        "--coroutines",
        "8",
        "--duration",
        "2",
    ]);
    let (summary, outcome) = run(args, Arc::new(AtomicBool::new(false))).expect("run");
    assert_eq!(outcome, Outcome::Failed);
    assert!(!summary.passed);
    let protocols: Vec<&str> = summary.runs.iter().map(|r| r.protocol.as_str()).collect();
    assert_eq!(protocols, ["occ-cas", "scythe", "mvcc", "lotus"]);
    for report in &summary.runs {
        let p = &report.protocol;
        assert!(report.fatal_errors > 0, "{p}: the failure is reported");
        assert!(
            report.fatal_samples.iter().any(|f| f.contains(
                "write-back failed: service failure: work request to node 0 failed: RemoteAccess"
            )),
            "{p}: {:?}",
            report.fatal_samples
        );
        assert_eq!(report.locks_held, 0, "{p}: every lock was released");
        assert_eq!(report.cvt_locks_held, 0, "{p}");
        if p == "lotus" {
            assert_eq!(report.lotus_locks_held, Some(0), "every lock was released");
        }
        if p == "scythe" {
            assert_eq!(
                report.lockd_locks_held,
                Some(0),
                "every ticket was passed on"
            );
        }
        // Nothing was written, so the money is as loaded.
        assert_eq!(report.final_total, report.initial_total, "{p}");
        assert!(!report.passed(), "{p}");
    }
}
