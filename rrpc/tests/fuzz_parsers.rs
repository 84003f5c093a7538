//! Property tests of the parsers a peer can reach: whatever bytes a remote writes into a
//! Rocket ring or a batch, or sends as a mode prefix, the receiver never panics, never
//! delivers more than a bucket holds, and never reads outside its input; and whatever the
//! sender encodes, the receiver decodes unchanged.

use proptest::prelude::*;
use rrpc::rocket::{
    decode_batch, HeapRing, MsgHeader, RingMem, RocketConfig, RocketError, RocketReceiver,
    RocketSender,
};
use rrpc::server::mode::{parse_request, RequestError};
use rrpc::wire::{FetchPrefix, MsgKind, ReadReply, ReplyMode, ZeroCopyPrefix};

const CFG: RocketConfig = RocketConfig::new(128, 4);

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Arbitrary batch bytes: messages stay within the input, iteration ends, and an
    /// error ends it.
    #[test]
    fn decode_batch_never_panics_or_overreads(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let mut seen = 0usize;
        let mut it = decode_batch(&bytes);
        for _ in 0..=bytes.len() / 16 + 1 {
            match it.next() {
                None => break,
                Some(Ok((hdr, payload))) => {
                    prop_assert_eq!(payload.len(), hdr.len as usize);
                    seen += 16 + payload.len().div_ceil(8) * 8;
                    prop_assert!(seen <= bytes.len());
                }
                Some(Err(RocketError::Corrupt { .. })) => {
                    prop_assert!(it.next().is_none(), "iteration stops after an error");
                    break;
                }
                Some(Err(e)) => prop_assert!(false, "unexpected error {e}"),
            }
        }
        prop_assert!(it.next().is_none(), "a batch of n bytes holds at most n/16 messages");
    }

    /// Arbitrary ring contents (a peer writing garbage, torn or stale labels): `poll`
    /// never panics, delivers at most a bucket's payload, and never reports corruption
    /// before a label has persisted.
    #[test]
    fn rocket_poll_survives_arbitrary_rings(words in proptest::collection::vec(any::<u64>(), 64), polls in 1usize..20) {
        let ring = HeapRing::new(CFG.ring_bytes());
        for (i, w) in words.iter().enumerate() {
            ring.store_u64(i * 8, *w);
        }
        let mut rx = RocketReceiver::new(CFG).unwrap();
        rx.set_corrupt_after(8);
        let mut out = Vec::new();
        for p in 0..polls {
            let before = out.len();
            match rx.poll(&ring, &mut out) {
                Ok(true) => prop_assert!(out.len() - before <= CFG.bucket_size - 16),
                Ok(false) => prop_assert_eq!(out.len(), before),
                Err(RocketError::Corrupt { .. }) => {
                    prop_assert!(p + 1 >= 8, "corrupt reported after {} polls", p + 1);
                    break;
                }
                Err(e) => prop_assert!(false, "unexpected error {e}"),
            }
        }
    }

    /// Messages pushed by a sender come out of the receiver unchanged, in order, across
    /// bucket boundaries and ring wrap-around.
    #[test]
    fn sender_to_receiver_roundtrip(msgs in proptest::collection::vec(
        (any::<u16>(), any::<u64>(), proptest::collection::vec(any::<u8>(), 0..=96)), 1..40))
    {
        let staging = HeapRing::new(CFG.ring_bytes());
        let ring = HeapRing::new(CFG.ring_bytes());
        let mut tx = RocketSender::new(CFG).unwrap();
        let mut rx = RocketReceiver::new(CFG).unwrap();
        let mut got: Vec<(u16, u64, Vec<u8>)> = Vec::new();
        let mut batch = Vec::new();
        let mut spans = Vec::new();
        let mut deliver = |tx: &mut RocketSender, rx: &mut RocketReceiver, got: &mut Vec<_>| {
            tx.seal(&staging);
            spans.clear();
            tx.take_ready(&mut spans);
            for s in &spans {
                let mut b = vec![0u8; s.len];
                staging.read(s.offset, &mut b);
                ring.write(s.offset, &b);
            }
            batch.clear();
            while rx.poll(&ring, &mut batch).unwrap() {}
            for m in decode_batch(&batch) {
                let (h, p) = m.unwrap();
                got.push((h.handler, h.call_id, p.to_vec()));
            }
            tx.on_credit(rx.consumed()).unwrap();
        };
        for (handler, call_id, payload) in &msgs {
            let hdr = MsgHeader { len: 0, handler: *handler, kind: 1, flags: 0, call_id: *call_id };
            match tx.push(&staging, hdr, payload) {
                Ok(()) => {}
                Err(RocketError::RingFull) => {
                    deliver(&mut tx, &mut rx, &mut got);
                    tx.push(&staging, hdr, payload).unwrap();
                }
                Err(e) => prop_assert!(false, "push: {e}"),
            }
        }
        deliver(&mut tx, &mut rx, &mut got);
        prop_assert_eq!(got, msgs);
    }

    /// Mode prefixes and reply descriptors a peer sends: parsed or refused by length,
    /// never a panic; what is encoded parses back.
    #[test]
    fn prefixes_and_kinds_parse_or_refuse(bytes in proptest::collection::vec(any::<u8>(), 0..40),
                                         addr in any::<u64>(), rkey in any::<u32>(), n in any::<u32>(),
                                         handle in any::<u64>(), b in any::<u8>()) {
        prop_assert_eq!(ZeroCopyPrefix::from_bytes(&bytes).is_some(), bytes.len() >= ZeroCopyPrefix::BYTES);
        prop_assert_eq!(ReadReply::from_bytes(&bytes).is_some(), bytes.len() == ReadReply::BYTES);
        let _ = MsgKind::from_u8(b);
        if let Some(m) = ReplyMode::from_u8(b) {
            prop_assert!(m.prefix_bytes() <= ZeroCopyPrefix::BYTES);
        }
        let z = ZeroCopyPrefix { addr, rkey, capacity: n };
        prop_assert_eq!(ZeroCopyPrefix::from_bytes(&z.to_bytes()), Some(z));
        let r = ReadReply { addr, rkey, len: n, handle };
        prop_assert_eq!(ReadReply::from_bytes(&r.to_bytes()), Some(r));
    }

    /// Request headers a peer sends (mode bits, the fetch flag, prefixes): parsed or
    /// refused, never a panic; the parts tile the payload; what a caller encodes parses
    /// back.
    #[test]
    fn request_headers_parse_or_refuse(flags in any::<u8>(), bytes in proptest::collection::vec(any::<u8>(), 0..80),
                                       addr in any::<u64>(), rkey in any::<u32>(), len in any::<u32>(),
                                       zc in any::<bool>(), body in proptest::collection::vec(any::<u8>(), 0..40)) {
        match parse_request(flags, &bytes) {
            Ok(r) => {
                prop_assert_eq!(r.prefix.len(), r.mode.prefix_bytes());
                prop_assert_eq!(r.fetch.is_some(), flags & FetchPrefix::FLAG != 0);
                let fetched = if r.fetch.is_some() { FetchPrefix::BYTES } else { 0 };
                prop_assert_eq!(r.prefix.len() + fetched + r.body.len(), bytes.len());
            }
            Err(RequestError::UnknownMode(f)) => {
                prop_assert_eq!(f, flags);
                prop_assert!(ReplyMode::from_u8(flags & !FetchPrefix::FLAG).is_none());
            }
            Err(RequestError::Short { need, have }) => {
                prop_assert!(have < need);
                prop_assert_eq!(have, bytes.len());
            }
        }
        // As a caller builds one: [zero-copy prefix][fetch prefix] with no body, or a body.
        let mode = if zc { ReplyMode::ZeroCopy } else { ReplyMode::Read };
        let z = ZeroCopyPrefix { addr, rkey, capacity: len };
        let f = FetchPrefix { addr: addr ^ 1, rkey, len };
        let mut msg = Vec::new();
        if zc {
            msg.extend_from_slice(&z.to_bytes());
        }
        msg.extend_from_slice(&f.to_bytes());
        let r = parse_request(mode as u8 | FetchPrefix::FLAG, &msg).unwrap();
        prop_assert_eq!(r.mode, mode);
        prop_assert_eq!(r.fetch, Some(f));
        prop_assert!(r.body.is_empty());
        if zc {
            prop_assert_eq!(ZeroCopyPrefix::from_bytes(r.prefix), Some(z));
        }
        let r = parse_request(ReplyMode::Auto as u8, &body).unwrap();
        prop_assert_eq!(r.body, &body[..]);
        prop_assert_eq!(r.fetch, None);
    }
}
