//! Takeout Lock's `queued_ts` across a restart of the timestamp oracle (Scythe 4.3 and
//! 4.5: `queued_ts` must keep working across a restart of the oracle).
//!
//! A Lock RPC is refused when its timestamp is below the lock's `queued_ts` (the largest
//! timestamp queued so far). Timestamps come from the oracle; if a restarted oracle
//! started counting again from 1, every lock that had seen traffic would refuse every
//! request until the new counter caught up, and queues would stop being ordered by
//! timestamp. With the oracle's epoch in the high bits (`tso::epoch`) the restarted
//! oracle's timestamps are larger than every `queued_ts` set before, so:
//!
//! - a request after the restart queues behind a holder from before the restart, and
//!   they are served in timestamp order;
//! - a request still carrying a pre-restart timestamp is refused (it is older);
//! - a client's [`tso::TsoConn`] follows the oracle to its new epoch, and refuses an
//!   oracle that came back without a larger one; that oracle's timestamps are exactly
//!   those lockd would refuse, which the last part shows.
//!
//! The lock service and the oracle run in this process over the shm fabric; the oracle
//! is "killed" by dropping its node and counter (its MR is deregistered, so the client's
//! FAAs on the old counter fail as on a dead peer) and restarted under the same node id,
//! at the same address, from the same state directory.

use rrpc::NodeId;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockd::client::{Grant, LockClient, LockRequest, Mode, RefuseReason, Ticket};
use lockd::service::{LockTable, EXPORT_NAME};
use lockd::takeout::Watermarks;
use rrpc::fabric::shm::ClusterGuard;
use rrpc::node::Node;
use rrpc::runtime::{block_on, RuntimeConfig, ThreadCtx};
use tso::{Oracle, ReconnectConfig, Timestamp, TsoClient, TsoConn, TsoError};

mod common;
use common::lockd_node;

const LOCKD_NODE: u32 = 1;
const TSO_NODE: u32 = 3;
const CLIENT_NODE: u32 = 100;
const LOCK: u64 = 7;

/// An oracle incarnation: its node (control plane, export) and its counter. Dropping it
/// is the oracle's death: the counter's MR is deregistered, its node id freed.
struct Incarnation {
    node: Node,
    _oracle: Oracle,
}

/// Start an oracle as node [`TSO_NODE`] at `listen`, in the next epoch of `state` (as
/// the `tso` binary does), or in `epoch` when given (an oracle that ignores its state).
fn start_oracle(
    cluster: &ClusterGuard,
    listen: SocketAddr,
    state: &Path,
    epoch: Option<u16>,
) -> Incarnation {
    let fabric = cluster.open(NodeId(TSO_NODE)).unwrap();
    let epoch = epoch.unwrap_or_else(|| tso::epoch::advance(state).unwrap());
    let oracle = Oracle::with_epoch(&fabric, epoch).unwrap();
    let node = oracle.serve(fabric, listen).unwrap();
    Incarnation {
        node,
        _oracle: oracle,
    }
}

async fn lock(ctx: &Rc<ThreadCtx>, lc: &LockClient, ts: Timestamp) -> Grant {
    let req = LockRequest {
        id: LOCK,
        ts: ts.get(),
        mode: Mode::Hot,
    };
    lc.lock(ctx, &[req]).await.expect("lock RPC").remove(0)
}

fn queued(g: Grant) -> Ticket {
    match g {
        Grant::Queued(t) => t,
        Grant::Refused(r) => panic!("refused: {r:?}"),
    }
}

/// Runs `f` on its own thread; fails instead of hanging if it takes over 120 s.
fn with_watchdog(f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(()) => h.join().unwrap(),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            // The test panicked: re-raise its panic.
            if let Err(p) = h.join() {
                std::panic::resume_unwind(p);
            }
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("watchdog: test hung"),
    }
}

#[test]
fn queued_ts_orders_requests_across_an_oracle_restart() {
    with_watchdog(queued_ts_across_restart);
}

fn queued_ts_across_restart() {
    let name = format!("lockd-test-{}-tso-restart", std::process::id());
    let (cluster, _) = ClusterGuard::new(&name).unwrap();
    let state = std::env::temp_dir().join(format!("lockd-tso-restart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&state);

    let lockd_fabric = cluster.open(NodeId(LOCKD_NODE)).unwrap();
    let table = Arc::new(LockTable::new(&lockd_fabric, 64, Watermarks::default()).unwrap());
    let mut exports = BTreeMap::new();
    exports.insert(EXPORT_NAME.to_string(), table.export());
    let lockd = lockd_node(lockd_fabric, exports, table.handlers(), 1);

    let first = start_oracle(&cluster, "127.0.0.1:0".parse().unwrap(), &state, None);
    let tso_addr = first.node.addr();

    let ctx = ThreadCtx::new(
        cluster.open(NodeId(CLIENT_NODE)).unwrap(),
        RuntimeConfig::default(),
    )
    .unwrap();
    let lc = Rc::new(LockClient::from_info(&ctx.connect_rpc(lockd.addr()).unwrap()).unwrap());
    let cfg = ReconnectConfig::default()
        .with_wait(Duration::from_secs(20))
        .with_retry_interval(Duration::from_millis(5));
    let tso = Rc::new(TsoConn::connect(ctx.clone(), tso_addr, cfg).unwrap());
    assert_eq!(tso.client().epoch(), 1);

    // Before the restart: traffic on the lock; the last request holds it.
    let (c, l, t) = (ctx.clone(), lc.clone(), tso.clone());
    let (before, holder) = block_on(&ctx, async move {
        let mut seen = Vec::new();
        for _ in 0..20 {
            let ts = t.timestamp().await.unwrap();
            let mut k = queued(lock(&c, &l, ts).await);
            k.wait(Instant::now() + Duration::from_secs(10))
                .await
                .unwrap();
            k.release().await.unwrap();
            seen.push(ts);
        }
        let ts = t.timestamp().await.unwrap();
        let mut k = queued(lock(&c, &l, ts).await);
        k.wait(Instant::now() + Duration::from_secs(10))
            .await
            .unwrap();
        seen.push(ts);
        (seen, k)
    });
    let max_before = *before.iter().max().unwrap();
    let (c, l) = (ctx.clone(), lc.clone());
    let st = block_on(&ctx, async move { l.read_state(&c, LOCK).await.unwrap() });
    assert_eq!(
        st.queued_ts,
        max_before.get(),
        "queued_ts is the last timestamp"
    );
    assert_eq!(st.queued(), 1, "the holder");

    // The oracle dies and comes back from the same state directory at the same address.
    drop(first);
    let second = start_oracle(&cluster, tso_addr, &state, None);

    let (c, l, t) = (ctx.clone(), lc.clone(), tso.clone());
    let stale = before[0];
    let (after, order) = block_on(&ctx, async move {
        // The same connection follows the oracle to its new epoch.
        let ts = t.timestamp().await.unwrap();
        assert_eq!(t.client().epoch(), 2);
        assert_eq!(t.reconnects(), 1);
        assert_eq!(ts.epoch(), 2);
        // Accepted behind the pre-restart holder (hot mode queues).
        let g = lock(&c, &l, ts).await;
        let ahead = g.reply().ahead();
        let mut waiter = queued(g);
        assert_eq!(ahead, 1, "queued behind the holder from before the restart");
        assert!(!waiter.is_served());
        // A request still carrying a pre-restart timestamp is older: refused.
        match lock(&c, &l, stale).await {
            Grant::Refused(r) => assert_eq!(r.reason, Some(RefuseReason::Timestamp)),
            Grant::Queued(_) => panic!("a pre-restart timestamp queued after a newer one"),
        }
        // Served in timestamp order: the holder first, then the post-restart request.
        let holder = holder;
        holder.release().await.unwrap();
        waiter
            .wait(Instant::now() + Duration::from_secs(10))
            .await
            .unwrap();
        let order = vec![max_before, ts];
        waiter.release().await.unwrap();
        let mut after = vec![ts];
        for _ in 0..20 {
            let ts = t.timestamp().await.unwrap();
            let mut k = queued(lock(&c, &l, ts).await);
            k.wait(Instant::now() + Duration::from_secs(10))
                .await
                .unwrap();
            k.release().await.unwrap();
            after.push(ts);
        }
        (after, order)
    });
    let min_after = *after.iter().min().unwrap();
    assert!(
        min_after > max_before,
        "after the restart {min_after} <= before {max_before}"
    );
    assert!(order[0] < order[1]);
    let (c, l) = (ctx.clone(), lc.clone());
    let st = block_on(&ctx, async move { l.read_state(&c, LOCK).await.unwrap() });
    assert_eq!(st.queued_ts, after.iter().max().unwrap().get());
    assert_eq!(st.queued(), 0);

    // An oracle that comes back without a larger epoch (its state ignored): the
    // connection refuses it rather than hand out timestamps that go back...
    drop(second);
    let volatile = start_oracle(&cluster, tso_addr, &state, Some(0));
    let t = tso.clone();
    let r = block_on(&ctx, async move { t.timestamp().await });
    assert!(
        matches!(r, Err(TsoError::WentBack { old: 2, new: 0, .. })),
        "{r:?}"
    );
    // ... and those timestamps are exactly what lockd refuses: behind queued_ts. (A
    // fresh client, without the connection's check.)
    let raw_ctx = ThreadCtx::new(
        cluster.open(NodeId(CLIENT_NODE + 1)).unwrap(),
        RuntimeConfig::default(),
    )
    .unwrap();
    let raw = TsoClient::from_info(&raw_ctx.connect(tso_addr).unwrap()).unwrap();
    assert_eq!(raw.epoch(), 0);
    let raw_lc = LockClient::from_info(&raw_ctx.connect_rpc(lockd.addr()).unwrap()).unwrap();
    let c = raw_ctx.clone();
    let (ts, g) = block_on(&raw_ctx, async move {
        let ts = raw.timestamp(&c).await.unwrap();
        (ts, lock(&c, &raw_lc, ts).await)
    });
    assert!(ts < min_after, "{ts} from epoch 0");
    match g {
        Grant::Refused(r) => assert_eq!(r.reason, Some(RefuseReason::Timestamp)),
        Grant::Queued(_) => panic!("a timestamp below queued_ts was queued"),
    }

    drop(raw_ctx);
    drop(ctx);
    drop(volatile);
    drop(lockd);
    let _ = std::fs::remove_dir_all(&state);
}
