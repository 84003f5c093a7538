//! The snapshot-isolation (SI) check of a recorded [`History`] whose transactions carry
//! their start and commit timestamps ([`History::record_timed`]).
//!
//! The protocol it checks is Motor's multi-versioned one (Motor, 5.1
//! and 5.2, "Supporting SI"): a transaction takes a start timestamp `s`, reads for each
//! object the largest version below `s`, locks what it writes, takes a commit timestamp
//! `c` and installs each write as a version equal to `c`; under SI the read-only data is
//! not validated, the locks still resolve write-write conflicts. Timestamps come from one
//! service and are unique: no two transactions share a start or a commit timestamp, and
//! no start equals a commit. So a version is the commit timestamp of the transaction
//! that installed it, and versions and timestamps share one order.
//!
//! For each recorded transaction `T` with start `s` and commit `c`:
//!
//! - **times**: `T` has timestamps and `c >= s`. A read-only transaction commits at its
//!   start (`c == s`: it installs nothing and needs no commit timestamp); a writer gets
//!   two timestamps, but `c == s` is not itself an SI violation and is accepted. A
//!   transaction recorded without timestamps is reported, not skipped; its writes still
//!   count as installed versions for the other checks and its reads are still checked
//!   for unknown versions, but nothing that needs its times.
//! - **write versions**: every write of `T` installs version `c`.
//! - **no lost update** (first committer wins): no other transaction that wrote an object
//!   `T` wrote committed in `[s, c]`. Per object, the writers sorted by commit timestamp:
//!   it suffices that each one's nearest predecessor committed before its start (any
//!   earlier writer committed before that predecessor). Equal timestamps cannot occur in
//!   a valid run and count as an overlap. Reported as the pair (the earlier committer
//!   first), the object and both intervals; counted once per writer whose predecessor
//!   overlaps it.
//! - **snapshot reads**: a read by `T` of version `v` of an object has `v < s` (else a
//!   *future read*: `v == s` is impossible with unique timestamps), and no recorded write
//!   of the object installed a version `v'` with `v < v' < s` (else a *stale read*,
//!   reported with the newest such `v'`, the version the snapshot at `s` holds). The
//!   history records only reads of the snapshot, not reads of the transaction's own
//!   writes, so no exception for them is needed.
//! - **unknown reads**: a read of a version that no recorded transaction installed, unless
//!   it is below every installed version of its object (the loaded data), is reported
//!   like [`crate::serializability`] does (Adya's G1a/G1b: an aborted or intermediate
//!   write leaked); only when the history is complete, since a dropped writer looks the
//!   same.
//!
//! The loaded data's versions (e.g. 0) must be below every start timestamp, as if it was
//! committed before the run; a read of a loaded version is then a snapshot read like any
//! other, stale once a recorded write below the reader's start installed a newer one.
//!
//! Not checked, because SI allows it: write skew (two concurrent transactions each read
//! what the other writes and write disjoint objects), and read-only anomalies in general;
//! [`crate::serializability`] rejects them. Nor is the order of timestamps against real
//! time (the TSO's own checker covers that). In an incomplete history the dropped
//! transactions' writes are missing: a lost update against a dropped writer or a read
//! that missed a dropped writer's version goes unseen, but whatever is reported is real.
//!
//! Cost: one sort of all accesses by object, kind and version, and per object a sort of
//! its writers by commit timestamp and a binary search per read: `O(n log n)` in the
//! accesses, 32 bytes each, no pass over pairs of transactions.

use std::fmt;

use crate::history::{AccessKind, History};

/// How many violations of each kind a verdict lists (the counts are complete).
pub const EXAMPLES_PER_KIND: usize = 5;

/// A committed transaction as a violation names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimedTxn {
    /// Transaction index in the history.
    pub txn: usize,
    /// Its kind (the workload's transaction type).
    pub kind: u16,
    /// Its start timestamp.
    pub start_ts: u64,
    /// Its commit timestamp.
    pub commit_ts: u64,
}

/// An object: a key of a table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Object {
    /// Table id.
    pub table: u32,
    /// Key within the table.
    pub key: u64,
}

/// One violation of snapshot isolation (or of the conditions the check needs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SiViolation {
    /// A transaction recorded without timestamps.
    Untimed {
        /// Transaction index in the history.
        txn: usize,
        /// Its kind.
        kind: u16,
    },
    /// A transaction whose commit timestamp is below its start timestamp.
    CommitBeforeStart(TimedTxn),
    /// A write that installed a version other than its transaction's commit timestamp.
    WriteVersion {
        /// The writer.
        writer: TimedTxn,
        /// The object written.
        object: Object,
        /// The version installed.
        version: u64,
    },
    /// Two writers of one object with overlapping intervals: `second` committed after
    /// `first` had committed within `second`'s interval, so first committer wins would
    /// have aborted `second`.
    LostUpdate {
        /// The earlier committer.
        first: TimedTxn,
        /// The later committer, which should have aborted.
        second: TimedTxn,
        /// The object both wrote.
        object: Object,
    },
    /// A read of a version at or above the reader's start timestamp.
    FutureRead {
        /// The reader.
        reader: TimedTxn,
        /// The object read.
        object: Object,
        /// The version read.
        version: u64,
    },
    /// A read that missed a newer version committed before the reader's start.
    StaleRead {
        /// The reader.
        reader: TimedTxn,
        /// The object read.
        object: Object,
        /// The version read.
        version: u64,
        /// The newest recorded version below the reader's start, which it should have read.
        newer: u64,
    },
    /// A read of a version no recorded transaction installed, above the object's lowest
    /// installed version.
    UnknownRead {
        /// Transaction index of the reader.
        reader: usize,
        /// Its kind.
        kind: u16,
        /// The object read.
        object: Object,
        /// The version read.
        version: u64,
    },
}

impl SiViolation {
    /// Rank of the variant: the order of kinds in reports and the index in [`SiCounts`].
    fn rank(&self) -> usize {
        match self {
            Self::Untimed { .. } => 0,
            Self::CommitBeforeStart(_) => 1,
            Self::WriteVersion { .. } => 2,
            Self::LostUpdate { .. } => 3,
            Self::FutureRead { .. } => 4,
            Self::StaleRead { .. } => 5,
            Self::UnknownRead { .. } => 6,
        }
    }

    fn describe(&self, kind_name: &dyn Fn(u16) -> String) -> String {
        let t = |x: &TimedTxn| {
            format!(
                "T{}({})[s{} c{}]",
                x.txn,
                kind_name(x.kind),
                x.start_ts,
                x.commit_ts
            )
        };
        let o = |x: &Object| format!("table {} key {}", x.table, x.key);
        match self {
            Self::Untimed { txn, kind } => format!("T{txn}({})", kind_name(*kind)),
            Self::CommitBeforeStart(x) => t(x),
            Self::WriteVersion {
                writer,
                object,
                version,
            } => format!("{} wrote {} v{version}", t(writer), o(object)),
            Self::LostUpdate {
                first,
                second,
                object,
            } => format!("{} and {} both wrote {}", t(first), t(second), o(object)),
            Self::FutureRead {
                reader,
                object,
                version,
            } => format!("{} read {} v{version}", t(reader), o(object)),
            Self::StaleRead {
                reader,
                object,
                version,
                newer,
            } => format!(
                "{} read {} v{version}, its snapshot holds v{newer}",
                t(reader),
                o(object)
            ),
            Self::UnknownRead {
                reader,
                kind,
                object,
                version,
            } => format!(
                "T{reader}({}) read {} v{version}",
                kind_name(*kind),
                o(object)
            ),
        }
    }
}

/// How many violations of each kind the check found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SiCounts {
    /// Transactions recorded without timestamps.
    pub untimed: u64,
    /// Transactions whose commit timestamp is below their start timestamp.
    pub commit_before_start: u64,
    /// Writes whose version is not their transaction's commit timestamp.
    pub write_version: u64,
    /// Writers whose interval overlaps the nearest earlier-committed writer's commit.
    pub lost_update: u64,
    /// Reads of a version at or above the reader's start.
    pub future_read: u64,
    /// Reads that missed a newer version below the reader's start.
    pub stale_read: u64,
    /// Reads of versions no recorded transaction installed (complete histories only).
    pub unknown_read: u64,
}

impl SiCounts {
    /// All violations.
    pub fn total(&self) -> u64 {
        self.as_array().iter().sum()
    }

    fn as_array(&self) -> [u64; 7] {
        [
            self.untimed,
            self.commit_before_start,
            self.write_version,
            self.lost_update,
            self.future_read,
            self.stale_read,
            self.unknown_read,
        ]
    }

    fn slot(&mut self, rank: usize) -> &mut u64 {
        match rank {
            0 => &mut self.untimed,
            1 => &mut self.commit_before_start,
            2 => &mut self.write_version,
            3 => &mut self.lost_update,
            4 => &mut self.future_read,
            5 => &mut self.stale_read,
            _ => &mut self.unknown_read,
        }
    }
}

/// What a report calls each kind, in rank order.
const LABELS: [&str; 7] = [
    "recorded without timestamps",
    "with commit ts below start ts",
    "write(s) of a version other than the commit ts",
    "lost update(s) (both committed a write within the later one's interval)",
    "read(s) of a version at or after the reader's start",
    "stale snapshot read(s)",
    "read(s) of versions no committed transaction installed",
];

/// What the check found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SiOutcome {
    /// Every checked condition holds.
    Holds,
    /// The first [`EXAMPLES_PER_KIND`] violations of each kind, kinds in the order of
    /// [`SiCounts`]' fields (the counts are in [`SiVerdict::violations`]).
    Violated(Vec<SiViolation>),
}

/// The check's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiVerdict {
    /// Committed transactions in the history (timed or not).
    pub committed: usize,
    /// Committed transactions left out of the history (its byte limit).
    pub dropped: u64,
    /// Reads of timed transactions checked against their snapshot.
    pub reads: u64,
    /// Writes of timed transactions checked for their version and for lost updates.
    pub writes: u64,
    /// Violations found, by kind.
    pub violations: SiCounts,
    /// The finding.
    pub outcome: SiOutcome,
}

impl SiVerdict {
    /// True when the history satisfies snapshot isolation as far as it was recorded.
    pub fn holds(&self) -> bool {
        self.outcome == SiOutcome::Holds
    }

    /// One line for reports: `snapshot isolation: N committed, R reads, W writes checked:
    /// no lost update, no snapshot read violation`, or `snapshot isolation: VIOLATED
    /// (...): ` with each kind found, its count and its first few, each transaction shown
    /// as `T<index>(<kind name>)[s<start> c<commit>]` using `kind_name`.
    pub fn line(&self, kind_name: &dyn Fn(u16) -> String) -> String {
        let partial = if self.dropped > 0 {
            format!(
                " (history incomplete: {} committed transactions not checked, nor unknown reads)",
                self.dropped
            )
        } else {
            String::new()
        };
        let counts = format!(
            "{} committed, {} reads, {} writes checked",
            self.committed, self.reads, self.writes
        );
        let SiOutcome::Violated(found) = &self.outcome else {
            return format!(
                "snapshot isolation: {counts}: no lost update, no snapshot read violation{partial}"
            );
        };
        let mut s = format!("snapshot isolation: VIOLATED ({counts}):");
        for (rank, (&n, label)) in self.violations.as_array().iter().zip(LABELS).enumerate() {
            if n == 0 {
                continue;
            }
            let noun = if rank < 2 { " transaction(s)" } else { "" };
            s.push_str(&format!(" {n}{noun} {label}:"));
            for v in found.iter().filter(|v| v.rank() == rank) {
                s.push_str(&format!(" {};", v.describe(kind_name)));
            }
        }
        s.push_str(&partial);
        s
    }
}

impl fmt::Display for SiVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.line(&|k| k.to_string()))
    }
}

/// An access as the check sorts it: (table, key, is_read, version, transaction); per
/// object the writes come first, by version.
type Row = (u32, u64, bool, u64, u32);

#[derive(Default)]
struct Found {
    counts: SiCounts,
    first: Vec<SiViolation>,
}

impl Found {
    fn note(&mut self, v: SiViolation) {
        let n = self.counts.slot(v.rank());
        *n += 1;
        if *n as usize <= EXAMPLES_PER_KIND {
            self.first.push(v);
        }
    }
}

/// Check `h` for snapshot isolation. See the module docs for what exactly is checked.
pub fn check(h: &History) -> SiVerdict {
    let mut found = Found::default();
    let timed = |t: usize| {
        h.times(t).map(|(start_ts, commit_ts)| TimedTxn {
            txn: t,
            kind: h.txn(t).0,
            start_ts,
            commit_ts,
        })
    };
    for t in 0..h.len() {
        match timed(t) {
            None => found.note(SiViolation::Untimed {
                txn: t,
                kind: h.txn(t).0,
            }),
            Some(x) if x.commit_ts < x.start_ts => found.note(SiViolation::CommitBeforeStart(x)),
            Some(_) => {}
        }
    }

    let mut rows: Vec<Row> = h
        .iter_accesses()
        .map(|(t, a)| {
            (
                a.table,
                a.key,
                a.kind == AccessKind::Read,
                a.version,
                t as u32,
            )
        })
        .collect();
    rows.sort_unstable();

    let complete = h.dropped() == 0;
    let (mut reads, mut writes) = (0u64, 0u64);
    // One object's timed writers with valid times, as (commit, start, transaction).
    let mut writers: Vec<(u64, u64, u32)> = Vec::new();
    for obj in rows.chunk_by(|a, b| (a.0, a.1) == (b.0, b.1)) {
        let object = Object {
            table: obj[0].0,
            key: obj[0].1,
        };
        let (ws, rs) = obj.split_at(obj.partition_point(|r| !r.2));

        writers.clear();
        for &(.., version, t) in ws {
            let Some(w) = timed(t as usize) else {
                continue;
            };
            writes += 1;
            if version != w.commit_ts {
                found.note(SiViolation::WriteVersion {
                    writer: w,
                    object,
                    version,
                });
            }
            if w.commit_ts >= w.start_ts {
                writers.push((w.commit_ts, w.start_ts, t));
            }
        }
        // A transaction writing the object twice is one writer.
        writers.sort_unstable();
        writers.dedup();
        for pair in writers.windows(2) {
            let ((c1, s1, t1), (c2, s2, t2)) = (pair[0], pair[1]);
            if c1 >= s2 {
                let at = |t: u32, start_ts, commit_ts| TimedTxn {
                    txn: t as usize,
                    kind: h.txn(t as usize).0,
                    start_ts,
                    commit_ts,
                };
                found.note(SiViolation::LostUpdate {
                    first: at(t1, s1, c1),
                    second: at(t2, s2, c2),
                    object,
                });
            }
        }

        for &(.., version, t) in rs {
            let installed = ws.binary_search_by_key(&version, |w| w.3).is_ok();
            if complete && !installed && ws.first().is_some_and(|w| w.3 < version) {
                found.note(SiViolation::UnknownRead {
                    reader: t as usize,
                    kind: h.txn(t as usize).0,
                    object,
                    version,
                });
            }
            let Some(reader) = timed(t as usize) else {
                continue;
            };
            reads += 1;
            if version >= reader.start_ts {
                found.note(SiViolation::FutureRead {
                    reader,
                    object,
                    version,
                });
                continue;
            }
            // The newest installed version below the start: what the snapshot holds.
            let below = ws.partition_point(|w| w.3 < reader.start_ts);
            let newest = below.checked_sub(1).map(|i| ws[i].3);
            if let Some(newer) = newest.filter(|&n| n > version) {
                found.note(SiViolation::StaleRead {
                    reader,
                    object,
                    version,
                    newer,
                });
            }
        }
    }

    let Found { counts, mut first } = found;
    first.sort_by_key(SiViolation::rank);
    SiVerdict {
        committed: h.len(),
        dropped: h.dropped(),
        reads,
        writes,
        violations: counts,
        outcome: if first.is_empty() {
            SiOutcome::Holds
        } else {
            SiOutcome::Violated(first)
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Access, ACCESS_BYTES, TIMES_BYTES, TXN_BYTES};

    const X: u64 = 1;
    const Y: u64 = 2;
    const Z: u64 = 3;

    fn r(key: u64, v: u64) -> Access {
        Access::read(0, key, v)
    }
    fn w(key: u64, v: u64) -> Access {
        Access::write(0, key, v)
    }
    /// Transaction `i` has kind `i`.
    fn timed(txns: &[(u64, u64, &[Access])]) -> History {
        let mut h = History::new(usize::MAX);
        for (i, &(s, c, a)) in txns.iter().enumerate() {
            assert!(h.record_timed(i as u16, s, c, a.len(), a.iter().copied()));
        }
        h
    }
    fn at(txn: usize, start_ts: u64, commit_ts: u64) -> TimedTxn {
        TimedTxn {
            txn,
            kind: txn as u16,
            start_ts,
            commit_ts,
        }
    }
    const OX: Object = Object { table: 0, key: X };
    fn violations(v: &SiVerdict) -> &[SiViolation] {
        match &v.outcome {
            SiOutcome::Violated(f) => f,
            SiOutcome::Holds => panic!("expected violations: {v}"),
        }
    }

    #[test]
    fn an_interleaved_history_with_write_skew_holds() {
        let h = timed(&[
            // Writes x and y over the loaded version 0.
            (1, 2, &[r(X, 0), w(X, 2), w(Y, 2)]),
            // T1 and T2 run concurrently, each reads x and y and writes one of them:
            // write skew, which SI allows (disjoint writes).
            (3, 5, &[r(X, 2), r(Y, 2), w(X, 5)]),
            (4, 6, &[r(X, 2), r(Y, 2), w(Y, 6)]),
            // Read-only after both, committing at its start.
            (7, 7, &[r(X, 5), r(Y, 6)]),
            (8, 10, &[r(X, 5), w(X, 10)]),
            // Read-only while T4 runs: its snapshot at 9 does not hold x v10.
            (9, 9, &[r(X, 5), r(Y, 6)]),
            (11, 12, &[r(X, 10), r(Z, 0), w(Z, 12)]),
        ]);
        let v = check(&h);
        assert!(v.holds(), "{v}");
        assert_eq!(v.violations.total(), 0);
        assert_eq!((v.committed, v.dropped, v.reads, v.writes), (7, 0, 12, 6));
        assert_eq!(
            v.to_string(),
            "snapshot isolation: 7 committed, 12 reads, 6 writes checked: no lost update, \
             no snapshot read violation"
        );
        // The same history is not serializable: the write skew is a cycle.
        assert!(!crate::serializability::check(&h).is_serializable());
    }

    #[test]
    fn a_lost_update_is_reported_with_both_writers() {
        // Both start before either commits and both write x.
        let v = check(&timed(&[
            (1, 3, &[r(X, 0), w(X, 3)]),
            (2, 4, &[r(X, 0), w(X, 4)]),
        ]));
        assert_eq!(
            violations(&v),
            [SiViolation::LostUpdate {
                first: at(0, 1, 3),
                second: at(1, 2, 4),
                object: OX,
            }]
        );
        assert_eq!(v.violations.total(), 1);
        let line = v.line(&|k| ["Deposit", "Withdraw"][k as usize].to_string());
        assert!(
            line.starts_with("snapshot isolation: VIOLATED (2 committed, 2 reads, 2 writes"),
            "{line}"
        );
        assert!(
            line.contains(
                "1 lost update(s) (both committed a write within the later one's interval): \
                 T0(Deposit)[s1 c3] and T1(Withdraw)[s2 c4] both wrote table 0 key 1;"
            ),
            "{line}"
        );

        // A long writer overlapping an earlier-committing one that is not its nearest
        // predecessor is still caught (through the predecessor); the two short ones are
        // sequential.
        let v = check(&timed(&[
            (1, 10, &[w(X, 10)]),
            (2, 3, &[w(X, 3)]),
            (4, 5, &[w(X, 5)]),
        ]));
        assert_eq!(v.violations.lost_update, 1, "{v}");
        assert_eq!(
            violations(&v),
            [SiViolation::LostUpdate {
                first: at(2, 4, 5),
                second: at(0, 1, 10),
                object: OX,
            }]
        );
    }

    #[test]
    fn a_read_that_missed_a_version_in_its_snapshot_is_stale() {
        // T1 reads the loaded x though T0 committed x v2 before T1 started; T3 reads x
        // v2 though T2 committed v5 before it started.
        let v = check(&timed(&[
            (1, 2, &[w(X, 2)]),
            (3, 3, &[r(X, 0)]),
            (4, 5, &[r(X, 2), w(X, 5)]),
            (6, 6, &[r(X, 2), r(Y, 0)]),
        ]));
        assert_eq!(
            violations(&v),
            [
                SiViolation::StaleRead {
                    reader: at(1, 3, 3),
                    object: OX,
                    version: 0,
                    newer: 2,
                },
                SiViolation::StaleRead {
                    reader: at(3, 6, 6),
                    object: OX,
                    version: 2,
                    newer: 5,
                },
            ]
        );
        assert_eq!(v.violations.total(), 2);
        assert!(
            v.to_string()
                .contains("2 stale snapshot read(s): T1(1)[s3 c3] read table 0 key 1 v0, its snapshot holds v2;"),
            "{v}"
        );
    }

    #[test]
    fn a_read_of_a_version_from_after_the_start_is_reported() {
        // T1 started at 3 but read x v5, committed at 5 by T0.
        let v = check(&timed(&[(1, 5, &[w(X, 5)]), (3, 3, &[r(X, 5)])]));
        assert_eq!(
            violations(&v),
            [SiViolation::FutureRead {
                reader: at(1, 3, 3),
                object: OX,
                version: 5,
            }]
        );
        assert_eq!(v.violations.future_read, 1);
    }

    #[test]
    fn a_write_must_install_its_commit_timestamp() {
        let v = check(&timed(&[(1, 2, &[w(X, 3)])]));
        assert_eq!(
            violations(&v),
            [SiViolation::WriteVersion {
                writer: at(0, 1, 2),
                object: OX,
                version: 3,
            }]
        );
        assert!(
            v.to_string()
                .contains("T0(0)[s1 c2] wrote table 0 key 1 v3"),
            "{v}"
        );
    }

    #[test]
    fn untimed_and_backwards_transactions_are_reported_not_skipped() {
        let mut h = History::new(usize::MAX);
        // Untimed writer of x v7: reported, yet its version still counts, so the timed
        // reader at 8 that read the loaded x is stale.
        h.record(4, &[w(X, 7)]);
        h.record_timed(5, 5, 4, 1, [r(Y, 0)].into_iter());
        h.record_timed(6, 8, 8, 1, [r(X, 0)].into_iter());
        let v = check(&h);
        assert_eq!(
            violations(&v),
            [
                SiViolation::Untimed { txn: 0, kind: 4 },
                SiViolation::CommitBeforeStart(TimedTxn {
                    txn: 1,
                    kind: 5,
                    start_ts: 5,
                    commit_ts: 4,
                }),
                SiViolation::StaleRead {
                    reader: TimedTxn {
                        txn: 2,
                        kind: 6,
                        start_ts: 8,
                        commit_ts: 8,
                    },
                    object: OX,
                    version: 0,
                    newer: 7,
                },
            ]
        );
        assert_eq!(
            (v.reads, v.writes),
            (2, 0),
            "the untimed write is not checked"
        );
        let line = v.to_string();
        assert!(
            line.contains(
                "1 transaction(s) recorded without timestamps: T0(4); \
                 1 transaction(s) with commit ts below start ts: T1(5)[s5 c4];"
            ),
            "{line}"
        );
        // A history recorded entirely without times fails too.
        let mut h = History::new(usize::MAX);
        h.record(0, &[r(X, 0)]);
        assert_eq!(check(&h).violations.untimed, 1);
    }

    #[test]
    fn a_read_of_a_version_nobody_installed_is_reported_when_complete() {
        // T1 read x v3 but only v2 was installed: an aborted write leaked.
        let txns: [(u64, u64, &[Access]); 2] = [(1, 2, &[w(X, 2)]), (4, 4, &[r(X, 3)])];
        let v = check(&timed(&txns));
        assert_eq!(
            violations(&v),
            [SiViolation::UnknownRead {
                reader: 1,
                kind: 1,
                object: OX,
                version: 3,
            }]
        );
        assert!(v.to_string().contains("T1(1) read table 0 key 1 v3"), "{v}");
        // When a later commit was dropped, v3's writer may be among what was left out.
        let per = TXN_BYTES + ACCESS_BYTES + TIMES_BYTES;
        let mut h = History::new(2 * per);
        for (s, c, a) in txns.into_iter().chain([(5, 6, &[w(Z, 6)][..])]) {
            h.record_timed(0, s, c, a.len(), a.iter().copied());
        }
        assert_eq!(h.dropped(), 1);
        let v = check(&h);
        assert!(v.holds(), "{v}");
        assert!(v
            .to_string()
            .ends_with("1 committed transactions not checked, nor unknown reads)"));
    }

    #[test]
    fn many_interleaved_transactions_hold_and_a_planted_violation_is_found() {
        // Transaction i writes key i % 64 over [10i + 1, 10i + 325]: about 32 run at
        // once, never two on one key. It reads its own key and the next one at the
        // newest version committed before its start.
        const N: u64 = 20_000;
        const KEYS: u64 = 64;
        let start = |i: u64| 10 * i + 1;
        let commit = |i: u64| 10 * i + 325;
        // Newest writer of `key` committed before transaction i's start: j <= i - 33.
        let snapshot = |i: u64, key: u64| {
            let top = i.checked_sub(33)?;
            let back = (top + KEYS - key) % KEYS;
            top.checked_sub(back).map(commit)
        };
        let mut h = History::new(usize::MAX);
        for i in 0..N {
            let (k, k2) = (i % KEYS, (i + 1) % KEYS);
            let acc = [
                r(k, snapshot(i, k).unwrap_or(0)),
                r(k2, snapshot(i, k2).unwrap_or(0)),
                w(k, commit(i)),
            ];
            h.record_timed(0, start(i), commit(i), 3, acc.into_iter());
        }
        let v = check(&h);
        assert!(v.holds(), "{v}");
        assert_eq!((v.reads, v.writes), (2 * N, N));

        // A writer of j's key that started just before j committed, and a late reader
        // of the loaded version of key 3.
        let j = N - 10;
        h.record_timed(
            1,
            commit(j) - 1,
            10 * N + 1_000,
            1,
            [w(j % KEYS, 10 * N + 1_000)].into_iter(),
        );
        h.record_timed(2, 10 * N + 2_001, 10 * N + 2_001, 1, [r(3, 0)].into_iter());
        let v = check(&h);
        assert_eq!(
            (
                v.violations.total(),
                v.violations.lost_update,
                v.violations.stale_read
            ),
            (2, 1, 1),
            "{v}"
        );
        match violations(&v)[0] {
            SiViolation::LostUpdate { first, second, .. } => {
                assert_eq!((first.txn, second.txn), (j as usize, N as usize))
            }
            o => panic!("expected the lost update first, got {o:?}"),
        }
    }
}
