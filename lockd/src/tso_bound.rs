//! The oracle's issued high mark, learned by reading its counter, for the Lock RPC's
//! timestamp bound ([`crate::service::TsBound`]).
//!
//! A Lock RPC whose timestamp is above every timestamp the oracle has handed out would
//! raise its lock's `queued_ts` past all real ones, and the lock would refuse every later
//! request (Scythe 4.3, Fig. 14, line 5). The oracle's counter (Scythe 4.5: clients FAA
//! it one-sidedly) is exactly the largest timestamp issued, so the service reads it: a
//! thread of its own holds a runtime context connected to the oracle and answers each
//! ask with one 8-byte READ of the counter (asks that queue up meanwhile share it). The
//! service asks only for a timestamp above the last mark it learned (plus its slack,
//! [`crate::service::LockTable::set_ts_slack`]), and an ask that is not answered within
//! the wait is `None` (the service then applies its static bound only). A failed READ
//! makes the thread reconnect to the oracle at its address (a restarted oracle exports
//! a new counter, in a larger epoch).

use std::net::SocketAddr;
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::thread::JoinHandle;
use std::time::Duration;

use rrpc::fabric::Fabric;
use rrpc::runtime::{block_on, RuntimeConfig, ThreadCtx};
use tso::TsoClient;

use crate::service::TsBound;

/// Errors starting a [`TsoBound`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TsoBoundError {
    /// The runtime context of the reading thread could not be made.
    #[error("creating the runtime context that reads the TSO counter")]
    Context(#[source] Box<rrpc::runtime::ConnectError>),
    /// The oracle could not be reached.
    #[error("connecting to the TSO at {addr}")]
    Connect {
        /// The oracle's bootstrap address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: Box<rrpc::runtime::ConnectError>,
    },
    /// The oracle's export is not usable.
    #[error("the TSO at {addr} exports no counter")]
    Export {
        /// The oracle's bootstrap address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: Box<tso::TsoError>,
    },
    /// The reading thread could not be started, or died before it connected.
    #[error("starting the thread that reads the TSO counter")]
    Thread(#[source] std::io::Error),
}

/// An ask: where to send the counter's value (`None`: it could not be read).
type Ask = SyncSender<Option<u64>>;

/// The oracle's counter, read on demand by a thread of its own (module docs). Dropping
/// it ends the thread.
pub struct TsoBound {
    asks: Sender<Ask>,
    wait: Duration,
    thread: Option<JoinHandle<()>>,
}

impl TsoBound {
    /// Start the reading thread on `fabric` (a handle of the service's node), connected
    /// to the oracle at `tso`; an ask waits at most `wait` for its answer.
    ///
    /// Errors: [`TsoBoundError`] when the thread cannot start or the oracle cannot be
    /// reached now.
    pub fn start(fabric: Fabric, tso: SocketAddr, wait: Duration) -> Result<Self, TsoBoundError> {
        Self::start_with(fabric, tso, wait, RuntimeConfig::default())
    }

    /// [`TsoBound::start`] with the reading thread's runtime context configured by
    /// `runtime`.
    ///
    /// Errors: those of [`TsoBound::start`].
    pub fn start_with(
        fabric: Fabric,
        tso: SocketAddr,
        wait: Duration,
        runtime: RuntimeConfig,
    ) -> Result<Self, TsoBoundError> {
        let (asks, rx) = mpsc::channel::<Ask>();
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name("lockd-tso-bound".into())
            .spawn(move || serve(fabric, tso, runtime, rx, ready_tx))
            .map_err(TsoBoundError::Thread)?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Self {
                asks,
                wait,
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(TsoBoundError::Thread(std::io::Error::other(
                    "the thread ended before connecting",
                )))
            }
        }
    }
}

impl TsBound for TsoBound {
    fn issued_high(&self) -> Option<u64> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.asks.send(tx).ok()?;
        rx.recv_timeout(self.wait).ok().flatten()
    }
}

impl Drop for TsoBound {
    fn drop(&mut self) {
        // Closing the channel ends the thread's loop.
        let (closed, _) = mpsc::channel();
        drop(std::mem::replace(&mut self.asks, closed));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Connect to the oracle at `addr` on `ctx`.
fn connect(ctx: &ThreadCtx, addr: SocketAddr, again: bool) -> Result<TsoClient, TsoBoundError> {
    let info = if again {
        ctx.reconnect(addr)
    } else {
        ctx.connect(addr)
    }
    .map_err(|e| TsoBoundError::Connect {
        addr,
        source: Box::new(e),
    })?;
    TsoClient::from_info(&info).map_err(|e| TsoBoundError::Export {
        addr,
        source: Box::new(e),
    })
}

/// The reading thread: answer asks until the channel closes.
fn serve(
    fabric: Fabric,
    addr: SocketAddr,
    runtime: RuntimeConfig,
    asks: Receiver<Ask>,
    ready: SyncSender<Result<(), TsoBoundError>>,
) {
    let ctx = match ThreadCtx::new(fabric, runtime) {
        Ok(c) => c,
        Err(e) => {
            let _ = ready.send(Err(TsoBoundError::Context(Box::new(e))));
            return;
        }
    };
    let mut client = match connect(&ctx, addr, false) {
        Ok(c) => Some(c),
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    while let Ok(first) = asks.recv() {
        let mut waiting = vec![first];
        waiting.extend(asks.try_iter());
        if client.is_none() {
            client = connect(&ctx, addr, true)
                .inspect_err(|e| tracing::warn!(error = %e, "TSO bound: reconnect failed"))
                .ok();
        }
        let value = client.clone().and_then(|c| {
            let cx = ctx.clone();
            block_on(&ctx, async move {
                let b = cx.read(c.node(), c.counter(), 8).await.ok()?;
                Some(u64::from_le_bytes(b.get(..8)?.try_into().ok()?))
            })
        });
        if value.is_none() {
            tracing::warn!(tso = %addr, "TSO bound: reading the counter failed; reconnecting at the next ask");
            client = None;
        }
        for w in waiting {
            let _ = w.try_send(value);
        }
    }
}
