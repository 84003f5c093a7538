//! Errors of the runtime, one type per operation, each keeping its cause.

use crate::NodeId;
use std::sync::Arc;
use std::time::Duration;

use crate::ctrl::NodeError;
use crate::fabric::{FabricError, WcStatus};
use crate::rocket::RocketError;

/// Why a node counts as gone: pending and later work to it fails with this.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum GoneReason {
    /// A failed QP could not be reconnected (the node's control plane is unreachable).
    #[error("reconnect failed: {0}")]
    Reconnect(#[source] Arc<FabricError>),
    /// The node's response ring broke the protocol.
    #[error("corrupt response ring: {0}")]
    CorruptRing(#[source] RocketError),
    /// A response batch did not decode.
    #[error("corrupt response batch: {0}")]
    CorruptBatch(#[source] RocketError),
}

/// Errors of connection setup ([`super::ThreadCtx::connect`],
/// [`super::ThreadCtx::connect_rpc`]) and of building a context.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The node's control plane failed or answered with an error.
    #[error("control plane of {addr}: {source}")]
    Control {
        /// The node's bootstrap address.
        addr: std::net::SocketAddr,
        /// What failed.
        #[source]
        source: NodeError,
    },
    /// Registering rings or buffers, or creating QPs, failed.
    #[error(transparent)]
    Fabric(#[from] FabricError),
    /// The Rocket geometry is unusable.
    #[error(transparent)]
    Rocket(#[from] RocketError),
    /// A setting is out of range (the text names the field and the rule).
    #[error("runtime config: {0}")]
    Config(&'static str),
    /// A runtime thread panicked ([`super::Runtime::run`]).
    #[error("runtime thread {0} panicked")]
    Panicked(usize),
}

/// Errors of one-sided operations ([`super::ThreadCtx::read`], `write`, `cas`, `faa`).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum OneSidedError {
    /// No connection to the node was set up on this thread.
    #[error("node {node} is not connected on this thread")]
    NotConnected {
        /// Node id.
        node: NodeId,
    },
    /// More bytes than [`super::RuntimeConfig::max_transfer`] (nothing was sent).
    #[error("one-sided op of {len} bytes exceeds the {max}-byte limit")]
    TooLarge {
        /// Bytes asked for.
        len: usize,
        /// Limit in bytes.
        max: usize,
    },
    /// No registered buffer of that size is free on this thread ([`super::ThreadCtx::alloc_buf`]:
    /// the thread's arena is in use by calls, one-sided ops and buffers not yet dropped).
    #[error("no free registered buffer of {len} bytes on this thread")]
    NoBuffer {
        /// Bytes asked for.
        len: usize,
    },
    /// A [`super::RegBuf`] used on a thread other than the one whose context allocated it
    /// (its memory is registered there), or shorter than the op (nothing was sent; the
    /// buffer is dropped).
    #[error("registered buffer of another thread's context, or too short for the op")]
    ForeignBuffer,
    /// The WR completed with an error status (its QP failed and is reconnected on the
    /// control thread; later ops go through).
    #[error("work request to node {node} failed: {status:?}")]
    Completion {
        /// Node id.
        node: NodeId,
        /// Completion status.
        status: WcStatus,
    },
    /// The node is gone.
    #[error("node {node} is unreachable: {why}")]
    PeerGone {
        /// Node id.
        node: NodeId,
        /// Why.
        #[source]
        why: GoneReason,
    },
}

/// Errors of RPC calls ([`super::ThreadCtx::call`], [`super::ThreadCtx::call_with`]).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// No RPC channel to the node was set up on this thread.
    #[error("node {node} is not connected for RPC on this thread")]
    NotConnected {
        /// Node id.
        node: NodeId,
    },
    /// A request or reply buffer larger than the call can carry (nothing was sent).
    #[error("payload of {len} bytes exceeds the {max}-byte limit")]
    TooLarge {
        /// Bytes.
        len: usize,
        /// Limit in bytes.
        max: usize,
    },
    /// No reply before the deadline.
    #[error("call to handler {handler} on node {node} timed out after {after:?}")]
    Timeout {
        /// Node id.
        node: NodeId,
        /// Handler id.
        handler: u16,
        /// The deadline that passed.
        after: Duration,
    },
    /// The node is gone.
    #[error("node {node} is unreachable: {why}")]
    PeerGone {
        /// Node id.
        node: NodeId,
        /// Why.
        #[source]
        why: GoneReason,
    },
    /// The handler answered with an error (including a reply too large for the mode);
    /// `msg` is the server's text.
    #[error("node {node} handler {handler}: {msg}")]
    Remote {
        /// Node id.
        node: NodeId,
        /// Handler id.
        handler: u16,
        /// The server's message.
        msg: String,
    },
    /// A reply that breaks the protocol.
    #[error("node {node}: malformed reply: {what}")]
    Protocol {
        /// Node id.
        node: NodeId,
        /// What is wrong.
        what: &'static str,
    },
    /// The reply's buffer was expired or reused before this call read it (READ mode), or
    /// a zero-copy reply's generation did not match: the call fails rather than return
    /// another call's data.
    #[error("node {node} handler {handler}: reply buffer expired or reused before it was read")]
    Expired {
        /// Node id.
        node: NodeId,
        /// Handler id.
        handler: u16,
    },
    /// No registered buffer free for the reply of [`super::ThreadCtx::call_into`] (the
    /// call itself succeeded).
    #[error("no free registered buffer of {len} bytes for the reply")]
    NoBuffer {
        /// Bytes of the reply.
        len: usize,
    },
    /// The one-sided READ of a READ-mode reply failed.
    #[error("fetching the reply: {0}")]
    Fetch(#[source] OneSidedError),
}

/// Any error of the runtime, for code that mixes operations and uses `?`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RpcError {
    /// Connection setup.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// A one-sided operation.
    #[error(transparent)]
    OneSided(#[from] OneSidedError),
    /// An RPC call.
    #[error(transparent)]
    Call(#[from] CallError),
}

impl From<FabricError> for RpcError {
    fn from(e: FabricError) -> Self {
        Self::Connect(e.into())
    }
}

/// Implements `From` of [`ConnectError`], [`OneSidedError`] and [`CallError`] for an
/// error type `$t` whose variant `$v` holds an [`RpcError`], so that `?` works on every
/// runtime operation in a crate with its own error type (`?` applies one `From` only).
///
/// ```
/// #[derive(Debug, thiserror::Error)]
/// enum MyError {
///     #[error(transparent)]
///     Rpc(#[from] rrpc::runtime::RpcError),
/// }
/// rrpc::from_rpc_errors!(MyError, MyError::Rpc);
/// ```
#[macro_export]
macro_rules! from_rpc_errors {
    ($t:ty, $v:path) => {
        impl From<$crate::runtime::ConnectError> for $t {
            fn from(e: $crate::runtime::ConnectError) -> Self {
                $v(e.into())
            }
        }
        impl From<$crate::runtime::OneSidedError> for $t {
            fn from(e: $crate::runtime::OneSidedError) -> Self {
                $v(e.into())
            }
        }
        impl From<$crate::runtime::CallError> for $t {
            fn from(e: $crate::runtime::CallError) -> Self {
                $v(e.into())
            }
        }
    };
}
