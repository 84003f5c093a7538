//! A process's presence in a cluster: its fabric, its bootstrap (control-plane) service,
//! the regions it exports, and optionally an RPC server.
//!
//! Control-plane requests ([`CtrlRequest`]) are JSON over the bootstrap service; the
//! data path never touches it. With a cluster secret ([`crate::auth`]), a node serves
//! only connections that proved it, and opens a Rocket pair only for the node id its
//! connection proved: the node id every handler sees as its caller
//! ([`crate::server::Caller`]).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::auth::Identity;
use crate::bootstrap::{BootstrapServer, Peer, ServerAuth};
use crate::ctrl::QpKind;
pub use crate::ctrl::{node_info, CtrlRequest, NodeError, NodeInfo, RpcAccept};
use crate::fabric::{Fabric, QpEndpoint, QpState, QueuePair};
use crate::runtime::{ConnectError, RuntimeConfig, ThreadCtx};
use crate::server::{Handlers, RpcServer, ServerConfig, ThreadHook};
use crate::straw::Straws;

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
    /// The reaper thread and the channel whose closing stops it.
    reaper: Option<(mpsc::Sender<()>, JoinHandle<()>)>,
}

/// How often a node drops the passive ends of one-sided QPs whose requester died
/// without releasing them (and with them the mappings of its memory): a memory node
/// whose coordinators crash must not keep their shared-memory files alive until the
/// next requester connects.
pub const REAP_PERIOD: Duration = Duration::from_millis(100);

/// Drop the passive QPs in the error state (their requester is gone). `state` probes
/// the peer's liveness at most once a millisecond per QP.
fn reap(s: &Shared) {
    if let Ok(mut passive) = s.passive.lock() {
        passive.retain(|_, q| q.state() != QpState::Error);
    }
}

/// The rrpc settings of a process: its runtime contexts' ([`RuntimeConfig`]) and its
/// RPC server's ([`ServerConfig`]). A topology file's `[runtime]` and `[server]` tables
/// ([`crate::topology::Topology::rpc_settings`]); the defaults otherwise. As JSON or
/// TOML, the tables `runtime` and `server`, each key optional.
///
/// Non-exhaustive: outside rrpc, build one from [`RpcSettings::default`] with the
/// `with_*` setters.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct RpcSettings {
    /// Settings of every runtime context the process creates (its callers, and its
    /// server threads' contexts for async handlers).
    pub runtime: RuntimeConfig,
    /// Settings of the process's RPC server (a binary's own thread count wins).
    pub server: ServerConfig,
}

impl RpcSettings {
    /// Set [`RpcSettings::runtime`]: the settings of every runtime context of the process.
    pub fn with_runtime(mut self, runtime: RuntimeConfig) -> Self {
        self.runtime = runtime;
        self
    }

    /// Set [`RpcSettings::server`]: the settings of the process's RPC server.
    pub fn with_server(mut self, server: ServerConfig) -> Self {
        self.server = server;
        self
    }
}

/// How to start a [`Node`].
///
/// Non-exhaustive: outside rrpc, build one with [`NodeConfig::new`] and the chainable
/// [`NodeConfig::export`], [`NodeConfig::with_exports`], [`NodeConfig::rpc`] and
/// [`NodeConfig::with_rpc`].
#[non_exhaustive]
pub struct NodeConfig {
    /// Role name reported by `Info`.
    pub role: String,
    /// Bootstrap listen address (port 0 picks one). Beyond loopback only where the
    /// cluster's topology says so, and with a cluster secret ([`crate::auth`]).
    pub listen: SocketAddr,
    /// Exports reported by `Info`.
    pub exports: BTreeMap<String, serde_json::Value>,
    /// RPC handlers and server threads; `None` for a node without RPC service.
    pub rpc: Option<(Handlers, usize)>,
}

impl NodeConfig {
    /// A node named `role` listening on `listen` (port 0 picks one), exporting nothing
    /// and serving no RPCs until [`NodeConfig::export`] and [`NodeConfig::rpc`] say so.
    pub fn new(role: impl Into<String>, listen: SocketAddr) -> Self {
        Self {
            role: role.into(),
            listen,
            exports: BTreeMap::new(),
            rpc: None,
        }
    }

    /// Export `value` under `name` (reported by `Info`, read by clients through
    /// [`NodeInfo::export`](crate::ctrl::NodeInfo::export)); a later value for the same
    /// name replaces the earlier.
    pub fn export(mut self, name: impl Into<String>, value: serde_json::Value) -> Self {
        self.exports.insert(name.into(), value);
        self
    }

    /// Set [`NodeConfig::exports`]: the exports reported by `Info`, replacing any given
    /// before.
    pub fn with_exports(mut self, exports: BTreeMap<String, serde_json::Value>) -> Self {
        self.exports = exports;
        self
    }

    /// Serve `handlers` on `threads` server threads (at least one).
    pub fn rpc(mut self, handlers: Handlers, threads: usize) -> Self {
        self.rpc = Some((handlers, threads.max(1)));
        self
    }

    /// Set the `rpc` field as given: RPC handlers and server threads (unlike
    /// [`NodeConfig::rpc`], a count of 0 is kept, and refused when the node starts),
    /// `None` for no RPC service.
    pub fn with_rpc(mut self, rpc: Option<(Handlers, usize)>) -> Self {
        self.rpc = rpc;
        self
    }
}

impl Node {
    /// Start the node's services on `fabric`.
    pub fn start(fabric: Fabric, cfg: NodeConfig) -> Result<Self, NodeError> {
        Self::start_with(fabric, cfg, ServerConfig::default())
    }

    /// Start the node's services on `fabric`, its RPC server (if `cfg.rpc` asks for one,
    /// whose thread count wins) configured by `server`. When some handler is async,
    /// each server thread gets a runtime context with [`RuntimeConfig::default`] (see
    /// [`Node::start_with_runtime`]).
    pub fn start_with(
        fabric: Fabric,
        cfg: NodeConfig,
        server: ServerConfig,
    ) -> Result<Self, NodeError> {
        let runtime = cfg
            .rpc
            .as_ref()
            .is_some_and(|(h, _)| h.has_async())
            .then(|| ServerRuntime::new(RuntimeConfig::default()));
        Self::start_with_runtime(fabric, cfg, server, runtime)
    }

    /// Start the node's services on `fabric` with `settings`: its RPC server (if
    /// `cfg.rpc` asks for one, whose thread count wins) configured by `settings.server`
    /// and, when some handler is async, a runtime context with `settings.runtime` on
    /// each server thread.
    pub fn start_tuned(
        fabric: Fabric,
        cfg: NodeConfig,
        settings: &RpcSettings,
    ) -> Result<Self, NodeError> {
        let runtime = cfg
            .rpc
            .as_ref()
            .is_some_and(|(h, _)| h.has_async())
            .then(|| ServerRuntime::new(settings.runtime.clone()));
        Self::start_with_runtime(fabric, cfg, settings.server.clone(), runtime)
    }

    /// Start the node's services on `fabric`, with a runtime context on each RPC server
    /// thread if `runtime` asks for one: the thread's async handlers reach it through
    /// [`ThreadCtx::current`] and make calls and one-sided operations with it, posted
    /// and polled in the thread's own rounds. Control connections are authenticated with
    /// the process's cluster secret ([`crate::auth::process_secret`]), if it has one.
    /// Errors: the fabric, the control plane (including a secret that cannot be had), a
    /// server thread's start (including `runtime`'s per-thread setup).
    pub fn start_with_runtime(
        fabric: Fabric,
        cfg: NodeConfig,
        server: ServerConfig,
        runtime: Option<ServerRuntime>,
    ) -> Result<Self, NodeError> {
        let hook = runtime.map(|rt| rt.hook(&fabric));
        let rpc = match cfg.rpc {
            Some((handlers, threads)) => Some(Arc::new(RpcServer::with_hook(
                fabric.clone(),
                handlers,
                ServerConfig { threads, ..server },
                hook,
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
        let auth = ServerAuth::process(Identity::new(
            Some(shared.fabric.node().get()),
            shared.role.clone(),
        ))?;
        let bootstrap = BootstrapServer::start_with(cfg.listen, auth, move |peer, req| {
            handle_ctrl(&s, peer, req)
        })?;
        let (stop, stopped) = mpsc::channel::<()>();
        let s = shared.clone();
        let reaper = std::thread::Builder::new()
            .name("rrpc-reaper".into())
            .spawn(move || {
                // Sends never come: the Node's drop closes the channel.
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(REAP_PERIOD) {
                    reap(&s);
                }
            })
            .map_err(|source| NodeError::Thread {
                what: "reaper",
                source,
            })?;
        Ok(Self {
            shared,
            bootstrap: Some(bootstrap),
            reaper: Some((stop, reaper)),
        })
    }

    /// Fence incarnation `incarnation` of node `peer` (FaRM-style: after a membership
    /// service declared it dead, so that a false suspicion cannot corrupt anything):
    /// every QP of this node connected to it, passive one-sided ones and RPC ones, moves
    /// to the error state, so its later one-sided operations complete with an error and
    /// leave memory untouched (see [`Fabric::fence`] for the shm backend's residual
    /// window); its Rockets are dropped unanswered; its later connection setups are
    /// refused. A new incarnation of the same node id connects as usual. Returns how many
    /// QPs were moved to the error state.
    pub fn fence(&self, peer: crate::NodeId, incarnation: u64) -> usize {
        match &self.shared.rpc {
            Some(rpc) => rpc.fence(peer, incarnation),
            None => self.shared.fabric.fence(peer, incarnation),
        }
    }

    /// The bootstrap address peers connect to.
    pub fn addr(&self) -> SocketAddr {
        self.bootstrap.as_ref().expect("running").local_addr()
    }

    /// The node's fabric.
    pub fn fabric(&self) -> &Fabric {
        &self.shared.fabric
    }

    /// The settings its RPC server runs with; `None` for a node without one.
    pub fn server_config(&self) -> Option<&ServerConfig> {
        self.shared.rpc.as_deref().map(RpcServer::config)
    }
}

/// Per-thread setup run on each RPC server thread after its runtime context exists
/// (for example connecting to the nodes its async handlers call). Errors fail the
/// node's start.
pub type ThreadSetup = Arc<dyn Fn(&Rc<ThreadCtx>) -> Result<(), ConnectError> + Send + Sync>;

/// The runtime context of a node's RPC server threads (see
/// [`Node::start_with_runtime`]): its settings, shared QP pools, and an optional
/// per-thread setup.
#[derive(Clone)]
pub struct ServerRuntime {
    cfg: RuntimeConfig,
    setup: Option<ThreadSetup>,
}

impl ServerRuntime {
    /// Server threads get contexts with `cfg`.
    pub fn new(cfg: RuntimeConfig) -> Self {
        Self { cfg, setup: None }
    }

    /// Run `f` on each server thread once its context exists.
    pub fn with_setup(
        mut self,
        f: impl Fn(&Rc<ThreadCtx>) -> Result<(), ConnectError> + Send + Sync + 'static,
    ) -> Self {
        self.setup = Some(Arc::new(f));
        self
    }

    fn hook(self, fabric: &Fabric) -> ThreadHook {
        let straws = Straws::new(fabric.clone(), self.cfg.straw_config());
        Arc::new(move |thread, handle| {
            let ctx = ThreadCtx::with_handle(straws.clone(), self.cfg.clone(), handle.clone())
                .map_err(|e| e.to_string())?;
            ctx.set_server_thread(thread);
            if let Some(f) = &self.setup {
                f(&ctx).map_err(|e| e.to_string())?;
            }
            let guard = ctx.enter();
            Ok(Box::new(move || {
                let _ = &guard;
                ctx.progress()
            }) as Box<dyn FnMut() -> bool>)
        })
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(b) = self.bootstrap.take() {
            b.shutdown();
        }
        if let Some((stop, reaper)) = self.reaper.take() {
            drop(stop);
            let _ = reaper.join();
        }
        if let Some(rpc) = &self.shared.rpc {
            rpc.stop();
        }
    }
}

fn handle_ctrl(
    s: &Shared,
    peer: &Peer,
    req: serde_json::Value,
) -> Result<serde_json::Value, String> {
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
            // mappings of their memory) now as well as every REAP_PERIOD.
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
        CtrlRequest::ConnectRocket(offer) => {
            let rpc = s.rpc.as_ref().ok_or("this node serves no RPCs")?;
            check_offer_node(peer, offer.node)?;
            let accept = rpc.accept(offer).map_err(|e| e.to_string())?;
            serde_json::to_value(accept)
        }
    };
    out.map_err(|e| e.to_string())
}

/// On an authenticated connection, a Rocket pair is opened only for the node id the
/// connection proved: handlers own tickets and locks by that id ([`crate::server::Caller`]).
/// Without a secret (`peer.identity` is `None`) every offer is taken at its word, as
/// before.
fn check_offer_node(peer: &Peer, node: crate::NodeId) -> Result<(), String> {
    let Some(id) = &peer.identity else {
        return Ok(());
    };
    if id.node == Some(node.get()) {
        return Ok(());
    }
    let proved = id
        .node
        .map_or("no node id".to_string(), |n| format!("node {n}"));
    tracing::warn!(
        peer = %peer.addr,
        offered = %node,
        %proved,
        "control connection from {}: refused a Rocket pair for node {node}: the connection \
         authenticated as {proved}",
        peer.addr
    );
    Err(format!(
        "Rocket pair for node {node} refused: this connection authenticated as {proved}"
    ))
}

/// A passive QP (one-sided traffic only) connected to `endpoint`.
fn passive_qp(s: &Shared, endpoint: &QpEndpoint) -> Result<QueuePair, String> {
    let cq = s.fabric.create_cq(16).map_err(|e| e.to_string())?;
    let mut qp = s.fabric.create_qp(&cq, 16).map_err(|e| e.to_string())?;
    qp.connect(endpoint).map_err(|e| e.to_string())?;
    Ok(qp)
}
