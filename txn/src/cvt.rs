//! Consecutive version tuples (CVT): the multi-version record layout of the memory node,
//! as plain byte layouts and decisions (no fabric, no clock). Motor
//! 4.1 (the CVT), 4.3 (coordinator-active GC) and 5.1 (version
//! selection, early abort); each version a full record with cacheline versions, as in
//! Lotus 7.1.
//!
//! A CVT is read with one READ: a header and `n` version cells.
//! ```text
//! header (32 B): [0, 4) table id   [4, 8) record length, bytes   [8, 16) key
//!                [16, 24) lock word (OCC-CAS: 0 free, else the holder)
//!                [24, 32) slot state (0 free, 1 in use, 3 freed by a recovery, or
//!                claimed: the inserter's id with `CLAIM_BIT`; an insert claims a
//!                free slot of a hash bucket with a CAS, see `cvt_index`)
//! cell (32 B):   [0] head CV   [1] valid (0/1)   [2] tombstone (0/1: the version is a
//!                delete)   [8, 16) version (commit timestamp)
//!                [16, 24) record address   [31] tail CV   (other bytes zero)
//! ```
//! A version's record lives in the value region, cut into 64-byte lines whose first byte
//! is the version's cacheline version (CV); the record's last byte is the CV again (its
//! end anchor). A record of `len` bytes takes [`record_bytes`]`(len)` bytes.
//!
//! Writes (Motor 4.4): a writer holding the CVT's lock picks a cell ([`Cvt::victim`]),
//! takes CV = the cell's CV + 1, and WRITEs the record with that CV on every line and
//! the cell (head CV, content, tail CV). The two WRITEs may land in either order (they
//! go out in one round, possibly on different QPs): a reader that READs a cell and then
//! its record checks:
//! - head CV = tail CV, else the cell was being written ([`CvtError::TornCell`]);
//! - every CV of the record equal, else the record was being written
//!   ([`RecordError::Torn`]);
//! - the record's CV = the cell's CV, else the record is another version's: its buffer was
//!   reused by GC after the cell was read, or the cell and the record of an install
//!   were seen one before and one after it ([`RecordError::Mismatch`]).
//!
//! CVs are one byte and wrap: a reader whose record was rewritten exactly 256 times
//! between its two READs would not notice. The protocols also validate versions (or
//! hold locks), which catches that case as it catches any change.

use tso::Timestamp;

/// Bytes of a CVT header.
pub const HEADER_BYTES: usize = 32;
/// Bytes of a version cell.
pub const CELL_BYTES: usize = 32;
/// Bytes of a value-region line; each begins with the record's CV.
pub const LINE_BYTES: usize = 64;

/// Bytes of a CVT with `versions` cells.
pub fn cvt_bytes(versions: usize) -> usize {
    HEADER_BYTES + versions * CELL_BYTES
}

/// Bytes a record of `len` payload bytes takes in the value region: the payload and the
/// end CV, cut into 64-byte lines of a CV and 63 bytes.
pub fn record_bytes(len: usize) -> usize {
    let body = len + 1;
    let lines = body.div_ceil(LINE_BYTES - 1).max(1);
    lines + body
}

/// A CVT header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The table the record belongs to.
    pub table: u32,
    /// Length of each version's record, bytes.
    pub len: u32,
    /// The record's key.
    pub key: u64,
    /// OCC-CAS lock word: 0 when free, else the holder's id.
    pub lock: u64,
    /// Slot state word: [`SLOT_FREE`], [`SLOT_IN_USE`], [`SLOT_FREED`] or a claim
    /// ([`claim_word`]).
    pub state: u64,
}

/// [`Header::state`] of a slot no record holds and no insert ever claimed.
pub const SLOT_FREE: u64 = 0;
/// [`Header::state`] of a slot holding a record.
pub const SLOT_IN_USE: u64 = 1;
/// [`Header::state`] of a slot whose claim a recovery undid (its inserter died before it
/// published the slot): free to searches and inserts as [`SLOT_FREE`] is, but kept apart
/// from it so that a recovery's search for a dead inserter's claim
/// ([`crate::cvt_index::seek_claim`]) may stop at the first bucket holding a slot that was
/// never claimed. Slots become free only this way, so a bucket an insert passed over
/// (it had no free slot) never holds a [`SLOT_FREE`] slot again.
pub const SLOT_FREED: u64 = 3;
/// The bit that marks a [`Header::state`] as claimed: an insert claims a free slot with a
/// CAS to [`claim_word`]`(id)`, its transaction id with this bit, and writes the header
/// (key, and the lock it holds) before publishing the slot as [`SLOT_IN_USE`]. Searches
/// skip a claimed slot. The bit is [`crate::txn_id::INVISIBLE`], the one bit no
/// transaction id carries, so the word names its inserter and can never equal
/// [`SLOT_FREE`], [`SLOT_IN_USE`] or [`SLOT_FREED`]: recovery finds a dead inserter's claim
/// by its id whatever lock word the protocol writes (Lotus and Scythe write 0).
pub const CLAIM_BIT: u64 = crate::txn_id::INVISIBLE;

/// The state word of a slot claimed by transaction `id` ([`CLAIM_BIT`]).
pub fn claim_word(id: u64) -> u64 {
    id | CLAIM_BIT
}

/// The transaction id that claimed a slot of state word `state`, if it is claimed.
pub fn claimer(state: u64) -> Option<u64> {
    (state & CLAIM_BIT != 0).then_some(state & !CLAIM_BIT)
}

/// Whether a slot of state word `state` is free to claim ([`SLOT_FREE`] or
/// [`SLOT_FREED`]).
pub fn is_free(state: u64) -> bool {
    state == SLOT_FREE || state == SLOT_FREED
}
/// Byte offset of [`Header::lock`] in a CVT (the word OCC-CAS locks with CAS).
pub const LOCK_OFFSET: usize = 16;
/// Byte offset of [`Header::state`] in a CVT (the word an insert claims with CAS).
pub const STATE_OFFSET: usize = 24;

/// Offset of a cell's record address ([`Cell::addr`], 8 bytes little-endian) in its
/// encoding.
pub const CELL_ADDR_OFFSET: usize = 16;

/// The top bit of a cell's version: set, the version is INVISIBLE, a new version whose
/// writer holds its write lock and has not taken its commit timestamp yet (Lotus 5.1,
/// "temporarily invisible to other coordinators"). The other 63 bits name the writer
/// (its transaction id), so that recovery touches only its own cells (the tagged form
/// of the INVISIBLE sentinel). The TSO never issues a timestamp with this bit (its epoch
/// would be at least 0x8000): [`tso::Timestamp`]s and INVISIBLE versions never meet.
pub const INVISIBLE_BIT: u64 = 1 << 63;

/// The INVISIBLE version written by transaction `id` ([`INVISIBLE_BIT`] and `id`'s low
/// 63 bits).
pub fn invisible(id: u64) -> Timestamp {
    Timestamp(INVISIBLE_BIT | (id & !INVISIBLE_BIT))
}

/// Whether `v` is an INVISIBLE version ([`INVISIBLE_BIT`]).
pub fn is_invisible(v: Timestamp) -> bool {
    v.get() & INVISIBLE_BIT != 0
}

/// Offset of a cell's version ([`Cell::version`], 8 bytes little-endian) in its
/// encoding: Lotus's write-visible step WRITEs only these 8 bytes.
pub const CELL_VERSION_OFFSET: usize = 8;

/// A version cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cell {
    /// Cacheline version of this cell and of its record.
    pub cv: u8,
    /// Whether the cell holds a version.
    pub valid: bool,
    /// Whether the version is a delete (a tombstone: the key does not exist from this
    /// version on, until a later version inserts it again).
    pub deleted: bool,
    /// Commit timestamp of the version.
    pub version: Timestamp,
    /// Address of the version's record in the value region.
    pub addr: u64,
}

impl Cell {
    /// The cell's 32 bytes (head CV first, tail CV last).
    pub fn encode(&self) -> [u8; CELL_BYTES] {
        let mut b = [0u8; CELL_BYTES];
        b[0] = self.cv;
        b[1] = u8::from(self.valid);
        b[2] = u8::from(self.deleted);
        b[8..16].copy_from_slice(&self.version.get().to_le_bytes());
        b[CELL_ADDR_OFFSET..CELL_ADDR_OFFSET + 8].copy_from_slice(&self.addr.to_le_bytes());
        b[CELL_BYTES - 1] = self.cv;
        b
    }
}

/// A CVT as read: its header and cells.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cvt {
    /// The header.
    pub header: Header,
    /// The version cells, in slot order (not version order: GC overwrites in place).
    pub cells: Vec<Cell>,
}

/// A CVT read that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CvtError {
    /// Fewer bytes than the header and one cell.
    #[error("CVT of {0} bytes: shorter than a header and one cell")]
    Short(usize),
    /// Not a header plus whole cells.
    #[error("CVT of {0} bytes: not a header plus whole {CELL_BYTES}-byte cells")]
    Ragged(usize),
    /// A cell's head and tail CVs differ: it was being written while read.
    #[error("cell {cell} torn (head CV {head}, tail CV {tail})")]
    TornCell {
        /// The cell's slot.
        cell: usize,
        /// Its head CV.
        head: u8,
        /// Its tail CV.
        tail: u8,
    },
    /// A cell's valid or tombstone byte is neither 0 nor 1.
    #[error("cell {0} has a valid or tombstone byte that is neither 0 nor 1")]
    BadValid(usize),
    /// A hash bucket READ of the wrong size (`cvt_index::search`).
    #[error("bucket of {have} bytes where {want} were expected")]
    BucketSize {
        /// Bytes read.
        have: usize,
        /// Bytes of a bucket.
        want: usize,
    },
}

impl Cvt {
    /// A fresh CVT: `versions` empty cells.
    pub fn new(header: Header, versions: usize) -> Self {
        Self {
            header,
            cells: vec![
                Cell {
                    cv: 0,
                    valid: false,
                    deleted: false,
                    version: Timestamp::ZERO,
                    addr: 0,
                };
                versions
            ],
        }
    }

    /// The CVT's bytes ([`cvt_bytes`]`(cells)`).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; cvt_bytes(self.cells.len())];
        let h = &self.header;
        b[0..4].copy_from_slice(&h.table.to_le_bytes());
        b[4..8].copy_from_slice(&h.len.to_le_bytes());
        b[8..16].copy_from_slice(&h.key.to_le_bytes());
        b[LOCK_OFFSET..LOCK_OFFSET + 8].copy_from_slice(&h.lock.to_le_bytes());
        b[STATE_OFFSET..STATE_OFFSET + 8].copy_from_slice(&h.state.to_le_bytes());
        for (i, c) in self.cells.iter().enumerate() {
            let at = HEADER_BYTES + i * CELL_BYTES;
            b[at..at + CELL_BYTES].copy_from_slice(&c.encode());
        }
        b
    }

    /// Decode a CVT READ. Errors: too short or ragged, a torn cell, a corrupt valid byte.
    pub fn decode(b: &[u8]) -> Result<Self, CvtError> {
        if b.len() < HEADER_BYTES + CELL_BYTES {
            return Err(CvtError::Short(b.len()));
        }
        if !(b.len() - HEADER_BYTES).is_multiple_of(CELL_BYTES) {
            return Err(CvtError::Ragged(b.len()));
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8"));
        let header = Header {
            table: u32_at(0),
            len: u32_at(4),
            key: u64_at(8),
            lock: u64_at(LOCK_OFFSET),
            state: u64_at(STATE_OFFSET),
        };
        let n = (b.len() - HEADER_BYTES) / CELL_BYTES;
        let mut cells = Vec::with_capacity(n);
        for i in 0..n {
            let at = HEADER_BYTES + i * CELL_BYTES;
            let (head, tail) = (b[at], b[at + CELL_BYTES - 1]);
            if head != tail {
                return Err(CvtError::TornCell {
                    cell: i,
                    head,
                    tail,
                });
            }
            let flag = |o: usize| match b[at + o] {
                0 => Ok(false),
                1 => Ok(true),
                _ => Err(CvtError::BadValid(i)),
            };
            let (valid, deleted) = (flag(1)?, flag(2)?);
            cells.push(Cell {
                cv: head,
                valid,
                deleted,
                version: Timestamp(u64_at(at + 8)),
                addr: u64_at(at + 16),
            });
        }
        Ok(Self { header, cells })
    }

    /// Version selection (Motor 5.1, Lotus 7.2): the valid cell with the largest version
    /// smaller than `ts`, or `None` when no version is that old (it was never written
    /// or GC reclaimed it).
    pub fn select(&self, ts: Timestamp) -> Option<usize> {
        self.cells
            .iter()
            .enumerate()
            .filter(|(_, c)| c.valid && c.version < ts)
            .max_by_key(|(_, c)| c.version)
            .map(|(i, _)| i)
    }

    /// The version this CVT shows as newest (the tombstone's for a delete),
    /// [`Timestamp::ZERO`] when it has none.
    pub fn newest_version(&self) -> Timestamp {
        self.newest()
            .map_or(Timestamp::ZERO, |i| self.cells[i].version)
    }

    /// Early abort (Motor 5.1): whether a valid version is larger than `ts` (a
    /// transaction that committed after `ts` started). Under SR a transaction starting at
    /// `ts` that sees one aborts; under SI it reads its snapshot anyway.
    pub fn newer_than(&self, ts: Timestamp) -> bool {
        self.cells.iter().any(|c| c.valid && c.version > ts)
    }

    /// Whether a valid cell holds an INVISIBLE version ([`is_invisible`]): a writer
    /// between its data WRITE and its write-visible WRITE (Lotus 5.1), or the leftover of
    /// a crashed one.
    pub fn has_invisible(&self) -> bool {
        self.cells
            .iter()
            .any(|c| c.valid && is_invisible(c.version))
    }

    /// The cell holding transaction `id`'s INVISIBLE version, if any.
    pub fn invisible_cell(&self, id: u64) -> Option<usize> {
        let v = invisible(id);
        self.cells.iter().position(|c| c.valid && c.version == v)
    }

    /// The newest valid cell, if any; an INVISIBLE version ([`is_invisible`]) is not
    /// committed and never the newest.
    pub fn newest(&self) -> Option<usize> {
        self.cells
            .iter()
            .enumerate()
            .filter(|(_, c)| c.valid && !is_invisible(c.version))
            .max_by_key(|(_, c)| c.version)
            .map(|(i, _)| i)
    }

    /// Coordinator-active GC (Motor 4.3, Fig. 4b): the cell a new version goes to, an
    /// empty one if there is one, else the oldest version's (whose record buffer the
    /// writer then reuses). After overwrites the cells are not in version order; every
    /// search scans them all.
    pub fn victim(&self) -> usize {
        if let Some(i) = self.cells.iter().position(|c| !c.valid) {
            return i;
        }
        self.cells
            .iter()
            .enumerate()
            .min_by_key(|(_, c)| c.version)
            .map_or(0, |(i, _)| i)
    }

    /// Install `version` at `addr` in cell `slot` (the writer's local copy; it then
    /// WRITEs the record and the returned cell in that order), a tombstone when
    /// `deleted`. The CV is the slot's previous CV plus one, so a reader holding the
    /// slot's old cell sees the record's CV change. Returns the new cell.
    pub fn install(&mut self, slot: usize, version: Timestamp, addr: u64, deleted: bool) -> Cell {
        let c = &mut self.cells[slot];
        *c = Cell {
            cv: c.cv.wrapping_add(1),
            valid: true,
            deleted,
            version,
            addr,
        };
        *c
    }
}

/// A record READ that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// Not [`record_bytes`]`(len)` bytes.
    #[error("record of {have} bytes where {want} were expected")]
    Size {
        /// Bytes read.
        have: usize,
        /// Bytes a record of the expected length takes.
        want: usize,
    },
    /// The record's CVs differ: it was being written while read.
    #[error("record torn: CV {first} at its start, {other} at byte {at}")]
    Torn {
        /// CV of the first line.
        first: u8,
        /// The differing CV.
        other: u8,
        /// Its byte offset.
        at: usize,
    },
    /// The record is consistent but carries another CV than its cell: its buffer now
    /// holds another version (GC reused it after the cell was read).
    #[error("record has CV {record}, its cell {cell}")]
    Mismatch {
        /// The record's CV.
        record: u8,
        /// The cell's CV.
        cell: u8,
    },
}

/// A record's bytes in the value region: `payload` cut into 64-byte lines each starting
/// with `cv`, then `cv` as the end anchor ([`record_bytes`]`(payload.len())` bytes).
pub fn encode_record(payload: &[u8], cv: u8) -> Vec<u8> {
    let mut out = Vec::with_capacity(record_bytes(payload.len()));
    // The body is the payload and then the end anchor; each line opens with a CV.
    for byte in payload.iter().copied().chain(std::iter::once(cv)) {
        if out.len() % LINE_BYTES == 0 {
            out.push(cv);
        }
        out.push(byte);
    }
    debug_assert_eq!(out.len(), record_bytes(payload.len()));
    out
}

/// Check a record READ against the CV of the cell it was found through and return its
/// `len` payload bytes. Errors: wrong size, torn, or another version's record.
pub fn decode_record(b: &[u8], len: usize, cell_cv: u8) -> Result<Vec<u8>, RecordError> {
    let want = record_bytes(len);
    if b.len() != want {
        return Err(RecordError::Size {
            have: b.len(),
            want,
        });
    }
    let first = b[0];
    let mut payload = Vec::with_capacity(len);
    for (at, &byte) in b.iter().enumerate() {
        let anchor = at % LINE_BYTES == 0 || at == b.len() - 1;
        if anchor {
            if byte != first {
                return Err(RecordError::Torn {
                    first,
                    other: byte,
                    at,
                });
            }
        } else {
            payload.push(byte);
        }
    }
    if first != cell_cv {
        return Err(RecordError::Mismatch {
            record: first,
            cell: cell_cv,
        });
    }
    payload.truncate(len);
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            table: 3,
            len: 100,
            key: 42,
            lock: 0,
            state: SLOT_IN_USE,
        }
    }

    fn cvt(versions: &[Option<u64>]) -> Cvt {
        let mut t = Cvt::new(header(), versions.len());
        for (i, v) in versions.iter().enumerate() {
            if let Some(v) = v {
                t.install(i, Timestamp(*v), 0x1000 * (i as u64 + 1), false);
            }
        }
        t
    }

    #[test]
    fn a_cvt_round_trips_through_its_bytes() {
        let mut t = cvt(&[Some(10), None, Some(30), Some(20)]);
        t.header.lock = 7;
        let b = t.encode();
        assert_eq!(b.len(), cvt_bytes(4));
        assert_eq!(Cvt::decode(&b), Ok(t));
        assert_eq!(Cvt::decode(&b[..72]), Err(CvtError::Ragged(72)));
        assert_eq!(Cvt::decode(&b[..40]), Err(CvtError::Short(40)));
    }

    #[test]
    fn selection_takes_the_largest_version_before_the_timestamp() {
        // Unsorted, as after GC overwrites; cell 1 empty.
        let t = cvt(&[Some(30), None, Some(10), Some(20)]);
        assert_eq!(t.select(Timestamp(25)), Some(3));
        assert_eq!(t.select(Timestamp(31)), Some(0));
        assert_eq!(
            t.select(Timestamp(20)),
            Some(2),
            "a version equal to ts is not before it"
        );
        assert_eq!(
            t.select(Timestamp(10)),
            None,
            "nothing old enough: reclaimed or unborn"
        );
        assert_eq!(t.newest(), Some(0));
        // Early abort: something committed after the start.
        assert!(t.newer_than(Timestamp(25)));
        assert!(!t.newer_than(Timestamp(30)));
        // An invalidated version is not selected.
        let mut u = t.clone();
        u.cells[0].valid = false;
        assert_eq!(u.select(Timestamp(31)), Some(3));
        assert!(!u.newer_than(Timestamp(25)));
    }

    #[test]
    fn gc_fills_empty_cells_first_then_overwrites_the_oldest() {
        let mut t = cvt(&[None, None, None]);
        for (k, v) in [5u64, 6, 7].iter().enumerate() {
            let s = t.victim();
            assert_eq!(s, k, "empty cells first, in slot order");
            t.install(s, Timestamp(*v), 0, false);
        }
        // Full: the oldest (5, slot 0) goes, then 6 (slot 1), then the 8 written into 0
        // outlives 7, so 7's slot (2) is next.
        let s = t.victim();
        assert_eq!(s, 0);
        let old_cv = t.cells[0].cv;
        let c = t.install(s, Timestamp(8), 0x2000, false);
        assert_eq!(c.cv, old_cv.wrapping_add(1), "a reused slot's CV moves on");
        assert_eq!(t.victim(), 1);
        t.install(1, Timestamp(9), 0, false);
        assert_eq!(t.victim(), 2);
        assert_eq!(t.select(Timestamp(100)), Some(1));
    }

    #[test]
    fn a_torn_or_corrupt_cell_is_caught() {
        let t = cvt(&[Some(10), Some(20)]);
        let mut b = t.encode();
        // The writer's head CV landed, its tail CV not yet.
        let at = HEADER_BYTES + CELL_BYTES;
        b[at] = b[at].wrapping_add(1);
        assert!(matches!(
            Cvt::decode(&b),
            Err(CvtError::TornCell { cell: 1, .. })
        ));
        let mut b = t.encode();
        b[HEADER_BYTES + 1] = 2;
        assert_eq!(Cvt::decode(&b), Err(CvtError::BadValid(0)));
    }

    #[test]
    fn records_round_trip_at_every_length_around_line_boundaries() {
        for len in [
            0usize, 1, 61, 62, 63, 64, 125, 126, 127, 128, 189, 190, 1000,
        ] {
            let payload: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let r = encode_record(&payload, 9);
            assert_eq!(r.len(), record_bytes(len), "len {len}");
            assert_eq!(r[0], 9);
            assert_eq!(*r.last().unwrap(), 9);
            for line in r.chunks(LINE_BYTES) {
                assert_eq!(line[0], 9, "every line starts with the CV (len {len})");
            }
            assert_eq!(decode_record(&r, len, 9), Ok(payload), "len {len}");
        }
    }

    #[test]
    fn a_torn_record_and_another_versions_record_are_caught() {
        let payload = vec![0xabu8; 200];
        let old = encode_record(&payload, 4);
        let new = encode_record(&[0xcd; 200], 5);
        // A reader overlapping the writer: the first line is the new version's, the rest
        // still the old one's.
        let mut torn = old.clone();
        torn[..LINE_BYTES].copy_from_slice(&new[..LINE_BYTES]);
        assert!(matches!(
            decode_record(&torn, 200, 4),
            Err(RecordError::Torn {
                first: 5,
                other: 4,
                at: 64
            })
        ));
        // Only the end anchor missing (the last bytes not landed yet).
        let mut tail = new.clone();
        *tail.last_mut().unwrap() = 4;
        assert!(matches!(
            decode_record(&tail, 200, 5),
            Err(RecordError::Torn { .. })
        ));
        // Whole, but GC reused the buffer for a newer version after the cell was read.
        assert_eq!(
            decode_record(&new, 200, 4),
            Err(RecordError::Mismatch { record: 5, cell: 4 })
        );
        assert_eq!(
            decode_record(&new[..new.len() - 1], 200, 5),
            Err(RecordError::Size {
                have: new.len() - 1,
                want: new.len()
            })
        );
    }

    #[test]
    fn the_write_order_leaves_readers_a_consistent_or_detectable_state() {
        // A writer replaces version 10 (slot 0) by 30; a reader READs the cell, then the
        // record, at every point of the writer's two WRITEs (record, then cell).
        let mut t = cvt(&[Some(10), Some(20)]);
        let v10 = encode_record(&[1u8; 90], t.cells[0].cv);
        let old_cells = t.encode();
        let slot = t.victim();
        assert_eq!(slot, 0);
        let cell = t.install(slot, Timestamp(30), 0x1000, false);
        let v30 = encode_record(&[2u8; 90], cell.cv);
        let new_cells = t.encode();
        // Record fully rewritten, cell not yet: the reader selects version 10 through the
        // old cell and finds a record of another CV.
        let read = Cvt::decode(&old_cells).unwrap();
        let s = read.select(Timestamp(15)).unwrap();
        assert!(matches!(
            decode_record(&v30, 90, read.cells[s].cv),
            Err(RecordError::Mismatch { .. })
        ));
        // Partly rewritten record.
        let mut mid = v10.clone();
        mid[..LINE_BYTES].copy_from_slice(&v30[..LINE_BYTES]);
        assert!(decode_record(&mid, 90, read.cells[s].cv).is_err());
        // Both written: the reader at 35 gets version 30 whole; at 15 version 10 is gone.
        let read = Cvt::decode(&new_cells).unwrap();
        let s = read.select(Timestamp(35)).unwrap();
        assert_eq!(read.cells[s].version, Timestamp(30));
        assert_eq!(decode_record(&v30, 90, read.cells[s].cv), Ok(vec![2u8; 90]));
        assert_eq!(read.select(Timestamp(15)), None);
    }
}
