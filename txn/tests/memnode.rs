//! The real `memnode` binary: loads SmallBank, and a compute node finds every account
//! through the hash index with one-sided READs and reads its initial balance.

use rrpc::NodeId;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};

use rrpc::fabric::{Fabric, FabricConfig, FabricKind, RemoteAddr};
use rrpc::runtime::{join_all, Executor, RuntimeConfig, ThreadCtx};
use txn::smallbank::{initial_balance, CHECKING, SAVINGS};
use txn::store::{decode_record, search_bucket, BucketLookup, TableExport, BUCKET_BYTES};

#[test]
fn memnode_serves_smallbank_through_its_index() {
    let cluster = format!("memnode-test-{}", std::process::id());
    rrpc::fabric::shm::prepare_cluster(&cluster).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_memnode"))
        .args([
            "--cluster",
            &cluster,
            "--node",
            "1",
            "--smallbank-accounts",
            "5000",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let line = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .find(|l| l.starts_with("READY "))
        .expect("memnode prints READY");
    let addr = line["READY ".len()..].parse().unwrap();

    let fabric = Fabric::open(&FabricConfig::new(
        FabricKind::from_env().unwrap(),
        &cluster,
        NodeId(50),
    ))
    .unwrap();
    let ctx = ThreadCtx::new(fabric, RuntimeConfig::default()).unwrap();
    let info = ctx.connect(addr).unwrap();
    assert_eq!(info.role, "memnode");
    let tables: Vec<TableExport> = info.export("tables").unwrap();
    assert_eq!(tables.len(), 2);
    assert!(tables
        .iter()
        .all(|t| t.n_records == 5000 && t.value_bytes == 8));
    let checked = Rc::new(std::cell::Cell::new(0u32));
    let mut ex = Executor::new(ctx.clone());
    {
        let (ctx, checked) = (ctx.clone(), checked.clone());
        ex.spawn(async move {
            for t in &tables {
                let lookups = (0..5000u64).map(|key| {
                    let ctx = ctx.clone();
                    async move {
                        let mut b = t.home_bucket(key);
                        loop {
                            let img = ctx
                                .read(info.node, t.bucket_addr(b), BUCKET_BYTES)
                                .await
                                .unwrap();
                            match search_bucket(&img, key) {
                                BucketLookup::Found(a) => {
                                    let r = RemoteAddr {
                                        addr: a,
                                        rkey: t.records.rkey,
                                    };
                                    let rec = ctx
                                        .read(info.node, r, t.record_bytes as usize)
                                        .await
                                        .unwrap();
                                    return decode_record(&rec, key, 8).unwrap();
                                }
                                BucketLookup::Next => b += 1,
                                BucketLookup::Absent => panic!("key {key} missing"),
                            }
                        }
                    }
                });
                for r in join_all(lookups).await {
                    assert_eq!(r.version, 1);
                    let want = initial_balance(if t.id == 0 { SAVINGS } else { CHECKING }, r.key);
                    assert_eq!(i64::from_le_bytes(r.value.try_into().unwrap()), want);
                    checked.set(checked.get() + 1);
                }
            }
        });
    }
    ex.run();
    assert_eq!(checked.get(), 10_000);
    // SIGTERM: clean exit removes its files.
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
    if FabricKind::from_env().unwrap() == FabricKind::Shm {
        let left: Vec<_> = std::fs::read_dir(rrpc::fabric::shm::cluster_dir(&cluster))
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("n1"))
            .collect();
        assert!(left.is_empty(), "memnode left files: {left:?}");
    }
    drop(ctx);
    rrpc::fabric::shm::remove_cluster(&cluster).unwrap();
}
