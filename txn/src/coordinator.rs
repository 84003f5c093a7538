//! One coordinator API over the CVT store, the concurrency-control protocols behind it
//! (the crate-private `protocol::ConcurrencyControl`), chosen by name ([`Protocol`]) once per
//! client; the workload code does not change with it.
//!
//! A thread connects a [`TxnClient`] (its memory nodes, lock service, timestamp
//! oracle); each coroutine runs transactions: [`TxnClient::begin_as`], then
//! [`Txn::read`] / [`Txn::read_many`] / [`Txn::read_for_update`], [`Txn::write`],
//! [`Txn::insert`], [`Txn::delete`], and [`Txn::commit`] or [`Txn::abort`]. An
//! [`TxnError::Abort`] means nothing the transaction wrote is visible: retry it.
//!
//! - [`Protocol::OccCas`] ([`crate::occ_cas`]): FaRM's and FORD's OCC with one-sided CAS
//!   locks in the CVT header, validation by re-reading the CVTs;
//! - [`Protocol::Scythe`] ([`crate::scythe`]): Scythe's hot-aware OCC/TOCC on Takeout
//!   Locks (Scythe, 4.2 to 4.4);
//! - [`Protocol::Mvcc`] ([`crate::mvcc`]): Motor's MVCC over CVTs
//!   (Motor, 5.1 and 5.2), serializable or snapshot isolation;
//! - [`Protocol::Lotus`] ([`crate::lotus`]): Lotus's lock-first protocol on compute-node
//!   lock tables (Lotus, 5.1 and 5.2), serializable or snapshot isolation.
//!
//! The coordinator is a facade: [`TxnClient`] holds the thread's shared state
//! (the private `client_core`) and the protocol it picked; [`Txn`] holds that protocol's
//! attempt (the private `attempt` plus the protocol's own state) and hands each call to it.
//! Adding a protocol is one file implementing the interface and one line in each
//! column of the protocol table below (`Engine`, `AttemptIn`, `with_protocol!`).
//!
//! Every protocol records committed transactions, when asked, for the checkers:
//! versions read and installed ([`crate::serializability`]), and for MVCC the start and
//! commit timestamps ([`crate::snapshot_isolation`]).

use std::net::SocketAddr;
use std::rc::Rc;

use lockd::client::{LockClient, LockConn};
use rrpc::runtime::{join_all, ThreadCtx};
use tso::TsoConn;

use crate::attempt::Write;
use crate::client_core::ClientCore;
use crate::cvt_index::CacheStats;
use crate::cvt_store::CvtTableExport;
use crate::history::History;
use crate::lotus::Lotus;
use crate::mvcc::Mvcc;
use crate::occ_cas::OccCas;
use crate::protocol::{self, AttemptOf, ConcurrencyControl};
use crate::scythe::Scythe;

pub use crate::config::{ClusterAddrs, Isolation, Protocol, TxnConfig};
pub use crate::error::{AbortReason, TxnError};

// The protocol table: each protocol's client state (`Engine`) and attempt
// (`AttemptIn`), and the one dispatch (`with_protocol!`).

/// The protocol a client runs, with what it needs (Scythe: its lock service).
// One per client (thread), built once and never moved in a hot path: its size does not
// matter, and boxing would hide the protocol type from the static dispatch below.
#[allow(clippy::large_enum_variant)]
enum Engine {
    OccCas(OccCas),
    Scythe(Scythe),
    Mvcc(Mvcc),
    Lotus(Lotus),
}

/// An attempt of the client's protocol.
enum AttemptIn<'a> {
    OccCas(AttemptOf<'a, OccCas>),
    Scythe(AttemptOf<'a, Scythe>),
    Mvcc(AttemptOf<'a, Mvcc>),
    Lotus(AttemptOf<'a, Lotus>),
}

/// Run `$body` with `$p` the transaction's protocol and `$a` its attempt (`&mut`; with
/// `ref`, shared).
macro_rules! with_protocol {
    (ref $txn:expr, |$p:ident, $a:ident| $body:expr) => {
        match (&$txn.c.engine, &$txn.attempt) {
            (Engine::OccCas($p), AttemptIn::OccCas($a)) => $body,
            (Engine::Scythe($p), AttemptIn::Scythe($a)) => $body,
            (Engine::Mvcc($p), AttemptIn::Mvcc($a)) => $body,
            (Engine::Lotus($p), AttemptIn::Lotus($a)) => $body,
            _ => unreachable!("an attempt runs its client's protocol"),
        }
    };
    ($txn:expr, |$p:ident, $a:ident| $body:expr) => {
        match (&$txn.c.engine, &mut $txn.attempt) {
            (Engine::OccCas($p), AttemptIn::OccCas($a)) => $body,
            (Engine::Scythe($p), AttemptIn::Scythe($a)) => $body,
            (Engine::Mvcc($p), AttemptIn::Mvcc($a)) => $body,
            (Engine::Lotus($p), AttemptIn::Lotus($a)) => $body,
            _ => unreachable!("an attempt runs its client's protocol"),
        }
    };
}

impl Engine {
    fn begin<'a>(&self, core: &'a ClientCore, kind: u16, retry_of: Option<u64>) -> AttemptIn<'a> {
        fn new<'a, P: ConcurrencyControl>(
            p: &P,
            core: &'a ClientCore,
            kind: u16,
            retry_of: Option<u64>,
        ) -> AttemptOf<'a, P> {
            let mut a = crate::attempt::Attempt::new(core, kind);
            p.begin(&mut a, retry_of);
            a
        }
        match self {
            Self::OccCas(p) => AttemptIn::OccCas(new(p, core, kind, retry_of)),
            Self::Scythe(p) => AttemptIn::Scythe(new(p, core, kind, retry_of)),
            Self::Mvcc(p) => AttemptIn::Mvcc(new(p, core, kind, retry_of)),
            Self::Lotus(p) => AttemptIn::Lotus(new(p, core, kind, retry_of)),
        }
    }
}

/// One thread's handle on the cluster, shared by the thread's coordinators (coroutines).
pub struct TxnClient {
    core: ClientCore,
    engine: Engine,
    /// The range index, with [`TxnConfig::range_index`].
    range: Option<crate::range_index::RangeIndex>,
}

impl TxnClient {
    /// Connect this thread to the memory nodes (one-sided), the lock service (for
    /// Scythe) and the TSO. Blocking; call before running coroutines.
    ///
    /// Errors: [`TxnError::Rpc`] when a service cannot be reached, [`TxnError::Export`]
    /// for missing or inconsistent exports, [`TxnError::Usage`] for Scythe without a lock
    /// service, [`TxnError::Lock`], [`TxnError::Tso`].
    pub fn connect(
        ctx: Rc<ThreadCtx>,
        addrs: &ClusterAddrs,
        cfg: TxnConfig,
    ) -> Result<Self, TxnError> {
        let protocol = cfg.protocol;
        let locks = if protocol.needs_lockd() {
            Some(connect_locks(&ctx, addrs, protocol)?)
        } else {
            None
        };
        let range = match &cfg.range_index {
            Some(r) => Some(crate::range_index::RangeIndex::connect(&ctx, addrs, r)?),
            None => None,
        };
        let core = ClientCore::connect(ctx, addrs, cfg)?;
        let engine = match (protocol, locks) {
            (Protocol::OccCas, _) => Engine::OccCas(OccCas),
            (Protocol::Scythe, Some(locks)) => {
                Engine::Scythe(Scythe::new(locks, core.store.tables().len()))
            }
            (Protocol::Scythe, None) => unreachable!("checked above"),
            (Protocol::Mvcc(isolation), _) => Engine::Mvcc(Mvcc { isolation }),
            (Protocol::Lotus(isolation), _) => match &core.cfg.lotus {
                Some(site) => Engine::Lotus(Lotus::connect(core.store.ctx(), isolation, site)?),
                None => {
                    return Err(TxnError::Usage(format!(
                        "{protocol} needs compute-node lock tables (TxnConfig::lotus)"
                    )))
                }
            },
        };
        Ok(Self {
            core,
            engine,
            range,
        })
    }

    /// The protocol in use.
    pub fn protocol(&self) -> Protocol {
        self.core.cfg.protocol
    }

    /// The committed transactions recorded so far, leaving an empty history with the same
    /// limit; `None` when the client does not record.
    pub fn take_history(&self) -> Option<History> {
        self.core.take_history()
    }

    /// The tables (ids `0..n`).
    pub fn tables(&self) -> &[CvtTableExport] {
        self.core.store.tables()
    }

    /// The range index, when the client was connected with
    /// [`TxnConfig::range_index`].
    pub fn range_index(&self) -> Option<&crate::range_index::RangeIndex> {
        self.range.as_ref()
    }

    /// The thread context.
    pub fn ctx(&self) -> &Rc<ThreadCtx> {
        self.core.store.ctx()
    }

    /// The lock service client as it is now (Scythe only; a restart of the service
    /// replaces it). With the locks placed on the memory nodes, partition 0's; see
    /// [`Self::lock_services`].
    pub fn locks(&self) -> Option<Rc<LockClient>> {
        match &self.engine {
            Engine::Scythe(s) => s.locks().into_iter().next(),
            _ => None,
        }
    }

    /// Every lock service's client as it is now (Scythe; empty for the others): the one
    /// lockd, or the memory nodes' by partition when the locks are placed with the data.
    pub fn lock_services(&self) -> Vec<Rc<LockClient>> {
        match &self.engine {
            Engine::Scythe(s) => s.locks(),
            _ => Vec::new(),
        }
    }

    /// How many times the lock service connection was made again after the service
    /// died or restarted (Scythe; 0 for the others).
    pub fn lock_reconnects(&self) -> u64 {
        match &self.engine {
            Engine::Scythe(s) => s.conns().iter().map(LockConn::reconnects).sum(),
            _ => 0,
        }
    }

    /// The one-sided work requests this thread posted to the memory nodes so far, summed
    /// over them (a memory node's NIC load; Lotus takes no atomics there outside
    /// inserts).
    pub fn memnode_ops(&self) -> rrpc::runtime::OpCounts {
        let store = &self.core.store;
        let mut total = rrpc::runtime::OpCounts::default();
        for m in 0..store.memnode_count() {
            if let Ok(n) = store.memnode(m) {
                total.add(&store.ctx().op_counts(n));
            }
        }
        total
    }

    /// The TSO connection (its epoch in use, restarts it survived).
    pub fn tso(&self) -> &TsoConn {
        self.core.tso_conn()
    }

    /// The phase times of finished attempt `id` ([`Txn::id`]), once, when the client
    /// measures them ([`TxnConfig::record_phases`]); `None` otherwise, or when taken
    /// already. An attempt finishes when it commits, aborts or is dropped.
    pub fn take_phases(&self, id: u64) -> Option<crate::phase::PhaseTimes> {
        self.core.take_phases(id)
    }

    /// The CVT address cache's counters.
    pub fn cache_stats(&self) -> CacheStats {
        self.core.store.cache_stats()
    }

    /// Start a transaction of the workload's type `kind` (recorded with the history, so
    /// a reported cycle names the types on it). Takes no round trip: the protocols take
    /// their timestamps when they first need them.
    pub fn begin_as(&self, kind: u16) -> Txn<'_> {
        Txn {
            c: self,
            attempt: self.engine.begin(&self.core, kind, None),
            index_inserts: Vec::new(),
            index_deletes: Vec::new(),
        }
    }

    /// Start the next attempt of a transaction whose attempt `prev` ([`Txn::id`])
    /// aborted: the protocol may carry what that attempt learned (Scythe treats the rows
    /// it aborted on, or found queued, as hot: 4.2.1 (1), the mode chosen per
    /// transaction when it retries). Otherwise as [`Self::begin_as`].
    pub fn begin_retry(&self, kind: u16, prev: u64) -> Txn<'_> {
        Txn {
            c: self,
            attempt: self.engine.begin(&self.core, kind, Some(prev)),
            index_inserts: Vec::new(),
            index_deletes: Vec::new(),
        }
    }

    /// Per table id (index): attempts so far that read the table, and of those the
    /// attempts that ran TOCC (Scythe's high-heat mode); empty for the other protocols.
    pub fn tocc_share(&self) -> Vec<(u64, u64)> {
        match &self.engine {
            Engine::Scythe(s) => s.tocc_share(),
            _ => Vec::new(),
        }
    }

    /// Scythe's lock-and-read RPCs so far (its locks on the memory nodes, Scythe 4.3),
    /// and of those the grants whose object came with them and was taken without a
    /// READ; `(0, 0)` for the other protocols and with the locks on a lockd node.
    pub fn lock_read_counts(&self) -> (u64, u64) {
        match &self.engine {
            Engine::Scythe(s) => s.lock_read_counts(),
            _ => (0, 0),
        }
    }

    /// [`Self::begin_as`] of kind 0.
    pub fn begin(&self) -> Txn<'_> {
        self.begin_as(0)
    }

    /// One timestamp through the thread's TSO group (Scythe 4.5 (2)): concurrent
    /// requests of the thread's coroutines share one FAA.
    ///
    /// Errors: [`TxnError::Tso`] (the oracle did not come back in time, or the group's
    /// leader failed).
    pub async fn timestamp(&self) -> Result<tso::Timestamp, TxnError> {
        self.core.timestamp().await
    }

    /// Read the newest committed value of `(table, key)` without a transaction (no lock
    /// check): for audits after a run. `None` when absent or deleted.
    ///
    /// Errors: [`TxnError::Abort`] for a torn read, [`TxnError::Rpc`],
    /// [`TxnError::Usage`].
    pub async fn read_committed(
        &self,
        table: u32,
        key: u64,
    ) -> Result<Option<(tso::Timestamp, Vec<u8>)>, TxnError> {
        Ok(self.audit_row(table, key, true).await?.0)
    }

    /// For audits after a run, from one lookup of `(table, key)`'s CVT: its newest
    /// committed value when `value` (`None` when absent or deleted, or not asked for),
    /// and whether its CVT lock word is held (OCC-CAS and MVCC lock there).
    ///
    /// Errors: as [`Self::read_committed`].
    pub async fn audit_row(
        &self,
        table: u32,
        key: u64,
        value: bool,
    ) -> Result<(Option<(tso::Timestamp, Vec<u8>)>, bool), TxnError> {
        let Some((loc, cvt)) = self.core.store.lookup(table, key).await? else {
            return Ok((None, false));
        };
        // A Lotus cell still INVISIBLE is a write lock's trace: counted as held.
        let locked = cvt.header.lock != 0 || cvt.has_invisible();
        let Some(i) = cvt.newest().filter(|_| value) else {
            return Ok((None, locked));
        };
        let cell = cvt.cells[i];
        if cell.deleted {
            return Ok((None, locked));
        }
        match self.core.store.read_version(loc, &cell).await? {
            Ok(v) => Ok((Some((cell.version, v)), locked)),
            Err(_) => Err(TxnError::Abort(AbortReason::TornRead)),
        }
    }

    /// For audits after a run: the newest version `(table, key)`'s CVT holds (a
    /// tombstone's too), `None` when it has no CVT or no valid version.
    ///
    /// Errors: as [`Self::read_committed`].
    pub async fn newest_version(
        &self,
        table: u32,
        key: u64,
    ) -> Result<Option<tso::Timestamp>, TxnError> {
        let Some((_, cvt)) = self.core.store.lookup(table, key).await? else {
            return Ok(None);
        };
        Ok(cvt.newest().map(|i| cvt.cells[i].version))
    }

    /// Whether `(table, key)`'s CVT lock word is held (OCC-CAS, MVCC), for audits.
    ///
    /// Errors: as [`Self::read_committed`].
    pub async fn cvt_locked(&self, table: u32, key: u64) -> Result<bool, TxnError> {
        Ok(self.audit_row(table, key, false).await?.1)
    }

    /// Recover dead compute-node life `dead` ([`crate::recovery`]): finish or undo each
    /// of its logged commits, sweep its CVT lock words and insert guards, then (Scythe)
    /// release its tickets through the lock service, in that order. Lotus (Lotus 6):
    /// its logs, then its locks in the live nodes' lock tables, then the sweep. Run by
    /// one survivor once `dead` is fenced; running it again is safe.
    ///
    /// Errors: [`TxnError::Rpc`] (recovery incomplete: run it again),
    /// [`TxnError::Export`], [`TxnError::Lock`] from the ticket release.
    ///
    /// `node` and `incarnation` name the dead life as its fabric did (the incarnation
    /// the membership service gave it; its transaction ids carry its low bits).
    pub async fn recover(
        &self,
        node: u32,
        incarnation: u64,
    ) -> Result<crate::recovery::RecoveryReport, TxnError> {
        let dead = crate::txn_id::Owner::new(node, incarnation);
        #[cfg(feature = "fault-injection")]
        if crate::fault::planted_recovery_bug()
            == Some(crate::fault::RecoveryBug::ReleaseTicketsFirst)
        {
            let mut tickets = 0;
            for l in self.lock_services() {
                let owner = lockd::owners::Owner { node, incarnation };
                tickets += l.release_node(self.ctx(), owner).await? as usize;
            }
            self.ctx().sleep(std::time::Duration::from_millis(20)).await;
            let mut rep = crate::recovery::recover_store(&self.core.store, dead).await?;
            rep.tickets = tickets;
            return Ok(rep);
        }
        let owner = lockd::owners::Owner { node, incarnation };
        if let Engine::Lotus(p) = &self.engine {
            // Lotus 6: the logs alone, then the dead life's locks in every live node's
            // table (after the logs: a released key could otherwise be locked and its
            // INVISIBLE leftover met; its own table died with it), and only then the
            // sweep of insert guards, the only memory-node words that carry Lotus's
            // ids: its CVTs' lock words never do, so the indexes are not scanned.
            let mut rep = crate::recovery::settle_logs(&self.core.store, dead).await?;
            let t0 = std::time::Instant::now();
            if !crate::recovery::sweep_left_out() {
                rep.tickets = p.release_dead(self.ctx(), owner).await? as usize;
            }
            rep.tickets_time = t0.elapsed();
            rep.locks_free = rep.logs_time + rep.tickets_time;
            crate::recovery::sweep(
                &self.core.store,
                dead,
                crate::recovery::SweepScope::Guards,
                &mut rep,
            )
            .await?;
            return Ok(rep);
        }
        let mut rep = crate::recovery::recover_store(&self.core.store, dead).await?;
        let t0 = std::time::Instant::now();
        let services = self.lock_services();
        if !services.is_empty() {
            let released =
                join_all(services.iter().map(|l| l.release_node(self.ctx(), owner))).await;
            for n in released {
                rep.tickets += n? as usize;
            }
            rep.tickets_time = t0.elapsed();
            rep.locks_free += rep.tickets_time;
        }
        Ok(rep)
    }

    /// This client's node and incarnation (the owner in its transaction ids).
    pub fn owner(&self) -> crate::txn_id::Owner {
        self.core.owner()
    }

    /// Lock id of `(table, key)` in Scythe's lock service (see the `scythe` module's
    /// lock mapping); 0 for the protocols without one.
    pub fn lock_id(&self, table: u32, key: u64) -> u64 {
        match &self.engine {
            Engine::Scythe(s) => s.lock_id(table, key),
            _ => 0,
        }
    }
}

/// A transaction in progress (one coordinator's current transaction). Dropping it
/// without [`Txn::commit`] or [`Txn::abort`] releases what it holds in the background.
pub struct Txn<'a> {
    c: &'a TxnClient,
    attempt: AttemptIn<'a>,
    /// Rows of indexed tables this transaction inserts: their entries go in when it
    /// commits, before its installs ([`crate::range_index`]).
    index_inserts: Vec<(u32, u64)>,
    /// Rows of indexed tables this transaction deletes, with their entries' tags: the
    /// entries go once it committed ([`crate::range_index`]).
    index_deletes: Vec<(u32, u64, u64)>,
}

impl<'a> Txn<'a> {
    /// The client.
    pub fn client(&self) -> &'a TxnClient {
        self.c
    }

    /// This transaction's id: unique among the attempts of the process's clients (the
    /// lock word OCC-CAS and MVCC write; never 0). A workload may key rows it inserts by
    /// it.
    pub fn id(&self) -> u64 {
        with_protocol!(ref self, |_p, a| a.id)
    }

    /// Attach `note` to this transaction's commit log (with
    /// [`crate::config::TxnConfig::commit_log`]): an application's word about the
    /// commit, e.g. SmallBank's net money, which recovery reports for every logged commit
    /// it rolls forward ([`crate::recovery::RecoveryReport::forward_notes`]), so that an
    /// application can account for commits whose client died before hearing of them.
    pub fn set_log_note(&mut self, note: i64) {
        with_protocol!(self, |_p, a| a.note = note)
    }

    /// Declare this transaction read-only (before its first read): Lotus then takes no
    /// lock for it and reads a snapshot at its start timestamp (Lotus 5.1, read-only
    /// transactions); the other protocols ignore it. A read for update, an insert or a
    /// delete in a declared read-only transaction is refused ([`TxnError::Usage`]).
    pub fn declare_read_only(&mut self) {
        with_protocol!(self, |_p, a| a.read_only = true)
    }

    /// Whether this attempt runs in a high-contention mode: Scythe's TOCC
    /// (Scythe, 4.2.2), entered at the first round that met an object the lock service
    /// reported hot. Always false for the other protocols.
    pub fn hot_mode(&self) -> bool {
        with_protocol!(ref self, |p, a| p.hot_mode(a))
    }

    /// Values of `items` (table, key, for update), read in parallel (one round where the
    /// protocol allows); `None` for an absent key. `for_update` declares that the
    /// transaction will write the object: MVCC locks it now (Motor 5.1, read-write
    /// data); the other protocols lock at commit (or, Scythe's TOCC, lock every object
    /// read). Objects already in the transaction are served locally (its own writes
    /// included).
    ///
    /// Errors: [`TxnError::Abort`], [`TxnError::Usage`] for an unknown table, service
    /// failures. After an abort, drop the transaction or [`Self::abort`] it.
    pub async fn get_mixed(
        &mut self,
        items: &[(u32, u64, bool)],
    ) -> Result<Vec<Option<Vec<u8>>>, TxnError> {
        #[allow(unused_mut)]
        let mut vals: Vec<Option<Vec<u8>>> = with_protocol!(self, |p, a| {
            protocol::fetch(p, a, items).await?;
            items
                .iter()
                .map(|&(t, k, _)| a.objs[a.find(t, k).expect("fetched")].seen_value())
                .collect()
        });
        #[cfg(feature = "fault-injection")]
        if crate::fault::corrupting_reads() {
            for v in vals.iter_mut().flatten() {
                if let Some(b) = v.last_mut() {
                    *b ^= 1;
                }
            }
        }
        Ok(vals)
    }

    /// Up to `count` rows of `table` with keys in `keys`, in key order: the keys
    /// from the range index ([`crate::range_index`]), then the rows read in this
    /// transaction in one round, as [`Self::get_many`] reads them (validated at commit).
    /// Keys whose row reads as absent (stale index entries: inserts that aborted or are
    /// in flight, deletes not yet removed) are skipped, so fewer than `count` rows may
    /// come back while more exist. Not protected against phantoms: a row inserted into
    /// the range after the index was read is no conflict. Rows this transaction inserted
    /// are not in the index before it commits, so its own scans miss them.
    ///
    /// Errors: [`TxnError::Usage`] without a range index or for a table it does not
    /// index; [`TxnError::Index`]; and as [`Self::get_many`].
    pub async fn scan(
        &mut self,
        table: u32,
        keys: std::ops::Range<u64>,
        count: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>, TxnError> {
        let ix = self.c.range_index().ok_or_else(|| {
            TxnError::Usage("scan needs a range index (TxnConfig::range_index)".into())
        })?;
        let keys = ix.scan(table, keys, count).await?;
        let items: Vec<(u32, u64)> = keys.iter().map(|&k| (table, k)).collect();
        let rows = self.get_many(&items).await?;
        Ok(keys
            .into_iter()
            .zip(rows)
            .filter_map(|(k, r)| r.map(|r| (k, r)))
            .collect())
    }

    /// [`Self::get_mixed`] with every item read only.
    pub async fn get_many(
        &mut self,
        items: &[(u32, u64)],
    ) -> Result<Vec<Option<Vec<u8>>>, TxnError> {
        let v: Vec<_> = items.iter().map(|&(t, k)| (t, k, false)).collect();
        self.get_mixed(&v).await
    }

    /// [`Self::get_mixed`] with every item for update.
    pub async fn get_many_for_update(
        &mut self,
        items: &[(u32, u64)],
    ) -> Result<Vec<Option<Vec<u8>>>, TxnError> {
        let v: Vec<_> = items.iter().map(|&(t, k)| (t, k, true)).collect();
        self.get_mixed(&v).await
    }

    /// [`Self::get_mixed`] for objects that must exist ([`TxnError::NotFound`]
    /// otherwise).
    pub async fn read_mixed(
        &mut self,
        items: &[(u32, u64, bool)],
    ) -> Result<Vec<Vec<u8>>, TxnError> {
        let v = self.get_mixed(items).await?;
        let keys: Vec<_> = items.iter().map(|&(t, k, _)| (t, k)).collect();
        Self::present(&keys, v)
    }

    fn present(items: &[(u32, u64)], vals: Vec<Option<Vec<u8>>>) -> Result<Vec<Vec<u8>>, TxnError> {
        items
            .iter()
            .zip(vals)
            .map(|(&(table, key), v)| v.ok_or(TxnError::NotFound { table, key }))
            .collect()
    }

    /// Values of several objects that must exist ([`TxnError::NotFound`] otherwise); as
    /// [`Self::get_many`].
    pub async fn read_many(&mut self, items: &[(u32, u64)]) -> Result<Vec<Vec<u8>>, TxnError> {
        let v = self.get_many(items).await?;
        Self::present(items, v)
    }

    /// As [`Self::read_many`], for objects the transaction will write
    /// ([`Self::get_many_for_update`]).
    pub async fn read_many_for_update(
        &mut self,
        items: &[(u32, u64)],
    ) -> Result<Vec<Vec<u8>>, TxnError> {
        let v = self.get_many_for_update(items).await?;
        Self::present(items, v)
    }

    /// Read one object that must exist.
    pub async fn read(&mut self, table: u32, key: u64) -> Result<Vec<u8>, TxnError> {
        Ok(self.read_many(&[(table, key)]).await?.pop().expect("one"))
    }

    /// Read one object the transaction will write.
    pub async fn read_for_update(&mut self, table: u32, key: u64) -> Result<Vec<u8>, TxnError> {
        Ok(self
            .read_many_for_update(&[(table, key)])
            .await?
            .pop()
            .expect("one"))
    }

    fn check_len(&self, table: u32, value: &[u8]) -> Result<(), TxnError> {
        let want = self.c.core.store.table(0, table)?.len;
        if value.len() != want {
            return Err(TxnError::Usage(format!(
                "value of {} bytes, table {table} holds {want}",
                value.len()
            )));
        }
        Ok(())
    }

    /// Buffer a write of an object this transaction has read and that exists.
    ///
    /// Errors: [`TxnError::Usage`] (not read first, value size), [`TxnError::NotFound`].
    pub fn write(&mut self, table: u32, key: u64, value: Vec<u8>) -> Result<(), TxnError> {
        self.check_len(table, &value)?;
        with_protocol!(self, |_p, a| {
            let i = a.find(table, key).ok_or_else(|| {
                TxnError::Usage(format!(
                    "write of table {table} key {key} before reading it"
                ))
            })?;
            if a.objs[i].seen_value().is_none() {
                return Err(TxnError::NotFound { table, key });
            }
            a.objs[i].write = Some(Write::Put(value));
            Ok(())
        })
    }

    /// Insert `(table, key)` with `value`: reads the key for update, then buffers the
    /// insert. Errors: [`TxnError::Exists`] when the key is visible (the transaction goes
    /// on), [`TxnError::Usage`], and as [`Self::get_many`].
    pub async fn insert(&mut self, table: u32, key: u64, value: Vec<u8>) -> Result<(), TxnError> {
        self.insert_many(vec![(table, key, value)]).await
    }

    /// Insert several rows, their keys read for update in one round. Errors: as
    /// [`Self::insert`], for the first key that exists (nothing is buffered then).
    pub async fn insert_many(&mut self, rows: Vec<(u32, u64, Vec<u8>)>) -> Result<(), TxnError> {
        for (t, _, v) in &rows {
            self.check_len(*t, v)?;
        }
        let keys: Vec<(u32, u64)> = rows.iter().map(|&(t, k, _)| (t, k)).collect();
        let seen = self.get_many_for_update(&keys).await?;
        if let Some(i) = seen.iter().position(Option::is_some) {
            let (table, key) = keys[i];
            return Err(TxnError::Exists { table, key });
        }
        with_protocol!(self, |_p, a| {
            for (t, k, v) in rows {
                let i = a.find(t, k).expect("fetched");
                a.objs[i].write = Some(Write::Put(v));
            }
        });
        // The index entries go in at commit, before the installs (`Self::commit`).
        if let Some(ix) = self.c.range_index() {
            self.index_inserts
                .extend(keys.into_iter().filter(|&(t, _)| ix.indexes(t)));
        }
        Ok(())
    }

    /// Delete `(table, key)`, which must exist: reads it for update if not read yet, then
    /// buffers a tombstone. Errors: [`TxnError::NotFound`], and as [`Self::get_many`].
    pub async fn delete(&mut self, table: u32, key: u64) -> Result<(), TxnError> {
        if self.get_many_for_update(&[(table, key)]).await?[0].is_none() {
            return Err(TxnError::NotFound { table, key });
        }
        with_protocol!(self, |_p, a| {
            let i = a.find(table, key).expect("fetched");
            a.objs[i].write = Some(Write::Delete);
        });
        if let Some(ix) = self.c.range_index().filter(|ix| ix.indexes(table)) {
            if let Some(tag) = ix.lookup(table, key).await? {
                self.index_deletes.push((table, key, tag));
            }
        }
        Ok(())
    }

    /// Commit. `Ok` means committed and visible.
    ///
    /// Errors: [`TxnError::Abort`] (nothing written; retry); [`TxnError::WriteBack`]
    /// when a service failed while writing back; other service failures (the
    /// transaction aborted). Every lock is released on every path.
    pub async fn commit(mut self) -> Result<(), TxnError> {
        // The inserted rows' index entries go in before the commit can make the rows
        // visible, so that a committed row is always in the index (crate::range_index);
        // if the commit then aborts, they stay as stale entries that scans skip. An
        // attempt that aborts before its commit adds none.
        if let Some(ix) = self.c.range_index() {
            let inserts = std::mem::take(&mut self.index_inserts);
            let mut tables: Vec<u32> = inserts.iter().map(|&(t, _)| t).collect();
            tables.sort_unstable();
            tables.dedup();
            let tag = self.id() | 1 << 63;
            for t in tables {
                let of_t: Vec<u64> = inserts.iter().filter(|e| e.0 == t).map(|e| e.1).collect();
                if let Err(e) = ix.insert_many(t, &of_t, tag).await {
                    return Err(self.fail(e).await);
                }
            }
        }
        with_protocol!(self, |p, a| protocol::commit(p, a).await)?;
        // The deleted rows' index entries go after the commit (crate::range_index). A
        // failure leaves a stale entry, which scans skip: the commit stands.
        if let Some(ix) = self.c.range_index() {
            for (t, k, tag) in std::mem::take(&mut self.index_deletes) {
                if let Err(e) = ix.delete_if(t, k, tag).await {
                    tracing::warn!(
                        table = t,
                        key = k,
                        "range index: entry of a deleted row left: {e}"
                    );
                }
            }
        }
        Ok(())
    }

    /// Release what the attempt holds after `e` stopped its commit; returns `e`, or the
    /// release's own failure.
    async fn fail(mut self, e: TxnError) -> TxnError {
        let released = with_protocol!(self, |p, a| {
            a.enter(crate::phase::Phase::Unlock);
            p.release(a).await
        });
        match released {
            Ok(()) => e,
            Err(r) => r,
        }
    }

    /// Give up: release what the transaction holds; returns
    /// [`TxnError::Abort`]([`AbortReason::User`]) to pass on.
    pub async fn abort(mut self) -> TxnError {
        let released = with_protocol!(self, |p, a| {
            a.enter(crate::phase::Phase::Unlock);
            p.release(a).await
        });
        match released {
            Ok(()) => TxnError::Abort(AbortReason::User),
            Err(e) => e,
        }
    }
}

impl Drop for Txn<'_> {
    fn drop(&mut self) {
        with_protocol!(self, |p, a| p.finish(a));
    }
}

/// Connect this thread to Scythe's lock services: the lockd node of `addrs` when it has
/// one; else the memory nodes that serve their partitions' locks (`memnode
/// --lock-service`; Scythe 4.3, each object's lock with its data), one per partition in
/// partition order. The connection declares the fabric's incarnation, by which the
/// services own its tickets.
///
/// Errors: [`TxnError::Usage`] when there is neither, [`TxnError::Export`] when some
/// partition's memory node serves no locks (or two claim the same partition),
/// [`TxnError::Rpc`], [`TxnError::Lock`].
fn connect_locks(
    ctx: &Rc<ThreadCtx>,
    addrs: &ClusterAddrs,
    protocol: Protocol,
) -> Result<Vec<LockConn>, TxnError> {
    let conn = |a: SocketAddr| -> Result<LockConn, TxnError> {
        let mut l = LockClient::from_info(&ctx.connect_rpc(a)?)?;
        l.set_incarnation(ctx.fabric().incarnation());
        Ok(LockConn::new(a, l))
    };
    if let Some(a) = addrs.lockd {
        return Ok(vec![conn(a)?]);
    }
    // By partition: (address, whether it serves locks); spares hold no partition.
    let mut parts: Vec<Option<(SocketAddr, bool)>> = Vec::new();
    for &a in &addrs.memnodes {
        let info = ctx.connect(a)?;
        let e: crate::cvt_remote::MemnodeExport = info
            .export(crate::cvt_remote::EXPORT_KEY)
            .map_err(|e| TxnError::Export(format!("memory node {a}: {e}")))?;
        if e.spare {
            continue;
        }
        let p = e.partition as usize;
        if parts.len() < e.partitions as usize {
            parts.resize(e.partitions as usize, None);
        }
        let serves = info.exports.contains_key(lockd::service::EXPORT_NAME);
        match parts.get_mut(p) {
            Some(slot @ None) => *slot = Some((a, serves)),
            _ => {
                return Err(TxnError::Export(format!(
                    "memory node {a} claims partition {p}, which another memory node given \
                     holds or which lies past the partitions"
                )))
            }
        }
    }
    if !parts.iter().flatten().any(|&(_, serves)| serves) {
        return Err(TxnError::Usage(format!(
            "{protocol} needs a lock service: a lockd address, or memory nodes that serve \
             their partitions' locks (memnode --lock-service)"
        )));
    }
    parts
        .iter()
        .enumerate()
        .map(|(p, m)| match m {
            Some((a, true)) => conn(*a),
            Some((a, false)) => Err(TxnError::Export(format!(
                "memory node {a} (partition {p}) serves no locks, while others do: start \
                 every memory node with --lock-service"
            ))),
            None => Err(TxnError::Export(format!(
                "no memory node given holds partition {p}"
            ))),
        })
        .collect()
}
