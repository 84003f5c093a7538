//! Errors and abort reasons of rTX operations.

use crate::alloc::AllocError;
use crate::mem::MemError;

/// Why an rTX aborted; the caller may run it again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AbortReason {
    /// An object it needs is locked by another rTX whose lease is still valid.
    #[error("object locked by another rTX")]
    Locked,
    /// An object it needs was locked by an rTX whose lease had expired; this rTX repaired
    /// that one (4.3, the repair phase) and aborts so as to read fresh values.
    #[error("repaired an expired rTX")]
    Repaired,
    /// A lock CAS found the object changed since it was read.
    #[error("lock acquisition failed")]
    LockFailed,
    /// Validation found an object changed or locked since it was read.
    #[error("validation failed")]
    Validation,
    /// A repairer aborted this rTX while it was in INIT (its INIT to DOING CAS failed), or
    /// replaced the object of its log-less single write (Opt1).
    #[error("aborted by a repairer")]
    AbortedByRepairer,
    /// Another client is repairing the rTX in the way (DOING with a valid repair lease).
    #[error("a repair is in progress")]
    RepairBusy,
    /// A read took so long (half the blocks' reuse wait, [`crate::alloc::MIN_REUSE_MS`])
    /// that the block its TXObj pointed to may have been replaced and reused before it
    /// was read: the value is discarded (a client stalled between its two READs, e.g.
    /// stopped past its leases).
    #[error("read outlasted the block reuse wait")]
    StaleRead,
}

/// Errors of rTX operations.
#[derive(Debug, thiserror::Error)]
pub enum RtxError {
    /// The rTX aborted (nothing of it is visible); run it again.
    #[error("rTX aborted: {0}")]
    Aborted(#[from] AbortReason),
    /// A one-sided operation failed. The rTX's effect is unknown: its log and leases let
    /// another client (or this one, later) finish or abort it.
    #[error(transparent)]
    Mem(#[from] MemError),
    /// Allocating a data block failed.
    #[error(transparent)]
    Alloc(#[from] AllocError),
    /// More writes than a log slot holds.
    #[error("write set of {n} objects exceeds the log's {max} entries")]
    TooManyWrites {
        /// Objects written.
        n: usize,
        /// Log capacity in entries.
        max: usize,
    },
    /// A value whose size is not the layout's block size.
    #[error("value of {len} bytes, blocks hold {block}")]
    ValueSize {
        /// Value length in bytes.
        len: usize,
        /// Block size in bytes.
        block: u64,
    },
    /// An object without data (null dptr): not formatted.
    #[error("object at offset {mptr} has no data")]
    NullDptr {
        /// TXObj offset.
        mptr: u64,
    },
}
