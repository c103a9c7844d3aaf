//! Helpers shared by the integration tests: a small JSON reader, so the
//! tests check the documented shape of `--json` files for real.

#![allow(dead_code)]

use cube_stress::json::Json;

/// Parses a JSON document; panics with the position on malformed input.
pub fn parse_json(text: &str) -> Json {
    let mut parser = Parser {
        bytes: text.as_bytes(),
        at: 0,
    };
    let value = parser.value();
    parser.skip_space();
    assert_eq!(
        parser.at,
        parser.bytes.len(),
        "trailing text after the JSON value"
    );
    value
}

struct Parser<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn skip_space(&mut self) {
        while self.at < self.bytes.len() && self.bytes[self.at].is_ascii_whitespace() {
            self.at += 1;
        }
    }

    fn expect(&mut self, byte: u8) {
        self.skip_space();
        assert_eq!(
            self.bytes.get(self.at),
            Some(&byte),
            "expected {:?} at byte {}",
            byte as char,
            self.at
        );
        self.at += 1;
    }

    fn peek(&mut self) -> u8 {
        self.skip_space();
        *self
            .bytes
            .get(self.at)
            .unwrap_or_else(|| panic!("unexpected end at {}", self.at))
    }

    fn value(&mut self) -> Json {
        match self.peek() {
            b'{' => {
                self.expect(b'{');
                let mut fields = Vec::new();
                if self.peek() == b'}' {
                    self.at += 1;
                    return Json::Object(fields);
                }
                loop {
                    let Json::Str(key) = self.string() else {
                        unreachable!()
                    };
                    self.expect(b':');
                    fields.push((key, self.value()));
                    match self.peek() {
                        b',' => self.at += 1,
                        b'}' => {
                            self.at += 1;
                            return Json::Object(fields);
                        }
                        other => panic!("unexpected {:?} at {}", other as char, self.at),
                    }
                }
            }
            b'[' => {
                self.expect(b'[');
                let mut items = Vec::new();
                if self.peek() == b']' {
                    self.at += 1;
                    return Json::Array(items);
                }
                loop {
                    items.push(self.value());
                    match self.peek() {
                        b',' => self.at += 1,
                        b']' => {
                            self.at += 1;
                            return Json::Array(items);
                        }
                        other => panic!("unexpected {:?} at {}", other as char, self.at),
                    }
                }
            }
            b'"' => self.string(),
            b't' => self.word("true", Json::Bool(true)),
            b'f' => self.word("false", Json::Bool(false)),
            b'n' => self.word("null", Json::Null),
            _ => self.number(),
        }
    }

    fn word(&mut self, word: &str, value: Json) -> Json {
        assert!(
            self.bytes[self.at..].starts_with(word.as_bytes()),
            "bad literal at {}",
            self.at
        );
        self.at += word.len();
        value
    }

    fn string(&mut self) -> Json {
        self.expect(b'"');
        let mut out = String::new();
        loop {
            let rest = std::str::from_utf8(&self.bytes[self.at..]).unwrap();
            let c = rest.chars().next().expect("unterminated string");
            self.at += c.len_utf8();
            match c {
                '"' => return Json::Str(out),
                '\\' => {
                    let escape = self.bytes[self.at] as char;
                    self.at += 1;
                    match escape {
                        'n' => out.push('\n'),
                        't' => out.push('\t'),
                        'r' => out.push('\r'),
                        'b' => out.push('\u{8}'),
                        'f' => out.push('\u{c}'),
                        'u' => {
                            let hex =
                                std::str::from_utf8(&self.bytes[self.at..self.at + 4]).unwrap();
                            self.at += 4;
                            out.push(
                                char::from_u32(u32::from_str_radix(hex, 16).unwrap()).unwrap(),
                            );
                        }
                        other => out.push(other),
                    }
                }
                c => out.push(c),
            }
        }
    }

    fn number(&mut self) -> Json {
        let start = self.at;
        while self.at < self.bytes.len()
            && matches!(
                self.bytes[self.at],
                b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'
            )
        {
            self.at += 1;
        }
        let text = std::str::from_utf8(&self.bytes[start..self.at]).unwrap();
        assert!(!text.is_empty(), "expected a value at {start}");
        if text.contains(['.', 'e', 'E']) {
            Json::Float(text.parse().unwrap())
        } else {
            Json::Int(text.parse().unwrap())
        }
    }
}

/// `value[key]`, panicking with the key's name when absent.
pub fn field<'a>(value: &'a Json, key: &str) -> &'a Json {
    value
        .get(key)
        .unwrap_or_else(|| panic!("missing field {key:?} in {value:?}"))
}

pub fn int(value: &Json) -> u64 {
    match value {
        Json::Int(n) => *n,
        other => panic!("expected an integer, got {other:?}"),
    }
}

pub fn number(value: &Json) -> f64 {
    match value {
        Json::Int(n) => *n as f64,
        Json::Float(x) => *x,
        other => panic!("expected a number, got {other:?}"),
    }
}

#[test]
fn the_reader_reads_what_the_writer_writes() {
    let value = Json::object([
        (
            "a",
            Json::Array(vec![Json::Int(1), Json::Float(2.5), Json::Null]),
        ),
        ("b", Json::str("x\"\n\u{1}é")),
        ("c", Json::object([("d", Json::Bool(false))])),
        ("e", Json::Array(vec![])),
        ("f", Json::object(Vec::<(String, Json)>::new())),
    ]);
    assert_eq!(parse_json(&value.pretty()), value);
}

/// The stdout and stderr of a `cube-stress` run that must have succeeded;
/// both are shown when it did not.
pub fn succeeded(output: &std::process::Output) -> (String, String) {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        output.status.success(),
        "cube-stress failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    (stdout, stderr)
}
