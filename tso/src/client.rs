//! [`TsoClient`]: a thread's handle on one incarnation of an oracle, taking timestamps
//! with one-sided FAA on its counter (Scythe 4.5, Fig. 18, a client of the "TSO service"
//! box).

use rrpc::fabric::RemoteAddr;
use rrpc::node::NodeInfo;
use rrpc::runtime::ThreadCtx;
use rrpc::NodeId;

use crate::error::TsoError;
use crate::export::{TsoExport, EXPORT_NAME};
use crate::timestamp::{Timestamp, TimestampRange};
use crate::timestamp_source::TimestampSource;

/// A thread's handle on an oracle: takes timestamps with one-sided FAA. Connect with
/// `ThreadCtx::connect` (one-sided only; the oracle serves no RPCs).
#[derive(Clone, Debug)]
pub struct TsoClient {
    pub(crate) node: NodeId,
    pub(crate) counter: RemoteAddr,
    pub(crate) placement: String,
    pub(crate) epoch: u16,
    pub(crate) incarnation: u64,
}

impl TsoClient {
    /// A client for the oracle described by `info`.
    ///
    /// Errors: [`TsoError::Export`] when the `"tso"` export is missing or malformed.
    pub fn from_info(info: &NodeInfo) -> Result<Self, TsoError> {
        let e: TsoExport = info
            .export(EXPORT_NAME)
            .map_err(|e| TsoError::Export(e.to_string()))?;
        if e.counter.addr & 7 != 0 {
            return Err(TsoError::Export(format!(
                "counter address {:#x} is not 8-byte aligned",
                e.counter.addr
            )));
        }
        Ok(Self {
            node: info.node,
            counter: e.counter,
            placement: e.placement,
            epoch: e.epoch,
            incarnation: e.incarnation,
        })
    }

    /// Node id of the oracle.
    pub fn node(&self) -> NodeId {
        self.node
    }

    /// The counter word of this incarnation.
    pub fn counter(&self) -> RemoteAddr {
        self.counter
    }

    /// The oracle's epoch as it exported it.
    pub fn epoch(&self) -> u16 {
        self.epoch
    }

    /// The oracle process's random id ([`TsoExport::incarnation`]; 0 from an older
    /// oracle).
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// The oracle's counter placement as it exported it.
    pub fn placement(&self) -> &str {
        &self.placement
    }

    /// One timestamp (`>= 1`): one FAA of +1, returning the old value + 1.
    ///
    /// Errors: [`TsoError::Rpc`] when the FAA fails, [`TsoError::Exhausted`].
    pub async fn timestamp(&self, ctx: &ThreadCtx) -> Result<Timestamp, TsoError> {
        Ok(self.timestamps(ctx, 1).await?.first())
    }

    /// `n` consecutive timestamps `old + 1 .. old + 1 + n` with one FAA of `n`.
    ///
    /// Errors: [`TsoError::ZeroCount`] for `n == 0` (no FAA is issued),
    /// [`TsoError::Rpc`] when the FAA fails, [`TsoError::Exhausted`] when the range
    /// leaves the oracle's epoch (its values are then never handed out).
    pub async fn timestamps(&self, ctx: &ThreadCtx, n: u64) -> Result<TimestampRange, TsoError> {
        if n == 0 {
            return Err(TsoError::ZeroCount);
        }
        let old = ctx.faa(self.node, self.counter, n).await?;
        let exhausted = TsoError::Exhausted {
            epoch: self.epoch,
            at: old,
            n,
        };
        let Some(last) = old.checked_add(n) else {
            return Err(exhausted);
        };
        if Timestamp(old).epoch() != self.epoch || Timestamp(last).epoch() != self.epoch {
            return Err(exhausted);
        }
        Ok(TimestampRange::new(Timestamp(old + 1), n))
    }
}

impl TimestampSource for TsoClient {
    type Error = TsoError;

    /// [`TsoClient::timestamps`]: one FAA of `n` on `ctx`.
    async fn timestamps(&self, ctx: &ThreadCtx, n: u64) -> Result<TimestampRange, TsoError> {
        TsoClient::timestamps(self, ctx, n).await
    }
}
