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
//! protocol feeds the project's serializability check; this crate's choice, not the
//! paper's), then the record:
//!
//! | protocol | words before the record |
//! |---|---|
//! | NOWAIT | `lock` (0 free, else the holder), `check_version` |
//! | WAITDIE | `lock` (the holder's timestamp), `check_version` |
//! | OCC | `lock`, `seq` (the version) |
//! | MVCC | `lock` (the writer's timestamp), `rts`, `wts[4]` (the versions), then 4 record slots |
//! | SUNDIAL | `lock`, `lease` (wts in the high 32 bits, rts in the low 32), `check_version` |
//!
//! NOWAIT, WAITDIE and OCC share the byte layout `[lock][version][record]` ([`LOCK`],
//! [`VER`], [`VAL`]: [`Shape::Basic`]); MVCC and SUNDIAL have their own ([`Shape::Mvcc`],
//! [`Shape::Sundial`]; RCC, Fig. 3, 4.4 and 4.5).

use serde::{Deserialize, Serialize};

/// Byte offset of the lock word within a tuple.
pub const LOCK: u64 = 0;
/// Byte offset of the version word (OCC's `seq`, or the hidden `check_version`).
pub const VER: u64 = 8;
/// Byte offset of the record within a tuple.
pub const VAL: u64 = 16;

/// MVCC: byte offset of `rts`, the largest timestamp that read the tuple (RCC, 4.4).
pub const MVCC_RTS: u64 = 8;
/// MVCC: byte offset of `wts[0]`; `wts[i]` is at `MVCC_WTS + 8 i`. A `wts` of 0 marks an
/// empty slot, [`MVCC_PENDING`] a slot being overwritten.
pub const MVCC_WTS: u64 = 16;
/// MVCC: version slots per tuple (RCC, 4.4: "a static number of memory slots (i.e., 4)").
pub const MVCC_SLOTS: usize = 4;
/// MVCC: byte offset of record slot 0; slot `i` is at `MVCC_REC + i * value_bytes`.
pub const MVCC_REC: u64 = MVCC_WTS + 8 * MVCC_SLOTS as u64;
/// MVCC: the `wts` of the loaded version (below every timestamp a coordinator makes).
pub const MVCC_LOADED_WTS: u64 = 1;
/// MVCC: the bit a writer sets in a slot's `wts` while it overwrites the slot's record; a
/// reader treats such a slot as unusable.
pub const MVCC_PENDING: u64 = 1 << 63;
/// SUNDIAL: byte offset of the lease word, `wts << 32 | rts` (logical timestamps).
pub const SUNDIAL_LEASE: u64 = 8;
/// SUNDIAL: byte offset of the hidden `check_version` word.
pub const SUNDIAL_CV: u64 = 16;
/// SUNDIAL: byte offset of the record.
pub const SUNDIAL_REC: u64 = 24;

/// A tuple's byte shape: which metadata words precede the record(s) (RCC, Fig. 3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Shape {
    /// `[lock][version][record]`: NOWAIT, WAITDIE, OCC.
    #[default]
    Basic,
    /// `[lock][rts][wts; 4][record; 4]`: MVCC (RCC, 4.4).
    Mvcc,
    /// `[lock][lease][check_version][record]`: SUNDIAL (RCC, 4.5).
    Sundial,
}

impl Shape {
    /// Bytes of one tuple holding records of `value_bytes` bytes.
    pub fn tuple_bytes(self, value_bytes: usize) -> usize {
        match self {
            Shape::Basic => VAL as usize + value_bytes,
            Shape::Mvcc => MVCC_REC as usize + MVCC_SLOTS * value_bytes,
            Shape::Sundial => SUNDIAL_REC as usize + value_bytes,
        }
    }

    /// The initial tuple holding `record`: lock free, the loaded version (version 0;
    /// MVCC: slot 0 with `wts` [`MVCC_LOADED_WTS`], the other slots empty; SUNDIAL: lease
    /// `[0, 0]`, `check_version` 0).
    pub fn initial(self, record: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; self.tuple_bytes(record.len())];
        match self {
            Shape::Basic => b[VAL as usize..].copy_from_slice(record),
            Shape::Mvcc => {
                let w = MVCC_WTS as usize;
                b[w..w + 8].copy_from_slice(&MVCC_LOADED_WTS.to_le_bytes());
                let r = MVCC_REC as usize;
                b[r..r + record.len()].copy_from_slice(record);
            }
            Shape::Sundial => b[SUNDIAL_REC as usize..].copy_from_slice(record),
        }
        b
    }

    /// The whole tuple of a freshly inserted `record` (a row that did not exist): lock
    /// free; Basic: version `version`; MVCC: slot 0 at `wts = ts`, the other slots
    /// empty, `rts` 0; SUNDIAL: lease `[ts, ts]`, `check_version` `version`.
    pub fn inserted(self, record: &[u8], version: u64, ts: u64) -> Vec<u8> {
        let mut b = self.initial(record);
        let mut put =
            |at: u64, v: u64| b[at as usize..at as usize + 8].copy_from_slice(&v.to_le_bytes());
        match self {
            Shape::Basic => put(VER, version),
            Shape::Mvcc => put(MVCC_WTS, ts),
            Shape::Sundial => {
                put(SUNDIAL_LEASE, ts << 32 | ts);
                put(SUNDIAL_CV, version);
            }
        }
        b
    }

    /// The current (newest committed) record of a tuple's bytes `tuple` with records of
    /// `value_bytes` bytes; for MVCC the slot with the largest `wts`.
    pub fn current(self, tuple: &[u8], value_bytes: usize) -> &[u8] {
        match self {
            Shape::Basic => &tuple[VAL as usize..VAL as usize + value_bytes],
            Shape::Sundial => &tuple[SUNDIAL_REC as usize..SUNDIAL_REC as usize + value_bytes],
            Shape::Mvcc => {
                let wts = |i: usize| {
                    let at = MVCC_WTS as usize + 8 * i;
                    u64::from_le_bytes(tuple[at..at + 8].try_into().expect("8 bytes"))
                        & !MVCC_PENDING
                };
                let s = (0..MVCC_SLOTS).max_by_key(|&i| wts(i)).unwrap_or(0);
                let at = MVCC_REC as usize + s * value_bytes;
                &tuple[at..at + value_bytes]
            }
        }
    }
}

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
    shape: Shape,
}

impl Layout {
    /// Place `tables` over `nodes` nodes in the [`Shape::Basic`] tuple shape. Errors:
    /// [`LayoutError`].
    pub fn new(nodes: usize, tables: Vec<TableSpec>) -> Result<Self, LayoutError> {
        Self::with_shape(nodes, tables, Shape::Basic)
    }

    /// Place `tables` over `nodes` nodes, every tuple of shape `shape`. Errors:
    /// [`LayoutError`].
    pub fn with_shape(
        nodes: usize,
        tables: Vec<TableSpec>,
        shape: Shape,
    ) -> Result<Self, LayoutError> {
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
            off += per_node * shape.tuple_bytes(t.value_bytes) as u64;
        }
        Ok(Self {
            nodes,
            tables,
            bases,
            region: off.max(8),
            shape,
        })
    }

    /// The tuples' shape.
    pub fn shape(&self) -> Shape {
        self.shape
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
        self.shape
            .tuple_bytes(self.tables[table as usize].value_bytes)
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
        self.bases[table as usize]
            + (key / self.nodes as u64) * self.shape.tuple_bytes(t.value_bytes) as u64
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
        for shape in [Shape::Basic, Shape::Mvcc, Shape::Sundial] {
            overlap(shape);
        }
    }

    #[test]
    fn initial_tuples_hold_the_record_as_current() {
        for shape in [Shape::Basic, Shape::Mvcc, Shape::Sundial] {
            let b = shape.initial(&[7u8; 16]);
            assert_eq!(b.len(), shape.tuple_bytes(16));
            assert_eq!(b[..8], [0u8; 8], "{shape:?}: lock free");
            assert_eq!(shape.current(&b, 16), &[7u8; 16], "{shape:?}");
        }
    }

    fn overlap(shape: Shape) {
        let l = Layout::with_shape(
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
            shape,
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
