//! One WAL segment file.
//!
//! Named `<first-lsn as 20 decimal digits>.wal`, so that lexical order is
//! LSN order. A fixed 32-byte header, then records back to back:
//!
//! ```text
//! offset size field
//! 0      8    magic       "CUBEWAL\0"
//! 8      4    version     u32 LE = 2
//! 12     8    first_lsn   u64 LE, LSN of the first record (equals the name)
//! 20     4    crc_seed    u32 LE, secret, nonzero: the initial CRC32C state
//!                         of every record in the segment (crc_seed.rs)
//! 24     4    reserved    0
//! 28     4    header_crc  u32 LE, CRC32C of bytes 0..28
//! ```
//!
//! Version 3, written when cubed has a master key (a chained log,
//! chain.rs), has an 80-byte header: bytes 0..28 as above with version =
//! 3, then
//!
//! ```text
//! 28     16   dir_id      the data dir's random id (checkpoint/manifest.rs)
//! 44     32   chain_in    the chain value before the segment's first group:
//!                         the MAC of the last group of the segment before,
//!                         or, for the first chained segment, where the
//!                         chain starts
//! 76     4    header_crc  u32 LE, CRC32C of bytes 0..76
//! ```
//!
//! Version 1 (still read, never written) had a 24-byte header: magic,
//! version = 1, first_lsn, then header_crc of bytes 0..20, and records
//! with plain CRC32C ([`CrcSeed::UNSEEDED`]).
//!
//! Segments are **preallocated**: the file is zero-filled to its full size
//! (and synced) before records land in it, so that each group's
//! `fdatasync` only flushes data, not a file-size change. On this class of
//! disk that is the difference between about 100 us and 250-800 us per sync.
//! Records therefore end where the zeros begin; recovery treats an all-zero
//! remainder as the end of the log.

use std::io;
use std::path::{Path, PathBuf};

use byteorder::{ByteOrder, LittleEndian};

use super::chain::ChainState;
use super::crc_seed::CrcSeed;
use crate::crypto::{DIR_ID_BYTES, MAC_BYTES};
use crate::data_dir::sync_dir;
use crate::error::StoreError;
use crate::storage::{OpenMode, Storage, StorageFile};

/// The header this build writes (version 2).
pub const SEGMENT_HEADER_BYTES: usize = 32;
/// The header of a version-1 segment.
pub const V1_SEGMENT_HEADER_BYTES: usize = 24;
pub const SEGMENT_MAGIC: &[u8; 8] = b"CUBEWAL\0";
/// The version this build writes without a key; it also reads version 1.
pub const SEGMENT_VERSION: u32 = 2;
/// The version of a chained segment (with a master key).
pub const SEGMENT_VERSION_CHAINED: u32 = 3;
/// The header of a chained segment.
pub const CHAINED_SEGMENT_HEADER_BYTES: usize = 80;

pub fn segment_file_name(first_lsn: u64) -> String {
    format!("{first_lsn:020}.wal")
}

/// The first LSN encoded in a segment's file name, if it is one.
pub fn parse_segment_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".wal")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The header of a new segment: version 2, or with `chain` version 3.
pub fn encode_segment_header(
    first_lsn: u64,
    crc_seed: CrcSeed,
    chain: Option<&ChainState>,
) -> Vec<u8> {
    assert!(
        crc_seed != CrcSeed::UNSEEDED,
        "a version-2 segment has a seed"
    );
    let len = if chain.is_some() {
        CHAINED_SEGMENT_HEADER_BYTES
    } else {
        SEGMENT_HEADER_BYTES
    };
    let mut h = vec![0u8; len];
    h[0..8].copy_from_slice(SEGMENT_MAGIC);
    let version = if chain.is_some() {
        SEGMENT_VERSION_CHAINED
    } else {
        SEGMENT_VERSION
    };
    LittleEndian::write_u32(&mut h[8..12], version);
    LittleEndian::write_u64(&mut h[12..20], first_lsn);
    LittleEndian::write_u32(&mut h[20..24], crc_seed.to_u32());
    if let Some(chain) = chain {
        h[28..44].copy_from_slice(&chain.dir_id);
        h[44..76].copy_from_slice(&chain.prev);
    }
    let crc = crc32c::crc32c(&h[0..len - 4]);
    LittleEndian::write_u32(&mut h[len - 4..len], crc);
    h
}

/// A segment's header, read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    pub first_lsn: u64,
    pub crc_seed: CrcSeed,
    /// Where the first record starts.
    pub header_bytes: usize,
    /// Version 3: the data dir id and the chain value the segment starts from.
    pub chain: Option<ChainState>,
}

/// How many bytes the header at the start of `bytes` needs: a file shorter
/// than that is a creation torn before its header was whole.
pub fn header_bytes_needed(bytes: &[u8]) -> usize {
    match bytes.get(8..12).map(LittleEndian::read_u32) {
        Some(1) => V1_SEGMENT_HEADER_BYTES,
        Some(SEGMENT_VERSION_CHAINED) => CHAINED_SEGMENT_HEADER_BYTES,
        _ => SEGMENT_HEADER_BYTES,
    }
}

/// Returns the header, or why it is not valid.
pub fn parse_segment_header(bytes: &[u8]) -> Result<SegmentHeader, String> {
    let needed = header_bytes_needed(bytes);
    if bytes.len() < needed {
        return Err(format!(
            "segment header is {} bytes, needs {needed}",
            bytes.len()
        ));
    }
    if &bytes[0..8] != SEGMENT_MAGIC {
        return Err("not a cube WAL segment (bad magic)".into());
    }
    let version = LittleEndian::read_u32(&bytes[8..12]);
    if version != 1 && version != SEGMENT_VERSION && version != SEGMENT_VERSION_CHAINED {
        return Err(format!(
            "segment format version {version} is not supported (this build reads 1 to {SEGMENT_VERSION_CHAINED}), or the header is damaged"
        ));
    }
    let crc_at = needed - 4;
    let stored = LittleEndian::read_u32(&bytes[crc_at..needed]);
    let computed = crc32c::crc32c(&bytes[0..crc_at]);
    if stored != computed {
        return Err(format!(
            "segment header checksum mismatch (stored {stored:08x}, computed {computed:08x})"
        ));
    }
    let crc_seed = if version == 1 {
        CrcSeed::UNSEEDED
    } else {
        let seed = CrcSeed::from_u32(LittleEndian::read_u32(&bytes[20..24]));
        if seed == CrcSeed::UNSEEDED || LittleEndian::read_u32(&bytes[24..28]) != 0 {
            return Err(
                "version-2 segment header with a zero seed or nonzero reserved bytes".into(),
            );
        }
        seed
    };
    let chain = (version == SEGMENT_VERSION_CHAINED).then(|| {
        let mut state = ChainState {
            dir_id: [0; DIR_ID_BYTES],
            prev: [0; MAC_BYTES],
        };
        state.dir_id.copy_from_slice(&bytes[28..44]);
        state.prev.copy_from_slice(&bytes[44..76]);
        state
    });
    Ok(SegmentHeader {
        first_lsn: LittleEndian::read_u64(&bytes[12..20]),
        crc_seed,
        header_bytes: needed,
        chain,
    })
}

/// Zero-fill chunk for preallocation.
const ZERO_CHUNK_BYTES: usize = 1024 * 1024;

/// Temp files of preallocated segments not yet installed; recovery deletes
/// leftovers from a crash.
pub const PREPARED_SUFFIX: &str = ".prealloc.tmp";

fn zero_fill(file: &mut dyn StorageFile, from: u64, to: u64) -> io::Result<()> {
    let zeros = vec![0u8; ZERO_CHUNK_BYTES];
    let mut at = from;
    while at < to {
        let n = (to - at).min(ZERO_CHUNK_BYTES as u64) as usize;
        file.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

/// The segment the writer appends to.
pub struct WalSegment {
    path: PathBuf,
    file: Box<dyn StorageFile>,
    first_lsn: u64,
    /// The seed of every record's checksum in this file.
    crc_seed: CrcSeed,
    /// Where the first record starts (the header's size).
    header_bytes: u64,
    /// Where the next record goes: the end of the valid records.
    len_bytes: u64,
}

impl WalSegment {
    /// Creates and preallocates a segment durably: header and zeros are
    /// synced, and so is the directory entry, before any record lands.
    pub fn create(
        storage: &dyn Storage,
        dir: &Path,
        first_lsn: u64,
        crc_seed: CrcSeed,
        chain: Option<&ChainState>,
        preallocate_bytes: u64,
    ) -> Result<WalSegment, StoreError> {
        let path = dir.join(segment_file_name(first_lsn));
        let mut file = storage
            .open(&path, OpenMode::CreateNew)
            .map_err(|e| StoreError::io(&path, e))?;
        let header = encode_segment_header(first_lsn, crc_seed, chain);
        let header_bytes = header.len() as u64;
        file.write_all_at(&header, 0)
            .and_then(|()| zero_fill(file.as_mut(), header_bytes, preallocate_bytes))
            .and_then(|()| file.sync_data())
            .map_err(|e| StoreError::io(&path, e))?;
        sync_dir(storage, dir)?;
        Ok(WalSegment {
            path,
            file,
            first_lsn,
            crc_seed,
            header_bytes,
            len_bytes: header_bytes,
        })
    }

    /// Reopens the segment recovery ended on, to append after its last
    /// valid record (recovery already zeroed anything torn beyond it). The
    /// appended records take the segment's own seed (the engine never
    /// appends to a version-1 segment: `Engine::open` starts a new one).
    pub fn open_for_append(
        storage: &dyn Storage,
        path: &Path,
        header: SegmentHeader,
        len_bytes: u64,
    ) -> Result<WalSegment, StoreError> {
        let file = storage
            .open(path, OpenMode::Existing)
            .map_err(|e| StoreError::io(path, e))?;
        let actual = file.len().map_err(|e| StoreError::io(path, e))?;
        assert!(
            actual >= len_bytes && len_bytes >= header.header_bytes as u64,
            "recovery's end of log lies within the file, after the header"
        );
        Ok(WalSegment {
            path: path.to_path_buf(),
            file,
            first_lsn: header.first_lsn,
            crc_seed: header.crc_seed,
            header_bytes: header.header_bytes as u64,
            len_bytes,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn first_lsn(&self) -> u64 {
        self.first_lsn
    }

    pub fn len_bytes(&self) -> u64 {
        self.len_bytes
    }

    pub fn crc_seed(&self) -> CrcSeed {
        self.crc_seed
    }

    /// No record has been appended yet.
    pub fn holds_no_records(&self) -> bool {
        self.len_bytes == self.header_bytes
    }

    /// One positioned write for a whole group, into preallocated space (or
    /// past it, growing the file, if a group is larger than the segment).
    /// On error the segment's tail is unknown; the caller must latch and
    /// never append again.
    pub fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.file.write_all_at(bytes, self.len_bytes)?;
        self.len_bytes += bytes.len() as u64;
        Ok(())
    }

    /// `fdatasync`. Never retried on failure (after a failed fsync the
    /// kernel may have dropped the dirty pages).
    pub fn sync(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }
}

/// A zero-filled, synced file waiting under a temp name to become the next
/// segment. Preparing it off the writer's path keeps the 10-100 ms of
/// zero-filling out of write latency.
pub struct PreparedSegment {
    tmp_path: PathBuf,
    file: Box<dyn StorageFile>,
}

impl PreparedSegment {
    /// Prepares `next-<n>.prealloc.tmp`. Only one daemon uses a data dir
    /// (it is locked) and recovery deletes leftovers before numbering
    /// restarts, so `n` counting from 0 per engine cannot collide; a name
    /// that does not depend on the process also keeps simulations seeded.
    pub fn prepare(
        storage: &dyn Storage,
        dir: &Path,
        bytes: u64,
        n: u64,
    ) -> Result<PreparedSegment, StoreError> {
        let tmp_path = dir.join(format!("next-{n}{PREPARED_SUFFIX}"));
        let result = (|| {
            let mut file = storage.open(&tmp_path, OpenMode::CreateTruncate)?;
            zero_fill(
                file.as_mut(),
                0,
                bytes.max(CHAINED_SEGMENT_HEADER_BYTES as u64),
            )?;
            file.sync_data()?;
            Ok(file)
        })();
        match result {
            Ok(file) => Ok(PreparedSegment { tmp_path, file }),
            Err(e) => {
                let _ = storage.remove_file(&tmp_path);
                Err(StoreError::io(&tmp_path, e))
            }
        }
    }

    /// Writes the header, syncs it, renames the file into place and syncs
    /// the directory: only then may records be appended.
    pub fn install(
        mut self,
        storage: &dyn Storage,
        dir: &Path,
        first_lsn: u64,
        crc_seed: CrcSeed,
        chain: Option<&ChainState>,
    ) -> Result<WalSegment, StoreError> {
        let path = dir.join(segment_file_name(first_lsn));
        let header = encode_segment_header(first_lsn, crc_seed, chain);
        let header_bytes = header.len() as u64;
        self.file
            .write_all_at(&header, 0)
            .and_then(|()| self.file.sync_data())
            .map_err(|e| StoreError::io(&self.tmp_path, e))?;
        storage
            .rename(&self.tmp_path, &path)
            .map_err(|e| StoreError::io(&path, e))?;
        sync_dir(storage, dir)?;
        Ok(WalSegment {
            path,
            file: self.file,
            first_lsn,
            crc_seed,
            header_bytes,
            len_bytes: header_bytes,
        })
    }

    /// Removes an unused prepared file.
    pub fn discard(self, storage: &dyn Storage) {
        let _ = storage.remove_file(&self.tmp_path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sort_by_lsn_and_parse_back() {
        assert_eq!(segment_file_name(42), "00000000000000000042.wal");
        assert_eq!(
            parse_segment_file_name(&segment_file_name(u64::MAX)),
            Some(u64::MAX)
        );
        assert_eq!(parse_segment_file_name("42.wal"), None);
        assert_eq!(parse_segment_file_name("0000000000000000004x.wal"), None);
    }

    #[test]
    fn header_round_trips_and_damage_is_named() {
        let seed = CrcSeed::from_u32(0xdead_beef);
        let h = encode_segment_header(9, seed, None);
        assert_eq!(
            parse_segment_header(&h),
            Ok(SegmentHeader {
                first_lsn: 9,
                crc_seed: seed,
                header_bytes: SEGMENT_HEADER_BYTES,
                chain: None,
            })
        );
        let chain = ChainState {
            dir_id: [1; DIR_ID_BYTES],
            prev: [2; MAC_BYTES],
        };
        let chained = encode_segment_header(9, seed, Some(&chain));
        assert_eq!(chained.len(), CHAINED_SEGMENT_HEADER_BYTES);
        assert_eq!(parse_segment_header(&chained).unwrap().chain, Some(chain));
        for byte in 0..CHAINED_SEGMENT_HEADER_BYTES {
            let mut bad = chained.clone();
            bad[byte] ^= 1;
            assert!(parse_segment_header(&bad).is_err(), "flip in byte {byte}");
        }
        for byte in 0..SEGMENT_HEADER_BYTES {
            let mut bad = h.clone();
            bad[byte] ^= 1;
            assert!(parse_segment_header(&bad).is_err(), "flip in byte {byte}");
        }
        let mut bad = h.clone();
        bad[13] ^= 1;
        assert!(parse_segment_header(&bad).unwrap_err().contains("checksum"));
        assert!(parse_segment_header(&h[..10]).is_err());
        assert!(parse_segment_header(&h[..31]).is_err());
    }

    #[test]
    fn version_1_headers_are_still_read_unseeded() {
        let mut h = [0u8; V1_SEGMENT_HEADER_BYTES];
        h[0..8].copy_from_slice(SEGMENT_MAGIC);
        LittleEndian::write_u32(&mut h[8..12], 1);
        LittleEndian::write_u64(&mut h[12..20], 5);
        let crc = crc32c::crc32c(&h[0..20]);
        LittleEndian::write_u32(&mut h[20..24], crc);
        assert_eq!(header_bytes_needed(&h), V1_SEGMENT_HEADER_BYTES);
        assert_eq!(
            parse_segment_header(&h),
            Ok(SegmentHeader {
                first_lsn: 5,
                crc_seed: CrcSeed::UNSEEDED,
                header_bytes: V1_SEGMENT_HEADER_BYTES,
                chain: None,
            })
        );
    }
}
