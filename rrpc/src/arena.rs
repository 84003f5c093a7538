//! A registered-memory allocator: one MR carved into power-of-two chunks, used for the
//! local side of one-sided operations, zero-copy reply buffers (client) and RPC+READ reply
//! buffers (server).
//!
//! Size classes run from 64 B to `max_chunk` bytes. A class's free list is refilled from
//! an untouched tail of the MR (bump allocation); freed chunks go back to their class and
//! are never merged, which suits the steady mixes of a benchmark or a service (a chunk is
//! reused for the same size class).
//!
//! A [`Chunk`] is an owned value: it is neither `Copy` nor `Clone`, and dropping it gives
//! it back to its arena. Whoever may still touch the chunk's bytes owns it: the slot of a
//! one-sided op until its WR completes, a call (and, once abandoned, the call table's
//! zombie list) until the server says it is done with a zero-copy target, a posted
//! list's record until its completion. No chunk crosses the fabric boundary without its
//! owner outliving the NIC's use of it, so there is no `into_raw`-style escape hatch.
//! Where a late access could read a reused buffer, the bytes carry a generation of their
//! own (the call id trailing a zero-copy reply; the handle around a READ-mode reply),
//! checked by the reader.
//!
//! The allocator is not thread-safe: one per thread. [`UnusedArena`] (the registered
//! memory before any chunk is handed out) can move between threads, so a server
//! registers its threads' arenas up front and each thread starts its own.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::rc::Rc;

use crate::fabric::{Fabric, FabricError, MemoryRegion, RemoteAccess};

/// Smallest chunk, bytes.
pub const MIN_CHUNK: usize = 64;

/// The free lists of one arena, shared by the arena and every chunk it handed out (a
/// chunk gives itself back here when dropped, also after its arena is gone).
struct FreeLists {
    /// Free chunk offsets per size class.
    free: RefCell<Vec<Vec<usize>>>,
    /// Start of the untouched tail, bytes.
    bump: Cell<usize>,
    /// Bytes the allocator carves.
    bytes: usize,
    /// Largest chunk, bytes (a power of two).
    max_chunk: usize,
    /// Chunks handed out and not yet dropped.
    in_use: Cell<usize>,
}

impl FreeLists {
    fn give_back(&self, off: usize, class: u8) {
        debug_assert!(self.in_use.get() > 0, "arena: chunk given back twice");
        self.in_use.set(self.in_use.get() - 1);
        self.free.borrow_mut()[class as usize].push(off);
    }
}

/// A chunk of an arena: `bytes()` bytes at byte offset `off()` of the arena's MR, aligned
/// to its size. Owned: dropping it returns it to its arena (see the module docs).
pub struct Chunk {
    lists: Rc<FreeLists>,
    off: usize,
    class: u8,
}

impl Chunk {
    /// Byte offset of the chunk in the arena's MR.
    pub fn off(&self) -> usize {
        self.off
    }

    /// Chunk size in bytes (`MIN_CHUNK << class`).
    pub fn bytes(&self) -> usize {
        MIN_CHUNK << self.class
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        self.lists.give_back(self.off, self.class);
    }
}

impl fmt::Debug for Chunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chunk")
            .field("off", &self.off)
            .field("bytes", &self.bytes())
            .finish()
    }
}

/// The allocator without its memory: hands out [`Chunk`]s of offsets in `0..bytes`.
/// Plain state, no fabric: [`Arena`] pairs it with an MR; tests (also under Miri) use it
/// alone.
pub(crate) struct ChunkPool {
    lists: Rc<FreeLists>,
}

impl ChunkPool {
    /// A pool over `bytes` bytes with chunks of up to `max_chunk` bytes (a power of two,
    /// at least [`MIN_CHUNK`], at most `bytes`: see [`chunk_limit`]).
    pub(crate) fn new(bytes: usize, max_chunk: usize) -> Self {
        debug_assert!(max_chunk.is_power_of_two() && (MIN_CHUNK..=bytes).contains(&max_chunk));
        let classes = (max_chunk / MIN_CHUNK).trailing_zeros() as usize + 1;
        Self {
            lists: Rc::new(FreeLists {
                free: RefCell::new(vec![Vec::new(); classes]),
                bump: Cell::new(0),
                bytes,
                max_chunk,
                in_use: Cell::new(0),
            }),
        }
    }

    /// A chunk of at least `len` bytes, or `None` when `len > max_chunk` or no chunk of
    /// that class is left.
    pub(crate) fn alloc(&self, len: usize) -> Option<Chunk> {
        let l = &*self.lists;
        if len > l.max_chunk {
            return None;
        }
        let size = len.max(MIN_CHUNK).next_power_of_two();
        let class = (size / MIN_CHUNK).trailing_zeros() as u8;
        let reused = l.free.borrow_mut()[class as usize].pop();
        let off = match reused {
            Some(off) => off,
            None => {
                // Chunks are aligned to their size, so the tail is aligned first.
                let start = l.bump.get().next_multiple_of(size);
                if start.checked_add(size)? > l.bytes {
                    return None;
                }
                l.bump.set(start + size);
                start
            }
        };
        l.in_use.set(l.in_use.get() + 1);
        Some(Chunk {
            lists: self.lists.clone(),
            off,
            class,
        })
    }

    /// Largest chunk in bytes.
    pub(crate) fn max_chunk(&self) -> usize {
        self.lists.max_chunk
    }

    /// Chunks handed out and not yet dropped.
    pub(crate) fn in_use(&self) -> usize {
        self.lists.in_use.get()
    }
}

/// The largest chunk of an arena of `bytes` bytes asked for `max_chunk`: `max_chunk`
/// rounded up to a power of two (at least [`MIN_CHUNK`]). Errors: that exceeds `bytes`.
pub(crate) fn chunk_limit(bytes: usize, max_chunk: usize) -> Result<usize, FabricError> {
    let max_chunk = max_chunk.max(MIN_CHUNK).next_power_of_two();
    if max_chunk > bytes {
        return Err(FabricError::InvalidArgument {
            op: "arena",
            what: format!("largest chunk {max_chunk} B exceeds the arena's {bytes} B"),
        });
    }
    Ok(max_chunk)
}

/// An arena's registered memory, checked, before any chunk is handed out. `Send`:
/// register on one thread, [`UnusedArena::start`] on the thread that allocates.
pub struct UnusedArena {
    mr: MemoryRegion,
    max_chunk: usize,
}

impl UnusedArena {
    /// Register `bytes` bytes on `fabric` for chunks of up to `max_chunk` bytes (rounded
    /// up to a power of two, at most `bytes`). Errors: the MR cannot be allocated;
    /// `max_chunk` larger than `bytes`.
    pub fn new(fabric: &Fabric, bytes: usize, max_chunk: usize) -> Result<Self, FabricError> {
        Self::new_with(fabric, bytes, max_chunk, RemoteAccess::ALL)
    }

    /// As [`UnusedArena::new`], peers getting only `access` to the region (see
    /// [`RemoteAccess`]).
    pub fn new_with(
        fabric: &Fabric,
        bytes: usize,
        max_chunk: usize,
        access: RemoteAccess,
    ) -> Result<Self, FabricError> {
        let max_chunk = chunk_limit(bytes, max_chunk)?;
        Ok(Self {
            mr: fabric.alloc_mr_with(bytes, access)?,
            max_chunk,
        })
    }

    /// The arena, allocating on the calling thread.
    pub fn start(self) -> Arena {
        Arena {
            pool: ChunkPool::new(self.mr.len(), self.max_chunk),
            mr: Rc::new(self.mr),
        }
    }
}

/// Power-of-two chunk allocator over one registered MR.
pub struct Arena {
    /// Shared with the user buffers handed out of it (`runtime::RegBuf`).
    mr: Rc<MemoryRegion>,
    pool: ChunkPool,
}

impl Arena {
    /// An arena of `bytes` bytes registered on `fabric`, handing out chunks of up to
    /// `max_chunk` bytes (rounded up to a power of two, at most `bytes`).
    /// Errors: the MR cannot be allocated; `max_chunk` larger than `bytes`.
    pub fn new(fabric: &Fabric, bytes: usize, max_chunk: usize) -> Result<Self, FabricError> {
        Ok(UnusedArena::new(fabric, bytes, max_chunk)?.start())
    }

    /// As [`Arena::new`], peers getting only `access` to the region (see
    /// [`RemoteAccess`]).
    pub fn new_with(
        fabric: &Fabric,
        bytes: usize,
        max_chunk: usize,
        access: RemoteAccess,
    ) -> Result<Self, FabricError> {
        Ok(UnusedArena::new_with(fabric, bytes, max_chunk, access)?.start())
    }

    /// The registered memory.
    pub fn mr(&self) -> &MemoryRegion {
        &self.mr
    }

    /// The registered memory, shared (for a buffer that reads and writes its chunk).
    pub(crate) fn mr_shared(&self) -> Rc<MemoryRegion> {
        self.mr.clone()
    }

    /// Whether `c` was handed out by this arena.
    pub(crate) fn owns(&self, c: &Chunk) -> bool {
        Rc::ptr_eq(&self.pool.lists, &c.lists)
    }

    /// Largest chunk in bytes.
    pub fn max_chunk(&self) -> usize {
        self.pool.max_chunk()
    }

    /// Chunks handed out and not yet dropped.
    pub fn in_use(&self) -> usize {
        self.pool.in_use()
    }

    /// A chunk of at least `len` bytes, or `None` when `len > max_chunk()` or the arena
    /// has no free chunk of that class left. Dropping the chunk returns it.
    pub fn alloc(&self, len: usize) -> Option<Chunk> {
        self.pool.alloc(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::{FabricConfig, FabricKind};
    use crate::NodeId;

    #[test]
    fn classes_reuse_and_limits() {
        let p = ChunkPool::new(1 << 20, 256 << 10);
        assert_eq!(p.max_chunk(), 256 << 10);
        let c1 = p.alloc(1).unwrap();
        assert_eq!(c1.bytes(), 64);
        let c2 = p.alloc(65).unwrap();
        assert_eq!(c2.bytes(), 128);
        assert_eq!(c2.off() % 128, 0);
        assert!(p.alloc((256 << 10) + 1).is_none(), "over the largest class");
        assert_eq!(p.in_use(), 2);
        let off1 = c1.off();
        drop(c1);
        assert_eq!(p.in_use(), 1);
        assert_eq!(
            p.alloc(10).unwrap().off(),
            off1,
            "a dropped chunk is reused"
        );
        // Exhaustion is None, not a panic.
        let mut big = Vec::new();
        while let Some(c) = p.alloc(256 << 10) {
            big.push(c);
        }
        assert!((2..=4).contains(&big.len()), "{} big chunks", big.len());
        let n = big.len();
        big.clear();
        assert_eq!(p.in_use(), 1, "the big chunks went back");
        let again: Vec<Chunk> = (0..n).map_while(|_| p.alloc(256 << 10)).collect();
        assert_eq!(again.len(), n, "and are handed out again");
    }

    #[test]
    fn a_chunk_outliving_its_pool_still_goes_back_quietly() {
        let p = ChunkPool::new(4096, 1024);
        let c = p.alloc(100).unwrap();
        drop(p);
        assert_eq!(c.bytes(), 128);
        drop(c);
    }

    #[test]
    fn chunk_limits() {
        assert_eq!(chunk_limit(4096, 1).unwrap(), MIN_CHUNK);
        assert_eq!(chunk_limit(4096, 3000).unwrap(), 4096);
        assert!(chunk_limit(4096, 4097).is_err());
    }

    #[test]
    #[cfg_attr(miri, ignore = "opens shared-memory files")]
    fn arena_on_a_fabric() {
        let cluster = format!("arena-test-{}", std::process::id());
        let _g = crate::fabric::shm::ClusterGuard::new(&cluster).unwrap();
        let f = Fabric::open(&FabricConfig::new(FabricKind::Shm, &cluster, NodeId(0))).unwrap();
        let a = Arena::new(&f, 1 << 20, 256 << 10).unwrap();
        assert_eq!(a.max_chunk(), 256 << 10);
        let c = a.alloc(8).unwrap();
        a.mr().write(c.off(), b"12345678");
        assert_eq!(a.in_use(), 1);
        drop(c);
        assert_eq!(a.in_use(), 0);
        assert!(Arena::new(&f, 4096, 8192).is_err());
        // Registered on one thread, started on another.
        let u = UnusedArena::new(&f, 1 << 16, 1 << 12).unwrap();
        std::thread::spawn(move || assert!(u.start().alloc(1 << 12).is_some()))
            .join()
            .unwrap();
    }
}
