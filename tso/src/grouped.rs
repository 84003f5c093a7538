//! [`GroupedTso`]: the process tier of TSO groups (Scythe 4.5 (2)), the threads of a
//! process combining their requests under a mutex ([`crate::group`]), their leader taking
//! one range from the oracle or from a TSO proxy.

use std::sync::Arc;

use rrpc::runtime::ThreadCtx;

use crate::client::TsoClient;
use crate::error::TsoError;
use crate::group::{GroupStats, TsoGroup};
use crate::source::TsoSources;
use crate::timestamp::Timestamp;

/// A process's TSO group over one oracle (Scythe 4.5 (2)): concurrent requests of the
/// process's threads and coroutines are combined into one range request of the group's
/// size ([`crate::group`]): one FAA on the oracle ([`GroupedTso::new`]), or one range RPC
/// to a TSO proxy chosen and failed over by [`TsoSources`] ([`GroupedTso::with_sources`]).
/// Share it in an `Arc`; each thread passes its own [`ThreadCtx`], connected to the
/// sources, and a leader's range request goes out on its own thread's context.
pub struct GroupedTso {
    source: RangeSource,
    group: TsoGroup<Arc<TsoError>>,
}

enum RangeSource {
    Oracle(TsoClient),
    Sources(Arc<TsoSources>),
}

impl GroupedTso {
    /// A group instance taking its ranges by FAA through `client`.
    pub fn new(client: TsoClient) -> Self {
        Self {
            source: RangeSource::Oracle(client),
            group: TsoGroup::new(),
        }
    }

    /// A group instance taking its ranges from `sources` (proxies or the oracle, with
    /// failover): a proxy RPC replaces the FAA as the leader's range request.
    pub fn with_sources(sources: Arc<TsoSources>) -> Self {
        Self {
            source: RangeSource::Sources(sources),
            group: TsoGroup::new(),
        }
    }

    /// The per-request oracle client underneath, when ranges come from the oracle only.
    pub fn client(&self) -> Option<&TsoClient> {
        match &self.source {
            RangeSource::Oracle(c) => Some(c),
            RangeSource::Sources(_) => None,
        }
    }

    /// One timestamp through the group: a leader takes its group's range with one range
    /// request, a follower waits for at most two (the one in flight and its group's).
    ///
    /// Errors: [`TsoError::Group`] when the leader's range request failed (its error is
    /// the source) or the leader was cancelled.
    pub async fn timestamp(&self, ctx: &ThreadCtx) -> Result<Timestamp, TsoError> {
        let source = &self.source;
        Ok(self
            .group
            .take(|n| async move {
                match source {
                    RangeSource::Oracle(c) => c.timestamps(ctx, n).await,
                    RangeSource::Sources(s) => s.timestamps(ctx, n).await,
                }
                .map(|r| r.first())
                .map_err(Arc::new)
            })
            .await?)
    }

    /// Process-tier groups formed (FAAs issued) and timestamps they served so far.
    pub fn stats(&self) -> GroupStats {
        self.group.stats()
    }
}
