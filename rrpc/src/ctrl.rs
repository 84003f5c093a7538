//! The control plane's messages and the types they carry: what a requester asks a node
//! over the TCP bootstrap service ([`crate::bootstrap`]) to set up QPs and Rocket pairs,
//! and what it answers. Below every module that uses them (straws, runtime, server,
//! node), so none of those imports another for a message type. The data path never
//! touches any of this.

use crate::NodeId;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::bootstrap::{self, BootstrapError};
use crate::fabric::{FabricError, MrDesc, QpEndpoint, RemoteAddr};
use crate::rocket::RocketConfig;
use crate::wire::Batching;

/// The two kinds of QPs in a straw ([`crate::straw`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QpKind {
    /// Rocket bucket WRITEs and credit WRITEs.
    Rpc,
    /// One-sided READ/WRITE/CAS/FAA issued by coroutines.
    OneSided,
}

/// Control-plane requests a node serves.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum CtrlRequest {
    /// Describe the node: id, role, exported regions.
    Info,
    /// Create this node's end of QP `qp_id` of the requester's straw `straw`, connected to
    /// `endpoint`, and return its endpoint. One-sided QPs are passive here; RPC QPs carry
    /// this node's responses back to the requester.
    ConnectQp {
        /// The requester's QP endpoint.
        endpoint: QpEndpoint,
        /// The requester's straw pool id.
        straw: u64,
        /// The pair's id within that pool.
        qp_id: u64,
        /// RPC or one-sided.
        kind: QpKind,
    },
    /// Destroy this node's end of QP `qp_id` (so nothing of the old QP can land any more),
    /// create a new one connected to `endpoint`, and return its endpoint. Work this node
    /// had outstanding on the old end is replayed on the pool's QPs.
    ReconnectQp {
        /// The requester's new QP endpoint.
        endpoint: QpEndpoint,
        /// The requester's straw pool id.
        straw: u64,
        /// The pair's id within that pool.
        qp_id: u64,
    },
    /// Destroy this node's end of QP `qp_id` once it has drained (the pool shrank).
    ReleaseQp {
        /// The requester's straw pool id.
        straw: u64,
        /// The pair's id within that pool.
        qp_id: u64,
    },
    /// Close Rocket pair `rocket` (its requester thread is leaving).
    CloseRocket {
        /// The id [`RpcAccept::rocket`] gave.
        rocket: u64,
    },
    /// Open a Rocket pair for one requester thread: a request ring in this node's memory
    /// and a response ring in the requester's ([`RocketOffer::resp_ring`]). Its traffic
    /// uses the QPs of straw [`RocketOffer::straw`].
    ConnectRocket(RocketOffer),
}

/// A requester thread's offer of a Rocket pair ([`CtrlRequest::ConnectRocket`]).
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct RocketOffer {
    /// The requester's node id.
    pub node: NodeId,
    /// The requester's incarnation of that id ([`crate::fabric::Fabric::incarnation`]);
    /// handlers see it as [`crate::server::Caller::incarnation`] (0 from a requester
    /// that predates incarnations).
    #[serde(default)]
    pub incarnation: u64,
    /// The requester's straw pool id.
    pub straw: u64,
    /// Geometry of both rings (the server refuses one beyond its limits).
    pub geometry: RocketConfig,
    /// Batching of the response direction (the requester uses the same).
    #[serde(default)]
    pub batching: Batching,
    /// Largest reply in bytes sent inline to a [`crate::wire::ReplyMode::Auto`]
    /// request; larger ones go by RPC + READ.
    #[serde(default = "default_threshold")]
    pub mode_threshold: usize,
    /// The requester's response ring.
    pub resp_ring: MrDesc,
    /// The requester's 8-byte word where this node writes request-ring credits.
    pub req_credit: RemoteAddr,
    /// The server thread the requester asks to be served by, modulo the server's
    /// threads (`None`, and from requesters that predate it: the server's round robin).
    /// A compute node whose coordinator threads are its server threads pairs its i-th
    /// coordinator with the i-th of every peer so (Lotus 4.1).
    #[serde(default)]
    pub server_thread: Option<u32>,
}

fn default_threshold() -> usize {
    512
}

/// Answer to [`CtrlRequest::Info`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Node id in the cluster.
    pub node: NodeId,
    /// Role name ("memnode", "lockd", "tso", ...).
    pub role: String,
    /// Process id.
    pub pid: u32,
    /// Fabric description.
    pub fabric: String,
    /// Exported items by name (service-specific JSON: region descriptors, layouts).
    pub exports: BTreeMap<String, serde_json::Value>,
}

/// Answer to [`CtrlRequest::ConnectRocket`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RpcAccept {
    /// The Rocket pair's id, for [`CtrlRequest::CloseRocket`].
    #[serde(default)]
    pub rocket: u64,
    /// The request ring in the server's memory.
    pub req_ring: MrDesc,
    /// The server's word where the client writes response-ring credits.
    pub resp_credit: RemoteAddr,
}

/// Errors of node start-up and control-plane calls.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// A fabric operation failed.
    #[error(transparent)]
    Fabric(#[from] FabricError),
    /// The control plane failed.
    #[error("control plane: {0}")]
    Bootstrap(#[from] BootstrapError),
    /// An export was missing or not of the expected shape.
    #[error("node {node}: export {name:?}: {what}")]
    Export {
        /// Node id.
        node: NodeId,
        /// Export name.
        name: String,
        /// What is wrong.
        what: String,
    },
    /// A thread of the node (its reaper) could not be started.
    #[error("start the node's {what} thread")]
    Thread {
        /// Which thread.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// Ask the node at `addr` for its [`NodeInfo`], retrying until `timeout` while it starts.
pub fn node_info(addr: SocketAddr, timeout: Duration) -> Result<NodeInfo, NodeError> {
    Ok(bootstrap::call_with_retry(
        addr,
        &CtrlRequest::Info,
        Instant::now() + timeout,
    )?)
}

impl NodeInfo {
    /// Export `name` deserialized as `T`.
    pub fn export<T: serde::de::DeserializeOwned>(&self, name: &str) -> Result<T, NodeError> {
        let v = self.exports.get(name).ok_or_else(|| NodeError::Export {
            node: self.node,
            name: name.into(),
            what: format!("missing (role {})", self.role),
        })?;
        serde_json::from_value(v.clone()).map_err(|e| NodeError::Export {
            node: self.node,
            name: name.into(),
            what: e.to_string(),
        })
    }
}

/// Serde of a [`Duration`] as integer milliseconds.
pub(crate) mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}
