//! A Sherman-style B-link tree whose nodes are rTX objects (Transactional Indexes on
//! Disaggregated Memory with Repairable Transaction, 5 "B-link tree"; Sherman, SIGMOD 22).
//!
//! Every node ([`node::Node`], one data block, 1 KB in the paper) is a TXObj; child and
//! sibling pointers are TXObj offsets (mptrs). A fixed object holds the root pointer
//! (root mptr, root level). Every operation runs as one rTX of the crate:
//!
//! - lookup, update, insert without split, delete: the leaf is the only object read (and
//!   written), so a write commits by Opt1 (logging elision, 4.5); with
//!   [`Blink::pre_lock`] the leaf is pre-locked instead (Opt2), which writes a log header;
//! - a leaf split allocates the sibling (a free object from this handle's range) and
//!   writes leaf + sibling + parent in one logged rTX, cascading up the levels, and a new
//!   root updates the root-pointer object in that same rTX;
//! - scan reads leaves along the sibling chain in one read-only rTX.
//!
//! Internal nodes are read outside the rTX (one-sided READs of the TXObj then the block)
//! and cached at the handle, as Sherman does. A stale or torn copy only misroutes to a node
//! left of the right one: fences detect it, the search moves right along siblings (the
//! B-link rule), or restarts from a re-read root when the key is left of the low fence.
//! Leaves, and the parents a split changes, are read inside the rTX, so validation at
//! commit covers every node the operation depends on. Nodes are never merged or freed
//! (deletes leave nodes in place, as in Sherman), so every cached pointer stays a node.

pub mod bulk;
pub mod check;
pub mod node;
pub mod optimal;

#[cfg(test)]
mod shm_tests;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::ops::Range;

use crate::dptr::Dptr;
use crate::error::RtxError;
use crate::layout::{dptr_addr, format, Layout};
use crate::lease::Clock;
use crate::mem::{Mem, MemError};
use crate::txn::Tx;
use crate::Client;
use node::{capacity, Node, KEY_MAX};

/// Object index of the root pointer in a region laid out by [`format_tree`].
pub const ROOT_OBJ: u64 = 0;
/// Object index of the first (initially root) leaf.
pub const FIRST_LEAF_OBJ: u64 = 1;
/// First object index free for node allocation.
pub const FIRST_FREE_OBJ: u64 = 2;
/// Attempts (aborts and restarts) of one operation before [`BlinkError::Retries`].
pub const MAX_ATTEMPTS: u32 = 100_000;

/// Errors of tree operations.
#[derive(Debug, thiserror::Error)]
pub enum BlinkError {
    /// An rTX failed other than by abort (aborts are retried): a memory error leaves the
    /// outcome unknown, to be finished by repair.
    #[error(transparent)]
    Rtx(#[from] RtxError),
    /// A one-sided READ outside the rTX failed.
    #[error(transparent)]
    Mem(#[from] MemError),
    /// The handle's object range has no free object left for a new node.
    #[error("no free object left in this handle's range")]
    OutOfObjects,
    /// The operation aborted or restarted [`MAX_ATTEMPTS`] times.
    #[error("operation gave up after {0} attempts")]
    Retries(u32),
}

/// The value of the root-pointer object: word 0 the root's mptr, word 1 its level.
pub fn root_value(block_bytes: usize, root: u64, level: u8) -> Vec<u8> {
    let mut b = vec![0u8; block_bytes];
    b[..8].copy_from_slice(&root.to_le_bytes());
    b[8..16].copy_from_slice(&(level as u64).to_le_bytes());
    b
}

fn parse_root(b: &[u8]) -> (u64, u8) {
    (
        u64::from_le_bytes(b[..8].try_into().expect("8 bytes")),
        u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")) as u8,
    )
}

/// Format a zeroed region as an empty tree: [`ROOT_OBJ`] points at [`FIRST_LEAF_OBJ`], an
/// empty leaf covering every key; every other object is free (a zero block). Object `i`
/// gets block `i` ([`crate::layout::format`], blocks claimed for rTX ID `loader`).
/// Errors: the first failed WRITE.
pub async fn format_tree<M: Mem>(layout: &Layout, mem: &M, loader: u16) -> Result<(), MemError> {
    let bb = layout.block_bytes as usize;
    let first_leaf = layout.obj_addr(FIRST_LEAF_OBJ);
    format(layout, mem, loader, |i| match i {
        ROOT_OBJ => root_value(bb, first_leaf, 0),
        FIRST_LEAF_OBJ => Node::leaf(0, KEY_MAX).encode(bb),
        _ => vec![0u8; bb],
    })
    .await
}

/// Turn a region freshly formatted by [`crate::host::host`] (object `i` holding block `i`,
/// zero values) into an empty tree, as [`format_tree`] lays it out: WRITE the root pointer
/// into [`ROOT_OBJ`]'s block and an empty leaf into [`FIRST_LEAF_OBJ`]'s (two WRITEs of
/// one block each). Run once, before any operation. Errors: the first failed WRITE.
pub async fn init_hosted<M: Mem>(layout: &Layout, mem: &M) -> Result<(), MemError> {
    let bb = layout.block_bytes as usize;
    let first_leaf = layout.obj_addr(FIRST_LEAF_OBJ);
    mem.write(layout.block_addr(ROOT_OBJ), &root_value(bb, first_leaf, 0))
        .await?;
    mem.write(
        layout.block_addr(FIRST_LEAF_OBJ),
        &Node::leaf(0, KEY_MAX).encode(bb),
    )
    .await
}

/// READ an object's current value outside any rTX: its dptr word, then its block (16 + 1 K
/// bytes, two round trips). Errors: [`MemError`]; a null dptr reads as `None`.
pub async fn read_raw<M: Mem>(
    mem: &M,
    layout: &Layout,
    mptr: u64,
) -> Result<Option<Vec<u8>>, MemError> {
    let Some(d) = Dptr::decode(mem.read_u64(dptr_addr(mptr)).await?) else {
        return Ok(None);
    };
    if d.block >= layout.blocks {
        return Ok(None);
    }
    let b = mem
        .read(layout.block_addr(d.block), layout.block_bytes as usize)
        .await?;
    Ok(Some(b))
}

/// Counters of one handle.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlinkStats {
    /// Operations completed.
    pub ops: u64,
    /// rTX aborts retried.
    pub aborts: u64,
    /// Restarts from the root (stale cache or root).
    pub restarts: u64,
    /// Node splits committed (leaves and internal nodes).
    pub splits: u64,
    /// New roots committed.
    pub root_growths: u64,
}

/// Test-only switches that break the tree on purpose, so the checkers can be shown to
/// catch them.
#[cfg(test)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Planted {
    /// A split forgets to point the left node at its new sibling.
    pub(crate) no_sibling_link: bool,
    /// A leaf split leaves the parent unchanged (the sibling only reachable sideways).
    pub(crate) no_parent_update: bool,
}

/// One client's handle on a B-link tree in an rTX region: its internal-node cache and the
/// range of objects it allocates new nodes from (disjoint between handles). Operations
/// take the client whose rTXs they run and the memory node.
#[derive(Debug)]
pub struct Blink {
    layout: Layout,
    root_obj: u64,
    root: Option<(u64, u8)>,
    cache: HashMap<u64, Node>,
    next_obj: u64,
    end_obj: u64,
    cap: usize,
    /// Opt2 (4.5): pre-lock the leaf of an insert, update or delete during execution.
    /// Off by default: a pre-lock writes a log header, while Opt1 writes no log for a
    /// single-leaf update.
    pub pre_lock: bool,
    stats: BlinkStats,
    #[cfg(test)]
    pub(crate) planted: Planted,
}

/// What a split rTX changed, applied to the handle once it committed.
#[derive(Default)]
struct Applied {
    internal: Vec<(u64, Node)>,
    new_root: Option<(u64, u8)>,
    cursor: u64,
    splits: u64,
}

impl Blink {
    /// A handle on the tree formatted by [`format_tree`] in `layout`'s region, allocating
    /// new nodes from object indices `objs` (disjoint from every other handle's, within
    /// [`FIRST_FREE_OBJ`]..`layout.objects`).
    pub fn new(layout: Layout, objs: Range<u64>) -> Self {
        assert!(objs.start >= FIRST_FREE_OBJ && objs.end <= layout.objects);
        Self {
            layout,
            root_obj: layout.obj_addr(ROOT_OBJ),
            root: None,
            cache: HashMap::new(),
            next_obj: objs.start,
            end_obj: objs.end,
            cap: capacity(layout.block_bytes as usize),
            pre_lock: false,
            stats: BlinkStats::default(),
            #[cfg(test)]
            planted: Planted::default(),
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> BlinkStats {
        self.stats
    }

    /// Whether the handle's object range is used up (an insert that must split then
    /// fails with [`BlinkError::OutOfObjects`]).
    pub fn out_of_objects(&self) -> bool {
        self.next_obj >= self.end_obj
    }

    /// Allocate new nodes from `objs` from now on (disjoint from every other handle's
    /// range, within [`FIRST_FREE_OBJ`]..`layout.objects`): a handle whose range is used
    /// up takes a fresh one.
    pub fn set_objects(&mut self, objs: Range<u64>) {
        assert!(objs.start >= FIRST_FREE_OBJ && objs.end <= self.layout.objects);
        self.next_obj = objs.start;
        self.end_obj = objs.end;
    }

    fn invalidate(&mut self) {
        self.root = None;
        self.cache.clear();
        self.stats.restarts += 1;
    }

    async fn root<M: Mem>(&mut self, mem: &M) -> Result<(u64, u8), MemError> {
        if let Some(r) = self.root {
            return Ok(r);
        }
        let b = read_raw(mem, &self.layout, self.root_obj)
            .await?
            .expect("the root object is formatted");
        let r = parse_root(&b);
        self.root = Some(r);
        Ok(r)
    }

    async fn internal<M: Mem>(&mut self, mem: &M, mptr: u64) -> Result<Option<Node>, MemError> {
        if let Some(n) = self.cache.get(&mptr) {
            return Ok(Some(n.clone()));
        }
        let n = read_raw(mem, &self.layout, mptr)
            .await?
            .and_then(|b| Node::decode(&b))
            .filter(|n| !n.leaf);
        if let Some(n) = &n {
            self.cache.insert(mptr, n.clone());
        }
        Ok(n)
    }

    /// Descend from the (cached) root to the leaf level: a leaf mptr at or left of the
    /// leaf covering `key`, and the internal node visited at each level (`path[l]`, 0 for
    /// the leaf level). `None`: a stale cache or root was detected (caller restarts).
    async fn locate<M: Mem>(
        &mut self,
        mem: &M,
        key: u64,
    ) -> Result<Option<(u64, Vec<u64>)>, MemError> {
        let (mut m, rl) = self.root(mem).await?;
        let mut path = vec![0u64; rl as usize + 1];
        let mut level = rl;
        while level > 0 {
            let Some(n) = self.internal(mem, m).await? else {
                return Ok(None);
            };
            if n.level != level || key < n.lo {
                return Ok(None);
            }
            if key >= n.hi {
                if n.sibling == 0 {
                    return Ok(None);
                }
                m = n.sibling;
                continue;
            }
            path[level as usize] = m;
            m = n.child(key);
            level -= 1;
        }
        Ok(Some((m, path)))
    }

    /// How an update reads the leaf it writes: pre-locked (Opt2, [`Blink::pre_lock`]) or
    /// read after waiting out a live holder's lock.
    fn update_access(&self) -> Access {
        if self.pre_lock {
            Access::PreLock
        } else {
            Access::Update
        }
    }

    /// Read `m` in the rTX, moving right until a node of `level` covers `key`. `None`: the
    /// node is not of that level or `key` is left of it (restart).
    async fn node_in_tx<C: Clock, M: Mem>(
        &mut self,
        tx: &mut Tx<'_, C>,
        mem: &M,
        mut m: u64,
        key: u64,
        level: u8,
        access: Access,
    ) -> Result<Option<(u64, Node)>, RtxError> {
        let first_pre_lock = access == Access::PreLock;
        let mut first = true;
        let mut steps = 0usize;
        loop {
            // A walk right never meets more nodes than a level has; values read earlier
            // in the rTX are served from its read set, so a walk over inconsistent ones
            // could cycle without a single READ: restart instead (validation would have
            // aborted it anyway).
            steps += 1;
            if steps > self.layout.objects as usize {
                return Ok(None);
            }
            let b = match access {
                Access::PreLock if first => tx.pre_lock(mem, m).await?,
                Access::Update => tx.read_for_update(mem, m).await?,
                _ => tx.read(mem, m).await?,
            };
            first = false;
            let Some(n) = Node::decode(&b) else {
                return Ok(None);
            };
            if n.level != level || n.leaf != (level == 0) || key < n.lo {
                return Ok(None);
            }
            if key >= n.hi {
                if n.sibling == 0 || first_pre_lock {
                    // A pre-locked leaf that does not cover the key: retry from the
                    // sibling later (one pre-lock per rTX).
                    self.cache.remove(&m);
                    return Ok(None);
                }
                m = n.sibling;
                continue;
            }
            if level > 0 {
                self.cache.insert(m, n.clone());
            }
            return Ok(Some((m, n)));
        }
    }

    /// A free object for a new node, read in the rTX (so a concurrent use of it aborts
    /// this rTX), from the handle's range starting at `cursor`.
    async fn take_obj<C: Clock, M: Mem>(
        &self,
        tx: &mut Tx<'_, C>,
        mem: &M,
        cursor: &mut u64,
    ) -> Result<u64, BlinkError> {
        while *cursor < self.end_obj {
            let m = self.layout.obj_addr(*cursor);
            *cursor += 1;
            if Node::decode(&tx.read(mem, m).await?).is_none() {
                return Ok(m);
            }
        }
        Err(BlinkError::OutOfObjects)
    }

    /// Run `op` until it commits, retrying aborts and restarts.
    async fn drive<T, F>(&mut self, mut op: F) -> Result<T, BlinkError>
    where
        F: AsyncAttempt<T>,
    {
        for _ in 0..MAX_ATTEMPTS {
            match op.attempt(self).await {
                Ok(Some(r)) => {
                    self.stats.ops += 1;
                    return Ok(r);
                }
                Ok(None) => self.invalidate(),
                Err(BlinkError::Rtx(RtxError::Aborted(_))) => self.stats.aborts += 1,
                Err(e) => return Err(e),
            }
        }
        Err(BlinkError::Retries(MAX_ATTEMPTS))
    }

    /// Look `key` up (rTX, 5): one read-only rTX reading the leaf. Returns its value.
    /// Errors: [`BlinkError`].
    pub async fn lookup<C: Clock, M: Mem>(
        &mut self,
        c: &mut Client<C>,
        mem: &M,
        key: u64,
    ) -> Result<Option<u64>, BlinkError> {
        self.drive(Lookup { c, mem, key }).await
    }

    /// Insert `key` or update its value (rTX, 5): one rTX writing the leaf (Opt1, no log),
    /// or on overflow leaf + new sibling + parent(s) (+ new root and root pointer), logged.
    /// Returns the previous value. Panics if `key` is [`KEY_MAX`]. Errors: [`BlinkError`].
    pub async fn insert<C: Clock, M: Mem>(
        &mut self,
        c: &mut Client<C>,
        mem: &M,
        key: u64,
        val: u64,
    ) -> Result<Option<u64>, BlinkError> {
        assert!(key < KEY_MAX, "key {key} reserved for the +infinity fence");
        self.drive(Insert { c, mem, key, val }).await
    }

    /// Insert (or update) `entries`, sorted by key and distinct: when they all fall in
    /// one leaf and fit there, as one rTX writing that leaf (Opt1, no log), else one
    /// [`Self::insert`] each. Adjacent keys, such as an order's lines, usually share a
    /// leaf. Panics if a key is [`KEY_MAX`] or the keys are not increasing. Errors:
    /// [`BlinkError`]; entries inserted before the error stay.
    pub async fn insert_batch<C: Clock, M: Mem>(
        &mut self,
        c: &mut Client<C>,
        mem: &M,
        entries: &[(u64, u64)],
    ) -> Result<(), BlinkError> {
        assert!(
            entries.windows(2).all(|w| w[0].0 < w[1].0),
            "batch keys must increase"
        );
        match entries {
            [] => return Ok(()),
            [(k, v)] => return self.insert(c, mem, *k, *v).await.map(drop),
            _ => {}
        }
        assert!(entries.iter().all(|e| e.0 < KEY_MAX), "key reserved");
        if self.drive(Batch { c, mem, entries }).await? {
            return Ok(());
        }
        for &(k, v) in entries {
            self.insert(c, mem, k, v).await?;
        }
        Ok(())
    }

    /// Delete `key` (rTX, 5): one rTX writing the leaf (Opt1); nodes are never merged.
    /// Returns the removed value. Errors: [`BlinkError`].
    pub async fn delete<C: Clock, M: Mem>(
        &mut self,
        c: &mut Client<C>,
        mem: &M,
        key: u64,
    ) -> Result<Option<u64>, BlinkError> {
        self.drive(Delete {
            c,
            mem,
            key,
            only_if: None,
        })
        .await
    }

    /// Delete `key` only if its value is `val` (one rTX, as [`Self::delete`]): an entry
    /// written anew since `val` was read stays. Returns whether it was deleted. Errors:
    /// [`BlinkError`].
    pub async fn delete_if<C: Clock, M: Mem>(
        &mut self,
        c: &mut Client<C>,
        mem: &M,
        key: u64,
        val: u64,
    ) -> Result<bool, BlinkError> {
        let old = self
            .drive(Delete {
                c,
                mem,
                key,
                only_if: Some(val),
            })
            .await?;
        Ok(old.is_some())
    }

    /// Up to `count` entries with keys >= `from`, in key order, following the leaves'
    /// sibling chain (rTX, 5), in one read-only rTX. Errors: [`BlinkError`].
    pub async fn scan<C: Clock, M: Mem>(
        &mut self,
        c: &mut Client<C>,
        mem: &M,
        from: u64,
        count: usize,
    ) -> Result<Vec<(u64, u64)>, BlinkError> {
        self.drive(Scan {
            c,
            mem,
            from,
            count,
        })
        .await
    }

    /// Finish the rTX of an attempt: commit on `Some`, abort on `None` or an abort error.
    async fn finish<C: Clock, M: Mem, T>(
        tx: Tx<'_, C>,
        mem: &M,
        r: Result<Option<T>, BlinkError>,
    ) -> Result<Option<T>, BlinkError> {
        match r {
            Ok(Some(v)) => {
                tx.commit(mem).await?;
                Ok(Some(v))
            }
            Ok(None) => {
                tx.abort(mem).await?;
                Ok(None)
            }
            Err(e @ (BlinkError::Rtx(RtxError::Aborted(_)) | BlinkError::OutOfObjects)) => {
                tx.abort(mem).await?;
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    async fn insert_in<C: Clock, M: Mem>(
        &mut self,
        tx: &mut Tx<'_, C>,
        mem: &M,
        hint: u64,
        path: &[u64],
        key: u64,
        val: u64,
    ) -> Result<Option<(Option<u64>, Applied)>, BlinkError> {
        let bb = self.layout.block_bytes as usize;
        let Some((m, mut n)) = self
            .node_in_tx(tx, mem, hint, key, 0, self.update_access())
            .await?
        else {
            return Ok(None);
        };
        let old = n.upsert(key, val);
        let mut applied = Applied {
            cursor: self.next_obj,
            ..Applied::default()
        };
        if n.keys.len() <= self.cap {
            tx.write(mem, m, n.encode(bb)).await?;
            return Ok(Some((old, applied)));
        }
        // Split: leaf + sibling + parent(s) in this rTX (logged).
        let mut cursor = self.next_obj;
        let rm = self.take_obj(tx, mem, &mut cursor).await?;
        let link = {
            #[cfg(test)]
            {
                !self.planted.no_sibling_link
            }
            #[cfg(not(test))]
            {
                true
            }
        };
        let (mut sep, right) = n.split(rm, link);
        tx.write(mem, m, n.encode(bb)).await?;
        tx.write(mem, rm, right.encode(bb)).await?;
        applied.splits += 1;
        let (mut left_m, mut right_m) = (m, rm);
        let mut level = 1u8;
        #[cfg(test)]
        if self.planted.no_parent_update {
            applied.cursor = cursor;
            return Ok(Some((old, applied)));
        }
        loop {
            let pm = path.get(level as usize).copied().unwrap_or(0);
            if pm == 0 {
                // `left_m` was the root as far as this handle knows: grow a new root.
                let (root, rl) = parse_root(&tx.read(mem, self.root_obj).await?);
                if root != left_m || rl + 1 != level {
                    return Ok(None);
                }
                let nr = self.take_obj(tx, mem, &mut cursor).await?;
                let new_root = Node {
                    leaf: false,
                    level,
                    lo: 0,
                    hi: KEY_MAX,
                    leftmost: left_m,
                    keys: vec![sep],
                    vals: vec![right_m],
                    ..Node::default()
                };
                tx.write(mem, nr, new_root.encode(bb)).await?;
                tx.write(mem, self.root_obj, root_value(bb, nr, level))
                    .await?;
                applied.internal.push((nr, new_root));
                applied.new_root = Some((nr, level));
                break;
            }
            let Some((pm, mut p)) = self
                .node_in_tx(tx, mem, pm, sep, level, Access::Update)
                .await?
            else {
                return Ok(None);
            };
            p.upsert(sep, right_m);
            if p.keys.len() <= self.cap {
                tx.write(mem, pm, p.encode(bb)).await?;
                applied.internal.push((pm, p));
                break;
            }
            let nm = self.take_obj(tx, mem, &mut cursor).await?;
            let (s2, r2) = p.split(nm, link);
            tx.write(mem, pm, p.encode(bb)).await?;
            tx.write(mem, nm, r2.encode(bb)).await?;
            applied.internal.push((pm, p));
            applied.internal.push((nm, r2));
            applied.splits += 1;
            (left_m, right_m, sep) = (pm, nm, s2);
            level += 1;
        }
        applied.cursor = cursor;
        Ok(Some((old, applied)))
    }

    fn apply(&mut self, a: Applied) {
        for (m, n) in a.internal {
            self.cache.insert(m, n);
        }
        if let Some(r) = a.new_root {
            self.root = Some(r);
            self.stats.root_growths += 1;
        }
        self.next_obj = self.next_obj.max(a.cursor);
        self.stats.splits += a.splits;
    }
}

/// How [`Blink::node_in_tx`] reads the nodes it walks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Access {
    /// [`Tx::read`] (lookups and scans).
    Read,
    /// [`Tx::read_for_update`]: nodes the rTX will write.
    Update,
    /// [`Tx::pre_lock`] for the first node (Opt2), which must cover the key.
    PreLock,
}

/// One attempt of an operation: `Ok(None)` asks for a restart from a fresh root.
trait AsyncAttempt<T> {
    async fn attempt(&mut self, t: &mut Blink) -> Result<Option<T>, BlinkError>;
}

struct Lookup<'a, C, M> {
    c: &'a mut Client<C>,
    mem: &'a M,
    key: u64,
}

impl<C: Clock, M: Mem> AsyncAttempt<Option<u64>> for Lookup<'_, C, M> {
    async fn attempt(&mut self, t: &mut Blink) -> Result<Option<Option<u64>>, BlinkError> {
        let Some((hint, _)) = t.locate(self.mem, self.key).await? else {
            return Ok(None);
        };
        let mut tx = self.c.begin();
        let r = t
            .node_in_tx(&mut tx, self.mem, hint, self.key, 0, Access::Read)
            .await
            .map(|o| o.map(|(_, n)| n.keys.binary_search(&self.key).ok().map(|i| n.vals[i])))
            .map_err(BlinkError::from);
        Blink::finish(tx, self.mem, r).await
    }
}

struct Insert<'a, C, M> {
    c: &'a mut Client<C>,
    mem: &'a M,
    key: u64,
    val: u64,
}

impl<C: Clock, M: Mem> AsyncAttempt<Option<u64>> for Insert<'_, C, M> {
    async fn attempt(&mut self, t: &mut Blink) -> Result<Option<Option<u64>>, BlinkError> {
        let Some((hint, path)) = t.locate(self.mem, self.key).await? else {
            return Ok(None);
        };
        let mut tx = self.c.begin();
        let r = t
            .insert_in(&mut tx, self.mem, hint, &path, self.key, self.val)
            .await;
        match Blink::finish(tx, self.mem, r).await? {
            Some((old, applied)) => {
                t.apply(applied);
                Ok(Some(old))
            }
            None => Ok(None),
        }
    }
}

/// One leaf taking a whole batch, or `false` when the batch spans leaves or would split
/// the leaf (the caller then inserts one by one).
struct Batch<'a, C, M> {
    c: &'a mut Client<C>,
    mem: &'a M,
    entries: &'a [(u64, u64)],
}

impl<C: Clock, M: Mem> AsyncAttempt<bool> for Batch<'_, C, M> {
    async fn attempt(&mut self, t: &mut Blink) -> Result<Option<bool>, BlinkError> {
        let first = self.entries[0].0;
        let last = self.entries[self.entries.len() - 1].0;
        let Some((hint, _)) = t.locate(self.mem, first).await? else {
            return Ok(None);
        };
        let bb = t.layout.block_bytes as usize;
        let mut tx = self.c.begin();
        let r = async {
            let Some((m, mut n)) = t
                .node_in_tx(&mut tx, self.mem, hint, first, 0, t.update_access())
                .await?
            else {
                return Ok(None);
            };
            if last >= n.hi {
                return Ok(Some(false));
            }
            for &(k, v) in self.entries {
                n.upsert(k, v);
            }
            if n.keys.len() > t.cap {
                return Ok(Some(false));
            }
            tx.write(self.mem, m, n.encode(bb)).await?;
            Ok::<_, BlinkError>(Some(true))
        }
        .await;
        Blink::finish(tx, self.mem, r).await
    }
}

struct Delete<'a, C, M> {
    c: &'a mut Client<C>,
    mem: &'a M,
    key: u64,
    /// Delete only an entry of this value.
    only_if: Option<u64>,
}

impl<C: Clock, M: Mem> AsyncAttempt<Option<u64>> for Delete<'_, C, M> {
    async fn attempt(&mut self, t: &mut Blink) -> Result<Option<Option<u64>>, BlinkError> {
        let Some((hint, _)) = t.locate(self.mem, self.key).await? else {
            return Ok(None);
        };
        let bb = t.layout.block_bytes as usize;
        let mut tx = self.c.begin();
        let r = async {
            let Some((m, mut n)) = t
                .node_in_tx(&mut tx, self.mem, hint, self.key, 0, t.update_access())
                .await?
            else {
                return Ok(None);
            };
            let Ok(i) = n.keys.binary_search(&self.key) else {
                return Ok(Some(None));
            };
            if self.only_if.is_some_and(|v| v != n.vals[i]) {
                return Ok(Some(None));
            }
            n.keys.remove(i);
            let old = n.vals.remove(i);
            tx.write(self.mem, m, n.encode(bb)).await?;
            Ok::<_, BlinkError>(Some(Some(old)))
        }
        .await;
        Blink::finish(tx, self.mem, r).await
    }
}

struct Scan<'a, C, M> {
    c: &'a mut Client<C>,
    mem: &'a M,
    from: u64,
    count: usize,
}

impl<C: Clock, M: Mem> AsyncAttempt<Vec<(u64, u64)>> for Scan<'_, C, M> {
    async fn attempt(&mut self, t: &mut Blink) -> Result<Option<Vec<(u64, u64)>>, BlinkError> {
        let Some((hint, _)) = t.locate(self.mem, self.from).await? else {
            return Ok(None);
        };
        let mut tx = self.c.begin();
        let r = async {
            let Some((_, mut n)) = t
                .node_in_tx(&mut tx, self.mem, hint, self.from, 0, Access::Read)
                .await?
            else {
                return Ok(None);
            };
            let mut out = Vec::new();
            loop {
                for (&k, &v) in n.keys.iter().zip(&n.vals) {
                    if k >= self.from && out.len() < self.count {
                        out.push((k, v));
                    }
                }
                if out.len() >= self.count || n.sibling == 0 {
                    return Ok(Some(out));
                }
                match Node::decode(&tx.read(self.mem, n.sibling).await?) {
                    Some(s) if s.leaf && s.lo == n.hi => n = s,
                    _ => return Ok::<_, BlinkError>(None),
                }
            }
        }
        .await;
        Blink::finish(tx, self.mem, r).await
    }
}
