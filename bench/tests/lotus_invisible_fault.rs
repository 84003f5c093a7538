//! Lotus's INVISIBLE rule (`txn::lotus`): a snapshot reader that meets a cell still
//! INVISIBLE waits until it is visible. With the rule switched off (readers skip
//! INVISIBLE cells; a fault switch that exists only in test builds), a writer whose
//! commit timestamp falls below a reader's start publishes after the reader read past
//! its cells, and the reader sees half of the commit: the pairs workload's group check
//! (or the serializability check) must fail the run. Under the cx5 timing model the
//! window between the data WRITE and the write-visible WRITE is a TSO round trip and two
//! memory-node round trips. The switch is process-wide, hence a binary of its own.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use bench::txnbench::{run, Args};
use clap::Parser;

fn pairs(protocol: &str) -> bench::report::Report {
    let args = Args::parse_from([
        "txn-bench",
        "--workload",
        "pairs",
        "--groups",
        "20",
        "--protocol",
        protocol,
        "--model",
        "cx5",
        "--threads",
        "2",
        "--coroutines",
        "8",
        "--duration",
        "3",
    ]);
    let (mut summary, _) = run(args, Arc::new(AtomicBool::new(false))).expect("run");
    summary.runs.remove(0)
}

#[test]
fn a_reader_that_skips_invisible_cells_is_caught() {
    // The control: as built, the run passes.
    let ok = pairs("lotus-si");
    assert!(ok.passed(), "control run failed: {:?}", ok.fatal_samples);
    txn::fault::lotus_skip_invisible(true);
    let bad = pairs("lotus-si");
    txn::fault::lotus_skip_invisible(false);
    assert!(
        !bad.passed(),
        "a run whose readers skip INVISIBLE cells passed ({:.0} txn/s)",
        bad.throughput_tps
    );
}
