//! Memory-node failover in txn-bench (`--kill-memnode-after`): the view manager of the
//! replication design (B.6.2 and B.6.4, after Motor 5.3), run by txn-bench for its
//! coordinator threads.
//!
//! When memory node `m` is killed: (1) **detection**: the manager READs a word of `m`
//! until the fabric reports it gone (on shm its liveness lock, on verbs its control
//! connection); (2) **drain**: the feed stops attempts that begin on a partition whose
//! primary `m` held ([`txn::view::ViewFeed::start_drain`]), and the manager waits until
//! every attempt from before has ended; (3) **promotion**: in each partition `m` was the
//! primary of, the first live backup becomes the primary, its lock words cleared (FORD's
//! invisible marks); (4) the new view (epoch + 1, `m` dead) is stored in etcd when the
//! run has it and handed to the coordinators. With one copy of a partition the run stops
//! and says which partition is gone.

use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::Context;
use rrpc::fabric::Fabric;
use rrpc::runtime::{block_on, RuntimeConfig, ThreadCtx};
use serde::Serialize;
use txn::coordinator::ClusterAddrs;
use txn::cvt_remote::CvtRemote;
use txn::view::{View, ViewFeed};

/// The view manager's member id in etcd (txn-bench itself).
const NODE_VIEW_MANAGER: u16 = 99;

/// How long the coordinators' QP pools try to reconnect to an unreachable node in runs
/// that kill a memory node (the runtime's default is 10 s, for nodes that restart).
pub const RECONNECT_GIVE_UP: Duration = Duration::from_millis(250);

/// How long the drain may take before the failover gives up.
const DRAIN_LIMIT: Duration = Duration::from_secs(10);

/// Whether a node's control plane at `addr` accepts a connection (within 100 ms).
fn alive(addr: std::net::SocketAddr) -> bool {
    std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok()
}

/// One failover, as the report gives it (times in ms from the run's start).
#[derive(Clone, Debug, Serialize)]
pub struct Failover {
    /// The memory node that died.
    pub memnode: u32,
    /// When it was killed.
    pub killed_ms: f64,
    /// When the manager saw it gone.
    pub detected_ms: f64,
    /// When the drain barrier passed.
    pub drained_ms: f64,
    /// When the new view was out (promotions done).
    pub published_ms: f64,
    /// Partitions whose backup was promoted.
    pub promoted: Vec<u32>,
    /// Partitions left with no copy.
    pub lost: Vec<u32>,
    /// Lock words cleared on the promoted images.
    pub lock_words_cleared: usize,
    /// The new view's epoch.
    pub epoch: u64,
}

impl Failover {
    /// `failover: memnode I dead at T ms: P partitions promoted in X ms (...)`.
    pub fn line(&self) -> String {
        format!(
            "failover: memnode {} dead at {:.0} ms: {} partitions promoted in {:.2} ms after \
             detection (detected {:.2} ms after the kill; drain {:.2} ms; {} lock words \
             cleared; view epoch {}){}",
            self.memnode,
            self.killed_ms,
            self.promoted.len(),
            self.published_ms - self.detected_ms,
            self.detected_ms - self.killed_ms,
            self.drained_ms - self.detected_ms,
            self.lock_words_cleared,
            self.epoch,
            if self.lost.is_empty() {
                String::new()
            } else {
                format!("; partitions {:?} LOST", self.lost)
            }
        )
    }
}

/// The view manager: its own thread context and store (connected before any fault),
/// the coordinators' feed, and the view's home in etcd.
pub(crate) struct ViewManager {
    ctx: Rc<ThreadCtx>,
    store: Rc<CvtRemote>,
    feed: ViewFeed,
    etcd: Option<member::Member>,
    addrs: ClusterAddrs,
}

impl ViewManager {
    /// Connect to the memory nodes at `addrs`, and with `etcd` (endpoint, cluster)
    /// store the initial view there. Errors: a memory node or etcd unreachable.
    pub(crate) fn new(
        fabric: &Fabric,
        addrs: &ClusterAddrs,
        feed: ViewFeed,
        etcd: Option<(String, String)>,
    ) -> anyhow::Result<Self> {
        let ctx = ThreadCtx::new(fabric.clone(), RuntimeConfig::default())?;
        let store = Rc::new(
            CvtRemote::connect(ctx.clone(), &addrs.memnodes, 16)
                .context("view manager: connecting to the memory nodes")?,
        );
        let etcd = match etcd {
            Some((endpoint, cluster)) => Some(
                member::Member::join(
                    &[endpoint],
                    &cluster,
                    member::Role::Other("view-manager".into()),
                    NODE_VIEW_MANAGER,
                    Duration::from_secs(10),
                )
                .context("view manager: joining etcd")?,
            ),
            None => None,
        };
        let m = Self {
            ctx,
            store,
            feed,
            etcd,
            addrs: addrs.clone(),
        };
        m.store_view(&m.feed.snapshot().0)?;
        Ok(m)
    }

    /// Put `view` in etcd (`/<cluster>/kv/view`), when the run has etcd.
    fn store_view(&self, view: &View) -> anyhow::Result<()> {
        if let Some(e) = &self.etcd {
            e.put_durable("view", serde_json::to_vec(view)?)
                .context("storing the replica view in etcd")?;
        }
        Ok(())
    }

    /// Memory node `m` was killed at `killed` (the run began at `started`): detect,
    /// drain, promote, publish. Errors: the node never looked gone, the drain did not
    /// finish within 10 s, a promoted image could not be read, etcd failed.
    pub(crate) fn fail_over(
        &self,
        m: u32,
        killed: Instant,
        started: Instant,
    ) -> anyhow::Result<Failover> {
        let ms = |t: Instant| t.duration_since(started).as_secs_f64() * 1e3;
        let (ctx, store, feed) = (self.ctx.clone(), self.store.clone(), self.feed.clone());
        let addr = *self
            .addrs
            .memnodes
            .get(m as usize)
            .context("no such memory node")?;
        let (detected, drained, cleared, view, promoted, lost) = block_on(&self.ctx, async move {
            // (1) Detection: the node's control plane refuses connections (the
            // kernel closed its sockets: the process is gone), as the QPs' own
            // watch of it does (rrpc's `QueuePair::watch_peer`).
            let t0 = Instant::now();
            while alive(addr) {
                anyhow::ensure!(
                    t0.elapsed() < Duration::from_secs(10),
                    "memory node {m} still answers 10 s after its kill"
                );
                ctx.sleep(Duration::from_micros(200)).await;
            }
            let detected = Instant::now();
            // (2) Drain.
            feed.start_drain(m);
            while !feed.drained() {
                anyhow::ensure!(
                    detected.elapsed() < DRAIN_LIMIT,
                    "the drain of memory node {m} did not finish in {DRAIN_LIMIT:?}"
                );
                ctx.sleep(Duration::from_micros(20)).await;
            }
            let drained = Instant::now();
            // (3) Promotion.
            let (view, promoted, lost) = feed.snapshot().0.fail(m);
            let mut cleared = 0;
            for &p in &promoted {
                let new_primary = view.partitions[p as usize]
                    .primary
                    .expect("a promoted partition has a primary");
                cleared += store
                    .clear_lock_words(new_primary, p)
                    .await
                    .with_context(|| format!("clearing partition {p}'s new primary"))?;
            }
            Ok::<_, anyhow::Error>((detected, drained, cleared, view, promoted, lost))
        })?;
        // (4) The new view, durable first.
        self.store_view(&view)?;
        let epoch = view.epoch;
        self.feed.publish(view);
        let published = Instant::now();
        Ok(Failover {
            memnode: m,
            killed_ms: ms(killed),
            detected_ms: ms(detected),
            drained_ms: ms(drained),
            published_ms: ms(published),
            promoted,
            lost,
            lock_words_cleared: cleared,
            epoch,
        })
    }
}
