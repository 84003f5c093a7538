//! `txn-bench --breakdown`: where a committed transaction's time goes, per transaction
//! type, as Scythe's latency decomposition splits it (Scythe, 5.2), and the CPU time of
//! each process of the cluster.
//!
//! A committed transaction's time is the sum over its attempts of each attempt's phases
//! ([`txn::phase`]: execution reads, timestamps, lock acquisition and waits, validation,
//! the commit's writes, unlock) plus the backoff slept between attempts. Each column of
//! the table gives the mean and the 99th percentile of that part over the committed
//! transactions of the type, in microseconds; the percentiles of the parts do not add up
//! to the total's (each is taken on its own).

use std::fmt::Write as _;
use std::time::Duration;

use hdrhistogram::serialization::{Deserializer, Serializer, V2Serializer};
use hdrhistogram::Histogram;
use serde::Serialize;
use txn::phase::{Phase, PhaseTimes};

/// Columns of the breakdown: the phases, then the backoff between attempts, then the
/// total.
const COLUMNS: usize = Phase::COUNT + 2;
const BACKOFF: usize = Phase::COUNT;
const TOTAL: usize = Phase::COUNT + 1;

fn column_name(i: usize) -> &'static str {
    match i {
        BACKOFF => "backoff",
        TOTAL => "total",
        i => Phase::ALL[i].name(),
    }
}

fn new_hist() -> Histogram<u64> {
    // Nanoseconds, up to a minute, 3 significant digits.
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

/// One transaction type's histograms, one per column (nanoseconds).
#[derive(Clone, Debug)]
struct TypeParts {
    hist: Vec<Histogram<u64>>,
}

impl TypeParts {
    fn new() -> Self {
        Self {
            hist: (0..COLUMNS).map(|_| new_hist()).collect(),
        }
    }
}

/// The breakdown of the committed transactions of each type.
#[derive(Clone, Debug)]
pub struct Breakdown {
    types: Vec<TypeParts>,
}

impl Breakdown {
    /// An empty breakdown for `kinds` transaction types.
    pub fn with_kinds(kinds: usize) -> Self {
        Self {
            types: (0..kinds).map(|_| TypeParts::new()).collect(),
        }
    }

    /// Record one committed transaction of type `kind`: its attempts' phases summed, and
    /// the backoff slept between them. A kind out of range is ignored.
    pub fn record(&mut self, kind: usize, phases: &PhaseTimes, backoff: Duration) {
        let Some(t) = self.types.get_mut(kind) else {
            return;
        };
        let backoff_ns = u64::try_from(backoff.as_nanos()).unwrap_or(u64::MAX);
        for (i, h) in t.hist.iter_mut().enumerate() {
            let v = match i {
                BACKOFF => backoff_ns,
                TOTAL => phases.total().saturating_add(backoff_ns),
                i => phases.ns[i],
            };
            h.saturating_record(v.max(1));
        }
    }

    /// Add `other`'s transactions (another thread's) to these.
    ///
    /// Errors: never in practice (histograms of the same bounds); a failed add is
    /// reported as text.
    pub fn merge(&mut self, other: &Breakdown) -> Result<(), String> {
        for (a, b) in self.types.iter_mut().zip(&other.types) {
            for (ha, hb) in a.hist.iter_mut().zip(&b.hist) {
                ha.add(hb).map_err(|e| format!("merging breakdowns: {e}"))?;
            }
        }
        Ok(())
    }

    /// Every histogram (nanoseconds), per type and column, in HdrHistogram's V2
    /// encoding: the breakdown as a compute-node process sends it to `txn-bench`
    /// ([`Self::decode`]).
    pub fn encode(&self) -> Vec<Vec<Vec<u8>>> {
        self.types
            .iter()
            .map(|t| {
                t.hist
                    .iter()
                    .map(|h| {
                        let mut buf = Vec::new();
                        // Writing to a Vec cannot fail; a histogram that cannot be
                        // encoded goes as empty bytes, which `decode` refuses.
                        let _ = V2Serializer::new().serialize(h, &mut buf);
                        buf
                    })
                    .collect()
            })
            .collect()
    }

    /// A breakdown from [`Self::encode`]'s bytes.
    ///
    /// Errors: a type without one histogram per column, or a histogram that does not
    /// decode.
    pub fn decode(types: &[Vec<Vec<u8>>]) -> Result<Self, String> {
        let mut out = Self::with_kinds(types.len());
        for (t, cols) in out.types.iter_mut().zip(types) {
            if cols.len() != COLUMNS {
                return Err(format!(
                    "a breakdown type with {} columns, expected {COLUMNS}",
                    cols.len()
                ));
            }
            for (h, bytes) in t.hist.iter_mut().zip(cols) {
                let got: Histogram<u64> = Deserializer::new()
                    .deserialize(&mut bytes.as_slice())
                    .map_err(|e| format!("a breakdown histogram: {e:?}"))?;
                h.add(&got)
                    .map_err(|e| format!("a breakdown histogram: {e}"))?;
            }
        }
        Ok(out)
    }

    /// Committed transactions recorded of type `kind`.
    pub fn count(&self, kind: usize) -> u64 {
        self.types.get(kind).map_or(0, |t| t.hist[TOTAL].len())
    }

    /// Per type with at least one commit: its name and, per column, (mean, p99) in
    /// microseconds.
    pub fn rows(&self, kinds: &[&str]) -> Vec<BreakdownRow> {
        self.types
            .iter()
            .zip(kinds)
            .filter(|(t, _)| !t.hist[TOTAL].is_empty())
            .map(|(t, name)| BreakdownRow {
                kind: (*name).to_string(),
                committed: t.hist[TOTAL].len(),
                parts: t
                    .hist
                    .iter()
                    .enumerate()
                    .map(|(i, h)| BreakdownPart {
                        part: column_name(i),
                        mean_us: h.mean() / 1e3,
                        p99_us: h.value_at_quantile(0.99) as f64 / 1e3,
                    })
                    .collect(),
            })
            .collect()
    }

    /// The table: one row per type, `mean/p99` in microseconds per column.
    pub fn table(&self, protocol: &str, kinds: &[&str]) -> String {
        render(protocol, &self.rows(kinds))
    }
}

/// The breakdown table of `rows`: one row per type, `mean/p99` in microseconds per
/// column.
pub fn render(protocol: &str, rows: &[BreakdownRow]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "breakdown ({protocol}): mean/p99 us per committed transaction, summed over its attempts"
    );
    let _ = write!(out, "{:<18} {:>9}", "type", "committed");
    for i in 0..COLUMNS {
        let _ = write!(out, " {:>15}", column_name(i));
    }
    out.push('\n');
    for r in rows {
        let _ = write!(out, "{:<18} {:>9}", r.kind, r.committed);
        for p in &r.parts {
            let cell = format!("{:.1}/{:.1}", p.mean_us, p.p99_us);
            let _ = write!(out, " {cell:>15}");
        }
        out.push('\n');
    }
    out
}

/// Scythe's share of attempts that ran TOCC, for one table.
#[derive(Clone, Debug, Serialize)]
pub struct ToccShare {
    /// Table name.
    pub table: String,
    /// Attempts that read the table.
    pub attempts: u64,
    /// Of those, attempts that ran TOCC (the high-heat mode).
    pub tocc: u64,
}

/// `tocc share per table: accounts 12.3% of 4567 attempts, ...`.
pub fn tocc_line(shares: &[ToccShare]) -> String {
    let parts: Vec<String> = shares
        .iter()
        .filter(|s| s.attempts > 0)
        .map(|s| {
            format!(
                "{} {:.1}% of {} attempts",
                s.table,
                100.0 * s.tocc as f64 / s.attempts as f64,
                s.attempts
            )
        })
        .collect();
    format!(
        "attempts that ran TOCC, per table read: {}",
        parts.join(", ")
    )
}

/// One type's row of the breakdown.
#[derive(Clone, Debug, Serialize)]
pub struct BreakdownRow {
    /// Transaction type.
    pub kind: String,
    /// Committed transactions of the type.
    pub committed: u64,
    /// Per column (phases, `backoff`, `total`): mean and p99, microseconds.
    pub parts: Vec<BreakdownPart>,
}

/// One column of a row.
#[derive(Clone, Debug, Serialize)]
pub struct BreakdownPart {
    /// Column: a phase name ([`Phase::name`]), `backoff` or `total`.
    pub part: &'static str,
    /// Mean, microseconds.
    pub mean_us: f64,
    /// 99th percentile, microseconds.
    pub p99_us: f64,
}

/// CPU time (user + system) a process has used so far, from `/proc/<pid>/stat`.
///
/// Errors: the process is gone or its stat line is malformed.
pub fn process_cpu(pid: u32) -> std::io::Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_stat_cpu(&stat, clock_ticks_per_second()).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("/proc/{pid}/stat: no utime/stime fields"),
        )
    })
}

fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf reads a constant of the system; no memory is passed.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(t).ok().filter(|&t| t > 0).unwrap_or(100)
}

/// utime + stime (fields 14 and 15 of `/proc/<pid>/stat`, counted after the command
/// name's closing parenthesis, which may itself hold spaces) as a duration.
fn parse_stat_cpu(stat: &str, ticks_per_s: u64) -> Option<Duration> {
    let after = &stat[stat.rfind(')')? + 1..];
    // Fields from 3 (state) on; utime is field 14, stime 15.
    let mut f = after.split_whitespace().skip(11);
    let utime: u64 = f.next()?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    let ticks = utime + stime;
    Some(Duration::from_nanos(
        ticks.saturating_mul(1_000_000_000) / ticks_per_s.max(1),
    ))
}

/// CPU time of the cluster's processes over a run: name and seconds, and the share of
/// the run's wall time (1.0 = one core busy).
#[derive(Clone, Debug, Serialize)]
pub struct ProcessCpu {
    /// Process (binary) name, with its node id where it has one.
    pub process: String,
    /// CPU seconds used during the run.
    pub cpu_s: f64,
    /// `cpu_s` over the run's wall seconds.
    pub cores: f64,
}

/// The processes' CPU line: `cpu: txn-bench 1.90 s (0.63 cores), lockd 0.40 s (...)`.
pub fn cpu_line(procs: &[ProcessCpu]) -> String {
    let parts: Vec<String> = procs
        .iter()
        .map(|p| format!("{} {:.2} s ({:.2} cores)", p.process, p.cpu_s, p.cores))
        .collect();
    format!("cpu during the run: {}", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phases(read_us: u64, lock_us: u64) -> PhaseTimes {
        let mut p = PhaseTimes::default();
        p.ns[Phase::Execute as usize] = read_us * 1000;
        p.ns[Phase::Lock as usize] = lock_us * 1000;
        p
    }

    #[test]
    fn a_row_gives_each_parts_mean_and_the_total_includes_backoff() {
        let mut b = Breakdown::with_kinds(2);
        b.record(0, &phases(10, 2), Duration::from_micros(4));
        b.record(0, &phases(20, 4), Duration::ZERO);
        let rows = b.rows(&["Payment", "NewOrder"]);
        assert_eq!(rows.len(), 1, "types without commits are left out");
        let r = &rows[0];
        assert_eq!((r.kind.as_str(), r.committed), ("Payment", 2));
        let part = |name: &str| r.parts.iter().find(|p| p.part == name).unwrap();
        assert!((part("read").mean_us - 15.0).abs() < 0.1);
        assert!((part("lock").mean_us - 3.0).abs() < 0.1);
        assert!((part("backoff").mean_us - 2.0).abs() < 0.1);
        assert!((part("total").mean_us - 20.0).abs() < 0.1);
        assert!((part("read").p99_us - 20.0).abs() < 0.1);
        let t = b.table("scythe", &["Payment", "NewOrder"]);
        assert!(t.contains("Payment") && !t.contains("NewOrder"), "{t}");
    }

    #[test]
    fn a_breakdown_travels_encoded_and_bad_bytes_are_refused() {
        let mut b = Breakdown::with_kinds(2);
        b.record(1, &phases(10, 2), Duration::from_micros(4));
        b.record(1, &phases(30, 6), Duration::ZERO);
        let back = Breakdown::decode(&b.encode()).unwrap();
        assert_eq!((back.count(0), back.count(1)), (0, 2));
        assert_eq!(
            format!("{:?}", back.rows(&["A", "B"])),
            format!("{:?}", b.rows(&["A", "B"]))
        );
        let mut short = b.encode();
        short[1].pop();
        assert!(Breakdown::decode(&short).unwrap_err().contains("columns"));
        let mut torn = b.encode();
        torn[0][0] = vec![1, 2, 3];
        assert!(Breakdown::decode(&torn).unwrap_err().contains("histogram"));
    }

    #[test]
    fn merged_threads_count_every_commit() {
        let mut a = Breakdown::with_kinds(1);
        let mut b = Breakdown::with_kinds(1);
        a.record(0, &phases(1, 0), Duration::ZERO);
        b.record(0, &phases(3, 0), Duration::ZERO);
        b.record(7, &phases(3, 0), Duration::ZERO); // unknown kind: ignored
        a.merge(&b).unwrap();
        assert_eq!(a.count(0), 2);
    }

    #[test]
    fn stat_lines_parse_with_spaces_in_the_command_name() {
        let stat = "1234 (txn bench) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 3 0 100";
        assert_eq!(
            parse_stat_cpu(stat, 100),
            Some(Duration::from_secs(3)),
            "utime 250 + stime 50 ticks at 100 Hz"
        );
        assert_eq!(parse_stat_cpu("garbage", 100), None);
        assert!(process_cpu(std::process::id()).is_ok());
    }
}
