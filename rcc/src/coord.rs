//! A coordinator: one transaction co-routine of RCC (3), its identity, timestamps,
//! counters, and the transaction it runs. The protocols ([`crate::twopl`],
//! [`crate::occ`], [`crate::mvcc`], [`crate::sundial`]) are async functions over a
//! [`Coord`].

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Instant;

use txn::history::Access;

use crate::layout::{Layout, Shape, VAL, VER};
use crate::net::{Net, NetError};

/// The concurrency-control protocols (RCC, 4.2-4.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proto {
    /// Two-phase locking that aborts on any conflict (4.2).
    NoWait,
    /// Two-phase locking where an older transaction waits and a younger one dies (4.3).
    WaitDie,
    /// Optimistic: read, lock the write set, validate the read set, write back (4.4, after
    /// DrTM+H).
    Occ,
    /// Timestamp ordering over 4 static version slots per tuple (4.4).
    Mvcc,
    /// Logical leases `[wts, rts]`: writers lock, readers renew leases at commit (4.5).
    Sundial,
    /// Deterministic: one global order of inputs per epoch, locks granted in that order,
    /// local reads forwarded, no 2PC (4.6). Not per transaction: it runs with
    /// [`crate::calvin::drive`], never [`Coord::run`].
    Calvin,
}

impl Proto {
    /// Every protocol built, in the paper's order.
    pub const ALL: [Proto; 6] = [
        Proto::NoWait,
        Proto::WaitDie,
        Proto::Occ,
        Proto::Mvcc,
        Proto::Sundial,
        Proto::Calvin,
    ];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Proto::NoWait => "nowait",
            Proto::WaitDie => "waitdie",
            Proto::Occ => "occ",
            Proto::Calvin => "calvin",
            Proto::Mvcc => "mvcc",
            Proto::Sundial => "sundial",
        }
    }

    /// The tuple shape the protocol's metadata needs (RCC, Fig. 3).
    pub fn shape(self) -> Shape {
        match self {
            Proto::Mvcc => Shape::Mvcc,
            Proto::Sundial => Shape::Sundial,
            _ => Shape::Basic,
        }
    }

    /// The protocol named `s`, if any.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == s)
    }
}

/// Which primitive a protocol's network steps use (RCC, 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Variant {
    /// Two-sided: one RPC per participant per stage, served by the participant's CPU.
    Rpc,
    /// One-sided READ, WRITE and CAS, with doorbell batching of lock-and-read and
    /// update-and-unlock.
    OneSided,
}

impl Variant {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Rpc => "rpc",
            Variant::OneSided => "onesided",
        }
    }
}

/// The stages a transaction's time is split into (RCC, Fig. 21).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Optimistic reads (OCC).
    Read = 0,
    /// Locking (with the reads batched into it, for the 2PL protocols).
    Lock = 1,
    /// Read-set validation (OCC), MVCC readers' second READ.
    Validate = 2,
    /// Releasing locks after an abort.
    Release = 3,
    /// Write-back and unlock.
    Commit = 4,
    /// SUNDIAL's lease renewal and read check at commit (RCC, 4.5 a4).
    Renew = 5,
}

/// Stage names, indexed by [`Stage`].
pub const STAGES: [&str; 6] = ["Read", "Lock", "Validate", "Release", "Commit", "Renew"];

/// A coordinator's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Stats {
    /// Network round trips: awaited groups of parallel operations.
    pub rounds: u64,
    /// One-sided operations (work requests) posted.
    pub ops: u64,
    /// RPC messages sent.
    pub msgs: u64,
    /// One-sided record pairs issued: lock-and-read pairs ([`Coord::pair`]) and
    /// per-record update-and-unlock lists ([`Coord::write_list`]). With doorbell
    /// batching each goes out in one list with one signaled completion (RCC, 4.2), or
    /// shares a list with others.
    pub pairs: u64,
    /// One-sided lock CASes `0 -> v` that returned `v` itself: the word already held
    /// this attempt's own owner value, which only this attempt's CAS can have written,
    /// so it took effect and its reply reported the word after it (as a retransmitted
    /// atomic executed twice would). Counted, and taken as acquired
    /// ([`Coord::acquired`]): taken as a conflict, such a lock is never released and
    /// every transaction that needs it aborts until the run's watchdog fires, as one
    /// SUNDIAL run in the Soft-RoCE VM under host load did.
    pub replayed_cas: u64,
    /// Nanoseconds spent per [`Stage`].
    pub stage_ns: [u64; STAGES.len()],
    /// Round trips per [`Stage`].
    pub stage_rounds: [u64; STAGES.len()],
}

impl Stats {
    /// The counts accrued since `base` (an earlier snapshot of the same counters),
    /// counter by counter.
    pub fn since(&self, base: &Stats) -> Stats {
        let mut d = Stats {
            rounds: self.rounds.saturating_sub(base.rounds),
            ops: self.ops.saturating_sub(base.ops),
            msgs: self.msgs.saturating_sub(base.msgs),
            pairs: self.pairs.saturating_sub(base.pairs),
            replayed_cas: self.replayed_cas.saturating_sub(base.replayed_cas),
            ..Stats::default()
        };
        for i in 0..STAGES.len() {
            d.stage_ns[i] = self.stage_ns[i].saturating_sub(base.stage_ns[i]);
            d.stage_rounds[i] = self.stage_rounds[i].saturating_sub(base.stage_rounds[i]);
        }
        d
    }

    /// Add `o`'s counts to these.
    pub fn add(&mut self, o: &Stats) {
        self.rounds += o.rounds;
        self.ops += o.ops;
        self.msgs += o.msgs;
        self.pairs += o.pairs;
        self.replayed_cas += o.replayed_cas;
        for i in 0..STAGES.len() {
            self.stage_ns[i] += o.stage_ns[i];
            self.stage_rounds[i] += o.stage_rounds[i];
        }
    }
}

/// One record a transaction touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Op {
    /// Table id.
    pub table: u32,
    /// Key in the table.
    pub key: u64,
    /// Read-modify-write (true) or read-only access.
    pub write: bool,
}

/// A transaction's logic over the values of its records, in [`TxnSpec::ops`] order;
/// it changes the written ones in place. Returns false to abort (the transaction's own
/// decision, final).
pub type Exec = Box<dyn Fn(&mut [Vec<u8>]) -> bool>;

/// A row a transaction inserts: a record that did not exist before (TPC-C New-Order's
/// ORDER, NEW_ORDER and ORDER_LINE rows; TPC-C, clause 2.4.2.2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Insert {
    /// Table id.
    pub table: u32,
    /// Key in the table; the workload makes it unique among committed transactions.
    pub key: u64,
    /// The record, exactly the table's record size.
    pub record: Vec<u8>,
}

/// The rows a transaction inserts, computed from the final values of its records (after
/// [`TxnSpec::exec`] returned true), in [`TxnSpec::ops`] order.
pub type Inserts = Box<dyn Fn(&[Vec<u8>]) -> Vec<Insert>>;

/// A transaction whose records are known before it runs, as in RCC's benchmarks, plus
/// optional inserts whose keys depend on values it reads.
///
/// Inserts take no lock: the workload guarantees their keys unique among committed
/// transactions (New-Order derives them from `d_next_o_id`, a record the transaction
/// writes under the protocol's concurrency control). Every per-transaction protocol
/// writes them in its commit round, the whole fresh tuple as a first version (one-sided:
/// one WRITE per row; RPC: entries without unlock in the node's [`crate::wire::COMMIT`]
/// message, one of their own for a node with nothing else to commit and for MVCC, whose
/// commit has its own handler), and records them in the history as writes of a new
/// version. CALVIN writes them on their home node, a receiver ([`crate::calvin`]).
/// An inserted row can be read half-written only by a transaction that reads rows it
/// did not insert and that are not in its [`TxnSpec::ops`] — no workload here does.
pub struct TxnSpec {
    /// Its type, for reports and the history.
    pub kind: u16,
    /// The records, each at most once.
    pub ops: Vec<Op>,
    /// Its logic.
    pub exec: Exec,
    /// Rows it inserts at commit, if any.
    pub inserts: Option<Inserts>,
}

impl std::fmt::Debug for TxnSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxnSpec")
            .field("kind", &self.kind)
            .field("ops", &self.ops)
            .field("inserts", &self.inserts.is_some())
            .finish()
    }
}

/// Why an attempt did not commit.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Abort {
    /// A lock was held by another transaction (or this one died in WAITDIE).
    #[error("lock conflict")]
    Conflict,
    /// A record read changed before commit.
    #[error("validation failed")]
    Validation,
    /// The transaction's logic declined; not retried.
    #[error("aborted by the transaction")]
    User,
    /// The run is stopping; the attempt gave up its locks.
    #[error("stopped")]
    Stopped,
    /// The network failed.
    #[error(transparent)]
    Net(#[from] NetError),
    /// The protocol does not run single transactions (CALVIN: see
    /// [`crate::calvin::drive`]).
    #[error("{0}")]
    Unsupported(&'static str),
}

/// Bugs planted on purpose (feature `fault-injection`) so tests show the checks catch
/// them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// NOWAIT reads without read locks.
    NoWaitNoReadLocks,
    /// OCC commits without validating its read set.
    OccNoValidation,
    /// WAITDIE where every conflict waits (deadlocks).
    WaitDieNeverDie,
    /// MVCC readers that do not raise `rts`: a writer with a smaller timestamp installs a
    /// version under a committed reader.
    MvccReadersDontRaiseRts,
    /// SUNDIAL lease renewal by a blind WRITE of `rts` (one-sided) or a handler that
    /// extends it unconditionally (RPC), instead of the CAS that checks `wts` unchanged
    /// and the re-check of the lock.
    SundialBlindRenewal,
    /// CALVIN whose lock managers grant locks first come, first served (in the order
    /// requests arrive) instead of in the global sequence order.
    CalvinArrivalOrder,
}

/// A timestamp source outside the coordinator (`--ts tso`: this project's timestamp
/// oracle, Scythe 4.5): each call returns the next timestamp (unique, nonzero, below
/// 2^53, larger than every one handed out before the call) or the source's error.
pub type TsSource = Rc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<u64, String>>>>>;

/// One coordinator co-routine.
pub struct Coord<N> {
    /// Its access to the nodes.
    pub net: N,
    /// Where records live.
    pub layout: Rc<Layout>,
    /// Its protocol.
    pub proto: Proto,
    /// Its primitive.
    pub variant: Variant,
    /// Its id, unique in the cluster, `1..1024`: the NOWAIT and OCC lock value and the
    /// low bits of its timestamps.
    pub id: u64,
    /// Set when the run stops: waiting loops give up.
    pub stop: Rc<Cell<bool>>,
    /// Where WAITDIE's and MVCC's timestamps come from: `None` for RCC's local clocks
    /// ([`Coord::begin`]), or an oracle ([`Coord::start`]).
    pub tso: Option<TsSource>,
    /// Whether a record's two one-sided operations (lock-and-read, update-and-unlock)
    /// share one doorbell (RCC, 3 and 4.2; default on). Off, the second is posted a
    /// scheduler turn after the first, on the same QP.
    pub doorbell_batching: bool,
    stats: RefCell<Stats>,
    ts: Cell<u64>,
    seen: Cell<u64>,
    fault: Option<Fault>,
}

/// Bits of a timestamp below the clock, holding the coordinator id.
pub const ID_BITS: u32 = 10;

impl<N: Net> Coord<N> {
    /// Coordinator `id` (`1..1024`). Panics on an id out of range (a setup bug).
    pub fn new(net: N, layout: Rc<Layout>, proto: Proto, variant: Variant, id: u64) -> Self {
        assert!((1..1 << ID_BITS).contains(&id), "coordinator id {id}");
        Self {
            net,
            layout,
            proto,
            variant,
            id,
            stop: Rc::new(Cell::new(false)),
            doorbell_batching: true,
            tso: None,
            stats: RefCell::new(Stats::default()),
            ts: Cell::new(0),
            seen: Cell::new(0),
            fault: None,
        }
    }

    /// Plant `fault` in this coordinator.
    #[cfg(feature = "fault-injection")]
    pub fn plant(&mut self, fault: Fault) {
        self.fault = Some(fault);
    }

    /// Whether `fault` is planted (always false without the feature).
    pub fn planted(&self, fault: Fault) -> bool {
        cfg!(feature = "fault-injection") && self.fault == Some(fault)
    }

    /// Counters so far.
    pub fn stats(&self) -> Stats {
        *self.stats.borrow()
    }

    /// Start a transaction: a fresh timestamp unless it retries an aborted attempt (a
    /// WAITDIE transaction keeps its age across retries, so it cannot starve). A fresh
    /// timestamp's clock is past the previous one's and past every timestamp passed to
    /// [`Coord::observe`] (RCC, 4.4: the clock advances past larger `wts`/`rts` seen).
    pub fn begin(&self, retry: bool) {
        if !retry || self.ts.get() == 0 || self.proto != Proto::WaitDie {
            let floor = (self.ts.get().max(self.seen.get()) >> ID_BITS) + 1;
            let now = txn::history::monotonic_ns().max(floor);
            self.ts.set((now << ID_BITS) | self.id);
        }
    }

    /// Start a transaction as [`Coord::begin`] does, with WAITDIE's and MVCC's fresh
    /// timestamps taken from [`Coord::tso`] when set: the oracle's timestamp with this
    /// coordinator's id in the low [`ID_BITS`] bits. An oracle timestamp is larger than
    /// every one handed out before, so it is also past every timestamp
    /// [`Coord::observe`]d. Errors: the oracle's, as [`Abort::Net`] with
    /// [`NetError::Timestamp`].
    pub async fn start(&self, retry: bool) -> Result<(), Abort> {
        let Some(src) = self.tso.as_ref() else {
            self.begin(retry);
            return Ok(());
        };
        let needs = matches!(self.proto, Proto::WaitDie | Proto::Mvcc);
        if !needs || (retry && self.ts.get() != 0 && self.proto == Proto::WaitDie) {
            self.begin(retry);
            return Ok(());
        }
        let t = src()
            .await
            .map_err(|why| Abort::Net(NetError::Timestamp { why }))?;
        if t == 0 || t >= 1 << (63 - ID_BITS) {
            return Err(Abort::Net(NetError::Timestamp {
                why: format!("timestamp {t:#x} is outside 1..2^53"),
            }));
        }
        self.ts.set((t << ID_BITS) | self.id);
        Ok(())
    }

    /// Note a timestamp seen in a tuple (MVCC's `wts`, `rts` or lock): the next fresh
    /// timestamp is larger.
    pub fn observe(&self, ts: u64) {
        self.seen.set(self.seen.get().max(ts));
    }

    /// The current transaction's timestamp (unique, nonzero; smaller is older).
    pub fn ts(&self) -> u64 {
        self.ts.get()
    }

    /// Await `f` as one round trip of `stage`, counting it and its time.
    pub async fn round<T>(&self, stage: Stage, f: impl Future<Output = T>) -> T {
        let t = Instant::now();
        let out = f.await;
        let mut s = self.stats.borrow_mut();
        s.rounds += 1;
        s.stage_rounds[stage as usize] += 1;
        s.stage_ns[stage as usize] += t.elapsed().as_nanos() as u64;
        out
    }

    /// Await `a` and `b` together: posted in one doorbell with batching on, `b` a
    /// scheduler turn after `a` (its own doorbell, the same QP) with it off.
    pub async fn pair<A: Future, B: Future>(&self, a: A, b: B) -> (A::Output, B::Output) {
        self.stats.borrow_mut().pairs += 1;
        if self.doorbell_batching {
            futures::join!(a, b)
        } else {
            futures::join!(a, async {
                self.net.yield_now().await;
                b.await
            })
        }
    }

    /// RCC's update-and-unlock: the WRITEs of `writes` to `node` in order, as one list
    /// on one QP (one doorbell) with batching on, or one WR per scheduler turn with it
    /// off (still in order: one QP). Errors: the first failed WRITE.
    pub async fn write_list(&self, node: usize, writes: &[(u64, &[u8])]) -> Result<(), NetError> {
        self.stats.borrow_mut().pairs += 1;
        if self.doorbell_batching || writes.len() < 2 {
            return self.net.write_ordered(node, writes).await;
        }
        let rs = futures::future::join_all(writes.iter().enumerate().map(|(i, w)| async move {
            for _ in 0..i {
                self.net.yield_now().await;
            }
            self.net.write_ordered(node, &[*w]).await
        }))
        .await;
        rs.into_iter().collect()
    }

    /// Whether a one-sided lock CAS `0 -> mine` that returned `old` acquired the lock:
    /// `old` is 0, or `mine` itself. The owner value (a coordinator's id, or an
    /// attempt's timestamp) is unique among live attempts, and an attempt releases every
    /// lock it took before the next one starts, so a word holding `mine` was written by
    /// this very CAS ([`Stats::replayed_cas`] counts those).
    pub fn acquired(&self, old: u64, mine: u64) -> bool {
        if old == mine && mine != 0 {
            self.stats.borrow_mut().replayed_cas += 1;
            return true;
        }
        old == 0
    }

    /// Count `n` one-sided operations.
    pub fn count_ops(&self, n: usize) {
        self.stats.borrow_mut().ops += n as u64;
    }

    /// Count `n` RPC messages.
    pub fn count_msgs(&self, n: usize) {
        self.stats.borrow_mut().msgs += n as u64;
    }

    /// Home node, tuple offset and tuple bytes of `op`.
    pub fn loc(&self, op: &Op) -> (usize, u64, usize) {
        (
            self.layout.home(op.key),
            self.layout.tuple_off(op.table, op.key),
            self.layout.tuple_bytes(op.table),
        )
    }

    /// The rows `t` inserts given its final values `vals`, each with its home node,
    /// tuple offset, the whole fresh tuple in the layout's shape (lock free, version
    /// `version`, timestamp `ts`: [`Shape::inserted`]) and its history entry (a write of
    /// `hist_version`). Panics on a record of the wrong size or a key outside its table
    /// (a workload bug).
    pub fn inserts(
        &self,
        t: &TxnSpec,
        vals: &[Vec<u8>],
        version: u64,
        ts: u64,
        hist_version: u64,
    ) -> Vec<Inserted> {
        let Some(f) = &t.inserts else {
            return Vec::new();
        };
        f(vals)
            .into_iter()
            .map(|i| {
                assert_eq!(
                    i.record.len(),
                    self.layout.value_bytes(i.table),
                    "insert into table {}: record size",
                    i.table
                );
                Inserted {
                    node: self.layout.home(i.key),
                    off: self.layout.tuple_off(i.table, i.key),
                    tuple: self.layout.shape().inserted(&i.record, version, ts),
                    access: Access::write(i.table, i.key, hist_version),
                }
            })
            .collect()
    }

    /// Write the inserted rows `ins` (one-sided: one WRITE of the whole tuple each; RPC:
    /// one [`crate::wire::COMMIT`] per node, entries without unlock), not as a round of
    /// its own: [`Coord::with_inserts`] joins it to a commit round. (The RPC commits of
    /// NOWAIT, WAITDIE, OCC and SUNDIAL carry their rows in their own COMMIT messages
    /// instead, [`Coord::commit_messages`]; MVCC's, a different handler, use this.)
    /// Errors: the first failed write.
    pub async fn write_inserts(&self, ins: &[Inserted]) -> Result<(), NetError> {
        if ins.is_empty() {
            return Ok(());
        }
        match self.variant {
            Variant::OneSided => {
                self.count_ops(ins.len());
                let rs = futures::future::join_all(ins.iter().map(|i| async move {
                    self.net
                        .write_ordered(i.node, &[(i.off, &i.tuple[..])])
                        .await
                }))
                .await;
                rs.into_iter().collect()
            }
            Variant::Rpc => {
                let msgs = self.commit_messages(self.id, &[], ins)?;
                self.count_msgs(msgs.len());
                let rs = futures::future::join_all(
                    msgs.into_iter()
                        .map(|(node, m)| self.net.call(node, crate::wire::COMMIT, m)),
                )
                .await;
                rs.into_iter().try_for_each(|r| r.map(|_| ()))
            }
        }
    }

    /// The [`crate::wire::COMMIT`] messages of a commit round, one per node, nodes
    /// ascending: owner `owner`, then per node its `entries` `(node, tuple offset, bytes
    /// written at offset + 8)`, each unlocking, in the given order, then the rows of `ins`
    /// it holds, without unlock (a node with inserts only gets a message of its own).
    /// Each message is one buffer ([`crate::wire::tail_request`]). Errors: a message
    /// that does not encode (a record over 4 GiB).
    pub fn commit_messages(
        &self,
        owner: u64,
        entries: &[(usize, u64, &[u8])],
        ins: &[Inserted],
    ) -> Result<Vec<(usize, Vec<u8>)>, NetError> {
        let rows = ins
            .iter()
            .map(|i| (i.node, i.off, &i.tuple[VER as usize..], 0u8));
        let all = entries.iter().map(|&(n, o, d)| (n, o, d, 1u8)).chain(rows);
        // Per node: its records and their bytes, to size its message.
        let mut by: std::collections::BTreeMap<usize, (usize, usize)> = Default::default();
        for (node, _, d, _) in all.clone() {
            let m = by.entry(node).or_default();
            m.0 += 1;
            m.1 += d.len();
        }
        by.into_iter()
            .map(|(node, (n, bytes))| {
                let records = all
                    .clone()
                    .filter(|r| r.0 == node)
                    .map(|(_, off, d, unlock)| {
                        let len = u32::try_from(d.len()).unwrap_or(u32::MAX);
                        let e = crate::wire::CommitEntry {
                            off: off.into(),
                            unlock,
                            len: len.into(),
                        };
                        (e, d)
                    });
                let m = crate::wire::tail_request(
                    &zerocopy::little_endian::U64::new(owner),
                    n,
                    bytes,
                    records,
                )
                .map_err(|e| NetError::Call {
                    node,
                    handler: crate::wire::COMMIT,
                    why: format!("cannot encode the request: {}", e.detail),
                })?;
                Ok((node, m))
            })
            .collect()
    }

    /// Await `f` (a commit round's operations) together with the writes of `ins`, so
    /// that the inserts cost no round trip of their own. Errors: a failed insert.
    pub async fn with_inserts<T>(
        &self,
        ins: &[Inserted],
        f: impl Future<Output = T>,
    ) -> Result<T, NetError> {
        let (out, r) = futures::future::join(f, self.write_inserts(ins)).await;
        r.map(|_| out)
    }
}

/// An inserted row ready to write: see [`Coord::inserts`].
#[derive(Clone, Debug)]
pub struct Inserted {
    /// Its home node.
    pub node: usize,
    /// Its tuple's offset there.
    pub off: u64,
    /// The whole tuple.
    pub tuple: Vec<u8>,
    /// Its history entry.
    pub access: Access,
}

/// The lock word of a tuple's bytes.
pub fn lock_of(tuple: &[u8]) -> u64 {
    word(tuple, 0)
}

/// The version word of a tuple's bytes.
pub fn ver_of(tuple: &[u8]) -> u64 {
    word(tuple, VER as usize)
}

/// The record of a tuple's bytes.
pub fn val_of(tuple: &[u8]) -> &[u8] {
    &tuple[VAL as usize..]
}

fn word(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The bytes a commit writes at a tuple's version word: `version` then the record.
pub fn versioned(version: u64, val: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + val.len());
    v.extend_from_slice(&version.to_le_bytes());
    v.extend_from_slice(val);
    v
}

/// The history entries of a committed transaction: reads at the version read, writes at
/// the one installed (read + 1).
pub fn accesses(t: &TxnSpec, versions: &[u64]) -> Vec<Access> {
    t.ops
        .iter()
        .zip(versions)
        .map(|(o, &v)| {
            if o.write {
                Access::write(o.table, o.key, v + 1)
            } else {
                Access::read(o.table, o.key, v)
            }
        })
        .collect()
}
