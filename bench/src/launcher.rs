//! A local cluster of service processes (memnode, lockd, tso) started as children over
//! the shm fabric. Children are stopped (SIGTERM, then SIGKILL after a grace period) when
//! the [`LocalCluster`] is dropped, which also happens on panic; each child also gets
//! `PR_SET_PDEATHSIG` so it dies with this process even after a `kill -9`.

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
    child: Child,
}

/// Child processes of one local cluster, and the cluster's shm directory.
pub struct LocalCluster {
    /// Started services, in start order.
    pub services: Vec<Service>,
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
            bin_dir,
            dir,
        })
    }

    /// Start binary `name` as node `node` with extra `args`, and wait (up to `timeout`)
    /// for its `READY <addr>` line. Its stderr passes through.
    pub fn start(
        &mut self,
        name: &str,
        node: u32,
        args: &[String],
        timeout: Duration,
    ) -> anyhow::Result<SocketAddr> {
        let bin = self.bin_dir.join(name);
        if !bin.exists() {
            bail!(
                "{} not found; build the workspace binaries first: cargo build --release --workspace \
                 (or pass --bin-dir)",
                bin.display()
            );
        }
        let mut cmd = Command::new(&bin);
        cmd.args(["--cluster", self.dir.name(), "--node", &node.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            // Own process group: a terminal's Ctrl-C reaches only the launcher, which
            // then stops the run, audits, and shuts the children down in order.
            .process_group(0);
        // SAFETY: prctl is async-signal-safe; the closure touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(a) = line.strip_prefix("READY ") {
                    let _ = tx.send(a.trim().to_string());
                }
            }
        });
        let deadline = Instant::now() + timeout;
        let addr = loop {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(a) => {
                    break a
                        .parse::<SocketAddr>()
                        .map_err(|e| anyhow!("{name} printed a bad address {a:?}: {e}"))?
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Some(st) = child.try_wait()? {
                        bail!("{name} (node {node}) exited before it was ready: {st}");
                    }
                    if Instant::now() > deadline {
                        let _ = child.kill();
                        bail!("{name} (node {node}) not ready after {timeout:?}");
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let st = child.wait()?;
                    bail!("{name} (node {node}) exited before it was ready: {st}");
                }
            }
        };
        self.services.push(Service {
            name: name.into(),
            node,
            addr,
            child,
        });
        Ok(addr)
    }

    /// Fault injection: SIGKILL node `node`'s process and reap it (it leaves
    /// [`LocalCluster::services`]). Returns its role name and bootstrap address, to
    /// restart it with [`LocalCluster::start`] (`--listen <addr>` keeps the address).
    ///
    /// Errors: no such node; the signal could not be sent.
    pub fn kill(&mut self, node: u32) -> anyhow::Result<(String, SocketAddr)> {
        let i = self
            .services
            .iter()
            .position(|s| s.node == node)
            .ok_or_else(|| anyhow!("no service runs as node {node}"))?;
        let mut s = self.services.remove(i);
        s.child
            .kill()
            .with_context(|| format!("SIGKILL to {} (node {node})", s.name))?;
        s.child
            .wait()
            .with_context(|| format!("reaping {} (node {node})", s.name))?;
        Ok((s.name, s.addr))
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

    /// Stop all children: SIGTERM, then SIGKILL after 3 s. (The shm directory goes when
    /// the cluster is dropped.)
    pub fn shutdown(&mut self) {
        for s in &self.services {
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

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.shutdown();
    }
}
