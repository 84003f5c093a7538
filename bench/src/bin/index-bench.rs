//! `index-bench`: YCSB A-E over the B-link tree of `rtx::blink`, run by rTX (the tree in
//! repairable transactions), by Optimal (Sherman's own locking, no logs) and by a
//! DTX-style variant of Optimal (value logging before each write-back), side by side
//! (Transactional Indexes on Disaggregated Memory with Repairable Transaction, 6 Fig. 11).
//!
//! Each protocol gets its own memory node (an rTX region with 1 KB blocks, hosted in this
//! process on the fabric of `--fabric`: shm under a timing model, `cx5` by default as in
//! every benchmark binary, or verbs through the local RDMA device) and its own client
//! threads, each running coroutines with one rTX client (or Optimal handle) each. The
//! tree is loaded with `--keys` keys by inserts, then each workload runs for `--duration`
//! after `--warmup`. Afterwards the tree is checked (fences, order, sibling chain against
//! parents, every acknowledged key present) and, for rTX, that no object is locked and no
//! log unfinished.
//!
//! The command line is the benchmarks' convention (`bench::cli`): `--fabric`, `--model`,
//! `--duration`, `--warmup` (the old `--duration-ms` / `--warmup-ms` hidden aliases),
//! `--seed`, `--json` (JSON Lines, `bench::jsonl`: the metadata record, one `ycsb` point
//! per protocol and workload with its latency histogram, the summary) and `--chart`;
//! exit code 2 for a usage error, 1 for a failed check or a run-time error.

use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use bench::plot::{LineChart, Scale, Series};
use bench::{cli, jsonl};
use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use rrpc::fabric::shm::ClusterGuard;
use rrpc::fabric::{Fabric, FabricConfig};
use rrpc::node::{Node, NodeConfig};
use rrpc::runtime::{Executor, ThreadCtx};
use rrpc::NodeId;
use rtx::blink::check::{check_quiescent, check_tree};
use rtx::blink::optimal::Optimal;
use rtx::blink::{init_hosted, Blink, FIRST_FREE_OBJ};
use rtx::host::{host, EXPORT_KEY};
use rtx::lease::SystemClock;
use rtx::rrpc_mem::RrpcMem;
use rtx::{Client, Config, Layout};
use serde_json::json;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "index-bench",
    about = "YCSB A-E over a B-link tree: rTX against Optimal (Sherman's locking)",
    long_about = "YCSB A-E over the rtx::blink B-link tree (1 KB nodes, u64 keys and values), \
                  run by rTX (every operation one repairable transaction; single-leaf updates \
                  by Opt1, splits logged) and by Optimal (Sherman's CAS lock, READ, WRITE \
                  back + unlock), each on its own memory node on the shm fabric under a \
                  timing model (or on verbs). Prints throughput and p50/p99 latency per \
                  protocol and workload, the ratios rTX/Optimal and rTX/DTX, and checks the \
                  tree afterwards. With --json writes JSON Lines (a metadata record, one \
                  record per protocol and workload with the latency histogram, the summary); \
                  with --chart draws throughput per workload, one line per protocol."
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
    /// Protocols to run: rtx, optimal, dtx (Optimal's locking plus DTX-style value
    /// logging of every node before its write-back) or all (the three, for the ratios).
    #[arg(long, value_enum, default_value_t = Proto::All)]
    protocol: Proto,
    /// Workloads, comma-separated, among a (50% read, 50% update), b (95/5), c (read
    /// only), d (95% read-latest, 5% insert), e (95% scans of 1-100 keys, 5% insert).
    #[arg(long, default_value = "a,b,c,d,e", value_delimiter = ',')]
    workload: Vec<Workload>,
    /// Keys loaded before the workloads (8 B keys, 8 B values).
    #[arg(long, default_value_t = 50_000)]
    keys: u64,
    /// Zipf theta of key choice (0 = uniform; the paper's skewed runs use 0.99).
    #[arg(long, default_value_t = 0.0)]
    zipf: f64,
    /// Client threads per protocol (each its own fabric node and runtime).
    #[arg(long, default_value_t = 1)]
    threads: u16,
    /// Coroutines per thread, each one client (rTX ID or lock owner).
    #[arg(long, default_value_t = 8)]
    coroutines: u16,
    /// Objects (nodes) of the region; the data pool has four times as many 1 KB blocks
    /// (copy-on-write updates hold replaced blocks for 100 ms before reuse).
    #[arg(long, default_value_t = 32_768)]
    objects: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Proto {
    Rtx,
    Optimal,
    Dtx,
    All,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Workload {
    A,
    B,
    C,
    D,
    E,
}

impl Workload {
    /// Percent of operations that read (lookup or scan); the rest update (A, B) or
    /// insert new keys (D, E).
    fn read_pct(self) -> u32 {
        match self {
            Workload::A => 50,
            Workload::B => 95,
            Workload::C => 100,
            Workload::D | Workload::E => 95,
        }
    }
    /// The workload's name in output: `ycsb-a` ... `ycsb-e`.
    fn name(self) -> String {
        format!("ycsb-{self:?}").to_lowercase()
    }
}

impl Proto {
    /// The protocol's name in output (`rtx`, `optimal`, `dtx`).
    fn name(self) -> String {
        format!("{self:?}").to_lowercase()
    }
}

/// Key of the `i`-th key index: an odd multiplier scatters indices over u64 (bijective).
fn key_of(i: u64) -> u64 {
    let k = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    if k == u64::MAX {
        0x5555
    } else {
        k
    }
}

/// One protocol's handle on the tree.
enum Handle {
    Rtx(Box<Client<SystemClock>>, Blink),
    Optimal(Optimal),
}

impl Handle {
    async fn lookup(&mut self, m: &RrpcMem, k: u64) -> Result<Option<u64>> {
        Ok(match self {
            Handle::Rtx(c, t) => t.lookup(c, m, k).await?,
            Handle::Optimal(t) => t.lookup(m, k).await?,
        })
    }
    async fn insert(&mut self, m: &RrpcMem, k: u64, v: u64) -> Result<Option<u64>> {
        Ok(match self {
            Handle::Rtx(c, t) => t.insert(c, m, k, v).await?,
            Handle::Optimal(t) => t.insert(m, k, v).await?,
        })
    }
    async fn scan(&mut self, m: &RrpcMem, k: u64, n: usize) -> Result<usize> {
        Ok(match self {
            Handle::Rtx(c, t) => t.scan(c, m, k, n).await?.len(),
            Handle::Optimal(t) => t.scan(m, k, n).await?.len(),
        })
    }
    fn aborts(&self) -> u64 {
        match self {
            Handle::Rtx(c, _) => c.stats().aborts,
            Handle::Optimal(t) => t.stats().aborts,
        }
    }
}

/// Results of one phase on one thread.
struct PhaseOut {
    ops: u64,
    hist: Histogram<u64>,
    aborts: u64,
}

/// The phase plan: phase 0 loads, phase p >= 1 runs `workloads[p - 1]`.
struct Plan {
    args: Args,
    layout: Layout,
    proto: Proto,
    /// Key indices inserted so far (loaded plus D/E inserts): the next new index.
    next_index: AtomicU64,
}

impl Plan {
    fn clients(&self) -> u64 {
        self.args.threads as u64 * self.args.coroutines as u64
    }
    /// Object range of client `slot` in phase `phase`.
    fn objs(&self, phase: u64, slot: u64) -> std::ops::Range<u64> {
        let phases = self.args.workload.len() as u64 + 1;
        let per = (self.layout.objects - FIRST_FREE_OBJ) / (phases * self.clients());
        let first = FIRST_FREE_OBJ + (phase * self.clients() + slot) * per;
        first..first + per
    }
    fn handle(&self, phase: u64, slot: u64) -> Handle {
        let id = (phase * self.clients() + slot) as u16;
        match self.proto {
            Proto::Rtx => Handle::Rtx(
                Box::new(Client::new(
                    self.layout,
                    id,
                    2,
                    SystemClock,
                    Config::default(),
                )),
                Blink::new(self.layout, self.objs(phase, slot)),
            ),
            Proto::Dtx => Handle::Optimal(Optimal::dtx(self.layout, id, self.objs(phase, slot))),
            _ => Handle::Optimal(Optimal::new(self.layout, id, self.objs(phase, slot))),
        }
    }
}

async fn run_client(
    plan: Arc<Plan>,
    mem: RrpcMem,
    mut h: Handle,
    phase: u64,
    slot: u64,
    measure_from: Instant,
    stop: Arc<AtomicBool>,
) -> Result<PhaseOut> {
    let mut hist = Histogram::<u64>::new(3)?;
    let mut ops = 0;
    let mut rng = rand::rngs::StdRng::seed_from_u64(plan.args.seed.seed ^ (phase << 32) ^ slot);
    if phase == 0 {
        // Load: client `slot` inserts indices slot, slot + clients, ...
        let mut i = slot;
        while i < plan.args.keys {
            h.insert(&mem, key_of(i), i).await?;
            i += plan.clients();
        }
        return Ok(PhaseOut {
            ops,
            hist,
            aborts: h.aborts(),
        });
    }
    let w = plan.args.workload[phase as usize - 1];
    let zipf = (plan.args.zipf > 0.0)
        .then(|| Zipf::new(plan.args.keys as f64, plan.args.zipf))
        .transpose()?;
    while !stop.load(Ordering::Relaxed) {
        let n = plan.next_index.load(Ordering::Relaxed);
        let pick = |rng: &mut rand::rngs::StdRng| match &zipf {
            Some(z) => z.sample(rng) as u64 - 1,
            None => rng.random_range(0..plan.args.keys),
        };
        let read = rng.random_range(0..100) < w.read_pct();
        let t0 = Instant::now();
        match (w, read) {
            (Workload::D, true) => {
                // Read-latest: the most recently inserted keys are the hottest.
                let back = pick(&mut rng).min(n - 1);
                let i = n - 1 - back;
                h.lookup(&mem, key_of(i)).await?;
            }
            (Workload::E, true) => {
                let len = rng.random_range(1..=100);
                h.scan(&mem, key_of(pick(&mut rng)), len).await?;
            }
            (_, true) => {
                h.lookup(&mem, key_of(pick(&mut rng))).await?;
            }
            (Workload::D | Workload::E, false) => {
                let i = plan.next_index.fetch_add(1, Ordering::Relaxed);
                h.insert(&mem, key_of(i), i).await?;
            }
            (_, false) => {
                let i = pick(&mut rng);
                let old = h.insert(&mem, key_of(i), i + (ops << 32)).await?;
                if old.is_none() {
                    bail!("update of loaded key index {i} found no key");
                }
            }
        }
        if t0 >= measure_from {
            hist.record(t0.elapsed().as_nanos() as u64)?;
            ops += 1;
        }
    }
    Ok(PhaseOut {
        ops,
        hist,
        aborts: h.aborts(),
    })
}

/// One result row: workload, ops/s, p50 us, p99 us, aborts (rTX) or lock retries (Optimal).
type Row = (Workload, f64, f64, f64, u64);

/// What one protocol's run gives: its rows after the tree check, and the load phase's
/// seconds and aborts.
struct ProtocolOut {
    rows: Vec<Row>,
    load_secs: f64,
    load_aborts: u64,
}

/// The region every protocol gets: an object id per client and phase (the load and each
/// workload) plus one, `--objects` objects, four 1 KB data blocks per object.
///
/// Errors: more ids than a `u16` holds, or a layout `rtx` refuses (naming `--objects`).
fn layout(args: &Args) -> Result<Layout> {
    let clients = args.threads as u64 * args.coroutines as u64;
    let phases = args.workload.len() as u64 + 1;
    let ids = u16::try_from(phases * clients + 1).map_err(|_| {
        anyhow::anyhow!(
            "--threads {} x --coroutines {} x {phases} phases: more than 65535 client ids",
            args.threads,
            args.coroutines
        )
    })?;
    let layout = Layout {
        ids,
        max_entries: 16,
        objects: args.objects,
        block_bytes: 1024,
        blocks: args.objects * 4 / 64 * 64,
        reclaim_slots: 64,
    };
    layout.validate().with_context(|| {
        format!(
            "--objects {} ({} data blocks) for {clients} clients",
            args.objects, layout.blocks
        )
    })?;
    Ok(layout)
}

/// One protocol: host a region, load, run each workload (writing a `ycsb` point per
/// workload to the `--json` file as it ends), check the tree.
fn run_protocol(args: &Args, proto: Proto) -> Result<ProtocolOut> {
    let layout = layout(args)?;
    let phases = args.workload.len() as u64 + 1;
    let name = format!("index-bench-{}-{proto:?}", std::process::id());
    // The cluster's name space (shm segments); on verbs it only names the nodes.
    let (cluster, _) = ClusterGuard::new(&name)?;
    let open = |node: u32| -> Result<Fabric> {
        let mut cfg = FabricConfig::new(args.fabric.fabric, cluster.name(), NodeId(node));
        cfg.model = args.fabric.model.clone();
        Ok(Fabric::open(&cfg)?)
    };
    let f = open(1)?;
    let (mr, export) = host(&f, layout)?;
    let mut exports = std::collections::BTreeMap::new();
    exports.insert(EXPORT_KEY.into(), serde_json::to_value(export)?);
    let rpc = args.config.rpc_settings()?;
    let node = Node::start_with(
        f,
        NodeConfig::new("rtx-mn", "127.0.0.1:0".parse()?).with_exports(exports),
        rpc.server.clone(),
    )?;
    let mn = node.addr();
    let connect = |node: u32| -> Result<(Rc<ThreadCtx>, RrpcMem)> {
        let ctx = ThreadCtx::new(open(node)?, rpc.runtime.clone())?;
        let (mem, l) = rtx::host::connect(&ctx, mn)?;
        anyhow::ensure!(l == layout, "exported layout differs");
        Ok((ctx, mem))
    };
    {
        let (ctx, mem) = connect(20)?;
        let mut ex = Executor::new(ctx);
        ex.spawn(async move { init_hosted(&layout, &mem).await.expect("init tree") });
        ex.run();
    }
    let plan = Arc::new(Plan {
        args: args.clone(),
        layout,
        proto,
        next_index: AtomicU64::new(args.keys),
    });
    let mut rows = Vec::new();
    let (mut load_secs, mut load_aborts) = (0.0, 0);
    for phase in 0..phases {
        let stop = Arc::new(AtomicBool::new(false));
        let barrier = Arc::new(Barrier::new(args.threads as usize + 1));
        let (ops, aborts, hist, phase_secs) = std::thread::scope(|scope| -> Result<_> {
            let workers: Vec<_> = (0..args.threads)
                .map(|t| {
                    let (plan, stop, barrier) = (plan.clone(), stop.clone(), barrier.clone());
                    let connect = &connect;
                    scope.spawn(move || -> Result<Vec<PhaseOut>> {
                        let r = connect(100 + t as u32 + 100 * phase as u32);
                        barrier.wait();
                        let measure_from = Instant::now() + plan.args.run.warmup();
                        let (ctx, mem) = r?;
                        let outs = Rc::new(std::cell::RefCell::new(Vec::new()));
                        let mut ex = Executor::new(ctx);
                        for co in 0..plan.args.coroutines {
                            let slot = t as u64 * plan.args.coroutines as u64 + co as u64;
                            let h = plan.handle(phase, slot);
                            let (plan, mem, stop, outs) =
                                (plan.clone(), mem.clone(), stop.clone(), outs.clone());
                            ex.spawn(async move {
                                let r =
                                    run_client(plan, mem, h, phase, slot, measure_from, stop).await;
                                outs.borrow_mut().push(r);
                            });
                        }
                        ex.run();
                        let v: Vec<Result<PhaseOut>> = outs.borrow_mut().drain(..).collect();
                        v.into_iter().collect()
                    })
                })
                .collect();
            barrier.wait();
            let load_start = Instant::now();
            if phase > 0 {
                std::thread::sleep(args.run.warmup() + args.run.duration());
                stop.store(true, Ordering::Relaxed);
            }
            let mut hist = Histogram::<u64>::new(3)?;
            let (mut ops, mut aborts) = (0, 0);
            for w in workers {
                for o in w.join().expect("worker panicked")? {
                    hist.add(&o.hist)?;
                    ops += o.ops;
                    aborts += o.aborts;
                }
            }
            Ok((ops, aborts, hist, load_start.elapsed().as_secs_f64()))
        })?;
        if phase == 0 {
            println!(
                "  {proto:?}: loaded {} keys in {:.2} s ({aborts} aborts)",
                args.keys, phase_secs
            );
            (load_secs, load_aborts) = (phase_secs, aborts);
            continue;
        }
        let w = args.workload[phase as usize - 1];
        let tput = ops as f64 / args.run.secs();
        let (p50, p99) = (
            hist.value_at_quantile(0.5) as f64 / 1000.0,
            hist.value_at_quantile(0.99) as f64 / 1000.0,
        );
        println!(
            "  {proto:?} ycsb-{w:?}: {tput:>10.0} ops/s  p50 {p50:>7.1} us  p99 {p99:>7.1} us  aborts/retries {aborts}"
        );
        jsonl::point_with(
            "ycsb",
            json!({
                "protocol": proto.name(), "workload": w.name(), "ops_per_s": tput,
                "ops": ops, "p50_us": p50, "p99_us": p99, "aborts_and_retries": aborts,
            }),
            Some(&hist),
        );
        rows.push((w, tput, p50, p99, aborts));
    }
    // Check the tree (and, for rTX, locks and logs) from a fresh thread.
    let (ctx, mem) = connect(19)?;
    let mut ex = Executor::new(ctx);
    let result = Rc::new(std::cell::RefCell::new(None));
    let r2 = result.clone();
    ex.spawn(async move {
        let r = async {
            let all = check_tree(&mem, &layout).await?;
            check_quiescent(&mem, &layout).await?;
            Ok::<_, anyhow::Error>(all.len() as u64)
        }
        .await;
        *r2.borrow_mut() = Some(r);
    });
    ex.run();
    let found = result.borrow_mut().take().expect("checker ran")?;
    let expected = plan.next_index.load(Ordering::Relaxed);
    // Every index below next_index was handed to an insert; all of them acknowledged
    // (a run stops only between operations), and keys are distinct.
    if found != expected {
        bail!("{proto:?}: the tree holds {found} keys, {expected} were inserted");
    }
    println!(
        "  {proto:?}: tree check ok ({found} keys, fences, order, sibling chain = parents, no lock held, every rTX log DONE)"
    );
    drop(node);
    drop(mr);
    Ok(ProtocolOut {
        rows,
        load_secs,
        load_aborts,
    })
}

/// index-bench's defaults for the shared flags: 1 s per workload after 200 ms of warm-up.
const DEFAULTS: &[(&str, &str)] = &[("duration", "1s"), ("warmup", "200ms")];

fn main() {
    bench::bench_main::<Args>("index-bench", DEFAULTS, run);
}

/// Check the flags (usage errors, exit code 2, before anything runs), run every protocol,
/// print and write the ratios, the summary and the chart.
fn run(mut args: Args) -> Result<()> {
    if args.keys == 0 || args.threads == 0 || args.coroutines == 0 {
        return Err(cli::usage(
            "--keys, --threads and --coroutines must be positive",
        ));
    }
    if !(args.zipf >= 0.0 && args.zipf.is_finite()) {
        return Err(cli::usage(format!(
            "--zipf {}: a theta must be 0 (uniform) or more",
            args.zipf
        )));
    }
    args.run.check()?;
    args.run.normalize();
    let model = args.fabric.model()?;
    let model_desc = cli::as_usage(rrpc::fabric::model::TimingModel::load(&model))?
        .map_or_else(|| "none".into(), |m| m.describe());
    // From here on `--model` holds the model that runs (the default rule applied).
    args.fabric.model = Some(model.clone());
    cli::as_usage(layout(&args))?;
    jsonl::open(
        args.out.json.as_deref(),
        &jsonl::RunInfo {
            binary: "index-bench",
            fabric: args.fabric.fabric,
            rdma_device: None,
            model: &model,
            seed: args.seed.seed,
        },
    )?;
    println!(
        "index-bench | fabric: {} | timing model: {model_desc} | {} keys | {} thread(s) x {} coroutines | {} | {} (+{} warm-up) per workload",
        args.fabric.fabric,
        args.keys,
        args.threads,
        args.coroutines,
        if args.zipf > 0.0 { format!("zipf {}", args.zipf) } else { "uniform".into() },
        args.run.duration,
        args.run.warmup
    );
    let protos: Vec<Proto> = match args.protocol {
        Proto::All => vec![Proto::Rtx, Proto::Optimal, Proto::Dtx],
        p => vec![p],
    };
    let mut all = Vec::new();
    for &p in &protos {
        all.push((p, run_protocol(&args, p)?));
    }
    let find = |p: Proto| all.iter().find(|(q, _)| *q == p).map(|(_, o)| &o.rows);
    let mut ratios = Vec::new();
    if let Some(r) = find(Proto::Rtx) {
        for (other, name) in [(Proto::Optimal, "optimal"), (Proto::Dtx, "dtx")] {
            let Some(o) = find(other) else { continue };
            for (i, w) in args.workload.iter().enumerate() {
                let q = (r[i].1 / o[i].1, r[i].2 / o[i].2, r[i].3 / o[i].3);
                println!(
                    "ycsb-{w:?}: ratio throughput rtx/{name} = {:.2}  (p50 {:.2}x, p99 {:.2}x)",
                    q.0, q.1, q.2
                );
                ratios.push(json!({
                    "workload": w.name(),
                    "ratio": format!("rtx/{name}"),
                    "throughput": q.0,
                    "p50": q.1,
                    "p99": q.2,
                }));
            }
        }
    }
    let runs: Vec<serde_json::Value> = all
        .iter()
        .flat_map(|(p, o)| {
            o.rows.iter().map(move |&(w, tput, p50, p99, aborts)| {
                json!({
                    "protocol": p.name(),
                    "workload": w.name(),
                    "ops_per_s": tput,
                    "p50_us": p50,
                    "p99_us": p99,
                    "aborts_and_retries": aborts,
                })
            })
        })
        .collect();
    let loads: Vec<serde_json::Value> = all
        .iter()
        .map(|(p, o)| json!({ "protocol": p.name(), "secs": o.load_secs, "aborts": o.load_aborts }))
        .collect();
    jsonl::summary(&json!({
        "bench": "index-bench",
        "index": "blink",
        "model": model,
        "fabric": args.fabric.fabric.to_string(),
        "keys": args.keys,
        "zipf": args.zipf,
        "threads": args.threads,
        "coroutines": args.coroutines,
        "objects": args.objects,
        "duration_ms": args.run.duration().as_millis() as u64,
        "warmup_ms": args.run.warmup().as_millis() as u64,
        "seed": args.seed.seed,
        // Every protocol's tree passed its check: a failed one ends the run with an
        // error before this is written.
        "tree_checks_passed": true,
        "loads": loads,
        "runs": runs,
        "ratios": ratios,
    }));
    if let Some(p) = &args.out.json {
        println!("wrote {}", p.display());
    }
    if let Some(path) = &args.out.chart {
        // The workloads on a linear axis at 1 (A) ... 5 (E), whichever ran.
        let x = |w: Workload| w as usize as f64 + 1.0;
        let series: Vec<Series> = all
            .iter()
            .map(|(p, o)| Series {
                name: p.name(),
                points: o.rows.iter().map(|r| (x(r.0), r.1)).collect(),
                labels: Vec::new(),
            })
            .collect();
        let title = format!("B-link tree throughput per YCSB workload (timing model: {model})");
        LineChart {
            title: &title,
            x_label: "YCSB workload (1 = A ... 5 = E)",
            y_label: "ops/s",
            x_scale: Scale::Linear,
            y_scale: Scale::Log10,
            series: &series,
        }
        .draw(path)?;
        println!("plot: {}", path.display());
    }
    Ok(())
}
