//! TSO proxies as real processes (Scythe 4.5 (3)): the `tso` binary, two `tso-proxy`
//! binaries and several client processes (this test binary re-run as clients; all on the
//! backend `$RRPC_FABRIC` names, shm by default), each
//! recording its requests with `CLOCK_MONOTONIC` invoke and response times; the merged
//! histories pass the linearizability checker (`tso::history`):
//!
//! - clients going through proxy A, proxy B, direct FAA and TSO groups over both proxies;
//! - a proxy killed with SIGKILL mid-load: clients fail over to the other proxy or the
//!   oracle, keep getting timestamps, and the history stays linearizable.

mod common;
use common::{
    client_command, client_fabric, read_until, spawn_client, spawn_service, wait, KillOnDrop,
};
use std::cell::RefCell;
use std::io::{BufReader, Lines};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{ChildStdout, Command, Stdio};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rrpc::fabric::shm::ClusterGuard;
use rrpc::runtime::{Executor, RuntimeConfig, ThreadCtx};
use tso::history::{check, now_ns, Op};
use tso::proxy::ProxyClient;
use tso::{Choice, GroupedTso, SourceConfig, TsoClient, TsoSources};

const CLIENTS: u32 = 3;
const THREADS: u32 = 2;
const COROS: u32 = 4;

/// Spawn `bin` with `args` (stderr discarded) up to its `READY <addr>`.
fn spawn(bin: &str, args: &[&str]) -> (KillOnDrop, SocketAddr) {
    let (child, _, addr) = spawn_service(Command::new(bin).args(args).stderr(Stdio::null()));
    (child, addr)
}

/// How client processes take their timestamps.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mix {
    /// Coroutine `k` of a thread: proxy A, proxy B, direct FAA, TSO group over both
    /// proxies (k mod 4); a fixed number of rounds.
    AcrossProxies,
    /// TSO groups and single requests over the sources (proxies at random, the oracle as
    /// a last resort), and direct FAA; until the stop file exists.
    Failover,
}

struct Procs {
    _tso: KillOnDrop,
    proxies: Vec<KillOnDrop>,
    clients: Vec<(KillOnDrop, Lines<BufReader<ChildStdout>>)>,
    stop: PathBuf,
}

fn start(cluster: &ClusterGuard, mix: Mix) -> Procs {
    let c = cluster.name();
    let (tso, oracle) = spawn(env!("CARGO_BIN_EXE_tso"), &["--cluster", c, "--node", "3"]);
    let oracle_s = oracle.to_string();
    let (pa, a) = spawn(
        env!("CARGO_BIN_EXE_tso-proxy"),
        &[
            "--cluster",
            c,
            "--node",
            "10",
            "--oracle",
            &oracle_s,
            "--threads",
            "2",
        ],
    );
    // Proxy B takes its settings from a config file.
    let conf = std::env::temp_dir().join(format!("{c}-proxy-b.toml"));
    std::fs::write(
        &conf,
        format!("oracle = \"{oracle_s}\"\nthreads = 2\noracle-qps = 1\n"),
    )
    .unwrap();
    let (pb, b) = spawn(
        env!("CARGO_BIN_EXE_tso-proxy"),
        &[
            "--cluster",
            c,
            "--node",
            "11",
            "--config",
            conf.to_str().unwrap(),
        ],
    );
    let _ = std::fs::remove_file(&conf);
    let stop = std::env::temp_dir().join(format!("{c}-stop"));
    let _ = std::fs::remove_file(&stop);
    let clients = (0..CLIENTS)
        .map(|i| {
            spawn_client(
                client_command()
                    .env("TSO_PX_CLUSTER", c)
                    .env("TSO_PX_ORACLE", &oracle_s)
                    .env("TSO_PX_PROXIES", format!("{a},{b}"))
                    .env("TSO_PX_CLIENT", i.to_string())
                    .env(
                        "TSO_PX_MIX",
                        if mix == Mix::Failover {
                            "failover"
                        } else {
                            "across"
                        },
                    )
                    .env("TSO_PX_STOP", &stop),
            )
        })
        .collect();
    Procs {
        _tso: tso,
        proxies: vec![pa, pb],
        clients,
        stop,
    }
}

/// Every client's ops and failover count.
fn collect(p: &mut Procs) -> (Vec<Op>, u64) {
    let mut ops = Vec::new();
    let mut failovers = 0;
    for (child, lines) in p.clients.iter_mut() {
        let j = read_until(lines, "OPS ");
        ops.extend(serde_json::from_str::<Vec<Op>>(&j).unwrap());
        failovers += read_until(lines, "FAILOVERS ")
            .trim()
            .parse::<u64>()
            .unwrap();
        assert!(wait(child, 120).success(), "a client process failed");
    }
    (ops, failovers)
}

#[test]
fn histories_through_two_proxies_and_direct_faa_are_linearizable() {
    let name = format!("tso-test-{}-pxa", std::process::id());
    let (cluster, _) = ClusterGuard::new(&name).unwrap();
    let mut p = start(&cluster, Mix::AcrossProxies);
    let (ops, _) = collect(&mut p);
    assert_eq!(ops.len() as u32, CLIENTS * THREADS * COROS * ROUNDS);
    let procs: std::collections::HashSet<u32> = ops.iter().map(|o| o.client / 100).collect();
    assert_eq!(procs.len() as u32, CLIENTS);
    assert_eq!(check(&ops), Ok(ops.len()));
}

#[test]
fn a_proxy_killed_mid_load_fails_over_and_the_history_stays_linearizable() {
    let name = format!("tso-test-{}-pxk", std::process::id());
    let (cluster, _) = ClusterGuard::new(&name).unwrap();
    let mut p = start(&cluster, Mix::Failover);
    // Every client is under load.
    for (_, lines) in p.clients.iter_mut() {
        read_until(lines, "STARTED");
    }
    std::thread::sleep(Duration::from_millis(200));
    let pid = p.proxies[0].0.id() as libc::pid_t;
    // SAFETY: kill(2) has no memory-safety preconditions; `pid` is our own unreaped child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let _ = p.proxies[0].0.wait();
    let killed_ns = now_ns();
    // Keep the load on well past a failover (call deadline 200 ms in the clients).
    std::thread::sleep(Duration::from_millis(1500));
    std::fs::write(&p.stop, b"stop").unwrap();
    let (ops, failovers) = collect(&mut p);
    let _ = std::fs::remove_file(&p.stop);
    assert!(failovers >= 1, "no client failed over");
    // Every client process kept getting timestamps after the kill, through the groups.
    for c in 0..CLIENTS {
        let after = ops
            .iter()
            .filter(|o| o.client / 100 == c && o.invoke_ns > killed_ns + 500_000_000)
            .count();
        assert!(after > 0, "client {c} got nothing after the kill");
    }
    assert_eq!(check(&ops), Ok(ops.len()));
}

const ROUNDS: u32 = 200;

/// The client process's body; a no-op unless run by the tests above.
#[test]
fn client_process() {
    let (Ok(cluster), Ok(oracle), Ok(proxies), Ok(me), Ok(mix), Ok(stop)) = (
        std::env::var("TSO_PX_CLUSTER"),
        std::env::var("TSO_PX_ORACLE"),
        std::env::var("TSO_PX_PROXIES"),
        std::env::var("TSO_PX_CLIENT"),
        std::env::var("TSO_PX_MIX"),
        std::env::var("TSO_PX_STOP"),
    ) else {
        return;
    };
    let oracle: SocketAddr = oracle.parse().unwrap();
    let proxies: Vec<SocketAddr> = proxies.split(',').map(|a| a.parse().unwrap()).collect();
    let me: u32 = me.parse().unwrap();
    let failover = mix == "failover";
    let stop = PathBuf::from(stop);
    let fabric = client_fabric(&cluster, me);
    let cfg = SourceConfig::default()
        .with_choice(if failover {
            Choice::Random
        } else {
            Choice::Any
        })
        .with_call_timeout_ms(200)
        .with_retry_after_ms(60_000);
    let sources = Arc::new(TsoSources::discover(Some(oracle), &proxies, &cfg).unwrap());
    let grouped = Arc::new(GroupedTso::with_sources(sources.clone()));
    let probe = ThreadCtx::new(fabric.clone(), RuntimeConfig::default()).unwrap();
    let direct = TsoClient::from_info(&probe.connect(oracle).unwrap()).unwrap();
    let pcs: Vec<ProxyClient> = proxies
        .iter()
        .map(|a| {
            ProxyClient::from_info(&probe.connect_rpc(*a).unwrap(), Duration::from_secs(10))
                .unwrap()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    let started = std::sync::Barrier::new(THREADS as usize + 1);
    let ops: Vec<Op> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                let (f, g, src, d, pcs) = (
                    fabric.clone(),
                    grouped.clone(),
                    sources.clone(),
                    direct.clone(),
                    pcs.clone(),
                );
                let (stop, started) = (&stop, &started);
                s.spawn(move || {
                    let ctx = ThreadCtx::new(f, RuntimeConfig::default()).unwrap();
                    src.connect_thread(&ctx).unwrap();
                    let (d, pcs) = (Rc::new(d), Rc::new(pcs));
                    let ops = Rc::new(RefCell::new(Vec::new()));
                    let mut ex = Executor::new(ctx.clone());
                    for k in 0..COROS {
                        let (ctx, g, src, d, pcs, ops) = (
                            ctx.clone(),
                            g.clone(),
                            src.clone(),
                            d.clone(),
                            pcs.clone(),
                            ops.clone(),
                        );
                        let id = me * 100 + t * COROS + k;
                        let stop = stop.clone();
                        ex.spawn(async move {
                            let mut r = 0u32;
                            loop {
                                assert!(Instant::now() < deadline, "client deadline");
                                if failover {
                                    if r.is_multiple_of(32) && stop.exists() {
                                        break;
                                    }
                                } else if r == ROUNDS {
                                    break;
                                }
                                let invoke_ns = now_ns();
                                let ts = match (failover, k % 4) {
                                    (false, 0 | 1) => pcs[k as usize % 2]
                                        .timestamps(&ctx, 1)
                                        .await
                                        .map(|r| r.first()),
                                    (_, 2) => d.timestamp(&ctx).await,
                                    (true, 1) => src.timestamps(&ctx, 1).await.map(|r| r.first()),
                                    _ => g.timestamp(&ctx).await,
                                }
                                .unwrap();
                                let response_ns = now_ns();
                                ops.borrow_mut().push(Op {
                                    client: id,
                                    invoke_ns,
                                    response_ns,
                                    ts,
                                });
                                r += 1;
                            }
                        });
                    }
                    started.wait();
                    ex.run();
                    let v = ops.borrow().clone();
                    v
                })
            })
            .collect();
        started.wait();
        println!("STARTED");
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    println!("OPS {}", serde_json::to_string(&ops).unwrap());
    println!("FAILOVERS {}", sources.failovers());
}

/// A bad `--config` file stops `tso` and `tso-proxy` with exit code 2 before anything
/// runs, naming the file, the table and the key; `lockd` shares the loader
/// (`rrpc::settings_file`) and its tests.
#[test]
fn a_bad_settings_file_exits_2_naming_file_table_and_key() {
    let cfg = std::env::temp_dir().join(format!("tso-bad-cfg-{}.toml", std::process::id()));
    for (text, want) in [
        ("[fabric]\nbogus = 1\n", "[fabric]: unknown field `bogus`"),
        ("[server]\nthreads = \"two\"\n", "[server]: invalid type"),
        (
            "[runtime]\nnope-ms = 1\n",
            "[runtime]: unknown field `nope-ms`",
        ),
    ] {
        std::fs::write(&cfg, text).unwrap();
        for bin in [env!("CARGO_BIN_EXE_tso"), env!("CARGO_BIN_EXE_tso-proxy")] {
            let out = Command::new(bin)
                .args(["--cluster", "tso-bad-cfg", "--node", "3", "--config"])
                .arg(&cfg)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{bin} {text:?}: {err}");
            assert!(
                err.contains(cfg.to_str().unwrap()) && err.contains(want),
                "{bin} {text:?}: {err}"
            );
        }
    }
    std::fs::remove_file(&cfg).unwrap();
}
