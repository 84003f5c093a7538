//! A process's presence in a cluster: its fabric, its bootstrap (control-plane) service,
//! the regions it exports, and optionally an RPC server.
//!
//! Control-plane requests ([`CtrlRequest`]) are JSON over the bootstrap service; the
//! data path never touches it.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::bootstrap::{self, BootstrapError, BootstrapServer};
use crate::fabric::{Fabric, FabricError, MrDesc, QpEndpoint, QpState, QueuePair, RemoteAddr};
use crate::rocket::RocketConfig;
use crate::server::{Handlers, RocketOffer, RpcServer, ServerConfig};
use crate::straw::QpKind;
use crate::wire::Batching;

/// Rocket geometry as exchanged on the control plane.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RocketGeometry {
    /// Bucket size in bytes (multiple of 64).
    pub bucket_size: usize,
    /// Number of buckets in the ring.
    pub buckets: usize,
}

impl From<RocketConfig> for RocketGeometry {
    fn from(c: RocketConfig) -> Self {
        Self {
            bucket_size: c.bucket_size,
            buckets: c.buckets,
        }
    }
}

impl From<RocketGeometry> for RocketConfig {
    fn from(g: RocketGeometry) -> Self {
        Self {
            bucket_size: g.bucket_size,
            buckets: g.buckets,
        }
    }
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
    /// and a response ring in the requester's (`resp_ring`). Its traffic uses the QPs of
    /// straw `straw`.
    ConnectRocket {
        /// The requester's node id.
        node: u32,
        /// The requester's straw pool id.
        straw: u64,
        /// Geometry of both rings.
        geometry: RocketGeometry,
        /// Batching of the response direction (the requester uses the same).
        #[serde(default)]
        batching: Batching,
        /// Largest reply in bytes sent inline to a [`crate::wire::ReplyMode::Auto`]
        /// request; larger ones go by RPC + READ.
        #[serde(default = "default_threshold")]
        mode_threshold: usize,
        /// The requester's response ring.
        resp_ring: MrDesc,
        /// The requester's 8-byte word where this node writes request-ring credits.
        req_credit: RemoteAddr,
    },
}

fn default_threshold() -> usize {
    512
}

/// Answer to [`CtrlRequest::Info`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Node id in the cluster.
    pub node: u32,
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
        node: u32,
        /// Export name.
        name: String,
        /// What is wrong.
        what: String,
    },
}

struct Shared {
    fabric: Fabric,
    role: String,
    exports: BTreeMap<String, serde_json::Value>,
    /// Passive ends of requesters' one-sided QPs, by (straw, qp id).
    passive: Mutex<HashMap<(u64, u64), QueuePair>>,
    rpc: Option<Arc<RpcServer>>,
}

/// A running node: bootstrap service plus optional RPC server threads. Dropping it stops both.
pub struct Node {
    shared: Arc<Shared>,
    bootstrap: Option<BootstrapServer>,
}

/// How to start a [`Node`].
pub struct NodeConfig {
    /// Role name reported by `Info`.
    pub role: String,
    /// Bootstrap listen address (loopback; port 0 picks one).
    pub listen: SocketAddr,
    /// Exports reported by `Info`.
    pub exports: BTreeMap<String, serde_json::Value>,
    /// RPC handlers and server threads; `None` for a node without RPC service.
    pub rpc: Option<(Handlers, usize)>,
}

impl Node {
    /// Start the node's services on `fabric`.
    pub fn start(fabric: Fabric, cfg: NodeConfig) -> Result<Self, NodeError> {
        Self::start_with(fabric, cfg, ServerConfig::default())
    }

    /// Start the node's services on `fabric`, its RPC server (if `cfg.rpc` asks for one,
    /// whose thread count wins) configured by `server`.
    pub fn start_with(
        fabric: Fabric,
        cfg: NodeConfig,
        server: ServerConfig,
    ) -> Result<Self, NodeError> {
        let rpc = match cfg.rpc {
            Some((handlers, threads)) => Some(Arc::new(RpcServer::with_config(
                fabric.clone(),
                handlers,
                ServerConfig { threads, ..server },
            )?)),
            None => None,
        };
        let shared = Arc::new(Shared {
            fabric,
            role: cfg.role,
            exports: cfg.exports,
            passive: Mutex::new(HashMap::new()),
            rpc,
        });
        let s = shared.clone();
        let bootstrap = BootstrapServer::start(cfg.listen, move |req| handle_ctrl(&s, req))?;
        Ok(Self {
            shared,
            bootstrap: Some(bootstrap),
        })
    }

    /// The bootstrap address peers connect to.
    pub fn addr(&self) -> SocketAddr {
        self.bootstrap.as_ref().expect("running").local_addr()
    }

    /// The node's fabric.
    pub fn fabric(&self) -> &Fabric {
        &self.shared.fabric
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(b) = self.bootstrap.take() {
            b.shutdown();
        }
        if let Some(rpc) = &self.shared.rpc {
            rpc.stop();
        }
    }
}

fn handle_ctrl(s: &Shared, req: serde_json::Value) -> Result<serde_json::Value, String> {
    let req: CtrlRequest =
        serde_json::from_value(req).map_err(|e| format!("unknown control request: {e}"))?;
    let out = match req {
        CtrlRequest::Info => serde_json::to_value(NodeInfo {
            node: s.fabric.node(),
            role: s.role.clone(),
            pid: std::process::id(),
            fabric: s.fabric.describe(),
            exports: s.exports.clone(),
        }),
        CtrlRequest::ConnectQp {
            endpoint,
            straw,
            qp_id,
            kind: QpKind::OneSided,
        } => {
            let qp = passive_qp(s, &endpoint)?;
            let ep = qp.endpoint();
            let mut passive = s.passive.lock().map_err(|_| "poisoned")?;
            // Requesters that died without releasing their QPs: drop their ends (and the
            // mappings of their memory) when the next requester connects.
            passive.retain(|_, q| q.state() != QpState::Error);
            passive.insert((straw, qp_id), qp);
            serde_json::to_value(ep)
        }
        CtrlRequest::ConnectQp {
            endpoint,
            straw,
            qp_id,
            kind: QpKind::Rpc,
        } => {
            let rpc = s.rpc.as_ref().ok_or("this node serves no RPCs")?;
            let ep = rpc
                .add_qp(straw, qp_id, &endpoint)
                .map_err(|e| e.to_string())?;
            serde_json::to_value(ep)
        }
        CtrlRequest::ReconnectQp {
            endpoint,
            straw,
            qp_id,
        } => {
            let mut passive = s.passive.lock().map_err(|_| "poisoned")?;
            if let Some(old) = passive.remove(&(straw, qp_id)) {
                drop(old); // destroyed before its successor exists
                let qp = passive_qp(s, &endpoint)?;
                let ep = qp.endpoint();
                passive.insert((straw, qp_id), qp);
                serde_json::to_value(ep)
            } else {
                drop(passive);
                let rpc = s.rpc.as_ref().ok_or("no such QP")?;
                let ep = rpc
                    .reconnect_qp(straw, qp_id, &endpoint)
                    .map_err(|e| e.to_string())?;
                serde_json::to_value(ep)
            }
        }
        CtrlRequest::ReleaseQp { straw, qp_id } => {
            let found = s
                .passive
                .lock()
                .map_err(|_| "poisoned")?
                .remove(&(straw, qp_id))
                .is_some()
                || s.rpc
                    .as_ref()
                    .is_some_and(|rpc| rpc.release_qp(straw, qp_id));
            serde_json::to_value(found)
        }
        CtrlRequest::CloseRocket { rocket } => {
            let rpc = s.rpc.as_ref().ok_or("this node serves no RPCs")?;
            serde_json::to_value(rpc.close(rocket))
        }
        CtrlRequest::ConnectRocket {
            node,
            straw,
            geometry,
            batching,
            mode_threshold,
            resp_ring,
            req_credit,
        } => {
            let rpc = s.rpc.as_ref().ok_or("this node serves no RPCs")?;
            let accept = rpc
                .accept(RocketOffer {
                    peer: node,
                    straw,
                    cfg: geometry.into(),
                    batching,
                    mode_threshold,
                    resp_ring,
                    req_credit,
                })
                .map_err(|e| e.to_string())?;
            serde_json::to_value(accept)
        }
    };
    out.map_err(|e| e.to_string())
}

/// A passive QP (one-sided traffic only) connected to `endpoint`.
fn passive_qp(s: &Shared, endpoint: &QpEndpoint) -> Result<QueuePair, String> {
    let cq = s.fabric.create_cq(16).map_err(|e| e.to_string())?;
    let mut qp = s.fabric.create_qp(&cq, 16).map_err(|e| e.to_string())?;
    qp.connect(endpoint).map_err(|e| e.to_string())?;
    Ok(qp)
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
