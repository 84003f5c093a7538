//! TryCommit (Transactional Indexes on Disaggregated Memory with Repairable Transaction,
//! 4.3 Fig. 9) and the owner's abort: the log transitions and idempotent CAS rounds that
//! the owner's commit and every repairer share. Every CAS expects a value unique to the
//! rTX (its LockState, its header identity, its old dptr), so running these any number of
//! times, by any number of clients, has the effect of running them once.

use futures::future::join_all;

use crate::client::Client;
use crate::error::RtxError;
use crate::layout::dptr_addr;
use crate::lease::Clock;
use crate::lllock::{next_version, unlocked, LockState, LockWord};
use crate::log::{Header, LogEntry, LogImage, LogState};
use crate::mem::Mem;

#[cfg(test)]
thread_local! {
    /// Planted bug for the model checker: install the new dptr by WRITE instead of CAS.
    pub(crate) static PLANT_INSTALL_BY_WRITE: std::cell::Cell<bool> =
        const { std::cell::Cell::new(false) };
}

/// Release `won` locks (mptr, version) held with `state` at their version unchanged, and
/// move a logged rTX's header INIT -> ABORT -> DONE by CAS expecting its identity. Safe
/// after a repairer aborted the rTX: every CAS is then a no-op or finishes its work.
pub(crate) async fn owner_abort<C: Clock, M: Mem>(
    c: &mut Client<C>,
    mem: &M,
    state: LockState,
    won: &[(u64, u64)],
    logged: bool,
) -> Result<(), RtxError> {
    let log = c.layout.log_addr(c.id);
    let l = state.lease_ms;
    if logged {
        mem.cas(
            log,
            Header::new(LogState::Init, l).word(),
            Header::new(LogState::Abort, l).word(),
        )
        .await?;
    }
    let s = state.word();
    for r in join_all(won.iter().map(|&(mptr, v)| mem.cas(mptr, s, unlocked(v)))).await {
        r?;
    }
    if logged {
        // The only other possible state is DONE (set by a repairer after its releases).
        mem.cas(
            log,
            Header::new(LogState::Abort, l).word(),
            Header::new(LogState::Done, l).word(),
        )
        .await?;
        c.unfinished = None;
    }
    Ok(())
}

/// TryCommit steps 2-4 (Fig. 9): install every entry's dptr by CAS, release every lock
/// from `lockv` to version + 1 by CAS, then CAS the header from (DOING, `identity`, *) to
/// DONE. `header` is the DOING word the caller last saw (it may change by takeovers).
/// A repairer passes `watch = Some(start_ms)`: every [`crate::client::Config::check_interval_ms`]
/// it re-reads the header and stops (returns false) once the log is DONE or reused, which
/// bounds how long a late CAS could meet a reused dptr (4.4).
pub(crate) async fn try_commit_steps<C: Clock, M: Mem>(
    c: &Client<C>,
    mem: &M,
    img: &LogImage,
    mut header: u64,
    watch: Option<u64>,
) -> Result<bool, RtxError> {
    let lockv = img.checksum;
    let identity = img.header.identity;
    let LockWord::Locked(owner) = LockWord::decode(lockv) else {
        unreachable!("a log's checksum is a LockState")
    };
    let log = c.layout.log_addr(owner.id);
    let still_mine = |w: u64| {
        let h = Header::decode(w);
        h.identity == identity && h.state == LogState::Doing
    };
    let install = |e: &LogEntry| {
        let e = *e;
        async move {
            #[cfg(test)]
            if PLANT_INSTALL_BY_WRITE.with(|p| p.get()) {
                mem.write(dptr_addr(e.mptr), &e.ndptr.to_le_bytes()).await?;
                return Ok::<(), crate::mem::MemError>(());
            }
            mem.cas(dptr_addr(e.mptr), e.dptr, e.ndptr).await.map(drop)
        }
    };
    match watch {
        None => {
            for r in join_all(img.entries.iter().map(install)).await {
                r?;
            }
            c.crash_at("install", true)?;
            let rel = img
                .entries
                .iter()
                .map(|e| mem.cas(e.mptr, lockv, unlocked(next_version(e.version))));
            for r in join_all(rel).await {
                r?;
            }
        }
        Some(start) => {
            let mut last = start;
            let check = async |last: &mut u64| -> Result<bool, RtxError> {
                let now = c.clock.now_ms();
                if now.saturating_sub(*last) >= c.cfg.check_interval_ms {
                    *last = now;
                    return Ok(still_mine(mem.read_u64(log).await?));
                }
                Ok(true)
            };
            for e in &img.entries {
                if !check(&mut last).await? {
                    return Ok(false);
                }
                install(e).await?;
            }
            for e in &img.entries {
                if !check(&mut last).await? {
                    return Ok(false);
                }
                mem.cas(e.mptr, lockv, unlocked(next_version(e.version)))
                    .await?;
            }
        }
    }
    // DONE only after every lock is released (4.3).
    let done = Header::new(LogState::Done, identity).word();
    loop {
        let old = mem.cas(log, header, done).await?;
        if old == header || !still_mine(old) {
            return Ok(true);
        }
        header = old; // a takeover moved the repair lease
    }
}
