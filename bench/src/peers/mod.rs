//! Round-trip latency of "peer" libraries, measured the same way as our own
//! RPC library so the numbers can be put side by side.
//!
//! Every peer runs two endpoints in **one process** on two threads: the client
//! thread is pinned to [`PeerConfig::client_core`], the server thread to
//! [`PeerConfig::server_core`] (via `core_affinity`). The client keeps exactly
//! one request in flight. Each request carries the round counter in its first
//! 8 bytes (little endian, rest of the payload zero-filled, so the whole
//! payload is written every time); the server echoes the counter in the first
//! 8 bytes of its reply and the client checks it, so a mismatch is an error.
//!
//! Per round trip the client reads the TSC with `quanta::Clock::raw()` before
//! sending and after the reply has been checked, and records
//! `delta_as_nanos` into an HDR histogram (1 ns .. 10 s, 3 significant
//! figures). A warm-up phase of [`PeerConfig::warmup`] is run first and not
//! recorded.
//!
//! Peers:
//! * [`floor_rtt`]: cache-line ping-pong between the two cores, the hardware
//!   floor of any shared-memory round trip.
//! * [`fabric_rtt`]: one RDMA WRITE each way through the fabric's QPs (no RPC
//!   protocol), the floor of any RPC built on that fabric.
//! * [`iceoryx2_rtt`] / [`iceoryx2_slice_rtt`]: iceoryx2 request-response over
//!   shared memory (`ipc::Service`), busy polling, following iceoryx2's own
//!   `benchmarks/request-response` (and `benchmarks/publish-subscribe`).
//! * [`tonic_rtt`]: tonic unary gRPC over loopback TCP, one current-thread
//!   tokio runtime per side.
//!
//! [`rounds`] pairs the peers' p50s round by round, so ratios hold on a machine whose
//! speed drifts.

mod fabric;
mod floor;
mod iceoryx2;
pub mod rounds;
mod tonic;

pub use self::fabric::fabric_rtt;
pub use self::floor::floor_rtt;
pub use self::iceoryx2::{iceoryx2_rtt, iceoryx2_slice_rtt};
pub use self::tonic::tonic_rtt;

use anyhow::{anyhow, bail, Context as _, Result};
use hdrhistogram::Histogram;
use quanta::Clock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long a client waits for one reply before the run fails.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the two threads wait for each other to finish their setup.
const SETUP_TIMEOUT: Duration = Duration::from_secs(30);

/// Lowest value the RTT histogram tracks, in ns.
const HIST_LOW_NS: u64 = 1;
/// Highest value the RTT histogram tracks, in ns (10 s).
const HIST_HIGH_NS: u64 = 10_000_000_000;
/// Significant figures of the RTT histogram.
const HIST_SIGFIG: u8 = 3;

/// Settings shared by all peers.
#[derive(Clone, Debug)]
pub struct PeerConfig {
    /// Payload of a request, in bytes (>= 8; the first 8 bytes carry the
    /// round counter).
    pub request_bytes: usize,
    /// Payload of a reply, in bytes (>= 8; the first 8 bytes echo the round
    /// counter).
    pub reply_bytes: usize,
    /// Time spent doing round trips before measuring starts (not recorded).
    pub warmup: Duration,
    /// Time spent doing measured round trips.
    pub duration: Duration,
    /// Logical core id the client thread is pinned to.
    pub client_core: usize,
    /// Logical core id the server thread is pinned to.
    pub server_core: usize,
}

impl PeerConfig {
    /// Checks the sizes and that both cores exist and differ.
    fn validate(&self) -> Result<()> {
        if self.request_bytes < 8 {
            bail!("request_bytes must be >= 8, got {}", self.request_bytes);
        }
        if self.reply_bytes < 8 {
            bail!("reply_bytes must be >= 8, got {}", self.reply_bytes);
        }
        if self.client_core == self.server_core {
            bail!(
                "client_core and server_core must differ (both are {})",
                self.client_core
            );
        }
        let cores = core_affinity::get_core_ids()
            .ok_or_else(|| anyhow!("core_affinity: cannot list the cores of this process"))?;
        for (who, id) in [("client", self.client_core), ("server", self.server_core)] {
            if !cores.iter().any(|c| c.id == id) {
                bail!("{who}_core {id} is not available to this process");
            }
        }
        Ok(())
    }
}

/// Result of one peer run.
pub struct RttSamples {
    /// Per-round-trip latency in nanoseconds (hdrhistogram 7, 1 ns .. 10 s, 3 sig figs).
    pub hist: Histogram<u64>,
    /// Round trips measured (after warm-up).
    pub round_trips: u64,
    /// Wall time of the measured round trips (after warm-up).
    pub elapsed: Duration,
}

impl RttSamples {
    /// Mean round-trip time in ns computed as `elapsed / round_trips`, the
    /// way iceoryx2's benchmarks compute their latency (total time divided
    /// by iterations; they additionally halve it to report one-way latency,
    /// we do not). It includes the client's per-iteration bookkeeping, so it
    /// is slightly above `hist.mean()`. Returns NaN if nothing was measured.
    pub fn mean_ns(&self) -> f64 {
        if self.round_trips == 0 {
            return f64::NAN;
        }
        self.elapsed.as_nanos() as f64 / self.round_trips as f64
    }
}

/// Pins the calling thread to logical core `core`.
fn pin_current(core: usize) -> Result<()> {
    if core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
        Ok(())
    } else {
        Err(anyhow!("core_affinity: cannot pin thread to core {core}"))
    }
}

/// Client-side measurement: warm-up, then per-round-trip recording until
/// `duration` has passed.
struct Meter {
    clock: Clock,
    hist: Histogram<u64>,
    warmup_ns: u64,
    duration_ns: u64,
    /// Raw TSC value at the start of the current phase.
    phase_start: u64,
    measuring: bool,
    round_trips: u64,
    elapsed_ns: u64,
}

impl Meter {
    /// Creates the meter (calibrates the clock, allocates the histogram).
    fn new(cfg: &PeerConfig) -> Result<Self> {
        let hist = Histogram::new_with_bounds(HIST_LOW_NS, HIST_HIGH_NS, HIST_SIGFIG)
            .context("hdrhistogram: create RTT histogram")?;
        let clock = Clock::new();
        let now = clock.raw();
        Ok(Self {
            clock,
            hist,
            warmup_ns: u64::try_from(cfg.warmup.as_nanos()).unwrap_or(u64::MAX),
            duration_ns: u64::try_from(cfg.duration.as_nanos()).unwrap_or(u64::MAX),
            phase_start: now,
            measuring: false,
            round_trips: 0,
            elapsed_ns: 0,
        })
    }

    /// Starts the warm-up phase now; call right before the first round trip.
    fn arm(&mut self) {
        self.phase_start = self.clock.raw();
    }

    /// Raw TSC timestamp taken before a round trip starts.
    #[inline]
    fn now(&self) -> u64 {
        self.clock.raw()
    }

    /// Ends the round trip that started at raw timestamp `t0`: records it
    /// if measuring. Returns `true` once the measured phase is over.
    #[inline]
    fn record(&mut self, t0: u64) -> bool {
        let t1 = self.clock.raw();
        if self.measuring {
            self.hist
                .saturating_record(self.clock.delta_as_nanos(t0, t1));
            self.round_trips += 1;
            let elapsed = self.clock.delta_as_nanos(self.phase_start, t1);
            if elapsed >= self.duration_ns {
                self.elapsed_ns = elapsed;
                return true;
            }
        } else if self.clock.delta_as_nanos(self.phase_start, t1) >= self.warmup_ns {
            self.measuring = true;
            self.phase_start = t1;
        }
        false
    }

    fn finish(self) -> RttSamples {
        RttSamples {
            hist: self.hist,
            round_trips: self.round_trips,
            elapsed: Duration::from_nanos(self.elapsed_ns),
        }
    }
}

/// State shared by the client and the server thread of one run.
struct Ctx {
    /// Threads that reached the end of their setup.
    arrived: AtomicUsize,
    /// A thread failed its setup.
    setup_failed: AtomicBool,
    /// The client thread has exited (set by a drop guard, also on panic):
    /// the server must stop.
    client_gone: AtomicBool,
    /// The server thread has exited (set by a drop guard, also on panic):
    /// a client waiting for a reply must give up.
    server_gone: AtomicBool,
}

/// Sets a flag when dropped, i.e. when a thread exits for whatever reason.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

impl Ctx {
    fn new() -> Self {
        Self {
            arrived: AtomicUsize::new(0),
            setup_failed: AtomicBool::new(false),
            client_gone: AtomicBool::new(false),
            server_gone: AtomicBool::new(false),
        }
    }

    /// Waits until both threads finished their setup. `setup` is this
    /// thread's setup result; it is returned unless this thread or the other
    /// one failed. Never hangs: gives up after `SETUP_TIMEOUT` or as soon as
    /// the other thread has exited.
    fn rendezvous<T>(&self, setup: Result<T>) -> Result<T> {
        if setup.is_err() {
            self.setup_failed.store(true, Ordering::Release);
        }
        self.arrived.fetch_add(1, Ordering::AcqRel);
        let value = setup?;
        let since = Instant::now();
        while self.arrived.load(Ordering::Acquire) < 2 {
            if self.setup_failed.load(Ordering::Acquire)
                || self.client_gone.load(Ordering::Acquire)
                || self.server_gone.load(Ordering::Acquire)
            {
                bail!("the other thread failed during setup");
            }
            if since.elapsed() > SETUP_TIMEOUT {
                bail!("the other thread did not finish setup within {SETUP_TIMEOUT:?}");
            }
            std::thread::yield_now();
        }
        if self.setup_failed.load(Ordering::Acquire) {
            bail!("the other thread failed during setup");
        }
        Ok(value)
    }
}

/// Cheap watchdog for busy-poll loops: looks at the clock and the shared
/// flags only every 4096 spins.
struct Patience {
    spins: u32,
    since: Option<Instant>,
}

impl Patience {
    /// Check every 4096 spins.
    const CHECK_MASK: u32 = 4096 - 1;

    #[inline]
    fn new() -> Self {
        Self {
            spins: 0,
            since: None,
        }
    }

    /// One spin of a client waiting for a reply. Errors if the server thread
    /// is gone or no reply came within [`REPLY_TIMEOUT`].
    #[inline]
    fn client_spin(&mut self, ctx: &Ctx, what: &str) -> Result<()> {
        self.spins = self.spins.wrapping_add(1);
        if self.spins & Self::CHECK_MASK != 0 {
            return Ok(());
        }
        self.client_check(ctx, what)
    }

    #[cold]
    fn client_check(&mut self, ctx: &Ctx, what: &str) -> Result<()> {
        if ctx.server_gone.load(Ordering::Acquire) {
            bail!("{what}: server thread exited while a reply was outstanding");
        }
        let since = *self.since.get_or_insert_with(Instant::now);
        if since.elapsed() > REPLY_TIMEOUT {
            bail!("{what}: no reply within {REPLY_TIMEOUT:?}");
        }
        Ok(())
    }

    /// One spin of a server waiting for a request. Returns `true` when the
    /// client has exited and the server should stop.
    #[inline]
    fn server_spin(&mut self, ctx: &Ctx) -> bool {
        self.spins = self.spins.wrapping_add(1);
        self.spins & Self::CHECK_MASK == 0 && ctx.client_gone.load(Ordering::Acquire)
    }
}

/// Runs `server` and `client` on two scoped threads and joins both.
///
/// Each closure must pin itself, do its setup and call [`Ctx::rendezvous`]
/// exactly once. A server error (or panic) takes precedence over the client
/// error it usually causes.
fn run_pair<S, C>(name: &str, server: S, client: C) -> Result<RttSamples>
where
    S: FnOnce(&Ctx) -> Result<()> + Send,
    C: FnOnce(&Ctx) -> Result<RttSamples> + Send,
{
    let ctx = Ctx::new();
    let ctx = &ctx;
    std::thread::scope(|s| {
        let srv = std::thread::Builder::new()
            .name(format!("{name}-server"))
            .spawn_scoped(s, move || {
                let _gone = SetOnDrop(&ctx.server_gone);
                server(ctx)
            })
            .with_context(|| format!("{name}: spawn server thread"))?;
        let cli = std::thread::Builder::new()
            .name(format!("{name}-client"))
            .spawn_scoped(s, move || {
                let _gone = SetOnDrop(&ctx.client_gone);
                client(ctx)
            });
        let cli = match cli {
            Ok(h) => h,
            Err(e) => {
                // Let the server see that no client will come.
                ctx.client_gone.store(true, Ordering::Release);
                let _ = srv.join();
                return Err(anyhow!(e).context(format!("{name}: spawn client thread")));
            }
        };
        let client_result = cli.join();
        let server_result = srv.join();
        match (server_result, client_result) {
            (Err(_), _) => Err(anyhow!("{name}: server thread panicked")),
            (Ok(Err(e)), _) => Err(e.context(format!("{name}: server"))),
            (Ok(Ok(())), Err(_)) => Err(anyhow!("{name}: client thread panicked")),
            (Ok(Ok(())), Ok(r)) => r.with_context(|| format!("{name}: client")),
        }
    })
}

/// Writes `counter` (little endian) into the first 8 bytes of `buf` and
/// zeroes the rest. `buf` must be at least 8 bytes long.
#[inline]
fn fill_payload(buf: &mut [u8], counter: u64) {
    buf.fill(0);
    buf[..8].copy_from_slice(&counter.to_le_bytes());
}

/// Reads the counter from the first 8 bytes of `buf`; `None` if shorter.
#[inline]
fn read_counter(buf: &[u8]) -> Option<u64> {
    let head: [u8; 8] = buf.get(..8)?.try_into().ok()?;
    Some(u64::from_le_bytes(head))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A short run on cores 0 and 1, or `None` if this machine has fewer
    /// than two cores.
    fn short_cfg(request_bytes: usize, reply_bytes: usize) -> Option<PeerConfig> {
        let cores = core_affinity::get_core_ids()?;
        if cores.len() < 2 {
            return None;
        }
        Some(PeerConfig {
            request_bytes,
            reply_bytes,
            warmup: Duration::from_millis(20),
            duration: Duration::from_millis(100),
            client_core: cores[0].id,
            server_core: cores[1].id,
        })
    }

    /// The fabric peer on the shm fabric with timing model `model`, in its own cluster.
    fn shm_fabric_rtt(cfg: &PeerConfig, tag: &str, model: &str) -> Result<RttSamples> {
        use rrpc::fabric::{shm::ClusterGuard, Fabric, FabricConfig, FabricKind};
        let name = format!("bench-peers-{}-{tag}", std::process::id());
        let (_cluster, _) = ClusterGuard::new(&name)?;
        fabric_rtt(cfg, &|id| {
            let c = FabricConfig::new(FabricKind::Shm, &name, rrpc::NodeId(id))
                .with_model(Some(model.into()));
            Ok(Fabric::open(&c)?)
        })
    }

    #[test]
    fn the_fabric_peer_runs_under_a_timing_model_and_with_odd_sizes() {
        let Some(cfg) = short_cfg(40, 200) else {
            return;
        };
        check(shm_fabric_rtt(&cfg, "odd", "none"));
        // Under a model, WRs execute only as the CQ is polled: a peer that did not poll
        // would never see its WRITE land and fail with a timeout.
        check(shm_fabric_rtt(&cfg, "cx5", "cx5"));
    }

    fn check(r: Result<RttSamples>) {
        let r = r.expect("peer run failed");
        assert!(r.round_trips > 0);
        assert_eq!(r.hist.len(), r.round_trips);
        assert!(r.mean_ns() > 0.0);
    }

    #[test]
    fn rejects_bad_config() {
        let Some(cfg) = short_cfg(32, 32) else { return };
        for bad in [
            PeerConfig {
                request_bytes: 4,
                ..cfg.clone()
            },
            PeerConfig {
                reply_bytes: 7,
                ..cfg.clone()
            },
            PeerConfig {
                server_core: cfg.client_core,
                ..cfg.clone()
            },
            PeerConfig {
                server_core: 100_000,
                ..cfg.clone()
            },
        ] {
            assert!(floor_rtt(&bad).is_err());
            assert!(
                fabric_rtt(&bad, &|_| panic!("a bad config must fail before opening")).is_err()
            );
            assert!(iceoryx2_rtt(&bad).is_err());
            assert!(tonic_rtt(&bad).is_err());
        }
    }

    #[test]
    fn all_peers_run() {
        let Some(cfg) = short_cfg(32, 32) else { return };
        check(floor_rtt(&cfg));
        check(shm_fabric_rtt(&cfg, "all-peers", "none"));
        check(iceoryx2_rtt(&cfg));
        check(iceoryx2_slice_rtt(&cfg));
        check(tonic_rtt(&cfg));
        let u64_cfg = short_cfg(8, 8).expect("cores vanished");
        check(iceoryx2_rtt(&u64_cfg));
        // Asymmetric sizes take the slice path.
        let odd = short_cfg(40, 200).expect("cores vanished");
        check(iceoryx2_rtt(&odd));
        check(tonic_rtt(&odd));
    }

    #[test]
    fn failing_server_fails_the_run_quickly() {
        let t = Instant::now();
        // Server fails after setup; the client waits for a reply that never comes.
        let r = run_pair(
            "test",
            |ctx| {
                ctx.rendezvous(Ok(()))?;
                bail!("boom")
            },
            |ctx| {
                ctx.rendezvous(Ok(()))?;
                let mut p = Patience::new();
                loop {
                    p.client_spin(ctx, "test")?;
                }
            },
        );
        let msg = format!("{:#}", r.err().expect("must fail"));
        assert!(msg.contains("boom"), "{msg}");
        // Server fails its setup; the client must not wait for it.
        let r = run_pair(
            "test",
            |ctx| ctx.rendezvous(Err(anyhow!("no setup"))),
            |ctx| {
                ctx.rendezvous(Ok(()))?;
                bail!("client must not get here")
            },
        );
        let msg = format!("{:#}", r.err().expect("must fail"));
        assert!(msg.contains("no setup"), "{msg}");
        assert!(t.elapsed() < REPLY_TIMEOUT);
    }
}
