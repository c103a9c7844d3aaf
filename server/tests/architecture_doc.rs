//! Keeps docs/ARCHITECTURE.md true where it can drift without anyone
//! noticing: the crate dependency table, the `unsafe` allow-list, the limits
//! table, and every path and type name the codemap mentions.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// Directories of ours whose Rust sources the checks read.
const SOURCE_DIRS: [&str; 7] = [
    "protocol", "store", "server", "client", "stress", "metrics", "fuzz",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn doc() -> String {
    fs::read_to_string(root().join("docs/ARCHITECTURE.md")).unwrap()
}

/// The lines of the `## title` section.
fn section(doc: &str, title: &str) -> Vec<String> {
    let heading = format!("## {title}");
    let mut lines = doc.lines().skip_while(|l| l.trim() != heading).skip(1);
    let mut out = Vec::new();
    for line in lines.by_ref() {
        if line.starts_with("## ") {
            break;
        }
        out.push(line.to_owned());
    }
    assert!(
        !out.is_empty(),
        "docs/ARCHITECTURE.md has no section '{heading}'"
    );
    out
}

/// The body rows of the first Markdown table in `lines`, cells trimmed.
fn table_rows(lines: &[String]) -> Vec<Vec<String>> {
    lines
        .iter()
        .filter(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_owned())
                .collect()
        })
        .collect()
}

/// The text between each pair of backticks.
fn backticked(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                rust_files(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

fn all_sources() -> Vec<(String, String)> {
    let root = root();
    let mut files = Vec::new();
    for dir in SOURCE_DIRS {
        rust_files(&root.join(dir), &mut files);
    }
    files
        .into_iter()
        .map(|path| {
            let relative = path
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (relative, fs::read_to_string(&path).unwrap())
        })
        .collect()
}

/// The `cube-*` crates a manifest's `[dependencies]` table names.
fn our_dependencies(manifest: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut in_dependencies = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_dependencies = line == "[dependencies]";
        } else if in_dependencies && line.starts_with("cube-") {
            let name = line.split(['.', ' ', '=']).next().unwrap();
            out.insert(name.to_owned());
        }
    }
    out
}

#[test]
fn crate_table_matches_the_manifests() {
    let rows = table_rows(&section(&doc(), "Crates"));
    let mut dirs_in_doc = BTreeSet::new();
    for row in &rows {
        let name = row[0].trim_matches('`');
        let dir = row[1].trim_matches('`').trim_end_matches('/');
        dirs_in_doc.insert(dir.to_owned());
        let manifest = fs::read_to_string(root().join(dir).join("Cargo.toml"))
            .unwrap_or_else(|e| panic!("crate table names {dir}/, which has no Cargo.toml: {e}"));
        assert!(
            manifest.contains(&format!("name = \"{name}\"")),
            "{dir}/Cargo.toml is not the crate {name}"
        );
        let documented: BTreeSet<String> = if row[3] == "nothing of ours" {
            BTreeSet::new()
        } else {
            row[3]
                .split(',')
                .map(|d| format!("cube-{}", d.trim()))
                .collect()
        };
        assert_eq!(
            our_dependencies(&manifest),
            documented,
            "the crate table's 'may depend on' for {name} differs from {dir}/Cargo.toml"
        );
    }
    for dir in SOURCE_DIRS {
        assert!(
            dirs_in_doc.contains(dir),
            "the crate table leaves out {dir}/"
        );
    }
}

#[test]
fn unsafe_allow_list_matches_the_code() {
    let rows = table_rows(&section(&doc(), "`unsafe`"));
    let documented: BTreeSet<String> = rows
        .iter()
        .map(|r| r[0].trim_matches('`').to_owned())
        .collect();
    let actual: BTreeSet<String> = all_sources()
        .into_iter()
        .filter(|(_, text)| text.contains(concat!("allow(", "unsafe_code)")))
        .map(|(path, _)| path)
        .collect();
    assert_eq!(
        actual, documented,
        "files that allow unsafe code (left) differ from docs/ARCHITECTURE.md's list (right)"
    );
}

/// Evaluates a constant expression of the kinds the limits use:
/// `65_536`, `16 * 1024 * 1024`, `1 << 20`, `64 * 1024 as u64`.
fn evaluate(expression: &str) -> u128 {
    let cleaned: String = expression
        .replace('_', "")
        .split_whitespace()
        .filter(|w| *w != "as" && !w.starts_with('u') && !w.starts_with('i'))
        .collect::<Vec<_>>()
        .join(" ");
    cleaned
        .split('*')
        .map(|factor| match factor.split_once("<<") {
            Some((base, shift)) => {
                base.trim().parse::<u128>().unwrap() << shift.trim().parse::<u32>().unwrap()
            }
            None => factor
                .trim()
                .parse::<u128>()
                .unwrap_or_else(|_| panic!("cannot evaluate '{expression}'")),
        })
        .product()
}

/// The value of `const NAME: T = EXPR;` in `source`.
fn constant(source: &str, name: &str) -> Option<u128> {
    let at = source.find(&format!("const {name}:"))?;
    let rest = &source[at..];
    let expression = &rest[rest.find('=')? + 1..rest.find(';')?];
    Some(evaluate(expression.trim()))
}

/// The default of a `cubed` flag, from its field's `default_value_t`.
fn flag_default(config: &str, flag: &str) -> u128 {
    let field = format!("pub {}:", flag.trim_start_matches("--").replace('-', "_"));
    let at = config
        .find(&field)
        .unwrap_or_else(|| panic!("server/src/config.rs has no field for {flag}"));
    let attributes = &config[..at];
    let start = attributes
        .rfind("default_value_t")
        .unwrap_or_else(|| panic!("{flag} has no default_value_t"));
    let expression = attributes[start..]
        .split_once('=')
        .unwrap()
        .1
        .split([',', ')'])
        .next()
        .unwrap()
        .trim();
    if expression.starts_with(|c: char| c.is_ascii_digit()) {
        evaluate(expression)
    } else {
        let name = expression.rsplit("::").next().unwrap();
        constant(config, name).unwrap_or_else(|| panic!("{flag}: no constant {name}"))
    }
}

/// "16 MiB" → 16 Mi, "65536 cells" → 65536, "250 ms" → 250.
fn documented_value(text: &str) -> u128 {
    let mut words = text.split_whitespace();
    let number: u128 = words.next().unwrap().parse().unwrap();
    match words.next() {
        Some("KiB") => number << 10,
        Some("MiB") => number << 20,
        Some("GiB") => number << 30,
        _ => number,
    }
}

#[test]
fn limits_table_matches_the_code() {
    let rows = table_rows(&section(&doc(), "Limits"));
    assert!(rows.len() >= 20, "the limits table lost rows");
    let config = fs::read_to_string(root().join("server/src/config.rs")).unwrap();
    for row in rows {
        let (what, value, place) = (&row[0], documented_value(&row[1]), &row[2]);
        let names = backticked(place);
        let actual = match names.as_slice() {
            [flag] if flag.starts_with("--") => flag_default(&config, flag),
            [file, name] => {
                let source = fs::read_to_string(root().join(file))
                    .unwrap_or_else(|e| panic!("limit '{what}': {file}: {e}"));
                constant(&source, name)
                    .unwrap_or_else(|| panic!("limit '{what}': no const {name} in {file}"))
            }
            _ => panic!("limit '{what}': cannot read its place '{place}'"),
        };
        assert_eq!(
            actual, value,
            "limit '{what}' ({place}) is {actual} in the code"
        );
    }
}

#[test]
fn every_path_and_type_the_map_names_exists() {
    let doc = doc();
    let root = root();
    let sources = all_sources();
    let mut crate_dir = String::new();
    for line in doc.lines() {
        if let Some(heading) = line.strip_prefix("### ") {
            crate_dir = backticked(heading).first().cloned().unwrap_or_default();
        }
        for name in backticked(line) {
            let top = name.split('/').next().unwrap_or("");
            let is_repo_path = name.contains('/')
                && !name.contains(['*', '<', ' '])
                && (SOURCE_DIRS.contains(&top) || top == "docs" || top == "third_party");
            if is_repo_path {
                assert!(
                    root.join(&name).exists(),
                    "docs/ARCHITECTURE.md names {name}, which is gone"
                );
            } else if name.starts_with("src/") || name.starts_with("tests/") {
                let path = root.join(&crate_dir).join(&name);
                assert!(
                    path.exists(),
                    "docs/ARCHITECTURE.md names {crate_dir}{name}, which is gone"
                );
            }
        }
    }
    let codemap = section(&doc, "Codemap").join("\n");
    for name in backticked(&codemap) {
        let is_type = name.starts_with(|c: char| c.is_ascii_uppercase())
            && name.chars().all(|c| c.is_ascii_alphanumeric())
            && name.chars().any(|c| c.is_ascii_lowercase());
        if !is_type {
            continue;
        }
        let defined = sources.iter().any(|(_, text)| {
            ["struct", "enum", "trait", "type"]
                .iter()
                .any(|kind| text.contains(&format!("{kind} {name}")))
        });
        assert!(
            defined,
            "the codemap names the type {name}, which no source defines"
        );
    }
}
