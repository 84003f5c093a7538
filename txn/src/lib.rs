//! `txn`: distributed transactions on disaggregated memory over `rrpc`, `lockd` and `tso`.
//!
//! - [`cvt`]: consecutive version tuples (Motor 4.1, 4.3, 5.1; Lotus 7.1): the
//!   multi-version layout, version selection, GC's victim, cacheline-version checks;
//! - [`cvt_index`]: the hash index of CVTs (bucket search, insert slot) and the
//!   compute node's CVT address cache with stale-entry detection;
//! - [`cvt_store`]: a memory node's CVT table (index of CVT buckets, value region with
//!   one record buffer per cell) and its export;
//! - [`store`]: the key hash and table-building errors;
//! - [`smallbank`]: the SmallBank tables and loader; [`tatp`]: TATP's four tables, their
//!   generated population and loader, and the consistency check after a run; [`tpcc`]:
//!   TPC-C's nine tables and two indexes, the initial population, the loader and the
//!   consistency conditions 1 to 4;
//! - [`kvs`]: the KVS / YCSB table, its loader and its self-checking values;
//! - [`cvt_remote`]: a compute thread's one-sided access to the CVT tables of every
//!   memory node (lookup through the address cache, version READ, lock CAS, install,
//!   insert), tables partitioned across memory nodes by key, each partition with its
//!   backups on the next memory nodes (Motor 5.3), installs and inserts written to
//!   every copy in one round;
//! - [`replica_audit`]: the check after a replicated run that every backup equals its
//!   primary;
//! - [`coordinator`]: the one coordinator API (`begin`, `read`, `read_for_update`,
//!   `insert`, `delete`, `commit`, `abort`) and the protocol chosen by name:
//!   [`occ_cas`] (FaRM/FORD OCC with CAS locks in the CVT header), [`scythe`] (Scythe's
//!   hot-aware OCC/TOCC on Takeout Locks, Scythe 4.2 to 4.4),
//!   [`mvcc`] (Motor's MVCC, 5.1 and 5.2, SR or SI) and [`lotus`] (Lotus's lock-first
//!   protocol on compute-node lock tables, 5.1 and 5.2, SR or SI), with [`vt_cache`]
//!   (a compute node's version table cache, Lotus 4.4);
//! - [`validation`]: OCC read-set validation as a state machine (lock free first, then
//!   version unchanged);
//! - [`history`] and [`serializability`]: committed transactions recorded with the
//!   versions they read and wrote, and the check that their dependency graph is acyclic;
//! - [`range_index`]: an ordered index of tables' keys in an rTX B-link tree on a memory
//!   node, for [`coordinator::Txn::scan`];
//! - [`snapshot_isolation`]: the check of a history with start and commit timestamps for
//!   snapshot isolation (writes install their commit timestamp, first committer wins,
//!   reads see the snapshot at the start timestamp).
//!
//! Example: `examples/custom_txn.rs`, a local cluster in one process (a memory node with the
//! user's own table, a lock service, an oracle) and a user-written transfer transaction run
//! with [`coordinator::TxnClient`] from several coroutines, retried on abort.
#![warn(missing_docs)]

mod attempt;
mod client_core;
pub mod commit_log;
pub mod config;
pub mod coordinator;
pub mod cvt;
pub mod cvt_index;
pub mod cvt_remote;
pub mod cvt_store;
pub mod error;
#[cfg(feature = "fault-injection")]
pub mod fault;
/// Whether this build has the `fault` module (the `fault-injection` feature, which
/// only test builds enable): binaries that offer to plant a bug refuse it when false.
pub const FAULT_INJECTION: bool = cfg!(feature = "fault-injection");
pub mod ford;
pub mod history;
pub mod kvs;
pub mod lock_read;
pub mod lotus;
pub mod lotus_peers;
pub mod lotus_site;
pub mod migrate;
pub mod mvcc;
pub mod occ_cas;
pub mod phase;
mod protocol;
pub mod range_index;
pub mod recovery;
pub mod replica_audit;
pub mod scythe;
pub mod serializability;
pub mod smallbank;
pub mod snapshot_isolation;
pub mod store;
pub mod tatp;
pub mod tpcc;
pub mod transient;
pub mod txn_id;
pub mod validation;
pub mod view;
pub mod vt_cache;
