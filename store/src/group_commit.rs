//! The single writer thread and its group commit.
//!
//! Connection threads send [`Mutation`]s over a bounded channel. The writer
//! blocks for the first, drains whatever else is already waiting (up to
//! [`GroupCommitConfig::max_group_records`] and `max_group_bytes`), encodes
//! the group into one buffer, issues one `write` and one `fdatasync`,
//! applies the group to the [`MemStore`], and only then answers each
//! request. While it syncs, the next group queues up behind it, which is
//! what makes many concurrent writers cheap.

use std::io;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, bounded};

use std::any::Any;
use std::collections::HashMap;

use cube_protocol::NamespaceName;

use crate::crypto::Keyring;
use crate::crypto::MAC_BYTES;
use crate::error::{WriteError, WriteErrorKind};
use crate::memstore::MemStore;
use crate::mutation::Mutation;
use crate::namespace::{UsageDelta, check_quota};
use crate::stats::StoreStats;
use crate::storage::Storage;
use crate::transaction::{Overlay, TxnFn, TxnView};
use crate::wal::chain::{ChainState, encode_chain_record, group_mac};
use crate::wal::record::{encode_record, encode_sealed_record, reseed_records};
use crate::wal::{SegmentPreallocator, SegmentSeeds, WalSegment};

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
    /// Called on the writer thread around the answers of each durable
    /// group ([`Responder::Callback`]s among them), so a caller can gather
    /// the answers it sends and send each client's together (the server
    /// sends a connection's answers of one group in one `send`).
    pub answer_hooks: Option<AnswerHooks>,
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

/// See [`GroupCommitConfig::answer_hooks`]. Plain functions: they run on
/// the writer thread and keep their state there (thread-local).
#[derive(Clone, Copy, Debug)]
pub struct AnswerHooks {
    /// Before the first answer of a group.
    pub before: fn(),
    /// After the last one, also if an answer panicked.
    pub after: fn(),
}

/// Calls [`AnswerHooks::after`] when dropped.
struct AfterAnswers(Option<AnswerHooks>);

impl Drop for AfterAnswers {
    fn drop(&mut self) {
        if let Some(hooks) = self.0 {
            (hooks.after)();
        }
    }
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
            answer_hooks: None,
            commit_listener: None,
        }
    }
}

/// What a durable write answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteAck {
    pub lsn: u64,
    /// Whether the cell had a value before this write.
    pub existed: bool,
}

type Reply = Result<WriteAck, WriteError>;

/// Where the answer to a write goes.
pub enum Responder<T> {
    /// A channel the caller blocks on.
    Channel(Sender<Result<T, WriteError>>),
    /// Called on the writer thread once the write's group is durable (or
    /// the write is refused). It runs between groups, so it must be quick
    /// and must never block: a non-blocking socket send, say.
    Callback(AnswerOnce<T>),
}

impl<T> Responder<T> {
    fn answer(self, result: Result<T, WriteError>) {
        match self {
            Responder::Channel(tx) => {
                let _ = tx.send(result);
            }
            Responder::Callback(mut callback) => {
                if let Some(callback) = callback.0.take() {
                    callback(result);
                }
            }
        }
    }
}

/// A callback that is called exactly once: with the write's outcome, or,
/// if it is dropped unanswered (a command still queued when the writer
/// stops, say), with `ShuttingDown`. A caller waiting on it (a connection
/// waiting for its pipelined answers) is never left waiting for ever.
/// (A dropped [`Responder::Channel`] says the same by disconnecting.)
pub struct AnswerOnce<T>(Option<AnswerFn<T>>);

type AnswerFn<T> = Box<dyn FnOnce(Result<T, WriteError>) + Send>;

impl<T> AnswerOnce<T> {
    pub fn new(callback: impl FnOnce(Result<T, WriteError>) + Send + 'static) -> AnswerOnce<T> {
        AnswerOnce(Some(Box::new(callback)))
    }
}

impl<T> Drop for AnswerOnce<T> {
    fn drop(&mut self) {
        if let Some(callback) = self.0.take() {
            callback(Err(stopped()));
        }
    }
}

/// What a committed transaction answers.
pub struct TxnAck {
    /// What the transaction's closure returned.
    pub output: Box<dyn Any + Send>,
    /// The LSN of its first mutation, 0 if it wrote nothing.
    pub first_lsn: u64,
    pub mutations: usize,
}

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

/// How long the idle writer polls its queue, after a group of one request,
/// before it sleeps. A lone client sends its next request a few tens of
/// microseconds after its answer; polling that long spares the writer a
/// sleep and a futex wake-up on the path of every request. Only after a
/// group of one: under load, polling would take the CPU the connection
/// threads need (polling after every group cost about 20 % of the puts at
/// 16 and 64 clients on two cores).
const WRITER_SPIN: Duration = Duration::from_micros(50);

/// The next command if one arrives within [`WRITER_SPIN`].
fn spin_for_next(rx: &Receiver<WriterCommand>) -> Option<WriterCommand> {
    let started = Instant::now();
    loop {
        if let Ok(command) = rx.try_recv() {
            return Some(command);
        }
        if started.elapsed() >= WRITER_SPIN {
            return None;
        }
        for _ in 0..64 {
            std::hint::spin_loop();
        }
    }
}

fn stopped() -> WriteError {
    WriteError::new(WriteErrorKind::ShuttingDown, "the writer has stopped")
}

/// A connection's handle to the writer, with its own reusable reply slot.
pub struct WriteSession {
    tx: Sender<WriterCommand>,
    reply_tx: Sender<Reply>,
    reply_rx: Receiver<Reply>,
    guard: Option<NamespaceGuard>,
}

impl WriteSession {
    /// Pins the following writes to a namespace id (`None`: no pin).
    pub fn set_guard(&mut self, guard: Option<NamespaceGuard>) {
        self.guard = guard;
    }

    /// Blocks until the write is durable (under [`SyncPolicy::Always`]) or refused.
    pub fn write(&self, mutation: Mutation) -> Result<WriteAck, WriteError> {
        self.tx
            .send(WriterCommand::Write {
                mutation,
                reply: Responder::Channel(self.reply_tx.clone()),
                guard: self.guard.clone(),
            })
            .map_err(|_| stopped())?;
        self.reply_rx.recv().map_err(|_| stopped())?
    }

    /// Queues the write and returns at once; `on_done` runs on the writer
    /// thread when it is durable or refused (see [`Responder::Callback`]).
    /// Saves the caller a sleep and a wake-up per write.
    pub fn submit(&self, mutation: Mutation, on_done: impl FnOnce(Reply) + Send + 'static) {
        let command = WriterCommand::Write {
            mutation,
            reply: Responder::Callback(AnswerOnce::new(on_done)),
            guard: self.guard.clone(),
        };
        if let Err(crossbeam_channel::SendError(command)) = self.tx.send(command)
            && let WriterCommand::Write { reply, .. } = command
        {
            reply.answer(Err(stopped()));
        }
    }

    /// Runs `txn` on the writer thread against the latest state and commits
    /// what it emits atomically; blocks until that is durable. Returns the
    /// closure's result and the LSN of its first mutation (0 if none).
    pub fn transact<R: Send + 'static>(
        &self,
        txn: impl FnOnce(&mut TxnView<'_>) -> R + Send + 'static,
    ) -> Result<(R, u64), WriteError> {
        let (reply, answer) = bounded(1);
        self.tx
            .send(WriterCommand::Transact {
                txn: Box::new(move |view: &mut TxnView<'_>| {
                    Box::new(txn(view)) as Box<dyn Any + Send>
                }),
                reply: Responder::Channel(reply),
                guard: self.guard.clone(),
            })
            .map_err(|_| stopped())?;
        let ack = answer.recv().map_err(|_| stopped())??;
        downcast_ack(ack)
    }

    /// Queues `txn` like [`WriteSession::transact`] and returns at once;
    /// `on_done` runs on the writer thread with the closure's result and
    /// the LSN of its first mutation once they are durable, or with the
    /// refusal (see [`Responder::Callback`]: it must be quick and must
    /// never block). Saves the caller a sleep and a wake-up per
    /// transaction.
    pub fn transact_then<R: Send + 'static>(
        &self,
        txn: impl FnOnce(&mut TxnView<'_>) -> R + Send + 'static,
        on_done: impl FnOnce(Result<(R, u64), WriteError>) + Send + 'static,
    ) {
        let command = WriterCommand::Transact {
            txn: Box::new(move |view: &mut TxnView<'_>| Box::new(txn(view)) as Box<dyn Any + Send>),
            reply: Responder::Callback(AnswerOnce::new(
                move |result: Result<TxnAck, WriteError>| {
                    on_done(result.and_then(downcast_ack));
                },
            )),
            guard: self.guard.clone(),
        };
        if let Err(crossbeam_channel::SendError(command)) = self.tx.send(command)
            && let WriterCommand::Transact { reply, .. } = command
        {
            reply.answer(Err(stopped()));
        }
    }
}

/// A transaction's output as the type its closure returned.
fn downcast_ack<R: 'static>(ack: TxnAck) -> Result<(R, u64), WriteError> {
    let output = ack.output.downcast::<R>().map_err(|_| {
        WriteError::new(
            WriteErrorKind::Invalid,
            "transaction output of an unexpected type",
        )
    })?;
    Ok((*output, ack.first_lsn))
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
        let (reply_tx, reply_rx) = bounded(1);
        Some(WriteSession {
            tx: lock(&self.tx).clone()?,
            reply_tx,
            reply_rx,
            guard: None,
        })
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

/// [`Writer::check_quota`], callable while a transaction borrows the overlay.
pub(crate) fn quota_check(
    mem: &MemStore,
    group_usage: &HashMap<NamespaceName, UsageDelta>,
    ns: &NamespaceName,
    delta: UsageDelta,
) -> Result<(), WriteError> {
    let Some(quota) = mem.namespace_quota(ns) else {
        return Ok(());
    };
    if quota.is_unlimited() {
        return Ok(());
    }
    let usage = mem.namespace_usage(ns).unwrap_or_default();
    let mut total = group_usage.get(ns).copied().unwrap_or_default();
    total.add(delta);
    check_quota(ns, &quota, usage, total)
        .map_err(|message| WriteError::new(WriteErrorKind::QuotaExceeded, message))
}

fn no_such_namespace(ns: &NamespaceName) -> WriteError {
    WriteError::new(
        WriteErrorKind::NoSuchNamespace,
        format!("no such namespace {:?}", ns.as_str()),
    )
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Moves a durable, applied group's mutations out for a
/// [`CommitListener`], leaving a cheap stand-in of the same namespace in
/// each place (answering needs only how many there were).
fn take_mutations(prepared: &mut [Prepared]) -> Vec<Mutation> {
    let mut taken = Vec::with_capacity(prepared.iter().map(|p| p.mutations().len()).sum());
    for entry in prepared {
        for mutation in entry.mutations_mut() {
            let stand_in = Mutation::NamespaceDrop {
                ns: mutation.namespace().clone(),
            };
            taken.push(std::mem::replace(mutation, stand_in));
        }
    }
    taken
}

/// A command of the group being built, before it is prepared.
enum Queued {
    Write {
        mutation: Mutation,
        reply: Responder<WriteAck>,
        guard: Option<NamespaceGuard>,
    },
    Txn {
        txn: TxnFn,
        reply: Responder<TxnAck>,
        guard: Option<NamespaceGuard>,
    },
}

/// Pins a session's writes to the namespace the caller authorized them
/// against: if that namespace was dropped (or dropped and created again
/// under the same name, by someone else) before the writer reaches a write,
/// the write is refused as for a missing namespace instead of landing in
/// a namespace its sender was never allowed into.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceGuard {
    pub ns: NamespaceName,
    pub id: u64,
}

/// A prepared entry: its mutations are final and have LSNs.
enum Prepared {
    Write {
        mutation: Mutation,
        reply: Responder<WriteAck>,
        lsn: u64,
    },
    Txn {
        mutations: Vec<Mutation>,
        output: Box<dyn Any + Send>,
        reply: Responder<TxnAck>,
        first_lsn: u64,
    },
}

impl Prepared {
    fn mutations(&self) -> &[Mutation] {
        match self {
            Prepared::Write { mutation, .. } => std::slice::from_ref(mutation),
            Prepared::Txn { mutations, .. } => mutations,
        }
    }

    fn mutations_mut(&mut self) -> &mut [Mutation] {
        match self {
            Prepared::Write { mutation, .. } => std::slice::from_mut(mutation),
            Prepared::Txn { mutations, .. } => mutations,
        }
    }

    fn refuse(self, error: WriteError) {
        match self {
            Prepared::Write { reply, .. } => reply.answer(Err(error)),
            Prepared::Txn { reply, .. } => reply.answer(Err(error)),
        }
    }
}

struct Writer {
    storage: Arc<dyn Storage>,
    wal_dir: PathBuf,
    segment: WalSegment,
    /// The checksum seed of each segment this writer starts.
    seeds: SegmentSeeds,
    preallocator: SegmentPreallocator,
    next_lsn: u64,
    mem: Arc<MemStore>,
    stats: Arc<StoreStats>,
    /// Set by the first I/O failure; from then on every write is refused.
    failed: Option<String>,
    unsynced_writes: u64,
    last_sync: Instant,
    buf: Vec<u8>,
    overlay: Overlay,
    config: GroupCommitConfig,
    /// Seals records of encrypted namespaces; `None` without a master key.
    keyring: Option<Arc<Keyring>>,
    /// Usage changes of quota-limited namespaces accepted into this group.
    group_usage: HashMap<NamespaceName, UsageDelta>,
    /// Reused for sealing payloads.
    scratch: Vec<u8>,
    /// With a master key: the log's chain after the last group written
    /// (wal/chain.rs). Every group then ends with a chain record.
    chain: Option<ChainState>,
}

/// Whether a queued command creates or drops a namespace: those commit in
/// a group of their own, so no other entry of a group ever sees a
/// namespace appear or vanish under it.
fn is_namespace_lifecycle(queued: &Queued) -> bool {
    matches!(
        queued,
        Queued::Write {
            mutation: Mutation::NamespaceCreate { .. } | Mutation::NamespaceDrop { .. },
            ..
        }
    )
}

impl Writer {
    /// Commits the group, with namespace creates and drops split out into
    /// groups of their own (they are rare; the extra fsync does not matter).
    fn commit_split(&mut self, group: &mut Vec<Queued>) {
        if !group.iter().any(is_namespace_lifecycle) {
            self.commit(group);
            return;
        }
        let mut batch = Vec::with_capacity(group.len());
        for queued in group.drain(..) {
            if is_namespace_lifecycle(&queued) {
                if !batch.is_empty() {
                    self.commit(&mut batch);
                }
                let mut single = vec![queued];
                self.commit(&mut single);
            } else {
                batch.push(queued);
            }
        }
        if !batch.is_empty() {
            self.commit(&mut batch);
        }
    }

    /// Refuses a write that would take a quota-limited namespace past its
    /// quota, counting what this group already accepted.
    fn check_quota(&self, ns: &NamespaceName, delta: UsageDelta) -> Result<(), WriteError> {
        quota_check(&self.mem, &self.group_usage, ns, delta)
    }

    /// A guarded write whose namespace is gone or is another one now.
    fn guard_refusal(&self, guard: Option<&NamespaceGuard>) -> Option<WriteError> {
        let guard = guard?;
        (self.mem.namespace_id(&guard.ns) != Some(guard.id)).then(|| no_such_namespace(&guard.ns))
    }

    fn namespace_limited(&self, ns: &NamespaceName) -> bool {
        self.mem
            .namespace_quota(ns)
            .is_some_and(|quota| !quota.is_unlimited())
    }

    /// Refuses a create past the namespaces its owner may hold.
    fn check_owner_limit(&self, owner_uid: u32) -> Result<(), WriteError> {
        let most = self.config.max_namespaces_per_owner;
        if most == usize::MAX || self.config.unlimited_owners.contains(&owner_uid) {
            return Ok(());
        }
        let owned = self.mem.namespaces_owned_by(owner_uid);
        if owned >= most {
            return Err(WriteError::new(
                WriteErrorKind::LimitExceeded,
                format!(
                    "uid {owner_uid} owns {owned} namespaces, the most one uid may \
                     (--max-namespaces-per-uid {most}); drop one (cubec ns drop NAME) first"
                ),
            ));
        }
        Ok(())
    }

    /// Checks a namespace create or drop against the store (it commits
    /// alone, so nothing earlier in its group can change the answer).
    fn check_namespace_change(&self, mutation: &Mutation) -> Result<(), WriteError> {
        match mutation {
            Mutation::NamespaceCreate { ns, meta } => {
                if self.mem.has_namespace(ns) {
                    return Err(WriteError::new(
                        WriteErrorKind::NamespaceExists,
                        format!("namespace {:?} exists already", ns.as_str()),
                    ));
                }
                let count = self.mem.namespace_count();
                if count >= self.config.max_namespaces {
                    return Err(WriteError::new(
                        WriteErrorKind::QuotaExceeded,
                        format!(
                            "cubed holds {count} namespaces, its limit; drop one (cubec ns drop NAME) before creating another"
                        ),
                    ));
                }
                self.check_owner_limit(meta.owner_uid)?;
                if meta.encrypted && !self.keyring.as_ref().is_some_and(|k| k.has_key()) {
                    return Err(WriteError::new(
                        WriteErrorKind::EncryptionUnavailable,
                        "an encrypted namespace needs a master key: start cubed with --key-file PATH",
                    ));
                }
                Ok(())
            }
            Mutation::NamespaceDrop { ns } | Mutation::NamespaceAlter { ns, .. }
                if !self.mem.has_namespace(ns) =>
            {
                Err(no_such_namespace(ns))
            }
            _ => Ok(()),
        }
    }
    fn run(mut self, rx: &Receiver<WriterCommand>) {
        let mut group: Vec<Queued> = Vec::with_capacity(self.config.max_group_records);
        let mut stopping = false;
        // Whether the last group held a single request: one client at a
        // time, the case where polling pays (see `WRITER_SPIN`).
        let mut lone_request = false;
        while !stopping {
            let first = match self.sync_deadline() {
                None if lone_request => match spin_for_next(rx) {
                    Some(command) => Some(command),
                    None => rx.recv().ok(),
                },
                None => rx.recv().ok(),
                Some(deadline) => {
                    match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                        Ok(command) => Some(command),
                        Err(RecvTimeoutError::Timeout) => {
                            self.sync_relaxed();
                            continue;
                        }
                        Err(RecvTimeoutError::Disconnected) => None,
                    }
                }
            };
            let Some(first) = first else { break };
            let mut group_bytes = 0usize;
            let mut next = Some(first);
            let mut roll_reply = None;
            while let Some(command) = next.take() {
                match command {
                    WriterCommand::Stop => {
                        stopping = true;
                        break;
                    }
                    WriterCommand::Roll { reply } => {
                        // Writes queued before the roll go into the old segment.
                        roll_reply = Some(reply);
                        break;
                    }
                    WriterCommand::Write {
                        mutation,
                        reply,
                        guard,
                    } => {
                        group_bytes += mutation.payload_len();
                        group.push(Queued::Write {
                            mutation,
                            reply,
                            guard,
                        });
                    }
                    WriterCommand::Transact { txn, reply, guard } => {
                        group.push(Queued::Txn { txn, reply, guard });
                    }
                }
                if group.len() < self.config.max_group_records
                    && group_bytes < self.config.max_group_bytes
                {
                    next = rx.try_recv().ok();
                }
            }
            lone_request = group.len() == 1;
            if !group.is_empty() {
                self.commit_split(&mut group);
            }
            if let Some(reply) = roll_reply {
                let _ = reply.send(self.roll());
            }
        }
        // Whatever was acknowledged under a relaxed policy gets its sync now.
        if self.unsynced_writes > 0 && self.failed.is_none() {
            self.sync_relaxed();
        }
    }

    fn roll(&mut self) -> Result<u64, WriteError> {
        if let Some(reason) = &self.failed {
            return Err(WriteError::new(
                WriteErrorKind::WritesDisabled,
                format!("writes are disabled after an earlier storage failure: {reason}"),
            ));
        }
        if self.segment.holds_no_records() {
            return Ok(self.segment.first_lsn());
        }
        let first_lsn = self.next_lsn;
        let result = self.roll_segment(first_lsn);
        if let Err((kind, reason)) = result {
            self.failed = Some(reason.clone());
            self.stats.set_failure(&reason);
            return Err(WriteError::new(kind, reason));
        }
        Ok(first_lsn)
    }

    /// Syncs the current segment and installs the prepared next one.
    fn roll_segment(&mut self, first_lsn: u64) -> Result<(), (WriteErrorKind, String)> {
        let failure = |what: String, e: &dyn std::fmt::Display, full: bool| {
            let kind = if full {
                WriteErrorKind::DiskFull
            } else {
                WriteErrorKind::StorageIo
            };
            (kind, format!("{what}: {e}"))
        };
        self.segment.sync().map_err(|e| {
            failure(
                format!("fdatasync of {}", self.segment.path().display()),
                &e,
                e.kind() == io::ErrorKind::StorageFull,
            )
        })?;
        let is_full = |e: &crate::StoreError| matches!(e, crate::StoreError::Io { source, .. } if source.kind() == io::ErrorKind::StorageFull);
        let prepared = self
            .preallocator
            .take()
            .map_err(|e| failure("starting a new WAL segment failed".into(), &e, is_full(&e)))?;
        self.segment = prepared
            .install(
                self.storage.as_ref(),
                &self.wal_dir,
                first_lsn,
                self.seeds.for_segment(first_lsn),
                self.chain.as_ref(),
            )
            .map_err(|e| failure("starting a new WAL segment failed".into(), &e, is_full(&e)))?;
        self.stats
            .segments_created
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Under the interval policy, the moment the pending writes must be synced.
    fn sync_deadline(&self) -> Option<Instant> {
        match self.config.sync {
            SyncPolicy::Interval { every, .. } if self.unsynced_writes > 0 => {
                Some(self.last_sync + every)
            }
            _ => None,
        }
    }

    fn commit(&mut self, group: &mut Vec<Queued>) {
        if let Some(reason) = &self.failed {
            let error = WriteError::new(
                WriteErrorKind::WritesDisabled,
                format!(
                    "writes are disabled after an earlier storage failure: {reason}; restart cubed to recover from the log"
                ),
            );
            for queued in group.drain(..) {
                match queued {
                    Queued::Write { reply, .. } => reply.answer(Err(error.clone())),
                    Queued::Txn { reply, .. } => reply.answer(Err(error.clone())),
                }
            }
            return;
        }
        let mut prepared = self.prepare(group);
        let records: usize = prepared.iter().map(|p| p.mutations().len()).sum();
        if records == 0 {
            // Only read-only transactions, which read nothing undurable
            // (there was no earlier write in this group): answer now.
            self.answer(prepared, &[]);
            return;
        }
        self.buf.clear();
        let first_lsn = self.next_lsn;
        let mut written = 0usize;
        let mut seal_failure = None;
        // Whether a payload was sealed under (this start, an LSN of this
        // group): those LSNs must then never be handed out again.
        let mut sealed_any = false;
        for entry in prepared.iter_mut() {
            let entry_lsn = self.next_lsn;
            match entry {
                Prepared::Write { lsn, .. } => *lsn = entry_lsn,
                Prepared::Txn {
                    first_lsn,
                    mutations,
                    ..
                } => {
                    *first_lsn = if mutations.is_empty() { 0 } else { entry_lsn };
                }
            }
            for mutation in entry.mutations_mut() {
                written += 1;
                let lsn = self.next_lsn;
                if let Mutation::NamespaceCreate { meta, .. } = mutation {
                    // A namespace's id is the LSN that created it: unique
                    // forever, so no key or state entry is ever shared
                    // with a namespace dropped before it.
                    meta.id = lsn;
                    if meta.encrypted
                        && let Some(keyring) = &self.keyring
                    {
                        match keyring.key_check(lsn) {
                            Ok(check) => {
                                meta.key_check = check;
                                keyring.mark_verified(lsn);
                            }
                            Err(e) => seal_failure = Some(e.to_string()),
                        }
                    }
                }
                let sealed_id = match self.keyring.as_deref() {
                    Some(keyring) if keyring.has_key() && !mutation.is_namespace_change() => {
                        self.mem.sealed_id(mutation.namespace())
                    }
                    _ => None,
                };
                match (sealed_id, self.keyring.as_deref()) {
                    // After a failure nothing more is sealed: the group is
                    // refused anyway.
                    (Some(_), Some(_)) if seal_failure.is_some() => {}
                    (Some(ns_id), Some(keyring)) => {
                        sealed_any = true;
                        if let Err(e) = encode_sealed_record(
                            &mut self.buf,
                            &mut self.scratch,
                            lsn,
                            mutation,
                            written == records && self.chain.is_none(),
                            keyring,
                            ns_id,
                            self.segment.crc_seed(),
                            self.chain.as_ref().map(|c| &c.dir_id),
                        ) {
                            seal_failure = Some(e.to_string());
                        }
                    }
                    _ => encode_record(
                        &mut self.buf,
                        lsn,
                        mutation,
                        written == records && self.chain.is_none(),
                        self.segment.crc_seed(),
                    ),
                }
                self.next_lsn += 1;
            }
        }
        let chain_mac = match self.end_group_with_chain() {
            Ok(mac) => mac,
            Err(reason) => {
                seal_failure.get_or_insert(reason);
                None
            }
        };
        if let Some(reason) = seal_failure {
            self.refuse_unsealable(prepared, first_lsn, sealed_any, &reason);
            return;
        }
        let last_lsn = self.next_lsn - 1;
        assert_eq!(
            last_lsn - first_lsn + 1,
            records as u64 + u64::from(chain_mac.is_some()),
            "LSNs in a group are contiguous"
        );

        if let Err(failure) = self.write_group(first_lsn, records as u64) {
            self.fail(prepared, &failure);
            return;
        }
        if let (Some(chain), Some(mac)) = (self.chain.as_mut(), chain_mac) {
            chain.prev = mac;
        }
        self.stats
            .record_group(records as u64, self.buf.len() as u64, last_lsn);

        let mutations: Vec<&Mutation> = prepared.iter().flat_map(|p| p.mutations()).collect();
        let mut existed = Vec::with_capacity(records);
        self.mem.apply_group(&mutations, &mut existed);
        drop(mutations);
        if let Some(listener) = &self.config.commit_listener {
            listener.applied(first_lsn, last_lsn, &mut || take_mutations(&mut prepared));
        }
        self.answer(prepared, &existed);
    }

    /// In a chained log, appends the chain record that ends the group in
    /// `buf` (it takes the next LSN) and returns its MAC, which becomes the
    /// chain value once the group is written.
    fn end_group_with_chain(&mut self) -> Result<Option<[u8; MAC_BYTES]>, String> {
        let (Some(chain), Some(keyring)) = (self.chain.as_ref(), self.keyring.as_deref()) else {
            return Ok(None);
        };
        let lsn = self.next_lsn;
        let mac = group_mac(keyring, chain, &self.buf, lsn).map_err(|e| e.to_string())?;
        encode_chain_record(&mut self.buf, lsn, &mac, self.segment.crc_seed());
        self.next_lsn += 1;
        Ok(Some(mac))
    }

    /// Refuses a group that could not be sealed. Nothing was written. If
    /// no payload of it was sealed, its LSNs are handed out again and the
    /// writer carries on. If one was, a (key, nonce) pair of this start
    /// has been used, and reusing its LSN would seal other plaintext
    /// under the same pair, which breaks AES-GCM: the writer latches
    /// instead, and a restart (a new start id, so new keys) recovers.
    fn refuse_unsealable(
        &mut self,
        prepared: Vec<Prepared>,
        first_lsn: u64,
        sealed_any: bool,
        reason: &str,
    ) {
        let error = if sealed_any {
            let latched = format!(
                "could not seal the write ({reason}); writes are disabled until cubed restarts, \
                 so that no nonce is ever used twice"
            );
            self.failed = Some(latched.clone());
            self.stats.set_failure(&latched);
            WriteError::new(WriteErrorKind::WritesDisabled, latched)
        } else {
            self.next_lsn = first_lsn;
            WriteError::new(
                WriteErrorKind::EncryptionUnavailable,
                format!("could not seal the write: {reason}"),
            )
        };
        for entry in prepared {
            entry.refuse(error.clone());
        }
    }

    /// Checks each write, runs each transaction in order against the store
    /// plus the group's earlier writes, and returns the group's entries.
    fn prepare(&mut self, group: &mut Vec<Queued>) -> Vec<Prepared> {
        let mut prepared: Vec<Prepared> = Vec::with_capacity(group.len());
        // The overlay is built only once a transaction needs it.
        let mut overlay_live = false;
        self.overlay.clear();
        self.group_usage.clear();
        for queued in group.drain(..) {
            match queued {
                Queued::Write {
                    mutation,
                    reply,
                    guard,
                } => {
                    if let Some(error) = self.guard_refusal(guard.as_ref()) {
                        reply.answer(Err(error));
                        continue;
                    }
                    let ns = mutation.namespace();
                    if mutation.is_namespace_change() {
                        if let Err(error) = self.check_namespace_change(&mutation) {
                            reply.answer(Err(error));
                            continue;
                        }
                    } else if !self.mem.has_namespace(ns) {
                        reply.answer(Err(no_such_namespace(ns)));
                        continue;
                    }
                    if !overlay_live && self.namespace_limited(ns) {
                        // Quotas need the group's earlier writes to judge
                        // this one: build the overlay now.
                        for entry in &prepared {
                            for earlier in entry.mutations() {
                                self.overlay.record(&self.mem, earlier);
                            }
                        }
                        overlay_live = true;
                    }
                    if overlay_live && self.namespace_limited(ns) {
                        let delta = self.overlay.usage_change(&self.mem, &mutation);
                        if let Err(error) = self.check_quota(ns, delta) {
                            reply.answer(Err(error));
                            continue;
                        }
                        self.group_usage.entry(ns.clone()).or_default().add(delta);
                    }
                    if overlay_live {
                        self.overlay.record(&self.mem, &mutation);
                    }
                    prepared.push(Prepared::Write {
                        mutation,
                        reply,
                        lsn: 0,
                    });
                }
                Queued::Txn { txn, reply, guard } => {
                    if let Some(error) = self.guard_refusal(guard.as_ref()) {
                        reply.answer(Err(error));
                        continue;
                    }
                    if !overlay_live {
                        for entry in &prepared {
                            for mutation in entry.mutations() {
                                self.overlay.record(&self.mem, mutation);
                            }
                        }
                        overlay_live = true;
                    }
                    let mut view = TxnView::new(&self.mem, &mut self.overlay);
                    view.set_earlier_usage(&self.group_usage);
                    let output = txn(&mut view);
                    let refusal = if view.emitted() > MAX_TXN_MUTATIONS {
                        Some(WriteError::new(
                            WriteErrorKind::Invalid,
                            format!(
                                "the transaction wrote {} cells, over the limit of {MAX_TXN_MUTATIONS}; nothing was applied",
                                view.emitted()
                            ),
                        ))
                    } else {
                        None
                    };
                    let refusal = refusal.or_else(|| {
                        view.pending_namespaces()
                            .find(|ns| !self.mem.has_namespace(ns))
                            .map(no_such_namespace)
                    });
                    let refusal = refusal.or_else(|| {
                        view.usage_changes().iter().find_map(|(ns, delta)| {
                            quota_check(&self.mem, &self.group_usage, ns, *delta).err()
                        })
                    });
                    if let Some(error) = refusal {
                        view.rollback();
                        reply.answer(Err(error));
                        continue;
                    }
                    for (ns, delta) in view.usage_changes() {
                        self.group_usage.entry(ns.clone()).or_default().add(*delta);
                    }
                    prepared.push(Prepared::Txn {
                        mutations: view.into_mutations(),
                        output,
                        reply,
                        first_lsn: 0,
                    });
                }
            }
        }
        prepared
    }

    /// Answers every entry of a durable (and applied) group.
    fn answer(&mut self, prepared: Vec<Prepared>, existed: &[bool]) {
        let hooks = self.config.answer_hooks;
        if let Some(hooks) = hooks {
            (hooks.before)();
        }
        let _after = AfterAnswers(hooks);
        let mut at = 0usize;
        for entry in prepared {
            match entry {
                Prepared::Write { reply, lsn, .. } => {
                    let existed = existed.get(at).copied().unwrap_or(false);
                    at += 1;
                    reply.answer(Ok(WriteAck { lsn, existed }));
                }
                Prepared::Txn {
                    mutations,
                    output,
                    reply,
                    first_lsn,
                } => {
                    at += mutations.len();
                    reply.answer(Ok(TxnAck {
                        output,
                        first_lsn,
                        mutations: mutations.len(),
                    }));
                }
            }
        }
    }

    /// Appends the encoded group (rolling the segment first if it is full)
    /// and syncs as the policy says.
    fn write_group(
        &mut self,
        first_lsn: u64,
        records: u64,
    ) -> Result<(), (WriteErrorKind, String)> {
        let io_failure = |what: &str, path: &std::path::Path, e: &io::Error| {
            let kind = if e.kind() == io::ErrorKind::StorageFull {
                WriteErrorKind::DiskFull
            } else {
                WriteErrorKind::StorageIo
            };
            (kind, format!("{what} {} failed: {e}", path.display()))
        };
        if !self.segment.holds_no_records()
            && self.segment.len_bytes() + self.buf.len() as u64 > self.config.segment_bytes
        {
            // The closed segment must be complete on disk before records
            // land in its successor, whatever the sync policy.
            self.roll_segment(first_lsn)?;
            // The group was checksummed for the segment it no longer goes to.
            reseed_records(&mut self.buf, self.segment.crc_seed());
        }
        self.segment
            .append(&self.buf)
            .map_err(|e| io_failure("write to", self.segment.path(), &e))?;
        match self.config.sync {
            SyncPolicy::Always => self
                .sync_now()
                .map_err(|e| io_failure("fdatasync of", self.segment.path(), &e)),
            SyncPolicy::Interval { every, max_writes } => {
                self.unsynced_writes += records;
                if self.unsynced_writes >= max_writes || self.last_sync.elapsed() >= every {
                    self.sync_relaxed();
                }
                Ok(())
            }
            SyncPolicy::Never => Ok(()),
        }
    }

    fn sync_now(&mut self) -> io::Result<()> {
        let started = Instant::now();
        self.segment.sync()?;
        self.stats
            .record_fsync(started.elapsed().as_micros() as u64);
        self.unsynced_writes = 0;
        self.last_sync = Instant::now();
        Ok(())
    }

    /// A sync of writes that were already acknowledged: a failure cannot be
    /// reported to them, so it latches the writer and is logged loudly.
    fn sync_relaxed(&mut self) {
        if let Err(e) = self.sync_now() {
            let reason = format!(
                "fdatasync of {} failed: {e}; writes acknowledged since the last sync may be lost",
                self.segment.path().display()
            );
            eprintln!("cubed: error: {reason}");
            self.failed = Some(reason.clone());
            self.stats.set_failure(&reason);
        }
    }

    /// Latches the writer and tells every request in the group why.
    fn fail(&mut self, group: Vec<Prepared>, failure: &(WriteErrorKind, String)) {
        let (kind, reason) = failure;
        eprintln!(
            "cubed: error: {reason}; refusing all further writes until restart (reads continue)"
        );
        self.failed = Some(reason.clone());
        self.stats.set_failure(reason);
        self.stats
            .write_errors
            .fetch_add(group.len() as u64, std::sync::atomic::Ordering::Relaxed);
        // Not "not stored": after a failed fdatasync the bytes may still
        // reach the disk, or be read back from the page cache by the next
        // start's recovery (docs/protocol.md, `storage_io`).
        let error = WriteError::new(
            *kind,
            format!("write not acknowledged (whether a restart keeps it is unspecified): {reason}"),
        );
        for entry in group {
            entry.refuse(error.clone());
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

    /// A callback answer is given exactly once: with the outcome, or with
    /// `ShuttingDown` when its command is dropped unanswered (a past bug:
    /// a connection waiting for such an answer waited for ever).
    #[test]
    fn a_callback_is_answered_once_even_when_dropped_unanswered() {
        let answers = Arc::new(Mutex::new(Vec::new()));
        let responder = |answers: &Arc<Mutex<Vec<Result<u64, WriteErrorKind>>>>| {
            let answers = Arc::clone(answers);
            Responder::Callback(AnswerOnce::new(move |r: Result<WriteAck, WriteError>| {
                answers
                    .lock()
                    .unwrap()
                    .push(r.map(|ack| ack.lsn).map_err(|e| e.kind));
            }))
        };
        responder(&answers).answer(Ok(WriteAck {
            lsn: 7,
            existed: false,
        }));
        drop(responder(&answers));
        assert_eq!(
            *answers.lock().unwrap(),
            vec![Ok(7), Err(WriteErrorKind::ShuttingDown)]
        );
    }
}
