//! Criterion benches of the waker-driven executor ([`rrpc::exec`]).
//!
//! - `exec/round/1_of_N`: one round ([`Executor::run_until`] stopped after one round) of
//!   an executor with N live tasks of which 1 is ready: the active task is woken by
//!   `io()` every round (one wake, one queue push, one poll), the other N - 1 wait on a
//!   future that is never woken. With N = 1, 64 and 1024 the times should be about
//!   equal: a round's cost follows the ready tasks, not the live ones (on the 2-core dev
//!   VM, shared with other builds: 76, 89 and 72 ns; the round includes its clock read).
//! - `exec/timer/register_cancel`: a [`Sleep`] polled once (its timer entry inserted)
//!   and dropped (removed), with 1024 other timers pending: the cost a per-call deadline
//!   adds to a call that finishes first (same VM: 76 ns).

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use rrpc::exec::{Executor, Handle, Sleep};

fn round(c: &mut Criterion) {
    let mut g = c.benchmark_group("exec/round");
    for n in [1usize, 64, 1024] {
        let h = Handle::new();
        let mut ex = Executor::new(h);
        let slot: Rc<RefCell<Option<Waker>>> = Rc::default();
        {
            let slot = slot.clone();
            ex.spawn(std::future::poll_fn(move |cx| {
                *slot.borrow_mut() = Some(cx.waker().clone());
                Poll::<()>::Pending
            }));
        }
        for _ in 1..n {
            ex.spawn(std::future::pending());
        }
        let mut io = || {
            if let Some(w) = slot.borrow_mut().take() {
                w.wake();
            }
            true
        };
        // Poll every task once so that only the active one is ready from now on.
        let mut rounds = 0;
        ex.run_until(&mut io, &mut || {
            rounds += 1;
            rounds > 2
        });
        g.bench_function(format!("1_of_{n}"), |b| {
            b.iter(|| {
                let mut first = true;
                ex.run_until(&mut io, &mut || !std::mem::take(&mut first));
            })
        });
    }
    g.finish();
}

fn timer(c: &mut Criterion) {
    let h = Handle::new();
    let mut cx = Context::from_waker(Waker::noop());
    let mut others: Vec<Sleep> = (0..1024)
        .map(|i| h.sleep(Duration::from_secs(3600 + i)))
        .collect();
    for s in &mut others {
        assert!(Pin::new(s).poll(&mut cx).is_pending());
    }
    c.bench_function("exec/timer/register_cancel", |b| {
        b.iter(|| {
            let mut s = h.sleep(Duration::from_secs(1800));
            assert!(Pin::new(&mut s).poll(&mut cx).is_pending());
        })
    });
    assert_eq!(h.timers(), 1024);
}

fn config() -> Criterion {
    Criterion::default()
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_secs(1))
        .sample_size(20)
}

criterion_group! {
    name = benches;
    config = config();
    targets = round, timer
}
criterion_main!(benches);
