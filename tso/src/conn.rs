//! A thread's connection to an oracle that follows it across restarts (the client half of
//! [`crate::epoch`]'s guarantee; Scythe 4.5 leaves TSO recovery open, DESIGN.md "tso").
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
//! timestamps), or if it is the very same incarnation (same epoch and counter: the QP
//! failed but the oracle lives; the pool repairs the QP). Anything else (an oracle
//! restarted without `--state-dir`, a rolled-back state directory) would hand out
//! timestamps that go back: [`TsoError::WentBack`], never a timestamp.
//!
//! **What a retry costs.** An FAA that failed may have been executed; its timestamps are
//! then never handed out (gaps are allowed, duplicates are not). The retried FAA is
//! issued after the request arrived, so real-time order holds.
//!
//! The bootstrap address is fixed: restart the oracle at the same `--listen` address.

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use rrpc::runtime::{OneSidedError, RpcError, ThreadCtx};

use crate::oracle::{TsoClient, TsoError};
use crate::timestamp::{Timestamp, TimestampRange};

/// How long and how often [`TsoConn`] tries to reach a restarted oracle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

/// One thread's handle on the oracle at a bootstrap address, reconnecting to a restarted
/// oracle (see the module docs). Shared by the thread's coroutines through `&self`.
pub struct TsoConn {
    ctx: Rc<ThreadCtx>,
    addr: SocketAddr,
    cfg: ReconnectConfig,
    current: RefCell<TsoClient>,
    /// Bumped at every switch to a new incarnation: a coroutine whose FAA failed on an
    /// older one retries at once instead of reconnecting again.
    generation: Cell<u64>,
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
            addr,
            cfg,
            current: RefCell::new(client),
            generation: Cell::new(0),
        })
    }

    /// The incarnation in use now.
    pub fn client(&self) -> TsoClient {
        self.current.borrow().clone()
    }

    /// Incarnations switched to after the first (restarts survived by this thread).
    pub fn reconnects(&self) -> u64 {
        self.generation.get()
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
        let mut since: Option<Instant> = None;
        loop {
            let client = self.current.borrow().clone();
            let generation = self.generation.get();
            let cause = match client.timestamps(&self.ctx, n).await {
                Ok(r) => return Ok(r),
                Err(TsoError::Rpc(RpcError::OneSided(
                    e @ (OneSidedError::Completion { .. }
                    | OneSidedError::PeerGone { .. }
                    | OneSidedError::NotConnected { .. }),
                ))) => e,
                Err(e) => return Err(e),
            };
            let first_failure = *since.get_or_insert_with(Instant::now);
            if self.generation.get() != generation {
                continue; // another coroutine of this thread switched already
            }
            self.recover(&client, generation, first_failure, cause)
                .await?;
        }
    }

    /// After an FAA on `old` (taken at `generation`) failed with `cause`: switch to the
    /// oracle's current incarnation, or return when `old` is still current (the pool
    /// repairs its QP) or another coroutine switched meanwhile.
    async fn recover(
        &self,
        old: &TsoClient,
        generation: u64,
        first_failure: Instant,
        cause: OneSidedError,
    ) -> Result<(), TsoError> {
        let mut last = RpcError::OneSided(cause);
        loop {
            if self.generation.get() != generation {
                return Ok(());
            }
            // Blocking, but bounded: a refused connection returns at once, an unreachable
            // host after the runtime's connect timeout.
            match self.ctx.reconnect(self.addr) {
                Ok(info) => {
                    let new = TsoClient::from_info(&info)?;
                    if new.epoch() > old.epoch() {
                        tracing::info!(
                            addr = %self.addr,
                            old_epoch = old.epoch(),
                            new_epoch = new.epoch(),
                            "TSO oracle restarted; switched to its new epoch"
                        );
                        *self.current.borrow_mut() = new;
                        self.generation.set(self.generation.get() + 1);
                        return Ok(());
                    }
                    if new.epoch() == old.epoch() && new.counter() == old.counter() {
                        // Same incarnation, reached again: retry the FAA after a pause
                        // (its pool reconnects the failed QP meanwhile).
                        if first_failure.elapsed() >= self.cfg.wait {
                            return Err(TsoError::Unavailable {
                                addr: self.addr,
                                waited: first_failure.elapsed(),
                                source: Box::new(last),
                            });
                        }
                        self.ctx.sleep(self.cfg.retry_interval).await;
                        return Ok(());
                    }
                    return Err(TsoError::WentBack {
                        addr: self.addr,
                        old: old.epoch(),
                        new: new.epoch(),
                    });
                }
                Err(e) => last = RpcError::Connect(e),
            }
            if first_failure.elapsed() >= self.cfg.wait {
                return Err(TsoError::Unavailable {
                    addr: self.addr,
                    waited: first_failure.elapsed(),
                    source: Box::new(last),
                });
            }
            self.ctx.sleep(self.cfg.retry_interval).await;
        }
    }
}
