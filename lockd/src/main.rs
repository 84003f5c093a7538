//! The `lockd` binary: serves a table of Takeout Locks (Scythe 4.3) and a Lotus lock
//! table for its shards (Lotus 4.1, 4.2) on an rrpc node, and optionally tables of the
//! one-sided baseline locks (CAS spinlock, DSLR). Settings come from `--config FILE.toml`
//! (kebab-case keys, every one optional) and flags, flags winning.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context as _};
use clap::Parser;
use lockd::lock_table::{self, SLOTS_PER_BUCKET, SLOT_BYTES};
use lockd::service::{LockOrder, LockTable, EXPORT_NAME};
use lockd::shard::{parse_shards, Ownership, ShardMap};
use lockd::table_service::{TableService, TABLE_EXPORT};
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
    /// TOML file of settings (kebab-case keys as the flags below; flags win).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Number of Takeout Locks in the table (32 bytes of registered memory each; >= 1;
    /// default 1048576).
    #[arg(long, value_name = "N")]
    locks: Option<u64>,
    /// RPC server threads (1 to 1024; default 1).
    #[arg(long, value_name = "T")]
    threads: Option<u64>,
    /// ColdWatermark: cold-mode Lock RPCs are refused above this many queued tickets
    /// (default 3).
    #[arg(long, value_name = "TICKETS")]
    cold_watermark: Option<u64>,
    /// HotWatermark: all Lock RPCs are refused above this many queued tickets (>= cold;
    /// default 10).
    #[arg(long, value_name = "TICKETS")]
    hot_watermark: Option<u64>,
    /// Also export this many CAS spinlocks (8 bytes of registered memory each; default 0:
    /// none). Clients lock them with one-sided CAS only, without this process's CPU.
    #[arg(long, value_name = "N")]
    cas_locks: Option<u64>,
    /// Also export this many DSLR locks (8 bytes of registered memory each; default 0:
    /// none). Clients lock them with one-sided FAA, READ and CAS only.
    #[arg(long, value_name = "N")]
    dslr_locks: Option<u64>,
    /// Slots of the Lotus lock table (8 bytes each, rounded up to whole 8-slot buckets of
    /// a power of two; >= 8; default 1048576 = 8 MiB).
    #[arg(long, value_name = "N")]
    lock_table_slots: Option<u64>,
    /// The lock-table shards this node serves: comma-separated shards or inclusive ranges
    /// of 0..4095 (default "0-4095": all).
    #[arg(long, value_name = "LIST")]
    shards: Option<String>,
    /// Version of the shard map the node starts with (>= 1; default 1).
    #[arg(long, value_name = "V")]
    map_version: Option<u64>,
    /// Order of serving Lock RPCs that arrive together: "timestamp" (sorted by lock id
    /// and timestamp, Scythe 4.4 Fig. 16; default) or "arrival".
    #[arg(long, value_name = "ORDER")]
    lock_order: Option<LockOrder>,
}

/// Settings of `lockd`, from `--config` (each field's default in its doc), overridden by
/// flags.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
struct Config {
    /// Takeout Locks (default 1048576; >= 1).
    locks: u64,
    /// RPC server threads (default 1; 1 to 1024).
    threads: u64,
    /// ColdWatermark, queued tickets (default 3; <= hot-watermark).
    cold_watermark: u64,
    /// HotWatermark, queued tickets (default 10).
    hot_watermark: u64,
    /// CAS spinlocks exported (default 0).
    cas_locks: u64,
    /// DSLR locks exported (default 0).
    dslr_locks: u64,
    /// Lotus lock-table slots (default 1048576; >= 8).
    lock_table_slots: u64,
    /// Shards served (default "0-4095").
    shards: String,
    /// Initial shard-map version (default 1; >= 1).
    map_version: u64,
    /// Lock RPC order, "timestamp" or "arrival" (default "timestamp").
    lock_order: LockOrder,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            locks: 1 << 20,
            threads: 1,
            cold_watermark: 3,
            hot_watermark: 10,
            cas_locks: 0,
            dslr_locks: 0,
            lock_table_slots: 1 << 20,
            shards: "0-4095".into(),
            map_version: 1,
            lock_order: LockOrder::Timestamp,
        }
    }
}

impl Config {
    /// The file's settings, then the flags given.
    fn load(cli: &Cli) -> anyhow::Result<Self> {
        let mut c = match &cli.config {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .with_context(|| format!("reading {}", p.display()))?;
                toml::from_str(&text).with_context(|| format!("parsing {}", p.display()))?
            }
            None => Self::default(),
        };
        macro_rules! flag {
            ($($f:ident),*) => { $( if let Some(v) = &cli.$f { c.$f = v.clone(); } )* };
        }
        flag!(
            locks,
            threads,
            cold_watermark,
            hot_watermark,
            cas_locks,
            dslr_locks
        );
        flag!(lock_table_slots, shards, map_version, lock_order);
        c.validate()?;
        Ok(c)
    }

    fn validate(&self) -> anyhow::Result<()> {
        if self.locks == 0 {
            bail!("locks: at least one lock is needed");
        }
        if !(1..=1024).contains(&self.threads) {
            bail!("threads: {} is not in 1..=1024", self.threads);
        }
        self.watermarks()
            .validate()
            .map_err(|e| anyhow::anyhow!("cold-watermark/hot-watermark: {e}"))?;
        if self.lock_table_slots < SLOTS_PER_BUCKET as u64 {
            bail!("lock-table-slots: at least {SLOTS_PER_BUCKET}");
        }
        if self.map_version == 0 {
            bail!("map-version: at least 1");
        }
        parse_shards(&self.shards).context("shards")?;
        Ok(())
    }

    fn watermarks(&self) -> Watermarks {
        Watermarks {
            cold: self.cold_watermark,
            hot: self.hot_watermark,
        }
    }
}

fn main() -> ExitCode {
    service::main_with("lockd", run)
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let cfg = Config::load(&cli)?;
    let wm = cfg.watermarks();
    // Install the signal handler first so a signal during start-up is not lost.
    let stop = service::stop_signal().context("installing the SIGINT/SIGTERM handler")?;
    let fabric = cli.node.open_fabric().context("opening the fabric")?;
    let table = Arc::new(LockTable::new(&fabric, cfg.locks, wm)?);
    let slots_bytes = usize::try_from(cfg.lock_table_slots)
        .ok()
        .and_then(|n| n.checked_mul(SLOT_BYTES))
        .context("lock-table-slots overflow the address space")?;
    let map = ShardMap::partial(cli.node.node, &parse_shards(&cfg.shards)?, cfg.map_version)?;
    let lotus = Arc::new(TableService::new(
        Arc::new(lock_table::LockTable::with_bytes(slots_bytes)),
        Ownership::new(cli.node.node, map),
    ));
    let mut exports = BTreeMap::new();
    exports.insert(EXPORT_NAME.to_string(), table.export());
    exports.insert(TABLE_EXPORT.to_string(), lotus.export());
    // The word tables live as long as the node serves; nothing but clients touches them.
    let mut word_tables = Vec::new();
    for (name, n) in [(CAS_EXPORT, cfg.cas_locks), (DSLR_EXPORT, cfg.dslr_locks)] {
        if n > 0 {
            let t = WordTable::new(&fabric, n).with_context(|| format!("--{name} {n}"))?;
            exports.insert(name.to_string(), t.export());
            word_tables.push(t);
        }
    }
    let mut handlers = rrpc::server::Handlers::new();
    table.register(&mut handlers, cfg.lock_order);
    lotus.register(&mut handlers);
    let node = Node::start(
        fabric.clone(),
        NodeConfig {
            role: "lockd".into(),
            listen: cli.node.listen,
            exports,
            rpc: Some((handlers, cfg.threads as usize)),
        },
    )
    .context("starting the node")?;
    tracing::info!(
        cluster = %cli.node.cluster,
        node = cli.node.node,
        addr = %node.addr(),
        fabric = %fabric.describe(),
        locks = cfg.locks,
        table_bytes = cfg.locks * lockd::takeout::LOCK_STRIDE,
        threads = cfg.threads,
        cold_watermark = wm.cold,
        hot_watermark = wm.hot,
        cas_locks = cfg.cas_locks,
        dslr_locks = cfg.dslr_locks,
        lock_table_buckets = lotus.table().n_buckets(),
        shards = %cfg.shards,
        map_version = cfg.map_version,
        lock_order = ?cfg.lock_order,
        "lockd serving"
    );
    service::announce_ready(node.addr(), &[]).context("writing READY")?;
    let _ = stop.recv();
    tracing::info!("signal received; shutting down");
    drop(node);
    drop(table);
    drop(lotus);
    drop(word_tables);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_file_then_flags_then_validation() {
        let dir = std::env::temp_dir().join(format!("lockd-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("lockd.toml");
        std::fs::write(
            &p,
            "lock-table-slots = 4096\nshards = \"0-99\"\nthreads = 2\nlock-order = \"arrival\"\n",
        )
        .unwrap();
        let cli = Cli::parse_from([
            "lockd",
            "--node",
            "3",
            "--config",
            p.to_str().unwrap(),
            "--threads",
            "4",
        ]);
        let c = Config::load(&cli).unwrap();
        assert_eq!(
            (c.lock_table_slots, c.shards.as_str(), c.threads),
            (4096, "0-99", 4)
        );
        assert_eq!(c.locks, 1 << 20, "default kept");
        assert_eq!(c.lock_order, LockOrder::Arrival);
        std::fs::write(&p, "no-such-key = 1\n").unwrap();
        assert!(Config::load(&cli).is_err(), "unknown keys are errors");
        let bad = Cli::parse_from(["lockd", "--node", "3", "--shards", "0-5000"]);
        assert!(Config::load(&bad).is_err());
        let bad = Cli::parse_from(["lockd", "--node", "3", "--cold-watermark", "11"]);
        assert!(Config::load(&bad).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
