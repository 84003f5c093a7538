//! The real `memnode` binary: two of them load SmallBank's partitions, and a compute node
//! finds every account through the CVT index of the right node with one-sided READs and
//! reads its initial balance at its load version.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};

use rrpc::fabric::{Fabric, FabricConfig, FabricKind};
use rrpc::runtime::{join_all, Executor, RuntimeConfig, ThreadCtx};
use rrpc::NodeId;
use txn::cvt_remote::{partition_of, CvtRemote, MemnodeExport, EXPORT_KEY};
use txn::smallbank::{initial_balance, LOAD_VERSION};

const ACCOUNTS: u64 = 5000;

fn spawn(cluster: &str, node: u32, partition: u32) -> (Child, SocketAddr) {
    spawn_with(
        cluster,
        node,
        &["--partition", &partition.to_string(), "--partitions", "2"],
    )
}

fn spawn_with(cluster: &str, node: u32, role: &[&str]) -> (Child, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_memnode"))
        .args(["--cluster", cluster, "--node", &node.to_string()])
        .args([
            "--smallbank-accounts",
            &ACCOUNTS.to_string(),
            "--versions",
            "3",
        ])
        .args(role)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let line = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .find(|l| l.starts_with("READY "))
        .expect("memnode prints READY");
    let addr = line["READY ".len()..].parse().unwrap();
    (child, addr)
}

fn stop(mut child: Child) {
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "memnode ignored SIGTERM");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "memnode exit: {status}");
}

#[test]
fn two_memnodes_serve_their_smallbank_partitions_through_the_cvt_index() {
    let cluster = format!("memnode-test-{}", std::process::id());
    rrpc::fabric::shm::prepare_cluster(&cluster).unwrap();
    let (c0, a0) = spawn(&cluster, 1, 0);
    let (c1, a1) = spawn(&cluster, 2, 1);
    let fabric = Fabric::open(&FabricConfig::new(
        FabricKind::from_env().unwrap(),
        &cluster,
        NodeId(50),
    ))
    .unwrap();
    let ctx = ThreadCtx::new(fabric, RuntimeConfig::default()).unwrap();
    let info = ctx.connect(a1).unwrap();
    assert_eq!(info.role, "memnode");
    let e: MemnodeExport = info.export(EXPORT_KEY).unwrap();
    assert_eq!((e.partition, e.partitions, e.tables.len()), (1, 2, 2));
    assert!(e.tables.iter().all(|t| t.len == 8 && t.versions == 3));
    // Given in the other order: the nodes say which partition they are.
    let store = Rc::new(CvtRemote::connect(ctx.clone(), &[a1, a0], 1024).unwrap());
    let checked = Rc::new(std::cell::Cell::new([0u32; 2]));
    let mut ex = Executor::new(ctx.clone());
    {
        let (store, checked) = (store.clone(), checked.clone());
        ex.spawn(async move {
            for table in 0..2u32 {
                let reads = (0..ACCOUNTS).map(|key| {
                    let store = store.clone();
                    async move {
                        let (loc, cvt) = store.lookup(table, key).await.unwrap().expect("loaded");
                        assert_eq!(loc.part, partition_of(table, key, 2));
                        let cell = cvt.cells[cvt.newest().expect("one version")];
                        assert_eq!(cell.version, LOAD_VERSION);
                        let v = store.read_version(loc, &cell).await.unwrap().unwrap();
                        (key, loc.part, i64::from_le_bytes(v.try_into().unwrap()))
                    }
                });
                for (key, part, bal) in join_all(reads).await {
                    assert_eq!(bal, initial_balance(table, key));
                    let mut c = checked.get();
                    c[part as usize] += 1;
                    checked.set(c);
                }
                assert!(store.lookup(table, ACCOUNTS + 7).await.unwrap().is_none());
            }
        });
    }
    ex.run();
    let [p0, p1] = checked.get();
    assert_eq!(p0 + p1, 2 * ACCOUNTS as u32);
    assert!(p0 > 4000 && p1 > 4000, "partitions unbalanced: {p0} / {p1}");
    stop(c0);
    stop(c1);
    if FabricKind::from_env().unwrap() == FabricKind::Shm {
        let left: Vec<_> = std::fs::read_dir(rrpc::fabric::shm::cluster_dir(&cluster))
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("n1") || n.starts_with("n2"))
            .collect();
        assert!(left.is_empty(), "memnodes left files: {left:?}");
    }
    drop(store);
    drop(ctx);
    rrpc::fabric::shm::remove_cluster(&cluster).unwrap();
}

/// `--spare-index`: a spare memory node exports an empty image of every partition and
/// no primary; a compute node counts it among the memory nodes but not the partitions,
/// and no view calls on it until a memory node dies. A spare that claims a partition's
/// index, or an index beyond the memory nodes given, is refused.
#[test]
fn a_spare_memnode_holds_an_empty_image_of_every_partition() {
    let cluster = format!("memnode-spare-{}", std::process::id());
    rrpc::fabric::shm::prepare_cluster(&cluster).unwrap();
    let r2 = ["--partitions", "2", "--replicas", "2"];
    let (c0, a0) = spawn_with(&cluster, 1, &[&r2[..], &["--partition", "0"]].concat());
    let (c1, a1) = spawn_with(&cluster, 2, &[&r2[..], &["--partition", "1"]].concat());
    let (c2, a2) = spawn_with(&cluster, 3, &[&r2[..], &["--spare-index", "2"]].concat());
    let fabric = Fabric::open(&FabricConfig::new(
        FabricKind::from_env().unwrap(),
        &cluster,
        NodeId(50),
    ))
    .unwrap();
    let ctx = ThreadCtx::new(fabric, RuntimeConfig::default()).unwrap();
    let e: MemnodeExport = ctx.connect(a2).unwrap().export(EXPORT_KEY).unwrap();
    assert!(e.spare && e.tables.is_empty(), "{e:?}");
    assert_eq!((e.partition, e.partitions), (2, 2));
    let mut parts: Vec<u32> = e.backups.iter().map(|b| b.partition).collect();
    parts.sort_unstable();
    assert_eq!(parts, vec![0, 1]);
    assert!(e
        .backups
        .iter()
        .all(|b| b.tables.iter().all(|t| t.records_loaded == 0)));
    let store = CvtRemote::connect(ctx.clone(), &[a0, a1, a2], 1024).unwrap();
    assert_eq!((store.partitions(), store.memnode_count()), (2, 3));
    assert!(store.image(2, 0).is_some() && store.image(2, 1).is_some());
    assert!(store.in_use(0) && store.in_use(1) && !store.in_use(2));
    // Partition 0's copies: its primary and memory node 1's backup, not the spare.
    assert_eq!(store.replica_memnodes(0), vec![0, 1]);
    // Two memory nodes given, the spare among them: its index lies beyond them.
    let err = CvtRemote::connect(ctx.clone(), &[a0, a2], 1024)
        .err()
        .expect("a spare beyond the memory nodes given")
        .to_string();
    assert!(err.contains("spare 2 of 2 memory nodes"), "{err}");
    drop(store);
    for c in [c0, c1, c2] {
        stop(c);
    }
    drop(ctx);
    rrpc::fabric::shm::remove_cluster(&cluster).unwrap();
}

#[test]
fn smallbank_and_kvs_exclude_each_other_and_kvs_values_need_16_bytes() {
    for (extra, want) in [
        (
            &["--smallbank-accounts", "10", "--kvs-records", "10"][..],
            "exclude each other (one workload per memnode)",
        ),
        (
            &["--tatp-subscribers", "10", "--tpcc-warehouses", "1"][..],
            "exclude each other (one workload per memnode)",
        ),
        (
            &["--kvs-records", "10", "--kvs-value-bytes", "15"][..],
            "--kvs-value-bytes must be at least 16",
        ),
        (
            &["--partitions", "3", "--replicas", "2", "--spare-index", "1"][..],
            "a spare's index comes after the partitions' memory nodes",
        ),
        (
            &["--partitions", "3", "--spare-index", "3"][..],
            "--spare-index needs --replicas 2 or more",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_memnode"))
            .args(["--cluster", "memnode-flags-test", "--node", "1"])
            .args(extra)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{extra:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{extra:?}: {err}");
    }
}

/// `--rtx-pool`: the memnode hosts a formatted rTX region; a client increments counters
/// in two objects with rTXs over one-sided operations and reads them back.
#[test]
fn memnode_hosts_an_rtx_region() {
    let cluster = format!("memnode-rtx-test-{}", std::process::id());
    rrpc::fabric::shm::prepare_cluster(&cluster).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_memnode"))
        .args(["--cluster", &cluster, "--node", "1"])
        .args([
            "--rtx-pool",
            "2000000",
            "--rtx-ids",
            "8",
            "--rtx-block-bytes",
            "64",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let line = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .find(|l| l.starts_with("READY "))
        .expect("memnode prints READY");
    let addr: SocketAddr = line["READY ".len()..].parse().unwrap();
    let fabric = Fabric::open(&FabricConfig::new(
        FabricKind::from_env().unwrap(),
        &cluster,
        NodeId(60),
    ))
    .unwrap();
    let ctx = ThreadCtx::new(fabric, RuntimeConfig::default()).unwrap();
    let (mem, layout) = rtx::host::connect(&ctx, addr).unwrap();
    assert!(
        layout.total_bytes() <= 2_000_000 && layout.objects > 1000,
        "{layout:?}"
    );
    let out = Rc::new(std::cell::Cell::new([0u64; 2]));
    let mut ex = Executor::new(ctx.clone());
    {
        let out = out.clone();
        ex.spawn(async move {
            let mut c = rtx::Client::new(
                layout,
                0,
                1,
                rtx::lease::SystemClock,
                rtx::Config::default(),
            );
            let objs = [layout.obj_addr(0), layout.obj_addr(layout.objects - 1)];
            for _ in 0..5 {
                let mut tx = c.begin();
                for &o in &objs {
                    let v = tx.read(&mem, o).await.unwrap();
                    let n = u64::from_le_bytes(v[..8].try_into().unwrap()) + 1;
                    let mut w = v.clone();
                    w[..8].copy_from_slice(&n.to_le_bytes());
                    tx.write(&mem, o, w).await.unwrap();
                }
                tx.commit(&mem).await.unwrap();
            }
            let mut tx = c.begin();
            let mut got = [0u64; 2];
            for (g, &o) in got.iter_mut().zip(&objs) {
                let v = tx.read(&mem, o).await.unwrap();
                *g = u64::from_le_bytes(v[..8].try_into().unwrap());
            }
            out.set(got);
        });
    }
    ex.run();
    assert_eq!(out.get(), [5, 5]);
    stop(child);
    drop(ctx);
    rrpc::fabric::shm::remove_cluster(&cluster).unwrap();
}

/// `--config FILE.toml`: its keys are memnode's long flags, its `[fabric]` the node
/// flags (the cluster here: the node's files appear in that cluster's directory), its
/// `[server]` the rrpc server's settings; a bad file exits 2 naming the file and key.
#[test]
fn memnode_reads_a_settings_file() {
    let cluster = format!("memnode-cfg-test-{}", std::process::id());
    rrpc::fabric::shm::prepare_cluster(&cluster).unwrap();
    let cfg = std::env::temp_dir().join(format!("{cluster}-memnode.toml"));
    std::fs::write(
        &cfg,
        format!(
            "smallbank-accounts = 100\npartitions = 2\npartition = 1\n\
             [fabric]\ncluster = \"{cluster}\"\n[server]\nidle-sleep-us = 10\n"
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_memnode"))
        .args(["--node", "1", "--partition", "0", "--config"])
        .arg(&cfg)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let ready = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .any(|l| l.starts_with("READY "));
    assert!(ready, "memnode prints READY");
    // The shm fabric keeps a node's files in its cluster's directory (verbs has none).
    if FabricKind::from_env().unwrap() == FabricKind::Shm {
        let files =
            std::fs::read_dir(rrpc::fabric::shm::cluster_dir(&cluster)).map_or(0, |d| d.count());
        assert!(files > 0, "the file's [fabric] cluster is the node's");
    }
    stop(child);
    rrpc::fabric::shm::remove_cluster(&cluster).unwrap();
    for (text, want) in [
        ("no-such-flag = 1\n", "`no-such-flag`"),
        ("[fabric]\nbogus = 1\n", "[fabric]: unknown field `bogus`"),
        (
            "[runtime]\nbogus-ms = 1\n",
            "[runtime]: unknown field `bogus-ms`",
        ),
    ] {
        std::fs::write(&cfg, text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_memnode"))
            .args(["--cluster", &cluster, "--node", "1", "--config"])
            .arg(&cfg)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text:?}: {err}");
        assert!(
            err.contains("memnode.toml") && err.contains(want),
            "{text:?}: {err}"
        );
    }
}
