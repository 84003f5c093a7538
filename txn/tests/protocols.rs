//! The three protocols on an in-process cluster over the shm fabric (memory nodes, a lock
//! service and a timestamp oracle in this process, each on its own fabric node):
//! inserts, deletes, lost updates, MVCC snapshots and GC, concurrent inserts of one key,
//! Scythe's switch to TOCC at the round that meets a hot object.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::Future;
use std::rc::Rc;
use std::time::{Duration, Instant};

use lockd::client::LockRequest;
use lockd::embed::{LockService, LockServiceConfig};
use lockd::takeout::Mode;
use rrpc::fabric::shm::ClusterGuard;
use rrpc::fabric::{Fabric, FabricConfig, FabricKind, MemoryRegion};
use rrpc::node::{Node, NodeConfig};
use rrpc::runtime::{block_on, join_all, RuntimeConfig, ThreadCtx};
use rrpc::NodeId;
use txn::coordinator::{
    AbortReason, ClusterAddrs, Isolation, Protocol, TxnClient, TxnConfig, TxnError,
};
use txn::cvt_remote::{MemnodeExport, EXPORT_KEY};
use txn::smallbank::{initial_balance, CHECKING, SAVINGS};

const ACCOUNTS: u64 = 200;
const ALL: [Protocol; 4] = [
    Protocol::OccCas,
    Protocol::Scythe,
    Protocol::Mvcc(Isolation::Serializable),
    Protocol::Mvcc(Isolation::Snapshot),
];

struct Cluster {
    guard: ClusterGuard,
    addrs: ClusterAddrs,
    next_node: Cell<u32>,
    _mem: Vec<(Node, Vec<[MemoryRegion; 3]>)>,
    _lockd: LockService,
    _tso: (tso::Oracle, Node),
}

fn fabric(name: &str, node: u32) -> Fabric {
    Fabric::open(&FabricConfig::new(FabricKind::Shm, name, NodeId(node))).unwrap()
}

/// SmallBank's tables with `versions` cells, over `partitions` memory nodes.
fn cluster(test: &str, partitions: u32, versions: usize) -> Cluster {
    let (guard, _) = ClusterGuard::new(&format!("proto-{test}-{}", std::process::id())).unwrap();
    let name = guard.name().to_string();
    let mut mem = Vec::new();
    let mut memnodes = Vec::new();
    for p in 0..partitions {
        let f = fabric(&name, 1 + p);
        let loaded = txn::smallbank::load(&f, ACCOUNTS, versions, p, partitions).unwrap();
        let (tables, regions): (Vec<_>, Vec<_>) = loaded.into_iter().unzip();
        let export = MemnodeExport {
            partition: p,
            partitions,
            tables,
            replicas: 1,
            backups: Vec::new(),
            spare: false,
            log: None,
            undo: None,
        };
        let mut exports = BTreeMap::new();
        exports.insert(EXPORT_KEY.into(), serde_json::to_value(&export).unwrap());
        let node = Node::start(
            f,
            NodeConfig::new("memnode", "127.0.0.1:0".parse().unwrap()).with_exports(exports),
        )
        .unwrap();
        memnodes.push(node.addr());
        mem.push((node, regions));
    }
    let lockd = LockService::start(
        fabric(&name, 20),
        "127.0.0.1:0".parse().unwrap(),
        &LockServiceConfig::default().with_locks(4 * ACCOUNTS),
    )
    .unwrap();
    let tf = fabric(&name, 21);
    // Epoch 1: every timestamp lies above the loaded version.
    let oracle = tso::Oracle::with_epoch(&tf, 1).unwrap();
    let tso_node = oracle.serve(tf, "127.0.0.1:0".parse().unwrap()).unwrap();
    Cluster {
        addrs: ClusterAddrs {
            memnodes,
            lockd: Some(lockd.addr()),
            tso: tso_node.addr(),
        },
        guard,
        next_node: Cell::new(100),
        _mem: mem,
        _lockd: lockd,
        _tso: (oracle, tso_node),
    }
}

impl Cluster {
    /// A client thread context on a node of its own.
    fn client(&self, protocol: Protocol) -> Rc<TxnClient> {
        self.client_with(
            TxnConfig::default()
                .with_protocol(protocol)
                .with_history_limit_bytes(Some(64 << 20))
                .with_read_wait(Duration::from_millis(5)),
        )
    }

    /// A client thread context on a node of its own, with `cfg`.
    fn client_with(&self, cfg: TxnConfig) -> Rc<TxnClient> {
        let n = self.next_node.get();
        self.next_node.set(n + 1);
        let ctx = ThreadCtx::new(fabric(self.guard.name(), n), RuntimeConfig::default()).unwrap();
        Rc::new(TxnClient::connect(ctx, &self.addrs, cfg).unwrap())
    }
}

fn run<T: 'static>(c: &Rc<TxnClient>, f: impl Future<Output = T> + 'static) -> T {
    block_on(&c.ctx().clone(), f)
}

fn bal(v: &[u8]) -> i64 {
    i64::from_le_bytes(v.try_into().unwrap())
}

/// Retry `body` on aborts (with a short randomized pause) until it commits or fails.
async fn retry<F, Fut>(c: &TxnClient, mut body: F) -> Result<u32, TxnError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), TxnError>>,
{
    let mut aborts = 0;
    loop {
        match body().await {
            Ok(()) => return Ok(aborts),
            Err(TxnError::Abort(r)) if r != AbortReason::User => {
                aborts += 1;
                let pause = 1 + (aborts as u64 * 7919) % 40;
                c.ctx().sleep(Duration::from_micros(pause)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

#[test]
fn every_protocol_inserts_reads_deletes_and_inserts_again() {
    for (i, p) in ALL.into_iter().enumerate() {
        let cl = cluster(&format!("ins{i}"), 2, 3);
        let c = cl.client(p);
        let c2 = c.clone();
        run(&c, async move {
            let c = &*c2;
            let key = ACCOUNTS + 17;
            // Absent at first.
            let mut t = c.begin();
            assert!(matches!(
                t.read(SAVINGS, key).await,
                Err(TxnError::NotFound { .. })
            ));
            assert_eq!(t.get_many(&[(SAVINGS, key)]).await.unwrap(), vec![None]);
            t.commit().await.unwrap();
            // An insert that aborts leaves nothing behind.
            retry(c, || async {
                let mut t = c.begin();
                t.insert(SAVINGS, key, 5i64.to_le_bytes().to_vec()).await?;
                let _ = t.abort().await;
                Ok(())
            })
            .await
            .unwrap();
            let mut t = c.begin();
            assert_eq!(
                t.get_many(&[(SAVINGS, key)]).await.unwrap(),
                vec![None],
                "{p}"
            );
            t.commit().await.unwrap();
            // Insert, then read it back in a new transaction.
            retry(c, || async {
                let mut t = c.begin();
                t.insert(SAVINGS, key, 7i64.to_le_bytes().to_vec()).await?;
                t.commit().await
            })
            .await
            .unwrap();
            let mut t = c.begin();
            assert_eq!(bal(&t.read(SAVINGS, key).await.unwrap()), 7, "{p}");
            assert!(matches!(
                t.insert(SAVINGS, key, vec![0; 8]).await,
                Err(TxnError::Exists { .. })
            ));
            drop(t);
            // Delete, then it is gone; insert again.
            retry(c, || async {
                let mut t = c.begin();
                t.delete(SAVINGS, key).await?;
                t.commit().await
            })
            .await
            .unwrap();
            let mut t = c.begin();
            assert!(matches!(
                t.read(SAVINGS, key).await,
                Err(TxnError::NotFound { .. })
            ));
            t.commit().await.unwrap();
            assert_eq!(c.read_committed(SAVINGS, key).await.unwrap(), None);
            retry(c, || async {
                let mut t = c.begin();
                t.insert(SAVINGS, key, 9i64.to_le_bytes().to_vec()).await?;
                t.commit().await
            })
            .await
            .unwrap();
            let (_, v) = c.read_committed(SAVINGS, key).await.unwrap().unwrap();
            assert_eq!(bal(&v), 9, "{p}");
            assert!(
                !c.cvt_locked(SAVINGS, key).await.unwrap(),
                "{p}: lock left held"
            );
            // The loaded data is untouched.
            let (_, v) = c.read_committed(CHECKING, 3).await.unwrap().unwrap();
            assert_eq!(bal(&v), initial_balance(CHECKING, 3));
        });
        let h = c.take_history().unwrap();
        assert!(txn::serializability::check(&h).is_serializable(), "{p}");
    }
}

/// Two threads of coroutines increment three hot balances; every committed increment
/// must be in the final balances (no lost update), and the histories must pass the
/// checks of the protocol's isolation level.
#[test]
fn concurrent_increments_lose_no_update() {
    for (i, p) in ALL.into_iter().enumerate() {
        let cl = cluster(&format!("inc{i}"), 2, 2);
        let cl = Rc::new(cl);
        let commits = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let histories = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|tid| {
                    let addrs = cl.addrs.clone();
                    let name = cl.guard.name().to_string();
                    let commits = commits.clone();
                    s.spawn(move || {
                        let ctx =
                            ThreadCtx::new(fabric(&name, 200 + tid), RuntimeConfig::default())
                                .unwrap();
                        let cfg = TxnConfig::default()
                            .with_protocol(p)
                            .with_history_limit_bytes(Some(64 << 20));
                        let c = Rc::new(TxnClient::connect(ctx.clone(), &addrs, cfg).unwrap());
                        let c2 = c.clone();
                        block_on(&ctx, async move {
                            let until = Instant::now() + Duration::from_millis(300);
                            let done = Rc::new(Cell::new(0u64));
                            join_all((0..8u64).map(|co| {
                                let (c, done) = (c2.clone(), done.clone());
                                async move {
                                    let mut n = co;
                                    while Instant::now() < until {
                                        n += 1;
                                        let key = n % 3;
                                        let r = retry(&c, || async {
                                            let mut t = c.begin();
                                            let v = t.read_for_update(CHECKING, key).await?;
                                            // A read-only read of another hot object.
                                            t.read(SAVINGS, (key + 1) % 3).await?;
                                            t.write(
                                                CHECKING,
                                                key,
                                                (bal(&v) + 1).to_le_bytes().to_vec(),
                                            )?;
                                            t.commit().await
                                        })
                                        .await;
                                        r.unwrap();
                                        done.set(done.get() + 1);
                                    }
                                }
                            }))
                            .await;
                            commits.fetch_add(done.get(), std::sync::atomic::Ordering::Relaxed);
                        });
                        c.take_history().unwrap()
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        });
        let c = cl.client(p);
        let c2 = c.clone();
        let total = run(&c, async move {
            let mut sum = 0;
            for k in 0..3 {
                let (_, v) = c2.read_committed(CHECKING, k).await.unwrap().unwrap();
                sum += bal(&v) - initial_balance(CHECKING, k);
                assert!(!c2.cvt_locked(CHECKING, k).await.unwrap(), "lock left held");
            }
            sum
        });
        let n = commits.load(std::sync::atomic::Ordering::Relaxed);
        assert!(n > 20, "{p}: only {n} commits");
        assert_eq!(total as u64, n, "{p}: increments lost");
        let mut h = txn::history::History::new(usize::MAX);
        for x in histories {
            h.append(x);
        }
        assert_eq!(h.len() as u64, n);
        match p {
            Protocol::Mvcc(Isolation::Snapshot) => {
                let v = txn::snapshot_isolation::check(&h);
                assert!(v.holds(), "{p}: {v}");
            }
            _ => {
                let v = txn::serializability::check(&h);
                assert!(v.is_serializable(), "{p}: {v}");
            }
        }
        if let Protocol::Mvcc(_) = p {
            let v = txn::snapshot_isolation::check(&h);
            assert!(v.holds(), "{p}: {v}");
        }
    }
}

/// MVCC: a transaction keeps reading its snapshot while newer versions commit, and a
/// snapshot older than every kept version aborts (GC reused its cell).
#[test]
fn mvcc_reads_its_snapshot_and_aborts_once_gc_took_it() {
    let cl = cluster("snap", 1, 2);
    // One client runs both transactions (a thread's executor drives one client).
    let old = cl.client(Protocol::Mvcc(Isolation::Snapshot));
    let (o2, w2) = (old.clone(), old.clone());
    run(&old, async move {
        let mut reader = o2.begin();
        let a0 = bal(&reader.read(SAVINGS, 1).await.unwrap());
        // A writer updates both balances of account 1.
        let write = |d: i64| {
            let w = w2.clone();
            async move {
                let mut t = w.begin();
                let v = t
                    .read_many_for_update(&[(SAVINGS, 1), (CHECKING, 1)])
                    .await?;
                t.write(SAVINGS, 1, (bal(&v[0]) + d).to_le_bytes().to_vec())?;
                t.write(CHECKING, 1, (bal(&v[1]) + d).to_le_bytes().to_vec())?;
                t.commit().await
            }
        };
        write(100).await.unwrap();
        // The reader's snapshot predates it: old checking balance, same savings.
        let c0 = bal(&reader.read(CHECKING, 1).await.unwrap());
        assert_eq!(c0, initial_balance(CHECKING, 1));
        assert_eq!(bal(&reader.read(SAVINGS, 1).await.unwrap()), a0);
        reader.commit().await.unwrap();
        // Two versions per CVT: after two more writes the loaded version is gone.
        let mut stale = o2.begin();
        stale.read(SAVINGS, 2).await.unwrap(); // takes the start timestamp
        write(1).await.unwrap();
        write(1).await.unwrap();
        assert!(matches!(
            stale.read(CHECKING, 1).await,
            Err(TxnError::Abort(AbortReason::VersionGone))
        ));
        // A fresh reader sees the newest.
        let mut t = o2.begin();
        assert_eq!(
            bal(&t.read(CHECKING, 1).await.unwrap()),
            initial_balance(CHECKING, 1) + 102
        );
        t.commit().await.unwrap();
    });
    let v = txn::snapshot_isolation::check(&old.take_history().unwrap());
    assert!(v.holds(), "{v}");
}

/// Many coordinators insert the same new key at once: exactly one insert commits, the
/// others see it (Exists) or abort and retry into Exists, and the key has one CVT.
#[test]
fn concurrent_inserts_of_one_key_commit_once() {
    for (i, p) in ALL.into_iter().enumerate() {
        let cl = cluster(&format!("race{i}"), 1, 2);
        let c = cl.client(p);
        let c2 = c.clone();
        let wins = run(&c, async move {
            let wins = Rc::new(RefCell::new(Vec::new()));
            join_all((0..16i64).map(|co| {
                let (c, wins) = (c2.clone(), wins.clone());
                async move {
                    let r = retry(&c, || async {
                        let mut t = c.begin();
                        t.insert(CHECKING, 5000, co.to_le_bytes().to_vec()).await?;
                        t.commit().await
                    })
                    .await;
                    match r {
                        Ok(_) => wins.borrow_mut().push(co),
                        Err(TxnError::Exists { .. }) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
            }))
            .await;
            let (_, v) = c2.read_committed(CHECKING, 5000).await.unwrap().unwrap();
            let w = wins.borrow().clone();
            assert_eq!(w.len(), 1, "{w:?}");
            assert_eq!(bal(&v), w[0]);
            w
        });
        assert_eq!(wins.len(), 1, "{p}");
    }
}

/// Scythe acts on a Takeout ticket only within its lease from the Lock RPC
/// (`TxnConfig::ticket_lease`; a restarted lock service grants nothing for longer): a
/// commit whose ticket is older aborts with `ticket-expired` before it writes, and passes
/// its tickets on. With a zero lease every read-write commit does; with the default one
/// the same commit goes through.
#[test]
fn scythe_does_not_write_under_an_expired_ticket() {
    let cl = cluster("ticket-lease", 1, 2);
    let expired = cl.client_with(
        TxnConfig::default()
            .with_protocol(Protocol::Scythe)
            .with_ticket_lease(Duration::ZERO),
    );
    let c = cl.client(Protocol::Scythe);
    let key = 11u64;
    // Each client runs on its own executor (one `run` each).
    let c2 = c.clone();
    let before = run(&c, async move {
        c2.read_committed(CHECKING, key).await.unwrap().unwrap().1
    });
    let e2 = expired.clone();
    let e = run(&expired, async move {
        let mut t = e2.begin();
        let v = t.read(CHECKING, key).await.unwrap();
        t.write(CHECKING, key, (bal(&v) + 5).to_le_bytes().to_vec())
            .unwrap();
        t.commit().await.unwrap_err()
    });
    assert!(
        matches!(e, TxnError::Abort(AbortReason::TicketExpired)),
        "{e}"
    );
    let c2 = c.clone();
    run(&c, async move {
        let (_, after) = c2.read_committed(CHECKING, key).await.unwrap().unwrap();
        assert_eq!(bal(&after), bal(&before), "written under an expired ticket");
        // The lock was passed on: a client with the default lease commits.
        let mut t = c2.begin();
        let v = t.read(CHECKING, key).await.unwrap();
        t.write(CHECKING, key, (bal(&v) + 5).to_le_bytes().to_vec())
            .unwrap();
        t.commit().await.unwrap();
        let (_, after) = c2.read_committed(CHECKING, key).await.unwrap().unwrap();
        assert_eq!(bal(&after), bal(&before) + 5);
    });
}

/// Queue four tickets on lock `id` (more than ColdWatermark, 3), with timestamps of the
/// oracle:
/// `c` then sees the object hot and its lock held. The tickets are released in the
/// background after `hold`.
async fn hold_hot(c: &TxnClient, id: u64, hold: Duration) {
    let lc = c.locks().expect("a Scythe client");
    let mut held = Vec::new();
    for _ in 0..4 {
        let req = LockRequest {
            id,
            ts: c.timestamp().await.unwrap().get(),
            mode: Mode::Hot,
        };
        let g = lc.lock(c.ctx(), &[req]).await.unwrap().pop().unwrap();
        held.push(g.ticket().expect("queued"));
    }
    assert_eq!(lc.mode_for(id), Mode::Hot);
    let ctx = c.ctx().clone();
    c.ctx().spawn(async move {
        ctx.sleep(hold).await;
        for t in held {
            t.release().await.unwrap();
        }
    });
}

/// Scythe (4.2.1 (1), 4.3 (3)): an attempt whose first round is
/// cold and whose second round meets an object the lock service reported hot switches
/// to TOCC at that round: it queues behind the object's holders instead of aborting on
/// locked-on-read, and commits at its first attempt. An object read in OCC before the
/// switch and written by another transaction meanwhile aborts the switch.
#[test]
fn scythe_switches_to_tocc_at_the_round_that_meets_a_hot_object() {
    let cl = cluster("tocc-switch", 1, 2);
    let c = cl.client(Protocol::Scythe);
    let c2 = c.clone();
    run(&c, async move {
        let c = &*c2;
        let (cold, hot) = ((SAVINGS, 7u64), (CHECKING, 9u64));
        assert_eq!(
            c.locks().unwrap().mode_for(c.lock_id(cold.0, cold.1)),
            Mode::Cold
        );
        hold_hot(c, c.lock_id(hot.0, hot.1), Duration::from_millis(20)).await;
        let mut t = c.begin();
        let s = t.read(cold.0, cold.1).await.unwrap();
        assert!(!t.hot_mode(), "the first round is cold: OCC");
        let v = t
            .read_for_update(hot.0, hot.1)
            .await
            .expect("TOCC queues for the held hot object");
        assert!(t.hot_mode(), "the second round met a hot object: TOCC");
        t.write(hot.0, hot.1, (bal(&v) + bal(&s)).to_le_bytes().to_vec())
            .unwrap();
        t.commit().await.unwrap();
        let (_, now) = c.read_committed(hot.0, hot.1).await.unwrap().unwrap();
        let want = initial_balance(CHECKING, 9) + initial_balance(SAVINGS, 7);
        assert_eq!(bal(&now), want);

        // The switch checks what OCC read before it: `cold` is read for update, then
        // another transaction writes it, then the hot round aborts the attempt. (The
        // other transaction begins first, so that its timestamp, taken with its first
        // read, is the older one and the switch's ticket on `cold` is granted.)
        hold_hot(c, c.lock_id(hot.0, hot.1), Duration::from_millis(20)).await;
        let mut other = c.begin();
        let x = other.read_for_update(cold.0, cold.1).await.unwrap();
        let mut t = c.begin();
        t.read_for_update(cold.0, cold.1).await.unwrap();
        other
            .write(cold.0, cold.1, (bal(&x) + 1).to_le_bytes().to_vec())
            .unwrap();
        other.commit().await.unwrap();
        assert!(matches!(
            t.read(hot.0, hot.1).await,
            Err(TxnError::Abort(AbortReason::ValidationVersion))
        ));
    });
    let v = txn::serializability::check(&c.take_history().unwrap());
    assert!(v.is_serializable(), "{v}");
}

/// Scythe (4.2.1 (1)): the mode is chosen per transaction when
/// it retries after an abort. An attempt that aborts on a row held by one other
/// transaction (not hot by the lock service's watermark) leaves that row hot for its
/// retry: the retry queues for it in TOCC and commits, where a fresh attempt would abort
/// on it again.
#[test]
fn scythe_retries_in_tocc_on_the_row_an_attempt_aborted_on() {
    let cl = cluster("tocc-retry", 1, 2);
    let c = cl.client(Protocol::Scythe);
    let c2 = c.clone();
    run(&c, async move {
        let c = &*c2;
        let row = (CHECKING, 5u64);
        let id = c.lock_id(row.0, row.1);
        let lc = c.locks().unwrap();
        // One holder: the queue is 1, below ColdWatermark, so the row is not hot.
        let req = LockRequest {
            id,
            ts: c.timestamp().await.unwrap().get(),
            mode: Mode::Cold,
        };
        let held = lc.lock(c.ctx(), &[req]).await.unwrap().pop().unwrap();
        let held = held.ticket().expect("queued");
        assert_eq!(lc.mode_for(id), Mode::Cold);
        let mut t = c.begin();
        assert!(matches!(
            t.read_for_update(row.0, row.1).await,
            Err(TxnError::Abort(AbortReason::LockedOnRead))
        ));
        let first = t.id();
        drop(t);
        // A fresh transaction still aborts on the held row ...
        let mut fresh = c.begin();
        assert!(matches!(
            fresh.read_for_update(row.0, row.1).await,
            Err(TxnError::Abort(AbortReason::LockedOnRead))
        ));
        drop(fresh);
        // ... the retry queues for it instead, and commits once the holder is gone.
        let ctx = c.ctx().clone();
        c.ctx().spawn(async move {
            ctx.sleep(Duration::from_millis(5)).await;
            held.release().await.unwrap();
        });
        let mut retry = c.begin_retry(0, first);
        let v = retry
            .read_for_update(row.0, row.1)
            .await
            .expect("the retry queues behind the holder");
        assert!(retry.hot_mode(), "the retry runs TOCC");
        retry
            .write(row.0, row.1, (bal(&v) + 1).to_le_bytes().to_vec())
            .unwrap();
        retry.commit().await.unwrap();
        let share = c.tocc_share();
        assert!(share[CHECKING as usize].1 >= 1, "{share:?}");
    });
}

/// The UNSAFE no-CAS MVCC variant (`TxnConfig::unsafe_no_lock_cas`, Lotus's Fig. 3
/// premise) writes an object another transaction holds the lock of without touching the
/// lock word: neither taking it nor, when it commits, releasing it (it posts two WRs
/// fewer per update: the lock CAS and the release CAS). The holder's lock
/// still stops a safe writer until the holder commits.
#[test]
fn mvcc_without_cas_never_writes_a_lock_word() {
    let cl = cluster("nocas", 1, 3);
    let (addrs, name) = (cl.addrs.clone(), cl.guard.name().to_string());
    let client = |node: u32, unsafe_no_lock_cas: bool| {
        let ctx = ThreadCtx::new(fabric(&name, node), RuntimeConfig::default()).unwrap();
        let cfg = TxnConfig::default()
            .with_protocol(Protocol::Mvcc(Isolation::Serializable))
            .with_unsafe_no_lock_cas(unsafe_no_lock_cas);
        Rc::new(TxnClient::connect(ctx, &addrs, cfg).unwrap())
    };
    let client = &client;
    let step = std::sync::Arc::new(std::sync::Barrier::new(2));
    std::thread::scope(|s| {
        // The holder: locks savings 1, waits for the others, commits.
        let hold = step.clone();
        s.spawn(move || {
            let step = hold;
            let h = client(300, false);
            let h2 = h.clone();
            run(&h, async move {
                let mut t = h2.begin();
                let v = bal(&t.read_for_update(SAVINGS, 1).await.unwrap());
                step.wait(); // locked
                step.wait(); // the others are done
                t.write(SAVINGS, 1, (v + 1).to_le_bytes().to_vec()).unwrap();
                t.commit().await.unwrap();
            });
        });
        s.spawn(move || {
            step.wait();
            // No CAS: the held lock does not stop it, and it commits.
            let u = client(301, true);
            let u2 = u.clone();
            run(&u, async move {
                let mut t = u2.begin();
                let v = bal(&t.read_for_update(SAVINGS, 1).await.unwrap());
                t.write(SAVINGS, 1, (v + 10).to_le_bytes().to_vec())
                    .unwrap();
                t.commit().await.unwrap();
            });
            // The lock word still holds the holder's id: a safe writer is refused.
            let w = client(302, false);
            let w2 = w.clone();
            run(&w, async move {
                let mut t = w2.begin();
                assert!(matches!(
                    t.read_for_update(SAVINGS, 1).await,
                    Err(TxnError::Abort(AbortReason::LockCas))
                ));
            });
            step.wait();
        });
    });
    // The holder released its own lock: a safe writer gets it now.
    let w = client(303, false);
    let w2 = w.clone();
    run(&w, async move {
        let mut t = w2.begin();
        t.read_for_update(SAVINGS, 1).await.unwrap();
        t.commit().await.unwrap();
    });
    // One update each on fresh clients: the variant posts two WRs fewer, the lock CAS
    // and the release CAS.
    let wrs_of_update = |node: u32, unsafe_no_lock_cas: bool, key: u64| {
        let c = client(node, unsafe_no_lock_cas);
        let before = c.ctx().stats().wrs;
        let c2 = c.clone();
        run(&c, async move {
            let mut t = c2.begin();
            let v = bal(&t.read_for_update(CHECKING, key).await.unwrap());
            t.write(CHECKING, key, (v + 1).to_le_bytes().to_vec())
                .unwrap();
            t.commit().await.unwrap();
        });
        c.ctx().stats().wrs - before
    };
    let safe = wrs_of_update(304, false, 7);
    let no_cas = wrs_of_update(305, true, 8);
    assert_eq!(safe, no_cas + 2, "safe {safe} WRs, no-CAS {no_cas}");
}
