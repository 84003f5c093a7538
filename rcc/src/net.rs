//! The coordinator's view of the cluster: one-sided READ, WRITE and CAS on any node's
//! partition, and RPCs to its handlers. The protocols are written once over [`Net`];
//! [`LocalNet`] runs them in memory for unit tests (every operation yields first, so
//! coroutines interleave between any two of them), [`RrpcNet`] over rrpc.
//!
//! Doorbell batching (RCC, 3): operations a coroutine awaits together (joined futures)
//! are posted in one round; on rrpc those to one node share a doorbell. An ordered list
//! ([`Net::write_ordered`]) is RCC's update-and-unlock: WRITE record, WRITE lock, one
//! QP, only the last signaled.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};

use rrpc::fabric::MrDesc;
use rrpc::runtime::ThreadCtx;
use rrpc::NodeId;

use crate::server;
use crate::store::{HeapStore, Store};
use crate::wire;

/// A failed network operation.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NetError {
    /// A one-sided operation failed (the fabric's message).
    #[error("one-sided operation on node {node}: {why}")]
    OneSided {
        /// Node index.
        node: usize,
        /// The fabric's error.
        why: String,
    },
    /// An RPC failed: transport, or the handler's error reply.
    #[error("RPC {handler} to node {node}: {why}")]
    Call {
        /// Node index.
        node: usize,
        /// Handler id.
        handler: u16,
        /// The transport's or handler's message.
        why: String,
    },
    /// The timestamp oracle failed or handed out a timestamp out of range.
    #[error("timestamp oracle: {why}")]
    Timestamp {
        /// What went wrong.
        why: String,
    },
}

/// One coordinator thread's access to every node (indices `0..nodes`).
pub trait Net {
    /// READ `len` bytes at `off` of `node`'s partition.
    fn read(
        &self,
        node: usize,
        off: u64,
        len: usize,
    ) -> impl Future<Output = Result<Vec<u8>, NetError>>;
    /// WRITEs in order on one QP, awaited as one (RCC's update-and-unlock).
    fn write_ordered(
        &self,
        node: usize,
        writes: &[(u64, &[u8])],
    ) -> impl Future<Output = Result<(), NetError>>;
    /// 8-byte CAS at `off` of `node`; returns the old word.
    fn cas(
        &self,
        node: usize,
        off: u64,
        expected: u64,
        new: u64,
    ) -> impl Future<Output = Result<u64, NetError>>;
    /// RPC `handler` of `node` with `req`; returns the reply.
    fn call(
        &self,
        node: usize,
        handler: u16,
        req: Vec<u8>,
    ) -> impl Future<Output = Result<Vec<u8>, NetError>>;
    /// Give the thread's other coroutines a turn.
    fn yield_now(&self) -> impl Future<Output = ()>;
}

/// A future that is pending once, waking itself: a turn for the other coroutines.
#[derive(Debug, Default)]
pub struct YieldNow(bool);

impl Future for YieldNow {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// Every node's partition in this process's memory, the handlers run inline: the
/// protocols without a fabric (unit tests). Clones share the partitions.
#[derive(Clone, Debug)]
pub struct LocalNet {
    stores: Rc<Vec<Arc<HeapStore>>>,
    region: u64,
    /// One-sided operations and RPCs made, for tests.
    pub ops: Rc<Cell<u64>>,
    jitter: Option<Rc<Jitter>>,
    /// [`LocalNet::replaying_cas`]: (every k-th CAS that swaps, CASes that swapped).
    replay: Option<(u64, Rc<Cell<u64>>)>,
}

/// A coordinator's random delays ([`LocalNet::jittered`]): its operations wait a random
/// number of turns but execute in the order they were issued.
#[derive(Debug)]
struct Jitter {
    turns: u64,
    rng: Cell<u64>,
    next: Cell<u64>,
    serving: Cell<u64>,
}

impl LocalNet {
    /// `nodes` zeroed partitions of `region` bytes.
    pub fn new(nodes: usize, region: u64) -> Self {
        Self {
            stores: Rc::new(
                (0..nodes)
                    .map(|_| Arc::new(HeapStore::new(region)))
                    .collect(),
            ),
            region,
            ops: Rc::new(Cell::new(0)),
            jitter: None,
            replay: None,
        }
    }

    /// The same partitions, where every `every`-th CAS that swaps replies with the word
    /// after it (`new`) instead of the one before (`expected`), as the reply to a
    /// retransmitted atomic executed twice would: the fault the one-sided protocols'
    /// [`crate::coord::Coord::acquired`] rule survives. Clones share the count.
    pub fn replaying_cas(&self, every: u64) -> Self {
        Self {
            replay: Some((every.max(1), Rc::new(Cell::new(0)))),
            ..self.clone()
        }
    }

    /// The same partitions, with each operation of the returned network delayed by a
    /// random number (below `turns`, at least 1) of extra turns drawn from `seed`, operations still
    /// executing in the order they were issued (as on one QP). Without it, the
    /// operations a coroutine awaits together execute back to back; with it, other
    /// coroutines' operations interleave between them, as on a real fabric. For one
    /// coordinator each.
    pub fn jittered(&self, seed: u64, turns: u64) -> Self {
        Self {
            jitter: Some(Rc::new(Jitter {
                turns: turns.max(1),
                rng: Cell::new(seed | 1),
                next: Cell::new(0),
                serving: Cell::new(0),
            })),
            ..self.clone()
        }
    }

    /// Wait for this operation's turn: one yield, plus the jitter's.
    async fn turn(&self) -> Option<Rc<Jitter>> {
        YieldNow::default().await;
        let j = self.jitter.clone()?;
        let ticket = j.next.get();
        j.next.set(ticket + 1);
        let mut x = j.rng.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        j.rng.set(x);
        for _ in 0..x % j.turns {
            YieldNow::default().await;
        }
        while j.serving.get() != ticket {
            YieldNow::default().await;
        }
        Some(j)
    }

    fn served(j: Option<Rc<Jitter>>) {
        if let Some(j) = j {
            j.serving.set(j.serving.get() + 1);
        }
    }

    /// Node `node`'s partition.
    pub fn store(&self, node: usize) -> &Arc<HeapStore> {
        &self.stores[node]
    }

    fn at(&self, node: usize, off: u64, len: usize) -> Result<&HeapStore, NetError> {
        let s = self.stores.get(node).ok_or_else(|| NetError::OneSided {
            node,
            why: "no such node".into(),
        })?;
        if off + len as u64 > self.region || !off.is_multiple_of(8) {
            return Err(NetError::OneSided {
                node,
                why: format!("{len} bytes at {off} outside the partition"),
            });
        }
        Ok(s)
    }
}

impl Net for LocalNet {
    async fn read(&self, node: usize, off: u64, len: usize) -> Result<Vec<u8>, NetError> {
        let j = self.turn().await;
        Self::served(j);
        self.ops.set(self.ops.get() + 1);
        let s = self.at(node, off, len)?;
        let mut v = vec![0; len];
        s.read(off, &mut v);
        Ok(v)
    }
    async fn write_ordered(&self, node: usize, writes: &[(u64, &[u8])]) -> Result<(), NetError> {
        let j = self.turn().await;
        Self::served(j);
        for (off, d) in writes {
            self.ops.set(self.ops.get() + 1);
            self.at(node, *off, d.len())?.write(*off, d);
        }
        Ok(())
    }
    async fn cas(&self, node: usize, off: u64, expected: u64, new: u64) -> Result<u64, NetError> {
        let j = self.turn().await;
        Self::served(j);
        self.ops.set(self.ops.get() + 1);
        let old = self.at(node, off, 8)?.cas(off, expected, new);
        if let (Some((every, swapped)), true) = (&self.replay, old == expected && old != new) {
            swapped.set(swapped.get() + 1);
            if swapped.get().is_multiple_of(*every) {
                return Ok(new);
            }
        }
        Ok(old)
    }
    async fn call(&self, node: usize, handler: u16, req: Vec<u8>) -> Result<Vec<u8>, NetError> {
        let j = self.turn().await;
        Self::served(j);
        self.ops.set(self.ops.get() + 1);
        let s: &HeapStore = self.at(node, 0, 0)?;
        let err = |why: String| NetError::Call { node, handler, why };
        if handler == wire::FETCH_WAIT {
            return server::serve_waitdie(s, self.region, &req, YieldNow::default, &|| false)
                .await
                .map_err(err);
        }
        let mut out = Vec::new();
        if handler == wire::CALVIN_BATCH || handler == wire::CALVIN_FORWARD {
            server::serve_deposit(s, self.region, handler, &req, &mut out).map_err(err)?;
            return Ok(out);
        }
        server::serve(s, self.region, handler, &req, &mut out).map_err(err)?;
        Ok(out)
    }
    fn yield_now(&self) -> impl Future<Output = ()> {
        YieldNow::default()
    }
}

/// The nodes' partitions through rrpc: one thread's runtime context, connected for
/// one-sided operations and RPC to every node, and each node's exported region.
#[derive(Clone)]
pub struct RrpcNet {
    ctx: Rc<ThreadCtx>,
    nodes: Rc<Vec<(NodeId, MrDesc)>>,
}

impl std::fmt::Debug for RrpcNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RrpcNet")
            .field("nodes", &self.nodes)
            .finish()
    }
}

impl RrpcNet {
    /// Node `i` of the cluster is `nodes[i]`: its rrpc node id and partition region.
    pub fn new(ctx: Rc<ThreadCtx>, nodes: Vec<(NodeId, MrDesc)>) -> Self {
        Self {
            ctx,
            nodes: Rc::new(nodes),
        }
    }

    /// The thread's runtime context.
    pub fn ctx(&self) -> &Rc<ThreadCtx> {
        &self.ctx
    }

    fn node(&self, node: usize) -> Result<(NodeId, MrDesc), NetError> {
        self.nodes.get(node).copied().ok_or(NetError::OneSided {
            node,
            why: "no such node".into(),
        })
    }
}

impl Net for RrpcNet {
    async fn read(&self, node: usize, off: u64, len: usize) -> Result<Vec<u8>, NetError> {
        let (id, mr) = self.node(node)?;
        self.ctx
            .read(id, mr.at(off), len)
            .await
            .map_err(|e| NetError::OneSided {
                node,
                why: e.to_string(),
            })
    }
    async fn write_ordered(&self, node: usize, writes: &[(u64, &[u8])]) -> Result<(), NetError> {
        let (id, mr) = self.node(node)?;
        let ws: Vec<_> = writes.iter().map(|(o, d)| (mr.at(*o), *d)).collect();
        self.ctx
            .write_ordered(id, &ws)
            .await
            .map_err(|e| NetError::OneSided {
                node,
                why: e.to_string(),
            })
    }
    async fn cas(&self, node: usize, off: u64, expected: u64, new: u64) -> Result<u64, NetError> {
        let (id, mr) = self.node(node)?;
        self.ctx
            .cas(id, mr.at(off), expected, new)
            .await
            .map_err(|e| NetError::OneSided {
                node,
                why: e.to_string(),
            })
    }
    async fn call(&self, node: usize, handler: u16, req: Vec<u8>) -> Result<Vec<u8>, NetError> {
        let (id, _) = self.node(node)?;
        self.ctx
            .call(id, handler, &req)
            .await
            .map_err(|e| NetError::Call {
                node,
                handler,
                why: e.to_string(),
            })
    }
    fn yield_now(&self) -> impl Future<Output = ()> {
        self.ctx.yield_now()
    }
}
