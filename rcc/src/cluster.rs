//! A run of RCC's symmetric cluster on rrpc (RCC, 3): every node holds its partition in
//! one registered region, serves the RPC variants' handlers on its server thread, and
//! runs its coordinator co-routines on that same thread, as RCC's event-handling and
//! transaction co-routines share a thread. Coordinators reach every record through the
//! network, local ones included.
//!
//! All nodes run in this process, each on its own fabric endpoint (its own node id,
//! registered memory and QPs), on the shm backend (with the timing model if one is
//! named) or on verbs.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rrpc::fabric::shm::ClusterGuard;
use rrpc::fabric::{Fabric, FabricConfig, FabricKind, MemoryRegion, MrDesc};
use rrpc::node::{Node, NodeConfig, ServerRuntime};
use rrpc::runtime::{RuntimeConfig, Stats as RrpcStats, ThreadCtx};
use rrpc::server::{Handlers, ServerConfig};
use rrpc::wire::Batching;
use rrpc::NodeId;

use crate::calls::{AnyNet, CallTransport, CallTransportFactory, CallsNet, NodeHandlers};
use crate::calvin::{self, CalvinConfig};
use crate::coord::{Coord, Fault, Proto, Variant};
use crate::driver::{self, Limit, Report};
use crate::layout::Layout;
use crate::net::RrpcNet;
use crate::server;
use crate::store::MrStore;
use crate::wire;
use crate::workload::Workload;

/// The name under which a node exports its partition's region.
pub const EXPORT_KEY: &str = "rcc";

/// A run's shape.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Backend (default: `$RRPC_FABRIC`, else shm).
    pub fabric: FabricKind,
    /// Timing model of the shm backend (`cx5`, ...; `None`: `$RRPC_MODEL`, else none).
    pub model: Option<String>,
    /// Nodes (each one server thread).
    pub nodes: usize,
    /// Coordinator co-routines per node.
    pub coroutines: usize,
    /// Protocol.
    pub proto: Proto,
    /// Primitive.
    pub variant: Variant,
    /// How long coordinators start transactions, after the warm-up.
    pub duration: Duration,
    /// Warm-up before `duration` (default none): the coordinators run both, and what
    /// the [`Outcome`] reports (commits, aborts, latencies, network counters, the
    /// elapsed time) covers the time after it, a transaction in flight at its end
    /// counted when it ends ([`driver::drive_after`]); the checks cover the whole run.
    /// Not for CALVIN (its driver counts from the start): a configuration error.
    pub warmup: Duration,
    /// Seed of the generators (coordinator `i` uses `seed + i`).
    pub seed: u64,
    /// Bytes of history kept for the serializability check, per coordinator.
    pub history_bytes: usize,
    /// A planted bug (test builds with feature `fault-injection`).
    pub fault: Option<Fault>,
    /// Where WAITDIE's and MVCC's timestamps come from.
    pub ts: TsMode,
    /// One-sided doorbell batching (lock-and-read, update-and-unlock; RCC, 3): on by
    /// default.
    pub doorbell_batching: bool,
    /// The run stops all coordinators when no transaction finished anywhere for this
    /// long once every node's coordinators started (a deadlock), and reports it.
    pub watchdog: Duration,
    /// The RPC variant's calls over another transport (the bench's tonic one; RCC, 5,
    /// Table 3 compares RDMA RPC with TCP): `None` (default) is rrpc. The nodes and
    /// their coordinators stay on rrpc's threads; only the calls take this transport.
    /// Needs [`Variant::Rpc`].
    pub calls: Option<Arc<dyn CallTransportFactory>>,
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            fabric: FabricKind::from_env().unwrap_or_default(),
            model: None,
            nodes: 2,
            coroutines: 10,
            proto: Proto::NoWait,
            variant: Variant::OneSided,
            duration: Duration::from_secs(2),
            warmup: Duration::ZERO,
            seed: 1,
            history_bytes: 8 << 20,
            fault: None,
            doorbell_batching: true,
            ts: TsMode::Local,
            watchdog: Duration::from_secs(1),
            calls: None,
        }
    }
}

/// Where WAITDIE's and MVCC's transaction timestamps come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TsMode {
    /// Each coordinator's clock with its id in the low bits, as RCC takes them (RCC,
    /// 4.3 and 4.4).
    #[default]
    Local,
    /// This project's timestamp oracle (Scythe 4.5), started with the cluster on a node
    /// of its own: one one-sided FAA on its counter per group of a thread's requests
    /// (`tso::ThreadTso`), the coordinator's id in the low bits.
    Tso,
}

/// Errors of a run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A configuration that cannot run.
    #[error("bad configuration: {0}")]
    Config(String),
    /// The fabric, a node or a connection failed.
    #[error("{what}: {why}")]
    Setup {
        /// What was being set up.
        what: &'static str,
        /// The underlying error.
        why: String,
    },
    /// The coordinators did not finish in time (a deadlock the watchdog missed).
    #[error("the coordinators did not finish within {0:?} of the end")]
    Stuck(Duration),
}

/// What a run measured and its checks.
#[derive(Debug)]
pub struct Outcome {
    /// All coordinators' reports, merged.
    pub report: Report,
    /// Wall time from the first coordinator's start (after the warm-up) to the last
    /// one's end.
    pub elapsed: Duration,
    /// The server threads' rrpc counters (doorbells, WRs), summed (after the warm-up).
    pub rrpc: RrpcStats,
    /// One line per check that passed; the run's checks failed if `Err`.
    pub audit: Result<Vec<String>, String>,
    /// The watchdog stopped the run: nothing committed for [`RunConfig::watchdog`].
    pub stalled: bool,
    /// When [`Outcome::stalled`]: when the watchdog fired (seconds since the wait for
    /// the coordinators began, against the run's duration), how many coordinators had
    /// finished, and the commits so far; for telling a stall mid-run from one
    /// coordinator that cannot finish its last transaction after the others stopped.
    pub stall: Option<String>,
    /// The fabric and model that ran.
    pub fabric: String,
    /// With [`TsMode::Tso`]: the oracle's counter at the end (timestamps handed out).
    pub oracle_timestamps: Option<u64>,
}

struct Shared {
    addrs: OnceLock<Vec<SocketAddr>>,
    /// The timestamp oracle's address, with [`TsMode::Tso`].
    oracle: OnceLock<SocketAddr>,
    reports: Mutex<Vec<(Report, RrpcStats, Instant, Instant)>>,
    stop: AtomicBool,
    stalled: AtomicBool,
    /// [`Outcome::stall`].
    stall: Mutex<Option<String>>,
    /// Commits so far, all coordinators, for the watchdog.
    commits: std::sync::atomic::AtomicU64,
    setup_error: Mutex<Option<String>>,
    /// Nodes whose coordinators started (the watchdog arms when all have).
    ready: std::sync::atomic::AtomicUsize,
    /// CALVIN: node 0's global sequence of inputs per epoch, for the determinism check.
    calvin_seq: Mutex<Vec<Vec<u64>>>,
    /// With [`RunConfig::calls`]: each node's client, taken by its thread.
    calls: Mutex<Vec<Option<Box<dyn CallTransport + Send>>>>,
}

/// Run `wl` on a fresh cluster of `cfg.nodes` nodes and check the result (for CALVIN,
/// with [`calvin::CalvinConfig::default`] and one more check: the database equals a
/// serial replay of node 0's global sequence, [`calvin::check_determinism`]). Errors:
/// [`RunError`]; failed checks are in [`Outcome::audit`].
pub fn run(cfg: &RunConfig, wl: Arc<dyn Workload + Send + Sync>) -> Result<Outcome, RunError> {
    if cfg.nodes == 0 || cfg.coroutines == 0 || cfg.nodes * cfg.coroutines >= 1024 {
        return Err(RunError::Config(format!(
            "{} nodes x {} coroutines: need at least one of each and fewer than 1024 coordinators",
            cfg.nodes, cfg.coroutines
        )));
    }
    if cfg.calls.is_some() && cfg.variant != Variant::Rpc {
        return Err(RunError::Config(format!(
            "the {} transport serves the RPC variant only",
            cfg.calls.as_ref().map_or("", |c| c.name())
        )));
    }
    if cfg.fault.is_some() && !cfg!(feature = "fault-injection") {
        return Err(RunError::Config(
            "planted bugs need a build with feature fault-injection".into(),
        ));
    }
    let layout = Arc::new(
        Layout::with_shape(cfg.nodes, wl.tables(), cfg.proto.shape())
            .map_err(|e| RunError::Config(e.to_string()))?,
    );
    let name = format!(
        "rcc-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let _guard = match cfg.fabric {
        FabricKind::Shm => Some(
            ClusterGuard::new(&name)
                .map_err(|e| RunError::Setup {
                    what: "preparing the shm cluster",
                    why: e.to_string(),
                })?
                .0,
        ),
        FabricKind::Verbs => None,
    };
    let shared = Arc::new(Shared {
        addrs: OnceLock::new(),
        oracle: OnceLock::new(),
        reports: Mutex::new(Vec::new()),
        stop: AtomicBool::new(false),
        stalled: AtomicBool::new(false),
        stall: Mutex::new(None),
        commits: Default::default(),
        setup_error: Mutex::new(None),
        ready: Default::default(),
        calvin_seq: Mutex::new(Vec::new()),
        calls: Mutex::new(Vec::new()),
    });
    // CALVIN's receive and forward buffers follow the tables in every region.
    let region = if cfg.proto == Proto::Calvin {
        calvin::Buffers::new(&layout, cfg.coroutines, &CalvinConfig::default()).region_bytes()
    } else {
        layout.region_bytes()
    };
    let mut nodes = Vec::new();
    let mut regions: Vec<Arc<MemoryRegion>> = Vec::new();
    let mut fabric_desc = String::new();
    let mut node_handlers = Vec::new();
    for n in 0..cfg.nodes {
        let mut fc = FabricConfig::new(cfg.fabric, &name, NodeId(n as u32 + 1));
        fc.model = cfg.model.clone();
        let setup = |what| {
            move |e: rrpc::fabric::FabricError| RunError::Setup {
                what,
                why: e.to_string(),
            }
        };
        let fabric = Fabric::open(&fc).map_err(setup("opening the fabric"))?;
        if n == 0 {
            fabric_desc = fabric.describe();
        }
        let mr = Arc::new(
            fabric
                .alloc_mr(region as usize)
                .map_err(setup("registering the partition"))?,
        );
        driver::load(&layout, &*wl, n, &mut |off, b| mr.write(off as usize, b));
        let handlers = handlers(MrStore(mr.clone()), region, shared.clone());
        node_handlers.push(
            NodeHandlers::new(Arc::new(MrStore(mr.clone())), region).stopping_when({
                let shared = shared.clone();
                move || shared.stop.load(Ordering::Acquire)
            }),
        );
        // Batching off is off in the runtime too: without it the runtime would still
        // post a round's pending WRs under one doorbell.
        let rt_cfg = RuntimeConfig::default().with_batching(if cfg.doorbell_batching {
            Batching::Combined
        } else {
            Batching::Msg
        });
        let rt = ServerRuntime::new(rt_cfg).with_setup({
            let (shared, layout, wl, cfg) =
                (shared.clone(), layout.clone(), wl.clone(), cfg.clone());
            let store = MrStore(mr.clone());
            move |ctx| {
                let ctx = ctx.clone();
                let (shared, layout, wl, cfg) =
                    (shared.clone(), layout.clone(), wl.clone(), cfg.clone());
                ctx.clone()
                    .spawn(node_main(ctx, n, shared, layout, wl, cfg, store.clone()));
                Ok(())
            }
        });
        let node = Node::start_with_runtime(
            fabric,
            NodeConfig::new("rcc-node", "127.0.0.1:0".parse().expect("addr"))
                .export(
                    EXPORT_KEY,
                    serde_json::to_value(mr.desc()).expect("a region descriptor serializes"),
                )
                .rpc(handlers, 1),
            ServerConfig::default(),
            Some(rt),
        )
        .map_err(|e| RunError::Setup {
            what: "starting a node",
            why: e.to_string(),
        })?;
        nodes.push(node);
        regions.push(mr);
    }
    // The oracle, on a node of its own, before the coordinators look for it.
    let oracle = match cfg.ts {
        TsMode::Local => None,
        TsMode::Tso => {
            let mut fc = FabricConfig::new(cfg.fabric, &name, NodeId(cfg.nodes as u32 + 1));
            fc.model = cfg.model.clone();
            let setup = |what: &'static str| move |e: String| RunError::Setup { what, why: e };
            let fabric = Fabric::open(&fc)
                .map_err(|e| e.to_string())
                .map_err(setup("opening the oracle's fabric"))?;
            let o = tso::Oracle::new(&fabric)
                .map_err(|e| e.to_string())
                .map_err(setup("creating the timestamp oracle"))?;
            let node = o
                .serve(fabric, "127.0.0.1:0".parse().expect("addr"))
                .map_err(|e| e.to_string())
                .map_err(setup("serving the timestamp oracle"))?;
            let _ = shared.oracle.set(node.addr());
            Some((o, node))
        }
    };
    // The other call transport's servers and clients, before the coordinators start.
    let calls_cluster = match &cfg.calls {
        None => None,
        Some(f) => {
            let setup = |why: String| RunError::Setup {
                what: "starting the call transport",
                why,
            };
            let c = f.start(node_handlers).map_err(setup)?;
            let clients = (0..cfg.nodes)
                .map(|_| c.client().map(Some))
                .collect::<Result<Vec<_>, _>>()
                .map_err(setup)?;
            *shared.calls.lock().expect("lock") = clients;
            Some(c)
        }
    };
    let _ = shared.addrs.set(nodes.iter().map(|n| n.addr()).collect());
    // Wait for every coordinator, with the watchdog.
    let deadline = Instant::now() + cfg.warmup + cfg.duration + Duration::from_secs(30);
    let mut last = (0u64, Instant::now());
    let waited = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(10));
        if let Some(e) = shared.setup_error.lock().expect("lock").clone() {
            shared.stop.store(true, Ordering::Release);
            return Err(RunError::Setup {
                what: "connecting a node to the cluster",
                why: e,
            });
        }
        if shared.reports.lock().expect("lock").len() == cfg.nodes * cfg.coroutines {
            break;
        }
        let c = shared.commits.load(Ordering::Acquire);
        if shared.ready.load(Ordering::Acquire) < cfg.nodes {
            last.1 = Instant::now();
        } else if c != last.0 {
            last = (c, Instant::now());
        } else if last.1.elapsed() > cfg.watchdog && !shared.stop.load(Ordering::Acquire) {
            let finished = shared.reports.lock().expect("lock").len();
            *shared.stall.lock().expect("lock") = Some(format!(
                "no commit for {:.2} s, {:.2} s into a {:.2} s run; {finished} of {} \
                 coordinators finished; {c} commits",
                last.1.elapsed().as_secs_f64(),
                waited.elapsed().as_secs_f64(),
                cfg.duration.as_secs_f64(),
                cfg.nodes * cfg.coroutines,
            ));
            shared.stalled.store(true, Ordering::Release);
            shared.stop.store(true, Ordering::Release);
        }
        if Instant::now() > deadline {
            shared.stop.store(true, Ordering::Release);
            return Err(RunError::Stuck(Duration::from_secs(30)));
        }
    }
    drop(nodes);
    drop(calls_cluster);
    let oracle_timestamps = oracle.map(|(o, node)| {
        drop(node);
        o.current().get() & tso::timestamp::COUNTER_MASK
    });
    let mut report = Report::new(0);
    let mut rrpc = RrpcStats::default();
    let (mut first, mut end) = (None::<Instant>, None::<Instant>);
    for (r, s, t0, t1) in std::mem::take(&mut *shared.reports.lock().expect("lock")) {
        report.merge(r);
        rrpc.doorbells += s.doorbells;
        rrpc.wrs += s.wrs;
        rrpc.messages += s.messages;
        rrpc.one_sided_lists += s.one_sided_lists;
        rrpc.one_sided_completions += s.one_sided_completions;
        rrpc.unmatched_completions += s.unmatched_completions;
        first = Some(first.map_or(t0, |f| f.min(t0)));
        end = Some(end.map_or(t1, |e| e.max(t1)));
    }
    // The thread's counters were taken once per coordinator: keep one per node.
    let per = cfg.coroutines as u64;
    rrpc.doorbells /= per;
    rrpc.wrs /= per;
    rrpc.messages /= per;
    rrpc.one_sided_lists /= per;
    rrpc.one_sided_completions /= per;
    rrpc.unmatched_completions /= per;
    let tuple = |node: usize, off: u64, len: usize| {
        let mut b = vec![0; len];
        regions[node].read(off as usize, &mut b);
        b
    };
    let mut audit = driver::audit(&layout, &*wl, &tuple, &report);
    if cfg.proto == Proto::Calvin {
        if let Ok(lines) = &mut audit {
            let seq = std::mem::take(&mut *shared.calvin_seq.lock().expect("lock"));
            match calvin::check_determinism(&layout, &*wl, &seq, &tuple) {
                Ok(l) => lines.push(l),
                Err(e) => audit = Err(e),
            }
        }
    }
    let stall = shared.stall.lock().expect("lock").take();
    Ok(Outcome {
        report,
        elapsed: match (first, end) {
            (Some(a), Some(b)) => b.saturating_duration_since(a),
            _ => Duration::ZERO,
        },
        rrpc,
        audit,
        stalled: shared.stalled.load(Ordering::Acquire),
        stall,
        fabric: fabric_desc,
        oracle_timestamps,
    })
}

static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The RPC variants' handlers over a node's partition.
fn handlers(store: MrStore, region: u64, shared: Arc<Shared>) -> Handlers {
    let mut h = Handlers::new();
    for id in [
        wire::FETCH,
        wire::RELEASE,
        wire::COMMIT,
        wire::READ,
        wire::LOCK,
        wire::VALIDATE,
        wire::MVCC_FETCH,
        wire::MVCC_COMMIT,
        wire::SUNDIAL_RENEW,
    ] {
        let s = store.clone();
        h.register(id, move |req, out| server::serve(&s, region, id, req, out));
    }
    for id in [calvin::BATCH, calvin::FORWARD] {
        let s = store.clone();
        h.register(id, move |req, out| calvin::serve(&s, region, id, req, out));
    }
    h.register_async(wire::FETCH_WAIT, move |req| {
        let (s, shared) = (store.clone(), shared.clone());
        async move {
            let ctx = ThreadCtx::current().ok_or("FETCH_WAIT needs the server's runtime")?;
            let stopped = || shared.stop.load(Ordering::Acquire);
            server::serve_waitdie(&s, region, &req, || ctx.yield_now(), &stopped).await
        }
    });
    h
}

/// A node's coordinators, on its server thread: wait for the cluster, connect to every
/// node, run `cfg.coroutines` coordinators and report.
async fn node_main(
    ctx: Rc<ThreadCtx>,
    n: usize,
    shared: Arc<Shared>,
    layout: Arc<Layout>,
    wl: Arc<dyn Workload + Send + Sync>,
    cfg: RunConfig,
    store: MrStore,
) {
    let addrs = loop {
        if let Some(a) = shared.addrs.get() {
            break a.clone();
        }
        ctx.sleep(Duration::from_millis(1)).await;
    };
    let mut nodes = Vec::with_capacity(addrs.len());
    for a in &addrs {
        let info = match ctx.connect_rpc(*a) {
            Ok(i) => i,
            Err(e) => {
                *shared.setup_error.lock().expect("lock") = Some(format!("node {n} to {a}: {e}"));
                return;
            }
        };
        let desc: Option<MrDesc> = info
            .exports
            .get(EXPORT_KEY)
            .and_then(|v| serde_json::from_value(v.clone()).ok());
        let Some(desc) = desc else {
            *shared.setup_error.lock().expect("lock") =
                Some(format!("node at {a} exports no RCC partition"));
            return;
        };
        nodes.push((info.node, desc));
    }
    let client = shared
        .calls
        .lock()
        .expect("lock")
        .get_mut(n)
        .and_then(Option::take);
    let net = match client {
        None => AnyNet::Rrpc(RrpcNet::new(ctx.clone(), nodes)),
        Some(c) => {
            let ctx = ctx.clone();
            AnyNet::Calls(CallsNet::new(
                {
                    let c: Rc<dyn CallTransport + Send> = Rc::from(c);
                    c
                },
                Some(Rc::new(move || Box::pin(ctx.yield_now()))),
            ))
        }
    };
    let ts_source: Option<crate::coord::TsSource> = match shared.oracle.get() {
        None => None,
        Some(&addr) => {
            let conn =
                match tso::TsoConn::connect(ctx.clone(), addr, tso::ReconnectConfig::default()) {
                    Ok(c) => c,
                    Err(e) => {
                        *shared.setup_error.lock().expect("lock") =
                            Some(format!("node {n} to the timestamp oracle at {addr}: {e}"));
                        return;
                    }
                };
            let tso = Rc::new(tso::ThreadTso::new(conn));
            let ctx = ctx.clone();
            Some(Rc::new(move || {
                let (tso, ctx) = (tso.clone(), ctx.clone());
                Box::pin(async move {
                    tso.timestamp(&ctx)
                        .await
                        .map(|t| t.get())
                        .map_err(|e| e.to_string())
                })
            }))
        }
    };
    let layout = Rc::new((*layout).clone());
    let stop = Rc::new(std::cell::Cell::new(false));
    let start = Instant::now();
    let limit = Limit {
        until: start + cfg.warmup + cfg.duration,
        txns: None,
        start,
    };
    // This thread's rrpc counters at the warm-up's end (zero without one), subtracted
    // from each coordinator's report; a run ending before it reports none.
    let base: Rc<std::cell::Cell<Option<RrpcStats>>> = Rc::new(std::cell::Cell::new(
        cfg.warmup.is_zero().then(RrpcStats::default),
    ));
    if !cfg.warmup.is_zero() {
        let (ctx2, base, at) = (ctx.clone(), base.clone(), start + cfg.warmup);
        ctx.spawn(async move {
            ctx2.sleep(at.saturating_duration_since(Instant::now()))
                .await;
            base.set(Some(ctx2.stats()));
        });
    }
    // The stop flag of this thread's coordinators follows the cluster's.
    {
        let (ctx2, stop, shared) = (ctx.clone(), stop.clone(), shared.clone());
        ctx.spawn(async move {
            while !shared.stop.load(Ordering::Acquire) {
                if stop.get() {
                    return;
                }
                ctx2.sleep(Duration::from_millis(1)).await;
            }
            stop.set(true);
        });
    }
    shared.ready.fetch_add(1, Ordering::AcqRel);
    let left = Rc::new(std::cell::Cell::new(cfg.coroutines));
    if cfg.proto == Proto::Calvin {
        calvin_main(
            &ctx, n, &shared, &layout, wl, &cfg, store, net, limit, stop, start, base,
        );
        return;
    }
    for j in 0..cfg.coroutines {
        let id = (n * cfg.coroutines + j + 1) as u64;
        #[allow(unused_mut)]
        let mut c = Coord::new(net.clone(), layout.clone(), cfg.proto, cfg.variant, id);
        #[cfg(feature = "fault-injection")]
        if let Some(f) = cfg.fault {
            c.plant(f);
        }
        c.stop = stop.clone();
        c.doorbell_batching = cfg.doorbell_batching;
        c.tso = ts_source.clone();
        let (wl, shared, ctx2, left, stop) = (
            wl.clone(),
            shared.clone(),
            ctx.clone(),
            left.clone(),
            stop.clone(),
        );
        let seed = cfg.seed.wrapping_add(id);
        let (hb, warmup, base) = (cfg.history_bytes, cfg.warmup, base.clone());
        ctx.spawn(async move {
            let counted = Counted {
                wl: &*wl,
                shared: &shared,
            };
            let rep = driver::drive_after(&c, &counted, seed, limit, warmup, hb).await;
            let t1 = Instant::now();
            let now = ctx2.stats();
            let stats = now.since(&base.get().unwrap_or(now));
            shared
                .reports
                .lock()
                .expect("lock")
                .push((rep, stats, start + warmup, t1));
            left.set(left.get() - 1);
            if left.get() == 0 {
                stop.set(true);
            }
        });
    }
}

/// A node's CALVIN co-routines (sequencers and schedulers, RCC, 4.6) on its server
/// thread; node 0 keeps the global sequence for the determinism check.
#[allow(clippy::too_many_arguments)]
fn calvin_main(
    ctx: &Rc<ThreadCtx>,
    n: usize,
    shared: &Arc<Shared>,
    layout: &Rc<Layout>,
    wl: Arc<dyn Workload + Send + Sync>,
    cfg: &RunConfig,
    store: MrStore,
    net: AnyNet,
    limit: Limit,
    stop: Rc<std::cell::Cell<bool>>,
    start: Instant,
    base: Rc<std::cell::Cell<Option<RrpcStats>>>,
) {
    let progress = {
        let shared = shared.clone();
        Box::new(move || {
            shared.commits.fetch_add(1, Ordering::AcqRel);
        })
    };
    #[allow(unused_mut)]
    let mut node = calvin::Node::new(
        n,
        cfg.coroutines,
        layout.clone(),
        Rc::new(wl),
        Arc::new(store),
        CalvinConfig::default(),
    )
    .with_progress(progress);
    if n == 0 {
        node = node.with_sequence_log();
    }
    #[cfg(feature = "fault-injection")]
    if let Some(f) = cfg.fault {
        node.plant(f);
    }
    let node = Rc::new(node);
    let left = Rc::new(std::cell::Cell::new(cfg.coroutines));
    for j in 0..cfg.coroutines {
        let id = (n * cfg.coroutines + j + 1) as u64;
        let mut c = Coord::new(net.clone(), layout.clone(), cfg.proto, cfg.variant, id);
        c.stop = stop.clone();
        let (node, shared, ctx2, left, stop) = (
            node.clone(),
            shared.clone(),
            ctx.clone(),
            left.clone(),
            stop.clone(),
        );
        let (seed, hb, warmup, base) = (
            cfg.seed.wrapping_add(id),
            cfg.history_bytes,
            cfg.warmup,
            base.clone(),
        );
        ctx.spawn(async move {
            let rep = calvin::drive_after(&node, &c, j, seed, limit, warmup, hb).await;
            let t1 = Instant::now();
            let now = ctx2.stats();
            let stats = now.since(&base.get().unwrap_or(now));
            left.set(left.get() - 1);
            if left.get() == 0 {
                if n == 0 {
                    *shared.calvin_seq.lock().expect("lock") = node.sequence();
                }
                stop.set(true);
            }
            shared
                .reports
                .lock()
                .expect("lock")
                .push((rep, stats, start + warmup, t1));
        });
    }
}

/// The workload, counting generated transactions as progress for the watchdog: a
/// transaction is drawn after the previous one finished, so the count moves exactly
/// when transactions commit or abort for good.
struct Counted<'a> {
    wl: &'a dyn Workload,
    shared: &'a Shared,
}

impl Workload for Counted<'_> {
    fn name(&self) -> &'static str {
        self.wl.name()
    }
    fn tables(&self) -> Vec<crate::layout::TableSpec> {
        self.wl.tables()
    }
    fn initial(&self, table: u32, key: u64) -> Vec<u8> {
        self.wl.initial(table, key)
    }
    fn next(
        &self,
        rng: &mut rand::rngs::SmallRng,
        delta: Rc<std::cell::Cell<i64>>,
    ) -> crate::coord::TxnSpec {
        self.shared.commits.fetch_add(1, Ordering::AcqRel);
        self.wl.next(rng, delta)
    }
    fn kind_name(&self, kind: u16) -> &'static str {
        self.wl.kind_name(kind)
    }
    fn check(&self, read: &dyn Fn(u32, u64) -> Vec<u8>, delta: i64) -> Result<String, String> {
        self.wl.check(read, delta)
    }
}
