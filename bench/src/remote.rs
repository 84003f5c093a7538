//! Microbenchmarks across processes and hosts: `--serve` runs a benchmark's server side,
//! `--connect ADDR` its client side against it, the way perftest's tools are started
//! (server with no address, client with the server's).
//!
//! The two sides talk over a small out-of-band TCP connection (JSON lines, like
//! perftest's `-p` port): the client says which benchmark, fabric and timing model it
//! runs (the server refuses a mismatch), then asks for each data point's server side
//! with the point's parameters. The server starts it fresh (its own rrpc node, and on
//! shm its own cluster directory, exactly as the one-process run does per point),
//! answers with the node's bootstrap address, and drops it when the client moves on.
//! The measured traffic never touches this connection.
//!
//! In the one-process mode (neither flag, the default) [`Sides::point`] starts the same
//! server side in this process, so both modes run one code path per benchmark.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rrpc::fabric::shm::ClusterGuard;
use rrpc::fabric::{Fabric, FabricConfig, FabricKind};
use rrpc::NodeId;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::perftest;

/// Version of the out-of-band protocol; both sides must speak the same.
pub const PROTOCOL_VERSION: u32 = 1;

/// How long a client waits for the server's answer to one request (a point's server
/// side may register a large table).
const REPLY_TIMEOUT: Duration = Duration::from_secs(120);

/// The flags that split a microbenchmark into a server and a client process;
/// `#[command(flatten)]` it into the benchmark's parser.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SideArgs {
    /// Run only the server side: listen on --listen, print `READY <addr>` and serve
    /// clients started with --connect (one at a time) until SIGINT, SIGTERM or the end
    /// of stdin (stdin that is /dev/null is not watched). Give it the same --fabric and
    /// --model as the client.
    #[arg(long, global = true, conflicts_with = "connect")]
    pub serve: bool,
    /// Run only the client side, against the `--serve` process whose READY line printed
    /// ADDR (HOST:PORT). Prints the same lines as a one-process run.
    #[arg(long, global = true, value_name = "ADDR", value_parser = rrpc::service::parse_addr)]
    pub connect: Option<SocketAddr>,
    /// With --serve: the out-of-band (TCP) listen address, HOST:PORT; each point's rrpc
    /// node listens on the same host at a free port (default 127.0.0.1:0: this host
    /// only; give the address of an interface the client reaches for two hosts).
    #[arg(long, global = true, value_name = "ADDR", requires = "serve",
          conflicts_with = "connect", value_parser = rrpc::service::parse_addr)]
    pub listen: Option<SocketAddr>,
    /// With --serve: the address clients reach this host at, `HOST[:PORT]` (default: the
    /// --listen address; with a wildcard --listen, this machine's address).
    #[arg(long, global = true, value_name = "ADDR", requires = "serve",
          conflicts_with = "connect", value_parser = rrpc::service::parse_advertise)]
    pub advertise: Option<SocketAddr>,
    /// RDMA device for --fabric verbs (default: $RRPC_RDMA_DEVICE, else the first device).
    #[arg(long, global = true, value_name = "NAME", env = "RRPC_RDMA_DEVICE")]
    pub rdma_device: Option<String>,
    /// GID index for --fabric verbs (default: $RRPC_GID_INDEX, else the RoCEv2
    /// IPv4-mapped GID).
    #[arg(long, global = true, value_name = "INDEX", env = "RRPC_GID_INDEX")]
    pub gid_index: Option<u32>,
    /// RDMA port for --fabric verbs (default: $RRPC_RDMA_PORT, else 1).
    #[arg(long, global = true, value_name = "PORT", env = "RRPC_RDMA_PORT")]
    pub rdma_port: Option<u8>,
}

/// Which sides of the benchmark this process runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// Both, in this process (the default).
    Both,
    /// The server side only, listening on `listen` and announcing `advertise` (see
    /// [`SideArgs::advertise`]).
    Serve {
        /// Out-of-band listen address.
        listen: SocketAddr,
        /// `--advertise`, if given.
        advertise: Option<SocketAddr>,
    },
    /// The client side only, against the server at this out-of-band address.
    Connect(SocketAddr),
}

impl SideArgs {
    /// The side this command line asks for. (`--serve` with `--connect`, and `--listen`
    /// or `--advertise` without `--serve`, are refused by the parser.)
    pub fn side(&self) -> Side {
        match (self.serve, self.connect) {
            (true, _) => Side::Serve {
                listen: self
                    .listen
                    .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0))),
                advertise: self.advertise,
            },
            (false, Some(a)) => Side::Connect(a),
            (false, None) => Side::Both,
        }
    }
}

/// How this process opens fabric endpoints: the backend, the shm timing model, and
/// the RDMA device settings of the verbs backend.
#[derive(Clone, Debug)]
pub struct FabricSpec {
    /// Backend.
    pub kind: FabricKind,
    /// Timing model of the shm backend (`none`, `cx5`, ..., or a TOML profile's path);
    /// `None`: `$RRPC_MODEL`, else none.
    pub model: Option<String>,
    /// `--rdma-device`.
    pub device: Option<String>,
    /// `--gid-index`.
    pub gid_index: Option<u32>,
    /// `--rdma-port`.
    pub port: Option<u8>,
}

impl FabricSpec {
    /// The spec of `kind` and `model` with the device flags of `side`.
    pub fn new(kind: FabricKind, model: Option<String>, side: &SideArgs) -> Self {
        Self {
            kind,
            model,
            device: side.rdma_device.clone(),
            gid_index: side.gid_index,
            port: side.rdma_port,
        }
    }

    /// Open node `node` of cluster `cluster`.
    ///
    /// Errors: the fabric's (no RDMA device, a timing model on verbs, a node in use).
    pub fn open(&self, cluster: &str, node: NodeId) -> Result<Fabric> {
        let mut cfg = FabricConfig::new(self.kind, cluster, node);
        cfg.model = self.model.clone();
        cfg.device = self.device.clone();
        cfg.gid_index = self.gid_index;
        cfg.port = self.port;
        Fabric::open(&cfg).with_context(|| format!("opening node {node} on {}", self.kind))
    }

    /// The RDMA device this spec opens, for perftest ([`perftest::Device::of`]).
    ///
    /// Errors: not verbs; the fabric does not open.
    pub fn perftest_device(&self) -> Result<perftest::Device> {
        perftest::Device::of(
            self.kind,
            || self.open(&format!("perftest-probe-{}", std::process::id()), NodeId(1)),
            self.device.clone(),
            self.port,
            self.gid_index,
        )
    }

    /// The timing model's name as both sides compare it (`none` without one).
    fn model_name(&self) -> String {
        self.model
            .clone()
            .or_else(|| std::env::var("RRPC_MODEL").ok().filter(|m| !m.is_empty()))
            .unwrap_or_else(|| "none".into())
    }
}

/// The backend `--fabric` names, else `$RRPC_FABRIC`, else shm.
///
/// Errors: an unknown backend name.
pub fn fabric_kind(given: Option<&str>) -> Result<FabricKind> {
    match given {
        Some(f) => f.parse().map_err(anyhow::Error::msg),
        None => FabricKind::from_env().map_err(anyhow::Error::msg),
    }
}

/// The timing model of a benchmark whose shm default is `shm_default`: `given` if any;
/// else `shm_default` on shm and `none` on verbs (a real NIC has its own timing).
///
/// Errors: a model other than `none` with verbs (the verbs backend refuses one).
pub fn model_for(kind: FabricKind, given: Option<&str>, shm_default: &str) -> Result<String> {
    match (kind, given) {
        (FabricKind::Verbs, Some(m)) if m != "none" => {
            bail!("--model {m}: a timing model runs on the shm fabric only, not on verbs")
        }
        (_, Some(m)) => Ok(m.to_string()),
        (FabricKind::Shm, None) => Ok(shm_default.to_string()),
        (FabricKind::Verbs, None) => Ok("none".into()),
    }
}

/// What a point's server side has to work with.
pub struct PointEnv<'a> {
    spec: &'a FabricSpec,
    cluster: &'a str,
    listen: SocketAddr,
}

impl PointEnv<'_> {
    /// Open node `node` of the point's cluster (see [`FabricSpec::open`]).
    ///
    /// Errors: the fabric's.
    pub fn open(&self, node: NodeId) -> Result<Fabric> {
        self.spec.open(self.cluster, node)
    }

    /// The address the point's nodes listen on: the server's host, port 0.
    pub fn listen(&self) -> SocketAddr {
        SocketAddr::new(self.listen.ip(), 0)
    }
}

/// A point's server side, started: what the client needs and what keeps it running.
pub struct Started {
    /// The bootstrap address of the node clients connect to (as bound).
    pub addr: SocketAddr,
    /// Anything else the client should know (benchmark-specific), `null` if nothing.
    pub info: Value,
    /// Dropped when the point ends (the node, its tables).
    pub keep: Box<dyn std::any::Any + Send + Sync>,
}

/// Start a point's server side from its parameters.
pub type StartFn<'a> = dyn Fn(&Value, &PointEnv<'_>) -> Result<Started> + 'a;

/// A point's server side as the client sees it; dropping it ends the point.
pub struct Point<'a> {
    /// Bootstrap address of the point's node (advertised, reachable by this process).
    pub addr: SocketAddr,
    /// The cluster the client's nodes join (the shm cluster directory's name).
    pub cluster: String,
    /// [`Started::info`].
    pub info: Value,
    local: Option<(Started, ClusterGuard)>,
    remote: Option<&'a Mutex<Remote>>,
}

impl Point<'_> {
    /// The server side's kept state when it runs in this process ([`Started::keep`] as
    /// a `T`); `None` behind `--connect` or for another type.
    pub fn local<T: 'static>(&self) -> Option<&T> {
        self.local.as_ref()?.0.keep.downcast_ref()
    }
}

impl Drop for Point<'_> {
    fn drop(&mut self) {
        if let Some((started, guard)) = self.local.take() {
            drop(started);
            drop(guard);
        }
        if let Some(r) = self.remote {
            if let Err(e) = lock(r).call(&Request::Stop) {
                eprintln!("warning: ending the point on the server: {e:#}");
            }
        }
    }
}

/// The client's view of the server side: in this process or behind `--connect`.
pub struct Sides {
    bench: &'static str,
    spec: FabricSpec,
    remote: Option<Mutex<Remote>>,
    seq: AtomicU32,
}

impl Sides {
    /// The client side for `side` (`Side::Both` or `Side::Connect`); with `Connect`,
    /// connects to the server and checks it runs `bench` on the same fabric and timing
    /// model.
    ///
    /// Errors: `Side::Serve`; the server unreachable, speaking another protocol
    /// version, or running another benchmark, fabric or timing model.
    pub fn new(bench: &'static str, spec: FabricSpec, side: Side) -> Result<Self> {
        let remote = match side {
            Side::Both => None,
            Side::Serve { .. } => bail!("the serving side has no client"),
            Side::Connect(addr) => Some(Mutex::new(Remote::connect(addr, bench, &spec)?)),
        };
        Ok(Self {
            bench,
            spec,
            remote,
            seq: AtomicU32::new(0),
        })
    }

    /// The fabric this process opens its nodes on.
    pub fn spec(&self) -> &FabricSpec {
        &self.spec
    }

    /// The server's out-of-band address with `--connect`, `None` in one process.
    pub fn server(&self) -> Option<SocketAddr> {
        self.remote.as_ref().map(|r| lock(r).addr)
    }

    /// Start a point's server side with `params`: here with `start`, or on the
    /// `--connect` server (which runs the same `start`). The returned point ends when
    /// dropped.
    ///
    /// Errors: `start`'s, or the server's (its message).
    pub fn point(&self, params: &Value, start: &StartFn<'_>) -> Result<Point<'_>> {
        match &self.remote {
            None => {
                let n = self.seq.fetch_add(1, Ordering::Relaxed);
                let name = format!("{}-{}-{n}", self.bench, std::process::id());
                let (guard, _) = ClusterGuard::new(&name)?;
                let env = PointEnv {
                    spec: &self.spec,
                    cluster: &name,
                    listen: SocketAddr::from(([127, 0, 0, 1], 0)),
                };
                let started = start(params, &env)?;
                Ok(Point {
                    addr: started.addr,
                    cluster: name,
                    info: started.info.clone(),
                    local: Some((started, guard)),
                    remote: None,
                })
            }
            Some(r) => {
                let v = lock(r).call(&Request::Start {
                    params: params.clone(),
                })?;
                let a: PointAnswer = serde_json::from_value(v).context("the server's answer")?;
                Ok(Point {
                    addr: a.addr,
                    cluster: a.cluster,
                    info: a.info,
                    local: None,
                    remote: Some(r),
                })
            }
        }
    }

    /// Start `ib_write_lat`'s server side where the benchmark's server side runs (this
    /// process, or the `--connect` server) and run its client here against it, between
    /// the devices the benchmark's nodes use.
    ///
    /// Errors: see [`perftest::run_pair`].
    pub fn perftest(&self, size_bytes: usize, iterations: u64) -> Result<perftest::Latency> {
        let local = self.spec.perftest_device()?;
        match &self.remote {
            None => {
                perftest::run_pair(&local, &local, "127.0.0.1".parse()?, size_bytes, iterations)
            }
            Some(r) => {
                let mut r = lock(r);
                let v = r.call(&Request::Perftest {
                    size_bytes,
                    iterations,
                })?;
                let port: u16 = serde_json::from_value(v).context("the server's answer")?;
                perftest::run_client(&local, r.addr.ip(), port, size_bytes, iterations)
            }
        }
    }
}

/// The connection, also after a thread panicked holding it.
fn lock(r: &Mutex<Remote>) -> std::sync::MutexGuard<'_, Remote> {
    r.lock().unwrap_or_else(|e| e.into_inner())
}

/// A request on the out-of-band connection.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
enum Request {
    /// The client's benchmark and fabric; answered with nothing or refused.
    Hello {
        bench: String,
        version: u32,
        fabric: String,
        model: String,
    },
    /// Start a point's server side (ending the previous one); answered with a
    /// [`PointAnswer`].
    Start { params: Value },
    /// End the current point.
    Stop,
    /// Start `ib_write_lat`'s server side; answered with its TCP port.
    Perftest { size_bytes: usize, iterations: u64 },
}

/// The answer to [`Request::Start`].
#[derive(Debug, Serialize, Deserialize)]
struct PointAnswer {
    addr: SocketAddr,
    cluster: String,
    info: Value,
}

/// The client end of the out-of-band connection.
struct Remote {
    addr: SocketAddr,
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Remote {
    fn connect(addr: SocketAddr, bench: &str, spec: &FabricSpec) -> Result<Self> {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
            .with_context(|| format!("connecting to the --serve process at {addr}"))?;
        s.set_read_timeout(Some(REPLY_TIMEOUT))?;
        s.set_nodelay(true)?;
        let mut r = Self {
            addr,
            reader: BufReader::new(s.try_clone()?),
            writer: s,
        };
        r.call(&Request::Hello {
            bench: bench.into(),
            version: PROTOCOL_VERSION,
            fabric: spec.kind.to_string(),
            model: spec.model_name(),
        })?;
        Ok(r)
    }

    /// Send `req`, return the server's answer or its refusal as an error.
    fn call(&mut self, req: &Request) -> Result<Value> {
        let addr = self.addr;
        let mut line = serde_json::to_string(req)?;
        line.push('\n');
        self.writer
            .write_all(line.as_bytes())
            .with_context(|| format!("writing to the server at {addr}"))?;
        let mut back = String::new();
        let n = self
            .reader
            .read_line(&mut back)
            .with_context(|| format!("reading the server's answer from {addr}"))?;
        if n == 0 {
            bail!("the server at {addr} closed the connection");
        }
        let reply: std::result::Result<Value, String> =
            serde_json::from_str(&back).with_context(|| format!("a bad answer from {addr}"))?;
        reply.map_err(|e| anyhow::anyhow!("the server at {addr}: {e}"))
    }
}

/// Run the server side of `bench` for [`Side::Serve`]: listen, print `READY <addr>`
/// after `banner` (through [`rrpc::service::announce_ready`]), and serve one client at a
/// time, starting each point's server side with `start`, until SIGINT, SIGTERM or the
/// end of stdin.
///
/// Errors: `side` is not `Serve`; the listen address cannot be bound; stdout is closed.
/// A client's bad request is refused on its connection and logged, never fatal.
pub fn serve(
    bench: &'static str,
    spec: &FabricSpec,
    side: Side,
    banner: &[String],
    start: &StartFn<'_>,
) -> Result<()> {
    let Side::Serve { listen, advertise } = side else {
        bail!("serve needs --serve");
    };
    let stop = stop_signal()?;
    let listener =
        TcpListener::bind(listen).with_context(|| format!("binding --listen {listen}"))?;
    let bound = listener.local_addr()?;
    let public = rrpc::service::advertised(bound, advertise);
    listener.set_nonblocking(true)?;
    // Both sides open one endpoint here: a missing device or a refused model shows now,
    // not at the first client.
    let probe_name = format!("{bench}-{}-probe", std::process::id());
    {
        let (_guard, _) = ClusterGuard::new(&probe_name)?;
        let f = spec.open(&probe_name, NodeId(1))?;
        let mut lines = banner.to_vec();
        lines.push(format!("{bench} server | {}", f.describe()));
        rrpc::service::announce_ready(public, &lines)?;
    }
    let mut server = Server {
        bench,
        spec,
        public,
        start,
        seq: 0,
        point: None,
        perftests: Vec::new(),
        stopping: false,
    };
    loop {
        match stop.recv_timeout(Duration::from_millis(50)) {
            Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) => {}
        }
        match listener.accept() {
            Ok((s, peer)) => {
                if let Err(e) = server.client(s, &stop) {
                    eprintln!("{bench} server: client {peer}: {e:#}");
                }
                server.end_point();
                if server.stopping {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e).context("accepting a client"),
        }
    }
    server.end_point();
    Ok(())
}

/// The serving side's state: the current point and the perftest servers it started.
struct Server<'a> {
    bench: &'static str,
    spec: &'a FabricSpec,
    public: SocketAddr,
    start: &'a StartFn<'a>,
    seq: u32,
    point: Option<(Started, ClusterGuard)>,
    perftests: Vec<std::process::Child>,
    /// A stop signal arrived while serving a client.
    stopping: bool,
}

impl Server<'_> {
    /// Serve one client's requests until it leaves (or a stop signal).
    fn client(&mut self, s: TcpStream, stop: &Receiver<()>) -> Result<()> {
        s.set_nonblocking(false)?;
        s.set_read_timeout(Some(Duration::from_millis(100)))?;
        s.set_nodelay(true)?;
        let mut w = s.try_clone()?;
        let mut r = BufReader::new(s);
        let mut hello = false;
        let mut line = String::new();
        loop {
            if stop.try_recv().is_ok() {
                self.stopping = true;
                return Ok(());
            }
            match r.read_line(&mut line) {
                Ok(0) => return Ok(()),
                Ok(_) if !line.ends_with('\n') => continue,
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    continue
                }
                Err(e) => return Err(e.into()),
            }
            let answer = match serde_json::from_str::<Request>(&line) {
                Err(e) => Err(format!("a bad request: {e}")),
                Ok(Request::Hello { .. }) if hello => Err("a second hello".into()),
                Ok(req @ Request::Hello { .. }) => {
                    let a = self.hello(&req);
                    hello = a.is_ok();
                    a
                }
                Ok(_) if !hello => Err("a request before hello".into()),
                Ok(req) => self.request(req).map_err(|e| format!("{e:#}")),
            };
            line.clear();
            let refused = answer.as_ref().err().cloned();
            let mut out = serde_json::to_string(&answer)?;
            out.push('\n');
            w.write_all(out.as_bytes())?;
            if let Some(e) = refused {
                eprintln!("{} server: refused: {e}", self.bench);
                if !hello {
                    return Ok(());
                }
            }
        }
    }

    fn hello(&self, req: &Request) -> std::result::Result<Value, String> {
        let Request::Hello {
            bench,
            version,
            fabric,
            model,
        } = req
        else {
            return Err("not a hello".into());
        };
        if *version != PROTOCOL_VERSION {
            return Err(format!(
                "protocol version {version}, this server speaks {PROTOCOL_VERSION}"
            ));
        }
        if bench != self.bench {
            return Err(format!("this is a {} server, not {bench}", self.bench));
        }
        if *fabric != self.spec.kind.to_string() {
            return Err(format!(
                "this server runs --fabric {}, the client {fabric}: give both the same",
                self.spec.kind
            ));
        }
        let mine = self.spec.model_name();
        if *model != mine {
            return Err(format!(
                "this server runs --model {mine}, the client {model}: give both the same"
            ));
        }
        Ok(Value::Null)
    }

    fn request(&mut self, req: Request) -> Result<Value> {
        match req {
            Request::Hello { .. } => bail!("a second hello"),
            Request::Stop => {
                self.end_point();
                Ok(Value::Null)
            }
            Request::Start { params } => {
                self.end_point();
                let name = format!("{}-{}-{}", self.bench, std::process::id(), self.seq);
                self.seq += 1;
                let (guard, _) = ClusterGuard::new(&name)?;
                let env = PointEnv {
                    spec: self.spec,
                    cluster: &name,
                    listen: self.public,
                };
                let started = (self.start)(&params, &env)?;
                let addr = SocketAddr::new(self.public.ip(), started.addr.port());
                let answer = serde_json::to_value(PointAnswer {
                    addr,
                    cluster: name,
                    info: started.info.clone(),
                })?;
                self.point = Some((started, guard));
                Ok(answer)
            }
            Request::Perftest {
                size_bytes,
                iterations,
            } => {
                let dev = self.spec.perftest_device()?;
                let (child, port) =
                    perftest::start_server(&dev, self.public.ip(), size_bytes, iterations)?;
                self.perftests.push(child);
                Ok(serde_json::to_value(port)?)
            }
        }
    }

    /// Drop the current point's server side and reap finished perftest servers.
    fn end_point(&mut self) {
        if let Some((started, guard)) = self.point.take() {
            drop(started);
            drop(guard);
        }
        self.perftests
            .retain_mut(|c| matches!(c.try_wait(), Ok(None)));
    }
}

impl Drop for Server<'_> {
    fn drop(&mut self) {
        for c in &mut self.perftests {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A channel that receives a message on SIGINT, SIGTERM, or when stdin ends (unless
/// stdin is /dev/null: a process started in the background with nothing attached).
fn stop_signal() -> Result<Receiver<()>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let t = tx.clone();
    ctrlc::set_handler(move || {
        let _ = t.send(());
    })
    .context("installing the SIGINT/SIGTERM handler")?;
    if !stdin_is_dev_null() {
        std::thread::spawn(move || {
            let mut sink = [0u8; 256];
            let mut stdin = std::io::stdin().lock();
            loop {
                match stdin.read(&mut sink) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            let _ = tx.send(());
        });
    }
    Ok(rx)
}

/// Whether stdin is /dev/null (or absent).
fn stdin_is_dev_null() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    match (
        std::fs::metadata("/proc/self/fd/0"),
        std::fs::metadata("/dev/null"),
    ) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        (Err(_), _) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        side: SideArgs,
        #[command(subcommand)]
        cmd: Option<Sub>,
    }

    #[derive(clap::Subcommand, Debug)]
    enum Sub {
        Run,
    }

    fn parse(args: &[&str]) -> std::result::Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("b").chain(args.iter().copied()))
    }

    #[test]
    fn serve_with_connect_is_refused() {
        let e = parse(&["--serve", "--connect", "127.0.0.1:7000"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ArgumentConflict, "{e}");
        let e = parse(&["run", "--connect", "127.0.0.1:7000", "--serve"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ArgumentConflict, "{e}");
    }

    #[test]
    fn listen_and_advertise_need_serve() {
        for args in [
            &["--listen", "127.0.0.1:0"][..],
            &["--advertise", "10.0.0.1"],
            &["--connect", "127.0.0.1:1", "--listen", "127.0.0.1:0"],
            &["run", "--connect", "127.0.0.1:1", "--advertise", "10.0.0.1"],
        ] {
            let e = parse(args).unwrap_err();
            assert!(
                matches!(
                    e.kind(),
                    clap::error::ErrorKind::MissingRequiredArgument
                        | clap::error::ErrorKind::ArgumentConflict
                ),
                "{args:?}: {e}"
            );
        }
    }

    #[test]
    fn a_connect_address_needs_a_port() {
        assert!(parse(&["--connect", "127.0.0.1"]).is_err());
        assert!(parse(&["--connect", "no-such-host.invalid:7000"]).is_err());
    }

    #[test]
    fn sides_from_flags() {
        assert_eq!(parse(&["run"]).unwrap().side.side(), Side::Both);
        assert_eq!(
            parse(&["--serve"]).unwrap().side.side(),
            Side::Serve {
                listen: "127.0.0.1:0".parse().unwrap(),
                advertise: None
            }
        );
        assert_eq!(
            parse(&[
                "--serve",
                "--listen",
                "0.0.0.0:7100",
                "--advertise",
                "10.0.0.1"
            ])
            .unwrap()
            .side
            .side(),
            Side::Serve {
                listen: "0.0.0.0:7100".parse().unwrap(),
                advertise: Some("10.0.0.1:0".parse().unwrap())
            }
        );
        assert_eq!(
            parse(&["run", "--connect", "127.0.0.1:7100"])
                .unwrap()
                .side
                .side(),
            Side::Connect("127.0.0.1:7100".parse().unwrap())
        );
    }

    #[test]
    fn models_default_per_fabric_and_verbs_refuses_one() {
        assert_eq!(model_for(FabricKind::Shm, None, "cx5").unwrap(), "cx5");
        assert_eq!(model_for(FabricKind::Verbs, None, "cx5").unwrap(), "none");
        assert_eq!(
            model_for(FabricKind::Shm, Some("rxe"), "cx5").unwrap(),
            "rxe"
        );
        assert_eq!(
            model_for(FabricKind::Verbs, Some("none"), "cx5").unwrap(),
            "none"
        );
        let e = model_for(FabricKind::Verbs, Some("cx5"), "cx5").unwrap_err();
        assert!(e.to_string().contains("shm fabric only"), "{e}");
        assert!(fabric_kind(Some("tcp")).is_err());
        assert_eq!(fabric_kind(Some("verbs")).unwrap(), FabricKind::Verbs);
    }

    #[test]
    fn a_serving_side_has_no_client() {
        let spec = FabricSpec::new(FabricKind::Shm, None, &SideArgs::default());
        let side = Side::Serve {
            listen: "127.0.0.1:0".parse().unwrap(),
            advertise: None,
        };
        assert!(Sides::new("b", spec, side).is_err());
    }
}
