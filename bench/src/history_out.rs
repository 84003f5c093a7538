//! `--history-out PATH`: the run's committed transactions as JSON Lines, one per line
//! ([`HistoryLine`]), and back: coordinator processes stream their history to
//! `txn-bench` in the same form ([`crate::cnode`]), which appends it to the file and
//! rebuilds a [`History`] from it for the checks ([`into_history`]).
//!
//! A line: `{"cnode":I,"incarnation":K,"type":"...","start_ns":..,"end_ns":..,
//! "reads":[[table,key,version],...],"writes":[[table,key,version],...]}`, with
//! `"ts":[start,commit]` added for MVCC (its start and commit timestamps). `start_ns` is
//! the committed attempt's start and `end_ns` the moment its commit was recorded (before
//! its locks were released), both `CLOCK_MONOTONIC` ns (0 when unknown).

use std::io::Write;

use serde::{Deserialize, Serialize};
use txn::history::{Access, AccessKind, History};

/// One committed transaction of the history file.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct HistoryLine {
    /// The compute node (coordinator process) that ran it; 0 for `txn-bench` itself.
    pub cnode: usize,
    /// That process's incarnation (0 first, +1 per restart).
    pub incarnation: u32,
    /// The transaction type, as the report names it.
    #[serde(rename = "type")]
    pub kind: String,
    /// The committed attempt's start, `CLOCK_MONOTONIC` ns.
    pub start_ns: u64,
    /// When its commit was recorded, `CLOCK_MONOTONIC` ns.
    pub end_ns: u64,
    /// `[table, key, version]` read.
    pub reads: Vec<(u32, u64, u64)>,
    /// `[table, key, version]` installed.
    pub writes: Vec<(u32, u64, u64)>,
    /// MVCC: `[start, commit]` timestamps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ts: Option<(u64, u64)>,
}

/// `h`'s transactions as lines of compute node `cnode`, incarnation `incarnation`
/// (`kinds`: the report's type names by kind).
pub fn lines<'a>(
    h: &'a History,
    kinds: &'a [&'static str],
    cnode: usize,
    incarnation: u32,
) -> impl Iterator<Item = HistoryLine> + 'a {
    (0..h.len()).map(move |i| {
        let (kind, acc) = h.txn(i);
        let (start_ns, end_ns) = h.wall_ns(i).unwrap_or((0, 0));
        let pick = |k: AccessKind| {
            acc.iter()
                .filter(|a| a.kind == k)
                .map(|a| (a.table, a.key, a.version))
                .collect()
        };
        HistoryLine {
            cnode,
            incarnation,
            kind: kinds
                .get(usize::from(kind))
                .map_or_else(|| format!("type {kind}"), |k| k.to_string()),
            start_ns,
            end_ns,
            reads: pick(AccessKind::Read),
            writes: pick(AccessKind::Write),
            ts: h.times(i),
        }
    })
}

/// Write `lines` to `w`, one JSON object a line. Errors: `w`'s.
pub fn write_lines(
    w: &mut impl Write,
    lines: impl IntoIterator<Item = HistoryLine>,
) -> std::io::Result<usize> {
    let mut n = 0;
    for l in lines {
        serde_json::to_writer(&mut *w, &l)?;
        w.write_all(b"\n")?;
        n += 1;
    }
    Ok(n)
}

/// Record `line` in `h` (its kind by name among `kinds`, unknown names as kind
/// `u16::MAX`); returns false when `h` is full (see [`History::record`]).
pub fn record(h: &mut History, kinds: &[&'static str], line: &HistoryLine) -> bool {
    let kind = kinds
        .iter()
        .position(|k| *k == line.kind)
        .map_or(u16::MAX, |k| k as u16);
    let acc = line
        .reads
        .iter()
        .map(|&(t, k, v)| Access::read(t, k, v))
        .chain(line.writes.iter().map(|&(t, k, v)| Access::write(t, k, v)));
    let n = line.reads.len() + line.writes.len();
    match line.ts {
        Some((s, c)) => h.record_timed(kind, s, c, n, acc),
        None => h.record_iter(kind, n, acc),
    }
}

/// A history of `lines` (at most `limit_bytes`, see [`History::new`]).
pub fn into_history<'a>(
    lines: impl IntoIterator<Item = &'a HistoryLine>,
    kinds: &[&'static str],
    limit_bytes: usize,
) -> History {
    let mut h = History::new(limit_bytes);
    for l in lines {
        record(&mut h, kinds, l);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip_through_json() {
        let kinds = ["a", "b"];
        let mut h = History::new(usize::MAX);
        {
            let _s = txn::history::AttemptStart::set(5);
            h.record(1, &[Access::read(0, 7, 3), Access::write(0, 7, 4)]);
        }
        h.record_timed(0, 10, 12, 1, [Access::read(2, 1, 9)].into_iter());
        let ls: Vec<HistoryLine> = lines(&h, &kinds, 2, 1).collect();
        let mut buf = Vec::new();
        assert_eq!(write_lines(&mut buf, ls.clone()).unwrap(), 2);
        let text = String::from_utf8(buf).unwrap();
        let first = text.lines().next().unwrap();
        assert!(
            first.starts_with(r#"{"cnode":2,"incarnation":1,"type":"b","start_ns":5,"end_ns":"#),
            "{first}"
        );
        assert!(
            first.ends_with(r#""reads":[[0,7,3]],"writes":[[0,7,4]]}"#),
            "{first}"
        );
        let back: Vec<HistoryLine> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(back, ls);
        assert_eq!(back[1].ts, Some((10, 12)));
        let h2 = into_history(&back, &kinds, usize::MAX);
        assert_eq!(h2.len(), 2);
        assert_eq!(h2.txn(0), h.txn(0));
        assert_eq!(h2.times(1), Some((10, 12)));
    }
}
