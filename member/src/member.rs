//! The public handle: one incarnation of one node, registered in etcd.

use std::time::Duration;

use crossbeam_channel::Receiver;

#[cfg(feature = "etcd")]
use crate::etcd_imp::Inner;
#[cfg(not(feature = "etcd"))]
use crate::stub_imp::Inner;
use crate::types::Keys;
use crate::types::MemberOptions;
use crate::{Event, MemberError, MemberInfo, Role};

/// One incarnation of one node of a cluster, registered in etcd under a lease that a
/// background thread keeps alive (see the crate docs for the key layout and the semantics).
///
/// Every method blocks the calling thread until etcd answered, at most
/// [`MemberOptions::op_timeout`] (except [`Member::wait_recovered`], which takes its own
/// timeout); none needs a tokio runtime.
///
/// Dropping a `Member` without [`Member::leave`] stops the keepalive (bounded wait) and leaves
/// the lease to expire: to the others that is a failure, seen within the lease's TTL, exactly
/// as if the process had died.
pub struct Member {
    inner: Inner,
}

// Members are shared between threads (a watcher thread, recovery workers).
const _: fn() = || {
    fn send_sync<T: Send + Sync + 'static>() {}
    send_sync::<Member>();
    send_sync::<MemberError>();
};

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member").field("info", self.info()).finish()
    }
}

impl Member {
    /// Joins `cluster` as `node` with `role`: takes the next incarnation of `node`, grants a
    /// lease of `ttl` and registers `/<cluster>/members/<node>/<incarnation>` under it.
    ///
    /// etcd leases are whole seconds: `ttl` is rounded up to whole seconds, and to 1 s at
    /// least; etcd itself may grant more (its minimum is 1.5 election timeouts, see the crate
    /// docs); [`Member::lease_ttl`] says what it granted. The lease is refreshed every third
    /// of that.
    ///
    /// # Errors
    /// [`MemberError::NoEtcdSupport`] without the `etcd` feature;
    /// [`MemberError::InvalidCluster`]; [`MemberError::Connect`] or
    /// [`MemberError::Unreachable`] when etcd cannot be reached; [`MemberError::Etcd`],
    /// [`MemberError::Timeout`] or [`MemberError::IncarnationContended`] on the way.
    pub fn join(
        endpoints: &[String],
        cluster: &str,
        role: Role,
        node: u16,
        ttl: Duration,
    ) -> Result<Member, MemberError> {
        Self::join_with(
            endpoints,
            cluster,
            role,
            node,
            ttl,
            &MemberOptions::default(),
        )
    }

    /// [`Member::join`] with options.
    ///
    /// # Errors
    /// As [`Member::join`].
    pub fn join_with(
        endpoints: &[String],
        cluster: &str,
        role: Role,
        node: u16,
        ttl: Duration,
        opts: &MemberOptions,
    ) -> Result<Member, MemberError> {
        let keys = Keys::new(cluster)?;
        let inner = Inner::join(endpoints, keys, role, node, ttl, opts)?;
        Ok(Member { inner })
    }

    /// Our own record (role, node, incarnation, pid, lease).
    pub fn info(&self) -> &MemberInfo {
        self.inner.info()
    }

    /// Our incarnation: 1 for a node's first join, larger than every earlier one after.
    pub fn incarnation(&self) -> u64 {
        self.inner.info().incarnation
    }

    /// Our node id.
    pub fn node(&self) -> u16 {
        self.inner.info().node
    }

    /// The lease's TTL as etcd granted it.
    pub fn lease_ttl(&self) -> Duration {
        self.inner.lease_ttl()
    }

    /// False once our lease is known gone (etcd answered a refresh with "expired" or "not
    /// found", or we left): this incarnation is dead to the cluster and must stop serving. A
    /// process that cannot reach etcd stays `true` until etcd says otherwise; fencing by
    /// incarnation, not this flag, is what makes a late actor harmless.
    pub fn is_live(&self) -> bool {
        self.inner.is_live()
    }

    /// A new subscription to membership changes: first an [`Event::Up`] for every member
    /// live at subscription time (ourselves included), then every [`Event::Up`] (join) and
    /// [`Event::Down`] (lease expired or revoked, or a clean leave) after that, in etcd's
    /// order, each once. Each call opens its own etcd watch; the subscription ends when the
    /// receiver is dropped (noticed at the next event) or the member is dropped. A broken
    /// watch is reopened from the last revision seen. The channel is unbounded: a subscriber
    /// that stops reading keeps its events in memory.
    ///
    /// # Errors
    /// [`MemberError::Etcd`] or [`MemberError::Timeout`] if the snapshot or the watch fails.
    pub fn events(&self) -> Result<Receiver<Event>, MemberError> {
        self.inner.events()
    }

    /// The members live now, ordered by key (node, then incarnation, as decimal strings).
    ///
    /// # Errors
    /// [`MemberError::Etcd`], [`MemberError::Timeout`], [`MemberError::BadMemberJson`].
    pub fn members(&self) -> Result<Vec<MemberInfo>, MemberError> {
        self.inner.members()
    }

    /// The fast path for a death seen through the fabric first: revokes the lease of
    /// `node`'s `incarnation` so that every member gets its [`Event::Down`] now rather than
    /// at the lease's expiry. Returns false if that incarnation was already gone.
    ///
    /// # Errors
    /// [`MemberError::Etcd`], [`MemberError::Timeout`], [`MemberError::BadMemberJson`].
    pub fn revoke(&self, node: u16, incarnation: u64) -> Result<bool, MemberError> {
        self.inner.revoke(node, incarnation)
    }

    /// Claims the recovery of a dead incarnation: creates
    /// `/<cluster>/recovery/<node>/<incarnation>` (value: our node and incarnation) under
    /// OUR lease, if no one holds it and the incarnation is neither live nor recovered yet.
    /// True for exactly one claimant (and again for it, if it asks twice). If the claimant
    /// dies, its lease takes the claim with it and another survivor can claim.
    ///
    /// # Errors
    /// [`MemberError::StillLive`] if that incarnation's member key still exists (revoke it
    /// first); [`MemberError::LeaseLost`] if our own lease is gone; [`MemberError::Etcd`],
    /// [`MemberError::Timeout`].
    pub fn claim_recovery(&self, node: u16, incarnation: u64) -> Result<bool, MemberError> {
        self.inner.claim_recovery(node, incarnation)
    }

    /// Records that the recovery we claimed is done: puts
    /// `/<cluster>/recovered/<node>/<incarnation>` = `summary` (durable, no lease) and
    /// releases the claim, atomically, only if the claim is still ours.
    ///
    /// # Errors
    /// [`MemberError::NotClaimant`] if the claim is not ours (any more);
    /// [`MemberError::Etcd`], [`MemberError::Timeout`].
    pub fn finish_recovery(
        &self,
        node: u16,
        incarnation: u64,
        summary: &str,
    ) -> Result<(), MemberError> {
        self.inner.finish_recovery(node, incarnation, summary)
    }

    /// The recovery summary of `node`'s `incarnation`, if it has been recovered (or left
    /// cleanly: [`Member::leave`] records `"clean leave"`).
    ///
    /// # Errors
    /// [`MemberError::Etcd`], [`MemberError::Timeout`].
    pub fn recovered(&self, node: u16, incarnation: u64) -> Result<Option<String>, MemberError> {
        self.inner.recovered(node, incarnation)
    }

    /// Waits up to `timeout` until `node`'s `incarnation` is recovered and returns its
    /// summary, or `None` at the timeout. A restarted node calls this for its earlier
    /// incarnations before it serves.
    ///
    /// # Errors
    /// [`MemberError::Etcd`] (also when etcd ends the watch early), [`MemberError::Timeout`]
    /// (etcd did not answer the initial read or watch within the operation timeout).
    pub fn wait_recovered(
        &self,
        node: u16,
        incarnation: u64,
        timeout: Duration,
    ) -> Result<Option<String>, MemberError> {
        self.inner.wait_recovered(node, incarnation, timeout)
    }

    /// Every dead incarnation that nobody recovers now: each `(node, incarnation)` up to the
    /// node's incarnation counter that has no live member key, no recovery claim and no
    /// recovered record, read in one snapshot, sorted. A survivor that lost a claim race calls
    /// this again on each Down (the winner may die, and its claim with it); a cluster that
    /// restarts calls it to find the incarnations that died while nobody watched. Clean
    /// leaves are recorded as recovered and never appear.
    ///
    /// # Errors
    /// [`MemberError::Etcd`], [`MemberError::Timeout`], [`MemberError::BadValue`].
    pub fn pending_recoveries(&self) -> Result<Vec<(u16, u64)>, MemberError> {
        self.inner.pending_recoveries()
    }

    /// Puts `/<cluster>/kv/<key>` = `value`, durable (no lease): replica views, epochs and
    /// other configuration that outlives processes.
    ///
    /// # Errors
    /// [`MemberError::Etcd`], [`MemberError::Timeout`].
    pub fn put_durable(&self, key: &str, value: impl Into<Vec<u8>>) -> Result<(), MemberError> {
        self.inner.put_durable(key, value.into())
    }

    /// Reads `/<cluster>/kv/<key>`.
    ///
    /// # Errors
    /// [`MemberError::Etcd`], [`MemberError::Timeout`].
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>, MemberError> {
        self.inner.get(key)
    }

    /// A subscription to `/<cluster>/kv/<key>`: first its value now (`None`: unset), then
    /// every change in etcd's order (`Some(value)` for a put, `None` for a delete), each
    /// once. A broken watch (etcd restarted) is reopened from the revision after the
    /// last change seen; the subscription ends when the receiver is dropped (noticed at
    /// the next change) or the member is dropped.
    ///
    /// # Errors
    /// [`MemberError::Etcd`] or [`MemberError::Timeout`] if the first read or the watch
    /// fails.
    pub fn watch_key(&self, key: &str) -> Result<Receiver<Option<Vec<u8>>>, MemberError> {
        self.inner.watch_key(key)
    }

    /// Leaves cleanly: records our incarnation as recovered (`"clean leave"`, so that nobody
    /// recovers it and a later incarnation does not wait for it), then revokes our lease, which
    /// deletes our member key (everyone sees our [`Event::Down`]), and stops the background
    /// thread.
    ///
    /// # Errors
    /// [`MemberError::LeaseLost`] if our lease was already gone (we had been declared dead;
    /// someone may be recovering us); [`MemberError::Etcd`], [`MemberError::Timeout`].
    pub fn leave(self) -> Result<(), MemberError> {
        self.inner.leave()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_rounds_up_to_whole_seconds() {
        assert_eq!(crate::types::ttl_secs(Duration::ZERO), 1);
        assert_eq!(crate::types::ttl_secs(Duration::from_millis(300)), 1);
        assert_eq!(crate::types::ttl_secs(Duration::from_secs(1)), 1);
        assert_eq!(crate::types::ttl_secs(Duration::from_millis(1001)), 2);
        assert_eq!(crate::types::ttl_secs(Duration::from_secs(5)), 5);
    }

    #[cfg(not(feature = "etcd"))]
    #[test]
    fn join_without_the_feature_says_how_to_get_it() {
        let e = Member::join(
            &["http://127.0.0.1:1".into()],
            "c",
            Role::Cnode,
            1,
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(matches!(e, MemberError::NoEtcdSupport));
        assert_eq!(
            e.to_string(),
            "built without the etcd client: rebuild with --features member/etcd (it needs protoc: Debian's protobuf-compiler)"
        );
    }
}
