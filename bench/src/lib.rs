//! Benchmarks: a local-cluster launcher, SmallBank, and run reports.
#![warn(missing_docs)]

pub mod launcher;
pub mod peers;
pub mod plot;
pub mod report;
pub mod smallbank;
pub mod txnbench;
