//! An rrpc echo server: one node of a local cluster serving handler 100 (echo) and
//! handler 101 (a reply of the requested size, to try the hybrid modes).
//!
//! ```text
//! cargo run --release -p rrpc --example echo_server -- demo 127.0.0.1:7400
//! cargo run --release -p rrpc --example echo_client -- demo 127.0.0.1:7400
//! ```
//!
//! Arguments: cluster name (shm: the directory under /dev/shm), listen address (port 0:
//! any free port; the first line printed names the one bound). The fabric is `$RRPC_FABRIC` (shm by default; `verbs` with `RRPC_RDMA_DEVICE`).

use rrpc::NodeId;

use rrpc::fabric::{shm, Fabric, FabricConfig, FabricKind};
use rrpc::node::{Node, NodeConfig};
use rrpc::server::Handlers;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let cluster = args.next().unwrap_or_else(|| "echo-demo".into());
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:7400".into());
    let kind = FabricKind::from_env()?;
    if kind == FabricKind::Shm {
        // A leftover directory of a crashed run is removed; a live one is an error.
        shm::prepare_cluster(&cluster)?;
    }
    let fabric = Fabric::open(&FabricConfig::new(kind, &cluster, NodeId(1)))?;

    let mut handlers = Handlers::new();
    // Handler 100 (applications use ids from Handlers::FIRST_APP_ID up): echo the request.
    handlers.register(100, |req, out| {
        out.extend_from_slice(req);
        Ok(())
    });
    // Handler 101: a reply of N bytes (request: N as u32 little-endian).
    handlers.register(101, |req, out| {
        let n: [u8; 4] = req.try_into().map_err(|_| "want a 4-byte length")?;
        out.resize(u32::from_le_bytes(n) as usize, 7);
        Ok(())
    });

    let node = Node::start(
        fabric,
        NodeConfig::new("echo", listen.parse()?).rpc(handlers, 1),
    )?;
    println!(
        "echo server: node 1 of cluster {cluster:?} on {}; Ctrl-C stops",
        node.addr()
    );
    let (tx, rx) = std::sync::mpsc::channel();
    ctrlc::set_handler(move || {
        let _ = tx.send(());
    })?;
    let _ = rx.recv();
    drop(node);
    if kind == FabricKind::Shm {
        shm::remove_cluster(&cluster)?;
    }
    Ok(())
}
