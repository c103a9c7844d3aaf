//! Guards `cube-stress --hostile N`: the same short run alone and beside slowloris, non-reading and flooding clients, both passing their read-back, with the side-by-side table and the documented JSON (`baseline`, `hostile`, `ratios`, what the hostile threads did).
#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;

use common::{field, int, parse_json};
use cube_stress::json::Json;

#[test]
fn a_run_beside_hostile_clients_is_compared_with_the_run_alone() {
    let dir = tempfile::tempdir().unwrap();
    let json_path = dir.path().join("hostile.json");
    let output = Command::new(env!("CARGO_BIN_EXE_cube-stress"))
        .args([
            "--workload",
            "mixed",
            "--read-ratio",
            "0.5",
            "--duration",
            "1",
            "--warmup",
            "0.3",
            "--clients",
            "2",
            "--keys",
            "500",
            "--hostile",
            "6",
            "--quiet",
            "--json",
        ])
        .arg(&json_path)
        .output()
        .unwrap();
    let (stdout, _) = common::succeeded(&output);
    for text in [
        "=== alone ===",
        "=== beside hostile clients ===",
        "slowloris",
        "non-reader",
        "flood",
        "x = beside / alone",
        "PASSED (both runs)",
    ] {
        assert!(stdout.contains(text), "no {text:?} in:\n{stdout}");
    }

    let report = parse_json(&std::fs::read_to_string(&json_path).unwrap());
    assert_eq!(field(&report, "passed"), &Json::Bool(true));
    let baseline = field(&report, "baseline");
    let hostile = field(&report, "hostile");
    assert_eq!(field(baseline, "hostile"), &Json::Null);
    for run in [baseline, hostile] {
        assert_eq!(int(field(run, "errors")), 0);
        assert!(field(run, "commands").get("put").is_some());
    }
    let threads = field(hostile, "hostile");
    assert_eq!(int(field(threads, "threads")), 6);
    let kinds = field(threads, "kinds");
    for kind in ["slowloris", "non-reader", "flood"] {
        let kind = field(kinds, kind);
        assert_eq!(int(field(kind, "threads")), 2);
        assert!(int(field(kind, "connections")) >= 2);
    }
    let ratios = field(field(&report, "ratios"), "get");
    for key in ["p50", "p99", "p999", "ops_per_sec"] {
        assert!(ratios.get(key).is_some(), "no ratios.get.{key}");
    }
}
