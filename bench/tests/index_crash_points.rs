//! `index-bench` faulted at a chosen step of a structure change, for real (Transactional
//! Indexes on Disaggregated Memory with Repairable Transaction, 4.3; the acceptance tests
//! of kill -9 inside a B-link split and a rehash, and of a false suspicion with a planted
//! naive repair). Client process 0 kills itself (SIGKILL) or stops itself (SIGSTOP) when
//! its first split (or rehash) reaches `log-written`, `locked`, `in-doing` or `installed`;
//! the other process repairs the change as it meets its locks, and afterwards index-bench
//! checks every acknowledged key found exactly once, keys ordered, every leaf reachable
//! through the sibling chain and the parents, no lock held and every log DONE, and that the
//! killed split's own insert is there exactly when its log had reached DOING. (A split
//! killed with only its log written holds no lock, so no one meets it: the restart of the
//! dead client's IDs after the run settles its INIT log, as the protocol has it.)
//!
//! These flags exist only in fault-injection builds: the index-bench that `cargo test`
//! builds has them (bench's dev-dependencies enable rtx's feature `fault-injection`).

use std::process::{Command, Output};

/// One run at a time: each runs a memory node and busy-polling client processes, and the
/// machine may have two cores.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// index-bench with two client processes of 4 clients on a small index, running
/// `workload` (one that inserts) for about a second, plus `extra`.
fn index_bench(index: &str, keys: &str, duration: &str, extra: &[&str]) -> Output {
    index_bench_of("rtx", index, keys, duration, extra)
}

/// [`index_bench`] of `protocol`.
fn index_bench_of(
    protocol: &str,
    index: &str,
    keys: &str,
    duration: &str,
    extra: &[&str],
) -> Output {
    Command::new(env!("CARGO_BIN_EXE_index-bench"))
        .args([
            "--protocol",
            protocol,
            "--index",
            index,
            "--workload",
            "d",
            "--keys",
            keys,
            "--objects",
            "4096",
            "--coroutines",
            "4",
            "--processes",
            "2",
            "--duration",
            duration,
            "--warmup",
            "100ms",
            "--model",
            "none",
        ])
        .args(extra)
        .output()
        .unwrap()
}

/// The survivors' repairs in the ycsb-D line.
fn repairs(stdout: &str) -> u64 {
    stdout
        .lines()
        .find(|l| l.contains("Rtx ycsb-D:"))
        .and_then(|l| l.split("repairs ").nth(1))
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no repairs count in {stdout}"))
}

/// Kill client process 0 at `point` of its first B-link split: the run passes every
/// check, the split's own insert is committed by repair iff it had reached DOING, and
/// when the dead split held locks, the surviving process repaired some.
fn killed_in_split(point: &str) {
    let _one = serial();
    let at = format!("split:{point}");
    let out = index_bench("blink", "300", "1s", &["--crash-at", &at]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!(
            "killed itself (SIGKILL) at {at} of its first split"
        )),
        "{stdout}"
    );
    let committed = matches!(point, "in-doing" | "installed");
    let want = if committed {
        "of the inserts killed at the crash point 1 committed and 0 aborted by repair"
    } else {
        "of the inserts killed at the crash point 0 committed and 1 aborted by repair"
    };
    assert!(stdout.contains(want), "{stdout}");
    assert!(stdout.contains("Rtx: tree check ok ("), "{stdout}");
    if point != "log-written" {
        // The split locked its leaf and parent: the other process met them and repaired.
        assert!(repairs(&stdout) >= 1, "{stdout}");
    }
}

#[test]
fn a_client_killed_after_its_splits_log_is_written_is_settled_by_its_restart() {
    killed_in_split("log-written");
}

#[test]
fn a_client_killed_with_its_split_locked_is_aborted_by_the_others() {
    killed_in_split("locked");
}

#[test]
fn a_client_killed_with_its_split_in_doing_is_committed_by_the_others() {
    killed_in_split("in-doing");
}

#[test]
fn a_client_killed_after_installing_its_split_is_finished_by_the_others() {
    killed_in_split("installed");
}

/// Kill client process 0 at `point` of its first RACE rehash: the run passes every check
/// (each acknowledged key once, in the subtable and buckets its hash selects, the
/// directory consistent, no lock held, every log DONE). 4000 keys fill the table close
/// enough that the workload's inserts rehash early; 2 s leave a slow machine room.
fn killed_in_rehash(point: &str) {
    let _one = serial();
    let at = format!("rehash:{point}");
    let out = index_bench("race", "4000", "2s", &["--crash-at", &at]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!(
            "killed itself (SIGKILL) at {at} of its first rehash"
        )),
        "{stdout}"
    );
    assert!(stdout.contains("Rtx: table check ok ("), "{stdout}");
    // The recovery is printed (the bound is the run's progress check: a second without
    // an operation of the survivors fails the run).
    assert!(
        stdout.contains("ms at most (the recovery)"),
        "no recovery figure: {stdout}"
    );
}

/// The planted bug of the killed rehash (rTX paper, 6; its point of comparison): RACE's
/// original rehash under plain spinlocks (`--protocol optimal`), killed holding them. The
/// other process's clients wait for those locks for good, its throughput drops to 0, and
/// the run's progress check (a second without an operation of the survivors) fails it,
/// where rTX's rehash killed at the same step is repaired (the tests above).
#[test]
fn a_rehash_killed_holding_plain_spinlocks_stops_the_others_and_fails_the_progress_check() {
    let _one = serial();
    let out = index_bench_of(
        "optimal",
        "race",
        "4000",
        "2s",
        &["--crash-at", "rehash:locked"],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the stall went unnoticed: {stdout}\n{stderr}"
    );
    assert!(
        stderr.contains("no progress: the other 1 client processes completed no operation"),
        "failed otherwise than by the progress check: {stdout}\n{stderr}"
    );
    assert!(
        stderr.contains("killed itself (SIGKILL) at rehash:locked of its first rehash (lock owner"),
        "the error does not name the fault: {stderr}"
    );
}

#[test]
fn a_client_killed_after_its_rehash_log_is_written_is_repaired() {
    killed_in_rehash("log-written");
}

#[test]
fn a_client_killed_with_its_rehash_locked_is_aborted_by_the_others() {
    killed_in_rehash("locked");
}

#[test]
fn a_client_killed_with_its_rehash_in_doing_is_committed_by_the_others() {
    killed_in_rehash("in-doing");
}

#[test]
fn a_client_killed_after_installing_its_rehash_is_finished_by_the_others() {
    killed_in_rehash("installed");
}

/// The planted bug of the kill test (repair ignores DOING): the dead split's locks stay
/// held, and the other process's operations on them give up; the run fails naming it.
#[test]
fn a_repair_that_ignores_doing_leaves_the_dead_split_locked_and_the_run_fails() {
    let _one = serial();
    let out = index_bench(
        "blink",
        "300",
        "1s",
        &["--crash-at", "split:in-doing", "--plant", "ignore-doing"],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    // Either the survivors' operations on the dead split's leaf give up, or, first, a
    // second passes in which they complete none (the run's progress check).
    assert!(
        (stderr.contains("gave up after") && stderr.contains("client process 1 failed"))
            || stderr.contains("no progress: the other 1 client processes"),
        "{stdout}\n{stderr}"
    );
}

/// A false suspicion at a chosen step: client process 0 stops itself with its first
/// split in DOING, stays stopped 300 ms (many leases), and is continued; it finishes its
/// commit and runs no new operation. Returns stdout and stderr.
fn paused_in_doing(plant: Option<&str>) -> (Output, String, String) {
    let mut extra = vec!["--pause-at", "split:in-doing", "--stop-ms", "300"];
    if let Some(p) = plant {
        extra.extend(["--plant", p]);
    }
    let out = index_bench("blink", "300", "1s", &extra);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        stdout.contains("stopped itself (SIGSTOP) at split:in-doing of its first split")
            && stdout.contains("continued 300 ms later"),
        "{stdout}\n{stderr}"
    );
    (out, stdout, stderr)
}

/// Without a plant the other process repairs the stopped client's split (TryCommit run
/// twice: by the repairer, then by the owner as a no-op) and every check holds.
#[test]
fn a_client_stopped_in_doing_is_repaired_by_the_others_and_every_check_holds() {
    let _one = serial();
    let (out, stdout, stderr) = paused_in_doing(None);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("Rtx: tree check ok ("), "{stdout}");
    assert!(repairs(&stdout) >= 1, "{stdout}");
}

/// With the planted naive repair (release a DOING rTX's locks without TryCommit) the
/// other process changes the stopped split's nodes while it sleeps; the stopped client's
/// late installs then land on some and not others, and the run fails naming the broken
/// check (here: the stopped client's acknowledged insert is lost; a broken structure, or
/// an operation on it that can no longer finish, are named as well).
#[test]
fn a_naive_repair_of_a_client_stopped_in_doing_breaks_the_checks() {
    let _one = serial();
    let (out, stdout, stderr) = paused_in_doing(Some("naive-repair"));
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    let named = [
        "acknowledged inserts are not in the tree",
        "tree invariant broken",
        "keys that no client inserted",
        "gave up after",
    ];
    assert!(
        named.iter().any(|n| stderr.contains(n)),
        "failed without naming a check: {stdout}\n{stderr}"
    );
}

#[test]
fn fault_points_without_their_preconditions_are_usage_errors() {
    let _one = serial();
    for (extra, want) in [
        (
            &["--crash-at", "split:locked"][..],
            "needs --processes 2 or more",
        ),
        (
            &["--processes", "2", "--crash-at", "rehash:locked"][..],
            "a B-link tree does not rehash",
        ),
        (
            &["--processes", "2", "--crash-at", "split:late"][..],
            "the point is one of",
        ),
        (
            &[
                "--processes",
                "2",
                "--workload",
                "a",
                "--crash-at",
                "split:locked",
            ][..],
            "give a workload that inserts",
        ),
        (
            &[
                "--processes",
                "2",
                "--crash-at",
                "split:locked",
                "--kill-client-after",
                "100ms",
            ][..],
            "one fault per run",
        ),
        (
            &[
                "--processes",
                "2",
                "--index",
                "race",
                "--workload",
                "d",
                "--pause-at",
                "rehash:locked",
                "--stop-ms",
                "200",
            ][..],
            "at most 50 ms",
        ),
        (
            &[
                "--protocol",
                "optimal",
                "--processes",
                "2",
                "--index",
                "race",
                "--workload",
                "d",
                "--crash-at",
                "rehash:in-doing",
            ][..],
            "its one point is rehash:locked",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_index-bench"))
            .args(if extra.contains(&"--protocol") {
                &["--duration", "1s"][..]
            } else {
                &["--protocol", "rtx", "--duration", "1s"][..]
            })
            .args(extra)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {stderr}");
        assert!(stderr.contains(want), "{extra:?}: {stderr}");
    }
}
