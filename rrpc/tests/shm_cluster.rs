//! shm-only behaviour of the fabric: node ids held by live processes, stale cluster
//! directories left by crashed runs, file modes.

use rrpc::fabric::{Fabric, FabricConfig, FabricKind};

#[test]
fn node_id_in_use_and_stale_cluster_dir() {
    let cluster = format!("test-{}-stale", std::process::id());
    let cfg = |node| FabricConfig::new(FabricKind::Shm, &cluster, node);
    let a = Fabric::open(&cfg(5)).unwrap();
    let _mr = a.alloc_mr(4096).unwrap();
    assert!(matches!(
        Fabric::open(&cfg(5)),
        Err(rrpc::fabric::FabricError::NodeInUse { node: 5, .. })
    ));
    // A live node makes the directory "in use".
    assert!(rrpc::fabric::shm::prepare_cluster(&cluster).is_err());
    // Leak the handles as a crashed process would (files stay, lock is released on close):
    let dir = rrpc::fabric::shm::cluster_dir(&cluster);
    std::fs::write(dir.join("n9.alive"), b"12345\n").unwrap();
    std::fs::write(dir.join("n9-mr1"), b"junk").unwrap();
    drop(_mr);
    drop(a);
    let st = rrpc::fabric::shm::prepare_cluster(&cluster).unwrap();
    assert!(matches!(st, rrpc::fabric::shm::ClusterDirState::RemovedStale { files } if files >= 2));
    assert!(!dir.exists());
    // Files are created with mode 0600.
    let b = Fabric::open(&cfg(6)).unwrap();
    let mr = b.alloc_mr(100).unwrap();
    use std::os::unix::fs::PermissionsExt;
    // (a small MR stays in the control directory even when hugepages are reserved)
    let mode = std::fs::metadata(dir.join(format!("n6-mr{}", mr.rkey())))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    drop(mr);
    drop(b);
    rrpc::fabric::shm::remove_cluster(&cluster).unwrap();
}
