//! `lock-bench`: lock fairness and latency under contention (Scythe
//! 3.1 Fig. 7 and 5 Fig. 27), the lock kinds side by side in one
//! invocation, on the shm fabric under a timing model (`--model cx5` by default: on
//! instant shared memory contention measures cache lines, not a network).
//!
//! A lock service node and the client threads run in this process as nodes of a local
//! cluster; with `--serve` and `--connect ADDR` (`bench::remote`; `fairness` and
//! `single`) the lock service runs in one process (on one host) and the clients in
//! another, over `--fabric verbs` across hosts. Each client coroutine repeatedly picks a lock (Zipf theta over `--locks`),
//! acquires it, holds it for `--hold-us`, releases it and starts over. The latency of an
//! acquisition runs from its first request to the grant, retries after refusals included.

use rrpc::NodeId;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bench::plot::{LineChart, Scale, Series};
use clap::{Parser, Subcommand, ValueEnum};
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use serde_json::json;

use bench::remote::{self, FabricSpec, PointEnv, SideArgs, Sides, Started};
use bench::{cli, jsonl};
use lockd::backoff::Backoff;
use lockd::baseline::BaselineConfig;
use lockd::client::{Grant, LockClient, LockRequest, Mode};
use lockd::kinds::{Access, AnyLockClient, LockKind};
use lockd::service::{LockTable, EXPORT_NAME};
use lockd::takeout::Watermarks;
use lockd::words::{WordTable, CAS_EXPORT, DSLR_EXPORT};
use rrpc::fabric::shm::ClusterGuard;
use rrpc::fabric::Fabric;
use rrpc::node::{Node, NodeConfig};
use rrpc::runtime::{Executor, ThreadCtx};
use rrpc::server::ServerConfig;

#[derive(Parser, Debug)]
#[command(
    name = "lock-bench",
    about = "Lock fairness and latency under contention: Takeout Lock and baselines side by side",
    long_about = "Lock fairness and latency under contention (Scythe Fig. 7 and 27). Every \
                  experiment runs the lock kinds side by side in one invocation on a local shm \
                  cluster under a timing model (--model cx5 by default), prints a table and \
                  ratios, with --json writes JSON Lines (a metadata record, one record per \
                  point, the summary) and with --chart draws the experiment's chart (fairness: \
                  p99 against Zipf theta per lock; single: acquisitions per client, sorted, per \
                  lock; queues: mean queue of the longest, second and other objects against \
                  theta; table: throughput against operations per message). With --serve (the lock \
                  service's host) and --connect ADDR (the clients' host), fairness and single \
                  run their two sides in separate processes, on two hosts with --fabric verbs."
)]
struct Args {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    common: Common,
}

#[derive(clap::Args, Debug, Clone)]
struct Common {
    #[command(flatten)]
    fabric: cli::FabricArgs,
    #[command(flatten)]
    config: cli::ConfigArg,
    #[command(flatten)]
    run: cli::RunLength,
    #[command(flatten)]
    seed_arg: cli::SeedArg,
    #[command(flatten)]
    out: cli::OutputArgs,
    /// Client threads (each its own node and runtime, polling without pause). Default:
    /// one less than the cores, leaving one to the lock service's thread: more busy
    /// threads than cores measure the OS scheduler's time slices instead of the locks.
    #[arg(long, global = true)]
    threads: Option<usize>,
    /// Client coroutines per thread (clients = threads x coroutines). Default: 64 clients
    /// in all, as in Scythe's set-up.
    #[arg(long, global = true)]
    coroutines: Option<usize>,
    /// How long a client holds a lock, microseconds.
    #[arg(long, global = true, default_value_t = 25)]
    hold_us: u64,
    /// Lock kinds to compare.
    #[arg(
        long,
        global = true,
        value_delimiter = ',',
        default_value = "takeout,cas,dslr"
    )]
    kinds: Vec<Kind>,
    /// CAS spinlock: the backoff caps to sweep, microseconds (first delay 1 us, doubling
    /// up to the cap, randomized); each is a row, and the ratio uses CAS's best p99.
    #[arg(
        long,
        global = true,
        value_delimiter = ',',
        default_value = "10,100,1000"
    )]
    cas_backoff_caps_us: Vec<u64>,
    /// Takeout: the heat mode requests use (hot: HotWatermark, as TOCC locks; cold:
    /// ColdWatermark, as OCC locks).
    #[arg(long, global = true, default_value = "hot")]
    takeout_mode: TakeoutMode,
    /// Takeout: ColdWatermark (cold-mode requests are refused past this many queued).
    #[arg(long, global = true, default_value_t = 3)]
    cold_watermark: u64,
    /// Takeout: HotWatermark (every request is refused past this many queued).
    #[arg(long, global = true, default_value_t = 10)]
    hot_watermark: u64,
    /// Core the lock service's thread is pinned to (default: the last core). Client
    /// thread `t` is pinned to the `t`-th of the other cores (round robin), so that the
    /// service and a client never take turns on one core through a migration: a Lock
    /// RPC waiting out a client's time slice on the service's core measured the OS
    /// scheduler, not the lock. With `--connect`, this client's value is sent to the
    /// `--serve` process, which pins its service thread to that core.
    #[arg(long, global = true)]
    service_core: Option<usize>,
    /// Longest sleep of the lock service's thread when idle, microseconds
    /// (`rrpc::server::ServerConfig::idle_sleep_us`; 0: the --config file's `[server]`
    /// idle-sleep-us, whose default 0 only yields the core).
    #[arg(long, global = true, default_value_t = 0)]
    service_idle_sleep_us: u64,
    #[command(flatten)]
    side: SideArgs,
    /// The rrpc settings of the clients' runtime contexts and the lock service's server:
    /// `--config`'s `[runtime]` and `[server]` over the defaults (set by `run`; not a
    /// flag). `--service-core` and `--service-idle-sleep-us` win over `[server]`.
    #[arg(skip)]
    rpc: rrpc::node::RpcSettings,
}

impl Common {
    /// Core of the lock service's thread: `--service-core`, else the last core.
    fn service_core(&self) -> usize {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        self.service_core.unwrap_or(cores - 1).min(cores - 1)
    }
    /// Core of client thread `t`: the `t`-th core other than the service's, round robin
    /// (none on a single core).
    fn client_core(&self, t: usize) -> Option<usize> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let sc = self.service_core();
        let others: Vec<usize> = (0..cores).filter(|&k| k != sc).collect();
        (!others.is_empty()).then(|| others[t % others.len()])
    }
    fn duration_ms(&self) -> u64 {
        self.run.duration().as_millis() as u64
    }
    fn warmup(&self) -> Duration {
        self.run.warmup()
    }
    fn secs(&self) -> f64 {
        self.run.secs()
    }
    fn threads(&self) -> usize {
        self.threads.unwrap_or(1)
    }
    fn coroutines(&self) -> usize {
        self.coroutines.unwrap_or(64)
    }
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Scythe Fig. 27: clients over --locks locks at each Zipf theta, per lock kind.
    Fairness {
        /// Locks.
        #[arg(long, default_value_t = 1000)]
        locks: u64,
        /// Zipf thetas.
        #[arg(long, value_delimiter = ',', default_values_t = [0.5, 0.7, 0.9, 0.99, 1.2])]
        thetas: Vec<f64>,
        /// Rounds per theta: each row's --duration is split into this many points
        /// (each after its own --warmup), the rows taking turns, their order rotating
        /// each round. A row prints its rounds merged; the ratios compare the median of
        /// each row's round p99s, so a stall of a shared machine that hits one round of
        /// one row does not decide a ratio.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=100))]
        rounds: u64,
    },
    /// All clients on one lock: per-client acquisitions, Jain's fairness index, the
    /// longest wait.
    Single,
    /// Lotus lock table (Lotus 4.1, 4.2): lock/unlock throughput and lock-set latency,
    /// embedded (local) vs over rrpc (remote), one message per node (batched) vs one per
    /// operation, read+write locks (SR) vs write locks only (SI).
    Table {
        /// Keys, chosen uniformly (conflicts stay rare).
        #[arg(long, default_value_t = 1_000_000)]
        keys: u64,
        /// Records a transaction reads (read-locked under SR, not locked under SI).
        #[arg(long, default_value_t = 6)]
        reads: usize,
        /// Records a transaction writes (write-locked under both).
        #[arg(long, default_value_t = 2)]
        writes: usize,
        /// Lock-table bytes (Lotus evaluates 32 MiB).
        #[arg(long, default_value_t = 32 << 20)]
        table_bytes: usize,
    },
    /// Scythe Table 2: Takeout queues of the clients (128 by default) over 100,000
    /// objects at each Zipf theta: the longest and second-longest queue, the mean of the
    /// others, the access rates of the top objects.
    Queues {
        /// Objects (Takeout Locks).
        #[arg(long, default_value_t = 100_000)]
        locks: u64,
        /// Zipf thetas.
        #[arg(long, value_delimiter = ',', default_values_t = [0.9, 0.95, 0.99, 1.2])]
        thetas: Vec<f64>,
        /// Queue-length samples per second (each reads every lock's words on the
        /// service's CPU).
        #[arg(long, default_value_t = 200)]
        samples_per_s: u64,
    },
}

/// A lock algorithm under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
enum Kind {
    /// Scythe's Takeout Lock: Lock RPC for a ticket, Hangout and READ for its turn, FAA to
    /// release.
    Takeout,
    /// CAS spinlock (FORD, FaRM): one-sided CAS with randomized exponential backoff,
    /// released by a WRITE of 0.
    Cas,
    /// DSLR (Yoon et al., SIGMOD'18): one-sided FAA tickets in a 64-bit word, READ
    /// polling, FAA release.
    Dslr,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Takeout => "takeout",
            Kind::Cas => "cas",
            Kind::Dslr => "dslr",
        }
    }
}

/// One lock configuration under test: a kind, and for CAS a backoff cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Variant {
    kind: Kind,
    cas_cap_us: u64,
    /// Takeout: HotWatermark for this row, if not `--hot-watermark`.
    hot_watermark: Option<u64>,
}

impl Variant {
    fn label(self) -> String {
        match (self.kind, self.hot_watermark) {
            (Kind::Cas, _) => format!("cas/{}us", self.cas_cap_us),
            (Kind::Takeout, Some(w)) => format!("takeout/wm{w}"),
            (k, _) => k.name().into(),
        }
    }
}

impl Common {
    /// The variants to run: each kind, CAS once per backoff cap.
    fn variants(&self) -> Vec<Variant> {
        let mut v = Vec::new();
        for &kind in &self.kinds {
            if kind == Kind::Cas {
                for &cap in &self.cas_backoff_caps_us {
                    v.push(Variant {
                        kind,
                        cas_cap_us: cap,
                        hot_watermark: None,
                    });
                }
            } else {
                v.push(Variant {
                    kind,
                    cas_cap_us: 0,
                    hot_watermark: None,
                });
            }
        }
        v
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum TakeoutMode {
    Hot,
    Cold,
}

/// lock-bench's defaults for the shared flags: 2 s per point after 300 ms of warm-up.
const DEFAULTS: &[(&str, &str)] = &[("duration", "2s"), ("warmup", "300ms")];

fn main() {
    bench::bench_main::<Args>("lock-bench", DEFAULTS, run);
}

fn run(mut args: Args) -> Result<()> {
    args.common.rpc = cli::as_usage(args.common.config.rpc_settings())?;
    let kind = args.common.fabric.fabric;
    let model_arg = args.common.fabric.model()?;
    let model = cli::as_usage(rrpc::fabric::model::TimingModel::load(&model_arg))?;
    let model_desc = model
        .as_ref()
        .map_or_else(|| "none".into(), |m| m.describe());
    let spec = FabricSpec::new(kind, Some(model_arg.clone()), &args.common.side);
    let side = args.common.side.side();
    if let remote::Side::Serve { .. } = side {
        let banner = [format!(
            "lock-bench | fabric: {kind} | timing model: {model_desc} | serving lock services (fairness, single) for --connect clients"
        )];
        let server = args.common.rpc.server.clone();
        let start = move |p: &serde_json::Value, env: &PointEnv<'_>| start_service(p, env, &server);
        return remote::serve("lock-bench", &spec, side, &banner, &start);
    }
    let Some(cmd) = args.cmd.take() else {
        return Err(cli::usage(
            "a subcommand is needed (fairness, single, table, queues), or --serve; see --help",
        ));
    };
    if side != remote::Side::Both && matches!(cmd, Cmd::Table { .. } | Cmd::Queues { .. }) {
        return Err(cli::usage("--connect: table and queues run in one process (table compares an embedded lock table, queues samples the service's memory); run them without --connect"));
    }
    let sides = Sides::new("lock-bench", spec, side)?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = *args
        .common
        .threads
        .get_or_insert(cores.saturating_sub(1).max(1));
    // Scythe's set-ups: 64 clients for the lock experiments, 128 for Table 2.
    let clients: usize = if matches!(cmd, Cmd::Queues { .. }) {
        128
    } else {
        64
    };
    args.common
        .coroutines
        .get_or_insert(clients.div_ceil(threads));
    let c = &args.common;
    if threads == 0 || c.coroutines() == 0 || c.run.duration().is_zero() {
        return Err(cli::usage(
            "--threads, --coroutines and --duration must be more than 0",
        ));
    }
    jsonl::open(
        c.out.json.as_deref(),
        &jsonl::RunInfo {
            binary: "lock-bench",
            fabric: kind,
            rdma_device: c.side.rdma_device.as_deref(),
            model: &model_arg,
            seed: c.seed_arg.seed,
        },
    )?;
    println!(
        "lock-bench | fabric: {kind}{} | timing model: {} | {} thread(s) x {} coroutines = {} clients | hold {} us | takeout mode {:?}, watermarks cold {} hot {} | {} ms per point ({} ms warm-up)",
        sides.server().map_or_else(String::new, |s| {
            format!(" | lock service at --connect {s}, clients here")
        }),
        model_desc,
        c.threads(),
        c.coroutines(),
        c.threads() * c.coroutines(),
        c.hold_us,
        c.takeout_mode,
        c.cold_watermark,
        c.hot_watermark,
        c.duration_ms(),
        c.warmup().as_millis()
    );
    let out = match &cmd {
        Cmd::Fairness {
            locks,
            thetas,
            rounds,
        } => fairness(c, &sides, *locks, thetas, *rounds as usize)?,
        Cmd::Single => single(c, &sides)?,
        Cmd::Table {
            keys,
            reads,
            writes,
            table_bytes,
        } => table(c, sides.spec(), *keys, *reads, *writes, *table_bytes)?,
        Cmd::Queues {
            locks,
            thetas,
            samples_per_s,
        } => queues(c, &sides, *locks, thetas, *samples_per_s)?,
    };
    if let Some(path) = &c.out.chart {
        let name = model.as_ref().map_or("none", |m| m.params().name.as_str());
        draw(&cmd, &out, name, path)?;
    }
    if let Some(p) = &c.out.json {
        jsonl::summary(&json!({
            "timing_model": model.as_ref().map(|m| m.describe()),
            "threads": c.threads(), "coroutines": c.coroutines(), "hold_us": c.hold_us,
            "duration_ms": c.duration_ms(), "results": out,
        }));
        println!("wrote {}", p.display());
    }
    Ok(())
}

/// What one point measured.
struct Point {
    hist: Histogram<u64>,
    acquisitions: u64,
    refusals: u64,
    per_client: Vec<u64>,
    max_wait_ns: u64,
    secs: f64,
}

impl Point {
    fn jain(&self) -> f64 {
        let n = self.per_client.len() as f64;
        let sum: f64 = self.per_client.iter().map(|&x| x as f64).sum();
        let sq: f64 = self.per_client.iter().map(|&x| (x as f64).powi(2)).sum();
        if sq == 0.0 {
            0.0
        } else {
            sum * sum / (n * sq)
        }
    }
    fn us(&self, q: f64) -> f64 {
        self.hist.value_at_quantile(q) as f64 / 1e3
    }
}

impl Point {
    /// Merge another measurement of the same clients (a later round) into this one.
    fn merge(&mut self, o: Point) {
        self.hist.add(&o.hist).expect("same bounds");
        self.acquisitions += o.acquisitions;
        self.refusals += o.refusals;
        if self.per_client.len() < o.per_client.len() {
            self.per_client.resize(o.per_client.len(), 0);
        }
        for (a, b) in self.per_client.iter_mut().zip(o.per_client) {
            *a += b;
        }
        self.max_wait_ns = self.max_wait_ns.max(o.max_wait_ns);
        self.secs += o.secs;
    }
}

/// Median of `v` (`None` when empty).
fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

const HEADER: &str =
    "      lock  theta   p50(us)   p99(us)  p999(us)   acq/s  refusals    jain  maxwait(us)";

/// One row of [`HEADER`], then `extra` (microseconds) as one more column when given.
fn print_row(v: Variant, theta: Option<f64>, p: &Point, extra: Option<f64>) {
    println!(
        "{:>10} {:>6} {:>9.1} {:>9.1} {:>9.1} {:>7.0} {:>9} {:>7.3} {:>12.1}{}",
        v.label(),
        theta.map_or_else(|| "-".into(), |t| format!("{t}")),
        p.us(0.5),
        p.us(0.99),
        p.us(0.999),
        p.acquisitions as f64 / p.secs,
        p.refusals,
        p.jain(),
        p.max_wait_ns as f64 / 1e3,
        extra.map_or_else(String::new, |x| format!(" {x:>9.1}"))
    );
}

fn row_json(v: Variant, theta: Option<f64>, p: &Point) -> serde_json::Value {
    json!({
        "lock": v.label(), "kind": v.kind.name(), "theta": theta, "p50_us": p.us(0.5), "p99_us": p.us(0.99),
        "p999_us": p.us(0.999), "acquisitions_per_s": p.acquisitions as f64 / p.secs,
        "refusals": p.refusals, "jain": p.jain(), "max_wait_us": p.max_wait_ns as f64 / 1e3,
        "per_client": p.per_client,
    })
}

/// The chart of an experiment, drawn from the rows it returned (see `--chart`).
fn draw(cmd: &Cmd, out: &serde_json::Value, model: &str, path: &std::path::Path) -> Result<()> {
    let rows = out["rows"].as_array().cloned().unwrap_or_default();
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or(0.0);
    // Points of the series named by `key` in each row, in row order.
    let by = |key: &str, x: &dyn Fn(&serde_json::Value) -> f64, y: &str| {
        let mut series: Vec<Series> = Vec::new();
        for r in &rows {
            let name = r[key].as_str().unwrap_or("?").to_string();
            let pt = (x(r), f(&r[y]));
            match series.iter_mut().find(|s| s.name == name) {
                Some(s) => s.points.push(pt),
                None => series.push(Series {
                    name,
                    points: vec![pt],
                    labels: Vec::new(),
                }),
            }
        }
        series
    };
    let (title, x_label, y_label, x_scale, y_scale, series) = match cmd {
        Cmd::Fairness { .. } => (
            "lock p99 against Zipf theta",
            "Zipf theta",
            "p99 (us)",
            Scale::Linear,
            Scale::Log10,
            by("lock", &|r| f(&r["theta"]), "p99_us"),
        ),
        Cmd::Single => {
            let series = rows
                .iter()
                .map(|r| {
                    let mut n: Vec<f64> = r["per_client"]
                        .as_array()
                        .map(|a| a.iter().map(f).collect())
                        .unwrap_or_default();
                    n.sort_by(|a, b| b.total_cmp(a));
                    Series {
                        name: r["lock"].as_str().unwrap_or("?").to_string(),
                        points: n
                            .iter()
                            .enumerate()
                            .map(|(i, &v)| (i as f64 + 1.0, v))
                            .collect(),
                        labels: Vec::new(),
                    }
                })
                .collect();
            (
                "acquisitions per client on one lock",
                "client (most acquisitions first)",
                "acquisitions",
                Scale::Linear,
                Scale::Linear,
                series,
            )
        }
        Cmd::Queues { .. } => {
            let line = |name: &str, y: &dyn Fn(&serde_json::Value) -> f64| Series {
                name: name.to_string(),
                points: rows.iter().map(|r| (f(&r["theta"]), y(r))).collect(),
                labels: Vec::new(),
            };
            (
                "Takeout queues against Zipf theta",
                "Zipf theta",
                "mean queue length",
                Scale::Linear,
                Scale::Linear,
                vec![
                    line("longest", &|r| f(&r["longest"]["mean_queue"])),
                    line("second", &|r| f(&r["second"]["mean_queue"])),
                    line("others (mean)", &|r| f(&r["others_mean_queue"])),
                ],
            )
        }
        Cmd::Table { .. } => {
            let mut series: Vec<Series> = Vec::new();
            for r in &rows {
                let name = format!(
                    "{} {}",
                    r["placement"].as_str().unwrap_or("?"),
                    r["iso"].as_str().unwrap_or("?")
                );
                let pt = (f(&r["ops_per_message"]), f(&r["mops"]));
                match series.iter_mut().find(|s| s.name == name) {
                    Some(s) => s.points.push(pt),
                    None => series.push(Series {
                        name,
                        points: vec![pt],
                        labels: Vec::new(),
                    }),
                }
            }
            for s in &mut series {
                s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
            }
            (
                "lock-table throughput against batching",
                "lock operations per message",
                "M ops/s",
                Scale::Log2,
                Scale::Linear,
                series,
            )
        }
    };
    let title = format!("{title} (timing model: {model})");
    LineChart {
        title: &title,
        x_label,
        y_label,
        x_scale,
        y_scale,
        series: &series,
    }
    .draw(path)?;
    println!("plot: {}", path.display());
    Ok(())
}

fn fairness(
    c: &Common,
    sides: &Sides,
    locks: u64,
    thetas: &[f64],
    rounds: usize,
) -> Result<serde_json::Value> {
    let rounds = rounds.max(1);
    println!(
        "\n== fairness (Scythe Fig. 27): {} clients over {locks} locks, hold {} us, re-acquire after release | \
         lock service pinned to core {}, client threads to the others | {rounds} rounds of {} ms per row and theta, \
         rows taking turns (order rotating); a row prints its rounds merged, p99r is the median of its rounds' p99s, \
         which the ratios compare",
        c.threads() * c.coroutines(),
        c.hold_us,
        c.service_core(),
        (c.duration_ms() / rounds as u64).max(1)
    );
    // Scythe 5.4 runs Fig. 27 with every client queued ("the queue length is at most 64,
    // and the lock can be acquired after a maximum of 63 threads"): no request is refused
    // and the ticket queue is the only order. The row `takeout` does the same, with a
    // HotWatermark of at least the number of clients; the configured watermark, below
    // that, is a second row (`takeout/wm<N>`), where refused clients retry after a
    // Hangout in no order, as CAS's clients do.
    let clients = (c.threads() * c.coroutines()) as u64;
    let paper_wm = c.hot_watermark.max(clients);
    println!(
        "takeout: HotWatermark {paper_wm} (>= {clients} clients: nobody is refused, as in Scythe 5.4; the ratio row){}",
        if c.hot_watermark < clients {
            format!(
                "; takeout/wm{}: the configured HotWatermark, refused clients retry",
                c.hot_watermark
            )
        } else {
            String::new()
        }
    );
    println!("{HEADER}  p99r(us)");
    let mut variants = Vec::new();
    for v in c.variants() {
        if v.kind == Kind::Takeout {
            variants.push(Variant {
                hot_watermark: Some(paper_wm),
                ..v
            });
            if c.hot_watermark < clients {
                variants.push(Variant {
                    hot_watermark: Some(c.hot_watermark),
                    ..v
                });
            }
        } else {
            variants.push(v);
        }
    }
    let mut rows = Vec::new();
    // Best p99 per (row kind, theta x 100): the paper's Takeout row, the watermark row,
    // and each baseline over its variants (CAS: its best backoff).
    let mut best: BTreeMap<(String, i64), f64> = BTreeMap::new();
    let mut per_round = c.clone();
    per_round.run.duration_ms = Some((c.duration_ms() / rounds as u64).max(1));
    for &theta in thetas {
        let mut got: Vec<Option<Point>> = variants.iter().map(|_| None).collect();
        let mut p99s: Vec<Vec<f64>> = variants.iter().map(|_| Vec::new()).collect();
        for round in 0..rounds {
            for k in 0..variants.len() {
                let i = (round + k) % variants.len();
                let p = measure(&per_round, sides, variants[i], locks, theta)?;
                if p.acquisitions > 0 {
                    p99s[i].push(p.us(0.99));
                }
                match &mut got[i] {
                    Some(acc) => acc.merge(p),
                    slot @ None => *slot = Some(p),
                }
            }
        }
        for ((&v, p), p99s) in variants.iter().zip(got).zip(p99s) {
            let p = p.expect("every row ran a round");
            let label = match v.kind {
                Kind::Takeout if v.hot_watermark == Some(paper_wm) => "takeout".to_string(),
                Kind::Takeout => "takeout-wm".to_string(),
                k => k.name().to_string(),
            };
            let mut row_v = v;
            if label == "takeout" {
                row_v.hot_watermark = None; // printed as plain `takeout`
            }
            let p99r = median(p99s.clone());
            print_row(row_v, Some(theta), &p, Some(p99r.unwrap_or(0.0)));
            let mut row = row_json(row_v, Some(theta), &p);
            row["hot_watermark"] = json!(v.hot_watermark);
            row["round_p99_us"] = json!(p99s);
            row["median_round_p99_us"] = json!(p99r);
            rows.push(jsonl::point_with("fairness", row, Some(&p.hist)));
            let Some(p99r) = p99r else {
                // No acquisition in any measured round (a stalled machine): no p99 to
                // compare; a ratio against a p99 of 0 would read as a win.
                println!(
                    "{:>10} {theta}: no acquisitions measured; left out of the ratios",
                    row_v.label()
                );
                continue;
            };
            let e = best
                .entry((label, (theta * 100.0).round() as i64))
                .or_insert(f64::INFINITY);
            *e = e.min(p99r);
        }
    }
    let at99 = |k: &str| best.get(&(k.to_string(), 99)).copied();
    let ratio = match (at99("takeout"), at99("cas")) {
        (Some(t), Some(c)) => Some(t / c),
        _ => None,
    };
    if let Some(r) = ratio {
        println!(
            "ratio p99 takeout/cas @0.99 = {r:.2} (median round p99s; Takeout: HotWatermark {paper_wm}; CAS: its best backoff)"
        );
    }
    let ratio_wm = match (at99("takeout-wm"), at99("cas")) {
        (Some(t), Some(c)) => Some(t / c),
        _ => None,
    };
    if let Some(r) = ratio_wm {
        println!(
            "ratio p99 takeout/wm{}/cas @0.99 = {r:.2} (median round p99s; watermark row; CAS: its best backoff)",
            c.hot_watermark
        );
    }
    let ratio_dslr = match (at99("takeout"), at99("dslr")) {
        (Some(t), Some(d)) => Some(t / d),
        _ => None,
    };
    if let Some(r) = ratio_dslr {
        println!("ratio p99 takeout/dslr @0.99 = {r:.2} (median round p99s; Takeout: HotWatermark {paper_wm})");
    }
    Ok(json!({
        "locks": locks, "rows": rows, "hot_watermark_ratio_row": paper_wm,
        "ratio_p99_takeout_cas_099": ratio, "ratio_p99_takeout_wm_cas_099": ratio_wm,
        "ratio_p99_takeout_dslr_099": ratio_dslr,
    }))
}

fn single(c: &Common, sides: &Sides) -> Result<serde_json::Value> {
    println!(
        "\n== single: {} clients on one lock, hold {} us",
        c.threads() * c.coroutines(),
        c.hold_us
    );
    println!("{HEADER}");
    let mut rows = Vec::new();
    for v in c.variants() {
        let p = measure(c, sides, v, 1, 0.0)?;
        print_row(v, None, &p, None);
        let (lo, hi) = (
            p.per_client.iter().min().copied().unwrap_or(0),
            p.per_client.iter().max().copied().unwrap_or(0),
        );
        println!(
            "{:>10} per-client acquisitions: min {lo}, max {hi}, Jain {:.3}",
            v.label(),
            p.jain()
        );
        rows.push(jsonl::point_with(
            "single",
            row_json(v, None, &p),
            Some(&p.hist),
        ));
    }
    Ok(json!({ "rows": rows }))
}

/// Start a lock service, run the clients for warm-up + duration, collect.
fn measure(c: &Common, sides: &Sides, v: Variant, locks: u64, theta: f64) -> Result<Point> {
    measure_probed(c, sides, v, locks, theta, None)
}

/// Queue lengths of every Takeout Lock, sampled on the service's CPU during the measured
/// window, and the tickets each lock handed out (warm-up included).
struct QueueProbe {
    every: Duration,
    /// Per lock: sum over samples of `lower - upper`.
    sums: Vec<u64>,
    /// Per lock: the longest queue sampled.
    maxes: Vec<u64>,
    samples: u64,
    /// Per lock: `lower` at the end (tickets taken).
    tickets: Vec<u64>,
}

/// [`measure`], sampling queues into `probe` when given.
/// The server side of a point: the lock service's shape.
#[derive(serde::Serialize, serde::Deserialize)]
struct ServiceParams {
    /// Locks of each kind.
    locks: u64,
    /// Core the service's thread is pinned to (none: not pinned).
    #[serde(default)]
    core: Option<usize>,
    /// The service thread's longest idle sleep, microseconds (0: yield only).
    #[serde(default)]
    idle_sleep_us: u64,
    /// Takeout's watermarks.
    cold_watermark: u64,
    hot_watermark: u64,
}

/// A point's lock service, kept while the point runs (dropped in this order: the node,
/// then the tables).
struct Service {
    _node: Node,
    table: Arc<LockTable>,
    _words: (WordTable, WordTable),
}

/// Start a lock service node: `locks` Takeout Locks and the baselines' CAS and DSLR
/// words, the server side of a point, here or on the `--serve` process, with `server`'s
/// settings under the point's core and idle sleep.
fn start_service(
    params: &serde_json::Value,
    env: &PointEnv<'_>,
    server: &ServerConfig,
) -> Result<Started> {
    let p: ServiceParams =
        serde_json::from_value(params.clone()).context("the lock service's parameters")?;
    let f = env.open(NodeId(1))?;
    let wm = Watermarks {
        cold: p.cold_watermark,
        hot: p.hot_watermark,
    };
    wm.validate().map_err(anyhow::Error::msg)?;
    let table = Arc::new(LockTable::new(&f, p.locks, wm)?);
    // The baselines' lock words: one-sided only, in the same node's memory.
    let (cas, dslr) = (WordTable::new(&f, p.locks)?, WordTable::new(&f, p.locks)?);
    let mut exports = BTreeMap::new();
    exports.insert(EXPORT_NAME.to_string(), table.export());
    exports.insert(CAS_EXPORT.to_string(), cas.export());
    exports.insert(DSLR_EXPORT.to_string(), dslr.export());
    let node = Node::start_with(
        f,
        NodeConfig::new("lockd", env.listen())
            .with_exports(exports)
            .rpc(table.handlers(), 1),
        server
            .clone()
            .with_cores(p.core.into_iter().collect())
            .with_idle_sleep_us(if p.idle_sleep_us != 0 {
                p.idle_sleep_us
            } else {
                server.idle_sleep_us
            }),
    )?;
    Ok(Started {
        addr: node.addr(),
        info: serde_json::Value::Null,
        keep: Box::new(Service {
            _node: node,
            table,
            _words: (cas, dslr),
        }),
    })
}

fn measure_probed(
    c: &Common,
    sides: &Sides,
    v: Variant,
    locks: u64,
    theta: f64,
    probe: Option<&mut QueueProbe>,
) -> Result<Point> {
    let kind = v.kind;
    let params = ServiceParams {
        locks,
        core: Some(c.service_core()),
        idle_sleep_us: c.service_idle_sleep_us,
        cold_watermark: c.cold_watermark,
        hot_watermark: v.hot_watermark.unwrap_or(c.hot_watermark),
    };
    let start = |p: &serde_json::Value, env: &PointEnv<'_>| start_service(p, env, &c.rpc.server);
    let point = sides.point(&serde_json::to_value(&params)?, &start)?;
    // The queue probe reads the service's memory: one process only.
    let table = match (&probe, point.local::<Service>()) {
        (None, _) => None,
        (Some(_), Some(s)) => Some(s.table.clone()),
        (Some(_), None) => bail!("sampling queues needs the lock service in this process"),
    };
    let (spec, cluster) = (sides.spec(), point.cluster.clone());
    let open = |id: u32| -> Result<Fabric> { spec.open(&cluster, NodeId(id)) };
    let addr = point.addr;
    let ts = Arc::new(AtomicU64::new(1));
    let t0 = Instant::now();
    let (warm, meas) = (t0 + c.warmup(), t0 + c.warmup() + c.run.duration());
    let mut probe = probe;
    let results: Vec<Result<Point>> = std::thread::scope(|s| {
        if let (Some(p), Some(table)) = (probe.as_deref_mut(), &table) {
            s.spawn(move || {
                while Instant::now() < meas {
                    std::thread::sleep(p.every);
                    let now = Instant::now();
                    if now < warm || now >= meas {
                        continue;
                    }
                    for id in 0..locks {
                        let (lower, upper, _) = table.words(id);
                        let q = lower.wrapping_sub(upper);
                        p.sums[id as usize] += q;
                        p.maxes[id as usize] = p.maxes[id as usize].max(q);
                    }
                    p.samples += 1;
                }
            });
        }
        let hs: Vec<_> = (0..c.threads())
            .map(|t| {
                let (ts, open) = (ts.clone(), &open);
                s.spawn(move || -> Result<Point> {
                    if let Some(core) = c.client_core(t) {
                        let _ = core_affinity::set_for_current(core_affinity::CoreId { id: core });
                    }
                    let ctx = ThreadCtx::new(open(100 + t as u32)?, c.rpc.runtime.clone())
                        .map_err(anyhow::Error::msg)?;
                    let info = ctx.connect_rpc(addr).map_err(anyhow::Error::msg)?;
                    let lc = Rc::new(LockClient::from_info(&info)?);
                    let cfg = BaselineConfig::default()
                        .with_backoff(Backoff {
                            base: Duration::from_micros(1),
                            cap: Duration::from_micros(v.cas_cap_us.max(1)),
                        })
                        .with_seed(c.seed_arg.seed)
                        .with_client(Some(t as u16));
                    let any = match kind {
                        Kind::Takeout => None,
                        Kind::Cas => Some(LockKind::Cas),
                        Kind::Dslr => Some(LockKind::Dslr),
                    }
                    .map(|k| AnyLockClient::from_info(k, &ctx, &info, &cfg))
                    .transpose()?
                    .map(Rc::new);
                    client_thread(
                        c,
                        &ctx,
                        (kind, lc, any),
                        locks,
                        theta,
                        ts,
                        t as u64,
                        (warm, meas),
                    )
                })
            })
            .collect();
        bench::join_clients(hs)
    });
    if let (Some(p), Some(table)) = (probe, &table) {
        p.tickets = (0..locks).map(|id| table.words(id).0).collect();
    }
    drop(table);
    drop(point);
    let mut all = Point {
        hist: new_hist(),
        acquisitions: 0,
        refusals: 0,
        per_client: Vec::new(),
        max_wait_ns: 0,
        secs: c.secs(),
    };
    for r in results {
        let p = r?;
        all.hist.add(&p.hist).expect("same bounds");
        all.acquisitions += p.acquisitions;
        all.refusals += p.refusals;
        all.per_client.extend(p.per_client);
        all.max_wait_ns = all.max_wait_ns.max(p.max_wait_ns);
    }
    Ok(all)
}

fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds")
}

#[allow(clippy::too_many_arguments)]
fn client_thread(
    c: &Common,
    ctx: &Rc<ThreadCtx>,
    (kind, lc, any): (Kind, Rc<LockClient>, Option<Rc<AnyLockClient>>),
    locks: u64,
    theta: f64,
    ts: Arc<AtomicU64>,
    thread: u64,
    (warm, end): (Instant, Instant),
) -> Result<Point> {
    let hist = Rc::new(RefCell::new(new_hist()));
    // Takeout: the Lock RPC's own latency, apart from the wait for the turn.
    let rpc_hist = Rc::new(RefCell::new(new_hist()));
    let refusals = Rc::new(Cell::new(0u64));
    let max_wait = Rc::new(Cell::new(0u64));
    let per_client = Rc::new(RefCell::new(vec![0u64; c.coroutines()]));
    let failed = Rc::new(RefCell::new(None::<String>));
    let zipf = if locks > 1 && theta > 0.0 {
        Some(Zipf::new(locks as f64, theta).context("Zipf distribution")?)
    } else {
        None
    };
    let hold = Duration::from_micros(c.hold_us);
    let mode = match c.takeout_mode {
        TakeoutMode::Hot => Mode::Hot,
        TakeoutMode::Cold => Mode::Cold,
    };
    let mut ex = Executor::new(ctx.clone());
    for co in 0..c.coroutines() {
        let any = any.clone();
        let (ctx, lc, ts, hist, rpc_hist, refusals, max_wait, per_client, failed) = (
            ctx.clone(),
            lc.clone(),
            ts.clone(),
            hist.clone(),
            rpc_hist.clone(),
            refusals.clone(),
            max_wait.clone(),
            per_client.clone(),
            failed.clone(),
        );
        let mut rng =
            rand::rngs::StdRng::seed_from_u64(c.seed_arg.seed ^ (thread << 32 | co as u64));
        ex.spawn(async move {
            while Instant::now() < end && failed.borrow().is_none() {
                let id = match zipf {
                    Some(z) => (z.sample(&mut rng) as u64 - 1).min(locks - 1),
                    None => rng.random_range(0..locks),
                };
                let start = Instant::now();
                let measured = start >= warm;
                let r: Result<(), String> = async {
                    match kind {
                        Kind::Takeout => loop {
                            let req = LockRequest {
                                id,
                                ts: ts.fetch_add(1, Ordering::Relaxed),
                                mode,
                            };
                            let t_rpc = Instant::now();
                            let grants = lc.lock(&ctx, &[req]).await.map_err(|e| e.to_string())?;
                            if measured {
                                let _ = rpc_hist
                                    .borrow_mut()
                                    .record((t_rpc.elapsed().as_nanos() as u64).max(1));
                            }
                            match grants.into_iter().next() {
                                Some(Grant::Queued(mut t)) => {
                                    t.wait(Instant::now() + Duration::from_secs(30))
                                        .await
                                        .map_err(|e| e.to_string())?;
                                    record(&hist, &max_wait, start, measured);
                                    ctx.sleep(hold).await;
                                    t.release().await.map_err(|e| e.to_string())?;
                                    break Ok(());
                                }
                                Some(Grant::Refused(r)) => {
                                    if measured {
                                        refusals.set(refusals.get() + 1);
                                    }
                                    // Retry after the Hangout of the queue that refused
                                    // us (Equation 3 with its length): sooner is refused
                                    // again, and floods the Lock RPC.
                                    let wait = lc.hangout(r.ahead().max(1));
                                    ctx.sleep(wait.max(Duration::from_micros(2))).await;
                                }
                                None => break Err("empty Lock RPC reply".into()),
                            }
                        },
                        Kind::Cas | Kind::Dslr => {
                            let any = any.as_ref().ok_or("no baseline client")?;
                            let g = any
                                .lock(&ctx, id, Access::Exclusive)
                                .await
                                .map_err(|e| e.to_string())?;
                            record(&hist, &max_wait, start, measured);
                            ctx.sleep(hold).await;
                            g.release().await.map_err(|e| e.to_string())?;
                            Ok(())
                        }
                    }
                }
                .await;
                match r {
                    Ok(()) if measured && Instant::now() <= end => {
                        per_client.borrow_mut()[co] += 1;
                    }
                    Ok(()) => {}
                    Err(e) => *failed.borrow_mut() = Some(e),
                }
            }
        });
    }
    ex.run();
    if kind == Kind::Takeout {
        let r = rpc_hist.borrow();
        eprintln!(
            "takeout client thread {thread}: smoothed one-sided RTT to the lock service {:?} (network), scheduling lag {:?}, Lock RPC p50 {:.1} us p99 {:.1} us",
            lc.srtt(),
            lc.sched_lag(),
            r.value_at_quantile(0.5) as f64 / 1e3,
            r.value_at_quantile(0.99) as f64 / 1e3
        );
    }
    if let Some(e) = failed.borrow_mut().take() {
        bail!("{} client failed: {e}", kind.name());
    }
    let per_client = per_client.borrow().clone();
    let hist = hist.borrow().clone();
    Ok(Point {
        acquisitions: per_client.iter().sum(),
        refusals: refusals.get(),
        per_client,
        max_wait_ns: max_wait.get(),
        hist,
        secs: c.secs(),
    })
}

/// Record an acquisition's latency (first request to grant) if in the measured window.
fn record(hist: &RefCell<Histogram<u64>>, max_wait: &Cell<u64>, start: Instant, measured: bool) {
    if !measured {
        return;
    }
    let ns = start.elapsed().as_nanos() as u64;
    let _ = hist.borrow_mut().record(ns.max(1));
    max_wait.set(max_wait.get().max(ns));
}

/// Placement of the lock table relative to its client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Placement {
    /// The table in the client's process, called directly (Lotus's placement).
    Local,
    /// The table on another node, over rrpc.
    Remote,
}

/// What a transaction locks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Iso {
    /// Serializable: read locks on reads, write locks on writes.
    Sr,
    /// Snapshot isolation: write locks only.
    Si,
}

/// One `table` row's measurements.
struct TablePoint {
    /// Latency of a transaction's lock call (its whole lock set), ns.
    hist: Histogram<u64>,
    /// Lock + unlock pairs completed in the measured window.
    pairs: u64,
    /// Transactions whose lock set was refused in part (then released).
    aborts: u64,
    secs: f64,
}

fn table(
    c: &Common,
    spec: &FabricSpec,
    keys: u64,
    reads: usize,
    writes: usize,
    table_bytes: usize,
) -> Result<serde_json::Value> {
    use lockd::table_wire::MAX_OPS;
    if keys < 2 * (reads + writes) as u64 || reads + writes == 0 {
        bail!("--keys must be at least twice --reads + --writes, and a transaction must lock something");
    }
    println!(
        "\n== table (Lotus 4.1, 4.2): {} clients, {reads} reads + {writes} writes per transaction over {keys} keys, {} MiB table; lock set then unlock set, no hold",
        c.threads() * c.coroutines(),
        table_bytes >> 20
    );
    println!(
        "{:>7} {:>10} {:>4} {:>9} {:>11} {:>11} {:>8}",
        "place", "batching", "iso", "Mops/s", "p50 set(us)", "p99 set(us)", "aborts"
    );
    let mut rows = Vec::new();
    let mut mops = BTreeMap::new();
    for place in [Placement::Local, Placement::Remote] {
        for batch in [MAX_OPS, 1] {
            for iso in [Iso::Sr, Iso::Si] {
                let p = measure_table(
                    c,
                    spec,
                    (place, batch, iso),
                    keys,
                    reads,
                    writes,
                    table_bytes,
                )?;
                let m = p.pairs as f64 / p.secs / 1e6;
                let us = |q| p.hist.value_at_quantile(q) as f64 / 1e3;
                let batching = if batch == 1 { "one-per-op" } else { "batched" };
                println!(
                    "{:>7} {:>10} {:>4} {:>9.3} {:>11.1} {:>11.1} {:>8}",
                    format!("{place:?}").to_lowercase(),
                    batching,
                    format!("{iso:?}").to_uppercase(),
                    m,
                    us(0.5),
                    us(0.99),
                    p.aborts
                );
                mops.insert((place == Placement::Remote, batch, iso == Iso::Sr), m);
                rows.push(jsonl::point_with(
                    "table",
                    json!({
                        "placement": format!("{place:?}").to_lowercase(), "batching": batching,
                        "ops_per_message": batch, "iso": format!("{iso:?}").to_uppercase(),
                        "mops": m, "p50_lock_set_us": us(0.5), "p99_lock_set_us": us(0.99),
                        "aborts": p.aborts, "pairs": p.pairs,
                    }),
                    Some(&p.hist),
                ));
            }
        }
    }
    let ratio = mops[&(true, MAX_OPS, true)] / mops[&(true, 1, true)];
    println!("ratio remote batched/unbatched = {ratio:.2} (SR)");
    Ok(json!({
        "keys": keys, "reads": reads, "writes": writes, "table_bytes": table_bytes,
        "rows": rows, "ratio_remote_batched_unbatched_sr": ratio,
    }))
}

#[allow(clippy::too_many_arguments)]
fn measure_table(
    c: &Common,
    spec: &FabricSpec,
    (place, batch, iso): (Placement, usize, Iso),
    keys: u64,
    reads: usize,
    writes: usize,
    table_bytes: usize,
) -> Result<TablePoint> {
    use lockd::lock_table::{LockMode, LockTable as LotusTable};
    use lockd::shard::{LockKey, Ownership, ShardMap};
    use lockd::table_service::{TableClient, TableClientConfig, TableService};
    use lockd::table_wire::{OpKind, OpOutcome, TableOp};

    let name = format!(
        "lock-bench-table-{}-{place:?}-{batch}-{iso:?}",
        std::process::id()
    );
    let (cluster, _) = ClusterGuard::new(&name)?;
    let open = |id: u32| -> Result<Fabric> { spec.open(&name, NodeId(id)) };
    let map = ShardMap::uniform(&[1])?;
    let svc = Arc::new(TableService::new(
        Arc::new(LotusTable::with_bytes(table_bytes)),
        Ownership::new(1, map.clone()),
    ));
    let node = Node::start_with(
        open(1)?,
        NodeConfig::new("lockd", "127.0.0.1:0".parse()?).rpc(svc.handlers(), 1),
        c.rpc.server.clone(),
    )?;
    let addr = node.addr();
    let t0 = Instant::now();
    let (warm, end) = (t0 + c.warmup(), t0 + c.warmup() + c.run.duration());
    let results: Vec<Result<TablePoint>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..c.threads())
            .map(|t| {
                let (open, svc, map) = (&open, svc.clone(), map.clone());
                s.spawn(move || -> Result<TablePoint> {
                    let ctx = ThreadCtx::new(open(100 + t as u32)?, c.rpc.runtime.clone())
                        .map_err(anyhow::Error::msg)?;
                    let local = match place {
                        Placement::Local => Some(svc),
                        Placement::Remote => {
                            ctx.connect_rpc(addr).map_err(anyhow::Error::msg)?;
                            None
                        }
                    };
                    let cfg = TableClientConfig::default().with_batch(batch);
                    let tc = Rc::new(TableClient::new(map, local, cfg));
                    let hist = Rc::new(RefCell::new(new_hist()));
                    let (pairs, aborts) = (Rc::new(Cell::new(0u64)), Rc::new(Cell::new(0u64)));
                    let failed = Rc::new(RefCell::new(None::<String>));
                    let mut ex = Executor::new(ctx.clone());
                    for co in 0..c.coroutines() {
                        let (ctx, tc, hist, pairs, aborts, failed) = (
                            ctx.clone(),
                            tc.clone(),
                            hist.clone(),
                            pairs.clone(),
                            aborts.clone(),
                            failed.clone(),
                        );
                        let mut rng = rand::rngs::StdRng::seed_from_u64(
                            c.seed_arg.seed ^ ((t as u64) << 32 | co as u64),
                        );
                        ex.spawn(async move {
                            let mut txn = (t as u64) << 40 | (co as u64) << 24;
                            let mut ks: Vec<u64> = Vec::new();
                            while Instant::now() < end && failed.borrow().is_none() {
                                txn += 1;
                                ks.clear();
                                while ks.len() < reads + writes {
                                    let k = rng.random_range(0..keys);
                                    if !ks.contains(&k) {
                                        ks.push(k);
                                    }
                                }
                                let ops: Vec<TableOp> = ks
                                    .iter()
                                    .enumerate()
                                    .filter(|&(i, _)| iso == Iso::Sr || i >= reads)
                                    .map(|(i, &k)| TableOp {
                                        key: LockKey::compose(0, k, k >> 12)
                                            .expect("keys below 2^56"),
                                        txn,
                                        node: 100 + t as u32,
                                        kind: OpKind::Lock(if i < reads {
                                            LockMode::Read
                                        } else {
                                            LockMode::Write
                                        }),
                                    })
                                    .collect();
                                let start = Instant::now();
                                let r = match tc.execute(&ctx, &ops).await {
                                    Ok(r) => r,
                                    Err(e) => {
                                        *failed.borrow_mut() = Some(format!("{e:#}"));
                                        break;
                                    }
                                };
                                let measured = start >= warm;
                                if measured {
                                    let _ = hist
                                        .borrow_mut()
                                        .record((start.elapsed().as_nanos() as u64).max(1));
                                }
                                let held: Vec<TableOp> = ops
                                    .iter()
                                    .zip(&r)
                                    .filter(|(_, o)| **o == OpOutcome::Granted)
                                    .map(|(o, _)| TableOp {
                                        kind: OpKind::Unlock,
                                        ..*o
                                    })
                                    .collect();
                                if held.len() < ops.len() && measured {
                                    aborts.set(aborts.get() + 1);
                                }
                                if held.is_empty() {
                                    continue;
                                }
                                if let Err(e) = tc.execute(&ctx, &held).await {
                                    *failed.borrow_mut() = Some(format!("{e:#}"));
                                    break;
                                }
                                if measured && Instant::now() <= end {
                                    pairs.set(pairs.get() + held.len() as u64);
                                }
                            }
                        });
                    }
                    ex.run();
                    if let Some(e) = failed.borrow_mut().take() {
                        bail!("lock-table client failed: {e}");
                    }
                    let hist = hist.borrow().clone();
                    Ok(TablePoint {
                        hist,
                        pairs: pairs.get(),
                        aborts: aborts.get(),
                        secs: c.secs(),
                    })
                })
            })
            .collect();
        bench::join_clients(hs)
    });
    drop(node);
    drop(cluster);
    let mut all = TablePoint {
        hist: new_hist(),
        pairs: 0,
        aborts: 0,
        secs: c.secs(),
    };
    for r in results {
        let p = r?;
        all.hist.add(&p.hist).expect("same bounds");
        all.pairs += p.pairs;
        all.aborts += p.aborts;
    }
    if svc.table().slots_in_use() != 0 {
        bail!(
            "{} lock-table slots still held after the run",
            svc.table().slots_in_use()
        );
    }
    Ok(all)
}

/// Scythe Table 2: the Takeout queues of the clients over `locks` objects per theta.
fn queues(
    c: &Common,
    sides: &Sides,
    locks: u64,
    thetas: &[f64],
    samples_per_s: u64,
) -> Result<serde_json::Value> {
    if locks < 4 || samples_per_s == 0 {
        bail!("--locks must be at least 4 and --samples-per-s at least 1");
    }
    println!(
        "\n== queues (Scythe Table 2): {} clients over {locks} objects, Takeout ({:?} mode), hold {} us; queue = lower - upper sampled {samples_per_s}/s; access rate = share of tickets",
        c.threads() * c.coroutines(),
        c.takeout_mode,
        c.hold_us
    );
    println!(
        "{:>6} {:>8} {:>16} {:>16} {:>13} {:>9} {:>9} {:>9} {:>8}",
        "theta",
        "samples",
        "longest(obj:q)",
        "second(obj:q)",
        "others mean",
        "top1 %",
        "top2 %",
        "top3 %",
        "maxq"
    );
    let v = Variant {
        kind: Kind::Takeout,
        cas_cap_us: 0,
        hot_watermark: None,
    };
    let mut rows = Vec::new();
    for &theta in thetas {
        let mut probe = QueueProbe {
            every: Duration::from_nanos(1_000_000_000 / samples_per_s),
            sums: vec![0; locks as usize],
            maxes: vec![0; locks as usize],
            samples: 0,
            tickets: Vec::new(),
        };
        let p = measure_probed(c, sides, v, locks, theta, Some(&mut probe))?;
        let n = probe.samples.max(1) as f64;
        let mean = |i: usize| probe.sums[i] as f64 / n;
        // Objects by mean queue length, longest first.
        let mut by_q: Vec<usize> = (0..locks as usize).collect();
        by_q.sort_by(|&a, &b| mean(b).total_cmp(&mean(a)).then(a.cmp(&b)));
        let (first, second) = (by_q[0], by_q[1]);
        // The others: every other object that took at least one ticket.
        let others: Vec<usize> = by_q[2..]
            .iter()
            .copied()
            .filter(|&i| probe.tickets[i] > 0)
            .collect();
        let others_mean = others.iter().map(|&i| mean(i)).sum::<f64>() / others.len().max(1) as f64;
        let total: u64 = probe.tickets.iter().sum();
        let mut by_access: Vec<usize> = (0..locks as usize).collect();
        by_access.sort_by(|&a, &b| probe.tickets[b].cmp(&probe.tickets[a]).then(a.cmp(&b)));
        let rate = |i: usize| 100.0 * probe.tickets[i] as f64 / total.max(1) as f64;
        let top: Vec<(usize, f64)> = by_access[..3].iter().map(|&i| (i, rate(i))).collect();
        let maxq = probe.maxes.iter().copied().max().unwrap_or(0);
        println!(
            "{:>6} {:>8} {:>16} {:>16} {:>13.3} {:>9.2} {:>9.2} {:>9.2} {:>8}",
            theta,
            probe.samples,
            format!("{first}:{:.2}", mean(first)),
            format!("{second}:{:.2}", mean(second)),
            others_mean,
            top[0].1,
            top[1].1,
            top[2].1,
            maxq
        );
        rows.push(jsonl::point_with("queues", json!({
            "theta": theta, "samples": probe.samples,
            "longest": {"object": first, "mean_queue": mean(first), "max_queue": probe.maxes[first], "access_pct": rate(first)},
            "second": {"object": second, "mean_queue": mean(second), "max_queue": probe.maxes[second], "access_pct": rate(second)},
            "others_mean_queue": others_mean, "others_objects": others.len(),
            "top_access": top.iter().map(|&(i, r)| json!({"object": i, "access_pct": r, "mean_queue": mean(i)})).collect::<Vec<_>>(),
            "max_queue": maxq, "acquisitions_per_s": p.acquisitions as f64 / p.secs,
            "refusals": p.refusals,
        }), Some(&p.hist)));
    }
    Ok(json!({ "locks": locks, "rows": rows }))
}
