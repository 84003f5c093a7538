//! `lockd`: the lock service of the workspace (DESIGN.md, "lockd").
//!
//! Today this crate implements Scythe's **Takeout Lock**
//! (`shared/seeds/000_f3dba2ed893b246b.txt`, section 4.3, Fig. 13 and 14): a fair,
//! heat-aware ticket lock for disaggregated memory.
//!
//! - [`takeout`]: the lock as a plain state machine (layout, Lock RPC body, smoothed RTT,
//!   Hangout), tested without a fabric;
//! - [`wire`]: the fixed-layout Lock RPC messages;
//! - [`service`]: the lock table in registered memory and its RPC handler;
//! - [`client`]: the per-thread client coordinators use (Lock RPC, state READ);
//! - [`lock_table`]: Lotus's lock table (read and write locks in 8-byte slots, a lock
//!   state of holders) as a library, not yet served over RPC;
//! - [`ticket`]: a taken ticket as a value that must be released (Hangout + READ polling
//!   for its turn, FAA unlock; a dropped ticket is released by a coroutine of its own).
//!
//! The `lockd` binary serves a table over an `rrpc` node; the same [`service::LockTable`]
//! can be embedded in any process that runs an `rrpc` node. Not here yet: the CAS-lock
//! baseline, Lotus lock tables and sharding, and recovery of tickets abandoned by crashed
//! clients (a crashed holder or waiter stalls its lock).
#![warn(missing_docs)]

pub mod client;
pub mod lock_table;
pub mod service;
pub mod takeout;
pub mod ticket;
pub mod wire;
