//! Scythe's hot-aware concurrency control on Takeout Locks (Scythe,
//! 4.2 to 4.4), over the CVT store (newest version only; the CVT lock words are unused:
//! the locks live in the lock service).
//!
//! **Where the locks live**: on one lockd node, or with the data (4.3):
//! each memory node serves its partition's Takeout Locks (`memnode --lock-service`),
//! and a TOCC ticket on an object whose CVT address is cached goes out as a
//! lock-and-read RPC ([`crate::lock_read`]): served at once, its grant carries the CVT
//! and the record, and the read is that one RPC instead of a Lock RPC, a CVT READ and a
//! record READ. A lock last seen with someone ahead is asked for in the round's batched
//! Lock RPC instead (it would queue and come back without data). Both RPCs are served in
//! one timestamp order (one sort group, [`rrpc::server::Handlers::register_sorted_in`]).
//!
//! **Mode choice (4.2.1 (1), 4.3 (3))**: an attempt starts in OCC and switches to TOCC at
//! the first read round that meets a hot object, whichever round that is. An object is
//! hot for a transaction when the lock service last reported it hotter than
//! ColdWatermark ([`lockd::client::LockClient::mode_for`], heat seen by execution reads,
//! Lock replies and ticket polls), or when one of the transaction's earlier attempts
//! aborted on it (held or queued at an OCC read, refused, changed or busy at validation,
//! a lock wait that timed out) or found its cold lock request queued behind anyone: the
//! mode is decided per transaction when it retries after an abort
//! ([`crate::coordinator::TxnClient::begin_retry`] carries those rows from the aborted
//! attempt to the next). An OCC read aborts on any held or queued lock, so nobody queues
//! on a hot row in OCC and the lock service's heat alone never passes ColdWatermark
//! there; the retry's own rows are what sends it to TOCC. A refusal past ColdWatermark
//! likewise sends the retry to TOCC from the round that meets the hot object on, and a
//! cooled object brings a new transaction back. (Choosing only at the first round, as this module once
//! did, left TPC-C's Payment, whose first round is the customer-by-name index, in OCC on
//! WAREHOUSE_YTD for ever: it aborted on locked-on-read at its second round.) The switch
//! (`to_tocc`) takes the timestamp and hot tickets on the objects read so far that
//! TOCC tickets (below), and once they are served checks that each is still at the
//! version its OCC read saw (else [`AbortReason::ValidationVersion`]): from then on the
//! attempt holds them as if it had read them under its tickets.
//!
//! **OCC (low heat, 4.2.1, Fig. 12 (a))**:
//! - execution reads the CVT and record together with the object's Takeout Lock words;
//!   a lock held or queued aborts at once (4.2.1 (3));
//! - at commit, the attempt's timestamp (through the thread's TSO group), then one
//!   cold-mode Lock RPC per 15 written objects, all in flight at once
//!   (parallel locking, 4.2.1 (2)), tickets waited for with Hangout polling; inserted
//!   keys get their CVTs, all in parallel, once their tickets are served;
//! - validation ([`crate::validation`]): lock words of objects only read first, their
//!   CVT only after they were seen free (the two live on different nodes; the other order
//!   lets write skew commit); written objects' CVTs in the first round;
//! - write-back (version + 1), then every ticket released (FAA of `upper`).
//!
//! **TOCC (high heat, 4.2.2, Fig. 12 (b), 4.4)**: the attempt's one timestamp (taken
//! at the switch) orders its tickets; a read of an object the transaction will write (read for update)
//! or that the lock service reports hot takes a hot-mode ticket on it (one Lock RPC per
//! round, the lock service sorting a polling round's requests by (lock, timestamp)) and
//! reads once the ticket is served; writes are buffered and installed at commit under
//! the tickets already held (written objects read without a ticket get one at commit).
//! A refusal (a newer timestamp already queued, or past HotWatermark) aborts; one on an
//! object whose queue lies between ColdWatermark and HotWatermark first waits
//! [`crate::config::TxnConfig::tocc_wait`] (4.4 (2), Aurogon's heuristic wait: about
//! 20 us before retrying), so that requests with smaller timestamps get there before
//! the retry. (Waiting before every hot request on a warm object, as this module once
//! did, charged the wait to requests that would have been granted.) An attempt that
//! aborts drops its tickets not yet served: each passes the lock on from a coroutine of
//! its own when its turn comes, so the abort does not wait in the queues.
//!
//! **Read-only objects in TOCC**: an object the transaction only reads takes a ticket
//! only when the lock service reports it hot. A colder one is read after the round's
//! tickets are served, with its lock words as in OCC (held or queued aborts at once,
//! 4.2.1 (3)), and validated at commit as in OCC (lock free, then version unchanged,
//! after every ticket is held). A Takeout Lock is an exclusive ticket lock, so ticketing
//! such objects serializes their readers: TPC-C's WAREHOUSE row, read by every NewOrder
//! and Payment and written by none, became the hottest lock of the run, and OCC readers
//! of it aborted on locked-on-read. Serializability is kept by the validation argument
//! of [`crate::validation`]: at the moment every ticket is held, each ticketed object
//! is at the version read (read or checked under its ticket) and each validated one was
//! free and unchanged after it, so the transaction serializes there. An attempt whose
//! every object was read under a ticket skips validation, as the paper's TOCC does
//! (4.2.2 (3)). Two other rules were measured and dropped (TPC-C and SmallBank at theta
//! 0.99, 1 x 32 coroutines, cx5): ticketing every read-only object whose lock was last
//! seen held or queued fed on itself on TPC-C (a reader's ticket is what the next
//! reader sees; Payment queued for DISTRICT behind NewOrders while it held
//! WAREHOUSE_YTD: 42 committed/s); queueing for a cold read-only object found busy,
//! rather than aborting, held the round's hot tickets through a second Lock RPC and
//! wait (SmallBank: 14.5k committed/s, p99 18 ms, against 34k and 5 ms with the abort).
//! The rule kept costs SmallBank some tail against the paper's ticket on every read
//! (side by side: p99 6.5 to 7.2 ms against 5.0 to 5.5 ms, 38k to 40k committed/s
//! against 40k to 42k): a TOCC attempt validates its cold read-only objects at commit,
//! two more round trips under its hot tickets.
//!
//! **When the timestamp is taken.** Fig. 12 takes it at begin. Taking it with the first
//! read round, in parallel with the reads, was measured against taking it at the first
//! ticket request (commit in OCC, the switch in TOCC), alternated in one session, each
//! point a `--protocol all` invocation (SmallBank 100,000 accounts; cx5 runs 2 threads x
//! 32 coroutines; TPC-C 1 warehouse, cx5): the main job's (no model, 1 x 8) p99 ratio
//! to OCC-CAS was 1.43 to 1.65 at begin against 1.36 to 1.38 at the first request;
//! theta 0.5 and 0.99 and TPC-C did not tell them apart (throughput ratios within 0.05).
//! Every transaction, read-only ones included, then pays a TSO round in its first round,
//! and a timestamp taken earlier is older when its Lock RPC arrives, so `queued_ts`
//! refuses more. So the timestamp is taken at the first ticket request.
//!
//! Deadlock freedom (4.4 (1)): a transaction takes all its tickets, in any mode and
//! over any number of rounds, with its one timestamp, and a lock queue admits only
//! timestamps at least its `queued_ts`, so each queue is in timestamp order and a
//! transaction waits only for holders with smaller timestamps.

use crate::attempt::{crash_armed, crash_point, CrashPoint};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::time::Instant;

use lockd::client::{Grant, LockClient, LockConn, LockError, LockRequest, Ticket};
use lockd::takeout::{Mode, RefuseReason};
use rrpc::runtime::{join, join_all};
use std::rc::Rc;
use tso::Timestamp;

use crate::attempt;
use crate::client_core::ClientCore;
use crate::error::{AbortReason, TxnError};
use crate::phase::Phase;
use crate::protocol::{AttemptOf, ConcurrencyControl, Want};
use crate::validation::{self, RecordSeen, Step, Validation};

/// Scythe on its lock services: their connections (each follows its service across
/// restarts), and how objects map onto their locks.
///
/// **Lock placement.** One service (a lockd node) holds every lock, or each memory node
/// serves the locks of its partition's objects (Scythe 4.3: an object's Takeout Lock at
/// the memory node that holds it; `memnode --lock-service`). A lock id carries its
/// service in its top bits ([`SERVICE_SHIFT`]): the service of `(table, key)` is its
/// partition ([`crate::cvt_remote::partition_of`]), the low bits its lock in that
/// service's table.
pub(crate) struct Scythe {
    /// By service: the one lockd, or the memory nodes' by partition.
    locks: Vec<LockConn>,
    /// Locks of each service when the client connected: the object-to-lock mapping
    /// stays the same across its restarts.
    n_locks: Vec<u64>,
    /// Tables of the store (for [`Self::lock_id`]).
    tables: u64,
    /// Hot rows (lock ids) of aborted attempts, by attempt id, until their transaction's
    /// retry takes them ([`ConcurrencyControl::begin`]); at most [`CARRY_MAX`] kept.
    carry: RefCell<VecDeque<(u64, Vec<u64>)>>,
    /// Per table: attempts that read it, of those the attempts that ran TOCC, and the
    /// id of the last attempt counted (so an attempt counts once per table).
    tocc_share: RefCell<Vec<(u64, u64, u64)>>,
    /// Lock-and-read RPCs sent, and grants whose object was taken from the reply.
    lock_reads: std::cell::Cell<(u64, u64)>,
}

/// Aborted attempts whose hot rows wait for a retry; past it the oldest are dropped (a
/// transaction that is not retried leaves nothing behind for long).
const CARRY_MAX: usize = 1024;

/// Scythe's state of one attempt.
#[derive(Default)]
pub(crate) struct ScytheAttempt {
    /// This attempt runs TOCC (high-heat mode).
    tocc: bool,
    /// Takeout Lock tickets held, by lock id. Dropped tickets release themselves.
    tickets: Vec<(u64, Ticket)>,
    /// Rows (lock ids) this transaction treats as hot (4.2.1 (1)): those on which one of
    /// its earlier attempts aborted or found a cold lock request queued behind anyone,
    /// and those this attempt met so.
    hot_rows: Vec<u64>,
}

impl ScytheAttempt {
    fn mark_hot(&mut self, id: u64) {
        if !self.hot_rows.contains(&id) {
            self.hot_rows.push(id);
        }
    }
}

/// Scythe's state of an object read.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ScytheObj {
    /// Read, or checked unchanged, under this transaction's served Takeout ticket, which
    /// it holds until commit: needs no validation.
    ticketed: bool,
}

type Obj = attempt::Obj<ScytheObj>;
type A<'a> = AttemptOf<'a, Scythe>;

impl ConcurrencyControl for Scythe {
    type State = ScytheAttempt;
    type ObjState = ScytheObj;

    /// A retry starts from the hot rows its transaction's earlier attempts met (4.2.1
    /// (1): the mode is chosen per transaction when it retries after an abort).
    fn begin(&self, t: &mut A<'_>, retry_of: Option<u64>) {
        let Some(prev) = retry_of else { return };
        let mut carry = self.carry.borrow_mut();
        if let Some(i) = carry.iter().position(|(id, _)| *id == prev) {
            if let Some((_, rows)) = carry.remove(i) {
                t.cc.hot_rows = rows;
            }
        }
    }

    async fn fetch(&self, t: &mut A<'_>, want: &[Want]) -> Result<(), TxnError> {
        self.fetch_round(t, want).await
    }

    async fn commit(&self, t: &mut A<'_>) -> Result<(), TxnError> {
        self.commit_attempt(t).await
    }

    /// Release the CVT lock words (none: Scythe's locks are tickets) and every ticket:
    /// served tickets pass the lock on now (one FAA each, in one round); a ticket whose
    /// turn has not come (an aborted attempt's) is dropped, and a coroutine of its own
    /// passes it on when its turn comes, so that an abort does not wait in queues.
    async fn release(&self, t: &mut A<'_>) -> Result<(), TxnError> {
        let (served, queued): (Vec<_>, Vec<_>) = std::mem::take(&mut t.cc.tickets)
            .into_iter()
            .partition(|(_, tk)| tk.is_served());
        drop(queued);
        let mut first = t.committed;
        // Armed, the crash point after the first unlock holds the other releases back
        // until the first passed it (see `Attempt::write_back`).
        let gate = std::cell::Cell::new(!first || !crash_armed(CrashPoint::AfterFirstUnlock));
        let (gate, ctx) = (&gate, t.core.store.ctx());
        let (a, b) = join(
            t.release_cvt_locks(),
            join_all(served.into_iter().map(|(_, tk)| {
                let crash = std::mem::take(&mut first);
                async move {
                    while !crash && !gate.get() {
                        ctx.yield_now().await;
                    }
                    let r = tk.release().await;
                    if crash {
                        crash_point(CrashPoint::AfterFirstUnlock).await;
                        gate.set(true);
                    }
                    r
                }
            })),
        )
        .await;
        a?;
        // A ticket of a service that died or restarted cannot be passed on, and need not
        // be: its lock died with the table (the successor grants after its grace). The
        // next lock operation reconnects if the service is still the old one.
        match b
            .into_iter()
            .filter_map(Result::err)
            .find(|e| !e.service_gone())
        {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Counts the attempt for the TOCC share of each table it read, and keeps the hot
    /// rows of an attempt that did not commit for its transaction's retry.
    fn finish(&self, t: &mut A<'_>) {
        let mut share = self.tocc_share.borrow_mut();
        for o in &t.objs {
            let i = o.table as usize;
            if share.len() <= i {
                share.resize(i + 1, (0, 0, 0));
            }
            let s = &mut share[i];
            if s.2 != t.id {
                // Attempt ids are never 0, so a fresh entry counts its first attempt.
                *s = (s.0 + 1, s.1 + u64::from(t.cc.tocc), t.id);
            }
        }
        if !t.committed && !t.cc.hot_rows.is_empty() {
            let mut carry = self.carry.borrow_mut();
            if carry.len() >= CARRY_MAX {
                carry.pop_front();
            }
            carry.push_back((t.id, std::mem::take(&mut t.cc.hot_rows)));
        }
    }

    fn hot_mode(&self, t: &A<'_>) -> bool {
        t.cc.tocc
    }
}

/// Bit of a lock id where its service's index starts (see [`Scythe`]): a service has
/// fewer than 2^48 locks.
pub(crate) const SERVICE_SHIFT: u32 = 48;

impl Scythe {
    /// Scythe over `locks` (one service, or one per partition of the store, by
    /// partition) for a store of `tables` tables.
    pub(crate) fn new(locks: Vec<LockConn>, tables: usize) -> Self {
        assert!(!locks.is_empty(), "Scythe needs a lock service");
        Self {
            n_locks: locks
                .iter()
                .map(|l| l.client().n_locks().clamp(1, 1 << SERVICE_SHIFT))
                .collect(),
            locks,
            tables: tables.max(1) as u64,
            carry: RefCell::new(VecDeque::new()),
            tocc_share: RefCell::new(Vec::new()),
            lock_reads: std::cell::Cell::new((0, 0)),
        }
    }

    /// Per table id (index): attempts so far that read the table, and of those the
    /// attempts that ran TOCC.
    pub(crate) fn tocc_share(&self) -> Vec<(u64, u64)> {
        self.tocc_share
            .borrow()
            .iter()
            .map(|&(attempts, tocc, _)| (attempts, tocc))
            .collect()
    }

    /// The lock services' clients as they are now, by service (one, or one per
    /// partition); lock `id` is lock [`split_id`]`(id).1` of service `split_id(id).0`.
    pub(crate) fn locks(&self) -> Vec<Rc<LockClient>> {
        self.locks.iter().map(LockConn::client).collect()
    }

    /// The connections to the lock services (their reconnects).
    pub(crate) fn conns(&self) -> &[LockConn] {
        &self.locks
    }

    /// The connection of the service that holds lock `id`.
    fn conn(&self, id: u64) -> &LockConn {
        &self.locks[split_id(id).0]
    }

    /// The transaction error of a lock-service failure `e` met on `used`: after a
    /// restart, a lost service or a grace refusal, let the connection reconnect (or back
    /// off) and abort the attempt ([`AbortReason::LockService`]), to be retried on the
    /// new service; any other error as it is.
    async fn lock_failed(
        &self,
        ctx: &Rc<rrpc::runtime::ThreadCtx>,
        conn: &LockConn,
        used: &Rc<LockClient>,
        e: LockError,
    ) -> TxnError {
        let service = e.service_gone() || matches!(e, LockError::Restarting(_));
        conn.failed(ctx, used, &e).await;
        if service {
            tracing::debug!(error = %e, "lock service failure: the attempt aborts");
            TxnError::Abort(AbortReason::LockService)
        } else {
            e.into()
        }
    }

    /// Lock id of `(table, key)`: its service (the one, or its partition's; see
    /// [`Scythe`]) in the top bits, and in the low bits its lock there: keys of all
    /// tables interleaved (`key * tables + table`) while that fits in the lock table, so
    /// dense keys (SmallBank's accounts) each get their own lock; past it, a hash of that
    /// number onto the lock table. Two objects may then share a lock, which only adds
    /// false conflicts; the hash keeps composite keys (TPC-C's orders of different
    /// districts, which differ only in high bits) from landing on the same locks.
    pub(crate) fn lock_id(&self, table: u32, key: u64) -> u64 {
        lock_id_of(&self.n_locks, self.tables, table, key)
    }

    /// True when lock `id` is held or queued (by anyone).
    async fn lock_busy(&self, core: &ClientCore, id: u64) -> Result<bool, TxnError> {
        let conn = self.conn(id);
        let lc = conn.client();
        let ctx = core.store.ctx();
        match lc.peek_state(ctx, split_id(id).1).await {
            Ok(st) => Ok(st.queued() > 0),
            Err(e) => Err(self.lock_failed(ctx, conn, &lc, e).await),
        }
    }

    /// Whether lock `id` is hot for this transaction: the lock service last reported it
    /// hotter than ColdWatermark ([`lockd::client::LockClient::mode_for`], Scythe 4.3
    /// (3)), or the transaction met it busy before ([`ScytheAttempt::hot_rows`]).
    fn hot(&self, cc: &ScytheAttempt, id: u64) -> bool {
        cc.hot_rows.contains(&id) || self.conn(id).client().mode_for(split_id(id).1) == Mode::Hot
    }

    /// Whether TOCC queues for a ticket on lock `id` of an object it reads (`for_update`:
    /// to be written) (4.2.2 (1), 4.4): objects to be written, and objects only read that
    /// the lock service reports hot. A cold object only read is read lock-free and
    /// validated at commit, as in OCC (module docs: read-only objects).
    fn needs_ticket(&self, cc: &ScytheAttempt, id: u64, for_update: bool) -> bool {
        for_update || self.hot(cc, id)
    }

    /// Execution reads of `want` (objects not in the read set yet). The attempt switches to
    /// TOCC at the first round that meets an object the lock service reported hot (4.2.1
    /// (1), 4.3 (3)), whichever round that is ([`to_tocc`]).
    async fn fetch_round(&self, t: &mut A<'_>, want: &[Want]) -> Result<(), TxnError> {
        let core = t.core;
        if !t.cc.tocc
            && want
                .iter()
                .any(|&(tb, k, _)| self.hot(&t.cc, self.lock_id(tb, k)))
        {
            self.to_tocc(t).await?;
        }
        if t.cc.tocc {
            return self.fetch_tocc(t, want).await;
        }
        let got = join_all(
            want.iter()
                .map(|&(tb, k, _)| self.read_optimistic(core, tb, k)),
        )
        .await;
        self.keep_reads(t, got, want, &vec![false; want.len()])
    }

    /// Push a round's reads into the read set (`ticketed[i]`: read `i` was made under
    /// a served ticket); a read that aborted on a held or queued lock marks its row hot
    /// for the transaction's retries. Returns the round's first error.
    fn keep_reads(
        &self,
        t: &mut A<'_>,
        got: Vec<Result<Obj, TxnError>>,
        want: &[Want],
        ticketed: &[bool],
    ) -> Result<(), TxnError> {
        let mut failed = None;
        for ((o, &(tb, k, u)), &q) in got.into_iter().zip(want).zip(ticketed) {
            match o {
                Ok(mut o) => {
                    o.for_update = u;
                    o.cc.ticketed = q;
                    t.objs.push(o);
                }
                Err(e) => {
                    if matches!(e, TxnError::Abort(AbortReason::LockedOnRead)) {
                        t.cc.mark_hot(self.lock_id(tb, k));
                    }
                    failed.get_or_insert(e);
                }
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// An OCC execution read: the CVT and record with the object's Takeout Lock words; a
    /// lock held or queued aborts at once (4.2.1 (3)).
    async fn read_optimistic(&self, core: &ClientCore, tb: u32, k: u64) -> Result<Obj, TxnError> {
        let (o, busy) = join(
            Obj::read_newest(core, tb, k, false),
            self.lock_busy(core, self.lock_id(tb, k)),
        )
        .await;
        if busy? {
            return Err(TxnError::Abort(AbortReason::LockedOnRead));
        }
        o
    }

    /// Switch an OCC attempt to TOCC before a round that meets a hot object: take the
    /// timestamp and hot tickets on the objects read so far that TOCC tickets
    /// ([`needs_ticket`]), and once they are served check that each is still at the version
    /// its OCC read saw (abort [`AbortReason::ValidationVersion`] if not). From then on those
    /// objects are held as if read under their tickets; the others stay in the read set for
    /// commit's validation.
    async fn to_tocc(&self, t: &mut A<'_>) -> Result<(), TxnError> {
        let c = t.core;
        t.cc.tocc = true;
        let idx: Vec<usize> = (0..t.objs.len())
            .filter(|&i| {
                let o = &t.objs[i];
                let id = self.lock_id(o.table, o.key);
                !o.cc.ticketed && self.needs_ticket(&t.cc, id, o.for_update || o.write.is_some())
            })
            .collect();
        if idx.is_empty() {
            return Ok(());
        }
        let ids: Vec<u64> = idx
            .iter()
            .map(|&i| self.lock_id(t.objs[i].table, t.objs[i].key))
            .collect();
        self.take_tickets(t, &ids, Mode::Hot).await?;
        let objs = &t.objs;
        let seen = join_all(idx.iter().map(|&i| {
            let o = &objs[i];
            c.store.reread(o.table, o.key, o.loc)
        }))
        .await;
        for (&i, cvt) in idx.iter().zip(seen) {
            let cvt = cvt?;
            let o = &mut t.objs[i];
            if cvt.as_ref().map_or(Timestamp::ZERO, |c| c.newest_version()) != o.version {
                let id = self.lock_id(o.table, o.key);
                t.cc.mark_hot(id);
                return Err(TxnError::Abort(AbortReason::ValidationVersion));
            }
            if o.loc.is_some() {
                o.cvt = cvt;
            }
            o.cc.ticketed = true;
        }
        Ok(())
    }

    /// TOCC execution reads (4.2.2 (1)): hot tickets on the objects to be written and the
    /// hot ones ([`needs_ticket`]), in one Lock RPC round; once served, those objects and
    /// the cold objects only read are read in one round, the latter with their lock words
    /// as in OCC ([`read_optimistic`]: held or queued aborts).
    async fn fetch_tocc(&self, t: &mut A<'_>, want: &[Want]) -> Result<(), TxnError> {
        let c = t.core;
        let held = |t: &A<'_>, id: u64| t.cc.tickets.iter().any(|(h, _)| *h == id);
        let queue: Vec<bool> = want
            .iter()
            .map(|&(tb, k, u)| {
                let id = self.lock_id(tb, k);
                self.needs_ticket(&t.cc, id, u) || held(t, id)
            })
            .collect();
        let ids: Vec<u64> = want
            .iter()
            .zip(&queue)
            .filter(|(_, &q)| q)
            .map(|(&(tb, k, _), _)| self.lock_id(tb, k))
            .collect();
        // With the locks on the memory nodes, a ticket on an object whose CVT address is
        // cached asks for the object with it (lock-and-read, Scythe 4.3): served at
        // once, the grant brings the CVT and the record, and no READ follows. Not where
        // the lock was last seen with another holder or waiter ahead: the ticket would
        // queue and come back without data, and such requests go in one Lock RPC.
        let locs: Vec<(u64, crate::cvt_remote::CvtLoc)> = want
            .iter()
            .zip(&queue)
            .filter(|(_, &q)| q)
            .filter_map(|(&(tb, k, _), _)| {
                let id = self.lock_id(tb, k);
                let lc = self.conn(id).client();
                if held(t, id) || !lc.serves_lock_read() || lc.heat(split_id(id).1).unwrap_or(0) > 1
                {
                    return None;
                }
                Some((id, c.store.cached(tb, k)?))
            })
            .collect();
        let reads: Vec<(u64, [u8; lockd::wire::READ_DESC_BYTES])> = locs
            .iter()
            .map(|(id, loc)| (*id, crate::lock_read::desc(loc.table, loc.addr)))
            .collect();
        let prefetched = self
            .take_tickets_reading(t, &ids, Mode::Hot, &reads)
            .await?;
        let got = join_all(want.iter().zip(&queue).map(|(&(tb, k, _), &q)| {
            let id = self.lock_id(tb, k);
            let grant = q
                .then(|| {
                    let bytes = prefetched.iter().find(|(p, _)| *p == id)?;
                    let loc = locs.iter().find(|(p, _)| *p == id)?;
                    Some((loc.1, &bytes.1))
                })
                .flatten();
            async move {
                if let Some(o) = grant.and_then(|(loc, b)| self.take_granted(c, loc, k, b)) {
                    return Ok(o);
                }
                if q {
                    Obj::read_newest(c, tb, k, false).await
                } else {
                    self.read_optimistic(c, tb, k).await
                }
            }
        }))
        .await;
        self.keep_reads(t, got, want, &queue)
    }

    /// The object `(loc.table, k)` from the bytes a lock-and-read grant carried for its
    /// CVT at `loc` ([`crate::lock_read::decode`]), counted in
    /// [`Self::lock_read_counts`]; `None` when they are not usable (the caller READs).
    fn take_granted(
        &self,
        c: &ClientCore,
        loc: crate::cvt_remote::CvtLoc,
        k: u64,
        bytes: &[u8],
    ) -> Option<Obj> {
        let tb = loc.table;
        let e = c.store.tables().get(tb as usize)?;
        let (cvt, value) = crate::lock_read::decode(bytes, e.versions, e.len, tb, k)?;
        let mut o = Obj::absent(tb, k);
        o.loc = Some(loc);
        if let Some(i) = cvt.newest() {
            o.version = cvt.cells[i].version;
        }
        o.value = value;
        o.cvt = Some(cvt);
        let n = self.lock_reads.get();
        self.lock_reads.set((n.0, n.1 + 1));
        Some(o)
    }

    /// Lock-and-read requests sent so far, and of those the grants whose object came
    /// with them and was taken (no READ after the Lock RPC).
    pub(crate) fn lock_read_counts(&self) -> (u64, u64) {
        self.lock_reads.get()
    }

    /// Take tickets on `ids` (those not held yet, deduplicated) in `mode` with the
    /// transaction's timestamp (taken now if it has none), and wait until each is served.
    /// Tickets taken are kept in the transaction, so that every path releases them.
    async fn take_tickets(&self, t: &mut A<'_>, ids: &[u64], mode: Mode) -> Result<(), TxnError> {
        self.take_tickets_reading(t, ids, mode, &[]).await.map(drop)
    }

    /// [`Self::take_tickets`], the ids in `reads` each with its own lock-and-read RPC
    /// and read descriptor ([`crate::lock_read`]): returns, by lock id, the bytes that
    /// came with the grants served at once.
    async fn take_tickets_reading(
        &self,
        t: &mut A<'_>,
        ids: &[u64],
        mode: Mode,
        reads: &[(u64, [u8; lockd::wire::READ_DESC_BYTES])],
    ) -> Result<Vec<(u64, Vec<u8>)>, TxnError> {
        let prev = t.enter(Phase::Lock);
        let r = self.queue_and_wait(t, ids, mode, reads).await;
        t.enter(prev);
        r
    }

    /// [`Self::take_tickets_reading`]'s work, timed as [`Phase::Lock`].
    async fn queue_and_wait(
        &self,
        t: &mut A<'_>,
        ids: &[u64],
        mode: Mode,
        reads: &[(u64, [u8; lockd::wire::READ_DESC_BYTES])],
    ) -> Result<Vec<(u64, Vec<u8>)>, TxnError> {
        let c = t.core;
        let mut ids: Vec<u64> = ids
            .iter()
            .copied()
            .filter(|id| !t.cc.tickets.iter().any(|(h, _)| h == id))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let ts = t.timestamp().await?;
        let first_new = t.cc.tickets.len();
        // One Lock RPC per service and batch of requests (ids are sorted, so by
        // service), a lock-and-read RPC per read, every one in flight at once.
        type Desc = [u8; lockd::wire::READ_DESC_BYTES];
        let mut batches: Vec<(usize, Vec<LockRequest>, Option<Desc>)> = Vec::new();
        for &id in &ids {
            let (s, local) = split_id(id);
            let req = LockRequest {
                id: local,
                ts: ts.get(),
                mode,
            };
            if let Some((_, d)) = reads.iter().find(|(r, _)| *r == id) {
                batches.push((s, vec![req], Some(*d)));
                continue;
            }
            match batches.iter_mut().rev().find(|(_, _, d)| d.is_none()) {
                Some((bs, reqs, _)) if *bs == s && reqs.len() < lockd::wire::MAX_ENTRIES => {
                    reqs.push(req)
                }
                _ => batches.push((s, vec![req], None)),
            }
        }
        let clients: Vec<Rc<LockClient>> = self.locks();
        let ctx = c.store.ctx();
        let replies = join_all(batches.iter().map(|(s, reqs, desc)| {
            let lc = &clients[*s];
            async move {
                match desc {
                    Some(d) => {
                        let (g, b) = lc.lock_read(ctx, reqs[0], d).await?;
                        Ok((vec![g], b))
                    }
                    None => Ok((lc.lock(ctx, reqs).await?, Vec::new())),
                }
            }
        }))
        .await;
        let sent = batches.iter().filter(|b| b.2.is_some()).count() as u64;
        if sent > 0 {
            let n = self.lock_reads.get();
            self.lock_reads.set((n.0 + sent, n.1));
        }
        let mut refused = None;
        let mut failed = None;
        let mut warm_refusal = false;
        let mut prefetched = Vec::new();
        for ((s, reqs, _), grants) in batches.iter().zip(replies) {
            let grants: Vec<Grant> = match grants {
                Ok((g, bytes)) => {
                    if !bytes.is_empty() {
                        prefetched.push(((*s as u64) << SERVICE_SHIFT | reqs[0].id, bytes));
                    }
                    g
                }
                Err(e) => {
                    failed.get_or_insert((*s, e));
                    continue;
                }
            };
            let export = clients[*s].export();
            let (cold, hot) = (export.cold_watermark, export.hot_watermark);
            for (req, g) in reqs.iter().zip(grants) {
                let id = (*s as u64) << SERVICE_SHIFT | req.id;
                match g {
                    Grant::Queued(tk) => {
                        if mode == Mode::Cold && tk.reply().ahead() > 0 {
                            // A cold request queued behind anyone: hot for the retries.
                            t.cc.mark_hot(id);
                        }
                        t.cc.tickets.push((id, tk));
                    }
                    Grant::Refused(r) => {
                        let queued = r.ahead();
                        warm_refusal |= queued > cold && queued < hot;
                        t.cc.mark_hot(id);
                        refused.get_or_insert(match r.reason {
                            Some(RefuseReason::Timestamp) => AbortReason::LockRefusedTimestamp,
                            Some(RefuseReason::HotWatermark) => AbortReason::LockRefusedHot,
                            _ => AbortReason::LockRefusedCold,
                        });
                    }
                }
            }
        }
        if let Some((s, e)) = failed {
            return Err(self
                .lock_failed(c.store.ctx(), &self.locks[s], &clients[s], e)
                .await);
        }
        if let Some(reason) = refused {
            // 4.4 (2), after Aurogon: a refusal on an object whose queue lies between
            // ColdWatermark and HotWatermark waits about 20 us before the retry, so that
            // requests with smaller timestamps get there first. (Charged to the lock
            // phase.)
            if warm_refusal && !c.cfg.tocc_wait.is_zero() {
                c.store.ctx().sleep(c.cfg.tocc_wait).await;
            }
            return Err(TxnError::Abort(reason));
        }
        let deadline = Instant::now() + c.cfg.lock_wait;
        let waits = join_all(
            t.cc.tickets[first_new..]
                .iter_mut()
                .map(|(_, tk)| tk.wait(deadline)),
        )
        .await;
        let timed_out: Vec<u64> = t.cc.tickets[first_new..]
            .iter()
            .zip(&waits)
            .filter(|(_, w)| w.is_err())
            .map(|((id, _), _)| *id)
            .collect();
        for id in timed_out {
            t.cc.mark_hot(id);
        }
        let failed = t.cc.tickets[first_new..]
            .iter()
            .zip(waits)
            .find_map(|((id, _), w)| w.err().map(|e| (split_id(*id).0, e)));
        if let Some((s, e)) = failed {
            // The tickets keep their places; the caller's release (or the transaction's
            // drop) hands each to a coroutine that releases it when its turn comes.
            return Err(match e {
                LockError::WaitTimeout { .. } => TxnError::Abort(AbortReason::LockWaitTimeout),
                e => {
                    let ctx = c.store.ctx();
                    self.lock_failed(ctx, &self.locks[s], &clients[s], e).await
                }
            });
        }
        Ok(prefetched)
    }

    /// Commit. OCC (4.2.1 (2)): the timestamp, cold tickets on the write set, validation,
    /// write-back. TOCC (4.2.2 (2), (3)): hot tickets on written objects not held yet, then
    /// validation of the objects read without a ticket only (none when every object was
    /// read under its ticket, the paper's TOCC), write-back. The caller releases the
    /// tickets.
    async fn commit_attempt(&self, t: &mut A<'_>) -> Result<(), TxnError> {
        let c = t.core;
        let writes = t.objs.iter().any(|o| o.write.is_some());
        if !t.cc.tocc && !writes && t.objs.len() <= 1 {
            t.record(None, Timestamp::ZERO);
            return Ok(());
        }
        let ids: Vec<u64> = t
            .objs
            .iter()
            .filter(|o| o.write.is_some() && !o.cc.ticketed)
            .map(|o| self.lock_id(o.table, o.key))
            .collect();
        let mode = if t.cc.tocc { Mode::Hot } else { Mode::Cold };
        self.take_tickets(t, &ids, mode).await?;
        // Inserted keys without a CVT get one now, under their ticket (no lock word), all
        // in parallel (each create is several dependent one-sided ops).
        t.enter(Phase::Lock);
        let id = t.id;
        let creates = join_all(
            t.objs
                .iter_mut()
                .filter(|o| o.write.is_some() && o.loc.is_none())
                .map(|o| async move {
                    let (loc, cvt) = c.store.create(o.table, o.key, 0, id).await?;
                    o.loc = Some(loc);
                    o.cvt = Some(cvt);
                    Ok::<(), TxnError>(())
                }),
        )
        .await;
        creates.into_iter().collect::<Result<(), _>>()?;
        // Objects read under their served tickets need no validation: their CVTs are current.
        if t.objs.iter().any(|o| !o.cc.ticketed) {
            t.enter(Phase::Validate);
            self.validate(t).await?;
        }
        // Every ticket is still a lease (TxnConfig::ticket_lease): the reads made under
        // them and the writes about to go out are protected until a restarted lock
        // service's grace ends.
        Self::check_ticket_lease(t)?;
        if writes {
            t.enter(Phase::WriteBack);
            t.write_back(|o| Timestamp(o.version.get() + 1)).await?;
        }
        t.record(None, Timestamp::ZERO);
        Ok(())
    }

    /// [`AbortReason::TicketExpired`] if a ticket of the attempt was requested longer
    /// than the ticket lease ago: its lock service may have died and a successor,
    /// whose grace period outlasts the lease, may have granted the lock anew.
    fn check_ticket_lease(t: &A<'_>) -> Result<(), TxnError> {
        let Some(oldest) = t.cc.tickets.iter().map(|(_, tk)| tk.requested_at()).min() else {
            return Ok(());
        };
        if oldest.elapsed() > t.core.cfg.ticket_lease {
            return Err(TxnError::Abort(AbortReason::TicketExpired));
        }
        Ok(())
    }

    /// OCC validation with the write set's tickets served ([`crate::validation`]) of the
    /// objects not read under a ticket; keeps the current CVTs of objects under our tickets
    /// for the write-back.
    async fn validate(&self, t: &mut A<'_>) -> Result<(), TxnError> {
        let c = t.core;
        let held: Vec<u64> = t.cc.tickets.iter().map(|(id, _)| *id).collect();
        let mut index = Vec::with_capacity(t.objs.len());
        let mut entries = Vec::with_capacity(t.objs.len());
        for (i, o) in t.objs.iter().enumerate().filter(|(_, o)| !o.cc.ticketed) {
            let locked_by_me = held.contains(&self.lock_id(o.table, o.key));
            #[cfg(feature = "fault-injection")]
            if !locked_by_me && crate::fault::skipping_read_only_validation() {
                continue;
            }
            index.push(i);
            entries.push(validation::Entry {
                version: o.version.get(),
                locked_by_me,
            });
        }
        let mut v = Validation::new(entries);
        let mut step = v.start();
        loop {
            let round = match step {
                Step::Done(r) => return r.map_err(TxnError::Abort),
                Step::Read(round) => round,
            };
            let objs = &t.objs;
            let busy = round.locks.iter().map(|&k| {
                let o = &objs[index[k]];
                self.lock_busy(c, self.lock_id(o.table, o.key))
            });
            let records = round.records.iter().map(|&k| {
                let o = &objs[index[k]];
                c.store.reread(o.table, o.key, o.loc)
            });
            let (busy, seen) = join(join_all(busy), join_all(records)).await;
            let busy = busy.into_iter().collect::<Result<Vec<bool>, _>>()?;
            for (&k, &b) in round.locks.iter().zip(&busy) {
                if b {
                    let o = &t.objs[index[k]];
                    let id = self.lock_id(o.table, o.key);
                    t.cc.mark_hot(id);
                }
            }
            let mut versions = Vec::with_capacity(seen.len());
            for (&k, cvt) in round.records.iter().zip(seen) {
                let cvt = cvt?;
                let now = cvt.as_ref().map_or(Timestamp::ZERO, |c| c.newest_version());
                versions.push(RecordSeen::Version(now.get()));
                let o = &t.objs[index[k]];
                if now != o.version {
                    let id = self.lock_id(o.table, o.key);
                    t.cc.mark_hot(id);
                }
                let o = &mut t.objs[index[k]];
                if o.write.is_some() {
                    o.cvt = cvt;
                }
            }
            step = v.observe(&round, &busy, &versions);
        }
    }
}

/// [`Scythe::lock_id`] over services of `n_locks[s]` locks each (one service, or one
/// per partition) for `tables` tables.
fn lock_id_of(n_locks: &[u64], tables: u64, table: u32, key: u64) -> u64 {
    let s = if n_locks.len() == 1 {
        0
    } else {
        crate::cvt_remote::partition_of(table, key, n_locks.len() as u32) as usize
    };
    (s as u64) << SERVICE_SHIFT | lock_slot(key, table, tables, n_locks[s])
}

/// Lock id `id` as (its service's index, its lock in that service's table); see
/// [`Scythe`].
pub(crate) fn split_id(id: u64) -> (usize, u64) {
    (
        (id >> SERVICE_SHIFT) as usize,
        id & ((1 << SERVICE_SHIFT) - 1),
    )
}

/// [`Scythe::lock_id`]'s mapping of `(table, key)` onto `n` locks for `tables` tables.
fn lock_slot(key: u64, table: u32, tables: u64, n: u64) -> u64 {
    let linear = key
        .checked_mul(tables)
        .and_then(|x| x.checked_add(u64::from(table)));
    match linear {
        Some(id) if id < n => id,
        _ => {
            // splitmix64's finalizer over the interleaved number.
            let mut x = key.wrapping_mul(tables).wrapping_add(u64::from(table));
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            (x ^ (x >> 31)) % n
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{lock_id_of, lock_slot, split_id};
    use crate::cvt_remote::partition_of;
    use std::collections::HashSet;

    #[test]
    fn a_lock_id_names_the_service_of_its_partition_and_a_lock_there() {
        // One service (a lockd node): the id is the lock itself.
        for k in [0u64, 7, 99_999, u64::MAX] {
            let id = lock_id_of(&[1000], 2, 1, k);
            assert_eq!(id, lock_slot(k, 1, 2, 1000));
            assert_eq!(split_id(id), (0, id));
        }
        // Three memory nodes serving their partitions' locks, of different sizes: each
        // object's lock is at the service of the partition that holds the object, within
        // that service's table, and keys spread over all three.
        let n = [1000u64, 500, 1 << 20];
        let mut seen = [0u32; 3];
        for k in 0..3000u64 {
            for table in [0u32, 3] {
                let (s, local) = split_id(lock_id_of(&n, 4, table, k));
                assert_eq!(s, partition_of(table, k, 3) as usize, "key {k}");
                assert!(local < n[s], "key {k}: lock {local} of {}", n[s]);
                assert_eq!(local, lock_slot(k, table, 4, n[s]));
                seen[s] += 1;
            }
        }
        assert!(seen.iter().all(|&c| c > 1500), "{seen:?}");
    }

    #[test]
    fn dense_keys_get_their_own_locks_and_composite_keys_spread() {
        // SmallBank: 2 tables x 1000 accounts onto 2000 locks, one each.
        let ids: HashSet<u64> = (0..1000u64)
            .flat_map(|k| [0, 1].map(|t| lock_slot(k, t, 2, 2000)))
            .collect();
        assert_eq!(ids.len(), 2000);
        // TPC-C's order keys `district << 28 | o`: ten districts' orders 3001..3100
        // onto 2^19 locks. Linear interleaving would put all ten districts on the same
        // 100 locks; hashed, almost every one is its own.
        let ids: HashSet<u64> = (1..=10u64)
            .flat_map(|d| (3001..3101u64).map(move |o| lock_slot(d << 28 | o, 5, 14, 1 << 19)))
            .collect();
        assert!(ids.len() > 990, "{} distinct locks of 1000", ids.len());
        assert!(ids.iter().all(|&i| i < 1 << 19));
    }
}
