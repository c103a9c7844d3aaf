//! [`RunFileReader`]: a run file opened by its footer, index and Bloom
//! filter alone, read block by block through the shared [`BlockCache`].
//!
//! A point read is one probe of the in-memory fence keys, one of the
//! in-memory Bloom filter (version 2 and 3 files) and at most one `pread`
//! of one block: none when the filter says the file lacks the key.
//!
//! [`RunFileReader::open`] reads and checks the filter before it returns.
//! [`RunFileReader::open_serving`], the daemon's, reads only the footer
//! and the index (and, in a protected version-3 file, the filter's few
//! trailing bytes that the file MAC covers), and leaves the filter to a
//! background thread ([`filter_load`]): until it is loaded, lookups read
//! as in a file without a filter (right answers, a block read for an
//! absent key). A filter that fails its checks then is not used, and said
//! once on stderr; `verify` reports it. A range
//! ([`RunFileRange`]) walks blocks in key order and reads ahead at most
//! [`READ_AHEAD_BLOCKS`] blocks (and [`READ_AHEAD_BYTES`]) at a time, in one `pread` per run of blocks the
//! cache lacks, so a scan of a large box never holds more than that window;
//! the window starts at one block and doubles with each fill, so a short
//! range reads only what it needs.
//! Every block read from the file is checked (CRC32C, then its MAC or
//! AES-GCM tag, then its structure) before any of it is used.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use crate::CellValue;
use crate::crypto::{Keyring, MAC_BYTES, tags_equal};
use crate::storage::{OpenMode, Storage, StorageFile};

use super::block_cache::{BlockCache, next_cache_id};
use super::bloom::BloomFilter;
use super::filter_load::{FilterSlot, queue_filter_load};
use super::format::{
    BlockIndex, DecodedBlock, FOOTER_BYTES, FORMAT_VERSION_NO_FILTER, Footer, Identity, Mode,
    Piece, Pieces, file_mac, filter_trailer_bytes,
};
use super::{Protection, RunFileError, Slot};

/// Most blocks a range reads ahead of the one it is in.
pub const READ_AHEAD_BLOCKS: usize = 8;
/// Most bytes a range reads ahead (a block larger than this is read alone).
pub const READ_AHEAD_BYTES: usize = 128 * 1024;

/// Positioned reads of one file, from any thread at once.
// `len` is a file's size, as in `StorageFile`: `is_empty` would mean nothing.
#[allow(clippy::len_without_is_empty)]
pub trait BlockSource: Send + Sync {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    fn len(&self) -> io::Result<u64>;
    /// A hint that `len` bytes at `offset` will be read soon, so that the
    /// kernel starts reading them now. Nothing by default.
    fn will_need(&self, _offset: u64, _len: u64) {}
}

impl BlockSource for File {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }

    fn will_need(&self, offset: u64, len: u64) {
        use std::os::fd::AsRawFd;
        let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
            return;
        };
        // Only a hint: a failure costs the overlap, not the read.
        let _ = nix::fcntl::posix_fadvise(
            self.as_raw_fd(),
            offset,
            len,
            nix::fcntl::PosixFadviseAdvice::POSIX_FADV_WILLNEED,
        );
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }
}

/// A file of any [`Storage`] (the simulated disk): its reads take turns,
/// since a [`StorageFile`] need not be `Sync`.
struct LockedFile(Mutex<Box<dyn StorageFile>>);

impl BlockSource for LockedFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let file = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        file.read_exact_at(buf, offset)
    }

    fn len(&self) -> io::Result<u64> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

/// One open run file. `Send + Sync`: share it behind an `Arc`.
pub struct RunFileReader {
    path: PathBuf,
    source: Arc<dyn BlockSource>,
    footer: Footer,
    index: BlockIndex,
    /// `None` for a version-1 file: every key may be in it. Shared with
    /// the background loader of a file opened for serving.
    filter: Option<Arc<FilterSlot>>,
    id: Identity,
    keyring: Option<Arc<Keyring>>,
    cache: Arc<BlockCache>,
    cache_id: u64,
}

impl std::fmt::Debug for RunFileReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunFileReader")
            .field("path", &self.path)
            .field("footer", &self.footer)
            .finish()
    }
}

impl RunFileReader {
    /// Opens a file of the real file system privately (no symbolic link
    /// followed, owned by the daemon's user).
    pub fn open(
        path: &Path,
        protection: &Protection,
        cache: Arc<BlockCache>,
    ) -> Result<RunFileReader, RunFileError> {
        let file = open_private(path)?;
        RunFileReader::open_source(Box::new(file), path, protection, cache)
    }

    /// Opens a file through `storage` (the real disk, or a simulated one).
    pub fn open_storage(
        storage: &dyn Storage,
        path: &Path,
        protection: &Protection,
        cache: Arc<BlockCache>,
    ) -> Result<RunFileReader, RunFileError> {
        if storage.is_real() {
            return RunFileReader::open(path, protection, cache);
        }
        let file = storage
            .open(path, OpenMode::ReadOnly)
            .map_err(|source| RunFileError::Io {
                path: path.to_path_buf(),
                offset: 0,
                source,
            })?;
        let source = LockedFile(Mutex::new(file));
        RunFileReader::open_source(Box::new(source), path, protection, cache)
    }

    /// Opens a file through `storage` for the daemon to serve from: as
    /// [`RunFileReader::open_storage`], but the Bloom filter is read by a
    /// background thread afterwards (see the module doc), so that a
    /// restart serves without waiting for every filter. A simulated disk's
    /// file is opened as [`RunFileReader::open_storage`] does (its faults
    /// and order stay those of the test's thread).
    pub fn open_serving(
        storage: &dyn Storage,
        path: &Path,
        protection: &Protection,
        cache: Arc<BlockCache>,
    ) -> Result<RunFileReader, RunFileError> {
        if !storage.is_real() {
            return RunFileReader::open_storage(storage, path, protection, cache);
        }
        let file = open_private(path)?;
        let reader = RunFileReader::open_source_lazy(Box::new(file), path, protection, cache)?;
        if let Some(slot) = &reader.filter {
            queue_filter_load(slot, &reader.source);
        }
        Ok(reader)
    }

    /// Opens the run file `source` holds; `path` names it in errors. Reads
    /// the footer, then the index and filter (one read), only.
    pub fn open_source(
        source: Box<dyn BlockSource>,
        path: &Path,
        protection: &Protection,
        cache: Arc<BlockCache>,
    ) -> Result<RunFileReader, RunFileError> {
        RunFileReader::open_with(source.into(), path, protection, cache, true)
    }

    /// Opens the run file `source` holds without its Bloom filter, which
    /// [`RunFileReader::load_filter`] reads later (a protected version-2
    /// file's is read now: its file MAC covers it). Until then every
    /// lookup reads its block.
    pub fn open_source_lazy(
        source: Box<dyn BlockSource>,
        path: &Path,
        protection: &Protection,
        cache: Arc<BlockCache>,
    ) -> Result<RunFileReader, RunFileError> {
        RunFileReader::open_with(source.into(), path, protection, cache, false)
    }

    /// Reads and checks the footer and the index, and with `eager_filter`
    /// (or when the file MAC needs it) the filter.
    fn open_with(
        source: Arc<dyn BlockSource>,
        path: &Path,
        protection: &Protection,
        cache: Arc<BlockCache>,
        eager_filter: bool,
    ) -> Result<RunFileReader, RunFileError> {
        let (mode, keyring, dir_id) = protection.parts();
        let (footer, footer_at) = read_footer(&*source, path)?;
        check_mode(path, footer.mode, mode)?;
        let id = Identity {
            file_id: footer.file_id,
            ns_id: footer.ns_id,
            dir_id,
        };
        // The footer bounded the index and the filter, which it checked
        // end where it starts, by the file's size.
        let eager_filter = eager_filter || footer.mac_needs_filter();
        let read_end = if eager_filter {
            footer_at
        } else {
            footer.filter_offset()
        };
        let read_len = (read_end - footer.index_offset) as usize;
        let mut stored = read_piece(&*source, path, footer.index_offset, read_len)?;
        let filter_stored = stored.split_off(footer.index_len as usize);
        let index_crc = super::format::stored_crc(&stored);
        // What of the filter the file MAC covers, read now if the filter
        // is not (a version-3 file's trailer, a few bytes before the footer).
        let mut trailer = None;
        if keyring.is_some() && !eager_filter {
            let len = filter_trailer_bytes(footer.mode).min(footer.filter_stored_len as usize);
            trailer = Some(read_piece(&*source, path, footer_at - len as u64, len)?);
        }
        if let Some(k) = keyring {
            let covered = match &trailer {
                Some(tail) => tail.as_slice(),
                None => footer.mac_filter_part(&filter_stored),
            };
            check_file_mac(path, k, &id, &footer, footer_at, &stored, covered)?;
        }
        let index = decode_index(path, mode, keyring.map(|k| &**k), &id, &footer, stored)?;
        let filter = (footer.version != FORMAT_VERSION_NO_FILTER).then(|| {
            Arc::new(FilterSlot::new(
                path,
                footer,
                id,
                keyring.cloned(),
                index_crc,
                trailer,
            ))
        });
        if let Some(slot) = filter.as_ref().filter(|_| eager_filter) {
            slot.load_stored(filter_stored)?;
        }
        Ok(RunFileReader {
            path: path.to_path_buf(),
            source,
            footer,
            index,
            filter,
            id,
            keyring: keyring.cloned(),
            cache,
            cache_id: next_cache_id(),
        })
    }

    /// The block index (fence keys, offsets, lengths), for tools and tests.
    pub fn index(&self) -> &BlockIndex {
        &self.index
    }

    pub fn footer(&self) -> &Footer {
        &self.footer
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn file_id(&self) -> u64 {
        self.footer.file_id
    }

    pub fn ns_id(&self) -> u64 {
        self.footer.ns_id
    }

    /// Entries, tombstones included.
    pub fn entry_count(&self) -> u64 {
        self.footer.entry_count
    }

    pub fn tombstone_count(&self) -> u64 {
        self.footer.tombstone_count
    }

    pub fn block_count(&self) -> usize {
        self.index.len()
    }

    /// The footer's MAC; `None` for a plain file.
    pub fn mac(&self) -> Option<[u8; MAC_BYTES]> {
        (self.footer.mode != Mode::Plain).then_some(self.footer.mac)
    }

    /// Refuses the file unless it is the one a manifest lists: its id and
    /// namespace, and (authenticated and sealed files) its MAC. A file of
    /// another namespace or fold renamed into place, or an older copy of
    /// the same file, is refused even though each of its blocks checks.
    pub fn expect(
        &self,
        file_id: u64,
        ns_id: u64,
        mac: Option<&[u8; MAC_BYTES]>,
    ) -> Result<(), RunFileError> {
        let found = (self.footer.file_id, self.footer.ns_id);
        let reason = if found != (file_id, ns_id) {
            format!(
                "it is file {} of namespace {}, where the manifest lists file {file_id} of \
                 namespace {ns_id}",
                found.0, found.1
            )
        } else if let Some(listed) = mac
            && !self.mac().is_some_and(|m| tags_equal(&m, listed))
        {
            "its MAC is not the one the manifest lists (another copy or version of the file)"
                .to_string()
        } else {
            return Ok(());
        };
        Err(RunFileError::Corrupt {
            path: self.path.clone(),
            offset: self.footer.index_offset + self.footer.index_len,
            reason,
        })
    }

    /// The smallest and largest keys, `None` if the file is empty.
    pub fn key_range(&self) -> Option<(u128, u128)> {
        let first = *self.index.first_keys.first()?;
        Some((first, self.index.last_key))
    }

    /// Memory this reader keeps while open (its index and filter, once
    /// loaded), besides the cache.
    pub fn resident_bytes(&self) -> usize {
        std::mem::size_of::<RunFileReader>()
            + self.index.heap_bytes()
            + self
                .filter
                .as_ref()
                .and_then(|slot| slot.loaded())
                .map_or(0, BloomFilter::heap_bytes)
    }

    /// False only if the file certainly does not hold `key` (its Bloom
    /// filter rules it out); always true for a version-1 file, which has
    /// no filter, and for a file whose filter is not loaded (yet, or at
    /// all: it failed its checks). Costs no read.
    pub fn may_contain(&self, key: u128) -> bool {
        self.filter
            .as_ref()
            .and_then(|slot| slot.loaded())
            .is_none_or(|f| f.may_contain(key))
    }

    /// Reads and checks the Bloom filter now, if no one has (a file opened
    /// for serving loads it in the background). Its error, the same each
    /// call, if it fails its checks: the file is then read without it.
    pub fn load_filter(&self) -> Result<(), RunFileError> {
        match &self.filter {
            Some(slot) => slot.load(self.source.as_ref()),
            None => Ok(()),
        }
    }

    /// Whether the filter is in use: loaded and checked (or the file has
    /// none to load).
    pub fn filter_loaded(&self) -> bool {
        self.filter
            .as_ref()
            .is_none_or(|slot| slot.loaded().is_some())
    }

    /// The block that may hold `key`: none if the key is outside the
    /// file's key range or the filter rules it out.
    fn block_for_lookup(&self, key: u128) -> Option<usize> {
        // The filter first: it rules most absent keys out in a probe or
        // two, where the index's binary search costs a miss a level.
        self.may_contain(key)
            .then(|| self.index.block_for(key))
            .flatten()
    }

    /// [`Self::may_contain`] of each of `keys`, their filter probes
    /// overlapped ([`BloomFilter::may_contain_each`]).
    fn may_contain_each(&self, keys: &[u128]) -> Vec<bool> {
        match self.filter.as_ref().and_then(|slot| slot.loaded()) {
            Some(filter) => filter.may_contain_each(keys),
            None => vec![true; keys.len()],
        }
    }

    /// The cache id of this file's blocks ([`BlockCache::forget_file`]).
    pub fn cache_id(&self) -> u64 {
        self.cache_id
    }

    /// What this file holds for `key`: `None` if nothing, `Some(None)` for
    /// a tombstone. One index probe, one filter probe, at most one block
    /// read (none if the filter rules the key out). The filter comes first
    /// even for a cached block, so that `get` and `get_many` answer alike
    /// (the fuzz target checks it) whatever the cache holds.
    pub fn get(&self, key: u128) -> Result<Option<Slot>, RunFileError> {
        let Some(i) = self.block_for_lookup(key) else {
            return Ok(None);
        };
        let block = self.block(i)?;
        Ok(block
            .search(key)
            .ok()
            .map(|j| block.value(j).map(CellValue::new)))
    }

    /// What this file holds for each of `keys` (in their order), as
    /// [`RunFileReader::get`] answers. The blocks the cache lacks are all asked
    /// of the kernel first ([`BlockSource::will_need`]), then read one by
    /// one, so that their device reads overlap instead of queueing behind
    /// each other; each block is read once however many keys it holds, and
    /// none is read for keys the filter rules out. A bad block fails the
    /// keys it holds, and only those.
    pub fn get_many(&self, keys: &[u128]) -> Vec<Result<Option<Slot>, RunFileError>> {
        let places: Vec<Option<usize>> = keys
            .iter()
            .zip(self.may_contain_each(keys))
            .map(|(&key, maybe)| maybe.then(|| self.index.block_for(key)).flatten())
            .collect();
        let mut wanted: Vec<usize> = places.iter().flatten().copied().collect();
        wanted.sort_unstable();
        wanted.dedup();
        let cached: Vec<Option<Arc<DecodedBlock>>> = wanted
            .iter()
            .map(|&i| self.cache.get(self.cache_id, self.index.offsets[i]))
            .collect();
        // One missing block gains nothing from a hint: its read follows.
        if cached.iter().filter(|hit| hit.is_none()).count() > 1 {
            for (&i, hit) in wanted.iter().zip(&cached) {
                if hit.is_none() {
                    self.source
                        .will_need(self.index.offsets[i], u64::from(self.index.lens[i]));
                }
            }
        }
        let blocks: Vec<Result<Arc<DecodedBlock>, RunFileError>> = wanted
            .iter()
            .zip(cached)
            .map(|(&i, hit)| match hit {
                Some(block) => Ok(block),
                None => {
                    let block = Arc::new(self.read_block(i)?);
                    self.cache
                        .insert(self.cache_id, self.index.offsets[i], &block);
                    Ok(block)
                }
            })
            .collect();
        keys.iter()
            .zip(places)
            .map(|(&key, place)| {
                let Some(i) = place else { return Ok(None) };
                let at = wanted.partition_point(|w| *w < i);
                match &blocks[at] {
                    Ok(block) => Ok(block
                        .search(key)
                        .ok()
                        .map(|j| block.value(j).map(CellValue::new))),
                    Err(e) => Err(e.again()),
                }
            })
            .collect()
    }

    /// The entries with keys in `lo..=hi`, in key order. (Not filtered:
    /// a Bloom filter answers for single keys only.)
    pub fn range(&self, lo: u128, hi: u128) -> RunFileRange<'_> {
        let blocks = self.blocks_of(lo, hi);
        RunFileRange {
            reader: self,
            lo,
            hi,
            next_block: blocks.start,
            end_block: blocks.end,
            window: VecDeque::new(),
            ahead_blocks: 1,
            current: None,
            current_block: 0,
            done: false,
        }
    }

    /// The blocks that may hold keys in `lo..=hi`, the ones a
    /// [`RunFileReader::range`] walks (empty if none may).
    pub fn blocks_of(&self, lo: u128, hi: u128) -> Range<usize> {
        let first = if lo > hi {
            self.index.len()
        } else {
            self.index
                .first_keys
                .partition_point(|k| *k <= lo)
                .saturating_sub(1)
        };
        let end = if lo > hi || self.index.is_empty() || lo > self.index.last_key {
            first
        } else {
            self.index.first_keys.partition_point(|k| *k <= hi)
        };
        first..end
    }

    /// Asks the kernel to start reading, in the background, those of
    /// `blocks` the cache lacks ([`BlockSource::will_need`], one hint per
    /// stretch of them contiguous in the file), looking at blocks from the
    /// first until their bytes (cached or not) pass `budget_bytes`; at
    /// least one block is looked at. Returns the bytes looked at and the
    /// end of the blocks looked at. A walk of the blocks that follows finds
    /// them in the page cache, read by the device many at a time, instead
    /// of waiting on each read in turn.
    pub fn will_read(&self, blocks: Range<usize>, budget_bytes: u64) -> (u64, usize) {
        let end = blocks.end.min(self.index.len());
        let mut looked_bytes = 0u64;
        let mut stretch: Option<(u64, u64)> = None;
        let mut i = blocks.start;
        while i < end && (i == blocks.start || looked_bytes < budget_bytes) {
            let (offset, len) = (self.index.offsets[i], u64::from(self.index.lens[i]));
            looked_bytes += len;
            i += 1;
            if self.cache.contains(self.cache_id, offset) {
                if let Some((at, len)) = stretch.take() {
                    self.source.will_need(at, len);
                }
                continue;
            }
            // A stretch is of the blocks right before this one (a cached
            // block ends it), so it grows to this block's end, over any
            // padding between them.
            stretch = match stretch {
                Some((at, _)) => Some((at, offset + len - at)),
                None => Some((offset, len)),
            };
        }
        if let Some((at, len)) = stretch {
            self.source.will_need(at, len);
        }
        (looked_bytes, i)
    }

    /// The largest key block `i` may hold: one below the next block's
    /// first key, or the file's last key.
    pub fn last_key_of_block(&self, i: usize) -> u128 {
        match self.index.bounds(i) {
            (_, Some(next_first)) => next_first - 1,
            (_, None) => self.index.last_key,
        }
    }

    /// The first block at or after `from` whose keys may reach past
    /// `key`'s block: the index of the block that would hold `key`, found
    /// by galloping forward from `from` (a scan's next curve run is mostly
    /// a block or two on), not by a search of the whole index.
    fn block_from(&self, from: usize, key: u128) -> usize {
        let fences = &self.index.first_keys;
        let mut step = 1;
        let mut hi = from;
        while hi < fences.len() && fences[hi] <= key {
            hi = from + step;
            step *= 2;
        }
        let lo = from + step / 4;
        let hi = hi.min(fences.len());
        let lo = lo.min(hi);
        (lo + fences[lo..hi].partition_point(|k| *k <= key)).saturating_sub(1)
    }

    /// Reads and checks every block, bypassing the cache (`--verify`):
    /// every problem found, whether the counts match the footer, and
    /// whether the filter holds every key (a filter that lacks one would
    /// hide that cell from lookups; the filter's checksum or MAC makes
    /// that damage, not chance).
    pub fn verify(&self) -> Vec<RunFileError> {
        let mut problems = Vec::new();
        if let Err(e) = self.load_filter() {
            problems.push(e);
        }
        let (mut entries, mut tombstones) = (0u64, 0u64);
        let mut unfiltered = None;
        for i in 0..self.index.len() {
            if let Err(e) = self.check_padding(i) {
                problems.push(e);
            }
            match self.read_block(i) {
                Ok(block) => {
                    entries += block.len() as u64;
                    tombstones += (0..block.len())
                        .filter(|&j| block.value(j).is_none())
                        .count() as u64;
                    unfiltered = unfiltered.or_else(|| {
                        (0..block.len())
                            .map(|j| block.key(j))
                            .find(|k| !self.may_contain(*k))
                    });
                }
                Err(e) => problems.push(e),
            }
        }
        if let Some(key) = unfiltered {
            problems.push(RunFileError::Corrupt {
                path: self.path.clone(),
                offset: self.footer.filter_offset(),
                reason: format!(
                    "the Bloom filter lacks key {key:#x}, which the blocks hold: lookups of \
                     it would miss it"
                ),
            });
        }
        let counted = (entries, tombstones);
        let footer = (self.footer.entry_count, self.footer.tombstone_count);
        if problems.is_empty() && counted != footer {
            problems.push(RunFileError::Corrupt {
                path: self.path.clone(),
                offset: self.footer.index_offset + self.footer.index_len,
                reason: format!(
                    "the footer counts {} entries ({} tombstones), the blocks hold {} ({})",
                    footer.0, footer.1, counted.0, counted.1
                ),
            });
        }
        problems
    }

    /// The bytes a version-4 file spends before block `i` to start it at a
    /// page must be zeros: one encoding of each file (`verify` only; no
    /// read uses them).
    fn check_padding(&self, i: usize) -> Result<(), RunFileError> {
        let end = match i {
            0 => 0,
            _ => self.index.offsets[i - 1] + u64::from(self.index.lens[i - 1]),
        };
        let gap = (self.index.offsets[i] - end) as usize;
        if gap == 0 {
            return Ok(());
        }
        let padding = read_piece(self.source.as_ref(), &self.path, end, gap)?;
        match padding.iter().position(|b| *b != 0) {
            None => Ok(()),
            Some(at) => Err(RunFileError::Corrupt {
                path: self.path.clone(),
                offset: end + at as u64,
                reason: format!("the padding before block {i} is not all zeros"),
            }),
        }
    }

    /// Block `i`, from the cache or read from the file (and cached).
    fn block(&self, i: usize) -> Result<Arc<DecodedBlock>, RunFileError> {
        let offset = self.index.offsets[i];
        if let Some(block) = self.cache.get(self.cache_id, offset) {
            return Ok(block);
        }
        let block = Arc::new(self.read_block(i)?);
        self.cache.insert(self.cache_id, offset, &block);
        Ok(block)
    }

    fn read_block(&self, i: usize) -> Result<DecodedBlock, RunFileError> {
        let (offset, len) = (self.index.offsets[i], self.index.lens[i] as usize);
        let stored = read_piece(self.source.as_ref(), &self.path, offset, len)?;
        self.decode_block(i, stored)
    }

    fn decode_block(&self, i: usize, stored: Vec<u8>) -> Result<DecodedBlock, RunFileError> {
        let offset = self.index.offsets[i];
        let corrupt = |reason: String| RunFileError::Corrupt {
            path: self.path.clone(),
            offset,
            reason: format!("block {i}: {reason}"),
        };
        let pieces = Pieces {
            mode: self.footer.mode,
            keyring: self.keyring.as_deref(),
            id: &self.id,
        };
        let payload = pieces.open(Piece::Block, offset, stored).map_err(corrupt)?;
        let (first, upper) = self.index.bounds(i);
        DecodedBlock::decode(payload, first, upper, self.index.last_key).map_err(corrupt)
    }

    /// Blocks `from..to` (contiguous in the file, none cached) in one
    /// `pread`; if that fails, one by one, so that a bad sector fails only
    /// the block it is in.
    fn read_span(&self, from: usize, to: usize) -> Vec<Result<Arc<DecodedBlock>, RunFileError>> {
        let start = self.index.offsets[from];
        let end = self.index.offsets[to - 1] + u64::from(self.index.lens[to - 1]);
        let mut span = vec![0u8; (end - start) as usize];
        let whole = self.source.read_exact_at(&mut span, start).is_ok();
        (from..to)
            .map(|i| {
                let block = if whole {
                    let at = (self.index.offsets[i] - start) as usize;
                    let stored = span[at..at + self.index.lens[i] as usize].to_vec();
                    self.decode_block(i, stored)
                } else {
                    self.read_block(i)
                }?;
                let block = Arc::new(block);
                self.cache
                    .insert(self.cache_id, self.index.offsets[i], &block);
                Ok(block)
            })
            .collect()
    }
}

/// The `len` bytes of `source` at `offset` (a block, a filter); an I/O
/// error names `path` and the offset.
pub(super) fn read_piece(
    source: &dyn BlockSource,
    path: &Path,
    offset: u64,
    len: usize,
) -> Result<Vec<u8>, RunFileError> {
    let mut stored = vec![0u8; len];
    source
        .read_exact_at(&mut stored, offset)
        .map_err(|source| RunFileError::Io {
            path: path.to_path_buf(),
            offset,
            source,
        })?;
    Ok(stored)
}

/// The run's footer, checked against the file's length, and where it
/// starts.
fn read_footer(source: &dyn BlockSource, path: &Path) -> Result<(Footer, u64), RunFileError> {
    let file_len = source.len().map_err(|source| RunFileError::Io {
        path: path.to_path_buf(),
        offset: 0,
        source,
    })?;
    let footer_at = file_len.saturating_sub(FOOTER_BYTES as u64);
    let raw = read_piece(source, path, footer_at, (file_len - footer_at) as usize)?;
    let footer = Footer::decode(&raw, file_len).map_err(|r| corrupt(path, footer_at, r))?;
    Ok((footer, footer_at))
}

/// Checks the file MAC over the stored index, what of the filter it
/// covers (`filter_part`) and the footer's fields.
fn check_file_mac(
    path: &Path,
    keyring: &Keyring,
    id: &Identity,
    footer: &Footer,
    footer_at: u64,
    index_stored: &[u8],
    filter_part: &[u8],
) -> Result<(), RunFileError> {
    let fields = footer.encode_fields();
    let mac = file_mac(keyring, &id.dir_id, index_stored, filter_part, &fields)
        .map_err(|reason| key_error(path, reason))?;
    if !tags_equal(&mac, &footer.mac) {
        return Err(corrupt(
            path,
            footer_at,
            "the index, filter and footer do not match their MAC: changed, or not of \
             this data dir"
                .into(),
        ));
    }
    Ok(())
}

/// The block index, its stored piece checked (and, sealed, decrypted)
/// before it is decoded against the footer.
fn decode_index(
    path: &Path,
    mode: Mode,
    keyring: Option<&Keyring>,
    id: &Identity,
    footer: &Footer,
    stored: Vec<u8>,
) -> Result<BlockIndex, RunFileError> {
    let pieces = Pieces { mode, keyring, id };
    let payload = pieces
        .open(Piece::Index, footer.index_offset, stored)
        .map_err(|r| corrupt(path, footer.index_offset, format!("block index: {r}")))?;
    BlockIndex::decode(&payload, footer)
        .map_err(|r| corrupt(path, footer.index_offset, format!("block index: {r}")))
}

/// Opens a file of the real file system for reading, privately (no
/// symbolic link followed, owned by the daemon's user).
fn open_private(path: &Path) -> Result<File, RunFileError> {
    crate::private_files::open_private_file(path, OpenOptions::new().read(true), false).map_err(
        |source| RunFileError::Io {
            path: path.to_path_buf(),
            offset: 0,
            source,
        },
    )
}

fn key_error(path: &Path, reason: String) -> RunFileError {
    RunFileError::Key {
        path: path.to_path_buf(),
        reason,
    }
}

/// A file found malformed at `offset`.
fn corrupt(path: &Path, offset: u64, reason: String) -> RunFileError {
    RunFileError::Corrupt {
        path: path.to_path_buf(),
        offset,
        reason,
    }
}

/// Refuses a file protected otherwise than its reader expects.
fn check_mode(path: &Path, found: Mode, wanted: Mode) -> Result<(), RunFileError> {
    if found == wanted {
        return Ok(());
    }
    let reason = match (found, wanted) {
        (_, Mode::Plain) => format!(
            "the file is {found:?} and needs the data dir's master key; start cubed with --key-file"
        ),
        _ => format!(
            "the file is {found:?} but its namespace requires {wanted:?}: refusing a file \
             that may have been put in place of the protected one"
        ),
    };
    Err(key_error(path, reason))
}

/// The entries of a key range, in key order: `(key, value or tombstone)`.
/// After an error it ends.
pub struct RunFileRange<'r> {
    reader: &'r RunFileReader,
    lo: u128,
    hi: u128,
    next_block: usize,
    end_block: usize,
    /// Blocks read ahead, in order, not yet entered.
    window: VecDeque<Result<Arc<DecodedBlock>, RunFileError>>,
    /// Blocks the next fill reads ahead: 1 at first, doubling with each
    /// fill up to [`READ_AHEAD_BLOCKS`]. A short range (a scan's curve
    /// run, a `next_key_after`) reads or looks up one block, not eight;
    /// a long one soon reads eight at a time.
    ahead_blocks: usize,
    /// The block being walked and the next entry in it.
    current: Option<(Arc<DecodedBlock>, usize)>,
    /// The index of `current`'s block.
    current_block: usize,
    done: bool,
}

impl RunFileRange<'_> {
    /// Fills the window with the next blocks: cached ones as they are,
    /// runs of the others in one read each.
    fn fill_window(&mut self) {
        let r = self.reader;
        let from = self.next_block;
        let mut to = from;
        let mut bytes = 0usize;
        while to < self.end_block && to - from < self.ahead_blocks {
            let len = r.index.lens[to] as usize;
            if to > from && bytes + len > READ_AHEAD_BYTES {
                break;
            }
            bytes += len;
            to += 1;
        }
        let cached: Vec<Option<Arc<DecodedBlock>>> = (from..to)
            .map(|i| r.cache.get(r.cache_id, r.index.offsets[i]))
            .collect();
        let mut i = from;
        while i < to {
            if let Some(block) = &cached[i - from] {
                self.window.push_back(Ok(Arc::clone(block)));
                i += 1;
                continue;
            }
            let mut j = i + 1;
            while j < to && cached[j - from].is_none() {
                j += 1;
            }
            self.window.extend(r.read_span(i, j));
            i = j;
        }
        self.next_block = to;
        self.ahead_blocks = (self.ahead_blocks * 2).min(READ_AHEAD_BLOCKS);
    }
}

impl RunFileRange<'_> {
    /// Whether this is a range of `run`.
    pub fn reads(&self, run: &RunFileReader) -> bool {
        std::ptr::eq(self.reader, run)
    }

    /// Makes this range `lo..=hi`, which must not start before any key it
    /// has already passed (a scan's next curve run): the block it is in
    /// and the blocks it read ahead are kept, so a run of curve runs that
    /// share a block costs one block lookup, not one each, and the index is
    /// searched forward from where the range is.
    pub fn seek_forward(&mut self, lo: u128, hi: u128) {
        let r = self.reader;
        if lo > hi || r.index.is_empty() || lo > r.index.last_key {
            self.lo = lo;
            self.hi = hi;
            self.done = true;
            return;
        }
        // Blocks before the window's first: the current one, if any.
        let window_first = self.next_block - self.window.len();
        let base = if self.current.is_some() {
            self.current_block
        } else {
            window_first
        };
        let target = r.block_from(base, lo).max(base);
        if self.current.is_some() && target != self.current_block {
            self.current = None;
        }
        if self.current.is_none() {
            // Drop the window's blocks before `target`; past the window,
            // start reading at `target`.
            let mut first = window_first;
            while first < target && self.window.pop_front().is_some() {
                first += 1;
            }
            if self.window.is_empty() {
                self.next_block = self.next_block.max(target);
            }
        }
        self.lo = lo;
        self.hi = hi;
        self.end_block = r.block_from(target, hi) + 1;
        self.done = false;
        if let Some((block, at)) = &mut self.current {
            *at = block.search(lo).unwrap_or_else(|i| i);
        }
    }

    /// Calls `visit(key, value, or None for a tombstone)` for each entry
    /// left, in key order, with the value borrowed from its block (no copy
    /// and no allocation per entry, which the iterator pays for each
    /// value it hands out); stops early when `visit` returns false. After
    /// an error the range is over.
    pub fn visit(
        &mut self,
        mut visit: impl FnMut(u128, Option<&[u8]>) -> bool,
    ) -> Result<(), RunFileError> {
        loop {
            if self.done {
                return Ok(());
            }
            if let Some((block, at)) = &mut self.current {
                while *at < block.len() {
                    let key = block.key(*at);
                    if key > self.hi {
                        self.done = true;
                        return Ok(());
                    }
                    let i = *at;
                    *at += 1;
                    if !visit(key, block.value(i)) {
                        return Ok(());
                    }
                }
                self.current = None;
            }
            if !self.enter_next_block()? {
                return Ok(());
            }
        }
    }

    /// Steps a cursor over the range: moves to the next entry, which
    /// [`RunFileRange::entry`] then shows (values borrowed from the block, as
    /// in [`RunFileRange::visit`]); false at the end. For merging several
    /// ranges without copying. After an error the range is over.
    pub fn advance(&mut self) -> Result<bool, RunFileError> {
        loop {
            if self.done {
                return Ok(false);
            }
            if let Some((block, at)) = &mut self.current {
                if *at < block.len() {
                    if block.key(*at) > self.hi {
                        self.done = true;
                        return Ok(false);
                    }
                    *at += 1;
                    return Ok(true);
                }
                self.current = None;
            }
            if !self.enter_next_block()? {
                return Ok(false);
            }
        }
    }

    /// The entry the last [`RunFileRange::advance`] that returned true moved
    /// to; `None` before the first or after the end.
    pub fn entry(&self) -> Option<(u128, Option<&[u8]>)> {
        if self.done {
            return None;
        }
        let (block, at) = self.current.as_ref()?;
        let i = at.checked_sub(1)?;
        Some((block.key(i), block.value(i)))
    }

    /// Enters the next block of the range (reading ahead as needed); false
    /// when there is none.
    fn enter_next_block(&mut self) -> Result<bool, RunFileError> {
        if self.window.is_empty() {
            if self.next_block >= self.end_block {
                self.done = true;
                return Ok(false);
            }
            self.fill_window();
        }
        let block_index = self.next_block - self.window.len();
        match self.window.pop_front() {
            Some(Ok(block)) => {
                let at = block.search(self.lo).unwrap_or_else(|i| i);
                self.current = Some((block, at));
                self.current_block = block_index;
                Ok(true)
            }
            Some(Err(e)) => {
                self.done = true;
                Err(e)
            }
            None => {
                self.done = true;
                Ok(false)
            }
        }
    }
}

impl Iterator for RunFileRange<'_> {
    type Item = Result<(u128, Slot), RunFileError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.done {
                return None;
            }
            if let Some((block, at)) = &mut self.current {
                if *at < block.len() {
                    let key = block.key(*at);
                    if key > self.hi {
                        self.done = true;
                        return None;
                    }
                    let value = block.value(*at).map(CellValue::new);
                    *at += 1;
                    return Some(Ok((key, value)));
                }
                self.current = None;
            }
            if self.window.is_empty() {
                if self.next_block >= self.end_block {
                    self.done = true;
                    return None;
                }
                self.fill_window();
            }
            let block_index = self.next_block - self.window.len();
            match self.window.pop_front()? {
                Ok(block) => {
                    let at = block.search(self.lo).unwrap_or_else(|i| i);
                    self.current = Some((block, at));
                    self.current_block = block_index;
                }
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
    }
}

/// A run file's bytes in memory: for tools that have the bytes already
/// (the fuzz target, tests that damage a copy).
impl BlockSource for Vec<u8> {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let start = usize::try_from(offset).map_err(|_| io::ErrorKind::UnexpectedEof)?;
        let bytes = start
            .checked_add(buf.len())
            .and_then(|end| self.get(start..end))
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(bytes);
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        Ok(Vec::len(self) as u64)
    }
}
