//! A run of RCC's symmetric cluster on rrpc (RCC, 3): every node holds its partition in
//! one registered region, serves the RPC variants' handlers on its server thread, and
//! runs its coordinator co-routines on that same thread ([`crate::member`]).
//!
//! [`run`] starts all nodes in this process, each on its own fabric endpoint (its own
//! node id, registered memory and QPs), on the shm backend (with the timing model if one
//! is named) or on verbs. The `rcc-node` binary runs one node per process instead; its
//! parent uses the same steps ([`check_config`], [`layout_of`], [`start_oracle`],
//! [`finish`]) around the nodes' own reports.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rrpc::fabric::shm::ClusterGuard;
use rrpc::fabric::{Fabric, FabricConfig, FabricKind};
use rrpc::runtime::Stats as RrpcStats;
use rrpc::NodeId;

use crate::calvin;
use crate::coord::Proto;
use crate::driver::{self, Report};
use crate::layout::Layout;
use crate::member::{Member, NodeReport};
use crate::workload::Workload;

pub use crate::config::{check_config, layout_of, RunConfig, RunError, TsMode};
pub use crate::member::EXPORT_KEY;

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

/// The timestamp oracle of a [`TsMode::Tso`] run, serving on node id `cfg.nodes + 1` of
/// cluster `cluster` (on `cfg.fabric`, with `cfg.model`); keep both values alive for the
/// run. Errors: [`RunError::Setup`].
pub fn start_oracle(
    cfg: &RunConfig,
    cluster: &str,
) -> Result<(tso::Oracle, rrpc::node::Node), RunError> {
    let mut fc = FabricConfig::new(cfg.fabric, cluster, NodeId(cfg.nodes as u32 + 1));
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
    Ok((o, node))
}

/// How a run ended, besides the nodes' reports: for [`finish`].
#[derive(Debug, Default)]
pub struct Ending {
    /// The watchdog stopped the run ([`Outcome::stalled`]).
    pub stalled: bool,
    /// [`Outcome::stall`].
    pub stall: Option<String>,
    /// The fabric and model that ran.
    pub fabric: String,
    /// With [`TsMode::Tso`]: the oracle's counter at the end.
    pub oracle_timestamps: Option<u64>,
}

/// Merge the nodes' reports (one per node, any order) and check the final database,
/// read through `tuple(node, off, len)`: the workload's check, locks free,
/// serializability, and for CALVIN the determinism against a serial replay of node 0's
/// global sequence ([`calvin::check_determinism`]).
pub fn finish(
    cfg: &RunConfig,
    layout: &Layout,
    wl: &dyn Workload,
    nodes: Vec<NodeReport>,
    tuple: &dyn Fn(usize, u64, usize) -> Vec<u8>,
    ending: Ending,
) -> Outcome {
    let mut report = Report::new(0);
    let mut rrpc = RrpcStats::default();
    let (mut first, mut end) = (None::<u64>, None::<u64>);
    let mut calvin_seq = Vec::new();
    for r in nodes {
        report.merge(r.report);
        rrpc.add(&r.rrpc);
        first = Some(first.map_or(r.start_ns, |f| f.min(r.start_ns)));
        end = Some(end.map_or(r.end_ns, |e| e.max(r.end_ns)));
        if !r.calvin_seq.is_empty() {
            calvin_seq = r.calvin_seq;
        }
    }
    let mut audit = driver::audit(layout, wl, tuple, &report);
    if cfg.proto == Proto::Calvin {
        if let Ok(lines) = &mut audit {
            match calvin::check_determinism(layout, wl, &calvin_seq, tuple) {
                Ok(l) => lines.push(l),
                Err(e) => audit = Err(e),
            }
        }
    }
    Outcome {
        report,
        elapsed: match (first, end) {
            (Some(a), Some(b)) => Duration::from_nanos(b.saturating_sub(a)),
            _ => Duration::ZERO,
        },
        rrpc,
        audit,
        stalled: ending.stalled,
        stall: ending.stall,
        fabric: ending.fabric,
        oracle_timestamps: ending.oracle_timestamps,
    }
}

/// Run `wl` on a fresh cluster of `cfg.nodes` nodes in this process and check the
/// result (for CALVIN, with [`calvin::CalvinConfig::default`] and one more check: the
/// database equals a serial replay of node 0's global sequence,
/// [`calvin::check_determinism`]). Errors: [`RunError`]; failed checks are in
/// [`Outcome::audit`].
pub fn run(cfg: &RunConfig, wl: Arc<dyn Workload + Send + Sync>) -> Result<Outcome, RunError> {
    check_config(cfg)?;
    let layout = layout_of(cfg, &*wl)?;
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
    let any = "127.0.0.1:0".parse().expect("addr");
    let members = (0..cfg.nodes)
        .map(|n| Member::start(cfg, wl.clone(), n, &name, any))
        .collect::<Result<Vec<_>, _>>()?;
    // The oracle, on a node of its own, before the coordinators look for it.
    let oracle = match cfg.ts {
        TsMode::Local => None,
        TsMode::Tso => Some(start_oracle(cfg, &name)?),
    };
    // The other call transport's servers and clients, before the coordinators start.
    let calls_cluster = match &cfg.calls {
        None => None,
        Some(f) => {
            let setup = |why: String| RunError::Setup {
                what: "starting the call transport",
                why,
            };
            let c = f
                .start(members.iter().map(Member::node_handlers).collect())
                .map_err(setup)?;
            for m in &members {
                m.set_calls(c.client().map_err(setup)?);
            }
            Some(c)
        }
    };
    let addrs: Vec<SocketAddr> = members.iter().map(Member::addr).collect();
    let oracle_addr = oracle.as_ref().map(|(_, node)| node.addr());
    for m in &members {
        m.go(addrs.clone(), oracle_addr);
    }
    let stop_all = || members.iter().for_each(Member::stop);
    // Wait for every coordinator, with the watchdog.
    let deadline = Instant::now() + cfg.warmup + cfg.duration + Duration::from_secs(30);
    let mut watchdog = Watchdog::new(cfg);
    loop {
        std::thread::sleep(Duration::from_millis(10));
        if let Some(e) = members.iter().find_map(Member::setup_error) {
            stop_all();
            return Err(RunError::Setup {
                what: "connecting a node to the cluster",
                why: e,
            });
        }
        let finished = members.iter().filter(|m| m.finished()).count();
        if finished == members.len() {
            break;
        }
        let started = members.iter().all(Member::started);
        let progress = members.iter().map(Member::progress).sum();
        if watchdog.poll(started, progress, finished * cfg.coroutines) {
            stop_all();
        }
        if Instant::now() > deadline {
            stop_all();
            return Err(RunError::Stuck(Duration::from_secs(30)));
        }
    }
    let reports: Vec<NodeReport> = members.iter().map(Member::take_report).collect();
    let tuple = |node: usize, off: u64, len: usize| {
        let mut b = vec![0; len];
        members[node].region().read(off as usize, &mut b);
        b
    };
    let fabric = members[0].fabric().to_string();
    drop(calls_cluster);
    let oracle_timestamps = oracle.map(|(o, node)| {
        drop(node);
        o.current().get() & tso::timestamp::COUNTER_MASK
    });
    let out = finish(
        cfg,
        &layout,
        &*wl,
        reports,
        &tuple,
        Ending {
            stalled: watchdog.stalled(),
            stall: watchdog.stall.take(),
            fabric,
            oracle_timestamps,
        },
    );
    drop(members);
    Ok(out)
}

static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The run's watchdog (RCC's runs have none; this project's: a deadlock or a node that
/// stopped answering ends the run with a report instead of a hang): it fires once no
/// transaction was drawn anywhere for [`RunConfig::watchdog`] after every node's
/// coordinators started.
#[derive(Debug)]
pub struct Watchdog {
    limit: Duration,
    coordinators: usize,
    run: Duration,
    last: (u64, Instant),
    waited: Instant,
    /// Why it fired ([`Outcome::stall`]), once it has.
    pub stall: Option<String>,
}

impl Watchdog {
    /// A watchdog for `cfg`'s run, from now.
    pub fn new(cfg: &RunConfig) -> Self {
        Self {
            limit: cfg.watchdog,
            coordinators: cfg.nodes * cfg.coroutines,
            run: cfg.duration,
            last: (0, Instant::now()),
            waited: Instant::now(),
            stall: None,
        }
    }

    /// Look again: `started` (every node's coordinators started), `progress` (the sum
    /// of their transactions drawn), `finished` (coordinators that ended). Returns
    /// true once, when it fires: the caller then stops every node.
    pub fn poll(&mut self, started: bool, progress: u64, finished: usize) -> bool {
        if !started {
            self.last.1 = Instant::now();
        } else if progress != self.last.0 {
            self.last = (progress, Instant::now());
        } else if self.last.1.elapsed() > self.limit && self.stall.is_none() {
            self.stall = Some(format!(
                "no commit for {:.2} s, {:.2} s into a {:.2} s run; {finished} of {} \
                 coordinators finished; {progress} commits",
                self.last.1.elapsed().as_secs_f64(),
                self.waited.elapsed().as_secs_f64(),
                self.run.as_secs_f64(),
                self.coordinators,
            ));
            return true;
        }
        false
    }

    /// It fired.
    pub fn stalled(&self) -> bool {
        self.stall.is_some()
    }
}
