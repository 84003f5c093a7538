//! Incarnations, caller identity and fencing on a real node (FaRM-style): a server
//! learns each connection's (node, incarnation) at setup and tells handlers; fencing an
//! incarnation stops its one-sided operations and RPCs and refuses it later, while a
//! new incarnation of the same node id connects and works. On the shm fabric.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use rrpc::fabric::{Fabric, FabricConfig, FabricKind, MemoryRegion, MrDesc};
use rrpc::node::{Node, NodeConfig};
use rrpc::runtime::{block_on, RuntimeConfig, ThreadCtx};
use rrpc::NodeId;

mod common;
use common::ECHO;

/// Replies with the caller's node id (u32 LE) and incarnation (u64 LE).
const WHO: u16 = 40;
/// A sorted-batch handler replying with each request's caller, as WHO does.
const WHO_SORTED: u16 = 41;
/// An async handler replying with its caller, as WHO does.
const WHO_ASYNC: u16 = 42;

fn who(node: NodeId, incarnation: u64) -> Vec<u8> {
    let mut v = node.get().to_le_bytes().to_vec();
    v.extend_from_slice(&incarnation.to_le_bytes());
    v
}

/// Node 1: serves WHO, WHO_SORTED and ECHO, and exports an MR as "mr".
fn start_server(cluster: &str) -> (Node, MemoryRegion) {
    let f = Fabric::open(&FabricConfig::new(FabricKind::Shm, cluster, NodeId(1))).unwrap();
    let mr = f.alloc_mr(4096).unwrap();
    let mut h = common::echo_handlers();
    h.register_with_caller(WHO, |c, _req, out| {
        out.extend_from_slice(&who(c.node, c.incarnation));
        Ok(())
    });
    h.register_sorted_with_caller(
        WHO_SORTED,
        |_| Some((0, 0)),
        |batch, out| {
            for r in batch {
                out.push(Ok(who(r.caller.node, r.caller.incarnation)));
            }
        },
    );
    h.register_async_with_caller(WHO_ASYNC, |c, _req| async move {
        Ok(who(c.node, c.incarnation))
    });
    let mut exports = BTreeMap::new();
    exports.insert("mr".into(), serde_json::to_value(mr.desc()).unwrap());
    let n = Node::start(
        f,
        NodeConfig::new("mem", "127.0.0.1:0".parse().unwrap())
            .with_exports(exports)
            .rpc(h, 1),
    )
    .unwrap();
    (n, mr)
}

/// Node 100 as incarnation `inc`, in its own context, not yet connected. A context of
/// node 100 dropped just before may still be held by its pool's reconnect thread (a
/// fenced QP it is repairing, for at most `reconnect_give_up`): the node is taken again
/// once that thread lets go, within seconds.
fn client(cluster: &str, inc: u64) -> Rc<ThreadCtx> {
    let cfg = FabricConfig::new(FabricKind::Shm, cluster, NodeId(100)).with_incarnation(inc);
    let t0 = std::time::Instant::now();
    let f = loop {
        match Fabric::open(&cfg) {
            Err(rrpc::fabric::FabricError::NodeInUse { .. })
                if t0.elapsed() < Duration::from_secs(10) =>
            {
                std::thread::sleep(Duration::from_millis(10))
            }
            r => break r.unwrap(),
        }
    };
    assert_eq!(f.incarnation(), inc);
    ThreadCtx::new(
        f,
        RuntimeConfig::default()
            .with_call_timeout(Duration::from_millis(500))
            .with_reconnect_give_up(Duration::from_millis(200)),
    )
    .unwrap()
}

fn run<T: 'static>(ctx: &Rc<ThreadCtx>, f: impl AsyncFnOnce(Rc<ThreadCtx>) -> T + 'static) -> T {
    let c = ctx.clone();
    block_on(ctx, async move { f(c).await })
}

#[test]
fn handlers_see_the_caller_the_connection_authenticated() {
    let c = common::setup("fencing", "caller");
    let (srv, _mr) = start_server(c.name());
    let ctx = client(c.name(), 0xabc);
    let node = ctx.connect_rpc(srv.addr()).unwrap().node;
    let (plain, sorted, asynch) = run(&ctx, async move |ctx| {
        (
            ctx.call(node, WHO, b"I am node 7").await.unwrap(),
            ctx.call(node, WHO_SORTED, b"").await.unwrap(),
            ctx.call(node, WHO_ASYNC, b"").await.unwrap(),
        )
    });
    assert_eq!(plain, who(NodeId(100), 0xabc));
    assert_eq!(sorted, who(NodeId(100), 0xabc));
    assert_eq!(asynch, who(NodeId(100), 0xabc));
}

#[test]
fn a_fenced_incarnation_is_cut_off_and_a_new_one_works() {
    let c = common::setup("fencing", "fence");
    let (srv, mr) = start_server(c.name());
    let old = client(c.name(), 111);
    let info = old.connect_rpc(srv.addr()).unwrap();
    let node = info.node;
    let desc: MrDesc = info.export("mr").unwrap();
    // Before: a WRITE, a CAS and a call go through.
    run(&old, async move |ctx| {
        ctx.write(node, desc.at(0), &[1u8; 8]).await.unwrap();
        assert_eq!(ctx.cas(node, desc.at(8), 0, 5).await.unwrap(), 0);
        assert_eq!(ctx.call(node, ECHO, b"x").await.unwrap(), b"x");
    });
    assert_eq!(mr.load_u64(0), u64::from_le_bytes([1; 8]));
    assert_eq!(mr.load_u64(8), 5);

    let moved = srv.fence(NodeId(100), 111);
    assert!(
        moved >= 2,
        "the one-sided and RPC QPs of node 100 moved to error: {moved}"
    );

    // After: its WRITE and CAS fail and leave memory as it was; its calls fail.
    let (w, cas, call) = run(&old, async move |ctx| {
        (
            ctx.write(node, desc.at(0), &[9u8; 8]).await,
            ctx.cas(node, desc.at(8), 5, 6).await,
            ctx.call(node, ECHO, b"y").await,
        )
    });
    assert!(w.is_err(), "fenced WRITE went through");
    assert!(cas.is_err(), "fenced CAS went through: {cas:?}");
    assert!(call.is_err(), "fenced call was served: {call:?}");
    assert_eq!(
        mr.load_u64(0),
        u64::from_le_bytes([1; 8]),
        "fenced WRITE landed"
    );
    assert_eq!(mr.load_u64(8), 5, "fenced CAS landed");
    drop(old);

    // The same incarnation cannot connect again.
    let again = client(c.name(), 111);
    assert!(
        again.connect_rpc(srv.addr()).is_err(),
        "a fenced incarnation connected"
    );
    drop(again);

    // A new incarnation of node 100 connects and works.
    let new = client(c.name(), 112);
    let node = new.connect_rpc(srv.addr()).unwrap().node;
    let who_new = run(&new, async move |ctx| {
        ctx.write(node, desc.at(0), &[2u8; 8]).await.unwrap();
        assert_eq!(ctx.cas(node, desc.at(8), 5, 7).await.unwrap(), 5);
        ctx.call(node, WHO, b"").await.unwrap()
    });
    assert_eq!(who_new, who(NodeId(100), 112));
    assert_eq!(mr.load_u64(0), u64::from_le_bytes([2; 8]));
    assert_eq!(mr.load_u64(8), 7);
}
