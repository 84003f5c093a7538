//! Lotus's round trips (the Lotus issue's test of DepositChecking): one coroutine, no
//! contention, every lock on this compute node's own table and its version table cache
//! warm. A SmallBank DepositChecking (its CHECKING row read for update, then written)
//! then posts to the memory node exactly one READ (the record: the cache spares the CVT
//! READ), two WRITEs in C1 (the record and its cell, INVISIBLE) and one in C3 (the
//! version), and no atomic; it sends no RPC (its lock is a CPU CAS on the local table)
//! and takes two timestamps (start and commit), each one fetch-and-add on the oracle.
//! With the cache off the CVT READ comes back: two READs.

mod common;

use std::rc::Rc;

use rrpc::fabric::{Fabric, FabricConfig, FabricKind};
use rrpc::runtime::{block_on, OpCounts, RuntimeConfig, ThreadCtx};
use rrpc::NodeId;
use txn::coordinator::{Isolation, Protocol, TxnClient, TxnConfig};
use txn::smallbank::CHECKING;

/// The memory node's and the oracle's node ids in `common::start_cluster`.
const MEMNODE: NodeId = NodeId(10);
const TSO: NodeId = NodeId(3);

/// One DepositChecking of account 7, committed.
async fn deposit(c: &TxnClient) {
    let mut t = c.begin();
    let v = t.read_for_update(CHECKING, 7).await.unwrap();
    let bal = i64::from_le_bytes(v[..8].try_into().unwrap());
    t.write(CHECKING, 7, (bal + 1).to_le_bytes().to_vec())
        .unwrap();
    t.commit().await.unwrap();
}

fn diff(a: OpCounts, b: OpCounts) -> (u64, u64, u64) {
    (
        b.reads - a.reads,
        b.writes - a.writes,
        b.atomics - a.atomics,
    )
}

/// `(memory-node READs, WRITEs, atomics; oracle atomics; RPC requests)` of the third
/// DepositChecking of one client (the first two warm the caches).
fn third_deposit(vtc_entries: usize) -> ((u64, u64, u64), u64, u64) {
    let _one = common::serial();
    let protocol = Protocol::Lotus(Isolation::Serializable);
    let (cluster, addrs, _tso) = common::start_cluster(
        &format!("lotus-rt-{vtc_entries}"),
        protocol,
        &["--smallbank-accounts".into(), "100".into()],
        200,
    );
    let kind = FabricKind::from_env().unwrap();
    let fabric = Fabric::open(&FabricConfig::new(kind, cluster.name(), NodeId(100))).unwrap();
    let ctx = ThreadCtx::new(fabric, RuntimeConfig::default()).unwrap();
    let cfg = TxnConfig::default()
        .with_protocol(protocol)
        .with_lotus(Some(txn::lotus::LotusSite::single_cached(
            100,
            1 << 20,
            vtc_entries,
        )));
    let client = Rc::new(TxnClient::connect(ctx.clone(), &addrs, cfg).unwrap());
    let c = client.clone();
    let x = ctx.clone();
    block_on(&ctx, async move {
        deposit(&c).await;
        deposit(&c).await;
        let (m, t, s) = (x.op_counts(MEMNODE), x.op_counts(TSO), x.stats());
        deposit(&c).await;
        let tso = diff(t, x.op_counts(TSO));
        (
            diff(m, x.op_counts(MEMNODE)),
            tso.2,
            x.stats().messages - s.messages,
        )
    })
}

#[test]
fn deposit_checking_takes_three_memory_node_round_trips_and_no_lock_rpc() {
    let (memnode, tso_faa, rpcs) = third_deposit(txn::vt_cache::DEFAULT_ENTRIES);
    assert_eq!(memnode, (1, 3, 0), "memory node (READs, WRITEs, atomics)");
    assert_eq!(tso_faa, 2, "timestamps: start and commit");
    assert_eq!(rpcs, 0, "no lock RPC: the lock is local");
}

#[test]
fn without_the_cache_the_cvt_is_read_again() {
    let (memnode, tso_faa, rpcs) = third_deposit(0);
    assert_eq!(memnode, (2, 3, 0), "memory node (READs, WRITEs, atomics)");
    assert_eq!(tso_faa, 2);
    assert_eq!(rpcs, 0);
}
