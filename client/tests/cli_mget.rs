//! Guards `cubec mget`'s contract with scripts against a real `cubed`: one `x,y,z<TAB>value` line per coordinate in request order (duplicates too) with escaped values and `\N` for an empty cell, exact bytes in `--json`, coordinates from stdin with `-`, exit 1 when a cell is empty and 3 for a missing namespace, like `cubec get`.
#![allow(clippy::unwrap_used)]

mod support;

use cube_client::{Coord, LocalDaemon, base64};
use support::{assert_exit, cubec, cubec_with_stdin, stderr, stdout};

/// A daemon with text at 1,-2,3, binary bytes at -1,0,7 and an empty value
/// at 0,0,0.
fn daemon_with_cells() -> LocalDaemon {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut client = daemon.client().unwrap();
    client
        .put("default", Coord::new(1, -2, 3), b"hello")
        .unwrap();
    client
        .put("default", Coord::new(-1, 0, 7), b"a\tb\nc\\\x00\xff")
        .unwrap();
    client.put("default", Coord::new(0, 0, 0), b"").unwrap();
    daemon
}

#[test]
fn prints_one_line_per_coordinate_in_request_order() {
    let daemon = daemon_with_cells();
    let out = cubec(
        daemon.socket(),
        &["mget", "default", "-1,0,7", "1,-2,3", "0,0,0", "1,-2,3"],
    );
    assert_exit(&out, 0);
    assert_eq!(
        stdout(&out),
        "-1,0,7\ta\\tb\\nc\\\\\\x00\\xff\n1,-2,3\thello\n0,0,0\t\n1,-2,3\thello\n"
    );
    assert_eq!(stderr(&out), "");
}

#[test]
fn an_empty_cell_prints_the_marker_and_exits_1() {
    let daemon = daemon_with_cells();
    let out = cubec(
        daemon.socket(),
        &["mget", "default", "1,-2,3", "9,9,9", "0,0,0"],
    );
    assert_exit(&out, 1);
    assert_eq!(stdout(&out), "1,-2,3\thello\n9,9,9\t\\N\n0,0,0\t\n");
    assert!(stderr(&out).contains("1 of 3 cells"), "{}", stderr(&out));
}

#[test]
fn json_gives_one_object_per_line_with_exact_bytes() {
    let daemon = daemon_with_cells();
    let out = cubec(
        daemon.socket(),
        &["--json", "mget", "default", "1,-2,3", "-1,0,7", "9,9,9"],
    );
    assert_exit(&out, 1);
    let lines: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(
        lines[0],
        serde_json::json!({
            "coord": [1, -2, 3], "found": true, "value": "hello",
            "value_base64": base64::encode(b"hello"),
        })
    );
    assert_eq!(
        lines[1],
        serde_json::json!({
            "coord": [-1, 0, 7], "found": true, "value": null,
            "value_base64": base64::encode(b"a\tb\nc\\\x00\xff"),
        })
    );
    assert_eq!(
        lines[2],
        serde_json::json!({
            "coord": [9, 9, 9], "found": false, "value": null, "value_base64": null,
        })
    );
}

#[test]
fn coordinates_come_from_stdin_with_a_dash() {
    let daemon = daemon_with_cells();
    let out = cubec_with_stdin(
        daemon.socket(),
        &["mget", "default", "0,0,0", "-"],
        b"1,-2,3\n\n -1,0,7 \n",
    );
    assert_exit(&out, 0);
    assert_eq!(
        stdout(&out),
        "0,0,0\t\n1,-2,3\thello\n-1,0,7\ta\\tb\\nc\\\\\\x00\\xff\n"
    );
    // More than one request's worth: read 4096 at a time, in order.
    let input: String = (0..5000).map(|i| format!("{},-2,3\n", i % 2)).collect();
    let out = cubec_with_stdin(daemon.socket(), &["mget", "default", "-"], input.as_bytes());
    assert_exit(&out, 1);
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 5000);
    for (i, line) in lines.iter().enumerate() {
        let expected = if i % 2 == 0 {
            "0,-2,3\t\\N"
        } else {
            "1,-2,3\thello"
        };
        assert_eq!(*line, expected, "line {i}");
    }
    // A bad line is a usage error naming it.
    let out = cubec_with_stdin(daemon.socket(), &["mget", "default", "-"], b"1,2,3\n1,2\n");
    assert_exit(&out, 2);
    assert!(stderr(&out).contains("stdin line 2"), "{}", stderr(&out));
    assert_eq!(stdout(&out), "");
}

#[test]
fn a_missing_namespace_exits_like_get() {
    let daemon = daemon_with_cells();
    let get = cubec(daemon.socket(), &["get", "nope", "1,2,3"]);
    let mget = cubec(daemon.socket(), &["mget", "nope", "1,2,3", "4,5,6"]);
    assert_exit(&get, 3);
    assert_exit(&mget, 3);
    assert_eq!(stderr(&mget), stderr(&get));
    assert_eq!(stdout(&mget), "");
    // Options after the coordinates are a usage error that says where they go.
    let out = cubec(daemon.socket(), &["mget", "default", "1,2,3", "--json"]);
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("options go before the coordinates"),
        "{}",
        stderr(&out)
    );
}
