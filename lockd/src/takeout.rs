//! The Takeout Lock as a plain state machine, without any fabric (Scythe,
//! Scythe section 4.3, Fig. 13 and Fig. 14).
//!
//! A Takeout Lock is a ticket lock split between the lock service and its clients:
//!
//! - `lower` (next ticket) is advanced only by the lock service's CPU, in the Lock RPC
//!   ([`lock_rpc`]);
//! - `upper` (now serving) is advanced only by the holder, with a one-sided RDMA
//!   fetch-and-add of +1 on unlock;
//! - `queued_ts` (largest queued timestamp) is written only by the lock service's CPU.
//!
//! Each is its own 8-byte word, following the rule for shared words: a word
//! modified by RDMA atomics (`upper`) is never modified by CPU atomics, because most
//! RNICs only guarantee atomicity of RDMA atomics among themselves. The paper packs
//! `lower` and `upper` into 16-bit halves of one word; this layout does not.
//!
//! `lower - upper` is the number of transactions queued on the lock (Equation 1), the
//! object's *heat*. A waiting client sleeps for a *Hangout* of (tickets ahead) x (smoothed
//! RTT) before each one-sided READ of `upper` (Equations 2 and 3).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Bytes per lock in the lock table: three 8-byte words and 8 bytes of padding.
pub const LOCK_STRIDE: u64 = 32;
/// Byte offset of `lower` (next ticket; written by the lock service's CPU) in a lock.
pub const LOWER_OFF: u64 = 0;
/// Byte offset of `upper` (now serving; written by the holder's RDMA FAA) in a lock.
pub const UPPER_OFF: u64 = 8;
/// Byte offset of `queued_ts` (largest queued timestamp; lock service's CPU) in a lock.
pub const QUEUED_TS_OFF: u64 = 16;

/// The in-memory layout of one lock, for documentation and layout checks. The service
/// accesses the words through [`AtomicU64`]s on its MR; clients through one-sided ops.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TakeoutWords {
    /// Next ticket to hand out.
    pub lower: u64,
    /// Ticket now holding the lock.
    pub upper: u64,
    /// Largest timestamp that took a ticket.
    pub queued_ts: u64,
    /// Padding to [`LOCK_STRIDE`].
    pub pad: u64,
}

const _: () = {
    assert!(std::mem::size_of::<TakeoutWords>() == LOCK_STRIDE as usize);
    assert!(std::mem::align_of::<TakeoutWords>() == 8);
    assert!(std::mem::offset_of!(TakeoutWords, lower) == LOWER_OFF as usize);
    assert!(std::mem::offset_of!(TakeoutWords, upper) == UPPER_OFF as usize);
    assert!(std::mem::offset_of!(TakeoutWords, queued_ts) == QUEUED_TS_OFF as usize);
};

/// The heat mode a transaction locks in (Scythe 4.2, 4.3): OCC transactions lock cold,
/// TOCC transactions lock hot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Low-heat mode (OCC): refused when more than [`Watermarks::cold`] are queued.
    Cold,
    /// High-heat mode (TOCC): refused when more than [`Watermarks::hot`] are queued.
    Hot,
}

/// Queue-length thresholds of the Lock RPC (Scythe 4.3, "heat awareness").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Watermarks {
    /// ColdWatermark: a cold-mode request is refused when more than this many tickets
    /// are queued (default 3).
    pub cold: u64,
    /// HotWatermark: any request is refused when more than this many tickets are
    /// queued (default 10).
    pub hot: u64,
}

impl Default for Watermarks {
    fn default() -> Self {
        Self { cold: 3, hot: 10 }
    }
}

impl Watermarks {
    /// Check `cold <= hot`.
    pub fn validate(&self) -> Result<(), String> {
        if self.cold > self.hot {
            return Err(format!(
                "cold watermark {} exceeds hot watermark {}",
                self.cold, self.hot
            ));
        }
        Ok(())
    }
}

/// Why a Lock RPC refused to hand out a ticket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RefuseReason {
    /// The request's timestamp is older than the lock's `queued_ts` (Fig. 14, line 5).
    Timestamp,
    /// Cold mode and more than [`Watermarks::cold`] tickets queued.
    ColdWatermark,
    /// More than [`Watermarks::hot`] tickets queued.
    HotWatermark,
}

/// The answer of a Lock RPC for one lock (Fig. 14's `Lock_Reply`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockReply {
    /// True when the request took a ticket (it is queued, possibly already holding).
    pub granted_queue: bool,
    /// Why the request was refused; `None` exactly when `granted_queue`.
    pub reason: Option<RefuseReason>,
    /// `lower` before this request: the ticket taken, or (refused) the next ticket.
    pub ticket: u64,
    /// `upper` as the service saw it.
    pub upper: u64,
    /// `queued_ts` before this request (timestamp units of the TSO).
    pub queued_ts: u64,
}

impl LockReply {
    /// Tickets ahead of ours (`ticket - upper`, wrapping): the object's heat, Equation 1.
    /// For a refusal it is the queue length the service saw.
    pub fn ahead(&self) -> u64 {
        self.ticket.wrapping_sub(self.upper)
    }

    /// Whether the ticket was taken and is already being served (no wait needed).
    pub fn holds_now(&self) -> bool {
        self.granted_queue && self.ticket == self.upper
    }
}

/// The Lock RPC body (Fig. 14, server lines 3-13) on one lock's words.
///
/// `ts` is the transaction's start timestamp. Let `queued = lower - upper` (wrapping).
/// Refuses, changing nothing, when `ts < queued_ts` ([`RefuseReason::Timestamp`]), when
/// `mode` is [`Mode::Cold`] and `queued > wm.cold` ([`RefuseReason::ColdWatermark`]), or
/// when `queued > wm.hot` ([`RefuseReason::HotWatermark`]), checked in that order.
/// Otherwise takes ticket `lower`, sets `queued_ts = ts` and advances `lower` by one.
///
/// The caller must serialize CPU callers on the same lock (the service's striped
/// mutexes); `upper` is only read here, as remote holders FAA it concurrently.
pub fn lock_rpc(
    lower: &AtomicU64,
    upper: &AtomicU64,
    queued_ts: &AtomicU64,
    ts: u64,
    mode: Mode,
    wm: Watermarks,
) -> LockReply {
    // `lower` first: it only moves under the caller's mutex, and `upper <= lower` always,
    // so an `upper` read afterwards never passes it.
    let lo = lower.load(Ordering::Acquire);
    let up = upper.load(Ordering::Acquire);
    let qts = queued_ts.load(Ordering::Acquire);
    let queued = lo.wrapping_sub(up);
    let reason = if ts < qts {
        Some(RefuseReason::Timestamp)
    } else if mode == Mode::Cold && queued > wm.cold {
        Some(RefuseReason::ColdWatermark)
    } else if queued > wm.hot {
        Some(RefuseReason::HotWatermark)
    } else {
        None
    };
    if reason.is_none() {
        queued_ts.store(ts, Ordering::Release);
        lower.store(lo.wrapping_add(1), Ordering::Release);
    }
    LockReply {
        granted_queue: reason.is_none(),
        reason,
        ticket: lo,
        upper: up,
        queued_ts: qts,
    }
}

/// Smoothed round-trip time, Equation 2 of Scythe 4.3 (TCP's SRTT):
/// `T = alpha * T + (1 - alpha) * sample`; the first sample initializes `T`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SmoothedRtt {
    alpha: f64,
    /// Current estimate in nanoseconds; `None` before the first sample.
    srtt_ns: Option<f64>,
}

impl Default for SmoothedRtt {
    /// `alpha = 0.9`, the paper's default.
    fn default() -> Self {
        Self::new(0.9)
    }
}

impl SmoothedRtt {
    /// An estimator with weight `alpha` (in `[0, 1]`, clamped) on the old estimate.
    pub fn new(alpha: f64) -> Self {
        let alpha = if alpha.is_nan() {
            0.9
        } else {
            alpha.clamp(0.0, 1.0)
        };
        Self {
            alpha,
            srtt_ns: None,
        }
    }

    /// The weight on the old estimate.
    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    /// Fold in one measured round trip.
    pub fn update(&mut self, sample: Duration) {
        let s = sample.as_nanos() as f64;
        self.srtt_ns = Some(match self.srtt_ns {
            None => s,
            Some(t) => self.alpha * t + (1.0 - self.alpha) * s,
        });
    }

    /// Fold in one measured round trip, counting it as at most `bound` (when the
    /// estimator already has a sample). Equation 2 trusts every sample; a client's sample
    /// also holds any time its thread was not running (preempted, a page fault, a busy
    /// core shared with other processes), and one 20 ms stall in a 2 us round trip left
    /// a 2 ms estimate behind. Every Hangout is a multiple of the estimate, and polls,
    /// the only source of new samples, then come milliseconds apart: the estimate decays
    /// one poll at a time while the lock sits free. With a bound, such a sample moves
    /// the estimate by at most `(1 - alpha) x bound`, and a real rise still passes
    /// within a few samples.
    pub fn update_bounded(&mut self, sample: Duration, bound: Duration) {
        let s = match self.srtt_ns {
            Some(_) => sample.min(bound),
            None => sample,
        };
        self.update(s);
    }

    /// The current estimate; zero before the first sample.
    pub fn get(&self) -> Duration {
        Duration::from_nanos(self.srtt_ns.map_or(0, |t| t.round() as u64))
    }

    /// Whether at least one sample was folded in.
    pub fn has_sample(&self) -> bool {
        self.srtt_ns.is_some()
    }
}

/// The Hangout wait before polling `upper` again, Equation 3:
/// `ahead x srtt` (saturating at the largest `Duration` of `u64::MAX` nanoseconds).
pub fn hangout(ahead: u64, srtt: Duration) -> Duration {
    let ns = srtt.as_nanos().saturating_mul(u128::from(ahead));
    Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Words {
        lower: AtomicU64,
        upper: AtomicU64,
        queued_ts: AtomicU64,
    }

    impl Words {
        fn lock(&self, ts: u64, mode: Mode, wm: Watermarks) -> LockReply {
            lock_rpc(&self.lower, &self.upper, &self.queued_ts, ts, mode, wm)
        }
        /// The holder's RDMA FAA of +1 on `upper`.
        fn unlock(&self) {
            self.upper.fetch_add(1, Ordering::AcqRel);
        }
        fn snapshot(&self) -> (u64, u64, u64) {
            (
                self.lower.load(Ordering::Relaxed),
                self.upper.load(Ordering::Relaxed),
                self.queued_ts.load(Ordering::Relaxed),
            )
        }
        fn set(&self, lower: u64, upper: u64, queued_ts: u64) {
            self.lower.store(lower, Ordering::Relaxed);
            self.upper.store(upper, Ordering::Relaxed);
            self.queued_ts.store(queued_ts, Ordering::Relaxed);
        }
    }

    const WIDE: Watermarks = Watermarks {
        cold: u64::MAX,
        hot: u64::MAX,
    };

    #[test]
    fn fifo_grants_in_arrival_order() {
        let w = Words::default();
        // Five clients arrive in order and take tickets.
        let tickets: Vec<u64> = (0..5)
            .map(|i| {
                let r = w.lock(10 + i, Mode::Hot, WIDE);
                assert!(r.granted_queue);
                assert_eq!(r.ahead(), i, "tickets ahead = arrivals before us");
                assert_eq!(r.holds_now(), i == 0);
                r.ticket
            })
            .collect();
        assert_eq!(tickets, vec![0, 1, 2, 3, 4]);
        // Each client polls `upper`; exactly one holds at a time, in arrival order.
        let mut order = Vec::new();
        let mut done = [false; 5];
        for _ in 0..5 {
            let up = w.upper.load(Ordering::Relaxed);
            let holders: Vec<usize> = (0..5).filter(|&c| !done[c] && tickets[c] == up).collect();
            assert_eq!(holders.len(), 1, "exactly one holder at upper {up}");
            let c = holders[0];
            order.push(c);
            done[c] = true;
            w.unlock();
        }
        assert_eq!(order, vec![0, 1, 2, 3, 4]);
        assert_eq!(w.snapshot().0, w.snapshot().1, "queue drained");
    }

    #[test]
    fn cold_watermark_boundary() {
        let w = Words::default();
        let wm = Watermarks::default();
        // Queue lengths 0..=3 are accepted in cold mode.
        for i in 0..=3 {
            let r = w.lock(1, Mode::Cold, wm);
            assert!(r.granted_queue, "cold at queue {i}");
            assert_eq!(r.ahead(), i);
        }
        // Queue 4 > 3: refused.
        let before = w.snapshot();
        let r = w.lock(1, Mode::Cold, wm);
        assert!(!r.granted_queue);
        assert_eq!(r.reason, Some(RefuseReason::ColdWatermark));
        assert_eq!(r.ahead(), 4);
        assert_eq!(w.snapshot(), before, "refusal changes nothing");
        // Hot mode still queues at 4.
        assert!(w.lock(1, Mode::Hot, wm).granted_queue);
    }

    #[test]
    fn hot_watermark_boundary() {
        let w = Words::default();
        let wm = Watermarks::default();
        for i in 0..=10 {
            let r = w.lock(1, Mode::Hot, wm);
            assert!(r.granted_queue, "hot at queue {i}");
            assert_eq!(r.ahead(), i);
        }
        let before = w.snapshot();
        let r = w.lock(1, Mode::Hot, wm);
        assert_eq!(r.reason, Some(RefuseReason::HotWatermark));
        assert_eq!(r.ahead(), 11);
        assert_eq!(w.snapshot(), before);
        // Cold at 11 is refused by the cold watermark first.
        assert_eq!(
            w.lock(1, Mode::Cold, wm).reason,
            Some(RefuseReason::ColdWatermark)
        );
        // One unlock brings the queue to 10: accepted again.
        w.unlock();
        assert!(w.lock(1, Mode::Hot, wm).granted_queue);
    }

    #[test]
    fn watermarks_hold_across_wraparound() {
        let w = Words::default();
        w.set(u64::MAX - 1, u64::MAX - 1, 0);
        for i in 0..=3 {
            let r = w.lock(1, Mode::Cold, Watermarks::default());
            assert!(r.granted_queue);
            assert_eq!(r.ahead(), i);
        }
        assert_eq!(w.snapshot().0, 2, "lower wrapped");
        let r = w.lock(1, Mode::Cold, Watermarks::default());
        assert_eq!(r.reason, Some(RefuseReason::ColdWatermark));
        assert_eq!(r.ahead(), 4);
    }

    #[test]
    fn older_timestamp_refused_once_newer_queued() {
        let w = Words::default();
        assert!(w.lock(100, Mode::Hot, WIDE).granted_queue);
        let before = w.snapshot();
        let r = w.lock(99, Mode::Hot, WIDE);
        assert_eq!(r.reason, Some(RefuseReason::Timestamp));
        assert_eq!(r.queued_ts, 100);
        assert_eq!(w.snapshot(), before, "refusal changes nothing");
        // Equal is accepted, newer too; queued_ts follows.
        let r = w.lock(100, Mode::Hot, WIDE);
        assert!(r.granted_queue);
        assert_eq!(r.queued_ts, 100);
        let r = w.lock(150, Mode::Hot, WIDE);
        assert!(r.granted_queue);
        assert_eq!(w.snapshot().2, 150);
        // Timestamp is checked first: an old timestamp on a full queue says Timestamp.
        w.set(20, 0, 150);
        assert_eq!(
            w.lock(1, Mode::Cold, Watermarks::default()).reason,
            Some(RefuseReason::Timestamp)
        );
    }

    /// Scythe 4.4, Fig. 16: requests that reach the service together, served sorted by
    /// timestamp, all queue in timestamp order; served in arrival order, the older ones
    /// behind a newer one are refused by the `queued_ts` rule (Fig. 14, line 5).
    #[test]
    fn timestamp_order_queues_what_arrival_order_refuses() {
        let arrivals = [30u64, 10, 20, 25];
        let w = Words::default();
        let refused = arrivals
            .iter()
            .filter(|&&ts| !w.lock(ts, Mode::Hot, WIDE).granted_queue)
            .count();
        assert_eq!(refused, 3, "10, 20 and 25 arrive after 30");
        let w = Words::default();
        let mut sorted = arrivals;
        sorted.sort_unstable();
        let tickets: Vec<(u64, u64)> = sorted
            .iter()
            .map(|&ts| {
                let r = w.lock(ts, Mode::Hot, WIDE);
                assert!(r.granted_queue, "{ts}: {r:?}");
                (ts, r.ticket)
            })
            .collect();
        assert_eq!(tickets, vec![(10, 0), (20, 1), (25, 2), (30, 3)]);
        assert_eq!(w.snapshot(), (4, 0, 30), "queued_ts is the newest");
    }

    /// A lock's queue moves it between the modes (Scythe 4.3): cold requests queue up to
    /// ColdWatermark, then only hot ones up to HotWatermark; as holders unlock, cold
    /// requests are accepted again.
    #[test]
    fn watermarks_move_a_lock_between_cold_and_hot() {
        let w = Words::default();
        let wm = Watermarks::default();
        let mut ts = 0;
        let mut lock = |mode| {
            ts += 1;
            w.lock(ts, mode, wm)
        };
        for _ in 0..=wm.cold {
            assert!(lock(Mode::Cold).granted_queue);
        }
        let r = lock(Mode::Cold);
        assert_eq!(r.reason, Some(RefuseReason::ColdWatermark));
        assert_eq!(r.ahead(), wm.cold + 1, "the refusal reports the heat");
        while lock(Mode::Hot).granted_queue {}
        assert_eq!(
            w.snapshot().0,
            wm.hot + 1,
            "hot requests queued to HotWatermark"
        );
        for _ in 0..(wm.hot - wm.cold) {
            w.unlock();
            assert!(!lock(Mode::Cold).granted_queue, "still hot");
        }
        w.unlock();
        let r = lock(Mode::Cold);
        assert!(r.granted_queue, "cold again: {r:?}");
        assert_eq!(r.ahead(), wm.cold);
    }

    #[test]
    fn reply_reports_heat_and_old_words() {
        let w = Words::default();
        w.set(17, 12, 40);
        let r = w.lock(41, Mode::Hot, WIDE);
        assert_eq!(
            r,
            LockReply {
                granted_queue: true,
                reason: None,
                ticket: 17,
                upper: 12,
                queued_ts: 40
            }
        );
        assert_eq!(r.ahead(), 5, "heat = lower - upper");
        assert!(!r.holds_now());
        assert_eq!(w.snapshot(), (18, 12, 41));
    }

    #[test]
    fn smoothed_rtt_math() {
        let mut s = SmoothedRtt::default();
        assert_eq!(s.alpha(), 0.9);
        assert!(!s.has_sample());
        assert_eq!(s.get(), Duration::ZERO);
        s.update(Duration::from_nanos(1000));
        assert_eq!(
            s.get(),
            Duration::from_nanos(1000),
            "first sample initializes"
        );
        s.update(Duration::from_nanos(2000));
        // 0.9 * 1000 + 0.1 * 2000 = 1100
        assert_eq!(s.get(), Duration::from_nanos(1100));
        s.update(Duration::from_nanos(100));
        // 0.9 * 1100 + 0.1 * 100 = 1000
        assert_eq!(s.get(), Duration::from_nanos(1000));
        let mut fast = SmoothedRtt::new(0.0);
        fast.update(Duration::from_nanos(5));
        fast.update(Duration::from_nanos(7));
        assert_eq!(fast.get(), Duration::from_nanos(7));
        assert_eq!(SmoothedRtt::new(3.0).alpha(), 1.0);
    }

    #[test]
    fn a_bounded_update_caps_an_outlier_and_follows_a_real_rise() {
        let mut s = SmoothedRtt::default();
        let us = Duration::from_micros;
        s.update_bounded(us(2), us(1)); // the first sample is taken as it is
        assert_eq!(s.get(), us(2));
        // A 20 ms stall counts as 8 us: 0.9 x 2 + 0.1 x 8 = 2.6 us (unbounded: 2 ms).
        s.update_bounded(us(20_000), us(8));
        assert_eq!(s.get(), Duration::from_nanos(2600));
        // A real rise to 10 us gets through, bound by 4x the estimate each time.
        for _ in 0..30 {
            let bound = s.get() * 4;
            s.update_bounded(us(10), bound);
        }
        assert!(s.get() > us(9), "{:?}", s.get());
    }

    #[test]
    fn hangout_is_ahead_times_srtt() {
        let rtt = Duration::from_micros(3);
        assert_eq!(hangout(0, rtt), Duration::ZERO);
        assert_eq!(hangout(1, rtt), rtt);
        assert_eq!(hangout(4, rtt), Duration::from_micros(12));
        assert_eq!(
            hangout(u64::MAX, Duration::from_secs(1)),
            Duration::from_nanos(u64::MAX)
        );
    }

    #[test]
    fn watermark_validation() {
        assert!(Watermarks::default().validate().is_ok());
        assert!(Watermarks { cold: 4, hot: 3 }.validate().is_err());
        assert!(Watermarks { cold: 3, hot: 3 }.validate().is_ok());
    }
}
