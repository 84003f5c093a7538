//! `memnode`: a memory node. Holds tables in registered memory behind a hash index and
//! serves nothing but its control plane: compute nodes read and write records with
//! one-sided operations, so this process's CPU takes no part in transactions.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;

use anyhow::{bail, Context};
use clap::Parser;
use rrpc::fabric::{Fabric, FabricConfig, FabricKind};
use rrpc::node::{Node, NodeConfig};

/// Memory node: tables in registered memory, read and written by compute nodes with one-sided RDMA.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    /// Cluster name (shm files live under /dev/shm/rrpc-<cluster>/ or a hugetlbfs mount).
    #[arg(long, default_value = "default")]
    cluster: String,
    /// This node's id, unique in the cluster.
    #[arg(long)]
    node: u32,
    /// Bootstrap (control-plane) listen address; port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Fabric backend.
    #[arg(long, default_value = "shm")]
    fabric: FabricKind,
    /// Load the SmallBank tables (savings, checking) with this many accounts.
    #[arg(long)]
    smallbank_accounts: Option<u64>,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let (tx, rx) = std::sync::mpsc::channel();
    ctrlc::set_handler(move || {
        let _ = tx.send(());
    })
    .context("installing the signal handler")?;
    let fabric = Fabric::open(&FabricConfig {
        kind: args.fabric,
        cluster: args.cluster.clone(),
        node: args.node,
    })?;
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
            listen: args.listen,
            exports,
            rpc: None,
        },
    )?;
    eprintln!(
        "memnode {} on {}: {} tables",
        args.node,
        node.fabric().describe(),
        tables.len()
    );
    println!("READY {}", node.addr());
    std::io::stdout().flush()?;
    let _ = rx.recv();
    drop(node);
    drop(regions);
    Ok(())
}
