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
//! - **Validate**: the read set is re-read (record and lock words, all in one doorbell per
//!   node): each version must be unchanged, and objects only read must be neither locked
//!   nor queued by another transaction.
//! - **Commit**: records are written back with one-sided WRITEs (version + 1 at both
//!   ends), then every lock is released with a one-sided FAA of `upper`.
//! - **Abort after locking**: a ticket cannot be cancelled, so the coordinator waits for
//!   each granted ticket's turn and releases it (a ticket lock's release is `upper += 1`).
//!
//! Deadlock freedom: a lock queue only admits timestamps at least its `queued_ts`, so each
//! queue is ordered by timestamp and a transaction only ever waits for holders with
//! smaller timestamps (Scythe 4.4 (1)).

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use lockd::client::{LockClient, LockRequest};
use lockd::takeout::{Mode, RefuseReason};
use rrpc::fabric::RemoteAddr;
use rrpc::runtime::{join, join_all, RpcError, ThreadCtx};
use tso::TsoClient;

use crate::store::{
    decode_record, encode_record, search_bucket, BucketLookup, RecordError, TableExport,
    BUCKET_BYTES,
};

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
    /// The transaction's own logic gave up (e.g. insufficient funds).
    User,
}

impl AbortReason {
    /// Every reason, for reports.
    pub const ALL: [AbortReason; 8] = [
        Self::LockedOnRead,
        Self::TornRead,
        Self::LockRefusedTimestamp,
        Self::LockRefusedCold,
        Self::LockRefusedHot,
        Self::ValidationVersion,
        Self::ValidationLocked,
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
            Self::User => "user",
        }
    }
}

/// Errors of transactions.
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
    /// A service failed (peer gone, timeout). The transaction's outcome is decided
    /// (aborted unless the failure hit after write-back), but locks may stay held.
    #[error("service failure: {0}")]
    Fatal(String),
}

impl From<RpcError> for TxnError {
    fn from(e: RpcError) -> Self {
        Self::Fatal(e.to_string())
    }
}
impl From<lockd::client::LockError> for TxnError {
    fn from(e: lockd::client::LockError) -> Self {
        Self::Fatal(e.to_string())
    }
}
impl From<tso::TsoError> for TxnError {
    fn from(e: tso::TsoError) -> Self {
        Self::Fatal(e.to_string())
    }
}

/// Coordinator settings.
#[derive(Clone, Debug)]
pub struct OccConfig {
    /// How long to wait for a granted ticket's turn before giving up (default 2 s).
    pub lock_wait: Duration,
}

impl Default for OccConfig {
    fn default() -> Self {
        Self {
            lock_wait: Duration::from_secs(2),
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
    mem: u32,
    tables: Vec<TableExport>,
    lock_base: Vec<u64>,
    locks: LockClient,
    tso: TsoClient,
    addr_cache: RefCell<HashMap<(u32, u64), u64>>,
    cfg: OccConfig,
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
            .map_err(|e| TxnError::Fatal(e.to_string()))?;
        tables.sort_by_key(|t| t.id);
        if tables.iter().enumerate().any(|(i, t)| t.id as usize != i) {
            return Err(TxnError::Fatal("table ids must be 0..n".into()));
        }
        let lk = ctx.connect_rpc(addrs.lockd)?;
        let locks = LockClient::from_info(&lk)?;
        let ts = ctx.connect(addrs.tso)?;
        let tso = TsoClient::from_info(&ts)?;
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
            cfg,
        })
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
        Txn {
            c: self,
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

    /// Read a record and, in the same round, its lock words. Returns (addr, version, value).
    async fn read_object(
        &self,
        table: u32,
        key: u64,
        check_lock: bool,
    ) -> Result<ReadEntry, TxnError> {
        let t = self.table(table)?;
        let addr = self.record_addr(table, key).await?;
        let remote = RemoteAddr {
            addr,
            rkey: t.records.rkey,
        };
        let rec = self.ctx.read(self.mem, remote, t.record_bytes as usize);
        let lock = self.locks.read_state(&self.ctx, self.lock_id(table, key));
        let (img, lock) = if check_lock {
            let (a, b) = join(rec, lock).await;
            (a?, Some(b?))
        } else {
            (rec.await?, None)
        };
        let r = match decode_record(&img, key, t.value_bytes as usize) {
            Ok(r) => r,
            Err(RecordError::Torn { .. }) => return Err(TxnError::Abort(AbortReason::TornRead)),
            Err(e @ RecordError::WrongKey { .. }) => {
                self.addr_cache.borrow_mut().remove(&(table, key));
                return Err(TxnError::Fatal(e.to_string()));
            }
        };
        if lock.is_some_and(|l| l.queued() > 0) {
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

    /// Take one timestamp from the TSO.
    pub async fn timestamp(&self) -> Result<u64, TxnError> {
        Ok(self.tso.timestamp(&self.ctx).await?)
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
        let got = join_all(
            missing
                .iter()
                .map(|&(t, k)| c.read_object(t, k, true))
                .collect(),
        )
        .await;
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
    pub async fn commit(self) -> Result<(), TxnError> {
        let c = self.c;
        let ctx = &*c.ctx;
        // Locks of the write set, deduplicated (two objects may share a lock).
        let mut lock_ids: Vec<u64> = self
            .writes
            .iter()
            .map(|&(i, _)| c.lock_id(self.reads[i].table, self.reads[i].key))
            .collect();
        lock_ids.sort_unstable();
        lock_ids.dedup();

        let mut held: Vec<(u64, u64, u64)> = Vec::new(); // (lock id, ticket, upper seen)
        if !lock_ids.is_empty() {
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
                let replies = c.locks.lock(ctx, &reqs).await?;
                for (r, &id) in replies.iter().zip(chunk) {
                    if r.granted_queue {
                        held.push((id, r.ticket, r.upper));
                    } else if refused.is_none() {
                        refused = Some(match r.reason {
                            Some(RefuseReason::Timestamp) => AbortReason::LockRefusedTimestamp,
                            Some(RefuseReason::HotWatermark) => AbortReason::LockRefusedHot,
                            _ => AbortReason::LockRefusedCold,
                        });
                    }
                }
            }
            // Wait for every granted ticket's turn (also when aborting: see module docs).
            let deadline = Instant::now() + c.cfg.lock_wait;
            let waits = join_all(
                held.iter()
                    .map(|&(id, t, u)| c.locks.wait_granted(ctx, id, t, u, deadline))
                    .collect(),
            )
            .await;
            if let Some(e) = waits.into_iter().find_map(Result::err) {
                return Err(e.into());
            }
            if let Some(reason) = refused {
                release(c, &held).await?;
                return Err(TxnError::Abort(reason));
            }
        }

        // Validate the read set: versions unchanged; objects only read neither locked nor
        // queued (objects we hold are ours).
        let checks = join_all(
            self.reads
                .iter()
                .enumerate()
                .map(|(i, e)| {
                    let written = self.writes.iter().any(|&(j, _)| j == i);
                    let mine = lock_ids.binary_search(&c.lock_id(e.table, e.key)).is_ok();
                    async move {
                        let r = c.read_object(e.table, e.key, !written && !mine).await;
                        match r {
                            Ok(now) if now.version == e.version => Ok(()),
                            Ok(_) => Err(TxnError::Abort(AbortReason::ValidationVersion)),
                            Err(TxnError::Abort(AbortReason::LockedOnRead)) => {
                                Err(TxnError::Abort(AbortReason::ValidationLocked))
                            }
                            Err(TxnError::Abort(AbortReason::TornRead)) => {
                                Err(TxnError::Abort(AbortReason::ValidationVersion))
                            }
                            Err(e) => Err(e),
                        }
                    }
                })
                .collect(),
        )
        .await;
        if let Some(e) = checks.into_iter().find_map(Result::err) {
            release(c, &held).await?;
            return Err(e);
        }
        if self.writes.is_empty() {
            return Ok(());
        }

        // Write back: whole records, version + 1 at both ends, one doorbell.
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
        let wrote = join_all(
            images
                .iter()
                .map(|(a, img)| ctx.write(c.mem, *a, img))
                .collect(),
        )
        .await;
        if let Some(e) = wrote.into_iter().find_map(Result::err) {
            return Err(e.into());
        }
        release(c, &held).await
    }
}

/// Unlock every held lock (FAA of `upper`), all in one round.
async fn release(c: &TxnClient, held: &[(u64, u64, u64)]) -> Result<(), TxnError> {
    let r = join_all(
        held.iter()
            .map(|&(id, _, _)| c.locks.unlock(&c.ctx, id))
            .collect(),
    )
    .await;
    match r.into_iter().find_map(Result::err) {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}
