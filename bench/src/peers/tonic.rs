//! tonic unary gRPC over loopback TCP.
//!
//! No protoc and no build script: the message is a hand-written
//! `prost::Message` and the service glue is what `tonic-build` would
//! generate, written by hand: the server is a `tower::Service` that routes
//! the method path to `tonic::server::Grpc::unary` with
//! `tonic_prost::ProstCodec`, the client calls `tonic::client::Grpc::unary`
//! on a `tonic::transport::Channel`. This is tonic's standard stack
//! (hyper/h2 HTTP/2, tower buffer in the channel).
//!
//! Differences from a generated server, both in tonic's favour and both
//! negligible next to a loopback TCP round trip: the method handler returns
//! a ready future instead of a boxed `async_trait` future, and the service
//! is served directly (`serve_with_incoming_shutdown`) instead of through the
//! axum-based `Router` (tonic's `router` feature), as there is only one.

use super::{fill_payload, read_counter, run_pair, Meter, PeerConfig, RttSamples, REPLY_TIMEOUT};
use ::tonic::body::Body;
use ::tonic::client::Grpc as GrpcClient;
use ::tonic::server::{Grpc as GrpcServer, NamedService, UnaryService};
use ::tonic::transport::server::TcpIncoming;
use ::tonic::transport::{Endpoint, Server};
use ::tonic::{Request, Response, Status};
use anyhow::{anyhow, bail, Context as _, Result};
use bytes::{Bytes, BytesMut};
use http::uri::PathAndQuery;
use std::convert::Infallible;
use std::future::{ready, Future, Ready};
use std::net::{Ipv4Addr, SocketAddr, TcpListener as StdTcpListener};
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::Duration;
use tonic_prost::ProstCodec;

/// Full gRPC path of the echo method.
const ECHO_PATH: &str = "/bench.Echo/Echo";

/// The request and the reply message: `message Msg { bytes payload = 1; }`.
#[derive(Clone, PartialEq, prost::Message)]
struct Msg {
    /// Counter in the first 8 bytes, then zeros.
    #[prost(bytes = "bytes", tag = "1")]
    payload: Bytes,
}

/// A `Msg` with `len` bytes of payload carrying `counter`.
fn msg(len: usize, counter: u64) -> Msg {
    let mut payload = BytesMut::zeroed(len);
    fill_payload(&mut payload, counter);
    Msg {
        payload: payload.freeze(),
    }
}

/// The `Echo` method handler: replies `reply_bytes` bytes echoing the
/// request's counter.
struct EchoMethod {
    reply_bytes: usize,
}

impl UnaryService<Msg> for EchoMethod {
    type Response = Msg;
    type Future = Ready<Result<Response<Msg>, Status>>;

    fn call(&mut self, request: Request<Msg>) -> Self::Future {
        ready(match read_counter(&request.get_ref().payload) {
            Some(counter) => Ok(Response::new(msg(self.reply_bytes, counter))),
            None => Err(Status::invalid_argument("payload shorter than 8 bytes")),
        })
    }
}

/// The `bench.Echo` service, as `tonic-build` would generate it.
#[derive(Clone)]
struct EchoServer {
    reply_bytes: usize,
}

impl NamedService for EchoServer {
    const NAME: &'static str = "bench.Echo";
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = Result<T, Infallible>> + Send + 'static>>;

impl tower_service::Service<http::Request<Body>> for EchoServer {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        if req.uri().path() != ECHO_PATH {
            return Box::pin(async { Ok(Status::unimplemented("unknown method").into_http()) });
        }
        let method = EchoMethod {
            reply_bytes: self.reply_bytes,
        };
        Box::pin(async move {
            let mut grpc = GrpcServer::new(ProstCodec::<Msg, Msg>::default());
            Ok(grpc.unary(method, req).await)
        })
    }
}

/// Builds the current-thread tokio runtime of one side.
fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .context("tonic: build tokio runtime")
}

/// Round-trip time of a tonic (0.14) unary gRPC call over loopback TCP
/// (127.0.0.1, OS-chosen port, TCP_NODELAY on both sides), per round trip
/// in ns.
///
/// Server: `tonic::transport::Server` on a current-thread tokio runtime on a
/// thread pinned to `server_core`. Client: a `tonic::transport::Channel` on
/// a current-thread tokio runtime on a thread pinned to `client_core`, one
/// call in flight. tokio parks in epoll when idle: this peer does not busy
/// poll (tokio has no such mode). The request carries `request_bytes` bytes,
/// the reply `reply_bytes` bytes (protobuf `bytes` field; the on-wire
/// messages are a few bytes larger). The client gives up if no call
/// completes for [`REPLY_TIMEOUT`]; the server shuts down gracefully when
/// the client is done (or has failed).
pub fn tonic_rtt(cfg: &PeerConfig) -> Result<RttSamples> {
    cfg.validate().context("tonic: invalid config")?;
    let addr_cell: OnceLock<SocketAddr> = OnceLock::new();
    let addr_cell = &addr_cell;
    // Dropping the sender (client thread exit, however it exits) shuts the
    // server down.
    let (shutdown_tx, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
    run_pair(
        "tonic",
        move |ctx| {
            let setup = super::pin_current(cfg.server_core).and_then(|()| {
                let rt = runtime()?;
                let listener = StdTcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                    .context("tonic: bind 127.0.0.1:0")?;
                listener
                    .set_nonblocking(true)
                    .context("tonic: set listener non-blocking")?;
                let addr = listener.local_addr().context("tonic: listener address")?;
                addr_cell
                    .set(addr)
                    .map_err(|_| anyhow!("tonic: listener address set twice"))?;
                Ok((rt, listener))
            });
            let (rt, listener) = ctx.rendezvous(setup)?;
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener)
                    .context("tonic: register listener with tokio")?;
                // `serve_with_incoming*` ignores `Server::tcp_nodelay`; the
                // incoming stream sets it on every accepted socket.
                let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
                Server::builder()
                    .tcp_nodelay(true)
                    .serve_with_incoming_shutdown(
                        EchoServer {
                            reply_bytes: cfg.reply_bytes,
                        },
                        incoming,
                        async move {
                            let _ = shutdown_rx.await;
                        },
                    )
                    .await
                    .context("tonic: serve")
            })
        },
        move |ctx| {
            let _shutdown = shutdown_tx;
            let setup = super::pin_current(cfg.client_core)
                .and_then(|()| Ok((runtime()?, Meter::new(cfg)?)));
            let (rt, meter) = ctx.rendezvous(setup)?;
            let addr = *addr_cell
                .get()
                .ok_or_else(|| anyhow!("tonic: server address missing"))?;
            rt.block_on(client(cfg, addr, meter))
        },
    )
}

/// The client side: connect, then call until the meter says stop, watched
/// by a progress watchdog.
async fn client(cfg: &PeerConfig, addr: SocketAddr, mut meter: Meter) -> Result<RttSamples> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .context("tonic: endpoint")?
        .tcp_nodelay(true)
        .connect_timeout(REPLY_TIMEOUT)
        .connect()
        .await
        .with_context(|| format!("tonic: connect to {addr}"))?;
    let mut grpc = GrpcClient::new(channel);
    let path = PathAndQuery::from_static(ECHO_PATH);
    let progress = std::cell::Cell::new(0u64);

    let calls = async {
        meter.arm();
        let mut i = 0u64;
        loop {
            i += 1;
            let t0 = meter.now();
            let request = Request::new(msg(cfg.request_bytes, i));
            grpc.ready()
                .await
                .map_err(|e| anyhow!("tonic: channel not ready: {e}"))?;
            let reply: Response<Msg> = grpc
                .unary(request, path.clone(), ProstCodec::<Msg, Msg>::default())
                .await
                .map_err(|s| anyhow!("tonic: call: {s}"))?;
            let payload = &reply.get_ref().payload;
            if payload.len() != cfg.reply_bytes {
                bail!(
                    "tonic: reply has {} bytes, expected {}",
                    payload.len(),
                    cfg.reply_bytes
                );
            }
            let got = read_counter(payload);
            if got != Some(i) {
                bail!("tonic: reply echoes counter {got:?}, expected {i}");
            }
            progress.set(i);
            if meter.record(t0) {
                return Ok(());
            }
        }
    };

    // Fails the run if no call completes for REPLY_TIMEOUT. It only wakes up
    // once per tick, so it costs next to nothing per call.
    let watchdog = async {
        const TICK: Duration = Duration::from_millis(500);
        let mut last = progress.get();
        let mut stalled = Duration::ZERO;
        loop {
            tokio::time::sleep(TICK).await;
            let now = progress.get();
            if now == last {
                stalled += TICK;
                if stalled >= REPLY_TIMEOUT {
                    bail!("tonic: no reply within {REPLY_TIMEOUT:?}");
                }
            } else {
                last = now;
                stalled = Duration::ZERO;
            }
        }
    };

    tokio::select! {
        biased;
        r = calls => r?,
        r = watchdog => r?,
    }
    Ok(meter.finish())
}
