//! Rocket message ring: a sans-IO state machine for the RRPC message ring
//! between one sender thread and one receiver.
//!
//! Design source: Scythe section 4.6, Fig. 21.
//!
//! The ring lives in the receiver's memory and is divided into `buckets`
//! fixed slots of `bucket_size` bytes. The sender keeps a staging buffer with
//! the same size and layout in its own memory; it batches messages into the
//! open bucket of the staging buffer, seals it (writes a start and an end
//! label), and the I/O layer copies each sealed bucket into the remote ring
//! with one RDMA WRITE at the same offset and length. The receiver polls the
//! ring for the next bucket, checks that both labels agree, delivers the
//! batch, zeroes the bucket's span and counts it as consumed. The consumed
//! bucket count flows back to the sender as credit, so the sender never
//! overwrites a bucket the receiver has not read.
//!
//! Sealed bucket layout (bucket number `k`, batch of `L` message bytes, `L` a
//! multiple of 8 and `L > 0`), at ring offset `(k % buckets) * bucket_size`:
//!
//! ```text
//! [0, 8)        start label = ((k as u32 as u64) << 32) | L
//! [8, 8 + L)    messages: 16-byte MsgHeader + payload padded with zeros to 8
//! [8 + L, 16+L) end label  (equal to the start label)
//! ```
//!
//! Nothing in this module performs I/O, spawns threads or reads a clock.

use std::collections::VecDeque;
use thiserror::Error;

/// Size in bytes of one bucket label (start or end).
/// Scythe section 4.6, Fig. 21.
pub const LABEL_BYTES: usize = 8;

/// Size in bytes of an encoded [`MsgHeader`].
/// Scythe section 4.6, Fig. 21.
pub const MSG_HEADER_BYTES: usize = 16;

/// Round a byte count up to a multiple of 8.
const fn pad8(n: usize) -> usize {
    (n + 7) & !7
}

/// Errors of the Rocket ring state machines.
/// Scythe section 4.6, Fig. 21.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RocketError {
    /// A payload of `len` bytes exceeds the per-message maximum of `max` bytes
    /// (`bucket_size - 32`). Nothing was written.
    #[error("payload of {len} bytes exceeds the maximum of {max} bytes")]
    TooLarge {
        /// Payload length in bytes.
        len: usize,
        /// Largest payload in bytes that fits into one bucket.
        max: usize,
    },
    /// No bucket can be opened: all `buckets` slots hold sealed or open
    /// buckets the receiver has not yet consumed. Nothing was written; retry
    /// after credit arrives.
    #[error("ring full: no free bucket until the receiver returns credit")]
    RingFull,
    /// Ring contents or a credit value violate the protocol.
    #[error("corrupt ring state: {what}")]
    Corrupt {
        /// Short description of the violated check.
        what: &'static str,
    },
    /// The [`RocketConfig`] is not usable; the string names the violated rule.
    #[error("bad rocket config: {0}")]
    BadConfig(&'static str),
    /// A staging buffer or ring of `have` bytes is smaller than the
    /// `need` bytes (`ring_bytes()`) the configuration requires.
    #[error("ring memory too small: have {have} bytes, need {need} bytes")]
    StagingTooSmall {
        /// Bytes available in the memory.
        have: usize,
        /// Bytes required (`bucket_size * buckets`).
        need: usize,
    },
}

pub use crate::mem::{HeapRing, RingMem};

/// Ring geometry. Units: `bucket_size` in bytes, `buckets` in bucket count.
/// Scythe section 4.6, Fig. 21. Also the geometry a requester
/// offers on the control plane ([`crate::ctrl::RocketOffer`]).
///
/// Non-exhaustive: outside rrpc, build one with [`RocketConfig::new`], or from
/// [`RocketConfig::default`] with the `with_*` setters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub struct RocketConfig {
    /// Bytes per bucket; a multiple of 64 and at least 64.
    pub bucket_size: usize,
    /// Number of bucket slots in the ring; at least 2.
    pub buckets: usize,
}

impl Default for RocketConfig {
    /// 64 buckets of 512 bytes (32 KiB ring).
    fn default() -> Self {
        Self {
            bucket_size: 512,
            buckets: 64,
        }
    }
}

impl RocketConfig {
    /// A ring of `buckets` buckets (at least 2) of `bucket_size` bytes each (a multiple of
    /// 64, at least 64); see [`RocketConfig::validate`].
    pub const fn new(bucket_size: usize, buckets: usize) -> Self {
        Self {
            bucket_size,
            buckets,
        }
    }

    /// Set [`RocketConfig::bucket_size`]: bytes per bucket (a multiple of 64, at least 64).
    pub const fn with_bucket_size(mut self, bucket_size: usize) -> Self {
        self.bucket_size = bucket_size;
        self
    }

    /// Set [`RocketConfig::buckets`]: number of bucket slots in the ring (at least 2).
    pub const fn with_buckets(mut self, buckets: usize) -> Self {
        self.buckets = buckets;
        self
    }

    /// Check the geometry: `bucket_size` (bytes) a multiple of 64, `>= 64`
    /// and representable in the 32-bit label length; `buckets >= 2`; the ring
    /// size in bytes must not overflow `usize`.
    /// Scythe section 4.6, Fig. 21.
    pub fn validate(&self) -> Result<(), RocketError> {
        if self.bucket_size < 64 || self.bucket_size & 63 != 0 {
            return Err(RocketError::BadConfig(
                "bucket_size must be a multiple of 64 and >= 64",
            ));
        }
        if self.bucket_size > u32::MAX as usize {
            return Err(RocketError::BadConfig("bucket_size must fit in u32"));
        }
        if self.buckets < 2 {
            return Err(RocketError::BadConfig("buckets must be >= 2"));
        }
        if self.bucket_size.checked_mul(self.buckets).is_none() {
            return Err(RocketError::BadConfig("ring size overflows usize"));
        }
        Ok(())
    }

    /// The geometry for one Rocket whose messages carry up to `payload_bytes` bytes,
    /// chosen at connection time (a ring's geometry is fixed once the peer admitted it).
    ///
    /// A bucket is the default 512 B (Scythe 4.6 (3)), grown in 64 B steps until it
    /// holds `per_bucket` messages of that size (labels and headers included). The
    /// size must follow the message: a bucket that holds one message makes every
    /// message its own WRITE, so message batching adds nothing to doorbell batching and
    /// only its cost is left (Scythe Fig. 9 has combined batching ahead at every size).
    /// A bigger bucket delays nothing, since a bucket is sealed at the end of the
    /// sender's polling round whether or not it is full; it costs ring memory only.
    ///
    /// The ring takes as many buckets as fit in `max_ring_bytes` (what the server
    /// admits, [`crate::server::ServerConfig::max_ring_bytes`]), at most the default 64
    /// and at least 2. Where two buckets of `per_bucket` messages exceed that, a bucket
    /// holds as many messages as two buckets leave room for (at least one).
    ///
    /// Errors: [`RocketError::BadConfig`] when `per_bucket` is 0, or when two buckets of
    /// one message each exceed `max_ring_bytes`.
    pub fn for_messages(
        payload_bytes: usize,
        per_bucket: usize,
        max_ring_bytes: usize,
    ) -> Result<Self, RocketError> {
        let base = Self::default();
        if per_bucket == 0 {
            return Err(RocketError::BadConfig("per_bucket must be at least 1"));
        }
        if payload_bytes > u32::MAX as usize {
            return Err(RocketError::BadConfig("payload_bytes must fit in u32"));
        }
        let msg = MSG_HEADER_BYTES + pad8(payload_bytes);
        let bucket_for = |k: usize| {
            k.checked_mul(msg)
                .and_then(|b| b.checked_add(2 * LABEL_BYTES))
                .and_then(|b| b.checked_next_multiple_of(64))
                .map(|b| b.max(base.bucket_size))
        };
        // The most messages per bucket that still leave room for two buckets.
        let fit = (max_ring_bytes / 2).saturating_sub(2 * LABEL_BYTES) / msg;
        let k = per_bucket.min(fit);
        let bucket_size = match bucket_for(k) {
            Some(b) if k >= 1 && 2 * b <= max_ring_bytes => b,
            _ => {
                return Err(RocketError::BadConfig(
                    "two buckets of one message exceed the ring limit",
                ))
            }
        };
        let cfg = Self {
            bucket_size,
            buckets: (max_ring_bytes / bucket_size).clamp(2, base.buckets),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Ring (and staging buffer) size in bytes: `bucket_size * buckets`.
    /// Scythe section 4.6, Fig. 21.
    pub fn ring_bytes(&self) -> usize {
        self.bucket_size * self.buckets
    }

    /// Largest payload in bytes of a single message: `bucket_size - 32`
    /// (two labels plus one message header).
    fn max_payload(&self) -> usize {
        self.bucket_size - 2 * LABEL_BYTES - MSG_HEADER_BYTES
    }

    /// Byte offset of bucket number `seq` in the ring.
    fn slot_offset(&self, seq: u64) -> usize {
        (seq % self.buckets as u64) as usize * self.bucket_size
    }
}

/// Label of bucket number `seq` holding `batch_len` message bytes.
fn label(seq: u64, batch_len: usize) -> u64 {
    ((seq as u32 as u64) << 32) | batch_len as u64
}

/// Per-message header, 16 bytes, encoded little-endian.
/// Scythe section 4.6, Fig. 21.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MsgHeader {
    /// Payload length in bytes, unpadded.
    pub len: u32,
    /// Handler (RPC method) identifier.
    pub handler: u16,
    /// Message kind (e.g. request / response), opaque to the ring.
    pub kind: u8,
    /// Flags, opaque to the ring.
    pub flags: u8,
    /// Call identifier matching responses to requests.
    pub call_id: u64,
}

const _: () = assert!(std::mem::size_of::<MsgHeader>() == MSG_HEADER_BYTES);

impl MsgHeader {
    /// Encode as 16 little-endian bytes: len(4) handler(2) kind(1) flags(1) call_id(8).
    /// Scythe section 4.6, Fig. 21.
    pub fn to_bytes(&self) -> [u8; MSG_HEADER_BYTES] {
        let mut b = [0u8; MSG_HEADER_BYTES];
        b[0..4].copy_from_slice(&self.len.to_le_bytes());
        b[4..6].copy_from_slice(&self.handler.to_le_bytes());
        b[6] = self.kind;
        b[7] = self.flags;
        b[8..16].copy_from_slice(&self.call_id.to_le_bytes());
        b
    }

    /// Decode 16 little-endian bytes produced by [`MsgHeader::to_bytes`].
    /// Scythe section 4.6, Fig. 21.
    pub fn from_bytes(b: &[u8; MSG_HEADER_BYTES]) -> Self {
        Self {
            len: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            handler: u16::from_le_bytes([b[4], b[5]]),
            kind: b[6],
            flags: b[7],
            call_id: u64::from_le_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]),
        }
    }
}

/// A sealed bucket ready to be posted: copy `len` bytes at byte `offset` of
/// the staging buffer to the same offset of the remote ring (one RDMA WRITE,
/// end label last). `seq` is the bucket number (counts from 0 forever).
/// Scythe section 4.6, Fig. 21.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketSpan {
    /// Byte offset of the bucket in both staging buffer and ring.
    pub offset: usize,
    /// Span in bytes: `16 + L` (two labels plus `L` message bytes).
    pub len: usize,
    /// Bucket number.
    pub seq: u64,
}

/// Sender half of the Rocket ring: batches messages into buckets of the
/// staging buffer, seals them and hands them out for posting, respecting
/// credit from the receiver. Counters are bucket counts since creation.
/// Scythe section 4.6, Fig. 21.
#[derive(Debug)]
pub struct RocketSender {
    cfg: RocketConfig,
    /// Message bytes in the open bucket (number `sealed`); 0 = no open bucket.
    fill: usize,
    /// Buckets sealed so far (= number of the open / next bucket).
    sealed: u64,
    /// Buckets handed out by `take_ready` so far.
    posted: u64,
    /// Buckets the receiver reported consumed.
    consumed: u64,
    /// See [`RocketSender::set_write_floor`].
    write_floor: Option<u64>,
    /// Sealed, not yet posted spans, oldest first.
    ready: VecDeque<BucketSpan>,
}

impl RocketSender {
    /// New sender for the geometry `cfg` (validated).
    /// Scythe section 4.6, Fig. 21.
    pub fn new(cfg: RocketConfig) -> Result<Self, RocketError> {
        cfg.validate()?;
        Ok(Self {
            cfg,
            fill: 0,
            sealed: 0,
            posted: 0,
            consumed: 0,
            write_floor: None,
            ready: VecDeque::new(),
        })
    }

    /// Largest payload in bytes one message may carry: `bucket_size - 32`.
    /// Scythe section 4.6, Fig. 21.
    pub fn max_payload(&self) -> usize {
        self.cfg.max_payload()
    }

    /// Bytes of a message (header + padded payload) with `payload_len` payload bytes.
    fn msg_bytes(payload_len: usize) -> usize {
        MSG_HEADER_BYTES + pad8(payload_len)
    }

    /// Whether a message of `msg` bytes fits behind the open bucket's contents.
    fn fits_open(&self, msg: usize) -> bool {
        self.fill > 0 && 2 * LABEL_BYTES + self.fill + msg <= self.cfg.bucket_size
    }

    /// Number of the bucket that would be opened next.
    fn next_open(&self) -> u64 {
        if self.fill > 0 {
            self.sealed + 1
        } else {
            self.sealed
        }
    }

    /// Whether bucket number `seq` may be opened: its slot has been freed by the
    /// receiver, and no WRITE of an older bucket of that slot is still reading the
    /// staging copy (see [`RocketSender::set_write_floor`]).
    fn slot_free(&self, seq: u64) -> bool {
        let base = self
            .write_floor
            .map_or(self.consumed, |f| f.min(self.consumed));
        seq < base.saturating_add(self.cfg.buckets as u64)
    }

    /// The oldest bucket whose WRITE may still be reading the staging copy, if the I/O
    /// layer knows of one below the credit: a replayed bucket the receiver had already
    /// consumed from its first WRITE. Until it is cleared (`None`) or raised, the
    /// sender does not reuse that bucket's slot, so the replay cannot carry a newer
    /// bucket's bytes.
    pub fn set_write_floor(&mut self, floor: Option<u64>) {
        self.write_floor = floor;
    }

    /// Append one message to the open bucket in `staging` (`staging.len()`
    /// must be `>= ring_bytes()` bytes). `hdr.len` is overwritten with
    /// `payload.len()` (bytes). If the message does not fit in the open
    /// bucket, that bucket is sealed and the next one opened; bucket `k` may
    /// be opened only if `k < consumed + buckets`.
    ///
    /// Errors (nothing written, state unchanged): `TooLarge` when
    /// `payload.len() > max_payload()`, `StagingTooSmall`, and `RingFull`
    /// when no bucket can be opened (retry after credit arrives).
    /// Scythe section 4.6, Fig. 21.
    pub fn push(
        &mut self,
        staging: &impl RingMem,
        hdr: MsgHeader,
        payload: &[u8],
    ) -> Result<(), RocketError> {
        self.push_parts(staging, hdr, &[payload])
    }

    /// [`RocketSender::push`] of a payload given as consecutive parts (e.g. a mode
    /// prefix and the request), copied straight into the bucket.
    pub fn push_parts(
        &mut self,
        staging: &impl RingMem,
        mut hdr: MsgHeader,
        parts: &[&[u8]],
    ) -> Result<(), RocketError> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let max = self.max_payload();
        if len > max {
            return Err(RocketError::TooLarge { len, max });
        }
        let need = self.cfg.ring_bytes();
        if staging.len() < need {
            return Err(RocketError::StagingTooSmall {
                have: staging.len(),
                need,
            });
        }
        let msg = Self::msg_bytes(len);
        if !self.fits_open(msg) {
            if !self.slot_free(self.next_open()) {
                return Err(RocketError::RingFull);
            }
            self.seal(staging);
        }
        // Now bucket `self.sealed` is the open (possibly still empty) bucket.
        hdr.len = len as u32;
        let mut off = self.cfg.slot_offset(self.sealed) + LABEL_BYTES + self.fill;
        staging.write(off, &hdr.to_bytes());
        off += MSG_HEADER_BYTES;
        for p in parts {
            staging.write(off, p);
            off += p.len();
        }
        let pad = pad8(len) - len;
        if pad > 0 {
            staging.write(off, &[0u8; 8][..pad]);
        }
        self.fill += msg;
        Ok(())
    }

    /// Seal the open bucket if it holds any message: write the start label
    /// (byte 0) and end label (byte `8 + L`) into `staging` and queue its span
    /// for [`RocketSender::take_ready`]. Idempotent: a no-op without an open bucket.
    /// Scythe section 4.6, Fig. 21.
    pub fn seal(&mut self, staging: &impl RingMem) {
        if self.fill == 0 {
            return;
        }
        let seq = self.sealed;
        let off = self.cfg.slot_offset(seq);
        let l = label(seq, self.fill);
        staging.store_u64(off, l);
        staging.store_u64(off + LABEL_BYTES + self.fill, l);
        self.ready.push_back(BucketSpan {
            offset: off,
            len: 2 * LABEL_BYTES + self.fill,
            seq,
        });
        self.sealed += 1;
        self.fill = 0;
    }

    /// Append the sealed buckets not yet handed out, oldest first, to `out`
    /// as (ring byte offset, span bytes, bucket number), and count them as posted.
    /// Scythe section 4.6, Fig. 21.
    pub fn take_ready(&mut self, out: &mut impl Extend<BucketSpan>) {
        self.posted += self.ready.len() as u64;
        out.extend(self.ready.drain(..));
    }

    /// [`RocketSender::take_ready`] into a `VecDeque` (moves the spans without iterating
    /// when there are none, the common case on a polling thread).
    pub fn take_ready_deque(&mut self, out: &mut VecDeque<BucketSpan>) {
        if self.ready.is_empty() {
            return;
        }
        self.posted += self.ready.len() as u64;
        out.append(&mut self.ready);
    }

    /// Credit from the receiver: total buckets consumed so far. Stale
    /// (not larger) values are ignored; a value larger than the number of
    /// buckets posted is rejected with `Corrupt` and ignored.
    /// Scythe section 4.6, Fig. 21.
    pub fn on_credit(&mut self, consumed: u64) -> Result<(), RocketError> {
        if consumed > self.posted {
            return Err(RocketError::Corrupt {
                what: "credit exceeds buckets posted",
            });
        }
        self.consumed = self.consumed.max(consumed);
        Ok(())
    }

    /// Buckets sealed so far (count).
    /// Scythe section 4.6, Fig. 21.
    pub fn sealed(&self) -> u64 {
        self.sealed
    }

    /// Buckets handed out by `take_ready` so far (count).
    /// Scythe section 4.6, Fig. 21.
    pub fn posted(&self) -> u64 {
        self.posted
    }

    /// Buckets the receiver has reported consumed (count, latest credit).
    /// Scythe section 4.6, Fig. 21.
    pub fn consumed(&self) -> u64 {
        self.consumed
    }

    /// True when a message of `payload_len` bytes could be pushed now
    /// without `TooLarge` or `RingFull`.
    /// Scythe section 4.6, Fig. 21.
    pub fn can_push(&self, payload_len: usize) -> bool {
        payload_len <= self.max_payload()
            && (self.fits_open(Self::msg_bytes(payload_len)) || self.slot_free(self.next_open()))
    }

    /// True when the open bucket holds messages not yet sealed.
    /// Scythe section 4.6, Fig. 21.
    pub fn has_open(&self) -> bool {
        self.fill > 0
    }
}

/// Receiver half of the Rocket ring: polls the ring for the next bucket,
/// delivers complete batches, frees their slots and produces credit.
/// Counters are bucket counts since creation.
/// Scythe section 4.6, Fig. 21.
#[derive(Debug)]
pub struct RocketReceiver {
    cfg: RocketConfig,
    consumed: u64,
    last_returned: u64,
    /// The inconsistent start label last seen and for how many polls in a row.
    odd_label: u64,
    odd_polls: u32,
    corrupt_after: u32,
}

/// Polls for which a start label may stay inconsistent (wrong sequence or impossible
/// length) before the ring is declared corrupt. A label is read while the writer may
/// still be writing it: Soft-RoCE places payloads with a kernel `memcpy`, so an 8-byte
/// label can be seen half written for a moment; a truly stale or foreign label never
/// changes. 2^20 polls is a fraction of a second of busy polling.
pub const CORRUPT_AFTER_POLLS: u32 = 1 << 20;

impl RocketReceiver {
    /// New receiver for the geometry `cfg` (validated).
    /// Scythe section 4.6, Fig. 21.
    pub fn new(cfg: RocketConfig) -> Result<Self, RocketError> {
        cfg.validate()?;
        Ok(Self {
            cfg,
            consumed: 0,
            last_returned: 0,
            odd_label: 0,
            odd_polls: 0,
            corrupt_after: CORRUPT_AFTER_POLLS,
        })
    }

    /// Polls an inconsistent label may persist before [`RocketReceiver::poll`] reports
    /// the ring corrupt (default [`CORRUPT_AFTER_POLLS`], at least 1).
    pub fn set_corrupt_after(&mut self, polls: u32) {
        self.corrupt_after = polls.max(1);
    }

    /// An inconsistent start label: in progress unless it persists.
    fn odd(&mut self, label: u64, what: &'static str) -> Result<bool, RocketError> {
        if label == self.odd_label {
            self.odd_polls += 1;
        } else {
            self.odd_label = label;
            self.odd_polls = 1;
        }
        if self.odd_polls >= self.corrupt_after {
            Err(RocketError::Corrupt { what })
        } else {
            Ok(false)
        }
    }

    /// Look at bucket number `consumed`. It is complete when the start label
    /// is non-zero, its high half equals `consumed as u32`, its low half `L`
    /// (bytes) is a non-zero multiple of 8 with `16 + L <= bucket_size`, and
    /// the end label at byte `8 + L` equals the start label. Then the `L`
    /// message bytes are appended to `out`, the span `[0, 16 + L)` of the
    /// bucket in `ring` is zeroed, `consumed` advances and `Ok(true)` is returned.
    ///
    /// Start label zero, or end label not (yet) equal: `Ok(false)`, nothing
    /// delivered. Non-zero start label with a wrong sequence or impossible
    /// length: `Ok(false)` while it may still be being written (a NIC's write
    /// can be seen half done), `Err(Corrupt)` once the same label persisted for
    /// [`CORRUPT_AFTER_POLLS`] polls; nothing delivered. `ring.len() <
    /// ring_bytes()`: `Err(StagingTooSmall)`.
    /// Scythe section 4.6, Fig. 21.
    pub fn poll(&mut self, ring: &impl RingMem, out: &mut Vec<u8>) -> Result<bool, RocketError> {
        let need = self.cfg.ring_bytes();
        if ring.len() < need {
            return Err(RocketError::StagingTooSmall {
                have: ring.len(),
                need,
            });
        }
        let off = self.cfg.slot_offset(self.consumed);
        let start = ring.load_u64(off);
        if start == 0 {
            return Ok(false);
        }
        let lap = (self.consumed as u32).wrapping_sub((start >> 32) as u32);
        if lap != 0 && lap < 1 << 31 && (lap as u64).is_multiple_of(self.cfg.buckets as u64) {
            // A bucket of an earlier lap, written again after it was consumed (a replay
            // after a QP failure): empty until the expected bucket overwrites it.
            return Ok(false);
        }
        if (start >> 32) as u32 != self.consumed as u32 {
            return self.odd(
                start,
                "bucket label sequence mismatch (stale or foreign label)",
            );
        }
        let l = (start & 0xffff_ffff) as usize;
        if l == 0 || l & 7 != 0 || 2 * LABEL_BYTES + l > self.cfg.bucket_size {
            return self.odd(start, "bucket label has impossible length");
        }
        if ring.load_u64(off + LABEL_BYTES + l) != start {
            return Ok(false);
        }
        let at = out.len();
        out.resize(at + l, 0);
        ring.read(off + LABEL_BYTES, &mut out[at..]);
        ring.zero(off, 2 * LABEL_BYTES + l);
        self.consumed += 1;
        self.odd_polls = 0;
        Ok(true)
    }

    /// Buckets consumed so far (count).
    /// Scythe section 4.6, Fig. 21.
    pub fn consumed(&self) -> u64 {
        self.consumed
    }

    /// Credit to send back: `Some(consumed)` when at least `every` buckets
    /// (count; 0 is treated as 1) were consumed since the last returned
    /// credit, remembering it as returned; otherwise `None`.
    /// Scythe section 4.6, Fig. 21.
    pub fn credit_due(&mut self, every: u64) -> Option<u64> {
        if self.consumed - self.last_returned >= every.max(1) {
            self.last_returned = self.consumed;
            Some(self.consumed)
        } else {
            None
        }
    }
}

/// Iterate the messages of a delivered batch (bytes as appended by
/// [`RocketReceiver::poll`]): each is a 16-byte header followed by its payload
/// padded to a multiple of 8 bytes. A truncated or overlong message yields
/// `Err(Corrupt)` and then the iterator stops.
/// Scythe section 4.6, Fig. 21.
pub fn decode_batch(batch: &[u8]) -> BatchIter<'_> {
    BatchIter {
        rest: batch,
        done: false,
    }
}

/// Iterator returned by [`decode_batch`]; yields `(header, unpadded payload)`.
/// Scythe section 4.6, Fig. 21.
#[derive(Debug, Clone)]
pub struct BatchIter<'a> {
    rest: &'a [u8],
    done: bool,
}

impl<'a> BatchIter<'a> {
    fn fail(&mut self, what: &'static str) -> Option<Result<(MsgHeader, &'a [u8]), RocketError>> {
        self.done = true;
        Some(Err(RocketError::Corrupt { what }))
    }
}

impl<'a> Iterator for BatchIter<'a> {
    type Item = Result<(MsgHeader, &'a [u8]), RocketError>;

    // Inlined into the polling loops, so that each message's header reaches its handler
    // in registers rather than through a 48-byte item on the stack.
    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.done || self.rest.is_empty() {
            return None;
        }
        let Some((head, body)) = self.rest.split_first_chunk::<MSG_HEADER_BYTES>() else {
            return self.fail("truncated message header");
        };
        let hdr = MsgHeader::from_bytes(head);
        let len = hdr.len as usize;
        let padded = match len.checked_add(7) {
            Some(n) => n & !7,
            None => return self.fail("message length overflows"),
        };
        if padded > body.len() {
            return self.fail("message payload runs past the batch");
        }
        self.rest = &body[padded..];
        Some(Ok((hdr, &body[..len])))
    }
}

impl std::iter::FusedIterator for BatchIter<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Push `n` messages of `payload` bytes and seal: the spans they went out in.
    fn spans_for(cfg: RocketConfig, payload: usize, n: usize) -> Vec<BucketSpan> {
        let staging = HeapRing::new(cfg.ring_bytes());
        let mut tx = RocketSender::new(cfg).unwrap();
        let body = vec![7u8; payload];
        for i in 0..n {
            let hdr = MsgHeader {
                call_id: i as u64,
                ..MsgHeader::default()
            };
            tx.push(&staging, hdr, &body).unwrap();
        }
        tx.seal(&staging);
        let mut out = Vec::new();
        tx.take_ready(&mut out);
        out
    }

    #[test]
    // Sizing arithmetic over rings of up to 4 MiB: under Miri each takes minutes, and the
    // ring accesses it makes are the ones the small-ring tests already check.
    #[cfg_attr(miri, ignore = "sizing arithmetic over 4 MiB rings")]
    fn a_bucket_sized_for_messages_holds_that_many() {
        // The old rule (512 B, grown to fit one message) put one 256 B message in a
        // bucket: four messages were four WRITEs, msg batching did nothing.
        let old = RocketConfig {
            bucket_size: 512usize.max((256 + 32usize).next_multiple_of(64)),
            buckets: 64,
        };
        assert_eq!(spans_for(old, 256, 4).len(), 4);
        for payload in [8, 64, 256, 1000, 4096, 8192] {
            let cfg = RocketConfig::for_messages(payload, 4, 4 << 20).unwrap();
            assert_eq!(spans_for(cfg, payload, 4).len(), 1, "{payload} B: {cfg:?}");
            assert!(cfg.bucket_size >= 512 && cfg.bucket_size.is_multiple_of(64));
            assert!(cfg.ring_bytes() <= 4 << 20);
            assert!((2..=64).contains(&cfg.buckets));
        }
        // Small messages keep Scythe's 512 B bucket and the default ring.
        assert_eq!(
            RocketConfig::for_messages(8, 4, 4 << 20).unwrap(),
            RocketConfig::default()
        );
    }

    #[test]
    // Sizing arithmetic over rings of up to 4 MiB: under Miri each takes minutes, and the
    // ring accesses it makes are the ones the small-ring tests already check.
    #[cfg_attr(miri, ignore = "sizing arithmetic over 4 MiB rings")]
    fn a_bucket_sized_for_messages_stays_within_the_ring_limit() {
        // 1 MiB messages in a 4 MiB ring: one per bucket, three buckets.
        let cfg = RocketConfig::for_messages(1 << 20, 8, 4 << 20).unwrap();
        assert_eq!(cfg.max_payload(), cfg.bucket_size - 32);
        assert!(cfg.max_payload() >= 1 << 20);
        assert_eq!(cfg.buckets, 3);
        assert_eq!(spans_for(cfg, 1 << 20, 1).len(), 1);
        // 256 KiB messages: as many per bucket as two buckets leave room for.
        let cfg = RocketConfig::for_messages(256 << 10, 16, 4 << 20).unwrap();
        assert_eq!(cfg.buckets, 2);
        assert_eq!(spans_for(cfg, 256 << 10, 7).len(), 1);
        // Too large for any ring the server admits, or no message per bucket.
        assert!(matches!(
            RocketConfig::for_messages(4 << 20, 1, 4 << 20),
            Err(RocketError::BadConfig(_))
        ));
        assert!(matches!(
            RocketConfig::for_messages(64, 0, 4 << 20),
            Err(RocketError::BadConfig(_))
        ));
    }

    fn small() -> RocketConfig {
        RocketConfig {
            bucket_size: 128,
            buckets: 4,
        }
    }

    fn mems(cfg: RocketConfig) -> (HeapRing, HeapRing) {
        (
            HeapRing::new(cfg.ring_bytes()),
            HeapRing::new(cfg.ring_bytes()),
        )
    }

    /// Copy a span as the fabric does: all but the last 8 bytes, then the
    /// last 8 (the end label) with one 8-byte store.
    fn post(staging: &HeapRing, ring: &HeapRing, s: BucketSpan) {
        let mut buf = vec![0u8; s.len - 8];
        staging.read(s.offset, &mut buf);
        ring.write(s.offset, &buf);
        let end = s.offset + s.len - 8;
        ring.store_u64(end, staging.load_u64(end));
    }

    fn snapshot(m: &HeapRing) -> Vec<u8> {
        let mut v = vec![0u8; m.len()];
        m.read(0, &mut v);
        v
    }

    fn hdr(i: u64) -> MsgHeader {
        MsgHeader {
            len: 0,
            handler: (i % 65_521) as u16,
            kind: (i % 251) as u8,
            flags: (i % 7) as u8,
            call_id: i.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        }
    }

    fn payload(i: u64, len: usize) -> Vec<u8> {
        (0..len)
            .map(|j| (i as usize * 31 + j * 7 + 1) as u8)
            .collect()
    }

    /// Poll until nothing is ready; return decoded (header, payload) pairs.
    fn drain(rx: &mut RocketReceiver, ring: &HeapRing) -> Vec<(MsgHeader, Vec<u8>)> {
        let mut got = Vec::new();
        let mut batch = Vec::new();
        while rx.poll(ring, &mut batch).unwrap() {
            let mut pos = 0;
            for m in decode_batch(&batch) {
                let (h, p) = m.unwrap();
                // Padding after the payload must be zero, whatever staging held.
                let start = pos + MSG_HEADER_BYTES + p.len();
                pos += MSG_HEADER_BYTES + pad8(p.len());
                assert!(batch[start..pos].iter().all(|&b| b == 0), "dirty padding");
                got.push((h, p.to_vec()));
            }
            assert_eq!(pos, batch.len());
            batch.clear();
        }
        got
    }

    #[test]
    fn header_roundtrip_little_endian() {
        let h = MsgHeader {
            len: 0x0403_0201,
            handler: 0x0605,
            kind: 7,
            flags: 8,
            call_id: 0x100f_0e0d_0c0b_0a09,
        };
        let b = h.to_bytes();
        assert_eq!(b, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]);
        assert_eq!(MsgHeader::from_bytes(&b), h);
    }

    #[test]
    fn config_validation() {
        assert!(RocketConfig::default().validate().is_ok());
        assert_eq!(RocketConfig::default().ring_bytes(), 512 * 64);
        for bad in [
            RocketConfig {
                bucket_size: 0,
                buckets: 4,
            },
            RocketConfig {
                bucket_size: 32,
                buckets: 4,
            },
            RocketConfig {
                bucket_size: 100,
                buckets: 4,
            },
            RocketConfig {
                bucket_size: 128,
                buckets: 1,
            },
            RocketConfig {
                bucket_size: 128,
                buckets: 0,
            },
        ] {
            assert!(
                matches!(bad.validate(), Err(RocketError::BadConfig(_))),
                "{bad:?}"
            );
            assert!(RocketSender::new(bad).is_err());
            assert!(RocketReceiver::new(bad).is_err());
        }
    }

    #[test]
    fn heap_ring_byte_access() {
        let m = HeapRing::new(21);
        assert_eq!(m.len(), 24);
        m.write(3, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        let mut d = [0u8; 14];
        m.read(1, &mut d);
        assert_eq!(d, [0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 0]);
        m.store_u64(16, 0x0102_0304_0506_0708);
        let mut e = [0u8; 8];
        m.read(16, &mut e);
        assert_eq!(u64::from_le_bytes(e), 0x0102_0304_0506_0708);
        m.zero(0, 16);
        m.read(1, &mut d);
        assert_eq!(d, [0u8; 14]);
    }

    #[test]
    fn staging_too_small() {
        let cfg = small();
        let tiny = HeapRing::new(cfg.ring_bytes() - 8);
        let mut tx = RocketSender::new(cfg).unwrap();
        assert_eq!(
            tx.push(&tiny, hdr(0), b"x"),
            Err(RocketError::StagingTooSmall {
                have: 504,
                need: 512
            })
        );
        let mut rx = RocketReceiver::new(cfg).unwrap();
        assert!(matches!(
            rx.poll(&tiny, &mut Vec::new()),
            Err(RocketError::StagingTooSmall { .. })
        ));
    }

    #[test]
    fn round_trip_varied_sizes() {
        let cfg = RocketConfig::default();
        let (staging, ring) = mems(cfg);
        // Staging is sender-local and may hold garbage; nothing of it may leak.
        staging.write(0, &vec![0xFF; cfg.ring_bytes()]);
        let mut tx = RocketSender::new(cfg).unwrap();
        let mut rx = RocketReceiver::new(cfg).unwrap();
        let max = tx.max_payload();
        assert_eq!(max, 512 - 32);
        let sizes = [0, 1, 7, 8, 9, 15, 16, 17, max, 0, 100, max - 1, 3, max, 64];
        let mut sent = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            let (h, p) = (hdr(i as u64 + 1), payload(i as u64, n));
            tx.push(&staging, h, &p).unwrap();
            sent.push((MsgHeader { len: n as u32, ..h }, p));
        }
        assert!(tx.has_open());
        tx.seal(&staging);
        tx.seal(&staging); // idempotent
        assert!(!tx.has_open());
        let mut spans = Vec::new();
        tx.take_ready(&mut spans);
        assert_eq!(spans.len() as u64, tx.sealed());
        assert_eq!(tx.posted(), tx.sealed());
        for (i, s) in spans.iter().enumerate() {
            assert_eq!(s.seq, i as u64);
            assert_eq!(s.offset, i * cfg.bucket_size);
            assert!(s.len <= cfg.bucket_size && s.len % 8 == 0);
            post(&staging, &ring, *s);
        }
        let got = drain(&mut rx, &ring);
        assert_eq!(got, sent);
        assert_eq!(rx.consumed(), tx.sealed());
        // Every consumed span was zeroed.
        assert!(snapshot(&ring).iter().all(|&b| b == 0));
        // Nothing more to take.
        spans.clear();
        tx.take_ready(&mut spans);
        assert!(spans.is_empty());
    }

    #[test]
    fn wrap_around_many_laps() {
        let cfg = small();
        let (staging, ring) = mems(cfg);
        let mut tx = RocketSender::new(cfg).unwrap();
        let mut rx = RocketReceiver::new(cfg).unwrap();
        let max = tx.max_payload();
        let mut sent = Vec::new();
        let mut got = Vec::new();
        let mut spans = Vec::new();
        let mut pump = |tx: &mut RocketSender, rx: &mut RocketReceiver, got: &mut Vec<_>| {
            tx.seal(&staging);
            spans.clear();
            tx.take_ready(&mut spans);
            for s in &spans {
                assert_eq!(s.offset, cfg.slot_offset(s.seq));
                // Never overwrite an unconsumed bucket.
                assert!(s.seq < rx.consumed() + cfg.buckets as u64);
                post(&staging, &ring, *s);
            }
            got.extend(drain(rx, &ring));
            if let Some(c) = rx.credit_due(2) {
                tx.on_credit(c).unwrap();
            }
        };
        let mut i = 0u64;
        while tx.sealed() < 10 * cfg.buckets as u64 + 3 {
            let n = [0, 1, 7, 8, 33, max][(i % 6) as usize];
            let (h, p) = (hdr(i), payload(i, n));
            match tx.push(&staging, h, &p) {
                Ok(()) => {
                    sent.push((MsgHeader { len: n as u32, ..h }, p));
                    i += 1;
                }
                Err(RocketError::RingFull) => {
                    assert!(!tx.can_push(n));
                    pump(&mut tx, &mut rx, &mut got);
                }
                Err(e) => panic!("{e}"),
            }
            if i & 3 == 0 {
                pump(&mut tx, &mut rx, &mut got);
            }
        }
        // Flush everything, including credit for the tail.
        for _ in 0..3 {
            pump(&mut tx, &mut rx, &mut got);
        }
        assert!(rx.consumed() >= 40);
        assert_eq!(rx.consumed(), tx.sealed());
        assert_eq!(got.len(), sent.len());
        assert_eq!(got, sent);
    }

    #[test]
    fn full_ring_then_credit() {
        let cfg = small();
        let (staging, ring) = mems(cfg);
        let mut tx = RocketSender::new(cfg).unwrap();
        let mut rx = RocketReceiver::new(cfg).unwrap();
        let max = tx.max_payload();
        // Each max-size message fills one bucket exactly.
        for i in 0..cfg.buckets as u64 {
            assert!(tx.can_push(max));
            tx.push(&staging, hdr(i), &payload(i, max)).unwrap();
        }
        assert_eq!(tx.sealed(), cfg.buckets as u64 - 1);
        assert!(tx.has_open());
        let before = snapshot(&staging);
        let (sealed, posted, open) = (tx.sealed(), tx.posted(), tx.has_open());
        assert!(!tx.can_push(0));
        let last = payload(99, 5);
        assert_eq!(
            tx.push(&staging, hdr(99), &last),
            Err(RocketError::RingFull)
        );
        // State and staging unchanged: the failed message wrote nothing.
        assert_eq!(snapshot(&staging), before);
        assert_eq!(
            (tx.sealed(), tx.posted(), tx.has_open()),
            (sealed, posted, open)
        );
        // Post everything sealed; still full until credit arrives.
        tx.seal(&staging);
        let mut spans = Vec::new();
        tx.take_ready(&mut spans);
        assert_eq!(spans.len(), cfg.buckets);
        for s in &spans {
            post(&staging, &ring, *s);
        }
        let sealed_img = snapshot(&staging);
        assert_eq!(
            tx.push(&staging, hdr(99), &last),
            Err(RocketError::RingFull)
        );
        assert_eq!(snapshot(&staging), sealed_img);
        // Receiver consumes one bucket; credit frees slot 0 only.
        let mut batch = Vec::new();
        assert!(rx.poll(&ring, &mut batch).unwrap());
        tx.on_credit(rx.credit_due(1).unwrap()).unwrap();
        assert!(tx.can_push(5));
        tx.push(&staging, hdr(99), &last).unwrap();
        tx.seal(&staging);
        spans.clear();
        tx.take_ready(&mut spans);
        assert_eq!(spans.len(), 1);
        assert_eq!(spans[0].seq, cfg.buckets as u64);
        assert_eq!(spans[0].offset, 0); // the slot that was consumed
                                        // Next push needs slot 1, which is still unconsumed.
        assert_eq!(
            tx.push(&staging, hdr(100), &last),
            Err(RocketError::RingFull)
        );
        post(&staging, &ring, spans[0]);
        let got = drain(&mut rx, &ring);
        assert_eq!(got.len(), cfg.buckets);
        assert_eq!(got.last().unwrap().1, last);
        assert_eq!(got.last().unwrap().0.call_id, hdr(99).call_id);
    }

    #[test]
    fn torn_bucket_not_delivered_until_complete() {
        let cfg = small();
        let (staging, ring) = mems(cfg);
        let mut tx = RocketSender::new(cfg).unwrap();
        let mut rx = RocketReceiver::new(cfg).unwrap();
        tx.push(&staging, hdr(1), &payload(1, 40)).unwrap();
        tx.push(&staging, hdr(2), &payload(2, 20)).unwrap();
        tx.seal(&staging);
        let mut spans = Vec::new();
        tx.take_ready(&mut spans);
        let s = spans[0];
        let mut img = vec![0u8; s.len];
        staging.read(s.offset, &mut img);
        let mut out = Vec::new();
        // Start label plus part of the body.
        ring.write(s.offset, &img[..24]);
        assert_eq!(rx.poll(&ring, &mut out), Ok(false));
        assert!(out.is_empty());
        // All of the body, end label missing.
        ring.write(s.offset, &img[..s.len - 8]);
        assert_eq!(rx.poll(&ring, &mut out), Ok(false));
        assert!(out.is_empty());
        // A different value where the end label goes.
        let start = ring.load_u64(s.offset);
        ring.store_u64(s.offset + s.len - 8, start ^ 8);
        assert_eq!(rx.poll(&ring, &mut out), Ok(false));
        assert!(out.is_empty());
        assert_eq!(rx.consumed(), 0);
        // Complete the write.
        ring.store_u64(s.offset + s.len - 8, start);
        assert_eq!(rx.poll(&ring, &mut out), Ok(true));
        assert_eq!(out, img[8..s.len - 8]);
        let msgs: Vec<_> = decode_batch(&out).map(|m| m.unwrap().1.to_vec()).collect();
        assert_eq!(msgs, vec![payload(1, 40), payload(2, 20)]);
        // Exactly once.
        assert_eq!(rx.poll(&ring, &mut out), Ok(false));
        assert_eq!(out.len(), s.len - 16);
        assert_eq!(rx.consumed(), 1);
    }

    #[test]
    fn bucket_exactly_full() {
        let cfg = small(); // 128-byte buckets: room for L = 112 message bytes
        let staging = HeapRing::new(cfg.ring_bytes());
        let mut tx = RocketSender::new(cfg).unwrap();
        // 2 x (16 + 40) = 112 -> span 128.
        tx.push(&staging, hdr(1), &payload(1, 40)).unwrap();
        assert!(tx.can_push(40));
        tx.push(&staging, hdr(2), &payload(2, 40)).unwrap();
        assert_eq!(tx.sealed(), 0);
        tx.seal(&staging);
        let mut spans = Vec::new();
        tx.take_ready(&mut spans);
        assert_eq!(
            spans,
            vec![BucketSpan {
                offset: 0,
                len: 128,
                seq: 0
            }]
        );
        assert_eq!(staging.load_u64(0), 112);
        assert_eq!(staging.load_u64(120), 112);

        // One byte more (41 pads to 48) no longer fits: opens the next bucket.
        tx.push(&staging, hdr(3), &payload(3, 40)).unwrap();
        tx.push(&staging, hdr(4), &payload(4, 41)).unwrap();
        assert_eq!(tx.sealed(), 2);
        assert!(tx.has_open());
        spans.clear();
        tx.take_ready(&mut spans);
        assert_eq!(
            spans,
            vec![BucketSpan {
                offset: 128,
                len: 16 + 56,
                seq: 1
            }]
        );
        assert_eq!(staging.load_u64(128), (1u64 << 32) | 56);

        // A single max-size payload fills a bucket exactly, too.
        tx.seal(&staging);
        let max = tx.max_payload();
        assert_eq!(max, 96);
        tx.push(&staging, hdr(5), &payload(5, max)).unwrap();
        tx.seal(&staging);
        spans.clear();
        tx.take_ready(&mut spans);
        assert_eq!(spans.last().unwrap().len, 128);
    }

    #[test]
    fn too_large_writes_nothing() {
        let cfg = small();
        let staging = HeapRing::new(cfg.ring_bytes());
        let mut tx = RocketSender::new(cfg).unwrap();
        let max = tx.max_payload();
        assert!(!tx.can_push(max + 1));
        assert_eq!(
            tx.push(&staging, hdr(1), &vec![0xAB; max + 1]),
            Err(RocketError::TooLarge { len: max + 1, max })
        );
        assert!(snapshot(&staging).iter().all(|&b| b == 0));
        assert!(!tx.has_open());
        assert_eq!(tx.sealed(), 0);
        // With an open bucket the state is also untouched.
        tx.push(&staging, hdr(2), b"abc").unwrap();
        let before = snapshot(&staging);
        assert_eq!(
            tx.push(&staging, hdr(3), &vec![0xAB; 1000]),
            Err(RocketError::TooLarge { len: 1000, max })
        );
        assert_eq!(snapshot(&staging), before);
        assert!(tx.has_open());
        assert_eq!(tx.sealed(), 0);
    }

    #[test]
    fn stale_label_and_impossible_length_are_corrupt() {
        let cfg = small();
        let (staging, ring) = mems(cfg);
        let mut tx = RocketSender::new(cfg).unwrap();
        let mut rx = RocketReceiver::new(cfg).unwrap();
        let mut spans = Vec::new();
        let mut lap0 = None;
        // One full lap delivered and credited.
        for i in 0..cfg.buckets as u64 {
            tx.push(&staging, hdr(i), &payload(i, 8)).unwrap();
            tx.seal(&staging);
            spans.clear();
            tx.take_ready(&mut spans);
            if i == 0 {
                let mut img = vec![0u8; spans[0].len];
                staging.read(0, &mut img);
                lap0 = Some((spans[0], img));
            }
            post(&staging, &ring, spans[0]);
        }
        assert_eq!(drain(&mut rx, &ring).len(), cfg.buckets);
        assert_eq!(rx.consumed(), cfg.buckets as u64);

        // Replay bucket 0's image (an earlier lap) into slot 0, as a sender replaying
        // after a QP failure does when the first WRITE had landed after all: it is
        // never delivered and never reported corrupt, however long it stays.
        rx.set_corrupt_after(5);
        let (s0, img) = lap0.unwrap();
        ring.write(s0.offset, &img);
        let mut out = Vec::new();
        for _ in 0..50 {
            assert_eq!(rx.poll(&ring, &mut out), Ok(false));
        }
        assert!(out.is_empty());
        assert_eq!(rx.consumed(), cfg.buckets as u64);
        // The bucket of this lap overwrites it and is delivered.
        tx.on_credit(rx.consumed()).unwrap();
        let next = cfg.buckets as u64;
        tx.push(&staging, hdr(next), &payload(next, 8)).unwrap();
        tx.seal(&staging);
        spans.clear();
        tx.take_ready(&mut spans);
        post(&staging, &ring, spans[0]);
        let got = drain(&mut rx, &ring);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].1, payload(next, 8));

        // A label of a sequence that is not an earlier lap of this slot is foreign: "not
        // yet" until it persists, then corrupt.
        let foreign = ((rx.consumed() as u32 as u64 + 1) << 32) | 8;
        let off = (rx.consumed() % cfg.buckets as u64) as usize * cfg.bucket_size;
        ring.store_u64(off, foreign);
        for _ in 0..4 {
            assert_eq!(rx.poll(&ring, &mut out), Ok(false));
        }
        assert!(matches!(
            rx.poll(&ring, &mut out),
            Err(RocketError::Corrupt { .. })
        ));
        ring.zero(off, cfg.bucket_size);
        rx.set_corrupt_after(5);

        let seq = rx.consumed();
        let base = off;
        for bad_len in [cfg.bucket_size - 8, 12, 0] {
            ring.zero(base, cfg.bucket_size);
            let l = ((seq as u32 as u64) << 32) | bad_len as u64;
            ring.store_u64(base, l);
            if bad_len + 16 <= cfg.bucket_size {
                ring.store_u64(base + ((8 + bad_len) & !7), l);
            }
            for _ in 0..4 {
                assert_eq!(rx.poll(&ring, &mut out), Ok(false), "len {bad_len}");
            }
            assert!(
                matches!(rx.poll(&ring, &mut out), Err(RocketError::Corrupt { .. })),
                "len {bad_len}"
            );
            assert!(out.is_empty());
            assert_eq!(rx.consumed(), seq);
        }

        // A correct bucket in the same slot is accepted afterwards.
        ring.zero(base, cfg.bucket_size);
        tx.on_credit(rx.consumed()).unwrap();
        tx.push(&staging, hdr(7), b"ok").unwrap();
        tx.seal(&staging);
        spans.clear();
        tx.take_ready(&mut spans);
        post(&staging, &ring, spans[0]);
        assert_eq!(rx.poll(&ring, &mut out), Ok(true));
        assert_eq!(decode_batch(&out).next().unwrap().unwrap().1, b"ok");
    }

    #[test]
    fn credit_thresholds_and_validation() {
        let cfg = small();
        let (staging, ring) = mems(cfg);
        let mut tx = RocketSender::new(cfg).unwrap();
        let mut rx = RocketReceiver::new(cfg).unwrap();
        assert_eq!(rx.credit_due(1), None);
        let mut spans = Vec::new();
        for i in 0..3 {
            tx.push(&staging, hdr(i), &payload(i, 96)).unwrap();
        }
        tx.seal(&staging);
        tx.take_ready(&mut spans);
        assert_eq!(tx.posted(), 3);
        let mut out = Vec::new();
        for s in &spans {
            post(&staging, &ring, *s);
        }
        assert!(rx.poll(&ring, &mut out).unwrap());
        assert!(rx.poll(&ring, &mut out).unwrap());
        assert_eq!(rx.credit_due(3), None);
        assert_eq!(rx.credit_due(2), Some(2));
        assert_eq!(rx.credit_due(1), None); // already returned
        assert!(rx.poll(&ring, &mut out).unwrap());
        assert_eq!(rx.credit_due(2), None);
        assert_eq!(rx.credit_due(0), Some(3)); // 0 acts as 1

        // Credit beyond posted is rejected and ignored.
        assert!(matches!(tx.on_credit(4), Err(RocketError::Corrupt { .. })));
        assert_eq!(tx.consumed(), 0);
        tx.on_credit(2).unwrap();
        assert_eq!(tx.consumed(), 2);
        // Stale credit ignored.
        tx.on_credit(1).unwrap();
        assert_eq!(tx.consumed(), 2);
        tx.on_credit(3).unwrap();
        assert_eq!(tx.consumed(), 3);
    }

    #[test]
    fn decode_batch_truncated_is_corrupt() {
        let mut batch = Vec::new();
        let h = MsgHeader { len: 5, ..hdr(1) };
        batch.extend_from_slice(&h.to_bytes());
        batch.extend_from_slice(b"hello\0\0\0");
        let good = batch.clone();

        // Payload truncated.
        let mut t = good.clone();
        t.extend_from_slice(&MsgHeader { len: 20, ..hdr(2) }.to_bytes());
        t.extend_from_slice(&[1u8; 16]);
        let items: Vec<_> = decode_batch(&t).collect();
        assert_eq!(items.len(), 2);
        assert_eq!(items[0], Ok((h, &b"hello"[..])));
        assert!(matches!(items[1], Err(RocketError::Corrupt { .. })));

        // Padding truncated (payload bytes present, padding missing).
        let mut t = good.clone();
        t.extend_from_slice(&MsgHeader { len: 5, ..hdr(4) }.to_bytes());
        t.extend_from_slice(b"world");
        let items: Vec<_> = decode_batch(&t).collect();
        assert_eq!(items.len(), 2);
        assert!(items[0].is_ok());
        assert!(matches!(items[1], Err(RocketError::Corrupt { .. })));

        // Header truncated.
        let mut t = good.clone();
        t.extend_from_slice(&[0u8; 10]);
        let items: Vec<_> = decode_batch(&t).collect();
        assert_eq!(items.len(), 2);
        assert!(items[0].is_ok());
        assert!(matches!(items[1], Err(RocketError::Corrupt { .. })));

        // Overlong length (would need padding past the end) stops after the error.
        let mut t = MsgHeader {
            len: u32::MAX,
            ..hdr(3)
        }
        .to_bytes()
        .to_vec();
        t.extend_from_slice(&good);
        let mut it = decode_batch(&t);
        assert!(matches!(it.next(), Some(Err(RocketError::Corrupt { .. }))));
        assert!(it.next().is_none());

        // Intact batch decodes fully.
        assert_eq!(decode_batch(&good).count(), 1);
        assert!(decode_batch(&[]).next().is_none());
    }
}
