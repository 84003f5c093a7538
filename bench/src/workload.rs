//! The workloads of `txn-bench`: the `--workload` flag ([`Workload`]) and the interface
//! each workload implements in its own file ([`WorkloadSpec`] for what a run does with
//! it, [`Profiles`] for its transactions): SmallBank ([`crate::smallbank`]), the KVS /
//! YCSB family ([`crate::ycsb`]), TATP ([`crate::tatp`]), TPC-C ([`crate::tpcc`]) and the
//! atomicity workload `pairs` ([`crate::pairs`]).
//!
//! A run asks the workload, in order: its arguments checked and resolved (the
//! constructor the registry [`crate::txnbench::workload_spec`] calls), the flags that make each memory node load
//! its rows ([`WorkloadSpec::memnode_args`]), the audit of the loaded rows
//! ([`WorkloadSpec::initial_total`]), a transaction source per sweep point
//! ([`WorkloadSpec::profiles`], whose [`Profiles`] the coordinators drive with static
//! dispatch), and the audit after the run ([`WorkloadSpec::audit_after`]), which
//! [`Audited::judge`] turns into the report's verdict.
//!
//! Adding a workload: a file with a type implementing both traits, its flag value in
//! [`Workload`], and its line in [`crate::txnbench::workload_spec`].

use std::cell::RefCell;
use std::fmt;
use std::future::Future;
use std::rc::Rc;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

use rand::rngs::StdRng;
use rrpc::fabric::Fabric;
use txn::coordinator::{ClusterAddrs, Protocol, Txn, TxnClient, TxnError};

use crate::report::{Report, WorkerStats};

/// The `--workload` flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// SmallBank (the default).
    SmallBank,
    /// The papers' KVS: one read or update per transaction, half each.
    Kvs,
    /// YCSB A: 50% reads, 50% updates.
    YcsbA,
    /// YCSB B: 95% reads, 5% updates.
    YcsbB,
    /// YCSB C: reads only.
    YcsbC,
    /// YCSB D: 95% reads of the latest keys, 5% inserts of new keys.
    YcsbD,
    /// YCSB E: 95% short range scans (up to 100 records), 5% inserts of new keys;
    /// scans go through the range index (a B-link tree on memory node 0).
    YcsbE,
    /// YCSB F: 50% reads, 50% read-modify-writes.
    YcsbF,
    /// TATP: seven transaction types, 80% reads, non-uniform subscriber ids.
    Tatp,
    /// TPC-C: five transaction types in the standard mix (45/43/4/4/4).
    Tpcc,
    /// The atomicity workload: groups of objects written whole, read whole
    /// ([`crate::pairs`]).
    Pairs,
}

impl FromStr for Workload {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "smallbank" => Self::SmallBank,
            "kvs" => Self::Kvs,
            "ycsb-a" => Self::YcsbA,
            "ycsb-b" => Self::YcsbB,
            "ycsb-c" => Self::YcsbC,
            "ycsb-d" => Self::YcsbD,
            "ycsb-e" => Self::YcsbE,
            "ycsb-f" => Self::YcsbF,
            "tatp" => Self::Tatp,
            "tpcc" | "tpc-c" => Self::Tpcc,
            "pairs" => Self::Pairs,
            _ => {
                return Err(format!(
                    "unknown workload {s:?}: smallbank, kvs, ycsb-a, ycsb-b, ycsb-c, ycsb-d, \
                     ycsb-e, ycsb-f, tatp, tpcc or pairs"
                ))
            }
        })
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Workload {
    /// The flag's spelling.
    pub fn name(self) -> &'static str {
        match self {
            Self::SmallBank => "smallbank",
            Self::Kvs => "kvs",
            Self::YcsbA => "ycsb-a",
            Self::YcsbB => "ycsb-b",
            Self::YcsbC => "ycsb-c",
            Self::YcsbD => "ycsb-d",
            Self::YcsbE => "ycsb-e",
            Self::YcsbF => "ycsb-f",
            Self::Tatp => "tatp",
            Self::Tpcc => "tpcc",
            Self::Pairs => "pairs",
        }
    }

    /// Whether the workload runs on the KVS table (`kvs` and the YCSB presets).
    pub fn is_kvs(self) -> bool {
        !matches!(
            self,
            Self::SmallBank | Self::Tatp | Self::Tpcc | Self::Pairs
        )
    }

    /// KVS / YCSB: percent of operations that write (update, read-modify-write or
    /// insert); 0 for the other workloads.
    pub fn write_percent(self) -> u32 {
        match self {
            Self::SmallBank | Self::Tatp | Self::Tpcc | Self::Pairs | Self::YcsbC => 0,
            Self::Kvs | Self::YcsbA | Self::YcsbF => 50,
            Self::YcsbB | Self::YcsbD | Self::YcsbE => 5,
        }
    }

    /// KVS / YCSB operations per transaction without `--ops-per-txn`: 1 for kvs and
    /// ycsb-e (a scan of up to 100 records is a transaction), 4 for the other YCSB
    /// presets.
    pub fn default_ops(self) -> usize {
        if matches!(self, Self::Kvs | Self::YcsbE) {
            1
        } else {
            4
        }
    }

    /// Whether the workload scans key ranges, which needs the range index (`ycsb-e`).
    pub fn needs_range_index(self) -> bool {
        self == Self::YcsbE
    }
}

/// One workload as a run of `txn-bench` uses it, built from the flags by [`crate::txnbench::workload_spec`]: its
/// names, its data, its transaction source and its checks. Everything here is off the
/// hot path (called a few times per run); the transactions themselves are [`Profiles`].
pub trait WorkloadSpec: Send + Sync {
    /// The `--workload` value this implements (for the KVS family, the preset).
    fn workload(&self) -> Workload;

    /// The workload as reports name it (`SmallBank`, `ycsb-a`, `TATP`, `TPC-C`).
    fn label(&self) -> &'static str;

    /// Transaction kinds as the report lists them (index = the kind a [`Profiles::draw`]
    /// returns and the history records).
    fn kinds(&self) -> Vec<&'static str>;

    /// The size the report records as its key count: accounts, records, subscribers or
    /// warehouses.
    fn keys(&self) -> u64;

    /// The size of the data for the report's header (`100000 accounts`, `3
    /// warehouse(s)`, ...).
    fn scale(&self) -> String;

    /// How keys are drawn at Zipf `theta`, for the report's header: `Zipf theta 0.99`
    /// unless the workload follows its specification's own rule.
    fn skew(&self, theta: f64) -> String {
        format!("Zipf theta {theta}")
    }

    /// Locks of the lock service (Scythe): about one per row a transaction can lock.
    /// Objects share a lock past that (`TxnClient::lock_id`), which only adds false
    /// conflicts.
    fn lockd_locks(&self) -> u64;

    /// Lotus's lock key of each record (Lotus 4.2: the shard from the table's critical
    /// field); default: random sharding ([`txn::lotus::hashed_lock_key`]).
    fn lotus_lock_key(&self) -> txn::lotus::LockKeyFn {
        Arc::new(|t, k| Some(txn::lotus::hashed_lock_key(t, k)))
    }

    /// Population: the `memnode` flags that make each memory node load this workload's
    /// rows (each node keeps its partition of them).
    fn memnode_args(&self) -> Vec<String>;

    /// Audit of the loaded data before the run; returns the initial total the run's
    /// money check starts from (SmallBank's money in cents, 0 where nothing is
    /// conserved). Errors: the data is not as loaded, or the audit could not read it.
    fn initial_total(&self, cx: &AuditCx<'_>) -> anyhow::Result<i64>;

    /// The transaction source at Zipf `theta` (one per sweep point, shared by every
    /// coordinator thread). Errors: a `theta` or a combination of flags the
    /// workload's generator refuses.
    fn profiles(&self, theta: f64) -> anyhow::Result<Arc<dyn Mix>>;

    /// Audit after the run, with the coordinators' counters (`workers`): the rows read
    /// back, the workload's own check, the locks left held. Errors: the audit could not
    /// read the rows (a failed check is not an error but a verdict in [`Audited`]).
    fn audit_after(&self, cx: &AuditCx<'_>, workers: &[WorkerStats]) -> anyhow::Result<Audited>;

    /// A line of outcome statistics for the report, if the workload has one (TATP's
    /// failed lookups against the specification's rates).
    fn outcomes(&self, _report: &Report) -> Option<String> {
        None
    }
}

/// A workload's transaction profiles at one point: the hot path, called per
/// transaction by every coordinator coroutine, statically dispatched (the driver is
/// generic over it; [`WorkloadSpec::profiles`] erases the type once per run).
pub trait Profiles: Send + Sync + 'static {
    /// A drawn transaction's inputs; retried as drawn until it commits or is final.
    /// Serializable: `--routing forward` sends them to another compute node.
    type Txn: serde::Serialize + serde::de::DeserializeOwned;

    /// Draw the next transaction of a coordinator whose TPC-C home warehouse is `home`
    /// (1 to the warehouses; the other workloads ignore it). Returns the transaction and
    /// its kind (an index into [`WorkloadSpec::kinds`]).
    fn draw(&self, rng: &mut StdRng, home: u16) -> (Self::Txn, usize);

    /// The first record `(table, key)` a read-write transaction `t` touches, by which
    /// Lotus's hybrid routing sends it to the compute node owning that record's shard
    /// (Lotus 4.3, `--routing`); `None` for a read-only transaction, which any compute
    /// node runs. Default: `None` (no routing).
    fn first_record(&self, _t: &Self::Txn) -> Option<(u32, u64)> {
        None
    }

    /// Run one attempt of `t` in `txn` and commit it. `Ok` is final (committed, or
    /// rolled back by the transaction's own logic); a conflict comes back as
    /// `Err(RunError::Txn(TxnError::Abort(_)))` and is retried; a failed value check
    /// as `Err(RunError::Check(_))`, which stops the run.
    fn run<'t>(
        &'t self,
        txn: Txn<'t>,
        t: &'t Self::Txn,
    ) -> impl Future<Output = Result<Finished, RunError>> + 't;
}

/// How a transaction that will not be retried ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finished {
    /// Committed with this net money (SmallBank, cents) or these updates (KVS), the
    /// keys it inserted (YCSB D), and whether its lookup found nothing (TATP).
    Committed {
        /// Net money added (cents), or updates committed.
        net: i64,
        /// Keys inserted.
        inserted: Vec<u64>,
        /// The lookup found nothing (a TATP read-only type committed without a
        /// result).
        failed_lookup: bool,
    },
    /// Rolled back by its own logic (TPC-C NEW-ORDER's 1%, a TATP update whose lookup
    /// failed).
    RolledBack {
        /// The lookup found nothing.
        failed_lookup: bool,
    },
}

impl Finished {
    /// Committed with `net` and nothing else to say.
    pub fn net(net: i64) -> Self {
        Self::Committed {
            net,
            inserted: Vec::new(),
            failed_lookup: false,
        }
    }
}

/// What an audit reads through: the run's fabric, its cluster and the protocol (whose
/// lock words and lock service the audit inspects).
#[derive(Clone, Copy)]
pub struct AuditCx<'a> {
    /// This process's fabric.
    pub fabric: &'a Fabric,
    /// The cluster's services.
    pub addrs: &'a ClusterAddrs,
    /// The protocol of the run.
    pub protocol: Protocol,
}

/// What a workload's audit after a run found, in the terms the report judges.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Audited {
    /// The total to compare with the initial total plus the net committed: SmallBank's
    /// money (cents), the KVS update counters summed; `None` when nothing is conserved
    /// (TATP, TPC-C: their consistency check decides).
    pub total: Option<i64>,
    /// CVT lock words held among the rows read.
    pub cvt_locked: u64,
    /// Lock service locks held or queued (`None` without a lock service).
    pub lockd_held: Option<u64>,
    /// The workload's own check: its line and whether it passed (`None`: the money
    /// check is the workload's check).
    pub check: Option<(String, bool)>,
}

impl Audited {
    /// Record the audit in `report`, whose run started from `initial_total`: the total
    /// (or, without one, `initial_total + net committed`), the locks held, then the
    /// workload's own check ([`Report::audit`], [`Report::workload_check`]).
    pub fn judge(self, initial_total: i64, report: &mut Report) {
        let total = self.total.unwrap_or(initial_total + report.net_committed);
        report.audit(initial_total, total, self.cvt_locked, self.lockd_held);
        if let Some((line, ok)) = self.check {
            report.workload_check(line, ok);
        }
    }
}

/// Why a transaction attempt did not commit (a KVS one, or in `txn-bench` any: SmallBank's
/// errors are all [`RunError::Txn`]).
#[derive(Debug)]
pub enum RunError {
    /// The transaction aborted or a service failed.
    Txn(TxnError),
    /// A value read failed its check (or a loaded key was missing): fatal.
    Check(String),
}

impl From<TxnError> for RunError {
    fn from(e: TxnError) -> Self {
        Self::Txn(e)
    }
}

/// What one coordinator coroutine needs besides its profiles.
pub struct Coroutine {
    /// The thread's transaction client.
    pub client: Rc<TxnClient>,
    /// The thread's counters, shared by its coroutines (never borrowed across an
    /// await).
    pub stats: Rc<RefCell<WorkerStats>>,
    /// Ends the run: the coroutine finishes its transaction (a conflict abort is then
    /// not retried) and returns. A service failure or a failed value check sets it.
    pub stop: Arc<AtomicBool>,
    /// Commits over all threads (for progress lines and the TSO restart record).
    pub committed: Arc<AtomicU64>,
    /// Names of the transaction kinds, for fatal errors.
    pub kinds: Rc<[&'static str]>,
    /// The coroutine's RNG seed.
    pub seed: u64,
    /// Longest backoff after a conflict abort, microseconds (0: yield and retry).
    pub max_backoff_us: u64,
    /// TPC-C home warehouse (1 to the warehouses).
    pub home: u16,
    /// Run one transaction of every kind, in order, before the mix.
    pub each_type_first: bool,
    /// The run's clock: the timeline's intervals and the history's wall-clock times.
    pub clock: RunClock,
    /// This coroutine's slot in its compute node's ledger (coordinator processes only):
    /// its commits counted where a `kill -9` cannot erase them.
    pub ledger: Option<crate::ledger::LedgerSlot>,
    /// `--routing ideal` under Lotus: draw read-write transactions on this compute
    /// node's own shards ([`crate::routing`]).
    pub route: Option<crate::routing::SharedRoute>,
    /// `--routing forward` under Lotus: where read-write transactions of other compute
    /// nodes' shards go ([`crate::forward`]).
    pub forward: Option<crate::forward::ForwardPlan>,
    /// Under Lotus: this compute node's lock table, whose load meter takes each committed
    /// transaction's latency (Lotus 4.3: a node's resharding loop compares its compute
    /// nodes' transaction latencies, which a busy lock table slows down).
    pub lock_table: Option<std::sync::Arc<lockd::table_service::TableService>>,
}

/// What a coordinator coroutine times: commits and aborts per interval of the run
/// ([`crate::timeline::Timeline`]) and the wall-clock times of the recorded history.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunClock {
    /// The run's start, `CLOCK_MONOTONIC` ns ([`txn::history::monotonic_ns`]); interval
    /// `i` is `[t0 + i * interval, t0 + (i + 1) * interval)`.
    pub t0_ns: u64,
    /// Interval length, ns; 0 counts nothing per interval.
    pub interval_ns: u64,
    /// Record each committed transaction's `CLOCK_MONOTONIC` start and end in the
    /// history (`--history-out`, coordinator processes).
    pub wall: bool,
}

impl RunClock {
    /// The interval `now_ns` falls in (0 before the start), `None` when not counting.
    pub fn interval(&self, now_ns: u64) -> Option<usize> {
        (self.interval_ns > 0)
            .then(|| (now_ns.saturating_sub(self.t0_ns) / self.interval_ns) as usize)
    }
}

/// A coroutine of a coordinator thread, ready to be spawned on the thread's executor
/// (an [`rrpc::runtime::Executor`], or a server thread's through
/// [`rrpc::runtime::ThreadCtx::spawn`]).
pub type Task = std::pin::Pin<Box<dyn Future<Output = ()>>>;

/// A workload's profiles with their type erased: what a coordinator thread starts its
/// coroutines with. Implemented for every [`Profiles`].
pub trait Mix: Send + Sync {
    /// One coordinator coroutine, running transactions drawn from these profiles until
    /// `co.stop` is set.
    fn coordinator(self: Arc<Self>, co: Coroutine) -> Task;

    /// One home coroutine of `--routing forward`: it runs the transactions other
    /// compute nodes forwarded to `inbox` until `co.stop` is set ([`crate::forward`]).
    fn home(self: Arc<Self>, co: Coroutine, inbox: Arc<crate::forward::Inbox>) -> Task;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::txn_args::Args;
    use crate::txnbench::workload_spec as spec;

    #[test]
    fn workload_flag() {
        assert_eq!("ycsb-a".parse::<Workload>(), Ok(Workload::YcsbA));
        assert_eq!("kvs".parse::<Workload>().unwrap().default_ops(), 1);
        assert_eq!("tpc-c".parse::<Workload>(), Ok(Workload::Tpcc));
        assert!("ycsb-z".parse::<Workload>().is_err());
        for w in [
            "smallbank",
            "kvs",
            "ycsb-a",
            "ycsb-b",
            "ycsb-c",
            "ycsb-d",
            "ycsb-e",
            "ycsb-f",
            "tatp",
            "tpcc",
            "pairs",
        ] {
            let parsed = w.parse::<Workload>().unwrap();
            assert_eq!(parsed.name(), w);
        }
        assert!(!Workload::Tatp.is_kvs() && Workload::YcsbD.is_kvs());
    }

    fn args(a: &[&str]) -> Args {
        use clap::Parser;
        Args::parse_from(std::iter::once("txn-bench").chain(a.iter().copied()))
    }

    fn refusal(a: &[&str]) -> String {
        format!("{:#}", spec(&args(a)).err().expect("refused"))
    }

    #[test]
    fn the_registry_maps_every_flag_value_to_its_implementation() {
        for (flag, label, kinds) in [
            ("smallbank", "SmallBank", 6),
            ("kvs", "kvs", 2),
            ("ycsb-a", "ycsb-a", 2),
            ("ycsb-b", "ycsb-b", 2),
            ("ycsb-c", "ycsb-c", 1),
            ("ycsb-d", "ycsb-d", 2),
            ("ycsb-e", "ycsb-e", 2),
            ("ycsb-f", "ycsb-f", 2),
            ("tatp", "TATP", 7),
            ("tpcc", "TPC-C", 5),
            ("pairs", "pairs", 2),
        ] {
            let w = spec(&args(&["--workload", flag])).unwrap();
            assert_eq!(w.workload().name(), flag);
            assert_eq!(w.workload(), flag.parse().unwrap());
            assert_eq!((w.label(), w.kinds().len()), (label, kinds), "{flag}");
            assert!(!w.memnode_args().is_empty(), "{flag} loads nothing");
            assert!(w.lockd_locks() >= w.keys(), "{flag}");
            // Every point's profiles build at the default theta.
            assert!(w.profiles(0.99).is_ok(), "{flag}");
        }
    }

    #[test]
    fn each_workload_refuses_its_bad_arguments() {
        // SmallBank.
        assert!(refusal(&["--accounts", "1"]).contains("--accounts must be at least 2"));
        let w = spec(&args(&["--hot-accounts", "1"])).unwrap();
        let e = format!("{:#}", w.profiles(0.5).err().unwrap());
        assert!(e.contains("hot accounts must be 2"), "{e}");
        let w = spec(&args(&[])).unwrap();
        let e = format!("{:#}", w.profiles(-1.0).err().unwrap());
        assert!(e.contains("theta must be >= 0"), "{e}");
        // KVS / YCSB.
        for w in ["kvs", "ycsb-a"] {
            let e = refusal(&["--workload", w, "--value-bytes", "8"]);
            assert!(
                e.contains("--value-bytes must be at least 16 (got 8)"),
                "{e}"
            );
            let e = refusal(&["--workload", w, "--hot-accounts", "10"]);
            assert!(e.contains("smallbank only"), "{e}");
        }
        let w = spec(&args(&["--workload", "ycsb-a", "--records", "6"])).unwrap();
        let e = format!("{:#}", w.profiles(0.5).err().unwrap());
        assert!(e.contains("--ops-per-txn must be 1 to records / 2"), "{e}");
        // TATP.
        let e = refusal(&["--workload", "tatp", "--sweep", "theta=0,0.5"]);
        assert!(e.contains("--sweep theta does not apply to tatp"), "{e}");
        assert!(refusal(&["--workload", "tatp", "--subscribers", "0"]).contains("--subscribers"));
        assert!(refusal(&["--workload", "tatp", "--hot-accounts", "2"]).contains("smallbank only"));
        assert!(spec(&args(&["--workload", "tatp", "--sweep", "clients=1,2"])).is_ok());
        // TPC-C.
        let e = refusal(&["--workload", "tpcc", "--sweep", "theta=0"]);
        assert!(e.contains("NURand"), "{e}");
        assert!(refusal(&["--workload", "tpcc", "--warehouses", "0"]).contains("--warehouses"));
        assert!(refusal(&["--workload", "tpcc", "--hot-accounts", "2"]).contains("smallbank only"));
        // pairs.
        assert!(refusal(&["--workload", "pairs", "--groups", "0"]).contains("--groups"));
        assert!(refusal(&["--workload", "pairs", "--group-size", "1"]).contains("--group-size"));
        let e = refusal(&["--workload", "pairs", "--groups", "100000000"]);
        assert!(e.contains("at most 67108864 objects"), "{e}");
    }

    fn report(net: i64) -> Report {
        let mut w = WorkerStats::with_kinds(1);
        w.types[0].record_commit(std::time::Duration::from_micros(3));
        w.net = net;
        Report::with_kinds(
            &["t"],
            "shm".into(),
            1,
            1,
            10,
            0.0,
            std::time::Duration::from_secs(1),
            &[w],
        )
    }

    #[test]
    fn the_verdict_fails_on_lost_money_held_locks_or_a_failed_check() {
        let audited = |total, cvt_locked, check| Audited {
            total,
            cvt_locked,
            lockd_held: Some(0),
            check,
        };
        // Money conserved: 1000 + 30 committed = 1030 found.
        let mut r = report(30);
        audited(Some(1030), 0, None).judge(1000, &mut r);
        assert!(r.invariant_holds);
        let mut r = report(30);
        audited(Some(1029), 0, None).judge(1000, &mut r);
        assert!(!r.invariant_holds, "a cent lost");
        let mut r = report(30);
        audited(Some(1030), 1, None).judge(1000, &mut r);
        assert!(!r.invariant_holds, "a lock word left held");
        // Nothing conserved: the workload's check decides.
        let mut r = report(0);
        audited(None, 0, Some(("consistent".into(), true))).judge(0, &mut r);
        assert!(r.invariant_holds);
        assert_eq!(r.workload_check.as_deref(), Some("consistent"));
        let mut r = report(0);
        audited(None, 0, Some(("BROKEN".into(), false))).judge(0, &mut r);
        assert!(!r.invariant_holds);
    }
}
