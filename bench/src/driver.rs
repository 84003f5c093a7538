//! The coordinator coroutine of `txn-bench`: draws transactions from a workload's
//! [`Profiles`], runs each until it commits or ends by its own logic (a conflict abort
//! is retried after a randomized exponential backoff), and counts what happened in the
//! thread's [`WorkerStats`].
//!
//! The loop is generic over the profiles (static dispatch per transaction); [`Mix`]
//! erases their type once, where a coordinator thread spawns its coroutines.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use txn::coordinator::{AbortReason, TxnError};
use txn::history::{monotonic_ns, AttemptStart};
use txn::phase::PhaseTimes;

use crate::forward::{Inbox, Outcome, FORWARD_HANDLER, FORWARD_WAIT};
use crate::report::WorkerStats;
use crate::workload::{Coroutine, Finished, Mix, Profiles, RunError, Task};

impl<P: Profiles> Mix for P {
    fn coordinator(self: Arc<Self>, co: Coroutine) -> Task {
        Box::pin(coordinate(self, co))
    }

    fn home(self: Arc<Self>, co: Coroutine, inbox: Arc<Inbox>) -> Task {
        Box::pin(serve_home(self, co, inbox))
    }
}

/// How much longer than [`FORWARD_WAIT`] a forwarding call waits for its reply (the
/// home node's answer after its handler gave up, and the way back).
const FORWARD_MARGIN: Duration = Duration::from_secs(1);

/// The coroutine: draw (with `each_type_first`, kind 0, 1, ... first, drawn until the
/// mix gives one of that kind), run until final (or with `--routing forward`, send a
/// read-write transaction whose first record another compute node owns there), count,
/// repeat until `stop`.
async fn coordinate<P: Profiles>(profiles: Arc<P>, co: Coroutine) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(co.seed);
    let mut first = if co.each_type_first {
        0..co.kinds.len()
    } else {
        0..0
    };
    while !co.stop.load(Ordering::Relaxed) {
        let want = first.next();
        let (drawn, kind) = loop {
            let (drawn, kind) = match &co.route {
                Some(r) => {
                    let mut counts = crate::routing::RouteCounts::default();
                    let d = crate::routing::draw_routed(
                        r,
                        &mut counts,
                        || profiles.draw(&mut rng, co.home),
                        |(t, _)| profiles.first_record(t),
                    );
                    let mut s = co.stats.borrow_mut();
                    s.route.redraws += counts.redraws;
                    s.route.misses += counts.misses;
                    d
                }
                None => profiles.draw(&mut rng, co.home),
            };
            if want.is_none_or(|k| k == kind) {
                break (drawn, kind);
            }
        };
        let begin = quanta::Instant::now();
        if let Some(f) = &co.forward {
            let owner = profiles
                .first_record(&drawn)
                .and_then(|(t, k)| f.route.owner(t, k))
                .filter(|&o| o != f.route.node());
            if let Some(owner) = owner {
                forward(&co, owner, kind, &drawn, begin).await;
                continue;
            }
        }
        execute(&*profiles, &co, &mut rng, &drawn, kind, begin).await;
    }
}

/// A home coroutine of `--routing forward`: run the transactions other compute nodes
/// forwarded here ([`Inbox`]), each timed from its arrival, until `stop`; then answer
/// the ones still waiting as not run.
async fn serve_home<P: Profiles>(profiles: Arc<P>, co: Coroutine, inbox: Arc<Inbox>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(co.seed);
    loop {
        let Some(f) = inbox.pop() else {
            if co.stop.load(Ordering::Relaxed) {
                inbox.stop();
                return;
            }
            co.client.ctx().yield_now().await;
            continue;
        };
        match serde_json::from_slice::<(usize, P::Txn)>(&f.input) {
            Ok((kind, t)) if kind < co.kinds.len() => {
                let begin = f.arrived;
                execute(&*profiles, &co, &mut rng, &t, kind, begin).await;
                f.finish(Outcome::Done);
            }
            Ok((kind, _)) => {
                co.stats.borrow_mut().fatal.push(format!(
                    "forwarding: a transaction of unknown kind {kind} arrived"
                ));
                f.finish(Outcome::Failed);
            }
            Err(e) => {
                co.stats.borrow_mut().fatal.push(format!(
                    "forwarding: an input that does not decode arrived: {e}"
                ));
                f.finish(Outcome::Failed);
            }
        }
    }
}

/// Send `drawn` (of `kind`, drawn at `begin`) to compute node `owner`, which runs and
/// counts it; count it here as forwarded, with its latency from generation. A failed
/// call is fatal unless the run is ending.
async fn forward<T: serde::Serialize>(
    co: &Coroutine,
    owner: u32,
    kind: usize,
    drawn: &T,
    begin: quanta::Instant,
) {
    let input = match serde_json::to_vec(&(kind, drawn)) {
        Ok(b) => b,
        Err(e) => {
            co.stats
                .borrow_mut()
                .fatal
                .push(format!("forwarding: encoding a transaction: {e}"));
            co.stop.store(true, Ordering::SeqCst);
            return;
        }
    };
    // The home node answers within FORWARD_WAIT (its handler gives up then): the call
    // waits that long, not the runtime's default deadline, so that a forwarded
    // transaction that retries for a while at a busy home node is not called lost.
    let opts = rrpc::runtime::CallOpts {
        timeout: Some(FORWARD_WAIT + FORWARD_MARGIN),
        ..Default::default()
    };
    let r = co
        .client
        .ctx()
        .call_with(rrpc::NodeId(owner), FORWARD_HANDLER, &input, opts)
        .await;
    let mut s = co.stats.borrow_mut();
    match r
        .map_err(|e| e.to_string())
        .and_then(|b| Outcome::from_byte(*b.first().ok_or("an empty forwarding reply")?))
    {
        Ok(Outcome::Done) => {
            s.forward.count += 1;
            s.forward.bytes += input.len() as u64;
            let _ = s
                .forward
                .hist
                .record((begin.elapsed().as_nanos() as u64).max(1));
        }
        Ok(Outcome::Stopped) => {}
        Ok(Outcome::Failed) | Err(_) if co.stop.load(Ordering::Relaxed) => {}
        Ok(Outcome::Failed) => {
            s.fatal.push(format!(
                "forwarding to compute node {owner}: it could not run the transaction"
            ));
            co.stop.store(true, Ordering::SeqCst);
        }
        Err(e) => {
            s.fatal
                .push(format!("forwarding to compute node {owner}: {e}"));
            co.stop.store(true, Ordering::SeqCst);
        }
    }
}

/// Run `drawn` (of `kind`, timed from `begin`) until it commits or is final, each
/// conflict abort retried after a randomized exponential backoff, and count it.
async fn execute<P: Profiles>(
    profiles: &P,
    co: &Coroutine,
    rng: &mut rand::rngs::StdRng,
    drawn: &P::Txn,
    kind: usize,
    begin: quanta::Instant,
) {
    let mut backoff_us = 1u64;
    // The previous attempt's id (a retry tells the protocol which attempt it
    // follows), and with --breakdown the attempts' phases and the backoff summed.
    let mut prev: Option<u64> = None;
    let mut phases = PhaseTimes::default();
    let mut backoff = Duration::ZERO;
    loop {
        let txn = match prev {
            Some(p) => co.client.begin_retry(kind as u16, p),
            None => co.client.begin_as(kind as u16),
        };
        let id = txn.id();
        if let Some(l) = &co.ledger {
            l.begin(id);
        }
        let start_ns = if co.clock.wall { monotonic_ns() } else { 0 };
        let attempt = std::pin::pin!(profiles.run(txn, drawn));
        let r = StartedAt { attempt, start_ns }.await;
        let committed = matches!(r, Ok(Finished::Committed { .. }));
        if let (true, Some(t)) = (committed, &co.lock_table) {
            t.meter().record_latency(begin.elapsed());
        }
        if let (Some(l), Ok(Finished::Committed { net, .. })) = (&co.ledger, &r) {
            l.committed(id, *net);
        }
        let interval = co.clock.interval(if co.clock.interval_ns > 0 {
            monotonic_ns()
        } else {
            0
        });
        if let Some(p) = co.client.take_phases(id) {
            phases.add(&p);
        }
        // What to do next, decided while the stats are borrowed (never across an
        // await).
        let retry = {
            let mut s = co.stats.borrow_mut();
            if committed {
                if let Some(b) = &mut s.breakdown {
                    b.record(kind, &phases, backoff);
                }
            }
            if let Some(i) = interval {
                s.timeline.count(i, committed);
            }
            record(
                &mut s,
                kind,
                r,
                begin.elapsed(),
                &co.kinds,
                &co.stop,
                &co.committed,
            )
        };
        if !retry {
            break;
        }
        prev = Some(id);
        // Randomized exponential backoff: an object that made us abort is busy for
        // at least a commit's round trips; retrying at once mostly aborts again and
        // steals polling rounds from the holder.
        let slept = quanta::Instant::now();
        if co.max_backoff_us > 0 {
            let d = rng.random_range(0..=backoff_us.min(co.max_backoff_us));
            backoff_us = (backoff_us * 2).min(co.max_backoff_us);
            co.client.ctx().sleep(Duration::from_micros(d)).await;
        } else {
            co.client.ctx().yield_now().await;
        }
        backoff += slept.elapsed();
    }
}

/// An attempt's future, polled with its start marked for the history
/// ([`AttemptStart`]): the coroutines of a thread interleave, so the mark is set around
/// each poll, not once per attempt.
struct StartedAt<'a, F> {
    attempt: Pin<&'a mut F>,
    /// `CLOCK_MONOTONIC` ns; 0 records no wall-clock times.
    start_ns: u64,
}

impl<F: Future> Future for StartedAt<'_, F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        if self.start_ns == 0 {
            return self.attempt.as_mut().poll(cx);
        }
        let _mark = AttemptStart::set(self.start_ns);
        self.attempt.as_mut().poll(cx)
    }
}

/// Count attempt `r` of a transaction of `kind` that began `took` ago, and say whether
/// to retry it: a conflict abort is retried unless `stop` is set (at the end of the run
/// an unfinished transaction has no effect); a commit, a rollback by the transaction's
/// logic and a user abort are final; a service failure or a failed value check is
/// recorded as fatal and sets `stop`.
fn record(
    s: &mut WorkerStats,
    kind: usize,
    r: Result<Finished, RunError>,
    took: Duration,
    kinds: &[&'static str],
    stop: &AtomicBool,
    committed: &AtomicU64,
) -> bool {
    let ts = &mut s.types[kind];
    ts.attempts += 1;
    match r {
        Ok(Finished::Committed {
            net,
            inserted,
            failed_lookup,
        }) => {
            ts.record_commit(took);
            ts.failed_lookups += u64::from(failed_lookup);
            s.net += net;
            s.inserted.extend(inserted);
            committed.fetch_add(1, Ordering::Relaxed);
            false
        }
        Ok(Finished::RolledBack { failed_lookup }) => {
            ts.user_aborts += 1;
            ts.failed_lookups += u64::from(failed_lookup);
            false
        }
        Err(RunError::Txn(TxnError::Abort(AbortReason::User))) => {
            ts.user_aborts += 1;
            false
        }
        Err(RunError::Txn(TxnError::Abort(reason))) => {
            ts.record_abort(reason);
            if let Some(i) = AbortReason::ALL.iter().position(|&x| x == reason) {
                s.abort_reasons[i] += 1;
            }
            !stop.load(Ordering::Relaxed)
        }
        Err(RunError::Txn(e)) => {
            s.fatal.push(format!("{}: {e}", kinds[kind]));
            stop.store(true, Ordering::SeqCst);
            false
        }
        Err(RunError::Check(e)) => {
            s.fatal
                .push(format!("{}: value check failed: {e}", kinds[kind]));
            stop.store(true, Ordering::SeqCst);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KINDS: [&str; 2] = ["read", "update"];

    fn rec(
        s: &mut WorkerStats,
        kind: usize,
        r: Result<Finished, RunError>,
        stop: &AtomicBool,
    ) -> bool {
        let committed = AtomicU64::new(0);
        record(
            s,
            kind,
            r,
            Duration::from_micros(5),
            &KINDS,
            stop,
            &committed,
        )
    }

    #[test]
    fn commits_and_rollbacks_are_final_and_counted() {
        let stop = AtomicBool::new(false);
        let mut s = WorkerStats::with_kinds(2);
        let done = Finished::Committed {
            net: 3,
            inserted: vec![7],
            failed_lookup: true,
        };
        assert!(!rec(&mut s, 1, Ok(done), &stop));
        assert_eq!((s.types[1].commits, s.types[1].failed_lookups), (1, 1));
        assert_eq!((s.net, s.inserted.as_slice()), (3, &[7][..]));
        let mut s = WorkerStats::with_kinds(2);
        let rolled = Finished::RolledBack {
            failed_lookup: false,
        };
        assert!(!rec(&mut s, 0, Ok(rolled), &stop));
        let user = Err(RunError::Txn(TxnError::Abort(AbortReason::User)));
        assert!(!rec(&mut s, 0, user, &stop));
        assert_eq!((s.types[0].user_aborts, s.types[0].attempts), (2, 2));
        assert!(!stop.load(Ordering::Relaxed));
    }

    #[test]
    fn a_conflict_is_retried_until_the_run_stops() {
        let stop = AtomicBool::new(false);
        let mut s = WorkerStats::with_kinds(2);
        let reason = *AbortReason::ALL
            .iter()
            .find(|&&r| r != AbortReason::User)
            .expect("a conflict reason");
        let conflict = || Err(RunError::Txn(TxnError::Abort(reason)));
        assert!(rec(&mut s, 0, conflict(), &stop));
        stop.store(true, Ordering::Relaxed);
        assert!(!rec(&mut s, 0, conflict(), &stop));
        assert_eq!(s.types[0].aborts, 2);
        assert_eq!(s.abort_reasons.iter().sum::<u64>(), 2);
        assert_eq!(s.types[0].commits, 0);
    }

    #[test]
    fn a_failed_value_check_is_fatal_and_stops_the_run() {
        let stop = AtomicBool::new(false);
        let mut s = WorkerStats::with_kinds(2);
        let bad = Err(RunError::Check("key 3: checksum".into()));
        assert!(!rec(&mut s, 1, bad, &stop));
        assert!(stop.load(Ordering::SeqCst));
        assert_eq!(s.fatal, ["update: value check failed: key 3: checksum"]);
    }
}
