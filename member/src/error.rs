//! The crate's one error type: a variant per cause, the etcd client's error kept as source.

use std::time::Duration;

/// The etcd client's error, kept as the source of [`MemberError::Etcd`] and
/// [`MemberError::Connect`]. Without the `etcd` feature no etcd call is ever made, and this is
/// an uninhabited type, so those variants cannot occur.
#[cfg(feature = "etcd")]
pub type EtcdError = etcd_client::Error;

/// The etcd client's error (uninhabited: built without the `etcd` feature).
#[cfg(not(feature = "etcd"))]
#[derive(Debug)]
pub enum EtcdError {}

#[cfg(not(feature = "etcd"))]
impl std::fmt::Display for EtcdError {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {}
    }
}

#[cfg(not(feature = "etcd"))]
impl std::error::Error for EtcdError {}

/// What went wrong talking to etcd or running a local etcd.
#[derive(Debug, thiserror::Error)]
pub enum MemberError {
    /// The crate was compiled without its `etcd` feature: it has no etcd client.
    #[error("built without the etcd client: rebuild with --features member/etcd (it needs protoc: Debian's protobuf-compiler)")]
    NoEtcdSupport,
    /// [`crate::LocalEtcd::start`] found no `etcd` binary.
    #[error("etcd not found on PATH or in /usr/bin: install Debian's etcd-server (apt-get install etcd-server)")]
    EtcdMissing,
    /// Starting the `etcd` process failed.
    #[error("could not start {binary}")]
    EtcdSpawn {
        /// The binary that was started.
        binary: String,
        /// The spawn error.
        #[source]
        source: std::io::Error,
    },
    /// Picking a free loopback port (binding port 0) or creating the data directory failed.
    #[error("could not prepare the local etcd: {what}")]
    LocalSetup {
        /// What was being prepared.
        what: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The local etcd exited before it answered.
    #[error("the local etcd exited ({status}) before answering; its log ends with:\n{log_tail}")]
    EtcdExited {
        /// Its exit status.
        status: std::process::ExitStatus,
        /// The last lines of its log.
        log_tail: String,
    },
    /// The local etcd did not answer its health check in time.
    #[error("the local etcd did not answer within {waited:?}; its log ends with:\n{log_tail}")]
    EtcdNotReady {
        /// How long [`crate::LocalEtcd::start`] waited.
        waited: Duration,
        /// The last lines of its log.
        log_tail: String,
    },
    /// The cluster name is empty or contains `/`.
    #[error("invalid cluster name {0:?}: it must be non-empty and contain no '/'")]
    InvalidCluster(String),
    /// No endpoints were given, or the client could not be set up for them.
    #[error("cannot connect to etcd at {endpoints:?}")]
    Connect {
        /// The endpoints given.
        endpoints: Vec<String>,
        /// The client's error.
        #[source]
        source: EtcdError,
    },
    /// etcd did not answer the first call of [`crate::Member::join`] in time.
    #[error("etcd at {endpoints:?} did not answer within {after:?}")]
    Unreachable {
        /// The endpoints given.
        endpoints: Vec<String>,
        /// The operation timeout.
        after: Duration,
    },
    /// An etcd call failed.
    #[error("etcd call failed: {op}")]
    Etcd {
        /// The operation (for example "grant lease").
        op: &'static str,
        /// The client's error.
        #[source]
        source: EtcdError,
    },
    /// An operation did not finish within its timeout.
    #[error("{op} did not finish within {after:?}")]
    Timeout {
        /// The operation.
        op: &'static str,
        /// The timeout.
        after: Duration,
    },
    /// The incarnation counter's compare-and-swap kept losing to concurrent joins of the same
    /// node.
    #[error("node {node}: the incarnation counter kept changing under {attempts} attempts")]
    IncarnationContended {
        /// The node.
        node: u16,
        /// The attempts made.
        attempts: u32,
    },
    /// A value stored under the cluster's prefix does not parse.
    #[error("bad value at {key}: {reason}")]
    BadValue {
        /// The key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A member's JSON value does not parse.
    #[error("bad member value at {key}")]
    BadMemberJson {
        /// The key.
        key: String,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// [`crate::Member::claim_recovery`] on an incarnation whose lease is still live: revoke
    /// it first (the fast path), or wait for its expiry.
    #[error("node {node} incarnation {incarnation} is still a live member")]
    StillLive {
        /// The node.
        node: u16,
        /// Its incarnation.
        incarnation: u64,
    },
    /// [`crate::Member::finish_recovery`] by a member that does not hold the claim.
    #[error("node {node} incarnation {incarnation}: the recovery claim is not ours")]
    NotClaimant {
        /// The node.
        node: u16,
        /// Its incarnation.
        incarnation: u64,
    },
    /// This member's own lease is gone (it expired, or a survivor revoked it): the member is
    /// dead in the cluster's eyes and must stop serving; join again for a new incarnation.
    #[error("our lease expired or was revoked: this incarnation is dead")]
    LeaseLost,
    /// Building the background runtime or its thread failed.
    #[error("could not start the background etcd thread")]
    Runtime(#[source] std::io::Error),
    /// The background thread is gone (it panicked, or the member was shut down).
    #[error("the background etcd thread is gone")]
    RuntimeGone,
}
