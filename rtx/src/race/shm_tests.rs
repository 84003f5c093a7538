//! The rTX hash table with real concurrency: client threads (each its own fabric node and
//! runtime, coroutines with one rTX client and handle each) over rrpc's one-sided
//! operations on the shm fabric, inserting disjoint and overlapping keys while subtables
//! split. Checks: every acknowledged key found once with an acknowledged value, the table
//! checker passes, no lock held, every log DONE.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use rrpc::fabric::shm::ClusterGuard;
use rrpc::node::{Node, NodeConfig};
use rrpc::runtime::{Executor, RuntimeConfig, ThreadCtx};
use rrpc::NodeId;

use super::check::{check_quiescent, check_table};
use super::{first_free_obj, init_hosted, Race};
use crate::host::{host, EXPORT_KEY};
use crate::layout::Layout;
use crate::lease::SystemClock;
use crate::rrpc_mem::RrpcMem;
use crate::{Client, Config};

const THREADS: u64 = 2;
const COROUTINES: u64 = 3;
const PER_CLIENT: u64 = 200;
const OBJS: u64 = 500;

/// 1 KiB blocks: 16 buckets of 7 slots per subtable, depth up to 6 (64 subtables), for
/// about 750 keys. With 512-byte blocks (8 buckets, depth up to 5) a run whose keys
/// happened to crowd one subtable's buckets failed with `TableFull` now and then: a
/// capacity event (RACE's overflow buckets are not built), not what this test checks.
fn layout() -> Layout {
    Layout {
        ids: 8,
        max_entries: 8,
        objects: 4096,
        block_bytes: 1024,
        blocks: 64 * 160,
        reclaim_slots: 64,
    }
}

fn connect(name: &str, node: u32, mn: std::net::SocketAddr) -> (Rc<ThreadCtx>, RrpcMem) {
    let f = rrpc::fabric::Fabric::open(&rrpc::fabric::FabricConfig::new(
        rrpc::fabric::FabricKind::from_env().unwrap(),
        name,
        NodeId(node),
    ))
    .unwrap();
    let ctx = ThreadCtx::new(f, RuntimeConfig::default()).unwrap();
    let (mem, l) = crate::host::connect(&ctx, mn).unwrap();
    assert_eq!(l, layout());
    (ctx, mem)
}

fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

#[test]
fn threads_over_shm_insert_while_subtables_split() {
    let cluster = ClusterGuard::new(&format!("rtx-race-{}", std::process::id()))
        .unwrap()
        .0;
    let l = layout();
    let f = cluster.open(NodeId(1)).unwrap();
    let (_mr, export) = host(&f, l).unwrap();
    let mut exports = BTreeMap::new();
    exports.insert(EXPORT_KEY.into(), serde_json::to_value(export).unwrap());
    let node = Node::start(
        f,
        NodeConfig::new("rtx-mn", "127.0.0.1:0".parse().unwrap()).with_exports(exports),
    )
    .unwrap();
    let mn = node.addr();
    let name = cluster.name().to_string();
    {
        let (ctx, mem) = connect(&name, 30, mn);
        let mut ex = Executor::new(ctx);
        ex.spawn(async move { init_hosted(&l, &mem, 0).await.unwrap() });
        ex.run();
    }
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let name = name.clone();
            std::thread::spawn(move || {
                let (ctx, mem) = connect(&name, 10 + t as u32, mn);
                let acked = Rc::new(RefCell::new(Vec::new()));
                let rehashes = Rc::new(RefCell::new(0u64));
                let mut ex = Executor::new(ctx);
                for co in 0..COROUTINES {
                    let slot = t * COROUTINES + co;
                    let (mem, acked, rehashes) = (mem.clone(), acked.clone(), rehashes.clone());
                    ex.spawn(async move {
                        let mut c = Client::new(l, slot as u16, 2, SystemClock, Config::default());
                        let first = first_free_obj(0) + slot * OBJS;
                        let mut table = Race::new(l, first..first + OBJS).unwrap();
                        let mut x = 0x1234_5678 ^ (slot + 1);
                        for j in 0..PER_CLIENT {
                            let k = if j % 2 == 0 {
                                slot * 100_000 + j
                            } else {
                                1_000_000 + next(&mut x) % 150
                            };
                            let v = (slot << 32) | j;
                            table.insert(&mut c, &mem, k, v).await.unwrap();
                            acked.borrow_mut().push((k, v));
                            if j % 10 == 0 {
                                let got = table.get(&mut c, &mem, k).await.unwrap();
                                assert!(got.is_some(), "own key {k} not found");
                            }
                        }
                        *rehashes.borrow_mut() += table.stats().rehashes;
                    });
                }
                ex.run();
                let a = acked.borrow().clone();
                let n = *rehashes.borrow();
                (a, n)
            })
        })
        .collect();
    let mut written: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    let mut rehashes = 0;
    for w in workers {
        let (acked, n) = w.join().unwrap();
        rehashes += n;
        for (k, v) in acked {
            written.entry(k).or_default().push(v);
        }
    }
    assert!(rehashes >= 4, "only {rehashes} rehashes");
    let (ctx, mem) = connect(&name, 31, mn);
    let mut ex = Executor::new(ctx);
    let out = Rc::new(RefCell::new(None));
    let o2 = out.clone();
    ex.spawn(async move {
        let all = check_table(&mem, &l).await.unwrap();
        check_quiescent(&mem, &l).await.unwrap();
        *o2.borrow_mut() = Some(all);
    });
    ex.run();
    let all = out.borrow_mut().take().unwrap();
    let found: BTreeMap<u64, u64> = all.iter().copied().collect();
    assert_eq!(found.len(), all.len(), "every key once");
    assert_eq!(
        found.len(),
        written.len(),
        "every acknowledged key, no other"
    );
    for (k, vs) in &written {
        let got = found
            .get(k)
            .copied()
            .unwrap_or_else(|| panic!("key {k} lost"));
        assert!(vs.contains(&got), "key {k} holds {got}, never acknowledged");
    }
    drop(node);
}
