//! The lock service: a table of Takeout Locks in one registered memory region, served by
//! the Lock RPC (Scythe 4.3, Fig. 14, server side).
//!
//! Lock `i` occupies [`LOCK_STRIDE`] bytes at offset `i * LOCK_STRIDE` of the table MR.
//! Clients READ the words and FAA `upper` one-sidedly; only the Lock RPC, on the
//! service's CPU, writes `lower` and `queued_ts`. Lock RPCs for the same lock on different
//! server threads are serialized by striped mutexes (lock id modulo [`STRIPES`]).
//!
//! Each stripe also records which node took each outstanding ticket ([`TicketOwners`]),
//! so the tickets of a failed node can be handed to a survivor that passes them on
//! ([`LockTable::take_node_tickets`], the [`RELEASE_NODE_HANDLER`] RPC,
//! [`crate::client::LockClient::release_node`]).

use std::sync::{Arc, Mutex};

use rrpc::fabric::{Fabric, FabricError, MemoryRegion, MrDesc};
use serde::{Deserialize, Serialize};

use crate::owners::{NodeTicket, TicketOwners};
use crate::takeout::{
    lock_rpc, LockReply, Watermarks, LOCK_STRIDE, LOWER_OFF, QUEUED_TS_OFF, UPPER_OFF,
};
use crate::wire::{
    decode_release_node, decode_request, encode_node_tickets, encode_reply_entry, LockRequest,
    LOCK_HANDLER, RELEASE_NODE_HANDLER,
};

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
}

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
    let ts = u64::from_le_bytes(req.get(8..16)?.try_into().ok()?);
    Some((0, ts))
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
}

impl LockTable {
    /// Allocate a zeroed table of `n_locks` (at least 1) locks on `fabric`, taking
    /// `n_locks * 32` bytes of registered memory.
    ///
    /// Errors: [`LockTableError::Config`] for zero locks, a size overflow or
    /// `wm.cold > wm.hot`; [`LockTableError::Fabric`] when allocation fails.
    pub fn new(fabric: &Fabric, n_locks: u64, wm: Watermarks) -> Result<Self, LockTableError> {
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
        let mr = fabric.alloc_mr(bytes)?;
        let stripes = (0..STRIPES).map(|_| Stripe::default()).collect();
        Ok(Self {
            mr,
            n_locks,
            wm,
            stripes,
        })
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
        }
    }

    /// The export as JSON, to publish under [`EXPORT_NAME`] in the node's exports.
    pub fn export(&self) -> serde_json::Value {
        serde_json::to_value(self.locks_export()).expect("LocksExport serializes")
    }

    /// Run the Lock RPC body for one lock on this CPU for a caller on node `node` (also
    /// the embedded, Lotus-style placement), recording `node` as the owner of a ticket
    /// taken. Panics if `req.id >= n_locks` (callers decode with a bound check).
    pub fn lock_local(&self, req: &LockRequest, node: u32) -> LockReply {
        assert!(req.id < self.n_locks, "lock id {} out of range", req.id);
        let base = (req.id * LOCK_STRIDE) as usize;
        let stripe = &self.stripes[(req.id % STRIPES as u64) as usize];
        // A poisoned stripe only means another handler panicked while holding it; the
        // words are still consistent (each store is a single atomic), and the owners'
        // record is at worst missing the ticket being recorded, so keep serving.
        let mut owners = stripe.0.lock().unwrap_or_else(|p| p.into_inner());
        let r = lock_rpc(
            self.mr.atomic_u64(base + LOWER_OFF as usize),
            self.mr.atomic_u64(base + UPPER_OFF as usize),
            self.mr.atomic_u64(base + QUEUED_TS_OFF as usize),
            req.ts,
            req.mode,
            self.wm,
        );
        if r.granted_queue {
            owners.record(req.id, r.ticket, node, r.ticket.wrapping_add(1), r.upper);
            owners.sweep_if_large(|id| self.lower_upper(id));
        }
        r
    }

    /// Remove and return the outstanding tickets (queued or holding) that node `node`
    /// took, at most `max` of them (call again until fewer come), in (lock, ticket)
    /// order. Whoever calls this must pass each returned ticket
    /// on, as [`crate::client::LockClient::release_node`] does (wait for its turn, FAA
    /// `upper`): the service's CPU never writes `upper` (the shared-word rule of
    /// [`crate::takeout`]). A second call returns none of them again.
    ///
    /// Only for a node known to be dead and cut off: a live node would release its
    /// tickets too, and `upper` would advance twice for one ticket.
    pub fn take_node_tickets(&self, node: u32, max: usize) -> Vec<NodeTicket> {
        let mut out = Vec::new();
        for stripe in self.stripes.iter() {
            let mut owners = stripe.0.lock().unwrap_or_else(|p| p.into_inner());
            if out.len() >= max {
                break;
            }
            if owners.locks() == 0 {
                continue;
            }
            out.extend(owners.take_node(node, max - out.len(), |id| self.lower_upper(id)));
        }
        out.sort_unstable();
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

    /// The nodes recorded for lock `id`'s tickets, in ticket order, after forgetting the
    /// tickets already passed (for monitoring and tests). Panics if `id >= n_locks`.
    pub fn ticket_owners(&self, id: u64) -> Vec<(u64, u32)> {
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

    /// The Lock RPC handler body: decode `req`, run every entry in order, append one
    /// reply entry each to `out`. A malformed request is an `Err` (sent back to the
    /// caller as a remote error) and changes no lock.
    pub fn handle(&self, req: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        let mut reqs = Vec::with_capacity(crate::wire::MAX_ENTRIES);
        let node =
            decode_request(req, self.n_locks, &mut reqs).map_err(|e| format!("lock RPC: {e}"))?;
        for r in &reqs {
            encode_reply_entry(&self.lock_local(r, node), out);
        }
        Ok(())
    }

    /// The [`RELEASE_NODE_HANDLER`] body: take up to the request's limit of the named
    /// node's outstanding tickets ([`Self::take_node_tickets`]) and encode them.
    ///
    /// Errors: a malformed request (nothing is taken).
    pub fn handle_release_node(&self, req: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        let (node, max) = decode_release_node(req).map_err(|e| format!("release node: {e}"))?;
        let t = self.take_node_tickets(node, max);
        encode_node_tickets(&t, out);
        Ok(())
    }

    /// RPC handlers serving this table ([`LOCK_HANDLER`] in [`LockOrder::Arrival`],
    /// [`RELEASE_NODE_HANDLER`]).
    pub fn handlers(self: &Arc<Self>) -> rrpc::server::Handlers {
        let mut h = rrpc::server::Handlers::new();
        self.register(&mut h, LockOrder::Arrival);
        h
    }

    /// Register this table's handlers on `h` (to serve it beside other services), the
    /// Lock RPC served in `order`.
    pub fn register(self: &Arc<Self>, h: &mut rrpc::server::Handlers, order: LockOrder) {
        let me = self.clone();
        match order {
            LockOrder::Arrival => {
                h.register(LOCK_HANDLER, move |req, out| me.handle(req, out));
            }
            LockOrder::Timestamp => {
                h.register_sorted(LOCK_HANDLER, sort_key, move |batch, results| {
                    for r in batch {
                        let mut out = Vec::with_capacity(
                            r.payload.len() / crate::wire::REQ_ENTRY_BYTES
                                * crate::wire::REPLY_ENTRY_BYTES,
                        );
                        results.push(me.handle(r.payload, &mut out).map(|()| out));
                    }
                });
            }
        }
        let me = self.clone();
        h.register(RELEASE_NODE_HANDLER, move |req, out| {
            me.handle_release_node(req, out)
        });
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
        let mut a = Vec::new();
        encode_request(&[req(9, 10), req(2, 10)], 1, &mut a).unwrap();
        let mut b = Vec::new();
        encode_request(&[req(2, 12)], 1, &mut b).unwrap();
        // Sorted by first lock, b (lock 2) would go before a (lock 9) and a's entry on
        // lock 2 would be refused: by timestamp, a goes first.
        assert!(sort_key(&a).unwrap() < sort_key(&b).unwrap());
        assert_eq!(sort_key(&a[..15]), None, "too short to have a timestamp");
    }
}
