//! [`TsoError`]: the errors of the oracle, its clients, the TSO proxies and the sources a
//! compute node chooses among (one type, so that a request failed over from a proxy to
//! the oracle reports either's cause the same way).

use std::sync::Arc;

use rrpc::fabric::FabricError;
use rrpc::runtime::RpcError;
use rrpc::NodeId;

use crate::group::GroupFailure;
use crate::timestamp::Timestamp;

/// Errors of the oracle and its clients.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TsoError {
    /// Allocating the counter failed.
    #[error("allocating the TSO counter: {0}")]
    Fabric(#[from] FabricError),
    /// The FAA failed (peer gone, completion error, not connected).
    #[error(transparent)]
    Rpc(#[from] RpcError),
    /// The node exports no usable `"tso"` entry.
    #[error("TSO export: {0}")]
    Export(String),
    /// The TSO group's leader got no range for this request's group.
    #[error("TSO group")]
    Group(#[from] GroupFailure<Arc<TsoError>>),
    /// The oracle stopped answering and did not come back within the reconnect wait
    /// ([`crate::conn::ReconnectConfig::wait`]).
    #[error("TSO oracle at {addr} unavailable for {waited:?}")]
    Unavailable {
        /// The oracle's bootstrap address.
        addr: std::net::SocketAddr,
        /// How long the request waited.
        waited: std::time::Duration,
        /// The last failure (the FAA's, or reaching the control plane).
        #[source]
        source: Box<RpcError>,
    },
    /// The oracle came back with an epoch that is not larger than the one this client
    /// used (restarted without `--state-dir`, or its state directory was lost or rolled
    /// back): its timestamps could go back, so none is taken.
    #[error("TSO oracle at {addr} restarted in epoch {new}, not after epoch {old}: timestamps would go back (is its --state-dir durable?)")]
    WentBack {
        /// The oracle's bootstrap address.
        addr: std::net::SocketAddr,
        /// Epoch the client used.
        old: u16,
        /// Epoch of the restarted oracle.
        new: u16,
    },
    /// A request for zero timestamps.
    #[error("asked for zero timestamps")]
    ZeroCount,
    /// A setting is out of range (the text names the key and the rule).
    #[error("config: {0}")]
    Config(String),
    /// Starting a node (a TSO proxy's) failed.
    #[error("starting the node")]
    Start(#[source] rrpc::node::NodeError),
    /// A TSO proxy got a range from the oracle that does not start above the highest
    /// timestamp it issued, or of an epoch in which that happened before (an oracle
    /// that went back under an export the epoch check could not tell apart): refused
    /// ([`crate::proxy::Highest`]).
    #[error("the oracle went back: range starting at {got} after {highest} was issued")]
    Regression {
        /// Highest timestamp the proxy had issued.
        highest: Timestamp,
        /// First timestamp of the range the oracle returned.
        got: Timestamp,
    },
    /// A TSO proxy's reply is malformed or not what was asked for.
    #[error("TSO proxy node {node}: bad reply: {what}")]
    BadReply {
        /// The proxy's node id.
        node: NodeId,
        /// What is wrong.
        what: String,
    },
    /// Every timestamp source (proxies and oracle) failed this request.
    #[error("all {tried} timestamp source(s) failed; the last")]
    NoSource {
        /// Sources tried.
        tried: usize,
        /// The last source's error.
        #[source]
        last: Box<TsoError>,
    },
    /// The range would leave the oracle's epoch (more than `2^48 - 1` timestamps in one
    /// incarnation): refused, because a later incarnation may hand those values out.
    /// Restart the oracle to open a new epoch.
    #[error("timestamp counter of epoch {epoch} exhausted at {at:#x} (asked for {n})")]
    Exhausted {
        /// The oracle's epoch.
        epoch: u16,
        /// Counter value before the FAA.
        at: u64,
        /// Timestamps asked for.
        n: u64,
    },
}

rrpc::from_rpc_errors!(TsoError, TsoError::Rpc);
