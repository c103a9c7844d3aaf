//! Guards `cube-stress scale` end to end against the real cubed: a small
//! data set is built, its JSON report has every figure, a second run
//! reuses the data set without importing, and a run asking for other
//! cells builds it again. Nothing here is timed.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::Command;

use common::{field, int, number, parse_json};
use cube_stress::json::Json;

/// Every figure the report promises (docs/benchmarks.md, "Scale").
const FIGURES: [&str; 15] = [
    "import_rate",
    "import_slowest_10s",
    "import_peak_rss",
    "serving_peak_rss",
    "restart_to_first_request",
    "hot_get_16",
    "hot_get_64",
    "cold_get_16",
    "pread_floor",
    "pread_floor_queued",
    "pread_floor_sustained",
    "box_scan_cold",
    "box_scan_cached",
    "socket_floor",
    "in_cache_rss",
];

/// One `scale` run of `cells` cells in `dir`: its JSON report and stderr.
fn scale(dir: &Path, cells: u64) -> (Json, String) {
    let json_path = dir.join("scale.json");
    let output = Command::new(env!("CARGO_BIN_EXE_cube-stress"))
        .args(["scale", "--cells", &cells.to_string(), "--hot-keys", "4000"])
        .args(["--duration", "0.5", "--warmup", "0.2", "--dir"])
        .arg(dir.join("set"))
        .arg("--json")
        .arg(&json_path)
        .output()
        .unwrap();
    let (stdout, stderr) = common::succeeded(&output);
    assert!(stdout.contains("target (issue 32)"), "{stdout}");
    assert!(
        stdout.contains("every value read was its key's version 1"),
        "{stdout}"
    );
    (
        parse_json(&std::fs::read_to_string(&json_path).unwrap()),
        stderr,
    )
}

fn check_figures(report: &Json, cells: u64) {
    let figures = field(report, "figures");
    for name in FIGURES {
        let figure = field(figures, name);
        for key in ["label", "value", "unit", "target", "met", "note"] {
            field(figure, key);
        }
        // Every figure is measured for real, but the slowest 10 s, which
        // needs a longer import.
        if name != "import_slowest_10s" {
            let value = number(field(figure, "value"));
            assert!(value > 0.0, "{name} is {value}");
        }
    }
    for name in [
        "hot_get_16",
        "hot_get_64",
        "cold_get_16",
        "pread_floor",
        "pread_floor_queued",
        "pread_floor_sustained",
    ] {
        let figure = field(figures, name);
        assert!(int(field(figure, "p99_us")) >= int(field(figure, "p50_us")));
    }
    // The second and third floors read with as many in flight as the
    // cold gets' clients.
    let in_flight = |name| int(field(field(figures, name), "in_flight"));
    assert_eq!(
        (
            in_flight("pread_floor"),
            in_flight("pread_floor_queued"),
            in_flight("pread_floor_sustained")
        ),
        (1, 16, 16)
    );
    // 20 000 cells fill 19 rows and part of a 20th of plane z = 0.
    assert_eq!(
        int(field(field(figures, "box_scan_cold"), "cells")),
        40 * 20
    );
    assert_eq!(int(field(field(report, "dataset"), "cells")), cells);
    field(field(report, "machine"), "before");
    assert_eq!(field(report, "passed"), &Json::Bool(true));
    assert_eq!(field(report, "problems"), &Json::Array(Vec::new()));
}

#[test]
fn a_scale_run_builds_its_data_set_once_and_reuses_it() {
    let dir = tempfile::tempdir().unwrap();
    let (first, stderr) = scale(dir.path(), 20_000);
    check_figures(&first, 20_000);
    assert_eq!(
        field(field(&first, "dataset"), "imported"),
        &Json::Bool(true)
    );
    assert!(
        stderr.contains("building the data set: no complete data set"),
        "{stderr}"
    );
    // The import's merges settle before the data set is kept; the cold
    // phases start with the filters loaded and the data set's files out
    // of the page cache.
    assert!(stderr.contains("merges settled"), "{stderr}");
    assert!(stderr.contains("filters loaded"), "{stderr}");
    assert!(stderr.contains("asked the kernel to drop"), "{stderr}");

    let (again, stderr) = scale(dir.path(), 20_000);
    check_figures(&again, 20_000);
    assert_eq!(
        field(field(&again, "dataset"), "imported"),
        &Json::Bool(false)
    );
    assert!(stderr.contains("reusing the data set"), "{stderr}");
    assert!(!stderr.contains("importing"), "{stderr}");
    // The import's figures come from the run that built the data set.
    let rate = |r: &Json| number(field(field(field(r, "figures"), "import_rate"), "value"));
    assert_eq!(rate(&first), rate(&again));

    let (other, stderr) = scale(dir.path(), 20_480);
    assert_eq!(
        field(field(&other, "dataset"), "imported"),
        &Json::Bool(true)
    );
    assert_eq!(int(field(field(&other, "dataset"), "cells")), 20_480);
    assert!(stderr.contains("holds 20000 cells of 64 bytes"), "{stderr}");
}

#[test]
fn a_directory_it_did_not_make_is_never_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("set").join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("precious"), "keep me").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_cube-stress"))
        .args(["scale", "--cells", "1000", "--quiet", "--dir"])
        .arg(dir.path().join("set"))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("was not made by cube-stress scale"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(data.join("precious")).unwrap(),
        "keep me"
    );
}
