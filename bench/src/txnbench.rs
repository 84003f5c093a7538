//! `txn-bench`'s run: SmallBank, KVS / YCSB ([`crate::ycsb`]), TATP ([`crate::tatp`]) or
//! TPC-C ([`crate::tpcc`]) (`--workload`, [`crate::workload`]) on local clusters over the
//! shm fabric (the binary in `src/bin/txn-bench.rs` parses flags and `--config`
//! files and handles signals; tests call [`run`] directly).
//!
//! Each run starts `--memnodes` memory nodes (the tables partitioned across them by
//! key), a timestamp oracle and, for Scythe, a lock service as child processes, loads
//! the workload's data on the memory nodes, runs `threads x coroutines` coordinators of
//! one protocol ([`txn::coordinator::Protocol`]) for a fixed duration (after `--warmup`,
//! whose transactions are checked but not reported), prints committed throughput,
//! p50/p99 latency of committed transactions and abort rates per transaction type, then checks the run (the `audit` module): the workload's own check
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
//!
//! `--fig3-premise` (with `--protocol mvcc`) runs Lotus's Fig. 3 experiment the same way:
//! `mvcc`, then `mvcc-nocas`, MVCC without its lock CAS
//! ([`txn::coordinator::TxnConfig::unsafe_no_lock_cas`]), and prints
//! `ratio throughput mvcc-nocas/mvcc` with the premise's verdict (>= 1.5x under a timing
//! model that reproduces the memory nodes' CAS bottleneck, `--model cx3-scaled`).
//! `--unsafe-no-cas` runs the variant alone. The variant is UNSAFE (writers are not
//! isolated): its output says so, its checks are off and never reported as passed.
//!
//! Nothing here knows a workload: [`workload_spec`] picks the implementation of
//! `--workload` once, and a run asks it for its data, its transactions and its checks
//! ([`crate::workload::WorkloadSpec`]). A run's steps are `run_one`'s: start the
//! cluster, audit the loaded data, measure (the coordinator coroutines are
//! [`crate::driver`]'s), audit after the run, build the report and check the history.

pub mod cnodes;
pub(crate) mod rounds;
pub(crate) mod served;

use rrpc::NodeId;
use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use anyhow::Context;

use rrpc::fabric::{Fabric, FabricConfig};
use rrpc::runtime::{Executor, RuntimeConfig, ThreadCtx};
use serde::Serialize;
use txn::coordinator::{ClusterAddrs, Isolation, Protocol, TxnClient, TxnConfig};

use crate::breakdown::{Breakdown, ProcessCpu, ToccShare};
pub use crate::config_file::ConfigError;
use crate::launcher::{default_bin_dir, LocalCluster};
use crate::plot::{LineChart, Scale, Series};
use crate::report::{
    comparison, LockdRestart, Ratio, Report, TsoRestart, WorkerStats, NO_CAS_SUFFIX, UNSAFE_LABEL,
};
use crate::timeline::{CnodeTimeline, Fault, Timeline, TimelineReport};
pub use crate::txn_args::{
    Args, IsolationArg, LogPlacementArg, LogSetting, Plant, ProtocolArg, Sweep, MAX_MEMNODES,
};
pub(crate) use crate::txn_args::{Point, NODE_CN, NODE_LOCKD, NODE_MEMNODE, NODE_TSO};
use crate::workload::{AuditCx, Audited, Workload, WorkloadSpec};
use crate::workload::{Coroutine, Mix, RunClock};

/// The registry: the implementation of `args.workload`, its arguments checked.
///
/// Errors: the workload's own flags out of range or given to a workload they do not
/// apply to (`--subscribers 0`, `--hot-accounts` outside SmallBank, `--sweep theta`
/// for a workload whose keys do not follow Zipf theta, ...).
pub fn workload_spec(args: &Args) -> anyhow::Result<Box<dyn WorkloadSpec>> {
    Ok(match args.workload {
        Workload::SmallBank => Box::new(crate::smallbank::SmallBank::from_args(args)?),
        Workload::Kvs
        | Workload::YcsbA
        | Workload::YcsbB
        | Workload::YcsbC
        | Workload::YcsbD
        | Workload::YcsbE
        | Workload::YcsbF => Box::new(crate::ycsb::Ycsb::from_args(args)?),
        Workload::Tatp => Box::new(crate::tatp::Tatp::from_args(args)?),
        Workload::Tpcc => Box::new(crate::tpcc::Tpcc::from_args(args)?),
        Workload::Pairs => Box::new(crate::pairs::Pairs::from_args(args)?),
    })
}

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
    args.threads.get_or_insert(cores.saturating_sub(1).max(1));
    // Flag and topology errors, found before anything starts, are usage errors (exit 2).
    use crate::cli::as_usage;
    as_usage(crate::hosts::apply(&mut args))?;
    if let Some(p) = &args.config {
        let base = args.rpc.clone().unwrap_or_default();
        args.rpc = Some(as_usage(crate::config_file::rpc_settings_in(p, base))?);
    }
    crate::run_runtime::set(args.runtime());
    args.fabric_args.model = Some(args.fabric_args.model()?);
    as_usage(args.validate())?;
    let workload = as_usage(workload_spec(&args))?;
    let ablation = args.ablation.then(|| crate::ablation::rows(&args));
    let (protocols, points) = match &ablation {
        Some(rows) => (
            vec![rows[0].protocol, rows[1].protocol],
            rows.iter().map(|r| r.point.clone()).collect(),
        ),
        None => (as_usage(args.protocols())?, args.points()),
    };
    // Every point's profiles now: a bad theta fails before any cluster starts.
    let mixes = as_usage(
        points
            .iter()
            .map(|p| {
                workload
                    .profiles(p.theta)
                    .with_context(|| format!("--theta {}", p.theta))
            })
            .collect::<anyhow::Result<Vec<_>>>(),
    )?;

    // Each run: the point, the protocol and whether it is the UNSAFE no-CAS variant
    // (--unsafe-no-cas alone; --fig3-premise: mvcc, then the variant).
    let variants: &[bool] = if args.fig3_premise {
        &[false, true]
    } else if args.unsafe_no_cas {
        &[true]
    } else {
        &[false]
    };
    let round: Vec<(usize, Protocol, bool)> = match &ablation {
        Some(rows) => (0..rows.len())
            .map(|i| (i, rows[i].protocol, false))
            .collect(),
        None => (0..points.len())
            .flat_map(|i| {
                protocols
                    .iter()
                    .flat_map(move |&p| variants.iter().map(move |&v| (i, p, v)))
            })
            .collect(),
    };
    if args.rounds > 1 && round.len() < 2 {
        return Err(crate::cli::usage(
            "--rounds compares runs within each round: it needs several runs per round \
             (--protocol all, --sweep, --ablation or --fig3-premise)",
        ));
    }
    // `--rounds N`: the round's runs N times, forward, then backward (rounds.rs).
    let plan: Vec<(usize, Protocol, bool)> = rounds::order(round.len(), args.rounds)
        .into_iter()
        .map(|i| round[i])
        .collect();
    if plan.len() > 1 && args.history_out.is_some() {
        return Err(crate::cli::usage(
            "--history-out takes one run: not with --protocol all or --sweep",
        ));
    }
    let model = args.model();
    crate::jsonl::open(
        args.out.json.as_deref(),
        &crate::jsonl::RunInfo {
            binary: "txn-bench",
            fabric: args.fabric(),
            rdma_device: args.rdma_device.as_deref(),
            model: &model,
            seed: args.seed.seed,
        },
    )?;
    let base = args
        .cluster
        .clone()
        .unwrap_or_else(|| format!("txn-bench-{}", std::process::id()));
    let mut runs = Vec::new();
    for (k, &(pi, protocol, no_cas)) in plan.iter().enumerate() {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let point = &points[pi];
        let name = if no_cas {
            format!("{protocol} UNSAFE no-CAS")
        } else {
            protocol.to_string()
        };
        let what = match &point.label {
            Some(l) => format!("{name} at {l}"),
            None => name,
        };
        // The variant's run: its switch on and every check off.
        let variant;
        let run_args = if no_cas {
            variant = Args {
                unsafe_no_cas: true,
                no_check: true,
                ..args.clone()
            };
            &variant
        } else {
            &args
        };
        // A point that sets a flag of its own (range scans, copies) runs with its own
        // arguments; range scans also make its own workload (TPC-C's scans).
        let point_args = point.args(run_args);
        let run_args = point_args.as_ref().unwrap_or(run_args);
        let point_workload = match point.range_index {
            Some(_) => Some(workload_spec(run_args)?),
            None => None,
        };
        let (run_workload, mix): (&dyn WorkloadSpec, _) = match &point_workload {
            Some(w) => (&**w, w.profiles(point.theta)?),
            None => (&*workload, mixes[pi].clone()),
        };
        let in_round = (args.rounds > 1).then(|| (k / round.len()) as u32 + 1);
        if plan.len() > 1 {
            match in_round {
                Some(n) => eprintln!(
                    "== run {}/{} (round {n}/{}): {what}",
                    k + 1,
                    plan.len(),
                    args.rounds
                ),
                None => eprintln!("== run {}/{}: {what}", k + 1, plan.len()),
            }
        }
        let cluster = if plan.len() > 1 {
            format!("{base}-{}", k + 1)
        } else {
            base.clone()
        };
        let report = match run_one(
            run_args,
            run_workload,
            protocol,
            point,
            mix,
            &cluster,
            &stop,
        ) {
            Err(e) if e.is::<crate::hosts::DryRunDone>() => {
                // Every run starts the same services: one dry run says it all.
                let summary = Summary {
                    workload: workload.label().into(),
                    timing_model: args.model(),
                    protocols: protocols.iter().map(|p| p.name().to_string()).collect(),
                    sweep: None,
                    runs: Vec::new(),
                    ratios: Vec::new(),
                    passed: true,
                    skipped_runs: plan.len(),
                };
                return Ok((summary, Outcome::Passed));
            }
            r => r.with_context(|| format!("run of {what}"))?,
        };
        let mut report = report;
        report.round = in_round;
        print!("{}", report.render());
        if args.out.json.is_some() {
            let mut rec = serde_json::to_value(&report)?;
            if let serde_json::Value::Object(m) = &mut rec {
                m.insert("run".into(), serde_json::json!(k + 1));
                m.extend(crate::jsonl::latency_fields(&report.latency));
            }
            crate::jsonl::record("run", &rec);
        }
        runs.push(report);
    }
    let skipped_runs = plan.len() - runs.len();
    if skipped_runs > 0 {
        eprintln!("interrupted: {skipped_runs} run(s) not started");
    }

    let ratios = rounds::ratios(&runs);
    let passed = !runs.is_empty() && runs.iter().all(Report::passed);
    let summary = Summary {
        workload: workload.label().into(),
        timing_model: runs
            .first()
            .map_or_else(|| args.model(), |r| r.timing_model.clone()),
        protocols: protocols.iter().map(|p| p.name().to_string()).collect(),
        sweep: args.sweep.as_ref().map(Sweep::to_string),
        runs,
        ratios,
        passed,
        skipped_runs,
    };
    if plan.len() > 1 {
        print!("{}", render_comparison(&args, &*workload, &summary));
    }
    if let Some(rows) = &ablation {
        print!("{}", crate::ablation::render(rows, &summary.runs));
    }
    if let Some(p) = &args.out.json {
        crate::jsonl::summary(&serde_json::to_value(&summary)?);
        crate::jsonl::close();
        eprintln!("wrote {}", p.display());
    }
    if let Some(p) = &args.out.chart {
        if !summary.runs.is_empty() {
            draw_chart(p, &args, &*workload, &summary)?;
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
fn render_comparison(args: &Args, workload: &dyn WorkloadSpec, sum: &Summary) -> String {
    let threads = args.threads.unwrap_or(1);
    let setup = match &args.sweep {
        Some(Sweep::Theta(_)) => format!(
            "{threads} thread(s) x {} coroutines | {} | sweep {}",
            args.coroutines,
            workload.scale(),
            args.sweep.as_ref().expect("a sweep")
        ),
        Some(Sweep::Clients(_)) => format!(
            "{threads} thread(s) x clients coroutines | {} | {} | sweep {}",
            workload.scale(),
            workload.skew(args.theta),
            args.sweep.as_ref().expect("a sweep")
        ),
        Some(
            Sweep::CommitLog(_)
            | Sweep::VtcEntries(_)
            | Sweep::LockServing(_)
            | Sweep::RangeIndex(_)
            | Sweep::Replicas(_)
            | Sweep::MaxBackoffUs(_)
            | Sweep::LockPlacement(_),
        ) => format!(
            "{threads} thread(s) x {} coroutines | {} | {} | sweep {}",
            args.coroutines,
            workload.scale(),
            workload.skew(args.theta),
            args.sweep.as_ref().expect("a sweep")
        ),
        None => format!(
            "{threads} thread(s) x {} coroutines | {} | {}",
            args.coroutines,
            workload.scale(),
            workload.skew(args.theta)
        ),
    };
    let mut s = format!(
        "\ncomparison: {} | timing model: {} | fabric: {} | {setup} | {} | {}{} s per run | seed {} | {}\n",
        workload.label(),
        sum.timing_model,
        args.fabric(),
        storage_desc(args, None),
        warmup_desc(args),
        args.duration(),
        args.seed.seed,
        match args.sweep {
            Some(Sweep::MaxBackoffUs(_)) => "backoff cap swept".to_string(),
            _ => format!("backoff up to {} us", args.max_backoff_us),
        }
    );
    if args.rounds > 1 {
        s.push_str(&format!(
            "{} rounds (runs forward, then backward): every ratio is taken within each round, \
             then the median of the rounds\n",
            args.rounds
        ));
    }
    s.push_str(&comparison(&sum.runs));
    if args.rounds > 1 {
        s.push_str(&rounds::medians_table(&sum.runs));
    }
    for r in &sum.ratios {
        s.push_str(&r.line());
        s.push('\n');
    }
    let unchecked: Vec<&str> = sum
        .runs
        .iter()
        .filter(|r| r.unsafe_variant.is_some())
        .map(|r| r.protocol.as_str())
        .collect();
    if !unchecked.is_empty() {
        s.push_str(&format!(
            "{UNSAFE_LABEL}: {} not judged\n",
            unchecked.join(", ")
        ));
    }
    if let Some(line) = crate::report::premise_verdict(&sum.runs, &sum.ratios) {
        s.push_str(&line);
        s.push('\n');
    }
    let failed: Vec<String> = sum
        .runs
        .iter()
        .filter(|r| !r.passed())
        .map(|r| {
            let at: Vec<String> = r
                .point
                .iter()
                .cloned()
                .chain(r.round.map(|k| format!("round {k}")))
                .collect();
            if at.is_empty() {
                r.protocol.clone()
            } else {
                format!("{} ({})", r.protocol, at.join(", "))
            }
        })
        .collect();
    let checked = sum.runs.len() - unchecked.len();
    if failed.is_empty() && checked == 0 {
        s.push_str("checks off (UNSAFE): no run was checked\n");
    } else if failed.is_empty() && !unchecked.is_empty() && sum.skipped_runs == 0 {
        s.push_str("every checked run passed its checks; checks off (UNSAFE) for the no-CAS run\n");
    } else if failed.is_empty() && sum.skipped_runs == 0 {
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
fn draw_chart(
    path: &Path,
    args: &Args,
    workload: &dyn WorkloadSpec,
    sum: &Summary,
) -> anyhow::Result<()> {
    let mut series: Vec<Series> = Vec::new();
    // With --rounds, each protocol's medians over its rounds at each point.
    for r in &rounds::medians(&sum.runs) {
        let pt = (r.throughput_tps, r.p99_us);
        // With a sweep, each point says which it is (`theta=0.99`): the axes alone do
        // not tell which end of a line is which parameter value.
        let label = r.point.clone().filter(|_| args.sweep.is_some());
        match series.iter_mut().find(|s| s.name == r.protocol) {
            Some(s) => {
                s.points.push(pt);
                s.labels.extend(label);
            }
            None => series.push(Series {
                name: r.protocol.clone(),
                points: vec![pt],
                labels: label.into_iter().collect(),
            }),
        }
    }
    // A log latency axis when the p99s span a decade or more (contention sweeps).
    let p99s = sum.runs.iter().map(|r| r.p99_us);
    let (lo, hi) = p99s.fold((f64::INFINITY, 0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let y_scale = if lo > 0.0 && hi / lo >= 10.0 {
        Scale::Log10
    } else {
        Scale::Linear
    };
    let title = match &args.sweep {
        Some(sw) => format!(
            "{}: throughput vs p99, sweep {sw} (model {})",
            workload.label(),
            args.model()
        ),
        None => format!(
            "{}: throughput vs p99, {}, {} x {} clients (model {})",
            workload.label(),
            workload.skew(args.theta),
            args.threads.unwrap_or(1),
            args.coroutines,
            args.model()
        ),
    };
    LineChart {
        title: &title,
        x_label: "committed transactions/s",
        y_label: "p99 latency of committed transactions (us)",
        x_scale: Scale::Linear,
        y_scale,
        series: &series,
    }
    .draw(path)
    .with_context(|| format!("drawing {}", path.display()))
}

/// One run: `protocol` at `point` on a fresh cluster named `cluster_name`, with the
/// transactions of `mix` (the workload's profiles at the point): start the cluster
/// (the memory nodes load the workload's data), audit the loaded data, run the
/// coordinators for `--duration`, audit after the run, then build the report and check
/// the history.
#[allow(clippy::too_many_arguments)]
fn run_one(
    args: &Args,
    workload: &dyn WorkloadSpec,
    protocol: Protocol,
    point: &Point,
    mix: Arc<dyn Mix>,
    cluster_name: &str,
    stop: &AtomicBool,
) -> anyhow::Result<Report> {
    let mut cluster = RunCluster::start(args, workload, protocol, cluster_name)?;
    let checks = checks(args, protocol);
    print_header(args, workload, protocol, point, &cluster, checks);
    // Audit before: the data must be as loaded (SmallBank's money, the KVS values).
    crate::audit::set_run_view(cluster.view_feed.clone());
    let initial_total = workload.initial_total(&cluster.audit_cx(protocol))?;
    let mut measured = measure(args, workload, &mut cluster, protocol, point, mix, stop)?;
    let audited = match audit_after_run(workload, &cluster, protocol, &measured.workers) {
        // Concurrent installs without the lock tear records: the audit may not get
        // through them. Said in the report, never judged.
        Err(e) if args.unsafe_no_cas => Audited {
            total: None,
            cvt_locked: 0,
            lockd_held: None,
            check: Some((
                format!("audit after the UNSAFE run not possible (unlocked installs tore records): {e:#}"),
                false,
            )),
        },
        r => r?,
    };
    let replicas = match (args.replicas > 1)
        .then(|| crate::audit::replicas(&cluster.fabric, &cluster.addrs))
        .transpose()
    {
        Err(e) if args.unsafe_no_cas => {
            eprintln!("replica audit after the UNSAFE run not possible: {e:#}");
            None
        }
        r => r?,
    };
    // After a failover: nothing a committed transaction wrote is missing on the new
    // primaries (needs the histories: not with --no-check).
    let durability = match (&measured.failover, args.no_check) {
        (Some(_), false) => {
            let want = crate::audit::committed_versions(
                measured.workers.iter().filter_map(|w| w.history.as_ref()),
            );
            Some(crate::audit::durability(
                &cluster.fabric,
                &cluster.addrs,
                protocol,
                &want,
            )?)
        }
        _ => None,
    };
    let (fabric_desc, model_desc) = cluster.shutdown();
    let mut report = build_report(
        args,
        workload,
        protocol,
        point,
        &measured,
        (fabric_desc, model_desc),
    );
    if args.unsafe_no_cas {
        report.protocol = format!("{}{NO_CAS_SUFFIX}", protocol.name());
        report.unsafe_variant = Some(UNSAFE_LABEL.into());
    }
    audited.judge(initial_total, &mut report);
    if let Some(n) = measured.lotus_locks_held {
        report.lotus_locks(n);
    }
    report.vtc = measured.lotus_vtc;
    if let Some(r) = replicas {
        report.replica_audit(&r);
    }
    if let Some(d) = durability {
        report.durability = Some(d.line());
        report.durable = Some(d.ok());
    }
    report.outcomes = workload.outcomes(&report);
    if let (Some(path), false) = (&args.history_out, measured.history_written) {
        write_history(path, &workload.kinds(), &measured.workers)?;
    }
    if !args.no_check {
        check_history(protocol, checks, &mut report, &mut measured.workers)?;
    }
    Ok(report)
}

/// `--history-out` of the in-process coordinators (compute node 0, incarnation 0).
fn write_history(
    path: &Path,
    kinds: &[&'static str],
    workers: &[WorkerStats],
) -> anyhow::Result<()> {
    let f = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut w = std::io::BufWriter::new(f);
    let mut n = 0;
    for h in workers.iter().filter_map(|w| w.history.as_ref()) {
        n += crate::history_out::write_lines(&mut w, crate::history_out::lines(h, kinds, 0, 0))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    std::io::Write::flush(&mut w).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("wrote {n} committed transactions to {}", path.display());
    Ok(())
}

/// A run's cluster: this process's fabric, the memory nodes (loaded with the
/// workload's data), the timestamp oracle and, when the protocol needs one, the lock
/// service, as child processes.
pub(crate) struct RunCluster {
    pub(crate) cluster: LocalCluster,
    pub(crate) fabric: Fabric,
    pub(crate) addrs: ClusterAddrs,
    /// The fabric flags every service gets (`--fabric`, `--model`, ...).
    pub(crate) common: Vec<String>,
    /// The oracle's epoch file: each (re)start persists a larger epoch there, so
    /// timestamps never go back (tso::epoch). Per run, removed at shutdown.
    pub(crate) tso_state: PathBuf,
    /// The lock service's flags (without `--listen`) and state directory, where each
    /// (re)start persists a larger epoch (`lockd::epoch`); per run, removed at shutdown.
    pub(crate) lockd_flags: Vec<String>,
    pub(crate) lockd_state: PathBuf,
    /// The memory nodes' lock services' state directories (their epochs), with Scythe's
    /// locks on the memory nodes.
    pub(crate) lock_states: Vec<PathBuf>,
    /// Each memory node's flags (without `--listen`), to start it again.
    pub(crate) memnode_flags: Vec<Vec<String>>,
    /// With `--hosts`: where the services (and coordinator processes) run.
    pub(crate) layout: Option<crate::hosts::Layout>,
    /// The membership service (a local etcd) of a run with coordinator processes
    /// (`--cnodes` 2 or more): they and the memory nodes register there, and the memory
    /// nodes fence a compute node whose lease ends.
    pub(crate) etcd: Option<member::LocalEtcd>,
    /// The replica views the coordinators follow (replicated runs and memory-node
    /// kills; `txn::view`).
    pub(crate) view_feed: Option<txn::view::ViewFeed>,
}

impl RunCluster {
    /// CPU time so far of this process (the coordinators) and of each service, by name
    /// (`txn-bench`, then `memnode 10`, `lockd 2`, ...); a process whose `/proc` entry
    /// cannot be read is left out.
    pub(crate) fn cpu_times(&self) -> Vec<(String, Duration)> {
        let mut out = Vec::new();
        if let Ok(t) = crate::breakdown::process_cpu(std::process::id()) {
            out.push(("txn-bench (coordinators)".to_string(), t));
        }
        for s in &self.cluster.services {
            if let Ok(t) = crate::breakdown::process_cpu(s.pid()) {
                out.push((format!("{} {}", s.name, s.node), t));
            }
        }
        out
    }

    /// Open this process's fabric (a missing RDMA device fails here, in one line), then
    /// start `--memnodes` memory nodes loading `workload`'s data, the lock service if
    /// `protocol` needs one, and the oracle. Errors: a fabric or a service that does
    /// not come up within a minute.
    fn start(
        args: &Args,
        workload: &dyn WorkloadSpec,
        protocol: Protocol,
        cluster_name: &str,
    ) -> anyhow::Result<Self> {
        let mut cluster = LocalCluster::new(
            cluster_name,
            args.bin_dir.clone().unwrap_or_else(default_bin_dir),
        )?;
        cluster.dry_run = args.dry_run;
        let mut fcfg = FabricConfig::new(args.fabric(), cluster_name, NodeId(NODE_CN));
        fcfg.device = args.rdma_device.clone();
        fcfg.gid_index = args.gid_index;
        fcfg.model = Some(args.model());
        let fabric = (!args.dry_run).then(|| Fabric::open(&fcfg)).transpose()?;
        // With --hosts each service gets its host's fabric flags and address instead.
        let layout = args
            .hosts
            .as_deref()
            .map(|p| {
                crate::hosts::Layout::load(p, cluster_name)
                    .map(|l| l.with_rpc(args.rpc.clone().unwrap_or_default()))
            })
            .transpose()?;
        let mut common = vec!["--model".to_string(), args.model()];
        if layout.is_none() {
            common.extend(["--fabric".into(), args.fabric().to_string()]);
            if let Some(d) = &args.rdma_device {
                common.extend(["--rdma-device".into(), d.clone()]);
            }
            if let Some(g) = args.gid_index {
                common.extend(["--gid-index".into(), g.to_string()]);
            }
            // `--config`'s `[runtime]` and `[server]` (with --hosts: in each service's
            // host flags).
            common.extend(crate::hosts::rpc_settings_flag(
                &args.rpc.clone().unwrap_or_default(),
            ));
        }
        if let Some(l) = &layout {
            eprintln!("services' logs: {}", l.log_dir().display());
        }
        // Where the `index`-th service of `kind` runs: its place, node id, listen
        // address, host flags and log (default: here, txn-bench's node ids, any port).
        let plan = |kind: rrpc::topology::RoleKind, index: usize, node: u32| match &layout {
            Some(l) => l
                .service(kind, index)
                .map(|p| (p.place, p.node, p.listen, p.flags, Some(p.log))),
            None => Ok((
                crate::launcher::Place::Local,
                node,
                "127.0.0.1:0".to_string(),
                Vec::new(),
                None,
            )),
        };
        eprintln!(
            "starting local cluster {cluster_name}: {} memnode(s){}{}, tso{}",
            args.memnodes,
            if args.replicas > 1 {
                format!(" ({} copies of each partition)", args.replicas)
            } else {
                String::new()
            },
            if args.spare_memnodes > 0 {
                format!(" and {} spare(s)", args.spare_memnodes)
            } else {
                String::new()
            },
            match (protocol.needs_lockd(), args.locks_on_memnodes()) {
                (false, _) => "",
                (true, false) => ", lockd",
                (true, true) => ", locks on the memory nodes",
            }
        );
        let etcd = if !args.dry_run
            && (args.coordinator_processes() || args.kill_memnode_after.is_some())
        {
            let dir = std::env::temp_dir().join(format!("{cluster_name}-etcd"));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            // With --hosts, on this host's control address, where the other hosts'
            // services and coordinator processes reach it.
            let ip = match &layout {
                Some(l) => l.driver_ip()?,
                None => std::net::Ipv4Addr::LOCALHOST.into(),
            };
            let e = member::LocalEtcd::start_on(&dir, ip).context(
                "--cnodes 2 or more and --kill-memnode-after run the membership service \
                     (etcd) on this host",
            )?;
            eprintln!("membership: etcd at {} (pid {})", e.endpoint(), e.pid());
            Some(e)
        } else {
            None
        };
        let membership: Vec<String> = match &etcd {
            Some(e) => vec!["--etcd".into(), e.endpoint()],
            None => Vec::new(),
        };
        let with =
            |extra: &[String]| -> Vec<String> { common.iter().chain(extra).cloned().collect() };
        // The oracle first: the lock services (lockd's, or the memory nodes') bound Lock
        // RPC timestamps by its counter.
        let tso_state = std::env::temp_dir().join(format!("{cluster_name}-tso-state"));
        let _ = std::fs::remove_dir_all(&tso_state);
        let (place, node, listen, host, log) = plan(rrpc::topology::RoleKind::Tso, 0, NODE_TSO)?;
        let tso = cluster.start_at(
            &place,
            "tso",
            node,
            &[
                tso_args(&common, &tso_state, &listen),
                membership.clone(),
                host,
            ]
            .concat(),
            START_TIMEOUT,
            log.as_deref(),
        )?;
        let locks_on_memnodes = protocol.needs_lockd() && args.locks_on_memnodes();
        // Each memory node's lock service keeps its epoch here (a restart serves a larger
        // one); removed at shutdown.
        let lock_states: Vec<PathBuf> = (0..args.memnodes)
            .filter(|_| locks_on_memnodes)
            .map(|i| std::env::temp_dir().join(format!("{cluster_name}-locks-{i}-state")))
            .collect();
        for d in &lock_states {
            let _ = std::fs::remove_dir_all(d);
        }
        let lock_flags = |i: u32| -> Vec<String> {
            let Some(state) = lock_states.get(i as usize) else {
                return Vec::new();
            };
            vec![
                "--lock-service".into(),
                "--lock-state-dir".into(),
                state.display().to_string(),
                "--locks".into(),
                workload.lockd_locks().to_string(),
                "--lock-threads".into(),
                args.lockd_threads.to_string(),
                "--cold-watermark".into(),
                args.cold_watermark.to_string(),
                "--hot-watermark".into(),
                args.hot_watermark.to_string(),
                "--lock-tso".into(),
                tso.to_string(),
            ]
        };
        let data = workload.memnode_args();
        let mut memnodes = Vec::new();
        let mut memnode_flags = Vec::new();
        let mut starting = Vec::new();
        // The partitions' memory nodes, then the spares (after them in index and id),
        // all started before any is waited for.
        for i in 0..args.memnodes + args.spare_memnodes {
            let role: [String; 2] = if i < args.memnodes {
                ["--partition".into(), i.to_string()]
            } else {
                ["--spare-index".into(), i.to_string()]
            };
            let partition = [
                &[
                    "--versions".into(),
                    args.versions.to_string(),
                    "--partitions".into(),
                    args.memnodes.to_string(),
                    "--replicas".into(),
                    args.replicas.to_string(),
                ][..],
                &role[..],
            ]
            .concat();
            let (place, node, listen, host, log) = plan(
                rrpc::topology::RoleKind::Memnode,
                i as usize,
                NODE_MEMNODE + i,
            )?;
            // Memory node 0 hosts the range index, if the workload scans.
            let index: Vec<String> = if i == 0 && args.uses_range_index() {
                vec![
                    "--range-index".into(),
                    "--rtx-ids".into(),
                    range_ids_total(args)?.to_string(),
                ]
            } else {
                Vec::new()
            };
            let flags = with(
                &[
                    data.as_slice(),
                    &partition,
                    &membership,
                    &host,
                    &index,
                    &lock_flags(i),
                ]
                .concat(),
            );
            let at = [flags.clone(), vec!["--listen".into(), listen]].concat();
            starting.push(cluster.spawn_at(
                &place,
                "memnode",
                node,
                &at,
                START_TIMEOUT,
                log.as_deref(),
            )?);
            memnode_flags.push(flags);
        }
        // Side by side: each loads its own rows (minutes for large TPC-C runs).
        for s in starting {
            memnodes.push(cluster.wait_ready(s)?);
        }
        let lockd_state = std::env::temp_dir().join(format!("{cluster_name}-lockd-state"));
        let _ = std::fs::remove_dir_all(&lockd_state);
        let mut lockd_flags = Vec::new();
        let lockd = if protocol.needs_lockd() && !locks_on_memnodes {
            let flags = with(&[
                "--state-dir".into(),
                lockd_state.display().to_string(),
                "--locks".into(),
                workload.lockd_locks().to_string(),
                "--threads".into(),
                args.lockd_threads.to_string(),
                "--cold-watermark".into(),
                args.cold_watermark.to_string(),
                "--hot-watermark".into(),
                args.hot_watermark.to_string(),
                // Lock RPC timestamps above what the oracle has issued are refused.
                "--tso".into(),
                tso.to_string(),
            ]);
            let (place, node, listen, host, log) =
                plan(rrpc::topology::RoleKind::Lockd, 0, NODE_LOCKD)?;
            lockd_flags = [flags, membership.clone(), host].concat();
            let at = [lockd_flags.clone(), vec!["--listen".into(), listen]].concat();
            Some(cluster.start_at(&place, "lockd", node, &at, START_TIMEOUT, log.as_deref())?)
        } else {
            None
        };
        let Some(fabric) = fabric else {
            return Err(crate::hosts::DryRunDone.into());
        };
        Ok(Self {
            cluster,
            fabric,
            addrs: ClusterAddrs {
                memnodes,
                lockd,
                tso,
            },
            common,
            tso_state,
            lockd_flags,
            lockd_state,
            lock_states,
            memnode_flags,
            layout,
            etcd,
            view_feed: (args.replicas > 1 || args.kill_memnode_after.is_some()).then(|| {
                txn::view::ViewFeed::new(txn::view::View::initial(args.memnodes, args.replicas))
            }),
        })
    }

    /// The run's etcd as the view manager takes it: its endpoint and the cluster's name.
    pub(crate) fn etcd_ref(&self) -> Option<(String, String)> {
        self.etcd
            .as_ref()
            .map(|e| (e.endpoint(), self.cluster.name().to_string()))
    }

    /// The oracle's flags, listening on `listen`.
    pub(crate) fn tso_args(&self, listen: &str) -> Vec<String> {
        let mut a = tso_args(&self.common, &self.tso_state, listen);
        if let Some(e) = &self.etcd {
            a.extend(["--etcd".into(), e.endpoint()]);
        }
        a
    }

    /// What an audit of this cluster under `protocol` reads through.
    fn audit_cx(&self, protocol: Protocol) -> AuditCx<'_> {
        AuditCx {
            fabric: &self.fabric,
            addrs: &self.addrs,
            protocol,
        }
    }

    /// Stop the services and remove the oracle's and lock services' state; returns the
    /// fabric's and the timing model's descriptions for the report.
    fn shutdown(self) -> (String, String) {
        let descs = (self.fabric.describe(), self.fabric.model_description());
        let Self {
            mut cluster,
            fabric,
            tso_state,
            lockd_state,
            lock_states,
            etcd,
            ..
        } = self;
        drop(fabric);
        cluster.shutdown();
        let _ = std::fs::remove_dir_all(&tso_state);
        let _ = std::fs::remove_dir_all(&lockd_state);
        for d in &lock_states {
            let _ = std::fs::remove_dir_all(d);
        }
        // The local etcd removes its data; its log's directory is this run's.
        if let Some(dir) = etcd
            .as_ref()
            .and_then(|e| e.log_path().parent().map(Path::to_path_buf))
        {
            drop(etcd);
            let _ = std::fs::remove_dir_all(dir);
        }
        descs
    }
}

/// The oracle's flags: the `common` fabric flags, its state directory and `listen`.
fn tso_args(common: &[String], state: &Path, listen: &str) -> Vec<String> {
    let mut a = common.to_vec();
    a.extend([
        "--state-dir".into(),
        state.display().to_string(),
        "--listen".into(),
        listen.to_string(),
    ]);
    a
}

/// Bytes of a compute node's Lotus lock table (Lotus 7.1: 32 MB, 4 M slots).
const LOTUS_TABLE_BYTES: usize = 32 << 20;

/// How long a service may take to come up.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The history check a run is judged by, as the header and the progress name it.
fn checks(args: &Args, protocol: Protocol) -> &'static str {
    match protocol {
        _ if args.unsafe_no_cas => "off (UNSAFE)",
        _ if args.no_check => "off",
        Protocol::Mvcc(Isolation::Snapshot) | Protocol::Lotus(Isolation::Snapshot) => {
            "snapshot isolation (serializability informative)"
        }
        Protocol::Mvcc(Isolation::Serializable) | Protocol::Lotus(Isolation::Serializable) => {
            "serializability (snapshot isolation informative)"
        }
        _ => "serializability",
    }
}

/// The run's header line (stdout).
fn print_header(
    args: &Args,
    workload: &dyn WorkloadSpec,
    protocol: Protocol,
    point: &Point,
    cluster: &RunCluster,
    checks: &str,
) {
    if args.unsafe_no_cas {
        println!("{UNSAFE_LABEL}");
    }
    println!(
        "{} | protocol: {protocol} | fabric: {} | timing model: {} | {}{} thread(s) x {} coroutines{} | {} | {} | {} | {}{} s | backoff up to {} us | check: {checks}",
        workload.label(),
        cluster.fabric.describe(),
        cluster.fabric.model_description(),
        if args.coordinator_processes() {
            format!("{} coordinator process(es) x ", args.cnodes)
        } else {
            String::new()
        },
        args.threads.unwrap_or(1).max(1),
        point.coroutines,
        match lock_serving(args, protocol, point) {
            Some(l) => format!(" | lock RPCs served {}", l.describe()),
            None => String::new(),
        },
        workload.scale(),
        workload.skew(point.theta),
        storage_desc(args, Some(point)),
        warmup_desc(args),
        args.duration(),
        args.max_backoff_us,
    );
}

/// Where the compute nodes serve Lotus's lock RPCs at `point` (`--lock-serving`, or
/// the sweep's value); `None` when the run has no such RPCs (not Lotus, or one
/// coordinator process).
pub(crate) fn lock_serving(
    args: &Args,
    protocol: Protocol,
    point: &Point,
) -> Option<crate::lotus_cn::LockServing> {
    (protocol.needs_lock_tables() && args.coordinator_processes())
        .then(|| point.lock_serving.unwrap_or(args.lock_serving))
}

/// `warm-up W s (not measured) + ` before the duration in headers, with `--warmup`
/// (nothing without).
fn warmup_desc(args: &Args) -> String {
    let w = args.run.warmup();
    if w.is_zero() {
        String::new()
    } else {
        format!("warm-up {} s (not measured) + ", w.as_secs_f64())
    }
}

/// `N memnode(s), V versions` and, when replicated, `, R replicas (...)`: the commit
/// style and what occ-cas does over replicas (FORD's commit); with `--lock-placement
/// memnode`, where Scythe's locks are. For one run's header
/// (`point`) R is the run's; for the comparison's (`None`) under `--sweep replicas` it
/// is `replicas per point`.
pub(crate) fn storage_desc(args: &Args, point: Option<&Point>) -> String {
    let swept = point.is_none() && matches!(args.sweep, Some(Sweep::Replicas(_)));
    let copies = point.and_then(|p| p.replicas).unwrap_or(args.replicas);
    let replicas = if copies > 1 || swept {
        let commit = match args.replica_commit {
            crate::txn_args::ReplicaCommitArg::Coalesced => "one commit round for all copies",
            crate::txn_args::ReplicaCommitArg::Separate => "commit rounds: backups, then primaries",
        };
        format!(
            ", {} ({commit}; occ-cas commits as FORD when replicated: undo logs to every \
             memnode, invisible bit, readers wait{})",
            if swept {
                "replicas per point".to_string()
            } else {
                format!("{copies} replicas")
            },
            if args.ford_backup_reads {
                ", read-only transactions read backups"
            } else {
                ""
            }
        )
    } else {
        String::new()
    };
    let on_memnodes = match point.and_then(|p| p.args(args)) {
        Some(a) => a.locks_on_memnodes(),
        None => args.locks_on_memnodes(),
    };
    let locks = if point.is_none() && matches!(args.sweep, Some(Sweep::LockPlacement(_))) {
        ", Scythe's locks placed per point"
    } else if on_memnodes {
        ", Scythe's locks on the memnodes"
    } else {
        ", Scythe's locks on lockd"
    };
    format!(
        "{} memnode(s), {} versions{replicas}{locks}",
        args.memnodes, args.versions
    )
}

/// What the measured part of a run left.
pub(crate) struct Measured {
    /// Each coordinator thread's counters and history, in thread order.
    pub(crate) workers: Vec<WorkerStats>,
    /// From the coordinators' common start to the end of the run.
    pub(crate) elapsed: Duration,
    /// `--kill-tso-after`: the restart, complete.
    pub(crate) tso_restart: Option<TsoRestart>,
    /// `--kill-lockd-after`: the restart, complete.
    pub(crate) lockd_restart: Option<LockdRestart>,
    /// `--kill-memnode-after`: the failover.
    pub(crate) failover: Option<crate::failover::Failover>,
    /// `--kill-etcd-after`: the restart of the view service.
    pub(crate) etcd_restart: Option<crate::report::EtcdRestart>,
    /// With `--breakdown`: each process's CPU time during the run.
    pub(crate) cpu: Vec<ProcessCpu>,
    /// Commits and aborts per interval, per compute node (counted with `--timeline-ms`).
    pub(crate) timelines: Vec<CnodeTimeline>,
    /// The fault injected, if any (for the timeline's recovery line).
    pub(crate) fault: Option<Fault>,
    /// What happened to coordinator processes.
    pub(crate) cnode_events: Vec<String>,
    /// `--history-out` was written as the history streamed in.
    pub(crate) history_written: bool,
    /// Lotus: locks left held in this process's lock table once every coordinator
    /// finished (`None` for the other protocols).
    pub(crate) lotus_locks_held: Option<u64>,
    /// Lotus: the version table cache's counters at the end (`None` for the other
    /// protocols, or with the cache off).
    pub(crate) lotus_vtc: Option<txn::vt_cache::VtCacheStats>,
}

/// Each process's CPU used between two samples of [`RunCluster::cpu_times`] (a process
/// missing from either, restarted or gone, is left out), over `wall`.
pub(crate) fn cpu_spent(
    before: &[(String, Duration)],
    after: &[(String, Duration)],
    wall: Duration,
) -> Vec<ProcessCpu> {
    after
        .iter()
        .filter_map(|(name, a)| {
            let (_, b) = before.iter().find(|(n, _)| n == name)?;
            let cpu_s = a.saturating_sub(*b).as_secs_f64();
            Some(ProcessCpu {
                process: name.clone(),
                cpu_s,
                cores: cpu_s / wall.as_secs_f64().max(1e-9),
            })
        })
        .collect()
}

/// Run the coordinators for `--warmup` + `--duration` (or until `stop`, a service
/// failure or a fatal error), what they report restarting at the warm-up's end, printing progress each second to stderr and restarting the oracle
/// once with `--kill-tso-after`. Errors: a thread that does not connect or panics, a
/// service that died, an oracle that did not restart.
fn measure(
    args: &Args,
    workload: &dyn WorkloadSpec,
    cluster: &mut RunCluster,
    protocol: Protocol,
    point: &Point,
    mix: Arc<dyn Mix>,
    stop: &AtomicBool,
) -> anyhow::Result<Measured> {
    if args.coordinator_processes() {
        return cnodes::measure(args, workload, cluster, protocol, point, stop);
    }
    let threads = args.threads.unwrap_or(1).max(1);
    let mut cfg = txn_config(args, protocol, threads);
    if let Some(l) = point.commit_log {
        l.apply(&mut cfg);
    }
    cfg.view_feed = cluster.view_feed.clone();
    let lotus_table = if protocol.needs_lock_tables() {
        // One compute node (this process) serving every shard: every lock a CPU CAS
        // on its own table (Lotus 4.1), fresh for each run, with its version table
        // cache (Lotus 4.4; --vtc-entries).
        let site = txn::lotus::LotusSite::single_cached(
            cluster.fabric.node().0,
            LOTUS_TABLE_BYTES,
            point.vtc_entries,
        )
        .with_lock_key(workload.lotus_lock_key());
        let table = site.local.clone();
        let cache = site.cache.clone();
        cfg.lotus = Some(site);
        (table, cache)
    } else {
        (None, None)
    };
    let (lotus_table, lotus_vtc) = lotus_table;
    let t0 = Arc::new(AtomicU64::new(0));
    let clock = RunClock {
        t0_ns: 0,
        interval_ns: interval_ns(args),
        wall: args.history_out.is_some(),
    };
    // Workers connect, then start together. `run_stop` ends this run (its deadline, a
    // service failure, or `stop`).
    let run_stop = Arc::new(AtomicBool::new(false));
    let committed = Arc::new(AtomicU64::new(0));
    let start_gate = Arc::new(Barrier::new(threads + 1));
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    // With --hosts, the coordinators here take the topology's [coordinators] CPUs and
    // NUMA node (of its first coordinator host, when that is this one) instead of a core
    // each.
    let topo_pin = match &cluster.layout {
        Some(l) => {
            let c = l.coordinator(0)?;
            (c.place == crate::launcher::Place::Local && (c.cpus.is_some() || c.numa.is_some()))
                .then_some((c.cpus, c.numa))
        }
        None => None,
    };
    if let Some((Some(list), _)) = &topo_pin {
        rrpc::topology::parse_cpu_list(list)
            .map_err(|e| anyhow::anyhow!("[coordinators] cpus {list:?}: {e}"))?;
    }
    let mut handles = Vec::new();
    for tid in 0..threads {
        let w = WorkerPlan {
            tid,
            coroutines: point.coroutines,
            seed: args.seed.seed,
            max_backoff_us: args.max_backoff_us,
            kinds: workload.kinds(),
            warehouses: args.warehouses(),
            each_type_first: args.each_type_first,
            cfg: cfg.clone(),
            addrs: cluster.addrs.clone(),
            core: (topo_pin.is_none() && !cores.is_empty()).then(|| cores[tid % cores.len()]),
            clock,
            t0: t0.clone(),
            go: None,
            flush: None,
            incarnation: 0,
            ledger: None,
            qp_errors: args.qp_errors_ms.map(Duration::from_millis),
            runtime: args.runtime(),
            reconnect_give_up: args
                .kill_memnode_after
                .map(|_| crate::failover::RECONNECT_GIVE_UP),
            routing: point.routing.unwrap_or(args.routing),
            inbox: None,
            reports_vtc: false,
            warmup: args.run.warmup(),
        };
        let (fabric, mix, stop, committed, gate) = (
            cluster.fabric.clone(),
            mix.clone(),
            run_stop.clone(),
            committed.clone(),
            start_gate.clone(),
        );
        let pin = topo_pin.clone();
        handles.push(
            std::thread::Builder::new()
                .name(format!("coordinator-{tid}"))
                .spawn(move || {
                    if let Some((cpus, numa)) = &pin {
                        // Unpinned rather than stuck: the other threads wait at the gate.
                        if let Err(e) = crate::cnode::pin(cpus.as_deref(), *numa) {
                            eprintln!("coordinator thread {tid}: not pinned: {e:#}");
                        }
                    }
                    worker(w, fabric, mix, stop, committed, gate)
                })?,
        );
    }
    // With --breakdown, each process's CPU time over the measured window: sampled at
    // the warm-up's end (at the start without one) and after the run.
    let mut cpu_before =
        (args.breakdown && args.run.warmup().is_zero()).then(|| cluster.cpu_times());
    t0.store(txn::history::monotonic_ns(), Ordering::SeqCst);
    start_gate.wait();
    let started = std::time::Instant::now();
    // Commits during the warm-up: the restart records count the measured window's.
    let mut warm_committed = 0;
    let watched = watch(
        args,
        cluster,
        protocol,
        (&run_stop, &committed, stop),
        started,
        &mut |c, warm| {
            warm_committed = warm;
            if args.breakdown {
                cpu_before = Some(c.cpu_times());
            }
        },
    );
    run_stop.store(true, Ordering::SeqCst);
    let mut workers = Vec::new();
    for h in handles {
        workers.push(
            h.join()
                .map_err(|_| anyhow::anyhow!("a coordinator thread panicked"))??,
        );
    }
    // The measured window: from the warm-up's end (empty if the run ended before).
    let elapsed = started.elapsed().saturating_sub(args.run.warmup());
    let cpu = match cpu_before {
        Some(before) => cpu_spent(&before, &cluster.cpu_times(), elapsed),
        None => Vec::new(),
    };
    let (mut tso_restart, mut lockd_restart, failover, mut etcd_restart) =
        watched.map_err(|e| anyhow::anyhow!("a service died during the run: {e}"))?;
    if let Some(r) = &mut etcd_restart {
        r.committed_after_ready = committed
            .load(Ordering::Relaxed)
            .saturating_sub(warm_committed + r.committed_before_ready);
    }
    if let Some(r) = &mut tso_restart {
        r.committed_after_ready = committed
            .load(Ordering::Relaxed)
            .saturating_sub(warm_committed + r.committed_before_ready);
        r.thread_epochs = workers.iter().map(|w| w.tso_epoch).collect();
        r.uses_tso = protocol != Protocol::OccCas;
    }
    if let Some(r) = &mut lockd_restart {
        r.committed_after_ready = committed
            .load(Ordering::Relaxed)
            .saturating_sub(warm_committed + r.committed_before_ready);
        r.thread_reconnects = workers.iter().map(|w| w.lock_reconnects).collect();
    }
    let mut timeline = Timeline::default();
    for w in &workers {
        timeline.add(&w.timeline);
    }
    Ok(Measured {
        workers,
        elapsed,
        fault: tso_fault(tso_restart.as_ref())
            .or(lockd_fault(lockd_restart.as_ref()))
            .or(failover.as_ref().map(|f| Fault {
                what: format!("memnode {} killed", f.memnode),
                at_ms: f.killed_ms,
                cnode: None,
                recovered_ms: Some(f.published_ms),
            })),
        tso_restart,
        lockd_restart,
        failover,
        etcd_restart,
        cpu,
        timelines: vec![CnodeTimeline {
            cnode: 0,
            commits: timeline.commits,
            aborts: timeline.aborts,
        }],
        cnode_events: Vec::new(),
        history_written: false,
        // Every coordinator has ended (its attempts released their local locks at once).
        lotus_locks_held: lotus_table.map(|t| t.table().slots_in_use() as u64),
        lotus_vtc: lotus_vtc.map(|c| c.stats()),
    })
}

/// The oracle's restart as the timeline's fault.
pub(crate) fn tso_fault(r: Option<&TsoRestart>) -> Option<Fault> {
    r.map(|r| Fault {
        what: "tso killed".into(),
        at_ms: r.killed_at_s * 1e3,
        cnode: None,
        recovered_ms: None,
    })
}

/// The timeline's interval, ns: `--timeline-ms`, else 0 (nothing counted).
pub(crate) fn interval_ns(args: &Args) -> u64 {
    args.timeline_ms.map_or(0, |ms| ms * 1_000_000)
}

/// The coordinators' settings under `protocol`, the history memory split over
/// `threads` threads.
pub(crate) fn txn_config(args: &Args, protocol: Protocol, threads: usize) -> TxnConfig {
    let mut cfg = TxnConfig::default();
    cfg.protocol = protocol;
    cfg.lock_wait = Duration::from_micros(args.lock_wait_us);
    cfg.history_limit_bytes =
        (!args.no_check).then(|| (args.check_memory_mb << 20) / threads.max(1));
    cfg.tocc_wait = Duration::from_micros(args.tocc_wait_us);
    cfg.record_phases = args.breakdown;
    // Coordinators in processes of their own can die alone: their commits are
    // logged for the survivor that recovers them.
    cfg.commit_log = args.coordinator_processes() || args.commit_log;
    cfg.log_placement = args.log_placement.into();
    cfg.replica_commit = args.replica_commit.into();
    cfg.ford_backup_reads = args.ford_backup_reads;
    cfg.unsafe_no_lock_cas = args.unsafe_no_cas && matches!(protocol, Protocol::Mvcc(_));
    // The planted scan bug acts process-wide; every coordinator process builds its
    // settings here (`Args::check` refused the plant in a build without it).
    if args.plant == Some(crate::txn_args::Plant::DropScanEntries) {
        if let Err(e) = txn::range_index::plant_dropped_scan_entries() {
            eprintln!("--plant drop-scan-entries: {e}");
        }
    }
    // `ids` spans every coordinator thread's IDs here (the loader's, the last, left
    // out); each thread takes its own from it, with an incarnation of its own
    // (`WorkerPlan::connect`).
    cfg.range_index = args
        .uses_range_index()
        .then(|| txn::range_index::RangeIndexConfig {
            tables: args.range_index_tables(),
            ids: 0..range_ids_total(args).map_or(0, |n| n - 1),
            incarnation: 1,
        });
    cfg
}

/// rTX IDs of the range index per coordinator thread: one per coroutine of the largest
/// sweep point, twice (the home coroutines of `--routing forward` run transactions too).
pub(crate) fn range_ids_per_thread(args: &Args) -> u16 {
    let most = args
        .points()
        .iter()
        .map(|p| p.coroutines)
        .max()
        .unwrap_or(1);
    u16::try_from(2 * most).unwrap_or(u16::MAX)
}

/// The range index's rTX IDs: `range_ids_per_thread` for every compute node's threads
/// (a restarted coordinator process reuses its previous life's, at a new incarnation),
/// plus the loader's: the memory node's `--rtx-ids`. Errors: more than a `u16` holds.
pub(crate) fn range_ids_total(args: &Args) -> anyhow::Result<u16> {
    let threads = args.threads.unwrap_or(1).max(1) * args.cnodes.max(1);
    let ids = threads * usize::from(range_ids_per_thread(args)) + 1;
    u16::try_from(ids)
        .ok()
        .filter(|&n| n < u16::MAX)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "{}: the range index has rTX IDs for at most about 32,000 coroutines (2 per \
                 coroutine per thread): fewer --threads, --coroutines or --cnodes",
                args.workload
            )
        })
}

/// Lives of range-index clients in this process: each new thread's rTX clients take a
/// new incarnation, so that an ID's next life tells its blocks from this one's (rTX 4.4).
static RANGE_LIVES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// The run's control loop, from `started` until the warm-up and the duration are over
/// or `run_stop` is set: forwards `stop`, calls `at_boundary` once at the warm-up's end
/// (at once without one) with the commits so far (the warm-up's), injects the fault flags (their seconds count from the
/// measured window's start, the warm-up's end), prints progress, and watches the
/// services. `flags` are `run_stop`, the commits so far and `stop`. Returns the
/// restart's record (its counts after the restart still to fill in); `Err` names the
/// service that died (or the failed restart), after setting `run_stop`.
fn watch(
    args: &Args,
    cluster: &mut RunCluster,
    protocol: Protocol,
    flags: (&AtomicBool, &AtomicU64, &AtomicBool),
    started: std::time::Instant,
    at_boundary: &mut dyn FnMut(&RunCluster, u64),
) -> Result<Watched, String> {
    let (run_stop, committed, stop) = flags;
    let warmup = args.run.warmup();
    let dur = warmup + Duration::from_secs_f64(args.duration());
    // The fault flags' clock: the measured window's.
    let measured = started + warmup;
    let mut boundary_seen = warmup.is_zero();
    // Commits of the warm-up (the restart records count the measured window's, as the
    // coordinator processes' streams do).
    let mut warm = 0;
    let measured_commits =
        |warm: u64| AtomicU64::new(committed.load(Ordering::Relaxed).saturating_sub(warm));
    // Seconds into the measured window, `None` during the warm-up.
    let since = || {
        std::time::Instant::now()
            .checked_duration_since(measured)
            .map(|d| d.as_secs_f64())
    };
    let after = |k: Option<f64>| k.is_some_and(|k| since().is_some_and(|s| s >= k));
    let mut last = 0;
    let mut tso_restart = None;
    let mut lockd_restart = None;
    let mut failover = None;
    let mut memnode_stopped = false;
    let mut etcd_restart: Option<crate::report::EtcdRestart> = None;
    let manager = match (&cluster.view_feed, args.kill_memnode_after) {
        (Some(feed), Some(_)) => {
            let m = crate::failover::ViewManager::new(
                &cluster.fabric,
                &cluster.addrs,
                feed.clone(),
                cluster.etcd_ref(),
                Vec::new(),
            );
            match m {
                Ok(m) => Some(m),
                Err(e) => {
                    run_stop.store(true, Ordering::SeqCst);
                    return Err(format!("starting the view manager: {e:#}"));
                }
            }
        }
        _ => None,
    };
    while started.elapsed() < dur && !run_stop.load(Ordering::Relaxed) {
        if stop.load(Ordering::Relaxed) {
            run_stop.store(true, Ordering::SeqCst);
            break;
        }
        if !boundary_seen && since().is_some() {
            boundary_seen = true;
            warm = committed.load(Ordering::Relaxed);
            at_boundary(cluster, warm);
        }
        if tso_restart.is_none() && after(args.kill_tso_after) {
            let listen = cluster.addrs.tso.to_string();
            let tso_args = cluster.tso_args(&listen);
            let r = restart_tso(
                &mut cluster.cluster,
                &cluster.tso_state,
                &tso_args,
                Duration::from_millis(args.tso_down_ms),
                &measured_commits(warm),
                measured,
            );
            match r {
                Ok(r) => tso_restart = Some(r),
                Err(e) => {
                    run_stop.store(true, Ordering::SeqCst);
                    return Err(format!("restarting the oracle: {e:#}"));
                }
            }
        }
        if lockd_restart.is_none() && cluster.addrs.lockd.is_some() && after(args.kill_lockd_after)
        {
            let down = Duration::from_millis(args.lockd_down_ms);
            match restart_lockd(cluster, down, &measured_commits(warm), measured) {
                Ok(r) => lockd_restart = Some(r),
                Err(e) => {
                    run_stop.store(true, Ordering::SeqCst);
                    return Err(format!("restarting the lock service: {e:#}"));
                }
            }
        }
        if etcd_restart.is_none() && after(args.kill_etcd_after) {
            match restart_etcd(
                cluster,
                manager.as_ref(),
                args,
                &measured_commits(warm),
                measured,
            ) {
                Ok(r) => etcd_restart = Some(r),
                Err(e) => {
                    run_stop.store(true, Ordering::SeqCst);
                    return Err(format!("restarting etcd: {e:#}"));
                }
            }
        }
        if !memnode_stopped && after(args.stop_memnode_after) {
            memnode_stopped = true;
            let m = args.memnode;
            let node = NODE_MEMNODE + m;
            let before = committed.load(Ordering::Relaxed);
            let stopped = measured.elapsed();
            let pid = match cluster.cluster.signal_node(node, "STOP") {
                Ok(pid) => pid,
                Err(e) => {
                    run_stop.store(true, Ordering::SeqCst);
                    return Err(format!("stopping memory node {m}: {e:#}"));
                }
            };
            std::thread::sleep(Duration::from_millis(args.stop_ms));
            if let Err(e) = cluster.cluster.signal_node(node, "CONT") {
                run_stop.store(true, Ordering::SeqCst);
                return Err(format!("continuing memory node {m}: {e:#}"));
            }
            // On stdout, with the report it belongs to.
            println!(
                "memnode stop: memory node {m} (pid {pid}) stopped (SIGSTOP) at {:.0} ms for {} \
                 ms; {} commits while it was stopped",
                stopped.as_secs_f64() * 1000.0,
                args.stop_ms,
                committed.load(Ordering::Relaxed).saturating_sub(before)
            );
        }
        if failover.is_none() && after(args.kill_memnode_after) {
            let m = args.memnode;
            let killed = std::time::Instant::now();
            if let Err(e) = cluster.cluster.kill(NODE_MEMNODE + m) {
                run_stop.store(true, Ordering::SeqCst);
                return Err(format!("killing memory node {m}: {e:#}"));
            }
            eprintln!(
                "[{:.1}s] SIGKILLed memory node {m}",
                measured.elapsed().as_secs_f64()
            );
            let f = match &manager {
                Some(mgr) => mgr.fail_over(m, killed, measured),
                None => Err(anyhow::anyhow!("no view manager")),
            };
            match f {
                Ok(mut f) => {
                    eprintln!("{}", f.line());
                    if !f.lost.is_empty() {
                        run_stop.store(true, Ordering::SeqCst);
                        return Err(format!(
                            "memory node {m} died and partition(s) {:?} with it: no other copy \
                             (--replicas {}; run with --replicas 2 or more to survive it)",
                            f.lost, args.replicas
                        ));
                    }
                    if args.restart || args.spare_memnodes > 0 {
                        let mgr = manager.as_ref().expect("a failover had a manager");
                        let r = if args.restart {
                            restart_memnode(cluster, mgr, m, measured)
                        } else {
                            // The first spare takes the dead node's place.
                            mgr.fill_spare(m, args.memnodes, measured)
                        };
                        match r {
                            Ok(r) => {
                                for l in r.lines() {
                                    eprintln!("{l}");
                                }
                                f.restart = Some(r);
                            }
                            Err(e) => {
                                run_stop.store(true, Ordering::SeqCst);
                                return Err(format!("re-replicating memory node {m}: {e:#}"));
                            }
                        }
                    }
                    failover = Some(f);
                }
                Err(e) => {
                    run_stop.store(true, Ordering::SeqCst);
                    return Err(format!("failing over memory node {m}: {e:#}"));
                }
            }
        }
        let mut nap = Duration::from_millis(200).min(dur.saturating_sub(started.elapsed()));
        if !boundary_seen {
            nap = nap.min(measured.saturating_duration_since(std::time::Instant::now()));
        }
        std::thread::sleep(nap);
        let s = started.elapsed().as_secs();
        if s > last {
            last = s;
            let c = committed.load(Ordering::Relaxed);
            eprintln!(
                "[{protocol} {s:>3}s / {:.0}s{}] committed {c} ({:.0} txn/s)",
                dur.as_secs_f64(),
                if since().is_none() { " warm-up" } else { "" },
                c as f64 / started.elapsed().as_secs_f64()
            );
        }
        if let Err(e) = cluster.cluster.check_alive() {
            run_stop.store(true, Ordering::SeqCst);
            return Err(e);
        }
    }
    if let (Some(r), Some(m)) = (&mut etcd_restart, &manager) {
        r.final_published = Some(m.published_epoch());
        match m.stored_view_patiently() {
            Ok(v) => r.final_stored = v.map(|v| v.epoch),
            Err(e) => eprintln!("reading the view back from etcd at the end: {e:#}"),
        }
    }
    Ok((tso_restart, lockd_restart, failover, etcd_restart))
}

/// `--kill-etcd-after`: SIGKILL etcd, start it again from its data directory after
/// `--etcd-down-ms`, and read the replica view back (when a view manager stores it).
fn restart_etcd(
    cluster: &mut RunCluster,
    manager: Option<&crate::failover::ViewManager>,
    args: &Args,
    committed: &AtomicU64,
    started: std::time::Instant,
) -> anyhow::Result<crate::report::EtcdRestart> {
    let etcd = cluster.etcd.as_mut().context("this run has no etcd")?;
    let epoch_published = manager.map(|m| m.published_epoch());
    let killed = std::time::Instant::now();
    let killed_at_s = started.elapsed().as_secs_f64();
    etcd.restart(Duration::from_millis(args.etcd_down_ms))
        .context("starting etcd again")?;
    let back_ms = killed.elapsed().as_secs_f64() * 1e3;
    let committed_before_ready = committed.load(Ordering::Relaxed);
    let epoch_read_back = match manager {
        Some(m) => m.stored_view_patiently()?.map(|v| v.epoch),
        None => None,
    };
    eprintln!(
        "[{killed_at_s:.1}s] SIGKILLed etcd; back from its data directory in {back_ms:.0} ms \
         (view epoch read back: {epoch_read_back:?}, published: {epoch_published:?})"
    );
    Ok(crate::report::EtcdRestart {
        killed_at_s,
        back_ms,
        epoch_published,
        epoch_read_back,
        final_published: None,
        final_stored: None,
        committed_before_ready,
        committed_after_ready: 0,
    })
}

/// What [`watch`] returns: the oracle's and the lock service's restarts and the
/// memory-node failover, when injected.
type Watched = (
    Option<TsoRestart>,
    Option<LockdRestart>,
    Option<crate::failover::Failover>,
    Option<crate::report::EtcdRestart>,
);

/// The workload's audit after the run, timed on stderr.
fn audit_after_run(
    workload: &dyn WorkloadSpec,
    cluster: &RunCluster,
    protocol: Protocol,
    workers: &[WorkerStats],
) -> anyhow::Result<Audited> {
    let t_audit = std::time::Instant::now();
    let audited = workload.audit_after(&cluster.audit_cx(protocol), workers)?;
    eprintln!(
        "audited the {} rows in {:.1} s",
        workload.label(),
        t_audit.elapsed().as_secs_f64()
    );
    Ok(audited)
}

/// The run's report from what it measured, before the audit's verdict and the history
/// check; `descs` are the fabric's and the timing model's descriptions.
fn build_report(
    args: &Args,
    workload: &dyn WorkloadSpec,
    protocol: Protocol,
    point: &Point,
    measured: &Measured,
    descs: (String, String),
) -> Report {
    let (fabric_desc, model_desc) = descs;
    let mut report = Report::with_kinds(
        &workload.kinds(),
        fabric_desc,
        args.threads.unwrap_or(1).max(1),
        point.coroutines,
        workload.keys(),
        point.theta,
        measured.elapsed,
        &measured.workers,
    );
    report.protocol = protocol.name().into();
    report.workload = workload.label().into();
    report.point = point.label.clone();
    report.warmup_s = args.run.warmup().as_secs_f64();
    report.memnodes = args.memnodes;
    if protocol.needs_lock_tables() && args.coordinator_processes() {
        report.routing = Some(match point.routing.unwrap_or(args.routing) {
            crate::routing::Routing::None => "none (transactions run where drawn)".into(),
            crate::routing::Routing::Ideal => "ideal (read-write transactions drawn on \
                 their compute node's own shards: no forwarding hop, equal work per compute \
                 node; an upper bound)"
                .into(),
            crate::routing::Routing::Forward => "forward (read-write transactions sent to \
                 the compute node owning their first record's shard and run there; latency \
                 from arrival there)"
                .into(),
        });
    }
    report.lock_serving = lock_serving(args, protocol, point).map(|l| l.name().to_string());
    report.replicas = args.replicas;
    report.versions = args.versions;
    report.timing_model = model_desc;
    report.tso_restart = measured.tso_restart.clone();
    report.lockd_restart = measured.lockd_restart.clone();
    report.failover = measured.failover.clone();
    report.etcd_restart = measured.etcd_restart.clone();
    report.cpu = measured.cpu.clone();
    report.breakdown = breakdown_rows(workload, &measured.workers);
    report.tocc_share = tocc_share(&measured.workers);
    report.lock_reads = (args.locks_on_memnodes() && protocol.needs_lockd()).then(|| {
        measured
            .workers
            .iter()
            .fold([0, 0], |[a, b], w| [a + w.lock_reads.0, b + w.lock_reads.1])
    });
    report.cnodes = args.cnodes;
    report.cnode_events = measured.cnode_events.clone();
    if let Some(ms) = args.timeline_ms {
        // The run's intervals: up to its nominal end (the coordinators stop there; the
        // time their threads take to wind down is not the run's, and would show as
        // empty intervals), or to the last interval with a commit if later.
        let nominal = measured
            .elapsed
            .min(Duration::from_secs_f64(args.duration()));
        let last_commit = measured
            .timelines
            .iter()
            .filter_map(|t| t.commits.iter().rposition(|&c| c > 0))
            .max()
            .map_or(0, |i| i + 1);
        let intervals =
            ((nominal.as_nanos() as u64).div_ceil(ms * 1_000_000) as usize).max(last_commit);
        report.timeline = Some(TimelineReport::new(
            ms,
            measured.timelines.clone(),
            intervals,
            measured.fault.clone(),
        ));
    }
    let si = protocol.isolation() == Some(Isolation::Snapshot);
    report.serializability_required = !si;
    report.snapshot_isolation_required = si;
    report
}

/// The workers' breakdowns merged, as rows per type (`None` without `--breakdown`).
fn breakdown_rows(
    workload: &dyn WorkloadSpec,
    workers: &[WorkerStats],
) -> Option<Vec<crate::breakdown::BreakdownRow>> {
    let kinds = workload.kinds();
    let mut all = Breakdown::with_kinds(kinds.len());
    let mut any = false;
    for w in workers {
        if let Some(b) = &w.breakdown {
            any = true;
            if let Err(e) = all.merge(b) {
                eprintln!("breakdown: {e}");
            }
        }
    }
    any.then(|| all.rows(&kinds))
}

/// The workers' TOCC shares summed per table (empty unless Scythe ran).
fn tocc_share(workers: &[WorkerStats]) -> Vec<ToccShare> {
    let mut all: Vec<ToccShare> = Vec::new();
    for s in workers.iter().flat_map(|w| &w.tocc_share) {
        match all.iter_mut().find(|a| a.table == s.table) {
            Some(a) => {
                a.attempts += s.attempts;
                a.tocc += s.tocc;
            }
            None => all.push(s.clone()),
        }
    }
    all.retain(|s| s.attempts > 0);
    all
}

/// Check the workers' recorded histories (`checks` names the check, for stderr):
/// serializability, and for MVCC snapshot isolation too (the one `mvcc-si` is judged
/// by; informative for `mvcc`). Errors: a worker that recorded no history.
fn check_history(
    protocol: Protocol,
    checks: &str,
    report: &mut Report,
    workers: &mut [WorkerStats],
) -> anyhow::Result<()> {
    let mut history = txn::history::History::new(usize::MAX);
    for w in workers {
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
    if protocol.isolation().is_some() {
        report.snapshot_isolation(&txn::snapshot_isolation::check(&history));
    }
    eprintln!("checked in {:.2} s", t0.elapsed().as_secs_f64());
    Ok(())
}

/// What one coordinator thread runs.
pub(crate) struct WorkerPlan {
    /// The thread's index among all coordinator threads of the run (seeds and TPC-C
    /// home warehouses follow it).
    pub(crate) tid: usize,
    pub(crate) coroutines: usize,
    pub(crate) seed: u64,
    pub(crate) max_backoff_us: u64,
    /// Names of the transaction kinds.
    pub(crate) kinds: Vec<&'static str>,
    /// TPC-C warehouses (home warehouse of coroutine g over all threads: g mod N + 1).
    pub(crate) warehouses: u16,
    /// Each coroutine runs one transaction of every kind before the mix.
    pub(crate) each_type_first: bool,
    pub(crate) cfg: TxnConfig,
    pub(crate) addrs: ClusterAddrs,
    pub(crate) core: Option<core_affinity::CoreId>,
    /// The run's clock; its `t0_ns` is read from `t0` once the threads start together.
    pub(crate) clock: RunClock,
    pub(crate) t0: Arc<AtomicU64>,
    /// Coordinator processes: a second barrier after `gate`, passed when the parent
    /// says go (the run's `t0` is stored by then).
    pub(crate) go: Option<Arc<Barrier>>,
    /// Coordinator processes: where the thread streams its stats and history while it
    /// runs ([`crate::cnode`]).
    pub(crate) flush: Option<crate::cnode::Flush>,
    /// The compute node's incarnation (0 in `txn-bench` itself, +1 per restart of a
    /// coordinator process). TODO(recovery): into the transaction ids once the txn
    /// layer takes it (today a restarted compute node's ids repeat its previous
    /// incarnation's).
    pub(crate) incarnation: u32,
    /// The compute node's ledger and this thread's first slot in it (coordinator
    /// processes only).
    pub(crate) ledger: Option<(Arc<crate::ledger::Ledger>, usize)>,
    /// `--qp-errors-ms`: inject a QP error to memory node 0 this often.
    pub(crate) qp_errors: Option<Duration>,
    /// The thread's runtime settings (a topology file's `[runtime]` with `--hosts`,
    /// else the defaults), before `reconnect_give_up`.
    pub(crate) runtime: RuntimeConfig,
    /// How long the thread's QP pools try to reconnect to an unreachable node before
    /// calling it gone (`None`: the runtime's default, 10 s). Memory-node kills use a
    /// short one: a killed node's operations then fail in a fraction of a second, and
    /// the attempts they belong to end, which the failover's drain waits for.
    pub(crate) reconnect_give_up: Option<Duration>,
    /// `--routing`: with `ideal` and a Lotus site, the coroutines draw read-write
    /// transactions on this compute node's shards ([`crate::routing`]).
    pub(crate) routing: crate::routing::Routing,
    /// `--routing forward`: this compute node's inbox of forwarded transactions (its
    /// home coroutines serve it), with a Lotus site.
    pub(crate) inbox: Option<Arc<crate::forward::Inbox>>,
    /// Whether this thread reports its process's version table cache (the first
    /// thread of a coordinator process).
    pub(crate) reports_vtc: bool,
    /// `--warmup`: from the run's start (`t0`) this long, what the thread counts for the
    /// report is warm-up ([`WorkerStats::restart_window`] at its end); zero: none.
    pub(crate) warmup: Duration,
}

/// A coordinator thread: connect, wait at `gate` for the others, run `w.coroutines`
/// coroutines of `mix` until `stop`, and return the thread's counters and history.
pub(crate) fn worker(
    w: WorkerPlan,
    fabric: Fabric,
    mix: Arc<dyn Mix>,
    stop: Arc<AtomicBool>,
    committed: Arc<AtomicU64>,
    gate: Arc<Barrier>,
) -> anyhow::Result<WorkerStats> {
    let tid = w.tid;
    if let Some(c) = w.core {
        core_affinity::set_for_current(c);
    }
    let connected = (|| {
        let ctx = ThreadCtx::new(fabric, w.thread_runtime())?;
        let client = w.connect(&ctx)?;
        anyhow::Ok((ctx, client))
    })();
    gate.wait();
    if let Some(go) = &w.go {
        go.wait();
    }
    let (ctx, client) =
        connected.with_context(|| format!("coordinator thread {tid} connecting"))?;
    let mut ex = Executor::new(ctx.clone());
    let running = start_coroutines(w, &ctx, client, mix, stop, committed, &mut |t| ex.spawn(t))?;
    ex.run();
    running.finish(&ctx)
}

impl WorkerPlan {
    /// The runtime settings of the thread's context: [`WorkerPlan::runtime`] with
    /// [`WorkerPlan::reconnect_give_up`].
    pub(crate) fn thread_runtime(&self) -> RuntimeConfig {
        let mut rt = self.runtime.clone();
        if let Some(g) = self.reconnect_give_up {
            rt.reconnect_give_up = g;
        }
        rt
    }

    /// The thread's transaction client on `ctx` (connected to the run's memory nodes,
    /// oracle and lock service). Errors: a node cannot be reached.
    pub(crate) fn connect(&self, ctx: &Rc<ThreadCtx>) -> anyhow::Result<Rc<TxnClient>> {
        let mut cfg = self.cfg.clone();
        if let Some(r) = &mut cfg.range_index {
            // 2 per coroutine (see `range_ids_per_thread`); a restarted process's threads
            // take their previous life's, at a new incarnation (below).
            let per = 2 * self.coroutines as u16;
            let first = self.tid as u16 * per;
            r.ids = first..first + per;
            let life = RANGE_LIVES.fetch_add(1, Ordering::Relaxed);
            r.incarnation = 2 + ((self.incarnation * 64 + life) % 253) as u8;
        }
        Ok(Rc::new(TxnClient::connect(ctx.clone(), &self.addrs, cfg)?))
    }
}

/// A coordinator thread's coroutines once started ([`start_coroutines`]): what
/// [`Running::finish`] reads when they all ended.
pub(crate) struct Running {
    stats: Rc<RefCell<WorkerStats>>,
    window: Rc<RefCell<Option<Baseline>>>,
    client: Rc<TxnClient>,
    /// The process's version table cache, when this thread reports it.
    vtc: Option<Arc<txn::vt_cache::VtCache>>,
}

/// Start a coordinator thread's coroutines on `ctx` through `spawn` (its executor's):
/// `w.coroutines` of `mix` (and as many home coroutines with `--routing forward`), the
/// stream to the parent, the warm-up's end and the QP error injector, all running until
/// `stop`. Call after the run's start (`w.t0` is read then). Errors: `--routing forward`
/// cannot reach another compute node.
pub(crate) fn start_coroutines(
    w: WorkerPlan,
    ctx: &Rc<ThreadCtx>,
    client: Rc<TxnClient>,
    mix: Arc<dyn Mix>,
    stop: Arc<AtomicBool>,
    committed: Arc<AtomicU64>,
    spawn: &mut dyn FnMut(crate::workload::Task),
) -> anyhow::Result<Running> {
    let tid = w.tid;
    let stats = Rc::new(RefCell::new(WorkerStats::with_kinds(w.kinds.len())));
    if w.cfg.record_phases {
        stats.borrow_mut().breakdown = Some(Breakdown::with_kinds(w.kinds.len()));
    }
    let kinds: Rc<[&'static str]> = w.kinds.clone().into();
    let warmup_ns = u64::try_from(w.warmup.as_nanos()).unwrap_or(u64::MAX);
    // The timeline counts from the measured window's start (the warm-up's commits land
    // in interval 0 and are cleared at its end).
    let clock = RunClock {
        t0_ns: w.t0.load(Ordering::SeqCst).saturating_add(warmup_ns),
        ..w.clock
    };
    let route = match (w.routing, &w.cfg.lotus) {
        (crate::routing::Routing::Ideal, Some(site)) => {
            Some(Arc::new(crate::routing::Route::from_site(site)))
        }
        _ => None,
    };
    let forward = match (w.routing, &w.cfg.lotus, &w.inbox) {
        (crate::routing::Routing::Forward, Some(site), Some(inbox)) => {
            // The other compute nodes' lock services serve the forwarding RPC.
            for &peer in &site.peers {
                ctx.connect_rpc(peer).with_context(|| {
                    format!(
                        "coordinator thread {tid}: connecting to compute node {peer} to forward"
                    )
                })?;
            }
            Some(crate::forward::ForwardPlan {
                route: Arc::new(crate::routing::Route::from_site(site)),
                inbox: inbox.clone(),
            })
        }
        _ => None,
    };
    // TPC-C under `ideal`: home warehouses among the ones whose shard is this node's.
    let homes: Vec<u16> = route.as_ref().map_or(Vec::new(), |r| {
        r.local_warehouses(txn::tpcc::WAREHOUSE, w.warehouses)
    });
    if let Some(f) = &w.flush {
        spawn(Box::pin(f.clone().run(
            clock,
            tid,
            client.clone(),
            stats.clone(),
            stop.clone(),
        )));
    }
    let lock_table = w.cfg.lotus.as_ref().and_then(|s| s.local.clone());
    for co in 0..w.coroutines {
        let coroutine = Coroutine {
            client: client.clone(),
            stats: stats.clone(),
            stop: stop.clone(),
            committed: committed.clone(),
            kinds: kinds.clone(),
            // A restarted compute node draws other transactions than its predecessor.
            seed: w.seed
                ^ ((tid as u64) << 32 | co as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                ^ u64::from(w.incarnation).wrapping_mul(0xA076_1D64_78BD_642F),
            max_backoff_us: w.max_backoff_us,
            home: if homes.is_empty() {
                ((tid * w.coroutines + co) % usize::from(w.warehouses.max(1))) as u16 + 1
            } else {
                homes[(tid * w.coroutines + co) % homes.len()]
            },
            each_type_first: w.each_type_first,
            clock,
            ledger: w.ledger.as_ref().map(|(l, base)| l.slot(base + co)),
            route: route.clone(),
            forward: forward.clone(),
            lock_table: lock_table.clone(),
        };
        spawn(mix.clone().coordinator(coroutine));
    }
    if let Some(f) = &forward {
        // As many home coroutines, serving what the other nodes forward here.
        for co in 0..w.coroutines {
            let coroutine = Coroutine {
                client: client.clone(),
                stats: stats.clone(),
                stop: stop.clone(),
                committed: committed.clone(),
                kinds: kinds.clone(),
                seed: w.seed ^ ((tid as u64) << 32 | co as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93),
                max_backoff_us: w.max_backoff_us,
                home: 1,
                each_type_first: false,
                clock,
                ledger: None,
                route: None,
                forward: None,
                lock_table: lock_table.clone(),
            };
            spawn(mix.clone().home(coroutine, f.inbox.clone()));
        }
    }
    // The warm-up's end: this thread's counters restart; its cumulative network,
    // one-sided and TOCC counters are snapshot for the difference at the end.
    let window: Rc<RefCell<Option<Baseline>>> = Rc::default();
    if warmup_ns > 0 {
        let (ctx, client, stats, stop, window) = (
            ctx.clone(),
            client.clone(),
            stats.clone(),
            stop.clone(),
            window.clone(),
        );
        spawn(Box::pin(async move {
            // A run stopped during its warm-up measured nothing: its window is empty.
            loop {
                let now = txn::history::monotonic_ns();
                if now >= clock.t0_ns || stop.load(Ordering::Relaxed) {
                    break;
                }
                ctx.sleep(Duration::from_nanos(clock.t0_ns - now).min(WARMUP_POLL))
                    .await;
            }
            stats.borrow_mut().restart_window();
            *window.borrow_mut() = Some(Baseline {
                rpc: ctx.stats(),
                ops: client.memnode_ops(),
                tocc: client.tocc_share(),
                lock_reads: client.lock_read_counts(),
            });
        }));
    }
    if let Some(every) = w.qp_errors {
        let (ctx, stats, stop) = (ctx.clone(), stats.clone(), stop.clone());
        spawn(Box::pin(async move {
            let memnode = NodeId(crate::txn_args::NODE_MEMNODE);
            while !stop.load(Ordering::Relaxed) {
                ctx.sleep(every).await;
                // Break the QPs while WRs are in flight on them (a few rounds at most),
                // as a link failure meets them.
                for _ in 0..1000 {
                    if ctx.one_sided_in_flight(memnode) > 0 {
                        break;
                    }
                    ctx.yield_now().await;
                }
                // Not connected (yet, or the node is gone): nothing to break.
                if let Ok(n) = ctx.inject_qp_error(memnode, rrpc::straw::QpKind::OneSided) {
                    stats.borrow_mut().qp_errors += n as u64;
                }
            }
        }));
    }
    let vtc = w
        .reports_vtc
        .then(|| w.cfg.lotus.as_ref().and_then(|l| l.cache.clone()))
        .flatten();
    Ok(Running {
        stats,
        window,
        client,
        vtc,
    })
}

impl Running {
    /// The thread's counters and history, once every coroutine [`start_coroutines`]
    /// spawned has ended and was dropped. Errors: a coroutine still holds the counters.
    pub(crate) fn finish(self, ctx: &Rc<ThreadCtx>) -> anyhow::Result<WorkerStats> {
        let Self {
            stats,
            window,
            client,
            vtc,
        } = self;
        let mut s = Rc::try_unwrap(stats)
            .map_err(|_| anyhow::anyhow!("stats still shared"))?
            .into_inner();
        let base = window.borrow_mut().take().unwrap_or_default();
        s.rpc = ctx.stats().since(&base.rpc);
        s.memnode_ops = client.memnode_ops().since(&base.ops);
        s.vtc = vtc.map(|c| c.stats());
        s.tso_epoch = client.tso().client().epoch();
        s.tso_reconnects = client.tso().reconnects();
        s.lock_reconnects = client.lock_reconnects();
        s.transient_retries = txn::transient::retries();
        s.history = client.take_history();
        let tables = client.tables();
        let (sent, taken) = client.lock_read_counts();
        s.lock_reads = (
            sent.saturating_sub(base.lock_reads.0),
            taken.saturating_sub(base.lock_reads.1),
        );
        s.tocc_share = client
            .tocc_share()
            .into_iter()
            .enumerate()
            .map(|(i, (attempts, tocc))| {
                let (a0, t0) = base.tocc.get(i).copied().unwrap_or((0, 0));
                (i, (attempts.saturating_sub(a0), tocc.saturating_sub(t0)))
            })
            .map(|(i, (attempts, tocc))| ToccShare {
                table: tables
                    .get(i)
                    .map_or_else(|| format!("table {i}"), |t| t.name.clone()),
                attempts,
                tocc,
            })
            .collect();
        let lost: u64 = client.lock_services().iter().map(|l| l.lost()).sum();
        if lost > 0 {
            s.fatal.push(format!(
                "{lost} lock(s) lost: dropped tickets could not be released"
            ));
        }
        Ok(s)
    }
}

/// How often a thread looks whether its warm-up is over (it ends within this).
const WARMUP_POLL: Duration = Duration::from_millis(5);

/// A coordinator thread's cumulative counters at the warm-up's end (all zero without
/// one), subtracted from the same counters at the run's end.
#[derive(Default)]
struct Baseline {
    rpc: rrpc::runtime::Stats,
    ops: rrpc::runtime::OpCounts,
    /// Per table: attempts that read it, of those TOCC ones.
    tocc: Vec<(u64, u64)>,
    /// Lock-and-read RPCs, and grants that brought their object.
    lock_reads: (u64, u64),
}

/// `--kill-lockd-after`: SIGKILL the lock service, keep it down for `down`, restart it
/// with the same flags, state directory and address, and record the epochs and the
/// commits so far (the rest of the record is filled in after the run).
pub(crate) fn restart_lockd(
    cluster: &mut RunCluster,
    down: Duration,
    committed: &AtomicU64,
    started: std::time::Instant,
) -> anyhow::Result<LockdRestart> {
    let addr = cluster
        .addrs
        .lockd
        .context("--kill-lockd-after: this run has no lock service")?;
    // Where it runs (another host with --hosts: killed and started again there).
    let (place, log) = cluster
        .cluster
        .place_of(NODE_LOCKD)
        .context("--kill-lockd-after: the lock service is not running")?;
    let epoch_file = cluster.lockd_state.join(lockd::epoch::EPOCH_FILE);
    let epoch_before = epoch_at(&place, &epoch_file)?;
    let killed_at_s = started.elapsed().as_secs_f64();
    cluster.cluster.kill(NODE_LOCKD)?;
    eprintln!(
        "[{killed_at_s:.1}s] SIGKILLed the lock service (epoch {epoch_before}) on {}",
        place.describe()
    );
    std::thread::sleep(down);
    let mut flags = cluster.lockd_flags.clone();
    flags.extend(["--listen".into(), addr.to_string()]);
    cluster.cluster.start_at(
        &place,
        "lockd",
        NODE_LOCKD,
        &flags,
        Duration::from_secs(60),
        log.as_deref(),
    )?;
    let epoch_after = epoch_at(&place, &epoch_file)?;
    let committed_before_ready = committed.load(Ordering::Relaxed);
    let grace_ms = lockd::embed::DEFAULT_RESTART_GRACE_MS;
    eprintln!(
        "[{:.1}s] lock service restarted in epoch {epoch_after}; it grants from {grace_ms} ms on",
        started.elapsed().as_secs_f64()
    );
    Ok(LockdRestart {
        killed_at_s,
        epoch_before,
        epoch_after,
        grace_ms,
        committed_before_ready,
        committed_after_ready: 0,
        thread_reconnects: Vec::new(),
    })
}

/// `--kill-memnode-after ... --restart`: start memory node `m` again, empty, at its
/// old address, and let the view manager re-replicate onto it.
fn restart_memnode(
    cluster: &mut RunCluster,
    mgr: &crate::failover::ViewManager,
    m: u32,
    run_start: std::time::Instant,
) -> anyhow::Result<crate::failover::Restart> {
    let started = start_memnode_again(cluster, m, run_start)?;
    mgr.re_replicate(m, started, run_start)
}

/// Start memory node `m` again, empty (`memnode --empty`), at its old address; returns
/// when it answered. Errors: it did not start.
pub(crate) fn start_memnode_again(
    cluster: &mut RunCluster,
    m: u32,
    run_start: std::time::Instant,
) -> anyhow::Result<std::time::Instant> {
    let addr = *cluster
        .addrs
        .memnodes
        .get(m as usize)
        .context("no such memory node")?;
    let mut flags = cluster
        .memnode_flags
        .get(m as usize)
        .context("no flags for that memory node")?
        .clone();
    flags.extend(["--empty".into(), "--listen".into(), addr.to_string()]);
    cluster
        .cluster
        .start("memnode", NODE_MEMNODE + m, &flags, START_TIMEOUT)
        .with_context(|| format!("starting memory node {m} again"))?;
    let started = std::time::Instant::now();
    eprintln!(
        "[{:.1}s] memory node {m} started again (empty) at {addr}",
        run_start.elapsed().as_secs_f64()
    );
    Ok(started)
}

/// The epoch a service persisted in `file` (its state directory's epoch file) where it
/// runs: read here, or through ssh (`cat`) on another host. 0 when a local file does not
/// exist yet, as the services' own loaders say.
///
/// Errors: the file cannot be read (a remote one that is missing included) or holds no
/// number.
fn epoch_at(place: &crate::launcher::Place, file: &std::path::Path) -> anyhow::Result<u64> {
    if *place == crate::launcher::Place::Local && !file.exists() {
        return Ok(0);
    }
    let text = place.read(file)?;
    let text = String::from_utf8_lossy(&text);
    text.trim()
        .parse::<u64>()
        .with_context(|| format!("{}: not an epoch: {:?}", file.display(), text.trim()))
}

/// The lock service's restart as the timeline's fault.
pub(crate) fn lockd_fault(r: Option<&LockdRestart>) -> Option<Fault> {
    r.map(|r| Fault {
        what: "lockd killed".into(),
        at_ms: r.killed_at_s * 1e3,
        cnode: None,
        recovered_ms: None,
    })
}

/// `--kill-tso-after`: SIGKILL the oracle, keep it down for `down`, restart it with the
/// same state directory and address (`args`), and record the epochs and the commits so
/// far (the rest of the record is filled in after the run).
pub(crate) fn restart_tso(
    cluster: &mut LocalCluster,
    state: &std::path::Path,
    args: &[String],
    down: Duration,
    committed: &AtomicU64,
    started: std::time::Instant,
) -> anyhow::Result<TsoRestart> {
    // Where it runs (another host with --hosts: killed and started again there).
    let (place, log) = cluster
        .place_of(NODE_TSO)
        .context("--kill-tso-after: the oracle is not running")?;
    let epoch_file = state.join(tso::epoch::EPOCH_FILE);
    let tso_epoch = |place: &crate::launcher::Place| -> anyhow::Result<u16> {
        let e = epoch_at(place, &epoch_file)?;
        u16::try_from(e).with_context(|| format!("oracle epoch {e} is above 65535"))
    };
    let epoch_before = tso_epoch(&place)?;
    let killed_at_s = started.elapsed().as_secs_f64();
    cluster.kill(NODE_TSO)?;
    eprintln!(
        "[{killed_at_s:.1}s] SIGKILLed the timestamp oracle (epoch {epoch_before}) on {}",
        place.describe()
    );
    std::thread::sleep(down);
    cluster.start_at(
        &place,
        "tso",
        NODE_TSO,
        args,
        Duration::from_secs(60),
        log.as_deref(),
    )?;
    let epoch_after = tso_epoch(&place)?;
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
        uses_tso: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    fn args(a: &[&str]) -> Args {
        Args::parse_from(std::iter::once("txn-bench").chain(a.iter().copied()))
    }

    #[test]
    fn a_memnode_stop_must_lie_within_a_run_of_coordinators_inside_txn_bench() {
        args(&["--stop-memnode-after", "1", "--duration", "2"])
            .validate()
            .unwrap();
        for (bad, want) in [
            (
                &["--stop-memnode-after", "3", "--duration", "2"][..],
                "within the run",
            ),
            (
                &["--stop-memnode-after", "1", "--cnodes", "2"],
                "coordinators inside txn-bench",
            ),
            (
                &["--stop-memnode-after", "1", "--stop-ms", "0"],
                "--stop-ms",
            ),
            (
                &["--stop-memnode-after", "1", "--memnode", "1"],
                "--memnode 1 must be below",
            ),
        ] {
            let e = format!("{:#}", args(bad).validate().unwrap_err());
            assert!(e.contains(want), "{bad:?}: {e}");
        }
    }

    #[test]
    fn auto_lock_placement_puts_the_locks_on_the_memnodes_where_they_can_stay() {
        assert!(args(&[]).locks_on_memnodes());
        assert!(args(&["--lock-placement", "memnode"]).locks_on_memnodes());
        for a in [
            &["--lock-placement", "lockd"][..],
            &["--replicas", "2", "--memnodes", "2"],
            &["--kill-lockd-after", "1"],
        ] {
            let a = args(a);
            assert!(!a.locks_on_memnodes(), "{a:?}");
            a.validate().unwrap();
        }
        for (bad, want) in [
            (
                &[
                    "--lock-placement",
                    "memnode",
                    "--replicas",
                    "2",
                    "--memnodes",
                    "2",
                ][..],
                "--replicas above 1",
            ),
            (
                &["--lock-placement", "memnode", "--kill-lockd-after", "1"],
                "no lockd node runs",
            ),
            (&["--sweep", "lock-placement=auto,memnode"], "not auto"),
        ] {
            let e = format!("{:#}", args(bad).validate().unwrap_err());
            assert!(e.contains(want), "{bad:?}: {e}");
        }
        let a = args(&["--sweep", "lock-placement=lockd,memnode"]);
        let p = a.points();
        assert!(!p[0].args(&a).unwrap().locks_on_memnodes());
        assert!(p[1].args(&a).unwrap().locks_on_memnodes());
        assert!(storage_desc(&a, Some(&p[0])).ends_with(", Scythe's locks on lockd"));
        assert!(storage_desc(&a, None).ends_with(", Scythe's locks placed per point"));
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
            ["occ-cas", "scythe", "mvcc", "lotus"]
        );
        assert_eq!(
            names(&["--protocol", "all", "--isolation", "si"]).unwrap(),
            ["occ-cas", "scythe", "mvcc-si", "lotus-si"]
        );
        // With coordinator processes `all` leaves Lotus out unless routed; by name it
        // runs.
        assert_eq!(
            names(&["--protocol", "all", "--cnodes", "2"]).unwrap(),
            ["occ-cas", "scythe", "mvcc"]
        );
        assert_eq!(
            names(&["--protocol", "all", "--cnodes", "2", "--routing", "ideal"]).unwrap(),
            ["occ-cas", "scythe", "mvcc", "lotus"]
        );
        assert_eq!(
            names(&["--protocol", "lotus", "--cnodes", "2"]).unwrap(),
            ["lotus"]
        );
        assert_eq!(
            names(&["--protocol", "lotus", "--isolation", "si"]).unwrap(),
            ["lotus-si"]
        );
        let e = names(&["--protocol", "lotus-si", "--isolation", "sr"]).unwrap_err();
        assert!(e.contains("contradicts --isolation sr"), "{e}");
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
        use crate::txn_args::LogSetting::{Off, Ordered, RoundBefore};
        assert_eq!(
            "commit-log=off,on,ordered".parse::<Sweep>(),
            Ok(Sweep::CommitLog(vec![Off, RoundBefore, Ordered]))
        );
        assert_eq!(
            Sweep::CommitLog(vec![Off, RoundBefore, Ordered]).to_string(),
            "commit-log=off,on,ordered"
        );
        assert_eq!(
            "vtc-entries=0,65536".parse::<Sweep>(),
            Ok(Sweep::VtcEntries(vec![0, 65536]))
        );
        assert_eq!(
            Sweep::VtcEntries(vec![0, 65536]).to_string(),
            "vtc-entries=0,65536"
        );
        use crate::lotus_cn::LockServing;
        assert_eq!(
            "lock-serving=coordinator,thread".parse::<Sweep>(),
            Ok(Sweep::LockServing(vec![
                LockServing::Coordinator,
                LockServing::Thread
            ]))
        );
        assert_eq!(
            Sweep::LockServing(vec![LockServing::Thread]).to_string(),
            "lock-serving=thread"
        );
        let p = args(&[
            "--sweep",
            "lock-serving=coordinator,thread",
            "--cnodes",
            "2",
        ])
        .points();
        assert_eq!(p[1].lock_serving, Some(LockServing::Thread));
        assert_eq!(p[1].label.as_deref(), Some("lock-serving=thread"));
        for bad in [
            "lock-serving=core",
            "theta",
            "theta=",
            "theta=1,,2",
            "theta=-1",
            "theta=inf",
            "clients=0",
            "clients=1.5",
            "commit-log=maybe",
            "vtc-entries=-1",
            "vtc-entries=many",
            "replicas=0",
            "replicas=two",
            "x=1",
        ] {
            assert!(bad.parse::<Sweep>().is_err(), "{bad}");
        }
        // Copies per point; every point is checked as --replicas would be.
        assert_eq!(
            "replicas=1,3".parse::<Sweep>(),
            Ok(Sweep::Replicas(vec![1, 3]))
        );
        assert_eq!(Sweep::Replicas(vec![1, 3]).to_string(), "replicas=1,3");
        assert_eq!(
            "max-backoff-us=0,100,1000".parse::<Sweep>(),
            Ok(Sweep::MaxBackoffUs(vec![0, 100, 1000]))
        );
        assert_eq!(
            Sweep::MaxBackoffUs(vec![100, 1000]).to_string(),
            "max-backoff-us=100,1000"
        );
        assert!("max-backoff-us=-1"
            .parse::<Sweep>()
            .unwrap_err()
            .contains("not a number of microseconds"));
        let a = args(&["--sweep", "replicas=1,3", "--memnodes", "3"]);
        a.validate().unwrap();
        let p = a.points();
        assert_eq!(
            (p[1].replicas, p[1].label.as_deref()),
            (Some(3), Some("replicas=3"))
        );
        assert!(
            storage_desc(&a, None).contains("replicas per point"),
            "{}",
            storage_desc(&a, None)
        );
        // One run's header names its own copies; one copy says nothing of them.
        assert!(storage_desc(&a, Some(&p[1])).contains(", 3 replicas ("));
        assert_eq!(
            storage_desc(&a, Some(&p[0])),
            "3 memnode(s), 4 versions, Scythe's locks on the memnodes"
        );
        let e = args(&["--sweep", "replicas=1,3", "--memnodes", "2"])
            .validate()
            .unwrap_err();
        assert!(
            format!("{e:#}").contains("--sweep replicas=3: --replicas must be 1 to --memnodes (2)"),
            "{e:#}"
        );
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

    fn spec(a: &Args) -> Box<dyn WorkloadSpec> {
        workload_spec(a).unwrap()
    }

    #[test]
    fn workload_flags() {
        let w = spec(&args(&["--workload", "ycsb-b", "--records", "500"]));
        assert_eq!(w.scale(), "500 records x 40 B, 4 ops/txn");
        assert_eq!(w.kinds(), ["read-only", "update"]);
        assert_eq!(w.keys(), 500);
        let w = spec(&args(&["--workload", "kvs"]));
        assert!(w.scale().ends_with(", 1 ops/txn"), "{}", w.scale());
        let w = spec(&args(&[]));
        assert_eq!((w.label(), w.kinds().len()), ("SmallBank", 6));
        let w = spec(&args(&["--workload", "ycsb-e"]));
        assert_eq!(w.kinds(), ["scan", "insert"]);
        assert!(w.scale().ends_with(", 1 ops/txn"), "{}", w.scale());
        let w = spec(&args(&["--workload", "tatp", "--subscribers", "5000"]));
        assert_eq!((w.label(), w.scale()), ("TATP", "5000 subscribers".into()));
        assert_eq!((w.kinds().len(), w.lockd_locks()), (7, 21 * 5000));
        // TPC-C: one warehouse per coordinator thread unless --warehouses says.
        let a = args(&["--workload", "tpcc", "--threads", "3"]);
        let w = spec(&a);
        assert_eq!((a.warehouses(), w.scale().as_str()), (3, "3 warehouse(s)"));
        assert_eq!(w.skew(0.99), "keys by TPC-C's NURand and home warehouses");
        let a = args(&["--workload", "tpcc", "--warehouses", "4", "--threads", "1"]);
        assert_eq!((a.warehouses(), spec(&a).keys()), (4, 4));
        let w = spec(&args(&["--hot-accounts", "100", "--hot-fraction", "0.7"]));
        assert_eq!(w.scale(), "100000 accounts, 100 hot for 70% of draws");
    }

    #[test]
    fn shared_flags_are_checked_before_the_workload() {
        let err = |a: &[&str]| args(a).validate().unwrap_err().to_string();
        assert!(err(&["--threads", "0"]).contains("--threads"));
        assert!(err(&["--coroutines", "0"]).contains("--coroutines"));
        assert!(err(&["--duration", "0"]).contains("--duration"));
        assert!(err(&["--memnodes", "0"]).contains("--memnodes must be 1 to"));
        assert!(err(&["--versions", "65"]).contains("--versions must be 1 to 64"));
        assert!(err(&["--kill-tso-after", "3", "--duration", "2"]).contains("--kill-tso-after"));
        assert!(err(&["--check-memory-mb", "0"]).contains("--check-memory-mb"));
        assert!(err(&["--chart", "x.pdf"]).contains(".svg or .png"));
        assert!(
            args(&["--threads", "1", "--no-check", "--check-memory-mb", "0"])
                .validate()
                .is_ok()
        );
        // A warm-up, and fault flags counted from its end (within --duration).
        assert!(
            args(&["--warmup", "2s", "--kill-tso-after", "1", "--duration", "2"])
                .validate()
                .is_ok()
        );
        // Timeline, history file, coordinator processes and their faults.
        assert!(err(&["--timeline-ms", "0"]).contains("--timeline-ms must be 1 to 1000"));
        assert!(err(&["--timeline-ms", "1001"]).contains("--timeline-ms"));
        assert!(err(&["--history-out", "h", "--no-check"]).contains("drop --no-check"));
        assert!(err(&["--cnodes", "0"]).contains("--cnodes must be 1 to"));
        assert!(err(&["--kill-cn-after", "1"]).contains("needs --cnodes 2 or more"));
        assert!(err(&["--stop-cn-after", "1"]).contains("needs --cnodes 2 or more"));
        let two = ["--cnodes", "2", "--duration", "2"];
        let with = |extra: &[&str]| err(&[&two[..], extra].concat());
        assert!(with(&["--kill-cn-after", "2"]).contains("must lie within the run"));
        assert!(with(&["--stop-cn-after=-1"]).contains("must lie within the run"));
        assert!(with(&["--kill-cn-after", "1", "--cn", "2"])
            .contains("--cn 2 must be below --cnodes 2"));
        assert!(with(&["--restart"]).contains("--restart goes with --kill-cn-after"));
        assert!(with(&["--cn", "0"]).contains("--cn goes with"));
        assert!(with(&["--stop-cn-after", "1", "--stop-ms", "0"]).contains("--stop-ms"));
        // Lotus's resharding loop: across compute nodes, on Lotus's lock tables.
        assert!(err(&["--reshard-loop"]).contains("needs --cnodes 2 or more"));
        assert!(with(&["--reshard-loop"]).contains("needs --protocol lotus"));
        // Lotus's ablation: its own run plan, across compute nodes.
        assert!(err(&["--ablation"]).contains("needs --cnodes 2 or more"));
        assert!(
            with(&["--ablation", "--ablation-rounds", "0"]).contains("--rounds must be 1 to 20")
        );
        assert!(err(&["--protocol", "all", "--rounds", "21"]).contains("must be 1 to 20"));
        assert!(with(&["--ablation", "--sweep", "theta=0,1"]).contains("not with --sweep"));
        assert!(with(&["--ablation", "--protocol", "all"]).contains("drop --protocol all"));
        let ok = args(
            &[
                &two[..],
                &[
                    "--threads",
                    "1",
                    "--kill-cn-after",
                    "1",
                    "--restart",
                    "--cn",
                    "0",
                ],
            ]
            .concat(),
        );
        assert!(ok.validate().is_ok());
    }

    /// The range index lives on memory node 0 alone (not replicated): a failover of
    /// that node is refused, of another one allowed.
    #[test]
    fn killing_the_range_index_memnode_is_refused() {
        let kill = |extra: &[&str]| {
            args(
                &[
                    &[
                        "--memnodes",
                        "2",
                        "--replicas",
                        "2",
                        "--kill-memnode-after",
                        "1",
                    ][..],
                    extra,
                ]
                .concat(),
            )
            .validate()
            .map_err(|e| e.to_string())
        };
        for refused in [
            &["--workload", "ycsb-e"][..],
            &["--workload", "tpcc", "--range-index"],
            &["--workload", "tpcc", "--sweep", "range-index=off,on"],
        ] {
            let e = kill(refused).unwrap_err();
            assert!(
                e.contains("alone holds the range index"),
                "{refused:?}: {e}"
            );
        }
        kill(&["--workload", "ycsb-e", "--memnode", "1"]).unwrap();
        kill(&["--workload", "tpcc"]).unwrap();
    }

    #[test]
    fn the_flags_travel_to_coordinator_processes_as_json() {
        let a = args(&[
            "--workload",
            "pairs",
            "--protocol",
            "mvcc-si",
            "--sweep",
            "theta=0,0.5",
            "--groups",
            "7",
            "--warmup",
            "250ms",
        ]);
        let back: Args = serde_json::from_str(&serde_json::to_string(&a).unwrap()).unwrap();
        // The warm-up's end reaches coordinator processes: they count it from `go`.
        assert_eq!(back.run.warmup(), Duration::from_millis(250));
        assert_eq!(back.workload, Workload::Pairs);
        assert_eq!(back.protocols().unwrap(), a.protocols().unwrap());
        assert_eq!(back.sweep, a.sweep);
        assert_eq!(back.groups, 7);
        let e = serde_json::from_str::<Args>(
            &serde_json::to_string(&a).unwrap().replace("mvcc-si", "2pl"),
        );
        assert!(e.unwrap_err().to_string().contains("unknown protocol"));
    }

    #[test]
    fn bad_workload_combinations_are_refused_before_any_cluster_starts() {
        let stop = Arc::new(AtomicBool::new(false));
        let err = |a: &[&str]| run(args(a), stop.clone()).unwrap_err().to_string();
        assert!(err(&["--workload", "tatp", "--sweep", "theta=0,0.5"]).contains("NURand"));
        assert!(err(&["--workload", "tatp", "--subscribers", "0"]).contains("--subscribers"));
        assert!(err(&["--workload", "tpcc", "--warehouses", "0"]).contains("--warehouses"));
        assert!(err(&["--workload", "tpcc", "--hot-accounts", "10"]).contains("smallbank only"));
        // One run per round leaves nothing to compare within a round.
        assert!(err(&["--protocol", "mvcc", "--rounds", "2"]).contains("several runs per round"));
        assert!(err(&["--rounds", "3"]).contains("--protocol all, --sweep"));
        let e = format!(
            "{:#}",
            run(args(&["--hot-accounts", "1"]), stop.clone()).unwrap_err()
        );
        assert!(e.contains("hot accounts must be 2"), "{e}");
    }

    /// `--reshard-back-after` needs the move it undoes, later; `--plant skip-cache-clear`
    /// needs a move and the cache; the plant travels to the coordinator processes (their
    /// `--run-spec`). This test build has the fault switches, so the plant itself is
    /// accepted here (a build without them refuses it: `Plant::allowed`).
    #[test]
    fn the_move_back_and_the_planted_cache_bug_need_what_they_act_on() {
        let lotus = ["--protocol", "lotus", "--cnodes", "2", "--duration", "2"];
        let check = |extra: &[&str]| {
            let mut a = args(&[&lotus[..], extra].concat());
            a.threads = Some(1);
            a.validate().map_err(|e| e.to_string())
        };
        let e = check(&["--reshard-back-after", "1"]).unwrap_err();
        assert!(e.contains("give both"), "{e}");
        let e = check(&["--reshard-after", "1", "--reshard-back-after", "0.5"]).unwrap_err();
        assert!(e.contains("after --reshard-after"), "{e}");
        let e = check(&["--reshard-after", "1", "--reshard-back-after", "2"]).unwrap_err();
        assert!(e.contains("within the run"), "{e}");
        let e = check(&["--plant", "skip-cache-clear"]).unwrap_err();
        assert!(e.contains("needs --reshard-after"), "{e}");
        let e = check(&[
            "--reshard-after",
            "1",
            "--plant",
            "skip-cache-clear",
            "--vtc-entries",
            "0",
        ])
        .unwrap_err();
        assert!(e.contains("--vtc-entries"), "{e}");
        assert!(Plant::allowed(), "test builds have the fault switches");
        let ok = [
            "--reshard-after",
            "0.5",
            "--reshard-back-after",
            "1",
            "--plant",
            "skip-cache-clear",
        ];
        check(&ok).unwrap();
        let a = args(&[&lotus[..], &ok[..]].concat());
        let back: Args = serde_json::from_str(&serde_json::to_string(&a).unwrap()).unwrap();
        assert_eq!(back.plant, Some(Plant::SkipCacheClear));
        assert_eq!(back.reshard_back_after, Some(1.0));
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
        assert!(a.no_check && a.model() == "cx5");
        std::fs::write(&f, "warehouse = 4\n").unwrap();
        let e = Args::parse_with_config(["txn-bench", "--config", path]).unwrap_err();
        assert!(matches!(e, ConfigError::File { .. }), "{e}");
        assert!(e.to_string().contains("--warehouse"), "{e}");
        std::fs::write(&f, "theta = \"high\"\n").unwrap();
        let e = Args::parse_with_config(["txn-bench", "--config", path]).unwrap_err();
        assert!(e.to_string().contains("exp.toml"), "{e}");
    }
}
