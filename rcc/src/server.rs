//! The participant's side of the RPC variants: handlers that lock, read, validate and
//! write tuples on the node's own CPU (RCC, 4.2-4.5, steps a2-a6). Plain functions over a
//! [`Store`], so the in-memory network of the tests and rrpc's server threads run the
//! same code. Requests are read in place through their typed views ([`crate::wire`]) and
//! replies written straight into the reply buffer; a malformed request is an error
//! reply.

use std::future::Future;
use std::time::{Duration, Instant};

use rrpc::typed::{
    encode_batch, encode_response, encode_tail_batch, view_request, view_tail_request, BatchRef,
    TailBatchWriter,
};
use zerocopy::little_endian::U64;

use crate::layout::{MVCC_PENDING, MVCC_REC, MVCC_RTS, MVCC_SLOTS, MVCC_WTS, VER};
use crate::layout::{SUNDIAL_CV, SUNDIAL_LEASE};
use crate::store::Store;
use crate::wire::{self, FetchEntry, FetchHead, StatusHead};

/// How long a WAITDIE request may wait in a handler before it gives up with a conflict:
/// far beyond any wait the protocol makes (an older transaction waits only for younger
/// holders, which finish or die), and below rrpc's default call deadline (2 s), so the
/// requester hears a conflict rather than a timeout.
pub const MAX_WAIT: Duration = Duration::from_secs(1);

/// An `off`, `len` pair that is not inside a region of `region` bytes, or not aligned.
fn check(region: u64, off: u64, len: u64) -> Result<(), String> {
    if !off.is_multiple_of(8) || !len.is_multiple_of(8) || off.saturating_add(len) > region {
        return Err(format!(
            "record at {off} of {len} bytes is outside the {region}-byte partition or unaligned"
        ));
    }
    Ok(())
}

/// A FETCH or FETCH_WAIT request (`id`) read in place, its owner and every record checked.
fn view_fetch(
    region: u64,
    id: u16,
    req: &[u8],
) -> Result<BatchRef<'_, FetchHead, FetchEntry>, String> {
    let b = if id == wire::FETCH_WAIT {
        view_request::<wire::FetchWait, _, _>(req)
    } else {
        view_request::<wire::Fetch, _, _>(req)
    }
    .map_err(|e| e.to_string())?;
    if b.head.owner.get() == 0 {
        return Err("lock owner 0 is reserved for a free lock".into());
    }
    for e in b.entries {
        check(region, e.off.get(), u64::from(e.len.get()).max(16))?;
    }
    Ok(b)
}

/// The reply of a FETCH, or a LOCK, that met `holder`: the status head alone (a FETCH
/// reply's tuple bytes are its batch's `u8` entries, none here).
fn conflict(out: &mut Vec<u8>, holder: u64) {
    out.clear();
    encode_batch::<_, u8>(&StatusHead::conflict(holder), &[], out);
}

/// Serve a plain (non-waiting) request `id` into `out`. Errors: an unknown id, a
/// malformed request, a record outside the partition.
pub fn serve(
    store: &dyn Store,
    region: u64,
    id: u16,
    req: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), String> {
    out.clear();
    match id {
        wire::FETCH => {
            let b = view_fetch(region, id, req)?;
            let (mode, owner) = (b.head.mode, b.head.owner.get());
            if mode != wire::MODE_NOWAIT {
                return Err(format!("FETCH mode {mode} waits: send it as FETCH_WAIT"));
            }
            let mut taken = Vec::new();
            for e in b.entries {
                if e.lock != 0 {
                    let off = e.off.get();
                    let old = store.cas(off, 0, owner);
                    if old != 0 {
                        for &o in &taken {
                            store.cas(o, owner, 0);
                        }
                        conflict(out, old);
                        return Ok(());
                    }
                    taken.push(off);
                }
            }
            reply_tuples(store, b.entries, out);
            Ok(())
        }
        wire::RELEASE => {
            let b = view_request::<wire::Release, _, _>(req).map_err(|e| e.to_string())?;
            let owner = b.head.get();
            for off in b.entries {
                check(region, off.get(), 8)?;
                store.cas(off.get(), owner, 0);
            }
            Ok(())
        }
        wire::COMMIT => {
            let b = view_tail_request::<wire::Commit, _, _>(req).map_err(|e| e.to_string())?;
            let owner = b.head.get();
            let len_of = |e: &wire::CommitEntry| e.len.get() as usize;
            // Check every entry before writing any.
            for (e, data) in b.records(len_of).map_err(|e| wire::malformed(id, e))? {
                let off = e.off.get();
                check(region, off, 8 + data.len() as u64)?;
                if e.unlock != 0 && store.load(off) != owner {
                    return Err(format!(
                        "commit of a record at {off} whose lock {:#x} is not the committer's {owner:#x}",
                        store.load(off)
                    ));
                }
            }
            for (e, data) in b.records(len_of).map_err(|e| wire::malformed(id, e))? {
                let off = e.off.get();
                if !data.is_empty() {
                    store.write(off + VER, data);
                }
                if e.unlock != 0 {
                    store.store(off, 0);
                }
            }
            Ok(())
        }
        wire::READ => {
            let b = view_request::<wire::Read, _, _>(req).map_err(|e| e.to_string())?;
            for e in b.entries {
                check(region, e.off.get(), u64::from(e.len.get()))?;
            }
            // The reply's `u8` entries are the tuples, read straight into it.
            for e in b.entries {
                let at = out.len();
                out.resize(at + e.len.get() as usize, 0);
                store.read(e.off.get(), &mut out[at..]);
            }
            Ok(())
        }
        wire::LOCK => {
            let b = view_request::<wire::Lock, _, _>(req).map_err(|e| e.to_string())?;
            let owner = b.head.get();
            if owner == 0 {
                return Err("lock owner 0 is reserved for a free lock".into());
            }
            for e in b.entries {
                check(region, e.off.get(), 16)?;
            }
            let mut taken = Vec::new();
            for e in b.entries {
                let off = e.off.get();
                let old = store.cas(off, 0, owner);
                if old == 0 {
                    taken.push(off);
                }
                if old != 0 || store.load(off + VER) != e.seq.get() {
                    for &o in &taken {
                        store.cas(o, owner, 0);
                    }
                    out.clear();
                    return encode_response::<wire::Lock>(&StatusHead::conflict(old), out)
                        .map_err(|e| e.to_string());
                }
            }
            encode_response::<wire::Lock>(&StatusHead::ok(), out).map_err(|e| e.to_string())
        }
        wire::VALIDATE => {
            let b = view_request::<wire::Validate, _, _>(req).map_err(|e| e.to_string())?;
            let mut ok = true;
            for e in b.entries {
                let off = e.off.get();
                check(region, off, 16)?;
                ok &= store.load(off) == 0 && store.load(off + VER) == e.seq.get();
            }
            let status = if ok { wire::OK } else { wire::CONFLICT };
            encode_response::<wire::Validate>(&status, out).map_err(|e| e.to_string())
        }
        wire::MVCC_FETCH => mvcc_fetch(store, region, req, out),
        wire::MVCC_COMMIT => mvcc_commit(store, region, req),
        wire::SUNDIAL_RENEW => sundial_renew(store, region, req, out),
        other => Err(format!("no RCC handler {other}")),
    }
}

/// A FETCH's success reply: the status head, then every record's tuple bytes read
/// straight from the store into `out` (the batch's `u8` entries).
fn reply_tuples(store: &dyn Store, es: &[FetchEntry], out: &mut Vec<u8>) {
    out.clear();
    let tuples: usize = es.iter().map(|e| e.len.get() as usize).sum();
    out.reserve(size_of::<StatusHead>() + tuples);
    encode_batch::<_, u8>(&StatusHead::ok(), &[], out);
    for e in es {
        let at = out.len();
        out.resize(at + e.len.get() as usize, 0);
        store.read(e.off.get(), &mut out[at..]);
    }
}

/// Serve a WAITDIE lock-and-read (RCC, 4.3 a2-a3): lock every record of the request in
/// order; on a conflict an older requester (smaller timestamp, the owner word) waits,
/// yielding to the server thread's event loop (`yield_now`) between attempts, and a
/// younger one dies, releasing what this request took. Errors as [`serve`]; a wait past
/// [`MAX_WAIT`], or any wait once `stopped()` says the run is over, replies a conflict.
/// The planted never-die mode (every conflict waits) is not bounded by [`MAX_WAIT`]: it
/// deadlocks, as the bug would, until the run stops.
pub async fn serve_waitdie<Y: Future<Output = ()>>(
    store: &dyn Store,
    region: u64,
    req: &[u8],
    yield_now: impl Fn() -> Y,
    stopped: &(dyn Fn() -> bool + Sync),
) -> Result<Vec<u8>, String> {
    let b = view_fetch(region, wire::FETCH_WAIT, req)?;
    let (mode, owner) = (b.head.mode, b.head.owner.get());
    let never_die = match mode {
        wire::MODE_WAITDIE => false,
        wire::MODE_WAITDIE_NEVER_DIE => true,
        m => return Err(format!("FETCH_WAIT mode {m} is not WAITDIE")),
    };
    let start = Instant::now();
    let mut taken = Vec::new();
    let mut out = Vec::new();
    for e in b.entries {
        if e.lock == 0 {
            continue;
        }
        let off = e.off.get();
        loop {
            let old = store.cas(off, 0, owner);
            if old == 0 {
                taken.push(off);
                break;
            }
            let wait = never_die || owner < old;
            if !wait || stopped() || (!never_die && start.elapsed() > MAX_WAIT) {
                for &o in &taken {
                    store.cas(o, owner, 0);
                }
                conflict(&mut out, old);
                return Ok(out);
            }
            yield_now().await;
        }
    }
    reply_tuples(store, b.entries, &mut out);
    Ok(out)
}

/// MVCC's `wts` words of the tuple at `off`.
fn mvcc_wts(store: &dyn Store, off: u64) -> [u64; MVCC_SLOTS] {
    std::array::from_fn(|i| store.load(off + MVCC_WTS + 8 * i as u64))
}

/// The slot an MVCC read at `tts` uses: the largest usable (non-empty, not pending) `wts`
/// below `tts`.
pub fn mvcc_pick(wts: &[u64; MVCC_SLOTS], tts: u64) -> Option<usize> {
    (0..MVCC_SLOTS)
        .filter(|&i| wts[i] != 0 && wts[i] & MVCC_PENDING == 0 && wts[i] < tts)
        .max_by_key(|&i| wts[i])
}

/// The slot an MVCC commit overwrites: an empty one, else the oldest.
pub fn mvcc_victim(wts: &[u64; MVCC_SLOTS]) -> usize {
    (0..MVCC_SLOTS)
        .min_by_key(|&i| wts[i] & !MVCC_PENDING)
        .unwrap_or(0)
}

/// The newest slot (largest `wts`) and its `wts`.
pub fn mvcc_newest(wts: &[u64; MVCC_SLOTS]) -> (usize, u64) {
    (0..MVCC_SLOTS)
        .map(|i| (i, wts[i] & !MVCC_PENDING))
        .max_by_key(|&(_, w)| w)
        .unwrap_or((0, 0))
}

/// [`wire::MVCC_FETCH`]: RCC, 4.4 a2-a3, with the read raising `rts` before it checks
/// the lock (the same order as the one-sided variant). Each record is read from the
/// store straight into the reply.
fn mvcc_fetch(store: &dyn Store, region: u64, req: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
    let b = view_request::<wire::MvccFetch, _, _>(req).map_err(|e| e.to_string())?;
    let tts = b.head.get();
    if tts == 0 || tts & MVCC_PENDING != 0 {
        return Err(format!("MVCC timestamp {tts:#x} out of range"));
    }
    let mut tail = 0usize;
    for e in b.entries {
        let (off, vlen, kind) = (e.off.get(), u64::from(e.vlen.get()), e.kind);
        check(region, off, MVCC_REC + MVCC_SLOTS as u64 * vlen)?;
        if vlen == 0 || kind > wire::MVCC_READ_NO_RTS {
            return Err(format!(
                "MVCC entry at {off}: record of {vlen} bytes, kind {kind}"
            ));
        }
        tail += vlen as usize;
    }
    let mut taken: Vec<u64> = Vec::new();
    let mut seen = 0u64;
    let mut ok = true;
    let mut w = TailBatchWriter::new(out, &StatusHead::ok(), b.entries.len(), tail)
        .map_err(|e| wire::malformed(wire::MVCC_FETCH, e))?;
    for e in b.entries {
        let (off, vlen, kind) = (e.off.get(), u64::from(e.vlen.get()), e.kind);
        let read_slot = |s: u64| move |buf: &mut [u8]| store.read(off + MVCC_REC + s * vlen, buf);
        if kind == wire::MVCC_WRITE {
            let wts = mvcc_wts(store, off);
            let rts = store.load(off + MVCC_RTS);
            let (newest, max_wts) = mvcc_newest(&wts);
            seen = seen.max(rts).max(max_wts);
            let lock = store.load(off);
            if lock != 0 || tts <= rts || tts <= max_wts {
                seen = seen.max(lock);
                ok = false;
                break;
            }
            let old = store.cas(off, 0, tts);
            if old != 0 {
                seen = seen.max(old);
                ok = false;
                break;
            }
            taken.push(off);
            // a3: re-check after locking (writes may land between the check and the lock).
            let wts = mvcc_wts(store, off);
            let rts = store.load(off + MVCC_RTS);
            if tts <= rts || tts <= mvcc_newest(&wts).1 {
                seen = seen.max(rts).max(mvcc_newest(&wts).1);
                ok = false;
                break;
            }
            w.push_with(&U64::new(max_wts), vlen as usize, read_slot(newest as u64))
                .map_err(|e| wire::malformed(wire::MVCC_FETCH, e))?;
        } else {
            // Raise rts first, then check the lock.
            if kind == wire::MVCC_READ {
                loop {
                    let rts = store.load(off + MVCC_RTS);
                    if rts >= tts || store.cas(off + MVCC_RTS, rts, tts) == rts {
                        break;
                    }
                }
            }
            let lock = store.load(off);
            if lock != 0 && lock < tts {
                seen = seen.max(lock);
                ok = false;
                break;
            }
            let wts = mvcc_wts(store, off);
            let Some(s) = mvcc_pick(&wts, tts) else {
                seen = seen.max(mvcc_newest(&wts).1);
                ok = false;
                break;
            };
            w.push_with(&U64::new(wts[s]), vlen as usize, read_slot(s as u64))
                .map_err(|e| wire::malformed(wire::MVCC_FETCH, e))?;
            // Re-traverse wts: no write meanwhile (else the reply is replaced below).
            if store.load(off + MVCC_WTS + 8 * s as u64) != wts[s] {
                ok = false;
                break;
            }
        }
    }
    if ok {
        return w.finish().map_err(|e| wire::malformed(wire::MVCC_FETCH, e));
    }
    for &o in &taken {
        store.cas(o, tts, 0);
    }
    // A conflict replaces whatever records were written: the status alone, no entries.
    out.clear();
    encode_tail_batch::<_, U64>(&StatusHead::conflict(seen), &[], &[], out)
        .map_err(|e| wire::malformed(wire::MVCC_FETCH, e))
}

/// [`wire::MVCC_COMMIT`]: RCC, 4.4 a6.
fn mvcc_commit(store: &dyn Store, region: u64, req: &[u8]) -> Result<(), String> {
    let b = view_tail_request::<wire::MvccCommit, _, _>(req).map_err(|e| e.to_string())?;
    let tts = b.head.get();
    let len_of = |e: &wire::Span| e.len.get() as usize;
    let bad = |e| wire::malformed(wire::MVCC_COMMIT, e);
    // Check every record before writing any.
    for (e, _) in b.records(len_of).map_err(bad)? {
        let (off, vlen) = (e.off.get(), u64::from(e.len.get()));
        check(region, off, MVCC_REC + MVCC_SLOTS as u64 * vlen.max(8))?;
        if store.load(off) != tts {
            return Err(format!(
                "MVCC commit of a record at {off} whose lock {:#x} is not the committer's {tts:#x}",
                store.load(off)
            ));
        }
    }
    for (e, data) in b.records(len_of).map_err(bad)? {
        let (off, vlen) = (e.off.get(), u64::from(e.len.get()));
        let s = mvcc_victim(&mvcc_wts(store, off)) as u64;
        // Mark the victim slot pending before overwriting it, as the one-sided commit
        // does: a fetch running beside this handler (handlers of one node run
        // concurrently on some transports: tonic's worker threads) may have picked this
        // slot and be copying it; its re-check of the slot's `wts` then fails instead of
        // returning a record torn between two versions under the old `wts`.
        store.store(off + MVCC_WTS + 8 * s, tts | MVCC_PENDING);
        store.write(off + MVCC_REC + s * vlen, data);
        store.store(off + MVCC_WTS + 8 * s, tts);
        store.store(off, 0);
    }
    Ok(())
}

/// [`wire::SUNDIAL_RENEW`]: RCC, 4.5 a4.
fn sundial_renew(
    store: &dyn Store,
    region: u64,
    req: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), String> {
    let b = view_request::<wire::SundialRenew, _, _>(req).map_err(|e| e.to_string())?;
    let mode = *b.head;
    let mut ok = true;
    for e in b.entries {
        let (off, cv) = (e.off.get(), e.check_version.get());
        let (wts, tts) = (e.wts.get(), e.tts.get());
        check(region, off, SUNDIAL_CV + 8)?;
        if wts > u64::from(u32::MAX) || tts > u64::from(u32::MAX) {
            return Err(format!("SUNDIAL timestamps {wts}, {tts} exceed 32 bits"));
        }
        if mode == wire::RENEW_BLIND {
            store.store(off + SUNDIAL_LEASE, wts << 32 | tts);
            continue;
        }
        if store.load(off) != 0 || store.load(off + SUNDIAL_CV) != cv {
            ok = false;
            continue;
        }
        let lease = store.load(off + SUNDIAL_LEASE);
        if lease & 0xffff_ffff < tts {
            store.store(off + SUNDIAL_LEASE, (lease & !0xffff_ffff) | tts);
        }
    }
    let status = if ok { wire::OK } else { wire::CONFLICT };
    encode_response::<wire::SundialRenew>(&status, out).map_err(|e| e.to_string())
}

/// Serve CALVIN's deposits, [`wire::CALVIN_BATCH`] or [`wire::CALVIN_FORWARD`], over a
/// node's region of `region` bytes into `out` (empty). Errors: an unknown id, a
/// malformed message, an entry outside the region or unaligned.
pub fn serve_deposit(
    store: &dyn Store,
    region: u64,
    id: u16,
    req: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), String> {
    out.clear();
    let b = match id {
        wire::CALVIN_BATCH => view_tail_request::<wire::CalvinBatch, _, _>(req),
        wire::CALVIN_FORWARD => view_tail_request::<wire::CalvinForward, _, _>(req),
        _ => return Err(format!("no CALVIN handler {id}")),
    }
    .map_err(|e| e.to_string())?;
    let inside = |off: u64, len: u64| {
        if !off.is_multiple_of(8) || !len.is_multiple_of(8) || off.saturating_add(len) > region {
            Err(format!(
                "{len} bytes at {off} are outside the {region}-byte region or unaligned"
            ))
        } else {
            Ok(())
        }
    };
    let len_of = |e: &wire::DepositEntry| e.len.get() as usize;
    // Check every entry before writing any.
    for (e, _) in b.records(len_of).map_err(|e| wire::malformed(id, e))? {
        inside(e.off.get(), u64::from(e.len.get()))?;
        inside(e.flag_off.get(), 8)?;
    }
    for (e, data) in b.records(len_of).map_err(|e| wire::malformed(id, e))? {
        if !data.is_empty() {
            store.write(e.off.get(), data);
        }
        store.store(e.flag_off.get(), e.flag.get());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::HeapStore;

    /// MVCC's RPC handlers running side by side, as a transport with several server
    /// threads runs them: one thread commits new versions of one tuple (lock, commit),
    /// another fetches it for reading at a timestamp that picks the oldest slot, the one
    /// each commit overwrites. Every record a fetch returns must be the version its `wts`
    /// names (each version's 64 bytes all hold its `wts`): without the pending mark, a
    /// fetch copying the victim slot while a commit overwrites it returned the new bytes
    /// under the old `wts`.
    #[test]
    fn a_fetch_beside_a_commit_never_returns_a_record_torn_between_versions() {
        use std::sync::atomic::{AtomicBool, Ordering};
        const OFF: u64 = 1024;
        const VLEN: u64 = 64;
        let store = HeapStore::new(REGION);
        // Versions 1..=4 in the four slots, each record filled with its wts.
        for s in 0..MVCC_SLOTS as u64 {
            let wts = s + 1;
            store.store(OFF + MVCC_WTS + 8 * s, wts << 8);
            store.write(
                OFF + MVCC_REC + s * VLEN,
                &[(wts << 8).to_le_bytes(); 8].concat(),
            );
        }
        // The writer commits until the reader has made this many successful fetches.
        const READS: u64 = 2_000;
        let done = AtomicBool::new(false);
        std::thread::scope(|sc| {
            sc.spawn(|| {
                let mut v = 5u64;
                while !done.load(Ordering::Acquire) {
                    v += 1;
                    let tts = v << 8;
                    assert_eq!(store.cas(OFF, 0, tts), 0);
                    let rec = [tts.to_le_bytes(); 8].concat();
                    let m = wire::tail_request(
                        &U64::new(tts),
                        1,
                        VLEN as usize,
                        [(Span::new(OFF, VLEN as u32), &rec[..])],
                    )
                    .unwrap();
                    mvcc_commit(&store, REGION, &m).unwrap();
                }
            });
            sc.spawn(|| {
                let (mut reads, mut torn) = (0u64, 0u64);
                while reads < READS {
                    // A timestamp just above the oldest version: that slot is picked.
                    let wts: [u64; MVCC_SLOTS] =
                        std::array::from_fn(|i| store.load(OFF + MVCC_WTS + 8 * i as u64));
                    let oldest = wts.iter().map(|w| w & !MVCC_PENDING).min().unwrap();
                    let tts = oldest + 1;
                    let mut m = Vec::new();
                    encode_batch_iter(
                        &U64::new(tts),
                        [MvccFetchEntry {
                            off: OFF.into(),
                            vlen: (VLEN as u32).into(),
                            kind: wire::MVCC_READ_NO_RTS,
                        }],
                        &mut m,
                    );
                    let mut out = Vec::new();
                    mvcc_fetch(&store, REGION, &m, &mut out).unwrap();
                    let b = rrpc::typed::view_tail_response::<wire::MvccFetch, _, _>(&out).unwrap();
                    if b.head.status != wire::OK {
                        continue;
                    }
                    let w = b.entries[0].get();
                    let mut tail = b.tail_reader();
                    let rec = tail.take(VLEN as usize).unwrap();
                    reads += 1;
                    if rec.chunks_exact(8).any(|c| c != w.to_le_bytes()) {
                        torn += 1;
                    }
                }
                done.store(true, Ordering::Release);
                assert_eq!(torn, 0, "{torn} of {reads} fetches returned a torn record");
            });
        });
    }
    use crate::wire::{CommitEntry, MvccFetchEntry, RenewEntry, Span, Versioned};
    use rrpc::typed::encode_batch_iter;

    const REGION: u64 = 4096;

    /// A batch's head and entry sizes, bytes.
    type Shape = (usize, usize);

    /// A request of every plain handler that the handler accepts, with the sizes of its
    /// batch's head and entries (`None` for a tail batch, whose every truncation is
    /// malformed).
    fn good_requests() -> Vec<(u16, Vec<u8>, Option<Shape>)> {
        let owner = U64::new(7);
        let mut v = Vec::new();
        let mut m = Vec::new();
        let head = FetchHead {
            mode: wire::MODE_NOWAIT,
            owner,
        };
        let fetch = [
            FetchEntry::new(64, 16, true),
            FetchEntry::new(128, 24, false),
        ];
        encode_batch_iter(&head, fetch, &mut m);
        v.push((wire::FETCH, m, Some((9, 13))));
        let mut m = Vec::new();
        encode_batch_iter(&owner, [U64::new(64), U64::new(128)], &mut m);
        v.push((wire::RELEASE, m, Some((8, 8))));
        let insert = |off: u64| CommitEntry {
            off: off.into(),
            unlock: 0,
            len: 8.into(),
        };
        let m = wire::tail_request(
            &owner,
            2,
            16,
            [(insert(64), &[1; 8][..]), (insert(128), &[2; 8][..])],
        )
        .unwrap();
        v.push((wire::COMMIT, m, None));
        let mut m = Vec::new();
        encode_batch_iter(&(), [Span::new(64, 16), Span::new(128, 8)], &mut m);
        v.push((wire::READ, m, Some((0, 12))));
        let mut m = Vec::new();
        encode_batch_iter(
            &owner,
            [Versioned::new(512, 0), Versioned::new(640, 0)],
            &mut m,
        );
        v.push((wire::LOCK, m, Some((8, 16))));
        let mut m = Vec::new();
        encode_batch_iter(&(), [Versioned::new(64, 0), Versioned::new(128, 0)], &mut m);
        v.push((wire::VALIDATE, m, Some((0, 16))));
        let mvcc = |off: u64, kind| MvccFetchEntry {
            off: off.into(),
            vlen: 8.into(),
            kind,
        };
        let mut m = Vec::new();
        encode_batch_iter(
            &U64::new(9),
            [mvcc(1024, wire::MVCC_WRITE), mvcc(1280, wire::MVCC_WRITE)],
            &mut m,
        );
        v.push((wire::MVCC_FETCH, m, Some((8, 13))));
        let m = wire::tail_request(
            &U64::new(9),
            2,
            16,
            [
                (Span::new(1024, 8), &[3; 8][..]),
                (Span::new(1280, 8), &[4; 8][..]),
            ],
        )
        .unwrap();
        v.push((wire::MVCC_COMMIT, m, None));
        let renew = |off: u64| RenewEntry {
            off: off.into(),
            check_version: 0.into(),
            wts: 1.into(),
            tts: 2.into(),
        };
        let mut m = Vec::new();
        encode_batch_iter(&wire::RENEW_CHECKED, [renew(2048), renew(2560)], &mut m);
        v.push((wire::SUNDIAL_RENEW, m, Some((1, 32))));
        v
    }

    /// A partition where MVCC_COMMIT's records are locked by its `tts`, so that only the
    /// message can make it fail.
    fn fresh() -> HeapStore {
        let s = HeapStore::new(REGION);
        s.store(1024, 9);
        s.store(1280, 9);
        s
    }

    /// Every handler answers its good request, and refuses, with an error reply rather
    /// than a panic, every truncation that is not a whole head and entries, the request
    /// with a byte too many, and garbage.
    #[test]
    fn every_handler_refuses_truncated_long_and_garbage_requests() {
        for (id, req, shape) in good_requests() {
            let s = fresh();
            let mut out = Vec::new();
            serve(&s, REGION, id, &req, &mut out).unwrap_or_else(|e| panic!("{id}: {e}"));
            for len in 0..req.len() {
                let whole = shape.is_some_and(|(h, e)| len >= h && (len - h) % e == 0);
                let s = fresh();
                let r = serve(&s, REGION, id, &req[..len], &mut out);
                if !whole {
                    assert!(r.is_err(), "{id}: {len} of {} bytes accepted", req.len());
                }
            }
            let mut long = req.clone();
            long.push(0);
            let s = fresh();
            assert!(
                serve(&s, REGION, id, &long, &mut out).is_err(),
                "{id}: long"
            );
            for n in 0..64usize {
                let g: Vec<u8> = (0..n).map(|i| (i * 151 + n * 7 + 3) as u8).collect();
                let s = fresh();
                let _ = serve(&s, REGION, id, &g, &mut out);
                let g = vec![0xff; n];
                let _ = serve(&s, REGION, id, &g, &mut out);
            }
        }
    }

    #[test]
    fn a_commit_whose_tail_is_short_or_long_writes_nothing() {
        let s = HeapStore::new(REGION);
        let (_, req, _) = good_requests()
            .into_iter()
            .find(|r| r.0 == wire::COMMIT)
            .unwrap();
        let mut out = Vec::new();
        for bad in [&req[..req.len() - 1], &[&req[..], &[0u8][..]].concat()[..]] {
            let e = serve(&s, REGION, wire::COMMIT, bad, &mut out).unwrap_err();
            assert!(e.contains("tail bytes"), "{e}");
            assert_eq!((s.load(64 + VER), s.load(128 + VER)), (0, 0));
        }
        serve(&s, REGION, wire::COMMIT, &req, &mut out).unwrap();
        assert_eq!(s.load(64 + VER), 0x0101_0101_0101_0101);
    }

    #[test]
    fn fetch_and_mvcc_fetch_replies_decode_and_conflicts_release() {
        let s = HeapStore::new(REGION);
        s.store(128, 0x55);
        let (_, fetch, _) = good_requests()
            .into_iter()
            .find(|r| r.0 == wire::FETCH)
            .unwrap();
        let mut out = Vec::new();
        serve(&s, REGION, wire::FETCH, &fetch, &mut out).unwrap();
        let b = rrpc::typed::view_response::<wire::Fetch, _, _>(&out).unwrap();
        assert_eq!(
            (b.head.status, b.head.word.get(), b.entries.len()),
            (wire::OK, 0, 40)
        );
        assert_eq!(
            (s.load(64), &b.entries[16..24]),
            (7, &0x55u64.to_le_bytes()[..])
        );
        // Locked by someone else now: a conflict naming the holder, nothing taken.
        let s = HeapStore::new(REGION);
        s.store(64, 3);
        serve(&s, REGION, wire::FETCH, &fetch, &mut out).unwrap();
        let b = rrpc::typed::view_response::<wire::Fetch, _, _>(&out).unwrap();
        assert_eq!(
            (b.head.status, b.head.word.get(), b.entries.len()),
            (wire::CONFLICT, 3, 0)
        );

        let (_, mf, _) = good_requests()
            .into_iter()
            .find(|r| r.0 == wire::MVCC_FETCH)
            .unwrap();
        let s = HeapStore::new(REGION);
        s.store(1024 + MVCC_WTS, 4);
        s.write(1024 + MVCC_REC, &[6; 8]);
        serve(&s, REGION, wire::MVCC_FETCH, &mf, &mut out).unwrap();
        let b = rrpc::typed::view_tail_response::<wire::MvccFetch, _, _>(&out).unwrap();
        assert_eq!(b.head.status, wire::OK);
        assert_eq!(
            b.entries.iter().map(|w| w.get()).collect::<Vec<_>>(),
            [4, 0]
        );
        assert_eq!(b.tail, [[6; 8], [0; 8]].concat());
        assert_eq!((s.load(1024), s.load(1280)), (9, 9));
        // The second record is locked: the first lock is released, the reply is the
        // status alone.
        let s = HeapStore::new(REGION);
        s.store(1280, 5);
        serve(&s, REGION, wire::MVCC_FETCH, &mf, &mut out).unwrap();
        let b = rrpc::typed::view_tail_response::<wire::MvccFetch, _, _>(&out).unwrap();
        assert_eq!((b.head.status, b.head.word.get()), (wire::CONFLICT, 5));
        assert_eq!((b.entries.len(), b.tail.len(), s.load(1024)), (0, 0, 0));
    }

    #[test]
    fn fetch_wait_refuses_truncated_and_garbage_requests() {
        let s = fresh();
        let head = FetchHead {
            mode: wire::MODE_WAITDIE,
            owner: U64::new(7),
        };
        let mut req = Vec::new();
        encode_batch_iter(&head, [FetchEntry::new(64, 16, true)], &mut req);
        let wait = |req: &[u8]| {
            futures::executor::block_on(serve_waitdie(
                &s,
                REGION,
                req,
                || std::future::ready(()),
                &|| true,
            ))
        };
        let out = wait(&req).unwrap();
        assert_eq!(out.len(), 9 + 16);
        s.store(64, 0);
        for len in (0..req.len()).filter(|&l| l != 9) {
            let e = wait(&req[..len]).unwrap_err();
            assert!(e.contains("FetchWait (handler 146)"), "{e}");
        }
        let mut long = req.clone();
        long.push(1);
        assert!(wait(&long).is_err());
        assert!(wait(&[0xff; 40]).is_err());
    }
}
