//! Registered user buffers: `alloc_buf`, `write_from` and `read_into` against a memory
//! node, the buffer coming back after each op, a buffer of another context refused, and
//! the size limits.

mod common;

use common::{fabric, mem_node, setup};
use rrpc::fabric::MrDesc;
use rrpc::prelude::*;
use rrpc::runtime::RegBuf;

#[test]
fn write_from_and_read_into_move_the_bytes_through_the_callers_buffer() {
    let c = setup("regbuf", "rw");
    let (mem, mr) = mem_node(c.name(), 1, 4096);
    let ctx = ThreadCtx::new(fabric(c.name(), 2), RuntimeConfig::default()).unwrap();
    let info = ctx.connect(mem.addr()).unwrap();
    let desc: MrDesc = info.export("mr").unwrap();
    let cx = ctx.clone();
    let back = block_on(&ctx, async move {
        let mut w = cx.alloc_buf(1000).unwrap();
        assert_eq!(w.len(), 1000);
        let pattern: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        w.write(0, &pattern);
        let w = cx.write_from(info.node, desc.at(100), w).await.unwrap();
        assert_eq!(w.to_vec(), pattern, "the WRITE leaves the buffer as it was");

        let r = cx.alloc_buf(1000).unwrap();
        let r = cx.read_into(info.node, desc.at(100), r).await.unwrap();
        assert_eq!(r.to_vec(), pattern);
        // A part of it, without copying the rest.
        let mut head = [0u8; 4];
        r.read(10, &mut head);
        assert_eq!(head, pattern[10..14]);
        r.to_vec()
    });
    // The memory node's region holds what was written.
    let mut there = vec![0u8; 1000];
    mr.read(100, &mut there);
    assert_eq!(there, back);
}

#[test]
fn a_buffer_of_another_context_is_refused_and_sizes_are_checked() {
    let c = setup("regbuf", "foreign");
    let (mem, _mr) = mem_node(c.name(), 1, 4096);
    let a = ThreadCtx::new(fabric(c.name(), 2), RuntimeConfig::default()).unwrap();
    let b = ThreadCtx::new(fabric(c.name(), 3), RuntimeConfig::default()).unwrap();
    let info = a.connect(mem.addr()).unwrap();
    let desc: MrDesc = info.export("mr").unwrap();
    let buf: RegBuf = b.alloc_buf(64).unwrap();
    let ca = a.clone();
    let r = block_on(
        &a,
        async move { ca.read_into(info.node, desc.at(0), buf).await },
    );
    assert!(matches!(r, Err(OneSidedError::ForeignBuffer)), "{r:?}");

    let max = RuntimeConfig::default().max_transfer;
    assert!(matches!(
        a.alloc_buf(max + 1),
        Err(OneSidedError::TooLarge { .. })
    ));
    // Buffers held take arena memory: allocating without dropping runs out, and dropping
    // gives it back.
    let mut held = Vec::new();
    let err = loop {
        match a.alloc_buf(max) {
            Ok(b) => held.push(b),
            Err(e) => break e,
        }
        assert!(held.len() < 1 << 20, "the arena never ran out");
    };
    assert!(matches!(err, OneSidedError::NoBuffer { .. }), "{err:?}");
    held.clear();
    assert!(a.alloc_buf(max).is_ok());
}

#[test]
#[should_panic(expected = "past its 8 bytes")]
fn reading_past_the_buffer_panics() {
    let c = setup("regbuf", "bounds");
    let ctx = ThreadCtx::new(fabric(c.name(), 2), RuntimeConfig::default()).unwrap();
    let b = ctx.alloc_buf(8).unwrap();
    let mut dst = [0u8; 4];
    b.read(6, &mut dst);
}

#[test]
fn call_into_returns_the_reply_in_a_registered_buffer() {
    let c = setup("regbuf", "call");
    let server = common::server(c.name(), 1);
    let ctx = ThreadCtx::new(fabric(c.name(), 2), RuntimeConfig::default()).unwrap();
    let node = ctx.connect_rpc(server.addr()).unwrap().node;
    let cx = ctx.clone();
    block_on(&ctx, async move {
        let zc0 = cx.stats().zero_copy_replies;
        for len in [1usize, 100, 3000] {
            let req: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
            let buf = cx.call_into(node, common::ECHO, &req, 4096).await.unwrap();
            assert_eq!(buf.len(), len);
            assert_eq!(buf.to_vec(), req);
            // The buffer is the caller's: it can go straight into a WRITE or be reused.
            drop(buf);
        }
        // The server wrote each reply into the buffer (no inline fallback).
        assert_eq!(cx.stats().zero_copy_replies - zc0, 3);
        // A reply larger than the room given fails the call, naming the cause.
        let big = vec![7u8; 2000];
        match cx.call_into(node, common::ECHO, &big, 1000).await {
            Err(CallError::Remote { .. }) | Err(CallError::TooLarge { .. }) => {}
            other => panic!("want a too-large error, got {other:?}"),
        }
        // The handler's error comes back as the call's.
        match cx.call_into(node, common::FAIL, b"x", 64).await {
            Err(CallError::Remote { msg, .. }) => assert_eq!(msg, "refused on purpose"),
            other => panic!("want the handler's error, got {other:?}"),
        }
    });
}
