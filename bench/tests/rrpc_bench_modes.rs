//! End to end: the real `rrpc-bench modes` (Scythe Fig. 10, section 3.4) over the shm
//! fabric with short points, through its default size list. Every size it lists, 1 MiB
//! included, must run inside the server's ring admission limit (each point's Rocket is
//! sized for its replies), and the sweep must end with its `crossover = N B (model M ...)`
//! line and the sentence saying why the crossover lies there. (The figures are the
//! benchmark's business, not this test's.)

mod common;

use std::process::Command;

/// The sizes `rrpc-bench modes` lists by default, as it labels them; each must have a
/// ratio line.
const DEFAULT_SIZES: [&str; 11] = [
    "64B", "128B", "256B", "512B", "1KiB", "2KiB", "4KiB", "16KiB", "64KiB", "256KiB", "1MiB",
];

#[test]
fn modes_runs_every_listed_size_and_prints_the_crossover() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("modes.json");
    let out = Command::new(env!("CARGO_BIN_EXE_rrpc-bench"))
        .env("RRPC_FABRIC", "shm")
        .env("RRPC_MODEL", "none")
        .args([
            "modes",
            "--duration",
            "25ms",
            "--warmup",
            "5ms",
            "--mode-coroutines",
            "2",
        ])
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "rrpc-bench modes failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for size in DEFAULT_SIZES {
        assert!(
            stdout.lines().any(|l| {
                let mut w = l.split_whitespace();
                w.next() == Some(size) && w.next() == Some("ratio")
            }),
            "no ratio line for {size}:\n{stdout}"
        );
    }
    let cross = stdout
        .lines()
        .find(|l| l.starts_with("crossover = "))
        .unwrap_or_else(|| panic!("no crossover line:\n{stdout}"));
    assert!(cross.contains("(model none"), "{cross}");
    assert!(
        stdout.lines().any(|l| l.starts_with("why: ")),
        "no explanation of the crossover:\n{stdout}"
    );
    // JSON Lines: the metadata record, one record per point as measured, the summary.
    let recs = common::json_lines(&std::fs::read_to_string(&json).unwrap(), "rrpc-bench");
    let measured: Vec<_> = recs
        .iter()
        .filter(|r| r["record"] == "point" && r["experiment"] == "modes")
        .collect();
    assert_eq!(measured.len(), 3 * DEFAULT_SIZES.len());
    for p in &measured {
        for k in ["p50_ns", "p90_ns", "p99_ns", "p999_ns", "max_ns", "hdr"] {
            assert!(!p[k].is_null(), "{k}: {p}");
        }
        assert!(p["slice_calls_per_s"].is_array(), "{p}");
    }
    let doc = recs.last().unwrap();
    assert_eq!(doc["record"], "summary");
    let points = doc["results"]["modes"]["points"]
        .as_array()
        .unwrap_or_else(|| panic!("no modes points in {doc}"));
    assert_eq!(points.len(), 3 * DEFAULT_SIZES.len(), "{points:?}");
    assert!(
        points
            .iter()
            .all(|p| p["calls_per_s"].as_f64().is_some_and(|r| r > 0.0)),
        "a point with no calls: {points:?}"
    );
}
