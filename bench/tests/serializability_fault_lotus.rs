//! The serializability check catches what a broken Lotus lets through: with the read
//! locks of read-only data switched off (the fault switch of the read-only validation,
//! which exists only in test builds), Lotus "SR" commits both halves of write skews on
//! the write-skew workload (`common`), and the check must report a cycle. The switch is
//! process-wide, hence a test binary of its own (see `serializability_fault.rs`).

mod common;

use txn::coordinator::{Isolation, Protocol};

#[test]
fn lotus_commits_a_cycle_without_read_locks() {
    common::assert_cycle_without_read_only_validation(
        "ws-fault-lotus",
        Protocol::Lotus(Isolation::Serializable),
    );
}
