//! Replica views across coordinator processes (`txn-bench --cnodes N` with
//! `--kill-memnode-after`): the view manager in `txn-bench` and the coordinators of each
//! `cnode` process meet in etcd (the replication design's B.6.2 and B.6.4, with etcd as
//! the view service).
//!
//! - `/<cluster>/kv/view`: the view ([`txn::view::View`], JSON), stored by the manager
//!   before it publishes it; every compute node watches it and takes each view of a
//!   higher epoch ([`txn::view::ViewFeed::publish`]).
//! - `/<cluster>/kv/view-drain`: a drain request ([`DrainRequest`]): a memory node to
//!   drain (failover) or a view to drain under (a partition marked migrating). A compute
//!   node applies it to its feed, waits until every attempt from before has ended, and
//!   acknowledges under `/<cluster>/kv/view-drained/<node>` with the request's
//!   generation. The manager goes on (promotes, copies) only once every compute node
//!   acknowledged: the drain barrier of B.6.4 across processes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use txn::view::{View, ViewFeed};

/// Where the view lives in etcd (under `/<cluster>/kv/`).
pub(crate) const VIEW_KEY: &str = "view";
/// Where the current drain request lives.
pub(crate) const DRAIN_KEY: &str = "view-drain";

/// Where compute node `node` acknowledges drain requests.
pub(crate) fn ack_key(node: u16) -> String {
    format!("view-drained/{node}")
}

/// How long a compute node waits for its attempts to end before giving up on a drain
/// (it then does not acknowledge, and the manager's wait fails the run).
const DRAIN_LIMIT: Duration = Duration::from_secs(10);

/// A drain the manager asks every compute node for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct DrainRequest {
    /// Grows by one with every request.
    pub gen: u64,
    /// What to drain.
    pub kind: DrainKind,
}

/// What a [`DrainRequest`] drains.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "what", rename_all = "kebab-case")]
pub(crate) enum DrainKind {
    /// Memory node `memnode` died ([`ViewFeed::start_drain`]).
    Fail {
        /// The memory node.
        memnode: u32,
    },
    /// Take `view` (a partition marked migrating) and drain the attempts from before
    /// ([`ViewFeed::publish_and_drain`]).
    Migrate {
        /// The view.
        view: View,
    },
}

impl DrainRequest {
    /// Apply it to `feed`.
    pub(crate) fn apply(&self, feed: &ViewFeed) {
        match &self.kind {
            DrainKind::Fail { memnode } => feed.start_drain(*memnode),
            DrainKind::Migrate { view } => feed.publish_and_drain(view.clone()),
        }
    }
}

/// Wait until every attempt on `feed` from before its last drain has ended (for up to
/// 10 s). Errors: they did not.
pub(crate) fn await_drained(feed: &ViewFeed, what: &str) -> anyhow::Result<()> {
    let t0 = Instant::now();
    while !feed.drained() {
        anyhow::ensure!(
            t0.elapsed() < DRAIN_LIMIT,
            "{what}: attempts from before did not end within {DRAIN_LIMIT:?}"
        );
        std::thread::sleep(Duration::from_micros(20));
    }
    Ok(())
}

/// What a compute node's follower thread hears.
enum Heard {
    View(Option<Vec<u8>>),
    Drain(Option<Vec<u8>>),
}

/// Compute node `node`'s side: a thread that takes every newer view stored in etcd into
/// `feed` and answers every drain request once its own attempts from before have ended.
/// A request stored before this process subscribed is acknowledged without a drain (its
/// attempts all began after it). Ends when the member is dropped.
///
/// Errors: etcd could not be watched.
pub(crate) fn follow(
    me: Arc<member::Member>,
    feed: ViewFeed,
    node: u16,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    let views = me
        .watch_key(VIEW_KEY)
        .context("watching the replica view")?;
    let drains = me.watch_key(DRAIN_KEY).context("watching drain requests")?;
    let (tx, rx) = std::sync::mpsc::channel();
    let t = tx.clone();
    std::thread::spawn(move || {
        while let Ok(v) = views.recv() {
            if t.send(Heard::View(v)).is_err() {
                return;
            }
        }
    });
    std::thread::spawn(move || {
        while let Ok(v) = drains.recv() {
            if tx.send(Heard::Drain(v)).is_err() {
                return;
            }
        }
    });
    Ok(std::thread::Builder::new()
        .name("view-follower".into())
        .spawn(move || {
            let mut first_drain = true;
            let mut last_gen = 0;
            while let Ok(h) = rx.recv() {
                match h {
                    Heard::View(Some(b)) => match serde_json::from_slice::<View>(&b) {
                        Ok(v) if v.epoch > feed.snapshot().0.epoch => feed.publish(v),
                        Ok(_) => {}
                        Err(e) => eprintln!("view follower: a stored view that is not one: {e}"),
                    },
                    Heard::Drain(Some(b)) => {
                        let req: DrainRequest = match serde_json::from_slice(&b) {
                            Ok(r) => r,
                            Err(e) => {
                                eprintln!("view follower: a drain request that is not one: {e}");
                                continue;
                            }
                        };
                        if req.gen <= last_gen {
                            continue;
                        }
                        if !first_drain {
                            req.apply(&feed);
                            if let Err(e) = await_drained(&feed, "drain request") {
                                eprintln!("view follower of node {node}: {e:#}; not acknowledging");
                                continue;
                            }
                        }
                        first_drain = false;
                        last_gen = req.gen;
                        if let Err(e) = me.put_durable(&ack_key(node), req.gen.to_string()) {
                            eprintln!("view follower of node {node}: acknowledging a drain: {e}");
                        }
                    }
                    Heard::View(None) => {}
                    Heard::Drain(None) => first_drain = false,
                }
            }
        })?)
}

/// The manager's side: store `req` and wait until each of `cnodes` acknowledged it (for
/// up to 10 s). Errors: etcd failed; some compute node did not acknowledge in time
/// (named).
pub(crate) fn drain_remote(
    me: &member::Member,
    cnodes: &[u16],
    req: &DrainRequest,
) -> anyhow::Result<()> {
    me.put_durable(DRAIN_KEY, serde_json::to_vec(req)?)
        .context("storing a drain request in etcd")?;
    let t0 = Instant::now();
    loop {
        let mut missing = Vec::new();
        for &n in cnodes {
            let acked = me
                .get(&ack_key(n))
                .context("reading drain acknowledgements")?
                .and_then(|b| String::from_utf8(b).ok()?.parse::<u64>().ok());
            if acked.is_none_or(|g| g < req.gen) {
                missing.push(n);
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        anyhow::ensure!(
            t0.elapsed() < DRAIN_LIMIT,
            "compute nodes {missing:?} did not finish drain {} within {DRAIN_LIMIT:?}",
            req.gen
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drain_requests_travel_as_json_and_apply_to_a_feed() {
        let v = View::initial(3, 2).start_migration(1, 0);
        for req in [
            DrainRequest {
                gen: 4,
                kind: DrainKind::Fail { memnode: 2 },
            },
            DrainRequest {
                gen: 5,
                kind: DrainKind::Migrate { view: v.clone() },
            },
        ] {
            let b = serde_json::to_vec(&req).unwrap();
            assert_eq!(serde_json::from_slice::<DrainRequest>(&b).unwrap(), req);
        }
        let feed = ViewFeed::new(View::initial(3, 2));
        let old = feed.enter();
        DrainRequest {
            gen: 1,
            kind: DrainKind::Migrate { view: v.clone() },
        }
        .apply(&feed);
        assert_eq!(feed.snapshot().0, v);
        assert!(!feed.drained(), "an attempt from before is running");
        drop(old);
        await_drained(&feed, "test").unwrap();
        DrainRequest {
            gen: 2,
            kind: DrainKind::Fail { memnode: 2 },
        }
        .apply(&feed);
        assert_eq!(feed.snapshot().1, vec![2]);
    }
}
