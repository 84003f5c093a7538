//! A custom transaction with [`TxnClient`]: this process starts a local cluster on the
//! shm fabric (a memory node holding the user's own table, a lock service and a
//! timestamp oracle, each a library value on its own fabric node), and a client thread
//! runs a user-written transfer between accounts (`read_for_update` both, check,
//! `write` both, `commit`) from several coroutines under Scythe's protocol, retrying on
//! aborts. At the end the total is what was loaded, no record is left locked, and the
//! recorded history is serializable.
//!
//! ```text
//! cargo run -p txn --example custom_txn [-- CLUSTER]
//! ```
//!
//! Prints the cluster's addresses, the commits and aborts, the final balances and
//! `custom_txn: ok`; a failure is an error exit.

use std::cell::{Cell, RefCell};
use std::io::Write;
use std::rc::Rc;
use std::time::Duration;

use lockd::embed::{LockService, LockServiceConfig};
use rrpc::fabric::shm::ClusterGuard;
use rrpc::fabric::MemoryRegion;
use rrpc::prelude::*;
use rrpc::runtime::Executor;
use txn::coordinator::{AbortReason, ClusterAddrs, Protocol, TxnClient, TxnConfig, TxnError};
use txn::cvt_remote::{MemnodeExport, EXPORT_KEY};
use txn::cvt_store::CvtTableBuilder;

/// The user's table: one 8-byte little-endian balance per account.
const ACCOUNTS_TABLE: u32 = 0;
/// Accounts, keys `0..ACCOUNTS`.
const ACCOUNTS: u64 = 8;
/// Every account's balance at load.
const INITIAL: i64 = 100;
/// Coroutines of the client thread, each running [`TRANSFERS`] transfers.
const COROUTINES: u64 = 4;
/// Committed transfers per coroutine.
const TRANSFERS: u64 = 25;

/// The services of the local cluster, stopped when dropped.
struct LocalCluster {
    addrs: ClusterAddrs,
    // The memory node serves its regions, which must outlive it: dropped after it.
    _memnode: (Node, Vec<[MemoryRegion; 3]>),
    _lockd: LockService,
    _tso: (tso::Oracle, Node),
}

/// Start the memory node (node 1, the accounts table loaded at version 0), the lock
/// service (node 2) and the oracle (node 3) on `guard`'s cluster.
fn start_cluster(guard: &ClusterGuard) -> Result<LocalCluster, Box<dyn std::error::Error>> {
    let f = guard.open(NodeId(1))?;
    let mut table = CvtTableBuilder::new(&f, ACCOUNTS_TABLE, "accounts", 2, 8, 2 * ACCOUNTS)?;
    for a in 0..ACCOUNTS {
        table.insert(a, &INITIAL.to_le_bytes(), tso::Timestamp::ZERO)?;
    }
    let (export, regions) = table.finish();
    let export = MemnodeExport {
        partition: 0,
        partitions: 1,
        tables: vec![export],
        replicas: 1,
        backups: Vec::new(),
        spare: false,
        log: None,
        undo: None,
    };
    let cfg = NodeConfig::new("memnode", "127.0.0.1:0".parse()?)
        .export(EXPORT_KEY, serde_json::to_value(&export)?);
    let memnode = Node::start(f, cfg)?;

    let lockd = LockService::start(
        guard.open(NodeId(2))?,
        "127.0.0.1:0".parse()?,
        &LockServiceConfig::default().with_locks(64),
    )?;
    let tf = guard.open(NodeId(3))?;
    // Epoch 1: every timestamp lies above the loaded version.
    let oracle = tso::Oracle::with_epoch(&tf, 1)?;
    let tso_node = oracle.serve(tf, "127.0.0.1:0".parse()?)?;
    Ok(LocalCluster {
        addrs: ClusterAddrs {
            memnodes: vec![memnode.addr()],
            lockd: Some(lockd.addr()),
            tso: tso_node.addr(),
        },
        _memnode: (memnode, vec![regions]),
        _lockd: lockd,
        _tso: (oracle, tso_node),
    })
}

fn balance(v: &[u8]) -> Result<i64, TxnError> {
    let b: [u8; 8] = v
        .try_into()
        .map_err(|_| TxnError::Usage(format!("a balance of {} bytes", v.len())))?;
    Ok(i64::from_le_bytes(b))
}

/// The user's transaction: move `amount` from account `from` to `to`, aborting (a user
/// abort, not retried) when `from` has less.
async fn transfer(c: &TxnClient, from: u64, to: u64, amount: i64) -> Result<(), TxnError> {
    let mut t = c.begin();
    let a = balance(&t.read_for_update(ACCOUNTS_TABLE, from).await?)?;
    let b = balance(&t.read_for_update(ACCOUNTS_TABLE, to).await?)?;
    if a < amount {
        return Err(t.abort().await);
    }
    t.write(ACCOUNTS_TABLE, from, (a - amount).to_le_bytes().to_vec())?;
    t.write(ACCOUNTS_TABLE, to, (b + amount).to_le_bytes().to_vec())?;
    t.commit().await
}

/// Attempts of one transaction before the example gives up (so it cannot spin forever).
const MAX_ATTEMPTS: u32 = 1000;

/// Run `body` until it commits (`Ok(true)`), the user aborts it (`Ok(false)`) or it
/// fails; a protocol abort is retried after a short pause and counted in `aborts`, up
/// to [`MAX_ATTEMPTS`] attempts.
async fn retry<F, Fut>(c: &TxnClient, aborts: &Cell<u64>, mut body: F) -> Result<bool, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), TxnError>>,
{
    for _ in 0..MAX_ATTEMPTS {
        match body().await {
            Ok(()) => return Ok(true),
            Err(TxnError::Abort(AbortReason::User)) => return Ok(false),
            Err(TxnError::Abort(_)) => {
                aborts.set(aborts.get() + 1);
                c.ctx()
                    .sleep(Duration::from_micros(1 + aborts.get() % 40))
                    .await;
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    Err(format!("aborted {MAX_ATTEMPTS} times in a row"))
}

/// Start the cluster on `cluster`, run the transfers from a client thread and write what
/// happens to `out`. Errors: any step failing, money created or lost, a record left
/// locked, or a history that is not serializable.
fn run(cluster: &str, out: &mut impl Write) -> Result<(), Box<dyn std::error::Error>> {
    let (guard, _) = ClusterGuard::new(cluster)?;
    let cl = start_cluster(&guard)?;
    writeln!(
        out,
        "cluster: memnode {}, lockd {}, tso {}",
        cl.addrs.memnodes[0],
        cl.addrs.lockd.map_or("-".into(), |a| a.to_string()),
        cl.addrs.tso
    )?;
    let fabric = guard.open(NodeId(100))?;
    let addrs = cl.addrs.clone();
    let lines = std::thread::spawn(move || client(fabric, &addrs).map_err(|e| e.to_string()))
        .join()
        .map_err(|_| "the client thread panicked")??;
    for l in lines {
        writeln!(out, "{l}")?;
    }
    writeln!(out, "custom_txn: ok")?;
    Ok(())
}

/// The client thread on `fabric`: the transfers, then the checks; returns the lines to
/// print.
fn client(fabric: Fabric, addrs: &ClusterAddrs) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let ctx = ThreadCtx::new(fabric, RuntimeConfig::default())?;
    let cfg = TxnConfig::default()
        .with_protocol(Protocol::Scythe)
        // Record committed transactions for the serializability check.
        .with_history_limit_bytes(Some(16 << 20));
    let c = Rc::new(TxnClient::connect(ctx.clone(), addrs, cfg)?);
    let (commits, refused, aborts) = (
        Rc::new(Cell::new(0)),
        Rc::new(Cell::new(0)),
        Rc::new(Cell::new(0)),
    );
    let error = Rc::new(RefCell::new(None));
    let mut ex = Executor::new(ctx.clone());
    for co in 0..COROUTINES {
        let (c, commits, refused, aborts, error) = (
            c.clone(),
            commits.clone(),
            refused.clone(),
            aborts.clone(),
            error.clone(),
        );
        ex.spawn(async move {
            for i in 0..TRANSFERS {
                // Overlapping pairs, so the coroutines contend.
                let from = (co + i) % ACCOUNTS;
                let to = (co + 3 * i + 1) % ACCOUNTS;
                let to = if to == from { (to + 1) % ACCOUNTS } else { to };
                let amount = (1 + (co * 7 + i * 13) % 60) as i64;
                match retry(&c, &aborts, || transfer(&c, from, to, amount)).await {
                    Ok(true) => commits.set(commits.get() + 1),
                    Ok(false) => refused.set(refused.get() + 1),
                    Err(e) => {
                        error.borrow_mut().get_or_insert(e);
                        return;
                    }
                }
            }
        });
    }
    ex.run();
    if let Some(e) = error.take() {
        return Err(e.into());
    }
    let mut lines = vec![format!(
        "{} transfers committed, {} refused (insufficient funds), {} aborts retried",
        commits.get(),
        refused.get(),
        aborts.get()
    )];
    let c2 = c.clone();
    let rows = block_on(&ctx, async move {
        let mut rows = Vec::new();
        for a in 0..ACCOUNTS {
            let v = c2.read_committed(ACCOUNTS_TABLE, a).await?;
            let locked = c2.cvt_locked(ACCOUNTS_TABLE, a).await?;
            rows.push((v.map(|(_, v)| balance(&v)).transpose()?, locked));
        }
        Ok::<_, TxnError>(rows)
    })?;
    let mut total = 0;
    let mut balances = Vec::new();
    for (a, (v, locked)) in rows.into_iter().enumerate() {
        let v = v.ok_or(format!("account {a} is gone"))?;
        if locked {
            return Err(format!("account {a} left locked").into());
        }
        if v < 0 {
            return Err(format!("account {a} overdrawn: {v}").into());
        }
        total += v;
        balances.push(v.to_string());
    }
    lines.push(format!("balances: {}", balances.join(" ")));
    let want = INITIAL * ACCOUNTS as i64;
    lines.push(format!("total: {total} (loaded {want})"));
    if total != want {
        return Err(format!("the total changed: {total}, loaded {want}").into());
    }
    let h = c.take_history().ok_or("no history recorded")?;
    let verdict = txn::serializability::check(&h);
    if !verdict.is_serializable() {
        return Err(format!("history not serializable: {verdict:?}").into());
    }
    lines.push("history: serializable".into());
    Ok(lines)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cluster = std::env::args()
        .nth(1)
        .unwrap_or_else(|| format!("custom-txn-{}", std::process::id()));
    run(&cluster, &mut std::io::stdout().lock())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_conserves_the_total_over_concurrent_transfers() {
        let mut out = Vec::new();
        run(&format!("custom-txn-test-{}", std::process::id()), &mut out).unwrap();
        let out = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("cluster: memnode "), "{out}");
        let counts: Vec<u64> = lines[1].split(' ').filter_map(|w| w.parse().ok()).collect();
        assert_eq!(counts[0] + counts[1], COROUTINES * TRANSFERS, "{out}");
        assert!(counts[0] > 0, "{out}");
        assert_eq!(
            lines[3],
            format!("total: {0} (loaded {0})", INITIAL * ACCOUNTS as i64)
        );
        assert_eq!(lines[4], "history: serializable");
        assert_eq!(lines[5], "custom_txn: ok");
    }
}
