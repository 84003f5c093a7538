//! Helpers shared by lockd's integration tests.
#![allow(dead_code)] // each test binary uses a different subset

use std::collections::BTreeMap;

use rrpc::fabric::Fabric;
use rrpc::node::{Node, NodeConfig};
use rrpc::server::Handlers;

/// A lock-service node (role "lockd") on `fabric`, exporting `exports`, serving
/// `handlers` on `threads` server threads, its control plane on a loopback port.
pub fn lockd_node(
    fabric: Fabric,
    exports: BTreeMap<String, serde_json::Value>,
    handlers: Handlers,
    threads: usize,
) -> Node {
    Node::start(
        fabric,
        NodeConfig {
            role: "lockd".into(),
            listen: "127.0.0.1:0".parse().unwrap(),
            exports,
            rpc: Some((handlers, threads)),
        },
    )
    .unwrap()
}
