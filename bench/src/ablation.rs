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

/// One measured row, as the table shows it.
struct Measured<'a> {
    label: &'a str,
    tps: f64,
    p50_us: f64,
    p99_us: f64,
    abort_rate: f64,
}

/// The ablation table of `runs` (the rows of [`rows`], in order; fewer when the
/// invocation was interrupted): throughput, p50, p99, abort rate, the change against
/// the row above and the paper's, then whether the paper's signs hold for two-level
/// routing and the cache.
pub(crate) fn render(runs: &[Report]) -> String {
    let Some(first) = runs.first() else {
        return String::new();
    };
    let rows: Vec<Measured> = runs
        .iter()
        .map(|r| Measured {
            label: r.point.as_deref().unwrap_or(&r.protocol),
            tps: r.throughput_tps,
            p50_us: r.p50_us,
            p99_us: r.p99_us,
            abort_rate: r.abort_rate,
        })
        .collect();
    table(&first.workload, &first.timing_model, &rows)
}

fn table(workload: &str, model: &str, rows: &[Measured]) -> String {
    let paper = paper(workload);
    let mut s = format!(
        "\nLotus ablation (Lotus Fig. 14): {workload} | timing model: {model} | each row on a fresh cluster, same seed\n"
    );
    s.push_str(&format!(
        "{:<48} {:>11} {:>9} {:>9} {:>8} {:>12} {:>8}\n",
        "row", "committed/s", "p50(us)", "p99(us)", "aborts", "vs row above", "paper"
    ));
    let mut changes = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        let change =
            (i > 0 && rows[i - 1].tps > 0.0).then(|| (r.tps / rows[i - 1].tps - 1.0) * 100.0);
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
            change.map_or_else(|| "-".into(), |c| format!("{c:+.1}%")),
            theirs
        ));
    }
    let sign = |i: usize, what: &str| match changes.get(i).copied().flatten() {
        Some(c) if c > 0.0 => format!("{what} gains ({c:+.1}%): as the paper"),
        Some(c) => format!("{what} does not gain ({c:+.1}%): the paper's sign is missed"),
        None => format!("{what}: not run"),
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

    #[test]
    fn the_table_says_whether_each_sign_holds() {
        let run = |label: &'static str, tps: f64| Measured {
            label,
            tps,
            p50_us: 10.0,
            p99_us: 20.0,
            abort_rate: 0.01,
        };
        let t = table(
            "SmallBank",
            "cx5",
            &[
                run("motor (mvcc)", 100.0),
                run("+lock-first", 90.0),
                run("+two-level routing (forward)", 99.0),
                run("+version table cache", 95.0),
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
        let short = table("SmallBank", "cx5", &[run("motor (mvcc)", 100.0)]);
        assert!(short.contains("two-level routing: not run"), "{short}");
    }
}
