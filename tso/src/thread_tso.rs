//! [`ThreadTso`]: the thread tier of TSO groups (Scythe 4.5 (2), the coroutines of one
//! thread).

use std::sync::Arc;

use rrpc::runtime::ThreadCtx;

use crate::client::TsoClient;
use crate::error::TsoError;
use crate::group::{GroupStats, TsoGroup};
use crate::timestamp::Timestamp;

/// FAAs a [`ThreadTso`] lets be in flight at once ([`TsoGroup::with_limit`]).
pub const THREAD_RANGES_IN_FLIGHT: usize = 2;

/// One thread's TSO group (Scythe 4.5 (2), the coroutines of a thread): the thread's
/// concurrent requests combine with no lock and no atomic instruction
/// ([`crate::group::LocalLock`]), and the leader takes the group's range with one FAA of
/// its size on the thread's own context. Give one to each thread (it is not `Send`).
///
/// Threads do not wait for each other here: each thread's groups FAA the oracle
/// directly. (Stacking this tier on the process's [`crate::GroupedTso`], one request of `n` per
/// thread group through [`TsoGroup::take_n`], combines threads too, but makes a thread
/// wait until another thread is scheduled to finish its FAA: on a machine with more busy
/// threads than cores that cost more than the FAAs it saved; see the README's TSO
/// section.)
///
/// Up to [`THREAD_RANGES_IN_FLIGHT`] groups' FAAs are in flight at once: with two
/// coroutines each leads its own FAA (as without groups), with many they wait in the open
/// group and one FAA serves it all.
///
/// Guarantees as [`TsoGroup`]: no prefetching (a group's FAA is issued after its members
/// arrived), bounded wait (at most two FAAs), no lost wake-ups (the group's wakers belong
/// to the thread's own executor), unique timestamps increasing per coroutine.
pub struct ThreadTso {
    client: TsoClient,
    local: TsoGroup<Arc<TsoError>, crate::group::LocalLock>,
}

impl ThreadTso {
    /// A thread group taking its ranges through `client`, up to
    /// [`THREAD_RANGES_IN_FLIGHT`] FAAs in flight.
    pub fn new(client: TsoClient) -> Self {
        Self::with_ranges_in_flight(client, THREAD_RANGES_IN_FLIGHT)
    }

    /// [`ThreadTso::new`] with up to `n` FAAs in flight (at least 1; 1 is Scythe's one
    /// group at a time, whose groups are larger but whose second coroutine always waits
    /// for the first's FAA).
    pub fn with_ranges_in_flight(client: TsoClient, n: usize) -> Self {
        Self {
            client,
            local: TsoGroup::with_limit(n.max(1)),
        }
    }

    /// One timestamp through the thread's group: a leader takes its group's range with
    /// one FAA, a follower waits for at most two FAAs.
    ///
    /// Errors: [`TsoError::Group`] when the leader's FAA failed (its error is the source)
    /// or the leader was cancelled.
    pub async fn timestamp(&self, ctx: &ThreadCtx) -> Result<Timestamp, TsoError> {
        let client = &self.client;
        Ok(self
            .local
            .take(|n| async move {
                client
                    .timestamps(ctx, n)
                    .await
                    .map(|r| r.first())
                    .map_err(Arc::new)
            })
            .await?)
    }

    /// Thread-tier groups formed (FAAs issued) and timestamps served.
    pub fn stats(&self) -> GroupStats {
        self.local.stats()
    }
}
