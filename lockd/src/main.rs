//! The `lockd` binary: serves a table of Takeout Locks (Scythe 4.3) and a Lotus lock
//! table for its shards (Lotus 4.1, 4.2) on an rrpc node, and optionally tables of the
//! one-sided baseline locks (CAS spinlock, DSLR). Settings come from `--config FILE.toml`
//! (kebab-case keys, every one optional) and flags, flags winning.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use lockd::embed::{LockService, LockServiceConfig};
use lockd::service::LockOrder;
use rrpc::service::{self, NodeArgs};
use rrpc::settings_file::{self, SettingsFile};
use serde::Deserialize as _;

/// Lock service serving Scythe's Takeout Locks (fair, heat-aware ticket locks) over rrpc.
///
/// Clients take tickets with the Lock RPC, poll `upper` with one-sided READs and unlock
/// with a one-sided FAA. Prints `READY <bootstrap address>` on stdout once serving
/// (preceded by `EPOCH <e>` with --state-dir or --epoch) and runs until SIGINT or SIGTERM.
#[derive(Parser, Debug)]
#[command(name = "lockd", version)]
struct Cli {
    #[command(flatten)]
    node: NodeArgs,
    /// TOML file of settings: kebab-case keys as the flags below, a `[reshard]` table
    /// (nodes, interval-ms, factor, intervals, drain-timeout-ms), a `[fabric]` table
    /// (cluster, kind, listen, model, rdma-device, gid-index, rdma-port, tclass, sl) and
    /// `[runtime]`/`[server]` tables (as a topology file's); flags win.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Number of Takeout Locks in the table (32 bytes of registered memory each; >= 1;
    /// default 1048576).
    #[arg(long, value_name = "N")]
    locks: Option<u64>,
    /// RPC server threads (1 to 1024; default 1).
    #[arg(long, value_name = "T")]
    threads: Option<u64>,
    /// Sleep of an idle server thread, microseconds (0 to 10000; default 0: an idle
    /// thread spins, then yields). Sleeping gives the core back to compute threads on
    /// the same machine; a Lock RPC arriving meanwhile waits at most this long.
    #[arg(long, value_name = "US")]
    idle_sleep_us: Option<u64>,
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
    /// Run the resharding loop (Lotus 4.3) over this node and the lock-table nodes at
    /// these comma-separated bootstrap addresses (default: no loop; one per cluster).
    #[arg(long, value_name = "ADDRS", value_delimiter = ',', value_parser = service::parse_addr)]
    reshard_nodes: Option<Vec<SocketAddr>>,
    /// Length of a resharding interval, milliseconds (default 100).
    #[arg(long, value_name = "MS")]
    reshard_interval_ms: Option<u64>,
    /// Directory where the service persists its epoch before serving, so that clients of
    /// an earlier start are refused and reconnect (default none: the epoch is the clock's
    /// microseconds at start). Locked while the service runs.
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// The epoch to serve in, from the cluster's configuration (>= 1, larger than every
    /// earlier start's; wins over --state-dir).
    #[arg(long, value_name = "E")]
    epoch: Option<u64>,
    /// Bootstrap address of the timestamp oracle: Lock RPC timestamps above what it has
    /// issued are refused (default none: only timestamps of 2^62 and above are).
    #[arg(long, value_name = "ADDR", value_parser = service::parse_addr)]
    tso: Option<SocketAddr>,
    /// After a restart (a state directory or --epoch that says an earlier start
    /// existed), refuse Lock RPCs for this many milliseconds, so that every ticket the
    /// predecessor granted has expired before a lock is granted again (default 1000; at
    /// least the coordinators' ticket lease, 500 ms by default; 0: off, unsafe).
    #[arg(long, value_name = "MS")]
    restart_grace_ms: Option<u64>,
    /// Join the cluster's membership in etcd at this endpoint (e.g.
    /// http://127.0.0.1:2379): register under a lease, and fence a compute node's
    /// incarnation when it goes down (its queue pairs to the error state, so that its
    /// late one-sided ticket releases fail) before recovery hands its tickets on. Needs a
    /// build with the etcd feature (`--features member/etcd`).
    #[arg(long, value_name = "URL")]
    etcd: Option<String>,
}

/// The service's settings, the node flags and the rrpc settings, from the topology file
/// (`--hosts`), then `--config` ([`SettingsFile`]: `[fabric]`, `[runtime]`, `[server]`,
/// the service's own keys), then flags.
fn load(
    cli: &Cli,
    explicit: &dyn Fn(&str) -> bool,
) -> anyhow::Result<(LockServiceConfig, NodeArgs, rrpc::node::RpcSettings)> {
    let mut node = cli.node.clone();
    // The topology file's [lockd] table first (its tso defaulting to the file's [tso]),
    // then the --config file's keys over it.
    let mut table = match cli.node.placement("lockd")? {
        Some((topo, role)) => {
            topo.settings::<LockServiceConfig>(&role)?;
            let mut t = role.settings.clone();
            if let (false, Some(tso)) = (t.contains_key("tso"), &topo.tso) {
                let a = service::parse_addr(&topo.addr_of(tso))
                    .map_err(|e| anyhow::anyhow!("{}: [tso]: {e}", topo.path))?;
                t.insert("tso".into(), toml::Value::String(a.to_string()));
            }
            t
        }
        None => toml::Table::new(),
    };
    let file = match &cli.config {
        Some(p) => SettingsFile::load(p)?,
        None => SettingsFile::default(),
    };
    file.apply_fabric(&mut node, explicit)?;
    // The file's own keys over the topology file's [lockd] table, its tables ([reshard])
    // merged key by key.
    for (k, v) in file.own.clone() {
        match (table.get_mut(&k), v) {
            (Some(toml::Value::Table(base)), toml::Value::Table(over)) => base.extend(over),
            (_, v) => {
                table.insert(k, v);
            }
        }
    }
    let mut c = match &cli.config {
        Some(p) => LockServiceConfig::deserialize(table)
            .with_context(|| format!("parsing {}", p.display()))?,
        None => LockServiceConfig::deserialize(table)?,
    };
    macro_rules! flag {
        ($($f:ident),*) => { $( if let Some(v) = &cli.$f { c.$f = v.clone(); } )* };
    }
    flag!(
        locks,
        threads,
        idle_sleep_us,
        cold_watermark,
        hot_watermark,
        cas_locks,
        dslr_locks
    );
    flag!(
        lock_table_slots,
        shards,
        map_version,
        lock_order,
        restart_grace_ms
    );
    if let Some(v) = &cli.reshard_nodes {
        c.reshard.nodes = v.clone();
    }
    if let Some(v) = cli.reshard_interval_ms {
        c.reshard.interval_ms = v;
    }
    if let Some(v) = &cli.state_dir {
        c.state_dir = Some(v.clone());
    }
    if let Some(v) = cli.epoch {
        c.epoch = Some(v);
    }
    if let Some(v) = cli.tso {
        c.tso = Some(v);
    }
    c.validate()?;
    let rpc = file.rpc_settings(&node)?;
    Ok((c, node, rpc))
}

/// Whether the node flag with clap id `id` was given on the command line or through its
/// environment variable (rather than defaulted).
fn given(id: &str) -> bool {
    settings_file::given_to_process::<Cli>(id)
}

fn main() -> ExitCode {
    service::main_with("lockd", run)
}

fn run(cli: Cli) -> anyhow::Result<()> {
    // A bad settings file is a usage error: exit 2 before anything runs.
    let (cfg, node_args, rpc) = settings_file::or_exit("lockd", load(&cli, &given));
    // Install the signal handler first so a signal during start-up is not lost.
    let stop = service::stop_signal().context("installing the SIGINT/SIGTERM handler")?;
    let fabric = node_args.open_fabric().context("opening the fabric")?;
    let svc = LockService::start_tuned(fabric.clone(), node_args.listen, &cfg, &rpc)?;
    tracing::info!(
        cluster = %node_args.cluster,
        node = %node_args.node,
        addr = %svc.addr(),
        fabric = %fabric.describe(),
        locks = cfg.locks,
        table_bytes = cfg.locks * lockd::takeout::LOCK_STRIDE,
        threads = cfg.threads,
        call_timeout_ms = rpc.runtime.call_timeout.as_millis() as u64,
        idle_sleep_us = svc.node().server_config().map_or(0, |s| s.idle_sleep_us),
        cold_watermark = cfg.cold_watermark,
        hot_watermark = cfg.hot_watermark,
        lock_order = ?cfg.lock_order,
        cas_locks = cfg.cas_locks,
        dslr_locks = cfg.dslr_locks,
        lock_table_buckets = svc.lotus().table().n_buckets(),
        shards = %cfg.shards,
        map_version = cfg.map_version,
        reshard_loop = svc.runs_reshard_loop(),
        epoch = svc.takeout().epoch(),
        restart_grace_ms = svc.takeout().grace_left().as_millis() as u64,
        "lockd serving"
    );
    // The epoch before READY when it is durable (a state directory or a configured
    // epoch), for launchers that track restarts.
    let lines = match (&cfg.state_dir, cfg.epoch) {
        (None, None) => vec![],
        _ => vec![format!("EPOCH {}", svc.takeout().epoch())],
    };
    let _membership = match &cli.etcd {
        Some(url) => {
            let (f, id) = (fabric.clone(), node_args.node.get() as u16);
            let fence = move |d: &member::MemberInfo| {
                f.fence(rrpc::NodeId(u32::from(d.node)), d.incarnation);
            };
            let me = member::join_and_fence(
                std::slice::from_ref(url),
                &node_args.cluster,
                member::Role::Lockd,
                id,
                fence,
            );
            Some(me.context("joining the membership in etcd")?)
        }
        None => None,
    };
    service::announce_ready(svc.addr(), &lines).context("writing READY")?;
    let _ = stop.recv();
    tracing::info!("signal received; shutting down");
    drop(svc);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rrpc::NodeId;

    #[test]
    fn config_file_then_flags_then_validation() {
        let dir = std::env::temp_dir().join(format!("lockd-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("lockd.toml");
        std::fs::write(
            &p,
            "lock-table-slots = 4096\nshards = \"0-99\"\nthreads = 2\nlock-order = \"arrival\"\n\
             hot-watermark = 12\n\
             [reshard]\nnodes = [\"127.0.0.1:7000\"]\nfactor = 2.0\n\
             [fabric]\ncluster = \"from-file\"\nmodel = \"cx5\"\nlisten = \"127.0.0.1:7100\"\n",
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
            "--model",
            "none",
        ]);
        // As if --model was given and the other node flags defaulted.
        let explicit = |id: &str| id == "model";
        let (c, node, _) = load(&cli, &explicit).unwrap();
        assert_eq!(
            (c.lock_table_slots, c.shards.as_str(), c.threads),
            (4096, "0-99", 4)
        );
        assert_eq!(c.locks, 1 << 20, "default kept");
        assert_eq!((c.cold_watermark, c.hot_watermark), (3, 12));
        assert_eq!(c.lock_order, LockOrder::Arrival);
        assert_eq!(c.reshard.nodes, vec!["127.0.0.1:7000".parse().unwrap()]);
        assert_eq!((c.reshard.factor, c.reshard.intervals), (2.0, 3));
        assert_eq!(node.cluster, "from-file");
        assert_eq!(node.model, "none", "the flag wins over the file");
        assert_eq!(node.listen, "127.0.0.1:7100".parse().unwrap());
        assert_eq!(node.node, NodeId(3));
        for bad in [
            "no-such-key = 1\n",
            "[fabric]\nkind = \"carrier-pigeon\"\n",
            "[fabric]\nnode = 4\n",
            "[reshard]\nfactor = 0.5\n",
            "[reshard]\nintervals = 0\n",
        ] {
            std::fs::write(&p, bad).unwrap();
            assert!(load(&cli, &explicit).is_err(), "{bad}");
        }
        let none = |_: &str| false;
        let bad = Cli::parse_from(["lockd", "--node", "3", "--shards", "0-5000"]);
        assert!(load(&bad, &none).is_err());
        let bad = Cli::parse_from(["lockd", "--node", "3", "--cold-watermark", "11"]);
        assert!(load(&bad, &none).is_err());
        let ok = Cli::parse_from([
            "lockd",
            "--node",
            "3",
            "--reshard-nodes",
            "127.0.0.1:1,127.0.0.1:2",
            "--reshard-interval-ms",
            "50",
        ]);
        let (c, _, _) = load(&ok, &none).unwrap();
        assert_eq!((c.reshard.nodes.len(), c.reshard.interval_ms), (2, 50));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// With --hosts, the file's `[runtime]` and `[server]` reach the service: its RPC server
    /// runs with the file's keys (lockd's own idle-sleep-us and threads win).
    #[test]
    fn the_topology_files_runtime_and_server_reach_the_service() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/examples");
        let text = std::fs::read_to_string(format!("{dir}/local.toml")).unwrap();
        let name = format!("lockd-rpc-{}", std::process::id());
        let text = text.replace("name = \"local\"", &format!("name = \"{name}\""))
            + "\n[runtime]\ncall-timeout-ms = 1234\n[server]\nmax-ring-bytes = 65536\nidle-sleep-us = 5\n";
        let tmp = std::env::temp_dir().join(format!("{name}.toml"));
        std::fs::write(&tmp, text).unwrap();
        let cli: Cli = service::resolve_args(
            "lockd",
            ["lockd", "--hosts", tmp.to_str().unwrap(), "--as", "lockd"]
                .map(Into::into)
                .to_vec(),
            &|| Ok("x".into()),
        )
        .unwrap();
        let (mut cfg, node, rpc) = load(&cli, &|_: &str| false).unwrap();
        assert_eq!(
            rpc.runtime.call_timeout,
            std::time::Duration::from_millis(1234)
        );
        cfg.locks = 16;
        cfg.lock_table_slots = 1 << 12;
        cfg.tso = None; // no oracle runs here
        let (guard, _) = rrpc::fabric::shm::ClusterGuard::new(&name).unwrap();
        let svc = LockService::start_tuned(
            guard.open(node.node).unwrap(),
            "127.0.0.1:0".parse().unwrap(),
            &cfg,
            &rpc,
        )
        .unwrap();
        let server = svc.node().server_config().unwrap();
        assert_eq!(server.max_ring_bytes, 65536, "the file's [server]");
        assert_eq!(server.idle_sleep_us, 20, "[lockd]'s idle-sleep-us wins");
        assert_eq!(server.threads, cfg.threads as usize);
        drop(svc);
        std::fs::remove_file(&tmp).unwrap();
    }

    #[test]
    fn the_topology_files_lockd_table_is_its_config() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/examples");
        let none = |_: &str| false;
        let parse =
            |file: &str,
             extra: &[&str]|
             -> anyhow::Result<(LockServiceConfig, NodeArgs, rrpc::node::RpcSettings)> {
                let mut argv = vec![
                    "lockd".to_string(),
                    "--hosts".into(),
                    format!("{dir}/{file}"),
                ];
                argv.extend(["--as".into(), "lockd".into()]);
                argv.extend(extra.iter().map(|s| s.to_string()));
                let cli: Cli = service::resolve_args(
                    "lockd",
                    argv.into_iter().map(Into::into).collect(),
                    &|| Ok("x".into()),
                )?;
                load(&cli, &none)
            };
        let (c, node, _) = parse("local.toml", &[]).unwrap();
        assert_eq!((c.lock_table_slots, c.idle_sleep_us), (65536, 20));
        assert_eq!(
            c.tso,
            Some("127.0.0.1:7003".parse().unwrap()),
            "the file's [tso]"
        );
        assert_eq!((node.node, node.listen.port()), (NodeId(2), 7002));
        let (c, node, _) = parse("cloudlab-4.toml", &["--threads", "2"]).unwrap();
        assert_eq!(
            (c.threads, c.lock_table_slots),
            (2, 4 << 20),
            "the flag wins"
        );
        assert_eq!(c.tso, Some("10.10.1.4:7003".parse().unwrap()));
        assert_eq!(
            (node.tclass, node.sl, node.gid_index),
            (Some(106), Some(3), Some(3))
        );
        assert_eq!(node.rdma_device.as_deref(), Some("mlx5_1"));
        parse("two-hosts.toml", &[]).unwrap();
        // A key lockd does not know names the file and the table.
        let tmp = std::env::temp_dir().join(format!("lockd-topo-{}.toml", std::process::id()));
        let text = std::fs::read_to_string(format!("{dir}/local.toml")).unwrap();
        std::fs::write(&tmp, text.replace("idle-sleep-us", "idle-sleep-ms")).unwrap();
        let cli: Cli = service::resolve_args(
            "lockd",
            ["lockd", "--hosts", tmp.to_str().unwrap(), "--as", "lockd"]
                .map(Into::into)
                .to_vec(),
            &|| Ok("x".into()),
        )
        .unwrap();
        let e = format!("{:#}", load(&cli, &none).unwrap_err());
        assert!(e.contains("[lockd]: unknown field `idle-sleep-ms`"), "{e}");
        std::fs::remove_file(&tmp).unwrap();
    }
}
