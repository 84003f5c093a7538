//! Who recovers a dead compute node in `txn-bench --cnodes N`, and how.
//!
//! A [`Recoverer`] is a thread with a transaction client of its own, which runs
//! [`txn::coordinator::TxnClient::recover`] (the dead life's commit logs rolled forward
//! or back, its CVT lock words, insert guards and claims swept, then its Scythe
//! tickets released) when asked, and answers with what it did.
//!
//! With a membership service (etcd), the recoverer is a surviving compute node (Lotus
//! 6; Motor 5.3): every `cnode` process runs a [`Survivor`], which watches the
//! membership; on a compute node's Down event (its lease revoked by the launcher that
//! reaped it, or expired) each survivor waits until every memory node (and the lock
//! service) fenced the dead life, and the one whose claim in etcd wins
//! ([`member::Member::claim_recovery`]) recovers it and records a [`RecoveryRecord`]
//! ([`member::Member::finish_recovery`]). A survivor that dies mid-recovery takes its
//! claim with it (the claim lives under its lease), and the others, on that Down,
//! claim what nobody recovers ([`member::Member::pending_recoveries`]). The launcher
//! reads the record; it recovers a life itself only when no compute node survives, or
//! none recorded a recovery in time.
//!
//! Recovery starts only for a life known dead (reaped, or its lease ended and every
//! memory node fenced it), and a restarted compute node serves only after its earlier
//! lives' records exist ([`member::Member::wait_recovered`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rrpc::fabric::Fabric;
use rrpc::runtime::{block_on, ThreadCtx};
use txn::coordinator::{ClusterAddrs, Protocol, TxnClient, TxnConfig};
use txn::recovery::RecoveryReport;

type Ask = (u32, u64, mpsc::Sender<Result<RecoveryReport, String>>);

/// A recovery thread (see the module docs).
pub struct Recoverer {
    tx: Option<mpsc::Sender<Ask>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Recoverer {
    /// Start the thread on `fabric` (the parent's), connected to `addrs` for
    /// `protocol` (Scythe's lock service too). Blocks until it is connected.
    ///
    /// Errors: the client could not connect.
    pub fn start(fabric: Fabric, addrs: ClusterAddrs, protocol: Protocol) -> anyhow::Result<Self> {
        Self::start_with(fabric, addrs, protocol, None)
    }

    /// [`Self::start`] with, for Lotus, the compute node's lock-table site: the recovery
    /// then also releases the dead life's locks in every live node's table (Lotus 6,
    /// step 3). Without it a Lotus recovery settles the logs only.
    ///
    /// Errors: the client could not connect.
    pub fn start_with(
        fabric: Fabric,
        addrs: ClusterAddrs,
        protocol: Protocol,
        lotus: Option<txn::lotus::LotusSite>,
    ) -> anyhow::Result<Self> {
        let (tx, rx) = mpsc::channel::<Ask>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
        let thread = std::thread::Builder::new()
            .name("recoverer".into())
            .spawn(move || {
                let client = ThreadCtx::new(fabric, crate::run_runtime::get())
                    .map_err(|e| e.to_string())
                    .and_then(|ctx| {
                        // Recovery is one-sided; Lotus's lock tables live in the
                        // compute nodes (without a site: the logs only).
                        let protocol = if protocol.needs_lock_tables() && lotus.is_none() {
                            Protocol::OccCas
                        } else {
                            protocol
                        };
                        let cfg = TxnConfig::default()
                            .with_protocol(protocol)
                            .with_lotus(lotus);
                        TxnClient::connect(ctx, &addrs, cfg).map_err(|e| e.to_string())
                    });
                let client = match client {
                    Ok(c) => std::rc::Rc::new(c),
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                for (node, inc, answer) in rx {
                    let c = client.clone();
                    let ctx = client.ctx().clone();
                    let r = block_on(&ctx, async move { c.recover(node, inc).await });
                    let _ = answer.send(r.map_err(|e| e.to_string()));
                }
            })
            .context("starting the recovery thread")?;
        ready_rx
            .recv()
            .context("the recovery thread ended before connecting")?
            .map_err(|e| anyhow::anyhow!("the recovery client: {e}"))?;
        Ok(Self {
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    /// Recover compute node `node`'s life `incarnation`, waiting at most `timeout`.
    ///
    /// Errors: recovery failed (a memory node or the lock service could not be
    /// reached; running it again is safe) or took longer than `timeout`.
    pub fn recover(
        &self,
        node: u32,
        incarnation: u64,
        timeout: Duration,
    ) -> Result<RecoveryReport, String> {
        let (atx, arx) = mpsc::channel();
        self.tx
            .as_ref()
            .ok_or("the recovery thread is gone")?
            .send((node, incarnation, atx))
            .map_err(|_| "the recovery thread is gone".to_string())?;
        arx.recv_timeout(timeout)
            .map_err(|_| format!("recovery did not finish within {timeout:?}"))?
    }
}

impl Drop for Recoverer {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What the survivor that recovered a dead life records in etcd
/// (`/<cluster>/recovered/<node>/<incarnation>`, JSON): who, the recovery line, and
/// the commits it rolled forward with their notes (the launcher's exact accounting).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct RecoveryRecord {
    /// Node id of the compute node (or launcher) that recovered it.
    pub by: u16,
    /// [`RecoveryReport::summary`].
    pub summary: String,
    /// [`RecoveryReport::phases`].
    #[serde(default)]
    pub phases: String,
    /// Logs rolled forward.
    pub forward: usize,
    /// `(transaction id, note)` of each log rolled forward.
    pub forward_notes: Vec<(u64, i64)>,
}

impl RecoveryRecord {
    /// The record of `r`, recovered by node `by`.
    pub fn of(by: u16, r: &RecoveryReport) -> Self {
        Self {
            by,
            summary: r.summary(),
            phases: r.phases(),
            forward: r.forward,
            forward_notes: r.forward_notes.clone(),
        }
    }

    /// The record in etcd's value. Errors: not a record (a clean leave records
    /// `"clean leave"`).
    pub fn parse(value: &str) -> Result<Self, String> {
        serde_json::from_str(value).map_err(|e| format!("recovery record {value:?}: {e}"))
    }

    /// As etcd stores it.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a record serializes")
    }
}

/// How long a survivor waits for the memory nodes to fence a dead life before it
/// leaves the life to others (the launcher kills a stopped process its memory nodes
/// cannot fence, which then completes).
const FENCE_WAIT: Duration = Duration::from_secs(10);

/// Attempts of a survivor at a recovery it claimed (running it again is safe); past
/// them it exits, so that its lease, and its claim with it, end and another recovers.
const RECOVERY_ATTEMPTS: u32 = 3;

/// A compute node's Lotus part in its survivor duty ([`Survivor::start`]).
pub struct LotusDuty {
    /// The node's lock-table site (its table, map and down set).
    pub site: txn::lotus::LotusSite,
    /// Whether the survivors share a dead node's shards (the `lotus_cn` module):
    /// when the run restarts no compute node.
    pub take_over: bool,
}

/// A compute node's survivor duty (module docs): a thread that watches the membership
/// and recovers the dead compute-node lives it wins the claim of. Stops when dropped
/// (after a recovery in progress finished).
pub struct Survivor {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Survivor {
    /// Start watching as `me`, recovering through a [`Recoverer`] on `fabric` connected
    /// to `addrs` for `protocol` (with the site of `lotus`, [`Recoverer::start_with`])
    /// the compute nodes among `cnodes` (node ids; the other
    /// roles' lives are not this duty's); a life is recovered only after every node in
    /// `fencers` fenced it. Under Lotus ([`LotusDuty`]) it also marks a dead node down,
    /// confirms it once this node's attempts from before ended, and takes its shards
    /// over or marks its next life up.
    ///
    /// Errors: the membership watch or the recovery client could not be set up.
    pub fn start(
        me: Arc<member::Member>,
        fabric: Fabric,
        addrs: ClusterAddrs,
        protocol: Protocol,
        lotus: Option<LotusDuty>,
        cnodes: std::ops::Range<u16>,
        fencers: Vec<u16>,
    ) -> anyhow::Result<Self> {
        let events = me.events().context("watching the membership")?;
        let peer_states = lotus.as_ref().map(|l| l.site.peer_states.clone());
        let heir = lotus
            .as_ref()
            .filter(|l| l.take_over)
            .map(|l| l.site.clone());
        let lotus = lotus.map(|l| l.site);
        let cnode_ids: Vec<u32> = cnodes.clone().map(u32::from).collect();
        let own = fabric.clone();
        let recoverer = Recoverer::start_with(fabric, addrs, protocol, lotus)?;
        let stop = Arc::new(AtomicBool::new(false));
        let halt = stop.clone();
        let thread = std::thread::Builder::new()
            .name("survivor".into())
            .spawn(move || {
                // Lotus: dead compute nodes marked down here, until their next life serves.
                let mut restarting: Vec<(u16, u64)> = Vec::new();
                while !halt.load(Ordering::Relaxed) {
                    if let Some(p) = &peer_states {
                        restarting.retain(|&(node, life)| {
                            !crate::lotus_cn::mark_up_if_serving(&me, p, node, life)
                        });
                    }
                    let down = match events.recv_timeout(Duration::from_millis(20)) {
                        Ok(member::Event::Down(i)) if i.role == member::Role::Cnode => i,
                        Ok(_) | Err(member::RecvTimeoutError::Timeout) => continue,
                        Err(member::RecvTimeoutError::Disconnected) => return,
                    };
                    // This life's own Down: its watchdog ends the process.
                    if (down.node, down.incarnation) == (me.node(), me.incarnation()) {
                        continue;
                    }
                    // Lotus 6, step 1: its table is gone; new locks there abort at once.
                    // Its connections to this node's lock service are fenced first (as a
                    // memory node's fencer does), so that its next life, under the same
                    // node id, is served on fresh ones. A node that left cleanly (the
                    // run's end) released its own locks.
                    let clean = me
                        .recovered(down.node, down.incarnation)
                        .ok()
                        .flatten()
                        .is_some_and(|r| r == member::CLEAN_LEAVE);
                    let marked = peer_states.as_ref().filter(|_| !clean).map(|p| {
                        own.fence(rrpc::NodeId(u32::from(down.node)), down.incarnation);
                        p.mark_down(u32::from(down.node))
                    });
                    // The one that died, and any whose claimant died with a claim.
                    let mut lives = vec![(down.node, down.incarnation)];
                    match me.pending_recoveries() {
                        Ok(p) => {
                            let first = lives[0];
                            lives.extend(
                                p.into_iter()
                                    .filter(|&(n, _)| cnodes.contains(&n))
                                    .filter(|&l| l != first),
                            );
                        }
                        Err(e) => eprintln!("survivor: reading pending recoveries: {e}"),
                    }
                    for (node, life) in lives {
                        if let Err(e) = recover_one(&me, &recoverer, &fencers, node, life) {
                            eprintln!(
                                "cnode {} incarnation {}: recovering node {node} life {life}: {e:#}; exiting so that another survivor claims it",
                                me.node(),
                                me.incarnation()
                            );
                            std::process::exit(4);
                        }
                    }
                    // Lotus 6, steps 4 and 5: once this node's attempts that began before
                    // the mark ended, confirm to the restarted node.
                    if let (Some(p), Some(g)) = (&peer_states, marked) {
                        let life = down.incarnation;
                        match crate::lotus_cn::confirm_down(&me, p, down.node, life, g) {
                            Ok(()) => restarting.push((down.node, life)),
                            Err(e) => eprintln!(
                                "cnode {}: confirming node {} life {life} down: {e:#}",
                                me.node(),
                                down.node
                            ),
                        }
                        // Not restarted: the survivors take its shards over.
                        if let Some(site) = &heir {
                            match crate::lotus_cn::take_over(&me, site, down.node, life, &cnode_ids) {
                                Ok(n) => eprintln!(
                                    "cnode {}: took over {n} shards of dead node {} (life {life})",
                                    me.node(),
                                    down.node
                                ),
                                Err(e) => eprintln!(
                                    "cnode {}: taking over node {}'s shards: {e:#}",
                                    me.node(),
                                    down.node
                                ),
                            }
                        }
                    }
                }
            })
            .context("starting the survivor thread")?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Survivor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Recover `node`'s `life` if it is not recovered yet, every fencer fenced it, and our
/// claim wins. Errors: a recovery we claimed failed [`RECOVERY_ATTEMPTS`] times, or
/// could not be recorded.
fn recover_one(
    me: &member::Member,
    recoverer: &Recoverer,
    fencers: &[u16],
    node: u16,
    life: u64,
) -> anyhow::Result<()> {
    if me.recovered(node, life)?.is_some() {
        return Ok(());
    }
    let missing = member::wait_fenced(me, node, life, fencers, FENCE_WAIT)?;
    if !missing.is_empty() {
        eprintln!(
            "survivor: node {node} life {life} not fenced by {missing:?} within {FENCE_WAIT:?}; left to others"
        );
        return Ok(());
    }
    match me.claim_recovery(node, life) {
        Ok(true) => {}
        Ok(false) => return Ok(()), // another survivor recovers it
        Err(member::MemberError::StillLive { .. }) => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    let mut last = String::new();
    for _ in 0..RECOVERY_ATTEMPTS {
        match recoverer.recover(u32::from(node), life, Duration::from_secs(30)) {
            Ok(r) => {
                let rec = RecoveryRecord::of(me.node(), &r);
                me.finish_recovery(node, life, &rec.to_json())
                    .context("recording the recovery")?;
                return Ok(());
            }
            Err(e) => last = e,
        }
    }
    anyhow::bail!("recovery failed {RECOVERY_ATTEMPTS} times: {last}")
}
