//! The shm fabric under a timing model: what late completions must not break. RC order
//! on a QP, every signaled WR completing exactly once, flushes after an error, atomics
//! from several fabrics (separate mappings of one NIC state) staying atomic and queuing
//! at the target's NIC, and clear errors for models that cannot run. No test here asserts
//! a maximum duration (one asserts the minimum its modeled reservations imply).

use rrpc::NodeId;
use std::time::{Duration, Instant};

use rrpc::fabric::model;
use rrpc::fabric::shm::ClusterGuard;
use rrpc::fabric::{
    CompletionQueue, Fabric, FabricConfig, FabricError, FabricKind, MemoryRegion, QueuePair,
    SendWr, Wc, WcStatus, WrOpcode,
};

fn open(cluster: &str, node: u32, model: &str) -> Fabric {
    let mut cfg = FabricConfig::new(FabricKind::Shm, cluster, NodeId(node));
    cfg.model = Some(model.into());
    Fabric::open(&cfg).unwrap()
}

/// A connected pair of QPs between fabrics `a` and `b`; `a`'s QP and CQ are returned.
fn connect(a: &Fabric, b: &Fabric) -> (QueuePair, CompletionQueue, QueuePair, CompletionQueue) {
    let (cqa, cqb) = (a.create_cq(1024).unwrap(), b.create_cq(1024).unwrap());
    let mut qa = a.create_qp(&cqa, 1024).unwrap();
    let mut qb = b.create_qp(&cqb, 1024).unwrap();
    let (ea, eb) = (qa.endpoint(), qb.endpoint());
    qa.connect(&eb).unwrap();
    qb.connect(&ea).unwrap();
    (qa, cqa, qb, cqb)
}

/// Node `node` of `cluster` under the cx5 model with a QP connected to node 1, the
/// target's owner (a fabric of node 1 cannot be opened twice, so the QP connects to an
/// endpoint naming node 1: shm QPs need only the node id).
fn requester_of_node_1(cluster: &str, node: u32) -> (Fabric, CompletionQueue, QueuePair) {
    let f = open(cluster, node, "cx5");
    let cq = f.create_cq(1024).unwrap();
    let mut qp = f.create_qp(&cq, 1024).unwrap();
    let mut ep = qp.endpoint();
    ep.node = NodeId(1);
    ep.recv_queue = None;
    qp.connect(&ep).unwrap();
    (f, cq, qp)
}

fn wait_wcs(cq: &CompletionQueue, n: usize) -> Vec<Wc> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut v = Vec::new();
    while v.len() < n && Instant::now() < deadline {
        cq.poll(&mut v, 1024);
    }
    v
}

#[allow(clippy::too_many_arguments)]
fn wr(
    id: u64,
    op: WrOpcode,
    local: &MemoryRegion,
    off: usize,
    len: usize,
    remote: &MemoryRegion,
    roff: u64,
    signaled: bool,
) -> SendWr {
    SendWr {
        wr_id: id,
        opcode: op,
        sge: local.sge(off, len),
        remote: remote.desc().at(roff),
        signaled,
        inline: false,
    }
}

#[test]
fn writes_to_one_word_land_in_posting_order_and_each_signaled_wr_completes_once() {
    let g = ClusterGuard::new(&format!("model-{}-order", std::process::id()))
        .unwrap()
        .0;
    for model in ["cx5", "rxe"] {
        let (a, b) = (open(g.name(), 1, model), open(g.name(), 2, model));
        let (local, remote) = (a.alloc_mr(8 * 256).unwrap(), b.alloc_mr(4096).unwrap());
        let (mut qa, cqa, _qb, _cqb) = connect(&a, &b);
        for i in 0..256usize {
            local
                .atomic_u64(8 * i)
                .store(i as u64 + 1, std::sync::atomic::Ordering::Relaxed);
        }
        // Four lists of 64 WRITEs of 8 bytes to one word; every 8th signaled.
        let mut signaled = Vec::new();
        for list in 0..4usize {
            let wrs: Vec<SendWr> = (0..64usize)
                .map(|j| {
                    let i = list * 64 + j;
                    let s = j % 8 == 7;
                    if s {
                        signaled.push(i as u64);
                    }
                    wr(i as u64, WrOpcode::Write, &local, 8 * i, 8, &remote, 0, s)
                })
                .collect();
            qa.post_send(&wrs).unwrap();
        }
        let wcs = wait_wcs(&cqa, signaled.len());
        assert_eq!(
            wcs.len(),
            signaled.len(),
            "{model}: every signaled WR completes"
        );
        assert!(
            wcs.iter().all(|w| w.status == WcStatus::Success),
            "{model}: {wcs:?}"
        );
        let ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
        assert_eq!(ids, signaled, "{model}: completions in posting order");
        assert_eq!(
            remote
                .atomic_u64(0)
                .load(std::sync::atomic::Ordering::Acquire),
            256,
            "{model}: the last WRITE posted is the last applied"
        );
        // Nothing more arrives.
        let mut more = Vec::new();
        std::thread::sleep(Duration::from_millis(5));
        cqa.poll(&mut more, 16);
        assert!(more.is_empty(), "{model}: extra completions {more:?}");
    }
}

#[test]
fn a_qp_put_in_error_flushes_what_has_not_executed() {
    let g = ClusterGuard::new(&format!("model-{}-flush", std::process::id()))
        .unwrap()
        .0;
    let (a, b) = (open(g.name(), 1, "cx5"), open(g.name(), 2, "cx5"));
    let (local, remote) = (a.alloc_mr(64 << 10).unwrap(), b.alloc_mr(64 << 10).unwrap());
    let (mut qa, cqa, _qb, _cqb) = connect(&a, &b);
    // 64 READs of 64 KiB (about 5 us each on the line): most still wait when the QP fails.
    let wrs: Vec<SendWr> = (0..64)
        .map(|i| wr(i, WrOpcode::Read, &local, 0, 64 << 10, &remote, 0, true))
        .collect();
    qa.post_send(&wrs).unwrap();
    qa.to_error().unwrap();
    let wcs = wait_wcs(&cqa, 64);
    assert_eq!(wcs.len(), 64, "every WR completes, flushed or not");
    let ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (0..64).collect::<Vec<_>>(), "in order");
    // Successes, then flushes: never a success after a flush.
    let first_flush = wcs
        .iter()
        .position(|w| w.status == WcStatus::Flushed)
        .unwrap_or(64);
    assert!(
        wcs[first_flush..]
            .iter()
            .all(|w| w.status == WcStatus::Flushed),
        "{wcs:?}"
    );
    assert!(wcs[..first_flush]
        .iter()
        .all(|w| w.status == WcStatus::Success));
    assert!(matches!(
        qa.post_send(&wrs[..1]),
        Err(FabricError::QpError { .. })
    ));
}

#[test]
fn atomics_through_separate_mappings_of_one_nic_stay_atomic() {
    let g = ClusterGuard::new(&format!("model-{}-faa", std::process::id()))
        .unwrap()
        .0;
    let owner = open(g.name(), 1, "cx5");
    let (word, dm) = (
        owner.alloc_mr(4096).unwrap(),
        owner.alloc_dm(4096).unwrap().0,
    );
    let descs = [word.desc(), dm.desc()];
    const PER_THREAD: u64 = 2000;
    std::thread::scope(|s| {
        for t in 0..3u32 {
            let name = g.name().to_string();
            s.spawn(move || {
                // Each fabric maps node 1's NIC state itself: three mappings of one file.
                let (f, cq, mut qp) = requester_of_node_1(&name, 10 + t);
                let local = f.alloc_mr(4096).unwrap();
                for round in 0..PER_THREAD / 50 {
                    let wrs: Vec<SendWr> = (0..50u64)
                        .map(|i| SendWr {
                            wr_id: round * 50 + i,
                            opcode: WrOpcode::FetchAdd { add: 1 },
                            sge: local.sge(8 * i as usize, 8),
                            remote: descs[(i % 2) as usize].at(0),
                            signaled: i == 49,
                            inline: false,
                        })
                        .collect();
                    qp.post_send(&wrs).unwrap();
                    let wcs = wait_wcs(&cq, 1);
                    assert_eq!(wcs.len(), 1);
                    assert_eq!(wcs[0].status, WcStatus::Success);
                }
            });
        }
    });
    let total = |m: &MemoryRegion| m.atomic_u64(0).load(std::sync::atomic::Ordering::Acquire);
    assert_eq!(total(&word) + total(&dm), 3 * PER_THREAD);
    assert_eq!(total(&word), 3 * PER_THREAD / 2);
}

/// A snapshot of node `node`'s NIC state (its `n<node>.nic` file, which exists while
/// the node's fabric is open).
fn nic_snapshot(cluster: &str, node: u32) -> Vec<std::sync::atomic::AtomicU64> {
    let b = std::fs::read(rrpc::fabric::shm::cluster_dir(cluster).join(format!("n{node}.nic")))
        .unwrap();
    assert_eq!(b.len(), model::NIC_BYTES);
    b.chunks_exact(8)
        .map(|w| std::sync::atomic::AtomicU64::new(u64::from_le_bytes(w.try_into().unwrap())))
        .collect()
}

/// FAAs to one host-memory word from four requester nodes (four fabrics, each mapping
/// the target's NIC state itself, as separate processes do) are charged at the *target's*
/// NIC: its address slot for the word is reserved for all of them, one after the other
/// (busy until at least their number times the same-address hold after the first was
/// posted, and no wall-clock completion comes earlier), while the requesters' atomic
/// units and slots are never taken.
#[test]
fn atomics_from_four_requesters_to_one_word_queue_at_the_target() {
    let g = ClusterGuard::new(&format!("model-{}-slot", std::process::id()))
        .unwrap()
        .0;
    const REQUESTERS: u32 = 4;
    const PER_REQUESTER: u64 = 40;
    let hold_ns = model::TimingModel::load("cx5")
        .unwrap()
        .unwrap()
        .params()
        .atomic
        .same_addr_host_ns;
    let owner = open(g.name(), 1, "cx5");
    let word = owner.alloc_mr(4096).unwrap();
    let desc = word.desc();
    let slot = model::addr_slot(desc.rkey, desc.addr);
    // Twice: the requesters are set up; then the start is taken and they post.
    let go = std::sync::Barrier::new(REQUESTERS as usize + 1);
    let (start, start_ns) = std::thread::scope(|s| {
        for t in 0..REQUESTERS {
            let (name, go) = (g.name().to_string(), &go);
            s.spawn(move || {
                let node = 10 + t;
                let (f, cq, mut qp) = requester_of_node_1(&name, node);
                let local = f.alloc_mr(8 * PER_REQUESTER as usize).unwrap();
                let wrs: Vec<SendWr> = (0..PER_REQUESTER)
                    .map(|i| SendWr {
                        wr_id: i,
                        opcode: WrOpcode::FetchAdd { add: 1 },
                        sge: local.sge(8 * i as usize, 8),
                        remote: desc.at(0),
                        signaled: i == PER_REQUESTER - 1,
                        inline: false,
                    })
                    .collect();
                go.wait();
                go.wait();
                qp.post_send(&wrs).unwrap();
                let wcs = wait_wcs(&cq, 1);
                assert_eq!(wcs.len(), 1);
                assert_eq!(wcs[0].status, WcStatus::Success);
                // This requester's NIC (its file exists while `f` is open).
                let mine = nic_snapshot(&name, node);
                let mine = model::Nic::new(&mine);
                assert_eq!(
                    (mine.atomic_free_ns(), mine.slot_free_ns(slot)),
                    (0, 0),
                    "node {node}: a requester's atomic unit and slot are never taken"
                );
            });
        }
        go.wait();
        let start = (Instant::now(), model::now_ns());
        go.wait();
        start
    });
    let elapsed = start.elapsed();
    let n = u64::from(REQUESTERS) * PER_REQUESTER;
    assert_eq!(
        word.atomic_u64(0)
            .load(std::sync::atomic::Ordering::Acquire),
        n
    );
    let target = nic_snapshot(g.name(), 1);
    let target = model::Nic::new(&target);
    assert!(
        target.slot_free_ns(slot) >= start_ns + n * hold_ns,
        "the target's slot is busy until {} ns, want >= {} + {n} x {hold_ns}",
        target.slot_free_ns(slot),
        start_ns
    );
    assert!(target.atomic_free_ns() > start_ns);
    let floor = Duration::from_nanos(n * hold_ns);
    assert!(
        elapsed >= floor,
        "{n} FAAs to one word took {elapsed:?}, less than {floor:?} of the target's slot"
    );
}

#[test]
fn models_that_cannot_run_are_clear_errors() {
    let g = ClusterGuard::new(&format!("model-{}-bad", std::process::id()))
        .unwrap()
        .0;
    let mut cfg = FabricConfig::new(FabricKind::Shm, g.name(), NodeId(1));
    cfg.model = Some("cx9".into());
    let e = Fabric::open(&cfg).err().expect("unknown profile");
    assert!(
        e.to_string().contains("cx9") && e.to_string().contains("cx5"),
        "{e}"
    );
    let mut cfg = FabricConfig::new(FabricKind::Verbs, g.name(), NodeId(1));
    cfg.model = Some("cx5".into());
    let e = Fabric::open(&cfg).err().expect("model on verbs");
    assert!(matches!(e, FabricError::InvalidArgument { .. }), "{e}");
    assert!(e.to_string().contains("shm only"), "{e}");
    let f = open(g.name(), 2, "cx6");
    assert!(f.model_description().starts_with("cx6"));
    assert!(f.describe().contains("timing model cx6"));
    let f = open(g.name(), 3, "none");
    assert_eq!(f.model_description(), "none");
}
