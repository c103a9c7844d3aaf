//! The data directory: its layout, and the lock that keeps a second daemon out.
//!
//! ```text
//! DATA/
//!   LOCK              flock(2)-held by the running daemon; holds its pid
//!   wal/              write-ahead log segments, <first-lsn:020>.wal
//!   checkpoint/       MANIFEST, base-<id>.ckpt, delta-<id>.ckpt
//!   cubed.sock        default socket path
//! ```
//!
//! The directory is the daemon's alone (`docs/operations.md`, "The data
//! dir"): it is created 0700, and cubed refuses to start on one that the
//! group or others may read or write, or that another user owns, or that
//! is a symbolic link. Inside it, every file is 0600 and owned by the
//! daemon's user, and nothing is a link ([`crate::private_files`]); a start
//! narrows the modes an older cubed left, and removes the `.tmp` files an
//! interrupted run left.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::StoreError;
use crate::private_files::{
    DIR_MODE, FILE_MODE, SHARED_BITS, check_owner, link_refused, open_private_dir,
    open_private_file,
};
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
    /// On the real disk, first checks that the directory is private to
    /// the daemon's user; once locked, checks and tidies what is inside.
    pub fn open(storage: &dyn Storage, root: &Path) -> Result<DataDir, StoreError> {
        create_dir_durably(storage, root)?;
        let lock = if storage.is_real() {
            check_closed_to_others(root)?;
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
        if storage.is_real() {
            for removed in dir.make_private(storage)? {
                eprintln!(
                    "cubed: removed {}: a temporary file an interrupted run left behind",
                    removed.display()
                );
            }
        }
        Ok(dir)
    }

    /// Walks the data dir (the root, `wal/`, `checkpoint/`, `wal/repair-*/`)
    /// through [`tidy_entry`]. Returns the stale files it removed.
    fn make_private(&self, storage: &dyn Storage) -> Result<Vec<PathBuf>, StoreError> {
        let mut removed = Vec::new();
        let mut dirs = vec![self.root.clone(), self.wal_dir(), self.checkpoint_dir()];
        while let Some(dir) = dirs.pop() {
            let entries = fs::read_dir(&dir).map_err(|e| StoreError::io(&dir, e))?;
            for entry in entries {
                let path = entry.map_err(|e| StoreError::io(&dir, e))?.path();
                match tidy_entry(&path)? {
                    Entry::Removed => removed.push(path),
                    Entry::Dir if dir == self.wal_dir() && is_repair_dir(&path) => dirs.push(path),
                    Entry::Dir | Entry::Kept => {}
                }
            }
        }
        if !removed.is_empty() {
            for dir in [self.root.clone(), self.wal_dir(), self.checkpoint_dir()] {
                sync_dir(storage, &dir)?;
            }
        }
        Ok(removed)
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

/// Refuses a data dir that the group or others may read or write (what
/// PostgreSQL and OpenSSH refuse too), saying the `chmod` that fixes it.
/// An empty one is narrowed to 0700 instead, as `initdb` does: nothing was
/// ever exposed through it. `root` was just opened without following a
/// link, and is ours.
fn check_closed_to_others(root: &Path) -> Result<(), StoreError> {
    let handle = open_private_dir(root).map_err(|e| StoreError::io(root, e))?;
    let mode = handle
        .metadata()
        .map_err(|e| StoreError::io(root, e))?
        .mode()
        & 0o7777;
    if mode & SHARED_BITS == 0 {
        return Ok(());
    }
    let empty = fs::read_dir(root)
        .map_err(|e| StoreError::io(root, e))?
        .next()
        .is_none();
    if empty {
        eprintln!(
            "cubed: the new data dir {} was mode {mode:04o}; made it 0700",
            root.display()
        );
        return handle
            .set_permissions(fs::Permissions::from_mode(DIR_MODE))
            .map_err(|e| StoreError::io(root, e));
    }
    Err(StoreError::io(
        root,
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "the data dir is mode {mode:04o}: other users can read or write it, and through \
                 it the data of every namespace; cubed refuses to start on it. Fix with \
                 `chmod 700 {dir}` (and `chmod -R go-rwx {dir}` for the files an older cubed \
                 made readable)",
                dir = root.display()
            ),
        ),
    ))
}

/// What [`tidy_entry`] found.
enum Entry {
    Removed,
    Dir,
    Kept,
}

/// One entry of the data dir: refuses a symbolic link or an entry another
/// user owns, narrows a mode open to the group or others (an older cubed
/// made files 0644), and removes a stale `*.tmp` file (safe: the lock is
/// held, so no one else is writing one).
fn tidy_entry(path: &Path) -> Result<Entry, StoreError> {
    let meta = fs::symlink_metadata(path).map_err(|e| StoreError::io(path, e))?;
    if meta.file_type().is_symlink() {
        return Err(StoreError::io(path, link_refused(path)));
    }
    check_owner(&meta).map_err(|e| StoreError::io(path, e))?;
    let (private_mode, kind) = if meta.is_dir() {
        (DIR_MODE, Entry::Dir)
    } else if meta.is_file() {
        if path.extension().is_some_and(|e| e == "tmp") {
            fs::remove_file(path).map_err(|e| StoreError::io(path, e))?;
            return Ok(Entry::Removed);
        }
        (FILE_MODE, Entry::Kept)
    } else {
        // The socket: its mode is `--socket-mode`'s to decide.
        return Ok(Entry::Kept);
    };
    if meta.mode() & 0o077 != 0 {
        fs::set_permissions(path, fs::Permissions::from_mode(private_mode))
            .map_err(|e| StoreError::io(path, e))?;
    }
    Ok(kind)
}

fn is_repair_dir(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("repair-"))
}

pub(crate) fn lock_data_dir(root: &Path) -> Result<File, StoreError> {
    {
        let lock_path = root.join("LOCK");
        let mut lock = open_private_file(
            &lock_path,
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false),
            true,
        )
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
