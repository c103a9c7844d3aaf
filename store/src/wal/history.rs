//! Reading a stretch of the log back while the daemon runs, for `watch
//! --from`: the records `from..=until` still on disk, a group at a time.
//!
//! A segment is read [`HISTORY_CHUNK_BYTES`] at a time (more only to hold
//! one record bigger than that whole), not whole: a replay holds about a
//! chunk of the log however big the segments are, and a thousand watches
//! replaying at once do not hold a thousand segments.
//!
//! Only records at or below `until` are read, and the caller takes `until`
//! from what the writer has applied, so every record read was written and
//! synced whole before the read began: the writer's later appends (to the
//! open segment) are never looked at, and a record that does not parse
//! there is damage, not a write in progress.

use byteorder::{ByteOrder, LittleEndian};
use std::io;
use std::path::Path;

use crate::crypto::Keyring;
use crate::error::StoreError;
use crate::mutation::Mutation;
use crate::storage::{OpenMode, Storage, StorageFile};
use crate::wal::chain::KIND_CHAIN;
use crate::wal::record::{
    MAX_RECORD_PAYLOAD_BYTES, RECORD_HEADER_BYTES, RecordOpenError, decode_record, parse_record,
};
use crate::wal::recovery::list_segments;
use crate::wal::segment::{SegmentHeader, parse_segment_header};

/// What [`read_history`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum History {
    /// Every record `from..=until` was handed over (or the callback
    /// stopped the read).
    Read,
    /// Records before `oldest_lsn` are no longer in the log (folded into a
    /// checkpoint, their segments removed); nothing was handed over.
    Gone { oldest_lsn: u64 },
}

/// Hands `each(lsn, mutation, group_end)` every record `from..=until` in
/// LSN order; `each` returns `false` to stop. `Gone` if the log no longer
/// starts at or before `from`, also when a segment is removed mid-read.
pub fn read_history(
    storage: &dyn Storage,
    wal_dir: &Path,
    keyring: Option<&Keyring>,
    from: u64,
    until: u64,
    mut each: impl FnMut(u64, Mutation, bool) -> bool,
) -> Result<History, StoreError> {
    let segments = list_segments(storage, wal_dir, false)?;
    let oldest_lsn = segments.first().map_or(until + 1, |(first, _)| *first);
    if from < oldest_lsn {
        return Ok(History::Gone { oldest_lsn });
    }
    // The last segment starting at or before `from` holds it.
    let start = segments
        .iter()
        .rposition(|(first, _)| *first <= from)
        .unwrap_or(0);
    for (_, path) in &segments[start..] {
        let reader = match ChunkReader::open(storage, path) {
            Ok(reader) => reader,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // The checkpointer removed it since the listing.
                let now = list_segments(storage, wal_dir, false)?;
                let oldest_lsn = now.first().map_or(until + 1, |(first, _)| *first);
                return Ok(History::Gone { oldest_lsn });
            }
            Err(e) => return Err(StoreError::io(path, e)),
        };
        if !read_segment(path, reader, keyring, from, until, &mut each)? {
            return Ok(History::Read);
        }
    }
    Ok(History::Read)
}

/// Bytes of a segment a history read holds at a time.
pub const HISTORY_CHUNK_BYTES: usize = 256 * 1024;

/// A segment read a chunk at a time: `buf` holds the file's bytes from
/// `buf_start`, of which those before `pos` are used up.
struct ChunkReader {
    file: Box<dyn StorageFile>,
    len: u64,
    buf: Vec<u8>,
    buf_start: u64,
    pos: usize,
}

impl ChunkReader {
    fn open(storage: &dyn Storage, path: &Path) -> io::Result<ChunkReader> {
        let file = storage.open(path, OpenMode::ReadOnly)?;
        let len = file.len()?;
        Ok(ChunkReader {
            file,
            len,
            buf: Vec::new(),
            buf_start: 0,
            pos: 0,
        })
    }

    /// The file offset of the next unread byte.
    fn offset(&self) -> u64 {
        self.buf_start + self.pos as u64
    }

    /// The bytes not used up yet.
    fn rest(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    /// Makes at least `need` unread bytes available, reading a chunk (or
    /// `need`, if more) past what is held; `false` if the file ends first
    /// (all it has left is then held).
    fn fill(&mut self, need: usize) -> io::Result<bool> {
        if self.buf.len() - self.pos >= need {
            return Ok(true);
        }
        self.buf.drain(..self.pos);
        self.buf_start += self.pos as u64;
        self.pos = 0;
        let held_end = self.buf_start + self.buf.len() as u64;
        let file_left = self.len.saturating_sub(held_end);
        let want = (need.max(HISTORY_CHUNK_BYTES) - self.buf.len()).min(file_left as usize);
        let old = self.buf.len();
        self.buf.resize(old + want, 0);
        self.file.read_exact_at(&mut self.buf[old..], held_end)?;
        // A chunk's worth of capacity stays; a big record's is given back.
        self.buf.shrink_to(HISTORY_CHUNK_BYTES.max(need));
        Ok(self.buf.len() >= need)
    }

    /// Whether every byte from here to the end of the file is zero
    /// (preallocated space past the last record).
    fn rest_is_zero(&mut self) -> io::Result<bool> {
        loop {
            if self.rest().iter().any(|b| *b != 0) {
                return Ok(false);
            }
            self.pos = self.buf.len();
            if !self.fill(1)? {
                return Ok(true);
            }
        }
    }

    /// Makes the whole next record available (as far as its header says;
    /// `false` if the file ends first).
    fn fill_record(&mut self) -> io::Result<bool> {
        if !self.fill(RECORD_HEADER_BYTES)? {
            return Ok(false);
        }
        let rest = self.rest();
        let payload_len = LittleEndian::read_u32(&rest[4..8]) as usize;
        // A length past the limit is damage: parse_record says so.
        if payload_len > MAX_RECORD_PAYLOAD_BYTES {
            return Ok(true);
        }
        self.fill(RECORD_HEADER_BYTES + payload_len)
    }
}

/// One record of a segment, read and checked by [`next_record`].
struct HistoryRecord {
    lsn: u64,
    /// The MAC that closes a chained group: no change of its own.
    is_chain: bool,
    group_end: bool,
    /// The change, `None` for a chain record or one before `from`.
    mutation: Option<Mutation>,
}

/// The segment being read: what every record of it is checked against.
struct SegmentRead<'a> {
    path: &'a Path,
    header: SegmentHeader,
    keyring: Option<&'a Keyring>,
    from: u64,
}

impl SegmentRead<'_> {
    fn corrupt(&self, offset: u64, reason: String) -> StoreError {
        StoreError::Corruption {
            path: self.path.to_path_buf(),
            offset,
            reason,
        }
    }

    fn io_error(&self, e: io::Error) -> StoreError {
        StoreError::io(self.path, e)
    }

    /// The record at the reader's position, which must have LSN
    /// `expected`, and the reader moved past it; `None` at the
    /// preallocated zeros that end a closed segment.
    fn next_record(
        &self,
        reader: &mut ChunkReader,
        expected: u64,
    ) -> Result<Option<HistoryRecord>, StoreError> {
        let offset = reader.offset();
        let whole = reader.fill_record().map_err(|e| self.io_error(e))?;
        let parsed = parse_record(reader.rest(), self.header.crc_seed).map_err(|d| d.to_string());
        let record = match parsed {
            Ok(record) => record,
            Err(damage) => {
                // Preallocated zeros: the end of a closed segment.
                if reader.rest_is_zero().map_err(|e| self.io_error(e))? {
                    return Ok(None);
                }
                let reason = if whole {
                    damage
                } else {
                    format!("{damage} (the segment ends inside the record)")
                };
                return Err(self.corrupt(offset, reason));
            }
        };
        if record.lsn != expected {
            return Err(self.corrupt(
                offset,
                format!("record has LSN {}, expected {expected}", record.lsn),
            ));
        }
        let mutation = if record.kind == KIND_CHAIN || record.lsn < self.from {
            None
        } else {
            let dir_id = self.header.chain.as_ref().map(|chain| &chain.dir_id);
            Some(
                decode_record(&record, self.keyring, dir_id).map_err(|e| match e {
                    RecordOpenError::Damage(reason) => {
                        self.corrupt(offset + record.total_bytes as u64, reason)
                    }
                    RecordOpenError::Key(reason) => StoreError::Key(reason),
                })?,
            )
        };
        let read = HistoryRecord {
            lsn: record.lsn,
            is_chain: record.kind == KIND_CHAIN,
            group_end: record.group_end,
            mutation,
        };
        reader.pos += record.total_bytes;
        Ok(Some(read))
    }
}

/// One segment's records; `false` once past `until` or stopped.
fn read_segment(
    path: &Path,
    mut reader: ChunkReader,
    keyring: Option<&Keyring>,
    from: u64,
    until: u64,
    each: &mut impl FnMut(u64, Mutation, bool) -> bool,
) -> Result<bool, StoreError> {
    reader
        .fill(HISTORY_CHUNK_BYTES)
        .map_err(|e| StoreError::io(path, e))?;
    let header = parse_segment_header(reader.rest()).map_err(|reason| StoreError::Corruption {
        path: path.to_path_buf(),
        offset: 0,
        reason,
    })?;
    let segment = SegmentRead {
        path,
        header,
        keyring,
        from,
    };
    let mut held: Option<(u64, Mutation)> = None;
    reader.pos = header.header_bytes;
    let mut expected = header.first_lsn;
    while reader.offset() < reader.len && expected <= until {
        let Some(record) = segment.next_record(&mut reader, expected)? else {
            return Ok(true);
        };
        expected += 1;
        if record.is_chain {
            // The MAC that closes a chained group (recovery checked it):
            // no change of its own, the end of the group before it.
            if let Some((lsn, mutation)) = held.take()
                && !each(lsn, mutation, true)
            {
                return Ok(false);
            }
            continue;
        }
        let Some(mutation) = record.mutation else {
            continue;
        };
        if let Some((lsn, previous)) = held.take()
            && !each(lsn, previous, false)
        {
            return Ok(false);
        }
        // In a chained segment the group ends at its chain record, so the
        // last change is held until that record shows.
        if header.chain.is_some() && !record.group_end {
            held = Some((record.lsn, mutation));
        } else if !each(record.lsn, mutation, record.group_end) {
            return Ok(false);
        }
    }
    if let Some((lsn, mutation)) = held.take()
        && !each(lsn, mutation, false)
    {
        return Ok(false);
    }
    Ok(expected <= until)
}
