//! Guards the library against a real `cubed`: the typed `Client` calls,
//! server-initiated refusals, and `LocalDaemon`'s crash/stop/restart
//! lifecycle that the stress driver and other tests build on.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use cube_client::{Client, ClientError, Coord, ErrorCode, LocalDaemon, Request, Response};
use cube_protocol::Limits;
use cube_protocol::frame::{self, RESPONSE_BIT};

fn at(x: i32, y: i32, z: i32) -> Coord {
    Coord::new(x, y, z)
}

#[test]
fn put_get_del_round_trip_with_increasing_lsns() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut client = daemon.client().unwrap();
    assert!(!client.server_version().is_empty());
    assert_eq!(client.limits(), Limits::default());
    client.ping().unwrap();

    let first = client.put("default", at(1, -2, 3), b"one").unwrap();
    let second = client.put("default", at(1, -2, 3), b"two").unwrap();
    assert!(second > first, "lsn {second} after {first}");
    assert_eq!(
        client.get("default", at(1, -2, 3)).unwrap().as_deref(),
        Some(&b"two"[..])
    );
    assert_eq!(client.get("default", at(3, -2, 1)).unwrap(), None);
    assert!(client.del("default", at(1, -2, 3)).unwrap());
    assert!(!client.del("default", at(1, -2, 3)).unwrap());
    assert_eq!(client.get("default", at(1, -2, 3)).unwrap(), None);
    assert!(!client.stats().unwrap().is_empty());
    assert_eq!(client.call(&Request::Ping).unwrap(), Response::Pong);
}

#[test]
fn largest_allowed_value_round_trips_and_one_more_byte_is_refused_locally() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut client = daemon.client().unwrap();
    let limit = client.limits().max_value_bytes as usize;
    let value: Vec<u8> = (0..limit).map(|i| (i % 251) as u8).collect();
    client.put("default", at(0, 0, 0), &value).unwrap();
    assert_eq!(client.get("default", at(0, 0, 0)).unwrap().unwrap(), value);
    let err = client
        .put("default", at(0, 0, 1), &vec![0; limit + 1])
        .unwrap_err();
    assert!(matches!(err, ClientError::BadArgument(_)), "{err:?}");
    // Nothing was sent, so the connection is still in step.
    client.ping().unwrap();
}

#[test]
fn unknown_namespace_is_a_server_error_and_the_connection_survives() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut client = daemon.client().unwrap();
    let err = client.put("nosuch", at(1, 2, 3), b"v").unwrap_err();
    assert_eq!(
        err.server_code(),
        Some(ErrorCode::NoSuchNamespace),
        "{err:?}"
    );
    let err = client.get("nosuch", at(1, 2, 3)).unwrap_err();
    assert_eq!(
        err.server_code(),
        Some(ErrorCode::NoSuchNamespace),
        "{err:?}"
    );
    client.ping().unwrap();
    let err = client.get("Not Valid", at(1, 2, 3)).unwrap_err();
    assert!(matches!(err, ClientError::BadArgument(_)), "{err:?}");
}

#[test]
fn connection_over_the_cap_is_refused_with_a_server_error() {
    let daemon = LocalDaemon::start_fresh(&["--max-connections", "1"]).unwrap();
    // The readiness probe's connection may not be reaped yet; wait it out.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut holder = loop {
        match daemon.client() {
            Ok(client) => break client,
            Err(e) if Instant::now() < deadline => {
                assert_eq!(
                    e.server_code(),
                    Some(ErrorCode::TooManyConnections),
                    "{e:?}"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("the only connection was refused: {e}"),
        }
    };
    let err = Client::connect(daemon.socket()).unwrap_err();
    assert_eq!(
        err.server_code(),
        Some(ErrorCode::TooManyConnections),
        "{err:?}"
    );
    holder.ping().unwrap();
}

#[test]
fn corrupt_frame_gets_an_error_answer_and_the_connection_continues() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut client = daemon.client().unwrap();
    let mut bytes = Vec::new();
    Request::Ping.encode(999, &mut bytes);
    bytes[4] ^= 0xff; // the body checksum
    let mut raw = client.stream();
    raw.write_all(&bytes).unwrap();
    let mut body = Vec::new();
    let header = frame::read_frame(&mut raw, &Limits::default(), &mut body).unwrap();
    assert_eq!(header.request_id, 999);
    assert_ne!(header.opcode & RESPONSE_BIT, 0);
    let answer = Response::decode(&header, &body, &Limits::default()).unwrap();
    let err = answer.unwrap_err();
    assert_eq!(err.known_code(), Some(ErrorCode::BadChecksum), "{err}");
    client.ping().unwrap();
}

#[test]
fn truncated_header_then_close_does_not_hurt_the_daemon() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    {
        let client = daemon.client().unwrap();
        let mut raw = client.stream();
        raw.write_all(&[1, 2, 3]).unwrap();
    }
    let mut client = daemon.client().unwrap();
    client.ping().unwrap();
}

#[test]
fn acknowledged_writes_survive_kill_9_and_restart() {
    let mut daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut client = daemon.client().unwrap();
    for i in 0..50 {
        client
            .put("default", at(i, -i, 0), format!("v{i}").as_bytes())
            .unwrap();
    }
    client.del("default", at(7, -7, 0)).unwrap();
    let old_pid = daemon.pid();
    daemon.kill9().unwrap();
    // The old connection sees the crash as EOF, not a hang.
    let err = client.ping().unwrap_err();
    assert!(
        matches!(err, ClientError::Io(_) | ClientError::Protocol(_)),
        "{err:?}"
    );
    daemon.restart().unwrap();
    assert_ne!(daemon.pid(), old_pid);
    let mut client = daemon.client().unwrap();
    for i in 0..50 {
        let expected = (i != 7).then(|| format!("v{i}").into_bytes());
        assert_eq!(
            client.get("default", at(i, -i, 0)).unwrap(),
            expected,
            "cell {i}"
        );
    }
}

#[test]
fn sigterm_is_a_clean_exit_and_restart_keeps_data() {
    let mut daemon = LocalDaemon::start_fresh(&[]).unwrap();
    daemon
        .client()
        .unwrap()
        .put("default", at(1, 1, 1), b"kept")
        .unwrap();
    let status = daemon.terminate().unwrap();
    assert!(status.success(), "{status}; log:\n{}", daemon.log_text());
    assert!(
        daemon.log_text().contains("listening on"),
        "{}",
        daemon.log_text()
    );
    assert!(
        daemon.terminate().is_err(),
        "terminating twice must say it is not running"
    );
    daemon.restart().unwrap();
    let value = daemon
        .client()
        .unwrap()
        .get("default", at(1, 1, 1))
        .unwrap();
    assert_eq!(value.as_deref(), Some(&b"kept"[..]));
    let err = daemon.restart().unwrap_err();
    assert!(err.to_string().contains("still running"), "{err}");
}

#[test]
fn start_in_uses_the_given_paths_and_a_second_daemon_is_refused_with_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let socket = dir.path().join("one.sock");
    let daemon = LocalDaemon::start_in(&data, &socket, &[]).unwrap();
    assert_eq!(daemon.data_dir(), data);
    assert_eq!(daemon.socket(), socket);
    assert_eq!(daemon.log_path(), dir.path().join("one.log"));
    assert!(data.is_dir());

    let other_socket = dir.path().join("two.sock");
    let err = LocalDaemon::start_in(&data, &other_socket, &[]).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("exited with"), "{text}");
    assert!(text.contains("log"), "{text}");
    let mut log = String::new();
    std::fs::File::open(dir.path().join("two.log"))
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    assert!(
        text.contains(log.trim()),
        "the error must carry the log:\n{text}"
    );
    daemon.client().unwrap().ping().unwrap();
}

#[test]
fn find_binary_locates_cubed() {
    let path = LocalDaemon::find_binary().unwrap();
    assert!(path.ends_with("cubed"), "{}", path.display());
}
