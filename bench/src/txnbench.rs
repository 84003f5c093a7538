//! `txn-bench`'s run: SmallBank on a local cluster over the shm fabric (the binary in
//! `src/bin/txn-bench.rs` parses flags and handles signals; tests call [`run`] directly).
//!
//! Starts a memory node, a lock service and a timestamp oracle as child processes, loads
//! SmallBank, runs `threads x coroutines` OCC coordinators for a fixed duration, prints
//! committed throughput, p50/p99 latency of committed transactions and abort rates per
//! transaction type, then checks the run: total money must equal the initial total plus
//! the net of committed deposits and withdrawals, no lock may be left held, every
//! transaction type must have committed, and (unless `--no-check`) the recorded history
//! of committed transactions must be serializable.

use rrpc::NodeId;
use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use rand::{Rng, SeedableRng};
use rrpc::fabric::{Fabric, FabricConfig, FabricKind};
use rrpc::runtime::{join_all, Executor, RuntimeConfig, ThreadCtx};
use txn::occ::{AbortReason, OccConfig, ServiceAddrs, TxnClient, TxnError};

use crate::launcher::{default_bin_dir, LocalCluster};
use crate::report::{Report, TsoRestart, TypeStats, WorkerStats};
use crate::smallbank::{self, Generator};

/// SmallBank on a local cluster (memnode + lockd + tso child processes) over the shm fabric,
/// with Scythe's low-heat OCC on Takeout Locks.
#[derive(Parser, Debug, Clone)]
#[command(version, about, long_about = None)]
pub struct Args {
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
    /// Zipf theta of account choice (0 = uniform).
    #[arg(long, default_value_t = 0.99)]
    pub theta: f64,
    /// Measured run time in seconds.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Write the report as JSON to this file.
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
    /// Cluster name (default: txn-bench-<pid>).
    #[arg(long)]
    pub cluster: Option<String>,
    /// Directory of the memnode, lockd and tso binaries (default: next to this binary).
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    /// Server threads of the lock service.
    #[arg(long, default_value_t = 1)]
    pub lockd_threads: usize,
    /// Longest randomized exponential backoff after a conflict abort, in microseconds
    /// (0 retries at once).
    #[arg(long, default_value_t = 100)]
    pub max_backoff_us: u64,
    /// How long a coordinator waits for a granted lock's turn before it aborts the
    /// transaction (lock-wait-timeout); its tickets are then released in the background
    /// when their turn comes. Microseconds.
    #[arg(long, default_value_t = 2_000_000, value_name = "US")]
    pub lock_wait_us: u64,
    /// RNG seed (each coroutine derives its own).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Do not record committed transactions or check serializability (for long runs;
    /// the check holds about 84 bytes per committed SmallBank transaction and needs about
    /// 300 while it runs).
    #[arg(long)]
    pub no_check: bool,
    /// Fault injection: SIGKILL the timestamp oracle this many seconds into the measured
    /// run and restart it with the same state directory and address after
    /// `--tso-down-ms`. Coordinators wait for it and switch to its new epoch; the run
    /// passes only if commits continue after the restart (reported as `tso restart`).
    #[arg(long, value_name = "SECONDS")]
    pub kill_tso_after: Option<f64>,
    /// With `--kill-tso-after`: milliseconds the oracle stays down before its restart.
    #[arg(long, default_value_t = 300, value_name = "MS")]
    pub tso_down_ms: u64,
    /// History memory for the serializability check, MiB over all threads; past it,
    /// later commits are not recorded and the check says it was partial. The check
    /// itself needs about 3.5x this at its peak.
    #[arg(long, default_value_t = 2048, value_name = "MIB")]
    pub check_memory_mb: usize,
}

const NODE_MEMNODE: u32 = 1;
const NODE_LOCKD: u32 = 2;
const NODE_TSO: u32 = 3;
const NODE_CN: u32 = 100;

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every check passed (the run may have been stopped early through `stop`).
    Passed,
    /// A check failed (money, locks, a type that never committed, serializability) or
    /// a coordinator hit a service failure.
    Failed,
}

/// Run the benchmark as `args` say, printing the configuration, progress (stderr) and
/// the report. Setting `stop` ends the measured run early (Ctrl-C); the checks still run.
///
/// Errors: bad arguments, a cluster that does not start, a service that dies, a
/// coordinator thread that panics; a failed check is not an error but
/// [`Outcome::Failed`].
pub fn run(mut args: Args, stop: Arc<AtomicBool>) -> anyhow::Result<(Report, Outcome)> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = *args.threads.get_or_insert(cores.saturating_sub(1).max(1));
    if threads == 0 || args.coroutines == 0 {
        bail!("--threads and --coroutines must be at least 1");
    }
    if args.accounts < 2 {
        bail!("--accounts must be at least 2");
    }
    if !(args.duration > 0.0 && args.duration.is_finite()) {
        bail!("--duration must be a positive number of seconds");
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
    let gen = Arc::new(Generator::new(args.accounts, args.theta)?);

    let cluster_name = args
        .cluster
        .clone()
        .unwrap_or_else(|| format!("txn-bench-{}", std::process::id()));
    let mut cluster = LocalCluster::new(
        &cluster_name,
        args.bin_dir.clone().unwrap_or_else(default_bin_dir),
    )?;
    // This process's fabric first: a missing RDMA device fails here, in one line.
    let mut fcfg = FabricConfig::new(args.fabric, &cluster_name, NodeId(NODE_CN));
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
    eprintln!("starting local cluster {cluster_name}: memnode, lockd, tso");
    let memnode = cluster.start(
        "memnode",
        NODE_MEMNODE,
        &with(&["--smallbank-accounts".into(), args.accounts.to_string()]),
        t,
    )?;
    let lockd = cluster.start(
        "lockd",
        NODE_LOCKD,
        &with(&[
            "--locks".into(),
            (2 * args.accounts).to_string(),
            "--threads".into(),
            args.lockd_threads.to_string(),
        ]),
        t,
    )?;
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
    let addrs = ServiceAddrs {
        memnode,
        lockd,
        tso,
    };

    let fabric_desc = fabric.describe();
    let model_desc = fabric.model_description();
    println!(
        "SmallBank | fabric: {} | timing model: {} | {} thread(s) x {} coroutines | {} accounts | Zipf theta {} | {} s | serializability check: {}",
        fabric_desc,
        model_desc,
        threads,
        args.coroutines,
        args.accounts,
        args.theta,
        args.duration,
        if args.no_check { "off" } else { "on" }
    );

    // Audit before: the loaded bank must hold the expected money.
    let (initial, _) = audit(&fabric, addrs, args.accounts)?;
    let expected_initial = txn::smallbank::initial_total(args.accounts);
    if initial != expected_initial {
        bail!("loaded bank holds {initial} cents, expected {expected_initial}");
    }

    // Workers connect, then start together.
    let committed = Arc::new(AtomicU64::new(0));
    let start_gate = Arc::new(Barrier::new(threads + 1));
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let mut handles = Vec::new();
    for tid in 0..threads {
        let (fabric, gen, stop, committed, gate) = (
            fabric.clone(),
            gen.clone(),
            stop.clone(),
            committed.clone(),
            start_gate.clone(),
        );
        let core = (!cores.is_empty()).then(|| cores[tid % cores.len()]);
        let a = args.clone();
        handles.push(
            std::thread::Builder::new()
                .name(format!("coordinator-{tid}"))
                .spawn(move || worker(tid, a, fabric, addrs, gen, stop, committed, gate, core))?,
        );
    }
    start_gate.wait();
    let started = std::time::Instant::now();
    let dur = Duration::from_secs_f64(args.duration);
    let mut last = 0;
    let mut crashed = None;
    let mut tso_restart = None;
    while started.elapsed() < dur && !stop.load(Ordering::Relaxed) {
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
                    stop.store(true, Ordering::SeqCst);
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
                "[{s:>4}s / {:.0}s] committed {c} ({:.0} txn/s)",
                args.duration,
                c as f64 / started.elapsed().as_secs_f64()
            );
        }
        if let Err(e) = cluster.check_alive() {
            crashed = Some(e);
            stop.store(true, Ordering::SeqCst);
        }
    }
    stop.store(true, Ordering::SeqCst);
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

    let (final_total, locks_held) = audit(&fabric, addrs, args.accounts)?;
    drop(fabric);
    cluster.shutdown();
    let _ = std::fs::remove_dir_all(&tso_state);
    if let Some(r) = &mut tso_restart {
        r.committed_after_ready = committed.load(Ordering::Relaxed) - r.committed_before_ready;
        r.thread_epochs = workers.iter().map(|w| w.tso_epoch).collect();
    }
    let mut report = Report::new(
        fabric_desc,
        threads,
        args.coroutines,
        args.accounts,
        args.theta,
        elapsed,
        &workers,
    );
    report.timing_model = model_desc;
    report.tso_restart = tso_restart;
    report.audit(initial, final_total, locks_held);
    if !args.no_check {
        let mut history = txn::history::History::new(usize::MAX);
        for w in &mut workers {
            history.append(w.history.take().context("a worker recorded no history")?);
        }
        eprintln!(
            "checking serializability: {} committed transactions, {:.1} MiB of history",
            history.len(),
            history.bytes() as f64 / (1 << 20) as f64
        );
        let t0 = std::time::Instant::now();
        let verdict = txn::serializability::check(&history);
        eprintln!("checked in {:.2} s", t0.elapsed().as_secs_f64());
        report.serializability(&verdict, history.bytes(), t0.elapsed());
    }
    print!("{}", report.render());
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", p.display()))?;
        eprintln!("wrote {}", p.display());
    }
    Ok(if report.passed() {
        (report, Outcome::Passed)
    } else {
        (report, Outcome::Failed)
    })
}

#[allow(clippy::too_many_arguments)]
fn worker(
    tid: usize,
    args: Args,
    fabric: Fabric,
    addrs: ServiceAddrs,
    gen: Arc<Generator>,
    stop: Arc<AtomicBool>,
    committed: Arc<AtomicU64>,
    gate: Arc<Barrier>,
    core: Option<core_affinity::CoreId>,
) -> anyhow::Result<WorkerStats> {
    if let Some(c) = core {
        core_affinity::set_for_current(c);
    }
    let threads = args.threads.unwrap_or(1).max(1);
    let occ = OccConfig {
        history_limit_bytes: (!args.no_check).then(|| (args.check_memory_mb << 20) / threads),
        lock_wait: Duration::from_micros(args.lock_wait_us),
        ..OccConfig::default()
    };
    let connected = (|| {
        let ctx = ThreadCtx::new(fabric, RuntimeConfig::default())?;
        let client = Rc::new(TxnClient::connect(ctx.clone(), addrs, occ)?);
        anyhow::Ok((ctx, client))
    })();
    gate.wait();
    let (ctx, client) =
        connected.with_context(|| format!("coordinator thread {tid} connecting"))?;
    let stats = Rc::new(RefCell::new(WorkerStats::new()));
    let mut ex = Executor::new(ctx.clone());
    for co in 0..args.coroutines {
        let (client, stats, gen, stop, committed) = (
            client.clone(),
            stats.clone(),
            gen.clone(),
            stop.clone(),
            committed.clone(),
        );
        let seed = args.seed ^ ((tid as u64) << 32 | co as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let max_backoff = args.max_backoff_us;
        ex.spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            while !stop.load(Ordering::Relaxed) {
                let t = gen.next(&mut rng);
                let begin = quanta::Instant::now();
                let mut backoff_us = 1u64;
                loop {
                    let r = smallbank::run(client.begin_as(t.ty.index() as u16), t).await;
                    // What to do next, decided while the stats are borrowed (never across an await).
                    let retry = {
                        let mut s = stats.borrow_mut();
                        let s = &mut *s;
                        let ts: &mut TypeStats = &mut s.types[t.ty.index()];
                        ts.attempts += 1;
                        match r {
                            Ok(net) => {
                                ts.record_commit(begin.elapsed());
                                s.net += net;
                                committed.fetch_add(1, Ordering::Relaxed);
                                false
                            }
                            Err(TxnError::Abort(AbortReason::User)) => {
                                ts.user_aborts += 1;
                                false
                            }
                            Err(TxnError::Abort(reason)) => {
                                ts.aborts += 1;
                                s.abort_reasons[AbortReason::ALL
                                    .iter()
                                    .position(|&x| x == reason)
                                    .expect("listed")] += 1;
                                // At the end of the run an unfinished transaction has no effect.
                                !stop.load(Ordering::Relaxed)
                            }
                            Err(e) => {
                                s.fatal.push(format!("{}: {e}", t.ty.name()));
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
    let lost = client.locks().lost();
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

/// Sum all balances and count held locks with one-sided READs from a fresh thread context.
fn audit(fabric: &Fabric, addrs: ServiceAddrs, accounts: u64) -> anyhow::Result<(i64, u64)> {
    let ctx = ThreadCtx::new(fabric.clone(), RuntimeConfig::default())?;
    let client = Rc::new(TxnClient::connect(
        ctx.clone(),
        addrs,
        OccConfig::default(),
    )?);
    let out: Rc<RefCell<anyhow::Result<(i64, u64)>>> = Rc::new(RefCell::new(Ok((0, 0))));
    let mut ex = Executor::new(ctx);
    {
        let (client, out) = (client.clone(), out.clone());
        ex.spawn(async move {
            let r: anyhow::Result<(i64, u64)> = async {
                let mut total = 0i64;
                let tables: Vec<u32> = client.tables().iter().map(|t| t.id).collect();
                for &table in &tables {
                    for chunk in (0..accounts).collect::<Vec<_>>().chunks(256) {
                        let vals =
                            join_all(chunk.iter().map(|&k| client.read_committed(table, k))).await;
                        for v in vals {
                            let (_, v) = v?;
                            total += i64::from_le_bytes(v.as_slice().try_into()?);
                        }
                    }
                }
                let mut held = 0;
                let locks = client.locks();
                let n = locks.n_locks().min(2 * accounts);
                for chunk in (0..n).collect::<Vec<_>>().chunks(256) {
                    let st =
                        join_all(chunk.iter().map(|&id| locks.read_state(client.ctx(), id))).await;
                    for s in st {
                        held += u64::from(s?.queued() > 0);
                    }
                }
                Ok((total, held))
            }
            .await;
            *out.borrow_mut() = r;
        });
    }
    ex.run();
    let r = std::mem::replace(&mut *out.borrow_mut(), Ok((0, 0)));
    r
}
