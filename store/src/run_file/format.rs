//! The run file format, byte by byte (`docs/storage-format.md`, "Run
//! files"). Pure functions over byte slices: no I/O, no caching, and no
//! panic on any input; every decoder accepts exactly one encoding.
//!
//! ```text
//! blocks from offset 0, each as stored (version 4: a block that would
//!   cross a 4 KiB page starts at the next page when at most 512 zero
//!   bytes get it there, [`block_offset`]; versions 1-3: back to back):
//!   Plain:          payload | crc32c u32
//!   Authenticated:  payload | mac (32) | crc32c u32
//!   Sealed:         start u64 | counter u64 | AES-256-GCM(payload) | tag (16) | crc32c u32
//!   payload: count u32, then count entries
//!            key u128 | kind u8 (0 tombstone, 1 value) | [len u32 | value]
//! index (at index_offset), stored like a block, of the payload
//!   block_count x (first_key u128 | offset u64 | len u32) | last_key u128
//!   (empty, with no last_key, when the file holds no block)
//! filter (versions 2 and 3; at index_offset + index_len, up to the
//!   footer), stored like a block, of the payload (`bloom`):
//!   version 3: index_crc u32 (the crc32c ending the stored index) |
//!     bits u64 (entry_count x 10 to entry_count x 40) | ceil(bits / 8)
//!     bytes of the Bloom filter's bits, unused high bits of the last zero
//!   version 2: index_crc u32 | ceil(entry_count x 10 / 8) bytes of bits
//! footer (FOOTER_BYTES, the last bytes of the file)
//!   0   8  magic "CUBERUNF"
//!   8   4  version: 4 (1: a file written before filters, 2: a filter
//!           sized by entry_count, 3: blocks back to back; all still read)
//!   12  4  flags: 0 plain, 2 authenticated, 3 sealed (and authenticated)
//!   16  8  file_id
//!   24  8  ns_id
//!   32  8  entry_count
//!   40  8  tombstone_count
//!   48  8  block_count
//!   56  8  index_offset
//!   64  8  index_len (as stored)
//!   72  32 mac: HMAC-SHA256(integrity key, "cube run file v1" | dir_id |
//!           index as stored | the filter's part (version 1: none;
//!           version 2: the filter as stored; version 3: the filter's
//!           stored trailer, its MAC or tag and CRC, [`filter_trailer_bytes`])
//!           | footer bytes 0..72); zeros when plain
//!   104 4  crc32c of footer bytes 0..104
//! ```
//! Integers are little-endian. The crc32c of a block or of the index
//! covers every byte stored before it. A sealed block's associated data,
//! and an authenticated block's MAC input, begin with its position
//! ([`position`]: the file's id, namespace and data dir, and the block's
//! offset), so a block moved to another offset, file, namespace or data dir
//! fails to open.

use byteorder::{ByteOrder, LittleEndian};

use super::bloom::{
    BITS_PER_KEY, MAX_OVERSIZE, filter_bytes, max_bits, min_bits, v3_payload_bytes,
};
use crate::crypto::{DIR_ID_BYTES, Keyring, MAC_BYTES, TAG_BYTES, tags_equal};

pub const MAGIC: &[u8; 8] = b"CUBERUNF";
/// Bumped on any change to this layout. What this build writes: blocks
/// placed so that a block of up to a page never crosses one
/// ([`block_offset`]), so a cold point read is one page from the device.
pub const FORMAT_VERSION: u32 = 4;
/// The version of files whose blocks lie back to back (a 4 KiB block
/// crossing a page boundary as often as not), with a filter whose size
/// its header records; still read.
pub const FORMAT_VERSION_PACKED_BLOCKS: u32 = 3;
/// The version of files whose filter's size follows from the entry count
/// alone; still read.
pub const FORMAT_VERSION_FIXED_FILTER: u32 = 2;
/// The version of files written before Bloom filters: no filter piece;
/// still read (every lookup reads its block).
pub const FORMAT_VERSION_NO_FILTER: u32 = 1;
pub const FOOTER_BYTES: usize = 108;
/// A block is closed before an entry would take its stored size past
/// this (a single larger entry makes a block of its own), so that it fits
/// in one page ([`PAGE_BYTES`]). Chosen by measurement
/// (`store/benches/run_file.rs`, docs/benchmarks.md "Run files"): a 4 KiB
/// block costs about as much to `pread` and check as an 8 KiB one, a
/// cache holds twice as many hot cells as with 8 KiB blocks, and the index
/// (28 bytes per block, always in memory) stays under 1% of the data with
/// 64-byte values.
pub const TARGET_BLOCK_BYTES: usize = 4096;
/// The page a version-4 file's blocks avoid crossing: the unit the page
/// cache reads from the device.
pub const PAGE_BYTES: u64 = 4096;
/// The most zero bytes a version-4 file spends to start a block at the
/// next page (an eighth of it): blocks of 64-byte values waste about 8
/// bytes a page; a block that would waste more (values of about 1 KiB,
/// three to a page) lies right after the one before, crossing the page.
pub const MAX_PAD_BYTES: u64 = 512;
/// The largest value a run file holds (the store's largest record).
pub const MAX_VALUE_BYTES: usize = 64 * 1024 * 1024;
/// No block payload is larger: a full block plus one largest entry.
pub const MAX_BLOCK_BYTES: usize = MAX_VALUE_BYTES + 1024 * 1024;

pub const FLAG_AUTHENTICATED: u32 = 2;
pub const FLAG_SEALED: u32 = 1;
pub const CRC_BYTES: usize = 4;
/// start id and counter in front of a sealed block's ciphertext.
pub const SEAL_PREFIX_BYTES: usize = 16;
pub const INDEX_ENTRY_BYTES: usize = 28;
const KEY_BYTES: usize = 16;
/// count u32 of a block payload.
const BLOCK_HEADER_BYTES: usize = 4;
/// The smallest entry: a tombstone's key and kind.
const MIN_ENTRY_BYTES: usize = KEY_BYTES + 1;
/// The smallest block payload: a count and one tombstone.
const MIN_PAYLOAD_BYTES: usize = BLOCK_HEADER_BYTES + MIN_ENTRY_BYTES;
const KIND_TOMBSTONE: u8 = 0;
const KIND_VALUE: u8 = 1;
/// The MAC label of a run file's index and footer.
pub const FILE_MAC_LABEL: &[u8] = b"cube run file v1";
/// The MAC label of an authenticated (not sealed) block.
pub const BLOCK_MAC_LABEL: &[u8] = b"cube run block v1";
const POSITION_LABEL: &[u8] = b"cube run v1";
pub const POSITION_BYTES: usize = 11 + 1 + 8 + 8 + 8 + DIR_ID_BYTES;

/// How a file's blocks and index are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Plain,
    Authenticated,
    Sealed,
}

impl Mode {
    pub fn flags(self) -> u32 {
        match self {
            Mode::Plain => 0,
            Mode::Authenticated => FLAG_AUTHENTICATED,
            Mode::Sealed => FLAG_AUTHENTICATED | FLAG_SEALED,
        }
    }

    fn from_flags(flags: u32) -> Option<Mode> {
        match flags {
            0 => Some(Mode::Plain),
            FLAG_AUTHENTICATED => Some(Mode::Authenticated),
            f if f == FLAG_AUTHENTICATED | FLAG_SEALED => Some(Mode::Sealed),
            _ => None,
        }
    }

    /// Bytes a stored block or index adds around its payload.
    pub fn overhead_bytes(self) -> usize {
        match self {
            Mode::Plain => CRC_BYTES,
            Mode::Authenticated => MAC_BYTES + CRC_BYTES,
            Mode::Sealed => SEAL_PREFIX_BYTES + TAG_BYTES + CRC_BYTES,
        }
    }
}

/// What a stored piece is: part of its position, so that no piece can
/// pass as another (a block as the index, the index as the filter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Piece {
    Block = 1,
    Index = 2,
    Filter = 3,
}

/// Who a file is: in every position and in the footer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    pub file_id: u64,
    pub ns_id: u64,
    /// The data dir's id; zeros in a data dir without a master key.
    pub dir_id: [u8; DIR_ID_BYTES],
}

/// The associated data of a sealed piece and the start of an
/// authenticated block's MAC input: "cube run v1" | piece u8 | file_id |
/// ns_id | offset | dir_id.
pub fn position(id: &Identity, piece: Piece, offset: u64) -> [u8; POSITION_BYTES] {
    let mut p = [0u8; POSITION_BYTES];
    p[0..11].copy_from_slice(POSITION_LABEL);
    p[11] = piece as u8;
    LittleEndian::write_u64(&mut p[12..20], id.file_id);
    LittleEndian::write_u64(&mut p[20..28], id.ns_id);
    LittleEndian::write_u64(&mut p[28..36], offset);
    p[36..].copy_from_slice(&id.dir_id);
    p
}

/// The footer's fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Footer {
    /// [`FORMAT_VERSION`], or [`FORMAT_VERSION_NO_FILTER`] for an older file.
    pub version: u32,
    pub mode: Mode,
    pub file_id: u64,
    pub ns_id: u64,
    pub entry_count: u64,
    pub tombstone_count: u64,
    pub block_count: u64,
    pub index_offset: u64,
    pub index_len: u64,
    pub mac: [u8; MAC_BYTES],
    /// Not a field of the footer: the bytes between the index and the
    /// footer, the filter as stored, which [`Footer::decode`] checked
    /// against the version and the entry count.
    pub filter_stored_len: u64,
}

impl Footer {
    /// Bytes 0..72: what the MAC covers after the index.
    pub fn encode_fields(&self) -> [u8; 72] {
        let mut f = [0u8; 72];
        f[0..8].copy_from_slice(MAGIC);
        LittleEndian::write_u32(&mut f[8..12], self.version);
        LittleEndian::write_u32(&mut f[12..16], self.mode.flags());
        LittleEndian::write_u64(&mut f[16..24], self.file_id);
        LittleEndian::write_u64(&mut f[24..32], self.ns_id);
        LittleEndian::write_u64(&mut f[32..40], self.entry_count);
        LittleEndian::write_u64(&mut f[40..48], self.tombstone_count);
        LittleEndian::write_u64(&mut f[48..56], self.block_count);
        LittleEndian::write_u64(&mut f[56..64], self.index_offset);
        LittleEndian::write_u64(&mut f[64..72], self.index_len);
        f
    }

    pub fn encode(&self) -> [u8; FOOTER_BYTES] {
        let mut f = [0u8; FOOTER_BYTES];
        f[0..72].copy_from_slice(&self.encode_fields());
        f[72..104].copy_from_slice(&self.mac);
        let crc = crc32c::crc32c(&f[0..104]);
        LittleEndian::write_u32(&mut f[104..108], crc);
        f
    }

    /// Decodes and checks a footer against the size of its file.
    pub fn decode(f: &[u8], file_len: u64) -> Result<Footer, String> {
        if f.len() != FOOTER_BYTES {
            return Err(format!(
                "the file is {file_len} bytes, shorter than a run file footer ({FOOTER_BYTES})"
            ));
        }
        if &f[0..8] != MAGIC {
            return Err("not a cube run file (bad footer magic)".into());
        }
        if LittleEndian::read_u32(&f[104..108]) != crc32c::crc32c(&f[0..104]) {
            return Err("footer checksum mismatch".into());
        }
        let version = LittleEndian::read_u32(&f[8..12]);
        if !(FORMAT_VERSION_NO_FILTER..=FORMAT_VERSION).contains(&version) {
            return Err(format!(
                "run file format version {version} is not supported (this build reads \
                 {FORMAT_VERSION_NO_FILTER} to {FORMAT_VERSION})"
            ));
        }
        let flags = LittleEndian::read_u32(&f[12..16]);
        let mode = Mode::from_flags(flags).ok_or_else(|| format!("unknown flags {flags:#x}"))?;
        let mut mac = [0u8; MAC_BYTES];
        mac.copy_from_slice(&f[72..104]);
        let mut footer = Footer {
            version,
            mode,
            file_id: LittleEndian::read_u64(&f[16..24]),
            ns_id: LittleEndian::read_u64(&f[24..32]),
            entry_count: LittleEndian::read_u64(&f[32..40]),
            tombstone_count: LittleEndian::read_u64(&f[40..48]),
            block_count: LittleEndian::read_u64(&f[48..56]),
            index_offset: LittleEndian::read_u64(&f[56..64]),
            index_len: LittleEndian::read_u64(&f[64..72]),
            mac,
            filter_stored_len: 0,
        };
        footer.check(file_len)?;
        Ok(footer)
    }

    fn check(&mut self, file_len: u64) -> Result<(), String> {
        if self.mode == Mode::Plain && self.mac != [0u8; MAC_BYTES] {
            return Err("a plain run file with a nonzero MAC field".into());
        }
        // Every entry takes at least its smallest size in a block: this
        // bounds the filter a reader allocates by the file's own size.
        if self.entry_count > self.index_offset / MIN_ENTRY_BYTES as u64 {
            return Err(format!(
                "{} entries cannot fit in {} bytes of blocks",
                self.entry_count, self.index_offset
            ));
        }
        let gap = self
            .index_offset
            .checked_add(self.index_len)
            .and_then(|e| e.checked_add(FOOTER_BYTES as u64))
            .and_then(|e| file_len.checked_sub(e));
        let Some(gap) = gap else {
            return Err(format!(
                "index at {} of {} bytes and the footer do not fit in the {file_len}-byte file",
                self.index_offset, self.index_len
            ));
        };
        self.check_filter_len(gap)?;
        self.filter_stored_len = gap;
        let expected = index_stored_len(self.mode, self.block_count);
        if expected != Some(self.index_len) {
            return Err(format!(
                "an index of {} bytes cannot hold {} blocks",
                self.index_len, self.block_count
            ));
        }
        if self.entry_count < self.block_count || self.tombstone_count > self.entry_count {
            return Err(format!(
                "{} entries ({} tombstones) cannot fill {} blocks",
                self.entry_count, self.tombstone_count, self.block_count
            ));
        }
        // Every block takes at least its smallest size: this bounds the
        // index a reader allocates by the file's own size.
        let min_block = (self.mode.overhead_bytes() + MIN_PAYLOAD_BYTES) as u64;
        if self.block_count > self.index_offset / min_block {
            return Err(format!(
                "{} blocks cannot fit in {} bytes",
                self.block_count, self.index_offset
            ));
        }
        if self.block_count == 0 && (self.entry_count != 0 || self.index_offset != 0) {
            return Err("an empty run file with entries or blocks".into());
        }
        Ok(())
    }

    /// Where the filter starts: right after the index.
    pub fn filter_offset(&self) -> u64 {
        self.index_offset.saturating_add(self.index_len)
    }

    /// The filter's stored length (0 in a version-1 file, which has
    /// none).
    pub fn filter_len(&self) -> Option<u64> {
        Some(self.filter_stored_len)
    }

    /// Checks that `gap` bytes between the index and the footer are a
    /// filter this version stores for this many entries: none (version 1),
    /// exactly [`filter_bytes`] (version 2), or from [`min_bits`] to
    /// [`max_bits`] bits and its header (version 3; the header's own bit
    /// count is checked against its length when the filter is read).
    fn check_filter_len(&self, gap: u64) -> Result<(), String> {
        let overhead = self.mode.overhead_bytes() as u64;
        let stored = |payload: Option<u64>| payload.and_then(|p| p.checked_add(overhead));
        let (lo, hi) = match self.version {
            FORMAT_VERSION_NO_FILTER => (Some(0), Some(0)),
            FORMAT_VERSION_FIXED_FILTER => {
                let want = stored(filter_bytes(self.entry_count));
                (want, want)
            }
            _ => (
                stored(min_bits(self.entry_count).and_then(v3_payload_bytes)),
                stored(max_bits(self.entry_count).and_then(v3_payload_bytes)),
            ),
        };
        let (Some(lo), Some(hi)) = (lo, hi) else {
            return Err(format!(
                "a filter for {} entries overflows the file",
                self.entry_count
            ));
        };
        if (lo..=hi).contains(&gap) {
            return Ok(());
        }
        let want = if lo == hi {
            format!("{lo}")
        } else {
            format!(
                "{lo} to {hi}: {BITS_PER_KEY} to {} bits a key",
                BITS_PER_KEY * MAX_OVERSIZE
            )
        };
        Err(format!(
            "a filter of {gap} bytes between the index (at {} of {} bytes) and the footer, \
             for {} entries in format version {} (expected {want})",
            self.index_offset, self.index_len, self.entry_count, self.version
        ))
    }

    /// What of the stored filter the file MAC covers: all of it in a
    /// version-2 file; in a version-3 file its trailer alone (the MAC or
    /// tag that covers its payload, and its CRC), so that a reader checks
    /// the file MAC without reading the filter, and the filter, read later,
    /// must end with that trailer.
    pub fn mac_filter_part<'f>(&self, filter_stored: &'f [u8]) -> &'f [u8] {
        if self.version == FORMAT_VERSION_FIXED_FILTER {
            return filter_stored;
        }
        let trailer = filter_trailer_bytes(self.mode).min(filter_stored.len());
        &filter_stored[filter_stored.len() - trailer..]
    }

    /// True if the open checks (the file MAC) need the whole filter: a
    /// protected version-2 file. Otherwise the filter can be read later.
    pub fn mac_needs_filter(&self) -> bool {
        self.version == FORMAT_VERSION_FIXED_FILTER && self.mode != Mode::Plain
    }
}

/// The last bytes of a stored version-3 filter that the file MAC covers:
/// what stands for its payload (the piece's MAC, or its AES-GCM tag) and
/// its CRC; the CRC alone in a plain file, which has no file MAC.
pub fn filter_trailer_bytes(mode: Mode) -> usize {
    match mode {
        Mode::Plain => CRC_BYTES,
        Mode::Authenticated => MAC_BYTES + CRC_BYTES,
        Mode::Sealed => TAG_BYTES + CRC_BYTES,
    }
}

/// The stored length of the index of `blocks` blocks, or `None` if it
/// overflows.
pub fn index_stored_len(mode: Mode, blocks: u64) -> Option<u64> {
    let payload = if blocks == 0 {
        0
    } else {
        blocks
            .checked_mul(INDEX_ENTRY_BYTES as u64)?
            .checked_add(KEY_BYTES as u64)?
    };
    payload.checked_add(mode.overhead_bytes() as u64)
}

/// Where a block of `len` stored bytes goes when the one before it ends
/// at `end` (0 for the first): in a version-4 file, at the next page
/// boundary when it would otherwise cross one and at most
/// [`MAX_PAD_BYTES`] get it there (the bytes between are zeros); else,
/// and in every older version, at `end`. `None` if it overflows.
pub fn block_offset(version: u32, end: u64, len: u64) -> Option<u64> {
    if version < FORMAT_VERSION {
        return Some(end);
    }
    let in_page = end % PAGE_BYTES;
    if in_page == 0 || in_page.checked_add(len)? <= PAGE_BYTES {
        return Some(end);
    }
    let pad = PAGE_BYTES - in_page;
    if pad <= MAX_PAD_BYTES {
        end.checked_add(pad)
    } else {
        Some(end)
    }
}

/// One block's place in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    pub first_key: u128,
    pub offset: u64,
    pub len: u32,
}

/// The decoded block index: fence keys in their own array so a probe
/// touches only keys.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct BlockIndex {
    pub first_keys: Vec<u128>,
    pub offsets: Vec<u64>,
    pub lens: Vec<u32>,
    /// The file's largest key (meaningless when there is no block).
    pub last_key: u128,
}

impl BlockIndex {
    pub fn encode(entries: &[IndexEntry], last_key: u128) -> Vec<u8> {
        if entries.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::with_capacity(entries.len() * INDEX_ENTRY_BYTES + KEY_BYTES);
        for e in entries {
            out.extend_from_slice(&e.first_key.to_le_bytes());
            out.extend_from_slice(&e.offset.to_le_bytes());
            out.extend_from_slice(&e.len.to_le_bytes());
        }
        out.extend_from_slice(&last_key.to_le_bytes());
        out
    }

    /// Decodes an index payload and checks it against the footer: blocks
    /// from offset 0 up to the index, each where [`block_offset`] places
    /// it after the one before, fence keys strictly
    /// increasing, each block long enough to hold one entry and no longer
    /// than [`MAX_BLOCK_BYTES`] allows. The reason names the bad entry.
    pub fn decode(payload: &[u8], footer: &Footer) -> Result<BlockIndex, String> {
        let blocks = usize::try_from(footer.block_count).map_err(|_| "too many blocks")?;
        if blocks == 0 {
            return if payload.is_empty() {
                Ok(BlockIndex::default())
            } else {
                Err("an index with bytes but no blocks".into())
            };
        }
        if payload.len() != blocks * INDEX_ENTRY_BYTES + KEY_BYTES {
            return Err(format!("an index payload of {} bytes", payload.len()));
        }
        let min_len = (footer.mode.overhead_bytes() + MIN_PAYLOAD_BYTES) as u64;
        let max_len = (MAX_BLOCK_BYTES + footer.mode.overhead_bytes()) as u64;
        let mut index = BlockIndex {
            first_keys: Vec::with_capacity(blocks),
            offsets: Vec::with_capacity(blocks),
            lens: Vec::with_capacity(blocks),
            last_key: read_u128(&payload[blocks * INDEX_ENTRY_BYTES..]),
        };
        let mut next_offset = 0u64;
        for (i, e) in payload
            .chunks_exact(INDEX_ENTRY_BYTES)
            .take(blocks)
            .enumerate()
        {
            let key = read_u128(&e[0..16]);
            let offset = LittleEndian::read_u64(&e[16..24]);
            let len = LittleEndian::read_u32(&e[24..28]);
            if u64::from(len) < min_len || u64::from(len) > max_len {
                return Err(format!("index entry {i}: a block of {len} bytes"));
            }
            let expected = block_offset(footer.version, next_offset, u64::from(len))
                .ok_or_else(|| format!("index entry {i}: the offsets overflow"))?;
            if offset != expected {
                return Err(format!(
                    "index entry {i}: block at {offset}, expected {expected}"
                ));
            }
            if index.first_keys.last().is_some_and(|prev| *prev >= key) {
                return Err(format!("index entry {i}: fence keys out of order"));
            }
            next_offset = offset
                .checked_add(u64::from(len))
                .ok_or_else(|| format!("index entry {i}: the offsets overflow"))?;
            index.first_keys.push(key);
            index.offsets.push(offset);
            index.lens.push(len);
        }
        if next_offset != footer.index_offset {
            return Err(format!(
                "blocks end at {next_offset}, the index starts at {}",
                footer.index_offset
            ));
        }
        if index.first_keys.last().is_some_and(|k| *k > index.last_key) {
            return Err("the last key is below the last block's first key".into());
        }
        Ok(index)
    }

    pub fn len(&self) -> usize {
        self.first_keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.first_keys.is_empty()
    }

    /// The block that would hold `key`, if any.
    pub fn block_for(&self, key: u128) -> Option<usize> {
        if self.is_empty() || key > self.last_key {
            return None;
        }
        self.first_keys
            .partition_point(|k| *k <= key)
            .checked_sub(1)
    }

    /// The exclusive upper bound of block `i`'s keys: the next fence, or
    /// just past the last key.
    pub fn bounds(&self, i: usize) -> (u128, Option<u128>) {
        (self.first_keys[i], self.first_keys.get(i + 1).copied())
    }

    /// Memory the index takes (what a reader keeps for its whole life).
    pub fn heap_bytes(&self) -> usize {
        self.first_keys.capacity() * 16 + self.offsets.capacity() * 8 + self.lens.capacity() * 4
    }
}

/// The CRC32C that ends a stored piece (0 for fewer than 4 bytes, which
/// no stored piece is).
pub fn stored_crc(stored: &[u8]) -> u32 {
    stored
        .len()
        .checked_sub(CRC_BYTES)
        .map_or(0, |at| LittleEndian::read_u32(&stored[at..]))
}

fn read_u128(b: &[u8]) -> u128 {
    LittleEndian::read_u128(b)
}

/// The bytes [`push_entry`] appends for this entry.
pub fn entry_bytes(value: Option<&[u8]>) -> usize {
    match value {
        None => MIN_ENTRY_BYTES,
        Some(v) => MIN_ENTRY_BYTES + 4 + v.len(),
    }
}

/// Appends one entry to a block payload being built.
pub fn push_entry(payload: &mut Vec<u8>, key: u128, value: Option<&[u8]>) {
    payload.extend_from_slice(&key.to_le_bytes());
    match value {
        None => payload.push(KIND_TOMBSTONE),
        Some(v) => {
            payload.push(KIND_VALUE);
            payload.extend_from_slice(&(v.len() as u32).to_le_bytes());
            payload.extend_from_slice(v);
        }
    }
}

/// Starts a block payload: a count, filled in by [`finish_payload`].
pub fn start_payload(payload: &mut Vec<u8>) {
    payload.clear();
    payload.extend_from_slice(&[0u8; BLOCK_HEADER_BYTES]);
}

pub fn finish_payload(payload: &mut [u8], count: u32) {
    LittleEndian::write_u32(&mut payload[0..4], count);
}

/// Sentinel start of a tombstone's span.
const TOMBSTONE: u32 = u32::MAX;

/// A block as the cache keeps it: its plaintext payload and where each
/// entry's key and value are, so a lookup is a binary search.
#[derive(Debug)]
pub struct DecodedBlock {
    keys: Vec<u128>,
    /// Per entry: start of the value in `payload`, or [`TOMBSTONE`].
    starts: Vec<u32>,
    lens: Vec<u32>,
    payload: Vec<u8>,
}

/// Entry `i` of a block payload, at `*at` (moved past it): its key, and
/// where its value starts in the payload and how long it is (a tombstone
/// starts at `TOMBSTONE`).
#[inline]
fn decode_entry(payload: &[u8], at: &mut usize, i: usize) -> Result<(u128, u32, u32), String> {
    let head = payload
        .get(*at..*at + KEY_BYTES + 1)
        .ok_or_else(|| format!("entry {i} runs past the block"))?;
    let key = read_u128(head);
    *at += KEY_BYTES + 1;
    match head[KEY_BYTES] {
        KIND_TOMBSTONE => Ok((key, TOMBSTONE, 0)),
        KIND_VALUE => {
            let len = payload
                .get(*at..*at + 4)
                .map(LittleEndian::read_u32)
                .ok_or_else(|| format!("entry {i} runs past the block"))?;
            *at += 4;
            if len as usize > MAX_VALUE_BYTES || *at + len as usize > payload.len() {
                return Err(format!(
                    "entry {i}: a value of {len} bytes runs past the block"
                ));
            }
            let start = *at as u32;
            *at += len as usize;
            Ok((key, start, len))
        }
        other => Err(format!("entry {i}: unknown kind {other}")),
    }
}

impl DecodedBlock {
    /// Parses a block payload and checks it against its place in the
    /// index: at least one entry, keys strictly increasing from exactly
    /// `first_key` and below `upper` (the next fence; for the last block,
    /// ending exactly at `last_key`), every byte used.
    pub fn decode(
        payload: Vec<u8>,
        first_key: u128,
        upper: Option<u128>,
        last_key: u128,
    ) -> Result<DecodedBlock, String> {
        if payload.len() < BLOCK_HEADER_BYTES || payload.len() > MAX_BLOCK_BYTES {
            return Err(format!("a block payload of {} bytes", payload.len()));
        }
        let count = LittleEndian::read_u32(&payload[0..4]) as usize;
        if count == 0 || count > payload.len() / (KEY_BYTES + 1) {
            return Err(format!(
                "a block of {} bytes cannot hold {count} entries",
                payload.len()
            ));
        }
        let mut block = DecodedBlock {
            keys: Vec::with_capacity(count),
            starts: Vec::with_capacity(count),
            lens: Vec::with_capacity(count),
            payload: Vec::new(),
        };
        let mut at = BLOCK_HEADER_BYTES;
        for i in 0..count {
            let (key, start, len) = decode_entry(&payload, &mut at, i)?;
            let ordered = match block.keys.last() {
                None => key == first_key,
                Some(prev) => *prev < key,
            };
            if !ordered {
                return Err(format!(
                    "entry {i}: key out of order or not the block's fence"
                ));
            }
            block.keys.push(key);
            block.starts.push(start);
            block.lens.push(len);
        }
        if at != payload.len() {
            return Err(format!("{} bytes after the last entry", payload.len() - at));
        }
        let last = block.keys[count - 1];
        let in_bounds = match upper {
            Some(next) => last < next,
            None => last == last_key,
        };
        if !in_bounds {
            return Err("the block's last key is past its place in the index".into());
        }
        block.payload = payload;
        Ok(block)
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn key(&self, i: usize) -> u128 {
        self.keys[i]
    }

    /// The value of entry `i`, `None` for a tombstone.
    pub fn value(&self, i: usize) -> Option<&[u8]> {
        let start = self.starts[i];
        if start == TOMBSTONE {
            return None;
        }
        let start = start as usize;
        Some(&self.payload[start..start + self.lens[i] as usize])
    }

    /// The position of `key`, or where it would go.
    pub fn search(&self, key: u128) -> Result<usize, usize> {
        self.keys.binary_search(&key)
    }

    /// What the block costs the cache: its buffers and their bookkeeping.
    pub fn charge_bytes(&self) -> usize {
        std::mem::size_of::<DecodedBlock>()
            + self.payload.capacity()
            + self.keys.capacity() * 16
            + self.starts.capacity() * 4
            + self.lens.capacity() * 4
    }
}

/// How one file's pieces (blocks and index) are stored: its mode, the
/// keyring its MACs and seals use, and its identity.
#[derive(Clone, Copy)]
pub struct Pieces<'a> {
    pub mode: Mode,
    pub keyring: Option<&'a Keyring>,
    pub id: &'a Identity,
}

impl Pieces<'_> {
    /// Seals, authenticates or checksums `payload` into what is stored.
    pub fn store(
        &self,
        piece: Piece,
        offset: u64,
        mut payload: Vec<u8>,
    ) -> Result<Vec<u8>, String> {
        let (id, pos) = (self.id, position(self.id, piece, offset));
        let mut stored = match (self.mode, self.keyring) {
            (Mode::Plain, _) => payload,
            (Mode::Authenticated, Some(k)) => {
                let mac = k
                    .mac(BLOCK_MAC_LABEL, &[&pos, &payload])
                    .map_err(|e| e.to_string())?;
                payload.extend_from_slice(&mac);
                payload
            }
            (Mode::Sealed, Some(k)) => {
                let (start, counter) = k
                    .seal_block(id.ns_id, &pos, &mut payload)
                    .map_err(|e| e.to_string())?;
                let mut out = Vec::with_capacity(SEAL_PREFIX_BYTES + payload.len() + CRC_BYTES);
                out.extend_from_slice(&start.to_le_bytes());
                out.extend_from_slice(&counter.to_le_bytes());
                out.extend_from_slice(&payload);
                // The plaintext is gone from the caller's buffer: sealed in place.
                out
            }
            (_, None) => return Err("a protected run file needs a keyring".into()),
        };
        let crc = crc32c::crc32c(&stored);
        stored.extend_from_slice(&crc.to_le_bytes());
        Ok(stored)
    }

    /// Checks what was stored at `offset` and returns its payload: the CRC
    /// first (damage), then the MAC or AES-GCM tag (tampering, wrong key).
    pub fn open(&self, piece: Piece, offset: u64, mut stored: Vec<u8>) -> Result<Vec<u8>, String> {
        let (mode, id) = (self.mode, self.id);
        if stored.len() < mode.overhead_bytes() {
            return Err(format!("{} bytes cannot be a stored piece", stored.len()));
        }
        let body_len = stored.len() - CRC_BYTES;
        let crc = LittleEndian::read_u32(&stored[body_len..]);
        if crc != crc32c::crc32c(&stored[..body_len]) {
            return Err("checksum mismatch".into());
        }
        stored.truncate(body_len);
        let pos = position(id, piece, offset);
        match (mode, self.keyring) {
            (Mode::Plain, _) => Ok(stored),
            (Mode::Authenticated, Some(k)) => {
                let payload_len = body_len - MAC_BYTES;
                let mut tag = [0u8; MAC_BYTES];
                tag.copy_from_slice(&stored[payload_len..]);
                let mac = k
                    .mac(BLOCK_MAC_LABEL, &[&pos, &stored[..payload_len]])
                    .map_err(|e| e.to_string())?;
                if !tags_equal(&mac, &tag) {
                    return Err("MAC mismatch: the block was changed or moved".into());
                }
                stored.truncate(payload_len);
                Ok(stored)
            }
            (Mode::Sealed, Some(k)) => {
                let start = LittleEndian::read_u64(&stored[0..8]);
                let counter = LittleEndian::read_u64(&stored[8..16]);
                let mut sealed = stored.split_off(SEAL_PREFIX_BYTES);
                let plain = k
                    .open_block(id.ns_id, start, counter, &pos, &mut sealed)
                    .map_err(|e| format!("cannot decrypt: {e}"))?;
                sealed.truncate(plain);
                Ok(sealed)
            }
            (_, None) => Err("a protected run file needs a keyring".into()),
        }
    }
}

/// The MAC of a file's index, the part of its filter the MAC covers
/// ([`Footer::mac_filter_part`]; empty in a version-1 file) and its footer
/// fields.
pub fn file_mac(
    keyring: &Keyring,
    dir_id: &[u8; DIR_ID_BYTES],
    index_stored: &[u8],
    filter_stored: &[u8],
    footer_fields: &[u8; 72],
) -> Result<[u8; MAC_BYTES], String> {
    keyring
        .mac(
            FILE_MAC_LABEL,
            &[dir_id, index_stored, filter_stored, footer_fields],
        )
        .map_err(|e| e.to_string())
}
