//! Fixed-layout, little-endian wire format of the Lock RPC (handler [`LOCK_HANDLER`]).
//!
//! A request is a header of [`REQ_HEADER_BYTES`] bytes and 1 to [`MAX_ENTRIES`] entries
//! of [`REQ_ENTRY_BYTES`] bytes, one per lock (a transaction locks all its write-set
//! locks on one node with one RPC). The header:
//!
//! | bytes  | field                                                              |
//! |--------|--------------------------------------------------------------------|
//! | 0..8   | `incarnation: u64` (the caller's process incarnation)              |
//! | 8..16  | `seq: u64` (the request's tag, unique per caller incarnation)      |
//! | 16..24 | `epoch: u64` (the lock service epoch the caller's export names)    |
//!
//! An entry:
//!
//! | bytes  | field                              |
//! |--------|------------------------------------|
//! | 0..8   | `lock_id: u64`                     |
//! | 8..16  | `ts: u64` (TSO timestamp)          |
//! | 16     | `mode: u8` (0 cold, 1 hot)         |
//! | 17..20 | padding (zero)                     |
//! | 20..24 | `node: u32` (the caller's node id) |
//!
//! Every entry of one request carries the same `node`. Until the RPC layer tells the
//! service who called, the service records (`node`, `incarnation`) as the owner of the
//! tickets taken, so `release_node` can pass on a failed incarnation's tickets
//! ([`crate::owners`]); once it does, `node` is only checked against the caller. `seq`
//! lets a caller that gave up on the request claim its tickets ([`ABANDON_HANDLER`]);
//! `epoch` lets a restarted service refuse a caller that still speaks to its predecessor.
//!
//! The reply has one entry of [`REPLY_ENTRY_BYTES`] bytes per request entry, same order:
//!
//! | bytes  | field                                                              |
//! |--------|--------------------------------------------------------------------|
//! | 0      | `status: u8` (1 ticket taken, 0 refused)                            |
//! | 1      | `reason: u8` (0 none, 1 timestamp, 2 cold watermark, 3 hot watermark) |
//! | 2..8   | padding (zero)                                                     |
//! | 8..16  | `ticket: u64` (`lower` before the request)                          |
//! | 16..24 | `upper: u64`                                                       |
//! | 24..32 | `queued_ts: u64` (before the request)                               |
//!
//! Decoding never panics: bad lengths, zero or too many entries, unknown mode, status or
//! reason bytes and lock ids outside the table are [`WireError`]s.
//!
//! The three RPCs are typed ([`rrpc::typed`]): [`LockRpc`], [`ReleaseNodeRpc`] and
//! [`AbandonRpc`], whose messages are the `zerocopy` layouts [`LockHead`], [`LockEntry`],
//! [`LockReplyEntry`], [`ReleaseNodeWire`], [`AbandonHead`] and [`NodeTicketEntry`] (the
//! tables above, field by field), a header and its entries sent as an
//! [`rrpc::typed::Batch`] by rrpc's `Fixed` codec. The functions here convert between
//! them and the domain types ([`LockRequest`], [`LockReply`], [`NodeTicket`], ...);
//! that conversion is where the values are checked.

use rrpc::typed::{encode_batch, Batch, BatchRef, Fixed, Rpc};
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::owners::{NodeTicket, Owner};
use crate::takeout::{LockReply, Mode, RefuseReason};

/// RPC handler id of the Lock RPC.
pub const LOCK_HANDLER: u16 = 1;
/// RPC handler id of "release node": hand the caller a failed incarnation's outstanding
/// tickets to pass on. Request ([`RELEASE_NODE_BYTES`], little-endian): `node: u32`,
/// `max: u32` (at least 1), `incarnation: u64` (of the failed node), `epoch: u64` (the
/// service epoch the caller's export names), `caller_node: u32`, padding `u32`,
/// `caller_incarnation: u64`. Reply: up to `max` entries of [`NODE_TICKET_BYTES`]:
/// `lock_id: u64`, `ticket: u64`.
pub const RELEASE_NODE_HANDLER: u16 = 2;
/// RPC handler id of "abandon": the caller gave up on its Lock RPC tagged `seq` (it
/// timed out or failed) and claims the tickets that request took, to pass them on; the
/// service refuses the request if it has not run yet. Request: `node: u32`, `n: u32`
/// (1 to [`MAX_ENTRIES`]), `incarnation: u64`, `seq: u64`, `epoch: u64`, then the
/// request's `n` lock ids (`u64` each). Reply: as [`RELEASE_NODE_HANDLER`]'s.
pub const ABANDON_HANDLER: u16 = 3;
/// RPC handler id of "lock and read", served by a lock service hosted with the data
/// (a memory node's, Scythe 4.3: the lock and its object on one node): a Lock RPC of
/// one entry followed by a read descriptor of [`READ_DESC_BYTES`] bytes, opaque to the
/// lock service and meaningful to the host's [`crate::service::GrantReader`]. The reply
/// is `lock_len: u32` (little-endian), the Lock RPC's reply (`lock_len` bytes), then
/// what the reader wrote when the ticket is served at once (`upper` already at it),
/// nothing otherwise: a hot read is then one RPC instead of a Lock RPC and the READs of
/// its object.
pub const LOCK_READ_HANDLER: u16 = 4;
/// Bytes of a lock-and-read request's read descriptor ([`LOCK_READ_HANDLER`]).
pub const READ_DESC_BYTES: usize = 16;
// The lock service's ids stay in its reserved range (`rrpc::server::ids`).
const _: () = assert!(
    rrpc::server::ids::LOCKD.contains(LOCK_HANDLER)
        && rrpc::server::ids::LOCKD.contains(RELEASE_NODE_HANDLER)
        && rrpc::server::ids::LOCKD.contains(ABANDON_HANDLER)
        && rrpc::server::ids::LOCKD.contains(LOCK_READ_HANDLER)
);
/// Bytes of a release-node request.
pub const RELEASE_NODE_BYTES: usize = 40;
/// Bytes of a Lock RPC request's header.
pub const REQ_HEADER_BYTES: usize = 24;
/// Bytes of an abandon request's header (the lock ids follow).
pub const ABANDON_HEADER_BYTES: usize = 32;
/// Bytes per entry of a release-node reply.
pub const NODE_TICKET_BYTES: usize = 16;
/// Bytes per request entry.
pub const REQ_ENTRY_BYTES: usize = 24;
/// Bytes per reply entry.
pub const REPLY_ENTRY_BYTES: usize = 32;
/// Largest number of entries in one Lock RPC: a reply must fit the 480-byte payload of
/// a default 512-byte Rocket bucket (480 / 32 = 15).
pub const MAX_ENTRIES: usize = 15;

/// One lock a transaction asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockRequest {
    /// Lock index in the service's table (`0..n_locks`).
    pub id: u64,
    /// The transaction's start timestamp (from the TSO).
    pub ts: u64,
    /// Heat mode of the transaction.
    pub mode: Mode,
}

/// Who sends a Lock RPC and which of its requests it is (the request header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    /// The caller as it declares itself (node from the entries, incarnation from the
    /// header).
    pub owner: Owner,
    /// The request's tag, unique per caller incarnation.
    pub seq: u64,
    /// The lock service epoch the caller's export names (0: not checked).
    pub epoch: u64,
}

/// A decoded release-node request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReleaseNodeRequest {
    /// The failed incarnation whose tickets to hand over.
    pub dead: Owner,
    /// Most tickets to hand over (at least 1).
    pub max: usize,
    /// The lock service epoch the caller's export names (0: not checked).
    pub epoch: u64,
    /// The caller as it declares itself.
    pub caller: Owner,
}

/// A decoded abandon request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AbandonRequest {
    /// The caller that gave up, as it declares itself.
    pub owner: Owner,
    /// The abandoned request's tag.
    pub seq: u64,
    /// The lock service epoch the caller's export names (0: not checked).
    pub epoch: u64,
    /// The abandoned request's lock ids.
    pub ids: Vec<u64>,
}

/// Errors decoding or encoding Lock RPC messages.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The length is not a whole number of entries.
    #[error("{len} bytes is not a whole number of {entry}-byte entries")]
    BadLength {
        /// Message length in bytes.
        len: usize,
        /// Entry size in bytes.
        entry: usize,
    },
    /// The message has no entries.
    #[error("empty lock request")]
    Empty,
    /// More entries than [`MAX_ENTRIES`].
    #[error("{n} entries exceed the limit of {max} per Lock RPC")]
    TooMany {
        /// Entries in the message.
        n: usize,
        /// The limit.
        max: usize,
    },
    /// Unknown mode byte.
    #[error("entry {index}: unknown mode byte {byte}")]
    BadMode {
        /// Entry index.
        index: usize,
        /// The byte.
        byte: u8,
    },
    /// Unknown status byte, unknown reason byte, or a status/reason pair that disagrees.
    #[error("entry {index}: invalid status {status} / reason {reason}")]
    BadStatus {
        /// Entry index.
        index: usize,
        /// Status byte.
        status: u8,
        /// Reason byte.
        reason: u8,
    },
    /// A lock id outside the table.
    #[error("entry {index}: lock id {id} outside a table of {n_locks} locks")]
    LockOutOfRange {
        /// Entry index.
        index: usize,
        /// The lock id.
        id: u64,
        /// Table size (locks).
        n_locks: u64,
    },
    /// The same lock twice in one request (the second ticket would wait behind the first
    /// forever).
    #[error("entry {index}: lock id {id} appears twice in one request")]
    Duplicate {
        /// Entry index of the second occurrence.
        index: usize,
        /// The lock id.
        id: u64,
    },
    /// Entries of one request that name different caller nodes.
    #[error("entry {index}: node {node} differs from the first entry's {first}")]
    NodeMismatch {
        /// Entry index.
        index: usize,
        /// The entry's node id.
        node: u32,
        /// The first entry's node id.
        first: u32,
    },
    /// A reply whose entry count differs from the request's.
    #[error("reply has {got} entries, request had {want}")]
    CountMismatch {
        /// Entries in the reply.
        got: usize,
        /// Entries in the request.
        want: usize,
    },
}

/// The header of a Lock RPC request, bytes 0..24 (the module docs' first table).
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned, Clone, Copy, Debug, PartialEq, Eq,
)]
#[repr(C)]
pub struct LockHead {
    /// The caller's process incarnation, bytes 0..8.
    pub incarnation: U64,
    /// The request's tag, unique per caller incarnation, bytes 8..16.
    pub seq: U64,
    /// The lock service epoch the caller's export names (0: not checked), bytes 16..24.
    pub epoch: U64,
}

/// One entry of a Lock RPC request, [`REQ_ENTRY_BYTES`] bytes (the module docs' second
/// table, offsets within the entry).
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned, Clone, Copy, Debug, PartialEq, Eq,
)]
#[repr(C)]
pub struct LockEntry {
    /// The lock's index in the table, bytes 0..8.
    pub lock_id: U64,
    /// The transaction's TSO timestamp, bytes 8..16.
    pub ts: U64,
    /// 0 cold, 1 hot ([`Mode`]), byte 16; other values are [`WireError::BadMode`].
    pub mode: u8,
    /// Zero, bytes 17..20.
    pub pad: [u8; 3],
    /// The caller's node id, bytes 20..24 (the same in every entry of a request).
    pub node: U32,
}

/// One entry of a Lock RPC reply, [`REPLY_ENTRY_BYTES`] bytes (the module docs' third
/// table).
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned, Clone, Copy, Debug, PartialEq, Eq,
)]
#[repr(C)]
pub struct LockReplyEntry {
    /// 1 ticket taken, 0 refused, byte 0.
    pub status: u8,
    /// 0 none, 1 timestamp, 2 cold watermark, 3 hot watermark ([`RefuseReason`]), byte 1.
    pub reason: u8,
    /// Zero, bytes 2..8.
    pub pad: [u8; 6],
    /// `lower` before the request, bytes 8..16.
    pub ticket: U64,
    /// `upper`, bytes 16..24.
    pub upper: U64,
    /// `queued_ts` before the request, bytes 24..32.
    pub queued_ts: U64,
}

/// A release-node request, [`RELEASE_NODE_BYTES`] bytes ([`RELEASE_NODE_HANDLER`]).
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned, Clone, Copy, Debug, PartialEq, Eq,
)]
#[repr(C)]
pub struct ReleaseNodeWire {
    /// The failed node, bytes 0..4.
    pub node: U32,
    /// Most tickets to hand over, at least 1, bytes 4..8.
    pub max: U32,
    /// The failed node's incarnation, bytes 8..16.
    pub incarnation: U64,
    /// The service epoch the caller's export names, bytes 16..24.
    pub epoch: U64,
    /// The caller's node, bytes 24..28.
    pub caller_node: U32,
    /// Zero, bytes 28..32.
    pub pad: [u8; 4],
    /// The caller's incarnation, bytes 32..40.
    pub caller_incarnation: U64,
}

/// The header of an abandon request, [`ABANDON_HEADER_BYTES`] bytes
/// ([`ABANDON_HANDLER`]); the request's lock ids follow, 8 bytes each.
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned, Clone, Copy, Debug, PartialEq, Eq,
)]
#[repr(C)]
pub struct AbandonHead {
    /// The caller's node, bytes 0..4.
    pub node: U32,
    /// How many lock ids follow (1 to [`MAX_ENTRIES`]), bytes 4..8.
    pub n: U32,
    /// The caller's incarnation, bytes 8..16.
    pub incarnation: U64,
    /// The abandoned request's tag, bytes 16..24.
    pub seq: U64,
    /// The service epoch the caller's export names, bytes 24..32.
    pub epoch: U64,
}

/// One ticket of a release-node or abandon reply, [`NODE_TICKET_BYTES`] bytes.
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned, Clone, Copy, Debug, PartialEq, Eq,
)]
#[repr(C)]
pub struct NodeTicketEntry {
    /// The lock, bytes 0..8.
    pub lock_id: U64,
    /// The ticket, bytes 8..16.
    pub ticket: U64,
}

const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<LockHead>() == REQ_HEADER_BYTES);
    assert!(size_of::<LockEntry>() == REQ_ENTRY_BYTES);
    assert!(offset_of!(LockEntry, mode) == 16 && offset_of!(LockEntry, node) == 20);
    assert!(size_of::<LockReplyEntry>() == REPLY_ENTRY_BYTES);
    assert!(offset_of!(LockReplyEntry, ticket) == 8);
    assert!(offset_of!(LockReplyEntry, queued_ts) == 24);
    assert!(size_of::<ReleaseNodeWire>() == RELEASE_NODE_BYTES);
    assert!(offset_of!(ReleaseNodeWire, caller_node) == 24);
    assert!(offset_of!(ReleaseNodeWire, caller_incarnation) == 32);
    assert!(size_of::<AbandonHead>() == ABANDON_HEADER_BYTES);
    assert!(size_of::<NodeTicketEntry>() == NODE_TICKET_BYTES);
};

/// A Lock RPC request: the header, then one entry per lock.
pub type LockBatch = Batch<LockHead, LockEntry>;
/// A Lock RPC reply: one entry per request entry, no header.
pub type LockReplies = Batch<(), LockReplyEntry>;
/// A release-node or abandon reply: the tickets handed over, no header.
pub type NodeTickets = Batch<(), NodeTicketEntry>;

/// The Lock RPC ([`LOCK_HANDLER`]): [`LockBatch`] in, [`LockReplies`] out, fixed layouts
/// (the module docs' tables).
pub struct LockRpc;

impl Rpc for LockRpc {
    const ID: u16 = LOCK_HANDLER;
    type Req = LockBatch;
    type Resp = LockReplies;
    type Codec = Fixed;
}

/// The release-node RPC ([`RELEASE_NODE_HANDLER`]): [`ReleaseNodeWire`] in,
/// [`NodeTickets`] out.
pub struct ReleaseNodeRpc;

impl Rpc for ReleaseNodeRpc {
    const ID: u16 = RELEASE_NODE_HANDLER;
    type Req = ReleaseNodeWire;
    type Resp = NodeTickets;
    type Codec = Fixed;
}

/// The abandon RPC ([`ABANDON_HANDLER`]): an [`AbandonHead`] and the lock ids in,
/// [`NodeTickets`] out.
pub struct AbandonRpc;

impl Rpc for AbandonRpc {
    const ID: u16 = ABANDON_HANDLER;
    type Req = Batch<AbandonHead, U64>;
    type Resp = NodeTickets;
    type Codec = Fixed;
}

/// The entry count of a message of `n` entries, checked: [`WireError::Empty`] for none,
/// [`WireError::TooMany`] past [`MAX_ENTRIES`].
fn count(n: usize) -> Result<usize, WireError> {
    if n == 0 {
        return Err(WireError::Empty);
    }
    if n > MAX_ENTRIES {
        return Err(WireError::TooMany {
            n,
            max: MAX_ENTRIES,
        });
    }
    Ok(n)
}

/// The [`WireError::BadLength`] of bytes the typed codec refused.
fn bad_length(e: &rrpc::typed::DecodeError, entry: usize) -> WireError {
    WireError::BadLength { len: e.len, entry }
}

impl LockHead {
    /// The header of the request `hdr` names.
    pub fn new(hdr: &RequestHeader) -> Self {
        Self {
            incarnation: U64::new(hdr.owner.incarnation),
            seq: U64::new(hdr.seq),
            epoch: U64::new(hdr.epoch),
        }
    }
}

impl LockEntry {
    /// The entry of `r` from node `node`.
    pub fn new(r: &LockRequest, node: u32) -> Self {
        Self {
            lock_id: U64::new(r.id),
            ts: U64::new(r.ts),
            mode: match r.mode {
                Mode::Cold => 0,
                Mode::Hot => 1,
            },
            pad: [0; 3],
            node: U32::new(node),
        }
    }

    /// The lock request of entry `index`, for a table of `n_locks` locks.
    ///
    /// Errors: [`WireError::BadMode`], [`WireError::LockOutOfRange`].
    pub fn request(&self, index: usize, n_locks: u64) -> Result<LockRequest, WireError> {
        let mode = match self.mode {
            0 => Mode::Cold,
            1 => Mode::Hot,
            byte => return Err(WireError::BadMode { index, byte }),
        };
        let id = self.lock_id.get();
        if id >= n_locks {
            return Err(WireError::LockOutOfRange { index, id, n_locks });
        }
        Ok(LockRequest {
            id,
            ts: self.ts.get(),
            mode,
        })
    }
}

/// The Lock RPC request of `reqs` (1 to [`MAX_ENTRIES`]), sent as `hdr` names.
///
/// Errors: [`WireError::Empty`], [`WireError::TooMany`].
pub fn lock_batch(reqs: &[LockRequest], hdr: &RequestHeader) -> Result<LockBatch, WireError> {
    count(reqs.len())?;
    let node = hdr.owner.node;
    Ok(Batch::new(
        LockHead::new(hdr),
        reqs.iter().map(|r| LockEntry::new(r, node)).collect(),
    ))
}

/// Append the bytes of the Lock RPC request of `reqs` (1 to [`MAX_ENTRIES`]), sent as
/// `hdr` names, to `out`: [`LockRpc`]'s encoding of [`lock_batch`]'s value, written
/// without building it (the entries go through the stack).
///
/// Errors: [`WireError::Empty`], [`WireError::TooMany`].
pub fn encode_request(
    reqs: &[LockRequest],
    hdr: &RequestHeader,
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    let n = count(reqs.len())?;
    let mut entries = [LockEntry::new_zeroed(); MAX_ENTRIES];
    for (e, r) in entries.iter_mut().zip(reqs) {
        *e = LockEntry::new(r, hdr.owner.node);
    }
    encode_batch(&LockHead::new(hdr), &entries[..n], out);
    Ok(())
}

/// The timestamp of a request's first entry, `None` for a request too short to have
/// one (the sort key of timestamp-ordered serving).
pub fn first_ts(buf: &[u8]) -> Option<u64> {
    let (e, _) = LockEntry::read_from_prefix(buf.get(REQ_HEADER_BYTES..)?).ok()?;
    Some(e.ts.get())
}

/// A Lock RPC request read in place ([`rrpc::typed::view_request`]).
pub type LockView<'a> = BatchRef<'a, LockHead, LockEntry>;

/// Check a decoded Lock RPC request (`b.as_ref()` of a [`LockBatch`], or a [`LockView`])
/// for a table of `n_locks` locks and return its header; [`lock_requests`] then lists its
/// entries.
///
/// Errors: [`WireError::Empty`], [`WireError::TooMany`], [`WireError::NodeMismatch`],
/// [`WireError::BadMode`], [`WireError::LockOutOfRange`], [`WireError::Duplicate`].
pub fn check_request(b: LockView<'_>, n_locks: u64) -> Result<RequestHeader, WireError> {
    count(b.entries.len())?;
    let first = b.entries[0].node.get();
    for (index, e) in b.entries.iter().enumerate() {
        let node = e.node.get();
        if node != first {
            return Err(WireError::NodeMismatch { index, node, first });
        }
        let id = e.request(index, n_locks)?.id;
        if b.entries[..index].iter().any(|p| p.lock_id.get() == id) {
            return Err(WireError::Duplicate { index, id });
        }
    }
    Ok(RequestHeader {
        owner: Owner {
            node: first,
            incarnation: b.head.incarnation.get(),
        },
        seq: b.head.seq.get(),
        epoch: b.head.epoch.get(),
    })
}

/// The lock requests of a request [`check_request`] accepted for a table of `n_locks`
/// locks, in order (an entry it would refuse is skipped, never a panic).
pub fn lock_requests(b: LockView<'_>, n_locks: u64) -> impl Iterator<Item = LockRequest> + '_ {
    b.entries
        .iter()
        .enumerate()
        .filter_map(move |(i, e)| e.request(i, n_locks).ok())
}

/// Decode a request for a table of `n_locks` locks into `out` (cleared first); returns
/// its header. [`LockRpc`]'s typed decoding (in place), then [`check_request`].
///
/// Errors: [`WireError::BadLength`] for a length that is not a header plus whole
/// entries, and every error of [`check_request`].
pub fn decode_request(
    buf: &[u8],
    n_locks: u64,
    out: &mut Vec<LockRequest>,
) -> Result<RequestHeader, WireError> {
    out.clear();
    let b = rrpc::typed::view_request::<LockRpc, _, _>(buf)
        .map_err(|e| bad_length(&e, REQ_ENTRY_BYTES))?;
    let hdr = check_request(b, n_locks)?;
    out.extend(lock_requests(b, n_locks));
    Ok(hdr)
}

impl LockReplyEntry {
    /// The reply entry of `r`.
    pub fn new(r: &LockReply) -> Self {
        Self {
            status: u8::from(r.granted_queue),
            reason: match r.reason {
                None => 0,
                Some(RefuseReason::Timestamp) => 1,
                Some(RefuseReason::ColdWatermark) => 2,
                Some(RefuseReason::HotWatermark) => 3,
            },
            pad: [0; 6],
            ticket: U64::new(r.ticket),
            upper: U64::new(r.upper),
            queued_ts: U64::new(r.queued_ts),
        }
    }

    /// The reply of entry `index`.
    ///
    /// Errors: [`WireError::BadStatus`] for unknown status or reason bytes, a taken
    /// ticket with a reason, or a refusal without one.
    pub fn reply(&self, index: usize) -> Result<LockReply, WireError> {
        let (status, reason) = (self.status, self.reason);
        let reason = match (status, reason) {
            (1, 0) => None,
            (0, 1) => Some(RefuseReason::Timestamp),
            (0, 2) => Some(RefuseReason::ColdWatermark),
            (0, 3) => Some(RefuseReason::HotWatermark),
            _ => {
                return Err(WireError::BadStatus {
                    index,
                    status,
                    reason,
                })
            }
        };
        Ok(LockReply {
            granted_queue: status == 1,
            reason,
            ticket: self.ticket.get(),
            upper: self.upper.get(),
            queued_ts: self.queued_ts.get(),
        })
    }
}

/// A Lock RPC reply read in place ([`rrpc::typed::view_response`]).
pub type RepliesView<'a> = BatchRef<'a, (), LockReplyEntry>;

/// The replies of a decoded Lock RPC reply (`b.as_ref()` of a [`LockReplies`], or a
/// [`RepliesView`]) to a request of `want` entries, checked as a whole before any is
/// returned, in order.
///
/// Errors: [`WireError::Empty`], [`WireError::TooMany`], [`WireError::CountMismatch`],
/// [`WireError::BadStatus`].
pub fn replies(
    b: RepliesView<'_>,
    want: usize,
) -> Result<impl Iterator<Item = LockReply> + '_, WireError> {
    let n = count(b.entries.len())?;
    if n != want {
        return Err(WireError::CountMismatch { got: n, want });
    }
    for (index, e) in b.entries.iter().enumerate() {
        e.reply(index)?;
    }
    Ok(b.entries.iter().filter_map(|e| e.reply(0).ok()))
}

/// Decode a reply to a request of `want` entries: [`LockRpc`]'s typed decoding, then
/// [`replies`].
///
/// Errors: [`WireError::BadLength`] for a length that is not whole entries, and every
/// error of [`replies`].
pub fn decode_reply(buf: &[u8], want: usize) -> Result<Vec<LockReply>, WireError> {
    let b = rrpc::typed::view_response::<LockRpc, _, _>(buf)
        .map_err(|e| bad_length(&e, REPLY_ENTRY_BYTES))?;
    Ok(replies(b, want)?.collect())
}

/// Append the encoding of one reply entry to `out` (a [`LockReplies`] is these entries
/// back to back).
pub fn encode_reply_entry(r: &LockReply, out: &mut Vec<u8>) {
    encode_batch(&(), &[LockReplyEntry::new(r)], out);
}

impl ReleaseNodeWire {
    /// The wire form of `r` (a `max` past `u32::MAX` is sent as `u32::MAX`).
    pub fn new(r: &ReleaseNodeRequest) -> Self {
        Self {
            node: U32::new(r.dead.node),
            max: U32::new(u32::try_from(r.max).unwrap_or(u32::MAX)),
            incarnation: U64::new(r.dead.incarnation),
            epoch: U64::new(r.epoch),
            caller_node: U32::new(r.caller.node),
            pad: [0; 4],
            caller_incarnation: U64::new(r.caller.incarnation),
        }
    }

    /// The request it carries.
    ///
    /// Errors: [`WireError::Empty`] for `max == 0`.
    pub fn request(&self) -> Result<ReleaseNodeRequest, WireError> {
        let max = self.max.get();
        if max == 0 {
            return Err(WireError::Empty);
        }
        Ok(ReleaseNodeRequest {
            dead: Owner {
                node: self.node.get(),
                incarnation: self.incarnation.get(),
            },
            max: max as usize,
            epoch: self.epoch.get(),
            caller: Owner {
                node: self.caller_node.get(),
                incarnation: self.caller_incarnation.get(),
            },
        })
    }
}

/// Decode a release-node request: [`ReleaseNodeRpc`]'s typed decoding, then
/// [`ReleaseNodeWire::request`].
///
/// Errors: [`WireError::BadLength`] unless [`RELEASE_NODE_BYTES`] bytes;
/// [`WireError::Empty`] for `max == 0`.
pub fn decode_release_node(b: &[u8]) -> Result<ReleaseNodeRequest, WireError> {
    rrpc::typed::decode_request::<ReleaseNodeRpc>(b)
        .map_err(|e| bad_length(&e, RELEASE_NODE_BYTES))?
        .request()
}

/// The abandon request of `r` (1 to [`MAX_ENTRIES`] ids).
///
/// Errors: [`WireError::Empty`], [`WireError::TooMany`].
pub fn abandon_batch(r: &AbandonRequest) -> Result<Batch<AbandonHead, U64>, WireError> {
    let n = count(r.ids.len())?;
    Ok(Batch::new(
        AbandonHead {
            node: U32::new(r.owner.node),
            n: U32::new(n as u32),
            incarnation: U64::new(r.owner.incarnation),
            seq: U64::new(r.seq),
            epoch: U64::new(r.epoch),
        },
        r.ids.iter().map(|&id| U64::new(id)).collect(),
    ))
}

/// The abandon request a decoded one carries.
///
/// Errors: [`WireError::Empty`], [`WireError::TooMany`], [`WireError::CountMismatch`]
/// when the count field disagrees with the ids sent.
pub fn abandon_request(b: &Batch<AbandonHead, U64>) -> Result<AbandonRequest, WireError> {
    let n = count(b.entries.len())?;
    let want = b.head.n.get() as usize;
    if want != n {
        return Err(WireError::CountMismatch { got: n, want });
    }
    Ok(AbandonRequest {
        owner: Owner {
            node: b.head.node.get(),
            incarnation: b.head.incarnation.get(),
        },
        seq: b.head.seq.get(),
        epoch: b.head.epoch.get(),
        ids: b.entries.iter().map(|id| id.get()).collect(),
    })
}

/// Decode an abandon request: [`AbandonRpc`]'s typed decoding, then
/// [`abandon_request`].
///
/// Errors: [`WireError::BadLength`] for a length that is not a header plus whole ids,
/// and every error of [`abandon_request`].
pub fn decode_abandon(b: &[u8]) -> Result<AbandonRequest, WireError> {
    abandon_request(&rrpc::typed::decode_request::<AbandonRpc>(b).map_err(|e| bad_length(&e, 8))?)
}

/// The release-node or abandon reply of tickets `t`.
pub fn node_tickets(t: &[NodeTicket]) -> NodeTickets {
    Batch::new(
        (),
        t.iter()
            .map(|nt| NodeTicketEntry {
                lock_id: U64::new(nt.id),
                ticket: U64::new(nt.ticket),
            })
            .collect(),
    )
}

/// The tickets of a decoded release-node or abandon reply (possibly none).
pub fn tickets(b: &NodeTickets) -> Vec<NodeTicket> {
    b.entries
        .iter()
        .map(|e| NodeTicket {
            id: e.lock_id.get(),
            ticket: e.ticket.get(),
        })
        .collect()
}

/// Decode a release-node or abandon reply (possibly empty).
///
/// Errors: [`WireError::BadLength`] for a length that is not a whole number of entries.
pub fn decode_node_tickets(b: &[u8]) -> Result<Vec<NodeTicket>, WireError> {
    let r = rrpc::typed::decode_response::<ReleaseNodeRpc>(b)
        .map_err(|e| bad_length(&e, NODE_TICKET_BYTES))?;
    Ok(tickets(&r))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(id: u64, ts: u64, mode: Mode) -> LockRequest {
        LockRequest { id, ts, mode }
    }

    fn hdr(node: u32) -> RequestHeader {
        RequestHeader {
            owner: Owner {
                node,
                incarnation: 3,
            },
            seq: 4,
            epoch: 5,
        }
    }

    #[test]
    fn request_round_trip_and_layout() {
        let reqs = [
            req(7, 0x0102_0304_0506_0708, Mode::Hot),
            req(0, 1, Mode::Cold),
        ];
        let mut buf = Vec::new();
        encode_request(&reqs, &hdr(0x0a0b_0c0d), &mut buf).unwrap();
        assert_eq!(buf.len(), 72);
        assert_eq!(&buf[0..8], &3u64.to_le_bytes(), "incarnation");
        assert_eq!(&buf[8..16], &4u64.to_le_bytes(), "seq");
        assert_eq!(&buf[16..24], &5u64.to_le_bytes(), "epoch");
        let e = &buf[REQ_HEADER_BYTES..];
        assert_eq!(&e[0..8], &7u64.to_le_bytes());
        assert_eq!(e[8], 0x08, "little endian");
        assert_eq!(e[16], 1);
        assert_eq!(&e[17..20], &[0; 3]);
        assert_eq!(&e[20..24], &[0x0d, 0x0c, 0x0b, 0x0a]);
        assert_eq!(first_ts(&buf), Some(0x0102_0304_0506_0708));
        let mut out = Vec::new();
        assert_eq!(decode_request(&buf, 8, &mut out), Ok(hdr(0x0a0b_0c0d)));
        assert_eq!(out, reqs);
        // Entries naming different nodes are refused.
        buf[REQ_HEADER_BYTES + 44] ^= 1;
        assert_eq!(
            decode_request(&buf, 8, &mut out),
            Err(WireError::NodeMismatch {
                index: 1,
                node: 0x0a0b_0c0c,
                first: 0x0a0b_0c0d
            })
        );
    }

    /// The typed layouts are the module docs' tables: a Lock request's header and entry
    /// and a reply entry at the documented offsets, through [`LockRpc`]'s codec.
    #[test]
    fn typed_lock_messages_have_the_documented_layout() {
        let hdr = RequestHeader {
            owner: Owner {
                node: 0x0a0b_0c0d,
                incarnation: 0x1112_1314_1516_1718,
            },
            seq: 0x2122_2324_2526_2728,
            epoch: 0x3132_3334_3536_3738,
        };
        let r = req(0x4142_4344_4546_4748, 0x5152_5354_5556_5758, Mode::Hot);
        let mut b = Vec::new();
        rrpc::typed::encode_request::<LockRpc>(&lock_batch(&[r], &hdr).unwrap(), &mut b).unwrap();
        let le = |v: u64| v.to_le_bytes();
        assert_eq!(b.len(), REQ_HEADER_BYTES + REQ_ENTRY_BYTES);
        assert_eq!(b[0..8], le(hdr.owner.incarnation), "0..8 incarnation");
        assert_eq!(b[8..16], le(hdr.seq), "8..16 seq");
        assert_eq!(b[16..24], le(hdr.epoch), "16..24 epoch");
        let e = &b[REQ_HEADER_BYTES..];
        assert_eq!(e[0..8], le(r.id), "entry 0..8 lock_id");
        assert_eq!(e[8..16], le(r.ts), "entry 8..16 ts");
        assert_eq!(e[16], 1, "entry 16 mode (hot)");
        assert_eq!(e[17..20], [0; 3], "entry 17..20 padding");
        assert_eq!(e[20..24], 0x0a0b_0c0du32.to_le_bytes(), "entry 20..24 node");
        // The hand-free encoder writes the same bytes.
        let mut same = Vec::new();
        encode_request(&[r], &hdr, &mut same).unwrap();
        assert_eq!(same, b);

        let reply = LockReply {
            granted_queue: false,
            reason: Some(RefuseReason::ColdWatermark),
            ticket: 0x6162_6364_6566_6768,
            upper: 0x7172_7374_7576_7778,
            queued_ts: 0x8182_8384_8586_8788,
        };
        let mut b = Vec::new();
        let replies_batch = Batch::new((), vec![LockReplyEntry::new(&reply)]);
        rrpc::typed::encode_response::<LockRpc>(&replies_batch, &mut b).unwrap();
        assert_eq!(b.len(), REPLY_ENTRY_BYTES);
        assert_eq!(b[0], 0, "0 status (refused)");
        assert_eq!(b[1], 2, "1 reason (cold watermark)");
        assert_eq!(b[2..8], [0; 6], "2..8 padding");
        assert_eq!(b[8..16], le(reply.ticket), "8..16 ticket");
        assert_eq!(b[16..24], le(reply.upper), "16..24 upper");
        assert_eq!(b[24..32], le(reply.queued_ts), "24..32 queued_ts");
        let mut same = Vec::new();
        encode_reply_entry(&reply, &mut same);
        assert_eq!(same, b);
        assert_eq!(decode_reply(&b, 1), Ok(vec![reply]));
    }

    #[test]
    fn release_node_messages_round_trip_and_refuse_garbage() {
        let own = |node, incarnation| Owner { node, incarnation };
        let r = ReleaseNodeRequest {
            dead: own(7, 11),
            max: 3,
            epoch: 12,
            caller: own(9, 13),
        };
        let enc = |r: &ReleaseNodeRequest| {
            let mut b = Vec::new();
            rrpc::typed::encode_request::<ReleaseNodeRpc>(&ReleaseNodeWire::new(r), &mut b)
                .unwrap();
            b
        };
        let b = enc(&r);
        assert_eq!(b.len(), RELEASE_NODE_BYTES);
        assert_eq!(
            (&b[..4], &b[4..8], &b[8..16]),
            (
                &[7, 0, 0, 0][..],
                &[3, 0, 0, 0][..],
                &11u64.to_le_bytes()[..]
            ),
            "node, max, incarnation"
        );
        assert_eq!(&b[16..24], &12u64.to_le_bytes(), "epoch");
        assert_eq!(
            &b[24..32],
            &[9, 0, 0, 0, 0, 0, 0, 0],
            "caller node, padding"
        );
        assert_eq!(&b[32..40], &13u64.to_le_bytes(), "caller incarnation");
        assert_eq!(decode_release_node(&b), Ok(r));
        assert_eq!(
            decode_release_node(&enc(&ReleaseNodeRequest { max: 0, ..r })),
            Err(WireError::Empty)
        );
        assert_eq!(
            decode_release_node(&[1, 2, 3]),
            Err(WireError::BadLength {
                len: 3,
                entry: RELEASE_NODE_BYTES
            })
        );
        let a = AbandonRequest {
            owner: own(9, 13),
            seq: 77,
            epoch: 12,
            ids: vec![4, u64::MAX],
        };
        let mut b = Vec::new();
        rrpc::typed::encode_request::<AbandonRpc>(&abandon_batch(&a).unwrap(), &mut b).unwrap();
        assert_eq!(b.len(), ABANDON_HEADER_BYTES + 16);
        assert_eq!(&b[..8], &[9, 0, 0, 0, 2, 0, 0, 0], "node, count");
        assert_eq!(&b[16..24], &77u64.to_le_bytes(), "seq");
        assert_eq!(&b[32..40], &4u64.to_le_bytes(), "first id");
        assert_eq!(decode_abandon(&b), Ok(a.clone()));
        assert!(
            decode_abandon(&b[..ABANDON_HEADER_BYTES + 8]).is_err(),
            "count disagrees"
        );
        assert!(
            decode_abandon(&b[..ABANDON_HEADER_BYTES]).is_err(),
            "no ids"
        );
        assert!(decode_abandon(&b[..20]).is_err());
        let none = AbandonRequest {
            ids: Vec::new(),
            ..a.clone()
        };
        assert_eq!(abandon_batch(&none), Err(WireError::Empty));
        let t = [
            NodeTicket { id: 1, ticket: 9 },
            NodeTicket {
                id: u64::MAX,
                ticket: 0,
            },
        ];
        let mut b = Vec::new();
        rrpc::typed::encode_response::<ReleaseNodeRpc>(&node_tickets(&t), &mut b).unwrap();
        assert_eq!(b.len(), 2 * NODE_TICKET_BYTES);
        assert_eq!((b[0], b[8]), (1, 9), "lock id, ticket");
        assert_eq!(decode_node_tickets(&b).unwrap(), t);
        assert_eq!(decode_node_tickets(&[]).unwrap(), vec![]);
        assert!(decode_node_tickets(&b[..17]).is_err());
    }

    #[test]
    fn bad_requests_are_errors() {
        let mut out = Vec::new();
        let mut buf = Vec::new();
        encode_request(&[req(1, 1, Mode::Cold)], &hdr(1), &mut buf).unwrap();
        assert!(matches!(
            decode_request(&buf[..23], 8, &mut out),
            Err(WireError::BadLength { len: 23, .. })
        ));
        assert_eq!(
            decode_request(&buf[..REQ_HEADER_BYTES], 8, &mut out),
            Err(WireError::Empty)
        );
        let mut bad_mode = buf.clone();
        bad_mode[REQ_HEADER_BYTES + 16] = 2;
        assert_eq!(
            decode_request(&bad_mode, 8, &mut out),
            Err(WireError::BadMode { index: 0, byte: 2 })
        );
        assert!(matches!(
            decode_request(&buf, 1, &mut out),
            Err(WireError::LockOutOfRange {
                id: 1,
                n_locks: 1,
                ..
            })
        ));
        let many: Vec<_> = (0..16).map(|i| req(i, 1, Mode::Hot)).collect();
        assert!(matches!(
            encode_request(&many, &hdr(1), &mut Vec::new()),
            Err(WireError::TooMany { n: 16, max: 15 })
        ));
        let mut big = Vec::new();
        encode_request(&many[..15], &hdr(1), &mut big).unwrap();
        big.extend_from_within(REQ_HEADER_BYTES..2 * REQ_HEADER_BYTES);
        assert!(matches!(
            decode_request(&big, 100, &mut out),
            Err(WireError::TooMany { n: 16, .. })
        ));
        let mut dup = Vec::new();
        encode_request(
            &[req(3, 1, Mode::Hot), req(3, 2, Mode::Hot)],
            &hdr(1),
            &mut dup,
        )
        .unwrap();
        assert_eq!(
            decode_request(&dup, 8, &mut out),
            Err(WireError::Duplicate { index: 1, id: 3 })
        );
        assert_eq!(
            encode_request(&[], &hdr(1), &mut Vec::new()),
            Err(WireError::Empty)
        );
    }

    #[test]
    fn reply_round_trip_and_errors() {
        let replies = [
            LockReply {
                granted_queue: true,
                reason: None,
                ticket: 5,
                upper: 3,
                queued_ts: 9,
            },
            LockReply {
                granted_queue: false,
                reason: Some(RefuseReason::HotWatermark),
                ticket: 20,
                upper: 9,
                queued_ts: 11,
            },
        ];
        let mut buf = Vec::new();
        for r in &replies {
            encode_reply_entry(r, &mut buf);
        }
        assert_eq!(buf.len(), 64);
        assert_eq!(decode_reply(&buf, 2).unwrap(), replies);
        assert_eq!(
            decode_reply(&buf, 1),
            Err(WireError::CountMismatch { got: 2, want: 1 })
        );
        assert!(decode_reply(&buf[..40], 1).is_err());
        for (status, reason) in [(1, 1), (0, 0), (2, 0), (0, 4)] {
            let mut b = buf.clone();
            b[0] = status;
            b[1] = reason;
            assert!(
                matches!(
                    decode_reply(&b, 2),
                    Err(WireError::BadStatus { index: 0, .. })
                ),
                "status {status} reason {reason}"
            );
        }
        assert_eq!(MAX_ENTRIES * REPLY_ENTRY_BYTES, 480);
    }
}
