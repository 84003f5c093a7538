//! A node's partition as its own CPU sees it: the RPC handlers' side of the tuples
//! ([`crate::server`]). One-sided operations reach the same bytes through the NIC.
//!
//! A run uses one variant: in the RPC variant only handlers touch lock words (CPU
//! atomics), in the one-sided variant only the coordinators' RDMA atomics do, so CPU and
//! NIC atomics never mix on one word (which RDMA does not make atomic with each other).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rrpc::fabric::MemoryRegion;

/// Word and byte access to a node's region; offsets in bytes, words 8-byte aligned.
/// Panics on an access outside the region (a layout bug, never input).
pub trait Store: Send + Sync {
    /// Acquire load of the word at `off`.
    fn load(&self, off: u64) -> u64;
    /// Release store of `v` at `off`.
    fn store(&self, off: u64, v: u64);
    /// Compare-and-swap at `off`; returns the old word (success iff it equals `expected`).
    fn cas(&self, off: u64, expected: u64, new: u64) -> u64;
    /// Copy `dst.len()` bytes at `off` out.
    fn read(&self, off: u64, dst: &mut [u8]);
    /// Copy `src` in at `off`.
    fn write(&self, off: u64, src: &[u8]);
}

/// A region in the heap, as words (tests and the in-memory network).
#[derive(Debug)]
pub struct HeapStore(Box<[AtomicU64]>);

impl HeapStore {
    /// `bytes` zeroed bytes (rounded up to words).
    pub fn new(bytes: u64) -> Self {
        Self((0..bytes.div_ceil(8)).map(|_| AtomicU64::new(0)).collect())
    }

    fn word(&self, off: u64) -> &AtomicU64 {
        assert!(off.is_multiple_of(8), "unaligned word at {off}");
        &self.0[(off / 8) as usize]
    }
}

impl Store for HeapStore {
    fn load(&self, off: u64) -> u64 {
        self.word(off).load(Ordering::Acquire)
    }
    fn store(&self, off: u64, v: u64) {
        self.word(off).store(v, Ordering::Release)
    }
    fn cas(&self, off: u64, expected: u64, new: u64) -> u64 {
        match self
            .word(off)
            .compare_exchange(expected, new, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(v) | Err(v) => v,
        }
    }
    fn read(&self, off: u64, dst: &mut [u8]) {
        assert!(off.is_multiple_of(8) && dst.len().is_multiple_of(8));
        for (i, c) in dst.chunks_exact_mut(8).enumerate() {
            c.copy_from_slice(&self.load(off + 8 * i as u64).to_le_bytes());
        }
    }
    fn write(&self, off: u64, src: &[u8]) {
        assert!(off.is_multiple_of(8) && src.len().is_multiple_of(8));
        for (i, c) in src.chunks_exact(8).enumerate() {
            self.store(
                off + 8 * i as u64,
                u64::from_le_bytes(c.try_into().expect("8 bytes")),
            );
        }
    }
}

/// A registered memory region of the node (the real runs).
#[derive(Clone)]
pub struct MrStore(pub Arc<MemoryRegion>);

impl std::fmt::Debug for MrStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MrStore")
            .field("desc", &self.0.desc())
            .finish()
    }
}

impl Store for MrStore {
    fn load(&self, off: u64) -> u64 {
        self.0.load_u64(off as usize)
    }
    fn store(&self, off: u64, v: u64) {
        self.0.store_u64(off as usize, v)
    }
    fn cas(&self, off: u64, expected: u64, new: u64) -> u64 {
        match self.0.atomic_u64(off as usize).compare_exchange(
            expected,
            new,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(v) | Err(v) => v,
        }
    }
    fn read(&self, off: u64, dst: &mut [u8]) {
        self.0.read(off as usize, dst)
    }
    fn write(&self, off: u64, src: &[u8]) {
        self.0.write(off as usize, src)
    }
}
