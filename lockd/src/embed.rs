//! The whole lock service as one value, [`LockService`]: what the `lockd` binary serves,
//! and what a compute-node process embeds to serve locks itself (Lotus 4.1's placement:
//! lock tables on compute nodes), with the same code.
//!
//! [`LockService::start`] takes a fabric and a [`LockServiceConfig`] (the `lockd` TOML
//! file's settings) and starts an rrpc node (role `"lockd"`) serving:
//!
//! - the Takeout Lock table (Scythe 4.3; [`crate::service::LockTable`]) with the Lock RPC
//!   in the configured [`LockOrder`] and release-node;
//! - the Lotus lock table for the configured shards ([`TableService`]);
//! - optionally the CAS and DSLR word tables (one-sided only);
//! - optionally the resharding loop (Lotus 4.3; [`crate::reshard::run_loop`]) on a thread
//!   of its own, when [`ReshardSettings::nodes`] lists the lock-table nodes.
//!
//! **Embedded placement.** A compute node starts a [`LockService`] on its own fabric
//! handle (its node id) and keeps running its coordinators beside it: they reach the
//! Lotus table without RPC through [`LockService::lotus`] (pass it as the `local` service
//! of [`crate::table_service::TableClient::new`]) and the Takeout table like any client
//! (a runtime thread of the process may `connect_rpc` to [`LockService::addr`], its own
//! node), while other nodes' coordinators reach both over the fabric. Nothing else
//! differs from a `lockd` process.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use rrpc::fabric::Fabric;
use rrpc::node::{Node, NodeConfig, NodeError, RpcSettings, ServerRuntime};
use rrpc::runtime::{block_on, RuntimeConfig, ThreadCtx};
use serde::Deserialize;

use crate::lock_table::{self, SLOTS_PER_BUCKET, SLOT_BYTES};
use crate::reshard::{run_loop, LoopConfig};
use crate::service::{LockOrder, LockTable, LockTableError, EXPORT_NAME};
use crate::shard::{parse_shards, MapError, Ownership, ReshardConfig, ShardMap};
use crate::table_service::{TableService, TABLE_EXPORT};
use crate::takeout::Watermarks;
use crate::words::{WordTable, CAS_EXPORT, DSLR_EXPORT};

/// Settings of a lock service (the `lockd` TOML file; kebab-case keys, every one
/// optional with the default in its doc).
///
/// Non-exhaustive, so that a setting can be added without breaking the crates that embed
/// this one: outside this crate, start from [`Default::default`] and chain the `with_*`
/// setters (or assign the public fields on a `let mut` binding).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
#[non_exhaustive]
pub struct LockServiceConfig {
    /// Takeout Locks in the table, 32 bytes of registered memory each (default 1048576;
    /// at least 1).
    pub locks: u64,
    /// RPC server threads (default 1; 1 to 1024).
    pub threads: u64,
    /// Sleep of an idle server thread, microseconds (default 0: an idle thread spins,
    /// then yields; at most 10000). With a value, an idle lock service sleeps and is
    /// woken by its timer ([`rrpc::server::ServerConfig::idle_sleep_us`]); a Lock RPC
    /// that arrives while it sleeps waits at most this long. Measured on 2 cores shared
    /// with 2 busy coordinator threads (SmallBank, cx5, 2 x 32 coroutines): 20 us cost
    /// Scythe 4% of its throughput and 60% on p99 against yielding, since each wake-up
    /// preempts a coordinator and the lock service then uses more CPU, not less.
    pub idle_sleep_us: u64,
    /// ColdWatermark, queued tickets (default 3; at most `hot-watermark`; Scythe 4.3).
    pub cold_watermark: u64,
    /// HotWatermark, queued tickets (default 10; Scythe 4.3).
    pub hot_watermark: u64,
    /// Order of serving Lock RPCs that arrive together (default `timestamp`, Scythe 4.4
    /// Fig. 16; or `arrival`).
    pub lock_order: LockOrder,
    /// CAS spinlocks exported, 8 bytes each (default 0: none).
    pub cas_locks: u64,
    /// DSLR locks exported, 8 bytes each (default 0: none).
    pub dslr_locks: u64,
    /// Lotus lock-table slots, 8 bytes each, rounded up to whole 8-slot buckets of a
    /// power of two (default 1048576; at least 8).
    pub lock_table_slots: u64,
    /// Lotus shards served: comma-separated shards or inclusive ranges of 0..4095
    /// (default "0-4095": all).
    pub shards: String,
    /// Version of the shard map the node starts with (default 1; at least 1).
    pub map_version: u64,
    /// The resharding loop (Lotus 4.3), table `[reshard]`.
    pub reshard: ReshardSettings,
    /// Directory where the service persists its epoch before serving
    /// ([`crate::epoch`]; default none). Each start opens a larger epoch there, so
    /// clients of an earlier start are refused and reconnect; it is locked while the
    /// service runs.
    pub state_dir: Option<std::path::PathBuf>,
    /// The epoch to serve in, given by the caller's configuration (for example the
    /// incarnation the cluster's membership gave this process; default none). Wins over
    /// `state-dir`; must be larger than every earlier start's. Without either the epoch
    /// is the clock's microseconds at start ([`crate::service::clock_epoch`]).
    pub epoch: Option<u64>,
    /// Bootstrap address of the timestamp oracle (default none). With it, Lock RPC
    /// timestamps above what the oracle has issued are refused: the service reads the
    /// oracle's counter when a timestamp exceeds the last mark it learned
    /// ([`crate::tso_bound`]); without it, only timestamps above
    /// [`crate::service::DEFAULT_MAX_TS`] are.
    pub tso: Option<SocketAddr>,
    /// Timestamps accepted above the oracle's last learned mark without reading its
    /// counter again (default 65536; see [`LockTable::set_ts_slack`]).
    pub ts_slack: u64,
    /// After a restart (an epoch above 1 from `state-dir` or `epoch`), Lock RPCs are
    /// refused for this many milliseconds (default 1000), so that the tickets its
    /// predecessor granted have expired before a lock is granted again
    /// ([`LockTable::set_grace`]). It must be at least the coordinators' ticket lease
    /// (txn's `TxnConfig::ticket_lease`, default 500 ms). 0 turns it off: a holder of a
    /// predecessor's ticket may then write under a lock granted anew (unsafe).
    pub restart_grace_ms: u64,
    /// Whether the Lotus lock table serves lock requests from the start (default true).
    /// A restarted compute node starts with false: its table is empty, and it may grant
    /// nothing before every survivor confirmed that the transactions which held locks of
    /// its previous life ended (Lotus 6); it then calls
    /// [`TableService::set_serving`]`(true)` on [`LockService::lotus`].
    pub lotus_serving: bool,
}

/// Default of [`LockServiceConfig::restart_grace_ms`].
pub const DEFAULT_RESTART_GRACE_MS: u64 = 1000;

impl Default for LockServiceConfig {
    fn default() -> Self {
        Self {
            locks: 1 << 20,
            threads: 1,
            idle_sleep_us: 0,
            cold_watermark: 3,
            hot_watermark: 10,
            lock_order: LockOrder::Timestamp,
            cas_locks: 0,
            dslr_locks: 0,
            lock_table_slots: 1 << 20,
            shards: "0-4095".into(),
            map_version: 1,
            reshard: ReshardSettings::default(),
            state_dir: None,
            epoch: None,
            tso: None,
            ts_slack: 1 << 16,
            restart_grace_ms: DEFAULT_RESTART_GRACE_MS,
            lotus_serving: true,
        }
    }
}

/// Settings of the resharding loop (Lotus 4.3), the `[reshard]` table.
///
/// Non-exhaustive, so that a setting can be added without breaking the crates that embed
/// this one: outside this crate, start from [`Default::default`] and chain the `with_*`
/// setters (or assign the public fields on a `let mut` binding).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
#[non_exhaustive]
pub struct ReshardSettings {
    /// Bootstrap addresses of the other lock-table nodes (this node is added). Empty
    /// (the default): this service runs no loop. Run one loop per cluster.
    pub nodes: Vec<SocketAddr>,
    /// Interval length, milliseconds (default 100; at least 1).
    pub interval_ms: u64,
    /// A node is over when its latency is above this many times the cluster average
    /// (default 1.5; above 1).
    pub factor: f64,
    /// Consecutive intervals over before a move (default 3; at least 1).
    pub intervals: u32,
    /// How long a move waits for the range's locks to be released before it is
    /// cancelled, milliseconds (default 10).
    pub drain_timeout_ms: u64,
}

impl Default for ReshardSettings {
    fn default() -> Self {
        let p = ReshardConfig::default();
        Self {
            nodes: Vec::new(),
            interval_ms: 100,
            factor: p.factor,
            intervals: p.intervals,
            drain_timeout_ms: p.drain_timeout.as_millis() as u64,
        }
    }
}

impl ReshardSettings {
    /// Set [`ReshardSettings::nodes`]: bootstrap addresses of the other lock-table nodes (this
    /// node is added).
    pub fn with_nodes(mut self, nodes: Vec<SocketAddr>) -> Self {
        self.nodes = nodes;
        self
    }

    /// Set [`ReshardSettings::interval_ms`]: interval length, milliseconds (default 100; at
    /// least 1).
    pub fn with_interval_ms(mut self, interval_ms: u64) -> Self {
        self.interval_ms = interval_ms;
        self
    }

    /// Set [`ReshardSettings::factor`]: a node is over when its latency is above this many
    /// times the cluster average (default 1.5; above 1).
    pub fn with_factor(mut self, factor: f64) -> Self {
        self.factor = factor;
        self
    }

    /// Set [`ReshardSettings::intervals`]: consecutive intervals over before a move (default 3;
    /// at least 1).
    pub fn with_intervals(mut self, intervals: u32) -> Self {
        self.intervals = intervals;
        self
    }

    /// Set [`ReshardSettings::drain_timeout_ms`]: how long a move waits for the range's locks
    /// to be released before it is cancelled, milliseconds (default 10).
    pub fn with_drain_timeout_ms(mut self, drain_timeout_ms: u64) -> Self {
        self.drain_timeout_ms = drain_timeout_ms;
        self
    }

    /// The loop's configuration.
    pub fn loop_config(&self) -> LoopConfig {
        LoopConfig {
            policy: ReshardConfig {
                factor: self.factor,
                intervals: self.intervals,
                drain_timeout: Duration::from_millis(self.drain_timeout_ms),
            },
            interval: Duration::from_millis(self.interval_ms),
            ..LoopConfig::default()
        }
    }
}

/// An invalid [`LockServiceConfig`], naming the key.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{key}: {what}")]
#[non_exhaustive]
pub struct ConfigError {
    /// The kebab-case key.
    pub key: &'static str,
    /// What is wrong.
    pub what: String,
}

impl ConfigError {
    /// The error for the kebab-case `key`, saying `what` is wrong with it.
    pub fn new(key: &'static str, what: impl Into<String>) -> Self {
        Self {
            key,
            what: what.into(),
        }
    }
}

impl LockServiceConfig {
    /// Set [`LockServiceConfig::locks`]: Takeout Locks in the table, 32 bytes of registered
    /// memory each (default 1048576; at least 1).
    pub fn with_locks(mut self, locks: u64) -> Self {
        self.locks = locks;
        self
    }

    /// Set [`LockServiceConfig::threads`]: RPC server threads (default 1; 1 to 1024).
    pub fn with_threads(mut self, threads: u64) -> Self {
        self.threads = threads;
        self
    }

    /// Set [`LockServiceConfig::idle_sleep_us`]: sleep of an idle server thread, microseconds
    /// (default 0: an idle thread spins, then yields; at most 10000).
    pub fn with_idle_sleep_us(mut self, idle_sleep_us: u64) -> Self {
        self.idle_sleep_us = idle_sleep_us;
        self
    }

    /// Set [`LockServiceConfig::cold_watermark`]: ColdWatermark, queued tickets (default 3; at
    /// most `hot-watermark`; Scythe 4.3).
    pub fn with_cold_watermark(mut self, cold_watermark: u64) -> Self {
        self.cold_watermark = cold_watermark;
        self
    }

    /// Set [`LockServiceConfig::hot_watermark`]: HotWatermark, queued tickets (default 10;
    /// Scythe 4.3).
    pub fn with_hot_watermark(mut self, hot_watermark: u64) -> Self {
        self.hot_watermark = hot_watermark;
        self
    }

    /// Set [`LockServiceConfig::lock_order`]: order of serving Lock RPCs that arrive together
    /// (default `timestamp`, Scythe 4.4 Fig. 16; or `arrival`).
    pub fn with_lock_order(mut self, lock_order: LockOrder) -> Self {
        self.lock_order = lock_order;
        self
    }

    /// Set [`LockServiceConfig::cas_locks`]: CAS spinlocks exported, 8 bytes each (default 0:
    /// none).
    pub fn with_cas_locks(mut self, cas_locks: u64) -> Self {
        self.cas_locks = cas_locks;
        self
    }

    /// Set [`LockServiceConfig::dslr_locks`]: DSLR locks exported, 8 bytes each (default 0:
    /// none).
    pub fn with_dslr_locks(mut self, dslr_locks: u64) -> Self {
        self.dslr_locks = dslr_locks;
        self
    }

    /// Set [`LockServiceConfig::lock_table_slots`]: Lotus lock-table slots, 8 bytes each,
    /// rounded up to whole 8-slot buckets of a power of two (default 1048576; at least 8).
    pub fn with_lock_table_slots(mut self, lock_table_slots: u64) -> Self {
        self.lock_table_slots = lock_table_slots;
        self
    }

    /// Set [`LockServiceConfig::shards`]: Lotus shards served: comma-separated shards or
    /// inclusive ranges of 0..4095 (default "0-4095": all).
    pub fn with_shards(mut self, shards: String) -> Self {
        self.shards = shards;
        self
    }

    /// Set [`LockServiceConfig::map_version`]: version of the shard map the node starts with
    /// (default 1; at least 1).
    pub fn with_map_version(mut self, map_version: u64) -> Self {
        self.map_version = map_version;
        self
    }

    /// Set [`LockServiceConfig::reshard`]: the resharding loop (Lotus 4.3), table `[reshard]`.
    pub fn with_reshard(mut self, reshard: ReshardSettings) -> Self {
        self.reshard = reshard;
        self
    }

    /// Set [`LockServiceConfig::state_dir`]: directory where the service persists its epoch
    /// before serving ([`crate::epoch`]; default none).
    pub fn with_state_dir(mut self, state_dir: Option<std::path::PathBuf>) -> Self {
        self.state_dir = state_dir;
        self
    }

    /// Set [`LockServiceConfig::epoch`]: the epoch to serve in, given by the caller's
    /// configuration (for example the incarnation the cluster's membership gave this process;
    /// default none).
    pub fn with_epoch(mut self, epoch: Option<u64>) -> Self {
        self.epoch = epoch;
        self
    }

    /// Set [`LockServiceConfig::tso`]: bootstrap address of the timestamp oracle (default
    /// none).
    pub fn with_tso(mut self, tso: Option<SocketAddr>) -> Self {
        self.tso = tso;
        self
    }

    /// Set [`LockServiceConfig::ts_slack`]: timestamps accepted above the oracle's last learned
    /// mark without reading its counter again (default 65536; see [`LockTable::set_ts_slack`]).
    pub fn with_ts_slack(mut self, ts_slack: u64) -> Self {
        self.ts_slack = ts_slack;
        self
    }

    /// Set [`LockServiceConfig::restart_grace_ms`]: after a restart (an epoch above 1 from
    /// `state-dir` or `epoch`), Lock RPCs are refused for this many milliseconds (default
    /// 1000), so that the tickets its predecessor granted have expired before a lock is granted
    /// again ([`LockTable::set_grace`]).
    pub fn with_restart_grace_ms(mut self, restart_grace_ms: u64) -> Self {
        self.restart_grace_ms = restart_grace_ms;
        self
    }

    /// Set [`LockServiceConfig::lotus_serving`]: whether the Lotus lock table serves lock
    /// requests from the start (default true).
    pub fn with_lotus_serving(mut self, lotus_serving: bool) -> Self {
        self.lotus_serving = lotus_serving;
        self
    }

    /// Check every bound in the field docs.
    ///
    /// Errors: the first [`ConfigError`] found.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |key, what: String| Err(ConfigError { key, what });
        if self.locks == 0 {
            return err("locks", "at least one lock is needed".into());
        }
        if !(1..=1024).contains(&self.threads) {
            return err("threads", format!("{} is not in 1..=1024", self.threads));
        }
        if self.idle_sleep_us > 10_000 {
            return err(
                "idle-sleep-us",
                format!("{} is more than 10000", self.idle_sleep_us),
            );
        }
        if let Err(e) = self.watermarks().validate() {
            return err("cold-watermark", e);
        }
        if self.lock_table_slots < SLOTS_PER_BUCKET as u64 {
            return err("lock-table-slots", format!("at least {SLOTS_PER_BUCKET}"));
        }
        if self.map_version == 0 {
            return err("map-version", "at least 1".into());
        }
        if let Err(e) = parse_shards(&self.shards) {
            return err("shards", e.to_string());
        }
        let r = &self.reshard;
        if r.interval_ms == 0 {
            return err("reshard.interval-ms", "at least 1".into());
        }
        if r.factor.is_nan() || r.factor <= 1.0 {
            return err("reshard.factor", format!("{} is not above 1", r.factor));
        }
        if r.intervals == 0 {
            return err("reshard.intervals", "at least 1".into());
        }
        if self.epoch == Some(0) {
            return err("epoch", "0 is reserved".into());
        }
        Ok(())
    }

    /// The Takeout watermarks.
    pub fn watermarks(&self) -> Watermarks {
        Watermarks {
            cold: self.cold_watermark,
            hot: self.hot_watermark,
        }
    }
}

/// Why a [`LockService`] did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The configuration is invalid.
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    /// The Takeout table or a word table could not be created.
    #[error("creating a lock table: {0}")]
    Table(#[from] LockTableError),
    /// The shard map could not be built.
    #[error("shard map: {0}")]
    Map(#[from] MapError),
    /// The rrpc node did not start.
    #[error("starting the node: {0}")]
    Node(#[from] NodeError),
    /// The resharding thread could not be started.
    #[error("starting the resharding thread: {0}")]
    Thread(#[source] std::io::Error),
    /// The epoch could not be persisted, or the state directory is in use.
    #[error("opening the service epoch: {0}")]
    Epoch(#[from] crate::epoch::EpochError),
    /// The timestamp oracle could not be reached.
    #[error("reaching the timestamp oracle: {0}")]
    Tso(#[from] crate::tso_bound::TsoBoundError),
}

/// How a lock service is hosted by a node of another role ([`LockService::start_hosted`]).
pub struct Hosting {
    /// The node's role (`"memnode"`).
    pub role: &'static str,
    /// The node's own exports, published beside the lock service's.
    pub exports: BTreeMap<String, serde_json::Value>,
    /// What the lock-and-read RPC reads when a ticket is served at once; `None` serves
    /// no such RPC.
    pub reader: Option<crate::service::GrantReader>,
}

/// A running lock service (see the module docs). Dropping it stops the resharding loop
/// (within an interval, plus a move under way) and the node.
pub struct LockService {
    takeout: Arc<LockTable>,
    lotus: Arc<TableService>,
    words: Vec<WordTable>,
    stop: Arc<AtomicBool>,
    reshard: Option<JoinHandle<()>>,
    // After the loop, so the node stops after the loop that calls it.
    node: Node,
    /// Held while the service runs (a second service on it fails to start); released
    /// after the node stopped.
    _state: Option<crate::epoch::StateDir>,
}

impl LockService {
    /// Start the service as node `fabric.node()`, its control plane on `listen`.
    ///
    /// Errors: [`StartError`].
    pub fn start(
        fabric: Fabric,
        listen: SocketAddr,
        cfg: &LockServiceConfig,
    ) -> Result<Self, StartError> {
        Self::start_tuned(fabric, listen, cfg, &RpcSettings::default())
    }

    /// [`LockService::start`] with the process's rrpc settings (a topology file's
    /// `[runtime]` and `[server]`): the RPC server runs with `rpc.server`, except for
    /// `cfg.threads` and, when not 0, `cfg.idle_sleep_us`, which win; the service's own
    /// runtime contexts (the TSO bound's reader, the resharding loop, async handlers)
    /// with `rpc.runtime`.
    ///
    /// Errors: [`StartError`].
    pub fn start_tuned(
        fabric: Fabric,
        listen: SocketAddr,
        cfg: &LockServiceConfig,
        rpc: &RpcSettings,
    ) -> Result<Self, StartError> {
        Self::start_with(fabric, listen, cfg, rpc, |_| {})
    }

    /// [`Self::start_tuned`], with more RPC handlers of the embedding process registered
    /// by `extra` on the service's server (ids from
    /// [`rrpc::server::Handlers::FIRST_APP_ID`] up: a compute node's transaction
    /// forwarding, for one). They share the service's threads and connections.
    ///
    /// Errors: [`StartError`].
    pub fn start_with(
        fabric: Fabric,
        listen: SocketAddr,
        cfg: &LockServiceConfig,
        rpc: &RpcSettings,
        extra: impl FnOnce(&mut rrpc::server::Handlers),
    ) -> Result<Self, StartError> {
        Self::start_with_runtime(fabric, listen, cfg, rpc, extra, None)
    }

    /// [`Self::start_with`], with `runtime` (when given) as the runtime context of each
    /// of the `cfg.threads` server threads instead of one built from `rpc.runtime`: its
    /// per-thread setup ([`ServerRuntime::with_setup`]) may spawn coroutines of the
    /// embedding process there, which then share the thread with the handlers. A compute
    /// node runs its coordinators so (Lotus 4.1: lock RPCs served on the coordinator
    /// threads, no thread of the service's own).
    ///
    /// Errors: [`StartError`] (a setup that failed is [`StartError::Node`]).
    pub fn start_with_runtime(
        fabric: Fabric,
        listen: SocketAddr,
        cfg: &LockServiceConfig,
        rpc: &RpcSettings,
        extra: impl FnOnce(&mut rrpc::server::Handlers),
        runtime: Option<ServerRuntime>,
    ) -> Result<Self, StartError> {
        Self::start_inner(
            fabric,
            listen,
            cfg,
            rpc,
            Hosting {
                role: "lockd",
                exports: BTreeMap::new(),
                reader: None,
            },
            extra,
            runtime,
        )
    }

    /// [`Self::start_with`] as a service hosted by another node (see [`Hosting`]): the
    /// node announces itself as the host's role, exports the host's exports beside the
    /// lock service's own (a key of both is an error), and with a reader serves the
    /// lock-and-read RPC ([`crate::wire::LOCK_READ_HANDLER`]). A memory node serves its
    /// partition's Takeout Locks so (Scythe 4.3: each object's lock at the memory node
    /// that holds it), its tables and the locks behind one bootstrap address.
    ///
    /// Errors: [`StartError`]; [`StartError::Config`] for an export key the lock service
    /// uses itself.
    pub fn start_hosted(
        fabric: Fabric,
        listen: SocketAddr,
        cfg: &LockServiceConfig,
        rpc: &RpcSettings,
        host: Hosting,
        extra: impl FnOnce(&mut rrpc::server::Handlers),
    ) -> Result<Self, StartError> {
        Self::start_inner(fabric, listen, cfg, rpc, host, extra, None)
    }

    fn start_inner(
        fabric: Fabric,
        listen: SocketAddr,
        cfg: &LockServiceConfig,
        rpc: &RpcSettings,
        host: Hosting,
        extra: impl FnOnce(&mut rrpc::server::Handlers),
        runtime: Option<ServerRuntime>,
    ) -> Result<Self, StartError> {
        cfg.validate()?;
        let Hosting {
            role,
            exports: host_exports,
            reader,
        } = host;
        for k in host_exports.keys() {
            if [EXPORT_NAME, TABLE_EXPORT, CAS_EXPORT, DSLR_EXPORT].contains(&k.as_str()) {
                return Err(
                    ConfigError::new("exports", format!("{k} is the lock service's")).into(),
                );
            }
        }
        let me = fabric.node();
        let state = cfg
            .state_dir
            .as_deref()
            .map(crate::epoch::StateDir::open)
            .transpose()?;
        // A restart is known only from a durable epoch: the first start opens epoch 1.
        let (epoch, restarted) = match (cfg.epoch, &state) {
            (Some(e), _) => (e, e > 1),
            (None, Some(s)) => {
                let e = s.advance()?;
                (e, e > 1)
            }
            (None, None) => (crate::service::clock_epoch(), false),
        };
        let mut takeout = LockTable::with_epoch(&fabric, cfg.locks, cfg.watermarks(), epoch)?;
        if restarted && cfg.restart_grace_ms > 0 {
            takeout.set_grace(Duration::from_millis(cfg.restart_grace_ms));
        }
        if let Some(addr) = cfg.tso {
            let bound = crate::tso_bound::TsoBound::start_with(
                fabric.clone(),
                addr,
                Duration::from_millis(100),
                rpc.runtime.clone(),
            )?;
            takeout.set_ts_bound(Box::new(bound));
            takeout.set_ts_slack(cfg.ts_slack);
        }
        let takeout = Arc::new(takeout);
        let slots_bytes = usize::try_from(cfg.lock_table_slots)
            .ok()
            .and_then(|n| n.checked_mul(SLOT_BYTES))
            .ok_or_else(|| ConfigError {
                key: "lock-table-slots",
                what: "overflows the address space".into(),
            })?;
        let map = ShardMap::partial(me.get(), &parse_shards(&cfg.shards)?, cfg.map_version)?;
        let lotus = Arc::new(
            TableService::new(
                Arc::new(lock_table::LockTable::with_bytes(slots_bytes)),
                Ownership::new(me.get(), map),
            )
            .with_epoch(epoch)
            .with_host_incarnation(fabric.incarnation()),
        );
        if !cfg.lotus_serving {
            lotus.set_serving(false);
        }
        let mut exports = host_exports;
        let mut export = takeout.export();
        if reader.is_some() {
            export["lock_read"] = true.into();
        }
        exports.insert(EXPORT_NAME.to_string(), export);
        exports.insert(TABLE_EXPORT.to_string(), lotus.export());
        let mut words = Vec::new();
        for (name, n) in [(CAS_EXPORT, cfg.cas_locks), (DSLR_EXPORT, cfg.dslr_locks)] {
            if n > 0 {
                let t = WordTable::new(&fabric, n)?;
                exports.insert(name.to_string(), t.export());
                words.push(t);
            }
        }
        let mut handlers = rrpc::server::Handlers::new();
        takeout.register_with_reader(&mut handlers, cfg.lock_order, reader);
        lotus.register(&mut handlers);
        extra(&mut handlers);
        let mut settings = rpc.clone();
        if cfg.idle_sleep_us != 0 {
            settings.server.idle_sleep_us = cfg.idle_sleep_us;
        }
        let node_cfg = NodeConfig::new(role, listen)
            .with_exports(exports)
            .with_rpc(Some((handlers, cfg.threads as usize)));
        let node = match runtime {
            None => Node::start_tuned(fabric.clone(), node_cfg, &settings)?,
            Some(rt) => Node::start_with_runtime(
                fabric.clone(),
                node_cfg,
                settings.server.clone(),
                Some(rt),
            )?,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let reshard = if cfg.reshard.nodes.is_empty() {
            None
        } else {
            let mut addrs = vec![node.addr()];
            addrs.extend(
                cfg.reshard
                    .nodes
                    .iter()
                    .copied()
                    .filter(|&a| a != node.addr()),
            );
            Some(spawn_loop(
                fabric,
                rpc.runtime.clone(),
                addrs,
                cfg.reshard.loop_config(),
                stop.clone(),
            )?)
        };
        Ok(Self {
            takeout,
            lotus,
            words,
            stop,
            reshard,
            node,
            _state: state,
        })
    }

    /// The node's bootstrap (control-plane) address.
    pub fn addr(&self) -> SocketAddr {
        self.node.addr()
    }

    /// The rrpc node.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// The Takeout Lock table.
    pub fn takeout(&self) -> &Arc<LockTable> {
        &self.takeout
    }

    /// The Lotus lock table service (call it directly from coordinators of this process).
    pub fn lotus(&self) -> &Arc<TableService> {
        &self.lotus
    }

    /// The CAS and DSLR word tables exported, in that order, those configured.
    pub fn word_tables(&self) -> &[WordTable] {
        &self.words
    }

    /// Whether the resharding loop runs here.
    pub fn runs_reshard_loop(&self) -> bool {
        self.reshard.is_some()
    }
}

impl Drop for LockService {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.reshard.take() {
            let _ = h.join();
        }
    }
}

/// The resharding loop's thread: a runtime of its own on this node's fabric, connected
/// to every lock-table node at `addrs` (this one first), until `stop`.
fn spawn_loop(
    fabric: Fabric,
    runtime: RuntimeConfig,
    addrs: Vec<SocketAddr>,
    cfg: LoopConfig,
    stop: Arc<AtomicBool>,
) -> Result<JoinHandle<()>, StartError> {
    std::thread::Builder::new()
        .name("lockd-reshard".into())
        .spawn(move || {
            let ctx = match ThreadCtx::new(fabric, runtime) {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!(error = %e, "resharding loop: no runtime");
                    return;
                }
            };
            let mut nodes = Vec::new();
            for a in &addrs {
                // Peers may start after us: retry until they answer or we stop.
                loop {
                    match ctx.connect_rpc(*a) {
                        Ok(info) => {
                            nodes.push(info.node);
                            break;
                        }
                        Err(e) if !stop.load(Ordering::Acquire) => {
                            tracing::debug!(addr = %a, error = %e, "resharding loop: connecting");
                            std::thread::sleep(Duration::from_millis(100));
                        }
                        Err(_) => return,
                    }
                }
            }
            tracing::info!(?nodes, interval = ?cfg.interval, "resharding loop running");
            let c = ctx.clone();
            let r = block_on(&ctx, async move {
                let stop_fn = || stop.load(Ordering::Acquire);
                let mut on_move = |r: &crate::reshard::MoveReport| {
                    tracing::info!(from = r.from, to = r.to, range = ?r.range, state = ?r.state, "resharding move");
                };
                run_loop(&c, &nodes, cfg, &stop_fn, &mut on_move).await
            });
            if let Err(e) = r {
                tracing::error!(error = %e, "resharding loop stopped");
            }
        })
        .map_err(StartError::Thread)
}
