//! Bulk loading: a B-link tree built bottom up from sorted entries, as the node images of
//! a region's first objects, for a memory node to format before it serves (a loader's
//! job, as Sherman's benchmarks load their trees; rTX 5 leaves loading open).
//!
//! Leaves take entries in key order, `fill` per leaf (below the capacity, so that the
//! first inserts do not all split); each level above takes the first keys of the level
//! below as separators, `fill` + 1 children per node, until one node is left: the root.
//! Nodes get objects [`FIRST_LEAF_OBJ`] onwards, the root pointer [`ROOT_OBJ`]; the
//! fences, sibling chains and child ranges are exactly what [`super::check::check_tree`]
//! requires, and handles allocate new nodes from [`BulkTree::first_free`] on.

use crate::layout::Layout;

use super::node::{capacity, Node, KEY_MAX};
use super::{root_value, FIRST_FREE_OBJ, FIRST_LEAF_OBJ, ROOT_OBJ};

/// Errors of [`build`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BulkError {
    /// The entries are not strictly increasing, or one is [`KEY_MAX`].
    #[error("bulk load: keys must strictly increase below u64::MAX (at entry {0})")]
    Unsorted(usize),
    /// `fill` is 0 or above a node's capacity.
    #[error("bulk load: fill {fill} outside 1..={cap} entries per node")]
    Fill {
        /// Entries per node asked for.
        fill: usize,
        /// A node's capacity.
        cap: usize,
    },
    /// The region has fewer objects than the tree needs.
    #[error("bulk load: the tree needs {need} objects, the region has {have}")]
    TooBig {
        /// Objects the tree needs (root pointer included).
        need: u64,
        /// Objects of the region.
        have: u64,
    },
}

/// A bulk-loaded tree: the value of each object below [`BulkTree::first_free`].
#[derive(Clone, Debug)]
pub struct BulkTree {
    /// Object `i`'s block (object 0 the root pointer, then the nodes), each
    /// `block_bytes` long.
    pub blocks: Vec<Vec<u8>>,
    /// Level of the root (0: the root is a leaf).
    pub root_level: u8,
}

impl BulkTree {
    /// The first object no node of the tree uses (where handles' ranges may start).
    pub fn first_free(&self) -> u64 {
        (self.blocks.len() as u64).max(FIRST_FREE_OBJ)
    }

    /// Object `i`'s value: its node image, or a zeroed block (a free object) past the
    /// tree.
    pub fn value(&self, i: u64, block_bytes: usize) -> Vec<u8> {
        match self.blocks.get(i as usize) {
            Some(b) => b.clone(),
            None => vec![0u8; block_bytes],
        }
    }
}

/// Objects a tree of `entries` entries at `fill` per node takes (root pointer included):
/// for sizing a region before building. `fill` must be at least 1.
pub fn objects_needed(entries: u64, fill: usize) -> u64 {
    let fill = fill.max(1) as u64;
    let mut nodes = entries.div_ceil(fill).max(1);
    let mut total = nodes;
    while nodes > 1 {
        nodes = nodes.div_ceil(fill + 1);
        total += nodes;
    }
    1 + total
}

/// Build the tree of `entries` (sorted by key, distinct, below [`KEY_MAX`]) with `fill`
/// entries per leaf and `fill` + 1 children per internal node, for `layout`'s region.
/// An empty list gives the empty tree [`super::format_tree`] lays out. Errors:
/// [`BulkError`].
pub fn build(layout: &Layout, entries: &[(u64, u64)], fill: usize) -> Result<BulkTree, BulkError> {
    let bb = layout.block_bytes as usize;
    let cap = capacity(bb);
    // An internal node holds fill separators (fill + 1 children).
    if fill == 0 || fill > cap {
        return Err(BulkError::Fill { fill, cap });
    }
    for (i, w) in entries.windows(2).enumerate() {
        if w[0].0 >= w[1].0 {
            return Err(BulkError::Unsorted(i + 1));
        }
    }
    if entries.last().is_some_and(|e| e.0 == KEY_MAX) {
        return Err(BulkError::Unsorted(entries.len() - 1));
    }
    let need = objects_needed(entries.len() as u64, fill);
    if need > layout.objects {
        return Err(BulkError::TooBig {
            need,
            have: layout.objects,
        });
    }
    let mut nodes: Vec<Node> = Vec::new();
    let mut next_obj = FIRST_LEAF_OBJ;
    // The current level: (object, node) in key order.
    let mut level: Vec<(u64, Node)> = Vec::new();
    let chunks: Vec<&[(u64, u64)]> = if entries.is_empty() {
        vec![&[]]
    } else {
        entries.chunks(fill).collect()
    };
    for (i, c) in chunks.iter().enumerate() {
        let lo = if i == 0 { 0 } else { c[0].0 };
        let mut n = Node::leaf(lo, KEY_MAX);
        n.keys = c.iter().map(|e| e.0).collect();
        n.vals = c.iter().map(|e| e.1).collect();
        level.push((next_obj, n));
        next_obj += 1;
    }
    let mut height = 0u8;
    loop {
        link(layout, &mut level);
        if level.len() == 1 {
            let (root, n) = level.pop().expect("one node");
            nodes.push(n);
            let mut blocks = vec![vec![0u8; bb]; next_obj as usize];
            blocks[ROOT_OBJ as usize] = root_value(bb, layout.obj_addr(root), height);
            // Nodes were pushed level by level in object order: object FIRST_LEAF_OBJ + i.
            for (i, n) in nodes.iter().enumerate() {
                blocks[FIRST_LEAF_OBJ as usize + i] = n.encode(bb);
            }
            return Ok(BulkTree {
                blocks,
                root_level: height,
            });
        }
        height += 1;
        let mut up: Vec<(u64, Node)> = Vec::new();
        for group in level.chunks(fill + 1) {
            let mut n = Node {
                leaf: false,
                level: height,
                lo: group[0].1.lo,
                hi: KEY_MAX,
                leftmost: layout.obj_addr(group[0].0),
                ..Node::default()
            };
            for (obj, child) in &group[1..] {
                n.keys.push(child.lo);
                n.vals.push(layout.obj_addr(*obj));
            }
            up.push((next_obj, n));
            next_obj += 1;
        }
        nodes.extend(level.into_iter().map(|(_, n)| n));
        level = up;
    }
}

/// Set the high fences and sibling pointers of one level (in key order).
fn link(layout: &Layout, level: &mut [(u64, Node)]) {
    for i in 0..level.len() {
        let next = level.get(i + 1).map(|(o, n)| (layout.obj_addr(*o), n.lo));
        let n = &mut level[i].1;
        match next {
            Some((m, lo)) => {
                n.hi = lo;
                n.sibling = m;
            }
            None => {
                n.hi = KEY_MAX;
                n.sibling = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use futures::executor::block_on;

    use super::super::check::{check_quiescent, check_tree};
    use super::super::tests::{client, layout};
    use super::super::Blink;
    use super::*;
    use crate::layout::format;
    use crate::lease::ManualClock;
    use crate::mem::LocalMem;

    /// Build, format, check the structure; then insert (splitting bulk-built leaves and
    /// internal nodes), delete and scan against a `BTreeMap`, and check again.
    fn built_then_used(n: u64, fill: usize, block_bytes: u64) {
        let l = layout(block_bytes);
        let entries: Vec<(u64, u64)> = (0..n).map(|i| (i * 10, i)).collect();
        let tree = build(&l, &entries, fill).unwrap();
        assert!(tree.first_free() <= objects_needed(n, fill).max(FIRST_FREE_OBJ));
        let m = LocalMem::new(l.total_bytes() as usize);
        let bb = block_bytes as usize;
        block_on(format(&l, &m, 7, |i| tree.value(i, bb))).unwrap();
        let got = block_on(check_tree(&m, &l)).unwrap();
        assert_eq!(got, entries, "n {n} fill {fill}");
        let clock = ManualClock::new(1_800_000_000_000);
        let mut c = client(&l, 0, &clock);
        let mut t = Blink::new(l, tree.first_free()..l.objects);
        let mut oracle: BTreeMap<u64, u64> = entries.iter().copied().collect();
        block_on(async {
            for i in 0..n {
                let k = i * 10 + 5;
                assert_eq!(t.insert(&mut c, &m, k, k).await.unwrap(), None);
                oracle.insert(k, k);
                if i % 3 == 0 {
                    assert_eq!(t.delete(&mut c, &m, i * 10).await.unwrap(), Some(i));
                    oracle.remove(&(i * 10));
                }
            }
            for from in [0, 7, n * 5, n * 10] {
                let want: Vec<(u64, u64)> = oracle
                    .range(from..)
                    .take(40)
                    .map(|(&k, &v)| (k, v))
                    .collect();
                assert_eq!(t.scan(&mut c, &m, from, 40).await.unwrap(), want);
            }
        });
        let got = block_on(check_tree(&m, &l)).unwrap();
        assert_eq!(got, oracle.into_iter().collect::<Vec<_>>());
        block_on(check_quiescent(&m, &l)).unwrap();
    }

    #[test]
    fn bulk_built_trees_pass_the_checker_and_take_inserts_splits_and_scans() {
        // Empty, one leaf, a leaf root that is full, two and three levels.
        for (n, fill, bb) in [
            (0, 4, 128),
            (3, 4, 128),
            (5, 5, 128),
            (40, 4, 128),
            (300, 3, 128),
            (500, 45, 1024),
        ] {
            built_then_used(n, fill, bb);
        }
    }

    #[test]
    fn batches_land_in_one_leaf_or_fall_back_to_single_inserts() {
        let l = layout(128);
        // 5-entry leaves at 3 per leaf: keys 0, 10, 20 | 30, 40, 50 | ...
        let entries: Vec<(u64, u64)> = (0..30).map(|i| (i * 10, i)).collect();
        let tree = build(&l, &entries, 3).unwrap();
        let m = LocalMem::new(l.total_bytes() as usize);
        block_on(format(&l, &m, 7, |i| tree.value(i, 128))).unwrap();
        let clock = ManualClock::new(1_800_000_000_000);
        let mut c = client(&l, 0, &clock);
        let mut t = Blink::new(l, tree.first_free()..l.objects);
        let mut oracle: BTreeMap<u64, u64> = entries.iter().copied().collect();
        let batches: [&[(u64, u64)]; 4] = [
            // Fits the leaf [30, 60): one rTX, no log.
            &[(31, 1), (32, 2)],
            // Spans leaves [60, 90) and [90, 120).
            &[(61, 1), (91, 2)],
            // Overflows the leaf [120, 150) (3 + 3 > 5): split, one by one.
            &[(121, 1), (122, 2), (123, 3)],
            // Updates of present keys.
            &[(0, 7), (10, 8)],
        ];
        block_on(async {
            for (i, b) in batches.iter().enumerate() {
                let logs = c.stats().log_writes;
                t.insert_batch(&mut c, &m, b).await.unwrap();
                oracle.extend(b.iter().copied());
                if i == 0 {
                    assert_eq!(c.stats().log_writes, logs, "one leaf, Opt1: no log");
                }
            }
        });
        assert!(
            t.stats().splits >= 1,
            "the overflowing batch split its leaf"
        );
        // A conditional delete leaves an entry written anew since.
        block_on(async {
            assert!(!t.delete_if(&mut c, &m, 0, 99).await.unwrap());
            assert!(t.delete_if(&mut c, &m, 10, 8).await.unwrap());
            assert!(!t.delete_if(&mut c, &m, 10, 8).await.unwrap(), "gone");
        });
        oracle.remove(&10);
        let got = block_on(check_tree(&m, &l)).unwrap();
        assert_eq!(got, oracle.into_iter().collect::<Vec<_>>());
        block_on(check_quiescent(&m, &l)).unwrap();
    }

    #[test]
    fn bad_input_is_refused() {
        let l = layout(128);
        assert_eq!(
            build(&l, &[(2, 0), (1, 0)], 4).unwrap_err(),
            BulkError::Unsorted(1)
        );
        assert_eq!(
            build(&l, &[(KEY_MAX, 0)], 4).unwrap_err(),
            BulkError::Unsorted(0)
        );
        assert!(matches!(
            build(&l, &[(1, 0)], 0).unwrap_err(),
            BulkError::Fill { .. }
        ));
        let many: Vec<(u64, u64)> = (0..100_000).map(|i| (i, 0)).collect();
        assert!(matches!(
            build(&l, &many, 2).unwrap_err(),
            BulkError::TooBig { .. }
        ));
    }
}
