//! The per-thread client of a lock service, used by transaction coordinators
//! (Scythe 4.3, Fig. 14, client side).
//!
//! Locking is two steps: [`LockClient::lock`] takes tickets with one Lock RPC for all of a
//! transaction's locks on the node (step 1); each [`Ticket`] then waits to be served with
//! Hangout waits and one-sided READs of `upper` ([`Ticket::wait`], step 2). Unlocking is
//! [`Ticket::release`], one one-sided FAA of +1 on `upper`; a ticket dropped unreleased is
//! released by a coroutine of its own when its turn comes (see [`crate::ticket`]).

use rrpc::NodeId;
use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use rrpc::fabric::RemoteAddr;
use rrpc::node::NodeInfo;
use rrpc::runtime::ThreadCtx;

use crate::error::word;
use crate::service::{LocksExport, EXPORT_NAME};
use crate::takeout::{SmoothedRtt, LOCK_STRIDE, QUEUED_TS_OFF, UPPER_OFF};
use crate::ticket::Shared;
use crate::wire::{
    decode_node_tickets, decode_reply, encode_release_node, encode_request, LOCK_HANDLER,
    MAX_ENTRIES, RELEASE_NODE_HANDLER,
};

pub use crate::error::LockError;
pub use crate::takeout::{LockReply, Mode, RefuseReason};
pub use crate::ticket::Ticket;
pub use crate::wire::LockRequest;

/// How long a release waits for its ticket's turn before it reports the lock lost
/// (default of [`LockClient::set_release_wait`]).
pub const DEFAULT_RELEASE_WAIT: Duration = Duration::from_secs(10);

/// Most tickets of a failed node handed over by one release-node RPC (16 bytes each).
pub const RELEASE_NODE_BATCH: usize = 256;

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

/// The outcome of one entry of a Lock RPC.
#[must_use = "a queued ticket must be released"]
#[derive(Debug)]
pub enum Grant {
    /// A ticket was taken (the caller may already hold the lock: [`Ticket::is_served`]).
    Queued(Ticket),
    /// The request was refused ([`LockReply::reason`] says why); nothing to release.
    Refused(LockReply),
}

impl Grant {
    /// The ticket, or `None` for a refusal.
    pub fn ticket(self) -> Option<Ticket> {
        match self {
            Self::Queued(t) => Some(t),
            Self::Refused(_) => None,
        }
    }

    /// The service's reply for this entry.
    pub fn reply(&self) -> &LockReply {
        match self {
            Self::Queued(t) => t.reply(),
            Self::Refused(r) => r,
        }
    }
}

/// A thread's handle on one lock service node. Not `Sync`: one per runtime thread,
/// shared by its coroutines (e.g. through `Rc`).
pub struct LockClient {
    export: LocksExport,
    shared: Shared,
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
        let keep_above = export.cold_watermark;
        Ok(Self {
            export,
            shared: Shared {
                node: info.node,
                srtt: Rc::new(Cell::new(SmoothedRtt::default())),
                lag: Rc::new(Cell::new(SmoothedRtt::default())),
                lost: Rc::new(Cell::new(0)),
                release_wait: DEFAULT_RELEASE_WAIT,
                heat: Rc::default(),
                keep_above,
            },
        })
    }

    /// Node id of the lock service.
    pub fn node(&self) -> NodeId {
        self.shared.node
    }

    /// How long a release waits for its ticket's turn before it reports the lock lost
    /// (for tickets taken after this call).
    pub fn set_release_wait(&mut self, d: Duration) {
        self.shared.release_wait = d;
    }

    /// See [`Self::set_release_wait`]; default [`DEFAULT_RELEASE_WAIT`].
    pub fn release_wait(&self) -> Duration {
        self.shared.release_wait
    }

    /// Tickets dropped unreleased whose lock could not be passed on (their coroutine
    /// logged the cause).
    pub fn lost(&self) -> u64 {
        self.shared.lost.get()
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

    /// Step 1: one Lock RPC for all entries (1 to 15, distinct ids); one [`Grant`] per
    /// entry, in request order. Each queued [`Ticket`] must be released; if it is
    /// dropped instead, a coroutine spawned on `ctx`'s executor releases it when its
    /// turn comes.
    ///
    /// Errors: [`LockError::InvalidRequest`], [`LockError::Rpc`] (including the RPC
    /// timeout of the thread's runtime), [`LockError::Protocol`] for a malformed reply.
    pub async fn lock(
        &self,
        ctx: &Rc<ThreadCtx>,
        reqs: &[LockRequest],
    ) -> Result<Vec<Grant>, LockError> {
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
        encode_request(reqs, ctx.fabric().node().get(), &mut buf)
            .map_err(|e| LockError::InvalidRequest(e.to_string()))?;
        let resp = ctx.call(self.node(), LOCK_HANDLER, &buf).await?;
        let replies =
            decode_reply(&resp, reqs.len()).map_err(|e| LockError::Protocol(e.to_string()))?;
        Ok(replies
            .into_iter()
            .zip(reqs)
            .map(|(r, q)| {
                // Queued or holding after this request (ours included if granted).
                self.shared
                    .observe_heat(q.id, r.ahead() + u64::from(r.granted_queue));
                if r.granted_queue {
                    let upper = self.lock_addr(q.id).offset(UPPER_OFF);
                    Grant::Queued(Ticket::new(
                        ctx.clone(),
                        self.shared.clone(),
                        q.id,
                        upper,
                        r,
                    ))
                } else {
                    Grant::Refused(r)
                }
            })
            .collect())
    }

    /// Pass on every outstanding ticket (held or queued) that node `dead` took on this
    /// lock service: the service hands them over ([`crate::wire::RELEASE_NODE_HANDLER`],
    /// at most [`RELEASE_NODE_BATCH`] per RPC until none are left) and this client
    /// releases each as its own [`Ticket`] would: wait for its turn (Hangout + READ of
    /// `upper`, up to [`Self::release_wait`]), then FAA `upper` by one. Scythe 4.3's
    /// Takeout Lock with recovery in the manner of Lotus section 6. Returns the number
    /// of tickets passed on; a second call for the same node passes on none.
    ///
    /// Call it only for a node that is dead and cut off from the service (its process
    /// killed, its QPs gone): a live node would release its tickets too, advancing
    /// `upper` twice for one ticket. When several nodes died, release them concurrently
    /// or in any order within the release wait: a queued ticket of one waits for the
    /// held ticket of another.
    ///
    /// Errors: [`LockError::Rpc`] when the service cannot be asked,
    /// [`LockError::Protocol`] for a malformed reply, [`LockError::Lost`] for the first
    /// ticket that could not be passed on (the others were still attempted; handed-over
    /// tickets are not handed over again).
    pub async fn release_node(&self, ctx: &Rc<ThreadCtx>, dead: u32) -> Result<u64, LockError> {
        let mut passed = 0;
        loop {
            let req = encode_release_node(dead, RELEASE_NODE_BATCH as u32);
            let resp = ctx.call(self.node(), RELEASE_NODE_HANDLER, &req).await?;
            let taken =
                decode_node_tickets(&resp).map_err(|e| LockError::Protocol(e.to_string()))?;
            let n = taken.len();
            let releases = taken.into_iter().map(|nt| {
                // The ticket is outstanding, so `upper <= ticket`; claiming one ticket
                // ahead makes the first round READ `upper` rather than assume the turn.
                let reply = LockReply {
                    granted_queue: true,
                    reason: None,
                    ticket: nt.ticket,
                    upper: nt.ticket.wrapping_sub(1),
                    queued_ts: 0,
                };
                let upper = self.lock_addr(nt.id).offset(UPPER_OFF);
                Ticket::new(ctx.clone(), self.shared.clone(), nt.id, upper, reply).release()
            });
            let mut first_err = None;
            for r in rrpc::runtime::join_all(releases).await {
                match r {
                    Ok(()) => passed += 1,
                    Err(e) => {
                        tracing::error!(node = dead, error = %e, "release_node: ticket lost");
                        first_err.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = first_err {
                return Err(e);
            }
            if n < RELEASE_NODE_BATCH {
                return Ok(passed);
            }
        }
    }

    /// One READ of lock `id`'s lower, upper and queued_ts (24 bytes), as validation uses
    /// to detect "locked or queued by another". Its network round trip updates the
    /// smoothed RTT, the rest of its time the scheduling lag (see [`Self::srtt`]); the
    /// queue length it shows is recorded as the lock's heat ([`Self::heat`]).
    ///
    /// Errors: [`LockError::Rpc`], [`LockError::InvalidRequest`].
    pub async fn read_state(&self, ctx: &ThreadCtx, id: u64) -> Result<LockState, LockError> {
        self.check_id(id)?;
        let issued = std::time::Instant::now();
        let (b, timing) = ctx
            .read_timed(
                self.node(),
                self.lock_addr(id),
                (QUEUED_TS_OFF + 8) as usize,
            )
            .await?;
        self.shared
            .sample_poll(issued, timing, std::time::Instant::now());
        self.state_of(id, &b)
    }

    /// [`Self::read_state`] without the RTT sample: a plain READ that reads no clock, for
    /// the hot path (an OCC execution read checks its object's lock once per object).
    ///
    /// Errors: as [`Self::read_state`].
    pub async fn peek_state(&self, ctx: &ThreadCtx, id: u64) -> Result<LockState, LockError> {
        self.check_id(id)?;
        let b = ctx
            .read(
                self.node(),
                self.lock_addr(id),
                (QUEUED_TS_OFF + 8) as usize,
            )
            .await?;
        self.state_of(id, &b)
    }

    /// Decode a READ of lock `id`'s words and record its heat.
    fn state_of(&self, id: u64, b: &[u8]) -> Result<LockState, LockError> {
        let st = LockState {
            lower: word(b, 0)?,
            upper: word(b, 8)?,
            queued_ts: word(b, 16)?,
        };
        self.shared.observe_heat(id, st.queued());
        Ok(st)
    }

    /// How many of the locks `ids` are held or queued (`lower != upper`), read in READs
    /// of up to `max_bytes` of the table each (whole locks, at least one): for audits
    /// after a run, a table of millions of locks in a few hundred READs. Heat is not
    /// recorded.
    ///
    /// Errors: [`LockError::InvalidRequest`] for ids past the table, [`LockError::Rpc`].
    pub async fn count_busy(
        &self,
        ctx: &ThreadCtx,
        ids: std::ops::Range<u64>,
        max_bytes: usize,
    ) -> Result<u64, LockError> {
        if ids.end > self.export.n_locks {
            return Err(LockError::InvalidRequest(format!(
                "locks {ids:?} outside a table of {} locks",
                self.export.n_locks
            )));
        }
        let per_read = (max_bytes as u64 / LOCK_STRIDE).max(1);
        let mut busy = 0;
        let mut id = ids.start;
        while id < ids.end {
            let n = per_read.min(ids.end - id);
            let b = ctx
                .read(self.node(), self.lock_addr(id), (n * LOCK_STRIDE) as usize)
                .await?;
            for l in 0..n as usize {
                let at = l * LOCK_STRIDE as usize;
                busy += u64::from(word(&b, at)? != word(&b, at + UPPER_OFF as usize)?);
            }
            id += n;
        }
        Ok(busy)
    }

    /// Lock `id`'s heat as this client last observed it: tickets queued or holding
    /// (`lower - upper`), from a Lock RPC reply, a ticket's poll or [`Self::read_state`].
    /// `None` if never observed. A hint for the transaction layer (TOCC chooses hot mode
    /// by it), as old as the last observation.
    pub fn heat(&self, id: u64) -> Option<u64> {
        self.shared.heat.borrow().get(&id).copied()
    }

    /// The heat mode to lock `id` in, by its heat as this client last observed it
    /// ([`Self::heat`]; Scythe 4.2 and 4.3): [`Mode::Hot`] (TOCC) once more than the
    /// service's ColdWatermark tickets were queued, as a cold request would then be
    /// refused; [`Mode::Cold`] (OCC) otherwise, including a lock never observed.
    pub fn mode_for(&self, id: u64) -> Mode {
        match self.heat(id) {
            Some(h) if h > self.export.cold_watermark => Mode::Hot,
            _ => Mode::Cold,
        }
    }

    /// The current smoothed one-sided RTT to the service (Scythe 4.3, Equation 2, alpha
    /// 0.9; zero before the first READ): network only, from each READ's doorbell to the
    /// polling round that took its completion (`rrpc::runtime::ThreadCtx::read_timed`),
    /// without the time the polling coroutine waited to be scheduled.
    pub fn srtt(&self) -> Duration {
        self.shared.srtt.get().get()
    }

    /// The Hangout (Scythe 4.3, Equation 3) for `ahead` tickets ahead, as this client's
    /// tickets wait between polls: `ahead x (srtt + sched_lag)` (see [`crate::ticket`]).
    /// Also a sensible pause before retrying a refused Lock RPC, with the refusal's queue.
    pub fn hangout(&self, ahead: u64) -> Duration {
        self.shared.hangout(ahead)
    }

    /// The smoothed time a READ of this client spent waiting for the thread's scheduler
    /// (before its doorbell and after its completion), smoothed as [`Self::srtt`]. A
    /// Hangout is (tickets ahead) x (`srtt` + `sched_lag`): see [`crate::ticket`].
    pub fn sched_lag(&self) -> Duration {
        self.shared.lag.get().get()
    }
}
