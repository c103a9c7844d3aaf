//! Just enough JSON writing for `cubec --json`: strings, numbers, null.
//!
//! Hand-written because the output is a handful of flat objects and the
//! workspace keeps its dependency list short.

use std::fmt::Write as _;

/// `text` as a quoted JSON string.
pub fn string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    push_string(&mut out, text);
    out
}

/// Appends `text` as a quoted JSON string.
pub fn push_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            // Legal raw in JSON but not in JavaScript source, and invisible
            // in a terminal either way.
            c if c < ' ' || c == '\u{7f}' || c == '\u{2028}' || c == '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A JSON number, or `null` for NaN and infinities, which JSON cannot hold.
pub fn float(value: f64) -> String {
    if value.is_finite() {
        // Debug keeps a `.0` on whole numbers, so a float never reads back
        // as an integer, and never uses exponents JSON would reject.
        format!("{value:?}")
    } else {
        "null".to_owned()
    }
}

/// `Some(text)` as a JSON string, `None` as `null`.
pub fn string_or_null(text: Option<&str>) -> String {
    text.map_or_else(|| "null".to_owned(), string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_quotes_backslashes_and_controls() {
        assert_eq!(string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(string("line\nnext\ttab\r"), r#""line\nnext\ttab\r""#);
        assert_eq!(string("\u{0}\u{1f}\u{7f}"), r#""\u0000\u001f\u007f""#);
        assert_eq!(string("\u{08}\u{0c}"), r#""\b\f""#);
        assert_eq!(string("\u{2028}"), r#""\u2028""#);
    }

    #[test]
    fn keeps_unicode_as_is() {
        assert_eq!(string("héllo ☃ 𝄞"), "\"héllo ☃ 𝄞\"");
        assert_eq!(string(""), "\"\"");
    }

    #[test]
    fn floats_are_valid_json_numbers() {
        assert_eq!(float(1.0), "1.0");
        assert_eq!(float(0.25), "0.25");
        assert_eq!(float(-3.5), "-3.5");
        assert_eq!(float(f64::NAN), "null");
        assert_eq!(float(f64::INFINITY), "null");
        let huge = float(1e300);
        assert!(
            huge.chars()
                .all(|c| c.is_ascii_digit() || c == '.' || c == 'e'),
            "{huge}"
        );
        assert_eq!(string_or_null(None), "null");
        assert_eq!(string_or_null(Some("x")), "\"x\"");
    }
}
