//! Which node took each outstanding Takeout ticket, so the tickets of a failed node can be
//! passed on (Scythe 4.3's Takeout Lock; recovery in the manner of Lotus section 6:
//! the lock service keeps who holds what, so a
//! node's failure releases its locks without rebuilding any lock state).
//!
//! A ticket lock serves tickets in order, so a ticket whose client died stalls its lock
//! and every ticket behind it. The lock service's CPU sees every ticket taken (the Lock
//! RPC) but never its release (the holder's one-sided FAA of `upper`), so the record is
//! pruned lazily: a ticket before `upper` was released. A plain state machine: the words
//! are passed in, the caller serializes access (the service's stripe mutex).

use std::collections::{HashMap, VecDeque};

/// A ticket a node took and has not passed on yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeTicket {
    /// Lock id.
    pub id: u64,
    /// The ticket number (`lower` when it was taken).
    pub ticket: u64,
}

/// Outstanding tickets per lock, each with the node that took it, in ticket order.
///
/// Memory stays proportional to the locks with outstanding tickets: a lock's record is
/// pruned when it is locked again, and once the record spans more than twice the locks
/// it held after the last sweep (at least [`SWEEP_MIN_LOCKS`]), [`Self::sweep_if_large`]
/// prunes them all (amortized O(1) per ticket).
#[derive(Debug)]
pub struct TicketOwners {
    by_lock: HashMap<u64, VecDeque<(u64, u32)>>,
    sweep_at: usize,
}

/// Locks a record may span before its first sweep.
pub const SWEEP_MIN_LOCKS: usize = 64;

impl Default for TicketOwners {
    fn default() -> Self {
        Self {
            by_lock: HashMap::new(),
            sweep_at: SWEEP_MIN_LOCKS,
        }
    }
}

/// Whether ticket `t` is still queued or holding on a lock whose words are
/// `(lower, upper)`: `upper <= t < lower` in wrapping ticket arithmetic.
fn outstanding(t: u64, lower: u64, upper: u64) -> bool {
    t.wrapping_sub(upper) < lower.wrapping_sub(upper)
}

impl TicketOwners {
    /// An empty record.
    pub fn new() -> Self {
        Self::default()
    }

    /// Record that `node` took `ticket` on lock `id`, whose words are now
    /// `(lower, upper)` (after the ticket was taken, so `ticket < lower`). Tickets the
    /// lock already passed (before `upper`) are forgotten first.
    pub fn record(&mut self, id: u64, ticket: u64, node: u32, lower: u64, upper: u64) {
        let q = self.by_lock.entry(id).or_default();
        q.retain(|&(t, _)| outstanding(t, lower, upper));
        q.push_back((ticket, node));
    }

    /// Forget lock `id`'s tickets that are no longer outstanding given `(lower, upper)`.
    pub fn prune(&mut self, id: u64, lower: u64, upper: u64) {
        if let Some(q) = self.by_lock.get_mut(&id) {
            q.retain(|&(t, _)| outstanding(t, lower, upper));
            if q.is_empty() {
                self.by_lock.remove(&id);
            }
        }
    }

    /// Remove and return the outstanding tickets `node` took, at most `max`, in (lock,
    /// ticket) order. `words(id)` gives lock `id`'s current `(lower, upper)`; every
    /// lock's record is pruned on the way. The caller becomes responsible for passing the returned tickets
    /// on; a second call for the same node returns none of them again.
    pub fn take_node(
        &mut self,
        node: u32,
        max: usize,
        mut words: impl FnMut(u64) -> (u64, u64),
    ) -> Vec<NodeTicket> {
        let mut out = Vec::new();
        self.by_lock.retain(|&id, q| {
            let (lower, upper) = words(id);
            q.retain(|&(t, n)| {
                if !outstanding(t, lower, upper) {
                    return false;
                }
                if n == node && out.len() < max {
                    out.push(NodeTicket { id, ticket: t });
                    return false;
                }
                true
            });
            !q.is_empty()
        });
        out.sort_unstable();
        out
    }

    /// When the record spans more locks than the sweep threshold, forget every ticket no
    /// longer outstanding (`words(id)` gives lock `id`'s current `(lower, upper)`) and
    /// set the threshold to twice the locks left (at least [`SWEEP_MIN_LOCKS`]).
    pub fn sweep_if_large(&mut self, mut words: impl FnMut(u64) -> (u64, u64)) {
        if self.by_lock.len() <= self.sweep_at {
            return;
        }
        self.by_lock.retain(|&id, q| {
            let (lower, upper) = words(id);
            q.retain(|&(t, _)| outstanding(t, lower, upper));
            !q.is_empty()
        });
        self.sweep_at = (2 * self.by_lock.len()).max(SWEEP_MIN_LOCKS);
    }

    /// Lock `id`'s recorded tickets with their nodes, in ticket order (for monitoring and
    /// tests; may include tickets already passed if the record was not pruned since).
    pub fn of_lock(&self, id: u64) -> Vec<(u64, u32)> {
        self.by_lock
            .get(&id)
            .map(|q| q.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Number of locks with a record.
    pub fn locks(&self) -> usize {
        self.by_lock.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_prune_as_upper_passes() {
        let mut o = TicketOwners::new();
        o.record(7, 0, 1, 1, 0);
        o.record(7, 1, 2, 2, 0);
        o.record(7, 2, 1, 3, 0);
        assert_eq!(o.of_lock(7), vec![(0, 1), (1, 2), (2, 1)]);
        // Tickets 0 and 1 were released by FAA; the next record forgets them.
        o.record(7, 3, 3, 4, 2);
        assert_eq!(o.of_lock(7), vec![(2, 1), (3, 3)]);
        o.prune(7, 4, 4);
        assert_eq!(o.of_lock(7), vec![]);
        assert_eq!(o.locks(), 0, "an empty record is dropped");
    }

    #[test]
    fn take_node_returns_only_that_nodes_outstanding_tickets_once() {
        let mut o = TicketOwners::new();
        // Lock 1: node 5 holds ticket 10, node 6 queued 11, node 5 queued 12.
        o.record(1, 10, 5, 11, 10);
        o.record(1, 11, 6, 12, 10);
        o.record(1, 12, 5, 13, 10);
        // Lock 2: node 5's ticket 0 was already released (upper 1).
        o.record(2, 0, 5, 1, 0);
        let words = |id| if id == 1 { (13, 10) } else { (1, 1) };
        let got = o.take_node(5, usize::MAX, words);
        assert_eq!(
            got,
            vec![
                NodeTicket { id: 1, ticket: 10 },
                NodeTicket { id: 1, ticket: 12 }
            ]
        );
        assert_eq!(o.take_node(5, usize::MAX, words), vec![], "taken once");
        assert_eq!(o.of_lock(1), vec![(11, 6)], "other nodes' tickets stay");
        assert_eq!(o.of_lock(2), vec![], "released tickets are pruned");
        assert_eq!(
            o.take_node(6, usize::MAX, words),
            vec![NodeTicket { id: 1, ticket: 11 }]
        );
        assert_eq!(o.locks(), 0);
    }

    #[test]
    fn sweeps_keep_the_record_to_the_locks_still_queued() {
        let mut o = TicketOwners::new();
        // 1,000 locks each locked once and released (upper 1), lock 5 still held.
        let words = |id: u64| if id == 5 { (1, 0) } else { (1, 1) };
        for id in 0..1000 {
            o.record(id, 0, 1, 1, 0);
            o.sweep_if_large(words);
            assert!(
                o.locks() <= SWEEP_MIN_LOCKS + 1,
                "{} locks recorded",
                o.locks()
            );
        }
        assert_eq!(
            o.of_lock(5),
            vec![(0, 1)],
            "the held ticket survives sweeps"
        );
    }

    #[test]
    fn take_node_honours_its_limit() {
        let mut o = TicketOwners::new();
        for t in 0..5 {
            o.record(9, t, 4, t + 1, 0);
        }
        let words = |_| (5, 0);
        let first = o.take_node(4, 2, words);
        assert_eq!(
            first.iter().map(|n| n.ticket).collect::<Vec<_>>(),
            vec![0, 1]
        );
        let rest = o.take_node(4, 10, words);
        assert_eq!(
            rest.iter().map(|n| n.ticket).collect::<Vec<_>>(),
            vec![2, 3, 4]
        );
        assert_eq!(o.take_node(4, 10, words), vec![]);
    }

    #[test]
    fn outstanding_across_wraparound() {
        let mut o = TicketOwners::new();
        let base = u64::MAX - 1;
        o.record(3, base, 1, base.wrapping_add(1), base);
        o.record(3, base.wrapping_add(1), 2, base.wrapping_add(2), base);
        o.record(3, base.wrapping_add(2), 1, base.wrapping_add(3), base);
        // upper passed the first two (now 0 after wrapping); lower is 1.
        let got = o.take_node(1, usize::MAX, |_| (1, 0));
        assert_eq!(got, vec![NodeTicket { id: 3, ticket: 0 }]);
        assert_eq!(o.take_node(2, usize::MAX, |_| (1, 0)), vec![]);
    }
}
