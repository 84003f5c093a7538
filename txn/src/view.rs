//! The replica view (the replication design's B.6.2, after Motor 5.3): which memory node
//! holds the primary and which the backups of each partition, under an epoch that only
//! grows; and the feed through which a view manager hands a new view, and a drain
//! barrier before it, to the coordinators of a process.
//!
//! A view changes in two steps when memory node `m` dies ([`View::fail`]): first the
//! **drain**, which the manager starts with [`ViewFeed::start_drain`]: from then on an
//! attempt that begins and touches a partition `m` was the primary of aborts
//! ([`crate::error::AbortReason::ReplicaFailed`]; only partitions whose primary `m`
//! held: where it held a backup, installs count the live copies), and attempts already
//! running finish or abort (an install whose copy on `m` fails counts the live copies
//! only; operations waiting on `m` fail at once, the node declared dead); the
//! manager waits with [`ViewFeed::drained`] until none of them is left. Then the new
//! view, with `m` gone and the first live backup of each partition `m` was the primary
//! of promoted, is published ([`ViewFeed::publish`]) under epoch + 1. So nobody locks a
//! promoted primary before every commit that wrote its partition under the old view has
//! landed on it ("the new primary is not visible to coordinators until the updates are
//! installed into alive replicas", Motor 5.3).
//!
//! A dead node that comes back empty is filled by **re-replication** (B.6.4 step 3):
//! [`View::rejoin`] names its new incarnation (compute nodes connect to the new process
//! as they take that view), then per partition [`View::start_migration`] marks the
//! partition migrating, published with a drain barrier ([`ViewFeed::publish_and_drain`]):
//! attempts touching it abort until [`View::end_migration`] makes the node its last
//! backup, after the manager copied the primary's image onto it
//! ([`crate::migrate::copy_image`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use rrpc::straw::Straws;
use rrpc::NodeId;

use serde::{Deserialize, Serialize};

/// The memory nodes holding partition `partition`'s copies, primary first: memory
/// node `partition`, then the next `replicas - 1` (mod `memnodes`). The placement of
/// the replication design (1 primary and f backups on other nodes; Motor 5.3, FORD).
pub fn replica_memnodes(partition: u32, replicas: u32, memnodes: u32) -> Vec<u32> {
    let m = memnodes.max(1);
    (0..replicas.clamp(1, m))
        .map(|k| (partition + k) % m)
        .collect()
}

/// The partitions memory node `memnode` holds a backup image of (the inverse of
/// [`replica_memnodes`]), nearest first.
pub fn backup_partitions(memnode: u32, replicas: u32, memnodes: u32) -> Vec<u32> {
    let m = memnodes.max(1);
    (1..replicas.clamp(1, m))
        .map(|k| (memnode + m - k) % m)
        .collect()
}

/// One partition's copies.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionView {
    /// The memory node holding the primary (`None`: every copy is gone).
    pub primary: Option<u32>,
    /// The memory nodes holding backups, in promotion order.
    pub backups: Vec<u32>,
    /// The memory node being filled with a copy of this partition by re-replication
    /// ([`View::start_migration`]): commits touching the partition wait (abort as
    /// [`crate::error::AbortReason::Migrating`] and retry) until it is a backup.
    #[serde(default)]
    pub migrating: Option<u32>,
}

/// Which memory nodes hold each partition's copies, under `epoch`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct View {
    /// Grows by one with every change.
    pub epoch: u64,
    /// `[partition]`.
    pub partitions: Vec<PartitionView>,
    /// Memory nodes declared dead (never written again under this view).
    pub dead: Vec<u32>,
    /// `[memnode]`: how many times each memory node rejoined after a restart
    /// ([`View::rejoin`]); a compute node that sees it grow connects to the new process
    /// and takes its regions.
    #[serde(default)]
    pub incarnations: Vec<u32>,
}

impl View {
    /// The placement at start ([`replica_memnodes`]): partition `p`'s primary on memory
    /// node `p`, its backups on the next `replicas - 1`; epoch 1.
    pub fn initial(memnodes: u32, replicas: u32) -> Self {
        let partitions = (0..memnodes)
            .map(|p| {
                let r = replica_memnodes(p, replicas, memnodes);
                PartitionView {
                    primary: r.first().copied(),
                    backups: r[1..].to_vec(),
                    migrating: None,
                }
            })
            .collect();
        Self {
            epoch: 1,
            partitions,
            dead: Vec::new(),
            incarnations: vec![0; memnodes as usize],
        }
    }

    /// Memory node `m`'s incarnation (0 until it first rejoins).
    pub fn incarnation(&self, m: u32) -> u32 {
        self.incarnations.get(m as usize).copied().unwrap_or(0)
    }

    /// The view after dead memory node `m` came back as a new, empty process
    /// (re-replication, the replication design's B.6.4 step 3): no longer dead, its
    /// incarnation + 1, holding no copy yet (epoch + 1).
    pub fn rejoin(&self, m: u32) -> View {
        let mut next = self.clone();
        next.epoch += 1;
        next.dead.retain(|&d| d != m);
        if next.incarnations.len() <= m as usize {
            next.incarnations.resize(m as usize + 1, 0);
        }
        next.incarnations[m as usize] += 1;
        for pv in &mut next.partitions {
            if pv.migrating == Some(m) {
                pv.migrating = None;
            }
        }
        next
    }

    /// The view in which partition `p` is being copied to memory node `m` (epoch + 1):
    /// commits touching `p` wait until [`View::end_migration`].
    pub fn start_migration(&self, p: u32, m: u32) -> View {
        let mut next = self.clone();
        next.epoch += 1;
        if let Some(pv) = next.partitions.get_mut(p as usize) {
            pv.migrating = Some(m);
        }
        next
    }

    /// The view in which the copy of partition `p` has landed: its target is the last
    /// backup (epoch + 1).
    pub fn end_migration(&self, p: u32) -> View {
        let mut next = self.clone();
        next.epoch += 1;
        if let Some(pv) = next.partitions.get_mut(p as usize) {
            if let Some(m) = pv.migrating.take() {
                if pv.primary != Some(m) && !pv.backups.contains(&m) {
                    pv.backups.push(m);
                }
            }
        }
        next
    }

    /// The view after memory node `m` died: `m` leaves every partition; where it held
    /// the primary, the first backup is promoted (none left: the partition is lost).
    /// Returns the new view (epoch + 1), the partitions promoted and the partitions
    /// lost.
    pub fn fail(&self, m: u32) -> (View, Vec<u32>, Vec<u32>) {
        let mut next = self.clone();
        next.epoch += 1;
        if !next.dead.contains(&m) {
            next.dead.push(m);
        }
        let (mut promoted, mut lost) = (Vec::new(), Vec::new());
        for (p, pv) in next.partitions.iter_mut().enumerate() {
            pv.backups.retain(|&b| b != m);
            if pv.migrating == Some(m) {
                pv.migrating = None;
            }
            if pv.primary == Some(m) {
                if pv.backups.is_empty() {
                    pv.primary = None;
                    lost.push(p as u32);
                } else {
                    pv.primary = Some(pv.backups.remove(0));
                    promoted.push(p as u32);
                }
            }
        }
        (next, promoted, lost)
    }

    /// Whether partition `p` has a copy on memory node `m`.
    pub fn holds(&self, p: u32, m: u32) -> bool {
        self.partitions
            .get(p as usize)
            .is_some_and(|pv| pv.primary == Some(m) || pv.backups.contains(&m))
    }

    /// The partitions with a copy on memory node `m`.
    pub fn partitions_on(&self, m: u32) -> Vec<u32> {
        (0..self.partitions.len() as u32)
            .filter(|&p| self.holds(p, m))
            .collect()
    }
}

/// What a [`ViewFeed`] holds besides the counters.
#[derive(Debug)]
struct FeedState {
    view: View,
    /// Memory nodes being drained (declared dead, the new view not published yet).
    draining: Vec<u32>,
}

/// The view as a process's coordinators see it, and the drain barrier: shared by the
/// view manager and every coordinator thread (cheap to check: one atomic load per
/// attempt while nothing changes).
#[derive(Clone, Debug)]
pub struct ViewFeed {
    inner: Arc<FeedInner>,
}

#[derive(Debug)]
struct FeedInner {
    /// Bumped on every change (a drain started, a view published).
    version: AtomicU64,
    /// Drain generation: bumped when a drain starts.
    drain_gen: AtomicU64,
    state: Mutex<FeedState>,
    /// Attempts in flight per drain generation they began under: `(gen, count)`.
    active: Mutex<Vec<(u64, u64)>>,
    /// The QP pools of the threads that follow this feed, with each memory node's id
    /// in them: a drain declares the node dead there.
    pools: Mutex<Vec<(Weak<Straws>, Vec<NodeId>)>>,
}

impl ViewFeed {
    /// A feed holding `view`.
    pub fn new(view: View) -> Self {
        Self {
            inner: Arc::new(FeedInner {
                version: AtomicU64::new(1),
                drain_gen: AtomicU64::new(0),
                state: Mutex::new(FeedState {
                    view,
                    draining: Vec::new(),
                }),
                active: Mutex::new(Vec::new()),
                pools: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Changes so far (compare with a remembered value to see whether to look again).
    pub fn version(&self) -> u64 {
        self.inner.version.load(Ordering::Acquire)
    }

    /// The current view and the memory nodes being drained.
    pub fn snapshot(&self) -> (View, Vec<u32>) {
        let s = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
        (s.view.clone(), s.draining.clone())
    }

    /// A thread following this feed: `straws` is its QP pools, `nodes[m]` memory node
    /// `m`'s id.
    pub fn register(&self, straws: &Arc<Straws>, nodes: Vec<NodeId>) {
        let mut p = self.inner.pools.lock().unwrap_or_else(|e| e.into_inner());
        p.retain(|(w, _)| w.strong_count() > 0);
        p.push((Arc::downgrade(straws), nodes));
    }

    /// Start draining memory node `m` (it died): attempts that begin from now and touch
    /// a partition whose primary it held abort, and in every registered thread the
    /// node is declared dead ([`rrpc::straw::Straw::declare_dead`]), so that operations
    /// waiting on it fail now rather than when the QP pools give up reconnecting: the
    /// attempts they belong to end, which the drain waits for.
    pub fn start_drain(&self, m: u32) {
        {
            let mut s = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
            if !s.draining.contains(&m) {
                s.draining.push(m);
            }
        }
        self.bump_drain();
        let p = self.inner.pools.lock().unwrap_or_else(|e| e.into_inner());
        for (w, nodes) in p.iter() {
            let (Some(straws), Some(&n)) = (w.upgrade(), nodes.get(m as usize)) else {
                continue;
            };
            if let Some(s) = straws.get(n) {
                s.declare_dead("written off by the replica view: the memory node died");
            }
        }
    }

    /// Start a drain generation after a change of state: the version first, so that an
    /// attempt that counts itself under the new generation ([`Self::enter`]) sees the
    /// new state at its next check, and one under the old generation is waited for.
    fn bump_drain(&self) {
        self.inner.version.fetch_add(1, Ordering::AcqRel);
        self.inner.drain_gen.fetch_add(1, Ordering::AcqRel);
    }

    /// Publish `view` and start a drain generation: [`Self::drained`] then tells when
    /// every attempt that began under the previous view has ended (re-replication's
    /// barrier before a partition is copied: attempts that begin from now see the
    /// partition migrating and wait).
    pub fn publish_and_drain(&self, view: View) {
        {
            let mut s = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
            s.draining.retain(|m| !view.dead.contains(m));
            s.view = view;
        }
        self.bump_drain();
    }

    /// Whether every attempt that began before the last [`Self::start_drain`] (or
    /// [`Self::publish_and_drain`]) has ended.
    pub fn drained(&self) -> bool {
        let gen = self.inner.drain_gen.load(Ordering::Acquire);
        let a = self.inner.active.lock().unwrap_or_else(|e| e.into_inner());
        a.iter().all(|&(g, n)| g >= gen || n == 0)
    }

    /// Publish `view` (its epoch above the current one), ending the drains of the
    /// memory nodes it declares dead.
    pub fn publish(&self, view: View) {
        let mut s = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
        s.draining.retain(|m| !view.dead.contains(m));
        s.view = view;
        self.inner.version.fetch_add(1, Ordering::AcqRel);
    }

    /// An attempt begins: counted until the guard drops, under the drain generation
    /// of now.
    pub fn enter(&self) -> ActiveGuard {
        let gen = self.inner.drain_gen.load(Ordering::Acquire);
        let mut a = self.inner.active.lock().unwrap_or_else(|e| e.into_inner());
        match a.iter_mut().find(|(g, _)| *g == gen) {
            Some((_, n)) => *n += 1,
            None => a.push((gen, 1)),
        }
        a.retain(|&(g, n)| n > 0 || g == gen);
        ActiveGuard {
            feed: self.clone(),
            gen,
        }
    }
}

/// An attempt counted by [`ViewFeed::enter`]; drop ends it.
#[derive(Debug)]
pub struct ActiveGuard {
    feed: ViewFeed,
    gen: u64,
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        let mut a = self
            .feed
            .inner
            .active
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some((_, n)) = a.iter_mut().find(|(g, _)| *g == self.gen) {
            *n = n.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_primary_is_replaced_by_its_first_backup_and_a_dead_backup_leaves() {
        let v = View::initial(3, 3);
        assert_eq!(v.partitions[0].primary, Some(0));
        assert_eq!(v.partitions[0].backups, vec![1, 2]);
        assert_eq!(v.partitions[2].backups, vec![0, 1]);
        let (w, promoted, lost) = v.fail(0);
        assert_eq!(w.epoch, 2);
        assert_eq!((promoted, lost), (vec![0], vec![]));
        assert_eq!(w.partitions[0].primary, Some(1));
        assert_eq!(w.partitions[0].backups, vec![2]);
        assert_eq!(w.partitions[1].backups, vec![2], "0 was no copy of 1");
        assert_eq!(w.partitions[2].backups, vec![1]);
        assert!(!w.holds(2, 0) && w.holds(2, 1));
        assert_eq!(w.partitions_on(2), vec![0, 1, 2]);
        // One copy only: the partition is lost.
        let (x, _, lost) = View::initial(2, 1).fail(1);
        assert_eq!((lost, x.partitions[1].primary), (vec![1], None));
    }

    #[test]
    fn a_rejoined_node_becomes_a_backup_of_each_partition_once_copied() {
        let v = View::initial(3, 3);
        let (w, _, _) = v.fail(0);
        let r = w.rejoin(0);
        assert_eq!(r.epoch, 3);
        assert!(r.dead.is_empty());
        assert_eq!((r.incarnation(0), r.incarnation(1)), (1, 0));
        assert!(
            r.partitions_on(0).is_empty(),
            "it holds nothing before the copy"
        );
        let m = r.start_migration(0, 0);
        assert_eq!(m.partitions[0].migrating, Some(0));
        assert!(!m.holds(0, 0), "a copy in flight takes no installs");
        let e = m.end_migration(0);
        assert_eq!(e.epoch, 5);
        assert_eq!(
            e.partitions[0].primary,
            Some(1),
            "the promoted primary stays"
        );
        assert_eq!(e.partitions[0].backups, vec![2, 0]);
        assert_eq!(e.partitions[0].migrating, None);
        // Dying again mid-copy ends the migration.
        let (x, _, _) = e.start_migration(1, 0).fail(0);
        assert_eq!(x.partitions[1].migrating, None);
        assert!(!x.holds(1, 0) && !x.holds(0, 0));
        // Views from before incarnations were stored read as incarnation 0.
        let old: View = serde_json::from_str(
            r#"{"epoch":1,"partitions":[{"primary":0,"backups":[]}],"dead":[]}"#,
        )
        .unwrap();
        assert_eq!((old.incarnation(0), old.partitions[0].migrating), (0, None));
    }

    #[test]
    fn a_migration_drain_waits_for_attempts_under_the_previous_view() {
        let f = ViewFeed::new(View::initial(3, 2));
        let old = f.enter();
        let v = f.snapshot().0.start_migration(1, 0);
        let before = f.version();
        f.publish_and_drain(v);
        assert!(f.version() > before);
        let new = f.enter();
        assert!(!f.drained());
        drop(old);
        assert!(f.drained());
        assert_eq!(f.snapshot().0.partitions[1].migrating, Some(0));
        drop(new);
    }

    #[test]
    fn the_drain_waits_for_attempts_begun_before_it_only() {
        let f = ViewFeed::new(View::initial(3, 2));
        let old = f.enter();
        assert!(f.drained(), "nothing to drain before a drain starts");
        f.start_drain(1);
        let new = f.enter();
        assert!(!f.drained(), "an attempt from before the drain is running");
        drop(old);
        assert!(
            f.drained(),
            "attempts begun during the drain do not hold it up"
        );
        let (v, draining) = f.snapshot();
        assert_eq!(draining, vec![1]);
        let before = f.version();
        f.publish(v.fail(1).0);
        assert!(f.version() > before);
        assert!(f.snapshot().1.is_empty());
        drop(new);
    }
}
