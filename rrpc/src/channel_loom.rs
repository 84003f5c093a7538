//! `loom` models of [`Channel`]'s credit return and replay (Scythe
//! Scythe, 4.6, Fig. 21): two threads, a sender channel A and a
//! receiver channel B, over every interleaving loom explores within a preemption bound
//! (given per model below: 3, or 2 and 1 where the state space grows fastest).
//!
//! Ring memory is modeled word by word with loom atomics ([`LoomMem`]). The "fabric" is
//! the harness in A's thread: a planned [`Item::Span`] is copied from A's staging into
//! B's ring with relaxed stores for every word but the last and a release store for the
//! last (the end label), as the shm fabric does; B's planned [`Item::Credit`] is stored
//! into A's credit word with a release store, which [`Channel::take_credit`] reads with
//! acquire loads. The receiver zeroes a consumed bucket with relaxed stores.
//!
//! - Model 1 ([`credit_return_across_wraps`], bound 3): A sends [`MESSAGES`] messages
//!   with `Batching::None`, one per bucket, through a ring of two 64-byte buckets, so it
//!   must wait for credit twice; B returns credit through its own `plan` (one bucket's
//!   worth for a ring this small).
//! - Model 2 ([`replay`]): A's first list (two buckets) fails after a prefix of it
//!   landed, A takes it back with [`Channel::failed`] and goes on to send
//!   [`REPLAYED_TOTAL`] messages in all, the last one wrapping onto the first bucket's
//!   slot. Prefixes: first bucket whole and second torn, i.e. all but its end label
//!   ([`replay_after_failure_delivers_rest_once_in_order`], bound 2); first bucket torn
//!   and second not landed ([`replay_after_first_bucket_torn`], bound 3); both whole
//!   ([`replay_of_a_list_that_landed_is_harmless`], bound 1). B runs throughout, so it
//!   may consume the landed bucket and return its credit before, during or after the
//!   failure and the replay; a replayed bucket is then written again only while A's
//!   credit does not cover it, and a duplicate of a consumed bucket must be ignored.
//!
//! Checked in both: every message arrives exactly once, in order, with its header and
//! payload intact; the sender never writes bucket `k` before the receiver consumed bucket
//! `k - buckets` (model 1 also checks that the slot's words are all zero, i.e. consumed
//! and zeroed, with a load that is not synchronized by anything but the protocol itself);
//! `plan` never lists a bucket below the credit A had read (checked against a relaxed
//! load of the credit word taken before `take_credit`); no deadlock or lost work (both
//! threads spin with `loom::thread::yield_now`; if `has_work` missed a bucket, A would
//! stop and B spin until loom's branch limit fails the model); A stops only when
//! `has_work` is false.
//!
//! Not modeled: the NIC reading staging asynchronously after the post (here a span is
//! copied when it is planned), and several lists failing at once (their order is a unit
//! test in `channel.rs`).
//!
//! Run (release: loom is slow in debug; `deploy/test.sh` runs it):
//! `cargo test -p rrpc --lib --release --features loom-models channel_loom`.
//! Without the `loom-models` feature this module is not compiled.

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;

use crate::channel::{Channel, Item};
use crate::fabric::{MrDesc, RemoteAddr};
use crate::mem::RingMem;
use crate::rocket::{decode_batch, BucketSpan, MsgHeader, RocketConfig, RocketError};
use crate::wire::Batching;

/// Messages model 1 sends: twice the ring's buckets, so the sender wraps twice.
const MESSAGES: u64 = 4;

/// Two 64-byte buckets: one message of 8 payload bytes takes 40 bytes of a bucket.
fn cfg() -> RocketConfig {
    RocketConfig {
        bucket_size: 64,
        buckets: 2,
    }
}

/// Memory of 8-byte atomic words (accesses are word-aligned here), shared by the channel
/// that owns it and the harness. Memory both threads touch is made of loom atomics;
/// memory only one thread touches (a staging buffer, the unused directions) of std
/// atomics, which are no scheduling points for loom and keep the state space small.
/// Loads and stores of single words are acquire and release (as [`RingMem`] specifies),
/// bulk copies and zeroing relaxed.
#[derive(Clone)]
enum LoomMem {
    Shared(Arc<Vec<AtomicU64>>),
    Local(std::sync::Arc<Vec<std::sync::atomic::AtomicU64>>),
}

impl LoomMem {
    fn shared(bytes: usize) -> Self {
        Self::Shared(Arc::new(
            (0..bytes / 8).map(|_| AtomicU64::new(0)).collect(),
        ))
    }
    fn local(bytes: usize) -> Self {
        Self::Local(std::sync::Arc::new(
            (0..bytes / 8)
                .map(|_| std::sync::atomic::AtomicU64::new(0))
                .collect(),
        ))
    }
    fn load(&self, off: usize, o: Ordering) -> u64 {
        match self {
            Self::Shared(w) => w[off / 8].load(o),
            Self::Local(w) => w[off / 8].load(o),
        }
    }
    fn store(&self, off: usize, v: u64, o: Ordering) {
        match self {
            Self::Shared(w) => w[off / 8].store(v, o),
            Self::Local(w) => w[off / 8].store(v, o),
        }
    }
}

impl RingMem for LoomMem {
    fn len(&self) -> usize {
        match self {
            Self::Shared(w) => w.len() * 8,
            Self::Local(w) => w.len() * 8,
        }
    }
    fn load_u64(&self, off: usize) -> u64 {
        self.load(off, Ordering::Acquire)
    }
    fn store_u64(&self, off: usize, v: u64) {
        self.store(off, v, Ordering::Release)
    }
    fn read(&self, off: usize, dst: &mut [u8]) {
        for (i, chunk) in dst.chunks_mut(8).enumerate() {
            let w = self.load(off + 8 * i, Ordering::Relaxed).to_le_bytes();
            chunk.copy_from_slice(&w[..chunk.len()]);
        }
    }
    fn write(&self, off: usize, src: &[u8]) {
        for (i, chunk) in src.chunks(8).enumerate() {
            let mut w = self.load(off + 8 * i, Ordering::Relaxed).to_le_bytes();
            w[..chunk.len()].copy_from_slice(chunk);
            self.store(off + 8 * i, u64::from_le_bytes(w), Ordering::Relaxed);
        }
    }
    fn zero(&self, off: usize, len: usize) {
        for i in 0..len / 8 {
            self.store(off + 8 * i, 0, Ordering::Relaxed);
        }
    }
}

/// The memories of one end: its staging copy of the peer's ring, its receive ring and
/// its words (word 0: its credit, written by the peer).
#[derive(Clone)]
struct End {
    staging: LoomMem,
    ring: LoomMem,
    words: LoomMem,
}

impl End {
    /// The sender's end: its words (credit) are written by the receiver's thread.
    fn sender() -> Self {
        let bytes = cfg().ring_bytes();
        Self {
            staging: LoomMem::local(bytes),
            ring: LoomMem::local(bytes),
            words: LoomMem::shared(16),
        }
    }

    /// The receiver's end: its ring is written by the sender's thread.
    fn receiver() -> Self {
        let bytes = cfg().ring_bytes();
        Self {
            staging: LoomMem::local(bytes),
            ring: LoomMem::shared(bytes),
            words: LoomMem::local(16),
        }
    }

    fn channel(&self, batching: Batching) -> Channel<LoomMem> {
        let c = cfg();
        Channel::new(
            c,
            batching,
            self.staging.clone(),
            self.ring.clone(),
            self.words.clone(),
            MrDesc {
                addr: 0,
                len: c.ring_bytes() as u64,
                rkey: 1,
            },
            RemoteAddr { addr: 0, rkey: 2 },
        )
        .expect("a valid geometry")
    }
}

fn hdr(i: u64) -> MsgHeader {
    MsgHeader {
        len: 0,
        handler: 3,
        kind: 1,
        flags: 0,
        call_id: i,
    }
}

fn payload(i: u64) -> [u8; 8] {
    (0xA0 + i).to_le_bytes()
}

/// How a span lands.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Land {
    Whole,
    /// All but the end label (a WRITE cut short by the QP's failure).
    Torn,
}

/// The sender's fabric: lands A's spans in B's ring and checks that no bucket is written
/// over one the receiver has not consumed.
struct Fabric {
    /// A's staging.
    src: LoomMem,
    /// B's ring.
    dst: LoomMem,
    /// A's words (word 0: the credit B returns).
    credit: LoomMem,
    /// Buckets B has consumed, stored (relaxed) by B after zeroing each and before
    /// returning its credit; read relaxed here, so it adds no synchronization.
    b_consumed: Arc<AtomicU64>,
    /// Whether the target slot must be all zero (no replay can have left a duplicate in
    /// it).
    check_zero: bool,
}

impl Fabric {
    fn land(&self, s: &BucketSpan, how: Land) {
        let buckets = cfg().buckets as u64;
        let consumed = self.b_consumed.load(Ordering::Relaxed);
        assert!(
            s.seq < consumed + buckets,
            "bucket {} written, but the receiver's consumption of bucket {} does not \
             happen before it (receiver consumed {consumed})",
            s.seq,
            s.seq - buckets
        );
        let words = s.len / 8;
        let at = s.offset;
        if self.check_zero {
            for i in 0..words {
                assert_eq!(
                    self.dst.load(at + 8 * i, Ordering::Relaxed),
                    0,
                    "bucket {} lands on a slot not consumed (word {i})",
                    s.seq
                );
            }
        }
        for i in 0..words - 1 {
            let v = self.src.load(at + 8 * i, Ordering::Relaxed);
            self.dst.store(at + 8 * i, v, Ordering::Relaxed);
        }
        if how == Land::Whole {
            let last = self.src.load(at + 8 * (words - 1), Ordering::Relaxed);
            self.dst
                .store(at + 8 * (words - 1), last, Ordering::Release);
        }
    }
}

/// A's loop: push messages `next..total` (one bucket each without msg batching), plan,
/// land everything whole, take credit, until everything was pushed and nothing is left
/// to post. Spins with `yield_now` while waiting for credit.
fn send(a: &mut Channel<LoomMem>, fabric: &Fabric, mut next: u64, total: u64) {
    let mut items = Vec::new();
    loop {
        // A lower bound of the credit `take_credit` sees (a later load of the same word
        // reads the same store or a newer one); relaxed, so it adds no synchronization.
        let floor = fabric.credit.load(0, Ordering::Relaxed);
        a.take_credit().expect("credit within what was posted");
        let mut progress = false;
        while next < total {
            match a.push(hdr(next), &[&payload(next)[..]]) {
                Ok(()) => {
                    next += 1;
                    progress = true;
                }
                Err(RocketError::RingFull) => break,
                Err(e) => panic!("push: {e}"),
            }
        }
        if a.has_work() {
            items.clear();
            a.plan(&mut items);
            for it in &items {
                match it {
                    Item::Span(s) => {
                        assert!(
                            s.seq >= floor,
                            "bucket {} posted again after credit {floor} covered it",
                            s.seq
                        );
                        fabric.land(s, Land::Whole)
                    }
                    other => panic!("A planned {other:?}"),
                }
                progress = true;
            }
        }
        if next == total && !a.has_work() {
            return;
        }
        if !progress {
            loom::thread::yield_now();
        }
    }
}

/// B's loop: poll until `total` messages arrived, checking order and contents, and
/// return credit through B's own plan (applied to A's credit word with a release
/// store). Spins with `yield_now` while nothing arrives.
fn receive(b: &mut Channel<LoomMem>, a_words: &LoomMem, b_consumed: &AtomicU64, total: u64) {
    let mut got = Vec::new();
    let mut buckets = 0u64;
    let mut batch = Vec::new();
    let mut items = Vec::new();
    while (got.len() as u64) < total {
        batch.clear();
        match b.poll(&mut batch) {
            Ok(true) => {
                buckets += 1;
                b_consumed.store(buckets, Ordering::Relaxed);
                for m in decode_batch(&batch) {
                    let (h, p) = m.expect("an intact bucket");
                    assert_eq!((h.handler, h.kind, h.len), (3, 1, 8), "header of {h:?}");
                    assert_eq!(p, payload(h.call_id), "payload of {}", h.call_id);
                    assert_eq!(h.call_id, got.len() as u64, "out of order or twice");
                    got.push(h.call_id);
                }
            }
            Ok(false) => {}
            Err(e) => panic!("receiver saw a corrupt ring: {e}"),
        }
        items.clear();
        b.plan(&mut items);
        let mut progress = false;
        for it in &items {
            match it {
                Item::Credit(c) => a_words.store_u64(0, *c),
                other => panic!("B planned {other:?}"),
            }
            progress = true;
        }
        if batch.is_empty() && !progress {
            loom::thread::yield_now();
        }
    }
    assert_eq!(got, (0..total).collect::<Vec<_>>());
}

fn builder(preemptions: usize) -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(preemptions);
    b
}

fn credit_return(batching: Batching) {
    builder(3).check(move || {
        let (ea, eb) = (End::sender(), End::receiver());
        let a_words = ea.words.clone();
        let b_consumed = Arc::new(AtomicU64::new(0));
        let fabric = Fabric {
            src: ea.staging.clone(),
            dst: eb.ring.clone(),
            credit: ea.words.clone(),
            b_consumed: b_consumed.clone(),
            check_zero: true,
        };
        let sender = loom::thread::spawn(move || {
            let mut a = ea.channel(batching);
            send(&mut a, &fabric, 0, MESSAGES);
        });
        let mut b = eb.channel(batching);
        receive(&mut b, &a_words, &b_consumed, MESSAGES);
        sender.join().unwrap();
    });
}

/// Model 1: see the module docs.
#[test]
fn credit_return_across_wraps() {
    credit_return(Batching::None);
}

/// Messages model 2 sends: the failed list's two, then more behind them.
const REPLAYED_TOTAL: u64 = 3;

/// Model 2 with the first list landing as `first` (one entry per bucket; the rest of
/// the list did not land) before its QP fails.
fn replay(first: [Option<Land>; 2], preemptions: usize) {
    builder(preemptions).check(move || {
        let (ea, eb) = (End::sender(), End::receiver());
        let a_words = ea.words.clone();
        let b_consumed = Arc::new(AtomicU64::new(0));
        let fabric = Fabric {
            src: ea.staging.clone(),
            dst: eb.ring.clone(),
            credit: ea.words.clone(),
            b_consumed: b_consumed.clone(),
            // A replayed bucket the receiver consumed meanwhile lands again, and the
            // next lap's bucket lands over that duplicate: the bucket counter is the check.
            check_zero: false,
        };
        let sender = loom::thread::spawn(move || {
            let mut a = ea.channel(Batching::None);
            for i in 0..2 {
                a.push(hdr(i), &[&payload(i)[..]])
                    .expect("two free buckets");
            }
            let mut items = Vec::new();
            a.plan(&mut items);
            assert_eq!(items.len(), 2, "one span per message: {items:?}");
            for (it, how) in items.iter().zip(first) {
                let Item::Span(s) = it else {
                    panic!("A planned {it:?}")
                };
                if let Some(how) = how {
                    fabric.land(s, how);
                }
            }
            // The QP failed: everything the list carried comes back, in order.
            a.failed(items.drain(..));
            send(&mut a, &fabric, 2, REPLAYED_TOTAL);
        });
        let mut b = eb.channel(Batching::None);
        receive(&mut b, &a_words, &b_consumed, REPLAYED_TOTAL);
        sender.join().unwrap();
    });
}

/// Model 2: the first bucket landed, the second is torn.
#[test]
fn replay_after_failure_delivers_rest_once_in_order() {
    replay([Some(Land::Whole), Some(Land::Torn)], 2);
}

/// Model 2: the whole list landed before the QP failed (every replayed bucket is a
/// duplicate unless the credit for it arrived first).
#[test]
fn replay_of_a_list_that_landed_is_harmless() {
    replay([Some(Land::Whole), Some(Land::Whole)], 1);
}

/// Model 2: the first bucket is torn, the second did not land.
#[test]
fn replay_after_first_bucket_torn() {
    replay([Some(Land::Torn), None], 3);
}
