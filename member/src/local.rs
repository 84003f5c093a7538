//! A single-node etcd on loopback for tests and local clusters.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::MemberError;

/// How long [`LocalEtcd::start`] waits for the server to answer.
const READY_WAIT: Duration = Duration::from_secs(10);
/// Attempts at starting it (another process may take a port between our probe and etcd's bind).
const START_ATTEMPTS: u32 = 3;

/// A single-member etcd server started from Debian's `etcd` binary (package `etcd-server`) on
/// loopback, with free client and peer ports and its data directory under the given directory.
/// It runs with `--heartbeat-interval 10 --election-timeout 100` (milliseconds): etcd refuses
/// leases shorter than 1.5 election timeouts, so its defaults (100/1000) would make the
/// shortest lease 2 s, while these make 1 s leases work (see the crate docs).
///
/// Dropping it kills the server (SIGKILL), waits for it and removes its data directory
/// (etcd preallocates a 64 MiB write-ahead log, so a test suite that left them behind would
/// fill the disk); the log stays in `dir`.
#[derive(Debug)]
pub struct LocalEtcd {
    child: Child,
    /// The address it listens on (loopback unless [`LocalEtcd::start_on`] said otherwise).
    ip: IpAddr,
    client_port: u16,
    peer_port: u16,
    binary: PathBuf,
    log: PathBuf,
    data: PathBuf,
}

impl LocalEtcd {
    /// Starts etcd with its data directory and log (`etcd.log`) under `dir` and waits (10 s at
    /// most) until it answers its health check.
    ///
    /// # Errors
    /// [`MemberError::EtcdMissing`] if there is no `etcd` on `PATH` nor in `/usr/bin`;
    /// [`MemberError::EtcdExited`] or [`MemberError::EtcdNotReady`] (with the tail of its log)
    /// if it did not come up.
    pub fn start(dir: &Path) -> Result<LocalEtcd, MemberError> {
        Self::start_on(dir, IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    /// [`LocalEtcd::start`], listening on `ip` (an address of this host that other hosts
    /// reach, for a cluster whose processes run on several) instead of loopback.
    ///
    /// # Errors
    /// As [`LocalEtcd::start`]; also when no port can be bound on `ip`.
    pub fn start_on(dir: &Path, ip: IpAddr) -> Result<LocalEtcd, MemberError> {
        let binary = find_etcd().ok_or(MemberError::EtcdMissing)?;
        let mut last = None;
        for attempt in 0..START_ATTEMPTS {
            match Self::start_once(&binary, dir, attempt, ip) {
                Ok(etcd) => return Ok(etcd),
                // A port taken between the probe and etcd's bind: try fresh ports.
                Err(MemberError::EtcdExited { status, log_tail })
                    if log_tail.contains("address already in use") =>
                {
                    last = Some(MemberError::EtcdExited { status, log_tail });
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.expect("at least one attempt"))
    }

    fn start_once(
        binary: &Path,
        dir: &Path,
        attempt: u32,
        ip: IpAddr,
    ) -> Result<LocalEtcd, MemberError> {
        let data = dir.join(format!("etcd-data-{attempt}"));
        std::fs::create_dir_all(dir).map_err(|source| MemberError::LocalSetup {
            what: "create the directory",
            source,
        })?;
        let log = dir.join("etcd.log");
        let (log_file, log_err) = open_log(&log, false)?;
        let client_port = free_port(ip)?;
        let peer_port = free_port(ip)?;
        let child = spawn(binary, &data, ip, client_port, peer_port, log_file, log_err)?;
        let mut etcd = LocalEtcd {
            child,
            ip,
            client_port,
            peer_port,
            binary: binary.to_path_buf(),
            log,
            data,
        };
        etcd.await_ready()?;
        Ok(etcd)
    }

    /// Fault injection: SIGKILL the server, keep it down for `down`, and start it again
    /// from its data directory on the same ports (what it had made durable survives:
    /// keys, leases, revisions), waiting until it answers as [`LocalEtcd::start`] does.
    ///
    /// # Errors
    /// As [`LocalEtcd::start`]: the log could not be opened, the binary not run, or the
    /// server did not come back (a port taken meanwhile).
    pub fn restart(&mut self, down: Duration) -> Result<(), MemberError> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::thread::sleep(down);
        let (log_file, log_err) = open_log(&self.log, true)?;
        let child = spawn(
            &self.binary,
            &self.data,
            self.ip,
            self.client_port,
            self.peer_port,
            log_file,
            log_err,
        )?;
        let old = std::mem::replace(&mut self.child, child);
        drop(old);
        self.await_ready()
    }

    /// Wait (10 s at most) until the server answers its health check.
    fn await_ready(&mut self) -> Result<(), MemberError> {
        let t0 = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                let log_tail = self.log_tail();
                // The child is reaped; dropping only tries to kill a dead pid.
                return Err(MemberError::EtcdExited { status, log_tail });
            }
            if healthy(self.ip, self.client_port) {
                tracing::debug!(endpoint = %self.endpoint(), "local etcd is up");
                return Ok(());
            }
            if t0.elapsed() > READY_WAIT {
                return Err(MemberError::EtcdNotReady {
                    waited: READY_WAIT,
                    log_tail: self.log_tail(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The log at `path` (truncated, or appended to with `append`), twice: for stdout and
/// stderr.
fn open_log(path: &Path, append: bool) -> Result<(File, File), MemberError> {
    let f = File::options()
        .write(true)
        .create(true)
        .append(append)
        .truncate(!append)
        .open(path)
        .map_err(|source| MemberError::LocalSetup {
            what: "open etcd.log",
            source,
        })?;
    let g = f.try_clone().map_err(|source| MemberError::LocalSetup {
        what: "open etcd.log",
        source,
    })?;
    Ok((f, g))
}

/// Start etcd with `data` as its data directory on ports `client_port` and `peer_port`
/// of `ip`, logging to `out` and `err`.
fn spawn(
    binary: &Path,
    data: &Path,
    ip: IpAddr,
    client_port: u16,
    peer_port: u16,
    out: File,
    err: File,
) -> Result<Child, MemberError> {
    {
        let client = format!("http://{}", SocketAddr::new(ip, client_port));
        let peer = format!("http://{}", SocketAddr::new(ip, peer_port));
        let mut cmd = Command::new(binary);
        // etcd reads ETCD_* variables as flags and refuses a flag given twice.
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("ETCD_") {
                cmd.env_remove(k);
            }
        }
        cmd.arg("--name")
            .arg("local")
            .arg("--data-dir")
            .arg(data)
            .arg("--listen-client-urls")
            .arg(&client)
            .arg("--advertise-client-urls")
            .arg(&client)
            .arg("--listen-peer-urls")
            .arg(&peer)
            .arg("--initial-advertise-peer-urls")
            .arg(&peer)
            .arg("--initial-cluster")
            .arg(format!("local={peer}"))
            .arg("--heartbeat-interval")
            .arg("10")
            .arg("--election-timeout")
            .arg("100")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        cmd.spawn().map_err(|source| MemberError::EtcdSpawn {
            binary: binary.display().to_string(),
            source,
        })
    }
}

impl LocalEtcd {
    /// The client endpoint, `http://IP:PORT` (`127.0.0.1` unless started with
    /// [`LocalEtcd::start_on`]), for [`crate::Member::join`].
    pub fn endpoint(&self) -> String {
        format!("http://{}", SocketAddr::new(self.ip, self.client_port))
    }

    /// The server's process id (a test's watchdog kills it when the test hangs).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The server's log file, `etcd.log` in the directory given to [`LocalEtcd::start`].
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The last 20 lines of the server's log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for LocalEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.data);
    }
}

fn find_etcd() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin")])
        .map(|d| d.join("etcd"))
        .find(|p| p.is_file())
}

fn free_port(ip: IpAddr) -> Result<u16, MemberError> {
    let l = TcpListener::bind((ip, 0)).map_err(|source| MemberError::LocalSetup {
        what: "bind a free port",
        source,
    })?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|source| MemberError::LocalSetup {
            what: "read the free port",
            source,
        })
}

/// etcd's `/health` on the client port answers `{"health":"true"}` once it has a leader.
fn healthy(ip: IpAddr, port: u16) -> bool {
    let addr = SocketAddr::new(ip, port);
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let _ = s.set_write_timeout(Some(Duration::from_millis(500)));
    if s.write_all(b"GET /health HTTP/1.0\r\nHost: etcd\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut resp = String::new();
    let _ = s.read_to_string(&mut resp);
    resp.contains("\"health\":\"true\"")
}
