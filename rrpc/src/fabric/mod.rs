//! The verbs-like fabric API and its backends.
//!
//! Terms follow libibverbs: a memory region (MR) has an `lkey` for local use and an
//! `rkey` that a peer names together with an address in the owner's virtual address
//! space ([`RemoteAddr`]); a reliable-connected queue pair (QP) takes lists of work
//! requests ([`SendWr`]) posted with one doorbell; completions ([`Wc`]) of *signaled*
//! WRs appear on a completion queue (CQ). Atomics are 8 bytes and 8-byte aligned.
//!
//! Backends sit behind enums ([`Fabric`], [`MemoryRegion`], [`QueuePair`],
//! [`CompletionQueue`]) so that a binary chooses one at run time while the layers
//! above stay unchanged; a `match` over the variant is the only dispatch on the hot
//! path. Backends: [`shm`] (always) and `verbs` (feature `verbs`).

pub mod memlock;
pub mod model;
pub mod shm;
#[cfg(feature = "verbs")]
pub mod verbs;

use crate::NodeId;
use std::sync::atomic::AtomicU64;

use serde::{Deserialize, Serialize};

use crate::mem::RingMem;

/// A remote memory location: an address in the owner's virtual address space and
/// the rkey of the MR that contains it, exactly as an RDMA WR names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RemoteAddr {
    /// Virtual address in the owner's address space (bytes).
    pub addr: u64,
    /// Remote key of the owner's MR.
    pub rkey: u32,
}

impl RemoteAddr {
    /// This address moved forward by `bytes`.
    pub fn offset(self, bytes: u64) -> Self {
        Self {
            addr: self.addr + bytes,
            rkey: self.rkey,
        }
    }
}

/// What a peer needs to reach an MR: base address, length in bytes and rkey.
/// Exchanged over the bootstrap service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MrDesc {
    /// Base virtual address in the owner's address space.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Remote key.
    pub rkey: u32,
}

impl MrDesc {
    /// Remote address of byte `offset` of this MR.
    pub fn at(&self, offset: u64) -> RemoteAddr {
        RemoteAddr {
            addr: self.addr + offset,
            rkey: self.rkey,
        }
    }
}

/// A local buffer inside a registered MR (verbs' scatter/gather element).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    /// Local virtual address (bytes).
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Local key of the MR containing `addr..addr+len`.
    pub lkey: u32,
}

/// The operation of a work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WrOpcode {
    /// RDMA READ of `sge.len` bytes from `remote` into `sge`.
    Read,
    /// RDMA WRITE of `sge` to `remote`. The last 8 bytes become visible last.
    Write,
    /// 8-byte compare-and-swap at `remote`; the old value lands in `sge` (8 bytes).
    CmpSwap {
        /// Value expected at `remote`.
        compare: u64,
        /// Value stored when the comparison holds.
        swap: u64,
    },
    /// 8-byte fetch-and-add at `remote`; the old value lands in `sge` (8 bytes).
    FetchAdd {
        /// Amount added (wrapping).
        add: u64,
    },
    /// SEND of `sge` into the next receive buffer the peer posted (`remote` unused). With
    /// none posted it fails with [`WcStatus::RnrRetryExceeded`] (on verbs after a few RNR
    /// retries); a payload longer than that buffer fails with
    /// [`WcStatus::RemoteInvalidRequest`] here and [`WcStatus::LocalLength`] there.
    Send,
}

/// A receive work request: a buffer for the peer's next SEND.
#[derive(Clone, Copy, Debug)]
pub struct RecvWr {
    /// Caller's identifier, returned in the receive [`Wc`].
    pub wr_id: u64,
    /// Where the message lands (its length is the largest message accepted).
    pub sge: Sge,
}

/// A send-queue work request.
#[derive(Clone, Copy, Debug)]
pub struct SendWr {
    /// Caller's identifier, returned in the [`Wc`].
    pub wr_id: u64,
    /// Operation.
    pub opcode: WrOpcode,
    /// Local buffer (source of WRITE, destination of READ and atomics).
    pub sge: Sge,
    /// Remote location.
    pub remote: RemoteAddr,
    /// Generate a completion on success (selective signaling). Errors always complete.
    pub signaled: bool,
    /// Send the payload inline: the local buffer may be reused as soon as `post_send`
    /// returns. Backends may inline small WRITEs unasked (verbs: up to 64 bytes).
    pub inline: bool,
}

/// Completion status (verbs' `ibv_wc_status`, the subset the backends produce).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcStatus {
    /// The WR completed.
    Success,
    /// Local buffer outside the MR named by its lkey (`IBV_WC_LOC_PROT_ERR`).
    LocalProtection,
    /// Remote address outside the MR of its rkey, or unknown rkey (`IBV_WC_REM_ACCESS_ERR`).
    RemoteAccess,
    /// Malformed request, e.g. an atomic that is not 8 bytes, 8-byte aligned (`IBV_WC_REM_INV_REQ_ERR`).
    RemoteInvalidRequest,
    /// The peer did not answer: it is gone (`IBV_WC_RETRY_EXC_ERR`). The QP is in error.
    RetryExceeded,
    /// Flushed because the QP was already in error (`IBV_WC_WR_FLUSH_ERR`).
    Flushed,
    /// A received message was longer than the receive buffer (`IBV_WC_LOC_LEN_ERR`).
    LocalLength,
    /// The local QP hit an error it cannot complete the WR with (`IBV_WC_LOC_QP_OP_ERR`;
    /// Soft-RoCE reports a too-long received message so).
    LocalQpOperation,
    /// The responder failed the operation (`IBV_WC_REM_OP_ERR`).
    RemoteOperation,
    /// The peer had no receive buffer posted (`IBV_WC_RNR_RETRY_EXC_ERR`).
    RnrRetryExceeded,
    /// Another `ibv_wc_status` code.
    Other(u32),
}

/// A work completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wc {
    /// The `wr_id` of the completed WR.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// Bytes transferred (READ/WRITE/SEND length, received bytes, 8 for atomics).
    pub byte_len: u32,
    /// A receive completion (of a [`RecvWr`]), not a send-queue one. Reliable for
    /// successful completions; verbs leaves the opcode of error completions undefined, so
    /// tell those apart by `wr_id`.
    pub recv: bool,
}

/// What peers may do to a memory region through its rkey: READ it, WRITE it, run
/// atomics (CAS, FAA) on it. The owner may always read and write it locally.
///
/// The verbs backend registers the region with exactly these remote rights (plus local
/// write, which remote write and atomics need), so the NIC refuses anything else with a
/// remote access error. The shm backend records nothing and enforces nothing: a peer
/// maps the region's file and could touch it anyway; on one host the boundary is the
/// files' owner and mode (0600, this user's), not the rkey.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteAccess {
    /// Peers may READ.
    pub read: bool,
    /// Peers may WRITE.
    pub write: bool,
    /// Peers may CAS and FAA.
    pub atomic: bool,
}

impl RemoteAccess {
    /// Nothing remote: a local buffer (a source of WRITEs, a target of READs).
    pub const NONE: Self = Self {
        read: false,
        write: false,
        atomic: false,
    };
    /// READ only.
    pub const READ: Self = Self {
        read: true,
        ..Self::NONE
    };
    /// WRITE only (a ring or a word peers write into).
    pub const WRITE: Self = Self {
        write: true,
        ..Self::NONE
    };
    /// Atomics only (a counter peers FAA).
    pub const ATOMIC: Self = Self {
        atomic: true,
        ..Self::NONE
    };
    /// READ, WRITE and atomics: the default of [`Fabric::alloc_mr`].
    pub const ALL: Self = Self {
        read: true,
        write: true,
        atomic: true,
    };
}

impl Default for RemoteAccess {
    fn default() -> Self {
        Self::ALL
    }
}

impl std::ops::BitOr for RemoteAccess {
    type Output = Self;
    fn bitor(self, o: Self) -> Self {
        Self {
            read: self.read || o.read,
            write: self.write || o.write,
            atomic: self.atomic || o.atomic,
        }
    }
}

/// Where device memory was placed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DmPlacement {
    /// On the NIC (`ibv_alloc_dm`).
    Device,
    /// The backend has no device memory; the region is host memory. `reason` says why.
    HostFallback {
        /// Human-readable reason, printed by services at start.
        reason: String,
    },
}

/// A QP's state, as far as the layers above care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpState {
    /// Created, not yet connected (verbs RESET/INIT).
    Init,
    /// Connected (verbs RTS).
    ReadyToSend,
    /// In error: a WR failed or the peer is gone. WRs posted now are flushed.
    Error,
}

/// What a peer needs to connect a QP to this one (verbs: QPN, PSN, GID, LID; shm: node id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpEndpoint {
    /// Cluster node id of the owner.
    pub node: NodeId,
    /// Queue pair number.
    pub qpn: u32,
    /// Initial packet sequence number.
    pub psn: u32,
    /// Port GID (RoCE) or zeroes.
    pub gid: [u8; 16],
    /// Port LID (InfiniBand) or 0.
    pub lid: u16,
    /// GID index the owner sends from (informational; each side uses its own).
    #[serde(default)]
    pub gid_index: u32,
    /// Active path MTU of the owner's port in bytes (0: not RDMA); the connection uses
    /// the smaller of the two sides'.
    #[serde(default)]
    pub mtu: u32,
    /// shm only: the QP's shared receive queue, where the peer finds posted receive
    /// buffers (a NIC keeps this state itself).
    #[serde(default)]
    pub recv_queue: Option<RemoteAddr>,
    /// The owner's incarnation ([`Fabric::incarnation`]): a QP is connected to one
    /// (node, incarnation), which [`Fabric::fence`] names (0 from a peer that predates
    /// incarnations).
    #[serde(default)]
    pub incarnation: u64,
}

/// Errors of fabric operations.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FabricError {
    /// An OS call failed; `op` names the fabric operation.
    #[error("{op}: {source}")]
    Io {
        /// The operation that failed.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A configuration or argument is invalid.
    #[error("invalid argument to {op}: {what}")]
    InvalidArgument {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        what: String,
    },
    /// `post_send` on a QP in error (the peer is gone or an earlier WR failed).
    #[error("queue pair to node {peer} is in error state: {why}")]
    QpError {
        /// Peer node id.
        peer: NodeId,
        /// Why it entered the error state.
        why: &'static str,
    },
    /// The node id is held by a live process in this cluster.
    #[error("node {node} of cluster {cluster} is already running (pid file {path})")]
    NodeInUse {
        /// Node id.
        node: NodeId,
        /// Cluster name.
        cluster: String,
        /// Path of the liveness file.
        path: String,
    },
    /// No usable RDMA device (libibverbs missing, no RDMA in the kernel, no device).
    #[error("{why}")]
    NoDevice {
        /// The message, starting "no RDMA device found".
        why: String,
    },
    /// A verb failed; `op` names it.
    #[error("{op}: {what}")]
    Verbs {
        /// The verb, e.g. `ibv_reg_mr`.
        op: &'static str,
        /// Its error (with errno meaning).
        what: String,
    },
    /// A file or directory of the shm fabric is not what this process creates there (a
    /// symlink, not a regular file or directory, another user's, or writable by group or
    /// others): refused rather than mapped, since another local user could plant it.
    #[error("refusing {path}: {why}")]
    UnsafeFile {
        /// The path.
        path: String,
        /// What is wrong with it.
        why: String,
    },
    /// The peer's incarnation was fenced ([`Fabric::fence`]): no QP connects to it.
    #[error("node {peer} incarnation {incarnation:#x} is fenced")]
    Fenced {
        /// Peer node id.
        peer: NodeId,
        /// The fenced incarnation.
        incarnation: u64,
    },
    /// The backend was not compiled in.
    #[error("this build has no {0} backend (build with --features verbs)")]
    NotBuilt(&'static str),
    /// The send queue is full; nothing of the list was posted.
    #[error("send queue full: {posted} outstanding + {asked} asked > depth {depth}")]
    SendQueueFull {
        /// WRs outstanding.
        posted: usize,
        /// WRs in the rejected list.
        asked: usize,
        /// Send queue depth.
        depth: usize,
    },
}

/// Result of fabric operations.
pub type Result<T> = std::result::Result<T, FabricError>;

/// Which backend a binary runs on (the `--fabric` flag).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum FabricKind {
    /// Shared memory on one host (the default).
    #[default]
    Shm,
    /// libibverbs: RDMA NICs and Soft-RoCE.
    Verbs,
}

impl std::str::FromStr for FabricKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "shm" => Ok(Self::Shm),
            "verbs" => Ok(Self::Verbs),
            other => Err(format!("unknown fabric {other:?}; expected shm or verbs")),
        }
    }
}

impl FabricKind {
    /// The backend named by `$RRPC_FABRIC` (`shm` when unset), as binaries and the test
    /// suites choose it. Errors: the variable names no backend.
    pub fn from_env() -> std::result::Result<Self, String> {
        match std::env::var("RRPC_FABRIC") {
            Ok(s) if !s.is_empty() => s.parse(),
            _ => Ok(Self::Shm),
        }
    }
}

impl std::fmt::Display for FabricKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Shm => f.write_str("shm"),
            Self::Verbs => f.write_str("verbs"),
        }
    }
}

/// How to open a fabric endpoint for one node of a cluster.
///
/// Non-exhaustive: outside rrpc, build one with [`FabricConfig::new`] and the `with_*`
/// setters.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct FabricConfig {
    /// Backend.
    pub kind: FabricKind,
    /// Cluster name; shm files live under `<shm root>/rrpc-<cluster>/`.
    pub cluster: String,
    /// This node's id, unique in the cluster.
    pub node: NodeId,
    /// RDMA device name (verbs; default: `RRPC_RDMA_DEVICE`, else the first device).
    pub device: Option<String>,
    /// GID index (verbs; default: `RRPC_GID_INDEX`, else the RoCEv2 IPv4-mapped GID).
    pub gid_index: Option<u32>,
    /// Port number (verbs; default: `RRPC_RDMA_PORT`, else 1).
    pub port: Option<u8>,
    /// RoCE traffic class of the QPs' GRH (verbs; DSCP in the upper 6 bits, ECN in the
    /// lower 2; default: `RRPC_TCLASS`, else 0). Lossless RoCE fabrics put RDMA traffic
    /// on a PFC priority chosen by it.
    pub traffic_class: Option<u8>,
    /// Service level of the QPs' address vector, 0 to 15 (verbs; default: `RRPC_SL`,
    /// else 0).
    pub service_level: Option<u8>,
    /// Timing model of the shm backend ([`model`]): `none`, `cx5`, `cx6`, `rxe`, `cx3-scaled` or the
    /// path of a TOML profile. `None`: `$RRPC_MODEL`, else none.
    pub model: Option<String>,
    /// This process's incarnation of `node` (see [`Fabric::incarnation`]): by default
    /// one that differs per process start ([`default_incarnation`]); a membership
    /// service that hands out incarnations sets its own.
    pub incarnation: u64,
}

/// An incarnation that differs per process start: the wall clock in nanoseconds mixed
/// with the process id (never 0).
pub fn default_incarnation() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (nanos ^ u64::from(std::process::id()).rotate_left(48)) | 1
}

impl FabricConfig {
    /// A config for `kind` with device and GID from the environment or defaults.
    pub fn new(kind: FabricKind, cluster: &str, node: NodeId) -> Self {
        Self {
            kind,
            cluster: cluster.into(),
            node,
            device: None,
            gid_index: None,
            port: None,
            traffic_class: None,
            service_level: None,
            model: None,
            incarnation: default_incarnation(),
        }
    }

    /// Set [`FabricConfig::device`]: the RDMA device name (verbs).
    pub fn with_device(mut self, device: Option<String>) -> Self {
        self.device = device;
        self
    }

    /// Set [`FabricConfig::gid_index`]: the GID index (verbs).
    pub fn with_gid_index(mut self, gid_index: Option<u32>) -> Self {
        self.gid_index = gid_index;
        self
    }

    /// Set [`FabricConfig::port`]: the RDMA port number (verbs).
    pub fn with_port(mut self, port: Option<u8>) -> Self {
        self.port = port;
        self
    }

    /// Set [`FabricConfig::traffic_class`]: the RoCE traffic class, DSCP in the upper 6
    /// bits and ECN in the lower 2 (verbs).
    pub fn with_traffic_class(mut self, traffic_class: Option<u8>) -> Self {
        self.traffic_class = traffic_class;
        self
    }

    /// Set [`FabricConfig::service_level`]: the service level, 0 to 15 (verbs).
    pub fn with_service_level(mut self, service_level: Option<u8>) -> Self {
        self.service_level = service_level;
        self
    }

    /// Set [`FabricConfig::model`]: the shm backend's timing model, a built-in name or a
    /// TOML profile's path (`None`: `$RRPC_MODEL`, else none).
    pub fn with_model(mut self, model: Option<String>) -> Self {
        self.model = model;
        self
    }

    /// Set [`FabricConfig::incarnation`]: this process's incarnation of the node.
    pub fn with_incarnation(mut self, incarnation: u64) -> Self {
        self.incarnation = incarnation;
        self
    }

    /// The timing model this config asks for (`model`, else `$RRPC_MODEL`), loaded.
    ///
    /// Errors: [`FabricError::InvalidArgument`] naming what is wrong with the profile.
    pub fn timing_model(&self) -> Result<Option<model::TimingModel>> {
        model::TimingModel::load_or_env(self.model.as_deref()).map_err(|e| {
            FabricError::InvalidArgument {
                op: "open fabric",
                what: e.to_string(),
            }
        })
    }
}

/// A process's handle on the fabric (verbs: device context + protection domain).
#[derive(Clone)]
pub enum Fabric {
    /// Shared-memory backend.
    Shm(shm::ShmFabric),
    /// libibverbs backend.
    #[cfg(feature = "verbs")]
    Verbs(verbs::VerbsFabric),
}

impl Fabric {
    /// Open the fabric for node `cfg.node`.
    ///
    /// Errors: [`FabricError::NodeInUse`] when a live process holds the node id; I/O errors.
    /// Errors: [`FabricError::InvalidArgument`] for a timing model that does not load, or
    /// one asked for on the verbs backend (the model stands in for a NIC; verbs has one).
    pub fn open(cfg: &FabricConfig) -> Result<Self> {
        let model = cfg.timing_model()?;
        match cfg.kind {
            FabricKind::Shm => Ok(Self::Shm(shm::ShmFabric::open_as(
                &cfg.cluster,
                cfg.node,
                model.map(std::sync::Arc::new),
                cfg.incarnation,
            )?)),
            _ if model.is_some() => Err(FabricError::InvalidArgument {
                op: "open fabric",
                what: format!(
                    "timing model {} asked for on the {} backend: the model stands in for an \
                     RNIC on shm only (unset RRPC_MODEL or pass --model none)",
                    model.map_or_else(String::new, |m| m.params().name.clone()),
                    cfg.kind
                ),
            }),
            #[cfg(feature = "verbs")]
            FabricKind::Verbs => {
                let opts = verbs::VerbsOptions {
                    device: cfg.device.clone(),
                    gid_index: cfg.gid_index,
                    port: cfg.port,
                    traffic_class: cfg.traffic_class,
                    service_level: cfg.service_level,
                    incarnation: Some(cfg.incarnation),
                }
                .with_env();
                Ok(Self::Verbs(verbs::VerbsFabric::open(cfg.node, &opts)?))
            }
            #[cfg(not(feature = "verbs"))]
            FabricKind::Verbs => Err(FabricError::NotBuilt("verbs")),
        }
    }

    /// This node's id.
    pub fn node(&self) -> NodeId {
        match self {
            Self::Shm(f) => f.node(),
            #[cfg(feature = "verbs")]
            Self::Verbs(f) => f.node(),
        }
    }

    /// This process's incarnation of its node id ([`FabricConfig::incarnation`]), sent
    /// to peers in every QP endpoint and Rocket offer.
    pub fn incarnation(&self) -> u64 {
        match self {
            Self::Shm(f) => f.incarnation(),
            #[cfg(feature = "verbs")]
            Self::Verbs(f) => f.incarnation(),
        }
    }

    fn fences(&self) -> &std::sync::Arc<Fences> {
        match self {
            Self::Shm(f) => f.fences(),
            #[cfg(feature = "verbs")]
            Self::Verbs(f) => f.fences(),
        }
    }

    /// Fence incarnation `incarnation` of node `peer` (FaRM-style, after a membership
    /// service declared it dead): every QP of this fabric connected to it moves to the
    /// error state now, and no QP connects to it later ([`QueuePair::connect`] fails
    /// with [`FabricError::Fenced`]); another incarnation of the same node id connects
    /// as usual. One-sided operations the fenced peer posts afterwards complete with an
    /// error WC and leave memory untouched: on verbs our end of the QP is in ERR, so the
    /// NIC drops its requests; on shm the peer executes its operations itself on mapped
    /// memory and checks the state word of our end (in shared memory) before each one,
    /// under a handshake: this call waits until a WR the peer began before it could see
    /// the state word has landed, or the peer process is dead (the `shm` module docs),
    /// so it blocks while the peer is stopped in the middle of a WR. Returns how many QPs
    /// were moved to error.
    pub fn fence(&self, peer: NodeId, incarnation: u64) -> usize {
        self.fences().fence(peer, incarnation)
    }

    /// Whether `(peer, incarnation)` was fenced on this fabric.
    pub fn is_fenced(&self, peer: NodeId, incarnation: u64) -> bool {
        self.fences().is_fenced(peer, incarnation)
    }

    /// Backend kind.
    pub fn kind(&self) -> FabricKind {
        match self {
            Self::Shm(_) => FabricKind::Shm,
            #[cfg(feature = "verbs")]
            Self::Verbs(_) => FabricKind::Verbs,
        }
    }

    /// The timing model in one line with its parameters (`none` without one), for
    /// benchmark headers.
    pub fn model_description(&self) -> String {
        match self {
            Self::Shm(f) => f.model().map_or_else(|| "none".into(), |m| m.describe()),
            #[cfg(feature = "verbs")]
            Self::Verbs(_) => "none (real NIC)".into(),
        }
    }

    /// The timing model's name (`none` without one).
    pub fn model_name(&self) -> String {
        match self {
            Self::Shm(f) => f
                .model()
                .map_or_else(|| "none".into(), |m| m.params().name.clone()),
            #[cfg(feature = "verbs")]
            Self::Verbs(_) => "none".into(),
        }
    }

    /// A one-line description of the backend for benchmark headers and logs.
    pub fn describe(&self) -> String {
        match self {
            Self::Shm(f) => f.describe(),
            #[cfg(feature = "verbs")]
            Self::Verbs(f) => f.describe(),
        }
    }

    /// Allocate and register `len` bytes (zeroed) readable and writable by peers, and
    /// open to their atomics ([`RemoteAccess::ALL`]); see [`Fabric::alloc_mr_with`].
    pub fn alloc_mr(&self, len: usize) -> Result<MemoryRegion> {
        self.alloc_mr_with(len, RemoteAccess::ALL)
    }

    /// Allocate and register `len` bytes (zeroed) that peers may access only as
    /// `access` says (enforced on verbs only; see [`RemoteAccess`]). Errors: a zero
    /// length; the mapping or the registration fails.
    pub fn alloc_mr_with(&self, len: usize, access: RemoteAccess) -> Result<MemoryRegion> {
        match self {
            Self::Shm(f) => {
                let _ = access; // not enforceable on shm; see RemoteAccess
                Ok(MemoryRegion::Shm(f.alloc_mr(len)?))
            }
            #[cfg(feature = "verbs")]
            Self::Verbs(f) => Ok(MemoryRegion::Verbs(f.alloc_mr_with(len, access)?)),
        }
    }

    /// Allocate `len` bytes of device memory (on the NIC) registered as an MR, or host
    /// memory when the backend has none; the placement says which, never silently.
    /// Peers get [`RemoteAccess::ALL`]; see [`Fabric::alloc_dm_with`].
    pub fn alloc_dm(&self, len: usize) -> Result<(MemoryRegion, DmPlacement)> {
        self.alloc_dm_with(len, RemoteAccess::ALL)
    }

    /// As [`Fabric::alloc_dm`], peers getting only `access` (enforced on verbs only;
    /// see [`RemoteAccess`]).
    pub fn alloc_dm_with(
        &self,
        len: usize,
        access: RemoteAccess,
    ) -> Result<(MemoryRegion, DmPlacement)> {
        #[cfg(not(feature = "verbs"))]
        let _ = access;
        match self {
            Self::Shm(f) => {
                let mr = f.alloc_dm(len)?;
                let reason = match f.model() {
                    Some(m) => format!(
                        "the shm fabric has no device memory; timing model {} charges atomics on \
                         it at device-memory rates",
                        m.params().name
                    ),
                    None => "the shm fabric has no device memory".into(),
                };
                Ok((MemoryRegion::Shm(mr), DmPlacement::HostFallback { reason }))
            }
            #[cfg(feature = "verbs")]
            Self::Verbs(f) => {
                let (mem, placement) = f.alloc_dm_with(len, access)?;
                let mr = match mem {
                    verbs::DmOrHost::Device(dm) => MemoryRegion::VerbsDm(dm),
                    verbs::DmOrHost::Host(mr) => MemoryRegion::Verbs(mr),
                };
                Ok((mr, placement))
            }
        }
    }

    /// Create a completion queue holding up to `depth` completions.
    pub fn create_cq(&self, depth: usize) -> Result<CompletionQueue> {
        match self {
            Self::Shm(f) => Ok(CompletionQueue::Shm(f.create_cq(depth))),
            #[cfg(feature = "verbs")]
            Self::Verbs(f) => Ok(CompletionQueue::Verbs(f.create_cq(depth)?)),
        }
    }

    /// Create an RC queue pair whose send completions go to `cq`; connect it with
    /// [`QueuePair::connect`] to the endpoint the peer returns.
    pub fn create_qp(&self, cq: &CompletionQueue, sq_depth: usize) -> Result<QueuePair> {
        match (self, cq) {
            (Self::Shm(f), CompletionQueue::Shm(cq)) => Ok(QueuePair::new(
                QpInner::Shm(f.create_qp(cq.clone(), sq_depth)?),
                f.fences().clone(),
            )),
            #[cfg(feature = "verbs")]
            (Self::Verbs(f), CompletionQueue::Verbs(cq)) => Ok(QueuePair::new(
                QpInner::Verbs(f.create_qp(cq, sq_depth)?),
                f.fences().clone(),
            )),
            #[cfg(feature = "verbs")]
            _ => Err(FabricError::InvalidArgument {
                op: "create_qp",
                what: "CQ of another backend".into(),
            }),
        }
    }
}

/// A registered memory region owned by this process.
pub enum MemoryRegion {
    /// Shared-memory backend.
    Shm(shm::ShmMr),
    /// libibverbs backend.
    #[cfg(feature = "verbs")]
    Verbs(verbs::VerbsMr),
    /// libibverbs device memory ([`Fabric::alloc_dm`] on a NIC that has it): a zero-based
    /// MR (its `addr` is 0) without a local mapping. The CPU reaches it only through
    /// [`MemoryRegion::read`], [`MemoryRegion::write`], [`MemoryRegion::load_u64`] and
    /// [`MemoryRegion::store_u64`] (memcpy calls, not atomic with respect to the NIC);
    /// [`MemoryRegion::as_ptr`] and [`MemoryRegion::atomic_u64`] panic on it.
    #[cfg(feature = "verbs")]
    VerbsDm(verbs::VerbsDm),
}

impl MemoryRegion {
    /// Base virtual address (bytes).
    pub fn addr(&self) -> u64 {
        match self {
            Self::Shm(m) => m.addr(),
            #[cfg(feature = "verbs")]
            Self::Verbs(m) => m.addr(),
            // Zero-based: remote addresses are offsets.
            #[cfg(feature = "verbs")]
            Self::VerbsDm(_) => 0,
        }
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Self::Shm(m) => m.len(),
            #[cfg(feature = "verbs")]
            Self::Verbs(m) => m.len(),
            #[cfg(feature = "verbs")]
            Self::VerbsDm(m) => m.len(),
        }
    }
    /// Whether the region has zero length.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Local key.
    pub fn lkey(&self) -> u32 {
        match self {
            Self::Shm(m) => m.key(),
            #[cfg(feature = "verbs")]
            Self::Verbs(m) => m.lkey(),
            #[cfg(feature = "verbs")]
            Self::VerbsDm(m) => m.lkey(),
        }
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        match self {
            Self::Shm(m) => m.key(),
            #[cfg(feature = "verbs")]
            Self::Verbs(m) => m.rkey(),
            #[cfg(feature = "verbs")]
            Self::VerbsDm(m) => m.rkey(),
        }
    }
    /// Descriptor for peers.
    pub fn desc(&self) -> MrDesc {
        MrDesc {
            addr: self.addr(),
            len: self.len() as u64,
            rkey: self.rkey(),
        }
    }
    /// Scatter/gather element for bytes `offset..offset+len` of this MR.
    ///
    /// Panics if the range is outside the MR (a programming error in the caller).
    pub fn sge(&self, offset: usize, len: usize) -> Sge {
        assert!(offset + len <= self.len(), "sge outside the MR");
        Sge {
            addr: self.addr() + offset as u64,
            len: len as u32,
            lkey: self.lkey(),
        }
    }
    /// Base pointer of the local mapping.
    ///
    /// Panics on device memory (`MemoryRegion::VerbsDm`, feature `verbs`), which has none.
    pub fn as_ptr(&self) -> *mut u8 {
        match self {
            Self::Shm(m) => m.as_ptr(),
            #[cfg(feature = "verbs")]
            Self::Verbs(m) => m.as_ptr(),
            #[cfg(feature = "verbs")]
            Self::VerbsDm(_) => {
                panic!("device memory has no local mapping: use read/write/load_u64/store_u64")
            }
        }
    }

    /// Device memory reached through memcpy calls, if this is such a region.
    #[cfg(feature = "verbs")]
    fn device(&self) -> Option<&verbs::VerbsDm> {
        match self {
            Self::VerbsDm(d) => Some(d),
            _ => None,
        }
    }

    /// Device memory reached through memcpy calls, if this is such a region.
    #[cfg(not(feature = "verbs"))]
    fn device(&self) -> Option<&std::convert::Infallible> {
        None
    }
    /// The 8-byte word at `offset` as an atomic, for CPU-side access by the owner.
    ///
    /// Panics if `offset` is not 8-byte aligned or out of range. Remember the rule for
    /// shared words: a word modified by remote RDMA atomics must not also be
    /// modified by CPU atomics.
    pub fn atomic_u64(&self, offset: usize) -> &AtomicU64 {
        assert!(
            offset.is_multiple_of(8) && offset + 8 <= self.len(),
            "bad atomic offset"
        );
        // SAFETY: in range and 8-aligned (the MR base is page aligned); the mapping lives as
        // long as `self`; AtomicU64 has the layout of u64 and all bit patterns are valid.
        unsafe { &*(self.as_ptr().add(offset) as *const AtomicU64) }
    }
}

impl MemoryRegion {
    /// 8-byte load with Acquire ordering at byte `off` (8-byte aligned; panics otherwise).
    /// On device memory, a memcpy from the NIC.
    pub fn load_u64(&self, off: usize) -> u64 {
        if self.device().is_some() {
            let mut b = [0u8; 8];
            self.read(off, &mut b);
            return u64::from_le_bytes(b);
        }
        self.atomic_u64(off)
            .load(std::sync::atomic::Ordering::Acquire)
    }
    /// 8-byte store with Release ordering at byte `off` (8-byte aligned; panics otherwise).
    /// On device memory, a memcpy to the NIC.
    pub fn store_u64(&self, off: usize, v: u64) {
        if self.device().is_some() {
            self.write(off, &v.to_le_bytes());
            return;
        }
        self.atomic_u64(off)
            .store(v, std::sync::atomic::Ordering::Release)
    }
    /// Copy `dst.len()` bytes at byte `off` out of the region (panics when out of range,
    /// or when the provider refuses a device-memory copy).
    pub fn read(&self, off: usize, dst: &mut [u8]) {
        assert!(off + dst.len() <= self.len(), "read outside the MR");
        #[cfg(feature = "verbs")]
        if let Some(d) = self.device() {
            d.read(off, dst).expect("ibv_memcpy_from_dm");
            return;
        }
        // SAFETY: range checked; peers may write concurrently, which the ring protocol
        // tolerates by checking labels with acquire loads before and after copying.
        unsafe {
            std::ptr::copy_nonoverlapping(self.as_ptr().add(off), dst.as_mut_ptr(), dst.len())
        }
    }
    /// Copy `src` into the region at byte `off` (panics when out of range).
    pub fn write(&self, off: usize, src: &[u8]) {
        assert!(off + src.len() <= self.len(), "write outside the MR");
        #[cfg(feature = "verbs")]
        if let Some(d) = self.device() {
            d.write(off, src).expect("ibv_memcpy_to_dm");
            return;
        }
        // SAFETY: range checked; the mapping is writable and lives as long as `self`.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.as_ptr().add(off), src.len()) }
    }
    /// Zero `len` bytes at byte `off` (panics when out of range).
    pub fn zero(&self, off: usize, len: usize) {
        assert!(off + len <= self.len(), "zero outside the MR");
        if self.device().is_some() {
            self.write(off, &vec![0u8; len]);
            return;
        }
        // SAFETY: range checked; the mapping is writable.
        unsafe { std::ptr::write_bytes(self.as_ptr().add(off), 0, len) }
    }
}

impl RingMem for MemoryRegion {
    fn len(&self) -> usize {
        MemoryRegion::len(self)
    }
    fn load_u64(&self, off: usize) -> u64 {
        MemoryRegion::load_u64(self, off)
    }
    fn store_u64(&self, off: usize, v: u64) {
        MemoryRegion::store_u64(self, off, v)
    }
    fn read(&self, off: usize, dst: &mut [u8]) {
        MemoryRegion::read(self, off, dst)
    }
    fn write(&self, off: usize, src: &[u8]) {
        MemoryRegion::write(self, off, src)
    }
    fn zero(&self, off: usize, len: usize) {
        MemoryRegion::zero(self, off, len)
    }
}

/// A completion queue. Cloning shares the queue.
#[derive(Clone)]
pub enum CompletionQueue {
    /// Shared-memory backend.
    Shm(shm::ShmCq),
    /// libibverbs backend.
    #[cfg(feature = "verbs")]
    Verbs(verbs::VerbsCq),
}

impl CompletionQueue {
    /// Move up to `out.capacity() - out.len()` (at least one) completions into `out`; returns how many.
    pub fn poll(&self, out: &mut Vec<Wc>, max: usize) -> usize {
        match self {
            Self::Shm(c) => c.poll(out, max),
            #[cfg(feature = "verbs")]
            Self::Verbs(c) => c.poll(out, max),
        }
    }
}

/// The fence registry of one fabric ([`Fabric::fence`]): the fenced (node,
/// incarnation) pairs, and an entry per connected QP through which a fence moves it to
/// the error state from any thread.
#[derive(Default)]
pub(crate) struct Fences {
    fenced: std::sync::Mutex<std::collections::HashSet<(NodeId, u64)>>,
    qps: std::sync::Mutex<Vec<std::sync::Weak<FenceEntry>>>,
}

/// Moves one QP to the error state; called under its entry's lock, which the QP's drop
/// takes to clear it before the QP is destroyed.
pub(crate) type KillQp = Box<dyn FnMut() + Send>;

/// A connected QP's entry in its fabric's [`Fences`].
pub(crate) struct FenceEntry {
    peer: NodeId,
    incarnation: u64,
    kill: std::sync::Mutex<Option<KillQp>>,
}

fn lock_ignoring_poison<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Fences {
    fn is_fenced(&self, peer: NodeId, incarnation: u64) -> bool {
        lock_ignoring_poison(&self.fenced).contains(&(peer, incarnation))
    }

    /// Enter a QP connected to `(peer, incarnation)`; refused when that is fenced. Under
    /// the fenced set's lock, so a concurrent [`Fences::fence`] either sees the entry or
    /// made this refuse.
    fn register(
        &self,
        peer: NodeId,
        incarnation: u64,
        kill: KillQp,
    ) -> Result<std::sync::Arc<FenceEntry>> {
        let fenced = lock_ignoring_poison(&self.fenced);
        if fenced.contains(&(peer, incarnation)) {
            return Err(FabricError::Fenced { peer, incarnation });
        }
        let e = std::sync::Arc::new(FenceEntry {
            peer,
            incarnation,
            kill: std::sync::Mutex::new(Some(kill)),
        });
        let mut qps = lock_ignoring_poison(&self.qps);
        qps.retain(|w| w.strong_count() > 0);
        qps.push(std::sync::Arc::downgrade(&e));
        drop(fenced);
        Ok(e)
    }

    fn fence(&self, peer: NodeId, incarnation: u64) -> usize {
        lock_ignoring_poison(&self.fenced).insert((peer, incarnation));
        let live: Vec<_> = lock_ignoring_poison(&self.qps)
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .filter(|e| e.peer == peer && e.incarnation == incarnation)
            .collect();
        let mut n = 0;
        for e in live {
            if let Some(k) = lock_ignoring_poison(&e.kill).as_mut() {
                k();
                n += 1;
            }
        }
        n
    }
}

/// An RC queue pair.
pub struct QueuePair {
    inner: QpInner,
    probe: Probe,
    watch: Option<PeerWatch>,
    /// The liveness channel closed: the peer is gone for good.
    peer_dead: bool,
    fences: std::sync::Arc<Fences>,
    /// This QP's entry in the fence registry, once connected.
    fence: Option<std::sync::Arc<FenceEntry>>,
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // Before the backend QP is destroyed: a fence must not touch it any more.
        if let Some(e) = &self.fence {
            *lock_ignoring_poison(&e.kill) = None;
        }
    }
}

enum QpInner {
    Shm(shm::ShmQp),
    #[cfg(feature = "verbs")]
    Verbs(verbs::VerbsQp),
}

/// The control-plane connection a QP was set up over, kept open as a liveness channel,
/// like an rdma_cm connection: when the peer process dies the kernel closes it. Transport
/// retries cannot be relied on for this (Soft-RoCE on Linux 6.1 never completes WRs to a
/// QP whose process died with `RETRY_EXC_ERR`; they stay outstanding).
struct PeerWatch {
    stream: std::net::TcpStream,
}

/// Rate limit for liveness and state probes on hot paths: due at most once per period,
/// read from the coarse monotonic clock (a few ns; resolution a jiffy, 1 to 4 ms), since a
/// precise clock read on every post or poll costs more than the post itself.
#[derive(Debug)]
pub(crate) struct Probe {
    next_us: u64,
}

impl Probe {
    /// A probe first due now.
    pub(crate) fn new() -> Self {
        Self { next_us: 0 }
    }
    /// Whether a probe is due; if so, the next one is `period` from now.
    pub(crate) fn due(&mut self, period: std::time::Duration) -> bool {
        let now = coarse_now_us();
        if now < self.next_us {
            return false;
        }
        self.next_us = now + period.as_micros() as u64;
        true
    }
}

/// Microseconds on `CLOCK_MONOTONIC_COARSE`.
fn coarse_now_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant Linux knows.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
}

/// How often a watched QP probes its liveness channel.
const WATCH_PERIOD: std::time::Duration = std::time::Duration::from_millis(1);

impl PeerWatch {
    /// Whether the peer closed the connection (a non-blocking peek reads end of stream).
    fn peer_closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        match self.stream.peek(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
            Err(_) => true,
        }
    }
}

impl QueuePair {
    /// Watch the peer through `stream`, the control-plane connection this QP was set up
    /// over (keep it open on both sides): once the peer closes it (its process exited,
    /// however), the QP enters the error state: [`QueuePair::state`] says so and posts are
    /// refused. Errors: the socket cannot be made non-blocking.
    pub fn watch_peer(&mut self, stream: std::net::TcpStream) -> Result<()> {
        stream
            .set_nonblocking(true)
            .map_err(|source| FabricError::Io {
                op: "watch peer",
                source,
            })?;
        self.watch = Some(PeerWatch { stream });
        Ok(())
    }

    fn peer_gone(&mut self) -> bool {
        self.refresh();
        self.peer_dead
    }

    /// At most once per [`WATCH_PERIOD`]: look at the liveness channel and let the backend
    /// probe its state (shm: the peer's liveness lock; verbs: `ibv_query_qp`). One coarse
    /// clock read per call otherwise.
    fn refresh(&mut self) {
        if !self.probe.due(WATCH_PERIOD) {
            return;
        }
        if !self.peer_dead && self.watch.as_mut().is_some_and(PeerWatch::peer_closed) {
            self.peer_dead = true;
        }
        match &mut self.inner {
            QpInner::Shm(q) => q.probe(),
            #[cfg(feature = "verbs")]
            QpInner::Verbs(q) => q.refresh(),
        }
    }

    fn new(inner: QpInner, fences: std::sync::Arc<Fences>) -> Self {
        Self {
            inner,
            probe: Probe::new(),
            watch: None,
            peer_dead: false,
            fences,
            fence: None,
        }
    }

    /// This QP's endpoint, to send to the peer.
    pub fn endpoint(&self) -> QpEndpoint {
        match &self.inner {
            QpInner::Shm(q) => q.endpoint(),
            #[cfg(feature = "verbs")]
            QpInner::Verbs(q) => q.endpoint(),
        }
    }
    /// Connect to the peer's endpoint (verbs: INIT -> RTR -> RTS). Errors:
    /// [`FabricError::Fenced`] when the endpoint's (node, incarnation) was fenced on this
    /// fabric (the QP is left in the error state); the backend's errors.
    pub fn connect(&mut self, remote: &QpEndpoint) -> Result<()> {
        if self.fences.is_fenced(remote.node, remote.incarnation) {
            return Err(FabricError::Fenced {
                peer: remote.node,
                incarnation: remote.incarnation,
            });
        }
        let kill = match &mut self.inner {
            QpInner::Shm(q) => {
                q.connect(remote)?;
                q.kill_handle()
            }
            #[cfg(feature = "verbs")]
            QpInner::Verbs(q) => {
                q.connect(remote)?;
                q.kill_handle()
            }
        };
        match self.fences.register(remote.node, remote.incarnation, kill) {
            Ok(e) => {
                self.fence = Some(e);
                Ok(())
            }
            Err(e) => {
                let _ = self.to_error();
                Err(e)
            }
        }
    }

    /// The incarnation of the peer this QP is connected to (0 before connect, or from a
    /// peer that sends none).
    pub fn peer_incarnation(&self) -> u64 {
        self.fence.as_ref().map_or(0, |e| e.incarnation)
    }
    /// Send-queue depth in WRs.
    pub fn sq_depth(&self) -> usize {
        match &self.inner {
            QpInner::Shm(q) => q.sq_depth(),
            #[cfg(feature = "verbs")]
            QpInner::Verbs(q) => q.sq_depth(),
        }
    }
    /// Peer node id (after connect).
    pub fn peer(&self) -> NodeId {
        match &self.inner {
            QpInner::Shm(q) => q.peer(),
            #[cfg(feature = "verbs")]
            QpInner::Verbs(q) => q.peer(),
        }
    }
    /// Post a list of WRs with one doorbell. On error nothing of the list was posted.
    ///
    /// Errors: [`FabricError::QpError`] when the QP is in error, [`FabricError::SendQueueFull`],
    /// [`FabricError::InvalidArgument`] for an atomic that is not 8 bytes at an 8-byte
    /// aligned address. Remote failures (bad rkey, out of range, dead peer) arrive as error
    /// [`Wc`]s and put the QP in error.
    pub fn post_send(&mut self, wrs: &[SendWr]) -> Result<()> {
        // Providers differ on where a malformed atomic fails (rxe: EINVAL at post; a NIC:
        // an error completion); refuse it here, the same on every backend.
        if let Some(w) = wrs.iter().find(|w| {
            matches!(
                w.opcode,
                WrOpcode::CmpSwap { .. } | WrOpcode::FetchAdd { .. }
            ) && (!w.remote.addr.is_multiple_of(8) || w.sge.len != 8)
        }) {
            return Err(FabricError::InvalidArgument {
                op: "post_send",
                what: format!(
                    "atomic WR {} must be 8 bytes at an 8-byte aligned address (remote {:#x}, {} bytes)",
                    w.wr_id, w.remote.addr, w.sge.len
                ),
            });
        }
        let why = match self.state() {
            QpState::ReadyToSend => None,
            QpState::Init => Some("not connected"),
            QpState::Error if self.peer_dead => {
                Some("the peer closed its control connection (process gone)")
            }
            QpState::Error => Some("peer gone or an earlier work request failed"),
        };
        if let Some(why) = why {
            return Err(FabricError::QpError {
                peer: self.peer(),
                why,
            });
        }
        let depth = self.sq_depth();
        if wrs.len() > depth {
            return Err(FabricError::SendQueueFull {
                posted: 0,
                asked: wrs.len(),
                depth,
            });
        }
        match &mut self.inner {
            QpInner::Shm(q) => q.post_send(wrs),
            #[cfg(feature = "verbs")]
            QpInner::Verbs(q) => q.post_send(wrs),
        }
    }
    /// Post receive buffers for the peer's SENDs, in order. Errors: the receive queue is
    /// full ([`FabricError::InvalidArgument`]), or the QP is in error.
    pub fn post_recv(&mut self, wrs: &[RecvWr]) -> Result<()> {
        match &mut self.inner {
            QpInner::Shm(q) => q.post_recv(wrs),
            #[cfg(feature = "verbs")]
            QpInner::Verbs(q) => q.post_recv(wrs),
        }
    }

    /// Move the QP to the error state, as a transport failure would (verbs:
    /// `ibv_modify_qp` to ERR, outstanding WRs complete with [`WcStatus::Flushed`]).
    /// Used for fault injection in tests and benchmarks. Errors: the verbs call failed.
    pub fn to_error(&mut self) -> Result<()> {
        match &mut self.inner {
            QpInner::Shm(q) => {
                q.to_error();
                Ok(())
            }
            #[cfg(feature = "verbs")]
            QpInner::Verbs(q) => q.to_error(),
        }
    }

    /// Current state; also notices a peer that has exited (probed at most once a
    /// millisecond).
    pub fn state(&mut self) -> QpState {
        if self.peer_gone() {
            return QpState::Error;
        }
        match &mut self.inner {
            QpInner::Shm(q) => q.state(),
            #[cfg(feature = "verbs")]
            QpInner::Verbs(q) => q.state(),
        }
    }
}
