//! Lotus's lock tables served over rrpc, and their client (Lotus 4.1, 4.2, 4.3, 6).
//!
//! A [`TableService`] is one node's [`LockTable`] plus its [`Ownership`] (which shards it
//! serves). Its handlers answer batched messages ([`crate::table_wire`]): one message
//! carries up to 20 lock or unlock operations for the node, each answered granted,
//! released, not held, refused (why), wrong shard (with the node's map version) or moving.
//! The same service is called directly by coordinators in the same process
//! ([`TableService::apply`], Lotus's placement: locks on compute nodes) or through RPC
//! by remote ones.
//!
//! A [`TableClient`] (one per runtime thread) groups a transaction's operations by
//! destination node with its [`ShardMap`], sends one message per node (per 20
//! operations) in parallel, runs those for its own node directly when it has a local
//! service, and on wrong-shard refetches the refusing node's map and retries; moving
//! shards are retried after a short pause. Retries are bounded: what is still wrong-shard
//! or moving after [`TableClientConfig::max_retries`] is returned as such, and the
//! transaction aborts.
//!
//! **Lotus lock-first pieces.** A write lock granted to another compute node calls the
//! service's grant hook before the outcome is returned ([`TableService::with_grant_hook`];
//! Lotus, Algorithm 1, line 15: the version-table cache entry is invalidated before the
//! remote writer proceeds); a read holder's write op is its upgrade
//! ([`crate::lock_table::upgrade`]). A failed compute node is marked down on the
//! survivors' services and clients ([`TableService::mark_down`],
//! [`TableClient::mark_down`]): new locks on its shards are refused at once as
//! [`OpOutcome::Down`] (`cn-down`), the client sending nothing; a restarted node's table
//! refuses them the same way until the recovery handshake lets it serve
//! ([`TableService::set_serving`]; Lotus 6, the spec's A.6 steps 1 and 5). Unlocks can
//! be fire and forget ([`TableClient::unlock_detached`], Lotus 5.1).
//!
//! [`run_move`] drives a [`Move`] (pass-by-range resharding) over the control RPCs:
//! drain at the source, poll until no lock on the range is held (or cancel), install the
//! new map at the destination, then the source, then every other node.
//!
//! Concurrency: a batch runs under a read lock of the ownership and a drain begins under
//! its write lock, so once [`TableService::begin_drain`] returns, every lock granted on
//! the range before it is in the lock state and counted by [`TableService::held_in`].

use rrpc::NodeId;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use rrpc::runtime::{join_all, CallError, ThreadCtx};

use rrpc::typed::{Rpc, TypedCallError};
use zerocopy::little_endian::U64;

use crate::load::{LoadMeter, TableStatsRpc};
use crate::lock_table::{LockMode, LockTable};
use crate::owners::Owner;
use crate::shard::{
    LockKey, MapError, Move, MoveState, MoveStep, Ownership, Route, ShardMap, NO_NODE,
};
use crate::table_wire::{
    decode_outcomes, encode_ops, encode_outcomes, table_ops, DrainReq, OpKind, OpOutcome,
    ReleaseTarget, TableDrainRpc, TableInstallRpc, TableMapRpc, TableOp, TableOpsRpc,
    TableReleaseNodeRpc, TableWireError, MAX_OPS, TABLE_OPS_HANDLER,
};

/// A placeholder operation (the stack buffer a request's operations are read into).
const NO_OP: TableOp = TableOp {
    key: LockKey(0),
    txn: 0,
    node: 0,
    kind: OpKind::Unlock,
};

/// Name under which a node's table is described in its exports ([`TableService::export`]).
pub const TABLE_EXPORT: &str = "lock-table";

/// Called by a [`TableService`] for every write lock it grants to another compute node
/// than its own (upgrades included), with the key and the requesting node, before the
/// outcome is returned (Lotus, Algorithm 1, lines 14-15: `if NotLocal(cn_id) then
/// InvalidateCache(key)`). See [`TableService::with_grant_hook`].
pub type GrantHook = Arc<dyn Fn(LockKey, u32) + Send + Sync>;

/// Called by a [`TableService`] with each range of shards it stops serving as a new map
/// is installed. See [`TableService::set_lost_range_hook`].
pub type LostRangeHook = Arc<dyn Fn(std::ops::Range<u16>) + Send + Sync>;

/// `shards` (ascending) as contiguous ranges.
fn contiguous(shards: &[u16]) -> Vec<std::ops::Range<u16>> {
    let mut out: Vec<std::ops::Range<u16>> = Vec::new();
    for &s in shards {
        match out.last_mut() {
            Some(r) if r.end == s => r.end = s + 1,
            _ => out.push(s..s + 1),
        }
    }
    out
}

/// A node's lock table and the shards it serves. `Sync`: shared by the node's RPC
/// threads and local coordinators.
pub struct TableService {
    table: Arc<LockTable>,
    own: RwLock<Ownership>,
    meter: LoadMeter,
    epoch: u64,
    /// The incarnation [`Self::apply`] runs the host process's operations as.
    host_incarnation: u64,
    /// Called for remote write grants ([`Self::with_grant_hook`],
    /// [`Self::set_grant_hook`]).
    grant_hook: std::sync::OnceLock<GrantHook>,
    /// Called for shards a new map takes away ([`Self::set_lost_range_hook`]).
    lost_hook: std::sync::OnceLock<LostRangeHook>,
}

impl TableService {
    /// Serve `table` for the shards `own` gives this node, in service epoch
    /// [`crate::service::clock_epoch`] (see [`Self::with_epoch`]).
    pub fn new(table: Arc<LockTable>, own: Ownership) -> Self {
        Self {
            table,
            own: RwLock::new(own),
            meter: LoadMeter::new(),
            epoch: crate::service::clock_epoch(),
            host_incarnation: crate::owners::process_incarnation(),
            grant_hook: std::sync::OnceLock::new(),
            lost_hook: std::sync::OnceLock::new(),
        }
    }

    /// Call `hook(key, node)` for every write lock this service grants to a compute node
    /// `node` other than its own ([`Self::node`]), upgrades from read included and a
    /// retried request for a write lock already held too (an invalidation is
    /// idempotent). Lotus, Algorithm 1, line 15 and 4.4: this node's version-table cache
    /// holds the CVTs of keys its own coordinators lock; a remote writer is about to
    /// change the key's CVT in the memory pool, so this node's cached entry must be
    /// invalidated *before* the writer can proceed, i.e. before the grant reaches it.
    /// The hook therefore runs synchronously inside [`Self::apply`] /
    /// [`Self::apply_as`] (on the RPC thread serving the request, under the service's
    /// ownership read lock), after the lock is taken and before the outcome is returned;
    /// no local holder can coexist with the remote writer, and a later local locker is
    /// refused until it releases. It must be quick and must not call back into this
    /// service's ownership changes ([`Self::install`], [`Self::begin_drain`], ...).
    /// Refused locks, read locks and the service's own node's write locks do not call it.
    pub fn with_grant_hook(self, hook: GrantHook) -> Self {
        // A fresh service has no hook yet.
        let _ = self.grant_hook.set(hook);
        self
    }

    /// [`Self::with_grant_hook`] on a service already shared (an embedded lock
    /// service's table, [`crate::embed::LockService::lotus`]). Install it before any
    /// coordinator of this node fills its cache: grants made before it invalidate
    /// nothing. Returns false (and changes nothing) when a hook is installed already.
    pub fn set_grant_hook(&self, hook: GrantHook) -> bool {
        self.grant_hook.set(hook).is_ok()
    }

    /// Run the host process's operations ([`Self::apply`]) as incarnation `incarnation`
    /// (default [`crate::owners::process_incarnation`]). A service embedded in a
    /// process with a fabric sets its fabric's ([`rrpc::fabric::Fabric::incarnation`],
    /// as [`crate::embed::LockService::start`] does): that is the incarnation the host's
    /// connections announce, and its [`TableClient`]s run as by default, so a lock
    /// taken one way is released the other.
    pub fn with_host_incarnation(mut self, incarnation: u64) -> Self {
        self.host_incarnation = incarnation;
        self
    }

    /// The incarnation [`Self::apply`] runs operations as
    /// ([`Self::with_host_incarnation`]).
    pub fn host_incarnation(&self) -> u64 {
        self.host_incarnation
    }

    /// This service in epoch `epoch`, which must be larger than every earlier start's
    /// of this node's service: every reply carries it, and a client that sees it change
    /// knows the locks it took before are gone ([`TableError::Restarted`]).
    pub fn with_epoch(mut self, epoch: u64) -> Self {
        self.epoch = epoch;
        self
    }

    /// The service epoch its replies carry.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// This node's load counters for the current resharding interval (Lotus 4.3): every
    /// batch [`Self::apply`] serves is counted (requests per shard, time per operation);
    /// coordinators of the same process may add their latencies.
    pub fn meter(&self) -> &LoadMeter {
        &self.meter
    }

    /// The lock table.
    pub fn table(&self) -> &Arc<LockTable> {
        &self.table
    }

    fn own(&self) -> std::sync::RwLockReadGuard<'_, Ownership> {
        // A poisoned lock means a panic elsewhere; Ownership is replaced whole, so it is
        // consistent: keep serving.
        self.own.read().unwrap_or_else(|e| e.into_inner())
    }

    fn own_mut(&self) -> std::sync::RwLockWriteGuard<'_, Ownership> {
        self.own.write().unwrap_or_else(|e| e.into_inner())
    }

    /// This node's id.
    pub fn node(&self) -> u32 {
        self.own().me()
    }

    /// A copy of the node's current map.
    pub fn map(&self) -> ShardMap {
        self.own().map().clone()
    }

    /// Run `ops` in order on this node, pushing one outcome each to `out`; returns the
    /// map version they were routed by (the reply header). Locks on shards of a node
    /// marked down ([`Self::mark_down`]), or on this node's own shards while it is not
    /// serving ([`Self::set_serving`]), are [`OpOutcome::Down`]; on shards the node does
    /// not own [`OpOutcome::WrongShard`], on a draining range [`OpOutcome::Moving`]; an
    /// unlock the table holds is served whatever the map says, one it does not hold on a
    /// down node's shard is [`OpOutcome::NotHeld`]. A write lock granted to another node
    /// calls the grant hook first ([`Self::with_grant_hook`]).
    ///
    /// The operations are the host process's (the embedded placement): they run as its
    /// incarnation, [`Self::host_incarnation`].
    pub fn apply(&self, ops: &[TableOp], out: &mut Vec<OpOutcome>) -> u64 {
        self.apply_as(ops, self.host_incarnation, out)
    }

    /// [`Self::apply`] for operations of incarnation `incarnation` of their nodes: the
    /// holders recorded carry it, and operations of an incarnation older than one seen for
    /// their node are refused ([`crate::lock_table::Refusal::StaleIncarnation`]).
    pub fn apply_as(&self, ops: &[TableOp], incarnation: u64, out: &mut Vec<OpOutcome>) -> u64 {
        let start = quanta::Instant::now();
        let version = self.apply_inner(ops, incarnation, out);
        for op in ops {
            self.meter.record_op(op.key.shard());
        }
        if !ops.is_empty() {
            self.meter
                .record_latency_n(start.elapsed(), ops.len() as u64);
        }
        version
    }

    fn apply_inner(&self, ops: &[TableOp], inc: u64, out: &mut Vec<OpOutcome>) -> u64 {
        let own = self.own();
        let version = own.map().version();
        for op in ops {
            out.push(match op.kind {
                OpKind::Lock(mode) => match own.route_lock(op.key) {
                    Route::Serve => {
                        match self.table.acquire_inc(op.key.0, mode, op.txn, op.node, inc) {
                            Ok(()) => {
                                if let (LockMode::Write, Some(hook)) = (mode, self.grant_hook.get())
                                {
                                    if op.node != own.me() {
                                        hook(op.key, op.node);
                                    }
                                }
                                OpOutcome::Granted
                            }
                            Err(r) => OpOutcome::Refused(r),
                        }
                    }
                    Route::WrongShard { version } => OpOutcome::WrongShard { version },
                    Route::Moving => OpOutcome::Moving,
                    Route::Down => OpOutcome::Down,
                },
                OpKind::Unlock => match self.table.release_inc(op.key.0, op.txn, op.node, inc) {
                    Ok(true) => OpOutcome::Released,
                    Ok(false) => match own.route_release(op.key) {
                        Route::WrongShard { version } => OpOutcome::WrongShard { version },
                        _ => OpOutcome::NotHeld,
                    },
                    Err(r) => OpOutcome::Refused(r),
                },
            });
        }
        version
    }

    /// Start draining `range` for a move: new locks on it are refused as moving. Returns
    /// the locks held on it.
    ///
    /// Errors: [`MapError::BadRange`] when the node does not own all of it or another
    /// range is draining.
    pub fn begin_drain(&self, range: Range<u16>) -> Result<usize, MapError> {
        self.own_mut().begin_drain(range.clone())?;
        Ok(self.held_in(range))
    }

    /// Locks held on keys of shards `range`.
    pub fn held_in(&self, range: Range<u16>) -> usize {
        self.table
            .count_held(|k| range.contains(&LockKey(k).shard()))
    }

    /// The range being drained for a move, if any.
    pub fn draining(&self) -> Option<Range<u16>> {
        self.own().draining()
    }

    /// Serve the draining range again (a cancelled move).
    pub fn cancel_drain(&self) {
        self.own_mut().cancel_drain();
    }

    /// Install `map` if newer (see [`Ownership::install`]); returns the version after.
    pub fn install(&self, map: &ShardMap) -> u64 {
        if let Some(hook) = self.lost_hook.get() {
            // Shards this node serves now and not under `map`: their cache entries go
            // before ownership passes (Lotus 4.3). The range is drained (its locks are
            // refused as moving), so no holder fills the cache meanwhile.
            // As the install will have it: an older map changes nothing, and shards
            // the new one leaves unknown keep what this node knows of them.
            let lost: Vec<u16> = {
                let own = self.own();
                let me = own.me();
                if map.version() <= own.map().version() {
                    Vec::new()
                } else {
                    let merged = own.map().merge(map);
                    own.map()
                        .shards_of(me)
                        .into_iter()
                        .filter(|&s| merged.owner(s) != me)
                        .collect()
                }
            };
            for r in contiguous(&lost) {
                hook(r);
            }
        }
        let mut own = self.own_mut();
        own.install(map);
        own.map().version()
    }

    /// Call `hook(shards)` for every range of shards this node stops serving when a new
    /// map is installed ([`Self::install`]: a resharding move passing them to another
    /// node, Lotus 4.3), before the map takes effect: the node's version table cache
    /// drops the entries of keys it will no longer lock (if the range came back later,
    /// they would be stale). Returns false (and changes nothing) when a hook is
    /// installed already.
    pub fn set_lost_range_hook(&self, hook: LostRangeHook) -> bool {
        self.lost_hook.set(hook).is_ok()
    }

    /// Mark compute node `node` down (it failed; Lotus 6, the spec's A.6 step 1): new
    /// locks on its shards are refused at once as [`OpOutcome::Down`] (never
    /// wrong-shard, which would send the client to refetch a map and retry). Idempotent.
    /// Marking this service's own node down is [`Self::set_serving`]`(false)`.
    pub fn mark_down(&self, node: u32) {
        self.own_mut().set_down(node, true);
    }

    /// Mark compute node `node` up again (its restart handshake finished, A.6 step 5).
    pub fn mark_up(&self, node: u32) {
        self.own_mut().set_down(node, false);
    }

    /// Whether compute node `node` is marked down ([`Self::mark_down`]).
    pub fn is_down(&self, node: u32) -> bool {
        self.own().is_down(node)
    }

    /// Let this node's table serve lock requests (`true`, the default) or refuse them as
    /// [`OpOutcome::Down`] (`false`): a node restarted under the same id starts with an
    /// empty table and must not grant locks until every survivor has finished the
    /// recovery of its predecessor's transactions (the restart handshake of the spec's
    /// A.6 step 5; Lotus 6: it "serves new lock requests from an empty lock table after
    /// all previously associated transactions have finished"). Unlocks are still served.
    pub fn set_serving(&self, serving: bool) {
        self.own_mut().set_serving(serving);
    }

    /// Whether this node's table serves lock requests ([`Self::set_serving`]).
    pub fn serving(&self) -> bool {
        self.own().serving()
    }

    /// Release every lock held by transactions of compute node `node`, of every
    /// incarnation (Lotus 6). Prefer [`Self::release_incarnation`].
    pub fn release_node(&self, node: u32) -> usize {
        self.table.release_node(node)
    }

    /// Release every lock held by transactions of the failed incarnation `dead` (Lotus
    /// 6); a restarted node's locks under a newer incarnation stay.
    pub fn release_incarnation(&self, dead: Owner) -> usize {
        self.table.release_incarnation(dead.node, dead.incarnation)
    }

    /// The export describing this node's table (JSON: node id, map version).
    pub fn export(&self) -> serde_json::Value {
        let own = self.own();
        serde_json::json!({ "node": own.me(), "map_version": own.map().version() })
    }

    /// Handler body of [`TABLE_OPS_HANDLER`] for a caller the RPC layer does not name:
    /// the incarnation is the one the request declares. See [`Self::handle_ops_from`].
    pub fn handle_ops(&self, req: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        self.serve_ops(None, req, out)
    }

    /// Handler body of [`TABLE_OPS_HANDLER`] for a request from `caller`: every
    /// operation must name `caller`'s node (else the request is refused and nothing
    /// runs), and runs as `caller`'s incarnation.
    pub fn handle_ops_from(
        &self,
        caller: Owner,
        req: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), String> {
        self.serve_ops(Some(caller), req, out)
    }

    fn serve_ops(
        &self,
        caller: Option<Owner>,
        req: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), String> {
        // The request is read in place into operations on the stack: no allocation for
        // them.
        let b = rrpc::typed::view_request::<TableOpsRpc, _, _>(req)
            .map_err(|e| format!("lock-table RPC: {e}"))?;
        let mut buf = [NO_OP; MAX_OPS];
        let mut n = 0;
        for (slot, op) in buf
            .iter_mut()
            .zip(table_ops(b).map_err(|e| format!("lock-table RPC: {e}"))?)
        {
            *slot = op;
            n += 1;
        }
        let ops = &buf[..n];
        let declared = b.head.incarnation.get();
        let inc = match caller {
            Some(c) => {
                if let Some(op) = ops.iter().find(|op| op.node != c.node) {
                    return Err(format!(
                        "lock-table RPC: an operation names node {}, the caller is node {}",
                        op.node, c.node
                    ));
                }
                c.incarnation
            }
            None => declared,
        };
        let mut outs = Vec::with_capacity(ops.len());
        let v = self.apply_as(ops, inc, &mut outs);
        encode_outcomes(v, self.epoch, &outs, out);
        Ok(())
    }

    /// Register this service's handlers ([`TABLE_OPS_HANDLER`] and the control ones) on
    /// `h`. The caller of [`TABLE_OPS_HANDLER`] is the one the RPC layer authenticated
    /// for the connection, not what the request declares.
    pub fn register(self: &Arc<Self>, h: &mut rrpc::server::Handlers) {
        let me = self.clone();
        h.register_with_caller(TABLE_OPS_HANDLER, move |c, req, out| {
            me.handle_ops_from(crate::service::caller_owner(c), req, out)
        });
        let me = self.clone();
        h.register_typed::<TableMapRpc>(move |()| Ok(me.map().to_wire()));
        let me = self.clone();
        h.register_typed::<TableInstallRpc>(move |w| {
            let m = ShardMap::from_wire(&w).map_err(|e| e.to_string())?;
            Ok(U64::new(me.install(&m)))
        });
        let me = self.clone();
        h.register_typed::<TableDrainRpc>(move |w| {
            let held = match DrainReq::of(&w).ok_or("malformed drain request")? {
                DrainReq::Begin { start, end } => {
                    me.begin_drain(start..end).map_err(|e| e.to_string())?
                }
                DrainReq::Held { start, end } => me.held_in(start..end),
                DrainReq::Cancel => {
                    me.cancel_drain();
                    0
                }
            };
            Ok(U64::new(held as u64))
        });
        let me = self.clone();
        h.register_typed::<TableStatsRpc>(move |()| Ok(me.meter.take().to_wire()));
        let me = self.clone();
        h.register_typed::<TableReleaseNodeRpc>(move |b| {
            let n = match ReleaseTarget::of(&b).map_err(|e| format!("release node: {e}"))? {
                ReleaseTarget::Node(node) => me.release_node(node),
                ReleaseTarget::Incarnation(o) => me.release_incarnation(o),
            };
            Ok(U64::new(n as u64))
        });
    }

    /// A handler set with only this service's handlers.
    pub fn handlers(self: &Arc<Self>) -> rrpc::server::Handlers {
        let mut h = rrpc::server::Handlers::new();
        self.register(&mut h);
        h
    }
}

/// Errors of [`TableClient`] operations.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TableError {
    /// An RPC to a lock-table node failed.
    #[error("lock-table node {node}")]
    Rpc {
        /// The node.
        node: u32,
        /// Why.
        #[source]
        cause: CallError,
    },
    /// A node answered something this client cannot decode.
    #[error("lock-table node {node}: malformed reply")]
    Reply {
        /// The node.
        node: u32,
        /// Why.
        #[source]
        cause: TableWireError,
    },
    /// A node sent a map this client cannot decode.
    #[error("lock-table node {node}: shard map")]
    Map {
        /// The node.
        node: u32,
        /// Why.
        #[source]
        cause: MapError,
    },
    /// No known node owns the key's shard.
    #[error("no node owns shard {shard} (map version {version})")]
    NoOwner {
        /// The shard.
        shard: u16,
        /// The client's map version.
        version: u64,
    },
    /// A control reply of the wrong size.
    #[error("lock-table node {node}: control reply of {len} bytes")]
    ControlReply {
        /// The node.
        node: u32,
        /// Its length.
        len: usize,
    },
    /// The node's service restarted: it answered in epoch `now` after `was`. The locks
    /// taken there before are gone (the new table never held them); the transaction
    /// must abort.
    #[error("lock-table node {node} restarted (epoch {was}, now {now}): its locks are gone")]
    Restarted {
        /// The node.
        node: u32,
        /// The epoch it answered in before.
        was: u64,
        /// The epoch it answers in now.
        now: u64,
    },
}

/// Retry policy of a [`TableClient`].
///
/// Non-exhaustive, so that a setting can be added without breaking the crates that embed
/// this one: outside this crate, start from [`Default::default`] and chain the `with_*`
/// setters (or assign the public fields on a `let mut` binding).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TableClientConfig {
    /// Rounds of retries for wrong-shard and moving outcomes (default 64).
    pub max_retries: u32,
    /// Pause before retrying moving operations, or wrong-shard ones whose node has an
    /// older map than the client's (default 50 us).
    pub retry_pause: Duration,
    /// Operations per message (1 to [`MAX_OPS`], default [`MAX_OPS`]; 1 sends one message
    /// per operation, for comparison).
    pub batch: usize,
    /// The incarnation its operations declare, and run as on a local service
    /// ([`TableClient::new`]'s `local`); `None` (the default): the incarnation of the
    /// fabric of the context they are sent on ([`rrpc::fabric::Fabric::incarnation`]),
    /// which is what a remote node's service takes from the connection whatever the
    /// request declares. The lock table refuses operations of an incarnation older than
    /// one it has seen for the node.
    pub incarnation: Option<u64>,
}

impl Default for TableClientConfig {
    fn default() -> Self {
        Self {
            max_retries: 64,
            retry_pause: Duration::from_micros(50),
            batch: MAX_OPS,
            incarnation: None,
        }
    }
}

impl TableClientConfig {
    /// Set [`TableClientConfig::max_retries`]: rounds of retries for wrong-shard and moving
    /// outcomes (default 64).
    pub fn with_max_retries(mut self, max_retries: u32) -> Self {
        self.max_retries = max_retries;
        self
    }

    /// Set [`TableClientConfig::retry_pause`]: pause before retrying moving operations, or
    /// wrong-shard ones whose node has an older map than the client's (default 50 us).
    pub fn with_retry_pause(mut self, retry_pause: Duration) -> Self {
        self.retry_pause = retry_pause;
        self
    }

    /// Set [`TableClientConfig::batch`]: operations per message (1 to [`MAX_OPS`], default
    /// [`MAX_OPS`]; 1 sends one message per operation, for comparison).
    pub fn with_batch(mut self, batch: usize) -> Self {
        self.batch = batch;
        self
    }

    /// Set [`TableClientConfig::incarnation`]: the incarnation its operations declare, and run
    /// as on a local service ([`TableClient::new`]'s `local`); `None` (the default): the
    /// incarnation of the fabric of the context they are sent on
    /// ([`rrpc::fabric::Fabric::incarnation`]), which is what a remote node's service takes
    /// from the connection whatever the request declares.
    pub fn with_incarnation(mut self, incarnation: Option<u64>) -> Self {
        self.incarnation = incarnation;
        self
    }
}

/// A runtime thread's client of the lock-table nodes. Not `Sync`: one per thread.
pub struct TableClient {
    map: RefCell<ShardMap>,
    local: Option<Arc<TableService>>,
    cfg: TableClientConfig,
    /// The service epoch each node answered in first.
    epochs: RefCell<std::collections::HashMap<u32, u64>>,
    /// Compute nodes marked down ([`Self::mark_down`]).
    down: RefCell<BTreeSet<u32>>,
    /// Keys whose detached unlock failed ([`Self::unlock_detached`]); shared with the
    /// coroutines that send them.
    unlock_failures: Arc<AtomicU64>,
}

/// Whether `o` answers an unlock as done: released, or not held (a no-op).
fn unlock_done(o: &OpOutcome) -> bool {
    matches!(o, OpOutcome::Released | OpOutcome::NotHeld)
}

/// What a client answers, without an RPC, for an operation on a node marked down: a
/// lock is refused ([`OpOutcome::Down`]), an unlock is a no-op ([`OpOutcome::NotHeld`]:
/// the node's table, and the lock with it, is gone).
fn down_outcome(kind: OpKind) -> OpOutcome {
    match kind {
        OpKind::Lock(_) => OpOutcome::Down,
        OpKind::Unlock => OpOutcome::NotHeld,
    }
}

/// Fetch node `node`'s shard map over RPC.
///
/// Errors: [`TableError::Rpc`], [`TableError::Map`].
pub async fn fetch_map(ctx: &ThreadCtx, node: u32) -> Result<ShardMap, TableError> {
    match ctx.call_typed::<TableMapRpc>(NodeId(node), &()).await {
        Ok(w) => ShardMap::from_wire(&w).map_err(|cause| TableError::Map { node, cause }),
        Err(TypedCallError::Decode(e)) => Err(TableError::Map {
            node,
            cause: MapError::Encoding(e.len),
        }),
        Err(e) => Err(typed_error(node, e)),
    }
}

/// The [`TableError`] of a failed typed call to `node`: [`TableError::Rpc`] for the
/// call's own failures, [`TableError::ControlReply`] for a reply that does not decode.
fn typed_error(node: u32, e: TypedCallError) -> TableError {
    match e {
        TypedCallError::Call(cause) => TableError::Rpc { node, cause },
        TypedCallError::Decode(e) => TableError::ControlReply { node, len: e.len },
        // Fixed layouts always encode; nothing was sent.
        _ => TableError::Rpc {
            node,
            cause: CallError::Protocol {
                node: NodeId(node),
                what: "the request does not encode",
            },
        },
    }
}

/// One control call of `R` (its reply a `u64`) to `node`.
async fn control<R: Rpc<Resp = U64>>(
    ctx: &ThreadCtx,
    node: u32,
    req: &R::Req,
) -> Result<u64, TableError> {
    ctx.call_typed::<R>(NodeId(node), req)
        .await
        .map(|v| v.get())
        .map_err(|e| typed_error(node, e))
}

impl TableClient {
    /// A client routing by `map`, with `local` as the service of its own process
    /// (operations for `local`'s node run directly, without RPC).
    pub fn new(map: ShardMap, local: Option<Arc<TableService>>, cfg: TableClientConfig) -> Self {
        Self {
            map: RefCell::new(map),
            local,
            cfg,
            epochs: RefCell::default(),
            down: RefCell::default(),
            unlock_failures: Arc::default(),
        }
    }

    /// Mark compute node `node` down (it failed; Lotus 6, the spec's A.6 step 1): from
    /// now on [`Self::execute`] answers locks on its shards [`OpOutcome::Down`] and
    /// unlocks there [`OpOutcome::NotHeld`] (its table is gone) at once, without an RPC;
    /// [`Self::release_node`] and [`Self::unlock_detached`] skip it. Idempotent.
    pub fn mark_down(&self, node: u32) {
        self.down.borrow_mut().insert(node);
    }

    /// Mark compute node `node` up again (its restart handshake finished, A.6 step 5):
    /// operations on its shards are sent to it again.
    pub fn mark_up(&self, node: u32) {
        self.down.borrow_mut().remove(&node);
    }

    /// Whether compute node `node` is marked down ([`Self::mark_down`]).
    pub fn is_down(&self, node: u32) -> bool {
        self.down.borrow().contains(&node)
    }

    /// Keys whose detached unlock ([`Self::unlock_detached`]) failed so far: an RPC or
    /// reply error, or an outcome other than released or not held (e.g. wrong shard, a
    /// stale incarnation). Counted when the coroutine sending them finishes.
    pub fn unlock_failures(&self) -> u64 {
        self.unlock_failures.load(Ordering::Relaxed)
    }

    /// The incarnation this client's operations run as on `ctx`
    /// ([`TableClientConfig::incarnation`]).
    fn incarnation(&self, ctx: &ThreadCtx) -> u64 {
        self.cfg
            .incarnation
            .unwrap_or_else(|| ctx.fabric().incarnation())
    }

    /// Release `keys` held by transaction `txn` of compute node `node`, fire and forget
    /// (Lotus 5.1: "remote unlocks are sent and not awaited"; an aborted transaction
    /// releases this way too). Keys of the local service's node are released
    /// synchronously, by the CPU, before this returns; those of other nodes are sent in
    /// one message per node (per [`TableClientConfig::batch`] keys) by coroutines
    /// spawned on `ctx`'s executor ([`ThreadCtx::spawn`]) and not awaited; they run
    /// when the calling coroutine next yields, and an executor's `run` (or
    /// [`rrpc::runtime::block_on`]) returns only after they finished. Keys of nodes
    /// marked down are skipped (nothing to release). Nothing is retried: a key whose
    /// release failed, or whose shard has no known owner, adds one to
    /// [`Self::unlock_failures`] (the lock stays until [`Self::release_node`] or its
    /// node's restart passes it on).
    pub fn unlock_detached(&self, ctx: &Rc<ThreadCtx>, txn: u64, node: u32, keys: &[LockKey]) {
        let inc = self.incarnation(ctx);
        let mut by_node: BTreeMap<u32, Vec<TableOp>> = BTreeMap::new();
        {
            let map = self.map.borrow();
            for &key in keys {
                let owner = map.node_of(key);
                if owner == NO_NODE {
                    self.unlock_failures.fetch_add(1, Ordering::Relaxed);
                } else if !self.is_down(owner) {
                    by_node.entry(owner).or_default().push(TableOp {
                        key,
                        txn,
                        node,
                        kind: OpKind::Unlock,
                    });
                }
            }
        }
        for (owner, ops) in by_node {
            match &self.local {
                Some(l) if l.node() == owner => {
                    let mut o = Vec::with_capacity(ops.len());
                    l.apply_as(&ops, inc, &mut o);
                    let failed = o.iter().filter(|o| !unlock_done(o)).count();
                    self.unlock_failures
                        .fetch_add(failed as u64, Ordering::Relaxed);
                }
                _ => {
                    for chunk in ops.chunks(self.cfg.batch.clamp(1, MAX_OPS)) {
                        let batch = chunk.to_vec();
                        let failures = self.unlock_failures.clone();
                        let weak = Rc::downgrade(ctx);
                        ctx.spawn(async move {
                            let failed = match weak.upgrade() {
                                None => batch.len(),
                                Some(ctx) => match send(&ctx, owner, &batch, inc).await {
                                    Ok((_, o)) => o.iter().filter(|o| !unlock_done(o)).count(),
                                    Err(e) => {
                                        tracing::debug!(error = %e, node = owner, "detached unlock failed");
                                        batch.len()
                                    }
                                },
                            };
                            failures.fetch_add(failed as u64, Ordering::Relaxed);
                        });
                    }
                }
            }
        }
    }

    /// Record that `node` answered in service epoch `epoch`; the error to return if it
    /// answered in another one before (its service restarted).
    fn note_epoch(&self, node: u32, epoch: u64) -> Option<TableError> {
        let was = self.epochs.borrow_mut().insert(node, epoch)?;
        (was != epoch).then_some(TableError::Restarted {
            node,
            was,
            now: epoch,
        })
    }

    /// A client of the nodes `nodes` (already connected on `ctx` with
    /// `ThreadCtx::connect_rpc`): their maps, merged.
    ///
    /// Errors: [`TableError::Rpc`], [`TableError::Map`].
    pub async fn connect(
        ctx: &ThreadCtx,
        nodes: &[u32],
        local: Option<Arc<TableService>>,
        cfg: TableClientConfig,
    ) -> Result<Self, TableError> {
        let mut map: Option<ShardMap> = local.as_ref().map(|l| l.map());
        for r in join_all(nodes.iter().map(|&n| fetch_map(ctx, n))).await {
            let m = r?;
            map = Some(match map {
                Some(old) => old.merge(&m),
                None => m,
            });
        }
        let map = map.unwrap_or_else(|| {
            ShardMap::partial(NO_NODE, &[], 0).expect("an empty shard list is valid")
        });
        Ok(Self::new(map, local, cfg))
    }

    /// The node this client routes `key`'s operations to now (its map's
    /// [`ShardMap::node_of`], without copying the map). A compute node's version-table
    /// cache serves only keys routed to its own table: a lock held on such a key was
    /// granted there (a shard cannot move while a lock on it is held).
    pub fn node_of(&self, key: LockKey) -> u32 {
        self.map.borrow().node_of(key)
    }

    /// Install `map` if it is newer than the client's (merged as
    /// [`Self::refresh_map`] merges), e.g. the survivors' takeover of a dead node's
    /// shards ([`ShardMap::with_takeover`]); returns whether it changed.
    pub fn install_map(&self, map: &ShardMap) -> bool {
        if map.version() <= self.map.borrow().version() {
            return false;
        }
        let merged = self.map.borrow().merge(map);
        *self.map.borrow_mut() = merged;
        true
    }

    /// The client's current map.
    pub fn map(&self) -> ShardMap {
        self.map.borrow().clone()
    }

    /// The retry policy.
    pub fn config(&self) -> TableClientConfig {
        self.cfg
    }

    /// Refetch node `node`'s map and merge it into the client's.
    ///
    /// Errors: those of [`fetch_map`].
    pub async fn refresh_map(&self, ctx: &ThreadCtx, node: u32) -> Result<u64, TableError> {
        let m = match &self.local {
            Some(l) if l.node() == node => l.map(),
            _ => fetch_map(ctx, node).await?,
        };
        let merged = self.map.borrow().merge(&m);
        let v = merged.version();
        *self.map.borrow_mut() = merged;
        Ok(v)
    }

    /// Run `ops` (any number, any nodes): one message per destination node and
    /// [`TableClientConfig::batch`] operations, all in parallel; outcomes in `ops`'
    /// order. Wrong-shard and moving outcomes are retried as the module docs say.
    /// Operations on the shards of a node marked down ([`Self::mark_down`]) are answered
    /// at once without an RPC: locks [`OpOutcome::Down`], unlocks [`OpOutcome::NotHeld`].
    ///
    /// Errors: [`TableError::NoOwner`], [`TableError::Rpc`], [`TableError::Reply`],
    /// [`TableError::Map`]; [`TableError::Restarted`] when a node answered in another
    /// service epoch than before (locks taken there earlier are gone; the next call
    /// goes on in the new epoch). After an error some operations may have run: their
    /// transaction should release what it may hold (releases are idempotent).
    pub async fn execute(
        &self,
        ctx: &ThreadCtx,
        ops: &[TableOp],
    ) -> Result<Vec<OpOutcome>, TableError> {
        let inc = self.incarnation(ctx);
        let mut outs: Vec<Option<OpOutcome>> = vec![None; ops.len()];
        let mut pending: Vec<usize> = (0..ops.len()).collect();
        for round in 0..=self.cfg.max_retries {
            let by_node = self.group(ops, &pending)?;
            let mut remote = Vec::new();
            for (node, idx) in &by_node {
                if self.is_down(*node) {
                    for &i in idx {
                        outs[i] = Some(down_outcome(ops[i].kind));
                    }
                    continue;
                }
                for chunk in idx.chunks(self.cfg.batch.clamp(1, MAX_OPS)) {
                    let batch: Vec<TableOp> = chunk.iter().map(|&i| ops[i]).collect();
                    match &self.local {
                        Some(l) if l.node() == *node => {
                            let mut o = Vec::with_capacity(batch.len());
                            l.apply_as(&batch, inc, &mut o);
                            for (&i, r) in chunk.iter().zip(o) {
                                outs[i] = Some(r);
                            }
                        }
                        _ => remote.push((*node, chunk.to_vec(), batch)),
                    }
                }
            }
            let replies = join_all(
                remote
                    .iter()
                    .map(|(node, _, batch)| send(ctx, *node, batch, inc)),
            )
            .await;
            let mut restarted = None;
            for ((node, chunk, _), r) in remote.iter().zip(replies) {
                let (epoch, o) = r?;
                if let Some(e) = self.note_epoch(*node, epoch) {
                    restarted.get_or_insert(e);
                }
                for (&i, o) in chunk.iter().zip(o) {
                    outs[i] = Some(o);
                }
            }
            if let Some(e) = restarted {
                return Err(e);
            }
            // What to retry, and whose maps to refetch.
            let mine = self.map.borrow().version();
            let mut refetch = BTreeMap::new();
            let mut pause = false;
            pending.clear();
            for (i, o) in outs.iter().enumerate() {
                match o {
                    Some(OpOutcome::WrongShard { version }) => {
                        pending.push(i);
                        if *version > mine {
                            let node = self.map.borrow().node_of(ops[i].key);
                            refetch.insert(node, ());
                        } else {
                            pause = true;
                        }
                    }
                    Some(OpOutcome::Moving) => {
                        pending.push(i);
                        pause = true;
                    }
                    _ => {}
                }
            }
            if pending.is_empty() || round == self.cfg.max_retries {
                break;
            }
            for node in refetch.into_keys() {
                self.refresh_map(ctx, node).await?;
            }
            if pause {
                ctx.sleep(self.cfg.retry_pause).await;
            }
        }
        Ok(outs
            .into_iter()
            .map(|o| o.expect("every operation was answered"))
            .collect())
    }

    fn group(
        &self,
        ops: &[TableOp],
        idx: &[usize],
    ) -> Result<BTreeMap<u32, Vec<usize>>, TableError> {
        let map = self.map.borrow();
        let mut by: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for &i in idx {
            let node = map.node_of(ops[i].key);
            if node == NO_NODE {
                return Err(TableError::NoOwner {
                    shard: ops[i].key.shard(),
                    version: map.version(),
                });
            }
            by.entry(node).or_default().push(i);
        }
        Ok(by)
    }

    /// Release every lock of the failed incarnation `dead` on every node of the map
    /// (Lotus 6) but those marked down ([`Self::mark_down`]: their tables are gone);
    /// locks of a later incarnation of the node stay. Returns how many were released.
    /// Idempotent.
    ///
    /// Errors: [`TableError::Rpc`], [`TableError::ControlReply`].
    pub async fn release_node(&self, ctx: &ThreadCtx, dead: Owner) -> Result<u64, TableError> {
        let nodes = self.map.borrow().nodes();
        let mut n = 0;
        let mut remote = Vec::new();
        for node in nodes.into_iter().filter(|&node| !self.is_down(node)) {
            match &self.local {
                Some(l) if l.node() == node => n += l.release_incarnation(dead) as u64,
                _ => remote.push(node),
            }
        }
        let req = ReleaseTarget::Incarnation(dead).batch();
        for r in join_all(
            remote
                .iter()
                .map(|&node| control::<TableReleaseNodeRpc>(ctx, node, &req)),
        )
        .await
        {
            n += r?;
        }
        Ok(n)
    }
}

async fn send(
    ctx: &ThreadCtx,
    node: u32,
    batch: &[TableOp],
    incarnation: u64,
) -> Result<(u64, Vec<OpOutcome>), TableError> {
    let mut buf = Vec::with_capacity(
        crate::table_wire::OPS_HEADER_BYTES + batch.len() * crate::table_wire::OP_BYTES,
    );
    encode_ops(batch, incarnation, &mut buf).map_err(|cause| TableError::Reply { node, cause })?;
    let r = ctx
        .call(NodeId(node), TableOpsRpc::ID, &buf)
        .await
        .map_err(|cause| TableError::Rpc { node, cause })?;
    decode_outcomes(&r, batch.len())
        .map(|(_, epoch, o)| (epoch, o))
        .map_err(|cause| TableError::Reply { node, cause })
}

/// Drive `mv` to its end over the control RPCs (all nodes of `others` plus the move's
/// two must be connected on `ctx`): begin draining at the source, poll the locks held
/// on the range every `poll` until none (then publish the next map at the destination,
/// the source and `others`, in that order) or until `timeout` (then cancel the drain).
/// Returns the final state ([`MoveState::Published`] or [`MoveState::Cancelled`]).
///
/// Errors: [`TableError::Rpc`] (a node refused to drain, e.g. a range it does not own,
/// arrives as a remote error), [`TableError::Map`], [`TableError::ControlReply`].
pub async fn run_move(
    ctx: &ThreadCtx,
    mv: &mut Move,
    others: &[u32],
    poll: Duration,
    timeout: Duration,
) -> Result<MoveState, TableError> {
    let (start, end) = (mv.range.start, mv.range.end);
    let map = fetch_map(ctx, mv.from).await?;
    let mut held =
        control::<TableDrainRpc>(ctx, mv.from, &DrainReq::Begin { start, end }.wire()).await?;
    loop {
        match mv.on_held(held as usize, &map, Instant::now(), timeout) {
            MoveStep::Wait => {
                ctx.sleep(poll).await;
                held =
                    control::<TableDrainRpc>(ctx, mv.from, &DrainReq::Held { start, end }.wire())
                        .await?;
            }
            MoveStep::Cancel => {
                control::<TableDrainRpc>(ctx, mv.from, &DrainReq::Cancel.wire()).await?;
                return Ok(mv.state());
            }
            MoveStep::Transfer { map: next } => {
                let wire = next.to_wire();
                for &n in [mv.to, mv.from].iter().chain(others) {
                    control::<TableInstallRpc>(ctx, n, &wire).await?;
                }
                mv.published(next.version());
                return Ok(mv.state());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock_table::{LockMode, Refusal};
    use crate::shard::ShardMap;

    fn svc(me: u32, map: &ShardMap) -> TableService {
        TableService::new(
            Arc::new(LockTable::with_bytes(1 << 16)),
            Ownership::new(me, map.clone()),
        )
    }

    fn op(key: LockKey, txn: u64, kind: OpKind) -> TableOp {
        TableOp {
            key,
            txn,
            node: 100,
            kind,
        }
    }

    const W: OpKind = OpKind::Lock(LockMode::Write);

    /// A lock held when the move starts: new locks on the range are refused as moving
    /// at the source and wrong-shard at the destination until the holder releases; then
    /// the destination alone grants it.
    #[test]
    fn a_lock_held_during_a_move_is_never_granted_twice() {
        let map = ShardMap::uniform(&[1, 2]).unwrap();
        let (a, b) = (svc(1, &map), svc(2, &map));
        let k = LockKey::compose(0, 7, 1).unwrap();
        let mut o = Vec::new();
        a.apply(&[op(k, 1, W)], &mut o);
        assert_eq!(o, [OpOutcome::Granted]);
        let now = Instant::now();
        let mut mv = Move::new(1, 2, 0..16, 1, now);
        assert_eq!(a.begin_drain(0..16).unwrap(), 1);
        let t = Duration::from_secs(3600);
        assert_eq!(mv.on_held(a.held_in(0..16), &map, now, t), MoveStep::Wait);
        let mut o = Vec::new();
        a.apply(&[op(k, 2, W)], &mut o);
        b.apply(&[op(k, 2, W)], &mut o);
        assert_eq!(o, [OpOutcome::Moving, OpOutcome::WrongShard { version: 1 }]);
        // A key outside the range is still served by the source.
        let other = LockKey::compose(0, 100, 1).unwrap();
        let mut o = Vec::new();
        a.apply(&[op(other, 2, W), op(other, 2, OpKind::Unlock)], &mut o);
        assert_eq!(o, [OpOutcome::Granted, OpOutcome::Released]);
        // The holder releases at the source (served while draining).
        let mut o = Vec::new();
        a.apply(&[op(k, 1, OpKind::Unlock)], &mut o);
        assert_eq!(o, [OpOutcome::Released]);
        let MoveStep::Transfer { map: next } = mv.on_held(a.held_in(0..16), &map, now, t) else {
            panic!("drained")
        };
        assert_eq!(b.install(&next), 2);
        assert_eq!(a.install(&next), 2);
        mv.published(2);
        let mut o = Vec::new();
        a.apply(&[op(k, 2, W)], &mut o);
        b.apply(&[op(k, 2, W)], &mut o);
        b.apply(&[op(k, 3, W)], &mut o);
        assert_eq!(
            o,
            [
                OpOutcome::WrongShard { version: 2 },
                OpOutcome::Granted,
                OpOutcome::Refused(Refusal::Conflict)
            ]
        );
    }

    #[test]
    fn unlocks_are_idempotent_and_routed() {
        let map = ShardMap::uniform(&[1, 2]).unwrap();
        let a = svc(1, &map);
        let k = LockKey::compose(0, 7, 1).unwrap();
        let far = LockKey::compose(0, 4000, 1).unwrap();
        let mut o = Vec::new();
        let v = a.apply(
            &[
                op(k, 1, W),
                op(k, 1, W),
                op(k, 1, OpKind::Unlock),
                op(k, 1, OpKind::Unlock),
                op(far, 1, OpKind::Unlock),
            ],
            &mut o,
        );
        assert_eq!(v, 1);
        assert_eq!(
            o,
            [
                OpOutcome::Granted,
                OpOutcome::Granted,
                OpOutcome::Released,
                OpOutcome::NotHeld,
                OpOutcome::WrongShard { version: 1 }
            ]
        );
    }

    const R: OpKind = OpKind::Lock(LockMode::Read);

    fn op_of(node: u32, key: LockKey, txn: u64, kind: OpKind) -> TableOp {
        TableOp {
            key,
            txn,
            node,
            kind,
        }
    }

    /// Lotus, Algorithm 1, line 15 (the spec's A.9 test 1, at the lock table): the hook
    /// runs for remote write grants only, upgrades included, and has run when `apply`
    /// returns; at that moment the lock is already held.
    #[test]
    fn the_lost_range_hook_sees_each_range_a_new_map_takes_away() {
        let map = ShardMap::uniform(&[1, 2]).unwrap();
        let a = svc(1, &map);
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let s = seen.clone();
        assert!(a.set_lost_range_hook(Arc::new(move |r| s.lock().unwrap().push(r))));
        assert!(!a.set_lost_range_hook(Arc::new(|_| {})), "one hook only");
        let mine = map.shards_of(1);
        let (lo, hi) = (mine[0], *mine.last().unwrap());
        // Two pieces of node 1's range move to node 2: two calls, before the map
        // takes effect; the same map again takes nothing more.
        let moved = map.with_move(lo..lo + 3, 2).with_move(hi - 1..hi + 1, 2);
        a.install(&moved);
        assert_eq!(*seen.lock().unwrap(), vec![lo..lo + 3, hi - 1..hi + 1]);
        a.install(&moved);
        assert_eq!(seen.lock().unwrap().len(), 2);
        // A partial map (another node's view: this node's shards unknown, NO_NODE) that
        // moves one more shard takes only that one: the unknown ones keep their owner.
        let known = std::iter::once(0..usize::from(lo) + 4).collect::<Vec<_>>();
        let partial = ShardMap::partial(2, &known, moved.version())
            .unwrap()
            .with_move(lo + 3..lo + 4, 2);
        a.install(&partial);
        assert_eq!(seen.lock().unwrap().last(), Some(&(lo + 3..lo + 4)));
        assert_eq!(seen.lock().unwrap().len(), 3);
        assert_eq!(a.map().shards_of(1).len(), mine.len() - 3 - 2 - 1);
        assert_eq!(contiguous(&[1, 2, 3, 7, 9, 10]), vec![1..4, 7..8, 9..11]);
    }

    #[test]
    fn the_grant_hook_runs_for_remote_write_grants_before_apply_returns() {
        use std::sync::atomic::AtomicUsize;
        use std::sync::Mutex;
        let map = ShardMap::uniform(&[1]).unwrap();
        let calls: Arc<Mutex<Vec<(LockKey, u32)>>> = Arc::default();
        let table = Arc::new(LockTable::with_bytes(1 << 16));
        let held_at_call = Arc::new(AtomicUsize::new(0));
        let (c, t, h) = (calls.clone(), table.clone(), held_at_call.clone());
        let a = TableService::new(table, Ownership::new(1, map)).with_grant_hook(Arc::new(
            move |k: LockKey, node| {
                let w = t.holders(k.0).iter().any(|x| x.mode == LockMode::Write);
                h.fetch_add(usize::from(w), Ordering::SeqCst);
                c.lock().unwrap().push((k, node));
            },
        ));
        let n = || calls.lock().unwrap().len();
        let (k1, k2, k3) = (
            LockKey::compose(0, 1, 1).unwrap(),
            LockKey::compose(0, 1, 2).unwrap(),
            LockKey::compose(0, 1, 3).unwrap(),
        );
        let mut o = Vec::new();
        // A local write grant: no call.
        a.apply(&[op_of(1, k1, 1, W)], &mut o);
        assert_eq!((o.as_slice(), n()), (&[OpOutcome::Granted][..], 0));
        // A remote read grant: no call.
        o.clear();
        a.apply(&[op_of(7, k2, 1, R)], &mut o);
        assert_eq!((o.as_slice(), n()), (&[OpOutcome::Granted][..], 0));
        // A remote write grant: one call, made before apply returned, lock held then.
        o.clear();
        a.apply(&[op_of(7, k3, 1, W)], &mut o);
        assert_eq!((o.as_slice(), n()), (&[OpOutcome::Granted][..], 1));
        assert_eq!(calls.lock().unwrap()[0], (k3, 7));
        assert_eq!(held_at_call.load(Ordering::SeqCst), 1);
        // A refused remote write: no call.
        o.clear();
        a.apply(&[op_of(8, k1, 2, W), op_of(8, k3, 2, W)], &mut o);
        assert_eq!(o, [OpOutcome::Refused(Refusal::Conflict); 2]);
        assert_eq!(n(), 1);
        // A refused remote upgrade (two readers): no call; the sole reader's: one.
        o.clear();
        a.apply(&[op_of(8, k2, 2, R), op_of(7, k2, 1, W)], &mut o);
        assert_eq!(
            o,
            [OpOutcome::Granted, OpOutcome::Refused(Refusal::NoUpgrade)]
        );
        assert_eq!(n(), 1);
        o.clear();
        a.apply(
            &[op_of(8, k2, 2, OpKind::Unlock), op_of(7, k2, 1, W)],
            &mut o,
        );
        assert_eq!(o, [OpOutcome::Released, OpOutcome::Granted]);
        assert_eq!(calls.lock().unwrap()[1..], [(k2, 7)]);
        assert_eq!(held_at_call.load(Ordering::SeqCst), 2);
        assert_eq!(a.table().holders(k2.0)[0].mode, LockMode::Write);
    }

    /// The spec's A.6 step 1: a survivor marks a dead node down; locks on its shards are
    /// refused at once as down (not wrong-shard), releases there are no-ops.
    #[test]
    fn locks_on_a_down_nodes_shards_are_refused_as_down() {
        let map = ShardMap::uniform(&[1, 2]).unwrap();
        let a = svc(1, &map);
        let (mine, theirs) = (
            LockKey::compose(0, 7, 1).unwrap(),
            LockKey::compose(0, 4000, 1).unwrap(),
        );
        let mut o = Vec::new();
        a.apply(&[op(theirs, 1, W)], &mut o);
        assert_eq!(o, [OpOutcome::WrongShard { version: 1 }]);
        assert!(!a.is_down(2));
        a.mark_down(2);
        assert!(a.is_down(2));
        o.clear();
        a.apply(
            &[
                op(theirs, 1, W),
                op(theirs, 1, OpKind::Lock(LockMode::Read)),
                op(theirs, 1, OpKind::Unlock),
                op(mine, 1, W),
            ],
            &mut o,
        );
        assert_eq!(
            o,
            [
                OpOutcome::Down,
                OpOutcome::Down,
                OpOutcome::NotHeld,
                OpOutcome::Granted
            ]
        );
        a.mark_up(2);
        o.clear();
        a.apply(&[op(theirs, 1, W)], &mut o);
        assert_eq!(o, [OpOutcome::WrongShard { version: 1 }]);
    }

    /// The spec's A.6 step 5: a restarted node's table refuses locks as down until the
    /// handshake sets it serving; unlocks are served meanwhile.
    #[test]
    fn a_table_not_serving_refuses_locks_as_down_until_it_serves() {
        let map = ShardMap::uniform(&[1]).unwrap();
        let a = svc(1, &map);
        assert!(a.serving(), "serving by default");
        let k = LockKey::compose(0, 7, 1).unwrap();
        let mut o = Vec::new();
        a.apply(&[op(k, 1, W)], &mut o);
        a.set_serving(false);
        assert!(!a.serving());
        a.apply(
            &[
                op(k, 2, W),
                op(k, 1, OpKind::Unlock),
                op(k, 2, OpKind::Unlock),
                op(k, 2, OpKind::Lock(LockMode::Read)),
            ],
            &mut o,
        );
        assert_eq!(
            o,
            [
                OpOutcome::Granted,
                OpOutcome::Down,
                OpOutcome::Released,
                OpOutcome::NotHeld,
                OpOutcome::Down
            ]
        );
        assert_eq!(a.table().slots_in_use(), 0);
        a.set_serving(true);
        o.clear();
        a.apply(&[op(k, 2, W)], &mut o);
        assert_eq!(o, [OpOutcome::Granted]);
    }
}
