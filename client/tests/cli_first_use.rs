//! What a new user trips over (issue 29), each against a real `cubed`:
//! `--json` failures on stdout even for argument errors, a second daemon
//! told what is really in use, the step's instruction count, and the
//! messages of a value over the limit, a bad JSON line, a CSV export that
//! leaves edges and programs out, and an encrypted namespace without a key.
#![allow(clippy::unwrap_used)]

mod support;

use std::process::Command;

use cube_client::LocalDaemon;
use support::{assert_exit, cubec, stderr, stdout};

#[track_caller]
fn assert_contains(text: &str, needle: &str) {
    assert!(text.contains(needle), "{needle:?} not in:\n{text}");
}

/// The one JSON object `--json` prints on stdout for a failure.
#[track_caller]
fn failure_object(out: &std::process::Output) -> serde_json::Value {
    let text = stdout(out);
    let object: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(object["ok"], false, "{text}");
    assert_eq!(
        object["exit"].as_i64().map(|n| n as i32),
        out.status.code(),
        "{text}"
    );
    assert!(object["error"].as_str().is_some_and(|e| !e.is_empty()));
    object
}

#[test]
fn json_argument_errors_print_a_failure_object_on_stdout() {
    // No daemon needed: clap refuses these before connecting.
    let socket = std::path::Path::new("/nonexistent/cubed.sock");
    let out = cubec(socket, &["--json", "get", "default", "1,2"]);
    assert_exit(&out, 2);
    let object = failure_object(&out);
    assert_contains(object["error"].as_str().unwrap(), "X,Y,Z");
    // The human message still goes to stderr.
    assert_contains(&stderr(&out), "bad coordinate");
    // --json after the subcommand, and an unknown subcommand.
    let out = cubec(socket, &["nosuch", "--json"]);
    assert_exit(&out, 2);
    failure_object(&out);
    // No command at all: clap prints the help, and it is a failure.
    let out = cubec(socket, &["--json"]);
    assert_exit(&out, 2);
    assert_contains(
        failure_object(&out)["error"].as_str().unwrap(),
        "requires a subcommand",
    );
    // Without --json stdout stays empty; --help is not a failure.
    let out = cubec(socket, &["get", "default", "1,2"]);
    assert_exit(&out, 2);
    assert_eq!(stdout(&out), "");
    let out = cubec(socket, &["--json", "--help"]);
    assert_exit(&out, 0);
    assert!(!stdout(&out).contains("\"ok\":false"));
    // A connect failure was already an object; it stays one.
    let out = cubec(socket, &["--json", "ping"]);
    assert_exit(&out, 4);
    failure_object(&out);
}

#[test]
fn a_second_cubed_on_the_same_data_dir_is_told_the_data_dir_is_in_use() {
    // The default socket lives in the data dir: both are in use, and the
    // lock is what to report, with the holder's pid.
    let temp = tempfile::tempdir().unwrap();
    let data = temp.path().join("cube-data");
    std::fs::create_dir(&data).unwrap();
    // cubed starts only on a data dir private to its user.
    std::fs::set_permissions(&data, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let daemon = LocalDaemon::start_in(&data, &data.join("cubed.sock"), &[]).unwrap();
    let out = Command::new(LocalDaemon::find_binary().unwrap())
        .arg("--data")
        .arg(&data)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert_contains(&err, "is locked by another cubed");
    assert_contains(&err, &daemon.pid().to_string());
    assert!(!err.contains("--socket"), "{err}");
    daemon.client().unwrap().ping().unwrap();
}

#[test]
fn step_names_what_its_instruction_count_means() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let s = daemon.socket();
    assert_exit(&cubec(s, &["prog", "default", "1,1,1", "return 1"]), 0);
    let out = cubec(s, &["step", "default", "0,0,0", "2,2,2"]);
    assert_exit(&out, 0);
    assert_contains(&stdout(&out), "under 1000 instructions");
    let busy = "local n = 0 for i = 1, 5000 do n = n + i end return n";
    assert_exit(&cubec(s, &["prog", "default", "1,1,1", busy]), 0);
    let out = cubec(s, &["step", "default", "0,0,0", "2,2,2"]);
    assert_exit(&out, 0);
    assert_contains(&stdout(&out), "about ");
    assert!(
        !stdout(&out).contains(" 0 instructions"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn messages_say_what_to_do_next() {
    let daemon = LocalDaemon::start_fresh(&["--max-value-bytes", "1000"]).unwrap();
    let s = daemon.socket();
    let dir = tempfile::tempdir().unwrap();

    // A value over the limit names the flag that raises it.
    let big = dir.path().join("big");
    std::fs::write(&big, vec![b'x'; 2000]).unwrap();
    let out = cubec(
        s,
        &["put", "default", "0,0,0", "--file", big.to_str().unwrap()],
    );
    assert_exit(&out, 2);
    assert_contains(&stderr(&out), "cubed --max-value-bytes");

    // A bad JSON line: the file's line and the column, once.
    let bad = dir.path().join("bad.jsonl");
    let good = r#"{"type":"cell","coord":[1,2,3],"value":"x"}"#;
    let mut text = String::new();
    for _ in 0..5 {
        text.push_str(good);
        text.push('\n');
    }
    text.push_str(r#"{"type":"cell","coord":[1,2,3] "value":"x"}"#);
    text.push('\n');
    std::fs::write(&bad, text).unwrap();
    let out = cubec(s, &["import", "default", bad.to_str().unwrap()]);
    assert_exit(&out, 2);
    let err = stderr(&out);
    assert_contains(&err, "line 6 column 32: expected `,` or `}`");
    assert!(!err.contains("at line 1"), "{err}");

    // CSV export says what it leaves out.
    assert_exit(&cubec(s, &["put", "default", "0,0,0", "a"]), 0);
    assert_exit(&cubec(s, &["link", "default", "0,0,0", "1,0,0"]), 0);
    assert_exit(&cubec(s, &["prog", "default", "5,5,5", "return 1"]), 0);
    let out = cubec(s, &["export", "default", "--format", "csv"]);
    assert_exit(&out, 0);
    assert_contains(&stderr(&out), "left out 1 edges and 1 programs");
    assert!(
        stdout(&out).starts_with("x,y,z,value\n"),
        "{}",
        stdout(&out)
    );
    // JSON lines carry everything, without the warning.
    let out = cubec(s, &["export", "default"]);
    assert_exit(&out, 0);
    assert!(!stderr(&out).contains("left out"), "{}", stderr(&out));

    // An encrypted namespace without a key: the flag is named once.
    let out = cubec(s, &["ns", "create", "vault", "--encrypted"]);
    assert_exit(&out, 3);
    let err = stderr(&out);
    assert_eq!(err.matches("--key-file").count(), 1, "{err}");
    assert_contains(&err, "without --encrypted");
}

#[test]
fn stats_shows_what_has_happened_and_all_shows_every_row() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let s = daemon.socket();
    assert_exit(&cubec(s, &["put", "default", "1,2,3", "x"]), 0);
    let out = cubec(s, &["stats"]);
    assert_exit(&out, 0);
    let short = stdout(&out);
    assert_contains(&short, "cmd.put.count");
    assert_contains(&short, "wal.records");
    // Never served, zero, or the histograms' rows: hidden, and said so.
    for hidden in ["cmd.walk.", "connections.refused", "cmd.put.latency_us_le_"] {
        assert!(!short.contains(hidden), "{hidden} shown:\n{short}");
    }
    // Said on stderr: stdout stays one table.
    assert_contains(&stderr(&out), "`cubec stats --all` shows every row");
    assert!(!short.contains("--all"), "{short}");
    let out = cubec(s, &["stats", "--all"]);
    assert_exit(&out, 0);
    let all = stdout(&out);
    for shown in [
        "cmd.walk.count",
        "connections.refused",
        "cmd.put.latency_us_le_inf",
    ] {
        assert_contains(&all, shown);
    }
    assert!(all.lines().count() > 3 * short.lines().count(), "{all}");
    // JSON keeps every row: scripts look rows up by name.
    let out = cubec(s, &["--json", "stats"]);
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(json["cmd.walk.count"], 0);
}
