//! The benchmark binaries' shared command line (`bench::cli`) as a user meets it:
//! `txn-bench`, `rrpc-bench`, `lock-bench`, `tso-bench` and `index-bench` each take
//! `--fabric`, `--model`, `--duration` / `--warmup` with units, `--seed` and `--json`,
//! and their `--json` file is JSON Lines starting with the metadata record, each point's
//! latencies with an HDR histogram that decodes to the record's count; a bad flag value,
//! or a flag value refused before anything runs, exits 2. Each takes `--config FILE.toml`
//! (its long flags as keys, a `[fabric]` table, `[runtime]` and `[server]` tables that
//! reach its clients and servers), and a bad file exits 2.

mod common;

use std::process::{Command, Output};
use std::sync::Mutex;

/// One benchmark at a time: each runs a cluster and spinning threads, and the machine
/// may have two cores.
static SERIAL: Mutex<()> = Mutex::new(());

fn bin(name: &str) -> &'static str {
    match name {
        "txn-bench" => env!("CARGO_BIN_EXE_txn-bench"),
        "rrpc-bench" => env!("CARGO_BIN_EXE_rrpc-bench"),
        "lock-bench" => env!("CARGO_BIN_EXE_lock-bench"),
        "tso-bench" => env!("CARGO_BIN_EXE_tso-bench"),
        "index-bench" => env!("CARGO_BIN_EXE_index-bench"),
        _ => unreachable!("{name}"),
    }
}

fn run(name: &str, args: &[&str]) -> Output {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    Command::new(bin(name))
        .args(args)
        .env_remove("RRPC_FABRIC")
        .env_remove("RRPC_MODEL")
        .output()
        .expect("run the benchmark")
}

/// A short run of each binary on shm without a timing model: (binary, its arguments).
fn short_runs() -> [(&'static str, Vec<&'static str>); 5] {
    [
        (
            "txn-bench",
            vec![
                "--duration",
                "300ms",
                "--threads",
                "1",
                "--coroutines",
                "2",
                "--accounts",
                "1000",
            ],
        ),
        (
            "rrpc-bench",
            vec!["throughput", "--duration", "50ms", "--warmup", "10ms"],
        ),
        (
            "lock-bench",
            vec![
                "single",
                "--duration",
                "100ms",
                "--warmup",
                "10ms",
                "--threads",
                "1",
                "--coroutines",
                "2",
                "--kinds",
                "takeout",
            ],
        ),
        (
            "tso-bench",
            vec![
                "--clients",
                "1",
                "--modes",
                "faa",
                "--duration",
                "50ms",
                "--warmup",
                "10ms",
            ],
        ),
        (
            "index-bench",
            vec![
                "--protocol",
                "optimal",
                "--workload",
                "a,c",
                "--keys",
                "500",
                "--objects",
                "2048",
                "--coroutines",
                "2",
                "--duration",
                "100ms",
                "--warmup",
                "10ms",
            ],
        ),
    ]
}

#[test]
fn every_binary_writes_json_lines_starting_with_the_metadata_record() {
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in short_runs() {
        let json = dir.path().join(format!("{name}.jsonl"));
        let mut a = args.clone();
        a.extend([
            "--fabric", "shm", "--model", "none", "--seed", "7", "--json",
        ]);
        a.push(json.to_str().unwrap());
        let out = run(name, &a);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{name}: {}\n{stdout}\n{stderr}",
            out.status
        );
        let text = std::fs::read_to_string(&json).unwrap();
        let recs = common::json_lines(&text, name);
        let meta = &recs[0];
        assert_eq!(meta["fabric"], "shm", "{meta}");
        assert_eq!(meta["nic"], "shm", "{meta}");
        assert_eq!(meta["model"], "none", "{meta}");
        assert_eq!(meta["seed"], 7, "{meta}");
        assert_eq!(meta["version"], env!("CARGO_PKG_VERSION"), "{meta}");
        assert!(meta["cores"].as_u64().is_some_and(|c| c >= 1), "{meta}");
        for k in ["git_rev", "host", "kernel"] {
            assert!(
                meta[k].as_str().is_some_and(|s| !s.is_empty()),
                "{k}: {meta}"
            );
        }
        assert!(meta["started_unix_ms"].as_u64().is_some(), "{meta}");
        let cmd = meta["command_line"].as_str().unwrap();
        assert!(cmd.contains("--seed 7") && cmd.contains(name), "{cmd}");
        // One record per point (run) as measured, with latency percentiles and the HDR
        // histogram, then the summary.
        let points: Vec<_> = recs[1..recs.len() - 1].iter().collect();
        assert!(!points.is_empty(), "{name}: no point records:\n{text}");
        for p in &points {
            assert!(
                p["record"] == "point" || p["record"] == "run",
                "{name}: {p}"
            );
            common::check_latency_fields(name, p);
        }
        assert_eq!(recs.last().unwrap()["record"], "summary", "{name}");
    }
}

#[test]
fn every_binary_takes_a_config_file_with_a_fabric_table_and_flags_win() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bench.toml");
    std::fs::write(
        &cfg,
        "seed = 7\n[fabric]\nkind = \"shm\"\nmodel = \"none\"\n",
    )
    .unwrap();
    for (name, args) in short_runs() {
        let json = dir.path().join(format!("{name}.jsonl"));
        let mut a = args.clone();
        a.extend(["--config", cfg.to_str().unwrap(), "--seed", "9", "--json"]);
        a.push(json.to_str().unwrap());
        let out = run(name, &a);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: {}\n{stderr}", out.status);
        let text = std::fs::read_to_string(&json).unwrap();
        let meta = &common::json_lines(&text, name)[0];
        assert_eq!(meta["model"], "none", "{name}: the file's [fabric]: {meta}");
        assert_eq!(meta["fabric"], "shm", "{meta}");
        assert_eq!(
            meta["seed"], 9,
            "{name}: the flag wins over the file: {meta}"
        );
    }
}

/// `[server]` reaches the servers a benchmark starts (and, for `txn-bench`, the services
/// it starts as processes): with a ring limit below the clients' default Rocket (64 x
/// 512 B) every connection is refused and the run fails, exit 1, saying so. `[runtime]`
/// reaches the clients (and `txn-bench`'s coordinators and audits): with a Rocket within
/// that limit the same run passes. `index-bench` is left out: its clients use one-sided
/// operations only, which no Rocket carries.
#[test]
fn the_config_files_runtime_and_server_reach_clients_and_servers() {
    let dir = tempfile::tempdir().unwrap();
    let small = dir.path().join("small-ring.toml");
    std::fs::write(&small, "[server]\nmax-ring-bytes = 16384\n").unwrap();
    let both = dir.path().join("small-rocket.toml");
    std::fs::write(
        &both,
        "[runtime]\nrocket = { bucket-size = 512, buckets = 16 }\n\
         [server]\nmax-ring-bytes = 16384\n",
    )
    .unwrap();
    for (name, mut args) in short_runs() {
        if name == "index-bench" {
            continue;
        }
        if name == "tso-bench" {
            // The RPC oracle: its clients call the oracle's server through a Rocket.
            let m = args.iter().position(|a| *a == "faa").unwrap();
            args[m] = "rpc-oracle";
        }
        let with = |cfg: &std::path::Path| {
            let mut a = args.clone();
            a.extend(["--config", cfg.to_str().unwrap()]);
            run(name, &a)
        };
        let out = with(&small);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}, [server] only: {err}");
        assert!(
            err.contains(
                "Rocket ring of 64 buckets x 512 bytes exceeds this server's limit of 16384 bytes"
            ),
            "{name}: the server's limit is the file's: {err}"
        );
        let out = with(&both);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{name}, [runtime] with a 16 x 512 B Rocket: {}\n{err}",
            out.status
        );
    }
}

#[test]
fn a_bad_config_file_exits_2_naming_file_table_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.toml");
    for (name, sub) in [
        ("txn-bench", None),
        ("rrpc-bench", Some("throughput")),
        ("lock-bench", Some("single")),
        ("tso-bench", None),
        ("index-bench", None),
    ] {
        for (text, want) in [
            ("[fabric]\nbogus = 1\n", "[fabric]: `bogus`"),
            ("no-such-key = 1\n", "`no-such-key`"),
            ("[runtime]\nbogus = 5\n", "[runtime]: unknown field `bogus`"),
            ("[server]\nmax-ring-bytes = \"x\"\n", "[server]: "),
            ("seed = \"x\"\n", "'x'"),
        ] {
            std::fs::write(&cfg, text).unwrap();
            let mut a: Vec<&str> = vec!["--config", cfg.to_str().unwrap()];
            a.extend(sub);
            let out = run(name, &a);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{name} {text:?}: {err}");
            assert!(err.contains("bad.toml"), "{name} {text:?}: {err}");
            assert!(err.contains(want), "{name} {text:?}: {err}");
        }
    }
}

#[test]
fn a_bad_flag_value_exits_2_in_every_binary() {
    for (name, sub) in [
        ("txn-bench", None),
        ("rrpc-bench", Some("throughput")),
        ("lock-bench", Some("single")),
        ("tso-bench", None),
        ("index-bench", None),
    ] {
        let with = |extra: &[&str]| {
            let mut a: Vec<&str> = sub.into_iter().collect();
            a.extend(extra);
            run(name, &a)
        };
        // Refused by the parser: the duration's units.
        let out = with(&["--duration", "ten"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains("invalid time \"ten\""), "{name}: {err}");
        // Refused before anything runs: a zero duration, a model on verbs.
        for (bad, want) in [
            (&["--duration", "0"][..], "--duration"),
            (&["--fabric", "verbs", "--model", "cx5"][..], "--model cx5"),
        ] {
            let out = with(bad);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{name} {bad:?}: {err}");
            assert!(err.contains(want), "{name} {bad:?}: {err}");
        }
        // The old spellings still parse (hidden), and clash with the new ones.
        let out = with(&["--duration", "1s", "--duration-ms", "5"]);
        assert_eq!(out.status.code(), Some(2), "{name}");
    }
}

/// `lock-bench queues` (Scythe Table 2, which samples the service's queues) writes one
/// point per theta with the latency fields and a histogram that decodes, as every other
/// experiment does.
#[test]
fn lock_bench_queues_points_carry_the_latency_histogram() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("queues.jsonl");
    let out = run(
        "lock-bench",
        &[
            "queues",
            "--locks",
            "1000",
            "--thetas",
            "0.9,0.99",
            "--samples-per-s",
            "100",
            "--threads",
            "1",
            "--coroutines",
            "4",
            "--duration",
            "1s",
            "--warmup",
            "100ms",
            "--model",
            "none",
            "--json",
            json.to_str().unwrap(),
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\n{stdout}\n{stderr}", out.status);
    let recs = common::json_lines(&std::fs::read_to_string(&json).unwrap(), "lock-bench");
    let points: Vec<_> = recs
        .iter()
        .filter(|r| r["record"] == "point" && r["experiment"] == "queues")
        .collect();
    assert_eq!(points.len(), 2, "{recs:?}");
    for (p, theta) in points.iter().zip([0.9, 0.99]) {
        assert_eq!(p["theta"].as_f64(), Some(theta), "{p}");
        assert!(p["count"].as_u64().is_some_and(|n| n > 0), "{p}");
        common::check_latency_fields("lock-bench queues", p);
    }
}
