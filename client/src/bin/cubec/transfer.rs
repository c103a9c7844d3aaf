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
//!
//! One module per job: `export.rs` and `import.rs`, and the two formats,
//! `jsonl.rs` and `csv.rs`; this file holds what they share.

use clap::ValueEnum;
use cube_client::{BatchOp, MAX_PROGRAM_BYTES};

#[path = "transfer/csv.rs"]
mod csv;
#[path = "transfer/export.rs"]
mod export;
#[path = "transfer/import.rs"]
mod import;
#[path = "transfer/jsonl.rs"]
mod jsonl;

pub(crate) use export::{EXPORT_HELP, ExportArgs, export};
pub(crate) use import::{IMPORT_HELP, ImportArgs, import};

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

/// Whether a parsed operation fits the server's value and program limits
/// (checked before sending, so the record is reported by its line).
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
