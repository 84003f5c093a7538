//! `rrpc-launch`: a standalone cluster from a topology file, as real processes on the shm
//! fabric. The one host names an ssh destination and ssh is a shim (`$RRPC_SSH`) that
//! runs the command here, so the ssh path runs (command line, quoting, READY through
//! ssh's stdout, stderr into the logs, `--exit-on-stdin-eof`).
//!
//! - `up` starts two memory nodes, the oracle, the lock service and a TSO proxy, and
//!   writes their addresses; `status` shows each up; the file loads as `ClusterAddrs`,
//!   each address accepts a connection, and a Scythe transaction commits through a
//!   `TxnClient` (on an account only `--memnode-args` creates, which wins over the
//!   memory node tables' own key); `logs` shows each log; `down` stops `up` and no
//!   service process is left.
//! - A topology file that does not check, or is missing, is refused with its name and
//!   the problem; `--dry-run` prints the ssh command lines and starts nothing.

mod common;

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use rrpc::fabric::{Fabric, FabricConfig, FabricKind};
use rrpc::runtime::{Executor, RuntimeConfig, ThreadCtx};
use rrpc::NodeId;
use txn::coordinator::{ClusterAddrs, Protocol, TxnClient, TxnConfig};
use txn::smallbank::{CHECKING, SAVINGS};

use common::ssh::{free_port, ssh_shim};

const LAUNCH: &str = env!("CARGO_BIN_EXE_rrpc-launch");

/// `rrpc-launch` with `args`, the ssh shim of `dir` as ssh, run from `dir`.
fn launch(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(LAUNCH);
    c.args(args)
        .env("RRPC_SSH", dir.join("ssh-shim"))
        .current_dir(dir);
    c
}

fn text(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A running `rrpc-launch up`: SIGTERM (it then stops its services) and reaped when
/// dropped, so a failing test leaves nothing behind.
struct Up(Child);

impl Drop for Up {
    fn drop(&mut self) {
        // SAFETY: kill(2) with the pid of a child not yet reaped.
        unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM) };
        let t0 = Instant::now();
        while matches!(self.0.try_wait(), Ok(None)) && t0.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if !e
            .file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit())
        {
            continue;
        }
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            let c = String::from_utf8_lossy(&c).replace('\0', " ");
            if c.contains(needle) {
                found.push(format!("{}: {c}", e.file_name().to_string_lossy()));
            }
        }
    }
    found
}

#[test]
fn up_status_a_transaction_logs_and_down_over_the_ssh_path() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ssh_shim(d);
    let name = format!("launch-{}", std::process::id());
    let bin = Path::new(LAUNCH).parent().unwrap();
    let topo_text = format!(
        r#"name = "{name}"
fabric = "shm"
bin-dir = "{bin}"
log-dir = "runs"

[hosts.here]
ctrl-ip = "127.0.0.1"
ssh = "me@{{host}}"

[[memnode]]
host = "here"
port = {m0}
smallbank-accounts = 50
[[memnode]]
host = "here"
port = {m1}
smallbank-accounts = 50

[lockd]
host = "here"
port = {l}
locks = 1024

[tso]
host = "here"
port = {t}
state-dir = "{state}"

[[tso-proxy]]
host = "here"
port = {p}
threads = 1

[coordinators]
hosts = ["here"]
"#,
        bin = bin.display(),
        m0 = free_port(),
        m1 = free_port(),
        l = free_port(),
        t = free_port(),
        p = free_port(),
        state = d.join("tso-state").display(),
    );
    std::fs::write(d.join("cluster.toml"), &topo_text).unwrap();
    let addrs_path = d.join("addrs.toml");
    let stderr_path = d.join("up.stderr");
    let mut up = Up(launch(
        d,
        &[
            "up",
            "--hosts",
            "cluster.toml",
            "--memnode-args",
            "--smallbank-accounts 100",
            "--out",
            "addrs.toml",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(std::fs::File::create(&stderr_path).unwrap())
    .spawn()
    .unwrap());
    let mut stdout = up.0.stdout.take().unwrap();
    let printed = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    // Wait for the addresses file (a watchdog: never hang).
    let t0 = Instant::now();
    while !addrs_path.exists() {
        if let Some(st) = up.0.try_wait().unwrap() {
            panic!(
                "rrpc-launch up exited ({st}): {}",
                std::fs::read_to_string(&stderr_path).unwrap_or_default()
            );
        }
        assert!(
            t0.elapsed() < Duration::from_secs(180),
            "no addresses after 180 s: {}",
            std::fs::read_to_string(&stderr_path).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // status: every role up, the launcher running.
    let st = launch(d, &["status", "--hosts", "cluster.toml"])
        .output()
        .unwrap();
    let out = text(&st);
    assert!(st.status.success(), "{out}");
    assert!(out.contains("rrpc-launch up running"), "{out}");
    for role in ["memnode:0", "memnode:1", "tso:0", "lockd:0", "tso-proxy:0"] {
        let line = out
            .lines()
            .find(|l| l.starts_with(role))
            .unwrap_or_else(|| panic!("{role} missing: {out}"));
        assert!(line.ends_with(" up"), "{line}");
    }
    assert!(!out.contains("coordinator"), "{out}");

    // The addresses: the file loads, each service at its role's port accepts a connection.
    let addrs = ClusterAddrs::from_file(&addrs_path).unwrap();
    let topo = rrpc::topology::Topology::parse(&topo_text, "cluster.toml").unwrap();
    let ports: Vec<u16> = addrs.memnodes.iter().map(|a| a.port()).collect();
    assert_eq!(ports, [topo.memnodes[0].port, topo.memnodes[1].port]);
    assert_eq!(addrs.tso.port(), topo.tso.as_ref().unwrap().port);
    assert_eq!(
        addrs.lockd.unwrap().port(),
        topo.lockd.as_ref().unwrap().port
    );
    for a in addrs
        .memnodes
        .iter()
        .chain([&addrs.tso, &addrs.lockd.unwrap()])
    {
        std::net::TcpStream::connect_timeout(a, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("{a}: {e}"));
    }

    // A Scythe transaction on account 99, which exists only with --memnode-args' 100
    // accounts (the tables say 50).
    {
        let fabric = Fabric::open(&FabricConfig::new(FabricKind::Shm, &name, NodeId(100))).unwrap();
        let ctx = ThreadCtx::new(fabric, RuntimeConfig::default()).unwrap();
        let cfg = TxnConfig::default().with_protocol(Protocol::Scythe);
        let client = TxnClient::connect(ctx.clone(), &addrs, cfg).unwrap();
        let done = std::rc::Rc::new(std::cell::Cell::new(false));
        let mut ex = Executor::new(ctx);
        let flag = done.clone();
        ex.spawn(async move {
            for _ in 0..100 {
                let mut t = client.begin_as(SAVINGS as u16);
                let r = async {
                    let v = t
                        .read_mixed(&[(SAVINGS, 99, true), (CHECKING, 99, false)])
                        .await?;
                    let old = i64::from_le_bytes(v[0].as_slice().try_into().unwrap());
                    t.write(SAVINGS, 99, (old + 1).to_le_bytes().to_vec())?;
                    t.commit().await
                }
                .await;
                match r {
                    Ok(()) => {
                        flag.set(true);
                        return;
                    }
                    Err(txn::coordinator::TxnError::Abort(_)) => client.ctx().yield_now().await,
                    Err(e) => panic!("transaction on account 99: {e}"),
                }
            }
        });
        ex.run();
        assert!(done.get(), "no commit in 100 attempts");
    }

    // logs: one section per service, each with its service's lines.
    let lg = launch(d, &["logs", "--hosts", "cluster.toml", "--lines", "50"])
        .output()
        .unwrap();
    let out = text(&lg);
    assert!(lg.status.success(), "{out}");
    for f in [
        "here.memnode.0.log",
        "here.memnode.1.log",
        "here.tso.0.log",
        "here.lockd.0.log",
        "here.tso-proxy.0.log",
    ] {
        assert!(out.contains(&format!("runs/{name}/{f} (")), "{f}: {out}");
    }
    assert!(!out.contains("(no log"), "{out}");

    // down: `up` stops its services and ends; no process of the cluster is left.
    let dn = launch(d, &["down", "--hosts", "cluster.toml"])
        .output()
        .unwrap();
    assert!(dn.status.success(), "{}", text(&dn));
    let t0 = Instant::now();
    let st = loop {
        if let Some(st) = up.0.try_wait().unwrap() {
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "up still running after down"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    assert!(st.success(), "{st}: {stderr}");
    assert!(stderr.contains("stopped"), "{stderr}");
    let printed = printed.join().unwrap();
    assert!(
        ClusterAddrs::from_toml(&printed).is_ok(),
        "up printed: {printed}"
    );
    let topo_file = std::fs::canonicalize(d.join("cluster.toml")).unwrap();
    let t0 = Instant::now();
    loop {
        let left = processes_mentioning(&topo_file.display().to_string());
        if left.is_empty() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "still running: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!addrs_path.exists(), "the addresses outlived the cluster");
    let st = launch(
        d,
        &["status", "--hosts", "cluster.toml", "--timeout-ms", "200"],
    )
    .output()
    .unwrap();
    let out = text(&st);
    assert!(!st.status.success(), "{out}");
    assert!(out.contains("5 of 5 service(s) do not answer"), "{out}");
    assert!(out.contains("no rrpc-launch up running"), "{out}");
    // A second down finds nothing to stop.
    let dn = launch(d, &["down", "--hosts", "cluster.toml"])
        .output()
        .unwrap();
    assert!(
        dn.status.success() && text(&dn).contains("nothing to stop"),
        "{}",
        text(&dn)
    );
}

#[test]
fn a_bad_topology_is_refused_and_a_dry_run_starts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ssh_shim(d);
    std::fs::write(
        d.join("bad.toml"),
        "name = \"bad\"\nfabric = \"shm\"\n[hosts.here]\nctrl-ip = \"127.0.0.1\"\n\
         [tso]\nhost = \"there\"\nport = 7003\n",
    )
    .unwrap();
    for sub in ["up", "down", "status", "logs"] {
        let o = launch(d, &[sub, "--hosts", "bad.toml"]).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{sub}: {err}");
        assert!(
            err.starts_with("rrpc-launch: bad.toml: [tso]") && err.contains("there"),
            "{sub}: {err}"
        );
    }
    let o = launch(d, &["up", "--hosts", "missing.toml"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("missing.toml"), "{err}");
    let o = launch(
        d,
        &["up", "--hosts", "bad.toml", "--memnode-args", "--node 4"],
    )
    .output()
    .unwrap();
    assert!(!o.status.success());

    // A dry run over ssh: each service's command line, nothing started or written.
    let bin = Path::new(LAUNCH).parent().unwrap();
    std::fs::write(
        d.join("ok.toml"),
        format!(
            "name = \"dry-{}\"\nfabric = \"shm\"\nbin-dir = \"{}\"\n[hosts.here]\n\
             ctrl-ip = \"127.0.0.1\"\nssh = \"me@{{host}}\"\n[[memnode]]\nhost = \"here\"\n\
             port = 7010\n[tso]\nhost = \"here\"\nport = 7003\n",
            std::process::id(),
            bin.display()
        ),
    )
    .unwrap();
    let o = launch(
        d,
        &[
            "up",
            "--hosts",
            "ok.toml",
            "--dry-run",
            "--memnode-args",
            "--smallbank-accounts 10",
        ],
    )
    .output()
    .unwrap();
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    let lines: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("[dry-run] me@here: "))
        .collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines[0].contains("/memnode --cluster dry-")
            && lines[0].contains("--listen 127.0.0.1:7010")
            && lines[0].contains("--as memnode:0 --smallbank-accounts 10 --exit-on-stdin-eof"),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].contains("/tso ") && lines[1].contains("--as tso:0"),
        "{}",
        lines[1]
    );
    assert!(out.contains("tso = \"127.0.0.1:7003\""), "{out}");
    assert!(!d.join("runs").exists(), "a dry run wrote files");
}
