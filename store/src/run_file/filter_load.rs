//! A run file's Bloom filter once its reader is open: read and checked at
//! open ([`super::RunFileReader::open`]), or later, for a file the daemon
//! serves, by one background thread ([`queue_filter_load`]) so that a
//! restart answers its first request without reading every filter (a
//! quarter of a gigabyte at 200 M cells).
//!
//! Until a filter is loaded its reader reads as a file without one: every
//! lookup reads its block, and the answers are the same. A filter that
//! fails its checks is never used; the background loader says so once on
//! stderr, and the reader's `verify` reports it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

use super::RunFileError;
use super::bloom::BloomFilter;
use super::format::{FORMAT_VERSION_FIXED_FILTER, Footer, Identity, Piece, Pieces};
use super::reader::{BlockSource, read_piece};
use crate::crypto::Keyring;

/// One file's filter: what reading it needs, and what reading it gave.
pub(super) struct FilterSlot {
    path: PathBuf,
    footer: Footer,
    id: Identity,
    keyring: Option<Arc<Keyring>>,
    /// The CRC ending the file's stored index, which the filter names.
    index_crc: u32,
    /// The filter's trailing bytes as the file MAC checked them at open
    /// (a protected version-3 file opened without its filter): the filter
    /// read later must end with them, or it is not the one the MAC covers.
    trailer: Option<Vec<u8>>,
    state: OnceLock<Result<BloomFilter, RunFileError>>,
}

impl FilterSlot {
    pub(super) fn new(
        path: &Path,
        footer: Footer,
        id: Identity,
        keyring: Option<Arc<Keyring>>,
        index_crc: u32,
        trailer: Option<Vec<u8>>,
    ) -> FilterSlot {
        FilterSlot {
            path: path.to_path_buf(),
            footer,
            id,
            keyring,
            index_crc,
            trailer,
            state: OnceLock::new(),
        }
    }

    /// The filter, if loaded and checked.
    pub(super) fn loaded(&self) -> Option<&BloomFilter> {
        self.state.get().and_then(|r| r.as_ref().ok())
    }

    /// Reads and checks the filter from `source` unless that was done;
    /// the outcome of the one read either way.
    pub(super) fn load(&self, source: &dyn BlockSource) -> Result<(), RunFileError> {
        let outcome = self.state.get_or_init(|| {
            let (offset, len) = (self.footer.filter_offset(), self.footer.filter_stored_len);
            self.decode(read_piece(source, &self.path, offset, len as usize)?)
        });
        outcome.as_ref().map(|_| ()).map_err(RunFileError::again)
    }

    /// Checks and keeps the filter as stored, read with the index at open.
    pub(super) fn load_stored(&self, stored: Vec<u8>) -> Result<(), RunFileError> {
        let outcome = self.state.get_or_init(|| self.decode(stored));
        outcome.as_ref().map(|_| ()).map_err(RunFileError::again)
    }

    fn decode(&self, stored: Vec<u8>) -> Result<BloomFilter, RunFileError> {
        let offset = self.footer.filter_offset();
        let corrupt = |reason: String| RunFileError::Corrupt {
            path: self.path.clone(),
            offset,
            reason: format!("Bloom filter: {reason}"),
        };
        if let Some(trailer) = &self.trailer
            && !stored.ends_with(trailer)
        {
            return Err(corrupt(
                "its trailing MAC or tag changed since the file was opened".into(),
            ));
        }
        let pieces = Pieces {
            mode: self.footer.mode,
            keyring: self.keyring.as_deref(),
            id: &self.id,
        };
        let payload = pieces
            .open(Piece::Filter, offset, stored)
            .map_err(corrupt)?;
        let entries = self.footer.entry_count;
        if self.footer.version == FORMAT_VERSION_FIXED_FILTER {
            BloomFilter::decode_v2(payload, entries, self.index_crc)
        } else {
            BloomFilter::decode_v3(payload, entries, self.index_crc)
        }
        .map_err(corrupt)
    }
}

/// A filter to load: held weakly, so that a file dropped before its turn
/// is skipped (and its descriptor closed).
struct Job {
    slot: Weak<FilterSlot>,
    source: Weak<dyn BlockSource>,
}

/// The loader thread's queue, started with the first job.
fn loader() -> Option<&'static Mutex<Sender<Job>>> {
    static LOADER: OnceLock<Option<Mutex<Sender<Job>>>> = OnceLock::new();
    LOADER
        .get_or_init(|| {
            let (tx, rx) = channel::<Job>();
            std::thread::Builder::new()
                .name("cube-filter-load".into())
                .spawn(move || {
                    for job in rx {
                        run(job);
                    }
                })
                .ok()
                .map(|_| Mutex::new(tx))
        })
        .as_ref()
}

/// Filters queued and not yet read (or skipped), in this process.
static PENDING: AtomicU64 = AtomicU64::new(0);

/// How many queued filters the loader has yet to read: 0 once every run
/// file served so far answers absent keys from its filter
/// (`storage.filter_loads_pending`).
pub fn filter_loads_pending() -> u64 {
    PENDING.load(Ordering::Relaxed)
}

fn run(job: Job) {
    load(job);
    PENDING.fetch_sub(1, Ordering::Relaxed);
}

fn load(job: Job) {
    let (Some(slot), Some(source)) = (job.slot.upgrade(), job.source.upgrade()) else {
        return;
    };
    if let Err(e) = slot.load(source.as_ref()) {
        eprintln!(
            "cubed: serving this run file without its Bloom filter (lookups stay right; a \
             lookup of a key it lacks reads a block): {e}"
        );
    }
}

/// Has the loader thread read `slot`'s filter from `source`, after the
/// filters queued before it. Without a thread (it could not be started),
/// reads it now.
pub(super) fn queue_filter_load(slot: &Arc<FilterSlot>, source: &Arc<dyn BlockSource>) {
    let job = Job {
        slot: Arc::downgrade(slot),
        source: Arc::downgrade(source),
    };
    PENDING.fetch_add(1, Ordering::Relaxed);
    let unsent = match loader() {
        Some(tx) => tx
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .send(job)
            .err()
            .map(|e| e.0),
        None => Some(job),
    };
    if let Some(job) = unsent {
        run(job);
    }
}
