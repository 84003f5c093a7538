//! Repair of an rTX found holding an expired LLLock (Transactional Indexes on
//! Disaggregated Memory with Repairable Transaction, 4.3 Fig. 10, 4.4 and 4.5 Opt1), with
//! the corrections the design notes list: every header transition is a CAS expecting the
//! rTX's identity; a repairer re-reads and re-dispatches after any failed CAS; it releases
//! locks only when its own CAS produced ABORT or it read ABORT with a matching identity.
//!
//! Given the expired word `lockv` found at object `mptr`, read the owner's log slot, then:
//!
//! | log found | action |
//! |---|---|
//! | identity or checksum differs from `lockv` | the slot was reused, which happens only after DONE: nothing to do (`Stale`) |
//! | INIT | CAS to ABORT, then as ABORT |
//! | ABORT | release each entry's lock from `lockv` at its version unchanged, CAS to DONE |
//! | DOING, repair lease expired | CAS the repair lease forward (take over), run TryCommit steps 2-4 |
//! | DOING, repair lease valid | someone else repairs: `Busy` (the caller aborts and retries) |
//! | DONE, lock still `lockv` | a lock CAS landed late (the rTX had aborted): release it at its pre-lock version |
//! | DONE | nothing |
//!
//! A lock with the no-log bit (Opt1) has no log. The paper's repairer copies the current
//! value into a fresh block, CASes the dptr to it (which makes a slow owner's install CAS
//! fail) and releases the lock. Here the repairer first CASes the lock from `lockv` to a
//! no-log LockState of its own (inferred): otherwise its dptr CAS may land after the owner
//! released and another rTX locked the object, and make that rTX's install fail (a lost
//! update the model checker finds). Only an owner's install can race with the takeover,
//! and the fence CAS stops it. The owner's pre-lock version is unknown, so the repairer
//! releases at its own lease in ms (inferred): validation compares the whole TXObj, and the
//! dptr changed.

use crate::client::Client;
use crate::dptr::Dptr;
use crate::error::RtxError;
use crate::layout::dptr_addr;
use crate::lease::{Clock, LeaseIssuer};
use crate::lllock::{unlocked, LockState, LockWord};
use crate::log::{Header, LogImage, LogState};
use crate::mem::Mem;
use crate::trycommit::try_commit_steps;

/// How many times a repair re-reads and re-dispatches before giving up (as `Busy`).
const MAX_REDISPATCH: usize = 64;

/// What a repair found and did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RepairOutcome {
    /// The word was no longer a lock when looked at.
    Unlocked,
    /// The log slot belongs to a later rTX of the ID (or was never written for this one):
    /// `lockv`'s rTX is DONE.
    Stale,
    /// The rTX was in INIT or ABORT; this repair aborted it and released its locks.
    Aborted,
    /// The rTX was in DOING; this repair re-executed its TryCommit to DONE.
    Committed,
    /// A repairer re-executing TryCommit stopped because the log became DONE or reused.
    Stopped,
    /// Another repairer holds a valid repair lease.
    Busy,
    /// The log was DONE; nothing to do.
    Done,
    /// The log was DONE and the lock still held: a late lock CAS, released.
    Released,
    /// An Opt1 (no-log) lock: the value was moved to a fresh block and the lock released.
    Opt1Replaced,
}

impl RepairOutcome {
    /// Whether the repair changed words on the MN.
    pub fn changed(self) -> bool {
        matches!(
            self,
            Self::Aborted | Self::Committed | Self::Released | Self::Opt1Replaced
        )
    }
}

impl<C: Clock> Client<C> {
    /// Make sure this ID's log slot may be reused: its last rTX is DONE (4.4: a log not in
    /// DONE is never reused). Repairs it as any repairer would if an error left it open.
    pub(crate) async fn settle_log<M: Mem>(&mut self, mem: &M) -> Result<(), RtxError> {
        let Some(identity) = self.unfinished else {
            return Ok(());
        };
        let at = self.layout.log_addr(self.id);
        let w = mem.read_u64(at).await?;
        let h = Header::decode(w);
        if h.identity == identity && h.state != LogState::Done {
            let raw = mem.read(at, self.layout.slot_bytes() as usize).await?;
            // A slot that does not decode was never completely written, and no lock is
            // taken before the log WRITE completes: nothing to finish.
            if let Ok(img) = LogImage::decode(&raw) {
                finish_own(self, mem, &img).await?;
            }
        }
        self.unfinished = None;
        Ok(())
    }

    /// After a restart: finish this ID's last rTX if its log is not DONE (as a repairer
    /// would), seed leases above the log's identity, and rebuild the allocator
    /// ([`crate::alloc::Allocator::recover`]). Errors: [`RtxError::Mem`], [`RtxError::Alloc`].
    pub async fn recover<M: Mem>(&mut self, mem: &M) -> Result<(), RtxError> {
        let at = self.layout.log_addr(self.id);
        let raw = mem.read(at, self.layout.slot_bytes() as usize).await?;
        let h = Header::decode(u64::from_le_bytes(raw[..8].try_into().expect("8 bytes")));
        self.issuer = LeaseIssuer::after(h.identity.max(self.issuer.last_ms()));
        if h.state != LogState::Done && h.identity != 0 {
            if let Ok(img) = LogImage::decode(&raw) {
                finish_own(self, mem, &img).await?;
            }
        }
        self.unfinished = None;
        self.alloc.recover(mem).await?;
        Ok(())
    }

    /// Repair the rTX holding the lock word `lockv` seen at the TXObj `mptr` (call it
    /// when `lockv`'s lease has expired; calling it early is safe but may abort or finish
    /// a live rTX). Errors: [`RtxError::Mem`], [`RtxError::Alloc`] (Opt1 needs a block).
    pub async fn repair<M: Mem>(
        &mut self,
        mem: &M,
        mptr: u64,
        lockv: u64,
    ) -> Result<RepairOutcome, RtxError> {
        let out = match LockWord::decode(lockv) {
            LockWord::Unlocked(_) => RepairOutcome::Unlocked,
            LockWord::Locked(s) if s.no_log => opt1_repair(self, mem, mptr, s).await?,
            LockWord::Locked(_) => repair_log(self, mem, Some(mptr), lockv, false).await?,
        };
        if out.changed() {
            self.stats.repairs += 1;
        }
        Ok(out)
    }
}

/// Finish this client's own log as a repairer would, ignoring the repair lease.
pub(crate) async fn finish_own<C: Clock, M: Mem>(
    c: &mut Client<C>,
    mem: &M,
    img: &LogImage,
) -> Result<RepairOutcome, RtxError> {
    repair_log(c, mem, None, img.checksum, true).await
}

async fn release_at_version<M: Mem>(mem: &M, img: &LogImage, lockv: u64) -> Result<(), RtxError> {
    for r in futures::future::join_all(
        img.entries
            .iter()
            .map(|e| mem.cas(e.mptr, lockv, unlocked(e.version))),
    )
    .await
    {
        r?;
    }
    Ok(())
}

async fn repair_log<C: Clock, M: Mem>(
    c: &mut Client<C>,
    mem: &M,
    mptr: Option<u64>,
    lockv: u64,
    force: bool,
) -> Result<RepairOutcome, RtxError> {
    let LockWord::Locked(s) = LockWord::decode(lockv) else {
        return Ok(RepairOutcome::Unlocked);
    };
    let at = c.layout.log_addr(s.id);
    for _ in 0..MAX_REDISPATCH {
        let raw = mem.read(at, c.layout.slot_bytes() as usize).await?;
        let w0 = u64::from_le_bytes(raw[..8].try_into().expect("8 bytes"));
        let checksum = u64::from_le_bytes(raw[8..16].try_into().expect("8 bytes"));
        let h = Header::decode(w0);
        if h.identity != s.lease_ms || checksum != lockv {
            return Ok(RepairOutcome::Stale);
        }
        let Ok(img) = LogImage::decode(&raw) else {
            continue; // read while the owner rewrote its entries (Opt2): read again
        };
        let l = s.lease_ms;
        match h.state {
            LogState::Init => {
                let ab = Header::new(LogState::Abort, l).word();
                if mem.cas(at, w0, ab).await? != w0 {
                    continue;
                }
                release_at_version(mem, &img, lockv).await?;
                mem.cas(at, ab, Header::new(LogState::Done, l).word())
                    .await?;
                return Ok(RepairOutcome::Aborted);
            }
            LogState::Abort => {
                release_at_version(mem, &img, lockv).await?;
                mem.cas(at, w0, Header::new(LogState::Done, l).word())
                    .await?;
                return Ok(RepairOutcome::Aborted);
            }
            LogState::Doing => {
                #[cfg(any(test, feature = "fault-injection"))]
                if c.planted_ignore_doing {
                    return Ok(RepairOutcome::Busy);
                }
                #[cfg(any(test, feature = "fault-injection"))]
                if c.planted_naive_repair && mptr.is_some() {
                    // The planted bug: free the objects, leave the log DOING. A live
                    // owner's installs may then land after others changed the objects.
                    let now = c.clock.now_ms();
                    if !force && !h.repair_expired(now) {
                        return Ok(RepairOutcome::Busy);
                    }
                    release_at_version(mem, &img, lockv).await?;
                    return Ok(RepairOutcome::Released);
                }
                let now = c.clock.now_ms();
                if !force && !h.repair_expired(now) {
                    return Ok(RepairOutcome::Busy);
                }
                let len = c.repair_lease_ms(c.cfg.lease.length_ms(0, img.entries.len()));
                let t = h.doing_until(now + len).word();
                if mem.cas(at, w0, t).await? != w0 {
                    continue;
                }
                let finished = try_commit_steps(c, mem, &img, t, Some(now)).await?;
                return Ok(if finished {
                    RepairOutcome::Committed
                } else {
                    RepairOutcome::Stopped
                });
            }
            LogState::Done => {
                if let Some(m) = mptr {
                    if let Some(e) = img.entries.iter().find(|e| e.mptr == m) {
                        if mem.cas(m, lockv, unlocked(e.version)).await? == lockv {
                            return Ok(RepairOutcome::Released);
                        }
                    }
                }
                return Ok(RepairOutcome::Done);
            }
        }
    }
    Ok(RepairOutcome::Busy)
}

async fn opt1_repair<C: Clock, M: Mem>(
    c: &mut Client<C>,
    mem: &M,
    mptr: u64,
    s: LockState,
) -> Result<RepairOutcome, RtxError> {
    let lockv = s.word();
    // Take the lock over with a no-log LockState of this client. Without it, the fence
    // CAS below could land after the owner released and a third rTX locked the object,
    // and would then make that rTX's install CAS fail (found by the model checker).
    let len = c.cfg.lease.length_ms(0, 1);
    let lease_ms = c.issuer.issue_unlogged(c.clock.now_ms(), len);
    let mine = LockState {
        lease_ms,
        id: c.id,
        no_log: true,
    }
    .word();
    if mem.cas(mptr, lockv, mine).await? != lockv {
        return Ok(RepairOutcome::Unlocked);
    }
    // Now only the old owner's install CAS can still change the dptr: fence it with a
    // copy of the current value in a fresh block.
    let bytes = c.layout.block_bytes as usize;
    loop {
        let dptr = mem.read_u64(dptr_addr(mptr)).await?;
        let d = Dptr::decode(dptr).ok_or(RtxError::NullDptr { mptr })?;
        let value = mem.read(c.layout.block_addr(d.block), bytes).await?;
        let nb = c.take_block(mem).await?;
        mem.write(c.layout.block_addr(nb), &value).await?;
        c.alloc.hold(&[d.block], c.owners.as_deref());
        c.alloc.flush(mem).await?;
        let nd = d.successor(nb, c.alloc.incarnation()).word();
        if mem.cas(dptr_addr(mptr), dptr, nd).await? != dptr {
            c.alloc.give_back(nb); // the owner's install landed: copy its value instead
            continue;
        }
        c.alloc.installed(nb);
        mem.cas(mptr, mine, unlocked(lease_ms)).await?;
        c.alloc.retire(&[d.block], c.clock.now_ms());
        return Ok(RepairOutcome::Opt1Replaced);
    }
}
