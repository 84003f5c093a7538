//! The survivor that recovers a dead compute node in `txn-bench --cnodes N`: a thread
//! of the parent process with a transaction client of its own, which runs
//! [`txn::coordinator::TxnClient::recover`] (the dead life's commit logs rolled forward
//! or back, its CVT lock words, insert guards and claims swept, then its Scythe
//! tickets released) when asked, and answers with what it did.
//!
//! The parent asks only for a life it knows is dead (it reaped the process, or the
//! membership service expired its lease and every memory node fenced it), and starts a
//! dead node's next incarnation only after the answer: a restarted compute node serves
//! only after its previous life's recovery.

use std::sync::mpsc;
use std::time::Duration;

use anyhow::Context;
use rrpc::fabric::Fabric;
use rrpc::runtime::{block_on, RuntimeConfig, ThreadCtx};
use txn::coordinator::{ClusterAddrs, Protocol, TxnClient, TxnConfig};
use txn::recovery::RecoveryReport;

type Ask = (u32, u64, mpsc::Sender<Result<RecoveryReport, String>>);

/// A recovery thread (see the module docs).
pub struct Recoverer {
    tx: Option<mpsc::Sender<Ask>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Recoverer {
    /// Start the thread on `fabric` (the parent's), connected to `addrs` for
    /// `protocol` (Scythe's lock service too). Blocks until it is connected.
    ///
    /// Errors: the client could not connect.
    pub fn start(fabric: Fabric, addrs: ClusterAddrs, protocol: Protocol) -> anyhow::Result<Self> {
        let (tx, rx) = mpsc::channel::<Ask>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
        let thread = std::thread::Builder::new()
            .name("recoverer".into())
            .spawn(move || {
                let client = ThreadCtx::new(fabric, RuntimeConfig::default())
                    .map_err(|e| e.to_string())
                    .and_then(|ctx| {
                        let cfg = TxnConfig {
                            protocol,
                            ..TxnConfig::default()
                        };
                        TxnClient::connect(ctx, &addrs, cfg).map_err(|e| e.to_string())
                    });
                let client = match client {
                    Ok(c) => std::rc::Rc::new(c),
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                for (node, inc, answer) in rx {
                    let c = client.clone();
                    let ctx = client.ctx().clone();
                    let r = block_on(&ctx, async move { c.recover(node, inc).await });
                    let _ = answer.send(r.map_err(|e| e.to_string()));
                }
            })
            .context("starting the recovery thread")?;
        ready_rx
            .recv()
            .context("the recovery thread ended before connecting")?
            .map_err(|e| anyhow::anyhow!("the recovery client: {e}"))?;
        Ok(Self {
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    /// Recover compute node `node`'s life `incarnation`, waiting at most `timeout`.
    ///
    /// Errors: recovery failed (a memory node or the lock service could not be
    /// reached; running it again is safe) or took longer than `timeout`.
    pub fn recover(
        &self,
        node: u32,
        incarnation: u64,
        timeout: Duration,
    ) -> Result<RecoveryReport, String> {
        let (atx, arx) = mpsc::channel();
        self.tx
            .as_ref()
            .ok_or("the recovery thread is gone")?
            .send((node, incarnation, atx))
            .map_err(|_| "the recovery thread is gone".to_string())?;
        arx.recv_timeout(timeout)
            .map_err(|_| format!("recovery did not finish within {timeout:?}"))?
    }
}

impl Drop for Recoverer {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
