//! The fabric conformance suite, written once for every backend: `RRPC_FABRIC=shm`
//! (default) or `verbs` (run inside the Soft-RoCE VM, see `deploy/vm/`).
//!
//! Two processes: the test binary re-executes itself as the peer (`RRPC_TEST_PEER=1`),
//! which registers an MR, exports it over the bootstrap service and waits on stdin. The
//! parent drives raw verbs-style WRs against it. With `RRPC_TEST_PEER_DEVICE` and
//! `RRPC_TEST_PEER_LISTEN`, the peer uses another RDMA device and listens on that device's
//! address: a second "host" (in the VM, `rxeB` behind a veth pair, see `deploy/vm/`).

use rrpc::NodeId;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rrpc::fabric::shm::ClusterGuard;
use rrpc::fabric::{
    Fabric, FabricConfig, FabricKind, MemoryRegion, MrDesc, QpState, QueuePair, RecvWr, SendWr, Wc,
    WcStatus, WrOpcode,
};

/// The backend under test (`$RRPC_FABRIC`, default shm).
fn kind() -> FabricKind {
    FabricKind::from_env().expect("RRPC_FABRIC")
}

/// Completions arrive asynchronously on real RDMA: poll until `n` arrived (bounded).
fn wait_wcs(cq: &rrpc::fabric::CompletionQueue, n: usize) -> Vec<Wc> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut v = Vec::new();
    while v.len() < n && Instant::now() < deadline {
        cq.poll(&mut v, 1024);
    }
    v
}
use rrpc::node::{node_info, CtrlRequest, Node, NodeConfig};

const PEER_NODE: u32 = 2;
const MR_BYTES: usize = 64 << 10;

/// The peer process body; a no-op unless run as the peer.
#[test]
fn peer_process() {
    if std::env::var_os("RRPC_TEST_PEER").is_none() {
        return;
    }
    let cluster = std::env::var("RRPC_TEST_CLUSTER").unwrap();
    let mut cfg = FabricConfig::new(kind(), &cluster, NodeId(PEER_NODE));
    cfg.device = std::env::var("RRPC_TEST_PEER_DEVICE").ok();
    let fabric = Fabric::open(&cfg).unwrap();
    let mr = fabric.alloc_mr(MR_BYTES).unwrap();
    for i in 0..MR_BYTES {
        mr.write(i, &[(i % 251) as u8]);
    }
    // A second MR the parent can have deregistered ("dereg" on stdin).
    let mut mr2 = Some(fabric.alloc_mr(4096).unwrap());
    let mut exports = BTreeMap::new();
    exports.insert("mr".to_string(), serde_json::to_value(mr.desc()).unwrap());
    exports.insert(
        "mr2".to_string(),
        serde_json::to_value(mr2.as_ref().unwrap().desc()).unwrap(),
    );
    let node = Node::start(
        fabric,
        NodeConfig::new(
            "test-peer",
            std::env::var("RRPC_TEST_PEER_LISTEN")
                .unwrap_or_else(|_| "127.0.0.1:0".into())
                .parse()
                .unwrap(),
        )
        .with_exports(exports),
    )
    .unwrap();
    println!("ADDR={}", node.addr());
    std::io::stdout().flush().unwrap();
    // Serve until the parent closes stdin or says "exit"; "dereg" deregisters mr2.
    for line in std::io::stdin().lock().lines() {
        match line.as_deref() {
            Ok("dereg") => {
                drop(mr2.take());
                println!("DEREGISTERED");
                std::io::stdout().flush().unwrap();
            }
            _ => break,
        }
    }
    // Exit without unwinding, like a process that simply stops.
    std::process::exit(0);
}

struct Peer {
    child: Child,
    addr: SocketAddr,
    out: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl Peer {
    fn spawn(cluster: &str) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "peer_process", "--nocapture", "--test-threads=1"])
            .env("RRPC_TEST_PEER", "1")
            .env("RRPC_TEST_CLUSTER", cluster)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
        let addr = out
            .by_ref()
            .map_while(Result::ok)
            .find_map(|l| l.split("ADDR=").nth(1).map(|a| a.trim().parse().unwrap()))
            .expect("peer printed its address");
        Self { child, addr, out }
    }
    /// Have the peer deregister its MR "mr2"; returns once it has.
    fn dereg(&mut self) {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(b"dereg\n").unwrap();
        stdin.flush().unwrap();
        assert!(
            self.out
                .by_ref()
                .map_while(Result::ok)
                .any(|l| l.contains("DEREGISTERED")),
            "peer did not deregister"
        );
    }
    /// Kill the peer with SIGKILL, as a crash would.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
    fn exit(&mut self) {
        let _ = self.child.stdin.take().unwrap().write_all(b"exit\n");
        let _ = self.child.wait();
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Setup {
    fabric: Fabric,
    peer: Peer,
    qp: QueuePair,
    cq: rrpc::fabric::CompletionQueue,
    local: MemoryRegion,
    remote: MrDesc,
    /// Held for its drop, last: the directory goes after the peer and the QPs.
    _cluster: ClusterGuard,
}

fn setup(name: &str) -> Setup {
    let (cluster, _) = ClusterGuard::new(&format!("test-{}-{name}", std::process::id())).unwrap();
    let fabric = cluster.open(NodeId(1)).unwrap();
    let peer = Peer::spawn(cluster.name());
    let info = node_info(peer.addr, Duration::from_secs(10)).unwrap();
    assert_eq!(info.node, NodeId(PEER_NODE));
    let remote: MrDesc = info.export("mr").unwrap();
    let cq = fabric.create_cq(64).unwrap();
    let qp = connect_qp_to(&fabric, &cq, peer.addr);
    let local = fabric.alloc_mr(MR_BYTES).unwrap();
    Setup {
        fabric,
        peer,
        qp,
        cq,
        local,
        remote,
        _cluster: cluster,
    }
}

fn wr(
    id: u64,
    opcode: WrOpcode,
    s: &Setup,
    local_off: usize,
    len: usize,
    remote_off: u64,
) -> SendWr {
    SendWr {
        wr_id: id,
        opcode,
        sge: s.local.sge(local_off, len),
        remote: s.remote.at(remote_off),
        signaled: true,
        inline: false,
    }
}

fn poll_all(s: &Setup) -> Vec<Wc> {
    wait_wcs(&s.cq, 1)
}

#[test]
fn read_write_cas_faa_effects() {
    let mut s = setup("ops");
    // READ the peer's pattern.
    s.qp.post_send(&[wr(1, WrOpcode::Read, &s, 0, 4096, 100)])
        .unwrap();
    let wcs = poll_all(&s);
    assert_eq!(
        wcs,
        vec![Wc {
            wr_id: 1,
            status: WcStatus::Success,
            byte_len: 4096,
            recv: false,
        }]
    );
    let mut got = vec![0u8; 4096];
    s.local.read(0, &mut got);
    assert!(got
        .iter()
        .enumerate()
        .all(|(i, &b)| b == ((i + 100) % 251) as u8));

    // WRITE then READ back into another buffer.
    s.local.write(8192, &[0xAB; 300]);
    s.qp.post_send(&[wr(2, WrOpcode::Write, &s, 8192, 300, 1000)])
        .unwrap();
    s.qp.post_send(&[wr(3, WrOpcode::Read, &s, 16384, 300, 1000)])
        .unwrap();
    assert_eq!(wait_wcs(&s.cq, 2).len(), 2);
    let mut back = vec![0u8; 300];
    s.local.read(16384, &mut back);
    assert_eq!(back, vec![0xAB; 300]);

    // CAS: a failing compare leaves the word; a matching one swaps. Old value lands locally.
    let cur = u64::from_le_bytes(got[4000 - 100..4008 - 100].try_into().unwrap());
    let cas = |c, sw| WrOpcode::CmpSwap {
        compare: c,
        swap: sw,
    };
    s.qp.post_send(&[wr(4, cas(cur ^ 1, 7), &s, 0, 8, 4000)])
        .unwrap();
    poll_all(&s);
    assert_eq!(s.local.load_u64(0), cur);
    s.qp.post_send(&[wr(5, cas(cur, 7), &s, 0, 8, 4000)])
        .unwrap();
    poll_all(&s);
    assert_eq!(s.local.load_u64(0), cur);
    // FAA returns the old value (7) and adds.
    s.qp.post_send(&[wr(6, WrOpcode::FetchAdd { add: 5 }, &s, 8, 8, 4000)])
        .unwrap();
    poll_all(&s);
    assert_eq!(s.local.load_u64(8), 7);
    s.qp.post_send(&[wr(7, WrOpcode::Read, &s, 16, 8, 4000)])
        .unwrap();
    poll_all(&s);
    assert_eq!(s.local.load_u64(16), 12);
    s.peer.exit();
}

#[test]
fn misaligned_atomic_and_bad_rkey_are_errors() {
    let mut s = setup("errs");
    // A misaligned atomic is refused at post; nothing is posted and the QP stays usable.
    let err =
        s.qp.post_send(&[wr(1, WrOpcode::FetchAdd { add: 1 }, &s, 0, 8, 4)]);
    assert!(
        matches!(err, Err(rrpc::fabric::FabricError::InvalidArgument { .. })),
        "{err:?}"
    );
    s.qp.post_send(&[wr(2, WrOpcode::Read, &s, 0, 8, 0)])
        .unwrap();
    assert_eq!(poll_all(&s)[0].status, WcStatus::Success);

    // Out-of-range remote address: an error completion, and the QP enters the error
    // state (seen by a query, asynchronous on real RDMA); further WRs are refused or flushed.
    s.qp.post_send(&[wr(3, WrOpcode::Read, &s, 0, 64, MR_BYTES as u64 - 32)])
        .unwrap();
    assert_eq!(poll_all(&s)[0].status, WcStatus::RemoteAccess);
    let deadline = Instant::now() + Duration::from_secs(5);
    while s.qp.state() != QpState::Error && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(s.qp.state(), QpState::Error);
    if s.qp
        .post_send(&[wr(4, WrOpcode::Read, &s, 0, 8, 0)])
        .is_ok()
    {
        assert_eq!(poll_all(&s)[0].status, WcStatus::Flushed);
    }

    // A fresh QP: an unknown rkey.
    let mut w = wr(5, WrOpcode::Read, &s, 0, 64, 0);
    w.remote.rkey ^= 0x5a5a_0000;
    let mut qp = connect_qp(&s);
    qp.post_send(&[w]).unwrap();
    assert_eq!(poll_all(&s)[0].status, WcStatus::RemoteAccess);
    s.peer.exit();
}

static NEXT_QP: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A new QP connected to a new passive QP of the peer.
fn connect_qp(s: &Setup) -> QueuePair {
    connect_qp_to(&s.fabric, &s.cq, s.peer.addr)
}

/// A QP connected to a new passive QP of the peer at `addr`, watching the peer through
/// the control connection it was set up over.
fn connect_qp_to(
    fabric: &Fabric,
    cq: &rrpc::fabric::CompletionQueue,
    addr: SocketAddr,
) -> QueuePair {
    let mut qp = fabric.create_qp(cq, 64).unwrap();
    let mut ctrl = rrpc::bootstrap::BootstrapClient::connect(addr, Duration::from_secs(5)).unwrap();
    let ep: rrpc::fabric::QpEndpoint = ctrl
        .call_typed(&CtrlRequest::ConnectQp {
            endpoint: qp.endpoint(),
            straw: std::process::id() as u64,
            qp_id: NEXT_QP.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            kind: rrpc::straw::QpKind::OneSided,
        })
        .unwrap();
    qp.connect(&ep).unwrap();
    qp.watch_peer(ctrl.into_stream()).unwrap();
    qp
}

#[test]
fn doorbell_list_with_only_last_signaled() {
    let mut s = setup("doorbell");
    let mut list = Vec::new();
    for i in 0..8u64 {
        s.local.write(i as usize * 64, &[i as u8 + 1; 64]);
        let mut w = wr(i, WrOpcode::Write, &s, i as usize * 64, 64, 20_000 + i * 64);
        w.signaled = i == 7;
        list.push(w);
    }
    s.qp.post_send(&list).unwrap();
    let wcs = poll_all(&s);
    assert_eq!(wcs.len(), 1, "only the last WR is signaled");
    assert_eq!(wcs[0].wr_id, 7);
    s.qp.post_send(&[wr(9, WrOpcode::Read, &s, 4096, 512, 20_000)])
        .unwrap();
    poll_all(&s);
    let mut back = vec![0u8; 512];
    s.local.read(4096, &mut back);
    for i in 0..8 {
        assert!(back[i * 64..(i + 1) * 64].iter().all(|&b| b == i as u8 + 1));
    }
    // A list longer than the send queue is refused whole.
    let long = vec![list[0]; 65];
    assert!(s.qp.post_send(&long).is_err());
    s.peer.exit();
}

#[test]
fn peer_that_exits_puts_qp_in_error() {
    let mut s = setup("exit");
    s.qp.post_send(&[wr(1, WrOpcode::Read, &s, 0, 8, 0)])
        .unwrap();
    assert_eq!(poll_all(&s)[0].status, WcStatus::Success);
    s.peer.exit();
    // The next WRs notice the dead peer: on shm within the liveness period, on RDMA when
    // the transport's retries run out (about 0.5 s with timeout 14 x 7 retries). Bounded.
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(30);
    let mut saw = None;
    let mut id = 2;
    while saw.is_none() && Instant::now() < deadline {
        match s.qp.post_send(&[wr(id, WrOpcode::Read, &s, 0, 8, 0)]) {
            Err(e) => saw = Some(format!("post refused: {e}")),
            Ok(()) => {
                let mut wcs = Vec::new();
                let until = Instant::now() + Duration::from_millis(200);
                while wcs.is_empty() && Instant::now() < until {
                    s.cq.poll(&mut wcs, 16);
                }
                if let Some(wc) = wcs.iter().find(|w| w.status != WcStatus::Success) {
                    assert!(
                        matches!(wc.status, WcStatus::RetryExceeded | WcStatus::Flushed),
                        "{wc:?}"
                    );
                    saw = Some(format!("{:?}", wc.status));
                }
            }
        }
        id += 1;
    }
    eprintln!("dead peer noticed after {:?}: {saw:?}", t0.elapsed());
    assert!(saw.is_some(), "dead peer never noticed");
    let deadline = Instant::now() + Duration::from_secs(5);
    while s.qp.state() != QpState::Error && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(s.qp.state(), QpState::Error);
}

#[test]
fn deregistered_mr_is_a_remote_access_error() {
    let mut s = setup("dereg");
    let info = node_info(s.peer.addr, Duration::from_secs(10)).unwrap();
    let mr2: MrDesc = info.export("mr2").unwrap();
    assert_ne!(mr2.rkey, s.remote.rkey, "two MRs, two rkeys");
    assert_ne!(mr2.rkey, s.local.rkey(), "MRs of two processes, two rkeys");
    let read2 = |id| SendWr {
        wr_id: id,
        opcode: WrOpcode::Read,
        sge: s.local.sge(0, 64),
        remote: mr2.at(0),
        signaled: true,
        inline: false,
    };
    s.qp.post_send(&[read2(1)]).unwrap();
    assert_eq!(poll_all(&s)[0].status, WcStatus::Success);
    s.peer.dereg();
    // The same (addr, rkey), used before through this QP: the MR is gone.
    s.qp.post_send(&[read2(2)]).unwrap();
    assert_eq!(poll_all(&s)[0].status, WcStatus::RemoteAccess);
    // A fresh QP, which never mapped it, fails the same way; the other MR still works.
    let mut qp = connect_qp(&s);
    qp.post_send(&[read2(3)]).unwrap();
    assert_eq!(poll_all(&s)[0].status, WcStatus::RemoteAccess);
    let mut qp = connect_qp(&s);
    qp.post_send(&[wr(4, WrOpcode::Read, &s, 0, 64, 0)])
        .unwrap();
    assert_eq!(poll_all(&s)[0].status, WcStatus::Success);
    s.peer.exit();
}

#[test]
fn restarted_peer_is_reached_anew_and_never_through_a_stale_rkey() {
    let mut s = setup("restart");
    s.qp.post_send(&[wr(1, WrOpcode::Read, &s, 0, 64, 0)])
        .unwrap();
    assert_eq!(poll_all(&s)[0].status, WcStatus::Success);
    let old = s.remote;
    s.peer.kill();
    // The old QP notices (bounded): its posts are refused or fail.
    let deadline = Instant::now() + Duration::from_secs(30);
    while s.qp.state() != QpState::Error && Instant::now() < deadline {
        if s.qp
            .post_send(&[wr(2, WrOpcode::Read, &s, 0, 8, 0)])
            .is_ok()
        {
            let mut wcs = Vec::new();
            s.cq.poll(&mut wcs, 16);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(
        s.qp.state(),
        QpState::Error,
        "the dead incarnation's QP is in error"
    );
    // The same node id again, in a new process.
    s.peer = Peer::spawn(s._cluster.name());
    let info = node_info(s.peer.addr, Duration::from_secs(10)).unwrap();
    assert_eq!(info.node, NodeId(PEER_NODE));
    let new: MrDesc = info.export("mr").unwrap();
    let cq = s.fabric.create_cq(64).unwrap();
    let mut qp = connect_qp_to(&s.fabric, &cq, s.peer.addr);
    // The new incarnation through the new QP.
    qp.post_send(&[SendWr {
        wr_id: 3,
        opcode: WrOpcode::Read,
        sge: s.local.sge(0, 256),
        remote: new.at(0),
        signaled: true,
        inline: false,
    }])
    .unwrap();
    assert_eq!(wait_wcs(&cq, 1)[0].status, WcStatus::Success);
    let mut got = vec![0u8; 256];
    s.local.read(0, &mut got);
    assert!(got.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
    if new.rkey != old.rkey {
        // The old incarnation's rkey names nothing now (verbs may reuse an rkey value for
        // a new MR; shm never does, see below).
        let mut qp = connect_qp_to(&s.fabric, &cq, s.peer.addr);
        qp.post_send(&[SendWr {
            wr_id: 4,
            opcode: WrOpcode::Read,
            sge: s.local.sge(0, 64),
            remote: old.at(0),
            signaled: true,
            inline: false,
        }])
        .unwrap();
        assert_eq!(wait_wcs(&cq, 1)[0].status, WcStatus::RemoteAccess);
    }
    if kind() == FabricKind::Shm {
        assert_ne!(
            new.rkey, old.rkey,
            "shm rkeys are unique per MR incarnation"
        );
    }
    s.peer.exit();
}

#[test]
fn send_recv_between_two_qps() {
    let (cluster, _) = ClusterGuard::new(&format!("test-{}-sendrecv", std::process::id())).unwrap();
    let fabric = cluster.open(NodeId(1)).unwrap();
    let cq = fabric.create_cq(64).unwrap();
    let mut a = fabric.create_qp(&cq, 16).unwrap();
    let mut b = fabric.create_qp(&cq, 16).unwrap();
    let (ea, eb) = (a.endpoint(), b.endpoint());
    a.connect(&eb).unwrap();
    b.connect(&ea).unwrap();
    let mr = fabric.alloc_mr(16 << 10).unwrap();
    let send = |id: u64, off: usize, len: usize| SendWr {
        wr_id: id,
        opcode: WrOpcode::Send,
        sge: mr.sge(off, len),
        remote: mr.desc().at(0),
        signaled: true,
        inline: false,
    };
    // Two receives posted, two SENDs (one inline-sized, one larger) land in order.
    b.post_recv(&[
        RecvWr {
            wr_id: 100,
            sge: mr.sge(8192, 512),
        },
        RecvWr {
            wr_id: 101,
            sge: mr.sge(9216, 512),
        },
    ])
    .unwrap();
    mr.write(0, b"hello");
    mr.write(1024, &[7u8; 300]);
    a.post_send(&[send(1, 0, 5), send(2, 1024, 300)]).unwrap();
    let mut wcs = wait_wcs(&cq, 4);
    wcs.sort_by_key(|w| w.wr_id);
    let got: Vec<(u64, WcStatus, u32, bool)> = wcs
        .iter()
        .map(|w| (w.wr_id, w.status, w.byte_len, w.recv))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, WcStatus::Success, 5, false),
            (2, WcStatus::Success, 300, false),
            (100, WcStatus::Success, 5, true),
            (101, WcStatus::Success, 300, true),
        ]
    );
    let mut buf = vec![0u8; 300];
    mr.read(8192, &mut buf[..5]);
    assert_eq!(&buf[..5], b"hello");
    mr.read(9216, &mut buf);
    assert_eq!(buf, vec![7u8; 300]);

    // A message longer than the posted buffer: an error on both sides, nothing lost
    // silently.
    b.post_recv(&[RecvWr {
        wr_id: 102,
        sge: mr.sge(10240, 16),
    }])
    .unwrap();
    a.post_send(&[send(3, 1024, 100)]).unwrap();
    // The receiver's buffer completes with an error (a length error; Soft-RoCE says
    // "local QP operation error"; a NIC that puts the QP in error first flushes it); errors
    // carry no opcode in verbs, so the completions are told apart by wr_id.
    let wcs = wait_wcs(&cq, 2);
    let recv = wcs
        .iter()
        .find(|w| w.wr_id == 102)
        .unwrap_or_else(|| panic!("no completion for the receive: {wcs:?}"));
    assert!(
        matches!(
            recv.status,
            WcStatus::LocalLength | WcStatus::LocalQpOperation | WcStatus::Flushed
        ),
        "{wcs:?}"
    );
    let sent = wcs
        .iter()
        .find(|w| w.wr_id == 3)
        .unwrap_or_else(|| panic!("no completion for the send: {wcs:?}"));
    assert_ne!(sent.status, WcStatus::Success, "{wcs:?}");
    drop((a, b, fabric, cluster));
}
