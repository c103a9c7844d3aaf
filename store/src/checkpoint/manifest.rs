//! The manifest: which checkpoint files are current, and up to which LSN
//! they reach. Replaced only by the classic safe sequence: write a temp
//! file, fsync it, rename it over the old one, fsync the directory.
//!
//! ```text
//! 0  8  magic "CUBEMANI"
//! 8  4  version = 1 (no master key) or 2 (authenticated)
//! 12 8  checkpoint_lsn  every record up to here is in base + deltas
//! 20 8  next_file_id    the id the next checkpoint file gets
//! 28 8  base_file_id    0 = no base yet
//! 36 4  delta_count     at most MAX_DELTAS
//! 40 8n delta_file_id   oldest first
//! version 2 only:
//! .. 16 dir_id          random, drawn when the data dir was first authenticated
//! .. 32 chain           the log's chain value at checkpoint_lsn (wal/chain.rs),
//!                       zeros if the log was not chained there
//! .. 32 file_mac        per listed file, base first, then deltas oldest first:
//!                       HMAC of the file's every byte (file.rs)
//! .. 32 tag             HMAC-SHA256 under the integrity key of
//!                       "cube manifest v2" || every byte before it
//! both:
//! .. 4  crc             CRC32C of every byte before it
//! ```
//! The CRC tells damage from tampering; the tag, which someone without the
//! key cannot compute, binds the list of files, each file's contents, the
//! checkpoint LSN and the chain value to this data dir.

use std::path::{Path, PathBuf};

use byteorder::{ByteOrder, LittleEndian};

use crate::crypto::{DIR_ID_BYTES, Keyring, MAC_BYTES, tags_equal};
use crate::data_dir::sync_dir;
use crate::error::StoreError;
use crate::storage::{OpenMode, Storage};

const MAGIC: &[u8; 8] = b"CUBEMANI";
const VERSION: u32 = 1;
const VERSION_AUTHENTICATED: u32 = 2;
const TAG_LABEL: &[u8] = b"cube manifest v2";
pub(crate) const MANIFEST_NAME: &str = "MANIFEST";
/// Deltas beyond this force a compaction, whatever their size.
pub(crate) const MAX_DELTAS: usize = 64;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Manifest {
    pub checkpoint_lsn: u64,
    pub next_file_id: u64,
    pub base_file_id: Option<u64>,
    pub delta_file_ids: Vec<u64>,
    /// Set in a data dir with a master key (format version 2).
    pub auth: Option<ManifestAuth>,
}

/// What an authenticated manifest adds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ManifestAuth {
    pub dir_id: [u8; DIR_ID_BYTES],
    /// The log's chain value at `checkpoint_lsn`; zeros if not chained.
    pub chain: [u8; MAC_BYTES],
    /// Each listed file's MAC, by file id.
    pub file_macs: std::collections::BTreeMap<u64, [u8; MAC_BYTES]>,
}

/// Why an authenticated manifest's tag did not verify.
pub(crate) const TAG_MISMATCH: &str = "the manifest's tag does not verify under this master key: \
     it is not the key this data dir was written with, or the manifest was tampered with";

pub(crate) fn base_file_name(id: u64) -> String {
    format!("base-{id:020}.ckpt")
}

pub(crate) fn delta_file_name(id: u64) -> String {
    format!("delta-{id:020}.ckpt")
}

impl Manifest {
    pub(crate) fn fresh() -> Manifest {
        Manifest {
            checkpoint_lsn: 0,
            next_file_id: 1,
            base_file_id: None,
            delta_file_ids: Vec::new(),
            auth: None,
        }
    }

    /// The files the manifest names with their ids, base first.
    pub(crate) fn file_ids(&self) -> Vec<u64> {
        self.base_file_id
            .into_iter()
            .chain(self.delta_file_ids.iter().copied())
            .collect()
    }

    /// The MAC the manifest holds for file `id`, if it is authenticated.
    pub(crate) fn file_mac(&self, id: u64) -> Option<[u8; MAC_BYTES]> {
        self.auth.as_ref()?.file_macs.get(&id).copied()
    }

    /// The files the manifest names, base first, then deltas oldest first.
    pub(crate) fn files(&self, dir: &Path) -> Vec<PathBuf> {
        self.base_file_id
            .map(|id| dir.join(base_file_name(id)))
            .into_iter()
            .chain(
                self.delta_file_ids
                    .iter()
                    .map(|id| dir.join(delta_file_name(*id))),
            )
            .collect()
    }

    /// The bytes of the manifest; an authenticated one needs `keyring`.
    fn encode(&self, keyring: Option<&Keyring>) -> Result<Vec<u8>, String> {
        assert!(
            self.delta_file_ids.len() <= MAX_DELTAS,
            "deltas are compacted before the cap"
        );
        let version = if self.auth.is_some() {
            VERSION_AUTHENTICATED
        } else {
            VERSION
        };
        let mut out = Vec::with_capacity(44 + 8 * self.delta_file_ids.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&version.to_le_bytes());
        out.extend_from_slice(&self.checkpoint_lsn.to_le_bytes());
        out.extend_from_slice(&self.next_file_id.to_le_bytes());
        out.extend_from_slice(&self.base_file_id.unwrap_or(0).to_le_bytes());
        out.extend_from_slice(&(self.delta_file_ids.len() as u32).to_le_bytes());
        for id in &self.delta_file_ids {
            out.extend_from_slice(&id.to_le_bytes());
        }
        if let Some(auth) = &self.auth {
            out.extend_from_slice(&auth.dir_id);
            out.extend_from_slice(&auth.chain);
            for id in self.file_ids() {
                let mac = auth
                    .file_macs
                    .get(&id)
                    .ok_or_else(|| format!("no MAC for checkpoint file {id}"))?;
                out.extend_from_slice(mac);
            }
            let keyring = keyring.ok_or("an authenticated manifest needs the master key")?;
            let tag = keyring.mac(TAG_LABEL, &[&out]).map_err(|e| e.to_string())?;
            out.extend_from_slice(&tag);
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        Ok(out)
    }

    fn decode(bytes: &[u8]) -> Result<Manifest, (u64, String)> {
        if bytes.len() < 44 || &bytes[0..8] != MAGIC {
            return Err((0, "not a cube manifest (bad magic or too short)".into()));
        }
        let body_len = bytes.len() - 4;
        let stored = LittleEndian::read_u32(&bytes[body_len..]);
        if stored != crc32c::crc32c(&bytes[..body_len]) {
            return Err((body_len as u64, "manifest checksum mismatch".into()));
        }
        let version = LittleEndian::read_u32(&bytes[8..12]);
        if version != VERSION && version != VERSION_AUTHENTICATED {
            return Err((8, format!("manifest version {version} is not supported")));
        }
        let count = LittleEndian::read_u32(&bytes[36..40]) as usize;
        let base = LittleEndian::read_u64(&bytes[28..36]);
        let files = count + usize::from(base != 0);
        let auth_len = if version == VERSION_AUTHENTICATED {
            DIR_ID_BYTES + MAC_BYTES + MAC_BYTES * files + MAC_BYTES
        } else {
            0
        };
        if count > MAX_DELTAS || body_len != 40 + 8 * count + auth_len {
            return Err((
                36,
                format!(
                    "manifest lists {count} deltas but holds {} bytes",
                    bytes.len()
                ),
            ));
        }
        let mut manifest = Manifest {
            checkpoint_lsn: LittleEndian::read_u64(&bytes[12..20]),
            next_file_id: LittleEndian::read_u64(&bytes[20..28]),
            base_file_id: (base != 0).then_some(base),
            delta_file_ids: (0..count)
                .map(|i| LittleEndian::read_u64(&bytes[40 + 8 * i..48 + 8 * i]))
                .collect(),
            auth: None,
        };
        if version == VERSION_AUTHENTICATED {
            let mut at = 40 + 8 * count;
            let mut take = |n: usize| {
                at += n;
                &bytes[at - n..at]
            };
            let mut auth = ManifestAuth {
                dir_id: take(DIR_ID_BYTES)
                    .try_into()
                    .map_err(|_| (0, String::new()))?,
                chain: take(MAC_BYTES).try_into().map_err(|_| (0, String::new()))?,
                file_macs: Default::default(),
            };
            for id in manifest.file_ids() {
                let mac = take(MAC_BYTES).try_into().map_err(|_| (0, String::new()))?;
                auth.file_macs.insert(id, mac);
            }
            manifest.auth = Some(auth);
        }
        Ok(manifest)
    }

    /// Checks an authenticated manifest's tag (`None`: it verifies, or the
    /// manifest is not authenticated); the bytes are the file as read.
    fn check_tag(bytes: &[u8], keyring: &Keyring) -> Option<String> {
        if bytes.len() < 12 + MAC_BYTES + 4
            || LittleEndian::read_u32(&bytes[8..12]) != VERSION_AUTHENTICATED
        {
            return None;
        }
        let tag_at = bytes.len() - 4 - MAC_BYTES;
        let Ok(computed) = keyring.mac(TAG_LABEL, &[&bytes[..tag_at]]) else {
            return Some(TAG_MISMATCH.into());
        };
        let stored: [u8; MAC_BYTES] = bytes[tag_at..tag_at + MAC_BYTES].try_into().ok()?;
        (!tags_equal(&computed, &stored)).then(|| TAG_MISMATCH.into())
    }

    /// Reads the manifest in `dir`; a missing one means no checkpoint yet.
    /// With a key, an authenticated manifest's tag is checked: the second
    /// value says why it does not verify (the caller decides when to
    /// report it: a wrong key is better named by the namespace it locks).
    pub(crate) fn load(
        storage: &dyn Storage,
        dir: &Path,
        keyring: Option<&Keyring>,
    ) -> Result<(Manifest, Option<String>), StoreError> {
        let path = dir.join(MANIFEST_NAME);
        match storage.read_file(&path) {
            Ok(bytes) => {
                let manifest = Manifest::decode(&bytes).map_err(|(offset, reason)| {
                    StoreError::Corruption {
                        path,
                        offset,
                        reason,
                    }
                })?;
                let bad_tag = keyring
                    .filter(|k| k.has_key())
                    .and_then(|k| Manifest::check_tag(&bytes, k));
                Ok((manifest, bad_tag))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok((Manifest::fresh(), None)),
            Err(e) => Err(StoreError::io(&path, e)),
        }
    }

    /// Replaces the manifest durably (temp, fsync, rename, fsync dir).
    pub(crate) fn store(
        &self,
        storage: &dyn Storage,
        dir: &Path,
        keyring: Option<&Keyring>,
    ) -> Result<(), StoreError> {
        let path = dir.join(MANIFEST_NAME);
        let bytes = self.encode(keyring).map_err(StoreError::Key)?;
        let tmp = dir.join(format!("{MANIFEST_NAME}.tmp"));
        storage
            .open(&tmp, OpenMode::CreateTruncate)
            .and_then(|mut file| {
                file.write_all_at(&bytes, 0)?;
                file.sync_data()
            })
            .map_err(|e| StoreError::io(&tmp, e))?;
        storage
            .rename(&tmp, &path)
            .map_err(|e| StoreError::io(&path, e))?;
        sync_dir(storage, dir)
    }

    /// Deletes files in `dir` the manifest does not name: temp files and
    /// checkpoint files a crash left before (or after) a manifest switch.
    pub(crate) fn remove_unreferenced(
        &self,
        storage: &dyn Storage,
        dir: &Path,
    ) -> Result<Vec<PathBuf>, StoreError> {
        let keep = self.files(dir);
        let mut removed = Vec::new();
        for name in storage.list_dir(dir).map_err(|e| StoreError::io(dir, e))? {
            let path = dir.join(&name);
            let ours = name.ends_with(".ckpt") || name.ends_with(".tmp");
            if ours && !keep.contains(&path) {
                storage
                    .remove_file(&path)
                    .map_err(|e| StoreError::io(&path, e))?;
                removed.push(path);
            }
        }
        if !removed.is_empty() {
            sync_dir(storage, dir)?;
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn round_trips_and_refuses_damage() {
        let tmp = tempfile::tempdir().unwrap();
        let disk = crate::storage::RealDisk;
        assert_eq!(
            Manifest::load(&disk, tmp.path(), None).unwrap(),
            (Manifest::fresh(), None)
        );
        let m = Manifest {
            checkpoint_lsn: 42,
            next_file_id: 9,
            base_file_id: Some(3),
            delta_file_ids: vec![5, 8],
            auth: None,
        };
        m.store(&disk, tmp.path(), None).unwrap();
        assert_eq!(Manifest::load(&disk, tmp.path(), None).unwrap(), (m, None));
        let path = tmp.path().join(MANIFEST_NAME);
        let mut bytes = fs::read(&path).unwrap();
        bytes[14] ^= 1;
        fs::write(&path, &bytes).unwrap();
        let err = Manifest::load(&disk, tmp.path(), None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("MANIFEST") && err.contains("checksum"),
            "{err}"
        );
    }

    /// An authenticated manifest round-trips, and any change to it with
    /// the CRC recomputed (what someone without the key can do) fails its
    /// tag; so does the right manifest under another key.
    #[test]
    fn an_authenticated_manifest_refuses_tampering_and_other_keys() {
        use crate::crypto::{Keyring, MasterKey};
        let tmp = tempfile::tempdir().unwrap();
        let disk = crate::storage::RealDisk;
        let key = Keyring::new(Some(MasterKey::from_bytes([3; 32])), 1);
        let m = Manifest {
            checkpoint_lsn: 42,
            next_file_id: 9,
            base_file_id: Some(3),
            delta_file_ids: vec![5, 8],
            auth: Some(ManifestAuth {
                dir_id: [9; DIR_ID_BYTES],
                chain: [4; MAC_BYTES],
                file_macs: [
                    (3, [1; MAC_BYTES]),
                    (5, [2; MAC_BYTES]),
                    (8, [3; MAC_BYTES]),
                ]
                .into_iter()
                .collect(),
            }),
        };
        assert!(m.store(&disk, tmp.path(), None).is_err(), "needs the key");
        m.store(&disk, tmp.path(), Some(&key)).unwrap();
        assert_eq!(
            Manifest::load(&disk, tmp.path(), Some(&key)).unwrap(),
            (m.clone(), None)
        );
        let other = Keyring::new(Some(MasterKey::from_bytes([4; 32])), 1);
        let (_, bad) = Manifest::load(&disk, tmp.path(), Some(&other)).unwrap();
        assert_eq!(bad.as_deref(), Some(TAG_MISMATCH));
        let path = tmp.path().join(MANIFEST_NAME);
        let good = fs::read(&path).unwrap();
        for at in [12, 20, 40, 60, 100, good.len() - 10] {
            let mut bytes = good.clone();
            bytes[at] ^= 1;
            let body = bytes.len() - 4;
            let crc = crc32c::crc32c(&bytes[..body]);
            bytes[body..].copy_from_slice(&crc.to_le_bytes());
            fs::write(&path, &bytes).unwrap();
            let (_, bad) = Manifest::load(&disk, tmp.path(), Some(&key)).unwrap();
            assert!(bad.is_some(), "a change at byte {at} passed");
        }
    }
}
