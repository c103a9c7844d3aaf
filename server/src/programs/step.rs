//! `step`: every program stored in a box runs once, as one transaction.
//!
//! A step is what a cellular automaton needs: each run reads the state
//! from before the step (its writes, and every other run's, are held back
//! until the last run ends), so the order of the runs cannot change what
//! they compute. Each run is still atomic on its own: a failed run's
//! writes are dropped and its failure is recorded in its cell's telemetry,
//! like a failed `run`. The writes of the runs that succeeded, in the
//! step's (curve) order, and one telemetry record per run commit as one
//! WAL group, so one fsync and one writer transaction carry thousands of
//! cell-programs instead of one each. The writes are applied one run at a
//! time, in that order: a run whose writes would take the namespace past a
//! quota is undone alone and fails like a `run` over its quota, recorded.
//!
//! Because the runs cannot see each other, a big step runs them on
//! several step threads, each running contiguous parts of the
//! programs (see [`run_programs`]); only the runs' execution is parallel,
//! everything the writer's transaction records is done after, on the
//! writer, in order.
//!
//! Limits, because a step holds the writer: at most
//! [`MAX_STEP_PROGRAMS`] programs; the runs together write at most what
//! fits in one transaction beside their telemetry; the step's writer time
//! is bounded by `--program-step-ms`, after which the remaining runs fail
//! as out of fuel without running.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Instant;

use cube_protocol::{CellBox, Coord, NamespaceName, RunOutcome, RunRecord, StepFailure, StepReply};
use cube_store::{MAX_TXN_MUTATIONS, StoredProgram, TelemetryHead, TxnView};

use super::api::{DeferredWrite, MAX_RUN_WRITE_BYTES, MAX_RUN_WRITES, Run, RunView, StepSnapshot};
use super::sandbox::{ProgramVm, RunBudget, with_vm};
use super::{
    MAX_OUTCOME_MESSAGE_BYTES, ProgramSettings, ProgramStats, cut, duration_ns, failed_outcome,
    telemetry_append, unix_us,
};

/// Most programs one step runs. With one write per run and one telemetry
/// record per run, a full 32^3 step fits one transaction exactly.
pub(crate) const MAX_STEP_PROGRAMS: usize = 32_768;
/// Most value bytes all runs of one step write together.
pub(crate) const MAX_STEP_WRITE_BYTES: usize = 64 * 1024 * 1024;

const _: () = assert!(2 * MAX_STEP_PROGRAMS <= MAX_TXN_MUTATIONS);

/// What a step's transaction hands back for its answer.
pub(crate) enum StepOutput {
    NoNamespace(NamespaceName),
    TooManyPrograms,
    Unavailable(String),
    Ran(StepReply),
}

/// One run of the step, as its telemetry record will say.
struct Ran {
    coord: Coord,
    record: RunRecord,
    failure: Option<(RunOutcome, String)>,
    /// How many of the step's held-back writes are this run's (the next
    /// ones in order); 0 for a failed run.
    writes: usize,
    /// What the run wrote before it ended, failed or not (a failed run's
    /// writes are dropped), and whether a cap refused one of its writes:
    /// what a step run in parts checks against the caps the run would
    /// have had in one.
    wrote: (u32, usize),
    refused_by_cap: bool,
    /// The cell's telemetry head before the step, read with its part's
    /// (only this run's own record, written after every run, changes it).
    head: TelemetryHead,
}

/// Fewest programs per step thread: a helper thread costs a thread,
/// a VM and a compilation of each source, some hundreds of microseconds,
/// which a thousand runs of a few microseconds repay.
const MIN_PROGRAMS_PER_STEP_THREAD: usize = 1024;

/// What every thread of one step shares.
struct StepInput<'a> {
    ns: &'a NamespaceName,
    region: CellBox,
    args: &'a [Vec<u8>],
    settings: &'a ProgramSettings,
    deadline: Instant,
    /// Cells the runs may write together, beside their telemetry.
    write_room: u32,
}

/// What the runs of one part (contiguous programs of the step, in order)
/// did.
struct PartOutput {
    ran: Vec<Ran>,
    writes: Vec<DeferredWrite>,
    /// The part's view, given back so the writer can take the transaction
    /// back once every part has returned its share.
    view: RunView,
    compiles: u64,
}

/// The runs of a step, in order, as the parts handed them back: joined
/// into one vector, a 32^3 step's runs were megabytes copied (and, fresh
/// memory, page faults) on the writer.
#[derive(Default)]
struct Runs {
    parts: Vec<Vec<Ran>>,
}

impl Runs {
    fn push_part(&mut self, part: Vec<Ran>) {
        self.parts.push(part);
    }

    fn len(&self) -> usize {
        self.parts.iter().map(Vec::len).sum()
    }

    fn iter(&self) -> impl Iterator<Item = &Ran> {
        self.parts.iter().flatten()
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = &mut Ran> {
        self.parts.iter_mut().flatten()
    }

    fn into_runs(self) -> impl Iterator<Item = Ran> {
        self.parts.into_iter().flatten()
    }

    /// Keeps the first `len` runs.
    fn truncate(&mut self, mut len: usize) {
        let mut kept = 0;
        for part in &mut self.parts {
            part.truncate(len);
            len -= part.len();
            kept += 1;
            if len == 0 {
                break;
            }
        }
        self.parts.truncate(kept);
    }
}

/// Runs `programs`, in order, in `vm`. Each run's caps are what the
/// part's earlier runs, and `written_before` (cells and value bytes the
/// step's runs before the part wrote, when they are known), left of the
/// step's: for a part that holds the whole step, exactly the step's caps.
fn run_part(
    vm: &mut ProgramVm,
    step: &StepInput<'_>,
    programs: &[StoredProgram],
    view: RunView,
    snapshot: Option<Arc<StepSnapshot>>,
    written_before: (u32, usize),
) -> PartOutput {
    let compiled_before = vm.compiles;
    let mut ran: Vec<Ran> = Vec::with_capacity(programs.len());
    let mut held = PartWrites::default();
    // Every head the part's runs record from, read in one pass: one at a
    // time, each was a cache miss in a map of megabytes.
    let cells: Vec<Coord> = programs.iter().map(|(coord, _)| *coord).collect();
    let mut heads = view
        .read()
        .telemetry_heads(step.ns, &cells)
        .into_iter()
        .map(Option::unwrap_or_default);
    start_part_run(vm, step, view, snapshot);
    let clock = PartClock::start();
    for (coord, source) in programs {
        let Some(head) = heads.next() else {
            unreachable!("one head was read per program");
        };
        let cell = Cell {
            coord: *coord,
            source,
            head,
        };
        ran.push(run_cell(vm, step, cell, &clock, written_before, &mut held));
    }
    let run = vm.slot.borrow_mut().run.take();
    let Some(run) = run else {
        unreachable!("nothing but this part takes its run out of the slot");
    };
    assert!(held.writes.len() + written_before.0 as usize <= step.write_room as usize);
    PartOutput {
        ran,
        writes: held.writes,
        view: run.view,
        compiles: vm.compiles - compiled_before,
    }
}

/// The writes a part's runs that succeeded hold back, in order, and their
/// value bytes.
#[derive(Default)]
struct PartWrites {
    writes: Vec<DeferredWrite>,
    bytes: usize,
}

/// One program of a part, with its cell's telemetry head.
struct Cell<'a> {
    coord: Coord,
    source: &'a Arc<[u8]>,
    head: TelemetryHead,
}

/// When a part started, by the monotonic clock and the wall clock: one
/// wall-clock read per part; each run's start is offset from it by the
/// monotonic clock (a step lasts seconds at most).
struct PartClock {
    started: Instant,
    started_unix_us: u64,
}

impl PartClock {
    fn start() -> PartClock {
        let (started, started_unix_us) = (Instant::now(), unix_us());
        PartClock {
            started,
            started_unix_us,
        }
    }

    /// A run's record as it starts at `cell_started`.
    fn record_from(&self, cell_started: Instant) -> RunRecord {
        let since_part_us = cell_started.duration_since(self.started).as_micros();
        RunRecord {
            seq: 0,
            started_unix_us: self.started_unix_us.saturating_add(since_part_us as u64),
            duration_ns: 0,
            instructions: 0,
            cells_written: 0,
            outcome: RunOutcome::Ok,
            message: String::new(),
        }
    }
}

/// Puts the part's run (in a step: its writes held back) in `vm`'s slot,
/// for every run of the part to use in turn.
fn start_part_run(
    vm: &mut ProgramVm,
    step: &StepInput<'_>,
    view: RunView,
    snapshot: Option<Arc<StepSnapshot>>,
) {
    let settings = step.settings;
    let mut slot = vm.slot.borrow_mut();
    if slot.ns.as_ref() != Some(step.ns) {
        slot.ns = Some(step.ns.clone());
    }
    slot.run = Some(Run::in_step(
        view,
        step.region.lo(),
        settings.max_value_bytes,
        settings.walk_limits,
        snapshot,
    ));
}

/// Runs the program of one cell of a part, its writes held back in
/// `held` if it succeeds; what it did, as its telemetry record will say.
fn run_cell(
    vm: &mut ProgramVm,
    step: &StepInput<'_>,
    cell: Cell<'_>,
    clock: &PartClock,
    written_before: (u32, usize),
    held: &mut PartWrites,
) -> Ran {
    let cell_started = Instant::now();
    let mut record = clock.record_from(cell_started);
    let left = step.deadline.saturating_duration_since(cell_started);
    if left.is_zero() {
        return Ran {
            coord: cell.coord,
            record,
            failure: Some((
                RunOutcome::Fuel,
                "the step ran out of time before this run started \
                 (--program-step-ms); it did not run"
                    .to_owned(),
            )),
            writes: 0,
            wrote: (0, 0),
            refused_by_cap: false,
            head: cell.head,
        };
    }
    reset_run_for(vm, step, cell.coord, written_before, held);
    let budget = RunBudget {
        time: step.settings.budget.time.min(left),
        ..step.settings.budget
    };
    let outcome = match vm.set_here(step.ns, cell.coord) {
        Ok(()) => vm.run(
            cell.source,
            step.args,
            budget,
            cell_started,
            |runner, call_args| runner.call::<()>(call_args),
        ),
        Err(e) => super::sandbox::LuaOutcome {
            result: Err(super::sandbox::Failure {
                spent: None,
                message: super::sandbox::error_text(&e),
            }),
            fuel_used: 0,
        },
    };
    let failure = outcome.result.err().map(failed_outcome);
    let (kept, wrote, refused_by_cap) = take_run_writes(vm, failure.is_none(), &mut record, held);
    record.instructions = outcome.fuel_used;
    record.duration_ns = duration_ns(cell_started.elapsed());
    Ran {
        coord: cell.coord,
        record,
        failure,
        writes: kept,
        wrote,
        refused_by_cap,
        head: cell.head,
    }
}

/// Readies the slot's run for the run at `coord`: nothing written yet,
/// and caps of what the step's earlier runs (`written_before` and the
/// part's `held`) left.
fn reset_run_for(
    vm: &mut ProgramVm,
    step: &StepInput<'_>,
    coord: Coord,
    written_before: (u32, usize),
    held: &PartWrites,
) {
    if let Some(run) = vm.slot.borrow_mut().run.as_mut() {
        run.here = coord;
        run.writes = 0;
        run.write_bytes = 0;
        run.refused_by_cap = false;
        run.write_cap =
            MAX_RUN_WRITES.min(step.write_room - written_before.0 - held.writes.len() as u32);
        run.write_bytes_cap =
            MAX_RUN_WRITE_BYTES.min(MAX_STEP_WRITE_BYTES - written_before.1 - held.bytes);
    }
}

/// Takes the writes the run that just ended held back: into `held` if it
/// `succeeded` (counted in its `record`), dropped if not. Returns how many
/// it kept, what it wrote (cells, value bytes) and whether a cap refused
/// one of its writes.
fn take_run_writes(
    vm: &mut ProgramVm,
    succeeded: bool,
    record: &mut RunRecord,
    held: &mut PartWrites,
) -> (usize, (u32, usize), bool) {
    let mut kept = 0;
    let mut wrote = (0, 0);
    let mut refused_by_cap = false;
    let mut slot = vm.slot.borrow_mut();
    if let Some(run) = slot.run.as_mut()
        && let Some(deferred) = run.deferred.as_mut()
    {
        wrote = (run.writes, run.write_bytes);
        refused_by_cap = run.refused_by_cap;
        if succeeded {
            record.cells_written = run.writes;
            held.bytes += run.write_bytes;
            kept = deferred.len();
            held.writes.append(deferred);
        } else {
            deferred.clear();
        }
    }
    (kept, wrote, refused_by_cap)
}

/// The first run that, done in a part, might have gone otherwise than on
/// one thread: a part's caps are looser than the step's (its earlier runs
/// are fewer), so a run that a cap refused, or that wrote past what the
/// step would have left it, might have. Every run before it did exactly
/// what it would have done on one thread.
fn first_divergence(ran: &Runs, write_room: u32) -> Option<usize> {
    let (mut writes, mut bytes) = (0u32, 0usize);
    for (i, run) in ran.iter().enumerate() {
        let cap = MAX_RUN_WRITES.min(write_room - writes);
        let bytes_cap = MAX_RUN_WRITE_BYTES.min(MAX_STEP_WRITE_BYTES - bytes);
        if run.refused_by_cap || run.wrote.0 > cap || run.wrote.1 > bytes_cap {
            return Some(i);
        }
        if run.failure.is_none() {
            writes += run.wrote.0;
            bytes += run.wrote.1;
        }
    }
    None
}

/// How many threads a step of `programs` runs on (the writer and helpers).
fn step_thread_count(threads: usize, programs: usize) -> usize {
    threads.min(programs / MIN_PROGRAMS_PER_STEP_THREAD).max(1)
}

/// Programs in each part the step threads take in turn: one part per
/// thread. A thread reads its part's telemetry heads in one pass in the map's bucket
/// order, which pays only over a dense share of the map: parts of an
/// eighth of a thread's share, taken in turn so that a thread slowed down by
/// other work took fewer, measured slower in the daemon (a 32^3 step: 31.5
/// against 36.7 ms median, side by side).
fn part_len(threads: usize, programs: usize) -> usize {
    programs.div_ceil(threads)
}

/// Runs every program of the step: on the writer alone, or in parts taken
/// in turn by up to `settings.step_threads` step threads, each with its own
/// VM, all reading the one transaction (shared, read-only: every write of
/// a step is held back) and the snapshot. The parts' runs come back in
/// the step's order, so what follows cannot tell how they ran. The view goes
/// back to the writer's transaction before this returns.
fn run_programs(
    vm: &mut ProgramVm,
    view: &mut TxnView<'_>,
    step: &StepInput<'_>,
    programs: &[StoredProgram],
    stats: &ProgramStats,
) -> (Runs, Vec<DeferredWrite>, u64) {
    let detached = view.detach();
    let cells: Vec<Coord> = programs.iter().map(|(coord, _)| *coord).collect();
    let snapshot = StepSnapshot::read(&detached, step.ns, &cells).map(Arc::new);
    let threads = step_thread_count(step.settings.step_threads, programs.len());
    if threads == 1 {
        let whole = run_part(
            vm,
            step,
            programs,
            RunView::Owned(detached),
            snapshot,
            (0, 0),
        );
        view.attach(whole.view.into_owned());
        let mut ran = Runs::default();
        ran.push_part(whole.ran);
        return (ran, whole.writes, whole.compiles);
    }
    stats.steps_parallel.fetch_add(1, Relaxed);
    let shared = Arc::new(detached);
    let part_len = part_len(threads, programs.len());
    let parts: Vec<&[StoredProgram]> = programs.chunks(part_len).collect();
    assert!(threads <= crate::config::MAX_STEP_THREADS && parts.len() == threads);
    let outputs = run_parts_on_threads(vm, step, &parts, &shared, &snapshot);
    let (mut ran, mut writes, compiles) = join_parts(outputs);
    let detached = RunView::Shared(shared).into_owned();
    let Some(diverged) = first_divergence(&ran, step.write_room) else {
        view.attach(detached);
        return (ran, writes, compiles);
    };
    // Rare: runs that write near the step's caps. The runs before the
    // first that might have gone otherwise are one thread's; the rest run
    // again on the writer alone, from where one thread would have been,
    // within what is left of the step's time.
    stats.steps_redone.fetch_add(1, Relaxed);
    ran.truncate(diverged);
    writes.truncate(ran.iter().map(|r| r.writes).sum());
    let written = ran
        .iter()
        .filter(|r| r.failure.is_none())
        .fold((0, 0), |(w, b), r| (w + r.wrote.0, b + r.wrote.1));
    let rest = run_part(
        vm,
        step,
        &programs[diverged..],
        RunView::Owned(detached),
        snapshot,
        written,
    );
    view.attach(rest.view.into_owned());
    ran.push_part(rest.ran);
    writes.extend(rest.writes);
    (ran, writes, compiles + rest.compiles)
}

/// Runs `parts` on the writer's `vm` and one helper step thread per part
/// but the first, each thread reading the `shared` view; every part's
/// output once, in the parts' order.
fn run_parts_on_threads(
    vm: &mut ProgramVm,
    step: &StepInput<'_>,
    parts: &[&[StoredProgram]],
    shared: &Arc<TxnView<'static>>,
    snapshot: &Option<Arc<StepSnapshot>>,
) -> Vec<(usize, PartOutput)> {
    let next_part = AtomicUsize::new(0);
    // Each thread takes the next part left until none is: a helper that
    // could not start, or started late, leaves its part to the others.
    let take_parts = |vm: &mut ProgramVm| -> Vec<(usize, PartOutput)> {
        let mut done = Vec::new();
        loop {
            let i = next_part.fetch_add(1, Relaxed);
            let Some(part) = parts.get(i) else {
                return done;
            };
            let view = RunView::Shared(Arc::clone(shared));
            done.push((i, run_part(vm, step, part, view, snapshot.clone(), (0, 0))));
        }
    };
    let mut outputs: Vec<(usize, PartOutput)> = std::thread::scope(|scope| {
        let helpers: Vec<_> = (1..parts.len())
            .map(|_| {
                std::thread::Builder::new()
                    // The name predates the word "step thread"; ps and top show it.
                    .name("cube-step-lane".into())
                    .spawn_scoped(scope, || with_vm(take_parts))
            })
            .collect();
        let mut outputs = take_parts(vm);
        for helper in helpers {
            match helper.map(|h| h.join()) {
                Ok(Ok(Ok(done))) => outputs.extend(done),
                Ok(Err(panic)) => std::panic::resume_unwind(panic),
                // No thread, or no VM on it: it took no part, and the
                // writer took the parts it would have.
                Ok(Ok(Err(_))) | Err(_) => {}
            }
        }
        outputs
    });
    outputs.sort_unstable_by_key(|(i, _)| *i);
    assert!(
        outputs.iter().map(|(i, _)| *i).eq(0..parts.len()),
        "every part ran once"
    );
    outputs
}

/// The parts' runs and held-back writes, in the parts' order, and their
/// compilations; each part's share of the view is dropped.
fn join_parts(outputs: Vec<(usize, PartOutput)>) -> (Runs, Vec<DeferredWrite>, u64) {
    let mut ran = Runs::default();
    let mut writes = Vec::new();
    let mut compiles = 0;
    for (_, part) in outputs {
        ran.push_part(part.ran);
        writes.extend(part.writes);
        compiles += part.compiles;
        drop(part.view);
    }
    (ran, writes, compiles)
}

/// The transaction of one `step`, on the writer thread.
pub(crate) fn step_in_writer(
    view: &mut TxnView<'_>,
    ns: NamespaceName,
    region: CellBox,
    args: &[Vec<u8>],
    settings: &ProgramSettings,
    stats: &ProgramStats,
) -> StepOutput {
    let started = Instant::now();
    if !view.has_namespace(&ns) {
        return StepOutput::NoNamespace(ns);
    }
    let Some(programs) = view.programs_in(&ns, &region, MAX_STEP_PROGRAMS) else {
        return StepOutput::TooManyPrograms;
    };
    assert!(programs.len() <= MAX_STEP_PROGRAMS);
    let step = StepInput {
        ns: &ns,
        region,
        args,
        settings,
        deadline: started + settings.step_time,
        // Room for the runs' writes beside one telemetry record per run.
        write_room: (MAX_TXN_MUTATIONS - programs.len()).min(u32::MAX as usize) as u32,
    };
    let write_room = step.write_room;
    let executed = with_vm(|vm| {
        let (ran, writes, compiles) = run_programs(vm, view, &step, &programs, stats);
        stats.compiles.fetch_add(compiles, Relaxed);
        stats.cached.store(vm.cached_programs() as u64, Relaxed);
        (ran, writes)
    });
    let (mut ran, writes) = match executed {
        Ok(done) => done,
        Err(why) => return StepOutput::Unavailable(why),
    };
    assert!(writes.len() <= write_room as usize);
    assert!(ran.len() == programs.len());
    assert_eq!(ran.iter().map(|r| r.writes).sum::<usize>(), writes.len());
    view.reserve(writes.len() + ran.len());
    let cells_written = apply_writes(view, &ns, &mut ran, writes);
    let tally = record_runs(view, &ns, ran, settings, stats);
    assert!(
        tally.failed as usize <= programs.len()
            && tally.first_failure.is_some() == (tally.failed > 0)
    );
    stats.steps.fetch_add(1, Relaxed);
    stats.step.record(started.elapsed());
    StepOutput::Ran(StepReply {
        lsn: 0,
        programs: programs.len() as u32,
        failed: tally.failed,
        cells_written,
        instructions: tally.instructions,
        first_failure: tally.first_failure,
    })
}

/// Applies the held-back `writes` to the step's transaction, one run's at
/// a time in the step's order; a run whose writes would take the
/// namespace past a quota is undone alone and fails. Returns the cells
/// written.
fn apply_writes(
    view: &mut TxnView<'_>,
    ns: &NamespaceName,
    ran: &mut Runs,
    writes: Vec<DeferredWrite>,
) -> u32 {
    let mut cells_written = 0u32;
    let mut writes = writes.into_iter();
    for run in ran.iter_mut().filter(|run| run.writes > 0) {
        // Each run's writes stand or fall together, as a `run`'s do.
        let savepoint = view.savepoint();
        for (coord, value) in writes.by_ref().take(run.writes) {
            match value {
                Some(bytes) => view.put(ns, coord, bytes),
                None => {
                    view.del(ns, coord);
                }
            }
        }
        match view.quota_refusal() {
            None => cells_written += run.writes as u32,
            Some(refusal) => {
                view.rollback_to(savepoint);
                run.record.cells_written = 0;
                run.failure = Some((RunOutcome::Error, refusal.message));
            }
        }
    }
    assert!(
        writes.next().is_none(),
        "every held-back write was applied or undone"
    );
    cells_written
}

/// What a step's runs add up to, for its answer.
struct StepTally {
    failed: u32,
    instructions: u64,
    first_failure: Option<StepFailure>,
}

/// Emits one telemetry record per run, in the step's order, and adds the
/// runs up.
fn record_runs(
    view: &mut TxnView<'_>,
    ns: &NamespaceName,
    ran: Runs,
    settings: &ProgramSettings,
    stats: &ProgramStats,
) -> StepTally {
    let mut failed = 0u32;
    let mut instructions = 0u64;
    let mut first_failure = None;
    let records = ran.into_runs().map(
        |Ran {
             coord,
             record,
             failure,
             head,
             ..
         }| {
            instructions = instructions.saturating_add(record.instructions);
            let (append, seq) = telemetry_append(
                stats,
                settings,
                ns.clone(),
                coord,
                head,
                record,
                failure.as_ref(),
            );
            if let Some((outcome, message)) = failure {
                failed += 1;
                if first_failure.is_none() {
                    first_failure = Some(StepFailure {
                        coord,
                        seq,
                        outcome,
                        message: cut(&message, MAX_OUTCOME_MESSAGE_BYTES).to_owned(),
                    });
                }
            }
            append
        },
    );
    view.emit_all(records);
    StepTally {
        failed,
        instructions,
        first_failure,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_at(x: i32) -> Ran {
        Ran {
            coord: Coord::new(x, 0, 0),
            record: RunRecord {
                seq: 0,
                started_unix_us: 0,
                duration_ns: 0,
                instructions: 0,
                cells_written: 0,
                outcome: RunOutcome::Ok,
                message: String::new(),
            },
            failure: None,
            writes: 0,
            wrote: (0, 0),
            refused_by_cap: false,
            head: TelemetryHead::default(),
        }
    }

    #[test]
    fn runs_keep_their_order_across_parts_and_truncate_at_any_run() {
        let parts = [0..3, 3..3, 3..7, 7..8];
        let make = || {
            let mut runs = Runs::default();
            for part in parts.clone() {
                runs.push_part(part.map(run_at).collect());
            }
            runs
        };
        let xs = |runs: Runs| -> Vec<i32> { runs.into_runs().map(|r| r.coord.x).collect() };
        assert_eq!(make().len(), 8);
        assert_eq!(xs(make()), (0..8).collect::<Vec<_>>());
        for keep in 0..=9 {
            let mut runs = make();
            runs.truncate(keep);
            assert_eq!(runs.len(), keep.min(8));
            assert_eq!(xs(runs), (0..keep.min(8) as i32).collect::<Vec<_>>());
        }
    }
}

#[cfg(test)]
mod probe {
    use std::sync::Arc;

    use clap::Parser;
    use cube_store::Mutation;

    use super::*;
    use crate::config::Args;

    /// `PROBE_SIDE`^3 cells (default 32), a 30 % soup and the docs' Life
    /// rule (or `PROBE_PROGRAM`) at every cell, stepped on `PROBE_THREADS`
    /// threads (default 2); prints the writer time of each step per
    /// cell-program.
    #[test]
    #[ignore = "timing probe"]
    fn life_step_time() {
        let side: i32 = std::env::var("PROBE_SIDE").map_or(32, |s| s.parse().unwrap());
        let (_dir, engine) = super::super::bench::probe_engine();
        let session = engine.session().unwrap();
        let ns = NamespaceName::new("default").unwrap();
        let doc = include_str!("../../../docs/programs.md");
        let marker = "<!-- program: life -->";
        let rest = &doc[doc.find(marker).unwrap() + marker.len()..];
        let start = rest.find("```lua\n").unwrap() + "```lua\n".len();
        let source = std::env::var("PROBE_PROGRAM")
            .unwrap_or_else(|_| rest[start..start + rest[start..].find("```").unwrap()].to_owned());
        let setup_ns = ns.clone();
        session
            .transact(move |view| {
                for x in 0..side {
                    for y in 0..side {
                        for z in 0..side {
                            let at = Coord::new(x, y, z);
                            let h = (x as u64 * 73_856_093)
                                ^ (y as u64 * 19_349_663)
                                ^ (z as u64 * 83_492_791);
                            if h % 10 < 3 {
                                view.put(&setup_ns, at, b"1".to_vec());
                            }
                            view.emit(Mutation::ProgramPut {
                                ns: setup_ns.clone(),
                                coord: at,
                                source: source.clone().into_bytes(),
                            });
                        }
                    }
                }
            })
            .unwrap();
        let threads = std::env::var("PROBE_THREADS").unwrap_or_else(|_| "2".to_owned());
        let args = Args::try_parse_from(["cubed", "--program-step-threads", &threads]).unwrap();
        let settings = ProgramSettings::from_args(&args);
        let stats = Arc::new(ProgramStats::default());
        let region = CellBox::new(
            Coord::new(0, 0, 0),
            Coord::new(side - 1, side - 1, side - 1),
        )
        .unwrap();
        let mut per_cell_ns = Vec::new();
        for _ in 0..9 {
            let (ns, stats) = (ns.clone(), Arc::clone(&stats));
            let ((programs, took), _) = session
                .transact(move |view| {
                    let t = Instant::now();
                    let out =
                        step_in_writer(view, ns, region, &[b"1000".to_vec()], &settings, &stats);
                    let StepOutput::Ran(reply) = out else {
                        panic!("the step did not run")
                    };
                    assert_eq!(reply.failed, 0, "{reply:?}");
                    (reply.programs, t.elapsed())
                })
                .unwrap();
            per_cell_ns.push(took.as_nanos() as f64 / f64::from(programs));
        }
        println!("per cell-program, ns: {per_cell_ns:.0?}");
        per_cell_ns.sort_by(f64::total_cmp);
        let median = per_cell_ns[per_cell_ns.len() / 2];
        println!(
            "median {median:.0} ns = {:.0} cell-programs/s of writer time",
            1e9 / median
        );
        engine.shutdown().unwrap();
    }
}
