//! The range index: an ordered index of tables' keys in a B-link tree on a memory node,
//! whose nodes are rTX objects ([`rtx::blink`]; Transactional Indexes on Disaggregated
//! Memory with Repairable Transaction, 5), so that transactions can scan key ranges
//! ([`crate::coordinator::Txn::scan`]) over tables whose rows live in CVTs.
//!
//! One memory node hosts the tree in an rTX region (`memnode --range-index`, bulk-loaded
//! with the keys it is told to index) and exports [`RangeIndexExport`] under
//! [`EXPORT_KEY`]. Each coordinator thread holds a [`RangeIndex`]: one rTX client (an rTX
//! ID, its log slot) and one tree handle per coroutine slot, and the region's one-sided
//! connection. Index operations are rTXs of their own, one-sided and repairable: a
//! coordinator that dies in one leaves a lease lock that the next client to meet it
//! repairs (rTX 4.3), so the index never stays locked and never needs the dead node.
//!
//! How the index follows the rows (the rule that keeps a scan from missing a committed
//! row): a row inserted into an indexed table gets its index entry when its transaction
//! commits, before the installs ([`crate::coordinator::Txn::commit`]), and a deleted row loses it
//! only after its transaction committed, and only if the entry is still the one the
//! deletion read (each insert tags its entry with its transaction id), so that a row
//! inserted anew in between keeps its entry. The index thus holds every committed row's key,
//! plus stale keys (of inserts that aborted or are in flight, of deletes not yet
//! removed), which a scan skips because the row reads as absent. A scan reads the rows it
//! returns inside the transaction, so they are validated like any read; it is not
//! protected against phantoms (a row inserted into the range after the scan read the
//! index is not a conflict).
//!
//! An index key is the table in the top 8 bits and the row key in the low 56
//! ([`index_key`]), so one tree indexes several tables.

use std::cell::{Cell, RefCell};
use std::ops::Range;
use std::rc::Rc;

use rrpc::runtime::ThreadCtx;
use rtx::blink::{Blink, BlinkError};
use rtx::lease::SystemClock;
use rtx::rrpc_mem::RrpcMem;
use rtx::{Client, Layout};
use serde::{Deserialize, Serialize};

use crate::config::ClusterAddrs;
pub use crate::config::RangeIndexConfig;
use crate::error::TxnError;

/// The key under which the memory node hosting the range index exports
/// [`RangeIndexExport`] (beside the rTX region's own export, [`rtx::host::EXPORT_KEY`]).
pub const EXPORT_KEY: &str = "range-index";

/// Bits of a row key in an index key (the table takes the 8 above them).
pub const KEY_BITS: u32 = 56;

/// The tag (value) of bulk-loaded entries ([`RangeIndex::insert_many`]); inserts tag
/// theirs with a transaction id with the top bit set, which never equals it.
pub const LOADED_TAG: u64 = 1;

/// Entries per bulk-loaded node (of 61 in a 1 KB node): three quarters full, so that the
/// first inserts into a leaf do not split it.
pub const BULK_FILL: usize = 45;

/// Objects (tree nodes) a handle claims at a time for the splits it makes, from the
/// region's node counter ([`RangeIndexExport::counter`]).
pub const NODES_PER_CLAIM: u64 = 64;

/// What the memory node hosting the range index exports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeIndexExport {
    /// The node counter: the first object no bulk-loaded node uses, whose block's word
    /// 0 holds the next object index free for new nodes (0: `counter + 1`). Handles
    /// claim [`NODES_PER_CLAIM`] objects at a time by a CAS on it; a claim of a client
    /// that dies is lost (never reused), which is safe.
    pub counter: u64,
    /// Entries bulk-loaded.
    pub loaded: u64,
}

/// The index key of row `key` of `table`: the table in the top 8 bits, the key in the
/// low [`KEY_BITS`]. Errors: [`TxnError::Usage`] for a key of 2^56 or more or a table
/// above 255.
pub fn index_key(table: u32, key: u64) -> Result<u64, TxnError> {
    if key >> KEY_BITS != 0 || table > 0xFF {
        return Err(TxnError::Usage(format!(
            "range index: table {table} key {key} does not fit (tables below 256, keys \
             below 2^{KEY_BITS})"
        )));
    }
    Ok(u64::from(table) << KEY_BITS | key)
}

/// Objects (nodes) [`pool_bytes`] leaves for growth beside a tree of `entries`
/// bulk-loaded keys and `ids` rTX IDs: as many as the tree has, at least 4 claims per ID,
/// plus 16,384.
pub fn growth_objects(entries: u64, ids: u16) -> u64 {
    rtx::blink::bulk::objects_needed(entries, BULK_FILL).max(4 * NODES_PER_CLAIM * u64::from(ids))
        + 16_384
}

/// The rTX region (bytes) a memory node needs to host a range index of `entries`
/// bulk-loaded keys for `ids` rTX IDs (coordinator coroutines): the bulk-loaded tree,
/// room to grow ([`growth_objects`]), and the logs, at two data blocks of 1 KB per
/// object ([`rtx::host::layout_for_pool`]). A tree that outgrows it fails inserts with
/// [`TxnError::Usage`]; `memnode --rtx-pool` gives more.
pub fn pool_bytes(entries: u64, ids: u16) -> u64 {
    let objects = rtx::blink::bulk::objects_needed(entries, BULK_FILL)
        + growth_objects(entries, ids)
        + rtx::layout::CHUNK_BLOCKS;
    // Two blocks and a TXObj per object, plus the logs, bitmaps and owners (generous).
    objects * (2 * 1024 + rtx::layout::TXOBJ_BYTES) + u64::from(ids) * 64 * 1024 + (4 << 20)
}

/// Plant the scan bug the checkers must catch: from now on, in this process, every
/// scan drops its second key, missing a row that is there. For tests of the checkers
/// only. Errors: [`TxnError::Usage`] in a build without txn's `fault-injection` feature
/// (every build but the test builds).
pub fn plant_dropped_scan_entries() -> Result<(), TxnError> {
    #[cfg(feature = "fault-injection")]
    {
        crate::fault::drop_scan_entries(true);
        Ok(())
    }
    #[cfg(not(feature = "fault-injection"))]
    Err(TxnError::Usage(
        "planted bugs exist only in test builds (txn's fault-injection feature)".into(),
    ))
}

/// One coroutine slot: an rTX client and its tree handle.
struct Slot {
    client: Client<SystemClock>,
    tree: Blink,
    recovered: bool,
}

/// Counters of a thread's range index.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RangeIndexStats {
    /// Scans run.
    pub scans: u64,
    /// Index entries scans returned.
    pub scanned: u64,
    /// Entries inserted.
    pub inserts: u64,
    /// Entries deleted.
    pub deletes: u64,
}

/// A thread's handle on the range index (see the module documentation).
pub struct RangeIndex {
    mem: RrpcMem,
    layout: Layout,
    /// The node counter's object ([`RangeIndexExport::counter`]).
    counter: u64,
    tables: Vec<u32>,
    slots: RefCell<Vec<Slot>>,
    stats: Cell<RangeIndexStats>,
}

impl RangeIndex {
    /// Find the memory node among `addrs.memnodes` that exports a range index, and
    /// make a client and a tree handle for each of `cfg.ids` on it. Blocking (the
    /// nodes' control connection). Errors: [`TxnError::Export`] when no memory node
    /// hosts a range index or its region is too small for `cfg.ids`,
    /// [`TxnError::Usage`] for IDs past the region's or a bad incarnation,
    /// [`TxnError::Rpc`].
    pub fn connect(
        ctx: &Rc<ThreadCtx>,
        addrs: &ClusterAddrs,
        cfg: &RangeIndexConfig,
    ) -> Result<Self, TxnError> {
        if cfg.incarnation == 0 {
            return Err(TxnError::Usage(
                "range index: the rTX incarnation must be 1 to 255".into(),
            ));
        }
        for &a in &addrs.memnodes {
            let info = ctx.connect(a)?;
            let Ok(ix) = info.export::<RangeIndexExport>(EXPORT_KEY) else {
                continue;
            };
            let region: rtx::host::RtxExport = info
                .export(rtx::host::EXPORT_KEY)
                .map_err(|e| TxnError::Export(format!("range index on {a}: {e}")))?;
            let layout = region.layout;
            if ix.counter < rtx::blink::FIRST_FREE_OBJ {
                return Err(TxnError::Export(format!(
                    "range index on {a}: node counter {} inside the tree's fixed objects",
                    ix.counter
                )));
            }
            let slots = cfg
                .ids
                .clone()
                .map(|id| Self::slot(layout, ix, id, cfg.incarnation))
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(Self {
                mem: RrpcMem::new(ctx.clone(), info.node, region.region),
                layout,
                counter: ix.counter,
                tables: cfg.tables.clone(),
                slots: RefCell::new(slots),
                stats: Cell::new(RangeIndexStats::default()),
            });
        }
        Err(TxnError::Export(
            "no memory node hosts a range index (memnode --range-index)".into(),
        ))
    }

    fn slot(
        layout: Layout,
        ix: RangeIndexExport,
        id: u16,
        incarnation: u8,
    ) -> Result<Slot, TxnError> {
        // The region's last ID is its loader's (`rtx::host::host_with`).
        if id >= layout.ids - 1 {
            return Err(TxnError::Usage(format!(
                "range index: rTX ID {id} past the region's {} for clients (memnode --rtx-ids, \
                 one more than the coroutines)",
                layout.ids - 1
            )));
        }
        if ix.counter + 1 > layout.objects {
            return Err(TxnError::Export(format!(
                "range index: the node counter {} past the region's {} objects",
                ix.counter, layout.objects
            )));
        }
        // No nodes yet: the first split claims some (`RangeIndex::claim`).
        let none = ix.counter + 1..ix.counter + 1;
        Ok(Slot {
            client: Client::new(layout, id, incarnation, SystemClock, rtx::Config::default()),
            tree: Blink::new(layout, none),
            recovered: false,
        })
    }

    /// Whether `table` is indexed.
    pub fn indexes(&self, table: u32) -> bool {
        self.tables.contains(&table)
    }

    /// Counters so far.
    pub fn stats(&self) -> RangeIndexStats {
        self.stats.get()
    }

    fn count(&self, f: impl FnOnce(&mut RangeIndexStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    /// Take a free slot for one operation (returned when the guard drops), recovering
    /// its rTX ID first if it has not been used yet.
    async fn take(&self) -> Result<SlotGuard<'_>, TxnError> {
        let slot = self.slots.borrow_mut().pop().ok_or_else(|| {
            TxnError::Usage(
                "range index: more coroutines use the index at once than the thread has rTX \
                 IDs (RangeIndexConfig::ids)"
                    .into(),
            )
        })?;
        let mut g = SlotGuard {
            owner: self,
            slot: Some(slot),
        };
        let s = g.slot.as_mut().expect("taken");
        if !s.recovered {
            s.client.recover(&self.mem).await.map_err(rtx_error)?;
            s.recovered = true;
        }
        Ok(g)
    }

    /// Claim [`NODES_PER_CLAIM`] fresh objects for new nodes: a CAS on the node counter.
    /// Errors: [`TxnError::Usage`] when the region has none left, [`TxnError::Index`].
    async fn claim(&self) -> Result<std::ops::Range<u64>, TxnError> {
        use rtx::mem::Mem;
        let at = self.layout.block_addr(self.counter);
        let mem_err = |e: rtx::mem::MemError| TxnError::Index(format!("node counter: {e}"));
        let mut w = self.mem.read_u64(at).await.map_err(mem_err)?;
        loop {
            let next = if w == 0 { self.counter + 1 } else { w };
            let end = next + NODES_PER_CLAIM;
            if end > self.layout.objects {
                return Err(TxnError::Usage(format!(
                    "range index: the region's {} objects are used up by tree nodes (a larger \
                     memnode --rtx-pool)",
                    self.layout.objects
                )));
            }
            match self.mem.cas(at, w, end).await.map_err(mem_err)? {
                old if old == w => return Ok(next..end),
                old => w = old,
            }
        }
    }

    /// Up to `count` keys of `table` within `keys`, in key order (one read-only rTX over
    /// the leaves' sibling chain). Includes stale keys (see the module documentation).
    /// A range reaching past 2^56 - 1 ends there. Errors: [`TxnError::Usage`] for a
    /// table that is not indexed or a start that does not fit, [`TxnError::Index`] when
    /// the memory node fails.
    pub async fn scan(
        &self,
        table: u32,
        keys: Range<u64>,
        count: usize,
    ) -> Result<Vec<u64>, TxnError> {
        self.indexed(table)?;
        if keys.is_empty() || count == 0 {
            return Ok(Vec::new());
        }
        let lo = index_key(table, keys.start)?;
        let mut g = self.take().await?;
        let s = g.slot.as_mut().expect("taken");
        let got = s
            .tree
            .scan(&mut s.client, &self.mem, lo, count)
            .await
            .map_err(blink_error)?;
        let end = keys.end;
        let keys: Vec<u64> = got
            .into_iter()
            .take_while(|&(k, _)| k >> KEY_BITS == u64::from(table))
            .map(|(k, _)| k & ((1 << KEY_BITS) - 1))
            .take_while(|&k| k < end)
            .collect();
        #[cfg(feature = "fault-injection")]
        let keys = {
            let mut keys = keys;
            if crate::fault::dropping_scan_entries() && keys.len() > 1 {
                keys.remove(1);
            }
            keys
        };
        self.count(|st| {
            st.scans += 1;
            st.scanned += keys.len() as u64;
        });
        Ok(keys)
    }

    /// Add `keys` of `table` (in any order) with the value `tag`, replacing any entry
    /// there: one rTX when they share a leaf, as an order's lines do
    /// ([`Blink::insert_batch`]). A tag names the insert (a transaction id), so that a
    /// later [`Self::delete_if`] of the row it was read for leaves a newer insert's entry
    /// alone; bulk-loaded entries carry [`LOADED_TAG`]. Errors: as [`Self::scan`];
    /// [`TxnError::Usage`] when this ID's node range is used up.
    pub async fn insert_many(&self, table: u32, keys: &[u64], tag: u64) -> Result<(), TxnError> {
        self.indexed(table)?;
        let mut entries = keys
            .iter()
            .map(|&k| Ok((index_key(table, k)?, tag)))
            .collect::<Result<Vec<_>, TxnError>>()?;
        entries.sort_unstable();
        entries.dedup();
        let mut g = self.take().await?;
        let s = g.slot.as_mut().expect("taken");
        loop {
            if s.tree.out_of_objects() {
                s.tree.set_objects(self.claim().await?);
            }
            match s
                .tree
                .insert_batch(&mut s.client, &self.mem, &entries)
                .await
            {
                // A split took the last objects half-way: the insert is idempotent.
                Err(BlinkError::OutOfObjects) => s.tree.set_objects(self.claim().await?),
                r => break r.map_err(blink_error)?,
            }
        }
        self.count(|st| st.inserts += entries.len() as u64);
        Ok(())
    }

    /// The tag of `(table, key)`'s entry, `None` if there is none (one read-only rTX).
    /// Errors: as [`Self::scan`].
    pub async fn lookup(&self, table: u32, key: u64) -> Result<Option<u64>, TxnError> {
        self.indexed(table)?;
        let k = index_key(table, key)?;
        let mut g = self.take().await?;
        let s = g.slot.as_mut().expect("taken");
        s.tree
            .lookup(&mut s.client, &self.mem, k)
            .await
            .map_err(blink_error)
    }

    /// Remove `(table, key)`'s entry if it still has `tag` (read by [`Self::lookup`]
    /// when the row's deletion was decided): a row deleted and inserted anew meanwhile
    /// keeps its new entry. Returns whether it was removed. Errors: as [`Self::scan`].
    pub async fn delete_if(&self, table: u32, key: u64, tag: u64) -> Result<bool, TxnError> {
        self.indexed(table)?;
        let k = index_key(table, key)?;
        let mut g = self.take().await?;
        let s = g.slot.as_mut().expect("taken");
        let gone = s
            .tree
            .delete_if(&mut s.client, &self.mem, k, tag)
            .await
            .map_err(blink_error)?;
        if gone {
            self.count(|st| st.deletes += 1);
        }
        Ok(gone)
    }

    fn indexed(&self, table: u32) -> Result<(), TxnError> {
        if self.indexes(table) {
            Ok(())
        } else {
            Err(TxnError::Usage(format!(
                "range index: table {table} is not indexed (RangeIndexConfig::tables)"
            )))
        }
    }
}

/// A slot taken for one operation; put back on drop (also when the operation's future
/// is dropped half-way: its rTX's locks then expire and are repaired, rTX 4.3).
struct SlotGuard<'a> {
    owner: &'a RangeIndex,
    slot: Option<Slot>,
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.slot.take() {
            self.owner.slots.borrow_mut().push(s);
        }
    }
}

fn rtx_error(e: rtx::RtxError) -> TxnError {
    blink_error(BlinkError::Rtx(e))
}

fn blink_error(e: BlinkError) -> TxnError {
    match e {
        BlinkError::OutOfObjects => {
            TxnError::Index("a split found no free object (claimed ones used up)".into())
        }
        e => TxnError::Index(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_keys_keep_tables_apart_and_refuse_what_does_not_fit() {
        assert_eq!(index_key(0, 5).unwrap(), 5);
        assert_eq!(index_key(3, 7).unwrap(), 3 << 56 | 7);
        assert!(index_key(2, (1 << 56) - 1).unwrap() < index_key(3, 0).unwrap());
        assert!(index_key(0, 1 << 56).is_err());
        assert!(index_key(256, 0).is_err());
    }

    #[test]
    fn pools_fit_their_trees_and_ids() {
        for (entries, ids) in [(0, 1), (100_000, 64), (1_000_000, 256)] {
            let l = rtx::host::layout_for_pool(pool_bytes(entries, ids), ids, 1024).unwrap();
            let tree = rtx::blink::bulk::objects_needed(entries, BULK_FILL);
            assert!(
                l.objects >= tree + growth_objects(entries, ids),
                "{entries} {ids}: {l:?}"
            );
        }
    }
}
