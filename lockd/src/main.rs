//! The `lockd` binary: serves a table of Takeout Locks (Scythe 4.3) on an rrpc node, and
//! optionally tables of the one-sided baseline locks (CAS spinlock, DSLR).

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context as _};
use clap::Parser;
use lockd::service::{LockTable, EXPORT_NAME};
use lockd::takeout::Watermarks;
use lockd::words::{WordTable, CAS_EXPORT, DSLR_EXPORT};
use rrpc::node::{Node, NodeConfig};
use rrpc::service::{self, NodeArgs};

/// Lock service serving Scythe's Takeout Locks (fair, heat-aware ticket locks) over rrpc.
///
/// Clients take tickets with the Lock RPC, poll `upper` with one-sided READs and unlock
/// with a one-sided FAA. Prints `READY <bootstrap address>` on stdout once serving and
/// runs until SIGINT or SIGTERM.
#[derive(Parser, Debug)]
#[command(name = "lockd", version)]
struct Cli {
    #[command(flatten)]
    node: NodeArgs,
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
    /// Also export this many CAS spinlocks (8 bytes of registered memory each; 0: none).
    /// Clients lock them with one-sided CAS only, without this process's CPU.
    #[arg(long, value_name = "N", default_value_t = 0)]
    cas_locks: u64,
    /// Also export this many DSLR locks (8 bytes of registered memory each; 0: none).
    /// Clients lock them with one-sided FAA, READ and CAS only.
    #[arg(long, value_name = "N", default_value_t = 0)]
    dslr_locks: u64,
}

fn main() -> ExitCode {
    service::main_with("lockd", run)
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
    let stop = service::stop_signal().context("installing the SIGINT/SIGTERM handler")?;
    let fabric = cli.node.open_fabric().context("opening the fabric")?;
    let table = Arc::new(LockTable::new(&fabric, cli.locks, wm)?);
    let mut exports = BTreeMap::new();
    exports.insert(EXPORT_NAME.to_string(), table.export());
    // The word tables live as long as the node serves; nothing but clients touches them.
    let mut word_tables = Vec::new();
    for (name, n) in [(CAS_EXPORT, cli.cas_locks), (DSLR_EXPORT, cli.dslr_locks)] {
        if n > 0 {
            let t = WordTable::new(&fabric, n).with_context(|| format!("--{name} {n}"))?;
            exports.insert(name.to_string(), t.export());
            word_tables.push(t);
        }
    }
    let node = Node::start(
        fabric.clone(),
        NodeConfig {
            role: "lockd".into(),
            listen: cli.node.listen,
            exports,
            rpc: Some((table.handlers(), cli.threads as usize)),
        },
    )
    .context("starting the node")?;
    tracing::info!(
        cluster = %cli.node.cluster,
        node = cli.node.node,
        addr = %node.addr(),
        fabric = %fabric.describe(),
        locks = cli.locks,
        table_bytes = cli.locks * lockd::takeout::LOCK_STRIDE,
        threads = cli.threads,
        cold_watermark = wm.cold,
        hot_watermark = wm.hot,
        cas_locks = cli.cas_locks,
        dslr_locks = cli.dslr_locks,
        "lockd serving"
    );
    service::announce_ready(node.addr(), &[]).context("writing READY")?;
    let _ = stop.recv();
    tracing::info!("signal received; shutting down");
    drop(node);
    drop(table);
    drop(word_tables);
    Ok(())
}
