//! Lotus's lock-first protocol over CVTs, on compute-node lock tables (Lotus 5.1 and
//! 5.2), serializable (SR) or snapshot isolation (SI).
//!
//! The locks live in Lotus lock tables sharded across the compute nodes
//! ([`lockd::table_service`], Lotus 4.1 and 4.2): a lock on a shard of this node's table
//! is a CPU CAS on it, one on another node's shard a batched RPC per destination node. The
//! memory nodes see no atomic at all outside inserts (a slot claim and the bucket's insert
//! guard, [`crate::cvt_remote::CvtRemote::create`]).
//!
//! A read-write transaction (Lotus 5.1):
//!
//! - **Start**: `T_start` from the TSO (the thread's group) at the first read.
//! - **E1, lock**: each execution round locks what it reads: a write lock for data read
//!   for update, under SR a read lock for the rest (read locks keep read-only data unchanged
//!   until commit, so there is no validation); any refusal aborts at once (no waiting, so no
//!   deadlock) and what was taken is released. Data read plainly and written later is
//!   locked (or its read lock upgraded) at commit and must still show the version read.
//! - **E2/E3, read**: for a key locked on this node's own table, the compute node's
//!   version table cache first ([`crate::vt_cache`], Lotus 4.4: a hit skips the CVT
//!   READ; a miss READs it and fills the cache while the lock is held); otherwise READ
//!   the CVT (the thread's address cache, else the bucket chain); select the largest
//!   version below `T_start`; a version above it aborts
//!   ([`AbortReason::NewerVersion`]: committed after this transaction began); READ the
//!   record and check its CVs against the cell.
//! - **C1, data and log**: per written object the record and the victim cell, with the
//!   version INVISIBLE ([`crate::cvt::invisible`], tagged with the transaction's id), on
//!   the primary and every backup, in one round; with commit logs on, the log first (one
//!   round earlier, or ahead of the data on the same QP with the ordered placement).
//! - **C2, commit timestamp**: `T_commit` from the TSO, requested only after every C1
//!   WRITE was acknowledged (otherwise a reader that started after `T_commit` could skip a
//!   cell still INVISIBLE and see half of the commit).
//! - **C3, write visible**: the 8-byte WRITE of `T_commit` into every new cell, on every
//!   copy, in one round.
//! - **C4, unlock**: local locks at once; remote unlocks are sent and not awaited.
//!   Before it, a writer replaces its locally locked keys' cached CVTs with the ones it
//!   just published (or, if it failed after C1 began, removes them).
//!
//! A read-only transaction ([`crate::coordinator::Txn::declare_read_only`]) and, under SI,
//! the read-only data of a read-write one take no lock: a snapshot at `T_start`. **The
//! INVISIBLE rule** (the rule Lotus leaves out and correctness needs): a snapshot read that
//! finds an INVISIBLE cell READs the CVT again until no cell is INVISIBLE, and aborts
//! after [`crate::config::TxnConfig::read_wait`] ([`AbortReason::Invisible`]). The writer
//! of that cell may still take a `T_commit` below the reader's `T_start` and publish;
//! skipping the cell would then read a fractured snapshot. If the reader's CVT READ came
//! before the INVISIBLE WRITE, the reader's `T_start` came before the writer's C2 request,
//! so `T_commit > T_start` and the version is rightly not seen.
//!
//! Lock holders never see another transaction's INVISIBLE cell (the writer holds its
//! write lock from before C1 until after C3); a holder that does meets a crashed
//! writer's leftover and aborts ([`AbortReason::Invisible`]).
//!
//! Inserts take the key's write lock; the CVT is created by the one-sided insert path
//! (whose bucket guard serializes inserts into one bucket), its cell written INVISIBLE
//! and published like any other.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockd::lock_table::{LockMode, Refusal};
use lockd::shard::LockKey;
use lockd::table_service::{TableClient, TableError};
use lockd::table_wire::{OpKind, OpOutcome, TableOp};
use rrpc::fabric::RemoteAddr;
use rrpc::runtime::join_all;
use tso::Timestamp;

use crate::attempt;
use crate::client_core::ClientCore;
use crate::config::Isolation;
use crate::cvt::{invisible, Cvt};
use crate::cvt_remote::CvtLoc;
use crate::error::{AbortReason, TxnError};
use crate::lotus_peers::LotusPeers;
use crate::mvcc::visible;
use crate::phase::Phase;
use crate::protocol::{AttemptOf, ConcurrencyControl, Want};
use crate::vt_cache::VtCache;

pub use crate::lotus_site::{critical_lock_key, hashed_lock_key, rest_of, LockKeyFn, LotusSite};

/// Lotus's lock-first protocol at one isolation level, with a thread's lock-table
/// client.
pub(crate) struct Lotus {
    isolation: Isolation,
    locks: Rc<TableClient>,
    lock_key: LockKeyFn,
    node: u32,
    cache: Option<Arc<VtCache>>,
    /// Which nodes are down, shared by the process's threads, and the generation of it
    /// the client follows now.
    peer_states: Arc<LotusPeers>,
    followed: Cell<u64>,
}

/// Lotus's state of an attempt: the locks it holds, in the order taken.
#[derive(Default)]
pub(crate) struct LotusState {
    held: Vec<(LockKey, LockMode)>,
    /// C1 began: some of the attempt's WRITEs may have landed.
    wrote: bool,
    /// The generation of [`LotusPeers`] the attempt is counted in, until it ends.
    entered: Option<u64>,
}

/// Lotus's state of an object read: the lock the attempt holds on it.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct LotusObj {
    lock: Option<LockMode>,
}

type Obj = attempt::Obj<LotusObj>;
type A<'a> = AttemptOf<'a, Lotus>;

impl Lotus {
    /// The protocol at `isolation` on `site`'s lock tables, connecting `ctx` to the
    /// other nodes' lock services.
    ///
    /// Errors: [`TxnError::Rpc`] when a peer cannot be reached.
    pub fn connect(
        ctx: &rrpc::runtime::ThreadCtx,
        isolation: Isolation,
        site: &LotusSite,
    ) -> Result<Self, TxnError> {
        for &p in &site.peers {
            ctx.connect_rpc(p)?;
        }
        site.peer_states.register(ctx.straws());
        Ok(Self {
            isolation,
            locks: Rc::new(TableClient::new(
                site.map.clone(),
                site.local.clone(),
                site.client,
            )),
            lock_key: site.lock_key.clone(),
            node: site.node,
            cache: site.cache.clone(),
            peer_states: site.peer_states.clone(),
            followed: Cell::new(0),
        })
    }

    /// Make this thread's client follow the process's down set and map (Lotus 6, steps
    /// 1 and 5): nodes marked down are answered without an RPC (their connections were
    /// declared dead by [`LotusPeers::mark_down`]; a restarted node, at the same
    /// address, is connected anew at the first call after it is marked up), and a
    /// survivors' takeover map is installed.
    fn follow_peer_states(&self) {
        let g = self.peer_states.generation();
        if g == self.followed.get() {
            return;
        }
        let (down, g) = self.peer_states.down();
        if let Some(m) = self.peer_states.map() {
            self.locks.install_map(&m);
        }
        for n in self.locks.map().nodes() {
            if n == self.node {
                continue;
            }
            if down.contains(&n) {
                self.locks.mark_down(n);
            } else {
                self.locks.mark_up(n);
            }
        }
        self.followed.set(g);
    }

    /// The version table cache for `key`, locked by this attempt: only for keys this
    /// node's own table serves (the spec's A.4: "CVTs of locally locked data").
    fn cache_for(&self, key: Option<LockKey>) -> Option<(&VtCache, LockKey)> {
        let c = self.cache.as_deref()?;
        let key = key?;
        (self.locks.node_of(key) == self.node).then_some((c, key))
    }

    /// Before unlocking an attempt that began C1 and did not commit: remove its written
    /// keys' cached CVTs (some of its WRITEs may have landed; rule 3 of
    /// [`crate::vt_cache`]).
    fn uncache_failed_writes(&self, t: &A<'_>) {
        if !t.cc.wrote || t.committed || self.cache.is_none() {
            return;
        }
        for o in t.objs.iter().filter(|o| o.write.is_some()) {
            if let Some((c, k)) = self.cache_for((self.lock_key)(o.table, o.key)) {
                c.remove(k);
            }
        }
    }

    /// Lotus 6, step 3: release the locks of dead compute-node life `dead` in every
    /// live node's lock table (its own node is marked down on this client first: its
    /// table is gone); returns how many were released. Idempotent.
    ///
    /// Errors: [`TxnError::LockTable`] when a live node cannot be reached.
    pub async fn release_dead(
        &self,
        ctx: &rrpc::runtime::ThreadCtx,
        dead: lockd::owners::Owner,
    ) -> Result<u64, TxnError> {
        if dead.node != self.node {
            self.locks.mark_down(dead.node);
        }
        Ok(self.locks.release_node(ctx, dead).await?)
    }

    /// E1: take `want` (`(lock key, mode)`) for attempt `id`, in one batched round;
    /// every grant is pushed into `held` (so that every path releases it). Any refusal
    /// aborts.
    async fn lock(
        &self,
        c: &ClientCore,
        id: u64,
        want: &[(LockKey, LockMode)],
        held: &mut Vec<(LockKey, LockMode)>,
    ) -> Result<(), TxnError> {
        if want.is_empty() {
            return Ok(());
        }
        let ops: Vec<TableOp> = want
            .iter()
            .map(|&(key, mode)| TableOp {
                key,
                txn: id,
                node: self.node,
                kind: OpKind::Lock(mode),
            })
            .collect();
        let outs = match self.locks.execute(c.store.ctx(), &ops).await {
            Ok(o) => o,
            Err(e) => {
                // Some operations may have run (another node's batch granted while this
                // one failed, or a node answered in a new epoch): every key counts as
                // possibly held, so that the abort releases it (releasing a lock this
                // transaction does not hold is a no-op). Otherwise a grant is leaked and
                // its key refused to everyone for the rest of the run.
                for &(key, mode) in want {
                    if !held.iter().any(|(k, _)| *k == key) {
                        held.push((key, mode));
                    }
                }
                return Err(table_error(e));
            }
        };
        let mut failed = None;
        for (&(key, mode), o) in want.iter().zip(outs) {
            match o {
                OpOutcome::Granted => match held.iter_mut().find(|(k, _)| *k == key) {
                    Some(h) => h.1 = h.1.max_mode(mode),
                    None => held.push((key, mode)),
                },
                OpOutcome::Refused(r) => {
                    failed.get_or_insert(refusal(r));
                }
                OpOutcome::WrongShard { .. } | OpOutcome::Moving => {
                    failed.get_or_insert(AbortReason::ShardMoving);
                }
                OpOutcome::Down => {
                    failed.get_or_insert(AbortReason::CnDown);
                }
                OpOutcome::Released | OpOutcome::NotHeld => {
                    unreachable!("a lock op is granted or refused")
                }
            }
        }
        match failed {
            Some(r) => Err(TxnError::Abort(r)),
            None => Ok(()),
        }
    }

    /// C4: release `held`: this node's locks at once (a CPU CAS each), the other nodes'
    /// by one RPC per node sent from a coroutine of their own and not awaited (Lotus 5.1:
    /// "unlock requests are sent asynchronously"). A failed remote unlock is counted
    /// ([`TableClient::unlock_failures`]); the lock is then freed by the holder's failure
    /// handling (Lotus 6) or was already gone.
    fn unlock(&self, c: &ClientCore, id: u64, held: Vec<(LockKey, LockMode)>) {
        if held.is_empty() {
            return;
        }
        let keys: Vec<LockKey> = held.into_iter().map(|(k, _)| k).collect();
        self.locks
            .unlock_detached(c.store.ctx(), id, self.node, &keys);
    }
}

impl Lotus {
    /// Release `held` and wait for every unlock (an aborted attempt's; see `release`).
    /// A failed unlock is logged: the lock is then freed by the holder's failure
    /// handling (Lotus 6) or was already gone.
    async fn unlock_awaited(&self, c: &ClientCore, id: u64, held: Vec<(LockKey, LockMode)>) {
        if held.is_empty() {
            return;
        }
        let ops: Vec<TableOp> = held
            .into_iter()
            .map(|(key, _)| TableOp {
                key,
                txn: id,
                node: self.node,
                kind: OpKind::Unlock,
            })
            .collect();
        if let Err(e) = self.locks.execute(c.store.ctx(), &ops).await {
            tracing::warn!(error = %e, "Lotus: an abort's unlock failed");
        }
    }
}

/// The stronger of two modes.
trait MaxMode {
    fn max_mode(self, other: Self) -> Self;
}

impl MaxMode for LockMode {
    fn max_mode(self, other: Self) -> Self {
        if self == LockMode::Write || other == LockMode::Write {
            LockMode::Write
        } else {
            LockMode::Read
        }
    }
}

/// The abort reason of a lock-table refusal.
fn refusal(r: Refusal) -> AbortReason {
    match r {
        Refusal::BucketFull | Refusal::ReaderOverflow => AbortReason::LockRefusedFull,
        Refusal::StaleIncarnation => AbortReason::CnDown,
        _ => AbortReason::LockRefusedConflict,
    }
}

/// A lock-table failure as the transaction sees it: a node that cannot be reached or
/// restarted means its locks are gone (the attempt aborts and retries); the others are
/// errors.
fn table_error(e: TableError) -> TxnError {
    match e {
        TableError::Rpc { .. } | TableError::Restarted { .. } => {
            TxnError::Abort(AbortReason::CnDown)
        }
        e => TxnError::LockTable(e),
    }
}

impl ConcurrencyControl for Lotus {
    type State = LotusState;
    type ObjState = LotusObj;

    /// An object read without a write lock and now read for update is locked now.
    fn refetch(&self, o: &Obj, for_update: bool) -> bool {
        for_update && o.cc.lock != Some(LockMode::Write)
    }

    /// The attempt is counted in the current generation of the down set (its locks on
    /// a node that dies now may still be used; the node's restart waits for it), after
    /// the thread's client followed that generation.
    fn begin(&self, t: &mut A<'_>, _retry_of: Option<u64>) {
        self.follow_peer_states();
        t.cc.entered = Some(self.peer_states.enter());
    }

    async fn fetch(&self, t: &mut A<'_>, want: &[Want]) -> Result<(), TxnError> {
        fetch(self, t, want).await
    }

    async fn commit(&self, t: &mut A<'_>) -> Result<(), TxnError> {
        commit(self, t).await
    }

    async fn release(&self, t: &mut A<'_>) -> Result<(), TxnError> {
        self.uncache_failed_writes(t);
        let mut held = std::mem::take(&mut t.cc.held);
        let point = crate::attempt::CrashPoint::AfterFirstUnlock;
        if t.committed && held.len() > 1 && crate::attempt::crash_armed(point) {
            // Armed: the first lock alone, then the crash point, then the rest.
            let rest = held.split_off(1);
            self.unlock(t.core, t.id, held);
            crate::attempt::crash_point(point).await;
            held = rest;
        }
        if !t.committed {
            // An abort waits for its unlocks: its retry would otherwise find its own
            // previous attempt's locks still held on hot keys, and abort again.
            self.unlock_awaited(t.core, t.id, held).await;
            return Ok(());
        }
        self.unlock(t.core, t.id, held);
        Ok(())
    }

    /// A dropped attempt's locks (one that neither committed nor aborted) are released
    /// here.
    fn finish(&self, t: &mut A<'_>) {
        self.uncache_failed_writes(t);
        let held = std::mem::take(&mut t.cc.held);
        self.unlock(t.core, t.id, held);
        if let Some(g) = t.cc.entered.take() {
            self.peer_states.leave(g);
        }
    }
}

/// A snapshot read at `s` without a lock, under the INVISIBLE rule (module docs).
async fn read_snapshot(
    c: &ClientCore,
    table: u32,
    key: u64,
    s: Timestamp,
) -> Result<Obj, TxnError> {
    let mut o = Obj::absent(table, key);
    let Some((loc, mut cvt)) = c.store.lookup(table, key).await? else {
        return Ok(o);
    };
    if cvt.has_invisible() && !skip_invisible() {
        let deadline = Instant::now() + c.cfg.read_wait;
        let mut pause = Duration::from_micros(1);
        while cvt.has_invisible() {
            if Instant::now() >= deadline {
                return Err(TxnError::Abort(AbortReason::Invisible));
            }
            c.store.ctx().sleep(pause).await;
            pause = (pause * 2).min(Duration::from_micros(20));
            cvt = c.store.read_cvt(loc).await?;
        }
    }
    let cell = visible(&cvt, s).map_err(TxnError::Abort)?;
    o.fill(c, loc, cvt, cell).await?;
    Ok(o)
}

/// The planted bug of the SR test ([`crate::fault::skip_read_only_validation`]): no
/// read locks on read-only data.
fn skip_read_locks() -> bool {
    #[cfg(feature = "fault-injection")]
    if crate::fault::skipping_read_only_validation() {
        return true;
    }
    false
}

/// The planted bug of the INVISIBLE rule's test: snapshot readers skip INVISIBLE cells.
fn skip_invisible() -> bool {
    #[cfg(feature = "fault-injection")]
    if crate::fault::lotus_skipping_invisible() {
        return true;
    }
    false
}

/// The planted bug of the cache's test: local writers do not update their cached CVTs.
fn skip_vtc_update() -> bool {
    #[cfg(feature = "fault-injection")]
    if crate::fault::lotus_skipping_vtc_update() {
        return true;
    }
    false
}

/// A read of `(table, key)` under this attempt's lock at `s` (E2, E3): the newest
/// version must be older than `s`. With `create` (the attempt's id), a key without a
/// CVT gets one (an insert; the caller holds its write lock). With `cache` (a key of
/// this node's own shards), the version table cache first: a hit skips the CVT READ (the
/// record is still READ and checked against the cached cell; a mismatch removes the
/// entry and READs the CVT); a CVT READ after a miss fills it, synchronously, the lock
/// still held.
async fn read_locked(
    c: &ClientCore,
    table: u32,
    key: u64,
    loc: Option<CvtLoc>,
    cache: Option<(&VtCache, LockKey)>,
    s: Timestamp,
    create: Option<u64>,
) -> Result<Obj, TxnError> {
    if let Some((vc, lk)) = cache {
        // Cached CVT addresses belong to the replica view they were read under: a
        // newer one (a failover moved a primary) empties the cache, checked just before
        // the lookup since an attempt may begin under one view and read under the next.
        vc.note_epoch(c.store.epoch());
        if let Some((loc, cvt)) = vc.get(lk, table, key) {
            // The partition may be failing over (its CVTs are READ nowhere then).
            c.store.check(loc.part)?;
            match use_locked(c, table, key, loc, cvt, s).await {
                Err(TxnError::Abort(AbortReason::TornRead)) => {
                    // The cached cell's record no longer matches: READ the CVT.
                    vc.remove(lk);
                }
                r => return r,
            }
        }
    }
    let found = match loc {
        Some(loc) => {
            let cvt = c.store.read_cvt(loc).await?;
            if (cvt.header.table, cvt.header.key) != (table, key) {
                // A stale cache entry; the retry searches the index.
                c.store.forget(table, key);
                return Err(TxnError::Abort(AbortReason::TornRead));
            }
            Some((loc, cvt))
        }
        None => c.store.lookup(table, key).await?,
    };
    let (loc, cvt) = match found {
        Some((loc, cvt)) => {
            // Rule 2: fill while the lock is held, with no await since the READ.
            if let Some((vc, lk)) = cache {
                if !cvt.has_invisible() {
                    vc.fill(lk, table, key, loc, &cvt);
                }
            }
            (loc, cvt)
        }
        None => match create {
            Some(id) => c.store.create(table, key, 0, id).await?,
            None => return Ok(Obj::absent(table, key)),
        },
    };
    use_locked(c, table, key, loc, cvt, s).await
}

/// E3 of a locked read: `cvt` at `loc` (READ or cached) must have no INVISIBLE cell and
/// no version after `s`; READ the record of the version visible at `s`.
async fn use_locked(
    c: &ClientCore,
    table: u32,
    key: u64,
    loc: CvtLoc,
    cvt: Cvt,
    s: Timestamp,
) -> Result<Obj, TxnError> {
    let mut o = Obj::absent(table, key);
    if cvt.has_invisible() {
        // Under our lock: a crashed writer's leftover, which recovery removes before
        // the key's lock is granted again; not ours to use.
        return Err(TxnError::Abort(AbortReason::Invisible));
    }
    if cvt.newer_than(s) {
        return Err(TxnError::Abort(AbortReason::NewerVersion));
    }
    let cell = visible(&cvt, s).map_err(TxnError::Abort)?;
    o.fill(c, loc, cvt, cell).await?;
    Ok(o)
}

/// One execution round (E1 to E3) over `want`.
async fn fetch(p: &Lotus, t: &mut A<'_>, want: &[Want]) -> Result<(), TxnError> {
    let s = t.timestamp().await?;
    let c = t.core;
    let sr = p.isolation == Isolation::Serializable && !skip_read_locks();
    let ro = t.read_only;
    if ro && want.iter().any(|w| w.2) {
        return Err(TxnError::Usage(
            "a transaction declared read-only reads for update".into(),
        ));
    }
    // E1: the locks this round needs, in one batched round.
    let modes: Vec<Option<LockMode>> = want
        .iter()
        .map(|&(_, _, upd)| match (upd, sr && !ro) {
            (true, _) => Some(LockMode::Write),
            (false, true) => Some(LockMode::Read),
            (false, false) => None,
        })
        .collect();
    let existing: Vec<Option<usize>> = want.iter().map(|&(tb, k, _)| t.find(tb, k)).collect();
    // Static records take no lock (`LockKeyFn`); writing one is a misuse.
    let keys: Vec<Option<LockKey>> = want.iter().map(|&(tb, k, _)| (p.lock_key)(tb, k)).collect();
    if let Some(&(tb, k, _)) = want
        .iter()
        .zip(&keys)
        .find(|(w, l)| w.2 && l.is_none())
        .map(|x| x.0)
    {
        return Err(TxnError::Usage(format!(
            "table {tb} key {k} is static for Lotus (no lock key) and cannot be written"
        )));
    }
    let modes: Vec<Option<LockMode>> = modes
        .into_iter()
        .zip(&keys)
        .map(|(m, l)| m.filter(|_| l.is_some()))
        .collect();
    let needed: Vec<(LockKey, LockMode)> = keys
        .iter()
        .zip(&modes)
        .zip(&existing)
        .filter_map(|((l, m), ex)| {
            let (l, m) = ((*l)?, (*m)?);
            let have = ex.and_then(|i| t.objs[i].cc.lock);
            (have != Some(LockMode::Write) && have != Some(m)).then_some((l, m))
        })
        .collect();
    if !needed.is_empty() {
        let prev = t.enter(Phase::Lock);
        let r = p.lock(c, t.id, &needed, &mut t.cc.held).await;
        t.enter(prev);
        r?;
    }
    // E2, E3: READ the CVTs and records, all in one round.
    let id = t.id;
    let got = join_all(want.iter().zip(&modes).zip(&existing).zip(&keys).map(
        |(((&(tb, k, upd), &m), &ex), &lk)| {
            let loc = ex.and_then(|i| t.objs[i].loc);
            // Rule 1 of the cache: locked keys only (read-only transactions and
            // snapshot reads take no lock).
            let cache = m.and_then(|_| p.cache_for(lk));
            async move {
                match m {
                    Some(_) => read_locked(c, tb, k, loc, cache, s, upd.then_some(id)).await,
                    None => read_snapshot(c, tb, k, s).await,
                }
            }
        },
    ))
    .await;
    let mut failed = None;
    for ((r, m), ex) in got.into_iter().zip(modes).zip(existing) {
        let mut o = match r {
            Ok(o) => o,
            Err(e) => {
                failed.get_or_insert(e);
                continue;
            }
        };
        o.cc.lock = m;
        match ex {
            Some(i) => {
                // Read before (unlocked, or under a read lock), locked now: unchanged.
                let prev = &mut t.objs[i];
                if o.version != prev.version {
                    failed.get_or_insert(TxnError::Abort(AbortReason::NewerVersion));
                }
                prev.cc.lock = match (prev.cc.lock, o.cc.lock) {
                    (Some(a), Some(b)) => Some(a.max_mode(b)),
                    (a, b) => a.or(b),
                };
                prev.loc = o.loc.or(prev.loc);
                prev.cvt = o.cvt;
            }
            None => t.objs.push(o),
        }
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Commit (C1 to C3; the caller unlocks, C4).
async fn commit(p: &Lotus, t: &mut A<'_>) -> Result<(), TxnError> {
    let c = t.core;
    let Some(s) = t.start else {
        return Ok(()); // Nothing read, nothing written.
    };
    if t.objs.iter().all(|o| o.write.is_none()) {
        // Read-only (or a read-write transaction that wrote nothing): its reads were a
        // snapshot at `s`, locked or checked by the INVISIBLE rule.
        t.record(Some((s, s)), Timestamp::ZERO);
        return Ok(());
    }
    // Written objects not write-locked yet: lock (or upgrade) and re-read them now.
    let late: Vec<Want> = t
        .objs
        .iter()
        .filter(|o| o.write.is_some() && o.cc.lock != Some(LockMode::Write))
        .map(|o| (o.table, o.key, true))
        .collect();
    if !late.is_empty() {
        fetch(p, t, &late).await?;
    }
    // C1: records and cells, INVISIBLE, on every copy (and the log before them).
    t.enter(Phase::WriteBack);
    t.cc.wrote = true;
    let tag = invisible(t.id);
    t.write_back(|_| tag).await?;
    // C2: the commit timestamp, after every C1 WRITE was acknowledged.
    t.enter(Phase::Timestamp);
    let commit_ts = c.timestamp().await?;
    // C3: write visible.
    t.enter(Phase::WriteBack);
    publish(t, commit_ts).await?;
    // Rule 3 of the cache: the published CVTs replace the cached ones before C4.
    for o in t
        .objs
        .iter()
        .filter(|o| o.write.is_some() && !skip_vtc_update())
    {
        if let (Some((vc, lk)), Some(loc), Some(cvt)) =
            (p.cache_for((p.lock_key)(o.table, o.key)), o.loc, &o.cvt)
        {
            vc.update(lk, o.table, o.key, loc, cvt);
        }
    }
    t.record(Some((s, commit_ts)), commit_ts);
    Ok(())
}

/// C3: WRITE `ts` into every INVISIBLE cell this attempt installed, on every copy, in one
/// round. With commit logs on, each memory node's list starts with `ts` written into its
/// log copy's commit word, on the same QP: a cell published on a node implies the commit
/// word landed there first, which recovery relies on ([`crate::recovery`]).
///
/// Errors: [`TxnError::WriteBack`].
async fn publish(t: &mut A<'_>, ts: Timestamp) -> Result<(), TxnError> {
    let word = ts.get().to_le_bytes();
    let mut lists: Vec<WordList> = t
        .commit_word_targets()
        .map_err(write_back_error)?
        .into_iter()
        .map(|(n, at)| (n, vec![(at, word)]))
        .collect();
    let store = &t.core.store;
    let id = t.id;
    for o in t.objs.iter_mut().filter(|o| o.write.is_some()) {
        let loc = o.loc.expect("a written object has a CVT");
        let cvt = o.cvt.as_mut().expect("a written object's CVT was read");
        let cell = cvt
            .invisible_cell(id)
            .expect("C1 installed the attempt's INVISIBLE cell");
        cvt.cells[cell].version = ts;
        for (n, at, w) in store
            .publish_writes(loc, cell, ts)
            .map_err(write_back_error)?
        {
            match lists.iter_mut().find(|(m, _)| *m == n) {
                Some((_, l)) => l.push((at, w)),
                None => lists.push((n, vec![(at, w)])),
            }
        }
    }
    let ctx = store.ctx();
    // Armed, the crash point after the first publish sends the first node's list alone
    // first (so that "some cells published, others INVISIBLE" happens).
    if crate::attempt::crash_armed(crate::attempt::CrashPoint::AfterFirstPublish) && lists.len() > 1
    {
        let (first, _) = lists.split_at(1);
        let sent = send_lists(ctx, first).await;
        store.tolerate(sent).await.map_err(write_back_error)?;
        crate::attempt::crash_point(crate::attempt::CrashPoint::AfterFirstPublish).await;
        lists.remove(0);
    }
    let sent = send_lists(ctx, &lists).await;
    store.tolerate(sent).await.map_err(write_back_error)
}

/// A memory node and the 8-byte WRITEs to post to it, in order.
type WordList = (rrpc::NodeId, Vec<(RemoteAddr, [u8; 8])>);

/// Each `(node, ordered WRITEs)` list as one WR list on one QP, all lists in parallel.
async fn send_lists(
    ctx: &rrpc::runtime::ThreadCtx,
    lists: &[WordList],
) -> Vec<(rrpc::NodeId, Result<(), rrpc::runtime::OneSidedError>)> {
    join_all(lists.iter().map(|(n, l)| async move {
        let writes: Vec<(RemoteAddr, &[u8])> = l.iter().map(|(a, w)| (*a, &w[..])).collect();
        let r = match crate::transient::write_ordered(ctx, *n, &writes).await {
            // Too long for one post (nothing was sent): the first WRITE (the commit
            // word, when logging), then the rest.
            Err(rrpc::runtime::OneSidedError::TooLarge { .. }) => {
                let (first, rest) = writes.split_first().expect("a list is never empty");
                match crate::transient::write(ctx, *n, first.0, first.1).await {
                    Ok(()) => join_all(
                        rest.iter()
                            .map(|&(a, d)| crate::transient::write(ctx, *n, a, d)),
                    )
                    .await
                    .into_iter()
                    .collect::<Result<Vec<()>, _>>()
                    .map(drop),
                    e => e,
                }
            }
            r => r,
        };
        (*n, r)
    }))
    .await
}

fn write_back_error(e: TxnError) -> TxnError {
    TxnError::WriteBack {
        cause: Box::new(e),
        release: None,
    }
}
