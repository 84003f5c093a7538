//! Coordinator processes (`txn-bench --cnodes N`): each compute node's coordinators
//! (threads x coroutines, the same driver as in `txn-bench`) run in a `cnode` child
//! process of their own, with their own node id, against the cluster `txn-bench`
//! started; so one compute node can be killed, stopped or restarted alone.
//!
//! The child (`txnbench::cnodes::main`, the `cnode` binary) joins the membership in
//! etcd (its incarnation comes from there; it exits when its lease is gone), connects,
//! says `ready` on stdout, waits for `go <t0_ns>` on stdin (or starts at once with `--t0-ns`,
//! as a restarted child does), and runs until a `stop` line on stdin or SIGTERM. While
//! it runs it streams JSON lines ([`Msg`]) to its parent every 100 ms: each thread's
//! commits and aborts per interval, its newly committed transactions (the history,
//! [`crate::history_out::HistoryLine`]), every 500 ms its counters with its latency
//! histograms (HDR V2, hex), and at the end all of these once more and `done`. A child
//! that is killed leaves what it streamed up to its last batch.
//!
//! The parent (`measure`, behind `txn-bench --cnodes`) starts the children, says go, applies the fault flags
//! (`--kill-cn-after [--restart]`, `--stop-cn-after --stop-ms`, `--kill-tso-after`),
//! reports a child that dies and recovers it before anything else (its lease revoked,
//! every memory node's and lockd's fence awaited, then [`crate::recoverer::Recoverer`]:
//! the recovery line; a restarted life starts only after), recovers a life whose lease
//! ended while it still ran (a stopped process), stops the survivors after
//! `--duration`, and merges the streams: one set of per-thread counters for the report,
//! one history for the checks (and `--history-out`), one timeline row per compute node
//! (its incarnations summed).
//!
//! Node ids: compute node `i` is node `NODE_CNODE + i` (101, 102, ...: above the
//! services and `txn-bench`'s own 100), the same for each of its incarnations.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use clap::Parser;
use hdrhistogram::serialization::{Deserializer, Serializer, V2Serializer};
use serde::{Deserialize, Serialize};
use txn::coordinator::{ClusterAddrs, TxnClient};
use txn::history::History;

use crate::history_out::HistoryLine;
use crate::report::WorkerStats;
use crate::txn_args::NODE_CNODE;
use crate::workload::RunClock;

/// A compute node's threads by role, counted from their names in
/// `/proc/self/task/*/comm` (rrpc names its RPC server threads `rpc-server-N`; a
/// compute node names the coordinator threads it starts itself `coordinator-N`): where
/// its lock RPCs are really served, whatever the flags said.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadCensus {
    /// RPC server threads (the lock service's).
    pub rpc_server: usize,
    /// Coordinator threads of their own (not RPC server threads).
    pub coordinator: usize,
}

impl ThreadCensus {
    /// This process's threads now. Errors: `/proc/self/task` cannot be read.
    pub fn of_this_process() -> anyhow::Result<Self> {
        let mut c = Self {
            rpc_server: 0,
            coordinator: 0,
        };
        for t in std::fs::read_dir("/proc/self/task").context("reading /proc/self/task")? {
            let Ok(name) = std::fs::read_to_string(t?.path().join("comm")) else {
                continue; // the thread ended meanwhile
            };
            let name = name.trim_end();
            if name.starts_with("rpc-server-") {
                c.rpc_server += 1;
            } else if name.starts_with("coordinator-") {
                c.coordinator += 1;
            }
        }
        Ok(c)
    }
}

/// How often a child streams its intervals and history.
pub(crate) const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// Flushes between two snapshots of a thread's counters and histograms (500 ms).
pub(crate) const STATS_EVERY: u32 = 5;
/// The interval a child counts in without `--timeline-ms` (for progress lines).
pub(crate) const DEFAULT_INTERVAL_MS: u64 = 100;
/// How long a child may take to connect and say ready, and to finish after `stop`.
pub(crate) const CHILD_TIMEOUT: Duration = Duration::from_secs(60);

/// One line of a child's stream.
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(tag = "msg", rename_all = "kebab-case")]
pub enum Msg {
    /// Connected; waiting for `go` (unless started with `--t0-ns`).
    Ready {
        /// Node id.
        node: u32,
        /// Incarnation.
        incarnation: u32,
        /// Process id.
        pid: u32,
        /// A Lotus compute node: its threads that serve RPCs or run coordinators, as
        /// the kernel names them when it is ready (absent in older streams).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        threads: Option<ThreadCensus>,
    },
    /// Thread `tid`'s commits and aborts of intervals `from..from + commits.len()`
    /// (absolute counts; they replace what an earlier line said of those intervals).
    Interval {
        /// Thread.
        tid: usize,
        /// First interval.
        from: usize,
        /// Commits per interval.
        commits: Vec<u64>,
        /// Attempts that did not commit, per interval.
        aborts: Vec<u64>,
    },
    /// Transactions committed since the last batch.
    History {
        /// One per transaction.
        lines: Vec<HistoryLine>,
    },
    /// Thread `tid`'s counters so far (replacing the last snapshot).
    Stats {
        /// Thread.
        tid: usize,
        /// Counters and histograms.
        stats: Box<WireStats>,
    },
    /// A thread failed (connecting, or it panicked).
    Error {
        /// The error chain.
        error: String,
    },
    /// Every thread finished and said all; the process exits.
    Done,
}

/// One transaction type's counters as they travel.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct WireType {
    attempts: u64,
    commits: u64,
    aborts: u64,
    user_aborts: u64,
    failed_lookups: u64,
    abort_reasons: Vec<u64>,
    /// Latencies of committed transactions, ns: HDR V2 serialized, hex.
    hist: String,
}

/// A thread's [`WorkerStats`] as they travel (its history travels as lines).
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct WireStats {
    types: Vec<WireType>,
    net: i64,
    inserted: Vec<u64>,
    abort_reasons: Vec<u64>,
    fatal: Vec<String>,
    /// sq_full, wrs, doorbells, messages, buckets.
    rpc: [u64; 5],
    tso_epoch: u16,
    tso_reconnects: u64,
    #[serde(default)]
    lock_reconnects: u64,
    #[serde(default)]
    qp_errors: u64,
    /// `--routing ideal`: draws thrown away, transactions run off their shard.
    #[serde(default)]
    route: [u64; 2],
    /// `--routing forward`: transactions sent, their input bytes, and their latency
    /// histogram from generation (HDR V2, hex).
    #[serde(default)]
    forward: (u64, u64, String),
    /// The process's version table cache (the first thread only).
    #[serde(default)]
    vtc: Option<txn::vt_cache::VtCacheStats>,
    #[serde(default)]
    transient_retries: u64,
    /// READs, WRITEs and atomics posted to the memory nodes.
    #[serde(default)]
    memnode_ops: [u64; 3],
    /// (table, attempts, tocc).
    tocc_share: Vec<(String, u64, u64)>,
    /// Lock-and-read RPCs, and grants that brought their object.
    #[serde(default)]
    lock_reads: (u64, u64),
    /// Commits per type during the warm-up (`--warmup`; empty without one).
    #[serde(default)]
    warmup_commits: Vec<u64>,
    /// With `--breakdown`: per type, per column, the histogram (HDR V2, hex;
    /// [`crate::breakdown::Breakdown::encode`]).
    #[serde(default)]
    breakdown: Option<Vec<Vec<String>>>,
}

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub(crate) fn unhex(s: &str) -> anyhow::Result<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        bail!("odd hex length {}", s.len());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|e| anyhow!("bad hex: {e}")))
        .collect()
}

impl WireStats {
    /// `s` as it travels.
    pub fn from_stats(s: &WorkerStats) -> Self {
        let types = s
            .types
            .iter()
            .map(|t| {
                let mut buf = Vec::new();
                let _ = V2Serializer::new().serialize(&t.hist, &mut buf);
                WireType {
                    attempts: t.attempts,
                    commits: t.commits,
                    aborts: t.aborts,
                    user_aborts: t.user_aborts,
                    failed_lookups: t.failed_lookups,
                    abort_reasons: t.abort_reasons.to_vec(),
                    hist: hex(&buf),
                }
            })
            .collect();
        Self {
            types,
            net: s.net,
            inserted: s.inserted.clone(),
            abort_reasons: s.abort_reasons.to_vec(),
            fatal: s.fatal.clone(),
            rpc: [
                s.rpc.sq_full,
                s.rpc.wrs,
                s.rpc.doorbells,
                s.rpc.messages,
                s.rpc.buckets,
            ],
            tso_epoch: s.tso_epoch,
            tso_reconnects: s.tso_reconnects,
            lock_reconnects: s.lock_reconnects,
            qp_errors: s.qp_errors,
            route: [s.route.redraws, s.route.misses],
            forward: {
                let mut buf = Vec::new();
                let _ = V2Serializer::new().serialize(&s.forward.hist, &mut buf);
                (s.forward.count, s.forward.bytes, hex(&buf))
            },
            vtc: s.vtc,
            transient_retries: s.transient_retries,
            memnode_ops: [
                s.memnode_ops.reads,
                s.memnode_ops.writes,
                s.memnode_ops.atomics,
            ],
            tocc_share: s
                .tocc_share
                .iter()
                .map(|t| (t.table.clone(), t.attempts, t.tocc))
                .collect(),
            lock_reads: s.lock_reads,
            warmup_commits: s.warmup_commits.clone(),
            breakdown: s.breakdown.as_ref().map(|b| {
                b.encode()
                    .iter()
                    .map(|t| t.iter().map(|h| hex(h)).collect())
                    .collect()
            }),
        }
    }

    /// Back to counters of `kinds` kinds. Errors: another number of kinds, a histogram
    /// that does not decode.
    pub fn into_stats(self, kinds: usize) -> anyhow::Result<WorkerStats> {
        let mut s = WorkerStats::with_kinds(kinds);
        if self.types.len() != kinds {
            bail!("{} transaction types, expected {kinds}", self.types.len());
        }
        for (t, w) in s.types.iter_mut().zip(self.types) {
            t.attempts = w.attempts;
            t.commits = w.commits;
            t.aborts = w.aborts;
            t.user_aborts = w.user_aborts;
            t.failed_lookups = w.failed_lookups;
            for (a, b) in t.abort_reasons.iter_mut().zip(&w.abort_reasons) {
                *a = *b;
            }
            let bytes = unhex(&w.hist)?;
            let h: hdrhistogram::Histogram<u64> = Deserializer::new()
                .deserialize(&mut bytes.as_slice())
                .map_err(|e| anyhow!("histogram: {e:?}"))?;
            t.hist.add(&h).map_err(|e| anyhow!("histogram: {e:?}"))?;
        }
        s.net = self.net;
        s.inserted = self.inserted;
        for (a, b) in s.abort_reasons.iter_mut().zip(&self.abort_reasons) {
            *a = *b;
        }
        s.fatal = self.fatal;
        let [sq_full, wrs, doorbells, messages, buckets] = self.rpc;
        s.rpc.sq_full = sq_full;
        s.rpc.wrs = wrs;
        s.rpc.doorbells = doorbells;
        s.rpc.messages = messages;
        s.rpc.buckets = buckets;
        s.tso_epoch = self.tso_epoch;
        s.tso_reconnects = self.tso_reconnects;
        s.lock_reconnects = self.lock_reconnects;
        s.qp_errors = self.qp_errors;
        s.route = crate::routing::RouteCounts {
            redraws: self.route[0],
            misses: self.route[1],
        };
        s.vtc = self.vtc;
        s.forward.count = self.forward.0;
        s.forward.bytes = self.forward.1;
        if !self.forward.2.is_empty() {
            let bytes = unhex(&self.forward.2)?;
            let h: hdrhistogram::Histogram<u64> = Deserializer::new()
                .deserialize(&mut bytes.as_slice())
                .map_err(|e| anyhow!("forwarding histogram: {e:?}"))?;
            s.forward
                .hist
                .add(&h)
                .map_err(|e| anyhow!("forwarding histogram: {e:?}"))?;
        }
        s.transient_retries = self.transient_retries;
        let [reads, writes, atomics] = self.memnode_ops;
        s.memnode_ops = rrpc::runtime::OpCounts {
            reads,
            writes,
            atomics,
        };
        s.lock_reads = self.lock_reads;
        s.tocc_share = self
            .tocc_share
            .into_iter()
            .map(|(table, attempts, tocc)| crate::breakdown::ToccShare {
                table,
                attempts,
                tocc,
            })
            .collect();
        s.warmup_commits = self.warmup_commits;
        if let Some(types) = self.breakdown {
            let bytes = types
                .iter()
                .map(|t| {
                    t.iter()
                        .map(|h| unhex(h))
                        .collect::<anyhow::Result<Vec<_>>>()
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            s.breakdown =
                Some(crate::breakdown::Breakdown::decode(&bytes).map_err(|e| anyhow!(e))?);
        }
        Ok(s)
    }
}

/// What a child's threads hand its main thread to write.
pub(crate) enum Out {
    /// A message to write as it is.
    Msg(Msg),
    /// Committed transactions to write as a history batch.
    History(History),
}

/// A coordinator thread's streaming in a child: every [`FLUSH_EVERY`] its intervals
/// and history, every 500 ms its counters (see the module docs).
#[derive(Clone)]
pub(crate) struct Flush {
    pub(crate) tx: mpsc::Sender<Out>,
}

impl Flush {
    /// The flusher coroutine of thread `tid`: flush until `stop`, once more after it.
    /// The thread's `clock` (its `t0_ns` set) finds the interval a flush is in.
    pub(crate) async fn run(
        self,
        clock: RunClock,
        tid: usize,
        client: Rc<TxnClient>,
        stats: Rc<RefCell<WorkerStats>>,
        stop: Arc<AtomicBool>,
    ) {
        let mut from = 0;
        let mut n = 0u32;
        loop {
            client.ctx().sleep(FLUSH_EVERY).await;
            let last = stop.load(Ordering::Relaxed);
            n += 1;
            {
                let s = stats.borrow();
                self.intervals(clock, tid, &s, &mut from);
                if n.is_multiple_of(STATS_EVERY) {
                    self.stats(tid, &s);
                }
            }
            if let Some(h) = client.take_history() {
                if !h.is_empty() {
                    let _ = self.tx.send(Out::History(h));
                }
            }
            if last {
                return;
            }
        }
    }

    /// Send the intervals from `from` on; the next flush starts at the current one.
    fn intervals(&self, clock: RunClock, tid: usize, s: &WorkerStats, from: &mut usize) {
        let t = &s.timeline;
        let start = (*from).min(t.commits.len());
        let _ = self.tx.send(Out::Msg(Msg::Interval {
            tid,
            from: start,
            commits: t.commits[start..].to_vec(),
            aborts: t.aborts[start..].to_vec(),
        }));
        let now = clock.interval(txn::history::monotonic_ns()).unwrap_or(0);
        *from = now.min(t.commits.len());
    }

    fn stats(&self, tid: usize, s: &WorkerStats) {
        let _ = self.tx.send(Out::Msg(Msg::Stats {
            tid,
            stats: Box::new(WireStats::from_stats(s)),
        }));
    }
}

/// `cnode`: one compute node's coordinators against a running cluster (started by
/// `txn-bench --cnodes N`, which passes every flag).
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
pub struct CnodeArgs {
    /// Cluster name (the shm fabric's directory).
    #[arg(long)]
    pub cluster: String,
    /// This compute node's index (0 to --cnodes - 1); its node id is 101 + index.
    #[arg(long, default_value_t = 0)]
    pub cnode: usize,
    /// Incarnation of this compute node (0 first, +1 per restart): recorded with its
    /// history.
    #[arg(long, default_value_t = 0)]
    pub incarnation: u32,
    /// The membership service (etcd) to join: the node's fabric incarnation (in its
    /// transaction ids and tickets) is the one etcd gives, and the process exits when
    /// its lease is gone (it was declared dead and fenced). Without it the fabric
    /// incarnation is --incarnation + 1.
    #[arg(long, value_name = "URL")]
    pub etcd: Option<String>,
    /// A memory node's bootstrap address (repeat for each).
    #[arg(long = "memnode", required = true, value_name = "ADDR")]
    pub memnodes: Vec<SocketAddr>,
    /// The timestamp oracle's bootstrap address.
    #[arg(long, value_name = "ADDR")]
    pub tso: SocketAddr,
    /// The lock service's bootstrap address (Scythe).
    #[arg(long, value_name = "ADDR")]
    pub lockd: Option<SocketAddr>,
    /// The run's start, CLOCK_MONOTONIC ns: start at once (a restarted compute node)
    /// instead of waiting for `go <t0_ns>` on stdin.
    #[arg(long, value_name = "NS")]
    pub t0_ns: Option<u64>,
    /// The run's settings: txn-bench's flags as JSON (with one protocol, and the
    /// point's --theta and --coroutines).
    #[arg(long, value_name = "JSON")]
    pub run_spec: String,
    /// Run this compute node on these CPUs only, a list such as `2-15,20` (its
    /// coordinator threads inherit the set); with `txn-bench --hosts`, the topology
    /// file's `cpus` of its coordinator entry, else of its host.
    #[arg(long, value_name = "LIST", value_parser = parse_cpus)]
    pub cpus: Option<String>,
    /// NUMA node to run on: memory bound to it (before any is registered) and, without
    /// --cpus, its CPUs; with `txn-bench --hosts`, the topology file's `numa` of its
    /// coordinator entry, else of its host.
    #[arg(long, value_name = "N")]
    pub numa: Option<u32>,
}

/// Check a `--cpus` list ([`rrpc::topology::parse_cpu_list`]); keep it as given.
fn parse_cpus(s: &str) -> Result<String, String> {
    rrpc::topology::parse_cpu_list(s).map(|_| s.to_string())
}

/// `--cpus` and `--numa`: run the calling thread, and every thread it starts from now
/// on, on the CPUs of `list` only, else (with `numa`) on that NUMA node's CPUs, its
/// memory bound to node `numa` ([`rrpc::service::bind_process`]); nothing without
/// either.
///
/// Errors: a bad list, CPUs the kernel refuses (none of them online, or beyond what its
/// CPU sets hold), naming the list; a NUMA node the machine lacks, naming it.
pub fn pin(list: Option<&str>, numa: Option<u32>) -> anyhow::Result<()> {
    let cpus = list
        .map(|l| {
            rrpc::topology::parse_cpu_list(l).map_err(|e| anyhow::anyhow!("--cpus {l:?}: {e}"))
        })
        .transpose()?;
    rrpc::service::bind_process(cpus.as_deref(), numa).with_context(|| match (list, numa) {
        (Some(l), _) => format!("--cpus {l:?}"),
        (None, Some(n)) => format!("--numa {n}"),
        (None, None) => String::new(),
    })?;
    Ok(())
}

/// The incarnation a compute node's life `incarnation` (0, 1, ... as `txn-bench`
/// counts its restarts) has on the fabric, in its transaction ids and at the lock
/// service: one more, so that it is never 0.
pub fn fabric_incarnation(incarnation: u32) -> u64 {
    u64::from(incarnation) + 1
}

/// Set by SIGTERM in a child.
pub(crate) static TERMINATED: AtomicBool = AtomicBool::new(false);

pub(crate) extern "C" fn on_sigterm(_: libc::c_int) {
    TERMINATED.store(true, Ordering::SeqCst);
}

/// One child as the parent sees it.
pub(crate) struct Cn {
    pub(crate) index: usize,
    pub(crate) incarnation: u32,
    pub(crate) node: u32,
    /// Its pid: on its host when it runs on another one (its [`REMOTE_PID`] line), else
    /// the child's.
    ///
    /// [`REMOTE_PID`]: crate::launcher::REMOTE_PID
    pub(crate) pid: u32,
    /// Where it runs.
    pub(crate) place: crate::launcher::Place,
    pub(crate) child: Child,
    pub(crate) stdin: Option<ChildStdin>,
    /// Asked to stop (or killed on purpose): its exit is not a death to report.
    pub(crate) stopping: bool,
    /// Exited and reaped.
    pub(crate) gone: bool,
    pub(crate) ready: bool,
    pub(crate) done: bool,
}

/// What a child's reader thread passes on.
pub(crate) enum Event {
    Msg(Msg),
    Bad(String),
    Eof,
}

/// A stream: (compute node, incarnation, thread).
pub(crate) type StreamKey = (usize, u32, usize);

/// The parent's view of every stream.
#[derive(Default)]
pub(crate) struct Streams {
    /// Commits and aborts per interval.
    pub(crate) timelines: BTreeMap<StreamKey, (Vec<u64>, Vec<u64>)>,
    /// The latest counters.
    pub(crate) stats: BTreeMap<StreamKey, WireStats>,
    /// Threads that failed (fatal: they fail the run).
    pub(crate) errors: Vec<String>,
    pub(crate) commits_by_incarnation: BTreeMap<(usize, u32), u64>,
}

impl Streams {
    pub(crate) fn interval(
        &mut self,
        key: StreamKey,
        from: usize,
        commits: &[u64],
        aborts: &[u64],
    ) {
        let (c, a) = self.timelines.entry(key).or_default();
        let end = from + commits.len();
        if c.len() < end {
            c.resize(end, 0);
            a.resize(end, 0);
        }
        for (i, &n) in commits.iter().enumerate() {
            c[from + i] = n;
            a[from + i] = aborts.get(i).copied().unwrap_or(0);
        }
    }

    pub(crate) fn committed(&self) -> u64 {
        self.timelines
            .values()
            .map(|(c, _)| c.iter().sum::<u64>())
            .sum()
    }
}

/// Start compute node `index`, incarnation `incarnation` (with `t0`: running at once).
#[allow(clippy::too_many_arguments)]
pub(crate) fn spawn(
    place: &crate::launcher::Place,
    bin: &std::path::Path,
    cluster_name: &str,
    addrs: &ClusterAddrs,
    spec: &str,
    index: usize,
    incarnation: u32,
    t0: Option<u64>,
    etcd: Option<&str>,
    cpus: Option<&str>,
    numa: Option<u32>,
    events: &mpsc::Sender<(usize, u32, Event)>,
) -> anyhow::Result<Cn> {
    if *place == crate::launcher::Place::Local && !bin.exists() {
        bail!(
            "{} not found; build it first: cargo build --release -p bench (or pass --bin-dir)",
            bin.display()
        );
    }
    let mut args: Vec<String> = vec![
        "--cluster".into(),
        cluster_name.into(),
        "--cnode".into(),
        index.to_string(),
        "--incarnation".into(),
        incarnation.to_string(),
        "--tso".into(),
        addrs.tso.to_string(),
        "--run-spec".into(),
        spec.into(),
    ];
    for m in &addrs.memnodes {
        args.extend(["--memnode".into(), m.to_string()]);
    }
    if let Some(l) = addrs.lockd {
        args.extend(["--lockd".into(), l.to_string()]);
    }
    if let Some(t) = t0 {
        args.extend(["--t0-ns".into(), t.to_string()]);
    }
    if let Some(e) = etcd {
        args.extend(["--etcd".into(), e.into()]);
    }
    if let Some(c) = cpus {
        args.extend(["--cpus".into(), c.into()]);
    }
    if let Some(n) = numa {
        args.extend(["--numa".into(), n.to_string()]);
    }
    // Directly, or over ssh (its stdin and stdout, the command and stream channels,
    // travel through the session; stdin's end stops it there too).
    let line = place.command_line(bin, "cnode", &args);
    let mut cmd = Command::new(&line[0]);
    cmd.args(&line[1..]);
    // A crash point (test builds, `TXN_CRASH_AT`) hits only the compute node
    // `TXN_CRASH_AT_CN` names, once (not its restarts).
    if std::env::var("TXN_CRASH_AT_CN").ok() != Some(index.to_string()) || incarnation > 0 {
        cmd.env_remove("TXN_CRASH_AT");
    }
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .process_group(0);
    // SAFETY: prctl is async-signal-safe; the closure touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", line[0]))?;
    let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
    let stdin = child.stdin.take();
    // A remote compute node first says its pid there (the launcher's command line).
    let pid = match place {
        crate::launcher::Place::Local => child.id(),
        place => {
            let mut first = String::new();
            let _ = stdout.read_line(&mut first);
            match crate::launcher::remote_pid_of(&first) {
                Some(pid) => pid,
                None => {
                    crate::launcher::reap_within(&mut child, Duration::from_secs(1));
                    bail!(
                        "cnode {index} on {}: no {:?} line but {first:?} (did ssh start it?)",
                        place.describe(),
                        crate::launcher::REMOTE_PID
                    );
                }
            }
        }
    };
    let tx = events.clone();
    std::thread::spawn(move || {
        for line in stdout.lines() {
            let ev = match line {
                Ok(l) => match serde_json::from_str::<Msg>(&l) {
                    Ok(m) => Event::Msg(m),
                    Err(e) => {
                        Event::Bad(format!("{e}: {}", l.chars().take(120).collect::<String>()))
                    }
                },
                Err(_) => break,
            };
            if tx.send((index, incarnation, ev)).is_err() {
                return;
            }
        }
        let _ = tx.send((index, incarnation, Event::Eof));
    });
    Ok(Cn {
        index,
        incarnation,
        node: NODE_CNODE + index as u32,
        pid,
        place: place.clone(),
        child,
        stdin,
        stopping: false,
        gone: false,
        ready: false,
        done: false,
    })
}

/// How a child ended, for the report.
pub(crate) fn status_text(st: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (_, Some(sig)) => format!("signal {sig}"),
        (Some(c), _) => format!("exit status {c}"),
        _ => st.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CPUs the calling thread may run on.
    fn affinity() -> Vec<usize> {
        // SAFETY: an all-zero cpu_set_t is a valid empty set; sched_getaffinity fills
        // exactly size_of::<cpu_set_t>() bytes of it, and CPU_ISSET reads indices below
        // CPU_SETSIZE.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            let size = std::mem::size_of::<libc::cpu_set_t>();
            assert_eq!(libc::sched_getaffinity(0, size, &mut set), 0);
            (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| libc::CPU_ISSET(c, &set))
                .collect()
        }
    }

    #[test]
    fn cpus_pins_the_compute_node_and_bad_lists_are_refused() {
        std::thread::spawn(|| {
            let all = affinity();
            pin(None, None).unwrap();
            assert_eq!(affinity(), all, "no list: not pinned");
            let c = all[all.len() - 1];
            pin(Some(&c.to_string()), None).unwrap();
            assert_eq!(affinity(), vec![c]);
            let inherited = std::thread::spawn(affinity).join().unwrap();
            assert_eq!(inherited, vec![c], "its threads inherit the set");
            let e = pin(Some("5000"), None).unwrap_err();
            assert!(format!("{e:#}").contains("--cpus \"5000\""), "{e:#}");
            assert!(pin(Some("3-1"), None).is_err());
            let e = pin(None, Some(7)).unwrap_err();
            assert!(
                format!("{e:#}").contains("NUMA node 7 does not exist"),
                "{e:#}"
            );
        })
        .join()
        .unwrap();
        let a = CnodeArgs::try_parse_from([
            "cnode",
            "--cluster",
            "c",
            "--memnode",
            "127.0.0.1:1",
            "--tso",
            "127.0.0.1:2",
            "--run-spec",
            "{}",
            "--cpus",
            "0-1,3",
        ])
        .unwrap();
        assert_eq!(a.cpus.as_deref(), Some("0-1,3"));
        assert!(CnodeArgs::try_parse_from([
            "cnode",
            "--cluster",
            "c",
            "--memnode",
            "127.0.0.1:1",
            "--tso",
            "127.0.0.1:2",
            "--run-spec",
            "{}",
            "--cpus",
            "x",
        ])
        .is_err());
    }

    #[test]
    fn stats_travel_with_their_histograms() {
        let mut s = WorkerStats::with_kinds(2);
        s.types[1].record_commit(Duration::from_micros(40));
        s.types[1].record_commit(Duration::from_micros(60));
        s.types[0].attempts = 3;
        s.net = -5;
        s.fatal.push("x".into());
        let line = serde_json::to_string(&Msg::Stats {
            tid: 1,
            stats: Box::new(WireStats::from_stats(&s)),
        })
        .unwrap();
        let Msg::Stats { tid, stats } = serde_json::from_str(&line).unwrap() else {
            panic!("not stats: {line}");
        };
        let back = stats.into_stats(2).unwrap();
        assert_eq!(tid, 1);
        assert_eq!((back.types[0].attempts, back.types[1].commits), (3, 2));
        assert_eq!(back.types[1].hist.len(), 2);
        assert_eq!(
            back.types[1].hist.value_at_quantile(1.0),
            s.types[1].hist.value_at_quantile(1.0)
        );
        assert_eq!(
            (back.net, back.fatal.as_slice()),
            (-5, &["x".to_string()][..])
        );
        let wrong = WireStats::from_stats(&s).into_stats(3);
        assert!(wrong.is_err());
        let mut bad = WireStats::from_stats(&s);
        bad.types[0].hist = "zz".into();
        assert!(bad.into_stats(2).is_err());
    }

    #[test]
    fn intervals_replace_what_an_earlier_line_said() {
        let mut st = Streams::default();
        st.interval((0, 0, 0), 0, &[1, 2], &[0, 0]);
        st.interval((0, 0, 0), 1, &[5, 7], &[1, 1]);
        st.interval((1, 0, 0), 0, &[3], &[0]);
        assert_eq!(st.timelines[&(0, 0, 0)].0, [1, 5, 7]);
        assert_eq!(st.committed(), 16);
    }
}
