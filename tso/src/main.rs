//! The `tso` binary: a timestamp oracle (Scythe 4.5) on an rrpc node.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use rrpc::fabric::{DmPlacement, Fabric, FabricConfig, FabricKind};
use rrpc::node::{Node, NodeConfig};
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
    /// Cluster name (shm files live under <shm root>/rrpc-<cluster>/).
    #[arg(long, value_name = "NAME", default_value = "default")]
    cluster: String,
    /// This node's id, unique in the cluster.
    #[arg(long, value_name = "ID")]
    node: u32,
    /// Bootstrap (control-plane) listen address; port 0 picks a free port.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Fabric backend.
    #[arg(long, value_name = "KIND", default_value = "shm", value_parser = parse_fabric)]
    fabric: FabricKind,
}

fn parse_fabric(s: &str) -> Result<FabricKind, String> {
    s.parse()
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let msg = e.to_string();
            let line = msg.lines().next().unwrap_or("bad arguments");
            eprintln!("tso: {} (see --help)", line.trim_start_matches("error: "));
            return ExitCode::from(1);
        }
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tso: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let (stop_tx, stop_rx) = std::sync::mpsc::channel();
    ctrlc::set_handler(move || {
        let _ = stop_tx.send(());
    })
    .context("installing the SIGINT/SIGTERM handler")?;
    let fabric = Fabric::open(&FabricConfig {
        kind: cli.fabric,
        cluster: cli.cluster.clone(),
        node: cli.node,
    })
    .context("opening the fabric")?;
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
            listen: cli.listen,
            exports,
            rpc: None,
        },
    )
    .context("starting the node")?;
    tracing::info!(
        cluster = %cli.cluster,
        node = cli.node,
        addr = %node.addr(),
        fabric = %fabric.describe(),
        placement = %placement,
        "tso serving"
    );
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "PLACEMENT {placement}").context("writing to stdout")?;
        writeln!(out, "READY {}", node.addr()).context("writing to stdout")?;
        out.flush().context("writing to stdout")?;
    }
    let _ = stop_rx.recv();
    tracing::info!(
        last_timestamp = oracle.current(),
        "signal received; shutting down"
    );
    drop(node);
    drop(oracle);
    Ok(())
}
