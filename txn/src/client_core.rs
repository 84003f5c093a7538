//! What every protocol of a thread's client shares: the one-sided store, timestamps
//! through the thread's TSO group, the settings, the history of committed transactions
//! and the source of transaction ids. The protocols ([`crate::occ_cas`],
//! [`crate::scythe`], [`crate::mvcc`]) sit above it; the coordinator's
//! [`crate::coordinator::TxnClient`] wraps it with the protocol it picked.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, Ordering};

use rrpc::runtime::ThreadCtx;
use std::sync::Arc;

use tso::group::LocalLock;
use tso::{Timestamp, TsoConn, TsoError, TsoGroup};

use crate::config::{ClusterAddrs, TxnConfig};
use crate::cvt_remote::CvtRemote;
use crate::error::TxnError;
use crate::history::{Access, History};

/// Process-wide counter that gives each client a distinct tag in its lock words.
static CLIENT_TAGS: AtomicU32 = AtomicU32::new(1);

/// A thread's connection to the memory nodes and the TSO, shared by its coordinators.
pub(crate) struct ClientCore {
    /// The memory nodes' CVT tables, one-sided.
    pub store: CvtRemote,
    tso: TsoConn,
    /// The thread's TSO group over its oracle connection (Scythe 4.5 (2)).
    group: TsoGroup<Arc<TsoError>, LocalLock>,
    /// The settings the client was connected with.
    pub cfg: TxnConfig,
    history: RefCell<Option<History>>,
    /// High 32 bits of this client's transaction ids (node and client tag).
    tag: u64,
    seq: Cell<u32>,
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
        let store = CvtRemote::connect(ctx.clone(), &addrs.memnodes, cfg.cache_entries)?;
        let conn = TsoConn::connect(ctx.clone(), addrs.tso, cfg.tso_reconnect)?;
        let node = ctx.fabric().node().get();
        let tag = (u64::from(node & 0xffff) << 48)
            | (u64::from(CLIENT_TAGS.fetch_add(1, Ordering::Relaxed) & 0xffff) << 32);
        Ok(Self {
            store,
            tso: conn,
            group: TsoGroup::with_limit(tso::oracle::THREAD_RANGES_IN_FLIGHT),
            history: RefCell::new(cfg.history_limit_bytes.map(History::new)),
            cfg,
            tag,
            seq: Cell::new(0),
        })
    }

    /// A new transaction id: unique among the attempts of the process's clients, never 0
    /// (the word OCC-CAS and MVCC write into a CVT's lock word).
    pub fn next_id(&self) -> u64 {
        let seq = self.seq.get().wrapping_add(1).max(1);
        self.seq.set(seq);
        self.tag | u64::from(seq)
    }

    /// The TSO connection.
    pub fn tso_conn(&self) -> &TsoConn {
        &self.tso
    }

    /// One timestamp through the thread's TSO group (Scythe 4.5 (2)): concurrent
    /// requests of the thread's coroutines share one FAA.
    ///
    /// Errors: [`TxnError::Tso`] (the oracle did not come back in time, or the group's
    /// leader failed: the source error is kept).
    pub async fn timestamp(&self) -> Result<Timestamp, TxnError> {
        let tso = &self.tso;
        self.group
            .take(|n| async move { tso.timestamps(n).await.map(|r| r.first()).map_err(Arc::new) })
            .await
            .map_err(|e| match e {
                tso::GroupFailure::Take(e) => match Arc::try_unwrap(e) {
                    Ok(e) => TxnError::Tso(e),
                    Err(e) => TxnError::Export(format!("timestamp oracle: {e}")),
                },
                tso::GroupFailure::LeaderCancelled => {
                    TxnError::Export("timestamp oracle: the group leader was cancelled".into())
                }
            })
    }

    /// The committed transactions recorded so far, leaving an empty history with the same
    /// limit; `None` when the client does not record.
    pub fn take_history(&self) -> Option<History> {
        let limit = self.cfg.history_limit_bytes?;
        self.history.borrow_mut().replace(History::new(limit))
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
