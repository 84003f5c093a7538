//! `loom` model checks of the TSO proxy's weighted combining ([`tso::combine`], Scythe
//! 4.5 (3)) over every interleaving loom explores (preemption bound 3): threads take
//! ranges of different sizes through one [`Combiner`] whose state lives in a loom
//! `Mutex`, the leader's FAA being a loom `AtomicU64` fetch-and-add standing in for the
//! one-sided FAA on the oracle.
//!
//! Checked: every request gets its whole range, ranges are disjoint and cover exactly
//! what was taken from the counter (none lost, none prefetched), and no wake-up is lost
//! (a follower nobody wakes parks forever, which loom reports as a deadlock).

use std::future::Future;
use std::task::{Context, Poll, Wake, Waker};

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;
use tso::combine::Combiner;
use tso::group::LockFamily;
use tso::Timestamp;

/// loom's mutex for the combiner's state.
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

type Comb = Combiner<&'static str, LoomLock>;

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

/// One range of `count` per entry of `counts` through `comb`, taken from `counter`.
fn take(comb: &Comb, counter: &AtomicU64, counts: &[u64]) -> Vec<u64> {
    counts
        .iter()
        .flat_map(|&n| {
            let first = block_on(comb.take(n, |total| async move {
                Ok(Timestamp(counter.fetch_add(total, Ordering::AcqRel) + 1))
            }))
            .expect("the FAA cannot fail here")
            .get();
            first..first + n
        })
        .collect()
}

fn model(per_thread: &'static [&'static [u64]]) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(move || {
        let comb = Arc::new(Comb::new());
        let counter = Arc::new(AtomicU64::new(0));
        let hs: Vec<_> = per_thread[1..]
            .iter()
            .map(|&counts| {
                let (c, k) = (comb.clone(), counter.clone());
                thread::spawn(move || take(&c, &k, counts))
            })
            .collect();
        let mut all = take(&comb, &counter, per_thread[0]);
        for h in hs {
            all.extend(h.join().unwrap());
        }
        let total: u64 = per_thread.iter().flat_map(|c| c.iter()).sum();
        all.sort_unstable();
        assert_eq!(
            all,
            (1..=total).collect::<Vec<u64>>(),
            "each request its whole range, none twice, none skipped"
        );
        assert_eq!(
            counter.load(Ordering::Acquire),
            total,
            "no range prefetched"
        );
        let st = comb.stats();
        assert_eq!(st.timestamps, total);
        assert!(st.batches >= 1 && st.batches <= st.requests);
    });
}

#[test]
fn loom_two_threads_two_ranges_each() {
    model(&[&[1, 3], &[2, 1]]);
}

#[test]
fn loom_three_threads_one_range_each() {
    model(&[&[2], &[1], &[3]]);
}
