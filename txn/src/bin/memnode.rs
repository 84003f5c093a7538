//! `memnode`: a memory node. Holds its partition of the CVT tables in registered memory
//! behind a hash index and serves nothing but its control plane: compute nodes read and
//! write records with one-sided operations, so this process's CPU takes no part in
//! transactions.

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Parser;
use rrpc::node::{Node, NodeConfig};
use rrpc::service::{self, NodeArgs};
use rrpc::settings_file::{self, SettingsFile};

/// Memory node: tables in registered memory, read and written by compute nodes with one-sided RDMA.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None, args_override_self = true)]
struct Args {
    #[command(flatten)]
    node: NodeArgs,
    /// TOML file of settings: keys as the long flags below (`tpcc-warehouses = 4`), a
    /// `[fabric]` table (cluster, kind, listen, model, rdma-device, gid-index, rdma-port,
    /// tclass, sl) and `[runtime]`/`[server]` tables (as a topology file's). Flags win over
    /// the file, the file over --hosts.
    #[arg(long, value_name = "FILE")]
    config: Option<std::path::PathBuf>,
    /// Load the SmallBank tables (savings, checking) with this many accounts (this
    /// node's partition of them).
    #[arg(long)]
    smallbank_accounts: Option<u64>,
    /// Load the TATP tables (subscriber, access_info, special_facility,
    /// call_forwarding) for this many subscribers (this node's partition of them).
    #[arg(long)]
    tatp_subscribers: Option<u64>,
    /// Load the TPC-C tables for this many warehouses (this node's partition of them;
    /// ITEM on every node).
    #[arg(long)]
    tpcc_warehouses: Option<u16>,
    /// Seed of the TATP and TPC-C populations (every memory node of a cluster must use
    /// the same).
    #[arg(long, default_value_t = 1)]
    tatp_seed: u64,
    /// Load the KVS / YCSB table (table 0, "kvs", keys 0..N, this node's partition of
    /// them), each value carrying a checksum of its key and update counter.
    #[arg(long, value_name = "N")]
    kvs_records: Option<u64>,
    /// Bytes of a KVS value (at least 16: the counter and the checksum).
    #[arg(long, default_value_t = txn::kvs::DEFAULT_VALUE_BYTES, value_name = "BYTES")]
    kvs_value_bytes: usize,
    /// Version cells per CVT (Motor's VNum: how many versions each record keeps).
    #[arg(long, default_value_t = txn::smallbank::DEFAULT_VERSIONS)]
    versions: usize,
    /// This node's partition of the tables, 0 to --partitions - 1.
    #[arg(long, default_value_t = 0)]
    partition: u32,
    /// Memory nodes the tables are partitioned over (by key).
    #[arg(long, default_value_t = 1)]
    partitions: u32,
    /// Copies of every partition (Motor 5.3's 1 primary and f backups, f = R - 1): this
    /// node holds the primary image of its partition and a backup image of each of
    /// the R - 1 partitions before it (mod --partitions), each in regions of its own
    /// with the same geometry and data. At most --partitions.
    #[arg(long, default_value_t = 1, value_name = "R")]
    replicas: u32,
    /// Commit-log region: compute-node rows (node n uses row n mod this). Compute nodes
    /// write a log here before each commit's installs, which recovery reads when one
    /// dies (0 keeps no log region).
    #[arg(long, default_value_t = txn::commit_log::LogGeometry::default().nodes)]
    log_nodes: u32,
    /// Commit-log region: slots (coordinators) per compute-node row.
    #[arg(long, default_value_t = txn::commit_log::LogGeometry::default().clients)]
    log_clients: u32,
    /// Commit-log region: bytes per slot (bounds the objects one commit may install:
    /// (bytes - 32) / 24).
    #[arg(long, default_value_t = txn::commit_log::LogGeometry::default().slot_bytes, value_name = "BYTES")]
    log_slot_bytes: u32,
    /// Undo-log region (with --replicas above 1): bytes per slot, where occ-cas over
    /// replicas (FORD's commit) writes the old records of each commit to every memory
    /// node before installing (rows and slots as the commit-log region's). An undo log
    /// larger than a slot wraps within it.
    #[arg(long, default_value_t = 32 * 1024, value_name = "BYTES")]
    undo_slot_bytes: u32,
    /// Join the cluster's membership in etcd at this endpoint (e.g.
    /// http://127.0.0.1:2379): the node registers under a lease, and when a compute
    /// node's incarnation goes down (lease expired or revoked) it fences that
    /// incarnation (its queue pairs to the error state, so its late one-sided WRITEs and
    /// CASes fail) and acknowledges, before recovery touches its data. Needs a build
    /// with the etcd feature (`--features member/etcd`).
    #[arg(long, value_name = "URL")]
    etcd: Option<String>,
    /// Hold no rows: every image gets the geometry the workload flags give it, then its
    /// regions are zeroed. For a memory node restarted after a failure, which the view
    /// manager fills by re-replication (copying each partition from its primary) before
    /// any compute node reads it; until then no view names it as a copy.
    #[arg(long)]
    empty: bool,
    /// Start as a spare memory node, number I among the memory nodes (I at least
    /// --partitions; --partition is then ignored): it holds no partition of its own,
    /// an empty image of every partition (each with the geometry the workload flags
    /// give it), and waits. When a memory node dies, the view manager fills the spare
    /// with copies of that node's partitions (re-replication from their primaries) and
    /// makes it their backup. Needs --replicas 2 or more.
    #[arg(long, value_name = "I")]
    spare_index: Option<u32>,
    /// Host an rTX region of this many bytes (repairable transactions: logs, TXObjs and
    /// data blocks, every object formatted with a zeroed value), exported as "rtx"
    /// (0: none).
    #[arg(long, default_value_t = 0, value_name = "BYTES")]
    rtx_pool: u64,
    /// rTX IDs (client coroutines) the rTX region has logs for.
    #[arg(long, default_value_t = 256, value_name = "N")]
    rtx_ids: u16,
    /// Bytes of an rTX object's value (a data block; 1 KB is a B-link tree node).
    #[arg(long, default_value_t = 1024, value_name = "BYTES")]
    rtx_block_bytes: u64,
    /// Host the cluster's range index (the B-link tree transactions scan: rTX 5): the rTX
    /// region becomes a tree bulk-loaded with the keys of every partition of the
    /// workload's indexed tables (KVS: keys 0..--kvs-records; TPC-C: NEW_ORDER and
    /// ORDER_LINE of every warehouse), exported as "range-index". The region is sized for the tree and --rtx-ids unless --rtx-pool
    /// says otherwise; --rtx-ids must exceed the coordinator coroutines of the cluster.
    #[arg(long)]
    range_index: bool,
    /// Serve this node's partition's Takeout Locks (Scythe 4.3: each object's lock at
    /// the memory node that holds it) behind the memory node's own address, for Scythe
    /// run with its locks placed with the data instead of on a lockd node. The locks of
    /// partition p live at the memory node started with `--partition p`; they would not
    /// follow a failover to a backup, so this needs --replicas 1. The lock service
    /// runs `--lock-threads` RPC server threads; an idle one spins briefly, then yields
    /// its core.
    #[arg(long)]
    lock_service: bool,
    /// With --lock-service: Takeout Locks in the table (32 bytes of registered memory
    /// each; at least 1).
    #[arg(long, default_value_t = 1 << 20, value_name = "N")]
    locks: u64,
    /// With --lock-service: RPC server threads of the lock service (1 to 1024).
    #[arg(long, default_value_t = 1, value_name = "T")]
    lock_threads: u64,
    /// With --lock-service: ColdWatermark, queued tickets above which cold-mode Lock
    /// RPCs are refused (Scythe 4.3).
    #[arg(long, default_value_t = 3, value_name = "TICKETS")]
    cold_watermark: u64,
    /// With --lock-service: HotWatermark, queued tickets above which every Lock RPC is
    /// refused (at least --cold-watermark; Scythe 4.3).
    #[arg(long, default_value_t = 10, value_name = "TICKETS")]
    hot_watermark: u64,
    /// With --lock-service: bootstrap address of the timestamp oracle; Lock RPC
    /// timestamps above what it has issued are refused (default none: only timestamps
    /// of 2^62 and above are).
    #[arg(long, value_name = "ADDR", value_parser = service::parse_addr)]
    lock_tso: Option<std::net::SocketAddr>,
    /// With --lock-service: directory where the lock service persists its epoch before
    /// serving (locked while it runs). A memory node restarted with the same directory
    /// serves a new epoch, so that clients of its earlier life are refused and
    /// reconnect, and refuses Lock RPCs for a second, so that every ticket its earlier
    /// life granted has expired first (default none: the epoch is the clock's
    /// microseconds at start, and a restart is not known as one).
    #[arg(long, value_name = "DIR")]
    lock_state_dir: Option<std::path::PathBuf>,
}

/// The memory node's rrpc node: its control plane alone, or with its partition's lock
/// service (`--lock-service`).
enum Served {
    Plain(Node),
    Locks(lockd::embed::LockService),
}

impl Served {
    fn node(&self) -> &Node {
        match self {
            Self::Plain(n) => n,
            Self::Locks(s) => s.node(),
        }
    }
}

/// The lock service's settings from `--lock-service` and the flags beside it; `None`
/// without it.
fn lock_service_config(args: &Args) -> anyhow::Result<Option<lockd::embed::LockServiceConfig>> {
    if !args.lock_service {
        return Ok(None);
    }
    if args.spare_index.is_some() {
        bail!("--lock-service with --spare-index: a spare holds no partition's locks");
    }
    if args.replicas > 1 {
        bail!(
            "--lock-service with --replicas above 1: the partition's locks would stay here \
             and not follow its primary to a backup at a failover; keep the locks on a \
             lockd node"
        );
    }
    let cfg = lockd::embed::LockServiceConfig::default()
        .with_locks(args.locks)
        .with_threads(args.lock_threads)
        .with_cold_watermark(args.cold_watermark)
        .with_hot_watermark(args.hot_watermark)
        .with_tso(args.lock_tso)
        .with_state_dir(args.lock_state_dir.clone())
        // Scythe's Takeout Locks only: the smallest Lotus table, not served.
        .with_lock_table_slots(8)
        .with_lotus_serving(false);
    cfg.validate()
        .map_err(|e| anyhow::anyhow!("--lock-service: {e}"))?;
    Ok(Some(cfg))
}

fn main() -> ExitCode {
    service::main_with("memnode", run)
}

/// `args` with `--config`'s settings applied (parsed `argv`, program name first, again
/// with the file's flags before the command line's own, so that the command line wins),
/// and the rrpc settings (`--hosts`' and the file's `[runtime]`/`[server]`).
///
/// Errors: the file's (naming the file, the table and the key), a value a flag refuses.
fn with_settings_file(
    args: Args,
    argv: Vec<std::ffi::OsString>,
) -> anyhow::Result<(Args, rrpc::node::RpcSettings)> {
    use clap::CommandFactory as _;
    let Some(path) = &args.config else {
        let rpc = args.node.rpc_settings()?;
        return Ok((args, rpc));
    };
    let file = SettingsFile::load(path)?;
    // Flags given on the command line or through their environment variables win
    // over the file: they are left out of its flags.
    let given = Args::command().try_get_matches_from(&argv).ok();
    let flags = file.as_flags(&Args::command(), given.as_ref())?;
    let mut full = argv;
    let at = full.len().min(1);
    full.splice(at..at, flags);
    let args: Args = service::resolve_args("memnode", full, &rrpc::topology::machine_hostname)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let rpc = file.rpc_settings(&args.node)?;
    Ok((args, rpc))
}

fn run(args: Args) -> anyhow::Result<()> {
    // A bad settings file is a usage error: exit 2 before anything runs.
    let (args, rpc) = settings_file::or_exit(
        "memnode",
        with_settings_file(args, std::env::args_os().collect()),
    );
    let stop = service::stop_signal().context("installing the SIGINT/SIGTERM handler")?;
    if args.partitions == 0 || args.partition >= args.partitions {
        bail!(
            "--partition {} of --partitions {}: need 0 <= partition < partitions",
            args.partition,
            args.partitions
        );
    }
    if let Some(i) = args.spare_index {
        if i < args.partitions {
            bail!(
                "--spare-index {i} with --partitions {}: a spare's index comes after the \
                 partitions' memory nodes (at least {})",
                args.partitions,
                args.partitions
            );
        }
        if args.replicas < 2 {
            bail!(
                "--spare-index needs --replicas 2 or more: a spare is filled from the live \
                 copies of a dead memory node's partitions"
            );
        }
    }
    if args.replicas == 0 || args.replicas > args.partitions {
        bail!(
            "--replicas {} with --partitions {}: need 1 <= replicas <= partitions (each \
             copy of a partition on another memory node)",
            args.replicas,
            args.partitions
        );
    }
    if !(1..=64).contains(&args.versions) {
        bail!("--versions must be 1 to 64 (got {})", args.versions);
    }
    let workloads = [
        args.smallbank_accounts.is_some(),
        args.kvs_records.is_some(),
        args.tatp_subscribers.is_some(),
        args.tpcc_warehouses.is_some(),
    ];
    if workloads.iter().filter(|&&w| w).count() > 1 {
        bail!(
            "--smallbank-accounts, --kvs-records, --tatp-subscribers and --tpcc-warehouses \
             exclude each other (one workload per memnode)"
        );
    }
    if args.kvs_value_bytes < txn::kvs::MIN_VALUE_BYTES {
        bail!(
            "--kvs-value-bytes must be at least {} (got {})",
            txn::kvs::MIN_VALUE_BYTES,
            args.kvs_value_bytes
        );
    }
    let locks = lock_service_config(&args)?;
    let fabric = args.node.open_fabric().context("opening the fabric")?;
    // The one workload given (they exclude each other, checked above), loaded as
    // partition `q`: this node's own partition, then each partition it backs up.
    let (v, ps) = (args.versions, args.partitions);
    let load = |q: u32| -> anyhow::Result<(String, Vec<_>)> {
        // Gigabytes of rows take minutes: the launcher waits as long as images keep coming.
        rrpc::service::announce_progress(&format!("loading partition {q}"))
            .context("writing PROGRESS")?;
        Ok(if let Some(n) = args.smallbank_accounts {
            if n < 2 {
                bail!("--smallbank-accounts must be at least 2 (got {n})");
            }
            (
                format!("SmallBank, {n} accounts"),
                txn::smallbank::load(&fabric, n, v, q, ps)?,
            )
        } else if let Some(n) = args.tatp_subscribers {
            if n < 1 {
                bail!("--tatp-subscribers must be at least 1");
            }
            let t = txn::tatp::load(&fabric, n, args.tatp_seed, v, q, ps)?;
            (format!("TATP, {n} subscribers"), t)
        } else if let Some(n) = args.tpcc_warehouses {
            if n < 1 {
                bail!("--tpcc-warehouses must be at least 1");
            }
            let t = txn::tpcc::load(&fabric, n, args.tatp_seed, v, q, ps)?;
            (format!("TPC-C, {n} warehouses"), t)
        } else if let Some(n) = args.kvs_records {
            if n == 0 {
                bail!("--kvs-records must be at least 1");
            }
            let t = txn::kvs::load(&fabric, n, args.kvs_value_bytes, v, q, ps)?;
            let what = format!("KVS, {n} records of {} bytes", args.kvs_value_bytes);
            (what, vec![t])
        } else {
            (String::from("no tables"), Vec::new())
        })
    };
    let t0 = std::time::Instant::now();
    let spare = args.spare_index.is_some();
    // A spare holds no primary: an image of every partition instead, all empty.
    let (what, mut tables, mut regions, images) = if spare {
        (String::new(), Vec::new(), Vec::new(), (0..ps).collect())
    } else {
        let (what, loaded) = load(args.partition)?;
        let (tables, regions): (Vec<_>, Vec<_>) = loaded.into_iter().unzip();
        let images = txn::cvt_remote::backup_partitions(args.partition, args.replicas, ps);
        (what, tables, regions, images)
    };
    let mut what = what;
    let mut backups = Vec::new();
    for q in images {
        let (w, loaded) = load(q)?;
        if what.is_empty() {
            what = format!("spare: empty images of {ps} partitions of {w}");
        }
        let (bt, br): (Vec<_>, Vec<_>) = loaded.into_iter().unzip();
        regions.extend(br);
        backups.push(txn::cvt_remote::BackupImage {
            partition: q,
            tables: bt,
        });
    }
    if args.empty || spare {
        for r in regions.iter().flatten() {
            r.zero(0, r.len());
        }
        let mut t: Vec<&mut txn::cvt_store::CvtTableExport> = tables.iter_mut().collect();
        t.extend(backups.iter_mut().flat_map(|b| b.tables.iter_mut()));
        for t in t {
            t.records_loaded = 0;
        }
    }
    // Shared with the lock service's lock-and-read RPC, which copies objects out of the
    // primary image (Scythe 4.3: the lock with its data).
    let regions = std::sync::Arc::new(regions);
    let reader: Option<lockd::service::GrantReader> = locks.as_ref().map(|_| {
        let r = txn::lock_read::LocalReader::new(&tables, regions.clone());
        std::sync::Arc::new(
            move |d: &[u8; lockd::wire::READ_DESC_BYTES], out: &mut Vec<u8>| r.read(d, out),
        ) as lockd::service::GrantReader
    });
    let geometry = txn::commit_log::LogGeometry {
        nodes: args.log_nodes,
        clients: args.log_clients,
        slot_bytes: args.log_slot_bytes,
    };
    let log_region = if args.log_nodes == 0 {
        None
    } else {
        geometry.validate().map_err(anyhow::Error::msg)?;
        let mr = fabric
            .alloc_mr(geometry.region_bytes() as usize)
            .context("allocating the commit-log region")?;
        Some(mr)
    };
    let undo_geometry = txn::commit_log::LogGeometry {
        slot_bytes: args.undo_slot_bytes,
        ..geometry
    };
    let undo_region = if args.replicas > 1 && args.log_nodes > 0 {
        undo_geometry.validate().map_err(anyhow::Error::msg)?;
        let mr = fabric
            .alloc_mr(undo_geometry.region_bytes() as usize)
            .context("allocating the undo-log region")?;
        Some(mr)
    } else {
        None
    };
    let rtx_region = if args.range_index {
        let rows: Vec<(u32, u64)> = match (args.kvs_records, args.tpcc_warehouses) {
            (Some(n), _) => (0..n).map(|k| (txn::kvs::TABLE, k)).collect(),
            (_, Some(w)) => txn::tpcc::range_index_keys(args.tatp_seed, w),
            _ => bail!(
                "--range-index indexes the KVS table (--kvs-records) or TPC-C's NEW_ORDER and \
                 ORDER_LINE (--tpcc-warehouses)"
            ),
        };
        let entries: Vec<(u64, u64)> = rows
            .into_iter()
            .map(|(t, k)| {
                Ok((
                    txn::range_index::index_key(t, k)?,
                    txn::range_index::LOADED_TAG,
                ))
            })
            .collect::<Result<_, txn::coordinator::TxnError>>()?;
        let bytes = if args.rtx_pool > 0 {
            args.rtx_pool
        } else {
            txn::range_index::pool_bytes(entries.len() as u64, args.rtx_ids)
        };
        let layout = rtx::host::layout_for_pool(bytes, args.rtx_ids, args.rtx_block_bytes)
            .context("--range-index: the rTX region")?;
        let tree = rtx::blink::bulk::build(&layout, &entries, txn::range_index::BULK_FILL)
            .context("--range-index: --rtx-pool too small for the tree")?;
        let bb = layout.block_bytes as usize;
        let (mr, export) = rtx::host::host_with(&fabric, layout, |i| tree.value(i, bb))
            .context("hosting the range index")?;
        // The node counter: the first object past the tree, a zero block (next free
        // object: the one after it).
        let ix = txn::range_index::RangeIndexExport {
            counter: tree.first_free(),
            loaded: entries.len() as u64,
        };
        tracing::info!(
            keys = entries.len(),
            levels = tree.root_level + 1,
            objects = layout.objects,
            "range index"
        );
        Some((mr, export, Some(ix)))
    } else if args.rtx_pool > 0 {
        let layout = rtx::host::layout_for_pool(args.rtx_pool, args.rtx_ids, args.rtx_block_bytes)
            .context("--rtx-pool")?;
        let (mr, export) = rtx::host::host(&fabric, layout).context("hosting the rTX region")?;
        tracing::info!(
            objects = layout.objects,
            blocks = layout.blocks,
            "rTX region"
        );
        Some((mr, export, None))
    } else {
        None
    };
    tracing::info!(
        ms = t0.elapsed().as_millis() as u64,
        images = args.replicas,
        empty = args.empty,
        "loaded {what}"
    );
    let mut exports = BTreeMap::new();
    let export = txn::cvt_remote::MemnodeExport {
        partition: args.spare_index.unwrap_or(args.partition),
        partitions: args.partitions,
        tables,
        replicas: args.replicas,
        backups,
        spare,
        log: log_region.as_ref().map(|mr| txn::commit_log::LogExport {
            region: mr.desc(),
            geometry,
        }),
        undo: undo_region.as_ref().map(|mr| txn::commit_log::LogExport {
            region: mr.desc(),
            geometry: undo_geometry,
        }),
    };
    exports.insert(
        txn::cvt_remote::EXPORT_KEY.to_string(),
        serde_json::to_value(&export)?,
    );
    if let Some((_, export, ix)) = &rtx_region {
        exports.insert(
            rtx::host::EXPORT_KEY.to_string(),
            serde_json::to_value(export)?,
        );
        if let Some(ix) = ix {
            exports.insert(
                txn::range_index::EXPORT_KEY.to_string(),
                serde_json::to_value(ix)?,
            );
        }
    }
    let served = match &locks {
        Some(cfg) => Served::Locks(
            lockd::embed::LockService::start_hosted(
                fabric,
                args.node.listen,
                cfg,
                &rpc,
                lockd::embed::Hosting {
                    role: "memnode",
                    exports,
                    reader,
                },
                |_| {},
            )
            .context("starting the lock service")?,
        ),
        None => Served::Plain(Node::start_tuned(
            fabric,
            NodeConfig::new("memnode", args.node.listen).with_exports(exports),
            &rpc,
        )?),
    };
    let node = served.node();
    tracing::info!(
        cluster = %args.node.cluster,
        node = %args.node.node,
        addr = %node.addr(),
        fabric = %node.fabric().describe(),
        tables = export.tables.len(),
        partition = args.spare_index.unwrap_or(args.partition),
        spare,
        partitions = args.partitions,
        replicas = args.replicas,
        locks = locks.as_ref().map_or(0, |c| c.locks),
        "memnode serving"
    );
    let _membership = match &args.etcd {
        Some(url) => {
            let f = node.fabric().clone();
            let id = args.node.node.get();
            let fence = move |d: &member::MemberInfo| {
                f.fence(rrpc::NodeId(u32::from(d.node)), d.incarnation);
            };
            let me = member::join_and_fence(
                std::slice::from_ref(url),
                &args.node.cluster,
                member::Role::Memnode,
                id as u16,
                fence,
            );
            Some(me.context("joining the membership in etcd")?)
        }
        None => None,
    };
    service::announce_ready(node.addr(), &[]).context("writing READY")?;
    let _ = stop.recv();
    tracing::info!("signal received; shutting down");
    drop(served);
    drop(regions);
    drop(log_region);
    drop(undo_region);
    drop(rtx_region);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_service_flags_give_its_settings_and_refuse_what_it_cannot_serve() {
        let parse = |a: &[&str]| {
            let mut v = vec!["memnode", "--node", "1"];
            v.extend_from_slice(a);
            lock_service_config(&Args::try_parse_from(v).unwrap())
        };
        assert!(parse(&["--kvs-records", "10"]).unwrap().is_none());
        let cfg = parse(&[
            "--lock-service",
            "--locks",
            "4096",
            "--cold-watermark",
            "2",
            "--hot-watermark",
            "5",
        ])
        .unwrap()
        .expect("a lock service");
        assert_eq!(
            (cfg.locks, cfg.cold_watermark, cfg.hot_watermark),
            (4096, 2, 5)
        );
        assert!(!cfg.lotus_serving);
        for (bad, want) in [
            (&["--hot-watermark", "2"][..], "exceeds hot watermark 2"),
            (&["--locks", "0"][..], "locks"),
            (
                &["--partitions", "3", "--replicas", "2"][..],
                "--replicas above 1",
            ),
            (
                &["--partitions", "2", "--replicas", "2", "--spare-index", "2"][..],
                "spare",
            ),
        ] {
            let mut a = vec!["--lock-service"];
            a.extend_from_slice(bad);
            let e = format!("{:#}", parse(&a).unwrap_err());
            assert!(e.contains(want), "{bad:?}: {e}");
        }
    }

    fn argv(a: &[&str]) -> Vec<std::ffi::OsString> {
        a.iter().map(Into::into).collect()
    }

    #[test]
    fn the_settings_file_gives_flags_fabric_and_rpc_settings_and_flags_win() {
        let p = std::env::temp_dir().join(format!("memnode-cfg-{}.toml", std::process::id()));
        std::fs::write(
            &p,
            "partitions = 4\npartition = 2\nkvs-records = 100\n\
             [fabric]\ncluster = \"c7\"\nmodel = \"cx6\"\n[server]\nidle-sleep-us = 9\n",
        )
        .unwrap();
        let ps = p.to_str().unwrap();
        let a = argv(&[
            "memnode",
            "--node",
            "1",
            "--config",
            ps,
            "--partition",
            "3",
            "--model",
            "none",
        ]);
        let args = Args::try_parse_from(&a).unwrap();
        let (args, rpc) = with_settings_file(args, a).unwrap();
        assert_eq!((args.partitions, args.partition), (4, 3), "the flag wins");
        assert_eq!(args.kvs_records, Some(100));
        assert_eq!(args.node.cluster, "c7");
        assert_eq!(args.node.model, "none", "the flag wins over [fabric]");
        assert_eq!(rpc.server.idle_sleep_us, 9);
        for (bad, want) in [
            ("no-such-flag = 1\n", "`no-such-flag`"),
            ("[fabric]\nbogus = 1\n", "[fabric]: unknown field `bogus`"),
            ("partitions = \"many\"\n", "many"),
        ] {
            std::fs::write(&p, bad).unwrap();
            let a = argv(&["memnode", "--node", "1", "--config", ps]);
            let args = Args::try_parse_from(&a).unwrap();
            let e = format!("{:#}", with_settings_file(args, a).unwrap_err());
            assert!(e.contains(ps) && e.contains(want), "{bad}: {e}");
        }
        std::fs::remove_file(&p).unwrap();
    }
}
