//! Recovery of locks held or queued by client processes killed with SIGKILL, over the
//! shm fabric: the lock service runs in this process (node 1), the clients are child
//! processes (this test binary run again as `child_process`), and a survivor in this
//! process (node 100) gets the lock once `release_node` passed the dead nodes' locks on.
//!
//! Takeout (Scythe 4.3) through `LockClient::release_node`; Lotus lock tables (Lotus 6)
//! through `TableClient::release_node`. No test waits without a deadline: children exit
//! by themselves after a minute, and every wait and call has a timeout.

use rrpc::NodeId;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockd::client::{LockClient, LockError, LockRequest, Mode, Ticket};
use lockd::lock_table::{LockMode, LockTable as SlotTable, Refusal};
use lockd::owners::Owner;
use lockd::service::{LockTable, EXPORT_NAME};
use lockd::shard::{LockKey, Ownership, ShardMap};
use lockd::table_service::{TableClient, TableClientConfig, TableService, TABLE_EXPORT};
use lockd::table_wire::{OpKind, OpOutcome, TableOp};
use lockd::takeout::Watermarks;
use rrpc::fabric::shm::ClusterGuard;
use rrpc::runtime::{block_on, RuntimeConfig, ThreadCtx};

mod common;
use common::{lockd_node, ChildProc, CHILD_LOCK as LOCK, CHILD_SHARD};

const SERVICE: u32 = 1;
const SURVIVOR: u32 = 100;

fn cluster(name: &str) -> ClusterGuard {
    let c = format!("lockd-rn-{}-{name}", std::process::id());
    ClusterGuard::new(&c).unwrap().0
}

fn runtime() -> RuntimeConfig {
    RuntimeConfig::default().with_call_timeout(Duration::from_secs(5))
}

/// The child process body (see [`common::child_main`]); a no-op unless run as a child.
#[test]
fn child_process() {
    common::child_main();
}

/// A holder (node 201) and a waiter queued behind it (node 202) are killed with SIGKILL;
/// the lock stays stalled until `release_node` passes both tickets on, then the
/// survivor queued third gets it.
#[test]
fn takeout_tickets_of_killed_holder_and_waiter_are_passed_on() {
    let cl = cluster("takeout");
    let fabric = cl.open(NodeId(SERVICE)).unwrap();
    let table = Arc::new(LockTable::new(&fabric, 16, Watermarks::default()).unwrap());
    let mut exports = BTreeMap::new();
    exports.insert(EXPORT_NAME.to_string(), table.export());
    let node = lockd_node(fabric, exports, table.handlers(), 1);

    let (mut holder, t0) = ChildProc::spawn(cl.name(), "takeout", 201, node.addr(), 10);
    let (mut waiter, t1) = ChildProc::spawn(cl.name(), "takeout", 202, node.addr(), 20);
    assert_eq!((t0, t1), (0, 1));

    let ctx = ThreadCtx::new(cl.open(NodeId(SURVIVOR)).unwrap(), runtime()).unwrap();
    let info = ctx.connect_rpc(node.addr()).unwrap();
    let lc = Rc::new(LockClient::from_info(&info).unwrap());
    let (c, l) = (ctx.clone(), lc.clone());
    let mut mine: Ticket = block_on(&ctx, async move {
        let req = LockRequest {
            id: LOCK,
            ts: 30,
            mode: Mode::Hot,
        };
        l.lock(&c, &[req])
            .await
            .unwrap()
            .remove(0)
            .ticket()
            .unwrap()
    });
    assert_eq!(mine.number(), 2);
    assert_eq!(nodes(&table, LOCK), vec![(0, 201), (1, 202), (2, SURVIVOR)]);
    // Each ticket is owned by the (node, incarnation) its connection announced.
    let survivor = Owner {
        node: SURVIVOR,
        incarnation: ctx.fabric().incarnation(),
    };
    assert_eq!(
        table.ticket_owners(LOCK),
        vec![(0, child_owner(201)), (1, child_owner(202)), (2, survivor)]
    );

    holder.kill();
    waiter.kill();

    let (c, l, tbl) = (ctx.clone(), lc.clone(), table.clone());
    let (mine, passed) = block_on(&ctx, async move {
        // Stalled: nobody passes the dead tickets on by themselves.
        let e = mine
            .wait(Instant::now() + Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(matches!(e, LockError::WaitTimeout { upper: 0, .. }), "{e}");
        // Asking for a node with no tickets passes nothing on.
        assert_eq!(l.release_node(&c, child_owner(999)).await.unwrap(), 0);
        // The waiter first: its release waits for the holder's, released alongside.
        let (a, b) = futures_join(
            l.release_node(&c, child_owner(202)),
            l.release_node(&c, child_owner(201)),
        )
        .await;
        let passed = (a.unwrap(), b.unwrap());
        mine.wait(Instant::now() + Duration::from_secs(20))
            .await
            .expect("the survivor gets the lock");
        assert!(mine.is_served());
        assert_eq!(nodes(&tbl, LOCK), vec![(2, SURVIVOR)]);
        assert_eq!(
            l.release_node(&c, child_owner(201)).await.unwrap(),
            0,
            "taken once"
        );
        (mine, passed)
    });
    assert_eq!(passed, (1, 1));
    let c = ctx.clone();
    block_on(&ctx, async move {
        mine.release().await.unwrap();
        drop(c);
    });
    assert_eq!(table.words(LOCK).0, 3);
    assert_eq!(table.words(LOCK).1, 3, "every ticket passed exactly once");
    assert_eq!(table.ticket_owners(LOCK), vec![]);
}

/// A child process's owner identity (children open their fabric as
/// [`common::CHILD_INCARNATION`]).
fn child_owner(node: u32) -> Owner {
    Owner {
        node,
        incarnation: common::CHILD_INCARNATION,
    }
}

/// Lock `id`'s recorded tickets with the nodes that took them.
fn nodes(table: &LockTable, id: u64) -> Vec<(u64, u32)> {
    table
        .ticket_owners(id)
        .into_iter()
        .map(|(t, o)| (t, o.node))
        .collect()
}

/// Await two futures concurrently on the current coroutine.
async fn futures_join<A: std::future::Future, B: std::future::Future>(
    a: A,
    b: B,
) -> (A::Output, B::Output) {
    use std::pin::pin;
    use std::task::Poll;
    let (mut a, mut b) = (pin!(a), pin!(b));
    let (mut ra, mut rb) = (None, None);
    std::future::poll_fn(|cx| {
        if ra.is_none() {
            if let Poll::Ready(v) = a.as_mut().poll(cx) {
                ra = Some(v);
            }
        }
        if rb.is_none() {
            if let Poll::Ready(v) = b.as_mut().poll(cx) {
                rb = Some(v);
            }
        }
        if ra.is_some() && rb.is_some() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    (ra.unwrap(), rb.unwrap())
}

/// A client process holding a write lock and a read lock of a Lotus lock table is killed
/// with SIGKILL; a survivor is refused until `release_node` releases them.
#[test]
fn lock_table_locks_of_a_killed_client_are_released() {
    let cl = cluster("table");
    let fabric = cl.open(NodeId(SERVICE)).unwrap();
    let map = ShardMap::uniform(&[SERVICE]).unwrap();
    let svc = Arc::new(TableService::new(
        Arc::new(SlotTable::with_bytes(1 << 16)),
        Ownership::new(SERVICE, map),
    ));
    let mut exports = BTreeMap::new();
    exports.insert(TABLE_EXPORT.to_string(), svc.export());
    let node = lockd_node(fabric, exports, svc.handlers(), 1);

    let (mut child, n) = ChildProc::spawn(cl.name(), "table", 203, node.addr(), 0);
    assert_eq!(n, 2);
    assert_eq!(svc.table().slots_in_use(), 2);
    child.kill();

    let ctx = ThreadCtx::new(cl.open(NodeId(SURVIVOR)).unwrap(), runtime()).unwrap();
    ctx.connect_rpc(node.addr()).unwrap();
    let c = ctx.clone();
    block_on(&ctx, async move {
        let tc = TableClient::connect(&c, &[SERVICE], None, TableClientConfig::default())
            .await
            .unwrap();
        let want = [
            table_op(CHILD_SHARD, 1, 5, SURVIVOR, OpKind::Lock(LockMode::Write)),
            table_op(CHILD_SHARD, 2, 5, SURVIVOR, OpKind::Lock(LockMode::Write)),
        ];
        let o = tc.execute(&c, &want).await.unwrap();
        assert_eq!(
            o,
            [
                OpOutcome::Refused(Refusal::Conflict),
                OpOutcome::Refused(Refusal::Conflict)
            ],
            "the dead client's locks are still held"
        );
        assert_eq!(tc.release_node(&c, child_owner(203)).await.unwrap(), 2);
        assert_eq!(
            tc.release_node(&c, child_owner(203)).await.unwrap(),
            0,
            "idempotent"
        );
        let o = tc.execute(&c, &want).await.unwrap();
        assert_eq!(o, [OpOutcome::Granted, OpOutcome::Granted]);
    });
    assert_eq!(svc.table().slots_in_use(), 2, "the survivor's two locks");
}

fn table_op(shard: u64, rest: u64, txn: u64, node: u32, kind: OpKind) -> TableOp {
    TableOp {
        key: LockKey::compose(1, shard, rest).unwrap(),
        txn,
        node,
        kind,
    }
}
