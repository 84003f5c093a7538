//! The compute node's side of the CVT store: one thread's one-sided access to the CVT
//! tables of every memory node (Motor 4.1; the memory nodes' CPUs take no part).
//!
//! Tables are partitioned across memory nodes by key ([`partition_of`]); every memory
//! node holds every table with the same geometry. A key's CVT is found through the
//! thread's CVT address cache ([`AddrCache`]: one READ of the CVT, the key checked in
//! it) or, on a miss or a stale entry, by READing its hash buckets.
//!
//! Operations and their order of one-sided verbs:
//! - [`CvtRemote::lookup`]: READ the CVT (cached address) or the buckets of its chain;
//! - [`CvtRemote::read_version`]: READ one version's record (anchors checked against the
//!   cell, Lotus 7.1);
//! - [`CvtRemote::lock`] / [`CvtRemote::unlock`]: CAS / WRITE of the header's lock word
//!   (OCC-CAS and MVCC);
//! - [`CvtRemote::install`]: WRITE the record into the victim cell's buffer and WRITE the
//!   cell, in one round (the two may land in either order: a reader catches the
//!   in-between state by the CVs of cell and record, Lotus 7.1);
//! - [`CvtRemote::create`]: an insert of a key with no CVT: the home bucket's insert guard
//!   word serializes inserters of its keys (CAS), a free slot of the chain is claimed
//!   (CAS of its state word, since chains of other home buckets may probe into it), the
//!   header written, the slot marked in use.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;

use rrpc::fabric::{MrDesc, RemoteAddr};
use rrpc::runtime::{join_all, OneSidedError, ThreadCtx};
use rrpc::NodeId;
use serde::{Deserialize, Serialize};
use tso::Timestamp;

use crate::commit_log::LogExport;
use crate::cvt::{
    cvt_bytes, decode_record, encode_record, Cell, Cvt, CvtError, Header, RecordError, CELL_BYTES,
    HEADER_BYTES, LOCK_OFFSET, SLOT_FREED, SLOT_IN_USE, STATE_OFFSET,
};
use crate::cvt_index::{search, AddrCache, CacheStats, Found, CVTS_PER_BUCKET};
use crate::cvt_store::CvtTableExport;
use crate::error::{AbortReason, TxnError};
use crate::store::hash_key;
pub use crate::view::{backup_partitions, replica_memnodes};
use crate::view::{View, ViewFeed};

/// A WRITE not yet sent: where, and its bytes.
pub type OwnedWrite = (RemoteAddr, Vec<u8>);

/// What a memory node exports under [`EXPORT_KEY`]: the partition it is the primary
/// of, its CVT tables, and the backup images it hosts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemnodeExport {
    /// This node's partition, `0..partitions` (the one it holds the primary image
    /// of; also its index among the memory nodes).
    pub partition: u32,
    /// Partitions (memory nodes) the tables are spread over.
    pub partitions: u32,
    /// Its tables, ids `0..n` in order.
    pub tables: Vec<CvtTableExport>,
    /// Copies of every partition (1 = no replication; the primary and `replicas - 1`
    /// backups, Motor 5.3). Every memory node of a cluster says the same.
    #[serde(default = "one_replica")]
    pub replicas: u32,
    /// The backup images it hosts, of the partitions [`backup_partitions`] names (a
    /// spare: an empty image of every partition).
    #[serde(default)]
    pub backups: Vec<BackupImage>,
    /// A spare memory node (the replication design's B.6.4 step 3: "a fresh memnode
    /// ... or a spare"): it holds no partition at start, `partition` is its index among
    /// the memory nodes (at least `partitions`), `tables` is empty and `backups` holds
    /// an empty image of every partition, which re-replication fills when a memory node
    /// dies.
    #[serde(default)]
    pub spare: bool,
    /// Its commit-log region ([`crate::commit_log`]); `None` from a memory node that
    /// keeps none.
    #[serde(default)]
    pub log: Option<LogExport>,
    /// Its undo-log region, where FORD's commit ([`crate::ford`]: occ-cas over
    /// replicas) writes the old records of each commit before installing; slots as in
    /// the commit-log region, larger. `None` from a memory node that keeps none (one
    /// without replication).
    #[serde(default)]
    pub undo: Option<LogExport>,
}

fn one_replica() -> u32 {
    1
}

/// A backup image of partition `partition` (Motor 5.3's backups): tables of the same
/// ids, record lengths, versions and bucket counts as the primary's, loaded with the
/// same data, in regions of its own.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupImage {
    /// The partition it copies.
    pub partition: u32,
    /// Its tables, ids `0..n` in order.
    pub tables: Vec<CvtTableExport>,
}

/// A backup copy of one partition as a compute node sees it.
#[derive(Clone, Debug)]
pub struct Backup {
    /// Index of the memory node that hosts it.
    pub memnode: u32,
    /// That memory node.
    pub node: NodeId,
    /// Its tables, ids `0..n`, same geometry as the primary's.
    pub tables: Rc<[CvtTableExport]>,
}

/// One table of one copy of a partition (derefs to its [`CvtTableExport`]); cheap to
/// clone, and valid after the copy's memory node was replaced (re-replication swaps a
/// restarted node's images in).
#[derive(Clone, Debug)]
pub struct TableRef {
    tables: Rc<[CvtTableExport]>,
    i: usize,
}

impl std::ops::Deref for TableRef {
    type Target = CvtTableExport;
    fn deref(&self) -> &CvtTableExport {
        &self.tables[self.i]
    }
}

/// The address in region `to` at the offset that `addr` has in region `from` (a
/// primary's address translated to a backup image of identical geometry).
pub fn mirror(from: &MrDesc, to: &MrDesc, addr: u64) -> RemoteAddr {
    to.at(addr - from.addr)
}

/// The export key a memory node publishes its [`MemnodeExport`] under.
pub const EXPORT_KEY: &str = "cvt";

/// The partition (memory node) that holds `(table, key)` among `partitions`: bits of the
/// key's hash that the bucket index does not use, so each node's buckets fill evenly.
pub fn partition_of(table: u32, key: u64, partitions: u32) -> u32 {
    ((hash_key(table, key) >> 40) % u64::from(partitions.max(1))) as u32
}

/// Where a key's CVT lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CvtLoc {
    /// Partition (index into the memory nodes).
    pub part: u32,
    /// Table id.
    pub table: u32,
    /// Address of the CVT in the index region.
    pub addr: u64,
}

/// How long an install or release that failed on a memory node waits for the view
/// manager to write that node off (drain it) before the failure counts.
pub const WRITE_OFF_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// How many times a torn CVT is READ again before the transaction aborts.
const TORN_RETRIES: usize = 3;

/// `[memnode][partition]`: each memory node's image of each partition it hosts.
type Images = Vec<Vec<Option<Rc<[CvtTableExport]>>>>;

/// One thread's access to the CVT store of all memory nodes. Shared by the thread's
/// coordinators through `&self`.
pub struct CvtRemote {
    ctx: Rc<ThreadCtx>,
    /// Memory node `m`'s node id.
    nodes: Rc<RefCell<Vec<NodeId>>>,
    /// Memory node `m`'s control-plane address (a node that restarts comes back
    /// there, under the same node id).
    addrs: Vec<SocketAddr>,
    /// `[memnode][partition]`: memory node `m`'s image of partition `p`, if it hosts one
    /// (replaced when `m` restarts and rejoins: [`View::incarnations`]).
    images: RefCell<Images>,
    /// The tables' shape (partition 0's primary at connect).
    shape: Vec<CvtTableExport>,
    /// Copies of each partition, as the memory nodes were started.
    replicas: u32,
    /// Partitions the tables are spread over (the memory nodes `0..partitions` hold
    /// their primaries at start; the ones after them are spares).
    partitions: u32,
    /// Each memory node's commit-log region, if it keeps one.
    logs: RefCell<Vec<Option<LogExport>>>,
    /// Each memory node's undo-log region, if it keeps one.
    undos: RefCell<Vec<Option<LogExport>>>,
    /// The view in use ([`crate::view`]): each partition's primary and backups.
    route: RefCell<Route>,
    /// Memory node `m`'s incarnation whose images this store holds (the view's
    /// [`View::incarnations`] when they were taken).
    incarnations: RefCell<Vec<u32>>,
    /// A rejoined memory node could not be connected to (see [`Self::refresh`]).
    rejoin_pending: std::cell::Cell<bool>,
    /// Where a new view comes from (none: the initial placement for good).
    feed: Option<ViewFeed>,
    cache: RefCell<AddrCache>,
}

/// The view a thread uses, and the feed version it came from.
struct Route {
    seen: u64,
    view: View,
    draining: Vec<u32>,
}

/// A memory node's export, checked against the placement.
struct Joined {
    /// Its index among the memory nodes (the partition it was started as the primary
    /// of; a spare's index is at least the partitions).
    me: usize,
    /// Partitions the tables are spread over.
    partitions: u32,
    replicas: u32,
    /// `(partition, tables)` of each image it hosts.
    images: Vec<(usize, Rc<[CvtTableExport]>)>,
    log: Option<LogExport>,
    undo: Option<LogExport>,
}

impl Joined {
    /// Parse and check the [`MemnodeExport`] of the node at `a`, one of `m` memory
    /// nodes (the partitions' own, then the spares). Errors: [`TxnError::Export`] when
    /// it is missing or does not fit.
    fn from_info(a: SocketAddr, info: &rrpc::node::NodeInfo, m: usize) -> Result<Self, TxnError> {
        let e: MemnodeExport = info
            .export(EXPORT_KEY)
            .map_err(|e| TxnError::Export(format!("memory node {a}: {e}")))?;
        let ps = e.partitions as usize;
        if ps == 0 || ps > m {
            return Err(TxnError::Export(format!(
                "memory node {a} spreads the tables over {} partitions, but {m} memory nodes \
                 were given",
                e.partitions
            )));
        }
        let want = if e.spare {
            if (e.partition as usize) < ps || e.partition as usize >= m || !e.tables.is_empty() {
                return Err(TxnError::Export(format!(
                    "memory node {a} is spare {} of {m} memory nodes with {} partitions: a \
                     spare's index is at least the partitions and it holds no primary",
                    e.partition, e.partitions
                )));
            }
            (0..e.partitions).collect()
        } else {
            if e.partition as usize >= ps {
                return Err(TxnError::Export(format!(
                    "memory node {a} is partition {} of {}",
                    e.partition, e.partitions
                )));
            }
            backup_partitions(e.partition, e.replicas, e.partitions)
        };
        let mut have: Vec<u32> = e.backups.iter().map(|b| b.partition).collect();
        have.sort_unstable();
        let mut want_sorted = want.clone();
        want_sorted.sort_unstable();
        if have != want_sorted {
            return Err(TxnError::Export(format!(
                "memory node {a} (partition {} of {}, {} replicas{}) hosts backups of \
                 partitions {have:?}, expected {want:?}",
                e.partition,
                e.partitions,
                e.replicas,
                if e.spare { ", spare" } else { "" }
            )));
        }
        if e.tables.iter().enumerate().any(|(i, t)| t.id as usize != i) {
            return Err(TxnError::Export(format!(
                "memory node {a}: table ids must be 0..n in order"
            )));
        }
        let me = e.partition as usize;
        let mut images = Vec::new();
        if !e.spare {
            images.push((me, Rc::from(e.tables)));
        }
        for b in e.backups {
            images.push((b.partition as usize, Rc::from(b.tables)));
        }
        Ok(Self {
            me,
            partitions: e.partitions,
            replicas: e.replicas,
            images,
            log: e.log,
            undo: e.undo,
        })
    }
}

/// Check memory node `mi`'s copy `ts` of partition `p` against the tables' `shape`
/// (ids, record lengths, versions) and another copy `first` of the same partition
/// (bucket counts too). Errors: [`TxnError::Export`].
fn check_geometry(
    shape: &[CvtTableExport],
    first: &[CvtTableExport],
    ts: &[CvtTableExport],
    mi: usize,
    p: usize,
) -> Result<(), TxnError> {
    let shape_of = |ts: &[CvtTableExport]| {
        ts.iter()
            .map(|t| (t.id, t.len, t.versions))
            .collect::<Vec<_>>()
    };
    let geometry = |ts: &[CvtTableExport]| {
        ts.iter()
            .map(|t| (t.id, t.len, t.versions, t.n_buckets))
            .collect::<Vec<_>>()
    };
    if shape_of(ts) != shape_of(shape) {
        return Err(TxnError::Export(
            "memory nodes disagree on the tables (ids, record lengths, versions)".into(),
        ));
    }
    if geometry(ts) != geometry(first) {
        return Err(TxnError::Export(format!(
            "memory node {mi}'s copy of partition {p} differs from another's geometry \
             (table ids, record lengths, versions, buckets)"
        )));
    }
    Ok(())
}

impl CvtRemote {
    /// Connect to the memory nodes at `addrs` (blocking; before coroutines run), in any
    /// order, and check that they are the partitions `0..n` of one set of tables, each
    /// memory node with the backup images the placement gives it. The address cache
    /// holds at most `cache_entries` CVT addresses.
    ///
    /// Errors: [`TxnError::Rpc`] when a node cannot be reached, [`TxnError::Export`] when
    /// the exports are missing or do not fit together.
    pub fn connect(
        ctx: Rc<ThreadCtx>,
        addrs: &[SocketAddr],
        cache_entries: usize,
    ) -> Result<Self, TxnError> {
        Self::connect_with(ctx, addrs, cache_entries, None)
    }

    /// [`Self::connect`], following the views of `feed` (failover, [`crate::view`]);
    /// `addrs[m]` must then be memory node `m`: the nodes the feed's view declares
    /// dead are skipped.
    ///
    /// Errors: as [`Self::connect`].
    pub fn connect_with(
        ctx: Rc<ThreadCtx>,
        addrs: &[SocketAddr],
        cache_entries: usize,
        feed: Option<ViewFeed>,
    ) -> Result<Self, TxnError> {
        if addrs.is_empty() {
            return Err(TxnError::Export("no memory node address given".into()));
        }
        let m = addrs.len();
        let mut nodes: Vec<Option<NodeId>> = vec![None; m];
        let mut images: Images = vec![Vec::new(); m];
        let (mut logs, mut undos) = (vec![None; m], vec![None; m]);
        let (mut replicas, mut partitions) = (None, None);
        // Memory nodes the feed's view declares dead may be unreachable.
        // With a feed, `addrs[m]` is memory node `m` (as txn-bench gives them), so the
        // ones its view declares dead are not even tried.
        let dead = feed.as_ref().map_or(Vec::new(), |f| f.snapshot().0.dead);
        for (i, a) in addrs.iter().enumerate() {
            if dead.contains(&(i as u32)) {
                continue;
            }
            let info = ctx.connect(*a)?;
            let j = Joined::from_info(*a, &info, m)?;
            let slot = &mut nodes[j.me];
            if slot.is_some() {
                return Err(TxnError::Export(format!(
                    "two memory nodes are partition {}",
                    j.me
                )));
            }
            *slot = Some(info.node);
            if *replicas.get_or_insert(j.replicas) != j.replicas {
                return Err(TxnError::Export(format!(
                    "memory node {a} keeps {} replicas, another {}",
                    j.replicas,
                    replicas.unwrap_or(0)
                )));
            }
            if *partitions.get_or_insert(j.partitions) != j.partitions {
                return Err(TxnError::Export(format!(
                    "memory node {a} spreads the tables over {} partitions, another over {}",
                    j.partitions,
                    partitions.unwrap_or(0)
                )));
            }
            let row = &mut images[j.me];
            for (p, ts) in j.images {
                if row.len() <= p {
                    row.resize(p + 1, None);
                }
                row[p] = Some(ts);
            }
            logs[j.me] = j.log;
            undos[j.me] = j.undo;
        }
        for (i, n) in nodes.iter().enumerate() {
            if n.is_none() && !dead.contains(&(i as u32)) {
                return Err(TxnError::Export(format!(
                    "memory node {i} did not answer, and the view does not declare it dead"
                )));
            }
        }
        // A dead memory node is never addressed (the view routes around it) until it
        // rejoins, when its id comes from its answer.
        let nodes: Vec<NodeId> = nodes
            .into_iter()
            .map(|n| n.unwrap_or(NodeId(u32::MAX)))
            .collect();
        let partitions = partitions.unwrap_or(m as u32);
        for row in &mut images {
            row.resize(partitions as usize, None);
        }
        let copy_of = |p: usize| images.iter().find_map(|row| row[p].clone());
        let shape: Vec<CvtTableExport> = (0..partitions as usize)
            .find_map(copy_of)
            .ok_or_else(|| TxnError::Export("no memory node answered".into()))?
            .to_vec();
        for (mi, row) in images.iter().enumerate() {
            for (p, img) in row.iter().enumerate() {
                let Some(ts) = img else { continue };
                let first = copy_of(p).expect("this copy at least");
                check_geometry(&shape, &first, ts, mi, p)?;
            }
        }
        let replicas = replicas.unwrap_or(1);
        let nodes = Rc::new(RefCell::new(nodes));
        if let (Some(f), true) = (&feed, replicas > 1) {
            // Operations on a dead memory node stop retrying once the view manager
            // writes it off (its drain started).
            let (f, ns) = (f.clone(), nodes.clone());
            crate::transient::set_written_off_check(Some(Rc::new(move |n: NodeId| {
                let Some(m) = ns.borrow().iter().position(|&x| x == n) else {
                    return false;
                };
                let (view, draining) = f.snapshot();
                view.dead.contains(&(m as u32)) || draining.contains(&(m as u32))
            })));
        }
        if let (Some(f), true) = (&feed, replicas > 1) {
            // Operations waiting on a memory node the view writes off fail at once.
            f.register(ctx.straws(), nodes.borrow().clone());
        }
        let view = match &feed {
            Some(f) => f.snapshot(),
            None => (View::initial(partitions, replicas), Vec::new()),
        };
        Ok(Self {
            ctx,
            nodes,
            addrs: addrs.to_vec(),
            images: RefCell::new(images),
            shape,
            replicas,
            partitions,
            logs: RefCell::new(logs),
            undos: RefCell::new(undos),
            incarnations: RefCell::new({
                let mut inc = view.0.incarnations.clone();
                inc.resize(m, 0);
                inc
            }),
            rejoin_pending: std::cell::Cell::new(false),
            route: RefCell::new(Route {
                seen: feed.as_ref().map_or(0, ViewFeed::version),
                view: view.0,
                draining: view.1,
            }),
            feed,
            cache: RefCell::new(AddrCache::new(cache_entries)),
        })
    }

    /// Take the feed's view if it changed (a new epoch empties the address cache: its
    /// addresses name the old primaries' regions).
    ///
    /// A memory node whose incarnation grew ([`View::rejoin`]: a restarted process) is
    /// connected to first and its images, log and undo regions taken from its export:
    /// a control-plane call and the QPs' setup, which block this thread once per
    /// rejoin. If that fails the view is not taken (tried again at the next check) and
    /// [`Self::check`] refuses every partition meanwhile.
    fn refresh(&self) {
        let Some(f) = &self.feed else { return };
        let v = f.version();
        if self.route.borrow().seen == v {
            return;
        }
        let (view, draining) = f.snapshot();
        let mut rejoined = true;
        for m in 0..self.addrs.len() as u32 {
            let have = self
                .incarnations
                .borrow()
                .get(m as usize)
                .copied()
                .unwrap_or(0);
            if view.incarnation(m) <= have || view.dead.contains(&m) {
                continue;
            }
            match self.rejoin(m) {
                Ok(()) => self.incarnations.borrow_mut()[m as usize] = view.incarnation(m),
                Err(e) => {
                    tracing::warn!(memnode = m, error = %e, "connecting to a rejoined memory node");
                    rejoined = false;
                }
            }
        }
        self.rejoin_pending.set(!rejoined);
        if !rejoined {
            return;
        }
        let mut r = self.route.borrow_mut();
        if view.epoch != r.view.epoch {
            self.cache.borrow_mut().clear();
        }
        *r = Route {
            seen: v,
            view,
            draining,
        };
    }

    /// Connect to memory node `m`'s new process (same address and node id, new
    /// regions) and take its images, log and undo regions.
    ///
    /// Errors: [`TxnError::Rpc`] (unreachable), [`TxnError::Export`] (an export that
    /// is not memory node `m`'s, or whose geometry differs).
    fn rejoin(&self, m: u32) -> Result<(), TxnError> {
        let a = self.addrs[m as usize];
        let info = self.ctx.reconnect(a)?;
        let j = Joined::from_info(a, &info, self.addrs.len())?;
        if j.me != m as usize || j.replicas != self.replicas || j.partitions != self.partitions {
            return Err(TxnError::Export(format!(
                "memory node {a} came back as partition {} with {} replicas; expected \
                 memory node {m} with {}",
                j.me, j.replicas, self.replicas
            )));
        }
        for (p, ts) in &j.images {
            let others = self.images.borrow();
            let first = (0..self.addrs.len())
                .filter(|&o| o != m as usize)
                .find_map(|o| others[o][*p].clone())
                .unwrap_or_else(|| ts.clone());
            check_geometry(&self.shape, &first, ts, m as usize, *p)?;
        }
        self.nodes.borrow_mut()[m as usize] = info.node;
        {
            let mut imgs = self.images.borrow_mut();
            for (p, ts) in j.images {
                if let Some(slot) = imgs[m as usize].get_mut(p) {
                    *slot = Some(ts);
                }
            }
        }
        self.logs.borrow_mut()[m as usize] = j.log;
        self.undos.borrow_mut()[m as usize] = j.undo;
        if let Some(f) = &self.feed {
            f.register(self.ctx.straws(), self.nodes.borrow().clone());
        }
        Ok(())
    }

    /// Whether a memory node that rejoined (a restarted process) could not be connected
    /// to yet; every partition is refused meanwhile ([`Self::check`]).
    pub fn rejoin_pending(&self) -> bool {
        self.rejoin_pending.get()
    }

    /// The feed of views this store follows, if any.
    pub fn feed(&self) -> Option<&ViewFeed> {
        self.feed.as_ref()
    }

    /// The epoch of the view in use.
    pub fn epoch(&self) -> u64 {
        self.refresh();
        self.route.borrow().view.epoch
    }

    /// Check that partition `part` can be used by an attempt now: not being drained
    /// (a memory node holding a copy of it died and the new view is not out:
    /// [`AbortReason::ReplicaFailed`]), not lost ([`TxnError::PartitionLost`]).
    ///
    /// Errors: as above.
    pub fn check(&self, part: u32) -> Result<(), TxnError> {
        self.refresh();
        if self.rejoin_pending.get() {
            return Err(TxnError::Abort(AbortReason::ReplicaFailed));
        }
        let m = self.primary(part)?;
        // Only a partition whose primary is being replaced waits: where the dead node
        // held a backup, installs count the live copies ([`Self::tolerate`]).
        if self.route.borrow().draining.contains(&m) {
            return Err(TxnError::Abort(AbortReason::ReplicaFailed));
        }
        // A partition being copied to a new backup takes no commits: one that landed
        // on the primary behind the copy would be missing from the new backup.
        let migrating = self.route.borrow().view.partitions[part as usize]
            .migrating
            .is_some();
        #[cfg(feature = "fault-injection")]
        let migrating = migrating && !crate::fault::migration_unblocked();
        if migrating {
            return Err(TxnError::Abort(AbortReason::Migrating));
        }
        Ok(())
    }

    /// Clear every lock word of memory node `m`'s image of partition `part` (before it
    /// serves as the primary: a backup's words hold nothing but FORD's invisible marks
    /// of commits that have ended, [`crate::ford`]); returns how many were set. Run
    /// after the drain barrier, so no commit writes them meanwhile.
    ///
    /// Errors: [`TxnError::Usage`] when `m` has no image of `part`; [`TxnError::Rpc`].
    pub async fn clear_lock_words(&self, m: u32, part: u32) -> Result<usize, TxnError> {
        let node = self.memnode(m)?;
        let tables = self
            .image(m, part)
            .ok_or_else(|| TxnError::Usage(format!("memory node {m} has no copy of {part}")))?;
        let mut cleared = 0;
        for t in tables.iter() {
            let cvt = t.cvt_bytes();
            let slots = t.n_buckets as usize * CVTS_PER_BUCKET;
            let per = ((1 << 20) / cvt).max(1);
            for start in (0..slots).step_by(per) {
                let n = per.min(slots - start);
                let img = self
                    .ctx
                    .read(node, t.index.at((start * cvt) as u64), n * cvt)
                    .await?;
                let held: Vec<(RemoteAddr, u64)> = img
                    .chunks_exact(cvt)
                    .enumerate()
                    .filter_map(|(i, c)| {
                        let w = u64::from_le_bytes(
                            c[LOCK_OFFSET..LOCK_OFFSET + 8].try_into().expect("8 bytes"),
                        );
                        (w != 0).then(|| (t.index.at(((start + i) * cvt + LOCK_OFFSET) as u64), w))
                    })
                    .collect();
                let done = join_all(held.iter().map(|&(at, w)| self.ctx.cas(node, at, w, 0))).await;
                for d in done {
                    d?;
                    cleared += 1;
                }
            }
        }
        Ok(cleared)
    }

    /// Whether memory node `node` is dead or being drained in the view in use: a failed
    /// operation on it costs its copy only (the live copies carry on).
    pub fn written_off(&self, node: NodeId) -> bool {
        self.refresh();
        let Some(m) = self.nodes.borrow().iter().position(|&n| n == node) else {
            return false;
        };
        let r = self.route.borrow();
        r.view.dead.contains(&(m as u32)) || r.draining.contains(&(m as u32))
    }

    /// Whether `e` is a memory node's death (gone, or a WR it failed) while the
    /// partitions are replicated and a view feed can replace it.
    fn memnode_failed(&self, e: &OneSidedError) -> Option<NodeId> {
        if self.feed.is_none() || self.replicas < 2 {
            return None;
        }
        match e {
            OneSidedError::PeerGone { node, .. } | OneSidedError::Completion { node, .. }
                if self.nodes.borrow().contains(node) =>
            {
                Some(*node)
            }
            _ => None,
        }
    }

    /// `e` as the attempt sees it: a memory node's failure under replication is an
    /// abort ([`AbortReason::ReplicaFailed`]: retried under the next view), anything
    /// else as it was.
    pub fn classify(&self, e: TxnError) -> TxnError {
        match &e {
            TxnError::Rpc(rrpc::runtime::RpcError::OneSided(o))
                if self.memnode_failed(o).is_some() =>
            {
                TxnError::Abort(AbortReason::ReplicaFailed)
            }
            _ => e,
        }
    }

    /// Judge the WRITEs (or releases) sent to the copies of some objects, `(memory
    /// node, result)` each: a failure of a memory node that the view writes off (it
    /// died; the manager drains it, waited for here for up to [`WRITE_OFF_WAIT`]) costs
    /// its copy only, since the live copies carry the data (the replication design's
    /// B.6.4: an install round finishes on the live copies). Any other failure is
    /// returned.
    ///
    /// Errors: the first failure that is not a written-off memory node's.
    pub async fn tolerate(
        &self,
        results: impl IntoIterator<Item = (NodeId, Result<(), OneSidedError>)>,
    ) -> Result<(), TxnError> {
        for (node, r) in results {
            let Err(e) = r else { continue };
            if self.memnode_failed(&e) != Some(node) || !self.await_written_off(node).await {
                return Err(e.into());
            }
        }
        Ok(())
    }

    /// Wait until memory node `node` is dead or drained in the view (for up to
    /// [`WRITE_OFF_WAIT`]); returns whether it is.
    async fn await_written_off(&self, node: NodeId) -> bool {
        let t0 = std::time::Instant::now();
        while !self.written_off(node) {
            if t0.elapsed() > WRITE_OFF_WAIT {
                return false;
            }
            self.ctx.sleep(std::time::Duration::from_micros(200)).await;
        }
        true
    }

    /// The memory node serving partition `part` as primary.
    ///
    /// Errors: [`TxnError::PartitionLost`]; [`TxnError::Usage`] beyond the partitions.
    fn primary(&self, part: u32) -> Result<u32, TxnError> {
        let r = self.route.borrow();
        let pv = r
            .view
            .partitions
            .get(part as usize)
            .ok_or_else(|| TxnError::Usage(format!("no partition {part}")))?;
        pv.primary
            .ok_or(TxnError::PartitionLost { partition: part })
    }

    /// The thread context.
    pub fn ctx(&self) -> &Rc<ThreadCtx> {
        &self.ctx
    }

    /// The tables (as partition 0 exports them; all partitions have the same shape).
    pub fn tables(&self) -> &[CvtTableExport] {
        &self.shape
    }

    /// Partitions the tables are spread over (the memory nodes without the spares).
    pub fn partitions(&self) -> u32 {
        self.partitions
    }

    /// Whether memory node `m` holds a copy of some partition, or is being filled with
    /// one, in the view in use (a spare not yet called on holds none).
    pub fn in_use(&self, m: u32) -> bool {
        let r = self.route.borrow();
        r.view
            .partitions
            .iter()
            .any(|pv| pv.primary == Some(m) || pv.backups.contains(&m) || pv.migrating == Some(m))
    }

    /// Copies of each partition the memory nodes were started with (1: no replication).
    pub fn replicas(&self) -> u32 {
        self.replicas
    }

    /// Partition `part`'s backups in the view in use, in promotion order (empty beyond
    /// the partitions).
    pub fn backups(&self, part: u32) -> Vec<Backup> {
        let r = self.route.borrow();
        let Some(pv) = r.view.partitions.get(part as usize) else {
            return Vec::new();
        };
        pv.backups
            .iter()
            .filter_map(|&m| {
                Some(Backup {
                    memnode: m,
                    node: self.nodes.borrow()[m as usize],
                    tables: self.image(m, part)?,
                })
            })
            .collect()
    }

    /// The memory nodes holding a copy of partition `part`, primary first.
    pub fn replica_memnodes(&self, part: u32) -> Vec<u32> {
        let r = self.route.borrow();
        r.view
            .partitions
            .get(part as usize)
            .map_or(Vec::new(), |pv| {
                pv.primary
                    .into_iter()
                    .chain(pv.backups.iter().copied())
                    .collect()
            })
    }

    /// Each copy of the index-region address `addr` of table `table` of partition
    /// `part` (a CVT or a word in it), primary first: `(memory node, address)`.
    ///
    /// Errors: [`TxnError::Usage`] for an unknown table or partition,
    /// [`TxnError::PartitionLost`].
    pub fn index_copies(
        &self,
        part: u32,
        table: u32,
        addr: u64,
    ) -> Result<Vec<(NodeId, RemoteAddr)>, TxnError> {
        let primary = self.primary_node(part)?;
        let t = self.table(part, table)?;
        let mut out = vec![(primary, t.index.at(addr - t.index.addr))];
        for b in self.backups(part) {
            let bt = b.tables.get(table as usize).ok_or_else(|| {
                TxnError::Usage(format!("no table {table} in a backup of {part}"))
            })?;
            out.push((b.node, mirror(&t.index, &bt.index, addr)));
        }
        Ok(out)
    }

    /// Memory node `m`'s image of partition `part`, if it hosts one (whatever its role).
    pub fn image(&self, m: u32, part: u32) -> Option<Rc<[CvtTableExport]>> {
        self.images
            .borrow()
            .get(m as usize)?
            .get(part as usize)?
            .clone()
    }

    /// Address cache counters.
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.borrow().stats()
    }

    /// Table `table` of partition `part`. Errors: [`TxnError::Usage`] for an unknown table.
    pub fn table(&self, part: u32, table: u32) -> Result<TableRef, TxnError> {
        let tables = self.part_tables(part)?;
        if table as usize >= tables.len() {
            return Err(TxnError::Usage(format!("no table {table}")));
        }
        Ok(TableRef {
            tables,
            i: table as usize,
        })
    }

    fn node(&self, loc: CvtLoc) -> Result<NodeId, TxnError> {
        self.primary_node(loc.part)
    }

    fn cvt_remote(&self, loc: CvtLoc) -> Result<RemoteAddr, TxnError> {
        let t = self.table(loc.part, loc.table)?;
        Ok(RemoteAddr {
            addr: loc.addr,
            rkey: t.index.rkey,
        })
    }

    /// The key's CVT: `None` when the table has no CVT for it (never inserted). A
    /// CVT with no visible version is still returned (an aborted insert or a delete
    /// leaves one).
    ///
    /// Errors: [`TxnError::Abort`] ([`AbortReason::TornRead`]) when the CVT stayed torn
    /// over a few READs; [`TxnError::Rpc`]; [`TxnError::Usage`] for an unknown table;
    /// [`TxnError::Export`] for a malformed bucket.
    pub async fn lookup(&self, table: u32, key: u64) -> Result<Option<(CvtLoc, Cvt)>, TxnError> {
        let part = partition_of(table, key, self.partitions());
        self.check(part)?;
        let t = self.table(part, table)?;
        let cached = self.cache.borrow_mut().get(table, key);
        if let Some(addr) = cached {
            let loc = CvtLoc { part, table, addr };
            let cvt = self.read_cvt(loc).await?;
            if self.cache.borrow_mut().confirm(table, key, &cvt) {
                return Ok(Some((loc, cvt)));
            }
        }
        let node = self.primary_node(part)?;
        let home = t.home_bucket(key);
        for probe in 0..t.n_buckets {
            let b = home + probe;
            let mut tries = 0;
            let found = loop {
                let img =
                    crate::transient::read(&self.ctx, node, t.bucket_addr(b), t.bucket_bytes())
                        .await?;
                match search(&img, t.versions, table, key) {
                    Ok(f) => break f,
                    Err(CvtError::TornCell { .. }) if tries < TORN_RETRIES => tries += 1,
                    Err(CvtError::TornCell { .. }) => {
                        return Err(TxnError::Abort(AbortReason::TornRead))
                    }
                    Err(e) => return Err(TxnError::Export(e.to_string())),
                }
            };
            match found {
                Found::At { slot, cvt } => {
                    let addr = t.cvt_addr(b, slot).addr;
                    self.cache.borrow_mut().insert(table, key, addr);
                    return Ok(Some((CvtLoc { part, table, addr }, cvt)));
                }
                Found::Absent { .. } => return Ok(None),
                Found::Next => {}
            }
        }
        Ok(None)
    }

    /// The cached location of `(table, key)`'s CVT, without a READ (`None` on a miss).
    /// The caller must check the key in what it then reads there.
    pub fn cached(&self, table: u32, key: u64) -> Option<CvtLoc> {
        let part = partition_of(table, key, self.partitions());
        // A partition being failed over has no usable address (the caller's lookup
        // then aborts).
        self.check(part).ok()?;
        let addr = self.cache.borrow_mut().get(table, key)?;
        Some(CvtLoc { part, table, addr })
    }

    /// Forget the cached location of `(table, key)` (it held another key's CVT).
    pub fn forget(&self, table: u32, key: u64) {
        self.cache.borrow_mut().remove(table, key);
    }

    /// READ the CVT at `loc` again. Errors: as [`Self::lookup`].
    pub async fn read_cvt(&self, loc: CvtLoc) -> Result<Cvt, TxnError> {
        let t = self.table(loc.part, loc.table)?;
        let remote = self.cvt_remote(loc)?;
        self.read_cvt_at(self.node(loc)?, remote, t.cvt_bytes())
            .await
    }

    /// READ and decode the CVT of `bytes` at `remote` on `node`, again while it is torn
    /// (up to [`TORN_RETRIES`] times). Errors: as [`Self::lookup`].
    async fn read_cvt_at(
        &self,
        node: NodeId,
        remote: RemoteAddr,
        bytes: usize,
    ) -> Result<Cvt, TxnError> {
        for _ in 0..=TORN_RETRIES {
            let img = crate::transient::read(&self.ctx, node, remote, bytes).await?;
            match Cvt::decode(&img) {
                Ok(c) => return Ok(c),
                Err(CvtError::TornCell { .. }) => continue,
                Err(e) => return Err(TxnError::Export(e.to_string())),
            }
        }
        Err(TxnError::Abort(AbortReason::TornRead))
    }

    /// One of partition `part`'s backups in the view in use for a read that offloads
    /// its primary (FORD's backup-enabled read, [`crate::ford`]): the `pick % n`-th of
    /// its `n` backups, as a memory-node index; `None` when it has none.
    pub fn pick_backup(&self, part: u32, pick: u64) -> Option<u32> {
        self.refresh();
        let r = self.route.borrow();
        let b = &r.view.partitions.get(part as usize)?.backups;
        (!b.is_empty()).then(|| b[(pick % b.len() as u64) as usize])
    }

    /// Table `table` of memory node `m`'s copy of partition `part`, with the primary's
    /// table for translating addresses. Errors: [`AbortReason::ReplicaFailed`] when the
    /// view in use no longer names `m` as a copy of `part` (it died, the view moved
    /// on); as [`Self::check`].
    fn copy_table(&self, part: u32, table: u32, m: u32) -> Result<(TableRef, TableRef), TxnError> {
        self.check(part)?;
        if !self.route.borrow().view.holds(part, m) {
            return Err(TxnError::Abort(AbortReason::ReplicaFailed));
        }
        let primary = self.table(part, table)?;
        let tables = self
            .image(m, part)
            .ok_or_else(|| TxnError::Usage(format!("memory node {m} has no copy of {part}")))?;
        if table as usize >= tables.len() {
            return Err(TxnError::Usage(format!("no table {table}")));
        }
        Ok((
            primary,
            TableRef {
                tables,
                i: table as usize,
            },
        ))
    }

    /// READ the CVT at `loc` (a primary's address) from memory node `m`'s copy of its
    /// partition: the same offset in that copy's index region (copies have one
    /// geometry). The cells read name records in that copy's value region
    /// ([`Self::read_version_on`]).
    ///
    /// Errors: [`AbortReason::ReplicaFailed`] when `m` no longer holds a copy in the
    /// view in use; as [`Self::lookup`].
    pub async fn read_cvt_on(&self, loc: CvtLoc, m: u32) -> Result<Cvt, TxnError> {
        let (primary, copy) = self.copy_table(loc.part, loc.table, m)?;
        let remote = mirror(&primary.index, &copy.index, loc.addr);
        self.read_cvt_at(self.memnode(m)?, remote, copy.cvt_bytes())
            .await
    }

    /// [`Self::read_version`] of a `cell` read from memory node `m`'s copy of `loc`'s
    /// CVT ([`Self::read_cvt_on`]): its record in that copy's value region.
    ///
    /// Errors: as [`Self::read_cvt_on`].
    pub async fn read_version_on(
        &self,
        loc: CvtLoc,
        m: u32,
        cell: &Cell,
    ) -> Result<Result<Vec<u8>, RecordError>, TxnError> {
        let (_, copy) = self.copy_table(loc.part, loc.table, m)?;
        let remote = RemoteAddr {
            addr: cell.addr,
            rkey: copy.values.rkey,
        };
        let img = crate::transient::read(
            &self.ctx,
            self.memnode(m)?,
            remote,
            crate::cvt::record_bytes(copy.len),
        )
        .await?;
        Ok(decode_record(&img, copy.len, cell.cv))
    }

    /// READ the CVT of `(table, key)` again: at `loc` when the key had one, else by
    /// searching its bucket chain (`None` while it still has none). Errors: as
    /// [`Self::lookup`].
    pub async fn reread(
        &self,
        table: u32,
        key: u64,
        loc: Option<CvtLoc>,
    ) -> Result<Option<Cvt>, TxnError> {
        match loc {
            Some(loc) => self.read_cvt(loc).await.map(Some),
            None => Ok(self.lookup(table, key).await?.map(|(_, cvt)| cvt)),
        }
    }

    /// READ the record of `cell` (a cell of the CVT at `loc`) and check its anchors against
    /// the cell. The inner `Err` says the record was torn or is another version's (GC
    /// reused the buffer): the caller aborts or reads again.
    ///
    /// Errors: [`TxnError::Rpc`], [`TxnError::Usage`].
    pub async fn read_version(
        &self,
        loc: CvtLoc,
        cell: &Cell,
    ) -> Result<Result<Vec<u8>, RecordError>, TxnError> {
        let t = self.table(loc.part, loc.table)?;
        let remote = RemoteAddr {
            addr: cell.addr,
            rkey: t.values.rkey,
        };
        let img = crate::transient::read(
            &self.ctx,
            self.node(loc)?,
            remote,
            crate::cvt::record_bytes(t.len),
        )
        .await?;
        Ok(decode_record(&img, t.len, cell.cv))
    }

    /// CAS the lock word of the CVT at `loc` from `expect` to `new`; returns the word
    /// before (the CAS took effect exactly when it equals `expect`). Errors:
    /// [`TxnError::Rpc`].
    pub async fn lock(&self, loc: CvtLoc, expect: u64, new: u64) -> Result<u64, TxnError> {
        let at = self.cvt_remote(loc)?.offset(LOCK_OFFSET as u64);
        Ok(crate::transient::cas_owned(&self.ctx, self.node(loc)?, at, expect, new).await?)
    }

    /// The node and remote address of the lock word of the CVT at `loc` (for a release
    /// that must outlive its transaction). Errors: [`TxnError::Usage`].
    pub fn lock_target(&self, loc: CvtLoc) -> Result<(NodeId, RemoteAddr), TxnError> {
        Ok((
            self.node(loc)?,
            self.cvt_remote(loc)?.offset(LOCK_OFFSET as u64),
        ))
    }

    /// Release the lock word of the CVT at `loc` that holder `id` took: CAS from `id`
    /// to 0 (free), so that a holder whose lock recovery already released (it was
    /// presumed dead) cannot free another holder's lock. Returns whether the word held
    /// `id`. Errors: [`TxnError::Rpc`].
    pub async fn unlock(&self, loc: CvtLoc, id: u64) -> Result<bool, TxnError> {
        let at = self.cvt_remote(loc)?.offset(LOCK_OFFSET as u64);
        let node = self.node(loc)?;
        match crate::transient::cas_owned(&self.ctx, node, at, id, 0).await {
            Ok(prev) => Ok(prev == id),
            // A dead primary's lock words died with it.
            Err(e) => self.tolerate([(node, Err(e))]).await.map(|()| false),
        }
    }

    /// The memory node serving partition `part` as primary in the view in use.
    ///
    /// Errors: [`TxnError::Usage`] beyond the partitions; [`TxnError::PartitionLost`].
    pub fn primary_node(&self, part: u32) -> Result<NodeId, TxnError> {
        Ok(self.nodes.borrow()[self.primary(part)? as usize])
    }

    /// How many memory nodes the store reaches, spares included.
    pub fn memnode_count(&self) -> u32 {
        self.nodes.borrow().len() as u32
    }

    /// Memory node `m` (its index among the memory nodes, which is the partition it
    /// was started as the primary of). Errors: [`TxnError::Usage`] beyond them.
    pub fn memnode(&self, m: u32) -> Result<NodeId, TxnError> {
        self.nodes
            .borrow()
            .get(m as usize)
            .copied()
            .ok_or_else(|| TxnError::Usage(format!("no memory node {m}")))
    }

    /// Memory node `m`'s commit-log region, `None` when it keeps none.
    pub fn log(&self, m: u32) -> Option<LogExport> {
        self.logs.borrow().get(m as usize)?.clone()
    }

    /// Memory node `m`'s undo-log region ([`crate::ford`]), `None` when it keeps none.
    pub fn undo(&self, m: u32) -> Option<LogExport> {
        self.undos.borrow().get(m as usize)?.clone()
    }

    /// The tables of partition `part`'s primary in the view in use. Errors:
    /// [`TxnError::Usage`] beyond the partitions; [`TxnError::PartitionLost`].
    pub fn part_tables(&self, part: u32) -> Result<Rc<[CvtTableExport]>, TxnError> {
        let m = self.primary(part)?;
        self.image(m, part)
            .ok_or_else(|| TxnError::Export(format!("memory node {m} has no copy of {part}")))
    }

    /// Install `version` in the CVT at `loc` whose current content is `cvt` (read under
    /// its lock): the victim cell ([`Cvt::victim`], Motor 4.3's coordinator-active GC)
    /// gets the version, `value` (`None`: a tombstone, the key deleted). WRITEs the record
    /// and the cell in one round. `cvt` is updated to what was written.
    ///
    /// The caller holds the CVT's lock (a CVT lock word or the Takeout Lock of the key).
    ///
    /// Errors: [`TxnError::Usage`] for a value of the wrong size; [`TxnError::Rpc`].
    pub async fn install(
        &self,
        loc: CvtLoc,
        cvt: &mut Cvt,
        version: Timestamp,
        value: Option<&[u8]>,
    ) -> Result<(), TxnError> {
        let victim = cvt.victim();
        self.install_in(loc, cvt, victim, version, value).await
    }

    /// [`Self::install`] into cell `victim` (chosen before, with [`Cvt::victim`], so that
    /// a commit log could name it), on every copy of the partition at once (Motor's
    /// one-round commit, 5.3): it returns once every copy ACKed both WRITEs.
    ///
    /// Errors: as [`Self::install`]; [`TxnError::Usage`] for a cell beyond the CVT's.
    pub async fn install_in(
        &self,
        loc: CvtLoc,
        cvt: &mut Cvt,
        victim: usize,
        version: Timestamp,
        value: Option<&[u8]>,
    ) -> Result<(), TxnError> {
        let copies = self.install_writes(loc, cvt, victim, version, value)?;
        // All WRITEs in one round: a reader that sees the new cell before the record has
        // landed (or the old cell with the new record) finds the CVs differ and does not
        // use the record (`decode_record`'s mismatch), which is what the CVs are for.
        let sent = rrpc::runtime::join_all(copies.iter().flat_map(|(node, ws)| {
            let node = *node;
            ws.iter().map(move |(at, d)| async move {
                (node, crate::transient::write(&self.ctx, node, *at, d).await)
            })
        }))
        .await;
        self.tolerate(sent).await
    }

    /// The WRITEs of [`Self::install_in`] per copy of the partition, primary first:
    /// the memory node, then the record and the cell (each backup's cell names the
    /// record buffer in its own value region); `cvt` updated as installed on the
    /// primary; nothing is sent.
    ///
    /// Errors: [`TxnError::Usage`] for a victim outside the CVT or a value of the wrong
    /// length; [`TxnError::Export`] for an unknown table.
    pub fn install_writes(
        &self,
        loc: CvtLoc,
        cvt: &mut Cvt,
        victim: usize,
        version: Timestamp,
        value: Option<&[u8]>,
    ) -> Result<Vec<(NodeId, [OwnedWrite; 2])>, TxnError> {
        if victim >= cvt.cells.len() {
            return Err(TxnError::Usage(format!(
                "cell {victim} of a CVT of {}",
                cvt.cells.len()
            )));
        }
        let t = self.table(loc.part, loc.table)?;
        let payload = match value {
            Some(v) if v.len() != t.len => {
                return Err(TxnError::Usage(format!(
                    "value of {} bytes, table {} holds {}",
                    v.len(),
                    loc.table,
                    t.len
                )))
            }
            Some(v) => v.to_vec(),
            None => vec![0; t.len],
        };
        let slot_index = (loc.addr - t.index.addr) / t.cvt_bytes() as u64;
        let (b, slot) = (
            slot_index / CVTS_PER_BUCKET as u64,
            (slot_index % CVTS_PER_BUCKET as u64) as usize,
        );
        let rec = t.record_addr(b, slot, victim);
        let cell = cvt.install(victim, version, rec.addr, value.is_none());
        let node = self.node(loc)?;
        let at = self
            .cvt_remote(loc)?
            .offset((HEADER_BYTES + victim * CELL_BYTES) as u64);
        let record = encode_record(&payload, cell.cv);
        #[allow(unused_mut)]
        let mut backups = self.backups(loc.part);
        #[cfg(feature = "fault-injection")]
        if crate::fault::skipping_backup_install(!backups.is_empty()) {
            backups.clear();
        }
        let mut out = Vec::with_capacity(1 + backups.len());
        for bk in backups {
            let bt = bk
                .tables
                .get(loc.table as usize)
                .ok_or_else(|| TxnError::Export(format!("no table {} in a backup", loc.table)))?;
            let brec = mirror(&t.values, &bt.values, rec.addr);
            let bcell = Cell {
                addr: brec.addr,
                ..cell
            };
            let bat = mirror(&t.index, &bt.index, at.addr);
            out.push((
                bk.node,
                [(brec, record.clone()), (bat, bcell.encode().to_vec())],
            ));
        }
        out.insert(0, (node, [(rec, record), (at, cell.encode().to_vec())]));
        Ok(out)
    }

    /// Lotus's write-visible step (Lotus 5.1, C3) for cell `victim` of the CVT at `loc`:
    /// per copy of the partition, primary first, the 8-byte WRITE of `version` into the
    /// cell's version field ([`crate::cvt::CELL_VERSION_OFFSET`]); nothing is sent. The
    /// cell's CVs stay, so a reader that READs the cell while it changes sees either the
    /// INVISIBLE or the final version, never a torn cell.
    ///
    /// Errors: [`TxnError::Usage`] for a cell beyond the table's versions;
    /// [`TxnError::Export`] for an unknown table.
    pub fn publish_writes(
        &self,
        loc: CvtLoc,
        victim: usize,
        version: Timestamp,
    ) -> Result<Vec<(NodeId, RemoteAddr, [u8; 8])>, TxnError> {
        let t = self.table(loc.part, loc.table)?;
        if victim >= t.versions {
            return Err(TxnError::Usage(format!(
                "cell {victim} of a CVT of {}",
                t.versions
            )));
        }
        let at = self
            .cvt_remote(loc)?
            .offset((HEADER_BYTES + victim * CELL_BYTES + crate::cvt::CELL_VERSION_OFFSET) as u64);
        let word = version.get().to_le_bytes();
        let mut out = vec![(self.node(loc)?, at, word)];
        for bk in self.backups(loc.part) {
            let bt = bk
                .tables
                .get(loc.table as usize)
                .ok_or_else(|| TxnError::Export(format!("no table {} in a backup", loc.table)))?;
            out.push((bk.node, mirror(&t.index, &bt.index, at.addr), word));
        }
        Ok(out)
    }

    /// Create a CVT for `(table, key)`, which has none, locked with `lock_word` (0 for
    /// a protocol that locks elsewhere) and with no version; returns it. Inserters of
    /// the keys of one home bucket take turns on the bucket's insert guard word
    /// ([`CvtTableExport::guard_addr`]; `guard` is this inserter's nonzero id); an insert that finds it taken, or
    /// finds that the key got a CVT meanwhile, aborts ([`AbortReason::InsertRace`]) and
    /// the caller retries.
    ///
    /// Errors: [`TxnError::Abort`], [`TxnError::TableFull`] when the chain has no free
    /// slot, [`TxnError::Rpc`], [`TxnError::Usage`].
    pub async fn create(
        &self,
        table: u32,
        key: u64,
        lock_word: u64,
        guard: u64,
    ) -> Result<(CvtLoc, Cvt), TxnError> {
        let part = partition_of(table, key, self.partitions());
        self.check(part)?;
        let t = self.table(part, table)?;
        let node = self.primary_node(part)?;
        let guard_at = t.guard_addr(t.home_bucket(key));
        let prev = crate::transient::cas_owned(&self.ctx, node, guard_at, 0, guard).await?;
        if prev != 0 {
            return Err(TxnError::Abort(AbortReason::InsertRace));
        }
        let r = self
            .create_guarded(&t, node, part, key, lock_word, guard)
            .await;
        // The guard is released on every path out (if this CAS fails too, the memory
        // node is unreachable and the guard stays held: inserts into this bucket then
        // abort with `InsertRace` until it comes back; there is no lease).
        let unguard = crate::transient::cas_owned(&self.ctx, node, guard_at, guard, 0).await;
        let made = r?;
        unguard?;
        Ok(made)
    }

    async fn create_guarded(
        &self,
        t: &CvtTableExport,
        node: NodeId,
        part: u32,
        key: u64,
        lock_word: u64,
        guard: u64,
    ) -> Result<(CvtLoc, Cvt), TxnError> {
        let home = t.home_bucket(key);
        for probe in 0..t.n_buckets {
            let b = home + probe;
            let img =
                crate::transient::read(&self.ctx, node, t.bucket_addr(b), t.bucket_bytes()).await?;
            let free = match search(&img, t.versions, t.id, key) {
                Ok(Found::At { .. }) => return Err(TxnError::Abort(AbortReason::InsertRace)),
                Ok(Found::Next) => continue,
                Ok(Found::Absent { free }) => free,
                Err(CvtError::TornCell { .. }) => {
                    return Err(TxnError::Abort(AbortReason::TornRead))
                }
                Err(e) => return Err(TxnError::Export(e.to_string())),
            };
            // Claim the slot, with this inserter's id in the state word so that a
            // recovery finds the claim if the inserter dies before publishing it
            // (`crate::recovery`): another home bucket's insert may be after it too.
            let at = t.cvt_addr(b, free);
            let state = at.offset(STATE_OFFSET as u64);
            let was = crate::cvt_index::slot_state(&img, t.versions, free);
            let claim = crate::cvt::claim_word(guard);
            // The claim word is unique to this attempt, so a retried CAS can tell its
            // own earlier success (`cas_owned`).
            if crate::transient::cas_owned(&self.ctx, node, state, was, claim).await? != was {
                return Err(TxnError::Abort(AbortReason::InsertRace));
            }
            match self
                .publish_claimed(t, node, part, key, lock_word, at)
                .await
            {
                Ok(made) => return Ok(made),
                Err(e) => {
                    // Give the slot back if the primary answers and every backup
                    // takes the mark or has been written off (`free_claim`); if not,
                    // the claim stays (one slot lost, which searches pass over).
                    let _ = self.free_claim(part, t.id, at.addr, claim).await;
                    return Err(e);
                }
            }
        }
        Err(TxnError::TableFull { table: t.id })
    }

    /// Write the claimed slot at `at` (its header, and the whole CVT on every backup),
    /// then publish it on the primary ([`SLOT_IN_USE`]): [`Self::create`]'s steps after
    /// its claim. Errors: as [`Self::create`].
    async fn publish_claimed(
        &self,
        t: &CvtTableExport,
        node: NodeId,
        part: u32,
        key: u64,
        lock_word: u64,
        at: RemoteAddr,
    ) -> Result<(CvtLoc, Cvt), TxnError> {
        let state = at.offset(STATE_OFFSET as u64);
        let cvt = Cvt::new(
            Header {
                table: t.id,
                len: t.len as u32,
                key,
                lock: lock_word,
                state: SLOT_IN_USE,
            },
            t.versions,
        );
        let bytes = cvt.encode();
        // The backups' copies of the slot: the whole CVT, unlocked (lock words
        // matter at the primary only), before the primary publishes it, so that no
        // backup lags a slot a search can find.
        let mut unlocked = cvt.clone();
        unlocked.header.lock = 0;
        let copy = unlocked.encode();
        let copies = self.index_copies(part, t.id, at.addr)?;
        let copy = &copy;
        let backups = join_all(copies[1..].iter().map(|&(n, a)| async move {
            let r = crate::transient::write(&self.ctx, n, a, &copy[..cvt_bytes(t.versions)]).await;
            (n, r)
        }));
        // Header words (key, lock) and the (empty) cells first, the state last: a
        // search sees the slot as in use only with its key in place.
        let primary = async {
            crate::transient::write(&self.ctx, node, at, &bytes[..STATE_OFFSET]).await?;
            crate::transient::write(
                &self.ctx,
                node,
                at.offset(HEADER_BYTES as u64),
                &bytes[HEADER_BYTES..cvt_bytes(t.versions)],
            )
            .await
        };
        let (p, bs) = rrpc::runtime::join(primary, backups).await;
        p?;
        self.tolerate(bs).await?;
        crate::transient::write(&self.ctx, node, state, &SLOT_IN_USE.to_le_bytes()).await?;
        self.cache.borrow_mut().insert(t.id, key, at.addr);
        Ok((
            CvtLoc {
                part,
                table: t.id,
                addr: at.addr,
            },
            cvt,
        ))
    }

    /// Free the slot at `slot` (table `table` of partition `part`) if its state word still
    /// holds `claim` (a [`crate::cvt::claim_word`]): the backups' copies are marked
    /// [`SLOT_FREED`] first, then the primary's claim is swapped for it; returns whether
    /// the slot was freed. Only the claim's owner (or a recovery of its dead life) calls
    /// this, so nobody else touches the slot in between, on any replica: a backup never
    /// keeps a copy of a slot its primary has given back, and a slot published meanwhile
    /// (the claim gone) is left alone.
    ///
    /// Errors: [`TxnError::Rpc`] when the primary fails the READ or the CAS, or a backup
    /// fails its WRITE and is not written off in the view ([`Self::tolerate`]);
    /// [`TxnError::Export`] for an unknown table.
    pub async fn free_claim(
        &self,
        part: u32,
        table: u32,
        slot: u64,
        claim: u64,
    ) -> Result<bool, TxnError> {
        const FREED: [u8; 8] = SLOT_FREED.to_le_bytes();
        let copies = self.index_copies(part, table, slot)?;
        let (node, at) = copies[0];
        let state = at.offset(STATE_OFFSET as u64);
        let now = self.ctx.read(node, state, 8).await?;
        if u64::from_le_bytes(now[..8].try_into().expect("8 bytes")) != claim {
            return Ok(false);
        }
        let backups = join_all(copies[1..].iter().map(|&(n, a)| async move {
            let r = self
                .ctx
                .write(n, a.offset(STATE_OFFSET as u64), &FREED)
                .await;
            (n, r)
        }))
        .await;
        // A backup that failed the WRITE must be out of the view before the primary gives
        // the slot back (`tolerate`): else it would keep a copy of a key its primary no
        // longer has, which a later insert of that key could put in another slot.
        self.tolerate(backups).await?;
        Ok(self.ctx.cas(node, state, claim, SLOT_FREED).await? == claim)
    }
}
