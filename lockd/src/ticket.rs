//! A taken Takeout ticket as a value that must be released (Scythe 4.3, Fig. 14, client
//! side: wait for `upper == ticket`, then unlock with a one-sided FAA of `upper`).
//!
//! A ticket lock serves tickets in order, so a ticket that is taken and never passed on
//! stalls its lock forever, and every ticket behind it. A [`Ticket`] therefore leaves
//! only by [`Ticket::release`] (wait for its turn if it has not come, then FAA `upper`)
//! or, on any other path (an early return, an error, a panic unwinding a coroutine), by
//! its `Drop`, which cannot await and so hands the same release to a coroutine of its
//! own on the thread's executor ([`ThreadCtx::spawn`]). A wait that times out keeps the
//! ticket, and its place in the queue, with the caller. A release waits as long as the
//! queue ahead of it moves and retries transport failures (see `release`); one that
//! cannot pass the lock on (the service is gone, or `upper` stood still for
//! [`crate::client::LockClient::release_wait`]) says so: [`LockError::Lost`], or for a
//! dropped ticket an error log and the client's [`crate::client::LockClient::lost`]
//! count. A ticket of a service epoch that ended is not released into the new table
//! that the same addresses name: its release stops with [`LockError::Restarted`].
//!
//! ## Round-trip samples
//!
//! How a poll's round trip is sampled (Scythe 4.3, Equations 2 and 3).
//!
//! A READ of `upper` goes through the thread's runtime: the coroutine queues the WR, the
//! executor runs the round's other coroutines and then posts every queued WR with one
//! doorbell, a later round takes the completion, and the coroutine resumes once the
//! executor gets to it. A clock read around the `await` measures all of that, and on a
//! busy thread most of it is time spent waiting for the scheduler, not the network.
//! `ThreadCtx::read_timed` returns when the doorbell rang and when the thread took the
//! completion ([`OpTiming`]), so each poll is split in two samples:
//!
//! - the **network round trip** `completed - posted` feeds the smoothed RTT of
//!   Equation 2 (alpha 0.9): [`crate::client::LockClient::srtt`] is the network's;
//! - the **scheduling lag**, the rest of `resumed - issued`, feeds a second estimate
//!   smoothed the same way ([`crate::client::LockClient::sched_lag`]).
//!
//! The Hangout of Equation 3 is `ahead x (srtt + lag)`: with an idle thread the lag is
//! near zero and this is the paper's `ahead x RTT`; on a busy thread a poll cannot
//! complete faster than the thread schedules it, so polling more often would only cost
//! READs and CPU. (This is why the lag term stays in the Hangout: a Hangout on the
//! network round trip alone polled several times as often and cost SmallBank a third of
//! its throughput on 2 cores.)

use rrpc::NodeId;
use std::cell::Cell;
use std::rc::{Rc, Weak};
use std::time::{Duration, Instant};

use rrpc::fabric::{RemoteAddr, WcStatus};
use rrpc::runtime::{OneSidedError, OpTiming, RpcError, ThreadCtx};

use crate::error::{word, LockError};
use crate::takeout::{hangout, LockReply, SmoothedRtt};

/// What a ticket and its client share: where `upper` is, the smoothed RTT and scheduling
/// lag that size Hangouts, and the count of tickets whose lock could not be passed on.
#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) node: NodeId,
    /// Smoothed network round trip of one-sided READs (Equation 2).
    pub(crate) srtt: Rc<Cell<SmoothedRtt>>,
    /// Smoothed time a poll spent waiting for its coroutine to run (module docs).
    pub(crate) lag: Rc<Cell<SmoothedRtt>>,
    pub(crate) lost: Rc<Cell<u64>>,
    pub(crate) release_wait: Duration,
    /// The service epoch whose table this client's tickets are in.
    pub(crate) epoch: u64,
    /// The epoch of the service the thread is connected to now, shared by a client and
    /// every client reconnected from it ([`crate::client::LockClient::reconnected`]):
    /// [`RECONNECTING`] while a reconnect is under way. A release goes on only while it
    /// equals [`Self::epoch`]: after a restart the same addresses name the new table.
    pub(crate) service_epoch: Rc<Cell<u64>>,
    /// Per lock id, the queue length (`lower - upper`: tickets queued or holding) last
    /// observed by a Lock RPC reply or a poll: the object's heat (Scythe 4.3, Equation 1).
    pub(crate) heat: Rc<std::cell::RefCell<std::collections::HashMap<u64, u64>>>,
    /// Heat above which an observation is kept when the heat map is full: the service's
    /// ColdWatermark, so hot objects are never forgotten.
    pub(crate) keep_above: u64,
}

/// [`Shared::service_epoch`] while the thread reconnects to the service (no service
/// serves in this epoch).
pub(crate) const RECONNECTING: u64 = u64::MAX;

/// Make room in a full heat map: forget every observation at or below `keep_above`
/// (cold objects), keep the hot ones; if the hot ones alone fill half the map, keep only
/// those above twice the threshold, and past that forget everything (heat is a hint).
fn forget_cold(h: &mut std::collections::HashMap<u64, u64>, keep_above: u64) {
    h.retain(|_, q| *q > keep_above);
    if h.len() >= HEAT_ENTRIES_MAX / 2 {
        h.retain(|_, q| *q > keep_above.saturating_mul(2));
    }
    if h.len() >= HEAT_ENTRIES_MAX / 2 {
        h.clear();
    }
}

/// The most one poll's sample may count for, as a multiple of the current estimate
/// (see [`Shared::sample_poll`]): enough for a real rise to pass within a few polls.
const SAMPLE_BOUND: u32 = 4;

/// Objects whose heat a client remembers; past it the cold observations are forgotten
/// all at once (heat is a hint, not state), the hot ones (above ColdWatermark) kept.
const HEAT_ENTRIES_MAX: usize = 1 << 16;

impl Shared {
    /// Record lock `id`'s observed queue length. An idle lock never seen busy is not
    /// recorded (absent means idle), so that the map holds only locks met busy.
    pub(crate) fn observe_heat(&self, id: u64, queued: u64) {
        let mut h = self.heat.borrow_mut();
        if queued == 0 {
            if let Some(q) = h.get_mut(&id) {
                *q = 0;
            }
            return;
        }
        if h.len() >= HEAT_ENTRIES_MAX && !h.contains_key(&id) {
            forget_cold(&mut h, self.keep_above);
        }
        h.insert(id, queued);
    }

    /// Fold in one READ: its network round trip into the smoothed RTT, and the rest of
    /// the time from the call to the coroutine's resumption into the scheduling lag.
    ///
    /// A sample counts as at most [`SAMPLE_BOUND`] times the current estimate (for the
    /// lag, times the larger of the lag and the round trip, since an idle thread's lag is
    /// near zero): a thread that was not running for a while inflates one sample by that
    /// long, and Equation 2 alone would carry it into every Hangout until many polls
    /// later (`SmoothedRtt::update_bounded`). Seen on a shared 2-core machine: a 2 ms
    /// network estimate for a 2 us READ, and Takeout's p99 in `lock-bench fairness` at
    /// 70 ms with 1000 locks at Zipf 0.5, where DSLR (fixed poll unit) had 0.3 ms.
    pub(crate) fn sample_poll(&self, issued: Instant, timing: OpTiming, resumed: Instant) {
        let net = timing.network();
        let total = resumed.saturating_duration_since(issued);
        let mut s = self.srtt.get();
        s.update_bounded(net, s.get().saturating_mul(SAMPLE_BOUND));
        self.srtt.set(s);
        let mut l = self.lag.get();
        let lag_bound = l.get().max(s.get()).saturating_mul(SAMPLE_BOUND);
        l.update_bounded(total.saturating_sub(net), lag_bound);
        self.lag.set(l);
    }

    /// The wait before the next poll with `ahead` tickets ahead (module docs).
    pub(crate) fn hangout(&self, ahead: u64) -> Duration {
        hangout(ahead, self.srtt.get().get() + self.lag.get().get())
    }
}

/// A ticket taken on lock `id`: the lock's queue holds this place until the ticket is
/// served and released. Not `Send` (it belongs to its thread's runtime).
#[must_use = "a ticket that is never released stalls its lock; call release()"]
pub struct Ticket {
    /// `None` once released (or handed to a release coroutine).
    state: Option<State>,
}

struct State {
    ctx: Rc<ThreadCtx>,
    shared: Shared,
    id: u64,
    /// Remote address of the lock's `upper` word.
    upper_addr: RemoteAddr,
    reply: LockReply,
    /// The last `upper` seen.
    upper: u64,
    /// When the Lock RPC that took the ticket was sent.
    requested: Instant,
}

impl Ticket {
    pub(crate) fn new(
        ctx: Rc<ThreadCtx>,
        shared: Shared,
        id: u64,
        upper_addr: RemoteAddr,
        reply: LockReply,
        requested: Instant,
    ) -> Self {
        debug_assert!(reply.granted_queue);
        Self {
            state: Some(State {
                ctx,
                shared,
                id,
                upper_addr,
                upper: reply.upper,
                reply,
                requested,
            }),
        }
    }

    /// When the Lock RPC that took this ticket was sent (before the service granted
    /// it). A holder that treats a ticket as a lease counts from here: a restarted
    /// service grants nothing for its grace period after its start
    /// ([`crate::service::LockTable::set_grace`]), so a ticket of its predecessor
    /// excludes others only until `requested + grace`, and one used within a shorter
    /// lease from `requested` is safe.
    pub fn requested_at(&self) -> Instant {
        self.st().requested
    }

    fn st(&self) -> &State {
        self.state.as_ref().expect("a live ticket has state")
    }

    /// The lock id.
    pub fn id(&self) -> u64 {
        self.st().id
    }

    /// The ticket number (`lower` when it was taken).
    pub fn number(&self) -> u64 {
        self.st().reply.ticket
    }

    /// The Lock RPC's reply that granted this ticket.
    pub fn reply(&self) -> &LockReply {
        &self.st().reply
    }

    /// True once `upper` was seen at this ticket: this ticket holds the lock.
    pub fn is_served(&self) -> bool {
        let s = self.st();
        s.upper == s.reply.ticket
    }

    /// Wait until this ticket holds the lock (`upper == ticket`). Each round sleeps a
    /// Hangout of (tickets ahead) x (smoothed RTT), capped at the deadline, then READs
    /// `upper`; every READ's round trip updates the smoothed RTT (alpha 0.9).
    ///
    /// Errors: [`LockError::WaitTimeout`] once `deadline` passes: the ticket keeps its
    /// place, so wait again or release it (which waits for its turn);
    /// [`LockError::Rpc`] when a READ fails; [`LockError::Protocol`] when `upper` is
    /// already past the ticket. The ticket stays with the caller in every case.
    pub async fn wait(&mut self, deadline: Instant) -> Result<(), LockError> {
        let s = self.state.as_mut().expect("a live ticket has state");
        wait_served(s, Some(deadline)).await
    }

    /// Pass the lock on: wait for this ticket's turn if it has not come (up to the
    /// client's release wait), then FAA `upper` by one. Consumes the ticket.
    ///
    /// Errors: [`LockError::Lost`] when the lock could not be passed on (the service is
    /// unreachable, the FAA failed, or the turn did not come in time); the cause is
    /// kept. The lock may then stay stalled at this ticket until the service recovers
    /// it.
    pub async fn release(mut self) -> Result<(), LockError> {
        let s = self.state.take().expect("a live ticket has state");
        release(s).await
    }
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.state {
            Some(s) => f
                .debug_struct("Ticket")
                .field("id", &s.id)
                .field("ticket", &s.reply.ticket)
                .field("upper_seen", &s.upper)
                .finish(),
            None => f.write_str("Ticket(released)"),
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let Some(s) = self.state.take() else { return };
        // Drop cannot await: a coroutine of its own waits for the turn and releases.
        // It holds the context weakly, so a context whose executor never runs again can
        // still be dropped (it logs the coroutine it never ran).
        let ctx: Weak<ThreadCtx> = Rc::downgrade(&s.ctx);
        let (shared, id, upper_addr, reply, upper, requested) = (
            s.shared.clone(),
            s.id,
            s.upper_addr,
            s.reply,
            s.upper,
            s.requested,
        );
        s.ctx.spawn(async move {
            let Some(ctx) = ctx.upgrade() else { return };
            let lost = shared.lost.clone();
            let st = State {
                ctx,
                shared,
                id,
                upper_addr,
                reply,
                upper,
                requested,
            };
            match release(st).await {
                Ok(()) => {}
                // The service died or restarted: the lock died with its table (still
                // counted: if the service never comes back, the lock is lost).
                Err(e) if e.service_gone() => {
                    lost.set(lost.get() + 1);
                    tracing::debug!(lock = id, ticket = reply.ticket, error = %e, "dropped ticket of a lost service");
                }
                Err(e) => {
                    lost.set(lost.get() + 1);
                    tracing::error!(lock = id, ticket = reply.ticket, error = %e, "dropped ticket: lock lost");
                }
            }
        });
        drop(s.ctx);
    }
}

/// Whether a one-sided operation on the service may go through if tried again: its QP
/// failed (the thread's pool connects another) or the connection is being made again
/// ([`crate::client::LockClient::reconnected`]). An access error is not: after a restart
/// the old table's rkey names nothing.
fn transient(e: &OneSidedError) -> bool {
    matches!(
        e,
        OneSidedError::NotConnected { .. }
            | OneSidedError::PeerGone { .. }
            | OneSidedError::Completion {
                status: WcStatus::Flushed | WcStatus::RetryExceeded,
                ..
            }
    )
}

/// First and largest pause between a release's tries after a transport failure.
const RETRY_FIRST: Duration = Duration::from_micros(50);
const RETRY_MAX: Duration = Duration::from_millis(5);

impl State {
    /// Whether this ticket's table is the one the thread is connected to: `Ok(true)`,
    /// `Ok(false)` while a reconnect is under way (wait), or [`LockError::Restarted`]
    /// once the service serves in another epoch (the ticket died with its table, and the
    /// same addresses now name the new one).
    fn table_is_current(&self) -> Result<bool, LockError> {
        match self.shared.service_epoch.get() {
            e if e == self.shared.epoch => Ok(true),
            RECONNECTING => Ok(false),
            e => Err(LockError::Restarted(format!(
                "lock {}: ticket {} of epoch {}, the service now serves epoch {e}",
                self.id, self.reply.ticket, self.shared.epoch
            ))),
        }
    }
}

async fn wait_served(s: &mut State, deadline: Option<Instant>) -> Result<(), LockError> {
    let (id, ticket) = (s.id, s.reply.ticket);
    loop {
        let ahead = ticket.wrapping_sub(s.upper);
        if ahead == 0 {
            return Ok(());
        }
        if ahead > u64::MAX / 2 {
            return Err(LockError::Protocol(format!(
                "lock {id}: upper {} is past our ticket {ticket}",
                s.upper
            )));
        }
        let now = Instant::now();
        let mut wait = s.shared.hangout(ahead);
        if let Some(d) = deadline {
            if now >= d {
                return Err(LockError::WaitTimeout {
                    id,
                    ticket,
                    upper: s.upper,
                });
            }
            wait = wait.min(d - now);
        }
        if !wait.is_zero() {
            s.ctx.sleep(wait).await;
        }
        if !s.table_is_current()? {
            // Reconnecting: poll again once the epoch is known.
            s.ctx.sleep(RETRY_MAX).await;
            continue;
        }
        // `lower` and `upper` in one 16-byte READ (the words stay separate for their
        // writers): the turn and the queue length behind it, the lock's heat.
        let lower_addr = RemoteAddr {
            addr: s.upper_addr.addr - crate::takeout::UPPER_OFF + crate::takeout::LOWER_OFF,
            rkey: s.upper_addr.rkey,
        };
        // The network round trip and the scheduling lag, apart (module docs).
        let issued = Instant::now();
        let (bytes, timing) = s.ctx.read_timed(s.shared.node, lower_addr, 16).await?;
        s.shared.sample_poll(issued, timing, Instant::now());
        let lower = word(&bytes, 0)?;
        s.upper = word(&bytes, 8)?;
        s.shared.observe_heat(id, lower.wrapping_sub(s.upper));
    }
}

/// One pause while the thread reconnects to the service; [`LockError::WaitTimeout`]
/// once `deadline` has passed.
async fn reconnect_pause(s: &State, deadline: Instant) -> Result<(), LockError> {
    if Instant::now() >= deadline {
        return Err(LockError::WaitTimeout {
            id: s.id,
            ticket: s.reply.ticket,
            upper: s.upper,
        });
    }
    s.ctx.sleep(RETRY_MAX).await;
    Ok(())
}

/// Pass the lock on (Scythe 4.3, Fig. 14: wait for `upper == ticket`, FAA `upper`).
///
/// A ticket that is given up stalls its lock and every ticket behind it, so a release
/// gives up only when it must:
/// - the wait goes on while the queue moves: it fails only after the client's release
///   wait passes with `upper` standing still (a slow but moving queue is not a lost
///   lock);
/// - a READ or the FAA that fails on a transport error (a broken QP, a reconnect under
///   way) is tried again, with pauses from 50 us to 5 ms, within the same window; the
///   FAA is not blindly repeated: only this ticket's holder moves `upper` off
///   `ticket`, so a READ of `upper` tells whether a failed FAA took effect;
/// - a ticket of a service epoch that ended stops at once ([`LockError::Restarted`]).
async fn release(mut s: State) -> Result<(), LockError> {
    let (id, ticket) = (s.id, s.reply.ticket);
    let lost = |cause: LockError| LockError::Lost {
        id,
        ticket,
        cause: Box::new(cause),
    };
    let window = s.shared.release_wait;
    let mut deadline = Instant::now() + window;
    let mut pause = RETRY_FIRST;
    let mut seen = s.upper;
    // 1. The turn.
    loop {
        match wait_served(&mut s, Some(deadline)).await {
            Ok(()) => break,
            Err(LockError::WaitTimeout { .. }) if s.upper != seen => {
                seen = s.upper;
                deadline = Instant::now() + window;
            }
            Err(LockError::Rpc(RpcError::OneSided(e)))
                if transient(&e) && Instant::now() < deadline =>
            {
                tracing::debug!(lock = id, ticket, error = %e, "release: poll retried");
                s.ctx.sleep(pause).await;
                pause = (pause * 2).min(RETRY_MAX);
            }
            Err(e) => return Err(lost(e)),
        }
    }
    // 2. The FAA, and after a failed one, whether it took effect.
    loop {
        if !s.table_is_current().map_err(lost)? {
            reconnect_pause(&s, deadline).await.map_err(lost)?;
            continue;
        }
        let e = match s.ctx.faa(s.shared.node, s.upper_addr, 1).await {
            Ok(_) => return Ok(()),
            Err(e) if transient(&e) && Instant::now() < deadline => e,
            Err(e) => return Err(lost(e.into())),
        };
        tracing::debug!(lock = id, ticket, error = %e, "release: FAA retried");
        loop {
            s.ctx.sleep(pause).await;
            pause = (pause * 2).min(RETRY_MAX);
            if !s.table_is_current().map_err(lost)? {
                reconnect_pause(&s, deadline).await.map_err(lost)?;
                continue;
            }
            match s.ctx.read(s.shared.node, s.upper_addr, 8).await {
                Ok(b) => {
                    s.upper = word(&b, 0).map_err(lost)?;
                    break;
                }
                Err(e) if transient(&e) && Instant::now() < deadline => {}
                Err(e) => return Err(lost(e.into())),
            }
        }
        if s.upper != ticket {
            // Only this ticket's FAA moves `upper` off it: the failed one took effect.
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn a_full_heat_map_forgets_cold_objects_and_keeps_hot_ones() {
        let mut h: HashMap<u64, u64> = (0..HEAT_ENTRIES_MAX as u64).map(|i| (i, 1)).collect();
        h.insert(7, 12); // hot: above ColdWatermark 3
        h.insert(9, 4);
        h.insert(11, 3); // at the watermark: cold
        forget_cold(&mut h, 3);
        assert_eq!(h.len(), 2, "{h:?}");
        assert_eq!((h.get(&7), h.get(&9)), (Some(&12), Some(&4)));
    }

    #[test]
    fn hot_objects_that_fill_half_the_map_keep_only_the_hottest() {
        let mut h: HashMap<u64, u64> = (0..HEAT_ENTRIES_MAX as u64).map(|i| (i, 5)).collect();
        h.insert(1, 20);
        forget_cold(&mut h, 3);
        assert_eq!(h.len(), 1);
        assert_eq!(h.get(&1), Some(&20));
    }
}
