//! The data-pool allocator of one rTX ID (Transactional Indexes on Disaggregated Memory
//! with Repairable Transaction, 4.4, "Memory allocation, reclamation and leakage
//! prevention").
//!
//! - **Bitmap on the MN, updated in batches**: a client claims a whole free bitmap word
//!   (64 blocks) with one CAS `0 -> !0` and records itself, with its incarnation, in the
//!   chunk-owner word; blocks are then handed out locally without any MN access.
//! - **Reuse only after DONE**: a buffer replaced by a committed update (the old dptr) is
//!   retired and handed out again only after its rTX is DONE and a minimum time has
//!   passed, which bounds how soon a dptr's 16-bit version can wrap under a slow repairer
//!   (4.4, "Data pointer reuse").
//! - **Reclamation table**: the retiring rTX may replace a block from another client's
//!   chunk. Such foreign blocks are listed in this ID's reclamation table on the MN from
//!   *before* the CAS that stops referencing them until a dptr references them again,
//!   so that the chunk owner's recovery scan never takes a block this ID holds.
//! - **Incarnations**: after a restart, [`Allocator::recover`] takes back the blocks of
//!   its own chunks that nothing references (no TXObj dptr, no log not in DONE, no
//!   reclamation table) and the foreign blocks its previous incarnation listed, and
//!   stamps the chunks with the new incarnation; new dptrs carry it (see [`crate::dptr`]).
//!   The ID's own log must be repaired to DONE first (its blocks are then referenced or
//!   free), which [`crate::client::Client::recover`] does.

use std::collections::{BTreeSet, VecDeque};

use crate::dptr::Dptr;
use crate::layout::{decode_owner, owner_word, Layout, CHUNK_BLOCKS, DPTR_OFF, TXOBJ_BYTES};
use crate::log::{LogImage, LogState};
use crate::mem::{Mem, MemError};

/// Allocator failures.
#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    /// No free bitmap word left on the MN.
    #[error("data pool exhausted")]
    Exhausted,
    /// A one-sided operation failed.
    #[error(transparent)]
    Mem(#[from] MemError),
}

/// Default minimum time before a retired block is reused, in ms (inferred: the paper bounds it
/// by the dptr version wrap-around time, not a number; 100 ms is far below 65,536 updates
/// of one object at 100 us each).
pub const MIN_REUSE_MS: u64 = 100;

/// The allocator of one rTX ID (one client coroutine); owned by that client only.
#[derive(Debug)]
pub struct Allocator {
    layout: Layout,
    id: u16,
    incarnation: u8,
    free: Vec<u64>,
    retired: VecDeque<(u64, u64)>,
    foreign: BTreeSet<u64>,
    foreign_dirty: bool,
    cursor: u64,
    /// Minimum time in ms between retiring a block and reusing it.
    pub min_reuse_ms: u64,
}

impl Allocator {
    /// An empty allocator for `id` at `incarnation` (1..=255).
    pub fn new(layout: Layout, id: u16, incarnation: u8) -> Self {
        assert!(incarnation != 0, "incarnation 0 is reserved");
        let chunks = layout.chunks().max(1);
        Self {
            layout,
            id,
            incarnation,
            free: Vec::new(),
            retired: VecDeque::new(),
            foreign: BTreeSet::new(),
            foreign_dirty: false,
            // Start where other IDs are unlikely to look.
            cursor: (id as u64 * 7919) % chunks,
            min_reuse_ms: MIN_REUSE_MS,
        }
    }

    /// This allocator's incarnation (stamped into the dptrs it hands out).
    pub fn incarnation(&self) -> u8 {
        self.incarnation
    }

    /// Blocks available now (free, not counting retired ones still waiting).
    pub fn free_len(&self) -> usize {
        self.free.len()
    }

    /// Blocks retired and waiting for reuse.
    pub fn retired_len(&self) -> usize {
        self.retired.len()
    }

    /// Take a free block, first moving retired blocks whose wait has passed at `now_ms`.
    /// `None` when the local cache is empty (call [`Self::refill`]).
    pub fn take(&mut self, now_ms: u64) -> Option<u64> {
        while let Some(&(b, ready)) = self.retired.front() {
            if ready > now_ms {
                break;
            }
            self.retired.pop_front();
            self.free.push(b);
        }
        self.free.pop()
    }

    /// Return a block that was never installed (an aborted rTX's new buffer).
    pub fn give_back(&mut self, block: u64) {
        self.free.push(block);
    }

    /// Add blocks for tests and loaders that own them by construction.
    pub fn add_free(&mut self, blocks: impl IntoIterator<Item = u64>) {
        self.free.extend(blocks);
    }

    /// Claim one free bitmap word (64 blocks) with a CAS and record ownership. Errors:
    /// [`AllocError::Exhausted`] when every word is taken, [`AllocError::Mem`].
    pub async fn refill<M: Mem>(&mut self, mem: &M) -> Result<(), AllocError> {
        let chunks = self.layout.chunks();
        for _ in 0..chunks {
            let c = self.cursor;
            self.cursor = (self.cursor + 1) % chunks;
            let at = self.layout.bitmap_base() + c * 8;
            if mem.read_u64(at).await? != 0 {
                continue;
            }
            if mem.cas(at, 0, u64::MAX).await? != 0 {
                continue;
            }
            let owner = owner_word(self.id, self.incarnation);
            mem.write(self.layout.owners_base() + c * 8, &owner.to_le_bytes())
                .await?;
            let first = c * CHUNK_BLOCKS;
            self.free.extend((first..first + CHUNK_BLOCKS).rev());
            return Ok(());
        }
        Err(AllocError::Exhausted)
    }

    fn owns_chunk_of(&self, block: u64, owners: &[u64]) -> bool {
        decode_owner(owners[(block / CHUNK_BLOCKS) as usize]).is_some_and(|(id, _)| id == self.id)
    }

    /// Note that the rTX about to stop referencing `old` (its old dptrs) will hold them.
    /// Blocks of chunks owned by others go into the reclamation table, which must be
    /// written ([`Self::flush`]) before the install CAS. `owners` is the chunk-owner table
    /// as last read; a block of an unknown chunk counts as foreign (safe).
    pub fn hold(&mut self, old: &[u64], owners: Option<&[u64]>) {
        for &b in old {
            let own = owners.is_some_and(|o| self.owns_chunk_of(b, o));
            if !own && self.foreign.insert(b) {
                self.foreign_dirty = true;
            }
        }
    }

    /// Whether the reclamation table must be written before the next install.
    pub fn needs_flush(&self) -> bool {
        self.foreign_dirty
    }

    /// The reclamation table's bytes (count, then block words; blocks past the table's
    /// capacity are left out and so leak, which is safe).
    pub fn table_bytes(&self) -> Vec<u8> {
        let n = (self.foreign.len() as u64).min(self.layout.reclaim_slots);
        let mut out = n.to_le_bytes().to_vec();
        for b in self.foreign.iter().take(n as usize) {
            out.extend_from_slice(&b.to_le_bytes());
        }
        out
    }

    /// WRITE the reclamation table if it changed. Errors: [`AllocError::Mem`].
    pub async fn flush<M: Mem>(&mut self, mem: &M) -> Result<(), AllocError> {
        if self.foreign_dirty {
            mem.write(self.layout.reclaim_addr(self.id), &self.table_bytes())
                .await?;
            self.foreign_dirty = false;
        }
        Ok(())
    }

    /// The table bytes from [`Self::table_bytes`] were written by the caller.
    pub fn flushed(&mut self) {
        self.foreign_dirty = false;
    }

    /// A block now referenced by an installed dptr: no longer this ID's to list.
    pub fn installed(&mut self, block: u64) {
        if self.foreign.remove(&block) {
            self.foreign_dirty = true;
        }
    }

    /// The rTX that replaced `blocks` is DONE: reuse them after [`Self::min_reuse_ms`].
    pub fn retire(&mut self, blocks: &[u64], now_ms: u64) {
        for &b in blocks {
            self.retired.push_back((b, now_ms + self.min_reuse_ms));
        }
    }

    /// Rebuild after a restart as incarnation `self.incarnation`: take back unreferenced
    /// blocks of this ID's chunks and the foreign blocks its table lists, and re-stamp the
    /// chunks. Reads the whole meta pool, every log and every reclamation table (the
    /// paper's "fix scans all the entries"). Run only when this ID's log is DONE. Errors:
    /// [`AllocError::Mem`].
    pub async fn recover<M: Mem>(&mut self, mem: &M) -> Result<usize, AllocError> {
        let l = self.layout;
        let mut used = BTreeSet::new();
        let meta = mem
            .read(l.meta_base(), (l.objects * TXOBJ_BYTES) as usize)
            .await?;
        for i in 0..l.objects as usize {
            let o = i * TXOBJ_BYTES as usize + DPTR_OFF as usize;
            let w = u64::from_le_bytes(meta[o..o + 8].try_into().expect("8 bytes"));
            if let Some(d) = Dptr::decode(w) {
                used.insert(d.block);
            }
        }
        for id in 0..l.ids {
            let slot = mem.read(l.log_addr(id), l.slot_bytes() as usize).await?;
            // A torn or never-written slot holds nothing in flight worth trusting; a log
            // not in DONE keeps both its old and new buffers.
            if let Ok(img) = LogImage::decode(&slot) {
                if img.header.state != LogState::Done && img.checksum != 0 {
                    for e in &img.entries {
                        for w in [e.dptr, e.ndptr] {
                            if let Some(d) = Dptr::decode(w) {
                                used.insert(d.block);
                            }
                        }
                    }
                }
            }
        }
        let mut mine_listed = Vec::new();
        for id in 0..l.ids {
            let t = mem
                .read(l.reclaim_addr(id), l.reclaim_bytes() as usize)
                .await?;
            let n = u64::from_le_bytes(t[..8].try_into().expect("8 bytes")).min(l.reclaim_slots);
            for k in 0..n as usize {
                let b = u64::from_le_bytes(t[8 + 8 * k..16 + 8 * k].try_into().expect("8 bytes"));
                if id == self.id {
                    mine_listed.push(b);
                } else {
                    used.insert(b);
                }
            }
        }
        let owners_raw = mem.read(l.owners_base(), (l.chunks() * 8) as usize).await?;
        let bitmap = mem.read(l.bitmap_base(), (l.chunks() * 8) as usize).await?;
        self.free.clear();
        self.retired.clear();
        self.foreign.clear();
        let mut taken = 0;
        for c in 0..l.chunks() as usize {
            let ow = u64::from_le_bytes(owners_raw[c * 8..c * 8 + 8].try_into().expect("8 bytes"));
            let bits = u64::from_le_bytes(bitmap[c * 8..c * 8 + 8].try_into().expect("8 bytes"));
            if bits == 0 || decode_owner(ow).is_none_or(|(id, _)| id != self.id) {
                continue;
            }
            let new = owner_word(self.id, self.incarnation);
            mem.write(l.owners_base() + c as u64 * 8, &new.to_le_bytes())
                .await?;
            for b in c as u64 * CHUNK_BLOCKS..(c as u64 + 1) * CHUNK_BLOCKS {
                if !used.contains(&b) {
                    self.free.push(b);
                    taken += 1;
                }
            }
        }
        for b in mine_listed {
            if !used.contains(&b) && !self.free.contains(&b) {
                self.free.push(b);
                self.foreign.insert(b);
                taken += 1;
            }
        }
        self.foreign_dirty = true;
        self.flush(mem).await?;
        Ok(taken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::LocalMem;
    use futures::executor::block_on;

    fn layout() -> Layout {
        Layout {
            ids: 2,
            max_entries: 4,
            objects: 4,
            block_bytes: 8,
            blocks: 128,
            reclaim_slots: 8,
        }
    }

    #[test]
    fn refill_claims_whole_words_once() {
        let l = layout();
        let m = LocalMem::new(l.total_bytes() as usize);
        let mut a = Allocator::new(l, 0, 1);
        let mut b = Allocator::new(l, 1, 1);
        block_on(a.refill(&m)).unwrap();
        block_on(b.refill(&m)).unwrap();
        assert!(matches!(block_on(a.refill(&m)), Err(AllocError::Exhausted)));
        let mut seen = BTreeSet::new();
        while let Some(x) = a.take(0) {
            assert!(seen.insert(x));
        }
        while let Some(x) = b.take(0) {
            assert!(seen.insert(x), "block {x} handed out twice");
        }
        assert_eq!(seen.len(), 128);
        assert_eq!(decode_owner(m.word(l.owners_base())).map(|o| o.1), Some(1));
    }

    #[test]
    fn retired_blocks_wait_before_reuse() {
        let mut a = Allocator::new(layout(), 0, 1);
        a.retire(&[5], 1000);
        assert_eq!(a.take(1000 + MIN_REUSE_MS - 1), None);
        assert_eq!(a.take(1000 + MIN_REUSE_MS), Some(5));
    }

    #[test]
    fn recovery_takes_back_only_unreferenced_unlisted_blocks() {
        let l = layout();
        let m = LocalMem::new(l.total_bytes() as usize);
        let mut a = Allocator::new(l, 0, 1);
        let mut b = Allocator::new(l, 1, 1);
        block_on(a.refill(&m)).unwrap();
        block_on(b.refill(&m)).unwrap();
        let a_blocks: Vec<u64> = std::iter::from_fn(|| a.take(0)).collect();
        // Object 0 references one of a's blocks; b holds another of a's (replaced by b).
        let d = Dptr {
            incarnation: 1,
            version: 3,
            block: a_blocks[0],
        };
        m.set_word(l.obj_addr(0) + DPTR_OFF, d.word());
        b.hold(&[a_blocks[1]], None);
        assert!(b.needs_flush());
        block_on(b.flush(&m)).unwrap();
        // a crashes; its next incarnation recovers.
        let mut a2 = Allocator::new(l, 0, 2);
        let n = block_on(a2.recover(&m)).unwrap();
        assert_eq!(n, 62);
        let got: BTreeSet<u64> = std::iter::from_fn(|| a2.take(0)).collect();
        assert!(
            !got.contains(&a_blocks[0]),
            "a referenced block was taken back"
        );
        assert!(
            !got.contains(&a_blocks[1]),
            "a block b holds was taken back"
        );
        let chunk = a_blocks[0] / CHUNK_BLOCKS;
        assert_eq!(
            decode_owner(m.word(l.owners_base() + chunk * 8)),
            Some((0, 2))
        );
        // b's recovery takes back what its table listed.
        let mut b2 = Allocator::new(l, 1, 2);
        let nb = block_on(b2.recover(&m)).unwrap();
        assert_eq!(nb, 64 + 1);
    }
}
