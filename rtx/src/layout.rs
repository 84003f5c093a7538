//! Memory-node layout of one rTX region (Transactional Indexes on Disaggregated Memory
//! with Repairable Transaction, 4.2 Fig. 6, and 4.4): a log array, a meta pool of TXObjs,
//! the allocation bitmap with its chunk-owner table, one reclamation table per rTX ID, and
//! the data pool. All offsets are bytes from the region's start; the MN's CPU never touches
//! any of it at run time.
//!
//! ```text
//! logs      ids x slot_bytes                 (log slot i belongs to rTX ID i)
//! meta      objects x 16 B                   (TXObj: LLLock word, dptr word)
//! bitmap    chunks x 8 B                     (bit b of word c: block 64c+b is owned)
//! owners    chunks x 8 B                     (who claimed the chunk: id, incarnation)
//! reclaim   ids x (8 + reclaim_slots x 8) B  (reserved word, then slots: listed block + 1)
//! data      blocks x block_bytes
//! ```

use crate::log::LogImage;

/// Bytes of a TXObj: LLLock word then dptr word (Table 2's "+16" READ).
pub const TXOBJ_BYTES: u64 = 16;
/// Offset of the dptr word inside a TXObj.
pub const DPTR_OFF: u64 = 8;
/// The MN offset of the dptr word of the TXObj at `mptr`.
pub fn dptr_addr(mptr: u64) -> u64 {
    mptr + DPTR_OFF
}

/// The chunk-owner word: valid bit, rTX ID (16 bits) and allocator incarnation (8 bits).
pub fn owner_word(id: u16, incarnation: u8) -> u64 {
    1 << 63 | (id as u64) << 8 | incarnation as u64
}

/// Decode a chunk-owner word into (id, incarnation); `None` if unowned.
pub fn decode_owner(w: u64) -> Option<(u16, u8)> {
    (w >> 63 == 1).then_some(((w >> 8) as u16, w as u8))
}

/// Blocks per bitmap word (one batch claim).
pub const CHUNK_BLOCKS: u64 = 64;

/// Sizes of an rTX region; every offset derives from them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Layout {
    /// rTX IDs (client coroutines), at most 32768.
    pub ids: u16,
    /// Largest write set of a logged rTX.
    pub max_entries: u16,
    /// TXObjs in the meta pool.
    pub objects: u64,
    /// Bytes per data block (every object value has this size).
    pub block_bytes: u64,
    /// Data blocks, a multiple of [`CHUNK_BLOCKS`].
    pub blocks: u64,
    /// Slots of each ID's reclamation table (foreign blocks it holds, [`crate::alloc`]).
    pub reclaim_slots: u64,
}

fn round_up(x: u64, to: u64) -> u64 {
    x.div_ceil(to) * to
}

impl Layout {
    /// Bytes of one log slot.
    pub fn slot_bytes(&self) -> u64 {
        round_up(LogImage::bytes_for(self.max_entries as usize), 64)
    }
    /// Offset of rTX ID `id`'s log slot.
    pub fn log_addr(&self, id: u16) -> u64 {
        assert!(id < self.ids, "rTX ID {id} out of range");
        id as u64 * self.slot_bytes()
    }
    /// Offset of the meta pool.
    pub fn meta_base(&self) -> u64 {
        self.ids as u64 * self.slot_bytes()
    }
    /// Offset of TXObj `i` (its mptr).
    pub fn obj_addr(&self, i: u64) -> u64 {
        assert!(i < self.objects, "object {i} out of range");
        self.meta_base() + i * TXOBJ_BYTES
    }
    /// Bitmap words (chunks of [`CHUNK_BLOCKS`] blocks).
    pub fn chunks(&self) -> u64 {
        self.blocks.div_ceil(CHUNK_BLOCKS)
    }
    /// Offset of the allocation bitmap.
    pub fn bitmap_base(&self) -> u64 {
        self.meta_base() + self.objects * TXOBJ_BYTES
    }
    /// Offset of the chunk-owner table.
    pub fn owners_base(&self) -> u64 {
        self.bitmap_base() + self.chunks() * 8
    }
    /// Bytes of one reclamation table.
    pub fn reclaim_bytes(&self) -> u64 {
        8 + self.reclaim_slots * 8
    }
    /// Offset of ID `id`'s reclamation table.
    pub fn reclaim_addr(&self, id: u16) -> u64 {
        self.owners_base() + self.chunks() * 8 + id as u64 * self.reclaim_bytes()
    }
    /// Offset of the data pool (64-byte aligned).
    pub fn data_base(&self) -> u64 {
        round_up(
            self.reclaim_addr(0) + self.ids as u64 * self.reclaim_bytes(),
            64,
        )
    }
    /// Offset of data block `block`.
    pub fn block_addr(&self, block: u64) -> u64 {
        assert!(block < self.blocks, "block {block} out of range");
        self.data_base() + block * self.block_bytes
    }
    /// Total bytes of the region.
    pub fn total_bytes(&self) -> u64 {
        self.data_base() + self.blocks * self.block_bytes
    }
    /// Check the sizes. Errors: [`LayoutError`] naming the first unusable size.
    pub fn validate(&self) -> Result<(), LayoutError> {
        if self.ids == 0 || self.ids as u32 > crate::lllock::MAX_ID as u32 + 1 {
            return Err(LayoutError::Ids(self.ids));
        }
        if self.blocks == 0
            || !self.blocks.is_multiple_of(CHUNK_BLOCKS)
            || self.blocks > crate::dptr::BLOCK_MAX
        {
            return Err(LayoutError::Blocks(self.blocks));
        }
        if self.block_bytes == 0 || !self.block_bytes.is_multiple_of(8) {
            return Err(LayoutError::BlockBytes(self.block_bytes));
        }
        if self.max_entries == 0 {
            return Err(LayoutError::NoEntries);
        }
        Ok(())
    }
}

/// An unusable [`Layout`].
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// rTX IDs must be 1 to 32768 (15-bit owner ids).
    #[error("{0} rTX IDs, need 1 to 32768")]
    Ids(u16),
    /// Blocks must be a non-zero multiple of 64 (bitmap words) within 40 bits (dptrs).
    #[error("{0} blocks, need a non-zero multiple of 64 below 2^40")]
    Blocks(u64),
    /// Block bytes must be a non-zero multiple of 8.
    #[error("{0}-byte blocks, need a non-zero multiple of 8")]
    BlockBytes(u64),
    /// A log must hold at least one entry.
    #[error("logs of 0 entries")]
    NoEntries,
}

/// Incarnation stamped on the blocks [`format()`] hands out.
pub const LOADER_INCARNATION: u8 = 1;

/// Lay out a zeroed region: object `i` gets block `i` holding `value(i)` (block-sized),
/// version 0, unlocked; the chunks holding those blocks are claimed for rTX ID `loader`
/// (its later recovery takes back the unused rest). Errors: the [`crate::mem::MemError`]
/// of the first failed WRITE, or a size mismatch reported as `Bounds`.
pub async fn format<M: crate::mem::Mem>(
    layout: &Layout,
    mem: &M,
    loader: u16,
    value: impl Fn(u64) -> Vec<u8>,
) -> Result<(), crate::mem::MemError> {
    use crate::dptr::Dptr;
    assert!(layout.objects <= layout.blocks, "fewer blocks than objects");
    for i in 0..layout.objects {
        let v = value(i);
        if v.len() as u64 != layout.block_bytes {
            return Err(crate::mem::MemError::Bounds {
                off: layout.block_addr(i),
                len: v.len(),
            });
        }
        mem.write(layout.block_addr(i), &v).await?;
        let d = Dptr {
            incarnation: LOADER_INCARNATION,
            version: 0,
            block: i,
        };
        let mut meta = 0u64.to_le_bytes().to_vec();
        meta.extend_from_slice(&d.word().to_le_bytes());
        mem.write(layout.obj_addr(i), &meta).await?;
    }
    for c in 0..layout.objects.div_ceil(CHUNK_BLOCKS) {
        mem.write(layout.bitmap_base() + c * 8, &u64::MAX.to_le_bytes())
            .await?;
        let owner = owner_word(loader, LOADER_INCARNATION);
        mem.write(layout.owners_base() + c * 8, &owner.to_le_bytes())
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_do_not_overlap() {
        let l = Layout {
            ids: 3,
            max_entries: 5,
            objects: 10,
            block_bytes: 24,
            blocks: 128,
            reclaim_slots: 4,
        };
        l.validate().unwrap();
        assert!(l.log_addr(2) + l.slot_bytes() <= l.meta_base());
        assert!(l.obj_addr(9) + TXOBJ_BYTES <= l.bitmap_base());
        assert_eq!(l.owners_base(), l.bitmap_base() + 16);
        assert!(l.reclaim_addr(2) + l.reclaim_bytes() <= l.data_base());
        assert_eq!(l.block_addr(127) + 24, l.total_bytes());
        assert_eq!(l.obj_addr(0) % 16, 0);
        assert!(Layout { blocks: 100, ..l }.validate().is_err());
    }
}
