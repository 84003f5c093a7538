//! One-sided operations on the memory nodes that outlive a broken QP.
//!
//! A transport failure (a QP moved to the error state: a link flap, an injected fault)
//! fails every WR outstanding on the QP with [`WcStatus::Flushed`] or
//! [`WcStatus::RetryExceeded`], and the thread's QP pool connects a new QP to the same
//! node in the background ([`rrpc::straw`]). A transaction that took CVT lock words or
//! is installing must not give up there: an unlock that failed would leave the word held
//! forever, and a write-back that stopped half-way would leave a commit half visible. So
//! every operation here is retried on such errors, with doubling sleeps from 50 us to
//! 5 ms, for up to [`RETRY_FOR`]; a node that is gone ([`OneSidedError::PeerGone`]) or an
//! access error is returned at once.
//!
//! **Why retrying is safe.** READs and WRITEs are idempotent (a WRITE is only ever
//! retried with the same bytes, by the holder of the lock that covers them). A flushed
//! WR was not executed (the shm fabric's timing model and verbs alike), but a WR whose
//! response was lost (`RetryExceeded` on verbs) may have been; a CAS is therefore retried
//! through [`cas_owned`], which reads "the word already holds my swap value" as "my
//! earlier try took effect". That reading is right only when no one else ever swaps in
//! the same value: transaction ids, insert-guard ids and slot claims (the inserter's id,
//! [`crate::cvt::claim_word`]) are unique per attempt, and a release swaps in 0 only
//! from the caller's own id. No CAS here swaps in a value that others use too.

use std::cell::Cell;
use std::future::Future;
use std::time::{Duration, Instant};

use rrpc::fabric::{RemoteAddr, WcStatus};
use rrpc::runtime::{OneSidedError, ThreadCtx};
use rrpc::NodeId;

/// How long an operation is retried after a transport failure before its error is
/// returned (the QP pool's reconnect takes milliseconds; a node unreachable for longer
/// is reported gone by its pool anyway).
pub const RETRY_FOR: Duration = Duration::from_secs(2);

/// Whether a node is written off (dead, or being failed over): see
/// [`set_written_off_check`].
pub type WrittenOff = std::rc::Rc<dyn Fn(NodeId) -> bool>;

thread_local! {
    /// Retries after transport failures on this thread since it started.
    static RETRIES: Cell<u64> = const { Cell::new(0) };
    /// This thread's check of written-off nodes, if any.
    static WRITTEN_OFF: std::cell::RefCell<Option<WrittenOff>> = const { std::cell::RefCell::new(None) };
}

/// Install this thread's check of written-off nodes: an operation on a node it names
/// is not retried after a transport failure (the node died and the replica view is
/// replacing it, `crate::view`: waiting out [`RETRY_FOR`] would only stall the
/// attempt). `None` removes it.
pub fn set_written_off_check(f: Option<WrittenOff>) {
    WRITTEN_OFF.with(|w| *w.borrow_mut() = f);
}

/// Whether this thread's check ([`set_written_off_check`]) names `node` written off.
pub(crate) fn written_off(node: NodeId) -> bool {
    WRITTEN_OFF.with(|w| w.borrow().as_ref().is_some_and(|f| f(node)))
}

/// One-sided operations this thread retried after a transport failure so far.
pub fn retries() -> u64 {
    RETRIES.with(Cell::get)
}

/// Whether `e` is a transport failure that a new QP to the same node can outlive.
pub fn is_transient(e: &OneSidedError) -> bool {
    matches!(
        e,
        OneSidedError::Completion {
            status: WcStatus::Flushed | WcStatus::RetryExceeded,
            ..
        }
    )
}

/// Run `op` until it does not fail with a transport failure, or [`RETRY_FOR`] passed
/// since its first failure.
async fn retried<T, F, Fut>(ctx: &ThreadCtx, node: NodeId, mut op: F) -> Result<T, OneSidedError>
where
    F: FnMut(bool) -> Fut,
    Fut: Future<Output = Result<T, OneSidedError>>,
{
    let mut delay = Duration::from_micros(50);
    let mut until = None;
    let mut first = true;
    loop {
        match op(first).await {
            Err(e) if is_transient(&e) && !written_off(node) => {
                let end = *until.get_or_insert_with(|| Instant::now() + RETRY_FOR);
                if Instant::now() >= end {
                    return Err(e);
                }
                RETRIES.with(|r| r.set(r.get() + 1));
                tracing::debug!(error = %e, "one-sided operation retried after a transport failure");
                ctx.sleep(delay).await;
                delay = (delay * 2).min(Duration::from_millis(5));
                first = false;
            }
            r => return r,
        }
    }
}

/// [`ThreadCtx::read`], retried after transport failures.
pub async fn read(
    ctx: &ThreadCtx,
    node: NodeId,
    at: RemoteAddr,
    len: usize,
) -> Result<Vec<u8>, OneSidedError> {
    retried(ctx, node, |_| ctx.read(node, at, len)).await
}

/// [`ThreadCtx::write`], retried after transport failures (the caller holds what makes
/// writing these bytes again harmless).
pub async fn write(
    ctx: &ThreadCtx,
    node: NodeId,
    at: RemoteAddr,
    data: &[u8],
) -> Result<(), OneSidedError> {
    retried(ctx, node, |_| ctx.write(node, at, data)).await
}

/// [`ThreadCtx::write_ordered`], retried as a whole after transport failures (every
/// WRITE of the list again, with the same bytes: idempotent, and still in order).
pub async fn write_ordered(
    ctx: &ThreadCtx,
    node: NodeId,
    writes: &[(RemoteAddr, &[u8])],
) -> Result<(), OneSidedError> {
    retried(ctx, node, |_| ctx.write_ordered(node, writes)).await
}

/// [`ThreadCtx::cas`] of a word from `expect` to `swap`, where `swap` is this caller's
/// alone (a unique id, or 0 released from the caller's own id): retried after transport
/// failures, and a retry that finds the word at `swap` returns `expect` (the earlier try
/// took effect). Returns the word before, as [`ThreadCtx::cas`] does.
pub async fn cas_owned(
    ctx: &ThreadCtx,
    node: NodeId,
    at: RemoteAddr,
    expect: u64,
    swap: u64,
) -> Result<u64, OneSidedError> {
    retried(ctx, node, |first| async move {
        let old = ctx.cas(node, at, expect, swap).await?;
        Ok(if !first && old == swap && swap != expect {
            expect
        } else {
            old
        })
    })
    .await
}
