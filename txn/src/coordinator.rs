//! One coordinator API over the CVT store, three concurrency-control protocols behind
//! it, chosen by name ([`Protocol`]); the workload code does not change with it.
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
//!   Locks (000_f3dba2ed893b246b.txt, 4.2 to 4.4);
//! - [`Protocol::Mvcc`] ([`crate::mvcc`]): Motor's MVCC over CVTs
//!   (004_578a5719f81c1e65.txt, 5.1 and 5.2), serializable or snapshot isolation.
//!
//! Every protocol records committed transactions, when asked, for the checkers:
//! versions read and installed ([`crate::serializability`]), and for MVCC the start and
//! commit timestamps ([`crate::snapshot_isolation`]).

use std::cell::{Cell as StdCell, RefCell};
use std::fmt;
use std::net::SocketAddr;
use std::rc::Rc;
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lockd::client::{LockClient, LockError, Ticket};
use rrpc::runtime::{join_all, RpcError, ThreadCtx};
use tso::group::LocalLock;
use tso::{ReconnectConfig, Timestamp, TsoConn, TsoError, TsoGroup};

use crate::cvt::Cvt;
use crate::cvt_index::CacheStats;
use crate::cvt_remote::{CvtLoc, CvtRemote};
use crate::cvt_store::CvtTableExport;
use crate::history::{Access, History};

/// The concurrency-control protocol of a client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// OCC with one-sided CAS locks in the CVT header (the FaRM/FORD baseline).
    OccCas,
    /// Scythe's hot-aware OCC/TOCC on Takeout Locks (needs a lock service).
    Scythe,
    /// Motor's MVCC at the given isolation level.
    Mvcc(Isolation),
}

/// Isolation level of [`Protocol::Mvcc`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isolation {
    /// Serializability: read-only data of read-write transactions is validated at the
    /// commit timestamp (Motor 5.1, phase 2).
    Serializable,
    /// Snapshot isolation: no validation; write-write conflicts still abort (first
    /// committer wins, Motor 5.2).
    Snapshot,
}

impl Protocol {
    /// Every protocol, in report order (MVCC at serializability).
    pub const ALL: [Protocol; 3] = [
        Protocol::OccCas,
        Protocol::Scythe,
        Protocol::Mvcc(Isolation::Serializable),
    ];

    /// Short name: `occ-cas`, `scythe`, `mvcc` (serializable) or `mvcc-si`.
    pub fn name(self) -> &'static str {
        match self {
            Self::OccCas => "occ-cas",
            Self::Scythe => "scythe",
            Self::Mvcc(Isolation::Serializable) => "mvcc",
            Self::Mvcc(Isolation::Snapshot) => "mvcc-si",
        }
    }

    /// Whether the protocol needs a lock service.
    pub fn needs_lockd(self) -> bool {
        self == Self::Scythe
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Protocol {
    type Err = String;
    /// `occ-cas`, `scythe`, `mvcc` (= `mvcc-sr`) or `mvcc-si`.
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "occ-cas" => Self::OccCas,
            "scythe" => Self::Scythe,
            "mvcc" | "mvcc-sr" => Self::Mvcc(Isolation::Serializable),
            "mvcc-si" => Self::Mvcc(Isolation::Snapshot),
            _ => {
                return Err(format!(
                    "unknown protocol {s:?}: occ-cas, scythe, mvcc (mvcc-sr) or mvcc-si"
                ))
            }
        })
    }
}

/// Why a transaction aborted. Aborts are expected under contention; callers retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AbortReason {
    /// Execution read an object that was locked or had a queue (Scythe 4.2.1 (3); FaRM).
    LockedOnRead,
    /// A CVT or record was read in the middle of a write, or a record's buffer was reused
    /// by another version between the CVT READ and the record READ.
    TornRead,
    /// A CAS on a CVT's lock word found it held (OCC-CAS, MVCC: no waiting, so no
    /// deadlock).
    LockCas,
    /// The Lock RPC refused: a newer timestamp is already queued.
    LockRefusedTimestamp,
    /// The Lock RPC refused: the queue is longer than ColdWatermark (a hot object).
    LockRefusedCold,
    /// The Lock RPC refused: the queue is longer than HotWatermark.
    LockRefusedHot,
    /// Validation found a newer version.
    ValidationVersion,
    /// Validation found an object of the read set locked or queued by another transaction.
    ValidationLocked,
    /// MVCC: a version newer than the start timestamp exists on data the transaction
    /// updates (SR early abort, SI first committer wins; Motor 5.1).
    NewerVersion,
    /// MVCC: every version of the object is newer than the start timestamp (GC reclaimed
    /// the one the snapshot needs).
    VersionGone,
    /// A granted ticket was not served within the lock wait; the tickets are released
    /// in the background when their turn comes.
    LockWaitTimeout,
    /// Two inserts of keys of one hash bucket met; one retries.
    InsertRace,
    /// The workload met a state that cannot be (a row its earlier reads say exists is
    /// gone, or one they say is free is taken): an optimistic read was stale, and
    /// validation would fail. Declared by the workload.
    Inconsistent,
    /// The transaction's own logic gave up (e.g. insufficient funds).
    User,
}

impl AbortReason {
    /// Every reason, for reports.
    pub const ALL: [AbortReason; 14] = [
        Self::LockedOnRead,
        Self::TornRead,
        Self::LockCas,
        Self::LockRefusedTimestamp,
        Self::LockRefusedCold,
        Self::LockRefusedHot,
        Self::ValidationVersion,
        Self::ValidationLocked,
        Self::NewerVersion,
        Self::VersionGone,
        Self::LockWaitTimeout,
        Self::InsertRace,
        Self::Inconsistent,
        Self::User,
    ];
    /// Short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::LockedOnRead => "locked-on-read",
            Self::TornRead => "torn-read",
            Self::LockCas => "lock-cas",
            Self::LockRefusedTimestamp => "lock-refused-ts",
            Self::LockRefusedCold => "lock-refused-cold",
            Self::LockRefusedHot => "lock-refused-hot",
            Self::ValidationVersion => "validation-version",
            Self::ValidationLocked => "validation-locked",
            Self::NewerVersion => "newer-version",
            Self::VersionGone => "version-gone",
            Self::LockWaitTimeout => "lock-wait-timeout",
            Self::InsertRace => "insert-race",
            Self::Inconsistent => "inconsistent-read",
            Self::User => "user",
        }
    }
}

/// Errors of transactions. Every variant but [`TxnError::Abort`] keeps its cause.
#[derive(Debug, thiserror::Error)]
pub enum TxnError {
    /// The transaction aborted; nothing it wrote is visible. Retry it.
    #[error("aborted: {}", .0.name())]
    Abort(AbortReason),
    /// The key does not exist (in the transaction's view). The transaction goes on.
    #[error("table {table} has no key {key}")]
    NotFound {
        /// Table id.
        table: u32,
        /// Key.
        key: u64,
    },
    /// An insert of a key that exists. The transaction goes on.
    #[error("table {table} already has key {key}")]
    Exists {
        /// Table id.
        table: u32,
        /// Key.
        key: u64,
    },
    /// An insert found no free CVT slot in the key's bucket chain.
    #[error("table {table} is full")]
    TableFull {
        /// Table id.
        table: u32,
    },
    /// Misuse of the API (unknown table, write without read, value size).
    #[error("{0}")]
    Usage(String),
    /// A one-sided operation or RPC failed (peer gone, timeout, completion error). The
    /// transaction aborted unless the failure hit during write-back
    /// ([`TxnError::WriteBack`] then).
    #[error("service failure: {0}")]
    Rpc(#[from] RpcError),
    /// The lock service failed or a lock was lost.
    #[error("lock service: {0}")]
    Lock(#[from] LockError),
    /// The timestamp oracle failed.
    #[error("timestamp oracle: {0}")]
    Tso(#[from] TsoError),
    /// The memory nodes' exports are missing or inconsistent, or a read was malformed.
    #[error("memory node export: {0}")]
    Export(String),
    /// Write-back failed: the transaction's writes may be partly visible. Its locks were
    /// released all the same, unless `release` says otherwise.
    #[error("write-back failed: {cause}{}", .release.as_ref().map(|r| format!("; and {r}")).unwrap_or_default())]
    WriteBack {
        /// Why the write-back failed.
        #[source]
        cause: Box<TxnError>,
        /// A lock that could not be released afterwards.
        release: Option<Box<TxnError>>,
    },
}

rrpc::from_rpc_errors!(TxnError, TxnError::Rpc);

/// Coordinator settings.
#[derive(Clone, Debug)]
pub struct TxnConfig {
    /// The protocol (default OCC-CAS).
    pub protocol: Protocol,
    /// How long to wait for a granted ticket's turn before aborting with
    /// [`AbortReason::LockWaitTimeout`] (Scythe; default 2 s).
    pub lock_wait: Duration,
    /// Record committed transactions for the checkers, up to this many bytes per thread;
    /// `None` (the default) records nothing.
    pub history_limit_bytes: Option<usize>,
    /// How long a timestamp request waits for a restarted oracle, and how often it looks
    /// for it (default: [`ReconnectConfig::default`]).
    pub tso_reconnect: ReconnectConfig,
    /// Scythe's TOCC heuristic wait (4.4 (2), after Aurogon): before a hot-mode lock
    /// request on an object whose last seen queue lies between ColdWatermark and
    /// HotWatermark, wait this long so requests with smaller timestamps arrive first
    /// (default 20 us; zero turns it off).
    pub tocc_wait: Duration,
    /// MVCC: how long a read-only transaction waits at commit for a CVT that was locked
    /// when it read it to be released, before it aborts
    /// ([`AbortReason::ValidationLocked`]); see [`crate::mvcc`] (default 1 ms).
    pub read_wait: Duration,
    /// CVT addresses each thread caches (default 2^20).
    pub cache_entries: usize,
}

impl Default for TxnConfig {
    fn default() -> Self {
        Self {
            protocol: Protocol::OccCas,
            lock_wait: Duration::from_secs(2),
            history_limit_bytes: None,
            tso_reconnect: ReconnectConfig::default(),
            tocc_wait: Duration::from_micros(20),
            read_wait: Duration::from_millis(1),
            cache_entries: 1 << 20,
        }
    }
}

/// Addresses of a cluster's services.
#[derive(Clone, Debug)]
pub struct ClusterAddrs {
    /// The memory nodes' bootstrap addresses (any order; they say their partition).
    pub memnodes: Vec<SocketAddr>,
    /// The lock service's bootstrap address (needed by [`Protocol::Scythe`]).
    pub lockd: Option<SocketAddr>,
    /// The timestamp oracle's bootstrap address.
    pub tso: SocketAddr,
}

/// Process-wide counter that gives each client a distinct tag in its lock words.
static CLIENT_TAGS: AtomicU32 = AtomicU32::new(1);

/// One thread's handle on the cluster, shared by the thread's coordinators (coroutines).
pub struct TxnClient {
    pub(crate) store: CvtRemote,
    pub(crate) locks: Option<LockClient>,
    tso: TsoConn,
    group: TsoGroup<Arc<TsoError>, LocalLock>,
    pub(crate) cfg: TxnConfig,
    history: RefCell<Option<History>>,
    /// High 32 bits of this client's lock words (node and client tag).
    tag: u64,
    seq: StdCell<u32>,
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
        let store = CvtRemote::connect(ctx.clone(), &addrs.memnodes, cfg.cache_entries)?;
        let locks = match (cfg.protocol.needs_lockd(), addrs.lockd) {
            (true, None) => {
                return Err(TxnError::Usage(format!(
                    "{} needs a lock service address",
                    cfg.protocol
                )))
            }
            (true, Some(a)) => Some(LockClient::from_info(&ctx.connect_rpc(a)?)?),
            (false, _) => None,
        };
        let tso = TsoConn::connect(ctx.clone(), addrs.tso, cfg.tso_reconnect)?;
        let node = ctx.fabric().node().get();
        let tag = (u64::from(node & 0xffff) << 48)
            | (u64::from(CLIENT_TAGS.fetch_add(1, Ordering::Relaxed) & 0xffff) << 32);
        Ok(Self {
            store,
            locks,
            tso,
            group: TsoGroup::with_limit(tso::oracle::THREAD_RANGES_IN_FLIGHT),
            history: RefCell::new(cfg.history_limit_bytes.map(History::new)),
            cfg,
            tag,
            seq: StdCell::new(0),
        })
    }

    /// The protocol in use.
    pub fn protocol(&self) -> Protocol {
        self.cfg.protocol
    }

    /// The committed transactions recorded so far, leaving an empty history with the same
    /// limit; `None` when the client does not record.
    pub fn take_history(&self) -> Option<History> {
        let limit = self.cfg.history_limit_bytes?;
        self.history.borrow_mut().replace(History::new(limit))
    }

    /// The tables (ids `0..n`).
    pub fn tables(&self) -> &[CvtTableExport] {
        self.store.tables()
    }

    /// The thread context.
    pub fn ctx(&self) -> &Rc<ThreadCtx> {
        self.store.ctx()
    }

    /// The lock service client (Scythe only).
    pub fn locks(&self) -> Option<&LockClient> {
        self.locks.as_ref()
    }

    /// The TSO connection (its epoch in use, restarts it survived).
    pub fn tso(&self) -> &TsoConn {
        &self.tso
    }

    /// The CVT address cache's counters.
    pub fn cache_stats(&self) -> CacheStats {
        self.store.cache_stats()
    }

    /// Start a transaction of the workload's type `kind` (recorded with the history, so
    /// a reported cycle names the types on it). Takes no round trip: the protocols take
    /// their timestamps when they first need them.
    pub fn begin_as(&self, kind: u16) -> Txn<'_> {
        let seq = self.seq.get().wrapping_add(1).max(1);
        self.seq.set(seq);
        Txn {
            c: self,
            kind,
            id: self.tag | u64::from(seq),
            start: None,
            tocc: false,
            objs: Vec::new(),
            tickets: Vec::new(),
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
    pub async fn timestamp(&self) -> Result<Timestamp, TxnError> {
        let tso = &self.tso;
        self.group
            .take(|n| async move { tso.timestamps(n).await.map(|r| r.first()).map_err(Arc::new) })
            .await
            .map_err(|e| match e {
                tso::GroupFailure::Take(e) => match Arc::try_unwrap(e) {
                    Ok(e) => TxnError::Tso(e),
                    Err(e) => TxnError::Export(format!("timestamp oracle: {e}")),
                },
                tso::GroupFailure::LeaderCancelled => {
                    TxnError::Export("timestamp oracle: the group leader was cancelled".into())
                }
            })
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
    ) -> Result<Option<(Timestamp, Vec<u8>)>, TxnError> {
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
    ) -> Result<(Option<(Timestamp, Vec<u8>)>, bool), TxnError> {
        let Some((loc, cvt)) = self.store.lookup(table, key).await? else {
            return Ok((None, false));
        };
        let locked = cvt.header.lock != 0;
        let Some(i) = cvt.newest().filter(|_| value) else {
            return Ok((None, locked));
        };
        let cell = cvt.cells[i];
        if cell.deleted {
            return Ok((None, locked));
        }
        match self.store.read_version(loc, &cell).await? {
            Ok(v) => Ok((Some((cell.version, v)), locked)),
            Err(_) => Err(TxnError::Abort(AbortReason::TornRead)),
        }
    }

    /// READ `(table, key)`'s CVT and its newest version (single-version protocols:
    /// OCC-CAS, Scythe). With `check_lock`, a held CVT lock word aborts at once
    /// ([`AbortReason::LockedOnRead`]).
    ///
    /// Errors: [`TxnError::Abort`] (locked, torn), service failures.
    pub(crate) async fn read_newest(
        &self,
        table: u32,
        key: u64,
        check_lock: bool,
    ) -> Result<Obj, TxnError> {
        let Some((loc, cvt)) = self.store.lookup(table, key).await? else {
            return Ok(Obj::absent(table, key));
        };
        if check_lock && cvt.header.lock != 0 {
            return Err(TxnError::Abort(AbortReason::LockedOnRead));
        }
        let mut o = Obj::absent(table, key);
        let newest = cvt.newest();
        self.fill(&mut o, loc, cvt, newest).await?;
        Ok(o)
    }

    /// Fill `o` from its CVT at `loc` as read (`cvt`) and the version in `cell` (`None`:
    /// no version visible): the version, and the value READ from its record (none for a
    /// tombstone). Errors: [`AbortReason::TornRead`] when the record does not match its
    /// cell; service failures.
    pub(crate) async fn fill(
        &self,
        o: &mut Obj,
        loc: CvtLoc,
        cvt: Cvt,
        cell: Option<usize>,
    ) -> Result<(), TxnError> {
        o.loc = Some(loc);
        if let Some(i) = cell {
            let cell = cvt.cells[i];
            o.version = cell.version;
            if !cell.deleted {
                match self.store.read_version(loc, &cell).await? {
                    Ok(v) => o.value = Some(v),
                    Err(_) => return Err(TxnError::Abort(AbortReason::TornRead)),
                }
            }
        }
        o.cvt = Some(cvt);
        Ok(())
    }

    /// Whether `(table, key)`'s CVT lock word is held (OCC-CAS, MVCC), for audits.
    ///
    /// Errors: as [`Self::read_committed`].
    pub async fn cvt_locked(&self, table: u32, key: u64) -> Result<bool, TxnError> {
        Ok(self.audit_row(table, key, false).await?.1)
    }

    /// Lock id of (table, key) in the lock service: keys of all tables interleaved
    /// (`key * tables + table`) while that fits in the lock table, so dense keys (SmallBank's
    /// accounts) each get their own lock; past it, a hash of that number onto the lock
    /// table. Two objects may then share a lock, which only adds false conflicts; the
    /// hash keeps composite keys (TPC-C's orders of different districts, which differ
    /// only in high bits) from landing on the same locks.
    pub fn lock_id(&self, table: u32, key: u64) -> u64 {
        let n = self.locks.as_ref().map_or(1, |l| l.n_locks()).max(1);
        let tables = self.store.tables().len().max(1) as u64;
        lock_slot(key, table, tables, n)
    }

    pub(crate) fn record(&self, kind: u16, times: Option<(Timestamp, Timestamp)>, acc: &[Access]) {
        let mut h = self.history.borrow_mut();
        let Some(h) = h.as_mut() else { return };
        match times {
            Some((s, c)) => {
                h.record_timed(kind, s.get(), c.get(), acc.len(), acc.iter().copied());
            }
            None => {
                h.record(kind, acc);
            }
        }
    }
}

/// What a transaction does to an object at commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Write {
    /// Install this value (an update, or an insert of an absent key).
    Put(Vec<u8>),
    /// Install a tombstone.
    Delete,
}

/// An object a transaction read.
pub(crate) struct Obj {
    pub table: u32,
    pub key: u64,
    /// Its CVT, `None` when the table has none for the key (never inserted).
    pub loc: Option<CvtLoc>,
    /// The CVT as last read (under the lock when `locked`).
    pub cvt: Option<Cvt>,
    /// Version read: the visible version's timestamp, the tombstone's, or
    /// [`Timestamp::ZERO`] when no version was visible.
    pub version: Timestamp,
    /// Value read; `None` when absent (no version, or a tombstone).
    pub value: Option<Vec<u8>>,
    pub write: Option<Write>,
    /// This transaction holds the CVT's lock word (OCC-CAS, MVCC).
    pub locked: bool,
    /// MVCC: the CVT was locked by another transaction when this one read it (see
    /// [`crate::mvcc`], locked CVTs).
    pub seen_locked: bool,
    /// Read for update (the transaction declared it will write the object).
    pub for_update: bool,
    /// Scythe: read, or checked unchanged, under this transaction's served Takeout ticket,
    /// which it holds until commit: needs no validation ([`crate::scythe`]).
    pub ticketed: bool,
}

impl Obj {
    pub(crate) fn absent(table: u32, key: u64) -> Self {
        Self {
            table,
            key,
            loc: None,
            cvt: None,
            version: Timestamp::ZERO,
            value: None,
            write: None,
            locked: false,
            seen_locked: false,
            for_update: false,
            ticketed: false,
        }
    }
}

/// A transaction in progress (one coordinator's current transaction). Dropping it
/// without [`Txn::commit`] or [`Txn::abort`] releases what it holds in the background.
pub struct Txn<'a> {
    pub(crate) c: &'a TxnClient,
    pub(crate) kind: u16,
    /// This transaction's lock word (OCC-CAS, MVCC): never 0.
    pub(crate) id: u64,
    /// Start timestamp (MVCC; Scythe's timestamp once taken).
    pub(crate) start: Option<Timestamp>,
    /// Scythe: this attempt runs TOCC (high-heat mode).
    pub(crate) tocc: bool,
    pub(crate) objs: Vec<Obj>,
    /// Scythe: Takeout Lock tickets held, by lock id.
    pub(crate) tickets: Vec<(u64, Ticket)>,
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
        self.id
    }

    /// Scythe: whether this attempt runs TOCC, the high-heat mode (000_f3dba2ed893b246b.txt,
    /// 4.2.2): it switched at the first round that met an object the lock service reported
    /// hot ([`crate::scythe`]). Always false for the other protocols.
    pub fn hot_mode(&self) -> bool {
        self.tocc
    }

    pub(crate) fn find(&self, table: u32, key: u64) -> Option<usize> {
        self.objs
            .iter()
            .position(|o| o.table == table && o.key == key)
    }

    /// Value as this transaction sees it (its own write first).
    fn value_of(&self, i: usize) -> Option<Vec<u8>> {
        let o = &self.objs[i];
        match &o.write {
            Some(Write::Put(v)) => Some(v.clone()),
            Some(Write::Delete) => None,
            None => o.value.clone(),
        }
    }

    /// Fetch the objects of `items` (table, key, for update) not yet in the read set,
    /// all in one round where the protocol allows; `for_update` when the transaction
    /// will write them (MVCC locks those now).
    async fn fetch(&mut self, items: &[(u32, u64, bool)]) -> Result<(), TxnError> {
        let mut want: Vec<(u32, u64, bool)> = Vec::new();
        for &(t, k, u) in items {
            self.c.store.table(0, t)?;
            let held = self.find(t, k).map(|i| self.objs[i].locked);
            // Already read: only MVCC has more to do, locking what was read plainly.
            let needed = match held {
                None => true,
                Some(locked) => u && !locked && matches!(self.c.cfg.protocol, Protocol::Mvcc(_)),
            };
            if needed {
                match want.iter_mut().find(|w| (w.0, w.1) == (t, k)) {
                    Some(w) => w.2 |= u,
                    None => want.push((t, k, u)),
                }
            }
        }
        if want.is_empty() {
            return Ok(());
        }
        match self.c.cfg.protocol {
            Protocol::OccCas => crate::occ_cas::fetch(self, &want).await,
            Protocol::Scythe => crate::scythe::fetch(self, &want).await,
            Protocol::Mvcc(_) => crate::mvcc::fetch(self, &want).await,
        }
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
        self.fetch(items).await?;
        #[allow(unused_mut)]
        let mut vals: Vec<Option<Vec<u8>>> = items
            .iter()
            .map(|&(t, k, _)| self.value_of(self.find(t, k).expect("fetched")))
            .collect();
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
        let want = self.c.store.table(0, table)?.len;
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
        let i = self.find(table, key).ok_or_else(|| {
            TxnError::Usage(format!(
                "write of table {table} key {key} before reading it"
            ))
        })?;
        if self.value_of(i).is_none() {
            return Err(TxnError::NotFound { table, key });
        }
        self.objs[i].write = Some(Write::Put(value));
        Ok(())
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
        for (t, k, v) in rows {
            let i = self.find(t, k).expect("fetched");
            self.objs[i].write = Some(Write::Put(v));
        }
        Ok(())
    }

    /// Delete `(table, key)`, which must exist: reads it for update if not read yet, then
    /// buffers a tombstone. Errors: [`TxnError::NotFound`], and as [`Self::get_many`].
    pub async fn delete(&mut self, table: u32, key: u64) -> Result<(), TxnError> {
        if self.get_many_for_update(&[(table, key)]).await?[0].is_none() {
            return Err(TxnError::NotFound { table, key });
        }
        let i = self.find(table, key).expect("fetched");
        self.objs[i].write = Some(Write::Delete);
        Ok(())
    }

    /// Commit. `Ok` means committed and visible.
    ///
    /// Errors: [`TxnError::Abort`] (nothing written; retry); [`TxnError::WriteBack`]
    /// when a service failed while writing back; other service failures (the
    /// transaction aborted). Every lock is released on every path.
    pub async fn commit(mut self) -> Result<(), TxnError> {
        let r = match self.c.cfg.protocol {
            Protocol::OccCas => crate::occ_cas::commit(&mut self).await,
            Protocol::Scythe => crate::scythe::commit(&mut self).await,
            Protocol::Mvcc(_) => crate::mvcc::commit(&mut self).await,
        };
        let released = self.release_all().await;
        match r {
            Err(TxnError::WriteBack { cause, release }) => Err(TxnError::WriteBack {
                cause,
                release: release.or(released.err().map(Box::new)),
            }),
            Err(e) => Err(e),
            Ok(()) => released,
        }
    }

    /// Give up: release what the transaction holds; returns
    /// [`TxnError::Abort`]([`AbortReason::User`]) to pass on.
    pub async fn abort(mut self) -> TxnError {
        match self.release_all().await {
            Ok(()) => TxnError::Abort(AbortReason::User),
            Err(e) => e,
        }
    }

    /// Release every CVT lock word and ticket held, in one round.
    pub(crate) async fn release_all(&mut self) -> Result<(), TxnError> {
        let store = &self.c.store;
        let locs: Vec<CvtLoc> = self
            .objs
            .iter_mut()
            .filter(|o| o.locked)
            .map(|o| {
                o.locked = false;
                o.loc.expect("a locked object has a CVT")
            })
            .collect();
        let tickets = std::mem::take(&mut self.tickets);
        let (a, b) = rrpc::runtime::join(
            join_all(locs.iter().map(|&l| store.unlock(l))),
            join_all(tickets.into_iter().map(|(_, t)| t.release())),
        )
        .await;
        if let Some(e) = a.into_iter().find_map(Result::err) {
            return Err(e);
        }
        if let Some(e) = b.into_iter().find_map(Result::err) {
            return Err(e.into());
        }
        Ok(())
    }

    /// Record this committed transaction: each object read at its version, each write at
    /// the version it installed: `new_version` (MVCC's commit timestamp), or for
    /// [`Timestamp::ZERO`] the version read + 1 (the single-version protocols); with
    /// `times` (start, commit) for the snapshot-isolation check.
    pub(crate) fn record(&self, times: Option<(Timestamp, Timestamp)>, new_version: Timestamp) {
        if self.c.cfg.history_limit_bytes.is_none() {
            return;
        }
        let mut acc = Vec::with_capacity(self.objs.len() * 2);
        for o in &self.objs {
            acc.push(Access::read(o.table, o.key, o.version.get()));
        }
        for o in self.objs.iter().filter(|o| o.write.is_some()) {
            let v = if new_version == Timestamp::ZERO {
                Timestamp(o.version.get() + 1)
            } else {
                new_version
            };
            acc.push(Access::write(o.table, o.key, v.get()));
        }
        self.c.record(self.kind, times, &acc);
    }
}

impl Drop for Txn<'_> {
    fn drop(&mut self) {
        // Tickets release themselves when dropped; CVT lock words need a WRITE, from a
        // coroutine of their own since a drop cannot wait.
        let targets: Vec<_> = self
            .objs
            .iter()
            .filter(|o| o.locked)
            .filter_map(|o| self.c.store.lock_target(o.loc?).ok())
            .collect();
        if targets.is_empty() {
            return;
        }
        let ctx = self.c.store.ctx().clone();
        self.c.store.ctx().spawn(async move {
            const FREE: [u8; 8] = [0; 8];
            let wrote =
                join_all(targets.iter().map(|&(node, at)| ctx.write(node, at, &FREE))).await;
            for e in wrote.into_iter().filter_map(Result::err) {
                tracing::warn!(error = %e, "releasing a dropped transaction's CVT lock");
            }
        });
    }
}

/// [`TxnClient::lock_id`]'s mapping of `(table, key)` onto `n` locks for `tables` tables.
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
    use super::lock_slot;
    use std::collections::HashSet;

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
