//! The oracle's counter and the client that takes timestamps from it with one-sided FAA
//! (Scythe 4.5, Fig. 18, the "TSO service" box).

use rrpc::fabric::{DmPlacement, Fabric, FabricError, MemoryRegion, RemoteAddr};
use rrpc::node::{Node, NodeConfig, NodeInfo};
use rrpc::runtime::{RpcError, ThreadCtx};
use rrpc::NodeId;
use serde::{Deserialize, Serialize};

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::group::{GroupFailure, GroupStats, TsoGroup};
use crate::source::TsoSources;
use crate::timestamp::{Timestamp, TimestampRange, EPOCH_SHIFT};

/// Name under which [`Oracle::export`] is published in a node's exports.
pub const EXPORT_NAME: &str = "tso";
/// Bytes of the counter (one 8-byte word, as RDMA atomics require).
pub const COUNTER_BYTES: usize = 8;

/// What an oracle exports to its clients (JSON on the control plane).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TsoExport {
    /// The 8-byte, 8-byte-aligned counter word.
    pub counter: RemoteAddr,
    /// Where the counter lives: `"device"` or `"host-fallback: <reason>"`.
    pub placement: String,
    /// The incarnation ([`crate::epoch`]): every timestamp this oracle hands out has it
    /// in its high 16 bits. Absent in exports of older oracles: 0.
    #[serde(default)]
    pub epoch: u16,
    /// A random id of this oracle process, drawn at its start: tells two incarnations
    /// apart when their epochs and counter words are the same (an oracle restarted
    /// without its state dir, on zero-based device memory whose address and key repeat).
    /// Absent in exports of older oracles: 0.
    #[serde(default)]
    pub incarnation: u64,
}

/// Errors of the oracle and its clients.
#[derive(Debug, thiserror::Error)]
pub enum TsoError {
    /// Allocating the counter failed.
    #[error("allocating the TSO counter: {0}")]
    Fabric(#[from] FabricError),
    /// The FAA failed (peer gone, completion error, not connected).
    #[error(transparent)]
    Rpc(#[from] RpcError),
    /// The node exports no usable `"tso"` entry.
    #[error("TSO export: {0}")]
    Export(String),
    /// The TSO group's leader got no range for this request's group.
    #[error("TSO group")]
    Group(#[from] GroupFailure<Arc<TsoError>>),
    /// The oracle stopped answering and did not come back within the reconnect wait
    /// ([`crate::conn::ReconnectConfig::wait`]).
    #[error("TSO oracle at {addr} unavailable for {waited:?}")]
    Unavailable {
        /// The oracle's bootstrap address.
        addr: std::net::SocketAddr,
        /// How long the request waited.
        waited: std::time::Duration,
        /// The last failure (the FAA's, or reaching the control plane).
        #[source]
        source: Box<RpcError>,
    },
    /// The oracle came back with an epoch that is not larger than the one this client
    /// used (restarted without `--state-dir`, or its state directory was lost or rolled
    /// back): its timestamps could go back, so none is taken.
    #[error("TSO oracle at {addr} restarted in epoch {new}, not after epoch {old}: timestamps would go back (is its --state-dir durable?)")]
    WentBack {
        /// The oracle's bootstrap address.
        addr: std::net::SocketAddr,
        /// Epoch the client used.
        old: u16,
        /// Epoch of the restarted oracle.
        new: u16,
    },
    /// A request for zero timestamps.
    #[error("asked for zero timestamps")]
    ZeroCount,
    /// A setting is out of range (the text names the key and the rule).
    #[error("config: {0}")]
    Config(String),
    /// Starting a node (a TSO proxy's) failed.
    #[error("starting the node")]
    Start(#[source] rrpc::node::NodeError),
    /// A TSO proxy got a range from the oracle that does not start above the highest
    /// timestamp it issued, or of an epoch in which that happened before (an oracle
    /// that went back under an export the epoch check could not tell apart): refused
    /// ([`crate::proxy::Highest`]).
    #[error("the oracle went back: range starting at {got} after {highest} was issued")]
    Regression {
        /// Highest timestamp the proxy had issued.
        highest: Timestamp,
        /// First timestamp of the range the oracle returned.
        got: Timestamp,
    },
    /// A TSO proxy's reply is malformed or not what was asked for.
    #[error("TSO proxy node {node}: bad reply: {what}")]
    BadReply {
        /// The proxy's node id.
        node: NodeId,
        /// What is wrong.
        what: String,
    },
    /// Every timestamp source (proxies and oracle) failed this request.
    #[error("all {tried} timestamp source(s) failed; the last")]
    NoSource {
        /// Sources tried.
        tried: usize,
        /// The last source's error.
        #[source]
        last: Box<TsoError>,
    },
    /// The range would leave the oracle's epoch (more than `2^48 - 1` timestamps in one
    /// incarnation): refused, because a later incarnation may hand those values out.
    /// Restart the oracle to open a new epoch.
    #[error("timestamp counter of epoch {epoch} exhausted at {at:#x} (asked for {n})")]
    Exhausted {
        /// The oracle's epoch.
        epoch: u16,
        /// Counter value before the FAA.
        at: u64,
        /// Timestamps asked for.
        n: u64,
    },
}

rrpc::from_rpc_errors!(TsoError, TsoError::Rpc);

/// Human-readable form of a placement, as exported and printed at start.
pub fn describe_placement(p: &DmPlacement) -> String {
    match p {
        DmPlacement::Device => "device".into(),
        DmPlacement::HostFallback { reason } => format!("host-fallback: {reason}"),
    }
}

/// The oracle: an 8-byte counter in device memory (or its reported host fallback),
/// starting at `epoch << 48`.
pub struct Oracle {
    counter: MemoryRegion,
    placement: DmPlacement,
    epoch: u16,
    incarnation: u64,
}

impl Oracle {
    /// Allocate the counter on `fabric` with `alloc_dm`, in epoch 0: the counter starts
    /// at 0, so the first timestamp handed out is 1. Volatile: a restarted oracle made
    /// this way goes back (tests and embedded use); the `tso` binary uses
    /// [`Oracle::with_epoch`] with [`crate::epoch::advance`].
    ///
    /// Errors: [`TsoError::Fabric`] when allocation fails.
    pub fn new(fabric: &Fabric) -> Result<Self, TsoError> {
        Self::with_epoch(fabric, 0)
    }

    /// Allocate the counter and set it to `epoch << 48` (the first timestamp is
    /// `epoch << 48 | 1`). `epoch` must be durable already ([`crate::epoch::advance`])
    /// and larger than every earlier incarnation's.
    ///
    /// The CPU writes the word once, before it is exported: no RDMA atomic can reach it
    /// yet, so DESIGN.md's rule for shared words holds.
    ///
    /// Errors: [`TsoError::Fabric`] when allocation fails.
    pub fn with_epoch(fabric: &Fabric, epoch: u16) -> Result<Self, TsoError> {
        let (counter, placement) = fabric.alloc_dm(COUNTER_BYTES)?;
        Ok(Self::over(counter, placement, epoch))
    }

    /// [`Oracle::new`] with the counter in host memory even where the NIC has device
    /// memory, reported as a host placement: for benchmarks that compare the two
    /// (`tso-bench --counter host`; on host memory every atomic on the counter needs the
    /// responder's PCIe read and write back, Scythe 2.3 and Table 1).
    ///
    /// Errors: [`TsoError::Fabric`] when allocation fails.
    pub fn in_host_memory(fabric: &Fabric) -> Result<Self, TsoError> {
        let counter = fabric.alloc_mr(COUNTER_BYTES)?;
        let placement = DmPlacement::HostFallback {
            reason: "host memory asked for".into(),
        };
        Ok(Self::over(counter, placement, 0))
    }

    fn over(counter: MemoryRegion, placement: DmPlacement, epoch: u16) -> Self {
        // A release store (a memcpy to the NIC on device memory).
        counter.store_u64(0, (epoch as u64) << EPOCH_SHIFT);
        Self {
            counter,
            placement,
            epoch,
            // Never 0, the value of exports without the field.
            incarnation: rand::random::<u64>() | 1,
        }
    }

    /// This incarnation's epoch.
    pub fn epoch(&self) -> u16 {
        self.epoch
    }

    /// Where the counter lives. Services print this at start; a host fallback is never
    /// silent.
    pub fn placement(&self) -> &DmPlacement {
        &self.placement
    }

    /// The export clients need, as a typed value.
    pub fn tso_export(&self) -> TsoExport {
        TsoExport {
            counter: self.counter.desc().at(0),
            placement: describe_placement(&self.placement),
            epoch: self.epoch,
            incarnation: self.incarnation,
        }
    }

    /// Start the node that serves this oracle on `fabric` (the fabric the counter was
    /// allocated on), its control plane listening on `listen`: role `"tso"`, the export
    /// under [`EXPORT_NAME`], no RPC handlers (clients take timestamps with one-sided
    /// FAA). The returned node serves until dropped; keep the oracle alive as long.
    ///
    /// Errors: [`TsoError::Start`] when the node cannot start (the address is taken).
    pub fn serve(&self, fabric: Fabric, listen: SocketAddr) -> Result<Node, TsoError> {
        let mut exports = BTreeMap::new();
        exports.insert(EXPORT_NAME.to_string(), self.export());
        Node::start(
            fabric,
            NodeConfig {
                role: "tso".into(),
                listen,
                exports,
                rpc: None,
            },
        )
        .map_err(TsoError::Start)
    }

    /// The export as JSON, to publish under [`EXPORT_NAME`] in the node's exports.
    pub fn export(&self) -> serde_json::Value {
        serde_json::to_value(self.tso_export()).expect("TsoExport serializes")
    }

    /// The counter's value (the last timestamp taken, `epoch << 48` before the first),
    /// read by this CPU. A plain load: the oracle modifies the counter only before export.
    pub fn current(&self) -> Timestamp {
        Timestamp(self.counter.load_u64(0))
    }

    /// **Broken on purpose** (test builds and feature `fault-injection` only): set the
    /// counter back to `to` under the same export. That is how an oracle restarted
    /// without its state directory looks to a client if its new counter got the old one's
    /// address and key (verbs device memory is zero-based, keys can repeat): the epoch
    /// check of [`crate::conn`] takes it for the same incarnation, and only a TSO
    /// proxy's highest-issued check ([`crate::proxy::Highest`]) can catch it. Call only
    /// while no client FAAs the counter (the CPU must not race the NIC's atomics).
    #[cfg(any(test, feature = "fault-injection"))]
    pub fn rewind(&self, to: Timestamp) {
        self.counter.store_u64(0, to.get());
    }
}

/// A thread's handle on an oracle: takes timestamps with one-sided FAA. Connect with
/// `ThreadCtx::connect` (one-sided only; the oracle serves no RPCs).
#[derive(Clone, Debug)]
pub struct TsoClient {
    pub(crate) node: NodeId,
    pub(crate) counter: RemoteAddr,
    pub(crate) placement: String,
    pub(crate) epoch: u16,
    pub(crate) incarnation: u64,
}

impl TsoClient {
    /// A client for the oracle described by `info`.
    ///
    /// Errors: [`TsoError::Export`] when the `"tso"` export is missing or malformed.
    pub fn from_info(info: &NodeInfo) -> Result<Self, TsoError> {
        let e: TsoExport = info
            .export(EXPORT_NAME)
            .map_err(|e| TsoError::Export(e.to_string()))?;
        if e.counter.addr & 7 != 0 {
            return Err(TsoError::Export(format!(
                "counter address {:#x} is not 8-byte aligned",
                e.counter.addr
            )));
        }
        Ok(Self {
            node: info.node,
            counter: e.counter,
            placement: e.placement,
            epoch: e.epoch,
            incarnation: e.incarnation,
        })
    }

    /// Node id of the oracle.
    pub fn node(&self) -> NodeId {
        self.node
    }

    /// The counter word of this incarnation.
    pub fn counter(&self) -> RemoteAddr {
        self.counter
    }

    /// The oracle's epoch as it exported it.
    pub fn epoch(&self) -> u16 {
        self.epoch
    }

    /// The oracle process's random id ([`TsoExport::incarnation`]; 0 from an older
    /// oracle).
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// The oracle's counter placement as it exported it.
    pub fn placement(&self) -> &str {
        &self.placement
    }

    /// One timestamp (`>= 1`): one FAA of +1, returning the old value + 1.
    ///
    /// Errors: [`TsoError::Rpc`] when the FAA fails, [`TsoError::Exhausted`].
    pub async fn timestamp(&self, ctx: &ThreadCtx) -> Result<Timestamp, TsoError> {
        Ok(self.timestamps(ctx, 1).await?.first())
    }

    /// `n` consecutive timestamps `old + 1 .. old + 1 + n` with one FAA of `n`.
    ///
    /// Errors: [`TsoError::ZeroCount`] for `n == 0` (no FAA is issued),
    /// [`TsoError::Rpc`] when the FAA fails, [`TsoError::Exhausted`] when the range
    /// leaves the oracle's epoch (its values are then never handed out).
    pub async fn timestamps(&self, ctx: &ThreadCtx, n: u64) -> Result<TimestampRange, TsoError> {
        if n == 0 {
            return Err(TsoError::ZeroCount);
        }
        let old = ctx.faa(self.node, self.counter, n).await?;
        let exhausted = TsoError::Exhausted {
            epoch: self.epoch,
            at: old,
            n,
        };
        let Some(last) = old.checked_add(n) else {
            return Err(exhausted);
        };
        if Timestamp(old).epoch() != self.epoch || Timestamp(last).epoch() != self.epoch {
            return Err(exhausted);
        }
        Ok(TimestampRange::new(Timestamp(old + 1), n))
    }
}

/// A process's TSO group over one oracle (Scythe 4.5 (2)): concurrent requests of the
/// process's threads and coroutines are combined into one range request of the group's
/// size ([`crate::group`]): one FAA on the oracle ([`GroupedTso::new`]), or one range RPC
/// to a TSO proxy chosen and failed over by [`TsoSources`] ([`GroupedTso::with_sources`]).
/// Share it in an `Arc`; each thread passes its own [`ThreadCtx`], connected to the
/// sources, and a leader's range request goes out on its own thread's context.
pub struct GroupedTso {
    source: RangeSource,
    group: TsoGroup<Arc<TsoError>>,
}

enum RangeSource {
    Oracle(TsoClient),
    Sources(Arc<TsoSources>),
}

impl GroupedTso {
    /// A group instance taking its ranges by FAA through `client`.
    pub fn new(client: TsoClient) -> Self {
        Self {
            source: RangeSource::Oracle(client),
            group: TsoGroup::new(),
        }
    }

    /// A group instance taking its ranges from `sources` (proxies or the oracle, with
    /// failover): a proxy RPC replaces the FAA as the leader's range request.
    pub fn with_sources(sources: Arc<TsoSources>) -> Self {
        Self {
            source: RangeSource::Sources(sources),
            group: TsoGroup::new(),
        }
    }

    /// The per-request oracle client underneath, when ranges come from the oracle only.
    pub fn client(&self) -> Option<&TsoClient> {
        match &self.source {
            RangeSource::Oracle(c) => Some(c),
            RangeSource::Sources(_) => None,
        }
    }

    /// One timestamp through the group: a leader takes its group's range with one range
    /// request, a follower waits for at most two (the one in flight and its group's).
    ///
    /// Errors: [`TsoError::Group`] when the leader's range request failed (its error is
    /// the source) or the leader was cancelled.
    pub async fn timestamp(&self, ctx: &ThreadCtx) -> Result<Timestamp, TsoError> {
        let source = &self.source;
        Ok(self
            .group
            .take(|n| async move {
                match source {
                    RangeSource::Oracle(c) => c.timestamps(ctx, n).await,
                    RangeSource::Sources(s) => s.timestamps(ctx, n).await,
                }
                .map(|r| r.first())
                .map_err(Arc::new)
            })
            .await?)
    }

    /// Process-tier groups formed (FAAs issued) and timestamps they served so far.
    pub fn stats(&self) -> GroupStats {
        self.group.stats()
    }
}

/// FAAs a [`ThreadTso`] lets be in flight at once ([`TsoGroup::with_limit`]).
pub const THREAD_RANGES_IN_FLIGHT: usize = 2;

/// One thread's TSO group (Scythe 4.5 (2), the coroutines of a thread): the thread's
/// concurrent requests combine with no lock and no atomic instruction
/// ([`crate::group::LocalLock`]), and the leader takes the group's range with one FAA of
/// its size on the thread's own context. Give one to each thread (it is not `Send`).
///
/// Threads do not wait for each other here: each thread's groups FAA the oracle
/// directly. (Stacking this tier on the process's [`GroupedTso`], one request of `n` per
/// thread group through [`TsoGroup::take_n`], combines threads too, but makes a thread
/// wait until another thread is scheduled to finish its FAA: on a machine with more busy
/// threads than cores that cost more than the FAAs it saved; see the README's TSO
/// section.)
///
/// Up to [`THREAD_RANGES_IN_FLIGHT`] groups' FAAs are in flight at once: with two
/// coroutines each leads its own FAA (as without groups), with many they wait in the open
/// group and one FAA serves it all.
///
/// Guarantees as [`TsoGroup`]: no prefetching (a group's FAA is issued after its members
/// arrived), bounded wait (at most two FAAs), no lost wake-ups (the group's wakers belong
/// to the thread's own executor), unique timestamps increasing per coroutine.
pub struct ThreadTso {
    client: TsoClient,
    local: TsoGroup<Arc<TsoError>, crate::group::LocalLock>,
}

impl ThreadTso {
    /// A thread group taking its ranges through `client`, up to
    /// [`THREAD_RANGES_IN_FLIGHT`] FAAs in flight.
    pub fn new(client: TsoClient) -> Self {
        Self::with_ranges_in_flight(client, THREAD_RANGES_IN_FLIGHT)
    }

    /// [`ThreadTso::new`] with up to `n` FAAs in flight (at least 1; 1 is Scythe's one
    /// group at a time, whose groups are larger but whose second coroutine always waits
    /// for the first's FAA).
    pub fn with_ranges_in_flight(client: TsoClient, n: usize) -> Self {
        Self {
            client,
            local: TsoGroup::with_limit(n.max(1)),
        }
    }

    /// One timestamp through the thread's group: a leader takes its group's range with
    /// one FAA, a follower waits for at most two FAAs.
    ///
    /// Errors: [`TsoError::Group`] when the leader's FAA failed (its error is the source)
    /// or the leader was cancelled.
    pub async fn timestamp(&self, ctx: &ThreadCtx) -> Result<Timestamp, TsoError> {
        let client = &self.client;
        Ok(self
            .local
            .take(|n| async move {
                client
                    .timestamps(ctx, n)
                    .await
                    .map(|r| r.first())
                    .map_err(Arc::new)
            })
            .await?)
    }

    /// Thread-tier groups formed (FAAs issued) and timestamps served.
    pub fn stats(&self) -> GroupStats {
        self.local.stats()
    }
}
