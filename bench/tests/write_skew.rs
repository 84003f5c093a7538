//! The control of `serializability_fault.rs`: the write-skew workload with the protocol
//! as built (read-only objects validated, lock words before versions) commits only
//! serializable histories.

mod common;

use std::time::Duration;

#[test]
fn write_skew_workload_is_serializable() {
    let (v, commits) = common::write_skew("ws-control", 4, 2, 16, Duration::from_secs(2));
    eprintln!("{v} ({commits} commits)");
    assert!(commits > 100, "too few commits to mean anything: {commits}");
    assert_eq!(v.committed as u64, commits);
    assert!(v.is_serializable(), "{v}");
}
