//! The participant's side of the RPC variants: handlers that lock, read, validate and
//! write tuples on the node's own CPU (RCC, 4.2-4.4, steps a2-a5). Plain functions over a
//! [`Store`], so the in-memory network of the tests and rrpc's server threads run the
//! same code. A malformed request is an error reply.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::layout::VER;
use crate::store::Store;
use crate::wire::{self, Dec, Enc};

/// How long a WAITDIE request may wait in a handler before it gives up with a conflict.
/// Far beyond any wait the protocol makes (an older transaction waits only for younger
/// holders, which finish or die); it only bounds a planted never-die deadlock.
pub const MAX_WAIT: Duration = Duration::from_secs(2);

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
/// [`MAX_WAIT`] replies a conflict.
pub async fn serve_waitdie<Y: Future<Output = ()>>(
    store: &dyn Store,
    region: u64,
    req: &[u8],
    yield_now: impl Fn() -> Y,
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
            if !wait || start.elapsed() > MAX_WAIT {
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
