//! The serializability check catches what a broken MVCC lets through: with the
//! validation of read-only data at the commit timestamp switched off (a fault switch that
//! exists only in test builds), MVCC "SR" is snapshot isolation, the write-skew workload
//! (`common`) commits both halves of write skews, and the check must report a cycle.
//! The switch is process-wide, hence a test binary of its own (see
//! `serializability_fault.rs`).

mod common;

use txn::coordinator::{Isolation, Protocol};

#[test]
fn mvcc_commits_a_cycle_when_read_only_validation_is_skipped() {
    common::assert_cycle_without_read_only_validation(
        "ws-fault-mvcc",
        Protocol::Mvcc(Isolation::Serializable),
    );
}
