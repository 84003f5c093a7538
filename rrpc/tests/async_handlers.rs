//! Async server handlers that await one-sided operations and calls on their server
//! thread's runtime, and the expiry paths of the hybrid modes (generations,
//! cancellation), over real server threads on `$RRPC_FABRIC`.

use rrpc::NodeId;
use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::rc::Rc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rrpc::fabric::{MrDesc, RemoteAddr};
use rrpc::node::{Node, NodeConfig, ServerRuntime};
use rrpc::runtime::{block_on, CallError, CallOpts, Executor, ReplyMode, RuntimeConfig, ThreadCtx};
use rrpc::server::{Handlers, ServerConfig};

mod common;
use common::{fabric, mem_node, server, setup, ECHO};

/// FAA of 1 on the memory node's counter, then an ECHO call to the back server of the
/// old value: the reply is the counter value the back server echoed (a TSO proxy's
/// shape: a handler that takes a timestamp with a one-sided op and forwards).
const PROXY: u16 = 20;
/// Sleeps the request's u64 LE milliseconds on the executor (not the thread), then
/// replies with the request's second u64 bytes (16 when absent).
const NAP: u16 = 21;

/// What a proxy thread needs: the memory node's counter and the back server's node id.
struct Targets {
    mem: NodeId,
    counter: RemoteAddr,
    back: NodeId,
}

fn nap_handlers(h: &mut Handlers) {
    h.register_async(NAP, |req: Vec<u8>| async move {
        let ms = u64::from_le_bytes(req[..8].try_into().map_err(|_| "want a u64")?);
        let n = req
            .get(8..16)
            .map_or(16, |b| u64::from_le_bytes(b.try_into().unwrap()) as usize);
        let ctx = ThreadCtx::current().ok_or("no runtime on this server thread")?;
        ctx.sleep(Duration::from_millis(ms)).await;
        Ok(vec![7u8; n])
    });
}

fn front(
    cluster: &str,
    mem_addr: std::net::SocketAddr,
    back_addr: std::net::SocketAddr,
    threads: usize,
    server_cfg: ServerConfig,
) -> Node {
    // One Targets per server thread, filled by the thread's setup.
    thread_local! {
        static TARGETS: OnceLock<Targets> = const { OnceLock::new() };
    }
    let mut h = common::echo_handlers();
    h.register_async(PROXY, |_req: Vec<u8>| async move {
        let ctx = ThreadCtx::current().ok_or("no runtime on this server thread")?;
        let (mem, counter, back) = TARGETS.with(|t| {
            let t = t.get().expect("set up");
            (t.mem, t.counter, t.back)
        });
        let ts = ctx.faa(mem, counter, 1).await.map_err(|e| e.to_string())?;
        ctx.call(back, ECHO, &ts.to_le_bytes())
            .await
            .map_err(|e| e.to_string())
    });
    nap_handlers(&mut h);
    let rt = ServerRuntime::new(
        RuntimeConfig::default()
            .with_buffer_bytes(8 << 20)
            .with_max_transfer(1 << 20),
    )
    .with_setup(move |ctx| {
        let m = ctx.connect(mem_addr)?;
        let desc: MrDesc = m.export("mr").expect("mr export");
        let back = ctx.connect_rpc(back_addr)?.node;
        TARGETS.with(|t| {
            let _ = t.set(Targets {
                mem: m.node,
                counter: desc.at(0),
                back,
            });
        });
        Ok(())
    });
    Node::start_with_runtime(
        fabric(cluster, 3),
        NodeConfig::new("front", "127.0.0.1:0".parse().unwrap()).with_rpc(Some((h, threads))),
        server_cfg,
        Some(rt),
    )
    .unwrap()
}

/// A front node (id 3) with the async handlers over a back server (id 1) and a memory
/// node (id 2), and a client context (node 100) connected to it for RPC.
struct Setup {
    ctx: Rc<ThreadCtx>,
    /// The front's node id.
    node: NodeId,
    _front: Node,
    _back: Node,
    _mem: Node,
    /// The counter's region: the memory node's exported MR lives as long as the test.
    _mr: rrpc::fabric::MemoryRegion,
    _cluster: rrpc::fabric::shm::ClusterGuard,
}

fn start(name: &str, threads: usize, server_cfg: ServerConfig) -> Setup {
    let c = setup("async", name);
    let back = server(c.name(), 1);
    let (mem, mr) = mem_node(c.name(), 2, 4096);
    let front = front(c.name(), mem.addr(), back.addr(), threads, server_cfg);
    let ctx = ThreadCtx::new(fabric(c.name(), 100), RuntimeConfig::default()).unwrap();
    let node = ctx.connect_rpc(front.addr()).unwrap().node;
    Setup {
        ctx,
        node,
        _front: front,
        _back: back,
        _mem: mem,
        _mr: mr,
        _cluster: c,
    }
}

#[test]
fn async_handlers_await_one_sided_ops_and_calls_on_their_thread() {
    let s = start("proxy", 2, ServerConfig::default());
    let (ctx, node) = (s.ctx.clone(), s.node);
    let seen = Rc::new(RefCell::new(Vec::new()));
    let mut ex = Executor::new(ctx.clone());
    for _ in 0..16 {
        let (ctx, seen) = (ctx.clone(), seen.clone());
        ex.spawn(async move {
            for _ in 0..50 {
                let r = ctx.call(node, PROXY, b"").await.unwrap();
                seen.borrow_mut()
                    .push(u64::from_le_bytes(r[..8].try_into().unwrap()));
            }
        });
    }
    ex.run();
    // Every call took its own counter value: 800 distinct, 0..800.
    let got: HashSet<u64> = seen.borrow().iter().copied().collect();
    assert_eq!(got, (0..800).collect::<HashSet<u64>>());
}

#[test]
fn a_slow_async_handler_does_not_hold_up_its_server_thread() {
    // One server thread: the echo calls can only be answered if the naps yield it.
    let s = start("slow", 1, ServerConfig::default());
    let (ctx, node) = (s.ctx.clone(), s.node);
    let order = Rc::new(RefCell::new(Vec::new()));
    let mut ex = Executor::new(ctx.clone());
    for i in 0..8u64 {
        let (ctx, order) = (ctx.clone(), order.clone());
        ex.spawn(async move {
            // Long enough that the echo calls finish first even in an emulated VM.
            let r = ctx
                .call_with(
                    node,
                    NAP,
                    &3000u64.to_le_bytes(),
                    CallOpts {
                        timeout: Some(Duration::from_secs(60)),
                        ..CallOpts::default()
                    },
                )
                .await
                .unwrap();
            assert_eq!(r, vec![7u8; 16]);
            order.borrow_mut().push(("nap", i));
        });
    }
    {
        let (ctx, order) = (ctx.clone(), order.clone());
        ex.spawn(async move {
            // Let the naps reach the server first.
            ctx.sleep(Duration::from_millis(20)).await;
            for i in 0..10 {
                assert_eq!(ctx.call(node, ECHO, b"hi").await.unwrap(), b"hi");
                order.borrow_mut().push(("echo", i));
            }
        });
    }
    ex.run();
    let order = order.borrow();
    let last_echo = order.iter().rposition(|(k, _)| *k == "echo").unwrap();
    let first_nap = order.iter().position(|(k, _)| *k == "nap").unwrap();
    assert!(
        last_echo < first_nap,
        "10 echo calls answered while 8 naps were in flight: {order:?}"
    );
    assert_eq!(order.len(), 18);
}

/// Waits (on the executor) until `f` holds, up to 30 s.
async fn eventually(ctx: &ThreadCtx, mut f: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < until {
        if f() {
            return true;
        }
        ctx.sleep(Duration::from_millis(5)).await;
    }
    f()
}

#[test]
fn expired_zero_copy_call_holds_its_buffer_until_the_server_cancels() {
    let s = start("cancel", 1, ServerConfig::default());
    let (ctx, node) = (s.ctx.clone(), s.node);
    let c2 = ctx.clone();
    block_on(&ctx, async move {
        let mut req = 200u64.to_le_bytes().to_vec();
        req.extend_from_slice(&4000u64.to_le_bytes());
        let opts = CallOpts {
            mode: ReplyMode::ZeroCopy,
            reply_len: Some(4000),
            timeout: Some(Duration::from_millis(20)),
        };
        let r = c2.call_with(node, NAP, &req, opts).await;
        assert!(matches!(r, Err(CallError::Timeout { .. })), "{r:?}");
        // The server may still WRITE into the buffer: it stays reserved.
        assert_eq!(c2.calls_in_flight(), (0, 1));
        // The server answers the cancel once the handler ends; then the buffer is free.
        let ok = eventually(&c2, || c2.calls_in_flight() == (0, 0)).await;
        assert!(
            ok,
            "zombie buffer never released: {:?}",
            c2.calls_in_flight()
        );
        // A dropped call (its future abandoned) goes the same way.
        let fut = c2.call_with(
            node,
            NAP,
            &req,
            CallOpts {
                timeout: None,
                ..opts
            },
        );
        let dropped = Rc::new(Cell::new(false));
        {
            let d = dropped.clone();
            let sleep = c2.sleep(Duration::from_millis(30));
            futures::pin_mut!(fut);
            futures::pin_mut!(sleep);
            if let futures::future::Either::Right(_) = futures::future::select(fut, sleep).await {
                d.set(true);
            }
        }
        assert!(dropped.get());
        assert_eq!(c2.calls_in_flight(), (0, 1));
        let ok = eventually(&c2, || c2.calls_in_flight() == (0, 0)).await;
        assert!(ok, "abandoned call's buffer never released");
        // The channel still works.
        assert_eq!(c2.call(node, ECHO, b"after").await.unwrap(), b"after");
    });
}

#[test]
fn a_read_mode_reply_read_after_its_buffer_expired_fails_the_call() {
    let s = start(
        "expired",
        1,
        // Long enough for a READ in time even in an emulated VM, short against the
        // stall below.
        ServerConfig::default().with_read_hold(Duration::from_millis(300)),
    );
    let (ctx, node) = (s.ctx.clone(), s.node);
    let result = Rc::new(RefCell::new(None));
    let mut ex = Executor::new(ctx.clone());
    {
        let (ctx, result) = (ctx.clone(), result.clone());
        ex.spawn(async move {
            let mut req = 0u64.to_le_bytes().to_vec();
            req.extend_from_slice(&2000u64.to_le_bytes());
            let r = ctx
                .call_with(node, NAP, &req, CallOpts::mode(ReplyMode::Read))
                .await;
            *result.borrow_mut() = Some(r);
        });
    }
    {
        // As soon as the READ reply has arrived, stall the thread (as a descheduled
        // caller would) before its READ is posted: the server expires the buffer.
        let ctx = ctx.clone();
        ex.spawn(async move {
            while ctx.stats().read_replies == 0 {
                ctx.yield_now().await;
            }
            std::thread::sleep(Duration::from_millis(3000));
        });
    }
    ex.run();
    let r = result.borrow_mut().take().unwrap();
    assert!(matches!(r, Err(CallError::Expired { .. })), "{r:?}");
    assert_eq!(ctx.stats().expired_replies, 1);
    // A READ in time works.
    let c2 = ctx.clone();
    let r = block_on(&ctx, async move {
        let mut req = 0u64.to_le_bytes().to_vec();
        req.extend_from_slice(&2000u64.to_le_bytes());
        c2.call_with(node, NAP, &req, CallOpts::mode(ReplyMode::Read))
            .await
    });
    assert_eq!(r.unwrap(), vec![7u8; 2000]);
}

#[test]
fn server_refuses_rings_beyond_its_limits() {
    let c = setup("async", "limits");
    let back = server(c.name(), 1);
    let (mem, _mr) = mem_node(c.name(), 2, 4096);
    let front = front(
        c.name(),
        mem.addr(),
        back.addr(),
        1,
        ServerConfig::default()
            .with_max_ring_bytes(64 * 512)
            .with_max_rockets_per_straw(1),
    );
    let big = ThreadCtx::new(
        fabric(c.name(), 100),
        RuntimeConfig::default().with_rocket(rrpc::rocket::RocketConfig::new(512, 128)),
    )
    .unwrap();
    let e = big.connect_rpc(front.addr()).unwrap_err().to_string();
    assert!(e.contains("exceeds this server's limit"), "{e}");
    // One Rocket pair per requester process here: a second thread's is refused.
    let rt = rrpc::runtime::Runtime::new(fabric(c.name(), 101), RuntimeConfig::default());
    let a = rt.thread_ctx().unwrap();
    a.connect_rpc(front.addr()).unwrap();
    let b = rt.thread_ctx().unwrap();
    let e = b.connect_rpc(front.addr()).unwrap_err().to_string();
    assert!(e.contains("Rocket pairs here"), "{e}");
    // The admitted one works (the front is node 3).
    let a2 = a.clone();
    assert_eq!(
        block_on(&a, async move { a2.call(NodeId(3), ECHO, b"x").await }).unwrap(),
        b"x"
    );
}

/// An async handler that panics (while making its future, or while it runs) fails its
/// own call with "handler N panicked"; its server thread (the only one) keeps serving.
#[test]
fn a_panicking_async_handler_fails_its_call_and_the_thread_serves_on() {
    const BOOM: u16 = 30;
    let c = setup("async", "panic");
    let mut h = common::echo_handlers();
    h.register_async(BOOM, |req: Vec<u8>| {
        assert_ne!(req.first(), Some(&2), "panics making the future");
        async move {
            if req.first() == Some(&1) {
                panic!("panics while polled");
            }
            Ok(req)
        }
    });
    let srv = common::server_with(c.name(), h, 1);
    let ctx = ThreadCtx::new(
        fabric(c.name(), 100),
        RuntimeConfig::default().with_call_timeout(Duration::from_secs(20)),
    )
    .unwrap();
    let node = ctx.connect_rpc(srv.addr()).unwrap().node;
    let c2 = ctx.clone();
    block_on(&ctx, async move {
        let ctx = c2;
        for bad in [1u8, 2] {
            match ctx.call(node, BOOM, &[bad]).await {
                Err(CallError::Remote { msg, .. }) => {
                    assert_eq!(msg, format!("handler {BOOM} panicked"))
                }
                other => panic!("expected the handler's panic, got {other:?}"),
            }
            // The same thread answers the next call, of the async handler and a plain one.
            assert_eq!(ctx.call(node, BOOM, &[7, 8]).await.unwrap(), vec![7, 8]);
            assert_eq!(ctx.call(node, ECHO, b"hi").await.unwrap(), b"hi");
        }
    });
}
