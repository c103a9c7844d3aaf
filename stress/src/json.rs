//! The reports' JSON: `serde_json` values whose objects keep their keys in
//! the order they were inserted (the workspace enables `preserve_order`), so
//! a report reads top-down the way docs/benchmarks.md shows it.

pub use serde_json::Value as Json;

/// An object from `(key, value)` pairs, in that order.
pub fn object<K: Into<String>>(fields: impl IntoIterator<Item = (K, Json)>) -> Json {
    Json::Object(fields.into_iter().map(|(k, v)| (k.into(), v)).collect())
}

/// Indented with two spaces, with a final newline.
pub fn pretty(value: &Json) -> String {
    // Serializing a `Value` cannot fail: its keys are strings and its
    // numbers finite (`Value::from` turns NaN and infinities into null).
    let mut out = serde_json::to_string_pretty(value).unwrap_or_default();
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pretty_prints_nested_values_in_order() {
        let value = object([
            ("b", Json::from(2u64)),
            ("a", Json::from(0.5)),
            ("s", Json::from("q\"x")),
            ("n", Json::Null),
            ("t", Json::Bool(true)),
            ("e", Json::Array(vec![])),
            (
                "o",
                object([(
                    "x",
                    Json::Array(vec![Json::from(1u64), Json::from(f64::NAN)]),
                )]),
            ),
        ]);
        let expected = r#"{
  "b": 2,
  "a": 0.5,
  "s": "q\"x",
  "n": null,
  "t": true,
  "e": [],
  "o": {
    "x": [
      1,
      null
    ]
  }
}
"#;
        assert_eq!(pretty(&value), expected);
        assert_eq!(value.get("b"), Some(&Json::from(2u64)));
        assert_eq!(value.get("zz"), None);
    }
}
