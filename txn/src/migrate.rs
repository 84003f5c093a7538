//! Re-replication's copy (the replication design's B.6.4 step 3, after Motor 5.3's data
//! migration): a partition's image is copied from its primary to a memory node that
//! rejoined empty, region by region, with bulk one-sided READs from the primary and
//! WRITEs to the new copy (Motor pushes with memory-node-to-memory-node WRITEs; the
//! bytes on the wire are the same). The memory nodes' CPUs take no part.
//!
//! The caller makes sure nothing writes the partition meanwhile: its view marks the
//! partition migrating ([`crate::view::View::start_migration`]), which stops attempts
//! from touching it, and a drain barrier waits for the attempts from before. The copy's
//! lock words are written as 0: a backup's lock words hold nothing but FORD's invisible
//! marks of commits in flight ([`crate::ford`]), and none is in flight. Each cell's
//! record address is translated to the new image's value region (every copy's cells
//! name its own record buffers).

use rrpc::fabric::MrDesc;
use rrpc::runtime::{join_all, ThreadCtx};
use rrpc::NodeId;
use serde::Serialize;

use crate::cvt::{CELL_ADDR_OFFSET, CELL_BYTES, HEADER_BYTES, LOCK_OFFSET};
use crate::cvt_store::CvtTableExport;
use crate::error::TxnError;

/// READs (and WRITEs) in flight at a time.
const IN_FLIGHT: usize = 4;

/// Largest READ or WRITE of the copy, bytes (also bounded by the thread's
/// [`rrpc::runtime::RuntimeConfig::max_transfer`]).
const CHUNK_BYTES: usize = 4 << 20;

/// One table's copy.
#[derive(Clone, Debug, Serialize)]
pub struct TableCopy {
    /// The table's name.
    pub table: String,
    /// Bytes copied (index and value regions).
    pub bytes: u64,
    /// Wall time of its copy, milliseconds.
    pub ms: f64,
}

/// Copy every table of image `from` (on memory node `src`) into image `to` (on `dst`),
/// which has the same geometry: each table's index region (its CVTs, lock words
/// written as 0, cells naming the new image's record buffers) and its value region
/// (the records), in READs and WRITEs of at most
/// 4 MiB, a few in flight. Returns the bytes and time per table. The insert guards are
/// not copied (a new image's are 0, and no insert is in flight).
///
/// Errors: [`TxnError::Export`] when the two images' geometry differs;
/// [`TxnError::Rpc`] when a READ or WRITE fails.
pub async fn copy_image(
    ctx: &ThreadCtx,
    src: NodeId,
    from: &[CvtTableExport],
    dst: NodeId,
    to: &[CvtTableExport],
) -> Result<Vec<TableCopy>, TxnError> {
    if from.len() != to.len() {
        return Err(TxnError::Export(format!(
            "copying an image of {} tables into one of {}",
            from.len(),
            to.len()
        )));
    }
    let mut out = Vec::with_capacity(from.len());
    for (f, t) in from.iter().zip(to) {
        if (
            f.id,
            f.len,
            f.versions,
            f.n_buckets,
            f.index.len,
            f.values.len,
        ) != (
            t.id,
            t.len,
            t.versions,
            t.n_buckets,
            t.index.len,
            t.values.len,
        ) {
            return Err(TxnError::Export(format!(
                "table {}: the new copy's geometry differs from the primary's",
                f.name
            )));
        }
        let t0 = std::time::Instant::now();
        let cvt = f.cvt_bytes();
        let max = CHUNK_BYTES.min(ctx.config().max_transfer);
        // Whole CVTs per chunk, so that each chunk's lock words are where the CVT
        // size says.
        let per = (max / cvt).max(1) * cvt;
        let cvts = Some(Cvts {
            bytes: cvt,
            versions: f.versions,
            from: f.values,
            to: t.values,
        });
        let mut bytes = copy_region(ctx, src, &f.index, dst, &t.index, per, cvts).await?;
        bytes += copy_region(ctx, src, &f.values, dst, &t.values, max, None).await?;
        out.push(TableCopy {
            table: f.name.clone(),
            bytes,
            ms: t0.elapsed().as_secs_f64() * 1e3,
        });
    }
    Ok(out)
}

/// An index region's CVTs, and the value regions their cells' addresses point into.
#[derive(Clone, Copy)]
struct Cvts {
    bytes: usize,
    versions: usize,
    from: MrDesc,
    to: MrDesc,
}

impl Cvts {
    /// The CVT `cv` as the new image holds it: lock word 0, each cell's record
    /// address moved from the primary's value region to the new one's.
    fn rebase(&self, cv: &mut [u8]) {
        cv[LOCK_OFFSET..LOCK_OFFSET + 8].fill(0);
        for i in 0..self.versions {
            let at = HEADER_BYTES + i * CELL_BYTES + CELL_ADDR_OFFSET;
            let w = &mut cv[at..at + 8];
            let a = u64::from_le_bytes(w.try_into().expect("8 bytes"));
            if a >= self.from.addr && a < self.from.addr + self.from.len {
                w.copy_from_slice(&(a - self.from.addr + self.to.addr).to_le_bytes());
            }
        }
    }
}

/// Copy region `from` (on `src`) into `to` (on `dst`) in chunks of `per` bytes; with
/// `cvts`, the region is CVTs, each rebased on the way ([`Cvts::rebase`]). Returns the
/// bytes copied.
async fn copy_region(
    ctx: &ThreadCtx,
    src: NodeId,
    from: &MrDesc,
    dst: NodeId,
    to: &MrDesc,
    per: usize,
    cvts: Option<Cvts>,
) -> Result<u64, TxnError> {
    let len = from.len as usize;
    let starts: Vec<usize> = (0..len).step_by(per.max(1)).collect();
    for group in starts.chunks(IN_FLIGHT) {
        let done = join_all(group.iter().map(|&s| async move {
            let n = per.min(len - s);
            let mut img = ctx.read(src, from.at(s as u64), n).await?;
            if let Some(c) = cvts {
                for cv in img.chunks_exact_mut(c.bytes) {
                    c.rebase(cv);
                }
            }
            ctx.write(dst, to.at(s as u64), &img).await
        }))
        .await;
        for d in done {
            d?;
        }
    }
    Ok(len as u64)
}
