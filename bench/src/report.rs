//! Run statistics: per-thread counters and HDR latency histograms, merged into a report
//! that prints as a table and serializes to JSON.

use std::fmt::Write as _;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;
use txn::coordinator::AbortReason;

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
    /// Transactions whose lookup found nothing (TATP: a read-only one that committed
    /// without a result, or an update rolled back; counted in `commits` or
    /// `user_aborts` too).
    pub failed_lookups: u64,
    /// Conflict aborts by reason, in [`AbortReason::ALL`] order.
    pub abort_reasons: [u64; AbortReason::ALL.len()],
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
            failed_lookups: 0,
            abort_reasons: [0; AbortReason::ALL.len()],
            hist: new_hist(),
        }
    }
    /// Count a conflict abort for `reason`.
    pub fn record_abort(&mut self, reason: AbortReason) {
        self.aborts += 1;
        if let Some(i) = AbortReason::ALL.iter().position(|&x| x == reason) {
            self.abort_reasons[i] += 1;
        }
    }
    /// Count a commit that took `d` since its first attempt.
    pub fn record_commit(&mut self, d: Duration) {
        self.commits += 1;
        let _ = self.hist.record((d.as_nanos() as u64).max(1));
    }
}

/// What a coordinator thread forwarded (`--routing forward`, [`crate::forward`]).
pub struct ForwardStats {
    /// Transactions sent to their home compute node and run there.
    pub count: u64,
    /// Bytes of their inputs.
    pub bytes: u64,
    /// Their latency from generation here to the home node's reply, ns.
    pub hist: Histogram<u64>,
}

impl Default for ForwardStats {
    fn default() -> Self {
        Self {
            count: 0,
            bytes: 0,
            hist: new_hist(),
        }
    }
}

/// One coordinator thread's results.
pub struct WorkerStats {
    /// Per type, in the workload's order of kinds (KVS / YCSB: the workload's kinds).
    pub types: Vec<TypeStats>,
    /// Net money added by committed transactions, cents (KVS / YCSB: committed updates).
    pub net: i64,
    /// Keys inserted by committed transactions (YCSB D).
    pub inserted: Vec<u64>,
    /// Aborts by reason, in [`AbortReason::ALL`] order.
    pub abort_reasons: [u64; AbortReason::ALL.len()],
    /// Service failures (fatal errors).
    pub fatal: Vec<String>,
    /// The thread's RPC/fabric counters.
    pub rpc: rrpc::runtime::Stats,
    /// One-sided work requests the thread posted to the memory nodes (READs, WRITEs,
    /// atomics), every attempt counted.
    pub memnode_ops: rrpc::runtime::OpCounts,
    /// The thread's committed transactions, when recorded for the serializability check.
    pub history: Option<txn::history::History>,
    /// Epoch of the TSO incarnation the thread used last, and restarts it survived.
    pub tso_epoch: u16,
    /// Switches of the thread's TSO connection to a restarted oracle.
    pub tso_reconnects: u64,
    /// Scythe: reconnections of the thread's lock service connection after the
    /// service died or restarted.
    pub lock_reconnects: u64,
    /// `--qp-errors-ms`: QPs this thread moved to the error state.
    pub qp_errors: u64,
    /// `--routing ideal`: draws thrown away and transactions run off their shard.
    pub route: crate::routing::RouteCounts,
    /// `--routing forward`: transactions this thread sent to their home compute node.
    pub forward: ForwardStats,
    /// Lotus in a coordinator process: the process's version table cache, reported by
    /// its first thread only (`None` from the others and in txn-bench itself).
    pub vtc: Option<txn::vt_cache::VtCacheStats>,
    /// One-sided operations this thread retried after a transport failure
    /// (`txn::transient`).
    pub transient_retries: u64,
    /// With `--breakdown`: where the thread's committed transactions spent their time.
    pub breakdown: Option<crate::breakdown::Breakdown>,
    /// Scythe: per table, attempts that read it and of those the TOCC ones.
    pub tocc_share: Vec<crate::breakdown::ToccShare>,
    /// Scythe with its locks on the memory nodes: lock-and-read RPCs sent, and grants
    /// whose object came with them and was taken without a READ.
    pub lock_reads: (u64, u64),
    /// With `--timeline-ms`: the thread's commits and aborts per interval.
    pub timeline: crate::timeline::Timeline,
    /// Commits per type before the warm-up's end ([`Self::restart_window`]), in the
    /// order of `types`: not reported, but the check that every type committed covers
    /// the whole run (empty without a warm-up).
    pub warmup_commits: Vec<u64>,
}

impl WorkerStats {
    /// Empty counters of `kinds` transaction kinds.
    pub fn with_kinds(kinds: usize) -> Self {
        Self {
            types: (0..kinds).map(|_| TypeStats::new()).collect(),
            net: 0,
            inserted: Vec::new(),
            abort_reasons: [0; AbortReason::ALL.len()],
            fatal: Vec::new(),
            rpc: Default::default(),
            memnode_ops: Default::default(),
            history: None,
            tso_epoch: 0,
            tso_reconnects: 0,
            lock_reconnects: 0,
            qp_errors: 0,
            route: Default::default(),
            forward: ForwardStats::default(),
            vtc: None,
            transient_retries: 0,
            breakdown: None,
            tocc_share: Vec::new(),
            lock_reads: Default::default(),
            timeline: Default::default(),
            warmup_commits: Vec::new(),
        }
    }

    /// The warm-up's end (`--warmup`): restart what the report shows (per type the
    /// attempts, commits, aborts and latencies; abort reasons, the breakdown, the
    /// timeline, routing and forwarding counts), keep what the checks need (the net,
    /// inserted keys, the history, fatal errors, fault counters) and add this window's
    /// commits per type to [`Self::warmup_commits`]. The thread's network, one-sided
    /// and TOCC counters are cumulative and kept elsewhere: the caller snapshots them
    /// here and subtracts (`rrpc::runtime::Stats::since`).
    pub fn restart_window(&mut self) {
        if self.warmup_commits.len() < self.types.len() {
            self.warmup_commits.resize(self.types.len(), 0);
        }
        for (w, t) in self.warmup_commits.iter_mut().zip(&mut self.types) {
            *w += t.commits;
            *t = TypeStats::new();
        }
        self.abort_reasons = [0; AbortReason::ALL.len()];
        self.route = Default::default();
        self.forward = ForwardStats::default();
        if let Some(b) = &mut self.breakdown {
            *b = crate::breakdown::Breakdown::with_kinds(self.types.len());
        }
        self.timeline.clear();
    }
}

/// One row of the report.
#[derive(Serialize, Debug)]
pub struct TypeRow {
    /// Transaction type.
    pub name: String,
    /// Attempts (each retry counts).
    pub attempts: u64,
    /// Commits.
    pub committed: u64,
    /// Conflict aborts.
    pub aborts: u64,
    /// Conflict aborts by reason (name, count), most frequent first.
    pub abort_reasons: Vec<(String, u64)>,
    /// Aborts by the transaction's logic.
    pub user_aborts: u64,
    /// Lookups that found nothing (TATP's expected failures; among the commits or the
    /// user aborts).
    pub failed_lookups: u64,
    /// aborts / attempts.
    pub abort_rate: f64,
    /// Median latency of committed transactions, µs.
    pub p50_us: f64,
    /// 99th percentile latency of committed transactions, µs.
    pub p99_us: f64,
}

/// A whole run (one protocol on one freshly loaded cluster).
#[derive(Serialize, Debug)]
pub struct Report {
    /// Workload name.
    pub workload: String,
    /// Concurrency-control protocol (`occ-cas`, `scythe`, `mvcc`, `mvcc-si`).
    pub protocol: String,
    /// The sweep point this run measured (`theta=0.5`, `clients=16`), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub point: Option<String>,
    /// With `--rounds N` (N > 1): the round this run belongs to, from 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub round: Option<u32>,
    /// Fabric description.
    pub fabric: String,
    /// Timing model with its parameters ("none" without one).
    pub timing_model: String,
    /// Coordinator threads.
    pub threads: usize,
    /// Coroutines per thread.
    pub coroutines: usize,
    /// Accounts (SmallBank), loaded records (KVS / YCSB), subscribers (TATP) or
    /// warehouses (TPC-C).
    pub accounts: u64,
    /// Zipf theta.
    pub theta: f64,
    /// Memory nodes the tables were partitioned over.
    pub memnodes: u32,
    /// Copies of each partition (1: no replication).
    pub replicas: u32,
    /// The replica audit's line after a replicated run (`replicas: ... identical`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica_audit: Option<String>,
    /// Whether every backup equalled its primary (`None` without replication).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicas_identical: Option<bool>,
    /// Version cells per CVT.
    pub versions: usize,
    /// Measured seconds (after the warm-up).
    pub seconds: f64,
    /// `--warmup`: seconds the coordinators ran before the measured window, whose
    /// transactions are checked but not reported (0: none).
    pub warmup_s: f64,
    /// Transactions committed during the warm-up (checked, not in `types` nor the
    /// throughput).
    pub warmup_committed: u64,
    /// Per type, the warm-up's commits (for the check that every type committed).
    #[serde(skip)]
    pub warmup_type_commits: Vec<u64>,
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
    /// RPC requests the coordinators sent per committed transaction, every attempt
    /// counted (Lotus: lock requests to other compute nodes' tables; Scythe: Lock RPCs).
    pub rpc_messages_per_commit: f64,
    /// Posts deferred because a send queue was full.
    pub sq_full: u64,
    /// One-sided work requests the coordinators posted to the memory nodes per
    /// committed transaction, every attempt counted: `[READs, WRITEs, atomics]`.
    pub memnode_ops_per_commit: [f64; 3],
    /// `--qp-errors-ms`: QPs the coordinators moved to the error state.
    #[serde(skip_serializing_if = "is_zero")]
    pub qp_errors: u64,
    /// Lotus's hybrid routing (`--routing`), when it applied to the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub routing: Option<String>,
    /// Where Lotus's compute nodes served lock RPCs (`--lock-serving`: `coordinator`
    /// or `thread`), when the run had such RPCs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock_serving: Option<String>,
    /// `--routing ideal`: draws thrown away (the first record's shard was another
    /// compute node's).
    #[serde(skip_serializing_if = "is_zero")]
    pub route_redraws: u64,
    /// `--routing ideal`: transactions run off their shard after too many draws.
    #[serde(skip_serializing_if = "is_zero")]
    pub route_misses: u64,
    /// `--routing forward`: transactions sent to their home compute node (counted
    /// there among the commits).
    #[serde(skip_serializing_if = "is_zero")]
    pub forwarded: u64,
    /// `--routing forward`: mean bytes of a forwarded input.
    #[serde(skip_serializing_if = "is_zero_f")]
    pub forward_bytes: f64,
    /// `--routing forward`: p50 and p99 of a forwarded transaction's latency from
    /// generation at its sender (the hop and the home node's queue included), us.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forward_p50_p99_us: Option<[f64; 2]>,
    /// One-sided operations the coordinators retried after a transport failure.
    #[serde(skip_serializing_if = "is_zero")]
    pub transient_retries: u64,
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
    /// Locks still held or queued after the run: CVT lock words plus, for Scythe, lock
    /// service locks.
    pub locks_held: u64,
    /// CVT lock words still held after the run (every protocol; only OCC-CAS and MVCC
    /// take them).
    pub cvt_locks_held: u64,
    /// Lock service locks still held or queued after the run (Scythe; `None` without a
    /// lock service).
    pub lockd_locks_held: Option<u64>,
    /// Lotus lock-table slots still in use after the run (`None` for the other
    /// protocols).
    pub lotus_locks_held: Option<u64>,
    /// Lotus: the compute node's version table cache counters at the end of the run
    /// (Lotus 4.4; `None` for the other protocols or with `--vtc-entries 0`).
    pub vtc: Option<txn::vt_cache::VtCacheStats>,
    /// Transaction types with no committed transaction (a run must commit every type).
    pub types_never_committed: Vec<String>,
    /// final == initial + net, no lock held, and every type committed.
    pub invariant_holds: bool,
    /// The serializability check's line (`None` with `--no-check`).
    pub serializability: Option<String>,
    /// The check's verdict: true when acyclic (`None` with `--no-check`).
    pub serializable: Option<bool>,
    /// Whether the run must be serializable to pass (every protocol but `mvcc-si`, for
    /// which the serializability line is informative: SI allows write skew).
    pub serializability_required: bool,
    /// The snapshot-isolation check's line (MVCC runs, which record start and commit
    /// timestamps; `None` otherwise and with `--no-check`).
    pub snapshot_isolation: Option<String>,
    /// The SI check's verdict (`None` when not checked).
    pub snapshot_isolation_holds: Option<bool>,
    /// Whether the run must satisfy the SI check to pass (`mvcc-si`; for `mvcc` the SI
    /// line is informative).
    pub snapshot_isolation_required: bool,
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
    /// After a failover: the check that every object written by a committed
    /// transaction holds its last committed version on the new primaries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub durability: Option<String>,
    /// Its verdict (`None` when not checked).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub durable: Option<bool>,
    /// The memory-node failover of `--kill-memnode-after`, when one was injected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failover: Option<crate::failover::Failover>,
    /// The lock service restart of `--kill-lockd-after`, when one was injected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lockd_restart: Option<LockdRestart>,
    /// The membership service (etcd: the replica view's home) restart of
    /// `--kill-etcd-after`, when one was injected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub etcd_restart: Option<EtcdRestart>,
    /// The workload's check line when it is not SmallBank's money audit (KVS / YCSB:
    /// `kvs check: ...`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload_check: Option<String>,
    /// The workload's outcomes beside commits and aborts (TATP: failed lookups per type
    /// against the specification's expected rates).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcomes: Option<String>,
    /// The label of an UNSAFE benchmark-only variant (`mvcc-nocas`: MVCC without its
    /// lock CAS, Lotus's Fig. 3 premise), whose run is never judged by its checks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unsafe_variant: Option<String>,
    /// With `--breakdown`: per transaction type, the mean and p99 of each phase of the
    /// committed transactions (`crate::breakdown`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breakdown: Option<Vec<crate::breakdown::BreakdownRow>>,
    /// With `--breakdown`: the CPU time of each process of the cluster during the run.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cpu: Vec<crate::breakdown::ProcessCpu>,
    /// Scythe: the share of attempts that ran TOCC, per table read.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tocc_share: Vec<crate::breakdown::ToccShare>,
    /// Scythe with its locks on the memory nodes (Scythe 4.3): lock-and-read RPCs sent
    /// and, of those, grants whose object came with them (taken without a READ).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock_reads: Option<[u64; 2]>,
    /// Coordinator processes (`--cnodes`; 1: the coordinators ran in `txn-bench`).
    pub cnodes: usize,
    /// What happened to coordinator processes during the run (deaths, kills, restarts,
    /// stops), in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cnode_events: Vec<String>,
    /// With `--timeline-ms`: commits per interval per compute node, and the recovery
    /// after a fault.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeline: Option<crate::timeline::TimelineReport>,
    /// Latency of every committed transaction, first attempt to commit, ns (all types
    /// merged; for the `--json` run record's percentiles and HDR histogram).
    #[serde(skip)]
    pub latency: Histogram<u64>,
}

/// What happened around an injected restart of etcd, the view service (SIGKILL, start
/// again from its data directory on the same ports).
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct EtcdRestart {
    /// Seconds into the run of the SIGKILL.
    pub killed_at_s: f64,
    /// Milliseconds from the kill until it answered again.
    pub back_ms: f64,
    /// The view epoch published to the coordinators at the kill (`None`: the run keeps
    /// no view, no memory node being killed).
    pub epoch_published: Option<u64>,
    /// The view epoch read back from etcd after the restart (must equal
    /// `epoch_published`: what was stored before the kill survived it).
    pub epoch_read_back: Option<u64>,
    /// At the end of the run: the last view epoch published, and the one etcd holds
    /// (must be equal).
    pub final_published: Option<u64>,
    /// See `final_published`.
    pub final_stored: Option<u64>,
    /// Commits counted when etcd answered again.
    pub committed_before_ready: u64,
    /// Commits after that (must be more than 0).
    pub committed_after_ready: u64,
}

impl EtcdRestart {
    /// The restart was survived: the stored view came back as published, the view at
    /// the end is stored, and commits went on.
    pub fn survived(&self) -> bool {
        self.epoch_read_back == self.epoch_published
            && self.final_stored == self.final_published
            && self.committed_after_ready > 0
    }
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
    /// Epoch each coordinator thread used last (each must be `epoch_after` when the
    /// protocol takes timestamps).
    pub thread_epochs: Vec<u16>,
    /// Whether the protocol takes timestamps (OCC-CAS takes none: its threads never
    /// meet the restarted oracle, and their epochs stay the old one).
    pub uses_tso: bool,
}

impl TsoRestart {
    /// The restart was survived: a larger epoch, commits after it, and every thread on
    /// the new incarnation (when the protocol takes timestamps).
    pub fn survived(&self) -> bool {
        self.epoch_after > self.epoch_before
            && self.committed_after_ready > 0
            && (!self.uses_tso || self.thread_epochs.iter().all(|&e| e == self.epoch_after))
    }
}

/// What happened around an injected lock service restart (SIGKILL, restart with the
/// same state directory and address, grants refused for its grace period).
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct LockdRestart {
    /// Seconds into the measured run of the SIGKILL.
    pub killed_at_s: f64,
    /// Epoch of the killed incarnation.
    pub epoch_before: u64,
    /// Epoch of the restarted incarnation (must be larger).
    pub epoch_after: u64,
    /// Milliseconds after its start that the restarted service refused Lock RPCs.
    pub grace_ms: u64,
    /// Commits counted when the restarted service was ready.
    pub committed_before_ready: u64,
    /// Commits after the restarted service was ready (must be more than 0).
    pub committed_after_ready: u64,
    /// Reconnections of each coordinator thread's lock service connection.
    pub thread_reconnects: Vec<u64>,
}

impl LockdRestart {
    /// The restart was survived: a larger epoch and commits after it.
    pub fn survived(&self) -> bool {
        self.epoch_after > self.epoch_before && self.committed_after_ready > 0
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_zero_f(x: &f64) -> bool {
    *x == 0.0
}

fn us(h: &Histogram<u64>, q: f64) -> f64 {
    if h.is_empty() {
        0.0
    } else {
        h.value_at_quantile(q) as f64 / 1000.0
    }
}

impl Report {
    /// Merge the workers' statistics of transaction kinds named `kinds` (the workers'
    /// [`WorkerStats::types`] in this order).
    #[allow(clippy::too_many_arguments)]
    pub fn with_kinds(
        kinds: &[&str],
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
        for (i, name) in kinds.iter().enumerate() {
            let mut h = new_hist();
            let (mut a, mut ab, mut c, mut u, mut f) = (0, 0, 0, 0, 0);
            let mut by_reason = [0u64; AbortReason::ALL.len()];
            for w in workers {
                let s = &w.types[i];
                h.add(&s.hist).expect("same bounds");
                a += s.attempts;
                ab += s.aborts;
                c += s.commits;
                u += s.user_aborts;
                f += s.failed_lookups;
                for (t, x) in by_reason.iter_mut().zip(s.abort_reasons) {
                    *t += x;
                }
            }
            let mut type_reasons: Vec<(String, u64)> = AbortReason::ALL
                .iter()
                .zip(by_reason)
                .filter(|&(_, n)| n > 0)
                .map(|(r, n)| (r.name().to_string(), n))
                .collect();
            type_reasons.sort_by_key(|r| std::cmp::Reverse(r.1));
            all.add(&h).expect("same bounds");
            attempts += a;
            aborts += ab;
            commits += c;
            rows.push(TypeRow {
                name: name.to_string(),
                attempts: a,
                committed: c,
                aborts: ab,
                abort_reasons: type_reasons,
                user_aborts: u,
                failed_lookups: f,
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
        let warmup_type_commits: Vec<u64> = (0..kinds.len())
            .map(|i| {
                workers
                    .iter()
                    .map(|w| w.warmup_commits.get(i).copied().unwrap_or(0))
                    .sum()
            })
            .collect();
        Self {
            latency: all.clone(),
            warmup_s: 0.0,
            warmup_committed: warmup_type_commits.iter().sum(),
            warmup_type_commits,
            workload: "SmallBank".into(),
            protocol: String::new(),
            point: None,
            round: None,
            fabric,
            timing_model: "none".into(),
            threads,
            coroutines,
            accounts,
            theta,
            memnodes: 1,
            replicas: 1,
            replica_audit: None,
            replicas_identical: None,
            failover: None,
            durability: None,
            durable: None,
            versions: txn::smallbank::DEFAULT_VERSIONS,
            seconds: secs,
            // A run interrupted during its warm-up measured nothing.
            throughput_tps: if secs > 0.0 {
                commits as f64 / secs
            } else {
                0.0
            },
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
            rpc_messages_per_commit: msgs as f64 / commits.max(1) as f64,
            sq_full,
            memnode_ops_per_commit: {
                let mut t = rrpc::runtime::OpCounts::default();
                for w in workers {
                    t.add(&w.memnode_ops);
                }
                let c = commits.max(1) as f64;
                [
                    t.reads as f64 / c,
                    t.writes as f64 / c,
                    t.atomics as f64 / c,
                ]
            },
            qp_errors: workers.iter().map(|w| w.qp_errors).sum(),
            routing: None,
            lock_serving: None,
            route_redraws: workers.iter().map(|w| w.route.redraws).sum(),
            route_misses: workers.iter().map(|w| w.route.misses).sum(),
            forwarded: workers.iter().map(|w| w.forward.count).sum(),
            forward_bytes: {
                let n: u64 = workers.iter().map(|w| w.forward.count).sum();
                workers.iter().map(|w| w.forward.bytes).sum::<u64>() as f64 / n.max(1) as f64
            },
            forward_p50_p99_us: {
                let mut h = new_hist();
                for w in workers {
                    let _ = h.add(&w.forward.hist);
                }
                (!h.is_empty()).then(|| [us(&h, 0.5), us(&h, 0.99)])
            },
            transient_retries: workers.iter().map(|w| w.transient_retries).sum(),
            fatal_errors: fatal.len(),
            fatal_samples: fatal.into_iter().take(5).collect(),
            initial_total: 0,
            final_total: 0,
            net_committed: workers.iter().map(|w| w.net).sum(),
            locks_held: 0,
            cvt_locks_held: 0,
            lockd_locks_held: None,
            lotus_locks_held: None,
            vtc: None,
            types_never_committed: Vec::new(),
            invariant_holds: false,
            serializability: None,
            serializable: None,
            serializability_required: true,
            snapshot_isolation: None,
            snapshot_isolation_holds: None,
            snapshot_isolation_required: false,
            checked_committed: 0,
            dependency_edges: 0,
            history_bytes_per_txn: 0.0,
            check_seconds: 0.0,
            tso_restart: None,
            lockd_restart: None,
            etcd_restart: None,
            workload_check: None,
            outcomes: None,
            unsafe_variant: None,
            breakdown: None,
            cpu: Vec::new(),
            tocc_share: Vec::new(),
            lock_reads: Default::default(),
            cnodes: 1,
            cnode_events: Vec::new(),
            timeline: None,
        }
    }

    /// A history's transaction kind as this report names it.
    fn kind_name(&self, k: u16) -> String {
        self.types
            .get(k as usize)
            .map_or_else(|| format!("type {k}"), |t| t.name.clone())
    }

    /// Record the replica audit (the run fails on a difference).
    pub fn replica_audit(&mut self, a: &txn::replica_audit::ReplicaAudit) {
        self.replica_audit = Some(a.line());
        self.replicas_identical = Some(a.ok());
    }

    /// Record the workload's own check (KVS / YCSB: checksums and update count) as
    /// `line`; the invariant holds only if `ok` (call after [`Self::audit`]).
    pub fn workload_check(&mut self, line: String, ok: bool) {
        self.workload_check = Some(line);
        self.invariant_holds &= ok;
    }

    /// Record the Lotus lock-table slots left in use after the run (after
    /// [`Self::audit`]): they count as held locks, and any fails the run.
    pub fn lotus_locks(&mut self, held: u64) {
        self.lotus_locks_held = Some(held);
        self.locks_held += held;
        if held > 0 {
            self.invariant_holds = false;
        }
    }

    /// Record the audit and decide the invariant: money conserved, no lock held (CVT lock
    /// words, and the lock service's locks when there is one), and at least one
    /// committed transaction of every type (a run in which a type never commits has not
    /// tested it).
    pub fn audit(
        &mut self,
        initial: i64,
        final_total: i64,
        cvt_locks_held: u64,
        lockd_locks_held: Option<u64>,
    ) {
        let locks_held = cvt_locks_held + lockd_locks_held.unwrap_or(0);
        self.initial_total = initial;
        self.final_total = final_total;
        self.cvt_locks_held = cvt_locks_held;
        self.lockd_locks_held = lockd_locks_held;
        self.locks_held = locks_held;
        // Over the whole run: a type that committed during the warm-up only was tested.
        let warm = |i: usize| self.warmup_type_commits.get(i).copied().unwrap_or(0);
        self.types_never_committed = self
            .types
            .iter()
            .enumerate()
            .filter(|&(i, t)| t.committed + warm(i) == 0)
            .map(|(_, t)| t.name.clone())
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
        self.serializability = Some(v.line(&|k| self.kind_name(k)));
        self.serializable = Some(v.is_serializable());
        self.checked_committed = v.committed as u64;
        self.dependency_edges = v.edges as u64;
        self.history_bytes_per_txn = history_bytes as f64 / v.committed.max(1) as f64;
        self.check_seconds = took.as_secs_f64();
    }

    /// Record the snapshot-isolation check of the run's (timed) history.
    pub fn snapshot_isolation(&mut self, v: &txn::snapshot_isolation::SiVerdict) {
        self.snapshot_isolation = Some(v.line(&|k| self.kind_name(k)));
        self.snapshot_isolation_holds = Some(v.holds());
    }

    /// True when every check passed: the invariant, no service failure, a serializable
    /// history where required (when checked), a history that satisfies snapshot
    /// isolation where required (when checked), and a survived oracle restart.
    ///
    /// An UNSAFE variant's run ([`Report::unsafe_variant`]) is not judged: it passes
    /// unless a service failed (its output says "checks off (UNSAFE)", never that
    /// checks passed).
    pub fn passed(&self) -> bool {
        if self.unsafe_variant.is_some() {
            return self.fatal_errors == 0;
        }
        self.invariant_holds
            && self.fatal_errors == 0
            && self.replicas_identical != Some(false)
            && self.durable != Some(false)
            && self.sr_passed()
            && self.si_passed()
            && self.tso_restart.as_ref().is_none_or(TsoRestart::survived)
            && self
                .lockd_restart
                .as_ref()
                .is_none_or(LockdRestart::survived)
            && self.etcd_restart.as_ref().is_none_or(EtcdRestart::survived)
    }

    fn sr_passed(&self) -> bool {
        !self.serializability_required || self.serializable != Some(false)
    }

    fn si_passed(&self) -> bool {
        !self.snapshot_isolation_required || self.snapshot_isolation_holds != Some(false)
    }

    /// The line of the isolation check this run is judged by (serializability, or
    /// snapshot isolation for `mvcc-si`), `None` when not checked.
    pub fn check_line(&self) -> Option<&str> {
        if self.snapshot_isolation_required {
            self.snapshot_isolation.as_deref()
        } else {
            self.serializability.as_deref()
        }
    }

    /// The human-readable table.
    pub fn render(&self) -> String {
        let mut s = String::new();
        if let Some(l) = &self.unsafe_variant {
            let _ = writeln!(s, "{l}");
        }
        // The failed-lookups column only where lookups can fail (TATP).
        let failed = self.types.iter().any(|r| r.failed_lookups > 0);
        let _ = write!(
            s,
            "{:<20} {:>10} {:>10} {:>9} {:>6} ",
            "type", "attempts", "committed", "aborts", "user"
        );
        if failed {
            let _ = write!(s, "{:>8} ", "failed");
        }
        let _ = writeln!(
            s,
            "{:>10} {:>9} {:>9}  top abort reasons",
            "abort-rate", "p50(us)", "p99(us)"
        );
        for r in &self.types {
            let _ = write!(
                s,
                "{:<20} {:>10} {:>10} {:>9} {:>6} ",
                r.name, r.attempts, r.committed, r.aborts, r.user_aborts
            );
            if failed {
                let _ = write!(s, "{:>8} ", r.failed_lookups);
            }
            let reasons = if r.abort_reasons.is_empty() {
                "-".to_string()
            } else {
                r.abort_reasons
                    .iter()
                    .take(2)
                    .map(|(n, c)| format!("{n} {:.0}%", 100.0 * *c as f64 / r.aborts.max(1) as f64))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let _ = writeln!(
                s,
                "{:>9.2}% {:>9.1} {:>9.1}  {reasons}",
                100.0 * r.abort_rate,
                r.p50_us,
                r.p99_us
            );
        }
        if let Some(o) = &self.outcomes {
            let _ = writeln!(s, "{o}");
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
        if self.warmup_s > 0.0 {
            let _ = writeln!(
                s,
                "warm-up: {:.1} s before the measured window, {} committed (not measured; checked)",
                self.warmup_s, self.warmup_committed
            );
        }
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
        let [r, w, a] = self.memnode_ops_per_commit;
        let _ = writeln!(
            s,
            "memory-node ops per committed transaction: {r:.2} READs, {w:.2} WRITEs, {a:.2} atomics"
        );
        if let Some(v) = &self.vtc {
            // Read-only transactions take no lock, so never use the cache (a deviation
            // from Lotus 8.2, which serves their reads too).
            let _ = writeln!(s, "{} (lock holders only)", v.line());
        }
        if let Some(r) = &self.routing {
            let commits: u64 = self.types.iter().map(|t| t.committed).sum();
            let _ = writeln!(
                s,
                "routing: {r} ({:.2} draws thrown away per committed transaction, {} run off their shard; {:.2} RPC requests per committed transaction)",
                self.route_redraws as f64 / commits.max(1) as f64,
                self.route_misses,
                self.rpc_messages_per_commit
            );
            if let Some([p50, p99]) = self.forward_p50_p99_us {
                let _ = writeln!(
                    s,
                    "forwarded: {} read-write transactions sent to their home compute node ({:.0} B each), from generation p50 {p50:.1} us p99 {p99:.1} us (the table times them from arrival there)",
                    self.forwarded, self.forward_bytes
                );
            }
        }
        if self.qp_errors > 0 || self.transient_retries > 0 {
            let _ = writeln!(
                s,
                "transport faults: {} QPs to memory node 0 moved to the error state, {} one-sided operations retried on a new QP",
                self.qp_errors, self.transient_retries
            );
        }
        if !self.tocc_share.is_empty() {
            let _ = writeln!(s, "{}", crate::breakdown::tocc_line(&self.tocc_share));
        }
        if let Some([sent, taken]) = self.lock_reads {
            let _ = writeln!(
                s,
                "lock-and-read (locks on the memnodes): {sent} RPCs, {taken} objects came with \
                 their grant and needed no READ ({:.1}%)",
                if sent > 0 {
                    100.0 * taken as f64 / sent as f64
                } else {
                    0.0
                }
            );
        }
        if !self.cpu.is_empty() {
            let _ = writeln!(s, "{}", crate::breakdown::cpu_line(&self.cpu));
        }
        if let Some(rows) = &self.breakdown {
            s.push_str(&crate::breakdown::render(&self.protocol, rows));
        }
        for e in &self.cnode_events {
            let _ = writeln!(s, "{e}");
        }
        if let Some(t) = &self.timeline {
            s.push_str(&t.render());
        }
        for f in &self.fatal_samples {
            let _ = writeln!(s, "service failure: {f}");
        }
        let mut lockd = match self.lockd_locks_held {
            Some(n) => format!(", lock service {n}"),
            None => String::new(),
        };
        if let Some(n) = self.lotus_locks_held {
            lockd.push_str(&format!(", Lotus lock table {n}"));
        }
        match &self.workload_check {
            Some(line) => {
                let _ = writeln!(
                    s,
                    "{line}; locks held after run: {} (CVT lock words {}{lockd})",
                    self.locks_held, self.cvt_locks_held,
                );
            }
            None => {
                let _ = writeln!(
                    s,
                    "money: initial {} + net committed {} = {} expected, {} found; locks held after run: {} (CVT lock words {}{lockd})",
                    self.initial_total,
                    self.net_committed,
                    self.initial_total + self.net_committed,
                    self.final_total,
                    self.locks_held,
                    self.cvt_locks_held,
                );
            }
        }
        if let Some(f) = &self.failover {
            let _ = writeln!(s, "{}", f.line());
            for l in f.restart.iter().flat_map(|r| r.lines()) {
                let _ = writeln!(s, "{l}");
            }
        }
        if let Some(l) = &self.durability {
            let _ = writeln!(s, "{l}");
        }
        if let Some(l) = &self.replica_audit {
            let _ = writeln!(s, "{l}");
        }
        // The check the run is judged by first, then the informative one.
        let sr = self.serializability.as_deref();
        let si = self.snapshot_isolation.as_deref();
        let (judged, informative) = if self.snapshot_isolation_required {
            (si, sr)
        } else {
            (sr, si)
        };
        if let Some(line) = judged {
            let _ = writeln!(s, "{line}");
        }
        if let Some(line) = informative {
            let why = if self.snapshot_isolation_required {
                "informative, SI allows write skew"
            } else {
                "informative"
            };
            let _ = writeln!(s, "({why}) {line}");
        }
        if let Some(r) = &self.tso_restart {
            let _ = writeln!(
                s,
                "tso restart: SIGKILL at {:.1} s, epoch {} -> {}, {} committed before the restarted oracle was ready, {} after; thread epochs {:?}{}: {}",
                r.killed_at_s,
                r.epoch_before,
                r.epoch_after,
                r.committed_before_ready,
                r.committed_after_ready,
                r.thread_epochs,
                if r.uses_tso { "" } else { " (the protocol takes no timestamps)" },
                if r.survived() { "survived" } else { "NOT SURVIVED" }
            );
        }
        if let Some(r) = &self.etcd_restart {
            let e = |x: Option<u64>| x.map_or("-".to_string(), |x| x.to_string());
            let _ = writeln!(
                s,
                "view service: etcd SIGKILLed at {:.1} s, back from its data directory in {:.0} ms; view epoch {} read back (published {}); at the end epoch {} stored, {} published; {} committed before it was back, {} after: {}",
                r.killed_at_s,
                r.back_ms,
                e(r.epoch_read_back),
                e(r.epoch_published),
                e(r.final_stored),
                e(r.final_published),
                r.committed_before_ready,
                r.committed_after_ready,
                if r.survived() { "survived" } else { "NOT SURVIVED" }
            );
        }
        if let Some(r) = &self.lockd_restart {
            let _ = writeln!(
                s,
                "lockd restart: SIGKILL at {:.1} s, epoch {} -> {}, grants refused for {} ms after its start, {} committed before the restarted service was ready, {} after; reconnects per thread {:?}: {}",
                r.killed_at_s,
                r.epoch_before,
                r.epoch_after,
                r.grace_ms,
                r.committed_before_ready,
                r.committed_after_ready,
                r.thread_reconnects,
                if r.survived() { "survived" } else { "NOT SURVIVED" }
            );
        }
        if self.unsafe_variant.is_some() {
            // Lost updates are expected: the money line above is informative.
            let _ = writeln!(
                s,
                "checks off (UNSAFE): the money and lock audits above are not judged, no history checked"
            );
            return s;
        }
        if !self.sr_passed() {
            let _ = writeln!(s, "CHECK FAILED: the history is not serializable");
        }
        if !self.si_passed() {
            let _ = writeln!(s, "CHECK FAILED: the history violates snapshot isolation");
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

/// A ratio of two protocols' results at one point of a comparison.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct Ratio {
    /// What is compared: `p99 scythe/occ-cas` or `throughput mvcc/occ-cas` (`mvcc-si`
    /// when MVCC ran at snapshot isolation).
    pub name: String,
    /// The sweep point (`None` without a sweep).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub point: Option<String>,
    /// The ratio; `None` when the denominator is zero. With `--rounds N`, the median of
    /// the rounds' values.
    pub value: Option<f64>,
    /// With `--rounds N` (N > 1): the ratio within each round that has one, in round
    /// order (`value` is their median).
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub rounds: Vec<f64>,
}

impl Ratio {
    /// A ratio of one run (or one round): no per-round values.
    fn of(name: impl Into<String>, point: Option<String>, value: Option<f64>) -> Self {
        Self {
            name: name.into(),
            point,
            value,
            rounds: Vec::new(),
        }
    }

    /// `ratio <name> = <value>` (two decimals, `n/a` without a value), followed by
    /// ` (<point>)` in a sweep.
    pub fn line(&self) -> String {
        let mut v = self
            .value
            .map_or_else(|| "n/a".to_string(), |v| format!("{v:.2}"));
        if self.rounds.len() > 1 {
            let each: Vec<String> = self.rounds.iter().map(|r| format!("{r:.2}")).collect();
            v.push_str(&format!(
                " (median of {} rounds: {})",
                self.rounds.len(),
                each.join(" ")
            ));
        }
        match &self.point {
            Some(p) => format!("ratio {} = {v} ({p})", self.name),
            None => format!("ratio {} = {v}", self.name),
        }
    }
}

/// The ratios the comparison reports, per point (in the order the runs came), then across
/// the points of `--sweep range-index=off,on` (each protocol's throughput with range scans
/// over with cursor rows), of `--sweep lock-placement=lockd,memnode` (each protocol's
/// throughput and p99 with Scythe's locks on the memory nodes over on a lockd node,
/// `throughput scythe memnode/lockd`) and of `--sweep replicas=...` (each protocol's
/// throughput at every later point over its first, `throughput mvcc replicas 3/1`: what
/// the copies cost, Motor 7.2): p99 of
/// `scythe` over `occ-cas`, throughput of MVCC (`mvcc` or `mvcc-si`) and of Lotus over
/// `occ-cas`, throughput and p50 of Lotus over MVCC at the same isolation, and
/// throughput of the UNSAFE no-CAS variant over its MVCC (`mvcc-nocas/mvcc`, Lotus's
/// Fig. 3 premise), wherever both protocols of a ratio ran.
pub fn ratios<R: std::borrow::Borrow<Report>>(runs: &[R]) -> Vec<Ratio> {
    let runs: Vec<&Report> = runs.iter().map(|r| r.borrow()).collect();
    let runs = &runs[..];
    let mut out = per_point_ratios(runs);
    // `--sweep range-index=off,on`: each protocol with range scans over with cursor rows.
    let at = |r: &&Report, p: &str| r.point.as_deref() == Some(p);
    for on in runs.iter().filter(|r| at(r, "range-index=on")) {
        if let Some(off) = runs
            .iter()
            .find(|r| at(r, "range-index=off") && r.protocol == on.protocol)
        {
            out.push(throughput_ratio("range-index on/off", on, off));
        }
    }
    // `--sweep lock-placement=lockd,memnode`: each protocol with its locks on the memory
    // nodes over on a lockd node, throughput and p99.
    // With the points repeated (`lock-placement=lockd,memnode,lockd,memnode`), the k-th
    // memnode run of a protocol over its k-th lockd run.
    for m in runs.iter().filter(|r| at(r, "lock-placement=memnode")) {
        let same = |r: &&&Report, point: &str| at(r, point) && r.protocol == m.protocol;
        let kth = runs
            .iter()
            .filter(|r| same(r, "lock-placement=memnode"))
            .position(|r| std::ptr::eq(*r, *m))
            .unwrap_or(0);
        if let Some(l) = runs
            .iter()
            .filter(|r| same(r, "lock-placement=lockd"))
            .nth(kth)
        {
            out.push(throughput_ratio("memnode/lockd", m, l));
            out.push(Ratio::of(
                format!("p99 {} memnode/lockd", m.protocol),
                None,
                (l.p99_us > 0.0).then(|| m.p99_us / l.p99_us),
            ));
        }
    }
    // `--sweep replicas=R1,R2,...`: each protocol at every later point over its first.
    fn copies(r: &Report) -> Option<&str> {
        r.point.as_deref()?.strip_prefix("replicas=")
    }
    if let Some(first) = runs.iter().copied().find_map(copies) {
        for base in runs.iter().filter(|r| copies(r) == Some(first)) {
            for r in runs
                .iter()
                .filter(|r| r.protocol == base.protocol && copies(r).is_some_and(|c| c != first))
            {
                let what = format!("replicas {}/{first}", copies(r).unwrap_or("?"));
                out.push(throughput_ratio(&what, r, base));
            }
        }
    }
    out
}

/// One protocol's throughput at one sweep point over another's (`num` and `den` ran the
/// same protocol): `throughput <protocol> <what>`, across the points.
fn throughput_ratio(what: &str, num: &Report, den: &Report) -> Ratio {
    Ratio::of(
        format!("throughput {} {what}", num.protocol),
        None,
        (den.throughput_tps > 0.0).then(|| num.throughput_tps / den.throughput_tps),
    )
}

fn per_point_ratios(runs: &[&Report]) -> Vec<Ratio> {
    let mut points: Vec<&Option<String>> = Vec::new();
    for r in runs {
        if !points.contains(&&r.point) {
            points.push(&r.point);
        }
    }
    let div = |a: f64, b: f64| (b > 0.0).then(|| a / b);
    let mut out = Vec::new();
    for p in points {
        let find = |f: &dyn Fn(&str) -> bool| runs.iter().find(|r| &r.point == p && f(&r.protocol));
        // Lotus against its baseline Motor (MVCC) at the same isolation (Lotus Fig. 13).
        if let Some(lo) = find(&|n| n.starts_with("lotus")) {
            let iso = lo.protocol.strip_prefix("lotus").unwrap_or("");
            if let Some(mv) = find(&|n| n.strip_prefix("mvcc") == Some(iso)) {
                out.push(Ratio::of(
                    format!("throughput {}/{}", lo.protocol, mv.protocol),
                    p.clone(),
                    div(lo.throughput_tps, mv.throughput_tps),
                ));
                out.push(Ratio::of(
                    format!("p50 {}/{}", lo.protocol, mv.protocol),
                    p.clone(),
                    div(lo.p50_us, mv.p50_us),
                ));
            }
        }
        // Lotus's Fig. 3 premise: the UNSAFE no-CAS variant against its MVCC.
        if let Some(nocas) = find(&|n| n.ends_with(NO_CAS_SUFFIX)) {
            let base = nocas.protocol.trim_end_matches(NO_CAS_SUFFIX);
            if let Some(mv) = find(&|n| n == base) {
                out.push(Ratio::of(
                    format!("throughput {}/{base}", nocas.protocol),
                    p.clone(),
                    div(nocas.throughput_tps, mv.throughput_tps),
                ));
            }
        }
        let Some(occ) = find(&|n| n == "occ-cas") else {
            continue;
        };
        if let Some(sc) = find(&|n| n == "scythe") {
            out.push(Ratio::of(
                "p99 scythe/occ-cas",
                p.clone(),
                div(sc.p99_us, occ.p99_us),
            ));
            out.push(Ratio::of(
                "throughput scythe/occ-cas",
                p.clone(),
                div(sc.throughput_tps, occ.throughput_tps),
            ));
        }
        for mv in [
            find(&|n| n.starts_with("mvcc")),
            find(&|n| n.starts_with("lotus")),
        ]
        .into_iter()
        .flatten()
        {
            out.push(Ratio::of(
                format!("throughput {}/occ-cas", mv.protocol),
                p.clone(),
                div(mv.throughput_tps, occ.throughput_tps),
            ));
        }
        // TPC-C's headline type (tpmC counts NEW-ORDER): its own p99 ratio.
        let p99_of = |r: &Report, ty: &str| r.types.iter().find(|t| t.name == ty).map(|t| t.p99_us);
        if let (Some(sc), Some(o)) = (find(&|n| n == "scythe"), p99_of(occ, "NewOrder")) {
            if let Some(s99) = p99_of(sc, "NewOrder") {
                out.push(Ratio::of(
                    "p99 NewOrder scythe/occ-cas",
                    p.clone(),
                    div(s99, o),
                ));
            }
        }
    }
    out
}

/// What the output of an UNSAFE no-CAS run (`txn-bench --unsafe-no-cas`,
/// `--fig3-premise`) says first.
pub const UNSAFE_LABEL: &str = "UNSAFE: mvcc without lock CAS (Lotus Fig. 3 premise), checks off";

/// The suffix of the UNSAFE no-CAS variant's protocol name (`mvcc-nocas`).
pub const NO_CAS_SUFFIX: &str = "-nocas";

/// The ratio below which a timing model does not reproduce the memory nodes' CAS
/// bottleneck (Lotus Fig. 3 shows 2.4x; this project asks at least this much before it calls
/// the premise reproduced).
pub const PREMISE_MIN_RATIO: f64 = 1.5;

/// Abort rates of MVCC and its no-CAS variant further apart than this (fraction of
/// attempts) mean lock conflicts, not the CAS unit, set the premise's ratio (Lotus's
/// Fig. 3 keeps abort rates "largely unchanged" with 20 M accounts).
pub const PREMISE_MAX_ABORT_GAP: f64 = 0.05;

/// The verdict on Lotus's Fig. 3 premise, for each `throughput mvcc-nocas/mvcc` ratio
/// among `ratios` of `runs`: whether it reaches [`PREMISE_MIN_RATIO`], and what follows
/// if not; a ratio inflated by lock conflicts (abort rates more than
/// [`PREMISE_MAX_ABORT_GAP`] apart) is not taken as the premise. `None` without such a
/// ratio.
pub fn premise_verdict(runs: &[Report], ratios: &[Ratio]) -> Option<String> {
    let lines: Vec<String> = ratios
        .iter()
        .filter(|r| r.name.contains(NO_CAS_SUFFIX))
        .map(|r| {
            let at = r.point.as_ref().map_or_else(String::new, |p| format!(" ({p})"));
            // Over `--rounds`, the median of the runs' abort rates.
            let abort = |nocas: bool| {
                let of: Vec<f64> = runs
                    .iter()
                    .filter(|x| x.point == r.point && x.protocol.ends_with(NO_CAS_SUFFIX) == nocas)
                    .map(|x| x.abort_rate)
                    .collect();
                if of.is_empty() {
                    0.0
                } else {
                    crate::peers::rounds::median(of)
                }
            };
            let (with, without) = (abort(false), abort(true));
            match r.value {
                Some(_) if (with - without).abs() > PREMISE_MAX_ABORT_GAP => format!(
                    "Fig. 3 premise NOT tested{at}: abort rates {:.1}% (mvcc) and {:.1}% (no-CAS) differ, so lock conflicts set the ratio, not the CAS unit; run with less contention (--theta 0, more --accounts; Lotus used 20 M)",
                    100.0 * with,
                    100.0 * without
                ),
                Some(v) if v >= PREMISE_MIN_RATIO => format!(
                    "Fig. 3 premise holds{at}: no-CAS MVCC runs {v:.2}x MVCC (>= {PREMISE_MIN_RATIO}x) at similar abort rates: the memory nodes' CAS unit is the bottleneck"
                ),
                Some(v) => format!(
                    "Fig. 3 premise NOT reproduced{at}: no-CAS MVCC runs {v:.2}x MVCC (< {PREMISE_MIN_RATIO}x): the CAS bottleneck does not form under this model and shape, so throughput ratios between protocols under it say nothing about Lotus's gain"
                ),
                None => format!("Fig. 3 premise{at}: n/a (MVCC committed nothing)"),
            }
        })
        .collect();
    (!lines.is_empty()).then(|| lines.join("\n"))
}

/// The first `n` abort reasons by count, each with its share of the conflict aborts.
fn top_reasons(r: &Report, n: usize) -> String {
    let total: u64 = r.abort_reasons.iter().map(|(_, c)| c).sum();
    let mut v: Vec<&(String, u64)> = r.abort_reasons.iter().collect();
    v.sort_by_key(|r| std::cmp::Reverse(r.1));
    if v.is_empty() {
        return "none".into();
    }
    v.iter()
        .take(n)
        .map(|(name, c)| format!("{name} {:.0}%", 100.0 * *c as f64 / total.max(1) as f64))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A serializability line cut to its verdict: `serializability: CYCLE of 3
/// transactions` (the cycle itself is in the run's report).
fn short_line(line: &str) -> &str {
    match line.match_indices(':').nth(1) {
        Some((i, _)) => &line[..i],
        None => line,
    }
}

/// The comparison table of several runs: per run (and sweep point) committed/s, p50,
/// p99, abort rate, the top abort reasons, the invariant of the workload's check (SmallBank's
/// money audit, KVS's checksums and update count), whether the run
/// passed, and the line of the isolation check the run is judged by (serializability;
/// snapshot isolation for `mvcc-si`), followed by the other check's verdict where it is
/// informative.
pub fn comparison(runs: &[Report]) -> String {
    let sweep = runs.iter().any(|r| r.point.is_some());
    let rounds = runs.iter().any(|r| r.round.is_some());
    let mut header = vec![];
    if rounds {
        header.push("round");
    }
    if sweep {
        header.push("point");
    }
    header.extend([
        "protocol",
        "committed/s",
        "p50(us)",
        "p99(us)",
        "abort-rate",
        "top abort reasons",
        "invariant (workload check)",
        "result",
        "isolation check",
    ]);
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
    for r in runs {
        let mut row = Vec::new();
        if rounds {
            row.push(r.round.map_or_else(String::new, |k| k.to_string()));
        }
        if sweep {
            row.push(r.point.clone().unwrap_or_default());
        }
        let mut check = r
            .check_line()
            .map_or_else(|| "not checked (--no-check)".to_string(), str::to_string);
        let informative = if r.snapshot_isolation_required {
            r.serializability
                .as_deref()
                .map(|l| short_line(l).to_string())
        } else {
            r.snapshot_isolation_holds.map(|h| {
                format!(
                    "snapshot isolation {}",
                    if h { "holds" } else { "VIOLATED" }
                )
            })
        };
        if let Some(l) = informative {
            check.push_str(&format!(" | informative: {l}"));
        }
        row.extend([
            r.protocol.clone(),
            format!("{:.0}", r.throughput_tps),
            format!("{:.1}", r.p50_us),
            format!("{:.1}", r.p99_us),
            format!("{:.2}%", 100.0 * r.abort_rate),
            top_reasons(r, 3),
            if r.unsafe_variant.is_some() {
                "not judged".into()
            } else if r.invariant_holds {
                "invariant holds".into()
            } else {
                "INVARIANT VIOLATED".into()
            },
            if r.unsafe_variant.is_some() && r.fatal_errors == 0 {
                "checks off (UNSAFE)".into()
            } else if r.passed() {
                "passed".into()
            } else if r.fatal_errors > 0 {
                format!("FAILED ({} service failures)", r.fatal_errors)
            } else {
                "FAILED".into()
            },
            check,
        ]);
        rows.push(row);
    }
    let cols = rows[0].len();
    let width: Vec<usize> = (0..cols)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    // Numbers right-aligned, text left-aligned; the last column unpadded.
    let numeric = |c: usize| {
        let c = c.wrapping_sub(usize::from(sweep) + usize::from(rounds));
        (1..=4).contains(&c)
    };
    let mut s = String::new();
    for row in &rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c > 0 {
                line.push_str(" | ");
            }
            if c + 1 == cols {
                line.push_str(cell);
            } else if numeric(c) {
                let _ = write!(line, "{cell:>w$}", w = width[c]);
            } else {
                let _ = write!(line, "{cell:<w$}", w = width[c]);
            }
        }
        let _ = writeln!(s, "{}", line.trim_end());
    }
    s
}

#[cfg(test)]
pub(crate) mod tests {
    const SMALLBANK_KINDS: [&str; 6] = [
        "Amalgamate",
        "Balance",
        "DepositChecking",
        "SendPayment",
        "TransactSaving",
        "WriteCheck",
    ];
    use super::*;

    /// An oracle restart is survived with commits after it and, for a protocol that
    /// takes timestamps, every thread on the new epoch; OCC-CAS's threads never meet it.
    #[test]
    fn an_etcd_restart_is_survived_only_if_the_view_came_back_and_commits_went_on() {
        let ok = EtcdRestart {
            killed_at_s: 0.5,
            back_ms: 300.0,
            epoch_published: Some(1),
            epoch_read_back: Some(1),
            final_published: Some(7),
            final_stored: Some(7),
            committed_before_ready: 10,
            committed_after_ready: 20,
        };
        assert!(ok.survived());
        // etcd came back without its data: the stored view is gone.
        let lost = EtcdRestart {
            epoch_read_back: None,
            ..ok.clone()
        };
        assert!(!lost.survived());
        // A later view never reached etcd.
        let stale = EtcdRestart {
            final_stored: Some(5),
            ..ok.clone()
        };
        assert!(!stale.survived());
        let stalled = EtcdRestart {
            committed_after_ready: 0,
            ..ok
        };
        assert!(!stalled.survived());
    }

    #[test]
    fn a_tso_restart_needs_every_thread_on_the_new_epoch_only_if_it_takes_timestamps() {
        let mut r = TsoRestart {
            killed_at_s: 1.0,
            epoch_before: 1,
            epoch_after: 2,
            committed_before_ready: 10,
            committed_after_ready: 10,
            thread_epochs: vec![2, 1],
            uses_tso: true,
        };
        assert!(!r.survived());
        r.uses_tso = false;
        assert!(r.survived());
        r.committed_after_ready = 0;
        assert!(!r.survived());
    }
    use txn::history::{Access, History};

    fn report_with_commits(per_type: &[u64]) -> Report {
        let mut w = WorkerStats::with_kinds(SMALLBANK_KINDS.len());
        for (t, &n) in w.types.iter_mut().zip(per_type) {
            for _ in 0..n {
                t.attempts += 1;
                t.record_commit(Duration::from_micros(50));
            }
        }
        Report::with_kinds(
            &SMALLBANK_KINDS,
            "shm".into(),
            1,
            1,
            100,
            0.99,
            Duration::from_secs(1),
            &[w],
        )
    }

    #[test]
    fn a_type_that_never_committed_breaks_the_invariant() {
        let mut r = report_with_commits(&[3, 3, 3, 3, 3, 3]);
        r.audit(1000, 1000, 0, None);
        assert!(r.invariant_holds && r.passed());
        assert!(r.render().ends_with("invariant holds\n"));

        let mut r = report_with_commits(&[3, 0, 3, 3, 3, 0]);
        r.audit(1000, 1000, 0, None);
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
        r.audit(1000, 999, 0, None);
        assert!(!r.invariant_holds);
        let mut r = report_with_commits(&[1; 6]);
        r.audit(1000, 1000, 1, None);
        assert!(!r.invariant_holds);
        let mut r = report_with_commits(&[1; 6]);
        r.audit(1000, 1000, 0, Some(1));
        assert!(!r.invariant_holds);
        assert_eq!(r.locks_held, 1);
        assert!(
            r.render()
                .contains("locks held after run: 1 (CVT lock words 0, lock service 1)"),
            "{}",
            r.render()
        );
    }

    #[test]
    fn the_warm_up_restarts_the_reported_counters_and_keeps_the_checked_state() {
        let mut s = WorkerStats::with_kinds(2);
        s.breakdown = Some(crate::breakdown::Breakdown::with_kinds(2));
        s.types[0].attempts = 4;
        s.types[0].record_commit(Duration::from_micros(30));
        s.types[1].record_commit(Duration::from_micros(50));
        s.types[1].record_abort(AbortReason::ALL[0]);
        s.abort_reasons[0] = 1;
        s.net = 7;
        s.inserted.push(42);
        s.route.redraws = 3;
        s.forward.count = 2;
        s.timeline.count(0, true);
        s.timeline.count(0, false);
        let mut h = History::new(usize::MAX);
        h.record(1, &[Access::read(0, 1, 1), Access::write(0, 1, 2)]);
        s.history = Some(h);
        s.restart_window();
        // Reported: restarted.
        for t in &s.types {
            assert_eq!((t.attempts, t.commits, t.aborts), (0, 0, 0));
            assert!(t.hist.is_empty());
        }
        assert_eq!(s.abort_reasons.iter().sum::<u64>(), 0);
        assert_eq!((s.route.redraws, s.forward.count), (0, 0));
        assert_eq!(s.timeline.commits, [0], "zeroed in place, intervals kept");
        assert_eq!(s.timeline.aborts, [0]);
        assert!(s.breakdown.is_some());
        // Checked: kept, the warm-up's commits counted apart.
        assert_eq!((s.net, s.inserted.as_slice()), (7, &[42][..]));
        assert_eq!(s.history.as_ref().map(|h| h.len()), Some(1));
        assert_eq!(s.warmup_commits, [1, 1]);

        // The report: only what followed the warm-up, and a type that committed in the
        // warm-up only still counts as tested.
        s.types[0].record_commit(Duration::from_micros(20));
        let mut r = Report::with_kinds(
            &["a", "b"],
            "shm".into(),
            1,
            1,
            10,
            0.0,
            Duration::from_secs(1),
            std::slice::from_ref(&s),
        );
        assert_eq!(r.types[0].committed, 1);
        assert_eq!(r.types[1].committed, 0);
        assert_eq!(r.warmup_committed, 2);
        assert_eq!(r.throughput_tps, 1.0);
        assert_eq!(r.net_committed, 7);
        r.audit(0, 7, 0, None);
        assert!(r.types_never_committed.is_empty());
        assert!(r.invariant_holds);
        // Without the warm-up's commits type b never committed.
        s.warmup_commits.clear();
        let mut r = Report::with_kinds(
            &["a", "b"],
            "shm".into(),
            1,
            1,
            10,
            0.0,
            Duration::ZERO,
            std::slice::from_ref(&s),
        );
        r.audit(0, 7, 0, None);
        assert_eq!(r.types_never_committed, ["b"]);
        assert_eq!(r.throughput_tps, 0.0, "an empty window measures nothing");
    }

    #[test]
    fn the_serializability_line_follows_the_money_line_and_a_cycle_fails_the_run() {
        let mut h = History::new(usize::MAX);
        h.record(4, &[Access::read(0, 1, 1), Access::write(0, 1, 2)]);
        h.record(5, &[Access::read(0, 1, 2), Access::write(0, 1, 3)]);
        let mut r = report_with_commits(&[1; 6]);
        r.audit(1000, 1000, 0, None);
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

    /// A checked run of `protocol` with every SmallBank type committed, for the
    /// comparison's tests (here, in `txnbench::rounds` and in `ablation`).
    pub(crate) fn run_of(protocol: &str, tps: f64, p99: f64) -> Report {
        let mut r = report_with_commits(&[1; 6]);
        r.protocol = protocol.into();
        r.throughput_tps = tps;
        r.p99_us = p99;
        r.audit(1000, 1000, 0, None);
        r
    }

    #[test]
    fn comparison_gives_the_ratios_and_judges_mvcc_si_by_its_si_line() {
        let mut h = History::new(usize::MAX);
        h.record(4, &[Access::read(0, 1, 1), Access::write(0, 1, 2)]);
        let sr = txn::serializability::check(&h);
        // A write skew: acyclic under SI's check, a cycle for serializability.
        let mut skew = History::new(usize::MAX);
        skew.record_timed(
            0,
            10,
            20,
            3,
            [
                Access::read(0, 1, 1),
                Access::read(1, 1, 1),
                Access::write(0, 1, 20),
            ]
            .into_iter(),
        );
        skew.record_timed(
            1,
            11,
            21,
            3,
            [
                Access::read(0, 1, 1),
                Access::read(1, 1, 1),
                Access::write(1, 1, 21),
            ]
            .into_iter(),
        );
        let mut runs = vec![
            run_of("occ-cas", 1000.0, 400.0),
            run_of("scythe", 1500.0, 200.0),
            run_of("mvcc-si", 3000.0, 100.0),
        ];
        for r in &mut runs[..2] {
            r.serializability(&sr, h.bytes(), Duration::ZERO);
        }
        let si = &mut runs[2];
        si.serializability_required = false;
        si.snapshot_isolation_required = true;
        si.serializability(
            &txn::serializability::check(&skew),
            skew.bytes(),
            Duration::ZERO,
        );
        si.snapshot_isolation(&txn::snapshot_isolation::check(&skew));
        assert_eq!(si.serializable, Some(false));
        assert_eq!(
            si.snapshot_isolation_holds,
            Some(true),
            "{:?}",
            si.snapshot_isolation
        );
        assert!(si.passed(), "the SR line is informative for mvcc-si");

        let lines: Vec<String> = ratios(&runs).iter().map(Ratio::line).collect();
        assert_eq!(
            lines,
            [
                "ratio p99 scythe/occ-cas = 0.50",
                "ratio throughput scythe/occ-cas = 1.50",
                "ratio throughput mvcc-si/occ-cas = 3.00"
            ]
        );
        let table = comparison(&runs);
        let rows: Vec<&str> = table.lines().collect();
        assert_eq!(rows.len(), 4, "{table}");
        assert!(rows[0].starts_with("protocol "), "{table}");
        assert!(
            rows[1].contains("serializability: 1 committed, 0 edges, acyclic"),
            "{table}"
        );
        assert!(rows[2].contains("| passed |"), "{table}");
        assert!(
            rows[3].contains("snapshot isolation: 2 committed")
                && rows[3].contains("informative: serializability: CYCLE of 2 transactions"),
            "{table}"
        );
        // The same mvcc-si history judged as serializable fails the run.
        runs[2].serializability_required = true;
        runs[2].snapshot_isolation_required = false;
        assert!(!runs[2].passed());
        assert!(comparison(&runs)
            .lines()
            .nth(3)
            .unwrap()
            .contains("| FAILED |"));
        assert!(runs[2]
            .render()
            .contains("CHECK FAILED: the history is not serializable"));
    }

    #[test]
    fn ratios_per_sweep_point_and_only_where_both_ran() {
        let mut runs = vec![
            run_of("occ-cas", 1000.0, 400.0),
            run_of("mvcc", 500.0, 100.0),
            run_of("occ-cas", 0.0, 0.0),
            run_of("scythe", 10.0, 300.0),
            run_of("scythe", 10.0, 300.0),
        ];
        for (r, p) in
            runs.iter_mut()
                .zip(["theta=0", "theta=0", "theta=1.2", "theta=1.2", "theta=2"])
        {
            r.point = Some(p.into());
        }
        let lines: Vec<String> = ratios(&runs).iter().map(Ratio::line).collect();
        assert_eq!(
            lines,
            [
                "ratio throughput mvcc/occ-cas = 0.50 (theta=0)",
                "ratio p99 scythe/occ-cas = n/a (theta=1.2)",
                "ratio throughput scythe/occ-cas = n/a (theta=1.2)"
            ]
        );
        assert!(comparison(&runs)
            .lines()
            .next()
            .unwrap()
            .starts_with("point "));
    }

    /// The last two ratio lines of runs of occ-cas and mvcc at two sweep points
    /// (`[(point, occ-cas tps, mvcc tps); 2]`).
    fn across_points(points: [(&str, f64, f64); 2]) -> Vec<String> {
        let runs: Vec<Report> = points
            .iter()
            .flat_map(|&(p, occ, mvcc)| {
                [run_of("occ-cas", occ, 400.0), run_of("mvcc", mvcc, 100.0)].map(|mut r| {
                    r.point = Some(p.into());
                    r
                })
            })
            .collect();
        let lines: Vec<String> = ratios(&runs).iter().map(Ratio::line).collect();
        lines[lines.len() - 2..].to_vec()
    }

    #[test]
    fn a_range_index_sweep_compares_each_protocol_across_its_points() {
        assert_eq!(
            across_points([
                ("range-index=off", 1000.0, 800.0),
                ("range-index=on", 700.0, 400.0)
            ]),
            [
                "ratio throughput occ-cas range-index on/off = 0.70",
                "ratio throughput mvcc range-index on/off = 0.50"
            ]
        );
    }

    #[test]
    fn a_replicas_sweep_compares_each_protocol_with_its_first_point() {
        assert_eq!(
            across_points([("replicas=1", 1000.0, 800.0), ("replicas=3", 600.0, 760.0)]),
            [
                "ratio throughput occ-cas replicas 3/1 = 0.60",
                "ratio throughput mvcc replicas 3/1 = 0.95"
            ]
        );
    }

    /// The UNSAFE no-CAS run: never judged, labelled, its ratio to its MVCC printed and
    /// the premise's verdict said, also when it fails or lock conflicts set the ratio.
    #[test]
    fn the_unsafe_variant_is_not_judged_and_the_premise_is_judged_by_its_ratio() {
        let mvcc = run_of("mvcc", 1000.0, 100.0);
        let mut nocas = run_of("mvcc-nocas", 1800.0, 80.0);
        nocas.unsafe_variant = Some(UNSAFE_LABEL.into());
        nocas.invariant_holds = false; // lost updates: money not conserved
        assert!(nocas.passed(), "not judged");
        let text = nocas.render();
        assert!(text.starts_with(UNSAFE_LABEL), "{text}");
        assert!(text.contains("checks off (UNSAFE)"), "{text}");
        assert!(
            !text.contains("invariant holds") && !text.contains("VIOLATED"),
            "{text}"
        );
        nocas.fatal_errors = 1;
        assert!(!nocas.passed(), "a service failure still fails it");
        nocas.fatal_errors = 0;
        let runs = vec![mvcc, nocas];
        let r = ratios(&runs);
        let lines: Vec<String> = r.iter().map(Ratio::line).collect();
        assert_eq!(lines, ["ratio throughput mvcc-nocas/mvcc = 1.80"]);
        let v = premise_verdict(&runs, &r).unwrap();
        assert!(
            v.starts_with("Fig. 3 premise holds: no-CAS MVCC runs 1.80x"),
            "{v}"
        );
        let table = comparison(&runs);
        assert!(table.contains("| checks off (UNSAFE) |"), "{table}");
        assert!(table.contains("| not judged "), "{table}");
        // Below 1.5x: said so.
        let mut slow = runs;
        slow[1].throughput_tps = 1200.0;
        let v = premise_verdict(&slow, &ratios(&slow)).unwrap();
        assert!(v.starts_with("Fig. 3 premise NOT reproduced"), "{v}");
        // Lock conflicts, not the CAS unit: not taken as the premise.
        let mut skewed = slow;
        skewed[0].abort_rate = 0.9;
        let v = premise_verdict(&skewed, &ratios(&skewed)).unwrap();
        assert!(v.starts_with("Fig. 3 premise NOT tested"), "{v}");
        assert_eq!(premise_verdict(&skewed[..1], &[]), None);
    }
}
