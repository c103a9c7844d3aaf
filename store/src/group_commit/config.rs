//! How the writer is set up: the sync policy, group and queue bounds, the
//! namespace limits, and what it tells the caller around each group.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use super::answer::AnswerBatch;
use crate::mutation::Mutation;

/// When a write is acknowledged relative to its `fdatasync`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncPolicy {
    /// Acknowledge only after the group's fdatasync. The default.
    Always,
    /// Acknowledge after the `write`; fdatasync at least every `every` or
    /// every `max_writes` writes. A crash loses at most that window.
    Interval { every: Duration, max_writes: u64 },
    /// Never fdatasync (benchmarks only): a crash of the machine loses
    /// everything the kernel had not flushed.
    Never,
}

impl SyncPolicy {
    pub const INTERVAL_MAX_WRITES: u64 = 1000;
}

impl FromStr for SyncPolicy {
    type Err = String;

    fn from_str(text: &str) -> Result<SyncPolicy, String> {
        match text {
            "always" => Ok(SyncPolicy::Always),
            "never" => Ok(SyncPolicy::Never),
            _ => {
                let ms = text
                    .strip_prefix("interval=")
                    .and_then(|ms| ms.parse::<u64>().ok())
                    .filter(|ms| *ms > 0)
                    .ok_or_else(|| {
                        format!(
                            "bad sync policy {text:?}: use always, interval=MS (MS > 0) or never"
                        )
                    })?;
                Ok(SyncPolicy::Interval {
                    every: Duration::from_millis(ms),
                    max_writes: SyncPolicy::INTERVAL_MAX_WRITES,
                })
            }
        }
    }
}

impl std::fmt::Display for SyncPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SyncPolicy::Always => write!(f, "always"),
            SyncPolicy::Interval { every, .. } => write!(f, "interval={}", every.as_millis()),
            SyncPolicy::Never => write!(f, "never"),
        }
    }
}

#[derive(Clone, Debug)]
pub struct GroupCommitConfig {
    pub sync: SyncPolicy,
    /// A segment is closed and a new one started past this size.
    pub segment_bytes: u64,
    pub max_group_records: usize,
    pub max_group_bytes: usize,
    /// Requests waiting for the writer; senders block beyond it.
    pub queue_capacity: usize,
    /// Namespaces the store may hold (the implicit `default` included);
    /// a create beyond it is refused. Each costs a few KiB even empty,
    /// and nothing else bounds how many a client makes.
    pub max_namespaces: usize,
    /// Namespaces one owner uid may hold, except the uids in
    /// `unlimited_owners` (the administrators), whom only `max_namespaces`
    /// bounds. Checked on the writer, where creates commit one at a time,
    /// so concurrent creates cannot overshoot it.
    pub max_namespaces_per_owner: usize,
    pub unlimited_owners: Vec<u32>,
    /// Makes, once, the writer's [`AnswerBatch`]: each answer of a
    /// durable group ([`Responder::Callback`](super::Responder::Callback)s among them) gets it, so a
    /// caller can gather the answers it sends and send each client's
    /// together (the server sends a connection's answers of one group in
    /// one `send`).
    pub answer_batch: Option<fn() -> Box<dyn AnswerBatch>>,
    /// Told of every group once it is applied (the server's `watch`).
    pub commit_listener: Option<Arc<dyn CommitListener>>,
}

/// Told, on the writer thread, of each group once readers can see it and
/// before it is answered. It must never block: a non-blocking handoff at
/// most, so no listener can slow the writer down.
pub trait CommitListener: Send + Sync + std::fmt::Debug {
    /// The group `first_lsn..=last_lsn` is applied. `take` gives its
    /// mutations in LSN order, moved out of the group (call it at most
    /// once, and only when they are wanted).
    fn applied(&self, first_lsn: u64, last_lsn: u64, take: &mut dyn FnMut() -> Vec<Mutation>);
}

/// The default [`GroupCommitConfig::max_namespaces`].
pub const MAX_NAMESPACES: usize = 65_536;

impl Default for GroupCommitConfig {
    fn default() -> GroupCommitConfig {
        GroupCommitConfig {
            sync: SyncPolicy::Always,
            segment_bytes: 32 * 1024 * 1024,
            max_group_records: 4096,
            max_group_bytes: 8 * 1024 * 1024,
            queue_capacity: 8192,
            max_namespaces: MAX_NAMESPACES,
            max_namespaces_per_owner: usize::MAX,
            unlimited_owners: Vec::new(),
            answer_batch: None,
            commit_listener: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sync_policies_parse() {
        assert_eq!("always".parse::<SyncPolicy>(), Ok(SyncPolicy::Always));
        assert_eq!("never".parse::<SyncPolicy>(), Ok(SyncPolicy::Never));
        assert_eq!(
            "interval=250".parse::<SyncPolicy>(),
            Ok(SyncPolicy::Interval {
                every: Duration::from_millis(250),
                max_writes: SyncPolicy::INTERVAL_MAX_WRITES
            })
        );
        assert!("interval=0".parse::<SyncPolicy>().is_err());
        assert!("sometimes".parse::<SyncPolicy>().is_err());
    }
}
