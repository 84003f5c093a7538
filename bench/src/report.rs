//! Run statistics: per-thread counters and HDR latency histograms, merged into a report
//! that prints as a table and serializes to JSON.

use std::fmt::Write as _;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;
use txn::occ::AbortReason;

use crate::smallbank::TxnType;

/// Latencies are recorded in nanoseconds, 1 ns to 60 s, 3 significant digits.
fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

/// Counters of one transaction type on one thread.
pub struct TypeStats {
    /// Attempts (each retry counts).
    pub attempts: u64,
    /// Commits.
    pub commits: u64,
    /// Conflict aborts (retried).
    pub aborts: u64,
    /// Aborts decided by the transaction's logic (not retried, no effect).
    pub user_aborts: u64,
    /// Latency of committed transactions from first attempt to commit, ns.
    pub hist: Histogram<u64>,
}

impl TypeStats {
    fn new() -> Self {
        Self {
            attempts: 0,
            commits: 0,
            aborts: 0,
            user_aborts: 0,
            hist: new_hist(),
        }
    }
    /// Count a commit that took `d` since its first attempt.
    pub fn record_commit(&mut self, d: Duration) {
        self.commits += 1;
        let _ = self.hist.record((d.as_nanos() as u64).max(1));
    }
}

/// One coordinator thread's results.
pub struct WorkerStats {
    /// Per type, in [`TxnType::ALL`] order.
    pub types: Vec<TypeStats>,
    /// Net money added by committed transactions, cents.
    pub net: i64,
    /// Aborts by reason, in [`AbortReason::ALL`] order.
    pub abort_reasons: [u64; 8],
    /// Service failures (fatal errors).
    pub fatal: Vec<String>,
    /// The thread's RPC/fabric counters.
    pub rpc: rrpc::runtime::Stats,
}

impl WorkerStats {
    /// Empty counters.
    pub fn new() -> Self {
        Self {
            types: TxnType::ALL.iter().map(|_| TypeStats::new()).collect(),
            net: 0,
            abort_reasons: [0; 8],
            fatal: Vec::new(),
            rpc: Default::default(),
        }
    }
}

impl Default for WorkerStats {
    fn default() -> Self {
        Self::new()
    }
}

/// One row of the report.
#[derive(Serialize, Debug)]
pub struct TypeRow {
    /// Transaction type.
    pub name: String,
    /// Commits.
    pub committed: u64,
    /// Conflict aborts.
    pub aborts: u64,
    /// Aborts by the transaction's logic.
    pub user_aborts: u64,
    /// aborts / attempts.
    pub abort_rate: f64,
    /// Median latency of committed transactions, µs.
    pub p50_us: f64,
    /// 99th percentile latency of committed transactions, µs.
    pub p99_us: f64,
}

/// A whole run.
#[derive(Serialize, Debug)]
pub struct Report {
    /// Workload name.
    pub workload: String,
    /// Fabric description.
    pub fabric: String,
    /// Timing model ("none").
    pub timing_model: String,
    /// Coordinator threads.
    pub threads: usize,
    /// Coroutines per thread.
    pub coroutines: usize,
    /// Accounts.
    pub accounts: u64,
    /// Zipf theta.
    pub theta: f64,
    /// Measured seconds.
    pub seconds: f64,
    /// Committed transactions per second.
    pub throughput_tps: f64,
    /// Median latency of all committed transactions, µs.
    pub p50_us: f64,
    /// p99 latency of all committed transactions, µs.
    pub p99_us: f64,
    /// Conflict aborts / attempts over all types.
    pub abort_rate: f64,
    /// Per type.
    pub types: Vec<TypeRow>,
    /// Aborts by reason.
    pub abort_reasons: Vec<(String, u64)>,
    /// WRs per doorbell over the run.
    pub wrs_per_doorbell: f64,
    /// RPC requests per Rocket bucket (msg batching).
    pub msgs_per_bucket: f64,
    /// Posts deferred because a send queue was full.
    pub sq_full: u64,
    /// Service failures.
    pub fatal_errors: usize,
    /// First few fatal error messages.
    pub fatal_samples: Vec<String>,
    /// Money before the run, cents.
    pub initial_total: i64,
    /// Money after the run, cents.
    pub final_total: i64,
    /// Net of committed deposits and withdrawals, cents.
    pub net_committed: i64,
    /// Locks still held or queued after the run.
    pub locks_held: u64,
    /// final == initial + net and no lock held.
    pub invariant_holds: bool,
}

fn us(h: &Histogram<u64>, q: f64) -> f64 {
    if h.is_empty() {
        0.0
    } else {
        h.value_at_quantile(q) as f64 / 1000.0
    }
}

impl Report {
    /// Merge the workers' statistics.
    pub fn new(
        fabric: String,
        threads: usize,
        coroutines: usize,
        accounts: u64,
        theta: f64,
        elapsed: Duration,
        workers: &[WorkerStats],
    ) -> Self {
        let mut all = new_hist();
        let mut rows = Vec::new();
        let (mut attempts, mut aborts, mut commits) = (0u64, 0u64, 0u64);
        for t in TxnType::ALL {
            let mut h = new_hist();
            let (mut a, mut ab, mut c, mut u) = (0, 0, 0, 0);
            for w in workers {
                let s = &w.types[t.index()];
                h.add(&s.hist).expect("same bounds");
                a += s.attempts;
                ab += s.aborts;
                c += s.commits;
                u += s.user_aborts;
            }
            all.add(&h).expect("same bounds");
            attempts += a;
            aborts += ab;
            commits += c;
            rows.push(TypeRow {
                name: t.name().into(),
                committed: c,
                aborts: ab,
                user_aborts: u,
                abort_rate: if a == 0 { 0.0 } else { ab as f64 / a as f64 },
                p50_us: us(&h, 0.5),
                p99_us: us(&h, 0.99),
            });
        }
        let reasons = AbortReason::ALL
            .iter()
            .enumerate()
            .map(|(i, r)| {
                (
                    r.name().to_string(),
                    workers.iter().map(|w| w.abort_reasons[i]).sum(),
                )
            })
            .filter(|(n, c)| *c > 0 && n != "user")
            .collect();
        let (mut wrs, mut doorbells, mut msgs, mut buckets, mut sq_full) = (0, 0, 0, 0, 0);
        for w in workers {
            sq_full += w.rpc.sq_full;
            wrs += w.rpc.wrs;
            doorbells += w.rpc.doorbells;
            msgs += w.rpc.messages;
            buckets += w.rpc.buckets;
        }
        let fatal: Vec<String> = workers
            .iter()
            .flat_map(|w| w.fatal.iter().cloned())
            .collect();
        let secs = elapsed.as_secs_f64();
        Self {
            workload: "SmallBank".into(),
            fabric,
            timing_model: "none".into(),
            threads,
            coroutines,
            accounts,
            theta,
            seconds: secs,
            throughput_tps: commits as f64 / secs,
            p50_us: us(&all, 0.5),
            p99_us: us(&all, 0.99),
            abort_rate: if attempts == 0 {
                0.0
            } else {
                aborts as f64 / attempts as f64
            },
            types: rows,
            abort_reasons: reasons,
            wrs_per_doorbell: wrs as f64 / doorbells.max(1) as f64,
            msgs_per_bucket: msgs as f64 / buckets.max(1) as f64,
            sq_full,
            fatal_errors: fatal.len(),
            fatal_samples: fatal.into_iter().take(5).collect(),
            initial_total: 0,
            final_total: 0,
            net_committed: workers.iter().map(|w| w.net).sum(),
            locks_held: 0,
            invariant_holds: false,
        }
    }

    /// Record the audit and decide the invariant.
    pub fn audit(&mut self, initial: i64, final_total: i64, locks_held: u64) {
        self.initial_total = initial;
        self.final_total = final_total;
        self.locks_held = locks_held;
        self.invariant_holds = final_total == initial + self.net_committed && locks_held == 0;
    }

    /// The human-readable table.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<16} {:>10} {:>9} {:>6} {:>10} {:>9} {:>9}",
            "type", "committed", "aborts", "user", "abort-rate", "p50(us)", "p99(us)"
        );
        for r in &self.types {
            let _ = writeln!(
                s,
                "{:<16} {:>10} {:>9} {:>6} {:>9.2}% {:>9.1} {:>9.1}",
                r.name,
                r.committed,
                r.aborts,
                r.user_aborts,
                100.0 * r.abort_rate,
                r.p50_us,
                r.p99_us
            );
        }
        let committed: u64 = self.types.iter().map(|r| r.committed).sum();
        let _ = writeln!(
            s,
            "total: {committed} committed in {:.1} s = {:.0} txn/s | p50 {:.1} us | p99 {:.1} us | abort rate {:.2}%",
            self.seconds,
            self.throughput_tps,
            self.p50_us,
            self.p99_us,
            100.0 * self.abort_rate
        );
        let reasons: Vec<String> = self
            .abort_reasons
            .iter()
            .map(|(n, c)| format!("{n} {c}"))
            .collect();
        let _ = writeln!(
            s,
            "abort reasons: {}",
            if reasons.is_empty() {
                "none".into()
            } else {
                reasons.join(", ")
            }
        );
        let _ = writeln!(
            s,
            "batching: {:.2} WRs per doorbell, {:.2} RPC messages per Rocket bucket, {} posts deferred (send queue full)",
            self.wrs_per_doorbell, self.msgs_per_bucket, self.sq_full
        );
        for f in &self.fatal_samples {
            let _ = writeln!(s, "service failure: {f}");
        }
        let _ = writeln!(
            s,
            "money: initial {} + net committed {} = {} expected, {} found; locks held after run: {}",
            self.initial_total,
            self.net_committed,
            self.initial_total + self.net_committed,
            self.final_total,
            self.locks_held
        );
        let _ = writeln!(
            s,
            "{}",
            if self.invariant_holds {
                "invariant holds"
            } else {
                "INVARIANT VIOLATED"
            }
        );
        s
    }
}
