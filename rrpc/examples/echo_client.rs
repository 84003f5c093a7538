//! An rrpc client: 2 threads x 8 coroutines sharing the process's QPs to the echo server
//! (RdmaStraws), calling with `.await`, in each reply mode. Start `echo_server` first.
//!
//! ```text
//! cargo run --release -p rrpc --example echo_client -- demo 127.0.0.1:7400
//! ```

use rrpc::NodeId;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use rrpc::fabric::{Fabric, FabricConfig, FabricKind};
use rrpc::runtime::{CallOpts, ReplyMode, Runtime, RuntimeConfig, ThreadCtx};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let cluster = args.next().unwrap_or_else(|| "echo-demo".into());
    let server: std::net::SocketAddr = args
        .next()
        .unwrap_or_else(|| "127.0.0.1:7400".into())
        .parse()?;
    let fabric = Fabric::open(&FabricConfig::new(
        FabricKind::from_env()?,
        &cluster,
        NodeId(2),
    ))?;
    let rt = Runtime::new(fabric, RuntimeConfig::default());
    let t0 = Instant::now();
    let calls = Arc::new(AtomicU64::new(0));
    // 2 threads x 8 coroutines. `setup` runs once per thread (connect there); the body it
    // returns runs once per coroutine.
    let counter = calls.clone();
    rt.run(2, 8, move |ctx, thread| {
        let node = ctx.connect_rpc(server)?.node;
        let calls = counter.clone();
        Ok(move |ctx: Rc<ThreadCtx>, co: usize| {
            let calls = calls.clone();
            async move {
                for i in 0..1000u32 {
                    // Pure RPC for small payloads (ReplyMode::Auto picks it by size).
                    let msg = format!("thread {thread} coroutine {co} call {i}");
                    let r = ctx.call(node, 100, msg.as_bytes()).await.expect("echo");
                    assert_eq!(r, msg.as_bytes());
                    calls.fetch_add(1, Ordering::Relaxed);
                }
                // A 64 KiB reply three ways: RPC + one-sided READ, zero-copy, and Auto
                // (which picks zero-copy since the size is known and above 512 B).
                let len = (64u32 << 10).to_le_bytes();
                for mode in [ReplyMode::Read, ReplyMode::ZeroCopy, ReplyMode::Auto] {
                    let opts = CallOpts {
                        mode,
                        reply_len: Some(64 << 10),
                        ..CallOpts::default()
                    };
                    let r = ctx
                        .call_with(node, 101, &len, opts)
                        .await
                        .expect("large reply");
                    assert_eq!(r.len(), 64 << 10);
                }
                // One-sided helpers (ctx.read / write / cas / faa on a region a node
                // exports) batch with the calls issued in the same polling round.
            }
        })
    })?;
    let n = calls.load(Ordering::Relaxed);
    println!(
        "{n} echo calls from 2 threads x 8 coroutines in {:.2?} ({:.0} calls/s), plus 3 x 64 KiB replies per coroutine",
        t0.elapsed(),
        n as f64 / t0.elapsed().as_secs_f64()
    );
    Ok(())
}
