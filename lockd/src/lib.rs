//! `lockd`: the lock service of the workspace (DESIGN.md, "lockd").
//!
//! Today this crate implements Scythe's **Takeout Lock**
//! (`shared/seeds/000_f3dba2ed893b246b.txt`, section 4.3, Fig. 13 and 14): a fair,
//! heat-aware ticket lock for disaggregated memory.
//!
//! - [`takeout`]: the lock as a plain state machine (layout, Lock RPC body, smoothed RTT,
//!   Hangout), tested without a fabric;
//! - [`wire`]: the fixed-layout Lock RPC messages;
//! - [`service`]: the lock table in registered memory and its RPC handler;
//! - [`client`]: the per-thread client coordinators use (Lock RPC, state READ);
//! - [`lock_table`]: Lotus's lock table (read and write locks in 8-byte slots, a lock
//!   state of holders);
//! - [`table_service`], [`table_wire`]: the lock table served over rrpc for a node's
//!   shards with batched messages, its client (grouping by node, wrong-shard retries),
//!   release of a failed node's locks, and the driver of a resharding move;
//! - [`reshard`]: the periodic resharding loop (per-node load meters, the decision over
//!   intervals as a plain state machine, and the coroutine that drives moves);
//! - [`shard`]: Lotus's lock keys (shard in the low 12 bits), the versioned shard-to-node
//!   map, and pass-by-range resharding as plain state machines (Lotus 4.2, 4.3);
//! - [`ticket`]: a taken ticket as a value that must be released (Hangout + READ polling
//!   for its turn, FAA unlock; a dropped ticket is released by a coroutine of its own);
//! - [`owners`]: which node took each outstanding ticket, so a survivor can pass on a
//!   failed node's tickets ([`client::LockClient::release_node`]).
//!
//! Two baselines for comparison use one-sided verbs only, with no lock-service CPU:
//!
//! - [`cas`]: the CAS spinlock of FORD and FaRM (one word, CAS to acquire with randomized
//!   exponential [`backoff`], WRITE of 0 to release);
//! - [`dslr`]: DSLR (Yoon et al., SIGMOD'18), a bakery lock of four 16-bit counters in one
//!   word driven by FAA, with shared and exclusive modes and counter resets;
//! - [`words`]: their lock words in registered memory; [`baseline`]: their clients;
//! - [`kinds`]: one client API over the three locks ([`kinds::LockKind`]), so a benchmark
//!   can swap them by name.
//!
//! [`embed::LockService`] is the whole service as one value (Takeout table, Lotus table,
//! word tables, resharding loop), configured by [`embed::LockServiceConfig`] (the TOML
//! file): the `lockd` binary runs one, and a compute-node process can embed one.
//!
//! The `lockd` binary serves a table over an `rrpc` node (and, with `--cas-locks` /
//! `--dslr-locks`, the baselines' word tables); the same [`service::LockTable`] can be
//! embedded in any process that runs an `rrpc` node; it also serves a Lotus lock table for
//! the shards given by `--shards` (Lotus's own placement, the table embedded in a compute
//! node, is [`table_service::TableService`] called directly). Locks of a crashed client are
//! passed on by [`client::LockClient::release_node`] (Takeout) and
//! [`table_service::TableClient::release_node`] (Lotus lock tables).
#![warn(missing_docs)]

pub mod backoff;
pub mod baseline;
pub mod cas;
pub mod client;
pub mod dslr;
pub mod embed;
pub mod error;
pub mod kinds;
pub mod load;
pub mod lock_table;
pub mod owners;
pub mod reshard;
pub mod service;
pub mod shard;
pub mod table_service;
pub mod table_wire;
pub mod takeout;
pub mod ticket;
pub mod wire;
pub mod words;
