//! Guards the edge commands' contract with scripts against a real `cubed`: `cubec link/unlink/edges/walk/path` and `del --detach` print the documented lines and JSON, exit 1 for a missing edge or no path, 2 for a bad weight or label (before sending), 3 for a walk past the daemon's limits, and say on stderr when a walk stops early.
#![allow(clippy::unwrap_used)]

mod support;

use std::path::Path;

use cube_client::LocalDaemon;
use support::{assert_exit, cubec, stderr, stdout};

#[track_caller]
fn ok(socket: &Path, args: &[&str]) -> String {
    let out = cubec(socket, args);
    assert_exit(&out, 0);
    stdout(&out)
}

#[test]
fn link_edges_walk_path_and_detach() {
    let daemon = LocalDaemon::start_fresh(&["--max-walk-depth", "8"]).unwrap();
    let s = daemon.socket();
    // A square 0,0,0 -> 1,0,0 -> 1,1,0 and a costly diagonal.
    let text = ok(s, &["link", "default", "0,0,0", "1,0,0"]);
    assert!(
        text.starts_with("linked default 0,0,0 -> 1,0,0, weight 1"),
        "{text}"
    );
    ok(
        s,
        &[
            "link", "default", "1,0,0", "1,1,0", "--label", "road", "--weight", "2",
        ],
    );
    ok(s, &["link", "default", "0,0,0", "1,1,0", "--weight", "5"]);
    let text = ok(s, &["link", "default", "0,0,0", "1,1,0", "--weight", "4"]);
    assert!(text.starts_with("updated"), "{text}");
    let json = ok(
        s,
        &[
            "--json", "link", "default", "-1,0,0", "0,0,0", "--label", "a\tb",
        ],
    );
    assert_eq!(
        json.trim_end(),
        format!(
            "{{\"ns\":\"default\",\"from\":[-1,0,0],\"to\":[0,0,0],\"label\":\"a\\tb\",\
             \"weight\":1.0,\"created\":true,\"lsn\":{}}}",
            json.split("\"lsn\":")
                .nth(1)
                .unwrap()
                .trim_end()
                .trim_end_matches('}')
        )
    );
    ok(s, &["put", "default", "1,1,0", "corner"]);

    // edges: outgoing first, tab-separated, labels escaped.
    let text = ok(s, &["edges", "default", "0,0,0"]);
    let mut lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(lines.pop(), Some("in\t-1,0,0\ta\\tb\t1"));
    lines.sort();
    assert_eq!(lines, ["out\t1,0,0\t\t1", "out\t1,1,0\t\t4"]);
    assert_eq!(
        ok(s, &["edges", "default", "1,0,0", "--out"]),
        "out\t1,1,0\troad\t2\n"
    );
    assert_eq!(ok(s, &["edges", "default", "7,7,7"]), "");
    let json = ok(s, &["--json", "edges", "default", "1,0,0", "--in"]);
    assert_eq!(
        json,
        "{\"ns\":\"default\",\"coord\":[1,0,0],\"edges\":[{\"direction\":\"in\",\
         \"other\":[0,0,0],\"label\":\"\",\"weight\":1.0}]}\n"
    );

    // walk: nearest first, start not listed, values as a third field.
    let text = ok(s, &["walk", "default", "-1,0,0", "--values"]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "0,0,0\t1");
    let mut rest = lines[1..].to_vec();
    rest.sort();
    assert_eq!(rest, ["1,0,0\t2", "1,1,0\t2\tcorner"]);
    assert_eq!(
        ok(s, &["walk", "default", "-1,0,0", "--depth", "1"]),
        "0,0,0\t1\n"
    );
    assert_eq!(
        ok(s, &["walk", "default", "1,1,0", "--in", "--label", "road"]),
        "1,0,0\t1\n"
    );
    let out = cubec(s, &["walk", "default", "-1,0,0", "--max-nodes", "1"]);
    assert_exit(&out, 0);
    assert_eq!(stdout(&out), "0,0,0\t1\n");
    assert!(stderr(&out).contains("stopped early"), "{}", stderr(&out));
    let json = ok(s, &["--json", "walk", "default", "1,0,0"]);
    assert!(
        json.starts_with(
            "{\"ns\":\"default\",\"start\":[1,0,0],\"stop\":\"complete\",\"edges_examined\":"
        ),
        "{json}"
    );
    assert!(
        json.ends_with("\"nodes\":[{\"coord\":[1,1,0],\"distance\":1}]}\n"),
        "{json}"
    );
    assert_eq!(
        ok(s, &["walk", "default", "9,9,9"]),
        "",
        "no edges: empty, exit 0"
    );

    // path: the cheaper two-hop route, then bounds and no path.
    assert_eq!(
        ok(s, &["path", "default", "0,0,0", "1,1,0"]),
        "0,0,0 -> 1,0,0 -> 1,1,0 (cost 3, 2 hops)\n"
    );
    assert_eq!(
        ok(s, &["path", "default", "0,0,0", "1,1,0", "--label", ""]),
        "0,0,0 -> 1,1,0 (cost 4, 1 hop)\n"
    );
    let out = cubec(
        s,
        &["path", "default", "0,0,0", "1,1,0", "--max-cost", "2.5"],
    );
    assert_exit(&out, 1);
    assert!(stderr(&out).contains("no path"), "{}", stderr(&out));
    let json = ok(s, &["--json", "path", "default", "0,0,0", "1,1,0"]);
    assert!(
        json.contains("\"found\":true,\"cost\":3.0,\"coords\":[[0,0,0],[1,0,0],[1,1,0]]"),
        "{json}"
    );

    // unlink: exit 1 when there is no such edge.
    let out = cubec(
        s,
        &["unlink", "default", "0,0,0", "1,1,0", "--label", "road"],
    );
    assert_exit(&out, 1);
    assert_eq!(
        ok(s, &["unlink", "default", "0,0,0", "1,1,0"]),
        "unlinked default 0,0,0 -> 1,1,0\n"
    );

    // del keeps edges; del --detach removes value and edges together.
    ok(s, &["del", "default", "1,1,0"]);
    assert_eq!(
        ok(s, &["edges", "default", "1,1,0"]),
        "in\t1,0,0\troad\t2\n"
    );
    assert_eq!(
        ok(s, &["--json", "del", "default", "1,0,0", "--detach"]),
        "{\"ns\":\"default\",\"coord\":[1,0,0],\"existed\":false,\"edges_removed\":2}\n"
    );
    assert_eq!(ok(s, &["edges", "default", "1,1,0"]), "");
    let out = cubec(s, &["del", "default", "1,0,0", "--detach"]);
    assert_exit(&out, 1);
    assert!(stderr(&out).contains("nothing deleted"), "{}", stderr(&out));
}

#[test]
fn bad_input_exit_codes() {
    let daemon = LocalDaemon::start_fresh(&["--max-walk-depth", "8"]).unwrap();
    let s = daemon.socket();
    for weight in ["-1", "NaN", "inf"] {
        let out = cubec(
            s,
            &["link", "default", "0,0,0", "1,0,0", "--weight", weight],
        );
        assert_exit(&out, 2);
        assert!(stderr(&out).contains("weight"), "{}", stderr(&out));
    }
    let out = cubec(s, &["walk", "default", "0,0,0", "--depth", "9"]);
    assert_exit(&out, 3);
    let err = stderr(&out);
    assert!(
        err.contains("limit_exceeded") && err.contains("--max-walk-depth"),
        "{err}"
    );
    let out = cubec(s, &["link", "nosuch", "0,0,0", "1,0,0"]);
    assert_exit(&out, 3);
    let help = stdout(&cubec(s, &["walk", "--help"]));
    assert!(
        help.contains("cubec walk default 0,0,0 --depth 3"),
        "{help}"
    );
}
