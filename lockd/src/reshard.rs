//! The periodic resharding loop of Lotus 4.3:
//! each node measures its lock latency and the requests each shard received over an
//! interval (100 ms in Lotus); a node whose latency stays above 1.5x the cluster average
//! for three consecutive intervals passes a range around its hottest shard to the node
//! with the lowest latency (drain, transfer, publish map: [`crate::shard::Move`]).
//!
//! Three parts, from the pure core to the edge:
//!
//! - [`LoadMeter`] ([`crate::load`], one layer down, where the table service that feeds
//!   it finds it too): a node's counters for the current interval (lock operations, the
//!   latency they took, requests per shard), fed by
//!   [`crate::table_service::TableService`] for every batch it serves and by the node's
//!   own coordinators in the embedded placement ([`LoadMeter::record_latency`]: Lotus
//!   measures a compute node's transaction latency, which a busy lock service slows
//!   down); [`LoadMeter::take`] ends the interval with a [`LoadSample`];
//! - [`Planner`]: the decision as a plain state machine: one [`LoadSample`] per node and
//!   the current map in, a [`Move`] out ([`crate::shard::Resharder`] underneath); tested
//!   without a fabric;
//! - [`run_loop`]: the edge, a coroutine that fetches every node's sample over
//!   [`TABLE_STATS_HANDLER`] each interval, asks the planner, and drives a decided move
//!   with [`crate::table_service::run_move`].
//!
//! A node's latency is the mean over the interval of what was recorded: the time each
//! served batch took per operation, and any latency its coordinators reported. A node
//! that served nothing and heard of no latency reports none and counts as idle (latency
//! zero), the coolest candidate to receive a range.

use rrpc::NodeId;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rrpc::runtime::{join_all, ThreadCtx};

use crate::shard::{Move, MoveState, ReshardConfig, Resharder, ShardMap, N_SHARDS};
use crate::table_service::{fetch_map, run_move, TableError};

pub use crate::load::{LoadMeter, LoadSample, SampleError, TableStatsRpc, TABLE_STATS_HANDLER};
use rrpc::typed::TypedCallError;

/// The resharding decision over intervals (Lotus 4.3), without any fabric: feed one
/// [`LoadSample`] per node per interval, get a [`Move`] when a node has been over
/// [`ReshardConfig::factor`] x the average for [`ReshardConfig::intervals`] intervals.
#[derive(Clone, Debug, Default)]
pub struct Planner {
    resharder: Resharder,
}

impl Planner {
    /// A planner with policy `cfg`.
    pub fn new(cfg: ReshardConfig) -> Self {
        Self {
            resharder: Resharder::new(cfg),
        }
    }

    /// The underlying resharder (its streaks).
    pub fn resharder(&self) -> &Resharder {
        &self.resharder
    }

    /// One interval. `samples` holds each node's sample (a node missing from it did not
    /// answer and is left out of this interval). Latency per node is its mean, zero for
    /// a node with no observations (idle); shard loads are taken from each shard's
    /// owner in `map`. Returns the move to make, if any (one at a time: call
    /// [`Self::finished`] when it ends).
    pub fn on_interval(
        &mut self,
        map: &ShardMap,
        samples: &BTreeMap<u32, LoadSample>,
        now: Instant,
    ) -> Option<Move> {
        let latency: BTreeMap<u32, u64> = samples
            .iter()
            .map(|(&n, s)| (n, s.mean_latency_ns().unwrap_or(0)))
            .collect();
        let mut load = vec![0u64; N_SHARDS];
        for (s, l) in load.iter_mut().enumerate() {
            if let Some(smp) = samples.get(&map.owner(s as u16)) {
                *l = smp.shard_load.get(s).copied().unwrap_or(0);
            }
        }
        self.resharder.observe(map, &latency, &load, now)
    }

    /// The current move ended (published or cancelled).
    pub fn finished(&mut self) {
        self.resharder.finished();
    }
}

/// Settings of [`run_loop`].
///
/// Non-exhaustive, so that a setting can be added without breaking the crates that embed
/// this one: outside this crate, start from [`Default::default`] and chain the `with_*`
/// setters (or assign the public fields on a `let mut` binding).
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct LoopConfig {
    /// The decision policy (factor 1.5, 3 intervals, drain timeout).
    pub policy: ReshardConfig,
    /// Length of an interval (default 100 ms, Lotus's).
    pub interval: Duration,
    /// How often a move's drain is polled (default 1 ms).
    pub drain_poll: Duration,
}

impl Default for LoopConfig {
    fn default() -> Self {
        Self {
            policy: ReshardConfig::default(),
            interval: Duration::from_millis(100),
            drain_poll: Duration::from_millis(1),
        }
    }
}

impl LoopConfig {
    /// Set [`LoopConfig::policy`]: the decision policy (factor 1.5, 3 intervals, drain
    /// timeout).
    pub fn with_policy(mut self, policy: ReshardConfig) -> Self {
        self.policy = policy;
        self
    }

    /// Set [`LoopConfig::interval`]: length of an interval (default 100 ms, Lotus's).
    pub fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Set [`LoopConfig::drain_poll`]: how often a move's drain is polled (default 1 ms).
    pub fn with_drain_poll(mut self, drain_poll: Duration) -> Self {
        self.drain_poll = drain_poll;
        self
    }
}

/// What one move of [`run_loop`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoveReport {
    /// The overloaded node.
    pub from: u32,
    /// The node that received the range.
    pub to: u32,
    /// The shards.
    pub range: std::ops::Range<u16>,
    /// How it ended ([`MoveState::Published`] or [`MoveState::Cancelled`]).
    pub state: MoveState,
}

/// The resharding loop (the edge of [`Planner`]): every `cfg.interval`, fetch the load
/// sample of each of `nodes` (all lock-table nodes, connected on `ctx` with
/// `connect_rpc`) over [`TABLE_STATS_HANDLER`], and the current map from the first that
/// answers; when the planner decides a move, drive it with
/// [`crate::table_service::run_move`] (the other nodes get the new map too), report it
/// to `on_move`, and go on. Returns once `stop()` is true at an interval's end.
///
/// A node that does not answer is left out of that interval (its streak restarts).
///
/// Errors: [`TableError`] from a move that failed midway (a node refused to drain or to
/// install the map); the loop stops then, as the map may be half published.
pub async fn run_loop(
    ctx: &ThreadCtx,
    nodes: &[NodeId],
    cfg: LoopConfig,
    stop: &dyn Fn() -> bool,
    on_move: &mut dyn FnMut(&MoveReport),
) -> Result<(), TableError> {
    let mut planner = Planner::new(cfg.policy);
    while !stop() {
        ctx.sleep(cfg.interval).await;
        let answers = join_all(nodes.iter().map(|&n| async move {
            let r = ctx.call_typed::<TableStatsRpc>(n, &()).await;
            (n.get(), r)
        }))
        .await;
        let mut samples = BTreeMap::new();
        for (n, r) in answers {
            match r.map(|w| LoadSample::from_wire(&w)) {
                Ok(Ok(s)) => {
                    samples.insert(n, s);
                }
                Ok(Err(e)) => tracing::warn!(node = n, error = %e, "resharding: bad load sample"),
                Err(e @ TypedCallError::Decode(_)) => {
                    tracing::warn!(node = n, error = %e, "resharding: bad load sample")
                }
                Err(e) => tracing::warn!(node = n, error = %e, "resharding: no load sample"),
            }
        }
        let Some(&first) = samples.keys().next() else {
            continue;
        };
        let map = match fetch_map(ctx, first).await {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(node = first, error = %e, "resharding: no map");
                continue;
            }
        };
        // Nodes know only their own shards; merge what each says.
        let mut merged = map;
        for &n in samples.keys().skip(1) {
            if let Ok(m) = fetch_map(ctx, n).await {
                merged = merged.merge(&m);
            }
        }
        let Some(mut mv) = planner.on_interval(&merged, &samples, Instant::now()) else {
            continue;
        };
        tracing::info!(from = mv.from, to = mv.to, range = ?mv.range, "resharding: moving");
        let others: Vec<u32> = nodes
            .iter()
            .map(|n| n.get())
            .filter(|&n| n != mv.from && n != mv.to)
            .collect();
        let state = run_move(
            ctx,
            &mut mv,
            &others,
            cfg.drain_poll,
            cfg.policy.drain_timeout,
        )
        .await;
        planner.finished();
        let state = state?;
        on_move(&MoveReport {
            from: mv.from,
            to: mv.to,
            range: mv.range.clone(),
            state,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(latency_ns: u64, hot: &[(u16, u64)]) -> LoadSample {
        crate::load::test_sample(latency_ns, hot)
    }

    /// Lotus 4.3: above 1.5x the average for three consecutive intervals, and only then,
    /// the overloaded node passes its hottest shard to the node with the lowest latency.
    #[test]
    fn three_intervals_over_move_the_hottest_shard_to_the_coolest_node() {
        let map = ShardMap::uniform(&[1, 2, 3]).unwrap();
        let t = Instant::now();
        let mut p = Planner::new(ReshardConfig::default());
        // Node 1: 300 us with shard 10 hot; nodes 2 and 3: 100 us and 50 us.
        // Average 150 us; 300 > 1.5 x 150 = 225.
        let over = |l1| {
            BTreeMap::from([
                (1, sample(l1, &[(10, 900), (11, 50), (500, 40)])),
                (2, sample(100, &[(2000, 10)])),
                (3, sample(50, &[(3000, 10)])),
            ])
        };
        assert_eq!(p.on_interval(&map, &over(300), t), None);
        assert_eq!(p.on_interval(&map, &over(300), t), None);
        assert_eq!(p.resharder().streak(1), 2);
        // An interval under the threshold: (112 + 100 + 50) / 3 = 87.3, 1.5x = 131.
        assert_eq!(p.on_interval(&map, &over(112), t), None);
        assert_eq!(
            p.resharder().streak(1),
            0,
            "a normal interval restarts the count"
        );
        assert_eq!(p.on_interval(&map, &over(300), t), None);
        assert_eq!(p.on_interval(&map, &over(300), t), None);
        let mv = p
            .on_interval(&map, &over(300), t)
            .expect("third interval over");
        assert_eq!((mv.from, mv.to), (1, 3), "to the lowest latency");
        assert_eq!(
            mv.range,
            10..11,
            "the hottest shard (half the difference fits it)"
        );
        assert_eq!(mv.base_version, map.version());
        // One move at a time.
        assert_eq!(p.on_interval(&map, &over(300), t), None);
        p.finished();
        assert_eq!(p.resharder().streak(1), 0);
    }

    #[test]
    fn idle_and_silent_nodes() {
        let map = ShardMap::uniform(&[1, 2]).unwrap();
        let t = Instant::now();
        let mut p = Planner::new(ReshardConfig::default());
        // All idle: nothing is over.
        let idle = BTreeMap::from([(1, LoadSample::default()), (2, LoadSample::default())]);
        for _ in 0..5 {
            assert_eq!(p.on_interval(&map, &idle, t), None);
        }
        // Node 1 busy, node 2 idle (latency 0): node 1 is over (any latency > 1.5 x
        // half of it), and after three intervals passes to node 2.
        let busy = BTreeMap::from([
            (1, sample(80, &[(7, 100), (8, 60)])),
            (2, LoadSample::default()),
        ]);
        assert_eq!(p.on_interval(&map, &busy, t), None);
        // Node 2 silent for an interval: left out, node 1 alone is never over its own
        // average, so its streak restarts.
        let alone = BTreeMap::from([(1, sample(80, &[(7, 100)]))]);
        assert_eq!(p.on_interval(&map, &alone, t), None);
        assert_eq!(p.resharder().streak(1), 0);
        for _ in 0..2 {
            assert_eq!(p.on_interval(&map, &busy, t), None);
        }
        let mv = p.on_interval(&map, &busy, t).unwrap();
        assert_eq!((mv.from, mv.to, mv.range), (1, 2, 7..8));
    }

    #[test]
    fn shard_loads_come_from_each_shards_owner() {
        // Node 2 reports load on shard 5, which node 1 owns: ignored (a stale count
        // from before a move), so node 1's hottest shard is its own shard 6.
        let map = ShardMap::uniform(&[1, 2]).unwrap();
        let t = Instant::now();
        let mut p = Planner::new(ReshardConfig {
            intervals: 1,
            ..ReshardConfig::default()
        });
        let s = BTreeMap::from([
            (1, sample(500, &[(6, 10), (9, 2)])),
            (2, sample(10, &[(5, 1000)])),
        ]);
        let mv = p.on_interval(&map, &s, t).unwrap();
        assert_eq!(mv.range, 6..7);
    }
}
