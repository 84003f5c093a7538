//! shm-only behaviour of the fabric: node ids held by live processes, stale cluster
//! directories left by crashed runs, file modes, rkeys, and what memory, files and
//! mappings clients cost a server while they are connected and after they left.
//!
//! Some tests run clients as child processes: the test binary re-executes itself
//! (`RRPC_TEST_CLIENT=1`, see [`client_process`]).

use rrpc::fabric::{Fabric, FabricConfig, FabricKind};
use rrpc::NodeId;

#[test]
fn node_id_in_use_and_stale_cluster_dir() {
    let cluster = format!("test-{}-stale", std::process::id());
    let cfg = |node| FabricConfig::new(FabricKind::Shm, &cluster, node);
    let a = Fabric::open(&cfg(NodeId(5))).unwrap();
    let _mr = a.alloc_mr(4096).unwrap();
    assert!(matches!(
        Fabric::open(&cfg(NodeId(5))),
        Err(rrpc::fabric::FabricError::NodeInUse {
            node: NodeId(5),
            ..
        })
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
    let b = Fabric::open(&cfg(NodeId(6))).unwrap();
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

mod common;

use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use rrpc::runtime::{block_on, CallOpts, ReplyMode, RuntimeConfig, ThreadCtx};

/// Handler id of [`gen_handlers`]' generator: the request is a little-endian u32 length,
/// the reply that many bytes of a pattern.
const GEN: u16 = 3;

/// ECHO, FAIL and GEN.
fn gen_handlers() -> rrpc::server::Handlers {
    let mut h = common::echo_handlers();
    h.register(GEN, |req, out| {
        let n = u32::from_le_bytes(req.try_into().map_err(|_| "want 4 bytes")?) as usize;
        out.extend((0..n).map(|i| (i % 253) as u8));
        Ok(())
    });
    h
}

/// The cluster's shm directories (control and MR directory; one when they coincide).
fn shm_dirs(cluster: &str) -> Vec<PathBuf> {
    let mut v = vec![rrpc::fabric::shm::cluster_dir(cluster)];
    let (mrs, _) = rrpc::fabric::shm::mr_dir(cluster);
    if !v.contains(&mrs) {
        v.push(mrs);
    }
    v
}

/// What a cluster's shm directories hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Usage {
    files: usize,
    /// Sum of file lengths, bytes (what was asked for).
    apparent_bytes: u64,
    /// Sum of allocated blocks, bytes (what is committed in the shm filesystem).
    committed_bytes: u64,
    /// Of them, the NIC state files' (`n<node>.nic`, under a timing model): fixed-size
    /// files whose calendar pages are committed as the clock goes round them, up to
    /// `rrpc::fabric::model::NIC_BYTES` each, whoever connects.
    nic_committed_bytes: u64,
}

/// Usage of the MR files (`n<node>-mr<rkey>`) of `node`, or of every file when `None`.
fn usage(cluster: &str, node: Option<u32>) -> Usage {
    use std::os::unix::fs::MetadataExt;
    let prefix = node.map(|n| format!("n{n}-mr"));
    let mut u = Usage::default();
    for d in shm_dirs(cluster) {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if prefix
                .as_ref()
                .is_some_and(|p| !name.starts_with(p.as_str()))
            {
                continue;
            }
            // A file may vanish between listing and stat (a peer deregistering).
            let Ok(m) = e.metadata() else { continue };
            u.files += 1;
            u.apparent_bytes += m.len();
            u.committed_bytes += m.blocks() * 512;
            if name.ends_with(".nic") {
                u.nic_committed_bytes += m.blocks() * 512;
            }
        }
    }
    u
}

/// Files of nodes other than the server (node 1): clients' MR and liveness files.
fn client_files(cluster: &str) -> usize {
    shm_dirs(cluster)
        .iter()
        .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let node = name.strip_prefix('n').and_then(|r| {
                r.split(['-', '.'])
                    .next()
                    .and_then(|n| n.parse::<u32>().ok())
            });
            node.is_some_and(|n| n != 1)
        })
        .count()
}

/// The names of the cluster's shm files, sorted (for failure messages).
fn listing(cluster: &str) -> Vec<String> {
    let mut v: Vec<String> = shm_dirs(cluster)
        .iter()
        .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Lines of this process's /proc/self/maps that map a file of the cluster (deleted or not).
fn mappings(cluster: &str) -> usize {
    let dirs: Vec<String> = shm_dirs(cluster)
        .iter()
        .map(|d| format!("{}/", d.display()))
        .collect();
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| dirs.iter().any(|d| l.contains(d.as_str())))
        .count()
}

/// A field of /proc/self/status in KiB (VmRSS, RssShmem, ...).
fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// One client's visit: connect (one-sided and RPC), an inline call, a READ-mode reply
/// (the client READs the server's buffer) and a zero-copy reply (the server WRITEs into
/// the client's buffer), then leave (the context and fabric drop).
fn visit(cluster: &str, node: u32, server: std::net::SocketAddr) {
    let ctx = ThreadCtx::new(common::fabric(cluster, node), RuntimeConfig::default()).unwrap();
    let info = ctx.connect_rpc(server).unwrap();
    let c = ctx.clone();
    block_on(&ctx, async move {
        let srv = info.node;
        assert_eq!(c.call(srv, common::ECHO, b"hi").await.unwrap(), b"hi");
        let want: Vec<u8> = (0..4096).map(|i| (i % 253) as u8).collect();
        let read = c
            .call_with(
                srv,
                GEN,
                &4096u32.to_le_bytes(),
                CallOpts::mode(ReplyMode::Read),
            )
            .await
            .unwrap();
        assert_eq!(read, want);
        let zc = CallOpts {
            mode: ReplyMode::ZeroCopy,
            reply_len: Some(4096),
            ..CallOpts::default()
        };
        let zc = c
            .call_with(srv, GEN, &4096u32.to_le_bytes(), zc)
            .await
            .unwrap();
        assert_eq!(zc, want);
    });
    drop(Rc::try_unwrap(ctx).ok().expect("the only handle"));
}

/// What a default server thread and a default client thread commit in the shm
/// filesystem: the arenas are registered in full but committed only where touched.
#[test]
fn default_threads_commit_what_they_touch() {
    let c = common::setup("shm", "commit");
    let rss0 = (status_kib("VmRSS"), status_kib("RssShmem"));
    let srv = common::server_with(c.name(), gen_handlers(), 1);
    let server_alone = usage(c.name(), Some(1));
    let rss1 = (status_kib("VmRSS"), status_kib("RssShmem"));

    let ctx = ThreadCtx::new(common::fabric(c.name(), 100), RuntimeConfig::default()).unwrap();
    let info = ctx.connect_rpc(srv.addr()).unwrap();
    let cc = ctx.clone();
    block_on(&ctx, async move {
        assert_eq!(cc.call(info.node, common::ECHO, b"x").await.unwrap(), b"x");
    });
    let client = usage(c.name(), Some(100));
    let server = usage(c.name(), Some(1));
    let rss2 = (status_kib("VmRSS"), status_kib("RssShmem"));
    eprintln!(
        "server node, 1 default thread, no client: {server_alone:?}; RSS +{} KiB (shmem +{} KiB)",
        rss1.0.saturating_sub(rss0.0),
        rss1.1.saturating_sub(rss0.1)
    );
    eprintln!(
        "server node with one client's Rocket: {server:?}; default client thread after one call: \
         {client:?}; RSS +{} KiB (shmem +{} KiB) for both",
        rss2.0.saturating_sub(rss1.0),
        rss2.1.saturating_sub(rss1.1)
    );
    // The arenas (64 MiB server, 32 MiB client) are registered but barely touched.
    assert!(server_alone.apparent_bytes >= 64 << 20, "{server_alone:?}");
    assert!(client.apparent_bytes >= 32 << 20, "{client:?}");
    assert!(server.committed_bytes < 4 << 20, "{server:?}");
    assert!(client.committed_bytes < 4 << 20, "{client:?}");
    drop(ctx);
    drop(srv);
}

/// A server node and 100 clients that connect, call (inline, READ-mode and zero-copy
/// replies) and leave, four at a time: afterwards the cluster's shm files, their committed
/// bytes and the process's mappings of them are back where they were, so a long-running
/// server does not accumulate its departed clients' memory.
#[test]
fn client_churn_leaves_no_files_or_mappings() {
    let c = common::setup("shm", "churn");
    let srv = common::server_with(c.name(), gen_handlers(), 2);
    let addr = srv.addr();
    let batch = |first: u32| {
        std::thread::scope(|s| {
            for i in 0..4 {
                let name = c.name();
                s.spawn(move || visit(name, first + i, addr));
            }
        });
    };
    let (base, base_maps) = (usage(c.name(), None), mappings(c.name()));
    eprintln!("baseline: {base:?}, {base_maps} mappings");
    let mut peak = (base, base_maps);
    for b in 0..25 {
        batch(100 + 4 * b);
        let (u, m) = (usage(c.name(), None), mappings(c.name()));
        peak = (
            if u.committed_bytes > peak.0.committed_bytes {
                u
            } else {
                peak.0
            },
            peak.1.max(m),
        );
    }
    eprintln!("peak between batches: {:?}, {} mappings", peak.0, peak.1);
    let back = common::eventually(Duration::from_secs(20), || {
        let u = usage(c.name(), None);
        client_files(c.name()) == 0
            && u.files == base.files
            && u.apparent_bytes == base.apparent_bytes
            && mappings(c.name()) == base_maps
    });
    let (u, m) = (usage(c.name(), None), mappings(c.name()));
    eprintln!("after 100 clients: {u:?}, {m} mappings");
    assert!(
        back,
        "files or mappings of departed clients remain: {u:?} and {m} mappings vs {base:?} and \
         {base_maps}; files: {:?}",
        listing(c.name())
    );
    // What stays committed is the server's reply buffers: its arena is registered once and
    // its chunks are reused, so at most a few concurrent replies' worth of pages. (The NIC
    // state's calendar pages, committed as time passes, are not the clients'.)
    assert!(
        u.committed_bytes - u.nic_committed_bytes
            <= base.committed_bytes - base.nic_committed_bytes + (1 << 20),
        "{u:?} vs {base:?}"
    );
    drop(srv);
}

/// The client process body; a no-op unless run as a client. Connects to the server at
/// `RRPC_TEST_SERVER` as node `RRPC_TEST_NODE`, makes a zero-copy call (the server maps its
/// buffer), prints READY and waits to be killed.
#[test]
fn client_process() {
    if std::env::var_os("RRPC_TEST_CLIENT").is_none() {
        return;
    }
    let var = |k| std::env::var(k).unwrap();
    let node: u32 = var("RRPC_TEST_NODE").parse().unwrap();
    let server: std::net::SocketAddr = var("RRPC_TEST_SERVER").parse().unwrap();
    let ctx = ThreadCtx::new(
        common::fabric(&var("RRPC_TEST_CLUSTER"), node),
        RuntimeConfig::default(),
    )
    .unwrap();
    let info = ctx.connect_rpc(server).unwrap();
    let c = ctx.clone();
    block_on(&ctx, async move {
        let zc = CallOpts {
            mode: ReplyMode::ZeroCopy,
            reply_len: Some(4096),
            ..CallOpts::default()
        };
        let r = c
            .call_with(info.node, GEN, &4096u32.to_le_bytes(), zc)
            .await;
        assert_eq!(r.unwrap().len(), 4096);
    });
    use std::io::Write as _;
    println!("READY");
    std::io::stdout().flush().unwrap();
    // Until killed, or until the parent goes away (end of input); never longer than a
    // minute, so a parent that missed READY does not wait forever.
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(60));
        std::process::exit(1);
    });
    let _ = std::io::stdin().read_line(&mut String::new());
    std::process::exit(0);
}

/// Clients killed with SIGKILL while connected: the server drops its QPs, Rockets and
/// mappings of their memory (their RPC QPs fail their liveness probe and their Rockets
/// are dropped; the node's reaper drops the passive ends of their one-sided QPs within
/// `REAP_PERIOD`), so its files and mappings return to what they were before, with no
/// other client coming; and a client that comes and goes after them leaves nothing.
#[test]
fn server_drops_what_it_held_for_killed_clients() {
    use std::io::BufRead as _;
    let c = common::setup("shm", "killed");
    let srv = common::server_with(c.name(), gen_handlers(), 1);
    let (base, base_maps) = (usage(c.name(), Some(1)), mappings(c.name()));
    let mut children: Vec<std::process::Child> = (0..3)
        .map(|i| {
            let mut child = std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "client_process",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("RRPC_TEST_CLIENT", "1")
                .env("RRPC_TEST_CLUSTER", c.name())
                .env("RRPC_TEST_NODE", (300 + i).to_string())
                .env("RRPC_TEST_SERVER", srv.addr().to_string())
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let out = std::io::BufReader::new(child.stdout.take().unwrap());
            // The harness may print "test client_process ... " on the same line.
            let ready = out
                .lines()
                .map_while(Result::ok)
                .any(|l| l.ends_with("READY"));
            assert!(ready, "client {i} did not get ready");
            child
        })
        .collect();
    let held = (usage(c.name(), Some(1)), mappings(c.name()));
    assert!(held.0.files > base.files && held.1 > base_maps, "{held:?}");
    for ch in &mut children {
        ch.kill().unwrap();
        let _ = ch.wait();
    }
    let is_back =
        || usage(c.name(), Some(1)).files == base.files && mappings(c.name()) == base_maps;
    let reaped = common::eventually(Duration::from_secs(20), is_back);
    assert!(
        reaped,
        "with no client coming, the server still holds files or mappings for killed clients: {:?}",
        listing(c.name())
    );
    // A client that comes and goes after them.
    visit(c.name(), 400, srv.addr());
    let back = common::eventually(Duration::from_secs(20), is_back);
    let (u, m) = (usage(c.name(), Some(1)), mappings(c.name()));
    eprintln!("server before clients {base:?}, {base_maps} mappings; with 3 clients {held:?}; after they were killed {u:?}, {m} mappings");
    assert!(
        back,
        "the server still holds files or mappings for killed clients: {:?}",
        listing(c.name())
    );
    drop(srv);
}

/// rkeys are unique across the nodes of a cluster and across incarnations of a node id.
#[test]
fn rkeys_unique_across_nodes_and_incarnations() {
    let c = common::setup("shm", "rkeys");
    let mut seen = std::collections::HashSet::new();
    for round in 0..3 {
        for node in [5, 6] {
            let f = common::fabric(c.name(), node);
            let mrs: Vec<_> = (0..4).map(|_| f.alloc_mr(64).unwrap()).collect();
            for m in &mrs {
                assert_ne!(m.rkey(), 0);
                assert!(
                    seen.insert(m.rkey()),
                    "rkey {} reused (round {round}, node {node})",
                    m.rkey()
                );
            }
        }
    }
}

/// A QP that used a peer's MR unmaps it once the MR is deregistered: at the first access
/// that fails, or at its next liveness probe if it does not access it again.
#[test]
fn deregistered_mr_is_unmapped_by_its_users() {
    use rrpc::fabric::{QpState, SendWr, WcStatus, WrOpcode};
    let c = common::setup("shm", "unmap");
    let owner = common::fabric(c.name(), 7);
    let user = common::fabric(c.name(), 8);
    let (ocq, ucq) = (owner.create_cq(16).unwrap(), user.create_cq(16).unwrap());
    let mut oqps = Vec::new();
    let mut uqps = Vec::new();
    for _ in 0..2 {
        let mut o = owner.create_qp(&ocq, 16).unwrap();
        let mut u = user.create_qp(&ucq, 16).unwrap();
        let (eo, eu) = (o.endpoint(), u.endpoint());
        o.connect(&eu).unwrap();
        u.connect(&eo).unwrap();
        oqps.push(o);
        uqps.push(u);
    }
    let target = owner.alloc_mr(1 << 20).unwrap();
    let local = user.alloc_mr(4096).unwrap();
    let name = format!("n7-mr{}", target.rkey());
    let remote = target.desc().at(0);
    let maps_of = |name: &str| {
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .filter(|l| l.contains(&format!("/{name}")))
            .count()
    };
    let read = |id| SendWr {
        wr_id: id,
        opcode: WrOpcode::Read,
        sge: local.sge(0, 64),
        remote,
        signaled: true,
        inline: false,
    };
    let mut wcs = Vec::new();
    for (i, q) in uqps.iter_mut().enumerate() {
        q.post_send(&[read(i as u64)]).unwrap();
    }
    ucq.poll(&mut wcs, 16);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    // Owner's mapping plus one shared by the user's two QPs.
    assert_eq!(maps_of(&name), 2);
    drop(target);
    assert_eq!(maps_of(&name), 1, "the owner unmaps at deregistration");
    // QP 0 accesses it again: the access fails and QP 0 lets go; QP 1 still holds it.
    wcs.clear();
    uqps[0].post_send(&[read(10)]).unwrap();
    ucq.poll(&mut wcs, 16);
    assert_eq!(wcs[0].status, WcStatus::RemoteAccess);
    assert_eq!(uqps[0].state(), QpState::Error);
    // QP 1 lets go at its next liveness probe (at most once a millisecond).
    let gone = common::eventually(Duration::from_secs(5), || {
        let _ = uqps[1].state();
        maps_of(&name) == 0
    });
    assert!(gone, "a deregistered MR stays mapped");
    drop((uqps, oqps, local, owner, user));
}

/// Files and directories of the shm fabric that this process did not create as it does
/// (a symlink, a group- or world-writable file, another user's file, a symlinked cluster
/// directory) are refused with an error naming the path, and nothing is written through
/// them.
#[test]
fn planted_shm_files_are_refused() {
    use rrpc::fabric::FabricError;
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let cluster = format!("test-{}-planted", std::process::id());
    let _guard = rrpc::fabric::shm::ClusterGuard::new(&cluster).unwrap().0;
    let cfg = |node| FabricConfig::new(FabricKind::Shm, &cluster, node);
    let dir = rrpc::fabric::shm::cluster_dir(&cluster);
    std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
    let refused = |node: u32, path: &std::path::Path| match Fabric::open(&cfg(NodeId(node))) {
        Err(FabricError::UnsafeFile { path: p, why }) => {
            assert_eq!(p, path.display().to_string(), "{why}");
        }
        Err(e) => panic!("node {node}: expected UnsafeFile, got {e}"),
        Ok(_) => panic!("node {node}: a planted file was accepted"),
    };
    // A symlink at the liveness file's path, pointing at a file the test owns.
    let victim = dir.join("victim");
    std::fs::write(&victim, b"keep me").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    let link = dir.join("n5.alive");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    refused(5, &link);
    assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
    // A liveness file writable by others.
    let open = dir.join("n6.alive");
    std::fs::write(&open, b"").unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o666)).unwrap();
    refused(6, &open);
    // Another user's file (only root can make one).
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let theirs = dir.join("n7.alive");
        std::fs::write(&theirs, b"").unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        refused(7, &theirs);
    }
    // The control files are checked too: a symlinked rkey counter.
    std::os::unix::fs::symlink(&victim, dir.join("rkeys")).unwrap();
    refused(8, &dir.join("rkeys"));
    assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
    // A clean node of the same cluster still opens once the planted files are gone.
    for f in ["n5.alive", "n6.alive", "n7.alive", "rkeys"] {
        let _ = std::fs::remove_file(dir.join(f));
    }
    drop(Fabric::open(&cfg(NodeId(5))).unwrap());
    // A symlinked cluster directory.
    let other = format!("test-{}-planted2", std::process::id());
    let _g2 = rrpc::fabric::shm::ClusterGuard::new(&other).unwrap().0;
    let odir = rrpc::fabric::shm::cluster_dir(&other);
    std::os::unix::fs::symlink(&dir, &odir).unwrap();
    match Fabric::open(&FabricConfig::new(FabricKind::Shm, &other, NodeId(1))) {
        Err(FabricError::UnsafeFile { path, .. }) => assert_eq!(path, odir.display().to_string()),
        Err(e) => panic!("expected UnsafeFile, got {e}"),
        Ok(_) => panic!("a symlinked cluster directory was accepted"),
    }
    assert!(matches!(
        rrpc::fabric::shm::prepare_cluster(&other),
        Err(FabricError::UnsafeFile { .. })
    ));
    std::fs::remove_file(&odir).unwrap();
}
