//! The bridge client from plain OS threads (no async runtime: a parking `block_on`), its
//! errors when the bridge thread is gone, and a start that cannot connect.

mod common;

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use rrpc::prelude::*;

/// Wakes a parked thread.
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Run `f` to completion on this thread, parking between polls.
fn park_on<T>(f: impl Future<Output = T>) -> T {
    let mut f = std::pin::pin!(f);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

#[test]
fn plain_threads_share_one_bridge() {
    let c = common::setup("bridge", "threads");
    let server = common::server(c.name(), 1);
    let (bridge, nodes) = BridgeClient::start(
        common::fabric(c.name(), 2),
        RuntimeConfig::default(),
        &[server.addr()],
    )
    .unwrap();
    let node = nodes[0];
    let threads: Vec<_> = (0..4u32)
        .map(|t| {
            let b = bridge.clone();
            std::thread::spawn(move || {
                for i in 0..100u32 {
                    let msg = format!("thread {t} call {i}").into_bytes();
                    let r = park_on(b.call(node, common::ECHO, msg.clone())).unwrap();
                    assert_eq!(r, msg);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // The handler's error comes back as the call's.
    match park_on(bridge.call(node, common::FAIL, Vec::new())) {
        Err(BridgeError::Call(CallError::Remote { msg, .. })) => {
            assert_eq!(msg, "refused on purpose")
        }
        other => panic!("want the handler's error, got {other:?}"),
    }
    // `run` reaches the thread's context: several calls in one coroutine.
    let n = park_on(bridge.run(move |ctx| async move {
        let a = ctx.call(node, common::ECHO, b"a").await.unwrap();
        let b = ctx.call(node, common::ECHO, b"bc").await.unwrap();
        a.len() + b.len()
    }))
    .unwrap();
    assert_eq!(n, 3);
}

#[test]
fn calls_fail_closed_once_the_bridge_thread_is_gone() {
    let c = common::setup("bridge", "closed");
    let server = common::server(c.name(), 1);
    let (bridge, nodes) = BridgeClient::start(
        common::fabric(c.name(), 2),
        RuntimeConfig::default(),
        &[server.addr()],
    )
    .unwrap();
    let node = nodes[0];
    assert_eq!(
        park_on(bridge.call(node, common::ECHO, b"up".to_vec())).unwrap(),
        b"up"
    );
    // A coroutine that panics takes the bridge thread down.
    let r = park_on(bridge.run(|_| async { panic!("on purpose") }));
    assert!(matches!(r, Err(BridgeError::Closed)), "{r:?}");
    let r = park_on(bridge.call(node, common::ECHO, b"down".to_vec()));
    assert!(matches!(r, Err(BridgeError::Closed)), "{r:?}");
}

#[test]
fn a_start_that_cannot_connect_fails() {
    let c = common::setup("bridge", "noconnect");
    // A port nothing listens on: bind one, then free it.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let cfg = RuntimeConfig::default().with_connect_timeout(std::time::Duration::from_millis(300));
    let r = BridgeClient::start(common::fabric(c.name(), 2), cfg, &[addr]);
    assert!(matches!(r, Err(RpcError::Connect(_))), "{:?}", r.err());
}
