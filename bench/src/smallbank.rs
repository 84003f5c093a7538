//! SmallBank transaction profiles (H-Store's SmallBank as used by FORD, Motor and
//! Scythe): six transaction types over savings and checking balances (cents), accounts
//! drawn from a Zipf distribution.
//!
//! Each profile returns the net amount of money it added to the bank when it commits
//! (deposits minus withdrawals), so a run can check that the final total equals the
//! initial total plus the net of committed transactions.

use std::sync::Arc;

use anyhow::{bail, Context};
use rand::rngs::StdRng;
use rand::Rng;
use rand_distr::{Distribution, Zipf};
use serde::{Deserialize, Serialize};
use txn::coordinator::{Txn, TxnError};
use txn::smallbank::{CHECKING, SAVINGS};

use crate::audit::{audit, money, smallbank_items};
use crate::report::WorkerStats;
use crate::txn_args::Args;
use crate::workload::Mix;
use crate::workload::RunError;
use crate::workload::{AuditCx, Audited, Finished, Profiles, Workload, WorkloadSpec};

/// The six SmallBank transaction types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TxnType {
    /// Move all of account A's money into B's checking.
    Amalgamate,
    /// Read A's savings and checking (read-only).
    Balance,
    /// Add to A's checking.
    DepositChecking,
    /// Move money from A's checking to B's checking.
    SendPayment,
    /// Add to A's savings.
    TransactSaving,
    /// Withdraw from A's checking, with a penalty when the total balance is short.
    WriteCheck,
}

impl TxnType {
    /// All types, in report order.
    pub const ALL: [TxnType; 6] = [
        Self::Amalgamate,
        Self::Balance,
        Self::DepositChecking,
        Self::SendPayment,
        Self::TransactSaving,
        Self::WriteCheck,
    ];
    /// Mix in percent (FORD's SmallBank: 15/15/15/25/15/15).
    pub fn percent(self) -> u32 {
        match self {
            Self::SendPayment => 25,
            _ => 15,
        }
    }
    /// Index in [`TxnType::ALL`].
    pub fn index(self) -> usize {
        Self::ALL.iter().position(|&t| t == self).expect("listed")
    }
    /// Name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Amalgamate => "Amalgamate",
            Self::Balance => "Balance",
            Self::DepositChecking => "DepositChecking",
            Self::SendPayment => "SendPayment",
            Self::TransactSaving => "TransactSaving",
            Self::WriteCheck => "WriteCheck",
        }
    }
}

/// Amounts in cents (FORD's constants: 1.3, 20.20, 5.0, 5.0 and a penalty of 1).
pub const DEPOSIT_CHECKING: i64 = 130;
/// Amount of TransactSaving, cents.
pub const TRANSACT_SAVING: i64 = 2020;
/// Amount of SendPayment, cents.
pub const SEND_PAYMENT: i64 = 500;
/// Amount of WriteCheck, cents.
pub const WRITE_CHECK: i64 = 500;
/// WriteCheck's overdraft penalty, cents.
pub const OVERDRAFT_PENALTY: i64 = 100;

/// One transaction's inputs.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct TxnArgs {
    /// Type.
    pub ty: TxnType,
    /// First account.
    pub a: u64,
    /// Second account (distinct from `a`; used by Amalgamate and SendPayment).
    pub b: u64,
}

/// Draws transaction types and Zipf-distributed accounts, optionally with a hot set.
pub struct Generator {
    zipf: Zipf<f64>,
    accounts: u64,
    /// FORD's hot accounts: `(n, fraction)`, accounts `0..n` drawn uniformly for
    /// `fraction` of the draws.
    hot: Option<(u64, f64)>,
}

impl Generator {
    /// Accounts `0..accounts` (at least 2) with Zipf exponent `theta` (0 = uniform).
    pub fn new(accounts: u64, theta: f64) -> anyhow::Result<Self> {
        anyhow::ensure!(accounts >= 2, "need at least 2 accounts");
        anyhow::ensure!(theta >= 0.0 && theta.is_finite(), "theta must be >= 0");
        let zipf = Zipf::new(accounts as f64, theta).map_err(|e| anyhow::anyhow!("zipf: {e}"))?;
        Ok(Self {
            zipf,
            accounts,
            hot: None,
        })
    }

    /// FORD's hot-account option: for `fraction` (0 to 1) of the draws the account is
    /// drawn uniformly from the `hot` accounts `0..hot` (at least 2, at most all), the
    /// rest as [`Generator::new`] draws them. Errors: bad `hot` or `fraction`.
    pub fn with_hot(mut self, hot: u64, fraction: f64) -> anyhow::Result<Self> {
        anyhow::ensure!(
            (2..=self.accounts).contains(&hot),
            "hot accounts must be 2 to the number of accounts ({}), got {hot}",
            self.accounts
        );
        anyhow::ensure!(
            (0.0..=1.0).contains(&fraction),
            "the hot fraction must lie in 0..=1, got {fraction}"
        );
        self.hot = Some((hot, fraction));
        Ok(self)
    }

    fn account(&self, rng: &mut impl Rng) -> u64 {
        if let Some((n, f)) = self.hot {
            if rng.random_bool(f) {
                return rng.random_range(0..n);
            }
        }
        (self.zipf.sample(rng) as u64 - 1).min(self.accounts - 1)
    }

    /// Next transaction.
    pub fn next(&self, rng: &mut impl Rng) -> TxnArgs {
        let mut p = rng.random_range(0..100u32);
        let mut ty = TxnType::WriteCheck;
        for t in TxnType::ALL {
            if p < t.percent() {
                ty = t;
                break;
            }
            p -= t.percent();
        }
        let a = self.account(rng);
        let mut b = self.account(rng);
        while b == a {
            b = self.account(rng);
        }
        TxnArgs { ty, a, b }
    }
}

fn bal(v: &[u8]) -> i64 {
    i64::from_le_bytes(v.try_into().expect("8-byte balance"))
}

fn enc(v: i64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

/// Run one attempt of `args` in `t`, commit it, and return the net money it added.
/// Every object the transaction writes is read for update (MVCC locks those at once, the
/// other protocols at commit); objects only read are read plainly. Aborts come back as
/// `Err(TxnError::Abort(_))`; `AbortReason::User` means the transaction's own logic
/// declined (e.g. insufficient funds), which is final.
pub async fn run(mut t: Txn<'_>, args: TxnArgs) -> Result<i64, TxnError> {
    let TxnArgs { ty, a, b } = args;
    let net = match ty {
        TxnType::Amalgamate => {
            let v = t
                .read_mixed(&[(SAVINGS, a, true), (CHECKING, a, true), (CHECKING, b, true)])
                .await?;
            let total = bal(&v[0]) + bal(&v[1]);
            t.write(SAVINGS, a, enc(0))?;
            t.write(CHECKING, a, enc(0))?;
            t.write(CHECKING, b, enc(bal(&v[2]) + total))?;
            0
        }
        TxnType::Balance => {
            t.read_many(&[(SAVINGS, a), (CHECKING, a)]).await?;
            0
        }
        TxnType::DepositChecking => {
            let v = t.read_for_update(CHECKING, a).await?;
            t.write(CHECKING, a, enc(bal(&v) + DEPOSIT_CHECKING))?;
            DEPOSIT_CHECKING
        }
        TxnType::SendPayment => {
            let v = t
                .read_many_for_update(&[(CHECKING, a), (CHECKING, b)])
                .await?;
            if bal(&v[0]) < SEND_PAYMENT {
                return Err(t.abort().await);
            }
            t.write(CHECKING, a, enc(bal(&v[0]) - SEND_PAYMENT))?;
            t.write(CHECKING, b, enc(bal(&v[1]) + SEND_PAYMENT))?;
            0
        }
        TxnType::TransactSaving => {
            let v = t.read_for_update(SAVINGS, a).await?;
            t.write(SAVINGS, a, enc(bal(&v) + TRANSACT_SAVING))?;
            TRANSACT_SAVING
        }
        TxnType::WriteCheck => {
            let v = t
                .read_mixed(&[(SAVINGS, a, false), (CHECKING, a, true)])
                .await?;
            let amount = if bal(&v[0]) + bal(&v[1]) < WRITE_CHECK {
                WRITE_CHECK + OVERDRAFT_PENALTY
            } else {
                WRITE_CHECK
            };
            t.write(CHECKING, a, enc(bal(&v[1]) - amount))?;
            -amount
        }
    };
    // In the commit log: recovery reports it when it finishes this commit for a
    // coordinator that died (the money audit counts it then).
    t.set_log_note(net);
    t.commit().await?;
    Ok(net)
}

/// SmallBank as `txn-bench` runs it (`--workload smallbank`): `--accounts` accounts,
/// optionally `--hot-accounts` of them drawn for `--hot-fraction` of the draws; the
/// check is the money audit.
#[derive(Clone, Debug, PartialEq)]
pub struct SmallBank {
    accounts: u64,
    /// `--hot-accounts` and `--hot-fraction`.
    hot: Option<(u64, f64)>,
}

impl SmallBank {
    /// The workload of `args`. Errors: fewer than 2 accounts. (A bad hot set is refused
    /// by [`WorkloadSpec::profiles`], with the generator's reason.)
    pub fn from_args(args: &Args) -> anyhow::Result<Self> {
        if args.accounts < 2 {
            bail!("--accounts must be at least 2");
        }
        Ok(Self {
            accounts: args.accounts,
            hot: args.hot_accounts.map(|h| (h, args.hot_fraction)),
        })
    }
}

impl WorkloadSpec for SmallBank {
    /// An account's SAVINGS and CHECKING rows share its shard (the account id is the
    /// critical field; Lotus names none for SmallBank).
    fn lotus_lock_key(&self) -> txn::lotus::LockKeyFn {
        Arc::new(|t, k| Some(txn::lotus::critical_lock_key(t, k, k)))
    }

    fn workload(&self) -> Workload {
        Workload::SmallBank
    }

    fn label(&self) -> &'static str {
        "SmallBank"
    }

    fn kinds(&self) -> Vec<&'static str> {
        TxnType::ALL.iter().map(|t| t.name()).collect()
    }

    fn keys(&self) -> u64 {
        self.accounts
    }

    fn scale(&self) -> String {
        match self.hot {
            Some((h, fraction)) => format!(
                "{} accounts, {h} hot for {}% of draws",
                self.accounts,
                // Rounded to 0.01%, so that 0.7 prints as 70, not 70.00000000000001.
                (fraction * 1e4).round() / 100.0
            ),
            None => format!("{} accounts", self.accounts),
        }
    }

    fn lockd_locks(&self) -> u64 {
        2 * self.accounts
    }

    fn memnode_args(&self) -> Vec<String> {
        vec!["--smallbank-accounts".into(), self.accounts.to_string()]
    }

    /// The loaded bank must hold `txn::smallbank::initial_total` cents.
    fn initial_total(&self, cx: &AuditCx<'_>) -> anyhow::Result<i64> {
        let loaded = smallbank_items(self.accounts);
        let before = audit(cx.fabric, cx.addrs, cx.protocol, &loaded)?;
        let expected = txn::smallbank::initial_total(self.accounts);
        let total = money(&before, &loaded)?;
        if total != expected {
            bail!("loaded bank holds {total} cents, expected {expected}");
        }
        Ok(total)
    }

    fn profiles(&self, theta: f64) -> anyhow::Result<Arc<dyn Mix>> {
        let g = Generator::new(self.accounts, theta)?;
        let g = match self.hot {
            Some((h, fraction)) => g
                .with_hot(h, fraction)
                .context("--hot-accounts / --hot-fraction")?,
            None => g,
        };
        Ok(Arc::new(g))
    }

    fn audit_after(&self, cx: &AuditCx<'_>, _: &[WorkerStats]) -> anyhow::Result<Audited> {
        let items = smallbank_items(self.accounts);
        let a = audit(cx.fabric, cx.addrs, cx.protocol, &items)?;
        Ok(Audited {
            total: Some(money(&a, &items)?),
            cvt_locked: a.cvt_locked,
            lockd_held: a.lockd_held,
            check: None,
        })
    }
}

impl Profiles for Generator {
    type Txn = TxnArgs;

    fn draw(&self, rng: &mut StdRng, _home: u16) -> (TxnArgs, usize) {
        let t = self.next(rng);
        (t, t.ty.index())
    }

    /// The first account's savings row (an account's rows share a shard).
    fn first_record(&self, t: &TxnArgs) -> Option<(u32, u64)> {
        (t.ty != TxnType::Balance).then_some((txn::smallbank::SAVINGS, t.a))
    }

    async fn run<'t>(&'t self, mut txn: Txn<'t>, t: &'t TxnArgs) -> Result<Finished, RunError> {
        if t.ty == TxnType::Balance {
            txn.declare_read_only();
        }
        run(txn, *t).await.map(Finished::net).map_err(RunError::Txn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn mix_and_skew() {
        let g = Generator::new(1000, 0.99).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut counts = [0u32; 6];
        let mut hot = 0;
        for _ in 0..100_000 {
            let t = g.next(&mut rng);
            assert_ne!(t.a, t.b);
            assert!(t.a < 1000 && t.b < 1000);
            counts[t.ty.index()] += 1;
            hot += u32::from(t.a == 0);
        }
        assert_eq!(TxnType::ALL.iter().map(|t| t.percent()).sum::<u32>(), 100);
        for t in TxnType::ALL {
            let pct = counts[t.index()] as f64 / 1000.0;
            assert!((pct - t.percent() as f64).abs() < 1.0, "{t:?}: {pct}%");
        }
        // Zipf 0.99 over 1000 keys: the hottest key gets about 13% of draws, far above 0.1%.
        assert!(hot > 8_000, "hottest account drawn {hot} times");
        // FORD's hot set: 90% of draws on accounts 0..10, uniform among them.
        let h = Generator::new(1000, 0.0)
            .unwrap()
            .with_hot(10, 0.9)
            .unwrap();
        let in_hot = (0..100_000).filter(|_| h.next(&mut rng).a < 10).count();
        assert!(
            (89_000..91_500).contains(&in_hot),
            "{in_hot} draws in the hot set"
        );
        assert!(Generator::new(1000, 0.0).unwrap().with_hot(1, 0.5).is_err());
        assert!(Generator::new(1000, 0.0)
            .unwrap()
            .with_hot(10, 1.5)
            .is_err());
        let u = Generator::new(1000, 0.0).unwrap();
        let hot_u = (0..100_000).filter(|_| u.next(&mut rng).a == 0).count();
        assert!(hot_u < 300, "uniform draw too skewed: {hot_u}");
    }
}
