//! The memory node as the protocol sees it: one-sided READ, WRITE and 8-byte CAS at byte
//! offsets of one region. The protocol (execution, commit, TryCommit, repair) is written
//! once over this trait; [`LocalMem`] runs it in a `Vec` for unit tests and the model
//! checker, [`crate::rrpc_mem::RrpcMem`] over rrpc's one-sided operations.

use std::cell::RefCell;
use std::future::Future;
use std::rc::Rc;

/// A failed one-sided operation.
#[derive(Debug, thiserror::Error)]
pub enum MemError {
    /// Outside the region, or a CAS not 8-byte aligned.
    #[error("bad access of {len} bytes at offset {off}")]
    Bounds {
        /// Offset in bytes.
        off: u64,
        /// Length in bytes.
        len: usize,
    },
    /// The fabric failed the operation (the rTX's effect is then unknown: it may have
    /// landed; callers retry or leave repair to others).
    #[error("one-sided operation failed")]
    Fabric(#[source] rrpc::runtime::OneSidedError),
    /// A crash injected by a test at a named point of the protocol (only test builds
    /// produce it): the caller stops as if its process had died.
    #[error("injected crash")]
    Crashed,
}

/// One-sided access to the memory node's rTX region; offsets in bytes from its start.
/// Each operation is one round trip; operations awaited together may share a doorbell.
pub trait Mem {
    /// READ `len` bytes at `off`. Not atomic beyond 8-byte aligned words.
    fn read(&self, off: u64, len: usize) -> impl Future<Output = Result<Vec<u8>, MemError>>;
    /// WRITE `data` at `off`.
    fn write(&self, off: u64, data: &[u8]) -> impl Future<Output = Result<(), MemError>>;
    /// Compare-and-swap of the 8-byte word at `off` (8-byte aligned); returns the old word
    /// (the CAS succeeded iff it equals `expected`).
    fn cas(&self, off: u64, expected: u64, new: u64)
        -> impl Future<Output = Result<u64, MemError>>;
    /// WRITEs of `writes` (offset, data) in list order as one round on one QP: RC lands
    /// them in order, so a crash leaves a prefix of the list and never a later WRITE
    /// without an earlier one (Sherman's command combination: a node's write-back and its
    /// lock's release in one doorbell). The default runs them one after another, each its
    /// own round. Errors: the first failed WRITE's; later ones are not sent.
    fn write_ordered(&self, writes: &[(u64, &[u8])]) -> impl Future<Output = Result<(), MemError>> {
        async move {
            for (off, data) in writes {
                self.write(*off, data).await?;
            }
            Ok(())
        }
    }
    /// READ of the 8-byte word at `off`.
    fn read_u64(&self, off: u64) -> impl Future<Output = Result<u64, MemError>> {
        async move {
            let b = self.read(off, 8).await?;
            Ok(u64::from_le_bytes(b[..8].try_into().expect("8 bytes")))
        }
    }
}

/// A region in local memory (tests, the model checker). Clones share the bytes.
#[derive(Clone, Debug)]
pub struct LocalMem(Rc<RefCell<Vec<u8>>>);

impl LocalMem {
    /// `bytes` zeroed bytes.
    pub fn new(bytes: usize) -> Self {
        Self(Rc::new(RefCell::new(vec![0; bytes])))
    }

    /// A copy of the whole region.
    pub fn snapshot(&self) -> Vec<u8> {
        self.0.borrow().clone()
    }

    /// The 8-byte word at `off`, read directly.
    pub fn word(&self, off: u64) -> u64 {
        let m = self.0.borrow();
        u64::from_le_bytes(
            m[off as usize..off as usize + 8]
                .try_into()
                .expect("8 bytes"),
        )
    }

    /// Set the word at `off` directly.
    pub fn set_word(&self, off: u64, w: u64) {
        self.0.borrow_mut()[off as usize..off as usize + 8].copy_from_slice(&w.to_le_bytes());
    }

    fn check(&self, off: u64, len: usize) -> Result<usize, MemError> {
        let end = off.checked_add(len as u64);
        match end {
            Some(e) if e as usize <= self.0.borrow().len() => Ok(off as usize),
            _ => Err(MemError::Bounds { off, len }),
        }
    }

    /// Synchronous READ (the async one runs this).
    pub fn read_now(&self, off: u64, len: usize) -> Result<Vec<u8>, MemError> {
        let o = self.check(off, len)?;
        Ok(self.0.borrow()[o..o + len].to_vec())
    }

    /// Synchronous WRITE.
    pub fn write_now(&self, off: u64, data: &[u8]) -> Result<(), MemError> {
        let o = self.check(off, data.len())?;
        self.0.borrow_mut()[o..o + data.len()].copy_from_slice(data);
        Ok(())
    }

    /// Synchronous CAS.
    pub fn cas_now(&self, off: u64, expected: u64, new: u64) -> Result<u64, MemError> {
        if !off.is_multiple_of(8) {
            return Err(MemError::Bounds { off, len: 8 });
        }
        self.check(off, 8)?;
        let old = self.word(off);
        if old == expected {
            self.set_word(off, new);
        }
        Ok(old)
    }
}

impl Mem for LocalMem {
    async fn read(&self, off: u64, len: usize) -> Result<Vec<u8>, MemError> {
        self.read_now(off, len)
    }
    async fn write(&self, off: u64, data: &[u8]) -> Result<(), MemError> {
        self.write_now(off, data)
    }
    async fn cas(&self, off: u64, expected: u64, new: u64) -> Result<u64, MemError> {
        self.cas_now(off, expected, new)
    }
}

impl<M: Mem> Mem for Rc<M> {
    fn read(&self, off: u64, len: usize) -> impl Future<Output = Result<Vec<u8>, MemError>> {
        (**self).read(off, len)
    }
    fn write(&self, off: u64, data: &[u8]) -> impl Future<Output = Result<(), MemError>> {
        (**self).write(off, data)
    }
    fn cas(
        &self,
        off: u64,
        expected: u64,
        new: u64,
    ) -> impl Future<Output = Result<u64, MemError>> {
        (**self).cas(off, expected, new)
    }
    fn write_ordered(&self, writes: &[(u64, &[u8])]) -> impl Future<Output = Result<(), MemError>> {
        (**self).write_ordered(writes)
    }
}

/// A test memory node: `inner` with `before(off, len)` run before every READ (a client
/// stalled there, or another client acting meanwhile).
#[cfg(test)]
pub(crate) struct OnRead<F> {
    pub(crate) inner: LocalMem,
    pub(crate) before: F,
}

#[cfg(test)]
impl<F: Fn(u64, usize)> Mem for OnRead<F> {
    async fn read(&self, off: u64, len: usize) -> Result<Vec<u8>, MemError> {
        (self.before)(off, len);
        self.inner.read(off, len).await
    }
    async fn write(&self, off: u64, data: &[u8]) -> Result<(), MemError> {
        self.inner.write(off, data).await
    }
    async fn cas(&self, off: u64, expected: u64, new: u64) -> Result<u64, MemError> {
        self.inner.cas(off, expected, new).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_ops_and_bounds() {
        let m = LocalMem::new(64);
        m.write_now(8, &5u64.to_le_bytes()).unwrap();
        assert_eq!(m.cas_now(8, 4, 9).unwrap(), 5);
        assert_eq!(m.word(8), 5);
        assert_eq!(m.cas_now(8, 5, 9).unwrap(), 5);
        assert_eq!(m.word(8), 9);
        assert!(m.read_now(60, 8).is_err());
        assert!(m.cas_now(4, 0, 1).is_err());
    }
}
