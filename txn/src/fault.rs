//! Faults injected on purpose, so tests can show that the checkers catch what they must
//! (a checker that cannot fail proves nothing). Compiled only with the `fault-injection`
//! feature, which only test builds enable; there is no flag or variable that turns these
//! on in a binary.
//!
//! One exception, for tests that kill a child process at a chosen point of its commit:
//! in such a (test) build a child reads `TXN_CRASH_AT=<point>:<nth>` (see
//! [`CrashPoint`]) and aborts itself there.
//!
//! The switches are process-wide: a test that sets one should run in a test binary of its
//! own (one file in `tests/`), so that it cannot affect other tests.

use std::sync::atomic::{AtomicBool, Ordering};

static SKIP_READ_ONLY_VALIDATION: AtomicBool = AtomicBool::new(false);
static FAIL_WRITE_BACK: AtomicBool = AtomicBool::new(false);
static CORRUPT_READS: AtomicBool = AtomicBool::new(false);

/// Validation checks nothing for objects a transaction only read (neither lock nor
/// version): read skew and write skew can then commit. Lotus, which does not validate,
/// takes no read locks on them instead.
pub fn skip_read_only_validation(on: bool) {
    SKIP_READ_ONLY_VALIDATION.store(on, Ordering::SeqCst);
}

pub(crate) fn skipping_read_only_validation() -> bool {
    SKIP_READ_ONLY_VALIDATION.load(Ordering::Relaxed)
}

static LOTUS_SKIP_INVISIBLE: AtomicBool = AtomicBool::new(false);

/// Lotus's snapshot readers skip INVISIBLE cells instead of waiting for them (the
/// INVISIBLE rule of [`crate::lotus`] off): a reader can see half of a commit whose
/// timestamp falls below its start.
pub fn lotus_skip_invisible(on: bool) {
    LOTUS_SKIP_INVISIBLE.store(on, Ordering::SeqCst);
}

pub(crate) fn lotus_skipping_invisible() -> bool {
    LOTUS_SKIP_INVISIBLE.load(Ordering::Relaxed)
}

static LOTUS_SKIP_VTC_UPDATE: AtomicBool = AtomicBool::new(false);

/// Lotus's local writers leave their cached CVTs in the version table cache as they
/// were instead of replacing them after the write-visible step (rule 3 of
/// [`crate::vt_cache`] off): the next local lock holder reads a superseded version.
pub fn lotus_skip_vtc_update(on: bool) {
    LOTUS_SKIP_VTC_UPDATE.store(on, Ordering::SeqCst);
}

pub(crate) fn lotus_skipping_vtc_update() -> bool {
    LOTUS_SKIP_VTC_UPDATE.load(Ordering::Relaxed)
}

static DROP_SCAN_ENTRIES: AtomicBool = AtomicBool::new(false);

/// Range-index scans drop their second key ([`crate::range_index::RangeIndex::scan`]):
/// a scan misses a row that is there.
pub fn drop_scan_entries(on: bool) {
    DROP_SCAN_ENTRIES.store(on, Ordering::SeqCst);
}

pub(crate) fn dropping_scan_entries() -> bool {
    DROP_SCAN_ENTRIES.load(Ordering::Relaxed)
}

/// Write-back fails before writing anything, as a failed WRITE would.
pub fn fail_write_back(on: bool) {
    FAIL_WRITE_BACK.store(on, Ordering::SeqCst);
}

pub(crate) fn failing_write_back() -> bool {
    FAIL_WRITE_BACK.load(Ordering::Relaxed)
}

static SKIP_BACKUP_EVERY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static INSTALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Every `every`-th install to a replicated partition WRITEs the primary only, skipping
/// its backups (0: never), as a commit that forgot its backups would: the replica audit
/// must find the difference.
pub fn skip_backup_install(every: u64) {
    SKIP_BACKUP_ENV.call_once(|| {});
    INSTALLS.store(0, Ordering::SeqCst);
    SKIP_BACKUP_EVERY.store(every, Ordering::SeqCst);
}

static SKIP_BACKUP_ENV: std::sync::Once = std::sync::Once::new();

/// Whether this install (of a partition with backups when `replicated`) skips them. In
/// a test build a child process reads `TXN_SKIP_BACKUP_INSTALL=<every>` once, so that
/// tests can plant the bug in the coordinators of a `txn-bench` they start.
pub(crate) fn skipping_backup_install(replicated: bool) -> bool {
    SKIP_BACKUP_ENV.call_once(|| {
        if let Some(n) = std::env::var("TXN_SKIP_BACKUP_INSTALL")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
        {
            SKIP_BACKUP_EVERY.store(n, Ordering::SeqCst);
        }
    });
    let every = SKIP_BACKUP_EVERY.load(Ordering::Relaxed);
    if every == 0 || !replicated {
        return false;
    }
    (INSTALLS.fetch_add(1, Ordering::Relaxed) + 1).is_multiple_of(every)
}

static MIGRATION_UNBLOCKED: AtomicBool = AtomicBool::new(false);
static MIGRATION_ENV: std::sync::Once = std::sync::Once::new();

/// Commits to a partition being copied to a new backup (re-replication,
/// [`crate::view::View::start_migration`]) are not held back: one that lands on the
/// primary behind the copy is missing from the new backup, which the replica audit
/// must find.
pub fn unblock_migration(on: bool) {
    MIGRATION_ENV.call_once(|| {});
    MIGRATION_UNBLOCKED.store(on, Ordering::SeqCst);
}

/// Whether [`unblock_migration`] is planted. In a test build a child process reads
/// `TXN_UNBLOCK_MIGRATION=1` once, so that tests can plant the bug in the coordinators
/// of a `txn-bench` they start.
pub(crate) fn migration_unblocked() -> bool {
    MIGRATION_ENV.call_once(|| {
        if std::env::var("TXN_UNBLOCK_MIGRATION").is_ok_and(|v| v == "1") {
            MIGRATION_UNBLOCKED.store(true, Ordering::SeqCst);
        }
    });
    MIGRATION_UNBLOCKED.load(Ordering::Relaxed)
}

static BACKUP_READS_RW: AtomicBool = AtomicBool::new(false);
static BACKUP_READS_RW_ENV: std::sync::Once = std::sync::Once::new();

/// FORD's backup-enabled reads ([`crate::config::TxnConfig::ford_backup_reads`]) also in
/// read-write transactions, for the objects they only read: validated on a backup,
/// whose lock word never holds a writer's lock, such an object passes validation while
/// a writer holds it at the primary, so write skew commits ([`crate::ford`]).
pub fn ford_backup_reads_in_read_write(on: bool) {
    BACKUP_READS_RW_ENV.call_once(|| {});
    BACKUP_READS_RW.store(on, Ordering::SeqCst);
}

/// Whether [`ford_backup_reads_in_read_write`] is planted. In a test build a child
/// process reads `TXN_FORD_BACKUP_READS_RW=1` once.
pub(crate) fn ford_backup_reads_in_rw() -> bool {
    BACKUP_READS_RW_ENV.call_once(|| {
        if std::env::var("TXN_FORD_BACKUP_READS_RW").is_ok_and(|v| v == "1") {
            BACKUP_READS_RW.store(true, Ordering::SeqCst);
        }
    });
    BACKUP_READS_RW.load(Ordering::Relaxed)
}

/// Every value a transaction reads ([`crate::coordinator::Txn::get_mixed`] and the reads
/// built on it) comes back with its last byte flipped, as a torn or misdirected READ
/// would deliver it; the data in memory stays intact.
pub fn corrupt_reads(on: bool) {
    CORRUPT_READS.store(on, Ordering::SeqCst);
}

pub(crate) fn corrupting_reads() -> bool {
    CORRUPT_READS.load(Ordering::Relaxed)
}

/// A point in a commit where a test can make its coordinator die (the recovery design's
/// crash points: after locking, after the log, after the first install, after all
/// installs, after the first unlock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashPoint {
    /// Locks taken and validated, nothing logged.
    AfterLock,
    /// The commit log written, no install issued.
    AfterLog,
    /// One install ACKed (others may be in flight).
    AfterFirstInstall,
    /// Every install ACKed, no lock released.
    AfterInstalls,
    /// Lotus: one memory node's write-visible WRITEs ACKed, the others' not sent (the
    /// other protocols never reach it).
    AfterFirstPublish,
    /// One lock word released (others may be in flight).
    AfterFirstUnlock,
}

impl CrashPoint {
    /// Every point, in commit order.
    pub const ALL: [CrashPoint; 6] = [
        CrashPoint::AfterLock,
        CrashPoint::AfterLog,
        CrashPoint::AfterFirstInstall,
        CrashPoint::AfterInstalls,
        CrashPoint::AfterFirstPublish,
        CrashPoint::AfterFirstUnlock,
    ];

    /// Whether only Lotus's commits pass this point (only Lotus publishes).
    pub fn lotus_only(self) -> bool {
        self == CrashPoint::AfterFirstPublish
    }

    /// The point's name (`after-lock`, `after-log`, ...), as `TXN_CRASH_AT` takes it.
    pub fn name(self) -> &'static str {
        match self {
            CrashPoint::AfterLock => "after-lock",
            CrashPoint::AfterLog => "after-log",
            CrashPoint::AfterFirstInstall => "after-first-install",
            CrashPoint::AfterInstalls => "after-installs",
            CrashPoint::AfterFirstPublish => "after-first-publish",
            CrashPoint::AfterFirstUnlock => "after-first-unlock",
        }
    }

    /// The point named `s`.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == s)
    }
}

/// What reaching an armed crash point does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashAction {
    /// `std::process::abort()`: the process dies as under kill -9 (child processes).
    Abort,
    /// The coordinator stops there for good (its future never completes and holds what
    /// it holds), as a dead node's would, while the process lives on (in-process tests).
    Freeze,
}

struct Armed {
    point: CrashPoint,
    nth: u64,
    action: CrashAction,
}

static CRASH: std::sync::Mutex<Option<Armed>> = std::sync::Mutex::new(None);
static CRASH_ARMED: AtomicBool = AtomicBool::new(false);
static CRASH_SEEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static CRASH_ENV: std::sync::Once = std::sync::Once::new();
static FROZEN: AtomicBool = AtomicBool::new(false);

/// Whether a coordinator froze at a crash point armed with [`CrashAction::Freeze`]
/// (since the last [`crash_at`]).
pub fn frozen() -> bool {
    FROZEN.load(Ordering::SeqCst)
}

/// Arm `point`: the `nth` time (from 1) a coordinator of this process reaches it,
/// `action` happens. `None` disarms.
pub fn crash_at(armed: Option<(CrashPoint, u64, CrashAction)>) {
    CRASH_ENV.call_once(|| {});
    FROZEN.store(false, Ordering::SeqCst);
    let mut c = CRASH.lock().unwrap_or_else(|e| e.into_inner());
    CRASH_SEEN.store(0, Ordering::SeqCst);
    *c = armed.map(|(point, nth, action)| Armed {
        point,
        nth: nth.max(1),
        action,
    });
    CRASH_ARMED.store(c.is_some(), Ordering::SeqCst);
}

/// Arm from the environment of a child process: `TXN_CRASH_AT=<point>:<nth>` (e.g.
/// `after-first-install:50`) aborts the process there. Read once; a malformed value is
/// reported and ignored.
fn arm_from_env() {
    CRASH_ENV.call_once(|| {
        let Ok(v) = std::env::var("TXN_CRASH_AT") else {
            return;
        };
        let parsed = v
            .split_once(':')
            .and_then(|(p, n)| Some((CrashPoint::parse(p)?, n.parse::<u64>().ok()?)));
        match parsed {
            Some((p, n)) => {
                let mut c = CRASH.lock().unwrap_or_else(|e| e.into_inner());
                *c = Some(Armed {
                    point: p,
                    nth: n.max(1),
                    action: CrashAction::Abort,
                });
                CRASH_ARMED.store(true, Ordering::SeqCst);
            }
            None => eprintln!("TXN_CRASH_AT={v}: expected <point>:<nth>, ignored"),
        }
    });
}

/// Whether `p` is armed (its `nth` time not reached yet).
pub(crate) fn crash_armed(p: CrashPoint) -> bool {
    arm_from_env();
    if !CRASH_ARMED.load(Ordering::Relaxed) {
        return false;
    }
    let c = CRASH.lock().unwrap_or_else(|e| e.into_inner());
    matches!(&*c, Some(a) if a.point == p && CRASH_SEEN.load(Ordering::SeqCst) < a.nth)
}

/// Reached `p`: dies or freezes here if armed for it.
pub(crate) async fn crash_point(p: CrashPoint) {
    arm_from_env();
    if !CRASH_ARMED.load(Ordering::Relaxed) {
        return;
    }
    let action = {
        let c = CRASH.lock().unwrap_or_else(|e| e.into_inner());
        match &*c {
            Some(a) if a.point == p => {
                let seen = CRASH_SEEN.fetch_add(1, Ordering::SeqCst) + 1;
                (seen == a.nth).then_some(a.action)
            }
            _ => None,
        }
    };
    match action {
        Some(CrashAction::Abort) => {
            eprintln!("crash point {} reached: aborting", p.name());
            std::process::abort();
        }
        Some(CrashAction::Freeze) => {
            FROZEN.store(true, Ordering::SeqCst);
            std::future::pending::<()>().await
        }
        None => {}
    }
}

/// Recovery broken on purpose, one way at a time, to show the checks catch each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecoveryBug {
    /// Every logged transaction is rolled forward (a half install stays visible).
    NoRollBack,
    /// Roll forward only when every logged cell holds the logged version, as if a
    /// later writer could not have reused a cell after the dead node began unlocking.
    RollBackUnlessAllLanded,
    /// The dead incarnation's lock words and guards are not swept.
    NoSweep,
    /// Its tickets are handed on before its logs are settled (the order reversed), and
    /// recovery then pauses 20 ms, the window in which a waiting writer gets a lock on
    /// the dead node's half-installed objects.
    ReleaseTicketsFirst,
}

static RECOVERY_BUG: std::sync::Mutex<Option<RecoveryBug>> = std::sync::Mutex::new(None);

/// Plant `bug` in [`crate::recovery`] (`None`: correct recovery).
pub fn recovery_bug(bug: Option<RecoveryBug>) {
    *RECOVERY_BUG.lock().unwrap_or_else(|e| e.into_inner()) = bug;
}

pub(crate) fn planted_recovery_bug() -> Option<RecoveryBug> {
    *RECOVERY_BUG.lock().unwrap_or_else(|e| e.into_inner())
}
