//! What every protocol of a thread's client shares: the one-sided store, timestamps
//! through the thread's TSO group, the settings, the history of committed transactions
//! and the source of transaction ids. The protocols ([`crate::occ_cas`],
//! [`crate::scythe`], [`crate::mvcc`]) sit above it; the coordinator's
//! [`crate::coordinator::TxnClient`] wraps it with the protocol it picked.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, Ordering};

use rrpc::runtime::ThreadCtx;
use tso::{ThreadTso, ThreadTsoError, Timestamp, TsoConn};

use crate::config::{ClusterAddrs, TxnConfig};
use crate::cvt_remote::CvtRemote;
use crate::error::TxnError;
use crate::history::{Access, History};
use crate::phase::PhaseTimes;
use crate::txn_id::{Owner, TxnId};

/// With commit logs on: every memory node keeps a log region with a slot for this
/// client, and every table keeps at least 2 versions (a roll-back invalidates the
/// victim cell, which with one version would be the only version).
fn check_logs(store: &CvtRemote, owner: Owner) -> Result<(), TxnError> {
    for m in 0..store.memnode_count() {
        let log = store.log(m).ok_or_else(|| {
            TxnError::Export(format!(
                "commit logs are on but memory node {m} keeps no log region"
            ))
        })?;
        if log.slot(owner.node, 0).is_none() {
            return Err(TxnError::Usage(format!(
                "commit log: memory node {m} keeps no slots for {owner}"
            )));
        }
    }
    for p in 0..store.partitions() {
        if let Some(t) = store.part_tables(p)?.iter().find(|t| t.versions < 2) {
            return Err(TxnError::Usage(format!(
                "commit logs need at least 2 versions per CVT (table {} keeps {}): a roll-back \
                 invalidates the victim cell, which with 1 version is the only one",
                t.name, t.versions
            )));
        }
    }
    Ok(())
}

/// Process-wide counter that gives each client a distinct tag in its lock words.
static CLIENT_TAGS: AtomicU32 = AtomicU32::new(1);
/// Process-wide counter of commit-log slots handed to clients (each keeps the ones it
/// took for its coroutines, free ones on a list).
static LOG_SLOTS: AtomicU32 = AtomicU32::new(0);
/// Slots of clients that were dropped, for the process's next clients.
static FREE_LOG_SLOTS: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());

/// A thread's connection to the memory nodes and the TSO, shared by its coordinators.
pub(crate) struct ClientCore {
    /// The memory nodes' CVT tables, one-sided.
    pub store: CvtRemote,
    /// The thread's TSO group over its oracle connection (Scythe 4.5 (2)).
    tso: ThreadTso<TsoConn>,
    /// The settings the client was connected with.
    pub cfg: TxnConfig,
    history: RefCell<Option<History>>,
    /// Finished attempts' phase times by attempt id, until taken (with
    /// [`TxnConfig::record_phases`]).
    phases: RefCell<Vec<(u64, PhaseTimes)>>,
    /// This client's node and incarnation, and its number within them.
    owner: Owner,
    client: u16,
    seq: Cell<u32>,
    /// Commit-log slots this client took and no attempt holds now.
    free_log_slots: RefCell<Vec<u16>>,
}

impl ClientCore {
    /// Connect this thread to the memory nodes (one-sided) and the TSO. Blocking.
    ///
    /// Errors: [`TxnError::Rpc`] when a service cannot be reached, [`TxnError::Export`]
    /// for missing or inconsistent exports, [`TxnError::Tso`].
    pub fn connect(
        ctx: Rc<ThreadCtx>,
        addrs: &ClusterAddrs,
        cfg: TxnConfig,
    ) -> Result<Self, TxnError> {
        let store = CvtRemote::connect_with(
            ctx.clone(),
            &addrs.memnodes,
            cfg.cache_entries,
            cfg.view_feed.clone(),
        )?;
        let conn = TsoConn::connect(ctx.clone(), addrs.tso, cfg.tso_reconnect)?;
        let incarnation = match cfg.incarnation {
            0 => ctx.fabric().incarnation(),
            i => i,
        };
        let owner = Owner::new(ctx.fabric().node().get(), incarnation);
        let client = (CLIENT_TAGS.fetch_add(1, Ordering::Relaxed) & 0xfff) as u16;
        if cfg.commit_log {
            check_logs(&store, owner)?;
        }
        Ok(Self {
            store,
            tso: ThreadTso::with_ranges_in_flight(conn, tso::THREAD_RANGES_IN_FLIGHT),
            history: RefCell::new(cfg.history_limit_bytes.map(History::new)),
            phases: RefCell::new(Vec::new()),
            cfg,
            owner,
            client,
            seq: Cell::new(0),
            free_log_slots: RefCell::new(Vec::new()),
        })
    }

    /// A new transaction id ([`crate::txn_id`]): unique among the attempts of every
    /// client of every incarnation of every node, never 0 (the word OCC-CAS and MVCC
    /// write into a CVT's lock word).
    pub fn next_id(&self) -> u64 {
        let seq = TxnId::next_seq(self.seq.get());
        self.seq.set(seq);
        TxnId {
            owner: self.owner,
            client: self.client,
            seq,
        }
        .pack()
    }

    /// A commit-log slot for one attempt (every attempt in flight has its own: the
    /// coroutines of a thread share the client), returned with
    /// [`Self::put_log_slot`].
    pub fn take_log_slot(&self) -> u16 {
        self.free_log_slots
            .borrow_mut()
            .pop()
            .or_else(|| {
                FREE_LOG_SLOTS
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .pop()
            })
            .unwrap_or_else(|| LOG_SLOTS.fetch_add(1, Ordering::Relaxed) as u16)
    }

    /// Give back a slot of [`Self::take_log_slot`].
    pub fn put_log_slot(&self, slot: u16) {
        self.free_log_slots.borrow_mut().push(slot);
    }

    /// This client's node and incarnation.
    pub fn owner(&self) -> Owner {
        self.owner
    }

    /// The TSO connection.
    pub fn tso_conn(&self) -> &TsoConn {
        self.tso.source()
    }

    /// One timestamp through the thread's TSO group (Scythe 4.5 (2)): concurrent
    /// requests of the thread's coroutines share one FAA.
    ///
    /// Errors: [`TxnError::Tso`] when this coroutine led its group and the oracle
    /// failed it (did not come back in time), [`TxnError::TsoGroup`] when it followed a
    /// leader that failed or was cancelled.
    pub async fn timestamp(&self) -> Result<Timestamp, TxnError> {
        self.tso
            .timestamp(self.store.ctx())
            .await
            .map_err(|e| match e {
                ThreadTsoError::Source(e) => TxnError::Tso(e),
                follower => TxnError::TsoGroup(follower),
            })
    }

    /// The committed transactions recorded so far, leaving an empty history with the same
    /// limit; `None` when the client does not record.
    pub fn take_history(&self) -> Option<History> {
        let limit = self.cfg.history_limit_bytes?;
        self.history.borrow_mut().replace(History::new(limit))
    }

    /// Keep a finished attempt's phase times until [`Self::take_phases`] takes them. At
    /// most 4,096 are kept: the oldest goes when nobody takes them.
    pub fn put_phases(&self, id: u64, times: PhaseTimes) {
        let mut p = self.phases.borrow_mut();
        if p.len() >= 4096 {
            p.remove(0);
        }
        p.push((id, times));
    }

    /// The phase times of finished attempt `id`, once.
    pub fn take_phases(&self, id: u64) -> Option<PhaseTimes> {
        let mut p = self.phases.borrow_mut();
        let i = p.iter().rposition(|&(a, _)| a == id)?;
        Some(p.swap_remove(i).1)
    }

    /// Whether committed transactions are recorded.
    pub fn records(&self) -> bool {
        self.cfg.history_limit_bytes.is_some()
    }

    /// Record one committed transaction of type `kind`: its accesses, and `times`
    /// (start, commit) for the snapshot-isolation check.
    pub fn record(&self, kind: u16, times: Option<(Timestamp, Timestamp)>, acc: &[Access]) {
        let mut h = self.history.borrow_mut();
        let Some(h) = h.as_mut() else { return };
        match times {
            Some((s, c)) => {
                h.record_timed(kind, s.get(), c.get(), acc.len(), acc.iter().copied());
            }
            None => {
                h.record(kind, acc);
            }
        }
    }
}

impl Drop for ClientCore {
    fn drop(&mut self) {
        let mine = std::mem::take(&mut *self.free_log_slots.borrow_mut());
        FREE_LOG_SLOTS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(mine);
    }
}
