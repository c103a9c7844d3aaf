//! JSON lines for `cubec export` and `cubec import`: one object per line,
//! a `"type"` and its fields, written and parsed with serde.

use std::borrow::Cow;

use cube_client::{BatchOp, Coord, EdgeLabel, EdgeWeight, base64, json};
use serde::{Deserialize, Serialize};

use super::check_sizes;

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

pub(super) fn cell_line(out: &mut String, coord: Coord, value: &[u8]) {
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

pub(super) fn edge_line(out: &mut String, from: Coord, to: Coord, label: &str, weight: f64) {
    let line = EdgeLine {
        kind: "edge",
        from: xyz(from),
        to: xyz(to),
        label,
        weight,
    };
    push_line(out, &line);
}

pub(super) fn program_line(out: &mut String, coord: Coord, source: &[u8]) {
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
pub(super) fn parse_json_record(text: &str, max_value_bytes: usize) -> Result<BatchOp, String> {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::transfer::max_record_bytes;

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
}
