//! `cubec export` and `cubec import`: a namespace's cells, edges and
//! programs out to a file and back in, round-trip exact.
//!
//! The file formats (also in `docs/operations.md`):
//!
//! - **JSON lines** (the default): one object per line, a `"type"` and its
//!   fields.
//!   `{"type":"cell","coord":[x,y,z],"value":"text"}`, or with
//!   `"value_base64"` instead of `"value"` when the bytes are not UTF-8;
//!   `{"type":"edge","from":[x,y,z],"to":[x,y,z],"label":"road","weight":2.5}`;
//!   `{"type":"program","coord":[x,y,z],"source":"return 1"}` (or
//!   `"source_base64"`). Weights are printed in the shortest form that
//!   reads back to the same `f64`.
//! - **CSV** (cells only): a header `x,y,z,value`, then one record per
//!   cell. A value is its text, quoted (RFC 4180: `""` for a quote) when it
//!   holds a comma, a quote, a CR or an LF; a value that is not UTF-8, or
//!   whose text starts with `base64:`, is written as `base64:` and its
//!   bytes in base64, so every value reads back exactly.
//!
//! Import reads records on one thread and sends batches on another, so
//! parsing overlaps the daemon's work. Each batch is one `batch` request:
//! atomic, durable when answered. A bad record stops the import before its
//! batch is sent (or, with `--skip-bad`, is left out and reported); every
//! write of an import is idempotent (a value, an edge's weight, a
//! program), so importing the same file again after fixing it is safe.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, IsTerminal, Read, Write};
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use cube_client::{
    BatchOp, CellBox, Client, ClientError, Coord, EdgeLabel, EdgeWeight, ErrorCode,
    MAX_BATCH_BYTES, MAX_BATCH_OPS, MAX_EDGE_PAGE, MAX_PROGRAM_BYTES, MAX_PROGRAM_PAGE,
    MAX_SCAN_PAGE_CELLS, NamespaceName, base64, failed_op_index, json, parse_coord,
};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{EXIT_USAGE, Failure, parse_namespace_arg};

#[path = "transfer/csv.rs"]
mod csv;

use self::csv::{CsvReader, CsvWriter};

pub(crate) const EXPORT_HELP: &str = "\
Writes the namespace's cells (in curve order), then its edges, then its
programs to stdout, one JSON object per line:

  {\"type\":\"cell\",\"coord\":[1,2,3],\"value\":\"hello\"}
  {\"type\":\"cell\",\"coord\":[1,2,4],\"value_base64\":\"/wA=\"}
  {\"type\":\"edge\",\"from\":[0,0,0],\"to\":[1,0,0],\"label\":\"road\",\"weight\":2.5}
  {\"type\":\"program\",\"coord\":[0,0,0],\"source\":\"return 1\"}

A value (or program source) that is not UTF-8 comes as value_base64 (or
source_base64) instead, so `cubec import` restores every byte. With
--region, only cells and programs inside the box and edges leaving it.
--format csv writes cells only: a header `x,y,z,value`, the value as text
(RFC 4180 quoting), or `base64:` and the bytes in base64 when they are not
UTF-8 or the text itself starts with `base64:`. The export is not a
snapshot: writes made while it runs may or may not be in it; everything
that exists throughout is, exactly once.

Examples:
  cubec export default > default.jsonl
  cubec export default --region -10,-10,0 10,10,0 > part.jsonl
  cubec export default --format csv > cells.csv";

pub(crate) const IMPORT_HELP: &str = "\
Reads FILE (`-` for stdin) as written by `cubec export` (JSON lines, or CSV
when --format csv or the name ends in .csv) and writes it into NS in
batches of --batch records. Each batch is applied atomically and durably:
all of it or none of it, even across a crash. A bad record stops the
import before its batch is sent: every batch before it is applied, nothing
of its own batch is, and the message gives its line number. With
--skip-bad, bad records are reported on stderr and left out, the rest is
imported, and the exit code is still 0 (the summary counts them). Existing
cells, edges and programs of NS are kept unless the file overwrites them,
so importing a file twice (say, after fixing a bad line) is safe.

On a terminal, stderr shows a progress bar with the rate and the time
left. At the end a summary goes to stdout (--json: one object with lines,
cells, edges, programs, skipped, seconds and the rate).

Examples:
  cubec import default default.jsonl
  cubec export default | cubec import copy -
  cubec import default cells.csv --skip-bad
  cubec --json import default big.jsonl --batch 8192";

/// Cells fetched per scan page and edges per edge-list page while
/// exporting: large pages, few round trips.
const EXPORT_PAGE: u32 = 16_384;
/// Bytes buffered before stdout is written to.
const OUTPUT_BUFFER_BYTES: usize = 1024 * 1024;
/// Bytes read from the input file at a time.
const INPUT_BUFFER_BYTES: usize = 1024 * 1024;
/// Batches parsed ahead of the one being sent: enough to keep the
/// connection busy, few enough that memory stays a few batches.
const BATCHES_AHEAD: usize = 2;
/// Skipped lines whose reason is remembered for the JSON summary (all are
/// counted, and each is reported on stderr as it is found).
const MAX_SKIPPED_REPORTED: usize = 100;
/// Room left in a frame besides the batch's operations (header,
/// namespace, count).
const BATCH_FRAME_OVERHEAD: u64 = 1024;
/// A record longer than [`max_record_bytes`] is refused without reading
/// it all: this much room for the coordinates, the field names and the
/// label besides the value.
const MAX_RECORD_SLACK_BYTES: usize = 4096;

/// The longest record a value of `max_value_bytes` can need: JSON escapes
/// a control byte as `\u00XX` (6 bytes for 1), and base64 and CSV quoting
/// take less.
fn max_record_bytes(max_value_bytes: usize) -> usize {
    max_value_bytes
        .saturating_mul(6)
        .saturating_add(MAX_RECORD_SLACK_BYTES)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    /// One JSON object per line: cells, edges and programs
    Jsonl,
    /// `x,y,z,value` records: cells only
    Csv,
}

#[derive(Debug, Args)]
pub(crate) struct ExportArgs {
    /// Namespace to export
    #[arg(value_parser = parse_namespace_arg, value_name = "NS")]
    ns: NamespaceName,

    /// Only this box: cells and programs inside it, edges leaving it
    #[arg(long, num_args = 2, value_parser = parse_coord, allow_hyphen_values = true,
          value_names = ["X0,Y0,Z0", "X1,Y1,Z1"])]
    region: Option<Vec<Coord>>,

    /// Output format
    #[arg(long, value_enum, default_value_t = Format::Jsonl)]
    format: Format,
}

#[derive(Debug, Args)]
pub(crate) struct ImportArgs {
    /// Namespace to write into (it must exist)
    #[arg(value_parser = parse_namespace_arg, value_name = "NS")]
    ns: NamespaceName,

    /// File to read, or `-` for stdin
    #[arg(value_name = "FILE", allow_hyphen_values = true)]
    file: PathBuf,

    /// Input format [default: csv if FILE ends in .csv, else jsonl]
    #[arg(long, value_enum)]
    format: Option<Format>,

    /// Report bad records and import the rest, instead of stopping at the first
    #[arg(long)]
    skip_bad: bool,

    /// Records per batch (one atomic, durable request each)
    #[arg(long, value_name = "N", default_value_t = 4096,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_BATCH_OPS)))]
    batch: u32,
}

// ---------------------------------------------------------------------------
// Export
// ---------------------------------------------------------------------------

/// Why an export ended early.
enum ExportEnd {
    /// The reader of stdout went away (`| head`): not an error.
    ReaderGone,
    Failed(Failure),
}

impl From<ClientError> for ExportEnd {
    fn from(error: ClientError) -> ExportEnd {
        ExportEnd::Failed(Failure::from(error))
    }
}

fn write_out(out: &mut impl Write, bytes: &[u8]) -> Result<(), ExportEnd> {
    out.write_all(bytes).map_err(|e| output_end(&e))
}

fn output_end(error: &io::Error) -> ExportEnd {
    if error.kind() == io::ErrorKind::BrokenPipe {
        ExportEnd::ReaderGone
    } else {
        ExportEnd::Failed(super::output_failure(error))
    }
}

/// The cells of `region` as CSV (which holds no edges or programs).
fn export_csv(
    client: &mut Client,
    ns: &str,
    region: &CellBox,
    out: &mut impl Write,
    cells: &mut u64,
) -> Result<(), ExportEnd> {
    let mut csv = CsvWriter::new(out);
    csv.header().map_err(|e| output_end(&e))?;
    for cell in client.scan(ns, *region, EXPORT_PAGE.min(MAX_SCAN_PAGE_CELLS)) {
        let cell = cell?;
        csv.cell(cell.coord, &cell.value)
            .map_err(|e| output_end(&e))?;
        *cells += 1;
    }
    csv.flush().map_err(|e| output_end(&e))
}

/// One line of `cubec export` (docs/operations.md): `type` first, then the
/// record's fields; bytes as text when they are UTF-8, else in base64.
#[derive(Serialize)]
struct CellLine<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    coord: [i32; 3],
    #[serde(flatten)]
    value: ValueField<'a>,
}

#[derive(Serialize)]
enum ValueField<'a> {
    #[serde(rename = "value")]
    Text(&'a str),
    #[serde(rename = "value_base64")]
    Base64(String),
}

#[derive(Serialize)]
struct EdgeLine<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    from: [i32; 3],
    to: [i32; 3],
    label: &'a str,
    // Stored weights are finite, so this is always a number, and the
    // shortest one that parses back to the same bits.
    weight: f64,
}

#[derive(Serialize)]
struct ProgramLine<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    coord: [i32; 3],
    #[serde(flatten)]
    source: SourceField<'a>,
}

#[derive(Serialize)]
enum SourceField<'a> {
    #[serde(rename = "source")]
    Text(&'a str),
    #[serde(rename = "source_base64")]
    Base64(String),
}

fn xyz(c: Coord) -> [i32; 3] {
    [c.x, c.y, c.z]
}

fn push_line(out: &mut String, record: &impl Serialize) {
    out.push_str(&json::to_string(record));
    out.push('\n');
}

fn cell_line(out: &mut String, coord: Coord, value: &[u8]) {
    let value = match std::str::from_utf8(value) {
        Ok(text) => ValueField::Text(text),
        Err(_) => ValueField::Base64(base64::encode(value)),
    };
    let line = CellLine {
        kind: "cell",
        coord: xyz(coord),
        value,
    };
    push_line(out, &line);
}

fn edge_line(out: &mut String, from: Coord, to: Coord, label: &str, weight: f64) {
    let line = EdgeLine {
        kind: "edge",
        from: xyz(from),
        to: xyz(to),
        label,
        weight,
    };
    push_line(out, &line);
}

fn program_line(out: &mut String, coord: Coord, source: &[u8]) {
    let source = match std::str::from_utf8(source) {
        Ok(text) => SourceField::Text(text),
        Err(_) => SourceField::Base64(base64::encode(source)),
    };
    let line = ProgramLine {
        kind: "program",
        coord: xyz(coord),
        source,
    };
    push_line(out, &line);
}

pub(crate) fn export(
    client: &mut Client,
    args: &ExportArgs,
    out: &mut impl Write,
) -> Result<u8, Failure> {
    let region = match args.region.as_deref() {
        Some([lo, hi]) => CellBox::new(*lo, *hi)
            .map_err(|why| Failure::usage(format!("--region: {why}; see `cubec help export`")))?,
        _ => CellBox::new(
            Coord::new(i32::MIN, i32::MIN, i32::MIN),
            Coord::new(i32::MAX, i32::MAX, i32::MAX),
        )
        .map_err(Failure::usage)?,
    };
    let started = Instant::now();
    let mut out = BufWriter::with_capacity(OUTPUT_BUFFER_BYTES, out);
    let mut counts = (0u64, 0u64, 0u64);
    let result = export_into(client, args, &region, &mut out, &mut counts).and_then(|()| {
        out.flush()
            .map_err(|e| ExportEnd::Failed(super::output_failure(&e)))
    });
    match result {
        Ok(()) | Err(ExportEnd::ReaderGone) => {}
        Err(ExportEnd::Failed(failure)) => return Err(failure),
    }
    let (cells, edges, programs) = counts;
    if args.format == Format::Csv && edges + programs > 0 {
        eprintln!(
            "cubec: warning: CSV holds cells only: left out {edges} edges and {programs} programs \
             of {}; export without --format csv (JSON lines) to keep them",
            args.ns
        );
    }
    if io::stderr().is_terminal() {
        let (edges, programs) = if args.format == Format::Csv {
            (0, 0)
        } else {
            (edges, programs)
        };
        eprintln!(
            "cubec: exported {cells} cells, {edges} edges, {programs} programs of {} in {:.2} s",
            args.ns,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(0)
}

fn export_into(
    client: &mut Client,
    args: &ExportArgs,
    region: &CellBox,
    out: &mut impl Write,
    (cells, edges, programs): &mut (u64, u64, u64),
) -> Result<(), ExportEnd> {
    let ns = args.ns.as_str();
    // CSV carries cells only: the edges and programs are counted, not
    // written, so `export` can say what the file leaves out.
    let write_all = args.format == Format::Jsonl;
    let mut line = String::with_capacity(4096);
    if args.format == Format::Csv {
        export_csv(client, ns, region, out, cells)?;
    } else {
        for cell in client.scan(ns, *region, EXPORT_PAGE.min(MAX_SCAN_PAGE_CELLS)) {
            let cell = cell?;
            line.clear();
            cell_line(&mut line, cell.coord, &cell.value);
            write_out(out, line.as_bytes())?;
            *cells += 1;
        }
    }
    let mut after = None;
    loop {
        let page = client.edge_page(ns, EXPORT_PAGE.min(MAX_EDGE_PAGE), after)?;
        for edge in page.edges.iter().filter(|e| region.contains(e.from)) {
            line.clear();
            edge_line(
                &mut line,
                edge.from,
                edge.to,
                edge.label.as_str(),
                edge.weight,
            );
            if write_all {
                write_out(out, line.as_bytes())?;
            }
            *edges += 1;
        }
        match page.resume_after {
            None => break,
            Some(next) if after.is_some_and(|previous| next <= previous) => {
                return Err(ClientError::UnexpectedResponse(format!(
                    "edge-list cursor went from {after:?} to {next}"
                ))
                .into());
            }
            Some(next) => after = Some(next),
        }
    }
    let mut after = None;
    loop {
        let page = client.program_page(ns, MAX_PROGRAM_PAGE, after)?;
        for program in page.programs.iter().filter(|p| region.contains(p.coord)) {
            line.clear();
            program_line(&mut line, program.coord, &program.source);
            if write_all {
                write_out(out, line.as_bytes())?;
            }
            *programs += 1;
        }
        match page.resume_after {
            None => break,
            Some(next) if after.is_some_and(|previous| next <= previous) => {
                return Err(ClientError::UnexpectedResponse(format!(
                    "prog-list cursor went from {after:?} to {next}"
                ))
                .into());
            }
            Some(next) => after = Some(next),
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Parsing records
// ---------------------------------------------------------------------------

/// Every field a JSON line may have; which ones are required depends on
/// `type`. Borrowed where the text has no escapes, so most values are
/// never copied before their base64 decode or their final `Vec`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRecord<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    coord: Option<[i32; 3]>,
    #[serde(borrow)]
    value: Option<Cow<'a, str>>,
    #[serde(borrow)]
    value_base64: Option<Cow<'a, str>>,
    from: Option<[i32; 3]>,
    to: Option<[i32; 3]>,
    #[serde(borrow)]
    label: Option<Cow<'a, str>>,
    weight: Option<f64>,
    #[serde(borrow)]
    source: Option<Cow<'a, str>>,
    #[serde(borrow)]
    source_base64: Option<Cow<'a, str>>,
}

fn coord_of(field: &str, value: Option<[i32; 3]>) -> Result<Coord, String> {
    value
        .map(|[x, y, z]| Coord::new(x, y, z))
        .ok_or_else(|| format!("missing \"{field}\": [x,y,z]"))
}

/// The bytes of a text-or-base64 field pair; exactly one must be there.
fn text_or_base64(
    text_field: &str,
    text: Option<Cow<'_, str>>,
    base64_field: &str,
    encoded: Option<Cow<'_, str>>,
) -> Result<Vec<u8>, String> {
    match (text, encoded) {
        (Some(text), None) => Ok(text.into_owned().into_bytes()),
        (None, Some(encoded)) => base64::decode(&encoded)
            .ok_or_else(|| format!("\"{base64_field}\" is not valid (padded, standard) base64")),
        (Some(_), Some(_)) => Err(format!(
            "both \"{text_field}\" and \"{base64_field}\"; give exactly one"
        )),
        (None, None) => Err(format!("missing \"{text_field}\" (or \"{base64_field}\")")),
    }
}

/// serde_json's message for a bad line without its " at line 1 column C"
/// (a record is one line: the line that counts is the file's), as
/// `column C: ...`, which [`BadRecord`]'s Display joins to the file's line.
fn json_reason(error: &serde_json::Error) -> String {
    let message = error.to_string();
    let suffix = format!(" at line {} column {}", error.line(), error.column());
    match message.strip_suffix(&suffix) {
        Some(bare) if error.column() > 0 => format!("column {}: {bare}", error.column()),
        _ => message,
    }
}

/// What one input record turns into, checked as far as the client can
/// (sizes, labels, weights); program syntax is checked by the daemon.
fn parse_json_record(text: &str, max_value_bytes: usize) -> Result<BatchOp, String> {
    let record: JsonRecord<'_> = serde_json::from_str(text).map_err(|e| json_reason(&e))?;
    let op = match record.kind.as_ref() {
        "cell" => {
            let coord = coord_of("coord", record.coord)?;
            let value = text_or_base64("value", record.value, "value_base64", record.value_base64)?;
            BatchOp::Put { coord, value }
        }
        "edge" => BatchOp::Link {
            from: coord_of("from", record.from)?,
            to: coord_of("to", record.to)?,
            label: EdgeLabel::new(record.label.as_deref().unwrap_or(""))?,
            weight: EdgeWeight::new(record.weight.unwrap_or(EdgeWeight::DEFAULT.get()))?.get(),
        },
        "program" => BatchOp::Prog {
            coord: coord_of("coord", record.coord)?,
            source: text_or_base64(
                "source",
                record.source,
                "source_base64",
                record.source_base64,
            )?,
        },
        other => {
            return Err(format!(
                "unknown \"type\": {other:?}; expected \"cell\", \"edge\" or \"program\""
            ));
        }
    };
    check_sizes(&op, max_value_bytes)?;
    Ok(op)
}

fn check_sizes(op: &BatchOp, max_value_bytes: usize) -> Result<(), String> {
    match op {
        BatchOp::Put { value, .. } if value.len() > max_value_bytes => Err(format!(
            "the value is {} bytes, over the server's limit of {max_value_bytes} (max_value_bytes)",
            value.len()
        )),
        BatchOp::Prog { source, .. } if source.len() > MAX_PROGRAM_BYTES => Err(format!(
            "the program is {} bytes, over the limit of {MAX_PROGRAM_BYTES}",
            source.len()
        )),
        _ => Ok(()),
    }
}

/// One record of the input and where it starts.
struct Record {
    /// The 1-based line the record starts on.
    line: u64,
    /// `Ok(None)`: nothing to import (a blank line, the CSV header).
    parsed: Result<Option<BatchOp>, String>,
}

/// Reads the input record by record.
struct RecordReader {
    input: BufReader<Box<dyn Read + Send>>,
    format: Format,
    max_value_bytes: usize,
    max_record_bytes: usize,
    /// Lines consumed so far.
    line: u64,
    /// Bytes consumed so far (for the progress bar).
    bytes: u64,
    /// The current JSON line.
    buf: Vec<u8>,
    csv: CsvReader,
}

impl RecordReader {
    fn new(
        input: Box<dyn Read + Send>,
        format: Format,
        max_value_bytes: usize,
        max_record_bytes: usize,
    ) -> RecordReader {
        RecordReader {
            input: BufReader::with_capacity(INPUT_BUFFER_BYTES, input),
            format,
            max_value_bytes,
            max_record_bytes,
            line: 0,
            bytes: 0,
            buf: Vec::new(),
            csv: CsvReader::new(),
        }
    }

    /// Reads one physical line (with its terminator) onto the end of `buf`;
    /// `false` at the end of the input.
    fn read_line(&mut self) -> io::Result<bool> {
        let limit = (self.max_record_bytes + 1).saturating_sub(self.buf.len()) as u64;
        let read = (&mut self.input)
            .take(limit)
            .read_until(b'\n', &mut self.buf)?;
        if read == 0 {
            return Ok(false);
        }
        self.bytes += read as u64;
        self.line += 1;
        Ok(true)
    }

    /// Skips the rest of an overlong line, so the next record starts on
    /// the next line.
    fn skip_rest_of_line(&mut self) -> io::Result<()> {
        loop {
            let available = self.input.fill_buf()?;
            if available.is_empty() {
                return Ok(());
            }
            match available.iter().position(|&b| b == b'\n') {
                Some(at) => {
                    self.input.consume(at + 1);
                    self.bytes += at as u64 + 1;
                    return Ok(());
                }
                None => {
                    let n = available.len();
                    self.input.consume(n);
                    self.bytes += n as u64;
                }
            }
        }
    }

    fn next_record(&mut self) -> io::Result<Option<Record>> {
        if self.format == Format::Csv {
            let record = self.csv.next_record(
                &mut self.input,
                &mut self.bytes,
                self.max_value_bytes,
                self.max_record_bytes,
            );
            self.line = self.csv.lines();
            return record;
        }
        self.buf.clear();
        if !self.read_line()? {
            return Ok(None);
        }
        let line = self.line;
        if self.buf.len() > self.max_record_bytes {
            if !self.buf.ends_with(b"\n") {
                self.skip_rest_of_line()?;
            }
            return Ok(Some(Record {
                line,
                parsed: Err(format!(
                    "the record is longer than {} bytes, more than any value the server \
                     takes (max_value_bytes) could need",
                    self.max_record_bytes
                )),
            }));
        }
        let mut bytes = self.buf.as_slice();
        bytes = bytes.strip_suffix(b"\n").unwrap_or(bytes);
        bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
        if line == 1 {
            // A byte-order mark some editors put first.
            bytes = bytes.strip_prefix("\u{feff}".as_bytes()).unwrap_or(bytes);
        }
        let parsed = match std::str::from_utf8(bytes) {
            Err(e) => Err(format!("not UTF-8 ({e})")),
            Ok(text) if text.trim().is_empty() => Ok(None),
            Ok(text) => parse_json_record(text, self.max_value_bytes).map(Some),
        };
        Ok(Some(Record { line, parsed }))
    }
}

// ---------------------------------------------------------------------------
// Import
// ---------------------------------------------------------------------------

/// Records of one batch, with the line each came from.
struct Batch {
    ops: Vec<BatchOp>,
    lines: Vec<u64>,
    /// Input bytes consumed once this batch was complete.
    input_bytes: u64,
}

/// A record the import could not use.
#[derive(Clone, Debug)]
struct BadRecord {
    line: u64,
    reason: String,
}

/// `line L: reason`, or `line L column C: reason` when the reason names
/// its column (a JSON syntax error).
impl std::fmt::Display for BadRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.reason.starts_with("column ") {
            write!(f, "line {} {}", self.line, self.reason)
        } else {
            write!(f, "line {}: {}", self.line, self.reason)
        }
    }
}

/// What the reading thread ends with.
#[derive(Default)]
struct ReadOutcome {
    lines: u64,
    skipped: Vec<BadRecord>,
    skipped_count: u64,
    /// The bad record the import stopped at (without `--skip-bad`).
    stopped_at: Option<BadRecord>,
    /// The input could not be read.
    read_error: Option<String>,
}

/// How the reading thread cuts records into batches, and the bar its
/// skipped-record reports print above.
#[derive(Clone)]
struct BatchShape {
    max_ops: usize,
    max_bytes: u64,
    skip_bad: bool,
    bar: ProgressBar,
}

fn report_skipped(outcome: &mut ReadOutcome, bad: BadRecord, bar: &ProgressBar) {
    // Above the bar, not through it: the bar redraws itself on its line.
    bar.suspend(|| eprintln!("cubec: {bad} (skipped)"));
    outcome.skipped_count += 1;
    if outcome.skipped.len() < MAX_SKIPPED_REPORTED {
        outcome.skipped.push(bad);
    }
}

/// The reading thread: records into batches, batches into `tx`, until the
/// input ends, a bad record stops it, or the sender hangs up.
fn read_batches(mut reader: RecordReader, shape: BatchShape, tx: SyncSender<Batch>) -> ReadOutcome {
    let mut outcome = ReadOutcome::default();
    let mut batch = Batch {
        ops: Vec::with_capacity(shape.max_ops),
        lines: Vec::with_capacity(shape.max_ops),
        input_bytes: 0,
    };
    let mut batch_bytes = 0u64;
    loop {
        let record = match reader.next_record() {
            Ok(Some(record)) => record,
            Ok(None) => break,
            Err(e) => {
                outcome.read_error = Some(format!("after line {}: {e}", reader.line));
                outcome.lines = reader.line;
                return outcome;
            }
        };
        let op = match record.parsed {
            Ok(None) => continue,
            Ok(Some(op)) => op,
            Err(reason) => {
                let bad = BadRecord {
                    line: record.line,
                    reason,
                };
                if shape.skip_bad {
                    report_skipped(&mut outcome, bad, &shape.bar);
                    continue;
                }
                // Stop before this record's batch is sent: nothing of it
                // is applied.
                outcome.stopped_at = Some(bad);
                outcome.lines = reader.line;
                return outcome;
            }
        };
        let op_bytes = op.encoded_len() as u64;
        if !batch.ops.is_empty()
            && (batch.ops.len() >= shape.max_ops || batch_bytes + op_bytes > shape.max_bytes)
        {
            batch.input_bytes = reader.bytes;
            let full = std::mem::replace(
                &mut batch,
                Batch {
                    ops: Vec::with_capacity(shape.max_ops),
                    lines: Vec::with_capacity(shape.max_ops),
                    input_bytes: 0,
                },
            );
            batch_bytes = 0;
            if tx.send(full).is_err() {
                outcome.lines = reader.line;
                return outcome;
            }
        }
        batch_bytes += op_bytes;
        batch.ops.push(op);
        batch.lines.push(record.line);
    }
    outcome.lines = reader.line;
    if !batch.ops.is_empty() {
        batch.input_bytes = reader.bytes;
        let _ = tx.send(batch);
    }
    outcome
}

/// What the import applied.
#[derive(Default)]
struct Applied {
    cells: u64,
    edges: u64,
    programs: u64,
    batches: u64,
    first_lsn: Option<u64>,
}

impl Applied {
    fn records(&self) -> u64 {
        self.cells + self.edges + self.programs
    }

    fn add(&mut self, ops: &[BatchOp], lsn: u64) {
        for op in ops {
            match op {
                BatchOp::Put { .. } => self.cells += 1,
                BatchOp::Link { .. } => self.edges += 1,
                BatchOp::Prog { .. } => self.programs += 1,
            }
        }
        self.batches += 1;
        if self.first_lsn.is_none() && lsn > 0 {
            self.first_lsn = Some(lsn);
        }
    }
}

/// Whether a refused batch operation is the record's fault (so
/// `--skip-bad` may leave it out), not the daemon's or the connection's.
fn is_bad_record(error: &ClientError) -> bool {
    match error {
        ClientError::BadArgument(_) => true,
        ClientError::Server(_) => matches!(
            error.server_code(),
            Some(
                ErrorCode::BadWeight
                    | ErrorCode::ProgramSyntax
                    | ErrorCode::ValueTooLarge
                    | ErrorCode::LimitExceeded
                    | ErrorCode::InvalidArgument
            )
        ),
        _ => false,
    }
}

/// The server's reason without its `op N (kind): ` prefix, which the
/// caller replaces with a line number.
fn reason_of(error: &ClientError) -> String {
    let text = match error {
        ClientError::Server(e) => e.message.clone(),
        other => other.to_string(),
    };
    let text = match text.split_once("): ") {
        Some((prefix, rest)) if prefix.starts_with("op ") => rest.to_owned(),
        _ => text,
    };
    // With --skip-bad the rest of the batch is sent again and applied, so
    // the server's "nothing of the batch was applied" would mislead.
    match text.strip_suffix("; nothing of the batch was applied") {
        Some(reason) => reason.to_owned(),
        None => text,
    }
}

/// Why the sending side stopped.
struct SendStop {
    /// The record to blame, when one is.
    bad: Option<BadRecord>,
    /// The lines of the batch that was not applied.
    batch_lines: (u64, u64),
    error: ClientError,
}

/// Sends batches as they come; with `skip_bad`, leaves out records the
/// daemon refuses and sends the rest of their batch again.
fn send_batches(
    client: &mut Client,
    args: &ImportArgs,
    rx: &Receiver<Batch>,
    progress: &Progress,
    applied: &mut Applied,
    skipped: &mut ReadOutcome,
) -> Result<(), SendStop> {
    for mut batch in rx.iter() {
        loop {
            match client.batch(args.ns.as_str(), &mut batch.ops) {
                Ok(ack) => {
                    applied.add(&batch.ops, ack.lsn);
                    break;
                }
                Err(error) => {
                    let index = failed_op_index(&error).filter(|i| *i < batch.lines.len());
                    let first = batch.lines.first().copied().unwrap_or(0);
                    let last = batch.lines.last().copied().unwrap_or(0);
                    let bad = index.map(|i| BadRecord {
                        line: batch.lines[i],
                        reason: reason_of(&error),
                    });
                    match (index, bad) {
                        (Some(i), Some(bad)) if args.skip_bad && is_bad_record(&error) => {
                            report_skipped(skipped, bad, &progress.bar);
                            batch.ops.remove(i);
                            batch.lines.remove(i);
                            if batch.ops.is_empty() {
                                break;
                            }
                        }
                        (_, bad) => {
                            return Err(SendStop {
                                bad,
                                batch_lines: (first, last),
                                error,
                            });
                        }
                    }
                }
            }
        }
        progress.bar.set_position(batch.input_bytes);
        let seconds = progress.started.elapsed().as_secs_f64().max(1e-9);
        progress.bar.set_message(format!(
            "{} records, {:.0}/s",
            applied.records(),
            applied.records() as f64 / seconds
        ));
    }
    Ok(())
}

fn open_input(path: &PathBuf) -> Result<(Box<dyn Read + Send>, Option<u64>), Failure> {
    if path.as_os_str() == "-" {
        return Ok((Box::new(io::stdin()), None));
    }
    let file = File::open(path).map_err(|e| {
        Failure::usage(format!(
            "cannot read {}: {e}; check the path and permissions",
            path.display()
        ))
    })?;
    let size = file
        .metadata()
        .ok()
        .filter(|m| m.is_file())
        .map(|m| m.len());
    Ok((Box::new(file), size))
}

/// The progress bar (hidden unless stderr is a terminal) and when the
/// import started, for its rate.
struct Progress {
    bar: ProgressBar,
    started: Instant,
}

fn progress_bar(size: Option<u64>) -> ProgressBar {
    if !io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = match size {
        Some(size) => ProgressBar::new(size).with_style(
            ProgressStyle::with_template(
                "{elapsed_precise} [{wide_bar}] {bytes}/{total_bytes} {msg}, {eta} left",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        ),
        None => ProgressBar::new_spinner().with_style(
            ProgressStyle::with_template("{spinner} {elapsed_precise} {bytes} read, {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        ),
    };
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

pub(crate) fn import(
    client: &mut Client,
    args: &ImportArgs,
    as_json: bool,
    out: &mut impl Write,
) -> Result<u8, Failure> {
    let format = args.format.unwrap_or_else(|| {
        let csv = args
            .file
            .extension()
            .is_some_and(|ext| ext.eq_ignore_ascii_case("csv"));
        if csv { Format::Csv } else { Format::Jsonl }
    });
    let (input, size) = open_input(&args.file)?;
    let limits = client.limits();
    let max_value_bytes = limits.max_value_bytes as usize;
    let progress = Progress {
        bar: progress_bar(size),
        started: Instant::now(),
    };
    let shape = BatchShape {
        bar: progress.bar.clone(),
        max_ops: args.batch as usize,
        max_bytes: MAX_BATCH_BYTES
            .min(u64::from(limits.max_frame_bytes).saturating_sub(BATCH_FRAME_OVERHEAD)),
        skip_bad: args.skip_bad,
    };
    let reader = RecordReader::new(
        input,
        format,
        max_value_bytes,
        max_record_bytes(max_value_bytes),
    );
    let (tx, rx) = sync_channel(BATCHES_AHEAD);
    let reading = thread::Builder::new()
        .name("cubec-import-read".to_owned())
        .spawn(move || read_batches(reader, shape, tx))
        .map_err(|e| Failure::usage(format!("cannot start the reading thread: {e}")))?;
    let mut applied = Applied::default();
    let mut send_skipped = ReadOutcome::default();
    let sent = send_batches(
        client,
        args,
        &rx,
        &progress,
        &mut applied,
        &mut send_skipped,
    );
    // Hanging up stops the reader if the sending side gave up early.
    drop(rx);
    let mut read = reading.join().unwrap_or_else(|_| ReadOutcome {
        read_error: Some("the reading thread panicked".to_owned()),
        ..ReadOutcome::default()
    });
    progress.bar.finish_and_clear();
    let seconds = progress.started.elapsed().as_secs_f64();
    read.skipped_count += send_skipped.skipped_count;
    read.skipped.extend(send_skipped.skipped);
    read.skipped.sort_by_key(|bad| bad.line);
    read.skipped.truncate(MAX_SKIPPED_REPORTED);

    // What went wrong, if anything: the sender's stop comes first (the
    // reader may have read past it), then a bad record, then the input.
    let failure = match (&sent, &read.stopped_at, &read.read_error) {
        (Err(stop), _, _) => Some(send_failure(stop, applied.records())),
        (Ok(()), Some(bad), _) => Some((
            EXIT_USAGE,
            bad.line,
            format!(
                "{bad}; nothing from its batch on was imported ({} records before it \
                 were); fix the line and import again (records already imported are simply \
                 written again), or use --skip-bad",
                applied.records()
            ),
        )),
        (Ok(()), None, Some(error)) => Some((
            EXIT_USAGE,
            0,
            format!(
                "cannot read {}: {error}; {} records were imported",
                args.file.display(),
                applied.records()
            ),
        )),
        (Ok(()), None, None) => None,
    };
    let summary = Summary {
        ns: &args.ns,
        read: &read,
        applied: &applied,
        seconds,
        failure: failure
            .as_ref()
            .map(|(_, line, message)| (*line, message.as_str())),
    };
    let text = if as_json {
        summary.json()
    } else {
        summary.text()
    };
    super::emit(out, text.as_bytes())?;
    match failure {
        None => Ok(0),
        Some((code, _, message)) => Err(Failure {
            code,
            message,
            reported_as_json: as_json,
        }),
    }
}

/// The exit code, the line to blame (0: none) and the message of a batch
/// the daemon refused.
fn send_failure(stop: &SendStop, imported: u64) -> (u8, u64, String) {
    let (first, last) = stop.batch_lines;
    // Exit 3 when the daemon refused, 2 when the client caught it first.
    let failure = Failure::from(clone_error(&stop.error));
    let what = match &stop.bad {
        Some(bad) => bad.to_string(),
        None => failure.message,
    };
    (
        failure.code,
        stop.bad.as_ref().map_or(0, |bad| bad.line),
        format!(
            "{what}; the batch of lines {first}-{last} was not applied ({imported} records \
             before it were); fix the cause and import again (records already imported are \
             simply written again)"
        ),
    )
}

/// [`ClientError`] is not `Clone` (it holds `io::Error`); a copy that keeps
/// what the exit code and message depend on.
fn clone_error(error: &ClientError) -> ClientError {
    match error {
        ClientError::Server(e) => ClientError::Server(e.clone()),
        ClientError::BadArgument(m) => ClientError::BadArgument(m.clone()),
        ClientError::UnexpectedResponse(m) => ClientError::UnexpectedResponse(m.clone()),
        ClientError::Io(e) => ClientError::Io(io::Error::new(e.kind(), e.to_string())),
        other => ClientError::UnexpectedResponse(other.to_string()),
    }
}

/// The end-of-import report.
struct Summary<'a> {
    ns: &'a NamespaceName,
    read: &'a ReadOutcome,
    applied: &'a Applied,
    seconds: f64,
    /// The line stopped at (0: none) and why.
    failure: Option<(u64, &'a str)>,
}

impl Summary<'_> {
    fn rate(&self) -> f64 {
        self.applied.records() as f64 / self.seconds.max(1e-9)
    }

    fn text(&self) -> String {
        let a = self.applied;
        let mut text = format!(
            "imported {} records into {} ({} cells, {} edges, {} programs) from {} lines in \
             {:.2} s: {:.0} records/s",
            a.records(),
            self.ns,
            a.cells,
            a.edges,
            a.programs,
            self.read.lines,
            self.seconds,
            self.rate()
        );
        if self.read.skipped_count > 0 {
            text.push_str(&format!("; {} bad lines skipped", self.read.skipped_count));
        }
        if self.failure.is_some() {
            text.push_str("; stopped early (see stderr)");
        }
        text.push('\n');
        text
    }

    fn json(&self) -> String {
        let a = self.applied;
        let skipped: Vec<Value> = self
            .read
            .skipped
            .iter()
            .map(|bad| json!({"line": bad.line, "reason": bad.reason}))
            .collect();
        // Keys in alphabetical order, as the summary has always had them.
        let mut fields: BTreeMap<&str, Value> = BTreeMap::from([
            ("ns", json!(self.ns.as_str())),
            ("ok", json!(self.failure.is_none())),
            ("lines", json!(self.read.lines)),
            ("records", json!(a.records())),
            ("cells", json!(a.cells)),
            ("edges", json!(a.edges)),
            ("programs", json!(a.programs)),
            ("batches", json!(a.batches)),
            ("first_lsn", json!(a.first_lsn)),
            ("skipped", json!(self.read.skipped_count)),
            ("skipped_lines", Value::Array(skipped)),
            ("seconds", json!(self.seconds)),
            ("records_per_second", json!(self.rate())),
        ]);
        if let Some((line, message)) = self.failure {
            fields.insert("stopped_at_line", json!((line > 0).then_some(line)));
            fields.insert("error", json!(message));
        }
        format!("{}\n", json::to_string(&fields))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn every_byte() -> Vec<u8> {
        (0..=255).collect()
    }

    fn parse_line(line: &str) -> BatchOp {
        parse_json_record(line.trim_end(), 1 << 20).unwrap()
    }

    #[test]
    fn json_lines_round_trip_exactly() {
        let mut out = String::new();
        for value in [
            every_byte(),
            b"plain".to_vec(),
            Vec::new(),
            "é\"\\\n".into(),
        ] {
            out.clear();
            cell_line(&mut out, Coord::new(-1, i32::MAX, i32::MIN), &value);
            assert_eq!(
                parse_line(&out),
                BatchOp::Put {
                    coord: Coord::new(-1, i32::MAX, i32::MIN),
                    value
                }
            );
        }
        for weight in [0.0, 1.0, 0.1 + 0.2, 1e-300, 5e-324, 1.7976931348623157e308] {
            out.clear();
            edge_line(
                &mut out,
                Coord::new(1, 2, 3),
                Coord::new(4, 5, 6),
                "r\"☃",
                weight,
            );
            let BatchOp::Link {
                weight: got, label, ..
            } = parse_line(&out)
            else {
                panic!("not a link: {out}")
            };
            assert_eq!(got.to_bits(), weight.to_bits(), "{out}");
            assert_eq!(label.as_str(), "r\"☃");
        }
        out.clear();
        program_line(&mut out, Coord::new(0, 0, 0), &every_byte());
        assert!(out.contains("source_base64"));
        assert_eq!(
            parse_line(&out),
            BatchOp::Prog {
                coord: Coord::new(0, 0, 0),
                source: every_byte()
            }
        );
    }

    #[test]
    fn bad_json_lines_say_what_is_wrong() {
        let bad = |line: &str| parse_json_record(line, 10).unwrap_err();
        assert!(bad("{").contains("EOF"), "{}", bad("{"));
        assert!(bad(r#"{"type":"cell","coord":[1,2]}"#).contains("3"));
        assert!(bad(r#"{"type":"cell","coord":[1,2,3]}"#).contains("missing \"value\""));
        assert!(
            bad(r#"{"type":"cell","coord":[1,2,3],"value":"a","value_base64":"YQ=="}"#)
                .contains("exactly one")
        );
        assert!(bad(r#"{"type":"cell","coord":[1,2,3],"value":"12345678901"}"#).contains("limit"));
        assert!(bad(r#"{"type":"cell","coord":[1,2,3],"value_base64":"!"}"#).contains("base64"));
        assert!(
            bad(r#"{"type":"cell","coord":[1,2,3],"value":"a","x":1}"#).contains("unknown field")
        );
        assert!(bad(r#"{"type":"blob"}"#).contains("unknown \"type\""));
        assert!(
            bad(r#"{"type":"edge","from":[0,0,0],"to":[1,0,0],"weight":-1}"#).contains("negative")
        );
        assert!(bad(r#"{"type":"cell","coord":[1,2,4294967296],"value":""}"#).contains("i32"));
        // Defaults: the empty label and weight 1, as `cubec link` has.
        assert_eq!(
            parse_json_record(r#"{"type":"edge","from":[0,0,0],"to":[1,0,0]}"#, 10).unwrap(),
            BatchOp::Link {
                from: Coord::new(0, 0, 0),
                to: Coord::new(1, 0, 0),
                label: EdgeLabel::default(),
                weight: 1.0
            }
        );
    }

    #[test]
    fn overlong_and_non_utf8_lines_are_bad_records_and_reading_goes_on() {
        let mut input = Vec::new();
        input.extend_from_slice(b"{\"type\":\"cell\",\"coord\":[0,0,0],\"value\":\"");
        input.extend(std::iter::repeat_n(b'a', 100));
        input.extend_from_slice(b"\"}\n\xff\xfe\n\n");
        input.extend_from_slice(b"{\"type\":\"cell\",\"coord\":[1,0,0],\"value\":\"ok\"}");
        let mut reader = RecordReader::new(Box::new(io::Cursor::new(input)), Format::Jsonl, 10, 64);
        let mut records = Vec::new();
        while let Some(record) = reader.next_record().unwrap() {
            records.push((record.line, record.parsed));
        }
        assert_eq!(records.len(), 4);
        assert!(records[0].1.as_ref().unwrap_err().contains("longer than"));
        assert!(records[1].1.as_ref().unwrap_err().contains("UTF-8"));
        assert_eq!(records[2], (3, Ok(None)));
        assert_eq!(records[3].0, 4);
        assert!(matches!(records[3].1, Ok(Some(BatchOp::Put { .. }))));
    }

    #[test]
    fn the_most_escaped_value_fits_a_record() {
        let value = vec![1u8; 1000];
        let mut line = String::new();
        cell_line(&mut line, Coord::new(i32::MIN, i32::MIN, i32::MIN), &value);
        assert!(
            line.len() <= max_record_bytes(value.len()),
            "{}",
            line.len()
        );
        assert_eq!(
            parse_json_record(line.trim_end(), value.len()).unwrap(),
            BatchOp::Put {
                coord: Coord::new(i32::MIN, i32::MIN, i32::MIN),
                value
            }
        );
    }

    #[test]
    fn server_reasons_lose_their_op_prefix() {
        let error = ClientError::Server(cube_client::ServerError::new(
            ErrorCode::ProgramSyntax,
            "op 3 (prog): program at 0,0,0: line 1: unexpected symbol; nothing was applied",
        ));
        assert_eq!(
            reason_of(&error),
            "program at 0,0,0: line 1: unexpected symbol; nothing was applied"
        );
        assert!(is_bad_record(&error));
        let down = ClientError::Server(cube_client::ServerError::new(
            ErrorCode::DiskFull,
            "disk full",
        ));
        assert!(!is_bad_record(&down));
    }
}
