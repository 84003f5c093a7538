//! Which compute nodes' lock tables are down, as one process's Lotus coordinators see
//! it, and which of their attempts began before a node went down (Lotus 6, the restart
//! handshake).
//!
//! When a compute node `d` dies its lock table is gone: every survivor marks `d` down
//! ([`LotusPeers::mark_down`]), after which its threads' lock-table clients answer locks
//! on `d`'s shards [`lockd::table_wire::OpOutcome::Down`] at once (the attempt aborts,
//! `cn-down`). An attempt that began before that may hold a lock `d` granted; it may
//! still finish (nobody else can lock those keys while `d` is down), but `d`, restarted
//! with an empty table, must not grant those keys to anyone until it has ended (Lotus 6:
//! the restarted node "serves new lock requests from an empty lock table after all
//! previously associated transactions have finished"). So every attempt registers the
//! generation it began in ([`LotusPeers::enter`]) and [`LotusPeers::wait_quiet`] waits
//! until none of an older generation is left; the survivor then confirms to the
//! restarted node, which serves only after every survivor confirmed, and the survivors
//! mark it up again ([`LotusPeers::mark_up`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use lockd::shard::ShardMap;
use rrpc::straw::Straws;
use rrpc::NodeId;

/// The down set and the attempts in flight per generation, shared by a process's
/// threads (in [`crate::lotus::LotusSite::peer_states`]). Every change of the down set is a
/// new generation.
#[derive(Default)]
pub struct LotusPeers {
    generation: AtomicU64,
    state: Mutex<State>,
    ended: Condvar,
    /// The coordinators' connection pools ([`Self::register`]).
    straws: Mutex<Vec<Weak<Straws>>>,
}

impl std::fmt::Debug for LotusPeers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LotusPeers")
            .field("generation", &self.generation())
            .field("state", &*self.state())
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct State {
    down: BTreeSet<u32>,
    /// A shard map newer than the one the threads started with (the survivors'
    /// takeover of a dead node's shards), for their clients to install.
    map: Option<ShardMap>,
    /// Attempts in flight by the generation they began in.
    active: BTreeMap<u64, usize>,
}

impl LotusPeers {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panicking coordinator leaves the counts as they were: still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current generation (starts at 0; +1 per change of the down set). Cheap: one
    /// atomic load, for a thread to see whether its client must follow a change.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Register a coordinator thread's connection pools: a node marked down is
    /// declared dead there at once ([`Self::mark_down`]).
    pub fn register(&self, straws: &Arc<Straws>) {
        let mut v = self.straws.lock().unwrap_or_else(|p| p.into_inner());
        v.retain(|w| w.strong_count() > 0);
        if !v
            .iter()
            .any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(straws)))
        {
            v.push(Arc::downgrade(straws));
        }
    }

    /// Mark compute node `node` down (Lotus 6, step 1); returns the new generation:
    /// attempts that began before it are those [`Self::wait_quiet`] waits for. Its
    /// connections in every registered pool are declared dead
    /// ([`rrpc::straw::Straw::declare_dead`]), so that calls waiting on it fail now
    /// (their attempts end, which the wait needs) rather than when the pools give up
    /// reconnecting. Marking a node already down still starts a generation.
    pub fn mark_down(&self, node: u32) -> u64 {
        let g = {
            let mut s = self.state();
            s.down.insert(node);
            self.generation.fetch_add(1, Ordering::AcqRel) + 1
        };
        let pools = self
            .straws
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for p in pools.iter().filter_map(Weak::upgrade) {
            if let Some(s) = p.get(NodeId(node)) {
                s.declare_dead("its compute node died (Lotus lock table down)");
            }
        }
        g
    }

    /// Mark compute node `node` up (its restarted life serves; Lotus 6, step 5).
    pub fn mark_up(&self, node: u32) {
        let mut s = self.state();
        if s.down.remove(&node) {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// The nodes marked down and the generation this set belongs to.
    pub fn down(&self) -> (BTreeSet<u32>, u64) {
        let s = self.state();
        (s.down.clone(), self.generation())
    }

    /// Publish `map` (newer than the threads' own) to this process's threads: each
    /// thread's client installs it as its next attempt begins. Starts a generation.
    pub fn install_map(&self, map: ShardMap) {
        let mut s = self.state();
        if s.map.as_ref().is_some_and(|m| m.version() >= map.version()) {
            return;
        }
        s.map = Some(map);
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// The newest map published by [`Self::install_map`], if any.
    pub fn map(&self) -> Option<ShardMap> {
        self.state().map.clone()
    }

    /// Whether `node` is marked down.
    pub fn is_down(&self, node: u32) -> bool {
        self.state().down.contains(&node)
    }

    /// An attempt begins: returns the generation it is counted in (pass it to
    /// [`Self::leave`] when it ends).
    pub fn enter(&self) -> u64 {
        let mut s = self.state();
        let g = self.generation();
        *s.active.entry(g).or_default() += 1;
        g
    }

    /// The attempt counted in generation `g` ended (committed, aborted or dropped).
    pub fn leave(&self, g: u64) {
        let mut s = self.state();
        if let Some(n) = s.active.get_mut(&g) {
            *n -= 1;
            if *n == 0 {
                s.active.remove(&g);
                self.ended.notify_all();
            }
        }
    }

    /// Attempts in flight that began before generation `g`.
    pub fn older_than(&self, g: u64) -> usize {
        self.state().active.range(..g).map(|(_, n)| n).sum()
    }

    /// Wait until no attempt that began before generation `g` is in flight, at most
    /// `timeout`; returns how many are still in flight (0: quiet).
    pub fn wait_quiet(&self, g: u64, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        let mut s = self.state();
        loop {
            let left: usize = s.active.range(..g).map(|(_, n)| n).sum();
            let now = Instant::now();
            if left == 0 || now >= deadline {
                return left;
            }
            s = self
                .ended
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_only_for_attempts_older_than_the_generation() {
        let p = LotusPeers::default();
        let old = p.enter();
        let g = p.mark_down(7);
        assert!(p.is_down(7));
        let new = p.enter();
        assert_eq!(new, g);
        assert_eq!(p.older_than(g), 1);
        assert_eq!(p.wait_quiet(g, Duration::from_millis(1)), 1);
        p.leave(old);
        // The attempt that began after the mark does not hold the wait.
        assert_eq!(p.wait_quiet(g, Duration::from_millis(1)), 0);
        p.leave(new);
        p.mark_up(7);
        assert!(!p.is_down(7));
        assert_eq!(p.generation(), g + 1);
    }

    #[test]
    fn a_waiter_wakes_when_the_last_old_attempt_ends() {
        let p = Arc::new(LotusPeers::default());
        let a = p.enter();
        let g = p.mark_down(3);
        let q = p.clone();
        let t = std::thread::spawn(move || q.wait_quiet(g, Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(20));
        p.leave(a);
        assert_eq!(t.join().unwrap(), 0);
    }
}
