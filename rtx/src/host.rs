//! Hosting an rTX region on a memory node and reaching it from clients
//! (Transactional Indexes on Disaggregated Memory with Repairable Transaction, 4.2 Fig. 6).
//!
//! The memory node allocates one registered region, lays it out ([`Layout`]) and formats
//! every TXObj with a zeroed value at start-up, before it serves anyone; afterwards its CPU
//! never touches the region (clients use one-sided operations only). It exports the
//! region's descriptor with the layout under [`EXPORT_KEY`].

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;

use rrpc::fabric::{Fabric, FabricError, MemoryRegion, MrDesc};
use rrpc::node::NodeError;
use rrpc::runtime::{ConnectError, ThreadCtx};
use serde::{Deserialize, Serialize};

use crate::layout::{format, Layout, LayoutError, CHUNK_BLOCKS, TXOBJ_BYTES};
use crate::mem::{Mem, MemError};
use crate::rrpc_mem::RrpcMem;

/// The key under which a memory node exports its rTX region ([`RtxExport`]).
pub const EXPORT_KEY: &str = "rtx";

/// What a memory node exports about its rTX region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RtxExport {
    /// The region (address, length in bytes, rkey).
    pub region: MrDesc,
    /// Its layout.
    pub layout: Layout,
}

/// Errors of hosting or reaching an rTX region.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The sizes asked for give no usable layout.
    #[error("rTX pool: {0}")]
    Layout(#[from] LayoutError),
    /// The pool is too small for even one chunk of blocks beside the logs.
    #[error("an rTX pool of {bytes} bytes is too small (need at least {need})")]
    TooSmall {
        /// Bytes asked for.
        bytes: u64,
        /// Smallest usable size in bytes.
        need: u64,
    },
    /// Allocating the region failed.
    #[error("allocating the rTX region")]
    Alloc(#[source] FabricError),
    /// Formatting the region failed.
    #[error("formatting the rTX region")]
    Format(#[source] MemError),
    /// Connecting to the memory node failed.
    #[error("connecting to the memory node")]
    Connect(#[source] ConnectError),
    /// The node exports no rTX region, or one that does not parse.
    #[error("reading the rTX export")]
    Export(#[source] NodeError),
}

/// The largest layout that fits `bytes` with `ids` rTX IDs and `block_bytes` blocks: logs
/// of 16 entries, 1,024-slot reclamation tables (a client holds each foreign block it
/// replaced for at least [`crate::alloc::MIN_REUSE_MS`]; one past a full table is given
/// up), one TXObj per two blocks (the other half feeds copy-on-write updates). Errors: [`HostError::TooSmall`], [`HostError::Layout`].
pub fn layout_for_pool(bytes: u64, ids: u16, block_bytes: u64) -> Result<Layout, HostError> {
    let mut l = Layout {
        ids,
        max_entries: 16,
        objects: 0,
        block_bytes,
        blocks: CHUNK_BLOCKS,
        reclaim_slots: 1024,
    };
    l.validate()?;
    let fixed = l.total_bytes() - CHUNK_BLOCKS * block_bytes;
    // An upper bound (bitmap and owner words add a quarter byte per block), then down.
    let per_block = block_bytes + TXOBJ_BYTES / 2;
    let mut blocks = (bytes.saturating_sub(fixed) / per_block) / CHUNK_BLOCKS * CHUNK_BLOCKS;
    loop {
        if blocks == 0 {
            let need = Layout {
                objects: CHUNK_BLOCKS / 2,
                ..l
            }
            .total_bytes();
            return Err(HostError::TooSmall { bytes, need });
        }
        l.blocks = blocks;
        l.objects = blocks / 2;
        if l.total_bytes() <= bytes {
            l.validate()?;
            return Ok(l);
        }
        blocks -= CHUNK_BLOCKS;
    }
}

/// Allocate and format an rTX region of `layout` on `fabric`: every TXObj unlocked at
/// version 0 with a zeroed value (objects 0 to `objects - 1`, block `i` for object `i`,
/// claimed for rTX ID `ids - 1`). Keep the region alive while the node serves. Errors:
/// [`HostError::Layout`], [`HostError::Alloc`], [`HostError::Format`].
pub fn host(fabric: &Fabric, layout: Layout) -> Result<(MemoryRegion, RtxExport), HostError> {
    let zero = vec![0u8; layout.block_bytes as usize];
    host_with(fabric, layout, |_| zero.clone())
}

/// [`host`], with object `i` formatted to hold `value(i)` (a block of
/// `layout.block_bytes` bytes) instead of zeros: a loader's image, such as a bulk-loaded
/// B-link tree ([`crate::blink::bulk`]). Errors: as [`host`]; a value of the wrong length
/// is a [`HostError::Format`].
pub fn host_with(
    fabric: &Fabric,
    layout: Layout,
    value: impl Fn(u64) -> Vec<u8>,
) -> Result<(MemoryRegion, RtxExport), HostError> {
    layout.validate()?;
    let mr = fabric
        .alloc_mr(layout.total_bytes() as usize)
        .map_err(HostError::Alloc)?;
    let staging = Staging(&mr);
    futures::executor::block_on(format(&layout, &staging, layout.ids - 1, value))
        .map_err(HostError::Format)?;
    let export = RtxExport {
        region: mr.desc(),
        layout,
    };
    Ok((mr, export))
}

/// Connect `ctx`'s thread to the memory node at `addr` and return its rTX region and
/// layout. Errors: [`HostError::Connect`], [`HostError::Export`].
pub fn connect(ctx: &Rc<ThreadCtx>, addr: SocketAddr) -> Result<(RrpcMem, Layout), HostError> {
    let info = ctx.connect(addr).map_err(HostError::Connect)?;
    let e: RtxExport = info.export(EXPORT_KEY).map_err(HostError::Export)?;
    Ok((RrpcMem::new(ctx.clone(), info.node, e.region), e.layout))
}

/// The region through the owner's CPU, for formatting before the node serves (after
/// that, only clients' one-sided operations touch it).
struct Staging<'a>(&'a MemoryRegion);

impl Mem for Staging<'_> {
    async fn read(&self, off: u64, len: usize) -> Result<Vec<u8>, MemError> {
        let mut v = vec![0; len];
        self.check(off, len)?;
        self.0.read(off as usize, &mut v);
        Ok(v)
    }
    async fn write(&self, off: u64, data: &[u8]) -> Result<(), MemError> {
        self.check(off, data.len())?;
        self.0.write(off as usize, data);
        Ok(())
    }
    async fn cas(&self, off: u64, expected: u64, new: u64) -> Result<u64, MemError> {
        self.check(off, 8)?;
        if !off.is_multiple_of(8) {
            return Err(MemError::Bounds { off, len: 8 });
        }
        // CPU atomics on the region are fine here: no client reaches it yet.
        let w = self.0.atomic_u64(off as usize);
        Ok(
            match w.compare_exchange(expected, new, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(v) | Err(v) => v,
            },
        )
    }
}

impl Staging<'_> {
    fn check(&self, off: u64, len: usize) -> Result<(), MemError> {
        match off.checked_add(len as u64) {
            Some(end) if end <= self.0.len() as u64 => Ok(()),
            _ => Err(MemError::Bounds { off, len }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_layouts_fit_and_small_pools_are_refused() {
        for bytes in [4 << 20, 64 << 20, 1 << 30] {
            let l = layout_for_pool(bytes, 256, 1024).unwrap();
            assert!(l.total_bytes() <= bytes, "{l:?}");
            assert!(
                l.total_bytes() + (CHUNK_BLOCKS + 1) * 1032 > bytes,
                "too much left over: {l:?}"
            );
            assert_eq!(l.objects, l.blocks / 2);
        }
        assert!(matches!(
            layout_for_pool(4096, 256, 1024),
            Err(HostError::TooSmall { .. })
        ));
        assert!(matches!(
            layout_for_pool(1 << 20, 0, 1024),
            Err(HostError::Layout(_))
        ));
    }
}
