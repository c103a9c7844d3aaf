//! Helpers shared by the integration tests: read `--json` files with
//! serde_json, so the tests check their documented shape for real.

#![allow(dead_code)]

use cube_stress::json::Json;

/// Parses a JSON document; panics with serde_json's line and column on
/// malformed input.
pub fn parse_json(text: &str) -> Json {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}):\n{text}"))
}

/// `value[key]`, panicking with the key's name when absent.
pub fn field<'a>(value: &'a Json, key: &str) -> &'a Json {
    value
        .get(key)
        .unwrap_or_else(|| panic!("missing field {key:?} in {value:?}"))
}

pub fn int(value: &Json) -> u64 {
    value
        .as_u64()
        .unwrap_or_else(|| panic!("expected an integer, got {value:?}"))
}

pub fn number(value: &Json) -> f64 {
    value
        .as_f64()
        .unwrap_or_else(|| panic!("expected a number, got {value:?}"))
}

#[test]
fn the_reader_reads_what_the_writer_writes() {
    use cube_stress::json::{object, pretty};
    let value = object([
        (
            "a",
            Json::Array(vec![Json::from(1u64), Json::from(2.5), Json::Null]),
        ),
        ("b", Json::from("x\"\n\u{1}é")),
        ("c", object([("d", Json::Bool(false))])),
        ("e", Json::Array(vec![])),
        ("f", object(Vec::<(String, Json)>::new())),
    ]);
    let text = pretty(&value);
    assert_eq!(parse_json(&text), value);
    // Keys come back in the order they were written.
    let read = parse_json(&text);
    let keys: Vec<&String> = read
        .as_object()
        .map(|o| o.keys().collect())
        .unwrap_or_default();
    assert_eq!(keys, ["a", "b", "c", "e", "f"]);
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
