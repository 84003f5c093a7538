//! Where a [`super::Race`] or [`super::optimal::Optimal`] handle gets new objects from: a
//! cursor over its own range of TXObjs (disjoint between handles, like the B-link tree's),
//! yielding free objects for new subtables and record pages for its key-value records.
//!
//! An object is free while word 0 of its block is zero (as [`super::format_table`] and
//! [`crate::host`] leave every object past the table). A record page is an object whose
//! block starts with [`RECORD_PAGE`]; the handle appends 16-byte records to it with one
//! WRITE each, and never moves or frees the page.
//!
//! Records are reclaimed as RACE frees its KV blocks, with the reuse rule of rTX's data
//! pool (4.4): the handle whose slot CAS stopped referencing a record (a landed update or
//! delete whose post-check passed: the one CAS that replaced it in the live table)
//! retires it, and writes another record into it only [`MIN_REUSE_MS`] later. A reader
//! that READ a slot and then its record more than half of that apart discards what it
//! read ([`STALE_READ`]), so no live reader ever meets a reused record. An operation
//! that must run again after its CAS landed takes a new record for the next attempt:
//! its landed word may have been replaced meanwhile, and its record retired by the client
//! that replaced it. Records retired by a handle that dies are lost to the table (a
//! leak, never a wrong value), and so is a record whose only slot was in a subtable block
//! a rehash had already copied.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::alloc::MIN_REUSE_MS;
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

/// How long after its slot READ a record READ may still be trusted: half the reuse wait.
pub const STALE_READ: Duration = Duration::from_millis(MIN_REUSE_MS / 2);

/// A handle's object cursor, current record page and retired records.
#[derive(Clone, Debug)]
pub(crate) struct Objects {
    /// Next object index to try.
    pub(crate) next: u64,
    /// End of the range (exclusive).
    pub(crate) end: u64,
    /// Next free record's byte offset and the end of its page.
    page: Option<(u64, u64)>,
    /// Records this handle stopped referencing (byte offset), with the time (ms since
    /// `epoch`) from which they may be written again.
    retired: VecDeque<(u64, u64)>,
    /// Retired records whose wait has passed.
    free: Vec<u64>,
    epoch: Instant,
    /// Minimum time in ms between retiring a record and reusing it ([`MIN_REUSE_MS`]).
    pub(crate) min_reuse_ms: u64,
    /// Records written into reclaimed space.
    pub(crate) reused: u64,
}

impl Objects {
    pub(crate) fn new(next: u64, end: u64) -> Self {
        Self {
            next,
            end,
            page: None,
            retired: VecDeque::new(),
            free: Vec::new(),
            epoch: Instant::now(),
            min_reuse_ms: MIN_REUSE_MS,
            reused: 0,
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// The record `slot_word` names is no longer referenced by the table: this handle's
    /// CAS replaced it there (see the module docs for when that holds). Nothing for an
    /// empty word.
    pub(crate) fn retire(&mut self, slot_word: u64) {
        if let Some(s) = super::table::Slot::decode(slot_word) {
            let ready = self.now_ms() + self.min_reuse_ms;
            self.retired.push_back((s.rec_addr(), ready));
        }
    }

    /// `stats` with this handle's record counts filled in.
    pub(crate) fn counted(&self, stats: super::RaceStats) -> super::RaceStats {
        super::RaceStats {
            records_reused: self.reused,
            records_retired: (self.retired.len() + self.free.len()) as u64,
            ..stats
        }
    }

    /// A record this handle wrote but never made a slot name (record index): reusable at
    /// once.
    pub(crate) fn give_back(&mut self, rec: u64) {
        self.free.push(rec * RECORD_BYTES);
    }

    /// A reclaimed record's byte offset, if one has waited long enough.
    fn take_reclaimed(&mut self) -> Option<u64> {
        let now = self.now_ms();
        while let Some(&(at, ready)) = self.retired.front() {
            if ready > now {
                break;
            }
            self.retired.pop_front();
            self.free.push(at);
        }
        self.free.pop()
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

    /// WRITE the record (key, val), into a reclaimed record when one has waited long
    /// enough, and return its record index (the slot's `rec`). Errors: as
    /// [`Self::new_page`].
    pub(crate) async fn put<M: Mem>(
        &mut self,
        mem: &M,
        layout: &Layout,
        key: u64,
        val: u64,
    ) -> Result<u64, RaceError> {
        if let Some(at) = self.take_reclaimed() {
            mem.write(at, &record(key, val)).await?;
            self.reused += 1;
            return Ok(rec_index(at));
        }
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
