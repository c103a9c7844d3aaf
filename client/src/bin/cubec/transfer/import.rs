//! `cubec import`: a file written by export into a namespace, in atomic
//! batches. Records are read on one thread and sent in batches on another,
//! so parsing overlaps the daemon's work.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, IsTerminal, Read, Write};
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread;
use std::time::{Duration, Instant};

use clap::Args;
use cube_client::{
    BatchOp, Client, ClientError, ErrorCode, Limits, MAX_BATCH_BYTES, MAX_BATCH_OPS, NamespaceName,
    failed_op_index, json,
};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};

use crate::{EXIT_USAGE, Failure, parse_namespace_arg};

use super::csv::CsvReader;
use super::jsonl::parse_json_record;
use super::{Format, Record, max_record_bytes};

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
    let format = input_format(args);
    let (input, size) = open_input(&args.file)?;
    let progress = Progress {
        bar: progress_bar(size),
        started: Instant::now(),
    };
    let (rx, reading) = start_reading(args, client.limits(), format, input, &progress)?;
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
    let failure = what_failed(&sent, &read, &applied, args);
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
    crate::emit(out, text.as_bytes())?;
    match failure {
        None => Ok(0),
        Some((code, _, message)) => Err(Failure {
            code,
            message,
            reported_as_json: as_json,
        }),
    }
}

/// Starts the thread that reads `input` and cuts its records into
/// batches the server's limits allow; the batches come on the receiver.
fn start_reading(
    args: &ImportArgs,
    limits: Limits,
    format: Format,
    input: Box<dyn Read + Send>,
    progress: &Progress,
) -> Result<(Receiver<Batch>, thread::JoinHandle<ReadOutcome>), Failure> {
    let max_value_bytes = limits.max_value_bytes as usize;
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
    Ok((rx, reading))
}

/// `--format`, or else the file's extension: `.csv` is CSV, anything else
/// JSON lines.
fn input_format(args: &ImportArgs) -> Format {
    args.format.unwrap_or_else(|| {
        let csv = args
            .file
            .extension()
            .is_some_and(|ext| ext.eq_ignore_ascii_case("csv"));
        if csv { Format::Csv } else { Format::Jsonl }
    })
}

/// What went wrong, if anything, as (exit code, line, message): the
/// sender's stop comes first (the reader may have read past it), then a
/// bad record, then the input.
fn what_failed(
    sent: &Result<(), SendStop>,
    read: &ReadOutcome,
    applied: &Applied,
    args: &ImportArgs,
) -> Option<(u8, u64, String)> {
    match (sent, &read.stopped_at, &read.read_error) {
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
