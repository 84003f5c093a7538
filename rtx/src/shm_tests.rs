//! rTXs over rrpc's one-sided operations on the shm fabric: a memory node hosts the rTX
//! region ([`crate::host`]), client threads run coroutines that increment counters in objects (single-object
//! Opt1 rTXs and two-object logged rTXs) after three rTXs were abandoned mid-commit (in
//! INIT, in DOING, and an Opt1 lock); the survivors repair them on the way. Checks: every
//! counter equals its initial value plus the increments committed (an rTX abandoned in
//! DOING counts, being committed), no lock is left held, some repair happened.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use rrpc::fabric::shm::ClusterGuard;
use rrpc::node::{Node, NodeConfig};
use rrpc::runtime::{Executor, RuntimeConfig, ThreadCtx};
use rrpc::NodeId;

use crate::client::CrashPoint;
use crate::error::RtxError;
use crate::host::{host, EXPORT_KEY};
use crate::layout::{Layout, DPTR_OFF};
use crate::lease::SystemClock;
use crate::lllock::LockWord;
use crate::mem::MemError;
use crate::rrpc_mem::RrpcMem;
use crate::tests::incr;
use crate::{Client, Config};

const THREADS: u16 = 2;
const COROUTINES: u16 = 3;
const PER_COROUTINE: u64 = 150;
const OBJECTS: u64 = 8;
/// Bound on a worker's run, so a lock left held forever fails the test instead of hanging.
const WATCHDOG: Duration = Duration::from_secs(30);
/// rTX IDs of the abandoned rTXs, after the workers' IDs.
const DEAD: [u16; 3] = [
    THREADS * COROUTINES,
    THREADS * COROUTINES + 1,
    THREADS * COROUTINES + 2,
];

fn layout() -> Layout {
    Layout {
        ids: THREADS * COROUTINES + 3,
        max_entries: 4,
        objects: OBJECTS,
        block_bytes: 8,
        blocks: 64 * 64,
        reclaim_slots: 64,
    }
}

fn connect(c: &ClusterGuard, node: u32, mn: std::net::SocketAddr) -> RrpcMem {
    let ctx = ThreadCtx::new(c.open(NodeId(node)).unwrap(), RuntimeConfig::default()).unwrap();
    let (mem, layout) = crate::host::connect(&ctx, mn).unwrap();
    assert_eq!(layout, self::layout(), "the exported layout");
    mem
}

fn ctx_of(m: &RrpcMem) -> Rc<ThreadCtx> {
    m.ctx()
}

/// Tiny deterministic generator (xorshift) for object choice.
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

#[test]
fn concurrent_rtxs_over_shm_one_sided_ops_keep_counters_with_repairs() {
    let cluster = ClusterGuard::new(&format!("rtx-shm-{}", std::process::id()))
        .unwrap()
        .0;
    let l = layout();
    l.validate().unwrap();
    // The memory node: one MR holding the formatted region (every counter 0).
    let f = cluster.open(NodeId(1)).unwrap();
    let (mr, export) = host(&f, l).unwrap();
    let mut exports = BTreeMap::new();
    exports.insert(EXPORT_KEY.into(), serde_json::to_value(export).unwrap());
    let node = Node::start(
        f,
        NodeConfig::new("rtx-mn", "127.0.0.1:0".parse().unwrap()).with_exports(exports),
    )
    .unwrap();
    let mn = node.addr();

    // Three rTXs abandoned mid-commit by clients that never come back.
    let mut expected: Vec<u64> = vec![0; OBJECTS as usize];
    {
        let mem = connect(&cluster, 30, mn);
        let ctx = ctx_of(&mem);
        let mut ex = Executor::new(ctx);
        ex.spawn(async move {
            let cases = [
                (DEAD[0], CrashPoint::Locked, vec![0, 1]),
                (DEAD[1], CrashPoint::InDoing, vec![2, 3]),
                (DEAD[2], CrashPoint::Locked, vec![4]),
            ];
            for (id, at, objs) in cases {
                let mut c = Client::new(l, id, 1, SystemClock, Config::default());
                c.crash = Some(at);
                let r = incr(&mut c, &mem, &l, &objs).await;
                assert!(matches!(r, Err(RtxError::Mem(MemError::Crashed))), "{r:?}");
            }
        });
        ex.run();
        // The DOING one is committed; INIT and the Opt1 lock are not.
        expected[2] += 1;
        expected[3] += 1;
    }
    let locked = (0..5)
        .filter(|&i| mr.load_u64(l.obj_addr(i) as usize) >> 63 == 1)
        .count();
    assert_eq!(locked, 5, "the abandoned rTXs hold their locks");

    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let name = cluster.name().to_string();
            std::thread::spawn(move || {
                let cluster_fabric = rrpc::fabric::Fabric::open(&rrpc::fabric::FabricConfig::new(
                    rrpc::fabric::FabricKind::from_env().unwrap(),
                    &name,
                    NodeId(10 + t as u32),
                ))
                .unwrap();
                let ctx = ThreadCtx::new(cluster_fabric, RuntimeConfig::default()).unwrap();
                let (mem, _) = crate::host::connect(&ctx, mn).unwrap();
                let counts = Rc::new(RefCell::new((
                    vec![0u64; OBJECTS as usize],
                    0u64,
                    0u64,
                    0u64,
                )));
                let mut ex = Executor::new(ctx.clone());
                for co in 0..COROUTINES {
                    let (mem, ctx, counts) = (mem.clone(), ctx.clone(), counts.clone());
                    let id = t * COROUTINES + co;
                    ex.spawn(async move {
                        let mut c = Client::new(l, id, 1, SystemClock, Config::default());
                        let start = std::time::Instant::now();
                        let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (id as u64 + 1);
                        for k in 0..PER_COROUTINE {
                            let a = next(&mut x) % OBJECTS;
                            let objs = if k % 2 == 0 {
                                vec![a]
                            } else {
                                vec![a, (a + 1 + next(&mut x) % (OBJECTS - 1)) % OBJECTS]
                            };
                            loop {
                                match incr(&mut c, &mem, &l, &objs).await {
                                    Ok(()) => break,
                                    Err(RtxError::Aborted(_)) => {
                                        // Watchdog, not a timing check: a lock nobody
                                        // repairs would make this spin forever.
                                        assert!(
                                            start.elapsed() < WATCHDOG,
                                            "no progress on {objs:?}: a lock held forever?"
                                        );
                                        ctx.yield_now().await
                                    }
                                    Err(e) => panic!("rTX failed: {e}"),
                                }
                            }
                            let mut cs = counts.borrow_mut();
                            for &o in &objs {
                                cs.0[o as usize] += 1;
                            }
                        }
                        let s = c.stats();
                        let mut cs = counts.borrow_mut();
                        cs.1 += s.repairs;
                        cs.2 += s.log_writes;
                        cs.3 += s.aborts;
                    });
                }
                ex.run();
                let r = counts.borrow().clone();
                r
            })
        })
        .collect();
    let mut repairs = 0;
    let mut log_writes = 0;
    let mut aborts = 0;
    for w in workers {
        let (cs, rep, logs, ab) = w.join().unwrap();
        aborts += ab;
        for (e, c) in expected.iter_mut().zip(cs) {
            *e += c;
        }
        repairs += rep;
        log_writes += logs;
    }
    // Abandoned locks on objects nobody touched since are repaired by a final sweep of
    // reads once their leases have passed.
    std::thread::sleep(Duration::from_millis(30));
    {
        let mem = connect(&cluster, 31, mn);
        let ctx = ctx_of(&mem);
        let swept = Rc::new(RefCell::new(0u64));
        let mut ex = Executor::new(ctx);
        let s2 = swept.clone();
        ex.spawn(async move {
            let mut c = Client::new(l, 0, 2, SystemClock, Config::default());
            for i in 0..OBJECTS {
                for _ in 0..3 {
                    let mut tx = c.begin();
                    if tx.read(&mem, l.obj_addr(i)).await.is_ok() {
                        break;
                    }
                }
            }
            *s2.borrow_mut() = c.stats().repairs;
        });
        ex.run();
        repairs += *swept.borrow();
    }
    for i in 0..OBJECTS {
        let lock = mr.load_u64(l.obj_addr(i) as usize);
        assert!(
            matches!(LockWord::decode(lock), LockWord::Unlocked(_)),
            "object {i} locked: {lock:x}"
        );
        let d =
            crate::dptr::Dptr::decode(mr.load_u64((l.obj_addr(i) + DPTR_OFF) as usize)).unwrap();
        let v = mr.load_u64(l.block_addr(d.block) as usize);
        assert_eq!(v, expected[i as usize], "object {i}");
    }
    assert!(repairs >= 3, "only {repairs} repairs of 3 abandoned rTXs");
    // Half the increments touch two objects and are logged (an aborted logged attempt
    // wrote its log too); Opt1 ones write no log.
    let total = THREADS as u64 * COROUTINES as u64 * PER_COROUTINE;
    assert!(
        log_writes >= total / 2 && log_writes <= total / 2 + aborts,
        "{log_writes} log writes for {total} rTXs, {aborts} aborted attempts"
    );
    drop(node);
}
