//! Network steps several protocols share: grouping a transaction's records by home
//! node (one RPC per participant per stage, RCC, 4), and releasing locks after an abort
//! (one round: WRITE 0 to each lock word one-sided, or one RELEASE message per
//! participant), and the RPC variants' commit round (one COMMIT message per
//! participant).

use std::collections::BTreeMap;

use futures::future::join_all;

use crate::coord::{Abort, Coord, Inserted, Stage, TxnSpec, Variant};
use crate::net::Net;
use rrpc::typed::encode_batch_iter;
use zerocopy::little_endian::U64;

use crate::wire;

/// The records of `t` by home node: (node, indices into `t.ops`), nodes ascending.
pub(crate) fn group<N: Net>(c: &Coord<N>, t: &TxnSpec) -> Vec<(usize, Vec<usize>)> {
    let mut by: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, o) in t.ops.iter().enumerate() {
        by.entry(c.layout.home(o.key)).or_default().push(i);
    }
    by.into_iter().collect()
}

/// The records `which` (indices into `t.ops`) by home node, nodes ascending, nodes
/// without any left out.
pub(crate) fn group_of<N: Net>(
    c: &Coord<N>,
    t: &TxnSpec,
    which: &[usize],
) -> Vec<(usize, Vec<usize>)> {
    group(c, t)
        .into_iter()
        .map(|(n, idx)| {
            (
                n,
                idx.into_iter()
                    .filter(|i| which.contains(i))
                    .collect::<Vec<_>>(),
            )
        })
        .filter(|(_, idx)| !idx.is_empty())
        .collect()
}

/// Release the locks `owner` holds on the records `held` (indices into `t.ops`), in one
/// round; failures are left to the fabric (a node that is gone holds nothing of ours
/// that matters).
pub(crate) async fn release<N: Net>(c: &Coord<N>, t: &TxnSpec, owner: u64, held: &[usize]) {
    if held.is_empty() {
        return;
    }
    match c.variant {
        Variant::OneSided => {
            c.count_ops(held.len());
            let zero = 0u64.to_le_bytes();
            let zero = &zero[..];
            c.round(
                Stage::Release,
                join_all(held.iter().map(|&i| {
                    let (node, off, _) = c.loc(&t.ops[i]);
                    async move { c.net.write_ordered(node, &[(off, zero)]).await }
                })),
            )
            .await;
        }
        Variant::Rpc => {
            let by_node = group_of(c, t, held);
            c.count_msgs(by_node.len());
            c.round(
                Stage::Release,
                join_all(by_node.iter().map(|(node, idx)| {
                    let mut m = Vec::new();
                    let offs = idx.iter().map(|&i| U64::new(c.loc(&t.ops[i]).1));
                    encode_batch_iter(&U64::new(owner), offs, &mut m);
                    c.net.call(*node, wire::RELEASE, m)
                })),
            )
            .await;
        }
    }
}

/// The RPC variants' commit round: one [`wire::COMMIT`] message per node
/// ([`Coord::commit_messages`]: `entries` `(node, tuple offset, bytes written at offset +
/// 8)` each unlocking, then the rows of `ins` without unlock), awaited together.
/// Errors: a message that does not encode, the first failed call.
pub(crate) async fn commit_rpc<N: Net>(
    c: &Coord<N>,
    owner: u64,
    entries: &[(usize, u64, &[u8])],
    ins: &[Inserted],
) -> Result<(), Abort> {
    let msgs = c.commit_messages(owner, entries, ins)?;
    c.count_msgs(msgs.len());
    let rs = c
        .round(
            Stage::Commit,
            join_all(
                msgs.into_iter()
                    .map(|(node, m)| c.net.call(node, wire::COMMIT, m)),
            ),
        )
        .await;
    for r in rs {
        r?;
    }
    Ok(())
}
