//! Reading a stretch of the log back while the daemon runs, for `watch
//! --from`: the records `from..=until` still on disk, a group at a time.
//!
//! Only records at or below `until` are read, and the caller takes `until`
//! from what the writer has applied, so every record read was written and
//! synced whole before the read began: the writer's later appends (to the
//! open segment) are never looked at, and a record that does not parse
//! there is damage, not a write in progress.

use std::io;
use std::path::Path;

use crate::crypto::Keyring;
use crate::error::StoreError;
use crate::mutation::Mutation;
use crate::storage::Storage;
use crate::wal::chain::KIND_CHAIN;
use crate::wal::record::{RecordOpenError, decode_record, parse_record};
use crate::wal::recovery::list_segments;
use crate::wal::segment::parse_segment_header;

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
        let bytes = match storage.read_file(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // The checkpointer removed it since the listing.
                let now = list_segments(storage, wal_dir, false)?;
                let oldest_lsn = now.first().map_or(until + 1, |(first, _)| *first);
                return Ok(History::Gone { oldest_lsn });
            }
            Err(e) => return Err(StoreError::io(path, e)),
        };
        if !read_segment(path, &bytes, keyring, from, until, &mut each)? {
            return Ok(History::Read);
        }
    }
    Ok(History::Read)
}

/// One segment's records; `false` once past `until` or stopped.
fn read_segment(
    path: &Path,
    bytes: &[u8],
    keyring: Option<&Keyring>,
    from: u64,
    until: u64,
    each: &mut impl FnMut(u64, Mutation, bool) -> bool,
) -> Result<bool, StoreError> {
    let corrupt = |offset: usize, reason: String| StoreError::Corruption {
        path: path.to_path_buf(),
        offset: offset as u64,
        reason,
    };
    let header = parse_segment_header(bytes).map_err(|reason| corrupt(0, reason))?;
    let dir_id = header.chain.as_ref().map(|chain| &chain.dir_id);
    let mut held: Option<(u64, Mutation)> = None;
    let mut offset = header.header_bytes;
    let mut expected = header.first_lsn;
    while offset < bytes.len() && expected <= until {
        let record = match parse_record(&bytes[offset..], header.crc_seed) {
            Ok(record) => record,
            // Preallocated zeros: the end of a closed segment.
            Err(_) if bytes[offset..].iter().all(|b| *b == 0) => return Ok(true),
            Err(damage) => return Err(corrupt(offset, damage.to_string())),
        };
        if record.lsn != expected {
            return Err(corrupt(
                offset,
                format!("record has LSN {}, expected {expected}", record.lsn),
            ));
        }
        offset += record.total_bytes;
        expected += 1;
        if record.kind == KIND_CHAIN {
            // The MAC that closes a chained group (recovery checked it):
            // no change of its own, the end of the group before it.
            if let Some((lsn, mutation)) = held.take()
                && !each(lsn, mutation, true)
            {
                return Ok(false);
            }
            continue;
        }
        if record.lsn < from {
            continue;
        }
        let mutation = decode_record(&record, keyring, dir_id).map_err(|e| match e {
            RecordOpenError::Damage(reason) => corrupt(offset, reason),
            RecordOpenError::Key(reason) => StoreError::Key(reason),
        })?;
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
