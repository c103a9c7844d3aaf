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
//! Limits, because a step holds the writer: at most
//! [`MAX_STEP_PROGRAMS`] programs; the runs together write at most what
//! fits in one transaction beside their telemetry; the step's writer time
//! is bounded by `--program-step-ms`, after which the remaining runs fail
//! as out of fuel without running.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use cube_protocol::{CellBox, Coord, NamespaceName, RunOutcome, RunRecord, StepFailure, StepReply};
use cube_store::{MAX_TXN_MUTATIONS, TxnView};

use super::api::{DeferredWrite, MAX_RUN_WRITE_BYTES, MAX_RUN_WRITES, Run, StepSnapshot};
use super::sandbox::{RunBudget, with_vm};
use super::{
    MAX_OUTCOME_MESSAGE_BYTES, ProgramSettings, ProgramStats, cut, duration_ns, failed_outcome,
    record_run, unix_us,
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
    let deadline = started + settings.step_time;
    // Room for the runs' writes beside one telemetry record per run.
    let write_room = (MAX_TXN_MUTATIONS - programs.len()).min(u32::MAX as usize) as u32;
    let mut ran: Vec<Ran> = Vec::with_capacity(programs.len());
    let mut writes: Vec<DeferredWrite> = Vec::new();
    let mut write_bytes = 0usize;
    let executed = with_vm(|vm| {
        let mut slot = vm.slot.borrow_mut();
        if slot.ns.as_ref() != Some(&ns) {
            slot.ns = Some(ns.clone());
        }
        let mut run = Run::new(
            view.detach(),
            region.lo(),
            settings.max_value_bytes,
            settings.walk_limits,
        );
        run.deferred = Some(Vec::new());
        let cells: Vec<Coord> = programs.iter().map(|(coord, _)| *coord).collect();
        run.snapshot = StepSnapshot::read(&run.view, &ns, &cells);
        slot.run = Some(run);
        drop(slot);
        for (coord, source) in &programs {
            let cell_started = Instant::now();
            let started_unix_us = unix_us();
            let mut record = RunRecord {
                seq: 0,
                started_unix_us,
                duration_ns: 0,
                instructions: 0,
                cells_written: 0,
                outcome: RunOutcome::Ok,
                message: String::new(),
            };
            let left = deadline.saturating_duration_since(cell_started);
            if left.is_zero() {
                ran.push(Ran {
                    coord: *coord,
                    record,
                    failure: Some((
                        RunOutcome::Fuel,
                        "the step ran out of time before this run started \
                         (--program-step-ms); it did not run"
                            .to_owned(),
                    )),
                    writes: 0,
                });
                continue;
            }
            if let Some(run) = vm.slot.borrow_mut().run.as_mut() {
                run.here = *coord;
                run.writes = 0;
                run.write_bytes = 0;
                run.write_cap = MAX_RUN_WRITES.min(write_room - writes.len() as u32);
                run.write_bytes_cap = MAX_RUN_WRITE_BYTES.min(MAX_STEP_WRITE_BYTES - write_bytes);
            }
            let budget = RunBudget {
                time: settings.budget.time.min(left),
                ..settings.budget
            };
            let outcome = match vm.set_here(&ns, *coord) {
                Ok(()) => vm.run(source, args, budget, cell_started, |function, call_args| {
                    function.call::<()>(call_args)
                }),
                Err(e) => super::sandbox::LuaOutcome {
                    result: Err(super::sandbox::Failure {
                        spent: None,
                        message: super::sandbox::error_text(&e),
                    }),
                    fuel_used: 0,
                },
            };
            let failure = outcome.result.err().map(failed_outcome);
            let mut kept = 0;
            let mut slot = vm.slot.borrow_mut();
            if let Some(run) = slot.run.as_mut()
                && let Some(deferred) = run.deferred.as_mut()
            {
                if failure.is_none() {
                    record.cells_written = run.writes;
                    write_bytes += run.write_bytes;
                    kept = deferred.len();
                    writes.append(deferred);
                } else {
                    deferred.clear();
                }
            }
            drop(slot);
            record.instructions = outcome.fuel_used;
            record.duration_ns = duration_ns(cell_started.elapsed());
            ran.push(Ran {
                coord: *coord,
                record,
                failure,
                writes: kept,
            });
        }
        // The transaction goes back to the writer's view before anything
        // else reads it.
        if let Some(run) = vm.slot.borrow_mut().run.take() {
            view.attach(run.view);
        }
        stats.compiles.store(vm.compiles, Relaxed);
        stats.cached.store(vm.cached_programs() as u64, Relaxed);
    });
    if let Err(why) = executed {
        return StepOutput::Unavailable(why);
    }
    assert!(writes.len() <= write_room as usize);
    assert!(ran.len() == programs.len());
    assert_eq!(ran.iter().map(|r| r.writes).sum::<usize>(), writes.len());
    view.reserve(writes.len() + ran.len());
    let mut cells_written = 0u32;
    let mut writes = writes.into_iter();
    for run in ran.iter_mut().filter(|run| run.writes > 0) {
        // Each run's writes stand or fall together, as a `run`'s do.
        let savepoint = view.savepoint();
        for (coord, value) in writes.by_ref().take(run.writes) {
            match value {
                Some(bytes) => view.put(&ns, coord, bytes),
                None => {
                    view.del(&ns, coord);
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
    let mut failed = 0u32;
    let mut instructions = 0u64;
    let mut first_failure = None;
    for Ran {
        coord,
        record,
        failure,
        ..
    } in ran
    {
        instructions = instructions.saturating_add(record.instructions);
        let seq = record_run(
            view,
            stats,
            settings,
            ns.clone(),
            coord,
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
    }
    assert!(failed as usize <= programs.len() && first_failure.is_some() == (failed > 0));
    stats.steps.fetch_add(1, Relaxed);
    stats.step.record(started.elapsed());
    StepOutput::Ran(StepReply {
        lsn: 0,
        programs: programs.len() as u32,
        failed,
        cells_written,
        instructions,
        first_failure,
    })
}

#[cfg(test)]
mod probe {
    use std::sync::Arc;

    use clap::Parser;
    use cube_store::Mutation;

    use super::*;
    use crate::config::Args;

    /// `PROBE_SIDE`^3 cells (default 32), a 30 % soup and the docs' Life
    /// rule (or `PROBE_PROGRAM`) at every cell; prints the writer time of
    /// each step per cell-program.
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
        let args = Args::try_parse_from(["cubed"]).unwrap();
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
