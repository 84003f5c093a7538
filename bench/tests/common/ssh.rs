//! The launcher's ssh path on one host: an ssh stand-in and free loopback ports for
//! topology files whose "remote" host is this one.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// A free loopback port (free when asked; a service binds it a moment later).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An ssh stand-in (for `$RRPC_SSH`) written into `dir`: it skips ssh's options and the
/// destination, and hands the command to a shell as sshd would.
pub fn ssh_shim(dir: &Path) -> PathBuf {
    let p = dir.join("ssh-shim");
    std::fs::write(
        &p,
        "#!/bin/sh\nwhile [ \"$1\" = \"-o\" ]; do shift 2; done\nshift\n[ \"$1\" = \"--\" ] && shift\nexec sh -c \"$*\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// A real OpenSSH server on a free loopback port, for this test only: its own host key,
/// a client key of its own in its `authorized_keys`, public keys only; and an ssh
/// client wrapper (for `$RRPC_SSH`) that reaches it with that key and port (the real
/// `ssh` with a config file). The server stops when this is dropped.
pub struct Sshd {
    dir: tempfile::TempDir,
    child: std::process::Child,
    /// `user@127.0.0.1`: this process's user on the server.
    pub target: String,
}

impl Sshd {
    /// Start it, or say why it cannot run here (`Err`): no `sshd` or `ssh-keygen`, or
    /// no privilege separation directory and no right to make it. With
    /// `RRPC_REQUIRE_SSH=1` (the project's test command, which installs OpenSSH) the
    /// caller should fail on that instead of skipping.
    pub fn start() -> Result<Self, String> {
        use std::process::{Command, Stdio};
        let sshd = Path::new("/usr/sbin/sshd");
        if !sshd.exists() {
            return Err("no /usr/sbin/sshd (Debian's openssh-server)".into());
        }
        let run = Path::new("/run/sshd");
        if !run.exists() && std::fs::create_dir_all(run).is_err() {
            return Err("no /run/sshd and it cannot be made (not root)".into());
        }
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let d = dir.path();
        for key in ["host_key", "id"] {
            let st = Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                .arg(d.join(key))
                .status()
                .map_err(|e| format!("ssh-keygen: {e}"))?;
            if !st.success() {
                return Err(format!("ssh-keygen failed: {st}"));
            }
        }
        std::fs::copy(d.join("id.pub"), d.join("authorized_keys")).map_err(|e| e.to_string())?;
        let port = free_port();
        std::fs::write(
            d.join("sshd_config"),
            format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\n\
                 AuthorizedKeysFile {d}/authorized_keys\nPidFile {d}/sshd.pid\nStrictModes no\n\
                 UsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
                 PermitRootLogin prohibit-password\nLogLevel ERROR\n",
                d = d.display()
            ),
        )
        .map_err(|e| e.to_string())?;
        std::fs::write(
            d.join("ssh_config"),
            format!(
                "Host 127.0.0.1\n  Port {port}\n  IdentityFile {d}/id\n  IdentitiesOnly yes\n  \
                 StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n",
                d = d.display()
            ),
        )
        .map_err(|e| e.to_string())?;
        let wrapper = d.join("ssh");
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\nexec ssh -F '{}' \"$@\"\n",
                d.join("ssh_config").display()
            ),
        )
        .map_err(|e| e.to_string())?;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| e.to_string())?;
        let child = Command::new(sshd)
            .args(["-D", "-e", "-f"])
            .arg(d.join("sshd_config"))
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting sshd: {e}"))?;
        let user = Command::new("id")
            .arg("-un")
            .output()
            .map_err(|e| format!("id -un: {e}"))?;
        let user = String::from_utf8_lossy(&user.stdout).trim().to_string();
        let me = Self {
            dir,
            child,
            target: format!("{user}@127.0.0.1"),
        };
        // Up once a login runs a command.
        let t0 = std::time::Instant::now();
        loop {
            let ok = Command::new(me.ssh())
                .args(["-o", "BatchMode=yes", &me.target, "--", "true"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return Ok(me);
            }
            if t0.elapsed() > std::time::Duration::from_secs(10) {
                return Err("sshd on loopback took no login within 10 s".into());
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// The ssh client wrapper, for `$RRPC_SSH`.
    pub fn ssh(&self) -> PathBuf {
        self.dir.path().join("ssh")
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        // The launcher's shared connection (its ControlMaster) goes first, then the
        // server.
        let _ = std::process::Command::new(self.ssh())
            .args([
                "-o",
                "ControlPath=/tmp/rrpc-ssh-%C",
                "-O",
                "exit",
                &self.target,
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
