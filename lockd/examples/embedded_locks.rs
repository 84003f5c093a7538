//! An embedded lock service: this process starts [`LockService`] as node 1 of a shm
//! cluster (no `lockd` process), and a client thread (node 2) takes Takeout locks on
//! it: a Lock RPC takes a ticket, [`Ticket::wait`] waits for its turn, and
//! [`Ticket::release`] passes the lock on. Two coroutines contend for one lock and are
//! served in ticket order; at the end no lock of the table is held.
//!
//! ```text
//! cargo run -p lockd --example embedded_locks [-- CLUSTER]
//! ```
//!
//! Prints the service's address, one line per critical section entered (coroutine,
//! ticket), the busy-lock count at the end and `embedded_locks: ok`; a failure is an
//! error exit.

use std::cell::{Cell, RefCell};
use std::io::Write;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use lockd::client::{Grant, LockClient, LockRequest, Mode};
use lockd::embed::{LockService, LockServiceConfig};
use rrpc::fabric::shm::ClusterGuard;
use rrpc::prelude::*;
use rrpc::runtime::Executor;

/// Locks in the embedded table.
const LOCKS: u64 = 16;
/// The lock both coroutines contend for.
const LOCK: u64 = 3;
/// Critical sections per coroutine.
const ROUNDS: u64 = 3;

/// One critical section: who entered, and with which ticket.
#[derive(Debug, Clone, Copy)]
struct Entry {
    coroutine: char,
    ticket: u64,
}

/// Start the service on `cluster`, run the client thread and write what happens to
/// `out`. Errors: any step failing, two holders at once, entries out of ticket order,
/// or a lock left held.
fn run(cluster: &str, out: &mut impl Write) -> Result<(), Box<dyn std::error::Error>> {
    let (guard, _) = ClusterGuard::new(cluster)?;
    let cfg = LockServiceConfig::default()
        .with_locks(LOCKS)
        .with_lock_table_slots(1 << 12);
    let svc = LockService::start(guard.open(NodeId(1))?, "127.0.0.1:0".parse()?, &cfg)?;
    writeln!(out, "lock service: node 1 on {}", svc.addr())?;

    let fabric = guard.open(NodeId(2))?;
    let addr = svc.addr();
    let (entries, busy) = std::thread::spawn(move || client(fabric, addr))
        .join()
        .map_err(|_| "the client thread panicked")??;
    for e in &entries {
        writeln!(
            out,
            "coroutine {} holds lock {LOCK} with ticket {}",
            e.coroutine, e.ticket
        )?;
    }
    if entries.len() as u64 != 2 * ROUNDS {
        return Err(format!(
            "{} critical sections, expected {}",
            entries.len(),
            2 * ROUNDS
        )
        .into());
    }
    if entries.windows(2).any(|w| w[1].ticket != w[0].ticket + 1) {
        return Err(format!("not served in ticket order: {entries:?}").into());
    }
    writeln!(out, "locks held at the end: {busy}")?;
    if busy != 0 {
        return Err(format!("{busy} locks left held").into());
    }
    // The service's own view of the lock: every ticket taken was passed on.
    let (lower, upper, _) = svc.takeout().words(LOCK);
    if lower != upper || lower != 2 * ROUNDS {
        return Err(format!("lock {LOCK}: lower {lower}, upper {upper}").into());
    }
    writeln!(out, "embedded_locks: ok")?;
    Ok(())
}

/// The client thread on `fabric`: two coroutines take lock [`LOCK`] [`ROUNDS`] times
/// each; returns the critical sections in the order they were entered and how many
/// locks of the table are held afterwards.
fn client(fabric: Fabric, addr: SocketAddr) -> Result<(Vec<Entry>, u64), String> {
    let ctx = ThreadCtx::new(fabric, RuntimeConfig::default()).map_err(|e| e.to_string())?;
    let info = ctx.connect_rpc(addr).map_err(|e| e.to_string())?;
    let lc = Rc::new(LockClient::from_info(&info).map_err(|e| e.to_string())?);
    let entries = Rc::new(RefCell::new(Vec::new()));
    let error = Rc::new(RefCell::new(None));
    let inside = Rc::new(Cell::new(false));
    let mut ex = Executor::new(ctx.clone());
    for (name, first_ts) in [('a', 1), ('b', 2)] {
        let (c, lc, entries, error, inside) = (
            ctx.clone(),
            lc.clone(),
            entries.clone(),
            error.clone(),
            inside.clone(),
        );
        ex.spawn(async move {
            for round in 0..ROUNDS {
                // The timestamp a transaction would take from the oracle.
                let ts = first_ts + 2 * round;
                if let Err(e) = critical_section(&c, &lc, name, ts, &entries, &inside).await {
                    error.borrow_mut().get_or_insert(e);
                    return;
                }
            }
        });
    }
    ex.run();
    if let Some(e) = error.take() {
        return Err(e);
    }
    let c = ctx.clone();
    let busy = block_on(&ctx, async move { lc.count_busy(&c, 0..LOCKS, 4096).await })
        .map_err(|e| e.to_string())?;
    let entries = entries.take();
    Ok((entries, busy))
}

/// Take lock [`LOCK`] (Lock RPC, then wait for the ticket's turn), record the entry,
/// yield a little while holding it, and release it.
async fn critical_section(
    ctx: &Rc<ThreadCtx>,
    lc: &LockClient,
    name: char,
    ts: u64,
    entries: &RefCell<Vec<Entry>>,
    inside: &Cell<bool>,
) -> Result<(), String> {
    let req = LockRequest {
        id: LOCK,
        ts,
        mode: Mode::Hot,
    };
    let grant = lc
        .lock(ctx, &[req])
        .await
        .map_err(|e| e.to_string())?
        .remove(0);
    let mut t = match grant {
        Grant::Queued(t) => t,
        Grant::Refused(r) => return Err(format!("coroutine {name}: refused: {r:?}")),
    };
    t.wait(Instant::now() + Duration::from_secs(20))
        .await
        .map_err(|e| e.to_string())?;
    if inside.replace(true) {
        return Err(format!(
            "coroutine {name} entered while the other held the lock"
        ));
    }
    entries.borrow_mut().push(Entry {
        coroutine: name,
        ticket: t.number(),
    });
    // Hold the lock across a suspension so the other coroutine queues behind it.
    ctx.sleep(Duration::from_millis(1)).await;
    inside.set(false);
    t.release().await.map_err(|e| e.to_string())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cluster = std::env::args()
        .nth(1)
        .unwrap_or_else(|| format!("embedded-locks-{}", std::process::id()));
    run(&cluster, &mut std::io::stdout().lock())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_serves_contending_coroutines_in_ticket_order() {
        let mut out = Vec::new();
        run(
            &format!("embedded-locks-test-{}", std::process::id()),
            &mut out,
        )
        .unwrap();
        let out = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("lock service: node 1 on "), "{out}");
        let sections = &lines[1..1 + 2 * ROUNDS as usize];
        for (i, l) in sections.iter().enumerate() {
            assert!(l.ends_with(&format!("with ticket {i}")), "{out}");
        }
        // Both coroutines got the lock.
        assert!(
            sections.iter().any(|l| l.starts_with("coroutine a")),
            "{out}"
        );
        assert!(
            sections.iter().any(|l| l.starts_with("coroutine b")),
            "{out}"
        );
        assert_eq!(lines[lines.len() - 2], "locks held at the end: 0");
        assert_eq!(lines[lines.len() - 1], "embedded_locks: ok");
    }
}
