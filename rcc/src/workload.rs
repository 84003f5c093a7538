//! The workloads as RCC runs them (RCC, 5.1): SmallBank, YCSB with a hot area and TPC-C
//! New-Order ([`crate::smallbank`], [`crate::ycsb`], [`crate::tpcc`]), each with its own
//! check of the final database.

use std::cell::Cell;
use std::rc::Rc;

use rand::rngs::SmallRng;

use crate::coord::TxnSpec;
use crate::layout::TableSpec;

/// A workload: its tables, their initial records, a generator and a check.
pub trait Workload {
    /// Its name in reports.
    fn name(&self) -> &'static str;
    /// Its tables, by table id.
    fn tables(&self) -> Vec<TableSpec>;
    /// The initial record of (`table`, `key`).
    fn initial(&self, table: u32, key: u64) -> Vec<u8>;
    /// The next transaction. Its [`TxnSpec::exec`] adds the transaction's effect (money
    /// added, records updated) to `delta` when it runs; the driver keeps the value of
    /// the committed attempt.
    fn next(&self, rng: &mut SmallRng, delta: Rc<Cell<i64>>) -> TxnSpec;
    /// The name of transaction type `kind`.
    fn kind_name(&self, kind: u16) -> &'static str;
    /// Check the final database, read record by record through `read`, given the sum of
    /// the committed transactions' effects. Errors: what does not hold.
    fn check(&self, read: &dyn Fn(u32, u64) -> Vec<u8>, delta: i64) -> Result<String, String>;
}

/// Spin for `us` microseconds: a transaction's computation (RCC's YCSB sets it as a
/// share of latency).
pub fn compute(us: u64) {
    if us == 0 {
        return;
    }
    let end = std::time::Instant::now() + std::time::Duration::from_micros(us);
    while std::time::Instant::now() < end {
        std::hint::spin_loop();
    }
}

/// A shared workload is a workload (lets a node hold the cluster's `Arc` as an
/// `Rc<dyn Workload>`).
impl<T: Workload + ?Sized> Workload for std::sync::Arc<T> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn tables(&self) -> Vec<TableSpec> {
        (**self).tables()
    }
    fn initial(&self, table: u32, key: u64) -> Vec<u8> {
        (**self).initial(table, key)
    }
    fn next(&self, rng: &mut SmallRng, delta: Rc<Cell<i64>>) -> TxnSpec {
        (**self).next(rng, delta)
    }
    fn kind_name(&self, kind: u16) -> &'static str {
        (**self).kind_name(kind)
    }
    fn check(&self, read: &dyn Fn(u32, u64) -> Vec<u8>, delta: i64) -> Result<String, String> {
        (**self).check(read, delta)
    }
}
