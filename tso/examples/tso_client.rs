//! A TSO client: this process starts a timestamp [`Oracle`] as node 1 of a shm cluster,
//! and a client thread (node 2) takes timestamps from it through the documented client
//! API: a [`TsoConn`] (one-sided FAA on the oracle's counter, following the oracle
//! across restarts) under a [`ThreadTso`] (the thread's coroutines combine their
//! requests into one FAA per group). Every request is recorded and the history is
//! checked with [`tso::history::check`]: timestamps are unique, and one taken after
//! another finished is larger, across coroutines.
//!
//! ```text
//! cargo run -p tso --example tso_client [-- CLUSTER]
//! ```
//!
//! Prints the oracle's address, each coroutine's first and last timestamp, the
//! timestamps per FAA and `tso_client: ok`; a failure is an error exit.

use std::cell::RefCell;
use std::io::Write;
use std::net::SocketAddr;
use std::rc::Rc;

use rrpc::fabric::shm::ClusterGuard;
use rrpc::prelude::*;
use rrpc::runtime::Executor;
use tso::history::{self, now_ns, Op};
use tso::{GroupStats, Oracle, ReconnectConfig, ThreadTso, Timestamp, TsoConn};

/// Coroutines of the client thread.
const COROUTINES: u32 = 4;
/// Timestamps each coroutine takes.
const PER_COROUTINE: usize = 50;

/// Start the oracle on `cluster`, take timestamps from a client thread and write what
/// happens to `out`. Errors: any step failing, a coroutine's timestamps not strictly
/// increasing, or a history that is not that of a linearizable counter.
fn run(cluster: &str, out: &mut impl Write) -> Result<(), Box<dyn std::error::Error>> {
    let (guard, _) = ClusterGuard::new(cluster)?;
    let fabric = guard.open(NodeId(1))?;
    let oracle = Oracle::new(&fabric)?;
    let node = oracle.serve(fabric, "127.0.0.1:0".parse()?)?;
    writeln!(out, "oracle: node 1 on {}", node.addr())?;

    let client_fabric = guard.open(NodeId(2))?;
    let addr = node.addr();
    let (ops, stats) = std::thread::spawn(move || client(client_fabric, addr))
        .join()
        .map_err(|_| "the client thread panicked")??;
    for c in 0..COROUTINES {
        let mine: Vec<Timestamp> = ops.iter().filter(|o| o.client == c).map(|o| o.ts).collect();
        if mine.len() != PER_COROUTINE || mine.windows(2).any(|w| w[0] >= w[1]) {
            return Err(format!("coroutine {c}: not {PER_COROUTINE} increasing: {mine:?}").into());
        }
        writeln!(
            out,
            "coroutine {c}: {} timestamps, {} .. {}",
            mine.len(),
            mine[0],
            mine[mine.len() - 1]
        )?;
    }
    let checked = history::check(&ops)?;
    writeln!(
        out,
        "{checked} timestamps unique and in real-time order, {:.1} per FAA",
        stats.mean_group_size()
    )?;
    // The oracle's counter stops at the last timestamp handed out: the groups reserve
    // ranges of exactly their members (no prefetching), so none is left unused.
    let last = ops.iter().map(|o| o.ts).max().ok_or("no timestamps")?;
    writeln!(out, "oracle counter: {}", oracle.current())?;
    if oracle.current() != last {
        return Err(format!("oracle at {}, last handed out {last}", oracle.current()).into());
    }
    writeln!(out, "tso_client: ok")?;
    drop(node);
    Ok(())
}

/// The client thread on `fabric`: [`COROUTINES`] coroutines take [`PER_COROUTINE`]
/// timestamps each through one [`ThreadTso`]; returns every request's record and the
/// group's counters.
fn client(fabric: Fabric, oracle: SocketAddr) -> Result<(Vec<Op>, GroupStats), String> {
    let ctx = ThreadCtx::new(fabric, RuntimeConfig::default()).map_err(|e| e.to_string())?;
    let conn = TsoConn::connect(ctx.clone(), oracle, ReconnectConfig::default())
        .map_err(|e| e.to_string())?;
    let tso = Rc::new(ThreadTso::new(conn));
    let ops = Rc::new(RefCell::new(Vec::new()));
    let error = Rc::new(RefCell::new(None));
    let mut ex = Executor::new(ctx.clone());
    for c in 0..COROUTINES {
        let (ctx, tso, ops, error) = (ctx.clone(), tso.clone(), ops.clone(), error.clone());
        ex.spawn(async move {
            for _ in 0..PER_COROUTINE {
                let invoke_ns = now_ns();
                match tso.timestamp(&ctx).await {
                    Ok(ts) => ops.borrow_mut().push(Op {
                        client: c,
                        invoke_ns,
                        response_ns: now_ns(),
                        ts,
                    }),
                    Err(e) => {
                        error.borrow_mut().get_or_insert(e.to_string());
                        return;
                    }
                }
            }
        });
    }
    ex.run();
    if let Some(e) = error.take() {
        return Err(e);
    }
    let ops = ops.take();
    Ok((ops, tso.stats()))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cluster = std::env::args()
        .nth(1)
        .unwrap_or_else(|| format!("tso-client-{}", std::process::id()));
    run(&cluster, &mut std::io::stdout().lock())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_takes_unique_increasing_timestamps() {
        let mut out = Vec::new();
        run(&format!("tso-client-test-{}", std::process::id()), &mut out).unwrap();
        let out = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("oracle: node 1 on "), "{out}");
        for c in 0..COROUTINES as usize {
            assert!(
                lines[1 + c].starts_with(&format!("coroutine {c}: {PER_COROUTINE} timestamps, ")),
                "{out}"
            );
        }
        let total = COROUTINES as usize * PER_COROUTINE;
        assert!(
            lines[lines.len() - 3]
                .starts_with(&format!("{total} timestamps unique and in real-time order")),
            "{out}"
        );
        assert_eq!(lines[lines.len() - 2], format!("oracle counter: 0.{total}"));
        assert_eq!(lines[lines.len() - 1], "tso_client: ok");
    }
}
