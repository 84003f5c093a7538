//! Where a compute node takes its ranges: the oracle directly (one-sided FAA) or a TSO
//! proxy (range RPC), chosen per request and failed over (Scythe,
//! section 4.5, workflow step 2: "the Leader ...
//! randomly selects a TSO proxy or TSO service to send a batch of TSO requests").
//!
//! [`TsoSources`] holds the oracle and the proxies of one oracle. Each request goes to
//! the source [`Choice`] prefers; when it fails (a proxy call times out or the proxy is
//! gone, the oracle's FAA fails), the source is skipped for
//! [`SourceConfig::retry_after_ms`] and the request is retried on the next one. Every
//! rrpc call carries a deadline ([`SourceConfig::call_timeout_ms`]), so a dead proxy costs
//! one timeout, never a hang.
//!
//! Retrying is safe for linearizability: a range taken by a request whose reply was lost
//! is never handed out (a gap), and the retry's range is taken after the retry started.

use rrpc::NodeId;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rrpc::node::node_info;
use rrpc::runtime::ThreadCtx;
use serde::{Deserialize, Serialize};

use crate::client::TsoClient;
use crate::error::TsoError;
use crate::history::now_ns;
use crate::proxy::ProxyClient;
use crate::timestamp::TimestampRange;
use crate::timestamp_source::TimestampSource;

/// Which source a request tries first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Choice {
    /// A proxy at random per request; the oracle only when every proxy failed (or when
    /// no proxy is configured). The default: compute nodes hold no QPs on the oracle
    /// while a proxy answers.
    #[default]
    Random,
    /// At random among the proxies and the oracle (Scythe's workflow).
    Any,
    /// The oracle first; proxies (at random) when it fails.
    Oracle,
}

impl std::str::FromStr for Choice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "random" => Ok(Self::Random),
            "any" => Ok(Self::Any),
            "oracle" => Ok(Self::Oracle),
            _ => Err(format!("unknown choice {s:?} (random, any, oracle)")),
        }
    }
}

/// Client-side settings of [`TsoSources`]. As TOML, kebab-case keys, each optional.
///
/// Non-exhaustive, so that a setting can be added without breaking the crates that embed
/// this one: outside this crate, start from [`Default::default`] and chain the `with_*`
/// setters (or assign the public fields on a `let mut` binding).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
#[non_exhaustive]
pub struct SourceConfig {
    /// Which source a request tries first (default `random`).
    pub choice: Choice,
    /// Deadline of one range RPC to a proxy, milliseconds (default 1000; at least 1).
    pub call_timeout_ms: u64,
    /// How long a source that failed is tried only after the others, milliseconds
    /// (default 1000).
    pub retry_after_ms: u64,
}

impl Default for SourceConfig {
    fn default() -> Self {
        Self {
            choice: Choice::Random,
            call_timeout_ms: 1000,
            retry_after_ms: 1000,
        }
    }
}

impl SourceConfig {
    /// Set [`SourceConfig::choice`]: which source a request tries first (default `random`).
    pub fn with_choice(mut self, choice: Choice) -> Self {
        self.choice = choice;
        self
    }

    /// Set [`SourceConfig::call_timeout_ms`]: deadline of one range RPC to a proxy,
    /// milliseconds (default 1000; at least 1).
    pub fn with_call_timeout_ms(mut self, call_timeout_ms: u64) -> Self {
        self.call_timeout_ms = call_timeout_ms;
        self
    }

    /// Set [`SourceConfig::retry_after_ms`]: how long a source that failed is tried only after
    /// the others, milliseconds (default 1000).
    pub fn with_retry_after_ms(mut self, retry_after_ms: u64) -> Self {
        self.retry_after_ms = retry_after_ms;
        self
    }
}

/// One place a range can come from.
#[derive(Clone, Debug)]
pub enum Source {
    /// The oracle, by one-sided FAA.
    Oracle(TsoClient),
    /// A proxy, by range RPC.
    Proxy(ProxyClient),
}

impl Source {
    /// Node id of the source.
    pub fn node(&self) -> NodeId {
        match self {
            Source::Oracle(c) => c.node(),
            Source::Proxy(p) => p.node(),
        }
    }

    /// `n` consecutive timestamps from this source.
    ///
    /// Errors: those of [`TsoClient::timestamps`] or [`ProxyClient::timestamps`].
    pub async fn timestamps(&self, ctx: &ThreadCtx, n: u64) -> Result<TimestampRange, TsoError> {
        match self {
            Source::Oracle(c) => c.timestamps(ctx, n).await,
            Source::Proxy(p) => p.timestamps(ctx, n).await,
        }
    }
}

/// The oracle and proxies of one oracle, with the choice and failover policy. Share it
/// in an `Arc` among a process's threads; connect each thread's context with
/// [`TsoSources::connect_thread`] before its coroutines run.
pub struct TsoSources {
    /// Proxies first, then the oracle (if any).
    sources: Vec<(SocketAddr, Source)>,
    proxies: usize,
    choice: Choice,
    retry_after_ns: u64,
    /// Per source: `now_ns` before which it is tried only after the others.
    down_until_ns: Vec<AtomicU64>,
    rng: AtomicU64,
    failovers: AtomicU64,
    epoch: u16,
}

impl TsoSources {
    /// Look up the oracle at `oracle` (optional) and the proxies at `proxies` over the
    /// control plane. A proxy that does not answer is left out with a warning; at least
    /// one source must answer. Every proxy must serve the same oracle incarnation (node
    /// and epoch) as the others and as `oracle`.
    ///
    /// Errors: [`TsoError::Config`] (no source given, bad timeout),
    /// [`TsoError::Export`] (no source answered, or they disagree about the oracle).
    pub fn discover(
        oracle: Option<SocketAddr>,
        proxies: &[SocketAddr],
        cfg: &SourceConfig,
    ) -> Result<Self, TsoError> {
        if oracle.is_none() && proxies.is_empty() {
            return Err(TsoError::Config(
                "no oracle and no proxy to take timestamps from".into(),
            ));
        }
        if cfg.call_timeout_ms == 0 {
            return Err(TsoError::Config("call-timeout-ms: at least 1".into()));
        }
        let timeout = Duration::from_millis(cfg.call_timeout_ms);
        let connect_timeout = rrpc::runtime::RuntimeConfig::default().connect_timeout;
        let mut sources = Vec::new();
        let mut last_err = None;
        for &a in proxies {
            match node_info(a, connect_timeout)
                .map_err(|e| TsoError::Export(format!("proxy at {a}: {e}")))
                .and_then(|info| ProxyClient::from_info(&info, timeout))
            {
                Ok(p) => sources.push((a, Source::Proxy(p))),
                Err(e) => {
                    tracing::warn!(proxy = %a, error = %e, "TSO proxy left out");
                    last_err = Some(e);
                }
            }
        }
        let n_proxies = sources.len();
        if let Some(a) = oracle {
            match node_info(a, connect_timeout)
                .map_err(|e| TsoError::Export(format!("oracle at {a}: {e}")))
                .and_then(|info| TsoClient::from_info(&info))
            {
                Ok(c) => sources.push((a, Source::Oracle(c))),
                Err(e) => {
                    tracing::warn!(oracle = %a, error = %e, "TSO oracle left out");
                    last_err = Some(e);
                }
            }
        }
        if sources.is_empty() {
            return Err(last_err.unwrap_or_else(|| TsoError::Export("no source".into())));
        }
        let incarnation = |s: &Source| match s {
            Source::Oracle(c) => (c.node(), c.epoch()),
            Source::Proxy(p) => (p.export().oracle_node, p.export().epoch),
        };
        let first = incarnation(&sources[0].1);
        if let Some((a, s)) = sources.iter().find(|(_, s)| incarnation(s) != first) {
            return Err(TsoError::Export(format!(
                "{a} serves oracle node {} epoch {}, {} serves node {} epoch {}",
                incarnation(s).0,
                incarnation(s).1,
                sources[0].0,
                first.0,
                first.1
            )));
        }
        Ok(Self {
            down_until_ns: sources.iter().map(|_| AtomicU64::new(0)).collect(),
            sources,
            proxies: n_proxies,
            choice: cfg.choice,
            retry_after_ns: cfg.retry_after_ms.saturating_mul(1_000_000),
            rng: AtomicU64::new(now_ns() ^ ((std::process::id() as u64) << 32) | 1),
            failovers: AtomicU64::new(0),
            epoch: first.1,
        })
    }

    /// Connect `ctx` to every source (RPC to proxies, one-sided to the oracle). Blocking
    /// (control plane); call before the thread's coroutines run. A source that cannot be
    /// reached is marked failed (and its calls fail over) with a warning.
    ///
    /// Errors: [`TsoError::Rpc`] when no source could be connected.
    pub fn connect_thread(&self, ctx: &ThreadCtx) -> Result<(), TsoError> {
        let mut ok = 0;
        let mut last = None;
        for (i, (a, s)) in self.sources.iter().enumerate() {
            let r = match s {
                Source::Oracle(_) => ctx.connect(*a),
                Source::Proxy(_) => ctx.connect_rpc(*a),
            };
            match r {
                Ok(_) => ok += 1,
                Err(e) => {
                    tracing::warn!(source = %a, error = %e, "cannot connect to a TSO source");
                    self.mark_down(i);
                    last = Some(e);
                }
            }
        }
        match (ok, last) {
            (0, Some(e)) => Err(e.into()),
            _ => Ok(()),
        }
    }

    /// The sources, proxies first.
    pub fn sources(&self) -> impl Iterator<Item = &Source> {
        self.sources.iter().map(|(_, s)| s)
    }

    /// The oracle's epoch all sources agreed on.
    pub fn epoch(&self) -> u16 {
        self.epoch
    }

    /// Requests retried on another source so far.
    pub fn failovers(&self) -> u64 {
        self.failovers.load(Ordering::Relaxed)
    }

    fn mark_down(&self, i: usize) {
        self.down_until_ns[i].store(now_ns() + self.retry_after_ns, Ordering::Relaxed);
    }

    fn random(&self, n: usize) -> usize {
        // xorshift64; racing updates only cost randomness.
        let mut x = self.rng.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.store(x, Ordering::Relaxed);
        (x % n as u64) as usize
    }

    /// The order to try the sources in: by [`Choice`], sources marked failed last.
    fn order(&self) -> Vec<usize> {
        let (p, all) = (self.proxies, self.sources.len());
        let cyclic =
            |start: usize, len: usize, base: usize| (0..len).map(move |k| base + (start + k) % len);
        let mut v: Vec<usize> = Vec::with_capacity(all);
        let oracle = (all > p).then_some(p);
        match self.choice {
            Choice::Random => {
                if p > 0 {
                    v.extend(cyclic(self.random(p), p, 0));
                }
                v.extend(oracle);
            }
            Choice::Any => v.extend(cyclic(self.random(all), all, 0)),
            Choice::Oracle => {
                v.extend(oracle);
                if p > 0 {
                    v.extend(cyclic(self.random(p), p, 0));
                }
            }
        }
        let now = now_ns();
        // Stable: keeps the choice's order within the live and the failed sources.
        v.sort_by_key(|&i| self.down_until_ns[i].load(Ordering::Relaxed) > now);
        v
    }

    /// `n` consecutive timestamps from the first source (in [`Choice`] order) that
    /// answers; each failing one is marked failed for `retry-after-ms`.
    ///
    /// Errors: [`TsoError::ZeroCount`]; [`TsoError::Exhausted`] (the oracle's epoch is
    /// used up: no other source can help); [`TsoError::NoSource`] when every source
    /// failed, with the last one's error.
    pub async fn timestamps(&self, ctx: &ThreadCtx, n: u64) -> Result<TimestampRange, TsoError> {
        if n == 0 {
            return Err(TsoError::ZeroCount);
        }
        let order = self.order();
        let tried = order.len();
        let mut last = None;
        for (k, i) in order.into_iter().enumerate() {
            if k > 0 {
                self.failovers.fetch_add(1, Ordering::Relaxed);
            }
            match self.sources[i].1.timestamps(ctx, n).await {
                Ok(r) => return Ok(r),
                Err(e @ (TsoError::Exhausted { .. } | TsoError::ZeroCount)) => return Err(e),
                Err(e) => {
                    tracing::debug!(source = %self.sources[i].0, error = %e, "TSO source failed");
                    self.mark_down(i);
                    last = Some(e);
                }
            }
        }
        Err(TsoError::NoSource {
            tried,
            last: Box::new(last.expect("at least one source")),
        })
    }
}

impl TimestampSource for TsoSources {
    type Error = TsoError;

    /// [`TsoSources::timestamps`]: the preferred source, failing over to the others.
    async fn timestamps(&self, ctx: &ThreadCtx, n: u64) -> Result<TimestampRange, TsoError> {
        TsoSources::timestamps(self, ctx, n).await
    }
}
