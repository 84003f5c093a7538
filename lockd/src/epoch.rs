//! The lock service's epoch, persisted before it serves, so that a restarted service
//! fences its predecessor's clients (the design's failure model: lockd restarts fence
//! old holders; the scheme is the `tso` crate's epoch file, for a 64-bit epoch).
//!
//! A restarted lockd serves a fresh, empty table in new memory regions: a client that
//! still holds its predecessor's export would, without fencing, take tickets in a table
//! it misreads or pass on tickets the new table never issued. The service's epoch goes out
//! in its export and every request names it ([`crate::service::LockTable::with_epoch`]);
//! a request naming another is refused, and the client reconnects.
//!
//! At every start, [`StateDir::advance`] reads the last epoch `e` from
//! `<state-dir>/`[`EPOCH_FILE`] (absent: 0), writes `e + 1` to a temporary file, fsyncs
//! it, renames it over the epoch file and fsyncs the directory: the new epoch is durable
//! before any client sees it, and larger than every earlier start's. [`StateDir::open`]
//! holds an exclusive `flock` on [`LOCK_FILE`] for the service's lifetime, so two services
//! never share a directory (they would open the same epoch).

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

/// Name of the epoch file in the state directory (decimal epoch and a newline).
pub const EPOCH_FILE: &str = "lockd-epoch";
/// Name of the lock file in the state directory (the holder's pid).
pub const LOCK_FILE: &str = "lockd-lock";

/// Errors of [`StateDir`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EpochError {
    /// The state directory could not be created.
    #[error("creating the lockd state directory {path}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The lock file could not be opened, locked or written.
    #[error("locking the lockd state directory {path}")]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Another service holds the directory.
    #[error("the lockd state directory {} is in use by another lock service ({})", .dir.display(),
        .holder.map_or_else(|| "pid unknown".to_string(), |p| format!("pid {p}")))]
    InUse {
        /// The state directory.
        dir: PathBuf,
        /// The holder's pid, as it wrote it into [`LOCK_FILE`] (if readable).
        holder: Option<u32>,
    },
    /// The epoch file exists but could not be read.
    #[error("reading the lockd epoch file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The epoch file does not hold a decimal epoch below `u64::MAX`.
    #[error("the lockd epoch file {path} does not hold an epoch")]
    Parse {
        /// The file.
        path: PathBuf,
    },
    /// Writing or syncing the new epoch failed; the service must not serve.
    #[error("persisting the lockd epoch to {path}")]
    Persist {
        /// The file or directory being written or synced.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// A state directory held by this service (module docs): the lock lasts until the value
/// is dropped or the process dies.
#[derive(Debug)]
pub struct StateDir {
    dir: PathBuf,
    _lock: File,
}

impl StateDir {
    /// Create `dir` if missing and take the exclusive lock on its [`LOCK_FILE`], writing
    /// this process's pid into it.
    ///
    /// Errors: [`EpochError::CreateDir`]; [`EpochError::InUse`] when another holder has
    /// the lock; [`EpochError::Lock`].
    pub fn open(dir: &Path) -> Result<Self, EpochError> {
        use tso::epoch::DirLockError;
        let lock = tso::epoch::lock_dir(dir, LOCK_FILE).map_err(|e| match e {
            DirLockError::CreateDir { path, source } => EpochError::CreateDir { path, source },
            DirLockError::Lock { path, source } => EpochError::Lock { path, source },
            DirLockError::InUse { dir, holder } => EpochError::InUse { dir, holder },
            // A failure tso's lock_dir learns to report later: the lock was not taken.
            other => EpochError::Lock {
                path: dir.join(LOCK_FILE),
                source: io::Error::other(format!("{other:?}")),
            },
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

    /// The last epoch persisted here, 0 when there is none yet.
    ///
    /// Errors: [`EpochError::Read`], [`EpochError::Parse`].
    pub fn load(&self) -> Result<u64, EpochError> {
        load(&self.dir)
    }

    /// Persist the next epoch durably (module docs) and return it (at least 1).
    ///
    /// Errors: those of [`Self::load`], [`EpochError::Persist`].
    pub fn advance(&self) -> Result<u64, EpochError> {
        let next = self.load()? + 1;
        tso::epoch::write_durably(&self.dir, EPOCH_FILE, next)
            .map_err(|(path, source)| EpochError::Persist { path, source })?;
        Ok(next)
    }
}

/// The last epoch persisted in state directory `dir`, 0 when there is none yet; reads
/// without taking the directory's lock (a launcher reads a running service's epoch).
///
/// Errors: [`EpochError::Read`], [`EpochError::Parse`].
pub fn load(dir: &Path) -> Result<u64, EpochError> {
    let path = dir.join(EPOCH_FILE);
    match fs::read_to_string(&path) {
        Ok(s) => s
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|&e| e < u64::MAX)
            .ok_or(EpochError::Parse { path }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(source) => Err(EpochError::Read { path, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("lockd-epoch-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn each_start_persists_a_larger_epoch_and_one_holder_at_a_time() {
        let d = scratch("grow");
        let s = StateDir::open(&d).unwrap();
        assert_eq!(s.advance().unwrap(), 1);
        assert_eq!(s.advance().unwrap(), 2);
        match StateDir::open(&d) {
            Err(EpochError::InUse { holder, .. }) => {
                assert_eq!(holder, Some(std::process::id()))
            }
            other => panic!("a second service got the directory: {other:?}"),
        }
        drop(s);
        let s = StateDir::open(&d).unwrap();
        assert_eq!(s.advance().unwrap(), 3);
        fs::write(d.join(EPOCH_FILE), "nonsense\n").unwrap();
        assert!(matches!(s.advance(), Err(EpochError::Parse { .. })));
        drop(s);
        fs::remove_dir_all(&d).unwrap();
    }
}
