//! TATP transaction profiles (benchmark description 1.0, section 4; the tables and their
//! population are `txn::tatp`): seven transaction types, 80% read-only, subscribers
//! drawn with the specification's non-uniform `NURand`.
//!
//! A lookup that finds nothing is an outcome of the transaction, not an abort: the
//! read-only types commit with [`Outcome::NotFound`], the updating ones roll back
//! (`Txn::abort`, counted as "user" aborts like SmallBank's declined payments) and
//! return [`Outcome::NotFound`] too. The specification's expected success rates:
//! GET_NEW_DESTINATION about 23.9%, GET_ACCESS_DATA 62.5%, UPDATE_SUBSCRIBER_DATA 62.5%,
//! INSERT_CALL_FORWARDING and DELETE_CALL_FORWARDING 31.25%, the rest 100%.

use std::sync::Arc;

use anyhow::bail;
use rand::rngs::StdRng;
use rand::Rng;
use serde::{Deserialize, Serialize};
use txn::coordinator::{AbortReason, Txn, TxnError};
use txn::tatp::{
    ai_key, call_forwarding_row, cf_key, sf_key, sub_nbr, ACCESS_INFO, CALL_FORWARDING,
    SPECIAL_FACILITY, START_TIMES, SUBSCRIBER,
};

use crate::report::{Report, WorkerStats};
use crate::txn_args::Args;
use crate::workload::Mix;
use crate::workload::RunError;
use crate::workload::{AuditCx, Audited, Finished, Profiles, Workload, WorkloadSpec};

/// The seven TATP transaction types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TxnType {
    /// Read a subscriber's row (35%).
    GetSubscriberData,
    /// Read an active special facility and its call forwardings in a time window (10%).
    GetNewDestination,
    /// Read one access info row (35%).
    GetAccessData,
    /// Update a subscriber's `bit_1` and a special facility's `data_a` (2%).
    UpdateSubscriberData,
    /// Update a subscriber's `vlr_location`, found by `sub_nbr` (14%).
    UpdateLocation,
    /// Insert a call forwarding for an existing special facility (2%).
    InsertCallForwarding,
    /// Delete a call forwarding (2%).
    DeleteCallForwarding,
}

impl TxnType {
    /// All types, in report order.
    pub const ALL: [TxnType; 7] = [
        Self::GetSubscriberData,
        Self::GetNewDestination,
        Self::GetAccessData,
        Self::UpdateSubscriberData,
        Self::UpdateLocation,
        Self::InsertCallForwarding,
        Self::DeleteCallForwarding,
    ];

    /// Share of the standard mix, percent.
    pub fn percent(self) -> u32 {
        match self {
            Self::GetSubscriberData | Self::GetAccessData => 35,
            Self::GetNewDestination => 10,
            Self::UpdateLocation => 14,
            Self::UpdateSubscriberData
            | Self::InsertCallForwarding
            | Self::DeleteCallForwarding => 2,
        }
    }

    /// Index in [`Self::ALL`].
    pub fn index(self) -> usize {
        Self::ALL.iter().position(|&t| t == self).expect("listed")
    }

    /// The specification's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::GetSubscriberData => "GetSubscriberData",
            Self::GetNewDestination => "GetNewDestination",
            Self::GetAccessData => "GetAccessData",
            Self::UpdateSubscriberData => "UpdateSubscriberData",
            Self::UpdateLocation => "UpdateLocation",
            Self::InsertCallForwarding => "InsertCallForwarding",
            Self::DeleteCallForwarding => "DeleteCallForwarding",
        }
    }

    /// Percent of this type's transactions whose lookup fails, by the specification's
    /// population (TATP 1.0, 4.1 and 4.2): GET_NEW_DESTINATION 76.1 (a facility active
    /// with a matching forwarding), GET_ACCESS_DATA and UPDATE_SUBSCRIBER_DATA 37.5 (2.5
    /// of 4 types present), INSERT_CALL_FORWARDING and DELETE_CALL_FORWARDING 68.75, the
    /// others 0.
    pub fn expected_failure_percent(self) -> f64 {
        match self {
            Self::GetSubscriberData | Self::UpdateLocation => 0.0,
            Self::GetNewDestination => 76.1,
            Self::GetAccessData | Self::UpdateSubscriberData => 37.5,
            Self::InsertCallForwarding | Self::DeleteCallForwarding => 68.75,
        }
    }

    /// Whether the type only reads.
    pub fn read_only(self) -> bool {
        matches!(
            self,
            Self::GetSubscriberData | Self::GetNewDestination | Self::GetAccessData
        )
    }
}

/// One transaction's parameters, drawn by [`Generator::next`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnArgs {
    /// Type.
    pub ty: TxnType,
    /// Subscriber, `1..=P`.
    pub s_id: u64,
    /// `ai_type` or `sf_type`, 1 to 4.
    pub kind: u8,
    /// `start_time`: 0, 8 or 16.
    pub start_time: u8,
    /// GET_NEW_DESTINATION's `end_time`, 1 to 24; INSERT_CALL_FORWARDING's duration, 1
    /// to 8 hours.
    pub end_time: u8,
    /// A random value written by the updates (`bit_1`, `data_a`, `vlr_location`,
    /// `numberx`).
    pub value: u64,
}

/// Draws transaction types and their parameters by the specification (4.1).
#[derive(Clone, Debug)]
pub struct Generator {
    subscribers: u64,
    a: u64,
}

impl Generator {
    /// A generator over subscribers `1..=subscribers` (at least 1). `NURand`'s `A` is
    /// 65535 up to 1,000,000 subscribers, 1,048,575 up to 10,000,000, else 2,097,151.
    pub fn new(subscribers: u64) -> anyhow::Result<Self> {
        anyhow::ensure!(subscribers >= 1, "need at least 1 subscriber");
        let a = match subscribers {
            0..=1_000_000 => 65_535,
            1_000_001..=10_000_000 => 1_048_575,
            _ => 2_097_151,
        };
        Ok(Self { subscribers, a })
    }

    /// `s_id = ((rand(0..=A) | rand(1..=P)) % P) + 1`.
    pub fn s_id(&self, rng: &mut impl Rng) -> u64 {
        let x = rng.random_range(0..=self.a) | rng.random_range(1..=self.subscribers);
        x % self.subscribers + 1
    }

    /// Next transaction.
    pub fn next(&self, rng: &mut impl Rng) -> TxnArgs {
        let mut p = rng.random_range(0..100u32);
        let mut ty = TxnType::DeleteCallForwarding;
        for t in TxnType::ALL {
            if p < t.percent() {
                ty = t;
                break;
            }
            p -= t.percent();
        }
        let end_time = match ty {
            TxnType::GetNewDestination => rng.random_range(1..=24),
            _ => rng.random_range(1..=8),
        };
        TxnArgs {
            ty,
            s_id: self.s_id(rng),
            kind: rng.random_range(1..=4),
            start_time: START_TIMES[rng.random_range(0..START_TIMES.len())],
            end_time,
            value: rng.random(),
        }
    }
}

/// How a committed (or, for an update that found nothing, rolled back) transaction
/// ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It found what it looked for (and, for updates, committed).
    Done,
    /// A lookup found nothing: a read-only type committed, an update rolled back.
    NotFound,
}

/// `s_id` from a `sub_nbr` (the number is the id, zero-padded; see `txn::tatp`).
fn s_id_of(nbr: &str) -> u64 {
    nbr.parse().expect("sub_nbr is 15 digits")
}

/// Run one attempt of `args` in `t` and commit it. Conflict aborts come back as
/// `Err(TxnError::Abort(_))`; a rollback for a failed lookup as `Ok(Outcome::NotFound)`.
pub async fn run(mut t: Txn<'_>, args: TxnArgs) -> Result<Outcome, TxnError> {
    let TxnArgs {
        ty,
        s_id,
        kind,
        start_time,
        end_time,
        value,
    } = args;
    let outcome = match ty {
        TxnType::GetSubscriberData => {
            t.read(SUBSCRIBER, s_id).await?;
            Outcome::Done
        }
        TxnType::GetNewDestination => {
            // The facility and its call forwardings starting no later than start_time,
            // all in one round.
            let mut items = vec![(SPECIAL_FACILITY, sf_key(s_id, kind))];
            items.extend(
                START_TIMES
                    .iter()
                    .filter(|&&st| st <= start_time)
                    .map(|&st| (CALL_FORWARDING, cf_key(s_id, kind, st))),
            );
            let rows = t.get_many(&items).await?;
            let active = rows[0].as_ref().is_some_and(|sf| sf[0] == 1);
            let hit = rows[1..].iter().flatten().any(|cf| cf[0] > end_time);
            if active && hit {
                Outcome::Done
            } else {
                Outcome::NotFound
            }
        }
        TxnType::GetAccessData => {
            match t.get_many(&[(ACCESS_INFO, ai_key(s_id, kind))]).await?[0] {
                Some(_) => Outcome::Done,
                None => Outcome::NotFound,
            }
        }
        TxnType::UpdateSubscriberData => {
            let rows = t
                .get_mixed(&[
                    (SUBSCRIBER, s_id, true),
                    (SPECIAL_FACILITY, sf_key(s_id, kind), true),
                ])
                .await?;
            let (Some(mut sub), Some(mut sf)) = (rows[0].clone(), rows[1].clone()) else {
                return rollback(t).await;
            };
            let bits = u16::from_le_bytes([sub[8], sub[9]]) & !1 | (value & 1) as u16;
            sub[8..10].copy_from_slice(&bits.to_le_bytes());
            sf[2] = value as u8;
            t.write(SUBSCRIBER, s_id, sub)?;
            t.write(SPECIAL_FACILITY, sf_key(s_id, kind), sf)?;
            Outcome::Done
        }
        TxnType::UpdateLocation => {
            let id = s_id_of(&sub_nbr(s_id));
            let mut sub = t.read_for_update(SUBSCRIBER, id).await?;
            sub[32..36].copy_from_slice(&(value as u32).to_le_bytes());
            t.write(SUBSCRIBER, id, sub)?;
            Outcome::Done
        }
        TxnType::InsertCallForwarding => {
            let id = s_id_of(&sub_nbr(s_id));
            // The subscriber and its special facilities (the specification reads all of
            // them), then the insert if the chosen one exists.
            let mut items = vec![(SUBSCRIBER, id)];
            items.extend((1..=4).map(|ty| (SPECIAL_FACILITY, sf_key(id, ty))));
            let rows = t.get_many(&items).await?;
            if rows[0].is_none() || rows[kind as usize].is_none() {
                return rollback(t).await;
            }
            let row = call_forwarding_row(start_time, end_time, value);
            match t
                .insert(CALL_FORWARDING, cf_key(id, kind, start_time), row)
                .await
            {
                Ok(()) => Outcome::Done,
                Err(TxnError::Exists { .. }) => return rollback(t).await,
                Err(e) => return Err(e),
            }
        }
        TxnType::DeleteCallForwarding => {
            let id = s_id_of(&sub_nbr(s_id));
            t.read(SUBSCRIBER, id).await?;
            match t
                .delete(CALL_FORWARDING, cf_key(id, kind, start_time))
                .await
            {
                Ok(()) => Outcome::Done,
                Err(TxnError::NotFound { .. }) => return rollback(t).await,
                Err(e) => return Err(e),
            }
        }
    };
    t.commit().await?;
    Ok(outcome)
}

/// Roll an update back after a failed lookup: an outcome, not a conflict.
async fn rollback(t: Txn<'_>) -> Result<Outcome, TxnError> {
    match t.abort().await {
        TxnError::Abort(AbortReason::User) => Ok(Outcome::NotFound),
        e => Err(e),
    }
}

/// TATP as `txn-bench` runs it (`--workload tatp`): `--subscribers` subscribers
/// populated with `--seed`; the check is the referential consistency of the four
/// tables (`txn::tatp::check`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tatp {
    subscribers: u64,
    /// The population's seed (the check recomputes what the loader drew).
    seed: u64,
}

impl Tatp {
    /// The workload of `args`. Errors: `--sweep theta` (subscribers follow NURand), no
    /// subscriber, `--hot-accounts`.
    pub fn from_args(args: &Args) -> anyhow::Result<Self> {
        crate::txn_args::refuse_theta_sweep(args)?;
        if args.subscribers == 0 {
            bail!("--subscribers must be at least 1");
        }
        crate::txn_args::refuse_hot_accounts(args)?;
        Ok(Self {
            subscribers: args.subscribers,
            seed: args.seed.seed,
        })
    }
}

impl WorkloadSpec for Tatp {
    /// A subscriber's rows share its shard (the subscriber id is TATP's critical field,
    /// Lotus 8.1).
    fn lotus_lock_key(&self) -> txn::lotus::LockKeyFn {
        use txn::tatp::{ACCESS_INFO, CALL_FORWARDING, SPECIAL_FACILITY};
        Arc::new(|t, k| {
            let s_id = match t {
                ACCESS_INFO | SPECIAL_FACILITY => k / 4,
                CALL_FORWARDING => k / 3 / 4,
                _ => k,
            };
            Some(txn::lotus::critical_lock_key(t, s_id, k))
        })
    }

    fn workload(&self) -> Workload {
        Workload::Tatp
    }

    fn label(&self) -> &'static str {
        "TATP"
    }

    fn kinds(&self) -> Vec<&'static str> {
        TxnType::ALL.iter().map(|t| t.name()).collect()
    }

    fn keys(&self) -> u64 {
        self.subscribers
    }

    fn scale(&self) -> String {
        format!("{} subscribers", self.subscribers)
    }

    fn skew(&self, _theta: f64) -> String {
        "keys by TATP's NURand".into()
    }

    /// Up to 21 rows per subscriber (1 + 4 + 4 + 12).
    fn lockd_locks(&self) -> u64 {
        21 * self.subscribers
    }

    fn memnode_args(&self) -> Vec<String> {
        vec![
            "--tatp-subscribers".into(),
            self.subscribers.to_string(),
            "--tatp-seed".into(),
            self.seed.to_string(),
        ]
    }

    /// Nothing to audit before the run: the population is checked by the loader's
    /// tests, and the consistency check runs after the run.
    fn initial_total(&self, _cx: &AuditCx<'_>) -> anyhow::Result<i64> {
        Ok(0)
    }

    fn profiles(&self, _theta: f64) -> anyhow::Result<Arc<dyn Mix>> {
        Ok(Arc::new(Generator::new(self.subscribers)?))
    }

    fn audit_after(&self, cx: &AuditCx<'_>, _: &[WorkerStats]) -> anyhow::Result<Audited> {
        let c = crate::audit::tatp(
            cx.fabric,
            cx.addrs,
            cx.protocol,
            self.subscribers,
            self.seed,
        )?;
        Ok(Audited {
            total: None,
            cvt_locked: c.cvt_locked,
            lockd_held: c.lockd_held,
            check: Some((c.line, c.ok)),
        })
    }

    /// Failed lookups per type against the specification's expected rates (TATP 1.0,
    /// 4.1: failures are outcomes, not aborts), e.g. `failed lookups (expected):
    /// GetNewDestination 76.2% (76.1%), ...`.
    fn outcomes(&self, report: &Report) -> Option<String> {
        Some(failed_lookups(report))
    }
}

/// [`Tatp::outcomes`]' line from the report's rows (in [`TxnType::ALL`] order).
fn failed_lookups(r: &Report) -> String {
    let parts: Vec<String> = TxnType::ALL
        .iter()
        .zip(&r.types)
        .map(|(t, row)| {
            let done = row.committed + row.user_aborts;
            format!(
                "{} {:.1}% ({:.1}%)",
                row.name,
                100.0 * row.failed_lookups as f64 / done.max(1) as f64,
                t.expected_failure_percent()
            )
        })
        .collect();
    format!("failed lookups (expected): {}", parts.join(", "))
}

impl Profiles for Generator {
    type Txn = TxnArgs;

    fn draw(&self, rng: &mut StdRng, _home: u16) -> (TxnArgs, usize) {
        let t = self.next(rng);
        (t, t.ty.index())
    }

    /// The subscriber's row (a subscriber's rows share a shard).
    fn first_record(&self, t: &TxnArgs) -> Option<(u32, u64)> {
        (!t.ty.read_only()).then_some((txn::tatp::SUBSCRIBER, t.s_id))
    }

    /// A read-only type whose lookup fails commits without a result; an update whose
    /// lookup fails rolls back.
    async fn run<'t>(&'t self, mut txn: Txn<'t>, t: &'t TxnArgs) -> Result<Finished, RunError> {
        if t.ty.read_only() {
            txn.declare_read_only();
        }
        match run(txn, *t).await {
            Ok(Outcome::Done) => Ok(Finished::net(0)),
            Ok(Outcome::NotFound) if t.ty.read_only() => Ok(Finished::Committed {
                net: 0,
                inserted: Vec::new(),
                failed_lookup: true,
            }),
            Ok(Outcome::NotFound) => Ok(Finished::RolledBack {
                failed_lookup: true,
            }),
            Err(e) => Err(RunError::Txn(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn mix_and_nurand() {
        let g = Generator::new(100_000).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let mut counts = [0u32; 7];
        let mut lo = 0u32;
        for _ in 0..100_000 {
            let t = g.next(&mut rng);
            assert!((1..=100_000).contains(&t.s_id));
            assert!((1..=4).contains(&t.kind));
            counts[t.ty.index()] += 1;
            lo += u32::from(t.s_id <= 65_536);
        }
        assert_eq!(TxnType::ALL.iter().map(|t| t.percent()).sum::<u32>(), 100);
        for t in TxnType::ALL {
            let pct = f64::from(counts[t.index()]) / 1000.0;
            assert!((pct - f64::from(t.percent())).abs() < 0.7, "{t:?}: {pct}%");
        }
        // NURand with A = 65535 over 100,000: the OR with a 16-bit draw skews the ids
        // low: about 83.5% fall at or below 65,536 (a simulation of the formula), where a
        // uniform draw would put 65.5%.
        assert!(
            lo > 81_000 && lo < 86_000,
            "{lo} of 100000 at or below 65536"
        );
        assert_eq!(
            TxnType::ALL
                .iter()
                .filter(|t| t.read_only())
                .map(|t| t.percent())
                .sum::<u32>(),
            80
        );
        assert!(Generator::new(0).is_err());
        assert_eq!(s_id_of(&sub_nbr(123)), 123);
    }
}
