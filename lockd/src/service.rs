//! The lock service: a table of Takeout Locks in one registered memory region, served by
//! the Lock RPC (Scythe 4.3, Fig. 14, server side).
//!
//! Lock `i` occupies [`LOCK_STRIDE`] bytes at offset `i * LOCK_STRIDE` of the table MR.
//! Clients READ the words and FAA `upper` one-sidedly; only the Lock RPC, on the
//! service's CPU, writes `lower` and `queued_ts`. Lock RPCs for the same lock on different
//! server threads are serialized by striped mutexes (lock id modulo [`STRIPES`]).
//!
//! Each stripe also records which owner (node, incarnation) took each outstanding ticket
//! ([`TicketOwners`]), so the tickets of a failed incarnation can be handed to a survivor
//! that passes them on ([`LockTable::take_node_tickets`], the release-node RPC
//! [`ReleaseNodeRpc`], [`crate::client::LockClient::release_node`]), and a client that
//! gave up on a Lock RPC can claim what it took ([`LockTable::abandon`], [`AbandonRpc`]).
//!
//! **What the service refuses** (an error reply; no lock changes):
//! - a Lock RPC whose timestamp is above what the oracle can have issued
//!   ([`LockTable::set_ts_bound`], [`DEFAULT_MAX_TS`]): one such request would raise a
//!   lock's `queued_ts` past every real timestamp and make it refuse all later requests
//!   (Fig. 14, line 5);
//! - a request naming another service epoch ([`LockTable::epoch`]): the caller still
//!   speaks to a predecessor of this service, whose table died with it
//!   ([`ServiceRefusal::Restarted`]);
//! - a request from an incarnation of a node older than one already seen
//!   ([`ServiceRefusal::StaleIncarnation`]).
//!
//! **One-sided operations of a predecessor's clients** cannot be refused by this CPU; they
//! fail instead: a restarted service registers its table as new memory regions, so the
//! FAA or READ of an old ticket names an rkey this process never registered (on shm, an
//! MR file of the dead incarnation) and completes in error. The epoch check covers the
//! RPCs, which would otherwise reach the new table through the same node id.
//!
//! **Who called.** Ticket ownership is a parameter of the handler bodies
//! ([`LockTable::handle_from`] and its siblings); the handlers this table registers take
//! it from the RPC layer: the node and incarnation the caller's connection announced at
//! setup, never a payload field (one registration site, [`LockTable::register`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rrpc::fabric::{Fabric, FabricError, MemoryRegion, MrDesc};
use serde::{Deserialize, Serialize};

use crate::owners::{Abandoned, NodeTicket, Owner, TicketOwners};
use crate::takeout::{
    lock_rpc, LockReply, Watermarks, LOCK_STRIDE, LOWER_OFF, QUEUED_TS_OFF, UPPER_OFF,
};
use crate::wire::{
    abandon_request, check_request, first_ts, lock_requests, node_tickets, replies, AbandonRpc,
    LockReplyEntry, LockRequest, LockRpc, NodeTickets, ReleaseNodeRpc, ReleaseNodeWire, WireError,
    LOCK_HANDLER, LOCK_READ_HANDLER, MAX_ENTRIES, READ_DESC_BYTES, REQ_ENTRY_BYTES,
    REQ_HEADER_BYTES,
};
use rrpc::typed::{encode_batch, Batch};
use zerocopy::little_endian::U64;
use zerocopy::FromZeros;

/// What a lock service hosted with the data reads for a lock-and-read request whose
/// ticket is served at once ([`crate::wire::LOCK_READ_HANDLER`]): given the request's
/// read descriptor, it appends the object's bytes to the reply (nothing when the
/// descriptor names nothing it holds). It runs on a server thread while the caller's
/// ticket holds the lock, so every writer of the object (each under its ticket) has
/// finished. A memory node reads its CVT and record so (Scythe 4.3).
pub type GrantReader = Arc<dyn Fn(&[u8; READ_DESC_BYTES], &mut Vec<u8>) + Send + Sync>;

/// Name under which [`LockTable::export`] is published in a node's exports.
pub const EXPORT_NAME: &str = "locks";
/// Number of mutex stripes serializing Lock RPCs on the same lock.
pub const STRIPES: usize = 1024;

/// What a lock service exports to its clients (JSON on the control plane).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocksExport {
    /// The lock-table MR.
    pub table: MrDesc,
    /// Number of locks in the table.
    pub n_locks: u64,
    /// Bytes per lock ([`LOCK_STRIDE`]).
    pub stride: u64,
    /// ColdWatermark the service applies (queued tickets).
    pub cold_watermark: u64,
    /// HotWatermark the service applies (queued tickets).
    pub hot_watermark: u64,
    /// The service's epoch ([`LockTable::epoch`]); 0 from a service that has none.
    #[serde(default)]
    pub epoch: u64,
    /// Milliseconds of the service's restart grace left when the export was made
    /// ([`LockTable::set_grace`]); 0 without one. A client that reads it treats the
    /// service as restarting for that long from when it connected (an over-estimate:
    /// exports are published at start), so that it does not validate against an empty
    /// table while a predecessor's tickets may still be in use.
    #[serde(default)]
    pub grace_ms: u64,
    /// The service also serves the lock-and-read RPC
    /// ([`crate::wire::LOCK_READ_HANDLER`]): it is hosted with the data it locks (a
    /// memory node's). False from a lockd node.
    #[serde(default)]
    pub lock_read: bool,
}

/// Largest Lock RPC timestamp a table accepts when nothing better is known
/// ([`LockTable::set_max_ts`]): `2^62 - 1`. The oracle's timestamps carry its epoch in the
/// high 16 bits (the `tso` crate's timestamp layout), so this admits every timestamp of
/// epochs below 16 384, i.e. oracles restarted fewer than 16 383 times, and refuses
/// `u64::MAX` and every value with either top bit set.
pub const DEFAULT_MAX_TS: u64 = (1 << 62) - 1;

/// How long a ticket handed to a survivor by [`LockTable::take_node_tickets`] is not
/// handed over again (default of [`LockTable::set_handover_lease`]): longer than a
/// client's default release wait, so that a survivor still passing it on is not joined
/// by another.
pub const DEFAULT_HANDOVER_LEASE: Duration = Duration::from_secs(30);

/// Text that starts the error reply of [`ServiceRefusal::Restarted`], by which a client
/// recognizes it.
pub const RESTARTED_TAG: &str = "lock service restarted:";
/// Prefix of the error a restarted service sends to a Lock RPC within its grace period
/// ([`LockTable::set_grace`]); clients retry later ([`crate::client::LockError::Restarting`]).
pub const RESTARTING_TAG: &str = "lock service restarting:";

/// Where a lock service learns the largest timestamp the oracle has issued (its high
/// mark), to refuse Lock RPC timestamps above it ([`LockTable::set_ts_bound`]).
pub trait TsBound: Send + Sync {
    /// The oracle's issued high mark now (for example its counter, read one-sidedly), or
    /// `None` when it cannot be learned at the moment.
    fn issued_high(&self) -> Option<u64>;
}

impl<F: Fn() -> Option<u64> + Send + Sync> TsBound for F {
    fn issued_high(&self) -> Option<u64> {
        self()
    }
}

/// Why the service refused a request as a whole (an error reply; no lock changed).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ServiceRefusal {
    /// The request is malformed.
    #[error("malformed request: {0}")]
    Wire(#[from] WireError),
    /// The request names a service epoch that is not this service's: the caller's export
    /// is from a predecessor that restarted; it must reconnect.
    #[error("{RESTARTED_TAG} epoch {service}, the request names {request}")]
    Restarted {
        /// This service's epoch.
        service: u64,
        /// The epoch the request names.
        request: u64,
    },
    /// A restarted service grants nothing until its grace period ends
    /// ([`LockTable::set_grace`]), so that every ticket of its predecessor has expired.
    #[error("{RESTARTING_TAG} grants resume in {remaining_ms} ms")]
    Restarting {
        /// Milliseconds of the grace period left (rounded up).
        remaining_ms: u64,
    },
    /// The caller is an incarnation of its node older than one the service has seen.
    #[error("node {node}: incarnation {incarnation} is older than {newest}, already seen")]
    StaleIncarnation {
        /// Node id.
        node: u32,
        /// The caller's incarnation.
        incarnation: u64,
        /// The newest incarnation seen for the node.
        newest: u64,
    },
    /// The payload names another node than the caller (the RPC layer's word wins).
    #[error("the request names node {declared}, the caller is node {caller}")]
    NodeMismatch {
        /// The node in the payload.
        declared: u32,
        /// The calling node.
        caller: u32,
    },
    /// A timestamp above what the oracle can have issued.
    #[error("timestamp {ts} is above the issued bound {bound}")]
    TimestampAboveBound {
        /// The request's timestamp.
        ts: u64,
        /// The bound it exceeds.
        bound: u64,
    },
}

/// Microseconds since the Unix epoch, at least 1: the epoch of a service whose caller
/// gave none ([`LockTable::new`]); larger at every restart on one host unless the clock
/// is set back.
pub fn clock_epoch() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| (d.as_micros() as u64).max(1))
}

/// Lock stripes of the newest incarnation seen per node.
const NODE_STRIPES: usize = 64;

/// The order in which the Lock RPCs that reach the service together are served.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LockOrder {
    /// As they arrive, each on the server thread that received it.
    Arrival,
    /// Scythe 4.4, Fig. 16: the Lock RPCs all server threads received since the last
    /// batch are sorted and served in timestamp order, so tickets of one lock go out in
    /// timestamp order and a request whose timestamp is older than a concurrent one's is
    /// not refused by `queued_ts` (Fig. 14, line 5) only because it arrived second.
    ///
    /// Scythe sorts by (object, timestamp); for requests on one lock each that is the
    /// same order on every lock. A transaction's request names all its locks on the node
    /// (with its one timestamp), and sorting it by its first lock would let it pass a
    /// newer request on its second lock, or fall behind one: sorting by timestamp alone
    /// keeps every lock's order. (SmallBank on OCC: 2,258 timestamp refusals in 5 s when
    /// sorted by first lock, none by timestamp alone.)
    #[default]
    Timestamp,
}

impl std::str::FromStr for LockOrder {
    type Err = String;

    /// `arrival` or `timestamp`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "arrival" => Ok(Self::Arrival),
            "timestamp" => Ok(Self::Timestamp),
            _ => Err(format!(
                "unknown lock order {s:?}: expected arrival or timestamp"
            )),
        }
    }
}

/// Errors creating a [`LockTable`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockTableError {
    /// The configuration is invalid (zero locks, table size overflow, watermarks).
    #[error("invalid lock table configuration: {0}")]
    Config(String),
    /// Registering the table memory failed.
    #[error("allocating the lock table: {0}")]
    Fabric(#[from] FabricError),
}

/// The sort key of [`LockOrder::Timestamp`]: `(0, timestamp of the first entry)`, so a
/// batch is served in timestamp order alone; `None` (an error reply) for a request too
/// short to have one.
fn sort_key(req: &[u8]) -> Option<(u64, u64)> {
    Some((0, first_ts(req)?))
}

/// One cache line per stripe so neighbouring stripes do not share a line. The mutex
/// serializes the stripe's Lock RPCs and guards its ticket owners.
#[repr(align(64))]
#[derive(Default)]
struct Stripe(Mutex<TicketOwners>);

/// A table of Takeout Locks in registered memory plus the Lock RPC that serves it.
pub struct LockTable {
    mr: MemoryRegion,
    n_locks: u64,
    wm: Watermarks,
    stripes: Box<[Stripe]>,
    epoch: u64,
    max_ts: u64,
    ts_bound: Option<Box<dyn TsBound>>,
    /// The largest high mark [`Self::ts_bound`] reported.
    ts_high: AtomicU64,
    ts_slack: u64,
    /// Newest incarnation seen per node, striped by node id.
    incarnations: Box<[RwLock<HashMap<u32, u64>>]>,
    handover_lease: Duration,
    /// Lock RPCs are refused before this instant ([`Self::set_grace`]).
    grants_from: Option<Instant>,
}

impl LockTable {
    /// Allocate a zeroed table of `n_locks` (at least 1) locks on `fabric`, taking
    /// `n_locks * 32` bytes of registered memory, in epoch [`clock_epoch`].
    ///
    /// Errors: [`LockTableError::Config`] for zero locks, a size overflow or
    /// `wm.cold > wm.hot`; [`LockTableError::Fabric`] when allocation fails.
    pub fn new(fabric: &Fabric, n_locks: u64, wm: Watermarks) -> Result<Self, LockTableError> {
        Self::with_epoch(fabric, n_locks, wm, clock_epoch())
    }

    /// [`Self::new`] in service epoch `epoch` (at least 1), which must be larger than
    /// every earlier incarnation's of this service (persisted, or from the caller's
    /// configuration): it goes out in the export and every request must name it, so a
    /// client of a predecessor is refused instead of acting on this table.
    ///
    /// Errors: as [`Self::new`]; [`LockTableError::Config`] for epoch 0.
    pub fn with_epoch(
        fabric: &Fabric,
        n_locks: u64,
        wm: Watermarks,
        epoch: u64,
    ) -> Result<Self, LockTableError> {
        if epoch == 0 {
            return Err(LockTableError::Config("epoch 0 is reserved".into()));
        }
        if n_locks == 0 {
            return Err(LockTableError::Config("at least one lock is needed".into()));
        }
        wm.validate().map_err(LockTableError::Config)?;
        let bytes = n_locks
            .checked_mul(LOCK_STRIDE)
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(|| {
                LockTableError::Config(format!("{n_locks} locks overflow the address space"))
            })?;
        // Clients READ `upper` and FAA it (unlock); `lower` and `queued_ts` are the
        // service CPU's. No peer may WRITE the table.
        let mr = fabric.alloc_mr_with(
            bytes,
            rrpc::fabric::RemoteAccess::READ | rrpc::fabric::RemoteAccess::ATOMIC,
        )?;
        let stripes = (0..STRIPES).map(|_| Stripe::default()).collect();
        Ok(Self {
            mr,
            n_locks,
            wm,
            stripes,
            epoch,
            max_ts: DEFAULT_MAX_TS,
            ts_bound: None,
            ts_high: AtomicU64::new(0),
            ts_slack: 0,
            incarnations: (0..NODE_STRIPES).map(|_| RwLock::default()).collect(),
            handover_lease: DEFAULT_HANDOVER_LEASE,
            grants_from: None,
        })
    }

    /// Refuse every Lock RPC for `grace` from now ([`ServiceRefusal::Restarting`]);
    /// release-node and abandon requests are served. A restarted service sets it so
    /// that its predecessor's tickets have expired before it grants a lock again: the
    /// clients of its predecessor that still hold served tickets cannot be refused (their
    /// one-sided writes go to the data, not here), but they act on a ticket only within
    /// its lease from the moment they sent its Lock RPC (txn's `TxnConfig::ticket_lease`,
    /// checked before a write-back). So the grace must be at least that lease; lockd's
    /// default is twice the coordinators' default.
    pub fn set_grace(&mut self, grace: Duration) {
        self.grants_from = Some(Instant::now() + grace);
    }

    /// The grace period left ([`Self::set_grace`]); zero once it ended.
    pub fn grace_left(&self) -> Duration {
        self.grants_from.map_or(Duration::ZERO, |t| {
            t.saturating_duration_since(Instant::now())
        })
    }

    /// The service epoch every request must name (or 0, unchecked).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Refuse Lock RPC timestamps above `max` whatever the oracle says (default
    /// [`DEFAULT_MAX_TS`]).
    pub fn set_max_ts(&mut self, max: u64) {
        self.max_ts = max;
    }

    /// Learn the oracle's issued high mark from `bound`: a Lock RPC timestamp above the
    /// last high mark learned makes the service ask `bound` again, and refuse the request
    /// if the timestamp is still above it. While `bound` answers `None`, only
    /// [`Self::set_max_ts`]'s limit applies.
    pub fn set_ts_bound(&mut self, bound: Box<dyn TsBound>) {
        self.ts_bound = Some(bound);
    }

    /// Accept timestamps up to `slack` above the last high mark learned from
    /// [`Self::set_ts_bound`] without asking again (default 0: ask for every timestamp
    /// above it). A larger slack asks the oracle less often, and lets a bogus timestamp
    /// raise a lock's `queued_ts` at most `slack` above the real ones (their requests are
    /// refused until the oracle has issued that many more).
    pub fn set_ts_slack(&mut self, slack: u64) {
        self.ts_slack = slack;
    }

    /// How long a ticket handed over by [`Self::take_node_tickets`] is not handed over
    /// again (default [`DEFAULT_HANDOVER_LEASE`]). Keep it above the release wait of the
    /// clients that call `release_node` ([`crate::client::LockClient::release_wait`]): a
    /// survivor still waiting for a ticket's turn when the lease ends would pass it on
    /// together with the next one.
    pub fn set_handover_lease(&mut self, lease: Duration) {
        self.handover_lease = lease;
    }

    /// Whether `ts` is at most what the oracle can have issued.
    fn check_ts(&self, ts: u64) -> Result<(), ServiceRefusal> {
        let above = |bound| ServiceRefusal::TimestampAboveBound { ts, bound };
        if ts > self.max_ts {
            return Err(above(self.max_ts));
        }
        let Some(src) = &self.ts_bound else {
            return Ok(());
        };
        if ts
            <= self
                .ts_high
                .load(Ordering::Acquire)
                .saturating_add(self.ts_slack)
        {
            return Ok(());
        }
        match src.issued_high() {
            Some(h) => {
                let h = self.ts_high.fetch_max(h, Ordering::AcqRel).max(h);
                if ts <= h.saturating_add(self.ts_slack) {
                    Ok(())
                } else {
                    Err(above(h))
                }
            }
            None => Ok(()),
        }
    }

    /// Note `owner` as seen; refuse it if a newer incarnation of its node was seen.
    fn check_incarnation(&self, owner: Owner) -> Result<(), ServiceRefusal> {
        let stripe = &self.incarnations[owner.node as usize % NODE_STRIPES];
        // The common case, the node's current incarnation again, under a shared lock
        // (server threads serving one node do not wait for each other).
        let seen = stripe.read().unwrap_or_else(|p| p.into_inner());
        if seen.get(&owner.node) == Some(&owner.incarnation) {
            return Ok(());
        }
        drop(seen);
        let mut seen = stripe.write().unwrap_or_else(|p| p.into_inner());
        let newest = seen.entry(owner.node).or_insert(owner.incarnation);
        if *newest > owner.incarnation {
            return Err(ServiceRefusal::StaleIncarnation {
                node: owner.node,
                incarnation: owner.incarnation,
                newest: *newest,
            });
        }
        *newest = owner.incarnation;
        Ok(())
    }

    /// The checks every request passes: its payload's node is the caller's (when the
    /// caller is known), it names this epoch, its incarnation is not stale.
    fn admit(
        &self,
        caller: Option<Owner>,
        declared: Owner,
        epoch: u64,
    ) -> Result<Owner, ServiceRefusal> {
        let owner = match caller {
            Some(c) if c.node != declared.node => {
                return Err(ServiceRefusal::NodeMismatch {
                    declared: declared.node,
                    caller: c.node,
                })
            }
            Some(c) => c,
            None => declared,
        };
        if epoch != 0 && epoch != self.epoch {
            return Err(ServiceRefusal::Restarted {
                service: self.epoch,
                request: epoch,
            });
        }
        self.check_incarnation(owner)?;
        Ok(owner)
    }

    /// Number of locks.
    pub fn n_locks(&self) -> u64 {
        self.n_locks
    }

    /// The watermarks applied by the Lock RPC.
    pub fn watermarks(&self) -> Watermarks {
        self.wm
    }

    /// The export clients need, as a typed value.
    pub fn locks_export(&self) -> LocksExport {
        LocksExport {
            table: self.mr.desc(),
            n_locks: self.n_locks,
            stride: LOCK_STRIDE,
            cold_watermark: self.wm.cold,
            hot_watermark: self.wm.hot,
            epoch: self.epoch,
            grace_ms: self.grace_left().as_nanos().div_ceil(1_000_000) as u64,
            lock_read: false,
        }
    }

    /// The export as JSON, to publish under [`EXPORT_NAME`] in the node's exports.
    pub fn export(&self) -> serde_json::Value {
        serde_json::to_value(self.locks_export()).expect("LocksExport serializes")
    }

    /// Run the Lock RPC body for one lock on this CPU for a caller on node `node` of this
    /// process (the embedded, Lotus-style placement: incarnation
    /// [`crate::owners::process_incarnation`], request tag 0), recording it as the owner
    /// of a ticket taken. No timestamp bound or epoch is
    /// checked: [`Self::handle_from`] does. Panics if `req.id >= n_locks` (callers decode
    /// with a bound check).
    pub fn lock_local(&self, req: &LockRequest, node: u32) -> LockReply {
        let owner = Owner {
            node,
            incarnation: crate::owners::process_incarnation(),
        };
        self.lock_entry(req, owner, 0)
    }

    /// One entry of a Lock RPC from `owner`'s request `seq`: refused without a change if
    /// the owner abandoned that request here already.
    fn lock_entry(&self, req: &LockRequest, owner: Owner, seq: u64) -> LockReply {
        assert!(req.id < self.n_locks, "lock id {} out of range", req.id);
        let base = (req.id * LOCK_STRIDE) as usize;
        let stripe = &self.stripes[(req.id % STRIPES as u64) as usize];
        // A poisoned stripe only means another handler panicked while holding it; the
        // words are still consistent (each store is a single atomic), and the owners'
        // record is at worst missing the ticket being recorded, so keep serving.
        let mut owners = stripe.0.lock().unwrap_or_else(|p| p.into_inner());
        let (lower, upper, queued_ts) = (
            self.mr.atomic_u64(base + LOWER_OFF as usize),
            self.mr.atomic_u64(base + UPPER_OFF as usize),
            self.mr.atomic_u64(base + QUEUED_TS_OFF as usize),
        );
        if owners.take_tombstone(req.id, owner, seq) {
            // Its caller gave up on it and passed nothing on: refuse it as the reply no
            // one reads (the reason is moot).
            let (lo, up) = (lower.load(Ordering::Acquire), upper.load(Ordering::Acquire));
            return LockReply {
                granted_queue: false,
                reason: Some(crate::takeout::RefuseReason::Timestamp),
                ticket: lo,
                upper: up,
                queued_ts: queued_ts.load(Ordering::Acquire),
            };
        }
        let r = lock_rpc(lower, upper, queued_ts, req.ts, req.mode, self.wm);
        if r.granted_queue {
            let lo = r.ticket.wrapping_add(1);
            owners.record(req.id, r.ticket, owner, seq, lo, r.upper);
            owners.sweep_if_large(|id| self.lower_upper(id));
        }
        r
    }

    /// Hand over the outstanding tickets (queued or holding) that `dead` took, at most
    /// `max` of them (call again until fewer come), in (lock, ticket) order. Whoever calls
    /// this must pass each returned ticket on, as
    /// [`crate::client::LockClient::release_node`] does (wait for its turn, FAA `upper`):
    /// the service's CPU never writes `upper` (the shared-word rule of
    /// [`crate::takeout`]).
    ///
    /// A ticket stays recorded until `upper` passes it: if the reply carrying it is lost
    /// or its pass-on fails, a call after the handover lease
    /// ([`Self::set_handover_lease`]) returns it again; a call within the lease does not
    /// (so two survivors do not both pass it on). Only `dead`'s incarnation is affected:
    /// a restarted node's tickets under a newer incarnation stay.
    ///
    /// Only for an incarnation known to be dead and cut off: a live one would release its
    /// tickets too, and `upper` would advance twice for one ticket.
    pub fn take_node_tickets(&self, dead: Owner, max: usize) -> Vec<NodeTicket> {
        let now = Instant::now();
        let mut out = Vec::new();
        for stripe in self.stripes.iter() {
            let mut owners = stripe.0.lock().unwrap_or_else(|p| p.into_inner());
            if out.len() >= max {
                break;
            }
            if owners.locks() == 0 {
                continue;
            }
            out.extend(
                owners.take_node(dead, max - out.len(), now, self.handover_lease, |id| {
                    self.lower_upper(id)
                }),
            );
        }
        out.sort_unstable();
        out
    }

    /// `owner` gave up on its Lock RPC tagged `seq`, which named the locks `ids`: return
    /// the tickets that request took (still outstanding), for the owner to pass on, and
    /// make the service refuse the request on the locks it has not reached yet. A repeated
    /// call (after a lost reply) returns the same tickets until they are passed on. Ids
    /// outside the table are skipped.
    pub fn abandon(&self, owner: Owner, seq: u64, ids: &[u64]) -> Vec<NodeTicket> {
        let now = Instant::now();
        let mut out = Vec::new();
        for &id in ids.iter().filter(|&&id| id < self.n_locks) {
            let stripe = &self.stripes[(id % STRIPES as u64) as usize];
            let mut owners = stripe.0.lock().unwrap_or_else(|p| p.into_inner());
            if let Abandoned::Ticket(t) = owners.abandon(id, owner, seq, now, self.lower_upper(id))
            {
                out.push(t);
            }
        }
        out
    }

    /// Lock `id`'s `(lower, upper)`.
    fn lower_upper(&self, id: u64) -> (u64, u64) {
        use std::sync::atomic::Ordering::Acquire;
        let base = (id * LOCK_STRIDE) as usize;
        (
            self.mr.atomic_u64(base + LOWER_OFF as usize).load(Acquire),
            self.mr.atomic_u64(base + UPPER_OFF as usize).load(Acquire),
        )
    }

    /// The owners recorded for lock `id`'s tickets, in ticket order, after forgetting the
    /// tickets already passed (for monitoring and tests). Panics if `id >= n_locks`.
    pub fn ticket_owners(&self, id: u64) -> Vec<(u64, Owner)> {
        let (lower, upper, _) = self.words(id);
        let stripe = &self.stripes[(id % STRIPES as u64) as usize];
        let mut owners = stripe.0.lock().unwrap_or_else(|p| p.into_inner());
        owners.prune(id, lower, upper);
        owners.of_lock(id)
    }

    /// Current `(lower, upper, queued_ts)` of lock `id`, read by this CPU (for tests and
    /// monitoring). Panics if `id >= n_locks`.
    pub fn words(&self, id: u64) -> (u64, u64, u64) {
        use std::sync::atomic::Ordering::Acquire;
        assert!(id < self.n_locks, "lock id {id} out of range");
        let base = (id * LOCK_STRIDE) as usize;
        (
            self.mr.atomic_u64(base + LOWER_OFF as usize).load(Acquire),
            self.mr.atomic_u64(base + UPPER_OFF as usize).load(Acquire),
            self.mr
                .atomic_u64(base + QUEUED_TS_OFF as usize)
                .load(Acquire),
        )
    }

    /// The Lock RPC handler body for a caller the RPC layer does not name: the owner of
    /// the tickets taken is the one the payload declares. See [`Self::handle_from`].
    pub fn handle(&self, req: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        self.serve_lock(None, req, out)
            .map_err(|e| format!("lock RPC: {e}"))
    }

    /// The Lock RPC handler body for a request from `caller`: decode `req`, check it
    /// ([`ServiceRefusal`]: the payload's node is `caller`'s, it names this epoch, the
    /// caller's incarnation is not stale, every timestamp is within the bound), then run
    /// every entry in order, `caller` owning the tickets taken, and append one reply entry
    /// each to `out`. A refused request is an `Err` (sent back to the caller as a remote
    /// error) and changes no lock.
    pub fn handle_from(&self, caller: Owner, req: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        self.serve_lock(Some(caller), req, out)
            .map_err(|e| format!("lock RPC: {e}"))
    }

    /// The lock-and-read body ([`crate::wire::LOCK_READ_HANDLER`]) for a request from
    /// `caller`: the Lock RPC of its one entry as [`Self::handle_from`] serves it, then,
    /// when that ticket is served at once, what `reader` reads for the request's read
    /// descriptor. Reply: `lock_len: u32` little-endian, the Lock RPC's reply, the
    /// reader's bytes.
    ///
    /// Errors: a request that is not one Lock RPC entry and a descriptor (nothing is
    /// taken), or as [`Self::handle_from`].
    pub fn handle_lock_read_from(
        &self,
        caller: Owner,
        req: &[u8],
        reader: &GrantReader,
        out: &mut Vec<u8>,
    ) -> Result<(), String> {
        let want = REQ_HEADER_BYTES + REQ_ENTRY_BYTES + READ_DESC_BYTES;
        if req.len() != want {
            return Err(format!(
                "lock and read: {} bytes; a request is one lock entry and a read \
                 descriptor, {want} bytes",
                req.len()
            ));
        }
        let (lock, desc) = req.split_at(req.len() - READ_DESC_BYTES);
        let desc: &[u8; READ_DESC_BYTES] = desc.try_into().expect("split at its length");
        let at = out.len();
        out.extend_from_slice(&[0; 4]);
        self.serve_lock(Some(caller), lock, out)
            .map_err(|e| format!("lock RPC: {e}"))?;
        let lock_len = out.len() - at - 4;
        out[at..at + 4].copy_from_slice(&(lock_len as u32).to_le_bytes());
        let served = rrpc::typed::view_response::<LockRpc, _, _>(&out[at + 4..])
            .ok()
            .and_then(|b| replies(b, 1).ok().and_then(|mut r| r.next()))
            .is_some_and(|r| r.holds_now());
        if served {
            reader(desc, out);
        }
        Ok(())
    }

    fn serve_lock(
        &self,
        caller: Option<Owner>,
        req: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), ServiceRefusal> {
        // The request is read in place and the reply entries go through the stack
        // straight into `out`: no allocation.
        let b =
            rrpc::typed::view_request::<LockRpc, _, _>(req).map_err(|e| WireError::BadLength {
                len: e.len,
                entry: REQ_ENTRY_BYTES,
            })?;
        let hdr = check_request(b, self.n_locks)?;
        let owner = self.admit(caller, hdr.owner, hdr.epoch)?;
        let left = self.grace_left();
        if !left.is_zero() {
            return Err(ServiceRefusal::Restarting {
                remaining_ms: left.as_nanos().div_ceil(1_000_000) as u64,
            });
        }
        for r in lock_requests(b, self.n_locks) {
            self.check_ts(r.ts)?;
        }
        let mut replies = [LockReplyEntry::new_zeroed(); MAX_ENTRIES];
        let mut n = 0;
        for (slot, r) in replies.iter_mut().zip(lock_requests(b, self.n_locks)) {
            *slot = LockReplyEntry::new(&self.lock_entry(&r, owner, hdr.seq));
            n += 1;
        }
        encode_batch(&(), &replies[..n], out);
        Ok(())
    }

    /// The release-node body ([`ReleaseNodeRpc`]) for a caller the RPC layer does not
    /// name. See [`Self::handle_release_node_from`].
    pub fn handle_release_node(&self, req: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        self.serve_release_node(None, req, out)
            .map_err(|e| format!("release node: {e}"))
    }

    /// The release-node body ([`ReleaseNodeRpc`]) for a request from `caller`: check it as
    /// [`Self::handle_from`] does (a caller from a stale incarnation is refused), hand
    /// over up to the request's limit of the named incarnation's outstanding tickets
    /// ([`Self::take_node_tickets`]) and encode them.
    ///
    /// Errors: a refused request (nothing is handed over).
    pub fn handle_release_node_from(
        &self,
        caller: Owner,
        req: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), String> {
        self.serve_release_node(Some(caller), req, out)
            .map_err(|e| format!("release node: {e}"))
    }

    fn serve_release_node(
        &self,
        caller: Option<Owner>,
        req: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), ServiceRefusal> {
        let req = rrpc::typed::decode_request::<ReleaseNodeRpc>(req).map_err(|e| {
            WireError::BadLength {
                len: e.len,
                entry: crate::wire::RELEASE_NODE_BYTES,
            }
        })?;
        let reply = self.release_node_typed(caller, &req)?;
        encode_reply::<ReleaseNodeRpc>(&reply, out);
        Ok(())
    }

    /// The [`ReleaseNodeRpc`] body: check the request, hand over the tickets.
    fn release_node_typed(
        &self,
        caller: Option<Owner>,
        req: &ReleaseNodeWire,
    ) -> Result<NodeTickets, ServiceRefusal> {
        let r = req.request()?;
        self.admit(caller, r.caller, r.epoch)?;
        Ok(node_tickets(&self.take_node_tickets(r.dead, r.max)))
    }

    /// The abandon body ([`AbandonRpc`]) for a caller the RPC layer does not name. See
    /// [`Self::handle_abandon_from`].
    pub fn handle_abandon(&self, req: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        self.serve_abandon(None, req, out)
            .map_err(|e| format!("abandon: {e}"))
    }

    /// The abandon body ([`AbandonRpc`]) for a request from `caller`: check it as
    /// [`Self::handle_from`] does, then [`Self::abandon`] the named request of `caller`'s
    /// and encode the tickets it took.
    ///
    /// Errors: a refused request (nothing changes).
    pub fn handle_abandon_from(
        &self,
        caller: Owner,
        req: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), String> {
        self.serve_abandon(Some(caller), req, out)
            .map_err(|e| format!("abandon: {e}"))
    }

    fn serve_abandon(
        &self,
        caller: Option<Owner>,
        req: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), ServiceRefusal> {
        let req =
            rrpc::typed::decode_request::<AbandonRpc>(req).map_err(|e| WireError::BadLength {
                len: e.len,
                entry: 8,
            })?;
        let reply = self.abandon_typed(caller, &req)?;
        encode_reply::<AbandonRpc>(&reply, out);
        Ok(())
    }

    /// The [`AbandonRpc`] body: check the request, abandon it, return its tickets.
    fn abandon_typed(
        &self,
        caller: Option<Owner>,
        req: &Batch<crate::wire::AbandonHead, U64>,
    ) -> Result<NodeTickets, ServiceRefusal> {
        let r = abandon_request(req)?;
        let owner = self.admit(caller, r.owner, r.epoch)?;
        Ok(node_tickets(&self.abandon(owner, r.seq, &r.ids)))
    }

    /// RPC handlers serving this table ([`LOCK_HANDLER`] in [`LockOrder::Arrival`],
    /// [`ReleaseNodeRpc`], [`AbandonRpc`]).
    pub fn handlers(self: &Arc<Self>) -> rrpc::server::Handlers {
        let mut h = rrpc::server::Handlers::new();
        self.register(&mut h, LockOrder::Arrival);
        h
    }

    /// Register this table's handlers on `h` (to serve it beside other services), the
    /// Lock RPC served in `order`.
    ///
    /// The one place where the service learns who called: the RPC layer names the
    /// caller the connection authenticated at setup (its node and incarnation), and the
    /// handler bodies (`*_from`) own tickets by it, never by what a payload declares.
    pub fn register(self: &Arc<Self>, h: &mut rrpc::server::Handlers, order: LockOrder) {
        self.register_with_reader(h, order, None);
    }

    /// [`Self::register`], and with `reader` the lock-and-read RPC
    /// ([`crate::wire::LOCK_READ_HANDLER`], in `order` too) of a service hosted with the
    /// data it locks.
    pub fn register_with_reader(
        self: &Arc<Self>,
        h: &mut rrpc::server::Handlers,
        order: LockOrder,
        reader: Option<GrantReader>,
    ) {
        let me = self.clone();
        match order {
            LockOrder::Arrival => {
                h.register_with_caller(LOCK_HANDLER, move |c, req, out| {
                    me.handle_from(caller_owner(c), req, out)
                });
            }
            LockOrder::Timestamp => {
                h.register_sorted_with_caller(LOCK_HANDLER, sort_key, move |batch, results| {
                    for r in batch {
                        let mut out = Vec::with_capacity(
                            r.payload.len() / REQ_ENTRY_BYTES * crate::wire::REPLY_ENTRY_BYTES,
                        );
                        results.push(
                            me.handle_from(caller_owner(r.caller), r.payload, &mut out)
                                .map(|()| out),
                        );
                    }
                });
            }
        }
        if let Some(reader) = reader {
            let me = self.clone();
            let serve = move |c, req: &[u8], out: &mut Vec<u8>| {
                me.handle_lock_read_from(caller_owner(c), req, &reader, out)
            };
            match order {
                LockOrder::Arrival => {
                    h.register_with_caller(LOCK_READ_HANDLER, serve);
                }
                // The descriptor follows the entry: the first entry's timestamp is
                // where a Lock RPC's is.
                // In the Lock RPC's sort group: one queue, one timestamp order.
                LockOrder::Timestamp => {
                    h.register_sorted_in(
                        LOCK_READ_HANDLER,
                        LOCK_HANDLER,
                        sort_key,
                        move |batch, results| {
                            for r in batch {
                                let mut out = Vec::with_capacity(256);
                                results.push(serve(r.caller, r.payload, &mut out).map(|()| out));
                            }
                        },
                    );
                }
            }
        }
        let me = self.clone();
        h.register_typed_with_caller::<ReleaseNodeRpc>(move |c, req| {
            me.release_node_typed(Some(caller_owner(c)), &req)
                .map_err(|e| format!("release node: {e}"))
        });
        let me = self.clone();
        h.register_typed_with_caller::<AbandonRpc>(move |c, req| {
            me.abandon_typed(Some(caller_owner(c)), &req)
                .map_err(|e| format!("abandon: {e}"))
        });
    }
}

/// Append `R`'s response `r` (a fixed layout: encoding cannot fail) to `out`.
fn encode_reply<R: rrpc::typed::Rpc>(r: &R::Resp, out: &mut Vec<u8>) {
    if let Err(e) = rrpc::typed::encode_response::<R>(r, out) {
        // Only a codec that can refuse a value fails; the lock service's are fixed layouts.
        tracing::error!(error = %e, "lock service reply");
    }
}

/// The owner the RPC layer authenticated for a call.
pub(crate) fn caller_owner(c: rrpc::server::Caller) -> Owner {
    Owner {
        node: c.node.get(),
        incarnation: c.incarnation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::takeout::Mode;
    use crate::wire::encode_request;

    #[test]
    fn timestamp_order_sorts_by_timestamp_alone() {
        let req = |id, ts| LockRequest {
            id,
            ts,
            mode: Mode::Hot,
        };
        let hdr = crate::wire::RequestHeader {
            owner: Owner {
                node: 1,
                incarnation: 1,
            },
            seq: 0,
            epoch: 0,
        };
        let mut a = Vec::new();
        encode_request(&[req(9, 10), req(2, 10)], &hdr, &mut a).unwrap();
        let mut b = Vec::new();
        encode_request(&[req(2, 12)], &hdr, &mut b).unwrap();
        // Sorted by first lock, b (lock 2) would go before a (lock 9) and a's entry on
        // lock 2 would be refused: by timestamp, a goes first.
        assert!(sort_key(&a).unwrap() < sort_key(&b).unwrap());
        assert_eq!(sort_key(&a[..39]), None, "too short to have a timestamp");
    }
}
