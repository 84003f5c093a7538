//! OCC after DrTM+H, as RCC runs it (RCC, 4.4; its four rounds as the errata to the
//! specification require): read every record with its version (`seq`), aborting on one
//! that is locked; lock the write set, checking with the same doorbell (CAS + READ of
//! `seq`) that each is still at the version read; validate the rest of the read set
//! (unlocked and at the version read); write back with `seq + 1` and unlock. Four round
//! trips for a read-write transaction, two for a read-only one. By RPC, one message per
//! participant per stage.
//!
//! Batching the lock round with validation (three rounds) admits write skew, so it is
//! not offered.

use futures::future::join_all;

use txn::history::Access;

use crate::coord::{accesses, lock_of, val_of, ver_of, versioned, Abort, Coord, Fault, Stage};
use crate::coord::{TxnSpec, Variant};
use crate::layout::VER;
use crate::net::{Net, NetError};
use crate::steps::{self, group, group_of, release};
use crate::wire::{self, Span, StatusHead, Versioned};
use rrpc::typed::{decode_response, encode_batch_iter, view_response, TailReader};

fn bad(handler: u16, why: String) -> Abort {
    Abort::Net(NetError::Call {
        node: usize::MAX,
        handler,
        why,
    })
}

/// Run one attempt of `t` under OCC. Errors: [`Abort`].
pub async fn run<N: Net>(c: &Coord<N>, t: &TxnSpec) -> Result<Vec<Access>, Abort> {
    let me = c.id;
    let tuples = read(c, t).await?;
    if tuples.iter().any(|b| lock_of(b) != 0) {
        return Err(Abort::Conflict);
    }
    let versions: Vec<u64> = tuples.iter().map(|b| ver_of(b)).collect();
    let mut vals: Vec<Vec<u8>> = tuples.iter().map(|b| val_of(b).to_vec()).collect();
    if !(t.exec)(&mut vals) {
        return Err(Abort::User);
    }
    let writes: Vec<usize> = (0..t.ops.len()).filter(|&i| t.ops[i].write).collect();
    let reads: Vec<usize> = (0..t.ops.len()).filter(|&i| !t.ops[i].write).collect();
    if !writes.is_empty() {
        lock(c, t, me, &writes, &versions).await?;
    }
    if !reads.is_empty() && !c.planted(Fault::OccNoValidation) {
        if let Err(e) = validate(c, t, &reads, &versions).await {
            release(c, t, me, &writes).await;
            return Err(e);
        }
    }
    let ins = c.inserts(t, &vals, 1, 0, 1);
    if !writes.is_empty() || !ins.is_empty() {
        commit(c, t, me, &writes, &versions, &vals, &ins).await?;
    }
    let mut acc = accesses(t, &versions);
    acc.extend(ins.into_iter().map(|i| i.access));
    Ok(acc)
}

async fn read<N: Net>(c: &Coord<N>, t: &TxnSpec) -> Result<Vec<Vec<u8>>, Abort> {
    match c.variant {
        Variant::OneSided => {
            c.count_ops(t.ops.len());
            let rs = c
                .round(
                    Stage::Read,
                    join_all(t.ops.iter().map(|o| {
                        let (node, off, len) = c.loc(o);
                        c.net.read(node, off, len)
                    })),
                )
                .await;
            rs.into_iter().map(|r| r.map_err(Abort::from)).collect()
        }
        Variant::Rpc => {
            let by_node = group(c, t);
            c.count_msgs(by_node.len());
            let rs = c
                .round(
                    Stage::Read,
                    join_all(by_node.iter().map(|(node, idx)| {
                        let mut m = Vec::new();
                        let entries = idx.iter().map(|&i| {
                            let (_, off, len) = c.loc(&t.ops[i]);
                            Span::new(off, len as u32)
                        });
                        encode_batch_iter(&(), entries, &mut m);
                        c.net.call(*node, wire::READ, m)
                    })),
                )
                .await;
            let mut tuples = vec![Vec::new(); t.ops.len()];
            for ((_, idx), r) in by_node.iter().zip(rs) {
                let r = r?;
                let b = view_response::<wire::Read, _, _>(&r)
                    .map_err(|e| bad(wire::READ, e.to_string()))?;
                // The tuples, in request order, each as long as the request said.
                let mut tail = TailReader::new(b.entries);
                for &i in idx {
                    let len = c.loc(&t.ops[i]).2;
                    tuples[i] = tail
                        .take(len)
                        .map_err(|e| bad(wire::READ, e.detail))?
                        .to_vec();
                }
                tail.finish().map_err(|e| bad(wire::READ, e.detail))?;
            }
            Ok(tuples)
        }
    }
}

/// Lock the write set, each still at its version read; on failure nothing stays locked.
async fn lock<N: Net>(
    c: &Coord<N>,
    t: &TxnSpec,
    me: u64,
    writes: &[usize],
    versions: &[u64],
) -> Result<(), Abort> {
    let mut held = Vec::new();
    let mut failed: Option<Abort> = None;
    match c.variant {
        Variant::OneSided => {
            c.count_ops(2 * writes.len());
            let rs = c
                .round(
                    Stage::Lock,
                    join_all(writes.iter().map(|&i| {
                        let (node, off, _) = c.loc(&t.ops[i]);
                        async move {
                            let (cas, seq) = c
                                .pair(c.net.cas(node, off, 0, me), c.net.read(node, off + VER, 8))
                                .await;
                            (i, cas, seq)
                        }
                    })),
                )
                .await;
            for (i, cas, seq) in rs {
                match cas {
                    Ok(old) if c.acquired(old, me) => held.push(i),
                    Ok(_) => {
                        failed.get_or_insert(Abort::Conflict);
                    }
                    Err(e) => {
                        failed.get_or_insert(e.into());
                    }
                }
                match seq {
                    Ok(b) if u64::from_le_bytes(b[..8].try_into().expect("8")) == versions[i] => {}
                    Ok(_) => {
                        failed.get_or_insert(Abort::Validation);
                    }
                    Err(e) => {
                        failed.get_or_insert(e.into());
                    }
                }
            }
        }
        Variant::Rpc => {
            let by_node: Vec<(usize, Vec<usize>)> = group_of(c, t, writes);
            c.count_msgs(by_node.len());
            let rs = c
                .round(
                    Stage::Lock,
                    join_all(by_node.iter().map(|(node, idx)| {
                        let mut m = Vec::new();
                        let entries = idx
                            .iter()
                            .map(|&i| Versioned::new(c.loc(&t.ops[i]).1, versions[i]));
                        encode_batch_iter(&zerocopy::little_endian::U64::new(me), entries, &mut m);
                        c.net.call(*node, wire::LOCK, m)
                    })),
                )
                .await;
            for ((_, idx), r) in by_node.iter().zip(rs) {
                match r {
                    Ok(r) => match decode_response::<wire::Lock>(&r) {
                        Ok(StatusHead {
                            status: wire::OK, ..
                        }) => held.extend(idx),
                        Ok(_) => {
                            failed.get_or_insert(Abort::Conflict);
                        }
                        Err(e) => {
                            failed.get_or_insert(bad(wire::LOCK, e.to_string()));
                        }
                    },
                    Err(e) => {
                        failed.get_or_insert(e.into());
                    }
                }
            }
        }
    }
    if let Some(why) = failed {
        release(c, t, me, &held).await;
        return Err(why);
    }
    Ok(())
}

async fn validate<N: Net>(
    c: &Coord<N>,
    t: &TxnSpec,
    reads: &[usize],
    versions: &[u64],
) -> Result<(), Abort> {
    match c.variant {
        Variant::OneSided => {
            c.count_ops(reads.len());
            let rs = c
                .round(
                    Stage::Validate,
                    join_all(reads.iter().map(|&i| {
                        let (node, off, _) = c.loc(&t.ops[i]);
                        async move { (i, c.net.read(node, off, 16).await) }
                    })),
                )
                .await;
            for (i, r) in rs {
                let b = r?;
                if lock_of(&b) != 0 || ver_of(&b) != versions[i] {
                    return Err(Abort::Validation);
                }
            }
        }
        Variant::Rpc => {
            let by_node = group_of(c, t, reads);
            c.count_msgs(by_node.len());
            let rs = c
                .round(
                    Stage::Validate,
                    join_all(by_node.iter().map(|(node, idx)| {
                        let mut m = Vec::new();
                        let entries = idx
                            .iter()
                            .map(|&i| Versioned::new(c.loc(&t.ops[i]).1, versions[i]));
                        encode_batch_iter(&(), entries, &mut m);
                        c.net.call(*node, wire::VALIDATE, m)
                    })),
                )
                .await;
            for r in rs {
                let status = decode_response::<wire::Validate>(&r?)
                    .map_err(|e| bad(wire::VALIDATE, e.to_string()))?;
                if status != wire::OK {
                    return Err(Abort::Validation);
                }
            }
        }
    }
    Ok(())
}

async fn commit<N: Net>(
    c: &Coord<N>,
    t: &TxnSpec,
    me: u64,
    writes: &[usize],
    versions: &[u64],
    vals: &[Vec<u8>],
    ins: &[crate::coord::Inserted],
) -> Result<(), Abort> {
    let data: Vec<(usize, Vec<u8>)> = writes
        .iter()
        .map(|&i| (i, versioned(versions[i] + 1, &vals[i])))
        .collect();
    match c.variant {
        Variant::OneSided => {
            c.count_ops(2 * writes.len());
            let zero = 0u64.to_le_bytes();
            let zero = &zero[..];
            let rs = c
                .round(
                    Stage::Commit,
                    c.with_inserts(
                        ins,
                        join_all(data.iter().map(|(i, d)| {
                            let (node, off, _) = c.loc(&t.ops[*i]);
                            async move { c.write_list(node, &[(off + VER, d), (off, zero)]).await }
                        })),
                    ),
                )
                .await?;
            for r in rs {
                r?;
            }
        }
        Variant::Rpc => {
            let entries: Vec<(usize, u64, &[u8])> = data
                .iter()
                .map(|(i, d)| {
                    let (node, off, _) = c.loc(&t.ops[*i]);
                    (node, off, &d[..])
                })
                .collect();
            steps::commit_rpc(c, me, &entries, ins).await?;
        }
    }
    Ok(())
}
