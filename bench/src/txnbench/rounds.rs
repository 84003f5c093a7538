//! `txn-bench --rounds N`: the invocation's runs, N times in turn, judged by medians.
//!
//! This project's test machine changes speed by a quarter for minutes at a time (the
//! same occ-cas run gave 80,000 and 107,000 committed/s a few minutes apart). One run per
//! protocol can then pair an occ-cas run taken at one speed with an mvcc run taken at
//! the other, and `throughput mvcc/occ-cas` says more about the machine than about the
//! protocols. Rounds run every run again, in the opposite order each time, take each
//! ratio within a round, and report the median of the rounds beside every round's value.

use crate::peers::rounds::median;
use crate::report::{ratios as round_ratios, Ratio, Report};

/// The order of the runs of `rounds` rounds of a plan of `runs` runs: forward in the
/// first round, backward in the second, and so on, so that a drift of the machine's speed
/// over the invocation reaches every run alike.
pub(crate) fn order(runs: usize, rounds: u32) -> Vec<usize> {
    (0..rounds)
        .flat_map(|k| {
            let fwd = k % 2 == 0;
            (0..runs).map(move |i| if fwd { i } else { runs - 1 - i })
        })
        .collect()
}

/// The comparison's ratios of `runs`: without rounds (no run has a [`Report::round`])
/// those of [`crate::report::ratios`]; with rounds, each ratio taken within every round
/// that has it, then their median ([`Ratio::value`]) beside the rounds' values
/// ([`Ratio::rounds`]), in the order of the first round.
pub(crate) fn ratios(runs: &[Report]) -> Vec<Ratio> {
    let mut rounds: Vec<u32> = runs.iter().filter_map(|r| r.round).collect();
    if rounds.is_empty() {
        return round_ratios(runs);
    }
    rounds.sort_unstable();
    rounds.dedup();
    // Each round's runs in the order of the first round's: a backward round's ratios are
    // then named as a forward one's (`replicas 3/1` over the sweep's first point).
    let key = |r: &Report| (r.protocol.clone(), r.point.clone());
    let mut first_order: Vec<(String, Option<String>)> = Vec::new();
    for r in runs {
        if !first_order.contains(&key(r)) {
            first_order.push(key(r));
        }
    }
    let rank = |r: &Report| first_order.iter().position(|k| *k == key(r));
    let mut out: Vec<Ratio> = Vec::new();
    for k in rounds {
        let mut of_round: Vec<&Report> = runs.iter().filter(|r| r.round == Some(k)).collect();
        of_round.sort_by_key(|r| rank(r));
        for r in round_ratios(&of_round) {
            match out
                .iter_mut()
                .find(|o| o.name == r.name && o.point == r.point)
            {
                Some(o) => o.rounds.extend(r.value),
                None => out.push(Ratio {
                    rounds: r.value.into_iter().collect(),
                    ..r
                }),
            }
        }
    }
    for o in &mut out {
        o.value = (!o.rounds.is_empty()).then(|| median(o.rounds.clone()));
    }
    out
}

/// One protocol at one point, over its rounds: the medians the comparison prints.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Medians {
    /// Protocol name, as its runs report it.
    pub protocol: String,
    /// The sweep point, if any.
    pub point: Option<String>,
    /// Committed transactions per second.
    pub throughput_tps: f64,
    /// Median latency of committed transactions, µs.
    pub p50_us: f64,
    /// 99th percentile latency of committed transactions, µs.
    pub p99_us: f64,
    /// Aborted attempts over all attempts (0 to 1).
    pub abort_rate: f64,
    /// How many runs the medians are over.
    pub runs: usize,
}

/// Per protocol and point (in the order they first ran), the medians of its runs'
/// throughput, p50, p99 and abort rate. Without rounds, each run is its own medians.
pub(crate) fn medians(runs: &[Report]) -> Vec<Medians> {
    let mut keys: Vec<(&str, &Option<String>)> = Vec::new();
    for r in runs {
        if !keys.contains(&(r.protocol.as_str(), &r.point)) {
            keys.push((r.protocol.as_str(), &r.point));
        }
    }
    keys.into_iter()
        .map(|(protocol, point)| {
            let of: Vec<&Report> = runs
                .iter()
                .filter(|r| r.protocol == protocol && &r.point == point)
                .collect();
            let m = |f: fn(&Report) -> f64| median(of.iter().map(|r| f(r)).collect());
            Medians {
                protocol: protocol.to_string(),
                point: point.clone(),
                throughput_tps: m(|r| r.throughput_tps),
                p50_us: m(|r| r.p50_us),
                p99_us: m(|r| r.p99_us),
                abort_rate: m(|r| r.abort_rate),
                runs: of.len(),
            }
        })
        .collect()
}

/// The table of [`medians`] the comparison prints after its per-run table when it ran
/// rounds: one row per protocol (and point), with how many runs each median is over.
pub(crate) fn medians_table(runs: &[Report]) -> String {
    let ms = medians(runs);
    let sweep = ms.iter().any(|m| m.point.is_some());
    let mut s = String::from("medians over the rounds:\n");
    if sweep {
        s.push_str(&format!("{:<24} ", "point"));
    }
    s.push_str(&format!(
        "{:<16} {:>11} {:>9} {:>9} {:>10} {:>5}\n",
        "protocol", "committed/s", "p50(us)", "p99(us)", "abort-rate", "runs"
    ));
    for m in &ms {
        if sweep {
            s.push_str(&format!("{:<24} ", m.point.as_deref().unwrap_or("")));
        }
        s.push_str(&format!(
            "{:<16} {:>11.0} {:>9.1} {:>9.1} {:>9.2}% {:>5}\n",
            m.protocol,
            m.throughput_tps,
            m.p50_us,
            m.p99_us,
            100.0 * m.abort_rate,
            m.runs
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(protocol: &str, round: Option<u32>, tps: f64, p99: f64) -> Report {
        let mut r = crate::report::tests::run_of(protocol, tps, p99);
        r.round = round;
        r
    }

    #[test]
    fn rounds_alternate_the_order() {
        assert_eq!(order(4, 1), vec![0, 1, 2, 3]);
        assert_eq!(order(4, 3), vec![0, 1, 2, 3, 3, 2, 1, 0, 0, 1, 2, 3]);
        assert_eq!(order(2, 2), vec![0, 1, 1, 0]);
    }

    /// Without rounds the ratios are the runs' own.
    #[test]
    fn one_round_is_the_plain_comparison() {
        let runs = [
            run("occ-cas", None, 100.0, 10.0),
            run("mvcc", None, 130.0, 8.0),
        ];
        let lines: Vec<String> = ratios(&runs).iter().map(Ratio::line).collect();
        assert_eq!(lines, ["ratio throughput mvcc/occ-cas = 1.30"]);
        assert!(ratios(&runs)[0].rounds.is_empty());
    }

    /// Each round's ratio is taken within the round: a round at the machine's slow
    /// speed (round 2 here, everything at 80%) changes no ratio, and pairing the fast
    /// occ-cas with the slow mvcc (what one run each can do) is never done. The median
    /// of three rounds leaves out the odd one.
    #[test]
    fn each_ratio_is_taken_within_its_round_and_judged_by_the_median() {
        let runs = [
            run("occ-cas", Some(1), 100.0, 10.0),
            run("mvcc", Some(1), 130.0, 8.0),
            run("mvcc", Some(2), 104.0, 10.0),
            run("occ-cas", Some(2), 80.0, 12.5),
            run("occ-cas", Some(3), 100.0, 10.0),
            run("mvcc", Some(3), 90.0, 8.0),
        ];
        let r = ratios(&runs);
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!(r[0].rounds, vec![1.3, 1.3, 0.9]);
        assert_eq!(r[0].value, Some(1.3));
        assert_eq!(
            r[0].line(),
            "ratio throughput mvcc/occ-cas = 1.30 (median of 3 rounds: 1.30 1.30 0.90)"
        );
        // The medians table: every protocol once, over its three runs.
        let ms = medians(&runs);
        assert_eq!(ms.len(), 2);
        assert_eq!(
            (ms[0].protocol.as_str(), ms[0].throughput_tps, ms[0].runs),
            ("occ-cas", 100.0, 3)
        );
        assert_eq!(
            (ms[1].protocol.as_str(), ms[1].throughput_tps, ms[1].p99_us),
            ("mvcc", 104.0, 8.0)
        );
        let t = medians_table(&runs);
        assert!(t.contains("medians over the rounds"), "{t}");
        assert!(
            t.lines()
                .any(|l| l.starts_with("mvcc") && l.contains("104") && l.ends_with('3')),
            "{t}"
        );
    }

    /// A backward round's sweep ratios keep the sweep's first point as their base
    /// (`replicas 3/1`, never `replicas 1/3`).
    #[test]
    fn a_backward_round_keeps_the_forward_names() {
        let at = |r: &str, round: u32, tps: f64| {
            let mut x = run("mvcc", Some(round), tps, 1.0);
            x.point = Some(format!("replicas={r}"));
            x
        };
        let runs = [
            at("1", 1, 100.0),
            at("3", 1, 70.0),
            at("3", 2, 80.0),
            at("1", 2, 100.0),
        ];
        let r = ratios(&runs);
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!(r[0].name, "throughput mvcc replicas 3/1");
        assert_eq!(r[0].rounds, vec![0.7, 0.8]);
    }

    /// A round without one of the protocols (an interrupted invocation) has no ratio:
    /// the median is over the rounds that have it; a ratio no round has is `n/a`.
    #[test]
    fn a_round_without_both_protocols_adds_no_value() {
        let runs = [
            run("occ-cas", Some(1), 100.0, 10.0),
            run("mvcc", Some(1), 120.0, 8.0),
            run("occ-cas", Some(2), 0.0, 0.0),
            run("mvcc", Some(2), 50.0, 8.0),
            run("occ-cas", Some(3), 90.0, 10.0),
        ];
        let r = ratios(&runs);
        assert_eq!(r[0].rounds, vec![1.2]);
        assert_eq!(r[0].line(), "ratio throughput mvcc/occ-cas = 1.20");
        let none = ratios(&[
            run("occ-cas", Some(1), 0.0, 0.0),
            run("mvcc", Some(1), 1.0, 1.0),
        ]);
        assert_eq!(none[0].value, None);
        assert_eq!(none[0].line(), "ratio throughput mvcc/occ-cas = n/a");
    }
}
