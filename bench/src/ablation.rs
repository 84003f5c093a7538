//! Lotus's ablation (Lotus 8.4, Fig. 14) in one invocation (`txn-bench --ablation`):
//! the Motor baseline, then Lotus's techniques added one at a time, each row on a fresh
//! cluster with the same seed, and one table with every row's change against the row
//! above beside the paper's.
//!
//! The paper's rows are Motor, +full record store, +log & visible, +lock sharding,
//! +two-level load balancing and +version table cache. Here:
//!
//! 1. `mvcc`: the Motor baseline (locks by CAS on the memory nodes' CVTs);
//! 2. `lotus`, `--routing none`, no version table cache: lock-first with the log and
//!    the visible step, locks sharded over the compute nodes' tables (the paper's
//!    "+log & visible" and "+lock sharding" in one row: this project has no lock-first
//!    protocol with memory-node locks to split them; the full record store is the CVT
//!    store every protocol here already uses);
//! 3. + two-level routing: `--routing forward` (or `ideal` when given);
//! 4. + the version table cache (`--vtc-entries`, 64 K by default).
//!
//! The aim (the project's bar for this machine) is the paper's signs: two-level routing
//! and the cache gain.

use crate::peers::rounds::median;
use crate::report::Report;
use crate::routing::Routing;
use crate::txn_args::{Args, Point};
use txn::coordinator::Protocol;

/// One row of the ablation: what it adds, its protocol and its point.
pub(crate) struct Row {
    /// The protocol the row runs.
    pub(crate) protocol: Protocol,
    /// The point (routing, cache entries) with the row's label.
    pub(crate) point: Point,
}

/// Routing of the rows that add two-level routing: `--routing` if given, else forward
/// (the paper's: a transaction travels to the compute node owning its first record).
fn routed(args: &Args) -> Routing {
    match args.routing {
        Routing::None => Routing::Forward,
        r => r,
    }
}

/// The four rows, in order, at `--theta` and `--coroutines`.
pub(crate) fn rows(args: &Args) -> Vec<Row> {
    let iso = match args.isolation {
        Some(crate::txn_args::IsolationArg::Si) => txn::coordinator::Isolation::Snapshot,
        _ => txn::coordinator::Isolation::Serializable,
    };
    let point = |label: String, routing: Routing, vtc_entries: usize| Point {
        theta: args.theta,
        coroutines: args.coroutines,
        commit_log: None,
        vtc_entries,
        routing: Some(routing),
        lock_serving: None,
        range_index: None,
        replicas: None,
        max_backoff_us: None,
        lock_placement: None,
        label: Some(label),
    };
    let r = routed(args);
    let cache = if args.vtc_entries == 0 {
        txn::vt_cache::DEFAULT_ENTRIES
    } else {
        args.vtc_entries
    };
    vec![
        Row {
            protocol: Protocol::Mvcc(iso),
            point: point("motor (mvcc)".into(), Routing::None, 0),
        },
        Row {
            protocol: Protocol::Lotus(iso),
            point: point(
                "+lock-first, log & visible, lock sharding".into(),
                Routing::None,
                0,
            ),
        },
        Row {
            protocol: Protocol::Lotus(iso),
            point: point(format!("+two-level routing ({})", r.name()), r, 0),
        },
        Row {
            protocol: Protocol::Lotus(iso),
            point: point(format!("+version table cache ({cache} entries)"), r, cache),
        },
    ]
}

/// The paper's changes for rows 2 to 4 on `workload` (Lotus Fig. 14, percent of
/// throughput; row 2 compounds "+log & visible" and "+lock sharding"), or `None` for a
/// workload the figure does not show.
fn paper(workload: &str) -> Option<[f64; 3]> {
    let compound = |a: f64, b: f64| ((1.0 + a / 100.0) * (1.0 + b / 100.0) - 1.0) * 100.0;
    let w = workload.to_ascii_lowercase();
    if w.contains("smallbank") {
        Some([compound(-8.9, 29.7), 36.5, 20.1])
    } else if w.contains("tatp") {
        Some([compound(-6.8, -10.8), 25.7, 5.9])
    } else if w.contains("tpc-c") || w.contains("tpcc") {
        Some([compound(-1.1, 9.9), 8.4, 7.6])
    } else {
        None
    }
}

/// One row, as the table shows it: medians over its rounds.
struct Measured<'a> {
    label: &'a str,
    tps: f64,
    p50_us: f64,
    p99_us: f64,
    abort_rate: f64,
    /// Percent change against the row above in each round both ran.
    changes: Vec<f64>,
}

/// The ablation table of `runs` (the runs of the plan `--rounds` made of `rows`; fewer
/// when the invocation was interrupted): per row the medians over its rounds of
/// throughput, p50, p99 and abort rate, the median over the rounds of its change
/// against the row above (each round's change taken within that round) beside the
/// paper's, then whether the paper's signs hold for two-level routing and the cache.
pub(crate) fn render(rows: &[Row], runs: &[Report]) -> String {
    let Some(first) = runs.first() else {
        return String::new();
    };
    // Each row's runs are the runs labelled with its point; each run knows its round
    // (`Report::round`, none for a single round).
    let label = |protocol: &str, point: &Option<String>| {
        point.clone().unwrap_or_else(|| protocol.to_string())
    };
    let row_of = |l: &str| {
        rows.iter()
            .position(|row| row.point.label.as_deref() == Some(l))
    };
    let mut by_row: Vec<Vec<(u32, f64)>> = vec![Vec::new(); rows.len()];
    for r in runs {
        if let Some(i) = row_of(&label(&r.protocol, &r.point)) {
            by_row[i].push((r.round.unwrap_or(0), r.throughput_tps));
        }
    }
    let mut medians: Vec<_> = crate::txnbench::rounds::medians(runs)
        .into_iter()
        .filter_map(|m| Some((row_of(&label(&m.protocol, &m.point))?, m)))
        .collect();
    medians.sort_by_key(|&(i, _)| i);
    let measured: Vec<Measured> = medians
        .into_iter()
        .map(|(i, m)| {
            let changes = match i.checked_sub(1).map(|j| &by_row[j]) {
                Some(above) => by_row[i]
                    .iter()
                    .filter_map(|&(round, tps)| {
                        let a = above.iter().find(|&&(k, _)| k == round)?.1;
                        (a > 0.0).then(|| (tps / a - 1.0) * 100.0)
                    })
                    .collect(),
                None => Vec::new(),
            };
            Measured {
                label: rows[i].point.label.as_deref().unwrap_or("?"),
                tps: m.throughput_tps,
                p50_us: m.p50_us,
                p99_us: m.p99_us,
                abort_rate: m.abort_rate,
                changes,
            }
        })
        .collect();
    let rounds = by_row.iter().map(Vec::len).max().unwrap_or(0);
    table(&first.workload, &first.timing_model, rounds, &measured)
}

fn table(workload: &str, model: &str, rounds: usize, rows: &[Measured]) -> String {
    let paper = paper(workload);
    let mut s = format!(
        "\nLotus ablation (Lotus Fig. 14): {workload} | timing model: {model} | each row on a fresh cluster, same seed"
    );
    if rounds > 1 {
        s.push_str(&format!(
            " | {rounds} rounds (rows forward, then backward): medians, changes within each round"
        ));
    }
    s.push('\n');
    s.push_str(&format!(
        "{:<48} {:>11} {:>9} {:>9} {:>8} {:>12} {:>8}\n",
        "row", "committed/s", "p50(us)", "p99(us)", "aborts", "vs row above", "paper"
    ));
    let mut changes = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        let change = (!r.changes.is_empty()).then(|| {
            let gains = r.changes.iter().filter(|&&c| c > 0.0).count();
            (median(r.changes.clone()), gains, r.changes.len())
        });
        changes.push(change);
        let theirs = match (i, paper) {
            (1..=3, Some(p)) => format!("{:+.1}%", p[i - 1]),
            _ => "-".into(),
        };
        s.push_str(&format!(
            "{:<48} {:>11.0} {:>9.1} {:>9.1} {:>7.2}% {:>12} {:>8}\n",
            r.label,
            r.tps,
            r.p50_us,
            r.p99_us,
            100.0 * r.abort_rate,
            change.map_or_else(|| "-".into(), |(c, _, _)| format!("{c:+.1}%")),
            theirs
        ));
    }
    let sign = |i: usize, what: &str| {
        let Some((c, gains, n)) = changes.get(i).copied().flatten() else {
            return format!("{what}: not run");
        };
        let of = if n > 1 {
            format!(", median; gains in {gains} of {n} rounds")
        } else {
            String::new()
        };
        if c > 0.0 {
            format!("{what} gains ({c:+.1}%{of}): as the paper")
        } else {
            format!("{what} does not gain ({c:+.1}%{of}): the paper's sign is missed")
        }
    };
    s.push_str(&format!(
        "signs: {}; {}\n",
        sign(2, "two-level routing"),
        sign(3, "the version table cache")
    ));
    s.push_str(
        "(the paper's +log & visible and +lock sharding are one row here: no lock-first \
         protocol with memory-node locks exists to split them)\n",
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paper_rows_compound_the_two_steps_that_share_a_row() {
        let p = paper("SmallBank").unwrap();
        assert!((p[0] - 18.16).abs() < 0.01, "{}", p[0]);
        assert_eq!((p[1], p[2]), (36.5, 20.1));
        assert!(paper("YCSB A").is_none());
    }

    /// Three rounds in [`crate::txnbench::rounds::order`]'s plan: each row's change is the median of its
    /// within-round changes, and the signs say in how many rounds the row gained.
    #[test]
    fn rounds_judge_each_change_by_its_median_within_rounds() {
        use clap::Parser;
        let args = crate::txn_args::Args::parse_from([
            "txn-bench",
            "--ablation",
            "--cnodes",
            "2",
            "--workload",
            "smallbank",
        ]);
        let rows = rows(&args);
        // Per round the throughput of rows 0..4; round 2 runs them backward.
        let tps = [
            [100.0, 90.0, 99.0, 95.0],
            [80.0, 88.0, 80.0, 84.0],
            [100.0, 100.0, 110.0, 120.0],
        ];
        let mut runs = Vec::new();
        for (k, i) in crate::txnbench::rounds::order(4, 3).into_iter().enumerate() {
            let mut r =
                crate::report::tests::run_of(&rows[i].protocol.to_string(), tps[k / 4][i], 0.0);
            r.point = rows[i].point.label.clone();
            r.round = Some(k as u32 / 4);
            runs.push(r);
        }
        let t = render(&rows, &runs);
        assert!(t.contains("3 rounds (rows forward, then backward)"), "{t}");
        // Row 2 against row 1: -10%, +10%, 0%: median 0, gains in 1 of 3.
        assert!(
            t.contains("+lock-first, log & visible, lock sharding"),
            "{t}"
        );
        // Row 3 against row 2: +10%, -9.09%, +10%: median +10%, gains in 2 of 3.
        assert!(
            t.contains("two-level routing gains (+10.0%, median; gains in 2 of 3 rounds)"),
            "{t}"
        );
        // Row 4 against row 3: -4.04%, +5%, +9.09%: median +5%.
        assert!(
            t.contains("the version table cache gains (+5.0%, median; gains in 2 of 3 rounds)"),
            "{t}"
        );
        // Row 1's throughput: the median of 100, 80, 100.
        let motor = t.lines().find(|l| l.starts_with("motor (mvcc)")).unwrap();
        assert!(motor.contains(" 100 "), "{motor}");
    }

    #[test]
    fn the_table_says_whether_each_sign_holds() {
        let run = |label: &'static str, tps: f64, above: Option<f64>| Measured {
            label,
            tps,
            p50_us: 10.0,
            p99_us: 20.0,
            abort_rate: 0.01,
            changes: above
                .map(|a| vec![(tps / a - 1.0) * 100.0])
                .unwrap_or_default(),
        };
        let t = table(
            "SmallBank",
            "cx5",
            1,
            &[
                run("motor (mvcc)", 100.0, None),
                run("+lock-first", 90.0, Some(100.0)),
                run("+two-level routing (forward)", 99.0, Some(90.0)),
                run("+version table cache", 95.0, Some(99.0)),
            ],
        );
        assert!(t.contains("-10.0%"), "{t}");
        assert!(
            t.contains("two-level routing gains (+10.0%): as the paper"),
            "{t}"
        );
        assert!(
            t.contains("the version table cache does not gain (-4.0%)"),
            "{t}"
        );
        assert!(t.contains("+36.5%"), "{t}");
        let short = table("SmallBank", "cx5", 1, &[run("motor (mvcc)", 100.0, None)]);
        assert!(short.contains("two-level routing: not run"), "{short}");
    }
}
