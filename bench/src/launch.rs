//! `rrpc-launch up|down|status|logs --hosts cluster.toml`: the services a topology file
//! ([`rrpc::topology`]) lists (memory nodes, the timestamp oracle, the lock service, TSO
//! proxies; not coordinators, which belong to the application) as a standalone cluster
//! that applications embed, with the resulting addresses written as a file
//! [`txn::coordinator::ClusterAddrs::from_file`] loads.
//!
//! **`up` stays in the foreground** and owns the services for as long as it runs: local
//! ones are its children (with a parent-death signal), remote ones run under ssh
//! sessions it holds open (with `--exit-on-stdin-eof`), exactly as `txn-bench --hosts`
//! runs them ([`crate::launcher`]). SIGINT or SIGTERM (`rrpc-launch down` sends the
//! latter) stops them all; if `up` itself is killed, even with SIGKILL, every service
//! still stops. A detached mode (services under `setsid`, their host and pid in a state
//! file) would survive a closed terminal without tmux or `nohup`, but a crashed or killed
//! launcher would leave orphans holding ports, registered memory and shm files, and
//! `down` would need ssh to every host; tying the services' lifetime to one process
//! avoids both. Run `up` under tmux, `nohup ... &` or a service manager for a
//! long-lived cluster.
//!
//! Files, under `<log-dir>/<name>/` (`log-dir` from the topology file, default `runs`,
//! relative to the working directory): each service's log `<host>.<role>.<i>.log` (a
//! remote service's stderr comes back through ssh, so every log is on the launcher's
//! host), `addrs.toml` (unless `--out` says otherwise) and `up.pid`, the state file
//! naming the running `up` that `down` and `status` read.

use std::io::{BufRead, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use rrpc::topology::{Role, RoleKind, Topology};
use txn::coordinator::ClusterAddrs;

use crate::hosts::{Layout, Planned};
use crate::launcher::{LocalCluster, Place};

/// Start, stop and inspect a standalone cluster of rrpc services (memory nodes, tso,
/// lockd, TSO proxies) from a topology file.
///
/// `up` starts every service the file lists, each at its role's address with its host's
/// fabric flags (over ssh where the host is not this one), waits until each is ready,
/// writes the addresses as a TOML file applications load with
/// `txn::coordinator::ClusterAddrs::from_file`, and stays in the foreground holding the
/// services: Ctrl-C, SIGTERM or `rrpc-launch down` stops them all, and so does the end
/// of `up` by any means (local services die with it, remote ones when their ssh session
/// closes).
///
/// Each service is started with `--hosts FILE --as ROLE:i`, so it reads its role's own
/// keys (a memory node's flags, lockd's and tso's settings, the cluster secret) from the
/// topology file: on another host the file must be at the same absolute path, as the
/// binaries are in `bin-dir`.
#[derive(Parser, Debug)]
#[command(name = "rrpc-launch", version)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Start every service of the topology file, print and write their addresses, and
    /// hold them until SIGINT/SIGTERM (`rrpc-launch down`).
    Up(UpArgs),
    /// Stop the cluster a running `rrpc-launch up` holds (SIGTERM to it, then wait).
    Down(DownArgs),
    /// For each service: its address and whether its control port answers. Exits 1
    /// unless every one does.
    Status(StatusArgs),
    /// Print the end of each service's log.
    Logs(LogsArgs),
}

/// The topology file every subcommand reads.
#[derive(Args, Debug, Clone)]
pub struct HostsArg {
    /// Topology file (cluster.toml): hosts, roles, ports, log-dir.
    #[arg(long, value_name = "FILE")]
    pub hosts: PathBuf,
}

/// `rrpc-launch up`.
#[derive(Args, Debug, Clone)]
pub struct UpArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub hosts: HostsArg,
    /// Where to write the addresses (TOML for ClusterAddrs::from_file; default
    /// `<log-dir>/<name>/addrs.toml`). Removed when the cluster stops.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Extra flags for every memory node, split at white space, e.g. "--smallbank-accounts
    /// 100000" (they win over the `[[memnode]]` tables' keys). The node, address, fabric and
    /// partition flags come from the topology file and are refused here.
    #[arg(long, value_name = "FLAGS", allow_hyphen_values = true)]
    pub memnode_args: Option<String>,
    /// Print each host's command lines and the addresses file instead of starting
    /// anything.
    #[arg(long)]
    pub dry_run: bool,
    /// How long to wait for each service's READY line, seconds (>= 1), counted from its
    /// start or from its last PROGRESS line (a memory node prints one per partition image
    /// it loads).
    #[arg(long, value_name = "S", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub start_timeout_s: u64,
}

/// `rrpc-launch down`.
#[derive(Args, Debug, Clone)]
pub struct DownArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub hosts: HostsArg,
    /// How long to wait for `up` to stop its services, seconds (>= 1).
    #[arg(long, value_name = "S", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub wait_s: u64,
}

/// `rrpc-launch status`.
#[derive(Args, Debug, Clone)]
pub struct StatusArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub hosts: HostsArg,
    /// Timeout of each TCP connect to a control port, milliseconds (>= 1).
    #[arg(long, value_name = "MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout_ms: u64,
}

/// `rrpc-launch logs`.
#[derive(Args, Debug, Clone)]
pub struct LogsArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub hosts: HostsArg,
    /// Lines from the end of each log.
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub lines: usize,
}

/// Run a subcommand. Errors: the topology file does not load or lists no service; a
/// flag is refused; a service does not start (`up`, which then stops the others); a
/// service exits while `up` holds the cluster; `up` does not stop in time (`down`); a
/// service does not answer (`status`).
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Up(a) => up(&a),
        Command::Down(a) => down(&a),
        Command::Status(a) => status(&a),
        Command::Logs(a) => logs(&a),
    }
}

/// The flags a memory node gets from the topology file or from the launcher, which
/// `--memnode-args` may not give.
const RESERVED: &[&str] = &[
    "hosts",
    "as",
    "cluster",
    "node",
    "listen",
    "advertise",
    "fabric",
    "rdma-device",
    "rdma-port",
    "gid-index",
    "tclass",
    "sl",
    "partition",
    "partitions",
    "exit-on-stdin-eof",
];

/// `--memnode-args` as flags: split at white space, the first word a flag, no flag the
/// launcher sets. Errors: a stray value first, a reserved flag.
pub fn memnode_args(s: &str) -> anyhow::Result<Vec<String>> {
    let words: Vec<String> = s.split_whitespace().map(str::to_string).collect();
    if let Some(w) = words.first() {
        if !w.starts_with("--") {
            bail!("--memnode-args {s:?}: expected flags such as \"--smallbank-accounts 1000\", not {w:?} first");
        }
    }
    for w in &words {
        if let Some(name) = w.strip_prefix("--") {
            let name = name.split('=').next().unwrap_or(name);
            if RESERVED.contains(&name) {
                bail!(
                    "--memnode-args: --{name} comes from the topology file (the role's host, \
                     port, node id and partition), not from --memnode-args"
                );
            }
        }
    }
    Ok(words)
}

/// The context of an error starting `role`, whose stderr goes to `log`.
fn starting_it(role: &Role, log: &Path) -> String {
    format!(
        "{} ({}): starting it (its log: {})",
        role.spec(),
        role.table(),
        log.display()
    )
}

/// The service roles of `topo` in start order: memory nodes, the oracle (the lock
/// service bounds Lock RPC timestamps by it, proxies draw from it), the lock service,
/// the TSO proxies. Coordinators are the application's.
pub fn services(topo: &Topology) -> Vec<&Role> {
    topo.memnodes
        .iter()
        .chain(&topo.tso)
        .chain(&topo.lockd)
        .chain(&topo.tso_proxies)
        .collect()
}

/// Load the topology file; it must list a service. Errors: the file's (naming it), or
/// no service in it.
fn load(path: &Path) -> anyhow::Result<Topology> {
    let topo = Topology::load(path)?;
    if services(&topo).is_empty() {
        bail!(
            "{}: no service to start (no [[memnode]], [tso], [lockd] or [[tso-proxy]])",
            topo.path
        );
    }
    Ok(topo)
}

/// The state file of a running `up` of `topo`.
fn state_file(topo: &Topology) -> PathBuf {
    crate::hosts::log_dir_of(topo, &topo.name).join("up.pid")
}

/// The addresses file's default place.
fn default_out(topo: &Topology) -> PathBuf {
    crate::hosts::log_dir_of(topo, &topo.name).join("addrs.toml")
}

/// The addresses file: a comment line per service (`# ROLE:i node N at ADDR`), then,
/// when there is an oracle, the keys of [`ClusterAddrs`] (memory nodes in the file's
/// order). `started` pairs each of [`services`] with its address.
pub fn addrs_file(topo: &Topology, started: &[(&Role, SocketAddr)]) -> String {
    let mut s = format!(
        "# cluster {} ({} fabric), written by rrpc-launch up\n",
        topo.name, topo.fabric
    );
    for (r, a) in started {
        s.push_str(&format!("# {} node {} at {a}\n", r.spec(), r.node));
    }
    let of = |k: RoleKind| {
        started
            .iter()
            .filter(move |(r, _)| r.kind == k)
            .map(|p| p.1)
    };
    match of(RoleKind::Tso).next() {
        Some(tso) => s.push_str(
            &ClusterAddrs {
                memnodes: of(RoleKind::Memnode).collect(),
                lockd: of(RoleKind::Lockd).next(),
                tso,
            }
            .to_toml(),
        ),
        None => s.push_str("# no [tso]: not a file ClusterAddrs loads\n"),
    }
    s
}

/// The running `up` a state file names: its pid, when that process is alive and is
/// `rrpc-launch` (not a reused pid, not a zombie). Errors: none; an unreadable or
/// malformed file is `None`.
fn running_up(state: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(state).ok()?;
    let pid: u32 = text
        .lines()
        .find_map(|l| l.strip_prefix("pid = "))?
        .trim()
        .parse()
        .ok()?;
    is_launcher(pid).then_some(pid)
}

/// Whether process `pid` runs `rrpc-launch` (a zombie's command line is empty).
fn is_launcher(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| {
            c.split(|b| *b == 0)
                .next()
                .is_some_and(|argv0| String::from_utf8_lossy(argv0).ends_with("rrpc-launch"))
        })
        .unwrap_or(false)
}

/// Removes the state and addresses files when `up` ends.
struct UpFiles {
    state: PathBuf,
    out: Option<PathBuf>,
}

impl Drop for UpFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.state);
        if let Some(o) = &self.out {
            let _ = std::fs::remove_file(o);
        }
    }
}

/// Write `text` to `path` whole: a reader never sees half a file.
fn write_whole(path: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(d) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

/// `rrpc-launch up`.
fn up(a: &UpArgs) -> anyhow::Result<()> {
    let topo = load(&a.hosts.hosts)?;
    let extra = a
        .memnode_args
        .as_deref()
        .map(memnode_args)
        .transpose()?
        .unwrap_or_default();
    // The services read their roles' keys from the file: give them a path that works
    // from any directory (and, on another host, the same path there).
    let file = std::fs::canonicalize(&a.hosts.hosts)
        .with_context(|| format!("{}", a.hosts.hosts.display()))?;
    let state = state_file(&topo);
    if let Some(pid) = running_up(&state) {
        bail!(
            "cluster {} is already up (rrpc-launch up, pid {pid}, {}): rrpc-launch down --hosts {} first",
            topo.name,
            state.display(),
            a.hosts.hosts.display()
        );
    }
    let out = a.out.clone().unwrap_or_else(|| default_out(&topo));
    let bin_dir = topo
        .bin_dir
        .clone()
        .unwrap_or_else(crate::launcher::default_bin_dir);
    let name = topo.name.clone();
    let layout = if a.dry_run {
        Layout::planned(topo, &name)
    } else {
        Layout::of(topo, &name)?
    };
    let topo = layout.topology();
    let mut cluster = LocalCluster::new(&name, bin_dir)?;
    cluster.dry_run = a.dry_run;
    // Installed before anything starts, so a signal during start-up is not lost.
    let (tx, stop) = mpsc::channel();
    if !a.dry_run {
        ctrlc::set_handler(move || {
            let _ = tx.send(());
        })
        .context("installing the SIGINT/SIGTERM handler")?;
    }
    // Written before the services start, so that `down` can stop a slow start-up too.
    let mut files = if a.dry_run {
        None
    } else {
        write_whole(&state, &format!("pid = {}\n", std::process::id()))?;
        Some(UpFiles {
            state: state.clone(),
            out: None,
        })
    };
    if !a.dry_run {
        eprintln!(
            "cluster {name}: {} service(s), logs in {}",
            services(topo).len(),
            layout.log_dir().display()
        );
    }
    let timeout = Duration::from_secs(a.start_timeout_s);
    let mut started = Vec::new();
    let roles = services(topo);
    // Memory nodes start side by side (each loads its own rows), the rest one by one.
    let mut pending = Vec::new();
    for (i, &role) in roles.iter().enumerate() {
        if stop.try_recv().is_ok() {
            bail!("stopped during start-up");
        }
        let p = layout.service(role.kind, role.index)?;
        if role.kind == RoleKind::Memnode
            && extra.is_empty()
            && role.settings.is_empty()
            && !a.dry_run
        {
            eprintln!(
                "note: {} holds no tables (give --memnode-args or keys in its [[memnode]] table)",
                role.spec()
            );
        }
        let args = service_args(role, &p, &file, &extra);
        let starting = cluster
            .spawn_at(
                &p.place,
                role.kind.binary(),
                p.node,
                &args,
                timeout,
                Some(&p.log),
            )
            .with_context(|| starting_it(role, &p.log))?;
        pending.push((role, p, starting));
        let next_memnode = roles
            .get(i + 1)
            .is_some_and(|r| r.kind == RoleKind::Memnode);
        if role.kind == RoleKind::Memnode && next_memnode {
            continue;
        }
        for (role, p, starting) in pending.drain(..) {
            let addr = cluster
                .wait_ready(starting)
                .with_context(|| starting_it(role, &p.log))?;
            if !a.dry_run {
                let at = match &p.place {
                    Place::Local => "here".to_string(),
                    Place::Ssh { target, .. } => format!("over ssh on {target}"),
                };
                eprintln!("{} (node {}) ready at {addr}, {at}", role.spec(), p.node);
            }
            started.push((role, addr));
        }
    }
    let text = addrs_file(topo, &started);
    if a.dry_run {
        let mut o = std::io::stdout().lock();
        let _ = writeln!(o, "[dry-run] {} would hold:", out.display());
        let _ = o.write_all(text.as_bytes());
        return Ok(());
    }
    write_whole(&out, &text)?;
    if let Some(f) = files.as_mut() {
        f.out = Some(out.clone());
    }
    {
        let mut o = std::io::stdout().lock();
        let _ = o.write_all(text.as_bytes());
        let _ = o.flush();
    }
    eprintln!(
        "cluster {name} is up; addresses in {}. Ctrl-C, SIGTERM (pid {}) or rrpc-launch down \
         --hosts {} stops it.",
        out.display(),
        std::process::id(),
        a.hosts.hosts.display()
    );
    let result = hold(&mut cluster, &stop, layout.log_dir());
    eprintln!(
        "cluster {name}: stopping {} service(s)",
        cluster.services.len()
    );
    cluster.shutdown();
    eprintln!("cluster {name}: stopped");
    result
}

/// The flags of service `role`, placed as `p`: its host's fabric flags, its address,
/// its role in the topology file `file` (absolute), and for a memory node `extra`
/// (`--memnode-args`, last: explicit flags win over the file's keys).
fn service_args(role: &Role, p: &Planned, file: &Path, extra: &[String]) -> Vec<String> {
    let mut args = p.flags.clone();
    args.extend([
        "--listen".into(),
        p.listen.clone(),
        "--hosts".into(),
        file.display().to_string(),
        "--as".into(),
        role.spec(),
    ]);
    if role.kind == RoleKind::Memnode {
        args.extend(extra.iter().cloned());
    }
    args
}

/// Hold a started cluster until a stop signal (`Ok`) or until a service exits (an
/// error naming it and the logs in `logs`); the caller stops the rest.
fn hold(cluster: &mut LocalCluster, stop: &mpsc::Receiver<()>, logs: &Path) -> anyhow::Result<()> {
    loop {
        match stop.recv_timeout(Duration::from_millis(200)) {
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(()),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if let Err(e) = cluster.check_alive() {
            bail!("{e}: stopping the cluster (its logs: {})", logs.display());
        }
    }
}

/// `rrpc-launch down`.
fn down(a: &DownArgs) -> anyhow::Result<()> {
    let topo = load(&a.hosts.hosts)?;
    let state = state_file(&topo);
    if !state.exists() {
        eprintln!(
            "cluster {}: nothing to stop (no {}: rrpc-launch up is not running for it here)",
            topo.name,
            state.display()
        );
        return Ok(());
    }
    let Some(pid) = running_up(&state) else {
        let _ = std::fs::remove_file(&state);
        eprintln!(
            "cluster {}: nothing to stop ({} named an rrpc-launch up that is gone: removed)",
            topo.name,
            state.display()
        );
        return Ok(());
    };
    // SAFETY: kill(2) with a pid checked above to be a live rrpc-launch.
    if unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) } != 0 {
        bail!(
            "SIGTERM to rrpc-launch up (pid {pid}): {}",
            std::io::Error::last_os_error()
        );
    }
    let deadline = Instant::now() + Duration::from_secs(a.wait_s);
    while is_launcher(pid) {
        if Instant::now() > deadline {
            bail!(
                "rrpc-launch up (pid {pid}) still running {} s after SIGTERM; `kill -9 {pid}` \
                 also stops its services",
                a.wait_s
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("cluster {}: stopped (rrpc-launch up, pid {pid})", topo.name);
    Ok(())
}

/// Whether a TCP connection to `addr` (HOST:PORT) opens within `timeout`: `Ok` with
/// the address, else why not.
pub fn probe(addr: &str, timeout: Duration) -> Result<SocketAddr, String> {
    let a = rrpc::service::parse_addr(addr)?;
    TcpStream::connect_timeout(&a, timeout)
        .map(|_| a)
        .map_err(|e| e.to_string())
}

/// `rrpc-launch status`.
fn status(a: &StatusArgs) -> anyhow::Result<()> {
    let topo = load(&a.hosts.hosts)?;
    let state = state_file(&topo);
    let mut o = std::io::stdout().lock();
    let _ = match running_up(&state) {
        Some(pid) => writeln!(
            o,
            "cluster {}: rrpc-launch up running (pid {pid})",
            topo.name
        ),
        None => writeln!(o, "cluster {}: no rrpc-launch up running here", topo.name),
    };
    let timeout = Duration::from_millis(a.timeout_ms);
    let mut down = 0;
    let all = services(&topo);
    for r in &all {
        let addr = topo.addr_of(r);
        let st = match probe(&addr, timeout) {
            Ok(_) => "up".to_string(),
            Err(e) => {
                down += 1;
                format!("down ({e})")
            }
        };
        let _ = writeln!(
            o,
            "{:<12} node {:<5} {:<22} host {:<10} {st}",
            r.spec(),
            r.node.to_string(),
            addr,
            r.host
        );
    }
    drop(o);
    if down > 0 {
        bail!("{down} of {} service(s) do not answer", all.len());
    }
    Ok(())
}

/// The last `n` lines of `path`. Errors: the file cannot be read.
fn tail(path: &Path, n: usize) -> std::io::Result<Vec<String>> {
    let f = std::fs::File::open(path)?;
    let mut last = std::collections::VecDeque::with_capacity(n.min(1 << 16));
    for line in std::io::BufReader::new(f).lines() {
        let line = line.unwrap_or_else(|e| format!("(unreadable line: {e})"));
        if last.len() == n {
            last.pop_front();
        }
        if n > 0 {
            last.push_back(line);
        }
    }
    Ok(last.into())
}

/// `rrpc-launch logs`.
fn logs(a: &LogsArgs) -> anyhow::Result<()> {
    let topo = load(&a.hosts.hosts)?;
    let dir = crate::hosts::log_dir_of(&topo, &topo.name);
    let mut o = std::io::stdout().lock();
    for r in services(&topo) {
        let log = dir.join(format!("{}.{}.{}.log", r.host, r.kind, r.index));
        let _ = writeln!(o, "==> {} ({}) <==", log.display(), r.spec());
        match tail(&log, a.lines) {
            Ok(lines) => {
                for l in lines {
                    let _ = writeln!(o, "{l}");
                }
            }
            Err(e) => {
                let _ = writeln!(o, "(no log: {e})");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("rrpc-launch").chain(args.iter().copied()))
    }

    #[test]
    fn every_subcommand_needs_the_topology_file() {
        for sub in ["up", "down", "status", "logs"] {
            let e = parse(&[sub]).unwrap_err();
            assert!(e.to_string().contains("--hosts"), "{sub}: {e}");
            assert!(parse(&[sub, "--hosts", "c.toml"]).is_ok(), "{sub}");
        }
        assert!(parse(&[]).is_err());
        assert!(parse(&["sync", "--hosts", "c.toml"]).is_err());
    }

    #[test]
    fn up_takes_memnode_flags_as_one_value_and_refuses_a_zero_timeout() {
        let c = parse(&[
            "up",
            "--hosts",
            "c.toml",
            "--memnode-args",
            "--smallbank-accounts 100",
            "--dry-run",
        ])
        .unwrap();
        let Command::Up(u) = c.command else {
            panic!("not up")
        };
        assert!(u.dry_run);
        assert_eq!(
            memnode_args(u.memnode_args.as_deref().unwrap()).unwrap(),
            ["--smallbank-accounts", "100"]
        );
        assert!(parse(&["up", "--hosts", "c.toml", "--start-timeout-s", "0"]).is_err());
        assert!(parse(&["status", "--hosts", "c.toml", "--timeout-ms", "0"]).is_err());
        assert!(parse(&["down", "--hosts", "c.toml", "--dry-run"]).is_err());
    }

    #[test]
    fn memnode_args_refuse_what_the_topology_decides() {
        assert!(memnode_args("").unwrap().is_empty());
        assert_eq!(
            memnode_args("  --tpcc-warehouses=2   --versions 4 ").unwrap(),
            ["--tpcc-warehouses=2", "--versions", "4"]
        );
        for bad in [
            "--listen 0.0.0.0:1",
            "--node 7",
            "--partition=1",
            "--smallbank-accounts 5 --fabric verbs",
            "--hosts x.toml",
        ] {
            let e = memnode_args(bad).unwrap_err().to_string();
            assert!(e.contains("comes from the topology file"), "{bad}: {e}");
        }
        let e = memnode_args("100 --smallbank-accounts")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not \"100\" first"), "{e}");
    }

    const TOPO: &str = r#"
name = "t"
fabric = "shm"
[hosts.here]
ctrl-ip = "127.0.0.1"
[[memnode]]
host = "here"
port = 7010
smallbank-accounts = 10
[[memnode]]
host = "here"
port = 7011
[lockd]
host = "here"
port = 7002
[tso]
host = "here"
port = 7003
[[tso-proxy]]
host = "here"
port = 7020
[coordinators]
hosts = ["here"]
"#;

    #[test]
    fn services_start_memnodes_then_the_oracle_and_never_coordinators() {
        let topo = Topology::parse(TOPO, "t.toml").unwrap();
        let specs: Vec<String> = services(&topo).iter().map(|r| r.spec()).collect();
        assert_eq!(
            specs,
            ["memnode:0", "memnode:1", "tso:0", "lockd:0", "tso-proxy:0"]
        );
    }

    #[test]
    fn the_addresses_file_round_trips_through_cluster_addrs() {
        let topo = Topology::parse(TOPO, "t.toml").unwrap();
        let all = services(&topo);
        let started: Vec<(&Role, SocketAddr)> = all
            .iter()
            .map(|r| (*r, format!("127.0.0.1:{}", r.port).parse().unwrap()))
            .collect();
        let text = addrs_file(&topo, &started);
        assert!(
            text.contains("# tso-proxy:0 node 4 at 127.0.0.1:7020"),
            "{text}"
        );
        let a = ClusterAddrs::from_toml(&text).unwrap();
        let m: Vec<String> = a.memnodes.iter().map(|x| x.to_string()).collect();
        assert_eq!(m, ["127.0.0.1:7010", "127.0.0.1:7011"]);
        assert_eq!(a.lockd.unwrap().to_string(), "127.0.0.1:7002");
        assert_eq!(a.tso.to_string(), "127.0.0.1:7003");
        assert_eq!(
            ClusterAddrs::from_toml(&a.to_toml()).unwrap().to_toml(),
            a.to_toml()
        );
        // Without a lock service (IPv6 addresses too), through a file.
        let b = ClusterAddrs {
            memnodes: vec!["[::1]:9".parse().unwrap()],
            lockd: None,
            tso: "[::1]:10".parse().unwrap(),
        };
        assert!(!b.to_toml().contains("lockd"));
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("addrs.toml");
        std::fs::write(&p, b.to_toml()).unwrap();
        let c = ClusterAddrs::from_file(&p).unwrap();
        assert_eq!((c.memnodes, c.lockd, c.tso), (b.memnodes, None, b.tso));
    }

    #[test]
    fn a_bad_addresses_file_names_itself_and_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none.toml");
        let e = ClusterAddrs::from_file(&missing).unwrap_err().to_string();
        assert!(e.contains("none.toml"), "{e}");
        for (text, want) in [
            ("memnodes = []\n", "tso"),
            (
                "memnodes = []\ntso = \"localhost:3\"\n",
                "invalid socket address",
            ),
            (
                "memnodes = []\ntso = \"127.0.0.1:3\"\nlock = \"127.0.0.1:2\"\n",
                "lock",
            ),
        ] {
            let p = dir.path().join("bad.toml");
            std::fs::write(&p, text).unwrap();
            let e = ClusterAddrs::from_file(&p).unwrap_err().to_string();
            assert!(e.contains("bad.toml") && e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn a_topology_without_a_service_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(
            &p,
            "name = \"t\"\nfabric = \"shm\"\n[hosts.here]\nctrl-ip = \"127.0.0.1\"\n[coordinators]\nhosts = [\"here\"]\n",
        )
        .unwrap();
        let e = load(&p).unwrap_err().to_string();
        assert!(e.contains("no service to start"), "{e}");
    }

    #[test]
    fn a_state_file_of_a_gone_process_names_no_running_up() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("up.pid");
        assert_eq!(running_up(&p), None);
        // This test binary is alive but is not rrpc-launch.
        std::fs::write(&p, format!("pid = {}\n", std::process::id())).unwrap();
        assert_eq!(running_up(&p), None);
        std::fs::write(&p, "pid = nonsense\n").unwrap();
        assert_eq!(running_up(&p), None);
    }

    #[test]
    fn a_tail_keeps_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.log");
        std::fs::write(&p, "a\nb\nc\n").unwrap();
        assert_eq!(tail(&p, 2).unwrap(), ["b", "c"]);
        assert_eq!(tail(&p, 10).unwrap(), ["a", "b", "c"]);
        assert!(tail(&p, 0).unwrap().is_empty());
    }
}
