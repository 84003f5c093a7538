//! The `tso` binary: a timestamp oracle (Scythe 4.5) on an rrpc node.

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use rrpc::fabric::DmPlacement;
use rrpc::node::{Node, NodeConfig};
use rrpc::service::{self, NodeArgs};
use tso::oracle::describe_placement;
use tso::{Oracle, EXPORT_NAME};

/// Timestamp oracle: a 64-bit counter in device memory that clients advance with
/// one-sided RDMA fetch-and-add (Scythe's RDMA-friendly TSO).
///
/// Prints `PLACEMENT <where the counter lives>` and then `READY <bootstrap address>` on
/// stdout once serving; runs until SIGINT or SIGTERM. Timestamps restart at 1 when the
/// oracle restarts (no durable high-water mark yet).
#[derive(Parser, Debug)]
#[command(name = "tso", version)]
struct Cli {
    #[command(flatten)]
    node: NodeArgs,
}

fn main() -> ExitCode {
    service::main_with("tso", run)
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let stop = service::stop_signal().context("installing the SIGINT/SIGTERM handler")?;
    let fabric = cli.node.open_fabric().context("opening the fabric")?;
    let oracle = Oracle::new(&fabric)?;
    let placement = describe_placement(oracle.placement());
    if let DmPlacement::HostFallback { reason } = oracle.placement() {
        tracing::warn!(%reason, "no device memory: the TSO counter lives in host memory");
    }
    let mut exports = BTreeMap::new();
    exports.insert(EXPORT_NAME.to_string(), oracle.export());
    let node = Node::start(
        fabric.clone(),
        NodeConfig {
            role: "tso".into(),
            listen: cli.node.listen,
            exports,
            rpc: None,
        },
    )
    .context("starting the node")?;
    tracing::info!(
        cluster = %cli.node.cluster,
        node = cli.node.node,
        addr = %node.addr(),
        fabric = %fabric.describe(),
        placement = %placement,
        "tso serving"
    );
    service::announce_ready(node.addr(), &[format!("PLACEMENT {placement}")])
        .context("writing to stdout")?;
    let _ = stop.recv();
    tracing::info!(
        last_timestamp = oracle.current(),
        "signal received; shutting down"
    );
    drop(node);
    drop(oracle);
    Ok(())
}
