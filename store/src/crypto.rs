//! cubecrypt: per-namespace AES-256-GCM sealing of WAL payloads and checkpoint blocks, on ring.
//!
//! One job: turn a master key into per-namespace keys and seal or open byte
//! buffers under nonces that never repeat under one key. It knows nothing of
//! record or block layouts; the WAL and checkpoint code decide what is the
//! payload and what is authenticated as associated data (`aad`).
//!
//! Why it is built this way (the whole scheme is in `docs/storage-format.md`,
//! "Encryption at rest (cubecrypt)"):
//! - AES-GCM loses both confidentiality and integrity if a nonce repeats
//!   under one key, so nonces are counters, never random: a WAL record's is
//!   `epoch || lsn`, a checkpoint block's is `epoch || counter`. The epoch is
//!   a per-data-dir start counter that [`bump_epoch`] makes durable before
//!   anything is sealed, so two starts never share a nonce.
//! - The WAL and checkpoint nonce spaces overlap (both are `epoch || u64`),
//!   so they use different keys; each namespace has its own keys too. All
//!   are HKDF-SHA256 expansions of the master key.
//! - Derived keys are cached per namespace so a seal costs one hash lookup
//!   plus AES-GCM itself (AES-NI and carry-less multiply through ring).
//!
//! Limits: one seal takes at most [`MAX_SEAL_BYTES`]; the block counter
//! refuses to wrap past `u64::MAX`; a key file is at most 65 bytes.
//! Nothing here panics on any input: a garbage or short ciphertext is
//! [`CryptoError::OpenFailed`].

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use ring::hkdf;

use crate::data_dir::sync_dir;
use crate::error::StoreError;
use crate::storage::{OpenMode, Storage};

pub const MASTER_KEY_BYTES: usize = 32;
/// The AES-GCM tag appended to every sealed buffer.
pub const TAG_BYTES: usize = 16;
/// Length of [`Keyring::key_check`].
pub const KEY_CHECK_BYTES: usize = 16;
/// The most one seal takes. Far above the store's largest record (64 MiB)
/// and far below GCM's own limit (2^36 - 32 bytes per nonce).
pub const MAX_SEAL_BYTES: usize = 1 << 30;
/// The start counter's file in the data dir.
pub const EPOCH_FILE_NAME: &str = "EPOCH";

const _: () = assert!(TAG_BYTES == ring::aead::MAX_TAG_LEN);

/// Fixed HKDF salt: domain-separates cubecrypt from any other use of the
/// same key material. Changing it changes every key (a format version).
const HKDF_SALT: &[u8] = b"cube cubecrypt v1";
/// HKDF info prefixes, one per purpose; the namespace id (u64 LE) follows.
/// Distinct lengths, so no (purpose, id) pair encodes like another.
const INFO_WAL: &[u8] = b"wal";
const INFO_CHECKPOINT: &[u8] = b"checkpoint";
const INFO_KEY_CHECK: &[u8] = b"key check";

/// 64 hex digits and a newline; anything longer is not a key file.
const KEY_FILE_MAX_BYTES: u64 = 2 * MASTER_KEY_BYTES as u64 + 1;
const KEY_FILE_FORMAT: &str = "expected 32 raw bytes, or 64 hex digits and an optional newline";
/// u32 LE epoch, then CRC32C of those 4 bytes (LE).
const EPOCH_FILE_BYTES: usize = 8;

/// The checkpoint-block nonce counter. Process-wide rather than per
/// [`Keyring`]: two keyrings built in one process with the same master key
/// and epoch (tests, tools) still never hand out the same block nonce.
static BLOCK_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The 32-byte master key. Its bytes never leave this module: `Debug`
/// prints `MasterKey(..)`.
pub struct MasterKey([u8; MASTER_KEY_BYTES]);

impl MasterKey {
    /// A key from raw bytes (tests, or a caller with its own key source).
    pub fn from_bytes(bytes: [u8; MASTER_KEY_BYTES]) -> MasterKey {
        MasterKey(bytes)
    }
}

impl fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MasterKey(..)")
    }
}

impl Drop for MasterKey {
    // Best effort only: without `unsafe` (denied here) there is no volatile
    // write, and ring keeps its own expanded key schedules anyway.
    fn drop(&mut self) {
        self.0.fill(0);
        std::hint::black_box(&self.0);
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CryptoError {
    /// The key file is missing, unreadable, too open, or malformed.
    KeyFile { path: PathBuf, reason: String },
    /// An encrypted namespace needs a key and cubed was started without
    /// `--key-file`.
    NoKey,
    /// Authentication failed: the wrong key, or the bytes, their associated
    /// data or their position (nonce) were changed.
    OpenFailed,
    /// A seal was refused to keep the nonce scheme sound (epoch 0 or not
    /// this keyring's, counter exhausted) or the input exceeds
    /// [`MAX_SEAL_BYTES`]. A bug in the caller, not a data problem.
    Refused(&'static str),
}

impl fmt::Display for CryptoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CryptoError::KeyFile { path, reason } => {
                write!(f, "key file {}: {reason}", path.display())
            }
            CryptoError::NoKey => f.write_str(
                "no encryption key: the data is encrypted and cubed was started without --key-file",
            ),
            CryptoError::OpenFailed => f.write_str(
                "authentication failed: wrong key, or the data was tampered with or damaged",
            ),
            CryptoError::Refused(reason) => write!(f, "cubecrypt refused to seal: {reason}"),
        }
    }
}

impl std::error::Error for CryptoError {}

/// Reads a key file: exactly 32 raw bytes, or 64 hex digits with an
/// optional trailing newline. Refuses a file readable or writable by group
/// or others (`mode & 0o077 != 0`), saying the mode and the `chmod` that
/// fixes it; a missing file; anything but a regular file; a wrong length.
pub fn load_key_file(path: &Path) -> Result<MasterKey, CryptoError> {
    let refuse = |reason: String| CryptoError::KeyFile {
        path: path.to_path_buf(),
        reason,
    };
    // Checked before opening: opening a FIFO would block the start.
    let kind = std::fs::metadata(path).map_err(|e| refuse(describe_io(&e)))?;
    if !kind.is_file() {
        return Err(refuse("not a regular file".into()));
    }
    let mut file = File::open(path).map_err(|e| refuse(describe_io(&e)))?;
    // The mode of the file actually opened, not of whatever the path names now.
    let meta = file.metadata().map_err(|e| refuse(describe_io(&e)))?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(refuse(format!(
            "mode {mode:04o} lets group or others read or write the key; \
             refusing to use it. Fix with `chmod 600 {}`",
            path.display()
        )));
    }
    if meta.len() > KEY_FILE_MAX_BYTES {
        return Err(refuse(format!("{} bytes; {KEY_FILE_FORMAT}", meta.len())));
    }
    let mut bytes = Vec::with_capacity(KEY_FILE_MAX_BYTES as usize + 1);
    let read = (&mut file)
        .take(KEY_FILE_MAX_BYTES + 1)
        .read_to_end(&mut bytes);
    let parsed = match read {
        Ok(_) => parse_key(&bytes).map_err(refuse),
        Err(e) => Err(refuse(describe_io(&e))),
    };
    bytes.fill(0);
    std::hint::black_box(&bytes);
    parsed.map(MasterKey)
}

fn describe_io(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::NotFound => "no such file".into(),
        io::ErrorKind::PermissionDenied => format!("cannot read it: {e}"),
        _ => e.to_string(),
    }
}

fn parse_key(bytes: &[u8]) -> Result<[u8; MASTER_KEY_BYTES], String> {
    let hex = match bytes {
        [hex @ .., b'\n'] if hex.len() == 2 * MASTER_KEY_BYTES => Some(hex),
        hex if hex.len() == 2 * MASTER_KEY_BYTES => Some(hex),
        _ => None,
    };
    let mut key = [0u8; MASTER_KEY_BYTES];
    if let Some(hex) = hex {
        for (i, pair) in hex.chunks_exact(2).enumerate() {
            match (hex_value(pair[0]), hex_value(pair[1])) {
                (Some(hi), Some(lo)) => key[i] = hi << 4 | lo,
                // The position, never the byte: it is key material.
                _ => return Err(format!("not a hex digit at byte {}", 2 * i)),
            }
        }
    } else if bytes.len() == MASTER_KEY_BYTES {
        // 32 random bytes are all hex digits with probability ~1e-34; this
        // is a 128-bit hex key written without its other half.
        if bytes.iter().all(u8::is_ascii_hexdigit) {
            return Err(
                "32 hex digits is a 128-bit key; cubecrypt needs 64 hex digits \
                 (or 32 raw bytes), e.g. `openssl rand -hex 32`"
                    .into(),
            );
        }
        key.copy_from_slice(bytes);
    } else {
        return Err(format!("{} bytes; {KEY_FILE_FORMAT}", bytes.len()));
    }
    if key.iter().all(|b| *b == 0) {
        return Err("the key is all zeros".into());
    }
    Ok(key)
}

fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

/// One namespace's derived keys.
struct NsKeys {
    wal: LessSafeKey,
    checkpoint: LessSafeKey,
}

/// HKDF output length for the key check.
struct KeyCheckLen;

impl hkdf::KeyType for KeyCheckLen {
    fn len(&self) -> usize {
        KEY_CHECK_BYTES
    }
}

/// The master key's HKDF PRK, the epoch of this start, and the derived
/// per-namespace keys. Shared by the writer and the checkpointer.
pub struct Keyring {
    /// `None`: started without `--key-file`; every operation is `NoKey`.
    prk: Option<hkdf::Prk>,
    epoch: u32,
    /// One entry (two AES key schedules, about 1 KiB) per namespace id used
    /// since start; [`Keyring::forget`] drops one.
    keys: RwLock<HashMap<u64, Arc<NsKeys>>>,
    /// Namespace ids whose key check matched this master key: a sealed
    /// record of one of them that fails to open was tampered with; of any
    /// other, the key is the likelier culprit (refuse, never repair).
    verified: RwLock<std::collections::HashSet<u64>>,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyring")
            .field("has_key", &self.has_key())
            .field("epoch", &self.epoch)
            .field("namespaces_cached", &self.cache().len())
            .finish()
    }
}

impl Keyring {
    /// `epoch`: a number that is different at every start of the daemon with
    /// this data dir: the value [`bump_epoch`] returned. Seals refuse epoch 0,
    /// which `bump_epoch` never returns (it means nobody bumped).
    pub fn new(master: Option<MasterKey>, epoch: u32) -> Keyring {
        // The master key is dropped (and zeroed) here; only the PRK is kept.
        let prk = master.map(|key| hkdf::Salt::new(hkdf::HKDF_SHA256, HKDF_SALT).extract(&key.0));
        Keyring {
            prk,
            epoch,
            keys: RwLock::new(HashMap::new()),
            verified: RwLock::new(std::collections::HashSet::new()),
        }
    }

    /// Records that `ns_id`'s key check matched (`namespace.rs`).
    pub fn mark_verified(&self, ns_id: u64) {
        self.verified
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(ns_id);
    }

    /// Whether `ns_id`'s key check matched this master key.
    pub fn is_verified(&self, ns_id: u64) -> bool {
        self.verified
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&ns_id)
    }

    pub fn has_key(&self) -> bool {
        self.prk.is_some()
    }

    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// 16 bytes derived from the master key and the namespace id, stored in
    /// plaintext in the namespace's metadata, so that starting with a wrong
    /// key ("key check mismatch") is told apart from tampering ("open
    /// failed"). An HKDF output of its own: it reveals nothing about the
    /// data keys.
    pub fn key_check(&self, ns_id: u64) -> Result<[u8; KEY_CHECK_BYTES], CryptoError> {
        let prk = self.prk.as_ref().ok_or(CryptoError::NoKey)?;
        let id = ns_id.to_le_bytes();
        let info = [INFO_KEY_CHECK, &id[..]];
        let mut out = [0u8; KEY_CHECK_BYTES];
        prk.expand(&info, KeyCheckLen)
            .and_then(|okm| okm.fill(&mut out))
            .map_err(|_| CryptoError::Refused("HKDF expansion failed"))?;
        Ok(out)
    }

    /// Drops a namespace's cached keys (after `ns drop`); they are derived
    /// again if the id is used again.
    pub fn forget(&self, ns_id: u64) {
        self.keys
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&ns_id);
    }

    /// WAL record payload: encrypts `buf` in place and appends the 16-byte
    /// tag. Nonce = epoch (u32 BE) || lsn (u64 BE), under the namespace's WAL
    /// key. `aad` is authenticated, not encrypted. `epoch` must be this
    /// keyring's: sealing under an older one could repeat a nonce. The caller
    /// seals each LSN at most once per start (LSNs are never reassigned
    /// within a start; a latched writer never retries).
    pub fn seal_wal(
        &self,
        ns_id: u64,
        epoch: u32,
        lsn: u64,
        aad: &[u8],
        buf: &mut Vec<u8>,
    ) -> Result<(), CryptoError> {
        let keys = self.keys_for(ns_id)?;
        self.check_seal(epoch, buf.len())?;
        keys.wal
            .seal_in_place_append_tag(nonce(epoch, lsn), Aad::from(aad), buf)
            .map_err(|_| CryptoError::Refused("AES-GCM refused the input"))
    }

    /// Inverse of [`Keyring::seal_wal`]: `buf` is ciphertext || tag; on
    /// success returns the plaintext length (the plaintext is `buf[..len]`).
    /// On failure `buf` is overwritten in an unspecified way: keep a copy if
    /// the ciphertext is needed afterwards.
    pub fn open_wal(
        &self,
        ns_id: u64,
        epoch: u32,
        lsn: u64,
        aad: &[u8],
        buf: &mut [u8],
    ) -> Result<usize, CryptoError> {
        let keys = self.keys_for(ns_id)?;
        open(&keys.wal, nonce(epoch, lsn), aad, buf)
    }

    /// Checkpoint block: encrypts `buf` in place and appends the tag, with
    /// nonce = epoch (u32 BE) || counter (u64 BE) under the namespace's
    /// checkpoint key. The counter is process-wide and taken once per call.
    /// Returns (epoch, counter), which the caller stores next to the
    /// ciphertext to open it.
    pub fn seal_block(
        &self,
        ns_id: u64,
        aad: &[u8],
        buf: &mut Vec<u8>,
    ) -> Result<(u32, u64), CryptoError> {
        let keys = self.keys_for(ns_id)?;
        self.check_seal(self.epoch, buf.len())?;
        let counter = BLOCK_COUNTER
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| c.checked_add(1))
            .map_err(|_| CryptoError::Refused("the block nonce counter is exhausted"))?;
        keys.checkpoint
            .seal_in_place_append_tag(nonce(self.epoch, counter), Aad::from(aad), buf)
            .map_err(|_| CryptoError::Refused("AES-GCM refused the input"))?;
        Ok((self.epoch, counter))
    }

    /// Inverse of [`Keyring::seal_block`]; as [`Keyring::open_wal`].
    pub fn open_block(
        &self,
        ns_id: u64,
        epoch: u32,
        counter: u64,
        aad: &[u8],
        buf: &mut [u8],
    ) -> Result<usize, CryptoError> {
        let keys = self.keys_for(ns_id)?;
        open(&keys.checkpoint, nonce(epoch, counter), aad, buf)
    }

    fn check_seal(&self, epoch: u32, len: usize) -> Result<(), CryptoError> {
        if epoch == 0 {
            return Err(CryptoError::Refused(
                "epoch 0: the keyring was built without bump_epoch",
            ));
        }
        if epoch != self.epoch {
            return Err(CryptoError::Refused(
                "sealing under another start's epoch could repeat a nonce",
            ));
        }
        if len > MAX_SEAL_BYTES {
            return Err(CryptoError::Refused("input larger than MAX_SEAL_BYTES"));
        }
        Ok(())
    }

    fn cache(&self) -> std::sync::RwLockReadGuard<'_, HashMap<u64, Arc<NsKeys>>> {
        // The map is never left half-updated (insert and remove are single
        // calls), so a panic elsewhere while holding the lock is harmless.
        self.keys.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn keys_for(&self, ns_id: u64) -> Result<Arc<NsKeys>, CryptoError> {
        let prk = self.prk.as_ref().ok_or(CryptoError::NoKey)?;
        if let Some(keys) = self.cache().get(&ns_id) {
            return Ok(Arc::clone(keys));
        }
        // Derived outside the lock; a racing thread derives the same keys,
        // and whichever lands first is kept.
        let derived = Arc::new(NsKeys {
            wal: derive_aead_key(prk, INFO_WAL, ns_id)?,
            checkpoint: derive_aead_key(prk, INFO_CHECKPOINT, ns_id)?,
        });
        let mut map = self.keys.write().unwrap_or_else(PoisonError::into_inner);
        Ok(Arc::clone(map.entry(ns_id).or_insert(derived)))
    }
}

fn derive_aead_key(
    prk: &hkdf::Prk,
    purpose: &[u8],
    ns_id: u64,
) -> Result<LessSafeKey, CryptoError> {
    let id = ns_id.to_le_bytes();
    let info = [purpose, &id[..]];
    let okm = prk
        .expand(&info, &AES_256_GCM)
        .map_err(|_| CryptoError::Refused("HKDF expansion failed"))?;
    Ok(LessSafeKey::new(UnboundKey::from(okm)))
}

fn nonce(epoch: u32, n: u64) -> Nonce {
    let mut bytes = [0u8; ring::aead::NONCE_LEN];
    bytes[..4].copy_from_slice(&epoch.to_be_bytes());
    bytes[4..].copy_from_slice(&n.to_be_bytes());
    Nonce::assume_unique_for_key(bytes)
}

fn open(key: &LessSafeKey, nonce: Nonce, aad: &[u8], buf: &mut [u8]) -> Result<usize, CryptoError> {
    // Authentic data is never longer than what a seal accepts.
    if buf.len() < TAG_BYTES || buf.len() > MAX_SEAL_BYTES + TAG_BYTES {
        return Err(CryptoError::OpenFailed);
    }
    key.open_in_place(nonce, Aad::from(aad), buf)
        .map(|plain| plain.len())
        .map_err(|_| CryptoError::OpenFailed)
}

/// The data dir's start counter: reads `DATA/EPOCH` (u32 LE + CRC32C of it,
/// 8 bytes; a missing file is 0), adds 1, writes it back durably (temp file,
/// fsync, rename over, fsync the directory) and returns the new value. Call
/// it once per start, after taking the data dir lock and before any seal.
///
/// A damaged file is an error naming it, never a silent reset: a reset would
/// hand out epochs already used, and with them nonces. Past `u32::MAX` is an
/// error too.
pub(crate) fn bump_epoch(storage: &dyn Storage, data_dir: &Path) -> Result<u32, StoreError> {
    let path = data_dir.join(EPOCH_FILE_NAME);
    let current = match storage.read_file(&path) {
        Ok(bytes) => decode_epoch(&bytes).map_err(|reason| refuse_epoch(&path, reason))?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
        Err(e) => return Err(StoreError::io(&path, e)),
    };
    let next = current.checked_add(1).ok_or_else(|| {
        refuse_epoch(
            &path,
            format!(
                "the start counter is at its limit ({}); it cannot be bumped",
                u32::MAX
            ),
        )
    })?;
    let tmp = data_dir.join(format!("{EPOCH_FILE_NAME}.tmp"));
    storage
        .open(&tmp, OpenMode::CreateTruncate)
        .and_then(|mut file| {
            file.write_all_at(&encode_epoch(next), 0)?;
            file.sync_data()
        })
        .map_err(|e| StoreError::io(&tmp, e))?;
    storage
        .rename(&tmp, &path)
        .map_err(|e| StoreError::io(&path, e))?;
    sync_dir(storage, data_dir)?;
    Ok(next)
}

fn encode_epoch(epoch: u32) -> [u8; EPOCH_FILE_BYTES] {
    let value = epoch.to_le_bytes();
    let mut out = [0u8; EPOCH_FILE_BYTES];
    out[..4].copy_from_slice(&value);
    out[4..].copy_from_slice(&crc32c::crc32c(&value).to_le_bytes());
    out
}

fn decode_epoch(bytes: &[u8]) -> Result<u32, String> {
    let Ok(bytes) = <[u8; EPOCH_FILE_BYTES]>::try_from(bytes) else {
        return Err(format!(
            "damaged: {} bytes, expected {EPOCH_FILE_BYTES}",
            bytes.len()
        ));
    };
    let value = [bytes[0], bytes[1], bytes[2], bytes[3]];
    let stored = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    if stored != crc32c::crc32c(&value) {
        return Err("damaged: checksum mismatch".into());
    }
    Ok(u32::from_le_bytes(value))
}

/// Not `StoreError::Corruption`: its advice (`--repair` truncates the WAL)
/// does not apply to this file.
fn refuse_epoch(path: &Path, reason: String) -> StoreError {
    StoreError::io(
        path,
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "start counter (EPOCH) {reason}; refusing to start, because guessing it \
                 could reuse an encryption nonce. If no namespace in this data dir is \
                 encrypted, deleting the file is safe"
            ),
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    use crate::sim_disk::{FaultPlan, SimDisk};
    use crate::storage::RealDisk;

    fn key(byte: u8) -> MasterKey {
        MasterKey::from_bytes([byte; MASTER_KEY_BYTES])
    }

    fn ring(byte: u8, epoch: u32) -> Keyring {
        Keyring::new(Some(key(byte)), epoch)
    }

    const AAD: &[u8] = b"record header";

    fn sealed_wal(k: &Keyring, plain: &[u8]) -> Vec<u8> {
        let mut buf = plain.to_vec();
        k.seal_wal(7, k.epoch(), 42, AAD, &mut buf).unwrap();
        buf
    }

    #[test]
    fn wal_round_trips_and_hides_the_plaintext() {
        let k = ring(1, 3);
        for len in [0, 1, 15, 16, 17, 1024, 70_000] {
            let plain: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut buf = sealed_wal(&k, &plain);
            assert_eq!(buf.len(), len + TAG_BYTES);
            if len >= 16 {
                assert_ne!(&buf[..len], &plain[..]);
            }
            let n = k.open_wal(7, 3, 42, AAD, &mut buf).unwrap();
            assert_eq!(&buf[..n], &plain[..]);
        }
    }

    #[test]
    fn block_round_trips_with_fresh_counters() {
        let k = ring(1, 3);
        let mut a = b"block a".to_vec();
        let mut b = b"block a".to_vec();
        let (ea, ca) = k.seal_block(9, AAD, &mut a).unwrap();
        let (eb, cb) = k.seal_block(9, AAD, &mut b).unwrap();
        assert_eq!((ea, eb), (3, 3));
        assert_ne!(ca, cb);
        assert_ne!(a, b, "same plaintext, different nonce");
        let n = k.open_block(9, ea, ca, AAD, &mut a).unwrap();
        assert_eq!(&a[..n], b"block a");
        // A block opened under the other block's counter fails.
        assert_eq!(
            k.open_block(9, eb, ca, AAD, &mut b),
            Err(CryptoError::OpenFailed)
        );
    }

    #[test]
    fn wrong_key_fails_to_open() {
        let mut buf = sealed_wal(&ring(1, 3), b"secret");
        assert_eq!(
            ring(2, 3).open_wal(7, 3, 42, AAD, &mut buf),
            Err(CryptoError::OpenFailed)
        );
        let k = ring(1, 3);
        let mut block = b"secret".to_vec();
        let (e, c) = k.seal_block(7, AAD, &mut block).unwrap();
        assert_eq!(
            ring(2, 3).open_block(7, e, c, AAD, &mut block),
            Err(CryptoError::OpenFailed)
        );
    }

    #[test]
    fn any_flipped_bit_fails_to_open() {
        let k = ring(1, 3);
        let plain = b"a payload of some length, 40 bytes long";
        let sealed = sealed_wal(&k, plain);
        for bit in 0..sealed.len() * 8 {
            let mut buf = sealed.clone();
            buf[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(
                k.open_wal(7, 3, 42, AAD, &mut buf),
                Err(CryptoError::OpenFailed),
                "ciphertext/tag bit {bit}"
            );
        }
        for bit in 0..AAD.len() * 8 {
            let mut aad = AAD.to_vec();
            aad[bit / 8] ^= 1 << (bit % 8);
            let mut buf = sealed.clone();
            assert_eq!(
                k.open_wal(7, 3, 42, &aad, &mut buf),
                Err(CryptoError::OpenFailed),
                "aad bit {bit}"
            );
        }
        let mut block = plain.to_vec();
        let (e, c) = k.seal_block(7, AAD, &mut block).unwrap();
        for bit in 0..block.len() * 8 {
            let mut buf = block.clone();
            buf[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(
                k.open_block(7, e, c, AAD, &mut buf),
                Err(CryptoError::OpenFailed),
                "block bit {bit}"
            );
        }
    }

    #[test]
    fn another_position_namespace_or_purpose_fails_to_open() {
        let k = ring(1, 3);
        let sealed = sealed_wal(&k, b"moved record");
        let tries: [(u64, u32, u64); 3] = [(7, 3, 43), (7, 4, 42), (8, 3, 42)];
        for (ns, epoch, lsn) in tries {
            let mut buf = sealed.clone();
            assert_eq!(
                k.open_wal(ns, epoch, lsn, AAD, &mut buf),
                Err(CryptoError::OpenFailed),
                "ns {ns} epoch {epoch} lsn {lsn}"
            );
        }
        // The WAL and checkpoint keys differ: a WAL record does not open as
        // a block with the same nonce.
        let mut buf = sealed.clone();
        assert_eq!(
            k.open_block(7, 3, 42, AAD, &mut buf),
            Err(CryptoError::OpenFailed)
        );
    }

    #[test]
    fn garbage_and_short_input_fail_without_panic() {
        let k = ring(1, 3);
        for len in [0, 1, TAG_BYTES - 1, TAG_BYTES, 100] {
            let mut buf = vec![0xa5; len];
            assert_eq!(
                k.open_wal(7, 3, 1, AAD, &mut buf),
                Err(CryptoError::OpenFailed)
            );
            assert_eq!(
                k.open_block(7, 3, 1, AAD, &mut buf),
                Err(CryptoError::OpenFailed)
            );
        }
    }

    #[test]
    fn without_a_key_everything_is_no_key() {
        let k = Keyring::new(None, 3);
        assert!(!k.has_key());
        let mut buf = b"x".to_vec();
        assert_eq!(k.key_check(1), Err(CryptoError::NoKey));
        assert_eq!(k.seal_wal(1, 3, 1, AAD, &mut buf), Err(CryptoError::NoKey));
        assert_eq!(k.seal_block(1, AAD, &mut buf), Err(CryptoError::NoKey));
        assert_eq!(k.open_wal(1, 3, 1, AAD, &mut buf), Err(CryptoError::NoKey));
        assert_eq!(
            k.open_block(1, 3, 1, AAD, &mut buf),
            Err(CryptoError::NoKey)
        );
        assert_eq!(buf, b"x", "untouched");
    }

    #[test]
    fn seals_refuse_epoch_zero_and_foreign_epochs() {
        let mut buf = b"x".to_vec();
        assert!(matches!(
            ring(1, 0).seal_wal(1, 0, 1, AAD, &mut buf),
            Err(CryptoError::Refused(_))
        ));
        assert!(matches!(
            ring(1, 0).seal_block(1, AAD, &mut buf),
            Err(CryptoError::Refused(_))
        ));
        assert!(matches!(
            ring(1, 5).seal_wal(1, 4, 1, AAD, &mut buf),
            Err(CryptoError::Refused(_))
        ));
        assert_eq!(buf, b"x", "untouched");
        // Opening under an older epoch is what recovery does: allowed.
        let mut old = b"y".to_vec();
        ring(1, 4).seal_wal(1, 4, 1, AAD, &mut old).unwrap();
        assert_eq!(ring(1, 5).open_wal(1, 4, 1, AAD, &mut old), Ok(1));
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn unhex(text: &str) -> Vec<u8> {
        (0..text.len() / 2)
            .map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16).unwrap())
            .collect()
    }

    /// Pins the documented scheme (salt, info strings, nonce layout) to
    /// vectors computed independently (Python: hmac + `cryptography`'s
    /// AESGCM), so a change that would strand existing data fails here.
    #[test]
    fn known_answers_match_the_documented_scheme() {
        let k = ring(1, 3);
        assert_eq!(
            hex(&k.key_check(1).unwrap()),
            "eb8f6c557cb1dbff7a8a4d389e3eef54"
        );
        let mut buf = b"cube".to_vec();
        k.seal_wal(7, 3, 42, AAD, &mut buf).unwrap();
        assert_eq!(hex(&buf), "eab226adc528eebb9511994c050163fe63e964d1");
        let mut block = unhex("61946c36bc2582052f332927f2c3ae0e9d63757f");
        let n = k.open_block(7, 3, 5, AAD, &mut block).unwrap();
        assert_eq!(&block[..n], b"cube");
    }

    #[test]
    fn key_check_differs_per_key_and_namespace() {
        let a = ring(1, 1);
        let b = ring(2, 1);
        assert_eq!(a.key_check(1).unwrap(), ring(1, 9).key_check(1).unwrap());
        assert_ne!(a.key_check(1).unwrap(), b.key_check(1).unwrap());
        assert_ne!(a.key_check(1).unwrap(), a.key_check(2).unwrap());
    }

    #[test]
    fn forget_drops_cached_keys_and_they_come_back() {
        let k = ring(1, 3);
        let mut buf = sealed_wal(&k, b"kept");
        k.forget(7);
        assert!(format!("{k:?}").contains("namespaces_cached: 0"));
        assert_eq!(k.open_wal(7, 3, 42, AAD, &mut buf), Ok(4));
    }

    #[test]
    fn debug_never_prints_key_bytes() {
        let text = format!("{:?} {:?}", key(0xab), ring(0xab, 1));
        assert!(text.contains("MasterKey(..)"), "{text}");
        assert!(!text.contains("171"), "{text}");
    }

    #[test]
    fn keyring_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Keyring>();
    }

    fn write_key(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> PathBuf {
        let path = dir.join(name);
        fs::write(&path, bytes).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    /// Seals with `loaded` and opens with a keyring on `raw`: same key.
    fn same_key(loaded: MasterKey, raw: [u8; 32]) -> bool {
        let mut buf = b"probe".to_vec();
        let a = Keyring::new(Some(loaded), 1);
        a.seal_wal(1, 1, 1, AAD, &mut buf).unwrap();
        Keyring::new(Some(MasterKey::from_bytes(raw)), 1)
            .open_wal(1, 1, 1, AAD, &mut buf)
            .is_ok()
    }

    #[test]
    fn load_key_file_accepts_raw_and_hex_at_0600() {
        let tmp = tempfile::tempdir().unwrap();
        let raw: [u8; 32] = std::array::from_fn(|i| (i as u8).wrapping_mul(37) ^ 0xc3);
        let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        let p = write_key(tmp.path(), "raw", &raw, 0o600);
        assert!(same_key(load_key_file(&p).unwrap(), raw));
        let p = write_key(tmp.path(), "hex", hex.as_bytes(), 0o600);
        assert!(same_key(load_key_file(&p).unwrap(), raw));
        let p = write_key(tmp.path(), "hexnl", format!("{hex}\n").as_bytes(), 0o400);
        assert!(same_key(load_key_file(&p).unwrap(), raw));
        let p = write_key(
            tmp.path(),
            "HEX",
            format!("{}\n", hex.to_uppercase()).as_bytes(),
            0o600,
        );
        assert!(same_key(load_key_file(&p).unwrap(), raw));
    }

    #[test]
    fn load_key_file_refuses_open_modes_with_the_fix() {
        let tmp = tempfile::tempdir().unwrap();
        for mode in [0o644, 0o640, 0o604, 0o620, 0o602, 0o660] {
            let p = write_key(tmp.path(), "k", &[7u8; 32], mode);
            let err = load_key_file(&p).unwrap_err();
            let text = err.to_string();
            assert!(matches!(err, CryptoError::KeyFile { .. }), "{text}");
            assert!(text.contains(&p.display().to_string()), "{text}");
            assert!(text.contains("chmod 600"), "{text}");
            assert!(text.contains(&format!("{mode:04o}")), "{text}");
        }
    }

    #[test]
    fn load_key_file_refuses_missing_and_malformed_files() {
        let tmp = tempfile::tempdir().unwrap();
        let missing = tmp.path().join("nope");
        let text = load_key_file(&missing).unwrap_err().to_string();
        assert!(
            text.contains("nope") && text.contains("no such file"),
            "{text}"
        );
        let text = load_key_file(tmp.path()).unwrap_err().to_string();
        assert!(text.contains("not a regular file"), "{text}");
        let bad: [&[u8]; 7] = [
            b"",
            &[7u8; 31],
            &[7u8; 33],
            &[b'a'; 65], // 65 bytes but no newline
            &[b'g'; 64],
            b"0123456789abcdef0123456789abcdef", // a 128-bit hex key
            &[0u8; 32],
        ];
        for bytes in bad {
            let p = write_key(tmp.path(), "bad", bytes, 0o600);
            assert!(
                matches!(load_key_file(&p), Err(CryptoError::KeyFile { .. })),
                "{} bytes accepted",
                bytes.len()
            );
        }
        let p = write_key(tmp.path(), "big", &[7u8; 4096], 0o600);
        let text = load_key_file(&p).unwrap_err().to_string();
        assert!(text.contains("4096 bytes; expected"), "{text}");
    }

    #[test]
    fn bump_epoch_increments_and_survives() {
        let tmp = tempfile::tempdir().unwrap();
        let disk = RealDisk;
        assert_eq!(bump_epoch(&disk, tmp.path()).unwrap(), 1);
        assert_eq!(bump_epoch(&disk, tmp.path()).unwrap(), 2);
        assert_eq!(bump_epoch(&disk, tmp.path()).unwrap(), 3);
        let bytes = fs::read(tmp.path().join(EPOCH_FILE_NAME)).unwrap();
        assert_eq!(bytes, encode_epoch(3));
        assert!(!tmp.path().join("EPOCH.tmp").exists());
    }

    #[test]
    fn bump_epoch_refuses_a_damaged_file() {
        let tmp = tempfile::tempdir().unwrap();
        let disk = RealDisk;
        bump_epoch(&disk, tmp.path()).unwrap();
        let path = tmp.path().join(EPOCH_FILE_NAME);
        let good = fs::read(&path).unwrap();
        let mut flipped = good.clone();
        flipped[0] ^= 4;
        let damaged: [&[u8]; 4] = [&flipped, &good[..7], b"", &[good.as_slice(), b"x"].concat()];
        for bytes in damaged {
            fs::write(&path, bytes).unwrap();
            let text = bump_epoch(&disk, tmp.path()).unwrap_err().to_string();
            assert!(text.contains("EPOCH") && text.contains("damaged"), "{text}");
            assert_eq!(fs::read(&path).unwrap(), bytes, "left as found");
        }
        fs::write(&path, encode_epoch(u32::MAX)).unwrap();
        let text = bump_epoch(&disk, tmp.path()).unwrap_err().to_string();
        assert!(text.contains("limit"), "{text}");
    }

    /// Through power loss and injected I/O errors, a start never gets an
    /// epoch that an earlier start was given.
    #[test]
    fn bump_epoch_never_repeats_across_crashes_and_faults() {
        let dir = Path::new("/data");
        let (mut bumped, mut failed) = (0, 0);
        for seed in 0..200 {
            let mut disk = SimDisk::new(FaultPlan {
                seed,
                write_eio_ppm: 100_000,
                sync_eio_ppm: 100_000,
                dir_sync_eio_ppm: 100_000,
                ..FaultPlan::default()
            });
            disk.create_dir_all(dir).unwrap();
            let mut highest = 0;
            for _ in 0..6 {
                for _ in 0..3 {
                    match bump_epoch(&disk, dir) {
                        Ok(epoch) => {
                            assert!(epoch > highest, "seed {seed}: {epoch} after {highest}");
                            highest = epoch;
                            bumped += 1;
                        }
                        Err(_) => failed += 1,
                    }
                }
                disk = disk.crash();
            }
        }
        // The faults and crashes did happen, and most bumps still worked.
        assert!(
            failed > 100 && bumped > 2000,
            "{failed} failed, {bumped} bumped"
        );
    }
}
