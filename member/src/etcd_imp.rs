//! The etcd-backed implementation: a tokio current-thread runtime on a thread of its own runs
//! the client, the lease keepalive and the watches; the sync API hands it futures and waits
//! for their results on a channel, each bounded by a timeout.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KeyValue, PutOptions, Txn,
    TxnOp, TxnOpResponse, WatchOptions,
};

use crate::types::ttl_secs;
use crate::types::{Claimant, Keys, CLEAN_LEAVE};
use crate::{Event, MemberError, MemberInfo, MemberOptions, Role};

fn etcd(op: &'static str) -> impl FnOnce(etcd_client::Error) -> MemberError {
    move |source| MemberError::Etcd { op, source }
}

fn watch_ended(why: &str) -> MemberError {
    MemberError::Etcd {
        op: "watch a recovery",
        source: etcd_client::Error::WatchError(format!("the watch ended early: {why}")),
    }
}

fn is_not_found(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s) if s.code() == tonic::Code::NotFound)
}

/// etcd's "requested lease not found", or etcd-client's own report of a keepalive stream
/// opened on a lease whose first refresh came back with TTL 0.
fn is_lease_gone(e: &etcd_client::Error) -> bool {
    is_not_found(e)
        || matches!(e, etcd_client::Error::LeaseKeepAliveError(m) if m == "lease not found")
}

fn parse_info(kv: &KeyValue) -> Result<MemberInfo, MemberError> {
    serde_json::from_slice(kv.value()).map_err(|source| MemberError::BadMemberJson {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        source,
    })
}

/// The background thread and its runtime.
struct Runtime {
    handle: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: Receiver<()>,
    thread: Option<JoinHandle<()>>,
}

impl Runtime {
    fn start() -> Result<Self, MemberError> {
        let (handle_tx, handle_rx) = crossbeam_channel::bounded(1);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (done_tx, done_rx) = crossbeam_channel::bounded(1);
        let thread = std::thread::Builder::new()
            .name("member-etcd".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_io()
                    .enable_time()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = handle_tx.send(Err(e));
                        return;
                    }
                };
                let _ = handle_tx.send(Ok(rt.handle().clone()));
                // Runs every spawned task until stopped (or the member is dropped).
                rt.block_on(async {
                    let _ = stop_rx.await;
                });
                // Drops every task: the keepalive stops, watches close.
                rt.shutdown_timeout(Duration::from_millis(500));
                let _ = done_tx.send(());
            })
            .map_err(MemberError::Runtime)?;
        let handle = match handle_rx.recv() {
            Ok(Ok(h)) => h,
            Ok(Err(e)) => return Err(MemberError::Runtime(e)),
            Err(_) => return Err(MemberError::RuntimeGone),
        };
        Ok(Self {
            handle,
            stop: Some(stop_tx),
            done: done_rx,
            thread: Some(thread),
        })
    }

    /// Runs `fut` on the runtime and waits for it, `limit` at most.
    fn call<T, F>(&self, op: &'static str, limit: Duration, fut: F) -> Result<T, MemberError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, MemberError>> + Send + 'static,
    {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.handle.spawn(async move {
            let r = match tokio::time::timeout(limit, fut).await {
                Ok(r) => r,
                Err(_) => Err(MemberError::Timeout { op, after: limit }),
            };
            let _ = tx.send(r);
        });
        // The runtime's own timeout fires first; this one only guards a stalled runtime.
        match rx.recv_timeout(limit + Duration::from_secs(1)) {
            Ok(r) => r,
            Err(RecvTimeoutError::Timeout) => Err(MemberError::Timeout { op, after: limit }),
            Err(RecvTimeoutError::Disconnected) => Err(MemberError::RuntimeGone),
        }
    }

    /// Stops the runtime and joins its thread, waiting `limit` at most (after that the thread
    /// is left to finish alone).
    fn stop(&mut self, limit: Duration) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            if self.done.recv_timeout(limit).is_ok() {
                let _ = thread.join();
            } else {
                tracing::warn!("member-etcd thread did not stop in time; detached");
            }
        }
    }
}

pub(crate) struct Inner {
    rt: Runtime,
    client: Client,
    keys: Arc<Keys>,
    me: MemberInfo,
    lease_ttl: Duration,
    op_timeout: Duration,
    live: Arc<AtomicBool>,
}

impl Inner {
    pub(crate) fn join(
        endpoints: &[String],
        keys: Keys,
        role: Role,
        node: u16,
        ttl: Duration,
        opts: &MemberOptions,
    ) -> Result<Self, MemberError> {
        let op_timeout = opts.op_timeout;
        let rt = Runtime::start()?;
        let eps = endpoints.to_vec();
        let client = rt.call("connect", op_timeout, async move {
            let options = ConnectOptions::new().with_connect_timeout(op_timeout);
            Client::connect(&eps, Some(options))
                .await
                .map_err(|source| MemberError::Connect {
                    endpoints: eps.clone(),
                    source,
                })
        })?;
        let keys = Arc::new(keys);
        let ttl_s = ttl_secs(ttl);
        let mut c = client.clone();
        let lease = rt
            .call("grant lease", op_timeout, async move {
                c.lease_grant(ttl_s, None)
                    .await
                    .map_err(etcd("grant lease"))
            })
            .map_err(|e| match e {
                MemberError::Timeout { after, .. } => MemberError::Unreachable {
                    endpoints: endpoints.to_vec(),
                    after,
                },
                e => e,
            })?;
        let lease_id = lease.id();
        let lease_ttl = Duration::from_secs(lease.ttl().max(1) as u64);
        let info = MemberInfo {
            role,
            node,
            incarnation: 0,
            pid: std::process::id(),
            lease: lease_id,
        };
        let (c, k) = (client.clone(), keys.clone());
        let me = rt.call(
            "take an incarnation",
            op_timeout,
            take_incarnation(c, k, info),
        )?;
        let live = Arc::new(AtomicBool::new(true));
        rt.handle.spawn(keep_alive(
            client.clone(),
            lease_id,
            lease_ttl / 3,
            op_timeout,
            live.clone(),
        ));
        tracing::info!(
            node,
            incarnation = me.incarnation,
            lease = lease_id,
            ttl_s = lease_ttl.as_secs(),
            "joined"
        );
        Ok(Self {
            rt,
            client,
            keys,
            me,
            lease_ttl,
            op_timeout,
            live,
        })
    }

    pub(crate) fn info(&self) -> &MemberInfo {
        &self.me
    }

    pub(crate) fn lease_ttl(&self) -> Duration {
        self.lease_ttl
    }

    pub(crate) fn is_live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    pub(crate) fn events(&self) -> Result<Receiver<Event>, MemberError> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let (c, k) = (self.client.clone(), self.keys.clone());
        let handle = self.rt.handle.clone();
        self.rt.call("subscribe", self.op_timeout, async move {
            let (rev, stream) = subscribe(c.clone(), &k, &tx).await?;
            handle.spawn(forward(c, k, tx, rev, stream));
            Ok(())
        })?;
        Ok(rx)
    }

    pub(crate) fn members(&self) -> Result<Vec<MemberInfo>, MemberError> {
        let (mut c, k) = (self.client.clone(), self.keys.clone());
        self.rt.call("list members", self.op_timeout, async move {
            let resp = c
                .get(k.members_prefix(), Some(GetOptions::new().with_prefix()))
                .await
                .map_err(etcd("list members"))?;
            resp.kvs().iter().map(parse_info).collect()
        })
    }

    pub(crate) fn revoke(&self, node: u16, incarnation: u64) -> Result<bool, MemberError> {
        let mut c = self.client.clone();
        let key = self.keys.member(node, incarnation);
        self.rt
            .call("revoke a member", self.op_timeout, async move {
                let resp = c.get(key, None).await.map_err(etcd("read a member"))?;
                let Some(kv) = resp.kvs().first() else {
                    return Ok(false);
                };
                let info = parse_info(kv)?;
                match c.lease_revoke(info.lease).await {
                    Ok(_) => Ok(true),
                    Err(e) if is_not_found(&e) => Ok(false),
                    Err(source) => Err(MemberError::Etcd {
                        op: "revoke a lease",
                        source,
                    }),
                }
            })
    }

    pub(crate) fn claim_recovery(&self, node: u16, incarnation: u64) -> Result<bool, MemberError> {
        let mut c = self.client.clone();
        let claim = self.keys.recovery(node, incarnation);
        let member = self.keys.member(node, incarnation);
        let recovered = self.keys.recovered(node, incarnation);
        let ours = self.claimant_json();
        let lease = self.me.lease;
        self.rt
            .call("claim a recovery", self.op_timeout, async move {
                let txn = Txn::new()
                    .when([
                        Compare::version(claim.clone(), CompareOp::Equal, 0),
                        Compare::version(member.clone(), CompareOp::Equal, 0),
                        Compare::version(recovered.clone(), CompareOp::Equal, 0),
                    ])
                    .and_then([TxnOp::put(
                        claim.clone(),
                        ours.clone(),
                        Some(PutOptions::new().with_lease(lease)),
                    )])
                    .or_else([
                        TxnOp::get(claim, None),
                        TxnOp::get(member, None),
                        TxnOp::get(recovered, None),
                    ]);
                let resp = match c.txn(txn).await {
                    Ok(r) => r,
                    Err(e) if is_not_found(&e) => return Err(MemberError::LeaseLost),
                    Err(source) => {
                        return Err(MemberError::Etcd {
                            op: "claim a recovery",
                            source,
                        })
                    }
                };
                if resp.succeeded() {
                    return Ok(true);
                }
                let gets: Vec<Option<Vec<u8>>> = resp
                    .op_responses()
                    .into_iter()
                    .map(|r| match r {
                        TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.value().to_vec()),
                        _ => None,
                    })
                    .collect();
                if gets.get(1).is_some_and(Option::is_some) {
                    return Err(MemberError::StillLive { node, incarnation });
                }
                // Already ours (a retried claim) counts as won; anyone else's, or recovered, not.
                Ok(
                    gets.first().and_then(Option::as_deref) == Some(ours.as_bytes())
                        && gets.get(2).is_none_or(Option::is_none),
                )
            })
    }

    pub(crate) fn finish_recovery(
        &self,
        node: u16,
        incarnation: u64,
        summary: &str,
    ) -> Result<(), MemberError> {
        let mut c = self.client.clone();
        let claim = self.keys.recovery(node, incarnation);
        let recovered = self.keys.recovered(node, incarnation);
        let ours = self.claimant_json();
        let summary = summary.to_string();
        self.rt
            .call("finish a recovery", self.op_timeout, async move {
                let txn = Txn::new()
                    .when([Compare::value(claim.clone(), CompareOp::Equal, ours)])
                    .and_then([
                        TxnOp::put(recovered, summary, None),
                        TxnOp::delete(claim, None),
                    ]);
                let resp = c.txn(txn).await.map_err(etcd("finish a recovery"))?;
                if resp.succeeded() {
                    Ok(())
                } else {
                    Err(MemberError::NotClaimant { node, incarnation })
                }
            })
    }

    pub(crate) fn recovered(
        &self,
        node: u16,
        incarnation: u64,
    ) -> Result<Option<String>, MemberError> {
        let mut c = self.client.clone();
        let key = self.keys.recovered(node, incarnation);
        self.rt
            .call("read a recovery", self.op_timeout, async move {
                let resp = c.get(key, None).await.map_err(etcd("read a recovery"))?;
                Ok(resp
                    .kvs()
                    .first()
                    .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()))
            })
    }

    pub(crate) fn wait_recovered(
        &self,
        node: u16,
        incarnation: u64,
        timeout: Duration,
    ) -> Result<Option<String>, MemberError> {
        let mut c = self.client.clone();
        let key = self.keys.recovered(node, incarnation);
        let op_timeout = self.op_timeout;
        let limit = timeout + op_timeout;
        self.rt.call("wait for a recovery", limit, async move {
            let setup = async {
                let resp = c
                    .get(key.clone(), None)
                    .await
                    .map_err(etcd("read a recovery"))?;
                if let Some(kv) = resp.kvs().first() {
                    return Ok(Err(String::from_utf8_lossy(kv.value()).into_owned()));
                }
                let rev = resp.header().map_or(0, |h| h.revision());
                let opts = WatchOptions::new().with_start_revision(rev + 1);
                let stream = c
                    .watch(key.clone(), Some(opts))
                    .await
                    .map_err(etcd("watch a recovery"))?;
                Ok(Ok(stream))
            };
            let mut stream = match tokio::time::timeout(op_timeout, setup).await {
                Err(_) => {
                    return Err(MemberError::Timeout {
                        op: "watch a recovery",
                        after: op_timeout,
                    })
                }
                Ok(Err(e)) => return Err(e),
                Ok(Ok(Err(summary))) => return Ok(Some(summary)),
                Ok(Ok(Ok(stream))) => stream,
            };
            let wait = async {
                loop {
                    let Some(resp) = stream.message().await.map_err(etcd("watch a recovery"))?
                    else {
                        return Err(watch_ended("etcd closed the watch"));
                    };
                    for ev in resp.events() {
                        if let (EventType::Put, Some(kv)) = (ev.event_type(), ev.kv()) {
                            return Ok(Some(String::from_utf8_lossy(kv.value()).into_owned()));
                        }
                    }
                    if resp.canceled() {
                        return Err(watch_ended(resp.cancel_reason()));
                    }
                }
            };
            match tokio::time::timeout(timeout, wait).await {
                Ok(r) => r,
                Err(_) => Ok(None),
            }
        })
    }

    pub(crate) fn pending_recoveries(&self) -> Result<Vec<(u16, u64)>, MemberError> {
        let mut c = self.client.clone();
        let k = self.keys.clone();
        self.rt
            .call("list pending recoveries", self.op_timeout, async move {
                // One transaction: the four listings are one snapshot.
                let prefix = || Some(GetOptions::new().with_prefix().with_keys_only());
                let txn = Txn::new().and_then([
                    TxnOp::get(
                        k.incarnation_prefix(),
                        Some(GetOptions::new().with_prefix()),
                    ),
                    TxnOp::get(k.members_prefix(), prefix()),
                    TxnOp::get(k.recovery_prefix(), prefix()),
                    TxnOp::get(k.recovered_prefix(), prefix()),
                ]);
                let resp = c.txn(txn).await.map_err(etcd("list pending recoveries"))?;
                let mut lists = resp.op_responses().into_iter().map(|r| match r {
                    TxnOpResponse::Get(g) => g.kvs().to_vec(),
                    _ => Vec::new(),
                });
                let counters = lists.next().unwrap_or_default();
                let mut settled = std::collections::HashSet::new();
                for (list, prefix) in lists.zip([
                    k.members_prefix(),
                    k.recovery_prefix(),
                    k.recovered_prefix(),
                ]) {
                    for kv in list {
                        if let Some(id) = Keys::parse_node_incarnation(&prefix, kv.key()) {
                            settled.insert(id);
                        }
                    }
                }
                let mut pending = Vec::new();
                for kv in counters {
                    let key = String::from_utf8_lossy(kv.key()).into_owned();
                    let Some(node) = key
                        .strip_prefix(&k.incarnation_prefix())
                        .and_then(|n| n.parse::<u16>().ok())
                    else {
                        continue;
                    };
                    let last: u64 = String::from_utf8_lossy(kv.value()).parse().map_err(|_| {
                        MemberError::BadValue {
                            key: key.clone(),
                            reason: "the incarnation is not a number".into(),
                        }
                    })?;
                    pending.extend(
                        (1..=last)
                            .map(|i| (node, i))
                            .filter(|id| !settled.contains(id)),
                    );
                }
                pending.sort_unstable();
                Ok(pending)
            })
    }

    pub(crate) fn put_durable(&self, key: &str, value: Vec<u8>) -> Result<(), MemberError> {
        let mut c = self.client.clone();
        let key = self.keys.user(key);
        self.rt.call("put a key", self.op_timeout, async move {
            c.put(key, value, None).await.map_err(etcd("put a key"))?;
            Ok(())
        })
    }

    pub(crate) fn get(&self, key: &str) -> Result<Option<Vec<u8>>, MemberError> {
        let mut c = self.client.clone();
        let key = self.keys.user(key);
        self.rt.call("get a key", self.op_timeout, async move {
            let resp = c.get(key, None).await.map_err(etcd("get a key"))?;
            Ok(resp.kvs().first().map(|kv| kv.value().to_vec()))
        })
    }

    pub(crate) fn watch_key(&self, key: &str) -> Result<Receiver<Option<Vec<u8>>>, MemberError> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let c = self.client.clone();
        let key = self.keys.user(key);
        let handle = self.rt.handle.clone();
        self.rt.call("watch a key", self.op_timeout, async move {
            let (rev, stream) = open_key_watch(c.clone(), &key, &tx).await?;
            handle.spawn(forward_key(c, key, tx, rev, stream));
            Ok(())
        })?;
        Ok(rx)
    }

    pub(crate) fn leave(&self) -> Result<(), MemberError> {
        let mut c = self.client.clone();
        let recovered = self.keys.recovered(self.me.node, self.me.incarnation);
        let lease = self.me.lease;
        self.live.store(false, Ordering::Release);
        self.rt.call("leave", self.op_timeout, async move {
            c.put(recovered, CLEAN_LEAVE, None)
                .await
                .map_err(etcd("record a clean leave"))?;
            match c.lease_revoke(lease).await {
                Ok(_) => Ok(()),
                Err(e) if is_not_found(&e) => Err(MemberError::LeaseLost),
                Err(source) => Err(MemberError::Etcd {
                    op: "revoke our lease",
                    source,
                }),
            }
        })
    }

    fn claimant_json(&self) -> String {
        serde_json::to_string(&Claimant {
            node: self.me.node,
            incarnation: self.me.incarnation,
        })
        .expect("a claimant serializes")
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.rt.stop(self.op_timeout);
    }
}

/// Increments `/<cluster>/incarnation/<node>` with a compare-and-swap and puts the member key
/// (attached to the lease) in the same transaction, so every incarnation handed out has had a
/// member key, and so a Down event, a survivor can recover it from.
async fn take_incarnation(
    mut c: Client,
    keys: Arc<Keys>,
    mut info: MemberInfo,
) -> Result<MemberInfo, MemberError> {
    const ATTEMPTS: u32 = 64;
    let key = keys.incarnation(info.node);
    for _ in 0..ATTEMPTS {
        let resp = c
            .get(key.clone(), None)
            .await
            .map_err(etcd("read the incarnation"))?;
        let (prev, cmp) = match resp.kvs().first() {
            None => (0, Compare::version(key.clone(), CompareOp::Equal, 0)),
            Some(kv) => {
                let text = String::from_utf8_lossy(kv.value());
                let prev: u64 = text.parse().map_err(|_| MemberError::BadValue {
                    key: key.clone(),
                    reason: format!("incarnation {text:?} is not a number"),
                })?;
                let cmp = Compare::mod_revision(key.clone(), CompareOp::Equal, kv.mod_revision());
                (prev, cmp)
            }
        };
        info.incarnation = prev + 1;
        let value = serde_json::to_string(&info).expect("a member serializes");
        let txn = Txn::new().when([cmp]).and_then([
            TxnOp::put(key.clone(), info.incarnation.to_string(), None),
            TxnOp::put(
                keys.member(info.node, info.incarnation),
                value,
                Some(PutOptions::new().with_lease(info.lease)),
            ),
        ]);
        if c.txn(txn)
            .await
            .map_err(etcd("take an incarnation"))?
            .succeeded()
        {
            return Ok(info);
        }
    }
    Err(MemberError::IncarnationContended {
        node: info.node,
        attempts: ATTEMPTS,
    })
}

/// Refreshes the lease every `period` until it is gone or the runtime stops. A failed refresh
/// (etcd unreachable) is retried on the next tick with a new stream; the lease only dies when
/// etcd says so (a response with TTL 0, or "lease not found").
async fn keep_alive(
    mut c: Client,
    lease: i64,
    period: Duration,
    op_timeout: Duration,
    live: Arc<AtomicBool>,
) {
    let mut stream = None;
    loop {
        tokio::time::sleep(period).await;
        if !live.load(Ordering::Acquire) {
            return;
        }
        if stream.is_none() {
            match tokio::time::timeout(op_timeout, c.lease_keep_alive(lease)).await {
                Ok(Ok(s)) => stream = Some(s),
                Ok(Err(e)) if is_lease_gone(&e) => break,
                Ok(Err(e)) => {
                    tracing::warn!(lease, error = %e, "lease keepalive: cannot open a stream");
                    continue;
                }
                Err(_) => {
                    tracing::warn!(lease, "lease keepalive: opening a stream timed out");
                    continue;
                }
            }
        }
        let (keeper, responses) = stream.as_mut().expect("opened above");
        let refreshed = tokio::time::timeout(op_timeout, async {
            keeper.keep_alive().await?;
            responses.message().await
        })
        .await;
        match refreshed {
            Ok(Ok(Some(resp))) if resp.ttl() > 0 => {}
            Ok(Ok(Some(_))) => break,
            Ok(Err(e)) if is_lease_gone(&e) => break,
            other => {
                tracing::warn!(lease, ?other, "lease keepalive failed; retrying");
                stream = None;
            }
        }
    }
    live.store(false, Ordering::Release);
    tracing::warn!(lease, "our lease is gone: this incarnation is dead");
}

/// Sends an Up for each current member and opens a watch on the members' prefix from the
/// revision after that snapshot, so a subscriber sees every change exactly once.
async fn subscribe(
    mut c: Client,
    keys: &Keys,
    tx: &Sender<Event>,
) -> Result<(i64, etcd_client::WatchStream), MemberError> {
    let resp = c
        .get(keys.members_prefix(), Some(GetOptions::new().with_prefix()))
        .await
        .map_err(etcd("list members"))?;
    let rev = resp.header().map_or(0, |h| h.revision());
    for kv in resp.kvs() {
        match parse_info(kv) {
            Ok(info) => {
                let _ = tx.send(Event::Up(info));
            }
            Err(e) => tracing::warn!(error = %e, "skipping a member"),
        }
    }
    let stream = watch_members(&mut c, keys, rev + 1).await?;
    Ok((rev, stream))
}

async fn watch_members(
    c: &mut Client,
    keys: &Keys,
    from: i64,
) -> Result<etcd_client::WatchStream, MemberError> {
    let opts = WatchOptions::new()
        .with_prefix()
        .with_prev_key()
        .with_start_revision(from);
    let mut stream = c
        .watch(keys.members_prefix(), Some(opts))
        .await
        .map_err(etcd("watch members"))?;
    // The first response confirms the watch.
    match stream.message().await.map_err(etcd("watch members"))? {
        Some(r) if r.created() && !r.canceled() => Ok(stream),
        other => Err(MemberError::Etcd {
            op: "watch members",
            source: etcd_client::Error::WatchError(format!("watch not created: {other:?}")),
        }),
    }
}

/// Forwards watch events to a subscriber until it drops its receiver; a broken stream is
/// reopened from the revision after the last event seen.
async fn forward(
    mut c: Client,
    keys: Arc<Keys>,
    tx: Sender<Event>,
    mut rev: i64,
    stream: etcd_client::WatchStream,
) {
    let mut stream = Some(stream);
    loop {
        let Some(s) = stream.as_mut() else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            match watch_members(&mut c, &keys, rev + 1).await {
                Ok(s) => stream = Some(s),
                Err(e) => tracing::warn!(error = %e, "member watch: reopening failed"),
            }
            continue;
        };
        let resp = match s.message().await {
            Ok(Some(resp)) if !resp.canceled() => resp,
            other => {
                tracing::warn!(?other, "member watch broke; reopening");
                stream = None;
                continue;
            }
        };
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            rev = rev.max(kv.mod_revision());
            let event = match ev.event_type() {
                EventType::Put => match parse_info(kv) {
                    Ok(info) => Event::Up(info),
                    Err(e) => {
                        tracing::warn!(error = %e, "skipping a member");
                        continue;
                    }
                },
                EventType::Delete => {
                    match ev.prev_kv().map(parse_info) {
                        Some(Ok(info)) => Event::Down(info),
                        // Without the previous value (compacted away) the key still names it.
                        _ => {
                            let key = String::from_utf8_lossy(kv.key());
                            let Some((node, incarnation)) = keys.parse_member(&key) else {
                                continue;
                            };
                            Event::Down(MemberInfo {
                                role: Role::Other("unknown".into()),
                                node,
                                incarnation,
                                pid: 0,
                                lease: 0,
                            })
                        }
                    }
                }
            };
            if tx.send(event).is_err() {
                return; // The subscriber is gone; dropping the stream cancels the watch.
            }
        }
    }
}

/// Sends `key`'s current value and opens a watch on it from the revision after that read.
async fn open_key_watch(
    mut c: Client,
    key: &str,
    tx: &Sender<Option<Vec<u8>>>,
) -> Result<(i64, etcd_client::WatchStream), MemberError> {
    let resp = c.get(key, None).await.map_err(etcd("get a key"))?;
    let rev = resp.header().map_or(0, |h| h.revision());
    let _ = tx.send(resp.kvs().first().map(|kv| kv.value().to_vec()));
    let stream = watch_key_from(&mut c, key, rev + 1).await?;
    Ok((rev, stream))
}

async fn watch_key_from(
    c: &mut Client,
    key: &str,
    from: i64,
) -> Result<etcd_client::WatchStream, MemberError> {
    let opts = WatchOptions::new().with_start_revision(from);
    let mut stream = c
        .watch(key, Some(opts))
        .await
        .map_err(etcd("watch a key"))?;
    match stream.message().await.map_err(etcd("watch a key"))? {
        Some(r) if r.created() && !r.canceled() => Ok(stream),
        other => Err(MemberError::Etcd {
            op: "watch a key",
            source: etcd_client::Error::WatchError(format!("watch not created: {other:?}")),
        }),
    }
}

/// Forwards a key's changes (`Some(value)` for a put, `None` for a delete) until the
/// subscriber drops its receiver; a broken stream is reopened from the revision after
/// the last change seen (etcd keeps revisions across its restarts).
async fn forward_key(
    mut c: Client,
    key: String,
    tx: Sender<Option<Vec<u8>>>,
    mut rev: i64,
    stream: etcd_client::WatchStream,
) {
    let mut stream = Some(stream);
    loop {
        let Some(s) = stream.as_mut() else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            match watch_key_from(&mut c, &key, rev + 1).await {
                Ok(s) => stream = Some(s),
                Err(e) => tracing::debug!(error = %e, key, "key watch: reopening failed"),
            }
            continue;
        };
        let resp = match s.message().await {
            Ok(Some(resp)) if !resp.canceled() => resp,
            other => {
                tracing::debug!(?other, key, "key watch broke; reopening");
                stream = None;
                continue;
            }
        };
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            rev = rev.max(kv.mod_revision());
            let value = match ev.event_type() {
                EventType::Put => Some(kv.value().to_vec()),
                EventType::Delete => None,
            };
            if tx.send(value).is_err() {
                return;
            }
        }
    }
}
