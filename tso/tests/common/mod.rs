//! What the tso crate's multi-process tests share: child processes that die with the
//! test, bounded waits for them, and reading their tagged output lines.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Lines};
use std::net::SocketAddr;
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A child process killed (and reaped) when the test drops it, also on a failed assert.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Wait for `child` to exit, failing (not hanging) after `secs`.
pub fn wait(child: &mut KillOnDrop, secs: u64) -> ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(st) = child.0.try_wait().unwrap() {
            return st;
        }
        assert!(Instant::now() < deadline, "a child process did not finish");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Read a child's stdout until a line containing `tag`; returns the rest of that line.
/// Lines before it are consumed and dropped, tagged or not: a child must print its tags
/// in the order the test reads them (a tag printed once, from another thread, can race
/// ahead of the one read before it and be lost, leaving the test waiting for it).
pub fn read_until(lines: &mut Lines<BufReader<ChildStdout>>, tag: &str) -> String {
    for l in lines.map_while(Result::ok) {
        // libtest may print "test client_process ... " on the same line.
        if let Some((_, rest)) = l.split_once(tag) {
            return rest.to_string();
        }
    }
    panic!("a client exited before printing {tag}");
}

/// This test executable re-run as a client process: only its `client_process` test, with
/// stdout piped (the client prints its tagged lines there) and stderr discarded. The
/// caller adds the environment that tells `client_process` what to do, and spawns it.
pub fn client_command() -> std::process::Command {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "client_process",
        "--nocapture",
        "--test-threads=1",
    ])
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::null());
    cmd
}

/// Start a service process (`tso`, `tso-proxy`) from `cmd` with stdout piped (stderr as
/// `cmd` set it) and read its stdout up to its `READY <addr>` line. Returns the child,
/// the lines it printed before (see [`tagged`]) and the address. Panics if it exits
/// first.
pub fn spawn_service(cmd: &mut Command) -> (KillOnDrop, Vec<String>, SocketAddr) {
    let mut child = KillOnDrop(cmd.stdout(Stdio::piped()).spawn().unwrap());
    let out = BufReader::new(child.0.stdout.take().unwrap());
    let mut before = Vec::new();
    for line in out.lines().map_while(Result::ok) {
        if let Some(a) = line.strip_prefix("READY ") {
            return (child, before, a.trim().parse().unwrap());
        }
        before.push(line);
    }
    panic!("{cmd:?} exited before READY");
}

/// The rest of the last of `lines` that starts with `tag` (`EPOCH `, `PLACEMENT `).
pub fn tagged<'a>(lines: &'a [String], tag: &str) -> Option<&'a str> {
    lines
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix(tag))
        .map(str::trim)
}

/// Send `sig` to the child.
pub fn signal(c: &mut KillOnDrop, sig: libc::c_int) {
    let pid = c.0.id() as libc::pid_t;
    // SAFETY: kill(2) has no memory-safety preconditions; `pid` is our own unreaped child.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
}

/// Spawn a client process from `cmd` (see [`client_command`]) and take its stdout as
/// lines, for [`read_until`].
pub fn spawn_client(cmd: &mut Command) -> (KillOnDrop, Lines<BufReader<ChildStdout>>) {
    let mut child = KillOnDrop(cmd.spawn().unwrap());
    let lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    (child, lines)
}

/// Client process `me`'s fabric: node 200 + `me` of `cluster`, on the backend
/// $RRPC_FABRIC names (shm when unset), as the service binaries choose theirs.
pub fn client_fabric(cluster: &str, me: u32) -> rrpc::fabric::Fabric {
    let kind = rrpc::fabric::FabricKind::from_env().unwrap();
    let cfg = rrpc::fabric::FabricConfig::new(kind, cluster, rrpc::NodeId(200 + me));
    rrpc::fabric::Fabric::open(&cfg).unwrap()
}
