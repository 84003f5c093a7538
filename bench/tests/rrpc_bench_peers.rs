//! End to end: the real `rrpc-bench peers --rounds` over the shm fabric, with short
//! points. Its JSON carries one entry per round with every peer's p50, and the speed
//! groups plus the rounds left out as mixed hold every round. Every peer's point, of the
//! comparison and of each round, carries the full percentile set and its HDR histogram,
//! which decodes to the point's count of round trips. A round count out of range
//! is refused before anything runs. (The figures are the benchmark's business, not this
//! test's.)

mod common;

use std::process::Command;

fn rrpc_bench() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rrpc-bench"));
    c.env("RRPC_FABRIC", "shm").env("RRPC_MODEL", "none");
    c
}

#[test]
fn peers_rounds_reports_every_round_and_groups_them_by_speed() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("peers.json");
    let out = rrpc_bench()
        .args([
            "peers",
            "--rounds",
            "2",
            "--duration",
            "40ms",
            "--warmup",
            "10ms",
        ])
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "rrpc-bench failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("2 matched rounds"), "{stdout}");
    assert!(stdout.contains("rounds by machine speed"), "{stdout}");
    let recs = common::json_lines(&std::fs::read_to_string(&json).unwrap(), "rrpc-bench");
    let points = |experiment: &str| -> Vec<&serde_json::Value> {
        recs.iter()
            .filter(|r| r["record"] == "point" && r["experiment"] == experiment)
            .collect()
    };
    let cmp = points("peers");
    let names: Vec<&str> = cmp.iter().map(|p| p["peer"].as_str().unwrap()).collect();
    assert_eq!(names, ["floor", "fabric", "rrpc", "iceoryx2", "tonic"]);
    let in_rounds = points("peers-rounds");
    assert_eq!(in_rounds.len(), 2 * 5, "{in_rounds:?}");
    for p in cmp.iter().chain(&in_rounds) {
        common::check_latency_fields("rrpc-bench peers", p);
        assert!(p["count"].as_u64().is_some_and(|n| n > 0), "{p}");
        // The peers' own meters count a round trip as they record it; rrpc's driver
        // counts its calls in the same window.
        if p["peer"] != "rrpc" {
            assert_eq!(p["count"], p["round_trips"], "{p}");
        }
    }
    let doc = recs.last().unwrap();
    assert_eq!(doc["record"], "summary");
    let r = &doc["results"]["peers_rounds"];
    let rounds = r["rounds"].as_array().expect("rounds");
    assert_eq!(rounds.len(), 2, "{r}");
    for round in rounds {
        for peer in ["floor", "fabric", "rrpc", "iceoryx2"] {
            assert!(
                round[peer].as_u64().is_some_and(|ns| ns > 0),
                "{peer}: {round}"
            );
        }
    }
    let grouped: u64 = r["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .map(|g| g["rounds"].as_u64().unwrap())
        .sum();
    let mixed = r["mixed_rounds_left_out"].as_u64().expect("mixed count");
    assert_eq!(grouped + mixed, 2, "{r}");
}

#[test]
fn peers_refuses_a_round_count_out_of_range() {
    let out = rrpc_bench()
        .args(["peers", "--rounds", "1001"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--rounds"), "{err}");
    assert_eq!(out.status.code(), Some(2), "a usage error: {err}");
    // Refused by the argument parser: no benchmark header was printed.
    assert!(!String::from_utf8_lossy(&out.stdout).contains("rrpc-bench |"));
}
