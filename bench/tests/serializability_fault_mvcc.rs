//! The serializability check catches what a broken MVCC lets through: with the
//! validation of read-only data at the commit timestamp switched off (a fault switch that
//! exists only in test builds), MVCC "SR" is snapshot isolation, the write-skew workload
//! (`common`) commits both halves of write skews, and the check must report a cycle.
//! The switch is process-wide, hence a test binary of its own (see
//! `serializability_fault.rs`).

mod common;

use std::time::Duration;

use txn::coordinator::{Isolation, Protocol};

#[test]
fn mvcc_commits_a_cycle_when_read_only_validation_is_skipped() {
    txn::fault::skip_read_only_validation(true);
    let run = common::write_skew(
        "ws-fault-mvcc",
        Protocol::Mvcc(Isolation::Serializable),
        4,
        2,
        16,
        Duration::from_secs(2),
    );
    let v = txn::serializability::check(&run.history);
    eprintln!("{v} ({} commits)", run.commits);
    assert!(
        !v.is_serializable(),
        "no cycle in {} commits: {v}",
        run.commits
    );
    assert!(v.to_string().contains("CYCLE of "), "{v}");
}
