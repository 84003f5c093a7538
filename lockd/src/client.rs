//! The per-thread client of a lock service, used by transaction coordinators
//! (Scythe 4.3, Fig. 14, client side).
//!
//! Locking is two steps: [`LockClient::lock`] takes tickets with one Lock RPC for all of a
//! transaction's locks on the node (step 1); each [`Ticket`] then waits to be served with
//! Hangout waits and one-sided READs of `upper` ([`Ticket::wait`], step 2). Unlocking is
//! [`Ticket::release`], one one-sided FAA of +1 on `upper`; a ticket dropped unreleased is
//! released by a coroutine of its own when its turn comes (see [`crate::ticket`]).
//!
//! **A Lock RPC given up on** (timed out, peer unreachable, a reply that cannot be
//! read) may still have been granted at the service, and then its tickets would be
//! owned by nobody and stall their locks. The client keeps such a request (its tag and
//! lock ids) and asks the service to abandon it ([`crate::wire::ABANDON_HANDLER`]): the
//! service returns the tickets the request took, which the client passes on as
//! [`LockClient::release_node`] does (wait for the turn, FAA `upper`), and refuses the
//! request if it arrives later. The ask is retried by a coroutine with backoff (one per
//! client; started again by the next [`LockClient::lock`] if it gave up), or at once by
//! [`LockClient::settle_abandoned`], until the service answers.
//!
//! **A restarted service** serves a fresh table under a new epoch; a request naming the
//! old epoch is refused ([`LockError::Restarted`]) and the client must
//! [`LockClient::reconnect`] (bounded backoff), re-reading the service's export. Tickets
//! of the old table cannot be passed on (their words died with it; their FAA fails).

use rrpc::NodeId;
use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rrpc::fabric::RemoteAddr;
use rrpc::node::NodeInfo;
use rrpc::runtime::{CallError, RpcError, ThreadCtx};

use crate::error::word;
pub use crate::owners::process_incarnation;
use crate::owners::Owner;
use crate::service::{LocksExport, EXPORT_NAME, RESTARTED_TAG, RESTARTING_TAG};
use crate::takeout::{SmoothedRtt, LOCK_STRIDE, QUEUED_TS_OFF, UPPER_OFF};
use crate::ticket::{Shared, RECONNECTING};
use crate::wire::{
    abandon_batch, encode_request, replies, tickets, AbandonRequest, AbandonRpc, LockRpc,
    ReleaseNodeRequest, ReleaseNodeRpc, ReleaseNodeWire, RequestHeader, MAX_ENTRIES,
};
use rrpc::typed::{Rpc, TypedCallError};

pub use crate::error::LockError;
pub use crate::takeout::{LockReply, Mode, RefuseReason};
pub use crate::ticket::Ticket;
pub use crate::wire::LockRequest;

/// How long a release waits with its lock's queue standing still (`upper` not moving)
/// before it reports the lock lost, and how long it retries after transport failures
/// (default of [`LockClient::set_release_wait`]).
pub const DEFAULT_RELEASE_WAIT: Duration = Duration::from_secs(10);

/// Most tickets of a failed node handed over by one release-node RPC (16 bytes each).
pub const RELEASE_NODE_BATCH: usize = 256;

/// A fresh Lock RPC tag, unique within this process.
fn next_seq() -> u64 {
    static SEQ: AtomicU64 = AtomicU64::new(1);
    SEQ.fetch_add(1, Ordering::Relaxed)
}

/// A Lock RPC this client gave up on, kept until the service has answered an abandon
/// for it.
#[derive(Clone, Debug)]
struct GivenUp {
    seq: u64,
    ids: Vec<u64>,
}

/// Delays between a client's attempts to abandon a given-up request, then to reconnect
/// ([`LockClient::reconnect`]): doubling from `first` up to `max`, at most `attempts`
/// tries in all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The first delay (default 10 ms).
    pub first: Duration,
    /// The largest delay (default 1 s).
    pub max: Duration,
    /// Attempts in all, at least 1 (default 10).
    pub attempts: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            first: Duration::from_millis(10),
            max: Duration::from_secs(1),
            attempts: 10,
        }
    }
}

impl RetryPolicy {
    /// The delay after failed attempt `k` (0-based).
    pub fn delay(&self, k: u32) -> Duration {
        let f = 1u32.checked_shl(k.min(31)).unwrap_or(u32::MAX);
        self.first
            .checked_mul(f)
            .map_or(self.max, |d| d.min(self.max))
    }
}

/// The [`LockError`] of a failed typed call: [`call_error`]'s for the call's own
/// failures, [`LockError::InvalidRequest`] for a request that does not encode,
/// [`LockError::Protocol`] for a reply that does not decode.
fn typed_call_error(e: TypedCallError) -> LockError {
    match e {
        TypedCallError::Call(e) => call_error(e),
        TypedCallError::Encode(e) => LockError::InvalidRequest(e.to_string()),
        TypedCallError::Decode(e) => LockError::Protocol(e.to_string()),
        e => LockError::Protocol(e.to_string()),
    }
}

/// The [`LockError`] of a failed call: a [`LockError::Restarted`] for the service's
/// refusal of another epoch, else [`LockError::Rpc`].
fn call_error(e: CallError) -> LockError {
    match &e {
        CallError::Remote { msg, .. } if msg.contains(RESTARTED_TAG) => {
            LockError::Restarted(msg.clone())
        }
        CallError::Remote { msg, .. } if msg.contains(RESTARTING_TAG) => {
            LockError::Restarting(msg.clone())
        }
        _ => LockError::Rpc(RpcError::Call(e)),
    }
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
    /// The incarnation its requests declare; `None`: the fabric's of the context each
    /// request is sent on ([`rrpc::fabric::Fabric::incarnation`]).
    incarnation: Option<u64>,
    /// Lock RPCs given up on whose tickets the service has not handed back yet.
    given_up: Rc<RefCell<Vec<GivenUp>>>,
    /// Whether a coroutine retries the abandons of `given_up`.
    retrying: Rc<Cell<bool>>,
    retry: RetryPolicy,
    /// Until when the service may be in its restart grace (from the export's
    /// `grace_ms`, counted from when this client was made); cleared once passed.
    grace_until: Cell<Option<std::time::Instant>>,
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
        let grace_until = (export.grace_ms > 0)
            .then(|| std::time::Instant::now() + Duration::from_millis(export.grace_ms));
        Ok(Self {
            export,
            shared: Shared {
                node: info.node,
                srtt: Rc::new(Cell::new(SmoothedRtt::default())),
                lag: Rc::new(Cell::new(SmoothedRtt::default())),
                lost: Rc::new(Cell::new(0)),
                release_wait: DEFAULT_RELEASE_WAIT,
                epoch: export.epoch,
                service_epoch: Rc::new(Cell::new(export.epoch)),
                heat: Rc::default(),
                keep_above,
            },
            incarnation: None,
            given_up: Rc::default(),
            retrying: Rc::default(),
            retry: RetryPolicy::default(),
            grace_until: Cell::new(grace_until),
        })
    }

    /// [`LockError::Restarting`] while the service may still be in its restart grace
    /// (see [`LocksExport::grace_ms`]): a Lock RPC would be refused, and a lock seen free
    /// may be held under a predecessor's ticket.
    fn check_grace(&self) -> Result<(), LockError> {
        let Some(until) = self.grace_until.get() else {
            return Ok(());
        };
        let now = std::time::Instant::now();
        if now >= until {
            self.grace_until.set(None);
            return Ok(());
        }
        Err(LockError::Restarting(format!(
            "{RESTARTING_TAG} grants resume in about {} ms (as this client counts)",
            until.duration_since(now).as_millis() + 1
        )))
    }

    /// The restart grace this client still assumes ([`LocksExport::grace_ms`]); zero once
    /// it has passed.
    pub fn grace_left(&self) -> Duration {
        self.grace_until.get().map_or(Duration::ZERO, |t| {
            t.saturating_duration_since(std::time::Instant::now())
        })
    }

    /// The incarnation this client declares in its requests. By default it declares its
    /// connection's: the incarnation of the fabric of the context a request is sent on
    /// ([`rrpc::fabric::Fabric::incarnation`], which the RPC layer announces at
    /// connection setup). The service owns tickets by the connection's identity whatever
    /// the payload declares ([`crate::service::LockTable::register`]), so setting another
    /// one changes nothing there; keep it equal to the fabric's.
    pub fn set_incarnation(&mut self, incarnation: u64) {
        self.incarnation = Some(incarnation);
    }

    /// The incarnation set by [`Self::set_incarnation`]; `None` when the client declares
    /// its connection's (the default).
    pub fn incarnation(&self) -> Option<u64> {
        self.incarnation
    }

    /// The owner this client's requests on `ctx` declare: `ctx`'s node, and the
    /// incarnation of [`Self::incarnation`] or else `ctx`'s fabric's.
    fn owner_on(&self, ctx: &ThreadCtx) -> Owner {
        owner_on(self.incarnation, ctx)
    }

    /// How abandons of given-up Lock RPCs and reconnects are retried (default
    /// [`RetryPolicy::default`]).
    pub fn set_retry(&mut self, p: RetryPolicy) {
        self.retry = p;
    }

    /// Lock RPCs given up on whose tickets the service has not handed back yet (for
    /// monitoring and tests).
    pub fn given_up(&self) -> usize {
        self.given_up.borrow().len()
    }

    /// The service's epoch, as its export names it.
    pub fn epoch(&self) -> u64 {
        self.export.epoch
    }

    /// Reconnect to the service at `addr` after it restarted (or its connection broke):
    /// re-read its export and switch to its new table, trying up to the retry policy's
    /// attempts with its doubling delays. Tickets of the old table are gone with it;
    /// given-up requests of the old epoch are forgotten, and the heat observed too.
    ///
    /// Errors: the last attempt's [`LockError::Rpc`] (the service did not come back in
    /// time) or [`LockError::Export`].
    pub async fn reconnect(
        &mut self,
        ctx: &Rc<ThreadCtx>,
        addr: SocketAddr,
    ) -> Result<(), LockError> {
        *self = self.reconnected(ctx, addr).await?;
        Ok(())
    }

    /// A client of the service now at `addr` with this one's settings (incarnation,
    /// release wait, retry policy), as [`Self::reconnect`] makes it; this one is left as
    /// it is. Given-up requests carry over only if the service's epoch did not change.
    ///
    /// Errors: as [`Self::reconnect`].
    pub async fn reconnected(
        &self,
        ctx: &Rc<ThreadCtx>,
        addr: SocketAddr,
    ) -> Result<LockClient, LockError> {
        // Releases of this lineage's tickets hold off until the epoch is known again;
        // a reconnect that fails (or is dropped) puts the old epoch back.
        struct Restore(Rc<Cell<u64>>, u64);
        impl Drop for Restore {
            fn drop(&mut self) {
                if self.0.get() == RECONNECTING {
                    self.0.set(self.1);
                }
            }
        }
        let service_epoch = self.shared.service_epoch.clone();
        let before = service_epoch.replace(RECONNECTING);
        let _restore = Restore(service_epoch.clone(), before);
        let mut k = 0;
        let info = loop {
            let r = ctx
                .reconnect(addr)
                .and_then(|_| ctx.connect_rpc(addr))
                .map_err(|e| LockError::Rpc(e.into()));
            match r {
                Ok(info) => break info,
                Err(e) if k + 1 >= self.retry.attempts.max(1) => return Err(e),
                Err(e) => {
                    tracing::debug!(error = %e, attempt = k, "lock service reconnect failed");
                    ctx.sleep(self.retry.delay(k)).await;
                    k += 1;
                }
            }
        };
        let mut fresh = Self::from_info(&info)?;
        service_epoch.set(fresh.export.epoch);
        fresh.shared.service_epoch = service_epoch;
        fresh.incarnation = self.incarnation;
        fresh.retry = self.retry;
        fresh.shared.release_wait = self.shared.release_wait;
        if fresh.export.epoch == self.export.epoch {
            fresh.given_up = self.given_up.clone();
            fresh.retrying = self.retrying.clone();
            fresh.shared.heat = self.shared.heat.clone();
            fresh.shared.lost = self.shared.lost.clone();
        }
        Ok(fresh)
    }

    /// Ask the service to abandon every Lock RPC this client gave up on, and pass on the
    /// tickets they took (each released by a coroutine of its own when its turn comes).
    /// Requests whose abandon fails stay for a later call. Returns the tickets handed
    /// back.
    ///
    /// Errors: the first failed abandon's [`LockError`].
    pub async fn settle_abandoned(&self, ctx: &Rc<ThreadCtx>) -> Result<u64, LockError> {
        self.settler().settle(ctx).await
    }

    fn settler(&self) -> Settler {
        Settler {
            export: self.export,
            shared: self.shared.clone(),
            incarnation: self.incarnation,
            given_up: self.given_up.clone(),
            retrying: self.retrying.clone(),
        }
    }

    /// Node id of the lock service.
    pub fn node(&self) -> NodeId {
        self.shared.node
    }

    /// How long a release waits with its lock's queue standing still before it reports
    /// the lock lost (a queue that moves is waited for as long as it moves), and how long
    /// it retries after transport failures (for tickets taken after this call).
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
        self.lock_inner(ctx, reqs, None).await.map(|(g, _)| g)
    }

    /// Whether the service serves [`Self::lock_read`] (it is hosted with the data it
    /// locks, a memory node's).
    pub fn serves_lock_read(&self) -> bool {
        self.export.lock_read
    }

    /// [`Self::lock`] of one lock with a read of its object
    /// ([`crate::wire::LOCK_READ_HANDLER`], Scythe 4.3's lock with the data): when the
    /// ticket is served at once, the service's host reads what `desc` names (opaque
    /// here) and the bytes come back with the grant; otherwise (queued behind others,
    /// refused) they are empty and the caller reads after its turn comes.
    ///
    /// Errors: as [`Self::lock`]; [`LockError::InvalidRequest`] when the service does
    /// not serve it ([`Self::serves_lock_read`]); [`LockError::Protocol`] for a reply
    /// without its lock part.
    pub async fn lock_read(
        &self,
        ctx: &Rc<ThreadCtx>,
        req: LockRequest,
        desc: &[u8; crate::wire::READ_DESC_BYTES],
    ) -> Result<(Grant, Vec<u8>), LockError> {
        if !self.export.lock_read {
            return Err(LockError::InvalidRequest(
                "this lock service does not serve lock-and-read (it holds no data)".into(),
            ));
        }
        let (mut g, read) = self.lock_inner(ctx, &[req], Some(desc)).await?;
        match g.pop() {
            Some(g) => Ok((g, read)),
            None => Err(LockError::Protocol(
                "a lock-and-read reply without its grant".into(),
            )),
        }
    }

    /// [`Self::lock`], or with `read` [`Self::lock_read`]: the grants, and the bytes
    /// read (empty without `read`).
    async fn lock_inner(
        &self,
        ctx: &Rc<ThreadCtx>,
        reqs: &[LockRequest],
        read: Option<&[u8; crate::wire::READ_DESC_BYTES]>,
    ) -> Result<(Vec<Grant>, Vec<u8>), LockError> {
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
        if !self.given_up.borrow().is_empty() {
            // In the background: a slow service is not asked more often for it.
            self.settler().spawn_retries(ctx, self.retry);
        }
        let hdr = RequestHeader {
            owner: self.owner_on(ctx),
            seq: next_seq(),
            epoch: self.export.epoch,
        };
        let mut buf = Vec::with_capacity(
            crate::wire::REQ_HEADER_BYTES + reqs.len() * crate::wire::REQ_ENTRY_BYTES,
        );
        encode_request(reqs, &hdr, &mut buf)
            .map_err(|e| LockError::InvalidRequest(e.to_string()))?;
        let handler = match read {
            Some(desc) => {
                buf.extend_from_slice(desc);
                crate::wire::LOCK_READ_HANDLER
            }
            None => LockRpc::ID,
        };
        let give_up = || {
            self.given_up.borrow_mut().push(GivenUp {
                seq: hdr.seq,
                ids: reqs.iter().map(|r| r.id).collect(),
            });
            self.settler().spawn_retries(ctx, self.retry);
        };
        let sent = std::time::Instant::now();
        let resp = match ctx.call(self.node(), handler, &buf).await {
            Ok(r) => r,
            // The handler ran and refused: nothing was granted.
            Err(e @ CallError::Remote { .. }) => return Err(call_error(e)),
            // Not sent at all.
            Err(e @ (CallError::TooLarge { .. } | CallError::NotConnected { .. })) => {
                return Err(call_error(e))
            }
            // Perhaps granted, the reply lost: claim what it took.
            Err(e) => {
                give_up();
                return Err(call_error(e));
            }
        };
        // A lock-and-read reply: the Lock RPC's reply behind its length, then the read.
        let (lock_part, read_part) = if read.is_some() {
            let len = resp
                .get(..4)
                .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize);
            match len.filter(|&n| 4 + n <= resp.len()) {
                Some(n) => (&resp[4..4 + n], &resp[4 + n..]),
                None => {
                    give_up();
                    return Err(LockError::Protocol(format!(
                        "a lock-and-read reply of {} bytes without its lock part",
                        resp.len()
                    )));
                }
            }
        } else {
            (&resp[..], &[][..])
        };
        // The reply is read in place and turned into grants without another allocation.
        let decoded = rrpc::typed::view_response::<LockRpc, _, _>(lock_part);
        let replies = match decoded
            .map_err(|e| e.to_string())
            .and_then(|b| replies(b, reqs.len()).map_err(|e| e.to_string()))
        {
            Ok(r) => {
                // The service served it: its grace, if any, is over.
                self.grace_until.set(None);
                r
            }
            Err(e) => {
                give_up();
                return Err(LockError::Protocol(e));
            }
        };
        let grants = replies
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
                        sent,
                    ))
                } else {
                    Grant::Refused(r)
                }
            })
            .collect();
        Ok((grants, read_part.to_vec()))
    }

    /// Pass on every outstanding ticket (held or queued) that the incarnation `dead` took
    /// on this lock service: the service hands them over
    /// ([`crate::wire::RELEASE_NODE_HANDLER`], at most [`RELEASE_NODE_BATCH`] per RPC
    /// until none are left) and this client releases each as its own [`Ticket`] would:
    /// wait for its turn (Hangout + READ of `upper`, see [`Self::release_wait`]), then
    /// FAA `upper` by one. Scythe 4.3's Takeout Lock with recovery in the manner of Lotus
    /// section 6. Returns the number of tickets passed on. Only `dead`'s incarnation is
    /// affected: a node restarted under the same id keeps its new tickets.
    ///
    /// The service keeps a handed-over ticket until `upper` passes it: if a reply is lost
    /// or a pass-on fails, calling again after the service's handover lease hands it over
    /// again (a call within the lease does not, so two survivors never both pass one on).
    ///
    /// Call it only for an incarnation that is dead and cut off from the service (its
    /// process killed, its QPs gone): a live one would release its tickets too, advancing
    /// `upper` twice for one ticket. When several nodes died, release them concurrently
    /// or in any order within the release wait: a queued ticket of one waits for the
    /// held ticket of another.
    ///
    /// Errors: [`LockError::Rpc`] when the service cannot be asked,
    /// [`LockError::Restarted`] when it restarted (the dead incarnation's tickets died
    /// with it), [`LockError::Protocol`] for a malformed reply, [`LockError::Lost`] for
    /// the first ticket that could not be passed on (the others were still attempted).
    pub async fn release_node(&self, ctx: &Rc<ThreadCtx>, dead: Owner) -> Result<u64, LockError> {
        let mut passed = 0;
        loop {
            let req = ReleaseNodeWire::new(&ReleaseNodeRequest {
                dead,
                max: RELEASE_NODE_BATCH,
                epoch: self.export.epoch,
                caller: self.owner_on(ctx),
            });
            let resp = ctx
                .call_typed::<ReleaseNodeRpc>(self.node(), &req)
                .await
                .map_err(typed_call_error)?;
            let taken = tickets(&resp);
            let n = taken.len();
            let releases = taken
                .into_iter()
                .map(|nt| handed_ticket(ctx, &self.export, &self.shared, nt).release());
            let mut first_err = None;
            for r in rrpc::runtime::join_all(releases).await {
                match r {
                    Ok(()) => passed += 1,
                    Err(e) => {
                        tracing::error!(node = dead.node, error = %e, "release_node: ticket lost");
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
    /// Errors: as [`Self::read_state`]; [`LockError::Restarting`] while the service may
    /// be in its restart grace ([`Self::grace_left`]), when a free lock proves nothing.
    pub async fn peek_state(&self, ctx: &ThreadCtx, id: u64) -> Result<LockState, LockError> {
        self.check_id(id)?;
        self.check_grace()?;
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

/// A ticket the service handed over to be passed on, as a [`Ticket`] whose release waits
/// for its turn. The ticket is outstanding, so `upper <= ticket`; claiming one ticket
/// ahead makes the first round READ `upper` rather than assume the turn.
fn handed_ticket(
    ctx: &Rc<ThreadCtx>,
    export: &LocksExport,
    shared: &Shared,
    nt: crate::owners::NodeTicket,
) -> Ticket {
    let reply = LockReply {
        granted_queue: true,
        reason: None,
        ticket: nt.ticket,
        upper: nt.ticket.wrapping_sub(1),
        queued_ts: 0,
    };
    let upper = export
        .table
        .at(nt.id.wrapping_mul(LOCK_STRIDE))
        .offset(UPPER_OFF);
    Ticket::new(
        ctx.clone(),
        shared.clone(),
        nt.id,
        upper,
        reply,
        std::time::Instant::now(),
    )
}

/// The owner a request sent on `ctx` declares: `ctx`'s node, and `incarnation` or else
/// `ctx`'s fabric's (see [`LockClient::incarnation`]).
fn owner_on(incarnation: Option<u64>, ctx: &ThreadCtx) -> Owner {
    let f = ctx.fabric();
    Owner {
        node: f.node().get(),
        incarnation: incarnation.unwrap_or_else(|| f.incarnation()),
    }
}

/// What abandoning given-up Lock RPCs needs of a client, owned, so a coroutine can do it.
struct Settler {
    export: LocksExport,
    shared: Shared,
    /// The client's incarnation, if set (see [`LockClient::incarnation`]; the node is the
    /// context's).
    incarnation: Option<u64>,
    given_up: Rc<RefCell<Vec<GivenUp>>>,
    /// Whether a retrying coroutine runs ([`Self::spawn_retries`]).
    retrying: Rc<Cell<bool>>,
}

impl Settler {
    /// Abandon every given-up request (taken out of the list while its abandon is in
    /// flight, so no two abandons of one request run at once and its tickets are passed
    /// on once); put back the ones whose abandon failed.
    async fn settle(&self, ctx: &Rc<ThreadCtx>) -> Result<u64, LockError> {
        let pending = std::mem::take(&mut *self.given_up.borrow_mut());
        let mut handed = 0;
        let mut first_err = None;
        for g in pending {
            match self.abandon(ctx, &g).await {
                Ok(n) => handed += n,
                Err(LockError::Restarted(m)) => {
                    // Its table is gone, and its tickets with it.
                    tracing::debug!(seq = g.seq, "given-up Lock RPC of a restarted service: {m}");
                }
                Err(e) => {
                    self.given_up.borrow_mut().push(g);
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(handed),
        }
    }

    /// One abandon RPC; the tickets it hands back are passed on by coroutines of their
    /// own (dropped [`Ticket`]s).
    async fn abandon(&self, ctx: &Rc<ThreadCtx>, g: &GivenUp) -> Result<u64, LockError> {
        let req = AbandonRequest {
            owner: owner_on(self.incarnation, ctx),
            seq: g.seq,
            epoch: self.export.epoch,
            ids: g.ids.clone(),
        };
        let req = abandon_batch(&req).map_err(|e| LockError::InvalidRequest(e.to_string()))?;
        let resp = ctx
            .call_typed::<AbandonRpc>(self.shared.node, &req)
            .await
            .map_err(typed_call_error)?;
        let taken = tickets(&resp);
        let n = taken.len() as u64;
        for nt in taken {
            tracing::debug!(
                lock = nt.id,
                ticket = nt.ticket,
                "passing on a given-up Lock RPC's ticket"
            );
            drop(handed_ticket(ctx, &self.export, &self.shared, nt));
        }
        Ok(n)
    }

    /// Retry [`Self::settle`] in a coroutine of its own until nothing is left, the
    /// service's epoch changed (its table and the requests' tickets are gone), or both
    /// the policy's attempts are used up and the client's release wait has passed since
    /// the first (the next [`LockClient::lock`] tries again): a given-up request that
    /// took a ticket stalls its lock until abandoned, also when no later Lock RPC comes.
    /// At most one such coroutine runs per client ([`Self::retrying`]).
    fn spawn_retries(self, ctx: &Rc<ThreadCtx>, p: RetryPolicy) {
        if self.retrying.replace(true) {
            return;
        }
        /// Clears the flag however the coroutine ends (also when it is dropped unrun).
        struct Running(Rc<Cell<bool>>);
        impl Drop for Running {
            fn drop(&mut self) {
                self.0.set(false);
            }
        }
        let running = Running(self.retrying.clone());
        let weak = Rc::downgrade(ctx);
        ctx.spawn(async move {
            let _running = running;
            let until = std::time::Instant::now() + self.shared.release_wait;
            for k in 0.. {
                let Some(ctx) = weak.upgrade() else { return };
                let epoch = self.shared.service_epoch.get();
                if self.given_up.borrow().is_empty()
                    || (epoch != self.export.epoch && epoch != RECONNECTING)
                    || (k >= p.attempts.max(1) && std::time::Instant::now() >= until)
                {
                    return;
                }
                if k > 0 {
                    ctx.sleep(p.delay(k - 1)).await;
                }
                match self.settle(&ctx).await {
                    Ok(_) if self.given_up.borrow().is_empty() => return,
                    Ok(_) => {}
                    Err(e) => tracing::debug!(error = %e, attempt = k, "abandon failed"),
                }
            }
        });
    }
}

/// A thread's lock client that follows the service at one bootstrap address across its
/// restarts, as `tso::TsoConn` follows an oracle: when a Lock RPC (or a one-sided
/// operation the caller reports through [`Self::failed`]) finds the service restarted
/// ([`LockError::Restarted`]) or gone ([`LockError::Rpc`] with the peer unreachable, not
/// connected or not answering in time), one coroutine reconnects with the client's
/// bounded backoff ([`LockClient::reconnected`]) while the others wait for it, and the
/// error goes back to the caller (its transaction aborts: its tickets died with the old
/// table); the next call runs on the new service. A service in its restart grace
/// ([`LockError::Restarting`]) is kept; the caller backs off a little before the error
/// returns, so that retries do not spin on the refusals.
pub struct LockConn {
    addr: SocketAddr,
    client: RefCell<Rc<LockClient>>,
    reconnecting: Cell<bool>,
    reconnects: Cell<u64>,
}

/// How long [`LockConn`] holds a caller back after a grace refusal.
const GRACE_BACKOFF: Duration = Duration::from_millis(5);

impl LockConn {
    /// Follow the service at `addr`, whose client now is `client`.
    pub fn new(addr: SocketAddr, client: LockClient) -> Self {
        Self {
            addr,
            client: RefCell::new(Rc::new(client)),
            reconnecting: Cell::new(false),
            reconnects: Cell::new(0),
        }
    }

    /// The client of the service as it is now (hold it only for one transaction).
    pub fn client(&self) -> Rc<LockClient> {
        self.client.borrow().clone()
    }

    /// Reconnections that found the service again so far.
    pub fn reconnects(&self) -> u64 {
        self.reconnects.get()
    }

    /// [`LockClient::lock`] on the current client; after a restart or a lost service,
    /// reconnect (see the type's docs) and return the error.
    ///
    /// Errors: as [`LockClient::lock`]; a failed reconnect is logged, and retried at the
    /// next failure.
    pub async fn lock(
        &self,
        ctx: &Rc<ThreadCtx>,
        reqs: &[LockRequest],
    ) -> Result<Vec<Grant>, LockError> {
        let c = self.client();
        match c.lock(ctx, reqs).await {
            Ok(g) => Ok(g),
            Err(e) => {
                self.failed(ctx, &c, &e).await;
                Err(e)
            }
        }
    }

    /// Report that an operation on `used` (a client this connection gave out) failed
    /// with `e`: if the service is gone or restarted, reconnect now, or wait for the
    /// coroutine that already does; after a grace refusal, back off briefly. Returns when
    /// the connection is usable again or the reconnect gave up (logged; the next failure
    /// tries again).
    pub async fn failed(&self, ctx: &Rc<ThreadCtx>, used: &Rc<LockClient>, e: &LockError) {
        if matches!(e, LockError::Restarting(_)) {
            ctx.sleep(GRACE_BACKOFF).await;
            return;
        }
        if !e.service_gone() || !Rc::ptr_eq(used, &self.client.borrow()) {
            // Not a loss, or the client was replaced since `used` was taken.
            return;
        }
        if self.reconnecting.replace(true) {
            while self.reconnecting.get() {
                ctx.sleep(Duration::from_millis(1)).await;
            }
            return;
        }
        /// Clears the flag however the reconnect ends (also when its coroutine is dropped).
        struct Clear<'a>(&'a Cell<bool>);
        impl Drop for Clear<'_> {
            fn drop(&mut self) {
                self.0.set(false);
            }
        }
        let _clear = Clear(&self.reconnecting);
        match used.reconnected(ctx, self.addr).await {
            Ok(fresh) => {
                tracing::info!(epoch = fresh.epoch(), "lock service reconnected");
                *self.client.borrow_mut() = Rc::new(fresh);
                self.reconnects.set(self.reconnects.get() + 1);
            }
            Err(r) => tracing::warn!(error = %r, "lock service reconnect failed"),
        }
    }
}
