//! The two sides of `txn-bench --cnodes N` that drive the coordinators: the child's run
//! ([`main`], the `cnode` binary) and the parent's (`measure`, behind `--cnodes`); the
//! wire types, the streaming and the hooks are [`crate::cnode`]'s (see its docs for the
//! protocol). A child of `txnbench`: both use its coordinator threads and its cluster.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use rrpc::fabric::{Fabric, FabricConfig};
use rrpc::NodeId;
use txn::coordinator::{ClusterAddrs, Protocol};
use txn::history::History;

use super::served::{Job, ServedCoordinators};
use super::{Measured, RunCluster, WorkerPlan};
use crate::cnode::{
    fabric_incarnation, on_sigterm, spawn, status_text, Cn, CnodeArgs, Event, Flush, Msg, Out,
    Streams, WireStats, CHILD_TIMEOUT, DEFAULT_INTERVAL_MS, TERMINATED,
};
use crate::history_out;
use crate::launcher::default_bin_dir;
use crate::recoverer::{Recoverer, RecoveryRecord, Survivor};
use crate::report::{LockdRestart, TsoRestart, WorkerStats};
use crate::timeline::{CnodeTimeline, Fault};
use crate::txn_args::{Args, Point, ProtocolArg, NODE_CNODE};
use crate::workload::{RunClock, WorkloadSpec};

/// How long a restarted compute node waits for its earlier lives' recovery before it
/// gives up (and exits without serving).
const RECOVERED_WAIT: Duration = Duration::from_secs(30);

/// How long the launcher waits for a surviving compute node to record a dead life's
/// recovery before it recovers the life itself.
const SURVIVOR_WAIT: Duration = Duration::from_secs(10);

/// The recovery record of `node`'s `life`, waiting up to `wait` for it; `None` if none
/// came. Errors: etcd failed, or the record is not one (a life that left cleanly is
/// never declared dead).
fn record(
    me: &member::Member,
    node: u16,
    life: u64,
    wait: Duration,
) -> anyhow::Result<Option<RecoveryRecord>> {
    match me.wait_recovered(node, life, wait)? {
        Some(v) => RecoveryRecord::parse(&v).map(Some).map_err(|e| anyhow!(e)),
        None => Ok(None),
    }
}

/// The node ids of the compute-node processes.
fn cnode_ids() -> std::ops::Range<u16> {
    NODE_CNODE as u16..(NODE_CNODE as usize + crate::txn_args::MAX_CNODES) as u16
}

/// The nodes that must fence a dead compute node before its recovery: every memory
/// node (with the locks placed on them, their lock services with them), and the lockd
/// node when `protocol` uses one and `lockd` says the cluster runs it.
fn fencers(memnodes: usize, protocol: Protocol, lockd: bool) -> Vec<u16> {
    (0..memnodes as u32)
        .map(|i| (crate::txn_args::NODE_MEMNODE + i) as u16)
        .chain((protocol.needs_lockd() && lockd).then_some(crate::txn_args::NODE_LOCKD as u16))
        .collect()
}

/// A compute node's coordinator threads: threads of their own, met at two barriers
/// with the main thread (connected, then go), or the lock service's server threads
/// (`--lock-serving coordinator`, [`ServedCoordinators`]).
enum Coordinators {
    Threads {
        handles: Vec<std::thread::JoinHandle<anyhow::Result<crate::report::WorkerStats>>>,
        gate: Arc<Barrier>,
        go: Arc<Barrier>,
    },
    Served(Arc<ServedCoordinators>),
}

impl Coordinators {
    /// Wait until every coordinator connected (or failed to).
    fn arrive(&self) {
        match self {
            Self::Threads { gate, .. } => {
                gate.wait();
            }
            Self::Served(s) => {
                while !s.all_arrived() {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }

    /// Let them run (the run's `t0` is stored).
    fn go(&self) {
        match self {
            Self::Threads { go, .. } => {
                go.wait();
            }
            Self::Served(s) => s.go(),
        }
    }

    /// Whether every coordinator ended.
    fn finished(&self) -> bool {
        match self {
            Self::Threads { handles, .. } => handles.iter().all(|h| h.is_finished()),
            Self::Served(s) => s.finished(),
        }
    }

    /// Each coordinator thread's counters, or why it failed, in thread order.
    fn join(self) -> Vec<anyhow::Result<crate::report::WorkerStats>> {
        match self {
            Self::Threads { handles, .. } => handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow!("coordinator thread panicked")))
                })
                .collect(),
            Self::Served(s) => s.take_results(),
        }
    }
}

/// The `cnode` binary: run the compute node of `a` until stopped (module docs), and,
/// with a membership service, recover other compute nodes' dead lives as a survivor.
///
/// Errors: a bad run spec, a fabric or a cluster that cannot be reached, a thread that
/// panicked, stdout closed.
pub fn main(a: CnodeArgs) -> anyhow::Result<()> {
    // Before any thread starts: they all inherit the set.
    crate::cnode::pin(a.cpus.as_deref(), a.numa)?;
    if a.cnode >= crate::txn_args::MAX_CNODES {
        bail!(
            "--cnode must be below {} (got {})",
            crate::txn_args::MAX_CNODES,
            a.cnode
        );
    }
    let mut args: Args = serde_json::from_str(&a.run_spec).context("--run-spec")?;
    crate::run_runtime::set(args.runtime());
    let protocol = match args.protocol {
        ProtocolArg::All => bail!("--run-spec names all protocols: one only"),
        _ => args.protocols()?[0],
    };
    args.protocol = ProtocolArg::One(protocol);
    let threads = args.threads.unwrap_or(1).max(1);
    args.insert_lane = (a.cnode as u64) << 8 | u64::from(a.incarnation & 0xFF);
    let workload = crate::txnbench::workload_spec(&args)?;
    let mix = workload.profiles(args.theta)?;
    let node = NODE_CNODE + a.cnode as u32;
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe { libc::signal(libc::SIGTERM, on_sigterm as *const () as libc::sighandler_t) };

    let mut fcfg = FabricConfig::new(args.fabric(), &a.cluster, NodeId(node));
    fcfg.device = args.rdma_device.clone();
    fcfg.gid_index = args.gid_index;
    fcfg.model = Some(args.model());
    // The life's incarnation, which its transaction ids and its tickets carry, so that
    // the recovery of an earlier life cannot touch this one's: the membership service's
    // when there is one.
    let membership = match &a.etcd {
        Some(url) => {
            let me = member::Member::join(
                std::slice::from_ref(url),
                &a.cluster,
                member::Role::Cnode,
                node as u16,
                Duration::from_millis(args.lease_ms),
            )
            .context("joining the membership in etcd")?;
            fcfg.incarnation = me.incarnation();
            // Serve only after every earlier life of this node id was recovered (its
            // commits finished or undone, its locks swept): its transaction ids and
            // tickets differ from ours, but a half-done commit of its must not be read
            // as ours to build on (Lotus 6's handshake).
            for life in 1..me.incarnation() {
                me.wait_recovered(node as u16, life, RECOVERED_WAIT)?
                    .with_context(|| {
                        format!(
                            "node {node}'s earlier life {life} was not recovered within {RECOVERED_WAIT:?}; not serving"
                        )
                    })?;
            }
            let me = Arc::new(me);
            // Declared dead (the lease expired while this process was stopped, or a
            // survivor revoked it): its memory nodes fenced it and a survivor recovers
            // its transactions; nothing it does counts any more.
            let watch = Arc::downgrade(&me);
            std::thread::spawn(move || loop {
                std::thread::sleep(Duration::from_millis(5));
                let Some(watch) = watch.upgrade() else { return };
                if !watch.is_live() {
                    eprintln!(
                        "cnode {node} incarnation {}: lease lost (declared dead and fenced); exiting",
                        watch.incarnation()
                    );
                    std::process::exit(3);
                }
            });
            Some(me)
        }
        None => {
            fcfg.incarnation = fabric_incarnation(a.incarnation);
            None
        }
    };
    let fabric = Fabric::open(&fcfg).context("opening the fabric")?;
    let addrs = ClusterAddrs {
        memnodes: a.memnodes.clone(),
        lockd: a.lockd,
        tso: a.tso,
    };
    // Lotus: this node's lock table, served to the other compute nodes (`lotus_cn`).
    // --routing forward: what the other compute nodes send here, served beside the lock
    // table (`crate::forward`).
    let inbox = (protocol.needs_lock_tables() && args.routing == crate::routing::Routing::Forward)
        .then(|| Arc::new(crate::forward::Inbox::default()));
    // --lock-serving coordinator: the lock service's server threads are the coordinator
    // threads (`super::served`), with the coordinators' runtime settings.
    let served = (protocol.needs_lock_tables()
        && args.lock_serving == crate::lotus_cn::LockServing::Coordinator)
        .then(|| {
            let mut rt = args.runtime();
            if args.kill_memnode_after.is_some() {
                rt.reconnect_give_up = crate::failover::RECONNECT_GIVE_UP;
            }
            ServedCoordinators::new(threads, rt)
        });
    let lotus = if protocol.needs_lock_tables() {
        let me = membership
            .as_ref()
            .context("Lotus across compute nodes needs the run's membership service")?;
        let nodes: Vec<u32> = (0..args.cnodes as u32).map(|i| NODE_CNODE + i).collect();
        let cn = crate::lotus_cn::start(
            fabric.clone(),
            me,
            node,
            &nodes,
            a.tso,
            crate::lotus_cn::LotusCnOptions {
                lock_key: workload.lotus_lock_key(),
                vtc_entries: args.vtc_entries,
                inbox: inbox.clone(),
                skip_cache_clear: args.plant == Some(crate::txn_args::Plant::SkipCacheClear),
                coordinators: served.as_ref().map(|s| (s.threads(), s.server_runtime())),
            },
        )?;
        Some(cn)
    } else {
        None
    };
    // A survivor of other compute nodes' deaths: it recovers the lives it claims
    // (recoverer module docs). Stopped when the run ends (after a recovery under way).
    let survivor = match &membership {
        Some(me) => Some(
            Survivor::start(
                me.clone(),
                fabric.clone(),
                addrs.clone(),
                protocol,
                lotus.as_ref().map(|cn| crate::recoverer::LotusDuty {
                    site: cn.site.clone(),
                    take_over: !args.restart,
                }),
                cnode_ids(),
                fencers(a.memnodes.len(), protocol, a.lockd.is_some()),
            )
            .context("starting the survivor duty")?,
        ),
        None => None,
    };
    let mut cfg = crate::txnbench::txn_config(&args, protocol, threads);
    cfg.lotus = lotus.as_ref().map(|cn| cn.site.clone());
    // Replicated: the coordinators follow the replica views the manager in
    // `txn-bench` stores in etcd, and answer its drains (`crate::view_sync`).
    let _follower = match (&membership, args.replicas > 1) {
        (Some(me), true) => {
            let view = match me.get(crate::view_sync::VIEW_KEY)? {
                Some(b) => serde_json::from_slice(&b).context("the view stored in etcd")?,
                None => txn::view::View::initial(args.memnodes, args.replicas),
            };
            let feed = txn::view::ViewFeed::new(view);
            cfg.view_feed = Some(feed.clone());
            Some(crate::view_sync::follow(me.clone(), feed, node as u16)?)
        }
        _ => None,
    };
    let clock = RunClock {
        t0_ns: 0,
        interval_ns: args.timeline_ms.unwrap_or(DEFAULT_INTERVAL_MS) * 1_000_000,
        wall: !args.no_check,
    };
    let (tx, rx) = mpsc::channel::<Out>();
    let stop = Arc::new(AtomicBool::new(false));
    let committed = Arc::new(AtomicU64::new(0));
    let t0 = Arc::new(AtomicU64::new(0));
    let gate = Arc::new(Barrier::new(threads + 1));
    let go = Arc::new(Barrier::new(threads + 1));
    let kinds = workload.kinds();
    // Every coroutine's commits, where a kill -9 cannot erase them (the parent reads
    // them if this life dies).
    let ledger = crate::ledger::Ledger::create(
        &crate::ledger::Ledger::path(&a.cluster, node, a.incarnation),
        threads * args.coroutines,
    )
    .context("creating the ledger")?;
    let mut handles = Vec::new();
    let mut jobs = Vec::new();
    for i in 0..threads {
        let w = WorkerPlan {
            tid: a.cnode * threads + i,
            coroutines: args.coroutines,
            seed: args.seed.seed,
            max_backoff_us: args.max_backoff_us,
            kinds: kinds.clone(),
            warehouses: args.warehouses(),
            each_type_first: args.each_type_first,
            cfg: cfg.clone(),
            addrs: addrs.clone(),
            core: None,
            clock,
            t0: t0.clone(),
            go: Some(go.clone()),
            flush: Some(Flush { tx: tx.clone() }),
            incarnation: a.incarnation,
            ledger: Some((ledger.clone(), i * args.coroutines)),
            runtime: args.runtime(),
            reconnect_give_up: args
                .kill_memnode_after
                .map(|_| crate::failover::RECONNECT_GIVE_UP),
            qp_errors: args.qp_errors_ms.map(Duration::from_millis),
            routing: args.routing,
            inbox: inbox.clone(),
            reports_vtc: i == 0,
            // From the run's start (`go`'s t0, also a restarted life's): a life
            // restarted after the warm-up restarts its counters at once.
            warmup: args.run.warmup(),
        };
        if served.is_some() {
            jobs.push(Job {
                plan: WorkerPlan { go: None, ..w },
                mix: mix.clone(),
                stop: stop.clone(),
                committed: committed.clone(),
            });
            continue;
        }
        let (fabric, mix, stop, committed, gate) = (
            fabric.clone(),
            mix.clone(),
            stop.clone(),
            committed.clone(),
            gate.clone(),
        );
        handles.push(
            std::thread::Builder::new()
                .name(format!("coordinator-{i}"))
                .spawn(move || crate::txnbench::worker(w, fabric, mix, stop, committed, gate))?,
        );
    }
    drop(tx);
    let coordinators = match &served {
        Some(s) => {
            if let Err(e) = s.run(jobs) {
                s.abandon();
                return Err(e);
            }
            Coordinators::Served(s.clone())
        }
        None => Coordinators::Threads {
            handles,
            gate,
            go: go.clone(),
        },
    };
    let out = std::io::stdout();
    let mut out = std::io::BufWriter::new(out.lock());
    let say = |m: &Msg, out: &mut std::io::BufWriter<std::io::StdoutLock<'_>>| {
        serde_json::to_writer(&mut *out, m)?;
        out.write_all(b"\n")?;
        out.flush()
    };
    // A restarted life starts only after its predecessor's recovery (the parent
    // spawns it once recovery answered).
    coordinators.arrive();
    let census = if lotus.is_some() {
        Some(crate::cnode::ThreadCensus::of_this_process()?)
    } else {
        None
    };
    say(
        &Msg::Ready {
            node,
            incarnation: a.incarnation,
            pid: std::process::id(),
            threads: census,
        },
        &mut out,
    )
    .context("stdout")?;
    // Commands on stdin: `go <t0_ns>`, `stop` (EOF: the parent is gone, stop too).
    let (cmd_tx, cmd_rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if cmd_tx.send(line.trim().to_string()).is_err() {
                return;
            }
        }
        let _ = cmd_tx.send("stop".into());
    });
    let start = match a.t0_ns {
        Some(t) => t,
        None => loop {
            match cmd_rx.recv_timeout(Duration::from_millis(50)) {
                Ok(c) => match c.strip_prefix("go ").map(str::parse::<u64>) {
                    Some(Ok(t)) => break t,
                    _ if c == "stop" => {
                        // Stopped before it started: release the threads, which stop at once.
                        stop.store(true, Ordering::SeqCst);
                        break txn::history::monotonic_ns();
                    }
                    _ => bail!("unknown command {c:?} on stdin: go <t0_ns> or stop"),
                },
                Err(mpsc::RecvTimeoutError::Timeout) if TERMINATED.load(Ordering::SeqCst) => {
                    stop.store(true, Ordering::SeqCst);
                    break txn::history::monotonic_ns();
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    stop.store(true, Ordering::SeqCst);
                    break txn::history::monotonic_ns();
                }
            }
        },
    };
    t0.store(start, Ordering::SeqCst);
    coordinators.go();
    let write_out = |o: Out, out: &mut std::io::BufWriter<std::io::StdoutLock<'_>>| match o {
        Out::Msg(m) => say(&m, out),
        Out::History(h) => {
            let lines = history_out::lines(&h, &kinds, a.cnode, a.incarnation).collect();
            say(&Msg::History { lines }, out)
        }
    };
    while !coordinators.finished() {
        if TERMINATED.load(Ordering::SeqCst) || cmd_rx.try_recv().is_ok_and(|c| c == "stop") {
            stop.store(true, Ordering::SeqCst);
        }
        match rx.recv_timeout(Duration::from_millis(20)) {
            Ok(o) => write_out(o, &mut out).context("stdout")?,
            Err(mpsc::RecvTimeoutError::Timeout | mpsc::RecvTimeoutError::Disconnected) => {}
        }
    }
    for (i, r) in coordinators.join().into_iter().enumerate() {
        match r {
            Ok(mut s) => {
                for f in &s.fatal {
                    eprintln!("cnode {node} thread {i}: fatal: {f}");
                }
                if let Some(h) = s.history.take() {
                    write_out(Out::History(h), &mut out).context("stdout")?;
                }
                let tid = a.cnode * threads + i;
                say(
                    &Msg::Interval {
                        tid,
                        from: 0,
                        commits: s.timeline.commits.clone(),
                        aborts: s.timeline.aborts.clone(),
                    },
                    &mut out,
                )?;
                say(
                    &Msg::Stats {
                        tid,
                        stats: Box::new(WireStats::from_stats(&s)),
                    },
                    &mut out,
                )?;
            }
            Err(e) => say(
                &Msg::Error {
                    error: format!("{e:#}"),
                },
                &mut out,
            )?,
        }
    }
    while let Ok(o) = rx.try_recv() {
        write_out(o, &mut out).context("stdout")?;
    }
    say(&Msg::Done, &mut out).context("stdout")?;
    // A clean stop: leave, so that nobody takes this incarnation for dead (the survivor
    // duty ends first: it holds the membership too).
    drop(survivor);
    if let Some(mut m) = membership {
        for _ in 0..100 {
            match Arc::try_unwrap(m) {
                Ok(me) => {
                    if let Err(e) = me.leave() {
                        eprintln!("cnode {node}: leaving the membership: {e}");
                    }
                    break;
                }
                Err(back) => {
                    m = back;
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }
    Ok(())
}

/// The parent's side of the run with `--cnodes N` (module docs): start the children,
/// say go, run the fault flags for `--duration` (or until `stop`), stop the children,
/// merge. Returns the same [`Measured`] as the in-process run, the history already
/// written to `--history-out`. Errors: a child that does not start or get ready, a
/// service that dies, an oracle that does not restart, a history file that cannot be
/// written.
pub(crate) fn measure(
    args: &Args,
    workload: &dyn WorkloadSpec,
    cluster: &mut RunCluster,
    protocol: Protocol,
    point: &Point,
    stop: &AtomicBool,
) -> anyhow::Result<Measured> {
    // The view manager first: it stores the initial view, which the children read.
    let manager = match (&cluster.view_feed, args.kill_memnode_after) {
        (Some(feed), Some(_)) => {
            let etcd = cluster.etcd_ref();
            let cnodes = (0..args.cnodes)
                .map(|i| (NODE_CNODE + i as u32) as u16)
                .collect();
            Some(
                crate::failover::ManagerThread::start(
                    cluster.fabric.clone(),
                    cluster.addrs.clone(),
                    feed.clone(),
                    etcd,
                    cnodes,
                )
                .context("starting the view manager")?,
            )
        }
        _ => None,
    };
    let mut p = Parent::new(args, workload, cluster, protocol, point)?;
    for i in 0..args.cnodes {
        p.spawn(i, 0, None)?;
    }
    p.await_ready()?;
    p.go()?;
    let mut faults = Faults::new(args);
    faults.manager = manager;
    let dur = args.run.warmup() + Duration::from_secs_f64(args.duration());
    let mut last_progress = 0;
    let mut service_died = None;
    // With --breakdown, each process's CPU time over the measured window (sampled at the
    // warm-up's end, and before the children are told to stop).
    let mut cpu_before = None;
    while p.started.elapsed() < dur && !stop.load(Ordering::Relaxed) {
        if args.breakdown && cpu_before.is_none() && p.started.elapsed() >= args.run.warmup() {
            cpu_before = Some(p.cpu_times(cluster));
        }
        p.drain(Duration::from_millis(10))?;
        p.reap_deaths()?;
        p.recover_expired()?;
        faults.step(&mut p, cluster)?;
        let s = p.started.elapsed().as_secs();
        if s > last_progress {
            last_progress = s;
            p.progress(protocol);
        }
        if let Err(e) = cluster.cluster.check_alive() {
            service_died = Some(e);
            break;
        }
    }
    // The measured window: from the warm-up's end (empty if the run ended before).
    let elapsed = p.started.elapsed().saturating_sub(args.run.warmup());
    let cpu = match &cpu_before {
        Some(before) => crate::txnbench::cpu_spent(before, &p.cpu_times(cluster), elapsed),
        None => Vec::new(),
    };
    faults.finish(&mut p, cluster)?;
    p.stop_all()?;
    let last_recovered_ms = p.last_recovered_ms;
    if let Some(e) = service_died {
        bail!("a service died during the run: {e}");
    }
    let (workers, timelines, events) = p.merge()?;
    let mut lockd_restart = faults.lockd;
    if let Some(r) = &mut lockd_restart {
        let committed: u64 = timelines.iter().flat_map(|t| &t.commits).sum();
        r.committed_after_ready = committed.saturating_sub(r.committed_before_ready);
        r.thread_reconnects = workers.iter().map(|w| w.lock_reconnects).collect();
    }
    let mut tso_restart = faults.tso;
    if let Some(r) = &mut tso_restart {
        let committed: u64 = timelines.iter().flat_map(|t| &t.commits).sum();
        r.committed_after_ready = committed.saturating_sub(r.committed_before_ready);
        r.thread_epochs = workers.iter().map(|w| w.tso_epoch).collect();
        r.uses_tso = protocol != Protocol::OccCas;
    }
    // Each coordinator process's version table cache, reported by its first thread.
    let lotus_vtc = workers
        .iter()
        .filter_map(|w| w.vtc)
        .reduce(|a, b| a.add(&b));
    Ok(Measured {
        workers,
        elapsed,
        tso_restart,
        lockd_restart,
        failover: faults.failover,
        etcd_restart: None,
        cpu,
        timelines,
        // A stopped compute node's recovery comes after the fault fired (at its lease's
        // end, if at all).
        fault: faults.fault.map(|mut f| {
            if f.cnode.is_some() && f.recovered_ms.is_none() {
                f.recovered_ms = last_recovered_ms.filter(|&r| r >= f.at_ms);
            }
            f
        }),
        cnode_events: events,
        history_written: args.history_out.is_some(),
        lotus_locks_held: None,
        lotus_vtc,
    })
}

/// A stream's source: (compute node, incarnation) and what it said.
type Tagged = (usize, u32, Event);

/// The parent's state: its children (every incarnation), their streams as merged so
/// far, the history (file and check), and what happened.
struct Parent<'a> {
    args: &'a Args,
    kinds: Vec<&'static str>,
    /// The `cnode` binary.
    bin: PathBuf,
    /// `--run-spec` of every child.
    spec: String,
    /// With `--hosts`: where each compute node runs, its `--run-spec` (its host's
    /// device), and where it runs in the host (see [`crate::hosts::CoordinatorPlace`]).
    places: Vec<(String, crate::hosts::CoordinatorPlace)>,
    cluster_name: String,
    addrs: ClusterAddrs,
    ev_tx: mpsc::Sender<Tagged>,
    ev_rx: mpsc::Receiver<Tagged>,
    cns: Vec<Cn>,
    streams: Streams,
    events: Vec<String>,
    history_file: Option<std::io::BufWriter<std::fs::File>>,
    history: Option<History>,
    history_lines: u64,
    /// The run's start (`go`), `CLOCK_MONOTONIC` ns and as an `Instant`.
    t0: u64,
    started: Instant,
    /// The measured window's start: `started` + `--warmup`. The fault flags, the
    /// events' and the timeline's milliseconds count from it.
    measured: Instant,
    /// Recovers a dead compute node before anything else touches its data.
    recoverer: Recoverer,
    /// The run's membership (etcd), when it has one.
    membership: Option<Membership>,
    /// Lives (compute node index, incarnation) recovered: declared dead.
    dead_lives: std::collections::HashSet<(usize, u32)>,
    /// Lives declared dead while their process still ran (a lease that ended): fenced,
    /// so their late operations fail by design and their failures do not count.
    fenced_lives: std::collections::HashSet<(usize, u32)>,
    /// The exact net (SmallBank money) of each dead life, from its ledger and the
    /// commit-log notes its recovery rolled forward.
    ledger_net: std::collections::HashMap<(usize, u32), i64>,
    /// When the last recovery of a compute node was done (its record seen), ms into
    /// the run.
    last_recovered_ms: Option<f64>,
}

/// The parent's view of the membership service: it joins as an observer, learns each
/// compute node's incarnation from etcd, revokes a life it saw die (the fast path),
/// and recovers any compute-node life whose lease ended, after every memory node
/// acknowledged fencing it.
struct Membership {
    endpoint: String,
    me: member::Member,
    events: member::Receiver<member::Event>,
    /// Each compute node's last incarnation seen up (node id to etcd incarnation).
    last: std::collections::HashMap<u16, u64>,
    /// Down events read while waiting for something else.
    pending: Vec<member::MemberInfo>,
    /// Lives recovered (or being recovered) already.
    done: std::collections::HashSet<(u16, u64)>,
    /// The memory nodes that must fence a dead life before its recovery.
    fencers: Vec<u16>,
}

impl Membership {
    /// Take in the events so far.
    fn poll(&mut self) -> Vec<member::MemberInfo> {
        let mut down = Vec::new();
        while let Ok(ev) = self.events.try_recv() {
            match ev {
                member::Event::Up(i) if i.role == member::Role::Cnode => {
                    let last = self.last.entry(i.node).or_insert(i.incarnation);
                    *last = (*last).max(i.incarnation);
                }
                member::Event::Down(i) if i.role == member::Role::Cnode => down.push(i),
                _ => {}
            }
        }
        down
    }

    /// Wait (at most 10 s) until `node` has been up in etcd; returns its last
    /// incarnation. The Down events read meanwhile are handed back for later.
    fn incarnation_of(&mut self, node: u16, later: &mut Vec<member::MemberInfo>) -> Option<u64> {
        let t0 = Instant::now();
        loop {
            later.extend(self.poll());
            if let Some(&i) = self.last.get(&node) {
                return Some(i);
            }
            if t0.elapsed() > Duration::from_secs(10) {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl<'a> Parent<'a> {
    /// The children's spec (one protocol, the point's theta and coroutines) and the
    /// history file. Errors: the file cannot be created.
    fn new(
        args: &'a Args,
        workload: &dyn WorkloadSpec,
        cluster: &RunCluster,
        protocol: Protocol,
        point: &Point,
    ) -> anyhow::Result<Self> {
        let mut spec = args.clone();
        spec.protocol = ProtocolArg::One(protocol);
        spec.isolation = None;
        spec.sweep = None;
        spec.theta = point.theta;
        spec.coroutines = point.coroutines;
        spec.vtc_entries = point.vtc_entries;
        spec.routing = point.routing.unwrap_or(args.routing);
        spec.lock_serving = point.lock_serving.unwrap_or(args.lock_serving);
        spec.ablation = false;
        spec.config = None;
        let history_file = match &args.history_out {
            Some(p) => Some(std::io::BufWriter::new(
                std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
            )),
            None => None,
        };
        // With --hosts, coordinator process i runs on the file's coordinator hosts in
        // turn, on that host's device.
        let mut places = Vec::new();
        if let Some(l) = &cluster.layout {
            for i in 0..args.cnodes {
                let c = l.coordinator(i)?;
                let mut s = spec.clone();
                s.rdma_device = c.device.clone().or(s.rdma_device);
                s.gid_index = c.gid_index.or(s.gid_index);
                places.push((serde_json::to_string(&s)?, c));
            }
        }
        let (ev_tx, ev_rx) = mpsc::channel();
        Ok(Self {
            args,
            kinds: workload.kinds(),
            places,
            bin: args
                .bin_dir
                .clone()
                .unwrap_or_else(default_bin_dir)
                .join("cnode"),
            spec: serde_json::to_string(&spec)?,
            cluster_name: cluster.cluster.name().to_string(),
            addrs: cluster.addrs.clone(),
            ev_tx,
            ev_rx,
            cns: Vec::new(),
            streams: Streams::default(),
            events: Vec::new(),
            history_file,
            history: (!args.no_check).then(|| History::new(args.check_memory_mb << 20)),
            history_lines: 0,
            t0: 0,
            started: Instant::now(),
            measured: Instant::now() + args.run.warmup(),
            recoverer: Recoverer::start(cluster.fabric.clone(), cluster.addrs.clone(), protocol)?,
            dead_lives: Default::default(),
            fenced_lives: Default::default(),
            ledger_net: Default::default(),
            last_recovered_ms: None,
            membership: match &cluster.etcd {
                Some(e) => {
                    let me = member::Member::join(
                        &[e.endpoint()],
                        cluster.cluster.name(),
                        member::Role::Other("txn-bench".into()),
                        crate::txn_args::NODE_CN as u16,
                        Duration::from_millis(args.lease_ms),
                    )
                    .context("joining the membership in etcd")?;
                    let events = me.events().context("watching the membership")?;
                    Some(Membership {
                        endpoint: e.endpoint(),
                        me,
                        events,
                        last: Default::default(),
                        pending: Vec::new(),
                        done: Default::default(),
                        fencers: fencers(
                            (args.memnodes + args.spare_memnodes) as usize,
                            protocol,
                            !args.locks_on_memnodes(),
                        ),
                    })
                }
                None => None,
            },
        })
    }

    /// Lives whose lease ended without the parent seeing the process die (a stopped
    /// process, a false suspicion the fencing makes safe): recover each now.
    fn recover_expired(&mut self) -> anyhow::Result<()> {
        let down = match &mut self.membership {
            Some(m) => {
                let mut d = std::mem::take(&mut m.pending);
                d.extend(m.poll());
                d
            }
            None => return Ok(()),
        };
        for d in down {
            let Some(m) = &self.membership else { break };
            if m.done.contains(&(d.node, d.incarnation))
                || m.me.recovered(d.node, d.incarnation)?.is_some()
            {
                continue;
            }
            let Some((index, inc)) = self
                .cns
                .iter()
                .find(|c| c.node as u16 == d.node && !c.gone)
                .map(|c| (c.index, c.incarnation))
            else {
                continue;
            };
            let at = self.ms();
            self.event(format!(
                "cnode {index} incarnation {inc} (node {} etcd incarnation {}): lease ended at {at:.0} ms",
                d.node, d.incarnation
            ));
            self.fenced_lives.insert((index, inc));
            self.recover_dead(index, u32::from(d.node), inc, Some(d.incarnation), at)?;
        }
        Ok(())
    }

    /// Have compute node `index`'s dead life `inc` (node `node`; `life`: its etcd
    /// incarnation when known, else the one etcd has live for the node), dead at
    /// `at_ms`, recovered, and print the recovery line. With a membership service:
    /// revoke its lease (the fast path: every survivor sees it Down now), wait until
    /// every memory node fenced it (killing a stopped process they cannot fence), then
    /// wait for the survivor that claimed it to record its recovery (recoverer module
    /// docs); the launcher recovers it itself only when no compute node survives or
    /// none recorded it within [`SURVIVOR_WAIT`]. Without one, the launcher recovers.
    /// Errors: recovery failed or could not be fenced (the run cannot go on safely: the
    /// dead life's locks may still be held).
    fn recover_dead(
        &mut self,
        index: usize,
        node: u32,
        inc: u32,
        life: Option<u64>,
        at_ms: f64,
    ) -> anyhow::Result<()> {
        let survivors = self.cns.iter().any(|c| {
            c.index != index
                && !c.gone
                && !self.dead_lives.contains(&(c.index, c.incarnation))
                && !self.fenced_lives.contains(&(c.index, c.incarnation))
        });
        self.dead_lives.insert((index, inc));
        let life = match &mut self.membership {
            None => fabric_incarnation(inc),
            Some(m) => {
                let n = node as u16;
                let mut later = Vec::new();
                let life = life.or_else(|| m.incarnation_of(n, &mut later));
                m.pending.extend(later);
                let Some(life) = life else {
                    bail!("cnode {index}: no incarnation of node {n} in the membership");
                };
                if !m.done.insert((n, life)) {
                    return Ok(());
                }
                m.me.revoke(n, life).context("revoking a dead lease")?;
                let mut missing =
                    member::wait_fenced(&m.me, n, life, &m.fencers, Duration::from_secs(5))?;
                if !missing.is_empty() {
                    // On shm a fence waits for a one-sided WR the fenced process is in the
                    // middle of (the fabric's fence handshake); a process stopped there
                    // never finishes it. It is declared dead: kill it (its machine is this
                    // one), and the fence completes.
                    if let Some(pid) = self.signal(index, "KILL") {
                        let at = self.ms();
                        self.event(format!(
                            "cnode {index} (pid {pid}) SIGKILLed at {at:.0} ms: declared dead, and its memory nodes could not fence it (stopped in the middle of a one-sided WR)"
                        ));
                        let m = self.membership.as_mut().expect("matched above");
                        missing = member::wait_fenced(
                            &m.me,
                            n,
                            life,
                            &m.fencers,
                            Duration::from_secs(5),
                        )?;
                    }
                }
                let m = self.membership.as_mut().expect("matched above");
                if !missing.is_empty() {
                    bail!("memory nodes {missing:?} did not fence node {n} incarnation {life}");
                }
                if survivors {
                    if let Some(rec) = record(&m.me, n, life, SURVIVOR_WAIT)? {
                        return self.recovered(index, node, inc, at_ms, rec);
                    }
                    let at = self.ms();
                    self.event(format!(
                        "cnode {index} incarnation {inc}: no survivor recorded its recovery within {SURVIVOR_WAIT:?} (at {at:.0} ms); the launcher recovers it"
                    ));
                }
                let m = self.membership.as_mut().expect("matched above");
                if !m.me.claim_recovery(n, life)? {
                    // A survivor holds the claim: its record comes, or its lease ends
                    // with the claim and the others claim it.
                    return match record(&m.me, n, life, Duration::from_secs(30))? {
                        Some(rec) => self.recovered(index, node, inc, at_ms, rec),
                        None => bail!(
                            "cnode {index} incarnation {inc}: claimed, never recovered within 30 s"
                        ),
                    };
                }
                life
            }
        };
        match self.recoverer.recover(node, life, Duration::from_secs(30)) {
            Ok(r) => {
                let rec = RecoveryRecord::of(crate::txn_args::NODE_CN as u16, &r);
                if let Some(m) = &self.membership {
                    m.me.finish_recovery(node as u16, life, &rec.to_json())
                        .context("recording the recovery")?;
                }
                self.recovered(index, node, inc, at_ms, rec)
            }
            Err(e) => {
                self.event(format!(
                    "recovery: cn {index} incarnation {inc} dead at {at_ms:.0} ms: FAILED: {e}"
                ));
                bail!("recovery of cnode {index} incarnation {inc} failed: {e}")
            }
        }
    }

    /// Print compute node `index`'s life `inc`'s recovery line (who recovered it, from
    /// `rec`) and account for it: its commits since its last streamed batch, and those
    /// recovery rolled forward, are nowhere in the history; its exact net comes from
    /// its ledger and the notes of the logs rolled forward.
    fn recovered(
        &mut self,
        index: usize,
        node: u32,
        inc: u32,
        at_ms: f64,
        rec: RecoveryRecord,
    ) -> anyhow::Result<()> {
        let by = match u32::from(rec.by) {
            n if n == crate::txn_args::NODE_CN => "the launcher".to_string(),
            n => match n.checked_sub(NODE_CNODE) {
                Some(i) => format!("cn {i}"),
                None => format!("node {n}"),
            },
        };
        self.last_recovered_ms = Some(self.ms());
        self.event(format!(
            "recovery: cn {index} incarnation {inc} dead at {at_ms:.0} ms: {} ({}), by {by}",
            rec.summary, rec.phases
        ));
        // The history is incomplete from here (at least one commit lost): the checks
        // say so.
        if let Some(h) = &mut self.history {
            h.note_lost(1 + rec.forward as u64);
        }
        // The ledger is on the compute node's host: read through ssh for another one.
        let path = crate::ledger::Ledger::path(&self.cluster_name, node, inc);
        let place = self
            .cns
            .iter()
            .find(|c| c.index == index && c.incarnation == inc)
            .map_or(crate::launcher::Place::Local, |c| c.place.clone());
        match place.read(&path) {
            Ok(bytes) => {
                let slots = crate::ledger::Ledger::parse(&bytes);
                let (net, _) = crate::ledger::settle(&slots, &rec.forward_notes);
                self.ledger_net.insert((index, inc), net);
                if let Err(e) = place.remove(&path) {
                    self.event(format!("cnode {index} incarnation {inc}: {e:#}"));
                }
            }
            Err(e) => self.event(format!(
                "cnode {index} incarnation {inc}: no ledger on {} ({}: {e:#}); its last commits are not counted",
                place.describe(),
                path.display()
            )),
        }
        Ok(())
    }

    /// Start compute node `index` as `incarnation` (with `t0`: running at once).
    /// Returns its pid.
    fn spawn(&mut self, index: usize, incarnation: u32, t0: Option<u64>) -> anyhow::Result<u32> {
        let (place, spec, cpus, numa) = match self.places.get(index) {
            Some((s, c)) => (c.place.clone(), s.as_str(), c.cpus.as_deref(), c.numa),
            None => (
                crate::launcher::Place::Local,
                self.spec.as_str(),
                None,
                None,
            ),
        };
        let c = spawn(
            &place,
            &self.bin,
            &self.cluster_name,
            &self.addrs,
            spec,
            index,
            incarnation,
            t0,
            self.membership.as_ref().map(|m| m.endpoint.as_str()),
            cpus,
            numa,
            &self.ev_tx,
        )?;
        let pid = c.pid;
        self.cns.push(c);
        Ok(pid)
    }

    /// Milliseconds since go.
    fn ms(&self) -> f64 {
        self.measured_s() * 1e3
    }

    /// Say `e` on stderr and keep it for the report.
    fn event(&mut self, e: String) {
        eprintln!("{e}");
        self.events.push(e);
    }

    /// CPU time so far of the parent, each service and each compute-node process on
    /// this host (`cnode I.K`: index I, incarnation K), by name; a process whose `/proc`
    /// entry cannot be read is left out.
    fn cpu_times(&self, cluster: &RunCluster) -> Vec<(String, Duration)> {
        let mut out: Vec<(String, Duration)> = cluster
            .cpu_times()
            .into_iter()
            .map(|(name, t)| {
                if name.starts_with("txn-bench") {
                    ("txn-bench (parent)".to_string(), t)
                } else {
                    (name, t)
                }
            })
            .collect();
        for c in &self.cns {
            if c.gone || !matches!(c.place, crate::launcher::Place::Local) {
                continue;
            }
            if let Ok(t) = crate::breakdown::process_cpu(c.pid) {
                out.push((format!("cnode {}.{}", c.index, c.incarnation), t));
            }
        }
        out
    }

    /// Take in one line of a child's stream.
    fn handle(&mut self, (index, inc, ev): Tagged) -> anyhow::Result<()> {
        let cn = self
            .cns
            .iter_mut()
            .find(|c| c.index == index && c.incarnation == inc);
        match ev {
            Event::Msg(Msg::Ready { threads, .. }) => {
                if let Some(c) = cn {
                    c.ready = true;
                }
                // Where its lock RPCs are served, as its threads say (`--lock-serving`).
                if let Some(t) = threads {
                    self.event(format!(
                        "cnode {index} incarnation {inc}: {} RPC server thread(s), {} \
                         coordinator thread(s) of their own",
                        t.rpc_server, t.coordinator
                    ));
                }
            }
            Event::Msg(Msg::Interval {
                tid,
                from,
                commits,
                aborts,
            }) => self
                .streams
                .interval((index, inc, tid), from, &commits, &aborts),
            Event::Msg(Msg::History { lines }) => {
                *self
                    .streams
                    .commits_by_incarnation
                    .entry((index, inc))
                    .or_default() += lines.len() as u64;
                if let Some(f) = &mut self.history_file {
                    history_out::write_lines(f, lines.iter().cloned())
                        .context("writing --history-out")?;
                }
                self.history_lines += lines.len() as u64;
                if let Some(h) = &mut self.history {
                    for l in &lines {
                        history_out::record(h, &self.kinds, l);
                    }
                }
            }
            Event::Msg(Msg::Stats { tid, stats }) => {
                self.streams.stats.insert((index, inc, tid), *stats);
            }
            Event::Msg(Msg::Error { error }) if self.dead_lives.contains(&(index, inc)) => {
                // A life declared dead and fenced (a stopped process that woke up): its
                // late operations fail by design; nothing it does counts.
                self.event(format!(
                    "cnode {index} (incarnation {inc}, declared dead and fenced): {error}"
                ));
            }
            Event::Msg(Msg::Error { error }) => {
                let e = format!("cnode {index} (incarnation {inc}): {error}");
                self.streams.errors.push(e.clone());
                self.event(e);
            }
            Event::Msg(Msg::Done) => {
                if let Some(c) = cn {
                    c.done = true;
                }
            }
            Event::Bad(l) => {
                self.event(format!("cnode {index} (incarnation {inc}): bad line: {l}"))
            }
            Event::Eof => {}
        }
        Ok(())
    }

    /// Take in what the children said, waiting up to `wait` for the first line.
    fn drain(&mut self, wait: Duration) -> anyhow::Result<()> {
        if let Ok(ev) = self.ev_rx.recv_timeout(wait) {
            self.handle(ev)?;
            while let Ok(ev) = self.ev_rx.try_recv() {
                self.handle(ev)?;
            }
        }
        Ok(())
    }

    /// Wait until every child is connected and ready (a watchdog: [`CHILD_TIMEOUT`]).
    fn await_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + CHILD_TIMEOUT;
        while !self.cns.iter().all(|c| c.ready) {
            self.drain(Duration::from_millis(50))?;
            for c in &mut self.cns {
                if let Some(st) = c.child.try_wait()? {
                    c.gone = true;
                    bail!(
                        "cnode {} exited before it was ready: {}",
                        c.index,
                        status_text(st)
                    );
                }
            }
            if Instant::now() > deadline {
                bail!("coordinator processes not ready after {CHILD_TIMEOUT:?}");
            }
        }
        Ok(())
    }

    /// Start the run: `go <t0>` to every child.
    fn go(&mut self) -> anyhow::Result<()> {
        self.t0 = txn::history::monotonic_ns();
        self.started = Instant::now();
        self.measured = self.started + self.args.run.warmup();
        for c in &mut self.cns {
            if let Some(s) = &mut c.stdin {
                writeln!(s, "go {}", self.t0).context("telling a cnode to go")?;
            }
        }
        eprintln!(
            "{} coordinator processes running (nodes {}..={})",
            self.cns.len(),
            NODE_CNODE,
            NODE_CNODE + self.cns.len() as u32 - 1
        );
        Ok(())
    }

    /// Report a child that exited without being asked to, and call the recovery hook.
    fn reap_deaths(&mut self) -> anyhow::Result<()> {
        let at = self.ms();
        let mut died = Vec::new();
        for c in self.cns.iter_mut().filter(|c| !c.gone) {
            if let Some(st) = c.child.try_wait()? {
                c.gone = true;
                if !c.stopping {
                    died.push((c.index, c.pid, c.node, c.incarnation, status_text(st)));
                }
            }
        }
        for (index, pid, node, inc, how) in died {
            self.event(format!(
                "cnode {index} (pid {pid}) died at {at:.0} ms: {how}"
            ));
            self.recover_dead(index, node, inc, None, at)?;
        }
        Ok(())
    }

    /// `--kill-cn-after`: SIGKILL compute node `target` (and with `restart` start its
    /// next incarnation at once). Returns the fault, `None` when it was gone already.
    fn kill(&mut self, target: usize, restart: bool) -> anyhow::Result<Option<Fault>> {
        let Some(c) = self.cns.iter_mut().find(|c| c.index == target && !c.gone) else {
            return Ok(None);
        };
        c.stopping = true;
        match &c.place {
            crate::launcher::Place::Local => c.child.kill().context("SIGKILL to a cnode")?,
            // On its host (its ssh client ends with it).
            place => {
                place.signal(c.pid, "KILL").with_context(|| {
                    format!("SIGKILL to cnode {target} on {}", place.describe())
                })?;
                let deadline = Instant::now() + Duration::from_secs(5);
                while c.child.try_wait()?.is_none() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(5));
                }
                if c.child.try_wait()?.is_none() {
                    let _ = c.child.kill();
                }
            }
        }
        let st = c.child.wait()?;
        c.gone = true;
        let (pid, node, inc) = (c.pid, c.node, c.incarnation);
        let at = self.ms();
        self.event(format!(
            "cnode {target} (pid {pid}) died at {at:.0} ms: {} (--kill-cn-after)",
            status_text(st)
        ));
        self.recover_dead(target, node, inc, None, at)?;
        if restart {
            let pid = self.spawn(target, inc + 1, Some(self.t0))?;
            self.event(format!(
                "cnode {target} restarted at {:.0} ms as incarnation {} (pid {pid}, node {node})",
                self.ms(),
                inc + 1
            ));
        }
        Ok(Some(Fault {
            what: format!("cnode {target} killed"),
            at_ms: at,
            cnode: Some(target),
            recovered_ms: self.last_recovered_ms,
        }))
    }

    /// Send `sig` (`KILL`, `STOP`, `CONT`) to compute node `target`'s live incarnation,
    /// on its host (through ssh for another one); returns its pid there. A signal that
    /// cannot be sent is an event of the run.
    fn signal(&mut self, target: usize, sig: &str) -> Option<u32> {
        let c = self.cns.iter().find(|c| c.index == target && !c.gone)?;
        let (pid, place) = (c.pid, c.place.clone());
        if let Err(e) = place.signal(pid, sig) {
            self.event(format!("cnode {target} (pid {pid}): SIG{sig}: {e:#}"));
        }
        Some(pid)
    }

    /// Seconds into the measured window; negative during the warm-up.
    fn measured_s(&self) -> f64 {
        let now = Instant::now();
        match now.checked_duration_since(self.measured) {
            Some(d) => d.as_secs_f64(),
            None => -(self.measured - now).as_secs_f64(),
        }
    }

    /// Progress on stderr: commits so far, from the streamed intervals (the measured
    /// window's: the warm-up's are cleared at its end).
    fn progress(&self, protocol: Protocol) {
        let c = self.streams.committed();
        eprintln!(
            "[{protocol} {:>3}s / {:.0}s{}] committed {c} ({:.0} txn/s) over {} coordinator process(es)",
            self.started.elapsed().as_secs(),
            self.args.run.warmup().as_secs_f64() + self.args.duration(),
            if self.measured_s() < 0.0 { " warm-up" } else { "" },
            // The streams count the measured window's commits once it started.
            c as f64
                / match self.measured_s() {
                    s if s > 0.0 => s,
                    _ => self.started.elapsed().as_secs_f64(),
                },
            self.cns.iter().filter(|c| !c.gone).count()
        );
    }

    /// Tell every live child to stop and take in its last words; a child still running
    /// after [`CHILD_TIMEOUT`] is SIGKILLed (the watchdog).
    fn stop_all(&mut self) -> anyhow::Result<()> {
        for c in self.cns.iter_mut().filter(|c| !c.gone) {
            c.stopping = true;
            if let Some(mut s) = c.stdin.take() {
                let _ = writeln!(s, "stop");
            }
        }
        let deadline = Instant::now() + CHILD_TIMEOUT;
        loop {
            self.drain(Duration::from_millis(10))?;
            let mut ended = Vec::new();
            for c in self.cns.iter_mut().filter(|c| !c.gone) {
                if let Some(st) = c.child.try_wait()? {
                    c.gone = true;
                    if !st.success() {
                        ended.push(format!(
                            "cnode {} (pid {}) ended after stop: {}",
                            c.index,
                            c.pid,
                            status_text(st)
                        ));
                    }
                } else if Instant::now() > deadline {
                    let _ = c.child.kill();
                    let _ = c.child.wait();
                    c.gone = true;
                    ended.push(format!(
                        "cnode {} (pid {}) did not stop within {CHILD_TIMEOUT:?}: SIGKILLed",
                        c.index, c.pid
                    ));
                }
            }
            for e in ended {
                self.event(e);
            }
            if self.cns.iter().all(|c| c.gone) {
                break;
            }
        }
        // The streams' last lines (their readers end at EOF).
        while let Ok(ev) = self.ev_rx.recv_timeout(Duration::from_millis(50)) {
            self.handle(ev)?;
        }
        if let Some(f) = &mut self.history_file {
            f.flush().context("writing --history-out")?;
        }
        if let Some(p) = &self.args.history_out {
            eprintln!(
                "wrote {} committed transactions to {}",
                self.history_lines,
                p.display()
            );
        }
        Ok(())
    }

    /// The merged run: every thread's counters of every incarnation (the history in the
    /// first, the others empty), one timeline row per compute node, and the events
    /// with each incarnation's streamed commits when a compute node was killed.
    /// Errors: counters that do not decode.
    fn merge(mut self) -> anyhow::Result<(Vec<WorkerStats>, Vec<CnodeTimeline>, Vec<String>)> {
        let mut events = std::mem::take(&mut self.events);
        for c in &self.cns {
            if c.incarnation > 0 || self.args.kill_cn_after.is_some() {
                let n = self
                    .streams
                    .commits_by_incarnation
                    .get(&(c.index, c.incarnation))
                    .copied()
                    .unwrap_or(0);
                events.push(format!(
                    "cnode {} incarnation {}: {n} committed transactions streamed",
                    c.index, c.incarnation
                ));
            }
        }
        let kinds = self.kinds.len();
        let mut ledgers = std::mem::take(&mut self.ledger_net);
        let settled: std::collections::HashSet<(usize, u32)> = ledgers.keys().copied().collect();
        let stats = std::mem::take(&mut self.streams.stats);
        let mut workers = Vec::with_capacity(stats.len());
        for ((index, inc, _tid), w) in stats {
            let mut s = w.into_stats(kinds)?;
            if self.fenced_lives.contains(&(index, inc)) && !s.fatal.is_empty() {
                // Its late operations after it woke up, fenced: they fail by design.
                events.push(format!(
                    "cnode {index} incarnation {inc} (declared dead and fenced): {} failed operations after it woke, e.g. {}",
                    s.fatal.len(),
                    s.fatal[0]
                ));
                s.fatal.clear();
            }
            // A dead life's net is its ledger's (exact), not its last snapshots': all of
            // it on the first of its threads seen.
            if settled.contains(&(index, inc)) {
                s.net = ledgers.remove(&(index, inc)).unwrap_or(0);
            }
            workers.push(s);
        }
        // Dead lives that never sent a snapshot.
        for (_, net) in ledgers {
            let mut s = WorkerStats::with_kinds(kinds);
            s.net = net;
            workers.push(s);
        }
        if workers.is_empty() {
            workers.push(WorkerStats::with_kinds(kinds));
        }
        workers[0].fatal.append(&mut self.streams.errors);
        if let Some(h) = self.history.take() {
            workers[0].history = Some(h);
            for w in &mut workers[1..] {
                w.history = Some(History::new(0));
            }
        }
        let mut timelines: Vec<CnodeTimeline> = (0..self.args.cnodes)
            .map(|cnode| CnodeTimeline {
                cnode,
                commits: Vec::new(),
                aborts: Vec::new(),
            })
            .collect();
        for (&(cnode, _, _), (c, a)) in &self.streams.timelines {
            if let Some(t) = timelines.get_mut(cnode) {
                crate::timeline::add_into(&mut t.commits, c);
                crate::timeline::add_into(&mut t.aborts, a);
            }
        }
        Ok((workers, timelines, events))
    }
}

/// The fault flags as a run goes: `--kill-cn-after [--restart]`, `--stop-cn-after
/// --stop-ms`, `--kill-tso-after`, each fired once.
struct Faults<'a> {
    args: &'a Args,
    /// The compute node the flags hit (`--cn`, default the last).
    target: usize,
    killed: bool,
    stopped_at: Option<Instant>,
    continued: bool,
    /// The oracle's restart, once done.
    tso: Option<TsoRestart>,
    /// The lock service's restart, once done.
    lockd: Option<LockdRestart>,
    /// The last fault that fired, for the timeline's recovery line.
    fault: Option<Fault>,
    /// `--kill-memnode-after`: the view manager, on a thread of its own.
    manager: Option<crate::failover::ManagerThread>,
    /// Whether the memory node was killed.
    memnode_killed: bool,
    /// Its failover (and re-replication), once done.
    failover: Option<crate::failover::Failover>,
    /// `--reshard-after`: whether the move was made.
    resharded: bool,
    /// `--reshard-back-after`: the range `--reshard-after` moved, until it is moved back.
    moved: Option<std::ops::Range<u16>>,
    /// `--reshard-back-after`: whether the move back was made.
    resharded_back: bool,
    /// `--reshard-loop`: the loop, once started.
    reshard_loop: Option<crate::lotus_reshard::LoopThread>,
    /// `--reshard-loop`: its moves so far (published, cancelled).
    loop_moves: (u32, u32),
}

impl<'a> Faults<'a> {
    fn new(args: &'a Args) -> Self {
        Self {
            args,
            target: args.cn.unwrap_or(args.cnodes - 1),
            killed: false,
            stopped_at: None,
            continued: false,
            tso: None,
            lockd: None,
            fault: None,
            manager: None,
            memnode_killed: false,
            failover: None,
            resharded: false,
            moved: None,
            resharded_back: false,
            reshard_loop: None,
            loop_moves: (0, 0),
        }
    }

    /// The lock services' addresses of the compute nodes, as each published it.
    /// Errors: no membership service; a node published none.
    fn lock_services(
        &self,
        p: &Parent<'_>,
        flag: &str,
    ) -> anyhow::Result<(Vec<u32>, Vec<std::net::SocketAddr>)> {
        let me = &p
            .membership
            .as_ref()
            .with_context(|| format!("{flag} needs the run's membership service"))?
            .me;
        let nodes: Vec<u32> = (0..self.args.cnodes as u32)
            .map(|i| NODE_CNODE + i)
            .collect();
        let mut addrs = Vec::new();
        for &n in &nodes {
            addrs.push(
                crate::lotus_cn::published_addr(me, n)?
                    .with_context(|| format!("compute node {n} published no lock service"))?,
            );
        }
        Ok((nodes, addrs))
    }

    /// Report the resharding loop's moves since the last call.
    fn loop_events(&mut self, p: &mut Parent<'_>, moves: Vec<lockd::reshard::MoveReport>) {
        for m in moves {
            if matches!(m.state, lockd::shard::MoveState::Published { .. }) {
                self.loop_moves.0 += 1;
            } else {
                self.loop_moves.1 += 1;
            }
            let at = p.ms();
            p.event(format!(
                "[{at:.0} ms] {}",
                crate::lotus_reshard::loop_line(&m)
            ));
        }
    }

    /// `--kill-memnode-after`: kill the memory node when due, then take the manager's
    /// answers as they come (the failover; with `--restart`, start the node again and
    /// take the re-replication). `wait` bounds the wait for an answer. Errors: the kill,
    /// the failover or the restart failed; a partition was lost.
    fn memnode_step(
        &mut self,
        p: &Parent<'_>,
        cluster: &mut RunCluster,
        wait: Duration,
    ) -> anyhow::Result<()> {
        let args = self.args;
        let Some(mgr) = self.manager.as_mut() else {
            return Ok(());
        };
        // Negative during the warm-up: no fault fires then.
        let now_s = p.measured_s();
        if !self.memnode_killed && args.kill_memnode_after.is_some_and(|k| now_s >= k) {
            self.memnode_killed = true;
            let m = args.memnode;
            let killed = Instant::now();
            cluster
                .cluster
                .kill(super::NODE_MEMNODE + m)
                .with_context(|| format!("killing memory node {m}"))?;
            eprintln!("[{now_s:.1}s] SIGKILLed memory node {m}");
            mgr.fail(m, killed, p.measured);
        }
        match mgr.poll(wait)? {
            None => {}
            Some(crate::failover::Answer::FailedOver(f)) => {
                eprintln!("{}", f.line());
                if !f.lost.is_empty() {
                    bail!(
                        "memory node {} died and partition(s) {:?} with it: no other copy \
                         (--replicas {})",
                        f.memnode,
                        f.lost,
                        args.replicas
                    );
                }
                self.fault = Some(Fault {
                    what: format!("memnode {} killed", f.memnode),
                    at_ms: f.killed_ms,
                    cnode: None,
                    recovered_ms: Some(f.published_ms),
                });
                if args.restart {
                    let started = super::start_memnode_again(cluster, f.memnode, p.measured)?;
                    mgr.rejoin(f.memnode, started, p.measured);
                } else if args.spare_memnodes > 0 {
                    // The first spare takes the dead node's place.
                    mgr.fill_spare(f.memnode, args.memnodes, p.measured);
                }
                self.failover = Some(*f);
            }
            Some(crate::failover::Answer::Restarted(r)) => {
                for l in r.lines() {
                    eprintln!("{l}");
                }
                if let Some(f) = &mut self.failover {
                    f.restart = Some(*r);
                }
            }
        }
        Ok(())
    }

    /// Fire what is due at this moment of the run. Errors: a kill or restart that
    /// failed.
    fn step(&mut self, p: &mut Parent<'_>, cluster: &mut RunCluster) -> anyhow::Result<()> {
        let (args, target) = (self.args, self.target);
        // Negative during the warm-up: no fault fires then.
        let now_s = p.measured_s();
        if args.reshard_loop {
            match &self.reshard_loop {
                None => {
                    let (nodes, addrs) = self.lock_services(p, "--reshard-loop")?;
                    self.reshard_loop = Some(crate::lotus_reshard::LoopThread::start(
                        &cluster.fabric,
                        &nodes,
                        &addrs,
                    )?);
                }
                Some(l) => {
                    let moves = l.moves();
                    self.loop_events(p, moves);
                }
            }
        }
        if !self.resharded && args.reshard_after.is_some_and(|s| now_s >= s) {
            self.resharded = true;
            let (nodes, addrs) = self.lock_services(p, "--reshard-after")?;
            let at = p.ms();
            let r = crate::lotus_reshard::force_move(
                &cluster.fabric,
                &nodes,
                &addrs,
                nodes[0],
                nodes[1],
                None,
            )?;
            p.event(format!("[{at:.0} ms] {}", r.line()));
            self.moved = Some(r.range);
        }
        if !self.resharded_back && args.reshard_back_after.is_some_and(|s| now_s >= s) {
            if let Some(range) = self.moved.take() {
                self.resharded_back = true;
                let (nodes, addrs) = self.lock_services(p, "--reshard-back-after")?;
                let at = p.ms();
                let r = crate::lotus_reshard::force_move(
                    &cluster.fabric,
                    &nodes,
                    &addrs,
                    nodes[1],
                    nodes[0],
                    Some(range),
                )?;
                p.event(format!("[{at:.0} ms] {}", r.line()));
            }
        }
        if !self.killed && args.kill_cn_after.is_some_and(|k| now_s >= k) {
            self.killed = true;
            if let Some(f) = p.kill(target, args.restart)? {
                self.fault = Some(f);
            }
        }
        if self.stopped_at.is_none() && args.stop_cn_after.is_some_and(|k| now_s >= k) {
            self.stopped_at = Some(Instant::now());
            if let Some(pid) = p.signal(target, "STOP") {
                let at = p.ms();
                p.event(format!(
                    "cnode {target} (pid {pid}) stopped (SIGSTOP) at {at:.0} ms for {} ms",
                    args.stop_ms
                ));
                self.fault = Some(Fault {
                    what: format!("cnode {target} stopped for {} ms", args.stop_ms),
                    at_ms: at,
                    cnode: Some(target),
                    recovered_ms: None,
                });
            }
        }
        if let (Some(t), false) = (self.stopped_at, self.continued) {
            if t.elapsed() >= Duration::from_millis(args.stop_ms) {
                self.continued = true;
                if let Some(pid) = p.signal(target, "CONT") {
                    let e = format!(
                        "cnode {target} (pid {pid}) continued (SIGCONT) at {:.0} ms",
                        p.ms()
                    );
                    p.event(e);
                }
            }
        }
        self.memnode_step(p, cluster, Duration::ZERO)?;
        if self.tso.is_none() && args.kill_tso_after.is_some_and(|k| now_s >= k) {
            let committed = AtomicU64::new(p.streams.committed());
            let listen = cluster.addrs.tso.to_string();
            let tso_args = cluster.tso_args(&listen);
            let r = super::restart_tso(
                &mut cluster.cluster,
                &cluster.tso_state,
                &tso_args,
                Duration::from_millis(args.tso_down_ms),
                &committed,
                p.measured,
            )
            .context("restarting the oracle")?;
            self.fault = super::tso_fault(Some(&r));
            self.tso = Some(r);
        }
        if self.lockd.is_none()
            && cluster.addrs.lockd.is_some()
            && args.kill_lockd_after.is_some_and(|k| now_s >= k)
        {
            let committed = AtomicU64::new(p.streams.committed());
            let down = Duration::from_millis(args.lockd_down_ms);
            let r = super::restart_lockd(cluster, down, &committed, p.measured)
                .context("restarting the lock service")?;
            self.fault = super::lockd_fault(Some(&r));
            self.lockd = Some(r);
        }
        Ok(())
    }

    /// At the end of the run: a stopped compute node gets its SIGCONT (so it can stop);
    /// a failover or re-replication under way is waited for (for up to 30 s). Errors:
    /// that failed or did not finish.
    fn finish(&mut self, p: &mut Parent<'_>, cluster: &mut RunCluster) -> anyhow::Result<()> {
        if let Some(l) = self.reshard_loop.take() {
            let moves = l.stop()?;
            self.loop_events(p, moves);
            let (published, cancelled) = self.loop_moves;
            p.event(format!(
                "reshard loop: {published} move(s) published, {cancelled} cancelled over the run (Lotus 4.3: 100 ms intervals; a node above 1.5x the average lock latency for 3 intervals passes a range to the coolest)"
            ));
        }
        if let (Some(_), false) = (self.stopped_at, self.continued) {
            self.continued = true;
            p.signal(self.target, "CONT");
        }
        let t0 = Instant::now();
        while self.manager.as_ref().is_some_and(|m| m.busy()) {
            anyhow::ensure!(
                t0.elapsed() < Duration::from_secs(30),
                "the memory node's failover or re-replication did not finish within 30 s of the run's end"
            );
            p.drain(Duration::from_millis(1))?;
            self.memnode_step(p, cluster, Duration::from_millis(10))?;
        }
        Ok(())
    }
}
