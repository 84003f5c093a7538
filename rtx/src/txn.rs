//! Execution of an rTX: reads, buffered writes and the Opt2 pre-lock hook
//! (Transactional Indexes on Disaggregated Memory with Repairable Transaction, 4.3 Fig. 7,
//! and 4.5).
//!
//! A read costs two READs, the TXObj (16 B: LLLock and dptr) then the data block; later
//! reads of the same object return the local copy. A read aborts when the object is locked
//! by another rTX (a live committer's half-installed write set must not be seen), after
//! repairing the holder if its lease has expired; only an rTX's first read takes a live
//! holder's object, as its committed value, and the rTX then stays one read. Writes are
//! buffered; the new buffers are allocated and written at commit ([`crate::commit`]).

use crate::client::Client;
use crate::dptr::Dptr;
use crate::error::{AbortReason, RtxError};
use crate::lease::Clock;
use crate::lllock::{LockState, LockWord};
use crate::log::{Header, LogEntry, LogImage, LogState};
use crate::mem::Mem;
use crate::trycommit::owner_abort;

/// READs of a locked object's TXObj that [`Tx::read_for_update`] makes before it reads
/// anyway (and aborts if the lock is still held): about 3 ms at cx5's round trip, far
/// above a live holder's commit.
pub const LOCK_POLLS: u32 = 1024;

/// An object as read: its TXObj words at the read and its value.
#[derive(Clone, Debug)]
pub(crate) struct ReadEntry {
    pub(crate) mptr: u64,
    /// LLLock word seen (unlocked, or this rTX's own pre-lock).
    pub(crate) lock: u64,
    /// Pre-lock version (the unlocked word's version).
    pub(crate) version: u64,
    pub(crate) dptr: u64,
    pub(crate) value: Vec<u8>,
}

/// An object the rTX holds through an Opt2 pre-lock.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PreLock {
    pub(crate) mptr: u64,
    pub(crate) state: LockState,
    /// The object's version before the pre-lock.
    pub(crate) version: u64,
    /// Lease length in ms used for it (the repair lease defaults to it).
    pub(crate) lease_len_ms: u64,
}

/// An rTX in execution, holding its client. Dropping it without commit abandons it; an
/// Opt2 pre-lock is then left to expire and be repaired, so call [`Tx::abort`] instead.
#[derive(Debug)]
pub struct Tx<'c, C> {
    pub(crate) client: &'c mut Client<C>,
    pub(crate) reads: Vec<ReadEntry>,
    /// Indices into `reads` with their new value, in write order.
    pub(crate) writes: Vec<(usize, Vec<u8>)>,
    pub(crate) pre_lock: Option<PreLock>,
    /// The rTX's one read so far met the object locked by a live rTX and took its
    /// committed value ([`Tx::read`]); it can only commit as a one-object read-only rTX,
    /// so any further read, write or pre-lock aborts it.
    pub(crate) under_lock: bool,
}

impl<C: Clock> Client<C> {
    /// Start an rTX.
    pub fn begin(&mut self) -> Tx<'_, C> {
        Tx::new(self)
    }
}

impl<'c, C: Clock> Tx<'c, C> {
    pub(crate) fn new(client: &'c mut Client<C>) -> Self {
        Self {
            client,
            reads: Vec::new(),
            writes: Vec::new(),
            pre_lock: None,
            under_lock: false,
        }
    }

    fn find(&self, mptr: u64) -> Option<usize> {
        self.reads.iter().position(|r| r.mptr == mptr)
    }

    /// The object's TXObj, checked: unlocked or locked by this rTX. Repairs an expired
    /// holder (then aborts), aborts on a live one.
    pub(crate) async fn check_meta<M: Mem>(
        &mut self,
        mem: &M,
        mptr: u64,
        meta: &[u8],
    ) -> Result<(u64, u64), RtxError> {
        let lock = u64::from_le_bytes(meta[..8].try_into().expect("8 bytes"));
        let dptr = u64::from_le_bytes(meta[8..16].try_into().expect("8 bytes"));
        if let LockWord::Locked(s) = LockWord::decode(lock) {
            let mine = self
                .pre_lock
                .is_some_and(|p| p.mptr == mptr && p.state == s);
            if !mine {
                if s.expired(self.client.clock.now_ms()) {
                    self.client.repair(mem, mptr, lock).await?;
                    return Err(AbortReason::Repaired.into());
                }
                return Err(AbortReason::Locked.into());
            }
        }
        Ok((lock, dptr))
    }

    /// Whether the TXObj `meta` (16 bytes) is locked by another rTX whose lease has not
    /// expired (an expired holder is repaired by [`Self::check_meta`] instead).
    fn lock_is_live(&self, meta: &[u8]) -> bool {
        let lock = u64::from_le_bytes(meta[..8].try_into().expect("8 bytes"));
        match LockWord::decode(lock) {
            LockWord::Locked(s) => {
                self.pre_lock.is_none() && !s.expired(self.client.clock.now_ms())
            }
            LockWord::Unlocked(_) => false,
        }
    }

    /// READ the TXObj at `mptr` and, when the client remembers the object's data
    /// pointer, the block it points at in the same round. Returns the TXObj's 16 bytes
    /// and the guess (the remembered data pointer and that block), which is the
    /// object's value exactly when the TXObj still holds that pointer: a data pointer
    /// carries a 16-bit version bumped by every install, so the same pointer read
    /// before and after means the block was the object's data all along, and a block
    /// is never written while it is (copy-on-write, 4.2). The order in which the two
    /// READs execute therefore does not matter. (The paper reads the TXObj, then the
    /// data: two rounds on every read, 4.2; this is an optimization of this project.)
    async fn read_meta_and_guess<M: Mem>(
        &mut self,
        mem: &M,
        mptr: u64,
    ) -> Result<(Vec<u8>, Option<(u64, Vec<u8>)>), RtxError> {
        let Some((g, d)) = self
            .client
            .hint(mptr)
            .and_then(|g| Dptr::decode(g).map(|d| (g, d)))
        else {
            return Ok((mem.read(mptr, 16).await?, None));
        };
        let layout = &self.client.layout;
        let (meta, value) = futures::join!(
            mem.read(mptr, 16),
            mem.read(layout.block_addr(d.block), layout.block_bytes as usize)
        );
        Ok((meta?, Some((g, value?))))
    }

    /// Read the object whose TXObj is at `mptr`: its value (block-sized). Errors:
    /// [`RtxError::Aborted`] when it is locked by another rTX (after repairing an expired
    /// one), [`RtxError::NullDptr`], [`RtxError::Mem`]. On an error the rTX must not
    /// commit; a pre-lock is released by [`Tx::abort`].
    pub async fn read<M: Mem>(&mut self, mem: &M, mptr: u64) -> Result<Vec<u8>, RtxError> {
        self.read_with(mem, mptr, false).await
    }

    /// Read the object at `mptr` to write it: as [`Tx::read`], but a live holder's lock
    /// met by the READ is waited out, with READs of the 16-byte TXObj alone (at most
    /// [`LOCK_POLLS`]), instead of aborting or reading under it ([`Tx::write`] would
    /// then abort). The wait ends when the lock is free or its lease has expired (the
    /// read then repairs the holder and aborts), so a dead holder stalls it for at most
    /// its lease. An unlocked object costs what [`Tx::read`] does. Errors: as
    /// [`Tx::read`].
    pub async fn read_for_update<M: Mem>(
        &mut self,
        mem: &M,
        mptr: u64,
    ) -> Result<Vec<u8>, RtxError> {
        self.read_with(mem, mptr, true).await
    }

    async fn read_with<M: Mem>(
        &mut self,
        mem: &M,
        mptr: u64,
        wait: bool,
    ) -> Result<Vec<u8>, RtxError> {
        if let Some(i) = self.find(mptr) {
            if let Some((_, v)) = self.writes.iter().find(|(j, _)| *j == i) {
                return Ok(v.clone());
            }
            return Ok(self.reads[i].value.clone());
        }
        if self.under_lock {
            return Err(AbortReason::Locked.into());
        }
        // An earlier rTX of this ID cut short by an error may still hold locks (after a
        // pre-lock, the open log is this rTX's own).
        if self.pre_lock.is_none() {
            self.client.settle_log(mem).await?;
        }
        let mut start_ms = self.client.clock.now_ms();
        let (mut meta, mut guess) = self.read_meta_and_guess(mem, mptr).await?;
        if wait && self.lock_is_live(&meta) {
            for _ in 0..LOCK_POLLS {
                self.client.stats.lock_polls += 1;
                start_ms = self.client.clock.now_ms();
                meta = mem.read(mptr, 16).await?;
                if !self.lock_is_live(&meta) {
                    break;
                }
            }
            // The block is READ after the TXObj that now names it.
            guess = None;
        }
        let (lock, dptr) = if !wait && self.reads.is_empty() && self.lock_is_live(&meta) {
            // The first read of the rTX meets a live holder: take the object's committed
            // value, the block its dptr names now, instead of aborting [inf; the paper's
            // reads abort]. The holder installs its value by a CAS of that dptr, and a
            // block is never written while it is an object's data, so the value is the
            // one before or after the holder's install, as a read linearized before or
            // after it. That is only consistent for a single read: a second object could
            // come from the other side of the same holder's install, so the rTX may do
            // nothing more than commit read-only (`under_lock`; such a commit has no
            // validation).
            self.under_lock = true;
            self.client.stats.reads_under_lock += 1;
            (
                u64::from_le_bytes(meta[..8].try_into().expect("8 bytes")),
                u64::from_le_bytes(meta[8..16].try_into().expect("8 bytes")),
            )
        } else {
            self.check_meta(mem, mptr, &meta).await?
        };
        let d = Dptr::decode(dptr).ok_or(RtxError::NullDptr { mptr })?;
        let value = match guess {
            Some((g, v)) if g == dptr => {
                self.client.stats.hint_hits += 1;
                v
            }
            _ => {
                if guess.is_some() {
                    self.client.stats.hint_misses += 1;
                }
                mem.read(
                    self.client.layout.block_addr(d.block),
                    self.client.layout.block_bytes as usize,
                )
                .await?
            }
        };
        self.client.remember(mptr, dptr);
        // The block is read after the TXObj that points at it. A block replaced in
        // between is reused only MIN_REUSE_MS after its replacer is DONE (4.4), which a
        // live client's two READs never span; one stalled that long (stopped, or
        // descheduled) may have read another object's value. Validation would catch it
        // at commit, but a traversal that follows the value (a B-link tree's sibling
        // pointers) must not act on it meanwhile, and a one-object read-only rTX
        // commits without validation.
        if self.client.clock.now_ms().saturating_sub(start_ms) >= crate::alloc::MIN_REUSE_MS / 2 {
            return Err(AbortReason::StaleRead.into());
        }
        let version = match LockWord::decode(lock) {
            LockWord::Unlocked(v) => v,
            // Read under a live holder's lock: never written or validated (`under_lock`).
            LockWord::Locked(_) if self.under_lock => 0,
            LockWord::Locked(_) => unreachable!("pre-locked objects are read at pre-lock"),
        };
        self.reads.push(ReadEntry {
            mptr,
            lock,
            version,
            dptr,
            value: value.clone(),
        });
        Ok(value)
    }

    /// Buffer `value` (exactly one block) as the object's new value; reads it first if this
    /// rTX has not. Errors: as [`Tx::read`], [`RtxError::ValueSize`].
    pub async fn write<M: Mem>(
        &mut self,
        mem: &M,
        mptr: u64,
        value: Vec<u8>,
    ) -> Result<(), RtxError> {
        if self.under_lock {
            return Err(AbortReason::Locked.into());
        }
        let block = self.client.layout.block_bytes;
        if value.len() as u64 != block {
            return Err(RtxError::ValueSize {
                len: value.len(),
                block,
            });
        }
        let i = match self.find(mptr) {
            Some(i) => i,
            None => {
                self.read(mem, mptr).await?;
                self.reads.len() - 1
            }
        };
        match self.writes.iter_mut().find(|(j, _)| *j == i) {
            Some(w) => w.1 = value,
            None => self.writes.push((i, value)),
        }
        Ok(())
    }

    /// Opt2 (4.5, delegated concurrency control): lock the object at `mptr` now, during
    /// execution, instead of at commit (a B-link tree pre-locks the leaf it will update).
    /// The log header (INIT, with this object and its pre-lock version as the first entry)
    /// is written before the lock CAS, so a repairer that meets the lock finds the log; the
    /// lease also covers execution ([`crate::lease::LeaseConfig::execution_us`]). At most
    /// one object per rTX, before any other write. A live holder's lock is waited out
    /// first, as by [`Tx::read_for_update`]. Returns the value. Errors: as [`Tx::read`];
    /// [`AbortReason::LockFailed`] when the object changed or got locked.
    pub async fn pre_lock<M: Mem>(&mut self, mem: &M, mptr: u64) -> Result<Vec<u8>, RtxError> {
        assert!(
            self.pre_lock.is_none() && self.writes.is_empty(),
            "one pre-lock, first"
        );
        if self.under_lock {
            return Err(AbortReason::Locked.into());
        }
        self.client.settle_log(mem).await?;
        let mut meta = mem.read(mptr, 16).await?;
        // A live holder is waited out, as by [`Tx::read_for_update`] (Opt2's point is
        // to wait on a contended leaf rather than abort).
        for _ in 0..LOCK_POLLS {
            if !self.lock_is_live(&meta) {
                break;
            }
            self.client.stats.lock_polls += 1;
            meta = mem.read(mptr, 16).await?;
        }
        let (lock, dptr) = self.check_meta(mem, mptr, &meta).await?;
        let LockWord::Unlocked(version) = LockWord::decode(lock) else {
            unreachable!("check_meta refuses foreign locks and there is no own lock yet")
        };
        let c = &mut *self.client;
        let len = c.cfg.lease.execution_us.div_ceil(1000)
            + c.cfg.lease.length_ms(0, c.layout.max_entries as usize);
        let lease_ms = c.issuer.issue(c.clock.now_ms(), len);
        let state = LockState {
            lease_ms,
            id: c.id,
            no_log: false,
        };
        let img = LogImage {
            header: Header::new(LogState::Init, lease_ms),
            checksum: state.word(),
            entries: vec![LogEntry {
                mptr,
                ndptr: Dptr::NULL,
                dptr,
                version,
            }],
        };
        c.unfinished = Some(lease_ms);
        mem.write(c.layout.log_addr(c.id), &img.encode()).await?;
        c.stats.log_writes += 1;
        let old = mem.cas(mptr, lock, state.word()).await?;
        if old != lock {
            // Never locked: abort the log so the slot is DONE again.
            owner_abort(self.client, mem, state, &[], true).await?;
            self.client.stats.aborts += 1;
            return Err(AbortReason::LockFailed.into());
        }
        self.pre_lock = Some(PreLock {
            mptr,
            state,
            version,
            lease_len_ms: len,
        });
        let d = Dptr::decode(dptr).ok_or(RtxError::NullDptr { mptr })?;
        let value = mem
            .read(
                self.client.layout.block_addr(d.block),
                self.client.layout.block_bytes as usize,
            )
            .await?;
        self.reads.push(ReadEntry {
            mptr,
            lock: state.word(),
            version,
            dptr,
            value: value.clone(),
        });
        Ok(value)
    }

    /// Give the rTX up: if it pre-locked an object, mark its log ABORT, release the lock
    /// at its version and mark the log DONE. Errors: [`RtxError::Mem`].
    pub async fn abort<M: Mem>(self, mem: &M) -> Result<(), RtxError> {
        if let Some(p) = self.pre_lock {
            let won = [(p.mptr, p.version)];
            owner_abort(self.client, mem, p.state, &won, true).await?;
        }
        self.client.stats.aborts += 1;
        Ok(())
    }
}
