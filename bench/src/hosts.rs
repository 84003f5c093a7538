//! `txn-bench --hosts FILE`: the services of each run on the hosts a topology file
//! ([`rrpc::topology`]) names, started over ssh where a host is not this one
//! ([`crate::launcher::Place`]); the coordinators stay in `txn-bench` (on the host of
//! the file's first coordinator entry, whose RDMA device they use). Each service
//! listens at its role's `ctrl-ip:port` with its host's fabric flags, and its stderr
//! goes to `<log-dir>/<cluster>/<host>.<role>.<i>.log`. `--dry-run` prints every command
//! line instead of running it.

use std::path::{Path, PathBuf};

use anyhow::Context;
use rrpc::topology::{GidIndex, Host, RoleKind, Topology};

use crate::launcher::Place;
use crate::txn_args::Args;

/// Load the topology `args.hosts` names and fill in what it decides for this process:
/// the fabric, the number of memory nodes, the run's rrpc settings (the file's
/// `[runtime]` and `[server]`, which a `--config` file's go over), and the coordinators' RDMA device, port and GID index (unless given). Errors: the file does not load or check; it has no memory
/// node or no oracle; `--memnodes` or `--fabric` given otherwise.
pub(crate) fn apply(args: &mut Args) -> anyhow::Result<()> {
    let Some(path) = args.hosts.clone() else {
        return Ok(());
    };
    let topo = Topology::load(&path)?;
    anyhow::ensure!(
        !topo.memnodes.is_empty() && topo.tso.is_some(),
        "{}: txn-bench needs at least one [[memnode]] and a [tso]",
        topo.path
    );
    args.fabric_args.fabric = topo.fabric;
    args.memnodes = topo.memnodes.len() as u32;
    args.rpc = Some(topo.rpc_settings());
    if let Some(c) = topo.coordinators.first() {
        let h = topo.host_of(c);
        if args.rdma_device.is_none() {
            args.rdma_device = h.rdma_device.clone();
        }
        if let (None, GidIndex::Index(i)) = (args.gid_index, &h.gid_index) {
            args.gid_index = Some(*i);
        }
    }
    Ok(())
}

/// The services' places, flags and logs for one run.
pub(crate) struct Layout {
    topo: Topology,
    logs: PathBuf,
    /// The services' rrpc settings (the topology's, unless [`Layout::with_rpc`]).
    rpc: rrpc::node::RpcSettings,
}

/// Where a coordinator process runs as the topology places it.
pub(crate) struct CoordinatorPlace {
    /// Where it runs.
    pub place: Place,
    /// Its host's RDMA device.
    pub device: Option<String>,
    /// Its host's GID index (`None`: auto).
    pub gid_index: Option<u32>,
    /// Its `--cpus`: the `[coordinators]` table's `cpus`, else its host's.
    pub cpus: Option<String>,
    /// Its `--numa`: the `[coordinators]` table's `numa`, else its host's.
    pub numa: Option<u32>,
}

/// One service of the run as the topology places it.
pub(crate) struct Planned {
    /// Where it runs.
    pub place: Place,
    /// Its node id.
    pub node: u32,
    /// Its `--listen` address (`ctrl-ip:port`).
    pub listen: String,
    /// Its host's fabric flags, its `--cpus` and `--numa`, and the rrpc settings (the
    /// file's `[runtime]` and `[server]`, or [`Layout::with_rpc`]'s) as `--rpc-settings`
    /// (when not the defaults).
    pub flags: Vec<String>,
    /// Its log file.
    pub log: PathBuf,
}

/// `--rpc-settings JSON` for a service that runs with `rpc`, or nothing when `rpc` is
/// the defaults (every service binary takes the flag; it wins over their files).
pub(crate) fn rpc_settings_flag(rpc: &rrpc::node::RpcSettings) -> Vec<String> {
    if *rpc == rrpc::node::RpcSettings::default() {
        return Vec::new();
    }
    vec![
        "--rpc-settings".into(),
        serde_json::to_string(rpc).expect("RpcSettings serializes"),
    ]
}

impl Layout {
    /// The layout of `path` for the run on cluster `cluster` (its logs under
    /// `<log-dir>/<cluster>/`, created; `log-dir` defaults to `runs`). Errors: the file
    /// does not load; the log directory cannot be created.
    pub(crate) fn load(path: &Path, cluster: &str) -> anyhow::Result<Self> {
        Self::of(Topology::load(path)?, cluster)
    }

    /// [`Layout::load`] of a topology already loaded.
    pub(crate) fn of(topo: Topology, cluster: &str) -> anyhow::Result<Self> {
        let l = Self::planned(topo, cluster);
        std::fs::create_dir_all(&l.logs)
            .with_context(|| format!("creating the log directory {}", l.logs.display()))?;
        Ok(l)
    }

    /// [`Layout::of`] without creating the log directory (a dry run).
    pub(crate) fn planned(topo: Topology, cluster: &str) -> Self {
        let logs = log_dir_of(&topo, cluster);
        let rpc = topo.rpc_settings();
        Self { topo, logs, rpc }
    }

    /// The layout with `rpc` as the services' rrpc settings instead of the topology's
    /// (`txn-bench --config`'s `[runtime]` and `[server]` over the topology's).
    pub(crate) fn with_rpc(mut self, rpc: rrpc::node::RpcSettings) -> Self {
        self.rpc = rpc;
        self
    }

    /// Where the run's logs go.
    pub(crate) fn log_dir(&self) -> &Path {
        &self.logs
    }

    /// The topology it places the services of.
    pub(crate) fn topology(&self) -> &Topology {
        &self.topo
    }

    /// The `index`-th service of `kind`. Errors: the file has none.
    pub(crate) fn service(&self, kind: RoleKind, index: usize) -> anyhow::Result<Planned> {
        let role = self
            .topo
            .role(kind, index)
            .with_context(|| format!("{}: no {kind}:{index} in the topology", self.topo.path))?;
        let host = self.topo.host_of(role);
        Ok(Planned {
            place: place_of(&self.topo, host),
            node: role.node.0,
            listen: self.topo.addr_of(role),
            flags: {
                let mut f = flags_of(&self.topo, host);
                if let Some(c) = role.cpus.as_ref().or(host.cpus.as_ref()) {
                    f.extend(["--cpus".into(), c.clone()]);
                }
                if let Some(n) = role.numa.or(host.numa) {
                    f.extend(["--numa".into(), n.to_string()]);
                }
                f.extend(rpc_settings_flag(&self.rpc));
                f
            },
            log: self
                .logs
                .join(format!("{}.{}.{}.log", host.name, kind, index)),
        })
    }

    /// Where coordinator process `i` runs (the file's coordinator hosts in turn): its
    /// place, its host's RDMA device and GID index, and its CPUs. Errors: the file
    /// names no coordinator host.
    pub(crate) fn coordinator(&self, i: usize) -> anyhow::Result<CoordinatorPlace> {
        let n = self.topo.coordinators.len();
        anyhow::ensure!(
            n > 0,
            "{}: coordinator processes need [coordinators] hosts",
            self.topo.path
        );
        let role = &self.topo.coordinators[i % n];
        let host = self.topo.host_of(role);
        let gid = match host.gid_index {
            GidIndex::Index(g) => Some(g),
            GidIndex::Auto => None,
        };
        Ok(CoordinatorPlace {
            place: place_of(&self.topo, host),
            device: host.rdma_device.clone(),
            gid_index: gid,
            cpus: role.cpus.clone().or_else(|| host.cpus.clone()),
            numa: role.numa.or(host.numa),
        })
    }

    /// The address services on other hosts reach this process's host at (the first
    /// coordinator host's control address), for the etcd the run starts; loopback
    /// when every host is this one's loopback. Errors: the address does not resolve.
    pub(crate) fn driver_ip(&self) -> anyhow::Result<std::net::IpAddr> {
        let Some(c) = self.topo.coordinators.first() else {
            return Ok(std::net::Ipv4Addr::LOCALHOST.into());
        };
        let h = &self.topo.host_of(c).ctrl_ip;
        Ok(rrpc::service::parse_addr(&format!("{h}:0"))
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("{}: coordinator host {h}", self.topo.path))?
            .ip())
    }
}

/// Where the logs of cluster `cluster` of `topo` go: `<log-dir>/<cluster>/` (`log-dir`
/// defaults to `runs`, relative to the working directory).
pub(crate) fn log_dir_of(topo: &Topology, cluster: &str) -> PathBuf {
    topo.log_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("runs"))
        .join(cluster)
}

/// Whether `host` is this machine's loopback (started directly, not over ssh).
fn is_loopback(host: &Host) -> bool {
    host.ctrl_ip == "localhost"
        || host
            .ctrl_ip
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// How `host` is reached: directly when its control address is a loopback one and it
/// names no `ssh` destination, else over ssh (its `ssh` key with `{host}` replaced by
/// its name, or its name), the binaries in the file's `bin-dir` (default: where they
/// are here).
fn place_of(topo: &Topology, host: &Host) -> Place {
    if is_loopback(host) && host.ssh.is_none() {
        return Place::Local;
    }
    let target = host
        .ssh
        .as_deref()
        .map_or_else(|| host.name.clone(), |t| t.replace("{host}", &host.name));
    Place::Ssh {
        target,
        bin_dir: topo
            .bin_dir
            .clone()
            .unwrap_or_else(crate::launcher::default_bin_dir),
    }
}

/// The host's fabric flags.
fn flags_of(topo: &Topology, host: &Host) -> Vec<String> {
    let mut f = vec!["--fabric".to_string(), topo.fabric.to_string()];
    if let Some(d) = &host.rdma_device {
        f.extend(["--rdma-device".into(), d.clone()]);
    }
    if let Some(p) = host.rdma_port {
        f.extend(["--rdma-port".into(), p.to_string()]);
    }
    if let GidIndex::Index(i) = host.gid_index {
        f.extend(["--gid-index".into(), i.to_string()]);
    }
    if let Some(t) = host.tclass {
        f.extend(["--tclass".into(), t.to_string()]);
    }
    if let Some(s) = host.sl {
        f.extend(["--sl".into(), s.to_string()]);
    }
    f
}

/// A dry run ended after printing the command lines (not a failure).
#[derive(Debug)]
pub(crate) struct DryRunDone;

impl std::fmt::Display for DryRunDone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("dry run: nothing started")
    }
}

impl std::error::Error for DryRunDone {}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    /// With --hosts, the file's [runtime] becomes the coordinators' runtime settings
    /// (and goes to coordinator processes in their run spec).
    #[test]
    fn the_topology_files_runtime_reaches_the_coordinators() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/examples");
        let text = std::fs::read_to_string(format!("{dir}/local.toml")).unwrap()
            + "\n[runtime]\ncall-timeout-ms = 1234\n";
        let p = std::env::temp_dir().join(format!("hosts-rt-{}.toml", std::process::id()));
        std::fs::write(&p, text).unwrap();
        let mut args = Args::parse_from(["txn-bench", "--hosts", p.to_str().unwrap()]);
        assert!(args.rpc.is_none());
        apply(&mut args).unwrap();
        let rt = args.runtime();
        assert_eq!(rt.call_timeout, std::time::Duration::from_millis(1234));
        let spec: Args = serde_json::from_str(&serde_json::to_string(&args).unwrap()).unwrap();
        assert_eq!(spec.runtime(), rt, "a coordinator process's run spec");
        let mut plain = Args::parse_from(["txn-bench"]);
        apply(&mut plain).unwrap();
        assert!(plain.rpc.is_none(), "without --hosts: the defaults");
        std::fs::remove_file(&p).unwrap();
    }

    /// A coordinator process's `--cpus`: its `[coordinators]` entry's, else its host's.
    #[test]
    fn a_coordinator_takes_its_entrys_cpus_else_its_hosts() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/examples");
        let text = std::fs::read_to_string(format!("{dir}/cloudlab-4.toml")).unwrap();
        let l = Layout::planned(Topology::parse(&text, "cloudlab-4.toml").unwrap(), "x");
        let c = l.coordinator(1).unwrap();
        assert_eq!(c.cpus.as_deref(), Some("2-15"));
        assert_eq!(c.numa, Some(0), "[defaults] numa");
        assert!(matches!(c.place, Place::Ssh { ref target, .. } if target.contains("node3")));
        let text = text.replace("cpus = \"2-15\"\n", "");
        let l = Layout::planned(Topology::parse(&text, "c.toml").unwrap(), "x");
        // node2 has cpus = "0-15", node3 "16-31".
        assert_eq!(l.coordinator(0).unwrap().cpus.as_deref(), Some("0-15"));
        assert_eq!(l.coordinator(1).unwrap().cpus.as_deref(), Some("16-31"));
    }
}
