//! `txn-bench`'s run: SmallBank, KVS / YCSB ([`crate::ycsb`]), TATP ([`crate::tatp`]) or
//! TPC-C ([`crate::tpcc`]) (`--workload`, [`crate::workload`]) on local clusters over the
//! shm fabric (the binary in `src/bin/txn-bench.rs` parses flags and `--config`
//! files and handles signals; tests call [`run`] directly).
//!
//! Each run starts `--memnodes` memory nodes (the tables partitioned across them by
//! key), a timestamp oracle and, for Scythe, a lock service as child processes, loads
//! the workload's data on the memory nodes, runs `threads x coroutines` coordinators of
//! one protocol ([`txn::coordinator::Protocol`]) for a fixed duration, prints committed
//! throughput, p50/p99 latency of committed transactions and abort rates per
//! transaction type, then checks the run (the `audit` module): the workload's own check
//! (SmallBank: total money equals the initial total plus the net of committed deposits
//! and withdrawals; KVS / YCSB: every key read after the run carries a valid checksum,
//! and the update counters add up to the committed updates; TATP: referential
//! consistency of its four tables; TPC-C: the consistency conditions 1 to 4), no lock
//! left held (CVT lock words, and the lock service's locks for Scythe), every
//! transaction type committed, and (unless `--no-check`) the recorded history of
//! committed transactions must be serializable (`occ-cas`, `scythe`, `mvcc`) or satisfy
//! snapshot isolation (`mvcc-si`).
//!
//! `--protocol all` runs `occ-cas`, `scythe` and `mvcc` (at `--isolation`) one after
//! another, each on a freshly started and loaded cluster with the same seed, backoff and
//! timing model, and prints a comparison table and the ratios to `occ-cas` (p99 and
//! throughput of `scythe`, throughput of MVCC, and for TPC-C the p99 of NEW-ORDER).
//! `--sweep theta=...` or `--sweep clients=...` repeats that at each point; `--chart`
//! draws throughput against p99.

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
use rrpc::runtime::{Executor, RuntimeConfig, ThreadCtx};
use serde::Serialize;
use txn::coordinator::{
    AbortReason, ClusterAddrs, Isolation, Protocol, TxnClient, TxnConfig, TxnError,
};

use crate::audit::{self, audit, kvs_check, kvs_items, money, smallbank_items, Audit};
use crate::config_file::config_flags;
pub use crate::config_file::ConfigError;
use crate::launcher::{default_bin_dir, LocalCluster};
use crate::plot::{LineChart, Scale, Series};
use crate::report::{comparison, ratios, Ratio, Report, TsoRestart, TypeStats, WorkerStats};
use crate::smallbank::{self, Generator};
use crate::workload::Workload;
use crate::ycsb::{self, KvsGenerator, RunError};
use crate::{tatp, tpcc};

/// SmallBank, KVS, YCSB, TATP or TPC-C on a local cluster (memnode, tso and lockd child
/// processes) over the shm fabric, with one transaction protocol or all of them side by
/// side.
#[derive(Parser, Debug, Clone)]
#[command(version, about, long_about = None, args_override_self = true)]
pub struct Args {
    /// Read the experiment's settings from this TOML file: its keys are this command's
    /// long flags (`workload = "tpcc"`, `warehouses = 4`, `protocol = "all"`,
    /// `no-check = true`); flags on the command line win over the file.
    #[arg(long, value_name = "FILE.toml")]
    pub config: Option<PathBuf>,
    /// Workload: smallbank, kvs (one read or update per transaction, half each), ycsb-a
    /// (50% reads / 50% updates), ycsb-b (95/5), ycsb-c (reads), ycsb-d (95% reads of
    /// the latest keys / 5% inserts), ycsb-f (50% reads / 50% read-modify-writes), tatp
    /// (seven types, 80% reads, the specification's NURand subscriber ids) or tpcc (five
    /// types, 45/43/4/4/4, each coordinator bound to a home warehouse). ycsb-e is
    /// refused: no protocol here offers range scans.
    #[arg(long, default_value = "smallbank", value_name = "WORKLOAD")]
    pub workload: Workload,
    /// TATP subscribers (s_id 1..=N; about 10 rows each over the four tables).
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    pub subscribers: u64,
    /// TPC-C warehouses (about 100 MB of rows each with 4 versions). Default: one per
    /// coordinator thread. Coordinator coroutine g (over all threads) has home
    /// warehouse g mod N + 1.
    #[arg(long, value_name = "N")]
    pub warehouses: Option<u16>,
    /// SmallBank: a fixed set of hot accounts 0..N drawn uniformly for --hot-fraction of
    /// the account draws (FORD's hot-account option); the rest follow --theta.
    #[arg(long, value_name = "N")]
    pub hot_accounts: Option<u64>,
    /// SmallBank with --hot-accounts: the fraction of account draws that go to the hot
    /// set (0 to 1).
    #[arg(long, default_value_t = 0.9, value_name = "FRACTION")]
    pub hot_fraction: f64,
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
    /// Cluster name (default: `txn-bench-<pid>`; with several runs, each run's cluster
    /// gets a suffix `-<run>`).
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
    /// Each coroutine runs one transaction of every type (in the report's order) before
    /// the standard mix, so that a short run on a slow machine still commits every type
    /// (a run that does not fails its coverage check).
    #[arg(long)]
    pub each_type_first: bool,
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
    Tatp(tatp::Generator),
    Tpcc(tpcc::Generator),
}

impl Args {
    /// Parse `argv` (program name first) after expanding `--config FILE.toml` into
    /// flags placed before the command line's own, so that the command line wins.
    ///
    /// Errors: clap's (bad flags, `--help`, `--version`: print them with
    /// `clap::Error::exit`), a file that cannot be read or parsed, or a key whose value
    /// is not a string, number or boolean.
    pub fn parse_with_config<I, T>(argv: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let argv: Vec<std::ffi::OsString> = argv.into_iter().map(Into::into).collect();
        let first = Self::try_parse_from(&argv).map_err(ConfigError::Clap)?;
        let Some(path) = &first.config else {
            return Ok(first);
        };
        let flags = config_flags(path)?;
        let mut expanded = argv[..1].to_vec();
        expanded.extend(flags.into_iter().map(Into::into));
        expanded.extend(argv[1..].iter().cloned());
        Self::try_parse_from(expanded).map_err(|e| match e.kind() {
            clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                ConfigError::Clap(e)
            }
            _ => ConfigError::File {
                path: path.clone(),
                why: e.to_string(),
            },
        })
    }

    /// Keys the report names as the workload's size: SmallBank's accounts, the KVS
    /// records, TATP's subscribers, TPC-C's warehouses.
    fn keys(&self) -> u64 {
        match self.workload {
            Workload::SmallBank => self.accounts,
            Workload::Tatp => self.subscribers,
            Workload::Tpcc => u64::from(self.warehouses()),
            _ => self.records,
        }
    }

    /// Locks of the lock service (Scythe): about one per row a transaction can lock.
    /// Objects share a lock past that (`TxnClient::lock_id`), which only adds false
    /// conflicts.
    fn lockd_locks(&self) -> u64 {
        match self.workload {
            Workload::SmallBank => 2 * self.accounts,
            // Up to 21 rows per subscriber (1 + 4 + 4 + 12).
            Workload::Tatp => 21 * self.subscribers,
            // Customers, stock, districts and a window of the growing order tables.
            Workload::Tpcc => u64::from(self.warehouses()) << 20,
            _ => 2 * self.records,
        }
    }

    /// TPC-C warehouses: `--warehouses`, else one per coordinator thread.
    fn warehouses(&self) -> u16 {
        self.warehouses
            .unwrap_or_else(|| self.threads.unwrap_or(1).clamp(1, usize::from(u16::MAX)) as u16)
    }

    /// Transaction kinds, in the order of the report (and of the history's kinds).
    fn kinds(&self) -> Vec<&'static str> {
        self.workload.kinds()
    }

    /// The workload as the reports name it.
    fn workload_label(&self) -> String {
        self.workload.label().into()
    }

    /// Size of the data: accounts, records, subscribers or warehouses.
    fn scale(&self) -> String {
        match self.workload {
            Workload::SmallBank => match self.hot_accounts {
                Some(h) => format!(
                    "{} accounts, {h} hot for {}% of draws",
                    self.accounts,
                    // Rounded to 0.01%, so that 0.7 prints as 70, not 70.00000000000001.
                    (self.hot_fraction * 1e4).round() / 100.0
                ),
                None => format!("{} accounts", self.accounts),
            },
            Workload::Tatp => format!("{} subscribers", self.subscribers),
            Workload::Tpcc => format!("{} warehouse(s)", self.warehouses()),
            _ => format!(
                "{} records x {} B, {} ops/txn",
                self.records,
                self.value_bytes,
                self.ops_per_txn()
            ),
        }
    }

    /// How keys are drawn at `theta`: `Zipf theta 0.99`, or the specification's rule.
    fn skew(&self, theta: f64) -> String {
        match self.workload {
            Workload::Tatp => "keys by TATP's NURand".into(),
            Workload::Tpcc => "keys by TPC-C's NURand and home warehouses".into(),
            _ => format!("Zipf theta {theta}"),
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
    if !args.workload.uses_theta() && matches!(args.sweep, Some(Sweep::Theta(_))) {
        bail!(
            "--sweep theta does not apply to {}: its keys follow the specification's \
             NURand, not Zipf theta (sweep clients=... instead)",
            args.workload
        );
    }
    if args.workload == Workload::Tatp && args.subscribers == 0 {
        bail!("--subscribers must be at least 1");
    }
    if args.workload == Workload::Tpcc && args.warehouses() == 0 {
        bail!("--warehouses must be at least 1");
    }
    if args.hot_accounts.is_some() && args.workload != Workload::SmallBank {
        bail!("--hot-accounts applies to smallbank only");
    }
    let protocols = args.protocols()?;
    let points = args.points();
    // Every point's generator now: a bad theta fails before any cluster starts.
    let gens = points
        .iter()
        .map(|p| {
            let g = match args.workload {
                Workload::SmallBank => Generator::new(args.accounts, p.theta).and_then(|g| {
                    match args.hot_accounts {
                        Some(h) => g
                            .with_hot(h, args.hot_fraction)
                            .context("--hot-accounts / --hot-fraction"),
                        None => Ok(g),
                    }
                    .map(Gen::SmallBank)
                }),
                Workload::Tatp => tatp::Generator::new(args.subscribers).map(Gen::Tatp),
                Workload::Tpcc => tpcc::Generator::new(args.warehouses()).map(Gen::Tpcc),
                w => KvsGenerator::new(w, args.records, p.theta, args.ops_per_txn()).map(Gen::Kvs),
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
            "{threads} thread(s) x clients coroutines | {} | {} | sweep {}",
            args.scale(),
            args.skew(args.theta),
            args.sweep.as_ref().expect("a sweep")
        ),
        None => format!(
            "{threads} thread(s) x {} coroutines | {} | {}",
            args.coroutines,
            args.scale(),
            args.skew(args.theta)
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
            "{}: throughput vs p99, {}, {} x {} clients (model {})",
            args.workload_label(),
            args.skew(args.theta),
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
    let data: Vec<String> = match args.workload {
        Workload::SmallBank => vec!["--smallbank-accounts".into(), args.accounts.to_string()],
        Workload::Tatp => vec![
            "--tatp-subscribers".into(),
            args.subscribers.to_string(),
            "--tatp-seed".into(),
            args.seed.to_string(),
        ],
        Workload::Tpcc => vec![
            "--tpcc-warehouses".into(),
            args.warehouses().to_string(),
            "--tatp-seed".into(),
            args.seed.to_string(),
        ],
        _ => vec![
            "--kvs-records".into(),
            args.records.to_string(),
            "--kvs-value-bytes".into(),
            args.value_bytes.to_string(),
        ],
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
                args.lockd_locks().to_string(),
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
        "{} | protocol: {protocol} | fabric: {} | timing model: {} | {} thread(s) x {} coroutines | {} | {} | {} memnode(s), {} versions | {} s | check: {checks}",
        args.workload_label(),
        fabric_desc,
        model_desc,
        threads,
        point.coroutines,
        args.scale(),
        args.skew(point.theta),
        args.memnodes,
        args.versions,
        args.duration,
    );

    // Audit before: the loaded bank must hold the expected money; every loaded KVS
    // value must be valid at counter 0. (TATP's and TPC-C's populations are checked by
    // their loaders' tests; their checks run after the run.)
    let initial_total = match args.workload {
        Workload::SmallBank => {
            let loaded = smallbank_items(args.accounts);
            let before = audit(&fabric, &addrs, protocol, &loaded)?;
            let expected_initial = txn::smallbank::initial_total(args.accounts);
            let total = money(&before, &loaded)?;
            if total != expected_initial {
                bail!("loaded bank holds {total} cents, expected {expected_initial}");
            }
            total
        }
        Workload::Tatp | Workload::Tpcc => 0,
        _ => {
            let loaded = kvs_items(args.records, &[]);
            let before = audit(&fabric, &addrs, protocol, &loaded)?;
            let c = kvs_check(&before, &loaded, args.records, 0);
            if !c.ok() || c.found != 0 {
                bail!("loaded KVS table: {}", c.line());
            }
            0
        }
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
            warehouses: args.warehouses(),
            each_type_first: args.each_type_first,
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
    let t_audit = std::time::Instant::now();
    let after = match args.workload {
        Workload::SmallBank => {
            let items = smallbank_items(args.accounts);
            let a = audit(&fabric, &addrs, protocol, &items)?;
            let total = money(&a, &items)?;
            AfterRun::Money(total, a.cvt_locked, a.lockd_held)
        }
        Workload::Tatp => AfterRun::Checked(audit::tatp(
            &fabric,
            &addrs,
            protocol,
            args.subscribers,
            args.seed,
        )?),
        Workload::Tpcc => {
            AfterRun::Checked(audit::tpcc(&fabric, &addrs, protocol, args.warehouses())?)
        }
        _ => {
            let items = kvs_items(args.records, &inserted);
            let a = audit(&fabric, &addrs, protocol, &items)?;
            AfterRun::Kvs(a, items)
        }
    };
    eprintln!(
        "audited the {} rows in {:.1} s",
        args.workload_label(),
        t_audit.elapsed().as_secs_f64()
    );
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
    match after {
        AfterRun::Money(total, cvt_locked, lockd_held) => {
            report.audit(initial_total, total, cvt_locked, lockd_held);
        }
        AfterRun::Kvs(a, items) => {
            let updates = u64::try_from(report.net_committed).unwrap_or(0);
            let c = kvs_check(&a, &items, args.records, updates);
            report.audit(0, c.found as i64, a.cvt_locked, a.lockd_held);
            report.workload_check(c.line(), c.ok() && c.found == updates);
        }
        AfterRun::Checked(c) => {
            // No money to conserve (final = net): the locks and coverage clauses of the
            // audit, then the consistency check decides.
            report.audit(0, report.net_committed, c.cvt_locked, c.lockd_held);
            report.workload_check(c.line, c.ok);
        }
    }
    if args.workload == Workload::Tatp {
        report.outcomes = Some(tatp_failures(&report));
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

/// How a transaction that will not be retried ended.
enum Finished {
    /// Committed with this net money (SmallBank) or these updates (KVS), the keys it
    /// inserted (YCSB D), and whether its lookup found nothing (TATP).
    Committed {
        net: i64,
        inserted: Vec<u64>,
        failed_lookup: bool,
    },
    /// Rolled back by its own logic (TPC-C NEW-ORDER's 1%, a TATP update whose lookup
    /// failed).
    RolledBack { failed_lookup: bool },
}

impl Finished {
    fn net(net: i64) -> Self {
        Self::Committed {
            net,
            inserted: Vec::new(),
            failed_lookup: false,
        }
    }
}

/// What one coordinator thread runs.
struct WorkerPlan {
    tid: usize,
    coroutines: usize,
    seed: u64,
    max_backoff_us: u64,
    /// Names of the transaction kinds (SmallBank types, or the KVS workload's kinds).
    kinds: Vec<&'static str>,
    /// TPC-C warehouses (home warehouse of coroutine g over all threads: g mod N + 1).
    warehouses: u16,
    /// Each coroutine runs one transaction of every kind before the mix.
    each_type_first: bool,
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
        let home = ((tid * w.coroutines + co) % usize::from(w.warehouses.max(1))) as u16 + 1;
        let (each_type_first, n_kinds) = (w.each_type_first, w.kinds.len());
        ex.spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            // With --each-type-first, kind 0, 1, ... first (drawn until the mix gives
            // one of that kind), then the mix.
            let mut first = if each_type_first { 0..n_kinds } else { 0..0 };
            while !stop.load(Ordering::Relaxed) {
                let want = first.next();
                let (drawn, kind) = loop {
                    let drawn = match &*gen {
                        Gen::SmallBank(g) => Drawn::SmallBank(g.next(&mut rng)),
                        Gen::Kvs(g) => Drawn::Kvs(g.next(&mut rng)),
                        Gen::Tatp(g) => Drawn::Tatp(g.next(&mut rng)),
                        Gen::Tpcc(g) => Drawn::Tpcc(g.next(&mut rng, home)),
                    };
                    let kind = match &drawn {
                        Drawn::SmallBank(t) => t.ty.index(),
                        Drawn::Kvs(t) => t.kind,
                        Drawn::Tatp(t) => t.ty.index(),
                        Drawn::Tpcc(t) => t.ty.index(),
                    };
                    if want.is_none_or(|k| k == kind) {
                        break (drawn, kind);
                    }
                };
                let begin = quanta::Instant::now();
                let mut backoff_us = 1u64;
                loop {
                    let txn = client.begin_as(kind as u16);
                    let r: Result<Finished, RunError> = match &drawn {
                        Drawn::SmallBank(t) => smallbank::run(txn, *t)
                            .await
                            .map(Finished::net)
                            .map_err(RunError::Txn),
                        Drawn::Kvs(t) => ycsb::run(txn, t, records, value_bytes).await.map(|d| {
                            Finished::Committed {
                                net: d.updates as i64,
                                inserted: d.inserted,
                                failed_lookup: false,
                            }
                        }),
                        Drawn::Tatp(t) => match tatp::run(txn, *t).await {
                            Ok(tatp::Outcome::Done) => Ok(Finished::net(0)),
                            // A read-only type commits without a result; an update rolled back.
                            Ok(tatp::Outcome::NotFound) if t.ty.read_only() => {
                                Ok(Finished::Committed {
                                    net: 0,
                                    inserted: Vec::new(),
                                    failed_lookup: true,
                                })
                            }
                            Ok(tatp::Outcome::NotFound) => Ok(Finished::RolledBack {
                                failed_lookup: true,
                            }),
                            Err(e) => Err(RunError::Txn(e)),
                        },
                        Drawn::Tpcc(t) => match tpcc::run(txn, t).await {
                            Ok(tpcc::Outcome::Done) => Ok(Finished::net(0)),
                            Ok(tpcc::Outcome::RolledBack) => Ok(Finished::RolledBack {
                                failed_lookup: false,
                            }),
                            Err(e) => Err(RunError::Txn(e)),
                        },
                    };
                    // What to do next, decided while the stats are borrowed (never across an await).
                    let retry = {
                        let mut s = stats.borrow_mut();
                        let s = &mut *s;
                        let ts: &mut TypeStats = &mut s.types[kind];
                        ts.attempts += 1;
                        match r {
                            Ok(Finished::Committed {
                                net,
                                inserted,
                                failed_lookup,
                            }) => {
                                ts.record_commit(begin.elapsed());
                                ts.failed_lookups += u64::from(failed_lookup);
                                s.net += net;
                                s.inserted.extend(inserted);
                                committed.fetch_add(1, Ordering::Relaxed);
                                false
                            }
                            Ok(Finished::RolledBack { failed_lookup }) => {
                                ts.user_aborts += 1;
                                ts.failed_lookups += u64::from(failed_lookup);
                                false
                            }
                            Err(RunError::Txn(TxnError::Abort(AbortReason::User))) => {
                                ts.user_aborts += 1;
                                false
                            }
                            Err(RunError::Txn(TxnError::Abort(reason))) => {
                                ts.record_abort(reason);
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

/// What the audit after a run found, per kind of check.
enum AfterRun {
    /// SmallBank: money (cents), CVT lock words held, lock service locks held.
    Money(i64, u64, Option<u64>),
    /// KVS / YCSB: the audit of these items.
    Kvs(Audit, Vec<(u32, u64)>),
    /// TATP, TPC-C: their consistency checks.
    Checked(audit::Checked),
}

/// TATP's failed lookups per type against the specification's expected rates (TATP
/// 1.0, 4.1: failures are outcomes, not aborts), e.g. `failed lookups (expected):
/// GetNewDestination 76.2% (76.1%), ...`.
fn tatp_failures(r: &Report) -> String {
    let parts: Vec<String> = tatp::TxnType::ALL
        .iter()
        .zip(&r.types)
        .map(|(t, row)| {
            let done = row.committed + row.user_aborts;
            format!(
                "{} {:.1}% ({:.1}%)",
                row.name,
                100.0 * row.failed_lookups as f64 / done.max(1) as f64,
                t.expected_failure_percent()
            )
        })
        .collect();
    format!("failed lookups (expected): {}", parts.join(", "))
}

/// A drawn transaction, retried until it commits.
enum Drawn {
    SmallBank(smallbank::TxnArgs),
    Kvs(ycsb::KvsTxn),
    Tatp(tatp::TxnArgs),
    Tpcc(tpcc::TxnArgs),
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
        let a = args(&["--workload", "tatp", "--subscribers", "5000"]);
        assert_eq!(
            (a.workload_label(), a.scale()),
            ("TATP".into(), "5000 subscribers".into())
        );
        assert_eq!((a.kinds().len(), a.lockd_locks()), (7, 21 * 5000));
        // TPC-C: one warehouse per coordinator thread unless --warehouses says.
        let a = args(&["--workload", "tpcc", "--threads", "3"]);
        assert_eq!((a.warehouses(), a.scale().as_str()), (3, "3 warehouse(s)"));
        assert_eq!(a.skew(0.99), "keys by TPC-C's NURand and home warehouses");
        let a = args(&["--workload", "tpcc", "--warehouses", "4", "--threads", "1"]);
        assert_eq!((a.warehouses(), a.keys()), (4, 4));
        let a = args(&["--hot-accounts", "100", "--hot-fraction", "0.7"]);
        assert_eq!(a.scale(), "100000 accounts, 100 hot for 70% of draws");
    }

    #[test]
    fn bad_workload_combinations_are_refused_before_any_cluster_starts() {
        let stop = Arc::new(AtomicBool::new(false));
        let err = |a: &[&str]| run(args(a), stop.clone()).unwrap_err().to_string();
        assert!(err(&["--workload", "tatp", "--sweep", "theta=0,0.5"]).contains("NURand"));
        assert!(err(&["--workload", "tatp", "--subscribers", "0"]).contains("--subscribers"));
        assert!(err(&["--workload", "tpcc", "--warehouses", "0"]).contains("--warehouses"));
        assert!(err(&["--workload", "tpcc", "--hot-accounts", "10"]).contains("smallbank only"));
        let e = format!(
            "{:#}",
            run(args(&["--hot-accounts", "1"]), stop.clone()).unwrap_err()
        );
        assert!(e.contains("hot accounts must be 2"), "{e}");
    }

    #[test]
    fn a_config_file_holds_an_experiment_and_flags_win() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("exp.toml");
        std::fs::write(
            &f,
            "workload = \"tpcc\"\nwarehouses = 4\nprotocol = \"all\"\nmodel = \"cx5\"\nno-check = true\n",
        )
        .unwrap();
        let path = f.to_str().unwrap();
        let a =
            Args::parse_with_config(["txn-bench", "--config", path, "--warehouses", "2"]).unwrap();
        assert_eq!(a.workload, Workload::Tpcc);
        assert_eq!((a.warehouses(), a.protocol), (2, ProtocolArg::All));
        assert!(a.no_check && a.model == "cx5");
        std::fs::write(&f, "warehouse = 4\n").unwrap();
        let e = Args::parse_with_config(["txn-bench", "--config", path]).unwrap_err();
        assert!(matches!(e, ConfigError::File { .. }), "{e}");
        assert!(e.to_string().contains("--warehouse"), "{e}");
        std::fs::write(&f, "theta = \"high\"\n").unwrap();
        let e = Args::parse_with_config(["txn-bench", "--config", path]).unwrap_err();
        assert!(e.to_string().contains("exp.toml"), "{e}");
    }
}
