//! Guards `cube-stress` end to end: a short real run of the binary against
//! a throwaway cubed passes its read-back, and its `--json` file has the
//! shape docs/benchmarks.md promises; `--plot` writes an SVG.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;

use common::{field, int, number, parse_json};
use cube_stress::json::Json;

#[test]
fn a_short_mixed_run_verifies_and_writes_the_documented_json() {
    let dir = tempfile::tempdir().unwrap();
    let json_path = dir.path().join("run.json");
    let plot_path = dir.path().join("run.svg");
    let output = Command::new(env!("CARGO_BIN_EXE_cube-stress"))
        .args([
            "--workload",
            "mixed",
            "--duration",
            "2",
            "--warmup",
            "0.5",
            "--clients",
            "4",
            "--keys",
            "2000",
            "--read-ratio",
            "0.5",
            "--verify",
            "all",
            "--json",
        ])
        .arg(&json_path)
        .arg("--plot")
        .arg(&plot_path)
        .output()
        .unwrap();
    let (stdout, _) = common::succeeded(&output);
    assert!(stdout.contains("p99.9_us"), "{stdout}");
    assert!(stdout.contains("closed loop"), "{stdout}");
    assert!(stdout.trim_end().ends_with("PASSED"), "{stdout}");

    let report = parse_json(&std::fs::read_to_string(&json_path).unwrap());
    assert_eq!(field(&report, "target"), &Json::from("cube"));
    assert_eq!(field(&report, "workload"), &Json::from("mixed"));
    assert_eq!(int(field(&report, "clients")), 4);
    assert!(number(field(&report, "duration_s")) >= 1.9);
    assert_eq!(int(field(&report, "errors")), 0);
    assert_eq!(field(&report, "passed"), &Json::Bool(true));
    let commands = field(&report, "commands");
    for command in ["put", "get"] {
        let figures = field(commands, command);
        assert!(int(field(figures, "count")) > 0, "no {command}s recorded");
        assert!(number(field(figures, "ops_per_sec")) > 0.0);
        let p50 = int(field(figures, "p50_us"));
        let p90 = int(field(figures, "p90_us"));
        let p99 = int(field(figures, "p99_us"));
        let p999 = int(field(figures, "p999_us"));
        let max = int(field(figures, "max_us"));
        assert!(p50 <= p90 && p90 <= p99 && p99 <= p999 && p999 <= max);
        assert!(number(field(figures, "mean_us")) > 0.0);
    }
    // The daemon's own view of the same requests.
    let server = field(&report, "server");
    assert!(int(field(server, "cmd.put.count")) >= int(field(field(commands, "put"), "count")));
    field(server, "wal.fsync_us_mean");
    field(server, "wal.group_records_mean");
    let verification = field(&report, "verification");
    assert_eq!(field(verification, "mode"), &Json::from("all"));
    assert_eq!(int(field(verification, "keys_checked")), 2000);
    assert_eq!(int(field(verification, "mismatches")), 0);
    assert_eq!(field(&report, "crashes"), &Json::Array(vec![]));

    let svg = std::fs::read_to_string(&plot_path).unwrap();
    assert!(svg.starts_with("<svg"));
    assert_eq!(svg.matches("<polyline").count(), 2);
}

#[test]
fn a_redis_target_without_redis_installed_says_how_to_install_it() {
    // An empty PATH hides redis-server whether or not it is installed.
    let output = Command::new(env!("CARGO_BIN_EXE_cube-stress"))
        .args([
            "--target",
            "redis-always",
            "--workload",
            "put",
            "--duration",
            "1",
        ])
        .env("PATH", "")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("apt-get install redis-server"), "{stderr}");
}

#[test]
fn compare_skips_redis_when_it_is_missing_and_still_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let json_path = dir.path().join("compare.json");
    let output = Command::new(env!("CARGO_BIN_EXE_cube-stress"))
        .args([
            "compare",
            "--targets",
            "redis-always,sqlite",
            "--workloads",
            "put",
            "--clients",
            "1",
            "--duration",
            "0.3",
            "--warmup",
            "0",
            "--keys",
            "100",
            "--json",
        ])
        .arg(&json_path)
        .env("PATH", "")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("apt-get install redis-server"), "{stderr}");
    assert!(stdout.contains("skipped: redis-always"), "{stdout}");
    let comparison = parse_json(&std::fs::read_to_string(&json_path).unwrap());
    let Json::Array(cells) = field(&comparison, "cells") else {
        panic!("cells is not an array");
    };
    assert_eq!(cells.len(), 1);
    assert_eq!(field(&cells[0], "target"), &Json::from("sqlite"));
    assert!(number(field(&cells[0], "ops_per_sec")) > 0.0);
    assert_eq!(field(&comparison, "passed"), &Json::Bool(true));
}
