//! Guards `watch` end to end on a real `cubed`: every acknowledged write inside the box is delivered exactly once and in LSN order, also across a `kill -9` with the watcher resuming `--from` its last LSN; the box's faces and corners are inside and one step out is not; a program's writes arrive as one group; history folded away and a watcher past its buffer both end in a resync naming the LSN to go on from; a namespace the peer may not read answers as a missing one; an encrypted namespace's history replays.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use cube_client::{
    CellBox, Client, ClientError, Coord, ErrorCode, LocalDaemon, NamespaceName, NamespaceSpec,
    ResyncReason, WatchChange, WatchGroup, WatchOp,
};

/// Only catches a hang; every wait in these tests ends on an event.
const HANG: Duration = Duration::from_secs(60);

fn c(x: i32, y: i32, z: i32) -> Coord {
    Coord::new(x, y, z)
}

fn region(lo: Coord, hi: Coord) -> CellBox {
    CellBox::new(lo, hi).unwrap()
}

/// A watch that fails the test instead of hanging.
fn watch(client: Client, ns: &str, lo: Coord, hi: Coord, from: Option<u64>) -> cube_client::Watch {
    let mut w = client.watch(ns, region(lo, hi), from).unwrap();
    w.set_timeout(Some(HANG)).unwrap();
    w
}

/// Reads groups until one reaches `lsn`.
fn groups_through(w: &mut cube_client::Watch, lsn: u64) -> Vec<WatchGroup> {
    let mut groups = Vec::new();
    while groups
        .last()
        .is_none_or(|g: &WatchGroup| g.last_lsn() < lsn)
    {
        groups.push(w.next().unwrap().unwrap());
    }
    groups
}

fn changes(groups: &[WatchGroup]) -> Vec<WatchChange> {
    groups.iter().flat_map(|g| g.changes.clone()).collect()
}

/// Acknowledged puts: LSN to coordinate and value.
type Acked = Arc<Mutex<BTreeMap<u64, (Coord, Vec<u8>)>>>;

#[test]
fn every_acknowledged_write_in_the_box_arrives_once_in_order_across_kill9() {
    // Small segments so the log spans several; no fold removes them.
    let mut daemon = LocalDaemon::start_fresh(&["--wal-segment-bytes", "65536"]).unwrap();
    let lo = c(0, 0, 0);
    let hi = c(9, 9, 9);
    let acked: Acked = Arc::default();
    let seen: Arc<Mutex<Vec<WatchChange>>> = Arc::default();
    let watcher = {
        let w = watch(daemon.client().unwrap(), "default", lo, hi, None);
        let seen = Arc::clone(&seen);
        thread::spawn(move || {
            for group in w {
                match group {
                    Ok(group) => seen.lock().unwrap().extend(group.changes),
                    Err(_) => return,
                }
            }
        })
    };
    let writing = Arc::new(AtomicBool::new(true));
    let writer = |client: Client, seed: i32| {
        let acked = Arc::clone(&acked);
        let writing = Arc::clone(&writing);
        thread::spawn(move || {
            let mut client = client;
            let mut i = 0i32;
            while writing.load(Ordering::SeqCst) {
                // Every third write outside the box, every fifth a delete.
                let coord = c((i + seed) % 12, (i / 12) % 10, seed % 10);
                let value = format!("{seed}-{i}").into_bytes();
                let result = if i % 5 == 4 {
                    client.del("default", coord).map(|_| None)
                } else {
                    client.put("default", coord, &value).map(Some)
                };
                match result {
                    Ok(Some(lsn)) => {
                        acked.lock().unwrap().insert(lsn, (coord, value));
                    }
                    Ok(None) => {}
                    Err(_) => return,
                }
                i += 1;
            }
        })
    };
    let writers: Vec<_> = (0..3)
        .map(|seed| writer(daemon.client().unwrap(), seed))
        .collect();
    let started = Instant::now();
    while acked.lock().unwrap().len() < 600 {
        assert!(started.elapsed() < HANG, "writers stalled");
        thread::yield_now();
    }
    daemon.kill9().unwrap();
    for w in writers {
        w.join().unwrap();
    }
    watcher.join().unwrap();
    daemon.restart().unwrap();

    // Resume from the last LSN seen, then write some more.
    let last_seen = seen.lock().unwrap().last().map_or(0, |c| c.lsn);
    let mut w = watch(
        daemon.client().unwrap(),
        "default",
        lo,
        hi,
        Some(last_seen + 1),
    );
    let mut client = daemon.client().unwrap();
    let mut last = 0;
    for i in 0..50 {
        let coord = c(i % 10, 9, 9);
        let value = format!("after-{i}").into_bytes();
        last = client.put("default", coord, &value).unwrap();
        acked.lock().unwrap().insert(last, (coord, value));
    }
    seen.lock()
        .unwrap()
        .extend(changes(&groups_through(&mut w, last)));

    let seen = seen.lock().unwrap();
    let lsns: Vec<u64> = seen.iter().map(|c| c.lsn).collect();
    assert!(
        lsns.windows(2).all(|p| p[0] < p[1]),
        "LSNs not strictly increasing (a duplicate or reordering): {lsns:?}"
    );
    let inside = region(lo, hi);
    assert!(
        seen.iter().all(|c| inside.contains(c.coord)),
        "a write outside the box came"
    );
    let by_lsn: BTreeMap<u64, &WatchChange> = seen.iter().map(|c| (c.lsn, c)).collect();
    let first_watched = *lsns.first().unwrap();
    for (lsn, (coord, value)) in acked.lock().unwrap().iter() {
        if !inside.contains(*coord) || *lsn < first_watched {
            continue;
        }
        let change = by_lsn
            .get(lsn)
            .unwrap_or_else(|| panic!("acknowledged write at LSN {lsn} ({coord}) never delivered"));
        assert_eq!(change.coord, *coord);
        assert_eq!(change.op, WatchOp::Put(value.clone()), "LSN {lsn}");
    }
}

#[test]
fn the_boxs_faces_and_corners_are_inside_and_one_step_out_is_not() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let boxes = [
        (c(-5, 0, 10), c(5, 3, 12)),
        (c(i32::MAX - 1, i32::MIN, -1), c(i32::MAX, i32::MIN + 1, 0)),
    ];
    for (lo, hi) in boxes {
        let mut w = watch(daemon.client().unwrap(), "default", lo, hi, None);
        let mut client = daemon.client().unwrap();
        let mut expected = Vec::new();
        let mut last = 0;
        for x in [lo.x, hi.x] {
            for y in [lo.y, hi.y] {
                for z in [lo.z, hi.z] {
                    let corner = c(x, y, z);
                    // One step outward on each axis, where there is room.
                    let outward = |v: i32, low: i32| {
                        if v == low {
                            v.checked_sub(1)
                        } else {
                            v.checked_add(1)
                        }
                    };
                    for out in [
                        outward(x, lo.x).map(|x| c(x, y, z)),
                        outward(y, lo.y).map(|y| c(x, y, z)),
                        outward(z, lo.z).map(|z| c(x, y, z)),
                    ]
                    .into_iter()
                    .flatten()
                    {
                        client.put("default", out, b"out").unwrap();
                    }
                    last = client.put("default", corner, b"in").unwrap();
                    expected.push((last, corner));
                }
            }
        }
        let got: Vec<(u64, Coord)> = changes(&groups_through(&mut w, last))
            .iter()
            .map(|c| (c.lsn, c.coord))
            .collect();
        assert_eq!(got, expected, "box {lo} {hi}");
    }
}

#[test]
fn edges_programs_and_a_runs_writes_arrive_and_a_run_is_one_group() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut w = watch(
        daemon.client().unwrap(),
        "default",
        c(0, 0, 0),
        c(3, 3, 3),
        None,
    );
    let mut client = daemon.client().unwrap();
    let source = b"cube.put(1, 1, 1, 'a') cube.put(2, 2, 2, 'b') cube.put(9, 9, 9, 'out') \
                   cube.put(3, 3, 3, 'c') return 1";
    client.prog("default", c(0, 0, 0), source).unwrap();
    client.run("default", c(0, 0, 0), &[]).unwrap();
    client
        .link("default", c(1, 1, 1), c(9, 9, 9), "road", 2.0)
        .unwrap();
    client
        .link("default", c(9, 9, 9), c(1, 1, 1), "back", 1.0)
        .unwrap();
    let last = client.prog("default", c(0, 0, 0), b"").unwrap().lsn;
    let groups = groups_through(&mut w, last);
    let ops: Vec<Vec<(Coord, &'static str)>> = groups
        .iter()
        .map(|g| g.changes.iter().map(|c| (c.coord, c.op.name())).collect())
        .collect();
    assert_eq!(
        ops,
        vec![
            vec![(c(0, 0, 0), "prog")],
            // The run's three writes inside the box, together.
            vec![
                (c(1, 1, 1), "put"),
                (c(2, 2, 2), "put"),
                (c(3, 3, 3), "put")
            ],
            // Only the edge whose source is inside.
            vec![(c(1, 1, 1), "link")],
            vec![(c(0, 0, 0), "unprog")],
        ]
    );
    // In log order; the write outside the box (between two of them) is not sent.
    let run: Vec<u64> = groups[1].changes.iter().map(|c| c.lsn).collect();
    assert_eq!(run, vec![run[0], run[0] + 1, run[0] + 3], "{groups:?}");
}

#[test]
fn history_folded_away_is_a_resync_and_scan_then_watch_is_exact() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut client = daemon.client().unwrap();
    for i in 0..20 {
        client.put("default", c(i, 0, 0), b"old").unwrap();
    }
    client.checkpoint(false).unwrap();
    let mut w = watch(
        daemon.client().unwrap(),
        "default",
        c(0, 0, 0),
        c(99, 0, 0),
        Some(1),
    );
    match w.next() {
        Some(Err(ClientError::Resync {
            lsn,
            reason: ResyncReason::HistoryGone,
        })) => assert!(lsn > 20, "oldest available LSN {lsn}"),
        other => panic!("expected history_gone, got {other:?}"),
    }
    assert!(w.next().is_none());
    assert_eq!(common::stat(&mut client, "watch.resyncs_history_gone"), 1);

    // Snapshot with its LSN, then watch from just after it: exact.
    let (page, lsn) = client
        .scan_page_with_lsn("default", &region(c(0, 0, 0), c(99, 0, 0)), 1000, None)
        .unwrap();
    assert_eq!(page.cells.len(), 20);
    assert!(lsn >= 20);
    let mut w = watch(
        daemon.client().unwrap(),
        "default",
        c(0, 0, 0),
        c(99, 0, 0),
        Some(lsn + 1),
    );
    assert_eq!(w.start_lsn(), lsn + 1);
    let put = client.put("default", c(50, 0, 0), b"new").unwrap();
    let got = changes(&groups_through(&mut w, put));
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].coord, c(50, 0, 0));

    // An LSN of 0 and a bad box are clear refusals.
    let err = daemon
        .client()
        .unwrap()
        .watch("default", region(c(0, 0, 0), c(1, 1, 1)), Some(0))
        .err()
        .unwrap();
    assert_eq!(err.server_code(), Some(ErrorCode::InvalidArgument), "{err}");
}

#[test]
fn a_watcher_past_its_buffer_is_cut_off_and_writers_never_wait_for_it() {
    let daemon = LocalDaemon::start_fresh(&["--watch-buffer-bytes", "65536"]).unwrap();
    let _dump = common::DumpOnFailure(&daemon);
    // Subscribed, then not read while 8 MiB are written into its box.
    let mut w = watch(
        daemon.client().unwrap(),
        "default",
        c(0, 0, 0),
        c(0, 0, 0),
        None,
    );
    let start = w.start_lsn();
    let mut client = daemon.client().unwrap();
    let value = vec![7u8; 32 * 1024];
    let mut last = 0;
    for _ in 0..256 {
        last = client.put("default", c(0, 0, 0), &value).unwrap();
    }
    // Now read: what came is contiguous from the start, then the resync.
    let mut next = start;
    let resync = loop {
        match w.next().unwrap() {
            Ok(group) => {
                for change in group.changes {
                    assert_eq!(change.lsn, next);
                    next += 1;
                }
            }
            Err(ClientError::Resync {
                lsn,
                reason: ResyncReason::TooSlow,
            }) => break lsn,
            Err(e) => panic!("expected too_slow, got {e}"),
        }
    };
    assert_eq!(resync, next, "resync from the first change not delivered");
    assert!(resync <= last, "cut off although it kept up");
    assert_eq!(common::stat(&mut client, "watch.resyncs_too_slow"), 1);
    // The rest is still in the log: going on from there misses nothing.
    let mut w = watch(
        daemon.client().unwrap(),
        "default",
        c(0, 0, 0),
        c(0, 0, 0),
        Some(resync),
    );
    let rest = changes(&groups_through(&mut w, last));
    let lsns: Vec<u64> = rest.iter().map(|c| c.lsn).collect();
    assert_eq!(lsns, (resync..=last).collect::<Vec<_>>());
    // What the cut-off watch held leaves the count with it.
    drop(w);
    common::wait_for("the watches to close and their bytes to go", || {
        common::stat(&mut client, "watch.open") == 0
            && common::stat(&mut client, "watch.buffered_bytes") == 0
    });
}

#[test]
fn stats_count_open_watches_and_the_changes_delivered() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut client = daemon.client().unwrap();
    assert_eq!(common::stat(&mut client, "watch.open"), 0);
    let mut w = watch(
        daemon.client().unwrap(),
        "default",
        c(0, 0, 0),
        c(9, 9, 9),
        None,
    );
    assert_eq!(common::stat(&mut client, "watch.open"), 1);
    let mut last = 0;
    for i in 0..3 {
        last = client.put("default", c(i, i, i), b"v").unwrap();
        client.put("default", c(50, i, 0), b"outside").unwrap();
    }
    assert_eq!(changes(&groups_through(&mut w, last)).len(), 3);
    assert_eq!(common::stat(&mut client, "watch.changes_delivered"), 3);
    let deliveries = common::stat(&mut client, "watch.direct_writes")
        + common::stat(&mut client, "watch.queued_deliveries");
    assert!((1..=3).contains(&deliveries), "{deliveries} deliveries");
    drop(w);
    common::wait_for("the watch to close", || {
        common::stat(&mut client, "watch.open") == 0
    });
    assert_eq!(common::stat(&mut client, "watch.buffered_bytes"), 0);
}

#[test]
fn dropping_the_namespace_ends_the_watch() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut client = daemon.client().unwrap();
    let ns = NamespaceName::new("temp").unwrap();
    client.ns_create(&ns, &NamespaceSpec::default()).unwrap();
    let mut w = watch(
        daemon.client().unwrap(),
        "temp",
        c(0, 0, 0),
        c(1, 1, 1),
        None,
    );
    client.ns_drop(&ns).unwrap();
    match w.next() {
        Some(Err(e)) => assert_eq!(e.server_code(), Some(ErrorCode::NoSuchNamespace), "{e}"),
        other => panic!("expected the watch to end, got {other:?}"),
    }
}

/// `cubec` beside `cubed` (`$CUBEC_BIN` overrides).
fn cubec_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("CUBEC_BIN").filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    LocalDaemon::find_binary().unwrap().with_file_name("cubec")
}

#[test]
fn a_namespace_the_peer_may_not_read_answers_as_a_missing_one() {
    if !nix::unistd::geteuid().is_root() || !cubec_binary().is_file() {
        eprintln!("needs root (to run cubec as another uid) and a built cubec; skipping");
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("cube-watch-acl-")
        .tempdir_in("/tmp")
        .unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let cubec = dir.path().join("cubec");
    fs::copy(cubec_binary(), &cubec).unwrap();
    let daemon = LocalDaemon::start_in(
        &dir.path().join("data"),
        &dir.path().join("cubed.sock"),
        &["--socket-mode", "666"],
    )
    .unwrap();
    let mut root = daemon.client().unwrap();
    let secret = NamespaceName::new("secret").unwrap();
    root.ns_create(&secret, &NamespaceSpec::default()).unwrap();
    let watch_as = |ns: &str, from: &str| {
        let mut command = Command::new(&cubec);
        command
            .arg("--socket")
            .arg(daemon.socket())
            .args(["watch", ns, "0,0,0", "1,1,1", "--from", from])
            .env_remove("CUBE_SOCKET")
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .uid(65534)
            .gid(65534);
        command
    };
    let hidden = watch_as("secret", "1").output().unwrap();
    let missing = watch_as("nothere", "1").output().unwrap();
    assert_eq!(missing.status.code(), Some(3));
    assert_eq!(hidden.status.code(), missing.status.code());
    assert_eq!(
        String::from_utf8_lossy(&hidden.stderr).replace("secret", "X"),
        String::from_utf8_lossy(&missing.stderr).replace("nothere", "X"),
    );
    // With a read-only grant the change arrives (replayed: no race with
    // the watch starting).
    root.ns_grant(&secret, 65534, true).unwrap();
    let lsn = root.put("secret", c(1, 1, 1), b"seen").unwrap();
    let mut child = watch_as("secret", &lsn.to_string()).spawn().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut line = Vec::new();
    let mut byte = [0u8];
    while !line.ends_with(b"\n") {
        use std::io::Read;
        assert_eq!(
            stdout.read(&mut byte).unwrap(),
            1,
            "cubec watch ended early"
        );
        line.push(byte[0]);
    }
    assert_eq!(
        String::from_utf8_lossy(&line),
        format!("{lsn}\t1,1,1\tput\tseen\n")
    );
    // Revoked while watching (live, written by the dispatcher straight to
    // the socket): the watch ends as for a missing namespace, and nothing
    // committed after the revoke reaches it.
    root.ns_revoke(&secret, 65534).unwrap();
    root.put("secret", c(1, 1, 1), b"after the revoke").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), missing.status.code());
    let mut rest = Vec::new();
    {
        use std::io::Read;
        stdout.read_to_end(&mut rest).unwrap();
    }
    assert!(
        !String::from_utf8_lossy(&rest).contains("after the revoke"),
        "{}",
        String::from_utf8_lossy(&rest)
    );
}

#[test]
fn an_encrypted_namespaces_history_replays_and_its_live_changes_follow() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("master.key");
    fs::write(&key, "11".repeat(32)).unwrap();
    fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).unwrap();
    let daemon = LocalDaemon::start_in(
        &dir.path().join("data"),
        &dir.path().join("cubed.sock"),
        &["--key-file", key.to_str().unwrap()],
    )
    .unwrap();
    let mut client = daemon.client().unwrap();
    let vault = NamespaceName::new("vault").unwrap();
    let spec = NamespaceSpec {
        encrypted: true,
        ..NamespaceSpec::default()
    };
    let created = client.ns_create(&vault, &spec).unwrap();
    assert!(created.encrypted);
    let first = client.put("vault", c(0, 0, 0), b"sealed one").unwrap();
    client.put("vault", c(1, 0, 0), b"sealed two").unwrap();
    let mut w = watch(
        daemon.client().unwrap(),
        "vault",
        c(0, 0, 0),
        c(1, 0, 0),
        Some(first),
    );
    let live = client.put("vault", c(1, 0, 0), b"live").unwrap();
    let got: Vec<WatchOp> = changes(&groups_through(&mut w, live))
        .into_iter()
        .map(|c| c.op)
        .collect();
    assert_eq!(
        got,
        vec![
            WatchOp::Put(b"sealed one".to_vec()),
            WatchOp::Put(b"sealed two".to_vec()),
            WatchOp::Put(b"live".to_vec()),
        ]
    );
}

#[test]
fn a_clean_shutdown_ends_a_watch_with_shutting_down_and_resuming_after_restart_misses_nothing() {
    let mut daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut client = daemon.client().unwrap();
    let first = client.put("default", c(0, 0, 0), b"one").unwrap();
    let mut w = watch(
        daemon.client().unwrap(),
        "default",
        c(0, 0, 0),
        c(0, 0, 0),
        Some(first),
    );
    assert_eq!(changes(&groups_through(&mut w, first)).len(), 1);
    drop(client);
    daemon.terminate().unwrap();
    match w.next() {
        Some(Err(e)) => assert_eq!(e.server_code(), Some(ErrorCode::ShuttingDown), "{e}"),
        other => panic!("expected shutting_down, got {other:?}"),
    }
    // Going on from the LSN after the last one seen misses nothing (the
    // clean shutdown folded the log, but the next LSN is where it starts).
    daemon.restart().unwrap();
    let mut client = daemon.client().unwrap();
    let mut w = watch(
        daemon.client().unwrap(),
        "default",
        c(0, 0, 0),
        c(0, 0, 0),
        Some(first + 1),
    );
    let next = client.put("default", c(0, 0, 0), b"two").unwrap();
    let got = changes(&groups_through(&mut w, next));
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].op, WatchOp::Put(b"two".to_vec()));
}
