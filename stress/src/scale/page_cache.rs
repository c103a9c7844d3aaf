//! Drops a data set's files from the kernel's page cache
//! (`posix_fadvise(POSIX_FADV_DONTNEED)` on each), so that the phases
//! called cold read the device, and two runs on one data set start from
//! the same state: without it, what the page cache kept of earlier runs
//! decided the cold figures (four runs in a row at 200 M cells: 13 k to
//! 39 k gets/s; docs/benchmarks.md).
//!
//! The advice drops clean pages only, which is all a cleanly shut down
//! data set has; the daemon's own memory (indexes, filters, caches) is
//! untouched.

use std::fs::{self, File};
use std::os::unix::io::AsRawFd;
use std::path::Path;

use crate::error::StressError;

/// What [`evict`] advised the kernel to drop.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Evicted {
    pub files: u64,
    pub bytes: u64,
}

/// Advises the kernel to drop the cached pages of every regular file
/// under `dir` (symlinks are not followed).
pub fn evict(dir: &Path) -> Result<Evicted, StressError> {
    let mut evicted = Evicted::default();
    let io = |what: &Path, e| StressError::io(format!("cannot read {}", what.display()), e);
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).map_err(|e| io(&dir, e))? {
            let entry = entry.map_err(|e| io(&dir, e))?;
            let kind = entry.file_type().map_err(|e| io(&entry.path(), e))?;
            if kind.is_dir() {
                pending.push(entry.path());
            } else if kind.is_file() {
                evicted.bytes += drop_pages(&entry.path())?;
                evicted.files += 1;
            }
        }
    }
    Ok(evicted)
}

/// Drops one file's pages; returns its length.
fn drop_pages(path: &Path) -> Result<u64, StressError> {
    let io = |e| {
        StressError::io(
            format!("cannot drop {} from the page cache", path.display()),
            e,
        )
    };
    let file = File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    // Offset 0 and no length: the whole file.
    nix::fcntl::posix_fadvise(
        file.as_raw_fd(),
        0,
        0,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    )
    .map_err(|e| io(e.into()))?;
    Ok(len)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_regular_file_below_is_advised_and_symlinks_are_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("a"), vec![1u8; 5000]).unwrap();
        fs::create_dir(dir.path().join("sub")).unwrap();
        fs::write(dir.path().join("sub/b"), vec![2u8; 300]).unwrap();
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("big"), vec![3u8; 1 << 16]).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("link")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("big"), dir.path().join("f")).unwrap();
        assert_eq!(
            evict(dir.path()).unwrap(),
            Evicted {
                files: 2,
                bytes: 5300
            }
        );
    }
}
