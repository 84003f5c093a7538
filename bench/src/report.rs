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
    pub abort_reasons: [u64; AbortReason::ALL.len()],
    /// Service failures (fatal errors).
    pub fatal: Vec<String>,
    /// The thread's RPC/fabric counters.
    pub rpc: rrpc::runtime::Stats,
    /// The thread's committed transactions, when recorded for the serializability check.
    pub history: Option<txn::history::History>,
    /// Epoch of the TSO incarnation the thread used last, and restarts it survived.
    pub tso_epoch: u16,
    /// Switches of the thread's TSO connection to a restarted oracle.
    pub tso_reconnects: u64,
}

impl WorkerStats {
    /// Empty counters.
    pub fn new() -> Self {
        Self {
            types: TxnType::ALL.iter().map(|_| TypeStats::new()).collect(),
            net: 0,
            abort_reasons: [0; AbortReason::ALL.len()],
            fatal: Vec::new(),
            rpc: Default::default(),
            history: None,
            tso_epoch: 0,
            tso_reconnects: 0,
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
    /// Timing model with its parameters ("none" without one).
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
    /// Transaction types with no committed transaction (a run must commit every type).
    pub types_never_committed: Vec<String>,
    /// final == initial + net, no lock held, and every type committed.
    pub invariant_holds: bool,
    /// The serializability check's line (`None` with `--no-check`).
    pub serializability: Option<String>,
    /// The check's verdict: true when acyclic (`None` with `--no-check`).
    pub serializable: Option<bool>,
    /// Committed transactions the check covered.
    pub checked_committed: u64,
    /// Edges of the dependency graph.
    pub dependency_edges: u64,
    /// Bytes of recorded history per committed transaction checked.
    pub history_bytes_per_txn: f64,
    /// Seconds the check took.
    pub check_seconds: f64,
    /// The oracle restart of `--kill-tso-after`, when one was injected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tso_restart: Option<TsoRestart>,
}

/// What happened around an injected oracle restart (SIGKILL, restart with the same state
/// directory and address).
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct TsoRestart {
    /// Seconds into the measured run of the SIGKILL.
    pub killed_at_s: f64,
    /// Epoch of the killed incarnation.
    pub epoch_before: u16,
    /// Epoch of the restarted incarnation (must be larger).
    pub epoch_after: u16,
    /// Commits counted when the restarted oracle was ready.
    pub committed_before_ready: u64,
    /// Commits after the restarted oracle was ready (must be more than 0).
    pub committed_after_ready: u64,
    /// Epoch each coordinator thread used last (each must be `epoch_after`).
    pub thread_epochs: Vec<u16>,
}

impl TsoRestart {
    /// The restart was survived: a larger epoch, commits after it, and every thread on
    /// the new incarnation.
    pub fn survived(&self) -> bool {
        self.epoch_after > self.epoch_before
            && self.committed_after_ready > 0
            && self.thread_epochs.iter().all(|&e| e == self.epoch_after)
    }
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
            types_never_committed: Vec::new(),
            invariant_holds: false,
            serializability: None,
            serializable: None,
            checked_committed: 0,
            dependency_edges: 0,
            history_bytes_per_txn: 0.0,
            check_seconds: 0.0,
            tso_restart: None,
        }
    }

    /// Record the audit and decide the invariant: money conserved, no lock held, and at
    /// least one committed transaction of every type (a run in which a type never
    /// commits has not tested it).
    pub fn audit(&mut self, initial: i64, final_total: i64, locks_held: u64) {
        self.initial_total = initial;
        self.final_total = final_total;
        self.locks_held = locks_held;
        self.types_never_committed = self
            .types
            .iter()
            .filter(|t| t.committed == 0)
            .map(|t| t.name.clone())
            .collect();
        self.invariant_holds = final_total == initial + self.net_committed
            && locks_held == 0
            && self.types_never_committed.is_empty();
    }

    /// Record the serializability check of the run's history (`history_bytes` recorded,
    /// checked in `took`).
    pub fn serializability(
        &mut self,
        v: &txn::serializability::Verdict,
        history_bytes: usize,
        took: Duration,
    ) {
        self.serializability = Some(v.line(&|k| {
            TxnType::ALL
                .get(k as usize)
                .map_or_else(|| format!("type {k}"), |t| t.name().to_string())
        }));
        self.serializable = Some(v.is_serializable());
        self.checked_committed = v.committed as u64;
        self.dependency_edges = v.edges as u64;
        self.history_bytes_per_txn = history_bytes as f64 / v.committed.max(1) as f64;
        self.check_seconds = took.as_secs_f64();
    }

    /// True when every check passed: the invariant, no service failure, and a
    /// serializable history (when checked).
    pub fn passed(&self) -> bool {
        self.invariant_holds
            && self.fatal_errors == 0
            && self.serializable != Some(false)
            && self.tso_restart.as_ref().is_none_or(TsoRestart::survived)
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
        if let Some(line) = &self.serializability {
            let _ = writeln!(s, "{line}");
        }
        if let Some(r) = &self.tso_restart {
            let _ = writeln!(
                s,
                "tso restart: SIGKILL at {:.1} s, epoch {} -> {}, {} committed before the restarted oracle was ready, {} after; thread epochs {:?}: {}",
                r.killed_at_s,
                r.epoch_before,
                r.epoch_after,
                r.committed_before_ready,
                r.committed_after_ready,
                r.thread_epochs,
                if r.survived() { "survived" } else { "NOT SURVIVED" }
            );
        }
        if self.invariant_holds {
            let _ = writeln!(s, "invariant holds");
        } else if !self.types_never_committed.is_empty() {
            let _ = writeln!(
                s,
                "INVARIANT VIOLATED: no committed transaction of type {} (a run must commit every type; run longer or with less contention)",
                self.types_never_committed.join(", ")
            );
        } else {
            let _ = writeln!(s, "INVARIANT VIOLATED");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use txn::history::{Access, History};

    fn report_with_commits(per_type: &[u64]) -> Report {
        let mut w = WorkerStats::new();
        for (t, &n) in w.types.iter_mut().zip(per_type) {
            for _ in 0..n {
                t.attempts += 1;
                t.record_commit(Duration::from_micros(50));
            }
        }
        Report::new("shm".into(), 1, 1, 100, 0.99, Duration::from_secs(1), &[w])
    }

    #[test]
    fn a_type_that_never_committed_breaks_the_invariant() {
        let mut r = report_with_commits(&[3, 3, 3, 3, 3, 3]);
        r.audit(1000, 1000, 0);
        assert!(r.invariant_holds && r.passed());
        assert!(r.render().ends_with("invariant holds\n"));

        let mut r = report_with_commits(&[3, 0, 3, 3, 3, 0]);
        r.audit(1000, 1000, 0);
        assert!(!r.invariant_holds && !r.passed());
        assert_eq!(r.types_never_committed, ["Balance", "WriteCheck"]);
        let out = r.render();
        assert!(
            out.contains(
                "INVARIANT VIOLATED: no committed transaction of type Balance, WriteCheck"
            ),
            "{out}"
        );
        // Money and locks still decide on their own.
        let mut r = report_with_commits(&[1; 6]);
        r.audit(1000, 999, 0);
        assert!(!r.invariant_holds);
        let mut r = report_with_commits(&[1; 6]);
        r.audit(1000, 1000, 1);
        assert!(!r.invariant_holds);
    }

    #[test]
    fn the_serializability_line_follows_the_money_line_and_a_cycle_fails_the_run() {
        let mut h = History::new(usize::MAX);
        h.record(4, &[Access::read(0, 1, 1), Access::write(0, 1, 2)]);
        h.record(5, &[Access::read(0, 1, 2), Access::write(0, 1, 3)]);
        let mut r = report_with_commits(&[1; 6]);
        r.audit(1000, 1000, 0);
        r.serializability(
            &txn::serializability::check(&h),
            h.bytes(),
            Duration::from_millis(1),
        );
        let out = r.render();
        let lines: Vec<&str> = out.lines().collect();
        let money = lines.iter().position(|l| l.starts_with("money: ")).unwrap();
        assert_eq!(
            lines[money + 1],
            "serializability: 2 committed, 2 edges, acyclic"
        );
        assert!(r.passed());

        // A lost update: both read version 1 and installed version 2.
        let mut h = History::new(usize::MAX);
        h.record(2, &[Access::read(1, 9, 1), Access::write(1, 9, 2)]);
        h.record(3, &[Access::read(1, 9, 1), Access::write(1, 9, 2)]);
        r.serializability(&txn::serializability::check(&h), h.bytes(), Duration::ZERO);
        assert_eq!(r.serializable, Some(false));
        assert!(
            !r.passed(),
            "a cycle fails the run even when the money adds up"
        );
        let out = r.render();
        assert!(
            out.contains("serializability: CYCLE of 2 transactions:"),
            "{out}"
        );
        assert!(
            out.contains("(DepositChecking)") && out.contains("(SendPayment)"),
            "{out}"
        );
    }
}
