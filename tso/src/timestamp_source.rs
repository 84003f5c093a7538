//! [`TimestampSource`]: where a TSO group's leader takes its group's range (Scythe 4.5
//! (2): "the Leader ... sends a batch of TSO requests"): one FAA on the oracle
//! ([`crate::TsoClient`]), the same across oracle restarts ([`crate::TsoConn`]), or a
//! proxy or the oracle chosen and failed over per request ([`crate::TsoSources`]).
//!
//! The thread tier of TSO groups, [`crate::ThreadTso`], is generic over it, and so keeps
//! each source's own error type.

use std::rc::Rc;
use std::sync::Arc;

use rrpc::runtime::ThreadCtx;

use crate::timestamp::TimestampRange;

/// Something that takes `n` consecutive timestamps at once, on the calling thread.
///
/// Contract, which the TSO group's guarantees rest on (the crate docs' guarantee):
/// - the range is taken *after* the call started (no prefetching, no cache), so that a
///   request that starts after another finished gets a larger timestamp;
/// - it holds exactly `n` timestamps, never handed out by any other call;
/// - a failed call hands out nothing (a range it may have taken is a gap, never reused).
///
/// The futures run on the calling thread's executor and need not be `Send`.
#[allow(async_fn_in_trait)] // runs on one thread's executor: no `Send` bound wanted
pub trait TimestampSource {
    /// Why a range could not be taken.
    type Error: std::error::Error + Send + Sync + 'static;

    /// `n >= 1` consecutive timestamps, the first `>= 1`. `ctx` is the calling thread's
    /// context, connected to the source; a source bound to a context of its own
    /// ([`crate::TsoConn`]) ignores it.
    ///
    /// Errors: the source's (for `n == 0` too: the sources of this crate refuse it
    /// without a request).
    async fn timestamps(&self, ctx: &ThreadCtx, n: u64) -> Result<TimestampRange, Self::Error>;
}

impl<S: TimestampSource + ?Sized> TimestampSource for &S {
    type Error = S::Error;

    async fn timestamps(&self, ctx: &ThreadCtx, n: u64) -> Result<TimestampRange, S::Error> {
        (**self).timestamps(ctx, n).await
    }
}

impl<S: TimestampSource + ?Sized> TimestampSource for Rc<S> {
    type Error = S::Error;

    async fn timestamps(&self, ctx: &ThreadCtx, n: u64) -> Result<TimestampRange, S::Error> {
        (**self).timestamps(ctx, n).await
    }
}

/// A source shared by a process's threads (e.g. one [`crate::TsoSources`] in an `Arc`).
impl<S: TimestampSource + ?Sized> TimestampSource for Arc<S> {
    type Error = S::Error;

    async fn timestamps(&self, ctx: &ThreadCtx, n: u64) -> Result<TimestampRange, S::Error> {
        (**self).timestamps(ctx, n).await
    }
}
