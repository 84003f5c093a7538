//! Hardware floor: a cache-line ping-pong between two pinned threads.

use super::{run_pair, Meter, Patience, PeerConfig, RttSamples};
use anyhow::{Context as _, Result};
use std::sync::atomic::{AtomicU64, Ordering};

/// One atomic word alone on its own 128-byte block (two cache lines, so the
/// adjacent-line prefetcher cannot couple the two directions).
#[repr(align(128))]
struct Line(AtomicU64);

/// The client writes the round counter into `ping`; the server echoes it
/// into `pong`.
struct PingPong {
    ping: Line,
    pong: Line,
}

/// Round-trip time of a two-thread cache-line ping-pong: the hardware floor
/// of any shared-memory round trip between `client_core` and `server_core`.
///
/// The client stores round counter `i` (8 bytes) into its own cache line; the
/// server spins (plain loads, no `pause`) until it sees a new value and
/// stores it into a second cache line; the client spins until it reads `i`
/// back. A round trip thus costs two cross-core cache-line transfers (the
/// ping line to the server, the pong line to the client), plus the ownership
/// requests of the next writes. `request_bytes`/`reply_bytes` are not used: only the
/// 8-byte counter moves. Latencies are recorded per round trip in ns; see
/// the module docs of [`crate::peers`] for the common method.
pub fn floor_rtt(cfg: &PeerConfig) -> Result<RttSamples> {
    cfg.validate().context("floor: invalid config")?;
    let pp = PingPong {
        ping: Line(AtomicU64::new(0)),
        pong: Line(AtomicU64::new(0)),
    };
    let pp = &pp;
    run_pair(
        "floor",
        move |ctx| {
            ctx.rendezvous(super::pin_current(cfg.server_core))?;
            let mut last = 0u64;
            let mut patience = Patience::new();
            loop {
                let v = pp.ping.0.load(Ordering::Acquire);
                if v == last {
                    if patience.server_spin(ctx) {
                        return Ok(());
                    }
                    continue;
                }
                pp.pong.0.store(v, Ordering::Release);
                last = v;
            }
        },
        move |ctx| {
            let setup = super::pin_current(cfg.client_core).and_then(|()| Meter::new(cfg));
            let mut meter = ctx.rendezvous(setup)?;
            meter.arm();
            let mut i = 0u64;
            loop {
                i += 1;
                let t0 = meter.now();
                pp.ping.0.store(i, Ordering::Release);
                let mut patience = Patience::new();
                while pp.pong.0.load(Ordering::Acquire) != i {
                    patience.client_spin(ctx, "floor: wait for pong")?;
                }
                if meter.record(t0) {
                    return Ok(meter.finish());
                }
            }
        },
    )
}
