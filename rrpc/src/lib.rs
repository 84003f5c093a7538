//! `rrpc`: RDMA RPC for disaggregated-memory transaction systems (Scythe's RRPC,
//! Scythe sections 3.4 and 4.6).
//!
//! Layers, bottom up; a module imports only from those above it in this list:
//! - [`mem`]: the byte-addressed memory interface rings are read and written through;
//! - [`fabric`]: a verbs-like API (MRs with rkeys, RC QPs, CQs, WR lists posted with one
//!   doorbell, selective signaling, device memory), its backends and the timing model;
//! - [`rocket`]: the Rocket message ring (bucketed msg batching + doorbell batching,
//!   labels at both ends of a bucket, credits), a sans-IO state machine;
//! - [`wire`]: message kinds, reply modes and their fixed-layout prefixes;
//! - [`auth`]: the cluster secret and the mutual challenge on control connections;
//! - [`bootstrap`] and [`ctrl`]: the TCP control plane and its messages;
//! - [`arena`]: registered buffers carved into chunks;
//! - [`straw`]: RdmaStraws, per-node QP pools shared by a process's threads, with a
//!   control thread for reconnects;
//! - [`channel`]: one end of a Rocket pair (credits, sealing, the order of a list,
//!   backlog, replay), used by callers and servers alike; sans-IO but for its posting
//!   edge;
//! - [`exec`]: the waker-driven single-thread executor;
//! - [`runtime`] and [`server`], which never import each other: the per-thread runtime
//!   of coroutines making one-sided ops and calls, and the server threads running
//!   plain, async and sorted-batch handlers;
//! - [`node`]: a process's presence in a cluster (fabric + bootstrap + exported regions
//!   + server threads, optionally with a runtime for async handlers);
//! - [`topology`]: the cluster's topology file (hosts, roles, node ids), which service
//!   binaries find their role in (`service`, behind the `service` feature, on top).
#![warn(missing_docs)]

pub mod arena;
pub mod auth;
pub mod bootstrap;
pub mod channel;
#[cfg(all(test, feature = "loom-models"))]
mod channel_loom;
pub mod ctrl;
pub mod exec;
pub mod fabric;
pub mod mem;
pub mod node;
mod node_id;
pub mod rocket;
pub mod runtime;
pub mod server;
#[cfg(feature = "service")]
pub mod service;
pub mod straw;
pub mod topology;
pub mod wire;

pub use node_id::NodeId;
