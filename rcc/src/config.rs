//! A run's settings and errors, shared by a run in one process ([`crate::cluster::run`])
//! and its nodes ([`crate::member::Member`]), one per process or all in one.

use std::sync::Arc;
use std::time::Duration;

use rrpc::fabric::FabricKind;

use crate::calls::CallTransportFactory;
use crate::coord::{Fault, Proto, Variant};
use crate::layout::Layout;
use crate::workload::Workload;

/// A run's shape.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Backend (default: `$RRPC_FABRIC`, else shm).
    pub fabric: FabricKind,
    /// Timing model of the shm backend (`cx5`, ...; `None`: `$RRPC_MODEL`, else none).
    pub model: Option<String>,
    /// Nodes (each one server thread).
    pub nodes: usize,
    /// Coordinator co-routines per node.
    pub coroutines: usize,
    /// Protocol.
    pub proto: Proto,
    /// Primitive.
    pub variant: Variant,
    /// How long coordinators start transactions, after the warm-up.
    pub duration: Duration,
    /// Warm-up before `duration` (default none): the coordinators run both, and what
    /// the [`crate::cluster::Outcome`] reports (commits, aborts, latencies, network counters, the
    /// elapsed time) covers the time after it, a transaction in flight at its end
    /// counted when it ends ([`crate::driver::drive_after`]); the checks cover the whole run.
    /// Not for CALVIN (its driver counts from the start): a configuration error.
    pub warmup: Duration,
    /// Seed of the generators (coordinator `i` uses `seed + i`).
    pub seed: u64,
    /// Bytes of history kept for the serializability check, per coordinator.
    pub history_bytes: usize,
    /// A planted bug (test builds with feature `fault-injection`).
    pub fault: Option<Fault>,
    /// Where WAITDIE's and MVCC's timestamps come from.
    pub ts: TsMode,
    /// One-sided doorbell batching (lock-and-read, update-and-unlock; RCC, 3): on by
    /// default.
    pub doorbell_batching: bool,
    /// The run stops all coordinators when no transaction finished anywhere for this
    /// long once every node's coordinators started (a deadlock), and reports it.
    pub watchdog: Duration,
    /// The RPC variant's calls over another transport (the bench's tonic one; RCC, 5,
    /// Table 3 compares RDMA RPC with TCP): `None` (default) is rrpc. The nodes and
    /// their coordinators stay on rrpc's threads; only the calls take this transport.
    /// Needs [`Variant::Rpc`].
    pub calls: Option<Arc<dyn CallTransportFactory>>,
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            fabric: FabricKind::from_env().unwrap_or_default(),
            model: None,
            nodes: 2,
            coroutines: 10,
            proto: Proto::NoWait,
            variant: Variant::OneSided,
            duration: Duration::from_secs(2),
            warmup: Duration::ZERO,
            seed: 1,
            history_bytes: 8 << 20,
            fault: None,
            doorbell_batching: true,
            ts: TsMode::Local,
            watchdog: Duration::from_secs(1),
            calls: None,
        }
    }
}

/// Where WAITDIE's and MVCC's transaction timestamps come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TsMode {
    /// Each coordinator's clock with its id in the low bits, as RCC takes them (RCC,
    /// 4.3 and 4.4).
    #[default]
    Local,
    /// This project's timestamp oracle (Scythe 4.5), started with the cluster on a node
    /// of its own: one one-sided FAA on its counter per group of a thread's requests
    /// (`tso::ThreadTso`), the coordinator's id in the low bits.
    Tso,
}

/// Errors of a run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A configuration that cannot run.
    #[error("bad configuration: {0}")]
    Config(String),
    /// The fabric, a node or a connection failed.
    #[error("{what}: {why}")]
    Setup {
        /// What was being set up.
        what: &'static str,
        /// The underlying error.
        why: String,
    },
    /// The coordinators did not finish in time (a deadlock the watchdog missed).
    #[error("the coordinators did not finish within {0:?} of the end")]
    Stuck(Duration),
}

/// Check `cfg` before anything starts. Errors: [`RunError::Config`], naming the bad
/// setting.
pub fn check_config(cfg: &RunConfig) -> Result<(), RunError> {
    if cfg.nodes == 0 || cfg.coroutines == 0 || cfg.nodes * cfg.coroutines >= 1024 {
        return Err(RunError::Config(format!(
            "{} nodes x {} coroutines: need at least one of each and fewer than 1024 coordinators",
            cfg.nodes, cfg.coroutines
        )));
    }
    if cfg.calls.is_some() && cfg.variant != Variant::Rpc {
        return Err(RunError::Config(format!(
            "the {} transport serves the RPC variant only",
            cfg.calls.as_ref().map_or("", |c| c.name())
        )));
    }
    if cfg.fault.is_some() && !cfg!(feature = "fault-injection") {
        return Err(RunError::Config(
            "planted bugs need a build with feature fault-injection".into(),
        ));
    }
    Ok(())
}

/// The placement of `wl`'s tables on `cfg.nodes` nodes in `cfg.proto`'s tuple shape.
/// Errors: [`RunError::Config`] when the tables do not fit.
pub fn layout_of(cfg: &RunConfig, wl: &dyn Workload) -> Result<Layout, RunError> {
    Layout::with_shape(cfg.nodes, wl.tables(), cfg.proto.shape())
        .map_err(|e| RunError::Config(e.to_string()))
}
