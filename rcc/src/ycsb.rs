//! YCSB as RCC runs it (RCC, 5.1): one table of 64-byte records, a hot area of the first
//! `hot` records drawn with probability `hot_prob` (which sets contention; RCC: 1,200 of
//! 1,200,000), 10 operations per transaction on distinct records, each a write with
//! probability `write_prob` (RCC: 20%), and `compute_us` of computation per transaction.
//!
//! A write is a read-modify-write: word 0 counts the record's updates and words 1 to 7
//! are a function of the key and that count, so a torn or lost update shows. The check:
//! every record is consistent and the counts sum to the committed writes.

use std::cell::Cell;
use std::rc::Rc;

use rand::rngs::SmallRng;
use rand::Rng;

use crate::coord::{Op, TxnSpec};
use crate::layout::TableSpec;
use crate::workload::{compute, Workload};

/// Bytes of a record.
pub const RECORD_BYTES: usize = 64;

/// YCSB with a hot area.
#[derive(Clone, Debug)]
pub struct Ycsb {
    /// Records, at least `ops` and more than `hot`.
    pub records: u64,
    /// Hot-area records (`0..hot`).
    pub hot: u64,
    /// Probability an operation picks the hot area.
    pub hot_prob: f64,
    /// Operations per transaction.
    pub ops: usize,
    /// Probability an operation writes.
    pub write_prob: f64,
    /// Computation per transaction, microseconds.
    pub compute_us: u64,
}

impl Default for Ycsb {
    fn default() -> Self {
        Self {
            records: 1_200_000,
            hot: 1_200,
            hot_prob: 0.1,
            ops: 10,
            write_prob: 0.2,
            compute_us: 0,
        }
    }
}

fn mix(key: u64, count: u64, j: u64) -> u64 {
    let mut x = key
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(count.wrapping_mul(0xBF58_476D_1CE4_E5B9))
        .wrapping_add(j);
    x ^= x >> 31;
    x.wrapping_mul(0x94D0_49BB_1331_11EB)
}

/// The record of `key` after `count` updates.
pub fn record(key: u64, count: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(RECORD_BYTES);
    v.extend_from_slice(&count.to_le_bytes());
    for j in 1..8 {
        v.extend_from_slice(&mix(key, count, j).to_le_bytes());
    }
    v
}

fn count_of(v: &[u8]) -> u64 {
    u64::from_le_bytes(v[..8].try_into().expect("8 bytes"))
}

impl Ycsb {
    fn key(&self, rng: &mut SmallRng) -> u64 {
        if self.hot > 0 && rng.random_bool(self.hot_prob) {
            rng.random_range(0..self.hot)
        } else {
            rng.random_range(self.hot.min(self.records - 1)..self.records)
        }
    }
}

impl Workload for Ycsb {
    fn name(&self) -> &'static str {
        "ycsb"
    }
    fn tables(&self) -> Vec<TableSpec> {
        vec![TableSpec {
            rows: self.records,
            value_bytes: RECORD_BYTES,
        }]
    }
    fn initial(&self, _table: u32, key: u64) -> Vec<u8> {
        record(key, 0)
    }
    fn next(&self, rng: &mut SmallRng, delta: Rc<Cell<i64>>) -> TxnSpec {
        let mut ops: Vec<Op> = Vec::with_capacity(self.ops);
        while ops.len() < self.ops {
            let key = self.key(rng);
            if ops.iter().any(|o| o.key == key) {
                continue;
            }
            ops.push(Op {
                table: 0,
                key,
                write: rng.random_bool(self.write_prob),
            });
        }
        let writes: Vec<(usize, u64)> = ops
            .iter()
            .enumerate()
            .filter(|(_, o)| o.write)
            .map(|(i, o)| (i, o.key))
            .collect();
        let kind = u16::from(!writes.is_empty());
        let us = self.compute_us;
        TxnSpec {
            kind,
            ops,
            exec: Box::new(move |v: &mut [Vec<u8>]| {
                compute(us);
                for &(i, key) in &writes {
                    let c = count_of(&v[i]) + 1;
                    v[i] = record(key, c);
                }
                delta.set(writes.len() as i64);
                true
            }),
            inserts: None,
        }
    }
    fn kind_name(&self, kind: u16) -> &'static str {
        ["ReadOnly", "ReadWrite"][kind.min(1) as usize]
    }
    fn check(&self, read: &dyn Fn(u32, u64) -> Vec<u8>, delta: i64) -> Result<String, String> {
        let mut sum = 0u64;
        for k in 0..self.records {
            let v = read(0, k);
            let c = count_of(&v);
            if v != record(k, c) {
                return Err(format!("record {k} is torn (update count {c})"));
            }
            sum += c;
        }
        if sum != delta as u64 {
            return Err(format!(
                "the records count {sum} updates, committed transactions made {delta}"
            ));
        }
        Ok(format!("records ok ({sum} updates)"))
    }
}
