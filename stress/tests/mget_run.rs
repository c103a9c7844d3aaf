//! Guards the `mget` workload end to end: `--batch` random keys per
//! request against a throwaway cubed (and SQLite's one-statement form),
//! every cell checked, the request latency and the cells per second in the
//! table and the `--json` file; `--batch` outside 1..=4096 refused before
//! anything starts.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::{Command, Output};

use common::{field, int, number, parse_json};
use cube_stress::json::Json;

fn cube_stress(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cube-stress"))
        .args(args)
        .output()
        .unwrap()
}

/// A passing mget run of `--batch batch`; its JSON report and table.
fn mget_run(batch: &str, extra: &[&str]) -> (Json, String) {
    let dir = tempfile::tempdir().unwrap();
    let json_path = dir.path().join("mget.json");
    let mut args = vec![
        "--workload",
        "mget",
        "--batch",
        batch,
        "--duration",
        "1",
        "--warmup",
        "0.3",
        "--clients",
        "2",
        "--json",
        json_path.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let output = cube_stress(&args);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "cube-stress failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(stdout.trim_end().ends_with("PASSED"), "{stdout}");
    let report = parse_json(&std::fs::read_to_string(&json_path).unwrap());
    (report, stdout)
}

#[test]
fn an_mget_run_against_cube_checks_every_cell_and_reports_cells_per_second() {
    let (report, table) = mget_run("16", &[]);
    assert_eq!(field(&report, "workload"), &Json::from("mget"));
    assert_eq!(int(field(&report, "batch")), 16);
    assert_eq!(int(field(&report, "clients")), 2);
    assert_eq!(int(field(&report, "errors")), 0);
    assert_eq!(field(&report, "passed"), &Json::Bool(true));
    assert!(number(field(&report, "prefill_s")) > 0.0);
    let commands = field(&report, "commands");
    let Json::Object(used) = commands else {
        panic!("commands is not an object");
    };
    let names: Vec<&str> = used.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["mget"], "only mget requests are made");
    let mget = field(commands, "mget");
    let count = int(field(mget, "count"));
    assert!(count > 0);
    let ops = number(field(mget, "ops_per_sec"));
    let cells = number(field(mget, "cells_per_sec"));
    assert!(
        (cells - 16.0 * ops).abs() < 1e-6 * cells,
        "{cells} vs {ops}"
    );
    assert!(int(field(mget, "p50_us")) <= int(field(mget, "p99_us")));
    // The daemon counted the same requests (warmup included).
    assert!(int(field(field(&report, "server"), "cmd.mget.count")) >= count);
    let verification = field(&report, "verification");
    assert_eq!(int(field(verification, "mismatches")), 0);
    assert_eq!(int(field(verification, "read_mismatches_during_run")), 0);

    assert!(table.contains("mget (16 keys per request)"), "{table}");
    assert!(
        table.lines().any(|l| l.starts_with("mget ")),
        "no mget row: {table}"
    );
    assert!(table.contains("cells/s"), "{table}");
}

#[test]
fn sqlite_answers_an_mget_batch_in_one_statement() {
    let (report, _) = mget_run("4096", &["--target", "sqlite", "--keys", "5000"]);
    assert_eq!(field(&report, "target"), &Json::from("sqlite"));
    assert_eq!(int(field(&report, "batch")), 4096);
    assert!(int(field(field(field(&report, "commands"), "mget"), "count")) > 0);
    assert_eq!(field(&report, "passed"), &Json::Bool(true));
}

#[test]
fn a_batch_outside_one_request_is_refused_before_anything_starts() {
    for batch in ["0", "4097"] {
        let output = cube_stress(&["--workload", "mget", "--batch", batch, "--duration", "1"]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "--batch {batch}: {stderr}");
        assert!(
            stderr.contains(&format!("--batch {batch} is not between 1 and 4096")),
            "{stderr}"
        );
        assert!(!stderr.contains("starting"), "{stderr}");
    }
}
