//! A scan's read-ahead on disk: the kernel is asked for the blocks of the
//! box's next curve runs before the scan walks them.
//!
//! A scan walks its blocks in key order, one `pread` at a time, under the
//! namespace's read lock; from a cold cache each read waits on the device
//! alone (a 64 k-cell box is some 1 400 blocks, 5.6 MB, and read one
//! window after another it took 46-61 ms on a device that streams
//! 440-700 MB/s when asked for many reads at once). So before it walks a
//! curve run it has not yet asked for, the scan asks for a window of the
//! runs ahead ([`ReadStack::read_ahead`], `POSIX_FADV_WILLNEED` per stretch
//! of blocks the block cache lacks): the device reads the window's blocks
//! many at a time, and the scan's reads find them in the page cache.
//!
//! Bounded: a window looks at [`WINDOW_BYTES`] of blocks and at most
//! [`WINDOW_RANGES`] curve runs, and the next window is asked for only when
//! the scan reaches its end, so a scan abandoned after a page leaves at
//! most one window read for nothing. The hints fill the kernel's page
//! cache, not the daemon's memory.

use std::collections::VecDeque;

use cube_protocol::CellBox;

use crate::curve::region::{KeyRange, Runs};
use crate::curve::{Curve, MAX_KEY};
use crate::read_stack::ReadStack;

/// Bytes of blocks one window looks at: more than a page of dense 64-byte
/// cells (64 Ki cells are about 5.6 MB of blocks).
pub(crate) const WINDOW_BYTES: u64 = 8 << 20;

/// Curve runs one window looks at, at most (a sparse box has many short
/// runs that share blocks).
pub(crate) const WINDOW_RANGES: usize = 4096;

/// See the module doc.
pub(crate) struct ReadAhead {
    /// The box's curve runs, walked ahead of the scan's own walk.
    runs: Runs,
    /// Runs taken from `runs` and not yet asked for whole, in key order.
    queued: VecDeque<KeyRange>,
    /// The key through which blocks have been asked for; `None` before
    /// the first window.
    through: Option<u128>,
    /// Whether `runs` has no more.
    runs_done: bool,
    /// A window's bounds: [`WINDOW_BYTES`] and [`WINDOW_RANGES`] but in
    /// tests.
    window_bytes: u64,
    window_ranges: usize,
}

impl ReadAhead {
    pub(crate) fn new(curve: Curve, region: &CellBox) -> ReadAhead {
        ReadAhead {
            runs: Runs::new(curve, region),
            queued: VecDeque::new(),
            through: None,
            runs_done: false,
            window_bytes: WINDOW_BYTES,
            window_ranges: WINDOW_RANGES,
        }
    }

    /// Windows of `bytes` and `ranges` instead (tests of many windows).
    #[cfg(test)]
    pub(crate) fn set_window(&mut self, bytes: u64, ranges: usize) {
        assert!(ranges > 0, "a window holds a run at least");
        self.window_bytes = bytes;
        self.window_ranges = ranges;
    }

    /// Called before the scan walks keys from `start`: asks for the next
    /// window unless `start` is inside the last one. Returns the key through
    /// which blocks have been asked for (at least `start`): the scan walks
    /// no further before it calls again.
    pub(crate) fn before(&mut self, stack: &ReadStack, start: u128) -> u128 {
        if let Some(through) = self.through
            && start <= through
        {
            return through;
        }
        self.drop_before(start);
        self.top_up(start);
        if self.queued.is_empty() {
            self.through = Some(MAX_KEY);
            return MAX_KEY;
        }
        let window_bytes = self.window_bytes;
        let through = stack.read_ahead(self.queued.make_contiguous(), window_bytes);
        assert!(through >= start, "a window moves forward");
        self.through = Some(through);
        if through < MAX_KEY {
            self.drop_before(through + 1);
        } else {
            self.queued.clear();
        }
        through
    }

    /// Forgets the queued runs' keys below `key`.
    fn drop_before(&mut self, key: u128) {
        while let Some(front) = self.queued.front_mut() {
            if front.end < key {
                self.queued.pop_front();
            } else {
                front.start = front.start.max(key);
                return;
            }
        }
    }

    /// Takes runs from the box's walk until a window's worth are queued,
    /// the first at or after `start`.
    fn top_up(&mut self, start: u128) {
        while !self.runs_done && self.queued.len() < self.window_ranges {
            let floor = self.queued.back().map_or(start, |last| last.end + 1);
            match self.runs.next_run_from(floor) {
                Some(run) => {
                    self.queued.push_back(KeyRange {
                        start: run.start.max(floor),
                        end: run.end,
                    });
                    if run.end >= MAX_KEY {
                        self.runs_done = true;
                    }
                }
                None => self.runs_done = true,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use cube_protocol::Coord;

    use super::*;
    use crate::run_file::recording_source::{CallLog, RecordingSource, SourceCall, take_calls};
    use crate::run_file::{BlockCache, Protection, RunFileReader, RunFileWriter};
    use crate::scan::{ChunkEnd, ScanState, Visit};
    use crate::storage::RealDisk;

    const CURVE: Curve = Curve::Morton;
    const SIDE: i32 = 12;

    /// A run file of `cells` with blocks of about 128 bytes, read through a
    /// [`RecordingSource`] and a cache that holds all of it.
    fn run_of(
        dir: &std::path::Path,
        name: &str,
        cells: &BTreeMap<u128, Vec<u8>>,
        cache: &Arc<BlockCache>,
    ) -> (Arc<RunFileReader>, CallLog) {
        let path = dir.join(name);
        let mut writer = RunFileWriter::create(
            &RealDisk,
            &path,
            1,
            1,
            &Protection::Plain,
            cells.len() as u64,
        )
        .unwrap()
        .with_target_block_bytes(128);
        for (key, value) in cells {
            writer.push(*key, Some(value)).unwrap();
        }
        writer.finish().unwrap();
        let (source, calls) = RecordingSource::new(std::fs::read(&path).unwrap());
        let reader = RunFileReader::open_source(
            Box::new(source),
            &path,
            &Protection::Plain,
            Arc::clone(cache),
        )
        .unwrap();
        // The open's reads (footer, index, filter) are not the scan's.
        take_calls(&calls);
        (Arc::new(reader), calls)
    }

    /// Scans `region` whole, a few keys per slice, with the read-ahead's
    /// window set by `window`; the cells in order.
    fn scan(
        stack: &ReadStack,
        region: &CellBox,
        window: Option<(u64, usize)>,
    ) -> Vec<(u128, Vec<u8>)> {
        let mut state = ScanState::new(CURVE, region, 0);
        if let Some((bytes, ranges)) = window {
            state.read_ahead.set_window(bytes, ranges);
        }
        let mut got = Vec::new();
        loop {
            let end = state
                .chunk_stack(stack, 7, u64::MAX, &mut |key, value: &[u8]| {
                    got.push((key, value.to_vec()));
                    Visit::Take
                })
                .unwrap();
            match end {
                ChunkEnd::Done => return got,
                ChunkEnd::Paused(_) => {}
                ChunkEnd::Stopped(key) => panic!("nothing stops this scan, yet at {key}"),
            }
        }
    }

    /// Whether every read in `calls` lies inside hints made before it.
    fn reads_were_hinted_first(calls: &[SourceCall]) -> bool {
        let mut hinted: Vec<(u64, u64)> = Vec::new();
        calls.iter().all(|call| match *call {
            SourceCall::Hint { offset, len } => {
                hinted.push((offset, offset + len));
                true
            }
            SourceCall::Read { offset, len } => {
                // Hints of one walk are contiguous or apart; a read may
                // span several that touch.
                let mut at = offset;
                let end = offset + len;
                while at < end {
                    match hinted.iter().find(|(lo, hi)| *lo <= at && at < *hi) {
                        Some((_, hi)) => at = *hi,
                        None => return false,
                    }
                }
                true
            }
        })
    }

    /// Two overlapping runs of a 12³ grid (the newer holds every third cell
    /// with another value), tiny blocks: a scan of a box reads only blocks
    /// it asked the kernel for first and answers right, whether one window
    /// holds the box or windows are one block and one curve run (the
    /// hints then move forward through each file).
    #[test]
    fn a_scan_asks_for_its_blocks_before_it_reads_them() {
        let tmp = tempfile::tempdir().unwrap();
        let mut older = BTreeMap::new();
        let mut newer = BTreeMap::new();
        for x in 0..SIDE {
            for y in 0..SIDE {
                for z in 0..SIDE {
                    let key = CURVE.key(Coord::new(x, y, z));
                    older.insert(key, format!("old {x} {y} {z}").into_bytes());
                    if (x + y + z) % 3 == 0 {
                        newer.insert(key, format!("new {x} {y} {z}").into_bytes());
                    }
                }
            }
        }
        let mut model = older.clone();
        model.extend(newer.clone());
        let region = CellBox::new(Coord::new(1, 2, 0), Coord::new(10, 9, 11)).unwrap();
        let want: Vec<(u128, Vec<u8>)> = model
            .iter()
            .filter(|(k, _)| region.contains(CURVE.decode(**k)))
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        for window in [None, Some((1, 1)), Some((300, 2)), Some((2000, 5))] {
            let cache = Arc::new(BlockCache::new(1 << 20));
            let (old_run, old_calls) = run_of(tmp.path(), "older", &older, &cache);
            let (new_run, new_calls) = run_of(tmp.path(), "newer", &newer, &cache);
            let stack = ReadStack::new(vec![new_run, old_run], model.len());
            assert_eq!(scan(&stack, &region, window), want, "window {window:?}");
            for calls in [&old_calls, &new_calls] {
                let calls = take_calls(calls);
                let reads = calls
                    .iter()
                    .filter(|c| matches!(c, SourceCall::Read { .. }))
                    .count();
                assert!(reads > 4, "the box spans many blocks of each file");
                let hint_offsets: Vec<u64> = calls
                    .iter()
                    .filter_map(|c| match c {
                        SourceCall::Hint { offset, .. } => Some(*offset),
                        SourceCall::Read { .. } => None,
                    })
                    .collect();
                assert!(
                    hint_offsets.is_sorted(),
                    "window {window:?}: hints move forward"
                );
                assert!(
                    reads_were_hinted_first(&calls),
                    "window {window:?}: every read was asked for first: {calls:?}"
                );
                if window.is_some() {
                    assert!(hint_offsets.len() > 1, "window {window:?}: several windows");
                }
            }
        }
    }
}
