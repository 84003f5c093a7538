//! Registered user buffers: a [`RegBuf`] is a chunk of the thread's registered arena that
//! the caller owns between operations. [`ThreadCtx::read_into`] has the NIC READ straight
//! into it and [`ThreadCtx::write_from`] has it WRITE straight from it, so a READ costs no
//! allocation and no copy into a fresh `Vec`; the caller then copies out only the bytes it
//! needs ([`RegBuf::read`]). Operations take the buffer by value and give it back when
//! they complete: while the NIC may touch it, nobody else can. [`ThreadCtx::call_into`]
//! returns an RPC's reply in one, written there by the server (zero-copy mode).

use std::rc::Rc;

use super::{OneSidedError, ThreadCtx};
use crate::arena::Chunk;
use crate::fabric::{MemoryRegion, RemoteAddr, WrOpcode};
use crate::NodeId;

/// Where a one-sided op's local buffer comes from.
pub(super) enum LocalBuf<'a> {
    /// A chunk allocated for the op, first filled with these bytes (WRITE), if any.
    Alloc(Option<&'a [u8]>),
    /// The caller's chunk, taken when the op is queued.
    Given(Option<Chunk>),
}

/// A registered buffer of `len()` bytes in one thread's arena ([`ThreadCtx::alloc_buf`]).
/// Not `Send`: its memory is registered with its thread's context. Dropping it returns the
/// memory to the arena.
pub struct RegBuf {
    chunk: Chunk,
    len: usize,
    mr: Rc<MemoryRegion>,
}

impl std::fmt::Debug for RegBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegBuf")
            .field("off", &self.chunk.off())
            .field("len", &self.len)
            .finish()
    }
}

impl RegBuf {
    /// The buffer over `len` bytes of `chunk`, a chunk of the arena whose memory is `mr`.
    pub(super) fn from_chunk(chunk: Chunk, len: usize, mr: Rc<MemoryRegion>) -> Self {
        Self { chunk, len, mr }
    }

    /// Length in bytes (what [`ThreadCtx::read_into`] and [`ThreadCtx::write_from`]
    /// transfer).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copy `dst.len()` bytes at byte `off` of the buffer into `dst`. Panics when
    /// `off + dst.len()` exceeds [`RegBuf::len`].
    pub fn read(&self, off: usize, dst: &mut [u8]) {
        assert!(
            off.checked_add(dst.len()).is_some_and(|e| e <= self.len),
            "RegBuf::read of {} bytes at {off} past its {} bytes",
            dst.len(),
            self.len
        );
        self.mr.read(self.chunk.off() + off, dst);
    }

    /// Copy `src` into the buffer at byte `off`. Panics when `off + src.len()` exceeds
    /// [`RegBuf::len`].
    pub fn write(&mut self, off: usize, src: &[u8]) {
        assert!(
            off.checked_add(src.len()).is_some_and(|e| e <= self.len),
            "RegBuf::write of {} bytes at {off} past its {} bytes",
            src.len(),
            self.len
        );
        self.mr.write(self.chunk.off() + off, src);
    }

    /// The buffer's bytes, copied.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.len];
        self.read(0, &mut v);
        v
    }
}

impl ThreadCtx {
    /// A registered buffer of `len` bytes from this thread's arena, for
    /// [`ThreadCtx::read_into`] and [`ThreadCtx::write_from`]. Its contents start
    /// unspecified. Errors: [`OneSidedError::TooLarge`] past
    /// [`super::RuntimeConfig::max_transfer`] or the arena's largest chunk;
    /// [`OneSidedError::NoBuffer`] when no chunk of that size is free (buffers held
    /// take arena memory from calls and one-sided ops: drop them when done).
    pub fn alloc_buf(&self, len: usize) -> Result<RegBuf, OneSidedError> {
        let inner = self.inner.borrow();
        let max = self.cfg.max_transfer.min(inner.arena.max_chunk());
        if len > max {
            return Err(OneSidedError::TooLarge { len, max });
        }
        let chunk = inner
            .arena
            .alloc(len)
            .ok_or(OneSidedError::NoBuffer { len })?;
        Ok(RegBuf {
            chunk,
            len,
            mr: inner.arena.mr_shared(),
        })
    }

    /// RDMA READ of `buf.len()` bytes at `remote` on `node` straight into `buf`, which
    /// comes back when the READ completed. Errors as [`ThreadCtx::read`], plus
    /// [`OneSidedError::ForeignBuffer`] for a buffer of another context; on an error
    /// the buffer is dropped (its memory returns to the arena; the NIC may have written
    /// part of it). A future dropped early keeps the buffer until the NIC is done.
    pub async fn read_into(
        &self,
        node: NodeId,
        remote: RemoteAddr,
        buf: RegBuf,
    ) -> Result<RegBuf, OneSidedError> {
        self.one_sided_buf(node, WrOpcode::Read, remote, buf).await
    }

    /// RDMA WRITE of `buf`'s `len()` bytes to `remote` on `node` straight from `buf`,
    /// which comes back when the WRITE completed. Errors as [`ThreadCtx::read_into`].
    pub async fn write_from(
        &self,
        node: NodeId,
        remote: RemoteAddr,
        buf: RegBuf,
    ) -> Result<RegBuf, OneSidedError> {
        self.one_sided_buf(node, WrOpcode::Write, remote, buf).await
    }

    /// One op of `opcode` on `buf`'s memory.
    async fn one_sided_buf(
        &self,
        node: NodeId,
        opcode: WrOpcode,
        remote: RemoteAddr,
        buf: RegBuf,
    ) -> Result<RegBuf, OneSidedError> {
        let RegBuf { chunk, len, mr } = buf;
        let max = self.cfg.max_transfer;
        let (r, back) = self
            .one_sided_op(
                node,
                opcode,
                remote,
                len,
                LocalBuf::Given(Some(chunk)),
                max,
                None,
            )
            .await;
        r.map_err(|e| *e)?;
        let (chunk, len) = back.expect("a completed op gives its buffer back");
        Ok(RegBuf { chunk, len, mr })
    }
}
