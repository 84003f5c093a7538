//! iceoryx2 request-response over shared memory (`ipc::Service`).
//!
//! Method, following iceoryx2's own benchmarks
//! (`benchmarks/request-response/src/main.rs` and
//! `benchmarks/publish-subscribe/src/main.rs` in `eclipse-iceoryx/iceoryx2`):
//! * `ipc::Service` (the inter-process, shared-memory service variant; their
//!   request-response benchmark runs both `ipc::Service` and
//!   `local::Service`, we use `ipc` because it is the one usable between
//!   processes, like our own library), one node, services created up front
//!   with `max_servers(1)`, `max_clients(1)`, `max_response_buffer_size(1)`;
//! * ports created inside two threads pinned to two cores, a start barrier;
//! * busy polling (`receive()` in a tight loop), no waitset, no events;
//! * requests and responses loaned uninitialized and written in place
//!   (`loan_uninit` / `loan_slice_uninit` + `assume_init`), never `send_copy`;
//! * like their client, the next request is loaned right after sending the
//!   current one, i.e. while the server works.
//!
//! Their request-response benchmark ping-pongs *requests* over two services
//! (a2b, b2a) and reports total time / (2 * iterations) as one-way latency.
//! We measure a real RPC instead: the client sends a request on one service,
//! the server answers it through the request's `ActiveRequest` (a response),
//! the client receives it through its `PendingResponse`; one request in
//! flight. Safe overflow is on for requests and responses (the default,
//! made explicit), so no send can ever block on a full buffer.

use super::{fill_payload, read_counter, run_pair, Meter, Patience, PeerConfig, RttSamples};
use ::iceoryx2::prelude::*;
use anyhow::{anyhow, bail, Context as _, Result};
use std::fmt::Debug;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, Ordering};

/// Turns an iceoryx2 error (not all of them are `Send + Sync + 'static`
/// `std::error::Error`s) into an `anyhow::Error` with context.
fn ix<E: Debug>(what: &'static str) -> impl FnOnce(E) -> anyhow::Error {
    move |e| anyhow!("iceoryx2: {what}: {e:?}")
}

/// A service name no other run (in this or another process) uses.
fn unique_service_name() -> Result<(String, ServiceName)> {
    static RUN: AtomicU64 = AtomicU64::new(0);
    let run = RUN.fetch_add(1, Ordering::Relaxed);
    let text = format!("bench/peers/iceoryx2/rtt/{}/{run}", std::process::id());
    let name = ServiceName::new(&text).map_err(ix("service name"))?;
    Ok((text, name))
}

/// Creates the node the services of one run hang off. Signal handling is
/// disabled so the benchmark process keeps its own SIGINT/SIGTERM handling.
fn create_node() -> Result<Node<ipc::Service>> {
    NodeBuilder::new()
        .signal_handling_mode(SignalHandlingMode::Disabled)
        .create::<ipc::Service>()
        .map_err(ix("create node"))
}

/// Errors if the service of a finished run still exists.
fn ensure_gone(text: &str, name: &ServiceName) -> Result<()> {
    let exists = ipc::Service::does_exist(
        name,
        Config::global_config(),
        MessagingPattern::RequestResponse,
    )
    .map_err(ix("check that the service is removed"))?;
    if exists {
        bail!("iceoryx2: service {text:?} still exists after the run");
    }
    Ok(())
}

/// A fixed-size payload type whose first 8 bytes carry the round counter.
trait FixedPayload: Debug + ZeroCopySend + Send + Sync + Sized + 'static {
    /// Writes the whole payload in place: `counter` first, rest zero.
    fn fill(slot: &mut MaybeUninit<Self>, counter: u64);
    /// The counter stored by [`FixedPayload::fill`].
    fn counter(&self) -> u64;
}

impl FixedPayload for u64 {
    #[inline]
    fn fill(slot: &mut MaybeUninit<Self>, counter: u64) {
        slot.write(counter);
    }
    #[inline]
    fn counter(&self) -> u64 {
        *self
    }
}

impl<const N: usize> FixedPayload for [u8; N] {
    #[inline]
    fn fill(slot: &mut MaybeUninit<Self>, counter: u64) {
        const { assert!(N >= 8, "payload must hold the 8-byte counter") };
        fill_payload(slot.write([0u8; N]), counter);
    }
    #[inline]
    fn counter(&self) -> u64 {
        let mut head = [0u8; 8];
        head.copy_from_slice(&self[..8]);
        u64::from_le_bytes(head)
    }
}

/// Round-trip time of iceoryx2 request-response (crate `iceoryx2` 0.10,
/// `ipc::Service`, shared memory, busy polling), per round trip in ns.
///
/// The payload type is fixed-size, as in iceoryx2's benchmark (which uses
/// `u64`): `u64` when `request_bytes == reply_bytes == 8`, `[u8; N]` when
/// both are the same `N` in {16, 32, 64, 128, 256, 512, 1024, 2048, 4096};
/// any other combination falls back to the dynamic `[u8]` slice variant of
/// [`iceoryx2_slice_rtt`]. See the module docs for the method (after
/// iceoryx2's `benchmarks/request-response`).
pub fn iceoryx2_rtt(cfg: &PeerConfig) -> Result<RttSamples> {
    macro_rules! dispatch {
        ($($n:literal),*) => {
            match (cfg.request_bytes, cfg.reply_bytes) {
                (8, 8) => fixed_rtt::<u64, u64>(cfg),
                $(($n, $n) => fixed_rtt::<[u8; $n], [u8; $n]>(cfg),)*
                _ => iceoryx2_slice_rtt(cfg),
            }
        };
    }
    dispatch!(16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
}

/// Round-trip time of iceoryx2 request-response with dynamic `[u8]` slice
/// payloads of exactly `request_bytes` / `reply_bytes` bytes (client and
/// server created with `initial_max_slice_len`, messages loaned with
/// `loan_slice_uninit`), per round trip in ns. Otherwise identical to
/// [`iceoryx2_rtt`].
pub fn iceoryx2_slice_rtt(cfg: &PeerConfig) -> Result<RttSamples> {
    cfg.validate().context("iceoryx2: invalid config")?;
    let (text, name) = unique_service_name()?;
    let node = create_node()?;
    let service = node
        .service_builder(&name)
        .request_response::<[u8], [u8]>()
        .max_servers(1)
        .max_clients(1)
        .max_response_buffer_size(1)
        .enable_safe_overflow_for_requests(true)
        .enable_safe_overflow_for_responses(true)
        .create()
        .map_err(ix("create service"))?;
    let svc = &service;
    let result = run_pair(
        "iceoryx2",
        move |ctx| {
            let setup = super::pin_current(cfg.server_core).and_then(|()| {
                svc.server_builder()
                    .initial_max_slice_len(cfg.reply_bytes)
                    .create()
                    .map_err(ix("create server"))
            });
            let server = ctx.rendezvous(setup)?;
            loop {
                let mut patience = Patience::new();
                let request = loop {
                    if let Some(r) = server.receive().map_err(ix("receive request"))? {
                        break r;
                    }
                    if patience.server_spin(ctx) {
                        return Ok(());
                    }
                };
                let counter = read_counter(request.payload())
                    .ok_or_else(|| anyhow!("iceoryx2: request shorter than 8 bytes"))?;
                let mut response = request
                    .loan_slice_uninit(cfg.reply_bytes)
                    .map_err(ix("loan response"))?;
                fill_uninit(response.payload_mut(), counter);
                // SAFETY: `fill_uninit` initialized every byte of the payload.
                let response = unsafe { response.assume_init() };
                response.send().map_err(ix("send response"))?;
                // `request` (the ActiveRequest) is dropped here, which ends
                // the response stream of this request.
            }
        },
        move |ctx| {
            let setup = super::pin_current(cfg.client_core).and_then(|()| {
                let client = svc
                    .client_builder()
                    .initial_max_slice_len(cfg.request_bytes)
                    .create()
                    .map_err(ix("create client"))?;
                Ok((client, Meter::new(cfg)?))
            });
            let (client, mut meter) = ctx.rendezvous(setup)?;
            let mut next = client
                .loan_slice_uninit(cfg.request_bytes)
                .map_err(ix("loan request"))?;
            meter.arm();
            let mut i = 0u64;
            loop {
                i += 1;
                let t0 = meter.now();
                let mut request = next;
                fill_uninit(request.payload_mut(), i);
                // SAFETY: `fill_uninit` initialized every byte of the payload.
                let request = unsafe { request.assume_init() };
                let pending = request.send().map_err(ix("send request"))?;
                // Loan the next request while the server works, as
                // iceoryx2's benchmark does.
                next = client
                    .loan_slice_uninit(cfg.request_bytes)
                    .map_err(ix("loan request"))?;
                let mut patience = Patience::new();
                let response = loop {
                    if let Some(r) = pending.receive().map_err(ix("receive response"))? {
                        break r;
                    }
                    patience.client_spin(ctx, "iceoryx2: wait for response")?;
                };
                check_reply(
                    response.payload().len(),
                    read_counter(response.payload()),
                    i,
                    cfg,
                )?;
                drop(response);
                drop(pending);
                if meter.record(t0) {
                    return Ok(meter.finish());
                }
            }
        },
    );
    drop(service);
    drop(node);
    let gone = ensure_gone(&text, &name);
    let samples = result?;
    gone?;
    Ok(samples)
}

/// The fixed-size-type variant behind [`iceoryx2_rtt`].
fn fixed_rtt<Req: FixedPayload, Resp: FixedPayload>(cfg: &PeerConfig) -> Result<RttSamples> {
    cfg.validate().context("iceoryx2: invalid config")?;
    let (text, name) = unique_service_name()?;
    let node = create_node()?;
    let service = node
        .service_builder(&name)
        .request_response::<Req, Resp>()
        .max_servers(1)
        .max_clients(1)
        .max_response_buffer_size(1)
        .enable_safe_overflow_for_requests(true)
        .enable_safe_overflow_for_responses(true)
        .create()
        .map_err(ix("create service"))?;
    let svc = &service;
    let result = run_pair(
        "iceoryx2",
        move |ctx| {
            let setup = super::pin_current(cfg.server_core)
                .and_then(|()| svc.server_builder().create().map_err(ix("create server")));
            let server = ctx.rendezvous(setup)?;
            loop {
                let mut patience = Patience::new();
                let request = loop {
                    if let Some(r) = server.receive().map_err(ix("receive request"))? {
                        break r;
                    }
                    if patience.server_spin(ctx) {
                        return Ok(());
                    }
                };
                let counter = request.payload().counter();
                let mut response = request.loan_uninit().map_err(ix("loan response"))?;
                Resp::fill(response.payload_mut(), counter);
                // SAFETY: `Resp::fill` initialized the whole payload.
                let response = unsafe { response.assume_init() };
                response.send().map_err(ix("send response"))?;
                // `request` (the ActiveRequest) is dropped here, which ends
                // the response stream of this request.
            }
        },
        move |ctx| {
            let setup = super::pin_current(cfg.client_core).and_then(|()| {
                let client = svc.client_builder().create().map_err(ix("create client"))?;
                Ok((client, Meter::new(cfg)?))
            });
            let (client, mut meter) = ctx.rendezvous(setup)?;
            let mut next = client.loan_uninit().map_err(ix("loan request"))?;
            meter.arm();
            let mut i = 0u64;
            loop {
                i += 1;
                let t0 = meter.now();
                let mut request = next;
                Req::fill(request.payload_mut(), i);
                // SAFETY: `Req::fill` initialized the whole payload.
                let request = unsafe { request.assume_init() };
                let pending = request.send().map_err(ix("send request"))?;
                // Loan the next request while the server works, as
                // iceoryx2's benchmark does.
                next = client.loan_uninit().map_err(ix("loan request"))?;
                let mut patience = Patience::new();
                let response = loop {
                    if let Some(r) = pending.receive().map_err(ix("receive response"))? {
                        break r;
                    }
                    patience.client_spin(ctx, "iceoryx2: wait for response")?;
                };
                let got = response.payload().counter();
                check_reply(size_of::<Resp>(), Some(got), i, cfg)?;
                drop(response);
                drop(pending);
                if meter.record(t0) {
                    return Ok(meter.finish());
                }
            }
        },
    );
    drop(service);
    drop(node);
    let gone = ensure_gone(&text, &name);
    let samples = result?;
    gone?;
    Ok(samples)
}

/// Writes the whole uninitialized slice: `counter` first, rest zero.
#[inline]
fn fill_uninit(buf: &mut [MaybeUninit<u8>], counter: u64) {
    buf.fill(MaybeUninit::new(0));
    for (dst, b) in buf.iter_mut().zip(counter.to_le_bytes()) {
        *dst = MaybeUninit::new(b);
    }
}

/// Checks a reply's length and echoed counter.
#[inline]
fn check_reply(len: usize, counter: Option<u64>, expected: u64, cfg: &PeerConfig) -> Result<()> {
    if len != cfg.reply_bytes {
        bail!(
            "iceoryx2: reply has {len} bytes, expected {}",
            cfg.reply_bytes
        );
    }
    if counter != Some(expected) {
        bail!("iceoryx2: reply echoes counter {counter:?}, expected {expected}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ensure_gone_sees_live_service() {
        let (text, name) = unique_service_name().expect("name");
        let node = create_node().expect("node");
        let service = node
            .service_builder(&name)
            .request_response::<u64, u64>()
            .create()
            .expect("service");
        assert!(ensure_gone(&text, &name).is_err());
        drop(service);
        drop(node);
        assert!(ensure_gone(&text, &name).is_ok());
    }
}
