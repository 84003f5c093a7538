//! The field's own reference for a bare RDMA round trip: `ib_write_lat` from the
//! perftest package (Debian: `perftest`), run between the same two devices as rrpc.
//!
//! `ib_write_lat` ping-pongs an RDMA WRITE between its server and client and reports
//! half a round trip: its `t_typical` (the median) is a round trip divided by two. The
//! benchmarks compare round trips, so [`Latency::rtt_ns`] is `2 x t_typical`.
//!
//! The server side starts first with no address; the client gets the server's host and
//! the out-of-band TCP port (`-p`). The server may not listen yet when the client
//! starts, so the client retries for a while.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rrpc::fabric::FabricKind;

/// The perftest tool the benchmarks run.
pub const WRITE_LAT: &str = "ib_write_lat";

/// How many times the client tries to reach a server that may not listen yet.
const CONNECT_ATTEMPTS: u32 = 50;
/// Pause between two of those tries.
const CONNECT_PAUSE: Duration = Duration::from_millis(200);

/// The device settings both sides pass to perftest: the device, port and GID index the
/// rrpc verbs backend resolved (so perftest measures between the same two devices).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Device {
    /// Device name (`-d`); `None`: perftest's default, the first device.
    pub name: Option<String>,
    /// Port (`-i`).
    pub port: Option<u8>,
    /// GID index (`-x`).
    pub gid_index: Option<u32>,
}

impl Device {
    /// The device a fabric of `kind` uses, as the verbs backend resolved it (default
    /// device and GID included): `open` opens an endpoint once, whose description is
    /// read; `device`, `port` and `gid_index` (the flags given) win over it.
    ///
    /// Errors: `kind` is not verbs (perftest measures RDMA devices); `open`'s.
    pub fn of(
        kind: FabricKind,
        open: impl FnOnce() -> Result<rrpc::fabric::Fabric>,
        device: Option<String>,
        port: Option<u8>,
        gid_index: Option<u32>,
    ) -> Result<Self> {
        if kind != FabricKind::Verbs {
            bail!("{WRITE_LAT} measures RDMA devices: it needs --fabric verbs");
        }
        let f = open()?;
        let mut d = parse_describe(&f.describe()).unwrap_or_default();
        d.name = device.or(d.name);
        d.port = port.or(d.port);
        d.gid_index = gid_index.or(d.gid_index);
        Ok(d)
    }

    fn args(&self, cmd: &mut Command) {
        if let Some(n) = &self.name {
            cmd.args(["-d", n]);
        }
        if let Some(p) = self.port {
            cmd.args(["-i", &p.to_string()]);
        }
        if let Some(g) = self.gid_index {
            cmd.args(["-x", &g.to_string()]);
        }
    }
}

/// Device, port and GID index from a verbs fabric's description (`verbs (rxe0 port 1
/// GID index 1 ::ffff:..., MTU 1024)`); `None` for anything else.
pub fn parse_describe(s: &str) -> Option<Device> {
    let rest = s.strip_prefix("verbs (")?;
    let mut w = rest.split_whitespace();
    let name = w.next()?.to_string();
    (w.next()? == "port").then_some(())?;
    let port = w.next()?.parse().ok()?;
    (w.next()? == "GID" && w.next()? == "index").then_some(())?;
    let gid_index = w.next()?.trim_end_matches(',').parse().ok()?;
    Some(Device {
        name: Some(name),
        port: Some(port),
        gid_index: Some(gid_index),
    })
}

/// Where `ib_write_lat` is, if it is on `PATH`.
pub fn find() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(WRITE_LAT))
        .find(|p| p.is_file())
}

/// What `ib_write_lat` reported, microseconds as it prints them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Latency {
    /// Message size, bytes.
    pub bytes: u64,
    /// Iterations measured.
    pub iterations: u64,
    /// Shortest half round trip, microseconds.
    pub t_min_us: f64,
    /// Median half round trip (`t_typical`), microseconds.
    pub t_typical_us: f64,
    /// Mean half round trip, microseconds.
    pub t_avg_us: f64,
}

impl Latency {
    /// The round trip this reports, nanoseconds: perftest prints half a round trip, so
    /// `2 x t_typical`.
    pub fn rtt_ns(&self) -> f64 {
        2.0 * self.t_typical_us * 1e3
    }
}

/// Parse `ib_write_lat`'s result table (the header line naming `t_typical[usec]` and
/// the line of figures under it).
///
/// Errors: no such table in `out` (the tool failed, or its format changed).
pub fn parse(out: &str) -> Result<Latency> {
    let mut lines = out.lines();
    let header = lines
        .by_ref()
        .find(|l| l.contains("t_typical"))
        .with_context(|| format!("no t_typical column in {WRITE_LAT}'s output:\n{out}"))?;
    let cols: Vec<&str> = header.split_whitespace().collect();
    let at = |prefix: &str| cols.iter().position(|c| c.starts_with(prefix));
    let row = lines
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|t| t.first().is_some_and(|f| f.parse::<u64>().is_ok()))
        .with_context(|| format!("no figures under {WRITE_LAT}'s header:\n{out}"))?;
    let num = |prefix: &str| -> Result<f64> {
        let i = at(prefix).with_context(|| format!("no {prefix} column"))?;
        row.get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .with_context(|| format!("no {prefix} figure in {row:?}"))
    };
    Ok(Latency {
        bytes: num("#bytes")? as u64,
        iterations: num("#iterations")? as u64,
        t_min_us: num("t_min")?,
        t_typical_us: num("t_typical")?,
        t_avg_us: num("t_avg")?,
    })
}

/// The flags both sides give: size, iterations, out-of-band port, and `-F` (do not
/// fail on a CPU frequency warning, which VMs and power-saving hosts trigger).
fn common(dev: &Device, size_bytes: usize, iterations: u64, port: u16) -> Command {
    let mut c = Command::new(WRITE_LAT);
    dev.args(&mut c);
    c.args(["-F", "-s", &size_bytes.to_string()])
        .args(["-n", &iterations.to_string()])
        .args(["-p", &port.to_string()]);
    c
}

/// Start `ib_write_lat`'s server side on `dev`, its out-of-band port a free TCP port on
/// `ip`'s host; returns the child and the port. Its output goes to this process's
/// stderr (its own figures are the client's to report).
///
/// Errors: `ib_write_lat` not found or not startable; no free port.
pub fn start_server(
    dev: &Device,
    ip: IpAddr,
    size_bytes: usize,
    iterations: u64,
) -> Result<(Child, u16)> {
    find().with_context(|| {
        format!("{WRITE_LAT} not found on PATH (Debian: apt-get install perftest)")
    })?;
    // perftest listens on every address; a port free on `ip` is very likely free there.
    let any = if ip.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
    let port = std::net::TcpListener::bind(any)
        .and_then(|l| l.local_addr())
        .context("finding a free TCP port for perftest")?
        .port();
    let child = common(dev, size_bytes, iterations, port)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {WRITE_LAT}'s server side"))?;
    Ok((child, port))
}

/// Run `ib_write_lat`'s client side on `dev` against the server at `server:port`,
/// retrying while the server is not listening yet.
///
/// Errors: `ib_write_lat` not found; every try failed (its last output); no result
/// table in its output.
pub fn run_client(
    dev: &Device,
    server: IpAddr,
    port: u16,
    size_bytes: usize,
    iterations: u64,
) -> Result<Latency> {
    find().with_context(|| {
        format!("{WRITE_LAT} not found on PATH (Debian: apt-get install perftest)")
    })?;
    let mut last = String::new();
    for _ in 0..CONNECT_ATTEMPTS {
        let out = common(dev, size_bytes, iterations, port)
            .arg(server.to_string())
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("starting {WRITE_LAT}'s client side"))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if out.status.success() {
            return parse(&stdout);
        }
        last = format!(
            "{}\n{stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(CONNECT_PAUSE);
    }
    bail!("{WRITE_LAT} against {server} port {port} failed {CONNECT_ATTEMPTS} times; last: {last}")
}

/// Both sides in this process's host: the server on `server_dev`, the client on
/// `client_dev` reaching it at `ip`.
///
/// Errors: see [`start_server`] and [`run_client`].
pub fn run_pair(
    server_dev: &Device,
    client_dev: &Device,
    ip: IpAddr,
    size_bytes: usize,
    iterations: u64,
) -> Result<Latency> {
    let (mut child, port) = start_server(server_dev, ip, size_bytes, iterations)?;
    let r = run_client(client_dev, ip, port, size_bytes, iterations);
    // The server ends after its client's iterations; one whose client never came is
    // killed.
    if !matches!(child.try_wait(), Ok(Some(_))) {
        std::thread::sleep(Duration::from_millis(100));
        let _ = child.kill();
    }
    let _ = child.wait();
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ib_write_lat`'s client output (perftest 4.5, Soft-RoCE).
    const OUT: &str = "\
---------------------------------------------------------------------------------------
                    RDMA_Write Latency Test
 Dual-port       : OFF		Device         : rxeB
 Number of qps   : 1		Transport type : IB
 Connection type : RC		Using SRQ      : OFF
 TX depth        : 1
 Mtu             : 1024[B]
 Link type       : Ethernet
 GID index       : 1
 Max inline data : 220[B]
 rdma_cm QPs	 : OFF
 Data ex. method : Ethernet
---------------------------------------------------------------------------------------
 local address: LID 0000 QPN 0x0012 PSN 0x2b8e0f RKey 0x000305 VAddr 0x005609a4c6a000
 GID: 00:00:00:00:00:00:00:00:00:00:255:255:192:168:200:02
---------------------------------------------------------------------------------------
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] 
 32      1000          5.34           18.50        5.62               5.80           0.71            9.10                   18.50  
---------------------------------------------------------------------------------------
";

    #[test]
    fn parses_the_result_table() {
        let l = parse(OUT).unwrap();
        assert_eq!(l.bytes, 32);
        assert_eq!(l.iterations, 1000);
        assert_eq!(l.t_min_us, 5.34);
        assert_eq!(l.t_typical_us, 5.62);
        assert_eq!(l.t_avg_us, 5.80);
        // Half a round trip, doubled.
        assert!((l.rtt_ns() - 11_240.0).abs() < 1e-6);
    }

    #[test]
    fn output_without_a_table_is_an_error() {
        assert!(parse("Couldn't connect to 10.0.0.1:18515\n").is_err());
        let headless = OUT.replace("t_typical", "t_median");
        assert!(parse(&headless).is_err());
        let figureless: String = OUT.lines().filter(|l| !l.starts_with(" 32")).collect();
        assert!(parse(&figureless).is_err());
    }

    #[test]
    fn reads_the_verbs_description() {
        assert_eq!(
            parse_describe("verbs (rxeA port 1 GID index 1 ::ffff:192.168.200.1, MTU 1024)"),
            Some(Device {
                name: Some("rxeA".into()),
                port: Some(1),
                gid_index: Some(1),
            })
        );
        assert_eq!(parse_describe("shm (cluster x)"), None);
        assert_eq!(parse_describe("verbs (mlx5_0 port x GID index 3"), None);
    }

    #[test]
    fn shm_has_no_device_for_perftest() {
        let e = Device::of(
            FabricKind::Shm,
            || unreachable!("not opened"),
            None,
            None,
            None,
        )
        .unwrap_err();
        assert!(e.to_string().contains("--fabric verbs"), "{e}");
    }
}
