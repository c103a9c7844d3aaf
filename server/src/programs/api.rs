//! The `cube` API a program calls, served from the run's transaction view.
//!
//! Every API function in `prelude.lua` calls one dispatcher with an op
//! number and its arguments. The dispatcher is made once per VM: creating
//! and tearing down a scoped one per run (to lend it the run's borrowed
//! `TxnView`) was a fifth of a small run's time. It reaches the current
//! run through a [`RunSlot`], which holds the run's detached (owned)
//! transaction view for the length of the call. It checks every argument,
//! so a program gets a clear error naming the function instead of a panic
//! or a silent conversion. All reads and writes stay in the program's own
//! namespace.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use cube_protocol::{CellBox, Coord, Direction, EdgeLabel, NamespaceName};
use cube_store::transaction::MAX_TXN_SCAN_CELLS;
use cube_store::{CellValue, TxnView, WalkLimits};
use mlua::{Lua, Table, Value};

use super::sandbox::charge;

mod fast;
pub(crate) use fast::{fast_function, runner_function};

/// Most cells one run may write (puts and deletes).
pub(crate) const MAX_RUN_WRITES: u32 = 16_384;
/// Most bytes one run may write, all values together.
pub(crate) const MAX_RUN_WRITE_BYTES: usize = 16 * 1024 * 1024;
/// Most cells one region read returns (or counts, or sums).
pub(crate) const MAX_REGION_CELLS: usize = 16_384;
/// A box of at most this many cells is read cell by cell (point reads,
/// no scan set-up); a larger one with a region scan.
const POINT_READ_VOLUME: u128 = 64;
/// Fuel charged per cell a region read examines: a cell costs about as
/// much as a few dozen VM instructions.
const REGION_CELL_FUEL: u64 = 20;
/// Most edges `cube.edges` returns.
pub(crate) const MAX_PROGRAM_EDGES: usize = 4096;

const OP_GET: i64 = 1;
const OP_PUT: i64 = 2;
const OP_DEL: i64 = 3;
const OP_NUM: i64 = 4;
const OP_INCR: i64 = 5;
/// Added to a cell op: the coordinate is relative to the program's own.
const RELATIVE: i64 = 16;
const OP_COUNT: i64 = 32;
const OP_SUM: i64 = 33;
const OP_CELLS: i64 = 34;
const OP_EDGES: i64 = 64;
const OP_WALK: i64 = 65;
const OP_NOW: i64 = 80;

/// What the VM's dispatcher (made once per VM) serves: the run in
/// progress, owned, so that no borrow has to be lent to Lua.
#[derive(Default)]
pub(crate) struct RunState {
    /// The current run; `None` between runs.
    pub(crate) run: Option<Run>,
    /// The namespace of the latest run, kept across runs: replaced (one
    /// name clone) only when a run is in another namespace.
    pub(crate) ns: Option<NamespaceName>,
}

/// One run as the API serves it. The runner lends the run's transaction,
/// detached from the writer's borrowed view, for the program's call and
/// takes it back after.
pub(crate) struct Run {
    pub(crate) view: RunView,
    pub(crate) here: Coord,
    pub(crate) max_value_bytes: usize,
    pub(crate) walk_limits: WalkLimits,
    pub(crate) writes: u32,
    pub(crate) write_bytes: usize,
    /// Most cells and value bytes this run may write: [`MAX_RUN_WRITES`]
    /// and [`MAX_RUN_WRITE_BYTES`], or less for a run in a step, whose
    /// runs share the step's transaction.
    pub(crate) write_cap: u32,
    pub(crate) write_bytes_cap: usize,
    /// In a step: this run's writes, held back from the view so that every
    /// run of the step reads the state from before it (`None`: a plain
    /// run, writing to its view).
    pub(crate) deferred: Option<Vec<DeferredWrite>>,
    /// In a step: the cells around its programs as they were before it,
    /// which is what every run of the step reads (shared by its threads).
    pub(crate) snapshot: Option<Arc<StepSnapshot>>,
    /// Whether a write of this run was refused for a cap: a step thread's
    /// caps can be looser than the step's, so its merge must know.
    pub(crate) refused_by_cap: bool,
}

/// The transaction a run reads (and, in a plain run, writes).
// One per VM, moved once per run or step thread: boxing the big variant would
// cost an allocation per run for nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum RunView {
    /// The writer's transaction, lent to one run or to a step run on the
    /// writer alone.
    Owned(TxnView<'static>),
    /// The writer's transaction shared, read-only, by the threads of a step
    /// run on several threads; every write of theirs is held back.
    Shared(Arc<TxnView<'static>>),
}

impl RunView {
    pub(crate) fn read(&self) -> &TxnView<'static> {
        match self {
            RunView::Owned(view) => view,
            RunView::Shared(view) => view,
        }
    }

    /// The transaction, to go back to the writer's view. A shared one must
    /// be the last share: a step takes every thread's back first.
    pub(crate) fn into_owned(self) -> TxnView<'static> {
        match self {
            RunView::Owned(view) => view,
            RunView::Shared(view) => Arc::into_inner(view)
                .expect("a step takes back every thread's share of its view before it ends"),
        }
    }
}

/// A put (`Some`) or delete (`None`) a run in a step made.
pub(crate) type DeferredWrite = (Coord, Option<Vec<u8>>);

impl Run {
    /// A plain run at `here`, writing to `view`.
    pub(crate) fn new(
        view: TxnView<'static>,
        here: Coord,
        max_value_bytes: usize,
        walk_limits: WalkLimits,
    ) -> Run {
        Run::on(RunView::Owned(view), here, max_value_bytes, walk_limits)
    }

    /// A run of a step (its writes held back, its reads of the step's
    /// snapshot), on `view`, owned or shared with the step's other threads.
    pub(crate) fn in_step(
        view: RunView,
        here: Coord,
        max_value_bytes: usize,
        walk_limits: WalkLimits,
        snapshot: Option<Arc<StepSnapshot>>,
    ) -> Run {
        Run {
            deferred: Some(Vec::new()),
            snapshot,
            ..Run::on(view, here, max_value_bytes, walk_limits)
        }
    }

    fn on(view: RunView, here: Coord, max_value_bytes: usize, walk_limits: WalkLimits) -> Run {
        Run {
            view,
            here,
            max_value_bytes,
            walk_limits,
            writes: 0,
            write_bytes: 0,
            write_cap: MAX_RUN_WRITES,
            write_bytes_cap: MAX_RUN_WRITE_BYTES,
            deferred: None,
            snapshot: None,
            refused_by_cap: false,
        }
    }
}

/// The cells a step's runs read most: the box around its programs, one
/// cell wider on every side (a rule's neighbourhood), read once before the
/// first run into a dense array. It stays exact for the whole step: the
/// step's writes are held back, and nothing else writes while the step
/// holds the writer. A point read then costs an index instead of a lookup
/// in the store (about 40 ns each; a Game of Life rule makes 29).
pub(crate) struct StepSnapshot {
    lo: Coord,
    sides: [u64; 3],
    cells: Vec<Option<CellValue>>,
}

/// The widest box a snapshot covers, in cells (4 MiB of slots).
const MAX_SNAPSHOT_CELLS: u128 = 1 << 18;

impl StepSnapshot {
    /// The snapshot around `programs` (their bounding box, one cell
    /// wider), or `None` when that box is too big, or holds more cells than
    /// one transaction scan returns: the runs then read the view.
    pub(crate) fn read(
        view: &TxnView<'static>,
        ns: &NamespaceName,
        programs: &[Coord],
    ) -> Option<StepSnapshot> {
        let first = *programs.first()?;
        let (mut lo, mut hi) = (first, first);
        for c in programs {
            lo = Coord::new(lo.x.min(c.x), lo.y.min(c.y), lo.z.min(c.z));
            hi = Coord::new(hi.x.max(c.x), hi.y.max(c.y), hi.z.max(c.z));
        }
        let lo = Coord::new(
            lo.x.saturating_sub(1),
            lo.y.saturating_sub(1),
            lo.z.saturating_sub(1),
        );
        let hi = Coord::new(
            hi.x.saturating_add(1),
            hi.y.saturating_add(1),
            hi.z.saturating_add(1),
        );
        let region = CellBox::new(lo, hi).ok()?;
        let volume = region.volume();
        if volume > MAX_SNAPSHOT_CELLS {
            return None;
        }
        let found = view.scan(ns, &region, MAX_TXN_SCAN_CELLS)?;
        if found.len() >= MAX_TXN_SCAN_CELLS {
            return None;
        }
        let side = |l: i32, h: i32| (i64::from(h) - i64::from(l) + 1) as u64;
        let mut snapshot = StepSnapshot {
            lo,
            sides: [side(lo.x, hi.x), side(lo.y, hi.y), side(lo.z, hi.z)],
            cells: vec![None; volume as usize],
        };
        for (coord, value) in found {
            if let Some(slot) = snapshot.slot(coord) {
                snapshot.cells[slot] = Some(value);
            }
        }
        Some(snapshot)
    }

    fn slot(&self, c: Coord) -> Option<usize> {
        let offset = |v: i32, lo: i32| (i64::from(v) - i64::from(lo)) as u64;
        let (dx, dy, dz) = (
            offset(c.x, self.lo.x),
            offset(c.y, self.lo.y),
            offset(c.z, self.lo.z),
        );
        // A coordinate below `lo` wraps to a huge offset, so one compare
        // per axis covers both sides.
        if dx >= self.sides[0] || dy >= self.sides[1] || dz >= self.sides[2] {
            return None;
        }
        Some(((dx * self.sides[1] + dy) * self.sides[2] + dz) as usize)
    }

    /// `None`: outside the snapshot. `Some(value)`: the cell's value as
    /// the step reads it.
    #[inline]
    pub(crate) fn get(&self, c: Coord) -> Option<Option<&[u8]>> {
        let slot = self.slot(c)?;
        self.cells.get(slot).map(|v| v.as_deref())
    }

    /// Visits the cells of `region` that hold a value, in x, y, z order,
    /// stepping through the slots instead of computing each one; `None`
    /// when the snapshot does not hold the whole box.
    fn visit_box<E>(
        &self,
        region: &CellBox,
        mut visit: impl FnMut(Coord, &[u8]) -> Result<(), E>,
    ) -> Option<Result<(), E>> {
        let (lo, hi) = (region.lo(), region.hi());
        let first = self.slot(lo)?;
        self.slot(hi)?;
        let (y_stride, x_stride) = (
            self.sides[2] as usize,
            (self.sides[1] * self.sides[2]) as usize,
        );
        let mut x_slot = first;
        for x in lo.x..=hi.x {
            let mut y_slot = x_slot;
            for y in lo.y..=hi.y {
                let row = self.cells.get(y_slot..)?;
                for (z, cell) in (lo.z..=hi.z).zip(row) {
                    if let Some(value) = cell
                        && let Err(e) = visit(Coord::new(x, y, z), value)
                    {
                        return Some(Err(e));
                    }
                }
                y_slot += y_stride;
            }
            x_slot += x_stride;
        }
        Some(Ok(()))
    }
}

/// Where the dispatcher finds the current run.
pub(crate) type RunSlot = Rc<RefCell<RunState>>;

/// Makes the VM's dispatcher, serving whatever run `slot` holds.
pub(crate) fn dispatcher(lua: &Lua, slot: RunSlot) -> mlua::Result<mlua::Function> {
    lua.create_function(move |lua, args: Args| {
        let op = args.0;
        // Nothing a program reaches runs Lua from inside a dispatch, so a
        // busy slot cannot happen; refuse rather than panic if it ever did.
        let Ok(mut state) = slot.try_borrow_mut() else {
            return Err(api_error(lua, op, "the API was called re-entrantly"));
        };
        let Some(mut context) = RunContext::of(&mut state) else {
            return Err(api_error(lua, op, "the API is available only during a run"));
        };
        context.dispatch(lua, args)
    })
}

impl<'v> RunContext<'v> {
    /// The run in progress, if any.
    fn of(state: &'v mut RunState) -> Option<RunContext<'v>> {
        let RunState { run, ns } = state;
        let (Some(run), Some(ns)) = (run.as_mut(), ns.as_ref()) else {
            return None;
        };
        Some(RunContext {
            view: &mut run.view,
            ns,
            here: run.here,
            max_value_bytes: run.max_value_bytes,
            walk_limits: run.walk_limits,
            writes: &mut run.writes,
            write_bytes: &mut run.write_bytes,
            write_cap: run.write_cap,
            write_bytes_cap: run.write_bytes_cap,
            deferred: run.deferred.as_mut(),
            snapshot: run.snapshot.as_deref(),
            refused_by_cap: &mut run.refused_by_cap,
        })
    }
}

/// What one call may touch: the run's state, borrowed for the call.
struct RunContext<'v> {
    view: &'v mut RunView,
    ns: &'v NamespaceName,
    here: Coord,
    max_value_bytes: usize,
    walk_limits: WalkLimits,
    writes: &'v mut u32,
    write_bytes: &'v mut usize,
    write_cap: u32,
    write_bytes_cap: usize,
    deferred: Option<&'v mut Vec<DeferredWrite>>,
    snapshot: Option<&'v StepSnapshot>,
    refused_by_cap: &'v mut bool,
}

/// Why a write was refused.
#[derive(Clone, Copy, Debug)]
enum WriteRefusal {
    /// The run's (or its step's) cap on cells written.
    Cells(u32),
    /// The cap on value bytes written.
    Bytes(usize),
    /// A step thread's shared view, which is never written.
    SharedView,
}

/// The dispatcher's arguments: the op, then up to seven values.
pub(crate) type Args = (i64, Value, Value, Value, Value, Value, Value, Value);

fn op_name(op: i64) -> &'static str {
    match op {
        OP_GET => "cube.get",
        OP_PUT => "cube.put",
        OP_DEL => "cube.del",
        OP_NUM => "cube.num",
        OP_INCR => "cube.incr",
        x if x == OP_GET + RELATIVE => "cube.rget",
        x if x == OP_PUT + RELATIVE => "cube.rput",
        x if x == OP_DEL + RELATIVE => "cube.rdel",
        x if x == OP_NUM + RELATIVE => "cube.rnum",
        x if x == OP_INCR + RELATIVE => "cube.rincr",
        OP_COUNT => "cube.count",
        OP_SUM => "cube.sum",
        OP_CELLS => "cube.cells",
        x if x == OP_COUNT + RELATIVE => "cube.rcount",
        x if x == OP_SUM + RELATIVE => "cube.rsum",
        x if x == OP_CELLS + RELATIVE => "cube.rcells",
        OP_EDGES => "cube.edges",
        OP_WALK => "cube.walk",
        OP_NOW => "cube.now",
        _ => "cube",
    }
}

/// An API error, prefixed with the program line that made the call.
fn api_error(lua: &Lua, op: i64, message: impl std::fmt::Display) -> mlua::Error {
    // The API wrapper in the prelude tail-calls the dispatcher, so the
    // program is usually at level 1; look a little further to be sure. A
    // program that itself tail-calls the API (`return cube.num(...)`) has
    // no frame left to name.
    let line = (1..=3).find_map(|level| {
        lua.inspect_stack(level, |debug| {
            let from_program = debug.source().short_src.as_deref() == Some("prog");
            debug.current_line().filter(|_| from_program)
        })
        .flatten()
    });
    let text = match line {
        Some(line) => format!("prog:{line}: {}: {message}", op_name(op)),
        None => format!("{}: {message}", op_name(op)),
    };
    mlua::Error::RuntimeError(text)
}

/// A number from a decimal cell value (what `num`, `incr` and `sum` read).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Number {
    Int(i64),
    Float(f64),
}

impl Number {
    fn as_f64(self) -> f64 {
        match self {
            Number::Int(i) => i as f64,
            Number::Float(f) => f,
        }
    }

    fn into_lua(self) -> Value {
        match self {
            Number::Int(i) => Value::Integer(i),
            Number::Float(f) => Value::Number(f),
        }
    }

    fn add(self, other: Number) -> Option<Number> {
        match (self, other) {
            (Number::Int(a), Number::Int(b)) => a.checked_add(b).map(Number::Int),
            (a, b) => {
                let sum = a.as_f64() + b.as_f64();
                sum.is_finite().then_some(Number::Float(sum))
            }
        }
    }

    /// Decimal text, read back exactly by [`parse_number`].
    pub(crate) fn to_text(self) -> String {
        match self {
            Number::Int(i) => i.to_string(),
            // The shortest text that parses back to the same f64, with an
            // exponent for very large or small ones (`1e300`), and ".0" on
            // integral ones so they stay floats.
            Number::Float(f) => format!("{f:?}"),
        }
    }
}

/// Parses decimal text as Redis INCR reads it: an integer, or (here) a
/// finite decimal float. No spaces, no hex, no `inf` or `nan`.
pub(crate) fn parse_number(bytes: &[u8]) -> Option<Number> {
    let text = std::str::from_utf8(bytes).ok()?;
    if text.is_empty() || text.len() > 64 {
        return None;
    }
    if let Ok(i) = text.parse::<i64>() {
        return Some(Number::Int(i));
    }
    let looks_decimal = text
        .bytes()
        .all(|b| b.is_ascii_digit() || matches!(b, b'+' | b'-' | b'.' | b'e' | b'E'));
    if !looks_decimal {
        return None;
    }
    text.parse::<f64>()
        .ok()
        .filter(|f| f.is_finite())
        .map(Number::Float)
}

/// A short, printable rendering of a value for error messages.
fn shown(bytes: &[u8]) -> String {
    let cut = &bytes[..bytes.len().min(24)];
    let text = String::from_utf8_lossy(cut);
    if bytes.len() > cut.len() {
        format!("{text:?}...")
    } else {
        format!("{text:?}")
    }
}

impl RunContext<'_> {
    fn dispatch(&mut self, lua: &Lua, args: Args) -> mlua::Result<Value> {
        // The eighth value is spare: no op takes seven arguments yet.
        let (op, a, b, c, d, e, f, _spare) = args;
        match op {
            OP_NOW => {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|t| t.as_secs_f64())
                    .unwrap_or(0.0);
                Ok(Value::Number(now))
            }
            OP_EDGES => self.edges(lua, a, b),
            OP_WALK => self.walk(lua, a, b, c),
            OP_COUNT | OP_SUM | OP_CELLS => {
                let region = self.region(lua, op, [&a, &b, &c, &d, &e, &f], false)?;
                self.region_op(lua, op, &region)
            }
            x if x == OP_COUNT + RELATIVE || x == OP_SUM + RELATIVE || x == OP_CELLS + RELATIVE => {
                let region = self.region(lua, op, [&a, &b, &c, &d, &e, &f], true)?;
                self.region_op(lua, op - RELATIVE, &region)
            }
            _ => {
                let relative = op & RELATIVE != 0;
                let coord = self.coord(lua, op, [&a, &b, &c], relative)?;
                match op & !RELATIVE {
                    OP_GET => self.with_value(coord, |value| match value {
                        Some(value) => Ok(Value::String(lua.create_string(value)?)),
                        None => Ok(Value::Nil),
                    }),
                    OP_PUT => {
                        let bytes = self.value_bytes(lua, op, d)?;
                        self.write(lua, op, coord, Some(bytes))?;
                        Ok(Value::Nil)
                    }
                    OP_DEL => {
                        let existed = self.write(lua, op, coord, None)?;
                        Ok(Value::Boolean(existed))
                    }
                    OP_NUM => Ok(self
                        .number_at(lua, op, coord)?
                        .map_or(Value::Nil, Number::into_lua)),
                    OP_INCR => self.incr(lua, op, coord, d),
                    _ => Err(api_error(lua, op, format!("unknown operation {op}"))),
                }
            }
        }
    }

    /// `incr(coord, delta)`: adds `delta` (nil: 1) to the number at
    /// `coord` (none: 0), writes the sum back and returns it.
    fn incr(&mut self, lua: &Lua, op: i64, coord: Coord, delta: Value) -> mlua::Result<Value> {
        let delta = match delta {
            Value::Nil => Number::Int(1),
            Value::Integer(i) => Number::Int(i),
            Value::Number(f) if f.is_finite() => Number::Float(f),
            other => {
                return Err(api_error(
                    lua,
                    op,
                    format!(
                        "the increment must be a finite number, got {}",
                        other.type_name()
                    ),
                ));
            }
        };
        let current = self.number_at(lua, op, coord)?.unwrap_or(Number::Int(0));
        let next = current.add(delta).ok_or_else(|| {
            api_error(
                lua,
                op,
                format!("{current:?} + {delta:?} at {coord} overflows"),
            )
        })?;
        self.write(lua, op, coord, Some(next.to_text().into_bytes()))?;
        Ok(next.into_lua())
    }

    fn integer(lua: &Lua, op: i64, axis: &str, value: &Value) -> mlua::Result<i64> {
        match value {
            Value::Integer(i) => Ok(*i),
            Value::Number(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Ok(*f as i64),
            other => Err(api_error(
                lua,
                op,
                format!(
                    "{axis} must be an integer coordinate, got {}",
                    describe(other)
                ),
            )),
        }
    }

    fn coord(
        &self,
        lua: &Lua,
        op: i64,
        values: [&Value; 3],
        relative: bool,
    ) -> mlua::Result<Coord> {
        let origin = if relative {
            [self.here.x, self.here.y, self.here.z]
        } else {
            [0, 0, 0]
        };
        let mut out = [0i32; 3];
        for (i, axis) in ["x", "y", "z"].into_iter().enumerate() {
            let raw = Self::integer(lua, op, axis, values[i])?;
            let absolute = i64::from(origin[i]).checked_add(raw);
            out[i] = absolute
                .and_then(|a| i32::try_from(a).ok())
                .ok_or_else(|| {
                    let shown =
                        absolute.map_or(format!("{} + {raw}", origin[i]), |a| a.to_string());
                    api_error(
                        lua,
                        op,
                        format!("{axis} = {shown} is outside the 32-bit coordinate range"),
                    )
                })?;
        }
        Ok(Coord::new(out[0], out[1], out[2]))
    }

    fn region(
        &self,
        lua: &Lua,
        op: i64,
        values: [&Value; 6],
        relative: bool,
    ) -> mlua::Result<CellBox> {
        let lo = self.coord(lua, op, [values[0], values[1], values[2]], relative)?;
        let hi = self.coord(lua, op, [values[3], values[4], values[5]], relative)?;
        CellBox::new(lo, hi).map_err(|why| api_error(lua, op, why))
    }

    fn value_bytes(&self, lua: &Lua, op: i64, value: Value) -> mlua::Result<Vec<u8>> {
        let bytes = match value {
            Value::String(s) => s.as_bytes().to_vec(),
            Value::Integer(i) => Number::Int(i).to_text().into_bytes(),
            Value::Number(f) if f.is_finite() => Number::Float(f).to_text().into_bytes(),
            Value::Nil => {
                return Err(api_error(
                    lua,
                    op,
                    "the value is nil; use cube.del to delete a cell",
                ));
            }
            other => {
                return Err(api_error(
                    lua,
                    op,
                    format!(
                        "the value must be a string or a finite number, got {}",
                        describe(&other)
                    ),
                ));
            }
        };
        if bytes.len() > self.max_value_bytes {
            return Err(api_error(
                lua,
                op,
                format!(
                    "the value is {} bytes, over the server's limit of {} (--max-value-bytes)",
                    bytes.len(),
                    self.max_value_bytes
                ),
            ));
        }
        Ok(bytes)
    }

    /// Writes (or, with `None`, deletes) a cell; returns whether it had a
    /// value before.
    fn write(
        &mut self,
        lua: &Lua,
        op: i64,
        coord: Coord,
        value: Option<Vec<u8>>,
    ) -> mlua::Result<bool> {
        // A run in a step may be capped below a run's own limits by what
        // the step's earlier runs wrote; the message says which limit.
        let whose = |step_bound: bool| {
            if step_bound {
                "the runs of one step together"
            } else {
                "a run"
            }
        };
        let refusal = match self.write_within_caps(coord, value) {
            Ok(existed) => return Ok(existed),
            Err(refusal) => refusal,
        };
        let message = match refusal {
            WriteRefusal::Cells(cap) => {
                let who = whose(cap < MAX_RUN_WRITES);
                format!("{who} may write at most {cap} cells")
            }
            WriteRefusal::Bytes(cap) => {
                let who = whose(cap < MAX_RUN_WRITE_BYTES);
                format!("{who} may write at most {cap} bytes of values")
            }
            // A shared view belongs to a step thread, whose writes are all
            // held back.
            WriteRefusal::SharedView => "internal: a step thread wrote to its view".to_owned(),
        };
        if matches!(refusal, WriteRefusal::Cells(_) | WriteRefusal::Bytes(_)) {
            *self.refused_by_cap = true;
        }
        Err(api_error(lua, op, message))
    }

    /// [`RunContext::write`] without the error: a refused write changes
    /// nothing, so the fast path can leave it to the dispatcher.
    fn write_within_caps(
        &mut self,
        coord: Coord,
        value: Option<Vec<u8>>,
    ) -> Result<bool, WriteRefusal> {
        if *self.writes >= self.write_cap {
            return Err(WriteRefusal::Cells(self.write_cap));
        }
        let len = value.as_ref().map_or(0, Vec::len);
        if *self.write_bytes + len > self.write_bytes_cap {
            return Err(WriteRefusal::Bytes(self.write_bytes_cap));
        }
        if self.deferred.is_some() {
            // The step applies it after its last run; reads go on seeing
            // the state from before the step. A delete answers whether the
            // cell held a value before the step, which is what the run can
            // read.
            let existed = value.is_none() && self.with_value(coord, |v| v.is_some());
            *self.writes += 1;
            *self.write_bytes += len;
            if let Some(deferred) = self.deferred.as_mut() {
                deferred.push((coord, value));
            }
            return Ok(existed);
        }
        let RunView::Owned(view) = &mut *self.view else {
            return Err(WriteRefusal::SharedView);
        };
        *self.writes += 1;
        *self.write_bytes += len;
        Ok(match value {
            Some(bytes) => {
                view.put(self.ns, coord, bytes);
                false
            }
            None => view.del(self.ns, coord),
        })
    }

    /// Calls `f` with the cell's value as the run may read it: from the
    /// step's snapshot when the cell is inside it, else from the view.
    fn with_value<R>(&self, coord: Coord, f: impl FnOnce(Option<&[u8]>) -> R) -> R {
        if let Some(found) = self.snapshot.and_then(|s| s.get(coord)) {
            return f(found);
        }
        f(self.view.read().get(self.ns, coord).as_deref())
    }

    fn number_at(&self, lua: &Lua, op: i64, coord: Coord) -> mlua::Result<Option<Number>> {
        self.with_value(coord, |value| match value {
            None => Ok(None),
            Some(bytes) => parse_number(bytes).map(Some).ok_or_else(|| {
                api_error(
                    lua,
                    op,
                    format!(
                        "the cell {coord} holds {}, not a decimal number",
                        shown(bytes)
                    ),
                )
            }),
        })
    }

    /// Visits the cells of a box of at most [`POINT_READ_VOLUME`] cells
    /// that hold a value, point by point (from the step's snapshot when it
    /// holds the box), uncharged.
    fn visit_points<E>(
        &self,
        region: &CellBox,
        mut visit: impl FnMut(Coord, &[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        debug_assert!(region.volume() <= POINT_READ_VOLUME);
        let (lo, hi) = (region.lo(), region.hi());
        if let Some(visited) = self
            .snapshot
            .and_then(|snapshot| snapshot.visit_box(region, &mut visit))
        {
            return visited;
        }
        let mut coords = [Coord::new(0, 0, 0); POINT_READ_VOLUME as usize];
        let mut n = 0;
        for x in lo.x..=hi.x {
            for y in lo.y..=hi.y {
                for z in lo.z..=hi.z {
                    coords[n] = Coord::new(x, y, z);
                    n += 1;
                }
            }
        }
        let mut outcome = Ok(());
        self.view
            .read()
            .get_each(self.ns, &coords[..n], |coord, value| {
                if outcome.is_ok() {
                    outcome = visit(coord, value);
                }
            });
        outcome
    }

    /// Visits the cells of `region` that hold a value (overlay included),
    /// at most [`MAX_REGION_CELLS`], charged to the run's fuel. Small boxes
    /// are read point by point under one lock hold, without copying.
    fn visit_region(
        &self,
        lua: &Lua,
        op: i64,
        region: &CellBox,
        mut visit: impl FnMut(Coord, &[u8]) -> mlua::Result<()>,
    ) -> mlua::Result<()> {
        let volume = region.volume();
        if volume <= POINT_READ_VOLUME {
            charge(volume as u64 * REGION_CELL_FUEL)?;
            return self.visit_points(region, visit);
        }
        let cells: Vec<(Coord, CellValue)> = self
            .view
            .read()
            .scan(self.ns, region, MAX_REGION_CELLS + 1)
            .unwrap_or_default();
        charge(cells.len() as u64 * REGION_CELL_FUEL)?;
        if cells.len() > MAX_REGION_CELLS {
            return Err(api_error(
                lua,
                op,
                format!(
                    "the box {region} holds more than {MAX_REGION_CELLS} cells; read it in smaller boxes"
                ),
            ));
        }
        for (coord, value) in &cells {
            visit(*coord, value)?;
        }
        Ok(())
    }

    fn region_op(&self, lua: &Lua, op: i64, region: &CellBox) -> mlua::Result<Value> {
        match op {
            OP_COUNT => {
                let mut count = 0i64;
                self.visit_region(lua, op, region, |_, _| {
                    count += 1;
                    Ok(())
                })?;
                Ok(Value::Integer(count))
            }
            OP_SUM => {
                let mut total = Number::Int(0);
                self.visit_region(lua, op, region, |coord, bytes| {
                    let n = parse_number(bytes).ok_or_else(|| {
                        api_error(
                            lua,
                            op,
                            format!(
                                "the cell {coord} holds {}, not a decimal number",
                                shown(bytes)
                            ),
                        )
                    })?;
                    total = total.add(n).ok_or_else(|| {
                        api_error(lua, op, format!("the sum over {region} overflows"))
                    })?;
                    Ok(())
                })?;
                Ok(total.into_lua())
            }
            _ => {
                let flat = lua.create_table()?;
                let mut at = 0usize;
                self.visit_region(lua, op, region, |coord, bytes| {
                    flat.raw_seti(at + 1, coord.x)?;
                    flat.raw_seti(at + 2, coord.y)?;
                    flat.raw_seti(at + 3, coord.z)?;
                    flat.raw_seti(at + 4, lua.create_string(bytes)?)?;
                    at += 4;
                    Ok(())
                })?;
                Ok(Value::Table(flat))
            }
        }
    }

    fn direction(lua: &Lua, op: i64, value: &Value) -> mlua::Result<Direction> {
        match value {
            Value::Nil => Ok(Direction::Out),
            Value::String(s) => match s.as_bytes().as_ref() {
                b"out" => Ok(Direction::Out),
                b"in" => Ok(Direction::In),
                b"both" => Ok(Direction::Both),
                other => Err(api_error(
                    lua,
                    op,
                    format!(
                        "direction must be \"out\", \"in\" or \"both\", got {}",
                        shown(other)
                    ),
                )),
            },
            other => Err(api_error(
                lua,
                op,
                format!(
                    "direction must be \"out\", \"in\" or \"both\", got {}",
                    describe(other)
                ),
            )),
        }
    }

    fn label(lua: &Lua, op: i64, value: &Value) -> mlua::Result<Option<EdgeLabel>> {
        match value {
            Value::Nil => Ok(None),
            Value::String(s) => {
                let text = s
                    .to_str()
                    .map_err(|_| api_error(lua, op, "the label is not UTF-8"))?;
                EdgeLabel::new(&text)
                    .map(Some)
                    .map_err(|why| api_error(lua, op, why))
            }
            other => Err(api_error(
                lua,
                op,
                format!("the label must be a string, got {}", describe(other)),
            )),
        }
    }

    /// The program's own edges as a list of `{x, y, z, label, weight,
    /// dir}` tables, as of the last durable group (see docs/programs.md).
    fn edges(&self, lua: &Lua, direction: Value, label: Value) -> mlua::Result<Value> {
        let direction = Self::direction(lua, OP_EDGES, &direction)?;
        let label = Self::label(lua, OP_EDGES, &label)?;
        let edges = self
            .view
            .read()
            .store()
            .edges(
                self.ns,
                self.here,
                direction,
                label.as_ref(),
                MAX_PROGRAM_EDGES,
            )
            .unwrap_or_default();
        charge(edges.len() as u64 * REGION_CELL_FUEL)?;
        let list = lua.create_table_with_capacity(edges.len(), 0)?;
        for (i, edge) in edges.iter().enumerate() {
            let entry = lua.create_table_with_capacity(0, 6)?;
            entry.raw_set("x", edge.other.x)?;
            entry.raw_set("y", edge.other.y)?;
            entry.raw_set("z", edge.other.z)?;
            entry.raw_set("label", edge.label.as_str())?;
            entry.raw_set("weight", edge.weight)?;
            entry.raw_set("dir", edge.direction.name())?;
            list.raw_seti(i + 1, entry)?;
        }
        Ok(Value::Table(list))
    }

    /// Breadth-first from the program's cell, at most `depth` hops, within
    /// the server's walk limits: a list of `{x, y, z, depth}` tables.
    fn walk(&self, lua: &Lua, depth: Value, direction: Value, label: Value) -> mlua::Result<Value> {
        let depth = match depth {
            Value::Nil => self.walk_limits.max_depth,
            other => {
                let d = Self::integer(lua, OP_WALK, "depth", &other)?;
                u32::try_from(d)
                    .ok()
                    .filter(|d| *d >= 1)
                    .ok_or_else(|| api_error(lua, OP_WALK, "depth must be at least 1"))?
                    .min(self.walk_limits.max_depth)
            }
        };
        let direction = Self::direction(lua, OP_WALK, &direction)?;
        let label = Self::label(lua, OP_WALK, &label)?;
        let limits = WalkLimits {
            max_depth: depth,
            max_nodes: self.walk_limits.max_nodes.min(MAX_PROGRAM_EDGES as u32),
            ..self.walk_limits
        };
        // Without values a walk reads no cell, so it cannot fail a read.
        let Some(Ok(walk)) = self.view.read().store().walk(
            self.ns,
            self.here,
            direction,
            label.as_ref(),
            false,
            limits,
        ) else {
            return Ok(Value::Table(lua.create_table()?));
        };
        charge(
            walk.edges_examined
                .saturating_add(walk.nodes.len() as u64)
                .saturating_mul(REGION_CELL_FUEL / 4),
        )?;
        let list = lua.create_table_with_capacity(walk.nodes.len(), 0)?;
        for (i, node) in walk.nodes.iter().enumerate() {
            let entry = lua.create_table_with_capacity(0, 4)?;
            entry.raw_set("x", node.coord.x)?;
            entry.raw_set("y", node.coord.y)?;
            entry.raw_set("z", node.coord.z)?;
            entry.raw_set("depth", node.distance)?;
            list.raw_seti(i + 1, entry)?;
        }
        Ok(Value::Table(list))
    }
}

fn describe(value: &Value) -> String {
    match value {
        Value::Number(f) => format!("{f}"),
        Value::Integer(i) => format!("{i}"),
        Value::String(s) => shown(&s.as_bytes()),
        other => other.type_name().to_owned(),
    }
}

/// Sets the run's own coordinate on the API table.
/// `before`: where the table was set for last (a step's runs go in curve
/// order, so most change only one or two axes).
pub(crate) fn set_here(api: &Table, before: Option<Coord>, here: Coord) -> mlua::Result<()> {
    if before.is_none_or(|b| b.x != here.x) {
        api.raw_set("x", here.x)?;
    }
    if before.is_none_or(|b| b.y != here.y) {
        api.raw_set("y", here.y)?;
    }
    if before.is_none_or(|b| b.z != here.z) {
        api.raw_set("z", here.z)?;
    }
    Ok(())
}

/// Sets the run's namespace on the API table.
pub(crate) fn set_here_ns(api: &Table, ns: &NamespaceName) -> mlua::Result<()> {
    api.raw_set("ns", ns.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot of the box `lo..=hi` holding `present` (value = index).
    fn snapshot(lo: Coord, hi: Coord, present: &[Coord]) -> StepSnapshot {
        let side = |l: i32, h: i32| (i64::from(h) - i64::from(l) + 1) as u64;
        let sides = [side(lo.x, hi.x), side(lo.y, hi.y), side(lo.z, hi.z)];
        let mut snapshot = StepSnapshot {
            lo,
            sides,
            cells: vec![None; (sides[0] * sides[1] * sides[2]) as usize],
        };
        for (i, c) in present.iter().enumerate() {
            let slot = snapshot.slot(*c).unwrap();
            snapshot.cells[slot] = Some(CellValue::from(vec![i as u8]));
        }
        snapshot
    }

    #[test]
    fn a_snapshot_answers_inside_its_box_only_even_at_the_edges_of_space() {
        let lo = Coord::new(i32::MIN, -1, i32::MAX - 2);
        let hi = Coord::new(i32::MIN + 3, 1, i32::MAX);
        let present = [lo, hi, Coord::new(i32::MIN + 1, 0, i32::MAX - 1)];
        let s = snapshot(lo, hi, &present);
        for (i, c) in present.iter().enumerate() {
            assert_eq!(s.get(*c), Some(Some(&[i as u8][..])), "{c}");
        }
        assert_eq!(s.get(Coord::new(i32::MIN + 2, 0, i32::MAX)), Some(None));
        for outside in [
            Coord::new(i32::MIN + 4, 0, i32::MAX),
            Coord::new(i32::MIN, -2, i32::MAX),
            Coord::new(i32::MIN, 2, i32::MAX),
            Coord::new(i32::MIN, 0, i32::MAX - 3),
            Coord::new(i32::MAX, 0, i32::MAX),
            Coord::new(0, 0, 0),
        ] {
            assert_eq!(s.get(outside), None, "{outside}");
        }
        // The whole box, visited slot by slot, finds what the point reads
        // find, in x, y, z order; a box reaching outside is not visited.
        let mut found = Vec::new();
        let visited = s.visit_box(&CellBox::new(lo, hi).unwrap(), |c, v| {
            found.push((c, v[0]));
            Ok::<(), ()>(())
        });
        assert_eq!(visited, Some(Ok(())));
        assert_eq!(
            found,
            vec![(present[0], 0), (present[2], 2), (present[1], 1)]
        );
        let inner = CellBox::new(Coord::new(i32::MIN + 1, 0, i32::MAX - 1), hi).unwrap();
        let mut found = Vec::new();
        s.visit_box(&inner, |c, _| {
            found.push(c);
            Ok::<(), ()>(())
        });
        assert_eq!(found, vec![present[2], present[1]]);
        let wider = CellBox::new(lo, Coord::new(i32::MIN + 4, 1, i32::MAX)).unwrap();
        assert_eq!(s.visit_box(&wider, |_, _| Ok::<(), ()>(())), None);
    }

    #[test]
    fn decimal_text_parses_like_incr_and_round_trips() {
        assert_eq!(parse_number(b"42"), Some(Number::Int(42)));
        assert_eq!(parse_number(b"-7"), Some(Number::Int(-7)));
        assert_eq!(parse_number(b"0.5"), Some(Number::Float(0.5)));
        assert_eq!(parse_number(b"1e3"), Some(Number::Float(1000.0)));
        for bad in [
            &b""[..],
            b" 1",
            b"0x10",
            b"inf",
            b"nan",
            b"abc",
            b"1 ",
            b"\xff",
        ] {
            assert_eq!(parse_number(bad), None, "{bad:?}");
        }
        for n in [
            Number::Int(i64::MIN),
            Number::Float(0.1),
            Number::Float(2.0),
            Number::Float(1e300),
            Number::Float(-3.25),
        ] {
            assert_eq!(parse_number(n.to_text().as_bytes()), Some(n), "{n:?}");
        }
        assert_eq!(Number::Int(i64::MAX).add(Number::Int(1)), None);
        assert_eq!(
            Number::Int(1).add(Number::Float(0.5)),
            Some(Number::Float(1.5))
        );
    }
}
