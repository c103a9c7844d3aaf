//! Guards `cubec`'s contract with scripts: exact bytes in and out, stable
//! exit codes, JSON shapes, and error messages that say what to do next,
//! all against a real `cubed`.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};

use cube_client::{LocalDaemon, base64};

mod support;
use support::{assert_exit, cubec_with_stdin as cubec, stderr};

/// Standard output, lossily: some tests print raw bytes.
fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn all_byte_values() -> Vec<u8> {
    (0..=255u8).chain((0..=255u8).rev()).collect()
}

fn start() -> LocalDaemon {
    LocalDaemon::start_fresh(&[]).unwrap()
}

/// The string value of `"key":"..."` in flat JSON we wrote ourselves (no
/// escapes inside base64 or the keys we look up).
fn json_string_field<'a>(json: &'a str, key: &str) -> Option<&'a str> {
    let marker = format!("\"{key}\":\"");
    let start = json.find(&marker)? + marker.len();
    let len = json[start..].find('"')?;
    Some(&json[start..start + len])
}

#[test]
fn binary_value_round_trips_through_stdin() {
    let daemon = start();
    let value = all_byte_values();
    let put = cubec(daemon.socket(), &["put", "default", "1,2,3", "-"], &value);
    assert_exit(&put, 0);
    let get = cubec(daemon.socket(), &["get", "default", "1,2,3"], b"");
    assert_exit(&get, 0);
    assert_eq!(get.stdout, value, "get must print exactly the stored bytes");
}

#[test]
fn binary_value_round_trips_through_a_file() {
    let daemon = start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("value.bin");
    let value: Vec<u8> = all_byte_values().repeat(100);
    std::fs::write(&path, &value).unwrap();
    let put = cubec(
        daemon.socket(),
        &["put", "default", "7,8,9", "--file", path.to_str().unwrap()],
        b"",
    );
    assert_exit(&put, 0);
    assert!(
        stdout(&put).contains(&format!("{} bytes", value.len())),
        "{}",
        stdout(&put)
    );
    let get = cubec(daemon.socket(), &["get", "default", "7,8,9"], b"");
    assert_exit(&get, 0);
    assert_eq!(get.stdout, value);
}

#[test]
fn argument_value_is_stored_without_additions() {
    let daemon = start();
    assert_exit(
        &cubec(
            daemon.socket(),
            &["put", "default", "0,0,0", "hello world"],
            b"",
        ),
        0,
    );
    let get = cubec(daemon.socket(), &["get", "default", "0,0,0"], b"");
    assert_exit(&get, 0);
    assert_eq!(get.stdout, b"hello world", "no trailing newline added");
    // An empty value is a value, not an absence.
    assert_exit(
        &cubec(daemon.socket(), &["put", "default", "0,0,1", ""], b""),
        0,
    );
    let get = cubec(daemon.socket(), &["get", "default", "0,0,1"], b"");
    assert_exit(&get, 0);
    assert!(get.stdout.is_empty());
}

#[test]
fn missing_cell_exits_1_with_empty_stdout() {
    let daemon = start();
    let get = cubec(daemon.socket(), &["get", "default", "5,5,5"], b"");
    assert_exit(&get, 1);
    assert!(get.stdout.is_empty());
    assert!(
        stderr(&get).contains("no value at default 5,5,5"),
        "{}",
        stderr(&get)
    );
}

#[test]
fn del_removes_and_reports_absence() {
    let daemon = start();
    assert_exit(
        &cubec(daemon.socket(), &["put", "default", "1,1,1", "x"], b""),
        0,
    );
    let del = cubec(daemon.socket(), &["del", "default", "1,1,1"], b"");
    assert_exit(&del, 0);
    assert_exit(
        &cubec(daemon.socket(), &["get", "default", "1,1,1"], b""),
        1,
    );
    let again = cubec(daemon.socket(), &["del", "default", "1,1,1"], b"");
    assert_exit(&again, 1);
    assert!(
        stderr(&again).contains("nothing deleted"),
        "{}",
        stderr(&again)
    );
    let json = cubec(daemon.socket(), &["--json", "del", "default", "1,1,1"], b"");
    assert_exit(&json, 1);
    assert_eq!(
        stdout(&json).trim(),
        r#"{"ns":"default","coord":[1,1,1],"existed":false}"#
    );
}

#[test]
fn negative_coordinates_work_as_positionals() {
    let daemon = start();
    let put = cubec(daemon.socket(), &["put", "default", "-1,-2,-3", "neg"], b"");
    assert_exit(&put, 0);
    let get = cubec(daemon.socket(), &["get", "default", "-1,-2,-3"], b"");
    assert_exit(&get, 0);
    assert_eq!(get.stdout, b"neg");
    assert_exit(
        &cubec(daemon.socket(), &["get", "default", "1,2,3"], b""),
        1,
    );
    let extremes = "-2147483648,2147483647,-1";
    assert_exit(
        &cubec(daemon.socket(), &["put", "default", extremes, "-"], b"edge"),
        0,
    );
    let get = cubec(daemon.socket(), &["get", "default", extremes], b"");
    assert_eq!(get.stdout, b"edge");
}

#[test]
fn stats_prints_an_aligned_table_and_json() {
    let daemon = start();
    assert_exit(
        &cubec(daemon.socket(), &["put", "default", "1,2,3", "v"], b""),
        0,
    );
    let table = cubec(daemon.socket(), &["stats"], b"");
    assert_exit(&table, 0);
    let text = stdout(&table);
    let lines: Vec<&str> = text.lines().collect();
    assert!(!lines.is_empty(), "stats printed nothing");
    // Names pad to one width, then two spaces, then the value column.
    let name_width = lines
        .iter()
        .map(|line| line.split_whitespace().next().unwrap().len())
        .max()
        .unwrap();
    for line in &lines {
        assert!(
            line.len() > name_width + 2 && line.get(name_width..name_width + 2) == Some("  "),
            "misaligned row {line:?} in:\n{text}"
        );
    }
    let json = cubec(daemon.socket(), &["--json", "stats"], b"");
    assert_exit(&json, 0);
    let json = stdout(&json);
    let json = json.trim();
    assert!(json.starts_with('{') && json.ends_with('}'), "{json}");
    let first_name = lines[0].split_whitespace().next().unwrap();
    assert!(json.contains(&format!("\"{first_name}\":")), "{json}");
}

#[test]
fn json_get_carries_text_and_base64() {
    let daemon = start();
    let text = "say \"hi\"\n\tthere ☃";
    assert_exit(
        &cubec(daemon.socket(), &["put", "default", "1,-2,3", text], b""),
        0,
    );
    let get = cubec(
        daemon.socket(),
        &["--json", "get", "default", "1,-2,3"],
        b"",
    );
    assert_exit(&get, 0);
    let out = stdout(&get);
    assert!(
        out.starts_with(
            r#"{"ns":"default","coord":[1,-2,3],"found":true,"value":"say \"hi\"\n\tthere ☃","#
        ),
        "{out}"
    );
    let encoded = json_string_field(&out, "value_base64").unwrap();
    assert_eq!(base64::decode(encoded).unwrap(), text.as_bytes());

    let binary = all_byte_values();
    assert_exit(
        &cubec(daemon.socket(), &["put", "default", "2,2,2", "-"], &binary),
        0,
    );
    let get = cubec(daemon.socket(), &["get", "default", "2,2,2", "--json"], b"");
    assert_exit(&get, 0);
    let out = stdout(&get);
    assert!(
        out.contains(r#""value":null"#),
        "non-UTF-8 value must be null: {out}"
    );
    let encoded = json_string_field(&out, "value_base64").unwrap();
    assert_eq!(base64::decode(encoded).unwrap(), binary);

    let missing = cubec(daemon.socket(), &["--json", "get", "default", "9,9,9"], b"");
    assert_exit(&missing, 1);
    assert_eq!(
        stdout(&missing).trim(),
        r#"{"ns":"default","coord":[9,9,9],"found":false,"value":null,"value_base64":null}"#
    );
}

#[test]
fn json_put_and_ping() {
    let daemon = start();
    let put = cubec(
        daemon.socket(),
        &["--json", "put", "default", "3,3,3", "abc"],
        b"",
    );
    assert_exit(&put, 0);
    let out = stdout(&put);
    assert!(
        out.starts_with(r#"{"ns":"default","coord":[3,3,3],"bytes":3,"lsn":"#),
        "{out}"
    );
    let ping = cubec(daemon.socket(), &["--json", "ping"], b"");
    assert_exit(&ping, 0);
    assert!(
        stdout(&ping).starts_with(r#"{"ok":true,"server_version":""#),
        "{}",
        stdout(&ping)
    );
    let ping = cubec(daemon.socket(), &["ping"], b"");
    assert_exit(&ping, 0);
    assert!(
        stdout(&ping).starts_with("pong from cubed"),
        "{}",
        stdout(&ping)
    );
}

#[test]
fn socket_comes_from_cube_socket_env() {
    let daemon = start();
    let output = Command::new(env!("CARGO_BIN_EXE_cubec"))
        .arg("ping")
        .env("CUBE_SOCKET", daemon.socket())
        .output()
        .unwrap();
    assert_exit(&output, 0);
}

#[test]
fn bad_coordinate_is_a_usage_error_that_shows_the_format() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("unused.sock");
    for bad in ["1,2", "1,2,x", "1,2,2147483648", "a"] {
        let out = cubec(&socket, &["get", "default", bad], b"");
        assert_exit(&out, 2);
        let err = stderr(&out);
        assert!(err.contains("bad coordinate"), "{bad}: {err}");
        assert!(
            err.contains("X,Y,Z") || err.contains("integer"),
            "{bad}: {err}"
        );
    }
}

#[test]
fn bad_namespace_is_a_usage_error_that_shows_the_rules() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("unused.sock");
    let out = cubec(&socket, &["put", "Bad Name", "1,2,3", "v"], b"");
    assert_exit(&out, 2);
    assert!(stderr(&out).contains("only a-z, 0-9"), "{}", stderr(&out));
    let long = "a".repeat(65);
    let out = cubec(&socket, &["get", &long, "1,2,3"], b"");
    assert_exit(&out, 2);
    assert!(stderr(&out).contains("1 to 64 bytes"), "{}", stderr(&out));
}

#[test]
fn put_needs_exactly_one_value_source() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("unused.sock");
    assert_exit(&cubec(&socket, &["put", "default", "1,2,3"], b""), 2);
    let both = cubec(
        &socket,
        &["put", "default", "1,2,3", "v", "--file", "/etc/hostname"],
        b"",
    );
    assert_exit(&both, 2);
}

#[test]
fn unreadable_value_file_is_a_usage_error() {
    let daemon = start();
    let out = cubec(
        daemon.socket(),
        &[
            "put",
            "default",
            "1,2,3",
            "--file",
            "/nonexistent/value.bin",
        ],
        b"",
    );
    assert_exit(&out, 2);
    let err = stderr(&out);
    assert!(
        err.starts_with("cubec: cannot read value file /nonexistent/value.bin"),
        "{err}"
    );
    assert!(err.contains("; check the path"), "{err}");
}

#[test]
fn cannot_connect_exits_4_and_says_how_to_start_cubed() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nobody-home.sock");
    let out = cubec(&socket, &["ping"], b"");
    assert_exit(&out, 4);
    let err = stderr(&out);
    assert!(err.starts_with("cubec: cannot connect to "), "{err}");
    assert!(err.contains("nobody-home.sock"), "{err}");
    assert!(err.contains("make run"), "{err}");
}

#[test]
fn unknown_namespace_is_a_server_error_exit_3() {
    let daemon = start();
    let out = cubec(daemon.socket(), &["put", "nosuch", "1,2,3", "v"], b"");
    assert_exit(&out, 3);
    let err = stderr(&out);
    assert!(err.to_lowercase().contains("no such namespace"), "{err}");
    assert!(err.contains("no_such_namespace"), "{err}");
    assert!(err.contains("; check the namespace name"), "{err}");
    assert_exit(&cubec(daemon.socket(), &["get", "nosuch", "1,2,3"], b""), 3);
}

/// Documented choice: the client knows the server's limit from the
/// handshake and refuses before sending, so an oversized value is a usage
/// error (exit 2), not a server error.
#[test]
fn value_over_the_server_limit_exits_2_without_sending() {
    let daemon = LocalDaemon::start_fresh(&["--max-value-bytes", "16"]).unwrap();
    let out = cubec(
        daemon.socket(),
        &["put", "default", "1,2,3", "-"],
        &[7u8; 17],
    );
    assert_exit(&out, 2);
    let err = stderr(&out);
    assert!(
        err.contains("17 bytes") && err.contains("limit of 16"),
        "{err}"
    );
    assert_exit(
        &cubec(daemon.socket(), &["get", "default", "1,2,3"], b""),
        1,
    );
    assert_exit(
        &cubec(
            daemon.socket(),
            &["put", "default", "1,2,3", "-"],
            &[7u8; 16],
        ),
        0,
    );
}

#[test]
fn help_documents_exit_codes_and_examples() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("unused.sock");
    let out = cubec(&socket, &["--help"], b"");
    assert_exit(&out, 0);
    let help = stdout(&out);
    for line in [
        "0  success",
        "1  not found",
        "2  usage",
        "3  cubed answered",
        "4  cannot connect",
    ] {
        assert!(help.contains(line), "--help lacks {line:?}:\n{help}");
    }
    for sub in ["ping", "put", "get", "del", "stats"] {
        let out = cubec(&socket, &[sub, "--help"], b"");
        assert_exit(&out, 0);
        assert!(
            stdout(&out).contains(&format!("cubec {sub}")) || stdout(&out).contains("cubec --"),
            "{sub} --help has no example:\n{}",
            stdout(&out)
        );
    }
}

/// With --json a failure is a JSON object on stdout too, with the exit
/// code and the message (a past bug: scripts got nothing to parse).
#[test]
fn json_failures_are_json_on_stdout() {
    let daemon = start();
    let out = cubec(daemon.socket(), &["--json", "get", "nosuch", "1,2,3"], b"");
    assert_exit(&out, 3);
    let answer: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(answer["ok"], false);
    assert_eq!(answer["exit"], 3);
    assert!(
        answer["error"].as_str().unwrap().contains("nosuch"),
        "{answer}"
    );
    let gone = daemon.socket().with_extension("gone");
    let out = cubec(&gone, &["--json", "ping"], b"");
    assert_exit(&out, 4);
    let answer: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(answer["exit"], 4);
}
