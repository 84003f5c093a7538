//! Faults injected on purpose, so tests can show that the checkers catch what they must
//! (a checker that cannot fail proves nothing). Compiled only with the `fault-injection`
//! feature, which only test builds enable; there is no flag or variable that turns these
//! on in a binary.
//!
//! The switches are process-wide: a test that sets one should run in a test binary of its
//! own (one file in `tests/`), so that it cannot affect other tests.

use std::sync::atomic::{AtomicBool, Ordering};

static SKIP_READ_ONLY_VALIDATION: AtomicBool = AtomicBool::new(false);
static FAIL_WRITE_BACK: AtomicBool = AtomicBool::new(false);
static CORRUPT_READS: AtomicBool = AtomicBool::new(false);

/// Validation checks nothing for objects a transaction only read (neither lock nor
/// version): read skew and write skew can then commit.
pub fn skip_read_only_validation(on: bool) {
    SKIP_READ_ONLY_VALIDATION.store(on, Ordering::SeqCst);
}

pub(crate) fn skipping_read_only_validation() -> bool {
    SKIP_READ_ONLY_VALIDATION.load(Ordering::Relaxed)
}

/// Write-back fails before writing anything, as a failed WRITE would.
pub fn fail_write_back(on: bool) {
    FAIL_WRITE_BACK.store(on, Ordering::SeqCst);
}

pub(crate) fn failing_write_back() -> bool {
    FAIL_WRITE_BACK.load(Ordering::Relaxed)
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
