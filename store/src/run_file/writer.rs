//! [`RunFileWriter`]: streams entries, in strictly increasing key order, into
//! a new run file.
//!
//! The file is written under `NAME.tmp` in pieces of [`IO_CHUNK_BYTES`],
//! then `fdatasync`ed, renamed into place and its directory fsynced
//! (docs/robustness.md's durability rules: nothing names a file before its
//! bytes are durable, and a crash leaves at most a `.tmp` to remove). A
//! sealed file's plaintext never reaches the file: each block is sealed
//! in memory before it is queued.
//!
//! The Bloom filter (format version 3) is sized when the writer is
//! created, from the entry count its caller expects (an upper bound: a
//! fold knows its count, a merge the sum of its inputs'), and filled as
//! entries are pushed: the writer holds [`BITS_PER_KEY`] bits (1.25 bytes)
//! per expected entry and nothing per entry besides, where version 2's
//! writer kept each entry's 8-byte hash until the end. More entries than
//! expected are refused (the filter would have fewer bits a key than a
//! reader accepts); far fewer, and [`RunFileWriter::finish`] folds the
//! filter to a size a reader accepts ([`BloomFilter::fold`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::crypto::{Keyring, MAC_BYTES};
use crate::storage::{OpenMode, Storage, StorageFile};

use super::bloom::{
    BITS_PER_KEY, BloomFilter, FilterFill, MAX_OVERSIZE, key_hash, max_bits, min_bits,
};
use super::format::{
    BlockIndex, FORMAT_VERSION, FORMAT_VERSION_NO_FILTER, Footer, Identity, IndexEntry,
    MAX_VALUE_BYTES, Mode, Piece, Pieces, block_offset, entry_bytes, finish_payload, push_entry,
    start_payload,
};
use super::{Protection, RunFileError, TARGET_BLOCK_BYTES};

/// Queued bytes are written once they reach this size.
const IO_CHUNK_BYTES: usize = 1024 * 1024;

/// What a finished run file is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunSummary {
    pub file_bytes: u64,
    pub entries: u64,
    pub tombstones: u64,
    pub blocks: u64,
    /// The footer's MAC (authenticated and sealed files): what a manifest
    /// lists to bind the file to the data dir.
    pub mac: Option<[u8; MAC_BYTES]>,
}

/// Writes one run file; see the module doc.
pub struct RunFileWriter<'a> {
    storage: &'a dyn Storage,
    tmp_path: PathBuf,
    final_path: PathBuf,
    file: Box<dyn StorageFile>,
    mode: Mode,
    keyring: Option<Arc<Keyring>>,
    id: Identity,
    target_block_bytes: usize,
    /// The block being filled (plaintext, never written as is when sealed).
    payload: Vec<u8>,
    payload_entries: u32,
    payload_first: u128,
    /// Stored bytes queued for the file, and the file offset they start at.
    pending: Vec<u8>,
    written: u64,
    index: Vec<IndexEntry>,
    /// The filter, sized for `expected_entries` and filled by `push`;
    /// `None` when writing version 1.
    filter: Option<FilterFill>,
    /// At most this many entries are pushed (the filter is sized for them).
    expected_entries: u64,
    /// [`FORMAT_VERSION`], or [`FORMAT_VERSION_NO_FILTER`] (no filter).
    version: u32,
    last_key: Option<u128>,
    entries: u64,
    tombstones: u64,
}

impl<'a> RunFileWriter<'a> {
    /// Creates `path.tmp` (emptying a stale one a crash left) for at most
    /// `expected_entries` entries (tombstones too), which size the Bloom
    /// filter now. `file_id` must be unique in the data dir and never
    /// reused: it is in every block's associated data.
    pub fn create(
        storage: &'a dyn Storage,
        path: &Path,
        file_id: u64,
        ns_id: u64,
        protection: &Protection,
        expected_entries: u64,
    ) -> Result<RunFileWriter<'a>, RunFileError> {
        let bits = min_bits(expected_entries).ok_or_else(|| RunFileError::Refused {
            path: path.to_path_buf(),
            reason: format!("a filter for {expected_entries} entries overflows"),
        })?;
        let (mode, keyring, dir_id) = protection.parts();
        let keyring = keyring.cloned();
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp_path = PathBuf::from(tmp);
        let file = storage
            .open(&tmp_path, OpenMode::CreateTruncate)
            .map_err(|source| RunFileError::Io {
                path: tmp_path.clone(),
                offset: 0,
                source,
            })?;
        let mut payload = Vec::with_capacity(TARGET_BLOCK_BYTES * 2);
        start_payload(&mut payload);
        Ok(RunFileWriter {
            storage,
            tmp_path,
            final_path: path.to_path_buf(),
            file,
            mode,
            keyring,
            id: Identity {
                file_id,
                ns_id,
                dir_id,
            },
            target_block_bytes: TARGET_BLOCK_BYTES,
            payload,
            payload_entries: 0,
            payload_first: 0,
            pending: Vec::with_capacity(IO_CHUNK_BYTES + TARGET_BLOCK_BYTES * 2),
            written: 0,
            index: Vec::new(),
            filter: Some(FilterFill::new(BloomFilter::with_bits(bits))),
            expected_entries,
            version: FORMAT_VERSION,
            last_key: None,
            entries: 0,
            tombstones: 0,
        })
    }

    /// Another block size target (tests and benchmarks; at least 64 bytes).
    pub fn with_target_block_bytes(mut self, bytes: usize) -> RunFileWriter<'a> {
        self.target_block_bytes = bytes.max(64);
        self
    }

    /// Writes format version 1, without a Bloom filter, as the build
    /// before filters did: for benchmarks that measure what the filter
    /// saves, and tests of how such files read. Never for the store's own
    /// files.
    pub fn without_filter(mut self) -> RunFileWriter<'a> {
        self.version = FORMAT_VERSION_NO_FILTER;
        self.filter = None;
        self
    }

    /// Appends a value (`Some`) or a tombstone (`None`). Keys must be
    /// strictly increasing.
    pub fn push(&mut self, key: u128, value: Option<&[u8]>) -> Result<(), RunFileError> {
        if self.last_key.is_some_and(|last| last >= key) {
            return Err(self.refused(format!("key {key:#x} is not above the previous key")));
        }
        if self.entries == self.expected_entries {
            return Err(self.refused(format!(
                "more entries than the {} the writer was created for (its Bloom filter is \
                 sized for them: a bug in the caller's count)",
                self.expected_entries
            )));
        }
        if let Some(v) = value.filter(|v| v.len() > MAX_VALUE_BYTES) {
            return Err(self.refused(format!(
                "a value of {} bytes (at most {MAX_VALUE_BYTES})",
                v.len()
            )));
        }
        // Version 4 closes a block before this entry would take it past
        // the target stored, so that a block of up to a page fits in one;
        // older versions (`without_filter`) after its payload reached it,
        // as their writers did.
        let stored_with = self.payload.len() + entry_bytes(value) + self.mode.overhead_bytes();
        if self.version == FORMAT_VERSION
            && self.payload_entries > 0
            && stored_with > self.target_block_bytes
        {
            self.flush_block()?;
        }
        if self.payload_entries == 0 {
            self.payload_first = key;
        }
        push_entry(&mut self.payload, key, value);
        if let Some(filter) = &mut self.filter {
            filter.add(key_hash(key));
        }
        self.payload_entries += 1;
        self.entries += 1;
        self.tombstones += u64::from(value.is_none());
        self.last_key = Some(key);
        if self.version != FORMAT_VERSION && self.payload.len() >= self.target_block_bytes {
            self.flush_block()?;
        }
        Ok(())
    }

    /// Seals or checksums the block being filled and queues it.
    fn flush_block(&mut self) -> Result<(), RunFileError> {
        if self.payload_entries == 0 {
            return Ok(());
        }
        finish_payload(&mut self.payload, self.payload_entries);
        let end = self.written + self.pending.len() as u64;
        // The stored length, known before sealing: where the block goes
        // depends on it, and a sealed block's position names its offset.
        let stored_len = (self.payload.len() + self.mode.overhead_bytes()) as u64;
        let offset = block_offset(self.version, end, stored_len)
            .ok_or_else(|| self.refused(format!("a block at {end} overflows the file")))?;
        let mut next = Vec::with_capacity(self.target_block_bytes * 2);
        start_payload(&mut next);
        let payload = std::mem::replace(&mut self.payload, next);
        let stored = self.store(Piece::Block, offset, payload)?;
        assert_eq!(stored.len() as u64, stored_len, "a stored block's overhead");
        let len = u32::try_from(stored.len())
            .map_err(|_| self.refused(format!("a block of {} bytes", stored.len())))?;
        // The zeros that start it at the next page (version 4).
        self.pending
            .resize(self.pending.len() + (offset - end) as usize, 0);
        self.index.push(IndexEntry {
            first_key: self.payload_first,
            offset,
            len,
        });
        self.payload_entries = 0;
        self.pending.extend_from_slice(&stored);
        if self.pending.len() >= IO_CHUNK_BYTES {
            self.write_pending()?;
        }
        Ok(())
    }

    fn store(&self, piece: Piece, offset: u64, payload: Vec<u8>) -> Result<Vec<u8>, RunFileError> {
        let pieces = Pieces {
            mode: self.mode,
            keyring: self.keyring.as_deref(),
            id: &self.id,
        };
        pieces
            .store(piece, offset, payload)
            .map_err(|reason| RunFileError::Key {
                path: self.final_path.clone(),
                reason,
            })
    }

    fn write_pending(&mut self) -> Result<(), RunFileError> {
        self.file
            .write_all_at(&self.pending, self.written)
            .map_err(|source| RunFileError::Io {
                path: self.tmp_path.clone(),
                offset: self.written,
                source,
            })?;
        self.written += self.pending.len() as u64;
        self.pending.clear();
        Ok(())
    }

    fn refused(&self, reason: String) -> RunFileError {
        RunFileError::Refused {
            path: self.final_path.clone(),
            reason,
        }
    }

    /// The filter, as stored after `index_stored` (nothing in version 1).
    fn filter_stored(
        &mut self,
        index_offset: u64,
        index_stored: &[u8],
    ) -> Result<Vec<u8>, RunFileError> {
        let Some(mut filter) = self.filter.take().map(FilterFill::finish) else {
            return Ok(Vec::new());
        };
        // Far fewer entries than expected (a merge that dropped most of
        // its tombstones): fold the filter to twice what they need, within
        // what a reader accepts.
        if max_bits(self.entries).is_some_and(|max| filter.bits() > max) {
            let bits = self.entries * BITS_PER_KEY * (MAX_OVERSIZE / 2);
            filter = filter.fold(bits);
        }
        let filter_offset = index_offset + index_stored.len() as u64;
        let index_crc = super::format::stored_crc(index_stored);
        self.store(Piece::Filter, filter_offset, filter.encode(index_crc))
    }

    /// Writes the index, the filter and the footer, syncs, renames into place and syncs
    /// the directory. A failure leaves only the `.tmp` file (removed by
    /// whoever cleans up after a failed fold); a failed sync is never
    /// retried.
    pub fn finish(mut self) -> Result<RunSummary, RunFileError> {
        self.flush_block()?;
        let index_offset = self.written + self.pending.len() as u64;
        let payload = BlockIndex::encode(&self.index, self.last_key.unwrap_or(0));
        let index_stored = self.store(Piece::Index, index_offset, payload)?;
        let filter_stored = self.filter_stored(index_offset, &index_stored)?;
        let mut footer = Footer {
            version: self.version,
            mode: self.mode,
            file_id: self.id.file_id,
            ns_id: self.id.ns_id,
            entry_count: self.entries,
            tombstone_count: self.tombstones,
            block_count: self.index.len() as u64,
            index_offset,
            index_len: index_stored.len() as u64,
            mac: [0u8; MAC_BYTES],
            filter_stored_len: filter_stored.len() as u64,
        };
        let mac = match self.keyring.as_deref().filter(|_| self.mode != Mode::Plain) {
            Some(k) => {
                let fields = footer.encode_fields();
                let mac = super::format::file_mac(
                    k,
                    &self.id.dir_id,
                    &index_stored,
                    footer.mac_filter_part(&filter_stored),
                    &fields,
                )
                .map_err(|reason| RunFileError::Key {
                    path: self.final_path.clone(),
                    reason,
                })?;
                footer.mac = mac;
                Some(mac)
            }
            None => None,
        };
        self.pending.extend_from_slice(&index_stored);
        self.write_pending()?;
        // The filter from its own buffer: a copy into `pending` would hold
        // it twice.
        self.pending = filter_stored;
        self.write_pending()?;
        self.pending = footer.encode().to_vec();
        self.write_pending()?;
        let io = |path: &Path, source| RunFileError::Io {
            path: path.to_path_buf(),
            offset: 0,
            source,
        };
        self.file.sync_data().map_err(|e| io(&self.tmp_path, e))?;
        self.storage
            .rename(&self.tmp_path, &self.final_path)
            .map_err(|e| io(&self.final_path, e))?;
        if let Some(dir) = self.final_path.parent() {
            self.storage.sync_dir(dir).map_err(|e| io(dir, e))?;
        }
        Ok(RunSummary {
            file_bytes: self.written,
            entries: self.entries,
            tombstones: self.tombstones,
            blocks: self.index.len() as u64,
            mac,
        })
    }
}
