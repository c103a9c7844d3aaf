//! Online backup: a consistent, self-contained copy of the data dir, taken
//! while the daemon keeps serving.
//!
//! It runs on the checkpointer thread, so no fold or compaction removes a
//! file while it is being copied. The writer first closes its segment at
//! LSN `B`; everything below `B` then lives in immutable files: the
//! checkpoint files the manifest names and the closed WAL segments. The
//! checkpoint files are hard-linked when the destination is on the same
//! file system (no one ever writes them again) and copied otherwise. The
//! segments and the manifest are always copied: a `cubed` started on the
//! copy appends to its newest segment, may cut a torn tail or `--repair`
//! a damaged one, and rewrites its manifest, and none of that may reach
//! the original's files through a shared inode.
//! Every file and directory of the copy is fsynced. Starting `cubed` on the
//! copy recovers exactly the state at LSN `B - 1`: every write acknowledged
//! before the backup began.

use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use super::CheckpointStore;
use super::manifest::MANIFEST_NAME;
use crate::data_dir::sync_dir;
use crate::error::StoreError;
use crate::storage::{OpenMode, Storage};
use crate::wal::list_segments;

/// Files are copied in pieces of this size.
const COPY_CHUNK_BYTES: usize = 4 * 1024 * 1024;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BackupReport {
    /// The copy holds every write up to and including this LSN.
    pub lsn: u64,
    pub files: usize,
    pub linked_files: usize,
    pub bytes: u64,
    pub duration: Duration,
}

impl CheckpointStore {
    /// Copies the state below `boundary` (the first LSN of the writer's new
    /// segment) into `dest`, which must not exist.
    pub(crate) fn backup(&self, boundary: u64, dest: &Path) -> Result<BackupReport, StoreError> {
        // The manifest in memory may not be the one on disk.
        self.check_usable()?;
        let started = Instant::now();
        let storage = self.storage();
        if storage.is_real() {
            let root = self.dir.parent().unwrap_or(&self.dir);
            check_destination(dest, root)?;
        }
        if dest.exists() {
            return Err(StoreError::io(
                dest,
                io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "the backup destination already exists; give a new path",
                ),
            ));
        }
        let dest_wal = dest.join("wal");
        let dest_checkpoint = dest.join("checkpoint");
        for dir in [dest, &dest_wal, &dest_checkpoint] {
            storage
                .create_dir_all(dir)
                .map_err(|e| match e.raw_os_error() {
                    // A parent that is a file, a path the kernel will not take.
                    Some(libc::ENOTDIR | libc::ENAMETOOLONG | libc::EINVAL) => bad_path(dest, e),
                    _ => StoreError::io(dir, e),
                })?;
        }
        let mut report = BackupReport {
            lsn: boundary.saturating_sub(1),
            ..BackupReport::default()
        };
        let mut copy = |from: &Path, to_dir: &Path, link: bool| -> Result<(), StoreError> {
            let name = from.file_name().unwrap_or_default();
            let to = to_dir.join(name);
            report.files += 1;
            report.bytes += storage
                .file_len(from)
                .map_err(|e| StoreError::io(from, e))?;
            if link && storage.is_real() && std::fs::hard_link(from, &to).is_ok() {
                report.linked_files += 1;
                return Ok(());
            }
            copy_file(storage, from, &to)
        };
        // No manifest yet means no checkpoint yet: the WAL alone is the state.
        let manifest_path = self.dir.join(MANIFEST_NAME);
        if storage.file_len(&manifest_path).is_ok() {
            copy(&manifest_path, &dest_checkpoint, false)?;
        }
        for file in self.manifest.all_files(&self.dir) {
            copy(&file, &dest_checkpoint, true)?;
        }
        for (first, path) in list_segments(storage, &self.wal_dir, false)? {
            if first < boundary {
                copy(&path, &dest_wal, false)?;
            }
        }
        for dir in [&dest_wal, &dest_checkpoint, dest] {
            sync_dir(storage, dir)?;
        }
        if let Some(parent) = dest.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(storage, parent)?;
        }
        report.duration = started.elapsed();
        Ok(report)
    }
}

/// The longest name of one path component (Linux `NAME_MAX`), and the
/// longest path the kernel takes (`PATH_MAX`, with its NUL).
const NAME_MAX_BYTES: usize = 255;
const PATH_MAX_BYTES: usize = 4096;

fn bad_path(dest: &Path, reason: impl ToString) -> StoreError {
    StoreError::BadPath {
        path: dest.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// Refuses a destination that cannot be a path (a NUL byte, a name or a
/// path too long, `..`) and one inside the live data dir `root`, however
/// it gets there (`root/wal/x`, or through a symbolic link to `root`): a
/// backup there would be copied into itself, and a later start would take
/// its files for the daemon's own.
fn check_destination(dest: &Path, root: &Path) -> Result<(), StoreError> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = dest.as_os_str().as_bytes();
    if bytes.contains(&0) {
        return Err(bad_path(dest, "it contains a NUL byte"));
    }
    if bytes.len() >= PATH_MAX_BYTES {
        return Err(bad_path(
            dest,
            format!(
                "it is {} bytes; a path has at most {}",
                bytes.len(),
                PATH_MAX_BYTES - 1
            ),
        ));
    }
    for part in dest.components() {
        let name = part.as_os_str().as_bytes();
        if part == std::path::Component::ParentDir {
            return Err(bad_path(
                dest,
                "it contains `..`; give a plain absolute path",
            ));
        }
        if name.len() > NAME_MAX_BYTES {
            return Err(bad_path(
                dest,
                format!(
                    "a name in it is {} bytes; a name has at most {NAME_MAX_BYTES}",
                    name.len()
                ),
            ));
        }
    }
    // The nearest part of the path that exists, with its links resolved,
    // then what would be created under it.
    let existing = dest
        .ancestors()
        .find(|a| std::fs::symlink_metadata(a).is_ok())
        .unwrap_or(Path::new("/"));
    let resolved = std::fs::canonicalize(existing)
        .map_err(|e| bad_path(dest, e))?
        .join(dest.strip_prefix(existing).unwrap_or(Path::new("")));
    let live = std::fs::canonicalize(root).map_err(|e| StoreError::io(root, e))?;
    if resolved.starts_with(&live) {
        return Err(bad_path(
            dest,
            format!(
                "it is inside the live data dir {} (as {}); back up to a path outside it",
                live.display(),
                resolved.display()
            ),
        ));
    }
    Ok(())
}

fn copy_file(storage: &dyn Storage, from: &Path, to: &Path) -> Result<(), StoreError> {
    let source = storage
        .open(from, OpenMode::ReadOnly)
        .map_err(|e| StoreError::io(from, e))?;
    let len = source.len().map_err(|e| StoreError::io(from, e))?;
    let mut target = storage
        .open(to, OpenMode::CreateNew)
        .map_err(|e| StoreError::io(to, e))?;
    let mut buf = vec![0u8; COPY_CHUNK_BYTES];
    let mut at = 0u64;
    while at < len {
        let n = (len - at).min(COPY_CHUNK_BYTES as u64) as usize;
        source
            .read_exact_at(&mut buf[..n], at)
            .map_err(|e| StoreError::io(from, e))?;
        target
            .write_all_at(&buf[..n], at)
            .map_err(|e| StoreError::io(to, e))?;
        at += n as u64;
    }
    target.sync_data().map_err(|e| StoreError::io(to, e))
}
