//! `lockd`: the lock service of the workspace.
//!
//! It implements Scythe's **Takeout Lock** (Scythe, section 4.3,
//! Fig. 13 and 14), a fair, heat-aware ticket lock for disaggregated memory;
//! Lotus's sharded **lock tables** (Lotus, sections 4.1
//! to 4.3); and two baselines for comparison that use one-sided verbs only, with no
//! lock-service CPU: the CAS spinlock of FORD and FaRM, and DSLR (Yoon et al., SIGMOD'18).
//!
//! Layers, bottom up; a module imports only from those above it in this list (modules on
//! one line import neither each other nor anything below them):
//! - plain state machines and layouts, importing no other module: [`takeout`] (the
//!   Takeout Lock: layout, Lock RPC body, smoothed RTT, Hangout), [`lock_table`] (Lotus's
//!   read and write locks in 8-byte slots, a lock state of holders), [`shard`] (Lotus's
//!   lock keys with the shard in the low 12 bits, the versioned shard-to-node map,
//!   pass-by-range resharding; Lotus 4.2, 4.3), [`owners`] (which owner, a node and
//!   its incarnation, took each outstanding ticket), [`dslr`] (DSLR's four 16-bit
//!   counters in one word, driven by FAA, shared and exclusive modes, counter resets),
//!   [`backoff`] (randomized exponential backoff);
//! - [`cas`]: the CAS spinlock's word (one word, CAS to acquire with [`backoff`], WRITE
//!   of 0 to release);
//! - [`wire`] (the fixed-layout Takeout Lock RPC messages), [`table_wire`] (the lock
//!   table's batched messages), [`load`] (a node's load meter for one resharding
//!   interval and the sample it reports);
//! - [`error`]: [`error::LockError`], the errors of every lock client; [`epoch`]: the
//!   service's epoch persisted in a state directory (fencing a restarted service's
//!   predecessor's clients);
//! - [`service`]: the Takeout lock table in registered memory and its RPC handler;
//! - [`words`]: the baselines' lock words in registered memory; [`tso_bound`]: the
//!   oracle's issued high mark, read from its counter, bounding Lock RPC timestamps;
//! - [`ticket`]: a taken ticket as a value that must be released (Hangout + READ polling
//!   for its turn, FAA unlock; a dropped ticket is released by a coroutine of its own);
//! - [`client`]: the per-thread Takeout client coordinators use (Lock RPC, state READ,
//!   release of a failed incarnation's tickets, [`client::LockClient::release_node`];
//!   abandoning a Lock RPC it gave up on; reconnecting to a restarted service,
//!   [`client::LockConn`]);
//! - [`baseline`]: the CAS and DSLR clients;
//! - [`kinds`]: one client API over the three locks ([`kinds::LockKind`]), so a benchmark
//!   can swap them by name;
//! - [`table_service`]: the Lotus lock table served over rrpc for a node's shards, its
//!   client (grouping by node, wrong-shard retries), release of a failed node's locks
//!   ([`table_service::TableClient::release_node`]), and the driver of a resharding move;
//! - [`reshard`]: the periodic resharding loop (the decision over intervals as a plain
//!   state machine, and the coroutine that drives moves);
//! - [`embed`]: [`embed::LockService`], the whole service as one value (Takeout table,
//!   Lotus table, word tables, resharding loop), configured by
//!   [`embed::LockServiceConfig`] (the TOML file): the `lockd` binary runs one, and a
//!   compute-node process can embed one.
//!
//! The `lockd` binary serves a table over an `rrpc` node (and, with `--cas-locks` /
//! `--dslr-locks`, the baselines' word tables); the same [`service::LockTable`] can be
//! embedded in any process that runs an `rrpc` node; it also serves a Lotus lock table for
//! the shards given by `--shards` (Lotus's own placement, the table embedded in a compute
//! node, is [`table_service::TableService`] called directly). Locks of a crashed client are
//! passed on by [`client::LockClient::release_node`] (Takeout) and
//! [`table_service::TableClient::release_node`] (Lotus lock tables).
//!
//! Example: `examples/embedded_locks.rs`, a process embedding [`embed::LockService`] whose
//! client thread takes Takeout locks from two coroutines, served in ticket order.
#![warn(missing_docs)]

pub mod backoff;
pub mod baseline;
pub mod cas;
pub mod client;
pub mod dslr;
pub mod embed;
pub mod epoch;
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
pub mod tso_bound;
pub mod wire;
pub mod words;
