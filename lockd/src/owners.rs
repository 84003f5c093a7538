//! Which node took each outstanding Takeout ticket, so the tickets of a failed node can be
//! passed on (Scythe 4.3's Takeout Lock; recovery in the manner of Lotus section 6:
//! the lock service keeps who holds what, so a
//! node's failure releases its locks without rebuilding any lock state).
//!
//! A ticket lock serves tickets in order, so a ticket whose client died stalls its lock
//! and every ticket behind it. The lock service's CPU sees every ticket taken (the Lock
//! RPC) but never its release (the holder's one-sided FAA of `upper`), so the record is
//! pruned lazily: a ticket before `upper` was released. A plain state machine: the words
//! and the time are passed in, the caller serializes access (the service's stripe mutex).
//!
//! **Owners carry incarnations** (the design's failure model): a ticket is recorded with
//! the [`Owner`] (node, incarnation) that took it and the Lock RPC's request tag, so that
//! a node restarted under the same id never has its live tickets handed over for its
//! dead predecessor's, and a client that gave up on a Lock RPC can claim exactly that
//! request's tickets ([`TicketOwners::abandon`]).
//!
//! **Handing over is not forgetting.** A ticket handed to a survivor
//! ([`TicketOwners::take_node`]) or back to its owner ([`TicketOwners::abandon`]) stays
//! recorded until `upper` passes it, i.e. until it really was passed on: if the reply
//! that carried it is lost, a later call hands it over again (after a lease, for
//! survivors, so that two survivors do not both pass it on).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Who took a ticket: a node and the incarnation of its process (a restarted node keeps
/// its id and gets a larger incarnation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Owner {
    /// Node id.
    pub node: u32,
    /// Incarnation of the node's process.
    pub incarnation: u64,
}

/// The incarnation this process's lock clients declare until the RPC layer names the
/// caller: the time of the first call, in microseconds since the Unix epoch (at least 1),
/// so a process restarted later under the same node id declares a larger one (unless the
/// clock is set back).
pub fn process_incarnation() -> u64 {
    static INC: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *INC.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| (d.as_micros() as u64).max(1))
    })
}

/// A ticket a node took and has not passed on yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeTicket {
    /// Lock id.
    pub id: u64,
    /// The ticket number (`lower` when it was taken).
    pub ticket: u64,
}

/// One recorded ticket.
#[derive(Clone, Copy, Debug)]
struct Rec {
    ticket: u64,
    owner: Owner,
    /// The tag of the Lock RPC that took it (unique per owner).
    seq: u64,
    /// When it was last handed over for passing on, if it was.
    handed_at: Option<Instant>,
}

/// A request a client gave up on before the service ran it: the service refuses it on
/// `id` when it arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tombstone {
    id: u64,
    owner: Owner,
    seq: u64,
}

/// What [`TicketOwners::abandon`] found for one lock of an abandoned request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Abandoned {
    /// The request took this ticket; its owner must pass it on.
    Ticket(NodeTicket),
    /// The request took no ticket here (it was refused, or has not run: it will be
    /// refused when it does).
    Nothing,
}

/// Outstanding tickets per lock, each with the owner that took it, in ticket order.
///
/// Memory stays proportional to the locks with outstanding tickets: a lock's record is
/// pruned when it is locked again, and once the record spans more than twice the locks
/// it held after the last sweep (at least [`SWEEP_MIN_LOCKS`]), [`Self::sweep_if_large`]
/// prunes them all (amortized O(1) per ticket). Tombstones are at most
/// [`TOMBSTONES_MAX`], the oldest dropped first.
#[derive(Debug)]
pub struct TicketOwners {
    by_lock: HashMap<u64, VecDeque<Rec>>,
    sweep_at: usize,
    tombstones: VecDeque<Tombstone>,
}

/// Locks a record may span before its first sweep.
pub const SWEEP_MIN_LOCKS: usize = 64;

/// Tombstones of abandoned requests kept per record; past it the oldest is dropped (a
/// request that arrives later than this many other abandoned requests is served, and its
/// ticket is then handed over by `release_node` once its node is declared dead).
pub const TOMBSTONES_MAX: usize = 64;

impl Default for TicketOwners {
    fn default() -> Self {
        Self {
            by_lock: HashMap::new(),
            sweep_at: SWEEP_MIN_LOCKS,
            tombstones: VecDeque::new(),
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

    /// Record that `owner` took `ticket` on lock `id` with the Lock RPC tagged `seq`,
    /// whose words are now `(lower, upper)` (after the ticket was taken, so
    /// `ticket < lower`). Tickets the lock already passed (before `upper`) are forgotten
    /// first.
    pub fn record(&mut self, id: u64, ticket: u64, owner: Owner, seq: u64, lower: u64, upper: u64) {
        let q = self.by_lock.entry(id).or_default();
        q.retain(|r| outstanding(r.ticket, lower, upper));
        q.push_back(Rec {
            ticket,
            owner,
            seq,
            handed_at: None,
        });
    }

    /// Whether `owner`'s Lock RPC tagged `seq` was abandoned on lock `id` before it ran
    /// ([`Self::abandon`] left a tombstone): then the service must refuse it there and
    /// change nothing. The tombstone is used up.
    pub fn take_tombstone(&mut self, id: u64, owner: Owner, seq: u64) -> bool {
        if self.tombstones.is_empty() {
            return false;
        }
        let t = Tombstone { id, owner, seq };
        match self.tombstones.iter().position(|x| *x == t) {
            Some(i) => {
                self.tombstones.remove(i);
                true
            }
            None => false,
        }
    }

    /// `owner` gave up on its Lock RPC tagged `seq`, which named lock `id`: if the request
    /// took a ticket there that is still outstanding, hand it back to the owner to pass
    /// on (it stays recorded until `upper` passes it, so a repeated call, after a lost
    /// reply, returns it again); otherwise leave a tombstone so that the request is
    /// refused if it still arrives. `words` gives `(lower, upper)` of lock `id`.
    pub fn abandon(
        &mut self,
        id: u64,
        owner: Owner,
        seq: u64,
        now: Instant,
        (lower, upper): (u64, u64),
    ) -> Abandoned {
        if let Some(q) = self.by_lock.get_mut(&id) {
            q.retain(|r| outstanding(r.ticket, lower, upper));
            if let Some(r) = q.iter_mut().find(|r| r.owner == owner && r.seq == seq) {
                r.handed_at = Some(now);
                return Abandoned::Ticket(NodeTicket {
                    id,
                    ticket: r.ticket,
                });
            }
        }
        let t = Tombstone { id, owner, seq };
        if !self.tombstones.contains(&t) {
            if self.tombstones.len() >= TOMBSTONES_MAX {
                self.tombstones.pop_front();
            }
            self.tombstones.push_back(t);
        }
        Abandoned::Nothing
    }

    /// Forget lock `id`'s tickets that are no longer outstanding given `(lower, upper)`.
    pub fn prune(&mut self, id: u64, lower: u64, upper: u64) {
        if let Some(q) = self.by_lock.get_mut(&id) {
            q.retain(|r| outstanding(r.ticket, lower, upper));
            if q.is_empty() {
                self.by_lock.remove(&id);
            }
        }
    }

    /// Hand over the outstanding tickets `owner` took, at most `max`, in (lock, ticket)
    /// order, for the caller to pass on. `words(id)` gives lock `id`'s current
    /// `(lower, upper)`; every lock's record is pruned on the way.
    ///
    /// A handed-over ticket stays recorded until `upper` passes it; it is handed over
    /// again only once `lease` passed since (`now` is the time of this call), so that a
    /// survivor whose reply was lost, or whose pass-on failed, gets it again later, and two
    /// survivors asking at once do not both pass it on. Tombstones of `owner` are dropped
    /// (its requests will not arrive any more, or will be handed over by a later call).
    pub fn take_node(
        &mut self,
        owner: Owner,
        max: usize,
        now: Instant,
        lease: Duration,
        mut words: impl FnMut(u64) -> (u64, u64),
    ) -> Vec<NodeTicket> {
        let mut out = Vec::new();
        self.tombstones.retain(|t| t.owner != owner);
        self.by_lock.retain(|&id, q| {
            let (lower, upper) = words(id);
            q.retain(|r| outstanding(r.ticket, lower, upper));
            for r in q.iter_mut() {
                if out.len() >= max {
                    break;
                }
                let due = r
                    .handed_at
                    .is_none_or(|at| now.saturating_duration_since(at) >= lease);
                if r.owner == owner && due {
                    r.handed_at = Some(now);
                    out.push(NodeTicket {
                        id,
                        ticket: r.ticket,
                    });
                }
            }
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
            q.retain(|r| outstanding(r.ticket, lower, upper));
            !q.is_empty()
        });
        self.sweep_at = (2 * self.by_lock.len()).max(SWEEP_MIN_LOCKS);
    }

    /// Lock `id`'s recorded tickets with their owners, in ticket order (for monitoring
    /// and tests; may include tickets already passed if the record was not pruned since).
    pub fn of_lock(&self, id: u64) -> Vec<(u64, Owner)> {
        self.by_lock
            .get(&id)
            .map(|q| q.iter().map(|r| (r.ticket, r.owner)).collect())
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

    const LEASE: Duration = Duration::from_secs(3600);

    fn own(node: u32) -> Owner {
        Owner {
            node,
            incarnation: 1,
        }
    }

    fn nodes(o: &TicketOwners, id: u64) -> Vec<(u64, u32)> {
        o.of_lock(id)
            .into_iter()
            .map(|(t, w)| (t, w.node))
            .collect()
    }

    #[test]
    fn records_prune_as_upper_passes() {
        let mut o = TicketOwners::new();
        o.record(7, 0, own(1), 0, 1, 0);
        o.record(7, 1, own(2), 0, 2, 0);
        o.record(7, 2, own(1), 0, 3, 0);
        assert_eq!(nodes(&o, 7), vec![(0, 1), (1, 2), (2, 1)]);
        // Tickets 0 and 1 were released by FAA; the next record forgets them.
        o.record(7, 3, own(3), 0, 4, 2);
        assert_eq!(nodes(&o, 7), vec![(2, 1), (3, 3)]);
        o.prune(7, 4, 4);
        assert_eq!(nodes(&o, 7), vec![]);
        assert_eq!(o.locks(), 0, "an empty record is dropped");
    }

    #[test]
    fn take_node_returns_only_that_nodes_outstanding_tickets_once() {
        let mut o = TicketOwners::new();
        // Lock 1: node 5 holds ticket 10, node 6 queued 11, node 5 queued 12.
        o.record(1, 10, own(5), 0, 11, 10);
        o.record(1, 11, own(6), 0, 12, 10);
        o.record(1, 12, own(5), 0, 13, 10);
        // Lock 2: node 5's ticket 0 was already released (upper 1).
        o.record(2, 0, own(5), 0, 1, 0);
        let words = |id| if id == 1 { (13, 10) } else { (1, 1) };
        let got = o.take_node(own(5), usize::MAX, Instant::now(), LEASE, words);
        assert_eq!(
            got,
            vec![
                NodeTicket { id: 1, ticket: 10 },
                NodeTicket { id: 1, ticket: 12 }
            ]
        );
        assert_eq!(
            o.take_node(own(5), usize::MAX, Instant::now(), LEASE, words),
            vec![],
            "taken once"
        );
        assert_eq!(
            nodes(&o, 1),
            vec![(10, 5), (11, 6), (12, 5)],
            "handed-over tickets stay recorded until passed on, other nodes' too"
        );
        assert_eq!(nodes(&o, 2), vec![], "released tickets are pruned");
        assert_eq!(
            o.take_node(own(6), usize::MAX, Instant::now(), LEASE, words),
            vec![NodeTicket { id: 1, ticket: 11 }]
        );
        // All three passed on: forgotten.
        o.prune(1, 13, 13);
        assert_eq!(o.locks(), 0);
    }

    #[test]
    fn sweeps_keep_the_record_to_the_locks_still_queued() {
        let mut o = TicketOwners::new();
        // 1,000 locks each locked once and released (upper 1), lock 5 still held.
        let words = |id: u64| if id == 5 { (1, 0) } else { (1, 1) };
        for id in 0..1000 {
            o.record(id, 0, own(1), 0, 1, 0);
            o.sweep_if_large(words);
            assert!(
                o.locks() <= SWEEP_MIN_LOCKS + 1,
                "{} locks recorded",
                o.locks()
            );
        }
        assert_eq!(
            nodes(&o, 5),
            vec![(0, 1)],
            "the held ticket survives sweeps"
        );
    }

    #[test]
    fn take_node_honours_its_limit() {
        let mut o = TicketOwners::new();
        for t in 0..5 {
            o.record(9, t, own(4), 0, t + 1, 0);
        }
        let words = |_| (5, 0);
        let first = o.take_node(own(4), 2, Instant::now(), LEASE, words);
        assert_eq!(
            first.iter().map(|n| n.ticket).collect::<Vec<_>>(),
            vec![0, 1]
        );
        let rest = o.take_node(own(4), 10, Instant::now(), LEASE, words);
        assert_eq!(
            rest.iter().map(|n| n.ticket).collect::<Vec<_>>(),
            vec![2, 3, 4]
        );
        assert_eq!(
            o.take_node(own(4), 10, Instant::now(), LEASE, words),
            vec![]
        );
    }

    #[test]
    fn outstanding_across_wraparound() {
        let mut o = TicketOwners::new();
        let base = u64::MAX - 1;
        o.record(3, base, own(1), 0, base.wrapping_add(1), base);
        o.record(
            3,
            base.wrapping_add(1),
            own(2),
            0,
            base.wrapping_add(2),
            base,
        );
        o.record(
            3,
            base.wrapping_add(2),
            own(1),
            0,
            base.wrapping_add(3),
            base,
        );
        // upper passed the first two (now 0 after wrapping); lower is 1.
        let got = o.take_node(own(1), usize::MAX, Instant::now(), LEASE, |_| (1, 0));
        assert_eq!(got, vec![NodeTicket { id: 3, ticket: 0 }]);
        assert_eq!(
            o.take_node(own(2), usize::MAX, Instant::now(), LEASE, |_| (1, 0)),
            vec![]
        );
    }

    #[test]
    fn a_handed_over_ticket_is_handed_over_again_after_the_lease_until_passed() {
        // The survivor's reply is lost: the ticket must not be gone with it.
        let mut o = TicketOwners::new();
        o.record(1, 0, own(5), 0, 1, 0);
        let t0 = Instant::now();
        let lease = Duration::from_secs(30);
        let first = o.take_node(own(5), 8, t0, lease, |_| (1, 0));
        assert_eq!(first, vec![NodeTicket { id: 1, ticket: 0 }]);
        assert_eq!(
            o.take_node(own(5), 8, t0 + Duration::from_secs(1), lease, |_| (1, 0)),
            vec![],
            "within the lease a second survivor does not get it too"
        );
        assert_eq!(
            o.take_node(own(5), 8, t0 + lease, lease, |_| (1, 0)),
            first,
            "after the lease it is handed over again"
        );
        // Passed on (upper moved past it): forgotten.
        assert_eq!(
            o.take_node(own(5), 8, t0 + 3 * lease, lease, |_| (1, 1)),
            vec![]
        );
        assert_eq!(o.locks(), 0);
    }

    #[test]
    fn take_node_hands_over_only_the_named_incarnation() {
        let mut o = TicketOwners::new();
        let old = Owner {
            node: 5,
            incarnation: 1,
        };
        let new = Owner {
            node: 5,
            incarnation: 2,
        };
        o.record(1, 0, old, 0, 1, 0);
        o.record(1, 1, new, 0, 2, 0);
        let got = o.take_node(old, 8, Instant::now(), LEASE, |_| (2, 0));
        assert_eq!(got, vec![NodeTicket { id: 1, ticket: 0 }]);
        let got = o.take_node(new, 8, Instant::now(), LEASE, |_| (2, 0));
        assert_eq!(got, vec![NodeTicket { id: 1, ticket: 1 }]);
    }

    #[test]
    fn an_abandoned_request_hands_back_its_ticket_or_is_refused_when_it_arrives() {
        let mut o = TicketOwners::new();
        let now = Instant::now();
        // Request 7 of node 5 ran on lock 1 before its owner gave up: the ticket is
        // handed back, and again if the first answer was lost.
        o.record(1, 0, own(5), 7, 1, 0);
        let t = Abandoned::Ticket(NodeTicket { id: 1, ticket: 0 });
        assert_eq!(o.abandon(1, own(5), 7, now, (1, 0)), t);
        assert_eq!(o.abandon(1, own(5), 7, now, (1, 0)), t);
        assert!(!o.take_tombstone(1, own(5), 7));
        // Request 8 had not run on lock 2: it is refused when it arrives, once.
        assert_eq!(o.abandon(2, own(5), 8, now, (0, 0)), Abandoned::Nothing);
        assert!(!o.take_tombstone(2, own(5), 9), "another request");
        assert!(!o.take_tombstone(2, own(6), 8), "another owner");
        assert!(o.take_tombstone(2, own(5), 8));
        assert!(!o.take_tombstone(2, own(5), 8), "used up");
        for seq in 0..2 * TOMBSTONES_MAX as u64 {
            o.abandon(3, own(5), 100 + seq, now, (0, 0));
        }
        assert_eq!(o.tombstones.len(), TOMBSTONES_MAX, "bounded");
    }
}
