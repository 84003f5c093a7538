//! A memory node's CVT table (Motor 4.1; full records per version as in Lotus 7.1): a
//! hash index of CVT buckets ([`crate::cvt_index`]) and a value region, both in
//! registered memory that compute nodes read and write with one-sided operations.
//!
//! Every CVT slot of the index owns `versions` record buffers in the value region, one
//! per cell: the version in cell `i` of slot `s` of bucket `b` lives at value offset
//! `((b * CVTS_PER_BUCKET + s) * versions + i) * record_bytes(len)`. A writer that
//! GC-reuses a cell reuses its buffer, which is why a reader checks the record's CV
//! against the cell it read ([`crate::cvt::decode_record`]). Slots free at load time keep
//! their buffers, so an insert at run time needs no allocator: it claims a free slot
//! (CAS of its state word) and writes its first version into the slot's cell 0 buffer.
//! The value region is sized by the index (at most half full on average at load), not
//! by the records.

use serde::{Deserialize, Serialize};

use rrpc::fabric::{MemoryRegion, MrDesc, RemoteAddr};
use tso::Timestamp;

use crate::cvt::{cvt_bytes, encode_record, record_bytes, Cvt, Header, SLOT_IN_USE};
use crate::cvt_index::{home_bucket, search, Found, CVTS_PER_BUCKET};
use crate::store::StoreError;

/// A CVT table as a compute node sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CvtTableExport {
    /// Table id (1 and up).
    pub id: u32,
    /// Human-readable name.
    pub name: String,
    /// Version cells per CVT.
    pub versions: usize,
    /// Bytes of each record (a version's payload).
    pub len: usize,
    /// The index: `n_buckets` buckets of [`CVTS_PER_BUCKET`] CVTs.
    pub index: MrDesc,
    /// Buckets in the index (a power of two).
    pub n_buckets: u64,
    /// The value region.
    pub values: MrDesc,
    /// Insert guards: one 8-byte word per bucket (0 free, else an inserter's id), taken
    /// with CAS by inserts of keys whose home bucket it is (`cvt_remote`).
    pub guards: MrDesc,
    /// Records loaded (inserts at run time are not counted).
    #[serde(default)]
    pub records_loaded: u64,
}

impl CvtTableExport {
    /// Bytes of one CVT.
    pub fn cvt_bytes(&self) -> usize {
        cvt_bytes(self.versions)
    }
    /// Bytes of one bucket.
    pub fn bucket_bytes(&self) -> usize {
        CVTS_PER_BUCKET * self.cvt_bytes()
    }
    /// The bucket `key` hashes to.
    pub fn home_bucket(&self, key: u64) -> u64 {
        home_bucket(self.id, key, self.n_buckets)
    }
    /// Remote address of bucket `b` (modulo the bucket count: probing wraps).
    pub fn bucket_addr(&self, b: u64) -> RemoteAddr {
        self.index
            .at((b % self.n_buckets) * self.bucket_bytes() as u64)
    }
    /// Remote address of the CVT in `slot` of bucket `b`.
    pub fn cvt_addr(&self, b: u64, slot: usize) -> RemoteAddr {
        self.bucket_addr(b).offset((slot * self.cvt_bytes()) as u64)
    }
    /// Remote address of bucket `b`'s insert guard word.
    pub fn guard_addr(&self, b: u64) -> RemoteAddr {
        self.guards.at((b % self.n_buckets) * 8)
    }
    /// Remote address of the record buffer of `cell` of the CVT in `slot` of bucket `b`.
    pub fn record_addr(&self, b: u64, slot: usize, cell: usize) -> RemoteAddr {
        let i = ((b % self.n_buckets) * CVTS_PER_BUCKET as u64 + slot as u64)
            * self.versions as u64
            + cell as u64;
        self.values.at(i * record_bytes(self.len) as u64)
    }
}

/// A CVT table being loaded by its memory node.
pub struct CvtTableBuilder {
    export: CvtTableExport,
    index: MemoryRegion,
    values: MemoryRegion,
    guards: MemoryRegion,
    records: u64,
}

impl CvtTableBuilder {
    /// Allocate a table of CVTs of `versions` cells (at least 1) for up to about
    /// `capacity` records of `len` bytes: the index has a power-of-two number of buckets,
    /// at most half full on average at `capacity`. Errors: registering memory failed.
    pub fn new(
        fabric: &rrpc::fabric::Fabric,
        id: u32,
        name: &str,
        versions: usize,
        len: usize,
        capacity: u64,
    ) -> Result<Self, StoreError> {
        let versions = versions.max(1);
        let n_buckets = (capacity.max(1) * 2)
            .div_ceil(CVTS_PER_BUCKET as u64)
            .next_power_of_two();
        let slots = n_buckets as usize * CVTS_PER_BUCKET;
        let index = fabric.alloc_mr(slots * cvt_bytes(versions))?;
        let values = fabric.alloc_mr(slots * versions * record_bytes(len))?;
        let guards = fabric.alloc_mr(n_buckets as usize * 8)?;
        Ok(Self {
            export: CvtTableExport {
                id,
                name: name.into(),
                versions,
                len,
                index: index.desc(),
                n_buckets,
                values: values.desc(),
                guards: guards.desc(),
                records_loaded: 0,
            },
            index,
            values,
            guards,
            records: 0,
        })
    }

    /// Load `key` with `value` as its first version, committed at `version`. Errors: a
    /// value of the wrong size, a duplicate key, or every bucket full.
    pub fn insert(&mut self, key: u64, value: &[u8], version: Timestamp) -> Result<(), StoreError> {
        let e = &self.export;
        if value.len() != e.len {
            return Err(StoreError::ValueSize {
                table: e.name.clone(),
                got: value.len(),
                want: e.len,
            });
        }
        let mut bucket = vec![0u8; e.bucket_bytes()];
        let home = e.home_bucket(key);
        for probe in 0..e.n_buckets {
            let b = (home + probe) % e.n_buckets;
            let at = b as usize * e.bucket_bytes();
            self.index.read(at, &mut bucket);
            match search(&bucket, e.versions, e.id, key) {
                Ok(Found::At { .. }) => return Err(StoreError::Duplicate(e.name.clone(), key)),
                Ok(Found::Absent { free }) => {
                    let rec = e.record_addr(b, free, 0);
                    let mut cvt = Cvt::new(
                        Header {
                            table: e.id,
                            len: e.len as u32,
                            key,
                            lock: 0,
                            state: SLOT_IN_USE,
                        },
                        e.versions,
                    );
                    let cell = cvt.install(0, version, rec.addr, false);
                    self.values.write(
                        (rec.addr - e.values.addr) as usize,
                        &encode_record(value, cell.cv),
                    );
                    self.index.write(at + free * e.cvt_bytes(), &cvt.encode());
                    self.records += 1;
                    return Ok(());
                }
                // Torn is impossible while loading (nobody else writes); a full bucket
                // sends the key on.
                Ok(Found::Next) | Err(_) => {}
            }
        }
        Err(StoreError::Full(e.name.clone(), self.records))
    }

    /// Records loaded.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// The export, and the regions (index, values, insert guards), which must outlive
    /// serving.
    pub fn finish(mut self) -> (CvtTableExport, [MemoryRegion; 3]) {
        self.export.records_loaded = self.records;
        (self.export, [self.index, self.values, self.guards])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cvt::decode_record;
    use rrpc::fabric::shm::ClusterGuard;
    use rrpc::fabric::{Fabric, FabricConfig, FabricKind};
    use rrpc::NodeId;

    #[test]
    fn a_loaded_table_is_found_through_its_buckets_and_its_records_check_out() {
        let (g, _) = ClusterGuard::new(&format!("cvt-store-{}", std::process::id())).unwrap();
        let fabric =
            Fabric::open(&FabricConfig::new(FabricKind::Shm, g.name(), NodeId(1))).unwrap();
        let mut t = CvtTableBuilder::new(&fabric, 2, "accounts", 3, 100, 40).unwrap();
        for k in 0..40u64 {
            t.insert(k, &[k as u8; 100], Timestamp(1)).unwrap();
        }
        assert!(matches!(
            t.insert(7, &[0; 100], Timestamp(1)),
            Err(StoreError::Duplicate(_, 7))
        ));
        assert!(matches!(
            t.insert(99, &[0; 99], Timestamp(1)),
            Err(StoreError::ValueSize { .. })
        ));
        assert_eq!(t.records(), 40);
        let (e, [index, values, _guards]) = t.finish();
        // What a compute node does with two READs: the bucket (probing on), then the record.
        let mut bucket = vec![0u8; e.bucket_bytes()];
        for k in 0..40u64 {
            let mut b = e.home_bucket(k);
            let (slot, cvt) = loop {
                index.read((b % e.n_buckets) as usize * e.bucket_bytes(), &mut bucket);
                match search(&bucket, e.versions, e.id, k).unwrap() {
                    Found::At { slot, cvt } => break (slot, cvt),
                    Found::Next => b += 1,
                    Found::Absent { .. } => panic!("key {k} lost"),
                }
            };
            assert_eq!(
                e.cvt_addr(b, slot).addr,
                e.bucket_addr(b).addr + (slot * e.cvt_bytes()) as u64
            );
            let cell = cvt.select(Timestamp(2)).expect("version 1 is visible at 2");
            assert_eq!(
                cvt.select(Timestamp(1)),
                None,
                "nothing before its first version"
            );
            let c = cvt.cells[cell];
            assert_eq!(c.addr, e.record_addr(b, slot, cell).addr);
            let mut rec = vec![0u8; record_bytes(e.len)];
            values.read((c.addr - e.values.addr) as usize, &mut rec);
            assert_eq!(decode_record(&rec, e.len, c.cv), Ok(vec![k as u8; 100]));
        }
    }

    #[test]
    fn a_full_table_says_so() {
        let (g, _) = ClusterGuard::new(&format!("cvt-full-{}", std::process::id())).unwrap();
        let fabric =
            Fabric::open(&FabricConfig::new(FabricKind::Shm, g.name(), NodeId(1))).unwrap();
        // One bucket of four slots.
        let mut t = CvtTableBuilder::new(&fabric, 1, "tiny", 2, 8, 1).unwrap();
        assert_eq!(t.export.n_buckets, 1);
        for k in 0..CVTS_PER_BUCKET as u64 {
            t.insert(k, &[0; 8], Timestamp(1)).unwrap();
        }
        assert!(matches!(
            t.insert(100, &[0; 8], Timestamp(1)),
            Err(StoreError::Full(_, 4))
        ));
    }
}
