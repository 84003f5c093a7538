//! Where a [`super::Race`] or [`super::optimal::Optimal`] handle gets new objects from: a
//! cursor over its own range of TXObjs (disjoint between handles, like the B-link tree's),
//! yielding free objects for new subtables and record pages for its key-value records.
//!
//! An object is free while word 0 of its block is zero (as [`super::format_table`] and
//! [`crate::host`] leave every object past the table). A record page is an object whose
//! block starts with [`RECORD_PAGE`]; the handle appends 16-byte records to it with one
//! WRITE each, and never moves or frees the page (records are immutable and never
//! reclaimed), so a slot's record address stays valid for the table's life.

use crate::dptr::Dptr;
use crate::layout::{dptr_addr, Layout};
use crate::mem::{Mem, MemError};

use super::table::{rec_index, record, RECORD_BYTES, RECORD_PAGE};
use super::RaceError;

/// The byte offset of the block the TXObj at `mptr` names now, `None` for a null or
/// out-of-range dptr (one READ of the dptr word).
pub async fn block_addr_of<M: Mem>(
    mem: &M,
    layout: &Layout,
    mptr: u64,
) -> Result<Option<u64>, MemError> {
    Ok(Dptr::decode(mem.read_u64(dptr_addr(mptr)).await?)
        .filter(|d| d.block < layout.blocks)
        .map(|d| layout.block_addr(d.block)))
}

/// A handle's object cursor and current record page.
#[derive(Clone, Debug)]
pub(crate) struct Objects {
    /// Next object index to try.
    pub(crate) next: u64,
    /// End of the range (exclusive).
    pub(crate) end: u64,
    /// Next free record's byte offset and the end of its page.
    page: Option<(u64, u64)>,
}

impl Objects {
    pub(crate) fn new(next: u64, end: u64) -> Self {
        Self {
            next,
            end,
            page: None,
        }
    }

    /// Claim the next free object of the range as a record page (READ of its dptr and
    /// word 0, WRITE of the magic). Errors: [`RaceError::OutOfObjects`], [`RaceError::Mem`].
    async fn new_page<M: Mem>(&mut self, mem: &M, layout: &Layout) -> Result<(), RaceError> {
        while self.next < self.end {
            let m = layout.obj_addr(self.next);
            self.next += 1;
            let Some(base) = block_addr_of(mem, layout, m).await? else {
                continue;
            };
            if mem.read_u64(base).await? != 0 {
                continue;
            }
            mem.write(base, &RECORD_PAGE.to_le_bytes()).await?;
            self.page = Some((base + RECORD_BYTES, base + layout.block_bytes));
            return Ok(());
        }
        Err(RaceError::OutOfObjects)
    }

    /// WRITE the record (key, val) and return its record index (the slot's `rec`).
    /// Errors: as [`Self::new_page`].
    pub(crate) async fn put<M: Mem>(
        &mut self,
        mem: &M,
        layout: &Layout,
        key: u64,
        val: u64,
    ) -> Result<u64, RaceError> {
        if self
            .page
            .is_none_or(|(next, end)| next + RECORD_BYTES > end)
        {
            self.new_page(mem, layout).await?;
        }
        let (at, end) = self.page.expect("a page was claimed");
        mem.write(at, &record(key, val)).await?;
        self.page = Some((at + RECORD_BYTES, end));
        Ok(rec_index(at))
    }
}
