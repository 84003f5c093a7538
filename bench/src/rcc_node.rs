//! RCC's nodes as processes (`txn-bench --suite rcc --processes`): every node of the
//! symmetric cluster (its partition in registered memory, its handlers and its
//! coordinators on one server thread, [`rcc::member`]) runs in an `rcc-node` process of
//! its own, with its own node id, so that one node can be killed or stopped alone. RCC
//! is shared-nothing (RCC, 3): every participant has a CPU, unlike this project's
//! memory nodes.
//!
//! The child (`rcc-node --spec JSON`, [`main`]) starts its node, says `ready` with its
//! address on stdout, and waits for `go` on stdin with every node's address (and the
//! timestamp oracle's, with `--ts tso`: the parent serves it). Its coordinators then
//! connect to every node and run; every 100 ms it reports its progress, and when its
//! coordinators ended, its report (`done`: counters, latency histogram, history,
//! network counters). It keeps serving the other nodes' coordinators until the parent
//! says `dump PATH`: it writes its partition's region to PATH, says `dumped` and exits.
//! It stops its coordinators on `stop` (the parent's watchdog), and exits when its stdin
//! closes (a parent that died) instead of serving forever.
//!
//! The parent ([`run_processes`]) starts the children, runs the watchdog on their
//! summed progress, applies the fault flags (`--kill-node-after`: kill -9;
//! `--stop-node-after` with `--stop-ms`: SIGSTOP, then SIGCONT), merges the reports and
//! checks the dumped partitions as an in-process run does ([`rcc::cluster::finish`]).
//!
//! When a node dies: RCC keeps no replicas and no logs, so the node's partition and its
//! coordinators' transactions in flight are gone, and the run cannot be checked. The
//! parent says which node died and how, stops the others (each exits within
//! [`EXIT_WAIT`], or is killed) and fails the run; it never waits for a dead node. A
//! stopped node is only slow: the others' calls to it wait (up to rrpc's call timeout,
//! 2 s by default) and the run goes on once it continues.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use clap::Parser;
use hdrhistogram::serialization::{Deserializer, Serializer, V2Serializer};
use rcc::cluster::{self, Ending, RunConfig, TsMode, Watchdog};
use rcc::coord::Stats;
use rcc::member::{Member, NodeReport};
use rcc::workload::Workload;
use rcc::{Proto, Report, Variant};
use rrpc::fabric::shm::ClusterGuard;
use rrpc::fabric::FabricKind;
use rrpc::runtime::Stats as RrpcStats;
use serde::{Deserialize, Serialize};
use txn::history::{Access, AccessKind, History};

use crate::cnode::{hex, unhex};
use crate::launcher::{default_bin_dir, reap_within, Place};
use crate::rcc_workload::RccWorkload;

/// How often a child reports its progress.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);
/// How long children may take to start and say ready, and to dump their partitions.
pub const CHILD_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a child may take to exit once told to; then it is killed.
pub const EXIT_WAIT: Duration = Duration::from_secs(3);

/// One node's part of a run, as the parent hands it to the child (`--spec`, JSON).
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct NodeSpec {
    /// This node's index (node id `node + 1`).
    pub node: usize,
    /// Nodes in the cluster.
    pub nodes: usize,
    /// The fabric's cluster name (the shm directory the parent prepared).
    pub cluster: String,
    /// Protocol name (`nowait`, ...).
    pub protocol: String,
    /// Variant name (`rpc`, `onesided`).
    pub variant: String,
    /// Coordinator co-routines on the node's thread.
    pub coroutines: usize,
    /// Seed of the generators (coordinator `i` uses `seed + i`).
    pub seed: u64,
    /// Measured run, nanoseconds.
    pub duration_ns: u64,
    /// Warm-up before it, nanoseconds.
    pub warmup_ns: u64,
    /// Fabric backend.
    pub fabric: FabricKind,
    /// Timing model of the shm fabric (`None` on verbs).
    pub model: Option<String>,
    /// One-sided doorbell batching.
    pub doorbell_batching: bool,
    /// Bytes of history kept per coordinator.
    pub history_bytes: usize,
    /// The workload.
    pub workload: RccWorkload,
}

impl NodeSpec {
    /// The run's settings as this node builds them (the parent builds the same).
    /// Errors: an unknown protocol or variant name.
    pub fn run_config(&self, ts: TsMode) -> anyhow::Result<RunConfig> {
        let proto = Proto::ALL
            .into_iter()
            .find(|p| p.name() == self.protocol)
            .ok_or_else(|| anyhow!("unknown protocol {:?}", self.protocol))?;
        let variant = [Variant::Rpc, Variant::OneSided]
            .into_iter()
            .find(|v| v.name() == self.variant)
            .ok_or_else(|| anyhow!("unknown variant {:?}", self.variant))?;
        Ok(RunConfig {
            fabric: self.fabric,
            model: self.model.clone(),
            nodes: self.nodes,
            coroutines: self.coroutines,
            proto,
            variant,
            duration: Duration::from_nanos(self.duration_ns),
            warmup: Duration::from_nanos(self.warmup_ns),
            seed: self.seed,
            history_bytes: self.history_bytes,
            fault: None,
            doorbell_batching: self.doorbell_batching,
            ts,
            watchdog: Duration::from_secs(2),
            calls: None,
        })
    }
}

/// A child's line on stdout.
#[derive(Serialize, Deserialize, Debug)]
#[serde(rename_all = "snake_case")]
pub enum Up {
    /// The node serves at `addr`, on `fabric`.
    Ready {
        /// Its rrpc address.
        addr: SocketAddr,
        /// The fabric and model, as the fabric describes itself.
        fabric: String,
    },
    /// Transactions drawn so far; whether the coordinators started.
    Progress {
        /// Transactions the coordinators drew.
        drawn: u64,
        /// The coordinators connected and started.
        started: bool,
    },
    /// The coordinators ended: their report.
    Done(Box<WireReport>),
    /// The partition is in the file the parent named.
    Dumped,
    /// The node cannot go on.
    Failed {
        /// Why.
        error: String,
    },
}

/// A parent's line on a child's stdin.
#[derive(Serialize, Deserialize, Debug)]
#[serde(rename_all = "snake_case")]
pub enum Down {
    /// Every node's address in node order, and the oracle's with `--ts tso`.
    Go {
        /// Nodes' addresses.
        addrs: Vec<SocketAddr>,
        /// The timestamp oracle's.
        oracle: Option<SocketAddr>,
    },
    /// Stop the coordinators.
    Stop,
    /// Write the partition's region to `path`, say `dumped` and exit.
    Dump {
        /// Where.
        path: PathBuf,
    },
}

/// An access as it travels: table, key, version, and whether it wrote.
type WireAccess = (u32, u64, u64, bool);

/// A [`NodeReport`] as it travels: the latency histogram in HDR V2 (hex), the history
/// as `(kind, [(table, key, version, write)])` per committed transaction.
#[derive(Serialize, Deserialize, Debug)]
pub struct WireReport {
    commits: u64,
    aborts: u64,
    user_aborts: u64,
    latency: String,
    txns: Vec<(u16, Vec<WireAccess>)>,
    /// Committed transactions left out of the history (its byte limit).
    dropped: u64,
    delta: i64,
    stats: Stats,
    per_interval: Vec<u64>,
    error: Option<String>,
    warmup_commits: u64,
    /// doorbells, WRs, messages, one-sided lists, one-sided completions, unmatched
    /// completions.
    rrpc: [u64; 6],
    start_ns: u64,
    end_ns: u64,
    calvin_seq: Vec<Vec<u64>>,
}

impl WireReport {
    /// `r` as it travels.
    pub fn from_report(r: &NodeReport) -> anyhow::Result<Self> {
        let mut latency = Vec::new();
        V2Serializer::new()
            .serialize(&r.report.latency, &mut latency)
            .map_err(|e| anyhow!("serializing the latency histogram: {e:?}"))?;
        let h = &r.report.history;
        let txns = (0..h.len())
            .map(|i| {
                let (kind, acc) = h.txn(i);
                let acc = acc
                    .iter()
                    .map(|a| (a.table, a.key, a.version, a.kind == AccessKind::Write))
                    .collect();
                (kind, acc)
            })
            .collect();
        let s = &r.rrpc;
        Ok(Self {
            commits: r.report.commits,
            aborts: r.report.aborts,
            user_aborts: r.report.user_aborts,
            latency: hex(&latency),
            txns,
            dropped: h.dropped(),
            delta: r.report.delta,
            stats: r.report.stats,
            per_interval: r.report.per_interval.clone(),
            error: r.report.error.clone(),
            warmup_commits: r.report.warmup_commits,
            rrpc: [
                s.doorbells,
                s.wrs,
                s.messages,
                s.one_sided_lists,
                s.one_sided_completions,
                s.unmatched_completions,
            ],
            start_ns: r.start_ns,
            end_ns: r.end_ns,
            calvin_seq: r.calvin_seq.clone(),
        })
    }

    /// Back to a [`NodeReport`]. Errors: a histogram that does not decode.
    pub fn into_report(self) -> anyhow::Result<NodeReport> {
        let latency = Deserializer::new()
            .deserialize(&mut &unhex(&self.latency)?[..])
            .map_err(|e| anyhow!("decoding a latency histogram: {e:?}"))?;
        let mut history = History::new(usize::MAX);
        for (kind, acc) in &self.txns {
            history.record_iter(
                *kind,
                acc.len(),
                acc.iter().map(|&(t, k, v, w)| {
                    if w {
                        Access::write(t, k, v)
                    } else {
                        Access::read(t, k, v)
                    }
                }),
            );
        }
        history.note_lost(self.dropped);
        let mut report = Report::new(0);
        report.commits = self.commits;
        report.aborts = self.aborts;
        report.user_aborts = self.user_aborts;
        report.latency = latency;
        report.history = history;
        report.delta = self.delta;
        report.stats = self.stats;
        report.per_interval = self.per_interval;
        report.error = self.error;
        report.warmup_commits = self.warmup_commits;
        let [doorbells, wrs, messages, lists, completions, unmatched] = self.rrpc;
        let rrpc = RrpcStats {
            doorbells,
            wrs,
            messages,
            one_sided_lists: lists,
            one_sided_completions: completions,
            unmatched_completions: unmatched,
            ..RrpcStats::default()
        };
        Ok(NodeReport {
            report,
            rrpc,
            start_ns: self.start_ns,
            end_ns: self.end_ns,
            calvin_seq: self.calvin_seq,
        })
    }
}

/// `rcc-node`: one node of RCC's symmetric cluster as a process of its own, started by
/// `txn-bench --suite rcc --processes` (it speaks JSON lines with its parent on stdin
/// and stdout; see the module docs).
#[derive(Parser, Debug)]
#[command(name = "rcc-node", version, about, long_about = None)]
pub struct RccNodeArgs {
    /// The node's part of the run, as JSON (what txn-bench passes).
    #[arg(long, value_name = "JSON")]
    pub spec: String,
    /// Address of the node's rrpc connection setup.
    #[arg(long, default_value = "127.0.0.1:0", value_name = "ADDR")]
    pub listen: SocketAddr,
}

/// Write `msg` as one line on stdout. Errors: a closed stdout (the parent died).
fn say(msg: &Up) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, msg)?;
    out.write_all(b"\n")?;
    out.flush()?;
    Ok(())
}

/// The child's main: run one node as the parent says (see the module docs). Errors: a
/// bad spec, a node that cannot start or connect, a parent that went away.
pub fn main(args: RccNodeArgs) -> anyhow::Result<()> {
    let spec: NodeSpec = serde_json::from_str(&args.spec).context("--spec")?;
    let wl = spec.workload.build(spec.nodes)?;
    // The oracle's presence in `go` says where timestamps come from; the member's
    // settings do not depend on it before then.
    let cfg = spec.run_config(TsMode::Local)?;
    cluster::check_config(&cfg)?;
    let member = Member::start(&cfg, wl, spec.node, &spec.cluster, args.listen)?;
    say(&Up::Ready {
        addr: member.addr(),
        fabric: member.fabric().to_string(),
    })?;
    let (tx, rx) = mpsc::channel::<Option<Down>>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            match serde_json::from_str::<Down>(&line) {
                Ok(d) => {
                    if tx.send(Some(d)).is_err() {
                        return;
                    }
                }
                Err(e) => eprintln!("rcc-node: ignoring a line from the parent: {e}"),
            }
        }
        let _ = tx.send(None);
    });
    let mut reported = false;
    loop {
        match rx.recv_timeout(PROGRESS_EVERY) {
            Ok(Some(Down::Go { addrs, oracle })) => {
                if addrs.len() != spec.nodes {
                    bail!("go: {} addresses for {} nodes", addrs.len(), spec.nodes);
                }
                member.go(addrs, oracle);
            }
            Ok(Some(Down::Stop)) => member.stop(),
            Ok(Some(Down::Dump { path })) => {
                dump(member.region(), &path)?;
                say(&Up::Dumped)?;
                return Ok(());
            }
            Ok(None) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                member.stop();
                bail!("the parent closed stdin: exiting");
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if let Some(e) = member.setup_error() {
            say(&Up::Failed { error: e.clone() })?;
            bail!("{e}");
        }
        if !reported {
            say(&Up::Progress {
                drawn: member.progress(),
                started: member.started(),
            })?;
            if member.finished() {
                say(&Up::Done(Box::new(WireReport::from_report(
                    &member.take_report(),
                )?)))?;
                reported = true;
            }
        }
    }
}

/// Write the whole region to `path` (created or truncated), in 16 MiB pieces.
fn dump(region: &rrpc::fabric::MemoryRegion, path: &Path) -> anyhow::Result<()> {
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
    );
    let mut buf = vec![0u8; 16 << 20];
    let mut off = 0;
    while off < region.len() {
        let n = buf.len().min(region.len() - off);
        region.read(off, &mut buf[..n]);
        f.write_all(&buf[..n])
            .with_context(|| format!("writing {}", path.display()))?;
        off += n;
    }
    f.flush()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Faults the parent applies to one node (`--kill-node-after`, `--stop-node-after`).
#[derive(Debug, Clone, Default)]
pub struct NodeFaults {
    /// The node they hit (default: the last).
    pub node: Option<usize>,
    /// kill -9 it this long after the coordinators were told to go.
    pub kill_after: Option<Duration>,
    /// SIGSTOP it this long after go, for `stop_for`, then SIGCONT.
    pub stop_after: Option<Duration>,
    /// How long a stopped node stays stopped.
    pub stop_for: Duration,
}

/// What [`run_processes`] found, besides the run's outcome: the fault events, one line
/// each, with milliseconds since go.
#[derive(Debug, Default)]
pub struct ProcessEvents {
    /// One line per event.
    pub lines: Vec<String>,
}

enum Event {
    Line(usize, Up),
    Closed(usize),
}

struct Kid {
    child: Child,
    stdin: Option<ChildStdin>,
    done: Option<NodeReport>,
    dumped: bool,
}

impl Kid {
    fn tell(&mut self, d: &Down) -> anyhow::Result<()> {
        let w = self.stdin.as_mut().context("the node's stdin is closed")?;
        serde_json::to_writer(&mut *w, d)?;
        w.write_all(b"\n")?;
        w.flush()?;
        Ok(())
    }
}

/// The children, killed (if still running) and reaped on drop.
struct Kids(Vec<Kid>);

impl Drop for Kids {
    fn drop(&mut self) {
        for k in &mut self.0 {
            k.stdin = None;
        }
        for k in &mut self.0 {
            reap_within(&mut k.child, EXIT_WAIT);
        }
    }
}

/// Run `cfg` with every node an `rcc-node` process (`bin_dir`: where the binary is; the
/// running executable's directory by default), `wl_args` building the same workload in
/// each, `faults` applied; check the result as [`rcc::cluster::run`] does. `cfg.calls`
/// and `cfg.fault` are refused (the tonic transport and planted bugs run in one
/// process). Errors: a child that cannot start, a node that died (named, with how), a
/// run that did not end in time.
pub fn run_processes(
    cfg: &RunConfig,
    wl_args: &RccWorkload,
    faults: &NodeFaults,
    bin_dir: Option<&Path>,
) -> anyhow::Result<(rcc::cluster::Outcome, ProcessEvents)> {
    cluster::check_config(cfg)?;
    if cfg.calls.is_some() || cfg.fault.is_some() {
        bail!("rcc-node processes run rrpc without planted bugs: --transport-compare and planted faults run in one process");
    }
    let wl: Arc<dyn Workload + Send + Sync> = wl_args.build(cfg.nodes)?;
    let layout = cluster::layout_of(cfg, &*wl)?;
    let name = format!(
        "rccp-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let _guard = match cfg.fabric {
        FabricKind::Shm => Some(
            ClusterGuard::new(&name)
                .context("preparing the shm cluster")?
                .0,
        ),
        FabricKind::Verbs => None,
    };
    let dumps = std::env::temp_dir().join(&name);
    std::fs::create_dir_all(&dumps).with_context(|| format!("creating {}", dumps.display()))?;
    let _dumps = RemoveDir(dumps.clone());
    let bin = bin_dir
        .map(Path::to_path_buf)
        .unwrap_or_else(default_bin_dir)
        .join("rcc-node");
    let victim = faults.node.unwrap_or(cfg.nodes - 1);
    if victim >= cfg.nodes {
        bail!(
            "the faulted node {victim} is not one of the {} nodes",
            cfg.nodes
        );
    }
    let (ev_tx, ev_rx) = mpsc::channel();
    let mut kids = Kids(Vec::new());
    for n in 0..cfg.nodes {
        let spec = NodeSpec {
            node: n,
            nodes: cfg.nodes,
            cluster: name.clone(),
            protocol: cfg.proto.name().to_string(),
            variant: cfg.variant.name().to_string(),
            coroutines: cfg.coroutines,
            seed: cfg.seed,
            duration_ns: cfg.duration.as_nanos() as u64,
            warmup_ns: cfg.warmup.as_nanos() as u64,
            fabric: cfg.fabric,
            model: cfg.model.clone(),
            doorbell_batching: cfg.doorbell_batching,
            history_bytes: cfg.history_bytes,
            workload: wl_args.clone(),
        };
        let mut child = Command::new(&bin)
            .arg("--spec")
            .arg(serde_json::to_string(&spec)?)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| {
                format!(
                    "starting {} (build the workspace's binaries)",
                    bin.display()
                )
            })?;
        let stdout = child.stdout.take().expect("piped");
        let stdin = child.stdin.take();
        let tx = ev_tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                match serde_json::from_str::<Up>(&line) {
                    Ok(u) => {
                        if tx.send(Event::Line(n, u)).is_err() {
                            return;
                        }
                    }
                    Err(e) => eprintln!("rcc-node {n}: unreadable line ({e}): {line}"),
                }
            }
            let _ = tx.send(Event::Closed(n));
        });
        kids.0.push(Kid {
            child,
            stdin,
            done: None,
            dumped: false,
        });
    }
    drop(ev_tx);
    // Every node ready.
    let mut addrs: Vec<Option<SocketAddr>> = vec![None; cfg.nodes];
    let mut fabric = String::new();
    let ready_by = Instant::now() + CHILD_TIMEOUT;
    while addrs.iter().any(Option::is_none) {
        let left = ready_by.saturating_duration_since(Instant::now());
        match ev_rx.recv_timeout(left) {
            Ok(Event::Line(n, Up::Ready { addr, fabric: f })) => {
                addrs[n] = Some(addr);
                fabric = f;
            }
            Ok(Event::Line(n, Up::Failed { error })) => bail!("rcc-node {n}: {error}"),
            Ok(Event::Line(..)) => {}
            Ok(Event::Closed(n)) => {
                let st = kids.0[n].child.wait().ok();
                bail!(
                    "rcc-node {n} exited before it was ready ({})",
                    exit_text(st)
                );
            }
            Err(_) => bail!(
                "the rcc-node processes did not all start within {} s",
                CHILD_TIMEOUT.as_secs()
            ),
        }
    }
    let addrs: Vec<SocketAddr> = addrs.into_iter().map(|a| a.expect("all ready")).collect();
    let oracle = match cfg.ts {
        TsMode::Local => None,
        TsMode::Tso => Some(cluster::start_oracle(cfg, &name)?),
    };
    let oracle_addr = oracle.as_ref().map(|(_, node)| node.addr());
    for k in &mut kids.0 {
        k.tell(&Down::Go {
            addrs: addrs.clone(),
            oracle: oracle_addr,
        })?;
    }
    let go = Instant::now();
    let ms = || go.elapsed().as_secs_f64() * 1e3;
    let mut events = ProcessEvents::default();
    let mut watchdog = Watchdog::new(cfg);
    let mut progress = vec![(0u64, false); cfg.nodes];
    // --stop-node-after: when the node was stopped, and whether it was continued.
    let (mut killed, mut stopped_at, mut continued) = (false, None::<Instant>, false);
    let deadline = go + cfg.warmup + cfg.duration + Duration::from_secs(30);
    // Run until every node reported.
    while kids.0.iter().any(|k| k.done.is_none()) {
        match ev_rx.recv_timeout(Duration::from_millis(10)) {
            Ok(Event::Line(n, Up::Progress { drawn, started })) => progress[n] = (drawn, started),
            Ok(Event::Line(n, Up::Done(r))) => {
                kids.0[n].done = Some(
                    r.into_report()
                        .with_context(|| format!("rcc-node {n}'s report"))?,
                )
            }
            Ok(Event::Line(n, Up::Failed { error })) => bail!("rcc-node {n}: {error}"),
            Ok(Event::Line(..)) => {}
            Ok(Event::Closed(n)) => {
                let st = kids.0[n].child.wait().ok();
                let what = format!(
                    "rcc-node {n} (pid {}) exited at {:.0} ms before the run ended ({})",
                    kids.0[n].child.id(),
                    ms(),
                    exit_text(st)
                );
                events.lines.push(what.clone());
                for k in &mut kids.0 {
                    let _ = k.tell(&Down::Stop);
                }
                bail!(
                    "{what}: RCC keeps no replicas or logs, so its partition and its \
                     transactions in flight are gone and the run cannot be checked; the \
                     other nodes were stopped"
                );
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => bail!("every rcc-node closed its stdout"),
        }
        let since = go.elapsed();
        if !killed && faults.kill_after.is_some_and(|k| since >= k) {
            killed = true;
            let pid = kids.0[victim].child.id();
            Place::Local.signal(pid, "KILL")?;
            events.lines.push(format!(
                "rcc-node {victim} (pid {pid}) killed (SIGKILL) at {:.0} ms",
                ms()
            ));
        }
        if stopped_at.is_none() && faults.stop_after.is_some_and(|k| since >= k) {
            let pid = kids.0[victim].child.id();
            Place::Local.signal(pid, "STOP")?;
            stopped_at = Some(Instant::now());
            events.lines.push(format!(
                "rcc-node {victim} (pid {pid}) stopped (SIGSTOP) at {:.0} ms for {} ms",
                ms(),
                faults.stop_for.as_millis()
            ));
        }
        if !continued && stopped_at.is_some_and(|t| t.elapsed() >= faults.stop_for) {
            let pid = kids.0[victim].child.id();
            Place::Local.signal(pid, "CONT")?;
            continued = true;
            events.lines.push(format!(
                "rcc-node {victim} (pid {pid}) continued (SIGCONT) at {:.0} ms",
                ms()
            ));
        }
        let started = progress.iter().all(|p| p.1);
        let drawn = progress.iter().map(|p| p.0).sum();
        let finished = kids.0.iter().filter(|k| k.done.is_some()).count() * cfg.coroutines;
        if watchdog.poll(started, drawn, finished) {
            for k in &mut kids.0 {
                let _ = k.tell(&Down::Stop);
            }
        }
        if Instant::now() > deadline {
            bail!(
                "the nodes did not finish within 30 s of the run's end ({} of {} reported)",
                kids.0.iter().filter(|k| k.done.is_some()).count(),
                cfg.nodes
            );
        }
    }
    // Every coordinator ended: the partitions are final.
    for (n, k) in kids.0.iter_mut().enumerate() {
        k.tell(&Down::Dump {
            path: dumps.join(format!("node-{n}")),
        })?;
    }
    let dump_by = Instant::now() + CHILD_TIMEOUT;
    while kids.0.iter().any(|k| !k.dumped) {
        let left = dump_by.saturating_duration_since(Instant::now());
        match ev_rx.recv_timeout(left) {
            Ok(Event::Line(n, Up::Dumped)) => kids.0[n].dumped = true,
            Ok(Event::Line(n, Up::Failed { error })) => bail!("rcc-node {n}: {error}"),
            Ok(Event::Line(..)) => {}
            Ok(Event::Closed(n)) if !kids.0[n].dumped => {
                let st = kids.0[n].child.wait().ok();
                bail!(
                    "rcc-node {n} exited before it wrote its partition ({})",
                    exit_text(st)
                );
            }
            Ok(Event::Closed(_)) => {}
            Err(_) => bail!(
                "the rcc-node processes did not write their partitions within {} s",
                CHILD_TIMEOUT.as_secs()
            ),
        }
    }
    let reports: Vec<NodeReport> = kids
        .0
        .iter_mut()
        .map(|k| k.done.take().expect("every node reported"))
        .collect();
    drop(kids);
    let regions = (0..cfg.nodes)
        .map(|n| {
            let p = dumps.join(format!("node-{n}"));
            std::fs::read(&p).with_context(|| format!("reading {}", p.display()))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let tuple = |node: usize, off: u64, len: usize| {
        let off = off as usize;
        regions[node]
            .get(off..off + len)
            .map_or_else(|| vec![0; len], <[u8]>::to_vec)
    };
    let oracle_timestamps = oracle.map(|(o, node)| {
        drop(node);
        o.current().get() & tso::timestamp::COUNTER_MASK
    });
    let out = cluster::finish(
        cfg,
        &layout,
        &*wl,
        reports,
        &tuple,
        Ending {
            stalled: watchdog.stalled(),
            stall: watchdog.stall.take(),
            fabric,
            oracle_timestamps,
        },
    );
    Ok((out, events))
}

static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A directory removed on drop.
struct RemoveDir(PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// How a child ended, in words: its exit code or the signal that killed it.
fn exit_text(st: Option<std::process::ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match st {
        None => "its status is unknown".into(),
        Some(s) => match (s.code(), s.signal()) {
            (Some(c), _) => format!("exit code {c}"),
            (None, Some(9)) => "killed by signal 9, SIGKILL".into(),
            (None, Some(sig)) => format!("killed by signal {sig}"),
            (None, None) => s.to_string(),
        },
    }
}
