//! Commit logs: what a coordinator is about to install, written to the memory nodes
//! before the installs, so that a survivor can finish or undo the commit of a compute
//! node that died in the middle of it (Lotus 6; Motor 5.3 keeps such logs in the
//! compute node's battery-backed memory, which a memory-node copy replaces here).
//!
//! Each memory node exports one log region ([`LogExport`]) of fixed slots, one per
//! (compute node, client): a coordinator overwrites its own slot with each commit, so
//! the region never fills and needs no allocator. A log names every object the commit
//! installs (partition, table, CVT address, the victim cell and the new version of
//! each); a copy goes to every memory node the commit installs on, a round before the
//! installs (so that it has landed before any of them: the rule in
//! [`crate::recovery`] relies on it).
//!
//! Slot layout (little-endian): `id:8 | n:4 | pad:4 | checksum:8 | note:8`, then `n`
//! entries of [`ENTRY_BYTES`]: `part:2 | table:2 | cell:2 | pad:2 | addr:8 | version:8`,
//! then the commit word (8 bytes, outside the checksum): written 0 with the log, and
//! Lotus's write-visible step writes the commit timestamp there, on each memory node
//! ahead of that node's cells on one QP ([`CommitLog::commit`]).
//! The note is the application's word about the commit
//! ([`crate::coordinator::Txn::set_log_note`]). The checksum (FNV-1a over the header's
//! id, count and note and the entries) tells a
//! complete log from one torn by a crash while it was being written; a torn log's
//! installs never started.

use serde::{Deserialize, Serialize};

use rrpc::fabric::{MrDesc, RemoteAddr};

/// Bytes of a log's header.
pub const HEADER_BYTES: usize = 32;
/// Bytes of one log entry.
pub const ENTRY_BYTES: usize = 24;
/// Bytes of the commit word after the entries.
pub const COMMIT_WORD_BYTES: usize = 8;

/// The shape of a memory node's log region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogGeometry {
    /// Compute nodes with slots: node `n` uses row `n % nodes`.
    pub nodes: u32,
    /// Slots per compute node: client `c` of a node uses slot `c` of its row.
    pub clients: u32,
    /// Bytes of a slot (a multiple of 8, at least [`HEADER_BYTES`] + one entry).
    pub slot_bytes: u32,
}

impl Default for LogGeometry {
    /// 16 nodes x 128 clients x 8 KiB (16 MiB): room for 340 entries, more than TPC-C's
    /// Delivery writes.
    fn default() -> Self {
        Self {
            nodes: 16,
            clients: 128,
            slot_bytes: 8192,
        }
    }
}

impl LogGeometry {
    /// Bytes of the whole region.
    pub fn region_bytes(&self) -> u64 {
        u64::from(self.nodes) * u64::from(self.clients) * u64::from(self.slot_bytes)
    }

    /// Entries a slot holds (with the commit word after them).
    pub fn max_entries(&self) -> usize {
        (self.slot_bytes as usize).saturating_sub(HEADER_BYTES + COMMIT_WORD_BYTES) / ENTRY_BYTES
    }

    /// Byte offset of the slot of `client` of `node`; `None` when the client number
    /// is beyond [`Self::clients`].
    pub fn slot_offset(&self, node: u16, client: u16) -> Option<u64> {
        if u32::from(client) >= self.clients || self.nodes == 0 {
            return None;
        }
        let row = u64::from(u32::from(node) % self.nodes);
        Some((row * u64::from(self.clients) + u64::from(client)) * u64::from(self.slot_bytes))
    }

    /// Byte offset and length of the row of `node` (all its clients' slots).
    pub fn row(&self, node: u16) -> (u64, u64) {
        let len = u64::from(self.clients) * u64::from(self.slot_bytes);
        (u64::from(u32::from(node) % self.nodes.max(1)) * len, len)
    }

    /// Errors: a geometry a compute node could not use.
    pub fn validate(&self) -> Result<(), String> {
        if self.nodes == 0 || self.clients == 0 {
            return Err("commit log: nodes and clients must be at least 1".into());
        }
        if !self.slot_bytes.is_multiple_of(8)
            || (self.slot_bytes as usize) < HEADER_BYTES + ENTRY_BYTES + COMMIT_WORD_BYTES
        {
            return Err(format!(
                "commit log: slot of {} bytes (need a multiple of 8, at least {})",
                self.slot_bytes,
                HEADER_BYTES + ENTRY_BYTES + COMMIT_WORD_BYTES
            ));
        }
        Ok(())
    }
}

/// A memory node's log region as compute nodes see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogExport {
    /// The region.
    pub region: MrDesc,
    /// Its shape.
    pub geometry: LogGeometry,
}

impl LogExport {
    /// Remote address of the slot of `client` of `node`; `None` beyond the geometry.
    pub fn slot(&self, node: u16, client: u16) -> Option<RemoteAddr> {
        Some(self.region.at(self.geometry.slot_offset(node, client)?))
    }
}

/// One object a commit installs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogEntry {
    /// Partition (memory node) of its CVT.
    pub part: u16,
    /// Table id.
    pub table: u16,
    /// The victim cell the install overwrites.
    pub cell: u16,
    /// Address of the CVT in its table's index region.
    pub addr: u64,
    /// The version installed (MVCC's commit timestamp; old + 1 for OCC-CAS and Scythe).
    pub version: u64,
}

/// A decoded log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitLog {
    /// The transaction id ([`crate::txn_id`]).
    pub id: u64,
    /// The application's note ([`crate::coordinator::Txn::set_log_note`]; 0 if none).
    pub note: i64,
    /// What it installs.
    pub entries: Vec<LogEntry>,
    /// The commit word: 0 as logged; Lotus's commit timestamp once its write-visible
    /// step began on this copy ([`crate::lotus`]).
    pub commit: u64,
}

/// FNV-1a, 64-bit.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

impl CommitLog {
    /// Bytes of the encoded log (the commit word included).
    pub fn encoded_len(&self) -> usize {
        Self::commit_word_offset(self.entries.len()) + COMMIT_WORD_BYTES
    }

    /// Byte offset in its slot of the commit word of a log of `n` entries.
    pub fn commit_word_offset(n: usize) -> usize {
        HEADER_BYTES + n * ENTRY_BYTES
    }

    /// Encode into a slot's bytes. Errors: more entries than `max_entries`.
    pub fn encode(&self, max_entries: usize) -> Result<Vec<u8>, String> {
        if self.entries.len() > max_entries {
            return Err(format!(
                "commit log of {} entries; a slot holds {max_entries}",
                self.entries.len()
            ));
        }
        let mut b = vec![0u8; self.encoded_len()];
        b[0..8].copy_from_slice(&self.id.to_le_bytes());
        b[8..12].copy_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for (i, e) in self.entries.iter().enumerate() {
            let o = HEADER_BYTES + i * ENTRY_BYTES;
            b[o..o + 2].copy_from_slice(&e.part.to_le_bytes());
            b[o + 2..o + 4].copy_from_slice(&e.table.to_le_bytes());
            b[o + 4..o + 6].copy_from_slice(&e.cell.to_le_bytes());
            b[o + 8..o + 16].copy_from_slice(&e.addr.to_le_bytes());
            b[o + 16..o + 24].copy_from_slice(&e.version.to_le_bytes());
        }
        b[24..32].copy_from_slice(&self.note.to_le_bytes());
        let cw = Self::commit_word_offset(self.entries.len());
        let sum = fnv1a(&[&b[0..16], &b[24..cw]]);
        b[cw..cw + 8].copy_from_slice(&self.commit.to_le_bytes());
        b[16..24].copy_from_slice(&sum.to_le_bytes());
        Ok(b)
    }

    /// Decode a slot: `None` for an empty slot (id 0), a torn one (checksum wrong) or
    /// one whose length does not fit in `slot`.
    pub fn decode(slot: &[u8]) -> Option<Self> {
        let word = |o: usize| {
            slot.get(o..o + 8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        };
        let id = word(0).filter(|&i| i != 0)?;
        let n = u32::from_le_bytes(slot.get(8..12)?.try_into().ok()?) as usize;
        let end = n.checked_mul(ENTRY_BYTES)?.checked_add(HEADER_BYTES)?;
        let body = slot.get(HEADER_BYTES..end)?;
        if word(16)? != fnv1a(&[&slot[0..16], &slot[24..32], body]) {
            return None;
        }
        let note = word(24)? as i64;
        let commit = word(end)?;
        let le16 = |b: &[u8]| u16::from_le_bytes([b[0], b[1]]);
        let le64 = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
        let entries = body
            .chunks_exact(ENTRY_BYTES)
            .map(|e| LogEntry {
                part: le16(&e[0..2]),
                table: le16(&e[2..4]),
                cell: le16(&e[4..6]),
                addr: le64(&e[8..16]),
                version: le64(&e[16..24]),
            })
            .collect();
        Some(Self {
            id,
            note,
            entries,
            commit,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(n: usize) -> CommitLog {
        CommitLog {
            id: 0x0070_0300_0000_0009,
            note: -42,
            entries: (0..n)
                .map(|i| LogEntry {
                    part: i as u16 % 3,
                    table: 1,
                    cell: (i % 4) as u16,
                    addr: 4096 + 64 * i as u64,
                    version: 100 + i as u64,
                })
                .collect(),
            commit: 0,
        }
    }

    #[test]
    fn round_trip_in_a_slot_with_stale_bytes_after_it() {
        let g = LogGeometry::default();
        let mut slot = vec![0xabu8; g.slot_bytes as usize];
        let l = log(5);
        let b = l.encode(g.max_entries()).unwrap();
        slot[..b.len()].copy_from_slice(&b);
        assert_eq!(CommitLog::decode(&slot), Some(l.clone()));
        // The commit word is outside the checksum: written later, the log still decodes.
        let cw = CommitLog::commit_word_offset(5);
        slot[cw..cw + 8].copy_from_slice(&77u64.to_le_bytes());
        assert_eq!(CommitLog::decode(&slot).map(|l| l.commit), Some(77));
    }

    #[test]
    fn torn_empty_and_oversized_logs_are_refused() {
        let g = LogGeometry::default();
        let b = log(3).encode(g.max_entries()).unwrap();
        assert_eq!(CommitLog::decode(&[0u8; 64]), None, "empty slot");
        for cut in [HEADER_BYTES + 1, b.len() - COMMIT_WORD_BYTES - 1] {
            // A crash while the log was being written: the rest of the slot is old.
            let mut torn = b.clone();
            torn[cut] ^= 0x5a;
            assert_eq!(CommitLog::decode(&torn), None, "torn at {cut}");
        }
        let mut long = b.clone();
        long[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            CommitLog::decode(&long),
            None,
            "entry count beyond the slot"
        );
        assert!(log(g.max_entries() + 1).encode(g.max_entries()).is_err());
    }

    #[test]
    fn geometry_places_clients_in_rows() {
        let g = LogGeometry {
            nodes: 4,
            clients: 8,
            slot_bytes: 256,
        };
        assert_eq!(g.slot_offset(1, 2), Some((8 + 2) * 256));
        assert_eq!(g.slot_offset(5, 2), g.slot_offset(1, 2), "rows wrap");
        assert_eq!(g.slot_offset(1, 8), None);
        assert_eq!(g.row(2), (2 * 8 * 256, 8 * 256));
        assert!(g.validate().is_ok());
        assert!(LogGeometry {
            slot_bytes: 20,
            ..g
        }
        .validate()
        .is_err());
    }
}
