//! The RCC suite's workload flags (`txn-bench --suite rcc`, and the `rcc-node` processes
//! it starts with `--processes`): SmallBank, RCC's YCSB with a hot area, TPC-C
//! New-Order alone (RCC, 5.1), and building the workload from them.

use std::sync::Arc;

use anyhow::bail;
use clap::Args;
use rcc::smallbank::SmallBank;
use rcc::tpcc::NewOrder;
use rcc::workload::Workload;
use rcc::ycsb::Ycsb;
use serde::{Deserialize, Serialize};

/// The workload and its parameters.
#[derive(Args, Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RccWorkload {
    /// Workload: smallbank, ycsb-rcc (RCC's YCSB: 10 operations on distinct records,
    /// --write-prob of them writes, --hot-prob of them in the hot area) or tpcc-neworder
    /// (TPC-C New-Order alone, as RCC 5.1 runs it: --warehouses, --items, --customers,
    /// --max-orders).
    #[arg(long, default_value = "smallbank", value_name = "WORKLOAD")]
    pub workload: String,
    /// SmallBank accounts.
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    pub accounts: u64,
    /// SmallBank hot accounts (0..N drawn for --hot-prob of the draws; 0: uniform).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub hot_accounts: u64,
    /// ycsb-rcc records (RCC: 1,200,000).
    #[arg(long, default_value_t = 1_200_000, value_name = "N")]
    pub records: u64,
    /// ycsb-rcc hot-area records (RCC: 1,200, 0.1%).
    #[arg(long, default_value_t = 1_200, value_name = "N")]
    pub hot_records: u64,
    /// Probability that a record is drawn from the hot area (ycsb-rcc) or the hot
    /// accounts (smallbank with --hot-accounts): the contention knob.
    #[arg(long, default_value_t = 0.1, value_name = "P")]
    pub hot_prob: f64,
    /// ycsb-rcc: probability that an operation writes (RCC: 0.2).
    #[arg(long, default_value_t = 0.2, value_name = "P")]
    pub write_prob: f64,
    /// ycsb-rcc: operations per transaction (RCC: 10).
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub ops: usize,
    /// ycsb-rcc: computation per transaction, microseconds (RCC sets it to 5% of latency).
    #[arg(long, default_value_t = 0, value_name = "US")]
    pub compute_us: u64,
    /// tpcc-neworder: warehouses (partitioned by warehouse: warehouse w on node
    /// w % nodes); default one per node.
    #[arg(long, value_name = "W")]
    pub warehouses: Option<u64>,
    /// tpcc-neworder: items (TPC-C: 100,000; ITEM is replicated on every node).
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    pub items: u64,
    /// tpcc-neworder: customers per district (TPC-C: 3,000).
    #[arg(long, default_value_t = 3_000, value_name = "N")]
    pub customers: u64,
    /// tpcc-neworder: room for this many orders per district (ORDER, NEW_ORDER; 15
    /// ORDER_LINE rows each). A New-Order past it aborts for good and is counted
    /// ("refused: district full" in the check column); raise it for long runs.
    #[arg(long, default_value_t = 10_000, value_name = "N")]
    pub max_orders: u64,
}

impl RccWorkload {
    /// The workload on `nodes` nodes (TPC-C New-Order places warehouse w on node w %
    /// nodes). Errors: parameters that cannot run, by flag.
    pub fn build(&self, nodes: usize) -> anyhow::Result<Arc<dyn Workload + Send + Sync>> {
        if !(0.0..=1.0).contains(&self.hot_prob) || !(0.0..=1.0).contains(&self.write_prob) {
            bail!("--hot-prob and --write-prob are probabilities (0 to 1)");
        }
        Ok(match self.workload.as_str() {
            "smallbank" => {
                if self.accounts < 2 || self.hot_accounts == 1 || self.hot_accounts > self.accounts
                {
                    bail!("smallbank needs at least 2 accounts and 0 or 2..=accounts hot ones");
                }
                Arc::new(SmallBank {
                    accounts: self.accounts,
                    hot: (self.hot_accounts, self.hot_prob),
                })
            }
            "ycsb-rcc" => {
                if self.ops == 0 || self.records <= self.hot_records + self.ops as u64 {
                    bail!(
                        "ycsb-rcc needs more records ({}) than hot records ({}) plus operations ({})",
                        self.records,
                        self.hot_records,
                        self.ops
                    );
                }
                Arc::new(Ycsb {
                    records: self.records,
                    hot: self.hot_records,
                    hot_prob: self.hot_prob,
                    ops: self.ops,
                    write_prob: self.write_prob,
                    compute_us: self.compute_us,
                })
            }
            "tpcc-neworder" => {
                let warehouses = self.warehouses.unwrap_or(nodes as u64);
                if warehouses == 0 || self.items < 15 || self.customers == 0 || self.max_orders == 0
                {
                    bail!(
                        "tpcc-neworder needs at least 1 warehouse, 15 items, 1 customer and room for 1 order per district"
                    );
                }
                Arc::new(NewOrder {
                    nodes,
                    warehouses,
                    customers: self.customers,
                    items: self.items,
                    max_orders_per_district: self.max_orders,
                    district_full: Default::default(),
                })
            }
            w => bail!(
                "unknown workload {w:?} for the RCC suite: smallbank, ycsb-rcc or tpcc-neworder"
            ),
        })
    }
}
