//! A TSO proxy across a restart of its oracle, as real processes (Scythe 4.5 (3): "the
//! TSO proxy maintains the currently maximum timestamps assigned, enabling quick recovery
//! of the timestamp service in case of a single point failure in TSO service"): the `tso`
//! binary with `--state-dir`, one `tso-proxy` binary, and client processes (this test
//! binary re-run as clients; all on the backend `$RRPC_FABRIC` names, shm by default)
//! that take every timestamp through the proxy with the range RPC, retrying failed
//! requests, and record `CLOCK_MONOTONIC` invoke and response times of those that
//! succeeded.
//!
//! - The oracle is killed with SIGKILL mid-load and restarted from the same state
//!   directory at the same address: the same proxy follows it to its new epoch, the
//!   clients keep getting timestamps, every one after the restart is larger than every
//!   one before, and the whole history passes the linearizability checker.
//! - The oracle is restarted *without* its state directory (epoch 0, counting from 1
//!   again): the proxy refuses it and logs so; its clients get errors and never a
//!   timestamp that is not above every one issued before.

mod common;
use common::{
    client_command, client_fabric, read_until, signal, spawn_client, spawn_service, tagged, wait,
    KillOnDrop,
};
use std::cell::RefCell;
use std::io::{BufReader, Lines};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ChildStdout, Command, Stdio};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rrpc::fabric::shm::ClusterGuard;
use rrpc::runtime::{Executor, RuntimeConfig, ThreadCtx};
use tso::history::{check, now_ns, Op};
use tso::proxy::ProxyClient;

const CLIENTS: u32 = 2;
const THREADS: u32 = 2;
const COROS: u32 = 3;
/// A client process gives up (and fails) after this long: no test waits forever on it.
const CLIENT_DEADLINE: Duration = Duration::from_secs(90);

/// The oracle as node 3 at `listen`, with `state` as its state directory if given.
fn start_oracle(
    cluster: &str,
    listen: &str,
    state: Option<&Path>,
) -> (KillOnDrop, u16, SocketAddr) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tso"));
    cmd.args(["--cluster", cluster, "--node", "3", "--listen", listen])
        .stderr(Stdio::null());
    if let Some(s) = state {
        cmd.arg("--state-dir").arg(s);
    }
    let (child, before, addr) = spawn_service(&mut cmd);
    let epoch = tagged(&before, "EPOCH ").expect("tso prints EPOCH before READY");
    (child, epoch.parse().unwrap(), addr)
}

struct Run {
    cluster: ClusterGuard,
    state: PathBuf,
    stop: PathBuf,
    proxy_log: PathBuf,
    oracle: KillOnDrop,
    oracle_addr: SocketAddr,
    proxy: KillOnDrop,
    clients: Vec<(KillOnDrop, Lines<BufReader<ChildStdout>>)>,
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.state);
        let _ = std::fs::remove_file(&self.stop);
        let _ = std::fs::remove_file(&self.proxy_log);
    }
}

/// An oracle with a fresh state directory (epoch 1), a proxy of two server threads
/// (stderr logged to a file) and the client processes, all under load.
fn start(tag: &str) -> Run {
    let name = format!("tso-test-{}-{tag}", std::process::id());
    let (cluster, _) = ClusterGuard::new(&name).unwrap();
    let tmp = std::env::temp_dir();
    let state = tmp.join(format!("{name}-state"));
    let stop = tmp.join(format!("{name}-stop"));
    let proxy_log = tmp.join(format!("{name}-proxy.log"));
    let _ = std::fs::remove_dir_all(&state);
    let _ = std::fs::remove_file(&stop);
    let c = cluster.name().to_string();
    let (oracle, epoch, oracle_addr) = start_oracle(&c, "127.0.0.1:0", Some(&state));
    assert_eq!(epoch, 1, "a fresh state directory starts in epoch 1");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tso-proxy"));
    cmd.args(["--cluster", &c, "--node", "10", "--threads", "2"])
        .arg("--oracle")
        .arg(oracle_addr.to_string())
        .env("RUST_LOG", "info")
        .stderr(std::fs::File::create(&proxy_log).unwrap());
    let (proxy, _, proxy_addr) = spawn_service(&mut cmd);
    let clients = (0..CLIENTS)
        .map(|i| {
            spawn_client(
                client_command()
                    .env("TSO_PR_CLUSTER", &c)
                    .env("TSO_PR_PROXY", proxy_addr.to_string())
                    .env("TSO_PR_CLIENT", i.to_string())
                    .env("TSO_PR_STOP", &stop),
            )
        })
        .collect();
    let mut run = Run {
        cluster,
        state,
        stop,
        proxy_log,
        oracle,
        oracle_addr,
        proxy,
        clients,
    };
    for (_, lines) in run.clients.iter_mut() {
        read_until(lines, "STARTED");
    }
    // Every client has timestamps of epoch 1 through the proxy.
    for (_, lines) in run.clients.iter_mut() {
        assert_eq!(read_until(lines, "EPOCH_SEEN ").trim(), "1");
    }
    run
}

impl Run {
    /// SIGKILL the oracle mid-load; returns when it is gone ([`now_ns`] then).
    fn kill_oracle(&mut self) -> u64 {
        std::thread::sleep(Duration::from_millis(200));
        signal(&mut self.oracle, libc::SIGKILL);
        let _ = self.oracle.0.wait();
        now_ns()
    }

    /// Restart the oracle at its address, with its state directory or without.
    fn restart_oracle(&mut self, with_state: bool) -> u16 {
        // Let the proxy and the clients see the oracle dead for a while.
        std::thread::sleep(Duration::from_millis(300));
        let (child, epoch, addr) = start_oracle(
            self.cluster.name(),
            &self.oracle_addr.to_string(),
            with_state.then_some(self.state.as_path()),
        );
        assert_eq!(addr, self.oracle_addr);
        self.oracle = child;
        epoch
    }

    /// Stop the clients; every client's successful ops and error count, and the last
    /// error text of each client that had one.
    fn collect(&mut self) -> (Vec<Op>, u64, Vec<String>) {
        std::fs::write(&self.stop, b"stop").unwrap();
        let (mut ops, mut errors, mut texts) = (Vec::new(), 0, Vec::new());
        for (child, lines) in self.clients.iter_mut() {
            let j = read_until(lines, "OPS ");
            ops.extend(serde_json::from_str::<Vec<Op>>(&j).unwrap());
            errors += read_until(lines, "ERRORS ").trim().parse::<u64>().unwrap();
            let last = read_until(lines, "LAST_ERROR ");
            if !last.trim().is_empty() {
                texts.push(last);
            }
            assert!(wait(child, 120).success(), "a client process failed");
        }
        (ops, errors, texts)
    }

    /// SIGTERM the proxy and return its log.
    fn stop_proxy(&mut self) -> String {
        signal(&mut self.proxy, libc::SIGTERM);
        assert!(wait(&mut self.proxy, 60).success(), "the proxy failed");
        std::fs::read_to_string(&self.proxy_log).unwrap()
    }
}

/// `e` and its sources, `: `-separated (the proxy's refusal is the source of the RPC
/// error).
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        s.push_str(": ");
        s.push_str(&x.to_string());
        src = x.source();
    }
    s
}

#[test]
fn the_proxy_follows_a_sigkilled_oracle_restarted_from_its_state_dir() {
    let mut run = start("pxrs");
    let killed_ns = run.kill_oracle();
    assert_eq!(run.restart_oracle(true), 2);
    let restarted_ns = now_ns();
    // Every client gets timestamps of the new epoch through the same proxy.
    for (_, lines) in run.clients.iter_mut() {
        assert_eq!(read_until(lines, "EPOCH_SEEN ").trim(), "2");
    }
    std::thread::sleep(Duration::from_millis(300));
    let (ops, _errors, _) = run.collect();
    let before: Vec<&Op> = ops.iter().filter(|o| o.response_ns < killed_ns).collect();
    let after: Vec<&Op> = ops.iter().filter(|o| o.invoke_ns > restarted_ns).collect();
    assert!(!before.is_empty() && !after.is_empty());
    for c in 0..CLIENTS {
        assert!(
            after.iter().any(|o| o.client / 100 == c),
            "client {c} got nothing after the restart"
        );
    }
    let max_before = before.iter().map(|o| o.ts).max().unwrap();
    let min_after = after.iter().map(|o| o.ts).min().unwrap();
    assert!(
        min_after > max_before,
        "after the restart {min_after} <= before {max_before}"
    );
    assert!(before.iter().all(|o| o.ts.epoch() == 1));
    assert!(after.iter().all(|o| o.ts.epoch() == 2));
    assert_eq!(check(&ops), Ok(ops.len()));
    let log = run.stop_proxy();
    assert!(
        log.contains("switched to its new epoch"),
        "proxy log:\n{log}"
    );
    assert!(log.contains("oracle_reconnects=1"), "proxy log:\n{log}");
    assert!(log.contains("went_back=0"), "proxy log:\n{log}");
}

#[test]
fn the_proxy_refuses_an_oracle_restarted_without_its_state_dir() {
    let mut run = start("pxrb");
    run.kill_oracle();
    assert_eq!(run.restart_oracle(false), 0, "no state directory: epoch 0");
    // Every client is refused by the proxy; none gets a timestamp meanwhile.
    for (_, lines) in run.clients.iter_mut() {
        let msg = read_until(lines, "REFUSED ");
        assert!(msg.contains("would go back"), "{msg}");
    }
    std::thread::sleep(Duration::from_millis(300));
    let (ops, errors, texts) = run.collect();
    assert!(errors > 0);
    assert_eq!(
        texts.len(),
        CLIENTS as usize,
        "every client saw errors last"
    );
    // Nothing after the restart was served: every timestamp is of epoch 1 and the
    // history is linearizable; the epoch-0 oracle's timestamps never reached a client.
    assert!(!ops.is_empty());
    assert!(
        ops.iter().all(|o| o.ts.epoch() == 1),
        "a timestamp went back"
    );
    assert_eq!(check(&ops), Ok(ops.len()));
    let log = run.stop_proxy();
    assert!(
        log.contains("refusing the restarted oracle"),
        "proxy log:\n{log}"
    );
    assert!(log.contains("oracle_reconnects=0"), "proxy log:\n{log}");
    assert!(!log.contains("went_back=0"), "proxy log:\n{log}");
}

/// The client process's body; a no-op unless run by the tests above. Coroutines take
/// one timestamp at a time through the proxy (call deadline 1 s), record the ones they
/// got, count and retry failures, until the stop file exists. Prints `STARTED`,
/// `EPOCH_SEEN <e>` the first time a timestamp of a larger epoch arrives, `REFUSED
/// <error>` at the first error saying the oracle would go back, then `OPS <json>`,
/// `ERRORS <n>` and `LAST_ERROR <text>` (empty when the last request succeeded).
#[test]
fn client_process() {
    let (Ok(cluster), Ok(proxy), Ok(me), Ok(stop)) = (
        std::env::var("TSO_PR_CLUSTER"),
        std::env::var("TSO_PR_PROXY"),
        std::env::var("TSO_PR_CLIENT"),
        std::env::var("TSO_PR_STOP"),
    ) else {
        return;
    };
    let proxy: SocketAddr = proxy.parse().unwrap();
    let me: u32 = me.parse().unwrap();
    let stop = PathBuf::from(stop);
    let fabric = client_fabric(&cluster, me);
    let deadline = Instant::now() + CLIENT_DEADLINE;
    // One client process per run of this function: its counters can be statics.
    static EPOCH_SEEN: AtomicU16 = AtomicU16::new(0);
    static REFUSED: AtomicBool = AtomicBool::new(false);
    static ERRORS: AtomicU64 = AtomicU64::new(0);
    let started = std::sync::Barrier::new(THREADS as usize + 1);
    let results: Vec<(Vec<Op>, Option<String>)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                let f = fabric.clone();
                let (stop, started) = (&stop, &started);
                s.spawn(move || {
                    let ctx = ThreadCtx::new(f, RuntimeConfig::default()).unwrap();
                    let pc = Rc::new(
                        ProxyClient::from_info(
                            &ctx.connect_rpc(proxy).unwrap(),
                            Duration::from_secs(1),
                        )
                        .unwrap(),
                    );
                    let ops = Rc::new(RefCell::new(Vec::new()));
                    let last_error = Rc::new(RefCell::new(None));
                    let mut ex = Executor::new(ctx.clone());
                    for k in 0..COROS {
                        let (ctx, pc, ops, last_error) =
                            (ctx.clone(), pc.clone(), ops.clone(), last_error.clone());
                        let id = me * 100 + t * COROS + k;
                        let stop = stop.clone();
                        ex.spawn(async move {
                            let mut r = 0u32;
                            loop {
                                assert!(Instant::now() < deadline, "client deadline");
                                if r.is_multiple_of(16) && stop.exists() {
                                    break;
                                }
                                r += 1;
                                let invoke_ns = now_ns();
                                match pc.timestamps(&ctx, 1).await {
                                    Ok(range) => {
                                        let ts = range.first();
                                        ops.borrow_mut().push(Op {
                                            client: id,
                                            invoke_ns,
                                            response_ns: now_ns(),
                                            ts,
                                        });
                                        *last_error.borrow_mut() = None;
                                        if EPOCH_SEEN.fetch_max(ts.epoch(), Ordering::AcqRel)
                                            < ts.epoch()
                                        {
                                            println!("EPOCH_SEEN {}", ts.epoch());
                                        }
                                    }
                                    Err(e) => {
                                        ERRORS.fetch_add(1, Ordering::Relaxed);
                                        let text = chain(&e);
                                        if text.contains("would go back")
                                            && !REFUSED.swap(true, Ordering::AcqRel)
                                        {
                                            println!("REFUSED {text}");
                                        }
                                        *last_error.borrow_mut() = Some(text);
                                        ctx.sleep(Duration::from_millis(5)).await;
                                    }
                                }
                            }
                        });
                    }
                    // Connected; then wait until `STARTED` is out before taking any
                    // timestamp, so that `EPOCH_SEEN` can only follow it.
                    started.wait();
                    started.wait();
                    ex.run();
                    let v = ops.borrow().clone();
                    let e = last_error.borrow().clone();
                    (v, e)
                })
            })
            .collect();
        // Every thread is connected: say so, then let them run. The test reads a
        // client's tagged lines in order and skips what comes before the one it waits
        // for, so `STARTED` must be out before a thread can print `EPOCH_SEEN` (which
        // it prints once): printed after the threads ran, it made the test skip
        // `EPOCH_SEEN 1` and wait forever for it.
        started.wait();
        println!("STARTED");
        started.wait();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ops: Vec<Op> = results
        .iter()
        .flat_map(|(o, _)| o.iter().copied())
        .collect();
    let last = results
        .iter()
        .find_map(|(_, e)| e.clone())
        .unwrap_or_default();
    println!("OPS {}", serde_json::to_string(&ops).unwrap());
    println!("ERRORS {}", ERRORS.load(Ordering::Relaxed));
    println!("LAST_ERROR {}", last.replace('\n', " "));
}
