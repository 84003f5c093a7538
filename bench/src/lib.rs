//! Benchmarks: a local-cluster launcher, SmallBank, and run reports.
#![warn(missing_docs)]

pub mod launcher;
pub mod report;
pub mod smallbank;
