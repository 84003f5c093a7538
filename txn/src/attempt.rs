//! The state of one transaction attempt that every protocol shares: its read/write set
//! ([`Obj`]: the object's CVT, the version and value read, the write buffered, whether
//! the attempt holds the CVT's lock word), its id and timestamp, and the operations on
//! that state that do not depend on the protocol (reading an object's newest version,
//! installing the writes, releasing CVT lock words, recording the committed
//! transaction). Each protocol keeps its own per-attempt state (`S`) and per-object state
//! (`O`) beside it; no protocol sees another's.

use rrpc::fabric::RemoteAddr;
use rrpc::runtime::{join_all, OneSidedError};
use rrpc::NodeId;
use tso::Timestamp;

use crate::client_core::ClientCore;
use crate::commit_log::{CommitLog, LogEntry};
use crate::cvt::Cvt;
use crate::cvt_remote::{CvtLoc, OwnedWrite};
use crate::error::{AbortReason, TxnError};
use crate::history::Access;
use crate::phase::{Phase, PhaseClock};

#[cfg(feature = "fault-injection")]
pub(crate) use crate::fault::{crash_armed, crash_point, CrashPoint};

/// Without fault injection, crash points compile to nothing.
#[cfg(not(feature = "fault-injection"))]
#[derive(Clone, Copy)]
#[allow(dead_code, clippy::enum_variant_names)]
pub(crate) enum CrashPoint {
    AfterLock,
    AfterLog,
    AfterFirstInstall,
    AfterInstalls,
    AfterFirstPublish,
    AfterFirstUnlock,
}

#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub(crate) async fn crash_point(_p: CrashPoint) {}

#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub(crate) fn crash_armed(_p: CrashPoint) -> bool {
    false
}

/// What a transaction does to an object at commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Write {
    /// Install this value (an update, or an insert of an absent key).
    Put(Vec<u8>),
    /// Install a tombstone.
    Delete,
}

/// An object a transaction read, with the protocol's own state of it (`O`).
pub(crate) struct Obj<O> {
    pub table: u32,
    pub key: u64,
    /// Its CVT, `None` when the table has none for the key (never inserted).
    pub loc: Option<CvtLoc>,
    /// The CVT as last read (under the lock when `locked`).
    pub cvt: Option<Cvt>,
    /// Version read: the visible version's timestamp, the tombstone's, or
    /// [`Timestamp::ZERO`] when no version was visible.
    pub version: Timestamp,
    /// Value read; `None` when absent (no version, or a tombstone).
    pub value: Option<Vec<u8>>,
    pub write: Option<Write>,
    /// This attempt holds the CVT's lock word (it wrote its id there): released on every
    /// path, by [`Attempt::release_cvt_locks`] or, when the attempt is dropped, in the
    /// background.
    pub locked: bool,
    /// Read for update (the transaction declared it will write the object).
    pub for_update: bool,
    /// The protocol's state of this object.
    pub cc: O,
}

impl<O: Default> Obj<O> {
    /// An object not read yet (or absent).
    pub fn absent(table: u32, key: u64) -> Self {
        Self {
            table,
            key,
            loc: None,
            cvt: None,
            version: Timestamp::ZERO,
            value: None,
            write: None,
            locked: false,
            for_update: false,
            cc: O::default(),
        }
    }

    /// READ `(table, key)`'s CVT and its newest version (the single-version protocols:
    /// OCC-CAS, Scythe). With `check_lock`, a held CVT lock word aborts at once
    /// ([`AbortReason::LockedOnRead`]).
    ///
    /// Errors: [`TxnError::Abort`] (locked, torn), service failures.
    pub async fn read_newest(
        core: &ClientCore,
        table: u32,
        key: u64,
        check_lock: bool,
    ) -> Result<Self, TxnError> {
        let Some((loc, mut cvt)) = core.store.lookup(table, key).await? else {
            return Ok(Self::absent(table, key));
        };
        // FORD's invisible items (occ-cas over replicas, `crate::ford`): the holder is
        // installing; READ again until it made them visible (for up to `read_wait`).
        let t0 = std::time::Instant::now();
        while check_lock
            && cvt.header.lock & crate::ford::INVISIBLE != 0
            && t0.elapsed() < core.cfg.read_wait
        {
            core.store.ctx().yield_now().await;
            cvt = core.store.read_cvt(loc).await?;
        }
        if check_lock && cvt.header.lock != 0 {
            return Err(TxnError::Abort(AbortReason::LockedOnRead));
        }
        let mut o = Self::absent(table, key);
        let newest = cvt.newest();
        o.fill(core, loc, cvt, newest).await?;
        Ok(o)
    }
}

impl<O: Default> Obj<O> {
    /// FORD's backup-enabled read ([`crate::ford`]): READ `(table, key)`'s CVT and its
    /// newest version from one of its partition's backups (the `pick`-th, see
    /// [`crate::cvt_remote::CvtRemote::pick_backup`]), waiting while the copy is
    /// INVISIBLE as [`Self::read_newest`] does. Returns the object and the backup's
    /// memory-node index, or `None` when the key's CVT address is not cached, the
    /// partition has no backup, or the copy there is not the key's (the caller then
    /// reads the primary, which also caches the address).
    ///
    /// Errors: [`AbortReason::LockedOnRead`] (still invisible), as [`Self::read_newest`].
    pub async fn read_newest_on_backup(
        core: &ClientCore,
        table: u32,
        key: u64,
        pick: u64,
    ) -> Result<Option<(Self, u32)>, TxnError> {
        let store = &core.store;
        let Some(loc) = store.cached(table, key) else {
            return Ok(None);
        };
        let Some(m) = store.pick_backup(loc.part, pick) else {
            return Ok(None);
        };
        let mut cvt = store.read_cvt_on(loc, m).await?;
        let is_key = |c: &Cvt| {
            c.header.state == crate::cvt::SLOT_IN_USE
                && (c.header.table, c.header.key) == (table, key)
        };
        if !is_key(&cvt) {
            return Ok(None);
        }
        let t0 = std::time::Instant::now();
        while cvt.header.lock & crate::ford::INVISIBLE != 0 && t0.elapsed() < core.cfg.read_wait {
            store.ctx().yield_now().await;
            cvt = store.read_cvt_on(loc, m).await?;
        }
        if cvt.header.lock != 0 {
            return Err(TxnError::Abort(AbortReason::LockedOnRead));
        }
        let mut o = Self::absent(table, key);
        o.loc = Some(loc);
        if let Some(i) = cvt.newest() {
            let cell = cvt.cells[i];
            o.version = cell.version;
            if !cell.deleted {
                match store.read_version_on(loc, m, &cell).await? {
                    Ok(v) => o.value = Some(v),
                    Err(_) => return Err(TxnError::Abort(AbortReason::TornRead)),
                }
            }
        }
        o.cvt = Some(cvt);
        Ok(Some((o, m)))
    }
}

impl<O> Obj<O> {
    /// Fill this object from its CVT at `loc` as read (`cvt`) and the version in `cell`
    /// (`None`: no version visible): the version, and the value READ from its record
    /// (none for a tombstone). Errors: [`AbortReason::TornRead`] when the record does not
    /// match its cell; service failures.
    pub async fn fill(
        &mut self,
        core: &ClientCore,
        loc: CvtLoc,
        cvt: Cvt,
        cell: Option<usize>,
    ) -> Result<(), TxnError> {
        self.loc = Some(loc);
        if let Some(i) = cell {
            let cell = cvt.cells[i];
            self.version = cell.version;
            if !cell.deleted {
                match core.store.read_version(loc, &cell).await? {
                    Ok(v) => self.value = Some(v),
                    Err(_) => return Err(TxnError::Abort(AbortReason::TornRead)),
                }
            }
        }
        self.cvt = Some(cvt);
        Ok(())
    }

    /// What an install of this written object needs: its CVT's location, the CVT as
    /// read under its lock (updated by the install), and the new value (`None`: a
    /// delete). Panics if the object has no CVT yet, which a written object always has
    /// by the write-back.
    pub fn install_parts(&mut self) -> (CvtLoc, &mut Cvt, Option<&[u8]>) {
        let loc = self.loc.expect("a written object has a CVT by now");
        let value = match &self.write {
            Some(Write::Put(v)) => Some(v.as_slice()),
            _ => None,
        };
        let cvt = self.cvt.as_mut().expect("a written object's CVT was read");
        (loc, cvt, value)
    }

    /// Value as this transaction sees it (its own write first).
    pub fn seen_value(&self) -> Option<Vec<u8>> {
        match &self.write {
            Some(Write::Put(v)) => Some(v.clone()),
            Some(Write::Delete) => None,
            None => self.value.clone(),
        }
    }
}

/// One attempt of a transaction: the shared part, with the protocol's per-attempt state
/// `S` and per-object state `O`.
pub(crate) struct Attempt<'a, S, O> {
    pub core: &'a ClientCore,
    /// The workload's transaction type (recorded with the history).
    pub kind: u16,
    /// This attempt's id ([`ClientCore::next_id`]): never 0.
    pub id: u64,
    /// Its timestamp once taken (MVCC's start timestamp, Scythe's queue-order token).
    pub start: Option<Timestamp>,
    pub objs: Vec<Obj<O>>,
    /// The protocol's state of this attempt.
    pub cc: S,
    /// The attempt committed (set by the commit before the release).
    pub committed: bool,
    /// The transaction declared itself read-only
    /// ([`crate::coordinator::Txn::declare_read_only`]).
    pub read_only: bool,
    /// The application's note in the commit log ([`crate::coordinator::Txn::set_log_note`]).
    pub note: i64,
    /// The commit-log slot this attempt writes its log to, once it logged (held until
    /// the attempt ends, so no other attempt overwrites the log before its unlocks).
    log_slot: std::cell::Cell<Option<u16>>,
    /// Where the attempt's time went (with [`crate::config::TxnConfig::record_phases`]).
    clock: Option<PhaseClock>,
    /// Counted by the view feed's drain barrier until the attempt ends
    /// ([`crate::view::ViewFeed::enter`]). Declared last: dropped after the release
    /// the attempt's own drop spawns.
    _active: Option<crate::view::ActiveGuard>,
}

impl<'a, S: Default, O> Attempt<'a, S, O> {
    /// A new attempt of type `kind`; takes no round trip.
    pub fn new(core: &'a ClientCore, kind: u16) -> Self {
        Self {
            core,
            kind,
            id: core.next_id(),
            start: None,
            objs: Vec::new(),
            cc: S::default(),
            committed: false,
            read_only: false,
            note: 0,
            log_slot: std::cell::Cell::new(None),
            clock: core
                .cfg
                .record_phases
                .then(|| PhaseClock::new(std::time::Instant::now())),
            _active: core.store.feed().map(crate::view::ViewFeed::enter),
        }
    }
}

impl<S, O> Attempt<'_, S, O> {
    /// Enter phase `p` (when phases are measured); returns the phase left, so that a
    /// nested phase can go back to it.
    pub fn enter(&mut self, p: Phase) -> Phase {
        match &mut self.clock {
            Some(c) => c.enter(p, std::time::Instant::now()),
            None => Phase::Execute,
        }
    }

    /// Index of `(table, key)` in the read set.
    pub fn find(&self, table: u32, key: u64) -> Option<usize> {
        self.objs
            .iter()
            .position(|o| o.table == table && o.key == key)
    }

    /// The attempt's timestamp, taken now through the thread's TSO group if it has none.
    ///
    /// Errors: [`TxnError::Tso`].
    pub async fn timestamp(&mut self) -> Result<Timestamp, TxnError> {
        if let Some(ts) = self.start {
            return Ok(ts);
        }
        let prev = self.enter(Phase::Timestamp);
        let ts = self.core.timestamp().await;
        self.enter(prev);
        Ok(*self.start.insert(ts?))
    }

    /// Release every CVT lock word the attempt holds, in one round (CAS from the
    /// attempt's id to 0: a word that no longer holds the id, released by recovery
    /// that presumed this node dead, is left alone).
    ///
    /// Errors: the first failed CAS (the others were still issued).
    pub async fn release_cvt_locks(&mut self) -> Result<(), TxnError> {
        let locs = self.take_locked();
        let (store, id, committed) = (&self.core.store, self.id, self.committed);
        let mut first = true;
        // The crash point between the first unlock and the others (tests of recovery's
        // roll-forward rule); armed, the others wait for the first to pass it.
        let gate = std::cell::Cell::new(!committed || !crash_armed(CrashPoint::AfterFirstUnlock));
        let gate = &gate;
        let done = join_all(locs.iter().map(|&l| {
            let crash = std::mem::take(&mut first) && committed;
            async move {
                while !crash && !gate.get() {
                    store.ctx().yield_now().await;
                }
                let r = store.unlock(l, id).await;
                if crash {
                    crash_point(CrashPoint::AfterFirstUnlock).await;
                    gate.set(true);
                }
                r
            }
        }))
        .await;
        done.into_iter().try_for_each(|r| r.map(drop))
    }

    /// The log slot of this attempt (taken now if it has none; held until the attempt
    /// ends): its commit log's and, over replicas under occ-cas, its undo log's.
    pub fn log_slot_no(&self) -> u16 {
        match self.log_slot.get() {
            Some(s) => s,
            None => {
                let s = self.core.take_log_slot();
                self.log_slot.set(Some(s));
                s
            }
        }
    }

    /// Release every CVT lock word the attempt holds on every copy ([`crate::ford`]'s
    /// visible-and-unlock round), in one round.
    ///
    /// Errors: the first that failed (every release is still issued).
    pub async fn release_invisible(&mut self) -> Result<(), TxnError> {
        let locs = self.take_locked();
        crate::ford::release(&self.core.store, &locs, self.id).await
    }

    /// The CVTs whose lock words the attempt holds, each marked released (the caller
    /// releases them).
    fn take_locked(&mut self) -> Vec<CvtLoc> {
        self.objs
            .iter_mut()
            .filter(|o| o.locked)
            .map(|o| {
                o.locked = false;
                o.loc.expect("a locked object has a CVT")
            })
            .collect()
    }

    /// Send install lists (`(primary?, memory node, ordered WRITEs)`): all in one round
    /// (Motor's and FORD's one-round commit) or, with
    /// [`crate::config::ReplicaCommit::Separate`], the backups' round and then the
    /// primaries' (FaRMv2's two commit rounds). Each list is one ordered WR list on
    /// one QP.
    ///
    /// Errors: the first WRITE that failed.
    async fn send_installs(
        &self,
        lists: &[(bool, NodeId, Vec<OwnedWrite>)],
    ) -> Result<(), TxnError> {
        let ctx = self.core.store.ctx();
        let send = |primaries: Option<bool>| {
            join_all(
                lists
                    .iter()
                    .filter(move |(p, _, _)| primaries.is_none_or(|want| *p == want))
                    .map(|(_, n, l)| async move {
                        let writes: Vec<(RemoteAddr, &[u8])> =
                            l.iter().map(|(a, d)| (*a, d.as_slice())).collect();
                        (*n, crate::transient::write_ordered(ctx, *n, &writes).await)
                    }),
            )
        };
        let rounds: &[Option<bool>] = match self.core.cfg.replica_commit {
            crate::config::ReplicaCommit::Coalesced => &[None],
            crate::config::ReplicaCommit::Separate => &[Some(false), Some(true)],
        };
        for &r in rounds {
            // A dead memory node's copies are written off (the live ones carry on).
            self.core.store.tolerate(send(r).await).await?;
        }
        Ok(())
    }

    /// FORD's coalescent commit ([`crate::ford`]): the commit log first when logging
    /// (the round before), then per object and copy the lock word marked invisible,
    /// the record and the cell as one ordered list, all copies in one round (or the
    /// backups' round and then the primaries' with
    /// [`crate::config::ReplicaCommit::Separate`]). The caller releases with
    /// [`Self::release_invisible`].
    ///
    /// Errors: [`TxnError::WriteBack`].
    pub async fn write_back_invisible(
        &mut self,
        version: impl Fn(&Obj<O>) -> Timestamp,
    ) -> Result<(), TxnError> {
        let wb = |e: TxnError| TxnError::WriteBack {
            cause: Box::new(e),
            release: None,
        };
        crash_point(CrashPoint::AfterLock).await;
        let victims = self.write_log(&version).await.map_err(wb)?;
        crash_point(CrashPoint::AfterLog).await;
        let (store, id) = (&self.core.store, self.id);
        let mut lists = Vec::new();
        // Lists of the first object (all its copies).
        let mut first = 0;
        let written = self.objs.iter_mut().filter(|o| o.write.is_some());
        for (o, victim) in written.zip(victims) {
            let v = version(o);
            let (loc, cvt, value) = o.install_parts();
            lists.extend(
                crate::ford::invisible_install(store, loc, cvt, victim, v, value, id)
                    .map_err(wb)?,
            );
            if first == 0 {
                first = lists.len();
            }
        }
        // With the crash point after the first install armed, the first object's
        // copies go first, so that "some but not all installs landed" happens.
        let r = if crash_armed(CrashPoint::AfterFirstInstall) {
            let r = self.send_installs(&lists[..first]).await;
            crash_point(CrashPoint::AfterFirstInstall).await;
            match r {
                Ok(()) => self.send_installs(&lists[first..]).await,
                e => e,
            }
        } else {
            self.send_installs(&lists).await
        };
        crash_point(CrashPoint::AfterInstalls).await;
        r.map_err(wb)
    }

    /// Write this commit's log ([`crate::commit_log`]) to every memory node it installs
    /// on, naming each write's CVT, victim cell and new version; returns the victims in
    /// write order. Done before any install, one round earlier (with commit logs off,
    /// only the victims are chosen).
    ///
    /// Errors: [`TxnError::Usage`] for more writes than a log slot holds;
    /// [`TxnError::Rpc`].
    async fn write_log(
        &self,
        version: &impl Fn(&Obj<O>) -> Timestamp,
    ) -> Result<Vec<usize>, TxnError> {
        let (victims, log) = self.log_plan(version)?;
        if let Some((bytes, targets)) = log {
            let (store, bytes) = (&self.core.store, &bytes);
            let ctx = store.ctx();
            let wrote = join_all(targets.iter().map(|&(n, at)| async move {
                (n, crate::transient::write(ctx, n, at, bytes).await)
            }))
            .await;
            // A copy on a memory node that died (being failed over) is lost with it;
            // the live copies carry the log.
            store.tolerate(wrote).await?;
        }
        Ok(victims)
    }

    /// The victims of this commit's writes, in write order, and with commit logs on
    /// the encoded log and the log slot on every memory node it installs on (nothing
    /// is sent).
    ///
    /// Errors: [`TxnError::Usage`] for more writes than a log slot holds, or more
    /// coordinators in flight than a memory node keeps slots for;
    /// [`TxnError::Export`] for a memory node without a log region.
    #[allow(clippy::type_complexity)]
    fn log_plan(
        &self,
        version: &impl Fn(&Obj<O>) -> Timestamp,
    ) -> Result<(Vec<usize>, Option<(Vec<u8>, Vec<(NodeId, RemoteAddr)>)>), TxnError> {
        let written = self.objs.iter().filter(|o| o.write.is_some());
        let victims: Vec<usize> = written
            .clone()
            .map(|o| {
                o.cvt
                    .as_ref()
                    .expect("a written object's CVT was read")
                    .victim()
            })
            .collect();
        if !self.core.cfg.commit_log {
            return Ok((victims, None));
        }
        let entries: Vec<LogEntry> = written
            .zip(&victims)
            .map(|(o, &cell)| {
                let loc = o.loc.expect("a written object has a CVT by now");
                LogEntry {
                    part: loc.part as u16,
                    table: loc.table as u16,
                    cell: cell as u16,
                    addr: loc.addr,
                    version: version(o).get(),
                }
            })
            .collect();
        let store = &self.core.store;
        // A copy of the log on every memory node that gets installs: each copy of each
        // partition written.
        let mut parts: Vec<u32> = entries
            .iter()
            .flat_map(|e| store.replica_memnodes(u32::from(e.part)))
            .collect();
        parts.sort_unstable();
        parts.dedup();
        let log = CommitLog {
            id: self.id,
            note: self.note,
            entries,
            commit: 0,
        };
        let owner = self.core.owner();
        let slot_no = self.log_slot_no();
        let mut targets = Vec::with_capacity(parts.len());
        let mut max = usize::MAX;
        for &p in &parts {
            let region = store
                .log(p)
                .ok_or_else(|| TxnError::Export(format!("memory node {p} keeps no log")))?;
            let slot = region.slot(owner.node, slot_no).ok_or_else(|| {
                TxnError::Usage(format!(
                    "commit log: more coordinators in flight on {owner} than the {} log slots \
                     memory node {p} keeps per node (memnode --log-clients)",
                    region.geometry.clients
                ))
            })?;
            max = max.min(region.geometry.max_entries());
            targets.push((store.memnode(p)?, slot));
        }
        let bytes = log
            .encode(if targets.is_empty() { 0 } else { max })
            .map_err(TxnError::Usage)?;
        Ok((victims, Some((bytes, targets))))
    }

    /// Where this commit's log copies keep their commit word
    /// ([`crate::commit_log::CommitLog::commit`]): per memory node the log went to, the
    /// word's address; empty with commit logs off. Call after the log was written.
    ///
    /// Errors: [`TxnError::Export`] for a memory node without a log region,
    /// [`TxnError::Usage`] when the client has no log slot there.
    pub fn commit_word_targets(&self) -> Result<Vec<(NodeId, RemoteAddr)>, TxnError> {
        if !self.core.cfg.commit_log {
            return Ok(Vec::new());
        }
        let store = &self.core.store;
        let written: Vec<&Obj<O>> = self.objs.iter().filter(|o| o.write.is_some()).collect();
        // The same memory nodes as the log's (`log_plan`).
        let mut parts: Vec<u32> = written
            .iter()
            .filter_map(|o| o.loc)
            .flat_map(|l| store.replica_memnodes(l.part))
            .collect();
        parts.sort_unstable();
        parts.dedup();
        let (owner, slot_no) = (self.core.owner(), self.log_slot_no());
        let at = CommitLog::commit_word_offset(written.len()) as u64;
        parts
            .into_iter()
            .map(|p| {
                let region = store
                    .log(p)
                    .ok_or_else(|| TxnError::Export(format!("memory node {p} keeps no log")))?;
                let slot = region.slot(owner.node, slot_no).ok_or_else(|| {
                    TxnError::Usage(format!("commit log: no slot on memory node {p}"))
                })?;
                Ok((store.memnode(p)?, slot.offset(at)))
            })
            .collect()
    }

    /// The log and the installs in one round
    /// ([`crate::config::LogPlacement::Ordered`]): per memory
    /// node one ordered WR list, its log WRITE first, then its records and cells. A
    /// list too long for one post goes as the log's round, then the installs'.
    ///
    /// Errors: as [`Self::write_log`] and [`crate::cvt_remote::CvtRemote::install_in`].
    async fn write_ordered_back(
        &mut self,
        version: &impl Fn(&Obj<O>) -> Timestamp,
    ) -> Result<(), TxnError> {
        let (victims, log) = self.log_plan(version)?;
        let Some((bytes, targets)) = log else {
            unreachable!("ordered placement only with commit logs on")
        };
        let store = &self.core.store;
        // Per node: its log slot, then its installs' WRITEs in write order.
        let mut lists: Vec<(NodeId, Vec<OwnedWrite>)> = targets
            .iter()
            .map(|&(n, at)| (n, vec![(at, bytes.clone())]))
            .collect();
        let written = self.objs.iter_mut().filter(|o| o.write.is_some());
        for (o, victim) in written.zip(victims) {
            let v = version(o);
            let (loc, cvt, value) = o.install_parts();
            for (node, ws) in store.install_writes(loc, cvt, victim, v, value)? {
                let list = match lists.iter_mut().find(|(n, _)| *n == node) {
                    Some((_, l)) => l,
                    None => unreachable!("the log goes to every memory node installed on"),
                };
                list.extend(ws);
            }
        }
        let ctx = store.ctx();
        let sent = join_all(lists.iter().map(|(n, l)| async move {
            let writes: Vec<(RemoteAddr, &[u8])> =
                l.iter().map(|(a, d)| (*a, d.as_slice())).collect();
            let r = match crate::transient::write_ordered(ctx, *n, &writes).await {
                // Nothing was sent: the log's round, then the installs'.
                Err(OneSidedError::TooLarge { .. }) => {
                    let (first, rest) = writes.split_first().expect("the log is first");
                    if let Err(e) = crate::transient::write(ctx, *n, first.0, first.1).await {
                        return (*n, Err(e));
                    }
                    let done = join_all(
                        rest.iter()
                            .map(|&(a, d)| crate::transient::write(ctx, *n, a, d)),
                    )
                    .await;
                    done.into_iter().collect::<Result<Vec<()>, _>>().map(drop)
                }
                r => r,
            };
            (*n, r)
        }))
        .await;
        store.tolerate(sent).await
    }

    /// Install each write at `version(obj)` in parallel (record, then cell). Errors:
    /// [`TxnError::WriteBack`].
    pub async fn write_back(
        &mut self,
        version: impl Fn(&Obj<O>) -> Timestamp,
    ) -> Result<(), TxnError> {
        #[cfg(feature = "fault-injection")]
        if crate::fault::failing_write_back() {
            // As the memory node's NIC would answer a WRITE to a deregistered region.
            return Err(TxnError::WriteBack {
                cause: Box::new(TxnError::Rpc(rrpc::runtime::RpcError::OneSided(
                    rrpc::runtime::OneSidedError::Completion {
                        node: rrpc::NodeId(0),
                        status: rrpc::fabric::WcStatus::RemoteAccess,
                    },
                ))),
                release: None,
            });
        }
        crash_point(CrashPoint::AfterLock).await;
        if self.core.cfg.commit_log
            && self.core.cfg.log_placement == crate::config::LogPlacement::Ordered
        {
            let r = self.write_ordered_back(&version).await;
            crash_point(CrashPoint::AfterInstalls).await;
            return r.map_err(|e| TxnError::WriteBack {
                cause: Box::new(e),
                release: None,
            });
        }
        let victims = match self.write_log(&version).await {
            Ok(v) => v,
            Err(e) => {
                return Err(TxnError::WriteBack {
                    cause: Box::new(e),
                    release: None,
                })
            }
        };
        crash_point(CrashPoint::AfterLog).await;
        if self.core.cfg.replica_commit == crate::config::ReplicaCommit::Separate {
            return self.write_back_separate(&version, victims).await;
        }
        let store = &self.core.store;
        let mut first = true;
        // With the crash point after the first install armed, the other installs wait
        // for the first to pass it (and so never start if it kills the coordinator),
        // which makes "some but not all installs landed" happen on every fabric.
        let gate = std::cell::Cell::new(!crash_armed(CrashPoint::AfterFirstInstall));
        let gate = &gate;
        let written = self.objs.iter_mut().filter(|o| o.write.is_some());
        let results = join_all(written.zip(victims).map(|(o, victim)| {
            let v = version(o);
            let crash = std::mem::take(&mut first);
            async move {
                while !crash && !gate.get() {
                    store.ctx().yield_now().await;
                }
                let (loc, cvt, value) = o.install_parts();
                let r = store.install_in(loc, cvt, victim, v, value).await;
                if crash {
                    crash_point(CrashPoint::AfterFirstInstall).await;
                    gate.set(true);
                }
                r
            }
        }))
        .await;
        crash_point(CrashPoint::AfterInstalls).await;
        match results.into_iter().find_map(Result::err) {
            Some(e) => Err(TxnError::WriteBack {
                cause: Box::new(e),
                release: None,
            }),
            None => Ok(()),
        }
    }

    /// The installs of [`Self::write_back`] in FaRMv2's two rounds: every backup copy,
    /// then every primary ([`crate::config::ReplicaCommit::Separate`]).
    async fn write_back_separate(
        &mut self,
        version: &impl Fn(&Obj<O>) -> Timestamp,
        victims: Vec<usize>,
    ) -> Result<(), TxnError> {
        let wb = |e: TxnError| TxnError::WriteBack {
            cause: Box::new(e),
            release: None,
        };
        let store = &self.core.store;
        let mut lists = Vec::new();
        let written = self.objs.iter_mut().filter(|o| o.write.is_some());
        for (o, victim) in written.zip(victims) {
            let v = version(o);
            let (loc, cvt, value) = o.install_parts();
            let copies = store
                .install_writes(loc, cvt, victim, v, value)
                .map_err(wb)?;
            let primary = store.primary_node(loc.part).map_err(wb)?;
            for (i, (n, ws)) in copies.into_iter().enumerate() {
                lists.push((i == 0 && n == primary, n, ws.to_vec()));
            }
        }
        let r = self.send_installs(&lists).await;
        crash_point(CrashPoint::AfterInstalls).await;
        r.map_err(wb)
    }

    /// Record this committed transaction: each object read at its version, each write at
    /// the version it installed: `new_version` (MVCC's commit timestamp), or for
    /// [`Timestamp::ZERO`] the version read + 1 (the single-version protocols); with
    /// `times` (start, commit) for the snapshot-isolation check.
    pub fn record(&self, times: Option<(Timestamp, Timestamp)>, new_version: Timestamp) {
        if !self.core.records() {
            return;
        }
        let mut acc = Vec::with_capacity(self.objs.len() * 2);
        for o in &self.objs {
            acc.push(Access::read(o.table, o.key, o.version.get()));
        }
        for o in self.objs.iter().filter(|o| o.write.is_some()) {
            let v = if new_version == Timestamp::ZERO {
                Timestamp(o.version.get() + 1)
            } else {
                new_version
            };
            acc.push(Access::write(o.table, o.key, v.get()));
        }
        self.core.record(self.kind, times, &acc);
    }
}

impl<S, O> Drop for Attempt<'_, S, O> {
    fn drop(&mut self) {
        if let Some(s) = self.log_slot.take() {
            self.core.put_log_slot(s);
        }
        if let Some(c) = &mut self.clock {
            let times = c.finish(std::time::Instant::now());
            self.core.put_phases(self.id, times);
        }
        // CVT lock words need a CAS, from a coroutine of their own since a drop cannot
        // wait. (The protocols' own resources, such as Scythe's tickets, release
        // themselves when dropped.)
        let targets: Vec<_> = self
            .objs
            .iter()
            .filter(|o| o.locked)
            .filter_map(|o| self.core.store.lock_target(o.loc?).ok())
            .collect();
        if targets.is_empty() {
            return;
        }
        let ctx = self.core.store.ctx().clone();
        let id = self.id;
        if self.core.store.replicas() > 1 {
            // Over replicas a word may carry FORD's invisible mark, on every copy.
            let locs: Vec<CvtLoc> = self
                .objs
                .iter()
                .filter(|o| o.locked)
                .filter_map(|o| o.loc)
                .collect();
            let targets = match crate::ford::lock_copies(&self.core.store, &locs) {
                Ok(t) => t,
                Err(e) => {
                    tracing::warn!(error = %e, "releasing a dropped transaction's CVT locks");
                    return;
                }
            };
            let c = ctx.clone();
            ctx.spawn(async move {
                if let Err(e) = crate::ford::release_at(&c, &targets, id).await {
                    tracing::warn!(error = %e, "releasing a dropped transaction's CVT locks");
                }
            });
            return;
        }
        self.core.store.ctx().spawn(async move {
            let wrote = join_all(
                targets
                    .iter()
                    .map(|&(node, at)| crate::transient::cas_owned(&ctx, node, at, id, 0)),
            )
            .await;
            for e in wrote.into_iter().filter_map(Result::err) {
                tracing::warn!(error = %e, "releasing a dropped transaction's CVT lock");
            }
        });
    }
}
