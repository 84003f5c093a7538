//! TPC-C end to end on every protocol: the real `txn-bench` loads one warehouse (two
//! versions per record) on a local cluster over the shm fabric, runs the standard mix
//! for three seconds, and every check must pass: the consistency conditions 1 to 4
//! (`txn::tpcc::check`), no lock left, every type committed, the protocol's isolation
//! check. `--config` carries the experiment; each coroutine runs every type once
//! before the mix (`each-type-first`), so that a slow machine (the Soft-RoCE VM, which
//! emulates its CPU) still commits every type.
//!
//! With `--range-index`, DELIVERY and STOCK-LEVEL scan the range index (a B-link tree
//! of rTX objects on the memory node) instead of using cursor rows; the same checks
//! hold, and the index after the run holds every NEW_ORDER and ORDER_LINE row.
//!
//! The Soft-RoCE VM (deploy/vm/verbs-tests.sh) runs only `tpcc_on_occ_cas` from this file,
//! on verbs.

mod common;

fn tpcc_on(protocol: &str) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tpcc.toml");
    std::fs::write(
        &config,
        "workload = \"tpcc\"\nwarehouses = 1\nversions = 2\nduration = 3\nthreads = 2\ncoroutines = 2\neach-type-first = true\n",
    )
    .unwrap();
    let (stdout, s) = common::txn_bench(
        &format!("tpcc-{protocol}"),
        &["--config", config.to_str().unwrap(), "--protocol", protocol],
    );
    assert_eq!(s["workload"], "TPC-C");
    assert_eq!(s["passed"], true, "{stdout}");
    let r = &s["runs"][0];
    let kinds: Vec<&str> = bench::tpcc::TxnType::ALL.iter().map(|t| t.name()).collect();
    common::assert_checked_run(r, &kinds, &stdout);
    assert_eq!(r["versions"], 2, "the config file's versions");
    assert_eq!(
        r["workload_check"], "consistency 1-4: ok (10 districts)",
        "{stdout}"
    );
    assert!(stdout.contains("| 1 warehouse(s) |"), "{stdout}");
}

#[test]
fn tpcc_on_occ_cas() {
    tpcc_on("occ-cas");
}

#[test]
fn tpcc_on_scythe() {
    tpcc_on("scythe");
}

#[test]
fn tpcc_on_mvcc() {
    tpcc_on("mvcc");
}

#[test]
fn tpcc_on_mvcc_si() {
    tpcc_on("mvcc-si");
}

#[test]
fn tpcc_on_lotus() {
    tpcc_on("lotus");
}

#[test]
fn tpcc_on_lotus_si() {
    tpcc_on("lotus-si");
}

/// DELIVERY and STOCK-LEVEL through range scans: consistency 1-4 and the index audit
/// hold under a protocol that locks at commit and one that locks at read.
#[test]
fn tpcc_with_range_scans_holds_its_conditions() {
    for protocol in ["occ-cas", "mvcc"] {
        let (stdout, s) = common::txn_bench(
            &format!("tpcc-range-{protocol}"),
            &[
                "--workload",
                "tpcc",
                "--range-index",
                "--warehouses",
                "1",
                "--versions",
                "2",
                "--duration",
                "3",
                "--threads",
                "2",
                "--coroutines",
                "2",
                "--each-type-first",
                "--protocol",
                protocol,
            ],
        );
        assert_eq!(s["passed"], true, "{stdout}");
        let r = &s["runs"][0];
        let kinds: Vec<&str> = bench::tpcc::TxnType::ALL.iter().map(|t| t.name()).collect();
        common::assert_checked_run(r, &kinds, &stdout);
        let check = r["workload_check"].as_str().unwrap();
        assert!(
            check.starts_with("consistency 1-4: ok (10 districts); range index: "),
            "{check}"
        );
        assert!(
            check.ends_with("tree sound, no rTX lock held or log unfinished, every row indexed"),
            "{check}"
        );
        assert!(
            stdout.contains("| 1 warehouse(s), range scans |"),
            "{stdout}"
        );
    }
}
