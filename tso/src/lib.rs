//! `tso`: the timestamp oracle of the workspace (Scythe's RDMA-friendly
//! TSO, Scythe section 4.5).
//!
//! The oracle is one 64-bit counter in device memory (on the NIC, so that FAAs on it cost
//! no PCIe round trip on the oracle's host). Clients take timestamps with one-sided
//! fetch-and-add: one FAA of `n` reserves `n` consecutive timestamps. The oracle's CPU
//! never touches the counter (the rule for shared words: a word modified by RDMA atomics is never
//! modified by CPU atomics). Backends without device
//! memory (shm, Soft-RoCE) fall back to host memory and say so ([`oracle::Oracle::placement`]).
//!
//! A thread that must survive oracle restarts takes its timestamps through a [`TsoConn`]
//! ([`conn`]), which switches to the restarted oracle's new epoch.
//!
//! Concurrent requests can be combined into one FAA per group ([`group`]): a thread's
//! coroutines without locks or atomics ([`ThreadTso`], over any [`TimestampSource`]), a
//! process's threads under a mutex ([`GroupedTso`]).
//!
//! Guarantees: timestamps are `>= 1`, unique and strictly increasing in real time, across
//! restarts of an oracle that keeps a state directory: each start persists a larger epoch
//! before serving and puts it in the timestamps' high bits ([`epoch`], [`timestamp`]).
//!
//! TSO proxies ([`proxy`], the `tso-proxy` binary) merge the range requests of many
//! compute nodes into one FAA and limit the QPs on the oracle; clients choose among
//! proxies and the oracle and fail over ([`source`]).
//!
//! Layers, bottom up; a module imports only from those above it in this list (modules on
//! one line import neither each other nor anything below them):
//! - [`timestamp`]: a timestamp (epoch in the high 16 bits) and a range of them;
//! - [`epoch`] (the incarnation persisted before serving), [`history`] (the real-time
//!   linearizability checker and its clock), [`group`] (leader/follower combining as a
//!   state machine, and the group around it);
//! - [`error`]: [`TsoError`], the errors of the oracle, its clients, proxies and sources;
//! - [`export`]: what an oracle publishes (the counter word, placement, incarnation);
//! - [`timestamp_source`]: [`TimestampSource`], where a group's leader takes its range;
//! - [`client`]: [`TsoClient`], one FAA on one oracle incarnation's counter;
//! - [`conn`]: following the oracle across restarts ([`OracleFollower`], [`TsoConn`]);
//! - [`proxy`]: the TSO proxy and its client;
//! - [`source`]: [`TsoSources`], choosing among proxies and the oracle with failover;
//! - [`grouped`] (the process tier of groups, [`GroupedTso`]) and [`thread_tso`] (the
//!   thread tier, [`ThreadTso`], generic over its [`TimestampSource`]);
//! - [`oracle`]: the counter itself ([`Oracle`]); it re-exports the client-side types
//!   that once lived in it under their old paths.
//!
//! Example: `examples/tso_client.rs`, an [`Oracle`] started in-process and a client
//! thread's coroutines taking timestamps through a [`ThreadTso`] over a [`TsoConn`], the
//! history checked with [`history::check`].
#![warn(missing_docs)]

pub mod client;
pub mod conn;
pub mod epoch;
pub mod error;
pub mod export;
pub mod group;
pub mod grouped;
pub mod history;
pub mod oracle;
pub mod proxy;
pub mod source;
pub mod thread_tso;
pub mod timestamp;
pub mod timestamp_source;

pub use client::TsoClient;
pub use conn::{OracleFollower, ReconnectConfig, TsoConn};
pub use error::TsoError;
pub use export::{TsoExport, EXPORT_NAME};
pub use group::{GroupFailure, GroupStats, TsoGroup};
pub use grouped::GroupedTso;
pub use oracle::Oracle;
pub use proxy::{Proxy, ProxyClient, ProxyConfig};
pub use source::{Choice, SourceConfig, TsoSources};
pub use thread_tso::{LeaderError, ThreadTso, ThreadTsoError, THREAD_RANGES_IN_FLIGHT};
pub use timestamp::{Timestamp, TimestampRange};
pub use timestamp_source::TimestampSource;
