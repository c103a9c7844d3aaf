//! Cell programs on the wire: the body codecs of `prog`, `run`,
//! `cell-stats` and `step` (opcodes 0x0040-0x0044, `docs/protocol.md`
//! section 6), the value a run returns, what a step reports and the
//! per-cell telemetry records.
//!
//! Every list and string here has an explicit limit, checked by the
//! decoders before anything is allocated, so a hostile peer cannot make
//! either side reserve more than the frame it actually sent.

use crate::error::DecodeError;
use crate::model::Coord;
use crate::wire::{BodyReader, put_blob, put_coord, put_short_string, put_u16, put_u32, put_u64};

/// Largest program source accepted by `prog`, in bytes. Programs are
/// small rules next to their data; 64 KiB is far beyond any of the
/// worked examples and keeps a compile a few hundred microseconds at most.
pub const MAX_PROGRAM_BYTES: usize = 64 * 1024;
/// Most arguments of one `run`.
pub const MAX_RUN_ARGS: usize = 64;
/// Largest single `run` argument, in bytes.
pub const MAX_RUN_ARG_BYTES: usize = 64 * 1024;
/// Most entries in a table returned by a run.
pub const MAX_RESULT_ENTRIES: u32 = 4096;
/// Most telemetry records in one `cell-stats` response.
pub const MAX_CELL_STATS_RECORDS: u32 = 4096;
/// Longest outcome message kept in a telemetry record, in bytes (longer
/// error messages are cut at a character boundary).
pub const MAX_OUTCOME_MESSAGE_BYTES: usize = 512;

const VALUE_NIL: u8 = 0;
const VALUE_FALSE: u8 = 1;
const VALUE_TRUE: u8 = 2;
const VALUE_INT: u8 = 3;
const VALUE_FLOAT: u8 = 4;
const VALUE_BYTES: u8 = 5;
const VALUE_TABLE: u8 = 6;

/// What a run returned: nil, a boolean, a number, a string (bytes), or a
/// flat table whose keys and values are all non-nil scalars.
#[derive(Clone, Debug, PartialEq)]
pub enum ProgramValue {
    Nil,
    Bool(bool),
    Int(i64),
    Float(f64),
    Bytes(Vec<u8>),
    /// Entries in the order the server chose (integer keys ascending,
    /// then string keys in byte order). Keys are `Int` or `Bytes`, values
    /// any scalar; neither is ever `Nil` or a `Table`.
    Table(Vec<(ProgramValue, ProgramValue)>),
}

impl ProgramValue {
    /// Whether this value may stand as a table key or a table value.
    pub fn is_scalar(&self) -> bool {
        !matches!(self, ProgramValue::Nil | ProgramValue::Table(_))
    }
}

/// How a run ended, as telemetry records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RunOutcome {
    Ok = 0,
    /// A runtime error (the program's own, a bad API call, a result that
    /// cannot be returned).
    Error = 1,
    /// The instruction budget (`--program-fuel`) ran out.
    Fuel = 2,
    /// The memory budget (`--program-memory`) ran out.
    Memory = 3,
}

impl RunOutcome {
    pub fn from_u8(raw: u8) -> Option<RunOutcome> {
        Some(match raw {
            0 => RunOutcome::Ok,
            1 => RunOutcome::Error,
            2 => RunOutcome::Fuel,
            3 => RunOutcome::Memory,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            RunOutcome::Ok => "ok",
            RunOutcome::Error => "error",
            RunOutcome::Fuel => "fuel",
            RunOutcome::Memory => "memory",
        }
    }
}

/// One run of a cell's program, as kept in its telemetry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunRecord {
    /// 1 for the cell's first run, then +1 per run: the count is exact.
    pub seq: u64,
    /// Wall-clock start, microseconds since the Unix epoch.
    pub started_unix_us: u64,
    /// Time the program took on the writer thread (excluding the wait for
    /// its group's fsync).
    pub duration_ns: u64,
    /// Fuel used: VM instructions (counted in blocks, see
    /// `docs/programs.md`) plus what region reads charge.
    pub instructions: u64,
    /// Cells the run wrote (puts and deletes); 0 when it failed, because
    /// a failed run applies nothing.
    pub cells_written: u32,
    pub outcome: RunOutcome,
    /// Empty when `outcome` is ok; otherwise the error, at most
    /// [`MAX_OUTCOME_MESSAGE_BYTES`].
    pub message: String,
}

/// A successful run's answer.
#[derive(Clone, Debug, PartialEq)]
pub struct RunReply {
    /// The LSN of the run's first record (its writes, then its telemetry).
    pub lsn: u64,
    /// The run's telemetry sequence number at its cell.
    pub seq: u64,
    pub instructions: u64,
    pub cells_written: u32,
    pub value: ProgramValue,
}

/// What a `step` answers: every program in the box ran once, and the
/// writes of those that succeeded committed together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepReply {
    /// The LSN of the step's first record, 0 when it ran no program.
    pub lsn: u64,
    /// Programs that ran (one per cell of the box holding one).
    pub programs: u32,
    /// Of those, the runs that failed (their writes were not applied).
    pub failed: u32,
    /// Cells written by the runs that succeeded, all together.
    pub cells_written: u32,
    /// Fuel used by all runs together.
    pub instructions: u64,
    /// The first failed run in the step's order, if any.
    pub first_failure: Option<StepFailure>,
}

/// The first failure of a step: where, which run, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepFailure {
    pub coord: Coord,
    /// The failed run's telemetry sequence number at its cell.
    pub seq: u64,
    pub outcome: RunOutcome,
    /// At most [`MAX_OUTCOME_MESSAGE_BYTES`].
    pub message: String,
}

/// What `cell-stats` answers about one coordinate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CellStats {
    /// Size of the stored program's source, `None` when there is none.
    pub program_bytes: Option<u32>,
    /// Every run ever recorded at the cell (exact, durable).
    pub runs: u64,
    /// Of those, the runs that failed.
    pub failures: u64,
    /// The most recent records, oldest first.
    pub records: Vec<RunRecord>,
}

pub(crate) fn put_value(out: &mut Vec<u8>, value: &ProgramValue) {
    match value {
        ProgramValue::Nil => out.push(VALUE_NIL),
        ProgramValue::Bool(false) => out.push(VALUE_FALSE),
        ProgramValue::Bool(true) => out.push(VALUE_TRUE),
        ProgramValue::Int(v) => {
            out.push(VALUE_INT);
            out.extend_from_slice(&v.to_le_bytes());
        }
        ProgramValue::Float(v) => {
            out.push(VALUE_FLOAT);
            put_u64(out, v.to_bits());
        }
        ProgramValue::Bytes(bytes) => {
            out.push(VALUE_BYTES);
            put_blob(out, bytes);
        }
        ProgramValue::Table(entries) => {
            out.push(VALUE_TABLE);
            // The server builds at most MAX_RESULT_ENTRIES entries.
            put_u32(out, entries.len() as u32);
            for (key, value) in entries {
                put_value(out, key);
                put_value(out, value);
            }
        }
    }
}

/// Reads a value; `nested` is true inside a table, where only scalars
/// are allowed.
pub(crate) fn read_value(
    r: &mut BodyReader<'_>,
    max_value_bytes: usize,
    nested: bool,
) -> Result<ProgramValue, DecodeError> {
    let tag = r.u8()?;
    let value = match tag {
        VALUE_NIL => ProgramValue::Nil,
        VALUE_FALSE => ProgramValue::Bool(false),
        VALUE_TRUE => ProgramValue::Bool(true),
        VALUE_INT => ProgramValue::Int(r.u64()? as i64),
        VALUE_FLOAT => ProgramValue::Float(f64::from_bits(r.u64()?)),
        VALUE_BYTES => ProgramValue::Bytes(r.blob("value", max_value_bytes)?),
        VALUE_TABLE if !nested => {
            let count = r.u32()?;
            if count > MAX_RESULT_ENTRIES {
                return Err(DecodeError::TooMany {
                    what: "result table entries",
                    got: u64::from(count),
                    limit: u64::from(MAX_RESULT_ENTRIES),
                });
            }
            // An entry is at least two tag bytes.
            let mut entries = Vec::with_capacity((count as usize).min(r.remaining() / 2));
            for _ in 0..count {
                let key = read_value(r, max_value_bytes, true)?;
                if !matches!(key, ProgramValue::Int(_) | ProgramValue::Bytes(_)) {
                    return Err(DecodeError::BadField {
                        what: "result table key tag (integer or string)",
                        got: u64::from(tag_of(&key)),
                    });
                }
                let value = read_value(r, max_value_bytes, true)?;
                entries.push((key, value));
            }
            ProgramValue::Table(entries)
        }
        other => {
            return Err(DecodeError::BadField {
                what: "result value tag",
                got: u64::from(other),
            });
        }
    };
    if nested && !value.is_scalar() {
        return Err(DecodeError::BadField {
            what: "result table entry tag (a scalar)",
            got: u64::from(tag_of(&value)),
        });
    }
    Ok(value)
}

fn tag_of(value: &ProgramValue) -> u8 {
    match value {
        ProgramValue::Nil => VALUE_NIL,
        ProgramValue::Bool(false) => VALUE_FALSE,
        ProgramValue::Bool(true) => VALUE_TRUE,
        ProgramValue::Int(_) => VALUE_INT,
        ProgramValue::Float(_) => VALUE_FLOAT,
        ProgramValue::Bytes(_) => VALUE_BYTES,
        ProgramValue::Table(_) => VALUE_TABLE,
    }
}

/// `run` arguments: a `u16` count, then each as a blob.
pub(crate) fn put_args(out: &mut Vec<u8>, args: &[Vec<u8>]) {
    // Callers (the client) refuse more than MAX_RUN_ARGS before encoding.
    put_u16(out, args.len().min(usize::from(u16::MAX)) as u16);
    for arg in args.iter().take(usize::from(u16::MAX)) {
        put_blob(out, arg);
    }
}

pub(crate) fn read_args(r: &mut BodyReader<'_>) -> Result<Vec<Vec<u8>>, DecodeError> {
    let count = usize::from(r.u16()?);
    if count > MAX_RUN_ARGS {
        return Err(DecodeError::TooMany {
            what: "run argument count",
            got: count as u64,
            limit: MAX_RUN_ARGS as u64,
        });
    }
    // Each argument is at least its 4-byte length.
    let mut args = Vec::with_capacity(count.min(r.remaining() / 4));
    for _ in 0..count {
        args.push(r.blob("run argument", MAX_RUN_ARG_BYTES)?);
    }
    Ok(args)
}

pub(crate) fn put_run_reply(out: &mut Vec<u8>, reply: &RunReply) {
    put_u64(out, reply.lsn);
    put_u64(out, reply.seq);
    put_u64(out, reply.instructions);
    put_u32(out, reply.cells_written);
    put_value(out, &reply.value);
}

pub(crate) fn read_run_reply(
    r: &mut BodyReader<'_>,
    max_value_bytes: usize,
) -> Result<RunReply, DecodeError> {
    Ok(RunReply {
        lsn: r.u64()?,
        seq: r.u64()?,
        instructions: r.u64()?,
        cells_written: r.u32()?,
        value: read_value(r, max_value_bytes, false)?,
    })
}

pub(crate) fn put_step_reply(out: &mut Vec<u8>, reply: &StepReply) {
    debug_assert!(
        reply.failed <= reply.programs && reply.first_failure.is_some() == (reply.failed > 0),
        "a step reply the decoder would refuse: {reply:?}"
    );
    put_u64(out, reply.lsn);
    put_u32(out, reply.programs);
    put_u32(out, reply.failed);
    put_u32(out, reply.cells_written);
    put_u64(out, reply.instructions);
    match &reply.first_failure {
        None => out.push(0),
        Some(failure) => {
            out.push(1);
            put_coord(out, failure.coord);
            put_u64(out, failure.seq);
            out.push(failure.outcome as u8);
            put_short_string(out, &failure.message, MAX_OUTCOME_MESSAGE_BYTES);
        }
    }
}

pub(crate) fn read_step_reply(r: &mut BodyReader<'_>) -> Result<StepReply, DecodeError> {
    let lsn = r.u64()?;
    let programs = r.u32()?;
    let failed = r.u32()?;
    if failed > programs {
        return Err(DecodeError::BadField {
            what: "step failures (more than the programs run)",
            got: u64::from(failed),
        });
    }
    let cells_written = r.u32()?;
    let instructions = r.u64()?;
    let first_failure = if r.bool()? {
        let coord = r.coord()?;
        let seq = r.u64()?;
        let raw = r.u8()?;
        let outcome = RunOutcome::from_u8(raw)
            .filter(|outcome| *outcome != RunOutcome::Ok)
            .ok_or(DecodeError::BadField {
                what: "step failure outcome",
                got: u64::from(raw),
            })?;
        let message = r.short_string("run outcome message", MAX_OUTCOME_MESSAGE_BYTES)?;
        Some(StepFailure {
            coord,
            seq,
            outcome,
            message,
        })
    } else {
        None
    };
    if first_failure.is_some() != (failed > 0) {
        return Err(DecodeError::BadField {
            what: "step first failure (present exactly when a run failed)",
            got: u64::from(failed),
        });
    }
    Ok(StepReply {
        lsn,
        programs,
        failed,
        cells_written,
        instructions,
        first_failure,
    })
}

/// The smallest encoded record: five integers, the outcome and an empty
/// message.
const MIN_RECORD_BYTES: usize = 8 * 4 + 4 + 1 + 2;

pub(crate) fn put_cell_stats(out: &mut Vec<u8>, stats: &CellStats) {
    out.push(u8::from(stats.program_bytes.is_some()));
    put_u32(out, stats.program_bytes.unwrap_or(0));
    put_u64(out, stats.runs);
    put_u64(out, stats.failures);
    let records = &stats.records[..stats.records.len().min(MAX_CELL_STATS_RECORDS as usize)];
    put_u32(out, records.len() as u32);
    for record in records {
        put_u64(out, record.seq);
        put_u64(out, record.started_unix_us);
        put_u64(out, record.duration_ns);
        put_u64(out, record.instructions);
        put_u32(out, record.cells_written);
        out.push(record.outcome as u8);
        put_short_string(out, &record.message, MAX_OUTCOME_MESSAGE_BYTES);
    }
}

pub(crate) fn read_cell_stats(r: &mut BodyReader<'_>) -> Result<CellStats, DecodeError> {
    let has_program = r.bool()?;
    let program_bytes = r.u32()?;
    // With no program the size field is written as 0; any other value would
    // be a second encoding of the same stats, so it is refused.
    if !has_program && program_bytes != 0 {
        return Err(DecodeError::BadField {
            what: "program size of a cell without a program",
            got: u64::from(program_bytes),
        });
    }
    let runs = r.u64()?;
    let failures = r.u64()?;
    let count = r.u32()?;
    if count > MAX_CELL_STATS_RECORDS {
        return Err(DecodeError::TooMany {
            what: "cell stats record count",
            got: u64::from(count),
            limit: u64::from(MAX_CELL_STATS_RECORDS),
        });
    }
    let mut records = Vec::with_capacity((count as usize).min(r.remaining() / MIN_RECORD_BYTES));
    for _ in 0..count {
        let seq = r.u64()?;
        let started_unix_us = r.u64()?;
        let duration_ns = r.u64()?;
        let instructions = r.u64()?;
        let cells_written = r.u32()?;
        let raw = r.u8()?;
        let outcome = RunOutcome::from_u8(raw).ok_or(DecodeError::BadField {
            what: "run outcome",
            got: u64::from(raw),
        })?;
        let message = r.short_string("run outcome message", MAX_OUTCOME_MESSAGE_BYTES)?;
        records.push(RunRecord {
            seq,
            started_unix_us,
            duration_ns,
            instructions,
            cells_written,
            outcome,
            message,
        });
    }
    Ok(CellStats {
        program_bytes: has_program.then_some(program_bytes),
        runs,
        failures,
        records,
    })
}
