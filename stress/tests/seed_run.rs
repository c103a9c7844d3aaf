//! Guards the `seed` workload end to end (the default of `cube-stress` and `make stress`): prog + run pairs (also pipelined), steps over row segments and cell-stats against a throwaway cubed, every seed cell's telemetry count checked against the runs the driver saw acknowledged, also across a kill -9.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;

use common::{field, int, parse_json};
use cube_stress::json::Json;

fn seed_run(extra: &[&str]) -> Json {
    let dir = tempfile::tempdir().unwrap();
    let json_path = dir.path().join("seed.json");
    let output = Command::new(env!("CARGO_BIN_EXE_cube-stress"))
        .args([
            "--duration",
            "2",
            "--warmup",
            "0.3",
            "--clients",
            "4",
            "--keys",
            "200",
            "--json",
        ])
        .arg(&json_path)
        .args(extra)
        .output()
        .unwrap();
    let (_, stderr) = common::succeeded(&output);
    assert!(
        stderr.contains("checking the telemetry of 200 seed cells"),
        "{stderr}"
    );
    parse_json(&std::fs::read_to_string(&json_path).unwrap())
}

#[test]
fn the_default_workload_is_seed_and_every_telemetry_count_matches() {
    let report = seed_run(&[]);
    assert_eq!(field(&report, "workload"), &Json::from("seed"));
    assert_eq!(field(&report, "passed"), &Json::Bool(true));
    let commands = field(&report, "commands");
    for command in ["prog", "run", "step", "cell-stats"] {
        assert!(
            int(field(field(commands, command), "count")) > 0,
            "no {command}"
        );
    }
    let server = field(&report, "server");
    assert!(int(field(server, "programs.runs")) >= int(field(field(commands, "run"), "count")));
    assert_eq!(int(field(server, "programs.failed")), 0);
    // The 200 seed cells are checked on top of the key space's read-back.
    let verification = field(&report, "verification");
    assert!(int(field(verification, "keys_checked")) >= 200);
    assert_eq!(int(field(verification, "mismatches")), 0);
}

#[test]
fn telemetry_counts_match_across_kill_9() {
    let report = seed_run(&["--crash-every", "0.8"]);
    assert_eq!(field(&report, "passed"), &Json::Bool(true));
    assert!(matches!(field(&report, "crashes"), Json::Array(c) if !c.is_empty()));
    assert_eq!(int(field(field(&report, "verification"), "mismatches")), 0);
}

#[test]
fn pipelined_pairs_keep_every_telemetry_count_exact_also_across_kill_9() {
    let report = seed_run(&["--pipeline", "--crash-every", "0.8"]);
    assert_eq!(field(&report, "workload"), &Json::from("seed-pipelined"));
    assert_eq!(field(&report, "passed"), &Json::Bool(true));
    assert!(matches!(field(&report, "crashes"), Json::Array(c) if !c.is_empty()));
    let commands = field(&report, "commands");
    // Each pair is one prog and one run, timed together.
    let progs = int(field(field(commands, "prog"), "count"));
    assert!(progs > 0);
    assert_eq!(progs, int(field(field(commands, "run"), "count")));
    assert_eq!(int(field(field(&report, "verification"), "mismatches")), 0);
}
