//! The single writer thread and its group commit.
//!
//! Connection threads send [`Mutation`]s over a bounded channel. The writer
//! blocks for the first, drains whatever else is already waiting (up to
//! [`GroupCommitConfig::max_group_records`] and `max_group_bytes`), encodes
//! the group into one buffer, issues one `write` and one `fdatasync`,
//! applies the group to the [`MemStore`], and only then answers each
//! request. While it syncs, the next group queues up behind it, which is
//! what makes many concurrent writers cheap.

mod answer;
mod config;
mod prepare;
mod session;
mod writer;

use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Instant;

use crossbeam_channel::{Sender, bounded};
use std::collections::HashMap;

use crate::crypto::Keyring;
use crate::error::{WriteError, WriteErrorKind};
use crate::memstore::{MemStore, lock};
use crate::mutation::Mutation;
use crate::stats::StoreStats;
use crate::storage::Storage;
use crate::transaction::{Overlay, TxnFn};
use crate::wal::chain::ChainState;
use crate::wal::{SegmentPreallocator, SegmentSeeds, WalSegment};

pub use answer::{AnswerBatch, AnswerContext, AnswerOnce, Responder, TxnAck, WriteAck};
pub use config::{CommitListener, GroupCommitConfig, MAX_NAMESPACES, SyncPolicy};
pub(crate) use prepare::quota_check;
pub use session::{NamespaceGuard, WriteSession};
use writer::Writer;

/// Most mutations one transaction may emit; past it, it is rolled back.
pub const MAX_TXN_MUTATIONS: usize = 65_536;

enum WriterCommand {
    Write {
        mutation: Mutation,
        reply: Responder<WriteAck>,
        guard: Option<NamespaceGuard>,
    },
    Transact {
        txn: TxnFn,
        reply: Responder<TxnAck>,
        guard: Option<NamespaceGuard>,
    },
    /// Close the current segment (sync it) and start the next; answers the
    /// first LSN of the new segment: every LSN below it is in closed segments.
    Roll {
        reply: Sender<Result<u64, WriteError>>,
    },
    Stop,
}

/// Lets the checkpointer ask the writer to close its segment.
pub(crate) struct SegmentRoller {
    tx: Sender<WriterCommand>,
}

impl SegmentRoller {
    pub(crate) fn roll(&self) -> Result<u64, WriteError> {
        let stopped = || WriteError::new(WriteErrorKind::ShuttingDown, "the writer has stopped");
        let (reply, answer) = bounded(1);
        self.tx
            .send(WriterCommand::Roll { reply })
            .map_err(|_| stopped())?;
        answer.recv().map_err(|_| stopped())?
    }
}

fn stopped() -> WriteError {
    WriteError::new(WriteErrorKind::ShuttingDown, "the writer has stopped")
}

/// Owner of the writer thread. Shared by reference (shutdown takes `&self`)
/// so the server can stop it while connection threads still hold the engine.
pub struct GroupCommit {
    tx: Mutex<Option<Sender<WriterCommand>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl GroupCommit {
    // Each argument is a distinct piece the engine assembled at startup;
    // a struct holding them for one call would only rename the list.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        storage: Arc<dyn Storage>,
        wal_dir: PathBuf,
        segment: WalSegment,
        next_lsn: u64,
        mem: Arc<MemStore>,
        stats: Arc<StoreStats>,
        config: GroupCommitConfig,
        keyring: Option<Arc<Keyring>>,
        seeds: SegmentSeeds,
        chain: Option<ChainState>,
    ) -> io::Result<GroupCommit> {
        assert!(config.max_group_records > 0 && config.queue_capacity > 0);
        let (tx, rx) = bounded(config.queue_capacity);
        let preallocator = SegmentPreallocator::start(
            Arc::clone(&storage),
            wal_dir.clone(),
            config.segment_bytes,
        )?;
        let answer_batch = config.answer_batch.map(|make| make());
        let writer = Writer {
            storage,
            wal_dir,
            segment,
            seeds,
            preallocator,
            next_lsn,
            mem,
            stats,
            failed: None,
            unsynced_writes: 0,
            last_sync: Instant::now(),
            buf: Vec::with_capacity(1024 * 1024),
            overlay: Overlay::default(),
            config,
            keyring,
            group_usage: HashMap::new(),
            scratch: Vec::new(),
            chain,
            answer_batch,
        };
        let thread = thread::Builder::new()
            .name("cube-writer".into())
            .spawn(move || {
                // A panic here is a broken invariant (an assertion). Going
                // on without the writer would leave every in-flight write
                // unanswered and its client waiting for ever, so the
                // process stops instead: clients see the daemon gone,
                // every acknowledged write is on disk, and a restart
                // recovers from the log. The panic's message is already on
                // stderr (the default hook ran before unwinding got here).
                let ran =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| writer.run(&rx)));
                if ran.is_err() {
                    eprintln!(
                        "cube-writer panicked (above); stopping the process so no client \
                         waits for an answer that will never come"
                    );
                    std::process::abort();
                }
            })?;
        Ok(GroupCommit {
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
        })
    }

    pub(crate) fn roller(&self) -> Option<SegmentRoller> {
        Some(SegmentRoller {
            tx: lock(&self.tx).clone()?,
        })
    }

    /// A new session, or `None` once shutdown has begun.
    pub fn session(&self) -> Option<WriteSession> {
        Some(WriteSession::new(lock(&self.tx).clone()?))
    }

    /// Lets everything already queued commit, syncs, and stops the thread.
    pub fn shutdown(&self) {
        if let Some(tx) = lock(&self.tx).take() {
            let _ = tx.send(WriterCommand::Stop);
        }
        let thread = lock(&self.thread).take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

impl Drop for GroupCommit {
    fn drop(&mut self) {
        self.shutdown();
    }
}
