//! A node's load over one resharding interval (Lotus 4.3): the
//! [`LoadMeter`] that
//! [`crate::table_service::TableService`] feeds for every batch it serves (and a compute
//! node's coordinators in the embedded placement, [`LoadMeter::record_latency`]), and the
//! [`LoadSample`] it ends an interval with, as [`TABLE_STATS_HANDLER`] sends it to the
//! resharding loop ([`crate::reshard`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use std::mem::size_of;

use rrpc::typed::{Batch, Fixed, Rpc};
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::shard::N_SHARDS;

/// Handler id of "send me your load sample for the interval just ended" (empty request;
/// reply a [`SampleWire`], [`TableStatsRpc`]); each call ends the node's interval.
pub const TABLE_STATS_HANDLER: u16 = 25;
const _: () = assert!(rrpc::server::ids::LOCK_TABLES.contains(TABLE_STATS_HANDLER));

/// "Send me your load sample" ([`TABLE_STATS_HANDLER`]): nothing in, a [`SampleWire`]
/// out.
pub struct TableStatsRpc;

impl Rpc for TableStatsRpc {
    const ID: u16 = TABLE_STATS_HANDLER;
    type Req = ();
    type Resp = SampleWire;
    type Codec = Fixed;
}

/// The header of a [`LoadSample`] on the wire, 24 bytes.
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned, Clone, Copy, Debug, PartialEq, Eq,
)]
#[repr(C)]
pub struct SampleHead {
    /// Requests served, bytes 0..8.
    pub ops: U64,
    /// Sum of the latency observations in nanoseconds, bytes 8..16.
    pub latency_sum_ns: U64,
    /// Number of latency observations, bytes 16..24.
    pub latency_samples: U64,
}

/// One shard's requests in a [`LoadSample`] on the wire, 8 bytes.
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned, Clone, Copy, Debug, PartialEq, Eq,
)]
#[repr(C)]
pub struct ShardLoad {
    /// The shard, bytes 0..2.
    pub shard: U16,
    /// Zero, bytes 2..4.
    pub pad: [u8; 2],
    /// Its requests (saturated), bytes 4..8.
    pub requests: U32,
}

const _: () = assert!(size_of::<SampleHead>() == 24 && size_of::<ShardLoad>() == 8);

/// A [`LoadSample`] on the wire ([`LoadSample::to_wire`]).
pub type SampleWire = Batch<SampleHead, ShardLoad>;

/// A node's counters for the current interval; `Sync`, updated with relaxed atomics by
/// every server thread and local coordinator.
pub struct LoadMeter {
    ops: AtomicU64,
    latency_sum_ns: AtomicU64,
    latency_samples: AtomicU64,
    shard_ops: Box<[AtomicU64]>,
}

impl Default for LoadMeter {
    fn default() -> Self {
        Self {
            ops: AtomicU64::new(0),
            latency_sum_ns: AtomicU64::new(0),
            latency_samples: AtomicU64::new(0),
            shard_ops: (0..N_SHARDS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl LoadMeter {
    /// A meter at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// One lock or unlock request on `shard` (shards past [`N_SHARDS`] are ignored).
    pub fn record_op(&self, shard: u16) {
        self.ops.fetch_add(1, Ordering::Relaxed);
        if let Some(c) = self.shard_ops.get(usize::from(shard)) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// `samples` latency observations totalling `total` (e.g. a batch of `n` operations
    /// served in `total`: `n` samples), or one coordinator's transaction latency.
    pub fn record_latency_n(&self, total: Duration, samples: u64) {
        let ns = u64::try_from(total.as_nanos()).unwrap_or(u64::MAX);
        self.latency_sum_ns.fetch_add(ns, Ordering::Relaxed);
        self.latency_samples.fetch_add(samples, Ordering::Relaxed);
    }

    /// One latency observation (a coordinator's lock or transaction latency, Lotus 4.3).
    pub fn record_latency(&self, d: Duration) {
        self.record_latency_n(d, 1);
    }

    /// End the interval: the counters since the last call, then zero.
    pub fn take(&self) -> LoadSample {
        let shard_load = self
            .shard_ops
            .iter()
            .map(|c| c.swap(0, Ordering::Relaxed))
            .collect();
        LoadSample {
            ops: self.ops.swap(0, Ordering::Relaxed),
            latency_sum_ns: self.latency_sum_ns.swap(0, Ordering::Relaxed),
            latency_samples: self.latency_samples.swap(0, Ordering::Relaxed),
            shard_load,
        }
    }
}

/// One node's interval, as [`LoadMeter::take`] ends it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadSample {
    /// Lock and unlock requests served.
    pub ops: u64,
    /// Sum of the latency observations, nanoseconds.
    pub latency_sum_ns: u64,
    /// Number of latency observations.
    pub latency_samples: u64,
    /// Requests per shard ([`N_SHARDS`] entries; empty when unknown).
    pub shard_load: Vec<u64>,
}

/// Errors decoding a [`LoadSample`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SampleError {
    /// The length is not a header plus whole entries.
    #[error("load sample of {0} bytes is not a header plus whole entries")]
    BadLength(usize),
    /// A shard number past [`N_SHARDS`], or shards out of order.
    #[error("load sample: shard {0} out of range or out of order")]
    BadShard(u16),
}

impl LoadSample {
    /// Mean latency in nanoseconds; `None` without observations.
    pub fn mean_latency_ns(&self) -> Option<u64> {
        self.latency_sum_ns.checked_div(self.latency_samples)
    }

    /// The sample on the wire: `ops`, `latency_sum_ns`, `latency_samples` ([`SampleHead`]),
    /// then one [`ShardLoad`] per shard with requests, in shard order.
    pub fn to_wire(&self) -> SampleWire {
        let shards = self
            .shard_load
            .iter()
            .enumerate()
            .take(N_SHARDS)
            .filter(|&(_, &n)| n > 0)
            .map(|(s, &n)| ShardLoad {
                shard: U16::new(s as u16),
                pad: [0; 2],
                requests: U32::new(u32::try_from(n).unwrap_or(u32::MAX)),
            })
            .collect();
        Batch::new(
            SampleHead {
                ops: U64::new(self.ops),
                latency_sum_ns: U64::new(self.latency_sum_ns),
                latency_samples: U64::new(self.latency_samples),
            },
            shards,
        )
    }

    /// The sample [`Self::to_wire`] sent; `shard_load` always has [`N_SHARDS`] entries.
    ///
    /// Errors: [`SampleError::BadShard`] for a shard past [`N_SHARDS`] or out of order.
    pub fn from_wire(w: &SampleWire) -> Result<Self, SampleError> {
        let mut shard_load = vec![0u64; N_SHARDS];
        let mut next = 0usize;
        for e in &w.entries {
            let s = e.shard.get();
            if usize::from(s) >= N_SHARDS || usize::from(s) < next {
                return Err(SampleError::BadShard(s));
            }
            next = usize::from(s) + 1;
            shard_load[usize::from(s)] = u64::from(e.requests.get());
        }
        Ok(Self {
            ops: w.head.ops.get(),
            latency_sum_ns: w.head.latency_sum_ns.get(),
            latency_samples: w.head.latency_samples.get(),
            shard_load,
        })
    }

    /// Decode a [`TableStatsRpc`] reply.
    ///
    /// Errors: [`SampleError::BadLength`] for a length that is not a header plus whole
    /// entries, [`SampleError::BadShard`].
    pub fn decode(b: &[u8]) -> Result<Self, SampleError> {
        let w = rrpc::typed::decode_response::<TableStatsRpc>(b)
            .map_err(|e| SampleError::BadLength(e.len))?;
        Self::from_wire(&w)
    }
}

/// A sample of ten operations of `latency_ns` each, `hot` naming the shards that took
/// load (for tests of the meter and of the resharding loop).
#[cfg(test)]
pub(crate) fn test_sample(latency_ns: u64, hot: &[(u16, u64)]) -> LoadSample {
    let mut shard_load = vec![0u64; N_SHARDS];
    for &(s, n) in hot {
        shard_load[usize::from(s)] = n;
    }
    LoadSample {
        ops: hot.iter().map(|h| h.1).sum(),
        latency_sum_ns: latency_ns * 10,
        latency_samples: 10,
        shard_load,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(latency_ns: u64, hot: &[(u16, u64)]) -> LoadSample {
        test_sample(latency_ns, hot)
    }

    #[test]
    fn meter_counts_an_interval_and_restarts() {
        let m = LoadMeter::new();
        m.record_op(5);
        m.record_op(5);
        m.record_op(4095);
        m.record_op(9999); // out of range: counted as an op, not as a shard
        m.record_latency_n(Duration::from_micros(40), 4);
        m.record_latency(Duration::from_micros(20));
        let s = m.take();
        assert_eq!(s.ops, 4);
        assert_eq!((s.shard_load[5], s.shard_load[4095]), (2, 1));
        assert_eq!(s.mean_latency_ns(), Some(12_000));
        let z = m.take();
        assert_eq!((z.ops, z.mean_latency_ns()), (0, None), "a new interval");
    }

    #[test]
    fn samples_round_trip_and_garbage_is_refused() {
        let s = sample(700, &[(0, 3), (17, 9), (4095, 1)]);
        let mut b = Vec::new();
        rrpc::typed::encode_response::<TableStatsRpc>(&s.to_wire(), &mut b).unwrap();
        assert_eq!(&b[..8], &13u64.to_le_bytes(), "ops first (3 + 9 + 1)");
        assert_eq!(
            &b[32..40],
            &[17, 0, 0, 0, 9, 0, 0, 0],
            "shard 17, 9 requests"
        );
        assert_eq!(b.len(), 24 + 3 * 8, "only shards with requests");
        assert_eq!(LoadSample::decode(&b), Ok(s));
        assert!(matches!(
            LoadSample::decode(&b[..23]),
            Err(SampleError::BadLength(23))
        ));
        assert!(LoadSample::decode(&b[..30]).is_err());
        let mut bad = b.clone();
        bad[24 + 8] = 0; // second entry's shard 17 -> 0: out of order
        assert_eq!(LoadSample::decode(&bad), Err(SampleError::BadShard(0)));
        let mut bad = b;
        bad[24 + 16..24 + 18].copy_from_slice(&5000u16.to_le_bytes());
        assert_eq!(LoadSample::decode(&bad), Err(SampleError::BadShard(5000)));
    }
}
