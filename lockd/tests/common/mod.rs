//! Helpers shared by lockd's integration tests.
#![allow(dead_code)] // each test binary uses a different subset

use rrpc::NodeId;
use std::collections::BTreeMap;

use rrpc::fabric::Fabric;

use rrpc::node::{Node, NodeConfig};
use rrpc::server::Handlers;

/// A lock-service node (role "lockd") on `fabric`, exporting `exports`, serving
/// `handlers` on `threads` server threads, its control plane on a loopback port.
pub fn lockd_node(
    fabric: Fabric,
    exports: BTreeMap<String, serde_json::Value>,
    handlers: Handlers,
    threads: usize,
) -> Node {
    Node::start(
        fabric,
        NodeConfig::new("lockd", "127.0.0.1:0".parse().unwrap())
            .with_exports(exports)
            .with_rpc(Some((handlers, threads))),
    )
    .unwrap()
}

/// Open node `node` of `cluster` as incarnation `incarnation` of its id, on the backend
/// `$RRPC_FABRIC` names (as `ClusterGuard::open` does, which takes a fresh incarnation):
/// every connection it makes announces that (node, incarnation), and the lock services
/// own what it takes by it. A restarted node is a new fabric of the same id (the old
/// one dropped first) with a larger incarnation.
pub fn open_as(cluster: &rrpc::fabric::shm::ClusterGuard, node: u32, incarnation: u64) -> Fabric {
    let kind = FabricKind::from_env().unwrap();
    Fabric::open(
        &FabricConfig::new(kind, cluster.name(), NodeId(node)).with_incarnation(incarnation),
    )
    .unwrap()
}

// ---------------------------------------------------------------------------------------
// Client processes: the test binary run again as its `child_process` test, which calls
// `child_main`. Every test binary that spawns children defines
// `#[test] fn child_process() { common::child_main() }`.
// ---------------------------------------------------------------------------------------

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use lockd::client::{Grant, LockClient, LockRequest, Mode};
use lockd::lock_table::LockMode;
use lockd::shard::LockKey;
use lockd::table_service::{TableClient, TableClientConfig};
use lockd::table_wire::{OpKind, OpOutcome, TableOp};
use rrpc::fabric::{FabricConfig, FabricKind};
use rrpc::runtime::{block_on, RuntimeConfig, ThreadCtx};

/// The Takeout lock a `takeout` child takes a ticket on.
pub const CHILD_LOCK: u64 = 3;
/// The incarnation every child's fabric is opened as (unless `LOCKD_CHILD_INCARNATION`
/// says another): its connections announce it, and the lock services own what it takes
/// by it.
pub const CHILD_INCARNATION: u64 = 1;
/// The shard of the lock-table keys a `table` child locks.
pub const CHILD_SHARD: u64 = 7;

/// A child process running [`child_main`] in a role; killed (SIGKILL) when dropped.
pub struct ChildProc {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Option<std::io::Lines<BufReader<std::process::ChildStdout>>>,
}

impl ChildProc {
    /// Start the child as node `node` of `cluster`, a client of the lock service at
    /// `server`, and wait for its `READY <n>` line; returns it and `n`. Roles: see
    /// [`child_main`].
    pub fn spawn(cluster: &str, role: &str, node: u32, server: SocketAddr, ts: u64) -> (Self, u64) {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("LOCKD_CHILD_ROLE", role)
            .env("LOCKD_CHILD_CLUSTER", cluster)
            .env("LOCKD_CHILD_NODE", node.to_string())
            .env("LOCKD_CHILD_SERVER", server.to_string())
            .env("LOCKD_CHILD_TS", ts.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut me = Self {
            child,
            stdin,
            lines: Some(lines),
        };
        // The child exits on its own after a minute, which ends the wait if it never
        // gets ready.
        let Some(line) = me.expect("READY ") else {
            me.kill();
            panic!("child {role} (node {node}) did not get ready");
        };
        let n = line.trim().parse().unwrap();
        (me, n)
    }

    /// Wait for a line containing `tag` (the harness may print on the same line) and
    /// return what follows it; `None` if the child's output ended first.
    pub fn expect(&mut self, tag: &str) -> Option<String> {
        let lines = self.lines.as_mut()?;
        lines
            .map_while(Result::ok)
            .find_map(|l| l.find(tag).map(|i| l[i + tag.len()..].to_string()))
    }

    /// Ask the child to release what it holds; waits for its `RELEASED` line.
    pub fn release(&mut self) {
        let w = self.stdin.as_mut().expect("stdin");
        writeln!(w, "release").unwrap();
        w.flush().unwrap();
        assert!(
            self.expect("RELEASED").is_some(),
            "the child did not release"
        );
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        self.kill();
    }
}

fn table_op(shard: u64, rest: u64, txn: u64, node: u32, kind: OpKind) -> TableOp {
    TableOp {
        key: LockKey::compose(1, shard, rest).unwrap(),
        txn,
        node,
        kind,
    }
}

/// The child process body; returns at once unless run by [`ChildProc::spawn`]. Roles:
/// `takeout` takes a ticket on [`CHILD_LOCK`] with timestamp `LOCKD_CHILD_TS` and prints
/// `READY <ticket>`; `table` write-locks key ([`CHILD_SHARD`], 1) and read-locks key
/// ([`CHILD_SHARD`], 2) of table 1 as transaction 1 of its node and prints `READY 2`.
/// Then it holds them until killed, until its stdin ends, or until a minute passed; on a
/// `release` line it releases them (`table` only) and prints `RELEASED`.
pub fn child_main() {
    let Ok(role) = std::env::var("LOCKD_CHILD_ROLE") else {
        return;
    };
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(60));
        std::process::exit(1);
    });
    let var = |k: &str| std::env::var(k).unwrap();
    let node: u32 = var("LOCKD_CHILD_NODE").parse().unwrap();
    let server: SocketAddr = var("LOCKD_CHILD_SERVER").parse().unwrap();
    let ts: u64 = var("LOCKD_CHILD_TS").parse().unwrap();
    let kind = FabricKind::from_env().unwrap();
    let cfg = FabricConfig::new(kind, &var("LOCKD_CHILD_CLUSTER"), NodeId(node)).with_incarnation(
        std::env::var("LOCKD_CHILD_INCARNATION").map_or(CHILD_INCARNATION, |v| v.parse().unwrap()),
    );
    let fabric = Fabric::open(&cfg).unwrap();
    let ctx = ThreadCtx::new(
        fabric,
        RuntimeConfig::default().with_call_timeout(Duration::from_secs(5)),
    )
    .unwrap();
    let info = ctx.connect_rpc(server).unwrap();
    let c = ctx.clone();
    let mut stdin = std::io::stdin().lock();
    let mut line = String::new();
    match role.as_str() {
        "takeout" => {
            // Declares its fabric's incarnation, as the service takes it.
            let lc = LockClient::from_info(&info).unwrap();
            let t = block_on(&ctx, async move {
                let req = LockRequest {
                    id: CHILD_LOCK,
                    ts,
                    mode: Mode::Hot,
                };
                match lc.lock(&c, &[req]).await.unwrap().remove(0) {
                    Grant::Queued(t) => t,
                    Grant::Refused(r) => panic!("refused: {r:?}"),
                }
            });
            println!("READY {}", t.number());
            std::io::stdout().flush().unwrap();
            let _ = stdin.read_line(&mut line);
            // Held until the process ends (a dropped ticket's coroutine would never run).
            std::mem::forget(t);
        }
        "table" => {
            let c2 = c.clone();
            let tc = block_on(&ctx, async move {
                // Runs as its fabric's incarnation, as the service takes it.
                let cfg = TableClientConfig::default();
                let tc = TableClient::connect(&c2, &[info.node.get()], None, cfg)
                    .await
                    .unwrap();
                let ops = [
                    table_op(CHILD_SHARD, 1, 1, node, OpKind::Lock(LockMode::Write)),
                    table_op(CHILD_SHARD, 2, 1, node, OpKind::Lock(LockMode::Read)),
                ];
                let o = tc.execute(&c2, &ops).await.unwrap();
                assert_eq!(o, [OpOutcome::Granted, OpOutcome::Granted]);
                tc
            });
            println!("READY 2");
            std::io::stdout().flush().unwrap();
            let _ = stdin.read_line(&mut line);
            if line.trim() == "release" {
                block_on(&ctx, async move {
                    let ops = [
                        table_op(CHILD_SHARD, 1, 1, node, OpKind::Unlock),
                        table_op(CHILD_SHARD, 2, 1, node, OpKind::Unlock),
                    ];
                    let o = tc.execute(&c, &ops).await.unwrap();
                    assert_eq!(o, [OpOutcome::Released, OpOutcome::Released]);
                });
                println!("RELEASED");
                std::io::stdout().flush().unwrap();
                line.clear();
                let _ = stdin.read_line(&mut line);
            }
        }
        other => panic!("unknown child role {other}"),
    }
    std::process::exit(0);
}
