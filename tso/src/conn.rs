//! A thread's connection to an oracle that follows it across restarts (the client half of
//! [`crate::epoch`]'s guarantee; Scythe 4.5 leaves TSO recovery open).
//!
//! A [`TsoClient`] names one incarnation of the oracle: its counter's `(addr, rkey)` and
//! its epoch. When that incarnation dies (SIGKILL, crash), FAAs on its counter fail
//! (`OneSidedError::Completion` while the QP fails, `PeerGone` once the pool found the node
//! unreachable). [`TsoConn`] then asks the oracle's bootstrap address for its current
//! export, again and again (every [`ReconnectConfig::retry_interval`]) until the oracle
//! is back or [`ReconnectConfig::wait`] has passed, and retries the FAA on the new counter.
//!
//! **What it accepts.** A new export is taken only if its epoch is larger than the one
//! the client used (a new incarnation, which by [`crate::epoch`] hands out only larger
//! timestamps), or if it is the very same incarnation (same epoch, counter and random incarnation id: the QP
//! failed but the oracle lives; the pool repairs the QP). Anything else (an oracle
//! restarted without `--state-dir`, a rolled-back state directory) would hand out
//! timestamps that go back: [`TsoError::WentBack`], never a timestamp.
//!
//! **What a retry costs.** An FAA that failed may have been executed; its timestamps are
//! then never handed out (gaps are allowed, duplicates are not). The retried FAA is
//! issued after the request arrived, so real-time order holds.
//!
//! **Shared by threads.** The following itself is an [`OracleFollower`]: `Sync`, given
//! the calling thread's context at each request, so that every thread of a process can
//! follow the oracle through one shared view of its current incarnation (a TSO proxy's
//! server threads do, [`crate::proxy`]). A thread whose FAA failed re-attaches its own
//! context ([`ThreadCtx::reconnect`]) and compares the export it gets with the shared
//! one: once any thread switched to an epoch, no thread accepts a smaller one.
//! [`TsoConn`] is a follower bound to one thread's context.
//!
//! The bootstrap address is fixed: restart the oracle at the same `--listen` address.
//! Re-reading the export is a blocking control-plane call, bounded by the runtime's
//! connect timeout (a refused connection, the usual case while the oracle is down,
//! returns at once); it stalls the calling thread's other coroutines meanwhile.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rrpc::runtime::{OneSidedError, RpcError, ThreadCtx};

use crate::client::TsoClient;
use crate::error::TsoError;
use crate::timestamp::{Timestamp, TimestampRange};
use crate::timestamp_source::TimestampSource;

/// How long and how often [`TsoConn`] tries to reach a restarted oracle.
///
/// Non-exhaustive, so that a setting can be added without breaking the crates that embed
/// this one: outside this crate, start from [`Default::default`] and chain the `with_*`
/// setters (or assign the public fields on a `let mut` binding).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReconnectConfig {
    /// Longest time one request waits for the oracle to come back, from its first failed
    /// FAA; then it fails with [`TsoError::Unavailable`]. Default 30 s.
    pub wait: Duration,
    /// Pause between two attempts to fetch the oracle's export. Default 10 ms.
    pub retry_interval: Duration,
}

impl Default for ReconnectConfig {
    fn default() -> Self {
        Self {
            wait: Duration::from_secs(30),
            retry_interval: Duration::from_millis(10),
        }
    }
}

impl ReconnectConfig {
    /// Set [`ReconnectConfig::wait`]: longest time one request waits for the oracle to come
    /// back, from its first failed FAA; then it fails with [`TsoError::Unavailable`].
    pub fn with_wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Set [`ReconnectConfig::retry_interval`]: pause between two attempts to fetch the
    /// oracle's export.
    pub fn with_retry_interval(mut self, retry_interval: Duration) -> Self {
        self.retry_interval = retry_interval;
        self
    }
}

/// The oracle at a bootstrap address, followed across restarts (see the module docs):
/// its current incarnation, shared by every thread that takes timestamps through it.
/// Each request runs on the caller's thread context, which must have been connected to
/// the oracle (`ThreadCtx::connect`) or reconnect on the first failure.
pub struct OracleFollower {
    addr: SocketAddr,
    cfg: ReconnectConfig,
    current: Mutex<Arc<TsoClient>>,
    /// Bumped at every switch to a new incarnation.
    generation: AtomicU64,
}

impl OracleFollower {
    /// Follow the oracle at `addr`, whose incarnation in use now is `client` (from its
    /// export, read by a thread's `ThreadCtx::connect`).
    pub fn new(addr: SocketAddr, client: TsoClient, cfg: ReconnectConfig) -> Self {
        Self {
            addr,
            cfg,
            current: Mutex::new(Arc::new(client)),
            generation: AtomicU64::new(0),
        }
    }

    /// The oracle's bootstrap address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The incarnation in use now.
    pub fn client(&self) -> Arc<TsoClient> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Incarnations switched to after the first (restarts survived).
    pub fn reconnects(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// `n` consecutive timestamps with one FAA issued on `ctx`; after a failed FAA,
    /// waits for the oracle (at most [`ReconnectConfig::wait`]) and retries on its
    /// current incarnation.
    ///
    /// Errors: [`TsoError::ZeroCount`], [`TsoError::Exhausted`]; [`TsoError::Unavailable`]
    /// when the oracle did not come back in time; [`TsoError::WentBack`] when it came
    /// back with an epoch that is not larger than the current one; [`TsoError::Export`].
    pub async fn timestamps(&self, ctx: &ThreadCtx, n: u64) -> Result<TimestampRange, TsoError> {
        let mut since: Option<Instant> = None;
        loop {
            let generation = self.generation.load(Ordering::Acquire);
            let client = self.client();
            let cause = match client.timestamps(ctx, n).await {
                Ok(r) => return Ok(r),
                Err(TsoError::Rpc(RpcError::OneSided(
                    e @ (OneSidedError::Completion { .. }
                    | OneSidedError::PeerGone { .. }
                    | OneSidedError::NotConnected { .. }),
                ))) => e,
                Err(e) => return Err(e),
            };
            let first_failure = *since.get_or_insert_with(Instant::now);
            if self.generation.load(Ordering::Acquire) != generation {
                continue; // another coroutine or thread switched already
            }
            self.recover(ctx, &client, first_failure, cause).await?;
        }
    }

    /// After an FAA on `old` failed with `cause`: re-attach `ctx` to the oracle and
    /// switch to its current incarnation if it is a later one, or return to retry when
    /// it is the one in use (the pool repairs a failed QP; or another thread switched
    /// and this thread only had to re-attach).
    async fn recover(
        &self,
        ctx: &ThreadCtx,
        old: &Arc<TsoClient>,
        first_failure: Instant,
        cause: OneSidedError,
    ) -> Result<(), TsoError> {
        // A failed QP is repaired by its pool in the background: pause before retrying.
        // A connection found dead is replaced by `reconnect` itself: retry at once.
        let qp_failed = matches!(cause, OneSidedError::Completion { .. });
        let mut last = RpcError::OneSided(cause);
        loop {
            // Blocking, but bounded: a refused connection returns at once, an unreachable
            // host after the runtime's connect timeout.
            // Same incarnation, reached again after a QP failure: retry the FAA after a
            // pause (its pool reconnects the failed QP meanwhile). Unreachable: try to
            // reconnect again after the pause.
            let retry_faa = match ctx.reconnect(self.addr) {
                Ok(info) => {
                    if !self.adopt(TsoClient::from_info(&info)?, old, qp_failed)? {
                        return Ok(());
                    }
                    true
                }
                Err(e) => {
                    last = RpcError::Connect(e);
                    false
                }
            };
            if first_failure.elapsed() >= self.cfg.wait {
                return Err(TsoError::Unavailable {
                    addr: self.addr,
                    waited: first_failure.elapsed(),
                    source: Box::new(last),
                });
            }
            ctx.sleep(self.cfg.retry_interval).await;
            if retry_faa {
                return Ok(());
            }
        }
    }
}

impl OracleFollower {
    /// Compare the export `new` just read with the incarnation in use, after an FAA on
    /// `old` failed (`qp_failed`: a QP failure, not a dead connection). Switches to `new`
    /// if its epoch is larger. Returns whether to pause before retrying (the same
    /// incarnation after a QP failure); `false`: retry now.
    ///
    /// Errors: [`TsoError::WentBack`] when `new` is neither a later epoch nor the
    /// incarnation in use.
    fn adopt(
        &self,
        new: TsoClient,
        old: &Arc<TsoClient>,
        qp_failed: bool,
    ) -> Result<bool, TsoError> {
        let mut cur = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if new.epoch() > cur.epoch() {
            tracing::info!(
                addr = %self.addr,
                old_epoch = cur.epoch(),
                new_epoch = new.epoch(),
                "TSO oracle restarted; switched to its new epoch"
            );
            *cur = Arc::new(new);
            self.generation.fetch_add(1, Ordering::AcqRel);
            return Ok(false);
        }
        if new.epoch() == cur.epoch()
            && new.counter() == cur.counter()
            && new.incarnation() == cur.incarnation()
        {
            // Another thread switched, or this thread's dead connection was replaced:
            // retry now. The same incarnation after a QP failure: pause first.
            return Ok(Arc::ptr_eq(&cur, old) && qp_failed);
        }
        Err(TsoError::WentBack {
            addr: self.addr,
            old: cur.epoch(),
            new: new.epoch(),
        })
    }
}

/// One thread's handle on the oracle at a bootstrap address, reconnecting to a restarted
/// oracle (see the module docs): an [`OracleFollower`] bound to the thread's context.
/// Shared by the thread's coroutines through `&self`.
pub struct TsoConn {
    ctx: Rc<ThreadCtx>,
    follower: OracleFollower,
}

impl TsoConn {
    /// Connect `ctx` to the oracle at `addr` (one-sided; blocking, call before running
    /// coroutines).
    ///
    /// Errors: [`TsoError::Rpc`] when the oracle cannot be reached, [`TsoError::Export`].
    pub fn connect(
        ctx: Rc<ThreadCtx>,
        addr: SocketAddr,
        cfg: ReconnectConfig,
    ) -> Result<Self, TsoError> {
        let info = ctx.connect(addr)?;
        let client = TsoClient::from_info(&info)?;
        Ok(Self {
            ctx,
            follower: OracleFollower::new(addr, client, cfg),
        })
    }

    /// The incarnation in use now.
    pub fn client(&self) -> TsoClient {
        (*self.follower.client()).clone()
    }

    /// Incarnations switched to after the first (restarts survived by this thread).
    pub fn reconnects(&self) -> u64 {
        self.follower.reconnects()
    }

    /// One timestamp (see [`TsoConn::timestamps`]).
    pub async fn timestamp(&self) -> Result<Timestamp, TsoError> {
        Ok(self.timestamps(1).await?.first())
    }

    /// `n` consecutive timestamps with one FAA; after a failed FAA, waits for the oracle
    /// (at most [`ReconnectConfig::wait`]) and retries on its current incarnation.
    ///
    /// Errors: [`TsoError::ZeroCount`], [`TsoError::Exhausted`]; [`TsoError::Unavailable`]
    /// when the oracle did not come back in time; [`TsoError::WentBack`] when it came
    /// back with an epoch that is not larger; [`TsoError::Export`].
    pub async fn timestamps(&self, n: u64) -> Result<TimestampRange, TsoError> {
        self.follower.timestamps(&self.ctx, n).await
    }
}

impl TimestampSource for TsoConn {
    type Error = TsoError;

    /// [`TsoConn::timestamps`] on the connection's own context; `_ctx` is ignored (it is
    /// the same thread's, as a `TsoConn` is not `Send`).
    async fn timestamps(&self, _ctx: &ThreadCtx, n: u64) -> Result<TimestampRange, TsoError> {
        TsoConn::timestamps(self, n).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rrpc::fabric::RemoteAddr;
    use rrpc::NodeId;

    fn client(epoch: u16, incarnation: u64) -> TsoClient {
        TsoClient {
            node: NodeId(3),
            counter: RemoteAddr { addr: 0, rkey: 7 },
            placement: "device".into(),
            epoch,
            incarnation,
        }
    }

    #[test]
    fn adopts_a_later_epoch_keeps_the_same_incarnation_and_refuses_the_rest() {
        let f = OracleFollower::new(
            "127.0.0.1:1".parse().unwrap(),
            client(2, 11),
            ReconnectConfig::default(),
        );
        let old = f.client();
        // The same incarnation after a QP failure: pause, keep it.
        assert!(f.adopt(client(2, 11), &old, true).unwrap());
        assert_eq!(f.reconnects(), 0);
        // Same epoch and counter word, another process (restarted without its state dir
        // on zero-based device memory): would go back.
        assert!(matches!(
            f.adopt(client(2, 12), &old, false),
            Err(TsoError::WentBack { old: 2, new: 2, .. })
        ));
        assert!(matches!(
            f.adopt(client(1, 13), &old, false),
            Err(TsoError::WentBack { old: 2, new: 1, .. })
        ));
        // A later epoch is adopted by everyone.
        assert!(!f.adopt(client(3, 14), &old, false).unwrap());
        assert_eq!((f.client().epoch(), f.reconnects()), (3, 1));
    }
}
