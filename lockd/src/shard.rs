//! Lotus's lock sharding and pass-by-range resharding as plain state machines, without
//! any fabric (Lotus, 4.2 and 4.3).
//!
//! **Lock keys** (4.2, Fig. 7). A [`LockKey`] is 64 bits whose low 12 bits are the *shard
//! number*, taken from the low 12 bits of the table's *critical field* (TPC-C's warehouse
//! id, TATP's subscriber id), so records a transaction touches together land in one shard
//! and can be locked with one batched request:
//!
//! | bits   | field                                                           |
//! |--------|-----------------------------------------------------------------|
//! | 0..12  | shard: `critical_field & 0xfff`                                 |
//! | 12..56 | `rest`: 44 bits, unique within (table, shard) (the other fields) |
//! | 56..64 | `table`: the DB table id                                        |
//!
//! The paper derives the 52 high bits from all primary-key fields by an application hash;
//! here they are the table id and 44 bits the application supplies, so [`LockKey::compose`]
//! is injective and two records never share a key (a wider primary key is hashed to 44
//! bits by the caller, accepting the rare false conflict a hash brings).
//!
//! **Shard map** (4.2). [`ShardMap`] maps the [`N_SHARDS`] shards to lock-table node ids
//! and carries a version. A node serves only keys whose shard its map gives it; others
//! are refused with its current map version, and the client refetches the map and
//! retries. A node may know only its own shards ([`NO_NODE`] elsewhere); clients merge
//! the maps of the nodes they know with [`ShardMap::merge`].
//!
//! **Pass-by-range resharding** (4.3). Each interval (100 ms in Lotus) every node reports
//! its latency; a node whose latency stays above [`ReshardConfig::factor`] (1.5) times the
//! cluster average for [`ReshardConfig::intervals`] (3) consecutive intervals is
//! overloaded, and a contiguous range of its shards around its hottest one moves to the
//! coolest node ([`Resharder::observe`]). A [`Move`] passes through three states:
//!
//! 1. [`MoveState::Draining`]: the source refuses new locks on the range (releases are
//!    still served) and waits until no lock on the range is held.
//! 2. [`MoveState::Transferring`]: ownership passes to the destination. Since the range
//!    was drained, no lock state moves: Lotus's locks are ephemeral and the holders' table
//!    of the range is empty.
//! 3. [`MoveState::Published`]: the map with version + 1 is installed (destination first,
//!    then the source, then everyone).
//!
//! **Locks held during a move are never granted twice**: a held lock delays the move
//! until it is released; if the range does not drain within
//! [`ReshardConfig::drain_timeout`], the move is [`MoveState::Cancelled`] and the source
//! serves the range again, unchanged. (Lotus instead aborts the holders' transactions
//! after 10 ms; taking a lock away from a running coordinator needs the transaction
//! layer's cooperation, which a lock service alone cannot give.) The destination starts
//! serving only after the drain completed, so at no moment do two nodes grant a lock on
//! one key.

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::{Duration, Instant};

use rrpc::typed::Batch;
use serde::{Deserialize, Serialize};
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// One run of a shard map ([`crate::table_wire::TableMapRpc`], [`crate::table_wire::TableInstallRpc`]): shards
/// `start..start + len` belong to `node`, 8 bytes.
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned, Clone, Copy, Debug, PartialEq, Eq,
)]
#[repr(C)]
pub struct ShardRun {
    /// The first shard, bytes 0..2.
    pub start: U16,
    /// Shards in the run (at least 1), bytes 2..4.
    pub len: U16,
    /// Their node ([`NO_NODE`]: unknown), bytes 4..8.
    pub node: U32,
}

const _: () = assert!(std::mem::size_of::<ShardRun>() == 8);

/// A shard map on the wire: its version (`u64`, bytes 0..8), then runs covering every
/// shard in order ([`ShardMap::to_wire`], [`ShardMap::from_wire`]).
pub type MapWire = Batch<U64, ShardRun>;

/// Bits of a key that hold the shard (Lotus 4.2).
pub const SHARD_BITS: u32 = 12;
/// Number of shards (`1 << SHARD_BITS`).
pub const N_SHARDS: usize = 1 << SHARD_BITS;
/// Bits of a key that hold `rest` ([`LockKey::compose`]).
pub const REST_BITS: u32 = 44;
/// A shard no known node owns, in a map that knows only part of the cluster.
pub const NO_NODE: u32 = u32::MAX;

/// A lock key: shard in the low 12 bits (layout in the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct LockKey(pub u64);

/// Errors composing a [`LockKey`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// `rest` does not fit its 44 bits.
    #[error("rest {rest:#x} does not fit {REST_BITS} bits")]
    RestTooWide {
        /// The value given.
        rest: u64,
    },
}

impl LockKey {
    /// The key of a record of DB table `table` whose critical field is `critical` (its
    /// low 12 bits become the shard) and whose other primary-key fields are `rest`
    /// (unique within the table and shard, below `2^44`).
    ///
    /// Errors: [`KeyError::RestTooWide`].
    pub fn compose(table: u8, critical: u64, rest: u64) -> Result<Self, KeyError> {
        if rest >> REST_BITS != 0 {
            return Err(KeyError::RestTooWide { rest });
        }
        Ok(Self(
            u64::from(table) << (SHARD_BITS + REST_BITS)
                | rest << SHARD_BITS
                | (critical & (N_SHARDS as u64 - 1)),
        ))
    }

    /// The shard number (low 12 bits).
    pub fn shard(self) -> u16 {
        (self.0 & (N_SHARDS as u64 - 1)) as u16
    }

    /// The table id (high 8 bits).
    pub fn table(self) -> u8 {
        (self.0 >> (SHARD_BITS + REST_BITS)) as u8
    }

    /// The `rest` field (bits 12..56).
    pub fn rest(self) -> u64 {
        (self.0 >> SHARD_BITS) & ((1 << REST_BITS) - 1)
    }
}

/// A versioned map of the [`N_SHARDS`] shards to lock-table node ids (Lotus 4.2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardMap {
    version: u64,
    /// Owner of each shard ([`NO_NODE`]: unknown).
    owners: Vec<u32>,
}

/// Errors building a [`ShardMap`] or parsing a shard list.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MapError {
    /// No nodes to spread the shards over.
    #[error("no nodes to map shards to")]
    NoNodes,
    /// A shard range past [`N_SHARDS`] or empty.
    #[error("shard range {start}..{end} is empty or past {N_SHARDS}")]
    BadRange {
        /// First shard.
        start: usize,
        /// One past the last.
        end: usize,
    },
    /// A shard list that does not parse (`"0-2047,4000"`).
    #[error("shard list {0:?}: expected comma-separated shards or ranges a-b (inclusive)")]
    Parse(String),
    /// An encoded map of the wrong length.
    #[error("encoded shard map of {0} bytes")]
    Encoding(usize),
}

impl ShardMap {
    /// Version 1: the shards split into `nodes.len()` contiguous, near-equal ranges, in
    /// order (Lotus's initial even distribution).
    ///
    /// Errors: [`MapError::NoNodes`].
    pub fn uniform(nodes: &[u32]) -> Result<Self, MapError> {
        if nodes.is_empty() {
            return Err(MapError::NoNodes);
        }
        let owners = (0..N_SHARDS)
            .map(|s| nodes[s * nodes.len() / N_SHARDS])
            .collect();
        Ok(Self { version: 1, owners })
    }

    /// A map at `version` in which `node` owns `shards` and every other shard is
    /// [`NO_NODE`] (what a node started with `--shards` knows).
    ///
    /// Errors: [`MapError::BadRange`].
    pub fn partial(node: u32, shards: &[Range<usize>], version: u64) -> Result<Self, MapError> {
        let mut owners = vec![NO_NODE; N_SHARDS];
        for r in shards {
            if r.start >= r.end || r.end > N_SHARDS {
                return Err(MapError::BadRange {
                    start: r.start,
                    end: r.end,
                });
            }
            owners[r.clone()].iter_mut().for_each(|o| *o = node);
        }
        Ok(Self { version, owners })
    }

    /// The map version (starts at 1; +1 per published move).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The owner of `shard` ([`NO_NODE`] if unknown).
    pub fn owner(&self, shard: u16) -> u32 {
        self.owners[usize::from(shard)]
    }

    /// The node serving `key` ([`NO_NODE`] if unknown).
    pub fn node_of(&self, key: LockKey) -> u32 {
        self.owner(key.shard())
    }

    /// The shards `node` owns.
    pub fn shards_of(&self, node: u32) -> Vec<u16> {
        (0..N_SHARDS as u16)
            .filter(|&s| self.owner(s) == node)
            .collect()
    }

    /// The distinct known nodes, ascending.
    pub fn nodes(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .owners
            .iter()
            .copied()
            .filter(|&n| n != NO_NODE)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// This map with `range` given to `to` and the version + 1 (the published map of a
    /// move).
    pub fn with_move(&self, range: Range<u16>, to: u32) -> Self {
        let mut m = self.clone();
        for s in range {
            m.owners[usize::from(s)] = to;
        }
        m.version += 1;
        m
    }

    /// This map with every shard of `dead` given to the nodes of `to` in turn (sorted,
    /// shard by shard) and the version + 1: the survivors' takeover of a compute node
    /// that failed and is not restarted (Lotus 6 leaves the routing of a dead node's
    /// share open, the spec's A.6 item 7). Every survivor computes the same map from the
    /// same one. With `to` empty (or only `dead`) the map is returned unchanged.
    pub fn with_takeover(&self, dead: u32, to: &[u32]) -> Self {
        let mut heirs: Vec<u32> = to.iter().copied().filter(|&n| n != dead).collect();
        heirs.sort_unstable();
        heirs.dedup();
        if heirs.is_empty() {
            return self.clone();
        }
        let mut m = self.clone();
        for (i, o) in m.owners.iter_mut().filter(|o| **o == dead).enumerate() {
            *o = heirs[i % heirs.len()];
        }
        m.version += 1;
        m
    }

    /// Merge what two nodes know: the newer map's owners win, its [`NO_NODE`] shards are
    /// filled from the older one; the version is the newer one's.
    pub fn merge(&self, other: &Self) -> Self {
        let (new, old) = if other.version > self.version {
            (other, self)
        } else {
            (self, other)
        };
        let owners = new
            .owners
            .iter()
            .zip(&old.owners)
            .map(|(&n, &o)| if n == NO_NODE { o } else { n })
            .collect();
        Self {
            version: new.version,
            owners,
        }
    }

    /// The map on the wire ([`MapWire`]): its version, then runs of
    /// `(start: u16, len: u16, node: u32)` covering every shard in order, 8 bytes each.
    pub fn to_wire(&self) -> MapWire {
        let mut runs = Vec::new();
        let mut s = 0;
        while s < N_SHARDS {
            let n = self.owners[s];
            let mut e = s + 1;
            while e < N_SHARDS && self.owners[e] == n {
                e += 1;
            }
            runs.push(ShardRun {
                start: U16::new(s as u16),
                len: U16::new((e - s) as u16),
                node: U32::new(n),
            });
            s = e;
        }
        Batch::new(U64::new(self.version), runs)
    }

    /// The map [`Self::to_wire`] sent.
    ///
    /// Errors: [`MapError::Encoding`] (with the message's length in bytes) unless the runs
    /// cover every shard exactly once, in order.
    pub fn from_wire(w: &MapWire) -> Result<Self, MapError> {
        let bad = || MapError::Encoding(w.encoded_len());
        let mut owners = Vec::with_capacity(N_SHARDS);
        for r in &w.entries {
            let (start, len) = (usize::from(r.start.get()), usize::from(r.len.get()));
            if start != owners.len() || len == 0 || start + len > N_SHARDS {
                return Err(bad());
            }
            owners.resize(start + len, r.node.get());
        }
        if owners.len() != N_SHARDS {
            return Err(bad());
        }
        Ok(Self {
            version: w.head.get(),
            owners,
        })
    }
}

/// Where a node sends one lock operation, by its own view of the map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// This node owns the key's shard: serve.
    Serve,
    /// Another node owns it (or none known): refuse with this node's map version.
    WrongShard {
        /// The node's current map version.
        version: u64,
    },
    /// The key's shard is draining for a move: refuse new locks (try again shortly).
    Moving,
    /// The key's shard belongs to a compute node marked down (it failed, Lotus 6 and
    /// the spec's A.6 step 1), or to this node while its restarted table is not yet
    /// serving (A.6 step 5): refuse new locks at once; the transaction aborts
    /// (`cn-down`).
    Down,
}

/// A node's view of the sharding (Lotus 4.2, 4.3, 6): its id, its map, the range it is
/// draining, the nodes it knows to be down and whether its own table serves. Decides,
/// for each request, whether the node serves it.
///
/// DOWN is kept per node, not per shard: the shards DOWN are those whose owner in the
/// current map is a down node, so a map installed later (a move) cannot leave a dead
/// node's shard up or a live node's shard down.
#[derive(Clone, Debug)]
pub struct Ownership {
    me: u32,
    map: ShardMap,
    draining: Option<Range<u16>>,
    /// Compute nodes marked down (failed, their lock tables gone).
    down: std::collections::BTreeSet<u32>,
    /// Whether this node's own table serves lock requests (false after a restart until
    /// the recovery handshake finished).
    serving: bool,
}

impl Ownership {
    /// Node `me` with `map`, serving, no node down.
    pub fn new(me: u32, map: ShardMap) -> Self {
        Self {
            me,
            map,
            draining: None,
            down: Default::default(),
            serving: true,
        }
    }

    /// Mark compute node `node` down (`true`: it failed; Lotus 6, the spec's A.6 step 1)
    /// or up again (`false`: after the restart handshake, A.6 step 5). New locks on its
    /// shards are then routed [`Route::Down`]. Returns whether the state changed.
    pub fn set_down(&mut self, node: u32, down: bool) -> bool {
        if down {
            self.down.insert(node)
        } else {
            self.down.remove(&node)
        }
    }

    /// Whether compute node `node` is marked down ([`Self::set_down`]).
    pub fn is_down(&self, node: u32) -> bool {
        self.down.contains(&node)
    }

    /// The nodes marked down, ascending.
    pub fn down_nodes(&self) -> Vec<u32> {
        self.down.iter().copied().collect()
    }

    /// Let this node's own table serve lock requests (`true`, the default) or refuse
    /// them as [`Route::Down`] (`false`: a restarted node before the recovery handshake
    /// of the spec's A.6 step 5 finished).
    pub fn set_serving(&mut self, serving: bool) {
        self.serving = serving;
    }

    /// Whether this node's own table serves lock requests ([`Self::set_serving`]).
    pub fn serving(&self) -> bool {
        self.serving
    }

    /// Whether new locks on `key` are refused as [`Route::Down`]: its shard's owner is
    /// marked down, or is this node while it is not serving.
    fn is_down_key(&self, key: LockKey) -> bool {
        let owner = self.map.node_of(key);
        self.down.contains(&owner) || (owner == self.me && !self.serving)
    }

    /// This node's id.
    pub fn me(&self) -> u32 {
        self.me
    }

    /// The node's current map.
    pub fn map(&self) -> &ShardMap {
        &self.map
    }

    /// The range being drained, if any.
    pub fn draining(&self) -> Option<Range<u16>> {
        self.draining.clone()
    }

    /// Route a lock (acquire) of `key`: [`Route::Down`] first (a dead owner's shard is
    /// refused at once, not sent elsewhere), then wrong shard, then moving.
    pub fn route_lock(&self, key: LockKey) -> Route {
        if self.is_down_key(key) {
            Route::Down
        } else if self.map.node_of(key) != self.me {
            Route::WrongShard {
                version: self.map.version,
            }
        } else if self
            .draining
            .as_ref()
            .is_some_and(|r| r.contains(&key.shard()))
        {
            Route::Moving
        } else {
            Route::Serve
        }
    }

    /// Route a release of `key` that this node's table does not hold: served (as a
    /// no-op) when the node owns the shard, draining or not, else refused; a shard of a
    /// node marked down is [`Route::Down`] (also a no-op: that node's table is gone). (A
    /// release of a lock the table holds is always served, whatever the map says.)
    pub fn route_release(&self, key: LockKey) -> Route {
        if self.map.node_of(key) == self.me {
            Route::Serve
        } else if self.down.contains(&self.map.node_of(key)) {
            Route::Down
        } else {
            Route::WrongShard {
                version: self.map.version,
            }
        }
    }

    /// Start draining `range` (a move's source): new locks on it are refused.
    ///
    /// Errors: [`MapError::BadRange`] when this node does not own all of `range` or
    /// another range is draining.
    pub fn begin_drain(&mut self, range: Range<u16>) -> Result<(), MapError> {
        let bad = MapError::BadRange {
            start: usize::from(range.start),
            end: usize::from(range.end),
        };
        if range.is_empty()
            || usize::from(range.end) > N_SHARDS
            || self.draining.is_some()
            || range.clone().any(|s| self.map.owner(s) != self.me)
        {
            return Err(bad);
        }
        self.draining = Some(range);
        Ok(())
    }

    /// Stop draining (a cancelled move): the range is served again.
    pub fn cancel_drain(&mut self) {
        self.draining = None;
    }

    /// Install `map` if it is newer than the current one (merging what this node knows
    /// of shards the new map leaves unknown); a draining range this node no longer owns
    /// ends its drain. Returns whether the map changed.
    pub fn install(&mut self, map: &ShardMap) -> bool {
        if map.version <= self.map.version {
            return false;
        }
        self.map = self.map.merge(map);
        if let Some(r) = &self.draining {
            if r.clone().any(|s| self.map.owner(s) != self.me) {
                self.draining = None;
            }
        }
        true
    }
}

/// Parse a shard list: comma-separated shards or inclusive ranges (`"0-2047,4095"`).
///
/// Errors: [`MapError::Parse`], [`MapError::BadRange`].
pub fn parse_shards(s: &str) -> Result<Vec<Range<usize>>, MapError> {
    let perr = || MapError::Parse(s.to_string());
    s.split(',')
        .map(|part| {
            let part = part.trim();
            let (a, b) = part.split_once('-').unwrap_or((part, part));
            let a: usize = a.trim().parse().map_err(|_| perr())?;
            let b: usize = b.trim().parse().map_err(|_| perr())?;
            if a > b || b >= N_SHARDS {
                return Err(MapError::BadRange {
                    start: a,
                    end: b + 1,
                });
            }
            Ok(a..b + 1)
        })
        .collect()
}

/// Resharding policy (Lotus 4.3).
///
/// Non-exhaustive, so that a setting can be added without breaking the crates that embed
/// this one: outside this crate, start from [`Default::default`] and chain the `with_*`
/// setters (or assign the public fields on a `let mut` binding).
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct ReshardConfig {
    /// A node is over when its latency is strictly above `factor` x the cluster average
    /// (default 1.5).
    pub factor: f64,
    /// Consecutive intervals over before a move (default 3).
    pub intervals: u32,
    /// How long the source waits for the range to drain before the move is cancelled
    /// (default 10 ms, Lotus's proactive-abort bound).
    pub drain_timeout: Duration,
}

impl Default for ReshardConfig {
    fn default() -> Self {
        Self {
            factor: 1.5,
            intervals: 3,
            drain_timeout: Duration::from_millis(10),
        }
    }
}

impl ReshardConfig {
    /// Set [`ReshardConfig::factor`]: a node is over when its latency is strictly above
    /// `factor` x the cluster average (default 1.5).
    pub fn with_factor(mut self, factor: f64) -> Self {
        self.factor = factor;
        self
    }

    /// Set [`ReshardConfig::intervals`]: consecutive intervals over before a move (default 3).
    pub fn with_intervals(mut self, intervals: u32) -> Self {
        self.intervals = intervals;
        self
    }

    /// Set [`ReshardConfig::drain_timeout`]: how long the source waits for the range to drain
    /// before the move is cancelled (default 10 ms, Lotus's proactive-abort bound).
    pub fn with_drain_timeout(mut self, drain_timeout: Duration) -> Self {
        self.drain_timeout = drain_timeout;
        self
    }
}

/// The state of a [`Move`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoveState {
    /// The source refuses new locks on the range and waits for held ones to be released.
    Draining {
        /// When draining began.
        since: Instant,
    },
    /// Drained: ownership passes to the destination (no lock state moves).
    Transferring,
    /// The map of this version is installed.
    Published {
        /// The new map version.
        version: u64,
    },
    /// The range did not drain in time; the source serves it again, unchanged.
    Cancelled,
}

/// One pass-by-range move of a contiguous shard range (Lotus 4.3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Move {
    /// The overloaded node.
    pub from: u32,
    /// The coolest node.
    pub to: u32,
    /// The shards moved (all owned by `from`).
    pub range: Range<u16>,
    /// The map version the move starts from.
    pub base_version: u64,
    state: MoveState,
}

/// What a [`Move`] asks its driver to do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MoveStep {
    /// Still draining: ask again later how many locks the range holds.
    Wait,
    /// Drained: install `map` at the destination, then at the source, then everywhere,
    /// and call [`Move::published`].
    Transfer {
        /// The map to publish (version `base_version + 1`).
        map: ShardMap,
    },
    /// Cancelled: tell the source to serve the range again.
    Cancel,
}

impl Move {
    /// A move of `range` from `from` to `to`, draining from `now`.
    pub fn new(from: u32, to: u32, range: Range<u16>, base_version: u64, now: Instant) -> Self {
        Self {
            from,
            to,
            range,
            base_version,
            state: MoveState::Draining { since: now },
        }
    }

    /// The current state.
    pub fn state(&self) -> MoveState {
        self.state
    }

    /// Feed the number of locks the source still holds on the range at `now`. Draining
    /// with `held == 0` becomes Transferring; past `timeout` with locks still held, the
    /// move is Cancelled. Other states answer what they answered before.
    pub fn on_held(
        &mut self,
        held: usize,
        map: &ShardMap,
        now: Instant,
        timeout: Duration,
    ) -> MoveStep {
        match self.state {
            MoveState::Draining { .. } if held == 0 => {
                self.state = MoveState::Transferring;
                self.on_held(0, map, now, timeout)
            }
            MoveState::Draining { since } if now.saturating_duration_since(since) > timeout => {
                self.state = MoveState::Cancelled;
                MoveStep::Cancel
            }
            MoveState::Draining { .. } => MoveStep::Wait,
            MoveState::Transferring => MoveStep::Transfer {
                map: map.with_move(self.range.clone(), self.to),
            },
            MoveState::Published { .. } => MoveStep::Wait,
            MoveState::Cancelled => MoveStep::Cancel,
        }
    }

    /// The map of `version` is installed everywhere.
    pub fn published(&mut self, version: u64) {
        debug_assert_eq!(self.state, MoveState::Transferring);
        self.state = MoveState::Published { version };
    }
}

/// Decides pass-by-range moves from per-interval latencies (Lotus 4.3). One move at a
/// time: after a decision, [`Self::observe`] decides nothing until [`Self::finished`].
#[derive(Clone, Debug, Default)]
pub struct Resharder {
    cfg: ReshardConfig,
    /// Consecutive intervals each node has been over.
    streak: BTreeMap<u32, u32>,
    busy: bool,
}

impl Resharder {
    /// A resharder with policy `cfg`.
    pub fn new(cfg: ReshardConfig) -> Self {
        Self {
            cfg,
            ..Self::default()
        }
    }

    /// The policy.
    pub fn config(&self) -> ReshardConfig {
        self.cfg
    }

    /// Consecutive intervals `node` has been over the threshold.
    pub fn streak(&self, node: u32) -> u32 {
        self.streak.get(&node).copied().unwrap_or(0)
    }

    /// One interval: each node's mean latency (`latency_ns`, nanoseconds; nodes absent
    /// reported nothing and lose their streak) and the requests each shard received
    /// (`shard_load`, [`N_SHARDS`] counts, or empty if unknown). Returns a [`Move`]
    /// (Draining from `now`) when a node has been over for the configured number of
    /// intervals; the most loaded such node moves first.
    pub fn observe(
        &mut self,
        map: &ShardMap,
        latency_ns: &BTreeMap<u32, u64>,
        shard_load: &[u64],
        now: Instant,
    ) -> Option<Move> {
        if latency_ns.is_empty() {
            self.streak.clear();
            return None;
        }
        let avg = latency_ns.values().map(|&l| l as f64).sum::<f64>() / latency_ns.len() as f64;
        self.streak.retain(|n, _| latency_ns.contains_key(n));
        for (&n, &l) in latency_ns {
            let s = self.streak.entry(n).or_insert(0);
            if l as f64 > self.cfg.factor * avg {
                *s += 1;
            } else {
                *s = 0;
            }
        }
        if self.busy {
            return None;
        }
        let hot = latency_ns
            .iter()
            .filter(|(n, _)| self.streak(**n) >= self.cfg.intervals)
            .max_by_key(|(_, &l)| l)
            .map(|(&n, _)| n)?;
        let cool = latency_ns
            .iter()
            .filter(|(&n, _)| n != hot)
            .min_by_key(|(_, &l)| l)
            .map(|(&n, _)| n)?;
        let range = choose_range(map, hot, cool, shard_load)?;
        self.busy = true;
        Some(Move::new(hot, cool, range, map.version(), now))
    }

    /// The current move ended (published or cancelled): streaks restart from zero,
    /// since the load just changed hands (or the next attempt should wait as long).
    pub fn finished(&mut self) {
        self.busy = false;
        self.streak.clear();
    }
}

/// The range to move from `hot` to `cool`: the hot node's hottest shard, extended over
/// neighbouring shards `hot` owns (the hotter neighbour first; idle ones are left) while
/// the moved load stays within half the load difference of the two nodes, and never all
/// of `hot`'s shards.
/// `None` when `hot` owns fewer than two shards. Without load figures (`shard_load`
/// empty) the hottest shard is the hot node's first.
pub fn choose_range(map: &ShardMap, hot: u32, cool: u32, shard_load: &[u64]) -> Option<Range<u16>> {
    let load = |s: u16| shard_load.get(usize::from(s)).copied().unwrap_or(0);
    let mine = map.shards_of(hot);
    if mine.len() < 2 {
        return None;
    }
    let hot_load: u64 = mine.iter().map(|&s| load(s)).sum();
    let cool_load: u64 = map.shards_of(cool).iter().map(|&s| load(s)).sum();
    let budget = hot_load.saturating_sub(cool_load) / 2;
    // The hottest shard (first among equals).
    let h = *mine.iter().rev().max_by_key(|&&s| load(s))?;
    let (mut lo, mut hi) = (h, h + 1);
    let mut moved = load(h);
    let owned = |s: u16| map.owner(s) == hot;
    while usize::from(hi - lo) + 1 < mine.len() {
        let left = (lo > 0 && owned(lo - 1)).then(|| load(lo - 1));
        let right = (usize::from(hi) < N_SHARDS && owned(hi)).then(|| load(hi));
        let (take_left, l) = match (left, right) {
            (Some(a), Some(b)) if a >= b => (true, a),
            (_, Some(b)) => (false, b),
            (Some(a), None) => (true, a),
            (None, None) => break,
        };
        if l == 0 || moved + l > budget {
            break;
        }
        moved += l;
        if take_left {
            lo -= 1;
        } else {
            hi += 1;
        }
    }
    Some(lo..hi)
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_dead_nodes_shards_are_shared_among_the_heirs() {
        let m = ShardMap::uniform(&[1, 2, 3]).unwrap();
        let t = m.with_takeover(2, &[3, 1, 2]);
        assert_eq!(t.version(), m.version() + 1);
        assert!(t.shards_of(2).is_empty());
        let (a, b) = (t.shards_of(1).len(), t.shards_of(3).len());
        assert_eq!(a + b, N_SHARDS);
        assert!(a.abs_diff(b) <= 2, "{a} vs {b}");
        // The survivors' own shards stay theirs; every survivor computes the same map.
        assert!(m.shards_of(1).iter().all(|&s| t.owner(s) == 1));
        assert_eq!(t, m.with_takeover(2, &[1, 3]));
        assert_eq!(m.with_takeover(2, &[2]), m, "no heir: unchanged");
    }

    use super::*;

    #[test]
    fn key_layout() {
        let k = LockKey::compose(3, 0x1_2345, 0xabc).unwrap();
        assert_eq!(k.shard(), 0x345, "low 12 bits of the critical field");
        assert_eq!(k.table(), 3);
        assert_eq!(k.rest(), 0xabc);
        assert_eq!(k.0, 3 << 56 | 0xabc << 12 | 0x345);
        assert_eq!(
            LockKey::compose(0, 0, 1 << 44),
            Err(KeyError::RestTooWide { rest: 1 << 44 })
        );
        // Same rest, different table or shard: different keys.
        let a = LockKey::compose(1, 7, 9).unwrap();
        assert_ne!(a, LockKey::compose(2, 7, 9).unwrap());
        assert_ne!(a, LockKey::compose(1, 8, 9).unwrap());
        assert_eq!(
            a,
            LockKey::compose(1, 7 + 4096, 9).unwrap(),
            "only 12 bits count"
        );
    }

    #[test]
    fn uniform_map_partial_maps_merge_and_encoding() {
        let m = ShardMap::uniform(&[10, 20]).unwrap();
        assert_eq!(m.version(), 1);
        assert_eq!(m.owner(0), 10);
        assert_eq!(m.owner(2047), 10);
        assert_eq!(m.owner(2048), 20);
        assert_eq!(m.shards_of(20).len(), 2048);
        assert_eq!(m.nodes(), [10, 20]);
        assert_eq!(ShardMap::uniform(&[]), Err(MapError::NoNodes));

        let a = ShardMap::partial(1, &parse_shards("0-2047").unwrap(), 1).unwrap();
        let b = ShardMap::partial(2, &parse_shards("2048-4095").unwrap(), 1).unwrap();
        assert_eq!(a.owner(4000), NO_NODE);
        let ab = a.merge(&b);
        assert_eq!((ab.owner(5), ab.owner(4000), ab.version()), (1, 2, 1));
        let moved = ab.with_move(0..16, 2);
        assert_eq!(moved.version(), 2);
        assert_eq!(moved.owner(15), 2);
        assert_eq!(moved.owner(16), 1);
        // An old partial view never overrides a newer map.
        assert_eq!(a.merge(&moved), moved);
        assert_eq!(moved.merge(&a), moved);

        use crate::table_wire::TableInstallRpc;
        use rrpc::typed::{decode_request, encode_request};
        let mut buf = Vec::new();
        encode_request::<TableInstallRpc>(&moved.to_wire(), &mut buf).unwrap();
        assert_eq!(buf.len(), 8 + 3 * 8, "three runs");
        assert_eq!(&buf[..8], &2u64.to_le_bytes(), "the version first");
        assert_eq!(
            &buf[8..16],
            &[0, 0, 16, 0, 2, 0, 0, 0],
            "run 0..16 on node 2"
        );
        let back = |b: &[u8]| ShardMap::from_wire(&decode_request::<TableInstallRpc>(b).unwrap());
        assert_eq!(back(&buf).unwrap(), moved);
        assert_eq!(
            back(&buf[..buf.len() - 8]),
            Err(MapError::Encoding(24)),
            "shards missing"
        );
        let mut overlap = buf.clone();
        overlap[16] = 15; // the second run starts at 15, inside the first
        assert!(back(&overlap).is_err());
        assert!(decode_request::<TableInstallRpc>(&buf[..5]).is_err());
        assert_eq!(parse_shards("0-1,7").unwrap(), vec![0..2, 7..8]);
        assert!(parse_shards("5-4").is_err());
        assert!(parse_shards("4096").is_err());
        assert!(parse_shards("x").is_err());
    }

    fn lat(v: &[(u32, u64)]) -> BTreeMap<u32, u64> {
        v.iter().copied().collect()
    }

    #[test]
    fn trigger_needs_three_intervals_above_one_and_a_half() {
        let map = ShardMap::uniform(&[1, 2, 3]).unwrap();
        let now = Instant::now();
        let mut r = Resharder::new(ReshardConfig::default());
        // Average (160 + 100 + 40) / 3 = 100: 160 is 1.6x.
        let hot = lat(&[(1, 160), (2, 100), (3, 40)]);
        assert_eq!(r.observe(&map, &hot, &[], now), None);
        assert_eq!(
            r.observe(&map, &hot, &[], now),
            None,
            "two intervals are not three"
        );
        assert_eq!(r.streak(1), 2);
        let m = r
            .observe(&map, &hot, &[], now)
            .expect("third interval moves");
        assert_eq!((m.from, m.to), (1, 3), "to the coolest node");
        assert_eq!(m.base_version, 1);
        assert!(matches!(m.state(), MoveState::Draining { .. }));

        // 1.4x for three intervals (then more) never triggers.
        let mut r = Resharder::new(ReshardConfig::default());
        let warm = lat(&[(1, 140), (2, 100), (3, 60)]);
        for _ in 0..10 {
            assert_eq!(r.observe(&map, &warm, &[], now), None);
        }
        // An interval below the threshold restarts the count.
        let mut r = Resharder::new(ReshardConfig::default());
        for l in [&hot, &hot, &warm, &hot, &hot] {
            assert_eq!(r.observe(&map, l, &[], now), None);
        }
        assert!(r.observe(&map, &hot, &[], now).is_some());
        // One move at a time; streaks restart when it ends.
        assert_eq!(r.observe(&map, &hot, &[], now), None, "busy");
        r.finished();
        assert_eq!(r.streak(1), 0);
        assert_eq!(r.observe(&map, &hot, &[], now), None);
    }

    #[test]
    fn range_is_contiguous_around_the_hottest_shard_within_half_the_difference() {
        let map = ShardMap::uniform(&[1, 2]).unwrap(); // 1: 0..2048, 2: 2048..4096
        let mut load = vec![0u64; N_SHARDS];
        // Node 1's load: shard 100 hottest (50), neighbours 99 (20) and 101 (10), 102
        // (10); node 2 idle. Budget = (50+20+10+10+5) / 2 = 47: only shard 100 fits.
        load[100] = 50;
        load[99] = 20;
        load[101] = 10;
        load[102] = 10;
        load[500] = 5;
        assert_eq!(choose_range(&map, 1, 2, &load), Some(100..101));
        // A flatter load: 100 (30), then the hotter neighbour 99 (20) is taken before
        // 101: budget (30+20+10+10+5+25)/2 = 50: 100, then 99 (50); 101 would be 60.
        load[100] = 30;
        load[1000] = 25;
        assert_eq!(choose_range(&map, 1, 2, &load), Some(99..101));
        // Never the whole of the hot node's shards; a one-shard node moves nothing.
        let two = ShardMap::partial(1, &parse_shards("0-1").unwrap(), 1)
            .unwrap()
            .merge(&ShardMap::partial(2, &parse_shards("2-4095").unwrap(), 1).unwrap());
        let mut big = vec![0u64; N_SHARDS];
        big[0] = 1000;
        big[1] = 1000;
        assert_eq!(choose_range(&two, 1, 2, &big), Some(0..1));
        let one = two.with_move(0..1, 2);
        assert_eq!(choose_range(&one, 1, 2, &big), None);
        // Without load figures: the hot node's first shard.
        assert_eq!(choose_range(&map, 2, 1, &[]), Some(2048..2049));
    }

    #[test]
    fn move_states_drain_transfer_publish_or_cancel() {
        let map = ShardMap::uniform(&[1, 2]).unwrap();
        let t0 = Instant::now();
        let to = Duration::from_millis(10);
        let mut m = Move::new(1, 2, 0..4, 1, t0);
        // Locks held: the move waits (the source keeps refusing new ones meanwhile).
        assert_eq!(m.on_held(2, &map, t0, to), MoveStep::Wait);
        assert_eq!(
            m.on_held(1, &map, t0 + Duration::from_millis(5), to),
            MoveStep::Wait
        );
        assert!(matches!(m.state(), MoveState::Draining { .. }));
        // Drained: transfer with the next version.
        let step = m.on_held(0, &map, t0 + Duration::from_millis(6), to);
        let MoveStep::Transfer { map: next } = step else {
            panic!("{step:?}")
        };
        assert_eq!(m.state(), MoveState::Transferring);
        assert_eq!(next.version(), 2);
        assert_eq!(next.owner(3), 2);
        assert_eq!(next.owner(4), 1);
        m.published(next.version());
        assert_eq!(m.state(), MoveState::Published { version: 2 });

        // A lock held past the drain timeout cancels the move: never granted twice.
        let mut m = Move::new(1, 2, 0..4, 1, t0);
        assert_eq!(m.on_held(1, &map, t0 + to, to), MoveStep::Wait);
        assert_eq!(
            m.on_held(1, &map, t0 + to + Duration::from_millis(1), to),
            MoveStep::Cancel
        );
        assert_eq!(m.state(), MoveState::Cancelled);
        assert_eq!(
            m.on_held(0, &map, t0, to),
            MoveStep::Cancel,
            "stays cancelled"
        );
    }

    #[test]
    fn keys_outside_a_nodes_shards_are_refused_with_the_current_version() {
        let map = ShardMap::uniform(&[1, 2]).unwrap();
        let mut o = Ownership::new(1, map.clone());
        let mine = LockKey::compose(0, 5, 1).unwrap();
        let theirs = LockKey::compose(0, 3000, 1).unwrap();
        assert_eq!(o.route_lock(mine), Route::Serve);
        assert_eq!(o.route_lock(theirs), Route::WrongShard { version: 1 });
        assert_eq!(o.route_release(theirs), Route::WrongShard { version: 1 });
        // Draining shard 5: locks refused as moving, releases still served.
        assert!(o.begin_drain(4..6).is_ok());
        assert_eq!(o.route_lock(mine), Route::Moving);
        assert_eq!(o.route_release(mine), Route::Serve);
        assert!(o.begin_drain(0..1).is_err(), "one drain at a time");
        o.cancel_drain();
        assert!(o.begin_drain(2040..2050).is_err(), "2048.. is not ours");
        // Publish: the shard is gone, refused with version 2; an old map is ignored.
        o.begin_drain(4..6).unwrap();
        assert!(o.install(&map.with_move(4..6, 2)));
        assert_eq!(o.draining(), None);
        assert_eq!(o.route_lock(mine), Route::WrongShard { version: 2 });
        assert!(!o.install(&map));
        assert_eq!(o.map().version(), 2);
    }

    #[test]
    fn shards_of_a_node_marked_down_and_of_a_table_not_serving_are_down() {
        let map = ShardMap::uniform(&[1, 2, 3]).unwrap();
        let mut o = Ownership::new(1, map.clone());
        let mine = LockKey::compose(0, 5, 1).unwrap();
        let of2 = LockKey::compose(0, 2000, 1).unwrap();
        let of3 = LockKey::compose(0, 4000, 1).unwrap();
        assert_eq!((map.node_of(of2), map.node_of(of3)), (2, 3));
        assert!(o.set_down(2, true));
        assert!(!o.set_down(2, true), "already down");
        assert!(o.is_down(2) && !o.is_down(3));
        assert_eq!(o.down_nodes(), [2]);
        assert_eq!(o.route_lock(of2), Route::Down, "not sent elsewhere");
        assert_eq!(o.route_release(of2), Route::Down);
        assert_eq!(o.route_lock(of3), Route::WrongShard { version: 1 });
        assert_eq!(o.route_lock(mine), Route::Serve);
        // A restarted node's own table before the handshake: down for locks only.
        assert!(o.serving());
        o.set_serving(false);
        assert_eq!(o.route_lock(mine), Route::Down);
        assert_eq!(o.route_release(mine), Route::Serve);
        o.set_serving(true);
        assert_eq!(o.route_lock(mine), Route::Serve);
        // DOWN follows the map: node 2's shards moved to node 3 are up.
        let moved = map.with_move(1366..2731, 3);
        assert!(o.install(&moved));
        assert_eq!(o.route_lock(of2), Route::WrongShard { version: 2 });
        assert!(o.set_down(2, false));
        assert!(o.down_nodes().is_empty());
    }
}
