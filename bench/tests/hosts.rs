//! `txn-bench --hosts FILE`: the services where a topology file puts them, started over
//! ssh for a host that names an ssh destination. Here the "remote" host is this one and
//! ssh is a shim (`$RRPC_SSH`) that runs the command it is given, so the whole path runs:
//! the command line and its quoting, READY through ssh's stdout, the logs, the services'
//! `--exit-on-stdin-eof`. (Two real devices: the Soft-RoCE VM's two-hosts suite.)
//!
//! - A run over the shim passes every check under every protocol, each service at its
//!   role's address, its stderr in its log.
//! - `--dry-run` prints each host's command lines and starts nothing.
//! - A service started with `--exit-on-stdin-eof` stops when its stdin closes.
//! - Flags that need one host are refused with --hosts.
//! - A memory node and a coordinator process on another host are killed there through
//!   ssh (their pids as they said them), and the runs pass every check.
//! - `--numa N` binds a service to node N; a node the machine lacks is refused.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::ssh::{free_port, ssh_shim};
use common::txn_bench_watched_env;

const LIMIT: Duration = Duration::from_secs(240);

/// A one-host topology whose host is reached through ssh (the shim), the binaries
/// where the tests' are.
fn topology(dir: &Path, logs: &Path) -> PathBuf {
    topology_with(dir, logs, 2)
}

/// [`topology`] with `memnodes` memory nodes.
fn topology_with(dir: &Path, logs: &Path, memnodes: usize) -> PathBuf {
    topology_file(dir, logs, memnodes, Some("me@{host}"), "")
}

/// A one-host topology file in `dir`: `memnodes` memory nodes, the lock service and the
/// oracle on host `here`, reached through ssh as `ssh` names it (the shim) or directly
/// (`None`), `coordinators` added to the `[coordinators]` table.
fn topology_file(
    dir: &Path,
    logs: &Path,
    memnodes: usize,
    ssh: Option<&str>,
    coordinators: &str,
) -> PathBuf {
    let bin = txn_bench_bin_dir();
    let memnodes: String = (0..memnodes)
        .map(|_| format!("[[memnode]]\nhost = \"here\"\nport = {}\n", free_port()))
        .collect();
    let ssh = ssh.map_or(String::new(), |s| format!("ssh = \"{s}\"\n"));
    let text = format!(
        r#"name = "hosts-test"
fabric = "shm"
bin-dir = "{bin}"
log-dir = "{logs}"

[hosts.here]
ctrl-ip = "127.0.0.1"
{ssh}
{memnodes}
[lockd]
host = "here"
port = {l}

[tso]
host = "here"
port = {t}

[coordinators]
hosts = ["here"]
{coordinators}
[runtime]
call-timeout-ms = 2500
"#,
        bin = bin.display(),
        logs = logs.display(),
        l = free_port(),
        t = free_port(),
    );
    let p = dir.join("cluster.toml");
    std::fs::write(&p, text).unwrap();
    p
}

/// A short SmallBank run of every protocol on the services `topo` places, on cluster
/// `cluster`.
fn run_args<'a>(topo: &'a Path, cluster: &'a str) -> Vec<&'a str> {
    vec![
        "--hosts",
        topo.to_str().unwrap(),
        "--protocol",
        "all",
        "--duration",
        "1",
        "--coroutines",
        "4",
        "--accounts",
        "2000",
        "--cluster",
        cluster,
    ]
}

/// Where `txn-bench` and the service binaries of this build are.
fn txn_bench_bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_txn-bench"))
        .parent()
        .unwrap()
        .to_path_buf()
}

#[test]
fn a_run_over_ssh_places_every_service_and_passes_every_check() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("runs");
    let topo = topology(dir.path(), &logs);
    let shim = ssh_shim(dir.path());
    let args = run_args(&topo, "hosts-run");
    let (ok, stdout, s) = txn_bench_watched_env(
        "hosts",
        &args,
        &[("RRPC_SSH", shim.to_str().unwrap())],
        LIMIT,
    );
    assert!(ok, "{stdout}");
    let runs = s["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4);
    for r in runs {
        assert_eq!(r["invariant_holds"], true, "{stdout}");
    }
    // Two memory nodes, from the file; each service's stderr in its log.
    assert!(stdout.contains("2 memnode(s)"), "{stdout}");
    for k in 1..=3 {
        let d = logs.join(format!("hosts-run-{k}"));
        for f in ["here.memnode.0.log", "here.memnode.1.log", "here.tso.0.log"] {
            let text = std::fs::read_to_string(d.join(f))
                .unwrap_or_else(|e| panic!("{}: {e}", d.join(f).display()));
            assert!(text.contains("serving"), "{f}: {text}");
        }
    }
    // Scythe (run 2) has a lock service, at its role's port, with the file's [runtime].
    let lockd = std::fs::read_to_string(logs.join("hosts-run-2/here.lockd.0.log")).unwrap();
    assert!(lockd.contains("127.0.0.1:"), "{lockd}");
    assert!(lockd.contains("call_timeout_ms=2500"), "{lockd}");
}

#[test]
fn coordinator_processes_run_on_the_coordinator_hosts() {
    // Two cnode processes on the file's coordinator host, started over ssh (the shim):
    // their streams (ready, intervals, history, stats) come back through the session,
    // and the merged run is checked as on one host.
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("runs");
    let topo = topology(dir.path(), &logs);
    let shim = ssh_shim(dir.path());
    let mut args = run_args(&topo, "hosts-cnodes");
    args.extend(["--cnodes", "2", "--protocol", "occ-cas"]);
    let (ok, stdout, s) = txn_bench_watched_env(
        "hosts-cnodes",
        &args,
        &[("RRPC_SSH", shim.to_str().unwrap())],
        LIMIT,
    );
    assert!(ok, "{stdout}");
    let r = &s["runs"][0];
    assert_eq!(r["cnodes"], 2, "{stdout}");
    assert_eq!(r["invariant_holds"], true, "{stdout}");
    assert!(stdout.contains("2 coordinator process(es)"), "{stdout}");
}

/// The ssh shim, each command it is given logged to `<dir>/ssh.log` first.
fn logging_shim(dir: &Path) -> (PathBuf, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let inner = ssh_shim(dir);
    let log = dir.join("ssh.log");
    let p = dir.join("ssh-logging-shim");
    std::fs::write(
        &p,
        format!(
            "#!/bin/sh\necho \"$*\" >> '{}'\nexec '{}' \"$@\"\n",
            log.display(),
            inner.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    (p, log)
}

/// `--kill-memnode-after` with `--hosts`: memory node 0 (a primary) runs "remotely"
/// (through the shim) and is SIGKILLed there through ssh (`kill -KILL <its pid>`); the
/// run fails it over to the partition's backup and passes every check, as on one host
/// (see `failover.rs`).
#[test]
fn a_memnode_killed_over_ssh_fails_over_and_every_check_passes() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("runs");
    let topo = topology_with(dir.path(), &logs, 3);
    let (shim, ssh_log) = logging_shim(dir.path());
    let args = [
        "--hosts",
        topo.to_str().unwrap(),
        "--protocol",
        "mvcc",
        "--replicas",
        "2",
        "--kill-memnode-after",
        "1",
        "--memnode",
        "0",
        "--duration",
        "2.5",
        "--coroutines",
        "4",
        "--accounts",
        "2000",
        "--timeline-ms",
        "10",
        "--each-type-first",
        "--cluster",
        "hosts-kill-mn",
    ];
    let (ok, stdout, s) = txn_bench_watched_env(
        "hosts-kill-mn",
        &args,
        &[("RRPC_SSH", shim.to_str().unwrap())],
        LIMIT,
    );
    assert!(ok, "{stdout}");
    assert_eq!(s["passed"], true, "{stdout}");
    let r = &s["runs"][0];
    let f = &r["failover"];
    assert_eq!(f["memnode"], 0, "{stdout}");
    assert_eq!(f["promoted"], serde_json::json!([0]), "{stdout}");
    assert_eq!(f["lost"], serde_json::json!([]), "{stdout}");
    for k in [
        "durable",
        "replicas_identical",
        "serializable",
        "invariant_holds",
    ] {
        assert_eq!(r[k], true, "{k}: {stdout}");
    }
    assert_eq!(r["locks_held"], 0, "{stdout}");
    assert!(common::committed_from_ms(r, 1500) > 0, "{stdout}");
    assert!(stdout.contains("failover: memnode 0 dead at "), "{stdout}");
    assert!(stdout.contains("3 memnode(s)"), "{stdout}");
    // The kill went through ssh, to the pid the service said it had there.
    let ssh = std::fs::read_to_string(&ssh_log).unwrap();
    let kill = ssh
        .lines()
        .find(|l| l.contains(" kill -KILL "))
        .unwrap_or_else(|| panic!("no kill through ssh in:\n{ssh}"));
    assert!(kill.contains("me@here -- kill -KILL "), "{kill}");
}

/// `--kill-cn-after` with `--hosts`: coordinator process 1 runs "remotely" and is
/// SIGKILLed there through ssh; its ledger is read through ssh (`cat`), it is recovered
/// and restarted, and every check passes (see `cnodes.rs`).
#[test]
fn a_cnode_killed_over_ssh_is_recovered_and_every_check_passes() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("runs");
    let topo = topology(dir.path(), &logs);
    let (shim, ssh_log) = logging_shim(dir.path());
    let mut args = run_args(&topo, "hosts-kill-cn");
    args.extend([
        "--protocol",
        "mvcc",
        "--cnodes",
        "2",
        "--duration",
        "3",
        "--kill-cn-after",
        "1",
        "--restart",
    ]);
    let (ok, stdout, s) = txn_bench_watched_env(
        "hosts-kill-cn",
        &args,
        &[("RRPC_SSH", shim.to_str().unwrap())],
        LIMIT,
    );
    assert!(
        ok,
        "a check failed after the kill and the recovery:\n{stdout}"
    );
    let r = &s["runs"][0];
    assert_eq!(r["invariant_holds"], true, "{stdout}");
    assert_eq!(r["serializable"], true, "{stdout}");
    assert_eq!(r["locks_held"], 0, "{stdout}");
    let events: Vec<&str> = r["cnode_events"]
        .as_array()
        .unwrap_or_else(|| panic!("no events: {stdout}"))
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("cnode 1 (pid ") && e.contains("died at")),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("recovery: cn 1 incarnation 0 dead at")),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e.contains("restarted") && e.contains("incarnation 1")),
        "{events:?}"
    );
    assert!(
        !events.iter().any(|e| e.contains("no ledger")),
        "the ledger was read through ssh: {events:?}"
    );
    let ssh = std::fs::read_to_string(&ssh_log).unwrap();
    assert!(ssh.contains("me@here -- kill -KILL "), "{ssh}");
    assert!(
        ssh.contains("me@here -- cat /dev/shm/rrpc-ledger-"),
        "{ssh}"
    );
}

/// `--stop-cn-after` with `--hosts`: coordinator process 2 is stopped and continued on
/// its host through ssh (`kill -STOP`, `kill -CONT`); stopped past its lease, it is
/// declared dead, fenced and recovered by a survivor, and every check passes (see
/// `cnodes.rs`).
#[test]
fn a_cnode_stopped_over_ssh_is_fenced_and_recovered() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("runs");
    let topo = topology(dir.path(), &logs);
    let (shim, ssh_log) = logging_shim(dir.path());
    let args = [
        "--hosts",
        topo.to_str().unwrap(),
        "--workload",
        "pairs",
        "--protocol",
        "mvcc",
        "--cnodes",
        "3",
        "--threads",
        "1",
        "--coroutines",
        "4",
        "--groups",
        "2000",
        "--duration",
        "6",
        "--stop-cn-after",
        "1",
        "--stop-ms",
        "3500",
        "--cluster",
        "hosts-stop-cn",
    ];
    let (ok, stdout, s) = txn_bench_watched_env(
        "hosts-stop-cn",
        &args,
        &[("RRPC_SSH", shim.to_str().unwrap())],
        LIMIT,
    );
    assert!(
        ok,
        "a check failed after the stop and the recovery:\n{stdout}"
    );
    let r = &s["runs"][0];
    let events: Vec<&str> = r["cnode_events"]
        .as_array()
        .unwrap_or_else(|| panic!("no events: {stdout}"))
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("cnode 2 (pid ") && e.contains("stopped (SIGSTOP)")),
        "{events:?}"
    );
    assert!(
        events.iter().any(|e| e.contains("lease ended at")),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("recovery: cn 2 incarnation 0 dead at")),
        "{events:?}"
    );
    let ssh = std::fs::read_to_string(&ssh_log).unwrap();
    assert!(ssh.contains("me@here -- kill -STOP "), "{ssh}");
    assert!(ssh.contains("me@here -- kill -CONT "), "{ssh}");
}

#[test]
fn a_dry_run_prints_each_hosts_command_lines_and_starts_nothing() {
    let topo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/two-hosts.toml");
    let out = Command::new(env!("CARGO_BIN_EXE_txn-bench"))
        .env("RRPC_MODEL", common::model_env())
        .args([
            "--hosts",
            topo.to_str().unwrap(),
            "--dry-run",
            "--protocol",
            "scythe",
        ])
        .env("RRPC_SSH", "ssh")
        .current_dir(tempfile::tempdir().unwrap().path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("[dry-run]"))
        .collect();
    assert_eq!(lines.len(), 4, "two memory nodes, tso, lockd: {stdout}");
    for l in &lines {
        assert!(l.starts_with("[dry-run] a: ssh -o BatchMode=yes"), "{l}");
        assert!(l.contains("--fabric verbs --rdma-device rxeA"), "{l}");
        assert!(l.contains("--exit-on-stdin-eof"), "{l}");
    }
    // The oracle first: the lock service bounds Lock RPC timestamps by it.
    assert!(lines[0].contains("/opt/rrpc/bin/tso"), "{}", lines[0]);
    assert!(lines[1].contains("/opt/rrpc/bin/memnode") && lines[1].contains("192.168.200.1:7010"));
    assert!(
        lines[3].contains("/opt/rrpc/bin/lockd") && lines[3].contains("--tso 192.168.200.1:7003")
    );
}

/// `--config`'s `[runtime]` and `[server]` go over the topology file's: each service's
/// `--rpc-settings` holds the topology's `call-timeout-ms` (2000 in the example) with the
/// config file's `sq-depth` and `max-ring-bytes` over the defaults.
#[test]
fn a_config_files_rpc_settings_go_over_the_topologys_to_every_service() {
    let topo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/two-hosts.toml");
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("rpc.toml");
    std::fs::write(
        &cfg,
        "[runtime]\nsq-depth = 256\n[server]\nmax-ring-bytes = 65536\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_txn-bench"))
        .env("RRPC_MODEL", common::model_env())
        .args([
            "--hosts",
            topo.to_str().unwrap(),
            "--config",
            cfg.to_str().unwrap(),
            "--dry-run",
            "--protocol",
            "scythe",
        ])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let lines: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("[dry-run]"))
        .collect();
    assert_eq!(lines.len(), 4, "two memory nodes, tso, lockd: {stdout}");
    for l in lines {
        let json = l
            .split("--rpc-settings '")
            .nth(1)
            .and_then(|r| r.split('\'').next())
            .unwrap_or_else(|| panic!("no --rpc-settings in {l}"));
        let v: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(v["runtime"]["call-timeout-ms"], 2000, "the topology's: {l}");
        assert_eq!(v["runtime"]["sq-depth"], 256, "the config file's: {l}");
        assert_eq!(
            v["server"]["max-ring-bytes"], 65536,
            "the config file's: {l}"
        );
    }
}

#[test]
fn a_hosts_cpus_reach_its_services() {
    // node2 of the four-host example runs memory node 2 and has cpus = "0-15".
    let topo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/cloudlab-4.toml");
    let out = Command::new(env!("CARGO_BIN_EXE_txn-bench"))
        .env("RRPC_MODEL", common::model_env())
        .args([
            "--hosts",
            topo.to_str().unwrap(),
            "--dry-run",
            "--protocol",
            "occ-cas",
        ])
        .current_dir(tempfile::tempdir().unwrap().path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let m2 = stdout
        .lines()
        .find(|l| l.contains("/memnode ") && l.contains("--node 12 "))
        .unwrap_or_else(|| panic!("no memory node 12 in:\n{stdout}"));
    assert!(m2.contains("--cpus 0-15"), "{m2}");
    assert!(m2.contains("--numa 0"), "the file's [defaults] numa: {m2}");
    let m0 = stdout
        .lines()
        .find(|l| l.contains("/memnode ") && l.contains("--node 10 "))
        .unwrap();
    assert!(!m0.contains("--cpus"), "{m0}");
}

/// With `--hosts` and coordinators inside `txn-bench` (no `--cnodes`), their threads run
/// on the `[coordinators]` table's CPUs when its first host is this one: the kernel's
/// affinity of the `coordinator-0` thread, read from `/proc` during the run, is CPU 1
/// (without the topology it would be pinned to CPU 0, a core per thread).
#[test]
fn in_process_coordinators_take_the_topologys_cpus() {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        eprintln!("skipped: needs 2 CPUs");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("runs");
    let topo = topology_file(dir.path(), &logs, 1, None, "cpus = \"1\"\n");
    let child = Command::new(env!("CARGO_BIN_EXE_txn-bench"))
        .env("RRPC_MODEL", common::model_env())
        .args([
            "--hosts",
            topo.to_str().unwrap(),
            "--protocol",
            "occ-cas",
            "--threads",
            "1",
            "--duration",
            "3",
            "--accounts",
            "2000",
            "--cluster",
            "hosts-pin",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let task_dir = format!("/proc/{}/task", child.id());
    let t0 = Instant::now();
    let mut allowed = None;
    while allowed.is_none() && t0.elapsed() < Duration::from_secs(60) {
        for t in std::fs::read_dir(&task_dir).into_iter().flatten().flatten() {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if comm.trim() != "coordinator-0" {
                continue;
            }
            let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            allowed = status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .map(|v| v.trim().to_string());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(allowed.as_deref(), Some("1"), "coordinator-0's CPUs");
}

#[test]
fn a_service_exits_when_its_stdin_closes() {
    let dir = tempfile::tempdir().unwrap();
    let name = format!("stdin-eof-{}", std::process::id());
    // The service's shm cluster directory goes with the test, however it ends.
    let (_guard, _) = rrpc::fabric::shm::ClusterGuard::new(&name).unwrap();
    let mut child = Command::new(txn_bench_bin_dir().join("tso"))
        .args([
            "--cluster",
            &name,
            "--node",
            "3",
            "--state-dir",
            dir.path().join("state").to_str().unwrap(),
            "--exit-on-stdin-eof",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("READY ") {
        line.clear();
        assert!(
            std::io::BufRead::read_line(&mut out, &mut line).unwrap() > 0,
            "no READY"
        );
    }
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"still here\n").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        child.try_wait().unwrap().is_none(),
        "it stopped with stdin open"
    );
    drop(stdin);
    let t0 = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            assert!(st.success(), "{st}");
            break;
        }
        if t0.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            panic!("tso still running 10 s after its stdin closed");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The launcher's ssh path through a real OpenSSH server on loopback (started by the
/// test with keys of its own; the real `ssh` client with a config file naming its port
/// and key): every service of a `--protocol all` run is started, watched and stopped
/// over real ssh sessions, and every run passes every check. Skipped with a message
/// where OpenSSH is missing, unless `RRPC_REQUIRE_SSH=1` (the project's test command).
#[test]
fn a_run_over_real_ssh_passes_every_check() {
    let sshd = match common::ssh::Sshd::start() {
        Ok(s) => s,
        Err(why) if std::env::var("RRPC_REQUIRE_SSH").is_ok_and(|v| v == "1") => {
            panic!("RRPC_REQUIRE_SSH=1 but OpenSSH cannot run here: {why}")
        }
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("runs");
    let topo = topology_file(dir.path(), &logs, 2, Some(&sshd.target), "");
    let (ok, stdout, s) = txn_bench_watched_env(
        "hosts-real-ssh",
        &run_args(&topo, "hosts-real-ssh"),
        &[("RRPC_SSH", sshd.ssh().to_str().unwrap())],
        LIMIT,
    );
    assert!(ok, "{stdout}");
    assert_eq!(s["passed"], true, "{stdout}");
    assert_eq!(s["runs"].as_array().unwrap().len(), 4, "{stdout}");
    // Each service's stderr came back through its ssh session into its log.
    let text = std::fs::read_to_string(logs.join("hosts-real-ssh-1/here.memnode.0.log")).unwrap();
    assert!(text.contains("serving"), "{text}");
}

/// `--kill-tso-after` and `--kill-lockd-after` with `--hosts`: the oracle and the lock
/// service run "remotely" (through the shim); each is SIGKILLed there through ssh, started
/// again in the same place with the same state directory (its epoch read through ssh),
/// and the run survives both and passes every check, as on one host.
#[test]
fn the_oracle_and_the_lock_service_killed_over_ssh_restart_there() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("runs");
    let topo = topology(dir.path(), &logs);
    let (shim, ssh_log) = logging_shim(dir.path());
    let args = [
        "--hosts",
        topo.to_str().unwrap(),
        "--protocol",
        "scythe",
        "--kill-tso-after",
        "1",
        "--kill-lockd-after",
        "2",
        "--lockd-down-ms",
        "200",
        "--duration",
        "4.5",
        "--coroutines",
        "4",
        "--accounts",
        "2000",
        "--cluster",
        "hosts-kill-tso-lockd",
    ];
    let (ok, stdout, s) = txn_bench_watched_env(
        "hosts-kill-tso-lockd",
        &args,
        &[("RRPC_SSH", shim.to_str().unwrap())],
        LIMIT,
    );
    assert!(ok, "{stdout}");
    assert_eq!(s["passed"], true, "{stdout}");
    let r = &s["runs"][0];
    let t = &r["tso_restart"];
    assert!(
        t["epoch_after"].as_u64().unwrap() > t["epoch_before"].as_u64().unwrap(),
        "{stdout}"
    );
    let l = &r["lockd_restart"];
    assert!(
        l["epoch_after"].as_u64().unwrap() > l["epoch_before"].as_u64().unwrap(),
        "{stdout}"
    );
    assert!(l["committed_after_ready"].as_u64().unwrap() > 0, "{stdout}");
    for k in ["serializable", "invariant_holds"] {
        assert_eq!(r[k], true, "{k}: {stdout}");
    }
    assert_eq!(r["locks_held"], 0, "{stdout}");
    // Both kills went through ssh, and both services were started there again.
    let ssh = std::fs::read_to_string(&ssh_log).unwrap();
    assert_eq!(
        ssh.lines().filter(|l| l.contains(" kill -KILL ")).count(),
        2,
        "{ssh}"
    );
    for bin in ["/tso ", "/lockd "] {
        assert_eq!(
            ssh.lines().filter(|l| l.contains(bin)).count(),
            2,
            "{bin} started twice over ssh:\n{ssh}"
        );
    }
    assert!(ssh.contains("epoch"), "epochs read through ssh:\n{ssh}");
}

#[test]
fn flags_that_need_hosts_or_a_file_are_checked() {
    let out = Command::new(env!("CARGO_BIN_EXE_txn-bench"))
        .env("RRPC_MODEL", common::model_env())
        .arg("--dry-run")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--dry-run goes with --hosts"), "{stderr}");
    let out = Command::new(env!("CARGO_BIN_EXE_txn-bench"))
        .env("RRPC_MODEL", common::model_env())
        .args(["--hosts", "/nonexistent/cluster.toml"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("/nonexistent/cluster.toml"), "{stderr}");
}

/// The Soft-RoCE VM's two "hosts" (`deploy/vm/verbs-tests.sh` sets
/// `RRPC_TEST_TWO_HOSTS=devA,ipA,devB,ipB,netdevA`): the memory nodes, the oracle and the
/// lock service on device A (started through the launcher's ssh path, the shim), the
/// coordinators in `txn-bench` on device B, every protocol checked, and the RoCE traffic
/// seen on A's veth. Elsewhere it says it is skipped.
#[test]
fn two_hosts_run_every_protocol_across_the_veth_pair() {
    let Ok(spec) = std::env::var("RRPC_TEST_TWO_HOSTS") else {
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED two_hosts_run_every_protocol_across_the_veth_pair: no RRPC_TEST_TWO_HOSTS \
             (the Soft-RoCE VM's verbs suite sets it)"
        );
        return;
    };
    let f: Vec<&str> = spec.split(',').collect();
    let [dev_a, ip_a, dev_b, ip_b, netdev_a] = f[..] else {
        panic!("RRPC_TEST_TWO_HOSTS={spec}: want devA,ipA,devB,ipB,netdevA");
    };
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("runs");
    let shim = ssh_shim(dir.path());
    let port = |k: u16| 17000 + k;
    let text = format!(
        r#"name = "two"
fabric = "verbs"
bin-dir = "{bin}"
log-dir = "{logs}"

[hosts.a]
ctrl-ip = "{ip_a}"
rdma-device = "{dev_a}"
ssh = "{{host}}"
[hosts.b]
ctrl-ip = "{ip_b}"
rdma-device = "{dev_b}"

[[memnode]]
host = "a"
port = {m0}
[[memnode]]
host = "a"
port = {m1}
[lockd]
host = "a"
port = {l}
[tso]
host = "a"
port = {t}
[coordinators]
hosts = ["b"]
"#,
        bin = txn_bench_bin_dir().display(),
        logs = logs.display(),
        m0 = port(10),
        m1 = port(11),
        l = port(2),
        t = port(3),
    );
    let topo = dir.path().join("two.toml");
    std::fs::write(&topo, text).unwrap();
    let tx = |n: &str| -> u64 {
        std::fs::read_to_string(format!("/sys/class/net/{n}/statistics/tx_bytes"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    };
    let before = tx(netdev_a);
    let args = run_args(&topo, "two-hosts");
    let (ok, stdout, s) = txn_bench_watched_env(
        "two-hosts",
        &args,
        &[("RRPC_SSH", shim.to_str().unwrap())],
        LIMIT,
    );
    assert!(ok, "{stdout}");
    assert_eq!(s["runs"].as_array().unwrap().len(), 4, "{stdout}");
    // The coordinators on B, the services on A: the header names B's device.
    assert!(stdout.contains(dev_b), "{stdout}");
    // Coordinator processes on B (over the launcher's ssh path), etcd on B's address.
    let mut args = run_args(&topo, "two-hosts-cnodes");
    args.extend(["--cnodes", "2", "--protocol", "mvcc"]);
    let (ok, stdout, s) = txn_bench_watched_env(
        "two-hosts-cnodes",
        &args,
        &[("RRPC_SSH", shim.to_str().unwrap())],
        LIMIT,
    );
    assert!(ok, "{stdout}");
    assert_eq!(s["runs"][0]["cnodes"], 2, "{stdout}");
    let sent = tx(netdev_a) - before;
    eprintln!("two hosts: {sent} bytes left {netdev_a} during the runs");
    assert!(sent > 1 << 20, "only {sent} bytes crossed {netdev_a}");
}

/// `--numa N` binds a service to NUMA node N before it starts (node 0 exists on every
/// Linux machine); a node the machine lacks is refused, naming it.
#[test]
fn a_service_runs_on_its_numa_node_and_a_missing_node_is_named() {
    let name = format!("numa-{}", std::process::id());
    let (_guard, _) = rrpc::fabric::shm::ClusterGuard::new(&name).unwrap();
    let out = Command::new(txn_bench_bin_dir().join("tso"))
        .args(["--cluster", &name, "--node", "3", "--numa", "7"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("tso: NUMA node 7 does not exist on this machine"),
        "{stderr}"
    );
    let mut child = Command::new(txn_bench_bin_dir().join("tso"))
        .args(["--cluster", &name, "--node", "3", "--numa", "0"])
        .args(["--exit-on-stdin-eof"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("READY ") {
        line.clear();
        assert!(
            std::io::BufRead::read_line(&mut out, &mut line).unwrap() > 0,
            "no READY with --numa 0"
        );
    }
    // Its CPUs are node 0's (or those of them it may use).
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
    let allowed = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_string();
    let node0 = std::fs::read_to_string("/sys/devices/system/node/node0/cpulist").unwrap();
    let parse = |s: &str| rrpc::topology::parse_cpu_list(s.trim()).unwrap();
    assert!(
        parse(&allowed).iter().all(|c| parse(&node0).contains(c)),
        "allowed {allowed}, node 0 has {node0}"
    );
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
}
