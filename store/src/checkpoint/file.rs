//! Checkpoint files (bases and deltas): sorted state entries in
//! CRC32C-checked blocks, with a header and a footer.
//!
//! ```text
//! header (44 bytes)
//!   0  8  magic "CUBECKPT"
//!   8  4  version = 2, or 3 in a data dir with a master key (see below)
//!   12 1  kind: 1 base, 2 delta
//!   13 3  reserved, zero
//!   16 8  file_id      unique per data dir, never reused
//!   24 8  lsn_from     first LSN folded into this file (1 for a base)
//!   32 8  lsn_to       every record up to this LSN is reflected
//!   40 4  header_crc   CRC32C of bytes 0..40
//! blocks, back to back
//!   0  4  payload_len  bits 0-30: at most MAX_BLOCK_BYTES;
//!                      bit 31: the payload is sealed (encrypted namespace)
//!   4  4  payload_crc  CRC32C of the payload as stored
//!   8  .. payload: entries, each
//!         key_len u16 | key | op u8 (0 tombstone, 1 value) | [value_len u32 | value]
//!         or, sealed: ns_id u64 LE | start u64 LE | counter u64 LE |
//!         AES-256-GCM(entries) | tag (16); every entry in it belongs to
//!         namespace `ns_id`. `start` is the random id of the daemon start
//!         that sealed it (its key is the namespace's checkpoint key for that
//!         start; the nonce is low 32 bits of start | counter, both BE).
//!         Associated data: file_id u64 LE |
//!         block index u64 LE | ns_id u64 LE, so a block moved to another
//!         file, position or namespace fails to open (crypto.rs).
//! footer (40 bytes, the last bytes of the file)
//!   0  8  magic "CUBEFOOT"
//!   8  8  entry_count
//!   16 8  block_count
//!   24 8  blocks_bytes  bytes between header and footer
//!   32 4  blocks_crc    CRC32C over every block's payload_crc, in order
//!   36 4  footer_crc    CRC32C of footer bytes 0..36
//! ```
//! The footer ties the blocks together: a lost, repeated or reordered
//! block changes `blocks_crc` even when each block is intact. Entries are
//! strictly increasing by key; readers check that too.
//!
//! CRCs only catch damage: someone who can write the file recomputes them.
//! In a data dir with a master key, files are written as version 3, with
//! the same layout and two differences: a sealed block's associated data
//! ends with the data dir's 16-byte id (so a block cannot be moved into a
//! version-2 file, or into another data dir, and still open), and the
//! authenticated manifest holds the file's MAC: HMAC-SHA256 under the
//! integrity key of "cube checkpoint file v1" || dir_id || every byte of
//! the file, header to footer. A reader checks it once it has read the
//! footer: a block removed, replaced (by a plaintext one, say), reordered
//! or taken from another copy of the data dir, with every CRC recomputed,
//! is refused. A version-3 file named by a manifest that is not
//! authenticated is refused too (the manifest was replaced by an older
//! kind).

use std::path::{Path, PathBuf};

use byteorder::{ByteOrder, LittleEndian};

use std::collections::HashSet;

use crate::checkpoint::state_key::entry_ns_id;
use crate::crypto::{CryptoError, DIR_ID_BYTES, Keyring, MAC_BYTES, MacContext, tags_equal};
use crate::data_dir::sync_dir;
use crate::error::StoreError;
use crate::storage::{OpenMode, Storage, StorageFile};

/// Writes and reads go to the file in pieces of this size.
const IO_CHUNK_BYTES: usize = 1024 * 1024;

pub(crate) const HEADER_BYTES: usize = 44;
pub(crate) const FOOTER_BYTES: usize = 40;
const MAGIC: &[u8; 8] = b"CUBECKPT";
const FOOTER_MAGIC: &[u8; 8] = b"CUBEFOOT";
const VERSION: u32 = 2;
/// Written in a data dir with a master key (see the module doc).
const VERSION_AUTHENTICATED: u32 = 3;
const FILE_MAC_LABEL: &[u8] = b"cube checkpoint file v1";
/// Bit 31 of a block's length field: its payload is sealed.
const SEALED_BLOCK_BIT: u32 = 1 << 31;
/// ns_id, start id, counter in front of a sealed block's ciphertext.
const SEALED_PREFIX_BYTES: usize = 8 + 8 + 8;
/// Entries are packed into blocks of about this size.
const TARGET_BLOCK_BYTES: usize = 64 * 1024;
/// No block is larger; a larger length field is damage.
pub(crate) const MAX_BLOCK_BYTES: usize = 64 * 1024 * 1024;
const MAX_KEY_BYTES: usize = u16::MAX as usize;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FileKind {
    Base = 1,
    Delta = 2,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileHeader {
    pub kind: FileKind,
    pub file_id: u64,
    pub lsn_from: u64,
    pub lsn_to: u64,
    /// Version 3: written in a data dir with a master key.
    pub authenticated: bool,
}

impl FileHeader {
    fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut h = [0u8; HEADER_BYTES];
        h[0..8].copy_from_slice(MAGIC);
        let version = if self.authenticated {
            VERSION_AUTHENTICATED
        } else {
            VERSION
        };
        LittleEndian::write_u32(&mut h[8..12], version);
        h[12] = self.kind as u8;
        LittleEndian::write_u64(&mut h[16..24], self.file_id);
        LittleEndian::write_u64(&mut h[24..32], self.lsn_from);
        LittleEndian::write_u64(&mut h[32..40], self.lsn_to);
        let crc = crc32c::crc32c(&h[0..40]);
        LittleEndian::write_u32(&mut h[40..44], crc);
        h
    }

    fn decode(h: &[u8]) -> Result<FileHeader, String> {
        if h.len() < HEADER_BYTES || &h[0..8] != MAGIC {
            return Err("not a cube checkpoint file (bad magic)".into());
        }
        let stored = LittleEndian::read_u32(&h[40..44]);
        if stored != crc32c::crc32c(&h[0..40]) {
            return Err("checkpoint header checksum mismatch".into());
        }
        let version = LittleEndian::read_u32(&h[8..12]);
        if version != VERSION && version != VERSION_AUTHENTICATED {
            return Err(format!(
                "checkpoint format version {version} is not supported (this build reads {VERSION} and {VERSION_AUTHENTICATED})"
            ));
        }
        let kind = match h[12] {
            1 => FileKind::Base,
            2 => FileKind::Delta,
            other => return Err(format!("unknown checkpoint file kind {other}")),
        };
        Ok(FileHeader {
            kind,
            file_id: LittleEndian::read_u64(&h[16..24]),
            lsn_from: LittleEndian::read_u64(&h[24..32]),
            lsn_to: LittleEndian::read_u64(&h[32..40]),
            authenticated: version == VERSION_AUTHENTICATED,
        })
    }
}

/// How a file of an authenticated data dir is bound to it: the data dir's
/// id and the key of the MAC.
#[derive(Clone, Copy)]
pub(crate) struct FileAuth<'k> {
    pub keyring: &'k Keyring,
    pub dir_id: [u8; DIR_ID_BYTES],
}

impl FileAuth<'_> {
    fn start_mac(&self) -> Result<MacContext, StoreError> {
        let mut mac = self
            .keyring
            .mac_context(FILE_MAC_LABEL)
            .map_err(|e| StoreError::Key(format!("authenticating a checkpoint file: {e}")))?;
        mac.update(&self.dir_id);
        Ok(mac)
    }
}

/// What a reader checks a file against: the data dir's id and the file's
/// MAC from the authenticated manifest. Without a key, the MAC cannot be
/// computed and is not checked (the loader refuses to start then).
#[derive(Clone, Copy)]
pub(crate) struct ReadAuth<'k> {
    pub keyring: Option<&'k Keyring>,
    pub dir_id: [u8; DIR_ID_BYTES],
    pub mac: [u8; MAC_BYTES],
}

/// The MAC of a whole file as it is on disk: for files written before the
/// data dir was authenticated, which the first authenticated manifest
/// binds as they are. The file is read twice and the reads must agree: a
/// bit flipped in one read would otherwise be bound into the manifest,
/// and the file would fail its MAC at every start after.
pub(crate) fn file_mac(
    storage: &dyn Storage,
    path: &Path,
    auth: &FileAuth<'_>,
) -> Result<[u8; MAC_BYTES], StoreError> {
    let read = || storage.read_file(path).map_err(|e| StoreError::io(path, e));
    let bytes = read()?;
    if read()? != bytes {
        return Err(StoreError::io(
            path,
            std::io::Error::other(
                "two reads of the file differ, so it was not bound to the data dir's key; \
                 the checkpoint is retried (check the disk if this repeats)",
            ),
        ));
    }
    let mut mac = auth.start_mac()?;
    mac.update(&bytes);
    Ok(mac.finish())
}

/// Which namespaces' blocks a writer seals, and with what.
pub(crate) struct BlockSealer<'k> {
    pub keyring: &'k Keyring,
    pub encrypted_ids: HashSet<u64>,
}

/// Writes a checkpoint file under a temp name; [`CheckpointWriter::finish`]
/// syncs it and renames it into place.
pub(crate) struct CheckpointWriter<'a> {
    storage: &'a dyn Storage,
    tmp_path: PathBuf,
    final_path: PathBuf,
    file: Box<dyn StorageFile>,
    /// Bytes not yet written, and where they go.
    pending: Vec<u8>,
    written: u64,
    block: Vec<u8>,
    last_key: Option<Vec<u8>>,
    entries: u64,
    blocks: u64,
    blocks_bytes: u64,
    blocks_crc: u32,
    file_id: u64,
    sealer: Option<&'a BlockSealer<'a>>,
    /// The namespace whose sealed block is being filled, if any.
    block_seal: Option<u64>,
    /// In an authenticated data dir: its id, and the file's MAC so far.
    auth: Option<([u8; DIR_ID_BYTES], MacContext)>,
}

impl<'a> CheckpointWriter<'a> {
    /// With `auth`, the file is written as version 3 and its MAC computed
    /// as it goes ([`CheckpointWriter::finish`] returns it).
    pub(crate) fn create(
        storage: &'a dyn Storage,
        final_path: &Path,
        mut header: FileHeader,
        sealer: Option<&'a BlockSealer<'a>>,
        auth: Option<FileAuth<'_>>,
    ) -> Result<CheckpointWriter<'a>, StoreError> {
        header.authenticated = auth.is_some();
        let auth = match auth {
            Some(auth) => Some((auth.dir_id, auth.start_mac()?)),
            None => None,
        };
        let mut tmp = final_path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp_path = PathBuf::from(tmp);
        let file = storage
            .open(&tmp_path, OpenMode::CreateTruncate)
            .map_err(|e| StoreError::io(&tmp_path, e))?;
        let mut pending = Vec::with_capacity(IO_CHUNK_BYTES * 2);
        pending.extend_from_slice(&header.encode());
        Ok(CheckpointWriter {
            storage,
            tmp_path,
            final_path: final_path.to_path_buf(),
            file,
            pending,
            written: 0,
            block: Vec::with_capacity(TARGET_BLOCK_BYTES * 2),
            last_key: None,
            entries: 0,
            blocks: 0,
            blocks_bytes: 0,
            blocks_crc: 0,
            file_id: header.file_id,
            sealer,
            block_seal: None,
            auth,
        })
    }

    /// Adds an entry; keys must arrive strictly increasing.
    pub(crate) fn add(&mut self, key: &[u8], value: Option<&[u8]>) -> Result<(), StoreError> {
        assert!(key.len() <= MAX_KEY_BYTES, "state keys are short");
        assert!(
            self.last_key.as_deref().is_none_or(|last| last < key),
            "checkpoint entries must be strictly increasing by key"
        );
        // A sealed block holds one encrypted namespace's entries and nothing
        // else, so each block opens with exactly one namespace key.
        let seal = self
            .sealer
            .and_then(|sealer| entry_ns_id(key).filter(|id| sealer.encrypted_ids.contains(id)));
        if seal != self.block_seal {
            self.flush_block()?;
            self.block_seal = seal;
        }
        self.block
            .extend_from_slice(&(key.len() as u16).to_le_bytes());
        self.block.extend_from_slice(key);
        match value {
            None => self.block.push(0),
            Some(v) => {
                self.block.push(1);
                self.block
                    .extend_from_slice(&(v.len() as u32).to_le_bytes());
                self.block.extend_from_slice(v);
            }
        }
        self.last_key = Some(key.to_vec());
        self.entries += 1;
        if self.block.len() >= TARGET_BLOCK_BYTES {
            self.flush_block()?;
        }
        Ok(())
    }

    fn flush_block(&mut self) -> Result<(), StoreError> {
        if self.block.is_empty() {
            return Ok(());
        }
        assert!(
            self.block.len() <= MAX_BLOCK_BYTES - SEALED_PREFIX_BYTES - crate::crypto::TAG_BYTES,
            "one entry is far below the block cap"
        );
        let mut len_field = self.block.len() as u32;
        if let (Some(ns_id), Some(sealer)) = (self.block_seal, self.sealer) {
            let dir_id = self.auth.as_ref().map(|(id, _)| id);
            let aad = block_aad(self.file_id, self.blocks, ns_id, dir_id);
            let (start_id, counter) = sealer
                .keyring
                .seal_block(ns_id, &aad, &mut self.block)
                .map_err(|e| StoreError::Key(format!("sealing a checkpoint block: {e}")))?;
            let mut sealed = Vec::with_capacity(SEALED_PREFIX_BYTES + self.block.len());
            sealed.extend_from_slice(&ns_id.to_le_bytes());
            sealed.extend_from_slice(&start_id.to_le_bytes());
            sealed.extend_from_slice(&counter.to_le_bytes());
            sealed.extend_from_slice(&self.block);
            self.block = sealed;
            len_field = self.block.len() as u32 | SEALED_BLOCK_BIT;
        }
        let crc = crc32c::crc32c(&self.block);
        let mut head = [0u8; 8];
        LittleEndian::write_u32(&mut head[0..4], len_field);
        LittleEndian::write_u32(&mut head[4..8], crc);
        self.pending.extend_from_slice(&head);
        self.pending.extend_from_slice(&self.block);
        if self.pending.len() >= IO_CHUNK_BYTES {
            self.write_pending()?;
        }
        self.blocks += 1;
        self.blocks_bytes += 8 + self.block.len() as u64;
        self.blocks_crc = crc32c::crc32c_append(self.blocks_crc, &crc.to_le_bytes());
        self.block.clear();
        Ok(())
    }

    fn write_pending(&mut self) -> Result<(), StoreError> {
        if let Some((_, mac)) = self.auth.as_mut() {
            mac.update(&self.pending);
        }
        self.file
            .write_all_at(&self.pending, self.written)
            .map_err(|e| StoreError::io(&self.tmp_path, e))?;
        self.written += self.pending.len() as u64;
        self.pending.clear();
        Ok(())
    }

    /// Writes the footer, fsyncs, renames into place and fsyncs the
    /// directory. Returns the file's size, and its MAC if authenticated.
    pub(crate) fn finish(mut self) -> Result<(u64, Option<[u8; MAC_BYTES]>), StoreError> {
        self.flush_block()?;
        let mut f = [0u8; FOOTER_BYTES];
        f[0..8].copy_from_slice(FOOTER_MAGIC);
        LittleEndian::write_u64(&mut f[8..16], self.entries);
        LittleEndian::write_u64(&mut f[16..24], self.blocks);
        LittleEndian::write_u64(&mut f[24..32], self.blocks_bytes);
        LittleEndian::write_u32(&mut f[32..36], self.blocks_crc);
        let crc = crc32c::crc32c(&f[0..36]);
        LittleEndian::write_u32(&mut f[36..40], crc);
        self.pending.extend_from_slice(&f);
        self.write_pending()?;
        self.file
            .sync_data()
            .map_err(|e| StoreError::io(&self.tmp_path, e))?;
        self.storage
            .rename(&self.tmp_path, &self.final_path)
            .map_err(|e| StoreError::io(&self.final_path, e))?;
        if let Some(dir) = self.final_path.parent() {
            sync_dir(self.storage, dir)?;
        }
        let mac = self.auth.take().map(|(_, mac)| mac.finish());
        Ok((
            HEADER_BYTES as u64 + self.blocks_bytes + FOOTER_BYTES as u64,
            mac,
        ))
    }
}

/// Sees one entry, borrowed from the block buffer: key, and value or tombstone.
/// Key, value (`None`: a deletion), and whether the entry came from a
/// sealed block.
type EntryVisitor<'a> = dyn FnMut(&[u8], Option<&[u8]>, bool) + 'a;

/// A state entry as stored: key, and value or tombstone.
pub(crate) type Entry = (Vec<u8>, Option<Vec<u8>>);

/// Streams the entries of a checkpoint file, verifying as it goes; the
/// header and footer are verified when it opens.
pub(crate) struct CheckpointReader<'k> {
    path: PathBuf,
    keyring: Option<&'k Keyring>,
    /// Where the current block starts in the file, for error messages.
    block_offset: u64,
    /// The namespace of the current block if it was sealed.
    block_seal: Option<u64>,
    file: Box<dyn StorageFile>,
    pub(crate) header: FileHeader,
    footer_entries: u64,
    footer_blocks: u64,
    footer_blocks_crc: u32,
    blocks_end: u64,
    offset: u64,
    block: Vec<u8>,
    block_pos: usize,
    entries: u64,
    blocks: u64,
    blocks_crc: u32,
    last_key: Option<Vec<u8>>,
    done: bool,
    /// A version-3 file's data dir id (from the manifest).
    dir_id: Option<[u8; DIR_ID_BYTES]>,
    /// The MAC so far and the one the manifest holds, when checked.
    mac: Option<(MacContext, [u8; MAC_BYTES])>,
    footer: [u8; FOOTER_BYTES],
}

/// A sealed block's associated data: file_id | block index | ns_id (u64
/// LE each), then in a version-3 file the data dir's id.
fn block_aad(
    file_id: u64,
    block_index: u64,
    ns_id: u64,
    dir_id: Option<&[u8; DIR_ID_BYTES]>,
) -> Vec<u8> {
    let mut aad = Vec::with_capacity(24 + DIR_ID_BYTES);
    aad.extend_from_slice(&file_id.to_le_bytes());
    aad.extend_from_slice(&block_index.to_le_bytes());
    aad.extend_from_slice(&ns_id.to_le_bytes());
    if let Some(id) = dir_id {
        aad.extend_from_slice(id);
    }
    aad
}

fn corruption(path: &Path, offset: u64, reason: String) -> StoreError {
    StoreError::Corruption {
        path: path.to_path_buf(),
        offset,
        reason,
    }
}

/// The file's header, as read and decoded; `authenticated_manifest` says
/// whether the manifest that names the file is authenticated (a file of
/// an authenticated data dir must be named by one).
fn read_header(
    file: &dyn StorageFile,
    path: &Path,
    authenticated_manifest: bool,
) -> Result<([u8; HEADER_BYTES], FileHeader), StoreError> {
    let mut header_bytes = [0u8; HEADER_BYTES];
    file.read_exact_at(&mut header_bytes, 0)
        .map_err(|e| StoreError::io(path, e))?;
    let header = FileHeader::decode(&header_bytes).map_err(|reason| corruption(path, 0, reason))?;
    if header.authenticated && !authenticated_manifest {
        return Err(corruption(
            path,
            0,
            "a checkpoint file of an authenticated data dir (format 3), named by a manifest \
             that is not authenticated: the manifest was replaced"
                .into(),
        ));
    }
    Ok((header_bytes, header))
}

/// The footer at `footer_at`, checked: its magic, its CRC, and the length
/// of the blocks it says lie between the header and itself.
fn read_footer(
    file: &dyn StorageFile,
    path: &Path,
    footer_at: u64,
) -> Result<[u8; FOOTER_BYTES], StoreError> {
    let mut footer = [0u8; FOOTER_BYTES];
    file.read_exact_at(&mut footer, footer_at)
        .map_err(|e| StoreError::io(path, e))?;
    if &footer[0..8] != FOOTER_MAGIC
        || LittleEndian::read_u32(&footer[36..40]) != crc32c::crc32c(&footer[0..36])
    {
        return Err(corruption(
            path,
            footer_at,
            "checkpoint footer is missing or damaged (a truncated file?)".into(),
        ));
    }
    let blocks_bytes = LittleEndian::read_u64(&footer[24..32]);
    if blocks_bytes != footer_at - HEADER_BYTES as u64 {
        return Err(corruption(
            path,
            footer_at,
            format!(
                "footer says {blocks_bytes} bytes of blocks, the file holds {}",
                footer_at - HEADER_BYTES as u64
            ),
        ));
    }
    Ok(footer)
}

impl<'k> CheckpointReader<'k> {
    /// `auth`: the file's binding from an authenticated manifest (`None`
    /// for a manifest that is not authenticated).
    pub(crate) fn open(
        storage: &dyn Storage,
        path: &Path,
        keyring: Option<&'k Keyring>,
        auth: Option<ReadAuth<'_>>,
    ) -> Result<CheckpointReader<'k>, StoreError> {
        let file = storage
            .open(path, OpenMode::ReadOnly)
            .map_err(|e| StoreError::io(path, e))?;
        let len = file.len().map_err(|e| StoreError::io(path, e))?;
        if len < (HEADER_BYTES + FOOTER_BYTES) as u64 {
            return Err(corruption(
                path,
                0,
                format!(
                    "checkpoint file of {len} bytes is too short to hold a header and a footer"
                ),
            ));
        }
        let (header_bytes, header) = read_header(file.as_ref(), path, auth.is_some())?;
        let mac = match auth {
            Some(ReadAuth {
                keyring: Some(keyring),
                dir_id,
                mac: expected,
            }) if keyring.has_key() => {
                let mut mac = FileAuth { keyring, dir_id }.start_mac()?;
                mac.update(&header_bytes);
                Some((mac, expected))
            }
            _ => None,
        };
        let dir_id = auth.filter(|_| header.authenticated).map(|a| a.dir_id);
        let footer_at = len - FOOTER_BYTES as u64;
        let footer = read_footer(file.as_ref(), path, footer_at)?;
        Ok(CheckpointReader {
            path: path.to_path_buf(),
            keyring,
            block_offset: 0,
            block_seal: None,
            file,
            header,
            footer_entries: LittleEndian::read_u64(&footer[8..16]),
            footer_blocks: LittleEndian::read_u64(&footer[16..24]),
            footer_blocks_crc: LittleEndian::read_u32(&footer[32..36]),
            blocks_end: footer_at,
            offset: HEADER_BYTES as u64,
            block: Vec::new(),
            block_pos: 0,
            entries: 0,
            blocks: 0,
            blocks_crc: 0,
            last_key: None,
            done: false,
            dir_id,
            mac,
            footer,
        })
    }

    fn corrupt(&self, offset: u64, reason: impl Into<String>) -> StoreError {
        corruption(&self.path, offset, reason.into())
    }

    /// Reads the next block into `self.block`, checking its checksum
    /// (and, sealed, opening it); `false` past the last block, once the
    /// footer's counts and the file's MAC have been checked.
    fn next_block(&mut self) -> Result<bool, StoreError> {
        if self.offset >= self.blocks_end {
            self.check_blocks_read()?;
            return Ok(false);
        }
        let at = self.offset;
        if self.blocks_end - at < 8 {
            return Err(self.corrupt(at, "block header runs into the footer"));
        }
        let mut head = [0u8; 8];
        self.file
            .read_exact_at(&mut head, at)
            .map_err(|e| StoreError::io(&self.path, e))?;
        let len_field = LittleEndian::read_u32(&head[0..4]);
        let sealed = len_field & SEALED_BLOCK_BIT != 0;
        let len = (len_field & !SEALED_BLOCK_BIT) as usize;
        let stored = LittleEndian::read_u32(&head[4..8]);
        if len > MAX_BLOCK_BYTES || at + 8 + len as u64 > self.blocks_end {
            return Err(self.corrupt(at, format!("block length {len} is impossible here")));
        }
        self.block.resize(len, 0);
        self.file
            .read_exact_at(&mut self.block, at + 8)
            .map_err(|e| StoreError::io(&self.path, e))?;
        let computed = crc32c::crc32c(&self.block);
        if computed != stored {
            return Err(self.corrupt(
                at,
                format!("block checksum mismatch (stored {stored:08x}, computed {computed:08x})"),
            ));
        }
        if let Some((mac, _)) = self.mac.as_mut() {
            mac.update(&head);
            mac.update(&self.block);
        }
        self.block_seal = None;
        if sealed {
            self.open_sealed_block(at)?;
        }
        self.blocks += 1;
        self.blocks_crc = crc32c::crc32c_append(self.blocks_crc, &stored.to_le_bytes());
        self.offset = at + 8 + len as u64;
        self.block_offset = at;
        self.block_pos = 0;
        Ok(true)
    }

    /// After the last block: what was read must match the footer's
    /// counts and checksum, and an authenticated file its MAC.
    fn check_blocks_read(&mut self) -> Result<(), StoreError> {
        if self.entries != self.footer_entries
            || self.blocks != self.footer_blocks
            || self.blocks_crc != self.footer_blocks_crc
        {
            return Err(self.corrupt(
                self.blocks_end,
                format!(
                    "footer says {} entries in {} blocks, read {} in {} (or the block checksums disagree)",
                    self.footer_entries, self.footer_blocks, self.entries, self.blocks
                ),
            ));
        }
        if let Some((mut mac, expected)) = self.mac.take() {
            mac.update(&self.footer);
            if !tags_equal(&mac.finish(), &expected) {
                return Err(self.corrupt(
                    0,
                    format!(
                        "checkpoint file {} does not match the MAC the authenticated manifest \
                         holds for it: a block was removed, replaced or reordered, or the file \
                         comes from another copy of the data dir",
                        self.header.file_id
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Replaces the sealed block in `self.block` (its checksum already
    /// matched) by its entries.
    fn open_sealed_block(&mut self, at: u64) -> Result<(), StoreError> {
        if self.block.len() < SEALED_PREFIX_BYTES + crate::crypto::TAG_BYTES {
            return Err(self.corrupt(at, "sealed block too short for its nonce and tag"));
        }
        let ns_id = LittleEndian::read_u64(&self.block[0..8]);
        let start_id = LittleEndian::read_u64(&self.block[8..16]);
        let counter = LittleEndian::read_u64(&self.block[16..24]);
        let Some(keyring) = self.keyring.filter(|k| k.has_key()) else {
            return Err(StoreError::Key(format!(
                "{} holds data of an encrypted namespace (id {ns_id}) at offset {at}; start cubed with --key-file",
                self.path.display()
            )));
        };
        let aad = block_aad(
            self.header.file_id,
            self.blocks,
            ns_id,
            self.dir_id.as_ref(),
        );
        let plain = match keyring.open_block(
            ns_id,
            start_id,
            counter,
            &aad,
            &mut self.block[SEALED_PREFIX_BYTES..],
        ) {
            Ok(len) => len,
            Err(CryptoError::NoKey) => {
                return Err(StoreError::Key(format!(
                    "{} holds data of an encrypted namespace; start cubed with --key-file",
                    self.path.display()
                )));
            }
            // A live encrypted namespace's key was checked at start (or
            // made at its creation), by name, before any block is read:
            // a wrong master key stops the start there. So a block that
            // fails here is damaged, whether or not its namespace id is
            // one this key verified: a bit flipped in the block's head can
            // make a plain block look sealed (the head is outside the
            // block's CRC), and its first bytes then read as a namespace
            // id nobody verified (the storage-fault simulation, seed 69).
            Err(_) => {
                let whose = if keyring.is_verified(ns_id) {
                    "a live encrypted namespace"
                } else {
                    "no namespace this master key was checked against"
                };
                return Err(self.corrupt(
                    at,
                    format!(
                        "sealed block of namespace id {ns_id} ({whose}) failed authentication: \
                         damaged, tampered, moved, or sealed with another master key"
                    ),
                ));
            }
        };
        self.block.drain(..SEALED_PREFIX_BYTES);
        self.block.truncate(plain);
        self.block_seal = Some(ns_id);
        Ok(())
    }

    /// The next entry, or `None` at the end (after the footer's counts and
    /// block checksums are confirmed).
    pub(crate) fn next_entry(&mut self) -> Result<Option<Entry>, StoreError> {
        let mut entry = None;
        self.visit_next(&mut |key, value, _| {
            entry = Some((key.to_vec(), value.map(<[u8]>::to_vec)));
        })?;
        Ok(entry)
    }

    /// Calls `visit` with every remaining entry, borrowing key and value
    /// from the block buffer: no allocation per entry, for bulk loads; the
    /// flag says whether the entry's block was sealed.
    pub(crate) fn for_each_entry(
        &mut self,
        mut visit: impl FnMut(&[u8], Option<&[u8]>, bool),
    ) -> Result<(), StoreError> {
        while self.visit_next(&mut visit)? {}
        Ok(())
    }

    /// Parses the next entry and hands it to `visit`; `false` at the end
    /// (after the footer's counts and block checksums are confirmed).
    fn visit_next(&mut self, visit: &mut EntryVisitor<'_>) -> Result<bool, StoreError> {
        if self.done {
            return Ok(false);
        }
        while self.block_pos >= self.block.len() {
            if !self.next_block()? {
                self.done = true;
                return Ok(false);
            }
        }
        let block_start = self.block_offset;
        let short = || "entry runs past the end of its block".to_string();
        let b = &self.block[self.block_pos..];
        let parsed = (|| {
            if b.len() < 2 {
                return Err(short());
            }
            let key_len = usize::from(LittleEndian::read_u16(&b[0..2]));
            if b.len() < 2 + key_len + 1 {
                return Err(short());
            }
            let key = &b[2..2 + key_len];
            let mut used = 3 + key_len;
            let value = match b[2 + key_len] {
                0 => None,
                1 => {
                    if b.len() < used + 4 {
                        return Err(short());
                    }
                    let len = LittleEndian::read_u32(&b[used..used + 4]) as usize;
                    used += 4;
                    if b.len() < used + len {
                        return Err(short());
                    }
                    used += len;
                    Some(&b[used - len..used])
                }
                other => return Err(format!("unknown entry op {other}")),
            };
            Ok((key, value, used))
        })();
        let (key, value, used) = parsed.map_err(|reason| StoreError::Corruption {
            path: self.path.clone(),
            offset: block_start,
            reason,
        })?;
        if self.last_key.as_deref().is_some_and(|last| last >= key) {
            return Err(self.corrupt(block_start, "entries are not in increasing key order"));
        }
        if let Some(ns_id) = self.block_seal
            && entry_ns_id(key) != Some(ns_id)
        {
            return Err(self.corrupt(
                block_start,
                format!("a sealed block of namespace id {ns_id} holds another namespace's entry"),
            ));
        }
        // Reuse the buffer: one copy of the key, no allocation once warm.
        let last = self.last_key.get_or_insert_with(Vec::new);
        last.clear();
        last.extend_from_slice(key);
        visit(key, value, self.block_seal.is_some());
        self.block_pos += used;
        self.entries += 1;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::RealDisk;
    use std::fs;

    /// A bit flipped in one read of a file being bound to the data dir's
    /// key is caught by the second read, instead of a wrong MAC going
    /// into the manifest.
    #[test]
    fn a_file_is_bound_to_the_key_only_from_two_reads_that_agree() {
        use crate::crypto::{Keyring, MasterKey};
        use crate::sim_disk::{FaultPlan, ReadFaultKind, SimDisk};
        use crate::storage::OpenMode;
        let disk = SimDisk::new(FaultPlan::default());
        let dir = Path::new("/sim/checkpoint");
        disk.create_dir_all(dir).unwrap();
        let path = dir.join("base-1.ckpt");
        let mut file = disk.open(&path, OpenMode::CreateNew).unwrap();
        file.write_all_at(&[0x5a; 4096], 0).unwrap();
        file.sync_data().unwrap();
        drop(file);
        let keyring = Keyring::new(Some(MasterKey::from_bytes([3; 32])), 1);
        let auth = FileAuth {
            keyring: &keyring,
            dir_id: [9; DIR_ID_BYTES],
        };
        let good = file_mac(&disk, &path, &auth).unwrap();
        disk.fault_next_read_file(&path, ReadFaultKind::Flip, 100);
        let err = file_mac(&disk, &path, &auth).unwrap_err().to_string();
        assert!(err.contains("two reads of the file differ"), "{err}");
        assert_eq!(file_mac(&disk, &path, &auth).unwrap(), good);
    }

    fn write_sample(path: &Path, n: u32) -> u64 {
        let header = FileHeader {
            kind: FileKind::Delta,
            file_id: 7,
            lsn_from: 3,
            lsn_to: 99,
            authenticated: false,
        };
        let mut w = CheckpointWriter::create(&RealDisk, path, header, None, None).unwrap();
        for i in 0..n {
            let key = format!("key-{i:08}");
            let value = (i % 3 != 0).then(|| vec![i as u8; (i % 500) as usize]);
            w.add(key.as_bytes(), value.as_deref()).unwrap();
        }
        w.finish().unwrap().0
    }

    fn read_all(path: &Path) -> Result<Vec<Entry>, StoreError> {
        let mut r = CheckpointReader::open(&RealDisk, path, None, None)?;
        let mut out = Vec::new();
        while let Some(e) = r.next_entry()? {
            out.push(e);
        }
        Ok(out)
    }

    #[test]
    fn round_trips_across_many_blocks() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("delta.ckpt");
        let size = write_sample(&path, 2000);
        assert_eq!(fs::metadata(&path).unwrap().len(), size);
        let entries = read_all(&path).unwrap();
        assert_eq!(entries.len(), 2000);
        assert_eq!(entries[1].1.as_ref().unwrap().len(), 1);
        assert!(entries[3].1.is_none());
        let r = CheckpointReader::open(&RealDisk, &path, None, None).unwrap();
        assert_eq!(r.header.lsn_to, 99);
    }

    #[test]
    fn truncation_and_bit_flips_are_refused_with_an_offset() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("delta.ckpt");
        write_sample(&path, 3000);
        let good = fs::read(&path).unwrap();
        for cut in [
            good.len() - 1,
            good.len() - 41,
            good.len() / 2,
            HEADER_BYTES + 3,
            10,
        ] {
            fs::write(&path, &good[..cut]).unwrap();
            let err = read_all(&path)
                .expect_err("a cut file is refused")
                .to_string();
            assert!(err.contains("offset"), "{err}");
        }
        for at in [
            5,
            HEADER_BYTES + 2,
            HEADER_BYTES + 100,
            good.len() / 2,
            good.len() - 45,
            good.len() - 3,
        ] {
            let mut bad = good.clone();
            bad[at] ^= 0x04;
            fs::write(&path, &bad).unwrap();
            assert!(read_all(&path).is_err(), "flip at {at} went unnoticed");
        }
    }
}
