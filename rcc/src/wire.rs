//! The RPC variants' messages as typed RPCs ([`rrpc::typed::Rpc`]): handler ids, and
//! `#[repr(C)]` layouts of unaligned little-endian integers (`zerocopy`), so a message is
//! its fields' bytes, packed, in order. Every message carries all of one stage's records
//! for one participant: RCC, 4 ("accumulates all RPC read/write messages in one stage
//! into one message").
//!
//! Shapes (`rrpc::typed`): a [`Batch`] is a head then its entries, no count (the length
//! says how many); a [`TailBatch`] is a head, a `u32` count, the entries, then a byte
//! tail holding the records the entries (or the request) describe. Below, `[x u64]` is a
//! little-endian field, `{...}*` one entry per record. Servers read requests in place
//! (`view_request`, `view_tail_request`) and write replies straight into the reply
//! buffer. A request that is not its head plus whole entries, or whose tail the entries
//! do not fill exactly, is an error reply, never a panic; clients check replies the same
//! way, against the lengths their request gave. (A plain batch has no count, as
//! `rrpc::typed`'s batches have none: a message cut at an entry boundary is a shorter
//! valid one, which rrpc's framed messages never produce.)
//!
//! | id | request | reply |
//! |----|---------|-------|
//! | [`FETCH`], [`FETCH_WAIT`] | `[mode u8][owner u64]` `{[off u64][len u32][lock u8]}*` | `[status u8][holder u64]` then, on success, each record's `len` tuple bytes |
//! | [`RELEASE`] | `[owner u64]` `{[off u64]}*` | empty |
//! | [`COMMIT`] | `[owner u64][n u32]` `{[off u64][unlock u8][len u32]}*n` then the records' bytes | empty |
//! | [`READ`] | `{[off u64][len u32]}*` | each record's `len` tuple bytes |
//! | [`LOCK`] | `[owner u64]` `{[off u64][seq u64]}*` | `[status u8][holder u64]` |
//! | [`VALIDATE`] | `{[off u64][seq u64]}*` | `[status u8]` |
//! | [`MVCC_FETCH`] | `[tts u64]` `{[off u64][vlen u32][kind u8]}*` | `[status u8][seen u64][n u32]` `{[wts u64]}*n` then each record's `vlen` bytes |
//! | [`MVCC_COMMIT`] | `[tts u64][n u32]` `{[off u64][vlen u32]}*n` then the records' bytes | empty |
//! | [`SUNDIAL_RENEW`] | `[mode u8]` `{[off u64][check_version u64][wts u64][tts u64]}*` | `[status u8]` |
//! | [`CALVIN_BATCH`], [`CALVIN_FORWARD`] | `[n u32]` `{[off u64][len u32][flag_off u64][flag u64]}*n` then the records' bytes | empty |

use rrpc::typed::{Batch, CodecError, Fixed, Rpc, TailBatch, TailBatchWriter};
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Lock and read (NOWAIT, WAITDIE), [`Fetch`]: request head [`FetchHead`], entries
/// [`FetchEntry`]; reply [`StatusHead`] (`word`: the holder of a lock that conflicted)
/// then, on success, every record's `len` tuple bytes. A failed request leaves no lock
/// of its own held.
pub const FETCH: u16 = 140;
/// Release locks, [`Release`]: head the owner, entries the lock words' offsets; a word
/// not held by `owner` is left alone. Empty reply.
pub const RELEASE: u16 = 141;
/// Write back and unlock, [`Commit`]: head the owner, entries [`CommitEntry`], tail the
/// records, each written at its `off + 8`. Empty reply; an entry whose lock is not
/// `owner`'s (with `unlock` set) fails the call and writes nothing of it. An entry
/// without `unlock` is written unconditionally: a row the transaction inserts
/// ([`crate::coord::TxnSpec::inserts`]).
pub const COMMIT: u16 = 142;
/// Plain read, [`Read`]: entries [`Span`]; reply the tuples' bytes.
pub const READ: u16 = 143;
/// OCC lock, [`Lock`]: head the owner, entries [`Versioned`]: lock each and check its
/// version is still `seq`; reply [`StatusHead`] (`word`: the holder that conflicted).
pub const LOCK: u16 = 144;
/// OCC validation, [`Validate`]: entries [`Versioned`]; reply a status byte, [`OK`] when
/// every record is unlocked at version `seq`.
pub const VALIDATE: u16 = 145;

/// WAITDIE lock and read, served by an async handler that may wait, [`FetchWait`]: as
/// [`FETCH`] with mode [`MODE_WAITDIE`] or [`MODE_WAITDIE_NEVER_DIE`].
pub const FETCH_WAIT: u16 = 146;

/// MVCC fetch (RCC, 4.4 a1-a3, reads and write locks of one participant in one
/// message), [`MvccFetch`]: head `tts`, entries [`MvccFetchEntry`], kind [`MVCC_READ`],
/// [`MVCC_WRITE`] or [`MVCC_READ_NO_RTS`]. A read raises `rts` to `tts` first, then
/// fails if the tuple is locked by a smaller timestamp, then picks the slot with the
/// largest `wts < tts` (fails if none); a write locks with `tts` iff the tuple is
/// unlocked and `tts > rts` and `tts > max(wts)`. Reply head [`StatusHead`] (`word`: on a
/// conflict the largest timestamp met, to advance the clock; no lock of the request stays
/// held, and there are no entries) then, on success, one `wts` entry per record and a
/// tail of every record's `vlen` bytes: the slot read, or for a write the newest slot.
pub const MVCC_FETCH: u16 = 147;
/// MVCC commit (RCC, 4.4 a5-a6), [`MvccCommit`]: head `tts`, entries [`Span`] (`len` the
/// record's `vlen`), tail the records: install each in an empty or the oldest slot with
/// `wts = tts` and unlock. Empty reply; a record not locked by `tts` fails the call and
/// writes nothing. Releasing without a commit is [`RELEASE`] with owner `tts`.
pub const MVCC_COMMIT: u16 = 148;
/// SUNDIAL lease renewal (RCC, 4.5 a4), [`SundialRenew`]: head the mode, entries
/// [`RenewEntry`]: mode [`RENEW_CHECKED`] extends `rts` to `tts` iff the tuple is
/// unlocked and still at `check_version`; mode [`RENEW_BLIND`] (planted bug) writes the
/// lease `[wts, tts]` unconditionally. Reply a status byte. SUNDIAL fetches with
/// [`FETCH`] ([`MODE_NOWAIT`], locks on written records) and commits with [`COMMIT`]
/// (lease, `check_version` and record written at offset 8).
pub const SUNDIAL_RENEW: u16 = 149;

/// [`MVCC_FETCH`] kind: a read.
pub const MVCC_READ: u8 = 0;
/// [`MVCC_FETCH`] kind: a write (lock and read the newest version).
pub const MVCC_WRITE: u8 = 1;
/// [`MVCC_FETCH`] kind: a read that does not raise `rts` (planted bug).
pub const MVCC_READ_NO_RTS: u8 = 2;
/// [`SUNDIAL_RENEW`] mode: checked renewal.
pub const RENEW_CHECKED: u8 = 0;
/// [`SUNDIAL_RENEW`] mode: blind renewal (planted bug).
pub const RENEW_BLIND: u8 = 1;

/// CALVIN's RPC handler, [`CalvinBatch`]: a sequencer's batch for the receiver's CRB.
/// Entries [`DepositEntry`], tail their bytes: the handler writes each entry's bytes at
/// `off`, then the word `flag` at `flag_off`, entry by entry (the same order a one-sided
/// sender's two WRITEs land in). Empty reply. Errors: a malformed message or an entry
/// outside the region (nothing is written then).
pub const CALVIN_BATCH: u16 = 160;
/// CALVIN's RPC handler, [`CalvinForward`]: forwarded records for the receiver's CFB, in
/// [`CALVIN_BATCH`]'s format.
pub const CALVIN_FORWARD: u16 = 161;

/// Reply status: done.
pub const OK: u8 = 0;
/// Reply status: a lock was held by someone else (the holder follows) or a version
/// changed; the transaction aborts.
pub const CONFLICT: u8 = 1;

/// FETCH mode: NOWAIT (abort on any conflict).
pub const MODE_NOWAIT: u8 = 0;
/// FETCH mode: WAITDIE (an older requester waits in the handler).
pub const MODE_WAITDIE: u8 = 1;
/// FETCH mode: WAITDIE that never dies (planted bug: every conflict waits).
pub const MODE_WAITDIE_NEVER_DIE: u8 = 2;

/// [`FETCH`]'s request head, 9 bytes: `[mode u8][owner u64]`.
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct FetchHead {
    /// [`MODE_NOWAIT`], [`MODE_WAITDIE`] or [`MODE_WAITDIE_NEVER_DIE`].
    pub mode: u8,
    /// The requester's lock word (not 0, the free lock).
    pub owner: U64,
}

/// One record of a [`FETCH`], 13 bytes: `[off u64][len u32][lock u8]`.
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct FetchEntry {
    /// The tuple's offset in the partition, bytes.
    pub off: U64,
    /// Its length, bytes.
    pub len: U32,
    /// 1: lock it (its lock word at `off`) before reading; 0: read only.
    pub lock: u8,
}

impl FetchEntry {
    /// The entry of the `len`-byte tuple at `off`, locked iff `lock`.
    pub fn new(off: u64, len: u32, lock: bool) -> Self {
        Self {
            off: U64::new(off),
            len: U32::new(len),
            lock: u8::from(lock),
        }
    }
}

/// A reply's status, 9 bytes: `[status u8][word u64]`, status [`OK`] or [`CONFLICT`];
/// `word` is the conflicting holder ([`FETCH`], [`LOCK`]) or the largest timestamp met
/// ([`MVCC_FETCH`]), 0 on success.
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct StatusHead {
    /// [`OK`] or [`CONFLICT`].
    pub status: u8,
    /// The holder or timestamp met on a conflict, else 0.
    pub word: U64,
}

impl StatusHead {
    /// Success.
    pub fn ok() -> Self {
        Self {
            status: OK,
            word: U64::new(0),
        }
    }

    /// A conflict with `word`.
    pub fn conflict(word: u64) -> Self {
        Self {
            status: CONFLICT,
            word: U64::new(word),
        }
    }
}

/// A record of `len` bytes at `off`, 12 bytes: `[off u64][len u32]` ([`READ`]'s and
/// [`MVCC_COMMIT`]'s entries).
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct Span {
    /// The tuple's offset in the partition, bytes.
    pub off: U64,
    /// Bytes.
    pub len: U32,
}

impl Span {
    /// `len` bytes at `off`.
    pub fn new(off: u64, len: u32) -> Self {
        Self {
            off: U64::new(off),
            len: U32::new(len),
        }
    }
}

/// A record expected at a version, 16 bytes: `[off u64][seq u64]` ([`LOCK`],
/// [`VALIDATE`]).
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct Versioned {
    /// The tuple's offset in the partition, bytes.
    pub off: U64,
    /// The version read.
    pub seq: U64,
}

impl Versioned {
    /// The tuple at `off`, expected at version `seq`.
    pub fn new(off: u64, seq: u64) -> Self {
        Self {
            off: U64::new(off),
            seq: U64::new(seq),
        }
    }
}

/// One record of a [`COMMIT`], 13 bytes: `[off u64][unlock u8][len u32]`; its `len`
/// bytes are the next in the tail.
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct CommitEntry {
    /// The tuple's offset in the partition, bytes (the record goes at `off + 8`).
    pub off: U64,
    /// 1: the lock must be the committer's and is released; 0: an insert, written
    /// unconditionally.
    pub unlock: u8,
    /// The record's bytes in the tail.
    pub len: U32,
}

/// One record of an [`MVCC_FETCH`], 13 bytes: `[off u64][vlen u32][kind u8]`.
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct MvccFetchEntry {
    /// The tuple's offset in the partition, bytes.
    pub off: U64,
    /// One version's bytes (not 0).
    pub vlen: U32,
    /// [`MVCC_READ`], [`MVCC_WRITE`] or [`MVCC_READ_NO_RTS`].
    pub kind: u8,
}

/// One record of a [`SUNDIAL_RENEW`], 32 bytes: `[off u64][check_version u64][wts
/// u64][tts u64]` (timestamps of at most 32 bits).
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct RenewEntry {
    /// The tuple's offset in the partition, bytes.
    pub off: U64,
    /// The `check_version` read.
    pub check_version: U64,
    /// The lease's write timestamp read.
    pub wts: U64,
    /// The timestamp to extend `rts` to.
    pub tts: U64,
}

/// One entry of a CALVIN deposit, 28 bytes: `[off u64][len u32][flag_off u64][flag
/// u64]`; its `len` bytes are the next in the tail.
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct DepositEntry {
    /// Where the bytes go in the region (8-aligned).
    pub off: U64,
    /// The bytes' length (a multiple of 8).
    pub len: U32,
    /// Where the flag word goes (8-aligned).
    pub flag_off: U64,
    /// The flag word, written after the bytes.
    pub flag: U64,
}

/// Declares a unit struct per RPC with its id and types.
macro_rules! rpcs {
    ($($(#[$doc:meta])* $name:ident = $id:expr, $req:ty => $resp:ty;)*) => {$(
        $(#[$doc])*
        #[derive(Debug, Clone, Copy)]
        pub struct $name;
        impl Rpc for $name {
            const ID: u16 = $id;
            type Req = $req;
            type Resp = $resp;
            type Codec = Fixed;
        }
    )*};
}

rpcs! {
    /// [`FETCH`].
    Fetch = FETCH, Batch<FetchHead, FetchEntry> => Batch<StatusHead, u8>;
    /// [`FETCH_WAIT`].
    FetchWait = FETCH_WAIT, Batch<FetchHead, FetchEntry> => Batch<StatusHead, u8>;
    /// [`RELEASE`]: head the owner, entries the offsets.
    Release = RELEASE, Batch<U64, U64> => ();
    /// [`COMMIT`]: head the owner.
    Commit = COMMIT, TailBatch<U64, CommitEntry> => ();
    /// [`READ`]: the reply's entries are the tuples' bytes.
    Read = READ, Batch<(), Span> => Batch<(), u8>;
    /// [`LOCK`]: head the owner.
    Lock = LOCK, Batch<U64, Versioned> => StatusHead;
    /// [`VALIDATE`]: the reply is the status.
    Validate = VALIDATE, Batch<(), Versioned> => u8;
    /// [`MVCC_FETCH`]: head `tts`; the reply's entries are the `wts` read.
    MvccFetch = MVCC_FETCH, Batch<U64, MvccFetchEntry> => TailBatch<StatusHead, U64>;
    /// [`MVCC_COMMIT`]: head `tts`.
    MvccCommit = MVCC_COMMIT, TailBatch<U64, Span> => ();
    /// [`SUNDIAL_RENEW`]: head the mode; the reply is the status.
    SundialRenew = SUNDIAL_RENEW, Batch<u8, RenewEntry> => u8;
    /// [`CALVIN_BATCH`].
    CalvinBatch = CALVIN_BATCH, TailBatch<(), DepositEntry> => ();
    /// [`CALVIN_FORWARD`].
    CalvinForward = CALVIN_FORWARD, TailBatch<(), DepositEntry> => ();
}

/// One [`TailBatch`] message of `head` and the `n` entries with their bytes that
/// `records` yields, in one buffer reserving `tail_len` tail bytes: the requests of
/// [`COMMIT`], [`MVCC_COMMIT`] and the CALVIN deposits.
///
/// Errors: `records` yields other than `n` records, or `n` exceeds the count's `u32`.
pub fn tail_request<'a, H, E>(
    head: &H,
    n: usize,
    tail_len: usize,
    records: impl IntoIterator<Item = (E, &'a [u8])>,
) -> Result<Vec<u8>, CodecError>
where
    H: IntoBytes + Immutable,
    E: IntoBytes + Immutable,
{
    let mut out = Vec::new();
    let mut w = TailBatchWriter::new(&mut out, head, n, tail_len)?;
    for (e, data) in records {
        w.push(&e, data)?;
    }
    w.finish()?;
    Ok(out)
}

/// A message's fault that the typed layer reports without the RPC's name (a tail the
/// entries do not fill), as the error text of handler `id`.
pub fn malformed(id: u16, e: CodecError) -> String {
    format!("malformed message for RCC handler {id}: {}", e.detail)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rrpc::typed::encode_batch_iter;

    /// The layouts have the sizes of the module's table, packed, little-endian.
    #[test]
    fn layouts_are_the_documented_bytes() {
        use std::mem::size_of;
        let sizes = [
            size_of::<FetchHead>(),
            size_of::<FetchEntry>(),
            size_of::<StatusHead>(),
            size_of::<Span>(),
            size_of::<Versioned>(),
            size_of::<CommitEntry>(),
            size_of::<MvccFetchEntry>(),
            size_of::<RenewEntry>(),
            size_of::<DepositEntry>(),
        ];
        assert_eq!(sizes, [9, 13, 9, 12, 16, 13, 13, 32, 28]);

        let mut m = Vec::new();
        let head = FetchHead {
            mode: MODE_WAITDIE,
            owner: U64::new(0x0102),
        };
        encode_batch_iter(&head, [FetchEntry::new(0x10, 0x20, true)], &mut m);
        assert_eq!(
            m,
            [1, 2, 1, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 0, 0x20, 0, 0, 0, 1]
        );

        let e = CommitEntry {
            off: U64::new(8),
            unlock: 1,
            len: U32::new(2),
        };
        let m = tail_request(&U64::new(5), 1, 2, [(e, &[0xaa, 0xbb][..])]).unwrap();
        assert_eq!(
            m,
            [
                5, 0, 0, 0, 0, 0, 0, 0, // owner
                1, 0, 0, 0, // n
                8, 0, 0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 0, // off, unlock, len
                0xaa, 0xbb, // the record
            ]
        );
        // A count that does not match the records is refused.
        assert!(tail_request(&U64::new(5), 2, 2, [(e, &[0xaa, 0xbb][..])]).is_err());
    }
}
