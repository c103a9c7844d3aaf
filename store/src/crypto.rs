//! cubecrypt: per-namespace AES-256-GCM sealing of WAL payloads and checkpoint blocks, on ring.
//!
//! One job: turn a master key into per-namespace keys and seal or open byte
//! buffers under nonces that never repeat under one key. It knows nothing of
//! record or block layouts; the WAL and checkpoint code decide what is the
//! payload and what is authenticated as associated data (`aad`).
//!
//! Why it is built this way (the whole scheme is in `docs/storage-format.md`,
//! "Encryption at rest (cubecrypt)"):
//! - AES-GCM loses both confidentiality and integrity if a (key, nonce)
//!   pair repeats. Every start of the daemon draws a random, nonzero 64-bit
//!   **start id** ([`Keyring::for_new_start`]) and seals only under keys
//!   derived for that start: per (purpose, namespace id, start id). Two
//!   starts, and two copies of a data dir (a restored backup, a snapshot)
//!   that run on, therefore use different keys, except with probability
//!   2^-64 per pair of starts. No durable state is needed.
//! - Within one start, nonces are counters: a WAL record's is
//!   `low 32 bits of start || lsn`, a checkpoint block's is
//!   `low 32 bits of start || counter`. LSNs and the process-wide block
//!   counter are unique within a start.
//! - The WAL and checkpoint nonce spaces overlap (both are `u32 || u64`),
//!   so they use different keys; each namespace has its own keys too. All
//!   are HKDF-SHA256 expansions of the master key.
//! - Derived keys are cached per (namespace, start) so a seal costs one hash
//!   lookup plus AES-GCM itself (AES-NI and carry-less multiply through
//!   ring). Opening data of an earlier start derives its keys once.
//!
//! Limits: one seal takes at most [`MAX_SEAL_BYTES`]; the block counter
//! refuses to wrap past `u64::MAX`; a key file is at most 65 bytes; the key
//! cache holds at most [`KEY_CACHE_MAX_ENTRIES`] (namespace, start) pairs.
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
use ring::error::Unspecified;
use ring::rand::{SecureRandom, SystemRandom};
use ring::{hkdf, hmac};

pub const MASTER_KEY_BYTES: usize = 32;
/// The AES-GCM tag appended to every sealed buffer.
pub const TAG_BYTES: usize = 16;
/// Length of [`Keyring::key_check`].
pub const KEY_CHECK_BYTES: usize = 16;
/// The most one seal takes. Far above the store's largest record (64 MiB)
/// and far below GCM's own limit (2^36 - 32 bytes per nonce).
pub const MAX_SEAL_BYTES: usize = 1 << 30;
/// At most this many (namespace id, start id) pairs have cached keys (two
/// AES key schedules, about 1 KiB, each). A full cache is cleared: keys are
/// derived again on use, which costs two HKDF expansions.
pub const KEY_CACHE_MAX_ENTRIES: usize = 4096;

const _: () = assert!(TAG_BYTES == ring::aead::MAX_TAG_LEN);

/// Fixed HKDF salt: domain-separates cubecrypt from any other use of the
/// same key material. Changing it changes every key (a format version).
const HKDF_SALT: &[u8] = b"cube cubecrypt v1";
/// HKDF info prefixes, one per purpose. A data key's info is purpose ||
/// ns_id (u64 LE) || start (u64 LE); the key check's is purpose || ns_id.
/// Distinct lengths, so no (purpose, id, start) encodes like another.
const INFO_WAL: &[u8] = b"wal";
const INFO_CHECKPOINT: &[u8] = b"checkpoint";
const INFO_KEY_CHECK: &[u8] = b"key check";
/// The HMAC-SHA256 key that authenticates structure (manifest, checkpoint
/// files, the log's chain): one per master key, not per start, since
/// what it authenticates must verify under any later start.
const INFO_INTEGRITY: &[u8] = b"integrity";

/// Length of a structure MAC ([`Keyring::mac`]): a full HMAC-SHA256.
pub const MAC_BYTES: usize = 32;
/// Length of a data dir's random id ([`new_dir_id`]).
pub const DIR_ID_BYTES: usize = 16;

/// 64 hex digits and a newline; anything longer is not a key file.
const KEY_FILE_MAX_BYTES: u64 = 2 * MASTER_KEY_BYTES as u64 + 1;
const KEY_FILE_FORMAT: &str = "expected 32 raw bytes, or 64 hex digits and an optional newline";
/// Draws of the random start id before giving up on an RNG that keeps
/// returning zero (a 2^-64 event for a working one).
const START_DRAWS: usize = 4;

/// The checkpoint-block nonce counter. Process-wide rather than per
/// [`Keyring`]: two keyrings built in one process with the same master key
/// and start id (tests, tools) still never hand out the same block nonce.
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
    /// A seal was refused to keep the nonce scheme sound (start id 0 or not
    /// this keyring's, counter exhausted) or the input exceeds
    /// [`MAX_SEAL_BYTES`]. A bug in the caller, not a data problem.
    Refused(&'static str),
    /// The system's random number generator failed, so no start id could be
    /// drawn: the daemon refuses to start rather than risk a reused key.
    Random,
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
            CryptoError::Random => f.write_str(
                "the system random number generator failed, so no encryption start id \
                 could be drawn; refusing to start",
            ),
        }
    }
}

impl std::error::Error for CryptoError {}

/// Reads a key file: exactly 32 raw bytes, or 64 hex digits with an
/// optional trailing newline. Refuses a file readable or writable by group
/// or others (`mode & 0o077 != 0`), saying the mode and the `chmod` that
/// fixes it; a file another user owns; a missing file; anything but a regular file; a wrong length.
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
    // Its owner could swap the key or read it: only the daemon's user's.
    crate::private_files::check_owner(&meta).map_err(|e| refuse(e.to_string()))?;
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

/// One namespace's derived keys for one start.
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

/// The master key's HKDF PRK, the start id of this start, and the derived
/// per-(namespace, start) keys. Shared by the writer and the checkpointer.
pub struct Keyring {
    /// `None`: started without `--key-file`; every operation is `NoKey`.
    ///
    /// The PRK and the key schedules derived from it (here, in `mac_key`
    /// and in the cache) live as long as the keyring: every seal and open
    /// needs them, and deriving per use would cost two HKDF expansions per
    /// record. ring does not zero them on drop and `unsafe` (a volatile
    /// write) is denied, so they are not zeroized; what protects them is
    /// the process boundary (docs/operations.md, "What encryption protects").
    prk: Option<hkdf::Prk>,
    /// Authenticates structure: `None` without a key.
    mac_key: Option<hmac::Key>,
    start: u64,
    /// One entry (two AES key schedules, about 1 KiB) per (namespace id,
    /// start id) used since start, at most [`KEY_CACHE_MAX_ENTRIES`];
    /// [`Keyring::forget`] drops a namespace's.
    keys: RwLock<HashMap<(u64, u64), Arc<NsKeys>>>,
    /// Namespace ids whose key check matched this master key: a sealed
    /// record of one of them that fails to open was tampered with; of any
    /// other, the key is the likelier culprit (refuse, never repair).
    verified: RwLock<std::collections::HashSet<u64>>,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyring")
            .field("has_key", &self.has_key())
            .field("start", &self.start)
            .field("keys_cached", &self.cache().len())
            .finish()
    }
}

impl Keyring {
    /// A keyring for one start of the daemon: draws a random, nonzero
    /// 64-bit start id from the system RNG, so that nothing this start seals
    /// shares a key with any other start, nor with a copy of the data dir
    /// that runs on. [`CryptoError::Random`] if the RNG fails.
    pub fn for_new_start(master: MasterKey) -> Result<Keyring, CryptoError> {
        let rng = SystemRandom::new();
        let start = draw_start(|bytes| rng.fill(bytes))?;
        Ok(Keyring::new(Some(master), start))
    }

    /// A keyring with a given start id: for tests and tools. The daemon
    /// uses [`Keyring::for_new_start`]. Any start id opens (data carries its
    /// own); seals refuse start 0, so `Keyring::new(key, 0)` only opens. A
    /// caller that seals must never use a start id twice with one key.
    pub fn new(master: Option<MasterKey>, start: u64) -> Keyring {
        // The master key is dropped (and zeroed) here; only the PRK is kept.
        let prk = master.map(|key| hkdf::Salt::new(hkdf::HKDF_SHA256, HKDF_SALT).extract(&key.0));
        let mac_key = prk.as_ref().and_then(|prk| {
            prk.expand(&[INFO_INTEGRITY], hmac::HMAC_SHA256)
                .ok()
                .map(hmac::Key::from)
        });
        Keyring {
            prk,
            mac_key,
            start,
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

    /// This start's id: what seals use and what the sealed layouts store.
    pub fn start(&self) -> u64 {
        self.start
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

    /// A running structure MAC over `label` and then whatever the caller
    /// feeds it; [`MacContext::finish`] gives the tag. Labels are distinct
    /// fixed strings per use, so a tag of one kind never passes as another.
    pub fn mac_context(&self, label: &[u8]) -> Result<MacContext, CryptoError> {
        let key = self.mac_key.as_ref().ok_or(CryptoError::NoKey)?;
        let mut ctx = hmac::Context::with_key(key);
        ctx.update(label);
        Ok(MacContext(ctx))
    }

    /// The structure MAC of `label` followed by `parts`.
    pub fn mac(&self, label: &[u8], parts: &[&[u8]]) -> Result<[u8; MAC_BYTES], CryptoError> {
        let mut ctx = self.mac_context(label)?;
        for part in parts {
            ctx.update(part);
        }
        Ok(ctx.finish())
    }

    /// Drops a namespace's cached keys, of every start (after `ns drop`);
    /// they are derived again if the id is used again.
    pub fn forget(&self, ns_id: u64) {
        self.keys
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|&(id, _), _| id != ns_id);
    }

    /// WAL record payload: encrypts `buf` in place and appends the 16-byte
    /// tag. Key: the namespace's WAL key for `start`; nonce = low 32 bits of
    /// `start` (BE) || lsn (u64 BE). `aad` is authenticated, not encrypted.
    /// `start` must be this keyring's: sealing under another start's key
    /// could repeat a nonce. The caller seals each LSN at most once per start
    /// (LSNs are never reassigned within a start; a latched writer never
    /// retries).
    pub fn seal_wal(
        &self,
        ns_id: u64,
        start: u64,
        lsn: u64,
        aad: &[u8],
        buf: &mut Vec<u8>,
    ) -> Result<(), CryptoError> {
        let keys = self.keys_for(ns_id, start)?;
        self.check_seal(start, buf.len())?;
        keys.wal
            .seal_in_place_append_tag(nonce(start, lsn), Aad::from(aad), buf)
            .map_err(|_| CryptoError::Refused("AES-GCM refused the input"))
    }

    /// Inverse of [`Keyring::seal_wal`]: `buf` is ciphertext || tag; on
    /// success returns the plaintext length (the plaintext is `buf[..len]`).
    /// On failure `buf` is overwritten in an unspecified way: keep a copy if
    /// the ciphertext is needed afterwards.
    ///
    /// `start` is the start id stored with the record: that of this keyring
    /// or of any earlier start (recovery opens what earlier starts sealed).
    pub fn open_wal(
        &self,
        ns_id: u64,
        start: u64,
        lsn: u64,
        aad: &[u8],
        buf: &mut [u8],
    ) -> Result<usize, CryptoError> {
        let keys = self.keys_for(ns_id, start)?;
        open(&keys.wal, nonce(start, lsn), aad, buf)
    }

    /// Checkpoint block: encrypts `buf` in place and appends the tag, under
    /// the namespace's checkpoint key for this keyring's start, with nonce =
    /// low 32 bits of the start (BE) || counter (u64 BE). The counter is
    /// process-wide and taken once per call. Returns (start, counter), which
    /// the caller stores next to the ciphertext to open it.
    pub fn seal_block(
        &self,
        ns_id: u64,
        aad: &[u8],
        buf: &mut Vec<u8>,
    ) -> Result<(u64, u64), CryptoError> {
        let keys = self.keys_for(ns_id, self.start)?;
        self.check_seal(self.start, buf.len())?;
        let counter = BLOCK_COUNTER
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| c.checked_add(1))
            .map_err(|_| CryptoError::Refused("the block nonce counter is exhausted"))?;
        keys.checkpoint
            .seal_in_place_append_tag(nonce(self.start, counter), Aad::from(aad), buf)
            .map_err(|_| CryptoError::Refused("AES-GCM refused the input"))?;
        Ok((self.start, counter))
    }

    /// Inverse of [`Keyring::seal_block`]; as [`Keyring::open_wal`].
    pub fn open_block(
        &self,
        ns_id: u64,
        start: u64,
        counter: u64,
        aad: &[u8],
        buf: &mut [u8],
    ) -> Result<usize, CryptoError> {
        let keys = self.keys_for(ns_id, start)?;
        open(&keys.checkpoint, nonce(start, counter), aad, buf)
    }

    fn check_seal(&self, start: u64, len: usize) -> Result<(), CryptoError> {
        if start == 0 {
            return Err(CryptoError::Refused(
                "start id 0: this keyring only opens (see Keyring::for_new_start)",
            ));
        }
        if start != self.start {
            return Err(CryptoError::Refused(
                "sealing under another start's keys could repeat a nonce",
            ));
        }
        if len > MAX_SEAL_BYTES {
            return Err(CryptoError::Refused("input larger than MAX_SEAL_BYTES"));
        }
        Ok(())
    }

    fn cache(&self) -> std::sync::RwLockReadGuard<'_, HashMap<(u64, u64), Arc<NsKeys>>> {
        // The map is never left half-updated (insert, retain and clear are
        // single calls), so a panic elsewhere while holding the lock is
        // harmless.
        self.keys.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn keys_for(&self, ns_id: u64, start: u64) -> Result<Arc<NsKeys>, CryptoError> {
        let prk = self.prk.as_ref().ok_or(CryptoError::NoKey)?;
        if let Some(keys) = self.cache().get(&(ns_id, start)) {
            return Ok(Arc::clone(keys));
        }
        // Derived outside the lock; a racing thread derives the same keys,
        // and whichever lands first is kept.
        let derived = Arc::new(NsKeys {
            wal: derive_aead_key(prk, INFO_WAL, ns_id, start)?,
            checkpoint: derive_aead_key(prk, INFO_CHECKPOINT, ns_id, start)?,
        });
        let mut map = self.keys.write().unwrap_or_else(PoisonError::into_inner);
        if map.len() >= KEY_CACHE_MAX_ENTRIES && !map.contains_key(&(ns_id, start)) {
            // Bounds the memory that data of many starts (or forged start
            // ids) could pin; the keys in use come back on their next use.
            map.clear();
        }
        Ok(Arc::clone(map.entry((ns_id, start)).or_insert(derived)))
    }
}

/// A running HMAC-SHA256 (see [`Keyring::mac_context`]).
pub struct MacContext(hmac::Context);

impl MacContext {
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    pub fn finish(self) -> [u8; MAC_BYTES] {
        let mut out = [0u8; MAC_BYTES];
        out.copy_from_slice(self.0.sign().as_ref());
        out
    }
}

/// Whether two tags are equal, in time that does not depend on where they
/// differ.
pub fn tags_equal(a: &[u8; MAC_BYTES], b: &[u8; MAC_BYTES]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A random data dir id, drawn once when a data dir is first authenticated.
pub fn new_dir_id() -> Result<[u8; DIR_ID_BYTES], CryptoError> {
    let mut id = [0u8; DIR_ID_BYTES];
    SystemRandom::new()
        .fill(&mut id)
        .map_err(|_| CryptoError::Random)?;
    Ok(id)
}

/// A start id from `fill` (the system RNG, or a stand-in in tests): 8
/// random bytes, never 0. An RNG error, or only zeros in
/// [`START_DRAWS`] draws, is [`CryptoError::Random`].
fn draw_start(
    mut fill: impl FnMut(&mut [u8]) -> Result<(), Unspecified>,
) -> Result<u64, CryptoError> {
    for _ in 0..START_DRAWS {
        let mut bytes = [0u8; 8];
        fill(&mut bytes).map_err(|_| CryptoError::Random)?;
        let start = u64::from_le_bytes(bytes);
        if start != 0 {
            return Ok(start);
        }
    }
    Err(CryptoError::Random)
}

/// A data key: HKDF-SHA256 expand with info = purpose || ns_id (u64 LE) ||
/// start (u64 LE).
fn derive_aead_key(
    prk: &hkdf::Prk,
    purpose: &[u8],
    ns_id: u64,
    start: u64,
) -> Result<LessSafeKey, CryptoError> {
    let id = ns_id.to_le_bytes();
    let start = start.to_le_bytes();
    let info = [purpose, &id[..], &start[..]];
    let okm = prk
        .expand(&info, &AES_256_GCM)
        .map_err(|_| CryptoError::Refused("HKDF expansion failed"))?;
    Ok(LessSafeKey::new(UnboundKey::from(okm)))
}

/// Low 32 bits of the start id (BE) || `n` (u64 BE). The key is already
/// per start; the start's bits in the nonce are defence in depth.
fn nonce(start: u64, n: u64) -> Nonce {
    let mut bytes = [0u8; ring::aead::NONCE_LEN];
    bytes[..4].copy_from_slice(&(start as u32).to_be_bytes());
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    fn key(byte: u8) -> MasterKey {
        MasterKey::from_bytes([byte; MASTER_KEY_BYTES])
    }

    fn ring(byte: u8, start: u64) -> Keyring {
        Keyring::new(Some(key(byte)), start)
    }

    const AAD: &[u8] = b"record header";

    fn sealed_wal(k: &Keyring, plain: &[u8]) -> Vec<u8> {
        let mut buf = plain.to_vec();
        k.seal_wal(7, k.start(), 42, AAD, &mut buf).unwrap();
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
        // (7, 3 + 2^32, 42) has the same nonce as (7, 3, 42): only the key,
        // derived per start, differs.
        let tries: [(u64, u64, u64); 4] =
            [(7, 3, 43), (7, 4, 42), (7, 3 + (1 << 32), 42), (8, 3, 42)];
        for (ns, start, lsn) in tries {
            let mut buf = sealed.clone();
            assert_eq!(
                k.open_wal(ns, start, lsn, AAD, &mut buf),
                Err(CryptoError::OpenFailed),
                "ns {ns} start {start} lsn {lsn}"
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
    fn seals_refuse_start_zero_and_foreign_starts() {
        let mut buf = b"x".to_vec();
        assert!(matches!(
            ring(1, 0).seal_wal(1, 0, 1, AAD, &mut buf),
            Err(CryptoError::Refused(_))
        ));
        assert!(matches!(
            ring(1, 0).seal_block(1, AAD, &mut buf),
            Err(CryptoError::Refused(_))
        ));
        for foreign in [0, 4, 5 + (1 << 32), u64::MAX] {
            assert!(
                matches!(
                    ring(1, 5).seal_wal(1, foreign, 1, AAD, &mut buf),
                    Err(CryptoError::Refused(_))
                ),
                "start {foreign}"
            );
        }
        assert_eq!(buf, b"x", "untouched");
    }

    /// Two starts (or two copies of a data dir that run on) with one master
    /// key seal the same (namespace, LSN, plaintext) differently, even when
    /// their start ids share the low 32 bits that go into the nonce, and
    /// neither opens under the other's start id.
    #[test]
    fn two_starts_with_one_master_key_never_share_a_key() {
        let starts: [u64; 3] = [0x0000_0001_dead_beef, 0x0000_0002_dead_beef, 0x1234];
        let sealed: Vec<Vec<u8>> = starts
            .iter()
            .map(|&start| sealed_wal(&ring(1, start), b"the same plaintext"))
            .collect();
        for i in 0..starts.len() {
            for j in 0..starts.len() {
                let mut buf = sealed[i].clone();
                let opened = ring(1, starts[j]).open_wal(7, starts[j], 42, AAD, &mut buf);
                if i == j {
                    assert_eq!(opened, Ok(18));
                } else {
                    assert_ne!(sealed[i], sealed[j], "starts {i} and {j}");
                    assert_eq!(opened, Err(CryptoError::OpenFailed), "{i} as {j}");
                }
            }
        }
        // Blocks: each start's checkpoint key is its own too.
        let (a, b) = (ring(1, starts[0]), ring(1, starts[1]));
        let mut block = b"a block".to_vec();
        let (start, counter) = a.seal_block(9, AAD, &mut block).unwrap();
        assert_eq!(start, starts[0]);
        assert_eq!(
            b.open_block(9, starts[1], counter, AAD, &mut block.clone()),
            Err(CryptoError::OpenFailed)
        );
        assert_eq!(b.open_block(9, start, counter, AAD, &mut block), Ok(7));
    }

    /// Recovery opens what earlier starts sealed: the start id stored with
    /// the data is enough.
    #[test]
    fn a_keyring_opens_what_earlier_starts_sealed() {
        let old = ring(1, 0xaaaa_0000_0000_0001);
        let mut record = sealed_wal(&old, b"old record");
        let mut block = b"old block".to_vec();
        let (start, counter) = old.seal_block(7, AAD, &mut block).unwrap();
        drop(old);
        let new = ring(1, 0xbbbb_0000_0000_0002);
        let mut mine = sealed_wal(&new, b"new record");
        assert_eq!(new.open_wal(7, start, 42, AAD, &mut record), Ok(10));
        assert_eq!(&record[..10], b"old record");
        assert_eq!(new.open_block(7, start, counter, AAD, &mut block), Ok(9));
        assert_eq!(&block[..9], b"old block");
        assert_eq!(new.open_wal(7, new.start(), 42, AAD, &mut mine), Ok(10));
        assert_eq!(new.cache().len(), 2, "one entry per (namespace, start)");
    }

    #[test]
    fn for_new_start_draws_a_random_nonzero_start() {
        let a = Keyring::for_new_start(key(1)).unwrap();
        let b = Keyring::for_new_start(key(1)).unwrap();
        assert_ne!(a.start(), 0);
        assert_ne!(a.start(), b.start(), "2^-64");
        let mut buf = b"sealed by a".to_vec();
        a.seal_wal(7, a.start(), 1, AAD, &mut buf).unwrap();
        assert_eq!(b.open_wal(7, a.start(), 1, AAD, &mut buf), Ok(11));
    }

    #[test]
    fn a_failing_or_stuck_rng_gives_no_start() {
        assert_eq!(draw_start(|_| Err(Unspecified)), Err(CryptoError::Random));
        let mut draws = 0;
        let zeros = |bytes: &mut [u8]| {
            draws += 1;
            bytes.fill(0);
            Ok(())
        };
        assert_eq!(draw_start(zeros), Err(CryptoError::Random));
        assert_eq!(draws, START_DRAWS);
        // A zero draw is drawn again, not used.
        let mut first = true;
        let start = draw_start(|bytes| {
            bytes.fill(if first { 0 } else { 0x5a });
            first = false;
            Ok(())
        });
        assert_eq!(start, Ok(0x5a5a_5a5a_5a5a_5a5a));
        assert!(CryptoError::Random.to_string().contains("random"));
    }

    /// Data of many starts (or forged start ids) cannot grow the cache past
    /// its bound; a cleared cache derives the same keys again.
    #[test]
    fn the_key_cache_is_bounded() {
        let k = ring(1, 3);
        let mut mine = sealed_wal(&k, b"kept");
        for start in 1..=(KEY_CACHE_MAX_ENTRIES as u64 + 10) {
            let mut buf = vec![0u8; TAG_BYTES];
            assert_eq!(
                k.open_wal(7, start, 1, AAD, &mut buf),
                Err(CryptoError::OpenFailed)
            );
            assert!(k.cache().len() <= KEY_CACHE_MAX_ENTRIES);
        }
        assert_eq!(k.open_wal(7, 3, 42, AAD, &mut mine), Ok(4));
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn unhex(text: &str) -> Vec<u8> {
        (0..text.len() / 2)
            .map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16).unwrap())
            .collect()
    }

    /// Pins the documented scheme (salt, info strings with the start id,
    /// nonce layout with the start's low 32 bits) to vectors computed
    /// independently (Python: hmac + hashlib for HKDF, `cryptography`'s
    /// AESGCM), so a change that would strand existing data fails here.
    /// Master key 32 x 0x01, start 0x0123456789abcdef, namespace id 7.
    #[test]
    fn known_answers_match_the_documented_scheme() {
        const START: u64 = 0x0123_4567_89ab_cdef;
        let k = ring(1, START);
        // info "key check" || 1u64 LE: no start id, as before.
        assert_eq!(
            hex(&k.key_check(1).unwrap()),
            "eb8f6c557cb1dbff7a8a4d389e3eef54"
        );
        // Key: info "wal" || 7u64 LE || START LE; nonce 89abcdef || 42u64 BE.
        let mut buf = b"cube".to_vec();
        k.seal_wal(7, START, 42, AAD, &mut buf).unwrap();
        assert_eq!(hex(&buf), "30dbd550f5cbad8113318b98171b5136b86bca4d");
        // Key: info "checkpoint" || 7u64 LE || START LE; nonce 89abcdef || 5u64 BE.
        let mut block = unhex("0b8b79449a70ae0a2edeb76a6de1d8f783d812d4");
        let n = k.open_block(7, START, 5, AAD, &mut block).unwrap();
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
    fn forget_drops_cached_keys_of_every_start_and_they_come_back() {
        let k = ring(1, 3);
        let mut buf = sealed_wal(&k, b"kept");
        for start in [1, 2] {
            let _ = k.open_wal(7, start, 1, AAD, &mut [0u8; TAG_BYTES]);
        }
        let _ = k.open_wal(8, 3, 1, AAD, &mut [0u8; TAG_BYTES]);
        assert!(format!("{k:?}").contains("keys_cached: 4"), "{k:?}");
        k.forget(7);
        assert!(format!("{k:?}").contains("keys_cached: 1"), "{k:?}");
        assert!(k.cache().contains_key(&(8, 3)), "other namespaces stay");
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
}
