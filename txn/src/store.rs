//! What the memory node's tables share: the key hash (index buckets and partitions) and
//! the errors of building a table.

/// SplitMix64 of (table, key): the index hash.
pub fn hash_key(table: u32, key: u64) -> u64 {
    let mut z = key ^ (u64::from(table) << 56) ^ 0x9E37_79B9_7F4A_7C15;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Errors of table construction.
#[derive(Debug, thiserror::Error)]
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
