//! What the memory node's tables share: the key hash (index buckets and partitions), the
//! deterministic draws the workloads' loaders generate rows with, and the errors of
//! building a table.

/// SplitMix64 of (table, key): the index hash.
pub fn hash_key(table: u32, key: u64) -> u64 {
    let mut z = key ^ (u64::from(table) << 56) ^ 0x9E37_79B9_7F4A_7C15;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Errors of table construction.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Registering memory failed.
    #[error(transparent)]
    Fabric(#[from] rrpc::fabric::FabricError),
    /// More records than the table's capacity.
    #[error("table {0} is full ({1} records)")]
    Full(String, u64),
    /// The key is already present.
    #[error("table {0}: duplicate key {1}")]
    Duplicate(String, u64),
    /// Value of the wrong size.
    #[error("table {table}: value of {got} bytes, expected {want}")]
    ValueSize {
        /// Table name.
        table: String,
        /// Bytes given.
        got: usize,
        /// Bytes expected.
        want: usize,
    },
}

/// A deterministic stream of pseudo-random numbers for one row, so that each memory
/// node generates its partition of a workload's population on its own: the same
/// (`domain`, `seed`, `table`, `key`) always gives the same stream. `domain` and `rot`
/// keep the streams of different generators apart.
pub struct KeyDraws {
    state: u64,
    step: u32,
}

impl KeyDraws {
    /// The stream of `key` in `table` for `seed`, in generator `domain` (the seed
    /// rotated by `rot` bits).
    pub fn new(domain: u32, rot: u32, seed: u64, table: u32, key: u64) -> Self {
        Self {
            state: hash_key(table + domain, key ^ seed.rotate_left(rot)),
            step: domain + 50,
        }
    }

    /// The next number.
    pub fn draw(&mut self) -> u64 {
        self.state = hash_key(self.step, self.state);
        self.state
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.draw() % (hi - lo + 1)
    }

    /// TPC-C's `NURand(A, lo, hi)` with constant `c` (clause 2.1.6).
    pub fn nurand(&mut self, a: u64, c: u64, lo: u64, hi: u64) -> u64 {
        ((self.range(0, a) | self.range(lo, hi)) + c) % (hi - lo + 1) + lo
    }

    /// A uniformly drawn `k`-subset of `0..n` (`k` capped at `n`), as flags.
    pub fn subset(&mut self, n: usize, k: u64) -> Vec<bool> {
        let mut chosen = vec![false; n];
        let mut left = k.min(n as u64);
        while left > 0 {
            let i = (self.draw() % n as u64) as usize;
            if !chosen[i] {
                chosen[i] = true;
                left -= 1;
            }
        }
        chosen
    }
}
