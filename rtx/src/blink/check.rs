//! Structural checker of a quiescent B-link tree (for tests and `index-bench`), and of a
//! quiescent rTX region (no LLLock held, no log left unfinished; rTX 4.3).
//!
//! The tree check READs every node reachable from the root pointer outside any rTX and
//! verifies, level by level: the leftmost node's low fence is 0, each node's high fence
//! equals its right sibling's low fence and the rightmost's is +infinity; keys strictly
//! increase within the fences; levels and leaf bits are consistent; every child of an
//! internal node is a node of the level below whose fences are exactly the entry's range;
//! and the set of nodes reached through parents equals the set reached through the
//! sibling chain from the leftmost node (so no leaf is reachable only one way).

use std::collections::BTreeSet;

use crate::layout::Layout;
use crate::lllock::LockWord;
use crate::log::{Header, LogState};
use crate::mem::{Mem, MemError};

use super::node::{Node, KEY_MAX};
use super::{parse_root, read_raw, ROOT_OBJ};

/// What the checker found wrong, or a failed READ.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// A structural invariant does not hold; the text names the node and the rule.
    #[error("tree invariant broken: {0}")]
    Broken(String),
    /// A READ failed.
    #[error(transparent)]
    Mem(#[from] MemError),
}

fn broken<T>(s: String) -> Result<T, CheckError> {
    Err(CheckError::Broken(s))
}

async fn node<M: Mem>(mem: &M, layout: &Layout, m: u64) -> Result<Node, CheckError> {
    match read_raw(mem, layout, m)
        .await?
        .and_then(|b| Node::decode(&b))
    {
        Some(n) => Ok(n),
        None => broken(format!("mptr {m} is not a node")),
    }
}

/// Check the tree of `layout`'s region (root pointer at object [`ROOT_OBJ`]) while no
/// operation runs. Returns every (key, value) in key order, as the leaf chain holds them.
/// Errors: [`CheckError::Broken`] naming the first violation, [`CheckError::Mem`].
pub async fn check_tree<M: Mem>(mem: &M, layout: &Layout) -> Result<Vec<(u64, u64)>, CheckError> {
    let rb = read_raw(mem, layout, layout.obj_addr(ROOT_OBJ))
        .await?
        .expect("root object formatted");
    let (root, root_level) = parse_root(&rb);
    // Nodes expected at the next level down, from the parents: (mptr, lo, hi).
    let mut expected: Vec<(u64, u64, u64)> = vec![(root, 0, KEY_MAX)];
    let mut out = Vec::new();
    for level in (0..=root_level).rev() {
        // Walk the chain from the leftmost node of this level.
        let mut chain = Vec::new();
        let mut seen = BTreeSet::new();
        let mut m = expected[0].0;
        let mut prev_hi = 0u64;
        loop {
            if !seen.insert(m) {
                return broken(format!("sibling chain of level {level} loops at {m}"));
            }
            let n = node(mem, layout, m).await?;
            if n.level != level || n.leaf != (level == 0) {
                return broken(format!(
                    "node {m} has level {} leaf {} on level {level}",
                    n.level, n.leaf
                ));
            }
            if n.lo != prev_hi {
                return broken(format!(
                    "node {m} on level {level} has low fence {} after a high fence {prev_hi}",
                    n.lo
                ));
            }
            if n.lo >= n.hi {
                return broken(format!("node {m} has fences {} >= {}", n.lo, n.hi));
            }
            let mut last = None;
            for &k in &n.keys {
                if !n.covers(k) || last.is_some_and(|l| l >= k) {
                    return broken(format!("node {m} key {k} out of order or fences"));
                }
                last = Some(k);
            }
            prev_hi = n.hi;
            let next = n.sibling;
            chain.push((m, n));
            if next == 0 {
                break;
            }
            m = next;
        }
        if prev_hi != KEY_MAX {
            return broken(format!("level {level} ends at {prev_hi}, not +infinity"));
        }
        let by_chain: Vec<(u64, u64, u64)> = chain.iter().map(|(m, n)| (*m, n.lo, n.hi)).collect();
        if by_chain != expected {
            return broken(format!(
                "level {level}: nodes by sibling chain {:?} differ from nodes by parents {:?}",
                by_chain, expected
            ));
        }
        expected.clear();
        for (_, n) in &chain {
            if level == 0 {
                out.extend(n.keys.iter().copied().zip(n.vals.iter().copied()));
            } else {
                let mut lo = n.lo;
                let mut child = n.leftmost;
                for (&k, &c) in n.keys.iter().zip(&n.vals) {
                    expected.push((child, lo, k));
                    (lo, child) = (k, c);
                }
                expected.push((child, lo, n.hi));
            }
        }
    }
    Ok(out)
}

/// Check that no object of `layout`'s region is locked and no log slot is left unfinished
/// (every header DONE or never written). Errors: [`CheckError::Broken`] naming the first
/// locked object or unfinished log, [`CheckError::Mem`].
pub async fn check_quiescent<M: Mem>(mem: &M, layout: &Layout) -> Result<(), CheckError> {
    for i in 0..layout.objects {
        let w = mem.read_u64(layout.obj_addr(i)).await?;
        if let LockWord::Locked(s) = LockWord::decode(w) {
            return broken(format!("object {i} still locked by rTX ID {}", s.id));
        }
    }
    for id in 0..layout.ids {
        let w = mem.read_u64(layout.log_addr(id)).await?;
        if w != 0 && Header::decode(w).state != LogState::Done {
            return broken(format!(
                "log of rTX ID {id} left in {:?}",
                Header::decode(w).state
            ));
        }
    }
    Ok(())
}
