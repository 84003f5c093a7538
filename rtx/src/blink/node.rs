//! The B-link tree node (Sherman, "Sherman: A Write-Optimized Distributed B+Tree Index on
//! Disaggregated Memory", 3; rTX 5): one data block of the layout's block size (1 KB in
//! the paper), little-endian u64 words.
//!
//! ```text
//! word 0   flags: bit 0 used, bit 1 leaf, bits 8..16 level, bits 16..32 count,
//!          bits 32..64 front version (Optimal's torn-read check; rTX leaves it 0)
//! word 1   low fence (inclusive)
//! word 2   high fence (exclusive; u64::MAX = +infinity)
//! word 3   right sibling's mptr (0 = none)
//! word 4   leftmost child's mptr (internal nodes; 0 in leaves)
//! 40..     count entries of (key, value) in leaves, (key, child mptr) in internal nodes,
//!          sorted by key; child i covers [key i, key i+1)
//! last     rear version (equals the front version in a node written whole)
//! ```
//!
//! Keys are u64 below [`KEY_MAX`]; a node with its used bit clear is a free object.

/// Keys must be below this (u64::MAX is the +infinity fence).
pub const KEY_MAX: u64 = u64::MAX;
/// Bytes before the first entry.
pub const HEADER_BYTES: usize = 40;
/// Bytes of one entry (key, value or child).
pub const ENTRY_BYTES: usize = 16;

/// Entries a node of `block_bytes` holds: (block - header - rear version) / 16; 61 for
/// 1 KB nodes.
pub fn capacity(block_bytes: usize) -> usize {
    (block_bytes - HEADER_BYTES - 8) / ENTRY_BYTES
}

/// A decoded node.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Node {
    /// Leaf (entries hold values) or internal (entries hold children).
    pub leaf: bool,
    /// 0 for leaves, parents one more than their children.
    pub level: u8,
    /// Low fence, inclusive.
    pub lo: u64,
    /// High fence, exclusive ([`KEY_MAX`] = +infinity).
    pub hi: u64,
    /// Right sibling's mptr, 0 for the rightmost node of a level.
    pub sibling: u64,
    /// Internal nodes: child covering [lo, first key).
    pub leftmost: u64,
    /// Sorted keys.
    pub keys: Vec<u64>,
    /// Values (leaves) or child mptrs (internal), one per key.
    pub vals: Vec<u64>,
    /// Optimal's version (front and rear words); rTX leaves it 0.
    pub version: u32,
}

fn word(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"))
}

impl Node {
    /// An empty leaf covering [lo, hi).
    pub fn leaf(lo: u64, hi: u64) -> Self {
        Self {
            leaf: true,
            lo,
            hi,
            ..Self::default()
        }
    }

    /// Whether `key` lies within the fences.
    pub fn covers(&self, key: u64) -> bool {
        self.lo <= key && key < self.hi
    }

    /// Encode into a block of `block_bytes`. Panics if the entries do not fit.
    pub fn encode(&self, block_bytes: usize) -> Vec<u8> {
        assert!(self.keys.len() <= capacity(block_bytes), "node overflow");
        assert_eq!(self.keys.len(), self.vals.len());
        let mut b = vec![0u8; block_bytes];
        let flags = 1
            | (self.leaf as u64) << 1
            | (self.level as u64) << 8
            | (self.keys.len() as u64) << 16
            | (self.version as u64) << 32;
        for (i, w) in [flags, self.lo, self.hi, self.sibling, self.leftmost]
            .into_iter()
            .enumerate()
        {
            b[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        for (i, (k, v)) in self.keys.iter().zip(&self.vals).enumerate() {
            let at = HEADER_BYTES + i * ENTRY_BYTES;
            b[at..at + 8].copy_from_slice(&k.to_le_bytes());
            b[at + 8..at + 16].copy_from_slice(&v.to_le_bytes());
        }
        let rear = block_bytes - 8;
        b[rear..].copy_from_slice(&(self.version as u64).to_le_bytes());
        b
    }

    /// Decode a block; `None` for a free object (used bit clear), a torn one (front and
    /// rear versions differ) or a count past the capacity.
    pub fn decode(b: &[u8]) -> Option<Self> {
        let flags = word(b, 0);
        if flags & 1 == 0 {
            return None;
        }
        let version = (flags >> 32) as u32;
        if word(b, b.len() - 8) != version as u64 {
            return None;
        }
        let n = ((flags >> 16) & 0xFFFF) as usize;
        if n > capacity(b.len()) {
            return None;
        }
        let mut keys = Vec::with_capacity(n);
        let mut vals = Vec::with_capacity(n);
        for i in 0..n {
            let at = HEADER_BYTES + i * ENTRY_BYTES;
            keys.push(word(b, at));
            vals.push(word(b, at + 8));
        }
        Some(Self {
            leaf: flags & 2 != 0,
            level: (flags >> 8) as u8,
            lo: word(b, 8),
            hi: word(b, 16),
            sibling: word(b, 24),
            leftmost: word(b, 32),
            keys,
            vals,
            version,
        })
    }

    /// Internal nodes: the child covering `key` (the last entry with key <= `key`, else
    /// the leftmost child).
    pub fn child(&self, key: u64) -> u64 {
        match self.keys.partition_point(|&k| k <= key) {
            0 => self.leftmost,
            i => self.vals[i - 1],
        }
    }

    /// Insert or replace `key`'s entry; returns the old value if it was present.
    pub fn upsert(&mut self, key: u64, val: u64) -> Option<u64> {
        match self.keys.binary_search(&key) {
            Ok(i) => Some(std::mem::replace(&mut self.vals[i], val)),
            Err(i) => {
                self.keys.insert(i, key);
                self.vals.insert(i, val);
                None
            }
        }
    }

    /// Split a full node in two halves: `self` keeps the left half, the returned node
    /// (to be stored at `right_mptr`) takes the right half, and the separator (the right
    /// node's low fence) is returned with it. A leaf's separator is the right's first key;
    /// an internal node's middle key moves up, its child becoming the right's leftmost.
    /// `link` false leaves the left's sibling pointer unchanged (a planted bug in tests).
    pub fn split(&mut self, right_mptr: u64, link: bool) -> (u64, Node) {
        let mid = self.keys.len() / 2;
        let mut rk = self.keys.split_off(mid);
        let mut rv = self.vals.split_off(mid);
        let (sep, leftmost) = if self.leaf {
            (rk[0], 0)
        } else {
            let sep = rk.remove(0);
            (sep, rv.remove(0))
        };
        let right = Node {
            leaf: self.leaf,
            level: self.level,
            lo: sep,
            hi: self.hi,
            sibling: self.sibling,
            leftmost,
            keys: std::mem::take(&mut rk),
            vals: std::mem::take(&mut rv),
            version: 0,
        };
        self.hi = sep;
        if link {
            self.sibling = right_mptr;
        }
        (sep, right)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_child_and_split() {
        let mut n = Node {
            leaf: false,
            level: 1,
            lo: 0,
            hi: KEY_MAX,
            leftmost: 7,
            ..Node::default()
        };
        for k in [10u64, 20, 30, 40, 50] {
            n.upsert(k, k + 1000);
        }
        assert_eq!(Node::decode(&n.encode(128)), Some(n.clone()));
        assert_eq!(capacity(1024), 61);
        assert_eq!((n.child(5), n.child(10), n.child(45)), (7, 1010, 1040));
        let (sep, r) = n.split(99, true);
        assert_eq!(
            (sep, n.hi, n.sibling, r.lo, r.leftmost),
            (30, 30, 99, 30, 1030)
        );
        assert_eq!(
            (n.keys.clone(), r.keys.clone()),
            (vec![10, 20], vec![40, 50])
        );
        assert_eq!(Node::decode(&[0u8; 128]), None);
        let mut torn = r.encode(128);
        torn[120] = 1;
        assert_eq!(Node::decode(&torn), None);
    }
}
