//! Fixed-layout, little-endian wire format of the lock-table RPCs (Lotus 4.1, 4.2: one
//! message carries all of a transaction's lock or unlock operations for one node).
//!
//! Request of [`TABLE_OPS_HANDLER`]: the sender's incarnation (`u64`, [`OPS_HEADER_BYTES`]),
//! then 1 to [`MAX_OPS`] entries of [`OP_BYTES`] bytes:
//!
//! | bytes  | field                                                  |
//! |--------|--------------------------------------------------------|
//! | 0..8   | `key: u64` ([`LockKey`], shard in the low 12 bits)     |
//! | 8..16  | `txn: u64` (transaction id, unique per compute node)   |
//! | 16..20 | `node: u32` (the transaction's compute node)           |
//! | 20     | `op: u8` (0 lock read, 1 lock write, 2 unlock)         |
//! | 21..24 | padding (zero)                                         |
//!
//! A lock-write op from a transaction that holds the key for read is its read-to-write
//! upgrade ([`crate::lock_table::upgrade`]): granted iff it is the only holder, else
//! refused as no-upgrade (the spec's "op 3 upgrade" is not a separate op).
//!
//! Every op's `node` is the sender's, and the header's incarnation that node's (until
//! the RPC layer names the caller, which then wins).
//!
//! Reply: a 16-byte header, the serving node's map version (`u64`) and its service epoch
//! (`u64`; a restarted service answers in a larger one, and its table holds none of its
//! predecessor's locks), then one
//! [`OUTCOME_BYTES`]-byte entry per request entry, same order: `status: u8` (see
//! [`OpOutcome`]'s codes), 7 bytes of padding. A wrong-shard outcome's current map
//! version is the header.
//!
//! Decoding never panics: bad lengths, zero or too many entries and unknown bytes are
//! [`TableWireError`]s.

use crate::lock_table::{LockMode, Refusal};
use crate::shard::LockKey;

/// Handler id of the batched lock / unlock RPC.
pub const TABLE_OPS_HANDLER: u16 = 20;
/// Handler id of "send me your shard map" (empty request; reply [`crate::shard::ShardMap::encode`]).
pub const TABLE_MAP_HANDLER: u16 = 21;
/// Handler id of "install this map if newer" (request: an encoded map; reply: the
/// node's map version after, 8 bytes).
pub const TABLE_INSTALL_HANDLER: u16 = 22;
/// Handler id of the drain control of a move (request [`DrainReq`], 5 bytes; reply: locks
/// held on the range, `u64`).
pub const TABLE_DRAIN_HANDLER: u16 = 23;
/// Handler id of "release every lock of compute node N" (request: `node: u32` for
/// every incarnation of the node, or `node: u32, incarnation: u64` for one; reply: locks
/// released, `u64`; Lotus 6).
pub const TABLE_RELEASE_NODE_HANDLER: u16 = 24;
// The lock tables' ids stay in their reserved range (`rrpc::server::ids`).
const _: () = {
    let r = rrpc::server::ids::LOCK_TABLES;
    assert!(
        r.contains(TABLE_OPS_HANDLER)
            && r.contains(TABLE_MAP_HANDLER)
            && r.contains(TABLE_INSTALL_HANDLER)
            && r.contains(TABLE_DRAIN_HANDLER)
            && r.contains(TABLE_RELEASE_NODE_HANDLER)
    );
};

/// Bytes per request entry.
pub const OP_BYTES: usize = 24;
/// Bytes per reply entry.
pub const OUTCOME_BYTES: usize = 8;
/// Bytes of the reply header (the map version and the service epoch).
pub const REPLY_HEADER_BYTES: usize = 16;
/// Bytes of a request's header (the sender's incarnation).
pub const OPS_HEADER_BYTES: usize = 8;
/// Most operations in one message: a request must fit the 480-byte payload of a default
/// 512-byte Rocket bucket ((480 - 8) / 24 = 19).
pub const MAX_OPS: usize = 19;
const _: () = assert!(OPS_HEADER_BYTES + MAX_OPS * OP_BYTES <= 480);

/// What to do to a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// Acquire in this mode.
    Lock(LockMode),
    /// Release what the transaction holds.
    Unlock,
}

/// One lock-table operation of a transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TableOp {
    /// The key.
    pub key: LockKey,
    /// Transaction id (unique per compute node).
    pub txn: u64,
    /// The transaction's compute node.
    pub node: u32,
    /// Lock or unlock.
    pub kind: OpKind,
}

/// The answer to one [`TableOp`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpOutcome {
    /// The lock is held (newly, or already by this transaction). Code 0.
    Granted,
    /// The lock was released. Code 1.
    Released,
    /// Unlock of a lock the transaction does not hold: a no-op (a repeated release).
    /// Code 2.
    NotHeld,
    /// The lock table refused the acquire (codes 3 to 7: conflict, bucket full, reader
    /// overflow, contended, no upgrade; 10: stale incarnation, also for an unlock); the
    /// transaction aborts.
    Refused(Refusal),
    /// The node does not own the key's shard; `version` is its map version. Code 8.
    WrongShard {
        /// The serving node's map version.
        version: u64,
    },
    /// The key's shard is being moved off the node: no new locks until the move ends.
    /// Code 9.
    Moving,
    /// The key's shard belongs to a compute node that is down (failed; or a restarted
    /// node whose table does not serve yet): refused at once, the transaction aborts
    /// (`cn-down`; Lotus 6, the spec's A.6 steps 1 and 5). Code 11. A
    /// [`crate::table_service::TableClient`] answers it itself, without an RPC, for a
    /// node it marked down.
    Down,
}

/// Errors decoding lock-table messages.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TableWireError {
    /// The length is not a whole number of entries (after the header, for replies).
    #[error("{len} bytes is not a whole number of {entry}-byte entries")]
    BadLength {
        /// Message length in bytes.
        len: usize,
        /// Entry size in bytes.
        entry: usize,
    },
    /// No entries, or more than [`MAX_OPS`].
    #[error("{n} entries; a message carries 1 to {MAX_OPS}")]
    Count {
        /// Entries in the message.
        n: usize,
    },
    /// Unknown op byte.
    #[error("entry {index}: unknown op byte {byte}")]
    BadOp {
        /// Entry index.
        index: usize,
        /// The byte.
        byte: u8,
    },
    /// Unknown status byte.
    #[error("entry {index}: unknown status byte {byte}")]
    BadStatus {
        /// Entry index.
        index: usize,
        /// The byte.
        byte: u8,
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

fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

fn entries(len: usize, entry: usize) -> Result<usize, TableWireError> {
    let n = len / entry;
    if n * entry != len {
        return Err(TableWireError::BadLength { len, entry });
    }
    if n == 0 || n > MAX_OPS {
        return Err(TableWireError::Count { n });
    }
    Ok(n)
}

/// Append the encoding of `ops` (1 to [`MAX_OPS`]), sent by incarnation `incarnation`
/// of their node, to `out`.
///
/// Errors: [`TableWireError::Count`].
pub fn encode_ops(
    ops: &[TableOp],
    incarnation: u64,
    out: &mut Vec<u8>,
) -> Result<(), TableWireError> {
    if ops.is_empty() || ops.len() > MAX_OPS {
        return Err(TableWireError::Count { n: ops.len() });
    }
    out.extend_from_slice(&incarnation.to_le_bytes());
    for o in ops {
        out.extend_from_slice(&o.key.0.to_le_bytes());
        out.extend_from_slice(&o.txn.to_le_bytes());
        out.extend_from_slice(&o.node.to_le_bytes());
        out.push(match o.kind {
            OpKind::Lock(LockMode::Read) => 0,
            OpKind::Lock(LockMode::Write) => 1,
            OpKind::Unlock => 2,
        });
        out.extend_from_slice(&[0; 3]);
    }
    Ok(())
}

/// Decode a request into `out` (cleared first); returns the sender's incarnation.
///
/// Errors: [`TableWireError::BadLength`], [`TableWireError::Count`],
/// [`TableWireError::BadOp`].
pub fn decode_ops(buf: &[u8], out: &mut Vec<TableOp>) -> Result<u64, TableWireError> {
    out.clear();
    if buf.len() < OPS_HEADER_BYTES {
        return Err(TableWireError::BadLength {
            len: buf.len(),
            entry: OP_BYTES,
        });
    }
    let (head, buf) = buf.split_at(OPS_HEADER_BYTES);
    entries(buf.len(), OP_BYTES)?;
    for (index, e) in buf.chunks_exact(OP_BYTES).enumerate() {
        let kind = match e[20] {
            0 => OpKind::Lock(LockMode::Read),
            1 => OpKind::Lock(LockMode::Write),
            2 => OpKind::Unlock,
            byte => return Err(TableWireError::BadOp { index, byte }),
        };
        out.push(TableOp {
            key: LockKey(u64_at(e, 0)),
            txn: u64_at(e, 8),
            node: u32::from_le_bytes(e[16..20].try_into().expect("4 bytes")),
            kind,
        });
    }
    Ok(u64_at(head, 0))
}

fn status(o: &OpOutcome) -> u8 {
    match o {
        OpOutcome::Granted => 0,
        OpOutcome::Released => 1,
        OpOutcome::NotHeld => 2,
        OpOutcome::Refused(Refusal::Conflict) => 3,
        OpOutcome::Refused(Refusal::BucketFull) => 4,
        OpOutcome::Refused(Refusal::ReaderOverflow) => 5,
        OpOutcome::Refused(Refusal::Contended) => 6,
        OpOutcome::Refused(Refusal::NoUpgrade) => 7,
        OpOutcome::WrongShard { .. } => 8,
        OpOutcome::Moving => 9,
        OpOutcome::Refused(Refusal::StaleIncarnation) => 10,
        OpOutcome::Down => 11,
    }
}

/// Append a reply: the node's map `version` and service `epoch`, then one entry per
/// outcome.
pub fn encode_outcomes(version: u64, epoch: u64, outcomes: &[OpOutcome], out: &mut Vec<u8>) {
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&epoch.to_le_bytes());
    for o in outcomes {
        out.push(status(o));
        out.extend_from_slice(&[0; 7]);
    }
}

/// Decode a reply to a request of `want` entries: the node's map version, its service
/// epoch and the outcomes.
///
/// Errors: [`TableWireError::BadLength`], [`TableWireError::Count`],
/// [`TableWireError::CountMismatch`], [`TableWireError::BadStatus`].
pub fn decode_outcomes(
    buf: &[u8],
    want: usize,
) -> Result<(u64, u64, Vec<OpOutcome>), TableWireError> {
    if buf.len() < REPLY_HEADER_BYTES {
        return Err(TableWireError::BadLength {
            len: buf.len(),
            entry: OUTCOME_BYTES,
        });
    }
    let version = u64_at(buf, 0);
    let epoch = u64_at(buf, 8);
    let body = &buf[REPLY_HEADER_BYTES..];
    let n = entries(body.len(), OUTCOME_BYTES)?;
    if n != want {
        return Err(TableWireError::CountMismatch { got: n, want });
    }
    let outs = body
        .chunks_exact(OUTCOME_BYTES)
        .enumerate()
        .map(|(index, e)| {
            Ok(match e[0] {
                0 => OpOutcome::Granted,
                1 => OpOutcome::Released,
                2 => OpOutcome::NotHeld,
                3 => OpOutcome::Refused(Refusal::Conflict),
                4 => OpOutcome::Refused(Refusal::BucketFull),
                5 => OpOutcome::Refused(Refusal::ReaderOverflow),
                6 => OpOutcome::Refused(Refusal::Contended),
                7 => OpOutcome::Refused(Refusal::NoUpgrade),
                8 => OpOutcome::WrongShard { version },
                9 => OpOutcome::Moving,
                10 => OpOutcome::Refused(Refusal::StaleIncarnation),
                11 => OpOutcome::Down,
                byte => return Err(TableWireError::BadStatus { index, byte }),
            })
        })
        .collect::<Result<_, _>>()?;
    Ok((version, epoch, outs))
}

/// A drain control request ([`TABLE_DRAIN_HANDLER`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainReq {
    /// Start draining shards `start..end` (code 0).
    Begin {
        /// First shard.
        start: u16,
        /// One past the last.
        end: u16,
    },
    /// How many locks does shards `start..end` hold (code 1)?
    Held {
        /// First shard.
        start: u16,
        /// One past the last.
        end: u16,
    },
    /// Cancel the drain (code 2).
    Cancel,
}

impl DrainReq {
    /// The 5-byte encoding: code, start (u16 LE), end (u16 LE).
    pub fn encode(&self) -> [u8; 5] {
        let (c, s, e) = match *self {
            Self::Begin { start, end } => (0, start, end),
            Self::Held { start, end } => (1, start, end),
            Self::Cancel => (2, 0, 0),
        };
        let [s0, s1] = s.to_le_bytes();
        let [e0, e1] = e.to_le_bytes();
        [c, s0, s1, e0, e1]
    }

    /// Decode [`Self::encode`]'s output; `None` if malformed.
    pub fn decode(b: &[u8]) -> Option<Self> {
        let b: [u8; 5] = b.try_into().ok()?;
        let start = u16::from_le_bytes([b[1], b[2]]);
        let end = u16::from_le_bytes([b[3], b[4]]);
        match b[0] {
            0 => Some(Self::Begin { start, end }),
            1 => Some(Self::Held { start, end }),
            2 => Some(Self::Cancel),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_and_outcomes_round_trip() {
        let ops: Vec<TableOp> = [
            OpKind::Lock(LockMode::Read),
            OpKind::Lock(LockMode::Write),
            OpKind::Unlock,
        ]
        .iter()
        .enumerate()
        .map(|(i, &kind)| TableOp {
            key: LockKey(0x0102_0304_0506_0708 + i as u64),
            txn: 9,
            node: 7,
            kind,
        })
        .collect();
        let mut buf = Vec::new();
        encode_ops(&ops, 0x0a0b, &mut buf).unwrap();
        assert_eq!(buf.len(), 80);
        assert_eq!(&buf[..8], &0x0a0bu64.to_le_bytes(), "incarnation");
        let e = &buf[OPS_HEADER_BYTES..];
        assert_eq!(e[0], 0x08, "little endian");
        assert_eq!((e[20], e[44], e[68]), (0, 1, 2));
        let mut back = Vec::new();
        assert_eq!(decode_ops(&buf, &mut back), Ok(0x0a0b));
        assert_eq!(back, ops);
        let mut bad = buf.clone();
        bad[OPS_HEADER_BYTES + 20] = 3;
        assert_eq!(
            decode_ops(&bad, &mut back),
            Err(TableWireError::BadOp { index: 0, byte: 3 })
        );
        assert!(decode_ops(&buf[..23], &mut back).is_err());
        assert!(decode_ops(&[], &mut back).is_err());
        let many = vec![ops[0]; MAX_OPS + 1];
        assert!(encode_ops(&many, 1, &mut Vec::new()).is_err());

        let outs = [
            OpOutcome::Granted,
            OpOutcome::Released,
            OpOutcome::NotHeld,
            OpOutcome::Refused(Refusal::Conflict),
            OpOutcome::Refused(Refusal::BucketFull),
            OpOutcome::Refused(Refusal::ReaderOverflow),
            OpOutcome::Refused(Refusal::Contended),
            OpOutcome::Refused(Refusal::NoUpgrade),
            OpOutcome::WrongShard { version: 5 },
            OpOutcome::Moving,
            OpOutcome::Refused(Refusal::StaleIncarnation),
            OpOutcome::Down,
        ];
        let mut r = Vec::new();
        encode_outcomes(5, 6, &outs, &mut r);
        assert_eq!(
            decode_outcomes(&r, outs.len()).unwrap(),
            (5, 6, outs.to_vec())
        );
        assert!(matches!(
            decode_outcomes(&r, 3),
            Err(TableWireError::CountMismatch { got: 12, want: 3 })
        ));
        r[REPLY_HEADER_BYTES] = 12;
        assert!(matches!(
            decode_outcomes(&r, 12),
            Err(TableWireError::BadStatus { index: 0, byte: 12 })
        ));
        assert!(decode_outcomes(&r[..REPLY_HEADER_BYTES - 1], 1).is_err());

        for d in [
            DrainReq::Begin { start: 3, end: 9 },
            DrainReq::Held {
                start: 0,
                end: 4096,
            },
            DrainReq::Cancel,
        ] {
            assert_eq!(DrainReq::decode(&d.encode()), Some(d));
        }
        assert_eq!(DrainReq::decode(&[7, 0, 0, 0, 0]), None);
        assert_eq!(DrainReq::decode(&[0]), None);
    }
}
