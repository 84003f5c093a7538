//! Membership, incarnations, leases, failure events and recovery claims through etcd, as FaRM
//! keeps its configuration in ZooKeeper (and TiDB's PD in etcd).
//!
//! A process [`Member::join`]s a cluster as a node id with a [`Role`]; it gets an
//! **incarnation** (1 for the node's first join, larger than every earlier one after, across
//! restarts and crashes) and registers itself under an etcd **lease** that a background
//! thread keeps alive. Survivors watch the registrations ([`Member::events`]): the
//! disappearance of a registration is a failure every survivor sees, in the same order,
//! because etcd decided it once.
//!
//! ```no_run
//! use std::time::Duration;
//! use member::{Event, Member, Role};
//!
//! # fn main() -> Result<(), member::MemberError> {
//! let etcd = vec!["http://127.0.0.1:2379".to_string()];
//! let me = Member::join(&etcd, "prod", Role::Cnode, 3, Duration::from_secs(1))?;
//! // A restarted node serves only once its earlier incarnations are recovered.
//! for old in 1..me.incarnation() {
//!     me.wait_recovered(3, old, Duration::from_secs(30))?;
//! }
//! let events = me.events()?;
//! while let Ok(ev) = events.recv() {
//!     if let Event::Down(dead) = ev {
//!         if me.claim_recovery(dead.node, dead.incarnation)? {
//!             // ... roll its transactions forward or back, release its locks ...
//!             me.finish_recovery(dead.node, dead.incarnation, "rolled back 2")?;
//!         }
//!     }
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Key layout
//!
//! Everything lives under `/<cluster>/` (the cluster name is non-empty and has no `/`):
//!
//! | key | value | lease |
//! | --- | --- | --- |
//! | `incarnation/<node>` | the node's last incarnation, decimal | none |
//! | `members/<node>/<incarnation>` | [`MemberInfo`] as JSON: role, node, incarnation, pid, lease id | the member's |
//! | `recovery/<node>/<incarnation>` | the claimant's `{"node":..,"incarnation":..}` | the claimant's |
//! | `recovered/<node>/<incarnation>` | the recovery summary (`"clean leave"` after [`Member::leave`]) | none |
//! | `kv/<key>` | [`Member::put_durable`]'s value | none |
//!
//! Joining increments `incarnation/<node>` with a compare-and-swap transaction and puts the
//! member key in that same transaction, so every incarnation ever handed out has had a member
//! key, and so a Down event that someone can act on.
//!
//! # What a lease expiry means
//!
//! A member's key is attached to its lease. The lease ends when the member stops refreshing
//! it (the process died, paused, or lost etcd for longer than the TTL), when it leaves
//! ([`Member::leave`]), or when a survivor revokes it ([`Member::revoke`]). Then etcd deletes
//! the key, and every watcher gets [`Event::Down`] with the member's last record (the watch
//! asks for the previous value). To the cluster that incarnation is dead from then on, whether
//! or not the process still runs: a paused process that wakes finds [`Member::is_live`] false,
//! and anything it still does is refused by fencing, because ownership (lock words, tickets,
//! lock-table holders) names `(node, incarnation)` and nothing from an older incarnation is
//! accepted. It may join again for a new incarnation. Dropping a [`Member`] without leaving
//! is a crash as far as the others can tell: its lease expires.
//!
//! # The 1 s minimum, and the local etcd's timing
//!
//! etcd leases are whole seconds, so a TTL is rounded up, and 1 s is the least. etcd also
//! refuses to grant less than 1.5 election timeouts (rounded up to a second), since a new
//! leader must be able to keep a lease its predecessor granted: with etcd's default
//! heartbeat of 100 ms and election timeout of 1000 ms, the least lease is 2 s.
//! [`LocalEtcd`] therefore runs with `--heartbeat-interval 10 --election-timeout 100` (ms),
//! for which 1 s leases work. The leader checks for expired leases about every 500 ms, so a
//! Down after an expiry comes within roughly TTL + 0.5 s.
//!
//! # The fast path: revoke on a death seen through the fabric
//!
//! A second is long for RDMA. A survivor that sees a death through the fabric first (the shm
//! backend's liveness lock, a verbs control connection closing) calls [`Member::revoke`] with
//! the dead `(node, incarnation)`: the lease goes at once and every member gets the Down now.
//! The lease's expiry remains the catch-all for what the fabric cannot see (a paused or
//! partitioned process). Revoking on a false suspicion is safe: the suspect is fenced and
//! rejoins with a new incarnation.
//!
//! # Recovery
//!
//! On a Down, survivors race to [`Member::claim_recovery`]; exactly one wins. Its claim is
//! attached to its own lease, so if the recoverer dies too, the claim vanishes with it and
//! another survivor claims. The winner recovers, then [`Member::finish_recovery`] records a
//! durable summary. A restarted node, before it serves, [`Member::wait_recovered`] for its
//! earlier incarnations (incarnations that left cleanly are recorded as recovered).
//!
//! # Sync API over an async client
//!
//! The etcd client (`etcd-client`, on tonic) is async; this crate runs it on a tokio
//! current-thread runtime on a thread of its own (`member-etcd`) and exposes blocking calls,
//! each bounded by [`MemberOptions::op_timeout`] (2 s by default), and crossbeam-channel
//! receivers for events. Callers need no tokio.
//!
//! # Features
//!
//! `etcd` (off by default) compiles the client, which needs `protoc` (Debian's
//! `protobuf-compiler`). Without it the crate exposes the same types and
//! [`Member::join`] returns [`MemberError::NoEtcdSupport`]. [`LocalEtcd`], which only starts
//! a process, works either way; it needs Debian's `etcd-server` (3.4's v3 API is enough).

mod error;
#[cfg(feature = "etcd")]
mod etcd_imp;
mod fencer;
mod local;
mod member;
#[cfg(not(feature = "etcd"))]
mod stub_imp;
mod types;

pub use crossbeam_channel::{Receiver, RecvTimeoutError};
pub use error::{EtcdError, MemberError};
pub use fencer::{join_and_fence, spawn_fencer, wait_fenced};
pub use local::LocalEtcd;
pub use member::Member;
pub use types::{Event, MemberInfo, MemberOptions, Role, CLEAN_LEAVE};
