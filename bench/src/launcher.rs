//! A cluster of service processes (memnode, lockd, tso) started as children: on this
//! host directly, or on another host over ssh ([`Place::Ssh`], from a topology file).
//! Children are stopped (SIGTERM, then SIGKILL after a grace period) when the
//! [`LocalCluster`] is dropped, which also happens on panic; each local child also gets
//! `PR_SET_PDEATHSIG` so it dies with this process even after a `kill -9`. A remote one
//! runs with `--exit-on-stdin-eof` and its stdin is the ssh session's, which this process
//! holds: when it dies, ssh closes the remote stdin and the service stops.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};

/// A running child service.
pub struct Service {
    /// Role name (binary name).
    pub name: String,
    /// Node id.
    pub node: u32,
    /// Bootstrap address it printed.
    pub addr: SocketAddr,
    /// Where it runs.
    pub place: Place,
    child: Child,
    /// A remote service's stdin (the ssh session's): closing it stops the service.
    stdin: Option<std::process::ChildStdin>,
    /// A remote service's pid on its host (its [`REMOTE_PID`] line), for faults.
    remote_pid: Option<u32>,
    /// The file its stderr is appended to, if any (a restart appends to it again).
    log: Option<PathBuf>,
}

/// A service [`LocalCluster::spawn_at`] started and [`LocalCluster::wait_ready`] has not
/// waited for yet; dropped unwaited, its process is killed.
pub struct Starting {
    name: String,
    node: u32,
    place: Place,
    log: Option<PathBuf>,
    timeout: Duration,
    /// The process, or in a dry run the address it would listen on.
    run: Result<Running, SocketAddr>,
}

/// A started process and what its stdout says.
struct Running {
    /// Taken when it becomes a [`Service`].
    child: Option<Child>,
    stdin: Option<std::process::ChildStdin>,
    rx: mpsc::Receiver<Said>,
    /// Its command line, for the errors.
    line: Vec<String>,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The line a process started over ssh prints first on stdout: `REMOTE-PID <pid>`, its
/// pid on its host (the remote shell's, which `exec`s the binary), so that a fault can
/// signal it there ([`Place::signal`]).
pub const REMOTE_PID: &str = "REMOTE-PID ";

/// What a starting service says on stdout, as [`LocalCluster::start_at`] reads it.
enum Said {
    /// Its [`REMOTE_PID`] line.
    Pid(u32),
    /// A `PROGRESS ...` line ([`rrpc::service::announce_progress`]).
    Progress,
    /// Its `READY <addr>` line's address, unparsed.
    Ready(String),
}

/// The start of a progress line ([`rrpc::service::announce_progress`]).
const PROGRESS_PREFIX: &str = "PROGRESS ";

/// The pid of a [`REMOTE_PID`] line.
pub fn remote_pid_of(line: &str) -> Option<u32> {
    line.strip_prefix(REMOTE_PID)?.trim().parse().ok()
}

/// Where a service process runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Place {
    /// On this host, a child of this process.
    Local,
    /// On another host, started over ssh: `target` is what ssh connects to (`user@host`
    /// or a host name), `bin_dir` where the binaries are there. The ssh binary is `ssh`,
    /// or `$RRPC_SSH` (tests use a shim that runs the command here).
    Ssh {
        /// ssh's destination.
        target: String,
        /// The binaries' directory on that host.
        bin_dir: PathBuf,
    },
}

impl Place {
    /// The command that starts `bin_name` with `args` here: the program and its
    /// arguments (for a remote place, ssh's). `local_bin` is the binary on this host.
    /// A remote process first prints its pid there ([`REMOTE_PID`]), then `exec`s the
    /// binary.
    pub fn command_line(&self, local_bin: &Path, bin_name: &str, args: &[String]) -> Vec<String> {
        match self {
            Place::Local => std::iter::once(local_bin.display().to_string())
                .chain(args.iter().cloned())
                .collect(),
            Place::Ssh { target, bin_dir } => {
                let mut v = ssh_prefix(target);
                v.extend([
                    "echo".into(),
                    REMOTE_PID.trim().into(),
                    "$$;".into(),
                    "exec".into(),
                    shell_quote(&bin_dir.join(bin_name).display().to_string()),
                ]);
                v.extend(args.iter().map(|a| shell_quote(a)));
                v
            }
        }
    }

    /// Run `cmd` (a program and its arguments) at this place and wait for it: here
    /// directly, or over ssh. Returns its stdout.
    ///
    /// Errors: it cannot be started, or it fails (its status and stderr).
    pub fn run(&self, cmd: &[&str]) -> anyhow::Result<Vec<u8>> {
        let line: Vec<String> = match self {
            Place::Local => cmd.iter().map(|s| s.to_string()).collect(),
            Place::Ssh { target, .. } => {
                let mut v = ssh_prefix(target);
                v.extend(cmd.iter().map(|a| shell_quote(a)));
                v
            }
        };
        let out = Command::new(&line[0])
            .args(&line[1..])
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("starting {}", line[0]))?;
        if !out.status.success() {
            bail!(
                "{} on {}: {}: {}",
                cmd.join(" "),
                self.describe(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(out.stdout)
    }

    /// Send signal `sig` (a name: `KILL`, `STOP`, `CONT`) to process `pid` of this place
    /// (a remote process's pid on its host, see [`REMOTE_PID`]): `kill(2)` here,
    /// `ssh host kill -SIG PID` for a remote place.
    ///
    /// Errors: the signal name is unknown; the kill fails (no such process).
    pub fn signal(&self, pid: u32, sig: &str) -> anyhow::Result<()> {
        match self {
            Place::Local => {
                let n = match sig {
                    "KILL" => libc::SIGKILL,
                    "STOP" => libc::SIGSTOP,
                    "CONT" => libc::SIGCONT,
                    "TERM" => libc::SIGTERM,
                    _ => bail!("unknown signal {sig}"),
                };
                // SAFETY: kill(2) has no memory effects on this process.
                if unsafe { libc::kill(pid as libc::pid_t, n) } != 0 {
                    return Err(std::io::Error::last_os_error())
                        .with_context(|| format!("kill -{sig} {pid}"));
                }
                Ok(())
            }
            Place::Ssh { .. } => self
                .run(&["kill", &format!("-{sig}"), &pid.to_string()])
                .map(|_| ()),
        }
    }

    /// Read file `path` at this place (`ssh host cat PATH` for a remote one).
    ///
    /// Errors: it cannot be read.
    pub fn read(&self, path: &Path) -> anyhow::Result<Vec<u8>> {
        match self {
            Place::Local => {
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))
            }
            Place::Ssh { .. } => self.run(&["cat", &path.display().to_string()]),
        }
    }

    /// Remove file `path` at this place, if it exists.
    ///
    /// Errors: the removal (or the ssh session) fails.
    pub fn remove(&self, path: &Path) -> anyhow::Result<()> {
        match self {
            Place::Local => match std::fs::remove_file(path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(e).with_context(|| format!("removing {}", path.display()))
                }
                _ => Ok(()),
            },
            Place::Ssh { .. } => self
                .run(&["rm", "-f", &path.display().to_string()])
                .map(|_| ()),
        }
    }

    /// "this host", or the ssh destination.
    pub fn describe(&self) -> String {
        match self {
            Place::Local => "this host".into(),
            Place::Ssh { target, .. } => target.clone(),
        }
    }
}

/// ssh (or `$RRPC_SSH`) with the launcher's options, to `target`, up to the `--` that
/// precedes the remote command.
fn ssh_prefix(target: &str) -> Vec<String> {
    let ssh = std::env::var("RRPC_SSH").unwrap_or_else(|_| "ssh".into());
    vec![
        ssh,
        "-o".into(),
        "BatchMode=yes".into(),
        "-o".into(),
        "ControlMaster=auto".into(),
        "-o".into(),
        "ControlPath=/tmp/rrpc-ssh-%C".into(),
        "-o".into(),
        "ControlPersist=60".into(),
        target.to_string(),
        "--".into(),
    ]
}

/// The address a service of a dry run is taken to answer at: its `--listen` flag.
fn listen_of(flags: &[String]) -> Option<SocketAddr> {
    let i = flags.iter().position(|f| f == "--listen")?;
    rrpc::service::parse_addr(flags.get(i + 1)?).ok()
}

/// What exit status 127 of a remote start means (the remote shell found no such
/// binary), for an error message; empty otherwise.
fn missing_hint(place: &Place, st: &std::process::ExitStatus, line: &[String]) -> String {
    match place {
        Place::Ssh { target, bin_dir } if st.code() == Some(127) => format!(
            " (the shell on {target} found no such command: is {} there? bin-dir is {})",
            line.iter()
                .skip_while(|a| *a != "exec")
                .nth(1)
                .map_or("the binary", String::as_str),
            bin_dir.display()
        ),
        _ => String::new(),
    }
}

/// How many of a service's last log lines an error about its start quotes.
const LOG_TAIL_LINES: usize = 6;

/// The last [`LOG_TAIL_LINES`] non-empty lines of a service's log at `place` (`log`:
/// where its stderr went), as a suffix for an error that it exited before it was ready;
/// empty without a log or when it cannot be read (the error then stands alone).
fn log_tail(place: &Place, log: Option<&Path>) -> String {
    let Some(path) = log else {
        return String::new();
    };
    let Ok(bytes) = place.read(path) else {
        return String::new();
    };
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        return format!("; its log {} is empty", path.display());
    }
    let last = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
    format!(
        "; its log {} ends:\n    {}",
        path.display(),
        last.join("\n    ")
    )
}

/// `s` quoted for the remote shell ssh hands its command to (as is when it needs no
/// quoting).
fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=,@+%".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// Child processes of one local cluster, and the cluster's shm directory.
pub struct LocalCluster {
    /// Started services, in start order.
    pub services: Vec<Service>,
    /// Print each command line (`[dry-run] ...`) instead of running it; the service is
    /// taken to answer at its `--listen` address.
    pub dry_run: bool,
    bin_dir: PathBuf,
    /// Last field: the directory is removed after `Drop` stopped the children.
    dir: rrpc::fabric::shm::ClusterGuard,
}

/// Directory holding the workspace binaries: the directory of the running executable,
/// or its parent when running from `target/*/deps` (tests).
pub fn default_bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.parent().map(Path::to_path_buf).unwrap_or(dir)
    } else {
        dir
    }
}

impl Service {
    /// The child process's id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl LocalCluster {
    /// The cluster's name (what child processes and fabrics open).
    pub fn name(&self) -> &str {
        self.dir.name()
    }

    /// Prepare cluster `cluster`: a stale shm directory from a crashed run is removed (and
    /// reported); a directory in use by live nodes is an error.
    pub fn new(cluster: &str, bin_dir: PathBuf) -> anyhow::Result<Self> {
        let (dir, state) = rrpc::fabric::shm::ClusterGuard::new(cluster)?;
        match state {
            rrpc::fabric::shm::ClusterDirState::Fresh => {}
            rrpc::fabric::shm::ClusterDirState::RemovedStale { files } => eprintln!(
                "removed stale cluster directory {} ({files} files) left by a crashed run",
                rrpc::fabric::shm::cluster_dir(cluster).display()
            ),
        }
        Ok(Self {
            services: Vec::new(),
            dry_run: false,
            bin_dir,
            dir,
        })
    }

    /// Start binary `name` as node `node` with extra `args`, and wait for its `READY
    /// <addr>` line: up to `timeout` from the start, or from its last `PROGRESS` line (a
    /// memory node loading its rows says one per partition image). Its stderr passes
    /// through.
    pub fn start(
        &mut self,
        name: &str,
        node: u32,
        args: &[String],
        timeout: Duration,
    ) -> anyhow::Result<SocketAddr> {
        self.start_at(&Place::Local, name, node, args, timeout, None)
    }

    /// The full command line [`Self::start_at`] runs for these arguments.
    pub fn command_line(
        &self,
        place: &Place,
        name: &str,
        node: u32,
        args: &[String],
    ) -> Vec<String> {
        let mut all = vec![
            "--cluster".to_string(),
            self.dir.name().to_string(),
            "--node".into(),
            node.to_string(),
        ];
        all.extend(args.iter().cloned());
        if matches!(place, Place::Ssh { .. }) {
            all.push("--exit-on-stdin-eof".into());
        }
        place.command_line(&self.bin_dir.join(name), name, &all)
    }

    /// [`Self::start`] at `place` (a remote one runs with `--exit-on-stdin-eof`, its
    /// stdin held open by this process), its stderr appended to `log` when given.
    ///
    /// Errors: the binary is missing here (a local place), the process cannot be
    /// started, it exits before `READY` or says nothing for `timeout`, it prints a bad
    /// address.
    pub fn start_at(
        &mut self,
        place: &Place,
        name: &str,
        node: u32,
        args: &[String],
        timeout: Duration,
        log: Option<&Path>,
    ) -> anyhow::Result<SocketAddr> {
        let starting = self.spawn_at(place, name, node, args, timeout, log)?;
        self.wait_ready(starting)
    }

    /// The first half of [`Self::start_at`]: start the process and return at once, so
    /// that several services (memory nodes loading their rows) start side by side; then
    /// [`Self::wait_ready`] on each. A [`Starting`] dropped unwaited kills its process.
    ///
    /// Errors: the binary is missing here (a local place), the process cannot be
    /// started; in a dry run, no `--listen` address in `args`.
    pub fn spawn_at(
        &mut self,
        place: &Place,
        name: &str,
        node: u32,
        args: &[String],
        timeout: Duration,
        log: Option<&Path>,
    ) -> anyhow::Result<Starting> {
        let bin = self.bin_dir.join(name);
        let starting = |run| Starting {
            name: name.into(),
            node,
            place: place.clone(),
            log: log.map(Path::to_path_buf),
            timeout,
            run,
        };
        if self.dry_run {
            let line = self.command_line(place, name, node, args);
            let at = match place {
                Place::Local => "this host".to_string(),
                Place::Ssh { target, .. } => target.clone(),
            };
            println!("[dry-run] {at}: {}", line.join(" "));
            let addr = listen_of(args)
                .with_context(|| format!("{name}: a dry run needs its --listen address"))?;
            return Ok(starting(Err(addr)));
        }
        if *place == Place::Local && !bin.exists() {
            bail!(
                "{} not found; build the workspace binaries first: cargo build --release --workspace \
                 (or pass --bin-dir)",
                bin.display()
            );
        }
        let line = self.command_line(place, name, node, args);
        let mut cmd = Command::new(&line[0]);
        cmd.args(&line[1..])
            .stdin(if *place == Place::Local {
                Stdio::null()
            } else {
                Stdio::piped()
            })
            .stdout(Stdio::piped())
            // Own process group: a terminal's Ctrl-C reaches only the launcher, which
            // then stops the run, audits, and shuts the children down in order.
            .process_group(0);
        match log {
            Some(p) => {
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .with_context(|| format!("opening the log {}", p.display()))?;
                cmd.stderr(f);
            }
            None => {
                cmd.stderr(Stdio::inherit());
            }
        }
        // SAFETY: prctl is async-signal-safe; the closure touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", line[0]))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let said = if let Some(pid) = remote_pid_of(&line) {
                    Said::Pid(pid)
                } else if let Some(a) = line.strip_prefix("READY ") {
                    Said::Ready(a.trim().to_string())
                } else if line.starts_with(PROGRESS_PREFIX) {
                    Said::Progress
                } else {
                    continue;
                };
                let _ = tx.send(said);
            }
        });
        Ok(starting(Ok(Running {
            child: Some(child),
            stdin,
            rx,
            line,
        })))
    }

    /// The second half of [`Self::start_at`]: wait for the `READY <addr>` line of a
    /// service [`Self::spawn_at`] started: up to its timeout from now, or from its last
    /// `PROGRESS` line.
    ///
    /// Errors: it exits before `READY` or says nothing for the timeout (it is killed),
    /// it prints a bad address.
    pub fn wait_ready(&mut self, mut starting: Starting) -> anyhow::Result<SocketAddr> {
        let Starting {
            ref name,
            node,
            ref place,
            ref log,
            timeout,
            ref mut run,
        } = starting;
        let log = log.as_deref();
        let run = match run {
            Ok(r) => r,
            Err(addr) => return Ok(*addr),
        };
        let rx = &run.rx;
        let line = &run.line;
        let child = run.child.as_mut().expect("not waited yet");
        let mut deadline = Instant::now() + timeout;
        let mut remote_pid = None;
        let addr = loop {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(Said::Pid(pid)) => remote_pid = Some(pid),
                // Alive and getting on (a memory node loading its rows): the timeout
                // counts from its last sign of progress.
                Ok(Said::Progress) => deadline = Instant::now() + timeout,
                Ok(Said::Ready(a)) => {
                    break a
                        .parse::<SocketAddr>()
                        .map_err(|e| anyhow!("{name} printed a bad address {a:?}: {e}"))?
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Some(st) = child.try_wait()? {
                        bail!(
                            "{name} (node {node}) exited before it was ready: {st}{}{}",
                            missing_hint(place, &st, line),
                            log_tail(place, log)
                        );
                    }
                    if Instant::now() > deadline {
                        let _ = child.kill();
                        bail!("{name} (node {node}) not ready: nothing from it for {timeout:?}");
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let st = child.wait()?;
                    bail!(
                        "{name} (node {node}) exited before it was ready: {st}{}{}",
                        missing_hint(place, &st, line),
                        log_tail(place, log)
                    );
                }
            }
        };
        let child = run.child.take().expect("not waited yet");
        self.services.push(Service {
            name: name.clone(),
            node,
            addr,
            place: place.clone(),
            child,
            stdin: run.stdin.take(),
            remote_pid,
            log: log.map(Path::to_path_buf),
        });
        Ok(addr)
    }

    /// Where node `node` runs and the file its stderr goes to, to start it again in the
    /// same place after a fault ([`Self::start_at`]); `None` when no service runs as it.
    pub fn place_of(&self, node: u32) -> Option<(Place, Option<PathBuf>)> {
        self.services
            .iter()
            .find(|s| s.node == node)
            .map(|s| (s.place.clone(), s.log.clone()))
    }

    /// Fault injection: SIGKILL node `node`'s process and reap it (it leaves
    /// [`LocalCluster::services`]); on another host through ssh (`kill -KILL <its pid
    /// there>`), then its ssh client, which ends with it, is reaped. Returns its role
    /// name and bootstrap address, to restart it with [`LocalCluster::start`]
    /// (`--listen <addr>` keeps the address).
    ///
    /// Errors: no such node; the signal could not be sent (or a remote service never
    /// said its pid).
    pub fn kill(&mut self, node: u32) -> anyhow::Result<(String, SocketAddr)> {
        let i = self
            .services
            .iter()
            .position(|s| s.node == node)
            .ok_or_else(|| anyhow!("no service runs as node {node}"))?;
        let mut s = self.services.remove(i);
        match (&s.place, s.remote_pid) {
            (Place::Local, _) => s
                .child
                .kill()
                .with_context(|| format!("SIGKILL to {} (node {node})", s.name))?,
            (place, Some(pid)) => {
                place
                    .signal(pid, "KILL")
                    .with_context(|| format!("SIGKILL to {} (node {node})", s.name))?;
                reap_within(&mut s.child, Duration::from_secs(5));
            }
            (place, None) => bail!(
                "{} (node {node}) on {} never said its pid there ({REMOTE_PID:?} line)",
                s.name,
                place.describe()
            ),
        }
        s.child
            .wait()
            .with_context(|| format!("reaping {} (node {node})", s.name))?;
        Ok((s.name, s.addr))
    }

    /// Fault injection: send `sig` (`"STOP"`, `"CONT"`, ...) to node `node`'s process
    /// (on another host through ssh); returns its pid there.
    ///
    /// Errors: no such node; the signal could not be sent (or a remote service never
    /// said its pid).
    pub fn signal_node(&self, node: u32, sig: &str) -> anyhow::Result<u32> {
        let s = self
            .services
            .iter()
            .find(|s| s.node == node)
            .ok_or_else(|| anyhow!("no service runs as node {node}"))?;
        let pid = match (&s.place, s.remote_pid) {
            (Place::Local, _) => s.child.id(),
            (_, Some(pid)) => pid,
            (place, None) => bail!(
                "{} (node {node}) on {} never said its pid there ({REMOTE_PID:?} line)",
                s.name,
                place.describe()
            ),
        };
        s.place
            .signal(pid, sig)
            .with_context(|| format!("SIG{sig} to {} (node {node})", s.name))?;
        Ok(pid)
    }

    /// Whether every child is still running; the first one that exited, otherwise.
    pub fn check_alive(&mut self) -> Result<(), String> {
        for s in &mut self.services {
            if let Ok(Some(st)) = s.child.try_wait() {
                return Err(format!("{} (node {}) exited: {st}", s.name, s.node));
            }
        }
        Ok(())
    }

    /// Stop all children: a local one by SIGTERM, a remote one by closing its stdin (its
    /// ssh client ends once it has exited); SIGKILL to whatever still runs after 3 s.
    /// (The shm directory goes when the cluster is dropped.)
    pub fn shutdown(&mut self) {
        // A remote service stops when its stdin closes, and its ssh client ends once the
        // service has exited: waiting for the client, not SIGTERMing it, is what tells
        // that the service let go of its port (the next run may start one there at
        // once). Local services get SIGTERM.
        for s in &mut self.services {
            drop(s.stdin.take());
        }
        for s in self.services.iter().filter(|s| s.place == Place::Local) {
            // SAFETY: kill(2) with a pid we spawned and have not reaped.
            unsafe { libc::kill(s.child.id() as libc::pid_t, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        for s in &mut self.services {
            loop {
                match s.child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() > deadline => {
                        let _ = s.child.kill();
                        let _ = s.child.wait();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        }
        self.services.clear();
    }
}

/// Wait up to `wait` for `child` to end (an ssh client whose remote process was
/// killed ends with it), then SIGKILL it.
pub fn reap_within(child: &mut Child, wait: Duration) {
    let deadline = Instant::now() + wait;
    while matches!(child.try_wait(), Ok(None)) {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = child.wait();
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_that_exits_early_has_its_log_tail_quoted() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("memnode.0.log");
        let text: String = (1..=9).map(|i| format!("line {i}\n\n")).collect();
        std::fs::write(&log, text).unwrap();
        let t = log_tail(&Place::Local, Some(&log));
        assert!(t.contains("ends:\n    line 4\n    line 5"), "{t}");
        assert!(t.ends_with("line 9") && !t.contains("line 3"), "{t}");
        std::fs::write(&log, "\n").unwrap();
        assert!(log_tail(&Place::Local, Some(&log)).ends_with("is empty"));
        assert_eq!(log_tail(&Place::Local, Some(&dir.path().join("none"))), "");
        assert_eq!(log_tail(&Place::Local, None), "");
    }

    #[test]
    fn a_remote_start_says_its_pid_then_execs_the_binary() {
        let place = Place::Ssh {
            target: "me@a".into(),
            bin_dir: PathBuf::from("/opt/rrpc/bin"),
        };
        let line = place.command_line(
            Path::new("/here/memnode"),
            "memnode",
            &["--listen".into(), "10.0.0.1:7010".into(), "a b".into()],
        );
        let at = line.iter().position(|a| a == "--").unwrap();
        assert_eq!(line[at - 1], "me@a");
        assert_eq!(
            line[at + 1..].join(" "),
            "echo REMOTE-PID $$; exec /opt/rrpc/bin/memnode --listen 10.0.0.1:7010 'a b'"
        );
        assert_eq!(remote_pid_of("REMOTE-PID 4242\n"), Some(4242));
        assert_eq!(remote_pid_of("READY 127.0.0.1:1"), None);
        let st = std::process::Command::new("sh")
            .args(["-c", "exit 127"])
            .status()
            .unwrap();
        assert!(missing_hint(&place, &st, &line).contains("is /opt/rrpc/bin/memnode there?"));
        // Here: no ssh, the binary itself.
        let local = Place::Local.command_line(Path::new("/here/memnode"), "memnode", &[]);
        assert_eq!(local, vec!["/here/memnode".to_string()]);
    }

    #[test]
    fn progress_lines_keep_a_slow_start_alive_and_silence_ends_it() {
        use std::os::unix::fs::PermissionsExt as _;
        let bins = tempfile::tempdir().unwrap();
        let script = |name: &str, body: &str| {
            let p = bins.path().join(name);
            std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        };
        // 2.4 s to READY, but never 1 s without a PROGRESS line: started.
        script(
            "loader",
            "for i in 1 2 3 4 5 6; do sleep 0.4; echo PROGRESS loading partition $i; done\n\
             echo READY 127.0.0.1:9; exec sleep 30",
        );
        // One PROGRESS line, then silence: not ready, and the error says for how long.
        script("hung", "echo PROGRESS loading partition 0; exec sleep 30");
        let name = format!("launcher-progress-{}", std::process::id());
        let mut c = LocalCluster::new(&name, bins.path().to_path_buf()).unwrap();
        let t0 = Instant::now();
        let addr = c.start("loader", 1, &[], Duration::from_secs(1)).unwrap();
        assert_eq!(addr, "127.0.0.1:9".parse().unwrap());
        assert!(t0.elapsed() >= Duration::from_secs(2), "{:?}", t0.elapsed());
        let e = c.start("hung", 2, &[], Duration::from_secs(1)).unwrap_err();
        assert!(format!("{e:#}").contains("nothing from it for 1s"), "{e:#}");
    }

    /// Services spawned before any is waited for run side by side: here one is ready
    /// only once the other has started (a file it creates), which a start one after
    /// another would never see. A spawned service dropped unwaited is killed.
    #[test]
    fn spawned_services_start_side_by_side_and_an_unwaited_one_is_killed() {
        use std::os::unix::fs::PermissionsExt as _;
        let bins = tempfile::tempdir().unwrap();
        let flag = bins.path().join("second-started");
        let pid_file = bins.path().join("third.pid");
        let script = |name: &str, body: &str| {
            let p = bins.path().join(name);
            std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        };
        script(
            "first",
            &format!(
                "while [ ! -e {} ]; do sleep 0.1; done\n\
                 echo READY 127.0.0.1:1; exec sleep 30",
                flag.display()
            ),
        );
        script(
            "second",
            &format!(
                "touch {}; echo READY 127.0.0.1:2; exec sleep 30",
                flag.display()
            ),
        );
        script(
            "third",
            &format!("echo $$ > {}; exec sleep 30", pid_file.display()),
        );
        let name = format!("launcher-side-by-side-{}", std::process::id());
        let mut c = LocalCluster::new(&name, bins.path().to_path_buf()).unwrap();
        let t = Duration::from_secs(20);
        let a = c.spawn_at(&Place::Local, "first", 1, &[], t, None).unwrap();
        let b = c
            .spawn_at(&Place::Local, "second", 2, &[], t, None)
            .unwrap();
        assert_eq!(c.wait_ready(a).unwrap(), "127.0.0.1:1".parse().unwrap());
        assert_eq!(c.wait_ready(b).unwrap(), "127.0.0.1:2".parse().unwrap());
        let third = c.spawn_at(&Place::Local, "third", 3, &[], t, None).unwrap();
        let pid = loop {
            match std::fs::read_to_string(&pid_file) {
                Ok(p) if p.ends_with('\n') => break p.trim().parse::<i32>().unwrap(),
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        drop(third);
        // Killed and reaped: no such process any more.
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
    }

    #[test]
    fn a_place_signals_reads_and_removes_here() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        Place::Local.signal(pid, "STOP").unwrap();
        Place::Local.signal(pid, "CONT").unwrap();
        assert!(Place::Local.signal(pid, "HUP?").is_err());
        Place::Local.signal(pid, "KILL").unwrap();
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("ledger");
        std::fs::write(&f, b"bytes").unwrap();
        assert_eq!(Place::Local.read(&f).unwrap(), b"bytes");
        Place::Local.remove(&f).unwrap();
        Place::Local.remove(&f).unwrap();
        assert!(Place::Local.read(&f).is_err());
        assert_eq!(Place::Local.run(&["echo", "x"]).unwrap(), b"x\n");
        let e = Place::Local
            .run(&["sh", "-c", "echo no >&2; exit 3"])
            .unwrap_err();
        assert!(format!("{e:#}").contains("no"), "{e:#}");
    }
}
