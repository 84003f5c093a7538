//! A lock-table service whose node has a cluster secret admits only the cluster: a
//! connection without the secret, or with another, is refused on the control plane, so
//! it cannot open the Rocket pair its release-node or shard-map request would need, and
//! the lock table and the shard map stay as they were; a connection with the secret
//! cannot open a Rocket pair under another node id; a client with the secret works.
//!
//! The service runs in this process (node 1) with the secret installed for the process;
//! the unauthenticated clients are child processes (this test binary run again as
//! `child_process`) with no secret or a wrong one.

use rrpc::NodeId;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use lockd::lock_table::{LockMode, LockTable as SlotTable};
use lockd::owners::Owner;
use lockd::shard::{LockKey, Ownership, ShardMap, N_SHARDS};
use lockd::table_service::{TableClient, TableClientConfig, TableService, TABLE_EXPORT};
use lockd::table_wire::{
    OpKind, OpOutcome, TableOp, TABLE_INSTALL_HANDLER, TABLE_RELEASE_NODE_HANDLER,
};
use rrpc::auth::{ClusterSecret, Identity, SECRET_FILE_ENV};
use rrpc::bootstrap::{BootstrapClient, BootstrapError, ClientAuth};
use rrpc::ctrl::{CtrlRequest, RocketOffer};
use rrpc::fabric::shm::ClusterGuard;
use rrpc::fabric::{Fabric, FabricConfig, FabricKind};
use rrpc::runtime::{block_on, RuntimeConfig, ThreadCtx};

mod common;
use common::lockd_node;

const SERVICE: u32 = 1;
const CLIENT: u32 = 100;
const INTRUDER: u32 = 201;
const SHARD: u64 = 7;

fn runtime() -> RuntimeConfig {
    RuntimeConfig::default()
        .with_call_timeout(Duration::from_secs(5))
        .with_connect_timeout(Duration::from_secs(5))
}

fn write_secret(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn op(txn: u64, node: u32, kind: OpKind) -> TableOp {
    TableOp {
        key: LockKey::compose(1, SHARD, 1).unwrap(),
        txn,
        node,
        kind,
    }
}

/// The child process body: a no-op unless run by [`intruder`]. Tries to connect to the
/// service as node [`INTRUDER`] with whatever secret its environment gives; if it gets
/// in, releases [`CLIENT`]'s locks and installs a shard map that moves every shard away,
/// printing `IN <released>`; else prints `REFUSED <why>`.
#[test]
fn child_process() {
    let Ok(server) = std::env::var("AUTH_CHILD_SERVER") else {
        return;
    };
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(60));
        std::process::exit(1);
    });
    let server: SocketAddr = server.parse().unwrap();
    let cluster = std::env::var("AUTH_CHILD_CLUSTER").unwrap();
    let kind = FabricKind::from_env().unwrap();
    let fabric = Fabric::open(&FabricConfig::new(kind, &cluster, NodeId(INTRUDER))).unwrap();
    let ctx = ThreadCtx::new(fabric, runtime()).unwrap();
    match ctx.connect_rpc(server) {
        Err(e) => println!("REFUSED {e}"),
        Ok(_) => {
            let c = ctx.clone();
            let released = block_on(&ctx, async move {
                // Every lock of node CLIENT, whatever its incarnation.
                let n = c
                    .call(
                        NodeId(SERVICE),
                        TABLE_RELEASE_NODE_HANDLER,
                        &CLIENT.to_le_bytes(),
                    )
                    .await
                    .map_or(0, |r| u64::from_le_bytes(r[..8].try_into().unwrap()));
                let mut map = Vec::new();
                let all = std::iter::once(0..N_SHARDS).collect::<Vec<_>>();
                let wire = ShardMap::partial(INTRUDER, &all, 99).unwrap().to_wire();
                rrpc::typed::encode_request::<lockd::table_wire::TableInstallRpc>(&wire, &mut map)
                    .unwrap();
                let _ = c.call(NodeId(SERVICE), TABLE_INSTALL_HANDLER, &map).await;
                n
            });
            println!("IN {released}");
        }
    }
}

/// Run [`child_process`] as an intruder on the service at `server`, its secret file
/// `secret` (`None`: no secret); returns its verdict line.
fn intruder(cluster: &str, server: SocketAddr, secret: Option<&Path>) -> String {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "child_process",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("AUTH_CHILD_SERVER", server.to_string())
    .env("AUTH_CHILD_CLUSTER", cluster)
    .env_remove(SECRET_FILE_ENV);
    if let Some(p) = secret {
        cmd.env(SECRET_FILE_ENV, p);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    stdout
        .lines()
        .find_map(|l| {
            ["REFUSED", "IN "]
                .iter()
                .find_map(|tag| l.find(tag).map(|i| l[i..].to_string()))
        })
        .unwrap_or_else(|| panic!("the child printed no verdict: {stdout}"))
}

#[test]
fn only_the_cluster_gets_in() {
    let dir = std::env::temp_dir().join(format!("lockd-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let right = write_secret(
        &dir,
        "cluster.secret",
        "this cluster's secret: 0123456789\n",
    );
    let wrong = write_secret(&dir, "other.secret", "another cluster's secret: 98765\n");
    let secret = ClusterSecret::from_file(&right).unwrap();
    rrpc::auth::install(Some(secret.clone()));

    let cl = ClusterGuard::new(&format!("lockd-auth-{}", std::process::id()))
        .unwrap()
        .0;
    let fabric = cl.open(NodeId(SERVICE)).unwrap();
    let map = ShardMap::uniform(&[SERVICE]).unwrap();
    let svc = Arc::new(TableService::new(
        Arc::new(SlotTable::with_bytes(1 << 16)),
        Ownership::new(SERVICE, map.clone()),
    ));
    let mut exports = BTreeMap::new();
    exports.insert(TABLE_EXPORT.to_string(), svc.export());
    let node = lockd_node(fabric, exports, svc.handlers(), 1);
    let addr = node.addr();

    // A client with the secret gets in and takes a write lock.
    let ctx = ThreadCtx::new(cl.open(NodeId(CLIENT)).unwrap(), runtime()).unwrap();
    ctx.connect_rpc(addr).unwrap();
    let c = ctx.clone();
    let tc = block_on(&ctx, async move {
        let tc = TableClient::connect(&c, &[SERVICE], None, TableClientConfig::default())
            .await
            .unwrap();
        let o = tc
            .execute(&c, &[op(5, CLIENT, OpKind::Lock(LockMode::Write))])
            .await
            .unwrap();
        assert_eq!(o, [OpOutcome::Granted]);
        tc
    });
    let held = svc.table().slots_in_use();
    assert_eq!(held, 1);

    // A bare TCP connection asking for anything before the challenge: refused, closed.
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let body = br#"{"op":"info"}"#;
    s.write_all(&(body.len() as u32).to_be_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    let reply = String::from_utf8_lossy(&reply);
    assert!(
        reply.contains("refused") && !reply.contains("\"ok\""),
        "{reply}"
    );

    // Client processes without the secret, or with another cluster's: refused before
    // they can send a release-node or a shard-map request.
    let v = intruder(cl.name(), addr, None);
    assert!(
        v.starts_with("REFUSED") && v.contains("no authentication"),
        "{v}"
    );
    let v = intruder(cl.name(), addr, Some(&wrong));
    assert!(
        v.starts_with("REFUSED") && v.contains("authentication failed"),
        "{v}"
    );

    // A connection with the secret, proving node CLIENT, cannot open a Rocket pair for
    // node INTRUDER (whose locks it could then take and release as that node's).
    let f = ctx.fabric();
    let ring = f.alloc_mr(runtime().rocket.ring_bytes()).unwrap();
    let words = f.alloc_mr(16).unwrap();
    let auth = ClientAuth {
        secret: Some(secret),
        identity: Identity::new(Some(CLIENT), "runtime"),
    };
    let mut bc = BootstrapClient::connect_with(addr, Duration::from_secs(5), &auth).unwrap();
    let forged = bc.call_typed::<_, serde_json::Value>(&CtrlRequest::ConnectRocket(RocketOffer {
        node: NodeId(INTRUDER),
        incarnation: 0,
        straw: 1,
        geometry: runtime().rocket,
        batching: Default::default(),
        mode_threshold: 512,
        resp_ring: ring.desc(),
        req_credit: words.desc().at(0),
        server_thread: None,
    }));
    assert!(
        matches!(&forged, Err(BootstrapError::Remote(m)) if m.contains("authenticated as node 100")),
        "{forged:?}"
    );

    // Nothing changed: the lock is held, the map is the one installed.
    assert_eq!(svc.table().slots_in_use(), held);
    assert_eq!(svc.map(), map);

    // The client with the secret can release its node's locks.
    let c = ctx.clone();
    let released = block_on(&ctx, async move {
        tc.release_node(
            &c,
            Owner {
                node: CLIENT,
                incarnation: c.fabric().incarnation(),
            },
        )
        .await
        .unwrap()
    });
    assert_eq!(released, 1);
    assert_eq!(svc.table().slots_in_use(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The check above can fail: without a secret on the service, the same intruder gets in,
/// releases the client's lock and moves every shard.
#[test]
fn without_a_secret_the_intruder_gets_in() {
    // This test's process has no secret (each test binary is its own process, but the
    // tests of one binary share it: this one runs in a child of its own).
    if std::env::var("AUTH_OPEN_CHILD").is_err() {
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "without_a_secret_the_intruder_gets_in",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("AUTH_OPEN_CHILD", "1")
            .env_remove(SECRET_FILE_ENV)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    rrpc::auth::install(None);
    let cl = ClusterGuard::new(&format!("lockd-open-{}", std::process::id()))
        .unwrap()
        .0;
    let fabric = cl.open(NodeId(SERVICE)).unwrap();
    let map = ShardMap::uniform(&[SERVICE]).unwrap();
    let svc = Arc::new(TableService::new(
        Arc::new(SlotTable::with_bytes(1 << 16)),
        Ownership::new(SERVICE, map.clone()),
    ));
    let mut exports = BTreeMap::new();
    exports.insert(TABLE_EXPORT.to_string(), svc.export());
    let node = lockd_node(fabric, exports, svc.handlers(), 1);
    let ctx = ThreadCtx::new(cl.open(NodeId(CLIENT)).unwrap(), runtime()).unwrap();
    ctx.connect_rpc(node.addr()).unwrap();
    let c = ctx.clone();
    block_on(&ctx, async move {
        let tc = TableClient::connect(&c, &[SERVICE], None, TableClientConfig::default())
            .await
            .unwrap();
        let o = tc
            .execute(&c, &[op(5, CLIENT, OpKind::Lock(LockMode::Write))])
            .await
            .unwrap();
        assert_eq!(o, [OpOutcome::Granted]);
    });
    assert_eq!(svc.table().slots_in_use(), 1);
    let v = intruder(cl.name(), node.addr(), None);
    assert_eq!(v, "IN 1", "the intruder released the client's lock");
    assert_eq!(svc.table().slots_in_use(), 0);
    assert_ne!(svc.map(), map, "the intruder installed its map");
}
