//! Hybrid reply modes (Scythe, 4.6 (2), Fig. 20), deadlines and the
//! sorted-batch hook (4.4, Fig. 16), over real server threads on `$RRPC_FABRIC`.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rrpc::runtime::{block_on, CallError, CallOpts, Executor, ReplyMode, RuntimeConfig, ThreadCtx};
use rrpc::server::Handlers;

mod common;
use common::{fabric, server_with, setup, ECHO};

/// Reply of `len` bytes (request: u32 LE), byte i = (i * 7 + len) as u8.
const GEN: u16 = 10;
/// Sleeps the request's u64 LE milliseconds, then replies with 16 bytes (or the
/// request's second u64 bytes, if given).
const SLOW: u16 = 11;
/// Sorted-batch handler: request = key u64, ts u64.
const SORTED: u16 = 12;

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + len) as u8).collect()
}

type Batches = Arc<Mutex<Vec<Vec<(u64, u64)>>>>;

fn handlers(batches: Batches) -> Handlers {
    let mut h = common::echo_handlers();
    h.register(GEN, |req, out| {
        let len = u32::from_le_bytes(req.try_into().map_err(|_| "want a u32")?) as usize;
        out.extend_from_slice(&pattern(len));
        Ok(())
    });
    h.register(SLOW, |req, out| {
        let ms = u64::from_le_bytes(req[..8].try_into().unwrap());
        std::thread::sleep(Duration::from_millis(ms));
        let n = req
            .get(8..16)
            .map_or(16, |b| u64::from_le_bytes(b.try_into().unwrap()) as usize);
        out.extend_from_slice(&pattern(n));
        Ok(())
    });
    h.register_sorted(
        SORTED,
        |p| {
            Some((
                u64::from_le_bytes(p.get(..8)?.try_into().ok()?),
                u64::from_le_bytes(p.get(8..16)?.try_into().ok()?),
            ))
        },
        move |reqs, results| {
            batches
                .lock()
                .unwrap()
                .push(reqs.iter().map(|r| (r.key, r.ts)).collect());
            for (i, r) in reqs.iter().enumerate() {
                let mut v = (i as u64).to_le_bytes().to_vec();
                v.extend_from_slice(&r.key.to_le_bytes());
                results.push(Ok(v));
            }
        },
    );
    h
}

#[test]
fn every_mode_at_and_around_the_threshold_and_bucket_boundaries() {
    let c = setup("modes", "sizes");
    let srv = server_with(c.name(), handlers(Batches::default()), 1);
    let ctx = ThreadCtx::new(fabric(c.name(), 100), RuntimeConfig::default()).unwrap();
    let node = ctx.connect_rpc(srv.addr()).unwrap().node;
    // Bucket 512 B: an inline reply carries at most 480 bytes; threshold 512.
    let sizes = [
        0usize,
        1,
        8,
        479,
        480,
        481,
        511,
        512,
        513,
        4096,
        64 << 10,
        (1 << 20) - 1,
        1 << 20,
    ];
    let c2 = ctx.clone();
    block_on(&ctx, async move {
        for &len in &sizes {
            let req = (len as u32).to_le_bytes();
            let want = pattern(len);
            let cases = [
                ("auto", CallOpts::default()),
                (
                    "auto+len",
                    CallOpts {
                        reply_len: Some(len),
                        ..CallOpts::default()
                    },
                ),
                ("rpc", CallOpts::mode(ReplyMode::Rpc)),
                ("read", CallOpts::mode(ReplyMode::Read)),
                (
                    "zero-copy",
                    CallOpts {
                        mode: ReplyMode::ZeroCopy,
                        reply_len: Some(len),
                        ..CallOpts::default()
                    },
                ),
            ];
            for (name, opts) in cases {
                let before = c2.stats();
                let r = c2.call_with(node, GEN, &req, opts).await;
                let after = c2.stats();
                if name == "rpc" && len > 480 {
                    let Err(CallError::Remote { msg, .. }) = &r else {
                        panic!("{name} {len}: {r:?}");
                    };
                    assert!(msg.contains("exceeds the 480-byte limit"), "{msg}");
                    continue;
                }
                assert_eq!(r.as_deref().ok(), Some(&want[..]), "{name} {len}: {r:?}");
                let (inline, read, zc) = (
                    after.inline_replies - before.inline_replies,
                    after.read_replies - before.read_replies,
                    after.zero_copy_replies - before.zero_copy_replies,
                );
                let expect = match name {
                    "auto" if len <= 480 => (1, 0, 0),
                    "auto" => (0, 1, 0),
                    "auto+len" if len <= 480 => (1, 0, 0),
                    "auto+len" if len <= 512 => (0, 1, 0),
                    "auto+len" => (0, 0, 1),
                    "rpc" => (1, 0, 0),
                    "read" => (0, 1, 0),
                    _ => (0, 0, 1),
                };
                assert_eq!((inline, read, zc), expect, "{name} {len}");
            }
        }
    });
    let st = ctx.stats();
    assert!(st.read_replies > 0 && st.zero_copy_replies > 0 && st.inline_replies > 0);
}

#[test]
fn payloads_too_large_for_a_mode_are_errors_not_truncations() {
    let c = setup("modes", "limits");
    let srv = server_with(c.name(), handlers(Batches::default()), 1);
    // Replies of 4 MiB are generated and refused here: generous deadlines, since the
    // Soft-RoCE VM runs under emulation on a loaded host (a 2 s default has expired there).
    let cfg = RuntimeConfig::default().with_call_timeout(Duration::from_secs(60));
    let ctx = ThreadCtx::new(fabric(c.name(), 101), cfg).unwrap();
    let node = ctx.connect_rpc(srv.addr()).unwrap().node;
    let c2 = ctx.clone();
    block_on(&ctx, async move {
        // Requests ride in a bucket up to 480 bytes (464 with the zero-copy prefix);
        // larger ones, up to the largest transfer, go by reference and the server
        // READs them. Past that, nothing is sent.
        assert!(c2.call(node, ECHO, &[1u8; 480]).await.is_ok());
        let fetched = c2.stats().fetched_requests;
        let big: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        let r = c2
            .call_with(node, ECHO, &big, CallOpts::mode(ReplyMode::Read))
            .await
            .unwrap();
        assert_eq!(r, big);
        assert_eq!(
            c2.call(node, ECHO, &[1u8; 481]).await.unwrap(),
            vec![1u8; 481]
        );
        assert_eq!(c2.stats().fetched_requests, fetched + 2);
        assert!(matches!(
            c2.call(node, ECHO, &vec![1u8; (4 << 20) + 1]).await,
            Err(CallError::TooLarge { max, .. }) if max == 4 << 20
        ));
        let zc = |n| CallOpts {
            mode: ReplyMode::ZeroCopy,
            reply_len: Some(n),
            ..CallOpts::default()
        };
        assert_eq!(
            c2.call_with(node, ECHO, &[2u8; 464], zc(464))
                .await
                .unwrap(),
            vec![2u8; 464]
        );
        // Both a zero-copy reply and a request sent by reference.
        assert_eq!(
            c2.call_with(node, ECHO, &[3u8; 5000], zc(5000))
                .await
                .unwrap(),
            vec![3u8; 5000]
        );
        // A reply larger than the caller's zero-copy buffer.
        let r = c2
            .call_with(node, GEN, &1000u32.to_le_bytes(), zc(999))
            .await;
        assert!(
            matches!(&r, Err(CallError::Remote { msg, .. }) if msg.contains("999-byte zero-copy buffer")),
            "{r:?}"
        );
        // A zero-copy buffer beyond the runtime's largest transfer.
        assert!(matches!(
            c2.call_with(node, GEN, &8u32.to_le_bytes(), zc((4 << 20) + 1))
                .await,
            Err(CallError::TooLarge { .. })
        ));
        // A READ-mode reply beyond the server's limit (4 MiB).
        let r = c2
            .call_with(
                node,
                GEN,
                &((4u32 << 20) + 1).to_le_bytes(),
                CallOpts::mode(ReplyMode::Read),
            )
            .await;
        assert!(
            matches!(&r, Err(CallError::Remote { msg, .. }) if msg.contains("exceeds the server's")),
            "{r:?}"
        );
        // The channel still works afterwards.
        assert_eq!(c2.call(node, ECHO, b"still").await.unwrap(), b"still");
    });
}

#[test]
fn deadlines_expire_and_late_replies_are_dropped() {
    let c = setup("modes", "deadline");
    let srv = server_with(c.name(), handlers(Batches::default()), 1);
    let ctx = ThreadCtx::new(
        fabric(c.name(), 102),
        RuntimeConfig::default().with_call_timeout(Duration::from_millis(100)),
    )
    .unwrap();
    let node = ctx.connect_rpc(srv.addr()).unwrap().node;
    let c2 = ctx.clone();
    block_on(&ctx, async move {
        let slow = |ms: u64, n: u64| {
            let mut v = ms.to_le_bytes().to_vec();
            v.extend_from_slice(&n.to_le_bytes());
            v
        };
        // Default deadline (100 ms) against a 300 ms handler: the call ends at its own
        // deadline (the error names it), not when the late reply comes.
        let r = c2.call(node, SLOW, &slow(300, 16)).await;
        assert!(
            matches!(r, Err(CallError::Timeout { after, .. }) if after == Duration::from_millis(100)),
            "{r:?}"
        );
        assert_eq!(c2.calls_in_flight(), (0, 0));
        // A per-call deadline overrides it.
        let long = CallOpts {
            timeout: Some(Duration::from_secs(5)),
            ..CallOpts::default()
        };
        assert_eq!(
            c2.call_with(node, SLOW, &slow(150, 16), long)
                .await
                .unwrap(),
            pattern(16)
        );
        // A zero-copy call that times out: its buffer stays reserved for the late WRITE.
        let zc = CallOpts {
            mode: ReplyMode::ZeroCopy,
            reply_len: Some(8192),
            timeout: Some(Duration::from_millis(50)),
        };
        let r = c2.call_with(node, SLOW, &slow(200, 8192), zc).await;
        assert!(matches!(r, Err(CallError::Timeout { .. })), "{r:?}");
        // Late replies of both are dropped; later calls get their own replies.
        for i in 0..20u32 {
            let req = i.to_le_bytes();
            let opts = CallOpts {
                timeout: Some(Duration::from_secs(2)),
                ..CallOpts::default()
            };
            assert_eq!(c2.call_with(node, ECHO, &req, opts).await.unwrap(), req);
        }
    });
}

#[test]
fn sorted_batch_hook_sees_a_rounds_requests_in_key_timestamp_order() {
    let c = setup("modes", "sorted");
    let batches = Batches::default();
    let srv = server_with(c.name(), handlers(batches.clone()), 1);
    let ctx = ThreadCtx::new(fabric(c.name(), 103), RuntimeConfig::default()).unwrap();
    let node = ctx.connect_rpc(srv.addr()).unwrap().node;
    let mut ex = Executor::new(ctx.clone());
    let replies = Rc::new(RefCell::new(Vec::new()));
    // 24 coroutines issue in the same polling round, keys and timestamps scrambled.
    for i in 0..24u64 {
        let (ctx, replies) = (ctx.clone(), replies.clone());
        ex.spawn(async move {
            let key = (i * 7) % 5;
            let ts = 1000 - (i * 13) % 97;
            let mut req = key.to_le_bytes().to_vec();
            req.extend_from_slice(&ts.to_le_bytes());
            let r = ctx.call(node, SORTED, &req).await.unwrap();
            assert_eq!(&r[8..16], &key.to_le_bytes());
            replies.borrow_mut().push((key, ts));
        });
    }
    {
        let ctx = ctx.clone();
        ex.spawn(async move {
            let r = ctx.call(node, SORTED, b"short").await;
            assert!(
                matches!(&r, Err(CallError::Remote { msg, .. }) if msg.contains("malformed")),
                "{r:?}"
            );
        });
    }
    ex.run();
    assert_eq!(replies.borrow().len(), 24);
    let b = batches.lock().unwrap();
    assert_eq!(b.iter().map(Vec::len).sum::<usize>(), 24);
    assert!(
        b.iter().any(|x| x.len() > 1),
        "one round's requests form a batch: {b:?}"
    );
    for batch in b.iter() {
        assert!(
            batch.windows(2).all(|w| w[0] <= w[1]),
            "sorted by (key, ts): {batch:?}"
        );
    }
}
