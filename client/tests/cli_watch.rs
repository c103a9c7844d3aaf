//! Guards `cubec watch`'s and `cubec scan --lsn`'s contract with scripts against a real `cubed`: the scan says the LSN its cells are at (`{"lsn":N}` first with `--json`), and a watch asked for history the log no longer holds exits 3 saying how to resync.
#![allow(clippy::unwrap_used)]

mod support;

use cube_client::{Coord, LocalDaemon};
use support::{assert_exit, cubec, stderr, stdout};

#[test]
fn scan_says_its_lsn_and_a_watch_of_folded_history_exits_3_with_the_way_on() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut client = daemon.client().unwrap();
    let mut last = 0;
    for x in 0..3 {
        last = client.put("default", Coord::new(x, 0, 0), b"v").unwrap();
    }
    let out = cubec(
        daemon.socket(),
        &["--json", "scan", "default", "0,0,0", "9,0,0", "--lsn"],
    );
    assert_exit(&out, 0);
    let text = stdout(&out);
    let first = text.lines().next().unwrap();
    assert_eq!(first, format!("{{\"lsn\":{last}}}"));
    assert_eq!(text.lines().count(), 4, "{text}");
    let out = cubec(
        daemon.socket(),
        &["scan", "default", "0,0,0", "9,0,0", "--lsn"],
    );
    assert_exit(&out, 0);
    assert!(
        stderr(&out).contains(&format!("--from {}", last + 1)),
        "{}",
        stderr(&out)
    );

    client.checkpoint(false).unwrap();
    let out = cubec(
        daemon.socket(),
        &["watch", "default", "0,0,0", "9,0,0", "--from", "1"],
    );
    assert_exit(&out, 3);
    let err = stderr(&out);
    assert!(
        err.contains("no longer holds") && err.contains("scan --lsn"),
        "{err}"
    );
    let out = cubec(
        daemon.socket(),
        &["watch", "default", "0,0,0", "9,0,0", "--from", "0"],
    );
    assert_exit(&out, 2);
}
