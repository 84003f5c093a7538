//! End to end: Lotus's Fig. 3 premise in one `txn-bench` invocation (`--fig3-premise`:
//! mvcc, then mvcc without its lock CAS) and the UNSAFE variant alone
//! (`--unsafe-no-cas`). The variant's output is labelled UNSAFE, its checks are off and
//! nothing claims they passed; the premise's ratio is printed; other protocols refuse
//! the switch.

mod common;

use common::txn_bench;

const UNSAFE: &str = "UNSAFE: mvcc without lock CAS (Lotus Fig. 3 premise), checks off";

/// Short SmallBank runs under the scaled model.
const SHORT: [&str; 12] = [
    "--model",
    "cx3-scaled",
    "--threads",
    "1",
    "--coroutines",
    "4",
    "--theta",
    "0",
    "--accounts",
    "10000",
    "--duration",
    "1",
];

#[test]
fn fig3_premise_runs_mvcc_and_the_unsafe_variant_side_by_side() {
    let mut a = vec!["--protocol", "mvcc", "--fig3-premise"];
    a.extend_from_slice(&SHORT);
    let (stdout, s) = txn_bench("fig3-premise", &a);
    let runs = s["runs"].as_array().unwrap();
    let names: Vec<&str> = runs
        .iter()
        .map(|r| r["protocol"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["mvcc", "mvcc-nocas"], "{stdout}");
    // The checked run is checked; the variant says UNSAFE and is not judged.
    assert_eq!(runs[0]["invariant_holds"], true, "{stdout}");
    assert!(runs[0]["unsafe_variant"].is_null(), "{stdout}");
    assert_eq!(runs[1]["unsafe_variant"], UNSAFE, "{stdout}");
    assert!(runs[1]["serializability"].is_null(), "no history checked");
    assert_eq!(runs[1]["cvt_locks_held"], 0, "no lock word taken: {stdout}");
    assert!(stdout.contains(&format!("{UNSAFE}\n")), "{stdout}");
    assert!(stdout.contains("checks off (UNSAFE)"), "{stdout}");
    assert!(!stdout.contains("every run passed its checks"), "{stdout}");
    assert!(
        stdout.contains("ratio throughput mvcc-nocas/mvcc = "),
        "{stdout}"
    );
    assert!(stdout.contains("Fig. 3 premise "), "{stdout}");
    let ratios: Vec<&str> = s["ratios"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(ratios, ["throughput mvcc-nocas/mvcc"], "{stdout}");
}

#[test]
fn the_unsafe_variant_alone_is_labelled_and_never_claims_its_checks_passed() {
    let mut a = vec!["--protocol", "mvcc", "--unsafe-no-cas"];
    a.extend_from_slice(&SHORT);
    let (stdout, s) = txn_bench("unsafe-no-cas", &a);
    assert!(stdout.starts_with(UNSAFE), "{stdout}");
    assert!(stdout.contains("check: off (UNSAFE)"), "{stdout}");
    assert!(stdout.contains("checks off (UNSAFE)"), "{stdout}");
    for claim in ["invariant holds", "passed its checks", "acyclic"] {
        assert!(!stdout.contains(claim), "{claim:?} in {stdout}");
    }
    let r = &s["runs"][0];
    assert_eq!(r["protocol"], "mvcc-nocas");
    assert_eq!(r["unsafe_variant"], UNSAFE);
    assert!(r["serializable"].is_null());
}

#[test]
fn protocols_other_than_mvcc_refuse_the_switch() {
    for (p, flag) in [
        ("occ-cas", "--unsafe-no-cas"),
        ("all", "--fig3-premise"),
        ("scythe", "--fig3-premise"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_txn-bench"))
            .args(["--protocol", p, flag, "--duration", "1"])
            .output()
            .expect("run txn-bench");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{p} {flag}: {stderr}");
        assert!(stderr.contains("need --protocol mvcc"), "{stderr}");
    }
}
