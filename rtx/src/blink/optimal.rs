//! The "Optimal" baseline of rTX's evaluation (Transactional Indexes on Disaggregated
//! Memory with Repairable Transaction, 6: the original, non-transactional Sherman): the
//! same B-link tree, node layout and region as [`super::Blink`], updated by Sherman's own
//! locking and without logs or copy-on-write.
//!
//! A node's lock is its TXObj's first word (0 = free, [`LOCK_HELD`] | id = held, CAS); its
//! value stays in place in the block its dptr names (resolved once per node and cached:
//! Optimal never moves a node). Insert, update and delete: CAS-lock the leaf, READ it,
//! modify, WRITE it back with its version moved on (front and rear words) and WRITE the
//! lock free in the same ordered list (Sherman's command combination: three round trips).
//! A split WRITEs the new sibling, the left node (pointing at it) and the unlock as one
//! ordered list, then inserts the separator into the parent the same way (B-link: until
//! then the new node is reachable through its left sibling); a new root is installed by CAS on the
//! root-pointer word. Lookups and scans READ nodes without locks and retry torn reads
//! (front version differs from rear). A client that dies holding a lock blocks everyone
//! who needs that node: this baseline has no repair (the point of rTX, 6 Fig. 14).
//!
//! [`Optimal::dtx`] is the DTX baseline of rTX's evaluation (rTX 6, "DTX": DrTM+H-based,
//! value logging, no idempotent commit) on the same code. A leaf is written by OCC, as
//! DrTM+H runs a transaction: the leaf is READ without a lock (execution), then its lock is
//! CASed and its first word (which holds the node's version) READ again (validation); a
//! lock held by another client or a version moved on aborts the attempt, which starts over
//! from the READ. Before each node is written back, its old value (1 KB) is WRITTEN to the
//! client's log block, and the log is cleared (an 8-byte WRITE) after the unlock, which is
//! Table 2's "WRITE 2 K x n + 8". Its metadata is not packed with the node as in DrTM+H
//! (the lock stays in the TXObj, so validation is its own 8-byte READ), and its recovery
//! (the log replayed by a failure detector's process) is not built: it stands for DTX's
//! cost on the normal path only. [`Optimal::occ`] is the same OCC without the value log
//! (the first step of the paper's factor analysis, 6 Figs. 16-17). Splits, and the parent
//! updates they cause, lock first in every variant.

use std::collections::HashMap;
use std::ops::Range;

use crate::dptr::Dptr;
use crate::layout::{dptr_addr, Layout};
use crate::mem::{Mem, MemError};

use super::node::{capacity, Node, KEY_MAX};
use super::{parse_root, BlinkError, BlinkStats, MAX_ATTEMPTS, ROOT_OBJ};

/// Bit set in a held lock word (the low 16 bits name the holder): the LLLock's locked
/// bit, so [`super::check::check_quiescent`] reports a lock left held.
pub const LOCK_HELD: u64 = crate::lllock::LOCKED_BIT;

/// One client's handle on the Optimal tree: lock id, node-address and internal-node
/// caches, and the object range it allocates new nodes from (disjoint between handles).
#[derive(Debug)]
pub struct Optimal {
    layout: Layout,
    id: u16,
    root_obj: u64,
    blocks: HashMap<u64, u64>,
    cache: HashMap<u64, Node>,
    root: Option<(u64, u8)>,
    next_obj: u64,
    end_obj: u64,
    cap: usize,
    stats: BlinkStats,
    /// DTX variant: the mptr of the object whose block is this client's value log.
    value_log: Option<u64>,
    /// DTX variant: raw images of the nodes read under lock, logged before write-back.
    old_images: HashMap<u64, Vec<u8>>,
    /// DTX variant: the log holds an image not cleared yet.
    log_dirty: bool,
    /// OCC (DTX and [`Optimal::occ`]): leaves are READ before they are locked and
    /// validated once locked.
    occ: bool,
    /// Planted bug: OCC skips its validation READ.
    #[cfg(test)]
    pub(crate) planted_skip_validation: bool,
}

impl Optimal {
    /// A handle for client `id` on the tree formatted by [`super::format_tree`], taking new
    /// nodes from object indices `objs` (disjoint from every other handle's); Sherman's
    /// lock-first writes.
    pub fn new(layout: Layout, id: u16, objs: Range<u64>) -> Self {
        assert!(objs.start >= super::FIRST_FREE_OBJ && objs.end <= layout.objects);
        Self {
            layout,
            id,
            root_obj: layout.obj_addr(ROOT_OBJ),
            blocks: HashMap::new(),
            cache: HashMap::new(),
            root: None,
            next_obj: objs.start,
            end_obj: objs.end,
            cap: capacity(layout.block_bytes as usize),
            stats: BlinkStats::default(),
            value_log: None,
            old_images: HashMap::new(),
            log_dirty: false,
            occ: false,
            #[cfg(test)]
            planted_skip_validation: false,
        }
    }

    /// The DTX-style variant (module docs): as [`Optimal::new`], with the first object of
    /// `objs` as this client's value log.
    pub fn dtx(layout: Layout, id: u16, objs: Range<u64>) -> Self {
        let log = layout.obj_addr(objs.start);
        let mut t = Self::occ(layout, id, objs.start + 1..objs.end);
        t.value_log = Some(log);
        t
    }

    /// Leaves written by OCC without a value log (module docs): Optimal plus OCC, the
    /// first step of rTX's factor analysis (6, Figs. 16-17).
    pub fn occ(layout: Layout, id: u16, objs: Range<u64>) -> Self {
        let mut t = Self::new(layout, id, objs);
        t.occ = true;
        t
    }

    /// Counters so far (aborts count lock CAS retries).
    pub fn stats(&self) -> BlinkStats {
        self.stats
    }

    fn lock_word(&self) -> u64 {
        LOCK_HELD | self.id as u64
    }

    /// The block address of the node at `mptr` (READ of its dptr word the first time).
    async fn addr<M: Mem>(&mut self, mem: &M, mptr: u64) -> Result<u64, MemError> {
        if let Some(&a) = self.blocks.get(&mptr) {
            return Ok(a);
        }
        let d = Dptr::decode(mem.read_u64(dptr_addr(mptr)).await?).expect("formatted object");
        let a = self.layout.block_addr(d.block);
        self.blocks.insert(mptr, a);
        Ok(a)
    }

    /// READ the node at `mptr` (one 1 KB READ); `None` if torn or free.
    async fn read_node<M: Mem>(&mut self, mem: &M, mptr: u64) -> Result<Option<Node>, MemError> {
        Ok(self.read_raw(mem, mptr).await?.0)
    }

    async fn read_raw<M: Mem>(
        &mut self,
        mem: &M,
        mptr: u64,
    ) -> Result<(Option<Node>, Vec<u8>), MemError> {
        let a = self.addr(mem, mptr).await?;
        let b = mem.read(a, self.layout.block_bytes as usize).await?;
        Ok((Node::decode(&b), b))
    }

    /// WRITE back `nodes` (each with its version moved on), then free the lock of
    /// `unlock`, as one ordered list (Sherman's command combination: RC lands the
    /// write-backs before the release, so no reader of a free lock sees an old node).
    /// DTX first WRITEs each node's old value to its log, one round each (DrTM+H's log
    /// round, which precedes the write-back), and clears the log at the list's end.
    async fn write_back<M: Mem>(
        &mut self,
        mem: &M,
        nodes: &mut [(u64, &mut Node)],
        unlock: Option<u64>,
    ) -> Result<(), MemError> {
        let bb = self.layout.block_bytes as usize;
        let mut log_addr = None;
        if let Some(log) = self.value_log {
            let la = self.addr(mem, log).await?;
            for (mptr, _) in nodes.iter() {
                // A new node's old value is its free block, zeros.
                let old = self
                    .old_images
                    .remove(mptr)
                    .unwrap_or_else(|| vec![0u8; bb]);
                mem.write(la, &old).await?;
                self.log_dirty = true;
            }
            log_addr = Some(la);
        }
        let mut images = Vec::with_capacity(nodes.len());
        for (mptr, n) in nodes.iter_mut() {
            n.version = n.version.wrapping_add(1);
            images.push((self.addr(mem, *mptr).await?, n.encode(bb)));
        }
        const FREE: [u8; 8] = [0; 8];
        let mut list: Vec<(u64, &[u8])> = images.iter().map(|(a, b)| (*a, &b[..])).collect();
        if let Some(m) = unlock {
            list.push((m, &FREE));
            self.old_images.remove(&m);
            if let (Some(la), true) = (log_addr, self.log_dirty) {
                // DTX: the log is cleared once the node is installed and unlocked.
                list.push((la, &FREE));
                self.log_dirty = false;
            }
        }
        mem.write_ordered(&list).await
    }

    async fn lock<M: Mem>(&mut self, mem: &M, mptr: u64) -> Result<(), BlinkError> {
        for _ in 0..MAX_ATTEMPTS {
            if mem.cas(mptr, 0, self.lock_word()).await? == 0 {
                return Ok(());
            }
            self.stats.aborts += 1;
        }
        Err(BlinkError::Retries(MAX_ATTEMPTS))
    }

    async fn unlock<M: Mem>(&mut self, mem: &M, mptr: u64) -> Result<(), MemError> {
        mem.write(mptr, &0u64.to_le_bytes()).await?;
        self.old_images.remove(&mptr);
        if let (Some(log), true) = (self.value_log, self.log_dirty) {
            // DTX: the log is cleared once the node is installed and unlocked.
            let la = self.addr(mem, log).await?;
            mem.write(la, &0u64.to_le_bytes()).await?;
            self.log_dirty = false;
        }
        Ok(())
    }

    async fn root<M: Mem>(&mut self, mem: &M) -> Result<(u64, u8), MemError> {
        if let Some(r) = self.root {
            return Ok(r);
        }
        let a = self.addr(mem, self.root_obj).await?;
        let r = parse_root(&mem.read(a, 16).await?);
        self.root = Some(r);
        Ok(r)
    }

    fn invalidate(&mut self) {
        self.root = None;
        self.cache.clear();
        self.stats.restarts += 1;
    }

    /// Descend to `level`: a node mptr at or left of the one covering `key` there.
    /// `None`: stale cache, torn read or a root below `level` (restart).
    async fn locate<M: Mem>(
        &mut self,
        mem: &M,
        key: u64,
        target: u8,
    ) -> Result<Option<u64>, MemError> {
        let (mut m, rl) = self.root(mem).await?;
        if rl < target {
            return Ok(None);
        }
        let mut level = rl;
        while level > target {
            let n = match self.cache.get(&m) {
                Some(n) => Some(n.clone()),
                None => self.read_node(mem, m).await?,
            };
            let Some(n) = n.filter(|n| n.level == level && !n.leaf && key >= n.lo) else {
                return Ok(None);
            };
            self.cache.insert(m, n.clone());
            if key >= n.hi {
                if n.sibling == 0 {
                    return Ok(None);
                }
                m = n.sibling;
                continue;
            }
            m = n.child(key);
            level -= 1;
        }
        Ok(Some(m))
    }

    /// Lock and READ the node of `level` covering `key`, moving right (unlock, lock the
    /// sibling) as needed. `None`: restart.
    async fn lock_covering<M: Mem>(
        &mut self,
        mem: &M,
        key: u64,
        level: u8,
    ) -> Result<Option<(u64, Node)>, BlinkError> {
        let Some(mut m) = self.locate(mem, key, level).await? else {
            return Ok(None);
        };
        loop {
            self.lock(mem, m).await?;
            // Under the lock no writer runs, so a torn read cannot happen; a free or
            // misrouted node means restart.
            let (n, raw) = self.read_raw(mem, m).await?;
            if self.value_log.is_some() {
                self.old_images.insert(m, raw);
            }
            match n {
                Some(n) if n.level == level && key >= n.lo => {
                    if key < n.hi {
                        return Ok(Some((m, n)));
                    }
                    self.unlock(mem, m).await?;
                    if n.sibling == 0 {
                        return Ok(None);
                    }
                    m = n.sibling;
                }
                _ => {
                    self.unlock(mem, m).await?;
                    return Ok(None);
                }
            }
        }
    }

    fn take_obj(&mut self) -> Result<u64, BlinkError> {
        if self.next_obj >= self.end_obj {
            return Err(BlinkError::OutOfObjects);
        }
        let m = self.layout.obj_addr(self.next_obj);
        self.next_obj += 1;
        Ok(m)
    }

    /// Look `key` up: one unlocked READ of the leaf (Sherman). Errors: [`BlinkError`].
    pub async fn lookup<M: Mem>(&mut self, mem: &M, key: u64) -> Result<Option<u64>, BlinkError> {
        for _ in 0..MAX_ATTEMPTS {
            if let Some(mut m) = self.locate(mem, key, 0).await? {
                loop {
                    match self.read_node(mem, m).await? {
                        Some(n) if n.leaf && key >= n.lo => {
                            if key >= n.hi && n.sibling != 0 {
                                m = n.sibling;
                                continue;
                            }
                            self.stats.ops += 1;
                            return Ok(n.keys.binary_search(&key).ok().map(|i| n.vals[i]));
                        }
                        _ => break,
                    }
                }
            }
            self.invalidate();
        }
        Err(BlinkError::Retries(MAX_ATTEMPTS))
    }

    /// Up to `count` entries with keys >= `from` in key order along the sibling chain,
    /// unlocked READs (Sherman's scan is not atomic). Errors: [`BlinkError`].
    pub async fn scan<M: Mem>(
        &mut self,
        mem: &M,
        from: u64,
        count: usize,
    ) -> Result<Vec<(u64, u64)>, BlinkError> {
        'attempt: for _ in 0..MAX_ATTEMPTS {
            let Some(mut m) = self.locate(mem, from, 0).await? else {
                self.invalidate();
                continue;
            };
            let mut out = Vec::new();
            let mut lo = None;
            loop {
                let Some(n) = self.read_node(mem, m).await?.filter(|n| n.leaf) else {
                    self.invalidate();
                    continue 'attempt;
                };
                if lo.is_none() && (from < n.lo || from >= n.hi) {
                    if from >= n.hi && n.sibling != 0 {
                        m = n.sibling;
                        continue;
                    }
                    self.invalidate();
                    continue 'attempt;
                }
                lo = Some(n.lo);
                for (&k, &v) in n.keys.iter().zip(&n.vals) {
                    if k >= from && out.len() < count {
                        out.push((k, v));
                    }
                }
                if out.len() >= count || n.sibling == 0 {
                    self.stats.ops += 1;
                    return Ok(out);
                }
                m = n.sibling;
            }
        }
        Err(BlinkError::Retries(MAX_ATTEMPTS))
    }

    /// Insert `key` or update its value: lock, READ, WRITE back + unlock; on overflow the
    /// split described in the module docs. Returns the previous value. Panics if `key` is
    /// [`KEY_MAX`]. Errors: [`BlinkError`].
    pub async fn insert<M: Mem>(
        &mut self,
        mem: &M,
        key: u64,
        val: u64,
    ) -> Result<Option<u64>, BlinkError> {
        assert!(key < KEY_MAX, "key {key} reserved for the +infinity fence");
        let (m, mut n) = self.lock_leaf(mem, key).await?;
        let old = n.upsert(key, val);
        if n.keys.len() <= self.cap {
            self.write_back(mem, &mut [(m, &mut n)], Some(m)).await?;
            self.stats.ops += 1;
            return Ok(old);
        }
        let mut left = (m, n);
        let mut level = 0u8;
        loop {
            let (lm, mut ln) = left;
            let rm = self.take_obj()?;
            let (sep, mut right) = ln.split(rm, true);
            // The new sibling before the left node that points at it.
            self.write_back(mem, &mut [(rm, &mut right), (lm, &mut ln)], Some(lm))
                .await?;
            self.stats.splits += 1;
            if level > 0 {
                self.cache.insert(lm, ln.clone());
                self.cache.insert(rm, right);
            }
            level += 1;
            match self.insert_parent(mem, level, sep, lm, rm).await? {
                None => break,
                Some(full) => left = full,
            }
        }
        self.stats.ops += 1;
        Ok(old)
    }

    async fn lock_leaf<M: Mem>(&mut self, mem: &M, key: u64) -> Result<(u64, Node), BlinkError> {
        for _ in 0..MAX_ATTEMPTS {
            let r = if self.occ {
                self.occ_leaf(mem, key).await?
            } else {
                self.lock_covering(mem, key, 0).await?
            };
            if let Some(r) = r {
                return Ok(r);
            }
            self.invalidate();
        }
        Err(BlinkError::Retries(MAX_ATTEMPTS))
    }

    /// The leaf covering `key`, locked, by OCC (module docs): READ it unlocked, CAS its
    /// lock, READ its first word again. A held lock, a version moved on or a torn READ
    /// aborts the attempt (counted in [`BlinkStats::aborts`]) and starts over. `None`:
    /// restart (stale cache, or a node free or of another level).
    async fn occ_leaf<M: Mem>(
        &mut self,
        mem: &M,
        key: u64,
    ) -> Result<Option<(u64, Node)>, BlinkError> {
        'attempt: for _ in 0..MAX_ATTEMPTS {
            let Some(mut m) = self.locate(mem, key, 0).await? else {
                return Ok(None);
            };
            // Execution: the leaf as read without a lock.
            let (n, raw) = loop {
                let (n, raw) = self.read_raw(mem, m).await?;
                match n {
                    Some(n) if n.leaf && key >= n.lo => {
                        if key < n.hi {
                            break (n, raw);
                        }
                        if n.sibling == 0 {
                            return Ok(None);
                        }
                        m = n.sibling;
                    }
                    // Used but undecodable: torn by a write-back in flight.
                    None if raw[0] & 1 == 1 => {
                        self.stats.aborts += 1;
                        continue 'attempt;
                    }
                    _ => return Ok(None),
                }
            };
            // Commit: lock, then validate the version read.
            if mem.cas(m, 0, self.lock_word()).await? != 0 {
                self.stats.aborts += 1;
                continue;
            }
            let a = self.addr(mem, m).await?;
            #[cfg(test)]
            let skip = self.planted_skip_validation;
            #[cfg(not(test))]
            let skip = false;
            if !skip && mem.read(a, 8).await?[..] != raw[..8] {
                self.unlock(mem, m).await?;
                self.stats.aborts += 1;
                continue;
            }
            if self.value_log.is_some() {
                self.old_images.insert(m, raw);
            }
            return Ok(Some((m, n)));
        }
        Err(BlinkError::Retries(MAX_ATTEMPTS))
    }

    /// Insert (sep, right) into the node of `level` covering `sep`, growing a new root if
    /// `left` is the root. Returns the locked, overflowing node if it must split in turn.
    async fn insert_parent<M: Mem>(
        &mut self,
        mem: &M,
        level: u8,
        sep: u64,
        left: u64,
        right: u64,
    ) -> Result<Option<(u64, Node)>, BlinkError> {
        for _ in 0..MAX_ATTEMPTS {
            self.root = None;
            let (root, rl) = self.root(mem).await?;
            if rl + 1 == level && root == left {
                let nr = self.take_obj()?;
                let mut n = Node {
                    leaf: false,
                    level,
                    lo: 0,
                    hi: KEY_MAX,
                    leftmost: left,
                    keys: vec![sep],
                    vals: vec![right],
                    ..Node::default()
                };
                self.write_back(mem, &mut [(nr, &mut n)], None).await?;
                let ra = self.addr(mem, self.root_obj).await?;
                if mem.cas(ra, root, nr).await? == root {
                    mem.write(ra + 8, &(level as u64).to_le_bytes()).await?;
                    self.root = Some((nr, level));
                    self.cache.insert(nr, n);
                    self.stats.root_growths += 1;
                    return Ok(None);
                }
                // Someone else grew the root: the object stays unused.
                continue;
            }
            if rl < level {
                // A new root whose level word is not written yet.
                self.stats.restarts += 1;
                continue;
            }
            let Some((pm, mut p)) = self.lock_covering(mem, sep, level).await? else {
                self.invalidate();
                continue;
            };
            p.upsert(sep, right);
            if p.keys.len() <= self.cap {
                self.write_back(mem, &mut [(pm, &mut p)], Some(pm)).await?;
                self.cache.insert(pm, p);
                return Ok(None);
            }
            return Ok(Some((pm, p)));
        }
        Err(BlinkError::Retries(MAX_ATTEMPTS))
    }

    /// Delete `key`: lock, READ, WRITE back + unlock; nodes are never merged. Returns the
    /// removed value. Errors: [`BlinkError`].
    pub async fn delete<M: Mem>(&mut self, mem: &M, key: u64) -> Result<Option<u64>, BlinkError> {
        let (m, mut n) = self.lock_leaf(mem, key).await?;
        let old = match n.keys.binary_search(&key) {
            Ok(i) => {
                n.keys.remove(i);
                let v = n.vals.remove(i);
                self.write_back(mem, &mut [(m, &mut n)], Some(m)).await?;
                Some(v)
            }
            Err(_) => {
                self.unlock(mem, m).await?;
                None
            }
        };
        self.stats.ops += 1;
        Ok(old)
    }
}
