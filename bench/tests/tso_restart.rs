//! A SmallBank run survives a restart of its timestamp oracle ("a short `txn-bench`
//! keeps committing across a TSO restart"): the real `txn-bench` starts memnode, lockd
//! and tso as processes over the shm fabric (Scythe, the default protocol, which takes
//! its timestamps from the oracle at commit), SIGKILLs the oracle mid-run,
//! restarts it with the same state directory and address, and every check must pass:
//! commits after the restart, a larger epoch, every coordinator thread on the new
//! incarnation, money conserved, no lock held, a serializable history.

mod common;

use std::process::Command;

#[test]
fn smallbank_keeps_committing_across_a_sigkilled_oracle() {
    let json =
        std::env::temp_dir().join(format!("txn-bench-tso-restart-{}.json", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_txn-bench"))
        .env(
            "RRPC_MODEL",
            std::env::var("RRPC_MODEL").unwrap_or_else(|_| "none".into()),
        )
        .args([
            "--threads",
            "2",
            "--coroutines",
            "4",
            "--accounts",
            "10000",
            "--theta",
            "0.99",
            "--duration",
            "4",
            "--kill-tso-after",
            "1.5",
            "--tso-down-ms",
            "300",
        ])
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run txn-bench");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "txn-bench failed: {}\n{stdout}\n{stderr}",
        out.status
    );
    // JSON Lines: the metadata record, the run's record, the summary.
    let text = std::fs::read_to_string(&json).unwrap();
    let recs = common::json_lines(&text, "txn-bench");
    assert_eq!(recs[1]["record"], "run", "{text}");
    let summary = recs.last().unwrap().clone();
    assert_eq!(summary["record"], "summary", "{text}");
    let _ = std::fs::remove_file(&json);
    assert_eq!(summary["runs"].as_array().unwrap().len(), 1);
    let report = &summary["runs"][0];

    let r = &report["tso_restart"];
    assert!(r.is_object(), "no restart was injected: {stdout}");
    let (before, after) = (
        r["epoch_before"].as_u64().unwrap(),
        r["epoch_after"].as_u64().unwrap(),
    );
    assert_eq!((before, after), (1, 2), "{r}");
    assert!(r["committed_before_ready"].as_u64().unwrap() > 0, "{r}");
    assert!(
        r["committed_after_ready"].as_u64().unwrap() > 0,
        "nothing committed after the restart: {r}\n{stderr}"
    );
    let epochs = r["thread_epochs"].as_array().unwrap();
    assert_eq!(epochs.len(), 2);
    assert!(epochs.iter().all(|e| e.as_u64() == Some(after)), "{r}");
    assert!(stdout.contains("survived"), "{stdout}");

    assert_eq!(report["fatal_errors"], 0, "{stdout}");
    assert_eq!(report["invariant_holds"], true, "{stdout}");
    assert_eq!(report["locks_held"], 0);
    assert_eq!(
        report["final_total"].as_i64().unwrap(),
        report["initial_total"].as_i64().unwrap() + report["net_committed"].as_i64().unwrap()
    );
    assert_eq!(report["serializable"], true, "{stdout}");
    let committed: u64 = report["types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["committed"].as_u64().unwrap())
        .sum();
    assert_eq!(report["checked_committed"].as_u64().unwrap(), committed);
}
