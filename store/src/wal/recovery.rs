//! Reading the log back at start.
//!
//! Segments are read in LSN order and every record's CRC is checked. The
//! rules, from the strictest:
//! - A damaged header in any segment, a bad record in any segment but the
//!   last, a record whose LSN is not the next one, or a gap in LSNs between
//!   segments: **corruption**. Recovery refuses with file, offset and reason.
//! - A bad record in the last segment with no *later commit group* after it
//!   (at most valid records of its own group): a **torn tail**, a crash in
//!   the middle of writing a group that was never acknowledged. The whole
//!   group is dropped (zeroed) and reported. Records are applied a group at
//!   a time, so a torn group never shows up half-applied.
//! - A bad record in the last segment followed by a later group: corruption.
//! - A last segment shorter than its header: a segment whose creation was
//!   torn; it holds no records, so it is removed.
//!
//! A read can be wrong without the file being so (a bit flipped between
//! the platter and memory, a read cut short). So before recovery acts on
//! damage (zeroes a torn tail, removes a torn creation, cuts under
//! `--repair`, or names a corruption) it reads the segment again: if the
//! two reads differ, it refuses with an I/O error naming the file and the
//! first offset where they differ, and changes nothing. Zeroing a "torn
//! tail" that was only misread would destroy acknowledged commit groups.
//!
//! With [`RecoveryOptions::repair`], corruption is cut instead of refused:
//! the log is truncated at the first bad point, later segments are moved
//! aside, and the dropped bytes are saved under `wal/repair-<unix-secs>/`.

use byteorder::{ByteOrder, LittleEndian};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::crypto::{DIR_ID_BYTES, Keyring, MAC_BYTES, tags_equal};
use crate::data_dir::sync_dir;
use crate::error::StoreError;
use crate::mutation::{
    KIND_DEL, KIND_DETACH, KIND_LINK, KIND_NAMESPACE_ALTER, KIND_NAMESPACE_CREATE,
    KIND_NAMESPACE_DROP, KIND_PROGRAM_DEL, KIND_PROGRAM_PUT, KIND_PUT, KIND_TELEMETRY, KIND_UNLINK,
    Mutation,
};
use crate::namespace::check_namespace_key;
use crate::storage::{OpenMode, Storage};
use crate::wal::chain::{ChainState, KIND_CHAIN, group_mac};
use crate::wal::crc_seed::CrcSeed;
use crate::wal::record::{
    GROUP_END_BIT, MAX_RECORD_PAYLOAD_BYTES, RECORD_HEADER_BYTES, RawRecord, RecordDamage,
    RecordOpenError, SEALED_BIT, decode_record, parse_record,
};
use crate::wal::sealing_rule::SealingRule;
use crate::wal::segment::{
    PREPARED_SUFFIX, SegmentHeader, header_bytes_needed, parse_segment_file_name,
    parse_segment_header,
};

#[derive(Clone, Debug, Default)]
pub struct RecoveryOptions {
    /// Truncate at the first bad record instead of refusing to start.
    pub repair: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TornTail {
    pub path: PathBuf,
    pub offset: u64,
    pub bytes_truncated: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepairReport {
    pub path: PathBuf,
    pub offset: u64,
    pub reason: String,
    pub bytes_dropped: u64,
    pub segments_dropped: usize,
    pub saved_to: PathBuf,
}

/// The segment recovery ended on, for the writer to append to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TailSegment {
    pub path: PathBuf,
    /// Its first LSN, and the seed and version its appends must keep.
    pub header: SegmentHeader,
    pub len_bytes: u64,
}

#[derive(Clone, Debug)]
pub struct RecoveryReport {
    pub segments: usize,
    pub records_replayed: u64,
    /// The LSN the next record gets.
    pub next_lsn: u64,
    pub wal_bytes: u64,
    pub torn_tail: Option<TornTail>,
    pub torn_segment_removed: Option<PathBuf>,
    pub repaired: Option<RepairReport>,
    pub tail: Option<TailSegment>,
    /// Where the log's chain stands after the last whole group (`None`:
    /// the log is not chained).
    pub chain: Option<ChainState>,
    pub duration: Duration,
}

struct BadPoint {
    segment: usize,
    /// Where the damage is (what a refusal names).
    offset: u64,
    reason: String,
    /// Where `--repair` cuts: the start of the commit group holding the
    /// damage, so that no part of a group survives without its end.
    cut: Cut,
}

/// Where a segment can be cut so that only whole commit groups remain,
/// and the LSN the next record then gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Cut {
    pub(crate) offset: u64,
    pub(crate) next_lsn: u64,
}

/// Where the log's chain must stand at a known point: from the
/// authenticated manifest, the chain value at its checkpoint LSN, and the
/// data dir's id.
#[derive(Clone, Copy, Debug, Default)]
pub struct ChainAnchor {
    pub at: Option<(u64, ChainState)>,
    /// The manifest's tag verified under this key: a MAC that fails later
    /// is tampering, not a wrong key.
    pub key_confirmed: bool,
}

/// The chain as replay goes: what it checks against and where it stands.
pub(crate) struct ChainCheck<'k> {
    /// Verifies MACs (a key); without one, chain records are skipped.
    keyring: Option<&'k Keyring>,
    anchor: Option<(u64, ChainState)>,
    /// The chain value after the last whole chained group read.
    pub(crate) state: Option<ChainState>,
    /// A group's MAC verified under this key (or the manifest's did).
    key_confirmed: bool,
    /// The first MAC failed before anything confirmed the key: the reason,
    /// reported once replay ends (never repaired).
    pub(crate) suspect_key: Option<String>,
    /// A key was given (whether or not it turned out suspect).
    has_key: bool,
}

impl<'k> ChainCheck<'k> {
    pub(crate) fn new(keyring: Option<&'k Keyring>, anchor: ChainAnchor) -> ChainCheck<'k> {
        let keyring = keyring.filter(|k| k.has_key());
        ChainCheck {
            keyring,
            anchor: anchor.at,
            state: None,
            key_confirmed: anchor.key_confirmed,
            suspect_key: None,
            has_key: keyring.is_some(),
        }
    }

    /// Checks a segment's header against the chain: a chained segment must
    /// continue it (and carry the data dir's id), and once the log is
    /// chained, every later segment must be.
    fn enter_segment(&mut self, header: &SegmentHeader) -> Result<(), String> {
        let expected = match self.anchor {
            Some((lsn, at)) if header.first_lsn == lsn + 1 => Some(at),
            Some((lsn, _)) if header.first_lsn <= lsn => None,
            _ => self.state,
        };
        match (header.chain, expected) {
            (Some(chain), Some(expected)) if chain.dir_id != expected.dir_id => Err(
                "the segment belongs to another data dir (its data dir id differs): it was \
                 copied in from elsewhere"
                    .into(),
            ),
            (Some(chain), Some(expected)) if chain.prev != expected.prev => Err(
                "the segment does not continue the log's chain: a segment or commit group \
                 before it was removed or replaced, or it comes from another copy of the data dir"
                    .into(),
            ),
            (Some(chain), _) => {
                self.state = Some(chain);
                Ok(())
            }
            (None, Some(expected))
                if self.has_key && (self.state.is_some() || expected.prev != [0; MAC_BYTES]) =>
            {
                Err(
                    "an unchained segment where the log is chained: it was written without the \
                 master key, or forged"
                        .into(),
                )
            }
            (None, _) => Ok(()),
        }
    }

    /// Verifies a chain record ending the group `records` (the group's
    /// other records, back to back); on success the chain moves on.
    fn close_group(&mut self, records: &[u8], lsn: u64, payload: &[u8]) -> Result<(), ReplayStop> {
        let Some(state) = self.state else {
            return Err(ReplayStop::Damage(
                0,
                "a chain record in a segment that is not chained".into(),
                Cut {
                    offset: 0,
                    next_lsn: lsn,
                },
            ));
        };
        let Ok(stored) = <[u8; MAC_BYTES]>::try_from(payload) else {
            return Err(ReplayStop::Damage(
                0,
                format!("a chain record of {} bytes", payload.len()),
                Cut {
                    offset: 0,
                    next_lsn: lsn,
                },
            ));
        };
        if let Some(keyring) = self.keyring {
            let ok = group_mac(keyring, &state, records, lsn)
                .is_ok_and(|computed| tags_equal(&computed, &stored));
            if !ok && !self.key_confirmed {
                // Most likely the wrong key. Replay goes on unverified, so
                // that a namespace's key check can name what the key
                // locks; recovery refuses at its end all the same.
                self.suspect_key.get_or_insert(format!(
                    "the commit group ending at LSN {lsn} does not authenticate under this master \
                     key: start cubed with the key this data dir was written with (if it is that \
                     key, the log was tampered with: `cubed --verify DIR --key-file KEY`)"
                ));
                self.keyring = None;
            }
            if !ok && self.keyring.is_some() {
                return Err(ReplayStop::Damage(
                    0,
                    "commit group MAC mismatch: a record of this group was altered, removed, \
                     added or reordered, or the group comes from another copy of the data dir"
                        .into(),
                    Cut {
                        offset: 0,
                        next_lsn: lsn,
                    },
                ));
            }
            self.key_confirmed |= ok;
        }
        self.state = Some(ChainState {
            prev: stored,
            ..state
        });
        Ok(())
    }

    /// Whether the log read so far is chained.
    pub(crate) fn is_chained(&self) -> bool {
        self.state.is_some()
    }
}

/// Whether the last segment's bytes are a creation a crash tore before its
/// header reached the disk (shorter than a header, or all zeros): no record
/// can have been acknowledged from it, so recovery removes it.
pub(crate) fn is_torn_creation(bytes: &[u8]) -> bool {
    bytes.len() < header_bytes_needed(bytes) || is_zero(bytes)
}

/// Replays every record in `wal_dir` after `checkpoint_lsn` (what the
/// checkpoint files already hold), in LSN order, into `apply`.
pub fn recover(
    storage: &dyn Storage,
    wal_dir: &Path,
    checkpoint_lsn: u64,
    options: &RecoveryOptions,
    keyring: Option<&Keyring>,
    apply: impl FnMut(u64, Mutation),
) -> Result<RecoveryReport, StoreError> {
    let mut rule = SealingRule::default();
    recover_with(
        storage,
        wal_dir,
        checkpoint_lsn,
        options,
        keyring,
        &mut rule,
        ChainAnchor::default(),
        apply,
    )
}

/// [`recover`], checking each replayed record against `rule` (seeded with
/// the namespaces of the checkpoint): a data record of an encrypted
/// namespace must be sealed, and no other may be. A chained log must
/// continue from `anchor` (the authenticated manifest's chain value).
#[allow(clippy::too_many_arguments)]
pub fn recover_with(
    storage: &dyn Storage,
    wal_dir: &Path,
    checkpoint_lsn: u64,
    options: &RecoveryOptions,
    keyring: Option<&Keyring>,
    rule: &mut SealingRule,
    anchor: ChainAnchor,
    mut apply: impl FnMut(u64, Mutation),
) -> Result<RecoveryReport, StoreError> {
    let started = Instant::now();
    let mut segments = list_segments(storage, wal_dir, true)?;
    remove_covered_segments(storage, wal_dir, &mut segments, checkpoint_lsn)?;
    let mut replay = LogReplay {
        storage,
        wal_dir,
        checkpoint_lsn,
        options,
        keyring,
        rule,
        chain: ChainCheck::new(keyring, anchor),
        report: RecoveryReport::starting_at(checkpoint_lsn + 1),
        expected_lsn: None,
        tail_header: None,
        tail_end: 0,
    };
    let mut index = 0;
    while index < segments.len() {
        if let Next::Stop = replay.segment(&mut segments, index, &mut apply)? {
            break;
        }
        index += 1;
    }
    replay.finish(segments, started)
}

impl RecoveryReport {
    /// A report of no segments yet, the log resuming at `next_lsn`.
    pub(crate) fn starting_at(next_lsn: u64) -> RecoveryReport {
        RecoveryReport {
            segments: 0,
            records_replayed: 0,
            next_lsn,
            wal_bytes: 0,
            torn_tail: None,
            torn_segment_removed: None,
            repaired: None,
            tail: None,
            chain: None,
            duration: Duration::ZERO,
        }
    }
}

/// Removes the segments wholly inside the checkpoint: left over from a
/// crash between the checkpoint's manifest update and their removal.
fn remove_covered_segments(
    storage: &dyn Storage,
    wal_dir: &Path,
    segments: &mut Vec<(u64, PathBuf)>,
    checkpoint_lsn: u64,
) -> Result<(), StoreError> {
    let mut covered_removed = false;
    while segments.len() >= 2 && segments[1].0 <= checkpoint_lsn + 1 {
        let (_, path) = segments.remove(0);
        storage
            .remove_file(&path)
            .map_err(|e| StoreError::io(&path, e))?;
        covered_removed = true;
    }
    if covered_removed {
        sync_dir(storage, wal_dir)?;
    }
    Ok(())
}

/// Whether [`LogReplay::segment`] leaves later segments to replay.
enum Next {
    Continue,
    Stop,
}

/// [`recover_with`]'s state while it replays the segments in order.
struct LogReplay<'a> {
    storage: &'a dyn Storage,
    wal_dir: &'a Path,
    checkpoint_lsn: u64,
    options: &'a RecoveryOptions,
    keyring: Option<&'a Keyring>,
    rule: &'a mut SealingRule,
    chain: ChainCheck<'a>,
    report: RecoveryReport,
    /// The LSN the next segment must start at (`None` before the first).
    expected_lsn: Option<u64>,
    /// The header of the last segment read, and where its valid records end.
    tail_header: Option<SegmentHeader>,
    tail_end: u64,
}

impl LogReplay<'_> {
    /// Replays segment `index`, or removes it if its creation was torn,
    /// or cuts the log there under `--repair`.
    fn segment(
        &mut self,
        segments: &mut Vec<(u64, PathBuf)>,
        index: usize,
        apply: &mut impl FnMut(u64, Mutation),
    ) -> Result<Next, StoreError> {
        let (first_lsn, path) = segments[index].clone();
        let is_last = index + 1 == segments.len();
        let bytes = self
            .storage
            .read_file(&path)
            .map_err(|e| StoreError::io(&path, e))?;
        if is_last && is_torn_creation(&bytes) {
            // Creation was torn before the header reached the disk: the
            // writer only appends after the header is synced, so no record
            // can have been acknowledged from this file.
            confirm_read(self.storage, &path, &bytes)?;
            self.storage
                .remove_file(&path)
                .map_err(|e| StoreError::io(&path, e))?;
            sync_dir(self.storage, self.wal_dir)?;
            self.report.torn_segment_removed = Some(path);
            segments.pop();
            return Ok(Next::Stop);
        }
        let outcome = self.replay(&bytes, index, first_lsn, is_last, apply);
        if matches!(
            outcome,
            Ok(SegmentEnd::TornAt { .. }) | Err(ReplayStop::Damage(..))
        ) {
            confirm_read(self.storage, &path, &bytes)?;
        }
        // Replay succeeds, or repair keeps part of it, only past a valid header.
        let header = parse_segment_header(&bytes).ok();
        match outcome {
            Ok(SegmentEnd::Clean { next_lsn, end }) => {
                self.report.wal_bytes += end;
                self.records_end(header, next_lsn, end);
            }
            Ok(SegmentEnd::TornAt { offset, next_lsn }) => {
                let torn_end = offset + nonzero_len(&bytes[offset as usize..]) as u64;
                zero_durably(self.storage, &path, offset, torn_end)?;
                self.report.torn_tail = Some(TornTail {
                    path: path.clone(),
                    offset,
                    bytes_truncated: torn_end - offset,
                });
                self.report.wal_bytes += offset;
                self.records_end(header, next_lsn, offset);
            }
            Err(ReplayStop::Key(reason)) => return Err(StoreError::Key(reason)),
            Err(ReplayStop::Damage(offset, reason, cut)) => {
                let bad = BadPoint {
                    segment: index,
                    offset,
                    reason,
                    cut,
                };
                self.cut_at(segments, path, header, bad, &bytes)?;
                return Ok(Next::Stop);
            }
        }
        Ok(Next::Continue)
    }

    /// The segment's records end at `end`, before LSN `next_lsn`.
    fn records_end(&mut self, header: Option<SegmentHeader>, next_lsn: u64, end: u64) {
        self.expected_lsn = Some(next_lsn);
        self.tail_header = header;
        self.tail_end = end;
    }

    /// Replays one segment's records, refusing an oldest segment that
    /// starts after the checkpoint's next LSN.
    fn replay(
        &mut self,
        bytes: &[u8],
        index: usize,
        first_lsn: u64,
        is_last: bool,
        apply: &mut impl FnMut(u64, Mutation),
    ) -> Result<SegmentEnd, ReplayStop> {
        let checkpoint_lsn = self.checkpoint_lsn;
        if index == 0 && first_lsn > checkpoint_lsn + 1 {
            return Err(ReplayStop::Damage(
                0,
                format!(
                    "LSN gap: the checkpoint holds LSNs up to {checkpoint_lsn}, \
                     but the oldest WAL segment starts at LSN {first_lsn}"
                ),
                Cut {
                    offset: 0,
                    next_lsn: first_lsn,
                },
            ));
        }
        replay_segment(
            bytes,
            first_lsn,
            self.expected_lsn,
            is_last,
            checkpoint_lsn,
            self.keyring,
            Some(&mut *self.rule),
            &mut self.chain,
            apply,
            &mut self.report,
        )
    }

    /// Damage at `bad` (in `bad_segment`, the segment's bytes as read,
    /// twice): refused, or under `--repair` the log is cut there and the
    /// segments after it are set aside.
    fn cut_at(
        &mut self,
        segments: &mut Vec<(u64, PathBuf)>,
        path: PathBuf,
        header: Option<SegmentHeader>,
        bad: BadPoint,
        bad_segment: &[u8],
    ) -> Result<(), StoreError> {
        if !self.options.repair {
            return Err(StoreError::Corruption {
                path,
                offset: bad.offset,
                reason: bad.reason,
            });
        }
        let repair = repair_at(self.storage, self.wal_dir, segments, &bad, bad_segment)?;
        segments.truncate(if bad.cut.offset == 0 {
            bad.segment
        } else {
            bad.segment + 1
        });
        self.report.repaired = Some(repair);
        if bad.cut.offset > 0 {
            self.report.wal_bytes += bad.cut.offset;
            self.records_end(header, bad.cut.next_lsn, bad.cut.offset);
        }
        // Otherwise the damaged segment is gone, and the previous one (if
        // any) is the tail again: its replay ended clean on a whole group,
        // and `records_end` kept its header and end. (Reading it again to
        // find its end would trust a read that may be wrong: an end found
        // too early would have the writer overwrite acknowledged records.)
        Ok(())
    }

    /// The report once every segment is read: where the log resumes, its
    /// tail segment, and whether the key fits the log.
    fn finish(
        mut self,
        mut segments: Vec<(u64, PathBuf)>,
        started: Instant,
    ) -> Result<RecoveryReport, StoreError> {
        let checkpoint_lsn = self.checkpoint_lsn;
        if let Some(next) = self.expected_lsn {
            self.report.next_lsn = next;
        }
        if self.report.next_lsn <= checkpoint_lsn {
            // The log ends inside the checkpoint: a segment whose removal a
            // crash interrupted, cut short by `--repair`. Appending to it would
            // hand out LSNs the checkpoint already holds, which the next start
            // skips as folded (acknowledged writes lost, namespace ids reused).
            // Everything left is covered, so it goes, and the writer starts a
            // new segment just after the checkpoint.
            for (_, path) in segments.drain(..) {
                self.storage
                    .remove_file(&path)
                    .map_err(|e| StoreError::io(&path, e))?;
            }
            sync_dir(self.storage, self.wal_dir)?;
            self.report.next_lsn = checkpoint_lsn + 1;
        }
        assert!(
            self.report.next_lsn > checkpoint_lsn,
            "recovery resumes at LSN {} inside the checkpoint (up to {checkpoint_lsn})",
            self.report.next_lsn
        );
        self.report.segments = segments.len();
        if let Some((first_lsn, path)) = segments.last() {
            let header = self
                .tail_header
                .expect("a kept segment was read past a valid header");
            assert!(
                header.first_lsn == *first_lsn && self.tail_end >= header.header_bytes as u64,
                "a kept segment has a whole header"
            );
            self.report.tail = Some(TailSegment {
                path: path.clone(),
                header,
                len_bytes: self.tail_end,
            });
        }
        self.check_key()?;
        self.report.chain = self.chain.state;
        self.report.duration = started.elapsed();
        Ok(self.report)
    }

    /// Refuses a key the chain found suspect, and a chained log read
    /// without a key.
    fn check_key(&mut self) -> Result<(), StoreError> {
        if let Some(reason) = self.chain.suspect_key.take() {
            return Err(StoreError::Key(reason));
        }
        if self.chain.is_chained() && !self.chain.has_key {
            return Err(StoreError::Key(format!(
                "the log in {} is chained under a master key (it was written by cubed with \
                 --key-file); start cubed with --key-file PATH (the key it was written with)",
                self.wal_dir.display()
            )));
        }
        Ok(())
    }
}

pub(crate) enum SegmentEnd {
    /// Records end at `end`: the file ends there or only zeros follow
    /// (preallocated space).
    #[allow(dead_code)]
    Clean {
        next_lsn: u64,
        end: u64,
    },
    TornAt {
        offset: u64,
        next_lsn: u64,
    },
}

/// Why a replay stopped.
pub(crate) enum ReplayStop {
    /// The offset of the damage, the reason, and where `--repair` would cut
    /// (the start of the damaged group).
    Damage(u64, String, Cut),
    /// A key problem (missing or wrong master key): never repaired.
    Key(String),
}

/// Replays one segment.
// Shared by recovery and `--verify`, which pass different sinks and limits.
#[allow(clippy::too_many_arguments)]
pub(crate) fn replay_segment(
    bytes: &[u8],
    name_lsn: u64,
    expected_lsn: Option<u64>,
    is_last: bool,
    checkpoint_lsn: u64,
    keyring: Option<&Keyring>,
    rule: Option<&mut SealingRule>,
    chain: &mut ChainCheck<'_>,
    apply: &mut impl FnMut(u64, Mutation),
    report: &mut RecoveryReport,
) -> Result<SegmentEnd, ReplayStop> {
    let header = check_segment_header(bytes, name_lsn, expected_lsn, chain)?;
    let mut replay = SegmentReplay {
        bytes,
        seed: header.crc_seed,
        is_last,
        chained: header.chain.is_some(),
        dir_id: header.chain.map(|c| c.dir_id),
        checkpoint_lsn,
        keyring,
        rule,
        chain,
        apply,
        report,
        offset: header.header_bytes,
        next_lsn: header.first_lsn,
        pending: Vec::new(),
        committed: Cut {
            offset: header.header_bytes as u64,
            next_lsn: header.first_lsn,
        },
    };
    replay.records()
}

/// Parses a segment's header and checks that it starts where its file
/// name and the previous segment say, and continues the log's chain.
fn check_segment_header(
    bytes: &[u8],
    name_lsn: u64,
    expected_lsn: Option<u64>,
    chain: &mut ChainCheck<'_>,
) -> Result<SegmentHeader, ReplayStop> {
    let whole = |next_lsn| Cut {
        offset: 0,
        next_lsn,
    };
    let header = parse_segment_header(bytes)
        .map_err(|reason| ReplayStop::Damage(0, reason, whole(name_lsn)))?;
    let first_lsn = header.first_lsn;
    if first_lsn != name_lsn {
        return Err(ReplayStop::Damage(
            0,
            format!("header says first LSN {first_lsn}, the file name says {name_lsn}"),
            whole(name_lsn),
        ));
    }
    if let Some(expected) = expected_lsn
        && first_lsn != expected
    {
        return Err(ReplayStop::Damage(
            0,
            format!(
                "LSN gap: this segment starts at LSN {first_lsn}, the previous one ended before LSN {expected}"
            ),
            whole(expected),
        ));
    }
    chain
        .enter_segment(&header)
        .map_err(|reason| ReplayStop::Damage(0, reason, whole(first_lsn)))?;
    Ok(header)
}

/// [`replay_segment`]'s state past the header: where it stands in the
/// segment, and what each record is checked against and applied to.
struct SegmentReplay<'a, 'k, F> {
    bytes: &'a [u8],
    seed: CrcSeed,
    is_last: bool,
    chained: bool,
    dir_id: Option<[u8; DIR_ID_BYTES]>,
    checkpoint_lsn: u64,
    keyring: Option<&'a Keyring>,
    rule: Option<&'a mut SealingRule>,
    chain: &'a mut ChainCheck<'k>,
    apply: &'a mut F,
    report: &'a mut RecoveryReport,
    /// Where the next record starts, and the LSN it must have.
    offset: usize,
    next_lsn: u64,
    // Records are applied a whole commit group at a time: `pending` holds
    // the group being read, `committed` where the last whole group ended.
    pending: Vec<(u64, Mutation)>,
    committed: Cut,
}

impl<F: FnMut(u64, Mutation)> SegmentReplay<'_, '_, F> {
    /// Reads the records up to the end of the file or the zeros after the
    /// last one, and says where the segment's whole groups end.
    fn records(&mut self) -> Result<SegmentEnd, ReplayStop> {
        let bytes = self.bytes;
        while self.offset < bytes.len() {
            match parse_record(&bytes[self.offset..], self.seed) {
                Ok(record) => self.record(&record)?,
                Err(_) if is_zero(&bytes[self.offset..]) => break,
                Err(damage) => return self.damaged(&damage),
            }
        }
        if !self.pending.is_empty() {
            if self.is_last {
                return Ok(SegmentEnd::TornAt {
                    offset: self.committed.offset,
                    next_lsn: self.committed.next_lsn,
                });
            }
            return Err(ReplayStop::Damage(
                self.committed.offset,
                "the segment ends inside a commit group, and it is not the last".into(),
                self.committed,
            ));
        }
        Ok(SegmentEnd::Clean {
            next_lsn: self.next_lsn,
            end: self.offset as u64,
        })
    }

    /// Checks one valid record and adds it to its group; the group's last
    /// record applies the group.
    fn record(&mut self, record: &RawRecord<'_>) -> Result<(), ReplayStop> {
        if record.lsn != self.next_lsn {
            return Err(self.damage(format!(
                "record has LSN {}, expected {}",
                record.lsn, self.next_lsn
            )));
        }
        let ends_group = if record.kind == KIND_CHAIN || (self.chained && record.group_end) {
            self.close_chained_group(record)?;
            true
        } else {
            let mutation = self.open_record(record)?;
            self.pending.push((record.lsn, mutation));
            record.group_end
        };
        self.next_lsn += 1;
        self.offset += record.total_bytes;
        if ends_group {
            self.apply_group();
        }
        Ok(())
    }

    /// Verifies the chain record that must end a group of a chained
    /// segment against the group's other records.
    fn close_chained_group(&mut self, record: &RawRecord<'_>) -> Result<(), ReplayStop> {
        if record.kind != KIND_CHAIN || !record.group_end {
            return Err(self.damage(
                "a commit group that does not end with its MAC in a chained segment".into(),
            ));
        }
        let group = &self.bytes[self.committed.offset as usize..self.offset];
        self.chain
            .close_group(group, record.lsn, record.payload)
            .map_err(|stop| match stop {
                ReplayStop::Damage(_, reason, _) => self.damage(reason),
                key => key,
            })
    }

    /// Decodes a data record (opening it if sealed) and checks it against
    /// its namespace's key and the sealing rule.
    fn open_record(&mut self, record: &RawRecord<'_>) -> Result<Mutation, ReplayStop> {
        let mutation =
            decode_record(record, self.keyring, self.dir_id.as_ref()).map_err(|e| match e {
                RecordOpenError::Damage(reason) => self.damage(reason),
                RecordOpenError::Key(reason) => ReplayStop::Key(reason),
            })?;
        if let Mutation::NamespaceCreate { ns, meta } | Mutation::NamespaceAlter { ns, meta } =
            &mutation
        {
            check_namespace_key(ns, meta, self.keyring)
                .map_err(|e| ReplayStop::Key(e.to_string()))?;
        }
        // Only past the checkpoint: the rule starts from its state.
        if record.lsn > self.checkpoint_lsn
            && let Some(rule) = self.rule.as_deref_mut()
        {
            rule.check(&mutation, record.kind & SEALED_BIT != 0)
                .map_err(|reason| self.damage(reason))?;
        }
        Ok(mutation)
    }

    /// Applies the group just read (its records past the checkpoint) and
    /// moves the last whole group's end past it.
    fn apply_group(&mut self) {
        for (lsn, mutation) in self.pending.drain(..) {
            if lsn > self.checkpoint_lsn {
                (self.apply)(lsn, mutation);
                self.report.records_replayed += 1;
            }
        }
        self.committed = Cut {
            offset: self.offset as u64,
            next_lsn: self.next_lsn,
        };
    }

    /// Bytes at the next record's place that are not a record: a torn
    /// tail in the last segment unless a later group follows, otherwise
    /// corruption.
    fn damaged(&self, damage: &RecordDamage) -> Result<SegmentEnd, ReplayStop> {
        if self.is_last
            && !later_group_follows(self.bytes, self.offset + 1, self.next_lsn, self.seed)
        {
            // A torn write of the last group, which was never
            // acknowledged: drop the whole group.
            return Ok(SegmentEnd::TornAt {
                offset: self.committed.offset,
                next_lsn: self.committed.next_lsn,
            });
        }
        let why = if self.is_last {
            format!("{damage}, and a later commit group follows it")
        } else {
            format!("{damage} in a segment that is not the last")
        };
        Err(self.damage(why))
    }

    /// Damage at the record being read: `--repair` would cut at the start
    /// of its group.
    fn damage(&self, reason: String) -> ReplayStop {
        ReplayStop::Damage(self.offset as u64, reason, self.committed)
    }
}

fn is_zero(bytes: &[u8]) -> bool {
    bytes.iter().all(|b| *b == 0)
}

/// Length of `bytes` up to and including its last non-zero byte.
fn nonzero_len(bytes: &[u8]) -> usize {
    bytes.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1)
}

/// Reads `path` again and checks that it holds `first`, the bytes recovery
/// is about to act on. A read fault is transient (the file on disk is
/// fine), so two reads that differ mean one of them was wrong: recovery
/// then refuses with an I/O error and changes nothing, and the next start
/// reads again.
fn confirm_read(storage: &dyn Storage, path: &Path, first: &[u8]) -> Result<(), StoreError> {
    let second = storage
        .read_file(path)
        .map_err(|e| StoreError::io(path, e))?;
    if second == first {
        return Ok(());
    }
    let at = first
        .iter()
        .zip(&second)
        .position(|(a, b)| a != b)
        .unwrap_or(first.len().min(second.len()));
    Err(StoreError::io(
        path,
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "two reads of this WAL segment differ from offset {at} ({} bytes, then {}): \
                 the disk returned wrong bytes once (a read fault), so recovery changed nothing \
                 and refuses this start. Start cubed again; if this repeats, check the disk \
                 (dmesg, smartctl) and copy the data dir off it",
                first.len(),
                second.len()
            ),
        ),
    ))
}

/// Whether, after damage at `from - 1`, a *later* commit group follows:
/// a valid group-end record and then any valid record after it. Under
/// `--sync always` only the last group can be torn (the next one is written
/// after this one's fsync), so valid records of the torn group itself may
/// follow the damage, but a later group means real corruption. Cheap field
/// checks run before each CRC; this runs only when recovery found damage.
fn later_group_follows(bytes: &[u8], from: usize, min_lsn: u64, seed: CrcSeed) -> bool {
    // No record can start in the zeros of preallocated space.
    let bytes = &bytes[..nonzero_len(bytes)];
    let max_lsn = min_lsn.saturating_add((bytes.len() / RECORD_HEADER_BYTES) as u64 + 1);
    let mut seen_group_end = false;
    let mut at = from;
    while at + RECORD_HEADER_BYTES <= bytes.len() {
        let h = &bytes[at..];
        let len = LittleEndian::read_u32(&h[4..8]) as usize;
        let lsn = LittleEndian::read_u64(&h[8..16]);
        let kind = h[16] & !GROUP_END_BIT & !SEALED_BIT;
        let plausible = [
            KIND_PUT,
            KIND_DEL,
            KIND_LINK,
            KIND_UNLINK,
            KIND_DETACH,
            KIND_PROGRAM_PUT,
            KIND_PROGRAM_DEL,
            KIND_TELEMETRY,
            KIND_NAMESPACE_CREATE,
            KIND_NAMESPACE_DROP,
            KIND_NAMESPACE_ALTER,
            KIND_CHAIN,
        ]
        .contains(&kind)
            && (min_lsn..=max_lsn).contains(&lsn)
            && len <= MAX_RECORD_PAYLOAD_BYTES
            && RECORD_HEADER_BYTES + len <= h.len();
        if plausible && let Ok(record) = parse_record(h, seed) {
            if seen_group_end {
                return true;
            }
            seen_group_end = record.group_end;
            at += record.total_bytes;
            continue;
        }
        at += 1;
    }
    false
}

/// Segment files in LSN order. With `remove_stale_prepared` (only at
/// recovery, before the preallocation thread starts) leftover preallocated
/// files are deleted.
pub fn list_segments(
    storage: &dyn Storage,
    wal_dir: &Path,
    remove_stale_prepared: bool,
) -> Result<Vec<(u64, PathBuf)>, StoreError> {
    let mut segments = Vec::new();
    let names = storage
        .list_dir(wal_dir)
        .map_err(|e| StoreError::io(wal_dir, e))?;
    for name in names {
        if let Some(lsn) = parse_segment_file_name(&name) {
            segments.push((lsn, wal_dir.join(name)));
        } else if remove_stale_prepared && name.ends_with(PREPARED_SUFFIX) {
            // A preallocated file a crash left before it was installed:
            // it never held a record.
            let path = wal_dir.join(name);
            storage
                .remove_file(&path)
                .map_err(|e| StoreError::io(&path, e))?;
        }
    }
    segments.sort();
    Ok(segments)
}

/// Overwrites `[from, to)` with zeros and syncs: a torn tail becomes
/// preallocated space again, and the file keeps its size.
fn zero_durably(storage: &dyn Storage, path: &Path, from: u64, to: u64) -> Result<(), StoreError> {
    let mut file = storage
        .open(path, OpenMode::Existing)
        .map_err(|e| StoreError::io(path, e))?;
    let zeros = vec![0u8; (to - from) as usize];
    file.write_all_at(&zeros, from)
        .and_then(|()| file.sync_data())
        .map_err(|e| StoreError::io(path, e))
}

fn truncate_durably(storage: &dyn Storage, path: &Path, len: u64) -> Result<(), StoreError> {
    let mut file = storage
        .open(path, OpenMode::Existing)
        .map_err(|e| StoreError::io(path, e))?;
    file.set_len(len)
        .and_then(|()| file.sync_data())
        .map_err(|e| StoreError::io(path, e))
}

/// Cuts the log at the start of the commit group holding `bad` (records
/// of that group before the damage were never acknowledged either: a
/// group is written and synced whole): saves the dropped tail and moves
/// later segments into a repair folder, then truncates (or removes) the
/// damaged segment. `bytes` is the damaged segment as recovery read it
/// (twice, the same): what is saved is what was checked.
fn repair_at(
    storage: &dyn Storage,
    wal_dir: &Path,
    segments: &[(u64, PathBuf)],
    bad: &BadPoint,
    bytes: &[u8],
) -> Result<RepairReport, StoreError> {
    let saved = save_what_is_cut(storage, wal_dir, segments, bad, bytes)?;
    let (_, bad_path) = &segments[bad.segment];
    let at = bad.cut.offset;
    let mut segments_dropped = saved.segments_moved;
    if at == 0 {
        storage
            .remove_file(bad_path)
            .map_err(|e| StoreError::io(bad_path, e))?;
        segments_dropped += 1;
        sync_dir(storage, wal_dir)?;
    } else {
        truncate_durably(storage, bad_path, at)?;
    }
    Ok(RepairReport {
        path: bad_path.clone(),
        offset: at,
        reason: if at == bad.offset {
            bad.reason.clone()
        } else {
            format!(
                "{} at offset {}; cut at the start of its commit group",
                bad.reason, bad.offset
            )
        },
        bytes_dropped: saved.bytes,
        segments_dropped,
        saved_to: saved.folder,
    })
}

/// What a repair saved before it cut the log.
struct SavedTail {
    /// The repair folder, `repair-<unix seconds>` in the WAL directory.
    folder: PathBuf,
    /// The bytes dropped from the log: the damaged segment's from the cut
    /// on, and every later segment's.
    bytes: u64,
    /// The later segments moved into the folder.
    segments_moved: usize,
}

/// Saves what a repair at `bad` drops, durably, before anything is cut:
/// the damaged segment's bytes from the cut on (`bytes` is the segment as
/// recovery read it) as a file, and the later segments moved whole.
fn save_what_is_cut(
    storage: &dyn Storage,
    wal_dir: &Path,
    segments: &[(u64, PathBuf)],
    bad: &BadPoint,
    bytes: &[u8],
) -> Result<SavedTail, StoreError> {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let folder = wal_dir.join(format!("repair-{secs}"));
    storage
        .create_dir_all(&folder)
        .map_err(|e| StoreError::io(&folder, e))?;
    let (_, bad_path) = &segments[bad.segment];
    let file_name = bad_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let at = bad.cut.offset;
    let cut = (at as usize).min(bytes.len());
    let tail_path = folder.join(format!("{file_name}.from-{at}"));
    storage
        .open(&tail_path, OpenMode::CreateTruncate)
        .and_then(|mut f| {
            f.write_all_at(&bytes[cut..], 0)?;
            f.sync_data()
        })
        .map_err(|e| StoreError::io(&tail_path, e))?;
    let mut saved = SavedTail {
        folder,
        bytes: (bytes.len() as u64).saturating_sub(at),
        segments_moved: 0,
    };
    for (_, later) in &segments[bad.segment + 1..] {
        saved.bytes += storage
            .file_len(later)
            .map_err(|e| StoreError::io(later, e))?;
        let target = saved.folder.join(later.file_name().unwrap_or_default());
        storage
            .rename(later, &target)
            .map_err(|e| StoreError::io(later, e))?;
        saved.segments_moved += 1;
    }
    // What is cut is saved durably (its file, the moves of later segments,
    // the folder itself) before anything is cut: a power loss in between
    // must never keep the cut and lose the copy.
    sync_dir(storage, &saved.folder)?;
    sync_dir(storage, wal_dir)?;
    Ok(saved)
}

/// A record of a closed segment, as the fold sees it.
pub enum ClosedRecord {
    /// A mutation, and whether its record was sealed.
    Mutation(Mutation, bool),
    /// A chain record: the chain value after its group.
    Chain([u8; MAC_BYTES]),
}

/// Reads every record of a closed segment (one the writer has moved past
/// and synced), for the checkpointer, with whether it was sealed. Any damage is corruption here: a
/// closed segment has no torn tail, only preallocated zeros.
pub fn read_closed_segment(
    storage: &dyn Storage,
    path: &Path,
    keyring: Option<&Keyring>,
    mut each: impl FnMut(u64, ClosedRecord),
) -> Result<u64, StoreError> {
    let bytes = storage
        .read_file(path)
        .map_err(|e| StoreError::io(path, e))?;
    let corrupt = |offset: u64, reason: String| StoreError::Corruption {
        path: path.to_path_buf(),
        offset,
        reason,
    };
    let header = parse_segment_header(&bytes).map_err(|reason| corrupt(0, reason))?;
    let mut offset = header.header_bytes;
    let mut next_lsn = header.first_lsn;
    let mut inside_group = false;
    while offset < bytes.len() {
        match parse_record(&bytes[offset..], header.crc_seed) {
            // Recovery verified the chain of every segment this start did
            // not write itself; the fold only carries its value on.
            Ok(record) if record.lsn == next_lsn && record.kind == KIND_CHAIN => {
                let mac = <[u8; MAC_BYTES]>::try_from(record.payload).map_err(|_| {
                    corrupt(offset as u64, "a chain record of the wrong length".into())
                })?;
                each(record.lsn, ClosedRecord::Chain(mac));
                next_lsn += 1;
                offset += record.total_bytes;
                inside_group = !record.group_end;
            }
            Ok(record) if record.lsn == next_lsn => {
                let dir_id = header.chain.map(|c| c.dir_id);
                let mutation =
                    decode_record(&record, keyring, dir_id.as_ref()).map_err(|e| match e {
                        RecordOpenError::Damage(reason) => corrupt(offset as u64, reason),
                        RecordOpenError::Key(reason) => StoreError::Key(reason),
                    })?;
                each(
                    record.lsn,
                    ClosedRecord::Mutation(mutation, record.kind & SEALED_BIT != 0),
                );
                next_lsn += 1;
                offset += record.total_bytes;
                inside_group = !record.group_end;
            }
            Ok(record) => {
                return Err(corrupt(
                    offset as u64,
                    format!("record has LSN {}, expected {next_lsn}", record.lsn),
                ));
            }
            Err(_) if is_zero(&bytes[offset..]) => break,
            Err(damage) => return Err(corrupt(offset as u64, damage.to_string())),
        }
    }
    if inside_group {
        return Err(corrupt(
            offset as u64,
            "a closed segment ends inside a commit group".into(),
        ));
    }
    Ok(next_lsn)
}
