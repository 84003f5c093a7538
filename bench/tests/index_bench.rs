//! The real `index-bench`: YCSB A-E over the rTX B-link tree, by rTX, by Optimal
//! (Sherman's own locking) and by the DTX-style baseline, in one short invocation. Every
//! protocol's tree passes its checks after the workloads (fences, order, the sibling
//! chain equal to what the parents reach, no lock held, every rTX log DONE), and the
//! ratio lines are printed for every workload; its `--json` file is JSON Lines (the
//! metadata record, a `ycsb` point per protocol and workload, the summary). A region too
//! small is refused with the flag that sets it, as a usage error.

mod common;

use std::process::Command;

/// One run at a time: each runs a memory node and busy-polling clients (several
/// processes), and the machine may have two cores; runs side by side starve each other's
/// measured windows.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A short successful run (2,000 keys, 200 ms after 20 ms of warm-up, 4 coroutines) with
/// `extra` flags and `--objects objects`: its stdout, stderr and JSON Lines records.
fn short_run(objects: &str, extra: &[&str]) -> (String, String, Vec<serde_json::Value>) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("index.jsonl");
    let out = Command::new(env!("CARGO_BIN_EXE_index-bench"))
        .args([
            "--keys",
            "2000",
            "--duration",
            "200ms",
            "--warmup",
            "20ms",
            "--objects",
            objects,
            "--coroutines",
            "4",
        ])
        .args(extra)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let recs = common::json_lines(&std::fs::read_to_string(&json).unwrap(), "index-bench");
    (stdout, stderr, recs)
}

/// The factor analysis (rTX 6, Figs. 16-17): `--protocol factors --workload insert` runs
/// every step from Optimal to rTX with Opt2, each tree checked, and prints each step
/// against the one before; the JSON summary holds one `factor` ratio per step after the
/// first. The steps exist for the B-link tree only.
#[test]
fn the_factor_analysis_runs_every_step_and_checks_every_tree() {
    let _one = serial();
    let (stdout, _, recs) = short_run("65536", &["--protocol", "factors", "--workload", "insert"]);
    assert_eq!(stdout.matches(": tree check ok (").count(), 6, "{stdout}");
    assert!(
        stdout.contains("insert-only: factor analysis (each step against the one before)"),
        "{stdout}"
    );
    for step in ["occ", "dtx", "rtx-base", "rtx", "rtx-opt2"] {
        assert!(
            stdout
                .lines()
                .any(|l| l.trim_start().starts_with(&format!("{step} "))
                    && l.contains(": throughput x")),
            "no step {step}: {stdout}"
        );
    }
    let doc = recs.iter().find(|r| r["record"] == "summary").unwrap();
    let factors: Vec<_> = doc["ratios"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["ratio"].as_str().unwrap().starts_with("factor "))
        .collect();
    assert_eq!(factors.len(), 5, "{doc}");
    for f in factors {
        assert!(f["throughput"].as_f64().unwrap() > 0.0, "{f}");
        assert_eq!(f["workload"], "insert-only", "{f}");
    }
    let race = Command::new(env!("CARGO_BIN_EXE_index-bench"))
        .args([
            "--index",
            "race",
            "--protocol",
            "factors",
            "--duration",
            "1s",
        ])
        .output()
        .unwrap();
    assert_eq!(race.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&race.stderr).contains("for --index blink only"),
        "{}",
        String::from_utf8_lossy(&race.stderr)
    );
}

#[test]
fn every_protocol_runs_every_workload_and_its_tree_checks_out() {
    let _one = serial();
    let (stdout, stderr, recs) = short_run("4096", &[]);
    let all = format!("{stdout}{stderr}");
    assert_eq!(all.matches(": tree check ok (").count(), 3, "{all}");
    for w in ["A", "B", "C", "D", "E"] {
        for base in ["optimal", "dtx"] {
            assert!(
                all.contains(&format!("ycsb-{w}: ratio throughput rtx/{base} = ")),
                "ycsb-{w} rtx/{base}: {all}"
            );
        }
    }
    // The JSON holds the same: a point per protocol and workload as it ends, and the
    // summary with every run and the ratios.
    let points: Vec<_> = recs.iter().filter(|r| r["record"] == "point").collect();
    assert_eq!(points.len(), 15, "{recs:?}");
    for p in &points {
        assert_eq!(p["experiment"], "ycsb", "{p}");
        assert_eq!(p["count"], p["ops"], "{p}");
        common::check_latency_fields("index-bench", p);
    }
    let doc = recs.last().unwrap();
    assert_eq!(doc["record"], "summary", "{doc}");
    assert_eq!(doc["runs"].as_array().unwrap().len(), 15, "{doc}");
    assert!(doc["runs"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["ops_per_s"].as_f64().unwrap() > 0.0 && r["p99_us"].as_f64().unwrap() > 0.0));
    assert_eq!(doc["ratios"].as_array().unwrap().len(), 10, "{doc}");
    assert_eq!(doc["tree_checks_passed"], true);
    assert_eq!(doc["loads"].as_array().unwrap().len(), 3, "{doc}");
}

#[test]
fn a_region_too_small_is_refused_with_its_flag() {
    let _one = serial();
    let out = Command::new(env!("CARGO_BIN_EXE_index-bench"))
        // The old millisecond spelling still parses.
        .args(["--objects", "10", "--duration-ms", "10"])
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "a usage error: {stderr}");
    assert!(stderr.contains("--objects 10"), "{stderr}");
    // Refused before anything ran: no header line.
    assert!(!String::from_utf8_lossy(&out.stdout).contains("index-bench |"));
}

/// `--index race`: RACE hashing whose rehash is an rTX, against RACE's own spinlock
/// rehash (Optimal), on the same layout. The load grows the table from 16 subtables by
/// rehashes; each table passes its check (every key once, where its hash puts it, no
/// lock held, every log DONE); ycsb-e is skipped with a note, the DTX baseline and client
/// faults are refused.
#[test]
fn the_race_hash_index_runs_rtx_against_optimal_and_its_tables_check_out() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("race.jsonl");
    let out = Command::new(env!("CARGO_BIN_EXE_index-bench"))
        .args([
            "--index",
            "race",
            "--keys",
            "8000",
            "--objects",
            "4096",
            "--coroutines",
            "4",
            "--duration",
            "200ms",
            "--warmup",
            "20ms",
            "--model",
            "none",
        ])
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("ycsb-e skipped: a hash index has no range scans"),
        "{stdout}"
    );
    assert!(
        stdout.contains("index-bench | RACE hash table |"),
        "{stdout}"
    );
    assert_eq!(stdout.matches(": table check ok (").count(), 2, "{stdout}");
    for w in ["A", "B", "C", "D"] {
        assert!(
            stdout.contains(&format!("ycsb-{w}: ratio throughput rtx/optimal = ")),
            "{w}: {stdout}"
        );
    }
    assert!(!stdout.contains("ycsb-E"), "{stdout}");
    // The load grows the table, so both protocols rehash: each prints its rehashes, and
    // the run compares their times (the rTX paper's 6).
    for p in ["Rtx", "Optimal"] {
        assert!(
            stdout.contains(&format!("  {p}: ")) && stdout.contains(" rehashes (the load's"),
            "{p}: {stdout}"
        );
    }
    assert!(
        stdout.contains("rehash: ratio time original/rtx = "),
        "{stdout}"
    );
    // Records that A's updates replaced are written again once their 100 ms wait has
    // passed, in both protocols.
    for p in ["Rtx", "Optimal"] {
        let line = stdout
            .lines()
            .find(|l| l.contains(&format!("{p} ycsb-A:")))
            .unwrap_or_else(|| panic!("no {p} ycsb-A line: {stdout}"));
        let reused: u64 = line
            .split("records reused ")
            .nth(1)
            .and_then(|t| t.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no records reused in {line}"));
        assert!(reused > 0, "{line}");
    }
    let recs = common::json_lines(&std::fs::read_to_string(&json).unwrap(), "index-bench");
    let doc = recs.last().unwrap();
    assert_eq!(doc["index"], "race", "{doc}");
    assert_eq!(doc["runs"].as_array().unwrap().len(), 8, "{doc}");
    let rehash = doc["ratios"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["ratio"] == "rehash time optimal/rtx")
        .unwrap_or_else(|| panic!("no rehash ratio in {doc}"));
    assert!(rehash["value"].as_f64().unwrap() > 0.0, "{rehash}");
    assert!(rehash["rtx_rehashes"].as_u64().unwrap() > 0, "{rehash}");
    for (extra, want) in [
        (&["--protocol", "dtx"][..], "--index blink only"),
        (
            &[
                "--protocol",
                "rtx",
                "--processes",
                "2",
                "--stop-client-after",
                "100ms",
                "--stop-ms",
                "60",
            ][..],
            "at most 50 ms",
        ),
        (&["--workload", "e"][..], "ycsb-e scans key ranges"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_index-bench"))
            .args(["--index", "race", "--duration", "1s"])
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
        assert!(err.contains(want), "{extra:?}: {err}");
    }
}
