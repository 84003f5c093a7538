//! The RPC variants' messages: handler ids and a little-endian codec with bounds checks
//! (a malformed message is an error reply, never a panic). Every message carries all of
//! one stage's records for one participant: RCC, 4 ("accumulates all RPC read/write
//! messages in one stage into one message").

/// Lock and read (NOWAIT, WAITDIE): `[mode u8][owner u64][n u16]` then per record
/// `[off u64][len u32][lock u8]`; reply `[status u8][holder u64]` then, on success,
/// every record's `len` tuple bytes. A failed request leaves no lock of its own held.
pub const FETCH: u16 = 140;
/// Release locks: `[owner u64][n u16]` then `[off u64]` each; a word not held by
/// `owner` is left alone. Empty reply.
pub const RELEASE: u16 = 141;
/// Write back and unlock: `[owner u64][n u16]` then per record `[off u64][unlock u8]
/// [len u32][len bytes written at off + 8]`. Empty reply; an entry whose lock is not
/// `owner`'s (with `unlock` set) fails the call and writes nothing of it. An entry
/// without `unlock` is written unconditionally: a row the transaction inserts
/// ([`crate::coord::TxnSpec::inserts`]).
pub const COMMIT: u16 = 142;
/// Plain read: `[n u16]` then `[off u64][len u32]`; reply the tuples' bytes.
pub const READ: u16 = 143;
/// OCC lock: `[owner u64][n u16]` then `[off u64][seq u64]`: lock each and check its
/// version is still `seq`; reply `[status u8][holder u64]`.
pub const LOCK: u16 = 144;
/// OCC validation: `[n u16]` then `[off u64][seq u64]`; reply `[status u8]`, 0 when every
/// record is unlocked at version `seq`.
pub const VALIDATE: u16 = 145;

/// WAITDIE lock and read, served by an async handler that may wait: as [`FETCH`] with
/// mode [`MODE_WAITDIE`] or [`MODE_WAITDIE_NEVER_DIE`].
pub const FETCH_WAIT: u16 = 146;

/// MVCC fetch (RCC, 4.4 a1-a3, reads and write locks of one participant in one
/// message): `[tts u64][n u16]` then per record `[off u64][vlen u32][kind u8]`, kind
/// [`MVCC_READ`], [`MVCC_WRITE`] or [`MVCC_READ_NO_RTS`]. A read raises `rts` to `tts`
/// first, then fails if the tuple is locked by a smaller timestamp, then picks the slot
/// with the largest `wts < tts` (fails if none); a write locks with `tts` iff the tuple
/// is unlocked and `tts > rts` and `tts > max(wts)`. Reply `[status u8][seen u64]` (on a
/// conflict `seen` is the largest timestamp met, to advance the clock; no lock of the
/// request stays held) then, on success, per record `[wts u64][vlen record bytes]`: the
/// slot read, or for a write the newest slot.
pub const MVCC_FETCH: u16 = 147;
/// MVCC commit (RCC, 4.4 a5-a6): `[tts u64][n u16]` then per record `[off u64][vlen
/// u32][vlen bytes]`: install the record in an empty or the oldest slot with `wts = tts`
/// and unlock. Empty reply; a record not locked by `tts` fails the call and writes
/// nothing. Releasing without a commit is [`RELEASE`] with owner `tts`.
pub const MVCC_COMMIT: u16 = 148;
/// SUNDIAL lease renewal (RCC, 4.5 a4): `[mode u8][n u16]` then per record `[off
/// u64][check_version u64][wts u64][tts u64]`: mode [`RENEW_CHECKED`] extends `rts` to
/// `tts` iff the tuple is unlocked and still at `check_version`; mode [`RENEW_BLIND`]
/// (planted bug) writes the lease `[wts, tts]` unconditionally. Reply `[status u8]`.
/// SUNDIAL fetches with [`FETCH`] ([`MODE_NOWAIT`], locks on written records) and
/// commits with [`COMMIT`] (lease, `check_version` and record written at offset 8).
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

/// CALVIN's RPC handler: a sequencer's batch for the receiver's CRB. `[n u16]` then per entry
/// `[off u64][len u32][len bytes][flag_off u64][flag u64]`: the handler writes the bytes
/// at `off`, then the word `flag` at `flag_off`, entry by entry (the same order a
/// one-sided sender's two WRITEs land in). Empty reply. Errors: a malformed message or
/// an entry outside the region (nothing is written then).
pub const CALVIN_BATCH: u16 = 160;
/// CALVIN's RPC handler: forwarded records for the receiver's CFB, in [`CALVIN_BATCH`]'s format.
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

/// Appends fields to a message.
#[derive(Debug, Default)]
pub struct Enc(pub Vec<u8>);

impl Enc {
    /// A byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    /// A little-endian u16.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A little-endian u32.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A little-endian u64.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Raw bytes.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.0.extend_from_slice(v);
        self
    }
}

/// Reads fields of a message; every read is bounds-checked.
#[derive(Debug)]
pub struct Dec<'a>(pub &'a [u8]);

impl<'a> Dec<'a> {
    /// The next `n` bytes. Errors: the message is shorter.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!(
                "malformed message: wanted {n} more bytes, {} left",
                self.0.len()
            ));
        }
        let (h, t) = self.0.split_at(n);
        self.0 = t;
        Ok(h)
    }
    /// A byte.
    pub fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    /// A little-endian u16.
    pub fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))
    }
    /// A little-endian u32.
    pub fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    /// A little-endian u64.
    pub fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
}
