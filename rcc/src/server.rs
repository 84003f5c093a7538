//! The participant's side of the RPC variants: handlers that lock, read, validate and
//! write tuples on the node's own CPU (RCC, 4.2-4.5, steps a2-a6). Plain functions over a
//! [`Store`], so the in-memory network of the tests and rrpc's server threads run the
//! same code. A malformed request is an error reply.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::layout::{MVCC_PENDING, MVCC_REC, MVCC_RTS, MVCC_SLOTS, MVCC_WTS, VER};
use crate::layout::{SUNDIAL_CV, SUNDIAL_LEASE};
use crate::store::Store;
use crate::wire::{self, Dec, Enc};

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

struct FetchEntry {
    off: u64,
    len: u32,
    lock: bool,
}

fn parse_fetch(region: u64, req: &[u8]) -> Result<(u8, u64, Vec<FetchEntry>), String> {
    let mut d = Dec(req);
    let mode = d.u8()?;
    let owner = d.u64()?;
    if owner == 0 {
        return Err("lock owner 0 is reserved for a free lock".into());
    }
    let n = d.u16()?;
    let mut v = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let off = d.u64()?;
        let len = d.u32()?;
        let lock = d.u8()? != 0;
        check(region, off, u64::from(len).max(16))?;
        v.push(FetchEntry { off, len, lock });
    }
    Ok((mode, owner, v))
}

fn conflict(out: &mut Vec<u8>, holder: u64) {
    out.clear();
    out.extend_from_slice(&Enc::default().u8(wire::CONFLICT).u64(holder).0);
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
            let (mode, owner, es) = parse_fetch(region, req)?;
            if mode != wire::MODE_NOWAIT {
                return Err(format!("FETCH mode {mode} waits: send it as FETCH_WAIT"));
            }
            let mut taken = Vec::new();
            for e in &es {
                if e.lock {
                    let old = store.cas(e.off, 0, owner);
                    if old != 0 {
                        for &o in &taken {
                            store.cas(o, owner, 0);
                        }
                        conflict(out, old);
                        return Ok(());
                    }
                    taken.push(e.off);
                }
            }
            reply_tuples(store, &es, out);
            Ok(())
        }
        wire::RELEASE => {
            let mut d = Dec(req);
            let owner = d.u64()?;
            for _ in 0..d.u16()? {
                let off = d.u64()?;
                check(region, off, 8)?;
                store.cas(off, owner, 0);
            }
            Ok(())
        }
        wire::COMMIT => {
            let mut d = Dec(req);
            let owner = d.u64()?;
            let n = d.u16()?;
            let mut es = Vec::with_capacity(n as usize);
            for _ in 0..n {
                let off = d.u64()?;
                let unlock = d.u8()? != 0;
                let len = d.u32()? as usize;
                let data = d.take(len)?;
                check(region, off, 8 + len as u64)?;
                if unlock && store.load(off) != owner {
                    return Err(format!(
                        "commit of a record at {off} whose lock {:#x} is not the committer's {owner:#x}",
                        store.load(off)
                    ));
                }
                es.push((off, unlock, data));
            }
            for (off, unlock, data) in es {
                if !data.is_empty() {
                    store.write(off + VER, data);
                }
                if unlock {
                    store.store(off, 0);
                }
            }
            Ok(())
        }
        wire::READ => {
            let mut d = Dec(req);
            let n = d.u16()?;
            let mut es = Vec::with_capacity(n as usize);
            for _ in 0..n {
                let off = d.u64()?;
                let len = d.u32()?;
                check(region, off, u64::from(len))?;
                es.push(FetchEntry {
                    off,
                    len,
                    lock: false,
                });
            }
            for e in &es {
                let at = out.len();
                out.resize(at + e.len as usize, 0);
                store.read(e.off, &mut out[at..]);
            }
            Ok(())
        }
        wire::LOCK => {
            let mut d = Dec(req);
            let owner = d.u64()?;
            if owner == 0 {
                return Err("lock owner 0 is reserved for a free lock".into());
            }
            let n = d.u16()?;
            let mut es = Vec::with_capacity(n as usize);
            for _ in 0..n {
                let off = d.u64()?;
                let seq = d.u64()?;
                check(region, off, 16)?;
                es.push((off, seq));
            }
            let mut taken = Vec::new();
            for (off, seq) in es {
                let old = store.cas(off, 0, owner);
                if old == 0 {
                    taken.push(off);
                }
                if old != 0 || store.load(off + VER) != seq {
                    for &o in &taken {
                        store.cas(o, owner, 0);
                    }
                    conflict(out, old);
                    return Ok(());
                }
            }
            out.extend_from_slice(&Enc::default().u8(wire::OK).u64(0).0);
            Ok(())
        }
        wire::VALIDATE => {
            let mut d = Dec(req);
            let n = d.u16()?;
            let mut ok = true;
            for _ in 0..n {
                let off = d.u64()?;
                let seq = d.u64()?;
                check(region, off, 16)?;
                ok &= store.load(off) == 0 && store.load(off + VER) == seq;
            }
            out.push(if ok { wire::OK } else { wire::CONFLICT });
            Ok(())
        }
        wire::MVCC_FETCH => mvcc_fetch(store, region, req, out),
        wire::MVCC_COMMIT => mvcc_commit(store, region, req),
        wire::SUNDIAL_RENEW => sundial_renew(store, region, req, out),
        other => Err(format!("no RCC handler {other}")),
    }
}

fn reply_tuples(store: &dyn Store, es: &[FetchEntry], out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&Enc::default().u8(wire::OK).u64(0).0);
    for e in es {
        let at = out.len();
        out.resize(at + e.len as usize, 0);
        store.read(e.off, &mut out[at..]);
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
    let (mode, owner, es) = parse_fetch(region, req)?;
    let never_die = match mode {
        wire::MODE_WAITDIE => false,
        wire::MODE_WAITDIE_NEVER_DIE => true,
        m => return Err(format!("FETCH_WAIT mode {m} is not WAITDIE")),
    };
    let start = Instant::now();
    let mut taken = Vec::new();
    let mut out = Vec::new();
    for e in &es {
        if !e.lock {
            continue;
        }
        loop {
            let old = store.cas(e.off, 0, owner);
            if old == 0 {
                taken.push(e.off);
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
    reply_tuples(store, &es, &mut out);
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
/// the lock (the same order as the one-sided variant).
fn mvcc_fetch(store: &dyn Store, region: u64, req: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
    let mut d = Dec(req);
    let tts = d.u64()?;
    if tts == 0 || tts & MVCC_PENDING != 0 {
        return Err(format!("MVCC timestamp {tts:#x} out of range"));
    }
    let n = d.u16()?;
    let mut es = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let off = d.u64()?;
        let vlen = d.u32()? as u64;
        let kind = d.u8()?;
        check(region, off, MVCC_REC + MVCC_SLOTS as u64 * vlen)?;
        if vlen == 0 || kind > wire::MVCC_READ_NO_RTS {
            return Err(format!(
                "MVCC entry at {off}: record of {vlen} bytes, kind {kind}"
            ));
        }
        es.push((off, vlen, kind));
    }
    let mut taken: Vec<u64> = Vec::new();
    let mut seen = 0u64;
    let mut body = Enc::default();
    let mut ok = true;
    for &(off, vlen, kind) in &es {
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
            let mut rec = vec![0u8; vlen as usize];
            store.read(off + MVCC_REC + newest as u64 * vlen, &mut rec);
            body.u64(max_wts).bytes(&rec);
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
            let mut rec = vec![0u8; vlen as usize];
            store.read(off + MVCC_REC + s as u64 * vlen, &mut rec);
            // Re-traverse wts: no write meanwhile.
            if store.load(off + MVCC_WTS + 8 * s as u64) != wts[s] {
                ok = false;
                break;
            }
            body.u64(wts[s]).bytes(&rec);
        }
    }
    if !ok {
        for &o in &taken {
            store.cas(o, tts, 0);
        }
        conflict(out, seen);
        return Ok(());
    }
    out.extend_from_slice(&Enc::default().u8(wire::OK).u64(0).0);
    out.extend_from_slice(&body.0);
    Ok(())
}

/// [`wire::MVCC_COMMIT`]: RCC, 4.4 a6.
fn mvcc_commit(store: &dyn Store, region: u64, req: &[u8]) -> Result<(), String> {
    let mut d = Dec(req);
    let tts = d.u64()?;
    let n = d.u16()?;
    let mut es = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let off = d.u64()?;
        let vlen = d.u32()? as u64;
        let data = d.take(vlen as usize)?;
        check(region, off, MVCC_REC + MVCC_SLOTS as u64 * vlen.max(8))?;
        if store.load(off) != tts {
            return Err(format!(
                "MVCC commit of a record at {off} whose lock {:#x} is not the committer's {tts:#x}",
                store.load(off)
            ));
        }
        es.push((off, vlen, data));
    }
    for (off, vlen, data) in es {
        let s = mvcc_victim(&mvcc_wts(store, off)) as u64;
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
    let mut d = Dec(req);
    let mode = d.u8()?;
    let n = d.u16()?;
    let mut ok = true;
    for _ in 0..n {
        let off = d.u64()?;
        let cv = d.u64()?;
        let wts = d.u64()?;
        let tts = d.u64()?;
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
    out.push(if ok { wire::OK } else { wire::CONFLICT });
    Ok(())
}

/// Serve CALVIN's deposits, [`wire::CALVIN_BATCH`] or [`wire::CALVIN_FORWARD`], over a node's region of `region` bytes into `out`
/// (empty). Errors: an unknown id, a malformed message, an entry outside the region or
/// unaligned.
pub fn serve_deposit(
    store: &dyn Store,
    region: u64,
    id: u16,
    req: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), String> {
    out.clear();
    if id != wire::CALVIN_BATCH && id != wire::CALVIN_FORWARD {
        return Err(format!("no CALVIN handler {id}"));
    }
    let inside = |off: u64, len: u64| {
        if !off.is_multiple_of(8) || !len.is_multiple_of(8) || off.saturating_add(len) > region {
            Err(format!(
                "{len} bytes at {off} are outside the {region}-byte region or unaligned"
            ))
        } else {
            Ok(())
        }
    };
    let mut d = Dec(req);
    let n = d.u16()?;
    let mut es = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let off = d.u64()?;
        let len = d.u32()?;
        let data = d.take(len as usize)?;
        let flag_off = d.u64()?;
        let flag = d.u64()?;
        inside(off, u64::from(len))?;
        inside(flag_off, 8)?;
        es.push((off, data, flag_off, flag));
    }
    for (off, data, flag_off, flag) in es {
        if !data.is_empty() {
            store.write(off, data);
        }
        store.store(flag_off, flag);
    }
    Ok(())
}
