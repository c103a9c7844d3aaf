//! The merge threads, and how the checkpointer hands them merge jobs and
//! installs what they wrote.
//!
//! A fold that finds a merge due starts it here and returns; the
//! checkpointer keeps folding meanwhile (the writer never waits behind a
//! merge of gigabytes) and installs the merge once it has finished
//! (`CheckpointStore::poll_merge`). Two lanes, one thread each: the
//! [`DUE_LANE`] (`cube-merge`) runs the merges [`super::runs::merge_due`]
//! finds, up to rewriting a namespace whole (minutes at 200 M cells); while
//! it is busy, the [`FOLDED_LANE`] (`cube-merge-new`) merges the runs
//! folded since its merge began, four like runs at a time (seconds), so
//! that they neither pile up nor hold the checkpointer (whose folds the
//! writer waits on). At most one merge is in flight per lane, and their
//! runs never overlap: the folded lane takes only runs newer than every
//! run the due lane reads, and the due lane starts only when both are
//! idle. A compaction asked for, a fold that drops a namespace a merge
//! reads, and shutdown cancel both (a stop flag the job checks between
//! entries): the first two rewrite or remove what they read, and shutdown
//! should not wait minutes for work the next start redoes. A job that has
//! finished by then is installed instead.

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

/// The lane of the merges [`super::runs::merge_due`] finds.
pub(super) const DUE_LANE: usize = 0;
/// The lane of the merges of runs folded during the due lane's merge.
pub(super) const FOLDED_LANE: usize = 1;
const LANES: usize = 2;
const LANE_THREAD_NAMES: [&str; LANES] = ["cube-merge", "cube-merge-new"];

/// A merge job on a merge thread, until its result is taken.
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

/// One merge thread and the job it runs.
struct Lane {
    jobs: Option<Sender<MergeJob>>,
    thread: Option<JoinHandle<()>>,
    in_flight: Option<InFlight>,
}

/// The merge threads: each runs one merge job at a time, at the
/// checkpointer's lowered priority, and hands back `(lane, result)`.
pub(super) struct MergeWorker {
    lanes: [Lane; LANES],
    pub(super) done: Receiver<(usize, JobResult)>,
}

impl MergeWorker {
    pub(super) fn start() -> std::io::Result<MergeWorker> {
        let (done_tx, done) = bounded(LANES);
        let mut lanes = Vec::with_capacity(LANES);
        for (lane, name) in LANE_THREAD_NAMES.iter().enumerate() {
            let (jobs, job_rx) = bounded::<MergeJob>(1);
            let done_tx = done_tx.clone();
            // A panic here aborts the process, as on every cubed thread
            // (`server/src/panic_policy.rs`): the next start recovers.
            let thread = thread::Builder::new().name((*name).into()).spawn(move || {
                crate::thread_priority::lower_this_thread(crate::thread_priority::BACKGROUND_NICE);
                for job in job_rx {
                    if done_tx.send((lane, run_merge_job(job))).is_err() {
                        return;
                    }
                }
            })?;
            lanes.push(Lane {
                jobs: Some(jobs),
                thread: Some(thread),
                in_flight: None,
            });
        }
        let lanes: [Lane; LANES] = lanes
            .try_into()
            .unwrap_or_else(|_| unreachable!("one lane per name"));
        Ok(MergeWorker { lanes, done })
    }

    /// Hands `job` to `lane`'s thread (none may be in flight there).
    pub(super) fn submit(
        &mut self,
        lane: usize,
        job: MergeJob,
        counted: Option<MergeInFlight>,
    ) -> Result<(), StoreError> {
        assert!(
            self.lanes[lane].in_flight.is_none(),
            "a merge lane runs one job at a time"
        );
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
        let jobs = self.lanes[lane].jobs.as_ref().ok_or_else(stopped)?;
        jobs.send(job).map_err(|_| stopped())?;
        self.lanes[lane].in_flight = Some(in_flight);
        Ok(())
    }

    /// The merges in flight.
    fn in_flight(&self) -> impl Iterator<Item = &InFlight> {
        self.lanes.iter().filter_map(|lane| lane.in_flight.as_ref())
    }

    /// Whether `lane` has no merge in flight.
    pub(super) fn idle(&self, lane: usize) -> bool {
        self.lanes[lane].in_flight.is_none()
    }

    /// Stops the threads once their jobs (if any) have ended.
    pub(super) fn join(&mut self) {
        for lane in &mut self.lanes {
            drop(lane.jobs.take());
        }
        for lane in &mut self.lanes {
            if let Some(thread) = lane.thread.take() {
                let _ = thread.join();
            }
        }
    }
}

impl Drop for MergeWorker {
    /// A store dropped without `stop_merges` (an error path) still stops
    /// the threads: merges in flight are cancelled, their files left for
    /// the next start to remove.
    fn drop(&mut self) {
        for in_flight in self.in_flight() {
            in_flight.stop.store(true, Relaxed);
        }
        self.join();
    }
}

fn stopped() -> StoreError {
    StoreError::WritesDisabled("the merge thread has stopped".into())
}

impl CheckpointStore {
    /// Runs the merges folds find due on the merge threads from now on
    /// (the daemon).
    pub(crate) fn start_merge_thread(&mut self) -> std::io::Result<()> {
        self.merges = Merges::Background(Box::new(MergeWorker::start()?));
        Ok(())
    }

    fn worker(&mut self) -> Option<&mut MergeWorker> {
        match &mut self.merges {
            Merges::Background(worker) => Some(worker),
            Merges::Inline | Merges::Deferred => None,
        }
    }

    fn worker_ref(&self) -> Option<&MergeWorker> {
        match &self.merges {
            Merges::Background(worker) => Some(worker),
            Merges::Inline | Merges::Deferred => None,
        }
    }

    /// Whether a merge in flight reads namespace `ns_id`'s runs.
    pub(super) fn merge_reads(&self, ns_id: u64) -> bool {
        self.worker_ref()
            .is_some_and(|w| w.in_flight().any(|f| f.ns_ids.contains(&ns_id)))
    }

    /// The file ids of the runs the merges in flight read (none if none
    /// is in flight).
    pub(super) fn runs_merging(&self) -> Vec<u64> {
        self.worker_ref().map_or_else(Vec::new, |w| {
            w.in_flight()
                .flat_map(|f| f.file_ids.iter().copied())
                .collect()
        })
    }

    /// Where the merge threads hand back finished jobs (for waking on
    /// them; `poll_merge` takes them).
    pub(super) fn merge_results(&self) -> Option<Receiver<(usize, JobResult)>> {
        self.worker_ref().map(|w| w.done.clone())
    }

    /// Whether a merge is in flight on a merge thread.
    pub(crate) fn merge_in_flight(&self) -> bool {
        self.worker_ref()
            .is_some_and(|w| w.in_flight().next().is_some())
    }

    /// Whether a merge of the runs folded since the due lane's merge
    /// began may be handed to the folded lane now: the due lane busy (the
    /// runs it reads are older than those) and the folded lane idle.
    pub(super) fn folded_lane_free(&self) -> bool {
        self.worker_ref()
            .is_some_and(|w| !w.idle(DUE_LANE) && w.idle(FOLDED_LANE))
    }

    /// Hands `job` (runs folded since the due lane's merge began) to the
    /// folded lane ([`Self::folded_lane_free`] must hold).
    pub(super) fn start_folded_merge(&mut self, job: MergeJob) -> Result<(), StoreError> {
        let counted = self.merges_in_flight.clone().map(MergeInFlight::start);
        match self.worker() {
            Some(worker) => worker.submit(FOLDED_LANE, job, counted),
            None => Ok(()),
        }
    }

    /// Starts the merge that is due, if any and no merge is in flight.
    pub(crate) fn start_due_merge(&mut self) -> Result<(), StoreError> {
        if self.worker().is_none() || self.merge_in_flight() {
            return Ok(());
        }
        self.check_usable()?;
        let Some(job) = self.pick_merge(MergeWhen::Due)? else {
            return Ok(());
        };
        let counted = self.merges_in_flight.clone().map(MergeInFlight::start);
        match self.worker() {
            Some(worker) => worker.submit(DUE_LANE, job, counted),
            None => Ok(()),
        }
    }

    /// Installs a merge that has finished, if any; `None` if none has. An
    /// error is a failed merge, reported as a failed checkpoint.
    pub(crate) fn poll_merge(&mut self) -> Option<Result<CompactionReport, StoreError>> {
        let worker = self.worker()?;
        let (lane, result) = match worker.done.try_recv() {
            Ok(done) => done,
            Err(TryRecvError::Empty) => return None,
            Err(TryRecvError::Disconnected) => {
                // Every thread gone: fail the merge in flight, if any.
                let lane = (0..LANES).find(|&lane| !worker.idle(lane))?;
                (lane, Err(MergeFailure::Failed(stopped())))
            }
        };
        // A lane hands back only the job it was given.
        let Some(started) = worker.lanes[lane].in_flight.as_ref().map(|f| f.started) else {
            panic!("a merge result from lane {lane}, which runs no job");
        };
        let mut report = CompactionReport::default();
        let settled = self.take_merge_result(lane, result, &mut report);
        report.duration = started.elapsed();
        Some(settled.map(|()| report))
    }

    /// Waits for `lane`'s merge in flight, if any, installing or
    /// discarding what any merge that finishes meanwhile wrote.
    fn settle_lane(
        &mut self,
        lane: usize,
        report: &mut CompactionReport,
    ) -> Result<(), StoreError> {
        loop {
            let Some(worker) = self.worker() else {
                return Ok(());
            };
            if worker.idle(lane) {
                return Ok(());
            }
            let (done_lane, result) = worker
                .done
                .recv()
                .unwrap_or_else(|_| (lane, Err(MergeFailure::Failed(stopped()))));
            self.take_merge_result(done_lane, result, report)?;
        }
    }

    /// Waits for the folded lane's merge in flight (seconds: runs of a
    /// fold's size) and installs it.
    pub(super) fn settle_folded_merge(
        &mut self,
        report: &mut CompactionReport,
    ) -> Result<(), StoreError> {
        self.settle_lane(FOLDED_LANE, report)
    }

    /// Waits for every merge in flight (cancelling them first with
    /// `cancel`) and installs or discards what they wrote.
    pub(super) fn settle_merge(
        &mut self,
        cancel: bool,
        report: &mut CompactionReport,
    ) -> Result<(), StoreError> {
        if cancel && let Some(worker) = self.worker() {
            for in_flight in worker.in_flight() {
                in_flight.stop.store(true, Relaxed);
            }
        }
        // Each lane settled, even after another's failure: its result
        // must not be left behind for the next merge's wait.
        let mut outcome = Ok(());
        for lane in 0..LANES {
            let settled = self.settle_lane(lane, report);
            if outcome.is_ok() {
                outcome = settled;
            }
        }
        outcome
    }

    /// Installs a finished merge job's output, or discards it; `lane`'s
    /// merge stops counting as in flight once this returns.
    fn take_merge_result(
        &mut self,
        lane: usize,
        result: JobResult,
        report: &mut CompactionReport,
    ) -> Result<(), StoreError> {
        let in_flight = self.worker().and_then(|w| w.lanes[lane].in_flight.take());
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

    /// Waits for the merges in flight and installs them, then for each
    /// merge due after them, until none is
    /// (`CheckpointConfig::wait_for_merges`).
    pub(super) fn drain_merges(&mut self, report: &mut CompactionReport) -> Result<(), StoreError> {
        while self.merge_in_flight() {
            self.settle_merge(false, report)?;
            self.start_due_merge()?;
        }
        Ok(())
    }

    /// Cancels the merges in flight, stops the merge threads, and leaves
    /// the merges due to the next start (shutdown).
    pub(crate) fn stop_merges(&mut self) -> Result<(), StoreError> {
        let settled = self.settle_merge(true, &mut CompactionReport::default());
        if let Some(worker) = self.worker() {
            worker.join();
        }
        self.merges = Merges::Deferred;
        settled
    }
}
