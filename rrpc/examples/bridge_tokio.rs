//! rrpc from tokio: a [`BridgeClient`] (a `Send + Clone` handle on a dedicated rrpc
//! thread) shared by tokio tasks on a multi-threaded runtime, each awaiting typed calls
//! to a node served in the same process over the shm fabric.
//!
//! ```text
//! cargo run -p rrpc --example bridge_tokio [-- CLUSTER]
//! ```
//!
//! Prints the calls made and `bridge_tokio: ok`; a wrong answer is an error exit.

use std::io::Write;

use rrpc::fabric::shm::ClusterGuard;
use rrpc::prelude::*;
use rrpc::server::ids::FIRST_APP_ID;
use rrpc::typed::zerocopy::little_endian::U64;

/// Squares a number (wrapping).
struct Square;
impl Rpc for Square {
    const ID: u16 = FIRST_APP_ID;
    type Req = U64;
    type Resp = U64;
    type Codec = Fixed;
}

/// Tasks and calls per task.
const TASKS: u64 = 8;
const CALLS: u64 = 50;

/// Serve `Square` on `cluster`, call it from `TASKS` tokio tasks through one bridge and
/// write a summary to `out`. Errors: any step failing, or a wrong square.
fn run(cluster: &str, out: &mut impl Write) -> Result<(), Box<dyn std::error::Error>> {
    let (guard, _) = ClusterGuard::new(cluster)?;
    let mut h = Handlers::new();
    h.register_typed::<Square>(|x| Ok(U64::new(x.get().wrapping_mul(x.get()))));
    let node = Node::start(
        guard.open(NodeId(1))?,
        NodeConfig::new("square", "127.0.0.1:0".parse()?).rpc(h, 1),
    )?;
    let (bridge, nodes) = BridgeClient::start(
        guard.open(NodeId(2))?,
        RuntimeConfig::default(),
        &[node.addr()],
    )?;
    let server = nodes[0];

    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()?;
    let sum = tokio.block_on(async move {
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let bridge = bridge.clone();
                tokio::spawn(async move {
                    let mut sum = 0u64;
                    for i in 0..CALLS {
                        let x = t * CALLS + i;
                        let r = bridge.call_typed::<Square>(server, U64::new(x)).await?;
                        if r.get() != x * x {
                            return Err(format!("square of {x}: got {}", r.get()).into());
                        }
                        sum += r.get();
                    }
                    Ok::<u64, Box<dyn std::error::Error + Send + Sync>>(sum)
                })
            })
            .collect();
        let mut sum = 0;
        for t in tasks {
            sum += t.await??;
        }
        Ok::<u64, Box<dyn std::error::Error + Send + Sync>>(sum)
    });
    let sum = sum.map_err(|e| e.to_string())?;
    writeln!(
        out,
        "{} typed calls from {TASKS} tokio tasks through one bridge; sum of squares {sum}",
        TASKS * CALLS
    )?;
    writeln!(out, "bridge_tokio: ok")?;
    drop(tokio); // the tasks held the last bridge handles; its thread has ended
    drop(node);
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cluster = std::env::args()
        .nth(1)
        .unwrap_or_else(|| format!("bridge-tokio-{}", std::process::id()));
    run(&cluster, &mut std::io::stdout().lock())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokio_tasks_get_every_square_through_the_bridge() {
        let mut out = Vec::new();
        run(
            &format!("bridge-tokio-test-{}", std::process::id()),
            &mut out,
        )
        .unwrap();
        let n = TASKS * CALLS;
        let want: u64 = (0..n).map(|x| x * x).sum();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!(
                "{n} typed calls from {TASKS} tokio tasks through one bridge; sum of squares {want}\nbridge_tokio: ok\n"
            )
        );
    }
}
