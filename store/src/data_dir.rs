//! The data directory: its layout, and the lock that keeps a second daemon out.
//!
//! ```text
//! DATA/
//!   LOCK              flock(2)-held by the running daemon; holds its pid
//!   wal/              write-ahead log segments, <first-lsn:020>.wal
//!   checkpoint/       MANIFEST, base-<id>.ckpt, delta-<id>.ckpt
//!   cubed.sock        default socket path
//! ```

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::error::StoreError;
use crate::storage::Storage;

pub struct DataDir {
    root: PathBuf,
    // Held for the life of the process; the kernel drops the lock when the
    // process dies, so a `kill -9` never leaves a stale lock behind. A
    // simulated disk has no lock (it lives in one process).
    _lock: Option<File>,
}

impl DataDir {
    /// Creates the directory tree if needed and takes the exclusive lock.
    pub fn open(storage: &dyn Storage, root: &Path) -> Result<DataDir, StoreError> {
        create_dir_durably(storage, root)?;
        let lock = if storage.is_real() {
            Some(lock_data_dir(root)?)
        } else {
            None
        };
        let dir = DataDir {
            root: root.to_path_buf(),
            _lock: lock,
        };
        create_dir_durably(storage, &dir.wal_dir())?;
        create_dir_durably(storage, &dir.checkpoint_dir())?;
        Ok(dir)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn wal_dir(&self) -> PathBuf {
        self.root.join("wal")
    }

    pub fn checkpoint_dir(&self) -> PathBuf {
        self.root.join("checkpoint")
    }
}

pub(crate) fn lock_data_dir(root: &Path) -> Result<File, StoreError> {
    {
        let lock_path = root.join("LOCK");
        let mut lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(|e| StoreError::io(&lock_path, e))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = lock.read_to_string(&mut holder);
                return Err(StoreError::Locked {
                    path: root.to_path_buf(),
                    holder: holder.trim().to_string(),
                });
            }
            Err(TryLockError::Error(e)) => return Err(StoreError::io(&lock_path, e)),
        }
        // The pid is informational (for the "locked by" message); the lock
        // itself is what matters, so failures here are not fatal.
        let _ = lock.set_len(0);
        let _ = lock.seek(SeekFrom::Start(0));
        let _ = write!(lock, "{}", std::process::id());
        Ok(lock)
    }
}

/// Creates `dir` (and parents) and fsyncs its parent so the new entry survives a crash.
fn create_dir_durably(storage: &dyn Storage, dir: &Path) -> Result<(), StoreError> {
    storage
        .create_dir_all(dir)
        .map_err(|e| StoreError::io(dir, e))?;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        sync_dir(storage, parent)?;
    }
    Ok(())
}

/// fsyncs a directory, making creations, renames and removals in it durable.
pub fn sync_dir(storage: &dyn Storage, dir: &Path) -> Result<(), StoreError> {
    storage.sync_dir(dir).map_err(|e| StoreError::io(dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_open_is_refused_with_the_holder_pid() {
        let tmp = tempfile::tempdir().unwrap();
        let _first = DataDir::open(&crate::storage::RealDisk, tmp.path()).unwrap();
        let err = DataDir::open(&crate::storage::RealDisk, tmp.path())
            .err()
            .unwrap();
        let text = err.to_string();
        assert!(text.contains("locked by another cubed"), "{text}");
        assert!(text.contains(&std::process::id().to_string()), "{text}");
    }
}
