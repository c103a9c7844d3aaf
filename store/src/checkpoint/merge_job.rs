//! A merge job: the runs of the namespaces picked for a merge, open as
//! immutable readers, streamed into one new run per namespace (written and
//! fsynced). The job reads and writes nothing else: it lists nothing in the
//! manifest and removes no file, so it can run on its own thread while the
//! checkpointer keeps folding; the checkpointer installs what it wrote
//! (`CheckpointStore::install_merge`, one manifest switch).
//!
//! In the daemon the jobs run on the merge threads
//! (`super::merge_worker::MergeWorker`,
//! one job at a time each); offline and in the model tests, which drive
//! `CheckpointStore` without threads, the checkpointer runs the same
//! [`run_merge_job`] inline.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crossbeam_channel::{Receiver, Sender};

use super::CrashPoint;
use super::manifest::{NamespaceRuns, run_file_name};
use super::runs::{MergeScope, OpenRuns};
use crate::data_dir::sync_dir;
use crate::error::StoreError;
use crate::run_file::{Merge, Protection, RunFileWriter, RunSummary};
use crate::storage::Storage;

/// Entries written between two looks at the stop flag: a cancelled merge
/// of gigabytes ends within milliseconds.
const STOP_CHECK_ENTRIES: u64 = 4096;

/// Test hook: holds a merge job after its first entry until released, so
/// that a test can fold while a merge is in flight (waiting on events, not
/// the clock). The job sends on `reached`, then waits on `release` (a
/// dropped sender releases it too).
#[doc(hidden)]
#[derive(Clone, Debug)]
pub struct MergeHold {
    pub reached: Sender<()>,
    pub release: Receiver<()>,
}

/// One namespace of a merge job.
pub(super) struct NamespaceMerge {
    /// The namespace's entry when it was picked: the runs read, and the
    /// counts a merge of all of them must find.
    pub(super) entry: NamespaceRuns,
    pub(super) scope: MergeScope,
    /// `entry`'s runs, open (newest first).
    pub(super) runs: OpenRuns,
    /// The new run's file id (reserved in the manifest when picked).
    pub(super) file_id: u64,
    pub(super) protection: Protection,
}

/// What a merge rewrites, ready to run on any thread.
pub(super) struct MergeJob {
    pub(super) storage: Arc<dyn Storage>,
    /// The checkpoint directory.
    pub(super) dir: PathBuf,
    pub(super) parts: Vec<NamespaceMerge>,
    pub(super) crash_at: Option<CrashPoint>,
    pub(super) hold: Option<MergeHold>,
    /// Set to cancel the job (shutdown, a compaction, a namespace dropped).
    pub(super) stop: Arc<AtomicBool>,
}

/// One namespace's new run, written and fsynced, not yet listed.
pub(super) struct MergedNamespace {
    /// The entry as picked (its runs are the ones merged).
    pub(super) entry: NamespaceRuns,
    pub(super) scope: MergeScope,
    pub(super) file_id: u64,
    pub(super) summary: RunSummary,
}

/// How a merge job ended without output to install.
pub(super) enum MergeFailure {
    /// Stopped on request; its files (`output_ids`) are to be discarded.
    Cancelled { output_ids: Vec<u64> },
    /// Failed: reported as a failed checkpoint (a simulated crash leaves
    /// its files as a real crash would; the next start removes them).
    Failed(StoreError),
}

impl MergeJob {
    /// The new run files' ids (written or not yet).
    pub(super) fn output_ids(&self) -> Vec<u64> {
        self.parts.iter().map(|p| p.file_id).collect()
    }
}

/// Runs `job`: each namespace's runs merged into its new run file (synced,
/// renamed into place, directory synced), none of them listed yet.
pub(super) fn run_merge_job(job: MergeJob) -> Result<Vec<MergedNamespace>, MergeFailure> {
    let output_ids = job.output_ids();
    let mut merged = Vec::with_capacity(job.parts.len());
    let mut hold = job.hold.clone();
    for part in &job.parts {
        match merge_namespace(&job, part, &mut hold) {
            Ok(Some(summary)) => merged.push(MergedNamespace {
                entry: part.entry.clone(),
                scope: part.scope,
                file_id: part.file_id,
                summary,
            }),
            Ok(None) => return Err(MergeFailure::Cancelled { output_ids }),
            Err(e) => return Err(MergeFailure::Failed(e)),
        }
    }
    Ok(merged)
}

/// Writes `part`'s runs (the window of its scope) merged into its new
/// run; `None` when the job was cancelled meanwhile.
fn merge_namespace(
    job: &MergeJob,
    part: &NamespaceMerge,
    hold: &mut Option<MergeHold>,
) -> Result<Option<RunSummary>, StoreError> {
    let entry = &part.entry;
    let path = job.dir.join(run_file_name(part.file_id));
    // The filter is sized for every entry of the runs merged (the runs
    // opened are the window's).
    let merged = &part.runs.readers[..];
    let run_count = entry.runs.len();
    let mut writer = RunFileWriter::create(
        job.storage.as_ref(),
        &path,
        part.file_id,
        entry.ns_id,
        &part.protection,
        merged.iter().map(|r| r.entry_count()).sum(),
    )?;
    let mut value_bytes = 0u64;
    // Short of the oldest run, tombstones stay, for what older runs hold.
    let drop_tombstones = part.scope.reaches_oldest(run_count);
    let mut written = 0u64;
    for item in Merge::new(part.runs.sources(), drop_tombstones)? {
        let (key, value) = item?;
        value_bytes += value.as_ref().map_or(0, |v| v.len() as u64);
        writer.push(key, value.as_deref())?;
        written += 1;
        if let Some(hold) = hold.take() {
            let _ = hold.reached.send(());
            let _ = hold.release.recv();
        }
        if written.is_multiple_of(STOP_CHECK_ENTRIES) && job.stop.load(Relaxed) {
            return Ok(None);
        }
    }
    if job.crash_at == Some(CrashPoint::MergeTempWritten) {
        // The temp file stays behind, as after a real crash.
        drop(writer);
        return Err(StoreError::SimulatedCrash("MergeTempWritten".into()));
    }
    if job.stop.load(Relaxed) {
        return Ok(None);
    }
    let summary = writer.finish()?;
    if part.scope.is_all(run_count)
        && (summary.entries, value_bytes) != (entry.live_cells, entry.value_bytes)
    {
        return Err(count_mismatch(
            &job.dir,
            entry,
            (summary.entries, value_bytes),
        ));
    }
    Ok(Some(summary))
}

/// A namespace whose runs hold other counts than the manifest's.
pub(super) fn count_mismatch(dir: &Path, entry: &NamespaceRuns, counted: (u64, u64)) -> StoreError {
    StoreError::Corruption {
        path: dir.join(super::manifest::MANIFEST_NAME),
        offset: 0,
        reason: format!(
            "the manifest counts {} cells ({} value bytes) in namespace id {}, its runs \
             hold {} ({})",
            entry.live_cells, entry.value_bytes, entry.ns_id, counted.0, counted.1
        ),
    }
}

/// Removes the files a merge job wrote or began (listed by no manifest),
/// then syncs the directory.
pub(super) fn discard_outputs(
    storage: &dyn Storage,
    dir: &Path,
    file_ids: &[u64],
) -> Result<(), StoreError> {
    let mut removed = false;
    for id in file_ids {
        let path = dir.join(run_file_name(*id));
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        for path in [path, PathBuf::from(tmp)] {
            match storage.remove_file(&path) {
                Ok(()) => removed = true,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StoreError::io(&path, e)),
            }
        }
    }
    if removed {
        sync_dir(storage, dir)?;
    }
    Ok(())
}
