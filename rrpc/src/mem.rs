//! Byte-addressed memory a remote writer shares: the interface the Rocket ring (and the
//! channel above it) reads and writes through, implemented by registered memory regions
//! ([`crate::fabric::MemoryRegion`]) and, for tests, by [`HeapRing`]. It sits below both
//! the fabric and the ring protocol so that neither imports the other.

use std::sync::atomic::{AtomicU64, Ordering};

/// Byte-addressed memory shared with a remote writer (a peer process or a
/// NIC). Offsets are in bytes from the start.
/// Scythe section 4.6, Fig. 21.
pub trait RingMem {
    /// Length of the memory in bytes.
    fn len(&self) -> usize;
    /// True when the memory holds zero bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// 8-byte load with Acquire ordering; `off` (bytes) is 8-byte aligned.
    fn load_u64(&self, off: usize) -> u64;
    /// 8-byte store with Release ordering; `off` (bytes) is 8-byte aligned.
    fn store_u64(&self, off: usize, v: u64);
    /// Copy `dst.len()` bytes starting at byte `off` out of the memory.
    fn read(&self, off: usize, dst: &mut [u8]);
    /// Copy `src` into the memory starting at byte `off`.
    fn write(&self, off: usize, src: &[u8]);
    /// Zero `len` bytes starting at byte `off` (8-aligned start and length).
    fn zero(&self, off: usize, len: usize);
}

/// Heap-allocated [`RingMem`] made of `AtomicU64` words; the reference
/// implementation used by tests. Byte `8 * w + i` is byte `i` of the
/// little-endian representation of word `w`. All accesses panic when out of
/// bounds. Scythe section 4.6, Fig. 21.
#[derive(Debug)]
pub struct HeapRing {
    words: Box<[AtomicU64]>,
}

impl HeapRing {
    /// Zero-filled memory of `len_bytes` bytes rounded up to a multiple of 8.
    /// Scythe section 4.6, Fig. 21.
    pub fn new(len_bytes: usize) -> Self {
        let words = (0..len_bytes.div_ceil(8))
            .map(|_| AtomicU64::new(0))
            .collect();
        Self { words }
    }

    fn check(&self, off: usize, len: usize) {
        let end = off.checked_add(len).expect("HeapRing: range overflows");
        assert!(
            end <= self.words.len() * 8,
            "HeapRing: range {off}..{end} out of bounds ({} bytes)",
            self.words.len() * 8
        );
    }
}

impl RingMem for HeapRing {
    fn len(&self) -> usize {
        self.words.len() * 8
    }

    fn load_u64(&self, off: usize) -> u64 {
        assert!(off & 7 == 0, "HeapRing: unaligned load at {off}");
        self.words[off / 8].load(Ordering::Acquire)
    }

    fn store_u64(&self, off: usize, v: u64) {
        assert!(off & 7 == 0, "HeapRing: unaligned store at {off}");
        self.words[off / 8].store(v, Ordering::Release);
    }

    fn read(&self, off: usize, dst: &mut [u8]) {
        self.check(off, dst.len());
        let mut i = 0;
        while i < dst.len() {
            let pos = off + i;
            let b = pos % 8;
            let n = (8 - b).min(dst.len() - i);
            let bytes = self.words[pos / 8].load(Ordering::Acquire).to_le_bytes();
            dst[i..i + n].copy_from_slice(&bytes[b..b + n]);
            i += n;
        }
    }

    fn write(&self, off: usize, src: &[u8]) {
        self.check(off, src.len());
        let mut i = 0;
        while i < src.len() {
            let pos = off + i;
            let b = pos % 8;
            let n = (8 - b).min(src.len() - i);
            let word = &self.words[pos / 8];
            if n == 8 {
                let mut bytes = [0u8; 8];
                bytes.copy_from_slice(&src[i..i + 8]);
                word.store(u64::from_le_bytes(bytes), Ordering::Release);
            } else {
                // Partial word: merge atomically so bytes outside the range
                // (possibly written concurrently by someone else) survive.
                let part = &src[i..i + n];
                let _ = word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |old| {
                    let mut bytes = old.to_le_bytes();
                    bytes[b..b + n].copy_from_slice(part);
                    Some(u64::from_le_bytes(bytes))
                });
            }
            i += n;
        }
    }

    fn zero(&self, off: usize, len: usize) {
        assert!(
            off & 7 == 0 && len & 7 == 0,
            "HeapRing: unaligned zero {off}+{len}"
        );
        self.check(off, len);
        for w in &self.words[off / 8..(off + len) / 8] {
            w.store(0, Ordering::Release);
        }
    }
}
