//! Criterion benches of the Rocket message ring and of RPC handler dispatch.
//!
//! All ring benches use the default [`RocketConfig`] (64 buckets of 512 bytes) over
//! [`HeapRing`] memory (the reference `RingMem` of `AtomicU64` words) and report
//! throughput in messages, so criterion's time per element is the cost per message.
//! Payload sizes S are 8, 64 and 256 bytes (a 512-byte bucket holds 20, 6 and 1 such
//! messages).
//!
//! - `rocket/encode/S`: sender side only. Per iteration, [`RocketSender::push`] of
//!   [`ENCODE_MSGS`] messages into the staging buffer, then `seal` and `take_ready`. The
//!   receiver is simulated by [`RocketSender::on_credit`] with the number of buckets
//!   handed out (at the end of the iteration, and whenever a push reports `RingFull`),
//!   so no receiver work and no copying to a ring is measured.
//! - `rocket/decode/S`: receiver side only. The setup (not measured, via `iter_batched`)
//!   builds a fresh ring and copies every sealed span of a staging buffer that a sender
//!   filled completely (64 buckets) into it at the same offset with
//!   `RingMem::read`/`write`, emulating the RDMA WRITEs. The measured routine runs
//!   [`RocketReceiver::poll`] until the ring is empty and iterates [`decode_batch`] over
//!   each delivered batch.
//! - `rocket/roundtrip/S`: one full bucket of messages end to end on a persistent
//!   sender/receiver pair: push, seal, take_ready, copy the span staging -> ring
//!   (`read` + `write`), poll, decode, `credit_due(1)` -> `on_credit`.
//! - `dispatch/*`: [`Handlers::call`] with 32-byte requests: `echo` (handler copies the
//!   request into the response), `u64` (handler returns an 8-byte value) and `miss` (an
//!   unregistered id: map lookup miss plus formatting the "no handler N" error).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use rrpc::rocket::{
    decode_batch, BucketSpan, HeapRing, MsgHeader, RingMem, RocketConfig, RocketError,
    RocketReceiver, RocketSender, LABEL_BYTES, MSG_HEADER_BYTES,
};
use rrpc::server::Handlers;
use rrpc::wire::MsgKind;

/// Payload sizes in bytes.
const SIZES: [usize; 3] = [8, 64, 256];

/// Messages pushed per `rocket/encode` iteration.
const ENCODE_MSGS: usize = 256;

/// Request size in bytes of the `dispatch` benches.
const REQ_BYTES: usize = 32;

fn header(i: u64) -> MsgHeader {
    MsgHeader {
        len: 0, // overwritten by `push`
        handler: 7,
        kind: MsgKind::Request as u8,
        flags: 0,
        call_id: i,
    }
}

fn payload(len: usize) -> Vec<u8> {
    (0..len).map(|i| i as u8).collect()
}

/// Messages of `payload_len` bytes that fill one bucket of `cfg` (no more fit).
fn msgs_per_bucket(cfg: RocketConfig, payload_len: usize) -> usize {
    (cfg.bucket_size - 2 * LABEL_BYTES) / (MSG_HEADER_BYTES + payload_len.next_multiple_of(8))
}

/// Copy `span` from `staging` to the same offset of `ring` (the RDMA WRITE), through `buf`.
fn copy_span(staging: &HeapRing, ring: &HeapRing, span: BucketSpan, buf: &mut Vec<u8>) {
    buf.resize(span.len, 0);
    staging.read(span.offset, buf);
    ring.write(span.offset, buf);
}

/// Poll `ring` until no bucket is ready, decoding every message; returns the message count.
fn drain(rx: &mut RocketReceiver, ring: &HeapRing, out: &mut Vec<u8>) -> usize {
    let mut n = 0;
    loop {
        out.clear();
        if !rx.poll(ring, out).expect("poll") {
            return n;
        }
        for m in decode_batch(out) {
            black_box(m.expect("decode"));
            n += 1;
        }
    }
}

fn encode(c: &mut Criterion) {
    let cfg = RocketConfig::default();
    let mut g = c.benchmark_group("rocket/encode");
    for size in SIZES {
        let body = payload(size);
        let staging = HeapRing::new(cfg.ring_bytes());
        let mut tx = RocketSender::new(cfg).expect("config");
        let mut spans = Vec::with_capacity(cfg.buckets);
        // Hand out everything sealed and pretend the receiver consumed it at once.
        let credit = |tx: &mut RocketSender, spans: &mut Vec<BucketSpan>| {
            tx.seal(&staging);
            tx.take_ready(spans);
            spans.clear();
            tx.on_credit(tx.posted()).expect("credit");
        };
        g.throughput(Throughput::Elements(ENCODE_MSGS as u64));
        g.bench_function(size.to_string(), |b| {
            let mut i = 0u64;
            b.iter(|| {
                for _ in 0..ENCODE_MSGS {
                    i += 1;
                    match tx.push(&staging, header(i), black_box(&body)) {
                        Ok(()) => {}
                        Err(RocketError::RingFull) => {
                            credit(&mut tx, &mut spans);
                            tx.push(&staging, header(i), &body).expect("push");
                        }
                        Err(e) => panic!("push: {e}"),
                    }
                }
                credit(&mut tx, &mut spans);
            })
        });
    }
    g.finish();
}

fn decode(c: &mut Criterion) {
    let cfg = RocketConfig::default();
    let mut g = c.benchmark_group("rocket/decode");
    for size in SIZES {
        // Fill the whole staging buffer once: 64 sealed buckets.
        let body = payload(size);
        let staging = HeapRing::new(cfg.ring_bytes());
        let mut tx = RocketSender::new(cfg).expect("config");
        let mut msgs = 0;
        while tx.can_push(size) {
            tx.push(&staging, header(msgs as u64), &body).expect("push");
            msgs += 1;
        }
        tx.seal(&staging);
        let mut spans = Vec::new();
        tx.take_ready(&mut spans);
        assert_eq!(spans.len(), cfg.buckets);
        assert_eq!(msgs, cfg.buckets * msgs_per_bucket(cfg, size));

        let mut buf = Vec::new();
        let mut out = Vec::with_capacity(cfg.bucket_size);
        g.throughput(Throughput::Elements(msgs as u64));
        g.bench_function(size.to_string(), |b| {
            b.iter_batched(
                || {
                    let ring = HeapRing::new(cfg.ring_bytes());
                    for s in &spans {
                        copy_span(&staging, &ring, *s, &mut buf);
                    }
                    (RocketReceiver::new(cfg).expect("config"), ring)
                },
                |(mut rx, ring)| {
                    assert_eq!(drain(&mut rx, &ring, &mut out), msgs);
                    (rx, ring) // dropped outside the measurement
                },
                // Each input is a 32 KiB ring: keep few of them alive at once.
                BatchSize::NumIterations(8),
            )
        });
    }
    g.finish();
}

fn roundtrip(c: &mut Criterion) {
    let cfg = RocketConfig::default();
    let mut g = c.benchmark_group("rocket/roundtrip");
    for size in SIZES {
        let body = payload(size);
        let per_bucket = msgs_per_bucket(cfg, size);
        let staging = HeapRing::new(cfg.ring_bytes());
        let ring = HeapRing::new(cfg.ring_bytes());
        let mut tx = RocketSender::new(cfg).expect("config");
        let mut rx = RocketReceiver::new(cfg).expect("config");
        let mut spans = Vec::with_capacity(1);
        let mut buf = Vec::new();
        let mut out = Vec::with_capacity(cfg.bucket_size);
        g.throughput(Throughput::Elements(per_bucket as u64));
        g.bench_function(size.to_string(), |b| {
            let mut i = 0u64;
            b.iter(|| {
                for _ in 0..per_bucket {
                    i += 1;
                    tx.push(&staging, header(i), black_box(&body))
                        .expect("push");
                }
                tx.seal(&staging);
                tx.take_ready(&mut spans);
                debug_assert_eq!(spans.len(), 1);
                for s in spans.drain(..) {
                    copy_span(&staging, &ring, s, &mut buf);
                }
                assert_eq!(drain(&mut rx, &ring, &mut out), per_bucket);
                if let Some(consumed) = rx.credit_due(1) {
                    tx.on_credit(consumed).expect("credit");
                }
            })
        });
    }
    g.finish();
}

fn dispatch(c: &mut Criterion) {
    const ECHO: u16 = 1;
    const U64: u16 = 2;
    const MISSING: u16 = 999;
    let mut h = Handlers::new();
    h.register(ECHO, |req, out| {
        out.extend_from_slice(req);
        Ok(())
    });
    h.register(U64, |_req, out| {
        out.extend_from_slice(&0x0123_4567_89ab_cdef_u64.to_le_bytes());
        Ok(())
    });
    let req = payload(REQ_BYTES);
    let mut out = Vec::with_capacity(256);
    // Check the handlers do what the bench names claim.
    assert_eq!(h.call(ECHO, &req, &mut out), MsgKind::Response);
    assert_eq!(out, req);
    assert_eq!(h.call(U64, &req, &mut out), MsgKind::Response);
    assert_eq!(out.len(), 8);
    assert_eq!(h.call(MISSING, &req, &mut out), MsgKind::Error);

    let mut g = c.benchmark_group("dispatch");
    g.throughput(Throughput::Elements(1));
    for (name, id) in [("echo", ECHO), ("u64", U64), ("miss", MISSING)] {
        g.bench_function(name, |b| {
            b.iter(|| black_box(h.call(black_box(id), black_box(&req), &mut out)))
        });
    }
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_secs(1))
        .sample_size(20)
}

criterion_group! {
    name = benches;
    config = config();
    targets = encode, decode, roundtrip, dispatch
}
criterion_main!(benches);
