//! `txn`: a thin transaction layer over `rrpc`, `lockd` and `tso`.
//!
//! - [`cvt`]: consecutive version tuples (Motor 4.1, 4.3, 5.1; Lotus 7.1): the
//!   multi-version layout, version selection, GC's victim, cacheline-version checks;
//! - [`cvt_index`]: the hash index of CVTs (bucket search, insert slot) and the
//!   compute node's CVT address cache with stale-entry detection;
//! - [`cvt_store`]: a memory node's CVT table (index of CVT buckets, value region with
//!   one record buffer per cell) and its export;
//! - [`store`]: the memory node's layout (records with versions at both ends, hash index);
//! - [`smallbank`]: the SmallBank tables and loader;
//! - [`occ`]: the coordinator running Scythe's low-heat OCC (000_f3dba2ed893b246b.txt,
//!   4.2.1) on Takeout Locks;
//! - [`validation`]: OCC read-set validation as a state machine (lock free first, then
//!   version unchanged);
//! - [`history`] and [`serializability`]: committed transactions recorded with the
//!   versions they read and wrote, and the check that their dependency graph is acyclic;
//! - [`snapshot_isolation`]: the check of a history with start and commit timestamps for
//!   snapshot isolation (writes install their commit timestamp, first committer wins,
//!   reads see the snapshot at the start timestamp).
#![warn(missing_docs)]

pub mod cvt;
pub mod cvt_index;
pub mod cvt_store;
#[cfg(feature = "fault-injection")]
pub mod fault;
pub mod history;
pub mod occ;
pub mod serializability;
pub mod smallbank;
pub mod snapshot_isolation;
pub mod store;
pub mod validation;
