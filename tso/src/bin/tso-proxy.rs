//! The `tso-proxy` binary: a TSO proxy (Scythe 4.5 (3)) on an rrpc node. Settings come
//! from `--config FILE.toml` (kebab-case keys, every one optional) and flags, flags
//! winning.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context as _};
use clap::Parser;
use rrpc::service::{self, NodeArgs};
use rrpc::settings_file::{self, SettingsFile};
use serde::Deserialize as _;
use tso::proxy::{Proxy, ProxyConfig, DEFAULT_MAX_RANGE};

/// TSO proxy: serves timestamp ranges to compute nodes over rrpc and merges concurrent
/// requests, from all its threads and all compute nodes, into one fetch-and-add on the
/// oracle (Scythe's RDMA-friendly TSO, section 4.5 (3)).
///
/// It never prefetches or caches ranges: every range is taken from the oracle after its
/// request arrived. It holds at most --oracle-qps QPs on the oracle.
///
/// It follows an oracle restarted at the same address: when an FAA fails, it re-reads
/// the oracle's export (every --oracle-retry-ms, for at most --oracle-wait-ms) and
/// switches to the new incarnation if its epoch is larger; an oracle that came back with
/// an epoch that is not larger (restarted without its --state-dir) is refused. As a
/// second check it remembers the highest timestamp it issued (in memory): a range from
/// the oracle that does not start above it is refused and logged, never served.
///
/// Prints `ORACLE <node> EPOCH <n>` and then `READY <bootstrap address>` on stdout once
/// serving; runs until SIGINT or SIGTERM, then logs its counters (FAAs, requests,
/// timestamps, highest issued, refused ranges and epochs, restarts followed) on stderr.
#[derive(Parser, Debug)]
#[command(name = "tso-proxy", version)]
struct Cli {
    #[command(flatten)]
    node: NodeArgs,
    /// TOML file of settings: `oracle`, `threads`, `oracle-qps`, `max-range`,
    /// `oracle-wait-ms`, `oracle-retry-ms` (the flags below without their dashes; unknown
    /// keys are an error), a `[fabric]` table (cluster, kind, listen, model, rdma-device,
    /// gid-index, rdma-port, tclass, sl) and `[runtime]`/`[server]` tables (as a topology
    /// file's). Flags win over the file.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Bootstrap (control-plane) address of the `tso` oracle to take ranges from
    /// (required, here or in the file).
    #[arg(long, value_name = "ADDR", value_parser = service::parse_addr)]
    oracle: Option<SocketAddr>,
    /// RPC server threads serving range requests (1 to 256; default 1).
    #[arg(long, value_name = "T")]
    threads: Option<usize>,
    /// Most QPs this proxy opens on the oracle, shared by its server threads (1 to
    /// --threads; default 1).
    #[arg(long, value_name = "N")]
    oracle_qps: Option<usize>,
    /// Largest number of timestamps one request may ask for (>= 1; default 1048576).
    #[arg(long, value_name = "N")]
    max_range: Option<u64>,
    /// Longest wait, in milliseconds, for a dead oracle to come back before the FAA in
    /// progress (and the requests merged into it) fails (1 to 3600000; default 30000).
    #[arg(long, value_name = "MS")]
    oracle_wait_ms: Option<u64>,
    /// Pause, in milliseconds, between attempts to reach a restarted oracle (1 to
    /// 10000; default 10).
    #[arg(long, value_name = "MS")]
    oracle_retry_ms: Option<u64>,
}

/// The settings file of `tso-proxy`.
#[derive(Debug, Default, PartialEq, serde::Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
struct File {
    /// The oracle's bootstrap address.
    oracle: Option<SocketAddr>,
    /// Server threads (default 1).
    threads: Option<usize>,
    /// QPs on the oracle (default 1).
    oracle_qps: Option<usize>,
    /// Largest request, timestamps (default 2^20).
    max_range: Option<u64>,
    /// Wait for a dead oracle, milliseconds (default 30 000).
    oracle_wait_ms: Option<u64>,
    /// Pause between reconnect attempts, milliseconds (default 10).
    oracle_retry_ms: Option<u64>,
}

/// What the proxy runs with: the oracle's address, the proxy's settings, the node flags
/// and the rrpc settings.
type Loaded = (SocketAddr, ProxyConfig, NodeArgs, rrpc::node::RpcSettings);

/// The oracle's address, the proxy's settings, its node flags and its rrpc settings: the
/// topology file's (with --hosts; the oracle defaulting to its [tso]), then the --config
/// file's ([`SettingsFile`]: `[fabric]` where `explicit(clap id)` says the flag was not
/// given, `[runtime]`, `[server]`, the own keys), then the flags given.
fn load_all(cli: &Cli, explicit: &dyn Fn(&str) -> bool) -> anyhow::Result<Loaded> {
    let t: File = match cli.node.placement("tso-proxy")? {
        Some((topo, role)) => {
            let mut t: File = topo.settings(&role)?;
            if let (None, Some(tso)) = (t.oracle, &topo.tso) {
                t.oracle = Some(
                    service::parse_addr(&topo.addr_of(tso))
                        .map_err(|e| anyhow::anyhow!("{}: [tso]: {e}", topo.path))?,
                );
            }
            t
        }
        None => File::default(),
    };
    let file = match &cli.config {
        Some(p) => SettingsFile::load(p)?,
        None => SettingsFile::default(),
    };
    let mut node = cli.node.clone();
    file.apply_fabric(&mut node, explicit)?;
    let f: File = match &cli.config {
        Some(p) => File::deserialize(file.own.clone())
            .with_context(|| format!("parsing {}", p.display()))?,
        None => File::default(),
    };
    let f = File {
        oracle: f.oracle.or(t.oracle),
        threads: f.threads.or(t.threads),
        oracle_qps: f.oracle_qps.or(t.oracle_qps),
        max_range: f.max_range.or(t.max_range),
        oracle_wait_ms: f.oracle_wait_ms.or(t.oracle_wait_ms),
        oracle_retry_ms: f.oracle_retry_ms.or(t.oracle_retry_ms),
    };
    let d = ProxyConfig::default();
    let cfg = ProxyConfig::default()
        .with_threads(cli.threads.or(f.threads).unwrap_or(d.threads))
        .with_oracle_qps(cli.oracle_qps.or(f.oracle_qps).unwrap_or(d.oracle_qps))
        .with_max_range(cli.max_range.or(f.max_range).unwrap_or(DEFAULT_MAX_RANGE))
        .with_oracle_wait_ms(
            cli.oracle_wait_ms
                .or(f.oracle_wait_ms)
                .unwrap_or(d.oracle_wait_ms),
        )
        .with_oracle_retry_ms(
            cli.oracle_retry_ms
                .or(f.oracle_retry_ms)
                .unwrap_or(d.oracle_retry_ms),
        );
    cfg.validate()?;
    let Some(oracle) = cli.oracle.or(f.oracle) else {
        bail!("no oracle: give --oracle ADDR or `oracle = \"ADDR\"` in --config");
    };
    let rpc = file.rpc_settings(&node)?;
    Ok((oracle, cfg, node, rpc))
}

fn main() -> ExitCode {
    service::main_with("tso-proxy", run)
}

fn run(cli: Cli) -> anyhow::Result<()> {
    // A bad settings file is a usage error: exit 2 before anything runs.
    let (oracle, cfg, node_args, rpc) = settings_file::or_exit(
        "tso-proxy",
        load_all(&cli, &settings_file::given_to_process::<Cli>),
    );
    let stop = service::stop_signal().context("installing the SIGINT/SIGTERM handler")?;
    let fabric = node_args.open_fabric().context("opening the fabric")?;
    let proxy = Proxy::start_tuned(fabric.clone(), node_args.listen, oracle, &cfg, &rpc)
        .with_context(|| format!("starting the proxy of the oracle at {oracle}"))?;
    let o = proxy.oracle();
    tracing::info!(
        cluster = %node_args.cluster,
        node = %node_args.node,
        addr = %proxy.addr(),
        fabric = %fabric.describe(),
        oracle = %oracle,
        oracle_node = %o.node(),
        epoch = o.epoch(),
        placement = o.placement(),
        threads = cfg.threads,
        oracle_qps = cfg.oracle_qps,
        max_range = cfg.max_range,
        oracle_wait_ms = cfg.oracle_wait_ms,
        "tso-proxy serving"
    );
    service::announce_ready(
        proxy.addr(),
        &[format!("ORACLE {} EPOCH {}", o.node(), o.epoch())],
    )
    .context("writing to stdout")?;
    let _ = stop.recv();
    let s = proxy.stats();
    tracing::info!(
        faas = s.group.groups,
        timestamps = s.group.members,
        timestamps_per_faa = s.group.mean_group_size(),
        highest = %s.highest,
        regressions = s.regressions,
        went_back = s.went_back,
        oracle_epoch = s.oracle_epoch,
        oracle_reconnects = s.oracle_reconnects,
        oracle_qps = s.oracle_qps,
        "signal received; shutting down"
    );
    drop(proxy);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The oracle and the settings `load_all` gives with no node flag given explicitly.
    fn load(cli: &Cli) -> anyhow::Result<(SocketAddr, ProxyConfig)> {
        load_all(cli, &|_| false).map(|(o, c, _, _)| (o, c))
    }

    #[test]
    fn the_settings_files_fabric_table_reaches_the_node() {
        let p = std::env::temp_dir().join(format!("tso-proxy-fab-{}.toml", std::process::id()));
        std::fs::write(
            &p,
            "oracle = \"127.0.0.1:9\"\n[fabric]\ncluster = \"c8\"\n[server]\nidle-sleep-us = 3\n",
        )
        .unwrap();
        let (o, _, node, rpc) =
            load_all(&cli(&["--config", p.to_str().unwrap()]), &|_| false).unwrap();
        assert_eq!(o, "127.0.0.1:9".parse().unwrap());
        assert_eq!(node.cluster, "c8");
        assert_eq!(rpc.server.idle_sleep_us, 3);
        std::fs::write(&p, "[fabric]\nkind = 3\n").unwrap();
        let e = format!(
            "{:#}",
            load(&cli(&["--config", p.to_str().unwrap()])).unwrap_err()
        );
        assert!(e.contains("[fabric]: invalid type"), "{e}");
        std::fs::remove_file(&p).unwrap();
    }

    fn cli(args: &[&str]) -> Cli {
        let mut v = vec!["tso-proxy", "--node", "5"];
        v.extend_from_slice(args);
        Cli::try_parse_from(v).unwrap()
    }

    #[test]
    fn file_then_flags_then_validation() {
        let dir = std::env::temp_dir().join(format!("tso-proxy-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("proxy.toml");
        std::fs::write(
            &p,
            "oracle = \"127.0.0.1:7000\"\nthreads = 4\noracle-qps = 2\n",
        )
        .unwrap();
        let ps = p.to_str().unwrap();
        let (o, c) = load(&cli(&["--config", ps])).unwrap();
        assert_eq!(o, "127.0.0.1:7000".parse().unwrap());
        assert_eq!(
            (c.threads, c.oracle_qps, c.max_range),
            (4, 2, DEFAULT_MAX_RANGE)
        );
        // Flags win over the file.
        let (o, c) = load(&cli(&[
            "--config",
            ps,
            "--oracle",
            "127.0.0.1:7001",
            "--oracle-qps",
            "1",
        ]))
        .unwrap();
        assert_eq!((o.port(), c.threads, c.oracle_qps), (7001, 4, 1));
        assert_eq!((c.oracle_wait_ms, c.oracle_retry_ms), (30_000, 10));
        let (_, c) = load(&cli(&["--config", ps, "--oracle-wait-ms", "500"])).unwrap();
        assert_eq!(c.oracle_wait_ms, 500);
        let e = load(&cli(&["--config", ps, "--oracle-retry-ms", "0"])).unwrap_err();
        assert!(format!("{e:#}").contains("oracle-retry-ms"), "{e:#}");
        // Validation of the merged settings.
        let e = load(&cli(&["--config", ps, "--threads", "1"])).unwrap_err();
        assert!(format!("{e:#}").contains("oracle-qps"), "{e:#}");
        // No oracle anywhere.
        let e = load(&cli(&[])).unwrap_err();
        assert!(e.to_string().contains("no oracle"), "{e}");
        // Unknown keys are refused.
        std::fs::write(&p, "oracle = \"127.0.0.1:7000\"\nthreadz = 4\n").unwrap();
        let e = load(&cli(&["--config", ps])).unwrap_err();
        assert!(format!("{e:#}").contains("threadz"), "{e:#}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_topology_files_tso_proxy_table_is_its_config() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/examples");
        let cli = |file: &str, extra: &[&str]| -> Cli {
            let mut argv = vec![
                "tso-proxy".to_string(),
                "--hosts".into(),
                format!("{dir}/{file}"),
            ];
            argv.extend(["--as".into(), "tso-proxy".into()]);
            argv.extend(extra.iter().map(|s| s.to_string()));
            service::resolve_args(
                "tso-proxy",
                argv.into_iter().map(Into::into).collect(),
                &|| Ok("x".into()),
            )
            .unwrap()
        };
        let (o, c) = load(&cli("cloudlab-4.toml", &[])).unwrap();
        assert_eq!(o, "10.10.1.4:7003".parse().unwrap(), "the file's [tso]");
        assert_eq!((c.threads, c.oracle_qps), (2, 2));
        let (o, c) = load(&cli("local.toml", &["--oracle", "localhost:7999"])).unwrap();
        assert_eq!((o.port(), c.threads), (7999, 1), "the flag wins");
        assert!(o.ip().is_loopback());
    }
}
