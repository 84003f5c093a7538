//! `--timeline-ms MS`: committed transactions per interval of the run, per coordinator
//! process (compute node), and how fast throughput came back after an injected fault.
//!
//! Counting is per coordinator thread ([`Timeline`]: two vectors indexed by interval,
//! bumped by the coroutines on their own thread), merged after the run (or, for
//! coordinator processes, as their streams arrive) into a [`TimelineReport`].
//!
//! Recovery ([`recovery`]): the survivors' pre-fault share is the mean committed per
//! interval of the compute nodes the fault did not hit, over the whole intervals
//! before the fault (the first interval, a warm-up, left out when there are others);
//! the line names the first interval starting at or after the fault whose commits (all
//! compute nodes, a restarted one included) reach 90% of it.

use std::fmt::Write as _;

use serde::Serialize;

/// Most intervals counted (past it, commits count in the last one): 1,000 s at 1 ms.
pub const MAX_INTERVALS: usize = 1_000_000;

/// One coordinator thread's counts per interval.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Timeline {
    /// Commits per interval.
    pub commits: Vec<u64>,
    /// Attempts that did not commit (conflict aborts, rollbacks) per interval.
    pub aborts: Vec<u64>,
}

impl Timeline {
    /// Count an attempt that ended in interval `i`: a commit or not.
    pub fn count(&mut self, i: usize, committed: bool) {
        let i = i.min(MAX_INTERVALS - 1);
        if self.commits.len() <= i {
            self.commits.resize(i + 1, 0);
            self.aborts.resize(i + 1, 0);
        }
        if committed {
            self.commits[i] += 1;
        } else {
            self.aborts[i] += 1;
        }
    }

    /// Zero every count, keeping the intervals (a coordinator process's stream
    /// replaces the intervals it sent before by position: zeros overwrite them).
    pub fn clear(&mut self) {
        self.commits.iter_mut().for_each(|c| *c = 0);
        self.aborts.iter_mut().for_each(|a| *a = 0);
    }

    /// Add `other`'s counts (another thread of the same compute node).
    pub fn add(&mut self, other: &Timeline) {
        add_into(&mut self.commits, &other.commits);
        add_into(&mut self.aborts, &other.aborts);
    }
}

/// `a[i] += b[i]`, growing `a`.
pub fn add_into(a: &mut Vec<u64>, b: &[u64]) {
    if a.len() < b.len() {
        a.resize(b.len(), 0);
    }
    for (x, y) in a.iter_mut().zip(b) {
        *x += y;
    }
}

/// One compute node's row of the timeline.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct CnodeTimeline {
    /// The compute node (0 for the in-process coordinators).
    pub cnode: usize,
    /// Commits per interval (every incarnation of the compute node summed).
    pub commits: Vec<u64>,
    /// Attempts that did not commit, per interval.
    pub aborts: Vec<u64>,
}

/// An injected fault, as the recovery line names it.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct Fault {
    /// What happened (`cnode 1 killed`, `cnode 1 stopped for 300 ms`, `tso killed`).
    pub what: String,
    /// When, ms into the run.
    pub at_ms: f64,
    /// The compute node it hit (`None`: a service all compute nodes use).
    pub cnode: Option<usize>,
    /// When its recovery was done, ms into the run, if known (a dead compute node's:
    /// when the launcher saw its recovery record).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recovered_ms: Option<f64>,
}

/// How throughput came back after a fault.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct Recovery {
    /// The fault.
    pub fault: Fault,
    /// Mean commits per interval of the survivors before the fault.
    pub survivors_pre_fault: f64,
    /// The first interval from the fault on with commits >= 90% of that.
    pub first_recovered_interval: Option<usize>,
    /// Its start, ms after the fault.
    pub recovered_after_ms: Option<f64>,
    /// Intervals that start after the fault's recovery was done (after the fault when
    /// that is not known), up to the run's last whole one, in which the survivors
    /// committed nothing.
    pub survivors_empty_intervals: usize,
    /// The first of them, ms after the fault.
    pub first_empty_after_ms: Option<f64>,
    /// Mean commits per interval of every compute node before the fault (the first
    /// interval, a partial start, left out).
    pub all_pre_fault: f64,
    /// Mean commits per interval of every compute node (a restarted one included) from
    /// the first recovered interval to the run's last whole one.
    pub all_post_recovery: Option<f64>,
}

/// The run's timeline: commits per interval per compute node, their sum, and the
/// recovery after a fault.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct TimelineReport {
    /// Interval length, ms.
    pub interval_ms: u64,
    /// Per compute node.
    pub cnodes: Vec<CnodeTimeline>,
    /// Commits per interval over all compute nodes.
    pub total: Vec<u64>,
    /// With a fault flag that fired.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recovery: Option<Recovery>,
}

impl TimelineReport {
    /// The report of `cnodes` (each cut or padded to `intervals`, the run's intervals)
    /// at `interval_ms`, with the recovery after `fault` if one fired.
    pub fn new(
        interval_ms: u64,
        mut cnodes: Vec<CnodeTimeline>,
        intervals: usize,
        fault: Option<Fault>,
    ) -> Self {
        for c in &mut cnodes {
            c.commits.resize(intervals, 0);
            c.aborts.resize(intervals, 0);
        }
        let mut total = vec![0; intervals];
        for c in &cnodes {
            add_into(&mut total, &c.commits);
        }
        let recovery = fault.map(|f| recovery(&cnodes, interval_ms, f));
        Self {
            interval_ms,
            cnodes,
            total,
            recovery,
        }
    }

    /// The printed form: per compute node a sparkline of 100 intervals a row (each
    /// character the interval's commits against the node's peak), then the recovery
    /// line.
    pub fn render(&self) -> String {
        const BARS: [char; 9] = [' ', '▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
        let mut s = String::new();
        let _ = writeln!(
            s,
            "timeline: commits per {} ms interval ({} intervals)",
            self.interval_ms,
            self.total.len()
        );
        let rows: Vec<(String, &[u64])> = if self.cnodes.len() > 1 {
            self.cnodes
                .iter()
                .map(|c| (format!("cnode {}", c.cnode), c.commits.as_slice()))
                .chain(std::iter::once(("all".to_string(), self.total.as_slice())))
                .collect()
        } else {
            vec![("all".to_string(), self.total.as_slice())]
        };
        for (name, v) in rows {
            let peak = v.iter().copied().max().unwrap_or(0);
            let sum: u64 = v.iter().sum();
            let _ = writeln!(s, "  {name}: {sum} committed, peak {peak} per interval");
            for (r, chunk) in v.chunks(100).enumerate() {
                let line: String = chunk
                    .iter()
                    .map(|&x| {
                        if peak == 0 {
                            BARS[0]
                        } else {
                            BARS[((x * 8).div_ceil(peak)) as usize]
                        }
                    })
                    .collect();
                let _ = writeln!(
                    s,
                    "  {:>8.2} s |{line}|",
                    (r * 100) as f64 * self.interval_ms as f64 / 1000.0
                );
            }
        }
        if let Some(r) = &self.recovery {
            s.push_str(&r.line(self.interval_ms));
            s.push('\n');
        }
        s
    }
}

impl Recovery {
    /// The recovery line.
    pub fn line(&self, interval_ms: u64) -> String {
        let head = format!(
            "recovery: {} at {:.0} ms; first interval after the fault with throughput >= 90% of the survivors' pre-fault share ({:.1} per {interval_ms} ms)",
            self.fault.what, self.fault.at_ms, self.survivors_pre_fault
        );
        let back = match (self.first_recovered_interval, self.recovered_after_ms) {
            (Some(i), Some(ms)) => format!("{head}: interval {i}, {ms:.0} ms after the fault"),
            _ => format!("{head}: none before the run ended"),
        };
        let since = match self.fault.recovered_ms {
            Some(ms) => format!("the recovery (done at {ms:.0} ms)"),
            None => "the fault".to_string(),
        };
        let empty = match self.first_empty_after_ms {
            Some(ms) => format!(
                "{} interval(s) after {since} with no survivor commit, the first {ms:.0} ms after the fault",
                self.survivors_empty_intervals
            ),
            None => format!("no interval after {since} without a survivor commit"),
        };
        let ratio = match self.all_post_recovery {
            Some(post) if self.all_pre_fault > 0.0 => format!(
                "; throughput after the recovery / before the fault: {:.2}",
                post / self.all_pre_fault
            ),
            _ => String::new(),
        };
        format!("{back}; {empty}{ratio}")
    }
}

/// The recovery after `fault` (module docs) over `cnodes`' rows of equal length.
pub fn recovery(cnodes: &[CnodeTimeline], interval_ms: u64, fault: Fault) -> Recovery {
    let n = cnodes.iter().map(|c| c.commits.len()).max().unwrap_or(0);
    let iv = interval_ms.max(1) as f64;
    // Whole intervals before the fault: 0..before.
    let before = ((fault.at_ms / iv).floor() as usize).min(n);
    let from = usize::from(before > 1);
    let survivors: Vec<&CnodeTimeline> = cnodes
        .iter()
        .filter(|c| Some(c.cnode) != fault.cnode)
        .collect();
    let pre_sum: u64 = survivors
        .iter()
        .map(|c| {
            c.commits[from.min(c.commits.len())..before.min(c.commits.len())]
                .iter()
                .sum::<u64>()
        })
        .sum();
    let survivors_pre_fault = pre_sum as f64 / (before - from).max(1) as f64;
    // Intervals starting at or after the fault.
    let first_after = ((fault.at_ms / iv).ceil() as usize).min(n);
    // Commits in interval `i` of `rows`.
    let at = |rows: &[&CnodeTimeline], i: usize| -> u64 {
        rows.iter()
            .map(|c| c.commits.get(i).copied().unwrap_or(0))
            .sum()
    };
    let all: Vec<&CnodeTimeline> = cnodes.iter().collect();
    let all_at = |i: usize| at(&all, i);
    let survivors_at = |i: usize| at(&survivors, i);
    let found = (first_after..n).find(|&i| all_at(i) as f64 >= 0.9 * survivors_pre_fault);
    // The run's last interval may be partial: left out of what follows.
    let whole = n.saturating_sub(1);
    let quiet_from = fault
        .recovered_ms
        .map_or(first_after, |ms| ((ms / iv).ceil() as usize).min(n));
    let empty: Vec<usize> = (quiet_from..whole)
        .filter(|&i| survivors_at(i) == 0)
        .collect();
    let all_pre_fault =
        (from..before).map(all_at).sum::<u64>() as f64 / (before - from).max(1) as f64;
    let all_post_recovery = found
        .filter(|&i| i < whole)
        .map(|i| (i..whole).map(all_at).sum::<u64>() as f64 / (whole - i) as f64);
    Recovery {
        recovered_after_ms: found.map(|i| i as f64 * iv - fault.at_ms),
        first_recovered_interval: found,
        survivors_pre_fault,
        survivors_empty_intervals: empty.len(),
        first_empty_after_ms: empty.first().map(|&i| i as f64 * iv - fault.at_ms),
        all_pre_fault,
        all_post_recovery,
        fault,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(cnode: usize, commits: &[u64]) -> CnodeTimeline {
        CnodeTimeline {
            cnode,
            commits: commits.to_vec(),
            aborts: vec![0; commits.len()],
        }
    }

    #[test]
    fn counting_merging_and_the_report() {
        let mut a = Timeline::default();
        a.count(2, true);
        a.count(2, false);
        a.count(0, true);
        let mut b = Timeline::default();
        b.count(3, true);
        b.add(&a);
        assert_eq!(
            (b.commits.as_slice(), b.aborts.as_slice()),
            (&[1, 0, 1, 1][..], &[0, 0, 1, 0][..])
        );
        let r = TimelineReport::new(10, vec![row(0, &b.commits), row(1, &[5])], 5, None);
        assert_eq!(r.total, [6, 0, 1, 1, 0]);
        let text = r.render();
        assert!(text.contains("cnode 1: 5 committed, peak 5"), "{text}");
        assert!(text.contains("all: 8 committed, peak 6"), "{text}");
    }

    #[test]
    fn recovery_finds_the_first_interval_back_at_90_percent_of_the_survivors() {
        // cnode 1 killed at 40 ms (interval 4); the survivors (cnode 0) ran 10 per
        // interval before it, stall, and are back to 9 in interval 7.
        let c0 = row(0, &[2, 10, 10, 10, 3, 0, 5, 9, 10]);
        let c1 = row(1, &[2, 10, 10, 10, 0, 0, 0, 0, 0]);
        let fault = Fault {
            what: "cnode 1 killed".into(),
            at_ms: 40.0,
            cnode: Some(1),
            recovered_ms: None,
        };
        let r = recovery(&[c0.clone(), c1.clone()], 10, fault.clone());
        assert_eq!(r.survivors_pre_fault, 10.0);
        assert_eq!(r.first_recovered_interval, Some(7));
        assert_eq!(r.recovered_after_ms, Some(30.0));
        assert!(
            r.line(10).contains("interval 7, 30 ms after the fault"),
            "{}",
            r.line(10)
        );
        // The survivors committed nothing in interval 5 (50 ms: 10 ms after the fault).
        assert_eq!(r.survivors_empty_intervals, 1);
        assert_eq!(r.first_empty_after_ms, Some(10.0));
        // All nodes: 20 per interval before (intervals 1 to 3), 9.5 after the recovery
        // (intervals 7 and 8; the last one, 8, is left out as partial: 9).
        assert_eq!(r.all_pre_fault, 20.0);
        assert_eq!(r.all_post_recovery, Some(9.0));
        assert!(
            r.line(10).contains("1 interval(s) after the fault with no survivor commit, the first 10 ms after the fault; throughput after the recovery / before the fault: 0.45"),
            "{}",
            r.line(10)
        );
        // Counted from the recovery when it is known: done at 55 ms, interval 5 is not.
        let done = Fault {
            recovered_ms: Some(55.0),
            ..fault.clone()
        };
        let r = recovery(&[c0.clone(), c1.clone()], 10, done);
        assert_eq!(r.survivors_empty_intervals, 0);
        assert!(
            r.line(10).contains(
                "no interval after the recovery (done at 55 ms) without a survivor commit"
            ),
            "{}",
            r.line(10)
        );
        // Never back: said so.
        let c0 = row(0, &[2, 10, 10, 10, 3, 0, 5, 8, 8]);
        let r = recovery(&[c0, c1], 10, fault);
        assert_eq!(r.first_recovered_interval, None);
        assert!(r.line(10).contains("none before the run ended; "));
    }
}
