//! Lotus's version table cache (`txn::vt_cache`, Lotus 4.4) end to end. A SmallBank run
//! under `lotus` with the cache on (the default) passes its checks (money, locks
//! released, serializability) and its lock holders hit the cache. Rule 3 (errata 2's
//! local writer): with local writers leaving their cached CVTs unchanged (a fault switch
//! that exists only in test builds), the next local lock holder reads a superseded
//! version and writes over it, and the money or serializability check must fail the run.
//! The switch is process-wide, so the control run and the faulty run share one test.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use bench::txnbench::{run, Args};
use clap::Parser;

fn smallbank_lotus() -> bench::report::Report {
    let args = Args::parse_from([
        "txn-bench",
        "--workload",
        "smallbank",
        "--protocol",
        "lotus",
        "--accounts",
        "1000",
        "--threads",
        "2",
        "--coroutines",
        "8",
        "--duration",
        "2",
    ]);
    let (mut summary, _) = run(args, Arc::new(AtomicBool::new(false))).expect("run");
    summary.runs.remove(0)
}

#[test]
fn a_cached_run_passes_and_hits_and_a_writer_that_skips_its_update_is_caught() {
    let ok = smallbank_lotus();
    assert!(ok.passed(), "control run failed: {:?}", ok.fatal_samples);
    let vtc = ok.vtc.expect("a Lotus run reports its cache");
    assert!(vtc.hits > 0, "no hit: {vtc:?}");
    assert!(vtc.fills > 0 && vtc.updates > 0, "{vtc:?}");
    assert!(vtc.entries <= txn::vt_cache::DEFAULT_ENTRIES as u64);

    txn::fault::lotus_skip_vtc_update(true);
    let bad = smallbank_lotus();
    txn::fault::lotus_skip_vtc_update(false);
    eprintln!("the faulty run:\n{}", bad.render());
    assert!(
        !bad.passed(),
        "a run whose writers leave stale cached CVTs passed ({:.0} txn/s, {:?})",
        bad.throughput_tps,
        bad.vtc
    );
}
