//! `loom` model of the Rocket ring between a sender thread and a receiver thread
//! (Scythe, 4.6, Fig. 21), over every interleaving loom
//! explores (preemption bound 3).
//!
//! The ring memory is modeled word by word with loom atomics: a "WRITE" of a bucket
//! copies all words but the last with relaxed stores and publishes the last (the end
//! label) with a release store, as the shm fabric does; the receiver's label loads are
//! acquire. Credits travel back through a word with release/acquire. The model checks
//! that every message arrives exactly once, in order, intact, and that the sender never
//! overwrites a bucket the receiver has not consumed.

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use rrpc::rocket::{
    decode_batch, BucketSpan, MsgHeader, RingMem, RocketConfig, RocketReceiver, RocketSender,
};

/// Ring memory as loom atomics, one per 8-byte word (accesses are word-aligned here).
struct LoomRing(Vec<AtomicU64>);

impl LoomRing {
    fn new(bytes: usize) -> Self {
        Self((0..bytes / 8).map(|_| AtomicU64::new(0)).collect())
    }
}

impl RingMem for LoomRing {
    fn len(&self) -> usize {
        self.0.len() * 8
    }
    fn load_u64(&self, off: usize) -> u64 {
        self.0[off / 8].load(Ordering::Acquire)
    }
    fn store_u64(&self, off: usize, v: u64) {
        self.0[off / 8].store(v, Ordering::Release)
    }
    fn read(&self, off: usize, dst: &mut [u8]) {
        for (i, chunk) in dst.chunks_mut(8).enumerate() {
            let w = self.0[off / 8 + i].load(Ordering::Relaxed).to_le_bytes();
            chunk.copy_from_slice(&w[..chunk.len()]);
        }
    }
    fn write(&self, off: usize, src: &[u8]) {
        for (i, chunk) in src.chunks(8).enumerate() {
            let mut w = self.0[off / 8 + i].load(Ordering::Relaxed).to_le_bytes();
            w[..chunk.len()].copy_from_slice(chunk);
            self.0[off / 8 + i].store(u64::from_le_bytes(w), Ordering::Relaxed);
        }
    }
    fn zero(&self, off: usize, len: usize) {
        for i in 0..len / 8 {
            self.0[off / 8 + i].store(0, Ordering::Relaxed);
        }
    }
}

/// The fabric's WRITE: everything but the last word relaxed, the last word released.
fn post(staging: &LoomRing, ring: &LoomRing, s: BucketSpan) {
    let words = s.len / 8;
    for i in 0..words - 1 {
        let v = staging.0[s.offset / 8 + i].load(Ordering::Relaxed);
        ring.0[s.offset / 8 + i].store(v, Ordering::Relaxed);
    }
    let last = staging.0[s.offset / 8 + words - 1].load(Ordering::Relaxed);
    ring.0[s.offset / 8 + words - 1].store(last, Ordering::Release);
}

#[test]
fn ring_delivers_every_message_once_in_order() {
    const MESSAGES: u64 = 4;
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(|| {
        // Two 64-byte buckets, one 8-byte message per bucket: four messages force two
        // wrap-arounds and waits for credit.
        let cfg = RocketConfig::new(64, 2);
        let ring = Arc::new(LoomRing::new(cfg.ring_bytes()));
        let credit = Arc::new(AtomicU64::new(0));
        let (r2, c2) = (ring.clone(), credit.clone());
        let sender = loom::thread::spawn(move || {
            let staging = LoomRing::new(cfg.ring_bytes());
            let mut tx = RocketSender::new(cfg).unwrap();
            let mut spans = Vec::new();
            for i in 0..MESSAGES {
                let hdr = MsgHeader {
                    len: 8,
                    handler: 1,
                    kind: 1,
                    flags: 0,
                    call_id: i,
                };
                // One message per bucket: seal right after the push.
                while tx.push(&staging, hdr, &(0xA0 + i).to_le_bytes()).is_err() {
                    tx.on_credit(c2.load(Ordering::Acquire)).unwrap();
                    loom::thread::yield_now();
                }
                tx.seal(&staging);
                spans.clear();
                tx.take_ready(&mut spans);
                for s in &spans {
                    post(&staging, &r2, *s);
                }
            }
        });
        let mut rx = RocketReceiver::new(cfg).unwrap();
        let mut got = Vec::new();
        let mut batch = Vec::new();
        while (got.len() as u64) < MESSAGES {
            batch.clear();
            match rx.poll(&*ring, &mut batch) {
                Ok(true) => {
                    for m in decode_batch(&batch) {
                        let (h, p) = m.expect("an intact bucket");
                        assert_eq!(p, (0xA0 + h.call_id).to_le_bytes());
                        got.push(h.call_id);
                    }
                    if let Some(c) = rx.credit_due(1) {
                        credit.store(c, Ordering::Release);
                    }
                }
                Ok(false) => loom::thread::yield_now(),
                Err(e) => panic!("receiver saw a corrupt ring: {e}"),
            }
        }
        sender.join().unwrap();
        assert_eq!(got, (0..MESSAGES).collect::<Vec<_>>());
    });
}
