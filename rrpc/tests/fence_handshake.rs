//! The shm fabric's fence handshake (`rrpc::fabric::shm` module docs): a requester that
//! passed its fence check and is paused before its store (descheduled, or SIGSTOPped)
//! must not land that store after `Fabric::fence` returned, or recovery, which starts
//! once every fence returned, would sweep a lock word that a dead coordinator then takes.
//! The fence waits for the requester's busy word; before the handshake it returned at
//! once and the store landed later. (A process of its own: the pause hook is global.)

use std::time::{Duration, Instant};

use rrpc::fabric::shm::{pause_next_wr, ClusterGuard};
use rrpc::fabric::{SendWr, WrOpcode};
use rrpc::NodeId;

#[test]
fn a_fence_returns_only_after_a_paused_store_landed() {
    let (cluster, _) =
        ClusterGuard::new(&format!("test-{}-fence-handshake", std::process::id())).unwrap();
    let fabric = cluster.open(NodeId(1)).unwrap();
    let cq = fabric.create_cq(64).unwrap();
    let mut a = fabric.create_qp(&cq, 16).unwrap();
    let mut b = fabric.create_qp(&cq, 16).unwrap();
    let (ea, eb) = (a.endpoint(), b.endpoint());
    a.connect(&eb).unwrap();
    b.connect(&ea).unwrap();
    let mr = fabric.alloc_mr(4096).unwrap();
    mr.write(64, &[0xAB; 8]);
    let wr = SendWr {
        wr_id: 1,
        opcode: WrOpcode::Write,
        sge: mr.sge(64, 8),
        remote: mr.desc().at(0),
        signaled: true,
        inline: false,
    };
    let pause = Duration::from_millis(300);
    pause_next_wr(pause);
    let t0 = Instant::now();
    let poster = std::thread::spawn(move || {
        a.post_send(&[wr]).unwrap();
        a
    });
    // The WRITE is now past its fence check, paused before its store.
    std::thread::sleep(Duration::from_millis(100));
    let mut word = [0u8; 8];
    mr.read(0, &mut word);
    assert_eq!(word, [0; 8], "the paused store landed early");
    let killed = fabric.fence(NodeId(1), fabric.incarnation());
    assert!(killed >= 2, "{killed} QPs fenced");
    // No store of the fenced requester is still to come: it landed before the fence
    // returned.
    mr.read(0, &mut word);
    assert_eq!(
        word, [0xAB; 8],
        "the fence returned before the paused store landed"
    );
    assert!(t0.elapsed() >= pause - Duration::from_millis(20));
    let _a = poster.join().unwrap();
    drop(b);
}
