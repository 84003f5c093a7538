//! The per-thread client of a lock service, used by transaction coordinators
//! (Scythe 4.3, Fig. 14, client side).
//!
//! Locking is two steps: [`LockClient::lock`] takes tickets with one Lock RPC for all of a
//! transaction's locks on the node (step 1), then [`LockClient::wait_granted`] waits for
//! each ticket to be served with Hangout waits and one-sided READs of `upper` (step 2).
//! [`LockClient::unlock`] is one one-sided FAA of +1 on `upper`.

use std::cell::Cell;
use std::time::{Duration, Instant};

use rrpc::fabric::RemoteAddr;
use rrpc::node::NodeInfo;
use rrpc::runtime::{RpcError, ThreadCtx};

use crate::service::{LocksExport, EXPORT_NAME};
use crate::takeout::{hangout, SmoothedRtt, LOCK_STRIDE, QUEUED_TS_OFF, UPPER_OFF};
use crate::wire::{decode_reply, encode_request, LOCK_HANDLER, MAX_ENTRIES};

pub use crate::takeout::{LockReply, Mode, RefuseReason};
pub use crate::wire::LockRequest;

/// Errors of lock-client operations.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// The RPC or one-sided operation failed (timeout, peer gone, remote handler error).
    #[error(transparent)]
    Rpc(#[from] RpcError),
    /// The service answered something this client cannot interpret, or the lock's words
    /// contradict the protocol (e.g. `upper` passed our ticket).
    #[error("lock protocol: {0}")]
    Protocol(String),
    /// The ticket was not served before the deadline. The ticket stays queued: the lock
    /// stalls at it until it is served and released, so the caller must still release it.
    #[error("lock {id}: ticket {ticket} not served before the deadline (upper {upper})")]
    WaitTimeout {
        /// Lock id.
        id: u64,
        /// Our ticket.
        ticket: u64,
        /// The last `upper` read.
        upper: u64,
    },
    /// The node exports no usable lock table.
    #[error("lock service export: {0}")]
    Export(String),
    /// The caller's request cannot be sent (no entries, more than 15, lock id outside the
    /// table).
    #[error("invalid lock request: {0}")]
    InvalidRequest(String),
}

/// A snapshot of a lock's three words, read by one 24-byte READ. Each word is read
/// atomically; the three are not one atomic snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockState {
    /// Next ticket.
    pub lower: u64,
    /// Ticket now served.
    pub upper: u64,
    /// Largest queued timestamp.
    pub queued_ts: u64,
}

impl LockState {
    /// Tickets queued or holding (`lower - upper`, wrapping): the object's heat.
    pub fn queued(&self) -> u64 {
        self.lower.wrapping_sub(self.upper)
    }
}

/// A thread's handle on one lock service node. Not `Sync`: one per runtime thread,
/// shared by its coroutines (e.g. through `Rc`).
pub struct LockClient {
    node: u32,
    export: LocksExport,
    srtt: Cell<SmoothedRtt>,
}

impl LockClient {
    /// A client for the lock service described by `info` (from `ThreadCtx::connect_rpc`).
    ///
    /// Errors: [`LockError::Export`] when the `"locks"` export is missing or inconsistent.
    pub fn from_info(info: &NodeInfo) -> Result<Self, LockError> {
        let export: LocksExport = info
            .export(EXPORT_NAME)
            .map_err(|e| LockError::Export(e.to_string()))?;
        if export.stride != LOCK_STRIDE {
            return Err(LockError::Export(format!(
                "stride {} bytes, this client speaks {LOCK_STRIDE}",
                export.stride
            )));
        }
        if export.n_locks == 0
            || export
                .n_locks
                .checked_mul(LOCK_STRIDE)
                .is_none_or(|b| b > export.table.len)
        {
            return Err(LockError::Export(format!(
                "{} locks do not fit a table of {} bytes",
                export.n_locks, export.table.len
            )));
        }
        Ok(Self {
            node: info.node,
            export,
            srtt: Cell::new(SmoothedRtt::default()),
        })
    }

    /// Node id of the lock service.
    pub fn node(&self) -> u32 {
        self.node
    }

    /// Number of locks in the service's table.
    pub fn n_locks(&self) -> u64 {
        self.export.n_locks
    }

    /// The service's export (table descriptor and watermarks).
    pub fn export(&self) -> &LocksExport {
        &self.export
    }

    /// Remote address of lock `id`'s first word (lower); upper is +8, queued_ts +16.
    /// `id` must be below [`Self::n_locks`] (an address past the table fails remotely).
    pub fn lock_addr(&self, id: u64) -> RemoteAddr {
        self.export.table.at(id.wrapping_mul(LOCK_STRIDE))
    }

    fn check_id(&self, id: u64) -> Result<(), LockError> {
        if id >= self.export.n_locks {
            return Err(LockError::InvalidRequest(format!(
                "lock id {id} outside a table of {} locks",
                self.export.n_locks
            )));
        }
        Ok(())
    }

    /// Step 1: one Lock RPC for all entries (1 to 15, distinct ids); replies in the same
    /// order. A reply with `granted_queue` holds a ticket that must eventually be released
    /// with [`Self::unlock`] after it is served.
    ///
    /// Errors: [`LockError::InvalidRequest`], [`LockError::Rpc`] (including the RPC
    /// timeout of the thread's runtime), [`LockError::Protocol`] for a malformed reply.
    pub async fn lock(
        &self,
        ctx: &ThreadCtx,
        reqs: &[LockRequest],
    ) -> Result<Vec<LockReply>, LockError> {
        if reqs.is_empty() || reqs.len() > MAX_ENTRIES {
            return Err(LockError::InvalidRequest(format!(
                "{} entries; a Lock RPC carries 1 to {MAX_ENTRIES}",
                reqs.len()
            )));
        }
        for (i, r) in reqs.iter().enumerate() {
            self.check_id(r.id)?;
            if reqs[..i].iter().any(|p| p.id == r.id) {
                return Err(LockError::InvalidRequest(format!(
                    "lock id {} twice in one request",
                    r.id
                )));
            }
        }
        let mut buf = Vec::with_capacity(reqs.len() * crate::wire::REQ_ENTRY_BYTES);
        encode_request(reqs, &mut buf).map_err(|e| LockError::InvalidRequest(e.to_string()))?;
        let resp = ctx.call(self.node, LOCK_HANDLER, &buf).await?;
        decode_reply(&resp, reqs.len()).map_err(|e| LockError::Protocol(e.to_string()))
    }

    /// Step 2: wait until lock `id` serves `ticket` (`upper == ticket`), starting from the
    /// `upper_seen` of the Lock RPC's reply. Each round sleeps a Hangout of
    /// (tickets ahead) x (smoothed RTT), capped at the deadline, then READs `upper`; every
    /// READ's round trip updates the smoothed RTT (alpha 0.9).
    ///
    /// Errors: [`LockError::WaitTimeout`] once `deadline` passes (the ticket stays queued;
    /// see the variant), [`LockError::Rpc`] when a READ fails, [`LockError::Protocol`]
    /// when `upper` is already past `ticket`, [`LockError::InvalidRequest`] for a bad id.
    pub async fn wait_granted(
        &self,
        ctx: &ThreadCtx,
        id: u64,
        ticket: u64,
        upper_seen: u64,
        deadline: Instant,
    ) -> Result<(), LockError> {
        self.check_id(id)?;
        let addr = self.lock_addr(id).offset(UPPER_OFF);
        let mut upper = upper_seen;
        loop {
            let ahead = ticket.wrapping_sub(upper);
            if ahead == 0 {
                return Ok(());
            }
            if ahead > u64::MAX / 2 {
                return Err(LockError::Protocol(format!(
                    "lock {id}: upper {upper} is past our ticket {ticket}"
                )));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(LockError::WaitTimeout { id, ticket, upper });
            }
            let wait = hangout(ahead, self.srtt.get().get()).min(deadline - now);
            if !wait.is_zero() {
                ctx.sleep(wait).await;
            }
            let start = quanta::Instant::now();
            let bytes = ctx.read(self.node, addr, 8).await?;
            self.sample_rtt(start.elapsed());
            upper = word(&bytes, 0)?;
        }
    }

    /// Unlock: one one-sided FAA of +1 on lock `id`'s `upper`. Only the holder (the
    /// ticket being served) may call it, exactly once per served ticket.
    ///
    /// Errors: [`LockError::Rpc`] when the FAA fails, [`LockError::InvalidRequest`].
    pub async fn unlock(&self, ctx: &ThreadCtx, id: u64) -> Result<(), LockError> {
        self.check_id(id)?;
        ctx.faa(self.node, self.lock_addr(id).offset(UPPER_OFF), 1)
            .await?;
        Ok(())
    }

    /// One READ of lock `id`'s lower, upper and queued_ts (24 bytes), as validation uses
    /// to detect "locked or queued by another". Its round trip updates the smoothed RTT.
    ///
    /// Errors: [`LockError::Rpc`], [`LockError::InvalidRequest`].
    pub async fn read_state(&self, ctx: &ThreadCtx, id: u64) -> Result<LockState, LockError> {
        self.check_id(id)?;
        let start = quanta::Instant::now();
        let b = ctx
            .read(self.node, self.lock_addr(id), (QUEUED_TS_OFF + 8) as usize)
            .await?;
        self.sample_rtt(start.elapsed());
        Ok(LockState {
            lower: word(&b, 0)?,
            upper: word(&b, 8)?,
            queued_ts: word(&b, 16)?,
        })
    }

    /// The current smoothed one-sided RTT to the service (zero before the first READ).
    pub fn srtt(&self) -> Duration {
        self.srtt.get().get()
    }

    fn sample_rtt(&self, d: Duration) {
        let mut s = self.srtt.get();
        s.update(d);
        self.srtt.set(s);
    }
}

fn word(b: &[u8], off: usize) -> Result<u64, LockError> {
    b.get(off..off + 8)
        .and_then(|w| w.try_into().ok())
        .map(u64::from_le_bytes)
        .ok_or_else(|| LockError::Protocol(format!("short READ of {} bytes", b.len())))
}
