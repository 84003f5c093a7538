//! The `tso` binary: a timestamp oracle (Scythe 4.5) on an rrpc node. Settings come from
//! `--config FILE.toml` (kebab-case keys, every one optional) and flags, flags winning.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use rrpc::fabric::DmPlacement;
use rrpc::service::{self, NodeArgs};
use rrpc::settings_file::{self, SettingsFile};
use serde::Deserialize as _;
use tso::epoch;
use tso::oracle::describe_placement;
use tso::Oracle;

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
    /// TOML file of settings: `state-dir` (the flag below without its dashes; unknown
    /// keys are an error), a `[fabric]` table (cluster, kind, listen, model, rdma-device,
    /// gid-index, rdma-port, tclass, sl) and `[runtime]`/`[server]` tables (as a topology
    /// file's). Flags win over the file.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Directory of the durable epoch file (`<dir>/epoch`, created if missing). Must be
    /// on durable storage and used by one oracle at a time; losing it loses the
    /// guarantee that restarts never go back. Default: none (epoch 0).
    #[arg(long, value_name = "DIR", env = "TSO_STATE_DIR")]
    state_dir: Option<PathBuf>,
    /// Join the cluster's membership in etcd at this endpoint (e.g.
    /// http://127.0.0.1:2379): the oracle registers under a 1 s lease (its incarnation
    /// and liveness visible to every member). A dead compute node's late FAAs only
    /// skip timestamps, so the oracle fences nobody. Needs a build with the etcd feature
    /// (`--features member/etcd`).
    #[arg(long, value_name = "URL")]
    etcd: Option<String>,
}

/// The settings file of `tso`.
#[derive(Debug, Default, PartialEq, serde::Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
struct Config {
    /// Directory of the durable epoch file (default: none, epoch 0).
    state_dir: Option<PathBuf>,
}

/// The oracle's settings, its node flags and its rrpc settings: the topology file's
/// (with --hosts), then the --config file's ([`SettingsFile`]: `[fabric]` where
/// `explicit(clap id)` says the flag was not given, `[runtime]`, `[server]`, the own
/// keys), then the flags given.
fn load(
    cli: &Cli,
    explicit: &dyn Fn(&str) -> bool,
) -> anyhow::Result<(Config, NodeArgs, rrpc::node::RpcSettings)> {
    // The topology file's [tso] table, then the --config file, then the flags.
    let mut c: Config = match cli.node.placement("tso")? {
        Some((topo, role)) => topo.settings(&role)?,
        None => Config::default(),
    };
    let file = match &cli.config {
        Some(p) => SettingsFile::load(p)?,
        None => SettingsFile::default(),
    };
    let mut node = cli.node.clone();
    file.apply_fabric(&mut node, explicit)?;
    if let Some(p) = &cli.config {
        let f = Config::deserialize(file.own.clone())
            .with_context(|| format!("parsing {}", p.display()))?;
        if f.state_dir.is_some() {
            c.state_dir = f.state_dir;
        }
    }
    if let Some(d) = &cli.state_dir {
        c.state_dir = Some(d.clone());
    }
    if c.state_dir
        .as_ref()
        .is_some_and(|d| d.as_os_str().is_empty())
    {
        anyhow::bail!("state-dir: empty path");
    }
    let rpc = file.rpc_settings(&node)?;
    Ok((c, node, rpc))
}

fn main() -> ExitCode {
    service::main_with("tso", run)
}

fn run(cli: Cli) -> anyhow::Result<()> {
    // A bad settings file is a usage error: exit 2 before anything runs.
    let (cfg, node_args, rpc) =
        settings_file::or_exit("tso", load(&cli, &settings_file::given_to_process::<Cli>));
    let stop = service::stop_signal().context("installing the SIGINT/SIGTERM handler")?;
    let fabric = node_args.open_fabric().context("opening the fabric")?;
    // Held until the oracle exits: a second oracle on the same directory fails here.
    let state = cfg
        .state_dir
        .as_deref()
        .map(epoch::StateDir::open)
        .transpose()?;
    let epoch = match &state {
        Some(dir) => dir
            .advance()
            .with_context(|| format!("opening a new epoch in {}", dir.path().display()))?,
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
    let node = oracle
        .serve_tuned(fabric.clone(), node_args.listen, &rpc)
        .context("starting the node")?;
    tracing::info!(
        cluster = %node_args.cluster,
        node = %node_args.node,
        addr = %node.addr(),
        fabric = %fabric.describe(),
        placement = %placement,
        epoch,
        "tso serving"
    );
    let _membership = match &cli.etcd {
        Some(url) => Some(
            member::Member::join(
                std::slice::from_ref(url),
                &node_args.cluster,
                member::Role::Tso,
                node_args.node.get() as u16,
                std::time::Duration::from_secs(1),
            )
            .context("joining the membership in etcd")?,
        ),
        None => None,
    };
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The settings `load` gives with no node flag given explicitly.
    fn settings(cli: &Cli) -> anyhow::Result<Config> {
        load(cli, &|_| false).map(|(c, _, _)| c)
    }

    #[test]
    fn the_settings_files_tables_reach_the_node() {
        let dir = std::env::temp_dir().join(format!("tso-tables-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("tso.toml");
        std::fs::write(
            &p,
            "state-dir = \"/x\"\n[fabric]\ncluster = \"c9\"\nmodel = \"cx6\"\n\
             [runtime]\ncall-timeout-ms = 777\n",
        )
        .unwrap();
        let cli = cli(&["--config", p.to_str().unwrap(), "--model", "none"]);
        let (c, node, rpc) = load(&cli, &|id| id == "model").unwrap();
        assert_eq!(c.state_dir.as_deref(), Some(std::path::Path::new("/x")));
        assert_eq!((node.cluster.as_str(), node.model.as_str()), ("c9", "none"));
        assert_eq!(
            rpc.runtime.call_timeout,
            std::time::Duration::from_millis(777)
        );
        std::fs::write(&p, "[server]\nno-such-key = 1\n").unwrap();
        let e = format!("{:#}", load(&cli, &|_| false).unwrap_err());
        assert!(e.contains("[server]: unknown field `no-such-key`"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn cli(args: &[&str]) -> Cli {
        let mut v = vec!["tso", "--node", "3"];
        v.extend_from_slice(args);
        Cli::try_parse_from(v).unwrap()
    }

    #[test]
    fn file_then_flags() {
        let dir = std::env::temp_dir().join(format!("tso-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("tso.toml");
        std::fs::write(&p, "state-dir = \"/var/lib/tso\"\n").unwrap();
        let ps = p.to_str().unwrap();
        let c = settings(&cli(&["--config", ps])).unwrap();
        assert_eq!(
            c.state_dir.as_deref(),
            Some(std::path::Path::new("/var/lib/tso"))
        );
        let c = settings(&cli(&["--config", ps, "--state-dir", "/tmp/x"])).unwrap();
        assert_eq!(c.state_dir.as_deref(), Some(std::path::Path::new("/tmp/x")));
        assert_eq!(settings(&cli(&[])).unwrap(), Config::default());
        std::fs::write(&p, "state_dir = \"/x\"\n").unwrap();
        let e = settings(&cli(&["--config", ps])).unwrap_err();
        assert!(format!("{e:#}").contains("state_dir"), "{e:#}");
        std::fs::write(&p, "state-dir = \"\"\n").unwrap();
        assert!(settings(&cli(&["--config", ps])).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_topology_files_tso_table_is_its_config() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/examples");
        let cli = |file: &str| -> Cli {
            let argv = [
                "tso".to_string(),
                "--hosts".into(),
                format!("{dir}/{file}"),
                "--as".into(),
                "tso".into(),
            ];
            service::resolve_args("tso", argv.map(Into::into).to_vec(), &|| Ok("x".into())).unwrap()
        };
        let c = cli("cloudlab-4.toml");
        assert_eq!(c.node.node, rrpc::NodeId(3));
        assert_eq!(
            settings(&c).unwrap().state_dir.as_deref(),
            Some(std::path::Path::new("/var/lib/rrpc/tso"))
        );
        assert_eq!(settings(&cli("local.toml")).unwrap(), Config::default());
        assert_eq!(settings(&cli("two-hosts.toml")).unwrap(), Config::default());
    }
}
