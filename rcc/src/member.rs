//! One node of RCC's symmetric cluster (RCC, 3): its partition in one registered region,
//! the RPC variants' handlers on its server thread, and its coordinator co-routines on
//! that same thread, as RCC's event-handling and transaction co-routines share a thread.
//! Coordinators reach every record through the network, local ones included.
//!
//! A [`Member`] is the part of a run one process holds: [`crate::cluster::run`] starts all
//! of a cluster's members in its own process; the `rcc-node` binary holds one member per
//! process, so that a node can be killed or stopped alone. The steps are the same either
//! way: [`Member::start`] (open the fabric as node `n + 1`, register and load the
//! partition, serve), [`Member::go`] with every member's address (the coordinators
//! connect to every node and run), [`Member::finished`] and [`Member::take_report`];
//! the member keeps serving the others' coordinators until it is dropped.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rrpc::fabric::{Fabric, FabricConfig, MemoryRegion, MrDesc};
use rrpc::node::{Node, NodeConfig, ServerRuntime};
use rrpc::runtime::{RuntimeConfig, Stats as RrpcStats, ThreadCtx};
use rrpc::server::{Handlers, ServerConfig};
use rrpc::wire::Batching;

use crate::calls::{AnyNet, CallTransport, CallsNet, NodeHandlers};
use crate::calvin::{self, CalvinConfig};
use crate::config::{RunConfig, RunError};
use crate::coord::{Coord, Proto};
use crate::driver::{self, Limit, Report};
use crate::layout::Layout;
use crate::net::RrpcNet;
use crate::server;
use crate::store::MrStore;
use crate::wire;
use crate::workload::Workload;

/// The name under which a node exports its partition's region.
pub const EXPORT_KEY: &str = "rcc";

/// What one member's coordinators measured, for [`crate::cluster::finish`].
#[derive(Debug)]
pub struct NodeReport {
    /// The member's coordinators' reports, merged.
    pub report: Report,
    /// The member's server thread's rrpc counters after the warm-up (doorbells, WRs,
    /// messages, one-sided lists and completions; the other fields zero).
    pub rrpc: RrpcStats,
    /// When its coordinators' measured window began (after the warm-up),
    /// `CLOCK_MONOTONIC` ns: the clock every process of a host shares.
    pub start_ns: u64,
    /// When its last coordinator ended, `CLOCK_MONOTONIC` ns.
    pub end_ns: u64,
    /// CALVIN, node 0: the global sequence of inputs per epoch (empty otherwise).
    pub calvin_seq: Vec<Vec<u64>>,
}

/// What the member's threads share with its owner.
struct Shared {
    /// Every member's address, in node order ([`Member::go`]).
    addrs: OnceLock<Vec<SocketAddr>>,
    /// The timestamp oracle's address, with [`crate::cluster::TsMode::Tso`].
    oracle: OnceLock<SocketAddr>,
    reports: Mutex<Vec<(Report, RrpcStats, Instant, Instant)>>,
    stop: AtomicBool,
    /// Transactions drawn so far (progress, for the watchdog).
    commits: AtomicU64,
    setup_error: Mutex<Option<String>>,
    /// The coordinators started.
    ready: AtomicBool,
    /// CALVIN, node 0: the global sequence of inputs per epoch.
    calvin_seq: Mutex<Vec<Vec<u64>>>,
    /// With [`RunConfig::calls`]: the client the coordinators take.
    calls: Mutex<Option<Box<dyn CallTransport + Send>>>,
}

/// One node of a run: its partition, its server and, after [`Member::go`], its
/// coordinators. Dropping it stops its server.
pub struct Member {
    coroutines: usize,
    node: Node,
    region: Arc<MemoryRegion>,
    shared: Arc<Shared>,
    handlers: NodeHandlers,
    fabric: String,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member")
            .field("addr", &self.node.addr())
            .field("fabric", &self.fabric)
            .finish_non_exhaustive()
    }
}

impl Member {
    /// Start node `n` (of `cfg.nodes`) of cluster `cluster`: open the fabric as node id
    /// `n + 1` (`cfg.fabric`, with `cfg.model` on shm), register its partition (the
    /// layout of `wl`'s tables in `cfg.proto`'s tuple shape, plus CALVIN's buffers),
    /// load `wl`'s initial tuples, and serve the RPC variants' handlers on one server
    /// thread listening on `listen` (port 0: any). The coordinators wait for
    /// [`Self::go`]. Errors: [`RunError::Config`] for a layout that cannot be built,
    /// [`RunError::Setup`] when the fabric, the region or the server fails.
    pub fn start(
        cfg: &RunConfig,
        wl: Arc<dyn Workload + Send + Sync>,
        n: usize,
        cluster: &str,
        listen: SocketAddr,
    ) -> Result<Self, RunError> {
        let layout = Arc::new(crate::config::layout_of(cfg, &*wl)?);
        let shared = Arc::new(Shared {
            addrs: OnceLock::new(),
            oracle: OnceLock::new(),
            reports: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            commits: AtomicU64::new(0),
            setup_error: Mutex::new(None),
            ready: AtomicBool::new(false),
            calvin_seq: Mutex::new(Vec::new()),
            calls: Mutex::new(None),
        });
        // CALVIN's receive and forward buffers follow the tables in every region.
        let region = if cfg.proto == Proto::Calvin {
            calvin::Buffers::new(&layout, cfg.coroutines, &CalvinConfig::default()).region_bytes()
        } else {
            layout.region_bytes()
        };
        let mut fc = FabricConfig::new(cfg.fabric, cluster, rrpc::NodeId(n as u32 + 1));
        fc.model = cfg.model.clone();
        let setup = |what| {
            move |e: rrpc::fabric::FabricError| RunError::Setup {
                what,
                why: e.to_string(),
            }
        };
        let fabric = Fabric::open(&fc).map_err(setup("opening the fabric"))?;
        let fabric_desc = fabric.describe();
        let mr = Arc::new(
            fabric
                .alloc_mr(region as usize)
                .map_err(setup("registering the partition"))?,
        );
        driver::load(&layout, &*wl, n, &mut |off, b| mr.write(off as usize, b));
        let handlers = handlers(MrStore(mr.clone()), region, shared.clone());
        let node_handlers =
            NodeHandlers::new(Arc::new(MrStore(mr.clone())), region).stopping_when({
                let shared = shared.clone();
                move || shared.stop.load(Ordering::Acquire)
            });
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
            NodeConfig::new("rcc-node", listen)
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
        Ok(Self {
            coroutines: cfg.coroutines,
            node,
            region: mr,
            shared,
            handlers: node_handlers,
            fabric: fabric_desc,
        })
    }

    /// The member's address (its rrpc connection setup: what [`Self::go`] takes).
    pub fn addr(&self) -> SocketAddr {
        self.node.addr()
    }

    /// The fabric and model it runs on, as the fabric describes itself.
    pub fn fabric(&self) -> &str {
        &self.fabric
    }

    /// Handlers over this member's partition for another call transport
    /// ([`RunConfig::calls`]).
    pub fn node_handlers(&self) -> NodeHandlers {
        self.handlers.clone()
    }

    /// The RPC variant's calls of this member's coordinators go over `client` (set
    /// before [`Self::go`]).
    pub fn set_calls(&self, client: Box<dyn CallTransport + Send>) {
        *self.shared.calls.lock().expect("lock") = Some(client);
    }

    /// Start the coordinators: they connect to every member (`addrs`, in node order,
    /// this one's included) and, with `oracle`, to the timestamp oracle, then run. A
    /// second call has no effect. A connection that fails is [`Self::setup_error`].
    pub fn go(&self, addrs: Vec<SocketAddr>, oracle: Option<SocketAddr>) {
        if let Some(o) = oracle {
            let _ = self.shared.oracle.set(o);
        }
        let _ = self.shared.addrs.set(addrs);
    }

    /// Transactions the coordinators drew so far: they draw one after the previous
    /// one committed or aborted for good, so the count moves while they progress.
    pub fn progress(&self) -> u64 {
        self.shared.commits.load(Ordering::Acquire)
    }

    /// The coordinators connected and started.
    pub fn started(&self) -> bool {
        self.shared.ready.load(Ordering::Acquire)
    }

    /// Why the coordinators could not start (a node they could not reach).
    pub fn setup_error(&self) -> Option<String> {
        self.shared.setup_error.lock().expect("lock").clone()
    }

    /// Every coordinator of this member ended.
    pub fn finished(&self) -> bool {
        self.shared.reports.lock().expect("lock").len() == self.coroutines
    }

    /// Stop the coordinators: no transaction starts after this, WAITDIE's waits end.
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::Release);
    }

    /// The coordinators' reports, merged, once [`Self::finished`] (before, the ones
    /// that ended); taken once.
    pub fn take_report(&self) -> NodeReport {
        let mut report = Report::new(0);
        let mut sum = RrpcStats::default();
        let (mut first, mut end) = (None::<Instant>, None::<Instant>);
        let reports = std::mem::take(&mut *self.shared.reports.lock().expect("lock"));
        let per = reports.len().max(1) as u64;
        for (r, s, t0, t1) in reports {
            report.merge(r);
            sum.add(&s);
            first = Some(first.map_or(t0, |f| f.min(t0)));
            end = Some(end.map_or(t1, |e| e.max(t1)));
        }
        // The thread's counters were taken once per coordinator: keep one.
        let rrpc = RrpcStats {
            doorbells: sum.doorbells / per,
            wrs: sum.wrs / per,
            messages: sum.messages / per,
            one_sided_lists: sum.one_sided_lists / per,
            one_sided_completions: sum.one_sided_completions / per,
            unmatched_completions: sum.unmatched_completions / per,
            ..RrpcStats::default()
        };
        let (now, now_ns) = (Instant::now(), txn::history::monotonic_ns());
        let ns =
            |t: Instant| now_ns.saturating_sub(now.saturating_duration_since(t).as_nanos() as u64);
        NodeReport {
            report,
            rrpc,
            start_ns: first.map_or(now_ns, ns),
            end_ns: end.map_or(now_ns, ns),
            calvin_seq: std::mem::take(&mut *self.shared.calvin_seq.lock().expect("lock")),
        }
    }

    /// The partition's region (tuples at the layout's offsets), read directly.
    pub fn region(&self) -> &MemoryRegion {
        &self.region
    }
}

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

/// A node's coordinators, on its server thread: wait for [`Member::go`], connect to
/// every node, run `cfg.coroutines` coordinators and report.
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
        if shared.stop.load(Ordering::Acquire) {
            return;
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
    let client = shared.calls.lock().expect("lock").take();
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
    // The stop flag of this thread's coordinators follows the member's.
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
    shared.ready.store(true, Ordering::Release);
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
