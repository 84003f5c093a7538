//! A node's load over one resharding interval (Lotus 4.3): the
//! [`LoadMeter`] that
//! [`crate::table_service::TableService`] feeds for every batch it serves (and a compute
//! node's coordinators in the embedded placement, [`LoadMeter::record_latency`]), and the
//! [`LoadSample`] it ends an interval with, as [`TABLE_STATS_HANDLER`] sends it to the
//! resharding loop ([`crate::reshard`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::shard::N_SHARDS;

/// Handler id of "send me your load sample for the interval just ended" (empty request;
/// reply [`LoadSample::encode`]); each call ends the node's interval.
pub const TABLE_STATS_HANDLER: u16 = 25;
const _: () = assert!(rrpc::server::ids::LOCK_TABLES.contains(TABLE_STATS_HANDLER));

/// Bytes of an encoded [`LoadSample`]'s header (ops, latency sum in ns, latency samples).
const SAMPLE_HEADER_BYTES: usize = 24;
/// Bytes per (shard, requests) entry of an encoded [`LoadSample`].
const SHARD_ENTRY_BYTES: usize = 8;

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

    /// Little-endian: `ops: u64`, `latency_sum_ns: u64`, `latency_samples: u64`, then for
    /// each shard with requests, in shard order, `shard: u16`, 2 bytes of zero,
    /// `requests: u32` (saturated).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.ops.to_le_bytes());
        out.extend_from_slice(&self.latency_sum_ns.to_le_bytes());
        out.extend_from_slice(&self.latency_samples.to_le_bytes());
        for (s, &n) in self.shard_load.iter().enumerate().take(N_SHARDS) {
            if n > 0 {
                out.extend_from_slice(&(s as u16).to_le_bytes());
                out.extend_from_slice(&[0, 0]);
                out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
            }
        }
    }

    /// Decode [`Self::encode`]'s bytes; `shard_load` always has [`N_SHARDS`] entries.
    ///
    /// Errors: [`SampleError`] for a bad length or shard.
    pub fn decode(b: &[u8]) -> Result<Self, SampleError> {
        if b.len() < SAMPLE_HEADER_BYTES
            || !(b.len() - SAMPLE_HEADER_BYTES).is_multiple_of(SHARD_ENTRY_BYTES)
        {
            return Err(SampleError::BadLength(b.len()));
        }
        let u64_at = |o: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(w)
        };
        let mut shard_load = vec![0u64; N_SHARDS];
        let mut next = 0usize;
        for e in b[SAMPLE_HEADER_BYTES..].chunks_exact(SHARD_ENTRY_BYTES) {
            let s = u16::from_le_bytes([e[0], e[1]]);
            if usize::from(s) >= N_SHARDS || usize::from(s) < next {
                return Err(SampleError::BadShard(s));
            }
            next = usize::from(s) + 1;
            shard_load[usize::from(s)] = u64::from(u32::from_le_bytes([e[4], e[5], e[6], e[7]]));
        }
        Ok(Self {
            ops: u64_at(0),
            latency_sum_ns: u64_at(8),
            latency_samples: u64_at(16),
            shard_load,
        })
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
        s.encode(&mut b);
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
