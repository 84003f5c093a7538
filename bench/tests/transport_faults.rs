//! A flapping link to a memory node (`txn-bench --qp-errors-ms 50`, under a timing
//! model, so that WRs are in flight when their QP breaks: the rxe profile with a 100 us
//! one-way latency, since in a debug build a cx5 round trip, and for occ-cas even rxe's
//! 12 us, is over before the thread's next polling round; `--model cx5` does the same in
//! a release build): every coordinator
//! thread moves its QPs to memory node 0 to the error state every 50 ms. The QP pool
//! connects new ones and the coordinators retry their reads, lock CASes, installs and
//! unlocks on them (`txn::transient`), so for every protocol the run ends with no lock
//! held, the money exact and the history serializable. Without the retries the first
//! failed unlock leaves its lock word held and the run stops on a service failure.

mod common;

use std::time::Duration;

use bench::smallbank::TxnType;

/// SmallBank's transaction types, in report order.
fn smallbank() -> Vec<&'static str> {
    TxnType::ALL.iter().map(|t| t.name()).collect()
}

/// The rxe profile with a 100 us one-way latency, written to a file for `--model`.
fn slow_rxe() -> std::path::PathBuf {
    let text = include_str!("../../deploy/models/rxe.toml")
        .replace("one_way_ns = 12000", "one_way_ns = 100000")
        .replace("name = \"rxe\"", "name = \"rxe-100us\"");
    assert!(text.contains("100000") && text.contains("rxe-100us"));
    let path = std::env::temp_dir().join(format!("rrpc-rxe-100us-{}.toml", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn every_protocol_rides_out_qp_errors_to_a_memnode() {
    let profile = slow_rxe();
    let mut args = vec![
        "--protocol",
        "all",
        "--coroutines",
        "8",
        "--duration",
        "2.5",
        "--qp-errors-ms",
        "50",
    ];
    if !common::model("rxe").is_empty() {
        args.extend(["--model", profile.to_str().unwrap()]);
    }
    let (ok, stdout, sum) = common::txn_bench_watched("qp-errors", &args, Duration::from_secs(300));
    let _ = std::fs::remove_file(&profile);
    assert!(ok, "{stdout}");
    let runs = sum["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4, "{stdout}");
    for r in runs {
        common::assert_checked_run(r, &smallbank(), &stdout);
        let p = r["protocol"].as_str().unwrap();
        assert!(r["qp_errors"].as_u64().unwrap_or(0) >= 10, "{p}: {stdout}");
        assert!(
            r["transient_retries"].as_u64().unwrap_or(0) > 0,
            "{p}: no operation was retried, so no fault hit a WR in flight\n{stdout}"
        );
    }
    assert!(stdout.contains("transport faults: "), "{stdout}");
}
