//! `cubec prog`, `run`, `step` and `stats NS X,Y,Z`: arguments, output
//! formats and exit codes of the cell-program commands (`docs/programs.md`).

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;

use clap::{ArgGroup, Args};
use cube_client::{
    CellBox, CellStats, Client, Coord, NamespaceName, ProgramValue, RunRecord, RunReply,
    StepFailure, StepReply, base64, json, parse_coord,
};
use serde_json::{Value, json};

use super::{
    CellArgs, EXIT_SERVER, Failure, cell_json, coord_json, emit, emit_line, escape_value,
    parse_namespace_arg,
};

pub(crate) const PROG_HELP: &str = "\
Stores a Lua 5.4 program at a cell, replacing any program there. The server
compiles it first: a syntax error is refused with its line and nothing is
stored. Exactly one source: the SOURCE argument, `-` for stdin, --file, or
--delete to remove the cell's program. docs/programs.md describes the API
(cube.get, cube.put, cube.incr, cube.count, ...), the limits and the sandbox.

Examples:
  cubec prog default 0,0,0 'return cube.rincr(0, 0, 0, 1)'
  cubec prog default 5,5,5 --file life.lua
  cubec prog default 0,0,0 - < counter.lua
  cubec prog default 0,0,0 --delete";

pub(crate) const RUN_HELP: &str = "\
Runs the program stored at a cell, atomically, on the daemon: its writes are
applied together (and durable) or, if it fails, not at all. ARGs reach the
program as strings (`...`). The result prints as text: nil, true/false, a
number, a string's bytes (followed by a newline unless they end with one;
--json gives them exactly), or a table as `KEY<TAB>VALUE` lines; with
--json, one object with the run's seq, lsn, instructions and cells written.
Exits 3 when the program fails (error, out of fuel, out of memory); the
failure is still recorded in the cell's telemetry (`cubec stats NS X,Y,Z`).

Examples:
  cubec run default 0,0,0
  cubec run default 5,5,5 1000
  cubec --json run default 0,0,0 a b c";

pub(crate) const STEP_HELP: &str = "\
Runs every program stored in the box X0,Y0,Z0..X1,Y1,Z1 (both corners
included) once, in the namespace's curve order, each with the same ARGs and
its own cell as cube.x, cube.y, cube.z. Every run reads the state from before
the step and sees no write of the step, not even its own: like one
generation of a cellular automaton. A run that fails applies nothing; the
writes of the runs that succeed are applied in the step's order (a later
run's write to the same cell wins). All of it, with one telemetry record per
run, commits as one durable write.

Prints `ran N programs in NS BOX: K ok, F failed, C cells written, about I
instructions (lsn L)` (cubed counts instructions in blocks of 1000, rounded
down: fewer than 1000 print as `under 1000 instructions`), and, if a run
failed, the first failure: its cell, its run number there (seq), its outcome and message. With --json, one object
with lsn, programs, ok, failed, cells_written, instructions and first_failure
(null or {coord: [x, y, z], seq, outcome, message}). Exits 3 when any program
failed (the other runs' writes still stand; `cubec stats NS X,Y,Z` shows a
cell's runs). A box without programs runs nothing and exits 0. Limits: at most
32768 programs in the box, 65536 cells written per step (minus one per
program), and the daemon's --program-step-ms of writer time (later runs fail
out of fuel); fuel and memory per run as for `run`.

Examples:
  cubec step default 0,0,0 63,63,0
  cubec step default -1,-1,-1 1,1,1 1000
  cubec --json step default 0,0,0 9,9,9";

pub(crate) const STATS_HELP: &str = "\
Without a cell: the daemon's counters and gauges, including cmd.prog.* and
cmd.run.* latency and the programs.* figures. The table shows what has
happened (commands served, figures that are not zero); --all shows every
row, and --json always carries every row. With NS X,Y,Z: that cell's
program telemetry: whether it has a program, the exact number of runs and
failures, and the most recent records (--records, default 10).

Examples:
  cubec stats
  cubec stats --all
  cubec --json stats
  cubec stats default 0,0,0
  cubec stats default 0,0,0 --records 100 --json";

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("program").required(true).args(["source", "file", "delete"])))]
pub(crate) struct ProgArgs {
    #[command(flatten)]
    pub(crate) cell: CellArgs,

    /// The program's source, or `-` to read it from stdin
    #[arg(allow_hyphen_values = true, value_name = "SOURCE")]
    pub(crate) source: Option<OsString>,

    /// Read the source from this file
    #[arg(long, value_name = "PATH")]
    pub(crate) file: Option<PathBuf>,

    /// Remove the cell's program instead
    #[arg(long)]
    pub(crate) delete: bool,
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub(crate) cell: CellArgs,

    /// Arguments passed to the program (as strings)
    #[arg(allow_hyphen_values = true, value_name = "ARG")]
    pub(crate) args: Vec<OsString>,
}

#[derive(Debug, Args)]
pub(crate) struct StepArgs {
    /// Namespace: 1 to 64 of a-z, 0-9, '_' and '-' (a fresh server has `default`)
    #[arg(value_parser = parse_namespace_arg, value_name = "NS")]
    pub(crate) ns: NamespaceName,

    /// The box's low corner, e.g. 0,0,0
    #[arg(value_parser = parse_coord, allow_hyphen_values = true, value_name = "X0,Y0,Z0")]
    pub(crate) lo: Coord,

    /// The box's high corner, e.g. 63,63,0
    #[arg(value_parser = parse_coord, allow_hyphen_values = true, value_name = "X1,Y1,Z1")]
    pub(crate) hi: Coord,

    /// Arguments passed to every program (as strings)
    #[arg(allow_hyphen_values = true, value_name = "ARG")]
    pub(crate) args: Vec<OsString>,
}

#[derive(Debug, Args)]
pub(crate) struct StatsArgs {
    /// Namespace of the cell whose program telemetry to show
    #[arg(value_parser = parse_namespace_arg, value_name = "NS", requires = "coord")]
    pub(crate) ns: Option<NamespaceName>,

    /// The cell, X,Y,Z
    #[arg(value_parser = parse_coord, allow_hyphen_values = true, value_name = "X,Y,Z")]
    pub(crate) coord: Option<Coord>,

    /// How many recent telemetry records to show (with a cell)
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub(crate) records: u32,

    /// Refresh the server's stats in place every INTERVAL, like `top` (Ctrl-C stops):
    /// seconds (2, 0.5) or a duration with units (2s, 500ms)
    #[arg(long, value_name = "INTERVAL", num_args = 0..=1, default_missing_value = "2",
          conflicts_with = "ns", value_parser = cube_client::parse_seconds)]
    pub(crate) watch: Option<f64>,

    /// Show every row: also commands never served, zero counts and the
    /// latency histograms' rows (by default the table shows what has happened)
    #[arg(long, conflicts_with_all = ["ns", "prometheus"])]
    pub(crate) all: bool,

    /// Print the server's stats in the Prometheus text exposition format
    /// (for the node-exporter textfile collector or a scrape wrapper)
    #[arg(long, conflicts_with_all = ["ns", "watch"])]
    pub(crate) prometheus: bool,
}

fn read_source(args: &ProgArgs) -> Result<Vec<u8>, Failure> {
    if args.delete {
        return Ok(Vec::new());
    }
    match (&args.source, &args.file) {
        (Some(source), None) if source == "-" => {
            let mut bytes = Vec::new();
            std::io::stdin()
                .lock()
                .read_to_end(&mut bytes)
                .map_err(|e| Failure::usage(format!("cannot read the program from stdin: {e}")))?;
            Ok(bytes)
        }
        (Some(source), None) => Ok(source.clone().into_vec()),
        (None, Some(path)) => std::fs::read(path).map_err(|e| {
            Failure::usage(format!(
                "cannot read program file {}: {e}; check the path and permissions",
                path.display()
            ))
        }),
        _ => Err(Failure::usage(
            "give exactly one source: SOURCE, `-` for stdin, --file PATH or --delete; \
             see `cubec help prog`"
                .to_owned(),
        )),
    }
}

pub(crate) fn prog(
    client: &mut Client,
    args: &ProgArgs,
    as_json: bool,
    out: &mut impl Write,
) -> Result<u8, Failure> {
    let source = read_source(args)?;
    if source.is_empty() && !args.delete {
        return Err(Failure::usage(
            "the program is empty; use --delete to remove a cell's program".to_owned(),
        ));
    }
    let stored = client.prog(args.cell.ns.as_str(), args.cell.coord, &source)?;
    let line = if as_json {
        cell_json(
            &args.cell,
            json!({
                "bytes": source.len(),
                "deleted": args.delete,
                "replaced": stored.replaced,
                "lsn": stored.lsn,
            }),
        )
    } else if args.delete {
        format!(
            "{} the program at {} {} (lsn {})",
            if stored.replaced {
                "removed"
            } else {
                "no program to remove;"
            },
            args.cell.ns,
            args.cell.coord,
            stored.lsn
        )
    } else {
        format!(
            "stored a {}-byte program at {} {}{} (lsn {})",
            source.len(),
            args.cell.ns,
            args.cell.coord,
            if stored.replaced {
                ", replacing the old one"
            } else {
                ""
            },
            stored.lsn
        )
    };
    emit_line(out, &line)?;
    Ok(0)
}

pub(crate) fn run(
    client: &mut Client,
    args: &RunArgs,
    as_json: bool,
    out: &mut impl Write,
) -> Result<u8, Failure> {
    let bytes: Vec<Vec<u8>> = args.args.iter().map(|a| a.clone().into_vec()).collect();
    let refs: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
    let reply = client.run(args.cell.ns.as_str(), args.cell.coord, &refs)?;
    if as_json {
        emit_line(out, &run_json(&args.cell, &reply))?;
    } else {
        emit(out, &value_text(&reply.value))?;
    }
    Ok(0)
}

fn run_json(cell: &CellArgs, reply: &RunReply) -> String {
    cell_json(
        cell,
        json!({
            "seq": reply.seq,
            "lsn": reply.lsn,
            "instructions": reply.instructions,
            "cells_written": reply.cells_written,
            "value": program_value(&reply.value),
        }),
    )
}

pub(crate) fn step(
    client: &mut Client,
    args: &StepArgs,
    as_json: bool,
    out: &mut impl Write,
) -> Result<u8, Failure> {
    // Checked here like scan's box, so the mistake is a usage error (exit 2)
    // that names the axis, before anything is sent.
    CellBox::new(args.lo, args.hi)
        .map_err(|why| Failure::usage(format!("{why}; see `cubec help step`")))?;
    let bytes: Vec<Vec<u8>> = args.args.iter().map(|a| a.clone().into_vec()).collect();
    let refs: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
    let reply = client.step(args.ns.as_str(), args.lo, args.hi, &refs)?;
    let text = if as_json {
        format!("{}\n", step_json(args, &reply))
    } else {
        step_text(args, &reply)
    };
    emit(out, text.as_bytes())?;
    match &reply.first_failure {
        Some(failure) if reply.failed > 0 => {
            eprintln!(
                "cubec: {} of {} programs failed, the first at {} {}; the other runs' writes \
                 were applied; `cubec stats {} {}` shows that cell's recent runs",
                reply.failed, reply.programs, args.ns, failure.coord, args.ns, failure.coord
            );
            Ok(EXIT_SERVER)
        }
        _ => Ok(0),
    }
}

/// The daemon counts fuel in blocks of 1000 VM instructions, rounded down
/// (docs/protocol.md), so 0 means "fewer than 1000", not "none".
pub(crate) fn instructions_text(instructions: u64) -> String {
    if instructions < 1000 {
        "under 1000 instructions".to_owned()
    } else {
        format!("about {instructions} instructions")
    }
}

fn plural(n: u32, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn step_text(args: &StepArgs, reply: &StepReply) -> String {
    let place = format!("{} {}..{}", args.ns, args.lo, args.hi);
    if reply.programs == 0 {
        return format!("no program in {place}; nothing ran\n");
    }
    let mut text = format!(
        "ran {} in {place}: {} ok, {} failed, {} written, {} (lsn {})\n",
        plural(reply.programs, "program", "programs"),
        reply.programs.saturating_sub(reply.failed),
        reply.failed,
        plural(reply.cells_written, "cell", "cells"),
        instructions_text(reply.instructions),
        reply.lsn
    );
    if let Some(failure) = &reply.first_failure {
        text.push_str(&format!(
            "first failure: {} (seq {}) {}",
            failure.coord,
            failure.seq,
            failure.outcome.name()
        ));
        if !failure.message.is_empty() {
            let mut escaped = Vec::new();
            escape_value(failure.message.as_bytes(), &mut escaped);
            text.push_str(": ");
            text.push_str(&String::from_utf8_lossy(&escaped));
        }
        text.push('\n');
    }
    text
}

fn step_failure_json(failure: &StepFailure) -> Value {
    json!({
        "coord": coord_json(failure.coord),
        "seq": failure.seq,
        "outcome": failure.outcome.name(),
        "message": failure.message,
    })
}

fn step_json(args: &StepArgs, reply: &StepReply) -> String {
    json::to_string(&json!({
        "ns": args.ns.as_str(),
        "lo": coord_json(args.lo),
        "hi": coord_json(args.hi),
        "lsn": reply.lsn,
        "programs": reply.programs,
        "ok": reply.programs.saturating_sub(reply.failed),
        "failed": reply.failed,
        "cells_written": reply.cells_written,
        "instructions": reply.instructions,
        "first_failure": reply.first_failure.as_ref().map(step_failure_json),
    }))
}

/// A result as text: scalars on one line, a table as `KEY<TAB>VALUE`
/// lines; strings' bytes as they are (escaped inside tables, so each entry
/// stays one line).
pub(crate) fn value_text(value: &ProgramValue) -> Vec<u8> {
    let mut out = Vec::new();
    match value {
        ProgramValue::Table(entries) => {
            for (key, value) in entries {
                scalar_text(key, &mut out, true);
                out.push(b'\t');
                scalar_text(value, &mut out, true);
                out.push(b'\n');
            }
        }
        ProgramValue::Bytes(bytes) => {
            out.extend_from_slice(bytes);
            if !bytes.ends_with(b"\n") {
                out.push(b'\n');
            }
        }
        scalar => {
            scalar_text(scalar, &mut out, false);
            out.push(b'\n');
        }
    }
    out
}

fn scalar_text(value: &ProgramValue, out: &mut Vec<u8>, escape: bool) {
    match value {
        ProgramValue::Nil => out.extend_from_slice(b"nil"),
        ProgramValue::Bool(b) => out.extend_from_slice(b.to_string().as_bytes()),
        ProgramValue::Int(i) => out.extend_from_slice(i.to_string().as_bytes()),
        ProgramValue::Float(f) => out.extend_from_slice(format!("{f:?}").as_bytes()),
        ProgramValue::Bytes(bytes) if escape => escape_value(bytes, out),
        ProgramValue::Bytes(bytes) => out.extend_from_slice(bytes),
        ProgramValue::Table(_) => out.extend_from_slice(b"(table)"),
    }
}

/// A result as JSON: null, a boolean, a number, a string (or
/// `{"base64": ...}` for bytes that are not UTF-8), and a table as an
/// array when its keys are exactly 1..n, else as an object, unless two
/// keys would be the same object key (`1` and `"1"`) or a key is not
/// UTF-8: then as an array of `[key, value]` pairs, keys keeping their
/// type. Values are scalars, so the pairs never look like an array table.
fn program_value(value: &ProgramValue) -> Value {
    match value {
        ProgramValue::Nil => Value::Null,
        ProgramValue::Bool(b) => Value::Bool(*b),
        ProgramValue::Int(i) => Value::from(*i),
        ProgramValue::Float(f) => Value::from(*f),
        ProgramValue::Bytes(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) => Value::from(text),
            Err(_) => json!({"base64": base64::encode(bytes)}),
        },
        ProgramValue::Table(entries) => table_value(entries),
    }
}

fn table_value(entries: &[(ProgramValue, ProgramValue)]) -> Value {
    let is_array = entries
        .iter()
        .enumerate()
        .all(|(i, (key, _))| *key == ProgramValue::Int(i as i64 + 1));
    if is_array {
        return entries.iter().map(|(_, v)| program_value(v)).collect();
    }
    let object_keys: Option<Vec<String>> = entries
        .iter()
        .map(|(key, _)| match key {
            ProgramValue::Int(i) => Some(i.to_string()),
            ProgramValue::Bytes(bytes) => std::str::from_utf8(bytes).ok().map(str::to_owned),
            _ => None,
        })
        .collect();
    let distinct = object_keys.as_ref().is_some_and(|keys| {
        let unique: std::collections::HashSet<&String> = keys.iter().collect();
        unique.len() == keys.len()
    });
    match object_keys {
        Some(keys) if distinct => Value::Object(
            keys.into_iter()
                .zip(entries)
                .map(|(key, (_, v))| (key, program_value(v)))
                .collect(),
        ),
        _ => entries
            .iter()
            .map(|(key, v)| json!([program_value(key), program_value(v)]))
            .collect(),
    }
}

pub(crate) fn cell_stats(
    client: &mut Client,
    ns: &NamespaceName,
    coord: Coord,
    records: u32,
    as_json: bool,
    out: &mut impl Write,
) -> Result<u8, Failure> {
    let stats = client.cell_stats(ns.as_str(), coord, records)?;
    let text = if as_json {
        cell_stats_json(ns, coord, &stats)
    } else {
        cell_stats_text(ns, coord, &stats)
    };
    emit(out, text.as_bytes())?;
    Ok(0)
}

fn started(record: &RunRecord) -> String {
    format!(
        "{}.{:06}",
        record.started_unix_us / 1_000_000,
        record.started_unix_us % 1_000_000
    )
}

fn cell_stats_text(ns: &NamespaceName, coord: Coord, stats: &CellStats) -> String {
    let mut text = format!(
        "cell      {ns} {coord}\nprogram   {}\nruns      {}\nfailures  {}\n",
        stats
            .program_bytes
            .map_or("none".to_owned(), |bytes| format!("{bytes} bytes")),
        stats.runs,
        stats.failures
    );
    if !stats.records.is_empty() {
        text.push_str(&format!(
            "recent runs ({} shown, oldest first):\n{:>8}  {:>17}  {:>10}  {:>12}  {:>7}  outcome\n",
            stats.records.len(),
            "seq",
            "started (unix s)",
            "took (us)",
            "instructions",
            "written"
        ));
        for r in &stats.records {
            let mut outcome = r.outcome.name().to_owned();
            if !r.message.is_empty() {
                let mut escaped = Vec::new();
                escape_value(r.message.as_bytes(), &mut escaped);
                outcome.push_str(": ");
                outcome.push_str(&String::from_utf8_lossy(&escaped));
            }
            text.push_str(&format!(
                "{:>8}  {:>17}  {:>10.1}  {:>12}  {:>7}  {outcome}\n",
                r.seq,
                started(r),
                r.duration_ns as f64 / 1000.0,
                r.instructions,
                r.cells_written
            ));
        }
    }
    text
}

fn cell_stats_json(ns: &NamespaceName, coord: Coord, stats: &CellStats) -> String {
    let records: Vec<Value> = stats
        .records
        .iter()
        .map(|r| {
            json!({
                "seq": r.seq,
                "started_unix_us": r.started_unix_us,
                "duration_ns": r.duration_ns,
                "instructions": r.instructions,
                "cells_written": r.cells_written,
                "outcome": r.outcome.name(),
                "message": r.message,
            })
        })
        .collect();
    let object = json!({
        "ns": ns.as_str(),
        "coord": coord_json(coord),
        "program_bytes": stats.program_bytes,
        "runs": stats.runs,
        "failures": stats.failures,
        "records": records,
    });
    format!("{}\n", json::to_string(&object))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::{Cli, Command};

    fn value_json(value: &ProgramValue) -> String {
        json::to_string(&program_value(value))
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("cubec").chain(args.iter().copied()))
    }

    #[test]
    fn program_commands_parse() {
        let cli = parse(&["prog", "default", "-1,2,3", "return 1"]).unwrap();
        let Command::Prog(args) = cli.command else {
            panic!("not prog")
        };
        assert_eq!(args.cell.coord, Coord::new(-1, 2, 3));
        assert_eq!(
            args.source.as_deref(),
            Some(std::ffi::OsStr::new("return 1"))
        );
        assert!(
            parse(&["prog", "default", "0,0,0"]).is_err(),
            "a source is required"
        );
        assert!(parse(&["prog", "default", "0,0,0", "x", "--delete"]).is_err());
        assert!(parse(&["prog", "default", "0,0,0", "--delete"]).is_ok());
        let cli = parse(&["run", "default", "0,0,0", "-5", "x"]).unwrap();
        let Command::Run(args) = cli.command else {
            panic!("not run")
        };
        assert_eq!(args.args, ["-5", "x"]);
        let cli = parse(&["stats", "default", "1,2,3", "--records", "5"]).unwrap();
        let Command::Stats(args) = cli.command else {
            panic!("not stats")
        };
        assert_eq!((args.coord, args.records), (Some(Coord::new(1, 2, 3)), 5));
        let Command::Stats(args) = parse(&["stats"]).unwrap().command else {
            panic!("not stats")
        };
        assert!(args.ns.is_none() && args.coord.is_none());
        assert!(
            parse(&["stats", "default"]).is_err(),
            "a namespace needs a cell"
        );
    }

    #[test]
    fn step_parses_a_box_and_arguments() {
        let cli = parse(&["step", "default", "-1,-1,-1", "1,1,1", "-5", "x"]).unwrap();
        let Command::Step(args) = cli.command else {
            panic!("not step")
        };
        assert_eq!(
            (args.lo, args.hi),
            (Coord::new(-1, -1, -1), Coord::new(1, 1, 1))
        );
        assert_eq!(args.args, ["-5", "x"]);
        let Command::Step(args) = parse(&["step", "default", "0,0,0", "2,2,2"])
            .unwrap()
            .command
        else {
            panic!("not step")
        };
        assert!(args.args.is_empty());
        assert!(
            parse(&["step", "default", "0,0,0"]).is_err(),
            "a box needs two corners"
        );
        assert!(parse(&["step", "default", "0,0,0", "1,1"]).is_err());
    }

    fn step_args() -> StepArgs {
        StepArgs {
            ns: NamespaceName::new("default").unwrap(),
            lo: Coord::new(0, 0, 0),
            hi: Coord::new(2, 2, 2),
            args: Vec::new(),
        }
    }

    #[test]
    fn step_replies_render_as_text_and_json() {
        let mut reply = StepReply {
            lsn: 123,
            programs: 27,
            failed: 0,
            cells_written: 14,
            instructions: 5000,
            first_failure: None,
        };
        assert_eq!(
            step_text(&step_args(), &reply),
            "ran 27 programs in default 0,0,0..2,2,2: 27 ok, 0 failed, 14 cells written, \
             about 5000 instructions (lsn 123)\n"
        );
        assert_eq!(
            step_json(&step_args(), &reply),
            "{\"ns\":\"default\",\"lo\":[0,0,0],\"hi\":[2,2,2],\"lsn\":123,\"programs\":27,\
             \"ok\":27,\"failed\":0,\"cells_written\":14,\"instructions\":5000,\
             \"first_failure\":null}"
        );
        reply.failed = 2;
        reply.first_failure = Some(StepFailure {
            coord: Coord::new(1, -2, 3),
            seq: 4,
            outcome: cube_client::RunOutcome::Error,
            message: "line 1: boom\nagain \"x\"".to_owned(),
        });
        let text = step_text(&step_args(), &reply);
        assert!(text.contains(": 25 ok, 2 failed,"), "{text}");
        assert!(
            text.ends_with("\nfirst failure: 1,-2,3 (seq 4) error: line 1: boom\\nagain \"x\"\n"),
            "{text}"
        );
        let json = step_json(&step_args(), &reply);
        assert!(
            json.ends_with(
                "\"first_failure\":{\"coord\":[1,-2,3],\"seq\":4,\"outcome\":\"error\",\
                 \"message\":\"line 1: boom\\nagain \\\"x\\\"\"}}"
            ),
            "{json}"
        );
        let empty = StepReply {
            lsn: 0,
            programs: 0,
            failed: 0,
            cells_written: 0,
            instructions: 0,
            first_failure: None,
        };
        assert_eq!(
            step_text(&step_args(), &empty),
            "no program in default 0,0,0..2,2,2; nothing ran\n"
        );
        let one = StepReply {
            programs: 1,
            cells_written: 1,
            instructions: 1,
            ..empty
        };
        assert!(
            step_text(&step_args(), &one).starts_with(
                "ran 1 program in default 0,0,0..2,2,2: 1 ok, 0 failed, 1 cell written, \
                 under 1000 instructions (lsn 0)"
            ),
            "{}",
            step_text(&step_args(), &one)
        );
    }

    #[test]
    fn results_render_as_text_and_json() {
        let table = ProgramValue::Table(vec![
            (ProgramValue::Int(1), ProgramValue::Bytes(b"a\tb".to_vec())),
            (ProgramValue::Int(2), ProgramValue::Float(0.5)),
        ]);
        assert_eq!(value_text(&table), b"1\ta\\tb\n2\t0.5\n");
        assert_eq!(value_json(&table), "[\"a\\tb\",0.5]");
        let map = ProgramValue::Table(vec![(
            ProgramValue::Bytes(b"n".to_vec()),
            ProgramValue::Bool(true),
        )]);
        assert_eq!(value_json(&map), "{\"n\":true}");
        // Keys that would be one object key, or are not UTF-8: pairs.
        let clash = ProgramValue::Table(vec![
            (ProgramValue::Int(1), ProgramValue::Int(10)),
            (ProgramValue::Bytes(b"1".to_vec()), ProgramValue::Int(20)),
        ]);
        assert_eq!(value_json(&clash), "[[1,10],[\"1\",20]]");
        let binary = ProgramValue::Table(vec![
            (ProgramValue::Bytes(vec![0xfe]), ProgramValue::Bool(true)),
            (ProgramValue::Bytes(vec![0xff]), ProgramValue::Bool(false)),
        ]);
        assert_eq!(
            value_json(&binary),
            "[[{\"base64\":\"/g==\"},true],[{\"base64\":\"/w==\"},false]]"
        );
        assert_eq!(value_text(&ProgramValue::Nil), b"nil\n");
        assert_eq!(value_text(&ProgramValue::Int(-3)), b"-3\n");
        assert_eq!(
            value_json(&ProgramValue::Bytes(vec![0xff])),
            "{\"base64\":\"/w==\"}"
        );
    }
}
