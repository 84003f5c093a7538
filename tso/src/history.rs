//! Recorded histories of timestamp requests and their linearizability checker (the
//! crate's guarantee, in its docs; Scythe 4.5 asks for "monotonically incrementing timestamps").
//!
//! The oracle's specification is that of a counter: timestamps are unique, and a request
//! that starts after another one finished gets a larger timestamp:
//! `resp(a) < inv(b)  =>  ts(a) < ts(b)`. Concurrent requests may be ordered either way.
//!
//! Clients record each request as an [`Op`]: invoke and response times from
//! [`now_ns`] (`CLOCK_MONOTONIC`, one clock for every process of a host, so histories of
//! several client processes merge) and the timestamp. [`check`] sorts once by timestamp
//! (uniqueness) and once each by invoke and response time, then sweeps the invokes in
//! order while keeping the largest timestamp of the requests that responded strictly
//! before: `O(n log n)`.
//!
//! The checker can fail: its tests feed it duplicates and real-time inversions, and catch
//! a prefetching TSO group leader (`TsoGroup::prefetching`, test builds only).

use serde::{Deserialize, Serialize};

use crate::timestamp::Timestamp;

/// Nanoseconds on `CLOCK_MONOTONIC`: comparable across the processes of one host (not
/// across hosts).
pub fn now_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// One completed timestamp request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    /// Who asked (any id unique among the merged histories' clients).
    pub client: u32,
    /// [`now_ns`] just before the request was issued, nanoseconds.
    pub invoke_ns: u64,
    /// [`now_ns`] just after the timestamp arrived, nanoseconds.
    pub response_ns: u64,
    /// The timestamp received.
    pub ts: Timestamp,
}

/// A history that is not that of a linearizable counter.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    /// Two requests got the same timestamp.
    #[error("timestamp {} handed out twice (clients {} and {})", first.ts, first.client, second.client)]
    Duplicate {
        /// One of them.
        first: Op,
        /// The other.
        second: Op,
    },
    /// `later` started after `earlier` finished but got a timestamp that is not larger.
    #[error(
        "real-time order broken: client {} got {} at {} ns, after client {} had got {} at {} ns",
        later.client, later.ts, later.invoke_ns, earlier.client, earlier.ts, earlier.response_ns
    )]
    RealTime {
        /// The request that finished first.
        earlier: Op,
        /// The request that started after it, with a smaller or equal timestamp.
        later: Op,
    },
    /// A record whose response precedes its invoke (a recording bug).
    #[error("malformed record: response {} ns before invoke {} ns", op.response_ns, op.invoke_ns)]
    Malformed {
        /// The record.
        op: Op,
    },
}

/// Check `ops` (any order) against the counter specification. Returns the number of
/// operations checked, or the first violation found.
///
/// Errors: [`Violation`].
pub fn check(ops: &[Op]) -> Result<usize, Violation> {
    if let Some(op) = ops.iter().find(|o| o.response_ns < o.invoke_ns) {
        return Err(Violation::Malformed { op: *op });
    }
    let mut by_ts: Vec<&Op> = ops.iter().collect();
    by_ts.sort_unstable_by_key(|o| o.ts);
    if let Some(w) = by_ts.windows(2).find(|w| w[0].ts == w[1].ts) {
        return Err(Violation::Duplicate {
            first: *w[0],
            second: *w[1],
        });
    }
    let mut by_resp: Vec<&Op> = ops.iter().collect();
    by_resp.sort_unstable_by_key(|o| o.response_ns);
    let mut by_inv = by_ts;
    by_inv.sort_unstable_by_key(|o| o.invoke_ns);
    let mut done = by_resp.iter().peekable();
    let mut max: Option<&Op> = None;
    for b in by_inv {
        while let Some(a) = done.next_if(|a| a.response_ns < b.invoke_ns) {
            if max.is_none_or(|m| a.ts > m.ts) {
                max = Some(a);
            }
        }
        if let Some(a) = max {
            if a.ts >= b.ts {
                return Err(Violation::RealTime {
                    earlier: *a,
                    later: *b,
                });
            }
        }
    }
    Ok(ops.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::tests::{block_on, with_watchdog};
    use crate::TsoGroup;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    fn op(client: u32, inv: u64, resp: u64, ts: u64) -> Op {
        Op {
            client,
            invoke_ns: inv,
            response_ns: resp,
            ts: Timestamp(ts),
        }
    }

    #[test]
    fn overlapping_requests_may_go_either_way_sequential_ones_may_not() {
        // a and b overlap: any order is fine; c starts after both finished.
        let ok = [op(1, 0, 10, 5), op(2, 5, 15, 4), op(3, 20, 30, 6)];
        assert_eq!(check(&ok), Ok(3));
        assert_eq!(check(&[]), Ok(0));
        let bad = [op(1, 0, 10, 5), op(2, 5, 15, 4), op(3, 20, 30, 3)];
        match check(&bad) {
            Err(Violation::RealTime { earlier, later }) => {
                assert_eq!((earlier.client, later.client), (1, 3));
            }
            r => panic!("{r:?}"),
        }
        // Touching is not "after": resp(a) == inv(b) counts as overlapping.
        assert_eq!(check(&[op(1, 0, 10, 9), op(2, 10, 20, 8)]), Ok(2));
    }

    #[test]
    fn duplicates_and_malformed_records_are_reported() {
        let dup = [op(1, 0, 10, 7), op(2, 50, 60, 7)];
        assert!(matches!(check(&dup), Err(Violation::Duplicate { .. })));
        let concurrent_dup = [op(1, 0, 10, 7), op(2, 0, 10, 7)];
        assert!(matches!(
            check(&concurrent_dup),
            Err(Violation::Duplicate { .. })
        ));
        let m = [op(1, 10, 5, 1)];
        assert!(matches!(check(&m), Err(Violation::Malformed { .. })));
        let msg = check(&dup).unwrap_err().to_string();
        assert!(msg.contains("twice"), "{msg}");
    }

    #[test]
    fn the_clock_is_monotonic() {
        let a = now_ns();
        let b = now_ns();
        assert!(b >= a);
    }

    /// One timestamp through `g`, the range taken by FAA on `counter`, recorded.
    fn recorded(g: &TsoGroup<&'static str>, counter: &AtomicU64, client: u32) -> Op {
        let invoke_ns = now_ns();
        let t = block_on(g.take(|n| async move {
            std::thread::yield_now();
            Ok(Timestamp(counter.fetch_add(n, Ordering::SeqCst) + 1))
        }))
        .unwrap();
        Op {
            client,
            invoke_ns,
            response_ns: now_ns(),
            ts: t,
        }
    }

    #[test]
    fn a_prefetching_leader_is_caught_in_a_plain_sequence() {
        let counter = AtomicU64::new(0);
        let broken = TsoGroup::<&'static str>::prefetching(4);
        let honest = TsoGroup::<&'static str>::new();
        let h = vec![
            recorded(&broken, &counter, 1), // takes 1, caches 2..=5
            recorded(&honest, &counter, 2), // takes 6
            recorded(&broken, &counter, 1), // served 2 from the cache: older than 6
        ];
        assert!(matches!(check(&h), Err(Violation::RealTime { .. })));
    }

    /// Two "processes" (two group instances) of two threads each share one counter; each
    /// thread takes `EACH` timestamps. With both groups honest the merged history passes;
    /// with one prefetching, the checker reports a real-time inversion.
    fn two_groups(prefetch: bool) -> Result<usize, Violation> {
        const EACH: usize = 2000;
        with_watchdog(move || {
            let counter = Arc::new(AtomicU64::new(0));
            let a = Arc::new(if prefetch {
                TsoGroup::prefetching(8)
            } else {
                TsoGroup::new()
            });
            let b = Arc::new(TsoGroup::new());
            let hs: Vec<_> = (0..4u32)
                .map(|client| {
                    let g = if client < 2 { a.clone() } else { b.clone() };
                    let c = counter.clone();
                    std::thread::spawn(move || {
                        (0..EACH)
                            .map(|_| recorded(&g, &c, client))
                            .collect::<Vec<Op>>()
                    })
                })
                .collect();
            let ops: Vec<Op> = hs.into_iter().flat_map(|h| h.join().unwrap()).collect();
            assert_eq!(ops.len(), 4 * EACH);
            check(&ops)
        })
    }

    #[test]
    fn honest_groups_on_many_threads_pass() {
        assert_eq!(two_groups(false), Ok(8000));
    }

    #[test]
    fn a_prefetching_leader_among_many_threads_is_caught() {
        match two_groups(true) {
            Err(Violation::RealTime { earlier, later }) => {
                assert!(
                    later.client < 2,
                    "the prefetching group served stale {later:?} after {earlier:?}"
                );
            }
            r => panic!("the checker missed the prefetching leader: {r:?}"),
        }
    }
}
