//! SmallBank schema and loader (the H-Store / FORD benchmark): per account a savings
//! balance and a checking balance, each an `i64` in cents. The transaction profiles live
//! in the `bench` crate; the memory node only needs the tables.

use rrpc::fabric::{Fabric, MemoryRegion};

use tso::Timestamp;

use crate::cvt_remote::partition_of;
use crate::cvt_store::{CvtTableBuilder, CvtTableExport};
use crate::store::{hash_key, StoreError};

/// Table id of savings balances.
pub const SAVINGS: u32 = 0;
/// Table id of checking balances.
pub const CHECKING: u32 = 1;
/// Bytes of a balance value (`i64`, little-endian, cents).
pub const BALANCE_BYTES: usize = 8;

/// Initial balance of `account` in `table`, in cents: 10,000 to 49,999, deterministic.
pub fn initial_balance(table: u32, account: u64) -> i64 {
    10_000 + (hash_key(table + 100, account) % 40_000) as i64
}

/// Sum of all initial balances of `accounts` accounts, in cents.
pub fn initial_total(accounts: u64) -> i64 {
    (0..accounts)
        .map(|a| initial_balance(SAVINGS, a) + initial_balance(CHECKING, a))
        .sum()
}

/// CVT cells per record when none is configured (Motor 7.3: SmallBank peaks at 3 to 4).
pub const DEFAULT_VERSIONS: usize = 4;

/// The version loaded data carries: [`Timestamp::ZERO`], below every timestamp the
/// oracle hands out (its first is 1, even in epoch 0), so every snapshot sees it.
pub const LOAD_VERSION: Timestamp = Timestamp::ZERO;

/// Build both tables of partition `partition` of `partitions` for `accounts` accounts
/// (keys `0..accounts`, each loaded on the partition [`partition_of`] gives it) as CVT
/// tables of `versions` cells, loaded at [`LOAD_VERSION`]. Each index has room for about
/// twice its share of accounts, so keys can be inserted at run time.
///
/// Errors: registering memory failed; a table filled up (cannot happen at this sizing).
pub fn load(
    fabric: &Fabric,
    accounts: u64,
    versions: usize,
    partition: u32,
    partitions: u32,
) -> Result<Vec<(CvtTableExport, [MemoryRegion; 3])>, StoreError> {
    let share = accounts.div_ceil(u64::from(partitions.max(1))) * 5 / 4 + 16;
    [(SAVINGS, "savings"), (CHECKING, "checking")]
        .into_iter()
        .map(|(id, name)| {
            let mut t = CvtTableBuilder::new(fabric, id, name, versions, BALANCE_BYTES, share)?;
            for a in (0..accounts).filter(|&a| partition_of(id, a, partitions) == partition) {
                t.insert(a, &initial_balance(id, a).to_le_bytes(), LOAD_VERSION)?;
            }
            Ok(t.finish())
        })
        .collect()
}
