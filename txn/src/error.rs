//! Why a transaction failed: [`AbortReason`] for the expected aborts of optimistic
//! concurrency control (retry the transaction), [`TxnError`] for everything a caller
//! sees, each variant keeping its cause.
//!
//! The bottom of the crate's transaction layer: the store ([`crate::cvt_remote`]), the
//! validation state machine, the attempt state and every protocol report through these
//! types.

use lockd::client::LockError;
use rrpc::runtime::RpcError;
use tso::TsoError;

/// Why a transaction aborted. Aborts are expected under contention; callers retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
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
    /// The lock service is gone, restarted or in its restart grace (Scythe): the
    /// attempt's tickets, if any, died with the old table; it retries on the service the
    /// client reconnects to ([`lockd::client::LockConn`]).
    LockService,
    /// A ticket the attempt holds is older than the ticket lease
    /// ([`crate::config::TxnConfig::ticket_lease`]) at commit: a restarted lock service may
    /// already have granted its lock to another, so the attempt must not act on it.
    TicketExpired,
    /// The workload met a state that cannot be (a row its earlier reads say exists is
    /// gone, or one they say is free is taken): an optimistic read was stale, and
    /// validation would fail. Declared by the workload.
    Inconsistent,
    /// The transaction's own logic gave up (e.g. insufficient funds).
    User,
    /// A memory node holding a copy of a partition it touched died, or its partition is
    /// being failed over ([`crate::view`]); retried once the new view is out.
    ReplicaFailed,
    /// A partition it touched is being copied to a new backup (re-replication,
    /// [`crate::view::View::start_migration`]); retried once the copy has landed.
    Migrating,
    /// Lotus: a compute-node lock table refused a lock (a conflicting lock held, or an
    /// upgrade while others read; no waiting, Lotus 5.1).
    LockRefusedConflict,
    /// Lotus: a compute-node lock table refused a lock for want of room (bucket full,
    /// reader count at its limit).
    LockRefusedFull,
    /// Lotus: the lock's shard is moving between compute nodes (resharding, Lotus 4.3)
    /// past the client's retries.
    ShardMoving,
    /// Lotus: the compute node serving the lock's shard is down or restarted (Lotus 6:
    /// requests to a failed node's shards abort at once).
    CnDown,
    /// Lotus: a snapshot read met an INVISIBLE version that stayed so past the read wait,
    /// or a lock holder met a crashed writer's leftover ([`crate::lotus`]).
    Invisible,
}

impl AbortReason {
    /// Every reason, for reports.
    pub const ALL: [AbortReason; 23] = [
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
        Self::LockService,
        Self::TicketExpired,
        Self::Inconsistent,
        Self::User,
        Self::ReplicaFailed,
        Self::Migrating,
        Self::LockRefusedConflict,
        Self::LockRefusedFull,
        Self::ShardMoving,
        Self::CnDown,
        Self::Invisible,
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
            Self::LockService => "lock-service",
            Self::TicketExpired => "ticket-expired",
            Self::Inconsistent => "inconsistent-read",
            Self::User => "user",
            Self::ReplicaFailed => "replica-failed",
            Self::Migrating => "migrating",
            Self::LockRefusedConflict => "lock-refused-conflict",
            Self::LockRefusedFull => "lock-refused-full",
            Self::ShardMoving => "shard-moving",
            Self::CnDown => "cn-down",
            Self::Invisible => "invisible",
        }
    }
}

/// Errors of transactions. Every variant but [`TxnError::Abort`] keeps its cause.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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
    /// Every copy of a partition is gone (its memory nodes died; with one replica, its
    /// only memory node): its data cannot be reached.
    #[error("partition {partition} is lost: every memory node holding a copy of it died")]
    PartitionLost {
        /// The partition.
        partition: u32,
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
    /// A compute-node lock table failed (Lotus): a malformed reply, or no node owns a
    /// shard.
    #[error("lock table: {0}")]
    LockTable(#[from] lockd::table_service::TableError),
    /// The timestamp oracle failed this transaction's request.
    #[error("timestamp oracle: {0}")]
    Tso(#[from] TsoError),
    /// The transaction waited in its thread's TSO group for a leader whose request
    /// failed (the leader's error is the source) or was cancelled.
    #[error("timestamp oracle: {0}")]
    TsoGroup(#[source] tso::ThreadTsoError<TsoError>),
    /// The memory nodes' exports are missing or inconsistent, or a read was malformed.
    #[error("memory node export: {0}")]
    Export(String),
    /// A range-index operation failed ([`crate::range_index`]): a memory error (its rTX
    /// is left to repair) or an operation that gave up after too many aborts.
    #[error("range index: {0}")]
    Index(String),
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
