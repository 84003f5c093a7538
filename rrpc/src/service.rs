//! Start-up shared by service binaries (`memnode`, `lockd`, `tso`): the node flags every
//! service takes, logging, one-line argument errors, the `READY <addr>` line launchers
//! wait for, and waiting for SIGINT/SIGTERM. Behind the `service` feature so that
//! embedders of `rrpc` do not pull in clap, ctrlc and tracing-subscriber.

use crate::NodeId;
use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::mpsc::Receiver;

use crate::fabric::{Fabric, FabricConfig, FabricError, FabricKind};

/// Flags every service binary takes; `#[command(flatten)]` it into the binary's parser.
#[derive(clap::Args, Debug, Clone)]
pub struct NodeArgs {
    /// Cluster name (shm files live under `/dev/shm/rrpc-<cluster>/`, or a hugetlbfs mount).
    #[arg(long, value_name = "NAME", default_value = "default")]
    pub cluster: String,
    /// This node's id, unique in the cluster.
    #[arg(long, value_name = "ID")]
    pub node: NodeId,
    /// Bootstrap (control-plane) listen address; port 0 picks a free port.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
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
    /// Timing model of the shm fabric: none, cx5, cx6, rxe (built-in RNIC profiles) or
    /// the path of a TOML profile. Delays each work request by what an RNIC charges
    /// (latency, bandwidth, message rate, atomics, doorbells).
    #[arg(long, value_name = "MODEL", env = "RRPC_MODEL", default_value = "none")]
    pub model: String,
}

fn parse_fabric(s: &str) -> Result<FabricKind, String> {
    s.parse()
}

impl NodeArgs {
    /// Open the fabric as this node.
    ///
    /// Errors: [`FabricError::NodeInUse`] when a live process is this node; I/O errors.
    pub fn open_fabric(&self) -> Result<Fabric, FabricError> {
        let mut cfg = FabricConfig::new(self.fabric, &self.cluster, self.node);
        cfg.device = self.rdma_device.clone();
        cfg.gid_index = self.gid_index;
        cfg.port = self.rdma_port;
        cfg.model = Some(self.model.clone());
        Fabric::open(&cfg)
    }
}

/// Parse the command line. `--help`/`--version` print and exit 0; a bad argument prints
/// one line (`<name>: <what> (see --help)`) and exits 1.
pub fn parse_args<T: clap::Parser>(name: &str) -> T {
    match T::try_parse() {
        Ok(c) => c,
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            std::process::exit(0);
        }
        Err(e) => {
            let msg = e.to_string();
            let line = msg.lines().next().unwrap_or("bad arguments");
            eprintln!(
                "{name}: {} (see --help)",
                line.trim_start_matches("error: ")
            );
            std::process::exit(1);
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

/// Install the SIGINT/SIGTERM handler; the receiver gets a message on each signal.
/// Install it before starting services so a signal during start-up is not lost.
pub fn stop_signal() -> Result<Receiver<()>, ctrlc::Error> {
    let (tx, rx) = std::sync::mpsc::channel();
    ctrlc::set_handler(move || {
        let _ = tx.send(());
    })?;
    Ok(rx)
}

/// Print `lines` and then `READY <addr>` on stdout, flushed: launchers wait for it.
pub fn announce_ready(addr: SocketAddr, lines: &[String]) -> std::io::Result<()> {
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
    match run(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: error: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}
