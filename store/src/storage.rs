//! The one door to the disk. Every file operation of the WAL and the
//! checkpoint code goes through [`Storage`], so tests can put a simulated
//! disk behind it (`sim_disk.rs`, cargo feature `sim-disk`) that loses what was not
//! synced, tears writes into sectors, fails `write` and `fsync`, and plays
//! the fsyncgate trick of "succeeding" on the retry of a failed sync.
//!
//! The surface is deliberately small: positioned reads and writes, one
//! data sync, whole-file reads, and the directory operations the engine
//! actually uses. Anything outside it (the data dir lock, the socket) is
//! not part of the storage fault model.
//!
//! [`RealDisk`] keeps its files private ([`crate::private_files`]): files
//! are created 0600 and directories 0700 whatever the umask, no symbolic
//! link is followed at the last component, and a file owned by another
//! user is refused.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::private_files::{create_private_dir_all, open_private_file, read_private_file};

/// How to open a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// Create; fail if it exists.
    CreateNew,
    /// Create or empty an existing file.
    CreateTruncate,
    /// Open an existing file for reading and writing.
    Existing,
    /// Open an existing file for reading only.
    ReadOnly,
}

// `len` is a file's size, not a collection's: `is_empty` would mean nothing.
#[allow(clippy::len_without_is_empty)]
pub trait StorageFile: Send + fmt::Debug {
    fn write_all_at(&mut self, bytes: &[u8], offset: u64) -> io::Result<()>;
    fn read_exact_at(&self, bytes: &mut [u8], offset: u64) -> io::Result<()>;
    /// `fdatasync`: data and size, not other metadata.
    fn sync_data(&mut self) -> io::Result<()>;
    fn set_len(&mut self, len: u64) -> io::Result<()>;
    fn len(&self) -> io::Result<u64>;
}

pub trait Storage: Send + Sync + fmt::Debug {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>>;
    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>>;
    fn file_len(&self, path: &Path) -> io::Result<u64>;
    /// File names (not paths) in `dir`, in no particular order.
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>>;
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// fsync of a directory: makes creations, renames and removals in it durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Whether this is the real file system (the data dir lock applies).
    fn is_real(&self) -> bool {
        false
    }
}

/// The real file system, through `std::fs`.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealDisk;

#[derive(Debug)]
struct RealFile(File);

impl StorageFile for RealFile {
    fn write_all_at(&mut self, bytes: &[u8], offset: u64) -> io::Result<()> {
        FileExt::write_all_at(&self.0, bytes, offset)
    }

    fn read_exact_at(&self, bytes: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(&self.0, bytes, offset)
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
}

impl Storage for RealDisk {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>> {
        let mut options = OpenOptions::new();
        match mode {
            OpenMode::CreateNew => options.read(true).write(true).create_new(true),
            OpenMode::CreateTruncate => options.read(true).write(true).create(true).truncate(true),
            OpenMode::Existing => options.read(true).write(true),
            OpenMode::ReadOnly => options.read(true),
        };
        Ok(Box::new(RealFile(open_private_file(
            path,
            &mut options,
            mode != OpenMode::ReadOnly,
        )?)))
    }

    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>> {
        read_private_file(path)
    }

    fn file_len(&self, path: &Path) -> io::Result<u64> {
        Ok(fs::symlink_metadata(path)?.len())
    }

    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(dir)? {
            if let Ok(name) = entry?.file_name().into_string() {
                names.push(name);
            }
        }
        Ok(names)
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        create_private_dir_all(dir)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn is_real(&self) -> bool {
        true
    }
}
