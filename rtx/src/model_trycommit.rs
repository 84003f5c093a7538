//! Acceptance test 2: TryCommit idempotence, model-checked. Over one in-memory region,
//! an owner commits tx1 (objects A and B) and then, as the design notes add, its next rTX
//! tx2 (B and C) on the same log slot; repairers whose clocks run 1 s ahead see the
//! owner's locks as expired and repair whatever they meet at A (falsely suspecting a
//! live owner); a later rTX T3 increments A (Opt1), retrying up to three times. Every
//! schedule with at most three preemptions (two with two repairers) is explored. Invariant: every counter equals its
//! initial value plus the committed increments (tx1 once, then T3 and tx2), no lock is
//! left held and the owner's log is DONE. The planted bug, install by WRITE instead of
//! CAS, must be found ("repairer commits tx1, T3 commits, the owner's late install
//! overwrites T3").
//!
//! At three preemptions this model found a lost update in the paper's Opt1 repair (its
//! dptr fence CAS landing after the lock had passed to another rTX); see
//! [`crate::repair`] for the takeover that fixed it.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::rc::Rc;

use crate::error::RtxError;
use crate::lease::{ManualClock, SkewedClock};
use crate::lllock::LockWord;
use crate::log::{Header, LogState};
use crate::model::{explore, Actor, Check, Gated, Sched};
use crate::tests::{client, incr, layout, region, value, T0};
use crate::trycommit::PLANT_INSTALL_BY_WRITE;
use crate::Config;

thread_local! {
    /// What happened across the runs of an exploration, to show the model reaches the
    /// interesting cases (not just that nothing broke).
    static SEEN: RefCell<BTreeSet<String>> = const { RefCell::new(BTreeSet::new()) };
}

fn seen(what: String) {
    SEEN.with(|s| s.borrow_mut().insert(what));
}

#[derive(Debug, Default)]
struct Outcome {
    tx1: bool,
    tx2: bool,
    t3: bool,
}

fn committed(who: &str, r: Result<(), RtxError>) -> bool {
    match r {
        Ok(()) => true,
        Err(RtxError::Aborted(why)) => {
            seen(format!("{who} aborted: {why:?}"));
            false
        }
        Err(e) => panic!("unexpected error {e}"),
    }
}

fn scenario(repairers: usize, owner_next: bool) -> impl Fn(&Rc<Sched>) -> (Vec<Actor>, Check) {
    move |sched| {
        let l = layout();
        let mem = region(&l);
        let clock = ManualClock::new(T0);
        let ahead = SkewedClock {
            inner: clock.clone(),
            skew_ms: 1000,
        };
        let out = Rc::new(RefCell::new(Outcome::default()));
        let mut actors: Vec<Actor> = Vec::new();
        {
            let g = Gated::new(mem.clone(), sched, 0);
            let mut c = client(&l, 0, clock.clone(), Config::default());
            let out = out.clone();
            actors.push(Box::pin(async move {
                let t1 = committed("tx1", incr(&mut c, &g, &l, &[0, 1]).await);
                out.borrow_mut().tx1 = t1;
                if owner_next {
                    let t2 = committed("tx2", incr(&mut c, &g, &l, &[1, 2]).await);
                    out.borrow_mut().tx2 = t2;
                }
            }));
        }
        {
            let g = Gated::new(mem.clone(), sched, 1);
            let mut c = client(&l, 1, ahead.clone(), Config::default());
            let out = out.clone();
            actors.push(Box::pin(async move {
                for _ in 0..3 {
                    if committed("t3", incr(&mut c, &g, &l, &[0]).await) {
                        out.borrow_mut().t3 = true;
                        break;
                    }
                }
            }));
        }
        for k in 0..repairers {
            let id = 2 + k as u16;
            let g = Gated::new(mem.clone(), sched, id as usize);
            let mut c = client(&l, id, ahead.clone(), Config::default());
            actors.push(Box::pin(async move {
                let a = l.obj_addr(0);
                let w = crate::mem::Mem::read_u64(&g, a).await.unwrap();
                if matches!(LockWord::decode(w), LockWord::Locked(_)) {
                    let r = c.repair(&g, a, w).await.unwrap();
                    seen(format!("repair: {r:?}"));
                }
            }));
        }
        let check: Check = Box::new(move || {
            let o = out.borrow();
            let (t1, t2, t3) = (o.tx1 as u64, o.tx2 as u64, o.t3 as u64);
            let want = [10 + t1 + t3, 20 + t1 + t2, 30 + t2];
            let got = [value(&mem, &l, 0), value(&mem, &l, 1), value(&mem, &l, 2)];
            if got != want {
                return Err(format!("counters {got:?}, want {want:?} for {o:?}"));
            }
            for i in 0..l.objects {
                if let LockWord::Locked(s) = LockWord::decode(mem.word(l.obj_addr(i))) {
                    return Err(format!("object {i} left locked by {s:?}"));
                }
            }
            // Never written (tx1 aborted in execution), or DONE.
            let w = mem.word(l.log_addr(0));
            let h = Header::decode(w);
            if w != 0 && h.state != LogState::Done {
                return Err(format!("owner's log left {h:?}"));
            }
            Ok(())
        });
        (actors, check)
    }
}

#[test]
fn try_commit_is_idempotent_under_repairers_and_a_later_writer() {
    SEEN.with(|s| s.borrow_mut().clear());
    let runs = explore(&scenario(1, true), 3)
        .unwrap_or_else(|v| panic!("violation {} under schedule {:?}", v.what, v.schedule));
    eprintln!("{runs} schedules explored");
    assert!(runs > 1000, "explored only {runs} schedules");
    let seen = SEEN.with(|s| s.borrow().clone());
    for case in [
        "tx1 aborted: AbortedByRepairer", // its INIT to DOING CAS lost to a repairer
        "repair: Aborted",
        "repair: Committed", // took a live owner's DOING over
        "repair: Stale",     // the owner's next rTX had reused the log
        "repair: Opt1Replaced",
        "t3 aborted: AbortedByRepairer",
    ] {
        assert!(
            seen.contains(case),
            "no run reached {case:?}; seen {seen:?}"
        );
    }
}

#[test]
fn try_commit_is_idempotent_with_two_repairers() {
    let runs = explore(&scenario(2, false), 2)
        .unwrap_or_else(|v| panic!("violation {} under schedule {:?}", v.what, v.schedule));
    eprintln!("{runs} schedules explored");
    assert!(runs > 1000, "explored only {runs} schedules");
}

#[test]
fn the_model_finds_install_by_write() {
    PLANT_INSTALL_BY_WRITE.with(|p| p.set(true));
    let found = explore(&scenario(1, false), 2);
    PLANT_INSTALL_BY_WRITE.with(|p| p.set(false));
    let v = found.expect_err("the planted bug must be found");
    eprintln!("found: {} under schedule {:?}", v.what, v.schedule);
    assert!(v.what.starts_with("counters"), "{}", v.what);
}
