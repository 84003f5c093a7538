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
// The lock service's ids stay in its reserved range (`rrpc::server::ids`).
const _: () = assert!(
    rrpc::server::ids::LOCKD.contains(LOCK_HANDLER)
        && rrpc::server::ids::LOCKD.contains(RELEASE_NODE_HANDLER)
        && rrpc::server::ids::LOCKD.contains(ABANDON_HANDLER)
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

fn mode_byte(m: Mode) -> u8 {
    match m {
        Mode::Cold => 0,
        Mode::Hot => 1,
    }
}

fn reason_byte(r: Option<RefuseReason>) -> u8 {
    match r {
        None => 0,
        Some(RefuseReason::Timestamp) => 1,
        Some(RefuseReason::ColdWatermark) => 2,
        Some(RefuseReason::HotWatermark) => 3,
    }
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(w)
}

fn count_after(len: usize, header: usize, entry: usize) -> Result<usize, WireError> {
    if len < header {
        return Err(WireError::BadLength { len, entry });
    }
    count(len - header, entry)
}

fn count(len: usize, entry: usize) -> Result<usize, WireError> {
    // (`is_multiple_of` would need Rust 1.87; the workspace supports 1.85.)
    let n = len / entry;
    if n * entry != len {
        return Err(WireError::BadLength { len, entry });
    }
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

/// Append the encoding of `reqs`, sent as the request `hdr` names, to `out`.
///
/// Errors: [`WireError::Empty`], [`WireError::TooMany`].
pub fn encode_request(
    reqs: &[LockRequest],
    hdr: &RequestHeader,
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    count(reqs.len(), 1)?;
    out.extend_from_slice(&hdr.owner.incarnation.to_le_bytes());
    out.extend_from_slice(&hdr.seq.to_le_bytes());
    out.extend_from_slice(&hdr.epoch.to_le_bytes());
    for r in reqs {
        out.extend_from_slice(&r.id.to_le_bytes());
        out.extend_from_slice(&r.ts.to_le_bytes());
        out.push(mode_byte(r.mode));
        out.extend_from_slice(&[0; 3]);
        out.extend_from_slice(&hdr.owner.node.to_le_bytes());
    }
    Ok(())
}

/// The timestamp of a request's first entry, `None` for a request too short to have
/// one (the sort key of timestamp-ordered serving).
pub fn first_ts(buf: &[u8]) -> Option<u64> {
    let at = REQ_HEADER_BYTES + 8;
    Some(u64::from_le_bytes(buf.get(at..at + 8)?.try_into().ok()?))
}

/// Decode a request for a table of `n_locks` locks into `out` (cleared first); returns
/// its header.
///
/// Errors: every malformed input listed on [`WireError`], including duplicate lock ids
/// and entries naming different nodes.
pub fn decode_request(
    buf: &[u8],
    n_locks: u64,
    out: &mut Vec<LockRequest>,
) -> Result<RequestHeader, WireError> {
    out.clear();
    let n = count_after(buf.len(), REQ_HEADER_BYTES, REQ_ENTRY_BYTES)?;
    let (head, entries) = buf.split_at(REQ_HEADER_BYTES);
    let node_at = |e: &[u8]| u32::from_le_bytes([e[20], e[21], e[22], e[23]]);
    let first = node_at(entries);
    for (index, e) in entries.chunks_exact(REQ_ENTRY_BYTES).enumerate() {
        let node = node_at(e);
        if node != first {
            return Err(WireError::NodeMismatch { index, node, first });
        }
        let id = u64_at(e, 0);
        let ts = u64_at(e, 8);
        let mode = match e[16] {
            0 => Mode::Cold,
            1 => Mode::Hot,
            byte => return Err(WireError::BadMode { index, byte }),
        };
        if id >= n_locks {
            return Err(WireError::LockOutOfRange { index, id, n_locks });
        }
        if out.iter().any(|r| r.id == id) {
            return Err(WireError::Duplicate { index, id });
        }
        out.push(LockRequest { id, ts, mode });
    }
    debug_assert_eq!(out.len(), n);
    Ok(RequestHeader {
        owner: Owner {
            node: first,
            incarnation: u64_at(head, 0),
        },
        seq: u64_at(head, 8),
        epoch: u64_at(head, 16),
    })
}

/// Append the encoding of one reply entry to `out`.
pub fn encode_reply_entry(r: &LockReply, out: &mut Vec<u8>) {
    out.push(u8::from(r.granted_queue));
    out.push(reason_byte(r.reason));
    out.extend_from_slice(&[0; 6]);
    out.extend_from_slice(&r.ticket.to_le_bytes());
    out.extend_from_slice(&r.upper.to_le_bytes());
    out.extend_from_slice(&r.queued_ts.to_le_bytes());
}

/// Decode a reply to a request of `want` entries.
///
/// Errors: [`WireError::BadLength`], [`WireError::Empty`], [`WireError::TooMany`],
/// [`WireError::CountMismatch`], [`WireError::BadStatus`] (unknown bytes, or a taken
/// ticket with a reason, or a refusal without one).
pub fn decode_reply(buf: &[u8], want: usize) -> Result<Vec<LockReply>, WireError> {
    let n = count(buf.len(), REPLY_ENTRY_BYTES)?;
    if n != want {
        return Err(WireError::CountMismatch { got: n, want });
    }
    buf.chunks_exact(REPLY_ENTRY_BYTES)
        .enumerate()
        .map(|(index, e)| {
            let (status, reason) = (e[0], e[1]);
            let bad = WireError::BadStatus {
                index,
                status,
                reason,
            };
            let reason = match (status, reason) {
                (1, 0) => None,
                (0, 1) => Some(RefuseReason::Timestamp),
                (0, 2) => Some(RefuseReason::ColdWatermark),
                (0, 3) => Some(RefuseReason::HotWatermark),
                _ => return Err(bad),
            };
            Ok(LockReply {
                granted_queue: status == 1,
                reason,
                ticket: u64_at(e, 8),
                upper: u64_at(e, 16),
                queued_ts: u64_at(e, 24),
            })
        })
        .collect()
}

/// Encode a release-node request.
pub fn encode_release_node(r: &ReleaseNodeRequest) -> [u8; RELEASE_NODE_BYTES] {
    let mut b = [0u8; RELEASE_NODE_BYTES];
    b[..4].copy_from_slice(&r.dead.node.to_le_bytes());
    b[4..8].copy_from_slice(&u32::try_from(r.max).unwrap_or(u32::MAX).to_le_bytes());
    b[8..16].copy_from_slice(&r.dead.incarnation.to_le_bytes());
    b[16..24].copy_from_slice(&r.epoch.to_le_bytes());
    b[24..28].copy_from_slice(&r.caller.node.to_le_bytes());
    b[32..40].copy_from_slice(&r.caller.incarnation.to_le_bytes());
    b
}

/// Decode a release-node request.
///
/// Errors: [`WireError::BadLength`] unless [`RELEASE_NODE_BYTES`] bytes;
/// [`WireError::Empty`] for `max == 0`.
pub fn decode_release_node(b: &[u8]) -> Result<ReleaseNodeRequest, WireError> {
    if b.len() != RELEASE_NODE_BYTES {
        return Err(WireError::BadLength {
            len: b.len(),
            entry: RELEASE_NODE_BYTES,
        });
    }
    let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    let max = u32_at(4);
    if max == 0 {
        return Err(WireError::Empty);
    }
    Ok(ReleaseNodeRequest {
        dead: Owner {
            node: u32_at(0),
            incarnation: u64_at(b, 8),
        },
        max: max as usize,
        epoch: u64_at(b, 16),
        caller: Owner {
            node: u32_at(24),
            incarnation: u64_at(b, 32),
        },
    })
}

/// Append the encoding of an abandon request to `out`.
///
/// Errors: [`WireError::Empty`], [`WireError::TooMany`].
pub fn encode_abandon(r: &AbandonRequest, out: &mut Vec<u8>) -> Result<(), WireError> {
    let n = count(r.ids.len(), 1)?;
    out.extend_from_slice(&r.owner.node.to_le_bytes());
    out.extend_from_slice(&(n as u32).to_le_bytes());
    out.extend_from_slice(&r.owner.incarnation.to_le_bytes());
    out.extend_from_slice(&r.seq.to_le_bytes());
    out.extend_from_slice(&r.epoch.to_le_bytes());
    for id in &r.ids {
        out.extend_from_slice(&id.to_le_bytes());
    }
    Ok(())
}

/// Decode an abandon request.
///
/// Errors: [`WireError::BadLength`], [`WireError::Empty`], [`WireError::TooMany`],
/// [`WireError::CountMismatch`] when the count field disagrees with the ids sent.
pub fn decode_abandon(b: &[u8]) -> Result<AbandonRequest, WireError> {
    let n = count_after(b.len(), ABANDON_HEADER_BYTES, 8)?;
    let want = u32::from_le_bytes([b[4], b[5], b[6], b[7]]) as usize;
    if want != n {
        return Err(WireError::CountMismatch { got: n, want });
    }
    Ok(AbandonRequest {
        owner: Owner {
            node: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            incarnation: u64_at(b, 8),
        },
        seq: u64_at(b, 16),
        epoch: u64_at(b, 24),
        ids: b[ABANDON_HEADER_BYTES..]
            .chunks_exact(8)
            .map(|e| u64_at(e, 0))
            .collect(),
    })
}

/// Append the encoding of a release-node reply to `out`.
pub fn encode_node_tickets(t: &[NodeTicket], out: &mut Vec<u8>) {
    for nt in t {
        out.extend_from_slice(&nt.id.to_le_bytes());
        out.extend_from_slice(&nt.ticket.to_le_bytes());
    }
}

/// Decode a release-node reply (possibly empty).
///
/// Errors: [`WireError::BadLength`] for a length that is not a whole number of entries.
pub fn decode_node_tickets(b: &[u8]) -> Result<Vec<NodeTicket>, WireError> {
    if !b.len().is_multiple_of(NODE_TICKET_BYTES) {
        return Err(WireError::BadLength {
            len: b.len(),
            entry: NODE_TICKET_BYTES,
        });
    }
    Ok(b.chunks_exact(NODE_TICKET_BYTES)
        .map(|e| NodeTicket {
            id: u64_at(e, 0),
            ticket: u64_at(e, 8),
        })
        .collect())
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

    #[test]
    fn release_node_messages_round_trip_and_refuse_garbage() {
        let own = |node, incarnation| Owner { node, incarnation };
        let r = ReleaseNodeRequest {
            dead: own(7, 11),
            max: 3,
            epoch: 12,
            caller: own(9, 13),
        };
        assert_eq!(decode_release_node(&encode_release_node(&r)), Ok(r));
        assert_eq!(
            decode_release_node(&encode_release_node(&ReleaseNodeRequest { max: 0, ..r })),
            Err(WireError::Empty)
        );
        assert!(decode_release_node(&[1, 2, 3]).is_err());
        let a = AbandonRequest {
            owner: own(9, 13),
            seq: 77,
            epoch: 12,
            ids: vec![4, u64::MAX],
        };
        let mut b = Vec::new();
        encode_abandon(&a, &mut b).unwrap();
        assert_eq!(b.len(), ABANDON_HEADER_BYTES + 16);
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
        let t = [
            NodeTicket { id: 1, ticket: 9 },
            NodeTicket {
                id: u64::MAX,
                ticket: 0,
            },
        ];
        let mut b = Vec::new();
        encode_node_tickets(&t, &mut b);
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
