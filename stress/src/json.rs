//! A JSON value tree and a pretty printer: the reports are a few small
//! objects, so no serialization framework. Object keys keep their order.

use cube_client::json::{float, push_string};

#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Int(u64),
    Float(f64),
    Str(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Json {
    /// An object from `(key, value)` pairs.
    pub fn object<K: Into<String>>(fields: impl IntoIterator<Item = (K, Json)>) -> Json {
        Json::Object(fields.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }

    pub fn str(text: impl Into<String>) -> Json {
        Json::Str(text.into())
    }

    /// Indented with two spaces, with a final newline.
    pub fn pretty(&self) -> String {
        let mut out = String::new();
        self.write(&mut out, 0);
        out.push('\n');
        out
    }

    /// The value at `key` of an object.
    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Object(fields) => fields.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    fn write(&self, out: &mut String, depth: usize) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Int(n) => out.push_str(&n.to_string()),
            Json::Float(x) => out.push_str(&float(*x)),
            Json::Str(s) => push_string(out, s),
            Json::Array(items) if items.is_empty() => out.push_str("[]"),
            Json::Object(fields) if fields.is_empty() => out.push_str("{}"),
            Json::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    out.push_str(if i == 0 { "\n" } else { ",\n" });
                    indent(out, depth + 1);
                    item.write(out, depth + 1);
                }
                out.push('\n');
                indent(out, depth);
                out.push(']');
            }
            Json::Object(fields) => {
                out.push('{');
                for (i, (key, value)) in fields.iter().enumerate() {
                    out.push_str(if i == 0 { "\n" } else { ",\n" });
                    indent(out, depth + 1);
                    push_string(out, key);
                    out.push_str(": ");
                    value.write(out, depth + 1);
                }
                out.push('\n');
                indent(out, depth);
                out.push('}');
            }
        }
    }
}

fn indent(out: &mut String, depth: usize) {
    for _ in 0..depth {
        out.push_str("  ");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pretty_prints_nested_values_in_order() {
        let value = Json::object([
            ("b", Json::Int(2)),
            ("a", Json::Float(0.5)),
            ("s", Json::str("q\"x")),
            ("n", Json::Null),
            ("t", Json::Bool(true)),
            ("e", Json::Array(vec![])),
            (
                "o",
                Json::object([("x", Json::Array(vec![Json::Int(1), Json::Float(f64::NAN)]))]),
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
        assert_eq!(value.pretty(), expected);
        assert_eq!(value.get("b"), Some(&Json::Int(2)));
        assert_eq!(value.get("zz"), None);
    }
}
