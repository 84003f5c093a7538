//! Restarts never go back: the real `tso` binary with a state directory, timestamps taken
//! under load, SIGKILL, restart with the same state directory and node id, and every
//! timestamp after the restart is larger than every one before (tso::epoch).

mod common;
use common::{signal, spawn_service, tagged, KillOnDrop};
use rrpc::NodeId;
use std::cell::RefCell;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rrpc::fabric::shm::ClusterGuard;
use rrpc::fabric::Fabric;
use rrpc::runtime::{Executor, RuntimeConfig, ThreadCtx};
use tso::{Timestamp, TsoClient};

const NODE: &str = "3";

/// Start `tso` and wait for `EPOCH` and `READY`.
fn start(cluster: &str, state: &Path) -> (KillOnDrop, u16, SocketAddr) {
    let (child, before, addr) = spawn_service(
        Command::new(env!("CARGO_BIN_EXE_tso"))
            .args(["--cluster", cluster, "--node", NODE, "--state-dir"])
            .arg(state)
            .stderr(Stdio::null()),
    );
    let epoch = tagged(&before, "EPOCH ").expect("EPOCH before READY");
    (child, epoch.parse().unwrap(), addr)
}

/// `coros` coroutines take timestamps from the oracle at `addr` until one fails, `stop`
/// is reached by the shared `taken` count, or a deadline passes. Returns what they got.
fn load(
    fabric: Fabric,
    addr: SocketAddr,
    coros: usize,
    stop: u64,
    taken: Arc<AtomicU64>,
) -> Vec<Timestamp> {
    let ctx = ThreadCtx::new(fabric, RuntimeConfig::default()).unwrap();
    let tc = Rc::new(TsoClient::from_info(&ctx.connect(addr).unwrap()).unwrap());
    let got = Rc::new(RefCell::new(Vec::new()));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut ex = Executor::new(ctx.clone());
    for _ in 0..coros {
        let (ctx, tc, got, taken) = (ctx.clone(), tc.clone(), got.clone(), taken.clone());
        ex.spawn(async move {
            while taken.load(Ordering::Relaxed) < stop && Instant::now() < deadline {
                match tc.timestamp(&ctx).await {
                    Ok(t) => {
                        got.borrow_mut().push(t);
                        taken.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => break,
                }
            }
        });
    }
    ex.run();
    let v = got.borrow().clone();
    v
}

#[test]
fn sigkilled_oracle_restarts_above_every_timestamp_it_handed_out() {
    let name = format!("tso-test-{}-restart", std::process::id());
    let (cluster, _) = ClusterGuard::new(&name).unwrap();
    let state = std::env::temp_dir().join(format!("tso-restart-state-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&state);

    let (mut first, e1, addr) = start(cluster.name(), &state);
    assert_eq!(e1, 1, "a fresh state directory starts in epoch 1");
    // Load from a client thread; SIGKILL the oracle while it runs (no stop count).
    let taken = Arc::new(AtomicU64::new(0));
    let client = {
        let (f, t) = (cluster.open(NodeId(100)).unwrap(), taken.clone());
        std::thread::spawn(move || load(f, addr, 4, u64::MAX, t))
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while taken.load(Ordering::Relaxed) < 5_000 {
        assert!(
            Instant::now() < deadline,
            "the client took too few timestamps"
        );
        assert!(!client.is_finished(), "the client stopped before the kill");
        std::thread::sleep(Duration::from_millis(1));
    }
    signal(&mut first, libc::SIGKILL);
    let _ = first.0.wait();
    let before = client.join().unwrap();
    assert!(before.len() >= 5_000);
    drop(first);

    let (_second, e2, addr) = start(cluster.name(), &state);
    assert_eq!(e2, 2);
    let after = load(
        cluster.open(NodeId(101)).unwrap(),
        addr,
        4,
        2_000,
        Arc::new(AtomicU64::new(0)),
    );
    assert!(after.len() >= 2_000);
    let max_before = *before.iter().max().unwrap();
    let min_after = *after.iter().min().unwrap();
    assert!(
        min_after > max_before,
        "after restart {min_after} <= before {max_before}"
    );
    assert!(before.iter().all(|t| t.epoch() == 1));
    assert!(after.iter().all(|t| t.epoch() == 2));
    let _ = std::fs::remove_dir_all(&state);
}

/// Two oracles on one state directory would open the same epoch: the second `tso` fails
/// at start, naming the directory and the first one's pid, and the epoch file is left
/// as the first wrote it.
#[test]
fn a_second_oracle_on_the_same_state_directory_fails_at_start() {
    let name = format!("tso-test-{}-twostate", std::process::id());
    let (cluster, _) = ClusterGuard::new(&name).unwrap();
    let state = std::env::temp_dir().join(format!("tso-two-state-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&state);
    let (first, e1, _addr) = start(cluster.name(), &state);
    assert_eq!(e1, 1);
    let out = std::env::temp_dir().join(format!("tso-two-state-{}.err", std::process::id()));
    let mut second = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_tso"))
            .args(["--cluster", cluster.name(), "--node", "4", "--state-dir"])
            .arg(&state)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&out).unwrap())
            .spawn()
            .unwrap(),
    );
    let st = common::wait(&mut second, 30);
    assert!(!st.success(), "the second oracle started");
    let err = std::fs::read_to_string(&out).unwrap();
    assert!(err.contains(&state.display().to_string()), "{err}");
    assert!(err.contains(&format!("pid {}", first.0.id())), "{err}");
    assert_eq!(
        std::fs::read_to_string(state.join("epoch")).unwrap(),
        "1\n",
        "the second oracle opened no epoch"
    );
    drop(first);
    let _ = std::fs::remove_file(&out);
    let _ = std::fs::remove_dir_all(&state);
}
