//! Restarts that never go back: the oracle's epoch, persisted before it serves (this
//! crate's answer to Scythe 4.5's open question of TSO recovery).
//!
//! **The problem.** Clients advance the counter with one-sided FAA; the oracle's CPU
//! never sees a request. TiDB PD's trick (persist a high-water mark ahead of the counter,
//! stop serving at it, persist the next one) needs the server to refuse requests past
//! the mark, which an RNIC executing FAAs cannot do. And the counter's last value dies
//! with the process (it lives in NIC or host memory, not on disk).
//!
//! **The scheme.** A timestamp carries the oracle's *epoch* in its high 16 bits
//! ([`crate::timestamp`]). At every start the oracle, before it exports the counter:
//!
//! 1. reads the last epoch `e` from `<state-dir>/epoch` (absent: `e = 0`);
//! 2. writes `e + 1` to a temporary file, fsyncs it, renames it over `epoch`, and fsyncs
//!    the directory, so that the new epoch is durable before anything depends on it;
//! 3. sets its fresh counter to `(e + 1) << 48`, and only then exports it; clients learn
//!    the epoch from the export.
//!
//! **Why it holds.** Every timestamp incarnation `e` handed out has epoch bits `e`:
//! clients check the bits of every range they take and refuse a range that ran into the
//! next epoch ([`crate::TsoError::Exhausted`]). A later incarnation `e' > e` (guaranteed
//! by step 2: it read a value `>= e` from a file that was durable before `e` served)
//! hands out only values `>= e' << 48 + 1`, larger than every value of `e`. A client's FAA
//! aimed at the old incarnation cannot land in the new one: the old counter's MR died
//! with the old process (its QPs error out; on shm the dead peer is detected), and the
//! new counter is a different MR that a client reaches only through a new export
//! (reconnect), which carries the new epoch. A crash between step 2 and serving only
//! skips an epoch.
//!
//! **Limits.** The epoch file must survive (a lost or rolled-back state directory breaks
//! the guarantee: point `--state-dir` at durable storage, not tmpfs); two oracles must not
//! share a state directory at the same time, which [`StateDir`] enforces with an
//! exclusive `flock` on [`LOCK_FILE`] held for the oracle's lifetime; a client holding an old export must
//! reconnect; an incarnation serves at most `2^48 - 1` timestamps (then clients refuse
//! and the oracle must be restarted to open a new epoch); at most 65 535 starts per state
//! directory ([`EpochError::Exhausted`]), after which the oracle refuses to start.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use crate::timestamp::MAX_EPOCH;

/// Name of the epoch file inside the state directory (decimal epoch and a newline).
pub const EPOCH_FILE: &str = "epoch";

/// Name of the lock file inside the state directory: [`StateDir::open`] holds an
/// exclusive `flock` on it for the oracle's lifetime and writes its pid into it.
pub const LOCK_FILE: &str = "lock";

/// Errors of [`advance`] and [`StateDir::open`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EpochError {
    /// The state directory could not be created.
    #[error("creating the TSO state directory {path}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The epoch file exists but could not be read.
    #[error("reading the TSO epoch file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The epoch file does not hold a decimal epoch in `0 ..= 65535`.
    #[error("the TSO epoch file {path} does not hold an epoch (0..=65535)")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why parsing failed.
        #[source]
        source: std::num::ParseIntError,
    },
    /// The last epoch is [`MAX_EPOCH`]: no larger one exists, so the oracle must not
    /// serve (it could only repeat timestamps).
    #[error("the TSO epoch in {path} is exhausted (65535 starts); timestamps cannot grow past it")]
    Exhausted {
        /// The file.
        path: PathBuf,
    },
    /// The lock file could not be opened or locked for a reason other than another
    /// holder.
    #[error("locking the TSO state directory {path}")]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Another process (or another [`StateDir`] of this one) holds the state directory:
    /// two oracles on one directory would hand out the same epoch.
    #[error("the TSO state directory {} is in use by another oracle ({})", .dir.display(),
        .holder.map_or_else(|| "pid unknown".to_string(), |p| format!("pid {p}")))]
    InUse {
        /// The state directory.
        dir: PathBuf,
        /// The holder's pid, as it wrote it into [`LOCK_FILE`] (if readable).
        holder: Option<u32>,
    },
    /// Writing or syncing the new epoch failed; the oracle must not serve.
    #[error("persisting the TSO epoch to {path}")]
    Persist {
        /// The file or directory being written or synced.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// The epoch stored in `dir`, 0 when there is none yet (nothing is written).
///
/// Errors: [`EpochError::Read`], [`EpochError::Parse`].
pub fn load(dir: &Path) -> Result<u16, EpochError> {
    let path = dir.join(EPOCH_FILE);
    match fs::read_to_string(&path) {
        Ok(s) => s
            .trim()
            .parse::<u16>()
            .map_err(|source| EpochError::Parse { path, source }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(source) => Err(EpochError::Read { path, source }),
    }
}

/// Start a new incarnation: read the last epoch in `dir` (created if missing), persist
/// the next one durably (file written to a temporary, fsynced, renamed, directory
/// fsynced) and return it. Call before exporting the counter.
///
/// Errors: [`EpochError::CreateDir`], [`EpochError::Read`], [`EpochError::Parse`],
/// [`EpochError::Exhausted`] at epoch 65535, [`EpochError::Persist`].
pub fn advance(dir: &Path) -> Result<u16, EpochError> {
    fs::create_dir_all(dir).map_err(|source| EpochError::CreateDir {
        path: dir.to_path_buf(),
        source,
    })?;
    let path = dir.join(EPOCH_FILE);
    let last = load(dir)?;
    if last == MAX_EPOCH {
        return Err(EpochError::Exhausted { path });
    }
    let next = last + 1;
    write_durably(dir, EPOCH_FILE, u64::from(next))
        .map_err(|(path, source)| EpochError::Persist { path, source })?;
    Ok(next)
}

/// Replace `dir/file` with `value` (decimal and a newline) durably: written to a
/// temporary file, fsynced, renamed over `file`, and the directory fsynced, so that
/// after a crash the file holds either the old value or `value`, never a torn one. The
/// epoch files of the oracle and of lockd use it.
///
/// Errors: the file or directory that failed, with the OS error.
pub fn write_durably(dir: &Path, file: &str, value: u64) -> Result<(), (PathBuf, io::Error)> {
    let path = dir.join(file);
    let tmp = dir.join(format!("{file}.tmp"));
    let at = |p: &Path| {
        let p = p.to_path_buf();
        move |e| (p, e)
    };
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .map_err(at(&tmp))?;
    writeln!(f, "{value}").map_err(at(&tmp))?;
    f.sync_all().map_err(at(&tmp))?;
    drop(f);
    fs::rename(&tmp, &path).map_err(at(&path))?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(at(dir))
}

/// A state directory held by this oracle: an exclusive, non-blocking `flock` on
/// [`LOCK_FILE`] that lasts until the value is dropped (or the process dies, when the
/// kernel drops it), so that a second oracle on the same directory fails at start
/// instead of opening the same epoch (the limit in the module docs).
#[derive(Debug)]
pub struct StateDir {
    dir: PathBuf,
    /// The locked file; closing it releases the lock.
    _lock: File,
}

impl StateDir {
    /// Create `dir` if missing, take the exclusive lock on its [`LOCK_FILE`] and write
    /// this process's pid into it.
    ///
    /// Errors: [`EpochError::CreateDir`]; [`EpochError::InUse`] when another holder has
    /// the lock (naming its pid if the file says it); [`EpochError::Lock`] for other
    /// failures to open, lock or write the file.
    pub fn open(dir: &Path) -> Result<Self, EpochError> {
        let lock = lock_dir(dir, LOCK_FILE).map_err(|e| match e {
            DirLockError::CreateDir { path, source } => EpochError::CreateDir { path, source },
            DirLockError::Lock { path, source } => EpochError::Lock { path, source },
            DirLockError::InUse { dir, holder } => EpochError::InUse { dir, holder },
        })?;
        Ok(Self {
            dir: dir.to_path_buf(),
            _lock: lock,
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// [`advance`] in the held directory.
    ///
    /// Errors: as [`advance`].
    pub fn advance(&self) -> Result<u16, EpochError> {
        advance(&self.dir)
    }
}

/// Why [`lock_dir`] failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum DirLockError {
    /// The directory could not be created.
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The lock file could not be opened, locked or written.
    Lock {
        /// The lock file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// Another process holds the lock.
    InUse {
        /// The directory.
        dir: PathBuf,
        /// The holder's pid as it wrote it into the lock file, if readable.
        holder: Option<u32>,
    },
}

/// Create `dir` if missing and take an exclusive, non-blocking `flock` on its file
/// `lock_file`, writing this process's pid into it; the lock lasts as long as the
/// returned file is open (or the process lives). The state directories of the oracle
/// and of lockd use it, so that two services never share one.
///
/// Errors: [`DirLockError`].
pub fn lock_dir(dir: &Path, lock_file: &str) -> Result<File, DirLockError> {
    use std::os::fd::AsRawFd as _;
    fs::create_dir_all(dir).map_err(|source| DirLockError::CreateDir {
        path: dir.to_path_buf(),
        source,
    })?;
    let path = dir.join(lock_file);
    let lock_err = |source| DirLockError::Lock {
        path: path.clone(),
        source,
    };
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(lock_err)?;
    // SAFETY: `f` owns an open descriptor for the duration of the call; flock takes no
    // pointers.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            let holder = fs::read_to_string(&path)
                .ok()
                .and_then(|s| s.trim().parse().ok());
            return Err(DirLockError::InUse {
                dir: dir.to_path_buf(),
                holder,
            });
        }
        return Err(lock_err(e));
    }
    f.set_len(0).map_err(lock_err)?;
    writeln!(f, "{}", std::process::id()).map_err(lock_err)?;
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tso-epoch-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn each_start_persists_a_larger_epoch() {
        let d = scratch("grow");
        assert_eq!(load(&d).unwrap(), 0);
        assert_eq!(advance(&d).unwrap(), 1);
        assert_eq!(advance(&d).unwrap(), 2);
        assert_eq!(load(&d).unwrap(), 2);
        assert_eq!(fs::read_to_string(d.join(EPOCH_FILE)).unwrap(), "2\n");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn exhausted_and_corrupt_files_refuse_to_start() {
        let d = scratch("bad");
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join(EPOCH_FILE), "65535\n").unwrap();
        assert!(matches!(advance(&d), Err(EpochError::Exhausted { .. })));
        fs::write(d.join(EPOCH_FILE), "65536\n").unwrap();
        assert!(matches!(advance(&d), Err(EpochError::Parse { .. })));
        fs::write(d.join(EPOCH_FILE), "").unwrap();
        assert!(matches!(advance(&d), Err(EpochError::Parse { .. })));
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_second_holder_of_a_state_dir_is_refused_with_the_first_ones_pid() {
        let d = scratch("lock");
        let first = StateDir::open(&d).unwrap();
        assert_eq!(first.advance().unwrap(), 1);
        match StateDir::open(&d) {
            Err(EpochError::InUse { dir, holder }) => {
                assert_eq!(dir, d);
                assert_eq!(holder, Some(std::process::id()));
                let msg = EpochError::InUse { dir, holder }.to_string();
                assert!(msg.contains(&d.display().to_string()), "{msg}");
                assert!(
                    msg.contains(&format!("pid {}", std::process::id())),
                    "{msg}"
                );
            }
            other => panic!("a second oracle got the directory: {other:?}"),
        }
        drop(first);
        let again = StateDir::open(&d).expect("free once the first is gone");
        assert_eq!(again.advance().unwrap(), 2);
        drop(again);
        fs::remove_dir_all(&d).unwrap();
    }
}
