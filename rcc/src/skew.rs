//! The write-skew workload of the planted-bug tests: pairs of records `(2i, 2i+1)`, each
//! transaction reads both and raises one of them to one above the larger. Serially every
//! transaction writes a value above both, so two that read the same pair concurrently
//! and write different halves form a read-write cycle in the dependency graph unless the
//! protocol stops one of them.

use std::cell::Cell;
use std::rc::Rc;

use rand::rngs::SmallRng;
use rand::Rng;

use crate::coord::{Op, TxnSpec};
use crate::layout::TableSpec;
use crate::workload::Workload;

/// Write-skew pairs.
#[derive(Clone, Debug)]
pub struct Skew {
    /// Number of pairs (few, for contention).
    pub pairs: u64,
}

impl Workload for Skew {
    fn name(&self) -> &'static str {
        "skew"
    }
    fn tables(&self) -> Vec<TableSpec> {
        vec![TableSpec {
            rows: 2 * self.pairs,
            value_bytes: 8,
        }]
    }
    fn initial(&self, _table: u32, _key: u64) -> Vec<u8> {
        0u64.to_le_bytes().to_vec()
    }
    fn next(&self, rng: &mut SmallRng, delta: Rc<Cell<i64>>) -> TxnSpec {
        let p = rng.random_range(0..self.pairs);
        let which = rng.random_bool(0.5);
        let ops = vec![
            Op {
                table: 0,
                key: 2 * p,
                write: !which,
            },
            Op {
                table: 0,
                key: 2 * p + 1,
                write: which,
            },
        ];
        let w = usize::from(which);
        TxnSpec {
            kind: 0,
            ops,
            exec: Box::new(move |v: &mut [Vec<u8>]| {
                let x = u64::from_le_bytes(v[0][..8].try_into().expect("8"));
                let y = u64::from_le_bytes(v[1][..8].try_into().expect("8"));
                v[w] = (x.max(y) + 1).to_le_bytes().to_vec();
                delta.set(0);
                true
            }),
            inserts: None,
        }
    }
    fn kind_name(&self, _kind: u16) -> &'static str {
        "Skew"
    }
    fn check(&self, _read: &dyn Fn(u32, u64) -> Vec<u8>, _delta: i64) -> Result<String, String> {
        Ok("no check of its own (the serializability check judges it)".into())
    }
}
