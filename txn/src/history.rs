//! Histories of committed transactions, recorded for the serializability check
//! ([`crate::serializability`]) and, with timestamps, the snapshot-isolation check
//! ([`crate::snapshot_isolation`]).
//!
//! Each committed transaction is recorded as the objects it read, with the version it
//! read, and the objects it wrote, with the version it installed. Versions are totally
//! ordered per object (the store installs `version + 1` under the object's lock), so the
//! dependency edges between transactions follow from the recorded versions alone, without
//! timing or guessing (Adya's direct serialization graph, the check Elle makes for
//! Jepsen).
//!
//! A transaction may also carry its start and commit timestamps
//! ([`History::record_timed`]), for multi-versioned runs whose versions are commit
//! timestamps (Motor, 5.1).
//!
//! Memory: an access takes [`ACCESS_BYTES`] bytes and a transaction [`TXN_BYTES`] more, so
//! a SmallBank transaction (3.25 accesses on average) costs about 84 bytes. Timestamps
//! cost nothing in a history that has none; once one timed transaction is recorded every
//! transaction of the history takes [`TIMES_BYTES`] more (100 bytes for SmallBank), an
//! untimed one holding a marker, so a history that mixes both stays one flat array. A
//! history stops recording at its byte limit and counts what it left out, so a long run
//! stays bounded and the check says it was partial.
//!
//! Wall-clock times: a transaction recorded while the thread's attempt start is set
//! ([`AttemptStart::set`], by the caller that runs the attempt) also carries
//! `(start_ns, end_ns)` in `CLOCK_MONOTONIC` nanoseconds ([`monotonic_ns`]): the
//! attempt's start and the moment it was recorded (its commit, before its locks are
//! released). They take [`WALL_BYTES`] per transaction, like the timestamps, only once
//! one transaction of the history has them.

use std::cell::Cell;

/// Whether an access read or wrote the object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AccessKind {
    /// The transaction read `version` (and validated it, if the protocol validates).
    Read,
    /// The transaction installed `version`.
    Write,
}

/// One object a committed transaction read or wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Access {
    /// Key within the table.
    pub key: u64,
    /// Version read, or version installed; totally ordered per (table, key).
    pub version: u64,
    /// Table id.
    pub table: u32,
    /// Read or write.
    pub kind: AccessKind,
}

impl Access {
    /// A read of `version` of (table, key).
    pub fn read(table: u32, key: u64, version: u64) -> Self {
        Self {
            key,
            version,
            table,
            kind: AccessKind::Read,
        }
    }

    /// A write installing `version` of (table, key).
    pub fn write(table: u32, key: u64, version: u64) -> Self {
        Self {
            key,
            version,
            table,
            kind: AccessKind::Write,
        }
    }
}

/// Bytes one recorded access takes.
pub const ACCESS_BYTES: usize = std::mem::size_of::<Access>();
/// Bytes one recorded transaction takes besides its accesses (end offset and kind).
pub const TXN_BYTES: usize = std::mem::size_of::<u32>() + std::mem::size_of::<u16>();

/// Bytes a transaction's (start, commit) timestamps take, for every transaction of a
/// history that holds at least one timed transaction.
pub const TIMES_BYTES: usize = std::mem::size_of::<(u64, u64)>();

/// Bytes a transaction's wall-clock `(start_ns, end_ns)` take, for every transaction of a
/// history that holds at least one with them.
pub const WALL_BYTES: usize = std::mem::size_of::<(u64, u64)>();

/// The `(start_ns, end_ns)` slot of a transaction recorded without wall-clock times.
const NO_WALL: (u64, u64) = (0, 0);

/// `CLOCK_MONOTONIC` now, nanoseconds (the clock every process of a host shares, so
/// times recorded by different processes compare; `rrpc`'s timing model reads the same).
pub fn monotonic_ns() -> u64 {
    rrpc::fabric::model::now_ns()
}

thread_local! {
    /// The start of the attempt running on this thread right now, `CLOCK_MONOTONIC` ns
    /// (0: none, or not wanted).
    static ATTEMPT_START_NS: Cell<u64> = const { Cell::new(0) };
}

/// While alive, transactions this thread records carry wall-clock times starting at the
/// given start (a coroutine sets it around each poll of its attempt, so the coroutines
/// of one thread never see each other's). Dropping it restores the previous value.
pub struct AttemptStart {
    prev: u64,
}

impl AttemptStart {
    /// Mark `start_ns` (`CLOCK_MONOTONIC` ns, [`monotonic_ns`]; 0 for none) as the start
    /// of the attempt this thread runs until the guard is dropped.
    pub fn set(start_ns: u64) -> Self {
        Self {
            prev: ATTEMPT_START_NS.with(|c| c.replace(start_ns)),
        }
    }
}

impl Drop for AttemptStart {
    fn drop(&mut self) {
        ATTEMPT_START_NS.with(|c| c.set(self.prev));
    }
}

const _: () = assert!(ACCESS_BYTES == 24);
const _: () = assert!(TIMES_BYTES == 16);

/// The (start, commit) slot of an untimed transaction in a history that holds timed ones:
/// a commit before the start at the extremes of the range, which no valid transaction
/// has. Recording exactly this pair with [`History::record_timed`] reads back as untimed
/// (and the snapshot-isolation check reports it as such, an error either way).
const UNTIMED: (u64, u64) = (u64::MAX, 0);

/// A sequence of committed transactions, each with its accesses and a kind (the
/// workload's transaction type, for reports). Transaction `i` is the `i`-th recorded;
/// the order carries no meaning for the check.
#[derive(Clone, Debug, Default)]
pub struct History {
    accesses: Vec<Access>,
    /// End of each transaction's accesses in `accesses`.
    ends: Vec<u32>,
    kinds: Vec<u16>,
    /// (start, commit) timestamps of each transaction ([`UNTIMED`] for one recorded
    /// without them); empty while no transaction has them.
    times: Vec<(u64, u64)>,
    /// Wall-clock `(start_ns, end_ns)` of each transaction ([`NO_WALL`] for one recorded
    /// without them); empty while no transaction has them.
    wall: Vec<(u64, u64)>,
    limit_bytes: usize,
    /// Committed transactions not recorded because the limit was reached.
    dropped: u64,
    /// Committed transactions that exist but never reached the history
    /// ([`Self::note_lost`]); recording goes on after them.
    lost: u64,
}

impl History {
    /// An empty history that records at most `limit_bytes` bytes (see the module docs for
    /// the cost per transaction); `usize::MAX` for no limit.
    pub fn new(limit_bytes: usize) -> Self {
        Self {
            limit_bytes,
            ..Self::default()
        }
    }

    /// Record a committed transaction of kind `kind`. Returns false, and counts the
    /// transaction as dropped, when recording it would pass the byte limit (or 2^32
    /// accesses).
    pub fn record(&mut self, kind: u16, accesses: &[Access]) -> bool {
        self.record_iter(kind, accesses.len(), accesses.iter().copied())
    }

    /// Record a committed transaction of kind `kind` from `n` accesses given by an
    /// iterator (no intermediate buffer); as [`Self::record`]. Panics if the iterator
    /// yields other than `n` accesses.
    pub fn record_iter(
        &mut self,
        kind: u16,
        n: usize,
        accesses: impl Iterator<Item = Access>,
    ) -> bool {
        self.push(kind, None, n, accesses)
    }

    /// Record a committed transaction of kind `kind` that started at `start_ts` and
    /// committed at `commit_ts` (a read-only transaction commits at its start: pass the
    /// same value), from `n` accesses given by an iterator; as [`Self::record_iter`]. The
    /// first timed transaction gives every transaction recorded before it an untimed
    /// slot (see the module docs for the cost); it counts against the byte limit.
    pub fn record_timed(
        &mut self,
        kind: u16,
        start_ts: u64,
        commit_ts: u64,
        n: usize,
        accesses: impl Iterator<Item = Access>,
    ) -> bool {
        self.push(kind, Some((start_ts, commit_ts)), n, accesses)
    }

    fn push(
        &mut self,
        kind: u16,
        times: Option<(u64, u64)>,
        n: usize,
        accesses: impl Iterator<Item = Access>,
    ) -> bool {
        // Slots this transaction adds to `times`: its own once the history is timed, and
        // one for each earlier transaction when it is the first timed one.
        let time_slots = match (times.is_some(), self.times.is_empty()) {
            (_, false) => 1,
            (true, true) => self.len() + 1,
            (false, true) => 0,
        };
        let start_ns = ATTEMPT_START_NS.with(Cell::get);
        let wall_slots = match (start_ns != 0, self.wall.is_empty()) {
            (_, false) => 1,
            (true, true) => self.len() + 1,
            (false, true) => 0,
        };
        let after = self.bytes()
            + TXN_BYTES
            + n * ACCESS_BYTES
            + time_slots * TIMES_BYTES
            + wall_slots * WALL_BYTES;
        let end = self.accesses.len() + n;
        if self.dropped > 0 || after > self.limit_bytes || end > u32::MAX as usize {
            self.dropped += 1;
            return false;
        }
        self.accesses.extend(accesses);
        assert_eq!(
            self.accesses.len(),
            end,
            "record_iter: {n} accesses announced"
        );
        self.ends.push(end as u32);
        self.kinds.push(kind);
        if time_slots > 0 {
            self.times.resize(self.ends.len() - 1, UNTIMED);
            self.times.push(times.unwrap_or(UNTIMED));
        }
        if wall_slots > 0 {
            self.wall.resize(self.ends.len() - 1, NO_WALL);
            self.wall.push(if start_ns == 0 {
                NO_WALL
            } else {
                (start_ns, monotonic_ns())
            });
        }
        true
    }

    /// Append `other`'s transactions (e.g. another thread's). Its dropped count carries
    /// over; the byte limit of `self` does not apply to what is appended.
    pub fn append(&mut self, other: History) {
        let base = self.accesses.len();
        assert!(
            base + other.accesses.len() <= u32::MAX as usize,
            "history of more than 2^32 accesses"
        );
        self.accesses.extend_from_slice(&other.accesses);
        self.ends
            .extend(other.ends.iter().map(|&e| e + base as u32));
        if !self.times.is_empty() || !other.times.is_empty() {
            // Either side may be untimed throughout (no slots): give it untimed slots.
            self.times.resize(self.kinds.len(), UNTIMED);
            if other.times.is_empty() {
                self.times
                    .resize(self.kinds.len() + other.kinds.len(), UNTIMED);
            } else {
                self.times.extend_from_slice(&other.times);
            }
        }
        if !self.wall.is_empty() || !other.wall.is_empty() {
            self.wall.resize(self.kinds.len(), NO_WALL);
            if other.wall.is_empty() {
                self.wall
                    .resize(self.kinds.len() + other.kinds.len(), NO_WALL);
            } else {
                self.wall.extend_from_slice(&other.wall);
            }
        }
        self.kinds.extend_from_slice(&other.kinds);
        self.dropped += other.dropped;
        self.lost += other.lost;
    }

    /// Count `n` committed transactions that exist but were not recorded here, e.g. a
    /// killed compute node's commits after its last streamed batch, or the commits a
    /// recovery rolled forward: the history is then incomplete, and the checks do not
    /// take a read of a version nobody recorded installing as a violation. Unlike the
    /// byte limit, it does not stop the recording of later transactions.
    pub fn note_lost(&mut self, n: u64) {
        self.lost += n;
    }

    /// Transactions recorded.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// True when nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Committed transactions not in the history: left out at the byte limit, or lost
    /// ([`Self::note_lost`]). Nonzero means the history is incomplete.
    pub fn dropped(&self) -> u64 {
        self.dropped + self.lost
    }

    /// Bytes the history holds (accesses and per-transaction data, not spare capacity).
    pub fn bytes(&self) -> usize {
        self.accesses.len() * ACCESS_BYTES
            + self.ends.len() * TXN_BYTES
            + self.times.len() * TIMES_BYTES
            + self.wall.len() * WALL_BYTES
    }

    /// Transaction `i`'s kind and accesses. Panics when `i >= len()`.
    pub fn txn(&self, i: usize) -> (u16, &[Access]) {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        (self.kinds[i], &self.accesses[start..self.ends[i] as usize])
    }

    /// Transaction `i`'s (start, commit) timestamps, `None` when it was recorded without
    /// them ([`Self::record`], [`Self::record_iter`]). Panics when `i >= len()`.
    pub fn times(&self, i: usize) -> Option<(u64, u64)> {
        assert!(i < self.len(), "times({i}) of {} transactions", self.len());
        self.times.get(i).copied().filter(|&t| t != UNTIMED)
    }

    /// Transaction `i`'s wall-clock `(start_ns, end_ns)` in `CLOCK_MONOTONIC` ns, `None`
    /// when it was recorded without an [`AttemptStart`]. Panics when `i >= len()`.
    pub fn wall_ns(&self, i: usize) -> Option<(u64, u64)> {
        assert!(
            i < self.len(),
            "wall_ns({i}) of {} transactions",
            self.len()
        );
        self.wall.get(i).copied().filter(|&t| t != NO_WALL)
    }

    /// Every access with the index of its transaction.
    pub fn iter_accesses(&self) -> impl Iterator<Item = (usize, &Access)> {
        let mut start = 0usize;
        self.ends.iter().enumerate().flat_map(move |(i, &end)| {
            let r = &self.accesses[start..end as usize];
            start = end as usize;
            r.iter().map(move |a| (i, a))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_appends_and_stops_at_its_limit() {
        let a = [Access::read(0, 1, 1), Access::write(0, 1, 2)];
        let per = TXN_BYTES + 2 * ACCESS_BYTES;
        let mut h = History::new(2 * per);
        assert!(h.record(3, &a));
        assert!(h.record(4, &a[..1]));
        assert!(!h.record(5, &a), "third would pass the limit");
        assert!(!h.record(6, &[]), "stays stopped once it dropped one");
        assert_eq!((h.len(), h.dropped()), (2, 2));
        assert_eq!(h.txn(0), (3, &a[..]));
        assert_eq!(h.txn(1), (4, &a[..1]));
        let mut all = History::new(usize::MAX);
        all.record(9, &[Access::write(1, 7, 2)]);
        all.append(h);
        assert_eq!((all.len(), all.dropped()), (3, 2));
        assert_eq!(all.txn(2), (4, &a[..1]));
        let flat: Vec<usize> = all.iter_accesses().map(|(i, _)| i).collect();
        assert_eq!(flat, vec![0, 1, 1, 2]);
        assert_eq!(all.bytes(), 3 * TXN_BYTES + 4 * ACCESS_BYTES);
        assert_eq!(all.times(2), None, "an untimed history has no times");
    }

    #[test]
    fn lost_transactions_leave_it_incomplete_and_recording() {
        // A dead node's unstreamed commits: the history is incomplete from then on, but
        // the commits after the recovery are still recorded and checked.
        let a = [Access::write(0, 1, 2)];
        let mut h = History::new(usize::MAX);
        assert!(h.record(1, &a));
        h.note_lost(3);
        assert!(h.record(2, &a), "recording goes on after lost commits");
        assert_eq!((h.len(), h.dropped()), (2, 3));
        let mut all = History::new(usize::MAX);
        all.append(h);
        assert!(all.record(3, &a));
        assert_eq!((all.len(), all.dropped()), (3, 3));
    }

    #[test]
    fn timed_transactions_keep_their_times_through_append_and_the_limit() {
        let a = [Access::read(0, 1, 1), Access::write(0, 1, 7)];
        let one = |h: &mut History, t: Option<(u64, u64)>| match t {
            Some((s, c)) => h.record_timed(1, s, c, a.len(), a.iter().copied()),
            None => h.record(1, &a),
        };
        let per = TXN_BYTES + 2 * ACCESS_BYTES;

        // Untimed, then timed: the first timed transaction gives the earlier one a slot,
        // and the untimed one after it takes a slot too.
        let mut h = History::new(usize::MAX);
        one(&mut h, None);
        assert_eq!(
            h.bytes(),
            per,
            "no time slots before the first timed transaction"
        );
        one(&mut h, Some((5, 7)));
        one(&mut h, None);
        one(&mut h, Some((9, 9)));
        assert_eq!(
            (0..4).map(|i| h.times(i)).collect::<Vec<_>>(),
            vec![None, Some((5, 7)), None, Some((9, 9))]
        );
        assert_eq!(h.bytes(), 4 * (per + TIMES_BYTES));
        assert_eq!(h.txn(1), (1, &a[..]));

        // Append in every combination of timed and untimed sides.
        let mut untimed = History::new(usize::MAX);
        one(&mut untimed, None);
        let mut timed = History::new(usize::MAX);
        one(&mut timed, Some((20, 21)));
        let mut all = untimed.clone();
        all.append(untimed.clone());
        assert_eq!(
            all.bytes(),
            2 * per,
            "untimed + untimed stays without slots"
        );
        all.append(timed.clone());
        all.append(untimed.clone());
        all.append(h);
        all.append(timed);
        let times: Vec<_> = (0..all.len()).map(|i| all.times(i)).collect();
        assert_eq!(
            times,
            vec![
                None,
                None,
                Some((20, 21)),
                None,
                None,
                Some((5, 7)),
                None,
                Some((9, 9)),
                Some((20, 21)),
            ]
        );
        assert_eq!(all.bytes(), 9 * (per + TIMES_BYTES));

        // The limit counts the slots: room for three untimed transactions is not room for
        // two untimed and a timed one (the timed one adds three slots); once a history is
        // timed, an untimed transaction takes its slot too.
        let mut h = History::new(3 * per);
        one(&mut h, None);
        one(&mut h, None);
        assert!(
            !one(&mut h, Some((1, 2))),
            "3 slots of TIMES_BYTES do not fit"
        );
        assert_eq!((h.len(), h.dropped(), h.bytes()), (2, 1, 2 * per));
        let mut h = History::new(2 * (per + TIMES_BYTES));
        assert!(one(&mut h, Some((1, 2))));
        assert!(one(&mut h, None), "its slot fits exactly");
        assert!(!one(&mut h, None));
        assert_eq!((h.len(), h.dropped()), (2, 1));

        // Wall-clock times: only while an attempt start is set; kept through append.
        let mut h = History::new(usize::MAX);
        one(&mut h, None);
        let t0 = monotonic_ns();
        {
            let _g = AttemptStart::set(t0);
            one(&mut h, None);
        }
        one(&mut h, None);
        assert_eq!(h.wall_ns(0), None);
        let (s, e) = h.wall_ns(1).expect("recorded with a start");
        assert!(s == t0 && e >= t0, "({s}, {e}) from {t0}");
        assert_eq!(h.wall_ns(2), None, "the guard restored no start");
        assert_eq!(h.bytes(), 3 * (per + WALL_BYTES));
        let mut all = History::new(usize::MAX);
        one(&mut all, None);
        all.append(h);
        assert_eq!(all.wall_ns(2), Some((s, e)));
        assert_eq!((all.wall_ns(0), all.wall_ns(3)), (None, None));

        // The marker pair reads back as untimed.
        let mut h = History::new(usize::MAX);
        one(&mut h, Some(UNTIMED));
        assert_eq!(h.times(0), None);
    }
}
