//! Where a record lives: its home node and the byte offset of its tuple there (RCC, 3 and
//! Fig. 3).
//!
//! RCC partitions every table across the nodes and looks up and caches remote offsets
//! before execution. Here tables are fixed arrays, so the "offset cache" is arithmetic:
//! key `k` of a table lives on node `k % nodes` at index `k / nodes` of that table's
//! array, whose base offset is the same on every node. The lookup costs no round trip,
//! as in RCC after warm-up.
//!
//! A tuple is its protocol's metadata words, one hidden `check_version` word where the
//! protocol has no version of its own (bumped by every committed write, so that every
//! protocol feeds the project's serializability check; SPECS-style \[inf\] choice), then
//! the record:
//!
//! | protocol | words before the record |
//! |---|---|
//! | NOWAIT | `lock` (0 free, else the holder), `check_version` |
//! | WAITDIE | `lock` (the holder's timestamp), `check_version` |
//! | OCC | `lock`, `seq` (the version) |
//!
//! All three share the byte layout `[lock][version][record]` ([`LOCK`], [`VER`], [`VAL`]).

use serde::{Deserialize, Serialize};

/// Byte offset of the lock word within a tuple.
pub const LOCK: u64 = 0;
/// Byte offset of the version word (OCC's `seq`, or the hidden `check_version`).
pub const VER: u64 = 8;
/// Byte offset of the record within a tuple.
pub const VAL: u64 = 16;

/// One table: how many records and how large each is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableSpec {
    /// Records, keyed `0..rows`.
    pub rows: u64,
    /// Bytes per record, a multiple of 8.
    pub value_bytes: usize,
}

/// Errors of a layout that cannot be built.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LayoutError {
    /// No node to place records on.
    #[error("a cluster needs at least one node")]
    NoNodes,
    /// A record size that is zero or not a multiple of 8 bytes.
    #[error("table {table}: record size {bytes} bytes is not a positive multiple of 8")]
    RecordSize {
        /// Table id.
        table: usize,
        /// Bytes asked for.
        bytes: usize,
    },
}

/// The placement of every table over `nodes` nodes; the same on every node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    nodes: usize,
    tables: Vec<TableSpec>,
    bases: Vec<u64>,
    region: u64,
}

impl Layout {
    /// Place `tables` over `nodes` nodes. Errors: [`LayoutError`].
    pub fn new(nodes: usize, tables: Vec<TableSpec>) -> Result<Self, LayoutError> {
        if nodes == 0 {
            return Err(LayoutError::NoNodes);
        }
        let mut bases = Vec::with_capacity(tables.len());
        let mut off = 0u64;
        for (i, t) in tables.iter().enumerate() {
            if t.value_bytes == 0 || !t.value_bytes.is_multiple_of(8) {
                return Err(LayoutError::RecordSize {
                    table: i,
                    bytes: t.value_bytes,
                });
            }
            bases.push(off);
            let per_node = t.rows.div_ceil(nodes as u64);
            off += per_node * (VAL + t.value_bytes as u64);
        }
        Ok(Self {
            nodes,
            tables,
            bases,
            region: off.max(8),
        })
    }

    /// Nodes the tables are spread over.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// The tables.
    pub fn tables(&self) -> &[TableSpec] {
        &self.tables
    }

    /// Bytes of one node's region.
    pub fn region_bytes(&self) -> u64 {
        self.region
    }

    /// Bytes of one tuple of `table` (metadata and record).
    pub fn tuple_bytes(&self, table: u32) -> usize {
        VAL as usize + self.tables[table as usize].value_bytes
    }

    /// Bytes of a record of `table`.
    pub fn value_bytes(&self, table: u32) -> usize {
        self.tables[table as usize].value_bytes
    }

    /// The node holding `key`.
    pub fn home(&self, key: u64) -> usize {
        (key % self.nodes as u64) as usize
    }

    /// Byte offset of the tuple of (`table`, `key`) on its home node. Panics on a table
    /// or key out of range (a workload bug).
    pub fn tuple_off(&self, table: u32, key: u64) -> u64 {
        let t = &self.tables[table as usize];
        assert!(key < t.rows, "key {key} outside table {table}");
        self.bases[table as usize] + (key / self.nodes as u64) * (VAL + t.value_bytes as u64)
    }

    /// Every (table, key) whose home is `node`, in offset order.
    pub fn keys_of(&self, node: usize) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.tables.iter().enumerate().flat_map(move |(t, spec)| {
            (node as u64..spec.rows)
                .step_by(self.nodes)
                .map(move |k| (t as u32, k))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tuples_do_not_overlap_and_fit_the_region() {
        let l = Layout::new(
            3,
            vec![
                TableSpec {
                    rows: 10,
                    value_bytes: 8,
                },
                TableSpec {
                    rows: 7,
                    value_bytes: 64,
                },
            ],
        )
        .unwrap();
        for n in 0..3 {
            let mut spans: Vec<(u64, u64)> = l
                .keys_of(n)
                .map(|(t, k)| {
                    assert_eq!(l.home(k), n);
                    let o = l.tuple_off(t, k);
                    (o, o + l.tuple_bytes(t) as u64)
                })
                .collect();
            spans.sort();
            for w in spans.windows(2) {
                assert!(w[0].1 <= w[1].0, "{w:?}");
            }
            assert!(spans.last().unwrap().1 <= l.region_bytes());
        }
        assert_eq!(
            Layout::new(
                1,
                vec![TableSpec {
                    rows: 1,
                    value_bytes: 12
                }]
            ),
            Err(LayoutError::RecordSize {
                table: 0,
                bytes: 12
            })
        );
    }
}
