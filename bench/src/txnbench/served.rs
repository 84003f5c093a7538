//! `--lock-serving coordinator`: a Lotus compute node's coordinator threads are the RPC
//! server threads of its embedded lock service (Lotus 4.1: lock requests from other
//! compute nodes are served on the coordinator threads, no extra CPU). Each server
//! thread's runtime context runs one coordinator thread's coroutines
//! ([`super::start_coroutines`]) on the thread's executor, so the thread polls the lock
//! table's handlers (and the forwarding RPC's, and the resharding and recovery ones)
//! between its transaction coroutines' turns, and the process has as many server threads
//! as coordinator threads and no other.
//!
//! The service starts before the coordinators' plans exist (they need the lock table's
//! site), so each server thread's coordinator waits for its [`Job`], connects, counts
//! itself arrived and waits for the go, all without blocking the thread (it keeps
//! serving meanwhile); the process's main thread plays the part the barriers play for
//! coordinator threads of their own. Coordinator i runs on server thread i and asks every
//! peer to serve its Rocket pairs on the peer's server thread i
//! ([`rrpc::runtime::ThreadCtx::ask_server_thread`]), so the i-th coordinator of one
//! compute node sends its lock RPCs to the i-th coordinator of another, as Lotus 4.1 has
//! it (modulo the peer's threads when the nodes have different counts).

use std::cell::Cell;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use rrpc::node::ServerRuntime;
use rrpc::runtime::{RuntimeConfig, ThreadCtx};

use super::{start_coroutines, WorkerPlan};
use crate::report::WorkerStats;
use crate::workload::{Mix, Task};

/// How often a waiting coordinator looks for its job, the go, or the end of its
/// coroutines (a sleep on the thread's executor: the thread serves meanwhile).
const POLL: Duration = Duration::from_millis(1);

/// What one coordinator thread runs: its plan and what its coroutines share with the
/// process (as [`super::worker`] takes them).
pub(crate) struct Job {
    pub(crate) plan: WorkerPlan,
    pub(crate) mix: Arc<dyn Mix>,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) committed: Arc<AtomicU64>,
}

/// The coordinators of a compute node that run on its lock service's server threads
/// (module docs). Shared by the server threads (through
/// [`ServedCoordinators::server_runtime`]) and the process's main thread.
pub(crate) struct ServedCoordinators {
    threads: usize,
    runtime: RuntimeConfig,
    /// Per slot, the job until its thread takes it.
    jobs: Mutex<Vec<Option<Job>>>,
    /// Coordinators connected (or ended before they could).
    arrived: AtomicUsize,
    go: AtomicBool,
    /// The process gave up before the coordinators ran: waiting ones end.
    abandoned: AtomicBool,
    /// Per slot, the coordinator's counters or why it failed.
    results: Mutex<Vec<Option<anyhow::Result<WorkerStats>>>>,
}

impl ServedCoordinators {
    /// `threads` coordinators (at least 1), their contexts with `runtime` (the
    /// coordinators' settings: [`WorkerPlan::thread_runtime`]).
    pub(crate) fn new(threads: usize, runtime: RuntimeConfig) -> Arc<Self> {
        let threads = threads.max(1);
        Arc::new(Self {
            threads,
            runtime,
            jobs: Mutex::new((0..threads).map(|_| None).collect()),
            arrived: AtomicUsize::new(0),
            go: AtomicBool::new(false),
            abandoned: AtomicBool::new(false),
            results: Mutex::new((0..threads).map(|_| None).collect()),
        })
    }

    /// How many coordinator threads (= server threads the lock service must start).
    pub(crate) fn threads(&self) -> usize {
        self.threads
    }

    /// The runtime of the lock service's server threads: each one's setup spawns its
    /// coordinator (waiting for its [`Job`]) on the thread's executor.
    pub(crate) fn server_runtime(self: &Arc<Self>) -> ServerRuntime {
        let me = self.clone();
        ServerRuntime::new(self.runtime.clone()).with_setup(move |ctx| {
            let Some(slot) = ctx.server_thread() else {
                return Ok(());
            };
            // Coordinator i talks to every peer's coordinator i (module docs).
            ctx.ask_server_thread(u32::try_from(slot).ok());
            if slot < me.threads {
                ctx.spawn(Guarded::new(
                    Box::pin(coordinator(slot, ctx.clone(), me.clone())),
                    Box::new(|_| {}),
                ));
            }
            Ok(())
        })
    }

    /// Hand the coordinators their jobs, one per thread. Errors: not one per thread.
    pub(crate) fn run(&self, jobs: Vec<Job>) -> anyhow::Result<()> {
        if jobs.len() != self.threads {
            bail!(
                "{} coordinator jobs for {} server threads",
                jobs.len(),
                self.threads
            );
        }
        let mut slots = lock(&self.jobs);
        for (slot, job) in slots.iter_mut().zip(jobs) {
            *slot = Some(job);
        }
        Ok(())
    }

    /// Whether every coordinator connected (or ended trying).
    pub(crate) fn all_arrived(&self) -> bool {
        self.arrived.load(Ordering::Acquire) >= self.threads
    }

    /// The run started: the coordinators start their coroutines (the run's `t0` is
    /// stored by now).
    pub(crate) fn go(&self) {
        self.go.store(true, Ordering::Release);
    }

    /// The coordinators will not run (the process is failing): the waiting ones end.
    pub(crate) fn abandon(&self) {
        self.abandoned.store(true, Ordering::Release);
    }

    /// Whether every coordinator reported.
    pub(crate) fn finished(&self) -> bool {
        lock(&self.results).iter().all(Option::is_some)
    }

    /// Each coordinator's counters, or why it failed, by thread; once [`Self::finished`]
    /// (a missing one is an error).
    pub(crate) fn take_results(&self) -> Vec<anyhow::Result<WorkerStats>> {
        lock(&self.results)
            .iter_mut()
            .enumerate()
            .map(|(i, r)| {
                r.take()
                    .unwrap_or_else(|| Err(anyhow!("coordinator thread {i} did not report")))
            })
            .collect()
    }

    fn take_job(&self, slot: usize) -> Option<Job> {
        lock(&self.jobs).get_mut(slot).and_then(Option::take)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A coordinator's place among the results: its result when it ends, an error if it is
/// dropped first (its server thread panicked or the service stopped), and its arrival
/// if it never connected.
struct Slot {
    me: Arc<ServedCoordinators>,
    slot: usize,
    arrived: bool,
    result: Option<anyhow::Result<WorkerStats>>,
}

impl Slot {
    fn arrive(&mut self) {
        if !self.arrived {
            self.arrived = true;
            self.me.arrived.fetch_add(1, Ordering::AcqRel);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.arrive();
        let r = self.result.take().unwrap_or_else(|| {
            Err(anyhow!(
                "coordinator thread {} ended before it reported (its server thread panicked or \
                 the lock service stopped)",
                self.slot
            ))
        });
        if let Some(x) = lock(&self.me.results).get_mut(self.slot) {
            *x = Some(r);
        }
    }
}

/// Server thread `slot`'s coordinator: wait for its job, connect, arrive, wait for the
/// go, run its coroutines until they all ended, report.
async fn coordinator(slot: usize, ctx: Rc<ThreadCtx>, me: Arc<ServedCoordinators>) {
    let mut s = Slot {
        me: me.clone(),
        slot,
        arrived: false,
        result: None,
    };
    let job = loop {
        if let Some(j) = me.take_job(slot) {
            break j;
        }
        if me.abandoned.load(Ordering::Acquire) {
            return;
        }
        ctx.sleep(POLL).await;
    };
    let tid = job.plan.tid;
    // Blocks this thread while it connects (its peers' control planes answer on
    // threads of their own, so nothing waits for this thread meanwhile).
    let connected = job.plan.connect(&ctx);
    s.arrive();
    while !me.go.load(Ordering::Acquire) {
        if me.abandoned.load(Ordering::Acquire) {
            return;
        }
        ctx.sleep(POLL).await;
    }
    let r = match connected.with_context(|| format!("coordinator thread {tid} connecting")) {
        Ok(client) => run(job, &ctx, client).await,
        Err(e) => Err(e),
    };
    s.result = Some(r);
}

/// Run `job`'s coroutines on this server thread until every one ended (and was
/// dropped), then take the thread's counters. Errors: forwarding's connections; a
/// coroutine panicked.
async fn run(
    job: Job,
    ctx: &Rc<ThreadCtx>,
    client: Rc<txn::coordinator::TxnClient>,
) -> anyhow::Result<WorkerStats> {
    let Job {
        plan,
        mix,
        stop,
        committed,
    } = job;
    let tid = plan.tid;
    let live = Rc::new(Cell::new(0usize));
    let panicked = Rc::new(Cell::new(false));
    let running = start_coroutines(plan, ctx, client, mix, stop, committed, &mut |t| {
        live.set(live.get() + 1);
        let (live, panicked) = (live.clone(), panicked.clone());
        ctx.spawn(Guarded::new(
            t,
            Box::new(move |p| {
                live.set(live.get() - 1);
                if p {
                    panicked.set(true);
                }
            }),
        ));
    })?;
    while live.get() > 0 {
        ctx.sleep(POLL).await;
    }
    if panicked.get() {
        bail!("a coroutine of coordinator thread {tid} panicked");
    }
    running.finish(ctx)
}

/// A task whose panic ends it instead of unwinding through the server thread's
/// executor (which would stop the thread, and with it the lock service's share of the
/// Rocket pairs); `on_end` is called once, after the task was dropped, with whether it
/// panicked.
struct Guarded {
    task: Option<Task>,
    on_end: Option<Box<dyn FnOnce(bool)>>,
}

impl Guarded {
    fn new(task: Task, on_end: Box<dyn FnOnce(bool)>) -> Self {
        Self {
            task: Some(task),
            on_end: Some(on_end),
        }
    }
}

impl Future for Guarded {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<()> {
        let this = &mut *self;
        let Some(t) = this.task.as_mut() else {
            return Poll::Ready(());
        };
        let panicked = match std::panic::catch_unwind(AssertUnwindSafe(|| t.as_mut().poll(cx))) {
            Ok(Poll::Pending) => return Poll::Pending,
            Ok(Poll::Ready(())) => false,
            Err(_) => true,
        };
        // Dropped before `on_end` runs: what it held (the thread's counters) is free.
        this.task = None;
        if let Some(f) = this.on_end.take() {
            f(panicked);
        }
        Poll::Ready(())
    }
}
