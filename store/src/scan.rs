//! Region reads: the cells of a box, in curve order, a bounded piece at a
//! time.
//!
//! A box is a union of key runs ([`Runs`]). The scan walks the namespace's
//! ordered map and the runs together: a stored key inside the current run is
//! a hit; a key past it moves the runs forward to that key (skipping whole
//! subtrees, never enumerating runs that hold no data); a key before the
//! next run is outside the box and is stepped over, or, if the gap is wide,
//! jumped over with a fresh seek. Work is therefore proportional to the
//! stored keys met plus the runs that hold them, not to the box's volume,
//! so a count of all of `i32` space touches only the cells that exist.
//!
//! Every call is bounded twice: by the cells the caller wants in one page,
//! and by a step budget (stored keys examined), so a sparse box whose key
//! span is full of outside cells cannot turn one request into an unbounded
//! walk. When either bound stops it, the scan returns a cursor, a position
//! along the curve to resume strictly after.

use cube_protocol::{CellBox, Coord};

use crate::curve::region::{KeyRange, Runs};
use crate::curve::{Curve, MAX_KEY};

/// A gap of at most this many keys between a stored key outside the box
/// and the next run is crossed by stepping the iterator; a wider one by a
/// new seek. Stepping costs a few ns per stored key, a seek about a hundred
/// (a root-to-leaf descent), so for gaps this small stepping never loses
/// by much and usually wins (the keys in a short gap are few).
const STEP_OVER_KEYS: u128 = 64;

/// What one scan call may do before it hands back a cursor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScanLimits {
    /// Cells to return (or count) at most.
    pub max_cells: u64,
    /// Stored keys to examine at most, inside the box or not.
    pub max_steps: u64,
}

impl ScanLimits {
    /// Cells in one page of values: 64 Ki cells is a few ms of work and, at
    /// small values, about a megabyte of response.
    pub const MAX_PAGE_CELLS: u64 = 65_536;
    /// Stored keys examined by one call at most: about 5 ms at the measured
    /// few ns per key, so one request never holds a connection thread long.
    pub const MAX_STEPS: u64 = 1 << 20;
}

/// The visitor's answer for one cell inside the box.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Visit {
    /// The cell is taken; go on.
    Take,
    /// The cell is not taken; stop here and resume at it next time. A
    /// visitor must take the first cell of a call: a call that takes
    /// nothing makes no progress, and its cursor would repeat.
    Stop,
}

/// How a scan call ended, and what it cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanOutcome {
    /// Cells taken (returned or counted).
    pub cells: u64,
    /// `None` when the box is finished; otherwise the position to resume
    /// strictly after (usually the last cell taken; possibly any position,
    /// even outside the box, when the step budget ran out).
    pub resume_after: Option<Coord>,
    /// Stored keys examined, inside the box or not.
    pub visited: u64,
    /// Fresh descents into the ordered map.
    pub seeks: u64,
}

/// Where a scan starts: the first key after `after`, or the first key.
pub(crate) fn start_key(curve: Curve, after: Option<Coord>) -> Option<u128> {
    match after {
        None => Some(0),
        Some(c) => {
            let key = curve.key(c);
            (key < MAX_KEY).then_some(key + 1)
        }
    }
}

/// The part of a scan done under one hold of a read lock.
pub(crate) enum ChunkEnd {
    /// Nothing more in the box.
    Done,
    /// Stopped by the caller's limit or visitor: resume strictly after this
    /// key (the last cell taken).
    Stopped(u128),
    /// Out of this chunk's steps: resume strictly after this key (the last
    /// key examined, which may be outside the box).
    Paused(u128),
}

/// A scan in progress: the runs of the box, and the position reached.
pub(crate) struct ScanState {
    runs: Runs,
    pub(crate) next_key: u128,
    pub(crate) outcome: ScanOutcome,
    run: Option<KeyRange>,
    last_taken: Option<u128>,
}

impl ScanState {
    pub(crate) fn new(curve: Curve, region: &CellBox, from: u128) -> ScanState {
        ScanState {
            runs: Runs::new(curve, region),
            next_key: from,
            outcome: ScanOutcome::default(),
            run: None,
            last_taken: None,
        }
    }

    /// Scans `cells` from `self.next_key`, examining at most `steps` stored
    /// keys. `range_from(k)` iterates the stored entries with key >= k in
    /// order. `visit` sees each stored cell inside the box, by key.
    pub(crate) fn chunk<'a, I, V>(
        &mut self,
        range_from: impl Fn(u128) -> I,
        steps: u64,
        max_cells: u64,
        visit: &mut impl FnMut(u128, &V) -> Visit,
    ) -> ChunkEnd
    where
        I: Iterator<Item = (&'a u128, &'a V)>,
        V: ?Sized + 'a,
    {
        let mut run = match self.run {
            Some(run) if run.end >= self.next_key => run,
            _ => match self.runs.next_run_from(self.next_key) {
                Some(run) => run,
                None => return ChunkEnd::Done,
            },
        };
        let mut entries = range_from(run.start.max(self.next_key));
        self.outcome.seeks += 1;
        for _ in 0..steps.max(1) {
            let Some((&key, value)) = entries.next() else {
                return ChunkEnd::Done;
            };
            self.outcome.visited += 1;
            if key > run.end {
                match self.runs.next_run_from(key) {
                    Some(next) => run = next,
                    None => return ChunkEnd::Done,
                }
                self.run = Some(run);
            }
            if key < run.start {
                // Outside the box, before the next run.
                self.next_key = run.start;
                if run.start - key > STEP_OVER_KEYS {
                    entries = range_from(run.start);
                    self.outcome.seeks += 1;
                }
                continue;
            }
            let full = self.outcome.cells >= max_cells;
            if full || visit(key, value) == Visit::Stop {
                self.next_key = key;
                // A visitor that refuses the very first cell breaks its
                // contract; resuming just before that cell still loses
                // nothing unless it is key 0.
                return ChunkEnd::Stopped(self.last_taken.unwrap_or(key.saturating_sub(1)));
            }
            self.outcome.cells += 1;
            self.last_taken = Some(key);
            self.next_key = key + 1;
        }
        self.run = Some(run);
        if self.next_key > MAX_KEY {
            ChunkEnd::Done
        } else {
            // At least one step was taken, so next_key > the chunk's start >= 0.
            ChunkEnd::Paused(self.next_key - 1)
        }
    }
}
