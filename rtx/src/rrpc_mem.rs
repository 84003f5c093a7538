//! [`Mem`] over rrpc's one-sided operations: the rTX region is one registered memory
//! region of a memory node, reached with RDMA READ, WRITE and CAS from a thread's runtime
//! context. Operations awaited together by a thread's coroutines share doorbells.

use std::rc::Rc;

use rrpc::fabric::MrDesc;
use rrpc::runtime::ThreadCtx;
use rrpc::NodeId;

use crate::mem::{Mem, MemError};

/// The most WRs [`RrpcMem`] posts as one ordered list, well under a send queue's depth.
pub const ORDERED_LIST_WRS: usize = 64;

/// The rTX region of memory node `node`, as seen from one thread.
#[derive(Clone)]
pub struct RrpcMem {
    ctx: Rc<ThreadCtx>,
    node: NodeId,
    region: MrDesc,
}

impl std::fmt::Debug for RrpcMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RrpcMem")
            .field("node", &self.node)
            .field("region", &self.region)
            .finish()
    }
}

impl RrpcMem {
    /// The region `region` of `node`, reached through `ctx` (already connected to it).
    pub fn new(ctx: Rc<ThreadCtx>, node: NodeId, region: MrDesc) -> Self {
        Self { ctx, node, region }
    }

    /// The thread's runtime context.
    pub fn ctx(&self) -> Rc<ThreadCtx> {
        self.ctx.clone()
    }

    fn check(&self, off: u64, len: usize) -> Result<(), MemError> {
        match off.checked_add(len as u64) {
            Some(end) if end <= self.region.len => Ok(()),
            _ => Err(MemError::Bounds { off, len }),
        }
    }
}

impl Mem for RrpcMem {
    async fn read(&self, off: u64, len: usize) -> Result<Vec<u8>, MemError> {
        self.check(off, len)?;
        self.ctx
            .read(self.node, self.region.at(off), len)
            .await
            .map_err(MemError::Fabric)
    }

    async fn write(&self, off: u64, data: &[u8]) -> Result<(), MemError> {
        self.check(off, data.len())?;
        self.ctx
            .write(self.node, self.region.at(off), data)
            .await
            .map_err(MemError::Fabric)
    }

    /// One ordered WR list per [`ORDERED_LIST_WRS`] WRITEs (a longer list goes as several,
    /// each sent once the one before it completed, so the order holds across them).
    async fn write_ordered(&self, writes: &[(u64, &[u8])]) -> Result<(), MemError> {
        let mut list = Vec::with_capacity(writes.len());
        for &(off, data) in writes {
            self.check(off, data.len())?;
            list.push((self.region.at(off), data));
        }
        for part in list.chunks(ORDERED_LIST_WRS) {
            self.ctx
                .write_ordered(self.node, part)
                .await
                .map_err(MemError::Fabric)?;
        }
        Ok(())
    }

    async fn cas(&self, off: u64, expected: u64, new: u64) -> Result<u64, MemError> {
        if !off.is_multiple_of(8) {
            return Err(MemError::Bounds { off, len: 8 });
        }
        self.check(off, 8)?;
        self.ctx
            .cas(self.node, self.region.at(off), expected, new)
            .await
            .map_err(MemError::Fabric)
    }
}
