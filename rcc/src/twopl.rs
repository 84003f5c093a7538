//! NOWAIT and WAITDIE: two-phase locking with every record locked at fetch (RCC, 4.2 and
//! 4.3). The read is batched with the lock: one-sided, CAS + READ in one doorbell (the
//! record cannot change once locked, and a failed CAS's READ is ignored); by RPC, one
//! lock-and-read message per participant. Commit writes each written record and unlocks
//! (update-and-unlock, one ordered list per record) and unlocks read-locked ones, in one
//! round: two round trips per transaction without conflicts.
//!
//! On a conflict NOWAIT aborts. WAITDIE's lock word holds the holder's timestamp: a
//! requester older than the holder (smaller timestamp) waits, re-posting CAS + READ and
//! yielding after each failure (one-sided) or waiting in the handler's event loop (RPC);
//! a younger one dies. Waits only go from older to younger, so there is no deadlock.

use futures::future::join_all;

use txn::history::Access;

use crate::coord::{accesses, lock_of, val_of, ver_of, versioned, Abort, Coord, Fault, Proto};
use crate::coord::{Stage, TxnSpec, Variant};
use crate::net::Net;
use crate::steps::{self, group};
use crate::wire::{self, FetchEntry, FetchHead};
use rrpc::typed::{encode_batch_iter, view_response, TailReader};

/// What a conflict on a record means for the requester.
enum OnConflict {
    Abort,
    Wait,
}

fn on_conflict<N: Net>(c: &Coord<N>, me: u64, holder: u64) -> OnConflict {
    match c.proto {
        Proto::WaitDie if c.planted(Fault::WaitDieNeverDie) || me < holder => OnConflict::Wait,
        _ => OnConflict::Abort,
    }
}

/// Run one attempt of `t` under NOWAIT or WAITDIE. Errors: [`Abort`].
pub async fn run<N: Net>(c: &Coord<N>, t: &TxnSpec) -> Result<Vec<Access>, Abort> {
    let me = match c.proto {
        Proto::WaitDie => c.ts(),
        _ => c.id,
    };
    // Which records take a lock: all, unless the planted bug skips read locks.
    let locks: Vec<bool> = t
        .ops
        .iter()
        .map(|o| o.write || !c.planted(Fault::NoWaitNoReadLocks))
        .collect();
    let tuples = match c.variant {
        Variant::OneSided => fetch_onesided(c, t, me, &locks).await?,
        Variant::Rpc => fetch_rpc(c, t, me, &locks).await?,
    };
    let versions: Vec<u64> = tuples.iter().map(|b| ver_of(b)).collect();
    let mut vals: Vec<Vec<u8>> = tuples.iter().map(|b| val_of(b).to_vec()).collect();
    if !(t.exec)(&mut vals) {
        release(c, t, me, &locks).await?;
        return Err(Abort::User);
    }
    let ins = c.inserts(t, &vals, 1, 0, 1);
    commit(c, t, me, &locks, &versions, &vals, &ins).await?;
    let mut acc = accesses(t, &versions);
    acc.extend(ins.into_iter().map(|i| i.access));
    Ok(acc)
}

async fn fetch_onesided<N: Net>(
    c: &Coord<N>,
    t: &TxnSpec,
    me: u64,
    locks: &[bool],
) -> Result<Vec<Vec<u8>>, Abort> {
    let mut tuples: Vec<Option<Vec<u8>>> = vec![None; t.ops.len()];
    let mut held = vec![false; t.ops.len()];
    let mut pending: Vec<usize> = (0..t.ops.len()).collect();
    loop {
        c.count_ops(pending.iter().map(|&i| 1 + usize::from(locks[i])).sum());
        let results = c
            .round(
                Stage::Lock,
                join_all(pending.iter().map(|&i| {
                    let (node, off, len) = c.loc(&t.ops[i]);
                    async move {
                        if locks[i] {
                            let (cas, rd) = c
                                .pair(c.net.cas(node, off, 0, me), c.net.read(node, off, len))
                                .await;
                            (i, Some(cas), rd)
                        } else {
                            (i, None, c.net.read(node, off, len).await)
                        }
                    }
                })),
            )
            .await;
        let mut retry = Vec::new();
        let mut failed: Option<Abort> = None;
        for (i, cas, rd) in results {
            let got = match cas {
                None => true,
                Some(Ok(old)) if c.acquired(old, me) => {
                    held[i] = true;
                    true
                }
                Some(Ok(holder)) => {
                    match on_conflict(c, me, holder) {
                        OnConflict::Wait if !c.stop.get() => retry.push(i),
                        _ => {
                            failed.get_or_insert(if c.stop.get() {
                                Abort::Stopped
                            } else {
                                Abort::Conflict
                            });
                        }
                    }
                    false
                }
                Some(Err(e)) => {
                    failed.get_or_insert(e.into());
                    false
                }
            };
            match rd {
                Ok(b) if got => tuples[i] = Some(b),
                Ok(_) => {}
                Err(e) => {
                    failed.get_or_insert(e.into());
                }
            }
        }
        if let Some(why) = failed {
            release_held(c, t, me, &held).await;
            return Err(why);
        }
        if retry.is_empty() {
            break;
        }
        c.net.yield_now().await;
        pending = retry;
    }
    Ok(tuples.into_iter().map(|b| b.expect("fetched")).collect())
}

async fn fetch_rpc<N: Net>(
    c: &Coord<N>,
    t: &TxnSpec,
    me: u64,
    locks: &[bool],
) -> Result<Vec<Vec<u8>>, Abort> {
    let (handler, mode) = match c.proto {
        Proto::WaitDie if c.planted(Fault::WaitDieNeverDie) => {
            (wire::FETCH_WAIT, wire::MODE_WAITDIE_NEVER_DIE)
        }
        Proto::WaitDie => (wire::FETCH_WAIT, wire::MODE_WAITDIE),
        _ => (wire::FETCH, wire::MODE_NOWAIT),
    };
    let by_node = group(c, t);
    c.count_msgs(by_node.len());
    let replies = c
        .round(
            Stage::Lock,
            join_all(by_node.iter().map(|(node, idx)| {
                let mut m = Vec::new();
                let head = FetchHead {
                    mode,
                    owner: me.into(),
                };
                let entries = idx.iter().map(|&i| {
                    let (_, off, len) = c.loc(&t.ops[i]);
                    FetchEntry::new(off, len as u32, locks[i])
                });
                encode_batch_iter(&head, entries, &mut m);
                c.net.call(*node, handler, m)
            })),
        )
        .await;
    let mut tuples: Vec<Vec<u8>> = vec![Vec::new(); t.ops.len()];
    let mut held = vec![false; t.ops.len()];
    let mut failed: Option<Abort> = None;
    for ((_, idx), r) in by_node.iter().zip(replies) {
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                failed.get_or_insert(e.into());
                continue;
            }
        };
        let b = if handler == wire::FETCH_WAIT {
            view_response::<wire::FetchWait, _, _>(&r)
        } else {
            view_response::<wire::Fetch, _, _>(&r)
        }
        .map_err(|e| bad_reply(c, e.to_string()))?;
        if b.head.status != wire::OK {
            failed.get_or_insert(Abort::Conflict);
            continue;
        }
        // The tuples, in request order, each as long as the request said.
        let mut tail = TailReader::new(b.entries);
        for &i in idx {
            let (_, _, len) = c.loc(&t.ops[i]);
            tuples[i] = tail.take(len).map_err(|e| bad_reply(c, e.detail))?.to_vec();
            held[i] = locks[i];
        }
        tail.finish().map_err(|e| bad_reply(c, e.detail))?;
    }
    if let Some(why) = failed {
        release_held(c, t, me, &held).await;
        return Err(why);
    }
    Ok(tuples)
}

fn bad_reply<N: Net>(c: &Coord<N>, why: String) -> Abort {
    let _ = c;
    Abort::Net(crate::net::NetError::Call {
        node: usize::MAX,
        handler: wire::FETCH,
        why,
    })
}

/// Release every lock `t` holds after a user abort (all of `locks`).
async fn release<N: Net>(c: &Coord<N>, t: &TxnSpec, me: u64, locks: &[bool]) -> Result<(), Abort> {
    release_held(c, t, me, locks).await;
    Ok(())
}

/// Release the locks marked in `held`, in one round ([`steps::release`]).
async fn release_held<N: Net>(c: &Coord<N>, t: &TxnSpec, me: u64, held: &[bool]) {
    let idx: Vec<usize> = (0..held.len()).filter(|&i| held[i]).collect();
    steps::release(c, t, me, &idx).await;
}

/// One node's ordered WRITEs: (offset, bytes).
type WriteList<'a> = Vec<(u64, &'a [u8])>;

/// Write back the written records, write the inserted rows and unlock every held
/// record, in one round.
async fn commit<N: Net>(
    c: &Coord<N>,
    t: &TxnSpec,
    me: u64,
    locks: &[bool],
    versions: &[u64],
    vals: &[Vec<u8>],
    ins: &[crate::coord::Inserted],
) -> Result<(), Abort> {
    let data: Vec<Option<Vec<u8>>> = t
        .ops
        .iter()
        .enumerate()
        .map(|(i, o)| o.write.then(|| versioned(versions[i] + 1, &vals[i])))
        .collect();
    match c.variant {
        Variant::OneSided => {
            let zero = 0u64.to_le_bytes();
            let zero = &zero[..];
            let lists: Vec<(usize, WriteList)> = t
                .ops
                .iter()
                .enumerate()
                .filter(|(i, _)| locks[*i])
                .map(|(i, o)| {
                    let (node, off, _) = c.loc(o);
                    let mut l: Vec<(u64, &[u8])> = Vec::with_capacity(2);
                    if let Some(d) = &data[i] {
                        l.push((off + crate::layout::VER, d));
                    }
                    l.push((off, zero));
                    (node, l)
                })
                .collect();
            c.count_ops(lists.iter().map(|(_, l)| l.len()).sum());
            let rs = c
                .round(
                    Stage::Commit,
                    c.with_inserts(
                        ins,
                        join_all(lists.iter().map(|(node, l)| c.write_list(*node, l))),
                    ),
                )
                .await?;
            for r in rs {
                r?;
            }
        }
        Variant::Rpc => {
            let entries: Vec<(usize, u64, &[u8])> = t
                .ops
                .iter()
                .enumerate()
                .filter(|(i, _)| locks[*i])
                .map(|(i, o)| {
                    let (node, off, _) = c.loc(o);
                    (node, off, data[i].as_deref().unwrap_or(&[]))
                })
                .collect();
            steps::commit_rpc(c, me, &entries, ins).await?;
        }
    }
    let _ = lock_of;
    Ok(())
}
