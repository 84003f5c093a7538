//! MVCC: timestamp ordering over RCC's 4 static version slots per tuple (RCC, 4.4).
//!
//! A transaction's timestamp `tts` is the coordinator's clock with its id in the low bits
//! ([`Coord::begin`]); after an abort the clock moves past the largest `wts`, `rts` or
//! lock seen ([`Coord::observe`]). A read uses the slot with the largest `wts < tts`
//! (aborting if none: slot overflow) and raises `rts` to `tts`; a write needs `tts >
//! rts` and `tts > max(wts)`, locks the tuple with `tts` and, at commit, overwrites an
//! empty or the oldest slot with `wts = tts`.
//!
//! One-sided, per record (RCC, Figs. 7 and 8, with the order the reader and writer must
//! keep so that they cannot both miss each other):
//! - fetch (both): READ the tuple (b1), check locally (b2); on failure abort and advance
//!   the clock;
//! - write: CAS the lock `0 -> tts` batched with a READ of the metadata (b4) that
//!   re-checks `tts > rts` and that no `wts` changed since b1 (so the record from b1 is
//!   the newest);
//! - read: raise `rts` FIRST (CAS `rts -> tts`, again while it returns a smaller `rts`),
//!   and only then READ the metadata again and check that the lock is free or held by a
//!   larger timestamp and that the slot chosen is still the best one at the same `wts`;
//! - commit: one ordered list per written record: mark the victim slot's `wts` pending
//!   (`tts |` [`MVCC_PENDING`]), WRITE the record, WRITE `wts = tts`, unlock. A reader
//!   never uses a pending slot and requires its slot's `wts` unchanged between its two
//!   READs, so a READ torn by a concurrent overwrite is never used. This assumes, as
//!   RDMA NICs do and FaRM relies on, that one READ copies in ascending address order
//!   (a slot's `wts` before its record); and, as NOWAIT's lock-and-read does, that the
//!   READ batched behind a CAS to the same node executes after it.
//!
//! Round trips without conflicts: a write-only transaction 3 (READ, CAS + READ, commit),
//! a read-only one 3 (READ, CAS `rts`, READ), a mixed one 4 (the reader's second READ
//! comes before the commit).
//!
//! By RPC, one [`wire::MVCC_FETCH`] per participant (the handler does the same checks in
//! the same order: raise `rts`, then check the lock) and one [`wire::MVCC_COMMIT`] per
//! participant written: 2 round trips with writes, 1 without.
//!
//! Versions for the serializability check: a read reports the `wts` of the slot it
//! read, a write the `tts` it installed (unique per object, ordered as the versions).

use futures::future::join_all;

use txn::history::Access;

use crate::coord::{Abort, Coord, Fault, Stage, TxnSpec, Variant};
use crate::layout::{MVCC_PENDING, MVCC_REC, MVCC_RTS, MVCC_SLOTS, MVCC_WTS};
use crate::net::{Net, NetError};
use crate::server::{mvcc_newest, mvcc_pick, mvcc_victim};
use crate::steps::{group, group_of, release};
use crate::wire::{self, MvccFetchEntry, Span};
use rrpc::typed::{encode_batch_iter, view_tail_response};
use zerocopy::little_endian::U64;

/// Bytes of MVCC's metadata: lock, `rts`, `wts[4]`.
const META: usize = MVCC_REC as usize;

fn word(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The metadata words of a tuple's (or metadata's) bytes.
struct Meta {
    lock: u64,
    rts: u64,
    wts: [u64; MVCC_SLOTS],
}

impl Meta {
    fn of(b: &[u8]) -> Self {
        Self {
            lock: word(b, 0),
            rts: word(b, MVCC_RTS as usize),
            wts: std::array::from_fn(|i| word(b, MVCC_WTS as usize + 8 * i)),
        }
    }
    /// The largest timestamp in it (to advance the clock past).
    fn max_ts(&self) -> u64 {
        self.wts
            .iter()
            .map(|w| w & !MVCC_PENDING)
            .chain([self.rts, self.lock])
            .max()
            .unwrap_or(0)
    }
}

fn bad(handler: u16, why: String) -> Abort {
    Abort::Net(NetError::Call {
        node: usize::MAX,
        handler,
        why,
    })
}

/// What a fetch gave per record: the `wts` read (reads) or the `wts` array at lock time
/// (writes), and the value.
struct Fetched {
    wts: Vec<u64>,
    snap: Vec<[u64; MVCC_SLOTS]>,
    vals: Vec<Vec<u8>>,
}

/// Run one attempt of `t` under MVCC at the coordinator's timestamp. Errors: [`Abort`].
pub async fn run<N: Net>(c: &Coord<N>, t: &TxnSpec) -> Result<Vec<Access>, Abort> {
    let tts = c.ts();
    if tts & MVCC_PENDING != 0 {
        return Err(bad(
            wire::MVCC_FETCH,
            format!("timestamp {tts:#x} reaches the pending bit of wts"),
        ));
    }
    let f = match c.variant {
        Variant::OneSided => fetch_onesided(c, t, tts).await?,
        Variant::Rpc => fetch_rpc(c, t, tts).await?,
    };
    let writes: Vec<usize> = (0..t.ops.len()).filter(|&i| t.ops[i].write).collect();
    let mut vals = f.vals;
    if !(t.exec)(&mut vals) {
        release(c, t, tts, &writes).await;
        return Err(Abort::User);
    }
    let ins = c.inserts(t, &vals, 0, tts, tts);
    if !writes.is_empty() || !ins.is_empty() {
        commit(c, t, tts, &writes, &f.snap, &vals, &ins).await?;
    }
    Ok(t.ops
        .iter()
        .zip(&f.wts)
        .map(|(o, &w)| {
            if o.write {
                Access::write(o.table, o.key, tts)
            } else {
                Access::read(o.table, o.key, w)
            }
        })
        .chain(ins.into_iter().map(|i| i.access))
        .collect())
}

async fn fetch_onesided<N: Net>(c: &Coord<N>, t: &TxnSpec, tts: u64) -> Result<Fetched, Abort> {
    let n = t.ops.len();
    // b1: READ every tuple.
    c.count_ops(n);
    let rs = c
        .round(
            Stage::Read,
            join_all(t.ops.iter().map(|o| {
                let (node, off, len) = c.loc(o);
                c.net.read(node, off, len)
            })),
        )
        .await;
    let mut f = Fetched {
        wts: vec![0; n],
        snap: vec![[0; MVCC_SLOTS]; n],
        vals: vec![Vec::new(); n],
    };
    let mut rts_seen = vec![0u64; n];
    let mut slot = vec![0usize; n];
    // b2: check locally.
    for (i, r) in rs.into_iter().enumerate() {
        let b = r?;
        let m = Meta::of(&b);
        let vb = c.layout.value_bytes(t.ops[i].table);
        let rec = |s: usize| b[META + s * vb..META + (s + 1) * vb].to_vec();
        if t.ops[i].write {
            let pending = m.wts.iter().any(|w| w & MVCC_PENDING != 0);
            let (newest, max_wts) = mvcc_newest(&m.wts);
            if m.lock != 0 || pending || tts <= m.rts || tts <= max_wts {
                c.observe(m.max_ts());
                return Err(Abort::Conflict);
            }
            f.snap[i] = m.wts;
            f.vals[i] = rec(newest);
        } else {
            let Some(s) = mvcc_pick(&m.wts, tts) else {
                c.observe(m.max_ts());
                return Err(Abort::Validation);
            };
            slot[i] = s;
            f.wts[i] = m.wts[s];
            rts_seen[i] = m.rts;
            f.vals[i] = rec(s);
        }
    }
    let writes: Vec<usize> = (0..n).filter(|&i| t.ops[i].write).collect();
    let reads: Vec<usize> = (0..n).filter(|&i| !t.ops[i].write).collect();
    let raise = !c.planted(Fault::MvccReadersDontRaiseRts);
    // Reads whose rts must still be raised, with the rts expected.
    let mut to_raise: Vec<(usize, u64)> = if raise {
        reads
            .iter()
            .filter(|&&i| rts_seen[i] < tts)
            .map(|&i| (i, rts_seen[i]))
            .collect()
    } else {
        Vec::new()
    };
    // b4 (writes): CAS + READ of the metadata; reads: the first CAS of rts.
    let mut held: Vec<usize> = Vec::new();
    let mut failed: Option<Abort> = None;
    if !writes.is_empty() || !to_raise.is_empty() {
        c.count_ops(2 * writes.len() + to_raise.len());
        let (locks, raises) = c
            .round(
                Stage::Lock,
                futures::future::join(
                    join_all(writes.iter().map(|&i| {
                        let (node, off, _) = c.loc(&t.ops[i]);
                        async move {
                            let (cas, meta) = futures::join!(
                                c.net.cas(node, off, 0, tts),
                                c.net.read(node, off, META)
                            );
                            (i, cas, meta)
                        }
                    })),
                    join_all(to_raise.iter().map(|&(i, exp)| {
                        let (node, off, _) = c.loc(&t.ops[i]);
                        c.net.cas(node, off + MVCC_RTS, exp, tts)
                    })),
                ),
            )
            .await;
        for (i, cas, meta) in locks {
            match cas {
                Ok(old) if c.acquired(old, tts) => held.push(i),
                Ok(holder) => {
                    c.observe(holder);
                    failed.get_or_insert(Abort::Conflict);
                }
                Err(e) => {
                    failed.get_or_insert(e.into());
                }
            }
            match meta {
                Ok(b) => {
                    let m = Meta::of(&b);
                    if tts <= m.rts || m.wts != f.snap[i] {
                        c.observe(m.max_ts());
                        failed.get_or_insert(Abort::Conflict);
                    }
                }
                Err(e) => {
                    failed.get_or_insert(e.into());
                }
            }
        }
        to_raise = next_raise(&to_raise, raises, tts, &mut failed);
    }
    // The CAS-max loop: again while another reader raised rts to less than tts.
    while failed.is_none() && !to_raise.is_empty() {
        c.count_ops(to_raise.len());
        let raises = c
            .round(
                Stage::Validate,
                join_all(to_raise.iter().map(|&(i, exp)| {
                    let (node, off, _) = c.loc(&t.ops[i]);
                    c.net.cas(node, off + MVCC_RTS, exp, tts)
                })),
            )
            .await;
        to_raise = next_raise(&to_raise, raises, tts, &mut failed);
    }
    // Reads: only now (rts >= tts) READ the metadata again: the lock free or held by a
    // larger timestamp, the slot chosen still the best one at the same wts.
    if failed.is_none() && !reads.is_empty() {
        c.count_ops(reads.len());
        let rs = c
            .round(
                Stage::Validate,
                join_all(reads.iter().map(|&i| {
                    let (node, off, _) = c.loc(&t.ops[i]);
                    c.net.read(node, off, META)
                })),
            )
            .await;
        for (&i, r) in reads.iter().zip(rs) {
            match r {
                Ok(b) => {
                    let m = Meta::of(&b);
                    let locked_by_older = m.lock != 0 && m.lock < tts;
                    let same =
                        mvcc_pick(&m.wts, tts) == Some(slot[i]) && m.wts[slot[i]] == f.wts[i];
                    if locked_by_older || !same {
                        c.observe(m.max_ts());
                        failed.get_or_insert(Abort::Validation);
                    }
                }
                Err(e) => {
                    failed.get_or_insert(e.into());
                }
            }
        }
    }
    if let Some(why) = failed {
        release(c, t, tts, &held).await;
        return Err(why);
    }
    Ok(f)
}

/// The reads whose `rts` CAS must be tried again: those that found a different `rts`
/// still below `tts` (with that `rts` as the next expected value).
fn next_raise(
    tried: &[(usize, u64)],
    results: Vec<Result<u64, NetError>>,
    tts: u64,
    failed: &mut Option<Abort>,
) -> Vec<(usize, u64)> {
    let mut again = Vec::new();
    for (&(i, exp), r) in tried.iter().zip(results) {
        match r {
            Ok(old) if old == exp || old >= tts => {}
            Ok(old) => again.push((i, old)),
            Err(e) => {
                failed.get_or_insert(e.into());
            }
        }
    }
    again
}

async fn fetch_rpc<N: Net>(c: &Coord<N>, t: &TxnSpec, tts: u64) -> Result<Fetched, Abort> {
    let n = t.ops.len();
    let kind_read = if c.planted(Fault::MvccReadersDontRaiseRts) {
        wire::MVCC_READ_NO_RTS
    } else {
        wire::MVCC_READ
    };
    let by_node = group(c, t);
    c.count_msgs(by_node.len());
    let replies = c
        .round(
            Stage::Lock,
            join_all(by_node.iter().map(|(node, idx)| {
                let mut m = Vec::new();
                let entries = idx.iter().map(|&i| {
                    let o = &t.ops[i];
                    MvccFetchEntry {
                        off: U64::new(c.loc(o).1),
                        vlen: (c.layout.value_bytes(o.table) as u32).into(),
                        kind: if o.write { wire::MVCC_WRITE } else { kind_read },
                    }
                });
                encode_batch_iter(&U64::new(tts), entries, &mut m);
                c.net.call(*node, wire::MVCC_FETCH, m)
            })),
        )
        .await;
    let mut f = Fetched {
        wts: vec![0; n],
        snap: vec![[0; MVCC_SLOTS]; n],
        vals: vec![Vec::new(); n],
    };
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
        let b = view_tail_response::<wire::MvccFetch, _, _>(&r)
            .map_err(|e| bad(wire::MVCC_FETCH, e.to_string()))?;
        if b.head.status != wire::OK {
            c.observe(b.head.word.get());
            failed.get_or_insert(Abort::Conflict);
            continue;
        }
        if b.entries.len() != idx.len() {
            return Err(bad(
                wire::MVCC_FETCH,
                format!("{} versions for {} records", b.entries.len(), idx.len()),
            ));
        }
        // One `wts` entry per record, and its value in the tail, in request order.
        let mut tail = b.tail_reader();
        for (&i, wts) in idx.iter().zip(b.entries) {
            let vb = c.layout.value_bytes(t.ops[i].table);
            f.wts[i] = wts.get();
            f.vals[i] = tail
                .take(vb)
                .map_err(|e| bad(wire::MVCC_FETCH, e.detail))?
                .to_vec();
            if t.ops[i].write {
                held.push(i);
            }
        }
        tail.finish().map_err(|e| bad(wire::MVCC_FETCH, e.detail))?;
    }
    if let Some(why) = failed {
        release(c, t, tts, &held).await;
        return Err(why);
    }
    Ok(f)
}

/// Install every written record in an empty or the oldest slot with `wts = tts`, unlock.
async fn commit<N: Net>(
    c: &Coord<N>,
    t: &TxnSpec,
    tts: u64,
    writes: &[usize],
    snap: &[[u64; MVCC_SLOTS]],
    vals: &[Vec<u8>],
    ins: &[crate::coord::Inserted],
) -> Result<(), Abort> {
    match c.variant {
        Variant::OneSided => {
            let pending = (tts | MVCC_PENDING).to_le_bytes();
            let done = tts.to_le_bytes();
            let zero = 0u64.to_le_bytes();
            let (pending, done, zero) = (&pending[..], &done[..], &zero[..]);
            c.count_ops(4 * writes.len());
            let rs = c
                .round(
                    Stage::Commit,
                    c.with_inserts(
                        ins,
                        join_all(writes.iter().map(|&i| {
                            let (node, off, _) = c.loc(&t.ops[i]);
                            let vb = c.layout.value_bytes(t.ops[i].table) as u64;
                            let s = mvcc_victim(&snap[i]) as u64;
                            let w = off + MVCC_WTS + 8 * s;
                            let rec = off + MVCC_REC + s * vb;
                            let val = &vals[i][..];
                            async move {
                                c.net
                                    .write_ordered(
                                        node,
                                        &[(w, pending), (rec, val), (w, done), (off, zero)],
                                    )
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
            let by_node = group_of(c, t, writes);
            c.count_msgs(by_node.len());
            let rs = c
                .round(
                    Stage::Commit,
                    c.with_inserts(
                        ins,
                        join_all(by_node.iter().map(|(node, idx)| async move {
                            let bytes = idx.iter().map(|&i| vals[i].len()).sum();
                            let records = idx.iter().map(|&i| {
                                let len = u32::try_from(vals[i].len()).unwrap_or(u32::MAX);
                                (Span::new(c.loc(&t.ops[i]).1, len), &vals[i][..])
                            });
                            let m = wire::tail_request(&U64::new(tts), idx.len(), bytes, records)
                                .map_err(|e| NetError::Call {
                                node: *node,
                                handler: wire::MVCC_COMMIT,
                                why: format!("cannot encode the request: {}", e.detail),
                            })?;
                            c.net.call(*node, wire::MVCC_COMMIT, m).await
                        })),
                    ),
                )
                .await?;
            for r in rs {
                r?;
            }
        }
    }
    Ok(())
}
