//! A `Send + Clone` client handle for code outside rrpc's runtime (tokio tasks, thread
//! pools, plain threads): [`BridgeClient`] owns one dedicated OS thread running a
//! [`ThreadCtx`] and its executor; calls made through the handle travel to that thread
//! over a channel, run there as coroutines (so calls from many tasks share its polling
//! rounds and doorbells), and their results come back through a oneshot channel whose
//! receiving end is a plain [`Future`] any executor can await.
//!
//! Costs: one cross-thread hop each way (microseconds, on top of the call), and the
//! bridge thread busy-polls like every rrpc thread, so it takes a core while it lives.
//! The thread ends, after finishing the calls in flight, when the last clone of the
//! handle is dropped; that drop waits for it.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{mpsc as std_mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use futures::channel::{mpsc, oneshot};
use futures::StreamExt;

use crate::fabric::Fabric;
use crate::runtime::{CallError, Executor, RpcError, RuntimeConfig, ThreadCtx};
use crate::typed::{Rpc, TypedCallError};
use crate::NodeId;

/// A job for the bridge thread: builds the coroutine to run there.
type Job = Box<dyn FnOnce(Rc<ThreadCtx>) -> Pin<Box<dyn Future<Output = ()>>> + Send>;

/// Errors of calls through a [`BridgeClient`].
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum BridgeError {
    /// The bridge thread is gone (it panicked) before answering.
    #[error("the rrpc bridge thread is gone")]
    Closed,
    /// The call failed.
    #[error(transparent)]
    Call(#[from] CallError),
    /// The typed call failed (encoding, the call, or decoding).
    #[error(transparent)]
    Typed(#[from] TypedCallError),
}

/// The shared part of every clone: the job queue and the thread to join.
struct Inner {
    jobs: mpsc::UnboundedSender<Job>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Ends the pump coroutine; the executor then finishes the jobs in flight.
        self.jobs.close_channel();
        if let Some(t) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            // The last handle dropped by a coroutine of the bridge thread itself cannot
            // wait for that thread; it ends on its own once its coroutines finish.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

/// A handle on an rrpc client thread, usable from any thread or async runtime:
/// `Send + Sync + Clone`; clones share the thread (module docs for the costs).
#[derive(Clone)]
pub struct BridgeClient {
    inner: Arc<Inner>,
}

impl BridgeClient {
    /// Start the bridge thread on `fabric` with runtime config `cfg`, connect it for RPC
    /// to each node in `servers` (blocking until done) and return the handle with the
    /// servers' node ids, in the order given. Errors: the thread's context cannot be
    /// created, or a connection fails (the thread then ends).
    pub fn start(
        fabric: Fabric,
        cfg: RuntimeConfig,
        servers: &[SocketAddr],
    ) -> Result<(Self, Vec<NodeId>), RpcError> {
        let (jobs, mut queue) = mpsc::unbounded::<Job>();
        let (ready_tx, ready_rx) = std_mpsc::channel::<Result<Vec<NodeId>, RpcError>>();
        let servers = servers.to_vec();
        let thread = std::thread::Builder::new()
            .name("rrpc-bridge".into())
            .spawn(move || {
                let setup = || -> Result<(Rc<ThreadCtx>, Vec<NodeId>), RpcError> {
                    let ctx = ThreadCtx::new(fabric, cfg)?;
                    let mut nodes = Vec::with_capacity(servers.len());
                    for a in &servers {
                        nodes.push(ctx.connect_rpc(*a)?.node);
                    }
                    Ok((ctx, nodes))
                };
                let ctx = match setup() {
                    Ok((ctx, nodes)) => {
                        let _ = ready_tx.send(Ok(nodes));
                        ctx
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let mut ex = Executor::new(ctx.clone());
                let c = ctx.clone();
                // The pump: each job becomes a coroutine of this thread; it ends when the
                // last handle closes the queue, and the executor then runs the rest out.
                ex.spawn(async move {
                    while let Some(job) = queue.next().await {
                        c.spawn(job(c.clone()));
                    }
                });
                ex.run();
            })
            .map_err(|source| {
                RpcError::from(crate::fabric::FabricError::Io {
                    op: "spawn the bridge thread",
                    source,
                })
            })?;
        let ready = ready_rx.recv();
        let nodes = match ready {
            Ok(Ok(nodes)) => nodes,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                let _ = thread.join();
                return Err(crate::runtime::ConnectError::Panicked(0).into());
            }
        };
        let inner = Arc::new(Inner {
            jobs,
            thread: Mutex::new(Some(thread)),
        });
        Ok((Self { inner }, nodes))
    }

    /// Run `f` on the bridge thread as a coroutine with the thread's context and return
    /// its output: the general form of the calls below (several calls, one-sided
    /// operations, anything a coroutine may do). `f` is sent to the thread, its future
    /// need not be `Send`. Errors: [`BridgeError::Closed`] if the thread is gone.
    pub async fn run<T, F, Fut>(&self, f: F) -> Result<T, BridgeError>
    where
        T: Send + 'static,
        F: FnOnce(Rc<ThreadCtx>) -> Fut + Send + 'static,
        Fut: Future<Output = T> + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move |ctx| {
            Box::pin(async move {
                let _ = tx.send(f(ctx).await);
            })
        });
        self.inner
            .jobs
            .unbounded_send(job)
            .map_err(|_| BridgeError::Closed)?;
        rx.await.map_err(|_| BridgeError::Closed)
    }

    /// Call handler `handler` on `node` with `req` ([`ThreadCtx::call`] on the bridge
    /// thread). Errors: the call's, or [`BridgeError::Closed`].
    pub async fn call(
        &self,
        node: NodeId,
        handler: u16,
        req: Vec<u8>,
    ) -> Result<Vec<u8>, BridgeError> {
        self.run(move |ctx| async move { ctx.call(node, handler, &req).await })
            .await?
            .map_err(BridgeError::Call)
    }

    /// Call [`Rpc`] `R` on `node` with `req` ([`ThreadCtx::call_typed`] on the bridge
    /// thread). Errors: the typed call's, or [`BridgeError::Closed`].
    pub async fn call_typed<R>(&self, node: NodeId, req: R::Req) -> Result<R::Resp, BridgeError>
    where
        R: Rpc,
        R::Req: Send,
        R::Resp: Send,
    {
        self.run(move |ctx| async move { ctx.call_typed::<R>(node, &req).await })
            .await?
            .map_err(BridgeError::Typed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_handle_is_send_sync_and_clone() {
        fn check<T: Send + Sync + Clone + 'static>() {}
        check::<BridgeClient>();
        fn send<T: Send>() {}
        send::<BridgeError>();
    }
}
