//! `index-bench`'s injected faults at a chosen step of a structure change, and its
//! planted repair bugs (Transactional Indexes on Disaggregated Memory with Repairable
//! Transaction, 4.3 and 6.4): client process 0 kills itself (SIGKILL) or stops itself
//! (SIGSTOP) when its first B-link split or RACE rehash reaches a commit step, after
//! saying so on its board ([`crate::client_board`]); the driver sees the death or the stop,
//! continues a stopped process later, and checks the index afterwards.
//!
//! The process signals itself rather than being signalled by the driver when the board
//! says it got there: a signal the client's thread sends itself (SIGKILL to the process,
//! SIGSTOP to the thread) takes effect before the call returns, so the client takes no
//! further step of its commit, while a driver polling the board would kill or stop it at
//! some later, unknown step. Everything here needs a
//! build with `rtx`'s feature `fault-injection` (test builds); see [`rtx::fault`].

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use rtx::fault::{CrashPoint, Plant};

use crate::client_board::Board;

/// The structure change a fault point belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// A B-link leaf split (`--index blink`).
    Split,
    /// A RACE subtable rehash (`--index race`).
    Rehash,
}

impl Change {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Change::Split => "split",
            Change::Rehash => "rehash",
        }
    }
}

/// A commit step of a structure change: `split:in-doing`, `rehash:locked`, ...
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultPoint {
    /// Which change.
    pub change: Change,
    /// Which step of its commit.
    pub point: CrashPoint,
}

impl fmt::Display for FaultPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.change.name(), self.point.name())
    }
}

/// Parse `CHANGE:POINT` (a clap value parser). Errors: an unknown change or point, with
/// the accepted ones.
pub fn parse_fault_point(s: &str) -> Result<FaultPoint, String> {
    let points = || {
        CrashPoint::ALL
            .iter()
            .map(|p| p.name())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (c, p) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?}: want CHANGE:POINT, e.g. split:in-doing"))?;
    let change = match c {
        "split" => Change::Split,
        "rehash" => Change::Rehash,
        _ => return Err(format!("{c:?}: the change is split or rehash")),
    };
    let point =
        CrashPoint::parse(p).ok_or_else(|| format!("{p:?}: the point is one of {}", points()))?;
    Ok(FaultPoint { change, point })
}

/// A planted repair bug on the command line (`--plant`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PlantArg {
    /// Release a DOING rTX's locks without re-running its TryCommit (the log stays DOING).
    NaiveRepair,
    /// Leave a DOING rTX alone: its locks stay held.
    IgnoreDoing,
}

impl From<PlantArg> for Plant {
    fn from(p: PlantArg) -> Plant {
        match p {
            PlantArg::NaiveRepair => Plant::NaiveRepair,
            PlantArg::IgnoreDoing => Plant::IgnoreDoing,
        }
    }
}

/// The board word for "client `id` reached `point`": `id << 8 | (point's index + 1)`,
/// never 0.
pub fn encode(point: CrashPoint, id: u16) -> u64 {
    let i = CrashPoint::ALL
        .iter()
        .position(|&p| p == point)
        .expect("every point is in ALL");
    ((id as u64) << 8) | (i as u64 + 1)
}

/// The point and rTX ID of a board word from [`encode`]; `None` for 0 or garbage.
pub fn decode(w: u64) -> Option<(CrashPoint, u16)> {
    let i = (w & 0xFF).checked_sub(1)? as usize;
    let id = u16::try_from(w >> 8).ok()?;
    Some((*CrashPoint::ALL.get(i)?, id))
}

/// This client process's board, for the hooks (plain functions, called deep in a commit).
static BOARD: OnceLock<Arc<Board>> = OnceLock::new();
/// Whether this process has stopped itself already (one pause per process).
static PAUSED: AtomicBool = AtomicBool::new(false);

/// Whether this process stopped itself and was continued: its clients then start no new
/// operation (see [`stop_self`]).
pub fn paused() -> bool {
    PAUSED.load(Ordering::SeqCst)
}

/// Give the hooks this process's board (once; later calls change nothing).
pub fn set_board(board: Arc<Board>) {
    let _ = BOARD.set(board);
}

/// An [`rtx::fault::CrashHook`]: say on the board where this client is, then SIGKILL this
/// process. Never returns.
pub fn kill_self(point: CrashPoint, id: u16) -> bool {
    if let Some(b) = BOARD.get() {
        b.set_fault(encode(point, id));
    }
    // SIGKILL to the process (kill -9): Linux marks it pending on every thread of the
    // group at once, this one included, so this thread dies before the call returns.
    // SAFETY: kill(2) of our own pid with a signal that cannot be caught, blocked or
    // ignored.
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    // Not reached; if it were, die anyway (the driver then sees SIGABRT and fails).
    std::process::abort()
}

/// An [`rtx::fault::CrashHook`]: the first time in this process, say on the board where
/// this client is and SIGSTOP this process (every thread) until the driver sends
/// SIGCONT; then, and at every later hit, let the commit go on. Once continued, the
/// process's clients finish the operations they had in flight and start no new one
/// ([`paused`]): the index the checks find is the one the pause, the others' repairs and
/// the late commit made, not one the stopped clients went on changing after.
pub fn stop_self(point: CrashPoint, id: u16) -> bool {
    if PAUSED.swap(true, Ordering::SeqCst) {
        return true;
    }
    if let Some(b) = BOARD.get() {
        b.set_fault(encode(point, id));
    }
    // Directed at this thread, not the process: a process-directed SIGSTOP goes to the
    // main thread, and this one would go on committing until the main thread got a core
    // and started the group stop (milliseconds on a busy machine: long enough to finish
    // the commit the test means to freeze). A thread-directed one is handled before the
    // call returns to this thread, and stops every thread of the process.
    // SAFETY: pthread_kill(3) on the calling thread; the default action of SIGSTOP stops
    // the process and the call returns once it is continued.
    unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGSTOP) };
    true
}

/// What a child process is doing, looked at without reaping it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChildState {
    /// Still running.
    Running,
    /// Stopped by a signal.
    Stopped,
    /// Exited or killed (not yet waited for).
    Ended,
}

/// The state of our child `pid`, leaving it waitable (`waitid` with `WNOWAIT`), so that
/// `std::process::Child` can still wait for it. Errors: `waitid`'s (e.g. not our child).
pub fn child_state(pid: libc::pid_t) -> std::io::Result<ChildState> {
    // SAFETY: a zeroed siginfo_t is a valid value; waitid(2) on our own child with
    // WNOHANG never blocks, and WNOWAIT leaves its state to be waited for again.
    let info = unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let r = libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WSTOPPED | libc::WNOHANG | libc::WNOWAIT,
        );
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        info
    };
    // SAFETY: waitid filled `info` for a child (si_pid is 0 when nothing changed).
    if unsafe { info.si_pid() } == 0 {
        return Ok(ChildState::Running);
    }
    Ok(match info.si_code {
        libc::CLD_STOPPED | libc::CLD_TRAPPED => ChildState::Stopped,
        _ => ChildState::Ended,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_points_parse_print_and_encode_round_trip() {
        for change in ["split", "rehash"] {
            for p in CrashPoint::ALL {
                let s = format!("{change}:{}", p.name());
                let f = parse_fault_point(&s).unwrap();
                assert_eq!(f.to_string(), s);
                assert_eq!(decode(encode(f.point, 513)), Some((p, 513)));
            }
        }
        for bad in ["split", "merge:locked", "split:late", "rehash:"] {
            assert!(parse_fault_point(bad).is_err(), "{bad}");
        }
        assert_eq!(decode(0), None);
        assert_eq!(decode(0x10_0009), None);
    }

    #[test]
    fn a_child_is_seen_running_stopped_and_ended_and_stays_waitable() {
        let mut c = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = c.id() as libc::pid_t;
        assert_eq!(child_state(pid).unwrap(), ChildState::Running);
        // SAFETY: signals to our own unwaited child.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        while child_state(pid).unwrap() == ChildState::Running {
            std::thread::yield_now();
        }
        assert_eq!(child_state(pid).unwrap(), ChildState::Stopped);
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        while child_state(pid).unwrap() != ChildState::Ended {
            std::thread::yield_now();
        }
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(c.wait().unwrap().signal(), Some(libc::SIGKILL));
    }
}
