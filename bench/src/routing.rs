//! Lotus's hybrid routing in `txn-bench` (`--routing`, Lotus 4.3, "Two-Level Load
//! Balancing"): a read-write transaction runs on the compute node that owns the lock
//! shard of its first record, so that its locks on that record's shard (in Lotus's
//! workloads, every lock of most transactions: the shard comes from the critical field)
//! are CPU CASes on the local lock table instead of RPCs; a read-only transaction takes
//! no lock and runs anywhere.
//!
//! - `none`: a transaction runs where it was drawn (the ablation's "+Lock Sharding"
//!   row without load balancing).
//! - `ideal`: each coordinator draws its read-write transactions conditioned on a first
//!   record this compute node owns (rejection sampling on the workload's own
//!   distribution; TPC-C coordinators take home warehouses among the owned ones). No
//!   hop is paid, and each compute node gets an equal share of the work whatever the
//!   skew: an upper bound on what forwarding can give, labelled as such in the header.
//! - `forward`: a read-write transaction drawn on another node's shard is sent there and
//!   run by that node ([`crate::forward`]): the hop is paid.

use std::sync::Arc;

use lockd::shard::ShardMap;
use txn::lotus::{LockKeyFn, LotusSite};

/// The `--routing` flag.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Routing {
    /// A transaction runs where it was drawn.
    #[default]
    None,
    /// Read-write transactions drawn on this compute node's own shards (no hop).
    Ideal,
    /// Read-write transactions sent to the compute node owning their first record's
    /// shard, which runs them ([`crate::forward`]).
    Forward,
}

impl Routing {
    /// The flag's spelling.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Ideal => "ideal",
            Self::Forward => "forward",
        }
    }
}

/// How many draws a coordinator makes for one transaction under `ideal` before it runs
/// the last one wherever its shard is (a compute node that owns almost nothing of the
/// distribution's mass; counted as a miss).
pub const MAX_REDRAWS: u32 = 1000;

/// Which records this compute node owns the lock shard of: its node id, the shard map
/// and the workload's lock-key function, as its Lotus site has them.
pub struct Route {
    node: u32,
    map: ShardMap,
    lock_key: LockKeyFn,
}

impl Route {
    /// The route of the compute node `site` belongs to (its shard map as of now: a map
    /// installed later by a takeover or a resharding is not followed).
    pub fn from_site(site: &LotusSite) -> Self {
        Self {
            node: site.node,
            map: site.map.clone(),
            lock_key: site.lock_key.clone(),
        }
    }

    /// A route of node `node` over `map` with `lock_key` (tests).
    pub fn new(node: u32, map: ShardMap, lock_key: LockKeyFn) -> Self {
        Self {
            node,
            map,
            lock_key,
        }
    }

    /// Whether `(table, key)`'s lock shard is this compute node's. A static record (no
    /// lock key, TPC-C's ITEM) counts as local: it takes no lock anywhere.
    pub fn is_local(&self, table: u32, key: u64) -> bool {
        match (self.lock_key)(table, key) {
            None => true,
            Some(k) => self.map.node_of(k) == self.node,
        }
    }

    /// This compute node's id.
    pub fn node(&self) -> u32 {
        self.node
    }

    /// The compute node owning `(table, key)`'s lock shard; `None` for a static record
    /// (no lock key: any node runs it).
    pub fn owner(&self, table: u32, key: u64) -> Option<u32> {
        (self.lock_key)(table, key).map(|k| self.map.node_of(k))
    }

    /// TPC-C: the warehouses `1..=warehouses` whose lock shard (that of `table`'s row
    /// `w`) this node owns, for its coordinators' home warehouses.
    pub fn local_warehouses(&self, table: u32, warehouses: u16) -> Vec<u16> {
        (1..=warehouses)
            .filter(|&w| self.is_local(table, u64::from(w)))
            .collect()
    }
}

/// What a coordinator thread's routing did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RouteCounts {
    /// Draws thrown away because the first record's shard was another node's.
    pub redraws: u64,
    /// Transactions run after [`MAX_REDRAWS`] draws found none local.
    pub misses: u64,
}

/// Draw with `draw` until `first_record` of the result is `None` (read-only) or local to
/// `route` (at most [`MAX_REDRAWS`] draws); counts into `counts`.
pub fn draw_routed<T>(
    route: &Route,
    counts: &mut RouteCounts,
    mut draw: impl FnMut() -> T,
    first_record: impl Fn(&T) -> Option<(u32, u64)>,
) -> T {
    let mut t = draw();
    for _ in 1..MAX_REDRAWS {
        match first_record(&t) {
            Some((table, key)) if !route.is_local(table, key) => {
                counts.redraws += 1;
                t = draw();
            }
            _ => return t,
        }
    }
    if first_record(&t).is_some_and(|(table, key)| !route.is_local(table, key)) {
        counts.misses += 1;
    }
    t
}

/// A shared route, as coroutines hold it.
pub type SharedRoute = Arc<Route>;

#[cfg(test)]
mod tests {
    use super::*;

    fn route(node: u32) -> Route {
        let map = ShardMap::uniform(&[1, 2]).unwrap();
        let lock_key: LockKeyFn = Arc::new(|t, k| Some(txn::lotus::critical_lock_key(t, k, k)));
        Route::new(node, map, lock_key)
    }

    #[test]
    fn ideal_draws_keep_only_local_first_records() {
        let (r1, r2) = (route(1), route(2));
        // Keys split between the two nodes, both non-empty.
        let local1: Vec<u64> = (0..200).filter(|&k| r1.is_local(0, k)).collect();
        let local2: Vec<u64> = (0..200).filter(|&k| r2.is_local(0, k)).collect();
        assert!(!local1.is_empty() && !local2.is_empty());
        assert_eq!(local1.len() + local2.len(), 200);
        let mut next = 0u64;
        let mut counts = RouteCounts::default();
        for _ in 0..100 {
            let k = draw_routed(
                &r1,
                &mut counts,
                || {
                    next += 1;
                    next % 200
                },
                |&k| Some((0, k)),
            );
            assert!(r1.is_local(0, k), "key {k} is node 2's");
        }
        assert!(counts.redraws > 0 && counts.misses == 0, "{counts:?}");
        // Read-only transactions (no first record) are taken as drawn.
        let mut c = RouteCounts::default();
        let k = draw_routed(&r1, &mut c, || local2[0], |_| None);
        assert_eq!((k, c), (local2[0], RouteCounts::default()));
        // A node that owns nothing of what is drawn runs the last draw, counted.
        let mut c = RouteCounts::default();
        let k = draw_routed(&r1, &mut c, || local2[0], |&k| Some((0, k)));
        assert_eq!(k, local2[0]);
        assert_eq!((c.redraws, c.misses), (u64::from(MAX_REDRAWS) - 1, 1));
    }

    #[test]
    fn routing_flags_are_checked() {
        use clap::Parser;
        let refusal = |a: &[&str]| {
            let args = crate::txn_args::Args::parse_from(
                std::iter::once("txn-bench").chain(a.iter().copied()),
            );
            format!("{:#}", args.validate().expect_err("refused"))
        };
        assert!(refusal(&["--routing", "ideal"]).contains("needs --cnodes 2 or more"));
        let e = refusal(&[
            "--protocol",
            "lotus",
            "--cnodes",
            "2",
            "--routing",
            "forward",
            "--kill-cn-after",
            "1",
        ]);
        assert!(e.contains("does not combine with fault injection"), "{e}");
        let ok = crate::txn_args::Args::parse_from([
            "txn-bench",
            "--protocol",
            "lotus",
            "--cnodes",
            "2",
            "--routing",
            "forward",
        ]);
        ok.validate().unwrap();
    }

    #[test]
    fn static_records_are_local_everywhere() {
        let lock_key: LockKeyFn =
            Arc::new(|t, k| (t != 9).then(|| txn::lotus::hashed_lock_key(t, k)));
        let r = Route::new(2, ShardMap::uniform(&[1, 2]).unwrap(), lock_key);
        assert!((0..50).all(|k| r.is_local(9, k)));
        assert!((0..50).any(|k| !r.is_local(0, k)));
        let w = r.local_warehouses(0, 20);
        assert!(!w.is_empty() && w.len() < 20, "{w:?}");
    }
}
