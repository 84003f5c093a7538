//! The lock service: a table of Takeout Locks in one registered memory region, served by
//! the Lock RPC (Scythe 4.3, Fig. 14, server side).
//!
//! Lock `i` occupies [`LOCK_STRIDE`] bytes at offset `i * LOCK_STRIDE` of the table MR.
//! Clients READ the words and FAA `upper` one-sidedly; only the Lock RPC, on the
//! service's CPU, writes `lower` and `queued_ts`. Lock RPCs for the same lock on different
//! server threads are serialized by striped mutexes (lock id modulo [`STRIPES`]).

use std::sync::{Arc, Mutex};

use rrpc::fabric::{Fabric, FabricError, MemoryRegion, MrDesc};
use serde::{Deserialize, Serialize};

use crate::takeout::{
    lock_rpc, LockReply, Watermarks, LOCK_STRIDE, LOWER_OFF, QUEUED_TS_OFF, UPPER_OFF,
};
use crate::wire::{decode_request, encode_reply_entry, LockRequest, LOCK_HANDLER};

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

/// One cache line per stripe so neighbouring stripes do not share a line.
#[repr(align(64))]
#[derive(Default)]
struct Stripe(Mutex<()>);

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

    /// Run the Lock RPC body for one lock on this CPU (also the embedded, Lotus-style
    /// placement). Panics if `req.id >= n_locks` (callers decode with a bound check).
    pub fn lock_local(&self, req: &LockRequest) -> LockReply {
        assert!(req.id < self.n_locks, "lock id {} out of range", req.id);
        let base = (req.id * LOCK_STRIDE) as usize;
        let stripe = &self.stripes[(req.id % STRIPES as u64) as usize];
        // A poisoned stripe only means another handler panicked while holding it; the
        // words are still consistent (each store is a single atomic), so keep serving.
        let _g = stripe.0.lock().unwrap_or_else(|p| p.into_inner());
        lock_rpc(
            self.mr.atomic_u64(base + LOWER_OFF as usize),
            self.mr.atomic_u64(base + UPPER_OFF as usize),
            self.mr.atomic_u64(base + QUEUED_TS_OFF as usize),
            req.ts,
            req.mode,
            self.wm,
        )
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
        decode_request(req, self.n_locks, &mut reqs).map_err(|e| format!("lock RPC: {e}"))?;
        for r in &reqs {
            encode_reply_entry(&self.lock_local(r), out);
        }
        Ok(())
    }

    /// RPC handlers serving this table ([`LOCK_HANDLER`]).
    pub fn handlers(self: &Arc<Self>) -> rrpc::server::Handlers {
        let mut h = rrpc::server::Handlers::new();
        let me = self.clone();
        h.register(LOCK_HANDLER, move |req, out| me.handle(req, out));
        h
    }
}
