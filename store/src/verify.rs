//! `cubed --verify DIR`: an offline check of every checksum in a data dir.
//!
//! Unlike recovery, which stops at the first problem, verification reads
//! every file to the end (or to its first problem) and reports them all,
//! and it never changes anything: recovery's repairs (zeroing a torn tail,
//! removing leftovers) run against a [`DryRunDisk`] that discards them.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::checkpoint::file::{CheckpointReader, ReadAuth};
use crate::checkpoint::manifest::{MANIFEST_NAME, Manifest, RunRef};
use crate::checkpoint::{CheckpointConfig, CheckpointStore};
use crate::crypto::{Keyring, MAC_BYTES};
use crate::data_dir::lock_data_dir;
use crate::error::StoreError;
use crate::memstore::MemStore;
use crate::mutation::Mutation;
use crate::run_file::format::{Footer, Mode};
use crate::run_file::{BlockCache, FOOTER_BYTES, Protection, RunFileReader};
use crate::storage::{OpenMode, RealDisk, Storage, StorageFile};
use crate::wal::chain::ChainState;
use crate::wal::recovery::{
    ChainAnchor, ChainCheck, RecoveryOptions, RecoveryReport, ReplayStop, SegmentEnd,
    is_torn_creation, replay_segment,
};
use crate::wal::{SealingRule, list_segments, recover_with};

/// One problem, where it is and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub path: PathBuf,
    pub offset: u64,
    pub reason: String,
}

#[derive(Clone, Debug, Default)]
pub struct VerifyReport {
    pub checkpoint_files: usize,
    pub checkpoint_entries: u64,
    /// Run files (a namespace's cells) checked, and their entries
    /// (tombstones included).
    pub run_files: usize,
    pub run_entries: u64,
    pub checkpoint_lsn: u64,
    pub wal_segments: usize,
    pub wal_records: u64,
    /// Cells the data dir recovers to (only when there are no problems).
    pub cells: Option<u64>,
    /// Things recovery would fix by itself (a torn tail), not problems.
    pub notes: Vec<String>,
    pub problems: Vec<Problem>,
}

impl VerifyReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

fn problem(e: StoreError) -> Problem {
    match e {
        StoreError::Corruption {
            path,
            offset,
            reason,
        } => Problem {
            path,
            offset,
            reason,
        },
        StoreError::Io { path, source } => Problem {
            path,
            offset: 0,
            reason: source.to_string(),
        },
        other => Problem {
            path: PathBuf::new(),
            offset: 0,
            reason: other.to_string(),
        },
    }
}

/// Checks `root` offline. Errors only when the check cannot run at all
/// (missing directory, or a daemon holds the lock).
pub fn verify_data_dir(root: &Path) -> Result<VerifyReport, StoreError> {
    verify_data_dir_with_key(root, None)
}

/// [`verify_data_dir`], opening encrypted namespaces' sealed records and
/// blocks with `keyring`. Without a key they are checksummed, not opened,
/// and a note says so.
pub fn verify_data_dir_with_key(
    root: &Path,
    keyring: Option<Arc<Keyring>>,
) -> Result<VerifyReport, StoreError> {
    if !root.is_dir() {
        return Err(StoreError::io(
            root,
            io::Error::new(io::ErrorKind::NotFound, "no such data directory"),
        ));
    }
    let _lock = lock_data_dir(root)?;
    let mut report = VerifyReport::default();
    let checkpoint_dir = root.join("checkpoint");
    let wal_dir = root.join("wal");

    let (manifest, manifest_tag_ok) =
        load_manifest(&mut report, &checkpoint_dir, keyring.as_deref());
    let has_key = keyring.as_ref().is_some_and(|k| k.has_key());
    if let Some(auth) = &manifest.auth
        && !has_key
    {
        report.notes.push(format!(
            "the data dir is authenticated (id {}); without --key-file its MACs were not checked",
            hex(&auth.dir_id)
        ));
    }
    report.checkpoint_lsn = manifest.checkpoint_lsn;
    verify_checkpoint_files(&mut report, &manifest, &checkpoint_dir, keyring.as_deref());
    verify_run_files(&mut report, &manifest, &checkpoint_dir, keyring.as_ref());
    let key_confirmed = has_key && manifest_tag_ok;
    verify_wal(
        &mut report,
        &wal_dir,
        &manifest,
        keyring.as_deref(),
        key_confirmed,
    )?;

    if report.is_clean() {
        match count_cells(root, keyring) {
            Ok(cells) => report.cells = Some(cells),
            Err(StoreError::Key(reason)) => report.notes.push(reason),
            // What only the whole state shows: a record that contradicts
            // a namespace of the checkpoint, say.
            Err(e @ StoreError::Corruption { .. }) => report.problems.push(problem(e)),
            Err(e) => return Err(e),
        }
    }
    Ok(report)
}

/// The manifest in `checkpoint_dir` (a fresh one if there is none or it
/// cannot be read), and whether its tag verified; a manifest that cannot
/// be read, or whose tag fails, is a problem.
fn load_manifest(
    report: &mut VerifyReport,
    checkpoint_dir: &Path,
    keyring: Option<&Keyring>,
) -> (Manifest, bool) {
    if !checkpoint_dir.is_dir() {
        return (Manifest::fresh(), true);
    }
    match Manifest::load(&RealDisk, checkpoint_dir, keyring) {
        Ok((m, bad_tag)) => {
            let tag_ok = bad_tag.is_none();
            if let Some(reason) = bad_tag {
                report.problems.push(Problem {
                    path: checkpoint_dir.join(MANIFEST_NAME),
                    offset: 0,
                    reason,
                });
            }
            (m, tag_ok)
        }
        Err(e) => {
            report.problems.push(problem(e));
            (Manifest::fresh(), true)
        }
    }
}

/// Reads every checkpoint file the manifest names to its end (or its
/// first problem), counting its entries.
fn verify_checkpoint_files(
    report: &mut VerifyReport,
    manifest: &Manifest,
    checkpoint_dir: &Path,
    keyring: Option<&Keyring>,
) {
    for (id, path) in manifest
        .file_ids()
        .into_iter()
        .zip(manifest.files(checkpoint_dir))
    {
        report.checkpoint_files += 1;
        let auth = manifest.auth.as_ref().map(|auth| ReadAuth {
            keyring,
            dir_id: auth.dir_id,
            mac: manifest.file_mac(id).unwrap_or([0; MAC_BYTES]),
        });
        let result =
            CheckpointReader::open(&RealDisk, &path, keyring, auth).and_then(|mut reader| {
                let mut n = 0u64;
                while reader.next_entry()?.is_some() {
                    n += 1;
                }
                Ok(n)
            });
        match result {
            Ok(n) => report.checkpoint_entries += n,
            Err(StoreError::Key(reason)) => report.notes.push(reason),
            Err(e) => report.problems.push(problem(e)),
        }
    }
}

/// Checks every run file the manifest names, namespace by namespace
/// ([`verify_run`]).
fn verify_run_files(
    report: &mut VerifyReport,
    manifest: &Manifest,
    checkpoint_dir: &Path,
    keyring: Option<&Arc<Keyring>>,
) {
    let dir_id = manifest.auth.as_ref().map(|auth| auth.dir_id);
    for entry in &manifest.namespaces {
        for run in &entry.runs {
            let path = checkpoint_dir.join(crate::checkpoint::manifest::run_file_name(run.file_id));
            verify_run(report, &path, entry.ns_id, run, dir_id, keyring);
        }
    }
}

/// Checks the log's segments in order, then that the oldest goes on from
/// the checkpoint; errors only when the segments cannot be listed.
fn verify_wal(
    report: &mut VerifyReport,
    wal_dir: &Path,
    manifest: &Manifest,
    keyring: Option<&Keyring>,
    key_confirmed: bool,
) -> Result<(), StoreError> {
    let segments = if wal_dir.is_dir() {
        list_segments(&RealDisk, wal_dir, false)?
    } else {
        Vec::new()
    };
    report.wal_segments = segments.len();
    let anchor = match &manifest.auth {
        Some(auth) => ChainAnchor {
            at: Some((
                manifest.checkpoint_lsn,
                ChainState {
                    dir_id: auth.dir_id,
                    prev: auth.chain,
                },
            )),
            key_confirmed,
        },
        None => ChainAnchor::default(),
    };
    let mut walk = SegmentWalk {
        keyring,
        expected: None,
        rule: SealingRule::default(),
        chain: ChainCheck::new(keyring, anchor),
    };
    for (i, (first_lsn, path)) in segments.iter().enumerate() {
        walk.segment(report, *first_lsn, path, i + 1 == segments.len());
    }
    if let Some(reason) = walk.chain.suspect_key.take() {
        report.problems.push(Problem {
            path: wal_dir.to_path_buf(),
            offset: 0,
            reason,
        });
    }
    if let Some((first, path)) = segments.first()
        && *first > manifest.checkpoint_lsn + 1
    {
        report.problems.push(Problem {
            path: path.clone(),
            offset: 0,
            reason: format!(
                "LSN gap: the checkpoint reaches LSN {}, the oldest segment starts at {first}",
                manifest.checkpoint_lsn
            ),
        });
    }
    Ok(())
}

/// The log's segments checked one after another, each against where the
/// one before it ended.
struct SegmentWalk<'k> {
    keyring: Option<&'k Keyring>,
    /// The LSN the next segment must start at; `None` when the one before
    /// could not be read to its end.
    expected: Option<u64>,
    /// Judges the namespaces the log creates; those of the checkpoint are
    /// judged when the cells are counted (`count_cells`).
    rule: SealingRule,
    chain: ChainCheck<'k>,
}

impl SegmentWalk<'_> {
    /// Reads one segment and checks it, unless it is the last and a crash
    /// cut its creation (a note: recovery removes it).
    fn segment(&mut self, report: &mut VerifyReport, first_lsn: u64, path: &Path, is_last: bool) {
        let bytes = match RealDisk.read_file(path) {
            Ok(b) => b,
            Err(e) => {
                report.problems.push(problem(StoreError::io(path, e)));
                self.expected = None;
                return;
            }
        };
        if is_last && is_torn_creation(&bytes) {
            report.notes.push(format!(
                "{}: a segment whose creation a crash cut before its header was written (recovery removes it)",
                path.display()
            ));
            return;
        }
        self.replay(report, &bytes, first_lsn, path, is_last);
    }

    /// Replays a segment's records without applying them, counting them:
    /// a torn tail is a note, damage a problem.
    fn replay(
        &mut self,
        report: &mut VerifyReport,
        bytes: &[u8],
        first_lsn: u64,
        path: &Path,
        is_last: bool,
    ) {
        let mut counts = RecoveryReport::starting_at(0);
        match replay_segment(
            bytes,
            first_lsn,
            self.expected,
            is_last,
            0,
            self.keyring,
            Some(&mut self.rule),
            &mut self.chain,
            &mut |_, _| {},
            &mut counts,
        ) {
            Ok(SegmentEnd::Clean { next_lsn, .. }) => self.expected = Some(next_lsn),
            Ok(SegmentEnd::TornAt { offset, next_lsn }) => {
                report.notes.push(format!(
                    "{}: torn tail at offset {offset} (an unacknowledged write cut by a crash; recovery drops it)",
                    path.display()
                ));
                self.expected = Some(next_lsn);
            }
            Err(ReplayStop::Damage(offset, reason, _)) => {
                report.problems.push(Problem {
                    path: path.to_path_buf(),
                    offset,
                    reason,
                });
                self.expected = None;
            }
            Err(ReplayStop::Key(reason)) => {
                report.notes.push(format!(
                    "{}: {reason}; its checksums were checked, its sealed records were not opened",
                    path.display()
                ));
                self.expected = None;
            }
        }
        report.wal_records += counts.records_replayed;
    }
}

/// Checks every block of a run file the manifest lists, and that it is
/// the file the manifest lists (id, namespace, MAC).
fn verify_run(
    report: &mut VerifyReport,
    path: &Path,
    ns_id: u64,
    run: &RunRef,
    dir_id: Option<[u8; crate::crypto::DIR_ID_BYTES]>,
    keyring: Option<&Arc<Keyring>>,
) {
    report.run_files += 1;
    let mode = match run_mode(path) {
        Ok(mode) => mode,
        Err(p) => return report.problems.push(p),
    };
    let keyring = keyring.filter(|k| k.has_key()).cloned();
    let protection = match (mode, dir_id, keyring) {
        (Mode::Plain, None, _) => Protection::Plain,
        (_, Some(_), None) => {
            return report.notes.push(format!(
                "{}: a run file of an authenticated data dir; without --key-file its blocks \
                 were not checked",
                path.display()
            ));
        }
        (Mode::Authenticated, Some(dir_id), Some(keyring)) => {
            Protection::Authenticated { keyring, dir_id }
        }
        (Mode::Sealed, Some(dir_id), Some(keyring)) => Protection::Sealed { keyring, dir_id },
        (found, _, _) => {
            return report.problems.push(Problem {
                path: path.to_path_buf(),
                offset: 0,
                reason: format!(
                    "a {found:?} run file named by a manifest that is {}authenticated",
                    if dir_id.is_some() { "" } else { "not " }
                ),
            });
        }
    };
    let cache = Arc::new(BlockCache::new(1024 * 1024));
    let opened = RunFileReader::open(path, &protection, cache).and_then(|reader| {
        reader.expect(run.file_id, ns_id, dir_id.map(|_| &run.mac))?;
        Ok(reader)
    });
    match opened {
        Ok(reader) => {
            let problems = reader.verify();
            if problems.is_empty() {
                report.run_entries += reader.entry_count();
            }
            report
                .problems
                .extend(problems.into_iter().map(|e| problem(e.into())));
        }
        Err(e) => match StoreError::from(e) {
            StoreError::Key(reason) => report.notes.push(reason),
            e => report.problems.push(problem(e)),
        },
    }
}

/// The protection a run file's footer says it has.
fn run_mode(path: &Path) -> Result<Mode, Problem> {
    let failed = |offset: u64, reason: String| Problem {
        path: path.to_path_buf(),
        offset,
        reason,
    };
    let file = RealDisk
        .open(path, OpenMode::ReadOnly)
        .map_err(|e| failed(0, e.to_string()))?;
    let len = file.len().map_err(|e| failed(0, e.to_string()))?;
    let at = len.saturating_sub(FOOTER_BYTES as u64);
    let mut footer = vec![0u8; (len - at) as usize];
    file.read_exact_at(&mut footer, at)
        .map_err(|e| failed(at, e.to_string()))?;
    Footer::decode(&footer, len)
        .map(|footer| footer.mode)
        .map_err(|reason| failed(at, reason))
}

/// Loads the whole data dir into memory exactly as a start would, without
/// changing a byte, and counts the cells.
fn count_cells(root: &Path, keyring: Option<Arc<Keyring>>) -> Result<u64, StoreError> {
    let dry: Arc<dyn Storage> = Arc::new(DryRunDisk);
    let mem = MemStore::new();
    let mut existed = Vec::new();
    let mut checkpoints = CheckpointStore::open(
        Arc::clone(&dry),
        &root.join("checkpoint"),
        &root.join("wal"),
        CheckpointConfig::default(),
        keyring.clone(),
    )?;
    checkpoints.load(
        |m| mem.apply_group(&[&m], 0, &mut existed),
        |ns, cells| {
            mem.load_sorted_cells(ns, cells);
        },
    )?;
    checkpoints.load_runs(&mem)?;
    let apply = |lsn: u64, m: Mutation| mem.apply_group(&[&m], lsn, &mut Vec::new());
    // As a start does: the log is judged against the checkpoint's namespaces.
    let mut rule = SealingRule::new(mem.namespace_list());
    recover_with(
        dry.as_ref(),
        &root.join("wal"),
        checkpoints.checkpoint_lsn(),
        &RecoveryOptions::default(),
        keyring.as_deref(),
        &mut rule,
        checkpoints.chain_anchor(),
        apply,
    )?;
    Ok(mem.cell_count())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The real disk for reads; every change is accepted and discarded.
#[derive(Debug)]
pub struct DryRunDisk;

#[derive(Debug)]
struct DryRunFile(Box<dyn StorageFile>);

impl StorageFile for DryRunFile {
    fn write_all_at(&mut self, _bytes: &[u8], _offset: u64) -> io::Result<()> {
        Ok(())
    }
    fn read_exact_at(&self, bytes: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.read_exact_at(bytes, offset)
    }
    fn sync_data(&mut self) -> io::Result<()> {
        Ok(())
    }
    fn set_len(&mut self, _len: u64) -> io::Result<()> {
        Ok(())
    }
    fn len(&self) -> io::Result<u64> {
        self.0.len()
    }
}

impl Storage for DryRunDisk {
    fn open(&self, path: &Path, _mode: OpenMode) -> io::Result<Box<dyn StorageFile>> {
        Ok(Box::new(DryRunFile(
            RealDisk.open(path, OpenMode::ReadOnly)?,
        )))
    }
    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>> {
        RealDisk.read_file(path)
    }
    fn file_len(&self, path: &Path) -> io::Result<u64> {
        RealDisk.file_len(path)
    }
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        RealDisk.list_dir(dir)
    }
    fn create_dir_all(&self, _dir: &Path) -> io::Result<()> {
        Ok(())
    }
    fn rename(&self, _from: &Path, _to: &Path) -> io::Result<()> {
        Ok(())
    }
    fn remove_file(&self, _path: &Path) -> io::Result<()> {
        Ok(())
    }
    fn sync_dir(&self, _dir: &Path) -> io::Result<()> {
        Ok(())
    }
}
