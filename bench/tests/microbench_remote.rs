//! End to end: each microbenchmark's server side as a process of its own (`--serve`,
//! ended by closing its stdin) and its client side (`--connect ADDR`) against it,
//! printing the lines a one-process run prints. Short points; the figures are the
//! benchmarks' business, not this test's.
//!
//! The fabric is `$RRPC_FABRIC` (shm by default). The server side uses
//! `$RRPC_TEST_PEER_DEVICE` as its RDMA device and listens on `$RRPC_TEST_PEER_LISTEN`
//! when set (the Soft-RoCE VM runs the two sides on two devices that way); the client
//! side uses `$RRPC_RDMA_DEVICE`.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One test at a time: each runs busy-polling servers and clients, and the machine may
/// have two cores.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn fabric() -> String {
    std::env::var("RRPC_FABRIC")
        .ok()
        .filter(|f| !f.is_empty())
        .unwrap_or_else(|| "shm".into())
}

/// A `--serve` process, killed if the test ends without closing it.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(bin: &str) -> Self {
        let mut c = Command::new(bin);
        c.arg("--serve")
            .env("RRPC_FABRIC", fabric())
            .env_remove("RRPC_MODEL")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Ok(dev) = std::env::var("RRPC_TEST_PEER_DEVICE") {
            c.env("RRPC_RDMA_DEVICE", dev);
        }
        if let Ok(listen) = std::env::var("RRPC_TEST_PEER_LISTEN") {
            c.args(["--listen", &listen]);
        }
        let mut child = c.spawn().expect("starting the server side");
        let out = child.stdout.take().expect("stdout");
        // A thread reads the READY line, so a server that never prints it fails the test
        // after the watchdog instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                eprintln!("server: {line}");
                if let Some(a) = line.strip_prefix("READY ") {
                    let _ = tx.send(a.to_string());
                }
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                panic!("{bin} --serve printed no READY line");
            }
        };
        Self { child, addr }
    }

    /// Close stdin and wait for the process to end (it must, by itself).
    fn close(mut self) {
        drop(self.child.stdin.take());
        let t0 = Instant::now();
        loop {
            match self.child.try_wait().unwrap() {
                Some(status) => {
                    assert!(status.success(), "the server side exited with {status}");
                    return;
                }
                None if t0.elapsed() > Duration::from_secs(30) => {
                    panic!("the server side did not end when its stdin closed")
                }
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Run the client side; its stdout, after checking it succeeded.
fn client(bin: &str, args: &[&str], server: &Server) -> String {
    let out = Command::new(bin)
        .args(args)
        .args(["--connect", &server.addr])
        .env("RRPC_FABRIC", fabric())
        .env_remove("RRPC_MODEL")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{bin} {args:?} --connect failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The number after `prefix` on the line that starts with it.
fn figure(stdout: &str, prefix: &str) -> f64 {
    let line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with(prefix))
        .unwrap_or_else(|| panic!("no line {prefix:?} in:\n{stdout}"));
    let rest = line.trim_start()[prefix.len()..].trim();
    rest.split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no figure on {line:?}"))
}

const SHORT: [&str; 4] = ["--duration-ms", "300", "--warmup-ms", "50"];

#[test]
fn rrpc_bench_peers_across_processes() {
    let _s = serial();
    let bin = env!("CARGO_BIN_EXE_rrpc-bench");
    let server = Server::start(bin);
    // Two rounds of ib_write_lat, rrpc and ib_write_lat again (on verbs); on shm
    // perftest says why it is skipped.
    let mut args = vec!["peers", "--perftest", "--rounds", "2"];
    args.extend(SHORT);
    let out = client(bin, &args, &server);
    assert!(
        out.contains(&format!("server at --connect {}", server.addr)),
        "{out}"
    );
    // The rrpc row of the peers table: p50, p99, mean, one-way, round trips.
    let row = out
        .lines()
        .find(|l| {
            let mut w = l.split_whitespace();
            w.next() == Some("rrpc") && w.next().is_some_and(|v| v.parse::<u64>().is_ok())
        })
        .unwrap_or_else(|| panic!("no rrpc row in:\n{out}"));
    let trips: u64 = row.split_whitespace().nth(5).unwrap().parse().unwrap();
    assert!(trips > 0, "{row}");
    // The comparison with perftest, in the suite's log.
    for l in out
        .lines()
        .filter(|l| l.starts_with("perftest") || l.contains("ratio rtt"))
    {
        eprintln!("{l}");
    }
    if fabric() == "verbs" && bench::perftest::find().is_some() {
        assert!(out.contains("2 x t_typical"), "{out}");
        // Each round's line (round number, two perftest round trips around rrpc's
        // p50), then the median ratio, unless both rounds changed speed.
        let rounds = out
            .lines()
            .filter(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                w.len() >= 5
                    && (w[0] == "1" || w[0] == "2")
                    && w[1..5].iter().all(|v| v.parse::<f64>().is_ok())
            })
            .count();
        assert_eq!(rounds, 2, "{out}");
        if !out.contains("ratio rtt rrpc/ib_write_lat: none") {
            let r = figure(&out, "ratio rtt rrpc/ib_write_lat =");
            assert!(r > 0.0, "{out}");
        }
    } else {
        assert!(out.contains("perftest: skipped: "), "{out}");
        assert!(!out.contains("ratio rtt rrpc/ib_write_lat"), "{out}");
    }
    // Floor rounds need both sides in this process: refused with --connect, naming the
    // perftest rounds that work across hosts.
    let floor_rounds = Command::new(bin)
        .args(["peers", "--rounds", "2", "--connect", &server.addr])
        .env("RRPC_FABRIC", fabric())
        .env_remove("RRPC_MODEL")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&floor_rounds.stderr);
    assert_eq!(floor_rounds.status.code(), Some(2), "{err}");
    assert!(err.contains("--perftest"), "{err}");
    // Another benchmark's client is refused, and the server keeps serving.
    let wrong = Command::new(env!("CARGO_BIN_EXE_tso-bench"))
        .args(["--connect", &server.addr, "--clients", "1"])
        .env("RRPC_FABRIC", fabric())
        .output()
        .unwrap();
    assert!(!wrong.status.success());
    let err = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        err.contains("this is a rrpc-bench server, not tso-bench"),
        "{err}"
    );
    let mut args = vec!["throughput"];
    args.extend(SHORT);
    let out = client(bin, &args, &server);
    assert!(out.contains("small-RPC throughput (32 B / 32 B"), "{out}");
    server.close();
}

#[test]
fn lock_bench_fairness_across_processes() {
    let _s = serial();
    let bin = env!("CARGO_BIN_EXE_lock-bench");
    let server = Server::start(bin);
    let args = vec![
        "fairness",
        "--thetas",
        "0.99",
        "--locks",
        "100",
        "--kinds",
        "takeout,cas",
        "--cas-backoff-caps-us",
        "100",
        "--threads",
        "1",
        "--coroutines",
        "4",
        // Longer points than the other tests: under the Soft-RoCE VM's emulated CPU a
        // Takeout acquisition across processes takes milliseconds, and 100 ms rounds
        // could end with none measured (a row the ratio then leaves out).
        "--duration-ms",
        "1500",
        "--warmup-ms",
        "100",
    ];
    let out = client(bin, &args, &server);
    assert!(out.contains("lock service at --connect"), "{out}");
    assert!(figure(&out, "ratio p99 takeout/cas @0.99 =") > 0.0, "{out}");
    server.close();
}

#[test]
fn tso_bench_across_processes() {
    let _s = serial();
    let bin = env!("CARGO_BIN_EXE_tso-bench");
    let server = Server::start(bin);
    let mut args = vec![
        "--clients",
        "2",
        "--threads",
        "1",
        "--modes",
        "faa,group,rpc-oracle",
    ];
    args.extend(SHORT);
    let out = client(bin, &args, &server);
    assert!(out.contains("oracle at --connect"), "{out}");
    assert!(figure(&out, "ratio group/faa @2 =") > 0.0, "{out}");
    let rpc = out
        .lines()
        .find(|l| l.split_whitespace().next() == Some("rpc-oracle"))
        .unwrap_or_else(|| panic!("no rpc-oracle row in:\n{out}"));
    let rate: f64 = rpc.split_whitespace().nth(2).unwrap().parse().unwrap();
    assert!(rate > 0.0, "{rpc}");
    server.close();
}
