//! Shared by the etcd suites: a real local etcd per test, a watchdog, event waits.

#![allow(dead_code)] // Each suite uses a part.

use std::io::Write;
use std::time::{Duration, Instant};

use member::{Event, LocalEtcd, MemberError, Receiver};

/// A test's etcd, its directory and its watchdog.
pub struct Env {
    pub etcd: LocalEtcd,
    _dog: Watchdog,
    _dir: tempfile::TempDir,
}

impl Env {
    pub fn endpoints(&self) -> Vec<String> {
        vec![self.etcd.endpoint()]
    }
}

/// Starts a local etcd for `test`, or returns None (printing why) when the etcd binary is
/// missing and RRPC_REQUIRE_ETCD is unset. With RRPC_REQUIRE_ETCD set, a missing etcd fails.
pub fn etcd_or_skip(test: &str) -> Option<Env> {
    let dir = tempfile::tempdir().expect("tempdir");
    match LocalEtcd::start(dir.path()) {
        Ok(etcd) => {
            let _dog = Watchdog::new(test, Duration::from_secs(90), etcd.pid());
            Some(Env {
                etcd,
                _dog,
                _dir: dir,
            })
        }
        Err(e @ MemberError::EtcdMissing) if std::env::var_os("RRPC_REQUIRE_ETCD").is_none() => {
            // Straight to stderr: libtest captures eprintln! of passing tests.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED {test}: {e} (set RRPC_REQUIRE_ETCD=1 to make this a failure)"
            );
            None
        }
        Err(e) => panic!("{test}: local etcd: {e}"),
    }
}

/// Aborts the test process (after killing the etcd it started) if the test runs past
/// `limit`: a hung test fails instead of hanging CI.
pub struct Watchdog {
    stop: Option<crossbeam_channel::Sender<()>>,
}

impl Watchdog {
    pub fn new(test: &str, limit: Duration, etcd_pid: u32) -> Self {
        let (tx, rx) = crossbeam_channel::bounded::<()>(1);
        let test = test.to_string();
        std::thread::spawn(move || {
            if let Err(crossbeam_channel::RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
                eprintln!("WATCHDOG: {test} still running after {limit:?}; aborting");
                let _ = std::process::Command::new("kill")
                    .args(["-9", &etcd_pid.to_string()])
                    .status();
                std::process::abort();
            }
        });
        Self { stop: Some(tx) }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// The first event matching `pred` within `limit`, skipping others.
pub fn wait_for(
    rx: &Receiver<Event>,
    limit: Duration,
    pred: impl Fn(&Event) -> bool,
) -> Option<Event> {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(ev) if pred(&ev) => return Some(ev),
            Ok(_) => {}
            Err(_) => return None,
        }
    }
}

pub fn is_up(ev: &Event, node: u16, incarnation: u64) -> bool {
    matches!(ev, Event::Up(m) if m.node == node && m.incarnation == incarnation)
}

pub fn is_down(ev: &Event, node: u16, incarnation: u64) -> bool {
    matches!(ev, Event::Down(m) if m.node == node && m.incarnation == incarnation)
}
