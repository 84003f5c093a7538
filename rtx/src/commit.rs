//! Commit and TryCommit (Transactional Indexes on Disaggregated Memory with Repairable
//! Transaction, 4.3 Figs. 8 and 9, with the corrections listed below), and the Opt1
//! single-write path (4.5).
//!
//! Logged commit (write set of 2 or more, or any pre-lock):
//!
//! 1. `L = now + estimate(reads, writes) + DRIFT`, `S = LockState(L, id)`.
//! 2. One round: WRITE every new value into a fresh block, WRITE the log (INIT, identity
//!    L, checksum S, entries), WRITE the reclamation table if it changed.
//! 3. One round: CAS each written object's LLLock from the unlocked word read to S.
//! 4. One round (validation): READ every read and written TXObj. Abort if a read object is
//!    locked by anyone else or changed, or a written object's dptr changed (a lock CAS
//!    alone cannot see a dptr replaced by an Opt1 repair, which releases at a version of
//!    its choosing).
//! 5. TryCommit: CAS the header from (INIT, L) to (DOING, L, repair lease). If that CAS
//!    fails, a repairer aborted this rTX, whatever the header says afterwards: release
//!    own locks (CAS from S, idempotent) and report the abort. Otherwise CAS every dptr
//!    from old to new, then every LLLock from S to version + 1, then CAS the header
//!    from (DOING, L, *) to (DONE, L): each CAS expects a value unique to this rTX, so any
//!    number of TryCommits, the owner's and repairers', have the effect of one.
//!
//! Read-only: one validation round over the read set, except for a single object (its
//! READ pair is atomic, see `commit_inner`).
//!
//! Abort before DOING: CAS the header (INIT, L) to (ABORT, L), release own locks at the
//! version unchanged, CAS (ABORT, L) to (DONE, L).
//!
//! Opt1 (one written object, no pre-lock): no log; S carries the no-log bit. Lock, validate
//! as above, CAS the dptr, and only after that CAS completed release the lock to
//! version + 1; a failed dptr CAS means a repairer replaced the buffer (the Opt1 repair),
//! so the rTX aborted and releases at the version unchanged (a no-op if the repairer did).

use futures::future::join_all;

use crate::dptr::Dptr;
use crate::error::{AbortReason, RtxError};
use crate::layout::dptr_addr;
use crate::lease::Clock;
use crate::lllock::{next_version, unlocked, LockState, LockWord};
use crate::log::{Header, LogEntry, LogImage, LogState};
use crate::mem::Mem;
use crate::trycommit::{owner_abort, try_commit_steps};
use crate::txn::Tx;

impl<C: Clock> Tx<'_, C> {
    /// Commit (Fig. 8): Ok when committed. Errors: [`RtxError::Aborted`] (nothing of the
    /// rTX is visible; run it again), [`RtxError::TooManyWrites`], [`RtxError::Alloc`],
    /// [`RtxError::Mem`] (outcome unknown to this call; the log lets repair finish it).
    pub async fn commit<M: Mem>(mut self, mem: &M) -> Result<(), RtxError> {
        let r = self.commit_inner(mem).await;
        match &r {
            Ok(()) => self.client.stats.commits += 1,
            Err(RtxError::Aborted(_)) => self.client.stats.aborts += 1,
            Err(_) => {}
        }
        r
    }

    async fn validate_reads<M: Mem>(
        &mut self,
        mem: &M,
        skip: &[u64],
        own: Option<u64>,
    ) -> Result<Option<(u64, u64)>, RtxError> {
        let metas = join_all(self.reads.iter().map(|r| mem.read(r.mptr, 16))).await;
        for (r, m) in self.reads.iter().zip(metas) {
            let m = m?;
            let lock = u64::from_le_bytes(m[..8].try_into().expect("8 bytes"));
            let dptr = u64::from_le_bytes(m[8..16].try_into().expect("8 bytes"));
            if skip.contains(&r.mptr) {
                if dptr != r.dptr || Some(lock) != own {
                    return Ok(Some((r.mptr, lock)));
                }
            } else if lock != r.lock || dptr != r.dptr {
                return Ok(Some((r.mptr, lock)));
            }
        }
        Ok(None)
    }

    async fn fail_with<M: Mem>(
        &mut self,
        mem: &M,
        mptr: u64,
        word: u64,
        why: AbortReason,
    ) -> Result<(), RtxError> {
        if let LockWord::Locked(s) = LockWord::decode(word) {
            let own = self.pre_lock.map(|p| p.state.word());
            if Some(word) != own && s.expired(self.client.clock.now_ms()) {
                self.client.repair(mem, mptr, word).await?;
                return Err(AbortReason::Repaired.into());
            }
        }
        Err(why.into())
    }

    /// Release a pre-lock at its version and move the log to DONE (an rTX that ends
    /// before locking anything else).
    async fn drop_pre_lock<M: Mem>(&mut self, mem: &M) -> Result<(), RtxError> {
        if let Some(p) = self.pre_lock {
            owner_abort(self.client, mem, p.state, &[(p.mptr, p.version)], true).await?;
        }
        Ok(())
    }

    /// The lease, new blocks and log entries of the write set; a pre-locked object stays
    /// entry 0.
    async fn prepare<M: Mem>(&mut self, mem: &M, opt1: bool) -> Result<Prepared, RtxError> {
        let n = self.writes.len();
        let c = &mut *self.client;
        let (state, lease_len) = match self.pre_lock {
            Some(p) => (p.state, p.lease_len_ms),
            None => {
                let len = c.cfg.lease.length_ms(self.reads.len() - n, n);
                // Only a logged rTX's LockState must be new for its ID (the log's
                // checksum); an Opt1 lease follows the clock.
                let lease_ms = if opt1 {
                    c.issuer.issue_unlogged(c.clock.now_ms(), len)
                } else {
                    c.issuer.issue(c.clock.now_ms(), len)
                };
                (
                    LockState {
                        lease_ms,
                        id: c.id,
                        no_log: opt1,
                    },
                    len,
                )
            }
        };
        let mut order: Vec<usize> = (0..n).collect();
        if let Some(p) = self.pre_lock {
            order.sort_by_key(|&k| self.reads[self.writes[k].0].mptr != p.mptr);
        }
        let mut entries = Vec::with_capacity(n);
        let mut blocks = Vec::with_capacity(n);
        for &k in &order {
            let r = &self.reads[self.writes[k].0];
            let block = match c.take_block(mem).await {
                Ok(b) => b,
                Err(e) => {
                    for b in blocks {
                        c.alloc.give_back(b);
                    }
                    return Err(e);
                }
            };
            let old = Dptr::decode(r.dptr).ok_or(RtxError::NullDptr { mptr: r.mptr })?;
            let nd = old.successor(block, c.alloc.incarnation());
            entries.push(LogEntry {
                mptr: r.mptr,
                ndptr: nd.word(),
                dptr: r.dptr,
                version: r.version,
            });
            blocks.push(block);
        }
        let old_blocks = entries
            .iter()
            .filter_map(|e| Dptr::decode(e.dptr))
            .map(|d| d.block)
            .collect();
        Ok(Prepared {
            state,
            lease_len,
            opt1,
            order,
            entries,
            blocks,
            old_blocks,
        })
    }

    /// Round 1: the new values, the log (not for Opt1) and the reclamation table, which
    /// must list blocks of other clients' chunks before the installs unreference them.
    async fn write_round<M: Mem>(
        &mut self,
        mem: &M,
        p: &Prepared,
        img: &LogImage,
    ) -> Result<(), RtxError> {
        let c = &mut *self.client;
        c.alloc.hold(&p.old_blocks, c.owners.as_deref());
        let values = p
            .order
            .iter()
            .zip(&p.blocks)
            .map(|(&k, &b)| mem.write(c.layout.block_addr(b), &self.writes[k].1));
        // After an Opt2 pre-lock the header already lives on the MN and a repairer may
        // have CASed it: rewrite only what follows it.
        let skip = if self.pre_lock.is_some() { 8 } else { 0 };
        let log_bytes = (!p.opt1).then(|| img.encode()[skip..].to_vec());
        let table = c.alloc.table_writes();
        let log = async {
            match &log_bytes {
                Some(b) => mem.write(c.layout.log_addr(c.id) + skip as u64, b).await,
                None => Ok(()),
            }
        };
        let tab = join_all(table.iter().map(|(at, b)| mem.write(*at, b)));
        if !p.opt1 {
            c.unfinished = Some(p.state.lease_ms);
        }
        let (v, l, t) = futures::join!(join_all(values), log, tab);
        for r in v {
            r?;
        }
        l?;
        for r in t {
            r?;
        }
        c.alloc.flushed();
        if !p.opt1 {
            c.stats.log_writes += 1;
        }
        Ok(())
    }

    /// Round 2: CAS every written object's LLLock (a pre-locked one is held already).
    /// Returns the locks won as (mptr, version) and the first failure as (mptr, word seen).
    async fn lock_round<M: Mem>(
        &mut self,
        mem: &M,
        p: &Prepared,
    ) -> Result<(Vec<(u64, u64)>, Option<(u64, u64)>), RtxError> {
        let to_lock = self.lock_targets(p);
        let got = lock_cas(mem, &to_lock, p.state.word()).await;
        self.locks_won(&to_lock, got)
    }

    /// The objects [`Self::lock_round`] CASes: (mptr, lock word read, version).
    fn lock_targets(&self, p: &Prepared) -> Vec<(u64, u64, u64)> {
        let pre = self.pre_lock.map(|p| p.mptr);
        p.entries
            .iter()
            .filter(|e| Some(e.mptr) != pre)
            .map(|e| {
                let r = self
                    .reads
                    .iter()
                    .find(|r| r.mptr == e.mptr)
                    .expect("written objects are read");
                (e.mptr, r.lock, e.version)
            })
            .collect()
    }

    /// The locks won among `to_lock` given the CASes' results `got`, as
    /// [`Self::lock_round`] returns them.
    #[allow(clippy::type_complexity)]
    fn locks_won(
        &self,
        to_lock: &[(u64, u64, u64)],
        got: Vec<Result<u64, crate::mem::MemError>>,
    ) -> Result<(Vec<(u64, u64)>, Option<(u64, u64)>), RtxError> {
        let mut won: Vec<(u64, u64)> = self.pre_lock.iter().map(|p| (p.mptr, p.version)).collect();
        let mut failed = None;
        for (&(mptr, seen, v), r) in to_lock.iter().zip(got) {
            let old = r?;
            if old == seen {
                won.push((mptr, v));
            } else if failed.is_none() {
                failed = Some((mptr, old));
            }
        }
        Ok((won, failed))
    }

    /// Abort before DOING: release `won`, close the log, give the new blocks back and stop
    /// listing the old ones (still referenced).
    async fn abandon<M: Mem>(
        &mut self,
        mem: &M,
        p: &Prepared,
        won: &[(u64, u64)],
    ) -> Result<(), RtxError> {
        owner_abort(self.client, mem, p.state, won, !p.opt1).await?;
        for &b in &p.blocks {
            self.client.alloc.give_back(b);
        }
        for &b in &p.old_blocks {
            self.client.alloc.installed(b);
        }
        Ok(())
    }

    /// Opt1's install: CAS the dptr, then (never batched with it) release to version + 1.
    /// A failed CAS means an Opt1 repair replaced the buffer: the rTX aborted.
    async fn install_opt1<M: Mem>(&mut self, mem: &M, p: &Prepared) -> Result<(), RtxError> {
        let (e, s) = (p.entries[0], p.state.word());
        if mem.cas(dptr_addr(e.mptr), e.dptr, e.ndptr).await? != e.dptr {
            self.abandon(mem, p, &[(e.mptr, e.version)]).await?;
            return Err(AbortReason::AbortedByRepairer.into());
        }
        mem.cas(e.mptr, s, unlocked(next_version(e.version)))
            .await?;
        let c = &mut *self.client;
        c.alloc.installed(p.blocks[0]);
        c.alloc.retire(&p.old_blocks, c.clock.now_ms());
        c.remember(e.mptr, e.ndptr);
        Ok(())
    }

    /// TryCommit by the owner: INIT to DOING by CAS (failure: a repairer aborted this
    /// rTX), then the shared steps.
    async fn try_commit_owner<M: Mem>(
        &mut self,
        mem: &M,
        p: &Prepared,
        img: &LogImage,
        won: &[(u64, u64)],
    ) -> Result<(), RtxError> {
        let c = &mut *self.client;
        let log = c.layout.log_addr(c.id);
        let init = Header::new(LogState::Init, p.state.lease_ms);
        let doing = init
            .doing_until(c.clock.now_ms() + c.repair_lease_ms(p.lease_len))
            .word();
        if mem.cas(log, init.word(), doing).await? != init.word() {
            self.abandon(mem, p, won).await?;
            return Err(AbortReason::AbortedByRepairer.into());
        }
        let c = &mut *self.client;
        c.crash_at("doing", true)?;
        try_commit_steps(c, mem, img, doing, None).await?;
        c.unfinished = None;
        for &b in &p.blocks {
            c.alloc.installed(b);
        }
        for e in &p.entries {
            c.remember(e.mptr, e.ndptr);
        }
        c.alloc.retire(&p.old_blocks, c.clock.now_ms());
        Ok(())
    }

    async fn commit_inner<M: Mem>(&mut self, mem: &M) -> Result<(), RtxError> {
        // A pre-locked object is released by TryCommit like every logged one, so it is
        // written back (unchanged) when the rTX wrote other objects but not it.
        if let Some(p) = self.pre_lock {
            let i = self
                .reads
                .iter()
                .position(|r| r.mptr == p.mptr)
                .expect("pre-lock reads");
            if !self.writes.is_empty() && !self.writes.iter().any(|(j, _)| *j == i) {
                let v = self.reads[i].value.clone();
                self.writes.push((i, v));
            }
        }
        let n = self.writes.len();
        let max = self.client.layout.max_entries as usize;
        if n == 0 && self.reads.len() == 1 && self.pre_lock.is_none() {
            // A read-only rTX of one object needs no validation round [inf; Table 2
            // counts none]: its read saw the TXObj unlocked with dptr d, and d's block
            // holds d's committed value until d is replaced and the block's reuse wait
            // (`Allocator::min_reuse_ms`) has passed, far longer than one READ pair.
            return Ok(());
        }
        if n == 0 {
            let own = self.pre_lock.map(|p| p.state.word());
            let skip: Vec<u64> = self.pre_lock.iter().map(|p| p.mptr).collect();
            let bad = self.validate_reads(mem, &skip, own).await?;
            self.drop_pre_lock(mem).await?;
            return match bad {
                Some((mptr, w)) => self.fail_with(mem, mptr, w, AbortReason::Validation).await,
                None => Ok(()),
            };
        }
        if n > max {
            self.drop_pre_lock(mem).await?;
            return Err(RtxError::TooManyWrites { n, max });
        }
        let opt1 = self.client.cfg.opt1 && n == 1 && self.pre_lock.is_none();
        if !opt1 && self.pre_lock.is_none() {
            self.client.settle_log(mem).await?;
        }
        let p = match self.prepare(mem, opt1).await {
            Ok(p) => p,
            Err(e) => {
                self.drop_pre_lock(mem).await?;
                return Err(e);
            }
        };
        let img = LogImage {
            header: Header::new(LogState::Init, p.state.lease_ms),
            checksum: p.state.word(),
            entries: p.entries.clone(),
        };
        let (won, failed) = if p.opt1 {
            // Opt1 writes no log, and its new block stays invisible until the data
            // pointer's CAS after validation: the value's WRITE and the lock's CAS go
            // out in one round [inf; the paper's Fig. 8 orders them, which a log needs:
            // a repairer that meets the lock must find it].
            let to_lock = self.lock_targets(&p);
            let (w, got) = futures::join!(
                self.write_round(mem, &p, &img),
                lock_cas(mem, &to_lock, p.state.word())
            );
            let locked = self.locks_won(&to_lock, got);
            if let Err(e) = w {
                if let Ok((won, _)) = &locked {
                    self.abandon(mem, &p, won).await?;
                }
                return Err(e);
            }
            self.client.crash_at("log", false)?;
            locked?
        } else {
            self.write_round(mem, &p, &img).await?;
            self.client.crash_at("log", true)?;
            self.lock_round(mem, &p).await?
        };
        if let Some((mptr, word)) = failed {
            self.abandon(mem, &p, &won).await?;
            return self
                .fail_with(mem, mptr, word, AbortReason::LockFailed)
                .await;
        }
        self.client.crash_at("locks", !p.opt1)?;
        // Round 3: validation of every read and written object. An Opt1 rTX whose one
        // read is the object it writes skips it, as Table 2 counts no validation READ
        // for an update: its lock CAS found the version it read, and its dptr CAS
        // ([`Self::install_opt1`]) fails unless the dptr is still the one it read,
        // which every committed install and every Opt1 repair changes.
        let lone = p.opt1 && self.reads.len() == 1;
        let written: Vec<u64> = p.entries.iter().map(|e| e.mptr).collect();
        if lone {
            self.client.stats.validations_skipped += 1;
        } else if let Some((mptr, word)) = self
            .validate_reads(mem, &written, Some(p.state.word()))
            .await?
        {
            self.abandon(mem, &p, &won).await?;
            return self
                .fail_with(mem, mptr, word, AbortReason::Validation)
                .await;
        }
        if p.opt1 {
            self.install_opt1(mem, &p).await
        } else {
            self.try_commit_owner(mem, &p, &img, &won).await
        }
    }
}

/// A write set made ready for commit.
struct Prepared {
    state: LockState,
    /// Lease length in ms (the repair lease defaults to it).
    lease_len: u64,
    opt1: bool,
    /// Indices into the rTX's writes, in entry order.
    order: Vec<usize>,
    entries: Vec<LogEntry>,
    /// New blocks, by entry.
    blocks: Vec<u64>,
    /// Blocks the installs stop referencing.
    old_blocks: Vec<u64>,
}

/// CAS each of `to_lock`'s lock words from the word read to `s`, in one round.
async fn lock_cas<M: Mem>(
    mem: &M,
    to_lock: &[(u64, u64, u64)],
    s: u64,
) -> Vec<Result<u64, crate::mem::MemError>> {
    join_all(
        to_lock
            .iter()
            .map(|&(mptr, seen, _)| mem.cas(mptr, seen, s)),
    )
    .await
}
