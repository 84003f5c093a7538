//! SmallBank schema and loader (the H-Store / FORD benchmark): per account a savings
//! balance and a checking balance, each an `i64` in cents. The transaction profiles live
//! in the `bench` crate; the memory node only needs the tables.

use rrpc::fabric::{Fabric, MemoryRegion};

use crate::store::{hash_key, StoreError, TableBuilder, TableExport};

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

/// Build and fill both tables for `accounts` accounts (keys 0..accounts).
pub fn load(
    fabric: &Fabric,
    accounts: u64,
) -> Result<Vec<(TableExport, MemoryRegion, MemoryRegion)>, StoreError> {
    [(SAVINGS, "savings"), (CHECKING, "checking")]
        .into_iter()
        .map(|(id, name)| {
            let mut t = TableBuilder::new(fabric, id, name, BALANCE_BYTES, accounts)?;
            for a in 0..accounts {
                t.insert(a, &initial_balance(id, a).to_le_bytes())?;
            }
            Ok(t.finish())
        })
        .collect()
}
