//! The manifest: which checkpoint files are current, and up to which LSN
//! they reach. Replaced only by the classic safe sequence: write a temp
//! file, fsync it, rename it over the old one, fsync the directory.
//!
//! ```text
//! 0  8  magic "CUBEMANI"
//! 8  4  version = 1
//! 12 8  checkpoint_lsn  every record up to here is in base + deltas
//! 20 8  next_file_id    the id the next checkpoint file gets
//! 28 8  base_file_id    0 = no base yet
//! 36 4  delta_count     at most MAX_DELTAS
//! 40 8n delta_file_id   oldest first
//! .. 4  crc             CRC32C of every byte before it
//! ```

use std::path::{Path, PathBuf};

use byteorder::{ByteOrder, LittleEndian};

use crate::data_dir::sync_dir;
use crate::error::StoreError;
use crate::storage::{OpenMode, Storage};

const MAGIC: &[u8; 8] = b"CUBEMANI";
const VERSION: u32 = 1;
pub(crate) const MANIFEST_NAME: &str = "MANIFEST";
/// Deltas beyond this force a compaction, whatever their size.
pub(crate) const MAX_DELTAS: usize = 64;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Manifest {
    pub checkpoint_lsn: u64,
    pub next_file_id: u64,
    pub base_file_id: Option<u64>,
    pub delta_file_ids: Vec<u64>,
}

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
        }
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

    fn encode(&self) -> Vec<u8> {
        assert!(
            self.delta_file_ids.len() <= MAX_DELTAS,
            "deltas are compacted before the cap"
        );
        let mut out = Vec::with_capacity(44 + 8 * self.delta_file_ids.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&self.checkpoint_lsn.to_le_bytes());
        out.extend_from_slice(&self.next_file_id.to_le_bytes());
        out.extend_from_slice(&self.base_file_id.unwrap_or(0).to_le_bytes());
        out.extend_from_slice(&(self.delta_file_ids.len() as u32).to_le_bytes());
        for id in &self.delta_file_ids {
            out.extend_from_slice(&id.to_le_bytes());
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
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
        if version != VERSION {
            return Err((8, format!("manifest version {version} is not supported")));
        }
        let count = LittleEndian::read_u32(&bytes[36..40]) as usize;
        if count > MAX_DELTAS || body_len != 40 + 8 * count {
            return Err((
                36,
                format!(
                    "manifest lists {count} deltas but holds {} bytes",
                    bytes.len()
                ),
            ));
        }
        let base = LittleEndian::read_u64(&bytes[28..36]);
        Ok(Manifest {
            checkpoint_lsn: LittleEndian::read_u64(&bytes[12..20]),
            next_file_id: LittleEndian::read_u64(&bytes[20..28]),
            base_file_id: (base != 0).then_some(base),
            delta_file_ids: (0..count)
                .map(|i| LittleEndian::read_u64(&bytes[40 + 8 * i..48 + 8 * i]))
                .collect(),
        })
    }

    /// Reads the manifest in `dir`; a missing one means no checkpoint yet.
    pub(crate) fn load(storage: &dyn Storage, dir: &Path) -> Result<Manifest, StoreError> {
        let path = dir.join(MANIFEST_NAME);
        match storage.read_file(&path) {
            Ok(bytes) => {
                Manifest::decode(&bytes).map_err(|(offset, reason)| StoreError::Corruption {
                    path,
                    offset,
                    reason,
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Manifest::fresh()),
            Err(e) => Err(StoreError::io(&path, e)),
        }
    }

    /// Replaces the manifest durably (temp, fsync, rename, fsync dir).
    pub(crate) fn store(&self, storage: &dyn Storage, dir: &Path) -> Result<(), StoreError> {
        let tmp = dir.join(format!("{MANIFEST_NAME}.tmp"));
        storage
            .open(&tmp, OpenMode::CreateTruncate)
            .and_then(|mut file| {
                file.write_all_at(&self.encode(), 0)?;
                file.sync_data()
            })
            .map_err(|e| StoreError::io(&tmp, e))?;
        let path = dir.join(MANIFEST_NAME);
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
            Manifest::load(&disk, tmp.path()).unwrap(),
            Manifest::fresh()
        );
        let m = Manifest {
            checkpoint_lsn: 42,
            next_file_id: 9,
            base_file_id: Some(3),
            delta_file_ids: vec![5, 8],
        };
        m.store(&disk, tmp.path()).unwrap();
        assert_eq!(Manifest::load(&disk, tmp.path()).unwrap(), m);
        let path = tmp.path().join(MANIFEST_NAME);
        let mut bytes = fs::read(&path).unwrap();
        bytes[14] ^= 1;
        fs::write(&path, &bytes).unwrap();
        let err = Manifest::load(&disk, tmp.path()).unwrap_err().to_string();
        assert!(
            err.contains("MANIFEST") && err.contains("checksum"),
            "{err}"
        );
    }
}
