//! `index-bench`: YCSB A-E over the B-link tree of `rtx::blink`, run by rTX (the tree in
//! repairable transactions), by Optimal (Sherman's own locking, no logs) and by a
//! DTX-style variant of Optimal (value logging before each write-back), side by side
//! (Transactional Indexes on Disaggregated Memory with Repairable Transaction, 6 Fig. 11);
//! or, with `--index race`, YCSB A-D over the RACE hash table of `rtx::race`, whose rehash
//! is an rTX, against RACE's own spinlock rehash. With `--processes` the clients of each
//! workload are processes, and `--kill-client-after` / `--stop-client-after` fault one
//! of them for real; in fault-injection builds (the ones `cargo test` makes)
//! `--crash-at` / `--pause-at` fault it at a chosen step of its first split or rehash
//! (`bench::index_fault`), and `--plant` breaks repair on purpose.
//!
//! Each protocol gets its own memory node (an rTX region with 1 KB blocks, hosted in this
//! process on the fabric of `--fabric`: shm under a timing model, `cx5` by default as in
//! every benchmark binary, or verbs through the local RDMA device) and its own client
//! threads, each running coroutines with one rTX client (or Optimal handle) each. The
//! tree is loaded with `--keys` keys by inserts, then each workload runs for `--duration`
//! after `--warmup`. Afterwards the tree is checked (fences, order, sibling chain against
//! parents, every acknowledged key present) and, for rTX, that no object is locked and no
//! log unfinished.
//!
//! The command line is the benchmarks' convention (`bench::cli`): `--fabric`, `--model`,
//! `--duration`, `--warmup` (the old `--duration-ms` / `--warmup-ms` hidden aliases),
//! `--seed`, `--json` (JSON Lines, `bench::jsonl`: the metadata record, one `ycsb` point
//! per protocol and workload with its latency histogram, the summary) and `--chart`;
//! exit code 2 for a usage error, 1 for a failed check or a run-time error.

use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use bench::client_board::{fault_timeline, Board, INTERVAL};
use bench::index_fault::{self, parse_fault_point, Change, ChildState, FaultPoint, PlantArg};
use bench::plot::{LineChart, Scale, Series};
use bench::{cli, jsonl};
use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use rrpc::fabric::shm::ClusterGuard;
use rrpc::fabric::{Fabric, FabricConfig};
use rrpc::node::{Node, NodeConfig};
use rrpc::runtime::{Executor, ThreadCtx};
use rrpc::NodeId;
use rtx::blink::check::{check_quiescent, check_tree};
use rtx::blink::optimal::Optimal;
use rtx::blink::{init_hosted, Blink, FIRST_FREE_OBJ};
use rtx::fault::CrashPoint;
use rtx::host::{host, EXPORT_KEY};
use rtx::lease::{LeaseConfig, SkewedClock, SystemClock};
use rtx::rrpc_mem::RrpcMem;
use rtx::{Client, Config, Layout};
use serde_json::json;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "index-bench",
    about = "YCSB A-E over a B-link tree or RACE hashing: rTX against Optimal (the index's own locking)",
    long_about = "YCSB A-E over the rtx::blink B-link tree (1 KB nodes, u64 keys and values), \
                  run by rTX (every operation one repairable transaction; single-leaf updates \
                  by Opt1, splits logged) and by Optimal (Sherman's CAS lock, READ, WRITE \
                  back + unlock), each on its own memory node on the shm fabric under a \
                  timing model (or on verbs). Prints throughput and p50/p99 latency per \
                  protocol and workload, the ratios rTX/Optimal and rTX/DTX, and checks the \
                  tree afterwards. With --json writes JSON Lines (a metadata record, one \
                  record per protocol and workload with the latency histogram, the summary); \
                  with --chart draws throughput per workload, one line per protocol. \
                  --index race runs RACE hashing instead (rehash as an rTX against RACE's \
                  spinlock rehash; A-D). --processes N runs each workload's clients as N \
                  processes, and --kill-client-after / --stop-client-after fault one; in \
                  fault-injection builds (cargo test's) --crash-at / --pause-at fault one at \
                  a chosen step of its first split or rehash, and --plant breaks repair on \
                  purpose."
)]
struct Args {
    #[command(flatten)]
    fabric: cli::FabricArgs,
    #[command(flatten)]
    config: cli::ConfigArg,
    #[command(flatten)]
    run: cli::RunLength,
    #[command(flatten)]
    seed: cli::SeedArg,
    #[command(flatten)]
    out: cli::OutputArgs,
    /// The index: blink (a B-link tree after Sherman, 1 KB nodes) or race (RACE hashing
    /// with 4 KB subtables of 64 buckets x 7 slots, whose rehash is an rTX; no range scans,
    /// so ycsb-e is skipped, and no DTX baseline).
    #[arg(long, value_enum, default_value_t = Index::Blink)]
    index: Index,
    /// Protocols to run: rtx, optimal, dtx (DrTM+H-style: Optimal's tree with OCC leaf
    /// writes and a value log of every node before its write-back; B-link tree only) or
    /// all (every one the index has, for the ratios). factors runs the factor analysis
    /// (rTX 6, Figs. 16-17; B-link tree only), one run per step, each against the one
    /// before: optimal, occ (OCC, no log), dtx, rtx-base (rTX without Opt1 or Opt2),
    /// rtx, rtx-opt2 (rTX with the leaf pre-locked); the paper's setting is `--workload
    /// insert`, and `--coroutines 1` for its latency. Each step also runs alone.
    #[arg(long, value_enum, default_value_t = Proto::All)]
    protocol: Proto,
    /// Workloads, comma-separated, among a (50% read, 50% update), b (95/5), c (read
    /// only), d (95% read-latest, 5% insert), e (95% scans of 1-100 keys, 5% insert),
    /// insert (100% inserts of new keys: the factor analysis's workload; give --objects
    /// enough for the leaves it adds, one per ~30 inserts).
    #[arg(long, default_value = "a,b,c,d,e", value_delimiter = ',')]
    workload: Vec<Workload>,
    /// Keys loaded before the workloads (8 B keys, 8 B values).
    #[arg(long, default_value_t = 50_000)]
    keys: u64,
    /// Zipf theta of key choice (0 = uniform; the paper's skewed runs use 0.99).
    #[arg(long, default_value_t = 0.0)]
    zipf: f64,
    /// Client threads per protocol (each its own fabric node and runtime).
    #[arg(long, default_value_t = 1)]
    threads: u16,
    /// Coroutines per thread, each one client (rTX ID or lock owner).
    #[arg(long, default_value_t = 8)]
    coroutines: u16,
    /// Objects (nodes) of the region; the data pool has four times as many 1 KB blocks
    /// (copy-on-write updates hold replaced blocks for 100 ms before reuse).
    #[arg(long, default_value_t = 32_768)]
    objects: u64,
    /// Client processes of each workload (0: the client threads run inside index-bench).
    /// Each process runs --threads threads x --coroutines coroutines against the same
    /// memory node, which index-bench hosts; the load stays in index-bench. The fault
    /// flags need 2 or more.
    #[arg(long, default_value_t = 0, value_name = "N")]
    processes: u16,
    /// SIGKILL client process 0 this long into each workload's measured window (after
    /// --warmup): the others repair the rTXs it left holding locks as they meet them
    /// (rTX only). After the workload its clients' logs are finished as a restarted
    /// client would, the locks no one met are repaired, and every check runs: every
    /// acknowledged key present, its one in-flight insert per client present or not.
    #[arg(long, value_name = "TIME")]
    kill_client_after: Option<cli::Span>,
    /// SIGSTOP client process 0 this long into each workload's measured window, and
    /// SIGCONT it --stop-ms later: a false suspicion once the pause outlasts its leases
    /// (the others repair its rTXs while it sleeps; it then finishes its own commits, which
    /// repair made idempotent). rTX only.
    #[arg(long, value_name = "TIME")]
    stop_client_after: Option<cli::Span>,
    /// How long --stop-client-after (or --pause-at) keeps the process stopped,
    /// milliseconds. With --index race at most 50 (half the allocator's 100 ms reuse
    /// wait): a stopped client's slot CAS lands late in the subtable block it read, which a
    /// rehash may have retired meanwhile, and must land before that block is reused.
    #[arg(long, default_value_t = 100, value_name = "MS")]
    stop_ms: u64,
    /// rTX's DRIFT, ms: what every lease adds to its estimated commit time, for
    /// unsynchronised clocks and late WRITEs (the paper's 8 ms).
    #[arg(long, default_value_t = 8, value_name = "MS")]
    drift_ms: u64,
    /// rTX's Opt2 on the B-link tree (the paper's 4.5, delegated concurrency control): an
    /// insert, update or delete CAS-locks its leaf while it reads it, so a contended leaf
    /// makes it wait instead of abort at validation. Off by default: the pre-lock writes
    /// a log header, which Opt1's single-leaf updates otherwise skip.
    #[arg(long)]
    pre_lock: bool,
    /// Shift the clock of some clients by this many ms (positive: ahead) in the
    /// workloads: client process 0's with --processes, else the first thread's. A client
    /// whose clock is ahead by more than DRIFT finds others' live locks expired and
    /// repairs them (false expiries, counted as repairs); repair is safe against a live
    /// owner, so every check still holds, only slower (rTX only).
    #[arg(
        long,
        default_value_t = 0,
        value_name = "MS",
        allow_negative_numbers = true
    )]
    clock_skew_ms: i64,
    /// Fault-injection builds only (the index-bench `cargo test -p bench` builds; others
    /// refuse it): client process 0 kills itself (SIGKILL to its own pid) when its first
    /// structure change of a workload that inserts (d, e) reaches CHANGE:POINT. CHANGE is
    /// split (--index blink: a leaf split) or rehash (--index race: a subtable rehash);
    /// POINT is log-written (log and new nodes written, nothing locked), locked (write set
    /// locked), in-doing (log DOING, nothing installed) or installed (every pointer
    /// installed, no lock released). The others repair the change as they meet its locks;
    /// afterwards every check runs as after --kill-client-after. rTX only.
    #[arg(long, value_name = "CHANGE:POINT", value_parser = parse_fault_point)]
    crash_at: Option<FaultPoint>,
    /// Fault-injection builds only: client process 0 stops itself (SIGSTOP) at
    /// CHANGE:POINT (as --crash-at) and index-bench continues it (SIGCONT) --stop-ms later:
    /// a false suspicion at a chosen step. The others repair its change while it sleeps;
    /// it then finishes its own commit, which repair made idempotent, and its clients
    /// start no new operation (the checks see what the pause and the repairs left).
    /// split only (--index blink); rTX only.
    #[arg(long, value_name = "CHANGE:POINT", value_parser = parse_fault_point)]
    pause_at: Option<FaultPoint>,
    /// Fault-injection builds only: a planted bug in the repairs of every workload client,
    /// to show the checks catch it: naive-repair (release a DOING rTX's locks without
    /// re-running its TryCommit; with --pause-at split:in-doing the stopped client's late
    /// installs then break the tree) or ignore-doing (leave a DOING rTX alone: with
    /// --crash-at split:in-doing its locks stay held and the others' operations on them
    /// give up). rTX only.
    #[arg(long, value_enum, value_name = "BUG")]
    plant: Option<PlantArg>,
    /// Run as one client process of the driver (JSON from index-bench; internal).
    #[arg(long, hide = true, value_name = "JSON")]
    client_spec: Option<String>,
}

/// What a client process runs, from the driver (`--client-spec`); the rest comes from
/// the same command line.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct ClientSpec {
    /// The cluster (shm name space) of the protocol's memory node.
    cluster: String,
    /// The memory node's bootstrap address.
    mn: std::net::SocketAddr,
    proto: Proto,
    /// The workload phase (1 = the first workload).
    phase: u64,
    /// This process's index among the workload's client processes.
    process: u16,
    /// Its board (`bench::client_board`).
    board: std::path::PathBuf,
    /// Key index of this phase's first insert: slot `s`'s `k`-th insert is
    /// `insert_base + s + k x clients`.
    insert_base: u64,
}

/// What a client process prints on its stdout when it finished (one JSON line).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct ClientReport {
    ops: u64,
    aborts: u64,
    repairs: u64,
    /// rTX's commits and remembered data pointers ([`Handle::hints`]).
    hints: RtxCounts,
    /// Times of the inserts that rehashed, ns.
    rehash_ns: Vec<u64>,
    /// The measured latencies (`bench::jsonl::latency_fields`'s `hdr`: base64 V2).
    hdr: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize, serde::Deserialize)]
enum Proto {
    Rtx,
    Optimal,
    Dtx,
    All,
    /// Optimal's tree with OCC leaf writes and no log (B-link tree only).
    Occ,
    /// rTX without Opt1 or Opt2: every write logged (B-link tree only).
    RtxBase,
    /// rTX with Opt1 and Opt2 (the leaf pre-locked; B-link tree only).
    RtxOpt2,
    /// The factor analysis: the steps from Optimal to rTX, each its own run.
    Factors,
}

/// The index a run measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Index {
    /// `rtx::blink`: a B-link tree (Transactional Indexes on Disaggregated Memory with
    /// Repairable Transaction, 5; Sherman).
    Blink,
    /// `rtx::race`: RACE hashing whose rehash is an rTX (the same paper, 5).
    Race,
}

impl Index {
    /// The name in output.
    fn name(self) -> &'static str {
        match self {
            Index::Blink => "blink",
            Index::Race => "race",
        }
    }
    /// Bytes of a block: a B-link node, or a RACE subtable (64 buckets of 64 B; a 4 KB
    /// directory holds 256 subtables, about 114,000 keys).
    fn block_bytes(self) -> u64 {
        match self {
            Index::Blink => 1024,
            Index::Race => 4096,
        }
    }
    /// The first object the clients' ranges start at (the tree's root pointer and root,
    /// or the hash directory and its initial subtables).
    fn first_free_obj(self) -> u64 {
        match self {
            Index::Blink => FIRST_FREE_OBJ,
            Index::Race => rtx::race::first_free_obj(RACE_DEPTH),
        }
    }
}

/// Global depth of a fresh RACE table: 16 subtables, split by rehashes as the load fills
/// them.
const RACE_DEPTH: u8 = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Workload {
    A,
    B,
    C,
    D,
    E,
    /// 100% inserts of new keys (the rTX paper's factor analysis, 6 Figs. 16-17).
    Insert,
}

impl Workload {
    /// Percent of operations that read (lookup or scan); the rest update (A, B) or
    /// insert new keys (D, E).
    fn read_pct(self) -> u32 {
        match self {
            Workload::A => 50,
            Workload::B => 95,
            Workload::C => 100,
            Workload::D | Workload::E => 95,
            Workload::Insert => 0,
        }
    }
    /// The workload's name in output: `ycsb-a` ... `ycsb-e`, `insert-only`.
    fn name(self) -> String {
        match self {
            Workload::Insert => "insert-only".into(),
            _ => format!("ycsb-{self:?}").to_lowercase(),
        }
    }
    /// The workload's label in lines: `ycsb-A` ... `ycsb-E`, `insert-only`.
    fn label(self) -> String {
        match self {
            Workload::Insert => "insert-only".into(),
            _ => format!("ycsb-{self:?}"),
        }
    }
    /// Whether it inserts new keys.
    fn inserts(self) -> bool {
        matches!(self, Workload::D | Workload::E | Workload::Insert)
    }
}

impl Proto {
    /// The protocol's name in output (`rtx`, `optimal`, `dtx`, `occ`, `rtx-base`, ...).
    fn name(self) -> String {
        self.to_possible_value()
            .map_or_else(|| format!("{self:?}"), |v| v.get_name().to_string())
    }
    /// Whether the runs are rTX's (with any of its optimizations).
    fn is_rtx(self) -> bool {
        matches!(self, Proto::Rtx | Proto::RtxBase | Proto::RtxOpt2)
    }
}

/// The steps of the factor analysis (`--protocol factors`; rTX 6, Figs. 16-17), each
/// with what it adds to the one before. The paper's order is Optimal, +OCC, +ICommit,
/// +Log (DTX's value log), +Separate (metadata apart from the data, data pointers
/// logged), +Opt1 and Opt2. Here DTX is Optimal's tree with OCC and the value log, and
/// rTX's idempotent commit and separate metadata come together: the third step replaces
/// DTX's value log by both.
const FACTOR_STEPS: [(Proto, &str); 6] = [
    (Proto::Optimal, "Optimal (Sherman's locking)"),
    (Proto::Occ, "+OCC (leaf READ, then lock and validate)"),
    (Proto::Dtx, "+value log (DTX)"),
    (
        Proto::RtxBase,
        "-value log +idempotent commit +separate metadata (rTX, no Opt1/Opt2)",
    ),
    (Proto::Rtx, "+Opt1 (no log for one-node writes)"),
    (Proto::RtxOpt2, "+Opt2 (leaf pre-locked)"),
];

/// Key of the `i`-th key index: an odd multiplier scatters indices over u64 (bijective).
fn key_of(i: u64) -> u64 {
    let k = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    if k == u64::MAX {
        0x5555
    } else {
        k
    }
}

/// A client's clock: the host's, shifted by `--clock-skew-ms` for the skewed clients.
type ClientClock = SkewedClock<SystemClock>;

/// One protocol's handle on the index.
enum Handle {
    Rtx(Box<Client<ClientClock>>, Blink),
    Optimal(Optimal),
    RaceRtx(Box<Client<ClientClock>>, Box<rtx::race::Race>),
    RaceOptimal(Box<rtx::race::optimal::Optimal>),
}

impl Handle {
    async fn lookup(&mut self, m: &RrpcMem, k: u64) -> Result<Option<u64>> {
        Ok(match self {
            Handle::Rtx(c, t) => t.lookup(c, m, k).await?,
            Handle::Optimal(t) => t.lookup(m, k).await?,
            Handle::RaceRtx(c, t) => t.get(c, m, k).await?,
            Handle::RaceOptimal(t) => t.get(m, k).await?,
        })
    }
    async fn insert(&mut self, m: &RrpcMem, k: u64, v: u64) -> Result<Option<u64>> {
        Ok(match self {
            Handle::Rtx(c, t) => t.insert(c, m, k, v).await?,
            Handle::Optimal(t) => t.insert(m, k, v).await?,
            Handle::RaceRtx(c, t) => t.insert(c, m, k, v).await.map_err(race_full)?,
            Handle::RaceOptimal(t) => t.insert(m, k, v).await.map_err(race_full)?,
        })
    }
    async fn scan(&mut self, m: &RrpcMem, k: u64, n: usize) -> Result<usize> {
        Ok(match self {
            Handle::Rtx(c, t) => t.scan(c, m, k, n).await?.len(),
            Handle::Optimal(t) => t.scan(m, k, n).await?.len(),
            Handle::RaceRtx(..) | Handle::RaceOptimal(_) => {
                bail!("a hash index has no range scans")
            }
        })
    }
    fn aborts(&self) -> u64 {
        match self {
            Handle::Rtx(c, _) => c.stats().aborts,
            Handle::Optimal(t) => t.stats().aborts,
            Handle::RaceRtx(c, t) => c.stats().aborts + race_retries(&t.stats()),
            Handle::RaceOptimal(t) => race_retries(&t.stats()),
        }
    }
    /// Subtable rehashes this handle ran (RACE; 0 for the B-link tree).
    fn rehashes(&self) -> u64 {
        match self {
            Handle::RaceRtx(_, t) => t.stats().rehashes,
            Handle::RaceOptimal(t) => t.stats().rehashes,
            Handle::Rtx(..) | Handle::Optimal(_) => 0,
        }
    }
    /// [`Handle::insert`], and when the insert rehashed a subtable, its time in ns
    /// pushed to `rehash_ns` (rTX paper, 6 and Fig. 15: the rehash's cost against the
    /// original's, at the same subtable size: every rehash here splits one subtable of
    /// the layout's block size).
    async fn timed_insert(
        &mut self,
        m: &RrpcMem,
        k: u64,
        v: u64,
        rehash_ns: &mut Vec<u64>,
    ) -> Result<Option<u64>> {
        let (before, t0) = (self.rehashes(), Instant::now());
        let r = self.insert(m, k, v).await?;
        if self.rehashes() > before {
            rehash_ns.push(t0.elapsed().as_nanos() as u64);
        }
        Ok(r)
    }
    /// rTX's commits, and its remembered data pointers (its speculative block READ
    /// beside the TXObj's): hits and misses (all 0 for the others); for RACE, the
    /// records written into reclaimed space (both protocols).
    fn hints(&self) -> RtxCounts {
        let records_reused = match self {
            Handle::RaceRtx(_, t) => t.stats().records_reused,
            Handle::RaceOptimal(t) => t.stats().records_reused,
            Handle::Rtx(..) | Handle::Optimal(_) => 0,
        };
        match self {
            Handle::Rtx(c, _) | Handle::RaceRtx(c, _) => RtxCounts {
                commits: c.stats().commits,
                hint_hits: c.stats().hint_hits,
                hint_misses: c.stats().hint_misses,
                reads_under_lock: c.stats().reads_under_lock,
                records_reused,
            },
            Handle::Optimal(_) | Handle::RaceOptimal(_) => RtxCounts {
                records_reused,
                ..RtxCounts::default()
            },
        }
    }
    /// Repairs of other clients' rTXs that changed the memory node (rTX; 0 otherwise).
    fn repairs(&self) -> u64 {
        match self {
            Handle::Rtx(c, _) => c.stats().repairs,
            Handle::RaceRtx(c, t) => c.stats().repairs + t.stats().repairs,
            Handle::Optimal(_) | Handle::RaceOptimal(_) => 0,
        }
    }
}

/// A RACE error, with what to do about a full table: the directory (one 4 KB block)
/// holds 256 subtables of 448 slots, and with two candidate buckets per key and no
/// overflow buckets a pair of buckets fills at about half the slots.
fn race_full(e: rtx::race::RaceError) -> anyhow::Error {
    let full = matches!(e, rtx::race::RaceError::TableFull { .. });
    let e = anyhow::Error::from(e);
    if full {
        e.context(
            "the RACE table is full (256 subtables of 448 slots; a key's two buckets fill at \
             about half of them): run fewer --keys, or ycsb-d for a shorter --duration",
        )
    } else {
        e
    }
}

/// A RACE handle's retries: waits on a held subtable, re-runs after its post-check, failed
/// slot CASes and aborted rehashes.
fn race_retries(s: &rtx::race::RaceStats) -> u64 {
    s.waits + s.redos + s.cas_failures + s.rehash_aborts
}

/// Results of one phase on one thread.
struct PhaseOut {
    ops: u64,
    hist: Histogram<u64>,
    aborts: u64,
    repairs: u64,
    hints: RtxCounts,
    /// Times of the inserts that rehashed a subtable, ns ([`Handle::timed_insert`]).
    rehash_ns: Vec<u64>,
}

impl PhaseOut {
    /// Every thread's or coroutine's results together. Errors: histograms that do not
    /// add (never: one shape).
    fn sum(outs: impl IntoIterator<Item = PhaseOut>) -> Result<PhaseOut> {
        let mut all = PhaseOut {
            ops: 0,
            hist: Histogram::<u64>::new(3)?,
            aborts: 0,
            repairs: 0,
            hints: RtxCounts::default(),
            rehash_ns: Vec::new(),
        };
        for o in outs {
            all.hist.add(&o.hist)?;
            all.ops += o.ops;
            all.aborts += o.aborts;
            all.repairs += o.repairs;
            all.hints = all.hints.add(o.hints);
            all.rehash_ns.extend(o.rehash_ns);
        }
        Ok(all)
    }
}

/// One client thread of phase `phase`: `--coroutines` clients, slots `first..`, each
/// running [`run_client`] on `ctx` until `stop`. Returns each client's results.
///
/// Errors: a handle that cannot be made, or the first client's error.
#[allow(clippy::too_many_arguments)]
fn run_thread(
    plan: &Arc<Plan>,
    ctx: Rc<ThreadCtx>,
    mem: RrpcMem,
    phase: u64,
    first: u64,
    measure_from: Instant,
    stop: &Arc<AtomicBool>,
    proc: Option<Arc<InProcess>>,
) -> Result<Vec<PhaseOut>> {
    let outs = Rc::new(std::cell::RefCell::new(Vec::new()));
    let mut ex = Executor::new(ctx);
    for slot in first..first + plan.args.coroutines as u64 {
        let h = plan.handle(phase, slot)?;
        let (plan, mem, stop, outs, proc) = (
            plan.clone(),
            mem.clone(),
            stop.clone(),
            outs.clone(),
            proc.clone(),
        );
        ex.spawn(async move {
            let r = run_client(plan, mem, h, phase, slot, measure_from, stop, proc).await;
            outs.borrow_mut().push(r);
        });
    }
    ex.run();
    let v: Vec<Result<PhaseOut>> = outs.borrow_mut().drain(..).collect();
    v.into_iter().collect()
}

/// A client process's view of its run: its board, when `go` was seen, and the key index
/// of its phase's first insert.
struct InProcess {
    board: Arc<Board>,
    go: Instant,
    insert_base: u64,
    /// This process's first global client slot.
    first_slot: u64,
}

/// The phase plan: phase 0 loads, phase p >= 1 runs `workloads[p - 1]`.
struct Plan {
    args: Args,
    layout: Layout,
    proto: Proto,
    /// Key indices inserted so far (loaded plus D/E inserts): the next new index.
    next_index: AtomicU64,
}

impl Plan {
    /// Clients of a workload phase: every process's (or index-bench's) threads x
    /// coroutines.
    fn clients(&self) -> u64 {
        clients(&self.args)
    }
    /// Clients of the load, inside index-bench.
    fn loaders(&self) -> u64 {
        self.args.threads as u64 * self.args.coroutines as u64
    }
    /// Object range of client `slot` in phase `phase`.
    fn objs(&self, phase: u64, slot: u64) -> std::ops::Range<u64> {
        let phases = self.args.workload.len() as u64 + 1;
        let free = self.args.index.first_free_obj();
        let per = (self.layout.objects - free) / (phases * self.clients());
        let first = free + (phase * self.clients() + slot) * per;
        first..first + per
    }
    /// The rTX ID of client `slot` in phase `phase`.
    fn id(&self, phase: u64, slot: u64) -> u16 {
        (phase * self.clients() + slot) as u16
    }
    /// Client `slot`'s handle in phase `phase`. Errors: a RACE handle refuses its object
    /// range (too small a region for the clients: `--objects`).
    fn handle(&self, phase: u64, slot: u64) -> Result<Handle> {
        let id = self.id(phase, slot);
        let objs = self.objs(phase, slot);
        // The skewed clients (workloads only): client process 0's, else the first
        // thread's.
        let skewed_slots = if self.args.processes > 0 {
            self.args.threads as u64 * self.args.coroutines as u64
        } else {
            self.args.coroutines as u64
        };
        let clock = SkewedClock {
            inner: SystemClock,
            skew_ms: if phase > 0 && slot < skewed_slots {
                self.args.clock_skew_ms
            } else {
                0
            },
        };
        let cfg = Config {
            lease: LeaseConfig {
                drift_ms: self.args.drift_ms,
                ..LeaseConfig::default()
            },
            opt1: self.proto != Proto::RtxBase,
            ..Config::default()
        };
        let client = || -> Result<Box<Client<ClientClock>>> {
            let mut c = Box::new(Client::new(self.layout, id, 2, clock.clone(), cfg));
            self.inject(&mut c, phase, slot)?;
            Ok(c)
        };
        Ok(match (self.args.index, self.proto) {
            (Index::Race, Proto::Rtx) => Handle::RaceRtx(
                client()?,
                Box::new(rtx::race::Race::new(self.layout, objs).context("--objects")?),
            ),
            (Index::Race, _) => {
                let mut t =
                    rtx::race::optimal::Optimal::new(self.layout, id, objs).context("--objects")?;
                let per = self.args.threads as u64 * self.args.coroutines as u64;
                if self.args.crash_at.is_some() && self.faults_at_a_point(phase).is_some() {
                    // As in RACE, a client waits for a held lock for good: the run's
                    // progress check, not an attempt limit, ends a stall.
                    t.max_attempts = u32::MAX;
                    if slot < per {
                        t.arm_crash_locked(index_fault::kill_self)?;
                    }
                }
                Handle::RaceOptimal(Box::new(t))
            }
            (Index::Blink, p) if p.is_rtx() => {
                let mut t = Blink::new(self.layout, objs);
                t.pre_lock = match p {
                    Proto::RtxOpt2 => true,
                    Proto::RtxBase => false,
                    _ => self.args.pre_lock,
                };
                Handle::Rtx(client()?, t)
            }
            (Index::Blink, Proto::Dtx) => Handle::Optimal(Optimal::dtx(self.layout, id, objs)),
            (Index::Blink, Proto::Occ) => Handle::Optimal(Optimal::occ(self.layout, id, objs)),
            (Index::Blink, _) => Handle::Optimal(Optimal::new(self.layout, id, objs)),
        })
    }
}

impl Plan {
    /// Whether `--crash-at` / `--pause-at` fire in phase `phase`: a workload that
    /// inserts (only inserts split a leaf or rehash a subtable), run by client processes.
    fn faults_at_a_point(&self, phase: u64) -> Option<FaultPoint> {
        let point = self.args.crash_at.or(self.args.pause_at)?;
        let w = *self.args.workload.get((phase as usize).checked_sub(1)?)?;
        (self.args.processes > 0 && w.inserts()).then_some(point)
    }

    /// Plant `--plant` in a workload client's repairs, and arm `--crash-at` /
    /// `--pause-at` in client process 0's clients. Errors: a build without rtx's
    /// `fault-injection` (refused as a usage error before this runs).
    fn inject(&self, c: &mut Client<ClientClock>, phase: u64, slot: u64) -> Result<()> {
        if phase == 0 {
            return Ok(());
        }
        if let Some(p) = self.args.plant {
            c.plant(p.into())?;
        }
        let per = self.args.threads as u64 * self.args.coroutines as u64;
        if let (Some(f), true) = (self.faults_at_a_point(phase), slot < per) {
            let hook = if self.args.crash_at.is_some() {
                index_fault::kill_self
            } else {
                index_fault::stop_self
            };
            c.arm_crash(f.point, hook)?;
        }
        Ok(())
    }
}

/// Clients of a workload phase (see [`Plan::clients`]).
fn clients(args: &Args) -> u64 {
    args.processes.max(1) as u64 * args.threads as u64 * args.coroutines as u64
}

/// One client coroutine: the load's share of keys (phase 0), or the phase's workload
/// until `stop`. In a client process (`proc`), inserts take the slot's own key sequence
/// and are counted on the board as acknowledged, and every operation is counted in the
/// board's timeline.
#[allow(clippy::too_many_arguments)]
async fn run_client(
    plan: Arc<Plan>,
    mem: RrpcMem,
    mut h: Handle,
    phase: u64,
    slot: u64,
    measure_from: Instant,
    stop: Arc<AtomicBool>,
    proc: Option<Arc<InProcess>>,
) -> Result<PhaseOut> {
    let mut hist = Histogram::<u64>::new(3)?;
    let mut ops = 0;
    let mut rehash_ns = Vec::new();
    let mut rng = rand::rngs::StdRng::seed_from_u64(plan.args.seed.seed ^ (phase << 32) ^ slot);
    if phase == 0 {
        // Load: client `slot` inserts indices slot, slot + clients, ...
        let mut i = slot;
        while i < plan.args.keys {
            h.timed_insert(&mem, key_of(i), i, &mut rehash_ns).await?;
            i += plan.loaders();
        }
        return Ok(PhaseOut {
            ops,
            hist,
            aborts: h.aborts(),
            repairs: h.repairs(),
            hints: h.hints(),
            rehash_ns,
        });
    }
    let w = plan.args.workload[phase as usize - 1];
    let zipf = (plan.args.zipf > 0.0)
        .then(|| Zipf::new(plan.args.keys as f64, plan.args.zipf))
        .transpose()?;
    // A client process's board slot, and the key index of its slot's next insert.
    let board_slot = proc.as_ref().map(|p| (slot - p.first_slot) as usize);
    let next_insert = |p: &InProcess| {
        let k = p.board.acked(board_slot.expect("in a process"));
        p.insert_base + slot + k * plan.clients()
    };
    // A client process that stopped itself at --pause-at's point runs no new operation
    // once continued (`index_fault::stop_self`).
    let paused = || proc.is_some() && index_fault::paused();
    while !stop.load(Ordering::Relaxed) && !paused() {
        // Keys inserted so far: in a client process, estimated from this slot's own
        // inserts (the slots insert at about the same rate), so that read-latest reads
        // near the newest keys; a key not there yet is a lookup that finds nothing.
        let n = match &proc {
            None => plan.next_index.load(Ordering::Relaxed),
            Some(p) => next_insert(p).max(1),
        };
        let pick = |rng: &mut rand::rngs::StdRng| match &zipf {
            Some(z) => z.sample(rng) as u64 - 1,
            None => rng.random_range(0..plan.args.keys),
        };
        let read = rng.random_range(0..100) < w.read_pct();
        let t0 = Instant::now();
        match (w, read) {
            (Workload::D, true) => {
                // Read-latest: the most recently inserted keys are the hottest.
                let back = pick(&mut rng).min(n - 1);
                let i = n - 1 - back;
                h.lookup(&mem, key_of(i)).await?;
            }
            (Workload::E, true) => {
                let len = rng.random_range(1..=100);
                h.scan(&mem, key_of(pick(&mut rng)), len).await?;
            }
            (_, true) => {
                h.lookup(&mem, key_of(pick(&mut rng))).await?;
            }
            (Workload::D | Workload::E | Workload::Insert, false) => {
                let i = match &proc {
                    None => plan.next_index.fetch_add(1, Ordering::Relaxed),
                    Some(p) => next_insert(p),
                };
                h.timed_insert(&mem, key_of(i), i, &mut rehash_ns).await?;
                if let (Some(p), Some(s)) = (&proc, board_slot) {
                    p.board.ack(s);
                }
            }
            (_, false) => {
                let i = pick(&mut rng);
                let old = h
                    .timed_insert(&mem, key_of(i), i + (ops << 32), &mut rehash_ns)
                    .await?;
                if old.is_none() {
                    bail!("update of loaded key index {i} found no key");
                }
            }
        }
        if let Some(p) = &proc {
            p.board.count(p.go.elapsed());
        }
        if t0 >= measure_from {
            hist.record(t0.elapsed().as_nanos() as u64)?;
            ops += 1;
        }
    }
    Ok(PhaseOut {
        ops,
        hist,
        aborts: h.aborts(),
        repairs: h.repairs(),
        hints: h.hints(),
        rehash_ns,
    })
}

/// The median and the largest of `ns` (sorted here), as f64 ns; `(0, 0)` when empty.
fn rehash_summary(ns: &mut [u64]) -> (f64, f64) {
    ns.sort_unstable();
    match ns.last() {
        Some(&max) => (ns[ns.len() / 2] as f64, max as f64),
        None => (0.0, 0.0),
    }
}

/// rTX's counters of a result row beyond aborts and repairs, summed over its clients
/// (over the whole phase, warm-up included, as the repairs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct RtxCounts {
    /// rTXs committed.
    commits: u64,
    /// Reads whose remembered data pointer was current (one round).
    hint_hits: u64,
    /// Reads whose remembered data pointer had moved (the data READ repeated).
    hint_misses: u64,
    /// One-read rTXs (lookups) that took a live holder's object, committed value,
    /// instead of aborting.
    #[serde(default)]
    reads_under_lock: u64,
    /// RACE: records written into the space of replaced or deleted ones.
    #[serde(default)]
    records_reused: u64,
}

impl RtxCounts {
    fn add(self, o: RtxCounts) -> RtxCounts {
        RtxCounts {
            commits: self.commits + o.commits,
            hint_hits: self.hint_hits + o.hint_hits,
            hint_misses: self.hint_misses + o.hint_misses,
            reads_under_lock: self.reads_under_lock + o.reads_under_lock,
            records_reused: self.records_reused + o.records_reused,
        }
    }
}

/// The result line's tail for rTX (empty for the others): its commits, and with no fault
/// injected its repairs as a share of them (every repair is then a false expiry: a live
/// owner's lease judged expired, the rTX paper's 4.3 and Fig. 18), and its remembered
/// data pointers' hits and misses.
fn hints_text(args: &Args, proto: Proto, repairs: u64, c: RtxCounts) -> String {
    if args.index == Index::Race {
        // RACE's common path is no rTX: only its records' reuse says something.
        return format!("  records reused {}", c.records_reused);
    }
    if !proto.is_rtx() {
        return String::new();
    }
    let faulted = args.kill_client_after.is_some()
        || args.stop_client_after.is_some()
        || args.crash_at.is_some()
        || args.pause_at.is_some();
    let false_expiries = if faulted {
        String::new()
    } else {
        format!(
            " (false expiries: {:.3}% of commits)",
            100.0 * repairs as f64 / c.commits.max(1) as f64
        )
    };
    format!(
        "  commits {}{false_expiries}  dptr hints hit/miss {}/{}  reads under lock {}",
        c.commits, c.hint_hits, c.hint_misses, c.reads_under_lock
    )
}

/// One result row: workload, ops/s, p50 us, p99 us, aborts (rTX) or lock retries (Optimal).
type Row = (Workload, f64, f64, f64, u64);

/// What one protocol's run gives: its rows after the tree check, and the load phase's
/// seconds and aborts.
struct ProtocolOut {
    rows: Vec<Row>,
    load_secs: f64,
    load_aborts: u64,
    /// Times of the inserts that rehashed a subtable, every phase's, ns.
    rehash_ns: Vec<u64>,
}

/// The region every protocol gets: an object id per client and phase (the load and each
/// workload) plus one, `--objects` objects, four 1 KB data blocks per object.
///
/// Errors: more ids than a `u16` holds, or a layout `rtx` refuses (naming `--objects`).
fn layout(args: &Args) -> Result<Layout> {
    let clients = clients(args);
    let phases = args.workload.len() as u64 + 1;
    let ids = u16::try_from(phases * clients + 1)
        .ok()
        .filter(|&n| n <= rtx::lllock::MAX_ID)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "--processes {} x --threads {} x --coroutines {} x {phases} phases: more than {} client ids",
                args.processes.max(1),
                args.threads,
                args.coroutines,
                rtx::lllock::MAX_ID
            )
        })?;
    let layout = Layout {
        ids,
        max_entries: 16,
        objects: args.objects,
        block_bytes: args.index.block_bytes(),
        // Copy-on-write updates of B-link nodes hold replaced blocks for 100 ms; RACE
        // writes records in place and copies only the subtables it rehashes.
        blocks: match args.index {
            Index::Blink => args.objects * 4,
            Index::Race => args.objects + args.objects / 4,
        } / 64
            * 64,
        // A client lists each foreign block it replaced for at least 100 ms (the reuse
        // wait), and gives up one past a full table (`rtx::alloc::Allocator::hold`):
        // room for a busy client's holds.
        reclaim_slots: 1024,
    };
    layout.validate().with_context(|| {
        format!(
            "--objects {} ({} data blocks) for {clients} clients",
            args.objects, layout.blocks
        )
    })?;
    Ok(layout)
}

/// One protocol: host a region, load, run each workload (writing a `ycsb` point per
/// workload to the `--json` file as it ends), check the tree.
fn run_protocol(args: &Args, proto: Proto) -> Result<ProtocolOut> {
    let layout = layout(args)?;
    let phases = args.workload.len() as u64 + 1;
    let name = format!("index-bench-{}-{proto:?}", std::process::id());
    // The cluster's name space (shm segments); on verbs it only names the nodes.
    let (cluster, _) = ClusterGuard::new(&name)?;
    let open = |node: u32| -> Result<Fabric> {
        let mut cfg = FabricConfig::new(args.fabric.fabric, cluster.name(), NodeId(node));
        cfg.model = args.fabric.model.clone();
        Ok(Fabric::open(&cfg)?)
    };
    let f = open(1)?;
    let (mr, export) = host(&f, layout)?;
    let mut exports = std::collections::BTreeMap::new();
    exports.insert(EXPORT_KEY.into(), serde_json::to_value(export)?);
    let rpc = args.config.rpc_settings()?;
    let node = Node::start_with(
        f,
        NodeConfig::new("rtx-mn", "127.0.0.1:0".parse()?).with_exports(exports),
        rpc.server.clone(),
    )?;
    let mn = node.addr();
    let connect = |node: u32| -> Result<(Rc<ThreadCtx>, RrpcMem)> {
        let ctx = ThreadCtx::new(open(node)?, rpc.runtime.clone())?;
        let (mem, l) = rtx::host::connect(&ctx, mn)?;
        anyhow::ensure!(l == layout, "exported layout differs");
        Ok((ctx, mem))
    };
    {
        let (ctx, mem) = connect(20)?;
        let mut ex = Executor::new(ctx);
        let index = args.index;
        ex.spawn(async move {
            match index {
                Index::Blink => init_hosted(&layout, &mem).await.expect("init tree"),
                Index::Race => rtx::race::init_hosted(&layout, &mem, RACE_DEPTH)
                    .await
                    .expect("init hash table"),
            }
        });
        ex.run();
    }
    let plan = Arc::new(Plan {
        args: args.clone(),
        layout,
        proto,
        next_index: AtomicU64::new(args.keys),
    });
    let mut rows = Vec::new();
    let mut rehash_ns = Vec::new();
    let (mut load_secs, mut load_aborts) = (0.0, 0);
    // With client processes: the keys acknowledged so far (indices), the in-flight
    // inserts of killed clients (present or not), and the next phase's first index.
    let mut keys_state = KeyState {
        acked: (0..args.keys).collect(),
        maybe: Vec::new(),
        committed: Vec::new(),
        aborted: Vec::new(),
        next_base: args.keys,
    };
    for phase in 0..phases {
        if phase > 0 && args.processes > 0 {
            let w = args.workload[phase as usize - 1];
            let r =
                run_phase_processes(&plan, phase, cluster.name(), mn, &mut keys_state, &connect)?;
            let tput = r.ops as f64 / args.run.secs();
            let (p50, p99) = (
                r.hist.value_at_quantile(0.5) as f64 / 1000.0,
                r.hist.value_at_quantile(0.99) as f64 / 1000.0,
            );
            println!(
                "  {proto:?} {}: {tput:>10.0} ops/s  p50 {p50:>7.1} us  p99 {p99:>7.1} us  aborts/retries {}  repairs {}{}",
                w.label(),
                r.aborts, r.repairs, hints_text(args, proto, r.repairs, r.hints)
            );
            for l in &r.fault_lines {
                println!("    {l}");
            }
            jsonl::point_with(
                "ycsb",
                json!({
                    "protocol": proto.name(), "workload": w.name(), "ops_per_s": tput,
                    "ops": r.ops, "p50_us": p50, "p99_us": p99, "aborts_and_retries": r.aborts,
                    "repairs": r.repairs, "processes": args.processes, "fault": r.fault,
                    "commits": r.hints.commits, "hint_hits": r.hints.hint_hits,
                    "hint_misses": r.hints.hint_misses,
                    "reads_under_lock": r.hints.reads_under_lock,
                    "records_reused": r.hints.records_reused,
                }),
                Some(&r.hist),
            );
            rows.push((w, tput, p50, p99, r.aborts));
            rehash_ns.extend(r.rehash_ns);
            continue;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let barrier = Arc::new(Barrier::new(args.threads as usize + 1));
        let (ops, aborts, repairs, hints, rehashed, hist, phase_secs) =
            std::thread::scope(|scope| -> Result<_> {
                let workers: Vec<_> = (0..args.threads)
                    .map(|t| {
                        let (plan, stop, barrier) = (plan.clone(), stop.clone(), barrier.clone());
                        let connect = &connect;
                        scope.spawn(move || -> Result<Vec<PhaseOut>> {
                            let r = connect(100 + t as u32 + 100 * phase as u32);
                            barrier.wait();
                            let measure_from = Instant::now() + plan.args.run.warmup();
                            let (ctx, mem) = r?;
                            let first = t as u64 * plan.args.coroutines as u64;
                            run_thread(&plan, ctx, mem, phase, first, measure_from, &stop, None)
                        })
                    })
                    .collect();
                barrier.wait();
                let load_start = Instant::now();
                if phase > 0 {
                    std::thread::sleep(args.run.warmup() + args.run.duration());
                    stop.store(true, Ordering::Relaxed);
                }
                let mut outs = Vec::new();
                for w in workers {
                    outs.extend(w.join().expect("worker panicked")?);
                }
                let PhaseOut {
                    ops,
                    hist,
                    aborts,
                    repairs,
                    hints,
                    rehash_ns,
                } = PhaseOut::sum(outs)?;
                Ok((
                    ops,
                    aborts,
                    repairs,
                    hints,
                    rehash_ns,
                    hist,
                    load_start.elapsed().as_secs_f64(),
                ))
            })?;
        rehash_ns.extend(rehashed);
        if phase == 0 {
            println!(
                "  {proto:?}: loaded {} keys in {:.2} s ({aborts} aborts)",
                args.keys, phase_secs
            );
            (load_secs, load_aborts) = (phase_secs, aborts);
            continue;
        }
        let w = args.workload[phase as usize - 1];
        let tput = ops as f64 / args.run.secs();
        let (p50, p99) = (
            hist.value_at_quantile(0.5) as f64 / 1000.0,
            hist.value_at_quantile(0.99) as f64 / 1000.0,
        );
        println!(
            "  {proto:?} {}: {tput:>10.0} ops/s  p50 {p50:>7.1} us  p99 {p99:>7.1} us  aborts/retries {aborts}  repairs {repairs}{}",
            w.label(),
            hints_text(args, proto, repairs, hints)
        );
        jsonl::point_with(
            "ycsb",
            json!({
                "protocol": proto.name(), "workload": w.name(), "ops_per_s": tput,
                "ops": ops, "p50_us": p50, "p99_us": p99, "aborts_and_retries": aborts,
                "repairs": repairs, "commits": hints.commits, "hint_hits": hints.hint_hits,
                "hint_misses": hints.hint_misses,
                "reads_under_lock": hints.reads_under_lock,
                "records_reused": hints.records_reused,
            }),
            Some(&hist),
        );
        rows.push((w, tput, p50, p99, aborts));
    }
    // Check the tree (and, for rTX, locks and logs) from a fresh thread.
    let (ctx, mem) = connect(19)?;
    let mut ex = Executor::new(ctx);
    let result = Rc::new(std::cell::RefCell::new(None));
    let r2 = result.clone();
    let index = args.index;
    ex.spawn(async move {
        let r = async {
            let all = match index {
                Index::Blink => {
                    let all = check_tree(&mem, &layout).await?;
                    check_quiescent(&mem, &layout).await?;
                    all
                }
                Index::Race => {
                    let all = rtx::race::check::check_table(&mem, &layout).await?;
                    rtx::race::check::check_quiescent(&mem, &layout).await?;
                    all
                }
            };
            Ok::<_, anyhow::Error>(all)
        }
        .await;
        *r2.borrow_mut() = Some(r);
    });
    ex.run();
    let all_keys = result.borrow_mut().take().expect("checker ran")?;
    let found = all_keys.len() as u64;
    if args.processes == 0 {
        let expected = plan.next_index.load(Ordering::Relaxed);
        // Every index below next_index was handed to an insert; all of them acknowledged
        // (a run stops only between operations), and keys are distinct.
        if found != expected {
            bail!("{proto:?}: the tree holds {found} keys, {expected} were inserted");
        }
        println!(
            "  {proto:?}: {} check ok ({found} keys, {})",
            checked_what(args.index).0,
            checked_what(args.index).1
        );
    } else {
        let in_flight = keys_state
            .check(&all_keys)
            .map_err(|e| anyhow::anyhow!("{proto:?}: {e}"))?;
        println!(
            "  {proto:?}: {} check ok ({found} keys: every acknowledged insert present{}; {})",
            checked_what(args.index).0,
            if keys_state.maybe.is_empty() {
                String::new()
            } else {
                format!(
                    ", {in_flight} of the killed clients' {} in-flight inserts committed by repair",
                    keys_state.maybe.len()
                )
            } + &match (keys_state.committed.len(), keys_state.aborted.len()) {
                (0, 0) => String::new(),
                (c, a) => format!(
                    ", of the inserts killed at the crash point {c} committed and {a} aborted by repair as their log state demands"
                ),
            },
            checked_what(args.index).1
        );
    }
    drop(node);
    drop(mr);
    if !rehash_ns.is_empty() {
        let (p50, max) = rehash_summary(&mut rehash_ns);
        println!(
            "  {proto:?}: {} rehashes (the load's and the workloads'); the inserts that rehashed took p50 {:.1} us, max {:.1} us",
            rehash_ns.len(),
            p50 / 1e3,
            max / 1e3
        );
    }
    Ok(ProtocolOut {
        rows,
        load_secs,
        load_aborts,
        rehash_ns,
    })
}

/// What the final check of `index` is called and what it checked.
fn checked_what(index: Index) -> (&'static str, &'static str) {
    match index {
        Index::Blink => (
            "tree",
            "fences, order, sibling chain = parents, no lock held, every rTX log DONE",
        ),
        Index::Race => (
            "table",
            "each key once, in the subtable and buckets its hash selects, directory consistent, no lock held, every rTX log DONE",
        ),
    }
}

/// The keys a run with client processes must find: every acknowledged insert, and any
/// of the in-flight inserts of killed clients (committed by repair, or not).
struct KeyState {
    /// Key indices acknowledged (loaded, then inserted).
    acked: Vec<u64>,
    /// Key indices whose insert was in flight when its client was killed.
    maybe: Vec<u64>,
    /// Key indices of inserts killed at `--crash-at` in DOING or later: repair must have
    /// committed them.
    committed: Vec<u64>,
    /// Key indices of inserts killed at `--crash-at` before DOING: repair must have
    /// aborted them.
    aborted: Vec<u64>,
    /// The next phase's first insert index.
    next_base: u64,
}

impl KeyState {
    /// Check the tree's keys `found` (sorted, distinct: `check_tree`'s) against the
    /// acknowledged and in-flight inserts; returns how many in-flight inserts are there.
    ///
    /// Errors: an acknowledged key is missing, or a key is neither acknowledged nor in
    /// flight.
    fn check(&self, found: &[(u64, u64)]) -> Result<usize, String> {
        let found: std::collections::HashSet<u64> = found.iter().map(|&(k, _)| k).collect();
        let missing: Vec<u64> = self
            .acked
            .iter()
            .copied()
            .filter(|&i| !found.contains(&key_of(i)))
            .collect();
        if let Some(first) = missing.first() {
            return Err(format!(
                "{} acknowledged inserts are not in the tree (the first: key index {first})",
                missing.len()
            ));
        }
        if let Some(i) = self
            .committed
            .iter()
            .find(|&&i| !found.contains(&key_of(i)))
        {
            return Err(format!(
                "the insert of key index {i}, killed in DOING or later, is not in the tree: repair must commit it"
            ));
        }
        if let Some(i) = self.aborted.iter().find(|&&i| found.contains(&key_of(i))) {
            return Err(format!(
                "the insert of key index {i}, killed before DOING, is in the tree: repair must abort it"
            ));
        }
        let in_flight = self
            .maybe
            .iter()
            .filter(|&&i| found.contains(&key_of(i)))
            .count();
        let extra = found.len() - self.acked.len() - self.committed.len() - in_flight;
        if extra > 0 {
            return Err(format!(
                "the tree holds {extra} keys that no client inserted or had in flight"
            ));
        }
        Ok(in_flight)
    }
}

/// What a workload phase run by client processes gives.
struct ProcPhase {
    /// Operations in the measured window, every process's (from the boards).
    ops: u64,
    /// Latencies of the processes that finished (a killed one's are lost).
    hist: Histogram<u64>,
    aborts: u64,
    repairs: u64,
    hints: RtxCounts,
    rehash_ns: Vec<u64>,
    /// What the fault did (lines to print), and as JSON.
    fault_lines: Vec<String>,
    fault: serde_json::Value,
}

/// How long a client process may take to connect, and past its run to exit.
const CLIENT_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// How long the other client processes may complete no operation after a fault before
/// the run fails (its progress check).
const STALL_LIMIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Run workload phase `phase` on `args.processes` client processes (this binary again,
/// with `--client-spec`), fault process 0 as the flags say, collect what they report and
/// what their boards show, and after a kill finish the dead clients' rTXs. Updates `keys`
/// with the phase's acknowledged and in-flight inserts.
///
/// Errors: a process that cannot start, connect, or that fails or hangs (other than the
/// killed one); the recovery's.
fn run_phase_processes(
    plan: &Arc<Plan>,
    phase: u64,
    cluster: &str,
    mn: std::net::SocketAddr,
    keys: &mut KeyState,
    connect: &dyn Fn(u32) -> Result<(Rc<ThreadCtx>, RrpcMem)>,
) -> Result<ProcPhase> {
    use std::process::{Command, Stdio};
    let args = &plan.args;
    let per = (args.threads as u64 * args.coroutines as u64) as usize;
    let intervals = board_intervals(args);
    let exe = std::env::current_exe().context("finding index-bench's own binary")?;
    let mut boards = Vec::new();
    let mut children = Vec::new();
    for p in 0..args.processes {
        let path = std::path::PathBuf::from(format!(
            "/dev/shm/index-bench-{}-{}-{phase}-{p}",
            std::process::id(),
            plan.proto.name()
        ));
        let board = Board::create(&path, per, intervals)
            .with_context(|| format!("creating the board {}", path.display()))?;
        let spec = ClientSpec {
            cluster: cluster.to_string(),
            mn,
            proto: plan.proto,
            phase,
            process: p,
            board: path,
            insert_base: keys.next_base,
        };
        let child = Command::new(&exe)
            .args(std::env::args_os().skip(1))
            .arg("--client-spec")
            .arg(serde_json::to_string(&spec)?)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting client process {p} ({})", exe.display()))?;
        boards.push(board);
        children.push(child);
    }
    // Kill whatever is left if this returns early.
    struct Reap(Vec<std::process::Child>);
    impl Drop for Reap {
        fn drop(&mut self) {
            for c in &mut self.0 {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
    let mut children = Reap(children);
    let deadline = Instant::now() + CLIENT_GRACE;
    while !boards.iter().all(|b| b.ready()) {
        for (p, c) in children.0.iter_mut().enumerate() {
            if let Some(st) = c.try_wait()? {
                bail!("client process {p} exited before it connected ({st})");
            }
        }
        if Instant::now() >= deadline {
            bail!("client processes not connected after {CLIENT_GRACE:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    for b in &boards {
        b.go();
    }
    let go = Instant::now();
    let victim = children.0[0].id() as libc::pid_t;
    let mut fault_lines = Vec::new();
    let mut fault = serde_json::Value::Null;
    let mut fault_at = args
        .kill_client_after
        .or(args.stop_client_after)
        .map(|s| args.run.warmup() + s.0);
    // Whether client process 0 dies in this phase (then its clients' logs are finished
    // afterwards and their in-flight inserts may or may not be there).
    let point = plan.faults_at_a_point(phase);
    let killed = args.kill_client_after.is_some() || (point.is_some() && args.crash_at.is_some());
    // The client of process 0 whose split reached --crash-at's point (its local slot):
    // its in-flight insert is there iff the split had reached DOING.
    let mut crashed_slot = None;
    if let Some(f) = point {
        let (at, line, id) = await_fault_point(args, f, &mut children.0[0], &boards[0], go)?;
        fault_at = Some(at);
        // A split carries its insert; a rehash only makes room, its insert runs after.
        if killed && f.change == Change::Split {
            let local = (id as u64).checked_sub(plan.id(phase, 0) as u64);
            crashed_slot = local
                .filter(|&l| l < per as u64)
                .map(|l| (l as usize, f.point));
        }
        fault_lines.push(format!(
            "client process 0 (pid {victim}, {per} clients) {line}"
        ));
    } else if let Some(at) = fault_at {
        std::thread::sleep((go + at).saturating_duration_since(Instant::now()));
        let kill = args.kill_client_after.is_some();
        // SAFETY: kill(2) on our own child's pid, which we have not waited for yet (it
        // cannot have been reused).
        let r = unsafe { libc::kill(victim, if kill { libc::SIGKILL } else { libc::SIGSTOP }) };
        if r != 0 {
            bail!(
                "signalling client process 0: {}",
                std::io::Error::last_os_error()
            );
        }
        let at_ms = go.elapsed().as_millis();
        if kill {
            fault_lines.push(format!(
                "client process 0 (pid {victim}, {per} clients) killed at {at_ms} ms"
            ));
        } else {
            std::thread::sleep(std::time::Duration::from_millis(args.stop_ms));
            // SAFETY: as above.
            unsafe { libc::kill(victim, libc::SIGCONT) };
            fault_lines.push(format!(
                "client process 0 (pid {victim}, {per} clients) stopped at {at_ms} ms for {} ms",
                args.stop_ms
            ));
        }
    }
    // Collect: each process exits after its run; the killed one is gone already.
    let end = go + args.run.warmup() + args.run.duration() + CLIENT_GRACE;
    // The measured window on the boards' timelines.
    let (from, to) = (
        (args.run.warmup().as_nanos() / INTERVAL.as_nanos()) as usize,
        ((args.run.warmup() + args.run.duration()).as_nanos() / INTERVAL.as_nanos()) as usize,
    );
    // The progress check: after a fault the other processes must go on. A stretch of
    // STALL_LIMIT without one operation completed by any of them fails the run at once
    // (a lock the faulted client held, never released: what rTX's repair prevents).
    let stalled = |boards: &[Board], fault_lines: &[String]| -> Result<()> {
        let Some(at) = fault_at else { return Ok(()) };
        let fault_i = (at.as_nanos() / INTERVAL.as_nanos()) as usize;
        let now_i = (go.elapsed().as_nanos() / INTERVAL.as_nanos()) as usize;
        let limit = (STALL_LIMIT.as_nanos() / INTERVAL.as_nanos()) as usize;
        let t: Vec<Vec<u64>> = boards.iter().map(|b| b.intervals()).collect();
        if let Some(r) =
            bench::client_board::survivors_stalled(&t, 0, fault_i.max(from), now_i.min(to), limit)
        {
            bail!(
                "no progress: the other {} client processes completed no operation from {} ms to {} ms after go, {:?} without progress after the fault at {} ms ({}): a lock the faulted client held is never released",
                args.processes - 1,
                r.start as u128 * INTERVAL.as_millis(),
                r.end as u128 * INTERVAL.as_millis(),
                STALL_LIMIT,
                at.as_millis(),
                fault_lines.join("; ")
            );
        }
        Ok(())
    };
    let mut hist = Histogram::<u64>::new(3)?;
    let (mut aborts, mut repairs, mut hints) = (0, 0, RtxCounts::default());
    let mut rehash_ns = Vec::new();
    for (p, c) in children.0.iter_mut().enumerate() {
        let st = loop {
            stalled(&boards, &fault_lines)?;
            if let Some(st) = c.try_wait()? {
                break st;
            }
            if Instant::now() >= end {
                bail!("client process {p} still running {CLIENT_GRACE:?} after its run ended");
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        if p == 0 && killed {
            use std::os::unix::process::ExitStatusExt;
            if st.signal() != Some(libc::SIGKILL) {
                bail!("client process 0 was to be killed but ended with {st}");
            }
            continue;
        }
        let mut out = String::new();
        use std::io::Read;
        c.stdout
            .take()
            .context("client stdout")?
            .read_to_string(&mut out)?;
        if !st.success() {
            bail!("client process {p} failed ({st})");
        }
        let r: ClientReport = serde_json::from_str(out.trim())
            .with_context(|| format!("client process {p}'s report {out:?}"))?;
        hist.add(&jsonl::decode_hdr(&r.hdr)?)?;
        aborts += r.aborts;
        repairs += r.repairs;
        hints = hints.add(r.hints);
        rehash_ns.extend(r.rehash_ns);
    }
    stalled(&boards, &fault_lines)?;
    let timelines: Vec<Vec<u64>> = boards.iter().map(|b| b.intervals()).collect();
    let ops = timelines
        .iter()
        .map(|t| t[from.min(t.len())..to.min(t.len())].iter().sum::<u64>())
        .sum();
    if let Some(at) = fault_at {
        let i = (at.as_nanos() / INTERVAL.as_nanos()) as usize;
        if let Some(t) = fault_timeline(&timelines, 0, from, i, to) {
            let n = args.processes as f64;
            fault_lines.push(format!(
                "the other {} processes' {} ms intervals after it: fewest ops {}{}; below half their earlier rate for {} ms at most (the recovery); ops/s of all before {:.0}, after {:.0} (ratio {:.2}; (n-1)/n = {:.2}; the others alone {:.2})",
                args.processes - 1,
                INTERVAL.as_millis(),
                t.min_survivor_interval,
                if t.min_survivor_interval == 0 { " (a 10 ms interval without progress)" } else { ", never 0" },
                t.longest_dip as u128 * INTERVAL.as_millis(),
                t.rate_before,
                t.rate_after,
                t.rate_after / t.rate_before,
                (n - 1.0) / n,
                t.survivors_after / t.rate_before,
            ));
            fault = json!({
                "kind": match (args.kill_client_after, args.stop_client_after, args.crash_at) {
                    (Some(_), _, _) => "kill".to_string(),
                    (_, Some(_), _) => "stop".to_string(),
                    (_, _, Some(f)) => format!("crash-at {f}"),
                    _ => format!("pause-at {}", args.pause_at.map(|f| f.to_string()).unwrap_or_default()),
                },
                "at_ms": at.as_millis() as u64,
                "stop_ms": (args.stop_client_after.is_some() || args.pause_at.is_some()).then_some(args.stop_ms),
                "min_survivor_interval_ops": t.min_survivor_interval,
                "recovery_ms": t.longest_dip as u128 * INTERVAL.as_millis(),
                "interval_ms": INTERVAL.as_millis() as u64,
                "ops_per_s_before": t.rate_before,
                "ops_per_s_after": t.rate_after,
                "survivors_ops_per_s_after": t.survivors_after,
            });
        }
    }
    // The phase's inserts: slot s's k-th is insert_base + s + k x clients.
    let clients = plan.clients();
    let dead = if killed { per } else { 0 };
    for (p, b) in boards.iter().enumerate() {
        for local in 0..per {
            let slot = (p * per + local) as u64;
            let n = b.acked(local);
            keys.acked
                .extend((0..n).map(|k| keys.next_base + slot + k * clients));
            if p == 0 && local < dead {
                let i = keys.next_base + slot + n * clients;
                match crashed_slot {
                    Some((l, point)) if l == local => {
                        if matches!(point, CrashPoint::InDoing | CrashPoint::Installed) {
                            keys.committed.push(i);
                        } else {
                            keys.aborted.push(i);
                        }
                    }
                    _ => keys.maybe.push(i),
                }
            }
        }
    }
    let top = boards
        .iter()
        .enumerate()
        .flat_map(|(p, b)| (0..per).map(move |l| (p * per + l, b.acked(l))))
        .map(|(slot, n)| keys.next_base + slot as u64 + (n + 1) * clients)
        .max()
        .unwrap_or(keys.next_base);
    keys.next_base = top;
    if dead > 0 && plan.proto != Proto::Rtx {
        fault_lines.push(
            "afterwards: the killed client's rehash has no log and no repair (RACE's spinlocks): its locks stay held".to_string(),
        );
    } else if dead > 0 {
        let t = Instant::now();
        let ids: Vec<u16> = (0..dead as u64).map(|s| plan.id(phase, s)).collect();
        let (logs, locks) = recover_dead(plan.layout, &ids, connect)?;
        fault_lines.push(format!(
            "afterwards: the killed clients' {} logs finished as restarted clients would ({logs} not DONE), {locks} locks no one met repaired, in {:.1} ms",
            ids.len(),
            t.elapsed().as_secs_f64() * 1e3
        ));
    }
    Ok(ProcPhase {
        ops,
        hist,
        aborts,
        repairs,
        hints,
        rehash_ns,
        fault_lines,
        fault,
    })
}

/// Wait until client process 0 (`child`, its board `board`) reaches the fault point `f`
/// of `--crash-at` (it kills itself: wait for its death) or `--pause-at` (it stops
/// itself: wait for the stop, then SIGCONT it `--stop-ms` later). Returns when it got
/// there, since `go`, what happened (for the output), and the rTX ID of the client that
/// got there.
///
/// Errors: the process ended (or, for a pause, was still running) past its run without
/// reaching the point; it ended otherwise than by SIGKILL, or without saying on its board
/// where it was.
fn await_fault_point(
    args: &Args,
    f: FaultPoint,
    child: &mut std::process::Child,
    board: &Board,
    go: Instant,
) -> Result<(std::time::Duration, String, u16)> {
    use std::os::unix::process::ExitStatusExt;
    let pid = child.id() as libc::pid_t;
    let end = go + args.run.warmup() + args.run.duration() + CLIENT_GRACE;
    let never = || {
        anyhow::anyhow!(
            "client process 0 never reached {f} (its run had no {} that got there: more inserts, e.g. a longer --duration or ycsb-d, or fewer --keys per node)",
            f.change.name()
        )
    };
    let kill = args.crash_at.is_some();
    let at = loop {
        let state = index_fault::child_state(pid).context("watching client process 0")?;
        match state {
            ChildState::Ended if kill => {
                let st = child.wait()?;
                if st.signal() != Some(libc::SIGKILL) {
                    bail!("client process 0 was to kill itself at {f} but ended with {st}");
                }
                break go.elapsed();
            }
            ChildState::Ended => return Err(never()),
            ChildState::Stopped if !kill => break go.elapsed(),
            _ => {}
        }
        if Instant::now() >= end {
            return Err(never());
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    let (point, id) = index_fault::decode(board.fault()).ok_or_else(|| {
        anyhow::anyhow!(
            "client process 0 was {} without saying where on its board",
            if kill { "killed" } else { "stopped" }
        )
    })?;
    anyhow::ensure!(
        point == f.point,
        "client process 0 stopped at {} instead of {}",
        point.name(),
        f.point.name()
    );
    let ms = at.as_millis();
    if kill {
        return Ok((
            at,
            format!(
                "killed itself (SIGKILL) at {f} of its first {} ({} {id}) at {ms} ms",
                f.change.name(),
                if args.protocol == Proto::Optimal {
                    "lock owner"
                } else {
                    "rTX ID"
                }
            ),
            id,
        ));
    }
    std::thread::sleep(std::time::Duration::from_millis(args.stop_ms));
    // SAFETY: kill(2) on our own child's pid, not waited for yet (it cannot have been
    // reused).
    if unsafe { libc::kill(pid, libc::SIGCONT) } != 0 {
        bail!(
            "continuing client process 0: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok((
        at,
        format!(
            "stopped itself (SIGSTOP) at {f} of its first {} (rTX ID {id}) at {ms} ms, continued {} ms later",
            f.change.name(),
            args.stop_ms
        ),
        id,
    ))
}

/// Intervals of a client process's board: the run (warm-up and measured window) and a
/// second more.
fn board_intervals(args: &Args) -> usize {
    ((args.run.warmup() + args.run.duration() + std::time::Duration::from_secs(1)).as_nanos()
        / INTERVAL.as_nanos()) as usize
}

/// After a client process was killed: restart each of its rTX IDs `ids` (as a new
/// incarnation, finishing its last rTX from its log: `Client::recover`), then repair the
/// locks the dead IDs still hold once their leases expired (an Opt1 lock has no log; a
/// lock no survivor met stays until someone does). Returns the logs that were not DONE
/// and the locks repaired.
///
/// Errors: the memory node's, or a lock still held by a dead ID after its repair.
fn recover_dead(
    layout: Layout,
    ids: &[u16],
    connect: &dyn Fn(u32) -> Result<(Rc<ThreadCtx>, RrpcMem)>,
) -> Result<(u64, u64)> {
    let (ctx, mem) = connect(18)?;
    let ids = ids.to_vec();
    let out = Rc::new(std::cell::RefCell::new(None));
    let o2 = out.clone();
    let mut ex = Executor::new(ctx);
    ex.spawn(async move {
        let r = async {
            let mut logs = 0;
            let mut rescuer = None;
            for &id in &ids {
                let w = rtx::mem::Mem::read_u64(&mem, layout.log_addr(id)).await?;
                if w != 0 && rtx::log::Header::decode(w).state != rtx::log::LogState::Done {
                    logs += 1;
                }
                let mut c = Client::new(layout, id, 3, SystemClock, Config::default());
                c.recover(&mem).await?;
                rescuer.get_or_insert(c);
            }
            let mut locks = 0;
            let Some(mut c) = rescuer else {
                return Ok((logs, locks));
            };
            for i in 0..layout.objects {
                let at = layout.obj_addr(i);
                let w = rtx::mem::Mem::read_u64(&mem, at).await?;
                let rtx::lllock::LockWord::Locked(s) = rtx::lllock::LockWord::decode(w) else {
                    continue;
                };
                if !ids.contains(&s.id) {
                    continue;
                }
                let now = rtx::lease::Clock::now_ms(&SystemClock);
                if !s.expired(now) {
                    std::thread::sleep(std::time::Duration::from_millis(s.lease_ms + 1 - now));
                }
                if c.repair(&mem, at, w).await?.changed() {
                    locks += 1;
                }
                let after = rtx::mem::Mem::read_u64(&mem, at).await?;
                if after == w {
                    anyhow::bail!(
                        "object {i} still locked by dead rTX ID {} after its repair",
                        s.id
                    );
                }
            }
            Ok::<_, anyhow::Error>((logs, locks))
        }
        .await;
        *o2.borrow_mut() = Some(r);
    });
    ex.run();
    let r = out.borrow_mut().take().expect("recovery ran");
    r
}

/// A client process (`--client-spec`): connect `--threads` threads to the memory node,
/// say ready on the board, wait for go, run the phase's workload for the warm-up and
/// the measured window, print a [`ClientReport`] on stdout.
///
/// Errors: a bad spec or board, a connection or run error (printed by `bench_main`, exit
/// code 1: the driver reports the process failed).
fn run_client_process(args: &Args, spec: &str) -> Result<()> {
    let spec: ClientSpec = serde_json::from_str(spec).context("--client-spec")?;
    let layout = layout(args)?;
    let per = args.threads as usize * args.coroutines as usize;
    let board = Arc::new(Board::open(&spec.board, per, board_intervals(args))?);
    index_fault::set_board(board.clone());
    let plan = Arc::new(Plan {
        args: args.clone(),
        layout,
        proto: spec.proto,
        next_index: AtomicU64::new(0),
    });
    let rpc = args.config.rpc_settings()?;
    let open = |node: u32| -> Result<Fabric> {
        let mut cfg = FabricConfig::new(args.fabric.fabric, &spec.cluster, NodeId(node));
        cfg.model = args.fabric.model.clone();
        Ok(Fabric::open(&cfg)?)
    };
    let stop = Arc::new(AtomicBool::new(false));
    let ready = Barrier::new(args.threads as usize + 1);
    let started: std::sync::OnceLock<Arc<InProcess>> = std::sync::OnceLock::new();
    let first_slot = spec.process as u64 * per as u64;
    let outs = std::thread::scope(|scope| -> Result<Vec<PhaseOut>> {
        let workers: Vec<_> = (0..args.threads)
            .map(|t| {
                let (plan, stop, ready, started, open, rpc) =
                    (plan.clone(), stop.clone(), &ready, &started, &open, &rpc);
                let node = 100 + 100 * spec.phase as u32 + (spec.process * args.threads + t) as u32;
                scope.spawn(move || -> Result<Vec<PhaseOut>> {
                    let r = open(node).and_then(|f| {
                        let ctx = ThreadCtx::new(f, rpc.runtime.clone())?;
                        let (mem, l) = rtx::host::connect(&ctx, spec.mn)?;
                        anyhow::ensure!(l == plan.layout, "exported layout differs");
                        Ok((ctx, mem))
                    });
                    ready.wait();
                    ready.wait();
                    let (ctx, mem) = r?;
                    let proc = started.get().context("not started")?.clone();
                    let measure_from = proc.go + plan.args.run.warmup();
                    let first = first_slot + t as u64 * plan.args.coroutines as u64;
                    run_thread(
                        &plan,
                        ctx,
                        mem,
                        spec.phase,
                        first,
                        measure_from,
                        &stop,
                        Some(proc),
                    )
                })
            })
            .collect();
        ready.wait();
        board.set_ready();
        let go = board.wait_go(CLIENT_GRACE);
        let _ = started.set(Arc::new(InProcess {
            board: board.clone(),
            go: go.unwrap_or_else(Instant::now),
            insert_base: spec.insert_base,
            first_slot,
        }));
        if go.is_none() {
            stop.store(true, Ordering::Relaxed);
        }
        ready.wait();
        if let Some(go) = go {
            std::thread::sleep(
                (go + args.run.warmup() + args.run.duration())
                    .saturating_duration_since(Instant::now()),
            );
        }
        stop.store(true, Ordering::Relaxed);
        let mut all = Vec::new();
        for w in workers {
            all.extend(w.join().expect("client thread panicked")?);
        }
        anyhow::ensure!(
            go.is_some(),
            "no go from index-bench within {CLIENT_GRACE:?}"
        );
        Ok(all)
    })?;
    let PhaseOut {
        ops,
        hist,
        aborts,
        repairs,
        hints,
        rehash_ns,
    } = PhaseOut::sum(outs)?;
    let hdr = jsonl::latency_fields(&hist)
        .get("hdr")
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_string();
    println!(
        "{}",
        serde_json::to_string(&ClientReport {
            ops,
            aborts,
            repairs,
            hints,
            rehash_ns,
            hdr
        })?
    );
    Ok(())
}

/// Print the factor analysis of every workload: each step's throughput and p50 latency
/// against the step before (rTX 6, Figs. 16-17), and return them as ratio records.
/// `rows(p)`: protocol `p`'s rows (workload, ops/s, p50 us, p99 us, aborts).
fn print_factors(
    workloads: &[Workload],
    rows: impl Fn(Proto) -> Option<Vec<Row>>,
) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    for (i, w) in workloads.iter().enumerate() {
        println!(
            "{}: factor analysis (each step against the one before)",
            w.label()
        );
        let mut prev: Option<(f64, f64)> = None;
        for &(p, what) in &FACTOR_STEPS {
            let Some(r) = rows(p) else { continue };
            let (tput, p50) = (r[i].1, r[i].2);
            match prev {
                None => println!(
                    "  {:<10} {what}: {tput:.0} ops/s, p50 {p50:.1} us",
                    p.name()
                ),
                Some((t0, l0)) => {
                    println!(
                        "  {:<10} {what}: throughput x{:.2}, p50 x{:.2}",
                        p.name(),
                        tput / t0,
                        p50 / l0
                    );
                    out.push(json!({
                        "workload": w.name(),
                        "ratio": format!("factor {}", p.name()),
                        "throughput": tput / t0,
                        "p50": p50 / l0,
                    }));
                }
            }
            prev = Some((tput, p50));
        }
    }
    out
}

/// The longest `--stop-client-after` pause of a RACE client, ms: half the allocator's
/// reuse wait ([`rtx::alloc::MIN_REUSE_MS`]). A stopped client's slot CAS targets the
/// subtable block it read before the stop; a rehash may retire that block meanwhile, and
/// the late CAS must land before the block can be reused (its post-check then runs the
/// operation again on the new block). The other half covers the operation's own time
/// and the scheduling of the stopped process once continued.
const RACE_MAX_STOP_MS: u64 = rtx::alloc::MIN_REUSE_MS / 2;

/// The client-process and fault flags together. Errors (usage): a fault without
/// `--processes 2` or more, two faults, a fault on a protocol other than rTX (Optimal
/// and DTX have no repair: a dead client's lock would stop the others for good), a fault
/// outside the measured window, a zero `--stop-ms` (or one above [`RACE_MAX_STOP_MS`]
/// for RACE), more client threads than node ids;
/// `--crash-at`, `--pause-at` or `--plant` in a build without rtx's `fault-injection`,
/// a change of the other index, no workload that inserts.
fn check_processes(args: &Args) -> Result<()> {
    let fault = args.kill_client_after.or(args.stop_client_after);
    let faults = [
        args.kill_client_after.is_some(),
        args.stop_client_after.is_some(),
        args.crash_at.is_some(),
        args.pause_at.is_some(),
    ];
    if faults.iter().filter(|&&f| f).count() > 1 {
        bail!("--kill-client-after, --stop-client-after, --crash-at and --pause-at: one fault per run");
    }
    check_injected(args)?;
    if let Some(t) = fault {
        if args.processes < 2 {
            bail!("a client fault needs --processes 2 or more (the others go on)");
        }
        if args.protocol != Proto::Rtx {
            bail!("a client fault runs --protocol rtx only: Optimal and DTX have no repair, so a dead or stopped client's lock stops the others");
        }
        if t.0.is_zero() || t.0 >= args.run.duration() {
            bail!(
                "the fault time {t} must lie inside --duration {}",
                args.run.duration
            );
        }
    }
    // A killed client writes nothing more; a stopped or paused one's late slot CAS must
    // land before a subtable block retired meanwhile can be reused.
    if (args.stop_client_after.is_some() || args.pause_at.is_some())
        && args.index == Index::Race
        && args.stop_ms > RACE_MAX_STOP_MS
    {
        bail!(
            "--stop-ms {} with --index race: at most {RACE_MAX_STOP_MS} ms. A RACE slot CAS \
             lands in the subtable block its client read before it was stopped; a rehash \
             meanwhile retires that block, which is reused {} ms after, so a longer stop \
             could land the late CAS in a reused block",
            args.stop_ms,
            rtx::alloc::MIN_REUSE_MS
        );
    }
    if args.index == Index::Race
        && matches!(
            args.protocol,
            Proto::Dtx | Proto::Occ | Proto::RtxBase | Proto::RtxOpt2 | Proto::Factors
        )
    {
        bail!(
            "--protocol {}: DTX, the factor analysis and its steps exist for --index blink only",
            args.protocol.name()
        );
    }
    if args.index == Index::Race && args.pre_lock {
        bail!("--pre-lock pre-locks B-link leaves: it needs --index blink");
    }
    if args.clock_skew_ms != 0 && args.protocol != Proto::Rtx {
        bail!("--clock-skew-ms runs --protocol rtx only (leases are rTX's)");
    }
    if args.clock_skew_ms.unsigned_abs() > 60_000 {
        bail!(
            "--clock-skew-ms {}: at most a minute either way",
            args.clock_skew_ms
        );
    }
    if (args.stop_client_after.is_some() || args.pause_at.is_some()) && args.stop_ms == 0 {
        bail!("--stop-ms must be positive");
    }
    if args.processes as u32 * args.threads as u32 > 99 {
        bail!(
            "--processes {} x --threads {}: at most 99 client threads (node ids 100 + 100 x phase + thread)",
            args.processes,
            args.threads
        );
    }
    Ok(())
}

/// `--crash-at`, `--pause-at` and `--plant` (see [`check_processes`]).
fn check_injected(args: &Args) -> Result<()> {
    let point = args.crash_at.or(args.pause_at);
    if (point.is_some() || args.plant.is_some()) && !rtx::fault::ENABLED {
        bail!("--crash-at, --pause-at and --plant need a fault-injection build: the index-bench that `cargo test -p bench` builds (bench's dev-dependencies enable rtx's feature fault-injection)");
    }
    if args.plant.is_some() && args.protocol != Proto::Rtx {
        bail!("--plant breaks rTX's repair: --protocol rtx only");
    }
    let Some(f) = point else { return Ok(()) };
    let flag = if args.crash_at.is_some() {
        "--crash-at"
    } else {
        "--pause-at"
    };
    if args.processes < 2 {
        bail!("{flag} needs --processes 2 or more (the others go on)");
    }
    // One exception: RACE's original rehash killed holding its spinlocks, the rTX
    // paper's point of comparison (6), which the run's progress check must catch.
    let optimal_rehash = args.crash_at.is_some()
        && args.protocol == Proto::Optimal
        && args.index == Index::Race
        && f.change == Change::Rehash;
    if optimal_rehash && f.point != CrashPoint::Locked {
        bail!("{flag} {f}: the Optimal (RACE original) rehash writes no log and holds its spinlocks from start to end; its one point is rehash:locked");
    }
    if args.protocol != Proto::Rtx && !optimal_rehash {
        bail!("{flag} runs --protocol rtx only (and --protocol optimal --index race with --crash-at rehash:locked: RACE's spinlocked rehash, killed): Optimal and DTX have no repair");
    }
    match (f.change, args.index) {
        (Change::Split, Index::Blink) | (Change::Rehash, Index::Race) => {}
        (Change::Split, Index::Race) => {
            bail!("{flag} {f}: a hash index does not split; give rehash:POINT or --index blink")
        }
        (Change::Rehash, Index::Blink) => {
            bail!("{flag} {f}: a B-link tree does not rehash; give split:POINT or --index race")
        }
    }
    if !args.workload.iter().any(|w| w.inserts()) {
        bail!(
            "{flag} {f}: only inserts make a {}; give a workload that inserts (--workload d or e)",
            f.change.name()
        );
    }
    Ok(())
}

/// index-bench's defaults for the shared flags: 1 s per workload after 200 ms of warm-up.
const DEFAULTS: &[(&str, &str)] = &[("duration", "1s"), ("warmup", "200ms")];

fn main() {
    bench::bench_main::<Args>("index-bench", DEFAULTS, run);
}

/// Check the flags (usage errors, exit code 2, before anything runs), run every protocol,
/// print and write the ratios, the summary and the chart.
fn run(mut args: Args) -> Result<()> {
    if args.keys == 0 || args.threads == 0 || args.coroutines == 0 {
        return Err(cli::usage(
            "--keys, --threads and --coroutines must be positive",
        ));
    }
    if !(args.zipf >= 0.0 && args.zipf.is_finite()) {
        return Err(cli::usage(format!(
            "--zipf {}: a theta must be 0 (uniform) or more",
            args.zipf
        )));
    }
    args.run.check()?;
    args.run.normalize();
    if args.index == Index::Race && args.workload.contains(&Workload::E) {
        args.workload.retain(|&w| w != Workload::E);
        if args.workload.is_empty() {
            return Err(cli::usage(
                "--index race: ycsb-e scans key ranges, which a hash index cannot; give other workloads or --index blink",
            ));
        }
        if args.client_spec.is_none() {
            println!("ycsb-e skipped: a hash index has no range scans (--index blink runs it)");
        }
    }
    let model = args.fabric.model()?;
    let model_desc = cli::as_usage(rrpc::fabric::model::TimingModel::load(&model))?
        .map_or_else(|| "none".into(), |m| m.describe());
    // From here on `--model` holds the model that runs (the default rule applied).
    args.fabric.model = Some(model.clone());
    cli::as_usage(layout(&args))?;
    cli::as_usage(check_processes(&args))?;
    if let Some(spec) = &args.client_spec {
        return run_client_process(&args, spec);
    }
    jsonl::open(
        args.out.json.as_deref(),
        &jsonl::RunInfo {
            binary: "index-bench",
            fabric: args.fabric.fabric,
            rdma_device: None,
            model: &model,
            seed: args.seed.seed,
        },
    )?;
    println!(
        "index-bench | {} | fabric: {} | timing model: {model_desc} | {} keys | {}{} thread(s) x {} coroutines | {} | {} (+{} warm-up) per workload{}{}",
        match args.index {
            Index::Blink => "B-link tree",
            Index::Race => "RACE hash table",
        },
        args.fabric.fabric,
        args.keys,
        if args.processes > 0 {
            format!("{} client processes x ", args.processes)
        } else {
            String::new()
        },
        args.threads,
        args.coroutines,
        if args.zipf > 0.0 { format!("zipf {}", args.zipf) } else { "uniform".into() },
        args.run.duration,
        args.run.warmup,
        match (args.kill_client_after, args.stop_client_after, args.crash_at, args.pause_at) {
            (Some(t), ..) => format!(" | client process 0 killed {t} into each"),
            (_, Some(t), ..) => format!(
                " | client process 0 stopped {t} into each, for {} ms",
                args.stop_ms
            ),
            (_, _, Some(f), _) => format!(
                " | client process 0 kills itself at {f} in each workload that inserts"
            ),
            (.., Some(f)) => format!(
                " | client process 0 stops itself at {f} for {} ms in each workload that inserts",
                args.stop_ms
            ),
            _ => String::new(),
        } + &args.plant.map(|p| format!(" | planted: {p:?}")).unwrap_or_default(),
        if args.clock_skew_ms != 0 || args.drift_ms != 8 {
            format!(
                " | DRIFT {} ms{}",
                args.drift_ms,
                if args.clock_skew_ms != 0 {
                    format!(
                        ", {} clients' clocks {:+} ms",
                        if args.processes > 0 {
                            "client process 0's"
                        } else {
                            "the first thread's"
                        },
                        args.clock_skew_ms
                    )
                } else {
                    String::new()
                }
            )
        } else {
            String::new()
        }
    );
    let protos: Vec<Proto> = match args.protocol {
        Proto::All if args.index == Index::Race => vec![Proto::Rtx, Proto::Optimal],
        Proto::All => vec![Proto::Rtx, Proto::Optimal, Proto::Dtx],
        Proto::Factors => FACTOR_STEPS.iter().map(|&(p, _)| p).collect(),
        p => vec![p],
    };
    let mut all = Vec::new();
    for &p in &protos {
        all.push((p, run_protocol(&args, p)?));
    }
    let find = |p: Proto| all.iter().find(|(q, _)| *q == p).map(|(_, o)| &o.rows);
    let mut ratios = Vec::new();
    if let Some(r) = find(Proto::Rtx) {
        for (other, name) in [(Proto::Optimal, "optimal"), (Proto::Dtx, "dtx")] {
            let Some(o) = find(other) else { continue };
            for (i, w) in args.workload.iter().enumerate() {
                let q = (r[i].1 / o[i].1, r[i].2 / o[i].2, r[i].3 / o[i].3);
                println!(
                    "{}: ratio throughput rtx/{name} = {:.2}  (p50 {:.2}x, p99 {:.2}x)",
                    w.label(),
                    q.0,
                    q.1,
                    q.2
                );
                ratios.push(json!({
                    "workload": w.name(),
                    "ratio": format!("rtx/{name}"),
                    "throughput": q.0,
                    "p50": q.1,
                    "p99": q.2,
                }));
            }
        }
    }
    if args.protocol == Proto::Factors {
        ratios.extend(print_factors(&args.workload, |p| find(p).cloned()));
    }
    let rehash = |p: Proto| {
        all.iter()
            .find(|(q, _)| *q == p)
            .map(|(_, o)| o.rehash_ns.clone())
            .filter(|v| !v.is_empty())
    };
    if let (Some(mut r), Some(mut o)) = (rehash(Proto::Rtx), rehash(Proto::Optimal)) {
        let ((rp, _), (op, _)) = (rehash_summary(&mut r), rehash_summary(&mut o));
        println!(
            "rehash: ratio time original/rtx = {:.2} (p50 of the inserts that rehashed: Optimal {:.1} us over {} rehashes, rTX {:.1} us over {}; the same subtable size: RACE's rehash moves each key with 2 CASes, rTX's writes whole blocks)",
            op / rp,
            op / 1e3,
            o.len(),
            rp / 1e3,
            r.len()
        );
        ratios.push(json!({
            "ratio": "rehash time optimal/rtx",
            "value": op / rp,
            "rtx_p50_us": rp / 1e3,
            "optimal_p50_us": op / 1e3,
            "rtx_rehashes": r.len(),
            "optimal_rehashes": o.len(),
        }));
    }
    let runs: Vec<serde_json::Value> = all
        .iter()
        .flat_map(|(p, o)| {
            o.rows.iter().map(move |&(w, tput, p50, p99, aborts)| {
                json!({
                    "protocol": p.name(),
                    "workload": w.name(),
                    "ops_per_s": tput,
                    "p50_us": p50,
                    "p99_us": p99,
                    "aborts_and_retries": aborts,
                })
            })
        })
        .collect();
    let loads: Vec<serde_json::Value> = all
        .iter()
        .map(|(p, o)| json!({ "protocol": p.name(), "secs": o.load_secs, "aborts": o.load_aborts }))
        .collect();
    jsonl::summary(&json!({
        "bench": "index-bench",
        "index": args.index.name(),
        "model": model,
        "fabric": args.fabric.fabric.to_string(),
        "keys": args.keys,
        "zipf": args.zipf,
        "threads": args.threads,
        "coroutines": args.coroutines,
        "objects": args.objects,
        "duration_ms": args.run.duration().as_millis() as u64,
        "warmup_ms": args.run.warmup().as_millis() as u64,
        "seed": args.seed.seed,
        // Every protocol's tree passed its check: a failed one ends the run with an
        // error before this is written.
        "tree_checks_passed": true,
        "loads": loads,
        "runs": runs,
        "ratios": ratios,
    }));
    if let Some(p) = &args.out.json {
        println!("wrote {}", p.display());
    }
    if let Some(path) = &args.out.chart {
        // The workloads on a linear axis at 1 (A) ... 5 (E), whichever ran.
        let x = |w: Workload| w as usize as f64 + 1.0;
        let series: Vec<Series> = all
            .iter()
            .map(|(p, o)| Series {
                name: p.name(),
                points: o.rows.iter().map(|r| (x(r.0), r.1)).collect(),
                labels: Vec::new(),
            })
            .collect();
        let title = format!(
            "{} throughput per YCSB workload (timing model: {model})",
            match args.index {
                Index::Blink => "B-link tree",
                Index::Race => "RACE hash table",
            }
        );
        LineChart {
            title: &title,
            x_label: "YCSB workload (1 = A ... 5 = E)",
            y_label: "ops/s",
            x_scale: Scale::Linear,
            y_scale: Scale::Log10,
            series: &series,
        }
        .draw(path)?;
        println!("plot: {}", path.display());
    }
    Ok(())
}
