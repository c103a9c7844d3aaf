//! CSV cells for `cubec export --format csv` and `cubec import`: a header
//! `x,y,z,value`, then one record per cell. A value is its text, quoted
//! (RFC 4180: `""` for a quote) when it holds a comma, a quote, a CR or an
//! LF; a value that is not UTF-8, or whose text starts with `base64:`, is
//! written as `base64:` and its bytes in base64, so every value reads back
//! exactly.
//!
//! Records are written by the `csv` crate and read by its parser,
//! `csv-core`, in one pass over the input (the hand-written reader this
//! replaced rescanned a record from its start at each line break, so a
//! value of 100 000 line breaks took 10 s). `csv-core` parses into buffers
//! the caller sizes, so a record longer than any value could need is
//! refused without holding it whole, and reading goes on at the next one.

use std::io::{self, BufRead, BufReader, Read, Write};

use cube_client::{BatchOp, Coord, base64};

use super::{Record, check_sizes};

/// The fields of a CSV export's first line.
const HEADER: [&str; 4] = ["x", "y", "z", "value"];

/// The prefix of a CSV value that is base64-encoded bytes.
const BASE64_PREFIX: &str = "base64:";

/// Most fields a record may have before it is refused unread (it needs 4).
const MAX_FIELDS: usize = 64;

/// Writes cells as CSV records.
pub(super) struct CsvWriter<W: Write> {
    inner: csv::Writer<W>,
}

/// The I/O error a CSV write failed with (records of one length, written
/// to memory or a file, fail in no other way).
fn io_error(error: csv::Error) -> io::Error {
    match error.into_kind() {
        csv::ErrorKind::Io(error) => error,
        other => io::Error::other(format!("{other:?}")),
    }
}

impl<W: Write> CsvWriter<W> {
    pub(super) fn new(out: W) -> CsvWriter<W> {
        let inner = csv::WriterBuilder::new()
            .has_headers(false)
            .quote_style(csv::QuoteStyle::Necessary)
            .terminator(csv::Terminator::Any(b'\n'))
            .from_writer(out);
        CsvWriter { inner }
    }

    pub(super) fn header(&mut self) -> io::Result<()> {
        self.inner.write_record(HEADER).map_err(io_error)
    }

    /// The record of one cell.
    pub(super) fn cell(&mut self, coord: Coord, value: &[u8]) -> io::Result<()> {
        let encoded;
        let value: &[u8] = match std::str::from_utf8(value) {
            Ok(text) if !text.starts_with(BASE64_PREFIX) => value,
            _ => {
                encoded = format!("{BASE64_PREFIX}{}", base64::encode(value));
                encoded.as_bytes()
            }
        };
        let (x, y, z) = (
            coord.x.to_string(),
            coord.y.to_string(),
            coord.z.to_string(),
        );
        self.inner
            .write_record([x.as_bytes(), y.as_bytes(), z.as_bytes(), value])
            .map_err(io_error)
    }

    pub(super) fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Reads CSV records one at a time from a buffered input.
pub(super) struct CsvReader {
    parser: csv_core::Reader,
    /// The current record's fields, unquoted, back to back.
    fields: Vec<u8>,
    /// Where each field of `fields` ends.
    ends: Vec<usize>,
    /// The current record as it was in the input, for the quoting check
    /// and the length limit.
    raw: Vec<u8>,
    /// Line breaks consumed so far.
    newlines: u64,
    /// Whether the last byte consumed was a line feed (or nothing was).
    at_line_start: bool,
    /// Whether anything was read yet (a byte-order mark may come first).
    started: bool,
}

impl CsvReader {
    pub(super) fn new() -> CsvReader {
        CsvReader {
            // RFC 4180 records: CRLF, CR or LF ends one; `""` is a quote.
            parser: csv_core::ReaderBuilder::new().build(),
            fields: vec![0; 4096],
            ends: vec![0; 8],
            raw: Vec::new(),
            newlines: 0,
            at_line_start: true,
            started: false,
        }
    }

    /// Lines consumed so far (a last line without a line feed counts).
    pub(super) fn lines(&self) -> u64 {
        self.newlines + u64::from(!self.at_line_start)
    }

    fn consumed(&mut self, bytes: &[u8], total: &mut u64) {
        if let Some(last) = bytes.last() {
            self.newlines += bytes.iter().filter(|&&b| b == b'\n').count() as u64;
            self.at_line_start = *last == b'\n';
            *total += bytes.len() as u64;
        }
    }

    /// Skips a byte-order mark at the very start and the line breaks
    /// before a record; `false` at the end of the input.
    fn skip_to_record(
        &mut self,
        input: &mut BufReader<Box<dyn Read + Send>>,
        total: &mut u64,
    ) -> io::Result<bool> {
        loop {
            let available = input.fill_buf()?;
            if available.is_empty() {
                return Ok(false);
            }
            let mut skip = 0;
            if !self.started {
                self.started = true;
                if available.starts_with("\u{feff}".as_bytes()) {
                    skip = 3;
                }
            }
            let breaks = available[skip..]
                .iter()
                .take_while(|&&b| b == b'\n' || b == b'\r')
                .count();
            let at_record = skip + breaks < available.len();
            let skipped = available[..skip + breaks].to_vec();
            input.consume(skipped.len());
            self.consumed(&skipped, total);
            if at_record {
                return Ok(true);
            }
        }
    }

    /// The next record, or `None` at the end of the input. `total` counts
    /// the input bytes consumed.
    pub(super) fn next_record(
        &mut self,
        input: &mut BufReader<Box<dyn Read + Send>>,
        total: &mut u64,
        max_value_bytes: usize,
        max_record_bytes: usize,
    ) -> io::Result<Option<Record>> {
        if !self.skip_to_record(input, total)? {
            return Ok(None);
        }
        let line = self.newlines + 1;
        let read = self.read_fields(input, total, max_record_bytes)?;
        let parsed = if read.overlong {
            Err(format!(
                "the record is longer than {max_record_bytes} bytes, more than any value the \
                 server takes (max_value_bytes) could need"
            ))
        } else if read.too_many_fields {
            Err(format!(
                "more than {MAX_FIELDS} fields; a record is x,y,z,value (quote a value that \
                 holds a comma)"
            ))
        } else if let Some(why) = quoting_error(&self.raw) {
            Err(why)
        } else {
            let mut fields = Vec::with_capacity(read.ends);
            let mut start = 0;
            for &end in &self.ends[..read.ends] {
                fields.push(&self.fields[start..end]);
                start = end;
            }
            parse_fields(&fields, max_value_bytes, line == 1)
        };
        Ok(Some(Record { line, parsed }))
    }

    /// Reads one record's fields into `self.fields` and their ends into
    /// `self.ends`, and its raw bytes into `self.raw` (up to
    /// `max_record_bytes`), growing the buffers as far as the limits allow.
    fn read_fields(
        &mut self,
        input: &mut BufReader<Box<dyn Read + Send>>,
        total: &mut u64,
        max_record_bytes: usize,
    ) -> io::Result<FieldsRead> {
        self.raw.clear();
        let (mut out, mut ends) = (0usize, 0usize);
        let (mut overlong, mut too_many_fields) = (false, false);
        loop {
            let available = input.fill_buf()?;
            let (result, read, written, ended) =
                self.parser
                    .read_record(available, &mut self.fields[out..], &mut self.ends[ends..]);
            let taken = &available[..read];
            if self.raw.len() + taken.len() > max_record_bytes {
                overlong = true;
            } else {
                self.raw.extend_from_slice(taken);
            }
            let taken = taken.to_vec();
            input.consume(read);
            self.consumed(&taken, total);
            out += written;
            ends += ended;
            match result {
                csv_core::ReadRecordResult::InputEmpty => {}
                csv_core::ReadRecordResult::OutputFull if self.fields.len() < max_record_bytes => {
                    let grown = (2 * self.fields.len()).min(max_record_bytes);
                    self.fields.resize(grown, 0);
                }
                csv_core::ReadRecordResult::OutputFull => {
                    // Already too long: read on to its end, keeping nothing.
                    overlong = true;
                    (out, ends) = (0, 0);
                }
                csv_core::ReadRecordResult::OutputEndsFull if self.ends.len() < MAX_FIELDS => {
                    let grown = 2 * self.ends.len();
                    self.ends.resize(grown, 0);
                }
                csv_core::ReadRecordResult::OutputEndsFull => {
                    too_many_fields = true;
                    (out, ends) = (0, 0);
                }
                csv_core::ReadRecordResult::Record | csv_core::ReadRecordResult::End => break,
            }
        }
        Ok(FieldsRead {
            ends,
            overlong,
            too_many_fields,
        })
    }
}

/// What reading a record's fields found.
struct FieldsRead {
    /// How many field ends `self.ends` holds.
    ends: usize,
    /// The record ran past `max_record_bytes`: nothing of it was kept.
    overlong: bool,
    /// The record has more than `MAX_FIELDS` fields.
    too_many_fields: bool,
}

/// Where a record's quoting breaks RFC 4180 in a way `csv-core` would read
/// past (it takes `"a"b` as `ab` and an unclosed quote as running to the
/// end of the input): text after a closing quote, or a quote left open. A
/// quote opens a field only at its start; elsewhere it is text.
fn quoting_error(raw: &[u8]) -> Option<String> {
    #[derive(Clone, Copy, PartialEq)]
    enum At {
        FieldStart,
        Unquoted,
        Quoted,
        AfterQuote,
    }
    let mut at = At::FieldStart;
    for &b in raw {
        at = match (at, b) {
            (At::FieldStart, b'"') | (At::AfterQuote, b'"') => At::Quoted,
            (At::Quoted, b'"') => At::AfterQuote,
            (At::Quoted, _) => At::Quoted,
            (_, b',' | b'\r' | b'\n') => At::FieldStart,
            (At::AfterQuote, other) => {
                return Some(format!(
                    "{:?} after a closing quote; a quoted field must end at a comma",
                    char::from(other)
                ));
            }
            (At::FieldStart | At::Unquoted, _) => At::Unquoted,
        };
    }
    (at == At::Quoted).then(|| "a quoted field is not closed".to_owned())
}

/// One record's fields as a cell; `None` for the header (on line 1) and a
/// line of blanks.
fn parse_fields(
    fields: &[&[u8]],
    max_value_bytes: usize,
    first: bool,
) -> Result<Option<BatchOp>, String> {
    let text = |field: &[u8]| String::from_utf8_lossy(field).into_owned();
    if let [only] = fields
        && only.iter().all(u8::is_ascii_whitespace)
    {
        return Ok(None);
    }
    if first
        && fields
            .first()
            .is_some_and(|f| text(f).trim().eq_ignore_ascii_case("x"))
    {
        return Ok(None);
    }
    let [x, y, z, value] = fields else {
        return Err(format!(
            "{} fields; a record is x,y,z,value (quote a value that holds a comma)",
            fields.len()
        ));
    };
    let axis = |name: &str, field: &[u8]| {
        std::str::from_utf8(field)
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok())
            .ok_or_else(|| format!("{name} = {:?} is not a 32-bit integer", text(field)))
    };
    let coord = Coord::new(axis("x", x)?, axis("y", y)?, axis("z", z)?);
    let value = match std::str::from_utf8(value) {
        Err(e) => {
            return Err(format!(
                "the value is not UTF-8 ({e}); write bytes as {BASE64_PREFIX} and their base64"
            ));
        }
        Ok(text) => match text.strip_prefix(BASE64_PREFIX) {
            Some(encoded) => base64::decode(encoded)
                .ok_or_else(|| "the value after \"base64:\" is not valid base64".to_owned())?,
            None => value.to_vec(),
        },
    };
    let op = BatchOp::Put { coord, value };
    check_sizes(&op, max_value_bytes)?;
    Ok(Some(op))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::{Duration, Instant};

    use super::*;

    fn reader_of(bytes: Vec<u8>) -> BufReader<Box<dyn Read + Send>> {
        BufReader::new(Box::new(io::Cursor::new(bytes)))
    }

    /// Every record of `input`: its line and what it parsed to.
    fn read_all(input: &[u8], max_value_bytes: usize) -> Vec<Record> {
        let mut input = reader_of(input.to_vec());
        let mut reader = CsvReader::new();
        let mut total = 0;
        let mut records = Vec::new();
        while let Some(record) = reader
            .next_record(&mut input, &mut total, max_value_bytes, 6 * max_value_bytes)
            .unwrap()
        {
            records.push(record);
        }
        records
    }

    fn one(record: &str) -> Result<Option<BatchOp>, String> {
        let mut records = read_all(format!("x,y,z,value\n{record}").as_bytes(), 10);
        assert_eq!(records.len(), 2, "{record:?}");
        records.pop().unwrap().parsed
    }

    fn every_byte() -> Vec<u8> {
        (0..=255).collect()
    }

    #[test]
    fn csv_round_trips_text_quotes_line_breaks_and_bytes() {
        let values: Vec<Vec<u8>> = vec![
            b"plain".to_vec(),
            b"a,b".to_vec(),
            b"say \"hi\"".to_vec(),
            b"two\nlines\r\n".to_vec(),
            b"base64:looks encoded".to_vec(),
            every_byte(),
            Vec::new(),
            b" spaced ".to_vec(),
            b"\rcarriage".to_vec(),
        ];
        let mut text = Vec::new();
        let mut writer = CsvWriter::new(&mut text);
        writer.header().unwrap();
        for (i, value) in values.iter().enumerate() {
            writer.cell(Coord::new(i as i32, -1, 2), value).unwrap();
        }
        writer.flush().unwrap();
        drop(writer);
        assert!(text.starts_with(b"x,y,z,value\n"));
        let records = read_all(&text, 1 << 20);
        let mut got = Vec::new();
        let mut lines = Vec::new();
        for record in records {
            if let Some(op) = record.parsed.unwrap() {
                got.push(op);
                lines.push(record.line);
            }
        }
        let expected: Vec<BatchOp> = values
            .iter()
            .enumerate()
            .map(|(i, value)| BatchOp::Put {
                coord: Coord::new(i as i32, -1, 2),
                value: value.clone(),
            })
            .collect();
        assert_eq!(got, expected);
        // The value with two line breaks spans lines 5-7, so the next
        // record starts on line 8.
        assert_eq!(lines, vec![2, 3, 4, 5, 8, 9, 10, 11, 12]);
    }

    #[test]
    fn bad_csv_records_say_what_is_wrong() {
        let bad = |record: &str| one(record).unwrap_err();
        assert!(bad("1,2,3").contains("3 fields"));
        assert!(bad("1,2,x,v").contains("z = \"x\""));
        assert!(bad("1,2,3,\"v\"x").contains("closing quote"));
        assert!(bad("1,2,3,\"v").contains("not closed"));
        assert!(bad("1,2,3,base64:!!").contains("base64"));
        assert!(bad("1,2,3,01234567890").contains("limit"));
        let many = read_all(",".repeat(100).as_bytes(), 1000);
        let many = many[0].parsed.as_ref().unwrap_err();
        assert!(many.contains("more than 64 fields"), "{many}");
        assert_eq!(one("  ").unwrap(), None);
        assert_eq!(
            one(" 1, -2 ,3,v").unwrap(),
            Some(BatchOp::Put {
                coord: Coord::new(1, -2, 3),
                value: b"v".to_vec()
            })
        );
        // A quote inside an unquoted field is text.
        assert_eq!(
            one("1,2,3,5\"").unwrap(),
            Some(BatchOp::Put {
                coord: Coord::new(1, 2, 3),
                value: b"5\"".to_vec()
            })
        );
    }

    #[test]
    fn overlong_and_non_utf8_records_are_bad_and_reading_goes_on() {
        let mut input = b"\xef\xbb\xbfx,y,z,value\r\n0,0,0,\"".to_vec();
        input.extend(std::iter::repeat_n(b'\n', 100));
        input.extend_from_slice(b"\"\n1,0,0,\xff\n\n\n2,0,0,ok");
        let records = read_all(&input, 10);
        let summary: Vec<(u64, bool)> =
            records.iter().map(|r| (r.line, r.parsed.is_ok())).collect();
        assert_eq!(summary, [(1, true), (2, false), (103, false), (106, true)]);
        assert!(
            records[1]
                .parsed
                .as_ref()
                .unwrap_err()
                .contains("longer than 60")
        );
        assert!(records[2].parsed.as_ref().unwrap_err().contains("UTF-8"));
        assert_eq!(
            records[0].parsed,
            Ok(None),
            "the header, after a byte-order mark"
        );
    }

    /// Issue 37: the reader rescanned a record at each of its line
    /// breaks, so 100 000 of them in one value took 10 s. The bound only
    /// catches a hang; the speed is `cubec import`'s to measure.
    #[test]
    fn a_value_of_a_hundred_thousand_line_breaks_reads_in_one_pass() {
        let value = "\n".repeat(100_000).into_bytes();
        let mut text = Vec::new();
        let mut writer = CsvWriter::new(&mut text);
        writer.header().unwrap();
        writer.cell(Coord::new(1, 2, 3), &value).unwrap();
        writer.flush().unwrap();
        drop(writer);
        let started = Instant::now();
        let mut records = read_all(&text, 1 << 20);
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(records.len(), 2);
        assert_eq!(
            records.pop().unwrap().parsed,
            Ok(Some(BatchOp::Put {
                coord: Coord::new(1, 2, 3),
                value
            }))
        );
    }
}
