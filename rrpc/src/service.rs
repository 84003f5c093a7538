//! Start-up shared by service binaries (`memnode`, `lockd`, `tso`): the node flags every
//! service takes, logging, one-line argument errors, the `READY <addr>` line launchers
//! wait for, and waiting for SIGINT/SIGTERM. Behind the `service` feature so that
//! embedders of `rrpc` do not pull in clap, ctrlc and tracing-subscriber.
//!
//! A service finds its settings in a topology file with `--hosts FILE --as ROLE[:i]`
//! (or `--as auto`, see [`crate::topology`]): [`parse_args`] turns the role's place into
//! the node flags (`--cluster`, `--node`, `--listen`, `--fabric`, `--rdma-device`,
//! `--rdma-port`, `--gid-index`, `--tclass`, `--sl`), `--etcd` (the first endpoint) and,
//! for a memory node, `--partition`, `--partitions` and its table's other keys, each
//! only where the flag was not given on the command line or through its environment
//! variable: explicit flags win.
//!
//! The cluster secret ([`crate::auth`]) comes from `--secret-file` (`$RRPC_SECRET_FILE`),
//! else from the topology file's `secret-file` or `secret`; [`parse_args`] installs it
//! for the process, so the node's control plane admits only the cluster's processes and
//! its own control connections prove the secret.

use crate::NodeId;
use std::ffi::OsString;
use std::io::Write as _;
use std::net::{SocketAddr, ToSocketAddrs as _};
use std::path::PathBuf;
use std::sync::mpsc::Receiver;
use std::sync::OnceLock;

use crate::auth::{ClusterSecret, SecretError};
use crate::fabric::{Fabric, FabricConfig, FabricError, FabricKind};
use crate::topology::{self, Role, RoleKind, Topology, TopologyError};

/// Flags every service binary takes; `#[command(flatten)]` it into the binary's parser.
#[derive(clap::Args, Debug, Clone)]
pub struct NodeArgs {
    /// Topology file (cluster.toml) naming this process's role: the node flags default
    /// to what it says about the role (flags given explicitly win).
    #[arg(long, value_name = "FILE")]
    pub hosts: Option<PathBuf>,
    /// This process's role in --hosts: ROLE or ROLE:i (memnode:1, lockd, tso,
    /// tso-proxy:0), or auto (default): the only role of the host whose name is this
    /// machine's host name.
    #[arg(long = "as", value_name = "ROLE[:I]|auto", requires = "hosts")]
    pub as_role: Option<String>,
    /// Cluster name (shm files live under `/dev/shm/rrpc-<cluster>/`, or a hugetlbfs mount).
    #[arg(long, value_name = "NAME", default_value = "default")]
    pub cluster: String,
    /// This node's id, unique in the cluster (required unless --hosts gives it).
    #[arg(
        long,
        value_name = "ID",
        required = false,
        required_unless_present = "hosts"
    )]
    pub node: NodeId,
    /// Bootstrap (control-plane) listen address, HOST:PORT (a host name or an IP
    /// address); port 0 picks a free port. Beyond loopback, give the cluster a secret
    /// (--secret-file).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0", value_parser = parse_addr)]
    pub listen: SocketAddr,
    /// File holding the cluster secret (at least 16 bytes; trailing white space is
    /// ignored): control connections must prove it, and this node's prove it (default:
    /// the topology file's secret-file or secret, else none: unauthenticated).
    #[arg(long, value_name = "FILE", env = "RRPC_SECRET_FILE")]
    pub secret_file: Option<PathBuf>,
    /// Run this process on these CPUs only, a list such as `2-15,20` (every thread it
    /// starts inherits the set; default: $RRPC_CPUS, else wherever the kernel puts it).
    /// A topology file's `cpus` (the role's, else its host's) fills it in.
    #[arg(long, value_name = "LIST", env = "RRPC_CPUS", value_parser = parse_cpus)]
    pub cpus: Option<String>,
    /// rrpc settings of this process as JSON, `{"runtime": {...}, "server": {...}}`
    /// with the keys of a topology file's `[runtime]` and `[server]` tables
    /// (`call-timeout-ms`, `max-ring-bytes`, ...): `txn-bench --hosts` passes its file's
    /// to the services it starts. Wins over --hosts' tables (default: those, else the
    /// defaults).
    #[arg(long = "rpc-settings", value_name = "JSON", value_parser = parse_rpc_settings)]
    pub rpc_settings_json: Option<crate::node::RpcSettings>,
    /// NUMA node to run on: the process's memory is bound to it (`set_mempolicy`
    /// MPOL_BIND, before it registers any) and, without --cpus, it runs on the node's
    /// CPUs (default: $RRPC_NUMA, else unbound). A topology file's `numa` (the role's,
    /// else its host's) fills it in.
    #[arg(long, value_name = "N", env = "RRPC_NUMA")]
    pub numa: Option<u32>,
    /// Address peers reach this node at, `HOST[:PORT]` (default: the bound address; with a
    /// wildcard --listen such as 0.0.0.0:7000, the host name's address). Printed in the
    /// READY line; without a port, the bound port.
    #[arg(long, value_name = "ADDR", value_parser = parse_advertise)]
    pub advertise: Option<SocketAddr>,
    /// Fabric backend: shm (one host) or verbs (RDMA NICs, Soft-RoCE).
    #[arg(long, value_name = "KIND", env = "RRPC_FABRIC", default_value = "shm", value_parser = parse_fabric)]
    pub fabric: FabricKind,
    /// RDMA device for --fabric verbs (default: $RRPC_RDMA_DEVICE, else the first device).
    #[arg(long, value_name = "NAME", env = "RRPC_RDMA_DEVICE")]
    pub rdma_device: Option<String>,
    /// GID index for --fabric verbs (default: $RRPC_GID_INDEX, else the RoCEv2 IPv4-mapped GID).
    #[arg(long, value_name = "INDEX", env = "RRPC_GID_INDEX")]
    pub gid_index: Option<u32>,
    /// RDMA port for --fabric verbs (default: 1).
    #[arg(long, value_name = "PORT", env = "RRPC_RDMA_PORT")]
    pub rdma_port: Option<u8>,
    /// RoCE traffic class of this node's QPs for --fabric verbs (the GRH's; DSCP in its
    /// upper 6 bits, e.g. 106 = DSCP 26 with ECN; default: $RRPC_TCLASS, else 0).
    #[arg(long, value_name = "N", env = "RRPC_TCLASS")]
    pub tclass: Option<u8>,
    /// Service level of this node's QPs for --fabric verbs (0 to 15; default: $RRPC_SL,
    /// else 0).
    #[arg(long, value_name = "N", env = "RRPC_SL", value_parser = clap::value_parser!(u8).range(0..=15))]
    pub sl: Option<u8>,
    /// Timing model of the shm fabric: none, cx5, cx6, rxe, cx3-scaled (built-in RNIC profiles) or
    /// the path of a TOML profile. Delays each work request by what an RNIC charges
    /// (latency, bandwidth, message rate, atomics, doorbells).
    #[arg(long, value_name = "MODEL", env = "RRPC_MODEL", default_value = "none")]
    pub model: String,
    /// Stop (as on SIGTERM) when stdin reaches its end: a launcher that starts this
    /// process over ssh keeps its stdin open, so the process ends with the launcher even
    /// when the launcher is killed (the remote counterpart of a parent-death signal).
    #[arg(long, env = "RRPC_EXIT_ON_STDIN_EOF")]
    pub exit_on_stdin_eof: bool,
}

fn parse_fabric(s: &str) -> Result<FabricKind, String> {
    s.parse()
}

/// Parse `HOST:PORT`, where HOST is an IP address (IPv6 in brackets) or a host name
/// resolved now (its first IPv4 address, else its first address): the value parser of
/// every address flag of the service binaries.
///
/// Errors: no port, or a host name that does not resolve (the resolver's message).
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let all: Vec<SocketAddr> = s
        .to_socket_addrs()
        .map_err(|e| format!("{s:?}: expected HOST:PORT ({e})"))?
        .collect();
    all.iter()
        .find(|a| a.is_ipv4())
        .or(all.first())
        .copied()
        .ok_or_else(|| format!("{s:?}: the host name has no address"))
}

/// Parse `HOST[:PORT]` as [`parse_addr`] does; without a port, port 0 (meaning: the
/// bound port, see [`advertised`]).
pub fn parse_advertise(s: &str) -> Result<SocketAddr, String> {
    if let Ok(ip) = s.trim_matches(['[', ']']).parse::<std::net::IpAddr>() {
        return Ok(SocketAddr::new(ip, 0));
    }
    if s.rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        return parse_addr(s);
    }
    parse_addr(&format!("{s}:0"))
}

/// The `--advertise` address of this process, set by [`parse_args`].
static ADVERTISE: OnceLock<SocketAddr> = OnceLock::new();
/// `--exit-on-stdin-eof`, as parsed.
static EXIT_ON_STDIN_EOF: OnceLock<bool> = OnceLock::new();
/// `--cpus`, as parsed.
static CPUS: OnceLock<Vec<usize>> = OnceLock::new();
/// `--numa`, as parsed.
static NUMA: OnceLock<u32> = OnceLock::new();

/// Parse and check `--rpc-settings` (see [`NodeArgs::rpc_settings_json`]).
pub fn parse_rpc_settings(s: &str) -> Result<crate::node::RpcSettings, String> {
    let r: crate::node::RpcSettings = serde_json::from_str(s).map_err(|e| format!("{s:?}: {e}"))?;
    r.runtime.validate().map_err(|e| format!("runtime: {e}"))?;
    r.server.validate().map_err(|e| format!("server: {e}"))?;
    Ok(r)
}

/// Check a `--cpus` list (see [`crate::topology::parse_cpu_list`]); keep it as given.
fn parse_cpus(s: &str) -> Result<String, String> {
    crate::topology::parse_cpu_list(s).map(|_| s.to_string())
}

/// Run the calling thread (and every thread it starts from now on) on `cpus` only.
///
/// Errors: the list is empty or names no CPU this machine has online (the kernel's
/// `EINVAL`), or the kernel refuses (`EPERM` under a restrictive cgroup).
pub fn pin_to_cpus(cpus: &[usize]) -> std::io::Result<()> {
    // SAFETY: an all-zero cpu_set_t is a valid empty set; CPU_SET writes within it for
    // indices below CPU_SETSIZE (checked), and sched_setaffinity reads exactly
    // size_of::<cpu_set_t>() bytes of it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            if c >= libc::CPU_SETSIZE as usize {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("CPU {c} is beyond what the kernel's CPU sets hold"),
                ));
            }
            libc::CPU_SET(c, &mut set);
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// `MPOL_DEFAULT` of `<linux/mempolicy.h>`: the system's default memory policy.
pub const MPOL_DEFAULT: i32 = 0;
/// `MPOL_BIND` of `<linux/mempolicy.h>`: allocate memory on the given nodes only.
pub const MPOL_BIND: i32 = 2;
/// NUMA node masks passed to the kernel hold this many nodes.
const NUMA_MASK_NODES: usize = 1024;
const NUMA_MASK_WORDS: usize = NUMA_MASK_NODES / 64;

/// What [`bind_process`] refuses.
#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    /// The machine has no such NUMA node.
    #[error("NUMA node {node} does not exist on this machine (no {}; its nodes: {nodes})", numa_dir(*node).display())]
    NoSuchNumaNode {
        /// The node asked for.
        node: u32,
        /// The machine's online nodes (sysfs `online`), or why they are unknown.
        nodes: String,
    },
    /// Reading the node's CPUs (sysfs `cpulist`) failed, or it lists none.
    #[error("NUMA node {node}: reading its CPUs: {source}")]
    NumaCpus {
        /// The node.
        node: u32,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// `set_mempolicy(MPOL_BIND)` failed (`EPERM` under a seccomp profile or a cpuset
    /// that excludes the node).
    #[error("binding memory to NUMA node {node}: set_mempolicy: {source}")]
    Bind {
        /// The node.
        node: u32,
        /// The kernel's error.
        #[source]
        source: std::io::Error,
    },
    /// Pinning to the CPUs failed (see [`pin_to_cpus`]).
    #[error("running on CPUs {cpus:?}: {source}")]
    Pin {
        /// The CPUs asked for.
        cpus: Vec<usize>,
        /// The kernel's error.
        #[source]
        source: std::io::Error,
    },
}

/// The sysfs directory of NUMA node `node`.
fn numa_dir(node: u32) -> PathBuf {
    PathBuf::from(format!("/sys/devices/system/node/node{node}"))
}

/// The sysfs directory of NUMA node `node`, which must exist.
///
/// Errors: [`PlacementError::NoSuchNumaNode`].
fn numa_node_dir(node: u32) -> Result<PathBuf, PlacementError> {
    let dir = numa_dir(node);
    if !dir.is_dir() {
        let nodes = std::fs::read_to_string("/sys/devices/system/node/online")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|e| format!("unknown ({e})"));
        return Err(PlacementError::NoSuchNumaNode { node, nodes });
    }
    Ok(dir)
}

/// The CPUs of NUMA node `node` (its sysfs `cpulist`).
///
/// Errors: [`PlacementError::NoSuchNumaNode`] when the machine has no such node;
/// [`PlacementError::NumaCpus`] when its list cannot be read or is empty (a node with
/// memory only).
pub fn numa_cpus(node: u32) -> Result<Vec<usize>, PlacementError> {
    let dir = numa_node_dir(node)?;
    let bad = |source| PlacementError::NumaCpus { node, source };
    let text = std::fs::read_to_string(dir.join("cpulist")).map_err(bad)?;
    let cpus = match text.trim() {
        "" => Vec::new(),
        t => topology::parse_cpu_list(t).map_err(|m| bad(std::io::Error::other(m)))?,
    };
    if cpus.is_empty() {
        return Err(bad(std::io::Error::other("the node has no CPUs")));
    }
    Ok(cpus)
}

/// Bind the memory policy of the calling thread (and of every thread it starts from now
/// on) to NUMA node `node`: `set_mempolicy(MPOL_BIND)`, so its pages, registered memory
/// included, come from that node only. Call it before allocating what should live there.
///
/// Errors: [`PlacementError::NoSuchNumaNode`]; [`PlacementError::Bind`] when the kernel
/// refuses.
pub fn bind_memory_to_numa(node: u32) -> Result<(), PlacementError> {
    numa_node_dir(node)?;
    let bind = |source| PlacementError::Bind { node, source };
    if node as usize >= NUMA_MASK_NODES {
        return Err(bind(std::io::Error::from_raw_os_error(libc::EINVAL)));
    }
    let mut mask = [0 as libc::c_ulong; NUMA_MASK_WORDS];
    mask[node as usize / 64] |= 1 << (node % 64);
    // SAFETY: set_mempolicy reads `maxnode - 1` bits of the mask (the kernel's
    // historical off-by-one), which is exactly the array's NUMA_MASK_NODES bits.
    let r = unsafe {
        libc::syscall(
            libc::SYS_set_mempolicy,
            MPOL_BIND,
            mask.as_ptr(),
            (NUMA_MASK_NODES + 1) as libc::c_ulong,
        )
    };
    if r != 0 {
        return Err(bind(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// The calling thread's memory policy: its mode ([`MPOL_DEFAULT`], [`MPOL_BIND`], ...)
/// and its nodes (`get_mempolicy`).
///
/// Errors: the kernel's.
pub fn memory_policy() -> std::io::Result<(i32, Vec<u32>)> {
    let mut mode: libc::c_int = -1;
    let mut mask = [0 as libc::c_ulong; NUMA_MASK_WORDS];
    // SAFETY: get_mempolicy writes one int to `mode` and at most `maxnode - 1` bits
    // (NUMA_MASK_NODES) to the mask; a null address with flags 0 asks for the calling
    // thread's policy.
    let r = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut mode as *mut libc::c_int,
            mask.as_mut_ptr(),
            (NUMA_MASK_NODES + 1) as libc::c_ulong,
            std::ptr::null_mut::<libc::c_void>(),
            0 as libc::c_ulong,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let nodes = (0..NUMA_MASK_NODES as u32)
        .filter(|&n| mask[n as usize / 64] & (1 << (n % 64)) != 0)
        .collect();
    Ok((mode, nodes))
}

/// Place this process: with `numa`, bind its memory to that NUMA node
/// ([`bind_memory_to_numa`]); pin it to `cpus`, else (with `numa`) to the node's CPUs.
/// Call it from the main thread before any other thread starts: they all inherit the
/// memory policy and the CPU set. Returns the CPUs it pinned to, if any.
///
/// Errors: see [`PlacementError`].
pub fn bind_process(
    cpus: Option<&[usize]>,
    numa: Option<u32>,
) -> Result<Option<Vec<usize>>, PlacementError> {
    let cpus = match (cpus, numa) {
        (Some(c), _) => Some(c.to_vec()),
        (None, Some(n)) => Some(numa_cpus(n)?),
        (None, None) => None,
    };
    if let Some(n) = numa {
        bind_memory_to_numa(n)?;
    }
    if let Some(c) = &cpus {
        pin_to_cpus(c).map_err(|source| PlacementError::Pin {
            cpus: c.clone(),
            source,
        })?;
    }
    Ok(cpus)
}

/// The address to tell peers for a node bound to `bound`: `advertise` if given (with
/// `bound`'s port when its port is 0); for a wildcard `bound` (0.0.0.0, ::), this
/// machine's address (its host name's first non-loopback address, else the source
/// address of its default route, else loopback), with a warning to pass --advertise;
/// else `bound` itself.
pub fn advertised(bound: SocketAddr, advertise: Option<SocketAddr>) -> SocketAddr {
    if let Some(a) = advertise {
        let port = if a.port() == 0 {
            bound.port()
        } else {
            a.port()
        };
        return SocketAddr::new(a.ip(), port);
    }
    if !bound.ip().is_unspecified() {
        return bound;
    }
    let ip = guess_local_ip(bound.is_ipv4());
    tracing::warn!(
        %bound,
        advertised = %ip,
        "listening on a wildcard address: advertising this machine's address; pass \
         --advertise ADDR to choose another"
    );
    SocketAddr::new(ip, bound.port())
}

/// This machine's address as peers see it (see [`advertised`]).
fn guess_local_ip(v4: bool) -> std::net::IpAddr {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let fam = |ip: &IpAddr| ip.is_ipv4() == v4 && !ip.is_loopback() && !ip.is_unspecified();
    if let Ok(h) = topology::machine_hostname() {
        if let Ok(addrs) = (h.as_str(), 0).to_socket_addrs() {
            if let Some(a) = addrs.map(|a| a.ip()).find(fam) {
                return a;
            }
        }
    }
    // Connecting a UDP socket sends nothing; it picks the default route's source.
    let probe = if v4 {
        ("0.0.0.0:0", "192.0.2.1:9")
    } else {
        ("[::]:0", "[2001:db8::1]:9")
    };
    if let Ok(s) = std::net::UdpSocket::bind(probe.0) {
        if s.connect(probe.1).is_ok() {
            if let Ok(a) = s.local_addr() {
                if fam(&a.ip()) {
                    return a.ip();
                }
            }
        }
    }
    if v4 {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        IpAddr::V6(Ipv6Addr::LOCALHOST)
    }
}

impl NodeArgs {
    /// Open the fabric as this node.
    ///
    /// Errors: [`FabricError::NodeInUse`] when a live process is this node; I/O errors.
    ///
    /// Warns when the control plane listens beyond loopback without a topology file
    /// saying so (--hosts), or without a cluster secret.
    pub fn open_fabric(&self) -> Result<Fabric, FabricError> {
        if !self.listen.ip().is_loopback() {
            if self.hosts.is_none() {
                tracing::warn!(
                    listen = %self.listen,
                    "the control plane listens beyond loopback, but no topology file (--hosts) \
                     says this node runs here; use --listen 127.0.0.1:PORT for a local run"
                );
            }
            if self.secret_file.is_none()
                && !crate::auth::process_secret().is_ok_and(|s| s.is_some())
            {
                tracing::warn!(
                    listen = %self.listen,
                    "no cluster secret: anyone who reaches the control plane may connect; \
                     pass --secret-file (or secret-file in the topology file)"
                );
            }
        }
        let mut cfg = FabricConfig::new(self.fabric, &self.cluster, self.node);
        cfg.device = self.rdma_device.clone();
        cfg.gid_index = self.gid_index;
        cfg.port = self.rdma_port;
        cfg.traffic_class = self.tclass;
        cfg.service_level = self.sl;
        cfg.model = Some(self.model.clone());
        Fabric::open(&cfg)
    }

    /// The address peers reach this node at when it is bound to `bound` (see
    /// [`advertised`]).
    pub fn advertised(&self, bound: SocketAddr) -> SocketAddr {
        advertised(bound, self.advertise)
    }

    /// The rrpc settings this process runs with: `--rpc-settings`; else, with `--hosts`,
    /// the topology file's `[runtime]` and `[server]` ([`Topology::rpc_settings`]); the
    /// defaults otherwise. A binary's own flags for a setting (a thread count,
    /// `--idle-sleep-us`) win over them.
    ///
    /// Errors: the file does not load or check (see [`Topology::load`]).
    pub fn rpc_settings(&self) -> Result<crate::node::RpcSettings, ArgsError> {
        if let Some(s) = &self.rpc_settings_json {
            return Ok(s.clone());
        }
        match &self.hosts {
            Some(path) => Ok(Topology::load(path)?.rpc_settings()),
            None => Ok(crate::node::RpcSettings::default()),
        }
    }

    /// The topology file and this process's role in it, when `--hosts` was given
    /// (`binary` is this program's name: a role of another binary is refused). The
    /// role's [`Role::settings`] are the service's own settings.
    ///
    /// Errors: the file's (see [`Topology::load`]) and the role's (see
    /// [`Topology::resolve`]), or the host name when `--as auto` needs it.
    pub fn placement(&self, binary: &str) -> Result<Option<(Topology, Role)>, ArgsError> {
        let Some(path) = &self.hosts else {
            return Ok(None);
        };
        let topo = Topology::load(path)?;
        let spec = self.as_role.as_deref().unwrap_or("auto");
        let role = find_role(&topo, spec, binary, &topology::machine_hostname)?.clone();
        Ok(Some((topo, role)))
    }
}

/// What [`resolve_args`] refuses.
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    /// A bad command line (or `--help`/`--version`, which clap reports as errors).
    #[error("{0}")]
    Clap(#[from] clap::Error),
    /// The topology file, or the role in it.
    #[error(transparent)]
    Topology(#[from] TopologyError),
    /// The role does not fit this binary, or a value from the file is refused.
    #[error("{0}")]
    Other(String),
    /// The cluster secret (`--secret-file`, or the topology file's) cannot be had.
    #[error(transparent)]
    Secret(#[from] SecretError),
}

fn find_role<'t>(
    topo: &'t Topology,
    spec: &str,
    binary: &str,
    hostname: &dyn Fn() -> std::io::Result<String>,
) -> Result<&'t Role, ArgsError> {
    let host = if spec == "auto" {
        hostname().map_err(|e| {
            ArgsError::Other(format!("--as auto: reading this machine's host name: {e}"))
        })?
    } else {
        String::new()
    };
    let role = topo.resolve(spec, &host)?;
    if role.kind.binary() != binary {
        return Err(ArgsError::Other(format!(
            "{}: --as {spec}: that is {} ({}), which {} runs, not {binary}",
            topo.path,
            role.spec(),
            role.table(),
            role.kind.binary()
        )));
    }
    Ok(role)
}

/// A flag the topology gives: its long name, its value (`None`: a switch given without
/// one), and whether it came from the role's table (and so must exist).
type TopoFlag = (String, Option<String>, bool);

/// The flags `role` of `topo` implies (see the module's documentation).
fn role_flags(topo: &Topology, role: &Role) -> Result<Vec<TopoFlag>, ArgsError> {
    let host = topo.host_of(role);
    let mut f: Vec<TopoFlag> = Vec::new();
    let mut put = |k: &str, v: Option<String>| {
        if let Some(v) = v {
            f.push((k.to_string(), Some(v), false));
        }
    };
    put("cluster", Some(topo.name.clone()));
    put("node", Some(role.node.to_string()));
    put("listen", Some(topo.addr_of(role)));
    put("fabric", Some(topo.fabric.to_string()));
    put("rdma-device", host.rdma_device.clone());
    put("rdma-port", host.rdma_port.map(|p| p.to_string()));
    if let topology::GidIndex::Index(i) = host.gid_index {
        put("gid-index", Some(i.to_string()));
    }
    put("tclass", host.tclass.map(|v| v.to_string()));
    put("sl", host.sl.map(|v| v.to_string()));
    put("cpus", role.cpus.clone().or_else(|| host.cpus.clone()));
    put("numa", role.numa.or(host.numa).map(|n| n.to_string()));
    put("etcd", topo.etcd.first().cloned());
    put(
        "secret-file",
        topo.secret_file.as_ref().map(|p| p.display().to_string()),
    );
    if role.kind == RoleKind::Memnode {
        if !role.settings.contains_key("partition") {
            put("partition", Some(role.index.to_string()));
        }
        if !role.settings.contains_key("partitions") {
            put("partitions", Some(topo.memnodes.len().to_string()));
        }
        for (k, v) in &role.settings {
            let bad = |what: &str| {
                ArgsError::Other(format!(
                    "{}: {}: {k}: {what} (a memory node's keys are its long flags)",
                    topo.path,
                    role.table()
                ))
            };
            let v = match v {
                toml::Value::String(s) => Some(s.clone()),
                toml::Value::Integer(i) => Some(i.to_string()),
                toml::Value::Float(x) => Some(x.to_string()),
                toml::Value::Boolean(true) => None,
                toml::Value::Boolean(false) => continue,
                toml::Value::Array(a) => Some(
                    a.iter()
                        .map(|x| match x {
                            toml::Value::String(s) => Ok(s.clone()),
                            toml::Value::Integer(i) => Ok(i.to_string()),
                            _ => Err(bad("a list of strings or integers expected")),
                        })
                        .collect::<Result<Vec<_>, _>>()?
                        .join(","),
                ),
                _ => return Err(bad("a string, number, boolean or list expected")),
            };
            f.push((k.clone(), v, true));
        }
    }
    Ok(f)
}

/// Parse `argv` as [`parse_args`] does, without exiting: with `--hosts`, first find the
/// role (`hostname` gives this machine's name for `--as auto`), then parse again with
/// the flags it implies added where `argv` and the environment do not give them.
///
/// Errors: [`ArgsError::Clap`] for a bad command line (and `--help`/`--version`);
/// [`ArgsError::Topology`] for the file or `--as`; [`ArgsError::Other`] for a role of
/// another binary, a memory-node key the binary has no flag for, or a value from the
/// file that the flag refuses.
pub fn resolve_args<T: clap::Parser>(
    name: &str,
    argv: Vec<OsString>,
    hostname: &dyn Fn() -> std::io::Result<String>,
) -> Result<T, ArgsError> {
    resolve_args_and_secret(name, argv, hostname).map(|(t, _)| t)
}

/// [`resolve_args`], and the cluster secret the arguments give: `--secret-file` (also
/// from the topology file's `secret-file`), else the topology file's inline `secret`,
/// else none (a binary without `--secret-file` gets none).
///
/// Errors: those of [`resolve_args`]; [`ArgsError::Secret`] when the secret file cannot
/// be read or is too short.
pub fn resolve_args_and_secret<T: clap::Parser>(
    name: &str,
    argv: Vec<OsString>,
    hostname: &dyn Fn() -> std::io::Result<String>,
) -> Result<(T, Option<ClusterSecret>), ArgsError> {
    use clap::parser::ValueSource;
    let cmd = T::command();
    let first = cmd.clone().try_get_matches_from(&argv)?;
    let path = if cmd.get_arguments().any(|a| a.get_id() == "hosts") {
        first
            .try_get_one::<PathBuf>("hosts")
            .ok()
            .flatten()
            .cloned()
    } else {
        None
    };
    let Some(path) = path else {
        return Ok((finish::<T>(&first)?, secret_of(&first, None)?));
    };
    let topo = Topology::load(&path)?;
    let spec = first
        .try_get_one::<String>("as_role")
        .ok()
        .flatten()
        .map_or("auto", String::as_str);
    let role = find_role(&topo, spec, name, hostname)?;
    let mut added = Vec::new();
    for (long, value, from_table) in role_flags(&topo, role)? {
        let Some(arg) = cmd.get_arguments().find(|a| a.get_long() == Some(&long)) else {
            if from_table {
                return Err(ArgsError::Other(format!(
                    "{}: {}: {long}: {name} has no --{long} flag (a memory node's keys are \
                     its long flags)",
                    topo.path,
                    role.table()
                )));
            }
            continue;
        };
        let given = matches!(
            first.value_source(arg.get_id().as_str()),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        );
        if !given {
            added.push(OsString::from(match value {
                Some(v) => format!("--{long}={v}"),
                None => format!("--{long}"),
            }));
        }
    }
    let mut full = argv.clone();
    let at = full.len().min(1);
    full.splice(at..at, added);
    let m = cmd.try_get_matches_from(full).map_err(|e| {
        let msg = e.to_string();
        let line = msg.lines().next().unwrap_or("bad value");
        ArgsError::Other(format!(
            "{}: {} ({}): {}",
            topo.path,
            role.table(),
            role.spec(),
            line.trim_start_matches("error: ")
        ))
    })?;
    Ok((finish::<T>(&m)?, secret_of(&m, Some(&topo))?))
}

/// The cluster secret of matches `m`: `--secret-file`'s, else `topo`'s inline one.
fn secret_of(
    m: &clap::ArgMatches,
    topo: Option<&Topology>,
) -> Result<Option<ClusterSecret>, SecretError> {
    if let Ok(Some(p)) = m.try_get_one::<PathBuf>("secret_file") {
        return ClusterSecret::from_file(p).map(Some);
    }
    Ok(topo.and_then(|t| t.secret.clone()))
}

/// Build `T` from its matches and remember `--advertise`.
fn finish<T: clap::Parser>(m: &clap::ArgMatches) -> Result<T, ArgsError> {
    let t = T::from_arg_matches(m)?;
    if let Ok(Some(a)) = m.try_get_one::<SocketAddr>("advertise") {
        let _ = ADVERTISE.set(*a);
    }
    if let Ok(Some(&on)) = m.try_get_one::<bool>("exit_on_stdin_eof") {
        let _ = EXIT_ON_STDIN_EOF.set(on);
    }
    if let Ok(Some(c)) = m.try_get_one::<String>("cpus") {
        let _ = CPUS.set(crate::topology::parse_cpu_list(c).unwrap_or_default());
    }
    if let Ok(Some(&n)) = m.try_get_one::<u32>("numa") {
        let _ = NUMA.set(n);
    }
    Ok(t)
}

/// Parse the command line. `--help`/`--version` print and exit 0; a bad argument prints
/// one line (`<name>: <what> (see --help)`) and exits 2, the usage-error code every
/// binary of the project uses (1 is for errors while running).
///
/// With `--hosts FILE`, the flags this process's role implies are added where not given
/// (see the module's documentation); a problem with the file or the role prints
/// `<name>: <file>: <table>: <what>` and exits 2.
///
/// The cluster secret the arguments give (see [`resolve_args_and_secret`]) becomes the
/// process's ([`crate::auth::install`]); one that cannot be read prints why and exits 2.
pub fn parse_args<T: clap::Parser>(name: &str) -> T {
    let argv: Vec<OsString> = std::env::args_os().collect();
    match resolve_args_and_secret::<T>(name, argv, &topology::machine_hostname) {
        Ok((c, secret)) => {
            if secret.is_some() {
                crate::auth::install(secret);
            }
            c
        }
        Err(e @ (ArgsError::Topology(_) | ArgsError::Other(_) | ArgsError::Secret(_))) => {
            eprintln!("{name}: {e}");
            std::process::exit(2);
        }
        Err(ArgsError::Clap(e)) if !e.use_stderr() => {
            let _ = e.print();
            std::process::exit(0);
        }
        Err(ArgsError::Clap(e)) => {
            let msg = e.to_string();
            let line = msg.lines().next().unwrap_or("bad arguments");
            eprintln!(
                "{name}: {} (see --help)",
                line.trim_start_matches("error: ")
            );
            std::process::exit(2);
        }
    }
}

/// Log to stderr (`RUST_LOG` filters; `info` by default; colours only on a terminal).
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
}

/// Install the SIGINT/SIGTERM handler; the receiver gets a message on each signal (and,
/// with `--exit-on-stdin-eof`, when stdin reaches its end). Install it before starting
/// services so a signal during start-up is not lost.
pub fn stop_signal() -> Result<Receiver<()>, ctrlc::Error> {
    let (tx, rx) = std::sync::mpsc::channel();
    if EXIT_ON_STDIN_EOF.get().copied().unwrap_or(false) {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut sink = [0u8; 256];
            let mut stdin = std::io::stdin().lock();
            while matches!(std::io::Read::read(&mut stdin, &mut sink), Ok(n) if n > 0) {}
            tracing::info!("stdin closed (--exit-on-stdin-eof): stopping");
            let _ = tx.send(());
        });
    }
    ctrlc::set_handler(move || {
        let _ = tx.send(());
    })?;
    Ok(rx)
}

/// Print `PROGRESS <what>` on stdout, flushed, before `READY`: a launcher waiting for
/// `READY` takes it as a sign of life and counts its start timeout again from here (a
/// memory node loading gigabytes of rows takes minutes; one that says nothing is hung).
///
/// Errors: stdout cannot be written.
pub fn announce_progress(what: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "PROGRESS {what}")?;
    out.flush()
}

/// Print `lines` and then `READY <addr>` on stdout, flushed: launchers wait for it.
/// `addr` is the bound address; the line carries the advertised one (`--advertise`,
/// else see [`advertised`]), never a wildcard.
pub fn announce_ready(addr: SocketAddr, lines: &[String]) -> std::io::Result<()> {
    let addr = advertised(addr, ADVERTISE.get().copied());
    let mut out = std::io::stdout().lock();
    for l in lines {
        writeln!(out, "{l}")?;
    }
    writeln!(out, "READY {addr}")?;
    out.flush()
}

/// The whole `main` of a service: parse `T`, start logging, call `run`, and turn its
/// result into the exit code (0, or 1 after printing `<name>: error: <e:#>`).
pub fn main_with<T: clap::Parser, E: std::fmt::Display>(
    name: &str,
    run: impl FnOnce(T) -> Result<(), E>,
) -> std::process::ExitCode {
    let args: T = parse_args(name);
    init_logging();
    let numa = NUMA.get().copied();
    // Before any thread starts: they all inherit the memory policy and the CPU set.
    match bind_process(CPUS.get().map(Vec::as_slice), numa) {
        Ok(cpus) => {
            if let Some(n) = numa {
                tracing::info!(numa = n, "memory bound to this NUMA node");
            }
            if let Some(cpus) = cpus {
                tracing::info!(?cpus, "running on these CPUs only");
            }
        }
        Err(e) => {
            eprintln!("{name}: {e}");
            return std::process::ExitCode::from(2);
        }
    }
    match run(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: error: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// The CPUs the calling thread may run on.
    fn affinity() -> Vec<usize> {
        // SAFETY: an all-zero cpu_set_t is a valid empty set; sched_getaffinity fills
        // exactly size_of::<cpu_set_t>() bytes of it, and CPU_ISSET reads indices below
        // CPU_SETSIZE.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            let size = std::mem::size_of::<libc::cpu_set_t>();
            assert_eq!(libc::sched_getaffinity(0, size, &mut set), 0);
            (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| libc::CPU_ISSET(c, &set))
                .collect()
        }
    }

    #[test]
    fn a_thread_pinned_to_one_cpu_runs_there_and_bad_lists_are_refused() {
        std::thread::spawn(|| {
            let c = affinity()[0];
            pin_to_cpus(&[c]).unwrap();
            assert_eq!(affinity(), vec![c]);
            // A thread started now inherits the set.
            let inherited = std::thread::spawn(affinity).join().unwrap();
            assert_eq!(inherited, vec![c]);
            assert!(pin_to_cpus(&[]).is_err(), "an empty set");
            assert!(pin_to_cpus(&[100_000]).is_err(), "beyond CPU_SETSIZE");
        })
        .join()
        .unwrap();
        assert!(parse_cpus("2-15,20").is_ok());
        assert!(parse_cpus("3-1").is_err() && parse_cpus("x").is_err());
    }

    #[test]
    fn numa_binds_memory_and_cpus_to_the_node_and_a_missing_node_is_named() {
        std::thread::spawn(|| {
            assert_eq!(memory_policy().unwrap().0, MPOL_DEFAULT);
            let node0 = numa_cpus(0).unwrap();
            let all = affinity();
            let pinned = bind_process(None, Some(0)).unwrap();
            assert_eq!(memory_policy().unwrap(), (MPOL_BIND, vec![0]));
            let want: Vec<usize> = node0.iter().copied().filter(|c| all.contains(c)).collect();
            assert_eq!(pinned, Some(node0));
            assert_eq!(affinity(), want, "without --cpus: the node's CPUs");
            // A thread started now inherits the policy.
            let inherited = std::thread::spawn(memory_policy).join().unwrap().unwrap();
            assert_eq!(inherited, (MPOL_BIND, vec![0]));
            // Explicit CPUs win over the node's.
            let c = want[want.len() - 1];
            assert_eq!(bind_process(Some(&[c]), Some(0)).unwrap(), Some(vec![c]));
            assert_eq!(affinity(), vec![c]);
        })
        .join()
        .unwrap();
        std::thread::spawn(|| {
            let e = bind_process(None, Some(7)).unwrap_err();
            assert!(
                matches!(e, PlacementError::NoSuchNumaNode { node: 7, .. }),
                "{e}"
            );
            let msg = e.to_string();
            assert!(
                msg.contains("NUMA node 7 does not exist") && msg.contains("node7"),
                "{msg}"
            );
            assert!(bind_memory_to_numa(7).is_err());
            assert_eq!(memory_policy().unwrap().0, MPOL_DEFAULT, "unchanged");
        })
        .join()
        .unwrap();
    }

    /// A memory node's command line: the node flags and some of its own.
    #[derive(Parser, Debug)]
    struct Memnode {
        #[command(flatten)]
        node: NodeArgs,
        #[arg(long)]
        partition: Option<u32>,
        #[arg(long)]
        partitions: Option<u32>,
        #[arg(long)]
        versions: Option<u32>,
        #[arg(long)]
        etcd: Option<String>,
        #[arg(long)]
        verbose: bool,
    }

    const FILE: &str = r#"
name = "exp"
fabric = "verbs"
etcd = ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]
[defaults]
rdma-device = "mlx5_0"
tclass = 106
[hosts.a]
ctrl-ip = "10.0.0.1"
gid-index = 3
numa = 1
[hosts.b]
ctrl-ip = "10.0.0.2"
sl = 2
[[memnode]]
host = "a"
port = 7010
[[memnode]]
host = "b"
port = 7011
versions = 4
verbose = true
[lockd]
host = "a"
port = 7002
"#;

    fn topo_file(tag: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("rrpc-hosts-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("cluster.toml");
        std::fs::write(&p, text).unwrap();
        p
    }

    fn parse<T: clap::Parser>(name: &str, args: &[&str], host: &str) -> Result<T, ArgsError> {
        let argv = std::iter::once(name)
            .chain(args.iter().copied())
            .map(OsString::from)
            .collect();
        let host = host.to_string();
        resolve_args::<T>(name, argv, &move || Ok(host.clone()))
    }

    #[test]
    fn the_cluster_secret_comes_from_the_flag_else_the_topology_file() {
        let secret = |args: &[&str]| {
            let argv = std::iter::once("memnode")
                .chain(args.iter().copied())
                .map(OsString::from)
                .collect();
            resolve_args_and_secret::<Memnode>("memnode", argv, &|| Ok("x".into()))
                .map(|(m, s)| (m.node.secret_file, s))
        };
        let p = topo_file(
            "secret",
            &format!("secret-file = \"from-topology\"\n{FILE}"),
        );
        let dir = p.parent().unwrap();
        std::fs::write(
            dir.join("from-topology"),
            "a secret from the topology file\n",
        )
        .unwrap();
        std::fs::write(dir.join("from-flag"), "a secret from the command line\n").unwrap();
        let f = p.to_str().unwrap();
        let (file, s) = secret(&["--hosts", f, "--as", "memnode:0"]).unwrap();
        assert_eq!(file.as_deref(), Some(dir.join("from-topology").as_path()));
        assert_eq!(
            s,
            Some(ClusterSecret::from_bytes(b"a secret from the topology file").unwrap())
        );
        let flag = dir.join("from-flag");
        let flag = flag.to_str().unwrap();
        let (_, s) = secret(&["--hosts", f, "--as", "memnode:0", "--secret-file", flag]).unwrap();
        assert_eq!(
            s,
            Some(ClusterSecret::from_bytes(b"a secret from the command line").unwrap())
        );
        let (_, s) = secret(&["--node", "1", "--secret-file", flag]).unwrap();
        assert!(s.is_some());
        let (_, s) = secret(&["--node", "1"]).unwrap();
        assert!(s.is_none());
        let e = secret(&["--node", "1", "--secret-file", "/nonexistent/secret"]).unwrap_err();
        assert!(matches!(e, ArgsError::Secret(_)), "{e}");
        let inline = topo_file(
            "inline",
            &format!("secret = \"an inline secret, long enough\"\n{FILE}"),
        );
        let (file, s) =
            secret(&["--hosts", inline.to_str().unwrap(), "--as", "memnode:1"]).unwrap();
        assert!(file.is_none());
        assert_eq!(
            s,
            Some(ClusterSecret::from_bytes(b"an inline secret, long enough").unwrap())
        );
    }

    #[test]
    fn hosts_and_as_fill_the_node_flags_and_explicit_flags_win() {
        let p = topo_file("fill", FILE);
        let f = p.to_str().unwrap();
        let m: Memnode = parse("memnode", &["--hosts", f, "--as", "memnode:1"], "x").unwrap();
        let n = &m.node;
        assert_eq!((n.cluster.as_str(), n.node), ("exp", NodeId(11)));
        assert_eq!(n.listen, "10.0.0.2:7011".parse().unwrap());
        assert_eq!(n.fabric, FabricKind::Verbs);
        assert_eq!(n.rdma_device.as_deref(), Some("mlx5_0"));
        assert_eq!((n.gid_index, n.tclass, n.sl), (None, Some(106), Some(2)));
        assert_eq!(
            (m.partition, m.partitions, m.versions),
            (Some(1), Some(2), Some(4))
        );
        assert_eq!(m.etcd.as_deref(), Some("http://10.0.0.1:2379"));
        assert!(m.verbose);
        assert_eq!(m.node.numa, None, "host b has no numa");
        // Explicit flags win; --as auto finds host a's only role... a has two: memnode:0
        // and lockd, so auto must name the memnode through another file.
        let m: Memnode = parse(
            "memnode",
            &[
                "--hosts",
                f,
                "--as",
                "memnode:0",
                "--listen",
                "0.0.0.0:9000",
                "--node",
                "42",
                "--partition",
                "0",
                "--gid-index",
                "1",
                "--fabric",
                "shm",
            ],
            "x",
        )
        .unwrap();
        assert_eq!(m.node.listen, "0.0.0.0:9000".parse().unwrap());
        assert_eq!(m.node.numa, Some(1), "host a's numa");
        let n: Memnode = parse(
            "memnode",
            &["--hosts", f, "--as", "memnode:0", "--numa", "0"],
            "x",
        )
        .unwrap();
        assert_eq!(n.node.numa, Some(0), "--numa wins");
        assert_eq!((m.node.node, m.node.gid_index), (NodeId(42), Some(1)));
        assert_eq!(m.node.fabric, FabricKind::Shm);
        assert_eq!(
            (m.partition, m.partitions, m.versions),
            (Some(0), Some(2), None)
        );
        assert!(!m.verbose);
        std::fs::remove_dir_all(p.parent().unwrap()).unwrap();
    }

    #[test]
    fn the_topology_files_runtime_and_server_tables_are_the_rpc_settings() {
        let p = topo_file(
            "rpc",
            &format!("{FILE}\n[runtime]\ncall-timeout-ms = 1234\n[server]\nidle-sleep-us = 7\n"),
        );
        let f = p.to_str().unwrap();
        let m: Memnode = parse("memnode", &["--hosts", f, "--as", "memnode:1"], "x").unwrap();
        let s = m.node.rpc_settings().unwrap();
        assert_eq!(
            s.runtime.call_timeout,
            std::time::Duration::from_millis(1234)
        );
        assert_eq!(s.server.idle_sleep_us, 7);
        assert_eq!(
            s.runtime.connect_timeout,
            crate::runtime::RuntimeConfig::default().connect_timeout,
            "keys left out keep their defaults"
        );
        // Without --hosts: the defaults.
        let m: Memnode = parse("memnode", &["--node", "1"], "x").unwrap();
        assert_eq!(
            m.node.rpc_settings().unwrap(),
            crate::node::RpcSettings::default()
        );
        // --rpc-settings wins over the file; bad settings are refused.
        let json = r#"{"runtime":{"call-timeout-ms":99},"server":{"threads":2}}"#;
        let m: Memnode = parse(
            "memnode",
            &["--hosts", f, "--as", "memnode:1", "--rpc-settings", json],
            "x",
        )
        .unwrap();
        let s = m.node.rpc_settings().unwrap();
        assert_eq!(s.runtime.call_timeout, std::time::Duration::from_millis(99));
        assert_eq!((s.server.threads, s.server.idle_sleep_us), (2, 0));
        let back = parse_rpc_settings(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s, "round trip");
        for bad in [
            r#"{"runtime":{"call-timeout":1}}"#,
            r#"{"server":{"threads":0}}"#,
            "nope",
        ] {
            assert!(
                parse::<Memnode>("memnode", &["--node", "1", "--rpc-settings", bad], "x").is_err(),
                "{bad}"
            );
        }
        std::fs::remove_dir_all(p.parent().unwrap()).unwrap();
    }

    #[test]
    fn as_auto_finds_the_hosts_only_role() {
        let p = topo_file("auto", FILE);
        let f = p.to_str().unwrap();
        let m: Memnode = parse("memnode", &["--hosts", f, "--as", "auto"], "b").unwrap();
        assert_eq!(m.node.node, NodeId(11));
        // --as defaults to auto.
        let m: Memnode = parse("memnode", &["--hosts", f], "b.cluster.example").unwrap();
        assert_eq!(m.node.node, NodeId(11));
        let e = parse::<Memnode>("memnode", &["--hosts", f], "a")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("host a runs 2 roles (memnode:0, lockd:0)"),
            "{e}"
        );
        let e = parse::<Memnode>("memnode", &["--hosts", f], "c")
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"c\", which is not a host of the file"), "{e}");
        std::fs::remove_dir_all(p.parent().unwrap()).unwrap();
    }

    #[test]
    fn refusals_name_the_file_and_table() {
        let p = topo_file("refuse", FILE);
        let f = p.to_str().unwrap();
        let e = parse::<Memnode>("memnode", &["--hosts", f, "--as", "lockd"], "x")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("that is lockd:0 ([lockd]), which lockd runs, not memnode"),
            "{e}"
        );
        let bad = topo_file("refuse2", &FILE.replace("versions = 4", "versionz = 4"));
        let e = parse::<Memnode>(
            "memnode",
            &["--hosts", bad.to_str().unwrap(), "--as", "memnode:1"],
            "x",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("[[memnode]] 1: versionz: memnode has no --versionz flag"),
            "{e}"
        );
        let bad = topo_file(
            "refuse3",
            &FILE.replace("versions = 4", "versions = \"four\""),
        );
        let e = parse::<Memnode>(
            "memnode",
            &["--hosts", bad.to_str().unwrap(), "--as", "memnode:1"],
            "x",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("cluster.toml: [[memnode]] 1 (memnode:1): invalid value 'four'"),
            "{e}"
        );
        let e = parse::<Memnode>("memnode", &["--hosts", "/nonexistent/c.toml"], "x")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("/nonexistent/c.toml: "), "{e}");
        // Without --hosts, --node is required as before.
        let e = parse::<Memnode>("memnode", &[], "x").unwrap_err();
        assert!(
            matches!(e, ArgsError::Clap(_)) && e.to_string().contains("--node"),
            "{e}"
        );
        for d in [p, bad] {
            let _ = std::fs::remove_dir_all(d.parent().unwrap());
        }
        let _ = std::fs::remove_dir_all(
            std::env::temp_dir().join(format!("rrpc-hosts-{}-refuse2", std::process::id())),
        );
    }

    #[test]
    fn addresses_take_host_names_and_advertise_replaces_wildcards() {
        assert_eq!(
            parse_addr("127.0.0.1:7").unwrap(),
            "127.0.0.1:7".parse().unwrap()
        );
        assert_eq!(parse_addr("localhost:7").unwrap().port(), 7);
        assert!(parse_addr("localhost:7").unwrap().ip().is_loopback());
        assert!(parse_addr("localhost").is_err());
        assert_eq!(
            parse_advertise("10.1.2.3").unwrap(),
            "10.1.2.3:0".parse().unwrap()
        );
        assert_eq!(parse_advertise("[::1]").unwrap().port(), 0);
        assert_eq!(parse_advertise("localhost").unwrap().port(), 0);
        assert_eq!(parse_advertise("10.1.2.3:9").unwrap().port(), 9);
        let bound: SocketAddr = "0.0.0.0:7000".parse().unwrap();
        let a = advertised(bound, Some("10.1.2.3:0".parse().unwrap()));
        assert_eq!(a, "10.1.2.3:7000".parse().unwrap());
        let a = advertised(bound, None);
        assert!(!a.ip().is_unspecified() && a.port() == 7000, "{a}");
        let b: SocketAddr = "10.9.9.9:1".parse().unwrap();
        assert_eq!(advertised(b, None), b);
        let m: Memnode = parse(
            "memnode",
            &[
                "--node",
                "1",
                "--listen",
                "localhost:0",
                "--advertise",
                "10.1.2.3",
            ],
            "x",
        )
        .unwrap();
        assert_eq!(
            m.node.advertised("0.0.0.0:5".parse().unwrap()),
            "10.1.2.3:5".parse().unwrap()
        );
        let e = parse::<Memnode>("memnode", &["--node", "1", "--sl", "16"], "x").unwrap_err();
        assert!(e.to_string().contains("16"), "{e}");
    }
}
