//! The runtime's settings ([`RuntimeConfig`]), per-call options ([`CallOpts`]) and
//! per-thread counters ([`Stats`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::rocket::RocketConfig;
use crate::straw::StrawConfig;
use crate::wire::{Batching, ReplyMode};

use super::ConnectError;

/// Runtime settings. As a TOML table the keys are kebab-case, durations are integer
/// milliseconds (`call-timeout-ms`), and every key may be left out for its default.
///
/// Non-exhaustive, so that a setting can be added without breaking the crates that
/// embed rrpc: outside rrpc, start from [`RuntimeConfig::default`] and change fields
/// with the `with_*` setters (or assign them on a `let mut` binding).
///
/// ```
/// use std::time::Duration;
/// use rrpc::rocket::RocketConfig;
/// use rrpc::runtime::RuntimeConfig;
///
/// let cfg = RuntimeConfig::default()
///     .with_call_timeout(Duration::from_millis(500))
///     .with_rocket(RocketConfig::new(512, 128));
/// assert_eq!(cfg.call_timeout, Duration::from_millis(500));
/// assert_eq!(cfg.rocket.buckets, 128);
/// assert_eq!(cfg.sq_depth, RuntimeConfig::default().sq_depth);
/// cfg.validate().unwrap();
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
#[non_exhaustive]
pub struct RuntimeConfig {
    /// Geometry of the request and response Rockets of each RPC channel (default 64
    /// buckets of 512 B; at most what the server admits, see
    /// [`crate::server::ServerConfig::max_ring_bytes`]).
    pub rocket: RocketConfig,
    /// Batching of RPC traffic, both directions (default [`Batching::Combined`]).
    pub batching: Batching,
    /// Default deadline of an RPC call, from issue to response (default 2 s, at least
    /// 1 ms); [`CallOpts::timeout`] overrides it per call. A call that goes out at once
    /// reads no clock: its deadline counts from the thread's next deadline scan (every
    /// 32 polling rounds), so it may end that many rounds late.
    #[serde(rename = "call-timeout-ms", with = "crate::ctrl::millis")]
    pub call_timeout: Duration,
    /// How long connection setup waits for a node's control plane (default 10 s).
    #[serde(rename = "connect-timeout-ms", with = "crate::ctrl::millis")]
    pub connect_timeout: Duration,
    /// Send-queue depth of each QP, in WRs (default 512, at least 1). A polling round's
    /// WRs beyond the room left wait for the next round.
    pub sq_depth: usize,
    /// Threads per QP before a straw adds a QP (default 4, at least 1); see
    /// [`StrawConfig`].
    pub threads_per_qp: usize,
    /// [`ReplyMode::Auto`] sends replies up to this many bytes inline and larger ones by
    /// RPC + READ or zero-copy (default 512, Scythe 4.6 (2)).
    pub mode_threshold: usize,
    /// Registered buffer bytes per thread for one-sided ops, zero-copy replies and
    /// large requests (default 32 MiB; untouched pages cost nothing). At least
    /// `max_transfer`.
    pub buffer_bytes: usize,
    /// Largest single one-sided op, READ-mode reply, zero-copy reply or request in
    /// bytes (default 4 MiB).
    pub max_transfer: usize,
    /// How long a failed QP keeps trying to reconnect while its node's control plane is
    /// unreachable, with exponential backoff from 1 ms to 100 ms, before the node is
    /// reported dead (default 10 s); see [`StrawConfig::reconnect_give_up`].
    #[serde(rename = "reconnect-give-up-ms", with = "crate::ctrl::millis")]
    pub reconnect_give_up: Duration,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            rocket: RocketConfig::default(),
            batching: Batching::Combined,
            call_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(10),
            sq_depth: 512,
            threads_per_qp: 4,
            mode_threshold: 512,
            buffer_bytes: 32 << 20,
            max_transfer: 4 << 20,
            reconnect_give_up: Duration::from_secs(10),
        }
    }
}

impl RuntimeConfig {
    /// Set [`RuntimeConfig::rocket`]: the geometry of each RPC channel's Rockets.
    pub fn with_rocket(mut self, rocket: RocketConfig) -> Self {
        self.rocket = rocket;
        self
    }

    /// Set [`RuntimeConfig::batching`]: batching of RPC traffic, both directions.
    pub fn with_batching(mut self, batching: Batching) -> Self {
        self.batching = batching;
        self
    }

    /// Set [`RuntimeConfig::call_timeout`]: default deadline of an RPC call (at least 1 ms).
    pub fn with_call_timeout(mut self, call_timeout: Duration) -> Self {
        self.call_timeout = call_timeout;
        self
    }

    /// Set [`RuntimeConfig::connect_timeout`]: how long connection setup waits for a node.
    pub fn with_connect_timeout(mut self, connect_timeout: Duration) -> Self {
        self.connect_timeout = connect_timeout;
        self
    }

    /// Set [`RuntimeConfig::sq_depth`]: send-queue depth of each QP, in WRs (at least 1).
    pub fn with_sq_depth(mut self, sq_depth: usize) -> Self {
        self.sq_depth = sq_depth;
        self
    }

    /// Set [`RuntimeConfig::threads_per_qp`]: threads per QP before a straw adds a QP.
    pub fn with_threads_per_qp(mut self, threads_per_qp: usize) -> Self {
        self.threads_per_qp = threads_per_qp;
        self
    }

    /// Set [`RuntimeConfig::mode_threshold`]: largest inline reply of [`ReplyMode::Auto`],
    /// in bytes.
    pub fn with_mode_threshold(mut self, mode_threshold: usize) -> Self {
        self.mode_threshold = mode_threshold;
        self
    }

    /// Set [`RuntimeConfig::buffer_bytes`]: registered buffer per thread, in bytes.
    pub fn with_buffer_bytes(mut self, buffer_bytes: usize) -> Self {
        self.buffer_bytes = buffer_bytes;
        self
    }

    /// Set [`RuntimeConfig::max_transfer`]: largest single transfer, in bytes.
    pub fn with_max_transfer(mut self, max_transfer: usize) -> Self {
        self.max_transfer = max_transfer;
        self
    }

    /// Set [`RuntimeConfig::reconnect_give_up`]: how long a failed QP keeps trying to
    /// reconnect before its node is reported dead.
    pub fn with_reconnect_give_up(mut self, reconnect_give_up: Duration) -> Self {
        self.reconnect_give_up = reconnect_give_up;
        self
    }

    /// Check the settings. Errors: [`ConnectError::Config`] naming the field and rule.
    pub fn validate(&self) -> Result<(), ConnectError> {
        self.rocket.validate().map_err(ConnectError::Rocket)?;
        let bad = |what: &'static str| Err(ConnectError::Config(what));
        if self.sq_depth == 0 {
            return bad("sq-depth must be at least 1");
        }
        if self.threads_per_qp == 0 {
            return bad("threads-per-qp must be at least 1");
        }
        if self.call_timeout < Duration::from_millis(1) {
            return bad("call-timeout-ms must be at least 1");
        }
        if self.max_transfer == 0 || self.max_transfer > u32::MAX as usize {
            return bad("max-transfer must be between 1 byte and 4 GiB");
        }
        if self.buffer_bytes < self.max_transfer.next_power_of_two() {
            return bad(
                "buffer-bytes must hold one max-transfer chunk (rounded up to a power of two)",
            );
        }
        Ok(())
    }

    /// The straw settings these imply.
    pub fn straw_config(&self) -> StrawConfig {
        StrawConfig {
            threads_per_qp: self.threads_per_qp.max(1),
            sq_depth: self.sq_depth,
            connect_timeout: self.connect_timeout,
            reconnect_give_up: self.reconnect_give_up,
        }
    }
}

/// Per-call options.
#[derive(Clone, Copy, Debug, Default)]
pub struct CallOpts {
    /// How the reply travels (default [`ReplyMode::Auto`]).
    pub mode: ReplyMode,
    /// Expected (for [`ReplyMode::ZeroCopy`]: largest) reply size in bytes, if known.
    pub reply_len: Option<usize>,
    /// Deadline from issue to reply; `None` uses [`RuntimeConfig::call_timeout`].
    pub timeout: Option<Duration>,
}

impl CallOpts {
    /// Options forcing `mode`.
    pub fn mode(mode: ReplyMode) -> Self {
        Self {
            mode,
            ..Self::default()
        }
    }
}

/// One-sided work requests a thread posted to one node, by kind
/// ([`super::ThreadCtx::op_counts`]): what a protocol costs a memory node's NIC (Lotus's
/// claim, for one, is zero atomics at the memory nodes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpCounts {
    /// READs.
    pub reads: u64,
    /// WRITEs.
    pub writes: u64,
    /// Atomics (compare-and-swap, fetch-and-add).
    pub atomics: u64,
}

impl OpCounts {
    /// Count one WR of `opcode`.
    pub(crate) fn count(&mut self, opcode: &crate::fabric::WrOpcode) {
        use crate::fabric::WrOpcode;
        match opcode {
            WrOpcode::Read => self.reads += 1,
            WrOpcode::Write => self.writes += 1,
            WrOpcode::CmpSwap { .. } | WrOpcode::FetchAdd { .. } => self.atomics += 1,
            _ => {}
        }
    }

    /// Counter-wise sum.
    pub fn add(&mut self, o: &OpCounts) {
        self.reads += o.reads;
        self.writes += o.writes;
        self.atomics += o.atomics;
    }

    /// The counts accrued since `base`, an earlier snapshot of the same thread's
    /// counters (a benchmark's warm-up end), counter by counter (0 where one went back).
    pub fn since(&self, base: &OpCounts) -> OpCounts {
        OpCounts {
            reads: self.reads.saturating_sub(base.reads),
            writes: self.writes.saturating_sub(base.writes),
            atomics: self.atomics.saturating_sub(base.atomics),
        }
    }
}

/// Per-thread counters, readable by benchmarks.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    /// `post_send` calls (doorbells rung).
    pub doorbells: u64,
    /// WRs posted.
    pub wrs: u64,
    /// Rocket buckets written (one WRITE each).
    pub buckets: u64,
    /// RPC requests sent.
    pub messages: u64,
    /// Times a call waited because its Rocket had no free bucket (credit stall).
    pub credit_stalls: u64,
    /// Payload bytes moved by one-sided ops and RPC requests.
    pub bytes: u64,
    /// Rounds in which some WRs waited for send-queue room (posted the next round).
    pub sq_full: u64,
    /// Lists reported failed by a QP and replayed (Rocket buckets) or failed (one-sided).
    pub failed_lists: u64,
    /// Times a Rocket or the one-sided traffic moved to another QP of its straw.
    pub qp_switches: u64,
    /// Replies received inline in the response Rocket (pure RPC).
    pub inline_replies: u64,
    /// Replies fetched with a one-sided READ (RPC + READ mode).
    pub read_replies: u64,
    /// Replies the server WRITEs into the caller's buffer (zero-copy mode).
    pub zero_copy_replies: u64,
    /// Requests too large for a bucket, sent by reference for the server to READ.
    pub fetched_requests: u64,
    /// Calls whose reply buffer was found expired or reused (READ mode) or whose
    /// zero-copy trailer did not match: failed with [`super::CallError::Expired`].
    pub expired_replies: u64,
    /// Lists of one-sided WRs posted (each a doorbell whose last WR alone is signaled).
    pub one_sided_lists: u64,
    /// Signaled completions received for one-sided lists: equal to
    /// [`Stats::one_sided_lists`] once every list has completed, one per list.
    pub one_sided_completions: u64,
    /// Completions whose list had already finished (a list signaled more than once, or
    /// failed before its completion arrived): 0 in a healthy run.
    pub unmatched_completions: u64,
}

impl Stats {
    /// The counts accrued since `base`, an earlier snapshot of the same thread's
    /// counters (a benchmark's warm-up end), counter by counter (0 where one went back).
    pub fn since(&self, base: &Stats) -> Stats {
        let d = |now: u64, then: u64| now.saturating_sub(then);
        Stats {
            doorbells: d(self.doorbells, base.doorbells),
            wrs: d(self.wrs, base.wrs),
            buckets: d(self.buckets, base.buckets),
            messages: d(self.messages, base.messages),
            credit_stalls: d(self.credit_stalls, base.credit_stalls),
            bytes: d(self.bytes, base.bytes),
            sq_full: d(self.sq_full, base.sq_full),
            failed_lists: d(self.failed_lists, base.failed_lists),
            qp_switches: d(self.qp_switches, base.qp_switches),
            inline_replies: d(self.inline_replies, base.inline_replies),
            read_replies: d(self.read_replies, base.read_replies),
            zero_copy_replies: d(self.zero_copy_replies, base.zero_copy_replies),
            fetched_requests: d(self.fetched_requests, base.fetched_requests),
            expired_replies: d(self.expired_replies, base.expired_replies),
            one_sided_lists: d(self.one_sided_lists, base.one_sided_lists),
            one_sided_completions: d(self.one_sided_completions, base.one_sided_completions),
            unmatched_completions: d(self.unmatched_completions, base.unmatched_completions),
        }
    }

    /// Messages per bucket WRITE (msg batching factor).
    pub fn messages_per_write(&self) -> f64 {
        self.messages as f64 / self.buckets.max(1) as f64
    }
    /// WRs per doorbell (doorbell batching factor).
    pub fn wrs_per_doorbell(&self) -> f64 {
        self.wrs as f64 / self.doorbells.max(1) as f64
    }
    /// Counter-wise sum (for totals over threads).
    pub fn add(&mut self, o: &Stats) {
        self.doorbells += o.doorbells;
        self.wrs += o.wrs;
        self.buckets += o.buckets;
        self.messages += o.messages;
        self.credit_stalls += o.credit_stalls;
        self.bytes += o.bytes;
        self.sq_full += o.sq_full;
        self.failed_lists += o.failed_lists;
        self.qp_switches += o.qp_switches;
        self.inline_replies += o.inline_replies;
        self.read_replies += o.read_replies;
        self.zero_copy_replies += o.zero_copy_replies;
        self.fetched_requests += o.fetched_requests;
        self.expired_replies += o.expired_replies;
        self.one_sided_lists += o.one_sided_lists;
        self.one_sided_completions += o.one_sided_completions;
        self.unmatched_completions += o.unmatched_completions;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_defaults_and_validation() {
        let c: RuntimeConfig = toml::from_str("call-timeout-ms = 250\nbatching = \"msg\"").unwrap();
        assert_eq!(c.call_timeout, Duration::from_millis(250));
        assert_eq!(c.batching, Batching::Msg);
        assert_eq!(c.rocket, RocketConfig::default());
        c.validate().unwrap();
        assert!(toml::from_str::<RuntimeConfig>("no-such-key = 1").is_err());
        let bad = RuntimeConfig {
            sq_depth: 0,
            ..RuntimeConfig::default()
        };
        assert!(matches!(bad.validate(), Err(ConnectError::Config(m)) if m.contains("sq-depth")));
        let bad = RuntimeConfig {
            buffer_bytes: 1 << 20,
            ..RuntimeConfig::default()
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn since_subtracts_counter_by_counter_and_never_goes_below_zero() {
        let base = Stats {
            doorbells: 3,
            wrs: 10,
            unmatched_completions: 5,
            ..Stats::default()
        };
        let now = Stats {
            doorbells: 7,
            wrs: 25,
            messages: 4,
            ..Stats::default()
        };
        let d = now.since(&base);
        assert_eq!((d.doorbells, d.wrs, d.messages), (4, 15, 4));
        assert_eq!(d.unmatched_completions, 0);
        let ops = OpCounts {
            reads: 9,
            writes: 2,
            atomics: 1,
        };
        let b = OpCounts {
            reads: 4,
            writes: 2,
            atomics: 0,
        };
        assert_eq!(
            ops.since(&b),
            OpCounts {
                reads: 5,
                writes: 0,
                atomics: 1
            }
        );
    }
}
