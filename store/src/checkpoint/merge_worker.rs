//! The `cube-merge` thread, and how the checkpointer hands it merge jobs
//! and installs what they wrote.
//!
//! A fold that finds a merge due starts it here and returns; the
//! checkpointer keeps folding meanwhile (the writer never waits behind a
//! merge of gigabytes) and installs the merge once it has finished
//! (`CheckpointStore::poll_merge`). At most one merge is in flight. A
//! compaction asked for, a fold that drops a namespace the merge reads,
//! and shutdown cancel it (a stop flag the job checks between entries):
//! the first two rewrite or remove what it reads, and shutdown should not
//! wait minutes for work the next start redoes. A job that has finished
//! by then is installed instead.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::thread::{self, JoinHandle};
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender, TryRecvError, bounded};

use super::merge_job::{MergeFailure, MergeJob, MergedNamespace, discard_outputs, run_merge_job};
use super::runs::{MergeInFlight, MergeWhen};
use super::{CheckpointStore, CompactionReport, Merges};
use crate::error::StoreError;

/// How a merge job ended.
pub(super) type JobResult = Result<Vec<MergedNamespace>, MergeFailure>;

/// A merge job on the `cube-merge` thread, until its result is taken.
pub(super) struct InFlight {
    pub(super) stop: Arc<AtomicBool>,
    /// When it was handed over (its duration in the stats runs from here).
    pub(super) started: Instant,
    pub(super) ns_ids: Vec<u64>,
    /// The file ids of the runs it reads.
    pub(super) file_ids: Vec<u64>,
    /// Counts the merge in the stats until it is settled.
    pub(super) _counted: Option<MergeInFlight>,
}

/// The `cube-merge` thread: runs one merge job at a time, at the
/// checkpointer's lowered priority.
pub(super) struct MergeWorker {
    jobs: Option<Sender<MergeJob>>,
    pub(super) done: Receiver<JobResult>,
    thread: Option<JoinHandle<()>>,
    pub(super) in_flight: Option<InFlight>,
}

impl MergeWorker {
    pub(super) fn start() -> std::io::Result<MergeWorker> {
        let (jobs, job_rx) = bounded::<MergeJob>(1);
        let (done_tx, done) = bounded(1);
        // A panic here aborts the process, as on every cubed thread
        // (`server/src/panic_policy.rs`): the next start recovers.
        let thread = thread::Builder::new()
            .name("cube-merge".into())
            .spawn(move || {
                crate::thread_priority::lower_this_thread(crate::thread_priority::BACKGROUND_NICE);
                for job in job_rx {
                    if done_tx.send(run_merge_job(job)).is_err() {
                        return;
                    }
                }
            })?;
        Ok(MergeWorker {
            jobs: Some(jobs),
            done,
            thread: Some(thread),
            in_flight: None,
        })
    }

    /// Hands `job` to the thread (none may be in flight).
    pub(super) fn submit(
        &mut self,
        job: MergeJob,
        counted: Option<MergeInFlight>,
    ) -> Result<(), StoreError> {
        let in_flight = InFlight {
            stop: Arc::clone(&job.stop),
            started: Instant::now(),
            ns_ids: job.parts.iter().map(|p| p.entry.ns_id).collect(),
            file_ids: job
                .parts
                .iter()
                .flat_map(|p| p.entry.runs[p.scope.window()].iter().map(|r| r.file_id))
                .collect(),
            _counted: counted,
        };
        let jobs = self.jobs.as_ref().ok_or_else(stopped)?;
        jobs.send(job).map_err(|_| stopped())?;
        self.in_flight = Some(in_flight);
        Ok(())
    }

    /// Stops the thread once its job (if any) has ended.
    pub(super) fn join(&mut self) {
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for MergeWorker {
    /// A store dropped without `stop_merges` (an error path) still stops
    /// the thread: a merge in flight is cancelled, its files left for the
    /// next start to remove.
    fn drop(&mut self) {
        if let Some(in_flight) = &self.in_flight {
            in_flight.stop.store(true, Relaxed);
        }
        self.join();
    }
}

fn stopped() -> StoreError {
    StoreError::WritesDisabled("the merge thread has stopped".into())
}

impl CheckpointStore {
    /// Runs the merges folds find due on the `cube-merge` thread from now
    /// on (the daemon).
    pub(crate) fn start_merge_thread(&mut self) -> std::io::Result<()> {
        self.merges = Merges::Background(MergeWorker::start()?);
        Ok(())
    }

    fn worker(&mut self) -> Option<&mut MergeWorker> {
        match &mut self.merges {
            Merges::Background(worker) => Some(worker),
            Merges::Inline | Merges::Deferred => None,
        }
    }

    /// Whether the merge in flight reads namespace `ns_id`'s runs.
    pub(super) fn merge_reads(&self, ns_id: u64) -> bool {
        match &self.merges {
            Merges::Background(worker) => worker
                .in_flight
                .as_ref()
                .is_some_and(|f| f.ns_ids.contains(&ns_id)),
            Merges::Inline | Merges::Deferred => false,
        }
    }

    /// The file ids of the runs the merge in flight reads (none if none
    /// is in flight).
    pub(super) fn runs_merging(&self) -> &[u64] {
        match &self.merges {
            Merges::Background(worker) => worker.in_flight.as_ref().map_or(&[], |f| &f.file_ids),
            Merges::Inline | Merges::Deferred => &[],
        }
    }

    /// Where the merge thread hands back finished jobs (for waking on
    /// them; `poll_merge` takes them).
    pub(super) fn merge_results(&self) -> Option<Receiver<JobResult>> {
        match &self.merges {
            Merges::Background(worker) => Some(worker.done.clone()),
            Merges::Inline | Merges::Deferred => None,
        }
    }

    /// Whether a merge is in flight on the merge thread.
    pub(crate) fn merge_in_flight(&self) -> bool {
        matches!(&self.merges, Merges::Background(w) if w.in_flight.is_some())
    }

    /// Starts the merge that is due, if any and none is in flight.
    pub(crate) fn start_due_merge(&mut self) -> Result<(), StoreError> {
        if self.worker().is_none_or(|w| w.in_flight.is_some()) {
            return Ok(());
        }
        self.check_usable()?;
        let Some(job) = self.pick_merge(MergeWhen::Due)? else {
            return Ok(());
        };
        let counted = self.merges_in_flight.clone().map(MergeInFlight::start);
        match self.worker() {
            Some(worker) => worker.submit(job, counted),
            None => Ok(()),
        }
    }

    /// Installs the merge in flight if it has finished; `None` if none
    /// has. An error is a failed merge, reported as a failed checkpoint.
    pub(crate) fn poll_merge(&mut self) -> Option<Result<CompactionReport, StoreError>> {
        let worker = self.worker()?;
        let started = worker.in_flight.as_ref()?.started;
        let result = match worker.done.try_recv() {
            Ok(result) => result,
            Err(TryRecvError::Empty) => return None,
            Err(TryRecvError::Disconnected) => Err(MergeFailure::Failed(stopped())),
        };
        let mut report = CompactionReport::default();
        let settled = self.take_merge_result(result, &mut report);
        report.duration = started.elapsed();
        Some(settled.map(|()| report))
    }

    /// Waits for the merge in flight (cancelling it first with `cancel`)
    /// and installs or discards what it wrote.
    pub(super) fn settle_merge(
        &mut self,
        cancel: bool,
        report: &mut CompactionReport,
    ) -> Result<(), StoreError> {
        let Some(worker) = self.worker() else {
            return Ok(());
        };
        let Some(in_flight) = &worker.in_flight else {
            return Ok(());
        };
        if cancel {
            in_flight.stop.store(true, Relaxed);
        }
        let result = worker
            .done
            .recv()
            .unwrap_or_else(|_| Err(MergeFailure::Failed(stopped())));
        self.take_merge_result(result, report)
    }

    /// Installs a finished merge job's output, or discards it; the merge
    /// stops counting as in flight once this returns.
    fn take_merge_result(
        &mut self,
        result: JobResult,
        report: &mut CompactionReport,
    ) -> Result<(), StoreError> {
        let in_flight = self.worker().and_then(|w| w.in_flight.take());
        let outcome = self.settle_job(result, report);
        drop(in_flight);
        outcome
    }

    /// What becomes of a merge job's output: installed when it finished,
    /// removed when it was cancelled; a failed job's files stay, unlisted,
    /// as after a failed merge on the fold path (the next start removes
    /// them).
    pub(super) fn settle_job(
        &mut self,
        result: JobResult,
        report: &mut CompactionReport,
    ) -> Result<(), StoreError> {
        match result {
            Ok(merged) => self.install_merge(merged, report),
            Err(MergeFailure::Cancelled { output_ids }) => {
                discard_outputs(self.storage.as_ref(), &self.dir, &output_ids)
            }
            Err(MergeFailure::Failed(e)) => Err(e),
        }
    }

    /// Waits for the merge in flight and installs it, then for each merge
    /// due after it, until none is (`CheckpointConfig::wait_for_merges`).
    pub(super) fn drain_merges(&mut self, report: &mut CompactionReport) -> Result<(), StoreError> {
        while self.merge_in_flight() {
            self.settle_merge(false, report)?;
            self.start_due_merge()?;
        }
        Ok(())
    }

    /// Cancels the merge in flight, stops the merge thread, and leaves the
    /// merges due to the next start (shutdown).
    pub(crate) fn stop_merges(&mut self) -> Result<(), StoreError> {
        let settled = self.settle_merge(true, &mut CompactionReport::default());
        if let Some(worker) = self.worker() {
            worker.join();
        }
        self.merges = Merges::Deferred;
        settled
    }
}
