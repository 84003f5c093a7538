//! Scythe's lock with its data (Scythe 4.3: each object's Takeout Lock at the memory
//! node that holds it): the read half of the lock-and-read RPC
//! ([`lockd::wire::LOCK_READ_HANDLER`]).
//!
//! A memory node started with its partition's lock service (`memnode --lock-service`)
//! serves a TOCC read as one RPC: the request is a Lock RPC of one entry and a read
//! descriptor ([`desc`]: the table and the address of the object's CVT, which the
//! coordinator has cached); when the ticket is served at once, the memory node's
//! [`LocalReader`] copies the CVT and its newest record out of its own image into the
//! reply, and the coordinator takes them ([`decode`]) as if it had READ them after its
//! turn came: a Lock RPC, a CVT READ and a record READ become one round trip. A ticket
//! queued behind others comes back without data, and the coordinator READs once it is
//! served, as with a lockd node.
//!
//! The copy is made on the memory node's CPU while the caller's ticket holds the lock,
//! so every writer of the object (Scythe writes only under a served ticket) has
//! finished; it is still decoded with the CVT's and the record's consistency checks,
//! as a one-sided READ is, and anything that does not check out (a torn copy, a slot
//! reused by another key, an address outside the table) sends the coordinator to the
//! READs instead.

use std::sync::Arc;

use lockd::wire::READ_DESC_BYTES;
use rrpc::fabric::MemoryRegion;

use crate::cvt::{decode_record, record_bytes, Cvt, SLOT_IN_USE};
use crate::cvt_store::CvtTableExport;

/// The read descriptor of `(table, CVT address)`: `table: u32`, zero padding (4 bytes),
/// `addr: u64`, little-endian.
pub fn desc(table: u32, cvt_addr: u64) -> [u8; READ_DESC_BYTES] {
    let mut d = [0; READ_DESC_BYTES];
    d[..4].copy_from_slice(&table.to_le_bytes());
    d[8..].copy_from_slice(&cvt_addr.to_le_bytes());
    d
}

/// `(table, CVT address)` of a read descriptor ([`desc`]).
fn parse_desc(d: &[u8; READ_DESC_BYTES]) -> (u32, u64) {
    let table = u32::from_le_bytes(d[..4].try_into().expect("4 bytes"));
    let addr = u64::from_le_bytes(d[8..].try_into().expect("8 bytes"));
    (table, addr)
}

/// One table of the memory node's primary image, with the regions its export names.
struct LocalTable {
    export: CvtTableExport,
    /// Index into the shared regions, and which of the three is the index region and
    /// which the value region.
    at: usize,
    index: usize,
    values: usize,
}

/// A memory node's reader of its primary image for the lock-and-read RPC: for a
/// descriptor naming a CVT of one of its tables, it copies the CVT and the record of
/// its newest version (none for a tombstone or a CVT without a visible version).
pub struct LocalReader {
    regions: Arc<Vec<[MemoryRegion; 3]>>,
    /// By table id.
    tables: Vec<Option<LocalTable>>,
}

impl LocalReader {
    /// The reader of the primary image whose tables are `tables`, held in `regions`
    /// (the memory node's regions; each table's index and value regions are found
    /// there by their addresses). A table whose regions are not there is skipped (its
    /// descriptors read nothing).
    pub fn new(tables: &[CvtTableExport], regions: Arc<Vec<[MemoryRegion; 3]>>) -> Self {
        let mut out: Vec<Option<LocalTable>> = Vec::new();
        for t in tables {
            let found = regions.iter().enumerate().find_map(|(at, rs)| {
                let pos = |addr: u64| rs.iter().position(|r| r.addr() == addr);
                Some((at, pos(t.index.addr)?, pos(t.values.addr)?))
            });
            let Some((at, index, values)) = found else {
                continue;
            };
            let i = t.id as usize;
            if out.len() <= i {
                out.resize_with(i + 1, || None);
            }
            out[i] = Some(LocalTable {
                export: t.clone(),
                at,
                index,
                values,
            });
        }
        Self {
            regions,
            tables: out,
        }
    }

    /// Append the CVT `desc` names and its newest record to `out` (see the module
    /// docs); nothing when the descriptor names no CVT of this image or the CVT copied
    /// does not decode.
    pub fn read(&self, desc: &[u8; READ_DESC_BYTES], out: &mut Vec<u8>) {
        let (table, addr) = parse_desc(desc);
        let Some(t) = self.tables.get(table as usize).and_then(Option::as_ref) else {
            return;
        };
        let rs = &self.regions[t.at];
        let e = &t.export;
        let cvt_len = e.cvt_bytes();
        let Some(off) = within(addr, e.index.addr, e.index.len, cvt_len) else {
            return;
        };
        let start = out.len();
        out.resize(start + cvt_len, 0);
        rs[t.index].read(off, &mut out[start..]);
        let Ok(cvt) = Cvt::decode(&out[start..]) else {
            out.truncate(start);
            return;
        };
        let Some(cell) = cvt.newest().map(|i| cvt.cells[i]) else {
            return;
        };
        if cell.deleted {
            return;
        }
        let rec_len = record_bytes(e.len);
        match within(cell.addr, e.values.addr, e.values.len, rec_len) {
            Some(voff) => {
                let at = out.len();
                out.resize(at + rec_len, 0);
                rs[t.values].read(voff, &mut out[at..]);
            }
            // A cell naming no record of the table: no data at all, the caller READs.
            None => out.truncate(start),
        }
    }
}

/// The offset of `[addr, addr + len)` in a region at `base` of `region_len` bytes, if
/// it lies inside.
fn within(addr: u64, base: u64, region_len: u64, len: usize) -> Option<usize> {
    let off = addr.checked_sub(base)?;
    (off.checked_add(len as u64)? <= region_len).then_some(off as usize)
}

/// What a lock-and-read reply carried for `(table, key)`, decoded as a coordinator's
/// READs would be: the CVT and, when it has a visible version that is not a tombstone,
/// that version's value. `None` when the bytes are not usable (empty, torn, another
/// key's CVT, a record that does not match its cell): the caller READs instead.
///
/// `versions` and `len` are the table's (cells per CVT, value bytes).
pub fn decode(
    bytes: &[u8],
    versions: usize,
    len: usize,
    table: u32,
    key: u64,
) -> Option<(Cvt, Option<Vec<u8>>)> {
    let cvt_len = crate::cvt::cvt_bytes(versions);
    let cvt = Cvt::decode(bytes.get(..cvt_len)?).ok()?;
    let h = &cvt.header;
    if h.state != SLOT_IN_USE || (h.table, h.key) != (table, key) {
        return None;
    }
    let value = match cvt.newest().map(|i| cvt.cells[i]) {
        Some(cell) if !cell.deleted => {
            let rec = bytes.get(cvt_len..cvt_len + record_bytes(len))?;
            Some(decode_record(rec, len, cell.cv).ok()?)
        }
        _ => None,
    };
    Some((cvt, value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cvt_store::CvtTableBuilder;
    use rrpc::fabric::shm::ClusterGuard;
    use rrpc::fabric::{Fabric, FabricConfig, FabricKind};
    use rrpc::NodeId;
    use tso::Timestamp;

    #[test]
    fn a_descriptor_reads_the_cvt_and_newest_record_and_anything_else_reads_nothing() {
        let (g, _) = ClusterGuard::new(&format!("lock-read-{}", std::process::id())).unwrap();
        let f = Fabric::open(&FabricConfig::new(FabricKind::Shm, g.name(), NodeId(1))).unwrap();
        let mut b = CvtTableBuilder::new(&f, 3, "t", 4, 24, 64).unwrap();
        for k in 0..20u64 {
            b.insert(k, &[k as u8; 24], Timestamp(1)).unwrap();
        }
        let (export, regions) = b.finish();
        let regions = Arc::new(vec![regions]);
        let reader = LocalReader::new(std::slice::from_ref(&export), regions.clone());
        // Find key 7's CVT the way a coordinator's bucket search would.
        let idx = &regions[0][reader.tables[3].as_ref().unwrap().index];
        let cvt_len = export.cvt_bytes();
        let mut addr = None;
        for off in (0..export.index.len as usize).step_by(cvt_len) {
            if off + cvt_len > export.index.len as usize {
                break;
            }
            let mut img = vec![0; cvt_len];
            idx.read(off, &mut img);
            if let Ok(c) = Cvt::decode(&img) {
                if c.header.state == SLOT_IN_USE && c.header.key == 7 {
                    addr = Some(export.index.addr + off as u64);
                }
            }
        }
        let addr = addr.expect("key 7 has a CVT");
        let mut out = vec![0xEE];
        reader.read(&desc(3, addr), &mut out);
        assert_eq!(out[0], 0xEE, "appended after what the reply holds");
        let (cvt, value) = decode(&out[1..], 4, 24, 3, 7).expect("usable");
        assert_eq!(cvt.header.key, 7);
        assert_eq!(value, Some(vec![7u8; 24]));
        // Another key's bytes are not taken for key 8's; nor a torn record.
        assert!(decode(&out[1..], 4, 24, 3, 8).is_none());
        let mut torn = out[1..].to_vec();
        let last = torn.len() - 1;
        torn[last] ^= 0xFF;
        assert!(decode(&torn, 4, 24, 3, 7).is_none());
        // Unknown table, an address outside the index, a misaligned one: nothing.
        for d in [
            desc(9, addr),
            desc(3, export.index.addr + export.index.len),
            desc(3, export.index.addr.wrapping_sub(64)),
            desc(3, addr + 8),
        ] {
            let mut out = Vec::new();
            reader.read(&d, &mut out);
            assert!(
                out.is_empty() || decode(&out, 4, 24, 3, 7).is_none(),
                "{d:?}"
            );
        }
        assert!(decode(&[], 4, 24, 3, 7).is_none());
    }
}
