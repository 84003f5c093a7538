//! The one interface every concurrency-control protocol implements
//! ([`ConcurrencyControl`]), over the shared attempt state of [`crate::attempt`], and the
//! protocol-independent steps around it (which reads to issue, commit then release).
//!
//! A protocol is one file: a type implementing this trait (holding whatever its client
//! needs, e.g. Scythe's lock service client), its per-attempt state (`State`) and its
//! per-object state (`ObjState`). The coordinator registers it in one place
//! ([`crate::coordinator`]'s protocol table) and picks it once per client.

use crate::attempt::{Attempt, Obj};
use crate::error::TxnError;
use crate::phase::Phase;

/// One object an execution round asks for: `(table, key, for_update)`.
pub(crate) type Want = (u32, u64, bool);

/// The attempt type of protocol `P`.
pub(crate) type AttemptOf<'a, P> =
    Attempt<'a, <P as ConcurrencyControl>::State, <P as ConcurrencyControl>::ObjState>;

/// A concurrency-control protocol: how an attempt reads, commits and releases.
pub(crate) trait ConcurrencyControl {
    /// The protocol's state of one attempt (e.g. Scythe's mode and tickets).
    type State: Default;
    /// The protocol's state of one object of the read set.
    type ObjState: Default;

    /// Set up a new attempt; `retry_of` is the id of the same transaction's previous
    /// attempt when this one retries it (Scythe carries the rows it found hot). Default:
    /// nothing.
    fn begin(&self, _a: &mut AttemptOf<'_, Self>, _retry_of: Option<u64>) {}

    /// The attempt ends (committed, aborted or dropped; [`Attempt::committed`] says
    /// which): the protocol's bookkeeping. Default: nothing.
    fn finish(&self, _a: &mut AttemptOf<'_, Self>) {}

    /// Whether an object already in the read set must be fetched again because the
    /// transaction now reads it `for_update` (MVCC locks read-write data at execution);
    /// default no.
    fn refetch(&self, _o: &Obj<Self::ObjState>, _for_update: bool) -> bool {
        false
    }

    /// Execution reads of `want`: objects not in the read set yet (or those
    /// [`Self::refetch`] asked for), deduplicated, in one round where the protocol
    /// allows. Every object read (or lock taken) is pushed into the attempt, so that
    /// every path releases it.
    ///
    /// Errors: [`TxnError::Abort`] and service failures.
    async fn fetch(&self, a: &mut AttemptOf<'_, Self>, want: &[Want]) -> Result<(), TxnError>;

    /// Commit: lock, validate, write back, record; the caller releases afterwards
    /// ([`Self::release`]).
    ///
    /// Errors: [`TxnError::Abort`] (nothing written), [`TxnError::WriteBack`], service
    /// failures.
    async fn commit(&self, a: &mut AttemptOf<'_, Self>) -> Result<(), TxnError>;

    /// Release everything the attempt holds (default: its CVT lock words).
    ///
    /// Errors: the first release that failed (every release is still issued).
    async fn release(&self, a: &mut AttemptOf<'_, Self>) -> Result<(), TxnError> {
        a.release_cvt_locks().await
    }

    /// Whether the attempt runs in a high-contention mode (Scythe's TOCC); default no.
    fn hot_mode(&self, _a: &AttemptOf<'_, Self>) -> bool {
        false
    }
}

/// Fetch the objects of `items` that the attempt lacks (or that [`ConcurrencyControl::refetch`]
/// asks for), deduplicated, a key read both plainly and for update counting as for
/// update.
///
/// Errors: [`TxnError::Usage`] for an unknown table, and as
/// [`ConcurrencyControl::fetch`].
pub(crate) async fn fetch<P: ConcurrencyControl>(
    p: &P,
    a: &mut AttemptOf<'_, P>,
    items: &[Want],
) -> Result<(), TxnError> {
    let mut want: Vec<Want> = Vec::new();
    for &(t, k, u) in items {
        a.core.store.table(0, t)?;
        let needed = match a.find(t, k) {
            None => true,
            Some(i) => p.refetch(&a.objs[i], u),
        };
        if needed {
            match want.iter_mut().find(|w| (w.0, w.1) == (t, k)) {
                Some(w) => w.2 |= u,
                None => want.push((t, k, u)),
            }
        }
    }
    if want.is_empty() {
        return Ok(());
    }
    p.fetch(a, &want)
        .await
        .map_err(|e| a.core.store.classify(e))
}

/// Commit, then release on every path. A write-back failure keeps the release's error
/// beside its own.
///
/// Errors: as [`ConcurrencyControl::commit`]; a failed release of a committed attempt.
pub(crate) async fn commit<P: ConcurrencyControl>(
    p: &P,
    a: &mut AttemptOf<'_, P>,
) -> Result<(), TxnError> {
    let r = p.commit(a).await.map_err(|e| a.core.store.classify(e));
    a.committed = r.is_ok();
    a.enter(Phase::Unlock);
    let released = p.release(a).await;
    match r {
        Err(TxnError::WriteBack { cause, release }) => Err(TxnError::WriteBack {
            cause,
            release: release.or(released.err().map(Box::new)),
        }),
        Err(e) => Err(e),
        Ok(()) => released.map_err(|e| a.core.store.classify(e)),
    }
}
