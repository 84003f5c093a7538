//! The `tso` binary: a timestamp oracle (Scythe 4.5) on an rrpc node.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use rrpc::fabric::DmPlacement;
use rrpc::node::{Node, NodeConfig};
use rrpc::service::{self, NodeArgs};
use tso::epoch;
use tso::oracle::describe_placement;
use tso::{Oracle, EXPORT_NAME};

/// Timestamp oracle: a 64-bit counter in device memory that clients advance with
/// one-sided RDMA fetch-and-add (Scythe's RDMA-friendly TSO).
///
/// With `--state-dir`, every start persists a larger epoch (fsync of file and directory)
/// before serving and puts it in the timestamps' high 16 bits, so a restarted oracle,
/// even after SIGKILL, hands out only timestamps larger than every earlier one. Without
/// it the oracle runs in epoch 0 and a restart goes back to 1 (a warning says so).
///
/// Prints `PLACEMENT <where the counter lives>`, `EPOCH <n>` and then
/// `READY <bootstrap address>` on stdout once serving; runs until SIGINT or SIGTERM.
#[derive(Parser, Debug)]
#[command(name = "tso", version)]
struct Cli {
    #[command(flatten)]
    node: NodeArgs,
    /// Directory of the durable epoch file (`<dir>/epoch`, created if missing). Must be
    /// on durable storage and used by one oracle at a time; losing it loses the
    /// guarantee that restarts never go back.
    #[arg(long, value_name = "DIR", env = "TSO_STATE_DIR")]
    state_dir: Option<PathBuf>,
}

fn main() -> ExitCode {
    service::main_with("tso", run)
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let stop = service::stop_signal().context("installing the SIGINT/SIGTERM handler")?;
    let fabric = cli.node.open_fabric().context("opening the fabric")?;
    let epoch = match &cli.state_dir {
        Some(dir) => epoch::advance(dir)
            .with_context(|| format!("opening a new epoch in {}", dir.display()))?,
        None => {
            tracing::warn!(
                "no --state-dir: epoch 0, timestamps go back to 1 if this oracle restarts"
            );
            0
        }
    };
    let oracle = Oracle::with_epoch(&fabric, epoch)?;
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
        node = %cli.node.node,
        addr = %node.addr(),
        fabric = %fabric.describe(),
        placement = %placement,
        epoch,
        "tso serving"
    );
    service::announce_ready(
        node.addr(),
        &[format!("PLACEMENT {placement}"), format!("EPOCH {epoch}")],
    )
    .context("writing to stdout")?;
    let _ = stop.recv();
    tracing::info!(
        last_timestamp = %oracle.current(),
        "signal received; shutting down"
    );
    drop(node);
    drop(oracle);
    Ok(())
}
