//! TATP end to end on every protocol: the real `txn-bench` loads 2,000 subscribers on a
//! local cluster over the shm fabric, runs the standard mix for a second, and every
//! check must pass: the four tables' referential consistency (`txn::tatp::check`), no
//! lock left, every type committed, the protocol's isolation check; the failed lookups
//! must follow the specification's rates where the population fixes them.
//!
//! The Soft-RoCE VM (deploy/vm/verbs-tests.sh) runs only `tatp_on_scythe` from this file,
//! on verbs.

mod common;

fn tatp_on(protocol: &str) {
    let (stdout, s) = common::txn_bench(
        &format!("tatp-{protocol}"),
        &[
            "--workload",
            "tatp",
            "--subscribers",
            "2000",
            "--protocol",
            protocol,
            "--duration",
            "1",
            "--threads",
            "2",
            "--coroutines",
            "8",
        ],
    );
    assert_eq!(s["workload"], "TATP");
    assert_eq!(s["passed"], true, "{stdout}");
    let r = &s["runs"][0];
    let kinds: Vec<&str> = bench::tatp::TxnType::ALL.iter().map(|t| t.name()).collect();
    common::assert_checked_run(r, &kinds, &stdout);
    let check = r["workload_check"].as_str().unwrap();
    assert!(
        check.starts_with("tatp consistency: 2000 subscribers") && check.ends_with(": ok"),
        "{check}"
    );
    let row = |name: &str| {
        r["types"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .unwrap()
            .clone()
    };
    // Lookups that cannot fail never do; GetAccessData finds 1 to 4 of 4 types: 62.5%.
    for t in ["GetSubscriberData", "UpdateLocation"] {
        assert_eq!(row(t)["failed_lookups"], 0, "{t}: {stdout}");
    }
    // Within 4 standard deviations of the binomial (a slow machine commits few).
    let g = row("GetAccessData");
    let n = g["committed"].as_f64().unwrap();
    let rate = g["failed_lookups"].as_f64().unwrap() / n;
    let sd = (0.375f64 * 0.625 / n).sqrt();
    assert!(
        (rate - 0.375).abs() < 4.0 * sd + 0.01,
        "GetAccessData failed {rate} of {n}"
    );
    // A failed update lookup rolls back: a user abort, not a conflict.
    let u = row("InsertCallForwarding");
    assert_eq!(u["failed_lookups"], u["user_aborts"], "{stdout}");
    assert!(stdout.contains("failed lookups (expected): "), "{stdout}");
}

#[test]
fn tatp_on_occ_cas() {
    tatp_on("occ-cas");
}

#[test]
fn tatp_on_scythe() {
    tatp_on("scythe");
}

#[test]
fn tatp_on_mvcc() {
    tatp_on("mvcc");
}

#[test]
fn tatp_on_mvcc_si() {
    tatp_on("mvcc-si");
}

#[test]
fn tatp_on_lotus() {
    tatp_on("lotus");
}

#[test]
fn tatp_on_lotus_si() {
    tatp_on("lotus-si");
}
