//! Guards `cubec step` (and `Client::step`) against a real `cubed`: every program in the box runs once, all reading the state from before the step, a failed run applies nothing while the others' writes stand (exit 3, the first failure named), an empty box runs nothing, an inverted box is a clear usage error, and too many programs run none.
#![allow(clippy::unwrap_used)]

mod support;

use cube_client::{BatchOp, Client, ClientError, Coord, ErrorCode, LocalDaemon, RunOutcome};
use support::{assert_exit, cubec, stderr, stdout};

#[track_caller]
fn assert_contains(text: &str, needle: &str) {
    assert!(text.contains(needle), "{needle:?} not in:\n{text}");
}

fn c(x: i32, y: i32, z: i32) -> Coord {
    Coord::new(x, y, z)
}

fn start() -> (LocalDaemon, Client) {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let client = daemon.client().unwrap();
    (daemon, client)
}

fn value(client: &mut Client, at: Coord) -> Option<String> {
    client
        .get("default", at)
        .unwrap()
        .map(|v| String::from_utf8(v).unwrap())
}

/// `(runs, failures)` of a cell's telemetry.
fn runs(client: &mut Client, at: Coord) -> (u64, u64) {
    let stats = client.cell_stats("default", at, 0).unwrap();
    (stats.runs, stats.failures)
}

const COUNTER: &[u8] = b"return cube.rincr(0, 0, 0, tonumber((...)) or 1)";

#[test]
fn every_program_in_the_box_runs_once() {
    let (daemon, mut client) = start();
    for x in 0..3 {
        client.prog("default", c(x, 0, 0), COUNTER).unwrap();
    }
    // Outside the box: must not run.
    client.prog("default", c(5, 0, 0), COUNTER).unwrap();

    let out = cubec(daemon.socket(), &["step", "default", "0,0,0", "2,0,0"]);
    assert_exit(&out, 0);
    let text = stdout(&out);
    assert_contains(
        &text,
        "ran 3 programs in default 0,0,0..2,0,0: 3 ok, 0 failed, 3 cells written",
    );
    assert_contains(&text, "(lsn ");
    assert!(!text.contains("first failure"), "{text}");
    assert!(stderr(&out).is_empty(), "{}", stderr(&out));
    for x in 0..3 {
        assert_eq!(
            value(&mut client, c(x, 0, 0)).as_deref(),
            Some("1"),
            "x={x}"
        );
        assert_eq!(runs(&mut client, c(x, 0, 0)), (1, 0), "x={x}");
    }
    assert_eq!(value(&mut client, c(5, 0, 0)), None);
    assert_eq!(runs(&mut client, c(5, 0, 0)), (0, 0));

    // The same ARG reaches every program; the telemetry shows the second run.
    let out = cubec(
        daemon.socket(),
        &["--json", "step", "default", "0,0,0", "2,0,0", "5"],
    );
    assert_exit(&out, 0);
    let json = stdout(&out);
    assert_contains(
        &json,
        "{\"ns\":\"default\",\"lo\":[0,0,0],\"hi\":[2,0,0],\"lsn\":",
    );
    assert_contains(
        &json,
        "\"programs\":3,\"ok\":3,\"failed\":0,\"cells_written\":3,\"instructions\":",
    );
    assert!(
        json.trim_end().ends_with("\"first_failure\":null}"),
        "{json}"
    );
    assert_eq!(json.lines().count(), 1, "{json}");
    for x in 0..3 {
        assert_eq!(
            value(&mut client, c(x, 0, 0)).as_deref(),
            Some("6"),
            "x={x}"
        );
    }
    let stats = cubec(daemon.socket(), &["--json", "stats", "default", "1,0,0"]);
    assert_exit(&stats, 0);
    assert_contains(&stdout(&stats), "\"runs\":2,\"failures\":0");
}

#[test]
fn every_run_reads_the_state_from_before_the_step() {
    let (daemon, mut client) = start();
    // Three programs bump one shared counter outside the box. Run one after
    // another they would leave 3; each reading the state from before the
    // step, they all write 1, whatever the curve order.
    for x in 0..3 {
        client
            .prog("default", c(x, 0, 0), b"return cube.incr(10, 0, 0)")
            .unwrap();
    }
    assert_exit(
        &cubec(daemon.socket(), &["step", "default", "0,0,0", "2,0,0"]),
        0,
    );
    assert_eq!(value(&mut client, c(10, 0, 0)).as_deref(), Some("1"));
    assert_exit(
        &cubec(daemon.socket(), &["step", "default", "0,0,0", "2,0,0"]),
        0,
    );
    assert_eq!(value(&mut client, c(10, 0, 0)).as_deref(), Some("2"));

    // A shift along a row: each program copies its cell's value one cell to
    // the right. Synchronously, every value moves exactly one cell.
    for (x, v) in [(0, "a"), (1, "b"), (2, "c")] {
        client.put("default", c(x, 1, 0), v.as_bytes()).unwrap();
        client
            .prog(
                "default",
                c(x, 1, 0),
                b"local v = cube.rget(0, 0, 0); if v then cube.rput(1, 0, 0, v) end",
            )
            .unwrap();
    }
    let out = cubec(daemon.socket(), &["step", "default", "0,1,0", "2,1,0"]);
    assert_exit(&out, 0);
    assert_contains(&stdout(&out), "3 ok, 0 failed, 3 cells written");
    let row: Vec<Option<String>> = (0..4).map(|x| value(&mut client, c(x, 1, 0))).collect();
    assert_eq!(
        row,
        [Some("a"), Some("a"), Some("b"), Some("c")].map(|v| v.map(str::to_owned))
    );
}

#[test]
fn a_run_does_not_see_its_own_writes_either() {
    // docs/protocol.md 6.7: every run reads the state from before the step,
    // its own writes included; a later write to the same cell wins.
    let (daemon, mut client) = start();
    client
        .prog(
            "default",
            c(0, 0, 0),
            b"cube.rincr(1, 0, 0); return cube.rincr(1, 0, 0)",
        )
        .unwrap();
    assert_exit(
        &cubec(daemon.socket(), &["step", "default", "0,0,0", "0,0,0"]),
        0,
    );
    assert_eq!(value(&mut client, c(1, 0, 0)).as_deref(), Some("1"));
}

#[test]
fn each_run_has_its_own_cell_and_the_same_arguments() {
    let (daemon, mut client) = start();
    let source = b"cube.put(cube.x, cube.y, cube.z + 1, cube.x .. ':' .. table.concat({...}, '+'))";
    for x in [-1, 0, 1] {
        client.prog("default", c(x, 0, 0), source).unwrap();
    }
    let out = cubec(
        daemon.socket(),
        &["step", "default", "-1,0,0", "1,0,0", "-a", "b c"],
    );
    assert_exit(&out, 0);
    for x in [-1, 0, 1] {
        assert_eq!(
            value(&mut client, c(x, 0, 1)),
            Some(format!("{x}:-a+b c")),
            "x={x}"
        );
    }
}

#[test]
fn a_failed_run_applies_nothing_and_the_step_exits_3() {
    let (daemon, mut client) = start();
    client
        .prog("default", c(0, 0, 0), b"cube.rput(0, 0, 0, 'a')")
        .unwrap();
    client
        .prog(
            "default",
            c(1, 0, 0),
            b"cube.rput(0, 0, 0, 'b'); error('boom at one')",
        )
        .unwrap();
    client
        .prog("default", c(2, 0, 0), b"cube.rput(0, 0, 0, 'c')")
        .unwrap();

    let out = cubec(daemon.socket(), &["step", "default", "0,0,0", "2,0,0"]);
    assert_exit(&out, 3);
    let text = stdout(&out);
    assert_contains(
        &text,
        "ran 3 programs in default 0,0,0..2,0,0: 2 ok, 1 failed, 2 cells written",
    );
    assert_contains(&text, "first failure: 1,0,0 (seq 1) error: ");
    assert_contains(&text, "boom at one");
    let err = stderr(&out);
    assert_contains(&err, "1 of 3 programs failed");
    assert_contains(&err, "cubec stats default 1,0,0");

    assert_eq!(value(&mut client, c(0, 0, 0)).as_deref(), Some("a"));
    assert_eq!(
        value(&mut client, c(1, 0, 0)),
        None,
        "a failed run applies nothing"
    );
    assert_eq!(value(&mut client, c(2, 0, 0)).as_deref(), Some("c"));
    assert_eq!(runs(&mut client, c(0, 0, 0)), (1, 0));
    assert_eq!(runs(&mut client, c(1, 0, 0)), (1, 1));
    assert_eq!(runs(&mut client, c(2, 0, 0)), (1, 0));
    let stats = client.cell_stats("default", c(1, 0, 0), 1).unwrap();
    assert_eq!(stats.records[0].outcome, RunOutcome::Error);
    assert_contains(&stats.records[0].message, "boom at one");

    // Again as JSON: the same exit code, the failure as an object.
    let out = cubec(
        daemon.socket(),
        &["--json", "step", "default", "0,0,0", "2,0,0"],
    );
    assert_exit(&out, 3);
    let json = stdout(&out);
    assert_contains(
        &json,
        "\"programs\":3,\"ok\":2,\"failed\":1,\"cells_written\":2,",
    );
    assert_contains(
        &json,
        "\"first_failure\":{\"coord\":[1,0,0],\"seq\":2,\"outcome\":\"error\",\"message\":\"",
    );
    assert_contains(&json, "boom at one");
    assert_eq!(runs(&mut client, c(1, 0, 0)), (2, 2));

    // The library reports the same, as a reply rather than an error.
    let reply = client.step("default", c(0, 0, 0), c(2, 0, 0), &[]).unwrap();
    assert_eq!((reply.programs, reply.failed), (3, 1));
    let failure = reply.first_failure.unwrap();
    assert_eq!((failure.coord, failure.seq), (c(1, 0, 0), 3));
    assert_eq!(failure.outcome, RunOutcome::Error);
    assert!(reply.lsn > 0);
}

#[test]
fn an_empty_box_runs_nothing() {
    let (daemon, mut client) = start();
    client.prog("default", c(0, 0, 0), COUNTER).unwrap();
    let out = cubec(
        daemon.socket(),
        &["step", "default", "100,100,100", "101,101,101"],
    );
    assert_exit(&out, 0);
    assert_eq!(
        stdout(&out),
        "no program in default 100,100,100..101,101,101; nothing ran\n"
    );
    let out = cubec(
        daemon.socket(),
        &["--json", "step", "default", "100,100,100", "101,101,101"],
    );
    assert_exit(&out, 0);
    assert_eq!(
        stdout(&out),
        "{\"ns\":\"default\",\"lo\":[100,100,100],\"hi\":[101,101,101],\"lsn\":0,\
         \"programs\":0,\"ok\":0,\"failed\":0,\"cells_written\":0,\"instructions\":0,\
         \"first_failure\":null}\n"
    );
    assert_eq!(runs(&mut client, c(0, 0, 0)), (0, 0));
}

#[test]
fn an_inverted_box_is_a_clear_error() {
    let (daemon, mut client) = start();
    client.prog("default", c(0, 0, 0), COUNTER).unwrap();
    let out = cubec(daemon.socket(), &["step", "default", "0,5,0", "1,4,1"]);
    assert_exit(&out, 2);
    assert!(out.stdout.is_empty(), "{}", stdout(&out));
    let err = stderr(&out);
    assert_contains(&err, "y0 = 5 is above y1 = 4");
    assert_contains(&err, "cubec help step");

    // Past the client's own check, the server refuses it too.
    match client.step("default", c(1, 0, 0), c(0, 0, 0), &[]) {
        Err(ClientError::Server(e)) => {
            assert_eq!(e.known_code(), Some(ErrorCode::InvalidArgument), "{e}")
        }
        other => panic!("expected invalid_argument, got {other:?}"),
    }
    assert_eq!(runs(&mut client, c(0, 0, 0)), (0, 0));
}

#[test]
fn unknown_namespaces_and_bad_arguments_are_refused() {
    let (daemon, _client) = start();
    let out = cubec(daemon.socket(), &["step", "nosuch", "0,0,0", "1,1,1"]);
    assert_exit(&out, 3);
    let err = stderr(&out);
    assert_contains(&err, "no_such_namespace");
    // What to do, said once (the daemon's message names it already).
    assert_eq!(err.matches("`cubec ns list`").count(), 1, "{err}");

    let out = cubec(daemon.socket(), &["step", "default", "0,0,0"]);
    assert_exit(&out, 2);
    let out = cubec(daemon.socket(), &["step", "default", "0,0", "1,1,1"]);
    assert_exit(&out, 2);
    assert_contains(&stderr(&out), "X,Y,Z");
    let many: Vec<String> = (0..65).map(|i| i.to_string()).collect();
    let mut args = vec!["step", "default", "0,0,0", "1,1,1"];
    args.extend(many.iter().map(String::as_str));
    let out = cubec(daemon.socket(), &args);
    assert_exit(&out, 2);
    assert_contains(&stderr(&out), "65 arguments, over the limit of 64");
}

#[test]
fn too_many_programs_in_the_box_run_none() {
    let (daemon, mut client) = start();
    const LIMIT: i32 = 32_768;
    let mut ops: Vec<BatchOp> = (0..=LIMIT)
        .map(|x| BatchOp::Prog {
            coord: c(x, 0, 0),
            source: COUNTER.to_vec(),
        })
        .collect();
    client.batch("default", &mut ops).unwrap();
    let hi = format!("{LIMIT},0,0");
    let out = cubec(daemon.socket(), &["step", "default", "0,0,0", &hi]);
    assert_exit(&out, 3);
    let err = stderr(&out);
    assert_contains(&err, "limit_exceeded");
    assert!(out.stdout.is_empty(), "{}", stdout(&out));
    for x in [0, LIMIT / 2, LIMIT] {
        assert_eq!(runs(&mut client, c(x, 0, 0)), (0, 0), "x={x}");
        assert_eq!(value(&mut client, c(x, 0, 0)), None, "x={x}");
    }
}
