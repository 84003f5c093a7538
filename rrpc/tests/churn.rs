//! Client churn on the shm fabric: 100 clients connect, call and leave; afterwards the
//! cluster's shared-memory files and the server's mappings of them are back at their
//! baseline (a departed client's rings are neither kept as files nor kept mapped).

mod common;

use std::time::{Duration, Instant};

use common::{fabric, server, setup, ECHO};
use rrpc::runtime::{block_on, RuntimeConfig, ThreadCtx};

/// (files, bytes) in the cluster's MR and control directories.
fn shm_usage(cluster: &str) -> (usize, u64) {
    let dirs = [
        rrpc::fabric::shm::cluster_dir(cluster),
        rrpc::fabric::shm::mr_dir(cluster).0,
    ];
    let mut seen = std::collections::HashSet::new();
    let (mut files, mut bytes) = (0, 0);
    for d in dirs {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if seen.insert(e.path()) {
                files += 1;
                // Allocated blocks, not the length: what the files commit.
                use std::os::unix::fs::MetadataExt;
                bytes += e.metadata().map_or(0, |m| m.blocks() * 512);
            }
        }
    }
    (files, bytes)
}

/// Mappings in this process of the cluster's files (deleted ones included).
fn mappings(cluster: &str) -> usize {
    let needle = format!("rrpc-{cluster}/");
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.contains(&needle))
        .count()
}

#[test]
fn a_hundred_clients_come_and_go_and_leave_nothing_behind() {
    if rrpc::fabric::FabricKind::from_env().unwrap() != rrpc::fabric::FabricKind::Shm {
        return;
    }
    let c = setup("churn", "clients");
    let srv = server(c.name(), 1);
    let client = |id: u32| {
        let ctx = ThreadCtx::new(fabric(c.name(), id), RuntimeConfig::default()).unwrap();
        let info = ctx.connect_rpc(srv.addr()).unwrap();
        let reply = block_on(&ctx, {
            let ctx = ctx.clone();
            async move { ctx.call(info.node, ECHO, b"hello").await }
        })
        .unwrap();
        assert_eq!(reply, b"hello");
        if id == 100 {
            // What one default client thread and its server connection commit (printed).
            let (files, bytes) = shm_usage(c.name());
            eprintln!(
                "with one default client connected: {files} files, {} KiB committed, {} \
                 process RSS",
                bytes / 1024,
                std::fs::read_to_string("/proc/self/status")
                    .unwrap()
                    .lines()
                    .find(|l| l.starts_with("VmRSS"))
                    .unwrap_or("VmRSS: ?")
                    .trim_start_matches("VmRSS:")
                    .trim()
            );
        }
    };
    let (files, bytes) = shm_usage(c.name());
    eprintln!(
        "server alone (1 thread): {files} files, {} KiB committed",
        bytes / 1024
    );
    // One client first, so that the server's lazily made state is in the baseline.
    client(100);
    let settle = |want: (usize, usize)| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let now = (shm_usage(c.name()).0, mappings(c.name()));
            if now.0 <= want.0 && now.1 <= want.1 || Instant::now() > deadline {
                return now;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let base_files = shm_usage(c.name());
    let base_maps = mappings(c.name());
    let base = settle((base_files.0, base_maps));
    let base_bytes = shm_usage(c.name()).1;
    eprintln!(
        "baseline: {} files, {} KiB committed, {} mappings",
        base.0,
        base_bytes / 1024,
        base.1
    );
    // Each client is a new node id, so no state carries over between them.
    for id in 0..100u32 {
        client(200 + id);
    }
    let after = settle(base);
    let after_bytes = shm_usage(c.name()).1;
    eprintln!(
        "after 100 clients: {} files, {} KiB committed, {} mappings",
        after.0,
        after_bytes / 1024,
        after.1
    );
    if after.0 > base.0 {
        let d = rrpc::fabric::shm::cluster_dir(c.name());
        let mut names: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        eprintln!("files: {names:?}");
    }
    assert!(
        after.0 <= base.0,
        "shm files: {} at baseline, {} after churn",
        base.0,
        after.0
    );
    assert!(
        after.1 <= base.1,
        "mappings of the cluster's files: {} at baseline, {} after churn",
        base.1,
        after.1
    );
    assert!(
        after_bytes <= base_bytes + (1 << 20),
        "committed shm bytes: {base_bytes} at baseline, {after_bytes} after churn"
    );
    drop(srv);
}
