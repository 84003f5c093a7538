//! `rrpc`: RDMA RPC for disaggregated-memory transaction systems (Scythe's RRPC,
//! `shared/seeds/000_f3dba2ed893b246b.txt` sections 3.4 and 4.6).
//!
//! Layers, bottom up:
//! - [`fabric`]: a verbs-like API (MRs with rkeys, RC QPs, CQs, WR lists posted with one
//!   doorbell, selective signaling, device memory) and its backends;
//! - [`bootstrap`]: the TCP control plane that exchanges QP endpoints and MR descriptors;
//! - [`rocket`]: the Rocket message ring (bucketed msg batching + doorbell batching,
//!   labels at both ends of a bucket, credits), a sans-IO state machine;
//! - [`straw`]: RdmaStraws, per-node QP pools shared by a process's threads;
//! - [`runtime`]: a per-thread executor running many coroutines whose WRs are posted
//!   together once per polling round, with one-sided helpers and RPC calls;
//! - [`server`]: RPC server threads polling Rockets and dispatching registered handlers;
//! - [`node`]: a process's presence in a cluster (fabric + bootstrap + exported regions).
#![warn(missing_docs)]

pub mod arena;
pub mod bootstrap;
pub(crate) mod channel;
#[cfg(all(test, loom))]
mod channel_loom;
pub mod ctrl;
pub mod exec;
pub mod fabric;
pub mod mem;
pub mod node;
pub mod rocket;
pub mod runtime;
pub mod server;
#[cfg(feature = "service")]
pub mod service;
pub mod straw;
pub mod wire;
