//! Linearizability across processes: the real `tso` binary, several client processes
//! (this test binary re-run as clients), each recording its requests with
//! `CLOCK_MONOTONIC` invoke and response times; the merged histories pass the checker
//! (`tso::history`). Clients mix per-request FAA and TSO groups over two threads. Every
//! process uses the backend `$RRPC_FABRIC` names (shm by default), so the test also runs
//! on verbs (Soft-RoCE).

mod common;
use common::{client_command, client_fabric, spawn_service, wait, KillOnDrop};
use std::cell::RefCell;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rrpc::fabric::shm::ClusterGuard;
use rrpc::runtime::{Executor, RuntimeConfig, ThreadCtx};
use tso::history::{check, now_ns, Op};
use tso::{GroupedTso, TsoClient};

const CLIENTS: u32 = 3;
const THREADS: u32 = 2;
const COROS: u32 = 4;
const ROUNDS: u32 = 300;

#[test]
fn merged_histories_of_client_processes_are_linearizable() {
    let name = format!("tso-test-{}-hist", std::process::id());
    let (cluster, _) = ClusterGuard::new(&name).unwrap();
    let (_tso, _, addr) = spawn_service(
        Command::new(env!("CARGO_BIN_EXE_tso"))
            .args(["--cluster", cluster.name(), "--node", "3"])
            .stderr(Stdio::null()),
    );
    let addr = addr.to_string();

    let mut clients: Vec<KillOnDrop> = (0..CLIENTS)
        .map(|i| {
            KillOnDrop(
                client_command()
                    .env("TSO_HIST_CLUSTER", cluster.name())
                    .env("TSO_HIST_ADDR", &addr)
                    .env("TSO_HIST_CLIENT", i.to_string())
                    .spawn()
                    .unwrap(),
            )
        })
        .collect();
    let mut ops: Vec<Op> = Vec::new();
    for c in clients.iter_mut() {
        let out = BufReader::new(c.0.stdout.take().unwrap());
        for l in out.lines().map_while(Result::ok) {
            // libtest prints "test client_process ... " on the same line.
            if let Some(j) = l.split_once("OPS ").map(|(_, j)| j) {
                ops.extend(serde_json::from_str::<Vec<Op>>(j).unwrap());
            }
        }
        assert!(wait(c, 120).success());
    }
    assert_eq!(ops.len() as u32, CLIENTS * THREADS * COROS * ROUNDS);
    let procs: std::collections::HashSet<u32> = ops.iter().map(|o| o.client / 100).collect();
    assert_eq!(procs.len() as u32, CLIENTS);
    assert_eq!(check(&ops), Ok(ops.len()));
}

/// The client process's body; a no-op unless run by the test above.
#[test]
fn client_process() {
    let (Ok(cluster), Ok(addr), Ok(me)) = (
        std::env::var("TSO_HIST_CLUSTER"),
        std::env::var("TSO_HIST_ADDR"),
        std::env::var("TSO_HIST_CLIENT"),
    ) else {
        return;
    };
    let addr: SocketAddr = addr.parse().unwrap();
    let me: u32 = me.parse().unwrap();
    let fabric = client_fabric(&cluster, me);
    let probe = ThreadCtx::new(fabric.clone(), RuntimeConfig::default()).unwrap();
    let client = TsoClient::from_info(&probe.connect(addr).unwrap()).unwrap();
    let grouped = Arc::new(GroupedTso::new(client.clone()));
    let deadline = Instant::now() + Duration::from_secs(60);
    let ops: Vec<Op> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                let (f, g, c) = (fabric.clone(), grouped.clone(), client.clone());
                s.spawn(move || {
                    let ctx = ThreadCtx::new(f, RuntimeConfig::default()).unwrap();
                    ctx.connect(addr).unwrap();
                    let c = Rc::new(c);
                    let ops = Rc::new(RefCell::new(Vec::new()));
                    let mut ex = Executor::new(ctx.clone());
                    for k in 0..COROS {
                        let (ctx, g, c, ops) = (ctx.clone(), g.clone(), c.clone(), ops.clone());
                        let id = me * 100 + t * COROS + k;
                        ex.spawn(async move {
                            for r in 0..ROUNDS {
                                assert!(Instant::now() < deadline, "client deadline");
                                let invoke_ns = now_ns();
                                let ts = if (r + k) % 2 == 0 {
                                    g.timestamp(&ctx).await.unwrap()
                                } else {
                                    c.timestamp(&ctx).await.unwrap()
                                };
                                let response_ns = now_ns();
                                ops.borrow_mut().push(Op {
                                    client: id,
                                    invoke_ns,
                                    response_ns,
                                    ts,
                                });
                            }
                        });
                    }
                    ex.run();
                    let v = ops.borrow().clone();
                    v
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    println!("OPS {}", serde_json::to_string(&ops).unwrap());
}
