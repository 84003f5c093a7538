//! `rrpc-bench`: microbenchmarks of rrpc (Scythe, 3.4 and 4.6):
//! batching modes (Fig. 9), communication modes (Fig. 10), round-trip latency, and rrpc
//! against peer libraries (iceoryx2, tonic) and the cache-line ping-pong floor.
//!
//! Every experiment runs its variants side by side in one invocation (the machine is
//! shared and absolute numbers drift), prints a table, and with `--json` / `--chart` writes
//! JSON and a chart. Server and client run in this process as two nodes of a local shm
//! (or verbs) cluster, the server thread pinned to `--server-core`, the client thread(s)
//! from `--client-core` on; or, with `--serve` and `--connect ADDR` (`bench::remote`),
//! in two processes, on two hosts with `--fabric verbs`. `peers --perftest` puts
//! perftest's `ib_write_lat` between the same two devices beside rrpc.

use rrpc::NodeId;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use hdrhistogram::Histogram;
use serde_json::json;

use bench::peers::{self, PeerConfig, RttSamples};
use bench::perftest;
use bench::plot::{LineChart, Scale, Series};
use bench::remote::{self, FabricSpec, Point as ServerPoint, PointEnv, SideArgs, Sides, Started};
use bench::{cli, jsonl};
use rrpc::fabric::model::TimingModel;
use rrpc::fabric::shm::ClusterGuard;
use rrpc::fabric::{Fabric, FabricKind};
use rrpc::node::{Node, NodeConfig};
use rrpc::rocket::RocketConfig;
use rrpc::runtime::{CallOpts, Executor, ReplyMode, RuntimeConfig, Stats, ThreadCtx};
use rrpc::server::{Handlers, ServerConfig};
use rrpc::wire::Batching;

/// Handler: reply with `u32 LE` bytes (the request's first 4 bytes); the request may be
/// longer (its size is the request payload under test). In the benchmarks' reserved range
/// (`rrpc::server::ids`), clear of the lock service's ids.
const GEN: u16 = 41;
const _: () = assert!(rrpc::server::ids::BENCH_TXN.contains(GEN));

#[derive(Parser, Debug)]
#[command(
    name = "rrpc-bench",
    about = "rrpc microbenchmarks: batching modes, communication modes, latency, peers",
    long_about = "rrpc microbenchmarks (Scythe 3.4 and 4.6). Each subcommand runs its variants side \
                  by side in one invocation and prints a table; --json writes JSON Lines (a \
                  metadata record, one record per point, the summary), --chart draws an SVG or \
                  PNG chart (with `all`, --chart names a directory: one chart each). Server and client are two nodes of a local cluster in \
                  this process, pinned to --server-core and --client-core; with --serve on one \
                  host and --connect ADDR on another (--fabric verbs), two processes."
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
    /// `--chart`: with `all`, a directory (one chart each).
    #[command(flatten)]
    out: cli::OutputArgs,
    /// Core the server thread is pinned to.
    #[arg(long, global = true, default_value_t = 1)]
    server_core: usize,
    /// Core the (first) client thread is pinned to.
    #[arg(long, global = true, default_value_t = 0)]
    client_core: usize,
    /// Coroutines per client thread for throughput points.
    #[arg(long, global = true, default_value_t = 32)]
    coroutines: usize,
    #[command(flatten)]
    side: SideArgs,
    /// The rrpc settings of the clients' runtime contexts and the server: `--config`'s
    /// `[runtime]` and `[server]` over the defaults (set by `run`; not a flag).
    #[arg(skip)]
    rpc: rrpc::node::RpcSettings,
}

impl Common {
    fn duration_ms(&self) -> u64 {
        self.run.duration().as_millis() as u64
    }
    fn warmup_ms(&self) -> u64 {
        self.run.warmup().as_millis() as u64
    }
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Fig. 9: RPC throughput of none / doorbell / msg / combined batching, messages 8 B to 8 KiB.
    Batching {
        /// Message (request payload) sizes, bytes.
        #[arg(long, value_delimiter = ',', default_values_t = [8usize, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192])]
        sizes: Vec<usize>,
        /// Messages of the point's size one bucket holds: each point's Rocket is sized at
        /// connection time for it (512 B, Scythe's default, grown to hold this many;
        /// `rrpc::rocket::RocketConfig::for_messages`), within the server's ring limit.
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=1024))]
        per_bucket: u64,
        /// Slices each point's --duration is cut into: the four modes run in turn, one
        /// slice each per round (the order rotating), so a stall of the shared machine
        /// lands on one round rather than on one mode; rates are the median slice's and
        /// the ratios the median of the rounds' ratios.
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1000))]
        slices: u64,
    },
    /// Fig. 10: throughput and latency of pure RPC, RPC + READ and zero-copy, payloads 64 B to 1 MiB.
    Modes {
        /// Reply payload sizes, bytes.
        #[arg(long, value_delimiter = ',', default_values_t = [64usize, 128, 256, 512, 1024, 2048, 4096, 16384, 65536, 262144, 1048576])]
        sizes: Vec<usize>,
        /// Coroutines for the mode points (large payloads need few).
        #[arg(long, default_value_t = 8)]
        mode_coroutines: usize,
    },
    /// Round trip p50/p99 for 32 B requests and 32 B / 4 KiB / 64 KiB replies with 1 and 2
    /// client threads, 1 caller among 63 idle coroutines against 1 alone, and small-RPC
    /// throughput per core.
    Latency,
    /// Only the small-RPC throughput line of `latency`: 32 B calls from one client thread
    /// with --coroutines coroutines to one server thread, calls/s per busy core.
    Throughput,
    /// rrpc against iceoryx2 request-response, tonic gRPC (loopback TCP) and the cache-line
    /// ping-pong floor: 32 B request and reply, two pinned busy-polling endpoints.
    Peers {
        /// Then run this many matched rounds (the floor, fabric, rrpc, iceoryx2 and the
        /// floor again, back to back, one --duration point each) and print each round's
        /// ratios and their medians per machine speed (rounds grouped by their floor; a
        /// round whose two floors differ by more than 2x is left out). Use it where the
        /// machine's speed drifts: one point per peer may pair a floor and an rrpc point
        /// taken at different speeds. With --perftest, rounds against ib_write_lat
        /// instead (see --perftest). 0: no rounds.
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1000))]
        rounds: u32,
        /// Also run perftest's `ib_write_lat` (Debian package perftest) between the same
        /// two devices, 32 B, ten iterations per millisecond of --duration (at least
        /// 1000), and print `ratio rtt rrpc/ib_write_lat`: rrpc's p50 round trip over
        /// twice ib_write_lat's t_typical (perftest reports half a round trip). With
        /// --rounds N (also across hosts, with --connect): N rounds of ib_write_lat, rrpc
        /// and ib_write_lat again, the ratio the median of the rounds' (each against the
        /// mean of its two perftest runs), in place of the floor rounds. Needs
        /// --fabric verbs and ib_write_lat on PATH on both sides; otherwise says why it
        /// is skipped.
        #[arg(long)]
        perftest: bool,
    },
    /// All of the above.
    All,
}

/// rrpc-bench's defaults for the shared flags: 1 s per point after 200 ms of warm-up.
const DEFAULTS: &[(&str, &str)] = &[("duration", "1s"), ("warmup", "200ms")];

fn main() {
    bench::bench_main::<Args>("rrpc-bench", DEFAULTS, run);
}

fn run(mut args: Args) -> Result<()> {
    args.common.rpc = cli::as_usage(args.common.config.rpc_settings())?;
    let c = &args.common;
    let cores = core_affinity::get_core_ids().map_or(0, |v| v.len());
    if c.server_core >= cores.max(1) || c.client_core >= cores.max(1) {
        return Err(cli::usage(format!(
            "--server-core {} / --client-core {} but this machine has {cores} cores",
            c.server_core, c.client_core
        )));
    }
    c.run.check()?;
    let kind = c.fabric.fabric;
    let model_arg = c.fabric.model()?;
    let model = cli::as_usage(rrpc::fabric::model::TimingModel::load(&model_arg))?;
    let spec = FabricSpec::new(kind, Some(model_arg.clone()), &c.side);
    let side = c.side.side();
    if let remote::Side::Serve { .. } = side {
        let banner = [format!(
            "rrpc-bench | fabric: {kind} | timing model: {} | server core {} | serving rrpc-bench servers for --connect clients",
            model.as_ref().map_or_else(|| "none".to_string(), |m| m.describe()),
            c.server_core
        )];
        let server = c.rpc.server.clone().with_cores(vec![c.server_core]);
        let start = move |p: &serde_json::Value, env: &PointEnv<'_>| start_server(p, env, &server);
        return remote::serve("rrpc-bench", &spec, side, &banner, &start);
    }
    let Some(cmd) = &args.cmd else {
        return Err(cli::usage("a subcommand is needed (batching, modes, latency, throughput, peers, all), or --serve; see --help"));
    };
    if let (Cmd::Peers { rounds, perftest }, remote::Side::Connect(_)) = (cmd, side) {
        if *rounds > 0 && !*perftest {
            return Err(cli::usage("--rounds without --perftest compares peers that run within one host (floor, iceoryx2): run it without --connect, or add --perftest for rounds against ib_write_lat"));
        }
    }
    let sides = Sides::new("rrpc-bench", spec, side)?;
    let sides = &sides;
    jsonl::open(
        c.out.json.as_deref(),
        &jsonl::RunInfo {
            binary: "rrpc-bench",
            fabric: kind,
            rdma_device: c.side.rdma_device.as_deref(),
            model: &model_arg,
            seed: c.seed_arg.seed,
        },
    )?;
    let model_desc = model
        .as_ref()
        .map_or_else(|| "none".to_string(), |m| m.describe());
    let model_name = model
        .as_ref()
        .map_or_else(|| "none".to_string(), |m| m.params().name.clone());
    let mut out = BTreeMap::new();
    let plot_for = |name: &str| -> Option<PathBuf> {
        let p = c.out.chart.as_ref()?;
        Some(match cmd {
            Cmd::All => p.join(format!("{name}.svg")),
            _ => p.clone(),
        })
    };
    if let (Cmd::All, Some(dir)) = (cmd, &c.out.chart) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let at = sides.server().map_or_else(String::new, |s| {
        format!(" | server at --connect {s} (its own --server-core)")
    });
    println!(
        "rrpc-bench | fabric: {kind}{at} | timing model: {model_desc} | server core {} | client core {} | {} ms per point ({} ms warm-up) | {} cores",
        c.server_core, c.client_core, c.duration_ms(), c.warmup_ms(), cores
    );
    let all = matches!(cmd, Cmd::All);
    match cmd {
        Cmd::Batching {
            sizes,
            per_bucket,
            slices,
        } => {
            out.insert(
                "batching",
                batching(
                    c,
                    sides,
                    sizes,
                    (*per_bucket as usize, *slices as usize),
                    plot_for("batching"),
                )?,
            );
        }
        Cmd::Modes {
            sizes,
            mode_coroutines,
        } => {
            out.insert(
                "modes",
                modes(
                    c,
                    sides,
                    sizes,
                    *mode_coroutines,
                    model.as_ref(),
                    plot_for("modes"),
                )?,
            );
        }
        Cmd::Latency => {
            out.insert("latency", latency(c, sides)?);
        }
        Cmd::Throughput => {
            println!("\n== small-RPC throughput");
            let bed = Bed::new(c, sides)?;
            let (rate, per_core) = small_rpc(c, &bed)?;
            out.insert(
                "throughput",
                json!({ "small_rpc_calls_per_s": rate, "small_rpc_calls_per_s_per_core": per_core, "coroutines": c.coroutines }),
            );
        }
        Cmd::Peers { rounds, perftest } => {
            let peers = peers_cmp(c, sides, plot_for("peers"))?;
            if *perftest && *rounds > 0 {
                out.insert("perftest", perftest_rounds(c, sides, *rounds)?);
            } else if *perftest {
                let rrpc_p50 = peers["rrpc_p50_ns"].as_f64().unwrap_or(0.0);
                out.insert("perftest", perftest_cmp(c, sides, rrpc_p50));
            }
            out.insert("peers", peers);
            if *rounds > 0 && !*perftest {
                out.insert("peers_rounds", matched_rounds(c, sides, *rounds)?);
            }
        }
        Cmd::All => {}
    }
    if all {
        let sizes = [8usize, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192];
        out.insert(
            "batching",
            batching(c, sides, &sizes, (8, 10), plot_for("batching"))?,
        );
        let msizes = [
            64usize, 128, 256, 512, 1024, 2048, 4096, 16384, 65536, 262144, 1048576,
        ];
        out.insert(
            "modes",
            modes(c, sides, &msizes, 8, model.as_ref(), plot_for("modes"))?,
        );
        out.insert("latency", latency(c, sides)?);
        out.insert("peers", peers_cmp(c, sides, plot_for("peers"))?);
    }
    if let Some(p) = &c.out.json {
        jsonl::summary(&json!({
            "fabric": kind.to_string(),
            "timing_model": model_name,
            "timing_model_params": model.as_ref().map(|m| m.describe()),
            "duration_ms": c.duration_ms(),
            "warmup_ms": c.warmup_ms(),
            "server_core": c.server_core,
            "client_core": c.client_core,
            "results": out,
        }));
        println!("wrote {}", p.display());
    }
    Ok(())
}

/// A server node (here or on the `--connect` server) and the fabric for clients; the
/// server side ends on drop.
struct Bed<'s> {
    point: ServerPoint<'s>,
    spec: &'s FabricSpec,
    next_node: std::sync::atomic::AtomicU32,
    runtime: RuntimeConfig,
}

/// The server side of a `Bed`: a node serving GEN with one server thread and `server`'s
/// settings (its cores: `--server-core`; no parameters).
fn start_server(
    _: &serde_json::Value,
    env: &PointEnv<'_>,
    server: &ServerConfig,
) -> Result<Started> {
    let f = env.open(NodeId(1))?;
    let mut h = Handlers::new();
    h.register(GEN, |req, out| {
        let n = req
            .get(..4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
            .ok_or("request shorter than 4 bytes")?;
        out.resize(n, 0xab);
        if n >= 8 {
            out[..8].copy_from_slice(
                &req.get(4..12)
                    .unwrap_or(&[0; 8])
                    .try_into()
                    .unwrap_or([0; 8]),
            );
        }
        Ok(())
    });
    let node = Node::start_with(
        f,
        NodeConfig::new("rrpc-bench", env.listen()).rpc(h, 1),
        server.clone(),
    )?;
    Ok(Started {
        addr: node.addr(),
        info: serde_json::Value::Null,
        keep: Box::new(node),
    })
}

impl<'s> Bed<'s> {
    /// The server side of one experiment.
    fn new(c: &Common, sides: &'s Sides) -> Result<Self> {
        let server = c.rpc.server.clone().with_cores(vec![c.server_core]);
        let start = move |p: &serde_json::Value, env: &PointEnv<'_>| start_server(p, env, &server);
        Ok(Self {
            point: sides.point(&serde_json::Value::Null, &start)?,
            spec: sides.spec(),
            next_node: std::sync::atomic::AtomicU32::new(100),
            runtime: c.rpc.runtime.clone(),
        })
    }

    /// The clients' runtime settings (`--config`'s `[runtime]`, else the defaults), for
    /// a point to adjust (its batching, its Rocket).
    fn runtime(&self) -> RuntimeConfig {
        self.runtime.clone()
    }

    /// The server's bootstrap address.
    fn addr(&self) -> std::net::SocketAddr {
        self.point.addr
    }

    /// A client context (a new node id, so new QPs and Rockets) connected to the server.
    fn client(&self, cfg: RuntimeConfig) -> Result<(Rc<ThreadCtx>, NodeId)> {
        let id = self
            .next_node
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let f = self.spec.open(&self.point.cluster, NodeId(id))?;
        let ctx = ThreadCtx::new(f, cfg).map_err(anyhow::Error::msg)?;
        let node = ctx
            .connect_rpc(self.addr())
            .map_err(anyhow::Error::msg)?
            .node;
        Ok((ctx, node))
    }
}

/// Node `id` of cluster `cluster` as `sides` opens its nodes.
fn open_fabric(sides: &Sides, cluster: &str, id: u32) -> Result<Fabric> {
    sides.spec().open(cluster, NodeId(id))
}

fn pin(core: usize) {
    if !core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
        eprintln!("rrpc-bench: could not pin to core {core}");
    }
}

/// Run `f` on a new thread pinned to `core` (the main thread stays unpinned, so later
/// experiments and peers can use every core).
fn on_core<T: Send>(core: usize, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    std::thread::scope(|s| {
        s.spawn(move || {
            pin(core);
            f()
        })
        .join()
        .unwrap_or_else(|_| Err(anyhow::anyhow!("benchmark thread panicked")))
    })
}

/// Request payload of `len` bytes (at least 4) asking for a `reply`-byte reply.
fn request(len: usize, reply: usize) -> Vec<u8> {
    let mut r = vec![0x5a; len.max(4)];
    r[..4].copy_from_slice(&(reply as u32).to_le_bytes());
    r
}

/// One measured point.
struct Point {
    calls: u64,
    secs: f64,
    hist: Histogram<u64>,
    stats: Stats,
}

impl Point {
    fn rate(&self) -> f64 {
        self.calls as f64 / self.secs
    }
    fn p(&self, q: f64) -> f64 {
        self.hist.value_at_quantile(q) as f64
    }
}

/// `coroutines` coroutines on `ctx` calling GEN with `req` in `opts` mode for the
/// warm-up, then the measured time (the `(warm-up, measured)` window). Per-call latency in ns goes to the histogram.
fn drive(
    ctx: &Rc<ThreadCtx>,
    node: NodeId,
    coroutines: usize,
    req: Vec<u8>,
    opts: CallOpts,
    expect: usize,
    window: (Duration, Duration),
) -> Result<Point> {
    drive_with_idle(ctx, node, coroutines, 0, req, opts, expect, window)
}

/// How far [`drive_with_idle`] stretches a measured window that holds no call yet.
const NO_CALL_LIMIT: Duration = Duration::from_secs(10);

/// Coroutines that wait without work until the gate opens: stand-ins for a thread's idle
/// tasks (a caller waiting for a lock, a server task waiting for a request). Each stores
/// its waker once; `open` wakes them all, so an executor that polls only woken tasks
/// never polls them before.
#[derive(Default)]
struct IdleGate {
    open: Cell<bool>,
    wakers: RefCell<Vec<std::task::Waker>>,
}

impl IdleGate {
    async fn wait(&self) {
        let mut slot = None::<usize>;
        std::future::poll_fn(|cx| {
            if self.open.get() {
                return std::task::Poll::Ready(());
            }
            let mut wakers = self.wakers.borrow_mut();
            match slot {
                Some(i) if wakers[i].will_wake(cx.waker()) => {}
                Some(i) => wakers[i] = cx.waker().clone(),
                None => {
                    slot = Some(wakers.len());
                    wakers.push(cx.waker().clone());
                }
            }
            std::task::Poll::Pending
        })
        .await
    }

    fn open(&self) {
        self.open.set(true);
        let wakers = std::mem::take(&mut *self.wakers.borrow_mut());
        for w in wakers {
            w.wake();
        }
    }
}

/// [`drive`] with `idle` more coroutines on the same executor that wait, from the start
/// until every calling coroutine has finished, on an [`IdleGate`] (never ready during
/// the warm-up and the measured time).
#[allow(clippy::too_many_arguments)]
fn drive_with_idle(
    ctx: &Rc<ThreadCtx>,
    node: NodeId,
    coroutines: usize,
    idle: usize,
    req: Vec<u8>,
    opts: CallOpts,
    expect: usize,
    (warmup, measure): (Duration, Duration),
) -> Result<Point> {
    // One TSC-based clock for the loop and the samples: a precise system clock read per
    // call would cost more than some of the calls measured.
    let clock = quanta::Clock::new();
    let r0 = clock.raw();
    let m0 = warmup.as_nanos() as u64;
    let end = m0 + measure.as_nanos() as u64;
    // A point holds at least one measured call: on a loaded machine a short window can
    // pass while the first calls (the connection warming up) are still out, and an
    // empty histogram would read as 0 ns. The window is stretched for that, up to
    // NO_CALL_LIMIT past its end.
    let hard_end = end + NO_CALL_LIMIT.as_nanos() as u64;
    let hist = Rc::new(RefCell::new(Histogram::<u64>::new_with_bounds(
        1,
        60_000_000_000,
        3,
    )?));
    let calls = Rc::new(Cell::new(0u64));
    let failed = Rc::new(RefCell::new(None::<String>));
    let stats0 = Rc::new(Cell::new(None::<Stats>));
    let req = Rc::new(req);
    let gate = Rc::new(IdleGate::default());
    let active = Rc::new(Cell::new(coroutines.max(1)));
    let mut ex = Executor::new(ctx.clone());
    for _ in 0..coroutines.max(1) {
        let (ctx, hist, calls, failed, req, clock, stats0, gate, active) = (
            ctx.clone(),
            hist.clone(),
            calls.clone(),
            failed.clone(),
            req.clone(),
            clock.clone(),
            stats0.clone(),
            gate.clone(),
            active.clone(),
        );
        ex.spawn(async move {
            loop {
                let t0 = clock.raw();
                let now = clock.delta_as_nanos(r0, t0);
                if (now >= end && calls.get() > 0) || now >= hard_end || failed.borrow().is_some() {
                    break;
                }
                let r = ctx.call_with(node, GEN, &req, opts).await;
                let ns = clock.delta_as_nanos(t0, clock.raw());
                match r {
                    Ok(v) if v.len() == expect => {}
                    Ok(v) => {
                        *failed.borrow_mut() =
                            Some(format!("reply of {} bytes, want {expect}", v.len()));
                        break;
                    }
                    Err(e) => {
                        *failed.borrow_mut() = Some(e.to_string());
                        break;
                    }
                }
                if now >= m0 {
                    if stats0.get().is_none() {
                        stats0.set(Some(ctx.stats()));
                    }
                    calls.set(calls.get() + 1);
                    let _ = hist.borrow_mut().record(ns.max(1));
                }
            }
            active.set(active.get() - 1);
            if active.get() == 0 {
                gate.open();
            }
        });
    }
    for _ in 0..idle {
        let gate = gate.clone();
        ex.spawn(async move { gate.wait().await });
    }
    ex.run();
    // A stretched window is as long as it lasted.
    let lasted = Duration::from_nanos(clock.delta_as_nanos(r0, clock.raw()).saturating_sub(m0));
    let secs = if lasted > measure + NO_CALL_LIMIT / 100 && calls.get() < 100 {
        lasted.as_secs_f64()
    } else {
        measure.as_secs_f64()
    };
    if let Some(e) = failed.borrow_mut().take() {
        bail!("call failed: {e}");
    }
    if calls.get() == 0 {
        bail!(
            "no call completed in the measured window ({measure:?}, stretched by {NO_CALL_LIMIT:?})"
        );
    }
    let s0 = stats0.get().unwrap_or_default();
    let s1 = ctx.stats();
    let stats = Stats {
        doorbells: s1.doorbells - s0.doorbells,
        wrs: s1.wrs - s0.wrs,
        buckets: s1.buckets - s0.buckets,
        messages: s1.messages - s0.messages,
        credit_stalls: s1.credit_stalls - s0.credit_stalls,
        bytes: s1.bytes - s0.bytes,
        ..Stats::default()
    };
    let hist = hist.borrow().clone();
    Ok(Point {
        calls: calls.get(),
        secs,
        hist,
        stats,
    })
}

/// Largest Rocket ring the bench's server admits, bytes (`--config`'s `[server]
/// max-ring-bytes`, else the default; a `--serve` side's own file sets its own): every
/// point's geometry stays within it.
fn ring_limit(c: &Common) -> usize {
    c.rpc.server.max_ring_bytes
}

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}KiB", b >> 10),
        b => format!("{b}B"),
    }
}

fn batching(
    c: &Common,
    sides: &Sides,
    sizes: &[usize],
    (per_bucket, slices): (usize, usize),
    plot: Option<PathBuf>,
) -> Result<serde_json::Value> {
    println!(
        "\n== batching (Scythe Fig. 9): RPC throughput by batching mode | 1 client thread x {} coroutines | reply 8 B | \
         Rocket sized per point at connection time: buckets of 512 B grown to hold {per_bucket} messages of the point's size, \
         at most 64 buckets and {} B per ring (the server's limit), the same geometry for all four modes | \
         the four modes interleaved: {slices} rounds of one {} ms slice each, order rotating; Mcalls/s is the median slice's, \
         each ratio the median of the rounds' ratios",
        c.coroutines,
        ring_limit(c),
        (c.duration_ms() / slices.max(1) as u64).max(1)
    );
    on_core(c.client_core, || {
        batching_on(c, sides, sizes, (per_bucket, slices), plot)
    })
}

/// Median of `v` (0 when empty).
fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// One variant of an interleaved comparison: a connected client and the call it makes.
struct Contender {
    ctx: Rc<ThreadCtx>,
    node: NodeId,
    req: Vec<u8>,
    opts: CallOpts,
    expect: usize,
}

/// What [`interleave`] measured of one contender: every measured slice merged (calls,
/// latency histogram, counters) and each slice's rate, calls/s, in round order.
struct Interleaved {
    merged: Point,
    slice_rates: Vec<f64>,
}

impl Interleaved {
    /// The median slice's rate, calls/s.
    fn rate(&self) -> f64 {
        median(self.slice_rates.clone())
    }
}

/// The median over rounds of `a`'s slice rate over `b`'s in the same round: slices of
/// one round run back to back, so a stall of the machine that spans a round touches
/// both, and one that hits a single slice is outvoted.
fn median_ratio(a: &Interleaved, b: &Interleaved) -> f64 {
    median(
        a.slice_rates
            .iter()
            .zip(&b.slice_rates)
            .filter(|(_, &y)| y > 0.0)
            .map(|(x, y)| x / y)
            .collect(),
    )
}

/// Run `cs` side by side on this thread: a `warm` warm-up each, then `slices` rounds in
/// which every contender runs for `meas / slices` in turn, the order rotating by one
/// each round, `coroutines` coroutines each.
fn interleave(
    cs: &[Contender],
    coroutines: usize,
    slices: usize,
    (warm, meas): (Duration, Duration),
) -> Result<Vec<Interleaved>> {
    let slices = slices.max(1);
    let slice = (meas / slices as u32).max(Duration::from_millis(1));
    for c in cs {
        if !warm.is_zero() {
            drive(
                &c.ctx,
                c.node,
                coroutines,
                c.req.clone(),
                c.opts,
                c.expect,
                (Duration::ZERO, warm),
            )?;
        }
    }
    let mut out: Vec<Option<Interleaved>> = cs.iter().map(|_| None).collect();
    for round in 0..slices {
        for k in 0..cs.len() {
            let i = (round + k) % cs.len();
            let c = &cs[i];
            let p = drive(
                &c.ctx,
                c.node,
                coroutines,
                c.req.clone(),
                c.opts,
                c.expect,
                (Duration::ZERO, slice),
            )?;
            let rate = p.rate();
            match &mut out[i] {
                Some(acc) => {
                    acc.merged.calls += p.calls;
                    acc.merged.secs += p.secs;
                    acc.merged.hist.add(&p.hist)?;
                    acc.merged.stats.add(&p.stats);
                    acc.slice_rates.push(rate);
                }
                slot @ None => {
                    *slot = Some(Interleaved {
                        merged: p,
                        slice_rates: vec![rate],
                    })
                }
            }
        }
    }
    Ok(out.into_iter().flatten().collect())
}

fn batching_on(
    c: &Common,
    sides: &Sides,
    sizes: &[usize],
    (per_bucket, slices): (usize, usize),
    plot: Option<PathBuf>,
) -> Result<serde_json::Value> {
    let bed = Bed::new(c, sides)?;
    let (warm, meas) = (
        Duration::from_millis(c.warmup_ms()),
        Duration::from_millis(c.duration_ms()),
    );
    println!(
        "{:>8} {:>10} {:>12} {:>8} {:>8} {:>9} {:>9} {:>14}",
        "size", "mode", "Mcalls/s", "MB/s", "p50(us)", "msg/WRITE", "WR/dbell", "ring"
    );
    let mut rows = Vec::new();
    let mut series: BTreeMap<Batching, Vec<(f64, f64)>> = BTreeMap::new();
    let mut ratio64 = None;
    let mut min_ratio = None::<(usize, f64)>;
    for &size in sizes {
        let rocket = RocketConfig::for_messages(size, per_bucket, ring_limit(c))
            .with_context(|| format!("a Rocket for {size} B messages"))?;
        let cs = Batching::ALL
            .iter()
            .map(|&b| {
                let cfg = bed.runtime().with_batching(b).with_rocket(rocket);
                let (ctx, node) = bed.client(cfg)?;
                Ok(Contender {
                    ctx,
                    node,
                    req: request(size, 8),
                    opts: CallOpts::mode(ReplyMode::Rpc),
                    expect: 8,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let got = interleave(&cs, c.coroutines, slices, (warm, meas))
            .with_context(|| format!("batching {size} B"))?;
        let by: BTreeMap<Batching, &Interleaved> = Batching::ALL.into_iter().zip(&got).collect();
        for (&b, m) in &by {
            let (r, p) = (m.rate(), &m.merged);
            println!(
                "{:>8} {:>10} {:>12.3} {:>8.1} {:>8.1} {:>9.2} {:>9.2} {:>14}",
                human(size),
                b.name(),
                r / 1e6,
                r * size as f64 / 1e6,
                p.p(0.5) / 1e3,
                p.stats.messages_per_write(),
                p.stats.wrs_per_doorbell(),
                format!("{}x{}", rocket.buckets, human(rocket.bucket_size))
            );
            rows.push(jsonl::point_with("batching", json!({
                "size": size, "mode": b.name(), "calls_per_s": r, "mb_per_s": r * size as f64 / 1e6,
                "calls_per_s_overall": p.rate(), "slice_calls_per_s": m.slice_rates,
                "bucket_size": rocket.bucket_size, "buckets": rocket.buckets,
                "p50_ns": p.p(0.5), "p99_ns": p.p(0.99),
                "messages_per_write": p.stats.messages_per_write(), "wrs_per_doorbell": p.stats.wrs_per_doorbell(),
                "credit_stalls": p.stats.credit_stalls,
            }), Some(&p.hist)));
            series.entry(b).or_default().push((size as f64, r / 1e6));
        }
        let comb = by[&Batching::Combined];
        let ratio = median_ratio(comb, by[&Batching::Doorbell]);
        println!(
            "{:>8} ratio combined/doorbell = {:.2}, combined/none = {:.2}, combined/msg = {:.2}",
            human(size),
            ratio,
            median_ratio(comb, by[&Batching::None]),
            median_ratio(comb, by[&Batching::Msg]),
        );
        if size == 64 {
            ratio64 = Some(ratio);
        }
        if min_ratio.is_none_or(|(_, m)| ratio < m) {
            min_ratio = Some((size, ratio));
        }
    }
    if let Some(r) = ratio64 {
        println!("ratio combined/doorbell @64B = {r:.2}");
    }
    if let Some((s, r)) = min_ratio {
        println!("ratio combined/doorbell min = {r:.2} (at {})", human(s));
    }
    if let Some(p) = plot {
        let s: Vec<Series> = series
            .into_iter()
            .map(|(b, points)| Series {
                name: b.name().into(),
                points,
                labels: Vec::new(),
            })
            .collect();
        draw(
            &p,
            "RPC throughput by batching mode (Scythe Fig. 9)",
            "message size (bytes)",
            "Mcalls/s",
            Scale::Log2,
            Scale::Log10,
            &s,
        )?;
    }
    Ok(json!({
        "coroutines": c.coroutines, "messages_per_bucket": per_bucket, "slices": slices, "points": rows,
        "ratio_combined_doorbell_64": ratio64, "ratio_combined_doorbell_min": min_ratio.map(|m| m.1),
    }))
}

fn draw(
    path: &Path,
    title: &str,
    x: &str,
    y: &str,
    xs: Scale,
    ys: Scale,
    series: &[Series],
) -> Result<()> {
    LineChart {
        title,
        x_label: x,
        y_label: y,
        x_scale: xs,
        y_scale: ys,
        series,
    }
    .draw(path)?;
    println!("plot: {}", path.display());
    Ok(())
}

/// Rounds of `modes`: the three modes of a size run interleaved, one slice each per
/// round, the order rotating (as `batching` does with `--slices`).
const MODE_SLICES: usize = 5;

/// Replies of the point's size one bucket of pure RPC's response Rocket holds (fewer
/// where two such buckets would not fit the server's ring limit): as many as the
/// `batching` default, so that pure RPC's replies share WRITEs as the hybrid modes'
/// small replies do. With one reply per bucket, pure RPC paid a WRITE per reply under
/// the model and lost to the hybrid modes from 256 B to 4 KiB.
const MODE_REPLIES_PER_BUCKET: usize = 8;

fn modes(
    c: &Common,
    sides: &Sides,
    sizes: &[usize],
    coroutines: usize,
    model: Option<&TimingModel>,
    plot: Option<PathBuf>,
) -> Result<serde_json::Value> {
    println!(
        "\n== modes (Scythe Fig. 10): reply payload by pure RPC, RPC + READ, zero-copy | 1 client thread x {coroutines} coroutines | request 8 B | \
         pure RPC's Rocket sized per point at connection time for {MODE_REPLIES_PER_BUCKET} replies per bucket (fewer where two buckets would not fit), at most 64 buckets and {} B per ring (the server's limit) | \
         the three modes interleaved: {MODE_SLICES} rounds of one {} ms slice each, order rotating; Kcalls/s is the median slice's, each ratio the median of the rounds' ratios",
        ring_limit(c),
        (c.duration_ms() / MODE_SLICES as u64).max(1)
    );
    on_core(c.client_core, || {
        modes_on(c, sides, sizes, coroutines, model, plot)
    })
}

/// What a READ adds to a call under `model`, ns: the round trip of a READ with no data
/// (its request out, an empty response back, a WR at each NIC), planned on idle NICs. The
/// reply's bytes cross the line once in either mode (in the ring's WRITE or in the READ's
/// response), so they are not part of the difference.
fn read_extra_ns(model: &TimingModel) -> u64 {
    use rrpc::fabric::model::{ModelOp, Nic, NIC_WORDS};
    use std::sync::atomic::AtomicU64;
    let words = || {
        (0..NIC_WORDS)
            .map(|_| AtomicU64::new(0))
            .collect::<Vec<_>>()
    };
    let (a, b) = (words(), words());
    model
        .plan(ModelOp::Read(0), 0, Nic::new(&a), Nic::new(&b), (0, 0))
        .complete_ns
}

/// This core's memory copy rate, bytes per ns, for `chunk`-byte copies walking through
/// `span` bytes of source and destination (the best of three passes of 64 MiB): a ring
/// of `span` bytes cycles through memory the same way, so a ring larger than the caches
/// copies at memory speed, not cache speed.
fn copy_rate(chunk: usize, span: usize) -> f64 {
    let chunk = chunk.max(1);
    let span = span.max(chunk);
    let src = vec![0x5au8; span];
    let mut dst = vec![0u8; span];
    let per_pass = (64usize << 20) / chunk;
    let mut best = 0.0f64;
    for _ in 0..3 {
        let t = std::time::Instant::now();
        let mut off = 0;
        for _ in 0..per_pass {
            if off + chunk > span {
                off = 0;
            }
            dst[off..off + chunk].copy_from_slice(std::hint::black_box(&src[off..off + chunk]));
            std::hint::black_box(&mut dst);
            off += chunk;
        }
        let ns = t.elapsed().as_nanos().max(1) as f64;
        best = best.max((per_pass * chunk) as f64 / ns);
    }
    best
}

fn modes_on(
    c: &Common,
    sides: &Sides,
    sizes: &[usize],
    coroutines: usize,
    model: Option<&TimingModel>,
    plot: Option<PathBuf>,
) -> Result<serde_json::Value> {
    let slices = MODE_SLICES;
    let (warm, meas) = (
        Duration::from_millis(c.warmup_ms()),
        Duration::from_millis(c.duration_ms()),
    );
    println!(
        "{:>8} {:>10} {:>11} {:>9} {:>9} {:>9}",
        "size", "mode", "Kcalls/s", "MB/s", "p50(us)", "p99(us)"
    );
    let modes = [
        ("rpc", ReplyMode::Rpc),
        ("read", ReplyMode::Read),
        ("zero-copy", ReplyMode::ZeroCopy),
    ];
    let mut rows = Vec::new();
    let mut series: Vec<Series> = modes
        .iter()
        .map(|(n, _)| Series {
            name: (*n).into(),
            points: vec![],
            labels: Vec::new(),
        })
        .collect();
    let mut best_hybrid_wins = Vec::new();
    for &size in sizes {
        // A server per size: READ-mode reply buffers that a finished point's caller never
        // released (calls in flight when it stopped) stay held for the server's read hold
        // (5 s), and at 1 MiB (2 MiB chunks) they left the next mode's replies without
        // buffers ("server reply buffers exhausted").
        let bed = Bed::new(c, sides)?;
        let mut cs = Vec::new();
        for (_, mode) in &modes {
            // Pure RPC carries the reply in the ring: its Rocket is sized at connection
            // time for MODE_REPLIES_PER_BUCKET replies per bucket, within the server's
            // ring limit (for 1 MiB, three buckets of one reply each). The hybrid modes'
            // replies are a few bytes.
            let rocket = if *mode == ReplyMode::Rpc {
                RocketConfig::for_messages(size, MODE_REPLIES_PER_BUCKET, ring_limit(c))
                    .with_context(|| format!("a Rocket for {size} B replies"))?
            } else {
                RocketConfig::default()
            };
            let cfg = bed.runtime().with_rocket(rocket);
            let (ctx, node) = bed.client(cfg)?;
            cs.push(Contender {
                ctx,
                node,
                req: request(8, size),
                opts: CallOpts {
                    mode: *mode,
                    reply_len: Some(size),
                    timeout: Some(Duration::from_secs(10)),
                },
                expect: size,
            });
        }
        let got = interleave(&cs, coroutines, slices, (warm, meas))
            .with_context(|| format!("modes {size} B"))?;
        for (i, ((name, _), m)) in modes.iter().zip(&got).enumerate() {
            let (r, p) = (m.rate(), &m.merged);
            println!(
                "{:>8} {:>10} {:>11.1} {:>9.1} {:>9.1} {:>9.1}",
                human(size),
                name,
                r / 1e3,
                r * size as f64 / 1e6,
                p.p(0.5) / 1e3,
                p.p(0.99) / 1e3
            );
            rows.push(jsonl::point_with(
                "modes",
                json!({
                    "size": size, "mode": name, "calls_per_s": r, "mb_per_s": r * size as f64 / 1e6,
                    "calls_per_s_overall": p.rate(), "slice_calls_per_s": m.slice_rates,
                    "p50_ns": p.p(0.5), "p99_ns": p.p(0.99),
                }),
                Some(&p.hist),
            ));
            series[i].points.push((size as f64, r * size as f64 / 1e6));
        }
        let (read, zc) = (
            median_ratio(&got[1], &got[0]),
            median_ratio(&got[2], &got[0]),
        );
        println!(
            "{:>8} ratio read/rpc = {read:.2}, zero-copy/rpc = {zc:.2}",
            human(size)
        );
        let hybrid = read.max(zc);
        best_hybrid_wins.push((size, hybrid > 1.0));
    }
    // Crossover: the smallest size from which a hybrid mode beats pure RPC at every
    // larger size measured.
    let crossover = (0..best_hybrid_wins.len())
        .find(|&i| best_hybrid_wins[i..].iter().all(|&(_, w)| w))
        .map(|i| best_hybrid_wins[i].0);
    let model_name = model.map_or("none", |m| m.params().name.as_str());
    match crossover {
        Some(s) => println!(
            "crossover = {s} B (model {model_name}; hybrid modes beat pure RPC from {} up; Scythe's threshold: 512 B)",
            human(s)
        ),
        None => println!(
            "crossover = none (model {model_name}; pure RPC was never overtaken for good in this range)"
        ),
    }
    // Why it lies there. A READ-mode call pays one more network round trip than pure
    // RPC; pure RPC pays for carrying the reply in the ring: on shm a WRITE is a memcpy by
    // the posting CPU, so the server's one thread copies the reply twice (into the
    // staging bucket, then into the caller's ring) where READ mode copies it once (into
    // the reply buffer the caller READs with its own CPU). The two costs are equal where
    // the extra copy takes as long as the extra round trip.
    let predicted = model.map(|m| {
        let extra = read_extra_ns(m);
        let rate = copy_rate(64 << 10, ring_limit(c));
        (extra, rate, (extra as f64 * rate) as u64)
    });
    if let (Some(m), Some((extra, rate, at))) = (model, predicted) {
        let p = m.params();
        println!(
            "why: a READ adds one round trip, {:.2} us under {} (2 x {} ns one-way, a WR at each NIC at {} Mops, the READ request's {} B on the line); \
             pure RPC instead costs the server's thread one more copy of the reply (into the caller's ring: shm runs a WRITE as a memcpy on the posting core; \
             an RNIC would DMA it) at {:.1} GB/s here (64 KiB copies through a ring-sized span), so the two are even at {:.2} us x {:.1} GB/s = {} B: below it the ring is cheaper, above it the READ.",
            extra as f64 / 1e3,
            p.name,
            p.link.one_way_ns,
            p.nic.msg_rate_mops,
            m.wire_bytes(0, 16),
            rate,
            extra as f64 / 1e3,
            rate,
            at
        );
    } else {
        println!(
            "why: without a timing model a READ's extra round trip is the shm backend's own (a memcpy and a CQ poll), \
             so the crossover only says where one more copy of the reply on the server's thread outweighs it; run with --model cx5 for the RNIC's terms"
        );
    }
    if let Some(p) = plot {
        draw(
            &p,
            "Reply throughput by communication mode (Scythe Fig. 10)",
            "reply size (bytes)",
            "MB/s",
            Scale::Log2,
            Scale::Log10,
            &series,
        )?;
    }
    Ok(json!({
        "coroutines": coroutines, "points": rows, "crossover_bytes": crossover, "model": model_name,
        "read_extra_round_trip_ns": predicted.map(|p| p.0),
        "copy_bytes_per_ns": predicted.map(|p| p.1),
        "predicted_crossover_bytes": predicted.map(|p| p.2),
    }))
}

fn latency(c: &Common, sides: &Sides) -> Result<serde_json::Value> {
    println!("\n== latency: round trip of 32 B requests, 1 coroutine per client thread, ReplyMode::Auto with the reply size known");
    let bed = Bed::new(c, sides)?;
    let (warm, meas) = (
        Duration::from_millis(c.warmup_ms()),
        Duration::from_millis(c.duration_ms()),
    );
    let cores = core_affinity::get_core_ids().map_or(1, |v| v.len());
    println!(
        "{:>8} {:>8} {:>9} {:>9} {:>9} {:>10}",
        "reply", "threads", "p50(us)", "p99(us)", "mean(us)", "calls/s"
    );
    let mut rows = Vec::new();
    for threads in [1usize, 2] {
        for reply in [32usize, 4096, 65536] {
            let addr = bed.addr();
            let (spec, cluster) = (bed.spec, bed.point.cluster.clone());
            let base = bed
                .next_node
                .fetch_add(threads as u32, std::sync::atomic::Ordering::Relaxed);
            let results: Vec<Result<Point>> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..threads)
                    .map(|t| {
                        let cluster = cluster.clone();
                        s.spawn(move || -> Result<Point> {
                                pin((c.client_core + t * cores.saturating_sub(1).max(1))
                                    % cores.max(1));
                                let f = spec.open(&cluster, NodeId(base + t as u32))?;
                                let ctx = ThreadCtx::new(f, c.rpc.runtime.clone())
                                    .map_err(anyhow::Error::msg)?;
                                let node = ctx.connect_rpc(addr).map_err(anyhow::Error::msg)?.node;
                                let opts = CallOpts {
                                    reply_len: Some(reply),
                                    ..CallOpts::default()
                                };
                                drive(&ctx, node, 1, request(32, reply), opts, reply, (warm, meas))
                            })
                    })
                    .collect();
                bench::join_clients(hs)
            });
            let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
            let mut calls = 0;
            for r in results {
                let p = r?;
                hist.add(&p.hist)?;
                calls += p.calls;
            }
            let rate = calls as f64 / meas.as_secs_f64();
            println!(
                "{:>8} {:>8} {:>9.2} {:>9.2} {:>9.2} {:>10.0}",
                human(reply),
                threads,
                hist.value_at_quantile(0.5) as f64 / 1e3,
                hist.value_at_quantile(0.99) as f64 / 1e3,
                hist.mean() / 1e3,
                rate
            );
            rows.push(jsonl::point_with("latency", json!({
                "reply": reply, "threads": threads, "p50_ns": hist.value_at_quantile(0.5),
                "p99_ns": hist.value_at_quantile(0.99), "mean_ns": hist.mean(), "calls_per_s": rate,
            }), Some(&hist)));
        }
    }
    // One caller among idle coroutines: 1 calling coroutine and 63 waiting ones on one
    // client thread against the caller alone, same request and options as the 1-thread
    // 32 B row, alternated twice (half the measured time each) since absolute numbers
    // drift. The idle coroutines wait on a gate opened when the caller is done.
    const IDLE: usize = 63;
    let (alone, crowd) = on_core(c.client_core, || {
        let (ctx, node) = bed.client(bed.runtime())?;
        let opts = CallOpts {
            reply_len: Some(32),
            ..CallOpts::default()
        };
        let half = (warm, meas / 2);
        let mut alone = (
            Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?,
            0u64,
        );
        let mut crowd = (
            Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?,
            0u64,
        );
        for _ in 0..2 {
            for (idle, acc) in [(0, &mut alone), (IDLE, &mut crowd)] {
                let p = drive_with_idle(&ctx, node, 1, idle, request(32, 32), opts, 32, half)?;
                acc.0.add(&p.hist)?;
                acc.1 += p.calls;
            }
        }
        Ok((alone, crowd))
    })?;
    println!("\n1 caller among idle coroutines (32 B / 32 B, one client thread, alternated 2x):");
    println!(
        "{:>20} {:>9} {:>9} {:>9} {:>10}",
        "caller", "p50(us)", "p99(us)", "mean(us)", "calls/s"
    );
    let mut idle_rows = serde_json::Map::new();
    for (name, (h, calls)) in [("1-alone", &alone), ("1-of-64", &crowd)] {
        let rate = *calls as f64 / meas.as_secs_f64();
        println!(
            "{:>20} {:>9.2} {:>9.2} {:>9.2} {:>10.0}",
            if name == "1-alone" {
                "1 alone"
            } else {
                "1 + 63 idle"
            },
            h.value_at_quantile(0.5) as f64 / 1e3,
            h.value_at_quantile(0.99) as f64 / 1e3,
            h.mean() / 1e3,
            rate
        );
        idle_rows.insert(
            name.into(),
            jsonl::point_with("latency-idle", json!({ "case": name, "p50_ns": h.value_at_quantile(0.5), "p99_ns": h.value_at_quantile(0.99), "mean_ns": h.mean(), "calls_per_s": rate }), Some(h)),
        );
    }
    let idle_ratio =
        crowd.0.value_at_quantile(0.5) as f64 / alone.0.value_at_quantile(0.5).max(1) as f64;
    println!("ratio p50 1-of-64/1-alone = {idle_ratio:.3}");
    idle_rows.insert("idle_coroutines".into(), json!(IDLE));
    idle_rows.insert("ratio_p50_1_of_64_1_alone".into(), json!(idle_ratio));
    let (rate, per_core) = small_rpc(c, &bed)?;
    Ok(
        json!({ "points": rows, "idle": idle_rows, "small_rpc_calls_per_s": rate, "small_rpc_calls_per_s_per_core": per_core, "coroutines": c.coroutines }),
    )
}

/// Small-RPC throughput: one client thread with `--coroutines` coroutines against one
/// server thread, both cores busy. Returns calls/s and calls/s per busy core.
fn small_rpc(c: &Common, bed: &Bed) -> Result<(f64, f64)> {
    let (warm, meas) = (
        Duration::from_millis(c.warmup_ms()),
        Duration::from_millis(c.duration_ms()),
    );
    let p = on_core(c.client_core, || {
        let (ctx, node) = bed.client(bed.runtime())?;
        drive(
            &ctx,
            node,
            c.coroutines,
            request(32, 32),
            CallOpts::mode(ReplyMode::Rpc),
            32,
            (warm, meas),
        )
    })?;
    let per_core = p.rate() / 2.0;
    println!(
        "small-RPC throughput (32 B / 32 B, 1 client thread x {} coroutines, 1 server thread): {:.0} calls/s = {:.0} calls/s per core (2 cores busy); p50 {:.1} us, {:.2} msgs per WRITE",
        c.coroutines, p.rate(), per_core, p.p(0.5) / 1e3, p.stats.messages_per_write()
    );
    jsonl::point_with(
        "small-rpc",
        json!({
            "request_bytes": 32, "reply_bytes": 32, "coroutines": c.coroutines,
            "calls_per_s": p.rate(), "calls_per_s_per_core": per_core,
            "messages_per_write": p.stats.messages_per_write(),
        }),
        Some(&p.hist),
    );
    Ok((p.rate(), per_core))
}

/// The fabric's own round trip (one WRITE each way between two QPs of a fresh cluster,
/// no RPC protocol), on the same backend and timing model as rrpc's.
fn fabric_floor_rtt(sides: &Sides, cfg: &PeerConfig) -> Result<RttSamples> {
    let name = format!("rrpc-bench-{}-fabric", std::process::id());
    let (_cluster, _) = ClusterGuard::new(&name)?;
    peers::fabric_rtt(cfg, &|id| open_fabric(sides, &name, id))
}

/// rrpc's round trip measured like the peers': one client coroutine, 32 B each way.
fn rrpc_rtt(c: &Common, sides: &Sides, cfg: &PeerConfig) -> Result<RttSamples> {
    let bed = Bed::new(c, sides)?;
    let p = on_core(cfg.client_core, || {
        let (ctx, node) = bed.client(bed.runtime())?;
        drive(
            &ctx,
            node,
            1,
            request(cfg.request_bytes, cfg.reply_bytes),
            CallOpts::mode(ReplyMode::Rpc),
            cfg.reply_bytes,
            (cfg.warmup, cfg.duration),
        )
    })?;
    Ok(RttSamples {
        hist: p.hist,
        round_trips: p.calls,
        elapsed: cfg.duration,
    })
}

/// The peers' settings: 32 B each way, the command line's cores and times.
fn peer_config(c: &Common) -> PeerConfig {
    PeerConfig {
        request_bytes: 32,
        reply_bytes: 32,
        warmup: Duration::from_millis(c.warmup_ms()),
        duration: Duration::from_millis(c.duration_ms()),
        client_core: c.client_core,
        server_core: c.server_core,
    }
}

fn peers_cmp(c: &Common, sides: &Sides, plot: Option<PathBuf>) -> Result<serde_json::Value> {
    let cfg = peer_config(c);
    println!(
        "\n== peers: round trip, 32 B request and 32 B reply, one request in flight, client core {} / server core {}, busy polling (tonic: tokio current-thread runtimes)",
        cfg.client_core, cfg.server_core
    );
    let runs: Vec<(&str, Result<RttSamples>)> = if let Some(server) = sides.server() {
        println!(
            "rrpc against the server at --connect {server}; floor, fabric, iceoryx2 and tonic: skipped (they measure within one host; compare across hosts with --perftest)"
        );
        vec![("rrpc", rrpc_rtt(c, sides, &cfg))]
    } else {
        vec![
            ("floor", peers::floor_rtt(&cfg)),
            ("fabric", fabric_floor_rtt(sides, &cfg)),
            ("rrpc", rrpc_rtt(c, sides, &cfg)),
            ("iceoryx2", peers::iceoryx2_rtt(&cfg)),
            ("tonic", peers::tonic_rtt(&cfg)),
        ]
    };
    println!(
        "{:>10} {:>10} {:>10} {:>10} {:>12} {:>12}",
        "peer", "p50(ns)", "p99(ns)", "mean(ns)", "one-way(ns)", "round trips"
    );
    let mut p50 = BTreeMap::new();
    let mut rows = Vec::new();
    for (name, r) in runs {
        let s = r.with_context(|| format!("peer {name}"))?;
        let (a, b) = (
            s.hist.value_at_quantile(0.5),
            s.hist.value_at_quantile(0.99),
        );
        println!(
            "{:>10} {:>10} {:>10} {:>10.0} {:>12.0} {:>12}",
            name,
            a,
            b,
            s.mean_ns(),
            s.mean_ns() / 2.0,
            s.round_trips
        );
        rows.push(jsonl::point_with(
            "peers",
            json!({ "peer": name, "p50_ns": a, "p99_ns": b, "mean_ns": s.mean_ns(), "one_way_mean_ns": s.mean_ns() / 2.0, "round_trips": s.round_trips }),
            Some(&s.hist),
        ));
        p50.insert(name, a as f64);
    }
    let ratio = |a: &str, b: &str| match (p50.get(a), p50.get(b)) {
        (Some(a), Some(b)) => Some(a / b),
        _ => None,
    };
    for (a, b, digits) in [
        ("rrpc", "iceoryx2", 2),
        ("rrpc", "tonic", 3),
        ("rrpc", "floor", 2),
        ("rrpc", "fabric", 2),
        ("fabric", "floor", 2),
    ] {
        if let Some(r) = ratio(a, b) {
            println!("ratio rtt {a}/{b} = {r:.digits$}");
        }
    }
    if let Some(p) = plot {
        let s: Vec<Series> = p50
            .iter()
            .enumerate()
            .map(|(i, (n, v))| Series {
                name: (*n).into(),
                points: vec![(i as f64 + 1.0, *v)],
                labels: Vec::new(),
            })
            .collect();
        draw(
            &p,
            "Round trip p50, 32 B / 32 B",
            "peer (index)",
            "ns",
            Scale::Linear,
            Scale::Log10,
            &s,
        )?;
    }
    Ok(json!({
        "request_bytes": 32, "reply_bytes": 32, "points": rows, "rrpc_p50_ns": p50.get("rrpc"),
        "ratio_rtt_rrpc_iceoryx2": ratio("rrpc", "iceoryx2"), "ratio_rtt_rrpc_tonic": ratio("rrpc", "tonic"), "ratio_rtt_rrpc_floor": ratio("rrpc", "floor"), "ratio_rtt_rrpc_fabric": ratio("rrpc", "fabric"), "ratio_rtt_fabric_floor": ratio("fabric", "floor"),
    }))
}

/// `peers --perftest`: perftest's `ib_write_lat` between the same two devices as rrpc
/// (the server's and this process's), 32 B, and rrpc's p50 round trip `rrpc_p50_ns`
/// against twice its `t_typical` (perftest reports half a round trip). Prints why it is
/// skipped on shm, without `ib_write_lat`, or when it fails; never fails the run.
fn perftest_cmp(c: &Common, sides: &Sides, rrpc_p50_ns: f64) -> serde_json::Value {
    let skipped = |why: String| {
        println!("perftest: skipped: {why}");
        json!({ "skipped": why })
    };
    if let Some(why) = perftest_unavailable(sides) {
        return skipped(why);
    }
    let iterations = perftest_iterations(c);
    let l = match sides.perftest(PERFTEST_BYTES, iterations) {
        Ok(l) => l,
        Err(e) => return skipped(format!("{e:#}")),
    };
    let rtt = l.rtt_ns();
    println!(
        "perftest: {} -s {PERFTEST_BYTES} -n {iterations} between the same two devices: t_typical {:.2} us, t_min {:.2} us, t_avg {:.2} us (half a round trip, as perftest reports); round trip = 2 x t_typical = {rtt:.0} ns; rrpc p50 round trip {rrpc_p50_ns:.0} ns",
        perftest::WRITE_LAT,
        l.t_typical_us,
        l.t_min_us,
        l.t_avg_us
    );
    let ratio = rrpc_p50_ns / rtt;
    println!("ratio rtt rrpc/ib_write_lat = {ratio:.2}");
    json!({
        "tool": perftest::WRITE_LAT, "bytes": l.bytes, "iterations": l.iterations,
        "t_typical_us": l.t_typical_us, "t_min_us": l.t_min_us, "t_avg_us": l.t_avg_us,
        "rtt_ns": rtt, "rrpc_p50_ns": rrpc_p50_ns, "ratio_rtt_rrpc_ib_write_lat": ratio,
    })
}

/// Message size of the perftest comparison, bytes (rrpc's request and reply too).
const PERFTEST_BYTES: usize = 32;

/// `ib_write_lat` iterations per run: ten per millisecond of --duration, at least 1000.
fn perftest_iterations(c: &Common) -> u64 {
    (c.duration_ms().saturating_mul(10)).max(1000)
}

/// Why `ib_write_lat` cannot run here (not verbs, not installed), if it cannot.
fn perftest_unavailable(sides: &Sides) -> Option<String> {
    if sides.spec().kind != FabricKind::Verbs {
        return Some(format!(
            "the {} fabric has no RDMA device ({} measures RDMA devices: run with --fabric verbs)",
            sides.spec().kind,
            perftest::WRITE_LAT
        ));
    }
    perftest::find().is_none().then(|| {
        format!(
            "{} not found on PATH (Debian: apt-get install perftest)",
            perftest::WRITE_LAT
        )
    })
}

/// `peers --perftest --rounds N`: `rounds` times `ib_write_lat`, an rrpc point and
/// `ib_write_lat` again, back to back between the same two devices, printing each round
/// as it ends; then `ratio rtt rrpc/ib_write_lat`, the median of the rounds' ratios
/// (rrpc's p50 over the mean of its two perftest round trips), rounds whose perftest
/// figures differ by more than [`peers::rounds::SPEED_GAP`] left out. On a VM or a shared
/// machine whose speed drifts, one perftest run after one rrpc point may pair two speeds.
/// Says why and returns when perftest cannot run; a failed perftest run fails the
/// command.
fn perftest_rounds(c: &Common, sides: &Sides, rounds: u32) -> Result<serde_json::Value> {
    use peers::rounds::{perftest_median, PerftestRound, SPEED_GAP};
    if let Some(why) = perftest_unavailable(sides) {
        println!("perftest: skipped: {why}");
        return Ok(json!({ "skipped": why }));
    }
    let cfg = peer_config(c);
    let iterations = perftest_iterations(c);
    println!(
        "\n== peers against {}, {rounds} rounds: {} -s {PERFTEST_BYTES} -n {iterations}, rrpc ({} ms, {} ms warm-up) and {} again, back to back; round trips in ns ({}: 2 x t_typical, perftest reporting half a round trip; rrpc: p50)",
        perftest::WRITE_LAT,
        perftest::WRITE_LAT,
        c.duration_ms(),
        c.warmup_ms(),
        perftest::WRITE_LAT,
        perftest::WRITE_LAT
    );
    println!(
        "{:>6} {:>14} {:>10} {:>14} {:>26}",
        "round", "ib_write_lat", "rrpc", "ib_write_lat", "rrpc/ib_write_lat (mean)"
    );
    let mut all = Vec::with_capacity(rounds as usize);
    for i in 1..=rounds {
        let before = sides.perftest(PERFTEST_BYTES, iterations)?;
        let s = rrpc_rtt(c, sides, &cfg).context("peer rrpc")?;
        let after = sides.perftest(PERFTEST_BYTES, iterations)?;
        jsonl::point_with(
            "peers-perftest-rounds",
            json!({ "round": i, "peer": "rrpc", "mean_ns": s.mean_ns(), "round_trips": s.round_trips, "write_lat_rtt_ns": before.rtt_ns(), "write_lat_after_rtt_ns": after.rtt_ns() }),
            Some(&s.hist),
        );
        let r = PerftestRound {
            write_lat_ns: before.rtt_ns(),
            rrpc_ns: s.hist.value_at_quantile(0.5),
            write_lat_after_ns: after.rtt_ns(),
        };
        let note = speed_note(r.mixed(SPEED_GAP));
        println!(
            "{:>6} {:>14.0} {:>10} {:>14.0} {:>26.2}{note}",
            i,
            r.write_lat_ns,
            r.rrpc_ns,
            r.write_lat_after_ns,
            r.ratio()
        );
        all.push(r);
    }
    let (median, left_out) = perftest_median(&all, SPEED_GAP);
    if median.is_nan() {
        println!(
            "ratio rtt rrpc/ib_write_lat: none (every round's two {} figures differ by more than {SPEED_GAP}x)",
            perftest::WRITE_LAT
        );
    } else {
        println!(
            "ratio rtt rrpc/ib_write_lat = {median:.2}  (median of {} rounds, {left_out} left out)",
            all.len() - left_out
        );
    }
    Ok(json!({
        "tool": perftest::WRITE_LAT, "bytes": PERFTEST_BYTES, "iterations": iterations,
        "rounds": all, "speed_gap": SPEED_GAP, "rounds_left_out": left_out,
        "ratio_rtt_rrpc_ib_write_lat": if median.is_nan() { None } else { Some(median) },
    }))
}

/// The end of a round's line: whether the machine's speed changed inside it, which
/// leaves it out of the medians.
fn speed_note(mixed: bool) -> &'static str {
    if mixed {
        "  (speed changed: left out)"
    } else {
        ""
    }
}

/// `peers --rounds`: `rounds` times the floor, the fabric, rrpc, iceoryx2 and the floor
/// again back to back (one point each), printing each round's p50s and ratios as it ends,
/// then the median ratios of each speed's rounds ([`peers::rounds::group_by_floor`]).
fn matched_rounds(c: &Common, sides: &Sides, rounds: u32) -> Result<serde_json::Value> {
    use peers::rounds::{group_by_floor, Round, SPEED_GAP};
    let cfg = peer_config(c);
    println!(
        "\n== peers, {rounds} matched rounds: floor, fabric, rrpc, iceoryx2 and the floor again back to back, p50 in ns, {} ms each ({} ms warm-up); a ratio compares points of one round",
        c.duration_ms(), c.warmup_ms()
    );
    println!(
        "{:>6} {:>7} {:>7} {:>7} {:>9} {:>7} {:>11} {:>12} {:>13} {:>14}",
        "round",
        "floor",
        "fabric",
        "rrpc",
        "iceoryx2",
        "floor",
        "rrpc/floor",
        "rrpc/fabric",
        "fabric/floor",
        "rrpc/iceoryx2"
    );
    let mut all = Vec::with_capacity(rounds as usize);
    for i in 1..=rounds {
        // Each peer's point of the round goes to the --json file as it is measured, with
        // its histogram; the round's table line needs only the p50.
        let p50 = |name: &str, r: Result<RttSamples>| -> Result<u64> {
            let s = r.with_context(|| format!("peer {name}"))?;
            jsonl::point_with(
                "peers-rounds",
                json!({ "round": i, "peer": name, "mean_ns": s.mean_ns(), "round_trips": s.round_trips }),
                Some(&s.hist),
            );
            Ok(s.hist.value_at_quantile(0.5))
        };
        let r = Round {
            floor: p50("floor", peers::floor_rtt(&cfg))?,
            fabric: p50("fabric", fabric_floor_rtt(sides, &cfg))?,
            rrpc: p50("rrpc", rrpc_rtt(c, sides, &cfg))?,
            iceoryx2: p50("iceoryx2", peers::iceoryx2_rtt(&cfg))?,
            floor_after: p50("floor-after", peers::floor_rtt(&cfg))?,
        };
        let q = r.ratios();
        let note = speed_note(r.mixed(SPEED_GAP));
        println!(
            "{:>6} {:>7} {:>7} {:>7} {:>9} {:>7} {:>11.2} {:>12.2} {:>13.2} {:>14.2}{note}",
            i,
            r.floor,
            r.fabric,
            r.rrpc,
            r.iceoryx2,
            r.floor_after,
            q.rrpc_floor,
            q.rrpc_fabric,
            q.fabric_floor,
            q.rrpc_iceoryx2
        );
        all.push(r);
    }
    let grouping = group_by_floor(&all, SPEED_GAP);
    println!(
        "rounds by machine speed (floors more than {SPEED_GAP}x apart are different speeds), median ratios:"
    );
    for g in &grouping.groups {
        let m = &g.median;
        println!(
            "  floor {}-{} ns, {} rounds: rrpc/floor = {:.2}, rrpc/fabric = {:.2}, fabric/floor = {:.2}, rrpc/iceoryx2 = {:.2}",
            g.floor_min_ns, g.floor_max_ns, g.rounds, m.rrpc_floor, m.rrpc_fabric, m.fabric_floor, m.rrpc_iceoryx2
        );
    }
    if grouping.mixed > 0 {
        println!(
            "  {} round(s) left out: their two floors differ by more than {SPEED_GAP}x, so the speed changed within them",
            grouping.mixed
        );
    }
    Ok(
        json!({ "rounds": all, "speed_gap": SPEED_GAP, "groups": grouping.groups, "mixed_rounds_left_out": grouping.mixed }),
    )
}
