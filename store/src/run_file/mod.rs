//! Run files: a namespace's sorted cells on disk, read block by block
//! through a bounded cache (issue 32, first phase).
//!
//! A run file holds cells (u128 curve key -> value bytes, or a tombstone)
//! in strictly increasing key order, packed into blocks of about
//! [`TARGET_BLOCK_BYTES`]. After the blocks come a block index (the first
//! key of each block, its offset and length), a Bloom filter of the keys
//! ([`bloom`]; files of format version 1 have none) and a fixed-size
//! footer. The
//! layout is specified byte by byte in `docs/storage-format.md`, "Run
//! files"; [`format`] is its one implementation.
//!
//! - [`RunFileWriter`] streams sorted entries into a new file (under a
//!   temporary name; synced, renamed into place, directory synced).
//! - [`RunFileReader`] opens a file by reading only its footer, index and
//!   filter (the daemon's open leaves the filter to a background thread,
//!   [`filter_load`]); a point read is one index probe, one filter probe and at most
//!   one block read (`pread`), none when the filter rules the key out;
//!   a range streams blocks in key order with a bounded read-ahead.
//! - [`Merge`] merges sorted sources (a memtable, run files), the newest
//!   winning each key, for a fold or a merge to write with [`write_all`].
//! - [`BlockCache`] holds decoded blocks, shared by every reader, within a
//!   byte budget. A block of an encrypted namespace is plaintext only
//!   there: on disk it is AES-256-GCM sealed.
//!
//! Every block read is checked (CRC32C, then the AES-GCM tag or the block
//! MAC) before a byte of it is used: damage is a [`RunFileError::Corrupt`]
//! naming the file and offset, never wrong data, and an I/O error fails
//! that read only.

mod block_cache;
pub mod bloom;
mod filter_load;
pub mod format;
mod merge;
mod reader;
#[cfg(test)]
pub(crate) mod recording_source;
mod writer;

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

pub use block_cache::{BlockCache, CacheStats};
pub use filter_load::filter_loads_pending;
pub use format::{
    DecodedBlock, FOOTER_BYTES, FORMAT_VERSION, FORMAT_VERSION_FIXED_FILTER,
    FORMAT_VERSION_NO_FILTER, FORMAT_VERSION_PACKED_BLOCKS, MAX_BLOCK_BYTES, MAX_PAD_BYTES,
    MAX_VALUE_BYTES, PAGE_BYTES, TARGET_BLOCK_BYTES,
};
pub use merge::{Entry, Merge, Source, write_all};
pub use reader::{BlockSource, RunFileRange, RunFileReader};
pub use writer::{RunFileWriter, RunSummary};

use crate::crypto::{DIR_ID_BYTES, Keyring};

/// What a run file's lookup finds for a key it holds: a value, or `None`
/// for a tombstone (a delete that hides an older value in an older run).
pub type Slot = Option<crate::CellValue>;

/// How a run file is protected, which the writer applies and the reader
/// requires: a reader refuses a file with less protection than asked for
/// (a plaintext or unauthenticated file put in place of a protected one).
#[derive(Clone)]
pub enum Protection {
    /// CRC32C per block only: a data dir without a master key.
    Plain,
    /// A data dir with a master key, a namespace that is not encrypted:
    /// blocks in plaintext, each with an HMAC-SHA256 under the integrity
    /// key, and the index and footer under a MAC too.
    Authenticated {
        keyring: Arc<Keyring>,
        dir_id: [u8; DIR_ID_BYTES],
    },
    /// An encrypted namespace: every block and the index AES-256-GCM
    /// sealed under the namespace's checkpoint key, the footer under a MAC.
    Sealed {
        keyring: Arc<Keyring>,
        dir_id: [u8; DIR_ID_BYTES],
    },
}

impl Protection {
    fn parts(&self) -> (format::Mode, Option<&Arc<Keyring>>, [u8; DIR_ID_BYTES]) {
        match self {
            Protection::Plain => (format::Mode::Plain, None, [0u8; DIR_ID_BYTES]),
            Protection::Authenticated { keyring, dir_id } => {
                (format::Mode::Authenticated, Some(keyring), *dir_id)
            }
            Protection::Sealed { keyring, dir_id } => {
                (format::Mode::Sealed, Some(keyring), *dir_id)
            }
        }
    }
}

impl fmt::Debug for Protection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protection::Plain => "Plain",
            Protection::Authenticated { .. } => "Authenticated",
            Protection::Sealed { .. } => "Sealed",
        })
    }
}

/// Why a run file could not be written or read. Each names the file; a
/// read error also names the offset of what was being read.
#[derive(Debug)]
pub enum RunFileError {
    /// The bytes at `offset` are not what was written: a checksum, a
    /// MAC or an AES-GCM tag did not match, or a structure is malformed.
    Corrupt {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    /// The operating system failed a read or write (`EIO`, a short file).
    Io {
        path: PathBuf,
        offset: u64,
        source: io::Error,
    },
    /// The file needs a key this reader lacks, or a protection it lacks.
    Key { path: PathBuf, reason: String },
    /// The writer was given something it must refuse (keys out of order,
    /// a value over [`MAX_VALUE_BYTES`]): a bug in the caller.
    Refused { path: PathBuf, reason: String },
}

impl fmt::Display for RunFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunFileError::Corrupt {
                path,
                offset,
                reason,
            } => write!(
                f,
                "run file {} is damaged at offset {offset}: {reason}; no data from it was \
                 used (`cubed --verify DIR` lists every damaged block; restore from a backup)",
                path.display()
            ),
            RunFileError::Io {
                path,
                offset,
                source,
            } => write!(
                f,
                "run file {}: reading or writing at offset {offset} failed: {source}",
                path.display()
            ),
            RunFileError::Key { path, reason } => {
                write!(f, "run file {}: {reason}", path.display())
            }
            RunFileError::Refused { path, reason } => {
                write!(f, "run file {}: refused: {reason}", path.display())
            }
        }
    }
}

impl RunFileError {
    /// The same error again, for a second request that met it (an
    /// `io::Error` cannot be cloned: its OS error code or its kind and
    /// message are kept).
    pub fn again(&self) -> RunFileError {
        match self {
            RunFileError::Corrupt {
                path,
                offset,
                reason,
            } => RunFileError::Corrupt {
                path: path.clone(),
                offset: *offset,
                reason: reason.clone(),
            },
            RunFileError::Io {
                path,
                offset,
                source,
            } => RunFileError::Io {
                path: path.clone(),
                offset: *offset,
                source: match source.raw_os_error() {
                    Some(code) => io::Error::from_raw_os_error(code),
                    None => io::Error::new(source.kind(), source.to_string()),
                },
            },
            RunFileError::Key { path, reason } => RunFileError::Key {
                path: path.clone(),
                reason: reason.clone(),
            },
            RunFileError::Refused { path, reason } => RunFileError::Refused {
                path: path.clone(),
                reason: reason.clone(),
            },
        }
    }
}

impl std::error::Error for RunFileError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RunFileError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests;
