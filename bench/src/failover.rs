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
//!
//! With `--restart`, **re-replication** follows (B.6.4 step 3, after Motor 5.3's data
//! migration): the memory node is started again, empty (`memnode --empty`), and rejoins
//! under a view of its own ([`txn::view::View::rejoin`]: the coordinators connect to the
//! new process); then, one partition at a time, each partition it hosts an image of is
//! marked migrating (commits touching it wait: they abort as `migrating` and retry), a
//! drain barrier waits for the attempts from before, the partition is copied from its
//! primary with bulk READs and WRITEs ([`txn::migrate::copy_image`]), and a view with
//! the node as its last backup ends the migration. Transactions on other partitions run
//! on throughout. With `--spare-memnodes` instead, the same copies go to a spare memory
//! node started with the cluster (`memnode --spare-index`), which holds an empty image
//! of every partition: each partition the dead node held a copy of is copied to it and
//! it becomes that partition's last backup (`ViewManager::fill_spare`).

use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::Context;
use rrpc::fabric::Fabric;
use rrpc::runtime::{block_on, ThreadCtx};
use serde::Serialize;
use txn::coordinator::ClusterAddrs;
use txn::cvt_remote::CvtRemote;
use txn::view::{View, ViewFeed};

/// The view manager's member id in etcd (txn-bench itself).
const NODE_VIEW_MANAGER: u16 = 99;

/// How long the coordinators' QP pools try to reconnect to an unreachable node in runs
/// that kill a memory node (the runtime's default is 10 s, for nodes that restart).
pub const RECONNECT_GIVE_UP: Duration = Duration::from_millis(250);

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
    /// With `--restart`: the memory node started again and re-replicated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restart: Option<Restart>,
}

/// The dead memory node started again, or a spare in its place, filled by
/// re-replication (times in ms from the run's start).
#[derive(Clone, Debug, Serialize)]
pub struct Restart {
    /// The memory node filled: the dead one restarted, or the spare.
    pub memnode: u32,
    /// With a spare (`--spare-memnodes`): the dead memory node whose copies it took
    /// over (`None`: the dead node itself was restarted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replaces: Option<u32>,
    /// When its new process answered (loaded, empty).
    pub started_ms: f64,
    /// When the view naming its new incarnation was out (the coordinators connect to
    /// it as they take that view).
    pub rejoined_ms: f64,
    /// Each partition copied to it, in order.
    pub partitions: Vec<Rereplication>,
}

/// One partition copied back to a rejoined memory node.
#[derive(Clone, Debug, Serialize)]
pub struct Rereplication {
    /// The partition.
    pub partition: u32,
    /// The memory node it was copied to.
    pub memnode: u32,
    /// The primary it was copied from.
    pub from: u32,
    /// When the view marking it migrating was out.
    pub started_ms: f64,
    /// When the drain barrier passed (the copy began).
    pub drained_ms: f64,
    /// When the view with the new backup was out (commits resume).
    pub done_ms: f64,
    /// Bytes and time of each table's copy.
    pub tables: Vec<txn::migrate::TableCopy>,
    /// Bytes copied in all.
    pub bytes: u64,
    /// The view's epoch after the copy.
    pub epoch: u64,
}

impl Rereplication {
    /// `re-replicated: partition P to memnode J, B bytes in X ms (...)`.
    pub fn line(&self) -> String {
        let tables: Vec<String> = self
            .tables
            .iter()
            .map(|t| format!("{} {} B in {:.2} ms", t.table, t.bytes, t.ms))
            .collect();
        format!(
            "re-replicated: partition {} to memnode {}, {} bytes in {:.2} ms (commits to it \
             waited {:.2} ms: drain {:.2} ms; from memnode {}; {}; view epoch {})",
            self.partition,
            self.memnode,
            self.bytes,
            self.done_ms - self.drained_ms,
            self.done_ms - self.started_ms,
            self.drained_ms - self.started_ms,
            self.from,
            tables.join(", "),
            self.epoch
        )
    }
}

impl Restart {
    /// `memnode J restarted ...` (or `spare memnode J takes ...`), then one
    /// `re-replicated:` line per partition.
    pub fn lines(&self) -> Vec<String> {
        let head = match self.replaces {
            None => format!(
                "memnode {} restarted empty at {:.0} ms, rejoined at {:.0} ms; {} partitions \
                 to copy back",
                self.memnode,
                self.started_ms,
                self.rejoined_ms,
                self.partitions.len()
            ),
            Some(dead) => format!(
                "spare memnode {} takes dead memnode {dead}'s place at {:.0} ms; {} partitions \
                 to copy to it",
                self.memnode,
                self.started_ms,
                self.partitions.len()
            ),
        };
        let mut out = vec![head];
        out.extend(self.partitions.iter().map(Rereplication::line));
        out
    }
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
    /// The coordinator processes (node ids) that follow the views through etcd and
    /// must acknowledge each drain ([`crate::view_sync`]); empty when the coordinators
    /// run in this process.
    cnodes: Vec<u16>,
    /// The last drain request's generation.
    drain_gen: std::cell::Cell<u64>,
}

impl ViewManager {
    /// Connect to the memory nodes at `addrs`, and with `etcd` (endpoint, cluster)
    /// store the initial view there. `cnodes`: the coordinator processes (node ids)
    /// that follow the views through etcd (empty: the coordinators follow `feed` in
    /// this process). Errors: a memory node or etcd unreachable; coordinator processes
    /// without etcd.
    pub(crate) fn new(
        fabric: &Fabric,
        addrs: &ClusterAddrs,
        feed: ViewFeed,
        etcd: Option<(String, String)>,
        cnodes: Vec<u16>,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(
            cnodes.is_empty() || etcd.is_some(),
            "coordinator processes follow the replica views through etcd, and this run has none"
        );
        let ctx = ThreadCtx::new(fabric.clone(), crate::run_runtime::get())?;
        // It follows the views it publishes, so that it reaches a restarted memory
        // node's new regions as the coordinators do.
        let store = Rc::new(
            CvtRemote::connect_with(ctx.clone(), &addrs.memnodes, 16, Some(feed.clone()))
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
            cnodes,
            drain_gen: std::cell::Cell::new(0),
        };
        m.store_view(&m.feed.snapshot().0)?;
        Ok(m)
    }

    /// Put `view` in etcd (`/<cluster>/kv/view`), when the run has etcd, after checking
    /// that its epoch is above the stored one's (epochs never go back, whatever
    /// happened to etcd meanwhile). Errors: etcd failed; the stored epoch is not below.
    fn store_view(&self, view: &View) -> anyhow::Result<()> {
        if let Some(e) = &self.etcd {
            if let Some(old) = self.stored_view()? {
                anyhow::ensure!(
                    view.epoch > old.epoch,
                    "etcd holds view epoch {}, not below the new view's {}: the view would go back",
                    old.epoch,
                    view.epoch
                );
            }
            e.put_durable(crate::view_sync::VIEW_KEY, serde_json::to_vec(view)?)
                .context("storing the replica view in etcd")?;
        }
        Ok(())
    }

    /// The view stored in etcd (`None`: none stored, or the run has no etcd).
    /// Errors: etcd failed; the stored value is not a view.
    pub(crate) fn stored_view(&self) -> anyhow::Result<Option<View>> {
        let Some(e) = &self.etcd else {
            return Ok(None);
        };
        match e
            .get(crate::view_sync::VIEW_KEY)
            .context("reading the replica view from etcd")?
        {
            Some(b) => Ok(Some(
                serde_json::from_slice(&b).context("the view stored in etcd")?,
            )),
            None => Ok(None),
        }
    }

    /// [`Self::stored_view`], retried for up to 10 s (etcd just restarted: its clients
    /// reconnect).
    pub(crate) fn stored_view_patiently(&self) -> anyhow::Result<Option<View>> {
        let t0 = Instant::now();
        loop {
            match self.stored_view() {
                Ok(v) => return Ok(v),
                Err(e) if t0.elapsed() > Duration::from_secs(10) => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// The drain barrier: wait until every attempt in this process from before the
    /// feed's last drain has ended, then have every coordinator process apply `kind`
    /// and wait until each did the same ([`crate::view_sync`]). Errors: a drain did not
    /// finish within 10 s (naming the compute nodes that did not answer); etcd failed.
    fn drain(&self, kind: crate::view_sync::DrainKind, what: &str) -> anyhow::Result<()> {
        crate::view_sync::await_drained(&self.feed, what)?;
        if self.cnodes.is_empty() {
            return Ok(());
        }
        let me = self.etcd.as_ref().context("no etcd")?;
        let gen = self.drain_gen.get() + 1;
        self.drain_gen.set(gen);
        crate::view_sync::drain_remote(
            me,
            &self.cnodes,
            &crate::view_sync::DrainRequest { gen, kind },
        )
        .with_context(|| what.to_string())
    }

    /// The epoch of the view the coordinators follow.
    pub(crate) fn published_epoch(&self) -> u64 {
        self.feed.snapshot().0.epoch
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
        let (store, feed) = (self.store.clone(), self.feed.clone());
        let addr = *self
            .addrs
            .memnodes
            .get(m as usize)
            .context("no such memory node")?;
        // (1) Detection: the node's control plane refuses connections (the kernel
        // closed its sockets: the process is gone), as the QPs' own watch of it does
        // (rrpc's `QueuePair::watch_peer`).
        let t0 = Instant::now();
        while alive(addr) {
            anyhow::ensure!(
                t0.elapsed() < Duration::from_secs(10),
                "memory node {m} still answers 10 s after its kill"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
        let detected = Instant::now();
        // (2) Drain, here and in every coordinator process.
        feed.start_drain(m);
        self.drain(
            crate::view_sync::DrainKind::Fail { memnode: m },
            &format!("the drain of memory node {m}"),
        )?;
        let drained = Instant::now();
        let (cleared, view, promoted, lost) = block_on(&self.ctx, async move {
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
            Ok::<_, anyhow::Error>((cleared, view, promoted, lost))
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
            restart: None,
        })
    }

    /// Re-replication after memory node `m`'s failover: its new process (started
    /// empty, answering at its old address, at `started`) rejoins, and each partition it
    /// hosts an image of is copied back from its primary, one at a time, while commits
    /// touching that partition wait (the run began at `run_start`).
    ///
    /// Errors: the new process is not memory node `m` or its geometry differs; a drain
    /// did not finish within 10 s; a READ or WRITE of the copy failed; etcd failed.
    pub(crate) fn re_replicate(
        &self,
        m: u32,
        started: Instant,
        run_start: Instant,
    ) -> anyhow::Result<Restart> {
        let ms = |t: Instant| t.duration_since(run_start).as_secs_f64() * 1e3;
        // (1) Rejoin: a view with the new incarnation, which the coordinators (and
        // this manager's store) connect to as they take it.
        let view = self.feed.snapshot().0.rejoin(m);
        self.store_view(&view)?;
        self.feed.publish(view);
        let rejoined = Instant::now();
        let store = self.store.clone();
        store.epoch(); // takes the view: connects to the new process
        anyhow::ensure!(
            !store.rejoin_pending(),
            "memory node {m}'s new process could not be reached (see the log)"
        );
        let parts: Vec<u32> = (0..store.partitions())
            .filter(|&p| store.image(m, p).is_some())
            .collect();
        anyhow::ensure!(
            !parts.is_empty(),
            "memory node {m} came back hosting no image (was it started as memory node {m}?)"
        );
        let copies = self.copy_partitions(m, &parts, run_start)?;
        Ok(Restart {
            memnode: m,
            replaces: None,
            started_ms: ms(started),
            rejoined_ms: ms(rejoined),
            partitions: copies,
        })
    }

    /// Re-replication onto spare memory node `spare` after memory node `dead`'s
    /// failover (B.6.4 step 3 with "a spare" in place of the restarted node): every
    /// partition left with fewer copies than the run keeps is copied to the spare, one
    /// at a time, as [`Self::re_replicate`] copies them to a restarted node; the spare
    /// becomes each one's last backup (the run began at `run_start`).
    ///
    /// Errors: `spare` is not a spare (dead, or already holding copies) or has no image
    /// of a partition to copy; a drain did not finish within 10 s; a READ or WRITE of
    /// the copy failed; etcd failed.
    pub(crate) fn fill_spare(
        &self,
        dead: u32,
        spare: u32,
        run_start: Instant,
    ) -> anyhow::Result<Restart> {
        let ms = |t: Instant| t.duration_since(run_start).as_secs_f64() * 1e3;
        let began = Instant::now();
        let store = self.store.clone();
        store.epoch();
        let (view, _) = self.feed.snapshot();
        anyhow::ensure!(
            !view.dead.contains(&spare) && !store.in_use(spare),
            "memory node {spare} is not a spare: it is dead or already holds copies"
        );
        let replicas = store.replicas() as usize;
        let parts: Vec<u32> = (0..store.partitions())
            .filter(|&p| {
                let pv = &view.partitions[p as usize];
                pv.primary.is_some() && 1 + pv.backups.len() < replicas
            })
            .collect();
        for &p in &parts {
            anyhow::ensure!(
                store.image(spare, p).is_some(),
                "spare memory node {spare} hosts no image of partition {p}"
            );
        }
        let copies = self.copy_partitions(spare, &parts, run_start)?;
        Ok(Restart {
            memnode: spare,
            replaces: Some(dead),
            started_ms: ms(began),
            rejoined_ms: ms(began),
            partitions: copies,
        })
    }

    /// Copy each partition of `parts` to memory node `m`, one at a time: mark it
    /// migrating (commits touching it wait), drain, copy from its primary with bulk
    /// READs and WRITEs ([`txn::migrate::copy_image`]), and publish `m` as its last
    /// backup; partitions `m` already holds are skipped. Errors: as
    /// [`Self::re_replicate`].
    fn copy_partitions(
        &self,
        m: u32,
        parts: &[u32],
        run_start: Instant,
    ) -> anyhow::Result<Vec<Rereplication>> {
        let ms = |t: Instant| t.duration_since(run_start).as_secs_f64() * 1e3;
        let (ctx, store, feed) = (self.ctx.clone(), self.store.clone(), self.feed.clone());
        let mut copies = Vec::new();
        for &p in parts {
            let (view, _) = self.feed.snapshot();
            if view.holds(p, m) {
                continue;
            }
            let from = view.partitions[p as usize]
                .primary
                .with_context(|| format!("partition {p} has no live copy to copy from"))?;
            // (2) Migrating, and the barrier: attempts from before end first.
            let marked = view.start_migration(p, m);
            self.store_view(&marked)?;
            feed.publish_and_drain(marked.clone());
            let t_start = Instant::now();
            self.drain(
                crate::view_sync::DrainKind::Migrate { view: marked },
                &format!("the drain before copying partition {p}"),
            )?;
            let drained = Instant::now();
            let tables = block_on(&self.ctx, {
                let (ctx, store) = (ctx.clone(), store.clone());
                async move {
                    // (3) The copy, primary to the new image.
                    let src = store.image(from, p).context("no image of the primary")?;
                    let dst = store.image(m, p).context("no image on the new node")?;
                    let tables = txn::migrate::copy_image(
                        &ctx,
                        store.memnode(from)?,
                        &src,
                        store.memnode(m)?,
                        &dst,
                    )
                    .await
                    .with_context(|| format!("copying partition {p} to memory node {m}"))?;
                    Ok::<_, anyhow::Error>(tables)
                }
            })?;
            // (4) The new backup takes installs from the next view on.
            let done = self.feed.snapshot().0.end_migration(p);
            self.store_view(&done)?;
            let epoch = done.epoch;
            self.feed.publish(done);
            let finished = Instant::now();
            copies.push(Rereplication {
                partition: p,
                memnode: m,
                from,
                started_ms: ms(t_start),
                drained_ms: ms(drained),
                done_ms: ms(finished),
                bytes: tables.iter().map(|t| t.bytes).sum(),
                tables,
                epoch,
            });
        }
        Ok(copies)
    }
}

/// What the view manager's thread is asked to do.
enum Cmd {
    /// Memory node `m` was killed at `killed`: fail it over (the run began at `run`).
    Fail {
        m: u32,
        killed: Instant,
        run: Instant,
    },
    /// Memory node `m`'s new process answered at `started`: re-replicate onto it.
    Rejoin {
        m: u32,
        started: Instant,
        run: Instant,
    },
    /// Memory node `dead` failed over: re-replicate onto spare memory node `spare`.
    Spare { dead: u32, spare: u32, run: Instant },
}

/// What the view manager's thread answers to a request.
pub(crate) enum Answer {
    /// The failover, done.
    FailedOver(Box<Failover>),
    /// The re-replication, done.
    Restarted(Box<Restart>),
}

/// A [`ViewManager`] on a thread of its own, for a caller that must keep serving
/// something else meanwhile (`txn-bench --cnodes`: the coordinator processes' streams).
/// Each request is answered on [`ManagerThread::poll`].
pub(crate) struct ManagerThread {
    tx: std::sync::mpsc::Sender<Cmd>,
    rx: std::sync::mpsc::Receiver<anyhow::Result<Answer>>,
    busy: bool,
}

impl ManagerThread {
    /// Start the manager ([`ViewManager::new`], with `cnodes` following through etcd)
    /// on its own thread and wait until it is connected. Errors: as
    /// [`ViewManager::new`].
    pub(crate) fn start(
        fabric: Fabric,
        addrs: ClusterAddrs,
        feed: ViewFeed,
        etcd: Option<(String, String)>,
        cnodes: Vec<u16>,
    ) -> anyhow::Result<Self> {
        let (tx, cmds) = std::sync::mpsc::channel::<Cmd>();
        let (out, rx) = std::sync::mpsc::channel();
        let (ready_tx, ready) = std::sync::mpsc::channel::<anyhow::Result<()>>();
        std::thread::Builder::new()
            .name("view-manager".into())
            .spawn(move || {
                let mgr = match ViewManager::new(&fabric, &addrs, feed, etcd, cnodes) {
                    Ok(m) => m,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                for c in cmds {
                    let r = match c {
                        Cmd::Fail { m, killed, run } => mgr
                            .fail_over(m, killed, run)
                            .map(|f| Answer::FailedOver(Box::new(f))),
                        Cmd::Rejoin { m, started, run } => mgr
                            .re_replicate(m, started, run)
                            .map(|r| Answer::Restarted(Box::new(r))),
                        Cmd::Spare { dead, spare, run } => mgr
                            .fill_spare(dead, spare, run)
                            .map(|r| Answer::Restarted(Box::new(r))),
                    };
                    if out.send(r).is_err() {
                        return;
                    }
                }
            })?;
        match ready.recv_timeout(Duration::from_secs(60)) {
            Ok(Ok(())) => Ok(Self {
                tx,
                rx,
                busy: false,
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => anyhow::bail!("the view manager did not connect within 60 s"),
        }
    }

    /// Ask for memory node `m`'s failover (it was killed at `killed`; the run began at
    /// `run`).
    pub(crate) fn fail(&mut self, m: u32, killed: Instant, run: Instant) {
        self.busy = self.tx.send(Cmd::Fail { m, killed, run }).is_ok();
    }

    /// Ask for re-replication onto memory node `m`'s new process (answering since
    /// `started`; the run began at `run`).
    pub(crate) fn rejoin(&mut self, m: u32, started: Instant, run: Instant) {
        self.busy = self.tx.send(Cmd::Rejoin { m, started, run }).is_ok();
    }

    /// Ask for re-replication onto spare memory node `spare` after memory node
    /// `dead`'s failover (the run began at `run`).
    pub(crate) fn fill_spare(&mut self, dead: u32, spare: u32, run: Instant) {
        self.busy = self.tx.send(Cmd::Spare { dead, spare, run }).is_ok();
    }

    /// Whether a request is being worked on.
    pub(crate) fn busy(&self) -> bool {
        self.busy
    }

    /// The answer to the request in flight, if it is in (waiting up to `wait` for it).
    /// Errors: the request failed, or the thread is gone.
    pub(crate) fn poll(&mut self, wait: Duration) -> anyhow::Result<Option<Answer>> {
        if !self.busy {
            return Ok(None);
        }
        match self.rx.recv_timeout(wait) {
            Ok(r) => {
                self.busy = false;
                r.map(Some)
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Ok(None),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                anyhow::bail!("the view manager's thread is gone")
            }
        }
    }
}
