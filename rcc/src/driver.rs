//! Running transactions on a coordinator until a deadline, retrying aborted attempts,
//! and what a run measured; then the checks of the final database (RCC's runs, 5.1,
//! with this project's checks: the workload's own, locks-zero, serializability).

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use txn::history::History;

use crate::coord::{lock_of, Abort, Coord, Stats};
use crate::layout::Layout;
use crate::net::Net;
use crate::workload::Workload;

/// Width of the intervals commits are counted in (the liveness check: every protocol commits in every interval).
pub const INTERVAL: Duration = Duration::from_millis(100);

/// When a coordinator stops.
#[derive(Clone, Copy, Debug)]
pub struct Limit {
    /// No transaction starts after this.
    pub until: Instant,
    /// Stop after this many committed transactions, if set.
    pub txns: Option<u64>,
    /// When the run started (for the per-interval counts).
    pub start: Instant,
}

/// What one or more coordinators measured.
#[derive(Clone, Debug)]
pub struct Report {
    /// Committed transactions.
    pub commits: u64,
    /// Aborted attempts that were retried (conflicts and failed validations).
    pub aborts: u64,
    /// Transactions their own logic aborted (final).
    pub user_aborts: u64,
    /// Latency of committed transactions, retries included, nanoseconds (1 ns to 600 s).
    pub latency: Histogram<u64>,
    /// The committed transactions, for the serializability check.
    pub history: History,
    /// Sum of the committed transactions' effects (money, updates).
    pub delta: i64,
    /// Network counters.
    pub stats: Stats,
    /// Commits per [`INTERVAL`] since the start.
    pub per_interval: Vec<u64>,
    /// The first network error, which stopped the coordinator.
    pub error: Option<String>,
    /// Transactions committed during the warm-up ([`drive_after`]): in `history` and
    /// `delta` (checked) but not in `commits` (reported).
    pub warmup_commits: u64,
}

impl Report {
    /// An empty report whose history keeps up to `history_bytes`.
    pub fn new(history_bytes: usize) -> Self {
        Self {
            commits: 0,
            aborts: 0,
            user_aborts: 0,
            latency: Histogram::new_with_bounds(1, 600_000_000_000, 3).expect("valid bounds"),
            history: History::new(history_bytes),
            delta: 0,
            stats: Stats::default(),
            per_interval: Vec::new(),
            error: None,
            warmup_commits: 0,
        }
    }

    /// Fold `o` into this report.
    pub fn merge(&mut self, o: Report) {
        self.commits += o.commits;
        self.aborts += o.aborts;
        self.user_aborts += o.user_aborts;
        self.latency.add(&o.latency).expect("same bounds");
        self.history.append(o.history);
        self.delta += o.delta;
        self.stats.add(&o.stats);
        if self.per_interval.len() < o.per_interval.len() {
            self.per_interval.resize(o.per_interval.len(), 0);
        }
        for (a, b) in self.per_interval.iter_mut().zip(&o.per_interval) {
            *a += b;
        }
        if self.error.is_none() {
            self.error = o.error;
        }
        self.warmup_commits += o.warmup_commits;
    }

    /// The warm-up's end: restart what is reported (commits, aborts, latencies,
    /// per-interval counts) and keep what the checks need (the history, the delta),
    /// counting the warm-up's commits in [`Self::warmup_commits`].
    pub(crate) fn restart_window(&mut self) {
        self.warmup_commits += self.commits;
        self.commits = 0;
        self.aborts = 0;
        self.user_aborts = 0;
        self.latency.reset();
        self.per_interval.clear();
    }

    /// Abort rate: retried attempts over all attempts.
    pub fn abort_rate(&self) -> f64 {
        let all = self.aborts + self.commits + self.user_aborts;
        if all == 0 {
            0.0
        } else {
            self.aborts as f64 / all as f64
        }
    }
}

/// Run transactions of `wl` on `c` until `limit`, each retried until it commits or its
/// logic aborts it; `seed` seeds the generator.
pub async fn drive<N: Net>(
    c: &Coord<N>,
    wl: &dyn Workload,
    seed: u64,
    limit: Limit,
    history_bytes: usize,
) -> Report {
    drive_after(c, wl, seed, limit, Duration::ZERO, history_bytes).await
}

/// [`drive`], with the first `warmup` after `limit.start` not reported: when a
/// transaction ends (commits or aborts) past `limit.start + warmup` for the first
/// time, the report's counters, latencies and per-interval counts (from then on,
/// counted from that boundary) restart and the coordinator's network counters are
/// snapshot, the report's [`Stats`] being the difference at the end; the history and
/// the delta cover the whole run. A transaction in flight at the boundary counts in
/// the window it ends in. A run that ends before the boundary reports nothing.
pub async fn drive_after<N: Net>(
    c: &Coord<N>,
    wl: &dyn Workload,
    seed: u64,
    limit: Limit,
    warmup: Duration,
    history_bytes: usize,
) -> Report {
    let mut rep = Report::new(history_bytes);
    let mut rng = SmallRng::seed_from_u64(seed);
    let boundary = limit.start + warmup;
    // The network counters at the boundary, once passed (at once without a warm-up).
    let mut base = warmup.is_zero().then(Stats::default);
    let cross = |rep: &mut Report, base: &mut Option<Stats>| {
        if base.is_none() && Instant::now() >= boundary {
            rep.restart_window();
            *base = Some(c.stats());
        }
    };
    'txns: while Instant::now() < limit.until && !c.stop.get() {
        if limit.txns.is_some_and(|n| rep.commits >= n) {
            break;
        }
        let delta = Rc::new(Cell::new(0i64));
        let t = wl.next(&mut rng, delta.clone());
        let t0 = Instant::now();
        let mut retry = false;
        let mut aborts = 0u32;
        loop {
            if let Err(e) = c.start(retry).await {
                rep.error = Some(e.to_string());
                c.stop.set(true);
                break 'txns;
            }
            let r = c.run(&t).await;
            cross(&mut rep, &mut base);
            match r {
                Ok(acc) => {
                    rep.commits += 1;
                    rep.history.record(t.kind, &acc);
                    rep.delta += delta.get();
                    let now = Instant::now();
                    rep.latency
                        .saturating_record((now - t0).as_nanos().max(1) as u64);
                    let i = (now.saturating_duration_since(boundary).as_nanos()
                        / INTERVAL.as_nanos()) as usize;
                    if rep.per_interval.len() <= i {
                        rep.per_interval.resize(i + 1, 0);
                    }
                    rep.per_interval[i] += 1;
                    break;
                }
                Err(Abort::User) => {
                    rep.user_aborts += 1;
                    break;
                }
                Err(Abort::Stopped) => break 'txns,
                Err(e @ (Abort::Net(_) | Abort::Unsupported(_))) => {
                    rep.error = Some(e.to_string());
                    c.stop.set(true);
                    break 'txns;
                }
                Err(Abort::Conflict | Abort::Validation) => {
                    rep.aborts += 1;
                    retry = true;
                    if c.stop.get() || Instant::now() >= limit.until + Duration::from_secs(5) {
                        break 'txns;
                    }
                    // Back off by a random number of turns, doubling the range per
                    // consecutive abort (up to 64), so that symmetric conflicts do not
                    // repeat in lockstep.
                    aborts += 1;
                    for _ in 0..rng.random_range(1..=1u32 << aborts.min(6)) {
                        c.net.yield_now().await;
                    }
                }
            }
        }
    }
    if base.is_none() {
        // Ended during the warm-up: an empty measured window.
        rep.restart_window();
    }
    rep.stats = c.stats().since(&base.unwrap_or_else(|| c.stats()));
    rep
}

/// Check the final database: no lock left held, the workload's own check, and the
/// serializability of the committed history (Adya's DSG). `tuple(node, off, len)` reads
/// a tuple directly. Returns one line per check. Errors: the first check that fails.
pub fn audit(
    layout: &Layout,
    wl: &dyn Workload,
    tuple: &dyn Fn(usize, u64, usize) -> Vec<u8>,
    rep: &Report,
) -> Result<Vec<String>, String> {
    let mut lines = Vec::new();
    let mut held = 0u64;
    // The first few holders, named: a lock word is its owner (a coordinator's id or a
    // transaction's timestamp), which tells a leaked lock's origin.
    let mut named = Vec::new();
    for node in 0..layout.nodes() {
        for (t, k) in layout.keys_of(node) {
            let b = tuple(node, layout.tuple_off(t, k), layout.tuple_bytes(t));
            let owner = lock_of(&b);
            if owner != 0 {
                held += 1;
                if named.len() < 4 {
                    named.push(format!("node {node} table {t} key {k} by {owner:#x}"));
                }
            }
        }
    }
    if held != 0 {
        return Err(format!(
            "{held} locks still held after the run ({}{})",
            named.join(", "),
            if held > named.len() as u64 {
                ", ..."
            } else {
                ""
            }
        ));
    }
    lines.push("locks: all free".to_string());
    let read = |t: u32, k: u64| {
        let b = tuple(
            layout.home(k),
            layout.tuple_off(t, k),
            layout.tuple_bytes(t),
        );
        layout.shape().current(&b, layout.value_bytes(t)).to_vec()
    };
    lines.push(wl.check(&read, rep.delta)?);
    let v = txn::serializability::check(&rep.history);
    if !v.is_serializable() {
        return Err(format!(
            "serializability: {}",
            v.line(&|k| wl.kind_name(k).to_string())
        ));
    }
    lines.push(v.line(&|k| wl.kind_name(k).to_string()));
    Ok(lines)
}

/// Write the initial tuples of `wl` into node `node`'s partition through `write(off,
/// bytes)`: every lock free, the loaded version, the initial record, in the layout's
/// tuple shape ([`crate::layout::Shape::initial`]).
pub fn load(layout: &Layout, wl: &dyn Workload, node: usize, write: &mut dyn FnMut(u64, &[u8])) {
    for (t, k) in layout.keys_of(node) {
        let buf = layout.shape().initial(&wl.initial(t, k));
        write(layout.tuple_off(t, k), &buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_warm_up_restarts_the_counts_and_keeps_the_checked_state() {
        let mut r = Report::new(1 << 20);
        r.commits = 5;
        r.aborts = 2;
        r.user_aborts = 1;
        r.latency.saturating_record(1_000);
        r.per_interval = vec![5];
        r.delta = -3;
        r.history.record(0, &[txn::history::Access::read(0, 1, 1)]);
        r.restart_window();
        assert_eq!((r.commits, r.aborts, r.user_aborts), (0, 0, 0));
        assert!(r.latency.is_empty() && r.per_interval.is_empty());
        assert_eq!((r.delta, r.history.len(), r.warmup_commits), (-3, 1, 5));
        let mut all = Report::new(0);
        all.merge(r);
        assert_eq!(all.warmup_commits, 5);
        let a = Stats {
            rounds: 9,
            msgs: 4,
            stage_ns: [10, 0, 0, 0, 7, 0],
            ..Stats::default()
        };
        let b = Stats {
            rounds: 2,
            msgs: 4,
            stage_ns: [3, 0, 0, 0, 0, 0],
            ..Stats::default()
        };
        let d = a.since(&b);
        assert_eq!((d.rounds, d.msgs, d.stage_ns), (7, 0, [7, 0, 0, 0, 7, 0]));
    }

    #[test]
    fn merged_reports_keep_latencies() {
        let mut a = Report::new(0);
        let mut b = Report::new(0);
        b.latency.saturating_record(240_000);
        b.latency.saturating_record(250_000);
        a.merge(b);
        assert_eq!(a.latency.len(), 2);
        assert!(a.latency.value_at_quantile(0.5) >= 239_000);
    }
}
