//! Membership against a real etcd: incarnations, Up and Down events, lease expiry (a dropped
//! member and a SIGKILLed process), the revoke fast path, the durable key/value helper.

#![cfg(feature = "etcd")]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{etcd_or_skip, is_down, is_up, wait_for};
use member::{Event, Member, MemberError, Role};

const CLUSTER: &str = "t";
/// Room for a loaded 2-core machine on top of a lease's TTL; behaviour, not speed, is checked.
const SLACK: Duration = Duration::from_secs(10);

#[test]
fn incarnations_increase_across_join_leave_join() {
    let Some(env) = etcd_or_skip("incarnations_increase_across_join_leave_join") else {
        return;
    };
    let eps = env.endpoints();
    let ttl = Duration::from_secs(1);
    let a = Member::join(&eps, CLUSTER, Role::Cnode, 1, ttl).unwrap();
    assert_eq!(a.incarnation(), 1);
    assert!(a.is_live());
    a.leave().unwrap();
    let b = Member::join(&eps, CLUSTER, Role::Cnode, 1, ttl).unwrap();
    assert_eq!(b.incarnation(), 2);
    drop(b); // A crash: no leave.
    let c = Member::join(&eps, CLUSTER, Role::Cnode, 1, ttl).unwrap();
    assert_eq!(c.incarnation(), 3);
    // Another node counts on its own.
    let d = Member::join(&eps, CLUSTER, Role::Memnode, 2, ttl).unwrap();
    assert_eq!(d.incarnation(), 1);
    // A clean leave is recorded as recovered; a crash is not.
    assert_eq!(d.recovered(1, 1).unwrap().as_deref(), Some("clean leave"));
    assert_eq!(d.recovered(1, 2).unwrap(), None);
    // Once the crashed incarnation's lease has expired, it is the one pending recovery: the
    // clean leave is recovered, the others are live.
    let t0 = Instant::now();
    while d.pending_recoveries().unwrap() != vec![(1, 2)] {
        assert!(t0.elapsed() < ttl + SLACK, "{:?}", d.pending_recoveries());
        std::thread::sleep(Duration::from_millis(100));
    }
    // Another cluster counts on its own too.
    let e = Member::join(&eps, "other", Role::Cnode, 1, ttl).unwrap();
    assert_eq!(e.incarnation(), 1);
}

#[test]
fn members_see_each_others_up() {
    let Some(env) = etcd_or_skip("members_see_each_others_up") else {
        return;
    };
    let eps = env.endpoints();
    let ttl = Duration::from_secs(2);
    let a = Member::join(&eps, CLUSTER, Role::Lockd, 1, ttl).unwrap();
    let rx_a = a.events().unwrap();
    let b = Member::join(&eps, CLUSTER, Role::Tso, 2, ttl).unwrap();
    let rx_b = b.events().unwrap();
    // A subscribed before B joined: the watch brings B's Up. B subscribed after A joined: the
    // snapshot brings A's Up.
    match wait_for(&rx_a, SLACK, |e| is_up(e, 2, 1)) {
        Some(Event::Up(m)) => {
            assert_eq!(m.role, Role::Tso);
            assert_eq!(m.pid, std::process::id());
            assert_eq!(m.lease, b.info().lease);
        }
        other => panic!("A did not see B's Up: {other:?}"),
    }
    assert!(
        wait_for(&rx_b, SLACK, |e| is_up(e, 1, 1)).is_some(),
        "B did not see A's Up"
    );
    let live = a.members().unwrap();
    assert_eq!(live.len(), 2, "{live:?}");
    assert!(live.contains(a.info()) && live.contains(b.info()));
    // A clean leave is a Down too.
    b.leave().unwrap();
    assert!(wait_for(&rx_a, SLACK, |e| is_down(e, 2, 1)).is_some());
    assert_eq!(a.members().unwrap(), vec![a.info().clone()]);
}

#[test]
fn dropped_member_is_down_after_its_ttl() {
    let Some(env) = etcd_or_skip("dropped_member_is_down_after_its_ttl") else {
        return;
    };
    let eps = env.endpoints();
    let a = Member::join(&eps, CLUSTER, Role::Cnode, 1, Duration::from_secs(5)).unwrap();
    let rx = a.events().unwrap();
    let b = Member::join(&eps, CLUSTER, Role::Cnode, 2, Duration::from_millis(400)).unwrap();
    assert_eq!(
        b.lease_ttl(),
        Duration::from_secs(1),
        "400 ms rounds up to etcd's 1 s"
    );
    let info = b.info().clone();
    assert!(wait_for(&rx, SLACK, |e| is_up(e, 2, 1)).is_some());
    // Outlive a few keepalive periods first: the lease is being refreshed.
    std::thread::sleep(Duration::from_secs(2));
    assert!(b.is_live());
    assert_eq!(a.members().unwrap().len(), 2);
    let t0 = Instant::now();
    drop(b); // Stops the keepalive without revoking: the lease must expire.
    match wait_for(&rx, Duration::from_secs(1) + SLACK, |e| is_down(e, 2, 1)) {
        Some(Event::Down(m)) => assert_eq!(m, info, "Down carries the last record"),
        other => panic!("no Down after the lease's TTL: {other:?}"),
    }
    eprintln!("Down {:?} after the drop (TTL 1 s)", t0.elapsed());
    assert_eq!(a.members().unwrap().len(), 1);
}

/// Not a test on its own: the child process of `killed_process_is_down`, which runs this
/// test binary again with MEMBER_CHILD_ENDPOINT set.
#[test]
fn child_member_process() {
    let Some(endpoint) = std::env::var_os("MEMBER_CHILD_ENDPOINT") else {
        return;
    };
    let eps = vec![endpoint.to_string_lossy().into_owned()];
    let m = Member::join(&eps, CLUSTER, Role::Memnode, 7, Duration::from_secs(1)).unwrap();
    println!("CHILD-JOINED {}", m.incarnation());
    // The parent kills us long before this ends; bounded so an orphan goes away by itself.
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn killed_process_is_down() {
    let Some(env) = etcd_or_skip("killed_process_is_down") else {
        return;
    };
    let eps = env.endpoints();
    let a = Member::join(&eps, CLUSTER, Role::Cnode, 1, Duration::from_secs(5)).unwrap();
    let rx = a.events().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_member_process",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("MEMBER_CHILD_ENDPOINT", env.etcd.endpoint())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let incarnation: u64 = loop {
        let line = lines.next().expect("child exited before joining").unwrap();
        // libtest prints "test child_member_process ... " on the same line first.
        if let Some((_, n)) = line.split_once("CHILD-JOINED ") {
            break n.trim().parse().unwrap();
        }
    };
    let pid = match wait_for(&rx, SLACK, |e| is_up(e, 7, incarnation)) {
        Some(Event::Up(m)) => m.pid,
        other => panic!("no Up from the child: {other:?}"),
    };
    assert_eq!(pid, child.id());
    let t0 = Instant::now();
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(
        wait_for(&rx, Duration::from_secs(1) + SLACK, |e| is_down(
            e,
            7,
            incarnation
        ))
        .is_some(),
        "no Down after the child was killed"
    );
    eprintln!("Down {:?} after SIGKILL (TTL 1 s)", t0.elapsed());
}

#[test]
fn revoke_gives_down_at_once() {
    let Some(env) = etcd_or_skip("revoke_gives_down_at_once") else {
        return;
    };
    let eps = env.endpoints();
    let a = Member::join(&eps, CLUSTER, Role::Cnode, 1, Duration::from_secs(60)).unwrap();
    let rx = a.events().unwrap();
    // B's lease would last a minute: a Down well before that is the revocation's.
    let b = Member::join(&eps, CLUSTER, Role::Cnode, 2, Duration::from_secs(60)).unwrap();
    assert!(wait_for(&rx, SLACK, |e| is_up(e, 2, 1)).is_some());
    let t0 = Instant::now();
    assert!(a.revoke(2, 1).unwrap());
    assert!(
        wait_for(&rx, SLACK, |e| is_down(e, 2, 1)).is_some(),
        "no Down after revoke"
    );
    eprintln!("Down {:?} after revoke (TTL 60 s)", t0.elapsed());
    assert!(!a.revoke(2, 1).unwrap(), "already gone");
    assert!(!a.revoke(9, 1).unwrap(), "never there");
    // B was declared dead: its clean leave is refused, and it knows.
    assert!(matches!(b.leave(), Err(MemberError::LeaseLost)));
}

#[test]
fn durable_keys_outlive_their_writer() {
    let Some(env) = etcd_or_skip("durable_keys_outlive_their_writer") else {
        return;
    };
    let eps = env.endpoints();
    let ttl = Duration::from_secs(1);
    let a = Member::join(&eps, CLUSTER, Role::Memnode, 1, ttl).unwrap();
    assert_eq!(a.get("view/p0").unwrap(), None);
    a.put_durable("view/p0", "epoch 3: 1 2 3").unwrap();
    a.leave().unwrap();
    let b = Member::join(&eps, CLUSTER, Role::Memnode, 2, ttl).unwrap();
    assert_eq!(
        b.get("view/p0").unwrap().as_deref(),
        Some(&b"epoch 3: 1 2 3"[..])
    );
}

#[test]
fn durable_keys_and_live_members_survive_a_kill_and_restart_of_etcd() {
    let Some(mut env) = etcd_or_skip("durable_keys_and_live_members_survive_a_kill_and_restart")
    else {
        return;
    };
    let eps = env.endpoints();
    let a = Member::join(&eps, CLUSTER, Role::Memnode, 1, Duration::from_secs(1)).unwrap();
    a.put_durable("view", "epoch 7").unwrap();
    let pid = env.etcd.pid();
    env.etcd.restart(Duration::from_millis(200)).unwrap();
    assert_ne!(env.etcd.pid(), pid, "a new server process");
    assert_eq!(env.endpoints(), eps, "same endpoint");
    // What was acknowledged before the SIGKILL is there, and the member's client
    // reconnects by itself.
    let t0 = Instant::now();
    let got = loop {
        match a.get("view") {
            Ok(v) => break v,
            Err(e) if t0.elapsed() < SLACK => {
                eprintln!("retrying after {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("no answer after the restart: {e}"),
        }
    };
    assert_eq!(got.as_deref(), Some(&b"epoch 7"[..]));
    a.put_durable("view", "epoch 8").unwrap();
    let b = Member::join(&eps, CLUSTER, Role::Memnode, 2, Duration::from_secs(1)).unwrap();
    assert_eq!(b.get("view").unwrap().as_deref(), Some(&b"epoch 8"[..]));
}

#[test]
fn a_key_watch_sees_the_value_then_every_change_across_an_etcd_restart() {
    let Some(mut env) = etcd_or_skip("a_key_watch_sees_the_value_then_every_change") else {
        return;
    };
    let eps = env.endpoints();
    let a = Member::join(
        &eps,
        CLUSTER,
        Role::Other("view".into()),
        1,
        Duration::from_secs(1),
    )
    .unwrap();
    a.put_durable("view", "1").unwrap();
    let w = a.watch_key("view").unwrap();
    let next = || w.recv_timeout(SLACK).expect("a change within the slack");
    assert_eq!(next().as_deref(), Some(&b"1"[..]), "the value now first");
    a.put_durable("view", "2").unwrap();
    assert_eq!(next().as_deref(), Some(&b"2"[..]));
    env.etcd.restart(Duration::from_millis(100)).unwrap();
    // Written after the restart: the reopened watch delivers it, nothing twice.
    let t0 = Instant::now();
    while a.put_durable("view", "3").is_err() {
        assert!(t0.elapsed() < SLACK, "etcd did not come back");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(next().as_deref(), Some(&b"3"[..]));
    assert!(
        w.recv_timeout(Duration::from_millis(300)).is_err(),
        "a change seen twice"
    );
}

#[test]
fn unreachable_etcd_is_a_bounded_error() {
    // No etcd needed: nothing listens on port 1.
    let opts = member::MemberOptions {
        op_timeout: Duration::from_millis(500),
    };
    let t0 = Instant::now();
    let e = Member::join_with(
        &["http://127.0.0.1:1".to_string()],
        CLUSTER,
        Role::Cnode,
        1,
        Duration::from_secs(1),
        &opts,
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            MemberError::Unreachable { .. } | MemberError::Etcd { .. }
        ),
        "{e}"
    );
    eprintln!("join against nothing: {e} after {:?}", t0.elapsed());
    assert!(matches!(
        Member::join(&[], "a/b", Role::Cnode, 1, Duration::from_secs(1)),
        Err(MemberError::InvalidCluster(_))
    ));
}

#[test]
fn revoked_member_learns_it_is_dead() {
    let Some(env) = etcd_or_skip("revoked_member_learns_it_is_dead") else {
        return;
    };
    let eps = env.endpoints();
    let a = Member::join(&eps, CLUSTER, Role::Cnode, 1, Duration::from_secs(3)).unwrap();
    let b = Member::join(&eps, CLUSTER, Role::Cnode, 2, Duration::from_secs(3)).unwrap();
    assert!(b.is_live());
    assert!(a.revoke(2, 1).unwrap()); // A false suspicion, say: B is fenced all the same.
                                      // B's next keepalive (every TTL/3) hears that its lease is gone.
    let t0 = Instant::now();
    while b.is_live() {
        assert!(
            t0.elapsed() < Duration::from_secs(3) + SLACK,
            "B never noticed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // B rejoins with a new incarnation; its old one awaits recovery.
    drop(b);
    let b2 = Member::join(&eps, CLUSTER, Role::Cnode, 2, Duration::from_secs(3)).unwrap();
    assert_eq!(b2.incarnation(), 2);
    assert_eq!(a.pending_recoveries().unwrap(), vec![(2, 1)]);
    // Revoked once its keepalive stream is open (above, the lease went before the first
    // refresh): the refresh answers TTL 0.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(b2.is_live());
    assert!(a.revoke(2, 2).unwrap());
    let t0 = Instant::now();
    while b2.is_live() {
        assert!(
            t0.elapsed() < Duration::from_secs(3) + SLACK,
            "B2 never noticed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(a.pending_recoveries().unwrap(), vec![(2, 1), (2, 2)]);
}
