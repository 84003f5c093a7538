//! Errors of the lock clients (Takeout [`crate::client`] and [`crate::ticket`], and the
//! one-sided baselines [`crate::baseline`] and [`crate::kinds`]), with the one helper that
//! turns a short READ of lock words into one.

use std::time::Duration;

use rrpc::runtime::RpcError;

use crate::takeout::LockReply;

/// Errors of lock-client operations.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The RPC or one-sided operation failed (timeout, peer gone, remote handler error).
    #[error(transparent)]
    Rpc(#[from] RpcError),
    /// The service answered something this client cannot interpret, or the lock's words
    /// contradict the protocol (e.g. `upper` passed our ticket).
    #[error("lock protocol: {0}")]
    Protocol(String),
    /// The ticket was not served before the deadline. The [`crate::ticket::Ticket`] keeps its place in
    /// the queue: wait again, or release it (which waits for its turn).
    #[error("lock {id}: ticket {ticket} not served before the deadline (upper {upper})")]
    WaitTimeout {
        /// Lock id.
        id: u64,
        /// Our ticket.
        ticket: u64,
        /// The last `upper` read.
        upper: u64,
    },
    /// A release could not pass the lock on: waiting for the ticket's turn or the FAA
    /// of `upper` failed (Takeout), the release WRITE or CAS failed (CAS lock), or the
    /// release FAA or the counter reset failed (DSLR). The lock may stay stalled at this
    /// ticket until the service recovers it.
    #[error("lock {id}: ticket {ticket} lost, the lock was not passed on")]
    Lost {
        /// Lock id.
        id: u64,
        /// The ticket (Takeout), the holder id (CAS lock) or the ticket's snapshot word
        /// (DSLR).
        ticket: u64,
        /// Why.
        #[source]
        cause: Box<LockError>,
    },
    /// A baseline lock ([`crate::cas`], [`crate::dslr`]) or a Takeout ticket taken through
    /// [`crate::kinds::AnyLockClient`] was not acquired within the acquire timeout. A DSLR
    /// or Takeout ticket already drawn is released by a coroutine of its own when its turn
    /// comes.
    #[error("lock {id}: not acquired within {waited:?}")]
    Timeout {
        /// Lock id.
        id: u64,
        /// How long the acquire tried.
        waited: Duration,
    },
    /// The Lock RPC refused a Takeout ticket requested through
    /// [`crate::kinds::AnyLockClient`] (the reply says why); nothing to release.
    #[error("lock {}: Takeout ticket refused ({:?})", .id, .reply.reason)]
    Refused {
        /// Lock id.
        id: u64,
        /// The service's reply.
        reply: LockReply,
    },
    /// The lock service restarted: the request named the epoch of a predecessor whose
    /// table died with it (the service's message). Reconnect
    /// ([`crate::client::LockClient::reconnect`]); tickets of the old table are gone.
    #[error("lock service restarted: {0}")]
    Restarted(String),
    /// The lock service restarted and grants nothing during its grace period (the
    /// service's message says how long is left,
    /// [`crate::service::LockTable::set_grace`]); nothing was granted. Retry later.
    #[error("{0}")]
    Restarting(String),
    /// The node exports no usable lock table.
    #[error("lock service export: {0}")]
    Export(String),
    /// The caller's request cannot be sent (no entries, more than 15, lock id outside the
    /// table).
    #[error("invalid lock request: {0}")]
    InvalidRequest(String),
}

rrpc::from_rpc_errors!(LockError, LockError::Rpc);

/// The little-endian 8-byte word at byte `off` of a READ's `b` (a lock's words as the
/// peer's memory holds them).
///
/// Errors: [`LockError::Protocol`] when the READ returned fewer than `off + 8` bytes.
pub(crate) fn word(b: &[u8], off: usize) -> Result<u64, LockError> {
    b.get(off..off + 8)
        .and_then(|w| w.try_into().ok())
        .map(u64::from_le_bytes)
        .ok_or_else(|| LockError::Protocol(format!("short READ of {} bytes", b.len())))
}

impl LockError {
    /// Whether this error says the service is gone or restarted, so that the connection
    /// must be made again ([`crate::client::LockConn`]): a refusal naming an old epoch, a
    /// peer unreachable, not connected or not answering in time, a failed one-sided
    /// operation, or a lost release with such a cause. Not a refusal of the request, a
    /// timed-out wait or a malformed request.
    pub fn service_gone(&self) -> bool {
        use rrpc::runtime::CallError;
        match self {
            LockError::Lost { cause, .. } => cause.service_gone(),
            LockError::Restarted(_) => true,
            LockError::Rpc(
                RpcError::Call(
                    CallError::PeerGone { .. }
                    | CallError::NotConnected { .. }
                    | CallError::Timeout { .. },
                )
                | RpcError::OneSided(_),
            ) => true,
            _ => false,
        }
    }
}
