//! The RCC suite's `tcp` transport: the RPC variants' calls over tonic (gRPC, HTTP/2 over
//! loopback TCP), to compare rrpc with TCP as RCC compares its RDMA RPC with TCP (RCC, 5,
//! Table 3: 5.2-10x).
//!
//! Hand-written like the rrpc-bench tonic peer ([`crate::peers`]): no protoc, a
//! `prost::Message` and the `tower::Service` glue `tonic-build` would generate. One
//! tokio runtime per run (as many worker threads as nodes) serves every node's
//! `rcc.Node/Call` on its own loopback port (`TCP_NODELAY`) and drives the clients'
//! HTTP/2 connections. A node's coordinators stay on its rrpc thread: each call is
//! spawned onto the runtime (one lazily connected `Channel` per destination node, shared
//! by the thread's coordinators) and its reply awaited through a oneshot channel, which
//! wakes the rrpc executor from the tokio thread. The server answers through the node's
//! [`NodeHandlers`] over the partition's shared memory; WAITDIE's waiting fetch yields
//! with tokio's yield.

use std::convert::Infallible;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr, TcpListener as StdTcpListener};
use std::pin::Pin;
use std::task::{Context, Poll};

use ::tonic::body::Body;
use ::tonic::client::Grpc as GrpcClient;
use ::tonic::server::{Grpc as GrpcServer, NamedService, UnaryService};
use ::tonic::transport::server::TcpIncoming;
use ::tonic::transport::{Channel, Endpoint, Server};
use ::tonic::{Request, Response, Status};
use bytes::Bytes;
use http::uri::PathAndQuery;
use rcc::calls::{CallCluster, CallFuture, CallTransport, CallTransportFactory, NodeHandlers};
use tonic_prost::ProstCodec;

/// Full gRPC path of the call method.
const CALL_PATH: &str = "/rcc.Node/Call";

/// A request: `message Call { uint32 handler = 1; bytes payload = 2; }`; a reply carries
/// the handler's reply in `payload` (a handler's error is the status message).
#[derive(Clone, PartialEq, prost::Message)]
struct Msg {
    /// Handler id (requests only).
    #[prost(uint32, tag = "1")]
    handler: u32,
    /// The request or the reply.
    #[prost(bytes = "bytes", tag = "2")]
    payload: Bytes,
}

/// The `Call` method over one node's handlers.
struct CallMethod {
    handlers: NodeHandlers,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'static>>;

impl UnaryService<Msg> for CallMethod {
    type Response = Msg;
    type Future = BoxFuture<Response<Msg>, Status>;

    fn call(&mut self, request: Request<Msg>) -> Self::Future {
        let h = self.handlers.clone();
        Box::pin(async move {
            let m = request.into_inner();
            let Ok(id) = u16::try_from(m.handler) else {
                return Err(Status::invalid_argument("handler id out of range"));
            };
            match h
                .serve(id, m.payload.to_vec(), tokio::task::yield_now)
                .await
            {
                Ok(reply) => Ok(Response::new(Msg {
                    handler: 0,
                    payload: reply.into(),
                })),
                Err(e) => Err(Status::internal(e)),
            }
        })
    }
}

/// The `rcc.Node` service of one node, as `tonic-build` would generate it.
#[derive(Clone)]
struct NodeServer {
    handlers: NodeHandlers,
}

impl NamedService for NodeServer {
    const NAME: &'static str = "rcc.Node";
}

impl tower_service::Service<http::Request<Body>> for NodeServer {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        if req.uri().path() != CALL_PATH {
            return Box::pin(async { Ok(Status::unimplemented("unknown method").into_http()) });
        }
        let method = CallMethod {
            handlers: self.handlers.clone(),
        };
        Box::pin(async move {
            let mut grpc = GrpcServer::new(ProstCodec::<Msg, Msg>::default());
            Ok(grpc.unary(method, req).await)
        })
    }
}

/// The `tcp` transport of the RCC suite: tonic over loopback TCP
/// ([`rcc::cluster::RunConfig::calls`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct TonicCalls;

impl CallTransportFactory for TonicCalls {
    fn name(&self) -> &str {
        "tcp"
    }

    fn start(&self, handlers: Vec<NodeHandlers>) -> Result<Box<dyn CallCluster>, String> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(handlers.len().max(1))
            .thread_name("rcc-tonic")
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| format!("tonic: tokio runtime: {e}"))?;
        let mut addrs = Vec::new();
        let mut stops = Vec::new();
        for h in handlers {
            let listener = StdTcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .map_err(|e| format!("tonic: bind 127.0.0.1:0: {e}"))?;
            listener
                .set_nonblocking(true)
                .map_err(|e| format!("tonic: non-blocking listener: {e}"))?;
            addrs.push(
                listener
                    .local_addr()
                    .map_err(|e| format!("tonic: listener address: {e}"))?,
            );
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            stops.push(tx);
            let listener = {
                let _g = rt.enter();
                tokio::net::TcpListener::from_std(listener)
                    .map_err(|e| format!("tonic: register the listener: {e}"))?
            };
            // `serve_with_incoming*` ignores `Server::tcp_nodelay`: set it per socket.
            let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
            rt.spawn(async move {
                let r = Server::builder()
                    .tcp_nodelay(true)
                    .serve_with_incoming_shutdown(NodeServer { handlers: h }, incoming, async {
                        let _ = rx.await;
                    })
                    .await;
                if let Err(e) = r {
                    eprintln!("rcc tcp transport: a node's server failed: {e}");
                }
            });
        }
        Ok(Box::new(TonicCluster {
            rt: Some(rt),
            addrs,
            _stops: stops,
        }))
    }
}

/// Every node's tonic server on one tokio runtime; dropping it stops them.
struct TonicCluster {
    rt: Option<tokio::runtime::Runtime>,
    addrs: Vec<SocketAddr>,
    /// Dropped with the cluster: each server's shutdown signal.
    _stops: Vec<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for TonicCluster {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl CallCluster for TonicCluster {
    fn client(&self) -> Result<Box<dyn CallTransport + Send>, String> {
        let rt = self.rt.as_ref().ok_or("tonic: the runtime is gone")?;
        let _g = rt.enter();
        let channels = self
            .addrs
            .iter()
            .map(|a| {
                Endpoint::from_shared(format!("http://{a}"))
                    .map(|e| e.tcp_nodelay(true).connect_lazy())
                    .map_err(|e| format!("tonic: endpoint {a}: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Box::new(TonicClient {
            handle: rt.handle().clone(),
            channels,
        }))
    }
}

/// One node thread's client: a channel per destination node.
struct TonicClient {
    handle: tokio::runtime::Handle,
    channels: Vec<Channel>,
}

impl CallTransport for TonicClient {
    fn call(&self, node: usize, handler: u16, req: Vec<u8>) -> CallFuture {
        let Some(ch) = self.channels.get(node).cloned() else {
            return Box::pin(async move { Err(format!("no node {node}")) });
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.handle.spawn(async move {
            let mut grpc = GrpcClient::new(ch);
            let r = async {
                grpc.ready()
                    .await
                    .map_err(|e| format!("tonic: channel not ready: {e}"))?;
                grpc.unary(
                    Request::new(Msg {
                        handler: handler.into(),
                        payload: req.into(),
                    }),
                    PathAndQuery::from_static(CALL_PATH),
                    ProstCodec::<Msg, Msg>::default(),
                )
                .await
                .map(|r| r.into_inner().payload.to_vec())
                .map_err(|s| format!("tonic: {}: {}", s.code(), s.message()))
            }
            .await;
            let _ = tx.send(r);
        });
        Box::pin(async move {
            rx.await
                .unwrap_or_else(|_| Err("tonic: the transport shut down".into()))
        })
    }
}
