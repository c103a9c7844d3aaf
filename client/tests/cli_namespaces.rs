//! Guards the namespace commands' contract with scripts against a real `cubed`: `cubec ns create/list/info/drop/grant/revoke` print the documented lines and JSON, a dropped name can be reused (and the drop survives a restart), a write over a quota exits 3 with a message naming the quota and applies nothing, bad names exit 2 before anything is sent, refusals say what to do next, and a second uid sees only what it was granted.
#![allow(clippy::unwrap_used)]

mod support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use cube_client::LocalDaemon;
use support::{assert_exit, cubec, stderr, stdout};

/// Runs `cubec` (as `uid`, if given: the test process must be root).
fn cubec_as(socket: &Path, args: &[&str], uid: Option<u32>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cubec"));
    command
        .arg("--socket")
        .arg(socket)
        .args(args)
        .env_remove("CUBE_SOCKET")
        .stdin(Stdio::null());
    if let Some(uid) = uid {
        command.uid(uid).gid(uid);
    }
    command.output().unwrap()
}

#[track_caller]
fn ok(socket: &Path, args: &[&str]) -> String {
    let out = cubec(socket, args);
    assert_exit(&out, 0);
    stdout(&out)
}

/// Runs a command that must fail with `code`; returns its stderr.
#[track_caller]
fn fails(socket: &Path, args: &[&str], code: i32) -> String {
    let out = cubec(socket, args);
    assert_exit(&out, code);
    assert!(out.stdout.is_empty(), "stdout: {}", stdout(&out));
    stderr(&out)
}

/// The value of `key:` in `ns info`'s aligned `key: value` lines.
#[track_caller]
fn field(info: &str, key: &str) -> String {
    info.lines()
        .find_map(|line| line.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key}: line in\n{info}"))
        .trim()
        .to_owned()
}

/// The number after `"key":` in a JSON line.
#[track_caller]
fn json_number(json: &str, key: &str) -> u64 {
    let at = json
        .find(&format!("\"{key}\":"))
        .unwrap_or_else(|| panic!("no {key} in {json}"));
    json[at + key.len() + 3..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap()
}

/// The uid this test runs as (the owner of what its `cubec` creates).
fn own_uid() -> u32 {
    std::fs::metadata("/proc/self").unwrap().uid()
}

/// Whether a quota refusal names the quota (`max-cells` or `max_cells`).
fn names_quota(message: &str, quota: &str) -> bool {
    message.contains(quota) || message.contains(&quota.replace('-', "_"))
}

#[test]
fn create_list_info_drop_and_reuse_a_name() {
    let mut daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let s = daemon.socket().to_owned();
    let s = s.as_path();
    assert_eq!(ok(s, &["ns", "list"]), "default\n");

    let text = ok(
        s,
        &[
            "ns",
            "create",
            "tenant-a",
            "--curve",
            "hilbert",
            "--max-cells",
            "1000",
            "--max-bytes",
            "10M",
        ],
    );
    assert!(text.starts_with("created namespace tenant-a\n"), "{text}");
    assert_eq!(field(&text, "name"), "tenant-a");
    assert_eq!(field(&text, "curve"), "hilbert");
    assert_eq!(field(&text, "encrypted"), "no");
    assert_eq!(field(&text, "owner"), format!("uid {}", own_uid()));
    assert_eq!(field(&text, "cells"), "0 of 1000 (0.0%)");
    assert_eq!(field(&text, "bytes"), "0 of 10485760 (0.0%)");
    assert_eq!(field(&text, "edges"), "0 (no quota)");
    assert_eq!(ok(s, &["ns", "list"]), "default\ntenant-a\n");

    // Hard partitioning: the same coordinate in two namespaces is two cells.
    ok(s, &["put", "tenant-a", "1,0,0", "hello"]);
    ok(s, &["put", "tenant-a", "2,0,0", "abc"]);
    ok(s, &["link", "tenant-a", "1,0,0", "2,0,0"]);
    assert_exit(&cubec(s, &["get", "default", "1,0,0"]), 1);
    assert_eq!(ok(s, &["get", "tenant-a", "1,0,0"]), "hello");

    let info = ok(s, &["ns", "info", "tenant-a"]);
    assert_eq!(field(&info, "cells"), "2 of 1000 (0.2%)");
    // Values (8) and the edge (64): max-bytes counts both.
    assert_eq!(field(&info, "bytes"), "72 of 10485760 (<0.1%)");
    assert_eq!(field(&info, "edges"), "1 (no quota)");
    assert_eq!(field(&info, "programs"), "0");
    // Aligned: every value starts in the same column.
    let starts: Vec<usize> = info
        .lines()
        .map(|line| {
            let after_key = line.find(':').unwrap() + 1;
            after_key + line[after_key..].len() - line[after_key..].trim_start().len()
        })
        .collect();
    assert!(starts.windows(2).all(|w| w[0] == w[1]), "{info}");

    // The name is taken until it is dropped.
    let err = fails(s, &["ns", "create", "tenant-a"], 3);
    assert!(err.contains("namespace_exists"), "{err}");
    assert!(err.contains("cubec ns drop tenant-a"), "{err}");

    let text = ok(s, &["ns", "drop", "tenant-a"]);
    assert!(
        text.starts_with("dropped namespace tenant-a and its 2 cells (lsn "),
        "{text}"
    );
    assert_eq!(ok(s, &["ns", "list"]), "default\n");
    let err = fails(s, &["ns", "info", "tenant-a"], 3);
    assert!(err.contains("no_such_namespace"), "{err}");
    assert!(err.contains("cubec ns list"), "{err}");
    let err = fails(s, &["get", "tenant-a", "1,0,0"], 3);
    assert!(err.contains("no_such_namespace"), "{err}");
    // No silent auto-creation by a write either.
    let err = fails(s, &["put", "tenant-a", "1,0,0", "x"], 3);
    assert!(err.contains("no_such_namespace"), "{err}");
    assert_eq!(ok(s, &["ns", "list"]), "default\n");

    // Reused: a new, empty namespace with none of the old one's settings.
    let text = ok(s, &["ns", "create", "tenant-a", "--curve", "morton"]);
    assert_eq!(field(&text, "curve"), "morton");
    assert_eq!(field(&text, "cells"), "0 (no quota)");
    assert_exit(&cubec(s, &["get", "tenant-a", "1,0,0"]), 1);
    assert!(
        ok(s, &["edges", "tenant-a", "1,0,0"]).is_empty(),
        "the old namespace's edges came back"
    );

    // Creates and drops are durable: they survive kill -9.
    ok(s, &["put", "tenant-a", "5,5,5", "kept"]);
    ok(s, &["ns", "create", "gone"]);
    ok(s, &["ns", "drop", "gone"]);
    daemon.kill9().unwrap();
    daemon.restart().unwrap();
    assert_eq!(ok(s, &["ns", "list"]), "default\ntenant-a\n");
    assert_eq!(ok(s, &["get", "tenant-a", "5,5,5"]), "kept");
    assert_eq!(
        field(&ok(s, &["ns", "info", "tenant-a"]), "curve"),
        "morton"
    );
}

#[test]
fn writes_over_a_quota_exit_3_naming_the_quota_and_apply_nothing() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let s = daemon.socket();

    ok(s, &["ns", "create", "q", "--max-cells", "2"]);
    ok(s, &["put", "q", "0,0,0", "a"]);
    ok(s, &["put", "q", "1,0,0", "b"]);
    let err = fails(s, &["put", "q", "2,0,0", "c"], 3);
    assert!(err.contains("quota_exceeded"), "{err}");
    assert!(names_quota(&err, "max-cells"), "{err}");
    assert!(err.contains('2'), "the limit is named: {err}");
    assert!(err.contains("cubec ns info"), "says what to do next: {err}");
    assert_exit(&cubec(s, &["get", "q", "2,0,0"]), 1);
    assert_eq!(
        field(&ok(s, &["ns", "info", "q"]), "cells"),
        "2 of 2 (100.0%)"
    );
    // Overwriting and deleting never grow the namespace: still allowed.
    ok(s, &["put", "q", "0,0,0", "a2"]);
    ok(s, &["del", "q", "1,0,0"]);
    ok(s, &["put", "q", "2,0,0", "c"]);

    ok(s, &["ns", "create", "qb", "--max-bytes", "10"]);
    ok(s, &["put", "qb", "0,0,0", "12345678"]);
    let err = fails(s, &["put", "qb", "1,0,0", "12345"], 3);
    assert!(err.contains("quota_exceeded"), "{err}");
    assert!(names_quota(&err, "max-bytes"), "{err}");
    assert_exit(&cubec(s, &["get", "qb", "1,0,0"]), 1);
    assert_eq!(
        field(&ok(s, &["ns", "info", "qb"]), "bytes"),
        "8 of 10 (80.0%)"
    );

    ok(s, &["ns", "create", "qe", "--max-edges", "1"]);
    ok(s, &["link", "qe", "0,0,0", "1,0,0"]);
    let err = fails(s, &["link", "qe", "0,0,0", "2,0,0"], 3);
    assert!(err.contains("quota_exceeded"), "{err}");
    assert!(names_quota(&err, "max-edges"), "{err}");
    assert_eq!(ok(s, &["edges", "qe", "0,0,0"]).lines().count(), 1);

    // The JSON of a full namespace shows the same use.
    let json = ok(s, &["--json", "ns", "info", "qe"]);
    assert_eq!(json_number(&json, "edges"), 1);
    assert_eq!(json_number(&json, "max_edges"), 1);
}

#[test]
fn json_output_shapes() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let s = daemon.socket();
    let uid = own_uid();

    let json = ok(
        s,
        &[
            "--json",
            "ns",
            "create",
            "j",
            "--curve",
            "morton",
            "--max-edges",
            "5",
        ],
    );
    assert_eq!(json.lines().count(), 1, "{json}");
    let id = json_number(&json, "id");
    assert_eq!(
        json,
        format!(
            "{{\"name\":\"j\",\"id\":{id},\"curve\":\"morton\",\"encrypted\":false,\
             \"owner_uid\":{uid},\"cells\":0,\"bytes\":0,\"edges\":0,\"programs\":0,\
             \"max_cells\":null,\"max_bytes\":null,\"max_edges\":5,\"grants\":[]}}\n"
        )
    );
    assert_eq!(
        ok(s, &["--json", "ns", "list"]),
        "{\"namespaces\":[\"default\",\"j\"]}\n"
    );

    ok(s, &["put", "j", "0,0,0", "xyz"]);
    ok(s, &["prog", "j", "0,0,0", "return 1"]);
    let json = ok(s, &["--json", "ns", "info", "j"]);
    assert_eq!(
        json,
        format!(
            "{{\"name\":\"j\",\"id\":{id},\"curve\":\"morton\",\"encrypted\":false,\
             \"owner_uid\":{uid},\"cells\":1,\"bytes\":75,\"edges\":0,\"programs\":1,\
             \"max_cells\":null,\"max_bytes\":null,\"max_edges\":5,\"grants\":[]}}\n"
        )
    );

    let json = ok(
        s,
        &["--json", "ns", "grant", "j", "--uid", "4242", "--read-only"],
    );
    assert!(
        json.ends_with(",\"grants\":[{\"uid\":4242,\"read_only\":true}]}\n"),
        "{json}"
    );
    let json = ok(s, &["--json", "ns", "grant", "j", "--uid", "4243"]);
    assert!(
        json.ends_with(
            ",\"grants\":[{\"uid\":4242,\"read_only\":true},{\"uid\":4243,\"read_only\":false}]}\n"
        ),
        "{json}"
    );
    let info = ok(s, &["ns", "info", "j"]);
    assert_eq!(
        field(&info, "grants"),
        "uid 4242 read-only, uid 4243 read-write"
    );
    let text = ok(s, &["ns", "revoke", "j", "--uid", "4243"]);
    assert_eq!(text, "revoked uid 4243's access to j\n");
    let json = ok(s, &["--json", "ns", "revoke", "j", "--uid", "4242"]);
    assert!(json.ends_with(",\"grants\":[]}\n"), "{json}");

    let json = ok(s, &["--json", "ns", "drop", "j"]);
    let lsn = json_number(&json, "lsn");
    assert!(lsn > 0, "{json}");
    assert_eq!(
        json,
        format!("{{\"name\":\"j\",\"dropped\":true,\"cells\":1,\"lsn\":{lsn}}}\n")
    );
    assert_eq!(
        ok(s, &["--json", "ns", "list"]),
        "{\"namespaces\":[\"default\"]}\n"
    );
}

#[test]
fn bad_names_are_refused_before_anything_is_sent() {
    // No daemon at all: a usage error (2), not a connect error (4), proves
    // the name was checked before connecting.
    let dir = tempfile::tempdir().unwrap();
    let nowhere = dir.path().join("no.sock");
    for (args, says) in [
        (&["ns", "create", "Tenant"][..], "only a-z"),
        (&["ns", "info", "a b"], "only a-z"),
        (&["ns", "drop", ""], "1 to 64"),
        (&["ns", "grant", "x.y", "--uid", "5"], "only a-z"),
        (&["ns", "create", "t", "--max-bytes", "lots"], "512M or 1G"),
        (&["ns", "create", "t", "--curve", "peano"], "hilbert"),
    ] {
        let err = fails(&nowhere, args, 2);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let long = "n".repeat(65);
    let err = fails(&nowhere, &["ns", "create", &long], 2);
    assert!(err.contains("1 to 64"), "{err}");
}

#[test]
fn encrypted_namespace_without_a_key_file_says_how_to_get_one() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let s = daemon.socket();
    let err = fails(s, &["ns", "create", "secret", "--encrypted"], 3);
    assert!(err.contains("encryption_unavailable"), "{err}");
    assert!(err.contains("--key-file"), "{err}");
    assert_eq!(ok(s, &["ns", "list"]), "default\n", "nothing was created");
}

/// An unprivileged uid for the second client. The test process is root in
/// CI; elsewhere this test can only check that it is not.
const OTHER_UID: u32 = 65534;

#[test]
fn a_second_uid_sees_only_what_it_was_granted() {
    if own_uid() != 0 {
        eprintln!("not root: cannot run cubec under a second uid; skipping");
        return;
    }
    // A directory the other uid can reach, and a socket it may connect to.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = dir.path().join("cubed.sock");
    let other = OTHER_UID.to_string();
    let daemon = LocalDaemon::start_in(
        &dir.path().join("data"),
        &socket,
        &["--socket-mode", "666", "--allow-uid", &other],
    )
    .unwrap();
    let s = daemon.socket();
    ok(s, &["ns", "create", "private"]);
    ok(s, &["ns", "create", "shared"]);
    ok(s, &["put", "shared", "0,0,0", "for everyone"]);
    ok(s, &["put", "private", "0,0,0", "secret"]);
    ok(
        s,
        &["ns", "grant", "shared", "--uid", &other, "--read-only"],
    );

    let as_other = |args: &[&str]| cubec_as(s, args, Some(OTHER_UID));

    let out = as_other(&["ns", "list"]);
    assert_exit(&out, 0);
    let listed = stdout(&out);
    assert!(listed.lines().any(|l| l == "shared"), "{listed}");
    assert!(!listed.lines().any(|l| l == "private"), "{listed}");

    // Reads under a read-only grant work; writes are refused with advice.
    let out = as_other(&["get", "shared", "0,0,0"]);
    assert_exit(&out, 0);
    assert_eq!(stdout(&out), "for everyone");
    let out = as_other(&["put", "shared", "0,0,0", "mine now"]);
    assert_exit(&out, 3);
    let err = stderr(&out);
    assert!(err.contains("permission_denied"), "{err}");
    assert!(err.contains("cubec ns grant"), "{err}");
    assert_eq!(ok(s, &["get", "shared", "0,0,0"]), "for everyone");

    // Administering is for the owner and administrators only.
    for args in [
        &["ns", "drop", "shared"][..],
        &["ns", "grant", "shared", "--uid", &other],
        &["ns", "revoke", "shared", "--uid", &other],
    ] {
        let out = as_other(args);
        assert_exit(&out, 3);
        let err = stderr(&out);
        assert!(err.contains("permission_denied"), "{args:?}: {err}");
        assert!(err.contains("only the owner"), "{args:?}: {err}");
    }

    // Without a grant, a namespace is indistinguishable from a missing one.
    let hidden = as_other(&["ns", "info", "private"]);
    let missing = as_other(&["ns", "info", "nosuch"]);
    assert_exit(&hidden, 3);
    assert_exit(&missing, 3);
    assert_eq!(
        stderr(&hidden).replace("private", "NAME"),
        stderr(&missing).replace("nosuch", "NAME")
    );
    let out = as_other(&["get", "private", "0,0,0"]);
    assert_exit(&out, 3);
    assert!(
        stderr(&out).contains("no_such_namespace"),
        "{}",
        stderr(&out)
    );
}
