//! `txn-bench --suite rcc`: RCC's comparison of concurrency-control protocols, each over
//! two-sided RPC and over one-sided RDMA (RCC: A Comprehensive Evaluation of RDMA-enabled
//! Concurrency Control Protocols, 5). Every run is a fresh symmetric cluster (the `rcc`
//! crate: nodes holding partitions, serving handlers and running coordinators on one
//! thread each), checked after the run (the workload's check, locks free,
//! serializability). One table per invocation: one row per protocol and variant, the
//! `onesided/rpc` ratio per protocol, and the best protocol of each variant; with
//! `--sweep`, one table per point and a chart; with `--transport-compare`, the RPC
//! variant over tonic too (`tcp` rows, the `rpc/tcp` ratio: RCC, 5, Table 3).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use rcc::calls::CallTransportFactory;
use rcc::cluster::{run, Outcome, RunConfig, TsMode};
use rcc::coord::STAGES;
use rcc::tpcc::NewOrder;
use rcc::workload::Workload;
use rcc::{Proto, Variant};
use rrpc::fabric::FabricKind;
use serde::Serialize;

use crate::plot::{LineChart, Scale, Series};
use crate::rcc_node::{run_processes, NodeFaults};
use crate::rcc_tcp::TonicCalls;
use crate::rcc_workload::RccWorkload;

/// RCC's suite: NOWAIT, WAITDIE, OCC, MVCC, SUNDIAL and CALVIN,
/// each over RPC and over one-sided RDMA, on SmallBank, YCSB with a hot area or TPC-C
/// New-Order, on a
/// fresh local cluster per run. RPC here is rrpc over RC Rockets, not RCC's UD
/// SEND/RECV: ratios between the variants compare, absolute packet rates do not.
/// --chart draws a --sweep: throughput per protocol and variant against the swept value.
#[derive(Parser, Debug, Clone)]
#[command(name = "txn-bench --suite rcc", version, about, long_about = None)]
pub struct RccArgs {
    /// The suite (this parser serves `rcc` only).
    #[arg(long, value_name = "SUITE")]
    pub suite: String,
    /// Protocol: nowait, waitdie, occ, mvcc, sundial, calvin, a comma-separated list of
    /// them, or all.
    #[arg(long, default_value = "all", value_name = "PROTOCOL")]
    pub protocol: String,
    /// Primitive: rpc, onesided or both.
    #[arg(long, default_value = "both", value_name = "VARIANT")]
    pub variant: String,
    /// Nodes (each holds a partition and runs one thread: handlers and coordinators).
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub nodes: usize,
    /// Coordinator co-routines per node (RCC: 10).
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub coroutines: usize,
    /// The workload and its parameters.
    #[command(flatten)]
    pub wl: RccWorkload,
    /// `--duration` of each run (default 3 s) and `--warmup` (default 0): each run's
    /// coordinators run warm-up + duration; the table (throughput, latencies, aborts,
    /// round trips, operations, messages and stages per transaction) covers the time
    /// after the warm-up, a transaction in flight at its end counted when it ends (CALVIN:
    /// from the first epoch that starts after it); the checks cover the whole run.
    #[command(flatten)]
    pub run: crate::cli::RunLength,
    /// Repeat at each point: coroutines=1,3,5,... (per node), hot-prob=0.1,0.3,...,
    /// or compute-us=1,4,16,...; one table per point, and with --chart a chart.
    #[arg(long, value_name = "PARAM=V1,V2,...")]
    pub sweep: Option<String>,
    /// `--json` (JSON Lines: the metadata record, one `run` record per run as it ends,
    /// the summary) and `--chart` (the sweep: throughput per protocol and variant against
    /// the swept value).
    #[command(flatten)]
    pub out: crate::cli::OutputArgs,
    /// `--fabric` and `--model` (contention results mean little without a model on shm).
    #[command(flatten)]
    pub fabric_args: crate::cli::FabricArgs,
    /// Also run one-sided NOWAIT, WAITDIE and OCC with doorbell batching off (rows
    /// `onesided-nodb`: each record's second operation in its own doorbell) and print
    /// `ratio throughput doorbell-batching on/off P = X` (RCC 4.2: +25.1% for one-sided
    /// NOWAIT on SmallBank).
    #[arg(long)]
    pub doorbell_ablation: bool,
    /// Also run each protocol's RPC variant with every message over tonic (gRPC, HTTP/2
    /// over loopback TCP; rows `tcp`, the coordinators still on the nodes' rrpc threads)
    /// and print `ratio throughput rpc/tcp P = X` (RCC, 5, Table 3: its RDMA RPC is
    /// 5.2-10x TCP). Needs the RPC variant.
    #[arg(long)]
    pub transport_compare: bool,
    /// Where WAITDIE's and MVCC's timestamps come from: local (each coordinator's clock
    /// with its id in the low bits, as RCC takes them) or tso (this project's timestamp
    /// oracle, started on a node of its own: one one-sided FAA per group of a thread's
    /// requests). SUNDIAL's logical leases and CALVIN's sequence need none.
    #[arg(long, default_value = "local", value_name = "SOURCE")]
    pub ts: String,
    /// `--seed` of the transaction generators.
    #[command(flatten)]
    pub seed: crate::cli::SeedArg,
    /// Run every node as an `rcc-node` process of its own (its partition, handlers and
    /// coordinators; the binary next to txn-bench), so that one can be killed or
    /// stopped alone. Not with --transport-compare.
    #[arg(long)]
    pub processes: bool,
    /// With --processes: kill -9 one node (--fault-node) this long after the
    /// coordinators started. RCC keeps no replicas or logs: the run then fails, naming
    /// the node, after stopping the others.
    #[arg(long, value_name = "TIME", requires = "processes")]
    pub kill_node_after: Option<crate::cli::Span>,
    /// With --processes: SIGSTOP one node (--fault-node) this long after the
    /// coordinators started, for --stop-ms, then SIGCONT; the others' calls to it wait
    /// and the run goes on.
    #[arg(long, value_name = "TIME", requires = "processes")]
    pub stop_node_after: Option<crate::cli::Span>,
    /// How long --stop-node-after keeps the node stopped, milliseconds (below rrpc's
    /// 2 s call timeout, or the others' calls fail and the run with them).
    #[arg(long, default_value_t = 300, value_name = "MS")]
    pub stop_ms: u64,
    /// The node --kill-node-after and --stop-node-after hit (default: the last).
    #[arg(long, value_name = "N")]
    pub fault_node: Option<usize>,
}

/// The suite's defaults for the shared flags: 3 s runs.
pub const DEFAULTS: &[(&str, &str)] = &[("duration", "3s")];

/// One run's results.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// Protocol name.
    pub protocol: &'static str,
    /// Variant name.
    pub variant: &'static str,
    /// The swept parameter's value at this run, if any.
    pub point: Option<f64>,
    /// Committed transactions per second.
    pub throughput: f64,
    /// Median latency of committed transactions (retries included), microseconds.
    pub p50_us: f64,
    /// 99th percentile latency, microseconds.
    pub p99_us: f64,
    /// Retried attempts over all attempts.
    pub abort_rate: f64,
    /// Committed transactions measured (after the warm-up).
    pub committed: u64,
    /// Committed transactions the checks covered (the whole run's history, the
    /// warm-up's included).
    pub checked_committed: u64,
    /// `--warmup`, seconds (0: none).
    pub warmup_s: f64,
    /// Network round trips per committed transaction.
    pub rounds_per_txn: f64,
    /// One-sided work requests per committed transaction.
    pub ops_per_txn: f64,
    /// RPC messages per committed transaction.
    pub msgs_per_txn: f64,
    /// rrpc WRs per doorbell on the nodes' threads.
    pub wrs_per_doorbell: f64,
    /// Mean time per committed transaction in each stage, microseconds, by name.
    pub stages_us: Vec<(&'static str, f64)>,
    /// The checks that passed, or the failure.
    pub checks: Result<Vec<String>, String>,
    /// The watchdog found no progress.
    pub stalled: bool,
    /// One-sided lock CASes that returned the attempt's own owner value and were taken
    /// as acquired (`rcc::coord::Stats::replayed_cas`; 0 on shm).
    pub replayed_cas: u64,
}

fn parse_list<T: Copy>(s: &str, all: &[T], name: &dyn Fn(&T) -> &str) -> anyhow::Result<Vec<T>> {
    if s == "all" || s == "both" {
        return Ok(all.to_vec());
    }
    s.split(',')
        .map(|x| {
            all.iter().copied().find(|p| name(p) == x).with_context(|| {
                format!(
                    "unknown value {x:?}; expected one of {}",
                    all.iter().map(name).collect::<Vec<_>>().join(", ")
                )
            })
        })
        .collect()
}

impl RccArgs {
    fn protocols(&self) -> anyhow::Result<Vec<Proto>> {
        parse_list(&self.protocol, &Proto::ALL, &|p: &Proto| p.name())
    }

    fn variants(&self) -> anyhow::Result<Vec<Variant>> {
        parse_list(
            &self.variant,
            &[Variant::Rpc, Variant::OneSided],
            &|v: &Variant| v.name(),
        )
    }

    fn sweep(&self) -> anyhow::Result<Option<(String, Vec<f64>)>> {
        let Some(s) = &self.sweep else {
            return Ok(None);
        };
        let Some((k, vs)) = s.split_once('=') else {
            bail!("--sweep {s:?}: expected PARAM=V1,V2,...");
        };
        if !["coroutines", "hot-prob", "compute-us"].contains(&k) {
            bail!("--sweep {k}: the suite sweeps coroutines, hot-prob or compute-us");
        }
        let vs = vs
            .split(',')
            .map(|v| {
                v.parse::<f64>()
                    .with_context(|| format!("--sweep value {v:?}"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Some((k.to_string(), vs)))
    }
}

fn row(p: Proto, v: Variant, point: Option<f64>, o: &Outcome) -> Row {
    let r = &o.report;
    let n = r.commits.max(1) as f64;
    let secs = o.elapsed.as_secs_f64().max(1e-9);
    Row {
        protocol: p.name(),
        variant: v.name(),
        point,
        throughput: r.commits as f64 / secs,
        p50_us: r.latency.value_at_quantile(0.5) as f64 / 1e3,
        p99_us: r.latency.value_at_quantile(0.99) as f64 / 1e3,
        abort_rate: r.abort_rate(),
        committed: r.commits,
        checked_committed: r.history.len() as u64,
        warmup_s: 0.0,
        rounds_per_txn: r.stats.rounds as f64 / n,
        ops_per_txn: r.stats.ops as f64 / n,
        msgs_per_txn: r.stats.msgs as f64 / n,
        wrs_per_doorbell: o.rrpc.wrs as f64 / o.rrpc.doorbells.max(1) as f64,
        stages_us: STAGES
            .iter()
            .enumerate()
            .map(|(i, s)| (*s, r.stats.stage_ns[i] as f64 / n / 1e3))
            .collect(),
        checks: match (&o.audit, &r.error, o.stalled) {
            (_, Some(e), _) => Err(format!("coordinator error: {e}")),
            (_, _, true) => Err(format!(
                "stalled: no transaction committed for a watchdog period ({}); checks: {}",
                o.stall.as_deref().unwrap_or("?"),
                match &o.audit {
                    Ok(l) => l.join("; "),
                    Err(e) => e.clone(),
                }
            )),
            (a, _, _) => a.clone(),
        },
        stalled: o.stalled,
        replayed_cas: r.stats.replayed_cas,
    }
}

fn print_table(rows: &[Row]) {
    println!(
        "{:<8} {:<13} {:>10} {:>9} {:>9} {:>7} {:>7} {:>7} {:>6}  stages us/txn ({})  check",
        "protocol",
        "variant",
        "txn/s",
        "p50 us",
        "p99 us",
        "abort%",
        "RT/txn",
        "WR/txn",
        "msg",
        STAGES.join("/")
    );
    for r in rows {
        println!(
            "{:<8} {:<13} {:>10.0} {:>9.1} {:>9.1} {:>7.2} {:>7.2} {:>7.2} {:>6.2}  {}  {}",
            r.protocol,
            r.variant,
            r.throughput,
            r.p50_us,
            r.p99_us,
            100.0 * r.abort_rate,
            r.rounds_per_txn,
            r.ops_per_txn,
            r.msgs_per_txn,
            r.stages_us
                .iter()
                .map(|(_, v)| format!("{v:.1}"))
                .collect::<Vec<_>>()
                .join("/"),
            match &r.checks {
                Ok(_) if r.replayed_cas > 0 =>
                    format!("ok ({} lock CASes replayed)", r.replayed_cas),
                Ok(_) => "ok".to_string(),
                Err(e) => format!("FAILED: {e}"),
            }
        );
    }
    let protos: Vec<&str> = {
        let mut v: Vec<&str> = rows.iter().map(|r| r.protocol).collect();
        v.dedup();
        v
    };
    for p in &protos {
        let get = |v: &str| rows.iter().find(|r| r.protocol == *p && r.variant == v);
        if let (Some(a), Some(b)) = (get("onesided"), get("rpc")) {
            println!(
                "ratio throughput onesided/rpc {p} = {:.3}",
                a.throughput / b.throughput.max(1e-9)
            );
        }
    }
    for p in &protos {
        let get = |v: &str| rows.iter().find(|r| r.protocol == *p && r.variant == v);
        if let (Some(a), Some(b)) = (get("rpc"), get("tcp")) {
            println!(
                "ratio throughput rpc/tcp {p} = {:.3}",
                a.throughput / b.throughput.max(1e-9)
            );
        }
    }
    for p in &protos {
        let get = |v: &str| rows.iter().find(|r| r.protocol == *p && r.variant == v);
        if let (Some(a), Some(b)) = (get("onesided"), get("onesided-nodb")) {
            println!(
                "ratio throughput doorbell-batching on/off {p} = {:.3}",
                a.throughput / b.throughput.max(1e-9)
            );
        }
    }
    for v in ["onesided", "rpc"] {
        if let Some(best) = rows
            .iter()
            .filter(|r| r.variant == v && r.checks.is_ok())
            .max_by(|a, b| a.throughput.total_cmp(&b.throughput))
        {
            println!(
                "best {}: {}",
                if v == "rpc" { "rpc" } else { "one-sided" },
                best.protocol
            );
        }
    }
}

/// Run the suite as `args` says; returns whether every run passed its checks. Errors:
/// bad flags, a cluster that could not start.
pub fn main_with(args: RccArgs) -> anyhow::Result<bool> {
    use crate::cli::as_usage;
    // Flag errors, found before anything starts, are usage errors (exit 2).
    let (protocols, variants, sweep, ts, model_name) = as_usage(check(&args))?;
    let model = (args.fabric_args.fabric == FabricKind::Shm).then(|| model_name.clone());
    crate::jsonl::open(
        args.out.json.as_deref(),
        &crate::jsonl::RunInfo {
            binary: "txn-bench --suite rcc",
            fabric: args.fabric_args.fabric,
            rdma_device: None,
            model: &model_name,
            seed: args.seed.seed,
        },
    )?;
    let faults = NodeFaults {
        node: args.fault_node,
        kill_after: args.kill_node_after.map(|s| s.0),
        stop_after: args.stop_node_after.map(|s| s.0),
        stop_for: Duration::from_millis(args.stop_ms),
    };
    let points: Vec<Option<f64>> = match &sweep {
        Some((_, vs)) => vs.iter().map(|v| Some(*v)).collect(),
        None => vec![None],
    };
    let mut all_rows = Vec::new();
    let mut passed = true;
    for point in points {
        let mut a = args.clone();
        if let (Some((k, _)), Some(v)) = (&sweep, point) {
            match k.as_str() {
                "coroutines" => a.coroutines = v as usize,
                "hot-prob" => a.wl.hot_prob = v,
                "compute-us" => a.wl.compute_us = v as u64,
                _ => unreachable!("checked"),
            }
        }
        let wl = crate::cli::as_usage(a.wl.build(a.nodes))?;
        let mut rows = Vec::new();
        let mut header = None;
        // (protocol, variant, doorbell batching, calls over tonic)
        let mut runs: Vec<(Proto, Variant, bool, bool)> = Vec::new();
        for &p in &protocols {
            for &v in &variants {
                runs.push((p, v, true, false));
                if args.transport_compare && v == Variant::Rpc {
                    runs.push((p, v, true, true));
                }
                // MVCC's and SUNDIAL's lists are always batched; CALVIN has none.
                let switchable = matches!(p, Proto::NoWait | Proto::WaitDie | Proto::Occ);
                if args.doorbell_ablation && v == Variant::OneSided && switchable {
                    runs.push((p, v, false, false));
                }
            }
        }
        {
            for (p, v, batching, tcp) in runs {
                let cfg = RunConfig {
                    fabric: a.fabric_args.fabric,
                    model: model.clone(),
                    nodes: a.nodes,
                    coroutines: a.coroutines,
                    proto: p,
                    variant: v,
                    duration: a.run.duration(),
                    warmup: a.run.warmup(),
                    seed: a.seed.seed,
                    history_bytes: 16 << 20,
                    fault: None,
                    doorbell_batching: batching,
                    ts,
                    watchdog: Duration::from_secs(2),
                    calls: tcp.then(|| Arc::new(TonicCalls) as Arc<dyn CallTransportFactory>),
                };
                let vname = match (batching, tcp) {
                    (_, true) => "tcp",
                    (false, _) => "onesided-nodb",
                    _ => v.name(),
                };
                eprintln!("running {} {vname} ...", p.name());
                let o = if args.processes {
                    let (o, events) = run_processes(&cfg, &a.wl, &faults, None)
                        .with_context(|| format!("{} {vname}", p.name()))?;
                    for e in events.lines {
                        eprintln!("{} {vname}: {e}", p.name());
                    }
                    o
                } else {
                    run(&cfg, wl.clone()).with_context(|| format!("{} {vname}", p.name()))?
                };
                header.get_or_insert_with(|| o.fabric.clone());
                let mut r = row(p, v, point, &o);
                r.variant = vname;
                r.warmup_s = a.run.warmup().as_secs_f64();
                passed &= r.checks.is_ok();
                let mut rec = serde_json::to_value(&r)?;
                if let serde_json::Value::Object(m) = &mut rec {
                    m.extend(crate::jsonl::latency_fields(&o.report.latency));
                }
                crate::jsonl::record("run", &rec);
                rows.push(r);
            }
        }
        println!(
            "\n=== RCC suite: {} on {} nodes{} x 1 thread x {} coroutines, {}{} s per run{}",
            wl.name(),
            a.nodes,
            if args.processes {
                " (rcc-node processes)"
            } else {
                " (in one process)"
            },
            a.coroutines,
            match a.run.warmup() {
                w if w.is_zero() => String::new(),
                w => format!("warm-up {} s (not measured) + ", w.as_secs_f64()),
            },
            a.run.secs(),
            match (&sweep, point) {
                (Some((k, _)), Some(v)) => format!(", {k} = {v}"),
                _ => String::new(),
            }
        );
        println!(
            "fabric: {} (RPC here is rrpc over RC Rockets, not UD SEND/RECV as in RCC)",
            header.unwrap_or_default()
        );
        println!(
            "timestamps (WAITDIE, MVCC): {}",
            match ts {
                TsMode::Local => "local clocks with the coordinator's id (RCC)",
                TsMode::Tso => "the timestamp oracle (one FAA per group of a thread's requests)",
            }
        );
        if args.transport_compare {
            println!(
                "tcp = the RPC variant with every message over tonic (gRPC, HTTP/2 over loopback TCP); coordinators still on the nodes' rrpc threads"
            );
        }
        if wl.name() == "ycsb" {
            println!(
                "ycsb-rcc: {} records, hot area {} drawn with p = {}, {} ops, {} writes, {} us compute",
                a.wl.records, a.wl.hot_records, a.wl.hot_prob, a.wl.ops, a.wl.write_prob, a.wl.compute_us
            );
        }
        if wl.name() == "tpcc-neworder" {
            let w = a.wl.warehouses.unwrap_or(a.nodes as u64);
            let mb = NewOrder {
                items: a.wl.items,
                customers: a.wl.customers,
                ..NewOrder::standard(a.nodes, w, a.wl.max_orders)
            }
            .bytes_per_node(16, 1)
            .div_ceil(1 << 20);
            println!(
                "tpcc-neworder: {w} warehouses x 10 districts, {} customers per district, {} items (replicated), room for {} orders per district ({mb} MiB per node in the NOWAIT/OCC tuple shape, about 3x for MVCC)",
                a.wl.customers, a.wl.items, a.wl.max_orders
            );
        }
        print_table(&rows);
        if wl.name() == "tpcc-neworder" {
            // The New-Order check's line: orders, order lines, New-Orders refused because
            // their district was full.
            for r in &rows {
                if let Ok(lines) = &r.checks {
                    if let Some(l) = lines.iter().find(|l| l.starts_with("tpc-c")) {
                        println!("{} {}: {l}", r.protocol, r.variant);
                    }
                }
            }
        }
        all_rows.extend(rows);
    }
    if let (Some(path), Some((k, _))) = (&args.out.chart, &sweep) {
        let mut series: Vec<Series> = Vec::new();
        for r in &all_rows {
            let name = format!("{} {}", r.protocol, r.variant);
            let x = r.point.unwrap_or(0.0);
            match series.iter_mut().find(|s| s.name == name) {
                Some(s) => s.points.push((x, r.throughput)),
                None => series.push(Series {
                    name,
                    points: vec![(x, r.throughput)],
                    labels: Vec::new(),
                }),
            }
        }
        LineChart {
            title: "RCC suite: throughput",
            x_label: k,
            y_label: "committed txn/s",
            x_scale: Scale::Linear,
            y_scale: Scale::Linear,
            series: &series,
        }
        .draw(path)?;
        println!("chart: {}", path.display());
    } else if args.out.chart.is_some() {
        eprintln!("--chart draws a sweep: add --sweep");
    }
    crate::jsonl::summary(&serde_json::json!({ "runs": all_rows, "passed": passed }));
    crate::jsonl::close();
    println!(
        "\n{}",
        if passed {
            "verdict: every run passed its checks"
        } else {
            "verdict: FAILED: a run failed its checks"
        }
    );
    Ok(passed)
}

/// What [`main_with`] needs checked before anything starts: the protocols, variants,
/// sweep, timestamp source and timing model.
type Checked = (
    Vec<Proto>,
    Vec<Variant>,
    Option<(String, Vec<f64>)>,
    TsMode,
    String,
);

/// Check the flags (errors: the first bad one, by name).
fn check(args: &RccArgs) -> anyhow::Result<Checked> {
    if args.suite != "rcc" {
        bail!("unknown suite {:?}: the only suite is rcc", args.suite);
    }
    args.run.check()?;
    // The cluster's own bound (`rcc::cluster`), checked here so that it is a usage error.
    if args.nodes == 0 || args.coroutines == 0 || args.nodes * args.coroutines >= 1024 {
        bail!(
            "{} nodes x {} coroutines: need at least one of each and fewer than 1024 coordinators",
            args.nodes,
            args.coroutines
        );
    }
    let protocols = args.protocols()?;
    let variants = args.variants()?;
    if args.transport_compare && !variants.contains(&Variant::Rpc) {
        bail!("--transport-compare compares the RPC variant's transports: it needs --variant rpc or both");
    }
    let sweep = args.sweep()?;
    if args.processes && args.transport_compare {
        bail!("--processes runs the nodes on rrpc only: --transport-compare runs in one process");
    }
    if args.fault_node.is_some_and(|n| n >= args.nodes) {
        bail!(
            "--fault-node {}: the nodes are 0 to {}",
            args.fault_node.unwrap_or_default(),
            args.nodes - 1
        );
    }
    if args.kill_node_after.is_some() && args.stop_node_after.is_some() {
        bail!("--kill-node-after and --stop-node-after: one fault per run");
    }
    let ts = match args.ts.as_str() {
        "local" => TsMode::Local,
        "tso" => TsMode::Tso,
        t => bail!("unknown timestamp source {t:?}: local or tso"),
    };
    let model = args.fabric_args.model()?;
    Ok((protocols, variants, sweep, ts, model))
}

/// Whether the command line asks for a suite (`--suite S` or `--suite=S`): the suite's
/// own parser then takes the whole command line.
pub fn wants_suite(args: &[std::ffi::OsString]) -> bool {
    args.iter()
        .any(|a| a == "--suite" || a.to_str().is_some_and(|s| s.starts_with("--suite=")))
}
