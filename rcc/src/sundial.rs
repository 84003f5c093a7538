//! SUNDIAL: logical leases (RCC, 4.5, after Yu et al., "Sundial", VLDB 2018). Every
//! tuple carries a lease `[wts, rts]` (one word: `wts << 32 | rts`, logical
//! timestamps): the committed version is valid from `wts` to at least `rts`. A writer
//! locks (aborting on a held lock, like NOWAIT) and moves its timestamp past the lease,
//! `tts = max(tts, rts + 1)`; a reader moves it to the version's start, `tts = max(tts,
//! wts)`. At commit every read must hold at `tts`: a read with `rts < tts` has its lease
//! renewed (extended to `tts`), which fails if the tuple changed or is locked. The
//! writer installs its record with `wts = rts = tts` and `check_version + 1`, and
//! unlocks.
//!
//! One-sided, per record:
//! - write: CAS the lock `0 -> id` batched with a READ of the tuple (b1; it lands after
//!   the CAS, so it sees the lease under the lock, including every renewal that could
//!   still succeed); commit: WRITE lease, `check_version + 1` and record (one WRITE at
//!   offset 8), WRITE unlock (b4);
//! - read: READ the tuple (b1); a READ that finds the tuple locked is not used (abort),
//!   since a writer may be overwriting it under the READ;
//! - at commit, every read is checked in one round: a read with `rts < tts` first
//!   CAS-maxes the lease word from `[wts, rts]` to `[wts, tts]` (expecting an unchanged
//!   `wts`; again while the CAS finds a different `rts` still below `tts`), and every
//!   read batches a READ of `[lock, lease, check_version]` behind it: the read holds iff
//!   the lock is free and `check_version` is the one read. The READ also catches torn
//!   READs: a writer holds the lock during its whole write, and bumps `check_version`
//!   before it unlocks.
//!
//! Round trips without conflicts: 2 for a write-only transaction (lock, commit), 2 for a
//! read-only one (READ, check), 3 for a mixed one. The check of reads whose lease still
//! covers `tts` is an addition to RCC's one-sided SUNDIAL, which re-reads only the reads
//! it renews: without it a READ torn by a concurrent commit would go unnoticed.
//!
//! By RPC: one [`wire::FETCH`] per participant (locks on the written records, every
//! tuple replied: the handler's read cannot be torn; a read that finds its tuple locked
//! aborts, as one-sided: a renewal under that lock would fail, and letting such
//! transactions keep their own write locks until then livelocks write-skew-shaped
//! workloads over rrpc), one [`wire::SUNDIAL_RENEW`] per
//! participant with reads to renew (only when some `rts < tts`), one [`wire::COMMIT`]
//! per participant written: 2 round trips, plus 1 when a lease is renewed.
//!
//! Versions for the serializability check: the hidden `check_version` (read, or read +
//! 1 installed).

use futures::future::join_all;

use txn::history::Access;

use crate::coord::{Abort, Coord, Fault, Stage, TxnSpec, Variant};
use crate::layout::{SUNDIAL_CV, SUNDIAL_LEASE, SUNDIAL_REC};
use crate::net::{Net, NetError};
use crate::steps::{self, group, group_of, release};
use crate::wire::{self, FetchEntry, FetchHead, RenewEntry};
use rrpc::typed::{decode_response, encode_batch_iter, view_response, TailReader};
use zerocopy::little_endian::U64;

const LOW: u64 = 0xffff_ffff;

fn word(b: &[u8], at: u64) -> u64 {
    let at = at as usize;
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn bad(handler: u16, why: String) -> Abort {
    Abort::Net(NetError::Call {
        node: usize::MAX,
        handler,
        why,
    })
}

/// A fetched tuple: lease halves, check version, record.
#[derive(Clone, Debug, Default)]
struct Got {
    wts: u64,
    rts: u64,
    cv: u64,
    val: Vec<u8>,
}

impl Got {
    fn of(b: &[u8]) -> Self {
        let lease = word(b, SUNDIAL_LEASE);
        Self {
            wts: lease >> 32,
            rts: lease & LOW,
            cv: word(b, SUNDIAL_CV),
            val: b[SUNDIAL_REC as usize..].to_vec(),
        }
    }
}

/// Run one attempt of `t` under SUNDIAL. Errors: [`Abort`].
pub async fn run<N: Net>(c: &Coord<N>, t: &TxnSpec) -> Result<Vec<Access>, Abort> {
    let me = c.id;
    let n = t.ops.len();
    let got = match c.variant {
        Variant::OneSided => fetch_onesided(c, t, me).await?,
        Variant::Rpc => fetch_rpc(c, t, me).await?,
    };
    let writes: Vec<usize> = (0..n).filter(|&i| t.ops[i].write).collect();
    let reads: Vec<usize> = (0..n).filter(|&i| !t.ops[i].write).collect();
    let mut tts = 0u64;
    for (o, g) in t.ops.iter().zip(&got) {
        tts = tts.max(if o.write { g.rts + 1 } else { g.wts });
    }
    if tts > LOW {
        release(c, t, me, &writes).await;
        return Err(bad(
            wire::SUNDIAL_RENEW,
            format!("logical timestamp {tts} exceeds the lease's 32 bits"),
        ));
    }
    let mut vals: Vec<Vec<u8>> = got.iter().map(|g| g.val.clone()).collect();
    if !(t.exec)(&mut vals) {
        release(c, t, me, &writes).await;
        return Err(Abort::User);
    }
    if !reads.is_empty() {
        let ok = match c.variant {
            Variant::OneSided => check_onesided(c, t, &reads, &got, tts).await,
            Variant::Rpc => renew_rpc(c, t, &reads, &got, tts).await,
        };
        if let Err(e) = ok {
            release(c, t, me, &writes).await;
            return Err(e);
        }
    }
    let ins = c.inserts(t, &vals, 1, tts, 1);
    if !writes.is_empty() || !ins.is_empty() {
        commit(c, t, me, &writes, &got, &vals, tts, &ins).await?;
    }
    Ok(t.ops
        .iter()
        .zip(&got)
        .map(|(o, g)| {
            if o.write {
                Access::write(o.table, o.key, g.cv + 1)
            } else {
                Access::read(o.table, o.key, g.cv)
            }
        })
        .chain(ins.into_iter().map(|i| i.access))
        .collect())
}

async fn fetch_onesided<N: Net>(c: &Coord<N>, t: &TxnSpec, me: u64) -> Result<Vec<Got>, Abort> {
    let w = t.ops.iter().filter(|o| o.write).count();
    c.count_ops(t.ops.len() + w);
    let rs = c
        .round(
            Stage::Lock,
            join_all(t.ops.iter().enumerate().map(|(i, o)| {
                let (node, off, len) = c.loc(o);
                async move {
                    if o.write {
                        let (cas, rd) =
                            futures::join!(c.net.cas(node, off, 0, me), c.net.read(node, off, len));
                        (i, Some(cas), rd)
                    } else {
                        (i, None, c.net.read(node, off, len).await)
                    }
                }
            })),
        )
        .await;
    let mut got = vec![Got::default(); t.ops.len()];
    let mut held = Vec::new();
    let mut failed: Option<Abort> = None;
    for (i, cas, rd) in rs {
        let is_write = cas.is_some();
        match cas {
            None => {}
            Some(Ok(old)) if c.acquired(old, me) => held.push(i),
            Some(Ok(_)) => {
                failed.get_or_insert(Abort::Conflict);
            }
            Some(Err(e)) => {
                failed.get_or_insert(e.into());
            }
        }
        match rd {
            // A read that finds the tuple locked may be torn by the holder's commit.
            Ok(b) if !is_write && word(&b, 0) != 0 => {
                failed.get_or_insert(Abort::Conflict);
            }
            Ok(b) => got[i] = Got::of(&b),
            Err(e) => {
                failed.get_or_insert(e.into());
            }
        }
    }
    if let Some(why) = failed {
        release(c, t, me, &held).await;
        return Err(why);
    }
    Ok(got)
}

async fn fetch_rpc<N: Net>(c: &Coord<N>, t: &TxnSpec, me: u64) -> Result<Vec<Got>, Abort> {
    let by_node = group(c, t);
    c.count_msgs(by_node.len());
    let replies = c
        .round(
            Stage::Lock,
            join_all(by_node.iter().map(|(node, idx)| {
                let mut m = Vec::new();
                let head = FetchHead {
                    mode: wire::MODE_NOWAIT,
                    owner: U64::new(me),
                };
                let entries = idx.iter().map(|&i| {
                    let (_, off, len) = c.loc(&t.ops[i]);
                    FetchEntry::new(off, len as u32, t.ops[i].write)
                });
                encode_batch_iter(&head, entries, &mut m);
                c.net.call(*node, wire::FETCH, m)
            })),
        )
        .await;
    let mut got = vec![Got::default(); t.ops.len()];
    let mut held = Vec::new();
    let mut failed: Option<Abort> = None;
    for ((_, idx), r) in by_node.iter().zip(replies) {
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                failed.get_or_insert(e.into());
                continue;
            }
        };
        let reply =
            view_response::<wire::Fetch, _, _>(&r).map_err(|e| bad(wire::FETCH, e.to_string()))?;
        if reply.head.status != wire::OK {
            failed.get_or_insert(Abort::Conflict);
            continue;
        }
        // The tuples, in request order, each as long as the request said.
        let mut tail = TailReader::new(reply.entries);
        for &i in idx {
            let len = c.loc(&t.ops[i]).2;
            let b = tail.take(len).map_err(|e| bad(wire::FETCH, e.detail))?;
            if t.ops[i].write {
                held.push(i);
            } else if word(b, 0) != 0 {
                // As one-sided: a read of a locked tuple aborts at once (a read-write
                // conflict that would likely fail its renewal while holding locks).
                failed.get_or_insert(Abort::Conflict);
            }
            got[i] = Got::of(b);
        }
        tail.finish().map_err(|e| bad(wire::FETCH, e.detail))?;
    }
    if let Some(why) = failed {
        release(c, t, me, &held).await;
        return Err(why);
    }
    Ok(got)
}

/// One-sided check of every read at `tts`: renew (CAS-max of the lease, expecting the
/// `wts` read) where `rts < tts`, each followed by a READ of `[lock, lease,
/// check_version]` that must find the lock free and the version read.
async fn check_onesided<N: Net>(
    c: &Coord<N>,
    t: &TxnSpec,
    reads: &[usize],
    got: &[Got],
    tts: u64,
) -> Result<(), Abort> {
    let blind = c.planted(Fault::SundialBlindRenewal);
    // (read, lease expected by the renewal CAS, or None: no renewal).
    let mut todo: Vec<(usize, Option<u64>)> = reads
        .iter()
        .map(|&i| {
            let g = &got[i];
            (i, (g.rts < tts).then_some(g.wts << 32 | g.rts))
        })
        .collect();
    if blind {
        // The planted bug: a blind WRITE of the lease, and no re-check of those reads.
        let renew: Vec<usize> = todo
            .iter()
            .filter(|(_, e)| e.is_some())
            .map(|&(i, _)| i)
            .collect();
        todo.retain(|(_, e)| e.is_none());
        if !renew.is_empty() {
            c.count_ops(renew.len());
            let leases: Vec<[u8; 8]> = renew
                .iter()
                .map(|&i| (got[i].wts << 32 | tts).to_le_bytes())
                .collect();
            let rs = c
                .round(
                    Stage::Renew,
                    join_all(renew.iter().zip(&leases).map(|(&i, l)| {
                        let (node, off, _) = c.loc(&t.ops[i]);
                        async move {
                            c.net
                                .write_ordered(node, &[(off + SUNDIAL_LEASE, &l[..])])
                                .await
                        }
                    })),
                )
                .await;
            for r in rs {
                r?;
            }
        }
    }
    while !todo.is_empty() {
        c.count_ops(todo.len() + todo.iter().filter(|(_, e)| e.is_some()).count());
        let rs = c
            .round(
                Stage::Renew,
                join_all(todo.iter().map(|&(i, exp)| {
                    let (node, off, _) = c.loc(&t.ops[i]);
                    async move {
                        match exp {
                            Some(exp) => {
                                let new = (exp & !LOW) | tts;
                                let (cas, rd) = futures::join!(
                                    c.net.cas(node, off + SUNDIAL_LEASE, exp, new),
                                    c.net.read(node, off, SUNDIAL_REC as usize)
                                );
                                (i, Some((exp, cas)), rd)
                            }
                            None => (i, None, c.net.read(node, off, SUNDIAL_REC as usize).await),
                        }
                    }
                })),
            )
            .await;
        let mut again = Vec::new();
        for (i, cas, rd) in rs {
            let g = &got[i];
            if let Some((exp, cas)) = cas {
                let old = cas?;
                if old >> 32 != g.wts {
                    return Err(Abort::Validation);
                }
                if old != exp && old & LOW < tts {
                    // Another reader moved rts, still short of tts: CAS again.
                    again.push((i, Some(old)));
                    continue;
                }
            }
            let b = rd?;
            if word(&b, 0) != 0 || word(&b, SUNDIAL_CV) != g.cv {
                return Err(Abort::Validation);
            }
        }
        todo = again;
    }
    Ok(())
}

/// RPC renewal of the reads whose lease ends before `tts` (none: no round).
async fn renew_rpc<N: Net>(
    c: &Coord<N>,
    t: &TxnSpec,
    reads: &[usize],
    got: &[Got],
    tts: u64,
) -> Result<(), Abort> {
    let renew: Vec<usize> = reads
        .iter()
        .copied()
        .filter(|&i| got[i].rts < tts)
        .collect();
    if renew.is_empty() {
        return Ok(());
    }
    let mode = if c.planted(Fault::SundialBlindRenewal) {
        wire::RENEW_BLIND
    } else {
        wire::RENEW_CHECKED
    };
    let by_node = group_of(c, t, &renew);
    c.count_msgs(by_node.len());
    let rs = c
        .round(
            Stage::Renew,
            join_all(by_node.iter().map(|(node, idx)| {
                let mut m = Vec::new();
                let entries = idx.iter().map(|&i| RenewEntry {
                    off: U64::new(c.loc(&t.ops[i]).1),
                    check_version: U64::new(got[i].cv),
                    wts: U64::new(got[i].wts),
                    tts: U64::new(tts),
                });
                encode_batch_iter(&mode, entries, &mut m);
                c.net.call(*node, wire::SUNDIAL_RENEW, m)
            })),
        )
        .await;
    for r in rs {
        let status = decode_response::<wire::SundialRenew>(&r?)
            .map_err(|e| bad(wire::SUNDIAL_RENEW, e.to_string()))?;
        if status != wire::OK {
            return Err(Abort::Validation);
        }
    }
    Ok(())
}

/// Install every written record with lease `[tts, tts]` and `check_version + 1`, unlock.
#[allow(clippy::too_many_arguments)]
async fn commit<N: Net>(
    c: &Coord<N>,
    t: &TxnSpec,
    me: u64,
    writes: &[usize],
    got: &[Got],
    vals: &[Vec<u8>],
    tts: u64,
    ins: &[crate::coord::Inserted],
) -> Result<(), Abort> {
    // The bytes from the lease word on: lease, check_version, record.
    let data: Vec<Vec<u8>> = writes
        .iter()
        .map(|&i| {
            let mut d = Vec::with_capacity(16 + vals[i].len());
            d.extend_from_slice(&(tts << 32 | tts).to_le_bytes());
            d.extend_from_slice(&(got[i].cv + 1).to_le_bytes());
            d.extend_from_slice(&vals[i]);
            d
        })
        .collect();
    match c.variant {
        Variant::OneSided => {
            let zero = 0u64.to_le_bytes();
            let zero = &zero[..];
            c.count_ops(2 * writes.len());
            let rs = c
                .round(
                    Stage::Commit,
                    c.with_inserts(
                        ins,
                        join_all(writes.iter().zip(&data).map(|(&i, d)| {
                            let (node, off, _) = c.loc(&t.ops[i]);
                            async move {
                                c.net
                                    .write_ordered(node, &[(off + SUNDIAL_LEASE, d), (off, zero)])
                                    .await
                            }
                        })),
                    ),
                )
                .await?;
            for r in rs {
                r?;
            }
        }
        Variant::Rpc => {
            let entries: Vec<(usize, u64, &[u8])> = writes
                .iter()
                .zip(&data)
                .map(|(&i, d)| {
                    let (node, off, _) = c.loc(&t.ops[i]);
                    (node, off, &d[..])
                })
                .collect();
            steps::commit_rpc(c, me, &entries, ins).await?;
        }
    }
    Ok(())
}
