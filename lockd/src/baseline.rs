//! Per-thread clients of the one-word baseline locks, over one-sided verbs only: the CAS
//! spinlock ([`CasClient`], state machine in [`crate::cas`]) and DSLR ([`DslrClient`],
//! state machine in [`crate::dslr`]), on tables a node exports ([`crate::words`]).
//!
//! A held lock is a guard value ([`CasGuard`], [`DslrGuard`]) that must be released, as a
//! Takeout [`crate::ticket::Ticket`] must: [`CasGuard::release`] / [`DslrGuard::release`],
//! or, on any other path, its `Drop`, which cannot await and so hands the release to a
//! coroutine of its own on the thread's executor ([`ThreadCtx::spawn`]). A release that
//! fails says so ([`LockError::Lost`], or for a dropped guard an error log and the client's
//! `lost()` count); the lock then stays held (CAS) or stalled (DSLR): recovery from crashed
//! or cut-off holders is out of scope, as for Takeout.

use rrpc::NodeId;
use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use rrpc::fabric::RemoteAddr;
use rrpc::node::NodeInfo;
use rrpc::runtime::ThreadCtx;

use crate::backoff::Backoff;
use crate::cas::{self, HolderId, IdSource, Release, Step};
use crate::client::DEFAULT_RELEASE_WAIT;
use crate::dslr::{self, Access, Draw, ResetStep, Ticket, Wait};
use crate::error::{word, LockError};
use crate::words::{WordsExport, CAS_EXPORT, DSLR_EXPORT, WORD_STRIDE};

/// Client settings of the baseline locks (and of Takeout through
/// [`crate::kinds::AnyLockClient`]); kebab-case fields, each defaulted, durations as
/// serde writes them (`{secs, nanos}`).
///
/// Non-exhaustive, so that a setting can be added without breaking the crates that embed
/// this one: outside this crate, start from [`Default::default`] and chain the `with_*`
/// setters (or assign the public fields on a `let mut` binding).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, rename_all = "kebab-case")]
#[non_exhaustive]
pub struct BaselineConfig {
    /// Backoff after a failed CAS (CAS lock) and after drawing from a frozen word (DSLR).
    pub backoff: Backoff,
    /// Seed of the backoff delays; with [`Self::client`] fixed, a run's delays are
    /// reproducible (default 0).
    pub seed: u64,
    /// This client's number on its node, part of CAS holder ids and of the backoff seeds;
    /// `None` (default) takes the next number of a process-wide counter.
    pub client: Option<u16>,
    /// How a CAS lock is released (default [`Release::Write`], as FORD).
    pub cas_release: Release,
    /// DSLR's counter limit `COUNT_MAX` (default and maximum [`dslr::COUNT_MAX`]; tests
    /// force resets with small limits).
    pub dslr_count_max: u16,
    /// DSLR's polling unit: a waiter sleeps (tickets ahead) x this before each READ
    /// (section 4.6; default 1 us, about one lock hold of a short critical section).
    pub dslr_poll_unit: Duration,
    /// How long an acquire tries before [`LockError::Timeout`] (default 10 s).
    pub acquire_timeout: Duration,
    /// How long a release waits for its turn (an unserved DSLR ticket) or for the DSLR
    /// counter reset before it reports [`LockError::Lost`] (default 10 s).
    pub release_wait: Duration,
}

impl Default for BaselineConfig {
    fn default() -> Self {
        Self {
            backoff: Backoff::default(),
            seed: 0,
            client: None,
            cas_release: Release::Write,
            dslr_count_max: dslr::COUNT_MAX,
            dslr_poll_unit: Duration::from_micros(1),
            acquire_timeout: Duration::from_secs(10),
            release_wait: DEFAULT_RELEASE_WAIT,
        }
    }
}

impl BaselineConfig {
    /// Set [`BaselineConfig::backoff`]: backoff after a failed CAS (CAS lock) and after drawing
    /// from a frozen word (DSLR).
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Set [`BaselineConfig::seed`]: seed of the backoff delays; with [`Self::client`] fixed, a
    /// run's delays are reproducible (default 0).
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Set [`BaselineConfig::client`]: this client's number on its node, part of CAS holder ids
    /// and of the backoff seeds; `None` (default) takes the next number of a process-wide
    /// counter.
    pub fn with_client(mut self, client: Option<u16>) -> Self {
        self.client = client;
        self
    }

    /// Set [`BaselineConfig::cas_release`]: how a CAS lock is released (default
    /// [`Release::Write`], as FORD).
    pub fn with_cas_release(mut self, cas_release: Release) -> Self {
        self.cas_release = cas_release;
        self
    }

    /// Set [`BaselineConfig::dslr_count_max`]: DSLR's counter limit `COUNT_MAX` (default and
    /// maximum [`dslr::COUNT_MAX`]; tests force resets with small limits).
    pub fn with_dslr_count_max(mut self, dslr_count_max: u16) -> Self {
        self.dslr_count_max = dslr_count_max;
        self
    }

    /// Set [`BaselineConfig::dslr_poll_unit`]: DSLR's polling unit: a waiter sleeps (tickets
    /// ahead) x this before each READ (section 4.6; default 1 us, about one lock hold of a
    /// short critical section).
    pub fn with_dslr_poll_unit(mut self, dslr_poll_unit: Duration) -> Self {
        self.dslr_poll_unit = dslr_poll_unit;
        self
    }

    /// Set [`BaselineConfig::acquire_timeout`]: how long an acquire tries before
    /// [`LockError::Timeout`] (default 10 s).
    pub fn with_acquire_timeout(mut self, acquire_timeout: Duration) -> Self {
        self.acquire_timeout = acquire_timeout;
        self
    }

    /// Set [`BaselineConfig::release_wait`]: how long a release waits for its turn (an unserved
    /// DSLR ticket) or for the DSLR counter reset before it reports [`LockError::Lost`]
    /// (default 10 s).
    pub fn with_release_wait(mut self, release_wait: Duration) -> Self {
        self.release_wait = release_wait;
        self
    }

    /// Check the backoff policy and the DSLR counter limit.
    pub fn validate(&self) -> Result<(), String> {
        self.backoff.validate()?;
        dslr::validate_count_max(self.dslr_count_max)
    }
}

static NEXT_CLIENT: AtomicU16 = AtomicU16::new(0);

/// What every baseline client needs: the table, where it lives, its settings.
struct Common {
    node: NodeId,
    export: WordsExport,
    cfg: BaselineConfig,
    client: u16,
    /// Acquisitions started, mixed into each one's backoff seed.
    acquisitions: Cell<u64>,
    lost: Rc<Cell<u64>>,
}

impl Common {
    fn new(info: &NodeInfo, name: &str, cfg: &BaselineConfig) -> Result<Self, LockError> {
        cfg.validate().map_err(LockError::InvalidRequest)?;
        let export: WordsExport = info
            .export(name)
            .map_err(|e| LockError::Export(format!("{name}: {e}")))?;
        export
            .validate()
            .map_err(|e| LockError::Export(format!("{name}: {e}")))?;
        Ok(Self {
            node: info.node,
            export,
            cfg: cfg.clone(),
            client: cfg
                .client
                .unwrap_or_else(|| NEXT_CLIENT.fetch_add(1, Ordering::Relaxed)),
            acquisitions: Cell::new(0),
            lost: Rc::new(Cell::new(0)),
        })
    }

    fn addr(&self, id: u64) -> Result<RemoteAddr, LockError> {
        if id >= self.export.n_locks {
            return Err(LockError::InvalidRequest(format!(
                "lock id {id} outside a table of {} locks",
                self.export.n_locks
            )));
        }
        Ok(self.export.table.at(id * WORD_STRIDE))
    }

    /// The backoff seed of the next acquisition: seed, client number and acquisition
    /// count (SmallRng's seeding scrambles the combination).
    fn next_seed(&self) -> u64 {
        let n = self.acquisitions.get();
        self.acquisitions.set(n + 1);
        self.cfg.seed ^ u64::from(self.client) << 48 ^ n
    }
}

fn timeout(id: u64, since: Instant) -> LockError {
    LockError::Timeout {
        id,
        waited: since.elapsed(),
    }
}

/// Sleep `d`, but not past `deadline`; `Err` once the deadline has passed.
async fn sleep_until_deadline(ctx: &ThreadCtx, d: Duration, deadline: Instant) -> Result<(), ()> {
    let now = Instant::now();
    if now >= deadline {
        return Err(());
    }
    let d = d.min(deadline - now);
    if !d.is_zero() {
        ctx.sleep(d).await;
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------
// CAS spinlock
// ------------------------------------------------------------------------------------------

/// A thread's client of a node's CAS-lock table (export [`CAS_EXPORT`]). Not `Sync`: one
/// per runtime thread, shared by its coroutines.
pub struct CasClient {
    c: Common,
    ids: RefCell<IdSource>,
}

impl CasClient {
    /// A client of the CAS locks `info`'s node exports; holder ids carry `ctx`'s node id.
    ///
    /// Errors: [`LockError::Export`] when the export is missing or inconsistent,
    /// [`LockError::InvalidRequest`] for an invalid `cfg`.
    pub fn from_info(
        ctx: &ThreadCtx,
        info: &NodeInfo,
        cfg: &BaselineConfig,
    ) -> Result<Self, LockError> {
        let c = Common::new(info, CAS_EXPORT, cfg)?;
        let ids = RefCell::new(IdSource::new(ctx.fabric().node().get(), c.client));
        Ok(Self { c, ids })
    }

    /// Number of locks in the table.
    pub fn n_locks(&self) -> u64 {
        self.c.export.n_locks
    }

    /// Dropped guards whose release failed.
    pub fn lost(&self) -> u64 {
        self.c.lost.get()
    }

    /// Acquire lock `id`: one-sided CAS `0 -> holder id`, retried after a randomized
    /// exponential backoff until it swaps.
    ///
    /// Errors: [`LockError::InvalidRequest`] for an id outside the table;
    /// [`LockError::Timeout`] after the acquire timeout; [`LockError::Rpc`] when a CAS
    /// fails (its outcome is then unknown: the lock may be left held by our id);
    /// [`LockError::Protocol`] when the word already holds our id.
    pub async fn lock(&self, ctx: &Rc<ThreadCtx>, id: u64) -> Result<CasGuard, LockError> {
        let addr = self.c.addr(id)?;
        let holder = self.ids.borrow_mut().next_id();
        let mut acq = cas::Acquire::new(holder, self.c.cfg.backoff, self.c.next_seed());
        let start = Instant::now();
        let deadline = start + self.c.cfg.acquire_timeout;
        loop {
            let (compare, swap) = acq.cas_args();
            let old = ctx.cas(self.c.node, addr, compare, swap).await?;
            match acq
                .on_cas(old)
                .map_err(|e| LockError::Protocol(format!("lock {id}: {e}")))?
            {
                Step::Acquired => {
                    return Ok(CasGuard {
                        state: Some(CasState {
                            ctx: ctx.clone(),
                            node: self.c.node,
                            addr,
                            id,
                            holder,
                            failures: acq.failures(),
                            release: self.c.cfg.cas_release,
                            lost: self.c.lost.clone(),
                        }),
                    })
                }
                Step::Retry { after, .. } => sleep_until_deadline(ctx, after, deadline)
                    .await
                    .map_err(|()| timeout(id, start))?,
            }
        }
    }
}

/// A held CAS lock. Not `Send` (it belongs to its thread's runtime).
#[must_use = "a CAS lock that is never released stays held; call release()"]
pub struct CasGuard {
    /// `None` once released (or handed to a release coroutine).
    state: Option<CasState>,
}

struct CasState {
    ctx: Rc<ThreadCtx>,
    node: NodeId,
    addr: RemoteAddr,
    id: u64,
    holder: HolderId,
    /// Failed CASes before the one that acquired.
    failures: u32,
    release: Release,
    lost: Rc<Cell<u64>>,
}

impl CasGuard {
    fn st(&self) -> &CasState {
        self.state.as_ref().expect("a live guard has state")
    }

    /// The lock id.
    pub fn id(&self) -> u64 {
        self.st().id
    }

    /// Our holder id, as the lock word holds it.
    pub fn holder(&self) -> HolderId {
        self.st().holder
    }

    /// Failed CASes (each followed by a backoff) before the one that acquired.
    pub fn failures(&self) -> u32 {
        self.st().failures
    }

    /// Release: one-sided WRITE of 0, or CAS `holder -> 0` ([`Release`]).
    ///
    /// Errors: [`LockError::Lost`] when the WRITE or CAS failed (the lock may stay held),
    /// with [`LockError::Protocol`] as the cause when a CAS release found another word.
    pub async fn release(mut self) -> Result<(), LockError> {
        let s = self.state.take().expect("a live guard has state");
        s.detached().run(&s.ctx).await
    }
}

impl std::fmt::Debug for CasGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.state {
            Some(s) => f
                .debug_struct("CasGuard")
                .field("id", &s.id)
                .field("holder", &s.holder)
                .finish(),
            None => f.write_str("CasGuard(released)"),
        }
    }
}

impl Drop for CasGuard {
    fn drop(&mut self) {
        let Some(s) = self.state.take() else { return };
        // Drop cannot await: a coroutine of its own releases. It holds the context weakly
        // so that a context whose executor never runs again can still be dropped.
        let weak: Weak<ThreadCtx> = Rc::downgrade(&s.ctx);
        let lost = s.lost.clone();
        let d = s.detached();
        s.ctx.spawn(async move {
            let Some(ctx) = weak.upgrade() else { return };
            if let Err(e) = d.run(&ctx).await {
                lost.set(lost.get() + 1);
                tracing::error!(lock = d.id, holder = d.holder.word(), error = %e, "dropped CAS lock: release failed");
            }
        });
    }
}

impl CasState {
    fn detached(&self) -> CasDetached {
        CasDetached {
            node: self.node,
            addr: self.addr,
            id: self.id,
            holder: self.holder,
            release: self.release,
        }
    }
}

/// A CAS release without the strong context reference (for the drop coroutine).
struct CasDetached {
    node: NodeId,
    addr: RemoteAddr,
    id: u64,
    holder: HolderId,
    release: Release,
}

impl CasDetached {
    async fn run(&self, ctx: &ThreadCtx) -> Result<(), LockError> {
        let lost = |cause: LockError| LockError::Lost {
            id: self.id,
            ticket: self.holder.word(),
            cause: Box::new(cause),
        };
        match self.release {
            Release::Write => ctx
                .write(self.node, self.addr, &cas::FREE.to_le_bytes())
                .await
                .map_err(|e| lost(e.into())),
            Release::Cas => {
                let old = ctx
                    .cas(self.node, self.addr, self.holder.word(), cas::FREE)
                    .await
                    .map_err(|e| lost(e.into()))?;
                cas::check_cas_release(self.holder, old)
                    .map_err(|e| lost(LockError::Protocol(format!("lock {}: {e}", self.id))))
            }
        }
    }
}

// ------------------------------------------------------------------------------------------
// DSLR
// ------------------------------------------------------------------------------------------

/// A thread's client of a node's DSLR lock table (export [`DSLR_EXPORT`]). Not `Sync`: one
/// per runtime thread, shared by its coroutines.
pub struct DslrClient {
    c: Common,
}

impl DslrClient {
    /// A client of the DSLR locks `info`'s node exports.
    ///
    /// Errors: [`LockError::Export`] when the export is missing or inconsistent,
    /// [`LockError::InvalidRequest`] for an invalid `cfg`.
    pub fn from_info(info: &NodeInfo, cfg: &BaselineConfig) -> Result<Self, LockError> {
        Ok(Self {
            c: Common::new(info, DSLR_EXPORT, cfg)?,
        })
    }

    /// Number of locks in the table.
    pub fn n_locks(&self) -> u64 {
        self.c.export.n_locks
    }

    /// Dropped guards whose release failed.
    pub fn lost(&self) -> u64 {
        self.c.lost.get()
    }

    /// Acquire lock `id` in `access` mode (DSLR Algorithms 1 and 2): one FAA draws a
    /// ticket; from a frozen word (a counter reset under way) the FAA is undone and
    /// retried after a backoff; then the ticket waits, READing the word after each wait
    /// of (tickets ahead) x poll unit, until its turn.
    ///
    /// Errors: [`LockError::InvalidRequest`] for an id outside the table;
    /// [`LockError::Timeout`] after the acquire timeout (a ticket already drawn is
    /// released by a coroutine of its own when its turn comes); [`LockError::Rpc`] when a
    /// one-sided operation fails (a failed ticket or undo FAA has an unknown outcome and
    /// may leave the lock stalled or frozen: recovery is out of scope);
    /// [`LockError::Protocol`] when the word contradicts the protocol. Dropping the future
    /// between the ticket FAA and its return leaks the ticket, as it would a Takeout
    /// ticket in flight.
    pub async fn lock(
        &self,
        ctx: &Rc<ThreadCtx>,
        id: u64,
        access: Access,
    ) -> Result<DslrGuard, LockError> {
        let addr = self.c.addr(id)?;
        let (node, cfg) = (self.c.node, &self.c.cfg);
        let start = Instant::now();
        let deadline = start + cfg.acquire_timeout;
        let mut backoff = cfg.backoff.start(self.c.next_seed());
        let (ticket, prev) = loop {
            let prev = ctx.faa(node, addr, dslr::ticket_add(access)).await?;
            match dslr::draw(prev, access, cfg.dslr_count_max) {
                Draw::Ticket(t) => break (t, prev),
                Draw::Frozen => {
                    // Take the increment back before anything else: the resetter's CAS
                    // cannot succeed while it is outstanding.
                    ctx.faa(node, addr, dslr::undo_add(access)).await?;
                    sleep_until_deadline(ctx, backoff.next_delay(), deadline)
                        .await
                        .map_err(|()| timeout(id, start))?;
                }
            }
        };
        let mut guard = DslrGuard {
            state: Some(DslrState {
                ctx: ctx.clone(),
                node,
                addr,
                id,
                ticket,
                observed: prev,
                poll_unit: cfg.dslr_poll_unit,
                release_wait: cfg.release_wait,
                lost: self.c.lost.clone(),
            }),
        };
        let s = guard.state.as_mut().expect("just built");
        // On an error the guard is dropped here and its coroutine passes the ticket on.
        wait_served(s, deadline).await.map_err(|e| match e {
            LockError::Timeout { id, .. } => timeout(id, start),
            e => e,
        })?;
        Ok(guard)
    }
}

/// A held DSLR lock (a served ticket). Not `Send`.
#[must_use = "a DSLR ticket that is never released stalls its lock; call release()"]
pub struct DslrGuard {
    /// `None` once released (or handed to a release coroutine).
    state: Option<DslrState>,
}

struct DslrState {
    ctx: Rc<ThreadCtx>,
    node: NodeId,
    addr: RemoteAddr,
    id: u64,
    ticket: Ticket,
    /// The last lock word seen (the ticket FAA's result, then READs).
    observed: u64,
    poll_unit: Duration,
    release_wait: Duration,
    lost: Rc<Cell<u64>>,
}

impl DslrGuard {
    fn st(&self) -> &DslrState {
        self.state.as_ref().expect("a live guard has state")
    }

    /// The lock id.
    pub fn id(&self) -> u64 {
        self.st().id
    }

    /// The ticket (mode, snapshot, reset duty).
    pub fn ticket(&self) -> Ticket {
        self.st().ticket
    }

    /// Whether the ticket had to wait: tickets ahead of it were unreleased when drawn.
    pub fn waited(&self) -> bool {
        let s = self.st();
        s.ticket.check(s.ticket.snapshot().encode()) != Ok(Wait::Go)
    }

    /// Release (DSLR Algorithm 3): one FAA of +1 on `n_x` or `n_s`; the resetter then
    /// CASes the word from `reset_from` to 0, retrying after (outstanding tickets) x poll
    /// unit until every ticket before it is released.
    ///
    /// Errors: [`LockError::Lost`] when the FAA or the reset failed or the reset did not
    /// complete within the release wait (the word stays frozen: the lock is stalled).
    pub async fn release(mut self) -> Result<(), LockError> {
        let s = self.state.take().expect("a live guard has state");
        dslr_release(s).await
    }
}

impl std::fmt::Debug for DslrGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.state {
            Some(s) => f
                .debug_struct("DslrGuard")
                .field("id", &s.id)
                .field("ticket", &s.ticket)
                .finish(),
            None => f.write_str("DslrGuard(released)"),
        }
    }
}

impl Drop for DslrGuard {
    fn drop(&mut self) {
        let Some(s) = self.state.take() else { return };
        let weak: Weak<ThreadCtx> = Rc::downgrade(&s.ctx);
        let ctx = s.ctx.clone();
        let (node, addr, id, ticket, observed, poll_unit, release_wait, lost) = (
            s.node,
            s.addr,
            s.id,
            s.ticket,
            s.observed,
            s.poll_unit,
            s.release_wait,
            s.lost.clone(),
        );
        drop(s);
        ctx.spawn(async move {
            let Some(ctx) = weak.upgrade() else { return };
            let st = DslrState {
                ctx,
                node,
                addr,
                id,
                ticket,
                observed,
                poll_unit,
                release_wait,
                lost: lost.clone(),
            };
            if let Err(e) = dslr_release(st).await {
                lost.set(lost.get() + 1);
                tracing::error!(lock = id, ticket = ?ticket, error = %e, "dropped DSLR ticket: lock lost");
            }
        });
    }
}

async fn wait_served(s: &mut DslrState, deadline: Instant) -> Result<(), LockError> {
    let id = s.id;
    let start = Instant::now();
    loop {
        match s
            .ticket
            .check(s.observed)
            .map_err(|e| LockError::Protocol(format!("lock {id}: {e}")))?
        {
            Wait::Go => return Ok(()),
            Wait::Ahead(n) => {
                sleep_until_deadline(&s.ctx, dslr::poll_wait(n, s.poll_unit), deadline)
                    .await
                    .map_err(|()| timeout(id, start))?;
                let b = s.ctx.read(s.node, s.addr, 8).await?;
                s.observed = word(&b, 0)?;
            }
        }
    }
}

async fn dslr_release(mut s: DslrState) -> Result<(), LockError> {
    let (id, ticket) = (s.id, s.ticket.snapshot().encode());
    let lost = |cause: LockError| LockError::Lost {
        id,
        ticket,
        cause: Box::new(cause),
    };
    let deadline = Instant::now() + s.release_wait;
    wait_served(&mut s, deadline).await.map_err(lost)?;
    s.ctx
        .faa(s.node, s.addr, s.ticket.release_add())
        .await
        .map_err(|e| lost(e.into()))?;
    let Some(reset_from) = s.ticket.reset_from() else {
        return Ok(());
    };
    let start = Instant::now();
    loop {
        let old = s
            .ctx
            .cas(s.node, s.addr, reset_from, 0)
            .await
            .map_err(|e| lost(e.into()))?;
        match dslr::reset_step(reset_from, old) {
            ResetStep::Done => return Ok(()),
            ResetStep::Wait { ahead } => {
                sleep_until_deadline(&s.ctx, dslr::poll_wait(ahead, s.poll_unit), deadline)
                    .await
                    .map_err(|()| lost(timeout(id, start)))?
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_roundtrips_and_defaults_missing_fields() {
        let c = BaselineConfig {
            seed: 9,
            cas_release: Release::Cas,
            dslr_count_max: 5,
            ..BaselineConfig::default()
        };
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["cas-release"], "cas");
        assert_eq!(v["dslr-count-max"], 5);
        assert_eq!(serde_json::from_value::<BaselineConfig>(v).unwrap(), c);
        let partial: BaselineConfig =
            serde_json::from_str(r#"{"seed": 3, "backoff": {"cap": {"secs": 0, "nanos": 5000}}}"#)
                .unwrap();
        assert_eq!(partial.seed, 3);
        assert_eq!(partial.backoff.base, Backoff::default().base);
        assert_eq!(partial.backoff.cap, Duration::from_micros(5));
        assert!(partial.validate().is_ok());
        let bad = BaselineConfig {
            dslr_count_max: dslr::COUNT_MAX + 1,
            ..BaselineConfig::default()
        };
        assert!(bad.validate().is_err());
    }
}
