//! Faults injected on purpose, for tests that kill, stop or mis-program real client
//! processes (Transactional Indexes on Disaggregated Memory with Repairable Transaction,
//! 4.3; the acceptance tests of a false suspicion and of kill -9 inside a structure
//! change). The types are in every build so that a binary can name them in its flags;
//! arming them needs the `fault-injection` feature, which only test builds enable (a
//! normal build refuses with [`NotEnabled`] and compiles no check of them into the
//! commit path).

/// Whether this build has the `fault-injection` feature (the switches below work).
pub const ENABLED: bool = cfg!(feature = "fault-injection");

/// Where a committing owner stops as if it had crashed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CrashPoint {
    /// Log and new values written, nothing locked.
    LogWritten,
    /// Write set locked, before validation.
    Locked,
    /// Header moved to DOING, nothing installed.
    InDoing,
    /// Every dptr installed, no lock released.
    Installed,
}

impl CrashPoint {
    /// Every point, in commit order.
    pub const ALL: [CrashPoint; 4] = [
        CrashPoint::LogWritten,
        CrashPoint::Locked,
        CrashPoint::InDoing,
        CrashPoint::Installed,
    ];

    /// The point's name on command lines: `log-written`, `locked`, `in-doing`,
    /// `installed`.
    pub fn name(self) -> &'static str {
        match self {
            CrashPoint::LogWritten => "log-written",
            CrashPoint::Locked => "locked",
            CrashPoint::InDoing => "in-doing",
            CrashPoint::Installed => "installed",
        }
    }

    /// The point named `s` (see [`CrashPoint::name`]), or `None`.
    pub fn parse(s: &str) -> Option<CrashPoint> {
        Self::ALL.into_iter().find(|p| p.name() == s)
    }

    /// The commit step's tag passed to `Client::crash_at`.
    #[cfg(any(test, feature = "fault-injection"))]
    pub(crate) fn step(self) -> &'static str {
        match self {
            CrashPoint::LogWritten => "log",
            CrashPoint::Locked => "locks",
            CrashPoint::InDoing => "doing",
            CrashPoint::Installed => "install",
        }
    }
}

/// Called when an armed client reaches its crash point, with the point and the client's
/// rTX ID, before anything else of the commit runs. A process-level test makes it end the
/// process there (SIGKILL to itself: it never returns) or stop it (SIGSTOP to itself,
/// until the driver continues it). Returning `true` lets the commit go on (a pause);
/// `false` stops it with [`crate::mem::MemError::Crashed`], as in the in-process tests.
pub type CrashHook = fn(CrashPoint, u16) -> bool;

/// A planted bug in a client's repairs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plant {
    /// "Naive" repair: an expired lock whose rTX is in DOING is released (every entry's
    /// lock at its logged version) without re-executing TryCommit; the log stays DOING.
    /// Under a false suspicion the repairer's own writes then race the live owner's
    /// installs (C.10 test 4's planted bug).
    NaiveRepair,
    /// A repair leaves a DOING log alone (as if someone else repaired it): the locks of a
    /// dead rTX in DOING stay held forever (C.10 test 5's planted bug).
    IgnoreDoing,
}

/// A fault switch in a build without the `fault-injection` feature (`Client::arm_crash`,
/// `Client::plant`).
#[derive(Debug, thiserror::Error)]
#[error("fault injection needs a build with rtx's feature fault-injection (test builds)")]
pub struct NotEnabled;
