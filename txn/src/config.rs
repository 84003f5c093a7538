//! What a client is told: the protocol by name ([`Protocol`], [`Isolation`]), the
//! coordinator's settings ([`TxnConfig`]) and where the cluster's services are
//! ([`ClusterAddrs`]).

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use tso::ReconnectConfig;

/// The concurrency-control protocol of a client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// OCC with one-sided CAS locks in the CVT header (the FaRM/FORD baseline).
    OccCas,
    /// Scythe's hot-aware OCC/TOCC on Takeout Locks (needs a lock service).
    Scythe,
    /// Motor's MVCC at the given isolation level.
    Mvcc(Isolation),
    /// Lotus's lock-first protocol on compute-node lock tables (Lotus 5.1 and 5.2) at the
    /// given isolation level (needs [`TxnConfig::lotus`]).
    Lotus(Isolation),
}

/// Isolation level of [`Protocol::Mvcc`] and [`Protocol::Lotus`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isolation {
    /// Serializability: read-only data of read-write transactions is validated at the
    /// commit timestamp (Motor 5.1, phase 2).
    Serializable,
    /// Snapshot isolation: no validation; write-write conflicts still abort (first
    /// committer wins, Motor 5.2).
    Snapshot,
}

impl Protocol {
    /// Every protocol, in report order (MVCC and Lotus at serializability).
    pub const ALL: [Protocol; 4] = [
        Protocol::OccCas,
        Protocol::Scythe,
        Protocol::Mvcc(Isolation::Serializable),
        Protocol::Lotus(Isolation::Serializable),
    ];

    /// Short name: `occ-cas`, `scythe`, `mvcc` (serializable), `mvcc-si`, `lotus`
    /// (serializable) or `lotus-si`.
    pub fn name(self) -> &'static str {
        match self {
            Self::OccCas => "occ-cas",
            Self::Scythe => "scythe",
            Self::Mvcc(Isolation::Serializable) => "mvcc",
            Self::Mvcc(Isolation::Snapshot) => "mvcc-si",
            Self::Lotus(Isolation::Serializable) => "lotus",
            Self::Lotus(Isolation::Snapshot) => "lotus-si",
        }
    }

    /// Whether the protocol needs a lock service.
    pub fn needs_lockd(self) -> bool {
        self == Self::Scythe
    }

    /// Whether the protocol locks in compute-node lock tables ([`TxnConfig::lotus`]).
    pub fn needs_lock_tables(self) -> bool {
        matches!(self, Self::Lotus(_))
    }

    /// The isolation level of a multi-version protocol (MVCC, Lotus); `None` for the
    /// single-version ones.
    pub fn isolation(self) -> Option<Isolation> {
        match self {
            Self::Mvcc(i) | Self::Lotus(i) => Some(i),
            _ => None,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Protocol {
    type Err = String;
    /// `occ-cas`, `scythe`, `mvcc` (= `mvcc-sr`), `mvcc-si`, `lotus` (= `lotus-sr`) or
    /// `lotus-si`.
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "occ-cas" => Self::OccCas,
            "scythe" => Self::Scythe,
            "mvcc" | "mvcc-sr" => Self::Mvcc(Isolation::Serializable),
            "mvcc-si" => Self::Mvcc(Isolation::Snapshot),
            "lotus" | "lotus-sr" => Self::Lotus(Isolation::Serializable),
            "lotus-si" => Self::Lotus(Isolation::Snapshot),
            _ => {
                return Err(format!(
                    "unknown protocol {s:?}: occ-cas, scythe, mvcc (mvcc-sr), mvcc-si, lotus \
                     (lotus-sr) or lotus-si"
                ))
            }
        })
    }
}

/// Coordinator settings.
///
/// Non-exhaustive, so that a setting can be added without breaking the crates that embed
/// this one: outside this crate, start from [`Default::default`] and chain the `with_*`
/// setters (or assign the public fields on a `let mut` binding).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct TxnConfig {
    /// The protocol (default OCC-CAS).
    pub protocol: Protocol,
    /// How long to wait for a granted ticket's turn before aborting with
    /// [`crate::error::AbortReason::LockWaitTimeout`] (Scythe; default 2 s).
    pub lock_wait: Duration,
    /// Scythe: how long after its Lock RPC was sent a Takeout ticket may still be acted
    /// on. A commit whose oldest ticket is older aborts
    /// ([`crate::error::AbortReason::TicketExpired`]) before it writes: a lock service
    /// that died and restarted grants nothing for its grace period (lockd's
    /// `--restart-grace-ms`, default 1 s), which must exceed this lease plus a commit's
    /// log round, so that no holder of a dead service's ticket still writes when a lock is
    /// granted anew (default 500 ms).
    pub ticket_lease: Duration,
    /// Record committed transactions for the checkers, up to this many bytes per thread;
    /// `None` (the default) records nothing.
    pub history_limit_bytes: Option<usize>,
    /// How long a timestamp request waits for a restarted oracle, and how often it looks
    /// for it (default: [`ReconnectConfig::default`]).
    pub tso_reconnect: ReconnectConfig,
    /// Scythe's TOCC heuristic wait (4.4 (2), after Aurogon): after a Lock RPC refused
    /// on an object whose queue lies between ColdWatermark and HotWatermark, wait this
    /// long before the attempt aborts (and is retried), so that requests with smaller
    /// timestamps arrive first (default 20 us; zero turns it off).
    pub tocc_wait: Duration,
    /// MVCC: how long a read-only transaction waits at commit for a CVT that was locked
    /// when it read it to be released, before it aborts
    /// ([`crate::error::AbortReason::ValidationLocked`]); see [`crate::mvcc`] (default 1 ms).
    pub read_wait: Duration,
    /// CVT addresses each thread caches (default 2^20).
    pub cache_entries: usize,
    /// Measure where each attempt's time goes ([`crate::phase`]) and keep it for
    /// [`crate::coordinator::TxnClient::take_phases`] (default off: no clock reads).
    pub record_phases: bool,
    /// This compute node's incarnation, carried in every transaction id
    /// ([`crate::txn_id`], its low 12 bits) so that a restarted node never reuses its
    /// previous life's ids and recovery of that life cannot release the new one's
    /// locks. 0 (the default) takes the fabric's ([`rrpc::fabric::Fabric::incarnation`],
    /// which a compute node sets from the membership service).
    pub incarnation: u64,
    /// Write a commit log ([`crate::commit_log`]) to the memory nodes before each
    /// commit's installs, so that a survivor can finish or undo it if this node dies
    /// ([`crate::recovery`]); costs one round trip per read-write commit (default off).
    /// Needs memory nodes with a log region and at least 2 versions per CVT.
    pub commit_log: bool,
    /// Where the commit log goes relative to the installs (default
    /// [`LogPlacement::RoundBefore`]).
    pub log_placement: LogPlacement,
    /// How a commit reaches the copies of replicated partitions (default
    /// [`ReplicaCommit::Coalesced`]).
    pub replica_commit: ReplicaCommit,
    /// Where new replica views come from when a memory node dies ([`crate::view`]);
    /// `None` (the default): the initial placement for good, and a memory node's
    /// failure fails the transactions that meet it.
    pub view_feed: Option<crate::view::ViewFeed>,
    /// Where [`Protocol::Lotus`] takes its locks: this compute node's lock table, the
    /// shard map and the lock-key function ([`crate::lotus_site::LotusSite`]); `None` (the
    /// default) for the other protocols.
    pub lotus: Option<crate::lotus_site::LotusSite>,
    /// UNSAFE, benchmark only: [`Protocol::Mvcc`] without its lock CAS (Lotus's Fig. 3
    /// premise, "MVCC with CAS abandoned"). A read-write object's CVT is READ and treated
    /// as locked without the CAS, and nothing is released for it; the commit's
    /// validation of read-only data stays. Loses isolation between writers: histories
    /// are not serializable and money is not conserved, so checkers must be off. Other
    /// protocols ignore it (default false).
    pub unsafe_no_lock_cas: bool,
    /// [`Protocol::OccCas`] over replicas (FORD, [`crate::ford`]): read-only
    /// transactions ([`crate::coordinator::Txn::declare_read_only`]) READ each object
    /// whose CVT address is cached from one of its partition's backups and validate it
    /// on that backup (FORD's backup-enabled read), offloading the primaries.
    /// Read-write transactions read the primaries: a backup's lock word never shows a
    /// writer's lock, so validating there would let write skew commit. Other protocols
    /// and unreplicated runs ignore it (default false).
    pub ford_backup_reads: bool,
    /// Connect this thread to the range index ([`crate::range_index`]) for
    /// [`crate::coordinator::Txn::scan`] and index upkeep on inserts and deletes of its
    /// tables; `None` (the default): no index, scans refused.
    pub range_index: Option<RangeIndexConfig>,
}

/// A thread's range-index settings ([`TxnConfig::range_index`], [`crate::range_index`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeIndexConfig {
    /// Indexed tables: inserts into them add index entries, deletes remove them.
    pub tables: Vec<u32>,
    /// This thread's rTX IDs, one per coroutine that may use the index at once; distinct
    /// from every other thread's of the cluster, and below the region's IDs.
    pub ids: std::ops::Range<u16>,
    /// This thread's rTX incarnation (1 to 255), new at each restart of its process:
    /// blocks allocated in an earlier life are told apart (rTX 4.4). Each ID recovers
    /// (repairs its previous life's unfinished rTX) before its first use.
    pub incarnation: u8,
}

/// How a commit's installs reach the primary and the backups of a replicated
/// partition.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReplicaCommit {
    /// Every copy in one round (Motor 5.3's one-round commit; FORD's coalescent commit).
    #[default]
    Coalesced,
    /// The backups' round, then the primaries' (FaRMv2 on disaggregated memory, the
    /// baseline Motor 7.4 compares against: one round trip more per read-write commit).
    Separate,
}

/// How a commit's log lands before its installs (the two ways of Motor 5.3's and FORD's
/// logging that keep "log before data" on RDMA).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogPlacement {
    /// One round before: the log WRITEs complete at every memory node, then the
    /// installs start (one round trip more per read-write commit).
    #[default]
    RoundBefore,
    /// In the same round, ahead of the installs: per memory node, the log WRITE and
    /// then that node's record and cell WRITEs as one ordered WR list on one QP, which
    /// RC lands in order ([`rrpc::runtime::ThreadCtx::write_ordered`]). A list too long
    /// for one post falls back to the round before, for that commit.
    Ordered,
}

impl Default for TxnConfig {
    fn default() -> Self {
        Self {
            protocol: Protocol::OccCas,
            lock_wait: Duration::from_secs(2),
            ticket_lease: Duration::from_millis(500),
            history_limit_bytes: None,
            tso_reconnect: ReconnectConfig::default(),
            tocc_wait: Duration::from_micros(20),
            read_wait: Duration::from_millis(1),
            cache_entries: 1 << 20,
            record_phases: false,
            incarnation: 0,
            commit_log: false,
            log_placement: LogPlacement::RoundBefore,
            replica_commit: ReplicaCommit::Coalesced,
            view_feed: None,
            lotus: None,
            unsafe_no_lock_cas: false,
            ford_backup_reads: false,
            range_index: None,
        }
    }
}

impl TxnConfig {
    /// Set [`TxnConfig::protocol`]: the protocol (default OCC-CAS).
    pub fn with_protocol(mut self, protocol: Protocol) -> Self {
        self.protocol = protocol;
        self
    }

    /// Set [`TxnConfig::lock_wait`]: how long to wait for a granted ticket's turn before
    /// aborting with [`crate::error::AbortReason::LockWaitTimeout`] (Scythe; default 2 s).
    pub fn with_lock_wait(mut self, lock_wait: Duration) -> Self {
        self.lock_wait = lock_wait;
        self
    }

    /// Set [`TxnConfig::ticket_lease`]: Scythe: how long after its Lock RPC was sent a Takeout
    /// ticket may still be acted on.
    pub fn with_ticket_lease(mut self, ticket_lease: Duration) -> Self {
        self.ticket_lease = ticket_lease;
        self
    }

    /// Set [`TxnConfig::history_limit_bytes`]: record committed transactions for the checkers,
    /// up to this many bytes per thread; `None` (the default) records nothing.
    pub fn with_history_limit_bytes(mut self, history_limit_bytes: Option<usize>) -> Self {
        self.history_limit_bytes = history_limit_bytes;
        self
    }

    /// Set [`TxnConfig::tso_reconnect`]: how long a timestamp request waits for a restarted
    /// oracle, and how often it looks for it (default: [`ReconnectConfig::default`]).
    pub fn with_tso_reconnect(mut self, tso_reconnect: ReconnectConfig) -> Self {
        self.tso_reconnect = tso_reconnect;
        self
    }

    /// Set [`TxnConfig::tocc_wait`]: Scythe's TOCC heuristic wait (4.4 (2), after Aurogon):
    /// after a Lock RPC refused on an object whose queue lies between ColdWatermark and
    /// HotWatermark, wait this long before the attempt aborts (and is retried), so that
    /// requests with smaller timestamps arrive first (default 20 us; zero turns it off).
    pub fn with_tocc_wait(mut self, tocc_wait: Duration) -> Self {
        self.tocc_wait = tocc_wait;
        self
    }

    /// Set [`TxnConfig::read_wait`]: MVCC: how long a read-only transaction waits at commit for
    /// a CVT that was locked when it read it to be released, before it aborts
    /// ([`crate::error::AbortReason::ValidationLocked`]); see [`crate::mvcc`] (default 1 ms).
    pub fn with_read_wait(mut self, read_wait: Duration) -> Self {
        self.read_wait = read_wait;
        self
    }

    /// Set [`TxnConfig::cache_entries`]: CVT addresses each thread caches (default 2^20).
    pub fn with_cache_entries(mut self, cache_entries: usize) -> Self {
        self.cache_entries = cache_entries;
        self
    }

    /// Set [`TxnConfig::record_phases`]: measure where each attempt's time goes
    /// ([`crate::phase`]) and keep it for [`crate::coordinator::TxnClient::take_phases`]
    /// (default off: no clock reads).
    pub fn with_record_phases(mut self, record_phases: bool) -> Self {
        self.record_phases = record_phases;
        self
    }

    /// Set [`TxnConfig::incarnation`]: this compute node's incarnation, carried in every
    /// transaction id ([`crate::txn_id`], its low 12 bits) so that a restarted node never
    /// reuses its previous life's ids and recovery of that life cannot release the new one's
    /// locks.
    pub fn with_incarnation(mut self, incarnation: u64) -> Self {
        self.incarnation = incarnation;
        self
    }

    /// Set [`TxnConfig::commit_log`]: write a commit log ([`crate::commit_log`]) to the memory
    /// nodes before each commit's installs, so that a survivor can finish or undo it if this
    /// node dies ([`crate::recovery`]); costs one round trip per read-write commit (default
    /// off).
    pub fn with_commit_log(mut self, commit_log: bool) -> Self {
        self.commit_log = commit_log;
        self
    }

    /// Set [`TxnConfig::log_placement`]: where the commit log goes relative to the installs
    /// (default [`LogPlacement::RoundBefore`]).
    pub fn with_log_placement(mut self, log_placement: LogPlacement) -> Self {
        self.log_placement = log_placement;
        self
    }

    /// Set [`TxnConfig::replica_commit`]: how a commit reaches the copies of replicated
    /// partitions (default [`ReplicaCommit::Coalesced`]).
    pub fn with_replica_commit(mut self, replica_commit: ReplicaCommit) -> Self {
        self.replica_commit = replica_commit;
        self
    }

    /// Set [`TxnConfig::view_feed`]: where new replica views come from when a memory node dies
    /// ([`crate::view`]); `None` (the default): the initial placement for good, and a memory
    /// node's failure fails the transactions that meet it.
    pub fn with_view_feed(mut self, view_feed: Option<crate::view::ViewFeed>) -> Self {
        self.view_feed = view_feed;
        self
    }

    /// Set [`TxnConfig::lotus`]: where [`Protocol::Lotus`] takes its locks: this compute node's
    /// lock table, the shard map and the lock-key function ([`crate::lotus_site::LotusSite`]);
    /// `None` (the default) for the other protocols.
    pub fn with_lotus(mut self, lotus: Option<crate::lotus_site::LotusSite>) -> Self {
        self.lotus = lotus;
        self
    }

    /// Set [`TxnConfig::unsafe_no_lock_cas`]: UNSAFE, benchmark only: [`Protocol::Mvcc`]
    /// without its lock CAS (Lotus's Fig. 3 premise, "MVCC with CAS abandoned").
    pub fn with_unsafe_no_lock_cas(mut self, unsafe_no_lock_cas: bool) -> Self {
        self.unsafe_no_lock_cas = unsafe_no_lock_cas;
        self
    }

    /// Set [`TxnConfig::ford_backup_reads`]: [`Protocol::OccCas`] over replicas (FORD,
    /// [`crate::ford`]): read-only transactions
    /// ([`crate::coordinator::Txn::declare_read_only`]) READ each object whose CVT address is
    /// cached from one of its partition's backups and validate it on that backup (FORD's
    /// backup-enabled read), offloading the primaries.
    pub fn with_ford_backup_reads(mut self, ford_backup_reads: bool) -> Self {
        self.ford_backup_reads = ford_backup_reads;
        self
    }
}

/// Addresses of a cluster's services.
#[derive(Clone, Debug)]
pub struct ClusterAddrs {
    /// The memory nodes' bootstrap addresses (any order; they say their partition).
    pub memnodes: Vec<SocketAddr>,
    /// The lock service's bootstrap address (needed by [`Protocol::Scythe`]).
    pub lockd: Option<SocketAddr>,
    /// The timestamp oracle's bootstrap address.
    pub tso: SocketAddr,
}

/// Why [`ClusterAddrs::from_file`] could not load a file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AddrsFileError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not TOML, a key is unknown or missing, or an address does not parse.
    #[error("{path}: {msg}")]
    Parse {
        /// The file.
        path: String,
        /// The parser's message (with line and column).
        msg: String,
    },
}

/// The addresses file as written: kebab-case keys, addresses as `"IP:PORT"` strings.
#[derive(serde::Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct AddrsFile {
    memnodes: Vec<SocketAddr>,
    #[serde(default)]
    lockd: Option<SocketAddr>,
    tso: SocketAddr,
}

impl ClusterAddrs {
    /// Load the addresses a launcher wrote (`rrpc-launch up` writes such a file):
    ///
    /// ```toml
    /// memnodes = ["10.10.1.1:7010", "10.10.1.2:7010"]
    /// lockd = "10.10.1.3:7002"   # optional
    /// tso = "10.10.1.3:7003"
    /// ```
    ///
    /// Errors: [`AddrsFileError::Read`]; [`AddrsFileError::Parse`] for a file that is not
    /// TOML, lacks `memnodes` or `tso`, has another key, or an address that is not
    /// `IP:PORT`.
    pub fn from_file(path: impl AsRef<std::path::Path>) -> Result<Self, AddrsFileError> {
        let p = path.as_ref();
        let text = std::fs::read_to_string(p).map_err(|source| AddrsFileError::Read {
            path: p.display().to_string(),
            source,
        })?;
        Self::from_toml(&text).map_err(|msg| AddrsFileError::Parse {
            path: p.display().to_string(),
            msg,
        })
    }

    /// Parse the text of an addresses file (see [`ClusterAddrs::from_file`]).
    ///
    /// Errors: the parser's message (not TOML, a missing or unknown key, a bad address).
    pub fn from_toml(text: &str) -> Result<Self, String> {
        let f: AddrsFile = toml::from_str(text).map_err(|e| e.to_string())?;
        Ok(Self {
            memnodes: f.memnodes,
            lockd: f.lockd,
            tso: f.tso,
        })
    }

    /// These addresses as the TOML [`ClusterAddrs::from_file`] reads (no `lockd` key
    /// without a lock service).
    pub fn to_toml(&self) -> String {
        let quoted = |a: &SocketAddr| format!("\"{a}\"");
        let mut s = format!(
            "memnodes = [{}]\n",
            self.memnodes
                .iter()
                .map(quoted)
                .collect::<Vec<_>>()
                .join(", ")
        );
        if let Some(l) = &self.lockd {
            s.push_str(&format!("lockd = {}\n", quoted(l)));
        }
        s.push_str(&format!("tso = {}\n", quoted(&self.tso)));
        s
    }
}
