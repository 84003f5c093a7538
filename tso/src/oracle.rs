//! The oracle's counter (Scythe 4.5, Fig. 18, the "TSO service" box): allocated in
//! device memory, exported to clients, served by a node that runs no RPC handler.
//!
//! The top of the crate's layers. The pieces its clients share live below it and are
//! re-exported here under their old paths: the export ([`crate::export`]), the errors
//! ([`crate::error`]), the FAA client ([`crate::client`]) and the TSO group tiers
//! ([`crate::grouped`], [`crate::thread_tso`]).

use rrpc::fabric::{DmPlacement, Fabric, MemoryRegion, RemoteAccess};
use rrpc::node::{Node, NodeConfig, RpcSettings};

use std::collections::BTreeMap;
use std::net::SocketAddr;

use crate::timestamp::{Timestamp, EPOCH_SHIFT};

pub use crate::client::TsoClient;
pub use crate::error::TsoError;
pub use crate::export::{describe_placement, TsoExport, COUNTER_BYTES, EXPORT_NAME};
pub use crate::grouped::GroupedTso;
pub use crate::thread_tso::{ThreadTso, THREAD_RANGES_IN_FLIGHT};

/// The oracle: an 8-byte counter in device memory (or its reported host fallback),
/// starting at `epoch << 48`.
pub struct Oracle {
    counter: MemoryRegion,
    placement: DmPlacement,
    epoch: u16,
    incarnation: u64,
}

/// What peers may do to the counter: fetch-and-add (clients) and READ (the lock
/// service's bound on timestamps, lockd's TSO bound); never WRITE.
fn counter_access() -> RemoteAccess {
    RemoteAccess::READ | RemoteAccess::ATOMIC
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
    /// yet, so the rule for shared words (no CPU and RDMA atomics on one
    /// word) holds.
    ///
    /// Errors: [`TsoError::Fabric`] when allocation fails.
    pub fn with_epoch(fabric: &Fabric, epoch: u16) -> Result<Self, TsoError> {
        // Clients FAA the counter and the lock service READs it (its bound on Lock RPC
        // timestamps); no peer may WRITE it (a WRITE could set it back).
        let (counter, placement) = fabric.alloc_dm_with(COUNTER_BYTES, counter_access())?;
        Ok(Self::over(counter, placement, epoch))
    }

    /// [`Oracle::new`] with the counter in host memory even where the NIC has device
    /// memory, reported as a host placement: for benchmarks that compare the two
    /// (`tso-bench --counter host`; on host memory every atomic on the counter needs the
    /// responder's PCIe read and write back, Scythe 2.3 and Table 1).
    ///
    /// Errors: [`TsoError::Fabric`] when allocation fails.
    pub fn in_host_memory(fabric: &Fabric) -> Result<Self, TsoError> {
        let counter = fabric.alloc_mr_with(COUNTER_BYTES, counter_access())?;
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
        self.serve_tuned(fabric, listen, &RpcSettings::default())
    }

    /// [`Oracle::serve`] with the process's rrpc settings (a topology file's `[runtime]`
    /// and `[server]`; the oracle's node has no RPC server, so only settings the node
    /// itself uses apply).
    ///
    /// Errors: those of [`Oracle::serve`].
    pub fn serve_tuned(
        &self,
        fabric: Fabric,
        listen: SocketAddr,
        rpc: &RpcSettings,
    ) -> Result<Node, TsoError> {
        let mut exports = BTreeMap::new();
        exports.insert(EXPORT_NAME.to_string(), self.export());
        Node::start_tuned(
            fabric,
            NodeConfig::new("tso", listen).with_exports(exports),
            rpc,
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
