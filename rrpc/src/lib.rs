//! `rrpc`: RDMA RPC for disaggregated-memory transaction systems (Scythe's RRPC,
//! Scythe sections 3.4 and 4.6).
//!
//! # Embedding
//!
//! `use rrpc::prelude::*;` brings in what a program serving or calling RPCs needs; the
//! same types are re-exported at the crate root:
//! - a fabric: [`FabricConfig::new`]`(kind, cluster, node_id)` and [`Fabric::open`]
//!   (the `shm` backend for one host, `verbs` behind the feature of that name);
//! - a server: [`Handlers`] (plain, async and sorted-batch handlers by `u16` id, ids
//!   below [`server::ids::FIRST_APP_ID`] reserved, a taken id an error) and
//!   [`Node::start`] with a [`NodeConfig`] ([`NodeConfig::new`] and its setters);
//! - a client: [`Runtime`] (threads x coroutines) or one [`ThreadCtx`] per thread,
//!   [`ThreadCtx::connect_rpc`], then `ctx.call(node, id, &bytes).await` and one-sided
//!   `read`/`write`/`cas`/`faa`, with [`CallOpts`] and [`ReplyMode`] for large replies;
//!   registered buffers of the caller's own ([`ThreadCtx::alloc_buf`], [`RegBuf`]) that
//!   `read_into` and `write_from` transfer without allocating, and `call_into` gets a
//!   reply in, written there by the server;
//! - typed RPCs ([`typed`]): an [`Rpc`] type names an id, request, response and codec
//!   ([`Fixed`] zerocopy layouts, `Postcard` serde types with feature `serde-codec`);
//!   [`Handlers::register_typed`] and [`ThreadCtx::call_typed`];
//! - from tokio or any other thread: [`BridgeClient`] ([`bridge`]), a `Send + Clone`
//!   handle on a dedicated rrpc thread, whose calls are futures any executor can await;
//! - errors per operation: [`CallError`], [`ConnectError`], [`OneSidedError`],
//!   [`RpcError`] (any of them, for `?`), [`TypedCallError`], [`NodeError`],
//!   [`FabricError`], [`DuplicateId`].
//!
//! Every runtime or server thread polls and so costs a core. Examples:
//! `examples/echo_server.rs` and `echo_client.rs` (two processes), `kv_typed.rs` (a
//! typed key-value service, both sides in one process).
//!
//! Features: `verbs` (libibverbs backend), `serde-codec` (the postcard codec of typed
//! RPCs), `service` (start-up helpers for service binaries: pulls clap, ctrlc and
//! tracing-subscriber, which the default build does not).
//!
//! # Layers
//!
//! Layers, bottom up; a module imports only from those above it in this list:
//! - `mem` (hidden): the byte-addressed memory interface rings are read and written through;
//! - [`fabric`]: a verbs-like API (MRs with rkeys, RC QPs, CQs, WR lists posted with one
//!   doorbell, selective signaling, device memory), its backends and the timing model;
//! - [`rocket`]: the Rocket message ring (bucketed msg batching + doorbell batching,
//!   labels at both ends of a bucket, credits), a sans-IO state machine;
//! - [`wire`]: message kinds, reply modes and their fixed-layout prefixes;
//! - [`auth`]: the cluster secret and the mutual challenge on control connections;
//! - [`bootstrap`] and [`ctrl`]: the TCP control plane and its messages;
//! - `arena` (hidden): registered buffers carved into chunks;
//! - [`straw`]: RdmaStraws, per-node QP pools shared by a process's threads, with a
//!   control thread for reconnects;
//! - `channel` (hidden): one end of a Rocket pair (credits, sealing, the order of a list,
//!   backlog, replay), used by callers and servers alike; sans-IO but for its posting
//!   edge;
//! - [`exec`]: the waker-driven single-thread executor;
//! - [`runtime`] and [`server`], which never import each other: the per-thread runtime
//!   of coroutines making one-sided ops and calls, and the server threads running
//!   plain, async and sorted-batch handlers;
//! - [`bridge`]: a `Send + Clone` client handle on a dedicated runtime thread;
//! - [`typed`]: typed RPCs over [`server::Handlers`] and [`runtime::ThreadCtx`];
//! - [`node`]: a process's presence in a cluster (fabric + bootstrap + exported regions
//!   + server threads, optionally with a runtime for async handlers);
//! - [`topology`]: the cluster's topology file (hosts, roles, node ids), which service
//!   binaries find their role in (`service`, behind the `service` feature, on top).
#![warn(missing_docs)]

#[doc(hidden)] // internal: a layer of the transport, no semver promise
pub mod arena;
pub mod auth;
pub mod bootstrap;
pub mod bridge;
#[doc(hidden)] // internal: a layer of the transport, no semver promise
pub mod channel;
#[cfg(all(test, feature = "loom-models"))]
mod channel_loom;
pub mod ctrl;
pub mod exec;
pub mod fabric;
#[doc(hidden)] // internal: a layer of the transport, no semver promise
pub mod mem;
pub mod node;
mod node_id;
pub mod rocket;
pub mod runtime;
pub mod server;
#[cfg(feature = "service")]
pub mod service;
#[cfg(feature = "service")]
pub mod settings_file;
pub mod straw;
pub mod topology;
pub mod typed;
pub mod wire;

pub use bridge::{BridgeClient, BridgeError};
pub use ctrl::{NodeError, NodeInfo};
pub use fabric::{Fabric, FabricConfig, FabricError, FabricKind};
pub use node::{Node, NodeConfig};
pub use node_id::NodeId;
pub use runtime::{
    block_on, CallError, CallOpts, ConnectError, OneSidedError, RegBuf, RpcError, Runtime,
    RuntimeConfig, ThreadCtx,
};
pub use server::{Caller, DuplicateId, Handlers, ServerConfig};
pub use typed::{Codec, Fixed, Rpc, TypedCallError};
pub use wire::ReplyMode;

/// What a program embedding rrpc needs, for `use rrpc::prelude::*`: the fabric, the
/// server ([`Handlers`], [`Node`]), the client runtime ([`Runtime`], [`ThreadCtx`]),
/// typed RPCs and the error types. Internal layers (rings, channels, straws, the
/// control plane) stay in their modules.
pub mod prelude {
    #[cfg(feature = "serde-codec")]
    pub use crate::typed::Postcard;
    pub use crate::typed::{Codec, Fixed, Rpc, TypedCallError};
    pub use crate::{
        block_on, BridgeClient, BridgeError, CallError, CallOpts, Caller, ConnectError,
        DuplicateId, Fabric, FabricConfig, FabricError, FabricKind, Handlers, Node, NodeConfig,
        NodeError, NodeId, NodeInfo, OneSidedError, RegBuf, ReplyMode, RpcError, Runtime,
        RuntimeConfig, ServerConfig, ThreadCtx,
    };
}
