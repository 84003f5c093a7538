//! Recovery of a dead compute node's commits and locks (Lotus 6; Motor 5.3), run by one
//! survivor once the membership service declared that node's incarnation dead.
//!
//! Order, as the project's recovery design prescribes:
//!
//! 1. **Logs.** Every commit log ([`crate::commit_log`]) of the dead incarnation found on
//!    any memory node is finished or undone, all side by side ([`settle_logs`] says why
//!    that is safe). The rule needs no values: **roll forward**
//!    iff every logged object's CVT holds a valid version at least the logged one.
//!    Versions of an object only grow, and only a lock holder installs; the dead node
//!    held every logged object's lock from before its log until every install was
//!    ACKed, and released none before that. So if some object lacks its version, no
//!    install of it landed and nobody else wrote it since: the node released nothing,
//!    and **roll back** (invalidate every logged victim cell: those cells' old versions
//!    were being overwritten anyway, and no reader can have committed on the partial
//!    state, since occ-cas aborts on locked reads, mvcc re-reads CVTs it saw locked and
//!    Scythe validates locks before versions) is safe. If every object holds its version
//!    or a later one, all installs landed (a later writer needed the lock, which the dead
//!    node released only after all its installs): the commit stands, as if its client had
//!    heard so. Either way the log is then cleared (after the roll-back's WRITEs were
//!    ACKed) and every logged lock word still holding the logged id is released with
//!    CAS(id, 0), in that order: a re-run (the recoverer died) never decides on a log
//!    whose objects another writer may already hold. A log of a commit that finished
//!    long ago passes as rolled forward and changes nothing.
//! 2. **Sweep.** Every CVT lock word and insert guard still holding an id of the dead
//!    incarnation ([`crate::txn_id::Owner::owns`]) is released with CAS: locks taken
//!    during execution, before any log. A CVT slot its insert claimed but never
//!    published (its state word holds the dead id, [`crate::cvt::claim_word`], whatever
//!    lock word the protocol writes) is freed, on every replica
//!    ([`crate::cvt::SLOT_FREED`]).
//! 3. Scythe's tickets are released after this, by the caller, through the lock service
//!    ([`crate::coordinator::TxnClient::recover`]).
//!
//! Cost: the sweep READs every table's index once (about 1 MiB per READ, 8 in flight),
//! while step 1 runs: for SmallBank's 100,000 accounts about 40 MB per table. Lotus,
//! whose locks live in the compute nodes' tables and whose ids reach the memory nodes
//! only in insert guards and claims, runs step 1 alone, releases the dead life's locks in
//! the lock tables, and then READs the guards alone ([`settle_logs`], then [`sweep`]
//! with [`SweepScope::Guards`]: 8 bytes per bucket), so that no scan of the indexes
//! delays its recovery. A claim of an insert in flight at the death lies in the chain of
//! the guard that insert held; it is sought there, a bucket at a time
//! ([`crate::cvt_index::seek_claim`]).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rrpc::fabric::RemoteAddr;
use rrpc::runtime::join_all;
use rrpc::NodeId;

use crate::commit_log::{CommitLog, LogEntry, LogExport};
use crate::cvt::{claim_word, claimer, Cvt, CELL_BYTES, HEADER_BYTES, LOCK_OFFSET, STATE_OFFSET};
use crate::cvt_index::{seek_claim, ClaimSeek};
use crate::cvt_remote::CvtRemote;
use crate::error::TxnError;
use crate::txn_id::{Owner, TxnId};

/// Bytes per READ of the sweep and of the log rows.
const CHUNK_BYTES: usize = 1 << 20;
/// READs the sweep keeps in flight.
const CHUNKS_IN_FLIGHT: usize = 8;

/// What one recovery did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Logs of the dead incarnation found (distinct transactions).
    pub logs: usize,
    /// Of them, rolled forward (commits that stand).
    pub forward: usize,
    /// Of them, rolled back (victim cells invalidated).
    pub back: usize,
    /// Lock words released: logged ones still held and swept ones.
    pub lock_words: usize,
    /// Insert guards released by the sweep.
    pub guards: usize,
    /// Claimed, never published CVT slots freed by the sweep.
    pub claims: usize,
    /// Scythe tickets released through the lock service, or Lotus locks released in the
    /// live compute nodes' lock tables (filled in by the caller).
    pub tickets: usize,
    /// `(transaction id, note)` of every log rolled forward (a commit that stands,
    /// perhaps without its client having heard so), for the application's accounting
    /// ([`crate::coordinator::Txn::set_log_note`]).
    pub forward_notes: Vec<(u64, i64)>,
    /// Time the logs took.
    pub logs_time: Duration,
    /// Time the sweep took after the logs (its READs overlap them).
    pub sweep_time: Duration,
    /// Time the Scythe tickets' hand-on took (filled in by the caller).
    pub tickets_time: Duration,
    /// Time from the start until every lock the dead life held was free again (its CVT
    /// lock words, Scythe tickets or Lotus lock-table locks): the whole recovery, except
    /// for Lotus, whose sweep of insert guards runs after its locks are released
    /// ([`sweep`]).
    pub locks_free: Duration,
}

impl RecoveryReport {
    /// The one line a recovery prints: `L logs (F forward, B back), W lock words swept,
    /// S tickets released, locks free after Y ms, done in X ms` (the caller prefixes who
    /// died when).
    pub fn summary(&self) -> String {
        format!(
            "{} logs ({} forward, {} back), {} lock words swept, {} tickets released, locks free after {:.1} ms, done in {:.1} ms",
            self.logs,
            self.forward,
            self.back,
            self.lock_words + self.guards,
            self.tickets,
            self.locks_free.as_secs_f64() * 1e3,
            self.total().as_secs_f64() * 1e3
        )
    }

    /// The whole recovery: logs, then the rest of the sweep, then the tickets.
    pub fn total(&self) -> Duration {
        self.logs_time + self.sweep_time + self.tickets_time
    }

    /// Where the time went: `logs X ms, sweep Y ms, tickets Z ms`.
    pub fn phases(&self) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        format!(
            "logs {:.1} ms, sweep {:.1} ms, tickets {:.1} ms",
            ms(self.logs_time),
            ms(self.sweep_time),
            ms(self.tickets_time)
        )
    }
}

/// Recover the commits and CVT locks of `dead` (steps 1 and 2 above) through `store`.
///
/// Safety condition (not checked here): `dead` is fenced: its lease expired or was
/// revoked and its queue pairs are in the error state, so it issues nothing more.
///
/// Errors: [`TxnError::Rpc`] when a memory node fails a READ, WRITE or CAS (recovery
/// is then incomplete; running it again is safe); [`TxnError::Export`] for a log naming
/// a table or partition the store does not have.
pub async fn recover_store(store: &CvtRemote, dead: Owner) -> Result<RecoveryReport, TxnError> {
    let t0 = Instant::now();
    // The sweep's scan READs every index while the logs are settled; its CASes wait
    // for them: a lock word is released only after its log, if any, rolled forward or
    // back. (A word the scan saw held by `dead` and the logs phase released since fails
    // its CAS: it no longer holds the dead id.)
    let (settled, scanned) =
        rrpc::runtime::join(settle_logs(store, dead), scan(store, dead, SweepScope::All)).await;
    let mut rep = settled?;
    let scanned = scanned?;
    if !sweep_left_out() {
        release_swept(store, &scanned, &mut rep).await?;
    }
    rep.sweep_time = t0.elapsed().saturating_sub(rep.logs_time);
    rep.locks_free = t0.elapsed();
    Ok(rep)
}

/// Step 2 alone, after [`settle_logs`] and after the caller released the dead life's
/// locks elsewhere (Lotus 6: logs, then the lock tables): the scan of `scope`, then its
/// CASes; adds to `rep` and sets its `sweep_time`. For a protocol whose locks are not
/// memory-node words (Lotus), so that the scan's READs neither delay the logs' nor hold
/// the lock tables back. Safety: as [`recover_store`]; the logs are settled.
///
/// Errors: as [`recover_store`].
pub async fn sweep(
    store: &CvtRemote,
    dead: Owner,
    scope: SweepScope,
    rep: &mut RecoveryReport,
) -> Result<(), TxnError> {
    let t0 = Instant::now();
    let scanned = scan(store, dead, scope).await?;
    if !sweep_left_out() {
        release_swept(store, &scanned, rep).await?;
    }
    rep.sweep_time = t0.elapsed();
    Ok(())
}

/// What the sweep ([`sweep`]) READs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SweepScope {
    /// Every table's index (its CVT lock words and claimed slots) and insert guards.
    All,
    /// The insert guards alone (8 bytes per bucket), for a protocol that never writes
    /// its id into a CVT's lock word: Lotus, whose locks live in the compute nodes'
    /// tables and whose inserts create CVTs with a lock word of 0
    /// ([`crate::cvt_remote::CvtRemote::create`]). Its only id in the indexes is an
    /// unpublished claim, which lies in the chain of a guard the dead insert held, and is
    /// sought there bucket by bucket.
    Guards,
}

/// Whether a test planted the sweep's omission ([`crate::fault::RecoveryBug::NoSweep`]).
pub(crate) fn sweep_left_out() -> bool {
    #[cfg(feature = "fault-injection")]
    return crate::fault::planted_recovery_bug() == Some(crate::fault::RecoveryBug::NoSweep);
    #[cfg(not(feature = "fault-injection"))]
    false
}

/// Step 1: every log of `dead` rolled forward or back, its id cleared, its lock words
/// released; `logs_time` is the time it took. Safety: as [`recover_store`].
///
/// Errors: as [`recover_store`].
pub async fn settle_logs(store: &CvtRemote, dead: Owner) -> Result<RecoveryReport, TxnError> {
    let mut rep = RecoveryReport::default();
    let t0 = Instant::now();
    let logs = find_logs(store, dead).await?;
    rep.logs = logs.len();
    // The logs are settled side by side, in three rounds: every decision (and roll-back),
    // then every clear, then every unlock. Side by side is safe: a decision reads only
    // versions that other logs' settling cannot move (a roll-back invalidates a victim
    // cell, never an object's newest valid version; a Lotus settle touches only cells
    // tagged with its own id). The rounds keep each log's order (its id cleared before
    // any unlock, so that a re-run, if this recoverer dies, never decides on a log whose
    // objects another writer may hold; a lock still held after a clear is the sweep's),
    // and they finish every roll-back before any lock word is released: a finished
    // commit's log may name an object that an unfinished one of the same node holds, and
    // its release of FORD's backup marks must not uncover that one's cells before they
    // are undone.
    let decided = join_all(logs.values().map(|(log, _)| settle(store, log))).await;
    for ((log, _), forward) in logs.values().zip(decided) {
        if forward? {
            rep.forward += 1;
            rep.forward_notes.push((log.id, log.note));
        } else {
            rep.back += 1;
        }
    }
    let clear = join_all(
        logs.values()
            .flat_map(|(_, found_on)| found_on.iter())
            .map(|&(node, at)| store.ctx().write(node, at, &[0u8; 8])),
    )
    .await;
    for c in clear {
        c?;
    }
    let unlocked = join_all(logs.values().map(|(log, _)| unlock_logged(store, log))).await;
    for n in unlocked {
        rep.lock_words += n?;
    }
    rep.logs_time = t0.elapsed();
    Ok(rep)
}

type FoundLogs = BTreeMap<u64, (CommitLog, Vec<(NodeId, RemoteAddr)>)>;

/// Every valid log of `dead` on every memory node, by transaction id, with the slots
/// it was found in. The memory nodes' rows are read side by side.
async fn find_logs(store: &CvtRemote, dead: Owner) -> Result<FoundLogs, TxnError> {
    let mut rows = Vec::new();
    for m in 0..store.memnode_count() {
        let Some(region) = store.log(m) else { continue };
        let node = store.memnode(m)?;
        if store.written_off(node) {
            // A dead memory node's copy of the logs is gone; the live copies name the
            // same transactions (each log goes to every memory node installed on).
            continue;
        }
        rows.push((node, region));
    }
    let found = join_all(
        rows.iter()
            .map(|(node, region)| row_logs(store, *node, region, dead)),
    )
    .await;
    let mut out: FoundLogs = BTreeMap::new();
    for ((node, _), logs) in rows.iter().zip(found) {
        for (log, at) in logs? {
            let commit = log.commit;
            let e = out.entry(log.id).or_insert_with(|| (log, Vec::new()));
            // A Lotus commit word set on any copy counts (copies differ while C3 runs).
            e.0.commit = e.0.commit.max(commit);
            e.1.push((*node, at));
        }
    }
    Ok(out)
}

/// The valid logs of `dead` in its row of `region` on memory node `node`, with their
/// slots: the row READ whole (in [`CHUNK_BYTES`] READs).
async fn row_logs(
    store: &CvtRemote,
    node: NodeId,
    region: &LogExport,
    dead: Owner,
) -> Result<Vec<(CommitLog, RemoteAddr)>, TxnError> {
    let g = region.geometry;
    let (row, len) = g.row(dead.node);
    let bytes = read_range(store, node, region.region.at(row), len as usize).await?;
    Ok(bytes
        .chunks_exact(g.slot_bytes as usize)
        .enumerate()
        .filter_map(|(i, slot)| {
            let log = CommitLog::decode(slot).filter(|l| dead.owns(l.id))?;
            Some((
                log,
                region.region.at(row + (i as u64) * u64::from(g.slot_bytes)),
            ))
        })
        .collect())
}

/// READ `len` bytes at `at` in chunks, [`CHUNKS_IN_FLIGHT`] at a time.
async fn read_range(
    store: &CvtRemote,
    node: NodeId,
    at: RemoteAddr,
    len: usize,
) -> Result<Vec<u8>, TxnError> {
    let mut out = Vec::with_capacity(len);
    read_chunks(store, node, at, len, CHUNK_BYTES, |_, b| {
        out.extend_from_slice(b)
    })
    .await?;
    Ok(out)
}

/// READ `len` bytes at `at` in READs of `per_read` bytes, [`CHUNKS_IN_FLIGHT`] at a
/// time, handing each to `f` with its offset as it arrives, in order.
async fn read_chunks(
    store: &CvtRemote,
    node: NodeId,
    at: RemoteAddr,
    len: usize,
    per_read: usize,
    mut f: impl FnMut(usize, &[u8]),
) -> Result<(), TxnError> {
    let starts: Vec<usize> = (0..len).step_by(per_read.max(1)).collect();
    for group in starts.chunks(CHUNKS_IN_FLIGHT) {
        let got = join_all(group.iter().map(|&s| {
            let n = per_read.min(len - s);
            store.ctx().read(node, at.offset(s as u64), n)
        }))
        .await;
        for (&s, g) in group.iter().zip(got) {
            f(s, &g?);
        }
    }
    Ok(())
}

/// Every copy of the CVT named by a log entry, primary first: its memory node,
/// remote address and current content.
async fn read_entry(
    store: &CvtRemote,
    e: &LogEntry,
) -> Result<Vec<(NodeId, RemoteAddr, Cvt)>, TxnError> {
    let part = u32::from(e.part);
    let tables = store.part_tables(part)?;
    let t = tables.get(usize::from(e.table)).ok_or_else(|| {
        TxnError::Export(format!("a log names table {} of partition {part}", e.table))
    })?;
    let copies = store.index_copies(part, u32::from(e.table), e.addr)?;
    let read = join_all(copies.iter().map(|&(node, at)| async move {
        let img = store.ctx().read(node, at, t.cvt_bytes()).await?;
        let cvt =
            Cvt::decode(&img).map_err(|err| TxnError::Export(format!("a logged CVT: {err}")))?;
        Ok::<_, TxnError>((node, at, cvt))
    }))
    .await;
    read.into_iter().collect()
}

/// Decide `log` and undo it if it does not stand; returns whether it rolled forward.
/// With replication, a log stands only if every copy of every logged object holds its
/// version (the dead node released nothing before every copy ACKed), and a roll-back
/// invalidates the victim cell on every copy.
async fn settle(store: &CvtRemote, log: &CommitLog) -> Result<bool, TxnError> {
    let seen = join_all(log.entries.iter().map(|e| read_entry(store, e))).await;
    let mut cvts = Vec::with_capacity(seen.len());
    for s in seen {
        cvts.push(s?);
    }
    if log
        .entries
        .iter()
        .any(|e| crate::cvt::is_invisible(tso::Timestamp(e.version)))
    {
        return settle_lotus(store, log, &cvts).await;
    }
    let landed = |(e, copies): (&LogEntry, &Vec<(NodeId, RemoteAddr, Cvt)>)| {
        copies
            .iter()
            .all(|(_, _, cvt)| cvt.newest_version().get() >= e.version)
    };
    #[allow(unused_mut)]
    let mut forward = log.entries.iter().zip(&cvts).all(landed);
    #[cfg(feature = "fault-injection")]
    match crate::fault::planted_recovery_bug() {
        Some(crate::fault::RecoveryBug::NoRollBack) => forward = true,
        Some(crate::fault::RecoveryBug::RollBackUnlessAllLanded) => {
            forward = log.entries.iter().zip(&cvts).all(|(e, copies)| {
                copies[0]
                    .2
                    .cells
                    .get(usize::from(e.cell))
                    .is_some_and(|c| c.valid && c.version.get() == e.version)
            })
        }
        _ => {}
    }
    if forward {
        return Ok(true);
    }
    // Roll back: every victim cell invalid on every copy (its CV bumped, so that a
    // record READ against the old cell image cannot match either).
    let undo = join_all(
        log.entries
            .iter()
            .zip(&cvts)
            .flat_map(|(e, copies)| copies.iter().map(move |c| (e, c)))
            .map(|(e, (node, at, cvt))| {
                let cell_at = at.offset((HEADER_BYTES + usize::from(e.cell) * CELL_BYTES) as u64);
                let mut cell = cvt.cells.get(usize::from(e.cell)).copied();
                async move {
                    let Some(c) = cell.as_mut() else {
                        return Err(TxnError::Export(format!(
                            "a log names cell {} of a CVT of {}",
                            e.cell,
                            cvt.cells.len()
                        )));
                    };
                    c.valid = false;
                    c.cv = c.cv.wrapping_add(1);
                    Ok(store.ctx().write(*node, cell_at, &c.encode()).await?)
                }
            }),
    )
    .await;
    for u in undo {
        u?;
    }
    Ok(false)
}

/// [`settle`] for a Lotus commit (its entries name INVISIBLE versions tagged with its id;
/// [`crate::lotus`]): only cells still carrying that tag are touched, so that a log of a
/// commit that finished (whose cells later writers may since have reused) changes
/// nothing. With the commit word set on some copy of the log, the write-visible step had
/// begun, so `T_commit` was taken after every data WRITE landed: **roll forward**, the
/// word WRITten into every tagged cell on every copy. Without it no cell was published
/// anywhere (each memory node gets the word ahead of its cells, on one QP): **roll
/// back**, every tagged cell invalidated (its CV bumped). Either way, a re-run finds the
/// same answer (the tags left are the same, or gone).
async fn settle_lotus(
    store: &CvtRemote,
    log: &CommitLog,
    cvts: &[Vec<(NodeId, RemoteAddr, Cvt)>],
) -> Result<bool, TxnError> {
    #[allow(unused_mut)]
    let mut forward = log.commit != 0;
    #[cfg(feature = "fault-injection")]
    match crate::fault::planted_recovery_bug() {
        Some(crate::fault::RecoveryBug::NoRollBack) => forward = true,
        Some(crate::fault::RecoveryBug::RollBackUnlessAllLanded) => forward = false,
        _ => {}
    }
    let work = join_all(
        log.entries
            .iter()
            .zip(cvts)
            .flat_map(|(e, copies)| copies.iter().map(move |c| (e, c)))
            .filter_map(|(e, (node, at, cvt))| {
                let i = usize::from(e.cell);
                let c = cvt.cells.get(i).copied()?;
                (c.valid && c.version.get() == e.version).then_some((*node, *at, i, c))
            })
            .map(|(node, at, i, mut c)| async move {
                let cell_at = at.offset((HEADER_BYTES + i * CELL_BYTES) as u64);
                if forward {
                    let word = log.commit.to_le_bytes();
                    let v = cell_at.offset(crate::cvt::CELL_VERSION_OFFSET as u64);
                    return Ok::<_, TxnError>(store.ctx().write(node, v, &word).await?);
                }
                c.valid = false;
                c.cv = c.cv.wrapping_add(1);
                Ok(store.ctx().write(node, cell_at, &c.encode()).await?)
            }),
    )
    .await;
    for w in work {
        w?;
    }
    Ok(forward)
}

/// Release every logged lock word still holding the log's id (CAS to 0; with FORD's
/// invisible mark too, and the backups' marks cleared); returns how many held it.
async fn unlock_logged(store: &CvtRemote, log: &CommitLog) -> Result<usize, TxnError> {
    let mut locs = Vec::with_capacity(log.entries.len());
    for e in &log.entries {
        locs.push(crate::cvt_remote::CvtLoc {
            part: u32::from(e.part),
            table: u32::from(e.table),
            addr: e.addr,
        });
    }
    locs.sort_unstable_by_key(|l| (l.part, l.addr));
    locs.dedup();
    let targets = crate::ford::lock_copies(store, &locs)?;
    let id = log.id;
    let done = join_all(targets.iter().map(|&(primary, n, at)| async move {
        if primary {
            crate::ford::release_word(store.ctx(), n, at, id).await
        } else {
            // A backup's word holds at most FORD's mark of this commit.
            store
                .ctx()
                .cas(n, at, crate::ford::INVISIBLE, 0)
                .await
                .map(|_| false)
                .map_err(TxnError::from)
        }
    }))
    .await;
    let mut n = 0;
    for d in done {
        n += usize::from(d?);
    }
    Ok(n)
}

/// Step 2: release every lock word and guard `dead` still holds, free its claims.
/// What the sweep's scan found held by the dead incarnation on one table of one
/// memory node: CVT lock words (address, word), slots it claimed (the CVT's address, claim
/// word), insert guards.
struct Held {
    node: NodeId,
    part: u32,
    table: u32,
    locks: Vec<(RemoteAddr, u64)>,
    claims: Vec<(RemoteAddr, u64)>,
    guards: Vec<(RemoteAddr, u64)>,
}

/// Step 2's READs: every table's index and guards, scanned chunk by chunk as they
/// arrive ([`CHUNKS_IN_FLIGHT`] READs of about [`CHUNK_BYTES`] each, whole CVTs per
/// READ), for words holding an id of `dead`: lock words, claims (a slot's state word
/// holds its inserter's id, [`crate::cvt::claim_word`]) and guards. With
/// [`SweepScope::Guards`], the indexes are not READ; a claim can then only be an insert's
/// that died holding its guard, and is sought bucket by bucket from the guard's home
/// bucket ([`seek_claims`]).
async fn scan(store: &CvtRemote, dead: Owner, scope: SweepScope) -> Result<Vec<Held>, TxnError> {
    let word = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
    let mut out = Vec::new();
    for p in 0..store.partitions() {
        let node = store.primary_node(p)?;
        for t in store.part_tables(p)?.iter() {
            let mut held = Held {
                node,
                part: p,
                table: t.id,
                locks: Vec::new(),
                claims: Vec::new(),
                guards: Vec::new(),
            };
            if scope == SweepScope::All {
                let cvt = t.cvt_bytes();
                let slots = t.n_buckets as usize * crate::cvt_index::CVTS_PER_BUCKET;
                // Whole CVTs per READ.
                let per_read = (CHUNK_BYTES / cvt).max(1) * cvt;
                read_chunks(store, node, t.index.at(0), slots * cvt, per_read, |s, b| {
                    for (i, c) in b.chunks_exact(cvt).enumerate() {
                        let at = t.index.at((s + i * cvt) as u64);
                        let lock = word(c, LOCK_OFFSET);
                        if dead.owns(lock) {
                            held.locks.push((at.offset(LOCK_OFFSET as u64), lock));
                        }
                        let state = word(c, STATE_OFFSET);
                        if claimer(state).is_some_and(|id| dead.owns(id)) {
                            held.claims.push((at, state));
                        }
                    }
                })
                .await?;
            }
            let guards = read_range(store, node, t.guards.at(0), t.n_buckets as usize * 8).await?;
            let dead_guards: Vec<(u64, u64)> = guards
                .chunks_exact(8)
                .enumerate()
                .map(|(b, g)| (b as u64, word(g, 0)))
                .filter(|&(_, g)| dead.owns(g))
                .collect();
            held.guards = dead_guards
                .iter()
                .map(|&(b, g)| (t.guard_addr(b), g))
                .collect();
            if scope == SweepScope::Guards {
                held.claims = seek_claims(store, node, t, &dead_guards).await?;
            }
            out.push(held);
        }
    }
    Ok(out)
}

/// The claims of the inserts that died holding the guards `dead_guards` (home bucket,
/// guard word: the inserter's id) of table `t` on `node`: each sought bucket by bucket
/// from its home ([`seek_claim`]), all guards side by side. An insert that died before
/// its claim, or after publishing, has none; the search then ends at the first bucket
/// with a never-claimed slot (usually the home bucket: one READ of a bucket).
async fn seek_claims(
    store: &CvtRemote,
    node: NodeId,
    t: &crate::cvt_store::CvtTableExport,
    dead_guards: &[(u64, u64)],
) -> Result<Vec<(RemoteAddr, u64)>, TxnError> {
    let found = join_all(dead_guards.iter().map(|&(home, guard)| async move {
        let want = claim_word(guard);
        for probe in 0..t.n_buckets {
            let b = home + probe;
            let img = store
                .ctx()
                .read(node, t.bucket_addr(b), t.bucket_bytes())
                .await?;
            match seek_claim(&img, t.versions, want).map_err(|e| TxnError::Export(e.to_string()))? {
                ClaimSeek::At { slot } => return Ok(Some((t.cvt_addr(b, slot), want))),
                ClaimSeek::Stop => return Ok(None),
                ClaimSeek::Next => {}
            }
        }
        Ok::<_, TxnError>(None)
    }))
    .await;
    let mut out = Vec::new();
    for f in found {
        out.extend(f?);
    }
    Ok(out)
}

/// CAS each `(address, word)` from `word` to 0, all at once; returns how many still
/// held their word (and are free now).
async fn clear_words(
    store: &CvtRemote,
    node: NodeId,
    words: &[(RemoteAddr, u64)],
) -> Result<usize, TxnError> {
    let released = join_all(words.iter().map(|&(at, w)| store.ctx().cas(node, at, w, 0))).await;
    let mut n = 0;
    for (r, &(_, w)) in released.into_iter().zip(words) {
        n += usize::from(r? == w);
    }
    Ok(n)
}

/// Step 2's CASes, after step 1: each claimed slot freed, then each lock word and
/// insert guard the scan found released if it still holds the dead id.
async fn release_swept(
    store: &CvtRemote,
    scanned: &[Held],
    rep: &mut RecoveryReport,
) -> Result<(), TxnError> {
    for h in scanned {
        let node = h.node;
        // A claimed slot is freed first, while the guard of its bucket is still held
        // (a re-run, if this recoverer dies, finds the claim from the guard again), on
        // the backups (which the inserter may have written before it died) and then
        // on the primary (`CvtRemote::free_claim`).
        let freed = join_all(
            h.claims
                .iter()
                .map(|&(at, claim)| store.free_claim(h.part, h.table, at.addr, claim)),
        )
        .await;
        for f in freed {
            rep.claims += usize::from(f?);
        }
        rep.lock_words += clear_words(store, node, &h.locks).await?;
        rep.guards += clear_words(store, node, &h.guards).await?;
    }
    Ok(())
}

/// The owner of transaction id `id` (`None` for 0).
pub fn owner_of(id: u64) -> Option<Owner> {
    TxnId::unpack(id).map(|t| t.owner)
}
