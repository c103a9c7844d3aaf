//! JSON for `cubec --json` and `cubec export`, written by serde_json.
//!
//! One addition to serde_json's escaping: DEL, U+2028 and U+2029 are legal
//! raw in JSON but invisible in a terminal (and the last two are not legal
//! in JavaScript source), so they are written as `\uXXXX` too.

use std::io;

use serde::Serialize;
use serde_json::ser::{Formatter, Serializer};

/// `value` as compact JSON (no spaces), with the escaping above.
pub fn to_string<T: Serialize + ?Sized>(value: &T) -> String {
    let mut out = Vec::new();
    let mut serializer = Serializer::with_formatter(&mut out, TerminalSafe);
    // Serializing into a Vec fails only for maps with non-string keys,
    // which no caller builds; an empty string would show up in tests.
    if value.serialize(&mut serializer).is_err() {
        return String::new();
    }
    // serde_json writes UTF-8 only.
    String::from_utf8(out).unwrap_or_default()
}

/// serde_json's compact output, with DEL, U+2028 and U+2029 escaped.
struct TerminalSafe;

impl Formatter for TerminalSafe {
    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let mut rest = fragment;
        while let Some(at) = rest.find(['\u{7f}', '\u{2028}', '\u{2029}']) {
            writer.write_all(&rest.as_bytes()[..at])?;
            let c = rest[at..].chars().next().unwrap_or_default();
            write!(writer, "\\u{:04x}", u32::from(c))?;
            rest = &rest[at + c.len_utf8()..];
        }
        writer.write_all(rest.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn string(text: &str) -> String {
        to_string(text)
    }

    #[test]
    fn escapes_quotes_backslashes_and_controls() {
        assert_eq!(string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(string("line\nnext\ttab\r"), r#""line\nnext\ttab\r""#);
        assert_eq!(string("\u{0}\u{1f}\u{7f}"), r#""\u0000\u001f\u007f""#);
        assert_eq!(string("\u{08}\u{0c}"), r#""\b\f""#);
        assert_eq!(string("\u{2028}x\u{2029}"), r#""\u2028x\u2029""#);
    }

    #[test]
    fn keeps_unicode_as_is() {
        assert_eq!(string("héllo ☃ 𝄞"), "\"héllo ☃ 𝄞\"");
        assert_eq!(string(""), "\"\"");
    }

    #[test]
    fn objects_are_compact_and_keep_key_order() {
        let value = serde_json::json!({"b": 1, "a": [1.0, null], "s": "\u{7f}"});
        assert_eq!(to_string(&value), r#"{"b":1,"a":[1.0,null],"s":"\u007f"}"#);
    }

    #[test]
    fn floats_are_valid_json_numbers() {
        // Whole numbers keep a `.0`, so a float never reads back as an
        // integer; JSON has no NaN or infinity.
        assert_eq!(to_string(&1.0), "1.0");
        assert_eq!(to_string(&0.25), "0.25");
        assert_eq!(to_string(&-3.5), "-3.5");
        assert_eq!(to_string(&f64::NAN), "null");
        assert_eq!(to_string(&f64::INFINITY), "null");
        let huge = to_string(&1e300);
        assert_eq!(huge.parse::<f64>().ok(), Some(1e300), "{huge}");
        assert_eq!(to_string(&None::<&str>), "null");
        assert_eq!(to_string(&Some("x")), "\"x\"");
    }
}
