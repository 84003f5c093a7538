//! What the tso crate's multi-process tests share: child processes that die with the
//! test, bounded waits for them, and reading their tagged output lines.
#![allow(dead_code)]

use std::io::{BufReader, Lines};
use std::process::{Child, ChildStdout, ExitStatus};
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
