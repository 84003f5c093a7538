//! `tso-bench`: timestamp throughput and latency of the TSO designs side by side in one
//! invocation (Scythe, 4.5 and 5.4 Fig. 28), on the shm fabric
//! under a timing model (`--model cx5` by default; on instant shared memory an FAA is a
//! cache line, not a network round trip).
//!
//! Modes, each one timestamp per request:
//!
//! - `faa`: every request is one one-sided FAA of 1 on the oracle's counter (Scythe's
//!   RDMA-friendly TSO without groups);
//! - `group`: concurrent requests of a thread's coroutines are combined, one FAA of `n`
//!   per group (Scythe 4.5 (2); `tso::ThreadTso`); mean-group-size is timestamps per FAA;
//! - `proxy`: groups whose range request is an RPC to a TSO proxy, which merges the
//!   groups of all client threads into one FAA on the oracle (`tso::Proxy`, Scythe 4.5
//!   (3)); the proxy is a node of the local cluster with one server thread;
//! - `rpc-oracle`: an rrpc call to a handler whose CPU does `fetch_add(1)` on a local
//!   counter (the TiDB PD design: the oracle's CPU serves every request).
//!
//! The oracle node and the client threads run in this process as nodes of a local
//! cluster; clients are coroutines spread over `--threads` threads. With `--serve` and
//! `--connect ADDR` (`bench::remote`) the oracle runs in one process (on one host) and
//! the clients, and the proxy, in another, over `--fabric verbs` across hosts. The counter is in
//! (the shm fabric's stand-in for) device memory, or with `--counter host` in host
//! memory, where the timing model holds its address at the oracle's NIC for a PCIe read
//! and write back per atomic, shared by all clients.

use bench::plot::{LineChart, Scale, Series};
use rrpc::NodeId;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use serde_json::json;

use bench::remote::{self, FabricSpec, PointEnv, SideArgs, Sides, Started};
use bench::{cli, jsonl};
use rrpc::fabric::Fabric;
use rrpc::node::{Node, NodeConfig};
use rrpc::runtime::{Executor, ThreadCtx};
use rrpc::server::Handlers;
use rrpc::typed::zerocopy::little_endian::U64;
use rrpc::typed::{Fixed, Rpc};
use tso::{
    GroupStats, GroupedTso, Oracle, Proxy, ProxyConfig, SourceConfig, ThreadTso, Timestamp,
    TsoClient, TsoSources, EXPORT_NAME,
};

/// Handler id of the RPC oracle.
const RPC_ORACLE_HANDLER: u16 = 40;
const _: () = assert!(rrpc::server::ids::BENCH_TXN.contains(RPC_ORACLE_HANDLER));

/// The RPC oracle's one procedure ([`RPC_ORACLE_HANDLER`]): an empty request, the next
/// timestamp's raw value as the reply (one little-endian u64, 8 bytes).
struct OracleRpc;

impl Rpc for OracleRpc {
    const ID: u16 = RPC_ORACLE_HANDLER;
    type Req = ();
    type Resp = U64;
    type Codec = Fixed;
}

/// Node id of the oracle.
const ORACLE_NODE: u32 = 1;
/// Node id of the proxy (proxy mode).
const PROXY_NODE: u32 = 2;

#[derive(Parser, Debug)]
#[command(
    name = "tso-bench",
    about = "Timestamp oracle designs side by side: per-request FAA, TSO groups, groups through a TSO proxy, an RPC oracle",
    long_about = "Timestamp throughput and latency (Scythe 4.5, Fig. 28). Runs per-request FAA on \
                  the oracle's counter, TSO groups (one FAA per group of concurrent requests), \
                  TSO groups whose range request goes to a TSO proxy that merges them into \
                  one FAA, and an RPC oracle whose CPU increments a counter (TiDB PD) side by \
                  side on a local shm cluster under a timing model, for each client count; \
                  prints a table and the group/faa and proxy/faa throughput ratios at the \
                  largest client count, with --json writes JSON Lines (a metadata record, one \
                  record per point, the summary) and with --chart draws throughput against \
                  clients, one line per mode. \
                  mean-group-size is timestamps per FAA on the oracle (1 for faa and \
                  rpc-oracle). With --serve (the oracle's host) and --connect ADDR (the \
                  clients' host) the two sides run in separate processes, on two hosts with \
                  --fabric verbs."
)]
struct Args {
    #[command(flatten)]
    fabric: cli::FabricArgs,
    #[command(flatten)]
    config: cli::ConfigArg,
    #[command(flatten)]
    run: cli::RunLength,
    #[command(flatten)]
    seed: cli::SeedArg,
    #[command(flatten)]
    out: cli::OutputArgs,
    /// Client counts to run (clients = coroutines spread over --threads threads).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32,64")]
    clients: Vec<usize>,
    /// Client threads (each its own node and runtime).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Where the oracle's counter lives: `device` (the NIC's memory, `alloc_dm`; the
    /// oracle's default) or `host` (host memory: every atomic on it needs the oracle
    /// NIC's PCIe read and write back, which the timing model charges per address).
    #[arg(long, value_enum, default_value = "device")]
    counter: Counter,
    /// Group mode: FAAs a thread's TSO group lets be in flight at once (1 is Scythe's one
    /// group at a time: larger groups, but two coroutines of a thread wait for each
    /// other; default tso::THREAD_RANGES_IN_FLIGHT).
    #[arg(long, default_value_t = tso::THREAD_RANGES_IN_FLIGHT)]
    ranges_in_flight: usize,
    /// Modes to compare.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "faa,group,proxy,rpc-oracle"
    )]
    modes: Vec<Mode>,
    #[command(flatten)]
    side: SideArgs,
    /// The rrpc settings of the clients' runtime contexts, the oracle's server and the
    /// proxy's: `--config`'s `[runtime]` and `[server]` over the defaults (set by `run`;
    /// not a flag).
    #[arg(skip)]
    rpc: rrpc::node::RpcSettings,
}

/// Where the oracle's counter lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Counter {
    /// Device memory (`Oracle::new`; the shm fabric's stand-in, charged by the timing
    /// model at device-memory rates).
    Device,
    /// Host memory (`Oracle::in_host_memory`).
    Host,
}

/// A TSO design under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// One one-sided FAA of 1 per request.
    Faa,
    /// TSO groups: one FAA of n per group of concurrent requests of the process.
    Group,
    /// TSO groups whose range request is an RPC to a TSO proxy, which merges them into
    /// one FAA on the oracle.
    Proxy,
    /// An RPC to the oracle's CPU, which increments a local counter (TiDB PD).
    RpcOracle,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Faa => "faa",
            Mode::Group => "group",
            Mode::Proxy => "proxy",
            Mode::RpcOracle => "rpc-oracle",
        }
    }
}

/// What one point measured.
struct Point {
    hist: Histogram<u64>,
    requests: u64,
    secs: f64,
    /// Mean timestamps per FAA on the oracle (group and proxy modes), 1 otherwise.
    mean_group: f64,
}

impl Point {
    fn us(&self, q: f64) -> f64 {
        self.hist.value_at_quantile(q) as f64 / 1e3
    }
    fn rate(&self) -> f64 {
        self.requests as f64 / self.secs
    }
}

/// tso-bench's defaults for the shared flags: 1 s per point after 200 ms of warm-up.
const DEFAULTS: &[(&str, &str)] = &[("duration", "1s"), ("warmup", "200ms")];

fn main() {
    bench::bench_main::<Args>("tso-bench", DEFAULTS, run);
}

fn run(mut a: Args) -> Result<()> {
    a.rpc = cli::as_usage(a.config.rpc_settings())?;
    if a.threads == 0
        || a.run.duration().is_zero()
        || a.clients.contains(&0)
        || a.modes.is_empty()
        || a.ranges_in_flight == 0
    {
        return Err(cli::usage("--threads, --duration, every --clients value, --modes and --ranges-in-flight must be non-zero"));
    }
    let kind = a.fabric.fabric;
    let model_arg = a.fabric.model()?;
    let model = cli::as_usage(rrpc::fabric::model::TimingModel::load(&model_arg))?;
    let model_desc = model
        .as_ref()
        .map_or_else(|| "none".into(), |m| m.describe());
    let spec = FabricSpec::new(kind, Some(model_arg.clone()), &a.side);
    let side = a.side.side();
    if let remote::Side::Serve { .. } = side {
        let banner = [format!(
            "tso-bench | fabric: {kind} | timing model: {model_desc} | serving the oracle (counter, RPC oracle) for --connect clients"
        )];
        let server = a.rpc.server.clone();
        let start = move |p: &serde_json::Value, env: &PointEnv<'_>| start_oracle(p, env, &server);
        return remote::serve("tso-bench", &spec, side, &banner, &start);
    }
    let sides = Sides::new("tso-bench", spec, side)?;
    jsonl::open(
        a.out.json.as_deref(),
        &jsonl::RunInfo {
            binary: "tso-bench",
            fabric: kind,
            rdma_device: a.side.rdma_device.as_deref(),
            model: &model_arg,
            seed: a.seed.seed,
        },
    )?;
    println!(
        "tso-bench | fabric: {kind}{} | timing model: {} | counter: {} memory | {} client thread(s) | one timestamp per request | {} ms per point ({} ms warm-up) | group: up to {} FAAs in flight per thread | proxy: 1 server thread, 1 QP on the oracle",
        sides
            .server()
            .map_or_else(String::new, |s| format!(" | oracle at --connect {s}, clients and proxy here")),
        model_desc,
        match a.counter {
            Counter::Device => "device",
            Counter::Host => "host",
        },
        a.threads,
        a.run.duration().as_millis(),
        a.run.warmup().as_millis(),
        a.ranges_in_flight
    );
    println!(
        "{:>10} {:>7} {:>12} {:>9} {:>9} {:>15}",
        "mode", "clients", "req/s", "p50(us)", "p99(us)", "mean-group-size"
    );
    let mut rows = Vec::new();
    let mut rate: BTreeMap<(&'static str, usize), f64> = BTreeMap::new();
    for &clients in &a.clients {
        for &mode in &a.modes {
            let p = measure(&a, &sides, mode, clients)
                .with_context(|| format!("{} with {clients} clients", mode.name()))?;
            println!(
                "{:>10} {:>7} {:>12.0} {:>9.2} {:>9.2} {:>15.2}",
                mode.name(),
                clients,
                p.rate(),
                p.us(0.5),
                p.us(0.99),
                p.mean_group
            );
            rate.insert((mode.name(), clients), p.rate());
            rows.push(jsonl::point_with(
                "clients",
                json!({
                    "mode": mode.name(), "clients": clients, "req_per_s": p.rate(),
                    "p50_us": p.us(0.5), "p99_us": p.us(0.99), "mean_us": p.hist.mean() / 1e3,
                    "mean_group_size": p.mean_group, "requests": p.requests,
                }),
                Some(&p.hist),
            ));
        }
    }
    let top = *a.clients.iter().max().expect("non-empty");
    let ratio = |m: &'static str| match (rate.get(&(m, top)), rate.get(&("faa", top))) {
        (Some(g), Some(f)) if *f > 0.0 => Some(g / f),
        _ => None,
    };
    let (group_ratio, proxy_ratio) = (ratio("group"), ratio("proxy"));
    {
        let doc = json!({
            "timing_model": model.as_ref().map(|m| m.describe()),
            "model_arg": model_arg, "fabric": kind.to_string(), "counter": format!("{:?}", a.counter).to_lowercase(), "ranges_in_flight": a.ranges_in_flight,
            "threads": a.threads, "duration_ms": a.run.duration().as_millis() as u64,
            "warmup_ms": a.run.warmup().as_millis() as u64, "rows": rows,
            "ratio_group_faa_at_max_clients": group_ratio,
            "ratio_proxy_faa_at_max_clients": proxy_ratio, "max_clients": top,
        });
        jsonl::summary(&doc);
        if let Some(p) = &a.out.json {
            println!("wrote {}", p.display());
        }
    }
    if let Some(path) = &a.out.chart {
        let series: Vec<Series> = a
            .modes
            .iter()
            .map(|m| Series {
                name: m.name().to_string(),
                points: a
                    .clients
                    .iter()
                    .filter_map(|&c| rate.get(&(m.name(), c)).map(|&r| (c as f64, r)))
                    .collect(),
                labels: Vec::new(),
            })
            .collect();
        let title = format!(
            "timestamps per second (timing model: {}, counter in {} memory)",
            model.as_ref().map_or("none", |m| m.params().name.as_str()),
            format!("{:?}", a.counter).to_lowercase()
        );
        LineChart {
            title: &title,
            x_label: "clients",
            y_label: "timestamps/s",
            x_scale: Scale::Log2,
            y_scale: Scale::Log10,
            series: &series,
        }
        .draw(path)?;
        println!("plot: {}", path.display());
    }
    for (m, r) in [("proxy", proxy_ratio), ("group", group_ratio)] {
        match r {
            Some(r) => println!("ratio {m}/faa @{top} = {r:.2}"),
            None => println!("ratio {m}/faa @{top} = n/a (run both faa and {m})"),
        }
    }
    Ok(())
}

/// The server side of a point: what the oracle node offers.
#[derive(serde::Serialize, serde::Deserialize)]
struct OracleParams {
    /// Where the counter lives.
    counter: Counter,
    /// Serve the RPC oracle's handler (rpc-oracle mode).
    rpc: bool,
}

/// Start an oracle node (counter export, and with `rpc` the RPC oracle's handler): the
/// server side of a point, here or on the `--serve` process, with `server`'s settings.
fn start_oracle(
    params: &serde_json::Value,
    env: &PointEnv<'_>,
    server: &rrpc::server::ServerConfig,
) -> Result<Started> {
    let p: OracleParams =
        serde_json::from_value(params.clone()).context("the oracle's parameters")?;
    let f = env.open(NodeId(ORACLE_NODE))?;
    let oracle = match p.counter {
        Counter::Device => Oracle::new(&f)?,
        Counter::Host => Oracle::in_host_memory(&f)?,
    };
    let mut exports = BTreeMap::new();
    exports.insert(EXPORT_NAME.to_string(), oracle.export());
    // The RPC oracle's counter: a CPU-local word, never touched by RDMA.
    let cpu_counter = Arc::new(AtomicU64::new(0));
    let rpc = p.rpc.then(|| {
        let mut h = Handlers::new();
        let c = cpu_counter.clone();
        h.register_typed::<OracleRpc>(move |()| {
            Ok(U64::new(c.fetch_add(1, Ordering::Relaxed) + 1))
        });
        (h, 1)
    });
    let node = Node::start_with(
        f,
        NodeConfig::new("tso", env.listen())
            .with_exports(exports)
            .with_rpc(rpc),
        server.clone(),
    )?;
    Ok(Started {
        addr: node.addr(),
        info: serde_json::Value::Null,
        // The node first, then the counter's memory.
        keep: Box::new((node, oracle)),
    })
}

/// Start the oracle ([`start_oracle`], here or on the `--serve` process), run `clients`
/// coroutines over the client threads for warm-up + duration, collect.
fn measure(a: &Args, sides: &Sides, mode: Mode, clients: usize) -> Result<Point> {
    let params = json!({ "counter": a.counter, "rpc": mode == Mode::RpcOracle });
    let start = |p: &serde_json::Value, env: &PointEnv<'_>| start_oracle(p, env, &a.rpc.server);
    let point = sides.point(&params, &start)?;
    let open = |id: u32| -> Result<Fabric> { sides.spec().open(&point.cluster, NodeId(id)) };
    let addr = point.addr;
    let threads = a.threads.min(clients);
    // Proxy mode: a proxy node of this cluster, one server thread, one QP on the oracle.
    let proxy = (mode == Mode::Proxy)
        .then(|| {
            Proxy::start_tuned(
                open(PROXY_NODE)?,
                "127.0.0.1:0".parse()?,
                addr,
                &ProxyConfig::default(),
                &a.rpc,
            )
            .context("starting the proxy")
        })
        .transpose()?;
    let sources = match &proxy {
        Some(p) => Some(Arc::new(TsoSources::discover(
            None,
            &[p.addr()],
            &SourceConfig::default(),
        )?)),
        None => None,
    };
    // Proxy mode: the process's one TSO group, whose range request goes to the proxy.
    let grouped = sources
        .as_ref()
        .map(|s| Arc::new(GroupedTso::with_sources(s.clone())));
    // The window opens when every client thread is connected and has its clock: a
    // connection (or the clock's calibration) slower than the warm-up on a loaded machine
    // or a VM would otherwise eat into the measured time, or all of it.
    let ready = std::sync::Barrier::new(threads);
    let results: Vec<Result<(Histogram<u64>, u64, GroupStats)>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let coros = clients / threads + usize::from(t < clients % threads);
                let (open, grouped, sources, ready) =
                    (&open, grouped.clone(), sources.clone(), &ready);
                s.spawn(move || -> Result<(Histogram<u64>, u64, GroupStats)> {
                    let connected = (|| -> Result<_> {
                        let ctx = ThreadCtx::new(open(100 + t as u32)?, a.rpc.runtime.clone())
                            .map_err(anyhow::Error::msg)?;
                        let info = if mode == Mode::RpcOracle {
                            ctx.connect_rpc(addr)
                        } else {
                            ctx.connect(addr)
                        }
                        .map_err(anyhow::Error::msg)?;
                        if let Some(s) = &sources {
                            s.connect_thread(&ctx)?;
                        }
                        let tc = TsoClient::from_info(&info)?;
                        Ok((ctx, tc, quanta::Clock::new()))
                    })();
                    // Every thread passes the barrier, connected or not, so that none
                    // waits for a thread that failed.
                    ready.wait();
                    let (ctx, tc, clock) = connected?;
                    let t0 = Instant::now();
                    let window = (t0 + a.run.warmup(), t0 + a.run.warmup() + a.run.duration());
                    let local = ThreadTso::with_ranges_in_flight(tc.clone(), a.ranges_in_flight);
                    client_thread(&ctx, mode, tc, local, grouped, coros, clock, window)
                })
            })
            .collect();
        bench::join_clients(hs)
    });
    // Proxy mode: timestamps per FAA on the oracle (the proxy merges the client groups).
    let proxy_mean = proxy.as_ref().map(|p| p.stats().group.mean_group_size());
    drop(grouped);
    drop(proxy);
    drop(point);
    let mut p = Point {
        hist: new_hist(),
        requests: 0,
        secs: a.run.secs(),
        mean_group: proxy_mean.unwrap_or(1.0),
    };
    let mut st = GroupStats::default();
    for r in results {
        let (h, n, s) = r?;
        p.hist.add(&h).expect("same bounds");
        p.requests += n;
        st.groups += s.groups;
        st.members += s.members;
    }
    if mode == Mode::Group {
        p.mean_group = st.mean_group_size();
    }
    Ok(p)
}

fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds")
}

/// One client thread: `coros` coroutines taking one timestamp per request until the end
/// of `window`, recording latencies and counting requests inside it. Each coroutine
/// checks that its timestamps strictly increase. Returns the histogram, the requests in
/// the window and the thread's group counters (group mode).
///
/// `clock` is read twice per request: the raw TSC, scaled only for the differences (the
/// vDSO's clock_gettime cost a seventh of a group-mode run's cycles in a VM, and quanta's
/// calibrated `Instant::now` still a tenth). Its calibration takes a while, so the
/// caller makes it before the window opens.
#[allow(clippy::too_many_arguments)]
fn client_thread(
    ctx: &Rc<ThreadCtx>,
    mode: Mode,
    tc: TsoClient,
    local: ThreadTso,
    grouped: Option<Arc<GroupedTso>>,
    coros: usize,
    clock: quanta::Clock,
    (warm, end): (Instant, Instant),
) -> Result<(Histogram<u64>, u64, GroupStats)> {
    // This thread's TSO group (its coroutines combine without atomics).
    let local = Rc::new(local);
    let tc = Rc::new(tc);
    let r0 = clock.raw();
    let (warm, end) = {
        let s = Instant::now();
        (
            warm.saturating_duration_since(s).as_nanos() as u64,
            end.saturating_duration_since(s).as_nanos() as u64,
        )
    };
    let hist = Rc::new(RefCell::new(new_hist()));
    let count = Rc::new(RefCell::new(0u64));
    let failure: Rc<RefCell<Option<anyhow::Error>>> = Rc::new(RefCell::new(None));
    let mut ex = Executor::new(ctx.clone());
    for _ in 0..coros {
        let (ctx, tc, local, grouped) = (ctx.clone(), tc.clone(), local.clone(), grouped.clone());
        let (hist, count, failure) = (hist.clone(), count.clone(), failure.clone());
        let clock = clock.clone();
        ex.spawn(async move {
            let mut last = Timestamp::ZERO;
            loop {
                let raw_start = clock.raw();
                let start = clock.delta_as_nanos(r0, raw_start);
                if start >= end || failure.borrow().is_some() {
                    break;
                }
                let r: Result<Timestamp> = match mode {
                    Mode::Faa => tc.timestamp(&ctx).await.map_err(Into::into),
                    Mode::Group => local.timestamp(&ctx).await.map_err(Into::into),
                    Mode::Proxy => match &grouped {
                        Some(g) => g.timestamp(&ctx).await.map_err(Into::into),
                        None => Err(anyhow::anyhow!("proxy mode without a proxy group")),
                    },
                    Mode::RpcOracle => ctx
                        .call_typed::<OracleRpc>(NodeId(ORACLE_NODE), &())
                        .await
                        .map(|t| Timestamp(t.get()))
                        .map_err(Into::into),
                };
                let raw_done = clock.raw();
                let done = start + clock.delta_as_nanos(raw_start, raw_done);
                let t = match r {
                    Ok(t) => t,
                    Err(e) => {
                        *failure.borrow_mut() = Some(e);
                        break;
                    }
                };
                if t <= last {
                    *failure.borrow_mut() = Some(anyhow::anyhow!(
                        "timestamp {t} after {last}: not increasing"
                    ));
                    break;
                }
                last = t;
                if start >= warm && done <= end {
                    let _ = hist.borrow_mut().record((done - start).max(1));
                    *count.borrow_mut() += 1;
                }
            }
        });
    }
    ex.run();
    if let Some(e) = failure.borrow_mut().take() {
        return Err(e);
    }
    let h = hist.borrow().clone();
    let n = *count.borrow();
    Ok((h, n, local.stats()))
}
