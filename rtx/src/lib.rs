//! rTX: repairable transactions on disaggregated memory, after "Transactional Indexes on
//! (RDMA or CXL-based) Disaggregated Memory with Repairable Transaction" (sections 3-4).
//!
//! Clients on compute nodes run optimistic transactions over objects on one memory node,
//! using only one-sided READ, WRITE and CAS. A client that fails mid-commit leaves its
//! locks (LLLocks, lease locks naming its log); whoever meets an expired one repairs it by
//! re-executing the failed commit from the log, which is idempotent because every step is
//! a CAS expecting a value unique to that rTX. No coordination service, no fencing.
//!
//! Modules, one concept each, bottom up:
//!
//! - [`lllock`], [`lease`], [`dptr`], [`log`], [`layout`]: words, leases and layouts
//!   (sans-IO codecs);
//! - [`mem`]: the memory node as a trait of one-sided operations, with an in-memory
//!   implementation; [`rrpc_mem`]: the same over rrpc's one-sided operations; [`host`]:
//!   a memory node's region and its export;
//! - [`alloc`]: the data-pool allocator (bitmap, incarnations, reclamation table);
//! - [`client`] (IDs, leases, allocator of one coroutine), [`trycommit`] (the idempotent
//!   commit steps shared by owners and repairers), [`repair`] (every log state, Opt1,
//!   restart), [`txn`] (execution, Opt2 pre-lock), [`commit`] (validation, TryCommit by
//!   the owner, Opt1);
//! - [`blink`]: a Sherman-style B-link tree whose nodes are rTX objects (section 5), with
//!   its Optimal (Sherman's locking) and DTX-style baselines and a structural checker;
//! - [`fault`]: crash points and planted repair bugs that process-level tests arm
//!   (`Client::arm_crash`, `Client::plant`; only with the `fault-injection` feature);
//! - [`race`]: RACE hashing whose subtables are rTX objects and whose rehash is an rTX
//!   (section 5), with its Optimal baseline (RACE's spinlocked rehash) and a checker.
//!
//! The protocol is written once, as async functions generic over [`mem::Mem`]; unit tests
//! and a model checker (module `model`, test builds) run it without a fabric.

pub mod alloc;
pub mod blink;
pub mod client;
pub mod commit;
pub mod dptr;
pub mod error;
pub mod fault;
pub mod host;
pub mod layout;
pub mod lease;
pub mod lllock;
pub mod log;
pub mod mem;
pub mod race;
pub mod repair;
pub mod rrpc_mem;
pub mod trycommit;
pub mod txn;

#[cfg(test)]
mod model;
#[cfg(test)]
mod model_trycommit;
#[cfg(test)]
mod shm_tests;
#[cfg(test)]
mod tests;

pub use client::{Client, Config, Stats};
pub use error::{AbortReason, RtxError};
pub use layout::Layout;
pub use repair::RepairOutcome;
pub use txn::Tx;
