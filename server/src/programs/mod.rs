//! Cell programs: `prog`, `run` and `cell-stats` (`docs/programs.md`).
//!
//! A program is Lua 5.4 source stored at a coordinate. `prog` compiles it
//! on the connection thread (a syntax error is refused with its line and
//! nothing is stored), then writes it like any cell. `run` executes it on
//! the writer thread through [`WriteSession::transact_then`]: it sees the
//! latest state, its writes and its telemetry record commit in one WAL
//! group, acknowledged after fsync, and runs are serialized with every
//! other write. A failing run (an error, or a spent fuel, time or memory
//! budget) is rolled back, but its telemetry record is still committed.
//! Both answer from the writer thread once durable, as put and del do
//! (`write_reply`): the connection thread queues the request and goes back
//! to reading, and never sleeps on the writer.
//! The log holds only the effects, never the program's execution, so
//! recovery is deterministic whatever the program read (clock, random).

pub(crate) mod api;
#[cfg(feature = "program-harness")]
pub(crate) mod harness;
pub(crate) mod sandbox;
pub(crate) mod step;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cube_protocol::{
    CellBox, CellStats, Coord, ErrorCode, MAX_CELL_STATS_RECORDS, MAX_OUTCOME_MESSAGE_BYTES,
    MAX_RESULT_ENTRIES, NamespaceName, ProgramValue, Request, Response, RunOutcome, RunRecord,
    RunReply, ServerError, StatsEntry, StatsValue,
};
use cube_store::{
    MemStore, Mutation, TelemetryChange, TelemetryHead, TxnView, WalkLimits, WriteSession,
};
use mlua::Value;

use crate::config::Args;
use crate::connection::{count, no_such_namespace, write_error};
use crate::server::Shared;
use crate::write_reply::Cork;
use api::Run;
use sandbox::{ProgramVm, RunBudget, Spent, readable, with_vm};

/// What runs are allowed, from the daemon's flags.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ProgramSettings {
    pub(crate) budget: RunBudget,
    /// Telemetry records kept per cell.
    pub(crate) keep: u32,
    pub(crate) max_value_bytes: usize,
    pub(crate) max_frame_bytes: usize,
    pub(crate) walk_limits: WalkLimits,
    /// Writer-time backstop of a whole `step`.
    pub(crate) step_time: Duration,
    /// Threads a big `step` runs its programs on (1: the writer alone).
    pub(crate) step_threads: usize,
}

impl ProgramSettings {
    pub(crate) fn from_args(args: &Args) -> ProgramSettings {
        ProgramSettings {
            budget: RunBudget {
                fuel: args.program_fuel,
                memory_bytes: args.program_memory,
                time: Duration::from_millis(args.program_time_ms.max(1)),
            },
            keep: args.program_telemetry_keep,
            max_value_bytes: args.max_value_bytes as usize,
            max_frame_bytes: args.max_frame_bytes as usize,
            walk_limits: args.walk_limits(),
            step_time: Duration::from_millis(args.program_step_ms.max(1)),
            step_threads: args.step_threads(),
        }
    }
}

/// Count, total and maximum of a duration, lock-free.
#[derive(Default)]
struct Timing {
    count: AtomicU64,
    total_ns: AtomicU64,
    max_ns: AtomicU64,
}

impl Timing {
    fn record(&self, elapsed: Duration) {
        let ns = elapsed.as_nanos().min(u128::from(u64::MAX)) as u64;
        self.count.fetch_add(1, Relaxed);
        self.total_ns.fetch_add(ns, Relaxed);
        self.max_ns.fetch_max(ns, Relaxed);
    }

    fn entries(&self, name: &str, out: &mut Vec<StatsEntry>) {
        let count = self.count.load(Relaxed);
        let mean = if count == 0 {
            0.0
        } else {
            self.total_ns.load(Relaxed) as f64 / count as f64 / 1000.0
        };
        out.push(StatsEntry {
            name: format!("programs.{name}_us_mean"),
            value: StatsValue::Float(mean),
        });
        out.push(StatsEntry {
            name: format!("programs.{name}_us_max"),
            value: StatsValue::Float(self.max_ns.load(Relaxed) as f64 / 1000.0),
        });
    }
}

/// Daemon-wide program figures for `stats`.
#[derive(Default)]
pub(crate) struct ProgramStats {
    runs: AtomicU64,
    failed: AtomicU64,
    out_of_fuel: AtomicU64,
    out_of_memory: AtomicU64,
    /// Compilations by every VM: the writer's, and each step thread's.
    compiles: AtomicU64,
    /// Programs the writer's VM holds compiled.
    cached: AtomicU64,
    /// `prog`, server side, excluding the wait for the writer.
    prog: Timing,
    /// `run`, server side, excluding the wait for the writer except the
    /// program's own execution.
    run: Timing,
    /// The program's execution on the writer (load, call, telemetry).
    exec: Timing,
    steps: AtomicU64,
    /// Steps whose runs were split among several step threads.
    steps_parallel: AtomicU64,
    /// Of those, steps whose step threads' work was dropped and done again on the
    /// writer alone, because runs wrote near the step's caps.
    steps_redone: AtomicU64,
    /// A whole `step` on the writer (every run, the writes, the records).
    step: Timing,
}

/// Cell programs as the server runs them.
pub(crate) struct ProgramService {
    settings: ProgramSettings,
    stats: Arc<ProgramStats>,
}

impl ProgramService {
    pub(crate) fn new(args: &Args) -> ProgramService {
        ProgramService {
            settings: ProgramSettings::from_args(args),
            stats: Arc::default(),
        }
    }

    pub(crate) fn stats_entries(&self, mem: &MemStore) -> Vec<StatsEntry> {
        let s = &self.stats;
        let mut out = vec![
            count("programs.stored", mem.program_count()),
            count("programs.runs", s.runs.load(Relaxed)),
            count("programs.failed", s.failed.load(Relaxed)),
            count("programs.out_of_fuel", s.out_of_fuel.load(Relaxed)),
            count("programs.out_of_memory", s.out_of_memory.load(Relaxed)),
            count("programs.compiles", s.compiles.load(Relaxed)),
            count("programs.compiled_cached", s.cached.load(Relaxed)),
        ];
        s.prog.entries("prog", &mut out);
        s.run.entries("run", &mut out);
        s.exec.entries("exec", &mut out);
        out.push(count("programs.steps", s.steps.load(Relaxed)));
        out.push(count(
            "programs.steps_parallel",
            s.steps_parallel.load(Relaxed),
        ));
        out.push(count("programs.steps_redone", s.steps_redone.load(Relaxed)));
        s.step.entries("step", &mut out);
        out
    }
}

/// Makes this thread's program VM (the writer's, called in a
/// transaction at startup), so that the first run does not pay for it.
pub(crate) fn warm_writer_vm() -> Result<(), String> {
    with_vm(|_| ())
}

/// A `prog` or `run` checked on its connection thread, ready for the
/// writer.
pub(crate) enum ProgramWrite {
    Prog(Mutation),
    Run {
        ns: NamespaceName,
        coord: Coord,
        args: Vec<Vec<u8>>,
    },
    Step {
        ns: NamespaceName,
        region: CellBox,
        args: Vec<Vec<u8>>,
    },
}

/// Checks a `prog` (its syntax: an error is refused here, with its line,
/// and nothing is queued) or a `run`; anything else is not a program write.
pub(crate) fn prepare(request: Request) -> Result<ProgramWrite, ServerError> {
    match request {
        Request::Prog { ns, coord, source } => {
            if source.is_empty() {
                return Ok(ProgramWrite::Prog(Mutation::ProgramDel { ns, coord }));
            }
            sandbox::check_syntax(&source).map_err(|e| {
                let at = e
                    .line
                    .map_or(String::new(), |line| format!("line {line}: "));
                ServerError::new(
                    ErrorCode::ProgramSyntax,
                    format!("{at}{}; nothing was stored", e.message),
                )
            })?;
            Ok(ProgramWrite::Prog(Mutation::ProgramPut {
                ns,
                coord,
                source,
            }))
        }
        Request::Run { ns, coord, args } => Ok(ProgramWrite::Run { ns, coord, args }),
        Request::Step { ns, lo, hi, args } => {
            let region = CellBox::new(lo, hi)
                .map_err(|why| ServerError::new(ErrorCode::InvalidArgument, why))?;
            Ok(ProgramWrite::Step { ns, region, args })
        }
        other => Err(ServerError::new(
            ErrorCode::Internal,
            format!("{} is not a program write", other.opcode().name()),
        )),
    }
}

/// Queues a prepared `prog` or `run` and returns at once; `reply` gets
/// the response on the writer thread once it is durable (or refused), with
/// the writer's [`Cork`] while it answers a durable group, so it must be
/// quick and never block (see `write_reply`). `started` is when
/// the request arrived: the server-side latency recorded for `stats`
/// counts the connection thread's part, the run's execution on the writer
/// and the answer's making, never the wait in the queue or for the fsync.
pub(crate) fn submit(
    shared: &Shared,
    session: &WriteSession,
    write: ProgramWrite,
    started: Instant,
    reply: impl FnOnce(Result<Response, ServerError>, Option<&mut Cork>) + Send + 'static,
) {
    let service = &shared.programs;
    let stats = Arc::clone(&service.stats);
    match write {
        ProgramWrite::Prog(mutation) => {
            let before = started.elapsed();
            session.submit(mutation, move |result, mut context| {
                let answering = Instant::now();
                let result = result
                    .map(|ack| Response::Prog {
                        lsn: ack.lsn,
                        replaced: ack.existed,
                    })
                    .map_err(|e| write_error(&e));
                if result.is_ok() {
                    stats.prog.record(before + answering.elapsed());
                }
                reply(result, context.batch::<Cork>());
            });
        }
        ProgramWrite::Run { ns, coord, args } => {
            let settings = service.settings;
            let run_stats = Arc::clone(&stats);
            let at_ns = ns.clone();
            let before = started.elapsed();
            session.transact_then(
                move |view| run_in_writer(view, ns, coord, &args, &settings, &run_stats),
                move |result, mut context| {
                    let answering = Instant::now();
                    let result = match result {
                        Ok((output, first_lsn)) => {
                            run_response(output, first_lsn, &at_ns, coord, |exec| {
                                stats.run.record(before + exec + answering.elapsed());
                            })
                        }
                        Err(e) => Err(write_error(&e)),
                    };
                    reply(result, context.batch::<Cork>());
                },
            );
        }
        ProgramWrite::Step { ns, region, args } => {
            let settings = service.settings;
            session.transact_then(
                move |view| step::step_in_writer(view, ns, region, &args, &settings, &stats),
                move |result, mut context| {
                    reply(
                        match result {
                            Ok((output, first_lsn)) => step_response(output, first_lsn, &region),
                            Err(e) => Err(write_error(&e)),
                        },
                        context.batch::<Cork>(),
                    );
                },
            );
        }
    }
}

/// A step's response from what its transaction handed back.
fn step_response(
    output: step::StepOutput,
    first_lsn: u64,
    region: &CellBox,
) -> Result<Response, ServerError> {
    match output {
        step::StepOutput::NoNamespace(ns) => Err(no_such_namespace(&ns)),
        step::StepOutput::TooManyPrograms => Err(ServerError::new(
            ErrorCode::LimitExceeded,
            format!(
                "the box {region} holds more than {} programs; step it in smaller boxes; \
                 nothing ran",
                step::MAX_STEP_PROGRAMS
            ),
        )),
        step::StepOutput::Unavailable(why) => Err(ServerError::new(ErrorCode::Internal, why)),
        step::StepOutput::Ran(mut reply) => {
            reply.lsn = first_lsn;
            Ok(Response::Step(reply))
        }
    }
}

/// A run's response from what its transaction handed back; `ran` gets the
/// execution time of a run that did execute.
fn run_response(
    output: RunOutput,
    first_lsn: u64,
    ns: &NamespaceName,
    coord: Coord,
    ran: impl FnOnce(Duration),
) -> Result<Response, ServerError> {
    match output {
        RunOutput::NoNamespace(ns) => Err(no_such_namespace(&ns)),
        RunOutput::NoProgram => Err(ServerError::new(
            ErrorCode::InvalidArgument,
            format!("no program at {ns} {coord}; store one with prog"),
        )),
        RunOutput::Unavailable(why) => Err(ServerError::new(ErrorCode::Internal, why)),
        RunOutput::Ran {
            seq,
            instructions,
            cells_written,
            exec,
            result,
            over_quota,
        } => {
            ran(exec);
            match result {
                Ok(value) => Ok(Response::Run(RunReply {
                    lsn: first_lsn,
                    seq,
                    instructions,
                    cells_written,
                    value,
                })),
                Err((outcome, message)) => {
                    let code = match outcome {
                        _ if over_quota => ErrorCode::QuotaExceeded,
                        RunOutcome::Fuel => ErrorCode::ProgramFuel,
                        RunOutcome::Memory => ErrorCode::ProgramMemory,
                        _ => ErrorCode::ProgramError,
                    };
                    Err(ServerError::new(
                        code,
                        format!(
                            "{message} (run {seq} at {ns} {coord}: nothing it wrote was \
                             applied; the failure is recorded in its telemetry)"
                        ),
                    ))
                }
            }
        }
    }
}

/// Serves `cell-stats` (`prog` and `run` go through [`prepare`] and
/// [`submit`]).
pub(crate) fn handle(shared: &Shared, request: Request) -> Result<Response, ServerError> {
    match request {
        Request::CellStats { ns, coord, limit } => {
            let mem = shared.engine.memstore();
            if !mem.has_namespace(&ns) {
                return Err(no_such_namespace(&ns));
            }
            let limit = limit.min(MAX_CELL_STATS_RECORDS) as usize;
            let (head, records) = mem.telemetry(&ns, coord, limit);
            let program_bytes = mem
                .program(&ns, coord)
                .map(|source| source.len().min(u32::MAX as usize) as u32);
            Ok(Response::CellStats(CellStats {
                program_bytes,
                runs: head.runs,
                failures: head.failures,
                records,
            }))
        }
        other => Err(ServerError::new(
            ErrorCode::Internal,
            format!("{} reached the program handler", other.opcode().name()),
        )),
    }
}

/// What a run's transaction hands back for its answer.
enum RunOutput {
    NoNamespace(NamespaceName),
    NoProgram,
    Unavailable(String),
    Ran {
        seq: u64,
        instructions: u64,
        cells_written: u32,
        exec: Duration,
        result: Result<ProgramValue, (RunOutcome, String)>,
        /// The run failed because its writes went past a namespace quota
        /// (answered with `quota_exceeded`, recorded as an error).
        over_quota: bool,
    },
}

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |t| t.as_micros().min(u128::from(u64::MAX)) as u64)
}

/// Cuts `text` at a character boundary to at most `limit` bytes.
fn cut(text: &str, limit: usize) -> &str {
    let mut end = text.len().min(limit);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The transaction of one `run`, on the writer thread.
fn run_in_writer(
    view: &mut TxnView<'_>,
    ns: NamespaceName,
    coord: Coord,
    args: &[Vec<u8>],
    settings: &ProgramSettings,
    stats: &ProgramStats,
) -> RunOutput {
    let started = Instant::now();
    let started_unix_us = unix_us();
    // A stored program implies its namespace (a drop forgets the
    // namespace's programs, and commits in a group of its own), so the
    // namespace is looked up only to explain a missing program.
    let Some(source) = view.program(&ns, coord) else {
        if !view.has_namespace(&ns) {
            return RunOutput::NoNamespace(ns);
        }
        return RunOutput::NoProgram;
    };
    let call = RunCall {
        ns: &ns,
        coord,
        source: &source,
        args,
        started,
    };
    let executed = with_vm(|vm| execute_run(vm, view, &call, settings, stats));
    let (result, instructions, writes) = match executed {
        Ok(done) => done,
        Err(why) => return RunOutput::Unavailable(why),
    };
    let (result, over_quota) = judge_quota(view, result);
    let cells_written = if result.is_ok() {
        writes
    } else {
        view.rollback();
        0
    };
    let head = view.telemetry_head(&ns, coord).unwrap_or_default();
    let seq = record_run(
        view,
        stats,
        settings,
        ns,
        coord,
        head,
        RunRecord {
            seq: 0,
            started_unix_us,
            duration_ns: duration_ns(started.elapsed()),
            instructions,
            cells_written,
            outcome: RunOutcome::Ok,
            message: String::new(),
        },
        result.as_ref().err(),
    );
    let exec = started.elapsed();
    stats.exec.record(exec);
    RunOutput::Ran {
        seq,
        instructions,
        cells_written,
        exec,
        result,
        over_quota,
    }
}

/// What one `run` runs, and when it started.
struct RunCall<'a> {
    ns: &'a NamespaceName,
    coord: Coord,
    source: &'a Arc<[u8]>,
    args: &'a [Vec<u8>],
    started: Instant,
}

/// A run's result (or its failure), the instructions it used and the
/// cells it wrote.
type Executed = (Result<ProgramValue, (RunOutcome, String)>, u64, u32);

/// Runs `call` in `vm` on the writer's transaction, and counts its
/// compilations.
fn execute_run(
    vm: &mut ProgramVm,
    view: &mut TxnView<'_>,
    call: &RunCall<'_>,
    settings: &ProgramSettings,
    stats: &ProgramStats,
) -> Executed {
    let compiled_before = vm.compiles;
    if let Err(e) = vm.set_here(call.ns, call.coord) {
        return (Err((RunOutcome::Error, sandbox::error_text(&e))), 0, 0);
    }
    let (outcome, writes) = run_on_view(vm, view, call, settings);
    let result = outcome.result.map_err(failed_outcome);
    stats
        .compiles
        .fetch_add(vm.compiles - compiled_before, Relaxed);
    stats.cached.store(vm.cached_programs() as u64, Relaxed);
    (result, outcome.fuel_used, writes)
}

/// Lends the writer's transaction to `vm`'s slot for the run, runs it,
/// and takes the transaction back; how the run's Lua part ended, and the
/// cells it wrote.
fn run_on_view(
    vm: &mut ProgramVm,
    view: &mut TxnView<'_>,
    call: &RunCall<'_>,
    settings: &ProgramSettings,
) -> (sandbox::LuaOutcome<ProgramValue>, u32) {
    let mut writes = 0;
    let mut state = vm.slot.borrow_mut();
    if state.ns.as_ref() != Some(call.ns) {
        state.ns = Some(call.ns.clone());
    }
    state.run = Some(Run::new(
        view.detach(),
        call.coord,
        settings.max_value_bytes,
        settings.walk_limits,
    ));
    drop(state);
    let outcome = vm.run(
        call.source,
        call.args,
        settings.budget,
        call.started,
        |runner, call_args| {
            let returned = runner.call::<Value>(call_args)?;
            to_program_value(returned, settings)
        },
    );
    // The dispatcher holds the slot only inside its own call, so
    // it is free here; the transaction goes back to the writer's
    // view before anything else reads it.
    if let Some(run) = vm.slot.borrow_mut().run.take() {
        writes = run.writes;
        view.attach(run.view.into_owned());
    }
    (outcome, writes)
}

/// Writes past a namespace quota would be refused by the writer after
/// this transaction, and its telemetry record with them: judged here
/// instead, so the run fails like any other (nothing it wrote applied)
/// and is still recorded. Returns the result and whether the quota failed
/// it.
fn judge_quota(
    view: &TxnView<'_>,
    result: Result<ProgramValue, (RunOutcome, String)>,
) -> (Result<ProgramValue, (RunOutcome, String)>, bool) {
    let mut over_quota = false;
    let result = result.and_then(|value| match view.quota_refusal() {
        Some(refusal) => {
            over_quota = true;
            Err((RunOutcome::Error, refusal.message))
        }
        None => Ok(value),
    });
    (result, over_quota)
}

/// The outcome and readable message of a run its budget or an error
/// stopped.
fn failed_outcome(failure: sandbox::Failure) -> (RunOutcome, String) {
    let outcome = match failure.spent {
        Some(Spent::Fuel | Spent::Time) => RunOutcome::Fuel,
        Some(Spent::Memory) => RunOutcome::Memory,
        None => RunOutcome::Error,
    };
    (outcome, readable(&failure.message))
}

fn duration_ns(elapsed: Duration) -> u64 {
    elapsed.as_nanos().min(u128::from(u64::MAX)) as u64
}

/// Appends a run's telemetry record at its cell and counts the run in the
/// daemon's figures (see [`telemetry_append`]); returns the seq.
#[allow(clippy::too_many_arguments)]
fn record_run(
    view: &mut TxnView<'_>,
    stats: &ProgramStats,
    settings: &ProgramSettings,
    ns: NamespaceName,
    coord: Coord,
    head: TelemetryHead,
    record: RunRecord,
    failure: Option<&(RunOutcome, String)>,
) -> u64 {
    let (append, seq) = telemetry_append(stats, settings, ns, coord, head, record, failure);
    view.emit(append);
    seq
}

/// A run's telemetry record at its cell, to emit (the seq and outcome
/// filled in from the cell's head and `failure`), and its seq; counts the
/// run in the daemon's figures. `head` is the cell's telemetry head as of
/// this point in the log (`TxnView::telemetry_head`), which a step's
/// threads read ahead.
fn telemetry_append(
    stats: &ProgramStats,
    settings: &ProgramSettings,
    ns: NamespaceName,
    coord: Coord,
    head: TelemetryHead,
    mut record: RunRecord,
    failure: Option<&(RunOutcome, String)>,
) -> (Mutation, u64) {
    record.seq = head.runs + 1;
    if let Some((outcome, message)) = failure {
        record.outcome = *outcome;
        record.message = cut(message, MAX_OUTCOME_MESSAGE_BYTES).to_owned();
    }
    let seq = record.seq;
    stats.runs.fetch_add(1, Relaxed);
    match record.outcome {
        RunOutcome::Ok => {}
        RunOutcome::Error => {
            stats.failed.fetch_add(1, Relaxed);
        }
        RunOutcome::Fuel => {
            stats.failed.fetch_add(1, Relaxed);
            stats.out_of_fuel.fetch_add(1, Relaxed);
        }
        RunOutcome::Memory => {
            stats.failed.fetch_add(1, Relaxed);
            stats.out_of_memory.fetch_add(1, Relaxed);
        }
    }
    let append = Mutation::Telemetry {
        ns,
        coord,
        change: TelemetryChange::Append {
            record,
            failures: head.failures + u64::from(failure.is_some()),
            keep: settings.keep,
            trim_from: head.oldest_seq.max(1),
        },
    };
    (append, seq)
}

/// A run's return value as the protocol carries it: nil, a boolean, a
/// number, a string, or a flat table of scalars, within the frame.
fn to_program_value(value: Value, settings: &ProgramSettings) -> mlua::Result<ProgramValue> {
    let mut size = ResultSize::new(settings);
    let converted = match value {
        Value::Nil => ProgramValue::Nil,
        Value::Table(table) => size.table(table)?,
        Value::Boolean(_) | Value::Integer(_) | Value::Number(_) | Value::String(_) => {
            size.scalar(value)?
        }
        other => {
            return Err(result_error(format!(
                "a run may return nil, a boolean, a number, a string or a flat table, not a {}",
                other.type_name()
            )));
        }
    };
    size.check()?;
    Ok(converted)
}

fn result_error(why: String) -> mlua::Error {
    mlua::Error::RuntimeError(format!("the run's result: {why}"))
}

/// A run's result as it is converted: what the response frame has room
/// for, and how much the result takes so far.
struct ResultSize<'a> {
    settings: &'a ProgramSettings,
    /// What the response may carry besides the value.
    budget: usize,
    bytes: usize,
}

impl ResultSize<'_> {
    fn new(settings: &ProgramSettings) -> ResultSize<'_> {
        ResultSize {
            settings,
            budget: settings.max_frame_bytes.saturating_sub(256),
            bytes: 0,
        }
    }

    fn check(&self) -> mlua::Result<()> {
        if self.bytes > self.budget {
            return Err(result_error(format!(
                "{} bytes do not fit in one response frame of {} bytes",
                self.bytes, self.settings.max_frame_bytes
            )));
        }
        Ok(())
    }

    /// A boolean, number or string. The running total is checked before
    /// each string is copied, so a table of many references to one big
    /// string fails at the string that overflows the frame instead of
    /// being copied whole first.
    fn scalar(&mut self, value: Value) -> mlua::Result<ProgramValue> {
        Ok(match value {
            Value::Boolean(b) => ProgramValue::Bool(b),
            Value::Integer(i) => ProgramValue::Int(i),
            Value::Number(f) => ProgramValue::Float(f),
            Value::String(s) => {
                let data = s.as_bytes();
                if data.len() > self.settings.max_value_bytes {
                    return Err(result_error(format!(
                        "a string of {} bytes is over the value limit of {}",
                        data.len(),
                        self.settings.max_value_bytes
                    )));
                }
                self.bytes = self.bytes.saturating_add(data.len() + 5);
                self.check()?;
                ProgramValue::Bytes(data.to_vec())
            }
            other => {
                return Err(result_error(format!(
                    "a table may hold only strings, numbers and booleans, not a {}",
                    other.type_name()
                )));
            }
        })
    }

    /// A flat table of scalars, its entries sorted: integer keys first.
    fn table(&mut self, table: mlua::Table) -> mlua::Result<ProgramValue> {
        let mut entries = Vec::new();
        for pair in table.pairs::<Value, Value>() {
            let (key, value) = pair?;
            if entries.len() as u32 >= MAX_RESULT_ENTRIES {
                return Err(result_error(format!(
                    "a table may have at most {MAX_RESULT_ENTRIES} entries"
                )));
            }
            let key = match key {
                Value::Integer(i) => ProgramValue::Int(i),
                Value::String(_) => self.scalar(key)?,
                other => {
                    return Err(result_error(format!(
                        "table keys must be strings or integers, not {}",
                        other.type_name()
                    )));
                }
            };
            let value = self.scalar(value)?;
            self.bytes += 18;
            self.check()?;
            entries.push((key, value));
        }
        entries.sort_by(|(a, _), (b, _)| match (a, b) {
            (ProgramValue::Int(x), ProgramValue::Int(y)) => x.cmp(y),
            (ProgramValue::Int(_), _) => std::cmp::Ordering::Less,
            (_, ProgramValue::Int(_)) => std::cmp::Ordering::Greater,
            (ProgramValue::Bytes(x), ProgramValue::Bytes(y)) => x.cmp(y),
            _ => std::cmp::Ordering::Equal,
        });
        Ok(ProgramValue::Table(entries))
    }
}

#[cfg(test)]
pub(crate) mod bench {
    use super::*;
    use clap::Parser;
    use cube_store::{Engine, EngineConfig, GroupCommitConfig, SyncPolicy};

    /// An engine for timing probes: a fresh data dir, no fsync (the
    /// probes time the writer's work, not the disk).
    pub(crate) fn probe_engine() -> (tempfile::TempDir, Engine) {
        let dir = tempfile::tempdir().unwrap();
        let mut config = EngineConfig::new(dir.path());
        config.group_commit = GroupCommitConfig {
            sync: SyncPolicy::Never,
            ..GroupCommitConfig::default()
        };
        let engine = Engine::open(config).unwrap();
        (dir, engine)
    }

    /// The seed workload's mix in-process: counters at 4096 cells, each
    /// run preceded half the time by a `prog` of one of 8 variants, so the
    /// runs meet cold cells and fresh sources as they do in the daemon.
    #[test]
    #[ignore = "timing probe"]
    fn seed_exec_time() {
        let (_dir, engine) = probe_engine();
        let session = engine.session().unwrap();
        let ns = NamespaceName::new("default").unwrap();
        let cells = 4096u64;
        let at = |cell: u64| Coord::new((cell % 1024) as i32, (cell / 1024) as i32, -1);
        let source = |variant: u64| {
            format!("-- seed counter, variant {variant}\nreturn cube.rincr(0, 0, 0, 1)\n")
                .into_bytes()
        };
        for cell in 0..cells {
            session
                .write(Mutation::ProgramPut {
                    ns: ns.clone(),
                    coord: at(cell),
                    source: source(cell % 8),
                })
                .unwrap();
        }
        let args = Args::try_parse_from(["cubed"]).unwrap();
        let settings = ProgramSettings::from_args(&args);
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let n: usize = std::env::var("PROBE_RUNS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20_000);
        for round in 0..3 {
            let stats = Arc::new(ProgramStats::default());
            let mut times = Vec::with_capacity(n);
            for _ in 0..n {
                let r = next();
                let cell = r % cells;
                if (r >> 20) % 2 == 0 {
                    session
                        .write(Mutation::ProgramPut {
                            ns: ns.clone(),
                            coord: at(cell),
                            source: source((r >> 24) % 8),
                        })
                        .unwrap();
                }
                let (ns, stats) = (ns.clone(), Arc::clone(&stats));
                let (exec, _) = session
                    .transact(move |view| {
                        match run_in_writer(view, ns, at(cell), &[], &settings, &stats) {
                            RunOutput::Ran { exec, .. } => exec,
                            _ => Duration::MAX,
                        }
                    })
                    .unwrap();
                times.push(exec);
            }
            times.sort();
            let mean =
                stats.exec.total_ns.load(Relaxed) as f64 / stats.exec.count.load(Relaxed) as f64;
            let over = |us: u64| times.partition_point(|t| *t <= Duration::from_micros(us));
            println!(
                "round {round}: exec mean {mean:.0} ns, p99 {:?}, p99.9 {:?}, max {:?} over {n} runs; \
                 over 20 us: {}, over 50 us: {}",
                times[n * 99 / 100],
                times[n * 999 / 1000],
                times[n - 1],
                n - over(20),
                n - over(50)
            );
        }
        engine.shutdown().unwrap();
    }

    #[test]
    #[ignore = "timing probe"]
    fn counter_exec_time() {
        let (_dir, engine) = probe_engine();
        let session = engine.session().unwrap();
        let ns = NamespaceName::new("default").unwrap();
        let at = Coord::new(0, 0, 0);
        let source = std::env::var("PROBE_PROGRAM")
            .unwrap_or_else(|_| "return cube.rincr(0, 0, 0)".to_owned());
        for x in -1..=1 {
            for y in -1..=1 {
                for z in -1..=1 {
                    if (x + y + z) % 2 == 0 {
                        session
                            .write(Mutation::Put {
                                ns: ns.clone(),
                                coord: Coord::new(x, y, z),
                                value: b"1".to_vec(),
                            })
                            .unwrap();
                    }
                }
            }
        }
        session
            .write(Mutation::ProgramPut {
                ns: ns.clone(),
                coord: at,
                source: source.into_bytes(),
            })
            .unwrap();
        let args = Args::try_parse_from(["cubed"]).unwrap();
        let settings = ProgramSettings::from_args(&args);
        let stats = Arc::new(ProgramStats::default());
        for round in 0..3 {
            let started = Instant::now();
            let n = 20_000;
            let mut times = Vec::with_capacity(n as usize);
            for _ in 0..n {
                let (ns, stats) = (ns.clone(), Arc::clone(&stats));
                let ((_, took), _) = session
                    .transact(move |view| {
                        let t = Instant::now();
                        let out =
                            run_in_writer(view, ns, at, &[b"100".to_vec()], &settings, &stats);
                        (matches!(out, RunOutput::Ran { .. }), t.elapsed())
                    })
                    .unwrap();
                times.push(took);
            }
            times.sort();
            let s =
                stats.exec.total_ns.load(Relaxed) as f64 / stats.exec.count.load(Relaxed) as f64;
            println!(
                "round {round}: {:?} per transact, exec mean {s:.0} ns, p50 {:?} p90 {:?} p99 {:?} max {:?}",
                started.elapsed() / n,
                times[times.len() / 2],
                times[times.len() * 9 / 10],
                times[times.len() * 99 / 100],
                times[times.len() - 1]
            );
        }
        engine.shutdown().unwrap();
    }
}
