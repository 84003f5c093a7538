//! Tables of one-word baseline locks in registered memory: the CAS spinlock
//! ([`crate::cas`]) and DSLR ([`crate::dslr`]). Unlike the Takeout table
//! ([`crate::service::LockTable`]) these need no RPC and no server CPU: clients only READ,
//! WRITE, CAS and FAA the words one-sidedly. A node serves them by publishing
//! [`WordTable::export`] under [`CAS_EXPORT`] or [`DSLR_EXPORT`]; the `lockd` binary does so
//! with `--cas-locks N` and `--dslr-locks N`, each its own MR next to the Takeout table.
//!
//! Lock `i` is the 8-byte word at offset `8 i` of the table's MR; the table is zeroed at
//! allocation (free for CAS, all counters 0 for DSLR) and the service's CPU never writes it.

use rrpc::fabric::{Fabric, MemoryRegion, MrDesc};
use serde::{Deserialize, Serialize};

use crate::service::LockTableError;

/// Export name of a CAS-lock table.
pub const CAS_EXPORT: &str = "cas-locks";
/// Export name of a DSLR lock table.
pub const DSLR_EXPORT: &str = "dslr-locks";
/// Bytes per lock: one 8-byte word.
pub const WORD_STRIDE: u64 = 8;

const _: () = {
    assert!(WORD_STRIDE == crate::cas::CAS_STRIDE);
    assert!(WORD_STRIDE == crate::dslr::DSLR_STRIDE);
};

/// What a word table exports to its clients (JSON on the control plane).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WordsExport {
    /// The table MR.
    pub table: MrDesc,
    /// Number of locks.
    pub n_locks: u64,
    /// Bytes per lock ([`WORD_STRIDE`]).
    pub stride: u64,
}

impl WordsExport {
    /// Check that `n_locks` words of `stride` bytes fit the MR.
    pub fn validate(&self) -> Result<(), String> {
        if self.stride != WORD_STRIDE {
            return Err(format!(
                "stride {} bytes, this client speaks {WORD_STRIDE}",
                self.stride
            ));
        }
        if self.n_locks == 0
            || self
                .n_locks
                .checked_mul(WORD_STRIDE)
                .is_none_or(|b| b > self.table.len)
        {
            return Err(format!(
                "{} locks do not fit a table of {} bytes",
                self.n_locks, self.table.len
            ));
        }
        Ok(())
    }
}

/// A zeroed table of 8-byte lock words in registered memory.
pub struct WordTable {
    mr: MemoryRegion,
    n_locks: u64,
}

impl WordTable {
    /// Allocate `n_locks` (at least 1) zeroed words on `fabric` (`8 n_locks` bytes).
    ///
    /// Errors: [`LockTableError::Config`] for zero locks or a size overflow,
    /// [`LockTableError::Fabric`] when allocation fails.
    pub fn new(fabric: &Fabric, n_locks: u64) -> Result<Self, LockTableError> {
        if n_locks == 0 {
            return Err(LockTableError::Config("at least one lock is needed".into()));
        }
        let bytes = n_locks
            .checked_mul(WORD_STRIDE)
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(|| {
                LockTableError::Config(format!("{n_locks} locks overflow the address space"))
            })?;
        Ok(Self {
            mr: fabric.alloc_mr(bytes)?,
            n_locks,
        })
    }

    /// Number of locks.
    pub fn n_locks(&self) -> u64 {
        self.n_locks
    }

    /// The export as a typed value.
    pub fn words_export(&self) -> WordsExport {
        WordsExport {
            table: self.mr.desc(),
            n_locks: self.n_locks,
            stride: WORD_STRIDE,
        }
    }

    /// The export as JSON, to publish under [`CAS_EXPORT`] or [`DSLR_EXPORT`].
    pub fn export(&self) -> serde_json::Value {
        serde_json::to_value(self.words_export()).expect("WordsExport serializes")
    }

    /// Lock `id`'s word, loaded by this CPU (tests and monitoring; never written here).
    /// Panics if `id >= n_locks`.
    pub fn word(&self, id: u64) -> u64 {
        assert!(id < self.n_locks, "lock id {id} out of range");
        self.mr
            .atomic_u64((id * WORD_STRIDE) as usize)
            .load(std::sync::atomic::Ordering::Acquire)
    }
}
