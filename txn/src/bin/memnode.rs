//! `memnode`: a memory node. Holds tables in registered memory behind a hash index and
//! serves nothing but its control plane: compute nodes read and write records with
//! one-sided operations, so this process's CPU takes no part in transactions.

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Parser;
use rrpc::node::{Node, NodeConfig};
use rrpc::service::{self, NodeArgs};

/// Memory node: tables in registered memory, read and written by compute nodes with one-sided RDMA.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    #[command(flatten)]
    node: NodeArgs,
    /// Load the SmallBank tables (savings, checking) with this many accounts.
    #[arg(long)]
    smallbank_accounts: Option<u64>,
}

fn main() -> ExitCode {
    service::main_with("memnode", run)
}

fn run(args: Args) -> anyhow::Result<()> {
    let stop = service::stop_signal().context("installing the SIGINT/SIGTERM handler")?;
    let fabric = args.node.open_fabric().context("opening the fabric")?;
    let mut regions = Vec::new();
    let mut tables = Vec::new();
    if let Some(n) = args.smallbank_accounts {
        if n < 2 {
            bail!("--smallbank-accounts must be at least 2 (got {n})");
        }
        let t0 = std::time::Instant::now();
        for (export, index, records) in txn::smallbank::load(&fabric, n)? {
            tables.push(export);
            regions.push((index, records));
        }
        tracing::info!(
            accounts = n,
            ms = t0.elapsed().as_millis() as u64,
            "loaded SmallBank"
        );
    }
    let mut exports = BTreeMap::new();
    exports.insert("tables".to_string(), serde_json::to_value(&tables)?);
    let node = Node::start(
        fabric,
        NodeConfig {
            role: "memnode".into(),
            listen: args.node.listen,
            exports,
            rpc: None,
        },
    )?;
    tracing::info!(
        cluster = %args.node.cluster,
        node = %args.node.node,
        addr = %node.addr(),
        fabric = %node.fabric().describe(),
        tables = tables.len(),
        "memnode serving"
    );
    service::announce_ready(node.addr(), &[]).context("writing READY")?;
    let _ = stop.recv();
    tracing::info!("signal received; shutting down");
    drop(node);
    drop(regions);
    Ok(())
}
