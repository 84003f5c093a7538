//! A benchmark client process's board: a small shared-memory file of 8-byte words that
//! the driver (`index-bench --processes N`) creates before it starts the process, and
//! reads while it runs and after it exited or was killed (`kill -9` loses nothing
//! written to it: the words live in the file, not in the process).
//!
//! Word layout: `ready | go | fault | acked[slots] | ops[intervals]`.
//! - `ready`: the client connected and waits for `go` (set by the client);
//! - `go`: start now (set by the driver once every client is ready);
//! - `fault`: 0, or what the client says it is about to do to itself at an injected
//!   fault point (set by the client just before it kills or stops itself; the meaning of
//!   the value is the caller's);
//! - `acked[s]`: inserts of client slot `s` acknowledged so far (each slot inserts its
//!   own sequence of keys, so a count names them all);
//! - `ops[i]`: operations completed in the `i`-th [`INTERVAL`] after `go` (the last
//!   interval also counts everything later).
//!
//! Each word has one writer (the client, or the driver for `go`), so plain atomic stores
//! suffice; readers want a recent value.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use memmap2::MmapMut;

/// Length of one throughput interval of the board's timeline.
pub const INTERVAL: Duration = Duration::from_millis(10);

const READY: usize = 0;
const GO: usize = 1;
const FAULT: usize = 2;
const ACKED: usize = 3;

/// One client process's board (see the module docs).
#[derive(Debug)]
pub struct Board {
    map: MmapMut,
    path: PathBuf,
    slots: usize,
    intervals: usize,
    /// Created here: the file is removed when this is dropped.
    owner: bool,
}

impl Board {
    /// Create (or truncate) the board at `path` for `slots` client slots and `intervals`
    /// timeline intervals, zeroed; the file is removed when the board is dropped.
    ///
    /// Errors: the file cannot be created, sized or mapped.
    pub fn create(path: &Path, slots: usize, intervals: usize) -> std::io::Result<Self> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        f.set_len(Self::bytes(slots, intervals))?;
        // SAFETY: the file was just created and sized by us; the client process maps it
        // too, and every access on either side goes through 8-byte atomics.
        let map = unsafe { MmapMut::map_mut(&f)? };
        Ok(Self {
            map,
            path: path.to_path_buf(),
            slots,
            intervals: intervals.max(1),
            owner: true,
        })
    }

    /// Map the board the driver created at `path` (in the client process).
    ///
    /// Errors: the file cannot be opened or mapped, or its size is not that of a board of
    /// `slots` slots and `intervals` intervals.
    pub fn open(path: &Path, slots: usize, intervals: usize) -> std::io::Result<Self> {
        let f = OpenOptions::new().read(true).write(true).open(path)?;
        let len = f.metadata()?.len();
        if len != Self::bytes(slots, intervals) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{}: {len} bytes, not a board of {slots} slots and {intervals} intervals",
                    path.display()
                ),
            ));
        }
        // SAFETY: as in `create`; the driver keeps the file until this process ended.
        let map = unsafe { MmapMut::map_mut(&f)? };
        Ok(Self {
            map,
            path: path.to_path_buf(),
            slots,
            intervals: intervals.max(1),
            owner: false,
        })
    }

    fn bytes(slots: usize, intervals: usize) -> u64 {
        ((ACKED + slots + intervals.max(1)) * 8) as u64
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i < ACKED + self.slots + self.intervals, "board word {i}");
        let p = self.map[i * 8..i * 8 + 8].as_ptr() as *const AtomicU64;
        // SAFETY: in bounds (checked), 8-byte aligned (the map is page-aligned and
        // offsets are multiples of 8), and the map lives as long as `self`; every access
        // goes through atomics.
        unsafe { &*p }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The client is connected and waits for [`Board::go`].
    pub fn set_ready(&self) {
        self.word(READY).store(1, Ordering::Release);
    }

    /// Whether the client said it is ready.
    pub fn ready(&self) -> bool {
        self.word(READY).load(Ordering::Acquire) == 1
    }

    /// Tell the client to start.
    pub fn go(&self) {
        self.word(GO).store(1, Ordering::Release);
    }

    /// Wait (polling every 50 us) up to `timeout` for [`Board::go`]; returns the instant
    /// it was seen, or `None` after the timeout.
    pub fn wait_go(&self, timeout: Duration) -> Option<Instant> {
        let end = Instant::now() + timeout;
        loop {
            if self.word(GO).load(Ordering::Acquire) == 1 {
                return Some(Instant::now());
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// The client reached an injected fault point; `what` (nonzero) says which.
    pub fn set_fault(&self, what: u64) {
        self.word(FAULT).store(what, Ordering::Release);
    }

    /// What [`Board::set_fault`] stored, or 0.
    pub fn fault(&self) -> u64 {
        self.word(FAULT).load(Ordering::Acquire)
    }

    /// Client slot `slot` had one more insert acknowledged.
    pub fn ack(&self, slot: usize) {
        let w = self.word(ACKED + slot);
        w.store(w.load(Ordering::Relaxed) + 1, Ordering::Release);
    }

    /// Inserts of client slot `slot` acknowledged so far.
    pub fn acked(&self, slot: usize) -> u64 {
        self.word(ACKED + slot).load(Ordering::Acquire)
    }

    /// One operation completed `since_go` after [`Board::go`] was seen.
    pub fn count(&self, since_go: Duration) {
        let i = ((since_go.as_nanos() / INTERVAL.as_nanos()) as usize).min(self.intervals - 1);
        let w = self.word(ACKED + self.slots + i);
        w.store(w.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    /// Operations per [`INTERVAL`] since `go`.
    pub fn intervals(&self) -> Vec<u64> {
        (0..self.intervals)
            .map(|i| self.word(ACKED + self.slots + i).load(Ordering::Acquire))
            .collect()
    }
}

impl Drop for Board {
    fn drop(&mut self) {
        if self.owner {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// What the timeline of a run with one client process faulted says.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultTimeline {
    /// Fewest operations the other processes completed together in one [`INTERVAL`]
    /// from the fault to the end of the measured window.
    pub min_survivor_interval: u64,
    /// Operations per second of every process before the fault (in the measured window).
    pub rate_before: f64,
    /// Operations per second of every process after the fault (the faulted one's
    /// included: a stopped process may come back).
    pub rate_after: f64,
    /// The same after the fault for the other processes only.
    pub survivors_after: f64,
    /// The longest run of consecutive intervals from the fault on in which the other
    /// processes together completed less than half their mean per interval before it:
    /// how long the fault held them back (the recovery, at [`INTERVAL`] resolution; 0
    /// when they never dipped).
    pub longest_dip: usize,
}

/// Summarize per-process timelines `ops[p][i]` (operations in interval `i`) for a fault
/// of process `victim` in interval `fault`, over the measured intervals `from..to`
/// (`from <= fault < to`). Returns `None` when the window is empty on either side.
pub fn fault_timeline(
    ops: &[Vec<u64>],
    victim: usize,
    from: usize,
    fault: usize,
    to: usize,
) -> Option<FaultTimeline> {
    if !(from <= fault && fault < to) || fault == from {
        return None;
    }
    let at = |p: &Vec<u64>, i: usize| p.get(i).copied().unwrap_or(0);
    let sum = |range: std::ops::Range<usize>, only_survivors: bool| -> u64 {
        ops.iter()
            .enumerate()
            .filter(|(p, _)| !only_survivors || *p != victim)
            .map(|(_, v)| range.clone().map(|i| at(v, i)).sum::<u64>())
            .sum()
    };
    let secs = |n: usize| n as f64 * INTERVAL.as_secs_f64();
    let min_survivor_interval = (fault..to)
        .map(|i| {
            ops.iter()
                .enumerate()
                .filter(|(p, _)| *p != victim)
                .map(|(_, v)| at(v, i))
                .sum::<u64>()
        })
        .min()
        .unwrap_or(0);
    let survivors_at = |i: usize| -> u64 {
        ops.iter()
            .enumerate()
            .filter(|(p, _)| *p != victim)
            .map(|(_, v)| at(v, i))
            .sum()
    };
    let half = sum(from..fault, true) as f64 / (fault - from) as f64 / 2.0;
    let (mut longest_dip, mut run) = (0, 0);
    for i in fault..to {
        if (survivors_at(i) as f64) < half {
            run += 1;
            longest_dip = longest_dip.max(run);
        } else {
            run = 0;
        }
    }
    Some(FaultTimeline {
        longest_dip,
        min_survivor_interval,
        rate_before: sum(from..fault, false) as f64 / secs(fault - from),
        rate_after: sum(fault..to, false) as f64 / secs(to - fault),
        survivors_after: sum(fault..to, true) as f64 / secs(to - fault),
    })
}

/// The first run of at least `len` consecutive intervals of `from..to` in which the
/// processes other than `victim` completed no operation at all, as the range of the run's
/// intervals (cut at `to`): the other clients stopped, which a fault must never cause (a
/// dead client's locks left held for good). `None` when there is none.
pub fn survivors_stalled(
    ops: &[Vec<u64>],
    victim: usize,
    from: usize,
    to: usize,
    len: usize,
) -> Option<std::ops::Range<usize>> {
    let mut start = None;
    for i in from..to {
        let n: u64 = ops
            .iter()
            .enumerate()
            .filter(|(p, _)| *p != victim)
            .map(|(_, v)| v.get(i).copied().unwrap_or(0))
            .sum();
        match (n, start) {
            (0, None) => start = Some(i),
            (0, Some(_)) => {}
            (_, Some(s)) if i - s >= len => return Some(s..i),
            (_, Some(_)) => start = None,
            (_, None) => {}
        }
    }
    start.filter(|&s| to - s >= len).map(|s| s..to)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_board_carries_ready_go_acks_and_intervals_across_two_mappings() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("board");
        let driver = Board::create(&p, 3, 4).unwrap();
        let client = Board::open(&p, 3, 4).unwrap();
        assert!(Board::open(&p, 2, 4).is_err(), "another shape is refused");
        assert!(!driver.ready());
        client.set_ready();
        assert!(driver.ready());
        assert_eq!(client.wait_go(Duration::from_millis(1)), None);
        driver.go();
        assert!(client.wait_go(Duration::from_millis(1)).is_some());
        assert_eq!(driver.fault(), 0);
        client.set_fault(0x1_0003);
        assert_eq!(driver.fault(), 0x1_0003);
        client.ack(2);
        client.ack(2);
        client.count(Duration::from_millis(5));
        client.count(Duration::from_millis(25));
        client.count(Duration::from_secs(9));
        assert_eq!((driver.acked(0), driver.acked(2)), (0, 2));
        assert_eq!(
            driver.intervals(),
            [1, 0, 1, 1],
            "the last interval takes the rest"
        );
        drop(client);
        assert!(p.exists(), "the client's mapping leaves the file");
        drop(driver);
        assert!(!p.exists(), "the driver's removes it");
    }

    #[test]
    fn the_fault_timeline_splits_at_the_fault_and_finds_the_survivors_dip() {
        // Two processes, 10 ops per interval each; process 0 killed at interval 4.
        let ops = vec![
            vec![10, 10, 10, 10, 3, 0, 0, 0],
            vec![10, 10, 10, 10, 12, 9, 11, 10],
        ];
        let t = fault_timeline(&ops, 0, 1, 4, 8).unwrap();
        assert_eq!(t.min_survivor_interval, 9);
        assert!((t.rate_before - 2000.0).abs() < 1e-6, "{t:?}");
        assert!((t.survivors_after - 1050.0).abs() < 1e-6, "{t:?}");
        assert!((t.rate_after - 1125.0).abs() < 1e-6, "{t:?}");
        assert_eq!(
            t.longest_dip, 0,
            "the survivor never fell below half its 10"
        );
        // A survivor interval of 0 is what the aim forbids: it shows.
        let stalled = vec![vec![10, 10, 0, 0], vec![10, 10, 0, 5]];
        assert_eq!(
            fault_timeline(&stalled, 0, 0, 2, 4)
                .unwrap()
                .min_survivor_interval,
            0
        );
        assert_eq!(
            fault_timeline(&ops, 0, 4, 4, 8),
            None,
            "no time before the fault"
        );
        // Survivor below half (5 of its 10) for 3 intervals, then for 1: the dip is 3.
        let dipped = vec![
            vec![10, 10, 0, 0, 0, 0, 0, 0],
            vec![10, 10, 4, 0, 2, 10, 4, 10],
        ];
        assert_eq!(fault_timeline(&dipped, 0, 0, 2, 8).unwrap().longest_dip, 3);
    }

    #[test]
    fn a_stall_of_the_survivors_is_found_only_when_long_enough() {
        let ops = vec![
            vec![5, 5, 5, 0, 0, 0, 0, 0, 0, 0],
            vec![5, 0, 0, 3, 0, 0, 0, 1, 0, 0],
            vec![5, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        ];
        // Process 0 is the victim: its ops do not count. Survivors idle at 1-2 (2
        // intervals), 4-6 (3), and 8-9 (2, cut at the window's end).
        assert_eq!(survivors_stalled(&ops, 0, 0, 10, 3), Some(4..7));
        assert_eq!(survivors_stalled(&ops, 0, 0, 10, 4), None);
        assert_eq!(survivors_stalled(&ops, 0, 0, 10, 2), Some(1..3));
        assert_eq!(survivors_stalled(&ops, 0, 8, 10, 2), Some(8..10));
        assert_eq!(survivors_stalled(&ops, 0, 8, 10, 3), None);
    }
}
