//! Property tests of the Lock RPC's wire format, which a peer can reach: arbitrary bytes
//! decode to a request or reply, or to an error, never a panic; what is encoded decodes
//! back unchanged.

use lockd::client::{LockRequest, Mode};
use lockd::owners::Owner;
use lockd::takeout::{LockReply, RefuseReason};
use lockd::wire::{
    decode_abandon, decode_release_node, decode_reply, decode_request, encode_reply_entry,
    encode_request, RequestHeader, MAX_ENTRIES,
};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_decode_or_refuse(bytes in proptest::collection::vec(any::<u8>(), 0..400),
                                        n_locks in 1u64..1_000, want in 0usize..20) {
        let mut out = Vec::new();
        if decode_request(&bytes, n_locks, &mut out).is_ok() {
            prop_assert!(!out.is_empty() && out.len() <= MAX_ENTRIES);
            prop_assert!(out.iter().all(|r| r.id < n_locks));
        }
        let _ = decode_release_node(&bytes);
        if let Ok(a) = decode_abandon(&bytes) {
            prop_assert!(!a.ids.is_empty() && a.ids.len() <= MAX_ENTRIES);
        }
        if let Ok(r) = decode_reply(&bytes, want) {
            prop_assert_eq!(r.len(), want);
            prop_assert!(r.iter().all(|e| e.granted_queue == e.reason.is_none()));
        }
    }

    #[test]
    fn requests_and_replies_roundtrip(ids in proptest::collection::btree_set(0u64..500, 1..=MAX_ENTRIES),
                                      ts in any::<u64>(), hot in any::<bool>(), node in any::<u32>(),
                                      words in proptest::collection::vec((any::<u64>(), any::<u64>(), any::<u64>(), 0u8..4), 1..=MAX_ENTRIES)) {
        let reqs: Vec<LockRequest> = ids
            .iter()
            .map(|&id| LockRequest { id, ts, mode: if hot { Mode::Hot } else { Mode::Cold } })
            .collect();
        let mut buf = Vec::new();
        let hdr = RequestHeader { owner: Owner { node, incarnation: ts ^ 1 }, seq: ts / 3, epoch: ts / 5 };
        encode_request(&reqs, &hdr, &mut buf).unwrap();
        let mut back = Vec::new();
        prop_assert_eq!(decode_request(&buf, 500, &mut back), Ok(hdr));
        prop_assert_eq!(&back, &reqs);

        let replies: Vec<LockReply> = words
            .iter()
            .map(|&(ticket, upper, queued_ts, r)| {
                let reason = match r {
                    0 => None,
                    1 => Some(RefuseReason::Timestamp),
                    2 => Some(RefuseReason::ColdWatermark),
                    _ => Some(RefuseReason::HotWatermark),
                };
                LockReply { granted_queue: reason.is_none(), reason, ticket, upper, queued_ts }
            })
            .collect();
        let mut buf = Vec::new();
        for r in &replies {
            encode_reply_entry(r, &mut buf);
        }
        prop_assert_eq!(decode_reply(&buf, replies.len()).unwrap(), replies);
    }
}
