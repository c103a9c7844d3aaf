//! Guards `cubec scan`'s contract with scripts against a real `cubed`: one `x,y,z<TAB>value` line per cell with escaped values, exact bytes in `--json`, `--count` (also over all of space), `--limit` with a continuation that resumes exactly where it stopped, and clear usage errors for inverted boxes.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeSet;

use cube_client::{Coord, LocalDaemon, base64};
use support::{assert_exit, cubec, stderr, stdout};

/// A daemon holding `v<x>.<y>.<z>` at every cell of -2..=2 x -2..=2 x {0, 1}.
fn daemon_with_cells() -> (LocalDaemon, BTreeSet<String>) {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut client = daemon.client().unwrap();
    let mut lines = BTreeSet::new();
    for x in -2..=2 {
        for y in -2..=2 {
            for z in 0..=1 {
                let value = format!("v{x}.{y}.{z}");
                client
                    .put("default", Coord::new(x, y, z), value.as_bytes())
                    .unwrap();
                lines.insert(format!("{x},{y},{z}\t{value}"));
            }
        }
    }
    (daemon, lines)
}

#[test]
fn prints_one_tab_separated_line_per_cell() {
    let (daemon, all) = daemon_with_cells();
    let out = cubec(daemon.socket(), &["scan", "default", "-1,-2,0", "2,0,0"]);
    assert_exit(&out, 0);
    let got: Vec<String> = stdout(&out).lines().map(str::to_owned).collect();
    let expected: BTreeSet<String> = all
        .iter()
        .filter(|line| {
            let coord = line.split('\t').next().unwrap();
            let c = cube_client::parse_coord(coord).unwrap();
            (-1..=2).contains(&c.x) && (-2..=0).contains(&c.y) && c.z == 0
        })
        .cloned()
        .collect();
    assert_eq!(got.len(), expected.len(), "no cell twice");
    assert_eq!(got.iter().cloned().collect::<BTreeSet<_>>(), expected);
    // Small pages give the same lines in the same (curve) order.
    let paged = cubec(
        daemon.socket(),
        &["scan", "default", "-1,-2,0", "2,0,0", "--page-size", "2"],
    );
    assert_exit(&paged, 0);
    assert_eq!(stdout(&paged), stdout(&out));
}

#[test]
fn binary_values_are_escaped_in_text_and_exact_in_json() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut client = daemon.client().unwrap();
    let value = b"a\tb\nc\\\x00\xff".to_vec();
    client.put("default", Coord::new(7, -7, 0), &value).unwrap();
    let out = cubec(daemon.socket(), &["scan", "default", "0,-10,0", "10,0,0"]);
    assert_exit(&out, 0);
    assert_eq!(stdout(&out), "7,-7,0\ta\\tb\\nc\\\\\\x00\\xff\n");
    let out = cubec(
        daemon.socket(),
        &["--json", "scan", "default", "0,-10,0", "10,0,0"],
    );
    assert_exit(&out, 0);
    let line = stdout(&out);
    assert!(
        line.starts_with("{\"coord\":[7,-7,0],\"value\":null,"),
        "{line}"
    );
    assert!(
        line.contains(&format!("\"value_base64\":\"{}\"", base64::encode(&value))),
        "{line}"
    );
}

#[test]
fn count_works_for_boxes_up_to_all_of_space() {
    let (daemon, all) = daemon_with_cells();
    let out = cubec(
        daemon.socket(),
        &["scan", "default", "0,0,0", "2,2,0", "--count"],
    );
    assert_exit(&out, 0);
    assert_eq!(stdout(&out), "9\n");
    let min = i32::MIN.to_string();
    let max = i32::MAX.to_string();
    let lo = format!("{min},{min},{min}");
    let hi = format!("{max},{max},{max}");
    let out = cubec(daemon.socket(), &["scan", "default", &lo, &hi, "--count"]);
    assert_exit(&out, 0);
    assert_eq!(stdout(&out), format!("{}\n", all.len()));
    let out = cubec(
        daemon.socket(),
        &["--json", "scan", "default", &lo, &hi, "--count"],
    );
    assert_exit(&out, 0);
    assert_eq!(
        stdout(&out),
        format!(
            "{{\"ns\":\"default\",\"lo\":[{min},{min},{min}],\"hi\":[{max},{max},{max}],\"count\":{}}}\n",
            all.len()
        )
    );
}

#[test]
fn limit_stops_early_and_after_resumes_exactly() {
    let (daemon, all) = daemon_with_cells();
    let first = cubec(
        daemon.socket(),
        &["scan", "default", "-2,-2,0", "2,2,1", "--limit", "20"],
    );
    assert_exit(&first, 0);
    assert_eq!(stdout(&first).lines().count(), 20);
    let hint = stderr(&first);
    let resume = hint
        .split("--after ")
        .nth(1)
        .unwrap_or_else(|| panic!("no continuation in {hint:?}"))
        .trim();
    let rest = cubec(
        daemon.socket(),
        &["scan", "default", "-2,-2,0", "2,2,1", "--after", resume],
    );
    assert_exit(&rest, 0);
    assert!(stderr(&rest).is_empty(), "{}", stderr(&rest));
    let mut lines: Vec<String> = stdout(&first).lines().map(str::to_owned).collect();
    lines.extend(stdout(&rest).lines().map(str::to_owned));
    assert_eq!(lines.len(), all.len());
    assert_eq!(lines.into_iter().collect::<BTreeSet<_>>(), all);
    // A limit the box does not reach prints everything and no hint.
    let out = cubec(
        daemon.socket(),
        &["scan", "default", "0,0,0", "0,0,1", "--limit", "5"],
    );
    assert_exit(&out, 0);
    assert_eq!(stdout(&out).lines().count(), 2);
    assert!(stderr(&out).is_empty(), "{}", stderr(&out));
}

#[test]
fn inverted_boxes_and_unknown_namespaces_say_what_to_do() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let out = cubec(daemon.socket(), &["scan", "default", "0,5,0", "9,4,9"]);
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("y0 = 5 is above y1 = 4"),
        "{}",
        stderr(&out)
    );
    assert!(stdout(&out).is_empty());
    let out = cubec(daemon.socket(), &["scan", "nosuch", "0,0,0", "1,1,1"]);
    assert_exit(&out, 3);
    assert!(
        stderr(&out).contains("no such namespace"),
        "{}",
        stderr(&out)
    );
    let empty = cubec(daemon.socket(), &["scan", "default", "0,0,0", "1,1,1"]);
    assert_exit(&empty, 0);
    assert!(empty.stdout.is_empty());
}
