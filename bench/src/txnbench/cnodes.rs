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

use super::{Measured, RunCluster, WorkerPlan};
use crate::cnode::{
    before_serving, on_cnode_death, on_sigterm, spawn, status_text, Cn, CnodeArgs, Event, Flush,
    Msg, Out, Streams, WireStats, CHILD_TIMEOUT, DEFAULT_INTERVAL_MS, TERMINATED,
};
use crate::history_out;
use crate::launcher::default_bin_dir;
use crate::report::{TsoRestart, WorkerStats};
use crate::timeline::{CnodeTimeline, Fault};
use crate::txn_args::{Args, Point, ProtocolArg, NODE_CNODE};
use crate::workload::{RunClock, WorkloadSpec};

/// The `cnode` binary: run the compute node of `a` until stopped (module docs).
///
/// Errors: a bad run spec, a fabric or a cluster that cannot be reached, a thread that
/// panicked, stdout closed.
pub fn main(a: CnodeArgs) -> anyhow::Result<()> {
    if a.cnode >= crate::txn_args::MAX_CNODES {
        bail!(
            "--cnode must be below {} (got {})",
            crate::txn_args::MAX_CNODES,
            a.cnode
        );
    }
    let mut args: Args = serde_json::from_str(&a.run_spec).context("--run-spec")?;
    let protocol = match args.protocol {
        ProtocolArg::All => bail!("--run-spec names all protocols: one only"),
        _ => args.protocols()?[0],
    };
    args.protocol = ProtocolArg::One(protocol);
    let threads = args.threads.unwrap_or(1).max(1);
    let workload = crate::txnbench::workload_spec(&args)?;
    let mix = workload.profiles(args.theta)?;
    let node = NODE_CNODE + a.cnode as u32;
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe { libc::signal(libc::SIGTERM, on_sigterm as *const () as libc::sighandler_t) };

    let mut fcfg = FabricConfig::new(args.fabric, &a.cluster, NodeId(node));
    fcfg.device = args.rdma_device.clone();
    fcfg.gid_index = args.gid_index;
    fcfg.model = Some(args.model.clone());
    let fabric = Fabric::open(&fcfg).context("opening the fabric")?;
    let addrs = ClusterAddrs {
        memnodes: a.memnodes.clone(),
        lockd: a.lockd,
        tso: a.tso,
    };
    let cfg = crate::txnbench::txn_config(&args, protocol, threads);
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
    let mut handles = Vec::new();
    for i in 0..threads {
        let w = WorkerPlan {
            tid: a.cnode * threads + i,
            coroutines: args.coroutines,
            seed: args.seed,
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
        };
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
    let out = std::io::stdout();
    let mut out = std::io::BufWriter::new(out.lock());
    let say = |m: &Msg, out: &mut std::io::BufWriter<std::io::StdoutLock<'_>>| {
        serde_json::to_writer(&mut *out, m)?;
        out.write_all(b"\n")?;
        out.flush()
    };
    gate.wait();
    before_serving(node, a.incarnation);
    say(
        &Msg::Ready {
            node,
            incarnation: a.incarnation,
            pid: std::process::id(),
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
    go.wait();
    let write_out = |o: Out, out: &mut std::io::BufWriter<std::io::StdoutLock<'_>>| match o {
        Out::Msg(m) => say(&m, out),
        Out::History(h) => {
            let lines = history_out::lines(&h, &kinds, a.cnode, a.incarnation).collect();
            say(&Msg::History { lines }, out)
        }
    };
    while !handles.iter().all(|h| h.is_finished()) {
        if TERMINATED.load(Ordering::SeqCst) || cmd_rx.try_recv().is_ok_and(|c| c == "stop") {
            stop.store(true, Ordering::SeqCst);
        }
        match rx.recv_timeout(Duration::from_millis(20)) {
            Ok(o) => write_out(o, &mut out).context("stdout")?,
            Err(mpsc::RecvTimeoutError::Timeout | mpsc::RecvTimeoutError::Disconnected) => {}
        }
    }
    let results = handles.into_iter().map(|h| {
        h.join()
            .unwrap_or_else(|_| Err(anyhow!("coordinator thread panicked")))
    });
    for (i, r) in results.enumerate() {
        match r {
            Ok(mut s) => {
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
    Ok(())
}

/// The parent's side of the run with `--cnodes N` (module docs): the same
/// [`Measured`] as the in-process run, the history already written to
/// `--history-out`.
pub(crate) fn measure(
    args: &Args,
    workload: &dyn WorkloadSpec,
    cluster: &mut RunCluster,
    protocol: Protocol,
    point: &Point,
    stop: &AtomicBool,
) -> anyhow::Result<Measured> {
    let kinds = workload.kinds();
    let mut spec_args = args.clone();
    spec_args.protocol = ProtocolArg::One(protocol);
    spec_args.isolation = None;
    spec_args.sweep = None;
    spec_args.theta = point.theta;
    spec_args.coroutines = point.coroutines;
    spec_args.config = None;
    let spec = serde_json::to_string(&spec_args)?;
    let bin: PathBuf = args
        .bin_dir
        .clone()
        .unwrap_or_else(default_bin_dir)
        .join("cnode");
    let cluster_name = cluster.cluster.name().to_string();
    let (ev_tx, ev_rx) = mpsc::channel();
    let mut cns: Vec<Cn> = Vec::new();
    for i in 0..args.cnodes {
        cns.push(spawn(
            &bin,
            &cluster_name,
            &cluster.addrs,
            &spec,
            i,
            0,
            None,
            &ev_tx,
        )?);
    }
    let mut history_file = match &args.history_out {
        Some(p) => Some(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => None,
    };
    let mut history = (!args.no_check).then(|| History::new(args.check_memory_mb << 20));
    let mut streams = Streams::default();
    let mut events: Vec<String> = Vec::new();
    let mut history_lines = 0u64;

    // Handle one event of a child's stream.
    let mut handle = |cns: &mut Vec<Cn>,
                      streams: &mut Streams,
                      events: &mut Vec<String>,
                      (index, inc, ev): (usize, u32, Event)|
     -> anyhow::Result<()> {
        let cn = cns
            .iter_mut()
            .find(|c| c.index == index && c.incarnation == inc);
        match ev {
            Event::Msg(Msg::Ready { .. }) => {
                if let Some(c) = cn {
                    c.ready = true;
                }
            }
            Event::Msg(Msg::Interval {
                tid,
                from,
                commits,
                aborts,
            }) => streams.interval((index, inc, tid), from, &commits, &aborts),
            Event::Msg(Msg::History { lines }) => {
                *streams
                    .commits_by_incarnation
                    .entry((index, inc))
                    .or_default() += lines.len() as u64;
                if let Some(f) = &mut history_file {
                    history_out::write_lines(f, lines.iter().cloned())
                        .context("writing --history-out")?;
                }
                history_lines += lines.len() as u64;
                if let Some(h) = &mut history {
                    for l in &lines {
                        history_out::record(h, &kinds, l);
                    }
                }
            }
            Event::Msg(Msg::Stats { tid, stats }) => {
                streams.stats.insert((index, inc, tid), *stats);
            }
            Event::Msg(Msg::Error { error }) => {
                let e = format!("cnode {index} (incarnation {inc}): {error}");
                eprintln!("{e}");
                streams.errors.push(e.clone());
                events.push(e);
            }
            Event::Msg(Msg::Done) => {
                if let Some(c) = cn {
                    c.done = true;
                }
            }
            Event::Bad(l) => {
                events.push(format!("cnode {index} (incarnation {inc}): bad line: {l}"))
            }
            Event::Eof => {}
        }
        Ok(())
    };

    // Every child connected and ready (a watchdog for each).
    let deadline = Instant::now() + CHILD_TIMEOUT;
    while !cns.iter().all(|c| c.ready) {
        match ev_rx.recv_timeout(Duration::from_millis(50)) {
            Ok(ev) => handle(&mut cns, &mut streams, &mut events, ev)?,
            Err(_) => {
                for c in &mut cns {
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
        }
    }
    let t0 = txn::history::monotonic_ns();
    let started = Instant::now();
    for c in &mut cns {
        if let Some(s) = &mut c.stdin {
            writeln!(s, "go {t0}").context("telling a cnode to go")?;
        }
    }
    eprintln!(
        "{} coordinator processes running (nodes {}..={})",
        cns.len(),
        NODE_CNODE,
        NODE_CNODE + cns.len() as u32 - 1
    );
    let ms = |i: Instant| i.duration_since(started).as_secs_f64() * 1e3;
    let dur = Duration::from_secs_f64(args.duration);
    let target = args.cn.unwrap_or(args.cnodes - 1);
    let (mut killed, mut stopped_at, mut continued) = (false, None::<Instant>, false);
    let mut fault: Option<Fault> = None;
    let mut tso_restart: Option<TsoRestart> = None;
    let committed_now = AtomicU64::new(0);
    let mut last_progress = 0;
    let mut service_died = None;
    while started.elapsed() < dur && !stop.load(Ordering::Relaxed) {
        if let Ok(ev) = ev_rx.recv_timeout(Duration::from_millis(10)) {
            handle(&mut cns, &mut streams, &mut events, ev)?;
            while let Ok(ev) = ev_rx.try_recv() {
                handle(&mut cns, &mut streams, &mut events, ev)?;
            }
        }
        let now_s = started.elapsed().as_secs_f64();
        // Deaths.
        for c in cns.iter_mut().filter(|c| !c.gone) {
            if let Some(st) = c.child.try_wait()? {
                c.gone = true;
                if !c.stopping {
                    let e = format!(
                        "cnode {} (pid {}) died at {:.0} ms: {}",
                        c.index,
                        c.pid,
                        ms(Instant::now()),
                        status_text(st)
                    );
                    eprintln!("{e}");
                    events.push(e);
                    on_cnode_death(c.node, c.incarnation);
                }
            }
        }
        // --kill-cn-after [--restart].
        if !killed && args.kill_cn_after.is_some_and(|k| now_s >= k) {
            killed = true;
            if let Some(c) = cns.iter_mut().find(|c| c.index == target && !c.gone) {
                c.stopping = true;
                c.child.kill().context("SIGKILL to a cnode")?;
                let st = c.child.wait()?;
                c.gone = true;
                let at = ms(Instant::now());
                let e = format!(
                    "cnode {} (pid {}) died at {at:.0} ms: {} (--kill-cn-after)",
                    c.index,
                    c.pid,
                    status_text(st)
                );
                eprintln!("{e}");
                events.push(e);
                fault = Some(Fault {
                    what: format!("cnode {target} killed"),
                    at_ms: at,
                    cnode: Some(target),
                });
                let (node, inc) = (c.node, c.incarnation);
                on_cnode_death(node, inc);
                if args.restart {
                    let n = spawn(
                        &bin,
                        &cluster_name,
                        &cluster.addrs,
                        &spec,
                        target,
                        inc + 1,
                        Some(t0),
                        &ev_tx,
                    )?;
                    let e = format!(
                        "cnode {target} restarted at {:.0} ms as incarnation {} (pid {}, node {node})",
                        ms(Instant::now()),
                        inc + 1,
                        n.pid
                    );
                    eprintln!("{e}");
                    events.push(e);
                    cns.push(n);
                }
            }
        }
        // --stop-cn-after --stop-ms.
        if stopped_at.is_none() && args.stop_cn_after.is_some_and(|k| now_s >= k) {
            stopped_at = Some(Instant::now());
            if let Some(c) = cns.iter().find(|c| c.index == target && !c.gone) {
                // SAFETY: kill(2) on a child we spawned and have not reaped.
                unsafe { libc::kill(c.pid as libc::pid_t, libc::SIGSTOP) };
                let at = ms(Instant::now());
                let e = format!(
                    "cnode {target} (pid {}) stopped (SIGSTOP) at {at:.0} ms for {} ms",
                    c.pid, args.stop_ms
                );
                eprintln!("{e}");
                events.push(e);
                fault = Some(Fault {
                    what: format!("cnode {target} stopped for {} ms", args.stop_ms),
                    at_ms: at,
                    cnode: Some(target),
                });
            }
        }
        if let (Some(t), false) = (stopped_at, continued) {
            if t.elapsed() >= Duration::from_millis(args.stop_ms) {
                continued = true;
                for c in cns.iter().filter(|c| c.index == target && !c.gone) {
                    // SAFETY: as above.
                    unsafe { libc::kill(c.pid as libc::pid_t, libc::SIGCONT) };
                    let e = format!(
                        "cnode {target} (pid {}) continued (SIGCONT) at {:.0} ms",
                        c.pid,
                        ms(Instant::now())
                    );
                    eprintln!("{e}");
                    events.push(e);
                }
            }
        }
        // --kill-tso-after.
        if tso_restart.is_none() && args.kill_tso_after.is_some_and(|k| now_s >= k) {
            committed_now.store(streams.committed(), Ordering::Relaxed);
            let listen = cluster.addrs.tso.to_string();
            let tso_args = cluster.tso_args(&listen);
            let r = crate::txnbench::restart_tso(
                &mut cluster.cluster,
                &cluster.tso_state,
                &tso_args,
                Duration::from_millis(args.tso_down_ms),
                &committed_now,
                started,
            )
            .context("restarting the oracle")?;
            fault = crate::txnbench::tso_fault(Some(&r));
            tso_restart = Some(r);
        }
        let s = started.elapsed().as_secs();
        if s > last_progress {
            last_progress = s;
            let c = streams.committed();
            eprintln!(
                "[{protocol} {s:>3}s / {:.0}s] committed {c} ({:.0} txn/s) over {} coordinator process(es)",
                args.duration,
                c as f64 / started.elapsed().as_secs_f64(),
                cns.iter().filter(|c| !c.gone).count()
            );
        }
        if let Err(e) = cluster.cluster.check_alive() {
            service_died = Some(e);
            break;
        }
    }
    let elapsed = started.elapsed();
    if let (Some(_), false) = (stopped_at, continued) {
        for c in cns.iter().filter(|c| c.index == target && !c.gone) {
            // SAFETY: as above.
            unsafe { libc::kill(c.pid as libc::pid_t, libc::SIGCONT) };
        }
    }
    // Stop the survivors and take their last words (a watchdog kills the slow ones).
    for c in cns.iter_mut().filter(|c| !c.gone) {
        c.stopping = true;
        if let Some(mut s) = c.stdin.take() {
            let _ = writeln!(s, "stop");
        }
    }
    let deadline = Instant::now() + CHILD_TIMEOUT;
    loop {
        while let Ok(ev) = ev_rx.recv_timeout(Duration::from_millis(10)) {
            handle(&mut cns, &mut streams, &mut events, ev)?;
        }
        for c in cns.iter_mut().filter(|c| !c.gone) {
            if let Some(st) = c.child.try_wait()? {
                c.gone = true;
                if !st.success() {
                    events.push(format!(
                        "cnode {} (pid {}) ended after stop: {}",
                        c.index,
                        c.pid,
                        status_text(st)
                    ));
                }
            }
        }
        if cns.iter().all(|c| c.gone) {
            while let Ok(ev) = ev_rx.recv_timeout(Duration::from_millis(50)) {
                handle(&mut cns, &mut streams, &mut events, ev)?;
            }
            break;
        }
        if Instant::now() > deadline {
            for c in cns.iter_mut().filter(|c| !c.gone) {
                let _ = c.child.kill();
                let _ = c.child.wait();
                c.gone = true;
                events.push(format!(
                    "cnode {} (pid {}) did not stop within {CHILD_TIMEOUT:?}: SIGKILLed",
                    c.index, c.pid
                ));
            }
        }
    }
    if let Some(f) = &mut history_file {
        f.flush().context("writing --history-out")?;
    }
    if let Some(p) = &args.history_out {
        eprintln!(
            "wrote {history_lines} committed transactions to {}",
            p.display()
        );
    }
    if let Some(e) = service_died {
        bail!("a service died during the run: {e}");
    }
    for c in &cns {
        let n = streams
            .commits_by_incarnation
            .get(&(c.index, c.incarnation))
            .copied()
            .unwrap_or(0);
        if c.incarnation > 0 || args.kill_cn_after.is_some() {
            events.push(format!(
                "cnode {} incarnation {}: {n} committed transactions streamed",
                c.index, c.incarnation
            ));
        }
    }
    // Merge: the counters of every thread of every incarnation, one history.
    let mut workers = Vec::new();
    for (_, w) in std::mem::take(&mut streams.stats) {
        workers.push(w.into_stats(kinds.len())?);
    }
    if workers.is_empty() {
        workers.push(WorkerStats::with_kinds(kinds.len()));
    }
    workers[0].fatal.append(&mut streams.errors);
    if let Some(h) = history {
        workers[0].history = Some(h);
        for w in &mut workers[1..] {
            w.history = Some(History::new(0));
        }
    }
    let mut timelines: Vec<CnodeTimeline> = (0..args.cnodes)
        .map(|cnode| CnodeTimeline {
            cnode,
            commits: Vec::new(),
            aborts: Vec::new(),
        })
        .collect();
    for (&(cnode, _, _), (c, a)) in &streams.timelines {
        if let Some(t) = timelines.get_mut(cnode) {
            crate::timeline::add_into(&mut t.commits, c);
            crate::timeline::add_into(&mut t.aborts, a);
        }
    }
    if let Some(r) = &mut tso_restart {
        r.committed_after_ready = streams.committed().saturating_sub(r.committed_before_ready);
        r.thread_epochs = workers.iter().map(|w| w.tso_epoch).collect();
    }
    Ok(Measured {
        workers,
        elapsed,
        tso_restart,
        cpu: Vec::new(),
        timelines,
        fault,
        cnode_events: events,
        history_written: args.history_out.is_some(),
    })
}
