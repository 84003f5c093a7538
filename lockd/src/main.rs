//! The `lockd` binary: serves a table of Takeout Locks (Scythe 4.3) on an rrpc node.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context as _};
use clap::Parser;
use lockd::service::{LockTable, EXPORT_NAME};
use lockd::takeout::Watermarks;
use rrpc::fabric::{Fabric, FabricConfig, FabricKind};
use rrpc::node::{Node, NodeConfig};

/// Lock service serving Scythe's Takeout Locks (fair, heat-aware ticket locks) over rrpc.
///
/// Clients take tickets with the Lock RPC, poll `upper` with one-sided READs and unlock
/// with a one-sided FAA. Prints `READY <bootstrap address>` on stdout once serving and
/// runs until SIGINT or SIGTERM.
#[derive(Parser, Debug)]
#[command(name = "lockd", version)]
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
    /// Number of locks in the table (32 bytes of registered memory each; >= 1).
    #[arg(long, value_name = "N", default_value_t = 1_048_576, value_parser = clap::value_parser!(u64).range(1..))]
    locks: u64,
    /// RPC server threads.
    #[arg(long, value_name = "T", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1024))]
    threads: u64,
    /// ColdWatermark: cold-mode Lock RPCs are refused above this many queued tickets.
    #[arg(long, value_name = "TICKETS", default_value_t = 3)]
    cold_watermark: u64,
    /// HotWatermark: all Lock RPCs are refused above this many queued tickets (>= cold).
    #[arg(long, value_name = "TICKETS", default_value_t = 10)]
    hot_watermark: u64,
}

fn parse_fabric(s: &str) -> Result<FabricKind, String> {
    s.parse()
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) if !e.use_stderr() => {
            // --help / --version
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let msg = e.to_string();
            let line = msg.lines().next().unwrap_or("bad arguments");
            eprintln!("lockd: {} (see --help)", line.trim_start_matches("error: "));
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
            eprintln!("lockd: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let wm = Watermarks {
        cold: cli.cold_watermark,
        hot: cli.hot_watermark,
    };
    if let Err(e) = wm.validate() {
        bail!("--cold-watermark/--hot-watermark: {e}");
    }
    // Install the signal handler first so a signal during start-up is not lost.
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
    let table = Arc::new(LockTable::new(&fabric, cli.locks, wm)?);
    let mut exports = BTreeMap::new();
    exports.insert(EXPORT_NAME.to_string(), table.export());
    let node = Node::start(
        fabric.clone(),
        NodeConfig {
            role: "lockd".into(),
            listen: cli.listen,
            exports,
            rpc: Some((table.handlers(), cli.threads as usize)),
        },
    )
    .context("starting the node")?;
    tracing::info!(
        cluster = %cli.cluster,
        node = cli.node,
        addr = %node.addr(),
        fabric = %fabric.describe(),
        locks = cli.locks,
        table_bytes = cli.locks * lockd::takeout::LOCK_STRIDE,
        threads = cli.threads,
        cold_watermark = wm.cold,
        hot_watermark = wm.hot,
        "lockd serving"
    );
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "READY {}", node.addr()).context("writing READY")?;
        out.flush().context("writing READY")?;
    }
    let _ = stop_rx.recv();
    tracing::info!("signal received; shutting down");
    drop(node);
    drop(table);
    Ok(())
}
