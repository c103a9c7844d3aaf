//! The manifest: which checkpoint files and run files are current, and up
//! to which LSN they reach. Replaced only by the classic safe sequence:
//! write a temp file, fsync it, rename it over the old one, fsync the
//! directory.
//!
//! Version 3 (written since cells moved to run files, issue 32):
//! ```text
//! 0  8  magic "CUBEMANI"
//! 8  4  version = 3
//! 12 4  flags           bit 0: authenticated (a data dir with a master key);
//!                       every other bit zero
//! 16 8  checkpoint_lsn  every record up to here is in the files below
//! 24 8  next_file_id    the id the next checkpoint or run file gets
//! 32 8  base_file_id    0 = no base yet
//! 40 4  delta_count     at most MAX_DELTAS
//! 44 4  namespace_count namespaces with cells on disk
//! 48 8n delta_file_id   oldest first
//! per namespace, ns_id strictly increasing:
//!    8  ns_id
//!    8  live_cells      cells with a value, over all its runs
//!    8  value_bytes     bytes of those cells' values
//!    4  run_count       1..=MAX_RUNS
//!    40 per run, newest first: file_id u64 | mac (32): the run's footer
//!                       MAC, zeros for a plain run (no master key)
//! authenticated only:
//! .. 16 dir_id          random, drawn when the data dir was first authenticated
//! .. 32 chain           the log's chain value at checkpoint_lsn (wal/chain.rs)
//! .. 32 file_mac        per checkpoint file, base first, then deltas oldest
//!                       first: HMAC of the file's every byte (file.rs)
//! .. 32 tag             HMAC-SHA256 under the integrity key of
//!                       "cube manifest v3" || every byte before it
//! .. 4  crc             CRC32C of every byte before it
//! ```
//! A version-3 manifest's checkpoint files hold no cells: they are in the
//! run files, `run-<file_id>.run`, one namespace each.
//!
//! Versions 1 and 2 (read, never written; their checkpoint files hold the
//! cells, `legacy_cells`, until the next fold or compaction moves them to
//! run files):
//! ```text
//! 0  8  magic "CUBEMANI"
//! 8  4  version = 1 (no master key) or 2 (authenticated)
//! 12 8  checkpoint_lsn  every record up to here is in base + deltas
//! 20 8  next_file_id    the id the next checkpoint file gets
//! 28 8  base_file_id    0 = no base yet
//! 36 4  delta_count     at most MAX_DELTAS
//! 40 8n delta_file_id   oldest first
//! version 2 only:
//! .. 16 dir_id, 32 chain, 32 file_mac per listed file (as in version 3)
//! .. 32 tag             HMAC-SHA256 under the integrity key of
//!                       "cube manifest v2" || every byte before it
//! both:
//! .. 4  crc             CRC32C of every byte before it
//! ```
//! The CRC tells damage from tampering; the tag, which someone without the
//! key cannot compute, binds the list of files, each file's contents (a
//! run's through its footer MAC, which covers its index and so every
//! block's checksum), the checkpoint LSN and the chain value to this data
//! dir.

use std::path::{Path, PathBuf};

use byteorder::{ByteOrder, LittleEndian};

use crate::crypto::{DIR_ID_BYTES, Keyring, MAC_BYTES, tags_equal};
use crate::data_dir::sync_dir;
use crate::error::StoreError;
use crate::storage::{OpenMode, Storage};

const MAGIC: &[u8; 8] = b"CUBEMANI";
const VERSION: u32 = 1;
const VERSION_AUTHENTICATED: u32 = 2;
/// The version written (runs per namespace; see the module doc).
const VERSION_RUNS: u32 = 3;
const FLAG_AUTHENTICATED: u32 = 1;
const TAG_LABEL: &[u8] = b"cube manifest v2";
const TAG_LABEL_V3: &[u8] = b"cube manifest v3";
/// A namespace entry's fixed part, and each run's.
const NAMESPACE_ENTRY_BYTES: usize = 28;
const RUN_ENTRY_BYTES: usize = 8 + MAC_BYTES;
pub(crate) const MANIFEST_NAME: &str = "MANIFEST";
/// Deltas beyond this force a compaction, whatever their size.
pub(crate) const MAX_DELTAS: usize = 64;
/// Runs of one namespace beyond this are refused by the decoder; the
/// checkpointer merges them long before (`runs::MAX_UNMERGED_RUNS`; a
/// fold waits at `runs::FOLD_WAITS_AT_RUNS`).
pub(crate) const MAX_RUNS: usize = 64;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Manifest {
    pub checkpoint_lsn: u64,
    pub next_file_id: u64,
    pub base_file_id: Option<u64>,
    pub delta_file_ids: Vec<u64>,
    /// Set in a data dir with a master key (format version 2 or 3).
    pub auth: Option<ManifestAuth>,
    /// The namespaces with cells in run files, by increasing `ns_id`.
    pub namespaces: Vec<NamespaceRuns>,
    /// Read from a version 1 or 2 manifest that names files: the
    /// checkpoint files hold cells (and no run file does). Never stored:
    /// the next fold or compaction writes them as runs first.
    pub legacy_cells: bool,
}

/// One namespace's cells on disk.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct NamespaceRuns {
    pub ns_id: u64,
    /// Cells with a value over all its runs (the newest entry per key).
    pub live_cells: u64,
    /// Bytes of those cells' values.
    pub value_bytes: u64,
    /// Newest first; never empty.
    pub runs: Vec<RunRef>,
}

/// A run file as the manifest names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RunRef {
    pub file_id: u64,
    /// The run's footer MAC (`RunFileReader::mac`), zeros for a plain run.
    pub mac: [u8; MAC_BYTES],
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

pub(crate) fn run_file_name(id: u64) -> String {
    format!("run-{id:020}.run")
}

impl Manifest {
    pub(crate) fn fresh() -> Manifest {
        Manifest {
            checkpoint_lsn: 0,
            next_file_id: 1,
            base_file_id: None,
            delta_file_ids: Vec::new(),
            auth: None,
            namespaces: Vec::new(),
            legacy_cells: false,
        }
    }

    /// The run files the manifest names, namespace by namespace.
    pub(crate) fn run_files(&self, dir: &Path) -> Vec<PathBuf> {
        self.namespaces
            .iter()
            .flat_map(|ns| &ns.runs)
            .map(|run| dir.join(run_file_name(run.file_id)))
            .collect()
    }

    /// Every file the manifest names: checkpoint files, then run files.
    pub(crate) fn all_files(&self, dir: &Path) -> Vec<PathBuf> {
        let mut files = self.files(dir);
        files.extend(self.run_files(dir));
        files
    }

    /// The entry of namespace `ns_id`, if it has cells on disk.
    pub(crate) fn namespace(&self, ns_id: u64) -> Option<&NamespaceRuns> {
        self.namespaces.iter().find(|ns| ns.ns_id == ns_id)
    }

    /// Sets (or, with no runs, removes) namespace `entry.ns_id`'s entry.
    pub(crate) fn set_namespace(&mut self, entry: NamespaceRuns) {
        let at = self.namespaces.partition_point(|ns| ns.ns_id < entry.ns_id);
        let exists = self
            .namespaces
            .get(at)
            .is_some_and(|ns| ns.ns_id == entry.ns_id);
        match (exists, entry.runs.is_empty()) {
            (true, true) => {
                self.namespaces.remove(at);
            }
            (true, false) => self.namespaces[at] = entry,
            (false, true) => {}
            (false, false) => self.namespaces.insert(at, entry),
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

    /// The checkpoint files the manifest names, base first, then deltas
    /// oldest first (run files: [`Manifest::run_files`]).
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

    /// The bytes of the manifest (always version 3); an authenticated one
    /// needs `keyring`.
    fn encode(&self, keyring: Option<&Keyring>) -> Result<Vec<u8>, String> {
        assert!(
            self.delta_file_ids.len() <= MAX_DELTAS,
            "deltas are compacted before the cap"
        );
        if self.legacy_cells {
            return Err(
                "a manifest whose checkpoint files hold cells is never stored: \
                 they are moved to run files first"
                    .into(),
            );
        }
        let flags = if self.auth.is_some() {
            FLAG_AUTHENTICATED
        } else {
            0
        };
        let mut out = Vec::with_capacity(52 + 8 * self.delta_file_ids.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION_RUNS.to_le_bytes());
        out.extend_from_slice(&flags.to_le_bytes());
        out.extend_from_slice(&self.checkpoint_lsn.to_le_bytes());
        out.extend_from_slice(&self.next_file_id.to_le_bytes());
        out.extend_from_slice(&self.base_file_id.unwrap_or(0).to_le_bytes());
        out.extend_from_slice(&(self.delta_file_ids.len() as u32).to_le_bytes());
        out.extend_from_slice(&(self.namespaces.len() as u32).to_le_bytes());
        for id in &self.delta_file_ids {
            out.extend_from_slice(&id.to_le_bytes());
        }
        let mut last_ns = None;
        for ns in &self.namespaces {
            assert!(
                last_ns.is_none_or(|last| last < ns.ns_id),
                "namespace entries are kept sorted"
            );
            assert!(
                (1..=MAX_RUNS).contains(&ns.runs.len()),
                "runs are merged before the cap, and a namespace without runs has no entry"
            );
            last_ns = Some(ns.ns_id);
            out.extend_from_slice(&ns.ns_id.to_le_bytes());
            out.extend_from_slice(&ns.live_cells.to_le_bytes());
            out.extend_from_slice(&ns.value_bytes.to_le_bytes());
            out.extend_from_slice(&(ns.runs.len() as u32).to_le_bytes());
            for run in &ns.runs {
                out.extend_from_slice(&run.file_id.to_le_bytes());
                out.extend_from_slice(&run.mac);
            }
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
            let tag = keyring
                .mac(TAG_LABEL_V3, &[&out])
                .map_err(|e| e.to_string())?;
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
        match LittleEndian::read_u32(&bytes[8..12]) {
            VERSION | VERSION_AUTHENTICATED => Manifest::decode_v1_v2(bytes),
            VERSION_RUNS => Manifest::decode_v3(&bytes[..body_len]),
            version => Err((8, format!("manifest version {version} is not supported"))),
        }
    }

    /// A version-3 manifest, `body` without its CRC (already checked).
    fn decode_v3(body: &[u8]) -> Result<Manifest, (u64, String)> {
        let mut fields = Fields { body, at: 0 };
        fields.take(12, "header")?;
        let flags = fields.u32("flags")?;
        if flags & !FLAG_AUTHENTICATED != 0 {
            return Err((12, format!("unknown manifest flags {flags:#x}")));
        }
        let checkpoint_lsn = fields.u64("header")?;
        let next_file_id = fields.u64("header")?;
        let base = fields.u64("header")?;
        let delta_count = fields.u32("header")? as usize;
        let ns_count = fields.u32("header")? as usize;
        if delta_count > MAX_DELTAS {
            return Err((40, format!("manifest lists {delta_count} deltas")));
        }
        let mut manifest = Manifest {
            checkpoint_lsn,
            next_file_id,
            base_file_id: (base != 0).then_some(base),
            ..Manifest::fresh()
        };
        for _ in 0..delta_count {
            let id = fields.u64("delta list")?;
            manifest.delta_file_ids.push(id);
        }
        for _ in 0..ns_count {
            let entry = fields.namespace_runs(manifest.namespaces.last())?;
            manifest.namespaces.push(entry);
        }
        if flags & FLAG_AUTHENTICATED != 0 {
            manifest.auth = Some(fields.auth(&manifest.file_ids())?);
        }
        let end = fields.at;
        if end != body.len() {
            return Err((
                end as u64,
                format!("{} bytes after the manifest's last field", body.len() - end),
            ));
        }
        Ok(manifest)
    }

    /// A version 1 or 2 manifest (CRC already checked).
    fn decode_v1_v2(bytes: &[u8]) -> Result<Manifest, (u64, String)> {
        let body_len = bytes.len() - 4;
        let version = LittleEndian::read_u32(&bytes[8..12]);
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
            legacy_cells: files > 0,
            ..Manifest::fresh()
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
        if bytes.len() < 16 + MAC_BYTES + 4 {
            return None;
        }
        let label = match LittleEndian::read_u32(&bytes[8..12]) {
            VERSION_AUTHENTICATED => TAG_LABEL,
            VERSION_RUNS if LittleEndian::read_u32(&bytes[12..16]) & FLAG_AUTHENTICATED != 0 => {
                TAG_LABEL_V3
            }
            _ => return None,
        };
        let tag_at = bytes.len() - 4 - MAC_BYTES;
        let Ok(computed) = keyring.mac(label, &[&bytes[..tag_at]]) else {
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

    /// Deletes files in `dir` the manifest does not name: temp files,
    /// checkpoint and run files a crash left before (or after) a manifest
    /// switch, and the runs of a namespace dropped since.
    pub(crate) fn remove_unreferenced(
        &self,
        storage: &dyn Storage,
        dir: &Path,
    ) -> Result<Vec<PathBuf>, StoreError> {
        let keep = self.all_files(dir);
        let mut removed = Vec::new();
        for name in storage.list_dir(dir).map_err(|e| StoreError::io(dir, e))? {
            let path = dir.join(&name);
            let ours = name.ends_with(".ckpt") || name.ends_with(".run") || name.ends_with(".tmp");
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

/// A version-3 manifest's body read front to back, a field at a time.
struct Fields<'b> {
    body: &'b [u8],
    /// Where the next field starts.
    at: usize,
}

impl<'b> Fields<'b> {
    /// The next `n` bytes; `what` names them when the body ends first.
    fn take(&mut self, n: usize, what: &str) -> Result<&'b [u8], (u64, String)> {
        let from = self.at;
        let piece = self.body.get(from..from + n).ok_or_else(|| {
            (
                from as u64,
                format!(
                    "the manifest ends inside its {what} ({} bytes)",
                    self.body.len()
                ),
            )
        })?;
        self.at = from + n;
        Ok(piece)
    }

    /// The next field, a little-endian u32.
    fn u32(&mut self, what: &str) -> Result<u32, (u64, String)> {
        Ok(LittleEndian::read_u32(self.take(4, what)?))
    }

    /// The next field, a little-endian u64.
    fn u64(&mut self, what: &str) -> Result<u64, (u64, String)> {
        Ok(LittleEndian::read_u64(self.take(8, what)?))
    }

    /// A namespace's entry and its runs; its id must exceed that of the
    /// entry before it (`previous`).
    fn namespace_runs(
        &mut self,
        previous: Option<&NamespaceRuns>,
    ) -> Result<NamespaceRuns, (u64, String)> {
        let entry_at = self.at as u64;
        let fixed = self.take(NAMESPACE_ENTRY_BYTES, "namespace list")?;
        let ns_id = LittleEndian::read_u64(&fixed[0..8]);
        let run_count = LittleEndian::read_u32(&fixed[24..28]) as usize;
        if !(1..=MAX_RUNS).contains(&run_count) || previous.is_some_and(|ns| ns.ns_id >= ns_id) {
            return Err((
                entry_at,
                format!(
                    "namespace entry {ns_id} with {run_count} runs (1 to {MAX_RUNS}, \
                     namespaces in increasing id order)"
                ),
            ));
        }
        let mut entry = NamespaceRuns {
            ns_id,
            live_cells: LittleEndian::read_u64(&fixed[8..16]),
            value_bytes: LittleEndian::read_u64(&fixed[16..24]),
            runs: Vec::with_capacity(run_count),
        };
        for _ in 0..run_count {
            let run = self.take(RUN_ENTRY_BYTES, "run list")?;
            let mut mac = [0u8; MAC_BYTES];
            mac.copy_from_slice(&run[8..]);
            entry.runs.push(RunRef {
                file_id: LittleEndian::read_u64(&run[0..8]),
                mac,
            });
        }
        Ok(entry)
    }

    /// What an authenticated manifest adds: the data dir's id, the chain
    /// value and a MAC per checkpoint file (`file_ids`), then the tag
    /// (skipped: [`Manifest::check_tag`] checks it).
    fn auth(&mut self, file_ids: &[u64]) -> Result<ManifestAuth, (u64, String)> {
        let mut auth = ManifestAuth {
            dir_id: [0; DIR_ID_BYTES],
            chain: [0; MAC_BYTES],
            file_macs: Default::default(),
        };
        auth.dir_id
            .copy_from_slice(self.take(DIR_ID_BYTES, "data dir id")?);
        auth.chain
            .copy_from_slice(self.take(MAC_BYTES, "chain value")?);
        for &id in file_ids {
            let mut mac = [0u8; MAC_BYTES];
            mac.copy_from_slice(self.take(MAC_BYTES, "file MACs")?);
            auth.file_macs.insert(id, mac);
        }
        self.take(MAC_BYTES, "tag")?;
        Ok(auth)
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
            ..Manifest::fresh()
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

    fn entry(ns_id: u64, runs: &[u64]) -> NamespaceRuns {
        NamespaceRuns {
            ns_id,
            live_cells: 3,
            value_bytes: 30,
            runs: runs
                .iter()
                .map(|&file_id| RunRef {
                    file_id,
                    mac: [0; MAC_BYTES],
                })
                .collect(),
        }
    }

    /// Bytes with the CRC recomputed after `change`.
    fn with_crc(mut bytes: Vec<u8>, change: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        bytes.truncate(bytes.len() - 4);
        change(&mut bytes);
        let crc = crc32c::crc32c(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// Version 3 round-trips its namespaces' runs and counts, and its
    /// decoder accepts exactly one encoding: a namespace without runs,
    /// entries out of order, unknown flags or trailing bytes are refused
    /// (with the CRC right, as damage that a CRC misses would be). A
    /// manifest whose checkpoint files hold cells is never stored.
    #[test]
    fn version_3_round_trips_runs_and_refuses_other_encodings() {
        let m = Manifest {
            checkpoint_lsn: 42,
            next_file_id: 20,
            base_file_id: Some(3),
            delta_file_ids: vec![5],
            namespaces: vec![entry(1, &[9, 7]), entry(4, &[8])],
            ..Manifest::fresh()
        };
        let good = m.encode(None).unwrap();
        assert_eq!(LittleEndian::read_u32(&good[8..12]), VERSION_RUNS);
        assert_eq!(Manifest::decode(&good).unwrap(), m);
        let namespaces_at = 48 + 8;
        let second = namespaces_at + NAMESPACE_ENTRY_BYTES + 2 * RUN_ENTRY_BYTES;
        let bad = [
            with_crc(good.clone(), |b| b[12] = 2),
            with_crc(good.clone(), |b| b.push(0)),
            with_crc(good.clone(), |b| b.truncate(b.len() - 1)),
            // The second namespace's id below the first's.
            with_crc(good.clone(), |b| b[second] = 0),
            // No run: its count 0.
            with_crc(good.clone(), |b| {
                b[second + 24..second + 28].copy_from_slice(&0u32.to_le_bytes())
            }),
        ];
        for (i, bytes) in bad.iter().enumerate() {
            assert!(Manifest::decode(bytes).is_err(), "encoding {i} was taken");
        }
        // Every shorter body, CRC right: refused, never a panic.
        for len in 0..good.len() - 4 {
            let mut cut = good[..len].to_vec();
            let crc = crc32c::crc32c(&cut);
            cut.extend_from_slice(&crc.to_le_bytes());
            assert!(Manifest::decode(&cut).is_err(), "a body of {len} bytes");
        }
        let legacy = Manifest {
            legacy_cells: true,
            ..m
        };
        assert!(legacy.encode(None).is_err());
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
            namespaces: vec![NamespaceRuns {
                ns_id: 4,
                live_cells: 10,
                value_bytes: 99,
                runs: vec![
                    RunRef {
                        file_id: 11,
                        mac: [5; MAC_BYTES],
                    },
                    RunRef {
                        file_id: 10,
                        mac: [6; MAC_BYTES],
                    },
                ],
            }],
            legacy_cells: false,
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
            // Refused as malformed (a flag flipped: the auth fields no
            // longer fit) or by its tag.
            if let Ok((_, bad)) = Manifest::load(&disk, tmp.path(), Some(&key)) {
                assert!(bad.is_some(), "a change at byte {at} passed");
            }
        }
    }
}
