//! `txn-bench`'s command line: the flags ([`Args`]), the protocol, isolation and sweep
//! choices, the points a run visits, and the checks of flags that several workloads
//! share. Below the workloads (which read their own flags from [`Args`]) and the run
//! ([`crate::txnbench`]), which re-exports these types.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use anyhow::bail;
use clap::{Parser, ValueEnum};
use rrpc::fabric::FabricKind;
use serde::{Deserialize, Serialize};
use txn::coordinator::{Isolation, Protocol};

use crate::config_file::ConfigError;
use crate::workload::Workload;

/// SmallBank, KVS, YCSB, TATP or TPC-C on a local cluster (memnode, tso and lockd child
/// processes) over the shm fabric, with one transaction protocol or all of them side by
/// side. --chart draws throughput against p99 per protocol (with --sweep, one line per
/// protocol through the sweep's points).
///
/// The flags also travel as JSON (serde), to the coordinator processes of `--cnodes`.
#[derive(Parser, Debug, Clone, Serialize, Deserialize)]
#[command(version, about, long_about = None, args_override_self = true)]
pub struct Args {
    /// Read the experiment's settings from this TOML file: its keys are this command's
    /// long flags (`workload = "tpcc"`, `warehouses = 4`, `protocol = "all"`,
    /// `no-check = true`), a `[fabric]` table holds kind (--fabric) and model (--model),
    /// `[runtime]` and `[server]` tables hold rrpc's settings for the coordinators and the
    /// services this command starts (over --hosts' file's); flags on the command line win
    /// over the file.
    #[arg(long, value_name = "FILE.toml")]
    pub config: Option<PathBuf>,
    /// Run a suite instead of this command's workloads: rcc (RCC's concurrency-control
    /// protocols, each over RPC and one-sided RDMA, on a symmetric cluster; its own
    /// flags: `txn-bench --suite rcc --help`).
    #[arg(long, value_name = "SUITE")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suite: Option<String>,
    /// Workload: smallbank, kvs (one read or update per transaction, half each), ycsb-a
    /// (50% reads / 50% updates), ycsb-b (95/5), ycsb-c (reads), ycsb-d (95% reads of
    /// the latest keys / 5% inserts), ycsb-e (95% range scans of 1 to 100 records through
    /// the range index, a B-link tree on memory node 0 / 5% inserts), ycsb-f (50% reads /
    /// 50% read-modify-writes), tatp (seven types, 80% reads, the specification's NURand
    /// subscriber ids) or tpcc (five types, 45/43/4/4/4, each coordinator bound to a home
    /// warehouse) or pairs (groups of --group-size objects: half the transactions write
    /// one fresh value to a whole group, half read a group and fail the run if its
    /// values differ).
    #[arg(long, default_value = "smallbank", value_name = "WORKLOAD")]
    #[serde(with = "as_str")]
    pub workload: Workload,
    /// TATP subscribers (s_id 1..=N; about 10 rows each over the four tables).
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    pub subscribers: u64,
    /// TPC-C warehouses (about 100 MB of rows each with 4 versions). Default: one per
    /// coordinator thread. Coordinator coroutine g (over all threads) has home
    /// warehouse g mod N + 1.
    #[arg(long, value_name = "N")]
    pub warehouses: Option<u16>,
    /// SmallBank: a fixed set of hot accounts 0..N drawn uniformly for --hot-fraction of
    /// the account draws (FORD's hot-account option); the rest follow --theta.
    #[arg(long, value_name = "N")]
    pub hot_accounts: Option<u64>,
    /// SmallBank with --hot-accounts: the fraction of account draws that go to the hot
    /// set (0 to 1).
    #[arg(long, default_value_t = 0.9, value_name = "FRACTION")]
    pub hot_fraction: f64,
    /// pairs: groups of objects (each written whole by one transaction).
    #[arg(long, default_value_t = 10_000, value_name = "G")]
    pub groups: u64,
    /// pairs: objects per group (2 to 64), on different memory nodes when --memnodes
    /// is at least this.
    #[arg(long, default_value_t = 3, value_name = "K")]
    pub group_size: usize,
    /// KVS / YCSB records (keys 0..N loaded).
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    pub records: u64,
    /// KVS / YCSB operations per transaction, on distinct keys (default 1 for kvs, 4
    /// for ycsb-*).
    #[arg(long, value_name = "N")]
    pub ops_per_txn: Option<usize>,
    /// KVS / YCSB value size in bytes (at least 16: update counter and checksum).
    #[arg(long, default_value_t = txn::kvs::DEFAULT_VALUE_BYTES, value_name = "BYTES")]
    pub value_bytes: usize,
    /// Concurrency control: occ-cas (OCC with CAS locks in the CVT header), scythe
    /// (hot-aware OCC/TOCC on Takeout Locks), mvcc (Motor's MVCC at --isolation), mvcc-si,
    /// or all (occ-cas, scythe and mvcc one after another, each on a fresh cluster, then
    /// a comparison).
    #[arg(long, default_value = "scythe", value_name = "PROTOCOL")]
    #[serde(with = "as_str")]
    pub protocol: ProtocolArg,
    /// Isolation of mvcc (and of the mvcc run of --protocol all): sr (serializable) or si
    /// (snapshot isolation). Default sr.
    #[arg(long, value_enum, value_name = "LEVEL")]
    pub isolation: Option<IsolationArg>,
    /// Memory nodes to start; the tables are partitioned across them by key.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub memnodes: u32,
    /// Copies of every partition (Motor 5.3, FORD: 1 primary and R - 1 backups, each
    /// on another memory node; 1 to --memnodes). Commits write every copy in the same
    /// round and report committed only after all of them ACKed; after the run every
    /// backup is audited against its primary.
    #[arg(long, default_value_t = 1, value_name = "R")]
    pub replicas: u32,
    /// Spare memory nodes started with the cluster (after the --memnodes ones, each an
    /// empty image of every partition). With --kill-memnode-after and without
    /// --restart, the view manager copies each partition the dead node held a copy of
    /// to the first spare once the failover is done (bulk READs and WRITEs, commits to
    /// that partition waiting meanwhile), restoring --replicas copies (`re-replicated:`
    /// lines). Needs --replicas 2 or more.
    #[arg(long, default_value_t = 0, value_name = "N")]
    #[serde(default)]
    pub spare_memnodes: u32,
    /// Version cells per CVT (how many versions each record keeps; 1 to 64).
    #[arg(long, default_value_t = txn::smallbank::DEFAULT_VERSIONS, value_name = "V")]
    pub versions: usize,
    /// Scythe's TOCC heuristic wait (Scythe 4.4 (2)) after a Lock RPC refused on a warm
    /// object (queue between ColdWatermark and HotWatermark), before the retry, in
    /// microseconds (0 turns it off).
    #[arg(long, default_value_t = 20, value_name = "US")]
    pub tocc_wait_us: u64,
    /// Repeat the run(s) at each point: theta=0,0.5,0.99 (Zipf theta), clients=8,16,32
    /// (coroutines per thread), commit-log=off,on,ordered (what the commit logs cost,
    /// placed either way, with the coordinators inside txn-bench),
    /// vtc-entries=0,65536 (Lotus's version table cache off and on, as --vtc-entries)
    /// lock-serving=coordinator,thread (where Lotus's compute nodes serve lock RPCs,
    /// as --lock-serving), range-index=off,on (TPC-C: DELIVERY and STOCK-LEVEL by
    /// cursor rows, then by range scans, as --range-index) or replicas=1,3 (copies of
    /// every partition, as --replicas: what replication costs, each protocol's
    /// throughput at every point over its first) or max-backoff-us=100,1000 (the retry
    /// backoff's cap, as --max-backoff-us: under skew it sets how fast refused
    /// transactions come back) or lock-placement=lockd,memnode (Scythe's locks on a
    /// lockd node, then on the memory nodes, as --lock-placement: throughput and p99 of
    /// each protocol at memnode over lockd); prints a table, and with --chart
    /// draws throughput against p99, one line per protocol.
    #[arg(long, value_name = "PARAM=V1,V2,...")]
    #[serde(with = "opt_str")]
    pub sweep: Option<Sweep>,
    /// `--json` (JSON Lines: the metadata record, one `run` record per run as it ends,
    /// the summary) and `--chart` (throughput against p99 per protocol; with --sweep,
    /// one line per protocol through the sweep's points, each labelled with its value;
    /// a log latency axis when the p99s span a decade).
    #[command(flatten)]
    #[serde(flatten)]
    pub out: crate::cli::OutputArgs,
    /// Coordinator threads (each runs its own executor; pinned to cores when possible).
    /// Default: one less than the cores available (at least 1), leaving a core to the
    /// lock service's polling thread.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Coordinators (coroutines) per thread.
    #[arg(long, default_value_t = 8)]
    pub coroutines: usize,
    /// Lotus: entries of the compute node's version table cache (Lotus 4.4: CVTs of
    /// locally locked keys, so that a lock holder skips the CVT READ; default Lotus 8.1's
    /// 64 K); 0 turns it off.
    #[arg(long, default_value_t = txn::vt_cache::DEFAULT_ENTRIES, value_name = "N")]
    #[serde(default = "default_vtc_entries")]
    pub vtc_entries: usize,
    /// SmallBank accounts.
    #[arg(long, default_value_t = 100_000)]
    pub accounts: u64,
    /// Zipf theta of account (key) choice (0 = uniform).
    #[arg(long, default_value_t = 0.99)]
    pub theta: f64,
    /// `--duration` of each run (each protocol, each sweep point; default 10 s) and
    /// `--warmup` (default 0): each run's coordinators run warm-up + duration; what is
    /// reported (throughput, latencies, aborts, network counters, breakdown, timeline)
    /// covers the measured window after the warm-up, a transaction in flight at the
    /// boundary counted in the window it ends in; the checks cover the whole run.
    #[command(flatten)]
    #[serde(flatten)]
    pub run: crate::cli::RunLength,
    /// `--fabric` and `--model` (the model applies to this process and every service it
    /// starts).
    #[command(flatten)]
    #[serde(flatten)]
    pub fabric_args: crate::cli::FabricArgs,
    /// RDMA device for --fabric verbs (default: $RRPC_RDMA_DEVICE, else the first).
    #[arg(long, env = "RRPC_RDMA_DEVICE")]
    pub rdma_device: Option<String>,
    /// GID index for --fabric verbs (default: $RRPC_GID_INDEX, else RoCEv2 IPv4-mapped).
    #[arg(long, env = "RRPC_GID_INDEX")]
    pub gid_index: Option<u32>,
    /// Cluster name (default: `txn-bench-<pid>`; with several runs, each run's cluster
    /// gets a suffix `-<run>`).
    #[arg(long)]
    pub cluster: Option<String>,
    /// Directory of the memnode, lockd and tso binaries (default: next to this binary).
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    /// Run the services on the hosts of this topology file (cluster.toml: hosts and
    /// roles, see the book's topology page): each memory node, the oracle and the lock
    /// service at its role's ctrl-ip:port with its host's RDMA device, over ssh where the
    /// host is not this one (`$RRPC_SSH` replaces ssh), their logs under
    /// `<log-dir>/<cluster>/`. The coordinators run in txn-bench, on the device of the
    /// file's first coordinator host, or with --cnodes 2 or more as coordinator
    /// processes on the file's coordinator hosts in turn (each on its host's device; the
    /// run's etcd listens on the first coordinator host's address). Sets --fabric and
    /// --memnodes from the file; the coordinators' runtimes take its `[runtime]`. The
    /// faults --kill-memnode-after, --kill-cn-after and --stop-cn-after reach a process
    /// on another host through ssh.
    #[arg(long, value_name = "FILE")]
    #[serde(default)]
    pub hosts: Option<PathBuf>,
    /// The run's rrpc settings: the topology file's `[runtime]` and `[server]` (with
    /// --hosts), with the --config file's over them (set by `txn-bench`). The
    /// coordinators' runtimes take `runtime` (coordinator processes through their
    /// `--run-spec`); the services it starts take both as `--rpc-settings` when they
    /// differ from the defaults. `None`: the defaults. Not a flag.
    #[arg(skip)]
    #[serde(default)]
    pub rpc: Option<rrpc::node::RpcSettings>,
    /// KVS inserts (`ycsb-d`, `ycsb-e`): this process's lane of new keys, so that
    /// coordinator processes, and the lives of one, never draw the same key: lane `l`
    /// inserts keys from `records + l * 2^32` on. 0 in `txn-bench` itself; a
    /// coordinator process sets its own (`cnode << 8 | incarnation`). Not a flag.
    #[arg(skip)]
    #[serde(skip)]
    pub insert_lane: u64,
    /// With --hosts: print the command line of every service (per host) and exit
    /// without starting anything.
    #[arg(long)]
    #[serde(default)]
    pub dry_run: bool,
    /// Server threads of the lock service (of each memory node's, with
    /// --lock-placement memnode).
    #[arg(long, default_value_t = 1)]
    pub lockd_threads: usize,
    /// Where Scythe's Takeout Locks live: memnode (each memory node serves the locks of
    /// its partition's objects behind its own address, and a TOCC read whose ticket is
    /// served at once gets its object with the grant, one RPC: Scythe 4.3's placement,
    /// the locks with the data; no lockd node runs), lockd (one lock-service node for the
    /// cluster), or auto: memnode (the faster on SmallBank), except lockd when the
    /// partitions are replicated (--replicas above 1: the locks would not follow a
    /// failover), when --kill-lockd-after kills the lock service, or with --hosts (the
    /// topology file places the lockd). The header says which ran. Other protocols take
    /// no Takeout Locks and ignore it.
    #[arg(long, value_enum, default_value_t = LockPlacementArg::Auto)]
    #[serde(default)]
    pub lock_placement: LockPlacementArg,
    /// Scythe's ColdWatermark (queued tickets above which a cold-mode Lock RPC is
    /// refused and the retry runs TOCC).
    #[arg(long, default_value_t = 3, value_name = "TICKETS")]
    pub cold_watermark: u64,
    /// Scythe's HotWatermark (queued tickets above which every Lock RPC is refused).
    #[arg(long, default_value_t = 10, value_name = "TICKETS")]
    pub hot_watermark: u64,
    /// Longest randomized exponential backoff after a conflict abort, in microseconds
    /// (0 retries at once).
    #[arg(long, default_value_t = 100)]
    pub max_backoff_us: u64,
    /// How long a Scythe coordinator waits for a granted lock's turn before it aborts
    /// the transaction (lock-wait-timeout); its tickets are then released in the
    /// background when their turn comes. Microseconds.
    #[arg(long, default_value_t = 2_000_000, value_name = "US")]
    pub lock_wait_us: u64,
    /// `--seed` (each coroutine derives its own; every run uses the same seeds).
    #[command(flatten)]
    #[serde(flatten)]
    pub seed: crate::cli::SeedArg,
    /// Do not record committed transactions or check serializability / snapshot
    /// isolation (for long runs; the check holds about 84 bytes per committed SmallBank
    /// transaction and needs about 300 while it runs).
    #[arg(long)]
    pub no_check: bool,
    /// UNSAFE, benchmark only: run mvcc without its lock CAS (Lotus's Fig. 3 premise:
    /// read-write objects are READ and treated as locked, nothing is released; the
    /// validation of read-only data stays). Writers are no longer isolated, so every
    /// check is off and the output says UNSAFE. Needs --protocol mvcc (or mvcc-si).
    #[arg(long)]
    #[serde(default)]
    pub unsafe_no_cas: bool,
    /// Lotus's Fig. 3 premise in one invocation: mvcc, then mvcc without its lock CAS
    /// (as --unsafe-no-cas: UNSAFE, checks off), each on a fresh cluster with the same
    /// seed; prints `ratio throughput mvcc-nocas/mvcc` and whether it reaches the 1.5x
    /// below which a timing model does not reproduce the memory nodes' CAS bottleneck.
    /// Needs --protocol mvcc (or mvcc-si).
    #[arg(long)]
    #[serde(default)]
    pub fig3_premise: bool,
    /// Lotus's ablation (Lotus 8.4, Fig. 14) in one invocation, with coordinator
    /// processes (--cnodes 2 or more): mvcc (the Motor baseline), then lotus with lock
    /// sharding and --routing none and no version table cache, then + two-level routing
    /// (--routing forward, or ideal when given), then + the version table cache
    /// (--vtc-entries); each on a fresh cluster with the same seed, then one table with
    /// every row's change against the row above beside the paper's, and whether the
    /// paper's signs hold. Not with --protocol, --sweep or the UNSAFE variants.
    #[arg(long)]
    #[serde(default)]
    pub ablation: bool,
    /// Run the invocation's runs this many times, in turn (forward, then backward, and
    /// so on, so that a drift of the machine's speed reaches every run alike), and judge
    /// the comparison by its medians over the rounds: each ratio (`throughput
    /// mvcc/occ-cas`, ...) and each --ablation change is taken within a round, then the
    /// median of the rounds is reported beside every round's value. On a shared machine
    /// whose speed changes by a quarter for minutes at a time, one round can pair runs
    /// taken at two speeds. Needs several runs per round (--protocol all, --sweep,
    /// --ablation or --fig3-premise). One round (the default) is the single comparison.
    #[arg(long, alias = "ablation-rounds", default_value_t = 1, value_name = "N")]
    #[serde(default = "one_round", alias = "ablation_rounds")]
    pub rounds: u32,
    /// Print where the committed transactions' time goes, per type (Scythe's latency
    /// decomposition): mean and p99 of execution reads, timestamps, lock acquisition and
    /// waits, validation, commit writes, unlock and backoff, and the CPU time of every
    /// process of the cluster during the run. Costs a few clock reads per attempt.
    #[arg(long)]
    pub breakdown: bool,
    /// Write a commit log to the memory nodes before each commit's installs (one round
    /// trip more per read-write commit), which a survivor needs to recover a coordinator
    /// that dies. Always on with coordinator processes (--cnodes 2 or more); this turns
    /// it on for coordinators inside txn-bench too (--sweep commit-log=off,on measures
    /// its cost side by side).
    #[arg(long)]
    #[serde(default)]
    pub commit_log: bool,
    /// TPC-C: DELIVERY finds each district's oldest new order, and STOCK-LEVEL the
    /// order lines of the last 20 orders, by range scans of the range index (a B-link
    /// tree of NEW_ORDER and ORDER_LINE keys on memory node 0, whose nodes are rTX
    /// objects) instead of DELIVERY's cursor rows and STOCK-LEVEL's reads of the 20
    /// orders; NEW-ORDER adds its rows' keys to the index. ycsb-e always uses the
    /// index; other workloads refuse the flag.
    #[arg(long)]
    #[serde(default)]
    pub range_index: bool,
    /// Where a commit log lands relative to the installs: round-before (its WRITEs
    /// complete, then the installs start) or ordered (per memory node, the log and the
    /// installs as one ordered WR list on one QP, which RC lands in order: one round
    /// trip less).
    #[arg(long, value_enum, default_value_t = LogPlacementArg::RoundBefore)]
    #[serde(default)]
    pub log_placement: LogPlacementArg,
    /// With --replicas above 1: how a commit reaches the copies: coalesced (every copy
    /// in one round, Motor's one-round commit and FORD's coalescent commit) or
    /// separate (the backups' round, then the primaries': FaRMv2's two commit rounds,
    /// the baseline Motor compares against).
    #[arg(long, value_enum, default_value_t = ReplicaCommitArg::Coalesced)]
    #[serde(default)]
    pub replica_commit: ReplicaCommitArg,
    /// With --replicas above 1, under occ-cas (FORD): read-only transactions READ each
    /// object from one of its partition's backups and validate it there (FORD's
    /// backup-enabled read), offloading the primaries. Read-write transactions still read
    /// the primaries (a backup shows no writer's lock: validating there lets write skew
    /// commit). The other protocols ignore it.
    #[arg(long)]
    #[serde(default)]
    pub ford_backup_reads: bool,
    /// Lotus's hybrid routing (Lotus 4.3) with coordinator processes (--cnodes 2 or
    /// more): none (a transaction runs where it was drawn); forward (a read-write
    /// transaction whose first record's lock shard another compute node owns is sent
    /// there by RPC and run by that node's home coroutines, so that those locks are
    /// local CPU CASes; the table times it from its arrival there, a `forwarded:` line
    /// from generation); or ideal (each coordinator draws read-write transactions on
    /// its own node's shards: no hop, and every compute node gets an equal share of the
    /// work whatever the skew, an upper bound; TPC-C home warehouses among the owned
    /// ones). Read-only transactions run where drawn. Other protocols ignore it. With
    /// --protocol all, forward or ideal brings lotus into the runs (none leaves it out
    /// with coordinator processes).
    #[arg(long, value_enum, default_value_t = crate::routing::Routing::None)]
    #[serde(default)]
    pub routing: crate::routing::Routing,
    /// Lotus with coordinator processes (--cnodes 2 or more): where a compute node
    /// serves the other compute nodes' lock RPCs (and its lock service's other RPCs:
    /// forwarding, resharding, recovery). coordinator (as Lotus 4.1): the coordinator
    /// threads are the service's RPC server threads and poll its handlers between their
    /// transaction coroutines, no thread of its own; thread: a server thread of the
    /// service's own beside the coordinator threads (it sleeps up to 100 us when idle).
    /// The header and each compute node's thread count in the report say which. Compare
    /// both in one invocation with --sweep lock-serving=coordinator,thread. Other
    /// protocols ignore it.
    #[arg(long, value_enum, default_value_t = crate::lotus_cn::LockServing::Coordinator)]
    #[serde(default)]
    pub lock_serving: crate::lotus_cn::LockServing,
    /// Lotus with coordinator processes (--cnodes 2 or more): this many seconds into the
    /// measured run (after --warmup), move the first half of compute node 0's lock shards to compute node 1, as
    /// Lotus 4.3's resharding would (drain the range, then install the next map on
    /// every node; the source's version table cache drops the range's entries first).
    /// A drain not done within 10 ms is cancelled and tried again. Prints `reshard:`
    /// with the pause.
    #[arg(long, value_name = "SECONDS")]
    #[serde(default)]
    pub reshard_after: Option<f64>,
    /// With --reshard-after: this many seconds into the measured run (later than
    /// --reshard-after), move the same range back from compute node 1 to compute node 0
    /// (drained and published as the first move; compute node 1's version table cache
    /// drops the range). Compute node 0's cache then serves that range again, while the
    /// writes compute node 1 granted in between never reached its grant hook. Prints a
    /// second `reshard:` line.
    #[arg(long, value_name = "SECONDS")]
    #[serde(default)]
    pub reshard_back_after: Option<f64>,
    /// Plant a bug on purpose, to show that the run's checks catch it. Only a test build
    /// (txn's `fault-injection` feature) accepts it; any other build refuses it.
    #[arg(long, value_enum, value_name = "BUG")]
    #[serde(default)]
    pub plant: Option<Plant>,
    /// Lotus with coordinator processes (--cnodes 2 or more): run Lotus 4.3's resharding
    /// loop over the compute nodes' lock services for the whole run: every 100 ms each
    /// node's load sample (its lock latency and requests per shard); a node whose latency
    /// stays above 1.5x the average for three intervals passes a range around its hottest
    /// shard to the coolest node (drain, then the next map everywhere; the source's
    /// version table cache drops the range). Prints each move and a `reshard loop:`
    /// summary.
    #[arg(long)]
    #[serde(default)]
    pub reshard_loop: bool,
    /// With --cnodes 2 or more: the lease of each coordinator process in etcd, in
    /// milliseconds (rounded up to whole seconds, at least 1 s). A process that cannot
    /// renew it for this long (stopped, or starved on an emulated machine) is declared
    /// dead, fenced and recovered.
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    #[serde(default = "default_lease_ms")]
    pub lease_ms: u64,
    /// Fault injection: SIGKILL the timestamp oracle this many seconds into each
    /// measured run (after --warmup) and restart it with the same state directory and address after
    /// `--tso-down-ms`. Coordinators wait for it and switch to its new epoch; the run
    /// passes only if commits continue after the restart (reported as `tso restart`).
    /// With --hosts, on the oracle's host, through ssh.
    #[arg(long, value_name = "SECONDS")]
    pub kill_tso_after: Option<f64>,
    /// Fault injection (protocols with a lock service: scythe): SIGKILL the lock
    /// service this many seconds into each measured run (after --warmup) and restart it with the same
    /// state directory and address after `--lockd-down-ms`. Its new epoch refuses the
    /// old tickets, and it grants nothing for its restart grace (1 s), longer than the
    /// coordinators' ticket lease, so no holder of an old ticket still writes when a
    /// lock is granted anew. Coordinators reconnect; the run passes only if commits
    /// continue after the restart (reported as `lockd restart`). With --hosts, on the
    /// lock service's host, through ssh.
    #[arg(long, value_name = "SECONDS")]
    pub kill_lockd_after: Option<f64>,
    /// Fault injection: every coordinator thread moves its one-sided QPs to memory node 0
    /// to the error state every this many milliseconds, as a flapping link would. Their
    /// outstanding operations fail; the thread's QP pool connects new QPs, and the
    /// coordinators retry reads, installs, locks and unlocks on them
    /// (`txn::transient`), so no lock stays held and no commit stays half done. The
    /// report counts the injections and retries (`transport faults:`).
    #[arg(long, value_name = "MS")]
    pub qp_errors_ms: Option<u64>,
    /// With `--kill-lockd-after`: milliseconds the lock service stays down before its
    /// restart.
    #[arg(long, default_value_t = 300, value_name = "MS")]
    pub lockd_down_ms: u64,
    /// Count committed transactions per interval of this many milliseconds (1 to 1000),
    /// per coordinator process; print the timeline after the run and put it in the JSON
    /// report, with, when a fault flag fired, the first interval after the fault whose
    /// throughput reached 90% of the surviving coordinators' pre-fault share.
    #[arg(long, value_name = "MS")]
    pub timeline_ms: Option<u64>,
    /// Write the run's history to this file as JSON Lines, one committed transaction a
    /// line: `{"cnode":I,"incarnation":K,"type":"...","start_ns":..,"end_ns":..,
    /// "reads":[[table,key,version],...],"writes":[[table,key,version],...]}` (times in
    /// CLOCK_MONOTONIC ns; MVCC adds `"ts":[start,commit]`). One run only.
    #[arg(long, value_name = "PATH")]
    pub history_out: Option<PathBuf>,
    /// Run the coordinators in this many coordinator processes (`cnode`, each with
    /// --threads threads of --coroutines coordinators, its own node id), started after
    /// the cluster is up and merged into one report; 1 runs them inside txn-bench.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub cnodes: usize,
    /// Fault injection: SIGKILL coordinator process --cn this many seconds into the
    /// measured run, after --warmup (--cnodes 2 or more, or 1 with --restart: the
    /// coordinators then run as a process of their own); what it streamed before is
    /// kept. A surviving coordinator process
    /// recovers it (txn-bench when none survives).
    #[arg(long, value_name = "SECONDS")]
    pub kill_cn_after: Option<f64>,
    /// With --kill-cn-after: start a new coordinator process with the same node id and
    /// the next incarnation right after the kill (under lotus its lock table serves once
    /// every survivor confirmed, Lotus 6). With --kill-memnode-after: once the
    /// failover is done, start the memory node again, empty, and re-replicate onto it:
    /// each partition it hosts an image of is copied back from its primary (bulk READs
    /// and WRITEs) while commits touching that partition wait, one partition at a time,
    /// restoring --replicas copies (`re-replicated:` lines).
    #[arg(long)]
    pub restart: bool,
    /// Fault injection (--cnodes 2 or more): SIGSTOP coordinator process --cn this many
    /// seconds into the measured run (after --warmup), SIGCONT it --stop-ms later.
    #[arg(long, value_name = "SECONDS")]
    pub stop_cn_after: Option<f64>,
    /// With --stop-cn-after or --stop-memnode-after: milliseconds the process stays
    /// stopped.
    #[arg(long, default_value_t = 300, value_name = "MS")]
    pub stop_ms: u64,
    /// The coordinator process the fault flags hit, 0 to --cnodes - 1 (default: the
    /// last).
    #[arg(long, value_name = "I")]
    pub cn: Option<usize>,
    /// Fault injection: SIGKILL memory node --memnode this many seconds into each
    /// measured run (after --warmup).
    /// With --replicas 2 or more txn-bench fails it over as the view manager: it waits
    /// until no transaction that began before is left on the partitions the node held
    /// the primary of (new ones abort as replica-failed meanwhile), promotes their first
    /// live backups, and publishes the new view (in etcd, and to the coordinators);
    /// installs count the live copies. With one copy the run stops, naming the lost
    /// partition. With --cnodes 2 or more, the coordinator processes follow the views
    /// through etcd and each answers the drains.
    #[arg(long, value_name = "SECONDS")]
    pub kill_memnode_after: Option<f64>,
    /// The memory node --kill-memnode-after kills (or --stop-memnode-after stops), 0 to
    /// --memnodes - 1.
    #[arg(long, default_value_t = 0, value_name = "I")]
    #[serde(default)]
    pub memnode: u32,
    /// Fault injection (coordinators inside txn-bench): SIGSTOP memory node --memnode
    /// this many seconds into the measured run (after --warmup), SIGCONT it --stop-ms
    /// later. Its CPU serves nothing meanwhile: with Scythe's locks on the memory nodes,
    /// Lock RPCs to it wait, time out after the runtime's call timeout and are retried
    /// (requests given up on are abandoned at the service once it runs again); the run
    /// goes on after SIGCONT and every check holds. Prints `memnode stop:` lines.
    #[arg(long, value_name = "SECONDS")]
    #[serde(default)]
    pub stop_memnode_after: Option<f64>,
    /// With `--kill-tso-after`: milliseconds the oracle stays down before its restart.
    #[arg(long, default_value_t = 300, value_name = "MS")]
    pub tso_down_ms: u64,
    /// Fault injection: SIGKILL the membership service (the local etcd, which holds the
    /// replica view) this many seconds into each measured run (after --warmup) and start it again from its data
    /// directory on the same ports after --etcd-down-ms. The run passes only if the
    /// view read back after the restart is the one published before it, the view stored
    /// at the end is the last one published (epochs never go back: each store checks
    /// the stored epoch first), and commits continue (reported as `view service`).
    /// Goes with --kill-memnode-after (which runs etcd and the view manager).
    #[arg(long, value_name = "SECONDS")]
    #[serde(default)]
    pub kill_etcd_after: Option<f64>,
    /// With --kill-etcd-after: milliseconds etcd stays down before its restart.
    #[arg(long, default_value_t = 200, value_name = "MS")]
    #[serde(default = "default_etcd_down_ms")]
    pub etcd_down_ms: u64,
    /// History memory for the checks, MiB over all threads of a run; past it, later
    /// commits are not recorded and the check says it was partial. The check itself
    /// needs about 3.5x this at its peak.
    #[arg(long, default_value_t = 2048, value_name = "MIB")]
    pub check_memory_mb: usize,
    /// Each coroutine runs one transaction of every type (in the report's order) before
    /// the standard mix, so that a short run on a slow machine still commits every type
    /// (a run that does not fails its coverage check).
    #[arg(long)]
    pub each_type_first: bool,
}

/// The `--protocol` flag: one protocol, or all of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProtocolArg {
    /// One protocol named with its isolation (`mvcc-sr`, `mvcc-si`) or without one.
    One(Protocol),
    /// `mvcc`: MVCC at the isolation of `--isolation`.
    Mvcc,
    /// `lotus`: Lotus at the isolation of `--isolation`.
    Lotus,
    /// `occ-cas`, `scythe`, `mvcc` and `lotus` (the last two at `--isolation`), one
    /// after another.
    All,
}

impl FromStr for ProtocolArg {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "all" => Ok(Self::All),
            "mvcc" => Ok(Self::Mvcc),
            "lotus" => Ok(Self::Lotus),
            _ => s.parse::<Protocol>().map(Self::One).map_err(|_| {
                format!(
                    "unknown protocol {s:?}: occ-cas, scythe, mvcc (mvcc-sr), mvcc-si, lotus \
                     (lotus-sr), lotus-si or all"
                )
            }),
        }
    }
}

impl fmt::Display for ProtocolArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::One(p) => write!(f, "{p}"),
            Self::Mvcc => f.write_str("mvcc"),
            Self::Lotus => f.write_str("lotus"),
            Self::All => f.write_str("all"),
        }
    }
}

/// Serde of a flag value through its `Display` and `FromStr` (the flag's spelling).
mod as_str {
    use std::fmt::Display;
    use std::str::FromStr;

    pub fn serialize<T: Display, S: serde::Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }

    pub fn deserialize<'de, T, D>(d: D) -> Result<T, D::Error>
    where
        T: FromStr<Err = String>,
        D: serde::Deserializer<'de>,
    {
        let s: String = serde::Deserialize::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// [`as_str`] of an optional flag value.
mod opt_str {
    use std::fmt::Display;
    use std::str::FromStr;

    pub fn serialize<T: Display, S: serde::Serializer>(
        v: &Option<T>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.collect_str(v),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, T, D>(d: D) -> Result<Option<T>, D::Error>
    where
        T: FromStr<Err = String>,
        D: serde::Deserializer<'de>,
    {
        let s: Option<String> = serde::Deserialize::deserialize(d)?;
        s.map(|s| s.parse().map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// The `--plant` flag: a bug planted on purpose (test builds only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Plant {
    /// Lotus: the lost-range hook of a compute node's lock table leaves the moved
    /// range's version table cache entries in place (the spec's A.3 item 6 undone).
    /// Needs --reshard-after; with --reshard-back-after the kept entries are stale when
    /// the range comes back.
    SkipCacheClear,
    /// ycsb-e: every range-index scan drops its second key, missing a record that is
    /// there (the scan check must fail the run).
    DropScanEntries,
}

impl Plant {
    /// Whether this process may run planted bugs: only a build with txn's
    /// `fault-injection` feature (the test builds) can.
    pub fn allowed() -> bool {
        txn::FAULT_INJECTION
    }
}

/// The `--isolation` flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
pub enum IsolationArg {
    /// Serializability.
    Sr,
    /// Snapshot isolation.
    Si,
}

/// The `--sweep` flag: a parameter and its points.
#[derive(Clone, Debug, PartialEq)]
pub enum Sweep {
    /// Zipf theta values.
    Theta(Vec<f64>),
    /// Coroutines per thread.
    Clients(Vec<usize>),
    /// Commit logs off, on (a round before the installs) or ordered (in the installs'
    /// round; `--commit-log`, `--log-placement`; coordinators inside txn-bench only):
    /// what the logs cost on the happy path, side by side.
    CommitLog(Vec<LogSetting>),
    /// Lotus's version table cache capacity, entries (0 = off; `--vtc-entries`).
    VtcEntries(Vec<usize>),
    /// Where Lotus's compute nodes serve lock RPCs (`--lock-serving`).
    LockServing(Vec<crate::lotus_cn::LockServing>),
    /// TPC-C without and with range scans (`--range-index`).
    RangeIndex(Vec<bool>),
    /// Copies of every partition (`--replicas`): what replication costs, side by side
    /// (Motor 5.3, 7.2: 3-way against 1-way).
    Replicas(Vec<u32>),
    /// The cap of the retry backoff after a conflict abort, microseconds
    /// (`--max-backoff-us`).
    MaxBackoffUs(Vec<u64>),
    /// Where Scythe's Takeout Locks live (`--lock-placement`): a lockd node or the
    /// memory nodes, side by side.
    LockPlacement(Vec<LockPlacementArg>),
}

/// A sweep's points that count something (`what`), each at least 1; the error names
/// `--sweep <param>` and the value.
fn counts<T: FromStr + PartialOrd + From<u8>>(
    values: &[&str],
    param: &str,
    what: &str,
) -> Result<Vec<T>, String> {
    values
        .iter()
        .map(|v| match v.parse::<T>() {
            Ok(n) if n >= T::from(1) => Ok(n),
            _ => Err(format!(
                "--sweep {param}: {v:?} is not a number of {what} (>= 1)"
            )),
        })
        .collect()
}

impl FromStr for Sweep {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let Some((param, values)) = s.split_once('=') else {
            return Err(format!(
                "--sweep {s:?}: expected theta=V1,V2,..., clients=N1,N2,..., commit-log=off,on,ordered, vtc-entries=N1,N2,..., lock-serving=coordinator,thread, range-index=off,on, replicas=1,3 or max-backoff-us=100,1000"
            ));
        };
        let values: Vec<&str> = values.split(',').map(str::trim).collect();
        if values.iter().any(|v| v.is_empty()) {
            return Err(format!("--sweep {s:?}: empty value in the list"));
        }
        match param.trim() {
            "theta" => values
                .iter()
                .map(|v| match v.parse::<f64>() {
                    Ok(t) if t >= 0.0 && t.is_finite() => Ok(t),
                    _ => Err(format!(
                        "--sweep theta: {v:?} is not a Zipf theta (a number >= 0)"
                    )),
                })
                .collect::<Result<_, _>>()
                .map(Self::Theta),
            "clients" => counts(&values, "clients", "coroutines per thread").map(Self::Clients),
            "commit-log" => values
                .iter()
                .map(|v| match *v {
                    "off" | "false" => Ok(LogSetting::Off),
                    "on" | "true" => Ok(LogSetting::RoundBefore),
                    "ordered" => Ok(LogSetting::Ordered),
                    _ => Err(format!(
                        "--sweep commit-log: {v:?} is not off, on or ordered"
                    )),
                })
                .collect::<Result<_, _>>()
                .map(Self::CommitLog),
            "vtc-entries" => values
                .iter()
                .map(|v| {
                    v.parse::<usize>().map_err(|_| {
                        format!("--sweep vtc-entries: {v:?} is not a number of entries (0 = off)")
                    })
                })
                .collect::<Result<_, _>>()
                .map(Self::VtcEntries),
            "lock-serving" => values
                .iter()
                .map(|v| v.parse().map_err(|e| format!("--sweep {e}")))
                .collect::<Result<_, _>>()
                .map(Self::LockServing),
            "range-index" => values
                .iter()
                .map(|v| match *v {
                    "off" | "false" => Ok(false),
                    "on" | "true" => Ok(true),
                    _ => Err(format!("--sweep range-index: {v:?} is not off or on")),
                })
                .collect::<Result<_, _>>()
                .map(Self::RangeIndex),
            "replicas" => counts(&values, "replicas", "copies per partition").map(Self::Replicas),
            "max-backoff-us" => values
                .iter()
                .map(|v| {
                    v.parse::<u64>().map_err(|_| {
                        format!(
                            "--sweep max-backoff-us: {v:?} is not a number of microseconds (0 retries at once)"
                        )
                    })
                })
                .collect::<Result<_, _>>()
                .map(Self::MaxBackoffUs),
            "lock-placement" => values
                .iter()
                .map(|v| {
                    LockPlacementArg::from_str(v, true).map_err(|_| {
                        format!("--sweep lock-placement: {v:?} is not lockd or memnode")
                    })
                })
                .collect::<Result<_, _>>()
                .map(Self::LockPlacement),
            p => Err(format!(
                "--sweep: unknown parameter {p:?}: theta, clients, commit-log, vtc-entries, lock-serving, range-index, replicas, max-backoff-us or lock-placement"
            )),
        }
    }
}

impl fmt::Display for Sweep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let join = |v: Vec<String>| v.join(",");
        match self {
            Self::Theta(v) => write!(f, "theta={}", join(v.iter().map(f64::to_string).collect())),
            Self::Clients(v) => write!(
                f,
                "clients={}",
                join(v.iter().map(usize::to_string).collect())
            ),
            Self::CommitLog(v) => write!(
                f,
                "commit-log={}",
                join(v.iter().map(|l| l.name().to_string()).collect())
            ),
            Self::VtcEntries(v) => write!(
                f,
                "vtc-entries={}",
                join(v.iter().map(usize::to_string).collect())
            ),
            Self::LockServing(v) => write!(
                f,
                "lock-serving={}",
                join(v.iter().map(|l| l.name().to_string()).collect())
            ),
            Self::Replicas(v) => write!(
                f,
                "replicas={}",
                join(v.iter().map(u32::to_string).collect())
            ),
            Self::MaxBackoffUs(v) => write!(
                f,
                "max-backoff-us={}",
                join(v.iter().map(u64::to_string).collect())
            ),
            Self::LockPlacement(v) => write!(
                f,
                "lock-placement={}",
                join(v.iter().map(|l| l.name().to_string()).collect())
            ),
            Self::RangeIndex(v) => write!(
                f,
                "range-index={}",
                join(
                    v.iter()
                        .map(|&on| if on { "on" } else { "off" }.to_string())
                        .collect()
                )
            ),
        }
    }
}

/// One point of a run plan: the workload parameters a sweep varies.
#[derive(Clone, Debug)]
pub(crate) struct Point {
    /// Zipf theta at this point.
    pub(crate) theta: f64,
    /// Coroutines per thread at this point.
    pub(crate) coroutines: usize,
    /// Commit logs at this point (`None`: as `--commit-log` and `--log-placement` say).
    pub(crate) commit_log: Option<LogSetting>,
    /// Lotus's version table cache entries at this point (0 = off).
    pub(crate) vtc_entries: usize,
    /// Lotus's routing at this point (`None`: as `--routing` says).
    pub(crate) routing: Option<crate::routing::Routing>,
    /// Where Lotus's compute nodes serve lock RPCs at this point (`None`: as
    /// `--lock-serving` says).
    pub(crate) lock_serving: Option<crate::lotus_cn::LockServing>,
    /// `theta=0.5`, `clients=16`, `commit-log=on`; `None` without a sweep.
    pub(crate) label: Option<String>,
    /// TPC-C's range scans at this point (`None`: as `--range-index` says).
    pub(crate) range_index: Option<bool>,
    /// Copies of every partition at this point (`None`: as `--replicas` says).
    pub(crate) replicas: Option<u32>,
    /// The retry backoff's cap at this point, microseconds (`None`: as
    /// `--max-backoff-us` says).
    pub(crate) max_backoff_us: Option<u64>,
    /// Where Scythe's locks live at this point (`None`: as `--lock-placement` says).
    pub(crate) lock_placement: Option<LockPlacementArg>,
}

impl Point {
    /// `args` with the flags this point sets (`--range-index`, `--replicas`,
    /// `--max-backoff-us`, `--lock-placement`), or `None` when it sets none of them.
    pub(crate) fn args(&self, args: &Args) -> Option<Args> {
        (self.range_index.is_some()
            || self.replicas.is_some()
            || self.max_backoff_us.is_some()
            || self.lock_placement.is_some())
        .then(|| Args {
            range_index: self.range_index.unwrap_or(args.range_index),
            replicas: self.replicas.unwrap_or(args.replicas),
            max_backoff_us: self.max_backoff_us.unwrap_or(args.max_backoff_us),
            lock_placement: self.lock_placement.unwrap_or(args.lock_placement),
            ..args.clone()
        })
    }
}

/// Commit logs at a point of `--sweep commit-log=...`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogSetting {
    /// No commit log.
    Off,
    /// Logs a round before the installs ([`txn::config::LogPlacement::RoundBefore`]).
    RoundBefore,
    /// Logs in the installs' round, ahead of them on each memory node's QP
    /// ([`txn::config::LogPlacement::Ordered`]).
    Ordered,
}

impl LogSetting {
    /// Set `cfg`'s commit log as this point says.
    pub fn apply(self, cfg: &mut txn::coordinator::TxnConfig) {
        use txn::config::LogPlacement;
        (cfg.commit_log, cfg.log_placement) = match self {
            Self::Off => (false, cfg.log_placement),
            Self::RoundBefore => (true, LogPlacement::RoundBefore),
            Self::Ordered => (true, LogPlacement::Ordered),
        };
    }

    /// As the sweep names it: `off`, `on`, `ordered`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::RoundBefore => "on",
            Self::Ordered => "ordered",
        }
    }
}

/// The `--log-placement` flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize, Default)]
pub enum LogPlacementArg {
    /// The log WRITEs complete, then the installs start (one round trip more).
    #[default]
    RoundBefore,
    /// Per memory node, the log WRITE and the installs as one ordered WR list.
    Ordered,
}

impl From<LogPlacementArg> for txn::config::LogPlacement {
    fn from(a: LogPlacementArg) -> Self {
        match a {
            LogPlacementArg::RoundBefore => Self::RoundBefore,
            LogPlacementArg::Ordered => Self::Ordered,
        }
    }
}

/// The `--lock-placement` flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum LockPlacementArg {
    /// Memnode where it applies, else lockd ([`Args::locks_on_memnodes`]).
    #[default]
    Auto,
    /// One lockd node holds every lock.
    Lockd,
    /// Each memory node serves its partition's locks.
    Memnode,
}

impl LockPlacementArg {
    /// The flag's value: `auto`, `lockd` or `memnode`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Lockd => "lockd",
            Self::Memnode => "memnode",
        }
    }
}

/// The `--replica-commit` flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize, Default)]
pub enum ReplicaCommitArg {
    /// Every copy in one round.
    #[default]
    Coalesced,
    /// The backups' round, then the primaries'.
    Separate,
}

impl From<ReplicaCommitArg> for txn::config::ReplicaCommit {
    fn from(a: ReplicaCommitArg) -> Self {
        match a {
            ReplicaCommitArg::Coalesced => Self::Coalesced,
            ReplicaCommitArg::Separate => Self::Separate,
        }
    }
}

/// txn-bench's defaults for the shared flags: 10 s runs.
const DEFAULTS: &[(&str, &str)] = &[("duration", "10s")];

impl Args {
    /// Parse `argv` (program name first) after expanding `--config FILE.toml` into
    /// flags placed before the command line's own, so that the command line wins.
    ///
    /// Errors: clap's (bad flags, `--help`, `--version`: print them with
    /// `clap::Error::exit`), a file that cannot be read or parsed, or a key whose value
    /// is not a string, number or boolean.
    pub fn parse_with_config<I, T>(argv: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        crate::config_file::parse_with_config::<Self, _, _>(argv, DEFAULTS).map(|mut args| {
            args.run.normalize();
            args
        })
    }

    /// The fabric (`--fabric`, or the topology file's with `--hosts`).
    pub fn fabric(&self) -> FabricKind {
        self.fabric_args.fabric
    }

    /// The timing model's name or profile path ([`crate::cli::FabricArgs::model`]:
    /// `--model`, else `$RRPC_MODEL` on shm, else cx5 on shm and none on verbs); after
    /// [`crate::txnbench::run`] resolved it, the model chosen then.
    pub fn model(&self) -> String {
        self.fabric_args.model().unwrap_or_else(|_| "none".into())
    }

    /// The coordinators' runtime settings ([`Args::rpc`]'s, else the defaults).
    pub fn runtime(&self) -> rrpc::runtime::RuntimeConfig {
        self.rpc
            .as_ref()
            .map(|r| r.runtime.clone())
            .unwrap_or_default()
    }

    /// The measured time of each run, seconds.
    pub fn duration(&self) -> f64 {
        self.run.secs()
    }

    /// TPC-C warehouses: `--warehouses`, else one per coordinator thread.
    pub(crate) fn warehouses(&self) -> u16 {
        self.warehouses
            .unwrap_or_else(|| self.threads.unwrap_or(1).clamp(1, usize::from(u16::MAX)) as u16)
    }

    /// Whether Scythe's locks live on the memory nodes in this run (`--lock-placement`,
    /// with auto resolved: memnode unless --replicas is above 1, --kill-lockd-after is
    /// given or --hosts places the services).
    pub fn locks_on_memnodes(&self) -> bool {
        match self.lock_placement {
            LockPlacementArg::Memnode => true,
            LockPlacementArg::Lockd => false,
            LockPlacementArg::Auto => {
                self.replicas <= 1 && self.kill_lockd_after.is_none() && self.hosts.is_none()
            }
        }
    }

    /// Check the flags every workload shares (the workload's own are checked by its
    /// constructor, [`workload::spec`]); `threads` must be resolved. Errors: the first
    /// flag out of range, by name.
    pub(crate) fn validate(&self) -> anyhow::Result<()> {
        if self.threads == Some(0) || self.coroutines == 0 {
            bail!("--threads and --coroutines must be at least 1");
        }
        if self.run.duration().is_zero() {
            bail!("--duration must be more than 0");
        }
        if !(1..=MAX_MEMNODES).contains(&self.memnodes) {
            bail!(
                "--memnodes must be 1 to {MAX_MEMNODES} (got {})",
                self.memnodes
            );
        }
        if !(1..=self.memnodes).contains(&self.replicas) {
            bail!(
                "--replicas must be 1 to --memnodes ({}), each copy of a partition on \
                 another memory node (got {})",
                self.memnodes,
                self.replicas
            );
        }
        let memnode_locks = self.lock_placement == LockPlacementArg::Memnode
            || matches!(&self.sweep, Some(Sweep::LockPlacement(v)) if v.contains(&LockPlacementArg::Memnode));
        if matches!(&self.sweep, Some(Sweep::LockPlacement(v)) if v.contains(&LockPlacementArg::Auto))
        {
            bail!("--sweep lock-placement compares lockd and memnode: name them, not auto");
        }
        if memnode_locks && self.replicas > 1 {
            bail!(
                "--lock-placement memnode with --replicas above 1: a partition's locks stay on \
                 its memory node and would not follow its primary to a backup at a failover; \
                 keep them on a lockd node (--lock-placement lockd)"
            );
        }
        if memnode_locks && self.kill_lockd_after.is_some() {
            bail!(
                "--kill-lockd-after with --lock-placement memnode: no lockd node runs; the \
                 locks die and restart with their memory node (--kill-memnode-after)"
            );
        }
        if self.replica_commit == ReplicaCommitArg::Separate
            && self.log_placement == LogPlacementArg::Ordered
        {
            bail!(
                "--replica-commit separate with --log-placement ordered: the ordered lists \
                 put a memory node's log and installs in one round; use round-before"
            );
        }
        if !(1..=64).contains(&self.versions) {
            bail!("--versions must be 1 to 64 (got {})", self.versions);
        }
        if self
            .kill_tso_after
            .is_some_and(|k| !(k >= 0.0 && k < self.duration()))
        {
            bail!("--kill-tso-after must lie within the run (0 <= SECONDS < --duration)");
        }
        if self.timeline_ms.is_some_and(|ms| !(1..=1000).contains(&ms)) {
            bail!("--timeline-ms must be 1 to 1000");
        }
        if !(1..=20).contains(&self.rounds) {
            bail!("--rounds must be 1 to 20");
        }
        if self.ablation {
            if self.cnodes < 2 {
                bail!(
                    "--ablation compares Lotus's routing across compute nodes: it needs --cnodes 2 or more"
                );
            }
            if self.sweep.is_some() || self.unsafe_no_cas || self.fig3_premise {
                bail!("--ablation is a run plan of its own: not with --sweep, --unsafe-no-cas or --fig3-premise");
            }
            if self.protocol != ProtocolArg::One(Protocol::Scythe) {
                bail!(
                    "--ablation chooses its protocols (mvcc, then lotus): drop --protocol {}",
                    self.protocol
                );
            }
        }
        if self.unsafe_no_cas && self.fig3_premise {
            bail!("--fig3-premise runs the --unsafe-no-cas variant itself: give one of them");
        }
        if (self.unsafe_no_cas || self.fig3_premise) && self.history_out.is_some() {
            bail!("--history-out needs a checked run: not with --unsafe-no-cas or --fig3-premise");
        }
        if self.history_out.is_some() && self.no_check {
            bail!("--history-out needs the recorded history: drop --no-check");
        }
        if !(1..=MAX_CNODES).contains(&self.cnodes) {
            bail!("--cnodes must be 1 to {MAX_CNODES} (got {})", self.cnodes);
        }
        let within = |s: Option<f64>| s.is_some_and(|k| !(k >= 0.0 && k < self.duration()));
        if self
            .qp_errors_ms
            .is_some_and(|ms| !(1..=60_000).contains(&ms))
        {
            bail!("--qp-errors-ms must be 1 to 60000");
        }
        if within(self.kill_lockd_after) {
            bail!("--kill-lockd-after must lie within the run (0 <= SECONDS < --duration)");
        }
        for (flag, at) in [
            ("--kill-cn-after", self.kill_cn_after),
            ("--stop-cn-after", self.stop_cn_after),
        ] {
            // One coordinator process killed and restarted is a run too (the launcher
            // recovers it: no other survives); one stopped, or killed for good, leaves
            // nothing running.
            let restarted = flag == "--kill-cn-after" && self.restart;
            if at.is_some() && self.cnodes < 2 && !restarted {
                bail!("{flag} needs --cnodes 2 or more (the others keep running), or --restart");
            }
            if within(at) {
                bail!("{flag} must lie within the run (0 <= SECONDS < --duration)");
            }
        }
        if self.dry_run && self.hosts.is_none() {
            bail!("--dry-run goes with --hosts");
        }
        if within(self.kill_etcd_after) {
            bail!("--kill-etcd-after must lie within the run (0 <= SECONDS < --duration)");
        }
        if self.kill_etcd_after.is_some() && self.kill_memnode_after.is_none() {
            bail!(
                "--kill-etcd-after goes with --kill-memnode-after (etcd holds the replica view \
                 its failover stores)"
            );
        }
        if within(self.kill_memnode_after) {
            bail!("--kill-memnode-after must lie within the run (0 <= SECONDS < --duration)");
        }
        if self.kill_memnode_after.is_some()
            && (self.kill_cn_after.is_some() || self.stop_cn_after.is_some())
        {
            bail!(
                "--kill-memnode-after does not combine with --kill-cn-after or --stop-cn-after \
                 (the failover's drain waits for every coordinator process)"
            );
        }
        if self.stop_memnode_after.is_some() {
            if within(self.stop_memnode_after) {
                bail!("--stop-memnode-after must lie within the run (0 <= SECONDS < --duration)");
            }
            if self.coordinator_processes() || self.kill_memnode_after.is_some() {
                bail!(
                    "--stop-memnode-after runs with the coordinators inside txn-bench and \
                     without --kill-memnode-after"
                );
            }
            if self.stop_ms == 0 {
                bail!("--stop-ms must be at least 1");
            }
        }
        if self.memnode >= self.memnodes {
            bail!(
                "--memnode {} must be below --memnodes {}",
                self.memnode,
                self.memnodes
            );
        }
        let range_index_somewhere = self.uses_range_index()
            || matches!(&self.sweep, Some(Sweep::RangeIndex(points)) if points.contains(&true));
        if self.kill_memnode_after.is_some() && self.memnode == 0 && range_index_somewhere {
            bail!(
                "--kill-memnode-after would kill memory node 0, which alone holds the range \
                 index (its B-link tree is not replicated): kill another with --memnode 1 or \
                 more (and --memnodes 2 or more), or run without the range index"
            );
        }
        if self.reshard_loop {
            if self.cnodes < 2 {
                bail!("--reshard-loop moves shards between compute nodes: it needs --cnodes 2 or more");
            }
            if !matches!(
                self.protocol,
                ProtocolArg::Lotus | ProtocolArg::One(Protocol::Lotus(_))
            ) {
                bail!(
                    "--reshard-loop moves Lotus lock shards: it needs --protocol lotus or lotus-si"
                );
            }
            if self.kill_cn_after.is_some()
                || self.stop_cn_after.is_some()
                || self.kill_memnode_after.is_some()
                || self.reshard_after.is_some()
            {
                bail!("--reshard-loop does not combine with the fault flags or --reshard-after");
            }
        }
        if let Some(s) = self.reshard_after {
            if !(s >= 0.0 && s < self.duration()) {
                bail!("--reshard-after must lie within the run (0 <= SECONDS < --duration)");
            }
            if self.cnodes < 2 {
                bail!("--reshard-after moves shards between compute nodes: it needs --cnodes 2 or more");
            }
            if !matches!(
                self.protocol,
                ProtocolArg::Lotus | ProtocolArg::One(Protocol::Lotus(_))
            ) {
                bail!("--reshard-after moves Lotus lock shards: it needs --protocol lotus or lotus-si");
            }
            if self.kill_cn_after.is_some()
                || self.stop_cn_after.is_some()
                || self.kill_memnode_after.is_some()
            {
                bail!("--reshard-after does not combine with the other fault flags");
            }
        }
        if let Some(b) = self.reshard_back_after {
            let Some(s) = self.reshard_after else {
                bail!("--reshard-back-after moves back the range --reshard-after moved: give both");
            };
            if !(b > s && b < self.duration()) {
                bail!(
                    "--reshard-back-after must lie after --reshard-after and within the run \
                     ({s} < SECONDS < --duration)"
                );
            }
        }
        if matches!(self.sweep, Some(Sweep::RangeIndex(_))) && self.workload != Workload::Tpcc {
            bail!(
                "--sweep range-index compares TPC-C's cursor rows with range scans: it needs \
                 --workload tpcc"
            );
        }
        if self.range_index && !matches!(self.workload, Workload::Tpcc | Workload::YcsbE) {
            bail!(
                "--range-index applies to tpcc (ycsb-e always scans through the index), not {}",
                self.workload
            );
        }
        if let Some(p) = self.plant {
            if !Plant::allowed() {
                bail!(
                    "--plant {}: planted bugs exist only in test builds (txn's fault-injection \
                     feature); this binary was built without them",
                    p.to_possible_value()
                        .map_or_else(String::new, |v| v.get_name().to_string())
                );
            }
            match p {
                Plant::DropScanEntries => {
                    if !self.workload.needs_range_index() {
                        bail!("--plant drop-scan-entries acts on range scans: it needs --workload ycsb-e");
                    }
                }
                Plant::SkipCacheClear => {
                    if self.reshard_after.is_none() {
                        bail!(
                            "--plant skip-cache-clear acts when a resharding move takes a range \
                             away: it needs --reshard-after"
                        );
                    }
                    if self.vtc_entries == 0 {
                        bail!(
                            "--plant skip-cache-clear needs the version table cache \
                             (--vtc-entries above 0)"
                        );
                    }
                }
            }
        }
        if self.routing != crate::routing::Routing::None && self.cnodes < 2 {
            bail!(
                "--routing {} routes between compute nodes: it needs --cnodes 2 or more (one \
                 process holds every shard)",
                self.routing.name()
            );
        }
        if self.routing == crate::routing::Routing::Forward
            && (self.kill_cn_after.is_some()
                || self.stop_cn_after.is_some()
                || self.kill_memnode_after.is_some())
        {
            bail!(
                "--routing forward does not combine with fault injection (a forwarded \
                 transaction's home node would have to be recovered with it); use --routing \
                 ideal or none"
            );
        }
        if self.ford_backup_reads && self.replicas < 2 {
            bail!("--ford-backup-reads reads backups: it needs --replicas 2 or more");
        }
        if self.spare_memnodes > 0 {
            if self.replicas < 2 {
                bail!(
                    "--spare-memnodes needs --replicas 2 or more: a spare is filled from the \
                     live copies of a dead memory node's partitions"
                );
            }
            if self.hosts.is_some() {
                bail!(
                    "--spare-memnodes starts the spares on this host; with --hosts the \
                     topology file places every memory node"
                );
            }
            if self.memnodes + self.spare_memnodes > MAX_MEMNODES {
                bail!(
                    "--memnodes {} and --spare-memnodes {}: at most {MAX_MEMNODES} memory \
                     nodes in all",
                    self.memnodes,
                    self.spare_memnodes
                );
            }
            if self.restart && self.kill_memnode_after.is_some() {
                bail!(
                    "--spare-memnodes puts a spare in the killed memory node's place; \
                     --restart restarts the node itself instead: choose one"
                );
            }
        }
        if let Some(Sweep::Replicas(points)) = &self.sweep {
            for &r in points {
                Args {
                    replicas: r,
                    sweep: None,
                    ..self.clone()
                }
                .validate()
                .map_err(|e| e.context(format!("--sweep replicas={r}")))?;
            }
        }
        if matches!(self.sweep, Some(Sweep::LockServing(_))) && !self.coordinator_processes() {
            bail!(
                "--sweep lock-serving compares where Lotus's compute-node processes serve lock \
                 RPCs: it needs --cnodes 2 or more"
            );
        }
        if self.restart && self.kill_cn_after.is_none() && self.kill_memnode_after.is_none() {
            bail!("--restart goes with --kill-cn-after or --kill-memnode-after");
        }
        if self.stop_cn_after.is_some() && self.stop_ms == 0 {
            bail!("--stop-ms must be at least 1");
        }
        if let Some(cn) = self.cn {
            if self.kill_cn_after.is_none() && self.stop_cn_after.is_none() {
                bail!("--cn goes with --kill-cn-after or --stop-cn-after");
            }
            if cn >= self.cnodes {
                bail!("--cn {cn} must be below --cnodes {}", self.cnodes);
            }
        }
        if self.coordinator_processes() && self.versions < 2 {
            bail!(
                "coordinator processes (--cnodes {}) log commits for recovery, which needs \
                 --versions 2 or more (a roll-back invalidates the victim cell, with 1 version \
                 the only one)",
                self.cnodes
            );
        }
        if self.coordinator_processes() && matches!(self.sweep, Some(Sweep::CommitLog(_))) {
            bail!(
                "--sweep commit-log: coordinator processes always log (their recovery needs \
                 it); sweep it with the coordinators inside txn-bench (--cnodes 1)"
            );
        }
        if !self.no_check && self.check_memory_mb == 0 {
            bail!("--check-memory-mb must be at least 1 (or pass --no-check)");
        }
        if let Some(c) = &self.out.chart {
            match c.extension().and_then(|e| e.to_str()) {
                Some("svg" | "png") => {}
                _ => bail!("--chart {} must end in .svg or .png", c.display()),
            }
        }
        Ok(())
    }

    /// Whether the coordinators run as `cnode` processes of their own (`--cnodes 2` or
    /// more, or one to be killed and restarted), not as threads of this process.
    pub fn coordinator_processes(&self) -> bool {
        self.cnodes > 1 || self.kill_cn_after.is_some()
    }

    /// The protocols to run, in order, after checking `--protocol` against
    /// `--isolation`.
    pub fn protocols(&self) -> anyhow::Result<Vec<Protocol>> {
        let iso = match self.isolation {
            None | Some(IsolationArg::Sr) => Isolation::Serializable,
            Some(IsolationArg::Si) => Isolation::Snapshot,
        };
        let list = self.protocol_list(iso)?;
        if (self.unsafe_no_cas || self.fig3_premise) && !matches!(list[..], [Protocol::Mvcc(_)]) {
            bail!(
                "--unsafe-no-cas and --fig3-premise remove MVCC's lock CAS: they need --protocol mvcc \
                 (or mvcc-si), not {}",
                self.protocol
            );
        }
        Ok(list)
    }

    /// The protocols `--protocol` names at isolation `iso` (checked against
    /// `--isolation`).
    fn protocol_list(&self, iso: Isolation) -> anyhow::Result<Vec<Protocol>> {
        Ok(match (self.protocol, self.isolation) {
            (ProtocolArg::All, _) => vec![
                Protocol::OccCas,
                Protocol::Scythe,
                Protocol::Mvcc(iso),
                Protocol::Lotus(iso),
            ],
            (ProtocolArg::Mvcc, _) => vec![Protocol::Mvcc(iso)],
            (ProtocolArg::Lotus, _) => vec![Protocol::Lotus(iso)],
            (ProtocolArg::One(p @ (Protocol::Mvcc(i) | Protocol::Lotus(i))), Some(_)) if i != iso => {
                bail!(
                "--protocol {p} contradicts --isolation {} (use --protocol mvcc|lotus --isolation LEVEL)",
                if iso == Isolation::Snapshot { "si" } else { "sr" }
            )
            }
            (ProtocolArg::One(p @ (Protocol::Mvcc(_) | Protocol::Lotus(_))), _) => vec![p],
            (ProtocolArg::One(p), Some(IsolationArg::Si)) => bail!(
                "--isolation si applies to mvcc and lotus (and to their runs of --protocol all), not to {p}"
            ),
            (ProtocolArg::One(p), _) => vec![p],
        })
        .map(|mut v: Vec<Protocol>| {
            // `all` with coordinator processes leaves Lotus out unless a --routing is
            // given (without routing its lock RPCs across processes make it far slower
            // than the others there; by name it runs).
            if self.protocol == ProtocolArg::All
                && self.coordinator_processes()
                && self.routing == crate::routing::Routing::None
                && v.iter().any(|p| p.needs_lock_tables())
            {
                eprintln!(
                    "note: --protocol all leaves lotus out with coordinator processes and \
                     --routing none (give --routing forward|ideal, or run --protocol lotus)"
                );
                v.retain(|p| !p.needs_lock_tables());
            }
            v
        })
    }

    pub(crate) fn points(&self) -> Vec<Point> {
        // Every point is this run's settings with the swept one changed and labelled.
        let base = Point {
            theta: self.theta,
            coroutines: self.coroutines,
            commit_log: None,
            vtc_entries: self.vtc_entries,
            routing: None,
            lock_serving: None,
            range_index: None,
            replicas: None,
            max_backoff_us: None,
            lock_placement: None,
            label: None,
        };
        let at = |label: String, set: &dyn Fn(&mut Point)| {
            let mut p = Point {
                label: Some(label),
                ..base.clone()
            };
            set(&mut p);
            p
        };
        match &self.sweep {
            None => vec![base.clone()],
            Some(Sweep::Theta(v)) => v
                .iter()
                .map(|&t| at(format!("theta={t}"), &|p| p.theta = t))
                .collect(),
            Some(Sweep::Clients(v)) => v
                .iter()
                .map(|&c| at(format!("clients={c}"), &|p| p.coroutines = c))
                .collect(),
            Some(Sweep::CommitLog(v)) => v
                .iter()
                .map(|&l| {
                    at(format!("commit-log={}", l.name()), &|p| {
                        p.commit_log = Some(l)
                    })
                })
                .collect(),
            Some(Sweep::LockServing(v)) => v
                .iter()
                .map(|&l| {
                    at(format!("lock-serving={}", l.name()), &|p| {
                        p.lock_serving = Some(l)
                    })
                })
                .collect(),
            Some(Sweep::RangeIndex(v)) => v
                .iter()
                .map(|&on| {
                    let name = if on { "on" } else { "off" };
                    at(format!("range-index={name}"), &|p| p.range_index = Some(on))
                })
                .collect(),
            Some(Sweep::Replicas(v)) => v
                .iter()
                .map(|&r| at(format!("replicas={r}"), &|p| p.replicas = Some(r)))
                .collect(),
            Some(Sweep::VtcEntries(v)) => v
                .iter()
                .map(|&n| at(format!("vtc-entries={n}"), &|p| p.vtc_entries = n))
                .collect(),
            Some(Sweep::MaxBackoffUs(v)) => v
                .iter()
                .map(|&b| {
                    at(format!("max-backoff-us={b}"), &|p| {
                        p.max_backoff_us = Some(b)
                    })
                })
                .collect(),
            Some(Sweep::LockPlacement(v)) => v
                .iter()
                .map(|&l| {
                    at(format!("lock-placement={}", l.name()), &|p| {
                        p.lock_placement = Some(l)
                    })
                })
                .collect(),
        }
    }
}

/// The node ids of txn-bench's processes: the topology file's defaults (memory node `i`
/// is `NODE_MEMNODE + i`, coordinator process `i` is `NODE_CNODE + i`, txn-bench itself
/// is `NODE_CN`).
pub(crate) use rrpc::topology::{NODE_CN, NODE_CNODE, NODE_LOCKD, NODE_MEMNODE, NODE_TSO};
/// Most coordinator processes a run starts.
pub const MAX_CNODES: usize = 64;
/// Most memory nodes a run starts (their node ids stay below the compute node's).
pub const MAX_MEMNODES: u32 = NODE_CN - NODE_MEMNODE;

/// For a workload whose keys follow its specification's `NURand`: refuse
/// `--sweep theta=...`, which would not change what it runs.
pub(crate) fn refuse_theta_sweep(args: &Args) -> anyhow::Result<()> {
    if matches!(args.sweep, Some(Sweep::Theta(_))) {
        anyhow::bail!(
            "--sweep theta does not apply to {}: its keys follow the specification's \
             NURand, not Zipf theta (sweep clients=... instead)",
            args.workload
        );
    }
    Ok(())
}

/// For a workload other than SmallBank: refuse SmallBank's `--hot-accounts`.
impl Args {
    /// Whether the run uses the range index: `ycsb-e`, or TPC-C with `--range-index`.
    pub fn uses_range_index(&self) -> bool {
        self.workload.needs_range_index() || (self.range_index && self.workload == Workload::Tpcc)
    }

    /// The tables the range index keeps ordered in this run (empty without one).
    pub fn range_index_tables(&self) -> Vec<u32> {
        match self.workload {
            _ if !self.uses_range_index() => Vec::new(),
            Workload::Tpcc => vec![txn::tpcc::NEW_ORDER, txn::tpcc::ORDER_LINE],
            _ => vec![txn::kvs::TABLE],
        }
    }
}

pub(crate) fn refuse_hot_accounts(args: &Args) -> anyhow::Result<()> {
    if args.hot_accounts.is_some() {
        anyhow::bail!("--hot-accounts applies to smallbank only");
    }
    Ok(())
}

fn default_lease_ms() -> u64 {
    1000
}

fn default_etcd_down_ms() -> u64 {
    200
}

fn default_vtc_entries() -> usize {
    txn::vt_cache::DEFAULT_ENTRIES
}

fn one_round() -> u32 {
    1
}
