//! `--json PATH` of the benchmark binaries: JSON Lines, one JSON object per line, each
//! with a `"record"` field saying what it is:
//!
//! 1. `"meta"`, first: what ran where ([`meta`]: version, git revision, host, cores,
//!    kernel, fabric, NIC, model, full command line, seed, binary, start time);
//! 2. one record per data point or run (`"point"`, `"run"`), written and flushed as soon
//!    as it is measured, with the latency percentiles in ns (p50, p90, p99, p999, max)
//!    and the HDR histogram (V2 serialization, base64) where the binary has one
//!    ([`latency_fields`]), and the per-interval throughput series where it has one;
//! 3. `"summary"`, last: what the binary used to write as its whole JSON document.
//!
//! The microbenchmarks measure their points deep inside their experiments: the file is
//! a process-wide sink ([`open`], [`point`], [`summary`]); with no `--json`, writing is a
//! no-op.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;

use anyhow::Context;
use hdrhistogram::serialization::{Deserializer, Serializer, V2Serializer};
use hdrhistogram::Histogram;
use serde_json::{json, Value};

/// The git revision the binaries were built from (`unknown` without git).
pub const GIT_REV: &str = env!("BENCH_GIT_REV");

/// What the metadata record says about the run's set-up (the rest it finds itself).
#[derive(Debug, Clone)]
pub struct RunInfo<'a> {
    /// The binary (`txn-bench`, `rrpc-bench`, ...).
    pub binary: &'a str,
    /// The fabric (`shm`, `verbs`).
    pub fabric: rrpc::fabric::FabricKind,
    /// The RDMA device given on verbs (`None`: the default device).
    pub rdma_device: Option<&'a str>,
    /// The timing model that ran (`none`, `cx5`, a profile's path).
    pub model: &'a str,
    /// The RNG seed.
    pub seed: u64,
}

/// The metadata record (`"record": "meta"`).
pub fn meta(info: &RunInfo<'_>) -> Value {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into())
    };
    let nic = match info.fabric {
        rrpc::fabric::FabricKind::Shm => "shm".to_string(),
        rrpc::fabric::FabricKind::Verbs => info
            .rdma_device
            .map(str::to_string)
            .or_else(|| std::env::var("RRPC_RDMA_DEVICE").ok())
            .or_else(only_rdma_device)
            .unwrap_or_else(|| "default (first device)".into()),
    };
    let started_unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    json!({
        "record": "meta",
        "binary": info.binary,
        "version": env!("CARGO_PKG_VERSION"),
        "git_rev": GIT_REV,
        "host": read("/proc/sys/kernel/hostname"),
        "cores": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "kernel": read("/proc/sys/kernel/osrelease"),
        "fabric": info.fabric.to_string(),
        "nic": nic,
        "model": info.model,
        "command_line": command_line(),
        "seed": info.seed,
        "started_unix_ms": started_unix_ms,
    })
}

/// The RDMA device of this machine when there is exactly one (the verbs backend's
/// default is the first device, whose order sysfs does not promise).
fn only_rdma_device() -> Option<String> {
    let names: Vec<String> = std::fs::read_dir("/sys/class/infiniband")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    match names.as_slice() {
        [one] => Some(one.clone()),
        _ => None,
    }
}

/// This process's command line, each argument quoted for a POSIX shell where needed.
pub fn command_line() -> String {
    std::env::args_os()
        .map(|a| {
            let a = a.to_string_lossy().into_owned();
            let plain = !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c));
            if plain {
                a
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A JSON Lines file: each record one line, flushed when written.
pub struct JsonLines {
    w: BufWriter<File>,
}

impl JsonLines {
    /// Create (truncate) `path` and write `meta` as its first line.
    ///
    /// Errors: the file cannot be created or written.
    pub fn create(path: &Path, meta: &Value) -> anyhow::Result<Self> {
        let f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut me = Self {
            w: BufWriter::new(f),
        };
        me.write(meta)
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(me)
    }

    /// Write `record` as one line and flush it.
    ///
    /// Errors: the file's.
    pub fn write(&mut self, record: &Value) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.w, record)?;
        self.w.write_all(b"\n")?;
        self.w.flush()
    }
}

static SINK: Mutex<Option<JsonLines>> = Mutex::new(None);

/// Open the process-wide sink at `path` (when given) with the metadata record of `info`.
///
/// Errors: the file cannot be created or written.
pub fn open(path: Option<&Path>, info: &RunInfo<'_>) -> anyhow::Result<()> {
    let Some(path) = path else { return Ok(()) };
    let file = JsonLines::create(path, &meta(info))?;
    *SINK.lock().unwrap_or_else(|e| e.into_inner()) = Some(file);
    Ok(())
}

/// Write `fields` with `"record": kind` to the sink, if open; a failed write is reported
/// on stderr once and closes the sink (the run goes on).
pub fn record(kind: &str, fields: &Value) {
    let mut sink = SINK.lock().unwrap_or_else(|e| e.into_inner());
    let Some(file) = sink.as_mut() else { return };
    let mut rec = serde_json::Map::new();
    rec.insert("record".into(), json!(kind));
    match fields {
        Value::Object(m) => rec.extend(m.clone()),
        other => {
            rec.insert("value".into(), other.clone());
        }
    }
    if let Err(e) = file.write(&Value::Object(rec)) {
        eprintln!("--json: writing a record failed ({e}); no more records are written");
        *sink = None;
    }
}

/// Write one data point of `experiment` (a `"point"` record: `experiment` and `row`'s
/// fields) and return `row`, for the caller's own table.
pub fn point(experiment: &str, row: Value) -> Value {
    point_with(experiment, row, None)
}

/// [`point`] with the latency fields of `hist` (values in ns) added to the record.
pub fn point_with(experiment: &str, row: Value, hist: Option<&Histogram<u64>>) -> Value {
    if SINK.lock().unwrap_or_else(|e| e.into_inner()).is_none() {
        return row;
    }
    let mut rec = json!({ "experiment": experiment });
    if let (Value::Object(r), Value::Object(m)) = (&mut rec, &row) {
        r.extend(m.clone());
        if let Some(h) = hist {
            r.extend(latency_fields(h));
        }
    }
    record("point", &rec);
    row
}

/// Write the summary record (`fields` with `"record": "summary"`).
pub fn summary(fields: &Value) {
    record("summary", fields);
}

/// Close the sink (flushing is done per record; this ends the file's use).
pub fn close() {
    *SINK.lock().unwrap_or_else(|e| e.into_inner()) = None;
}

/// The latency fields of a histogram of nanoseconds: `p50_ns`, `p90_ns`, `p99_ns`,
/// `p999_ns`, `max_ns`, `count`, and `hdr`: the histogram in HdrHistogram's V2
/// serialization, base64 (any HdrHistogram implementation decodes it).
pub fn latency_fields(h: &Histogram<u64>) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    for (k, q) in [
        ("p50_ns", 0.5),
        ("p90_ns", 0.9),
        ("p99_ns", 0.99),
        ("p999_ns", 0.999),
    ] {
        m.insert(k.into(), json!(h.value_at_quantile(q)));
    }
    m.insert("max_ns".into(), json!(h.max()));
    m.insert("count".into(), json!(h.len()));
    let mut bytes = Vec::new();
    if V2Serializer::new().serialize(h, &mut bytes).is_ok() {
        m.insert("hdr".into(), json!(base64(&bytes)));
    }
    m
}

/// Standard base64 (RFC 4648, with padding).
pub fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The histogram of a record's `hdr` field ([`latency_fields`]): base64, then
/// HdrHistogram's serialization (V2, or any version its deserializer reads), values in ns.
///
/// Errors: text that is not standard padded base64, or bytes that are not a histogram.
pub fn decode_hdr(hdr: &str) -> anyhow::Result<Histogram<u64>> {
    let bytes = base64_decode(hdr)?;
    Deserializer::new()
        .deserialize(&mut bytes.as_slice())
        .map_err(|e| anyhow::anyhow!("hdr: not an HdrHistogram serialization: {e:?}"))
}

/// Decode standard base64 (RFC 4648, with padding), as [`base64`] writes it.
///
/// Errors: a length that is not a multiple of 4, a character outside the alphabet, or
/// padding anywhere but at the end of the last group.
pub fn base64_decode(text: &str) -> anyhow::Result<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let b = text.as_bytes();
    if !b.len().is_multiple_of(4) {
        anyhow::bail!("base64: length {} is not a multiple of 4", b.len());
    }
    let groups = b.len() / 4;
    let mut out = Vec::with_capacity(groups * 3);
    for (g, quad) in b.chunks(4).enumerate() {
        let pad = quad.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && g + 1 != groups) {
            anyhow::bail!("base64: padding inside the text (group {g})");
        }
        let mut n = 0u32;
        for (i, &c) in quad[..4 - pad].iter().enumerate() {
            let v = val(c).ok_or_else(|| {
                anyhow::anyhow!(
                    "base64: {:?} at {} is not in the alphabet",
                    c as char,
                    4 * g + i
                )
            })?;
            n |= v << (18 - 6 * i);
        }
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..4 - pad]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc_4648() {
        for (i, o) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(i.as_bytes()), o, "{i}");
            assert_eq!(base64_decode(o).unwrap(), i.as_bytes(), "{o}");
        }
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(base64_decode(&base64(&all)).unwrap(), all);
        for bad in ["Zg=", "Zg==Zm8=", "Z===", "Zm9*", "Zm9v\n"] {
            assert!(base64_decode(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn latency_fields_round_trip_the_histogram() {
        let mut h = Histogram::<u64>::new(3).unwrap();
        for v in 1..=1000u64 {
            h.record(v * 1000).unwrap();
        }
        let f = latency_fields(&h);
        assert_eq!(f["count"], 1000);
        assert!(f["p50_ns"].as_u64().unwrap() <= f["p99_ns"].as_u64().unwrap());
        assert_eq!(f["max_ns"].as_u64().unwrap(), h.max());
        let back = decode_hdr(f["hdr"].as_str().unwrap()).unwrap();
        assert_eq!(back.len(), 1000);
        assert_eq!(back.max(), h.max());
        assert_eq!(back.value_at_quantile(0.99), h.value_at_quantile(0.99));
        assert!(decode_hdr("Zm9vYmFy").is_err());
    }

    #[test]
    fn the_meta_record_comes_first_and_each_record_is_a_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.jsonl");
        let info = RunInfo {
            binary: "x-bench",
            fabric: rrpc::fabric::FabricKind::Shm,
            rdma_device: None,
            model: "none",
            seed: 9,
        };
        let mut f = JsonLines::create(&p, &meta(&info)).unwrap();
        f.write(&json!({"record": "point", "a": 1})).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        let m = &lines[0];
        assert_eq!(m["record"], "meta");
        assert_eq!(m["binary"], "x-bench");
        assert_eq!(m["fabric"], "shm");
        assert_eq!(m["nic"], "shm");
        assert_eq!(m["seed"], 9);
        for k in [
            "version",
            "git_rev",
            "host",
            "cores",
            "kernel",
            "model",
            "command_line",
            "started_unix_ms",
        ] {
            assert!(!m[k].is_null(), "{k}");
        }
    }
}
