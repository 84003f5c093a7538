//! Coordinator processes (`txn-bench --cnodes N`): each compute node's coordinators
//! (threads x coroutines, the same driver as in `txn-bench`) run in a `cnode` child
//! process of their own, with their own node id, against the cluster `txn-bench`
//! started; so one compute node can be killed, stopped or restarted alone.
//!
//! The child ([`main`], the `cnode` binary) connects, runs [`before_serving`], says
//! `ready` on stdout, waits for `go <t0_ns>` on stdin (or starts at once with `--t0-ns`,
//! as a restarted child does), and runs until a `stop` line on stdin or SIGTERM. While
//! it runs it streams JSON lines ([`Msg`]) to its parent every 100 ms: each thread's
//! commits and aborts per interval, its newly committed transactions (the history,
//! [`crate::history_out::HistoryLine`]), every 500 ms its counters with its latency
//! histograms (HDR V2, hex), and at the end all of these once more and `done`. A child
//! that is killed leaves what it streamed up to its last batch.
//!
//! The parent (`measure`, behind `txn-bench --cnodes`) starts the children, says go, applies the fault flags
//! (`--kill-cn-after [--restart]`, `--stop-cn-after --stop-ms`, `--kill-tso-after`),
//! reports a child that dies (and calls [`on_cnode_death`]), stops the survivors after
//! `--duration`, and merges the streams: one set of per-thread counters for the report,
//! one history for the checks (and `--history-out`), one timeline row per compute node
//! (its incarnations summed).
//!
//! Node ids: compute node `i` is node `NODE_CNODE + i` (101, 102, ...: above the
//! services and `txn-bench`'s own 100), the same for each of its incarnations.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use clap::Parser;
use hdrhistogram::serialization::{Deserializer, Serializer, V2Serializer};
use rrpc::fabric::{Fabric, FabricConfig};
use rrpc::NodeId;
use serde::{Deserialize, Serialize};
use txn::coordinator::{ClusterAddrs, Protocol, TxnClient};
use txn::history::History;

use crate::history_out::{self, HistoryLine};
use crate::launcher::default_bin_dir;
use crate::report::{TsoRestart, WorkerStats};
use crate::timeline::{CnodeTimeline, Fault};
use crate::txn_args::{Args, Point, ProtocolArg, NODE_CNODE};
use crate::txnbench::{Measured, RunCluster, WorkerPlan};
use crate::workload::{RunClock, WorkloadSpec};

/// How often a child streams its intervals and history.
const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// Flushes between two snapshots of a thread's counters and histograms (500 ms).
const STATS_EVERY: u32 = 5;
/// The interval a child counts in without `--timeline-ms` (for progress lines).
const DEFAULT_INTERVAL_MS: u64 = 100;
/// How long a child may take to connect and say ready, and to finish after `stop`.
const CHILD_TIMEOUT: Duration = Duration::from_secs(60);

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
    /// (table, attempts, tocc).
    tocc_share: Vec<(String, u64, u64)>,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> anyhow::Result<Vec<u8>> {
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
            tocc_share: s
                .tocc_share
                .iter()
                .map(|t| (t.table.clone(), t.attempts, t.tocc))
                .collect(),
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
        s.tocc_share = self
            .tocc_share
            .into_iter()
            .map(|(table, attempts, tocc)| crate::breakdown::ToccShare {
                table,
                attempts,
                tocc,
            })
            .collect();
        Ok(s)
    }
}

/// What a child's threads hand its main thread to write.
enum Out {
    /// A message to write as it is.
    Msg(Msg),
    /// Committed transactions to write as a history batch.
    History(History),
}

/// A coordinator thread's streaming in a child: every [`FLUSH_EVERY`] its intervals
/// and history, every 500 ms its counters (see the module docs).
#[derive(Clone)]
pub(crate) struct Flush {
    tx: mpsc::Sender<Out>,
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
}

/// What a restarted compute node does before it serves: wait until the recovery of
/// its previous incarnation's transactions is done. Nothing yet.
pub fn before_serving(node: u32, incarnation: u32) {
    // TODO(recovery): a restarted compute node (incarnation > 0) waits here until the
    // recovery of incarnation - 1 (its locks and half-done commits) has finished.
    let _ = (node, incarnation);
}

/// Called in `txn-bench` when compute node `node_id` (incarnation `incarnation`) died or
/// was killed: where the recovery of its transactions will start. For now it only
/// says so on stderr.
pub fn on_cnode_death(node_id: u32, incarnation: u32) {
    // TODO(recovery): start the recovery of the dead coordinator's transactions (clear
    // its locks, finish or undo its half-done commits) here.
    eprintln!("on_cnode_death: node {node_id} incarnation {incarnation} (no recovery yet)");
}

/// Set by SIGTERM in a child.
static TERMINATED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigterm(_: libc::c_int) {
    TERMINATED.store(true, Ordering::SeqCst);
}

/// The `cnode` binary: run the compute node of `a` until stopped (module docs).
///
/// Errors: a bad run spec, a fabric or a cluster that cannot be reached, a thread that
/// panicked, stdout closed.
pub fn main(a: CnodeArgs) -> anyhow::Result<()> {
    if a.cnode >= crate::txn_args::MAX_CNODES {
        bail!(
            "--cnode must be below {} (got {})",
            crate::txn_args::MAX_CNODES,
            a.cnode
        );
    }
    let mut args: Args = serde_json::from_str(&a.run_spec).context("--run-spec")?;
    let protocol = match args.protocol {
        ProtocolArg::All => bail!("--run-spec names all protocols: one only"),
        _ => args.protocols()?[0],
    };
    args.protocol = ProtocolArg::One(protocol);
    let threads = args.threads.unwrap_or(1).max(1);
    let workload = crate::txnbench::workload_spec(&args)?;
    let mix = workload.profiles(args.theta)?;
    let node = NODE_CNODE + a.cnode as u32;
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe { libc::signal(libc::SIGTERM, on_sigterm as *const () as libc::sighandler_t) };

    let mut fcfg = FabricConfig::new(args.fabric, &a.cluster, NodeId(node));
    fcfg.device = args.rdma_device.clone();
    fcfg.gid_index = args.gid_index;
    fcfg.model = Some(args.model.clone());
    let fabric = Fabric::open(&fcfg).context("opening the fabric")?;
    let addrs = ClusterAddrs {
        memnodes: a.memnodes.clone(),
        lockd: a.lockd,
        tso: a.tso,
    };
    let cfg = crate::txnbench::txn_config(&args, protocol, threads);
    let clock = RunClock {
        t0_ns: 0,
        interval_ns: args.timeline_ms.unwrap_or(DEFAULT_INTERVAL_MS) * 1_000_000,
        wall: !args.no_check,
    };
    let (tx, rx) = mpsc::channel::<Out>();
    let stop = Arc::new(AtomicBool::new(false));
    let committed = Arc::new(AtomicU64::new(0));
    let t0 = Arc::new(AtomicU64::new(0));
    let gate = Arc::new(Barrier::new(threads + 1));
    let go = Arc::new(Barrier::new(threads + 1));
    let kinds = workload.kinds();
    let mut handles = Vec::new();
    for i in 0..threads {
        let w = WorkerPlan {
            tid: a.cnode * threads + i,
            coroutines: args.coroutines,
            seed: args.seed,
            max_backoff_us: args.max_backoff_us,
            kinds: kinds.clone(),
            warehouses: args.warehouses(),
            each_type_first: args.each_type_first,
            cfg: cfg.clone(),
            addrs: addrs.clone(),
            core: None,
            clock,
            t0: t0.clone(),
            go: Some(go.clone()),
            flush: Some(Flush { tx: tx.clone() }),
            incarnation: a.incarnation,
        };
        let (fabric, mix, stop, committed, gate) = (
            fabric.clone(),
            mix.clone(),
            stop.clone(),
            committed.clone(),
            gate.clone(),
        );
        handles.push(
            std::thread::Builder::new()
                .name(format!("coordinator-{i}"))
                .spawn(move || crate::txnbench::worker(w, fabric, mix, stop, committed, gate))?,
        );
    }
    drop(tx);
    let out = std::io::stdout();
    let mut out = std::io::BufWriter::new(out.lock());
    let say = |m: &Msg, out: &mut std::io::BufWriter<std::io::StdoutLock<'_>>| {
        serde_json::to_writer(&mut *out, m)?;
        out.write_all(b"\n")?;
        out.flush()
    };
    gate.wait();
    before_serving(node, a.incarnation);
    say(
        &Msg::Ready {
            node,
            incarnation: a.incarnation,
            pid: std::process::id(),
        },
        &mut out,
    )
    .context("stdout")?;
    // Commands on stdin: `go <t0_ns>`, `stop` (EOF: the parent is gone, stop too).
    let (cmd_tx, cmd_rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if cmd_tx.send(line.trim().to_string()).is_err() {
                return;
            }
        }
        let _ = cmd_tx.send("stop".into());
    });
    let start = match a.t0_ns {
        Some(t) => t,
        None => loop {
            match cmd_rx.recv_timeout(Duration::from_millis(50)) {
                Ok(c) => match c.strip_prefix("go ").map(str::parse::<u64>) {
                    Some(Ok(t)) => break t,
                    _ if c == "stop" => {
                        // Stopped before it started: release the threads, which stop at once.
                        stop.store(true, Ordering::SeqCst);
                        break txn::history::monotonic_ns();
                    }
                    _ => bail!("unknown command {c:?} on stdin: go <t0_ns> or stop"),
                },
                Err(mpsc::RecvTimeoutError::Timeout) if TERMINATED.load(Ordering::SeqCst) => {
                    stop.store(true, Ordering::SeqCst);
                    break txn::history::monotonic_ns();
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    stop.store(true, Ordering::SeqCst);
                    break txn::history::monotonic_ns();
                }
            }
        },
    };
    t0.store(start, Ordering::SeqCst);
    go.wait();
    let write_out = |o: Out, out: &mut std::io::BufWriter<std::io::StdoutLock<'_>>| match o {
        Out::Msg(m) => say(&m, out),
        Out::History(h) => {
            let lines = history_out::lines(&h, &kinds, a.cnode, a.incarnation).collect();
            say(&Msg::History { lines }, out)
        }
    };
    while !handles.iter().all(|h| h.is_finished()) {
        if TERMINATED.load(Ordering::SeqCst) || cmd_rx.try_recv().is_ok_and(|c| c == "stop") {
            stop.store(true, Ordering::SeqCst);
        }
        match rx.recv_timeout(Duration::from_millis(20)) {
            Ok(o) => write_out(o, &mut out).context("stdout")?,
            Err(mpsc::RecvTimeoutError::Timeout | mpsc::RecvTimeoutError::Disconnected) => {}
        }
    }
    let results = handles.into_iter().map(|h| {
        h.join()
            .unwrap_or_else(|_| Err(anyhow!("coordinator thread panicked")))
    });
    for (i, r) in results.enumerate() {
        match r {
            Ok(mut s) => {
                if let Some(h) = s.history.take() {
                    write_out(Out::History(h), &mut out).context("stdout")?;
                }
                let tid = a.cnode * threads + i;
                say(
                    &Msg::Interval {
                        tid,
                        from: 0,
                        commits: s.timeline.commits.clone(),
                        aborts: s.timeline.aborts.clone(),
                    },
                    &mut out,
                )?;
                say(
                    &Msg::Stats {
                        tid,
                        stats: Box::new(WireStats::from_stats(&s)),
                    },
                    &mut out,
                )?;
            }
            Err(e) => say(
                &Msg::Error {
                    error: format!("{e:#}"),
                },
                &mut out,
            )?,
        }
    }
    while let Ok(o) = rx.try_recv() {
        write_out(o, &mut out).context("stdout")?;
    }
    say(&Msg::Done, &mut out).context("stdout")?;
    Ok(())
}

/// One child as the parent sees it.
struct Cn {
    index: usize,
    incarnation: u32,
    node: u32,
    pid: u32,
    child: Child,
    stdin: Option<ChildStdin>,
    /// Asked to stop (or killed on purpose): its exit is not a death to report.
    stopping: bool,
    /// Exited and reaped.
    gone: bool,
    ready: bool,
    done: bool,
}

/// What a child's reader thread passes on.
enum Event {
    Msg(Msg),
    Bad(String),
    Eof,
}

/// A stream: (compute node, incarnation, thread).
type StreamKey = (usize, u32, usize);

/// The parent's view of every stream.
#[derive(Default)]
struct Streams {
    /// Commits and aborts per interval.
    timelines: BTreeMap<StreamKey, (Vec<u64>, Vec<u64>)>,
    /// The latest counters.
    stats: BTreeMap<StreamKey, WireStats>,
    /// Threads that failed (fatal: they fail the run).
    errors: Vec<String>,
    commits_by_incarnation: BTreeMap<(usize, u32), u64>,
}

impl Streams {
    fn interval(&mut self, key: StreamKey, from: usize, commits: &[u64], aborts: &[u64]) {
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

    fn committed(&self) -> u64 {
        self.timelines
            .values()
            .map(|(c, _)| c.iter().sum::<u64>())
            .sum()
    }
}

/// Start compute node `index`, incarnation `incarnation` (with `t0`: running at once).
#[allow(clippy::too_many_arguments)]
fn spawn(
    bin: &std::path::Path,
    cluster_name: &str,
    addrs: &ClusterAddrs,
    spec: &str,
    index: usize,
    incarnation: u32,
    t0: Option<u64>,
    events: &mpsc::Sender<(usize, u32, Event)>,
) -> anyhow::Result<Cn> {
    if !bin.exists() {
        bail!(
            "{} not found; build it first: cargo build --release -p bench (or pass --bin-dir)",
            bin.display()
        );
    }
    let mut cmd = Command::new(bin);
    cmd.args(["--cluster", cluster_name, "--cnode", &index.to_string()])
        .args(["--incarnation", &incarnation.to_string()])
        .args(["--tso", &addrs.tso.to_string(), "--run-spec", spec]);
    for m in &addrs.memnodes {
        cmd.args(["--memnode", &m.to_string()]);
    }
    if let Some(l) = addrs.lockd {
        cmd.args(["--lockd", &l.to_string()]);
    }
    if let Some(t) = t0 {
        cmd.args(["--t0-ns", &t.to_string()]);
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
        .with_context(|| format!("starting {}", bin.display()))?;
    let stdout = child.stdout.take().expect("piped");
    let stdin = child.stdin.take();
    let tx = events.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
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
        pid: child.id(),
        child,
        stdin,
        stopping: false,
        gone: false,
        ready: false,
        done: false,
    })
}

/// How a child ended, for the report.
fn status_text(st: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (_, Some(sig)) => format!("signal {sig}"),
        (Some(c), _) => format!("exit status {c}"),
        _ => st.to_string(),
    }
}

/// The parent's side of the run with `--cnodes N` (module docs): the same
/// [`Measured`] as the in-process run, the history already written to
/// `--history-out`.
pub(crate) fn measure(
    args: &Args,
    workload: &dyn WorkloadSpec,
    cluster: &mut RunCluster,
    protocol: Protocol,
    point: &Point,
    stop: &AtomicBool,
) -> anyhow::Result<Measured> {
    let kinds = workload.kinds();
    let mut spec_args = args.clone();
    spec_args.protocol = ProtocolArg::One(protocol);
    spec_args.isolation = None;
    spec_args.sweep = None;
    spec_args.theta = point.theta;
    spec_args.coroutines = point.coroutines;
    spec_args.config = None;
    let spec = serde_json::to_string(&spec_args)?;
    let bin: PathBuf = args
        .bin_dir
        .clone()
        .unwrap_or_else(default_bin_dir)
        .join("cnode");
    let cluster_name = cluster.cluster.name().to_string();
    let (ev_tx, ev_rx) = mpsc::channel();
    let mut cns: Vec<Cn> = Vec::new();
    for i in 0..args.cnodes {
        cns.push(spawn(
            &bin,
            &cluster_name,
            &cluster.addrs,
            &spec,
            i,
            0,
            None,
            &ev_tx,
        )?);
    }
    let mut history_file = match &args.history_out {
        Some(p) => Some(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => None,
    };
    let mut history = (!args.no_check).then(|| History::new(args.check_memory_mb << 20));
    let mut streams = Streams::default();
    let mut events: Vec<String> = Vec::new();
    let mut history_lines = 0u64;

    // Handle one event of a child's stream.
    let mut handle = |cns: &mut Vec<Cn>,
                      streams: &mut Streams,
                      events: &mut Vec<String>,
                      (index, inc, ev): (usize, u32, Event)|
     -> anyhow::Result<()> {
        let cn = cns
            .iter_mut()
            .find(|c| c.index == index && c.incarnation == inc);
        match ev {
            Event::Msg(Msg::Ready { .. }) => {
                if let Some(c) = cn {
                    c.ready = true;
                }
            }
            Event::Msg(Msg::Interval {
                tid,
                from,
                commits,
                aborts,
            }) => streams.interval((index, inc, tid), from, &commits, &aborts),
            Event::Msg(Msg::History { lines }) => {
                *streams
                    .commits_by_incarnation
                    .entry((index, inc))
                    .or_default() += lines.len() as u64;
                if let Some(f) = &mut history_file {
                    history_out::write_lines(f, lines.iter().cloned())
                        .context("writing --history-out")?;
                }
                history_lines += lines.len() as u64;
                if let Some(h) = &mut history {
                    for l in &lines {
                        history_out::record(h, &kinds, l);
                    }
                }
            }
            Event::Msg(Msg::Stats { tid, stats }) => {
                streams.stats.insert((index, inc, tid), *stats);
            }
            Event::Msg(Msg::Error { error }) => {
                let e = format!("cnode {index} (incarnation {inc}): {error}");
                eprintln!("{e}");
                streams.errors.push(e.clone());
                events.push(e);
            }
            Event::Msg(Msg::Done) => {
                if let Some(c) = cn {
                    c.done = true;
                }
            }
            Event::Bad(l) => {
                events.push(format!("cnode {index} (incarnation {inc}): bad line: {l}"))
            }
            Event::Eof => {}
        }
        Ok(())
    };

    // Every child connected and ready (a watchdog for each).
    let deadline = Instant::now() + CHILD_TIMEOUT;
    while !cns.iter().all(|c| c.ready) {
        match ev_rx.recv_timeout(Duration::from_millis(50)) {
            Ok(ev) => handle(&mut cns, &mut streams, &mut events, ev)?,
            Err(_) => {
                for c in &mut cns {
                    if let Some(st) = c.child.try_wait()? {
                        c.gone = true;
                        bail!(
                            "cnode {} exited before it was ready: {}",
                            c.index,
                            status_text(st)
                        );
                    }
                }
                if Instant::now() > deadline {
                    bail!("coordinator processes not ready after {CHILD_TIMEOUT:?}");
                }
            }
        }
    }
    let t0 = txn::history::monotonic_ns();
    let started = Instant::now();
    for c in &mut cns {
        if let Some(s) = &mut c.stdin {
            writeln!(s, "go {t0}").context("telling a cnode to go")?;
        }
    }
    eprintln!(
        "{} coordinator processes running (nodes {}..={})",
        cns.len(),
        NODE_CNODE,
        NODE_CNODE + cns.len() as u32 - 1
    );
    let ms = |i: Instant| i.duration_since(started).as_secs_f64() * 1e3;
    let dur = Duration::from_secs_f64(args.duration);
    let target = args.cn.unwrap_or(args.cnodes - 1);
    let (mut killed, mut stopped_at, mut continued) = (false, None::<Instant>, false);
    let mut fault: Option<Fault> = None;
    let mut tso_restart: Option<TsoRestart> = None;
    let committed_now = AtomicU64::new(0);
    let mut last_progress = 0;
    let mut service_died = None;
    while started.elapsed() < dur && !stop.load(Ordering::Relaxed) {
        if let Ok(ev) = ev_rx.recv_timeout(Duration::from_millis(10)) {
            handle(&mut cns, &mut streams, &mut events, ev)?;
            while let Ok(ev) = ev_rx.try_recv() {
                handle(&mut cns, &mut streams, &mut events, ev)?;
            }
        }
        let now_s = started.elapsed().as_secs_f64();
        // Deaths.
        for c in cns.iter_mut().filter(|c| !c.gone) {
            if let Some(st) = c.child.try_wait()? {
                c.gone = true;
                if !c.stopping {
                    let e = format!(
                        "cnode {} (pid {}) died at {:.0} ms: {}",
                        c.index,
                        c.pid,
                        ms(Instant::now()),
                        status_text(st)
                    );
                    eprintln!("{e}");
                    events.push(e);
                    on_cnode_death(c.node, c.incarnation);
                }
            }
        }
        // --kill-cn-after [--restart].
        if !killed && args.kill_cn_after.is_some_and(|k| now_s >= k) {
            killed = true;
            if let Some(c) = cns.iter_mut().find(|c| c.index == target && !c.gone) {
                c.stopping = true;
                c.child.kill().context("SIGKILL to a cnode")?;
                let st = c.child.wait()?;
                c.gone = true;
                let at = ms(Instant::now());
                let e = format!(
                    "cnode {} (pid {}) died at {at:.0} ms: {} (--kill-cn-after)",
                    c.index,
                    c.pid,
                    status_text(st)
                );
                eprintln!("{e}");
                events.push(e);
                fault = Some(Fault {
                    what: format!("cnode {target} killed"),
                    at_ms: at,
                    cnode: Some(target),
                });
                let (node, inc) = (c.node, c.incarnation);
                on_cnode_death(node, inc);
                if args.restart {
                    let n = spawn(
                        &bin,
                        &cluster_name,
                        &cluster.addrs,
                        &spec,
                        target,
                        inc + 1,
                        Some(t0),
                        &ev_tx,
                    )?;
                    let e = format!(
                        "cnode {target} restarted at {:.0} ms as incarnation {} (pid {}, node {node})",
                        ms(Instant::now()),
                        inc + 1,
                        n.pid
                    );
                    eprintln!("{e}");
                    events.push(e);
                    cns.push(n);
                }
            }
        }
        // --stop-cn-after --stop-ms.
        if stopped_at.is_none() && args.stop_cn_after.is_some_and(|k| now_s >= k) {
            stopped_at = Some(Instant::now());
            if let Some(c) = cns.iter().find(|c| c.index == target && !c.gone) {
                // SAFETY: kill(2) on a child we spawned and have not reaped.
                unsafe { libc::kill(c.pid as libc::pid_t, libc::SIGSTOP) };
                let at = ms(Instant::now());
                let e = format!(
                    "cnode {target} (pid {}) stopped (SIGSTOP) at {at:.0} ms for {} ms",
                    c.pid, args.stop_ms
                );
                eprintln!("{e}");
                events.push(e);
                fault = Some(Fault {
                    what: format!("cnode {target} stopped for {} ms", args.stop_ms),
                    at_ms: at,
                    cnode: Some(target),
                });
            }
        }
        if let (Some(t), false) = (stopped_at, continued) {
            if t.elapsed() >= Duration::from_millis(args.stop_ms) {
                continued = true;
                for c in cns.iter().filter(|c| c.index == target && !c.gone) {
                    // SAFETY: as above.
                    unsafe { libc::kill(c.pid as libc::pid_t, libc::SIGCONT) };
                    let e = format!(
                        "cnode {target} (pid {}) continued (SIGCONT) at {:.0} ms",
                        c.pid,
                        ms(Instant::now())
                    );
                    eprintln!("{e}");
                    events.push(e);
                }
            }
        }
        // --kill-tso-after.
        if tso_restart.is_none() && args.kill_tso_after.is_some_and(|k| now_s >= k) {
            committed_now.store(streams.committed(), Ordering::Relaxed);
            let listen = cluster.addrs.tso.to_string();
            let tso_args = cluster.tso_args(&listen);
            let r = crate::txnbench::restart_tso(
                &mut cluster.cluster,
                &cluster.tso_state,
                &tso_args,
                Duration::from_millis(args.tso_down_ms),
                &committed_now,
                started,
            )
            .context("restarting the oracle")?;
            fault = crate::txnbench::tso_fault(Some(&r));
            tso_restart = Some(r);
        }
        let s = started.elapsed().as_secs();
        if s > last_progress {
            last_progress = s;
            let c = streams.committed();
            eprintln!(
                "[{protocol} {s:>3}s / {:.0}s] committed {c} ({:.0} txn/s) over {} coordinator process(es)",
                args.duration,
                c as f64 / started.elapsed().as_secs_f64(),
                cns.iter().filter(|c| !c.gone).count()
            );
        }
        if let Err(e) = cluster.cluster.check_alive() {
            service_died = Some(e);
            break;
        }
    }
    let elapsed = started.elapsed();
    if let (Some(_), false) = (stopped_at, continued) {
        for c in cns.iter().filter(|c| c.index == target && !c.gone) {
            // SAFETY: as above.
            unsafe { libc::kill(c.pid as libc::pid_t, libc::SIGCONT) };
        }
    }
    // Stop the survivors and take their last words (a watchdog kills the slow ones).
    for c in cns.iter_mut().filter(|c| !c.gone) {
        c.stopping = true;
        if let Some(mut s) = c.stdin.take() {
            let _ = writeln!(s, "stop");
        }
    }
    let deadline = Instant::now() + CHILD_TIMEOUT;
    loop {
        while let Ok(ev) = ev_rx.recv_timeout(Duration::from_millis(10)) {
            handle(&mut cns, &mut streams, &mut events, ev)?;
        }
        for c in cns.iter_mut().filter(|c| !c.gone) {
            if let Some(st) = c.child.try_wait()? {
                c.gone = true;
                if !st.success() {
                    events.push(format!(
                        "cnode {} (pid {}) ended after stop: {}",
                        c.index,
                        c.pid,
                        status_text(st)
                    ));
                }
            }
        }
        if cns.iter().all(|c| c.gone) {
            while let Ok(ev) = ev_rx.recv_timeout(Duration::from_millis(50)) {
                handle(&mut cns, &mut streams, &mut events, ev)?;
            }
            break;
        }
        if Instant::now() > deadline {
            for c in cns.iter_mut().filter(|c| !c.gone) {
                let _ = c.child.kill();
                let _ = c.child.wait();
                c.gone = true;
                events.push(format!(
                    "cnode {} (pid {}) did not stop within {CHILD_TIMEOUT:?}: SIGKILLed",
                    c.index, c.pid
                ));
            }
        }
    }
    if let Some(f) = &mut history_file {
        f.flush().context("writing --history-out")?;
    }
    if let Some(p) = &args.history_out {
        eprintln!(
            "wrote {history_lines} committed transactions to {}",
            p.display()
        );
    }
    if let Some(e) = service_died {
        bail!("a service died during the run: {e}");
    }
    for c in &cns {
        let n = streams
            .commits_by_incarnation
            .get(&(c.index, c.incarnation))
            .copied()
            .unwrap_or(0);
        if c.incarnation > 0 || args.kill_cn_after.is_some() {
            events.push(format!(
                "cnode {} incarnation {}: {n} committed transactions streamed",
                c.index, c.incarnation
            ));
        }
    }
    // Merge: the counters of every thread of every incarnation, one history.
    let mut workers = Vec::new();
    for (_, w) in std::mem::take(&mut streams.stats) {
        workers.push(w.into_stats(kinds.len())?);
    }
    if workers.is_empty() {
        workers.push(WorkerStats::with_kinds(kinds.len()));
    }
    workers[0].fatal.append(&mut streams.errors);
    if let Some(h) = history {
        workers[0].history = Some(h);
        for w in &mut workers[1..] {
            w.history = Some(History::new(0));
        }
    }
    let mut timelines: Vec<CnodeTimeline> = (0..args.cnodes)
        .map(|cnode| CnodeTimeline {
            cnode,
            commits: Vec::new(),
            aborts: Vec::new(),
        })
        .collect();
    for (&(cnode, _, _), (c, a)) in &streams.timelines {
        if let Some(t) = timelines.get_mut(cnode) {
            crate::timeline::add_into(&mut t.commits, c);
            crate::timeline::add_into(&mut t.aborts, a);
        }
    }
    if let Some(r) = &mut tso_restart {
        r.committed_after_ready = streams.committed().saturating_sub(r.committed_before_ready);
        r.thread_epochs = workers.iter().map(|w| w.tso_epoch).collect();
    }
    Ok(Measured {
        workers,
        elapsed,
        tso_restart,
        cpu: Vec::new(),
        timelines,
        fault,
        cnode_events: events,
        history_written: args.history_out.is_some(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
