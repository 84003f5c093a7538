//! TCP control-plane ("bootstrap") service used to exchange connection
//! descriptors between processes before RDMA queue pairs can talk to each
//! other (the role played by `rdma_cm` or RCC's QP thread).
//!
//! # Wire protocol
//!
//! Every message is a *frame*: a 4-byte big-endian length `N` followed by `N`
//! bytes of UTF-8 JSON, with `N <= MAX_FRAME_BYTES`. A request body is any
//! JSON value; a response body is either `{"ok": <value>}` or
//! `{"err": "<message>"}`. One connection carries any number of
//! request/response pairs in sequence, answered in order.
//!
//! # Authentication
//!
//! With a cluster secret ([`crate::auth`]), a server answers nothing on a connection
//! until the client passed the mutual challenge, two request/response pairs whose bodies
//! are `{"auth": ..}` ([`crate::auth::AuthMsg`]); a connection that sends anything else
//! first, or fails the challenge, gets one `{"err": ..}` answer, is closed and is logged
//! with the peer's address. The client checks the server's proof in turn, and refuses a
//! server without the secret. Without a secret, connections are served as they come.
//!
//! # Pieces
//!
//! * [`BootstrapServer`] serves requests with a user handler on a background
//!   thread running a `mio` event loop.
//! * [`BootstrapClient`] is a blocking client with a per-call time bound.
//! * [`call_with_retry`] connects to a server that may still be starting and
//!   performs one call.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use serde_json::Value;
use tracing::{debug, warn};

use crate::auth::{
    self, AuthMsg, Challenge, ClientHandshake, ClusterSecret, Identity, Proof, SecretError,
    ServerHandshake, AUTH_KEY,
};

/// Largest frame body, in bytes, that either side accepts or sends (64 KiB).
///
/// The 4-byte length prefix is not counted.
pub const MAX_FRAME_BYTES: usize = 64 * 1024;

/// Size of the length prefix in bytes.
const HEADER_BYTES: usize = 4;

/// Once this many response bytes are queued on a connection, the server stops
/// reading further requests from it until the peer drains its responses.
const WBUF_HIGH_WATER: usize = 4 * MAX_FRAME_BYTES;

/// After answering an oversized request, the server discards at most this many
/// further bytes from that peer while waiting for it to close.
const DRAIN_LIMIT: usize = 4 * MAX_FRAME_BYTES;

/// How long the event loop waits before retrying `accept` after a resource
/// error such as "too many open files".
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// Pause between connection attempts in [`call_with_retry`].
const RETRY_INTERVAL: Duration = Duration::from_millis(20);

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
const FIRST_CONN: usize = 2;

/// Errors reported by the bootstrap server and client.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BootstrapError {
    /// An operating-system I/O error other than a timeout or a closed peer.
    /// `op` names the operation that failed (for example `"connect"`,
    /// `"bind"`, `"read"`).
    #[error("bootstrap I/O error during {op}: {source}")]
    Io {
        /// The operation that failed.
        op: &'static str,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A client connect, read or write did not complete within the time bound
    /// given to [`BootstrapClient::connect`] (or the deadline given to
    /// [`call_with_retry`]). `op` names the operation that timed out.
    #[error("bootstrap {op} timed out")]
    Timeout {
        /// The operation that timed out.
        op: &'static str,
    },
    /// A frame of `len` bytes exceeds the `max`-byte limit
    /// ([`MAX_FRAME_BYTES`]); raised for an outgoing request that is too large
    /// (nothing is sent) or for an incoming response whose length prefix is
    /// too large.
    #[error("frame of {len} bytes exceeds the {max}-byte limit")]
    FrameTooLarge {
        /// Length of the offending frame body, in bytes.
        len: usize,
        /// The limit, in bytes.
        max: usize,
    },
    /// A response was not valid JSON, was neither `{"ok": ..}` nor
    /// `{"err": "<string>"}`, or a value could not be converted to or from
    /// the requested Rust type.
    #[error("malformed bootstrap message: {0}")]
    Malformed(String),
    /// The server answered `{"err": msg}`; carries `msg`.
    #[error("bootstrap server returned an error: {0}")]
    Remote(String),
    /// The peer closed (or reset) the connection, or the connection is no
    /// longer usable because an earlier call on it failed mid-exchange.
    #[error("bootstrap connection closed")]
    Closed,
    /// The cluster-secret challenge failed: the node at `addr` refused this side's
    /// proof (a wrong or missing cluster secret), has no secret itself, or could not
    /// prove it holds this side's. Not retried.
    #[error("control connection to {addr} refused: authentication failed: {why}")]
    Auth {
        /// The node's address.
        addr: SocketAddr,
        /// What failed.
        why: String,
    },
    /// This process's cluster secret cannot be had (see [`auth::process_secret`]).
    #[error(transparent)]
    Secret(#[from] SecretError),
}

/// How a [`BootstrapServer`] admits connections.
#[derive(Clone, Debug, Default)]
pub struct ServerAuth {
    /// The cluster secret every connection must prove; `None` admits every connection
    /// unauthenticated.
    pub secret: Option<ClusterSecret>,
    /// Who this server says it is (bound into the proofs, shown to clients).
    pub identity: Identity,
}

impl ServerAuth {
    /// This process's secret ([`auth::process_secret`]) with `identity`.
    ///
    /// Errors: [`BootstrapError::Secret`].
    pub fn process(identity: Identity) -> Result<Self, BootstrapError> {
        Ok(Self {
            secret: auth::process_secret()?,
            identity,
        })
    }
}

/// How a [`BootstrapClient`] proves itself.
#[derive(Clone, Debug, Default)]
pub struct ClientAuth {
    /// The cluster secret to prove, and to demand the server prove; `None` connects
    /// unauthenticated (refused by a server with a secret).
    pub secret: Option<ClusterSecret>,
    /// Who this client says it is (a node checks a Rocket pair's node id against it).
    pub identity: Identity,
}

impl ClientAuth {
    /// This process's secret ([`auth::process_secret`]) with `identity`.
    ///
    /// Errors: [`BootstrapError::Secret`].
    pub fn process(identity: Identity) -> Result<Self, BootstrapError> {
        Ok(Self {
            secret: auth::process_secret()?,
            identity,
        })
    }
}

/// What a server's handler knows about the connection a request came on.
#[derive(Clone, Debug)]
pub struct Peer {
    /// The client's address.
    pub addr: SocketAddr,
    /// The identity the client proved with the cluster secret; `None` on a server
    /// without a secret.
    pub identity: Option<Identity>,
}

fn io_err(op: &'static str) -> impl FnOnce(io::Error) -> BootstrapError {
    move |source| BootstrapError::Io { op, source }
}

/// Maps an error from a blocking client socket operation to a
/// [`BootstrapError`], turning timeouts and closed peers into their own
/// variants.
fn map_client_io(op: &'static str, e: io::Error) -> BootstrapError {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => BootstrapError::Timeout { op },
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::UnexpectedEof => BootstrapError::Closed,
        _ => BootstrapError::Io { op, source: e },
    }
}

/// Encodes `body` as a frame (length prefix + body). The caller guarantees
/// `body.len() <= MAX_FRAME_BYTES`.
fn push_frame(out: &mut Vec<u8>, body: &[u8]) {
    // MAX_FRAME_BYTES fits in a u32, and callers check the limit first.
    let len = u32::try_from(body.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(body);
}

fn err_body(message: String) -> Vec<u8> {
    let mut map = serde_json::Map::new();
    map.insert("err".to_owned(), Value::String(message));
    // Serializing a `Value` with string keys cannot fail.
    serde_json::to_vec(&Value::Object(map))
        .unwrap_or_else(|_| br#"{"err":"internal encoding error"}"#.to_vec())
}

/// Builds the framed response for a handler result, replacing a response that
/// would exceed [`MAX_FRAME_BYTES`] with an error response so the stream stays
/// in sync.
fn encode_response(out: &mut Vec<u8>, result: Result<Value, String>) {
    let body = match result {
        Ok(v) => {
            let mut map = serde_json::Map::new();
            map.insert("ok".to_owned(), v);
            match serde_json::to_vec(&Value::Object(map)) {
                Ok(b) => b,
                Err(e) => err_body(format!("cannot encode response: {e}")),
            }
        }
        Err(msg) => err_body(msg),
    };
    if body.len() > MAX_FRAME_BYTES {
        let len = body.len();
        warn!(
            len,
            "bootstrap response exceeds the frame limit; sending an error instead"
        );
        let body = err_body(format!(
            "response of {len} bytes exceeds the {MAX_FRAME_BYTES}-byte limit"
        ));
        push_frame(out, &body);
    } else {
        push_frame(out, &body);
    }
}

/// What the event loop should do with a connection after driving it.
#[derive(Debug, PartialEq, Eq)]
enum ConnFate {
    Keep,
    Close,
}

/// Per-connection state of the server.
struct Conn {
    stream: TcpStream,
    peer: SocketAddr,
    /// Bytes received and not yet consumed as frames.
    rbuf: Vec<u8>,
    /// Framed responses not yet written to the socket.
    wbuf: Vec<u8>,
    /// The socket may have more data to read (edge-triggered readiness).
    can_read: bool,
    /// The peer closed its write half.
    eof: bool,
    /// An oversized request was seen: answer, then close.
    closing: bool,
    /// Our write half has been shut down (only when `closing`).
    write_shut: bool,
    /// Bytes discarded while `closing`.
    discarded: usize,
    /// Interest currently registered with the poll.
    interest: Interest,
    /// Where the connection is in the cluster-secret challenge.
    auth: ConnAuth,
}

/// A server connection's place in the challenge ([`crate::auth`]).
enum ConnAuth {
    /// The server has no secret: requests go to the handler.
    Open,
    /// Waiting for the client's hello; the server's secret and identity.
    Hello(ClusterSecret, Identity),
    /// Waiting for the client's proof.
    Proof(ServerHandshake),
    /// The client proved the secret, as this identity.
    Done(Identity),
    /// Refused; the connection is closing.
    Refused,
}

impl ConnAuth {
    fn new(auth: &ServerAuth) -> Self {
        match &auth.secret {
            Some(s) => Self::Hello(s.clone(), auth.identity.clone()),
            None => Self::Open,
        }
    }
}

impl Conn {
    fn new(stream: TcpStream, peer: SocketAddr, auth: ConnAuth) -> Self {
        Conn {
            stream,
            peer,
            rbuf: Vec::new(),
            wbuf: Vec::new(),
            can_read: true,
            eof: false,
            closing: false,
            write_shut: false,
            discarded: 0,
            interest: Interest::READABLE,
            auth,
        }
    }

    /// Refuse the connection: log `why` with the peer's address, answer with it, then
    /// close.
    fn refuse(&mut self, why: &str) -> Result<Value, String> {
        warn!(peer = %self.peer, "control connection from {} refused: {why}", self.peer);
        self.auth = ConnAuth::Refused;
        self.closing = true;
        self.rbuf = Vec::new();
        Err(format!("control connection refused: {why}"))
    }

    /// Answer one request: a step of the challenge, or (once it passed, or without a
    /// secret) the handler's answer.
    fn dispatch<H>(&mut self, req: Value, handler: &mut H) -> Result<Value, String>
    where
        H: FnMut(&Peer, Value) -> Result<Value, String>,
    {
        let msg = match &req {
            Value::Object(m) if m.len() == 1 => m.get(AUTH_KEY).cloned(),
            _ => None,
        };
        let msg = msg.map(serde_json::from_value::<AuthMsg>);
        match (std::mem::replace(&mut self.auth, ConnAuth::Refused), msg) {
            (ConnAuth::Open, None) => {
                self.auth = ConnAuth::Open;
                let peer = Peer {
                    addr: self.peer,
                    identity: None,
                };
                handler(&peer, req)
            }
            (ConnAuth::Open, Some(_)) => {
                self.auth = ConnAuth::Open;
                Err("this node has no cluster secret: its control plane is unauthenticated".into())
            }
            (ConnAuth::Done(id), None) => {
                let peer = Peer {
                    addr: self.peer,
                    identity: Some(id.clone()),
                };
                self.auth = ConnAuth::Done(id);
                handler(&peer, req)
            }
            (ConnAuth::Done(id), Some(_)) => {
                self.auth = ConnAuth::Done(id);
                Err("this connection is authenticated already".into())
            }
            (ConnAuth::Hello(secret, me), Some(Ok(AuthMsg::Hello(h)))) => {
                match ServerHandshake::on_hello(secret, me, &h) {
                    Ok((hs, challenge)) => {
                        self.auth = ConnAuth::Proof(hs);
                        serde_json::to_value(challenge).map_err(|e| e.to_string())
                    }
                    Err(e) => self.refuse(&format!("authentication failed: {e}")),
                }
            }
            (ConnAuth::Proof(hs), Some(Ok(AuthMsg::Proof(p)))) => match hs.on_proof(&p) {
                Ok((id, mine)) => {
                    debug!(peer = %self.peer, client = %id, "control connection authenticated");
                    self.auth = ConnAuth::Done(id);
                    serde_json::to_value(mine).map_err(|e| e.to_string())
                }
                Err(e) => self.refuse(&format!(
                    "authentication failed (wrong cluster secret?): {e}"
                )),
            },
            (ConnAuth::Hello(..) | ConnAuth::Proof(_), None) => self.refuse(
                "no authentication (this node needs the cluster secret; the client has none?)",
            ),
            (ConnAuth::Hello(..) | ConnAuth::Proof(_), Some(_)) => {
                self.refuse("authentication failed: a challenge message out of order or malformed")
            }
            (ConnAuth::Refused, _) => Err("control connection refused".into()),
        }
    }

    /// Consumes complete frames from `rbuf`, queueing a response for each,
    /// while the write buffer is below the high-water mark.
    fn process_frames<H>(&mut self, handler: &mut H)
    where
        H: FnMut(&Peer, Value) -> Result<Value, String>,
    {
        while !self.closing && self.wbuf.len() < WBUF_HIGH_WATER {
            if self.rbuf.len() < HEADER_BYTES {
                return;
            }
            let header = [self.rbuf[0], self.rbuf[1], self.rbuf[2], self.rbuf[3]];
            let len = u32::from_be_bytes(header) as usize;
            if len > MAX_FRAME_BYTES {
                warn!(peer = %self.peer, len, "bootstrap request exceeds the frame limit; closing");
                encode_response(
                    &mut self.wbuf,
                    Err(format!(
                        "request of {len} bytes exceeds the {MAX_FRAME_BYTES}-byte limit"
                    )),
                );
                self.closing = true;
                self.rbuf = Vec::new();
                return;
            }
            if self.rbuf.len() < HEADER_BYTES + len {
                return;
            }
            let parsed =
                serde_json::from_slice::<Value>(&self.rbuf[HEADER_BYTES..HEADER_BYTES + len]);
            self.rbuf.drain(..HEADER_BYTES + len);
            let result = match parsed {
                Ok(req) => self.dispatch(req, handler),
                Err(e) if matches!(self.auth, ConnAuth::Hello(..) | ConnAuth::Proof(_)) => {
                    self.refuse(&format!("authentication failed: malformed request: {e}"))
                }
                Err(e) => {
                    debug!(peer = %self.peer, error = %e, "malformed bootstrap request");
                    Err(format!("malformed request: {e}"))
                }
            };
            encode_response(&mut self.wbuf, result);
        }
    }

    /// Writes as much of `wbuf` as the socket accepts. Returns the number of
    /// bytes written; `WouldBlock` ends the attempt without error.
    fn flush(&mut self) -> io::Result<usize> {
        let mut written = 0;
        while written < self.wbuf.len() {
            match self.stream.write(&self.wbuf[written..]) {
                Ok(0) => {
                    self.wbuf.drain(..written);
                    return Err(io::ErrorKind::WriteZero.into());
                }
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        self.wbuf.drain(..written);
        Ok(written)
    }

    /// Performs at most one `read`. Returns the number of bytes read (0 on
    /// `WouldBlock` or end of stream, which are recorded in the flags).
    fn read_some(&mut self, scratch: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.stream.read(scratch) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(0);
                }
                Ok(n) => {
                    if self.closing {
                        self.discarded = self.discarded.saturating_add(n);
                    } else {
                        self.rbuf.extend_from_slice(&scratch[..n]);
                    }
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.can_read = false;
                    return Ok(0);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    fn wants_read(&self) -> bool {
        self.can_read
            && !self.eof
            && if self.closing {
                self.discarded <= DRAIN_LIMIT
            } else {
                self.wbuf.len() < WBUF_HIGH_WATER
            }
    }

    /// Makes all the progress possible without blocking: read, answer, write.
    fn drive<H>(&mut self, handler: &mut H, scratch: &mut [u8]) -> ConnFate
    where
        H: FnMut(&Peer, Value) -> Result<Value, String>,
    {
        loop {
            self.process_frames(handler);
            let flushed = match self.flush() {
                Ok(n) => n,
                Err(e) => {
                    debug!(peer = %self.peer, error = %e, "bootstrap write failed; dropping connection");
                    return ConnFate::Close;
                }
            };
            if self.closing && self.wbuf.is_empty() && !self.write_shut {
                self.write_shut = true;
                if let Err(e) = self.stream.shutdown(Shutdown::Write) {
                    debug!(peer = %self.peer, error = %e, "bootstrap shutdown failed; dropping connection");
                    return ConnFate::Close;
                }
            }
            let read = if self.wants_read() {
                match self.read_some(scratch) {
                    Ok(n) => n,
                    Err(e) => {
                        debug!(peer = %self.peer, error = %e, "bootstrap read failed; dropping connection");
                        return ConnFate::Close;
                    }
                }
            } else {
                0
            };
            if read == 0 && flushed == 0 {
                break;
            }
        }

        if self.closing {
            if self.eof || self.discarded > DRAIN_LIMIT {
                debug!(peer = %self.peer, "closing a refused bootstrap connection");
                return ConnFate::Close;
            }
            return ConnFate::Keep;
        }
        if self.eof && self.wbuf.is_empty() {
            // No complete frame can remain: with an empty write buffer,
            // `process_frames` stopped only for want of bytes.
            if self.rbuf.is_empty() {
                debug!(peer = %self.peer, "bootstrap client disconnected");
            } else {
                debug!(
                    peer = %self.peer,
                    pending = self.rbuf.len(),
                    "bootstrap client disconnected mid-frame"
                );
            }
            return ConnFate::Close;
        }
        ConnFate::Keep
    }

    fn desired_interest(&self) -> Interest {
        if self.wbuf.is_empty() {
            Interest::READABLE
        } else {
            Interest::READABLE | Interest::WRITABLE
        }
    }
}

/// A running bootstrap server: a listening socket served by a `mio` event
/// loop on a background thread named `"bootstrap"`.
///
/// Dropping the server has the same effect as [`BootstrapServer::shutdown`].
pub struct BootstrapServer {
    local_addr: SocketAddr,
    stop: Arc<AtomicBool>,
    waker: Arc<Waker>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for BootstrapServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BootstrapServer")
            .field("local_addr", &self.local_addr)
            .field("running", &self.thread.is_some())
            .finish()
    }
}

impl BootstrapServer {
    /// Binds `addr` (port 0 picks an ephemeral port; see
    /// [`local_addr`](Self::local_addr)) and serves on a background thread
    /// named `"bootstrap"`.
    ///
    /// `handler` is called on that thread, once per well-formed request and
    /// in arrival order per connection; `Ok(v)` is sent as `{"ok": v}` and
    /// `Err(msg)` as `{"err": msg}`. A handler result whose encoding exceeds
    /// [`MAX_FRAME_BYTES`] is replaced with an error response. A handler
    /// panic stops the server.
    ///
    /// Requests that are not valid JSON are answered with
    /// `{"err": "malformed request: .."}` and the connection is kept; a
    /// length prefix above [`MAX_FRAME_BYTES`] is answered with an error and
    /// the connection is then closed.
    ///
    /// Connections are authenticated with this process's cluster secret
    /// ([`auth::process_secret`]), if it has one; see [`Self::start_with`].
    ///
    /// # Errors
    ///
    /// [`BootstrapError::Io`] if binding, creating the poll or waker, or
    /// spawning the thread fails; [`BootstrapError::Secret`] if the process's
    /// secret cannot be had.
    pub fn start<H>(addr: SocketAddr, mut handler: H) -> Result<Self, BootstrapError>
    where
        H: FnMut(Value) -> Result<Value, String> + Send + 'static,
    {
        let auth = ServerAuth::process(Identity::new(None, "bootstrap"))?;
        Self::start_with(addr, auth, move |_, req| handler(req))
    }

    /// As [`Self::start`], admitting connections as `auth` says: with a secret, only
    /// those that pass the challenge (the others are answered with an error, closed and
    /// logged). `handler` also gets the connection's [`Peer`].
    ///
    /// Without a secret and bound beyond loopback, logs once per process that the
    /// control plane is unauthenticated.
    ///
    /// # Errors
    ///
    /// As [`Self::start`].
    pub fn start_with<H>(
        addr: SocketAddr,
        auth: ServerAuth,
        handler: H,
    ) -> Result<Self, BootstrapError>
    where
        H: FnMut(&Peer, Value) -> Result<Value, String> + Send + 'static,
    {
        let mut listener = TcpListener::bind(addr).map_err(io_err("bind"))?;
        let local_addr = listener.local_addr().map_err(io_err("local_addr"))?;
        let poll = Poll::new().map_err(io_err("create poll"))?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)
            .map_err(io_err("register listener"))?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER).map_err(io_err("create waker"))?);
        let authenticated = auth.secret.is_some();
        if !authenticated && !local_addr.ip().is_loopback() {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| {
                warn!(
                    %local_addr,
                    "the control plane is unauthenticated and listens beyond loopback: \
                     whoever reaches it can connect to this node, call its handlers and \
                     read or write its exported memory; give the cluster a secret \
                     (--secret-file, ${} or secret-file in the topology file)",
                    auth::SECRET_FILE_ENV
                );
            });
        }
        let stop = Arc::new(AtomicBool::new(false));
        let loop_stop = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("bootstrap".to_owned())
            .spawn(move || event_loop(poll, listener, handler, &auth, &loop_stop))
            .map_err(io_err("spawn thread"))?;
        debug!(%local_addr, authenticated, "bootstrap server started");
        Ok(BootstrapServer {
            local_addr,
            stop,
            waker,
            thread: Some(thread),
        })
    }

    /// The address the server is listening on (with the actual port when
    /// started on port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops the event loop (via a `mio::Waker`), closes the listener and all
    /// connections, and joins the background thread. Blocks until the thread
    /// has exited; a handler that never returns blocks this forever.
    ///
    /// Dropping the server does the same.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        self.stop.store(true, Ordering::SeqCst);
        if let Err(e) = self.waker.wake() {
            warn!(error = %e, "failed to wake the bootstrap event loop");
        }
        if thread.join().is_err() {
            warn!(local_addr = %self.local_addr, "bootstrap thread panicked");
        } else {
            debug!(local_addr = %self.local_addr, "bootstrap server stopped");
        }
    }
}

impl Drop for BootstrapServer {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

/// Accepts every pending connection. Returns `true` if accepting must be
/// retried later because of a resource error.
fn accept_all(
    listener: &TcpListener,
    poll: &Poll,
    conns: &mut HashMap<Token, Conn>,
    next_token: &mut usize,
    auth: &ServerAuth,
) -> bool {
    loop {
        match listener.accept() {
            Ok((mut stream, peer)) => {
                let token = Token(*next_token);
                *next_token = next_token.wrapping_add(1).max(FIRST_CONN);
                if let Err(e) = stream.set_nodelay(true) {
                    debug!(%peer, error = %e, "set_nodelay failed");
                }
                if let Err(e) = poll
                    .registry()
                    .register(&mut stream, token, Interest::READABLE)
                {
                    warn!(%peer, error = %e, "cannot register bootstrap connection; dropping it");
                    continue;
                }
                debug!(%peer, "bootstrap client connected");
                conns.insert(token, Conn::new(stream, peer, ConnAuth::new(auth)));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted
                        | io::ErrorKind::ConnectionAborted
                        | io::ErrorKind::ConnectionReset
                ) =>
            {
                continue
            }
            Err(e) => {
                warn!(error = %e, "bootstrap accept failed; retrying later");
                return true;
            }
        }
    }
}

fn event_loop<H>(
    mut poll: Poll,
    listener: TcpListener,
    mut handler: H,
    auth: &ServerAuth,
    stop: &AtomicBool,
) where
    H: FnMut(&Peer, Value) -> Result<Value, String>,
{
    let mut events = Events::with_capacity(256);
    let mut conns: HashMap<Token, Conn> = HashMap::new();
    let mut next_token = FIRST_CONN;
    let mut scratch = vec![0u8; MAX_FRAME_BYTES];
    let mut accept_pending = false;

    while !stop.load(Ordering::SeqCst) {
        let timeout = accept_pending.then_some(ACCEPT_RETRY);
        if let Err(e) = poll.poll(&mut events, timeout) {
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            warn!(error = %e, "bootstrap poll failed; stopping the server");
            break;
        }
        if accept_pending && events.is_empty() {
            accept_pending = accept_all(&listener, &poll, &mut conns, &mut next_token, auth);
        }
        for event in events.iter() {
            match event.token() {
                WAKER => {}
                LISTENER => {
                    accept_pending =
                        accept_all(&listener, &poll, &mut conns, &mut next_token, auth);
                }
                token => {
                    let Some(conn) = conns.get_mut(&token) else {
                        continue;
                    };
                    if event.is_readable() || event.is_read_closed() || event.is_error() {
                        conn.can_read = true;
                    }
                    let mut fate = conn.drive(&mut handler, &mut scratch);
                    if fate == ConnFate::Keep {
                        let want = conn.desired_interest();
                        if want != conn.interest {
                            match poll.registry().reregister(&mut conn.stream, token, want) {
                                Ok(()) => conn.interest = want,
                                Err(e) => {
                                    debug!(peer = %conn.peer, error = %e, "reregister failed; dropping connection");
                                    fate = ConnFate::Close;
                                }
                            }
                        }
                    }
                    if fate == ConnFate::Close {
                        if let Some(mut conn) = conns.remove(&token) {
                            // Deregistration failure is harmless: the socket is closed next.
                            let _ = poll.registry().deregister(&mut conn.stream);
                        }
                    }
                }
            }
        }
    }
    debug!(connections = conns.len(), "bootstrap event loop exiting");
}

/// A blocking bootstrap client over one TCP connection.
///
/// Every call is bounded by the timeout given to [`connect`](Self::connect).
/// If a call fails while a request or response is partly transferred
/// ([`BootstrapError::Timeout`], [`BootstrapError::Io`],
/// [`BootstrapError::Closed`], or an oversized response), the connection is
/// out of sync and every later call returns [`BootstrapError::Closed`];
/// connect again. [`BootstrapError::Remote`] and a malformed but complete
/// response leave the connection usable.
#[derive(Debug)]
pub struct BootstrapClient {
    stream: std::net::TcpStream,
    timeout: Duration,
    broken: bool,
    /// The identity the server proved, on an authenticated connection.
    server: Option<Identity>,
}

impl BootstrapClient {
    /// Give up the connection for use as a liveness channel (see
    /// [`crate::fabric::QueuePair::watch_peer`]): the server keeps it open until its
    /// process exits, when the kernel closes it.
    pub fn into_stream(self) -> std::net::TcpStream {
        self.stream
    }

    /// Connects to `addr`, waiting at most `timeout` for the connection to be
    /// established. The same `timeout` later bounds each whole
    /// [`call`](Self::call) (send plus receive). With a cluster secret in this
    /// process ([`auth::process_secret`]), passes the challenge first (see
    /// [`Self::connect_with`]).
    ///
    /// # Errors
    ///
    /// * [`BootstrapError::Timeout`] (`op = "connect"`) if the connection is
    ///   not established in time;
    /// * [`BootstrapError::Io`] if it is refused or otherwise fails, including
    ///   a zero `timeout` (`InvalidInput`);
    /// * [`BootstrapError::Secret`] if the process's secret cannot be had;
    /// * those of [`Self::connect_with`]'s challenge.
    pub fn connect(addr: SocketAddr, timeout: Duration) -> Result<Self, BootstrapError> {
        let auth = ClientAuth::process(Identity::new(None, "client"))?;
        Self::connect_with(addr, timeout, &auth)
    }

    /// Connects to `addr` as [`Self::connect`] does, proving `auth`'s secret (if any)
    /// as `auth`'s identity and demanding the server prove it too; each step of the
    /// challenge is bounded by `timeout`.
    ///
    /// # Errors
    ///
    /// Those of [`Self::connect`]; [`BootstrapError::Auth`] if the server refuses the
    /// proof, has no secret, or cannot prove it holds this one; the errors of
    /// [`Self::call`] during the challenge.
    pub fn connect_with(
        addr: SocketAddr,
        timeout: Duration,
        auth: &ClientAuth,
    ) -> Result<Self, BootstrapError> {
        let mut c = Self::connect_plain(addr, timeout)?;
        if let Some(secret) = &auth.secret {
            c.server = Some(c.authenticate(addr, secret, &auth.identity)?);
        }
        Ok(c)
    }

    /// The identity the server proved with the cluster secret; `None` on an
    /// unauthenticated connection.
    pub fn server_identity(&self) -> Option<&Identity> {
        self.server.as_ref()
    }

    /// The client's side of the challenge ([`crate::auth`]).
    fn authenticate(
        &mut self,
        addr: SocketAddr,
        secret: &ClusterSecret,
        me: &Identity,
    ) -> Result<Identity, BootstrapError> {
        let failed = |why: String| BootstrapError::Auth { addr, why };
        let refused = |e: BootstrapError| match e {
            BootstrapError::Remote(why) => failed(why),
            e => e,
        };
        let (mut hs, hello) = ClientHandshake::start(secret.clone(), me.clone())
            .map_err(|e| failed(e.to_string()))?;
        let mut msg = |m: AuthMsg| {
            let mut body = serde_json::Map::new();
            let m = serde_json::to_value(m)
                .map_err(|e| BootstrapError::Malformed(format!("cannot encode request: {e}")))?;
            body.insert(AUTH_KEY.to_owned(), m);
            self.call(&Value::Object(body)).map_err(refused)
        };
        let challenge: Challenge = serde_json::from_value(msg(AuthMsg::Hello(hello))?)
            .map_err(|e| failed(format!("malformed challenge: {e}")))?;
        let proof = hs
            .on_challenge(&challenge)
            .map_err(|e| failed(e.to_string()))?;
        let theirs: Proof = serde_json::from_value(msg(AuthMsg::Proof(proof))?)
            .map_err(|e| failed(format!("malformed proof: {e}")))?;
        hs.finish(&theirs)
            .map_err(|e| failed(format!("the node did not prove the cluster secret: {e}")))
    }

    fn connect_plain(addr: SocketAddr, timeout: Duration) -> Result<Self, BootstrapError> {
        let stream =
            std::net::TcpStream::connect_timeout(&addr, timeout).map_err(|e| match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                    BootstrapError::Timeout { op: "connect" }
                }
                _ => BootstrapError::Io {
                    op: "connect",
                    source: e,
                },
            })?;
        stream.set_nodelay(true).map_err(io_err("set_nodelay"))?;
        stream
            .set_read_timeout(Some(timeout))
            .map_err(io_err("set read timeout"))?;
        stream
            .set_write_timeout(Some(timeout))
            .map_err(io_err("set write timeout"))?;
        Ok(BootstrapClient {
            stream,
            timeout,
            broken: false,
            server: None,
        })
    }

    /// Sends one request and waits for its response; the whole exchange is
    /// bounded by the timeout given to [`connect`](Self::connect).
    ///
    /// Returns the value of an `{"ok": value}` response.
    ///
    /// # Errors
    ///
    /// * [`BootstrapError::FrameTooLarge`] if the encoded request exceeds
    ///   [`MAX_FRAME_BYTES`] (nothing is sent; the connection stays usable) or
    ///   the response's length prefix does;
    /// * [`BootstrapError::Remote`] with the message of an `{"err": msg}`
    ///   response;
    /// * [`BootstrapError::Malformed`] if the response is not JSON or is
    ///   neither form;
    /// * [`BootstrapError::Timeout`] (`op = "write"` or `"read"`) if the time
    ///   bound passes;
    /// * [`BootstrapError::Closed`] if the server closed or reset the
    ///   connection, or an earlier call left it out of sync;
    /// * [`BootstrapError::Io`] for other socket errors.
    pub fn call(&mut self, req: &Value) -> Result<Value, BootstrapError> {
        if self.broken {
            return Err(BootstrapError::Closed);
        }
        let body = serde_json::to_vec(req)
            .map_err(|e| BootstrapError::Malformed(format!("cannot encode request: {e}")))?;
        if body.len() > MAX_FRAME_BYTES {
            return Err(BootstrapError::FrameTooLarge {
                len: body.len(),
                max: MAX_FRAME_BYTES,
            });
        }
        let mut frame = Vec::with_capacity(HEADER_BYTES + body.len());
        push_frame(&mut frame, &body);

        let deadline = Instant::now() + self.timeout;
        let response = self.exchange(&frame, deadline);
        if response.is_err() {
            self.broken = true;
        }
        parse_response(&response?)
    }

    /// Typed convenience over [`call`](Self::call): serializes `req` to JSON
    /// and deserializes the `ok` value into `R`.
    ///
    /// # Errors
    ///
    /// Those of [`call`](Self::call), plus [`BootstrapError::Malformed`] if
    /// `req` cannot be serialized or the `ok` value does not fit `R`.
    pub fn call_typed<Q: serde::Serialize, R: serde::de::DeserializeOwned>(
        &mut self,
        req: &Q,
    ) -> Result<R, BootstrapError> {
        let req = serde_json::to_value(req)
            .map_err(|e| BootstrapError::Malformed(format!("cannot encode request: {e}")))?;
        let value = self.call(&req)?;
        serde_json::from_value(value)
            .map_err(|e| BootstrapError::Malformed(format!("unexpected response value: {e}")))
    }

    /// Writes `frame` and reads one response body, all before `deadline`.
    fn exchange(&mut self, frame: &[u8], deadline: Instant) -> Result<Vec<u8>, BootstrapError> {
        self.write_all(frame, deadline)?;
        let mut header = [0u8; HEADER_BYTES];
        self.read_exact(&mut header, deadline)?;
        let len = u32::from_be_bytes(header) as usize;
        if len > MAX_FRAME_BYTES {
            return Err(BootstrapError::FrameTooLarge {
                len,
                max: MAX_FRAME_BYTES,
            });
        }
        let mut body = vec![0u8; len];
        self.read_exact(&mut body, deadline)?;
        Ok(body)
    }

    fn write_all(&mut self, mut buf: &[u8], deadline: Instant) -> Result<(), BootstrapError> {
        while !buf.is_empty() {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(BootstrapError::Timeout { op: "write" });
            }
            self.stream
                .set_write_timeout(Some(remaining))
                .map_err(io_err("set write timeout"))?;
            match self.stream.write(buf) {
                Ok(0) => return Err(BootstrapError::Closed),
                Ok(n) => buf = &buf[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(map_client_io("write", e)),
            }
        }
        Ok(())
    }

    fn read_exact(&mut self, buf: &mut [u8], deadline: Instant) -> Result<(), BootstrapError> {
        let mut filled = 0;
        while filled < buf.len() {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(BootstrapError::Timeout { op: "read" });
            }
            self.stream
                .set_read_timeout(Some(remaining))
                .map_err(io_err("set read timeout"))?;
            match self.stream.read(&mut buf[filled..]) {
                Ok(0) => return Err(BootstrapError::Closed),
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(map_client_io("read", e)),
            }
        }
        Ok(())
    }
}

/// Interprets a response body: `{"ok": v}` gives `v`, `{"err": msg}` gives
/// [`BootstrapError::Remote`], anything else [`BootstrapError::Malformed`].
fn parse_response(body: &[u8]) -> Result<Value, BootstrapError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| BootstrapError::Malformed(format!("response is not JSON: {e}")))?;
    if let Value::Object(mut map) = value {
        if map.len() == 1 {
            if let Some(v) = map.remove("ok") {
                return Ok(v);
            }
            if let Some(Value::String(msg)) = map.remove("err") {
                return Err(BootstrapError::Remote(msg));
            }
        }
        return Err(BootstrapError::Malformed(format!(
            "response is neither ok nor err: {}",
            truncate_for_log(&Value::Object(map).to_string())
        )));
    }
    Err(BootstrapError::Malformed(format!(
        "response is neither ok nor err: {}",
        truncate_for_log(&value.to_string())
    )))
}

fn truncate_for_log(s: &str) -> &str {
    const LIMIT: usize = 200;
    if s.len() <= LIMIT {
        return s;
    }
    let mut end = LIMIT;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Connects to `addr`, retrying every 20 ms until `deadline` (for a server
/// that is still starting), then performs one [`BootstrapClient::call_typed`].
///
/// Connection attempts, and then the call, are each bounded by the time left
/// until `deadline`, so this returns shortly after `deadline` at the latest.
/// The call itself is not retried.
///
/// # Errors
///
/// * If no connection succeeds before `deadline`: the last connection error
///   (typically [`BootstrapError::Io`] with `ConnectionRefused`), or
///   [`BootstrapError::Timeout`] (`op = "connect"`) if `deadline` had already
///   passed and no attempt was made;
/// * otherwise the errors of [`BootstrapClient::call_typed`].
pub fn call_with_retry<Q: serde::Serialize, R: serde::de::DeserializeOwned>(
    addr: SocketAddr,
    req: &Q,
    deadline: Instant,
) -> Result<R, BootstrapError> {
    let mut last_err = None;
    let mut client = loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(last_err.unwrap_or(BootstrapError::Timeout { op: "connect" }));
        }
        match BootstrapClient::connect(addr, remaining) {
            Ok(client) => break client,
            Err(e @ (BootstrapError::Auth { .. } | BootstrapError::Secret(_))) => return Err(e),
            Err(e) => {
                debug!(%addr, error = %e, "bootstrap connect failed; retrying");
                last_err = Some(e);
                let remaining = deadline.saturating_duration_since(Instant::now());
                std::thread::sleep(remaining.min(RETRY_INTERVAL));
            }
        }
    };
    let remaining = deadline.saturating_duration_since(Instant::now());
    if remaining.is_zero() {
        return Err(BootstrapError::Timeout { op: "write" });
    }
    client.timeout = remaining;
    client.call_typed(req)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::{Deserialize, Serialize};
    use serde_json::json;
    use std::sync::mpsc;

    const T: Duration = Duration::from_secs(5);

    fn loopback() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 0))
    }

    fn echo_server() -> BootstrapServer {
        BootstrapServer::start(loopback(), |req| Ok(json!({ "echo": req }))).expect("start server")
    }

    fn raw_connect(addr: SocketAddr) -> std::net::TcpStream {
        let s = std::net::TcpStream::connect_timeout(&addr, T).expect("raw connect");
        s.set_read_timeout(Some(T)).expect("read timeout");
        s.set_write_timeout(Some(T)).expect("write timeout");
        s
    }

    fn raw_write_frame(s: &mut std::net::TcpStream, body: &[u8]) {
        let mut f = Vec::new();
        f.extend_from_slice(&(body.len() as u32).to_be_bytes());
        f.extend_from_slice(body);
        s.write_all(&f).expect("raw write");
    }

    fn raw_read_frame(s: &mut std::net::TcpStream) -> Value {
        let mut h = [0u8; 4];
        s.read_exact(&mut h).expect("raw read header");
        let len = u32::from_be_bytes(h) as usize;
        let mut b = vec![0u8; len];
        s.read_exact(&mut b).expect("raw read body");
        serde_json::from_slice(&b).expect("response is JSON")
    }

    /// An address on which nothing listens (a port taken from a dropped listener).
    fn unused_addr() -> SocketAddr {
        let l = std::net::TcpListener::bind(loopback()).expect("bind");
        l.local_addr().expect("addr")
    }

    #[test]
    fn many_sequential_calls_on_one_connection() {
        let mut count = 0u64;
        let server = BootstrapServer::start(loopback(), move |req| {
            count += 1;
            Ok(json!({ "echo": req, "count": count }))
        })
        .unwrap();
        let mut c = BootstrapClient::connect(server.local_addr(), T).unwrap();
        for i in 0..300u64 {
            let v = c.call(&json!({ "qpn": i, "lid": "x" })).unwrap();
            assert_eq!(
                v,
                json!({ "echo": { "qpn": i, "lid": "x" }, "count": i + 1 })
            );
        }
        server.shutdown();
    }

    #[test]
    fn several_clients_from_several_threads() {
        let server = echo_server();
        let addr = server.local_addr();
        let threads: Vec<_> = (0..8)
            .map(|t| {
                std::thread::spawn(move || {
                    let mut c = BootstrapClient::connect(addr, T).unwrap();
                    for i in 0..100 {
                        let req = json!({ "thread": t, "i": i });
                        assert_eq!(c.call(&req).unwrap(), json!({ "echo": req }));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }

    #[test]
    fn handler_runs_on_thread_named_bootstrap() {
        let server = BootstrapServer::start(loopback(), |_| {
            Ok(json!(std::thread::current().name().map(str::to_owned)))
        })
        .unwrap();
        let mut c = BootstrapClient::connect(server.local_addr(), T).unwrap();
        assert_eq!(c.call(&json!(null)).unwrap(), json!("bootstrap"));
    }

    #[test]
    fn typed_call_round_trips() {
        #[derive(Serialize, Deserialize, Debug, PartialEq)]
        struct Desc {
            qpn: u32,
            gid: String,
        }
        let server = BootstrapServer::start(loopback(), |req| {
            let mut d: Desc = serde_json::from_value(req).map_err(|e| e.to_string())?;
            d.qpn += 1;
            serde_json::to_value(d).map_err(|e| e.to_string())
        })
        .unwrap();
        let mut c = BootstrapClient::connect(server.local_addr(), T).unwrap();
        let r: Desc = c
            .call_typed(&Desc {
                qpn: 7,
                gid: "fe80::1".into(),
            })
            .unwrap();
        assert_eq!(
            r,
            Desc {
                qpn: 8,
                gid: "fe80::1".into()
            }
        );
        // An ok value of the wrong shape is Malformed, and the connection survives.
        let bad: Result<u32, _> = c.call_typed(&Desc {
            qpn: 1,
            gid: "g".into(),
        });
        assert!(matches!(bad, Err(BootstrapError::Malformed(_))), "{bad:?}");
        let again: Desc = c
            .call_typed(&Desc {
                qpn: 1,
                gid: "g".into(),
            })
            .unwrap();
        assert_eq!(again.qpn, 2);
    }

    #[test]
    fn handler_err_becomes_remote() {
        let server = BootstrapServer::start(loopback(), |req| {
            if req == json!("bad") {
                Err("no such queue pair".to_owned())
            } else {
                Ok(req)
            }
        })
        .unwrap();
        let mut c = BootstrapClient::connect(server.local_addr(), T).unwrap();
        match c.call(&json!("bad")) {
            Err(BootstrapError::Remote(msg)) => assert_eq!(msg, "no such queue pair"),
            other => panic!("expected Remote, got {other:?}"),
        }
        // The connection stays usable after a remote error.
        assert_eq!(c.call(&json!("good")).unwrap(), json!("good"));
    }

    #[test]
    fn malformed_json_gets_err_and_connection_survives() {
        let server = echo_server();
        let mut s = raw_connect(server.local_addr());
        raw_write_frame(&mut s, b"{not json");
        let resp = raw_read_frame(&mut s);
        let msg = resp["err"].as_str().expect("err response");
        assert!(msg.starts_with("malformed request: "), "{msg}");
        assert_eq!(resp.as_object().unwrap().len(), 1);
        // Invalid UTF-8 is malformed too.
        raw_write_frame(&mut s, &[0xff, 0xfe]);
        let resp = raw_read_frame(&mut s);
        assert!(resp["err"]
            .as_str()
            .unwrap()
            .starts_with("malformed request: "));
        raw_write_frame(&mut s, br#"{"qpn": 3}"#);
        assert_eq!(
            raw_read_frame(&mut s),
            json!({ "ok": { "echo": { "qpn": 3 } } })
        );
    }

    #[test]
    fn oversized_prefix_gets_err_then_close_and_server_survives() {
        let server = echo_server();
        let mut s = raw_connect(server.local_addr());
        let len = MAX_FRAME_BYTES as u32 + 1;
        s.write_all(&len.to_be_bytes()).unwrap();
        s.write_all(b"some of the body").unwrap();
        let resp = raw_read_frame(&mut s);
        assert_eq!(
            resp,
            json!({ "err": "request of 65537 bytes exceeds the 65536-byte limit" })
        );
        // The server closed its side: the next read sees end of stream.
        let mut rest = Vec::new();
        match s.read_to_end(&mut rest) {
            Ok(0) => {}
            Ok(n) => panic!("unexpected {n} bytes after the error response"),
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}"),
        }
        drop(s);
        let mut c = BootstrapClient::connect(server.local_addr(), T).unwrap();
        assert_eq!(c.call(&json!(1)).unwrap(), json!({ "echo": 1 }));
    }

    #[test]
    fn client_disconnecting_mid_frame_does_not_disturb_others() {
        let server = echo_server();
        let addr = server.local_addr();
        let mut steady = BootstrapClient::connect(addr, T).unwrap();
        assert_eq!(steady.call(&json!("a")).unwrap(), json!({ "echo": "a" }));
        for partial in [&[0u8, 0][..], &[0, 0, 0, 100, b'{', b'"']] {
            let mut s = raw_connect(addr);
            s.write_all(partial).unwrap();
            drop(s);
            assert_eq!(steady.call(&json!("b")).unwrap(), json!({ "echo": "b" }));
        }
        let mut fresh = BootstrapClient::connect(addr, T).unwrap();
        assert_eq!(fresh.call(&json!("c")).unwrap(), json!({ "echo": "c" }));
        assert_eq!(steady.call(&json!("d")).unwrap(), json!({ "echo": "d" }));
    }

    #[test]
    fn frames_split_across_reads_and_batched_in_one_write() {
        let server = echo_server();
        let mut s = raw_connect(server.local_addr());
        // Three frames in one write.
        let mut batch = Vec::new();
        for i in 0..3 {
            push_frame(&mut batch, json!({ "i": i }).to_string().as_bytes());
        }
        s.write_all(&batch).unwrap();
        for i in 0..3 {
            assert_eq!(
                raw_read_frame(&mut s),
                json!({ "ok": { "echo": { "i": i } } })
            );
        }
        // One frame dribbled a byte at a time.
        s.set_nodelay(true).unwrap();
        let mut frame = Vec::new();
        push_frame(&mut frame, br#"{"slow": true}"#);
        for b in frame {
            s.write_all(&[b]).unwrap();
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(
            raw_read_frame(&mut s),
            json!({ "ok": { "echo": { "slow": true } } })
        );
    }

    #[test]
    fn large_request_and_response_round_trip() {
        let server = BootstrapServer::start(loopback(), Ok).unwrap();
        let mut c = BootstrapClient::connect(server.local_addr(), T).unwrap();
        let big: String = (0..60 * 1024)
            .map(|i| (b'a' + (i % 26) as u8) as char)
            .collect();
        for _ in 0..5 {
            assert_eq!(c.call(&json!(big)).unwrap(), json!(big));
        }
    }

    #[test]
    fn pipelined_large_requests_survive_backpressure() {
        // Large requests written by one thread while another reads slowly:
        // partial reads on the server and a full server write buffer.
        let server = BootstrapServer::start(loopback(), Ok).unwrap();
        let mut s = raw_connect(server.local_addr());
        let mut writer = s.try_clone().unwrap();
        const N: usize = 150;
        let writer = std::thread::spawn(move || {
            for i in 0..N {
                let body = json!([i, "x".repeat(60 * 1024)]).to_string();
                raw_write_frame(&mut writer, body.as_bytes());
            }
        });
        std::thread::sleep(Duration::from_millis(300));
        for i in 0..N {
            let resp = raw_read_frame(&mut s);
            assert_eq!(resp["ok"][0], json!(i));
            assert_eq!(resp["ok"][1].as_str().unwrap().len(), 60 * 1024);
        }
        writer.join().unwrap();
    }

    #[test]
    fn pipelined_small_requests_large_responses_resume_on_writable() {
        // All requests arrive at once and the client reads nothing for a
        // while: the server's writes hit WouldBlock, it stops reading at the
        // high-water mark, and only WRITABLE readiness can resume it.
        let server =
            BootstrapServer::start(loopback(), |req| Ok(json!([req, "y".repeat(60 * 1024)])))
                .unwrap();
        let mut s = raw_connect(server.local_addr());
        const N: usize = 150;
        let mut batch = Vec::new();
        for i in 0..N {
            push_frame(&mut batch, json!(i).to_string().as_bytes());
        }
        s.write_all(&batch).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        for i in 0..N {
            let resp = raw_read_frame(&mut s);
            assert_eq!(resp["ok"][0], json!(i));
            assert_eq!(resp["ok"][1].as_str().unwrap().len(), 60 * 1024);
        }
    }

    #[test]
    fn oversized_response_becomes_err_and_connection_survives() {
        let server = BootstrapServer::start(loopback(), |req| {
            if req == json!("big") {
                Ok(json!("y".repeat(MAX_FRAME_BYTES)))
            } else {
                Ok(req)
            }
        })
        .unwrap();
        let mut c = BootstrapClient::connect(server.local_addr(), T).unwrap();
        match c.call(&json!("big")) {
            Err(BootstrapError::Remote(msg)) => {
                assert!(msg.contains("exceeds the 65536-byte limit"), "{msg}")
            }
            other => panic!("expected Remote, got {other:?}"),
        }
        assert_eq!(c.call(&json!(5)).unwrap(), json!(5));
    }

    #[test]
    fn client_refuses_to_send_oversized_request() {
        let server = echo_server();
        let mut c = BootstrapClient::connect(server.local_addr(), T).unwrap();
        let r = c.call(&json!("z".repeat(MAX_FRAME_BYTES)));
        match r {
            Err(BootstrapError::FrameTooLarge { len, max }) => {
                assert_eq!(len, MAX_FRAME_BYTES + 2);
                assert_eq!(max, MAX_FRAME_BYTES);
            }
            other => panic!("expected FrameTooLarge, got {other:?}"),
        }
        assert_eq!(c.call(&json!(1)).unwrap(), json!({ "echo": 1 }));
    }

    /// A fake server that reads one request and replies with `reply` bytes.
    fn fake_server(reply: Vec<u8>) -> SocketAddr {
        let l = std::net::TcpListener::bind(loopback()).unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            s.set_read_timeout(Some(T)).unwrap();
            let _ = raw_read_frame(&mut s);
            let _ = s.write_all(&reply);
        });
        addr
    }

    #[test]
    fn client_classifies_bad_responses() {
        let framed = |body: &[u8]| {
            let mut f = Vec::new();
            push_frame(&mut f, body);
            f
        };
        type Check = fn(&BootstrapError) -> bool;
        let cases: Vec<(Vec<u8>, Check)> = vec![
            (framed(br#"{"weird": 1}"#), |e| {
                matches!(e, BootstrapError::Malformed(_))
            }),
            (framed(br#"{"err": 5}"#), |e| {
                matches!(e, BootstrapError::Malformed(_))
            }),
            (framed(br#"{"ok": 1, "err": "x"}"#), |e| {
                matches!(e, BootstrapError::Malformed(_))
            }),
            (framed(b"nope"), |e| {
                matches!(e, BootstrapError::Malformed(_))
            }),
            ((MAX_FRAME_BYTES as u32 + 1).to_be_bytes().to_vec(), |e| {
                matches!(
                    e,
                    BootstrapError::FrameTooLarge {
                        len: 65537,
                        max: 65536
                    }
                )
            }),
            (vec![0, 0, 0, 10, b'{'], |e| {
                matches!(e, BootstrapError::Closed)
            }),
        ];
        for (reply, check) in cases {
            let addr = fake_server(reply.clone());
            let mut c = BootstrapClient::connect(addr, T).unwrap();
            let err = c.call(&json!("req")).unwrap_err();
            assert!(check(&err), "reply {reply:?} gave {err:?}");
        }
    }

    #[test]
    fn client_times_out_against_silent_server() {
        let l = std::net::TcpListener::bind(loopback()).unwrap();
        let addr = l.local_addr().unwrap();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let silent = std::thread::spawn(move || {
            let (_s, _) = l.accept().unwrap();
            // Hold the connection open, never answering.
            let _ = done_rx.recv_timeout(Duration::from_secs(30));
        });
        let timeout = Duration::from_millis(200);
        let mut c = BootstrapClient::connect(addr, timeout).unwrap();
        let start = Instant::now();
        let r = c.call(&json!("hello?"));
        assert!(
            matches!(r, Err(BootstrapError::Timeout { op: "read" })),
            "expected Timeout, got {r:?}"
        );
        assert!(start.elapsed() >= Duration::from_millis(150));
        // The connection is out of sync now; later calls fail fast.
        assert!(matches!(c.call(&json!(1)), Err(BootstrapError::Closed)));
        done_tx.send(()).unwrap();
        silent.join().unwrap();
    }

    #[test]
    fn call_with_retry_waits_for_a_late_server() {
        let addr = unused_addr();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            let server =
                BootstrapServer::start(addr, |req| Ok(json!({ "late": req }))).expect("late start");
            let _ = done_rx.recv_timeout(Duration::from_secs(30));
            server.shutdown();
        });
        let start = Instant::now();
        let r: Value = call_with_retry(addr, &json!(42), Instant::now() + T).unwrap();
        assert_eq!(r, json!({ "late": 42 }));
        assert!(
            start.elapsed() >= Duration::from_millis(80),
            "did not retry"
        );
        done_tx.send(()).unwrap();
        late.join().unwrap();
    }

    #[test]
    fn call_with_retry_gives_up_at_the_deadline() {
        let addr = unused_addr();
        let start = Instant::now();
        let r: Result<Value, _> =
            call_with_retry(addr, &json!(1), Instant::now() + Duration::from_millis(200));
        let err = r.unwrap_err();
        assert!(
            matches!(
                err,
                BootstrapError::Io { op: "connect", .. } | BootstrapError::Timeout { .. }
            ),
            "{err:?}"
        );
        assert!(start.elapsed() >= Duration::from_millis(150));
        // A deadline already in the past fails without an attempt.
        let r: Result<Value, _> = call_with_retry(addr, &json!(1), Instant::now());
        assert!(
            matches!(r, Err(BootstrapError::Timeout { op: "connect" })),
            "{r:?}"
        );
    }

    #[test]
    fn shutdown_joins_and_closes_everything() {
        let server = echo_server();
        let addr = server.local_addr();
        let mut c = BootstrapClient::connect(addr, T).unwrap();
        assert_eq!(c.call(&json!(1)).unwrap(), json!({ "echo": 1 }));
        server.shutdown();
        assert!(BootstrapClient::connect(addr, Duration::from_millis(500)).is_err());
        let r = c.call(&json!(2));
        assert!(matches!(r, Err(BootstrapError::Closed)), "{r:?}");
    }

    #[test]
    fn drop_stops_the_server() {
        let addr;
        {
            let server = echo_server();
            addr = server.local_addr();
            let mut c = BootstrapClient::connect(addr, T).unwrap();
            assert_eq!(c.call(&json!(1)).unwrap(), json!({ "echo": 1 }));
        }
        assert!(BootstrapClient::connect(addr, Duration::from_millis(500)).is_err());
    }

    fn secret(s: &str) -> ClusterSecret {
        ClusterSecret::from_bytes(s.as_bytes()).unwrap()
    }

    const SECRET: &str = "the cluster's secret, 32 bytes..";

    /// A server with `SECRET` whose handler answers with the caller's proved identity.
    fn secured_server() -> BootstrapServer {
        let auth = ServerAuth {
            secret: Some(secret(SECRET)),
            identity: Identity::new(Some(2), "lockd"),
        };
        BootstrapServer::start_with(loopback(), auth, |peer, req| {
            Ok(json!({ "echo": req, "from": peer.identity.as_ref().and_then(|i| i.node) }))
        })
        .unwrap()
    }

    fn client_auth(s: Option<&str>) -> ClientAuth {
        ClientAuth {
            secret: s.map(secret),
            identity: Identity::new(Some(100), "client"),
        }
    }

    #[test]
    fn a_secured_server_serves_a_client_with_the_secret() {
        let server = secured_server();
        let mut c =
            BootstrapClient::connect_with(server.local_addr(), T, &client_auth(Some(SECRET)))
                .unwrap();
        assert_eq!(c.server_identity(), Some(&Identity::new(Some(2), "lockd")));
        for i in 0..3 {
            assert_eq!(
                c.call(&json!(i)).unwrap(),
                json!({ "echo": i, "from": 100 })
            );
        }
    }

    /// The server's side of a refused connection: one error answer, then end of stream.
    fn expect_refused_then_closed(s: &mut std::net::TcpStream, what: &str) {
        let resp = raw_read_frame(s);
        let msg = resp["err"].as_str().expect("err response");
        assert!(msg.contains(what), "{msg}");
        let mut rest = Vec::new();
        match s.read_to_end(&mut rest) {
            Ok(0) => {}
            Ok(n) => panic!("{n} bytes after the refusal"),
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}"),
        }
    }

    #[test]
    fn a_secured_server_refuses_and_closes_unauthenticated_connections() {
        let server = secured_server();
        // A request before the challenge: refused, never handled.
        let mut s = raw_connect(server.local_addr());
        raw_write_frame(&mut s, br#"{"op": "info"}"#);
        expect_refused_then_closed(&mut s, "no authentication");
        // Garbage before the challenge.
        let mut s = raw_connect(server.local_addr());
        raw_write_frame(&mut s, b"{not json");
        expect_refused_then_closed(&mut s, "authentication failed");
        // A proof before any hello.
        let mut s = raw_connect(server.local_addr());
        raw_write_frame(&mut s, br#"{"auth": {"proof": {"mac": "00"}}}"#);
        expect_refused_then_closed(&mut s, "out of order");
        // A client without a secret.
        let mut c =
            BootstrapClient::connect_with(server.local_addr(), T, &client_auth(None)).unwrap();
        let e = c.call(&json!(1)).unwrap_err();
        assert!(
            matches!(&e, BootstrapError::Remote(m) if m.contains("no authentication")),
            "{e}"
        );
        // The server still serves the cluster.
        let mut c =
            BootstrapClient::connect_with(server.local_addr(), T, &client_auth(Some(SECRET)))
                .unwrap();
        assert_eq!(
            c.call(&json!(1)).unwrap(),
            json!({ "echo": 1, "from": 100 })
        );
    }

    #[test]
    fn a_wrong_secret_is_refused_with_a_clear_error() {
        let server = secured_server();
        let e = BootstrapClient::connect_with(
            server.local_addr(),
            T,
            &client_auth(Some("another cluster's secret, 32 b.")),
        )
        .unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, BootstrapError::Auth { .. }), "{e:?}");
        assert!(
            msg.contains("refused: authentication failed") && msg.contains("wrong cluster secret"),
            "{msg}"
        );
    }

    #[test]
    fn a_replayed_proof_on_a_new_connection_is_refused() {
        // Record a real client's messages, then replay them on a fresh connection.
        let server = secured_server();
        let me = Identity::new(Some(100), "client");
        let mut s = raw_connect(server.local_addr());
        let (mut hs, hello) = ClientHandshake::start(secret(SECRET), me).unwrap();
        let hello = json!({ "auth": AuthMsg::Hello(hello) });
        raw_write_frame(&mut s, hello.to_string().as_bytes());
        let ch: Challenge = serde_json::from_value(raw_read_frame(&mut s)["ok"].clone()).unwrap();
        let proof = json!({ "auth": AuthMsg::Proof(hs.on_challenge(&ch).unwrap()) });
        raw_write_frame(&mut s, proof.to_string().as_bytes());
        assert!(raw_read_frame(&mut s).get("ok").is_some());

        let mut r = raw_connect(server.local_addr());
        raw_write_frame(&mut r, hello.to_string().as_bytes());
        assert!(raw_read_frame(&mut r).get("ok").is_some());
        raw_write_frame(&mut r, proof.to_string().as_bytes());
        expect_refused_then_closed(&mut r, "wrong cluster secret");
    }

    #[test]
    fn a_client_with_a_secret_refuses_a_server_without_one() {
        let server = echo_server();
        let e = BootstrapClient::connect_with(server.local_addr(), T, &client_auth(Some(SECRET)))
            .unwrap_err();
        assert!(
            matches!(&e, BootstrapError::Auth { why, .. } if why.contains("no cluster secret")),
            "{e}"
        );
        // A fake server that answers the challenge with a made-up proof.
        let l = std::net::TcpListener::bind(loopback()).unwrap();
        let addr = l.local_addr().unwrap();
        let fake = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            s.set_read_timeout(Some(T)).unwrap();
            let _ = raw_read_frame(&mut s);
            let ch =
                json!({ "ok": { "nonce": "ab".repeat(32), "id": { "node": 2, "role": "x" } } });
            let mut f = Vec::new();
            push_frame(&mut f, ch.to_string().as_bytes());
            s.write_all(&f).unwrap();
            let _ = raw_read_frame(&mut s);
            let mut f = Vec::new();
            push_frame(
                &mut f,
                json!({ "ok": { "mac": "00".repeat(32) } })
                    .to_string()
                    .as_bytes(),
            );
            s.write_all(&f).unwrap();
        });
        let e = BootstrapClient::connect_with(addr, T, &client_auth(Some(SECRET))).unwrap_err();
        assert!(
            matches!(&e, BootstrapError::Auth { why, .. } if why.contains("did not prove")),
            "{e}"
        );
        fake.join().unwrap();
    }

    #[test]
    fn start_reports_bind_errors() {
        let taken = std::net::TcpListener::bind(loopback()).unwrap();
        let r = BootstrapServer::start(taken.local_addr().unwrap(), Ok);
        assert!(
            matches!(r, Err(BootstrapError::Io { op: "bind", .. })),
            "{r:?}"
        );
    }
}
