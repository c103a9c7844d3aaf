//! What `stats` shows of the watches (`watch.*` rows, docs/operations.md),
//! and each watch's count of the bytes it has waiting, which adds up to
//! the daemon's `watch.buffered_bytes`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cube_protocol::{StatsEntry, StatsValue};

/// The watches' figures, shared by the dispatcher and the watch threads.
#[derive(Debug, Default)]
pub(crate) struct WatchStats {
    /// Changes written (or handed to be written) to watchers, live and
    /// replayed.
    pub changes_delivered: AtomicU64,
    /// Deliveries the dispatcher wrote to a caught-up watch's socket
    /// itself (no wakeup of the watch's thread).
    pub direct_writes: AtomicU64,
    /// Deliveries handed to a watch's thread (a wakeup each, unless it
    /// was already awake).
    pub queued_deliveries: AtomicU64,
    /// Bytes of changes waiting for watchers, all watches together.
    pub buffered_bytes: AtomicU64,
    /// Watches answered `resync`, by reason.
    pub resyncs_history_gone: AtomicU64,
    pub resyncs_too_slow: AtomicU64,
}

impl WatchStats {
    /// The `watch.*` rows; `open`, the watches open now.
    pub(crate) fn entries(&self, open: u64) -> Vec<StatsEntry> {
        let count = |name: &str, n: &AtomicU64| StatsEntry {
            name: name.to_string(),
            value: StatsValue::Count(n.load(Ordering::Relaxed)),
        };
        vec![
            StatsEntry {
                name: "watch.open".into(),
                value: StatsValue::Count(open),
            },
            count("watch.changes_delivered", &self.changes_delivered),
            count("watch.direct_writes", &self.direct_writes),
            count("watch.queued_deliveries", &self.queued_deliveries),
            count("watch.buffered_bytes", &self.buffered_bytes),
            count("watch.resyncs_history_gone", &self.resyncs_history_gone),
            count("watch.resyncs_too_slow", &self.resyncs_too_slow),
        ]
    }
}

/// One watch's bytes waiting for its client, counted against its
/// `--watch-buffer-bytes` and in the daemon's total. What is still counted
/// when the last holder lets go leaves the total then.
#[derive(Debug)]
pub(crate) struct Buffered {
    bytes: AtomicU64,
    stats: Arc<WatchStats>,
}

impl Buffered {
    pub(crate) fn new(stats: Arc<WatchStats>) -> Buffered {
        Buffered {
            bytes: AtomicU64::new(0),
            stats,
        }
    }

    pub(crate) fn stats(&self) -> &WatchStats {
        &self.stats
    }

    pub(crate) fn get(&self) -> u64 {
        self.bytes.load(Ordering::SeqCst)
    }

    pub(crate) fn add(&self, n: u64) {
        self.bytes.fetch_add(n, Ordering::SeqCst);
        self.stats.buffered_bytes.fetch_add(n, Ordering::Relaxed);
    }

    /// Takes off bytes written (at most what was added).
    pub(crate) fn sub(&self, n: u64) {
        self.bytes.fetch_sub(n, Ordering::SeqCst);
        self.stats.buffered_bytes.fetch_sub(n, Ordering::Relaxed);
    }
}

impl Drop for Buffered {
    fn drop(&mut self) {
        let left = *self.bytes.get_mut();
        self.stats.buffered_bytes.fetch_sub(left, Ordering::Relaxed);
    }
}
