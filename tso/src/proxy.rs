//! TSO proxy (Scythe, section 4.5 (3) and
//! Fig. 18): a process between the compute nodes and the oracle. Compute nodes' TSO group
//! leaders send it range requests over rrpc; it merges the concurrent ones, from all its
//! server threads and all compute nodes, into one FAA on the oracle ([`crate::group`]: a TSO group whose members ask for ranges),
//! and answers each with its sub-range.
//!
//! Why: every compute node that FAAs the oracle directly holds RC QPs on the oracle's
//! RNIC, whose QP state competes for the NIC's small on-chip memory. A proxy holds at
//! most [`ProxyConfig::oracle_qps`] QPs on the oracle however many compute nodes it
//! serves.
//!
//! **Never prefetches, never caches**: the FAA that serves a request is issued after the
//! request arrived, so a request that starts after another one finished (at any proxy,
//! or directly at the oracle) gets a larger timestamp. A proxy that kept a range for
//! later requests would break that (`Proxy::start_prefetching` exists in test builds to
//! show the checker catching it).
//!
//! **Following an oracle restart.** The server threads take their ranges through one
//! [`OracleFollower`] (the mechanism of [`crate::TsoConn`], shared by the threads): when
//! an FAA fails because the oracle died, the thread re-reads the oracle's export at its
//! bootstrap address (every [`ProxyConfig::oracle_retry_ms`], for at most
//! [`ProxyConfig::oracle_wait_ms`]) and switches every thread to the new incarnation if
//! its epoch is larger ([`crate::epoch`]); then it retries the FAA. Requests arriving
//! meanwhile queue behind that FAA (no range is kept for them: the retried FAA, too, is
//! issued after they arrived). An oracle that came back with an epoch that is not larger
//! is refused ([`TsoError::WentBack`], logged and counted in [`ProxyStats::went_back`]):
//! no range is taken from it.
//!
//! **Highest timestamp issued** (Scythe: the proxy "maintains the currently maximum
//! timestamps assigned"). The proxy remembers the last timestamp of every range it took
//! ([`Highest`]) and refuses a range from the oracle that does not start above it
//! ([`TsoError::Regression`], logged and counted in [`ProxyStats::regressions`]), and
//! from then on every range of that epoch. This is the second check after the epoch: it
//! catches an oracle that went back under an export the epoch check takes for the
//! running incarnation (same epoch, counter address and key: verbs device memory is
//! zero-based, so an oracle run without `--state-dir` can produce that). Scythe also
//! uses this maximum to recover the oracle; this crate restarts the oracle from its
//! durable epoch instead.
//!
//! **Limits.** The maximum lives in memory only: a proxy restarted together with an
//! oracle that lost its state starts from 0 and cannot catch the regression (neither can
//! clients that FAA the oracle directly); the durable epoch is the guarantee, the maximum
//! a second check for this proxy's clients. The oracle must come back at the same
//! bootstrap address. Re-reading the export is a blocking control-plane call on the
//! server thread (a refused connection, the usual case while the oracle is down, returns
//! at once; an unreachable host takes the runtime's connect timeout), during which that
//! thread serves nothing else. Clients whose call deadline passes while the proxy waits
//! fail over to other sources ([`crate::source`]).
//!
//! Wire format of the range RPC ([`RANGE_HANDLER`], the typed [`RangeRpc`]): request [`RangeRequest`] (8 bytes),
//! reply [`RangeReply`] (16 bytes), little-endian fixed layouts.

use rrpc::NodeId;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rrpc::ctrl::QpKind;
use rrpc::fabric::Fabric;
use rrpc::node::{node_info, Node, NodeConfig, RpcSettings, ServerRuntime};
use rrpc::runtime::{CallOpts, ThreadCtx};
use rrpc::server::Handlers;
use rrpc::straw::Straws;
use rrpc::typed::{decode_response, encode_request, Fixed, Rpc};
use serde::{Deserialize, Serialize};
use zerocopy::little_endian::U64;
use zerocopy::{FromBytes, Immutable, IntoBytes};

use crate::client::TsoClient;
use crate::conn::{OracleFollower, ReconnectConfig};
use crate::error::TsoError;
use crate::group::{GroupStats, TsoGroup};
use crate::timestamp::{Timestamp, TimestampRange};

/// Name under which a proxy publishes its [`ProxyExport`].
pub const PROXY_EXPORT: &str = "tso-proxy";
/// Handler id of the range RPC on a proxy.
pub const RANGE_HANDLER: u16 = 60;
const _: () = assert!(rrpc::server::ids::TSO.contains(RANGE_HANDLER));
/// Largest count one range request may ask for (default of [`ProxyConfig::max_range`]).
pub const DEFAULT_MAX_RANGE: u64 = 1 << 20;

/// Range request: `count` consecutive timestamps (`1 ..= max_range`). Wire layout: one
/// little-endian u64 at offset 0, 8 bytes.
#[derive(FromBytes, IntoBytes, Immutable, Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct RangeRequest {
    /// Timestamps asked for.
    pub count: U64,
}

/// Range reply: the timestamps `first .. first + count`. Wire layout: `first` at offset
/// 0, `count` at offset 8, little-endian u64s, 16 bytes.
#[derive(FromBytes, IntoBytes, Immutable, Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct RangeReply {
    /// First timestamp of the range (raw value).
    pub first: U64,
    /// Timestamps in the range (the request's count).
    pub count: U64,
}

const _: () = assert!(std::mem::size_of::<RangeRequest>() == 8);
const _: () = assert!(std::mem::size_of::<RangeReply>() == 16);
const _: () = assert!(std::mem::offset_of!(RangeReply, count) == 8);

/// The range RPC ([`RANGE_HANDLER`]): [`RangeRequest`] in, [`RangeReply`] out, fixed
/// layouts.
pub struct RangeRpc;

impl Rpc for RangeRpc {
    const ID: u16 = RANGE_HANDLER;
    type Req = RangeRequest;
    type Resp = RangeReply;
    type Codec = Fixed;
}

/// What a proxy exports to its clients (JSON on the control plane).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxyExport {
    /// Node id of the oracle the proxy takes its ranges from.
    pub oracle_node: NodeId,
    /// That oracle's epoch ([`crate::epoch`]) when the proxy started (the proxy follows
    /// later incarnations; [`ProxyStats::oracle_epoch`] is the one in use).
    pub epoch: u16,
    /// Handler id of the range RPC.
    pub handler: u16,
    /// Largest count one request may ask for.
    pub max_range: u64,
}

/// Settings of a proxy. As TOML (the `tso-proxy` binary's `--config`), keys are
/// kebab-case and each may be left out for its default.
///
/// Non-exhaustive, so that a setting can be added without breaking the crates that embed
/// this one: outside this crate, start from [`Default::default`] and chain the `with_*`
/// setters (or assign the public fields on a `let mut` binding).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
#[non_exhaustive]
pub struct ProxyConfig {
    /// RPC server threads serving range requests (default 1; 1 to 256).
    pub threads: usize,
    /// Largest number of QPs the proxy opens on the oracle (default 1; 1 to `threads`).
    /// The server threads share them: `ceil(threads / oracle_qps)` threads per QP.
    pub oracle_qps: usize,
    /// Largest count one range request may ask for (default 2^20; at least 1).
    /// Larger requests are refused.
    pub max_range: u64,
    /// Longest time, in milliseconds, the proxy waits for a dead oracle to come back
    /// (at its bootstrap address) before failing the FAA it was issuing, and with it the
    /// requests merged into it (default 30 000; 1 to 3 600 000). Requests that arrive
    /// meanwhile queue behind that FAA. Clients usually time out sooner and fail over.
    pub oracle_wait_ms: u64,
    /// Pause, in milliseconds, between two attempts to read a restarted oracle's export
    /// (default 10; 1 to 10 000).
    pub oracle_retry_ms: u64,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            threads: 1,
            oracle_qps: 1,
            max_range: DEFAULT_MAX_RANGE,
            oracle_wait_ms: 30_000,
            oracle_retry_ms: 10,
        }
    }
}

impl ProxyConfig {
    /// Set [`ProxyConfig::threads`]: RPC server threads serving range requests (default 1; 1 to
    /// 256).
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }

    /// Set [`ProxyConfig::oracle_qps`]: largest number of QPs the proxy opens on the oracle
    /// (default 1; 1 to `threads`).
    pub fn with_oracle_qps(mut self, oracle_qps: usize) -> Self {
        self.oracle_qps = oracle_qps;
        self
    }

    /// Set [`ProxyConfig::max_range`]: largest count one range request may ask for (default
    /// 2^20; at least 1).
    pub fn with_max_range(mut self, max_range: u64) -> Self {
        self.max_range = max_range;
        self
    }

    /// Set [`ProxyConfig::oracle_wait_ms`]: longest time, in milliseconds, the proxy waits for
    /// a dead oracle to come back (at its bootstrap address) before failing the FAA it was
    /// issuing, and with it the requests merged into it (default 30 000; 1 to 3 600 000).
    pub fn with_oracle_wait_ms(mut self, oracle_wait_ms: u64) -> Self {
        self.oracle_wait_ms = oracle_wait_ms;
        self
    }

    /// Set [`ProxyConfig::oracle_retry_ms`]: pause, in milliseconds, between two attempts to
    /// read a restarted oracle's export (default 10; 1 to 10 000).
    pub fn with_oracle_retry_ms(mut self, oracle_retry_ms: u64) -> Self {
        self.oracle_retry_ms = oracle_retry_ms;
        self
    }

    /// Check the settings. Errors: [`TsoError::Config`] naming the key and the rule.
    pub fn validate(&self) -> Result<(), TsoError> {
        let bad = |s: String| Err(TsoError::Config(s));
        if !(1..=256).contains(&self.threads) {
            return bad(format!("threads: {} is not in 1..=256", self.threads));
        }
        if !(1..=self.threads).contains(&self.oracle_qps) {
            return bad(format!(
                "oracle-qps: {} is not in 1..=threads ({})",
                self.oracle_qps, self.threads
            ));
        }
        if self.max_range == 0 {
            return bad("max-range: at least 1".into());
        }
        if !(1..=3_600_000).contains(&self.oracle_wait_ms) {
            return bad(format!(
                "oracle-wait-ms: {} is not in 1..=3600000",
                self.oracle_wait_ms
            ));
        }
        if !(1..=10_000).contains(&self.oracle_retry_ms) {
            return bad(format!(
                "oracle-retry-ms: {} is not in 1..=10000",
                self.oracle_retry_ms
            ));
        }
        Ok(())
    }

    /// How the proxy follows a restarted oracle.
    pub fn reconnect(&self) -> ReconnectConfig {
        ReconnectConfig {
            wait: Duration::from_millis(self.oracle_wait_ms),
            retry_interval: Duration::from_millis(self.oracle_retry_ms),
        }
    }
}

/// Counters of a running proxy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// FAAs on the oracle (`groups`) and the timestamps they took (`members`: a request
    /// for `n` counts `n`).
    pub group: GroupStats,
    /// The last timestamp of the highest range taken from the oracle ([`Timestamp::ZERO`]
    /// before the first).
    pub highest: Timestamp,
    /// Ranges refused because the oracle returned one not above `highest`.
    pub regressions: u64,
    /// FAAs refused because the oracle came back in an epoch that is not larger than
    /// the one in use ([`TsoError::WentBack`]; no range was taken).
    pub went_back: u64,
    /// Epoch of the oracle incarnation in use now.
    pub oracle_epoch: u16,
    /// Oracle restarts followed (incarnations switched to after the first).
    pub oracle_reconnects: u64,
    /// One-sided QPs the proxy holds on the oracle now.
    pub oracle_qps: usize,
}

/// The state the proxy's server threads share.
struct ProxyState {
    /// The oracle's current incarnation, shared by the server threads.
    oracle: OracleFollower,
    /// The oracle's node id (the same across its restarts).
    oracle_node: NodeId,
    group: TsoGroup<Arc<TsoError>>,
    /// Last timestamp of the highest range taken from the oracle.
    highest: Highest,
    regressions: AtomicU64,
    went_back: AtomicU64,
    max_range: u64,
    /// The server threads' QP pools (one, shared), for counting QPs on the oracle.
    straws: Mutex<Option<Arc<Straws>>>,
}

impl ProxyState {
    /// Serve one range request on the current server thread.
    async fn serve(self: Arc<Self>, req: RangeRequest) -> Result<RangeReply, String> {
        let count = req.count.get();
        if count == 0 || count > self.max_range {
            return Err(format!(
                "range request for {count} timestamps: want 1 ..= {}",
                self.max_range
            ));
        }
        let ctx = ThreadCtx::current().ok_or("no runtime on this proxy server thread")?;
        let me = &self;
        let ctx = &ctx;
        let first = self
            .group
            .take_n(count, |total| async move { me.take(ctx, total).await })
            .await
            .map_err(|e| error_chain(&e))?;
        Ok(RangeReply {
            first: U64::new(first.get()),
            count: U64::new(count),
        })
    }

    /// One FAA of `total` on the oracle's current incarnation (following it across a
    /// restart), checked against the highest timestamp issued.
    async fn take(&self, ctx: &ThreadCtx, total: u64) -> Result<Timestamp, Arc<TsoError>> {
        let r = match self.oracle.timestamps(ctx, total).await {
            Ok(r) => r,
            Err(e @ TsoError::WentBack { .. }) => {
                let n = self.went_back.fetch_add(1, Ordering::Relaxed) + 1;
                if n.is_power_of_two() {
                    tracing::error!(
                        error = %e,
                        refused = n,
                        "refusing the restarted oracle: its epoch is not larger"
                    );
                }
                return Err(Arc::new(e));
            }
            Err(e) => return Err(Arc::new(e)),
        };
        let (first, last) = (r.first(), r.last_ts().expect("total >= 1"));
        self.highest.admit(first, last).inspect_err(|e| {
            let n = self.regressions.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                tracing::error!(
                    error = %e,
                    refused = n,
                    "refused a range from the oracle: not above the highest timestamp issued"
                );
            }
        })?;
        Ok(first)
    }
}

/// The highest timestamp a proxy issued (raw value; 0 before the first range), and the
/// check that a new range from the oracle starts above it (Scythe 4.5 (3): the proxy
/// "maintains the currently maximum timestamps assigned"). The proxy's FAAs are issued
/// one at a time ([`TsoGroup`] with one range request in flight), so each range must start above the previous ones.
///
/// Once a range of epoch `e` was refused, every later range of an epoch `<= e` is
/// refused too, even one above the maximum: that incarnation went back, so values it
/// hands out may repeat ones other clients took from it by direct FAA. Only a later
/// epoch (a restart from the state directory, [`crate::epoch`]) is served again.
#[derive(Debug, Default)]
pub struct Highest {
    /// Last timestamp of the highest range recorded (raw value).
    max: AtomicU64,
    /// 1 + the largest epoch that went back; 0 when none did.
    bad_epoch: AtomicU64,
}

impl Highest {
    /// Record the range `first ..= last` and check it starts above every range recorded
    /// before and is not of an epoch that went back. The maximum is raised either way.
    ///
    /// Errors: [`TsoError::Regression`] when `first` is not above the highest so far, or
    /// its epoch is one in which an earlier range was refused.
    pub fn admit(&self, first: Timestamp, last: Timestamp) -> Result<(), Arc<TsoError>> {
        let prev = self.max.fetch_max(last.get(), Ordering::AcqRel);
        let epoch = u64::from(first.epoch());
        if first.get() <= prev || epoch < self.bad_epoch.load(Ordering::Acquire) {
            self.bad_epoch.fetch_max(epoch + 1, Ordering::AcqRel);
            return Err(Arc::new(TsoError::Regression {
                highest: Timestamp(prev),
                got: first,
            }));
        }
        Ok(())
    }

    /// The highest timestamp recorded.
    pub fn get(&self) -> Timestamp {
        Timestamp(self.max.load(Ordering::Acquire))
    }
}

/// `e` and its sources, `: `-separated.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        s.push_str(": ");
        s.push_str(&x.to_string());
        src = x.source();
    }
    s
}

/// A running proxy: an rrpc node serving [`RANGE_HANDLER`] with async handlers that FAA
/// the oracle on their server thread's runtime. Dropping it stops serving.
pub struct Proxy {
    node: Node,
    state: Arc<ProxyState>,
}

impl Proxy {
    /// Start a proxy on `fabric` for the oracle whose bootstrap address is `oracle`,
    /// listening for its own control plane on `listen`. Each server thread connects to
    /// the oracle (one-sided) before serving.
    ///
    /// Errors: [`TsoError::Config`], [`TsoError::Export`] (the oracle's control plane is
    /// unreachable or exports no counter), [`TsoError::Start`] (the node or a server
    /// thread failed to start).
    pub fn start(
        fabric: Fabric,
        listen: SocketAddr,
        oracle: SocketAddr,
        cfg: &ProxyConfig,
    ) -> Result<Self, TsoError> {
        Self::start_tuned(fabric, listen, oracle, cfg, &RpcSettings::default())
    }

    /// [`Proxy::start`] with the process's rrpc settings (a topology file's `[runtime]`
    /// and `[server]`): the server threads' runtime contexts use `rpc.runtime` (with
    /// threads per QP from `cfg`), the RPC server `rpc.server` (with `cfg.threads`).
    ///
    /// Errors: those of [`Proxy::start`].
    pub fn start_tuned(
        fabric: Fabric,
        listen: SocketAddr,
        oracle: SocketAddr,
        cfg: &ProxyConfig,
        rpc: &RpcSettings,
    ) -> Result<Self, TsoError> {
        Self::start_with(fabric, listen, oracle, cfg, rpc, TsoGroup::new())
    }

    /// **Broken on purpose** (test builds and feature `fault-injection` only): a proxy
    /// that takes `extra` timestamps more per FAA and serves later requests from the
    /// surplus, which the linearizability checker must catch.
    #[cfg(any(test, feature = "fault-injection"))]
    pub fn start_prefetching(
        fabric: Fabric,
        listen: SocketAddr,
        oracle: SocketAddr,
        cfg: &ProxyConfig,
        extra: u64,
    ) -> Result<Self, TsoError> {
        Self::start_with(
            fabric,
            listen,
            oracle,
            cfg,
            &RpcSettings::default(),
            TsoGroup::prefetching(extra),
        )
    }

    fn start_with(
        fabric: Fabric,
        listen: SocketAddr,
        oracle: SocketAddr,
        cfg: &ProxyConfig,
        rpc: &RpcSettings,
        group: TsoGroup<Arc<TsoError>>,
    ) -> Result<Self, TsoError> {
        cfg.validate()?;
        let rt_cfg = rpc
            .runtime
            .clone()
            .with_threads_per_qp(cfg.threads.div_ceil(cfg.oracle_qps));
        let info = node_info(oracle, rt_cfg.connect_timeout)
            .map_err(|e| TsoError::Export(format!("oracle at {oracle}: {e}")))?;
        let client = TsoClient::from_info(&info)?;
        let state = Arc::new(ProxyState {
            oracle: OracleFollower::new(oracle, client.clone(), cfg.reconnect()),
            oracle_node: client.node(),
            group,
            highest: Highest::default(),
            regressions: AtomicU64::new(0),
            went_back: AtomicU64::new(0),
            max_range: cfg.max_range,
            straws: Mutex::new(None),
        });
        let mut handlers = Handlers::new();
        let st = state.clone();
        handlers.register_typed_async::<RangeRpc, _, _>(move |req| st.clone().serve(req));
        let st = state.clone();
        let runtime = ServerRuntime::new(rt_cfg).with_setup(move |ctx: &Rc<ThreadCtx>| {
            // An oracle that restarted since `node_info` above is followed at the
            // thread's first failed FAA.
            ctx.connect(oracle)?;
            *st.straws.lock().unwrap_or_else(|e| e.into_inner()) = Some(ctx.straws().clone());
            Ok(())
        });
        let export = ProxyExport {
            oracle_node: client.node(),
            epoch: client.epoch(),
            handler: RANGE_HANDLER,
            max_range: cfg.max_range,
        };
        let mut exports = BTreeMap::new();
        exports.insert(
            PROXY_EXPORT.to_string(),
            serde_json::to_value(&export).expect("ProxyExport serializes"),
        );
        let node = Node::start_with_runtime(
            fabric,
            NodeConfig::new("tso-proxy", listen)
                .with_exports(exports)
                .with_rpc(Some((handlers, cfg.threads))),
            rpc.server.clone(),
            Some(runtime),
        )
        .map_err(TsoError::Start)?;
        Ok(Self { node, state })
    }

    /// The proxy's bootstrap address (clients connect here for RPC).
    pub fn addr(&self) -> SocketAddr {
        self.node.addr()
    }

    /// The proxy's node.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// The oracle incarnation this proxy takes its ranges from now.
    pub fn oracle(&self) -> Arc<TsoClient> {
        self.state.oracle.client()
    }

    /// Counters so far.
    pub fn stats(&self) -> ProxyStats {
        let s = &self.state;
        let oracle_qps = s
            .straws
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .and_then(|st| st.get(s.oracle_node))
            .map_or(0, |straw| straw.list(QpKind::OneSided).len());
        ProxyStats {
            group: s.group.stats(),
            highest: s.highest.get(),
            regressions: s.regressions.load(Ordering::Relaxed),
            went_back: s.went_back.load(Ordering::Relaxed),
            oracle_epoch: s.oracle.client().epoch(),
            oracle_reconnects: s.oracle.reconnects(),
            oracle_qps,
        }
    }
}

/// A compute node's handle on one proxy: takes ranges with the range RPC. The thread's
/// context must be connected for RPC (`ThreadCtx::connect_rpc`) to the proxy.
#[derive(Clone, Debug)]
pub struct ProxyClient {
    node: NodeId,
    export: ProxyExport,
    timeout: Duration,
}

impl ProxyClient {
    /// A client for the proxy described by `info`, whose calls fail after `timeout`
    /// (a dead proxy gives [`TsoError::Rpc`] with a timeout, never a hang).
    ///
    /// Errors: [`TsoError::Export`] when the `"tso-proxy"` export is missing or
    /// malformed.
    pub fn from_info(info: &rrpc::node::NodeInfo, timeout: Duration) -> Result<Self, TsoError> {
        let export: ProxyExport = info
            .export(PROXY_EXPORT)
            .map_err(|e| TsoError::Export(e.to_string()))?;
        Ok(Self {
            node: info.node,
            export,
            timeout,
        })
    }

    /// Node id of the proxy.
    pub fn node(&self) -> NodeId {
        self.node
    }

    /// What the proxy exported (its oracle and that oracle's epoch).
    pub fn export(&self) -> &ProxyExport {
        &self.export
    }

    /// `n` consecutive timestamps with one range RPC, taken by the proxy after the
    /// request arrived.
    ///
    /// Errors: [`TsoError::ZeroCount`]; [`TsoError::Rpc`] when the call fails (timeout,
    /// proxy gone, or the proxy's error, e.g. the oracle failed or regressed);
    /// [`TsoError::BadReply`] when the reply is malformed or not the count asked for.
    pub async fn timestamps(&self, ctx: &ThreadCtx, n: u64) -> Result<TimestampRange, TsoError> {
        if n == 0 {
            return Err(TsoError::ZeroCount);
        }
        // `RangeRpc`'s request, sent to the handler id the proxy exported.
        let mut req = Vec::with_capacity(std::mem::size_of::<RangeRequest>());
        encode_request::<RangeRpc>(&RangeRequest { count: U64::new(n) }, &mut req).map_err(
            |e| TsoError::BadReply {
                node: self.node,
                what: e.to_string(),
            },
        )?;
        let opts = CallOpts {
            timeout: Some(self.timeout),
            ..CallOpts::default()
        };
        let b = ctx
            .call_with(self.node, self.export.handler, &req, opts)
            .await?;
        let bad = |what: String| TsoError::BadReply {
            node: self.node,
            what,
        };
        let r = decode_response::<RangeRpc>(&b).map_err(|e| bad(e.to_string()))?;
        let (first, count) = (r.first.get(), r.count.get());
        if count != n {
            return Err(bad(format!("{count} timestamps, asked for {n}")));
        }
        if first == 0 || first.checked_add(n).is_none() {
            return Err(bad(format!("range {first} + {n} is not valid")));
        }
        Ok(TimestampRange::new(Timestamp(first), n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::tests::with_watchdog;
    use crate::history::{check, now_ns, Op, Violation};
    use crate::oracle::Oracle;
    use rrpc::fabric::shm::ClusterGuard;
    use rrpc::runtime::{block_on, Executor, RuntimeConfig};
    use std::cell::RefCell;

    /// An oracle, proxy A (prefetching `extra` timestamps per FAA when `extra > 0`) and
    /// an honest proxy B in-process; two client nodes of three coroutines each take
    /// timestamps through A, through B and directly by FAA, recording a history.
    fn history_through_proxies(extra: u64) -> Result<usize, Violation> {
        with_watchdog(move || {
            let name = format!("tso-unit-{}-pf{extra}", std::process::id());
            let (c, _) = ClusterGuard::new(&name).unwrap();
            let of = c.open(NodeId(1)).unwrap();
            let oracle = Oracle::new(&of).unwrap();
            let onode = oracle.serve(of, "127.0.0.1:0".parse().unwrap()).unwrap();
            let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
            let cfg = ProxyConfig::default();
            let a = if extra > 0 {
                Proxy::start_prefetching(
                    c.open(NodeId(10)).unwrap(),
                    listen,
                    onode.addr(),
                    &cfg,
                    extra,
                )
            } else {
                Proxy::start(c.open(NodeId(10)).unwrap(), listen, onode.addr(), &cfg)
            }
            .unwrap();
            let b = Proxy::start(c.open(NodeId(11)).unwrap(), listen, onode.addr(), &cfg).unwrap();
            let (oa, aa, ba) = (onode.addr(), a.addr(), b.addr());
            let ops: Vec<Op> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..2u32)
                    .map(|t| {
                        let f = c.open(NodeId(100 + t)).unwrap();
                        s.spawn(move || {
                            let ctx = ThreadCtx::new(f, RuntimeConfig::default()).unwrap();
                            let direct = TsoClient::from_info(&ctx.connect(oa).unwrap()).unwrap();
                            let timeout = Duration::from_secs(10);
                            let pa = ProxyClient::from_info(&ctx.connect_rpc(aa).unwrap(), timeout)
                                .unwrap();
                            let pb = ProxyClient::from_info(&ctx.connect_rpc(ba).unwrap(), timeout)
                                .unwrap();
                            let ops = Rc::new(RefCell::new(Vec::new()));
                            let mut ex = Executor::new(ctx.clone());
                            for k in 0..3u32 {
                                let (ctx, ops) = (ctx.clone(), ops.clone());
                                let (direct, pa, pb) = (direct.clone(), pa.clone(), pb.clone());
                                ex.spawn(async move {
                                    for _ in 0..300 {
                                        let invoke_ns = now_ns();
                                        let r = match k {
                                            0 => pa.timestamps(&ctx, 1).await,
                                            1 => pb.timestamps(&ctx, 1).await,
                                            _ => direct.timestamps(&ctx, 1).await,
                                        };
                                        ops.borrow_mut().push(Op {
                                            client: t * 10 + k,
                                            invoke_ns,
                                            response_ns: now_ns(),
                                            ts: r.unwrap().first(),
                                        });
                                    }
                                });
                            }
                            ex.run();
                            let v = ops.borrow().clone();
                            v
                        })
                    })
                    .collect();
                hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
            });
            assert_eq!(ops.len(), 2 * 3 * 300);
            drop((a, b, onode, oracle));
            check(&ops)
        })
    }

    #[test]
    fn honest_proxies_and_direct_faa_pass_the_checker() {
        assert_eq!(history_through_proxies(0), Ok(1800));
    }

    #[test]
    fn a_prefetching_proxy_is_caught_by_the_checker() {
        match history_through_proxies(16) {
            Err(Violation::RealTime { later, .. }) => {
                assert_eq!(later.client % 10, 0, "the stale one came through proxy A");
            }
            r => panic!("the checker missed the prefetching proxy: {r:?}"),
        }
    }

    /// The highest-issued check end to end: an oracle whose counter goes back under an
    /// unchanged export (so the epoch check cannot tell, see [`Oracle::rewind`]) gets
    /// its ranges refused by the proxy, and clients get the error, never a timestamp.
    #[test]
    fn an_oracle_that_went_back_under_the_same_export_is_refused_end_to_end() {
        with_watchdog(|| {
            let name = format!("tso-unit-{}-back", std::process::id());
            let (c, _) = ClusterGuard::new(&name).unwrap();
            let of = c.open(NodeId(1)).unwrap();
            let oracle = Oracle::new(&of).unwrap();
            let onode = oracle.serve(of, "127.0.0.1:0".parse().unwrap()).unwrap();
            let p = Proxy::start(
                c.open(NodeId(10)).unwrap(),
                "127.0.0.1:0".parse().unwrap(),
                onode.addr(),
                &ProxyConfig::default(),
            )
            .unwrap();
            let ctx =
                ThreadCtx::new(c.open(NodeId(100)).unwrap(), RuntimeConfig::default()).unwrap();
            let pc = ProxyClient::from_info(
                &ctx.connect_rpc(p.addr()).unwrap(),
                Duration::from_secs(10),
            )
            .unwrap();
            let refused = |r: Result<TimestampRange, TsoError>| match r {
                Err(TsoError::Rpc(rrpc::runtime::RpcError::Call(
                    rrpc::runtime::CallError::Remote { msg, .. },
                ))) => assert!(msg.contains("the oracle went back"), "{msg}"),
                r => panic!("served: {r:?}"),
            };
            let c2 = ctx.clone();
            block_on(&ctx, async move {
                let a = pc.timestamps(&c2, 10).await.unwrap();
                assert_eq!((a.first().get(), a.len()), (1, 10));
                // The counter goes back below what the proxy issued: refused.
                oracle.rewind(Timestamp(3));
                refused(pc.timestamps(&c2, 1).await);
                // Past the proxy's maximum but in the epoch that went back: refused too.
                oracle.rewind(Timestamp(1000));
                refused(pc.timestamps(&c2, 1).await);
            });
            let s = p.stats();
            assert_eq!((s.regressions, s.went_back), (2, 0), "{s:?}");
            assert_eq!(s.group.members, 12);
        });
    }

    #[test]
    fn wire_layouts_round_trip_and_reject_wrong_sizes() {
        use rrpc::typed::{decode_request, encode_response};
        let q = RangeRequest {
            count: U64::new(0x0102),
        };
        let mut b = Vec::new();
        encode_request::<RangeRpc>(&q, &mut b).unwrap();
        assert_eq!(b, [2, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(decode_request::<RangeRpc>(&b), Ok(q));
        let e = decode_request::<RangeRpc>(&[1, 2, 3]).unwrap_err();
        assert_eq!((e.len, e.expected_len), (3, Some(8)));
        let r = RangeReply {
            first: U64::new(7),
            count: U64::new(3),
        };
        let mut b = Vec::new();
        encode_response::<RangeRpc>(&r, &mut b).unwrap();
        assert_eq!(b.len(), 16);
        assert_eq!((b[0], b[8]), (7, 3));
        assert_eq!(decode_response::<RangeRpc>(&b), Ok(r));
        assert!(decode_response::<RangeRpc>(&b[..15]).is_err());
    }

    #[test]
    fn a_range_not_above_the_highest_issued_is_refused() {
        let h = Highest::default();
        assert_eq!(h.get(), Timestamp::ZERO);
        h.admit(Timestamp(1), Timestamp(4)).unwrap();
        h.admit(Timestamp(5), Timestamp(5)).unwrap();
        // An oracle that restarted at 1 (no epoch) is caught, and so is an overlap.
        for (f, l) in [(1, 3), (5, 9), (3, 20)] {
            match h
                .admit(Timestamp(f), Timestamp(l))
                .as_ref()
                .map_err(|e| &**e)
            {
                Err(TsoError::Regression { got, .. }) => assert_eq!(got.get(), f),
                r => panic!("({f}, {l}) admitted: {r:?}"),
            }
        }
        // Epoch 0 went back: even a range above the maximum is refused in it.
        assert!(h.admit(Timestamp(100), Timestamp(100)).is_err());
        // A later epoch is above everything.
        let next = Timestamp::compose(1, 1).unwrap();
        h.admit(next, next).unwrap();
        assert_eq!(h.get(), next);
    }

    #[test]
    fn config_validation_names_the_key() {
        assert!(ProxyConfig::default().validate().is_ok());
        let e = ProxyConfig {
            threads: 2,
            oracle_qps: 3,
            ..ProxyConfig::default()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("oracle-qps"), "{e}");
        let e = ProxyConfig {
            max_range: 0,
            ..ProxyConfig::default()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("max-range"), "{e}");
        let c: ProxyConfig = toml::from_str("threads = 4\noracle-qps = 2\n").unwrap();
        assert_eq!(
            (c.threads, c.oracle_qps, c.max_range),
            (4, 2, DEFAULT_MAX_RANGE)
        );
        assert!(toml::from_str::<ProxyConfig>("thread = 4\n").is_err());
    }
}
