//! The checkpointer thread: folds the WAL when it grows past its threshold,
//! and on request (`cubec checkpoint`).

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Select, Sender, TryRecvError, bounded};

use super::backup::BackupReport;
use super::{CheckpointReport, CheckpointStore};
use crate::error::StoreError;
use crate::group_commit::SegmentRoller;
use crate::stats::StoreStats;
use crate::wal::list_segments;

type Reply = Sender<Result<CheckpointReport, StoreError>>;

enum Request {
    /// Fold now; with `compact`, compact afterwards whatever the sizes.
    Checkpoint { compact: bool, reply: Reply },
    Backup {
        dest: std::path::PathBuf,
        reply: Sender<Result<BackupReport, StoreError>>,
    },
}

pub(crate) struct Checkpointer {
    tx: Option<Sender<Request>>,
    thread: Option<JoinHandle<CheckpointStore>>,
}

impl Checkpointer {
    pub(crate) fn start(
        mut store: CheckpointStore,
        roller: SegmentRoller,
        wal_dir: std::path::PathBuf,
        stats: Arc<StoreStats>,
    ) -> std::io::Result<Checkpointer> {
        let (tx, rx) = bounded::<Request>(16);
        let poll = store.config.poll_interval;
        store.merges_in_flight = Some(Arc::clone(&stats));
        store.start_merge_thread()?;
        let thread = thread::Builder::new()
            .name("cube-checkpoint".into())
            .spawn(move || {
                crate::thread_priority::lower_this_thread(crate::thread_priority::BACKGROUND_NICE);
                let worker = Worker {
                    retry: Retry::new(poll),
                    store,
                    roller,
                    wal_dir,
                    stats,
                };
                worker.run(&rx, poll)
            })?;
        Ok(Checkpointer {
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    /// Asks for a checkpoint (and, with `compact`, a compaction) now and
    /// waits for its report.
    pub(crate) fn checkpoint_now(&self, compact: bool) -> Result<CheckpointReport, StoreError> {
        let stopped = || StoreError::WritesDisabled("the checkpointer has stopped".into());
        let tx = self.tx.as_ref().ok_or_else(stopped)?;
        let (reply, answer) = bounded(1);
        tx.send(Request::Checkpoint { compact, reply })
            .map_err(|_| stopped())?;
        answer.recv().map_err(|_| stopped())?
    }

    /// Asks for a backup into `dest` and waits for its report.
    pub(crate) fn backup(&self, dest: &std::path::Path) -> Result<BackupReport, StoreError> {
        let stopped = || StoreError::WritesDisabled("the checkpointer has stopped".into());
        let tx = self.tx.as_ref().ok_or_else(stopped)?;
        let (reply, answer) = bounded(1);
        tx.send(Request::Backup {
            dest: dest.to_path_buf(),
            reply,
        })
        .map_err(|_| stopped())?;
        answer.recv().map_err(|_| stopped())?
    }

    /// Stops the thread and hands back the checkpoint files' owner.
    pub(crate) fn stop(&mut self) -> Option<CheckpointStore> {
        drop(self.tx.take());
        self.thread.take().and_then(|t| t.join().ok())
    }
}

/// What the checkpointer thread owns: the checkpoint files, and what it
/// rolls the WAL and reports its attempts with.
struct Worker {
    store: CheckpointStore,
    roller: SegmentRoller,
    wal_dir: std::path::PathBuf,
    stats: Arc<StoreStats>,
    retry: Retry,
}

impl Worker {
    /// The thread's body: serves requests and folds when due until the
    /// checkpointer is dropped, then hands back the checkpoint files' owner.
    fn run(mut self, rx: &Receiver<Request>, poll: Duration) -> CheckpointStore {
        let merged = self.store.merge_results();
        loop {
            // Wakes for a request, a merge that has finished on the merge
            // thread, or the poll.
            let mut ready = Select::new();
            ready.recv(rx);
            if let Some(merged) = &merged {
                ready.recv(merged);
            }
            let woken = ready.ready_timeout(poll).is_ok();
            // A finished merge is installed between folds; then the next
            // one due starts.
            settle_background_merge(&mut self.store, &self.stats, &mut self.retry);
            let request = match rx.try_recv() {
                Ok(request) => Ok(request),
                // Woken by a merge alone: the WAL is looked at after a quiet
                // poll only, as before (a fold started then could ask a
                // writer being shut down to roll).
                Err(TryRecvError::Empty) if woken => continue,
                Err(TryRecvError::Empty) => Err(RecvTimeoutError::Timeout),
                Err(TryRecvError::Disconnected) => Err(RecvTimeoutError::Disconnected),
            };
            match request {
                Ok(Request::Backup { dest, reply }) => {
                    let _ = reply.send(self.backup(&dest));
                }
                Ok(Request::Checkpoint { compact, reply }) => {
                    let _ = reply.send(self.checkpoint_asked_for(compact));
                }
                Err(RecvTimeoutError::Timeout) => self.fold_if_due(),
                Err(RecvTimeoutError::Disconnected) => return self.shut_down(),
            }
        }
    }

    /// A backup someone asked for, of the WAL up to a segment rolled now.
    fn backup(&mut self, dest: &std::path::Path) -> Result<BackupReport, StoreError> {
        self.roller
            .roll()
            .map_err(|e| StoreError::WritesDisabled(e.message))
            .and_then(|boundary| self.store.backup(boundary, dest))
    }

    /// A checkpoint someone asked for: the current segment is rolled and
    /// folded now, and with `compact` everything compacted after.
    fn checkpoint_asked_for(&mut self, compact: bool) -> Result<CheckpointReport, StoreError> {
        let store = &mut self.store;
        let stats = &self.stats;
        let result = self
            .roller
            .roll()
            .map_err(|e| StoreError::WritesDisabled(e.message))
            .and_then(|boundary| {
                stats.folds_in_flight.store(1, Relaxed);
                let folded = store.fold(boundary);
                stats.folds_in_flight.store(0, Relaxed);
                folded
            })
            .map(|report| {
                report.unwrap_or_else(|| CheckpointReport {
                    checkpoint_lsn: store.checkpoint_lsn(),
                    ..CheckpointReport::default()
                })
            })
            .and_then(|mut report| {
                // A fold may have compacted as due; one asked for also
                // merges every namespace's runs into one.
                if compact {
                    report.compaction = Some(store.compact()?);
                }
                Ok(report)
            });
        record(stats, store, &result);
        self.retry.after(store, &result, true);
        result
    }

    /// After a quiet poll: folds the closed segments if they have grown
    /// past the threshold, or everything if memory waits on a fold.
    fn fold_if_due(&mut self) {
        // Latched (it said why once): nothing to retry. Failing: wait out
        // the back-off first.
        if self.store.check_usable().is_err() || !self.retry.due() {
            return;
        }
        // Memory waiting on a fold (namespaces on disk): the current
        // segment is closed and folded now.
        let pressure = self.store.wants_fold();
        // Closed segments are all but the newest: the writer syncs a
        // segment before starting the next.
        let boundary = if pressure {
            match self.roller.roll() {
                Ok(boundary) => boundary,
                Err(_) => return,
            }
        } else {
            match list_segments(self.store.storage(), &self.wal_dir, false) {
                Ok(segments) => segments.last().map_or(0, |(first, _)| *first),
                Err(_) => return,
            }
        };
        let due = pressure
            || self
                .store
                .closed_wal_bytes(boundary)
                .is_ok_and(|bytes| bytes >= self.store.config.checkpoint_wal_bytes);
        if due {
            self.stats.folds_in_flight.store(1, Relaxed);
            let result = self.store.fold(boundary).map(Option::unwrap_or_default);
            self.stats.folds_in_flight.store(0, Relaxed);
            record(&self.stats, &self.store, &result);
            self.retry.after(&self.store, &result, false);
        }
    }

    /// Shutdown: a merge in flight is cancelled (the next start merges
    /// again) rather than waited for, which could take minutes.
    fn shut_down(mut self) -> CheckpointStore {
        if let Err(e) = self.store.stop_merges() {
            let result = Err(e);
            record(&self.stats, &self.store, &result);
            self.retry.after(&self.store, &result, false);
        }
        self.store
    }
}

/// Installs the background merge if it has finished (a failure counts as
/// a failed checkpoint, retried like one; a success leaves the retry state
/// to the folds), then starts the next one due unless failures are being
/// waited out.
fn settle_background_merge(store: &mut CheckpointStore, stats: &StoreStats, retry: &mut Retry) {
    if let Some(settled) = store.poll_merge() {
        let result = settled.map(|compaction| CheckpointReport {
            checkpoint_lsn: store.checkpoint_lsn(),
            compaction: Some(compaction),
            ..CheckpointReport::default()
        });
        record(stats, store, &result);
        if result.is_err() {
            retry.after(store, &result, false);
        }
    }
    // Waited-for merges (a test's) start in folds only.
    if store.merge_in_flight()
        || store.config.wait_for_merges
        || store.check_usable().is_err()
        || !retry.due()
    {
        return;
    }
    if let Err(e) = store.start_due_merge() {
        let result = Err(e);
        record(stats, store, &result);
        retry.after(store, &result, false);
    }
}

/// Updates the stats after a checkpoint attempt.
pub(crate) fn record(
    stats: &StoreStats,
    store: &CheckpointStore,
    result: &Result<CheckpointReport, StoreError>,
) {
    match result {
        Ok(report) => {
            if report.segments_folded > 0 {
                stats.checkpoints.fetch_add(1, Relaxed);
                stats
                    .last_checkpoint_us
                    .store(report.duration.as_micros() as u64, Relaxed);
                stats
                    .last_checkpoint_bytes
                    .store(report.delta_bytes, Relaxed);
            }
            if let Some(c) = &report.compaction {
                stats.compactions.fetch_add(1, Relaxed);
                stats
                    .last_compaction_us
                    .store(c.duration.as_micros() as u64, Relaxed);
                stats.last_compaction_bytes.store(c.base_bytes, Relaxed);
            }
        }
        Err(e) => {
            stats.checkpoint_failures.fetch_add(1, Relaxed);
            stats.set_checkpoint_failure(&format!("{e}"));
        }
    }
    let (base, deltas) = store.sizes();
    stats.base_bytes.store(base, Relaxed);
    stats.delta_bytes.store(deltas, Relaxed);
    stats.delta_files.store(store.delta_count() as u64, Relaxed);
    stats.checkpoint_lsn.store(store.checkpoint_lsn(), Relaxed);
    stats.notify_background();
}

/// The longest wait between two automatic checkpoint attempts while they
/// fail (a full disk, `EFBIG` under `ulimit -f`).
pub(crate) const MAX_RETRY_DELAY: Duration = Duration::from_secs(10);

/// Automatic checkpoints after a failure: the next attempt waits a delay
/// that doubles with each failure, from the poll interval up to
/// [`MAX_RETRY_DELAY`], so a full disk is not hammered (it was tried five
/// times a second). The state is logged once per change: the first
/// failure, then the success that ends the run of failures; a failure
/// after a failure is silent. A checkpoint someone asked for is tried at
/// once and its failure always logged (its client is told too).
struct Retry {
    poll: Duration,
    failures: u64,
    delay: Duration,
    next_at: Option<Instant>,
}

impl Retry {
    fn new(poll: Duration) -> Retry {
        Retry {
            poll,
            failures: 0,
            delay: poll,
            next_at: None,
        }
    }

    /// Whether an automatic attempt may run now.
    fn due(&self) -> bool {
        self.next_at.is_none_or(|at| Instant::now() >= at)
    }

    fn after(
        &mut self,
        store: &CheckpointStore,
        result: &Result<CheckpointReport, StoreError>,
        asked_for: bool,
    ) {
        match result {
            Ok(_) => {
                if self.failures > 0 {
                    eprintln!(
                        "cubed: checkpoints work again, after {} failed attempt(s)",
                        self.failures
                    );
                }
                *self = Retry::new(self.poll);
            }
            Err(e) => {
                self.failures += 1;
                if self.failures == 1 || asked_for {
                    let next = if store.check_usable().is_err() {
                        "no more checkpoints until cubed restarts".to_string()
                    } else {
                        format!(
                            "will be retried, waiting longer after each failure (up to {} s); \
                             said again once it works",
                            MAX_RETRY_DELAY.as_secs()
                        )
                    };
                    eprintln!("cubed: checkpoint failed: {e}; the WAL is kept, {next}");
                }
                if !asked_for {
                    self.next_at = Some(Instant::now() + self.delay);
                    self.delay = (self.delay * 2).min(MAX_RETRY_DELAY);
                }
            }
        }
    }
}
