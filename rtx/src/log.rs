//! The rTX log: one slot per rTX ID on the memory node, reused by that ID's rTXs
//! (Transactional Indexes on Disaggregated Memory with Repairable Transaction, 4.2-4.4).
//!
//! Slot layout (little-endian 8-byte words):
//!
//! ```text
//! +0   header    state:2 | identity L:47 | repair_lease:15      (CASed, never torn)
//! +8   checksum  the LockState word of the rTX that wrote the log (4.4)
//! +16  summary   entries:16 | crc32 of checksum and entries:32 | 0:16
//! +24  entries   n x 32 B: mptr, ndptr | old dptr, pre-lock version
//! ```
//!
//! The header is one word so that every transition is a CAS expecting this rTX's identity
//! (its lease L; leases per ID strictly increase, so L names one rTX of the slot): a paused
//! repairer's late CAS can then never move the owner's *next* rTX on the same slot. Only
//! the owner initialising a fresh log WRITEs a header.
//!
//! The paper's entry is 16 B (Table 2: mptr, old and new dptr). Here the first 16 B hold
//! mptr and ndptr, and two (inferred) words follow: the old dptr (the expected value of the
//! install CAS) and the object's pre-lock LLLock version (so that any TryCommit, the owner's
//! or a repairer's, releases to version + 1, and an abort to the version unchanged).
//!
//! The repair lease (valid only in DOING) is kept in ms after L, in 15 bits: a deadline
//! more than 32.767 s past L saturates, after which concurrent repairers may all proceed,
//! which is safe (TryCommit is idempotent) and only wastes work.

use crate::lllock::LEASE_MAX_MS;

/// Bytes before the first entry.
pub const HEADER_BYTES: u64 = 24;
/// Bytes per entry.
pub const ENTRY_BYTES: u64 = 32;
/// Byte offset of the checksum word.
pub const CHECKSUM_OFF: u64 = 8;
/// Largest repair-lease offset (ms after L).
pub const REPAIR_LEASE_MAX: u64 = (1 << 15) - 1;

/// State of an rTX log (4.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LogState {
    /// Executing or validating; may still abort.
    Init = 0,
    /// Committing (TryCommit runs); every lock will be released at version + 1.
    Doing = 1,
    /// Finished, committed or aborted; no action left, the slot may be reused.
    Done = 2,
    /// Aborted with locks possibly still held.
    Abort = 3,
}

/// A decoded header word.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Header {
    /// Log state.
    pub state: LogState,
    /// Identity: the lease (ms) of the rTX that owns the log.
    pub identity: u64,
    /// Repair lease in ms after `identity` (DOING only; 15 bits).
    pub repair_lease: u16,
}

impl Header {
    /// A header in `state` for the rTX whose lease is `identity`, with no repair lease.
    pub fn new(state: LogState, identity: u64) -> Self {
        Self {
            state,
            identity,
            repair_lease: 0,
        }
    }

    /// Encode. Panics if `identity` exceeds 47 bits or the repair lease 15.
    pub fn word(self) -> u64 {
        assert!(self.identity <= LEASE_MAX_MS, "identity past 47 bits");
        assert!(
            self.repair_lease as u64 <= REPAIR_LEASE_MAX,
            "repair lease past 15 bits"
        );
        (self.state as u64) << 62 | self.identity << 15 | self.repair_lease as u64
    }

    /// Decode.
    pub fn decode(w: u64) -> Self {
        let state = match w >> 62 {
            0 => LogState::Init,
            1 => LogState::Doing,
            2 => LogState::Done,
            _ => LogState::Abort,
        };
        Self {
            state,
            identity: (w >> 15) & LEASE_MAX_MS,
            repair_lease: (w & REPAIR_LEASE_MAX) as u16,
        }
    }

    /// The same rTX in DOING with a repair lease until `until_ms` (absolute), saturated
    /// to the 15-bit field.
    pub fn doing_until(self, until_ms: u64) -> Self {
        let off = until_ms.saturating_sub(self.identity).min(REPAIR_LEASE_MAX);
        Self {
            state: LogState::Doing,
            identity: self.identity,
            repair_lease: off as u16,
        }
    }

    /// Absolute repair-lease deadline in ms.
    pub fn repair_deadline_ms(self) -> u64 {
        self.identity + self.repair_lease as u64
    }

    /// Whether the repair lease has run out at `now_ms` (a repairer may take over).
    pub fn repair_expired(self, now_ms: u64) -> bool {
        self.repair_deadline_ms() < now_ms
    }
}

/// One write-set object in a log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogEntry {
    /// MN offset of the TXObj (its LLLock word; the dptr is the next word).
    pub mptr: u64,
    /// New dptr word to install.
    pub ndptr: u64,
    /// Old dptr word, the install CAS's expected value (inferred).
    pub dptr: u64,
    /// The object's LLLock version before this rTX locked it (inferred).
    pub version: u64,
}

/// A decoded log slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogImage {
    /// Header word, decoded.
    pub header: Header,
    /// The writer's LockState word.
    pub checksum: u64,
    /// Write set.
    pub entries: Vec<LogEntry>,
}

/// Why a slot's bytes do not decode to a log.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum LogDecodeError {
    /// Fewer bytes than the header, or than the entry count says.
    #[error("log slot truncated: {have} bytes, need {need}")]
    Truncated {
        /// Bytes given.
        have: usize,
        /// Bytes needed.
        need: usize,
    },
    /// The entries do not match their crc: a read raced with the owner rewriting the slot.
    #[error("log entries do not match their checksum")]
    Torn,
}

/// FNV-1a over `bytes`, 32 bits: cheap, enough to catch a torn read (not an adversary).
fn crc32(bytes: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in bytes {
        h ^= *b as u32;
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

impl LogImage {
    /// Bytes of a slot holding `entries` entries.
    pub fn bytes_for(entries: usize) -> u64 {
        HEADER_BYTES + ENTRY_BYTES * entries as u64
    }

    fn entry_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.entries.len() * ENTRY_BYTES as usize);
        for e in &self.entries {
            for w in [e.mptr, e.ndptr, e.dptr, e.version] {
                out.extend_from_slice(&w.to_le_bytes());
            }
        }
        out
    }

    fn crc(&self, entries: &[u8]) -> u32 {
        let mut b = self.checksum.to_le_bytes().to_vec();
        b.extend_from_slice(entries);
        crc32(&b)
    }

    /// Encode the whole slot prefix (header, checksum, summary, entries).
    pub fn encode(&self) -> Vec<u8> {
        assert!(
            self.entries.len() <= u16::MAX as usize,
            "too many log entries"
        );
        let entries = self.entry_bytes();
        let summary = (self.entries.len() as u64) << 48 | (self.crc(&entries) as u64) << 16;
        let mut out = Vec::with_capacity(HEADER_BYTES as usize + entries.len());
        out.extend_from_slice(&self.header.word().to_le_bytes());
        out.extend_from_slice(&self.checksum.to_le_bytes());
        out.extend_from_slice(&summary.to_le_bytes());
        out.extend_from_slice(&entries);
        out
    }

    /// Decode a slot read from the MN. Errors: [`LogDecodeError::Truncated`],
    /// [`LogDecodeError::Torn`].
    pub fn decode(b: &[u8]) -> Result<Self, LogDecodeError> {
        let need = HEADER_BYTES as usize;
        if b.len() < need {
            return Err(LogDecodeError::Truncated {
                have: b.len(),
                need,
            });
        }
        let header = Header::decode(u64_at(b, 0));
        let checksum = u64_at(b, 8);
        let summary = u64_at(b, 16);
        let n = (summary >> 48) as usize;
        let need = need + n * ENTRY_BYTES as usize;
        if b.len() < need {
            return Err(LogDecodeError::Truncated {
                have: b.len(),
                need,
            });
        }
        let entries = (0..n)
            .map(|i| {
                let o = HEADER_BYTES as usize + i * ENTRY_BYTES as usize;
                LogEntry {
                    mptr: u64_at(b, o),
                    ndptr: u64_at(b, o + 8),
                    dptr: u64_at(b, o + 16),
                    version: u64_at(b, o + 24),
                }
            })
            .collect();
        let img = Self {
            header,
            checksum,
            entries,
        };
        if img.crc(&b[HEADER_BYTES as usize..need]) != ((summary >> 16) & 0xFFFF_FFFF) as u32 {
            return Err(LogDecodeError::Torn);
        }
        Ok(img)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lllock::LockState;

    fn image() -> LogImage {
        let s = LockState {
            lease_ms: 1_700_000_000_000,
            id: 4,
            no_log: false,
        };
        LogImage {
            header: Header::new(LogState::Init, s.lease_ms),
            checksum: s.word(),
            entries: vec![
                LogEntry {
                    mptr: 64,
                    ndptr: 0x0100_0001_0000_0007,
                    dptr: 0x0100_0000_0000_0003,
                    version: 5,
                },
                LogEntry {
                    mptr: 80,
                    ndptr: 9,
                    dptr: 8,
                    version: 0,
                },
            ],
        }
    }

    #[test]
    fn header_round_trips_every_state() {
        for state in [
            LogState::Init,
            LogState::Doing,
            LogState::Done,
            LogState::Abort,
        ] {
            let h = Header {
                state,
                identity: LEASE_MAX_MS,
                repair_lease: 0x7FFF,
            };
            assert_eq!(Header::decode(h.word()), h);
            let h = Header {
                state,
                identity: 12345,
                repair_lease: 3,
            };
            assert_eq!(Header::decode(h.word()), h);
        }
    }

    #[test]
    fn headers_of_different_rtxs_differ_in_every_state() {
        for state in [
            LogState::Init,
            LogState::Doing,
            LogState::Done,
            LogState::Abort,
        ] {
            assert_ne!(
                Header::new(state, 100).word(),
                Header::new(state, 101).word()
            );
        }
    }

    #[test]
    fn repair_lease_is_relative_and_saturates() {
        let h = Header::new(LogState::Init, 10_000);
        let d = h.doing_until(10_050);
        assert_eq!((d.state, d.repair_deadline_ms()), (LogState::Doing, 10_050));
        assert!(!d.repair_expired(10_050) && d.repair_expired(10_051));
        // Before L: the deadline is L itself.
        assert_eq!(h.doing_until(9_000).repair_deadline_ms(), 10_000);
        // Far past L: saturated (and then expired for everyone).
        let far = h.doing_until(10_000 + 100_000);
        assert_eq!(far.repair_lease as u64, REPAIR_LEASE_MAX);
    }

    #[test]
    fn slot_round_trips() {
        let img = image();
        let b = img.encode();
        assert_eq!(b.len() as u64, LogImage::bytes_for(2));
        assert_eq!(LogImage::decode(&b), Ok(img));
    }

    #[test]
    fn torn_or_short_slots_are_detected() {
        let img = image();
        let mut b = img.encode();
        b[HEADER_BYTES as usize + 40] ^= 1; // an entry byte of a half-rewritten slot
        assert_eq!(LogImage::decode(&b), Err(LogDecodeError::Torn));
        let b = img.encode();
        assert!(matches!(
            LogImage::decode(&b[..30]),
            Err(LogDecodeError::Truncated { .. })
        ));
        // The checksum word (the writer's LockState) is covered too.
        let mut b = img.encode();
        b[8] ^= 1;
        assert_eq!(LogImage::decode(&b), Err(LogDecodeError::Torn));
    }
}
