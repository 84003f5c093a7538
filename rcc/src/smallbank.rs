//! SmallBank on RCC tuples (RCC, 5.1; the H-Store benchmark): savings and checking
//! balances per account, six transaction types (Amalgamate, Balance, DepositChecking,
//! TransactSaving and WriteCheck at 15%, SendPayment at 25%). The check: the money in
//! the database equals the initial money plus what committed transactions added.

use std::cell::Cell;
use std::rc::Rc;

use rand::rngs::SmallRng;
use rand::Rng;

use crate::coord::{Op, TxnSpec};
use crate::layout::TableSpec;
use crate::workload::Workload;

/// Table id of savings balances.
pub const SAVINGS: u32 = 0;
/// Table id of checking balances.
pub const CHECKING: u32 = 1;
const DEPOSIT_CHECKING: i64 = 130;
const TRANSACT_SAVING: i64 = 2020;
const SEND_PAYMENT: i64 = 500;
const WRITE_CHECK: i64 = 500;
const OVERDRAFT_PENALTY: i64 = 100;

/// Transaction type names, by kind.
pub const KINDS: [&str; 6] = [
    "Amalgamate",
    "Balance",
    "DepositChecking",
    "SendPayment",
    "TransactSaving",
    "WriteCheck",
];
const PERCENT: [u32; 6] = [15, 15, 15, 25, 15, 15];

/// SmallBank over `accounts` accounts; optionally `hot` of them (`0..hot`) drawn for
/// `hot_prob` of the draws.
#[derive(Clone, Debug)]
pub struct SmallBank {
    /// Accounts, at least 2.
    pub accounts: u64,
    /// Hot accounts and the probability of drawing one (0 for uniform).
    pub hot: (u64, f64),
}

fn bal(v: &[u8]) -> i64 {
    i64::from_le_bytes(v[..8].try_into().expect("8-byte balance"))
}

fn set(v: &mut [u8], b: i64) {
    v[..8].copy_from_slice(&b.to_le_bytes());
}

impl SmallBank {
    fn account(&self, rng: &mut SmallRng) -> u64 {
        if self.hot.0 >= 2 && rng.random_bool(self.hot.1) {
            return rng.random_range(0..self.hot.0);
        }
        rng.random_range(0..self.accounts)
    }

    /// The transaction of type `kind` on accounts `a` and `b` (distinct).
    pub fn txn(kind: u16, a: u64, b: u64, delta: Rc<Cell<i64>>) -> TxnSpec {
        let r = |table, key| Op {
            table,
            key,
            write: false,
        };
        let w = |table, key| Op {
            table,
            key,
            write: true,
        };
        let (ops, exec): (Vec<Op>, crate::coord::Exec) = match kind {
            0 => (
                vec![w(SAVINGS, a), w(CHECKING, a), w(CHECKING, b)],
                Box::new(move |v: &mut [Vec<u8>]| {
                    let total = bal(&v[0]) + bal(&v[1]);
                    set(&mut v[0], 0);
                    set(&mut v[1], 0);
                    let nb = bal(&v[2]) + total;
                    set(&mut v[2], nb);
                    delta.set(0);
                    true
                }),
            ),
            1 => (
                vec![r(SAVINGS, a), r(CHECKING, a)],
                Box::new(move |_: &mut [Vec<u8>]| {
                    delta.set(0);
                    true
                }),
            ),
            2 => (
                vec![w(CHECKING, a)],
                Box::new(move |v: &mut [Vec<u8>]| {
                    let nb = bal(&v[0]) + DEPOSIT_CHECKING;
                    set(&mut v[0], nb);
                    delta.set(DEPOSIT_CHECKING);
                    true
                }),
            ),
            3 => (
                vec![w(CHECKING, a), w(CHECKING, b)],
                Box::new(move |v: &mut [Vec<u8>]| {
                    if bal(&v[0]) < SEND_PAYMENT {
                        return false;
                    }
                    let (x, y) = (bal(&v[0]) - SEND_PAYMENT, bal(&v[1]) + SEND_PAYMENT);
                    set(&mut v[0], x);
                    set(&mut v[1], y);
                    delta.set(0);
                    true
                }),
            ),
            4 => (
                vec![w(SAVINGS, a)],
                Box::new(move |v: &mut [Vec<u8>]| {
                    let nb = bal(&v[0]) + TRANSACT_SAVING;
                    set(&mut v[0], nb);
                    delta.set(TRANSACT_SAVING);
                    true
                }),
            ),
            _ => (
                vec![r(SAVINGS, a), w(CHECKING, a)],
                Box::new(move |v: &mut [Vec<u8>]| {
                    let amount = if bal(&v[0]) + bal(&v[1]) < WRITE_CHECK {
                        WRITE_CHECK + OVERDRAFT_PENALTY
                    } else {
                        WRITE_CHECK
                    };
                    let nb = bal(&v[1]) - amount;
                    set(&mut v[1], nb);
                    delta.set(-amount);
                    true
                }),
            ),
        };
        TxnSpec {
            kind,
            ops,
            exec,
            inserts: None,
        }
    }
}

impl Workload for SmallBank {
    fn name(&self) -> &'static str {
        "smallbank"
    }
    fn tables(&self) -> Vec<TableSpec> {
        vec![
            TableSpec {
                rows: self.accounts,
                value_bytes: 8,
            };
            2
        ]
    }
    fn initial(&self, table: u32, key: u64) -> Vec<u8> {
        txn::smallbank::initial_balance(table, key)
            .to_le_bytes()
            .to_vec()
    }
    fn next(&self, rng: &mut SmallRng, delta: Rc<Cell<i64>>) -> TxnSpec {
        let mut p = rng.random_range(0..100u32);
        let mut kind = 5u16;
        for (k, &pc) in PERCENT.iter().enumerate() {
            if p < pc {
                kind = k as u16;
                break;
            }
            p -= pc;
        }
        let a = self.account(rng);
        let mut b = self.account(rng);
        while b == a {
            b = self.account(rng);
        }
        Self::txn(kind, a, b, delta)
    }
    fn kind_name(&self, kind: u16) -> &'static str {
        KINDS.get(kind as usize).copied().unwrap_or("?")
    }
    fn check(&self, read: &dyn Fn(u32, u64) -> Vec<u8>, delta: i64) -> Result<String, String> {
        let mut total = 0i64;
        for a in 0..self.accounts {
            total += bal(&read(SAVINGS, a)) + bal(&read(CHECKING, a));
        }
        let want = txn::smallbank::initial_total(self.accounts) + delta;
        if total != want {
            return Err(format!(
                "money: the database holds {total} cents, initial plus committed changes is {want} (off by {})",
                total - want
            ));
        }
        Ok(format!("money ok ({total} cents)"))
    }
}
