//! `txn`: a thin transaction layer over `rrpc`, `lockd` and `tso`.
//!
//! - [`store`]: the memory node's layout (records with versions at both ends, hash index);
//! - [`smallbank`]: the SmallBank tables and loader;
//! - [`occ`]: the coordinator running Scythe's low-heat OCC (000_f3dba2ed893b246b.txt,
//!   4.2.1) on Takeout Locks.
#![warn(missing_docs)]

pub mod occ;
pub mod smallbank;
pub mod store;
