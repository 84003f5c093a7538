//! The serializability check catches what a broken protocol lets through: OCC-CAS. With
//! the validation of objects a transaction only read switched off (a fault switch that
//! exists only in test builds), committed histories stop being serializable, and the
//! check must report a cycle:
//!
//! the write-skew workload (`common`) commits both halves of a write skew whenever two of
//! its transactions on one account overlap, so every run shows a cycle.
//!
//! SmallBank is no good for this test: its mix has no write-skew pair, execution reads
//! already abort on a held lock, and Balance reads both balances in one round, so the
//! cycles it can form without read-only validation (TransactSaving -wr-> Balance -rw->
//! WriteCheck -rw-> TransactSaving) need three transactions to meet within a few polling
//! rounds: measured, one cycle in tens to hundreds of thousands of commits.
//!
//! The switch is process-wide, so each protocol's test lives in a test binary of its
//! own (`serializability_fault_mvcc.rs`, `serializability_fault_scythe.rs`);
//! `write_skew.rs` is the control with the switch off.

mod common;

use txn::coordinator::Protocol;

#[test]
fn occ_cas_commits_a_cycle_when_read_only_validation_is_skipped() {
    common::assert_cycle_without_read_only_validation("ws-fault-occ", Protocol::OccCas);
}
