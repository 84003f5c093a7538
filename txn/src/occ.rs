//! The transaction coordinator: Scythe's OCC for low-heat mode
//! (000_f3dba2ed893b246b.txt, 4.2.1 and Fig. 12 (a)) on Takeout Locks (4.3).
//!
//! - **Execute**: every read is a one-sided READ of the record (its address found by a
//!   one-sided READ of the hash index, then cached) issued together with a one-sided READ
//!   of the object's Takeout Lock words. A torn record, or a lock that is held or has a
//!   queue, aborts the transaction at once (4.2.1 (3)): it would fail validation anyway.
//!   Writes are buffered locally.
//! - **Lock**: the coordinator takes a timestamp from the TSO (one FAA) and sends one Lock
//!   RPC for the whole write set (cold mode: refused past ColdWatermark or behind a newer
//!   timestamp). Tickets are then waited for in parallel with Hangout polling.
//! - **Validate** ([`crate::validation`]): each version read must be unchanged, and
//!   objects only read must be neither locked nor queued by another transaction. For an
//!   object only read, the lock words are READ first and the record only after they were
//!   seen free (the record and the lock live on two nodes; the other order lets write
//!   skew commit). Records of objects under our own locks go out in the first round.
//! - **Commit**: records are written back with one-sided WRITEs (version + 1 at both
//!   ends), then every lock is released with a one-sided FAA of `upper`.
//! - **Abort after locking**: a ticket cannot be cancelled, so each granted ticket is
//!   released when its turn comes ([`lockd::client::Ticket::release`]). Tickets are
//!   values that must be released: on every path out of `commit`, errors included, they
//!   are released or, when dropped, released by a coroutine of their own.
//!
//! With [`OccConfig::history_limit_bytes`] set, each committed transaction's reads and
//! writes (with versions) are recorded for the serializability check
//! ([`crate::serializability`]).
//!
//! Deadlock freedom: a lock queue only admits timestamps at least its `queued_ts`, so each
//! queue is ordered by timestamp and a transaction only ever waits for holders with
//! smaller timestamps (Scythe 4.4 (1)).

use rrpc::NodeId;
use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use lockd::client::{Grant, LockClient, LockError, LockRequest, Ticket};
use lockd::takeout::{Mode, RefuseReason};
use rrpc::fabric::RemoteAddr;
use rrpc::runtime::{join, join_all, RpcError, ThreadCtx};
use tso::{ReconnectConfig, TsoConn};

use crate::history::{Access, History};
use crate::store::{
    decode_record, encode_record, search_bucket, BucketLookup, RecordError, TableExport,
    BUCKET_BYTES,
};
use crate::validation::{self, RecordSeen, Step, Validation};

/// Why a transaction aborted. Aborts are expected under contention; callers retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AbortReason {
    /// Execution read an object that was locked or had a queue (4.2.1 (3)).
    LockedOnRead,
    /// A record was read in the middle of a write.
    TornRead,
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
    /// A granted ticket was not served within [`OccConfig::lock_wait`]; the tickets are
    /// released in the background when their turn comes.
    LockWaitTimeout,
    /// The transaction's own logic gave up (e.g. insufficient funds).
    User,
}

impl AbortReason {
    /// Every reason, for reports.
    pub const ALL: [AbortReason; 9] = [
        Self::LockedOnRead,
        Self::TornRead,
        Self::LockRefusedTimestamp,
        Self::LockRefusedCold,
        Self::LockRefusedHot,
        Self::ValidationVersion,
        Self::ValidationLocked,
        Self::LockWaitTimeout,
        Self::User,
    ];
    /// Short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::LockedOnRead => "locked-on-read",
            Self::TornRead => "torn-read",
            Self::LockRefusedTimestamp => "lock-refused-ts",
            Self::LockRefusedCold => "lock-refused-cold",
            Self::LockRefusedHot => "lock-refused-hot",
            Self::ValidationVersion => "validation-version",
            Self::ValidationLocked => "validation-locked",
            Self::LockWaitTimeout => "lock-wait-timeout",
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
    /// The key does not exist.
    #[error("table {table} has no key {key}")]
    NotFound {
        /// Table id.
        table: u32,
        /// Key.
        key: u64,
    },
    /// Misuse of the API (unknown table, write without read, value size).
    #[error("{0}")]
    Usage(String),
    /// A one-sided operation or RPC failed (peer gone, timeout, completion error). The
    /// transaction aborted unless the failure hit during write-back
    /// ([`TxnError::WriteBack`] then). Its tickets were released, or are being released
    /// in the background when their turn comes.
    #[error("service failure: {0}")]
    Rpc(#[from] RpcError),
    /// The lock service failed or a lock was lost ([`LockError::Lost`]: a ticket that
    /// could not be passed on).
    #[error("lock service: {0}")]
    Lock(#[from] LockError),
    /// The timestamp oracle failed.
    #[error("timestamp oracle: {0}")]
    Tso(#[from] tso::TsoError),
    /// A record is not what the index said (a stale cached address); the cache entry
    /// was dropped.
    #[error("memory node: {0}")]
    Record(#[from] RecordError),
    /// The memory node's exports are missing or inconsistent.
    #[error("memory node export: {0}")]
    Export(String),
    /// Write-back failed: the transaction's writes may be partly visible. Its locks were
    /// passed on all the same, unless `release` says otherwise.
    #[error("write-back failed: {cause}{}", .release.as_ref().map(|r| format!("; and {r}")).unwrap_or_default())]
    WriteBack {
        /// Why the write-back failed.
        #[source]
        cause: Box<TxnError>,
        /// A lock that could not be passed on afterwards.
        release: Option<LockError>,
    },
}

rrpc::from_rpc_errors!(TxnError, TxnError::Rpc);

/// Coordinator settings.
#[derive(Clone, Debug)]
pub struct OccConfig {
    /// How long to wait for a granted ticket's turn before aborting with
    /// [`AbortReason::LockWaitTimeout`] (default 2 s).
    pub lock_wait: Duration,
    /// Record committed transactions for the serializability check, up to this many
    /// bytes per thread (see [`crate::history`] for the cost per transaction); `None`
    /// (the default) records nothing.
    pub history_limit_bytes: Option<usize>,
    /// How long a timestamp request waits for a restarted oracle, and how often it looks
    /// for it (default: [`ReconnectConfig::default`], 30 s and 10 ms).
    pub tso_reconnect: ReconnectConfig,
}

impl Default for OccConfig {
    fn default() -> Self {
        Self {
            lock_wait: Duration::from_secs(2),
            history_limit_bytes: None,
            tso_reconnect: ReconnectConfig::default(),
        }
    }
}

/// Addresses of a cluster's services.
#[derive(Clone, Copy, Debug)]
pub struct ServiceAddrs {
    /// Memory node's bootstrap address.
    pub memnode: SocketAddr,
    /// Lock service's bootstrap address.
    pub lockd: SocketAddr,
    /// Timestamp oracle's bootstrap address.
    pub tso: SocketAddr,
}

/// One thread's handle on the cluster, shared by the thread's coordinators (coroutines).
pub struct TxnClient {
    ctx: Rc<ThreadCtx>,
    mem: NodeId,
    tables: Vec<TableExport>,
    lock_base: Vec<u64>,
    locks: LockClient,
    tso: TsoConn,
    addr_cache: RefCell<HashMap<(u32, u64), u64>>,
    cfg: OccConfig,
    history: RefCell<Option<History>>,
}

struct ReadEntry {
    table: u32,
    key: u64,
    addr: u64,
    version: u64,
    value: Vec<u8>,
}

/// A transaction in progress (one coordinator's current transaction).
pub struct Txn<'a> {
    c: &'a TxnClient,
    /// The workload's transaction type, recorded with the history.
    kind: u16,
    reads: Vec<ReadEntry>,
    /// Index into `reads` and the new value.
    writes: Vec<(usize, Vec<u8>)>,
}

impl TxnClient {
    /// Connect this thread to the memory node (one-sided), lockd (RPC + one-sided) and the
    /// TSO (one-sided). Blocking; call before running coroutines.
    pub fn connect(
        ctx: Rc<ThreadCtx>,
        addrs: ServiceAddrs,
        cfg: OccConfig,
    ) -> Result<Self, TxnError> {
        let mem = ctx.connect(addrs.memnode)?;
        let mut tables: Vec<TableExport> = mem
            .export("tables")
            .map_err(|e| TxnError::Export(e.to_string()))?;
        tables.sort_by_key(|t| t.id);
        if tables.iter().enumerate().any(|(i, t)| t.id as usize != i) {
            return Err(TxnError::Export("table ids must be 0..n".into()));
        }
        let lk = ctx.connect_rpc(addrs.lockd)?;
        let locks = LockClient::from_info(&lk)?;
        let tso = TsoConn::connect(ctx.clone(), addrs.tso, cfg.tso_reconnect)?;
        let mut lock_base = Vec::new();
        let mut base = 0;
        for t in &tables {
            lock_base.push(base);
            base += t.n_records;
        }
        Ok(Self {
            ctx,
            mem: mem.node,
            tables,
            lock_base,
            locks,
            tso,
            addr_cache: RefCell::new(HashMap::new()),
            history: RefCell::new(cfg.history_limit_bytes.map(History::new)),
            cfg,
        })
    }

    /// The committed transactions recorded so far, leaving an empty history with the same
    /// limit; `None` when the client does not record ([`OccConfig::history_limit_bytes`]).
    pub fn take_history(&self) -> Option<History> {
        let limit = self.cfg.history_limit_bytes?;
        self.history.borrow_mut().replace(History::new(limit))
    }

    /// The tables of the memory node.
    pub fn tables(&self) -> &[TableExport] {
        &self.tables
    }

    /// The thread context.
    pub fn ctx(&self) -> &Rc<ThreadCtx> {
        &self.ctx
    }

    /// The lock service client.
    pub fn locks(&self) -> &LockClient {
        &self.locks
    }

    /// Start a transaction.
    pub fn begin(&self) -> Txn<'_> {
        self.begin_as(0)
    }

    /// Start a transaction of the workload's type `kind` (recorded with the history, so
    /// a reported cycle names the types on it).
    pub fn begin_as(&self, kind: u16) -> Txn<'_> {
        Txn {
            c: self,
            kind,
            reads: Vec::new(),
            writes: Vec::new(),
        }
    }

    /// Lock id of (table, key): tables occupy consecutive ranges; wraps onto the table
    /// size (two objects may share a lock, which only adds false conflicts).
    pub fn lock_id(&self, table: u32, key: u64) -> u64 {
        (self.lock_base[table as usize] + key) % self.locks.n_locks()
    }

    fn table(&self, table: u32) -> Result<&TableExport, TxnError> {
        self.tables
            .get(table as usize)
            .ok_or_else(|| TxnError::Usage(format!("no table {table}")))
    }

    /// Record address of (table, key): from the cache, else by reading the index.
    async fn record_addr(&self, table: u32, key: u64) -> Result<u64, TxnError> {
        if let Some(&a) = self.addr_cache.borrow().get(&(table, key)) {
            return Ok(a);
        }
        let t = self.table(table)?;
        let mut b = t.home_bucket(key);
        for _ in 0..t.n_buckets {
            let img = self
                .ctx
                .read(self.mem, t.bucket_addr(b), BUCKET_BYTES)
                .await?;
            match search_bucket(&img, key) {
                BucketLookup::Found(a) => {
                    self.addr_cache.borrow_mut().insert((table, key), a);
                    return Ok(a);
                }
                BucketLookup::Absent => break,
                BucketLookup::Next => b += 1,
            }
        }
        Err(TxnError::NotFound { table, key })
    }

    /// READ a record: its address, and the decoded record or `None` when it was torn.
    async fn read_record(
        &self,
        table: u32,
        key: u64,
    ) -> Result<(u64, Option<crate::store::Record>), TxnError> {
        let t = self.table(table)?;
        let addr = self.record_addr(table, key).await?;
        let remote = RemoteAddr {
            addr,
            rkey: t.records.rkey,
        };
        let img = self
            .ctx
            .read(self.mem, remote, t.record_bytes as usize)
            .await?;
        match decode_record(&img, key, t.value_bytes as usize) {
            Ok(r) => Ok((addr, Some(r))),
            Err(RecordError::Torn { .. }) => Ok((addr, None)),
            Err(e @ RecordError::WrongKey { .. }) => {
                self.addr_cache.borrow_mut().remove(&(table, key));
                Err(e.into())
            }
        }
    }

    /// True when lock `id` is held or queued (by anyone).
    async fn lock_busy(&self, id: u64) -> Result<bool, TxnError> {
        Ok(self.locks.read_state(&self.ctx, id).await?.queued() > 0)
    }

    /// Read a record and, with `check_lock`, its lock words in the same round (the
    /// execution read: a busy lock aborts early, 4.2.1 (3)).
    async fn read_object(
        &self,
        table: u32,
        key: u64,
        check_lock: bool,
    ) -> Result<ReadEntry, TxnError> {
        let rec = self.read_record(table, key);
        let (rec, busy) = if check_lock {
            let (a, b) = join(rec, self.lock_busy(self.lock_id(table, key))).await;
            (a?, b?)
        } else {
            (rec.await?, false)
        };
        let (addr, Some(r)) = rec else {
            return Err(TxnError::Abort(AbortReason::TornRead));
        };
        if busy {
            return Err(TxnError::Abort(AbortReason::LockedOnRead));
        }
        Ok(ReadEntry {
            table,
            key,
            addr,
            version: r.version,
            value: r.value,
        })
    }

    /// Read a committed record without a transaction (no lock check): for audits after
    /// a run. Returns (version, value).
    pub async fn read_committed(&self, table: u32, key: u64) -> Result<(u64, Vec<u8>), TxnError> {
        let e = self.read_object(table, key, false).await?;
        Ok((e.version, e.value))
    }

    /// Take one timestamp from the TSO (waiting for a restarted oracle, see
    /// [`tso::conn`]).
    pub async fn timestamp(&self) -> Result<u64, TxnError> {
        Ok(self.tso.timestamp().await?.get())
    }

    /// The TSO connection (its epoch in use, restarts it survived).
    pub fn tso(&self) -> &TsoConn {
        &self.tso
    }
}

impl Txn<'_> {
    /// Read several objects in parallel (all READs go out in one round). Values in order.
    /// Objects already read or written by this transaction are served locally.
    pub async fn read_many(&mut self, items: &[(u32, u64)]) -> Result<Vec<Vec<u8>>, TxnError> {
        let missing: Vec<(u32, u64)> = items
            .iter()
            .copied()
            .filter(|&(t, k)| self.find(t, k).is_none())
            .collect();
        let c = self.c;
        let got = join_all(missing.iter().map(|&(t, k)| c.read_object(t, k, true))).await;
        for e in got {
            let e = e?;
            if self.find(e.table, e.key).is_none() {
                self.reads.push(e);
            }
        }
        Ok(items
            .iter()
            .map(|&(t, k)| self.value_of(self.find(t, k).expect("read above")))
            .collect())
    }

    /// Read one object.
    pub async fn read(&mut self, table: u32, key: u64) -> Result<Vec<u8>, TxnError> {
        Ok(self
            .read_many(&[(table, key)])
            .await?
            .pop()
            .expect("one value"))
    }

    /// Buffer a write of an object this transaction has read.
    pub fn write(&mut self, table: u32, key: u64, value: Vec<u8>) -> Result<(), TxnError> {
        let i = self.find(table, key).ok_or_else(|| {
            TxnError::Usage(format!(
                "write of table {table} key {key} before reading it"
            ))
        })?;
        let want = self.c.table(table)?.value_bytes as usize;
        if value.len() != want {
            return Err(TxnError::Usage(format!(
                "value of {} bytes, table {table} holds {want}",
                value.len()
            )));
        }
        match self.writes.iter_mut().find(|(j, _)| *j == i) {
            Some(w) => w.1 = value,
            None => self.writes.push((i, value)),
        }
        Ok(())
    }

    fn find(&self, table: u32, key: u64) -> Option<usize> {
        self.reads
            .iter()
            .position(|e| e.table == table && e.key == key)
    }

    fn value_of(&self, i: usize) -> Vec<u8> {
        match self.writes.iter().find(|(j, _)| *j == i) {
            Some((_, v)) => v.clone(),
            None => self.reads[i].value.clone(),
        }
    }

    /// Give up: nothing was locked or written yet, so there is nothing to undo.
    pub fn abort(self) -> TxnError {
        TxnError::Abort(AbortReason::User)
    }

    /// Lock, validate, write back, unlock. `Ok` means committed and visible.
    ///
    /// Errors: [`TxnError::Abort`] (nothing written; retry), [`TxnError::Fatal`] when a
    /// service failed. Every ticket taken is released on every path, or, when its turn
    /// cannot be awaited here (a lock wait that timed out, a failed RPC), by a coroutine
    /// of its own when its turn comes.
    pub async fn commit(self) -> Result<(), TxnError> {
        let c = self.c;
        // Locks of the write set, deduplicated (two objects may share a lock).
        let mut lock_ids: Vec<u64> = self
            .writes
            .iter()
            .map(|&(i, _)| c.lock_id(self.reads[i].table, self.reads[i].key))
            .collect();
        lock_ids.sort_unstable();
        lock_ids.dedup();

        let tickets = self.lock(&lock_ids).await?;
        if let Err(e) = self.validate(&lock_ids).await {
            release_all(tickets).await?;
            return Err(e);
        }
        if !self.writes.is_empty() {
            if let Err(e) = self.write_back().await {
                // The write-back's outcome is unknown; pass the locks on all the same.
                return Err(TxnError::WriteBack {
                    cause: Box::new(e),
                    release: release_all(tickets).await.err(),
                });
            }
        }
        self.record();
        Ok(release_all(tickets).await?)
    }

    /// Take the write set's tickets (one Lock RPC per 15 locks, cold mode) and wait until
    /// each is served. On a refusal, every ticket taken is released (each when its turn
    /// comes) and the transaction aborts.
    async fn lock(&self, lock_ids: &[u64]) -> Result<Vec<Ticket>, TxnError> {
        let c = self.c;
        let mut tickets = Vec::with_capacity(lock_ids.len());
        if lock_ids.is_empty() {
            return Ok(tickets);
        }
        let ts = c.timestamp().await?;
        let mut refused = None;
        for chunk in lock_ids.chunks(lockd::wire::MAX_ENTRIES) {
            let reqs: Vec<LockRequest> = chunk
                .iter()
                .map(|&id| LockRequest {
                    id,
                    ts,
                    mode: Mode::Cold,
                })
                .collect();
            // An error here drops the tickets taken so far: each is released when its
            // turn comes.
            for g in c.locks.lock(&c.ctx, &reqs).await? {
                match g {
                    Grant::Queued(t) => tickets.push(t),
                    Grant::Refused(r) => {
                        refused.get_or_insert(match r.reason {
                            Some(RefuseReason::Timestamp) => AbortReason::LockRefusedTimestamp,
                            Some(RefuseReason::HotWatermark) => AbortReason::LockRefusedHot,
                            _ => AbortReason::LockRefusedCold,
                        });
                    }
                }
            }
        }
        if let Some(reason) = refused {
            release_all(tickets).await?;
            return Err(TxnError::Abort(reason));
        }
        let deadline = Instant::now() + c.cfg.lock_wait;
        let waits = join_all(tickets.iter_mut().map(|t| t.wait(deadline))).await;
        if let Some(e) = waits.into_iter().find_map(Result::err) {
            // The tickets keep their places; dropping them hands each to a coroutine that
            // releases it when its turn comes, so this coordinator can go on.
            drop(tickets);
            return Err(match e {
                LockError::WaitTimeout { .. } => TxnError::Abort(AbortReason::LockWaitTimeout),
                e => e.into(),
            });
        }
        Ok(tickets)
    }

    /// Validate the read set with the write set's locks held (see [`crate::validation`]).
    async fn validate(&self, lock_ids: &[u64]) -> Result<(), TxnError> {
        let c = self.c;
        // Entry `k` of the validation is read-set entry `index[k]`.
        let mut index = Vec::with_capacity(self.reads.len());
        let mut entries = Vec::with_capacity(self.reads.len());
        for (i, e) in self.reads.iter().enumerate() {
            let written = self.writes.iter().any(|&(j, _)| j == i);
            let locked_by_me =
                written || lock_ids.binary_search(&c.lock_id(e.table, e.key)).is_ok();
            #[cfg(feature = "fault-injection")]
            if !locked_by_me && crate::fault::skipping_read_only_validation() {
                continue;
            }
            index.push(i);
            entries.push(validation::Entry {
                version: e.version,
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
            let entry = |k: usize| &self.reads[index[k]];
            let locks = round.locks.iter().map(|&k| {
                let e = entry(k);
                c.lock_busy(c.lock_id(e.table, e.key))
            });
            let records = round.records.iter().map(|&k| {
                let e = entry(k);
                c.read_record(e.table, e.key)
            });
            let (busy, seen) = join(join_all(locks), join_all(records)).await;
            let busy = busy.into_iter().collect::<Result<Vec<bool>, _>>()?;
            let seen = seen
                .into_iter()
                .map(|r| {
                    r.map(|(_, rec)| match rec {
                        Some(rec) => RecordSeen::Version(rec.version),
                        None => RecordSeen::Torn,
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            step = v.observe(&round, &busy, &seen);
        }
    }

    /// Write back whole records, version + 1 at both ends, one doorbell.
    async fn write_back(&self) -> Result<(), TxnError> {
        let c = self.c;
        #[cfg(feature = "fault-injection")]
        if crate::fault::failing_write_back() {
            // As the memory node's NIC would answer a WRITE to a deregistered region.
            return Err(TxnError::Rpc(RpcError::OneSided(
                rrpc::runtime::OneSidedError::Completion {
                    node: c.mem,
                    status: rrpc::fabric::WcStatus::RemoteAccess,
                },
            )));
        }
        let images: Vec<(RemoteAddr, Vec<u8>)> = self
            .writes
            .iter()
            .map(|(i, v)| {
                let e = &self.reads[*i];
                let t = &c.tables[e.table as usize];
                let mut img = Vec::new();
                encode_record(e.version + 1, e.key, v, &mut img);
                (
                    RemoteAddr {
                        addr: e.addr,
                        rkey: t.records.rkey,
                    },
                    img,
                )
            })
            .collect();
        let wrote = join_all(images.iter().map(|(a, img)| c.ctx.write(c.mem, *a, img))).await;
        match wrote.into_iter().find_map(Result::err) {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Record this committed transaction, if the client records.
    fn record(&self) {
        let mut h = self.c.history.borrow_mut();
        let Some(h) = h.as_mut() else { return };
        let reads = self
            .reads
            .iter()
            .map(|e| Access::read(e.table, e.key, e.version));
        let writes = self.writes.iter().map(|&(i, _)| {
            let e = &self.reads[i];
            Access::write(e.table, e.key, e.version + 1)
        });
        h.record_iter(
            self.kind,
            self.reads.len() + self.writes.len(),
            reads.chain(writes),
        );
    }
}

/// Release every ticket (each waits for its turn if it has not come), all in one round.
///
/// Errors: the first [`LockError::Lost`]: a lock that could not be passed on.
async fn release_all(tickets: Vec<Ticket>) -> Result<(), LockError> {
    if tickets.is_empty() {
        return Ok(());
    }
    let r = join_all(tickets.into_iter().map(Ticket::release)).await;
    match r.into_iter().find_map(Result::err) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
