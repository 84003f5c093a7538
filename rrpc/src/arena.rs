//! A registered-memory allocator: one MR carved into power-of-two chunks, used for the
//! local side of one-sided operations, zero-copy reply buffers (client) and RPC+READ reply
//! buffers (server).
//!
//! Size classes run from 64 B to `max_chunk` bytes. A class's free list is refilled from
//! an untouched tail of the MR (bump allocation); freed chunks go back to their class and
//! are never merged, which suits the steady mixes of a benchmark or a service (a chunk is
//! reused for the same size class). The allocator is not thread-safe: one per thread.

use crate::fabric::{Fabric, FabricError, MemoryRegion};

/// Smallest chunk, bytes.
pub const MIN_CHUNK: usize = 64;

/// A chunk of the arena: byte offset into the MR and size class (chunk bytes =
/// `MIN_CHUNK << class`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Byte offset of the chunk in the arena's MR.
    pub off: usize,
    /// Size class: the chunk holds `MIN_CHUNK << class` bytes.
    pub class: u8,
}

impl Chunk {
    /// Chunk size in bytes.
    pub fn bytes(&self) -> usize {
        MIN_CHUNK << self.class
    }
}

/// Power-of-two chunk allocator over one registered MR.
pub struct Arena {
    mr: MemoryRegion,
    free: Vec<Vec<usize>>,
    bump: usize,
    max_chunk: usize,
    in_use: usize,
}

impl Arena {
    /// An arena of `bytes` bytes registered on `fabric`, handing out chunks of up to
    /// `max_chunk` bytes (rounded up to a power of two, at most `bytes`).
    /// Errors: the MR cannot be allocated; `max_chunk` larger than `bytes`.
    pub fn new(fabric: &Fabric, bytes: usize, max_chunk: usize) -> Result<Self, FabricError> {
        let max_chunk = max_chunk.max(MIN_CHUNK).next_power_of_two();
        if max_chunk > bytes {
            return Err(FabricError::InvalidArgument {
                op: "arena",
                what: format!("largest chunk {max_chunk} B exceeds the arena's {bytes} B"),
            });
        }
        let classes = (max_chunk / MIN_CHUNK).trailing_zeros() as usize + 1;
        Ok(Self {
            mr: fabric.alloc_mr(bytes)?,
            free: vec![Vec::new(); classes],
            bump: 0,
            max_chunk,
            in_use: 0,
        })
    }

    /// The registered memory.
    pub fn mr(&self) -> &MemoryRegion {
        &self.mr
    }

    /// Largest chunk in bytes.
    pub fn max_chunk(&self) -> usize {
        self.max_chunk
    }

    /// Chunks handed out and not yet freed.
    pub fn in_use(&self) -> usize {
        self.in_use
    }

    /// A chunk of at least `len` bytes, or `None` when `len > max_chunk()` or the arena
    /// has no free chunk of that class left.
    pub fn alloc(&mut self, len: usize) -> Option<Chunk> {
        if len > self.max_chunk {
            return None;
        }
        let size = len.max(MIN_CHUNK).next_power_of_two();
        let class = (size / MIN_CHUNK).trailing_zeros() as u8;
        let off = match self.free[class as usize].pop() {
            Some(off) => off,
            None => {
                // Chunks are aligned to their size, so the tail is aligned first.
                let start = self.bump.next_multiple_of(size);
                if start + size > self.mr.len() {
                    return None;
                }
                self.bump = start + size;
                start
            }
        };
        self.in_use += 1;
        Some(Chunk { off, class })
    }

    /// Return a chunk obtained from [`Arena::alloc`].
    pub fn free(&mut self, c: Chunk) {
        debug_assert!(self.in_use > 0, "arena: free without alloc");
        self.in_use -= 1;
        self.free[c.class as usize].push(c.off);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::{FabricConfig, FabricKind};
    use crate::NodeId;

    #[test]
    fn classes_reuse_and_limits() {
        let cluster = format!("arena-test-{}", std::process::id());
        let _g = crate::fabric::shm::ClusterGuard::new(&cluster).unwrap();
        let f = Fabric::open(&FabricConfig::new(FabricKind::Shm, &cluster, NodeId(0))).unwrap();
        let mut a = Arena::new(&f, 1 << 20, 256 << 10).unwrap();
        assert_eq!(a.max_chunk(), 256 << 10);
        let c1 = a.alloc(1).unwrap();
        assert_eq!(c1.bytes(), 64);
        let c2 = a.alloc(65).unwrap();
        assert_eq!(c2.bytes(), 128);
        assert_eq!(c2.off % 128, 0);
        assert!(a.alloc((256 << 10) + 1).is_none(), "over the largest class");
        a.free(c1);
        assert_eq!(a.alloc(10).unwrap(), c1, "freed chunk reused");
        // Exhaustion is None, not a panic.
        let mut n = 0;
        while a.alloc(256 << 10).is_some() {
            n += 1;
        }
        assert!((2..=4).contains(&n), "{n} big chunks");
        assert!(Arena::new(&f, 4096, 8192).is_err());
    }
}
