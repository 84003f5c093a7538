//! `txn-bench`'s run: SmallBank, KVS or YCSB (`--workload`, [`crate::ycsb`]) on local clusters over the shm fabric (the binary in
//! `src/bin/txn-bench.rs` parses flags and handles signals; tests call [`run`] directly).
//!
//! Each run starts `--memnodes` memory nodes (the tables partitioned across them by
//! key), a timestamp oracle and, for Scythe, a lock service as child processes, loads
//! SmallBank, runs `threads x coroutines` coordinators of one protocol
//! ([`txn::coordinator::Protocol`]) for a fixed duration, prints committed throughput,
//! p50/p99 latency of committed transactions and abort rates per transaction type, then
//! checks the run: total money must equal the initial total plus the net of committed
//! deposits and withdrawals, no lock may be left held (CVT lock words, and the lock
//! service's locks for Scythe), every transaction type must have committed, and (unless
//! `--no-check`) the recorded history of committed transactions must be serializable
//! (`occ-cas`, `scythe`, `mvcc`) or satisfy snapshot isolation (`mvcc-si`). KVS and
//! YCSB replace the money audit by their own check: every key (loaded and inserted) read
//! after the run carries a valid checksum, and the sum of the keys' update counters
//! equals the updates of committed transactions.
//!
//! `--protocol all` runs `occ-cas`, `scythe` and `mvcc` (at `--isolation`) one after
//! another, each on a freshly started and loaded cluster with the same seed, backoff and
//! timing model, and prints a comparison table and the ratios of p99 (`scythe` over
//! `occ-cas`) and throughput (MVCC over `occ-cas`). `--sweep theta=...` or `--sweep
//! clients=...` repeats that at each point; `--chart` draws throughput against p99.

use rrpc::NodeId;
use std::cell::RefCell;
use std::fmt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Parser, ValueEnum};
use rand::{Rng, SeedableRng};
use rrpc::fabric::{Fabric, FabricConfig, FabricKind};
use rrpc::runtime::{join_all, Executor, RuntimeConfig, ThreadCtx};
use serde::Serialize;
use txn::coordinator::{
    AbortReason, ClusterAddrs, Isolation, Protocol, TxnClient, TxnConfig, TxnError,
};

use crate::launcher::{default_bin_dir, LocalCluster};
use crate::plot::{LineChart, Scale, Series};
use crate::report::{comparison, ratios, Ratio, Report, TsoRestart, TypeStats, WorkerStats};
use crate::smallbank::{self, Generator};
use crate::ycsb::{self, KvsGenerator, RunError, Workload};

/// SmallBank, KVS or YCSB on a local cluster (memnode, tso and lockd child processes)
/// over the shm fabric, with one transaction protocol or all of them side by side.
#[derive(Parser, Debug, Clone)]
#[command(version, about, long_about = None)]
pub struct Args {
    /// Workload: smallbank, kvs (one read or update per transaction, half each), ycsb-a
    /// (50% reads / 50% updates), ycsb-b (95/5), ycsb-c (reads), ycsb-d (95% reads of
    /// the latest keys / 5% inserts), ycsb-f (50% reads / 50% read-modify-writes).
    /// ycsb-e is refused: no protocol here offers range scans.
    #[arg(long, default_value = "smallbank", value_name = "WORKLOAD")]
    pub workload: Workload,
    /// KVS / YCSB records (keys 0..N loaded).
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    pub records: u64,
    /// KVS / YCSB operations per transaction, on distinct keys (default 1 for kvs, 4
    /// for ycsb-*).
    #[arg(long, value_name = "N")]
    pub ops_per_txn: Option<usize>,
    /// KVS / YCSB value size in bytes (at least 16: update counter and checksum).
    #[arg(long, default_value_t = txn::kvs::DEFAULT_VALUE_BYTES, value_name = "BYTES")]
    pub value_bytes: usize,
    /// Concurrency control: occ-cas (OCC with CAS locks in the CVT header), scythe
    /// (hot-aware OCC/TOCC on Takeout Locks), mvcc (Motor's MVCC at --isolation), mvcc-si,
    /// or all (occ-cas, scythe and mvcc one after another, each on a fresh cluster, then
    /// a comparison).
    #[arg(long, default_value = "scythe", value_name = "PROTOCOL")]
    pub protocol: ProtocolArg,
    /// Isolation of mvcc (and of the mvcc run of --protocol all): sr (serializable) or si
    /// (snapshot isolation). Default sr.
    #[arg(long, value_enum, value_name = "LEVEL")]
    pub isolation: Option<IsolationArg>,
    /// Memory nodes to start; the tables are partitioned across them by key.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub memnodes: u32,
    /// Version cells per CVT (how many versions each record keeps; 1 to 64).
    #[arg(long, default_value_t = txn::smallbank::DEFAULT_VERSIONS, value_name = "V")]
    pub versions: usize,
    /// Scythe's TOCC heuristic wait before a hot-mode lock request on a warm object, in
    /// microseconds (0 turns it off).
    #[arg(long, default_value_t = 20, value_name = "US")]
    pub tocc_wait_us: u64,
    /// Repeat the run(s) at each point: theta=0,0.5,0.99 (Zipf theta) or clients=8,16,32
    /// (coroutines per thread); prints a table, and with --chart draws throughput
    /// against p99, one line per protocol.
    #[arg(long, value_name = "PARAM=V1,V2,...")]
    pub sweep: Option<Sweep>,
    /// Draw throughput against p99 per protocol to this .svg or .png file (with --sweep,
    /// one line per protocol through the sweep's points).
    #[arg(long, value_name = "PATH")]
    pub chart: Option<PathBuf>,
    /// Coordinator threads (each runs its own executor; pinned to cores when possible).
    /// Default: one less than the cores available (at least 1), leaving a core to the
    /// lock service's polling thread.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Coordinators (coroutines) per thread.
    #[arg(long, default_value_t = 8)]
    pub coroutines: usize,
    /// SmallBank accounts.
    #[arg(long, default_value_t = 100_000)]
    pub accounts: u64,
    /// Zipf theta of account (key) choice (0 = uniform).
    #[arg(long, default_value_t = 0.99)]
    pub theta: f64,
    /// Measured run time of each run (each protocol, each sweep point) in seconds.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Write every run's report, the comparison's ratios and the verdict as JSON to this
    /// file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Fabric backend: shm, or verbs (RDMA NICs, Soft-RoCE; needs a build with
    /// `--features rrpc/verbs`).
    #[arg(long, env = "RRPC_FABRIC", default_value = "shm")]
    pub fabric: FabricKind,
    /// RDMA device for --fabric verbs (default: $RRPC_RDMA_DEVICE, else the first).
    #[arg(long, env = "RRPC_RDMA_DEVICE")]
    pub rdma_device: Option<String>,
    /// GID index for --fabric verbs (default: $RRPC_GID_INDEX, else RoCEv2 IPv4-mapped).
    #[arg(long, env = "RRPC_GID_INDEX")]
    pub gid_index: Option<u32>,
    /// Timing model of the shm fabric, for this process and every service it starts:
    /// none, cx5, cx6, rxe (built-in RNIC profiles) or the path of a TOML profile.
    #[arg(long, env = "RRPC_MODEL", default_value = "none", value_name = "MODEL")]
    pub model: String,
    /// Cluster name (default: txn-bench-<pid>; with several runs, each run's cluster
    /// gets a suffix -<run>).
    #[arg(long)]
    pub cluster: Option<String>,
    /// Directory of the memnode, lockd and tso binaries (default: next to this binary).
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    /// Server threads of the lock service.
    #[arg(long, default_value_t = 1)]
    pub lockd_threads: usize,
    /// Scythe's ColdWatermark (queued tickets above which a cold-mode Lock RPC is
    /// refused and the retry runs TOCC).
    #[arg(long, default_value_t = 3, value_name = "TICKETS")]
    pub cold_watermark: u64,
    /// Scythe's HotWatermark (queued tickets above which every Lock RPC is refused).
    #[arg(long, default_value_t = 10, value_name = "TICKETS")]
    pub hot_watermark: u64,
    /// Longest randomized exponential backoff after a conflict abort, in microseconds
    /// (0 retries at once).
    #[arg(long, default_value_t = 100)]
    pub max_backoff_us: u64,
    /// How long a Scythe coordinator waits for a granted lock's turn before it aborts
    /// the transaction (lock-wait-timeout); its tickets are then released in the
    /// background when their turn comes. Microseconds.
    #[arg(long, default_value_t = 2_000_000, value_name = "US")]
    pub lock_wait_us: u64,
    /// RNG seed (each coroutine derives its own; every run uses the same seeds).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Do not record committed transactions or check serializability / snapshot
    /// isolation (for long runs; the check holds about 84 bytes per committed SmallBank
    /// transaction and needs about 300 while it runs).
    #[arg(long)]
    pub no_check: bool,
    /// Fault injection: SIGKILL the timestamp oracle this many seconds into each
    /// measured run and restart it with the same state directory and address after
    /// `--tso-down-ms`. Coordinators wait for it and switch to its new epoch; the run
    /// passes only if commits continue after the restart (reported as `tso restart`).
    #[arg(long, value_name = "SECONDS")]
    pub kill_tso_after: Option<f64>,
    /// With `--kill-tso-after`: milliseconds the oracle stays down before its restart.
    #[arg(long, default_value_t = 300, value_name = "MS")]
    pub tso_down_ms: u64,
    /// History memory for the checks, MiB over all threads of a run; past it, later
    /// commits are not recorded and the check says it was partial. The check itself
    /// needs about 3.5x this at its peak.
    #[arg(long, default_value_t = 2048, value_name = "MIB")]
    pub check_memory_mb: usize,
}

/// The `--protocol` flag: one protocol, or all of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProtocolArg {
    /// One protocol named with its isolation (`mvcc-sr`, `mvcc-si`) or without one.
    One(Protocol),
    /// `mvcc`: MVCC at the isolation of `--isolation`.
    Mvcc,
    /// `occ-cas`, `scythe` and `mvcc` (at `--isolation`), one after another.
    All,
}

impl FromStr for ProtocolArg {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "all" => Ok(Self::All),
            "mvcc" => Ok(Self::Mvcc),
            _ => s.parse::<Protocol>().map(Self::One).map_err(|_| {
                format!("unknown protocol {s:?}: occ-cas, scythe, mvcc (mvcc-sr), mvcc-si or all")
            }),
        }
    }
}

/// The `--isolation` flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum IsolationArg {
    /// Serializability.
    Sr,
    /// Snapshot isolation.
    Si,
}

/// The `--sweep` flag: a parameter and its points.
#[derive(Clone, Debug, PartialEq)]
pub enum Sweep {
    /// Zipf theta values.
    Theta(Vec<f64>),
    /// Coroutines per thread.
    Clients(Vec<usize>),
}

impl FromStr for Sweep {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let Some((param, values)) = s.split_once('=') else {
            return Err(format!(
                "--sweep {s:?}: expected theta=V1,V2,... or clients=N1,N2,..."
            ));
        };
        let values: Vec<&str> = values.split(',').map(str::trim).collect();
        if values.iter().any(|v| v.is_empty()) {
            return Err(format!("--sweep {s:?}: empty value in the list"));
        }
        match param.trim() {
            "theta" => values
                .iter()
                .map(|v| match v.parse::<f64>() {
                    Ok(t) if t >= 0.0 && t.is_finite() => Ok(t),
                    _ => Err(format!(
                        "--sweep theta: {v:?} is not a Zipf theta (a number >= 0)"
                    )),
                })
                .collect::<Result<_, _>>()
                .map(Self::Theta),
            "clients" => values
                .iter()
                .map(|v| match v.parse::<usize>() {
                    Ok(n) if n >= 1 => Ok(n),
                    _ => Err(format!(
                        "--sweep clients: {v:?} is not a number of coroutines per thread (>= 1)"
                    )),
                })
                .collect::<Result<_, _>>()
                .map(Self::Clients),
            p => Err(format!(
                "--sweep: unknown parameter {p:?}: theta or clients"
            )),
        }
    }
}

impl fmt::Display for Sweep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let join = |v: Vec<String>| v.join(",");
        match self {
            Self::Theta(v) => write!(f, "theta={}", join(v.iter().map(f64::to_string).collect())),
            Self::Clients(v) => write!(
                f,
                "clients={}",
                join(v.iter().map(usize::to_string).collect())
            ),
        }
    }
}

/// One point of a run plan: the workload parameters a sweep varies.
#[derive(Clone, Debug)]
struct Point {
    theta: f64,
    coroutines: usize,
    /// `theta=0.5`, `clients=16`; `None` without a sweep.
    label: Option<String>,
}

/// A point's transaction generator.
enum Gen {
    SmallBank(Generator),
    Kvs(KvsGenerator),
}

impl Args {
    /// Keys per table: SmallBank's accounts or the KVS records.
    fn keys(&self) -> u64 {
        if self.workload.is_kvs() {
            self.records
        } else {
            self.accounts
        }
    }

    /// Transaction kinds, in the order of the report (and of the history's kinds).
    fn kinds(&self) -> Vec<&'static str> {
        if self.workload.is_kvs() {
            self.workload.kinds().to_vec()
        } else {
            smallbank::TxnType::ALL.iter().map(|t| t.name()).collect()
        }
    }

    /// The workload as the reports name it.
    fn workload_label(&self) -> String {
        if self.workload.is_kvs() {
            self.workload.name().into()
        } else {
            "SmallBank".into()
        }
    }

    /// Size of the data: `N accounts`, or records, value size and operations per
    /// transaction.
    fn scale(&self) -> String {
        if self.workload.is_kvs() {
            format!(
                "{} records x {} B, {} ops/txn",
                self.records,
                self.value_bytes,
                self.ops_per_txn()
            )
        } else {
            format!("{} accounts", self.accounts)
        }
    }

    fn ops_per_txn(&self) -> usize {
        self.ops_per_txn
            .unwrap_or_else(|| self.workload.default_ops())
    }

    /// The protocols to run, in order, after checking `--protocol` against
    /// `--isolation`.
    pub fn protocols(&self) -> anyhow::Result<Vec<Protocol>> {
        let iso = match self.isolation {
            None | Some(IsolationArg::Sr) => Isolation::Serializable,
            Some(IsolationArg::Si) => Isolation::Snapshot,
        };
        Ok(match (self.protocol, self.isolation) {
            (ProtocolArg::All, _) => vec![Protocol::OccCas, Protocol::Scythe, Protocol::Mvcc(iso)],
            (ProtocolArg::Mvcc, _) => vec![Protocol::Mvcc(iso)],
            (ProtocolArg::One(p @ Protocol::Mvcc(i)), Some(_)) if i != iso => {
                bail!(
                "--protocol {p} contradicts --isolation {} (use --protocol mvcc --isolation LEVEL)",
                if iso == Isolation::Snapshot { "si" } else { "sr" }
            )
            }
            (ProtocolArg::One(p @ Protocol::Mvcc(_)), _) => vec![p],
            (ProtocolArg::One(p), Some(IsolationArg::Si)) => bail!(
                "--isolation si applies to mvcc (and to the mvcc run of --protocol all), not to {p}"
            ),
            (ProtocolArg::One(p), _) => vec![p],
        })
    }

    fn points(&self) -> Vec<Point> {
        match &self.sweep {
            None => vec![Point {
                theta: self.theta,
                coroutines: self.coroutines,
                label: None,
            }],
            Some(Sweep::Theta(v)) => v
                .iter()
                .map(|&theta| Point {
                    theta,
                    coroutines: self.coroutines,
                    label: Some(format!("theta={theta}")),
                })
                .collect(),
            Some(Sweep::Clients(v)) => v
                .iter()
                .map(|&coroutines| Point {
                    theta: self.theta,
                    coroutines,
                    label: Some(format!("clients={coroutines}")),
                })
                .collect(),
        }
    }
}

const NODE_LOCKD: u32 = 2;
const NODE_TSO: u32 = 3;
/// Memory node `i` is node `NODE_MEMNODE + i`.
const NODE_MEMNODE: u32 = 10;
const NODE_CN: u32 = 100;
/// Most memory nodes a run starts (their node ids stay below the compute node's).
pub const MAX_MEMNODES: u32 = NODE_CN - NODE_MEMNODE;

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every check of every run passed (the runs may have been stopped early through
    /// `stop`).
    Passed,
    /// A check failed in some run (money, locks, a type that never committed,
    /// serializability or snapshot isolation) or a coordinator hit a service failure.
    Failed,
}

/// Everything one invocation measured: each run's report, the ratios of the comparison,
/// and the verdict (what `--json` writes).
#[derive(Serialize, Debug)]
pub struct Summary {
    /// Workload name.
    pub workload: String,
    /// Timing model with its parameters (of the first run; every run uses the same).
    pub timing_model: String,
    /// The protocols run, in order.
    pub protocols: Vec<String>,
    /// The sweep (`theta=0,0.5`), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sweep: Option<String>,
    /// Each run's report, in the order run (sweep points outer, protocols inner).
    pub runs: Vec<Report>,
    /// `p99 scythe/occ-cas` and `throughput mvcc/occ-cas` (per sweep point) wherever
    /// both protocols ran.
    pub ratios: Vec<Ratio>,
    /// Every run passed all of its checks.
    pub passed: bool,
    /// Runs left out because the invocation was interrupted.
    pub skipped_runs: usize,
}

/// Run the benchmark as `args` say, printing the configuration, progress (stderr) and
/// the reports, then (several runs) the comparison. Setting `stop` ends the measured run
/// in progress early (Ctrl-C; its checks still run) and skips the runs not started.
///
/// Errors: bad arguments, a cluster that does not start, a service that dies, a
/// coordinator thread that panics, a chart or JSON file that cannot be written; a failed
/// check is not an error but [`Outcome::Failed`].
pub fn run(mut args: Args, stop: Arc<AtomicBool>) -> anyhow::Result<(Summary, Outcome)> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = *args.threads.get_or_insert(cores.saturating_sub(1).max(1));
    if threads == 0 || args.coroutines == 0 {
        bail!("--threads and --coroutines must be at least 1");
    }
    if args.accounts < 2 {
        bail!("--accounts must be at least 2");
    }
    if args.workload.is_kvs() && args.value_bytes < txn::kvs::MIN_VALUE_BYTES {
        bail!(
            "--value-bytes must be at least {} (got {})",
            txn::kvs::MIN_VALUE_BYTES,
            args.value_bytes
        );
    }
    if !(args.duration > 0.0 && args.duration.is_finite()) {
        bail!("--duration must be a positive number of seconds");
    }
    if !(1..=MAX_MEMNODES).contains(&args.memnodes) {
        bail!(
            "--memnodes must be 1 to {MAX_MEMNODES} (got {})",
            args.memnodes
        );
    }
    if !(1..=64).contains(&args.versions) {
        bail!("--versions must be 1 to 64 (got {})", args.versions);
    }
    if args
        .kill_tso_after
        .is_some_and(|k| !(k >= 0.0 && k < args.duration))
    {
        bail!("--kill-tso-after must lie within the run (0 <= SECONDS < --duration)");
    }
    if !args.no_check && args.check_memory_mb == 0 {
        bail!("--check-memory-mb must be at least 1 (or pass --no-check)");
    }
    if let Some(c) = &args.chart {
        match c.extension().and_then(|e| e.to_str()) {
            Some("svg" | "png") => {}
            _ => bail!("--chart {} must end in .svg or .png", c.display()),
        }
    }
    let protocols = args.protocols()?;
    let points = args.points();
    // Every point's generator now: a bad theta fails before any cluster starts.
    let gens = points
        .iter()
        .map(|p| {
            let g = if args.workload.is_kvs() {
                KvsGenerator::new(args.workload, args.records, p.theta, args.ops_per_txn())
                    .map(Gen::Kvs)
            } else {
                Generator::new(args.accounts, p.theta).map(Gen::SmallBank)
            };
            g.map(Arc::new)
                .with_context(|| format!("--theta {}", p.theta))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;

    let plan: Vec<(usize, Protocol)> = (0..points.len())
        .flat_map(|i| protocols.iter().map(move |&p| (i, p)))
        .collect();
    let base = args
        .cluster
        .clone()
        .unwrap_or_else(|| format!("txn-bench-{}", std::process::id()));
    let mut runs = Vec::new();
    for (k, &(pi, protocol)) in plan.iter().enumerate() {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let point = &points[pi];
        let what = match &point.label {
            Some(l) => format!("{protocol} at {l}"),
            None => protocol.to_string(),
        };
        if plan.len() > 1 {
            eprintln!("== run {}/{}: {what}", k + 1, plan.len());
        }
        let cluster = if plan.len() > 1 {
            format!("{base}-{}", k + 1)
        } else {
            base.clone()
        };
        let report = run_one(&args, protocol, point, gens[pi].clone(), &cluster, &stop)
            .with_context(|| format!("run of {what}"))?;
        print!("{}", report.render());
        runs.push(report);
    }
    let skipped_runs = plan.len() - runs.len();
    if skipped_runs > 0 {
        eprintln!("interrupted: {skipped_runs} run(s) not started");
    }

    let ratios = ratios(&runs);
    let passed = !runs.is_empty() && runs.iter().all(Report::passed);
    let summary = Summary {
        workload: args.workload_label(),
        timing_model: runs
            .first()
            .map_or_else(|| args.model.clone(), |r| r.timing_model.clone()),
        protocols: protocols.iter().map(|p| p.name().to_string()).collect(),
        sweep: args.sweep.as_ref().map(Sweep::to_string),
        runs,
        ratios,
        passed,
        skipped_runs,
    };
    if plan.len() > 1 {
        print!("{}", render_comparison(&args, &summary));
    }
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_string_pretty(&summary)?)
            .with_context(|| format!("writing {}", p.display()))?;
        eprintln!("wrote {}", p.display());
    }
    if let Some(p) = &args.chart {
        if !summary.runs.is_empty() {
            draw_chart(p, &args, &summary)?;
            eprintln!("wrote {}", p.display());
        }
    }
    Ok(if passed {
        (summary, Outcome::Passed)
    } else {
        (summary, Outcome::Failed)
    })
}

/// The comparison: a header with the configuration (timing model first), the table,
/// the ratios and the verdict.
fn render_comparison(args: &Args, sum: &Summary) -> String {
    let threads = args.threads.unwrap_or(1);
    let workload = match &args.sweep {
        Some(Sweep::Theta(_)) => format!(
            "{threads} thread(s) x {} coroutines | {} | sweep {}",
            args.coroutines,
            args.scale(),
            args.sweep.as_ref().expect("a sweep")
        ),
        Some(Sweep::Clients(_)) => format!(
            "{threads} thread(s) x clients coroutines | {} | Zipf theta {} | sweep {}",
            args.scale(),
            args.theta,
            args.sweep.as_ref().expect("a sweep")
        ),
        None => format!(
            "{threads} thread(s) x {} coroutines | {} | Zipf theta {}",
            args.coroutines,
            args.scale(),
            args.theta
        ),
    };
    let mut s = format!(
        "\ncomparison: {} | timing model: {} | fabric: {} | {workload} | {} memnode(s), {} versions | {} s per run | seed {} | backoff up to {} us\n",
        args.workload_label(),
        sum.timing_model,
        args.fabric,
        args.memnodes,
        args.versions,
        args.duration,
        args.seed,
        args.max_backoff_us
    );
    s.push_str(&comparison(&sum.runs));
    for r in &sum.ratios {
        s.push_str(&r.line());
        s.push('\n');
    }
    let failed: Vec<String> = sum
        .runs
        .iter()
        .filter(|r| !r.passed())
        .map(|r| match &r.point {
            Some(p) => format!("{} ({p})", r.protocol),
            None => r.protocol.clone(),
        })
        .collect();
    if failed.is_empty() && sum.skipped_runs == 0 {
        s.push_str("every run passed its checks\n");
    } else if failed.is_empty() {
        s.push_str(&format!(
            "every run passed its checks; {} run(s) skipped (interrupted)\n",
            sum.skipped_runs
        ));
    } else {
        s.push_str(&format!("FAILED: {}\n", failed.join(", ")));
    }
    s
}

/// `--chart`: throughput (x) against p99 (y), one series per protocol through the sweep's
/// points (one point each without a sweep).
fn draw_chart(path: &Path, args: &Args, sum: &Summary) -> anyhow::Result<()> {
    let mut series: Vec<Series> = Vec::new();
    for r in &sum.runs {
        let pt = (r.throughput_tps, r.p99_us);
        match series.iter_mut().find(|s| s.name == r.protocol) {
            Some(s) => s.points.push(pt),
            None => series.push(Series {
                name: r.protocol.clone(),
                points: vec![pt],
            }),
        }
    }
    let title = match &args.sweep {
        Some(sw) => format!(
            "{}: throughput vs p99, sweep {sw} (model {})",
            args.workload_label(),
            args.model
        ),
        None => format!(
            "{}: throughput vs p99, theta {}, {} x {} clients (model {})",
            args.workload_label(),
            args.theta,
            args.threads.unwrap_or(1),
            args.coroutines,
            args.model
        ),
    };
    LineChart {
        title: &title,
        x_label: "committed transactions/s",
        y_label: "p99 latency of committed transactions (us)",
        x_scale: Scale::Linear,
        y_scale: Scale::Linear,
        series: &series,
    }
    .draw(path)
    .with_context(|| format!("drawing {}", path.display()))
}

/// One run: `protocol` at `point` on a fresh cluster named `cluster_name`.
fn run_one(
    args: &Args,
    protocol: Protocol,
    point: &Point,
    gen: Arc<Gen>,
    cluster_name: &str,
    stop: &AtomicBool,
) -> anyhow::Result<Report> {
    let threads = args.threads.unwrap_or(1).max(1);
    let mut cluster = LocalCluster::new(
        cluster_name,
        args.bin_dir.clone().unwrap_or_else(default_bin_dir),
    )?;
    // This process's fabric first: a missing RDMA device fails here, in one line.
    let mut fcfg = FabricConfig::new(args.fabric, cluster_name, NodeId(NODE_CN));
    fcfg.device = args.rdma_device.clone();
    fcfg.gid_index = args.gid_index;
    fcfg.model = Some(args.model.clone());
    let fabric = Fabric::open(&fcfg)?;
    let mut common = vec![
        "--fabric".to_string(),
        args.fabric.to_string(),
        "--model".into(),
        args.model.clone(),
    ];
    if let Some(d) = &args.rdma_device {
        common.extend(["--rdma-device".into(), d.clone()]);
    }
    if let Some(g) = args.gid_index {
        common.extend(["--gid-index".into(), g.to_string()]);
    }
    let with = |extra: &[String]| -> Vec<String> { common.iter().chain(extra).cloned().collect() };
    let t = Duration::from_secs(60);
    eprintln!(
        "starting local cluster {cluster_name}: {} memnode(s), tso{}",
        args.memnodes,
        if protocol.needs_lockd() {
            ", lockd"
        } else {
            ""
        }
    );
    let mut memnodes = Vec::new();
    let data: Vec<String> = if args.workload.is_kvs() {
        vec![
            "--kvs-records".into(),
            args.records.to_string(),
            "--kvs-value-bytes".into(),
            args.value_bytes.to_string(),
        ]
    } else {
        vec!["--smallbank-accounts".into(), args.accounts.to_string()]
    };
    for i in 0..args.memnodes {
        memnodes.push(
            cluster.start(
                "memnode",
                NODE_MEMNODE + i,
                &with(
                    &[
                        data.clone(),
                        vec![
                            "--versions".into(),
                            args.versions.to_string(),
                            "--partition".into(),
                            i.to_string(),
                            "--partitions".into(),
                            args.memnodes.to_string(),
                        ],
                    ]
                    .concat(),
                ),
                t,
            )?,
        );
    }
    let lockd = if protocol.needs_lockd() {
        Some(cluster.start(
            "lockd",
            NODE_LOCKD,
            &with(&[
                "--locks".into(),
                (2 * args.keys()).to_string(),
                "--threads".into(),
                args.lockd_threads.to_string(),
                "--cold-watermark".into(),
                args.cold_watermark.to_string(),
                "--hot-watermark".into(),
                args.hot_watermark.to_string(),
            ]),
            t,
        )?)
    } else {
        None
    };
    // The oracle's epoch file: each (re)start persists a larger epoch there, so
    // timestamps never go back (tso::epoch). Per run, removed at the end.
    let tso_state = std::env::temp_dir().join(format!("{cluster_name}-tso-state"));
    let _ = std::fs::remove_dir_all(&tso_state);
    let tso_args = |listen: &str| {
        with(&[
            "--state-dir".into(),
            tso_state.display().to_string(),
            "--listen".into(),
            listen.to_string(),
        ])
    };
    let tso = cluster.start("tso", NODE_TSO, &tso_args("127.0.0.1:0"), t)?;
    let addrs = ClusterAddrs {
        memnodes,
        lockd,
        tso,
    };

    let fabric_desc = fabric.describe();
    let model_desc = fabric.model_description();
    let checks = match protocol {
        _ if args.no_check => "off",
        Protocol::Mvcc(Isolation::Snapshot) => "snapshot isolation (serializability informative)",
        Protocol::Mvcc(Isolation::Serializable) => {
            "serializability (snapshot isolation informative)"
        }
        _ => "serializability",
    };
    println!(
        "{} | protocol: {protocol} | fabric: {} | timing model: {} | {} thread(s) x {} coroutines | {} | Zipf theta {} | {} memnode(s), {} versions | {} s | check: {checks}",
        args.workload_label(),
        fabric_desc,
        model_desc,
        threads,
        point.coroutines,
        args.scale(),
        point.theta,
        args.memnodes,
        args.versions,
        args.duration,
    );

    // Audit before: the loaded bank must hold the expected money; every loaded KVS
    // value must be valid at counter 0.
    let loaded = if args.workload.is_kvs() {
        kvs_items(args.records, &[])
    } else {
        smallbank_items(args.accounts)
    };
    let before = audit(&fabric, &addrs, protocol, &loaded)?;
    let initial_total = if args.workload.is_kvs() {
        let c = kvs_check(&before, &loaded, args.records, 0);
        if !c.ok() || c.found != 0 {
            bail!("loaded KVS table: {}", c.line());
        }
        0
    } else {
        let expected_initial = txn::smallbank::initial_total(args.accounts);
        let total = money(&before, &loaded)?;
        if total != expected_initial {
            bail!("loaded bank holds {total} cents, expected {expected_initial}");
        }
        total
    };

    let cfg = TxnConfig {
        protocol,
        lock_wait: Duration::from_micros(args.lock_wait_us),
        history_limit_bytes: (!args.no_check).then(|| (args.check_memory_mb << 20) / threads),
        tocc_wait: Duration::from_micros(args.tocc_wait_us),
        ..TxnConfig::default()
    };
    // Workers connect, then start together. `run_stop` ends this run (its deadline, a
    // service failure, or `stop`).
    let run_stop = Arc::new(AtomicBool::new(false));
    let committed = Arc::new(AtomicU64::new(0));
    let start_gate = Arc::new(Barrier::new(threads + 1));
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let mut handles = Vec::new();
    for tid in 0..threads {
        let w = WorkerPlan {
            tid,
            coroutines: point.coroutines,
            seed: args.seed,
            max_backoff_us: args.max_backoff_us,
            kinds: args.kinds(),
            records: args.records,
            value_bytes: args.value_bytes,
            cfg: cfg.clone(),
            addrs: addrs.clone(),
            core: (!cores.is_empty()).then(|| cores[tid % cores.len()]),
        };
        let (fabric, gen, stop, committed, gate) = (
            fabric.clone(),
            gen.clone(),
            run_stop.clone(),
            committed.clone(),
            start_gate.clone(),
        );
        handles.push(
            std::thread::Builder::new()
                .name(format!("coordinator-{tid}"))
                .spawn(move || worker(w, fabric, gen, stop, committed, gate))?,
        );
    }
    start_gate.wait();
    let started = std::time::Instant::now();
    let dur = Duration::from_secs_f64(args.duration);
    let mut last = 0;
    let mut crashed = None;
    let mut tso_restart = None;
    while started.elapsed() < dur && !run_stop.load(Ordering::Relaxed) {
        if stop.load(Ordering::Relaxed) {
            run_stop.store(true, Ordering::SeqCst);
            break;
        }
        if tso_restart.is_none()
            && args
                .kill_tso_after
                .is_some_and(|k| started.elapsed().as_secs_f64() >= k)
        {
            let r = restart_tso(
                &mut cluster,
                &tso_state,
                &tso_args(&tso.to_string()),
                Duration::from_millis(args.tso_down_ms),
                &committed,
                started,
            );
            match r {
                Ok(r) => tso_restart = Some(r),
                Err(e) => {
                    crashed = Some(format!("restarting the oracle: {e:#}"));
                    run_stop.store(true, Ordering::SeqCst);
                    break;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(200).min(dur.saturating_sub(started.elapsed())));
        let s = started.elapsed().as_secs();
        if s > last {
            last = s;
            let c = committed.load(Ordering::Relaxed);
            eprintln!(
                "[{protocol} {s:>3}s / {:.0}s] committed {c} ({:.0} txn/s)",
                args.duration,
                c as f64 / started.elapsed().as_secs_f64()
            );
        }
        if let Err(e) = cluster.check_alive() {
            crashed = Some(e);
            run_stop.store(true, Ordering::SeqCst);
        }
    }
    run_stop.store(true, Ordering::SeqCst);
    let mut workers = Vec::new();
    for h in handles {
        workers.push(
            h.join()
                .map_err(|_| anyhow::anyhow!("a coordinator thread panicked"))??,
        );
    }
    let elapsed = started.elapsed();
    if let Some(e) = crashed {
        bail!("a service died during the run: {e}");
    }

    let inserted: Vec<u64> = workers
        .iter()
        .flat_map(|w| w.inserted.iter().copied())
        .collect();
    let items = if args.workload.is_kvs() {
        kvs_items(args.records, &inserted)
    } else {
        loaded
    };
    let after = audit(&fabric, &addrs, protocol, &items)?;
    drop(fabric);
    cluster.shutdown();
    let _ = std::fs::remove_dir_all(&tso_state);
    if let Some(r) = &mut tso_restart {
        r.committed_after_ready = committed.load(Ordering::Relaxed) - r.committed_before_ready;
        r.thread_epochs = workers.iter().map(|w| w.tso_epoch).collect();
    }
    let kinds = args.kinds();
    let mut report = Report::with_kinds(
        &kinds,
        fabric_desc,
        threads,
        point.coroutines,
        args.keys(),
        point.theta,
        elapsed,
        &workers,
    );
    report.protocol = protocol.name().into();
    report.workload = args.workload_label();
    report.point = point.label.clone();
    report.memnodes = args.memnodes;
    report.versions = args.versions;
    report.timing_model = model_desc;
    report.tso_restart = tso_restart;
    report.serializability_required = protocol != Protocol::Mvcc(Isolation::Snapshot);
    report.snapshot_isolation_required = protocol == Protocol::Mvcc(Isolation::Snapshot);
    if args.workload.is_kvs() {
        let updates = u64::try_from(report.net_committed).unwrap_or(0);
        let c = kvs_check(&after, &items, args.records, updates);
        report.audit(0, c.found as i64, after.cvt_locked, after.lockd_held);
        report.workload_check(c.line(), c.ok() && c.found == updates);
    } else {
        let total = money(&after, &items)?;
        report.audit(initial_total, total, after.cvt_locked, after.lockd_held);
    }
    if !args.no_check {
        let mut history = txn::history::History::new(usize::MAX);
        for w in &mut workers {
            history.append(w.history.take().context("a worker recorded no history")?);
        }
        eprintln!(
            "checking {checks}: {} committed transactions, {:.1} MiB of history",
            history.len(),
            history.bytes() as f64 / (1 << 20) as f64
        );
        let t0 = std::time::Instant::now();
        let verdict = txn::serializability::check(&history);
        report.serializability(&verdict, history.bytes(), t0.elapsed());
        // MVCC records start and commit timestamps: the SI check applies (and is the
        // one mvcc-si is judged by; for mvcc it is informative).
        if let Protocol::Mvcc(_) = protocol {
            report.snapshot_isolation(&txn::snapshot_isolation::check(&history));
        }
        eprintln!("checked in {:.2} s", t0.elapsed().as_secs_f64());
    }
    Ok(report)
}

/// What one coordinator thread runs.
struct WorkerPlan {
    tid: usize,
    coroutines: usize,
    seed: u64,
    max_backoff_us: u64,
    /// Names of the transaction kinds (SmallBank types, or the KVS workload's kinds).
    kinds: Vec<&'static str>,
    /// KVS: loaded records and value size.
    records: u64,
    value_bytes: usize,
    cfg: TxnConfig,
    addrs: ClusterAddrs,
    core: Option<core_affinity::CoreId>,
}

fn worker(
    w: WorkerPlan,
    fabric: Fabric,
    gen: Arc<Gen>,
    stop: Arc<AtomicBool>,
    committed: Arc<AtomicU64>,
    gate: Arc<Barrier>,
) -> anyhow::Result<WorkerStats> {
    let tid = w.tid;
    if let Some(c) = w.core {
        core_affinity::set_for_current(c);
    }
    let connected = (|| {
        let ctx = ThreadCtx::new(fabric, RuntimeConfig::default())?;
        let client = Rc::new(TxnClient::connect(ctx.clone(), &w.addrs, w.cfg.clone())?);
        anyhow::Ok((ctx, client))
    })();
    gate.wait();
    let (ctx, client) =
        connected.with_context(|| format!("coordinator thread {tid} connecting"))?;
    let stats = Rc::new(RefCell::new(WorkerStats::with_kinds(w.kinds.len())));
    let kinds: Rc<[&'static str]> = w.kinds.clone().into();
    let (records, value_bytes) = (w.records, w.value_bytes);
    let mut ex = Executor::new(ctx.clone());
    for co in 0..w.coroutines {
        let (client, stats, gen, stop, committed, kinds) = (
            client.clone(),
            stats.clone(),
            gen.clone(),
            stop.clone(),
            committed.clone(),
            kinds.clone(),
        );
        let seed = w.seed ^ ((tid as u64) << 32 | co as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let max_backoff = w.max_backoff_us;
        ex.spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            while !stop.load(Ordering::Relaxed) {
                let drawn = match &*gen {
                    Gen::SmallBank(g) => Drawn::SmallBank(g.next(&mut rng)),
                    Gen::Kvs(g) => Drawn::Kvs(g.next(&mut rng)),
                };
                let kind = match &drawn {
                    Drawn::SmallBank(t) => t.ty.index(),
                    Drawn::Kvs(t) => t.kind,
                };
                let begin = quanta::Instant::now();
                let mut backoff_us = 1u64;
                loop {
                    let txn = client.begin_as(kind as u16);
                    // Net money (SmallBank) or updates (KVS), and the keys inserted.
                    let r: Result<(i64, Vec<u64>), RunError> = match &drawn {
                        Drawn::SmallBank(t) => smallbank::run(txn, *t)
                            .await
                            .map(|net| (net, Vec::new()))
                            .map_err(RunError::Txn),
                        Drawn::Kvs(t) => ycsb::run(txn, t, records, value_bytes)
                            .await
                            .map(|d| (d.updates as i64, d.inserted)),
                    };
                    // What to do next, decided while the stats are borrowed (never across an await).
                    let retry = {
                        let mut s = stats.borrow_mut();
                        let s = &mut *s;
                        let ts: &mut TypeStats = &mut s.types[kind];
                        ts.attempts += 1;
                        match r {
                            Ok((net, inserted)) => {
                                ts.record_commit(begin.elapsed());
                                s.net += net;
                                s.inserted.extend(inserted);
                                committed.fetch_add(1, Ordering::Relaxed);
                                false
                            }
                            Err(RunError::Txn(TxnError::Abort(AbortReason::User))) => {
                                ts.user_aborts += 1;
                                false
                            }
                            Err(RunError::Txn(TxnError::Abort(reason))) => {
                                ts.aborts += 1;
                                if let Some(i) = AbortReason::ALL.iter().position(|&x| x == reason)
                                {
                                    s.abort_reasons[i] += 1;
                                }
                                // At the end of the run an unfinished transaction has no effect.
                                !stop.load(Ordering::Relaxed)
                            }
                            Err(RunError::Txn(e)) => {
                                s.fatal.push(format!("{}: {e}", kinds[kind]));
                                stop.store(true, Ordering::SeqCst);
                                false
                            }
                            Err(RunError::Check(e)) => {
                                s.fatal
                                    .push(format!("{}: value check failed: {e}", kinds[kind]));
                                stop.store(true, Ordering::SeqCst);
                                false
                            }
                        }
                    };
                    if !retry {
                        break;
                    }
                    // Randomized exponential backoff: an object that made us abort is
                    // busy for at least a commit's round trips; retrying at once mostly
                    // aborts again and steals polling rounds from the holder.
                    if max_backoff > 0 {
                        let d = rng.random_range(0..=backoff_us.min(max_backoff));
                        backoff_us = (backoff_us * 2).min(max_backoff);
                        client.ctx().sleep(Duration::from_micros(d)).await;
                    } else {
                        client.ctx().yield_now().await;
                    }
                }
            }
        });
    }
    ex.run();
    let mut s = Rc::try_unwrap(stats)
        .map_err(|_| anyhow::anyhow!("stats still shared"))?
        .into_inner();
    s.rpc = ctx.stats();
    s.tso_epoch = client.tso().client().epoch();
    s.tso_reconnects = client.tso().reconnects();
    s.history = client.take_history();
    let lost = client.locks().map_or(0, |l| l.lost());
    if lost > 0 {
        s.fatal.push(format!(
            "{lost} lock(s) lost: dropped tickets could not be released"
        ));
    }
    Ok(s)
}

/// `--kill-tso-after`: SIGKILL the oracle, keep it down for `down`, restart it with the
/// same state directory and address (`args`), and record the epochs and the commits so
/// far (the rest of the record is filled in after the run).
fn restart_tso(
    cluster: &mut LocalCluster,
    state: &std::path::Path,
    args: &[String],
    down: Duration,
    committed: &AtomicU64,
    started: std::time::Instant,
) -> anyhow::Result<TsoRestart> {
    let epoch_before = tso::epoch::load(state)?;
    let killed_at_s = started.elapsed().as_secs_f64();
    cluster.kill(NODE_TSO)?;
    eprintln!("[{killed_at_s:.1}s] SIGKILLed the timestamp oracle (epoch {epoch_before})");
    std::thread::sleep(down);
    cluster.start("tso", NODE_TSO, args, Duration::from_secs(60))?;
    let epoch_after = tso::epoch::load(state)?;
    let committed_before_ready = committed.load(Ordering::Relaxed);
    eprintln!(
        "[{:.1}s] timestamp oracle restarted in epoch {epoch_after}",
        started.elapsed().as_secs_f64()
    );
    Ok(TsoRestart {
        killed_at_s,
        epoch_before,
        epoch_after,
        committed_before_ready,
        committed_after_ready: 0,
        thread_epochs: Vec::new(),
    })
}

/// What an audit found.
struct Audit {
    /// The newest committed value of each item audited, in order (`None`: absent).
    values: Vec<Option<Vec<u8>>>,
    /// CVT lock words held.
    cvt_locked: u64,
    /// Lock service locks held or queued (`None` without a lock service).
    lockd_held: Option<u64>,
}

/// SmallBank's items: savings and checking of every account.
fn smallbank_items(accounts: u64) -> Vec<(u32, u64)> {
    [txn::smallbank::SAVINGS, txn::smallbank::CHECKING]
        .into_iter()
        .flat_map(|t| (0..accounts).map(move |a| (t, a)))
        .collect()
}

/// KVS items: the loaded records and the keys `inserted`.
fn kvs_items(records: u64, inserted: &[u64]) -> Vec<(u32, u64)> {
    (0..records)
        .chain(inserted.iter().copied())
        .map(|k| (txn::kvs::TABLE, k))
        .collect()
}

/// Sum of all balances in `a` (SmallBank), cents. Errors: an account absent or not a
/// balance.
fn money(a: &Audit, items: &[(u32, u64)]) -> anyhow::Result<i64> {
    let mut total = 0i64;
    for (&(table, k), v) in items.iter().zip(&a.values) {
        let Some(v) = v else {
            bail!("audit: table {table} has no account {k}");
        };
        total += i64::from_le_bytes(
            v.as_slice()
                .try_into()
                .with_context(|| format!("audit: table {table} account {k}: {} bytes", v.len()))?,
        );
    }
    Ok(total)
}

/// The KVS check of an audit.
struct KvsCheck {
    /// Keys audited.
    keys: usize,
    /// Keys inserted among them.
    inserted: usize,
    /// Keys absent.
    missing: Vec<u64>,
    /// Values that failed their check.
    bad: Vec<String>,
    /// Committed updates counted by the coordinators.
    counted: u64,
    /// Sum of the keys' update counters.
    found: u64,
}

impl KvsCheck {
    fn ok(&self) -> bool {
        self.missing.is_empty() && self.bad.is_empty()
    }

    /// `kvs check: N records, checksums ok, updates counted C = found C`, or what failed.
    fn line(&self) -> String {
        let mut s = format!("kvs check: {} records", self.keys - self.inserted);
        if self.inserted > 0 {
            s.push_str(&format!(" + {} inserted", self.inserted));
        }
        if self.bad.is_empty() {
            s.push_str(", checksums ok");
        } else {
            s.push_str(&format!(
                ", {} BAD VALUES (first: {})",
                self.bad.len(),
                self.bad[0]
            ));
        }
        if !self.missing.is_empty() {
            s.push_str(&format!(
                ", {} KEYS MISSING (first: {})",
                self.missing.len(),
                self.missing[0]
            ));
        }
        let rel = if self.counted == self.found {
            "="
        } else {
            "!="
        };
        s.push_str(&format!(
            ", updates counted {} {rel} found {}",
            self.counted, self.found
        ));
        if self.counted != self.found || !self.ok() {
            s.push_str(" (FAILED)");
        }
        s
    }
}

/// Check every KVS value of `a` ([`txn::kvs::check_value`]) and sum the update
/// counters; `counted` is what the coordinators committed. Keys from `records` on are
/// inserted ones.
fn kvs_check(a: &Audit, items: &[(u32, u64)], records: u64, counted: u64) -> KvsCheck {
    let mut c = KvsCheck {
        keys: items.len(),
        inserted: 0,
        missing: Vec::new(),
        bad: Vec::new(),
        counted,
        found: 0,
    };
    for (&(_, k), v) in items.iter().zip(&a.values) {
        c.inserted += usize::from(k >= records);
        match v {
            None => c.missing.push(k),
            Some(v) => match txn::kvs::check_value(k, v) {
                Ok(n) => c.found += n,
                Err(e) => c.bad.push(e),
            },
        }
    }
    c
}

/// Read the newest committed version of every item, and count held locks (every CVT
/// lock word of the items; every lock service lock when `protocol` has one), with
/// one-sided READs from a fresh thread context.
fn audit(
    fabric: &Fabric,
    addrs: &ClusterAddrs,
    protocol: Protocol,
    items: &[(u32, u64)],
) -> anyhow::Result<Audit> {
    let ctx = ThreadCtx::new(fabric.clone(), RuntimeConfig::default())?;
    let cfg = TxnConfig {
        protocol,
        ..TxnConfig::default()
    };
    let client = Rc::new(TxnClient::connect(ctx.clone(), addrs, cfg).context("audit: connecting")?);
    type Out = Rc<RefCell<Option<anyhow::Result<Audit>>>>;
    let out: Out = Rc::new(RefCell::new(None));
    let mut ex = Executor::new(ctx);
    {
        let (client, out) = (client.clone(), out.clone());
        let items = items.to_vec();
        ex.spawn(async move {
            let r: anyhow::Result<Audit> = async {
                let mut values = Vec::with_capacity(items.len());
                let mut cvt_locked = 0;
                for chunk in items.chunks(256) {
                    let vals = join_all(chunk.iter().map(|&(table, k)| {
                        let client = &client;
                        async move {
                            let v = client.read_committed(table, k).await?;
                            let l = client.cvt_locked(table, k).await?;
                            Ok::<_, TxnError>((v, l))
                        }
                    }))
                    .await;
                    for (&(table, k), v) in chunk.iter().zip(vals) {
                        let (v, locked) =
                            v.with_context(|| format!("audit: reading table {table} key {k}"))?;
                        values.push(v.map(|(_, v)| v));
                        cvt_locked += u64::from(locked);
                    }
                }
                let lockd_held = match client.locks() {
                    None => None,
                    Some(locks) => {
                        let mut held = 0;
                        let ids: Vec<u64> = (0..locks.n_locks()).collect();
                        for chunk in ids.chunks(256) {
                            let st = join_all(
                                chunk.iter().map(|&id| locks.read_state(client.ctx(), id)),
                            )
                            .await;
                            for s in st {
                                held += u64::from(s.context("audit: reading a lock")?.queued() > 0);
                            }
                        }
                        Some(held)
                    }
                };
                Ok(Audit {
                    values,
                    cvt_locked,
                    lockd_held,
                })
            }
            .await;
            *out.borrow_mut() = Some(r);
        });
    }
    ex.run();
    let r = out.borrow_mut().take();
    r.unwrap_or_else(|| bail!("audit: the audit coroutine did not finish"))
}

/// A drawn transaction, retried until it commits.
enum Drawn {
    SmallBank(smallbank::TxnArgs),
    Kvs(ycsb::KvsTxn),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Args {
        Args::parse_from(std::iter::once("txn-bench").chain(a.iter().copied()))
    }

    fn names(a: &[&str]) -> Result<Vec<&'static str>, String> {
        args(a)
            .protocols()
            .map(|v| v.iter().map(|p| p.name()).collect())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn protocol_and_isolation_flags() {
        assert_eq!(names(&[]).unwrap(), ["scythe"]);
        assert_eq!(
            names(&["--protocol", "all"]).unwrap(),
            ["occ-cas", "scythe", "mvcc"]
        );
        assert_eq!(
            names(&["--protocol", "all", "--isolation", "si"]).unwrap(),
            ["occ-cas", "scythe", "mvcc-si"]
        );
        assert_eq!(names(&["--protocol", "mvcc"]).unwrap(), ["mvcc"]);
        assert_eq!(
            names(&["--protocol", "mvcc", "--isolation", "si"]).unwrap(),
            ["mvcc-si"]
        );
        assert_eq!(names(&["--protocol", "mvcc-si"]).unwrap(), ["mvcc-si"]);
        assert_eq!(
            names(&["--protocol", "mvcc-sr", "--isolation", "sr"]).unwrap(),
            ["mvcc"]
        );
        let e = names(&["--protocol", "mvcc-sr", "--isolation", "si"]).unwrap_err();
        assert!(e.contains("contradicts --isolation si"), "{e}");
        let e = names(&["--protocol", "mvcc-si", "--isolation", "sr"]).unwrap_err();
        assert!(e.contains("contradicts --isolation sr"), "{e}");
        let e = names(&["--protocol", "scythe", "--isolation", "si"]).unwrap_err();
        assert!(e.contains("--isolation si applies to mvcc"), "{e}");
        let e = Args::try_parse_from(["txn-bench", "--protocol", "2pl"]).unwrap_err();
        assert!(e.to_string().contains("unknown protocol \"2pl\""), "{e}");
    }

    #[test]
    fn sweeps_parse_and_name_their_points() {
        assert_eq!(
            "theta=0, 0.5,0.99".parse::<Sweep>(),
            Ok(Sweep::Theta(vec![0.0, 0.5, 0.99]))
        );
        assert_eq!(
            "clients=8,16".parse::<Sweep>(),
            Ok(Sweep::Clients(vec![8, 16]))
        );
        assert_eq!(Sweep::Theta(vec![0.0, 0.5]).to_string(), "theta=0,0.5");
        for bad in [
            "theta",
            "theta=",
            "theta=1,,2",
            "theta=-1",
            "theta=inf",
            "clients=0",
            "clients=1.5",
            "x=1",
        ] {
            assert!(bad.parse::<Sweep>().is_err(), "{bad}");
        }
        let a = args(&["--sweep", "clients=2,4", "--theta", "0.7"]);
        let p = a.points();
        assert_eq!(p.len(), 2);
        assert_eq!((p[1].coroutines, p[1].theta), (4, 0.7));
        assert_eq!(p[1].label.as_deref(), Some("clients=4"));
        let p = args(&["--sweep", "theta=0,1.2", "--coroutines", "3"]).points();
        assert_eq!((p[1].coroutines, p[1].theta), (3, 1.2));
        assert_eq!(p[0].label.as_deref(), Some("theta=0"));
        assert_eq!(args(&[]).points()[0].label, None);
    }

    #[test]
    fn the_kvs_check_catches_bad_missing_and_uncounted_values() {
        use txn::kvs::encode_value;
        let items = kvs_items(3, &[7]);
        let good = |counters: [u64; 4]| Audit {
            values: items
                .iter()
                .zip(counters)
                .map(|(&(_, k), c)| Some(encode_value(k, c, 40)))
                .collect(),
            cvt_locked: 0,
            lockd_held: None,
        };
        let c = kvs_check(&good([1, 0, 2, 0]), &items, 3, 3);
        assert!(c.ok() && c.found == 3);
        assert_eq!(
            c.line(),
            "kvs check: 3 records + 1 inserted, checksums ok, updates counted 3 = found 3"
        );
        // An update lost (or counted twice).
        let c = kvs_check(&good([1, 0, 2, 0]), &items, 3, 4);
        assert!(c.line().ends_with("updates counted 4 != found 3 (FAILED)"));
        // A planted corruption, another key's value, a missing key.
        let mut a = good([1, 0, 2, 0]);
        a.values[0].as_mut().unwrap()[12] ^= 1;
        a.values[1] = Some(encode_value(2, 0, 40));
        a.values[3] = None;
        let c = kvs_check(&a, &items, 3, 3);
        assert!(!c.ok());
        let line = c.line();
        assert!(
            line.contains("2 BAD VALUES (first: key 0: checksum"),
            "{line}"
        );
        assert!(line.contains("1 KEYS MISSING (first: 7)"), "{line}");
        assert!(line.ends_with("(FAILED)"), "{line}");
    }

    #[test]
    fn workload_flags() {
        let a = args(&["--workload", "ycsb-b", "--records", "500"]);
        assert_eq!(a.scale(), "500 records x 40 B, 4 ops/txn");
        assert_eq!(a.kinds(), ["read-only", "update"]);
        assert_eq!(a.keys(), 500);
        let a = args(&["--workload", "kvs"]);
        assert_eq!(a.ops_per_txn(), 1);
        let a = args(&[]);
        assert_eq!(
            (a.workload_label().as_str(), a.kinds().len()),
            ("SmallBank", 6)
        );
        let e = Args::try_parse_from(["txn-bench", "--workload", "ycsb-e"]).unwrap_err();
        assert!(e.to_string().contains("range scans"), "{e}");
    }
}
