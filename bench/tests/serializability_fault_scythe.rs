//! The serializability check catches what a broken Scythe lets through: with the
//! validation of objects an OCC attempt only read switched off (a fault switch that
//! exists only in test builds), the write-skew workload (`common`) commits write skews
//! and the check must report a cycle. (TOCC attempts lock what they read and are not
//! affected; the workload's four accounts keep most attempts in OCC long enough.) The
//! switch is process-wide, hence a test binary of its own (see
//! `serializability_fault.rs`).

mod common;

use txn::coordinator::Protocol;

#[test]
fn scythe_commits_a_cycle_when_read_only_validation_is_skipped() {
    common::assert_cycle_without_read_only_validation("ws-fault-scythe", Protocol::Scythe);
}
