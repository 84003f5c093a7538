//! RCC: concurrency-control protocols, each over two-sided RPC and over one-sided RDMA,
//! on one framework, after "RCC: A Comprehensive Study of RDMA-based Concurrency Control"
//! (sections 3-5).
//!
//! RCC is shared-nothing: every node holds a partition of the database in registered
//! memory, serves RPC handlers on its CPU, and runs coordinator co-routines that reach
//! every record through the network, local ones included. Each protocol is written twice:
//! its network steps as RPCs to the participants' handlers, and as one-sided READ, WRITE
//! and CAS with doorbell batching (lock-and-read, update-and-unlock).
//!
//! Built: NOWAIT, WAITDIE, OCC, MVCC, SUNDIAL and CALVIN in both variants, SmallBank,
//! YCSB with a hot area and TPC-C New-Order (RCC, 5.1), with every run checked (the
//! workload's check, locks free, serializability; for CALVIN also determinism against a
//! serial replay).
//!
//! Modules, bottom up:
//! - [`layout`]: tuple layouts and record placement; [`store`]: a partition as its CPU
//!   sees it; [`wire`]: the RPC messages; [`server`]: the handlers;
//! - [`net`]: the coordinator's network, in memory ([`net::LocalNet`]) or over rrpc
//!   ([`net::RrpcNet`]); [`calls`]: the RPC variants over another call transport (the
//!   bench's tonic one: RCC, 5, Table 3's RPC against TCP);
//! - [`coord`]: a coordinator, its counters and transactions; [`twopl`] (NOWAIT,
//!   WAITDIE), [`occ`], [`mvcc`] and [`sundial`]: the per-transaction protocols;
//!   [`calvin`]: CALVIN, with its own epoch loop, buffers and handlers;
//! - [`workload`], [`smallbank`], [`ycsb`], [`tpcc`] (New-Order, with inserts): the
//!   workloads; [`driver`]: running and checking; [`member`]: one node on rrpc,
//!   coordinators on its server thread; [`cluster`]: a run of them.

pub mod calls;
pub mod calvin;
pub mod cluster;
pub mod config;
pub mod coord;
pub mod driver;
pub mod layout;
pub mod member;
pub mod mvcc;
pub mod net;
pub mod occ;
pub mod protocol;
pub mod server;
pub mod skew;
pub mod smallbank;
mod steps;
pub mod store;
pub mod sundial;
pub mod tpcc;
pub mod twopl;
pub mod wire;
pub mod workload;
pub mod ycsb;

#[cfg(test)]
mod tests;

pub use coord::{Abort, Coord, Proto, Stats, TxnSpec, Variant};
pub use driver::Report;
pub use layout::{Layout, Shape, TableSpec};
