//! Region reads: the cells of a box, in curve order, a bounded piece at a
//! time.
//!
//! A box is a union of key runs ([`Runs`]). The scan walks the namespace's
//! ordered map and the runs together: every stored key inside the current
//! run is a hit, taken straight from the sorted array with no per-key box
//! test; after a run, the next stored key moves the runs forward to it
//! (skipping whole subtrees, never enumerating runs that hold no data), and
//! if it lies before the next run it is outside the box and jumped over.
//! Work is therefore proportional to the stored keys met plus the runs that
//! hold them, not to the box's volume, so a count of all of `i32` space
//! touches only the cells that exist.
//!
//! Every call is bounded twice: by the cells the caller wants in one page,
//! and by a step budget (stored keys examined), so a sparse box whose key
//! span is full of outside cells cannot turn one request into an unbounded
//! walk. When either bound stops it, the scan returns a cursor, a position
//! along the curve to resume strictly after.

use cube_protocol::{CellBox, Coord};

use crate::cells::{CellMap, Span, Value};
use crate::curve::region::{KeyRange, Runs};
use crate::curve::{Curve, MAX_KEY, hilbert};
use crate::read_stack::ReadStack;
use crate::run_file::RunFileError;

mod read_ahead;

use read_ahead::ReadAhead;

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
    /// A namespace on disk: the kernel asked for blocks ahead of the scan.
    read_ahead: ReadAhead,
}

impl ScanState {
    pub(crate) fn new(curve: Curve, region: &CellBox, from: u128) -> ScanState {
        ScanState {
            runs: Runs::new(curve, region),
            next_key: from,
            outcome: ScanOutcome::default(),
            run: None,
            last_taken: None,
            read_ahead: ReadAhead::new(curve, region),
        }
    }

    /// Scans `cells` from `self.next_key`, examining at most `steps` stored
    /// keys. `visit` sees each stored cell inside the box, by key.
    ///
    /// Every key of a run is inside the box, so a run's cells are taken
    /// with no per-key test: the seeker finds where the run starts and ends
    /// in the base array (galloping forward from the last run) and, unless
    /// recent writes fall inside it, hands back plain slices. Between runs,
    /// the next stored key decides which run comes next, so empty stretches
    /// of the box are skipped whole; a stored key that lands outside the
    /// box counts as one step.
    pub(crate) fn chunk<V>(
        &mut self,
        cells: &CellMap,
        steps: u64,
        max_cells: u64,
        visit: &mut V,
    ) -> ChunkEnd
    where
        V: FnMut(u128, &Value) -> Visit,
    {
        let mut budget = steps.max(1);
        let mut seeker = cells.seeker(self.next_key);
        self.outcome.seeks += 1;
        loop {
            let Some(run) = self.current_run() else {
                return ChunkEnd::Done;
            };
            let start = run.start.max(self.next_key);
            match seeker.span(start, run.end) {
                Span::Base { keys, values } => {
                    if let Some(end) = self.take_slice(keys, values, &mut budget, max_cells, visit)
                    {
                        return end;
                    }
                }
                Span::Merged(entries) => {
                    for (&key, value) in entries {
                        if key > run.end {
                            break;
                        }
                        if let Some(end) = self.take(key, value, &mut budget, max_cells, visit) {
                            return end;
                        }
                    }
                }
            }
            if run.end >= MAX_KEY {
                return ChunkEnd::Done;
            }
            self.next_key = run.end + 1;
            if budget == 0 {
                return self.pause();
            }
            if !self.jump_to_run_of(seeker.next_key_after(run.end), &mut budget) {
                return ChunkEnd::Done;
            }
        }
    }

    /// The curve run the scan is in or goes on to from `next_key`, kept
    /// as the current one; `None` when the box has no more.
    fn current_run(&mut self) -> Option<KeyRange> {
        let run = match self.run {
            Some(run) if run.end >= self.next_key => run,
            _ => self.runs.next_run_from(self.next_key)?,
        };
        self.run = Some(run);
        Some(run)
    }

    /// Between curve runs: moves to the run that holds `next_stored` (the
    /// next stored key after the last run, `None` if there is none), or
    /// to the run after it when that key is outside the box. False when
    /// the box has nothing more.
    fn jump_to_run_of(&mut self, next_stored: Option<u128>, budget: &mut u64) -> bool {
        let Some(key) = next_stored else {
            return false;
        };
        let Some(next) = self.runs.next_run_from(key) else {
            return false;
        };
        self.run = Some(next);
        if key < next.start {
            // Outside the box, before the next run: examined, and the
            // scan goes on from that run.
            self.outcome.visited += 1;
            *budget -= 1;
            self.next_key = next.start;
        } else {
            // Nothing is stored between the runs; `key` is taken (and
            // counted) with its run.
            self.next_key = key;
        }
        true
    }

    /// [`ScanState::chunk`] over a namespace on disk: each curve run of the
    /// box is one [`ReadStack::visit_range`] (values borrowed from the
    /// blocks, streamed in key order). After a run that held cells the
    /// next run is visited straight away (a dense box: it most likely holds
    /// cells too, and a visit costs what a look for the next stored key
    /// would); after an empty one the stack's next stored key picks the
    /// next run, as the seeker's does in memory, so a sparse box skips its
    /// empty runs. A block that cannot be read ends the scan with its
    /// error. The blocks of the runs ahead are asked of the kernel a
    /// window at a time ([`ReadAhead`]), so that a cold box is read from the
    /// device many blocks at once, not one read after another; a run is
    /// walked no further than the window reaches before the next is asked
    /// for.
    pub(crate) fn chunk_stack<V>(
        &mut self,
        stack: &ReadStack,
        steps: u64,
        max_cells: u64,
        visit: &mut V,
    ) -> Result<ChunkEnd, RunFileError>
    where
        V: FnMut(u128, &[u8]) -> Visit,
    {
        let mut budget = steps.max(1);
        self.outcome.seeks += 1;
        let mut cursor = None;
        loop {
            let Some(run) = self.current_run() else {
                return Ok(ChunkEnd::Done);
            };
            let start = run.start.max(self.next_key);
            // A run longer than the window asked for is walked a window
            // at a time.
            let visit_end = run.end.min(self.read_ahead.before(stack, start));
            let mut end = None;
            let mut held_cells = false;
            stack.visit_range_seeking(&mut cursor, start, visit_end, |key, value| {
                held_cells = true;
                end = self.take(key, &value, &mut budget, max_cells, &mut |k, v: &&[u8]| {
                    visit(k, v)
                });
                end.is_none()
            })?;
            if let Some(end) = end {
                return Ok(end);
            }
            if visit_end < run.end {
                self.next_key = visit_end + 1;
                if budget == 0 {
                    return Ok(self.pause());
                }
                continue;
            }
            if run.end >= MAX_KEY {
                return Ok(ChunkEnd::Done);
            }
            self.next_key = run.end + 1;
            if budget == 0 {
                return Ok(self.pause());
            }
            if held_cells {
                continue;
            }
            if !self.jump_to_run_of(stack.next_key_after(run.end)?, &mut budget) {
                return Ok(ChunkEnd::Done);
            }
        }
    }

    /// Stored cells inside the box, all of them unless the budget, the
    /// page or the visitor says stop (then `Some`, as [`Self::take`] would
    /// end). The loop keeps its counters in registers and settles them
    /// once: this is the hot loop of a dense scan.
    #[inline(always)]
    fn take_slice<T, V>(
        &mut self,
        keys: &[u128],
        values: &[T],
        budget: &mut u64,
        max_cells: u64,
        visit: &mut V,
    ) -> Option<ChunkEnd>
    where
        V: FnMut(u128, &T) -> Visit,
    {
        debug_assert_eq!(keys.len(), values.len());
        debug_assert!(self.outcome.cells <= max_cells);
        let room = (*budget).min(max_cells - self.outcome.cells);
        let n = keys.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        let mut taken = 0;
        while taken < n && visit(keys[taken], &values[taken]) == Visit::Take {
            taken += 1;
        }
        if taken > 0 {
            let last = keys[taken - 1];
            *budget -= taken as u64;
            self.outcome.visited += taken as u64;
            self.outcome.cells += taken as u64;
            self.last_taken = Some(last);
            self.next_key = last + 1;
        }
        // Past the cells taken, the next one (if any) is where the stop
        // came from: the visitor (before `n`), else the budget or the page,
        // in the order `take` checks them.
        let &key = keys.get(taken)?;
        if taken == n && *budget == 0 {
            return Some(self.pause());
        }
        Some(self.stop_at(key))
    }

    /// Stopped by the page or the visitor at `key`, which is not taken.
    fn stop_at(&mut self, key: u128) -> ChunkEnd {
        self.next_key = key;
        // A visitor that refuses the very first cell breaks its contract;
        // resuming just before that cell still loses nothing unless it is
        // key 0.
        ChunkEnd::Stopped(self.last_taken.unwrap_or(key.saturating_sub(1)))
    }

    /// One stored cell inside the box: `Some` ends the chunk. A slice of
    /// one, so the merged path and the slice path stop for the same reasons.
    #[inline(always)]
    fn take<T, V>(
        &mut self,
        key: u128,
        value: &T,
        budget: &mut u64,
        max_cells: u64,
        visit: &mut V,
    ) -> Option<ChunkEnd>
    where
        V: FnMut(u128, &T) -> Visit,
    {
        self.take_slice(
            std::slice::from_ref(&key),
            std::slice::from_ref(value),
            budget,
            max_cells,
            visit,
        )
    }

    /// Out of steps, after at least one (so `next_key` is past the chunk's
    /// start, and above 0).
    fn pause(&self) -> ChunkEnd {
        if self.next_key > MAX_KEY {
            ChunkEnd::Done
        } else {
            ChunkEnd::Paused(self.next_key - 1)
        }
    }
}

/// Turns the keys a scan meets into coordinates. A scan meets keys in
/// increasing order, mostly in runs that share all but their low bits, so
/// the 12 low key bits (the low 4 bits of each axis) come from a table and
/// the rest is decoded once per 16x16x16 block: about a nanosecond a cell
/// instead of a full decode (Hilbert's is 20-30 ns). For Morton there is
/// one table. For Hilbert the low bits depend on the orientation of the
/// enclosing block, the state of the curve's machine there, so there is a
/// table per state, and entering a block walks the key's top digits to
/// find its state.
pub(crate) struct Decoder {
    curve: Curve,
    /// The key >> 12 of the block `block_origin` was decoded for, or
    /// `u128::MAX` (never a block: keys have 96 bits) before the first.
    block: u128,
    block_origin: Coord,
    low: &'static [u16; LOW_KEYS],
}

/// Keys in one 16x16x16 Morton block.
const LOW_KEYS: usize = 1 << 12;

/// For each state of the Hilbert machine and each 12-bit key suffix in a
/// block in that state, the low 4 bits of x, y, z packed as in
/// [`morton_low_table`]: the suffix's four digits walked from the state
/// give the four octants, which are a Morton suffix. 192 KiB, built once.
fn hilbert_low_tables() -> &'static [[u16; LOW_KEYS]] {
    static TABLES: std::sync::OnceLock<Vec<[u16; LOW_KEYS]>> = std::sync::OnceLock::new();
    TABLES.get_or_init(|| {
        let morton = morton_low_table();
        (0..hilbert::STATES)
            .map(|state| {
                let mut table = [0u16; LOW_KEYS];
                for (suffix, entry) in table.iter_mut().enumerate() {
                    let mut at = state as u8;
                    let mut octants = 0usize;
                    for level in (0..4).rev() {
                        let (octant, next) = hilbert::child(at, (suffix >> (3 * level)) as u8 & 7);
                        octants = octants << 3 | usize::from(octant);
                        at = next;
                    }
                    *entry = morton[octants];
                }
                table
            })
            .collect()
    })
}

/// The state of the Hilbert machine at the 16x16x16 block `block` (a key
/// shifted right by 12): the walk through its 28 digits from the top.
fn hilbert_block_state(block: u128) -> usize {
    let mut state = hilbert::START_STATE as u8;
    for level in (0..28).rev() {
        state = hilbert::child(state, (block >> (3 * level)) as u8 & 7).1;
    }
    usize::from(state)
}

/// For each 12-bit Morton key suffix, its low 4 bits of x, y, z packed as
/// x << 8 | y << 4 | z, derived from the curve's own decode.
fn morton_low_table() -> &'static [u16; LOW_KEYS] {
    static TABLE: std::sync::OnceLock<[u16; LOW_KEYS]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = [0u16; LOW_KEYS];
        for (suffix, entry) in table.iter_mut().enumerate() {
            let c = Curve::Morton.decode(suffix as u128);
            *entry = ((c.x & 15) << 8 | (c.y & 15) << 4 | (c.z & 15)) as u16;
        }
        table
    })
}

impl Decoder {
    #[inline(never)]
    fn enter_block(&mut self, block: u128) {
        self.block = block;
        // The block's corner: the low 4 bits of each axis are 0 (the
        // order-preserving map flips only the sign bit, so blocks of the
        // mapped space are blocks of i32 space).
        match self.curve {
            Curve::Morton => self.block_origin = Curve::Morton.decode(block << 12),
            Curve::Hilbert => {
                let any = Curve::Hilbert.decode(block << 12);
                self.block_origin = Coord::new(any.x & !15, any.y & !15, any.z & !15);
                self.low = &hilbert_low_tables()[hilbert_block_state(block)];
            }
        }
    }

    pub(crate) fn new(curve: Curve) -> Decoder {
        Decoder {
            curve,
            block: u128::MAX,
            block_origin: Coord::new(0, 0, 0),
            low: morton_low_table(),
        }
    }

    /// The per-key path is a few instructions; entering a new block is
    /// kept out of line, so a scan's visitor stays small enough to inline
    /// into the hot loop.
    #[inline(always)]
    pub(crate) fn decode(&mut self, key: u128) -> Coord {
        let block = key >> 12;
        if self.block != block {
            self.enter_block(block);
        }
        let low = i32::from(self.low[(key as usize) & (LOW_KEYS - 1)]);
        let o = self.block_origin;
        let c = Coord::new(o.x | low >> 8, o.y | (low >> 4) & 15, o.z | low & 15);
        debug_assert_eq!(c, self.curve.decode(key));
        c
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    /// Keys examined per lock hold in these tests: small, so chunks end
    /// and resume everywhere.
    const SLICE: u64 = 3;

    /// All pages of a scan of `cells` the way `MemStore` drives it, with a
    /// visitor that stops after `stop_after` cells a page; checks cursors
    /// and counts, and returns the cells in the order they came.
    fn scan_pages(
        cells: &CellMap,
        curve: Curve,
        region: &CellBox,
        page: u64,
        steps: u64,
        stop_after: usize,
    ) -> Vec<(u128, Value)> {
        let mut out = Vec::new();
        let mut after: Option<Coord> = None;
        loop {
            let Some(from) = start_key(curve, after) else {
                return out;
            };
            let mut state = ScanState::new(curve, region, from);
            let mut taken: Vec<(u128, Value)> = Vec::new();
            let end = loop {
                let slice = (steps - state.outcome.visited).min(SLICE);
                let end = state.chunk(cells, slice, page, &mut |key, value: &Value| {
                    if taken.len() == stop_after {
                        return Visit::Stop;
                    }
                    taken.push((key, value.clone()));
                    Visit::Take
                });
                match end {
                    ChunkEnd::Done => break None,
                    ChunkEnd::Stopped(key) => break Some(key),
                    ChunkEnd::Paused(key) if state.outcome.visited >= steps => break Some(key),
                    ChunkEnd::Paused(_) => {}
                }
            };
            assert_eq!(state.outcome.cells, taken.len() as u64);
            assert!(taken.len() as u64 <= page);
            assert!(taken.iter().all(|(k, _)| region.contains(curve.decode(*k))));
            out.extend(taken);
            match end {
                None => return out,
                Some(key) => {
                    if let Some(previous) = after {
                        assert!(key > curve.key(previous), "cursor must move forward");
                    }
                    after = Some(curve.decode(key));
                }
            }
        }
    }

    type Writes = Vec<((i32, i32, i32), Option<u8>)>;

    /// A map with cells in all three layers (base, frozen delta, delta),
    /// and the plain model of what it holds.
    fn layered(
        curve: Curve,
        base: &BTreeMap<(i32, i32, i32), u8>,
        frozen: &Writes,
        delta: &Writes,
    ) -> (CellMap, BTreeMap<u128, Value>) {
        let key = |(x, y, z): (i32, i32, i32)| curve.key(Coord::new(x, y, z));
        let mut model: BTreeMap<u128, Value> = base
            .iter()
            .map(|(c, v)| (key(*c), Value::new(&[*v])))
            .collect();
        let mut cells = CellMap::from_sorted(model.iter().map(|(k, v)| (*k, v.clone())));
        for (writes, freeze) in [(frozen, true), (delta, false)] {
            for (c, v) in writes {
                match v {
                    Some(v) => {
                        let v = Value::new(&[*v]);
                        cells.insert(key(*c), v.clone());
                        model.insert(key(*c), v);
                    }
                    None => {
                        cells.remove(&key(*c));
                        model.remove(&key(*c));
                    }
                }
            }
            if freeze {
                cells.freeze();
            }
        }
        (cells, model)
    }

    fn check(
        cells: &CellMap,
        model: &BTreeMap<u128, Value>,
        curve: Curve,
        region: &CellBox,
        page: u64,
        steps: u64,
        stop_after: usize,
    ) {
        let want: Vec<(u128, Value)> = model
            .iter()
            .filter(|(k, _)| region.contains(curve.decode(**k)))
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        let got = scan_pages(cells, curve, region, page, steps, stop_after);
        assert_eq!(got, want, "{curve:?} {region:?} page {page} steps {steps}");
        let all = scan_pages(cells, curve, region, u64::MAX, u64::MAX, usize::MAX);
        assert_eq!(all, want);
    }

    fn axis() -> impl Strategy<Value = i32> {
        -1i32..11
    }

    fn writes() -> impl Strategy<Value = Writes> {
        prop::collection::vec(((0i32..10, 0i32..10, 0i32..10), any::<Option<u8>>()), 0..40)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Scans over every mix of layers (base slices, merged stretches,
        /// tombstones hiding base cells), with pages, step budgets and
        /// visitor stops, return exactly the model's cells in key order.
        #[test]
        fn layered_scans_match_the_model(
            base in prop::collection::btree_map((0i32..10, 0i32..10, 0i32..10), any::<u8>(), 0..900),
            frozen in writes(),
            delta in writes(),
            a in (axis(), axis(), axis()),
            b in (axis(), axis(), axis()),
            page in 1u64..40,
            steps in 1u64..40,
            stop_after in 1usize..50,
        ) {
            let region = CellBox::new(
                Coord::new(a.0.min(b.0), a.1.min(b.1), a.2.min(b.2)),
                Coord::new(a.0.max(b.0), a.1.max(b.1), a.2.max(b.2)),
            )
            .unwrap();
            for curve in Curve::ALL {
                let (cells, model) = layered(curve, &base, &frozen, &delta);
                check(&cells, &model, curve, &region, page, steps, stop_after);
            }
        }
    }

    /// A fully populated base (whole runs come back as slices), a few
    /// recent writes and deletes inside and around the box.
    #[test]
    fn dense_base_with_recent_writes() {
        let mut base = BTreeMap::new();
        for x in 0..16 {
            for y in 0..16 {
                for z in 0..16 {
                    base.insert((x, y, z), (x + y + z) as u8);
                }
            }
        }
        let frozen: Writes = vec![((3, 4, 5), None), ((7, 7, 7), Some(1)), ((15, 0, 2), None)];
        let delta: Writes = vec![
            ((3, 4, 5), Some(9)),
            ((8, 8, 8), None),
            ((2, 9, 9), Some(2)),
        ];
        for curve in Curve::ALL {
            let (cells, model) = layered(curve, &base, &frozen, &delta);
            for (lo, hi) in [
                ((0, 0, 0), (15, 15, 15)),
                ((2, 3, 4), (9, 9, 9)),
                ((-3, -3, -3), (20, 4, 20)),
                ((8, 8, 8), (8, 8, 8)),
                ((1, 0, 0), (14, 15, 15)),
            ] {
                let region =
                    CellBox::new(Coord::new(lo.0, lo.1, lo.2), Coord::new(hi.0, hi.1, hi.2))
                        .unwrap();
                for (page, steps) in [(5, 7), (1000, 2), (64, 4096), (1, 1)] {
                    check(&cells, &model, curve, &region, page, steps, 1000);
                }
            }
        }
    }

    #[test]
    fn hilbert_has_one_low_table_per_machine_state() {
        // The size the docs quote (24 states, 192 KiB).
        assert_eq!(hilbert_low_tables().len(), 24);
    }

    #[test]
    fn the_block_decoder_agrees_with_the_curve() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for curve in Curve::ALL {
            let mut decoder = Decoder::new(curve);
            let mut keys: Vec<u128> = (0..20_000)
                .map(|_| (u128::from(next()) << 32 | u128::from(next())) & MAX_KEY)
                .collect();
            keys.extend(0..5000);
            keys.extend(MAX_KEY - 5000..=MAX_KEY);
            let base = keys[7] & !0xfff;
            keys.extend(base..base + 9000);
            for key in keys {
                assert_eq!(decoder.decode(key), curve.decode(key), "{curve:?} {key:#x}");
            }
        }
    }
}
