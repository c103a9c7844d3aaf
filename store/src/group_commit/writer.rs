//! The writer thread: takes a group off the queue, prepares it
//! (`prepare.rs`), logs it in one `write` and one `fdatasync`, applies it
//! to the `MemStore` and answers it.

use std::any::Any;
use std::collections::HashMap;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use cube_protocol::NamespaceName;

use super::WriterCommand;
use super::answer::{AnswerBatch, GroupAnswers, Responder, TxnAck, WriteAck};
use super::config::{GroupCommitConfig, SyncPolicy};
use super::session::NamespaceGuard;
use crate::crypto::Keyring;
use crate::crypto::MAC_BYTES;
use crate::error::{WriteError, WriteErrorKind};
use crate::memstore::MemStore;
use crate::mutation::Mutation;
use crate::namespace::UsageDelta;
use crate::stats::StoreStats;
use crate::storage::Storage;
use crate::transaction::{Overlay, TxnFn};
use crate::wal::chain::{ChainState, encode_chain_record, group_mac};
use crate::wal::record::{encode_record, encode_sealed_record, reseed_records};
use crate::wal::{SegmentPreallocator, SegmentSeeds, WalSegment};

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
pub(super) enum Queued {
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

/// A prepared entry: its mutations are final and have LSNs.
pub(super) enum Prepared {
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
    pub(super) fn mutations(&self) -> &[Mutation] {
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

    pub(super) fn refuse(self, error: WriteError) {
        match self {
            Prepared::Write { reply, .. } => reply.answer(Err(error)),
            Prepared::Txn { reply, .. } => reply.answer(Err(error)),
        }
    }
}

pub(super) struct Writer {
    pub(super) storage: Arc<dyn Storage>,
    pub(super) wal_dir: PathBuf,
    pub(super) segment: WalSegment,
    /// The checksum seed of each segment this writer starts.
    pub(super) seeds: SegmentSeeds,
    pub(super) preallocator: SegmentPreallocator,
    pub(super) next_lsn: u64,
    pub(super) mem: Arc<MemStore>,
    pub(super) stats: Arc<StoreStats>,
    /// Set by the first I/O failure; from then on every write is refused.
    pub(super) failed: Option<String>,
    pub(super) unsynced_writes: u64,
    pub(super) last_sync: Instant,
    pub(super) buf: Vec<u8>,
    pub(super) overlay: Overlay,
    pub(super) config: GroupCommitConfig,
    /// Seals records of encrypted namespaces; `None` without a master key.
    pub(super) keyring: Option<Arc<Keyring>>,
    /// Usage changes of quota-limited namespaces accepted into this group.
    pub(super) group_usage: HashMap<NamespaceName, UsageDelta>,
    /// Reused for sealing payloads.
    pub(super) scratch: Vec<u8>,
    /// With a master key: the log's chain after the last group written
    /// (wal/chain.rs). Every group then ends with a chain record.
    pub(super) chain: Option<ChainState>,
    /// Made from `config.answer_batch` at start; handed to each durable
    /// group's answers.
    pub(super) answer_batch: Option<Box<dyn AnswerBatch>>,
}

/// What the writer found waiting for the next group.
enum Waited {
    Command(WriterCommand),
    /// Nothing came before a relaxed sync fell due.
    SyncDue,
    /// Every sender is gone.
    Closed,
}

/// Why gathering a group stopped short of its limits, if it did.
#[derive(Default)]
struct GroupEnd {
    /// A stop: the writer ends after this group.
    stopping: bool,
    /// A roll: answered after this group is committed.
    roll_reply: Option<Sender<Result<u64, WriteError>>>,
}

/// How sealing a group's payloads went.
#[derive(Default)]
struct GroupSealing {
    /// Why a payload (or the group's MAC) could not be sealed: the group
    /// is then refused.
    failure: Option<String>,
    /// Whether a payload was sealed under (this start, an LSN of this
    /// group): those LSNs must then never be handed out again.
    sealed_any: bool,
}

/// Refuses every queued command of a group: the writer is latched after
/// a storage failure.
fn refuse_while_failed(group: &mut Vec<Queued>, reason: &str) {
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

    pub(super) fn run(mut self, rx: &Receiver<WriterCommand>) {
        let mut group: Vec<Queued> = Vec::with_capacity(self.config.max_group_records);
        // Whether the last group held a single request: one client at a
        // time, the case where polling pays (see `WRITER_SPIN`).
        let mut lone_request = false;
        loop {
            let first = match self.next_command(rx, lone_request) {
                Waited::Command(command) => command,
                Waited::SyncDue => {
                    self.sync_relaxed();
                    continue;
                }
                Waited::Closed => break,
            };
            let end = self.gather_group(first, rx, &mut group);
            lone_request = group.len() == 1;
            if !group.is_empty() {
                self.commit_split(&mut group);
            }
            if let Some(reply) = end.roll_reply {
                let _ = reply.send(self.roll());
            }
            if end.stopping {
                break;
            }
        }
        // Whatever was acknowledged under a relaxed policy gets its sync now.
        if self.unsynced_writes > 0 && self.failed.is_none() {
            self.sync_relaxed();
        }
    }

    /// Waits for the first command of the next group: spinning a while
    /// after a lone request, and no later than a relaxed sync falls due.
    fn next_command(&self, rx: &Receiver<WriterCommand>, lone_request: bool) -> Waited {
        let received = match self.sync_deadline() {
            None if lone_request => match spin_for_next(rx) {
                Some(command) => Ok(command),
                None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            },
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(deadline) => rx.recv_timeout(deadline.saturating_duration_since(Instant::now())),
        };
        match received {
            Ok(command) => Waited::Command(command),
            Err(RecvTimeoutError::Timeout) => Waited::SyncDue,
            Err(RecvTimeoutError::Disconnected) => Waited::Closed,
        }
    }

    /// Queues `first` and whatever is already waiting into `group`, up to
    /// the group's record and byte limits, a roll or a stop.
    fn gather_group(
        &self,
        first: WriterCommand,
        rx: &Receiver<WriterCommand>,
        group: &mut Vec<Queued>,
    ) -> GroupEnd {
        let mut end = GroupEnd::default();
        let mut group_bytes = 0usize;
        let mut next = Some(first);
        while let Some(command) = next.take() {
            match command {
                WriterCommand::Stop => {
                    end.stopping = true;
                    break;
                }
                WriterCommand::Roll { reply } => {
                    // Writes queued before the roll go into the old segment.
                    end.roll_reply = Some(reply);
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
        end
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
        // Every record before `first_lsn` is applied, none after: the fold
        // of the segment closing now takes its counts from here.
        self.mem.mark_counts(first_lsn - 1);
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

    /// Prepares the group, logs it (one append, then a sync as the policy
    /// says), then applies it to the store and answers it.
    fn commit(&mut self, group: &mut Vec<Queued>) {
        if let Some(reason) = &self.failed {
            refuse_while_failed(group, reason);
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
        let first_lsn = self.next_lsn;
        let mut sealing = self.encode_group(&mut prepared, records);
        let chain_mac = match self.end_group_with_chain() {
            Ok(mac) => mac,
            Err(reason) => {
                sealing.failure.get_or_insert(reason);
                None
            }
        };
        if let Some(reason) = sealing.failure {
            self.refuse_unsealable(prepared, first_lsn, sealing.sealed_any, &reason);
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
        self.apply_and_answer(prepared, first_lsn, last_lsn, records);
        // Memtables of namespaces on disk past their budget: a pause that
        // grows with the excess slows writers smoothly until a fold frees
        // memory (never a wait for it; `crate::disk_tier`).
        let pause_us = self.mem.write_pause_us(records);
        if pause_us > 0 {
            self.stats
                .write_pause_us
                .fetch_add(pause_us, std::sync::atomic::Ordering::Relaxed);
            std::thread::sleep(std::time::Duration::from_micros(pause_us));
        }
    }

    /// Encodes the group's records into `buf`, giving each entry its LSNs
    /// and each namespace create its id (and key check).
    fn encode_group(&mut self, prepared: &mut [Prepared], records: usize) -> GroupSealing {
        self.buf.clear();
        let mut sealing = GroupSealing::default();
        let mut written = 0usize;
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
                            Err(e) => sealing.failure = Some(e.to_string()),
                        }
                    }
                }
                let group_end = written == records && self.chain.is_none();
                self.encode_mutation(mutation, lsn, group_end, &mut sealing);
                self.next_lsn += 1;
            }
        }
        sealing
    }

    /// Encodes one record into `buf`, sealed if its namespace is encrypted.
    fn encode_mutation(
        &mut self,
        mutation: &Mutation,
        lsn: u64,
        group_end: bool,
        sealing: &mut GroupSealing,
    ) {
        let sealed_id = match self.keyring.as_deref() {
            Some(keyring) if keyring.has_key() && !mutation.is_namespace_change() => {
                self.mem.sealed_id(mutation.namespace())
            }
            _ => None,
        };
        match (sealed_id, self.keyring.as_deref()) {
            // After a failure nothing more is sealed: the group is
            // refused anyway.
            (Some(_), Some(_)) if sealing.failure.is_some() => {}
            (Some(ns_id), Some(keyring)) => {
                sealing.sealed_any = true;
                if let Err(e) = encode_sealed_record(
                    &mut self.buf,
                    &mut self.scratch,
                    lsn,
                    mutation,
                    group_end,
                    keyring,
                    ns_id,
                    self.segment.crc_seed(),
                    self.chain.as_ref().map(|c| &c.dir_id),
                ) {
                    sealing.failure = Some(e.to_string());
                }
            }
            _ => encode_record(
                &mut self.buf,
                lsn,
                mutation,
                group_end,
                self.segment.crc_seed(),
            ),
        }
    }

    /// Applies a durable group to the store, hands its mutations to the
    /// commit listener, and answers it.
    fn apply_and_answer(
        &mut self,
        mut prepared: Vec<Prepared>,
        first_lsn: u64,
        last_lsn: u64,
        records: usize,
    ) {
        let mutations: Vec<&Mutation> = prepared.iter().flat_map(|p| p.mutations()).collect();
        let mut existed = Vec::with_capacity(records);
        self.mem.apply_group(&mutations, last_lsn, &mut existed);
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

    /// Answers every entry of a durable (and applied) group.
    fn answer(&mut self, prepared: Vec<Prepared>, existed: &[bool]) {
        let mut answers = GroupAnswers::new(self.answer_batch.take());
        let mut at = 0usize;
        for entry in prepared {
            match entry {
                Prepared::Write { reply, lsn, .. } => {
                    let existed = existed.get(at).copied().unwrap_or(false);
                    at += 1;
                    reply.answer_in(Ok(WriteAck { lsn, existed }), answers.context());
                }
                Prepared::Txn {
                    mutations,
                    output,
                    reply,
                    first_lsn,
                } => {
                    at += mutations.len();
                    reply.answer_in(
                        Ok(TxnAck {
                            output,
                            first_lsn,
                            mutations: mutations.len(),
                        }),
                        answers.context(),
                    );
                }
            }
        }
        self.answer_batch = answers.finish();
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
