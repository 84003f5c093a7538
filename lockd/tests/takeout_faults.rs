//! Faults of the Takeout lock service (Scythe 4.3) and what the service and its client do
//! about them, over the shm fabric with the service in this process:
//!
//! - a Lock RPC the client gave up on (timed out) but the service granted afterwards: the
//!   client claims the ticket and passes it on, so the lock is never left owned by nobody;
//! - a request abandoned before it ran is refused when it arrives;
//! - a timestamp above what the oracle can have issued is refused and changes nothing;
//! - the caller the RPC layer names owns the tickets; a payload naming another node is
//!   refused;
//! - a release-node reply that is lost does not lose the tickets it carried;
//! - a node restarted under the same id keeps its tickets when its predecessor's are
//!   released, and its predecessor is refused;
//! - a restarted lock service refuses clients of its predecessor, which reconnect.
//!
//! Every wait has a deadline; no test asserts a runtime.

use rrpc::NodeId;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockd::client::{Grant, LockClient, LockError, LockRequest, Mode};
use lockd::owners::Owner;
use lockd::service::{LockTable, ServiceRefusal, EXPORT_NAME};
use lockd::takeout::Watermarks;
use lockd::wire::{
    encode_request, ReleaseNodeRequest, ReleaseNodeRpc, ReleaseNodeWire, RequestHeader,
    LOCK_HANDLER,
};
use rrpc::fabric::shm::ClusterGuard;
use rrpc::runtime::{block_on, RuntimeConfig, ThreadCtx};

mod common;
use common::lockd_node;

const SERVICE: u32 = 1;
const CLIENT: u32 = 100;
const LOCK: u64 = 3;
const LOCK2: u64 = 4;

fn cluster(name: &str) -> ClusterGuard {
    let c = format!("lockd-faults-{}-{name}", std::process::id());
    ClusterGuard::new(&c).unwrap().0
}

fn runtime(call_timeout: Duration) -> RuntimeConfig {
    RuntimeConfig::default().with_call_timeout(call_timeout)
}

fn req(id: u64, ts: u64) -> LockRequest {
    LockRequest {
        id,
        ts,
        mode: Mode::Hot,
    }
}

fn owner(node: u32, incarnation: u64) -> Owner {
    Owner { node, incarnation }
}

/// A release-node request's bytes, as a client sends them.
fn encode_release_node(r: &ReleaseNodeRequest) -> Vec<u8> {
    let mut b = Vec::new();
    rrpc::typed::encode_request::<ReleaseNodeRpc>(&ReleaseNodeWire::new(r), &mut b).unwrap();
    b
}

/// A Lock RPC payload from `who` (request tag `seq`, epoch unchecked).
fn payload(who: Owner, seq: u64, reqs: &[LockRequest]) -> Vec<u8> {
    let mut b = Vec::new();
    let hdr = RequestHeader {
        owner: who,
        seq,
        epoch: 0,
    };
    encode_request(reqs, &hdr, &mut b).unwrap();
    b
}

/// Run `f` on `ctx` until it returns true or `secs` pass (then panic with `what`),
/// letting the executor run spawned coroutines in between.
fn eventually(ctx: &Rc<ThreadCtx>, secs: u64, what: &'static str, f: impl Fn() -> bool + 'static) {
    let c = ctx.clone();
    let ok = block_on(ctx, async move {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            if f() {
                return true;
            }
            c.sleep(Duration::from_millis(5)).await;
        }
        false
    });
    assert!(ok, "{what}");
}

/// The client's Lock RPC times out because the service is slow; the service grants it
/// afterwards. The client abandons the request and passes the ticket on: the lock is free
/// again and another client's ticket is served. (Before, the reply was dropped as
/// cancelled and the lock stayed at the orphan ticket forever.)
#[test]
fn a_lock_rpc_granted_after_its_client_gave_up_is_passed_on() {
    let cl = cluster("late");
    let fabric = cl.open(NodeId(SERVICE)).unwrap();
    let table = Arc::new(LockTable::new(&fabric, 16, Watermarks::default()).unwrap());
    let mut exports = BTreeMap::new();
    exports.insert(EXPORT_NAME.to_string(), table.export());
    // The first Lock RPC is served only after the client's deadline.
    let slow = Arc::new(AtomicBool::new(true));
    let mut h = table.handlers();
    let (t, s) = (table.clone(), slow.clone());
    // Served as `LockTable::register` serves it: the caller the connection announced
    // owns the tickets.
    assert!(h.remove(LOCK_HANDLER));
    h.register_with_caller(LOCK_HANDLER, move |caller, req, out| {
        if s.swap(false, Ordering::AcqRel) {
            std::thread::sleep(Duration::from_millis(600));
        }
        let owner = Owner {
            node: caller.node.get(),
            incarnation: caller.incarnation,
        };
        t.handle_from(owner, req, out)
    });
    let node = lockd_node(fabric, exports, h, 1);

    let ctx = ThreadCtx::new(
        cl.open(NodeId(CLIENT)).unwrap(),
        runtime(Duration::from_millis(150)),
    )
    .unwrap();
    let lc = Rc::new(LockClient::from_info(&ctx.connect_rpc(node.addr()).unwrap()).unwrap());
    let (c, l) = (ctx.clone(), lc.clone());
    let e = block_on(&ctx, async move {
        l.lock(&c, &[req(LOCK, 10)]).await.unwrap_err()
    });
    assert!(matches!(e, LockError::Rpc(_)), "{e}");
    // The service granted it meanwhile (or does so soon): the ticket must come back free.
    let tbl = table.clone();
    eventually(
        &ctx,
        20,
        "the late-granted ticket was never passed on",
        move || {
            let (lower, upper, _) = tbl.words(LOCK);
            lower == 1 && upper == 1
        },
    );
    assert_eq!(lc.given_up(), 0);
    // The lock serves the next client.
    let (c, l) = (ctx.clone(), lc.clone());
    block_on(&ctx, async move {
        let Grant::Queued(mut t) = l.lock(&c, &[req(LOCK, 20)]).await.unwrap().remove(0) else {
            panic!("refused")
        };
        t.wait(Instant::now() + Duration::from_secs(10))
            .await
            .unwrap();
        t.release().await.unwrap();
    });
    assert_eq!(table.words(LOCK).1, 2);
}

/// A request its client abandoned before it reached the service is refused when it
/// arrives, and changes no lock.
#[test]
fn a_request_abandoned_before_it_ran_is_refused_when_it_arrives() {
    let cl = cluster("tomb");
    let table = LockTable::new(
        &cl.open(NodeId(SERVICE)).unwrap(),
        16,
        Watermarks::default(),
    )
    .unwrap();
    let me = owner(7, 1);
    assert_eq!(table.abandon(me, 42, &[LOCK, 4]), vec![]);
    let mut out = Vec::new();
    table
        .handle(&payload(me, 42, &[req(LOCK, 5), req(4, 5)]), &mut out)
        .unwrap();
    let replies = lockd::wire::decode_reply(&out, 2).unwrap();
    assert!(replies.iter().all(|r| !r.granted_queue), "{replies:?}");
    assert_eq!(table.words(LOCK), (0, 0, 0));
    assert_eq!(table.words(4), (0, 0, 0));
    // Another request of the same owner is served.
    out.clear();
    table
        .handle(&payload(me, 43, &[req(LOCK, 5)]), &mut out)
        .unwrap();
    assert!(lockd::wire::decode_reply(&out, 1).unwrap()[0].granted_queue);
}

/// One request with timestamp `u64::MAX` used to raise `queued_ts` to it, and every later
/// request was refused. The service refuses it (an error reply), the lock is unchanged and
/// serves the next request; a bound learned from the oracle refuses what it has not
/// issued yet.
#[test]
fn a_timestamp_above_the_issued_bound_is_refused_and_changes_nothing() {
    let cl = cluster("ts");
    let fabric = cl.open(NodeId(SERVICE)).unwrap();
    let table = Arc::new(LockTable::new(&fabric, 16, Watermarks::default()).unwrap());
    let mut exports = BTreeMap::new();
    exports.insert(EXPORT_NAME.to_string(), table.export());
    let node = lockd_node(fabric, exports, table.handlers(), 1);
    let ctx = ThreadCtx::new(
        cl.open(NodeId(CLIENT)).unwrap(),
        runtime(Duration::from_secs(5)),
    )
    .unwrap();
    let lc = Rc::new(LockClient::from_info(&ctx.connect_rpc(node.addr()).unwrap()).unwrap());
    let (c, l) = (ctx.clone(), lc.clone());
    block_on(&ctx, async move {
        let e = l
            .lock(&c, &[req(LOCK, 1), req(4, u64::MAX)])
            .await
            .unwrap_err();
        assert!(e.to_string().contains("above the issued bound"), "{e}");
        let g = l.lock(&c, &[req(LOCK, 5)]).await.unwrap().remove(0);
        let Grant::Queued(t) = g else {
            panic!("refused after a bogus timestamp: {g:?}")
        };
        t.release().await.unwrap();
    });
    assert_eq!(
        table.words(4),
        (0, 0, 0),
        "the refused request took nothing"
    );
    assert_eq!(table.words(LOCK), (1, 1, 5));

    // A bound learned from the oracle: its issued high mark grows from 100 to 200.
    let mut t2 = LockTable::new(
        &cl.open(NodeId(SERVICE + 1)).unwrap(),
        4,
        Watermarks::default(),
    )
    .unwrap();
    let high = Arc::new(std::sync::atomic::AtomicU64::new(100));
    let h = high.clone();
    t2.set_ts_bound(Box::new(move || Some(h.load(Ordering::Acquire))));
    let me = owner(7, 1);
    let mut out = Vec::new();
    t2.handle(&payload(me, 1, &[req(0, 50)]), &mut out).unwrap();
    let e = t2
        .handle(&payload(me, 2, &[req(1, 150)]), &mut out)
        .unwrap_err();
    assert!(e.contains("above the issued bound 100"), "{e}");
    assert_eq!(t2.words(1), (0, 0, 0));
    high.store(200, Ordering::Release);
    t2.handle(&payload(me, 3, &[req(1, 150)]), &mut out)
        .unwrap();
    assert_eq!(t2.words(1).0, 1);
}

/// The node that owns a ticket is the caller the RPC layer names, not the payload's; a
/// payload naming another node is refused.
#[test]
fn the_caller_owns_the_tickets_and_a_payload_naming_another_node_is_refused() {
    let cl = cluster("caller");
    let table = LockTable::new(
        &cl.open(NodeId(SERVICE)).unwrap(),
        16,
        Watermarks::default(),
    )
    .unwrap();
    let mut out = Vec::new();
    let e = table
        .handle_from(
            owner(7, 1),
            &payload(owner(8, 1), 1, &[req(LOCK, 5)]),
            &mut out,
        )
        .unwrap_err();
    assert!(
        e.contains(
            &ServiceRefusal::NodeMismatch {
                declared: 8,
                caller: 7
            }
            .to_string()
        ),
        "{e}"
    );
    assert_eq!(table.words(LOCK), (0, 0, 0));
    // The RPC layer's incarnation wins over the payload's.
    table
        .handle_from(
            owner(7, 9),
            &payload(owner(7, 1), 2, &[req(LOCK, 5)]),
            &mut out,
        )
        .unwrap();
    assert_eq!(table.ticket_owners(LOCK), vec![(0, owner(7, 9))]);
}

/// The reply of a release-node RPC is lost: the tickets it carried are handed over again
/// (after the handover lease), and a survivor then passes them on. (Before, they were
/// deleted before the reply went out, and nobody could pass them on.)
#[test]
fn tickets_of_a_lost_release_node_reply_are_handed_over_again() {
    let cl = cluster("lost");
    let fabric = cl.open(NodeId(SERVICE)).unwrap();
    let mut table = LockTable::new(&fabric, 16, Watermarks::default()).unwrap();
    table.set_handover_lease(Duration::ZERO);
    let table = Arc::new(table);
    let mut exports = BTreeMap::new();
    exports.insert(EXPORT_NAME.to_string(), table.export());
    let node = lockd_node(fabric, exports, table.handlers(), 1);
    let dead = owner(201, 1);
    let mut out = Vec::new();
    table
        .handle(&payload(dead, 1, &[req(LOCK, 5)]), &mut out)
        .unwrap();
    // A survivor asks; the reply never reaches it.
    let ask = encode_release_node(&ReleaseNodeRequest {
        dead,
        max: 16,
        epoch: 0,
        caller: owner(CLIENT, 1),
    });
    let mut lost = Vec::new();
    table.handle_release_node(&ask, &mut lost).unwrap();
    assert_eq!(lost.len(), 16, "one ticket handed over");
    // The survivor asks again and passes the ticket on.
    let ctx = ThreadCtx::new(
        cl.open(NodeId(CLIENT)).unwrap(),
        runtime(Duration::from_secs(5)),
    )
    .unwrap();
    let lc = Rc::new(LockClient::from_info(&ctx.connect_rpc(node.addr()).unwrap()).unwrap());
    let (c, l) = (ctx.clone(), lc.clone());
    let passed = block_on(&ctx, async move { l.release_node(&c, dead).await.unwrap() });
    assert_eq!(passed, 1);
    assert_eq!(table.words(LOCK).1, 1, "passed on exactly once");
    assert_eq!(table.ticket_owners(LOCK), vec![]);
}

/// Node 5 restarted (incarnation 2) and took a ticket; a late release of its dead
/// predecessor (incarnation 1) passes on only the predecessor's ticket, and requests of
/// the predecessor are refused once the successor was seen.
#[test]
fn release_node_touches_only_the_named_incarnation_and_old_incarnations_are_refused() {
    let cl = cluster("inc");
    let table = LockTable::new(
        &cl.open(NodeId(SERVICE)).unwrap(),
        16,
        Watermarks::default(),
    )
    .unwrap();
    let (old, new) = (owner(5, 1), owner(5, 2));
    let mut out = Vec::new();
    table
        .handle(&payload(old, 1, &[req(LOCK, 5)]), &mut out)
        .unwrap();
    table
        .handle(&payload(new, 1, &[req(LOCK, 6)]), &mut out)
        .unwrap();
    assert_eq!(table.ticket_owners(LOCK), vec![(0, old), (1, new)]);
    let handed = table.take_node_tickets(old, 16);
    assert_eq!(handed.iter().map(|t| t.ticket).collect::<Vec<_>>(), vec![0]);
    assert_eq!(
        table.take_node_tickets(new, 16).len(),
        1,
        "the live one's stays its own"
    );
    let e = table
        .handle(&payload(old, 2, &[req(4, 7)]), &mut out)
        .unwrap_err();
    assert!(
        e.contains(
            &ServiceRefusal::StaleIncarnation {
                node: 5,
                incarnation: 1,
                newest: 2
            }
            .to_string()
        ),
        "{e}"
    );
    assert_eq!(table.words(4), (0, 0, 0));
    // A release-node RPC sent by a stale incarnation is refused too.
    let ask = encode_release_node(&ReleaseNodeRequest {
        dead: owner(9, 1),
        max: 16,
        epoch: 0,
        caller: old,
    });
    assert!(table.handle_release_node(&ask, &mut Vec::new()).is_err());
}

/// The lock service restarts (a new table, a new epoch, at a new address): the client's
/// old ticket cannot touch the new table, a request naming the old epoch is refused with
/// [`LockError::Restarted`], and the client reconnects and locks again.
#[test]
fn a_restarted_service_refuses_its_predecessors_clients_until_they_reconnect() {
    let cl = cluster("restart");
    let start = |epoch| {
        let fabric = cl.open(NodeId(SERVICE)).unwrap();
        let table =
            Arc::new(LockTable::with_epoch(&fabric, 16, Watermarks::default(), epoch).unwrap());
        let mut exports = BTreeMap::new();
        exports.insert(EXPORT_NAME.to_string(), table.export());
        let node = lockd_node(fabric, exports, table.handlers(), 1);
        (table, node)
    };
    let (old_table, old_node) = start(1);
    let ctx = ThreadCtx::new(
        cl.open(NodeId(CLIENT)).unwrap(),
        runtime(Duration::from_secs(2)),
    )
    .unwrap();
    let mut lc = LockClient::from_info(&ctx.connect_rpc(old_node.addr()).unwrap()).unwrap();
    lc.set_release_wait(Duration::from_secs(2));
    assert_eq!(lc.epoch(), 1);
    let lc = Rc::new(lc);
    let (c, l) = (ctx.clone(), lc.clone());
    let held = block_on(&ctx, async move {
        l.lock(&c, &[req(LOCK, 5)])
            .await
            .unwrap()
            .remove(0)
            .ticket()
            .unwrap()
    });
    drop(old_node);
    drop(old_table);
    // The thread finds the old service gone.
    let (c, l) = (ctx.clone(), lc.clone());
    let gone = block_on(&ctx, async move { l.read_state(&c, LOCK).await });
    assert!(gone.is_err(), "the old table is still readable");

    let (table, node) = start(2);
    // The thread's connection follows the restarted node; the lock client still has the
    // old export.
    ctx.reconnect(node.addr()).unwrap();
    ctx.connect_rpc(node.addr()).unwrap();
    let (c, l) = (ctx.clone(), lc.clone());
    let e = block_on(&ctx, async move {
        l.lock(&c, &[req(LOCK, 6)]).await.unwrap_err()
    });
    assert!(matches!(e, LockError::Restarted(_)), "{e}");
    // The old ticket's release cannot pass anything on in the new table.
    let c = ctx.clone();
    let r = block_on(&ctx, async move {
        let r = held.release().await;
        drop(c);
        r
    });
    assert!(r.is_err(), "an old ticket's release reached the new table");
    assert_eq!(table.words(LOCK), (0, 0, 0), "the new table is untouched");

    let mut lc = Rc::try_unwrap(lc).ok().expect("one owner");
    let (c, addr) = (ctx.clone(), node.addr());
    let lc = block_on(&ctx, async move {
        lc.reconnect(&c, addr).await.unwrap();
        lc
    });
    assert_eq!(lc.epoch(), 2);
    let c = ctx.clone();
    block_on(&ctx, async move {
        let t = lc
            .lock(&c, &[req(LOCK, 7)])
            .await
            .unwrap()
            .remove(0)
            .ticket()
            .unwrap();
        t.release().await.unwrap();
    });
    assert_eq!(table.words(LOCK), (1, 1, 7));
}

/// A restarted service grants nothing for its grace period (so that its predecessor's
/// tickets, which a coordinator acts on only within a shorter lease, have expired): a
/// Lock RPC is refused with [`LockError::Restarting`] and changes no lock, a client made
/// from its export refuses to read lock words as free, and after the grace both work.
/// Before the grace existed a restarted lockd granted at once.
#[test]
fn a_restarted_service_grants_nothing_during_its_grace() {
    let cl = cluster("grace");
    let fabric = cl.open(NodeId(SERVICE)).unwrap();
    let mut table = LockTable::with_epoch(&fabric, 16, Watermarks::default(), 2).unwrap();
    let grace = Duration::from_millis(300);
    table.set_grace(grace);
    let table = Arc::new(table);
    assert!(table.export()["grace_ms"].as_u64().unwrap() >= 299);
    let mut exports = BTreeMap::new();
    exports.insert(EXPORT_NAME.to_string(), table.export());
    let node = lockd_node(fabric, exports, table.handlers(), 1);
    let ctx = ThreadCtx::new(
        cl.open(NodeId(CLIENT)).unwrap(),
        runtime(Duration::from_secs(2)),
    )
    .unwrap();
    let t0 = Instant::now();
    let lc = Rc::new(LockClient::from_info(&ctx.connect_rpc(node.addr()).unwrap()).unwrap());
    assert!(lc.grace_left() > Duration::ZERO);
    let (c, l) = (ctx.clone(), lc.clone());
    let (refused, peek) = block_on(&ctx, async move {
        let r = l.lock(&c, &[req(LOCK, 5)]).await.map(|_| ()).unwrap_err();
        let p = l.peek_state(&c, LOCK).await.map(|_| ()).unwrap_err();
        (r, p)
    });
    assert!(matches!(refused, LockError::Restarting(_)), "{refused}");
    assert!(
        refused.to_string().contains("grants resume in"),
        "{refused}"
    );
    assert!(matches!(peek, LockError::Restarting(_)), "{peek}");
    assert_eq!(
        table.words(LOCK),
        (0, 0, 0),
        "a refused request changed the lock"
    );
    // Release-node is served during the grace (recovery of a dead holder needs it).
    let (c, l) = (ctx.clone(), lc.clone());
    let dead = Owner {
        node: 7,
        incarnation: 1,
    };
    let n = block_on(&ctx, async move { l.release_node(&c, dead).await.unwrap() });
    assert_eq!(n, 0);
    std::thread::sleep(grace.saturating_sub(t0.elapsed()) + Duration::from_millis(20));
    let (c, l) = (ctx.clone(), lc.clone());
    block_on(&ctx, async move {
        let t = l
            .lock(&c, &[req(LOCK, 6)])
            .await
            .unwrap()
            .remove(0)
            .ticket()
            .unwrap();
        assert!(t.requested_at() >= t0);
        assert_eq!(l.peek_state(&c, LOCK).await.unwrap().queued(), 1);
        t.release().await.unwrap();
    });
    assert_eq!(table.words(LOCK), (1, 1, 6));
}

/// A `lockd` process on the shm fabric, its stdout lines before `READY` kept; SIGKILLed
/// and reaped when dropped.
struct Lockd {
    child: std::process::Child,
    before: Vec<String>,
    addr: std::net::SocketAddr,
}

impl Lockd {
    /// Start `lockd` with `args`; `None` if it exited before `READY` (its stderr is in
    /// `err`). The child's output ends when it exits, which ends the wait.
    fn spawn(cluster: &str, args: &[&str], err: &std::path::Path) -> Option<Self> {
        use std::io::BufRead as _;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_lockd"))
            .args(["--cluster", cluster])
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(err).unwrap())
            .spawn()
            .unwrap();
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut before = Vec::new();
        for l in out.lines().map_while(Result::ok) {
            if let Some(a) = l.strip_prefix("READY ") {
                let addr = a.trim().parse().unwrap();
                return Some(Self {
                    child,
                    before,
                    addr,
                });
            }
            before.push(l);
        }
        let _ = child.wait();
        None
    }

    fn epoch(&self) -> u64 {
        let l = self
            .before
            .iter()
            .rev()
            .find_map(|l| l.strip_prefix("EPOCH "));
        l.expect("an EPOCH line").trim().parse().unwrap()
    }
}

impl Drop for Lockd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `lockd` binary with a state directory: each start opens a larger epoch; a second
/// `lockd` on the directory fails at start; after SIGKILL and restart, the old client is
/// refused or finds the node gone, reconnects with backoff, and locks in the new table,
/// which its old ticket never touched.
#[test]
fn a_sigkilled_lockd_restarts_in_a_larger_epoch_and_its_clients_reconnect() {
    let cl = cluster("bin");
    let dir = std::env::temp_dir().join(format!("lockd-faults-state-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let err = dir.with_extension("err");
    let state = dir.to_str().unwrap();
    let args = ["--node", "21", "--locks", "8", "--state-dir", state];
    let first = Lockd::spawn(cl.name(), &args, &err).expect("lockd starts");
    assert_eq!(first.epoch(), 1);
    let again = ["--node", "22", "--locks", "8", "--state-dir", state];
    assert!(
        Lockd::spawn(cl.name(), &again, &err).is_none(),
        "a second lockd on the state directory started"
    );
    let msg = std::fs::read_to_string(&err).unwrap();
    assert!(msg.contains("in use"), "{msg}");

    let ctx = ThreadCtx::new(
        cl.open(NodeId(CLIENT)).unwrap(),
        runtime(Duration::from_secs(2)),
    )
    .unwrap();
    let mut lc = LockClient::from_info(&ctx.connect_rpc(first.addr).unwrap()).unwrap();
    lc.set_release_wait(Duration::from_secs(1));
    assert_eq!(lc.epoch(), 1);
    let lc = Rc::new(lc);
    let (c, l) = (ctx.clone(), lc.clone());
    let held = block_on(&ctx, async move {
        l.lock(&c, &[req(LOCK, 5)])
            .await
            .unwrap()
            .remove(0)
            .ticket()
            .unwrap()
    });
    // A second ticket of the first epoch, still held after the client reconnected.
    let (c, l) = (ctx.clone(), lc.clone());
    let stale = block_on(&ctx, async move {
        l.lock(&c, &[req(LOCK2, 5)])
            .await
            .unwrap()
            .remove(0)
            .ticket()
            .unwrap()
    });
    drop(first);

    let second = Lockd::spawn(cl.name(), &args, &err).expect("lockd restarts");
    assert_eq!(second.epoch(), 2);
    let (c, l) = (ctx.clone(), lc.clone());
    let e = block_on(&ctx, async move {
        l.lock(&c, &[req(LOCK, 6)]).await.unwrap_err()
    });
    assert!(
        matches!(e, LockError::Rpc(_) | LockError::Restarted(_)),
        "{e}"
    );
    let c = ctx.clone();
    let r = block_on(&ctx, async move {
        let r = held.release().await;
        drop(c);
        r
    });
    assert!(r.is_err(), "an old ticket's release succeeded");
    let mut lc = Rc::try_unwrap(lc).ok().expect("one owner");
    let (c, addr) = (ctx.clone(), second.addr);
    let lc = block_on(&ctx, async move {
        lc.reconnect(&c, addr).await.unwrap();
        lc
    });
    assert_eq!(lc.epoch(), 2);
    // The same addresses now name the new table, where lock LOCK2 is free at upper 0:
    // the stale ticket 0 must not pass it on (an FAA there would break the new queue).
    let c = ctx.clone();
    let r = block_on(&ctx, async move {
        let r = stale.release().await;
        drop(c);
        r
    });
    assert!(
        matches!(&r, Err(e) if e.service_gone()),
        "a stale ticket's release: {r:?}"
    );
    let c = ctx.clone();
    let st = block_on(&ctx, async move {
        let t = lc
            .lock(&c, &[req(LOCK, 7)])
            .await
            .unwrap()
            .remove(0)
            .ticket()
            .unwrap();
        assert_eq!(t.number(), 0, "a fresh table: the old ticket is not in it");
        t.release().await.unwrap();
        (
            lc.read_state(&c, LOCK).await.unwrap(),
            lc.read_state(&c, LOCK2).await.unwrap(),
        )
    });
    let (st, st2) = st;
    assert_eq!((st.lower, st.upper), (1, 1));
    assert_eq!(
        (st2.lower, st2.upper),
        (0, 0),
        "the stale ticket moved the new table"
    );
    drop(second);
    let _ = std::fs::remove_file(&err);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The bound learned from a real oracle ([`lockd::tso_bound::TsoBound`] reading its
/// counter): a timestamp the oracle handed out is accepted, one it has not issued yet is
/// refused (the lock unchanged), and accepted once the oracle has issued it.
#[test]
fn timestamps_the_oracle_has_not_issued_are_refused() {
    let cl = cluster("tso");
    let tso_fabric = cl.open(NodeId(30)).unwrap();
    let oracle = tso::Oracle::new(&tso_fabric).unwrap();
    let tso_node = oracle
        .serve(tso_fabric, "127.0.0.1:0".parse().unwrap())
        .unwrap();
    let fabric = cl.open(NodeId(SERVICE)).unwrap();
    let mut table = LockTable::new(&fabric, 16, Watermarks::default()).unwrap();
    let bound =
        lockd::tso_bound::TsoBound::start(fabric.clone(), tso_node.addr(), Duration::from_secs(5))
            .unwrap();
    table.set_ts_bound(Box::new(bound));

    let ctx = ThreadCtx::new(
        cl.open(NodeId(CLIENT)).unwrap(),
        runtime(Duration::from_secs(5)),
    )
    .unwrap();
    let tc = Rc::new(tso::TsoClient::from_info(&ctx.connect(tso_node.addr()).unwrap()).unwrap());
    let take = |n: u64| {
        let (c, t) = (ctx.clone(), tc.clone());
        block_on(&ctx, async move {
            t.timestamps(&c, n).await.unwrap().last_ts().unwrap().get()
        })
    };
    let me = owner(7, 1);
    let mut out = Vec::new();
    let issued = take(1);
    table
        .handle(&payload(me, 1, &[req(LOCK, issued)]), &mut out)
        .unwrap();
    assert_eq!(table.words(LOCK).2, issued);
    let ahead = issued + 1_000;
    let e = table
        .handle(&payload(me, 2, &[req(4, ahead)]), &mut out)
        .unwrap_err();
    assert!(e.contains("above the issued bound"), "{e}");
    assert_eq!(table.words(4), (0, 0, 0));
    assert!(take(1_000) >= ahead);
    table
        .handle(&payload(me, 3, &[req(4, ahead)]), &mut out)
        .unwrap();
    assert_eq!(table.words(4).0, 1);
    drop(table);
    drop(tso_node);
    drop(oracle);
}

/// `LockConn` follows the service at its address across a restart: the first Lock RPC
/// after it fails (the transaction's tickets died with the old table) and reconnects;
/// the next one is served by the new service.
#[test]
fn a_lock_conn_follows_a_restarted_service_at_its_address() {
    let cl = cluster("conn");
    let start = |epoch, listen: std::net::SocketAddr| {
        let fabric = cl.open(NodeId(SERVICE)).unwrap();
        let table =
            Arc::new(LockTable::with_epoch(&fabric, 16, Watermarks::default(), epoch).unwrap());
        let mut exports = BTreeMap::new();
        exports.insert(EXPORT_NAME.to_string(), table.export());
        let node = rrpc::node::Node::start(
            fabric,
            rrpc::node::NodeConfig::new("lockd", listen)
                .with_exports(exports)
                .rpc(table.handlers(), 1),
        )
        .unwrap();
        (table, node)
    };
    let (old_table, old_node) = start(1, "127.0.0.1:0".parse().unwrap());
    let addr = old_node.addr();
    let ctx = ThreadCtx::new(
        cl.open(NodeId(CLIENT)).unwrap(),
        runtime(Duration::from_secs(2)),
    )
    .unwrap();
    let conn = Rc::new(lockd::client::LockConn::new(
        addr,
        LockClient::from_info(&ctx.connect_rpc(addr).unwrap()).unwrap(),
    ));
    let (c, k) = (ctx.clone(), conn.clone());
    block_on(&ctx, async move {
        let t = k
            .lock(&c, &[req(LOCK, 5)])
            .await
            .unwrap()
            .remove(0)
            .ticket()
            .unwrap();
        t.release().await.unwrap();
    });
    drop(old_node);
    drop(old_table);
    let (table, _node) = start(2, addr);
    let (c, k) = (ctx.clone(), conn.clone());
    let e = block_on(&ctx, async move {
        k.lock(&c, &[req(LOCK, 6)]).await.unwrap_err()
    });
    assert!(
        matches!(e, LockError::Rpc(_) | LockError::Restarted(_)),
        "{e}"
    );
    assert_eq!(conn.client().epoch(), 2, "reconnected to the new service");
    let (c, k) = (ctx.clone(), conn.clone());
    block_on(&ctx, async move {
        let t = k
            .lock(&c, &[req(LOCK, 7)])
            .await
            .unwrap()
            .remove(0)
            .ticket()
            .unwrap();
        t.release().await.unwrap();
    });
    assert_eq!(table.words(LOCK), (1, 1, 7));
}
