//! The RPC variants over another call transport than rrpc, to compare transports as RCC
//! compares its two-sided RDMA RPC with TCP (RCC, 5, Table 3: 5.2-10x).
//!
//! [`CallTransport`] is an object-safe request-reply transport (`(node, handler,
//! request) -> reply`); [`CallsNet`] is a [`Net`] over one, which serves the RPC variant
//! only: its one-sided operations fail with [`ONE_SIDED_NEEDS_RDMA`]. A
//! [`CallTransportFactory`] (in [`crate::cluster::RunConfig::calls`]) starts one server
//! per node answering through that node's [`NodeHandlers`], and hands out clients; the
//! coordinators still run on the nodes' rrpc threads, only their calls take the other
//! transport. The transport itself lives outside this crate (the bench's tonic one).

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;

use crate::net::{Net, NetError, RrpcNet, YieldNow};
use crate::server;
use crate::store::Store;
use crate::wire;

/// The error of every one-sided operation over a [`CallsNet`].
pub const ONE_SIDED_NEEDS_RDMA: &str =
    "one-sided operations need RDMA; the tcp transport serves the RPC variant only";

/// A reply on its way: the handler's reply, or the transport's or handler's error.
pub type CallFuture = Pin<Box<dyn Future<Output = Result<Vec<u8>, String>>>>;

/// A request-reply transport to every node's handlers (indices `0..nodes`), used from
/// one thread.
pub trait CallTransport {
    /// Call `handler` of `node` with `req`; resolves to the reply.
    fn call(&self, node: usize, handler: u16, req: Vec<u8>) -> CallFuture;
}

/// A turn for the thread's other coroutines, as the thread's executor gives it.
pub type YieldFn = Rc<dyn Fn() -> Pin<Box<dyn Future<Output = ()>>>>;

/// A coordinator's [`Net`] whose RPCs go over a [`CallTransport`]; its one-sided
/// operations fail with [`ONE_SIDED_NEEDS_RDMA`]. Clones share the transport.
#[derive(Clone)]
pub struct CallsNet {
    calls: Rc<dyn CallTransport>,
    yield_fn: Option<YieldFn>,
}

impl std::fmt::Debug for CallsNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallsNet").finish_non_exhaustive()
    }
}

impl CallsNet {
    /// Calls over `calls`; `yield_fn` gives other coroutines a turn (`None`: a future
    /// that is pending once and wakes itself, [`YieldNow`]).
    pub fn new(calls: Rc<dyn CallTransport>, yield_fn: Option<YieldFn>) -> Self {
        Self { calls, yield_fn }
    }

    fn one_sided(node: usize) -> NetError {
        NetError::OneSided {
            node,
            why: ONE_SIDED_NEEDS_RDMA.into(),
        }
    }
}

impl Net for CallsNet {
    async fn read(&self, node: usize, _off: u64, _len: usize) -> Result<Vec<u8>, NetError> {
        Err(Self::one_sided(node))
    }
    async fn write_ordered(&self, node: usize, _writes: &[(u64, &[u8])]) -> Result<(), NetError> {
        Err(Self::one_sided(node))
    }
    async fn cas(&self, node: usize, _off: u64, _exp: u64, _new: u64) -> Result<u64, NetError> {
        Err(Self::one_sided(node))
    }
    async fn call(&self, node: usize, handler: u16, req: Vec<u8>) -> Result<Vec<u8>, NetError> {
        self.calls
            .call(node, handler, req)
            .await
            .map_err(|why| NetError::Call { node, handler, why })
    }
    async fn yield_now(&self) {
        match &self.yield_fn {
            Some(f) => f().await,
            None => YieldNow::default().await,
        }
    }
}

/// A cluster node's network: rrpc for everything, or its RPCs over another transport
/// ([`CallsNet`]).
#[derive(Clone, Debug)]
pub enum AnyNet {
    /// rrpc: one-sided operations and RPC.
    Rrpc(RrpcNet),
    /// RPCs over a [`CallTransport`], no one-sided operations.
    Calls(CallsNet),
}

impl Net for AnyNet {
    async fn read(&self, node: usize, off: u64, len: usize) -> Result<Vec<u8>, NetError> {
        match self {
            Self::Rrpc(n) => n.read(node, off, len).await,
            Self::Calls(n) => n.read(node, off, len).await,
        }
    }
    async fn write_ordered(&self, node: usize, writes: &[(u64, &[u8])]) -> Result<(), NetError> {
        match self {
            Self::Rrpc(n) => n.write_ordered(node, writes).await,
            Self::Calls(n) => n.write_ordered(node, writes).await,
        }
    }
    async fn cas(&self, node: usize, off: u64, expected: u64, new: u64) -> Result<u64, NetError> {
        match self {
            Self::Rrpc(n) => n.cas(node, off, expected, new).await,
            Self::Calls(n) => n.cas(node, off, expected, new).await,
        }
    }
    async fn call(&self, node: usize, handler: u16, req: Vec<u8>) -> Result<Vec<u8>, NetError> {
        match self {
            Self::Rrpc(n) => n.call(node, handler, req).await,
            Self::Calls(n) => n.call(node, handler, req).await,
        }
    }
    async fn yield_now(&self) {
        match self {
            Self::Rrpc(n) => n.yield_now().await,
            Self::Calls(n) => n.yield_now().await,
        }
    }
}

/// A node's RPC handlers over its partition, for a server of another transport: every
/// handler of the RPC variants (the protocols', WAITDIE's waiting fetch and CALVIN's
/// deposits). Shares the partition's memory, so any thread may serve.
#[derive(Clone)]
pub struct NodeHandlers {
    store: Arc<dyn Store>,
    region: u64,
    stopped: Arc<dyn Fn() -> bool + Send + Sync>,
}

impl std::fmt::Debug for NodeHandlers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeHandlers")
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

impl NodeHandlers {
    /// The handlers over `store`, a partition of `region` bytes.
    pub fn new(store: Arc<dyn Store>, region: u64) -> Self {
        Self {
            store,
            region,
            stopped: Arc::new(|| false),
        }
    }

    /// WAITDIE's waiting fetch gives up (replies a conflict) once `stopped()` says the
    /// run is over ([`server::serve_waitdie`]).
    pub fn stopping_when(mut self, stopped: impl Fn() -> bool + Send + Sync + 'static) -> Self {
        self.stopped = Arc::new(stopped);
        self
    }

    /// Serve request `req` to `handler`; `yield_now` is the serving executor's turn for
    /// its other tasks (WAITDIE's fetch waits for the lock by yielding). Errors: an
    /// unknown handler, a malformed request, the handler's refusal.
    pub async fn serve<Y: Future<Output = ()>>(
        &self,
        handler: u16,
        req: Vec<u8>,
        yield_now: impl Fn() -> Y,
    ) -> Result<Vec<u8>, String> {
        let s: &dyn Store = &*self.store;
        if handler == wire::FETCH_WAIT {
            let stopped = &*self.stopped;
            return server::serve_waitdie(s, self.region, &req, yield_now, stopped).await;
        }
        let mut out = Vec::new();
        if handler == wire::CALVIN_BATCH || handler == wire::CALVIN_FORWARD {
            server::serve_deposit(s, self.region, handler, &req, &mut out)?;
        } else {
            server::serve(s, self.region, handler, &req, &mut out)?;
        }
        Ok(out)
    }
}

/// Another call transport for a cluster run ([`crate::cluster::RunConfig::calls`]): one
/// server per node, clients for the nodes' threads.
pub trait CallTransportFactory: Send + Sync + std::fmt::Debug {
    /// The transport's name in reports (`tcp`).
    fn name(&self) -> &str;
    /// Start a server per node, node `i` answering through `handlers[i]`. Dropping the
    /// returned cluster stops them. Errors: a server that could not start.
    fn start(&self, handlers: Vec<NodeHandlers>) -> Result<Box<dyn CallCluster>, String>;
}

/// Running servers of a [`CallTransportFactory`], one per node; dropping it stops them.
pub trait CallCluster: Send {
    /// A client reaching every node's server, for one thread. Errors: a client that could
    /// not be set up.
    fn client(&self) -> Result<Box<dyn CallTransport + Send>, String>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::HeapStore;

    /// Calls answered inline by every node's handlers over heap partitions.
    struct Inline(Vec<NodeHandlers>);

    impl CallTransport for Inline {
        fn call(&self, node: usize, handler: u16, req: Vec<u8>) -> CallFuture {
            let h = self.0.get(node).cloned();
            Box::pin(async move {
                h.ok_or_else(|| format!("no node {node}"))?
                    .serve(handler, req, YieldNow::default)
                    .await
            })
        }
    }

    #[test]
    fn one_sided_operations_over_the_call_transport_fail_clearly() {
        let h = NodeHandlers::new(Arc::new(HeapStore::new(4096)), 4096);
        let net = CallsNet::new(Rc::new(Inline(vec![h])), None);
        futures::executor::block_on(async {
            let errs = [
                net.read(0, 0, 8).await.unwrap_err(),
                net.write_ordered(0, &[(0, &[0u8; 8][..])])
                    .await
                    .unwrap_err(),
                net.cas(0, 0, 0, 1).await.unwrap_err(),
            ];
            for e in errs {
                assert!(matches!(e, NetError::OneSided { node: 0, .. }), "{e}");
                assert!(e.to_string().contains(ONE_SIDED_NEEDS_RDMA), "{e}");
            }
            // Calls do go through: an unknown handler is the handler's refusal.
            let e = net.call(0, 999, vec![]).await.unwrap_err();
            assert!(matches!(e, NetError::Call { handler: 999, .. }), "{e}");
            let e = net.call(1, wire::READ, vec![]).await.unwrap_err();
            assert!(e.to_string().contains("no node 1"), "{e}");
            net.yield_now().await;
        });
    }
}
