//! One client API for the three locks of this crate, so a benchmark can swap them by name
//! ([`LockKind`]: `takeout`, `cas`, `dslr`): [`AnyLockClient::lock`]`(ctx, id, access)`
//! returns a [`LockGuard`], released by [`LockGuard::release`] or, when dropped, by a
//! coroutine of its own (a one-sided op posted from [`rrpc::runtime::ThreadCtx::spawn`]).
//!
//! - **Takeout** ([`crate::takeout`]) goes through the Lock RPC and a [`Ticket`], as
//!   [`LockClient`] does: hot mode, and timestamp [`TAKEOUT_TS`] (0) on every request, so
//!   `queued_ts` stays 0 and the timestamp rule never refuses one (a service refuses
//!   timestamps above what the oracle issued, so the largest value will not do). A refusal (more than the hot watermark queued) is
//!   [`LockError::Refused`]. Takeout has no shared mode: [`Access::Shared`] locks
//!   exclusively. Do not mix this API with timestamped [`LockClient`] users of the same
//!   lock (a timestamped request raises `queued_ts` above 0, and later requests of this
//!   API are refused by the timestamp rule).
//! - **CAS** ([`crate::cas`]) and **DSLR** ([`crate::dslr`]) use only one-sided verbs on the
//!   word tables a node exports ([`crate::words`]); CAS has no shared mode either.

use std::fmt;
use std::rc::Rc;
use std::str::FromStr;
use std::time::Instant;

use rrpc::node::NodeInfo;
use rrpc::runtime::ThreadCtx;

use crate::baseline::{BaselineConfig, CasClient, CasGuard, DslrClient, DslrGuard};
use crate::client::{Grant, LockClient, LockRequest, Mode};
use crate::error::LockError;
use crate::ticket::Ticket;

pub use crate::dslr::Access;

/// The timestamp Takeout requests carry through [`AnyLockClient`]: the same on every
/// request, so `queued_ts` stays at it and the timestamp rule never refuses one.
pub const TAKEOUT_TS: u64 = 0;

/// Which lock algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LockKind {
    /// Scythe's Takeout Lock (Lock RPC + one-sided READ/FAA).
    Takeout,
    /// The CAS spinlock (FORD / FaRM).
    Cas,
    /// DSLR (Yoon et al., SIGMOD'18).
    Dslr,
}

impl LockKind {
    /// All kinds, in the order of their names' listing.
    pub const ALL: [LockKind; 3] = [LockKind::Takeout, LockKind::Cas, LockKind::Dslr];

    /// The name [`FromStr`] accepts.
    pub fn name(self) -> &'static str {
        match self {
            LockKind::Takeout => "takeout",
            LockKind::Cas => "cas",
            LockKind::Dslr => "dslr",
        }
    }
}

impl fmt::Display for LockKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown lock kind name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown lock kind {0:?}: expected takeout, cas or dslr")]
pub struct UnknownKind(pub String);

impl FromStr for LockKind {
    type Err = UnknownKind;

    /// `takeout`, `cas` or `dslr` (ASCII case-insensitive).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        LockKind::ALL
            .into_iter()
            .find(|k| k.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownKind(s.to_string()))
    }
}

/// A thread's client of one lock service node, for any [`LockKind`]. Not `Sync`: one per
/// runtime thread, shared by its coroutines.
pub enum AnyLockClient {
    /// Takeout, with the acquire timeout of its [`BaselineConfig`].
    Takeout(LockClient, BaselineConfig),
    /// CAS spinlock.
    Cas(CasClient),
    /// DSLR.
    Dslr(DslrClient),
}

impl AnyLockClient {
    /// A `kind` client of the node `info` describes (from `ctx.connect_rpc` for Takeout,
    /// `ctx.connect` suffices for the baselines).
    ///
    /// Errors: [`LockError::Export`] when the node does not export that kind's table,
    /// [`LockError::InvalidRequest`] for an invalid `cfg`.
    pub fn from_info(
        kind: LockKind,
        ctx: &ThreadCtx,
        info: &NodeInfo,
        cfg: &BaselineConfig,
    ) -> Result<Self, LockError> {
        Ok(match kind {
            LockKind::Takeout => {
                cfg.validate().map_err(LockError::InvalidRequest)?;
                let mut lc = LockClient::from_info(info)?;
                lc.set_release_wait(cfg.release_wait);
                Self::Takeout(lc, cfg.clone())
            }
            LockKind::Cas => Self::Cas(CasClient::from_info(ctx, info, cfg)?),
            LockKind::Dslr => Self::Dslr(DslrClient::from_info(info, cfg)?),
        })
    }

    /// The kind.
    pub fn kind(&self) -> LockKind {
        match self {
            Self::Takeout(..) => LockKind::Takeout,
            Self::Cas(_) => LockKind::Cas,
            Self::Dslr(_) => LockKind::Dslr,
        }
    }

    /// Number of locks in the table of this kind.
    pub fn n_locks(&self) -> u64 {
        match self {
            Self::Takeout(c, _) => c.n_locks(),
            Self::Cas(c) => c.n_locks(),
            Self::Dslr(c) => c.n_locks(),
        }
    }

    /// Dropped guards whose release failed.
    pub fn lost(&self) -> u64 {
        match self {
            Self::Takeout(c, _) => c.lost(),
            Self::Cas(c) => c.lost(),
            Self::Dslr(c) => c.lost(),
        }
    }

    /// Acquire lock `id` in `access` mode (exclusive for Takeout and CAS) and wait until
    /// it is held.
    ///
    /// Errors: as the kind's client ([`LockClient::lock`] and [`Ticket::wait`],
    /// [`CasClient::lock`], [`DslrClient::lock`]); Takeout adds [`LockError::Refused`]
    /// and reports a wait past the acquire timeout as [`LockError::Timeout`] (the ticket
    /// is then released by a coroutine of its own when its turn comes).
    pub async fn lock(
        &self,
        ctx: &Rc<ThreadCtx>,
        id: u64,
        access: Access,
    ) -> Result<LockGuard, LockError> {
        match self {
            Self::Takeout(c, cfg) => {
                let start = Instant::now();
                let req = LockRequest {
                    id,
                    ts: TAKEOUT_TS,
                    mode: Mode::Hot,
                };
                let grant = c.lock(ctx, &[req]).await?.remove(0);
                let mut t = match grant {
                    Grant::Queued(t) => t,
                    Grant::Refused(reply) => return Err(LockError::Refused { id, reply }),
                };
                match t.wait(start + cfg.acquire_timeout).await {
                    Ok(()) => Ok(LockGuard::Takeout(t)),
                    Err(LockError::WaitTimeout { .. }) => Err(LockError::Timeout {
                        id,
                        waited: start.elapsed(),
                    }),
                    Err(e) => Err(e),
                }
            }
            Self::Cas(c) => Ok(LockGuard::Cas(c.lock(ctx, id).await?)),
            Self::Dslr(c) => Ok(LockGuard::Dslr(c.lock(ctx, id, access).await?)),
        }
    }
}

/// A held lock of any kind; release it, or drop it and a coroutine releases it.
#[must_use = "a lock that is never released stays held; call release()"]
#[derive(Debug)]
pub enum LockGuard {
    /// A served Takeout ticket.
    Takeout(Ticket),
    /// A held CAS lock.
    Cas(CasGuard),
    /// A served DSLR ticket.
    Dslr(DslrGuard),
}

impl LockGuard {
    /// The lock id.
    pub fn id(&self) -> u64 {
        match self {
            Self::Takeout(t) => t.id(),
            Self::Cas(g) => g.id(),
            Self::Dslr(g) => g.id(),
        }
    }

    /// The kind.
    pub fn kind(&self) -> LockKind {
        match self {
            Self::Takeout(_) => LockKind::Takeout,
            Self::Cas(_) => LockKind::Cas,
            Self::Dslr(_) => LockKind::Dslr,
        }
    }

    /// Whether the acquisition met contention: the Takeout ticket or DSLR ticket had
    /// tickets ahead of it, or a CAS failed before the one that acquired.
    pub fn contended(&self) -> bool {
        match self {
            Self::Takeout(t) => !t.reply().holds_now(),
            Self::Cas(g) => g.failures() > 0,
            Self::Dslr(g) => g.waited(),
        }
    }

    /// Release the lock (one one-sided op, plus DSLR's counter reset when this ticket is
    /// the resetter).
    ///
    /// Errors: [`LockError::Lost`] when the lock could not be passed on; the cause is
    /// kept.
    pub async fn release(self) -> Result<(), LockError> {
        match self {
            Self::Takeout(t) => t.release().await,
            Self::Cas(g) => g.release().await,
            Self::Dslr(g) => g.release().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_by_name() {
        for k in LockKind::ALL {
            assert_eq!(k.name().parse::<LockKind>(), Ok(k));
            assert_eq!(k.to_string().parse::<LockKind>(), Ok(k));
        }
        assert_eq!("CAS".parse::<LockKind>(), Ok(LockKind::Cas));
        assert_eq!(
            "mcs".parse::<LockKind>(),
            Err(UnknownKind("mcs".to_string()))
        );
    }
}
