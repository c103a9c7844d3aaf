//! Writing to stdout: a closed pipe is the reader being done, and the
//! shared JSON and text forms of coordinates and values.

use std::io::{self, Write};

use cube_client::{Coord, json};
use serde_json::{Value, json};

use crate::args::CellArgs;
use crate::failure::Failure;

pub(crate) fn output_failure(e: &io::Error) -> Failure {
    Failure::usage(format!(
        "cannot write to stdout: {e}; check where the output goes"
    ))
}

/// Writes `bytes` to stdout, treating a closed pipe as the reader being done.
pub(crate) fn emit(out: &mut impl Write, bytes: &[u8]) -> Result<(), Failure> {
    match out.write_all(bytes) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(output_failure(&e)),
        Ok(()) => Ok(()),
    }
}

pub(crate) fn emit_line(out: &mut impl Write, line: &str) -> Result<(), Failure> {
    emit(out, format!("{line}\n").as_bytes())
}

/// `{"ns":..,"coord":[x,y,z]}` followed by `more` (an object's fields).
pub(crate) fn cell_json(cell: &CellArgs, more: Value) -> String {
    let mut object = json!({"ns": cell.ns.as_str(), "coord": coord_json(cell.coord)});
    if let (Some(fields), Value::Object(more)) = (object.as_object_mut(), more) {
        fields.extend(more);
    }
    json::to_string(&object)
}

pub(crate) fn coord_json(c: Coord) -> Value {
    json!([c.x, c.y, c.z])
}

/// Appends `value` as one line of text: valid UTF-8 as is, except that the
/// backslash, tab, newline, carriage return and other control bytes
/// (`\xNN`), other control characters and the Unicode line and paragraph
/// separators (`\u{NNNN}`), and bytes that are not UTF-8 become escapes, so
/// every cell stays one line and nothing is lost.
pub(crate) fn escape_value(value: &[u8], out: &mut Vec<u8>) {
    for chunk in value.utf8_chunks() {
        for ch in chunk.valid().chars() {
            match ch {
                '\\' => out.extend_from_slice(b"\\\\"),
                '\t' => out.extend_from_slice(b"\\t"),
                '\n' => out.extend_from_slice(b"\\n"),
                '\r' => out.extend_from_slice(b"\\r"),
                c if c.is_control() && c.is_ascii() => {
                    out.extend_from_slice(format!("\\x{:02x}", c as u32).as_bytes());
                }
                // Other characters that tools treat as line breaks (NEL,
                // C1 controls, the line and paragraph separators).
                c if c.is_control() || c == '\u{2028}' || c == '\u{2029}' => {
                    out.extend_from_slice(format!("\\u{{{:x}}}", c as u32).as_bytes());
                }
                c => {
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
            }
        }
        for byte in chunk.invalid() {
            out.extend_from_slice(format!("\\x{byte:02x}").as_bytes());
        }
    }
}
