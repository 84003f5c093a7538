//! [`ThreadTso`]: the thread tier of TSO groups (Scythe 4.5 (2), the coroutines of one
//! thread), generic over where its leaders take their ranges ([`TimestampSource`]).
//!
//! A leader's failed range request is the source's own error, returned to the leader as
//! it is ([`ThreadTsoError::Source`]). Its followers cannot own that error too (a source's
//! error need not be `Clone`, and the leader has it), so each gets a shared record of it,
//! its message and the messages of its causes in order ([`ThreadTsoError::LeaderFailed`]).

use std::cell::Cell;
use std::sync::Arc;

use rrpc::runtime::ThreadCtx;

use crate::client::TsoClient;
use crate::group::{GroupFailure, GroupStats, LocalLock, TsoGroup};
use crate::timestamp::Timestamp;
use crate::timestamp_source::TimestampSource;

/// Range requests a [`ThreadTso`] lets be in flight at once by default
/// ([`TsoGroup::with_limit`]).
pub const THREAD_RANGES_IN_FLIGHT: usize = 2;

/// Why a [`ThreadTso`] request got no timestamp.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ThreadTsoError<E> {
    /// This request led its group and the source failed: the source's error itself
    /// (a [`crate::TsoError`] for the sources of this crate).
    #[error(transparent)]
    Source(E),
    /// This request followed a leader whose range request failed: the leader's error, as
    /// a record of its messages ([`LeaderError`]), shared by the group's followers.
    #[error("the TSO group leader's range request failed")]
    LeaderFailed(#[source] Arc<LeaderError>),
    /// This request followed a leader whose future was dropped while its range request
    /// was in flight: whether the range was taken is unknown, so no timestamp is handed
    /// out.
    #[error("the TSO group leader was cancelled with its range request in flight")]
    LeaderCancelled,
}

impl<E> ThreadTsoError<E> {
    /// The source's error, if this request led its group (a follower's is the leader's).
    pub fn into_source(self) -> Option<E> {
        match self {
            Self::Source(e) => Some(e),
            Self::LeaderFailed(_) | Self::LeaderCancelled => None,
        }
    }
}

/// A group leader's error as its followers get it: the error's message, with the chain
/// of its causes as [`std::error::Error::source`] (each a `LeaderError` with that cause's
/// message). The types are gone; the text of every level is kept.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct LeaderError {
    message: String,
    #[source]
    source: Option<Box<LeaderError>>,
}

impl LeaderError {
    /// The record of `e` and its causes.
    pub fn of(e: &(dyn std::error::Error + 'static)) -> Self {
        Self {
            message: e.to_string(),
            source: e.source().map(|s| Box::new(Self::of(s))),
        }
    }

    /// The leader's error's message (its `Display`, without its causes).
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// One thread's TSO group (Scythe 4.5 (2), the coroutines of a thread): the thread's
/// concurrent requests combine with no lock and no atomic instruction
/// ([`crate::group::LocalLock`]), and the leader takes the group's range with one request
/// of its size to the source `S` on the thread's own context: one FAA on the oracle for
/// [`TsoClient`] (the default) and [`crate::TsoConn`] (which follows the oracle across
/// restarts), a proxy RPC or an FAA for [`crate::TsoSources`]. Give one to each thread
/// (it is not `Send`).
///
/// Threads do not wait for each other here: each thread's groups go to the source
/// directly. (Stacking this tier on the process's [`crate::GroupedTso`], one request of
/// `n` per thread group through [`TsoGroup::take_n`], combines threads too, but makes a
/// thread wait until another thread is scheduled to finish its FAA: on a machine with
/// more busy threads than cores that cost more than the FAAs it saved; see the book's
/// results chapter, tso-bench.)
///
/// Up to [`THREAD_RANGES_IN_FLIGHT`] groups' range requests are in flight at once (by
/// default): with two coroutines each leads its own request (as without groups), with
/// many they wait in the open group and one request serves it all.
///
/// Guarantees as [`TsoGroup`]: no prefetching (a group's range is requested after its
/// members arrived), bounded wait (at most two range requests), no lost wake-ups (the
/// group's wakers belong to the thread's own executor), unique timestamps increasing per
/// coroutine.
///
/// # Example
///
/// A transaction client's thread, following the oracle across restarts:
///
/// ```no_run
/// use std::net::SocketAddr;
/// use std::rc::Rc;
///
/// use rrpc::runtime::ThreadCtx;
/// use tso::{ReconnectConfig, ThreadTso, ThreadTsoError, Timestamp, TsoConn, TsoError};
///
/// fn connect(ctx: Rc<ThreadCtx>, oracle: SocketAddr) -> Result<ThreadTso<TsoConn>, TsoError> {
///     let conn = TsoConn::connect(ctx, oracle, ReconnectConfig::default())?;
///     Ok(ThreadTso::with_ranges_in_flight(conn, tso::THREAD_RANGES_IN_FLIGHT))
/// }
///
/// async fn timestamp(tso: &ThreadTso<TsoConn>, ctx: &ThreadCtx) -> Result<Timestamp, String> {
///     tso.timestamp(ctx).await.map_err(|e| match e {
///         // This request led its group: the connection's own error.
///         ThreadTsoError::Source(TsoError::Unavailable { addr, .. }) => {
///             format!("oracle {addr} down (restarts survived: {})", tso.source().reconnects())
///         }
///         other => other.to_string(),
///     })
/// }
/// ```
pub struct ThreadTso<S: TimestampSource = TsoClient> {
    source: S,
    local: TsoGroup<Arc<LeaderError>, LocalLock>,
}

impl<S: TimestampSource> ThreadTso<S> {
    /// A thread group taking its ranges from `source`, up to
    /// [`THREAD_RANGES_IN_FLIGHT`] range requests in flight.
    pub fn new(source: S) -> Self {
        Self::with_ranges_in_flight(source, THREAD_RANGES_IN_FLIGHT)
    }

    /// [`ThreadTso::new`] with up to `n` range requests in flight (at least 1; 1 is
    /// Scythe's one group at a time, whose groups are larger but whose second coroutine
    /// always waits for the first's request).
    pub fn with_ranges_in_flight(source: S, n: usize) -> Self {
        Self {
            source,
            local: TsoGroup::with_limit(n.max(1)),
        }
    }

    /// The source the leaders take their ranges from.
    pub fn source(&self) -> &S {
        &self.source
    }

    /// One timestamp through the thread's group: a leader takes its group's range with
    /// one request to the source on `ctx` (the calling thread's context), a follower waits
    /// for at most two range requests.
    ///
    /// Errors: [`ThreadTsoError::Source`] when this request led and the source failed;
    /// [`ThreadTsoError::LeaderFailed`] when it followed a leader whose source failed;
    /// [`ThreadTsoError::LeaderCancelled`] when its leader was cancelled.
    pub async fn timestamp(&self, ctx: &ThreadCtx) -> Result<Timestamp, ThreadTsoError<S::Error>> {
        // Set only if this request leads and its range request fails: the leader keeps
        // the source's error, the group gets its record.
        let own: Cell<Option<S::Error>> = Cell::new(None);
        let (source, own_ref) = (&self.source, &own);
        let r = self
            .local
            .take(|n| async move {
                match source.timestamps(ctx, n).await {
                    Ok(range) => Ok(range.first()),
                    Err(e) => {
                        let shared = Arc::new(LeaderError::of(&e));
                        own_ref.set(Some(e));
                        Err(shared)
                    }
                }
            })
            .await;
        r.map_err(|e| match (e, own.take()) {
            (_, Some(mine)) => ThreadTsoError::Source(mine),
            (GroupFailure::Take(leader), None) => ThreadTsoError::LeaderFailed(leader),
            (GroupFailure::LeaderCancelled, None) => ThreadTsoError::LeaderCancelled,
        })
    }

    /// Thread-tier groups formed (range requests issued) and timestamps served.
    pub fn stats(&self) -> GroupStats {
        self.local.stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::tests::with_watchdog;
    use crate::timestamp::TimestampRange;
    use rrpc::fabric::shm::ClusterGuard;
    use rrpc::runtime::{Executor, RuntimeConfig};
    use rrpc::NodeId;
    use std::cell::RefCell;
    use std::rc::Rc;
    use std::time::Duration;

    /// A source's error that is not `Clone`, with a cause.
    #[derive(Debug, thiserror::Error)]
    #[error("planted source failure")]
    struct Planted(#[source] std::io::Error);

    /// A fake source: a counter; each range request waits (on `ctx`'s clock) until
    /// `release` is set, then fails or succeeds as the next of `outcomes` says.
    struct Fake {
        next: Cell<u64>,
        asked: RefCell<Vec<u64>>,
        release: Rc<Cell<bool>>,
        outcomes: RefCell<std::collections::VecDeque<bool>>,
    }

    impl TimestampSource for Fake {
        type Error = Planted;

        async fn timestamps(&self, ctx: &ThreadCtx, n: u64) -> Result<TimestampRange, Planted> {
            self.asked.borrow_mut().push(n);
            while !self.release.get() {
                ctx.sleep(Duration::from_micros(50)).await;
            }
            if !self.outcomes.borrow_mut().pop_front().unwrap_or(true) {
                return Err(Planted(std::io::Error::other("link down")));
            }
            let first = self.next.get();
            self.next.set(first + n);
            Ok(TimestampRange::new(Timestamp(first), n))
        }
    }

    /// Three coroutines of one thread over one [`ThreadTso`] with one range request in
    /// flight, over a [`Fake`] with `outcomes`: coroutine 0 leads a group of one; 1 and 2
    /// arrive while its request is in flight and form the next group, which the first
    /// of them to run leads. Returns what each got, rendered, and the sizes asked for.
    fn three_coroutines(name: &'static str, outcomes: Vec<bool>) -> ([String; 3], Vec<u64>) {
        with_watchdog(move || {
            let c = format!("tso-unit-{}-{name}", std::process::id());
            let (cluster, _) = ClusterGuard::new(&c).unwrap();
            let ctx =
                ThreadCtx::new(cluster.open(NodeId(1)).unwrap(), RuntimeConfig::default()).unwrap();
            let release = Rc::new(Cell::new(false));
            let fake = Fake {
                next: Cell::new(1),
                asked: RefCell::default(),
                release: release.clone(),
                outcomes: RefCell::new(outcomes.into()),
            };
            let tso = Rc::new(ThreadTso::with_ranges_in_flight(fake, 1));
            let got: Rc<RefCell<[String; 3]>> = Rc::default();
            let joined = Rc::new(Cell::new(0));
            let mut ex = Executor::new(ctx.clone());
            for i in 0..3 {
                let (ctx, tso, got) = (ctx.clone(), tso.clone(), got.clone());
                let (release, joined) = (release.clone(), joined.clone());
                ex.spawn(async move {
                    if i > 0 {
                        // Arrive while the first request's range request is in flight.
                        while tso.source().asked.borrow().is_empty() {
                            ctx.sleep(Duration::from_micros(50)).await;
                        }
                        // The second to arrive lets the range requests return; it joins
                        // in the same poll, before the leader runs again.
                        joined.set(joined.get() + 1);
                        if joined.get() == 2 {
                            release.set(true);
                        }
                    }
                    let r = tso.timestamp(&ctx).await;
                    got.borrow_mut()[i] = describe(r);
                });
            }
            ex.run();
            let got = got.borrow().clone();
            let asked = tso.source().asked.borrow().clone();
            (got, asked)
        })
    }

    /// Which variant, with the leader's error checked to be the source's own type.
    fn describe(r: Result<Timestamp, ThreadTsoError<Planted>>) -> String {
        match r {
            Ok(t) => format!("ts {}", t.get()),
            Err(ThreadTsoError::Source(Planted(cause))) => format!("source: {cause}"),
            Err(ThreadTsoError::LeaderFailed(e)) => {
                let cause = std::error::Error::source(&*e).map(|c| c.to_string());
                format!("follower: {} / {cause:?}", e.message())
            }
            Err(ThreadTsoError::LeaderCancelled) => "cancelled".into(),
        }
    }

    #[test]
    fn a_failing_source_gives_the_leader_its_error_and_the_follower_a_record() {
        // The first group's range request succeeds, the second group's fails.
        let ([first, b, c], asked) = three_coroutines("fail", vec![true, false]);
        assert_eq!(first, "ts 1");
        let mut second = [b, c];
        second.sort();
        assert_eq!(
            second,
            [
                // The follower: the leader's error with its cause, as a record.
                "follower: planted source failure / Some(\"link down\")".to_string(),
                // The leader: the source's own error type.
                "source: link down".to_string(),
            ]
        );
        assert_eq!(
            asked,
            vec![1, 2],
            "the follower did not ask the source itself"
        );
    }

    #[test]
    fn a_working_source_serves_each_group_with_one_range_of_its_size() {
        let ([a, b, c], asked) = three_coroutines("ok", vec![]);
        assert_eq!(a, "ts 1");
        let mut second = [b, c];
        second.sort();
        assert_eq!(second, ["ts 2", "ts 3"]);
        assert_eq!(asked, vec![1, 2], "one range per group, of its size");
    }

    #[test]
    fn leader_error_keeps_the_chain_of_causes() {
        let e = Planted(std::io::Error::other("link down"));
        let r = LeaderError::of(&e);
        let chain: Vec<String> =
            std::iter::successors(Some(&r as &dyn std::error::Error), |e| e.source())
                .map(ToString::to_string)
                .collect();
        assert_eq!(chain, ["planted source failure", "link down"]);
    }
}
