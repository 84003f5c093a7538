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
//!
//! Every lock-table RPC is typed ([`rrpc::typed`], fixed `zerocopy` layouts):
//! [`TableOpsRpc`] ([`OpsHead`] and [`OpEntry`]s in, [`OutcomesHead`] and
//! [`OutcomeEntry`]s out, as [`rrpc::typed::Batch`]es), [`TableMapRpc`] and
//! [`TableInstallRpc`] (a shard map as a [`MapWire`]: its version, then
//! [`ShardRun`]s), [`TableDrainRpc`] ([`DrainWire`]), [`TableReleaseNodeRpc`]
//! ([`ReleaseTarget`]) and [`crate::load::TableStatsRpc`] (a load sample).

use rrpc::typed::{encode_batch, Batch, BatchRef, Fixed, Rpc};
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::lock_table::{LockMode, Refusal};
use crate::shard::LockKey;
pub use crate::shard::{MapWire, ShardRun};

/// Handler id of the batched lock / unlock RPC.
pub const TABLE_OPS_HANDLER: u16 = 20;
/// Handler id of "send me your shard map" (empty request; reply a [`MapWire`],
/// [`TableMapRpc`]).
pub const TABLE_MAP_HANDLER: u16 = 21;
/// Handler id of "install this map if newer" (request: a [`MapWire`]; reply: the
/// node's map version after, 8 bytes; [`TableInstallRpc`]).
pub const TABLE_INSTALL_HANDLER: u16 = 22;
/// Handler id of the drain control of a move (request [`DrainReq`] as a [`DrainWire`],
/// 5 bytes; reply: locks held on the range, `u64`; [`TableDrainRpc`]).
pub const TABLE_DRAIN_HANDLER: u16 = 23;
/// Handler id of "release every lock of compute node N" (request: `node: u32` for
/// every incarnation of the node, or `node: u32, incarnation: u64` for one; reply: locks
/// released, `u64`; Lotus 6; [`TableReleaseNodeRpc`]).
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
#[non_exhaustive]
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

/// The header of a [`TABLE_OPS_HANDLER`] request, [`OPS_HEADER_BYTES`] bytes: the
/// sender's incarnation.
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned, Clone, Copy, Debug, PartialEq, Eq,
)]
#[repr(C)]
pub struct OpsHead {
    /// The sender's incarnation, bytes 0..8.
    pub incarnation: U64,
}

/// One operation of a [`TABLE_OPS_HANDLER`] request, [`OP_BYTES`] bytes (the module
/// docs' table).
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned, Clone, Copy, Debug, PartialEq, Eq,
)]
#[repr(C)]
pub struct OpEntry {
    /// The [`LockKey`], bytes 0..8.
    pub key: U64,
    /// The transaction id, bytes 8..16.
    pub txn: U64,
    /// The transaction's compute node, bytes 16..20.
    pub node: U32,
    /// 0 lock read, 1 lock write, 2 unlock, byte 20; other values are
    /// [`TableWireError::BadOp`].
    pub op: u8,
    /// Zero, bytes 21..24.
    pub pad: [u8; 3],
}

/// The header of a [`TABLE_OPS_HANDLER`] reply, [`REPLY_HEADER_BYTES`] bytes.
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned, Clone, Copy, Debug, PartialEq, Eq,
)]
#[repr(C)]
pub struct OutcomesHead {
    /// The serving node's map version, bytes 0..8.
    pub version: U64,
    /// Its service epoch, bytes 8..16.
    pub epoch: U64,
}

/// One outcome of a [`TABLE_OPS_HANDLER`] reply, [`OUTCOME_BYTES`] bytes.
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned, Clone, Copy, Debug, PartialEq, Eq,
)]
#[repr(C)]
pub struct OutcomeEntry {
    /// The [`OpOutcome`] code, byte 0; unknown codes are [`TableWireError::BadStatus`].
    pub status: u8,
    /// Zero, bytes 1..8.
    pub pad: [u8; 7],
}

/// A drain control request, 5 bytes ([`TABLE_DRAIN_HANDLER`], [`DrainReq`]).
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned, Clone, Copy, Debug, PartialEq, Eq,
)]
#[repr(C)]
pub struct DrainWire {
    /// 0 begin, 1 held, 2 cancel, byte 0.
    pub code: u8,
    /// The first shard, bytes 1..3.
    pub start: U16,
    /// One past the last, bytes 3..5.
    pub end: U16,
}

const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<OpsHead>() == OPS_HEADER_BYTES);
    assert!(size_of::<OpEntry>() == OP_BYTES && offset_of!(OpEntry, op) == 20);
    assert!(size_of::<OutcomesHead>() == REPLY_HEADER_BYTES);
    assert!(size_of::<OutcomeEntry>() == OUTCOME_BYTES);
    assert!(size_of::<DrainWire>() == 5);
};

/// A [`TABLE_OPS_HANDLER`] request: the header, then one entry per operation.
pub type OpsBatch = Batch<OpsHead, OpEntry>;
/// A [`TABLE_OPS_HANDLER`] reply: the header, then one outcome per operation.
pub type OutcomesBatch = Batch<OutcomesHead, OutcomeEntry>;
/// A [`TABLE_RELEASE_NODE_HANDLER`] request: `node: u32`, then no entry (every
/// incarnation of the node) or one, its `incarnation: u64` ([`ReleaseTarget`]).
pub type ReleaseNodeBatch = Batch<U32, U64>;

/// The batched lock / unlock RPC ([`TABLE_OPS_HANDLER`]).
pub struct TableOpsRpc;

impl Rpc for TableOpsRpc {
    const ID: u16 = TABLE_OPS_HANDLER;
    type Req = OpsBatch;
    type Resp = OutcomesBatch;
    type Codec = Fixed;
}

/// "Send me your shard map" ([`TABLE_MAP_HANDLER`]): nothing in, a [`MapWire`] out.
pub struct TableMapRpc;

impl Rpc for TableMapRpc {
    const ID: u16 = TABLE_MAP_HANDLER;
    type Req = ();
    type Resp = MapWire;
    type Codec = Fixed;
}

/// "Install this map if newer" ([`TABLE_INSTALL_HANDLER`]): a [`MapWire`] in, the
/// node's map version after out.
pub struct TableInstallRpc;

impl Rpc for TableInstallRpc {
    const ID: u16 = TABLE_INSTALL_HANDLER;
    type Req = MapWire;
    type Resp = U64;
    type Codec = Fixed;
}

/// The drain control of a move ([`TABLE_DRAIN_HANDLER`]): a [`DrainWire`] in, the locks
/// held on the range out.
pub struct TableDrainRpc;

impl Rpc for TableDrainRpc {
    const ID: u16 = TABLE_DRAIN_HANDLER;
    type Req = DrainWire;
    type Resp = U64;
    type Codec = Fixed;
}

/// "Release every lock of compute node N" ([`TABLE_RELEASE_NODE_HANDLER`]): a
/// [`ReleaseNodeBatch`] in, the locks released out.
pub struct TableReleaseNodeRpc;

impl Rpc for TableReleaseNodeRpc {
    const ID: u16 = TABLE_RELEASE_NODE_HANDLER;
    type Req = ReleaseNodeBatch;
    type Resp = U64;
    type Codec = Fixed;
}

/// Whose locks a [`TABLE_RELEASE_NODE_HANDLER`] request releases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseTarget {
    /// Every incarnation of the node.
    Node(u32),
    /// One incarnation.
    Incarnation(crate::owners::Owner),
}

impl ReleaseTarget {
    /// The request (4 bytes for a node, 12 for an incarnation).
    pub fn batch(self) -> ReleaseNodeBatch {
        match self {
            Self::Node(n) => Batch::new(U32::new(n), Vec::new()),
            Self::Incarnation(o) => Batch::new(U32::new(o.node), vec![U64::new(o.incarnation)]),
        }
    }

    /// The target a request names.
    ///
    /// Errors: [`TableWireError::BadLength`] for more than one incarnation (the request
    /// is neither 4 nor 12 bytes).
    pub fn of(b: &ReleaseNodeBatch) -> Result<Self, TableWireError> {
        let node = b.head.get();
        match b.entries[..] {
            [] => Ok(Self::Node(node)),
            [inc] => Ok(Self::Incarnation(crate::owners::Owner {
                node,
                incarnation: inc.get(),
            })),
            _ => Err(TableWireError::BadLength {
                len: b.encoded_len(),
                entry: 8,
            }),
        }
    }
}

/// The entry count `n` of a message, checked: [`TableWireError::Count`] unless 1 to
/// [`MAX_OPS`].
fn entries(n: usize) -> Result<usize, TableWireError> {
    if n == 0 || n > MAX_OPS {
        return Err(TableWireError::Count { n });
    }
    Ok(n)
}

impl OpEntry {
    /// The entry of `o`.
    pub fn new(o: &TableOp) -> Self {
        Self {
            key: U64::new(o.key.0),
            txn: U64::new(o.txn),
            node: U32::new(o.node),
            op: match o.kind {
                OpKind::Lock(LockMode::Read) => 0,
                OpKind::Lock(LockMode::Write) => 1,
                OpKind::Unlock => 2,
            },
            pad: [0; 3],
        }
    }

    /// The operation of entry `index`.
    ///
    /// Errors: [`TableWireError::BadOp`].
    pub fn op(&self, index: usize) -> Result<TableOp, TableWireError> {
        let kind = match self.op {
            0 => OpKind::Lock(LockMode::Read),
            1 => OpKind::Lock(LockMode::Write),
            2 => OpKind::Unlock,
            byte => return Err(TableWireError::BadOp { index, byte }),
        };
        Ok(TableOp {
            key: LockKey(self.key.get()),
            txn: self.txn.get(),
            node: self.node.get(),
            kind,
        })
    }
}

/// Append the bytes of the [`TABLE_OPS_HANDLER`] request of `ops` (1 to [`MAX_OPS`]),
/// sent by incarnation `incarnation` of their node, to `out`: [`TableOpsRpc`]'s encoding,
/// written without building an [`OpsBatch`] (the entries go through the stack).
///
/// Errors: [`TableWireError::Count`].
pub fn encode_ops(
    ops: &[TableOp],
    incarnation: u64,
    out: &mut Vec<u8>,
) -> Result<(), TableWireError> {
    let n = entries(ops.len())?;
    let mut e = [OpEntry::new_zeroed(); MAX_OPS];
    for (slot, o) in e.iter_mut().zip(ops) {
        *slot = OpEntry::new(o);
    }
    let head = OpsHead {
        incarnation: U64::new(incarnation),
    };
    encode_batch(&head, &e[..n], out);
    Ok(())
}

/// A [`TABLE_OPS_HANDLER`] request read in place ([`rrpc::typed::view_request`]).
pub type OpsView<'a> = BatchRef<'a, OpsHead, OpEntry>;

/// The operations of a decoded request (`b.as_ref()` of an [`OpsBatch`], or an
/// [`OpsView`]), checked as a whole before any is returned, in order.
///
/// Errors: [`TableWireError::Count`], [`TableWireError::BadOp`].
pub fn table_ops(b: OpsView<'_>) -> Result<impl Iterator<Item = TableOp> + '_, TableWireError> {
    entries(b.entries.len())?;
    for (index, e) in b.entries.iter().enumerate() {
        e.op(index)?;
    }
    Ok(b.entries.iter().filter_map(|e| e.op(0).ok()))
}

/// Decode a request into `out` (cleared first); returns the sender's incarnation:
/// [`TableOpsRpc`]'s typed decoding (in place), then [`table_ops`].
///
/// Errors: [`TableWireError::BadLength`], [`TableWireError::Count`],
/// [`TableWireError::BadOp`].
pub fn decode_ops(buf: &[u8], out: &mut Vec<TableOp>) -> Result<u64, TableWireError> {
    out.clear();
    let b = rrpc::typed::view_request::<TableOpsRpc, _, _>(buf).map_err(|e| {
        TableWireError::BadLength {
            len: e.len,
            entry: OP_BYTES,
        }
    })?;
    out.extend(table_ops(b)?);
    Ok(b.head.incarnation.get())
}

impl OutcomeEntry {
    /// The entry of `o`.
    pub fn new(o: &OpOutcome) -> Self {
        let status = match o {
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
        };
        Self {
            status,
            pad: [0; 7],
        }
    }

    /// The outcome of entry `index` of a reply from a node at map `version`.
    ///
    /// Errors: [`TableWireError::BadStatus`].
    pub fn outcome(&self, index: usize, version: u64) -> Result<OpOutcome, TableWireError> {
        Ok(match self.status {
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
    }
}

/// Append a reply: the node's map `version` and service `epoch`, then one entry per
/// outcome (1 to [`MAX_OPS`]; more are not written): [`TableOpsRpc`]'s encoding, written
/// without building an [`OutcomesBatch`].
pub fn encode_outcomes(version: u64, epoch: u64, outcomes: &[OpOutcome], out: &mut Vec<u8>) {
    let mut e = [OutcomeEntry::new_zeroed(); MAX_OPS];
    let mut n = 0;
    for (slot, o) in e.iter_mut().zip(outcomes) {
        *slot = OutcomeEntry::new(o);
        n += 1;
    }
    let head = OutcomesHead {
        version: U64::new(version),
        epoch: U64::new(epoch),
    };
    encode_batch(&head, &e[..n], out);
}

/// Decode a reply to a request of `want` entries: the node's map version, its service
/// epoch and the outcomes ([`TableOpsRpc`]'s typed decoding, in place).
///
/// Errors: [`TableWireError::BadLength`], [`TableWireError::Count`],
/// [`TableWireError::CountMismatch`], [`TableWireError::BadStatus`].
pub fn decode_outcomes(
    buf: &[u8],
    want: usize,
) -> Result<(u64, u64, Vec<OpOutcome>), TableWireError> {
    let b = rrpc::typed::view_response::<TableOpsRpc, _, _>(buf).map_err(|e| {
        TableWireError::BadLength {
            len: e.len,
            entry: OUTCOME_BYTES,
        }
    })?;
    let version = b.head.version.get();
    let n = entries(b.entries.len())?;
    if n != want {
        return Err(TableWireError::CountMismatch { got: n, want });
    }
    let outs = b
        .entries
        .iter()
        .enumerate()
        .map(|(index, e)| e.outcome(index, version))
        .collect::<Result<_, _>>()?;
    Ok((version, b.head.epoch.get(), outs))
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
    /// The wire form: code, start, end ([`DrainWire`], 5 bytes).
    pub fn wire(&self) -> DrainWire {
        let (code, s, e) = match *self {
            Self::Begin { start, end } => (0, start, end),
            Self::Held { start, end } => (1, start, end),
            Self::Cancel => (2, 0, 0),
        };
        DrainWire {
            code,
            start: U16::new(s),
            end: U16::new(e),
        }
    }

    /// The request a wire form carries; `None` for an unknown code.
    pub fn of(w: &DrainWire) -> Option<Self> {
        let (start, end) = (w.start.get(), w.end.get());
        match w.code {
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
            let mut b = Vec::new();
            rrpc::typed::encode_request::<TableDrainRpc>(&d.wire(), &mut b).unwrap();
            assert_eq!(b.len(), 5);
            let w = rrpc::typed::decode_request::<TableDrainRpc>(&b).unwrap();
            assert_eq!(DrainReq::of(&w), Some(d));
        }
        let mut b = Vec::new();
        rrpc::typed::encode_request::<TableDrainRpc>(
            &DrainReq::Held {
                start: 3,
                end: 0x0102,
            }
            .wire(),
            &mut b,
        )
        .unwrap();
        assert_eq!(b, [1, 3, 0, 2, 1], "code, start, end");
        let w = rrpc::typed::decode_request::<TableDrainRpc>(&[7, 0, 0, 0, 0]).unwrap();
        assert_eq!(DrainReq::of(&w), None);
        assert!(rrpc::typed::decode_request::<TableDrainRpc>(&[0]).is_err());

        // Release-node requests: 4 bytes (a node) or 12 (one incarnation), nothing else.
        let o = crate::owners::Owner {
            node: 5,
            incarnation: 9,
        };
        for t in [ReleaseTarget::Node(5), ReleaseTarget::Incarnation(o)] {
            let mut b = Vec::new();
            rrpc::typed::encode_request::<TableReleaseNodeRpc>(&t.batch(), &mut b).unwrap();
            assert_eq!(&b[..4], &[5, 0, 0, 0]);
            let back = rrpc::typed::decode_request::<TableReleaseNodeRpc>(&b).unwrap();
            assert_eq!(ReleaseTarget::of(&back), Ok(t));
        }
        let two = Batch::new(U32::new(5), vec![U64::new(1), U64::new(2)]);
        assert!(ReleaseTarget::of(&two).is_err());
        assert!(rrpc::typed::decode_request::<TableReleaseNodeRpc>(&[5, 0, 0, 0, 1]).is_err());
    }
}
