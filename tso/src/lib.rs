//! `tso`: the timestamp oracle of the workspace (DESIGN.md, "tso"; Scythe's RDMA-friendly
//! TSO, `shared/seeds/000_f3dba2ed893b246b.txt` section 4.5).
//!
//! The oracle is one 64-bit counter in device memory (on the NIC, so that FAAs on it cost
//! no PCIe round trip on the oracle's host). Clients take timestamps with one-sided
//! fetch-and-add: one FAA of `n` reserves `n` consecutive timestamps. The oracle's CPU
//! never touches the counter (DESIGN.md's rule for shared words). Backends without device
//! memory (shm, Soft-RoCE) fall back to host memory and say so ([`oracle::Oracle::placement`]).
//!
//! A thread that must survive oracle restarts takes its timestamps through a [`TsoConn`]
//! ([`conn`]), which switches to the restarted oracle's new epoch.
//!
//! Concurrent requests can be combined into one FAA per group ([`group`]): a thread's
//! coroutines without locks or atomics ([`ThreadTso`]), a process's threads under a
//! mutex ([`GroupedTso`]).
//!
//! Guarantees: timestamps are `>= 1`, unique and strictly increasing in real time, across
//! restarts of an oracle that keeps a state directory: each start persists a larger epoch
//! before serving and puts it in the timestamps' high bits ([`epoch`], [`timestamp`]).
//!
//! TSO proxies ([`proxy`], the `tso-proxy` binary) merge the range requests of many
//! compute nodes into one FAA and limit the QPs on the oracle; clients choose among
//! proxies and the oracle and fail over ([`source`]).
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
