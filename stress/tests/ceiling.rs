//! Guards the ceiling targets (`ceiling-echo`, `ceiling-sync`): each starts as a
//! process of its own, stores and answers values, ceiling-sync reports its
//! group commits in cube's names, a malformed frame closes only its own
//! connection, and a short `--target ceiling-sync` run of the binary passes.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use cube_client::{StatsEntry, StatsValue};
use cube_protocol::Coord;
use cube_stress::target::ceiling::{CeilingMode, CeilingServer};
use cube_stress::target::{Connector, RunningTarget, TargetKind, TargetSpec};

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_cube-stress"))
}

/// A ceiling target started the way a run starts it, with the test's
/// `cube-stress` binary as the server.
fn start(kind: TargetKind) -> RunningTarget {
    let mut spec = TargetSpec::new(kind);
    spec.ceiling_binary = Some(binary());
    RunningTarget::start(&spec).unwrap()
}

fn figure<'a>(figures: &'a [StatsEntry], name: &str) -> &'a StatsValue {
    &figures
        .iter()
        .find(|e| e.name == name)
        .unwrap_or_else(|| panic!("no {name} in {figures:?}"))
        .value
}

#[test]
fn both_ceilings_store_and_answer_values() {
    for kind in [TargetKind::CeilingEcho, TargetKind::CeilingSync] {
        let target = start(kind);
        assert!(target.detail.starts_with(kind.name()), "{}", target.detail);
        let mut connection = target.connector.connect().unwrap();
        let coords: Vec<Coord> = (0..20).map(|i| Coord::new(i, -i, i * 1000)).collect();
        for (i, coord) in coords.iter().enumerate() {
            connection
                .put(*coord, format!("value {i}").as_bytes())
                .unwrap();
        }
        // Overwrite one, and an empty value is a value, not an absence.
        connection.put(coords[3], b"again").unwrap();
        connection.put(coords[4], b"").unwrap();
        assert_eq!(connection.get(coords[0]).unwrap().unwrap(), b"value 0");
        assert_eq!(connection.get(coords[3]).unwrap().unwrap(), b"again");
        assert_eq!(connection.get(coords[4]).unwrap().unwrap(), b"");
        assert_eq!(connection.get(Coord::new(7, 7, 7)).unwrap(), None);
        let got = connection
            .mget(&[coords[19], Coord::new(7, 7, 7), coords[19]])
            .unwrap();
        assert_eq!(
            got,
            [Some(b"value 19".to_vec()), None, Some(b"value 19".to_vec())]
        );
        // Another connection sees the same values.
        let mut other = target.connector.connect().unwrap();
        assert_eq!(other.get(coords[10]).unwrap().unwrap(), b"value 10");
        // A value over the bound is refused by the client, not sent.
        let huge = vec![0u8; (1 << 20) + 1];
        assert!(connection.put(coords[0], &huge).is_err());
        assert_eq!(connection.get(coords[0]).unwrap().unwrap(), b"value 0");

        let figures = target.connector.server_figures().unwrap();
        assert!(matches!(
            figure(&figures, "server.sync"),
            StatsValue::Text(_)
        ));
        if kind == TargetKind::CeilingSync {
            assert_eq!(figure(&figures, "wal.records"), &StatsValue::Count(22));
            let StatsValue::Float(group_records_mean) = *figure(&figures, "wal.group_records_mean")
            else {
                panic!("wal.group_records_mean is not a float: {figures:?}");
            };
            assert!(group_records_mean >= 1.0, "{group_records_mean}");
            let StatsValue::Float(fsync_us_mean) = *figure(&figures, "wal.fsync_us_mean") else {
                panic!("wal.fsync_us_mean is not a float: {figures:?}");
            };
            assert!(fsync_us_mean > 0.0, "{fsync_us_mean}");
        }
    }
}

#[test]
fn a_malformed_frame_closes_only_its_own_connection() {
    let server = CeilingServer::start(CeilingMode::Echo, Some(&binary())).unwrap();
    let connector = server.connector();
    let mut good = connector.connect().unwrap();
    good.put(Coord::new(1, 2, 3), b"kept").unwrap();

    let bad_frames: [&[u8]; 3] = [
        // Unknown op.
        &[9; 29],
        // A put claiming a value over the 1 MiB bound (u32::MAX bytes).
        &[
            1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255,
            255, 255,
        ],
        // A coordinate outside i32.
        &[
            2, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        ],
    ];
    for frame in bad_frames {
        let mut stream = UnixStream::connect(server.socket()).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream.write_all(frame).unwrap();
        // Closed without an answer.
        let mut answer = Vec::new();
        let read = stream.read_to_end(&mut answer);
        assert!(
            matches!(read, Ok(0)) || read.is_err(),
            "answered {answer:?} to {frame:?}"
        );
        // The other connection goes on, and a new one is served.
        assert_eq!(good.get(Coord::new(1, 2, 3)).unwrap().unwrap(), b"kept");
        let mut fresh = connector.connect().unwrap();
        assert_eq!(fresh.get(Coord::new(1, 2, 3)).unwrap().unwrap(), b"kept");
    }
    let figures = connector.server_figures().unwrap();
    assert_eq!(figure(&figures, "frames.bad"), &StatsValue::Count(3));
    assert!(
        matches!(figure(&figures, "frames.last_bad"), StatsValue::Text(why) if why.contains("outside i32")),
        "{figures:?}"
    );
}

#[test]
fn dropping_the_target_removes_its_directory() {
    let target = start(TargetKind::CeilingSync);
    // The detail ends "in DIR".
    let dir = target
        .detail
        .rsplit(" in ")
        .next()
        .map(PathBuf::from)
        .unwrap();
    assert!(dir.join("log").is_dir(), "{}", dir.display());
    drop(target);
    assert!(!dir.exists(), "{} is still there", dir.display());
}

#[test]
fn a_short_ceiling_sync_run_of_the_binary_passes() {
    let output = Command::new(binary())
        .args([
            "--target",
            "ceiling-sync",
            "--workload",
            "put",
            "--clients",
            "4",
            "--duration",
            "1",
            "--warmup",
            "0.2",
            "--keys",
            "1000",
        ])
        .output()
        .unwrap();
    let (stdout, _) = common::succeeded(&output);
    assert!(stdout.contains("wal.group_records_mean"), "{stdout}");
    assert!(stdout.trim_end().ends_with("PASSED"), "{stdout}");
}
