//! `loom` model checks of the TSO group's combining ([`tso::group`], Scythe 4.5 (2)) over
//! every interleaving loom explores (preemption bound 3): threads take timestamps through
//! one [`TsoGroup`] whose state lives in a loom `Mutex`, the leader's range request being a
//! loom `AtomicU64` fetch-and-add standing in for the one-sided FAA on the oracle.
//!
//! Checked: every request gets a timestamp, no timestamp is handed out twice, exactly the
//! timestamps taken from the counter are handed out (none lost, none prefetched), and no
//! wake-up is lost: each thread blocks on its request with [`block_on`], which parks the
//! loom thread until its waker is woken, so a follower nobody wakes is a deadlock loom
//! reports.

use std::future::Future;
use std::task::{Context, Poll, Wake, Waker};

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;
use tso::group::{LockFamily, TsoGroup};
use tso::Timestamp;

/// loom's mutex for the group's state.
struct LoomLock;

impl LockFamily for LoomLock {
    type Lock<T: Send> = loom::sync::Mutex<T>;

    fn new<T: Send>(t: T) -> Self::Lock<T> {
        loom::sync::Mutex::new(t)
    }

    fn with<T: Send, R>(lock: &Self::Lock<T>, f: impl FnOnce(&mut T) -> R) -> R {
        f(&mut lock.lock().unwrap())
    }
}

type Group = TsoGroup<&'static str, LoomLock>;

/// Poll `f` on this loom thread, parking (a loom park) until its waker unparks it.
fn block_on<F: Future>(f: F) -> F::Output {
    struct Unpark(thread::Thread);
    impl Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(std::sync::Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        thread::park();
    }
}

/// `rounds` timestamps through `group`, the range taken from `counter` by FAA.
fn take(group: &Group, counter: &AtomicU64, rounds: usize) -> Vec<u64> {
    (0..rounds)
        .map(|_| {
            let t = block_on(group.take(|n| async move {
                Ok(Timestamp(counter.fetch_add(n, Ordering::AcqRel) + 1))
            }));
            t.expect("the range request cannot fail here").get()
        })
        .collect()
}

fn model(threads: usize, rounds: usize) {
    model_limit(threads, rounds, 1)
}

/// [`model`] with up to `limit` range requests in flight at once.
fn model_limit(threads: usize, rounds: usize, limit: usize) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(move || {
        let group = Arc::new(Group::with_limit(limit));
        let counter = Arc::new(AtomicU64::new(0));
        let hs: Vec<_> = (1..threads)
            .map(|_| {
                let (g, c) = (group.clone(), counter.clone());
                thread::spawn(move || take(&g, &c, rounds))
            })
            .collect();
        let mut all = take(&group, &counter, rounds);
        for h in hs {
            all.extend(h.join().unwrap());
        }
        let total = (threads * rounds) as u64;
        all.sort_unstable();
        assert_eq!(
            all,
            (1..=total).collect::<Vec<u64>>(),
            "each request one timestamp, none twice, none skipped"
        );
        assert_eq!(
            counter.load(Ordering::Acquire),
            total,
            "no range prefetched"
        );
        let st = group.stats();
        assert_eq!(st.members, total);
        assert!(st.groups >= 1 && st.groups <= total);
    });
}

#[test]
fn loom_two_threads_two_requests_each() {
    model(2, 2);
}

#[test]
fn loom_three_threads_one_request_each() {
    model(3, 1);
}

#[test]
fn loom_two_ranges_in_flight_three_threads() {
    model_limit(3, 1, 2);
}

#[test]
fn loom_two_ranges_in_flight_two_threads_two_requests_each() {
    model_limit(2, 2, 2);
}

/// Thread `i` asks for `i + 1` consecutive timestamps per request (`take_n`, as a
/// thread-tier leader does for its thread's group): every request gets a contiguous range
/// of its size, ranges never overlap, and together they are exactly what was taken from
/// the counter (none lost, none prefetched).
fn model_counted(threads: usize, rounds: usize) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(move || {
        let group = Arc::new(Group::new());
        let counter = Arc::new(AtomicU64::new(0));
        fn take_ranges(g: &Group, c: &AtomicU64, n: u64, rounds: usize) -> Vec<u64> {
            let mut got = Vec::new();
            for _ in 0..rounds {
                let first = block_on(g.take_n(n, |m| async move {
                    Ok(Timestamp(c.fetch_add(m, Ordering::AcqRel) + 1))
                }))
                .expect("the range request cannot fail here")
                .get();
                got.extend(first..first + n);
            }
            got
        }
        let hs: Vec<_> = (1..threads)
            .map(|i| {
                let (g, c) = (group.clone(), counter.clone());
                thread::spawn(move || take_ranges(&g, &c, i as u64 + 1, rounds))
            })
            .collect();
        let mut all = take_ranges(&group, &counter, 1, rounds);
        for h in hs {
            all.extend(h.join().unwrap());
        }
        let total: u64 = (1..=threads as u64).map(|n| n * rounds as u64).sum();
        all.sort_unstable();
        assert_eq!(
            all,
            (1..=total).collect::<Vec<u64>>(),
            "ranges contiguous, disjoint, none skipped"
        );
        assert_eq!(
            counter.load(Ordering::Acquire),
            total,
            "no range prefetched"
        );
        assert_eq!(group.stats().members, total, "members count timestamps");
    });
}

#[test]
fn loom_counted_requests_two_threads() {
    model_counted(2, 2);
}

#[test]
fn loom_counted_requests_three_threads() {
    model_counted(3, 1);
}
