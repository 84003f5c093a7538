//! The topology file (`cluster.toml`): which hosts a cluster has, how each reaches the
//! fabric, and which roles (memory nodes, lock service, timestamp oracle, TSO proxies,
//! coordinator processes) run where, on which port and as which node id.
//!
//! It is kept apart from an experiment's settings (workload, protocol, duration): the
//! same topology serves many experiments. Every process can find its own role in it
//! (`--hosts FILE --as ROLE[:i]|auto`, see `rrpc::service`, feature `service`), so a cluster starts by
//! hand, with pdsh or tmux, under `srun`, or from a launcher.
//!
//! The file is plain TOML with kebab-case keys:
//!
//! ```toml
//! name   = "exp1"             # the cluster name (--cluster)
//! fabric = "verbs"            # "shm": every host must be local
//! bin-dir = "/opt/rrpc/bin"   # optional, for launchers
//! log-dir = "runs"            # optional, for launchers
//! etcd = ["http://10.10.1.1:2379"]
//! secret-file = "cluster.secret"  # the cluster secret (relative to this file), or
//!                                 # secret = "..." inline (see rrpc::auth)
//!
//! [defaults]                  # any host key but ctrl-ip
//! rdma-device = "mlx5_0"
//! gid-index   = "auto"        # or a number
//!
//! [hosts.node0]
//! ctrl-ip = "10.10.1.1"       # an IP address or a host name
//!
//! [[memnode]]                 # memnode i is node 10 + i, partition i of all
//! host = "node0"
//! port = 7010
//!
//! [lockd]                     # lockd's own keys (its --config file's) may follow
//! host = "node0"
//! port = 7002
//!
//! [coordinators]
//! hosts = ["node0"]
//!
//! [runtime]                   # rrpc::runtime::RuntimeConfig
//! [server]                    # rrpc::server::ServerConfig
//! ```
//!
//! [`Topology::load`] checks the file as a whole (unknown hosts, duplicate node ids, two
//! roles on one host and port, a shm cluster with a remote host, the memory nodes'
//! partitions) and every error names the file, the table and the key.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::auth::{ClusterSecret, SecretError};
use crate::fabric::FabricKind;
use crate::runtime::RuntimeConfig;
use crate::server::ServerConfig;
use crate::NodeId;

/// Node id of the lock service (`lockd`) unless the file names another.
pub const NODE_LOCKD: u32 = 2;
/// Node id of the timestamp oracle (`tso`) unless the file names another.
pub const NODE_TSO: u32 = 3;
/// TSO proxy `i` is node `NODE_TSO_PROXY + i` unless the file names another.
pub const NODE_TSO_PROXY: u32 = 4;
/// Memory node `i` is node `NODE_MEMNODE + i` unless the file names another.
pub const NODE_MEMNODE: u32 = 10;
/// Node id of a driver's own coordinators (`txn-bench`'s threads).
pub const NODE_CN: u32 = 100;
/// Coordinator process `i` is node `NODE_CNODE + i` unless `[coordinators] first-node`
/// says otherwise.
pub const NODE_CNODE: u32 = NODE_CN + 1;

/// Largest node id a topology may use: lock words tag their holder with the node id in
/// 16 bits, and membership names nodes by 16-bit ids.
pub const MAX_NODE_ID: u32 = u16::MAX as u32;

/// What went wrong loading a topology file or finding a role in it. Each variant names
/// the file; [`TopologyError::Invalid`] also the table and key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TopologyError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not TOML, or a key has the wrong type or is unknown.
    #[error("{path}: {msg}")]
    Parse {
        /// The file.
        path: String,
        /// The parser's message (with line and column).
        msg: String,
    },
    /// The file parsed but says something impossible.
    #[error("{path}: {table}: {msg}")]
    Invalid {
        /// The file.
        path: String,
        /// The table, e.g. `[[memnode]] 1` or `[hosts.node0]`.
        table: String,
        /// What is wrong, naming the key.
        msg: String,
    },
    /// `--as` names no role of the file, or `--as auto` found zero or several.
    #[error("{path}: --as {spec}: {msg}")]
    Role {
        /// The file.
        path: String,
        /// What `--as` said.
        spec: String,
        /// Why it does not resolve.
        msg: String,
    },
}

/// Which GID of the port a host uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GidIndex {
    /// The port's RoCEv2 IPv4-mapped GID, else its first (InfiniBand).
    #[default]
    Auto,
    /// This index of the port's GID table.
    Index(u32),
}

impl<'de> Deserialize<'de> for GidIndex {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u32),
            S(String),
        }
        match Raw::deserialize(d) {
            Ok(Raw::N(n)) => Ok(Self::Index(n)),
            Ok(Raw::S(s)) if s == "auto" => Ok(Self::Auto),
            _ => Err(serde::de::Error::custom(
                "gid-index: expected a GID index (0 to 2^32-1) or \"auto\"",
            )),
        }
    }
}

/// The host keys, as written in `[defaults]` and `[hosts.NAME]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
struct HostKeys {
    ctrl_ip: Option<String>,
    ssh: Option<String>,
    rdma_device: Option<String>,
    rdma_port: Option<u8>,
    gid_index: Option<GidIndex>,
    tclass: Option<u8>,
    sl: Option<u8>,
    numa: Option<u32>,
    cpus: Option<String>,
}

/// A host of the cluster, with `[defaults]` applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    /// Its name in the file (`[hosts.NAME]`); `--as auto` matches it against the
    /// machine's host name.
    pub name: String,
    /// The control-plane (bootstrap, TCP) address: an IP address or a host name. It may
    /// differ from the RDMA interface's address.
    pub ctrl_ip: String,
    /// How a launcher reaches it over ssh (`{host}` replaced by the name); `None`: the name.
    pub ssh: Option<String>,
    /// RDMA device (verbs), e.g. `mlx5_0`; `None`: the first device.
    pub rdma_device: Option<String>,
    /// RDMA port (verbs, from 1); `None`: 1.
    pub rdma_port: Option<u8>,
    /// GID index (verbs).
    pub gid_index: GidIndex,
    /// RoCE traffic class (the GRH's, DSCP in its upper 6 bits); `None`: 0.
    pub tclass: Option<u8>,
    /// InfiniBand service level, 0 to 15; `None`: 0.
    pub sl: Option<u8>,
    /// NUMA node the host's processes should run on.
    pub numa: Option<u32>,
    /// CPUs the host's processes should run on, as a list such as `2-15,20`.
    pub cpus: Option<String>,
}

/// What kind of process a role is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RoleKind {
    /// A memory node (`[[memnode]]`, binary `memnode`).
    Memnode,
    /// The lock service (`[lockd]`, binary `lockd`).
    Lockd,
    /// The timestamp oracle (`[tso]`, binary `tso`).
    Tso,
    /// A TSO proxy (`[[tso-proxy]]`, binary `tso-proxy`).
    TsoProxy,
    /// A coordinator process (`[coordinators] hosts`, binary `cnode`).
    Coordinator,
}

impl RoleKind {
    const ALL: [RoleKind; 5] = [
        Self::Memnode,
        Self::Lockd,
        Self::Tso,
        Self::TsoProxy,
        Self::Coordinator,
    ];

    /// The role's name in `--as` (`memnode`, `lockd`, `tso`, `tso-proxy`, `coordinator`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Memnode => "memnode",
            Self::Lockd => "lockd",
            Self::Tso => "tso",
            Self::TsoProxy => "tso-proxy",
            Self::Coordinator => "coordinator",
        }
    }

    /// The binary that runs it.
    pub fn binary(self) -> &'static str {
        match self {
            Self::Coordinator => "cnode",
            k => k.name(),
        }
    }

    /// Whether the file may hold several (`[[memnode]]`) or at most one (`[lockd]`).
    pub fn many(self) -> bool {
        matches!(self, Self::Memnode | Self::TsoProxy | Self::Coordinator)
    }

    fn table(self) -> &'static str {
        match self {
            Self::Memnode => "[[memnode]]",
            Self::Lockd => "[lockd]",
            Self::Tso => "[tso]",
            Self::TsoProxy => "[[tso-proxy]]",
            Self::Coordinator => "[coordinators]",
        }
    }
}

impl fmt::Display for RoleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A role table as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct RoleKeys {
    host: String,
    port: u16,
    #[serde(default)]
    node: Option<u32>,
    #[serde(default)]
    numa: Option<u32>,
    #[serde(default)]
    cpus: Option<String>,
    /// Every other key: the role's own settings.
    #[serde(flatten)]
    settings: toml::Table,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
struct CoordinatorKeys {
    hosts: Vec<String>,
    first_node: Option<u32>,
    numa: Option<u32>,
    cpus: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct Raw {
    name: String,
    fabric: FabricKind,
    #[serde(default)]
    bin_dir: Option<PathBuf>,
    #[serde(default)]
    log_dir: Option<PathBuf>,
    #[serde(default)]
    etcd: Vec<String>,
    #[serde(default)]
    secret_file: Option<PathBuf>,
    #[serde(default)]
    secret: Option<String>,
    #[serde(default)]
    defaults: HostKeys,
    #[serde(default)]
    hosts: BTreeMap<String, HostKeys>,
    #[serde(default)]
    memnode: Vec<RoleKeys>,
    #[serde(default)]
    lockd: Option<RoleKeys>,
    #[serde(default)]
    tso: Option<RoleKeys>,
    #[serde(default)]
    tso_proxy: Vec<RoleKeys>,
    #[serde(default)]
    coordinators: CoordinatorKeys,
    #[serde(default)]
    runtime: RuntimeConfig,
    #[serde(default)]
    server: ServerConfig,
}

/// One process of the cluster: its kind, its place and its settings.
#[derive(Clone, Debug, PartialEq)]
pub struct Role {
    /// What it is.
    pub kind: RoleKind,
    /// Its position among the roles of its kind (`memnode:1` is the second
    /// `[[memnode]]`); 0 for `[lockd]` and `[tso]`.
    pub index: usize,
    /// The host it runs on (a key of [`Topology::hosts`]).
    pub host: String,
    /// Its bootstrap (control-plane) TCP port; 0 for coordinators (any free port).
    pub port: u16,
    /// Its node id.
    pub node: NodeId,
    /// NUMA node (the role's own; its host's is [`Host::numa`]).
    pub numa: Option<u32>,
    /// CPU list (the role's own; its host's is [`Host::cpus`], which a service falls
    /// back to).
    pub cpus: Option<String>,
    /// The role's other keys: `lockd`'s and `tso`'s settings-file keys, `tso-proxy`'s,
    /// and `memnode`'s long flags.
    pub settings: toml::Table,
}

impl Role {
    /// `kind:index`, as `--as` takes it.
    pub fn spec(&self) -> String {
        format!("{}:{}", self.kind, self.index)
    }

    /// The table the role came from, for messages: `[[memnode]] 1`, `[lockd]`.
    pub fn table(&self) -> String {
        if self.kind.many() {
            format!("{} {}", self.kind.table(), self.index)
        } else {
            self.kind.table().to_string()
        }
    }
}

/// A loaded and checked topology file.
#[derive(Clone, Debug)]
pub struct Topology {
    /// Where it was read from (for messages).
    pub path: String,
    /// Cluster name (every process's `--cluster`).
    pub name: String,
    /// Fabric backend of every process.
    pub fabric: FabricKind,
    /// Where the binaries are, the same path on every host (launchers).
    pub bin_dir: Option<PathBuf>,
    /// Where launchers put the processes' logs.
    pub log_dir: Option<PathBuf>,
    /// etcd endpoints of the cluster's membership.
    pub etcd: Vec<String>,
    /// The file holding the cluster secret (`secret-file`, relative to the topology
    /// file's directory; every host has it at this path); see [`crate::auth`].
    pub secret_file: Option<PathBuf>,
    /// The cluster secret given inline (`secret`): the file itself must then be kept
    /// from other users.
    pub secret: Option<ClusterSecret>,
    /// The hosts, by name.
    pub hosts: BTreeMap<String, Host>,
    /// The memory nodes, memory node `i` holding partition `i` unless its table says
    /// `partition`.
    pub memnodes: Vec<Role>,
    /// The lock service.
    pub lockd: Option<Role>,
    /// The timestamp oracle.
    pub tso: Option<Role>,
    /// The TSO proxies.
    pub tso_proxies: Vec<Role>,
    /// The coordinator processes, one per `[coordinators] hosts` entry.
    pub coordinators: Vec<Role>,
    /// Runtime settings of every process (`[runtime]`).
    pub runtime: RuntimeConfig,
    /// RPC server settings of every process (`[server]`).
    pub server: ServerConfig,
}

impl Topology {
    /// Read and check the topology file at `path`.
    ///
    /// Errors: [`TopologyError::Read`], [`TopologyError::Parse`] (not TOML, a wrong type,
    /// an unknown key) and [`TopologyError::Invalid`] (see [`Topology::parse`]).
    pub fn load(path: impl AsRef<Path>) -> Result<Self, TopologyError> {
        let p = path.as_ref();
        let text = std::fs::read_to_string(p).map_err(|source| TopologyError::Read {
            path: p.display().to_string(),
            source,
        })?;
        Self::parse(&text, &p.display().to_string())
    }

    /// Parse and check a topology from `text`; `path` names it in errors.
    ///
    /// Errors: [`TopologyError::Parse`]; [`TopologyError::Invalid`] for an empty or
    /// path-like name, a host without `ctrl-ip` (or `[defaults]` with one), `sl` above
    /// 15, `rdma-port` 0, a bad CPU list, a role on an unknown host or on port 0, two
    /// roles with one node id or on one host and port, a node id above
    /// [`MAX_NODE_ID`], `fabric = "shm"` with a host whose `ctrl-ip` is not local,
    /// memory nodes whose partitions are not each of `0..partitions` once, or whose
    /// `replicas` differ or exceed the partitions, and invalid `[runtime]`/`[server]`.
    pub fn parse(text: &str, path: &str) -> Result<Self, TopologyError> {
        let raw: Raw = toml::from_str(text).map_err(|e| TopologyError::Parse {
            path: path.into(),
            msg: e.to_string().trim_end().to_string(),
        })?;
        let invalid = |table: &str, msg: String| TopologyError::Invalid {
            path: path.into(),
            table: table.into(),
            msg,
        };
        if raw.name.is_empty() || raw.name.contains(['/', '\0']) || raw.name.starts_with('.') {
            return Err(invalid(
                "top level",
                format!(
                    "name = {:?}: need a non-empty name without '/' (it names shm directories)",
                    raw.name
                ),
            ));
        }
        if raw.defaults.ctrl_ip.is_some() {
            return Err(invalid(
                "[defaults]",
                "ctrl-ip: each host has its own; set it in [hosts.NAME]".into(),
            ));
        }
        check_host_keys(&raw.defaults).map_err(|m| invalid("[defaults]", m))?;
        let mut hosts = BTreeMap::new();
        for (name, h) in &raw.hosts {
            let table = format!("[hosts.{name}]");
            check_host_keys(h).map_err(|m| invalid(&table, m))?;
            let d = &raw.defaults;
            let Some(ctrl_ip) = h.ctrl_ip.clone() else {
                return Err(invalid(&table, "ctrl-ip: missing".into()));
            };
            if ctrl_ip.is_empty() {
                return Err(invalid(&table, "ctrl-ip: empty".into()));
            }
            if raw.fabric == FabricKind::Shm && !is_local(&ctrl_ip) {
                return Err(invalid(
                    &table,
                    format!(
                        "ctrl-ip = {ctrl_ip:?}: fabric = \"shm\" runs on one host, so every \
                         host must be local (127.0.0.1, ::1 or localhost); use fabric = \"verbs\""
                    ),
                ));
            }
            hosts.insert(
                name.clone(),
                Host {
                    name: name.clone(),
                    ctrl_ip,
                    ssh: h.ssh.clone().or_else(|| d.ssh.clone()),
                    rdma_device: h.rdma_device.clone().or_else(|| d.rdma_device.clone()),
                    rdma_port: h.rdma_port.or(d.rdma_port),
                    gid_index: h.gid_index.or(d.gid_index).unwrap_or_default(),
                    tclass: h.tclass.or(d.tclass),
                    sl: h.sl.or(d.sl),
                    numa: h.numa.or(d.numa),
                    cpus: h.cpus.clone().or_else(|| d.cpus.clone()),
                },
            );
        }

        let role = |kind: RoleKind, index: usize, k: &RoleKeys, default_node: u32| {
            let r = Role {
                kind,
                index,
                host: k.host.clone(),
                port: k.port,
                node: NodeId(k.node.unwrap_or(default_node)),
                numa: k.numa,
                cpus: k.cpus.clone(),
                settings: k.settings.clone(),
            };
            if k.port == 0 {
                return Err(invalid(
                    &r.table(),
                    "port = 0: give a fixed port, so that every address is known before \
                     anything starts"
                        .into(),
                ));
            }
            Ok(r)
        };
        let mut memnodes = Vec::new();
        for (i, k) in raw.memnode.iter().enumerate() {
            memnodes.push(role(
                RoleKind::Memnode,
                i,
                k,
                NODE_MEMNODE.saturating_add(i as u32),
            )?);
        }
        let lockd = raw
            .lockd
            .as_ref()
            .map(|k| role(RoleKind::Lockd, 0, k, NODE_LOCKD))
            .transpose()?;
        let tso = raw
            .tso
            .as_ref()
            .map(|k| role(RoleKind::Tso, 0, k, NODE_TSO))
            .transpose()?;
        let mut tso_proxies = Vec::new();
        for (i, k) in raw.tso_proxy.iter().enumerate() {
            tso_proxies.push(role(
                RoleKind::TsoProxy,
                i,
                k,
                NODE_TSO_PROXY.saturating_add(i as u32),
            )?);
        }
        let c = &raw.coordinators;
        let first = c.first_node.unwrap_or(NODE_CNODE);
        let coordinators = c
            .hosts
            .iter()
            .enumerate()
            .map(|(i, h)| Role {
                kind: RoleKind::Coordinator,
                index: i,
                host: h.clone(),
                port: 0,
                node: NodeId(first.saturating_add(i as u32)),
                numa: c.numa,
                cpus: c.cpus.clone(),
                settings: toml::Table::new(),
            })
            .collect();
        if let Some(cpus) = &c.cpus {
            parse_cpu_list(cpus).map_err(|m| invalid("[coordinators]", format!("cpus: {m}")))?;
        }

        if raw.secret.is_some() && raw.secret_file.is_some() {
            return Err(invalid(
                "top level",
                "secret and secret-file: give the cluster secret one way".into(),
            ));
        }
        let secret = raw
            .secret
            .as_deref()
            .map(|s| ClusterSecret::from_bytes(s.as_bytes()))
            .transpose()
            .map_err(|e| invalid("top level", format!("secret: {e}")))?;
        let secret_file = raw.secret_file.map(|f| match Path::new(path).parent() {
            Some(dir) if f.is_relative() => dir.join(f),
            _ => f,
        });
        let topo = Self {
            path: path.into(),
            name: raw.name,
            fabric: raw.fabric,
            bin_dir: raw.bin_dir,
            log_dir: raw.log_dir,
            etcd: raw.etcd,
            secret_file,
            secret,
            hosts,
            memnodes,
            lockd,
            tso,
            tso_proxies,
            coordinators,
            runtime: raw.runtime,
            server: raw.server,
        };
        topo.check_roles()?;
        topo.runtime
            .validate()
            .map_err(|e| invalid("[runtime]", e.to_string()))?;
        topo.server
            .validate()
            .map_err(|e| invalid("[server]", e.to_string()))?;
        Ok(topo)
    }

    /// The cluster secret the file gives: `secret`, or the contents of `secret-file`
    /// (read now); `None` when it gives none.
    ///
    /// Errors: the secret file's ([`SecretError`]).
    pub fn cluster_secret(&self) -> Result<Option<ClusterSecret>, SecretError> {
        if let Some(s) = &self.secret {
            return Ok(Some(s.clone()));
        }
        self.secret_file
            .as_ref()
            .map(ClusterSecret::from_file)
            .transpose()
    }

    fn invalid(&self, table: String, msg: String) -> TopologyError {
        TopologyError::Invalid {
            path: self.path.clone(),
            table,
            msg,
        }
    }

    /// Unknown hosts, node ids, ports, CPU lists and the memory nodes' partitions.
    fn check_roles(&self) -> Result<(), TopologyError> {
        let mut ids: HashMap<NodeId, String> = HashMap::new();
        let mut ports: HashMap<(&str, u16), String> = HashMap::new();
        for r in self.roles() {
            let table = r.table();
            if !self.hosts.contains_key(&r.host) {
                let key = if r.kind == RoleKind::Coordinator {
                    "hosts"
                } else {
                    "host"
                };
                let known: Vec<&str> = self.hosts.keys().map(String::as_str).collect();
                return Err(self.invalid(
                    table,
                    format!(
                        "{key}: {:?} is not a host of the file (known: {})",
                        r.host,
                        if known.is_empty() {
                            "none; add [hosts.NAME] tables".to_string()
                        } else {
                            known.join(", ")
                        }
                    ),
                ));
            }
            if r.node.get() > MAX_NODE_ID {
                return Err(self.invalid(
                    table,
                    format!("node = {}: node ids go up to {MAX_NODE_ID}", r.node),
                ));
            }
            if let Some(other) = ids.insert(r.node, table.clone()) {
                return Err(self.invalid(
                    table,
                    format!(
                        "node {} is also {other}'s; give one of them another `node = ID`",
                        r.node
                    ),
                ));
            }
            if r.port != 0 {
                if let Some(other) = ports.insert((&r.host, r.port), table.clone()) {
                    return Err(self.invalid(
                        table,
                        format!(
                            "port {} on host {} is also {other}'s; each role on a host needs \
                             its own port",
                            r.port, r.host
                        ),
                    ));
                }
            }
            if let Some(c) = &r.cpus {
                parse_cpu_list(c).map_err(|m| self.invalid(table.clone(), format!("cpus: {m}")))?;
            }
        }
        self.check_partitions()
    }

    fn check_partitions(&self) -> Result<(), TopologyError> {
        let n = self.memnodes.len() as u64;
        let mut seen: BTreeMap<u64, usize> = BTreeMap::new();
        let mut replicas: Option<(u64, usize)> = None;
        for m in &self.memnodes {
            let int = |key: &str| -> Result<Option<u64>, TopologyError> {
                match m.settings.get(key) {
                    None => Ok(None),
                    Some(toml::Value::Integer(v)) if *v >= 0 => Ok(Some(*v as u64)),
                    Some(v) => Err(self.invalid(
                        m.table(),
                        format!(
                            "{key}: expected a non-negative integer, not {}",
                            v.type_str()
                        ),
                    )),
                }
            };
            let parts = int("partitions")?.unwrap_or(n);
            if parts != n {
                return Err(self.invalid(
                    m.table(),
                    format!(
                        "partitions = {parts}, but the file has {n} [[memnode]] tables: \
                         each partition lives on one memory node"
                    ),
                ));
            }
            let p = int("partition")?.unwrap_or(m.index as u64);
            if p >= n {
                return Err(self.invalid(
                    m.table(),
                    format!(
                        "partition = {p}: the {n} memory nodes hold partitions 0 to {}",
                        n - 1
                    ),
                ));
            }
            if let Some(other) = seen.insert(p, m.index) {
                return Err(self.invalid(
                    m.table(),
                    format!("partition {p} is also held by [[memnode]] {other}"),
                ));
            }
            if let Some(r) = int("replicas")? {
                if r == 0 || r > n {
                    return Err(self.invalid(
                        m.table(),
                        format!(
                            "replicas = {r}: need 1 to {n} (each copy of a partition on \
                             another memory node)"
                        ),
                    ));
                }
                match replicas {
                    Some((r0, i)) if r0 != r => {
                        return Err(self.invalid(
                            m.table(),
                            format!("replicas = {r}, but [[memnode]] {i} says {r0}"),
                        ))
                    }
                    _ => replicas = Some((r, m.index)),
                }
            }
        }
        if let Some((_, i)) = replicas {
            // Every memory node must agree, so one naming it means all must.
            if let Some(m) = self
                .memnodes
                .iter()
                .find(|m| !m.settings.contains_key("replicas"))
            {
                return Err(self.invalid(
                    m.table(),
                    format!("replicas: missing, but [[memnode]] {i} sets it; set it on every memory node"),
                ));
            }
        }
        Ok(())
    }

    /// Every role of the file: memory nodes, lockd, tso, TSO proxies, coordinators.
    pub fn roles(&self) -> impl Iterator<Item = &Role> {
        self.memnodes
            .iter()
            .chain(self.lockd.iter())
            .chain(self.tso.iter())
            .chain(self.tso_proxies.iter())
            .chain(self.coordinators.iter())
    }

    /// The role `kind:index`, if the file has it.
    pub fn role(&self, kind: RoleKind, index: usize) -> Option<&Role> {
        match kind {
            RoleKind::Memnode => self.memnodes.get(index),
            RoleKind::Lockd => self.lockd.as_ref().filter(|_| index == 0),
            RoleKind::Tso => self.tso.as_ref().filter(|_| index == 0),
            RoleKind::TsoProxy => self.tso_proxies.get(index),
            RoleKind::Coordinator => self.coordinators.get(index),
        }
    }

    /// The host a role runs on.
    pub fn host_of(&self, role: &Role) -> &Host {
        // Checked at load: every role's host is in the file.
        &self.hosts[&role.host]
    }

    /// The role's bootstrap address, `ctrl-ip:port` (an IPv6 address in brackets); the
    /// host part may be a host name.
    pub fn addr_of(&self, role: &Role) -> String {
        let ip = &self.host_of(role).ctrl_ip;
        if ip.parse::<std::net::Ipv6Addr>().is_ok() {
            format!("[{ip}]:{}", role.port)
        } else {
            format!("{ip}:{}", role.port)
        }
    }

    /// Find the role `--as` names: `ROLE` or `ROLE:i` (`ROLE` alone is `ROLE:0`), with
    /// ROLE one of `memnode`, `lockd`, `tso`, `tso-proxy`, `coordinator`; or `auto`: the
    /// only role of the host whose name is `hostname` (or its first label, so that
    /// `node0.exp.cloudlab.us` finds `[hosts.node0]`), or whose `ctrl-ip` is
    /// `hostname`.
    ///
    /// Errors: [`TopologyError::Role`] for an unknown role name or index, a host name the
    /// file does not know, and a host with no role or several.
    pub fn resolve(&self, spec: &str, hostname: &str) -> Result<&Role, TopologyError> {
        let err = |msg: String| TopologyError::Role {
            path: self.path.clone(),
            spec: spec.into(),
            msg,
        };
        if spec == "auto" {
            let short = hostname.split('.').next().unwrap_or(hostname);
            let host = self
                .hosts
                .get(hostname)
                .or_else(|| self.hosts.get(short))
                .or_else(|| self.hosts.values().find(|h| h.ctrl_ip == hostname))
                .ok_or_else(|| {
                    err(format!(
                        "this machine is {hostname:?}, which is not a host of the file (hosts: {})",
                        self.hosts.keys().cloned().collect::<Vec<_>>().join(", ")
                    ))
                })?;
            let here: Vec<&Role> = self.roles().filter(|r| r.host == host.name).collect();
            return match here.as_slice() {
                [one] => Ok(one),
                [] => Err(err(format!(
                    "host {} runs no role; give --as ROLE[:i] of another host's role",
                    host.name
                ))),
                many => Err(err(format!(
                    "host {} runs {} roles ({}); pick one with --as ROLE[:i]",
                    host.name,
                    many.len(),
                    many.iter().map(|r| r.spec()).collect::<Vec<_>>().join(", ")
                ))),
            };
        }
        let (name, index) = match spec.split_once(':') {
            Some((n, i)) => (
                n,
                i.parse::<usize>()
                    .map_err(|_| err(format!("{i:?} is not an index (ROLE:i, i from 0)")))?,
            ),
            None => (spec, 0),
        };
        let kind = RoleKind::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| {
                err(format!(
                    "no role {name:?}; roles are {} (with :i), or auto",
                    RoleKind::ALL.map(RoleKind::name).join(", ")
                ))
            })?;
        self.role(kind, index).ok_or_else(|| {
            let n = self.roles().filter(|r| r.kind == kind).count();
            err(match n {
                0 => format!("the file has no {} table", kind.table()),
                1 => format!("the file has one {kind}: {kind}:0"),
                n => format!("the file has {n} {kind}s: {kind}:0 to {kind}:{}", n - 1),
            })
        })
    }

    /// The role's settings as `T` (a service's settings-file struct), with the error
    /// naming the file and the role's table.
    ///
    /// Errors: [`TopologyError::Invalid`] for an unknown key or a wrong type.
    pub fn settings<T: DeserializeOwned>(&self, role: &Role) -> Result<T, TopologyError> {
        T::deserialize(role.settings.clone()).map_err(|e| self.invalid(role.table(), e.to_string()))
    }

    /// The rrpc settings of every process of the cluster: `[runtime]` and `[server]`.
    pub fn rpc_settings(&self) -> crate::node::RpcSettings {
        crate::node::RpcSettings {
            runtime: self.runtime.clone(),
            server: self.server.clone(),
        }
    }
}

/// The machine's host name (`gethostname`), which `--as auto` looks up.
///
/// Errors: the system call's.
pub fn machine_hostname() -> std::io::Result<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for writes of its length; gethostname NUL-terminates
    // within it or truncates (the last byte stays 0 since we pass len - 1).
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// Whether a `ctrl-ip` names this machine for sure: a loopback address or `localhost`.
fn is_local(ctrl_ip: &str) -> bool {
    ctrl_ip == "localhost"
        || ctrl_ip
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_loopback() || ip.is_unspecified())
}

fn check_host_keys(h: &HostKeys) -> Result<(), String> {
    if let Some(sl) = h.sl.filter(|&s| s > 15) {
        return Err(format!("sl = {sl}: service levels are 0 to 15"));
    }
    if h.rdma_port == Some(0) {
        return Err("rdma-port = 0: ports count from 1".into());
    }
    if let Some(c) = &h.cpus {
        parse_cpu_list(c).map_err(|m| format!("cpus: {m}"))?;
    }
    Ok(())
}

/// Parse a CPU list such as `0-3,8,10-11` (the kernel's cpuset syntax) into its CPUs,
/// ascending and without repeats.
///
/// Errors: an empty list, a part that is not a number or a range `a-b` with `a <= b`.
pub fn parse_cpu_list(s: &str) -> Result<Vec<usize>, String> {
    let mut cpus = BTreeSet::new();
    for part in s.split(',').map(str::trim) {
        let bad = || format!("{s:?}: expected CPUs such as \"0-3,8\"");
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a, b),
            None => (part, part),
        };
        let a: usize = a.trim().parse().map_err(|_| bad())?;
        let b: usize = b.trim().parse().map_err(|_| bad())?;
        if a > b || b >= 1 << 16 {
            return Err(bad());
        }
        cpus.extend(a..=b);
    }
    Ok(cpus.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = r#"
name = "t"
fabric = "verbs"
etcd = ["http://10.0.0.1:2379"]
[defaults]
rdma-device = "mlx5_0"
gid-index = "auto"
tclass = 106
[hosts.a]
ctrl-ip = "10.0.0.1"
[hosts.b]
ctrl-ip = "10.0.0.2"
rdma-device = "mlx5_1"
gid-index = 3
sl = 3
cpus = "0-3"
[[memnode]]
host = "a"
port = 7010
replicas = 2
[[memnode]]
host = "b"
port = 7010
replicas = 2
versions = 4
[lockd]
host = "a"
port = 7002
threads = 2
[tso]
host = "a"
port = 7003
[coordinators]
hosts = ["b"]
[runtime]
call-timeout-ms = 2000
"#;

    fn parse(text: &str) -> Result<Topology, TopologyError> {
        Topology::parse(text, "cluster.toml")
    }

    fn err(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    #[test]
    fn parses_hosts_defaults_roles_and_node_ids() {
        let t = parse(TWO).unwrap();
        assert_eq!((t.name.as_str(), t.fabric), ("t", FabricKind::Verbs));
        let a = &t.hosts["a"];
        assert_eq!(a.rdma_device.as_deref(), Some("mlx5_0"));
        assert_eq!(
            (a.gid_index, a.tclass, a.sl),
            (GidIndex::Auto, Some(106), None)
        );
        let b = &t.hosts["b"];
        assert_eq!(b.rdma_device.as_deref(), Some("mlx5_1"));
        assert_eq!((b.gid_index, b.sl), (GidIndex::Index(3), Some(3)));
        let nodes: Vec<(String, u32)> = t.roles().map(|r| (r.spec(), r.node.get())).collect();
        assert_eq!(
            nodes,
            [
                ("memnode:0".to_string(), NODE_MEMNODE),
                ("memnode:1".into(), NODE_MEMNODE + 1),
                ("lockd:0".into(), NODE_LOCKD),
                ("tso:0".into(), NODE_TSO),
                ("coordinator:0".into(), NODE_CNODE),
            ]
        );
        assert_eq!(t.addr_of(&t.memnodes[1]), "10.0.0.2:7010");
        assert_eq!(t.memnodes[1].settings["versions"].as_integer(), Some(4));
        assert!(!t.memnodes[1].settings.contains_key("host"));
        assert_eq!(t.runtime.call_timeout, std::time::Duration::from_secs(2));
        assert_eq!(t.etcd, ["http://10.0.0.1:2379"]);
        #[derive(Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        struct L {
            threads: u32,
        }
        let l: L = t.settings(t.lockd.as_ref().unwrap()).unwrap();
        assert_eq!(l.threads, 2);
        #[derive(Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Strict {
            locks: u32,
        }
        let e = t
            .settings::<Strict>(t.lockd.as_ref().unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cluster.toml: [lockd]") && e.contains("threads"),
            "{e}"
        );
    }

    #[test]
    fn every_validation_error_names_file_table_and_key() {
        let cases: &[(&str, &str, &[&str])] = &[
            // Unknown host.
            (
                "host = \"b\"\nport = 7010\nreplicas",
                "host = \"zz\"\nport = 7010\nreplicas",
                &["[[memnode]] 1", "host: \"zz\"", "known: a, b"],
            ),
            // Duplicate node id.
            (
                "[tso]\nhost = \"a\"\nport = 7003\n",
                "[tso]\nhost = \"a\"\nport = 7003\nnode = 2\n",
                &["[tso]", "node 2 is also [lockd]'s"],
            ),
            // Two roles on one host and port.
            (
                "[tso]\nhost = \"a\"\nport = 7003\n",
                "[tso]\nhost = \"a\"\nport = 7002\n",
                &["[tso]", "port 7002 on host a is also [lockd]'s"],
            ),
            // Partitions.
            (
                "replicas = 2\nversions",
                "replicas = 2\npartitions = 3\nversions",
                &["[[memnode]] 1", "partitions = 3", "2 [[memnode]]"],
            ),
            (
                "replicas = 2\nversions",
                "replicas = 2\npartition = 0\nversions",
                &["[[memnode]] 1", "partition 0 is also held by [[memnode]] 0"],
            ),
            (
                "replicas = 2\nversions",
                "replicas = 2\npartition = 5\nversions",
                &["partition = 5"],
            ),
            (
                "replicas = 2\nversions",
                "replicas = 3\nversions",
                &["replicas = 3: need 1 to 2"],
            ),
            (
                "replicas = 2\nversions",
                "versions",
                &[
                    "[[memnode]] 1",
                    "replicas: missing, but [[memnode]] 0 sets it",
                ],
            ),
            (
                "[lockd]\nhost",
                "[lockd]\nnode = 70000\nhost",
                &["[lockd]", "node = 70000"],
            ),
            ("sl = 3", "sl = 16", &["[hosts.b]", "sl = 16"]),
            ("cpus = \"0-3\"", "cpus = \"3-0\"", &["[hosts.b]", "cpus"]),
            ("port = 7003", "port = 0", &["[tso]", "port = 0"]),
            (
                "hosts = [\"b\"]",
                "hosts = [\"c\"]",
                &["[coordinators] 0", "hosts: \"c\""],
            ),
            (
                "[hosts.b]\nctrl-ip = \"10.0.0.2\"",
                "[hosts.b]\nctrl-ipp = \"10.0.0.2\"",
                &["cluster.toml", "ctrl-ipp"],
            ),
            ("gid-index = 3", "gid-index = \"three\"", &["gid-index"]),
            ("fabric = \"verbs\"", "fabric = \"carrier\"", &["carrier"]),
            (
                "call-timeout-ms = 2000",
                "call-timeout-ms = 0",
                &["[runtime]", "call-timeout-ms"],
            ),
            ("name = \"t\"", "name = \"a/b\"", &["name = \"a/b\""]),
            (
                "[defaults]\n",
                "[defaults]\nctrl-ip = \"1.2.3.4\"\n",
                &["[defaults]", "ctrl-ip"],
            ),
        ];
        for (from, to, want) in cases {
            assert!(TWO.contains(from), "fixture lacks {from:?}");
            let text = TWO.replacen(from, to, 1);
            if want.is_empty() {
                parse(&text).unwrap();
                continue;
            }
            let e = err(&text);
            assert!(e.starts_with("cluster.toml: "), "{e}");
            for w in *want {
                assert!(e.contains(w), "{to:?}: {e:?} lacks {w:?}");
            }
        }
        // replicas on one memory node only.
        let e = err(&TWO.replacen("replicas = 2", "replicas = 1", 1));
        assert!(
            e.contains("[[memnode]] 0") && e.contains("replicas = 2, but [[memnode]] 0 says 1"),
            "{e}"
        );
    }

    #[test]
    fn shm_needs_local_hosts() {
        let local = "name = \"l\"\nfabric = \"shm\"\n[hosts.me]\nctrl-ip = \"127.0.0.1\"\n\
                     [hosts.me2]\nctrl-ip = \"localhost\"\n[lockd]\nhost = \"me\"\nport = 7002\n";
        parse(local).unwrap();
        let e = err(&local.replace("localhost", "10.0.0.9"));
        assert!(
            e.contains("[hosts.me2]") && e.contains("fabric = \"shm\""),
            "{e}"
        );
    }

    #[test]
    fn resolves_roles_by_name_and_by_hostname() {
        let t = parse(TWO).unwrap();
        assert_eq!(
            t.resolve("memnode:1", "x").unwrap().node.get(),
            NODE_MEMNODE + 1
        );
        assert_eq!(t.resolve("lockd", "x").unwrap().kind, RoleKind::Lockd);
        assert_eq!(t.resolve("coordinator:0", "x").unwrap().port, 0);
        for (spec, want) in [
            ("memnode:2", "2 memnodes: memnode:0 to memnode:1"),
            ("lockd:1", "one lockd: lockd:0"),
            ("tso-proxy", "no [[tso-proxy]] table"),
            ("memnode:x", "not an index"),
            ("mn", "no role \"mn\""),
        ] {
            let e = t.resolve(spec, "x").unwrap_err().to_string();
            assert!(
                e.contains(&format!("--as {spec}: ")) && e.contains(want),
                "{e}"
            );
        }
        // auto: host b runs memnode:1 and coordinator:0, host a three roles.
        let e = t.resolve("auto", "b").unwrap_err().to_string();
        assert!(
            e.contains("host b runs 2 roles (memnode:1, coordinator:0)"),
            "{e}"
        );
        let e = t.resolve("auto", "nowhere").unwrap_err().to_string();
        assert!(
            e.contains("\"nowhere\", which is not a host of the file (hosts: a, b)"),
            "{e}"
        );
        let one = TWO.replace("hosts = [\"b\"]", "hosts = []");
        let t = parse(&one).unwrap();
        assert_eq!(t.resolve("auto", "b").unwrap().spec(), "memnode:1");
        assert_eq!(
            t.resolve("auto", "b.exp.cloudlab.us").unwrap().spec(),
            "memnode:1"
        );
        assert_eq!(t.resolve("auto", "10.0.0.2").unwrap().spec(), "memnode:1");
        let none = one.replace(
            "[[memnode]]\nhost = \"b\"\nport = 7010",
            "[[memnode]]\nhost = \"a\"\nport = 7011",
        );
        let t = parse(&none).unwrap();
        let e = t.resolve("auto", "b").unwrap_err().to_string();
        assert!(e.contains("host b runs no role"), "{e}");
    }

    #[test]
    fn the_example_files_load() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/examples");
        let mut seen = Vec::new();
        for name in ["local.toml", "two-hosts.toml", "cloudlab-4.toml"] {
            let t = Topology::load(format!("{dir}/{name}")).unwrap_or_else(|e| panic!("{e}"));
            seen.push((name, t.hosts.len(), t.roles().count()));
        }
        assert_eq!(
            seen,
            [
                ("local.toml", 1, 6),
                ("two-hosts.toml", 2, 5),
                ("cloudlab-4.toml", 4, 8)
            ]
        );
        let t = Topology::load(format!("{dir}/cloudlab-4.toml")).unwrap();
        assert_eq!(
            t.resolve("auto", "node0.exp.proj.emulab.net")
                .unwrap()
                .spec(),
            "memnode:0"
        );
        let t = Topology::load(format!("{dir}/two-hosts.toml")).unwrap();
        assert_eq!(t.resolve("auto", "b").unwrap().spec(), "coordinator:0");
    }

    #[test]
    fn the_cluster_secret_comes_from_a_file_beside_the_topology_or_inline() {
        let none = parse(TWO).unwrap();
        assert!(none.cluster_secret().unwrap().is_none());

        let dir = std::env::temp_dir().join(format!("rrpc-topo-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cluster.secret"), "0123456789abcdef0123\n").unwrap();
        let path = dir.join("cluster.toml");
        std::fs::write(&path, format!("secret-file = \"cluster.secret\"\n{TWO}")).unwrap();
        let t = Topology::load(&path).unwrap();
        assert_eq!(
            t.secret_file.as_deref(),
            Some(dir.join("cluster.secret").as_path())
        );
        assert_eq!(
            t.cluster_secret().unwrap(),
            Some(ClusterSecret::from_bytes(b"0123456789abcdef0123").unwrap())
        );
        std::fs::remove_file(dir.join("cluster.secret")).unwrap();
        let e = t.cluster_secret().unwrap_err().to_string();
        assert!(e.contains("cluster.secret"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);

        let t = parse(&format!(
            "secret = \"an inline secret, long enough\"\n{TWO}"
        ))
        .unwrap();
        assert!(t.cluster_secret().unwrap().is_some());
        let e = err(&format!("secret = \"short\"\n{TWO}"));
        assert!(
            e.contains("secret: cluster secret given inline: 5 bytes"),
            "{e}"
        );
        let e = err(&format!(
            "secret = \"an inline secret, long enough\"\nsecret-file = \"x\"\n{TWO}"
        ));
        assert!(e.contains("one way"), "{e}");
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-2,5, 4").unwrap(), [0, 1, 2, 4, 5]);
        for bad in ["", "a", "3-1", "1-", "1,,2"] {
            assert!(parse_cpu_list(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn hostname_is_readable() {
        assert!(!machine_hostname().unwrap().is_empty());
    }
}
