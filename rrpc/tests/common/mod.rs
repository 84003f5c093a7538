//! Helpers shared by the RPC integration tests: nodes on the fabric `$RRPC_FABRIC` names
//! (shm when unset), in a cluster directory removed when the test ends.
#![allow(dead_code)] // each test binary uses a different subset

use rrpc::NodeId;
use std::collections::BTreeMap;

use rrpc::fabric::shm::ClusterGuard;
use rrpc::fabric::{Fabric, FabricConfig, FabricKind, MemoryRegion};
use rrpc::node::{Node, NodeConfig};
use rrpc::server::Handlers;

/// Echo handler id: the reply is the request.
pub const ECHO: u16 = 1;
/// A handler that always fails.
pub const FAIL: u16 = 2;

/// Node `node` of `cluster` on the fabric the environment names.
pub fn fabric(cluster: &str, node: u32) -> Fabric {
    Fabric::open(&FabricConfig::new(
        FabricKind::from_env().unwrap(),
        cluster,
        NodeId(node),
    ))
    .unwrap()
}

/// Handlers ECHO and FAIL.
pub fn echo_handlers() -> Handlers {
    let mut h = Handlers::new();
    h.register(ECHO, |req, out| {
        out.extend_from_slice(req);
        Ok(())
    });
    h.register(FAIL, |_, _| Err("refused on purpose".into()));
    h
}

/// An RPC server node (id 1) with `handlers` on `threads` threads.
pub fn server_with(cluster: &str, handlers: Handlers, threads: usize) -> Node {
    Node::start(
        fabric(cluster, 1),
        NodeConfig::new("echo", "127.0.0.1:0".parse().unwrap()).with_rpc(Some((handlers, threads))),
    )
    .unwrap()
}

/// An RPC server node (id 1) with [`echo_handlers`].
pub fn server(cluster: &str, threads: usize) -> Node {
    server_with(cluster, echo_handlers(), threads)
}

/// A node (id `node`) exporting one MR of `bytes` as "mr", for one-sided operations.
pub fn mem_node(cluster: &str, node: u32, bytes: usize) -> (Node, MemoryRegion) {
    let f = fabric(cluster, node);
    let mr = f.alloc_mr(bytes).unwrap();
    let mut exports = BTreeMap::new();
    exports.insert("mr".into(), serde_json::to_value(mr.desc()).unwrap());
    let n = Node::start(
        f,
        NodeConfig::new("mem", "127.0.0.1:0".parse().unwrap()).with_exports(exports),
    )
    .unwrap();
    (n, mr)
}

/// This test's cluster, removed when the test ends, however it ends.
pub fn setup(suite: &str, name: &str) -> ClusterGuard {
    let c = format!("{suite}-{}-{name}", std::process::id());
    ClusterGuard::new(&c).unwrap().0
}

/// Poll `f` until it holds or `limit` passes; returns whether it held (never asserts a
/// duration: the limit only bounds a hang).
pub fn eventually(limit: std::time::Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if f() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
