//! Recovery coordination against a real etcd: one claimant wins, a claim dies with its
//! claimant's lease, a restarted node waits for its earlier incarnation's recovery.

#![cfg(feature = "etcd")]

mod common;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::{etcd_or_skip, is_down, wait_for};
use member::{Member, MemberError, Role};

const CLUSTER: &str = "r";
const SLACK: Duration = Duration::from_secs(10);

/// Joins `node` and makes that incarnation dead at once (a survivor revokes it).
fn dead_incarnation(eps: &[String], survivor: &Member, node: u16) -> u64 {
    let rx = survivor.events().unwrap();
    let victim = Member::join(eps, CLUSTER, Role::Cnode, node, Duration::from_secs(30)).unwrap();
    let inc = victim.incarnation();
    // Still live: nobody may recover it.
    assert!(matches!(
        survivor.claim_recovery(node, inc),
        Err(MemberError::StillLive { .. })
    ));
    assert!(survivor.revoke(node, inc).unwrap());
    assert!(wait_for(&rx, SLACK, |e| is_down(e, node, inc)).is_some());
    drop(victim);
    inc
}

#[test]
fn claim_recovery_is_won_by_exactly_one() {
    let Some(env) = etcd_or_skip("claim_recovery_is_won_by_exactly_one") else {
        return;
    };
    let eps = env.endpoints();
    let ttl = Duration::from_secs(5);
    let a = Member::join(&eps, CLUSTER, Role::Cnode, 1, ttl).unwrap();
    let b = Member::join(&eps, CLUSTER, Role::Cnode, 2, ttl).unwrap();
    let inc = dead_incarnation(&eps, &a, 9);
    let start = Arc::new(Barrier::new(2));
    let won: Vec<bool> = std::thread::scope(|s| {
        let claims: Vec<_> = [&a, &b]
            .into_iter()
            .map(|m| {
                let start = start.clone();
                s.spawn(move || {
                    start.wait();
                    m.claim_recovery(9, inc).unwrap()
                })
            })
            .collect();
        claims.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(won.iter().filter(|w| **w).count(), 1, "{won:?}");
    let (winner, loser) = if won[0] { (&a, &b) } else { (&b, &a) };
    // Asking again: the winner still holds it, the loser still does not.
    assert!(winner.claim_recovery(9, inc).unwrap());
    assert!(!loser.claim_recovery(9, inc).unwrap());
    assert!(matches!(
        loser.finish_recovery(9, inc, "not mine"),
        Err(MemberError::NotClaimant { .. })
    ));
    winner
        .finish_recovery(9, inc, "rolled forward 2, back 1")
        .unwrap();
    assert_eq!(
        loser.recovered(9, inc).unwrap().as_deref(),
        Some("rolled forward 2, back 1")
    );
    // Recovered: no one claims it again.
    assert!(!loser.claim_recovery(9, inc).unwrap());
    assert!(!winner.claim_recovery(9, inc).unwrap());
}

#[test]
fn claim_disappears_with_the_claimers_lease() {
    let Some(env) = etcd_or_skip("claim_disappears_with_the_claimers_lease") else {
        return;
    };
    let eps = env.endpoints();
    let a = Member::join(&eps, CLUSTER, Role::Cnode, 1, Duration::from_secs(1)).unwrap();
    let b = Member::join(&eps, CLUSTER, Role::Cnode, 2, Duration::from_secs(5)).unwrap();
    let inc = dead_incarnation(&eps, &b, 9);
    assert_eq!(b.pending_recoveries().unwrap(), vec![(9, inc)]);
    assert!(a.claim_recovery(9, inc).unwrap());
    assert!(!b.claim_recovery(9, inc).unwrap());
    assert_eq!(
        b.pending_recoveries().unwrap(),
        vec![],
        "claimed is not pending"
    );
    let t0 = Instant::now();
    drop(a); // The recoverer dies mid-recovery: its lease expires and takes the claim.
             // The survivor that lost the race finds the claim free again (and the claimer dead too).
    loop {
        if b.pending_recoveries().unwrap() == vec![(1, 1), (9, inc)] {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(1) + SLACK,
            "the dead claimer's claim did not go"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "claim free {:?} after the claimer's drop (TTL 1 s)",
        t0.elapsed()
    );
    assert!(b.claim_recovery(9, inc).unwrap());
    b.finish_recovery(9, inc, "done by the second").unwrap();
    assert!(b.claim_recovery(1, 1).unwrap());
    b.finish_recovery(1, 1, "the claimer, recovered").unwrap();
    assert_eq!(b.pending_recoveries().unwrap(), vec![]);
}

#[test]
fn wait_recovered_returns_after_finish_recovery() {
    let Some(env) = etcd_or_skip("wait_recovered_returns_after_finish_recovery") else {
        return;
    };
    let eps = env.endpoints();
    let a = Member::join(&eps, CLUSTER, Role::Cnode, 1, Duration::from_secs(5)).unwrap();
    let inc = dead_incarnation(&eps, &a, 4);
    assert!(a.claim_recovery(4, inc).unwrap());
    // The dead node restarts with a larger incarnation and waits for the old one.
    let restarted = Member::join(&eps, CLUSTER, Role::Cnode, 4, Duration::from_secs(5)).unwrap();
    assert!(restarted.incarnation() > inc);
    assert_eq!(
        restarted
            .wait_recovered(4, inc, Duration::from_millis(300))
            .unwrap(),
        None,
        "not recovered yet: the wait times out"
    );
    let summary = std::thread::scope(|s| {
        let waiter = s.spawn(|| restarted.wait_recovered(4, inc, SLACK));
        std::thread::sleep(Duration::from_millis(300));
        a.finish_recovery(4, inc, "swept 3 locks").unwrap();
        waiter.join().unwrap()
    });
    assert_eq!(summary.unwrap().as_deref(), Some("swept 3 locks"));
    // Already recovered: returns at once.
    assert_eq!(
        restarted.wait_recovered(4, inc, SLACK).unwrap().as_deref(),
        Some("swept 3 locks")
    );
}
