//! Guards `mget` end to end against a real `cubed`: values come back in request order (duplicates too) with empty and deleted cells as missing, 4096 cells per request are served and 4097 refused, an unknown namespace is the same error as for `get`, an answer over the frame limit is a clear error that leaves the connection usable, and reads beside durable writers see one state of the store and never a value a crash could take back.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use cube_client::{
    BatchOp, Coord, ErrorCode, LocalDaemon, MAX_MGET_CELLS, NamespaceName, Request, Response,
};

fn default_ns() -> NamespaceName {
    NamespaceName::new("default").unwrap()
}

fn mget_request(coords: Vec<Coord>) -> Request {
    Request::Mget {
        ns: default_ns(),
        coords,
    }
}

#[test]
fn values_come_back_in_request_order_with_missing_and_deleted_cells() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut client = daemon.client().unwrap();
    let a = Coord::new(1, -2, 3);
    let b = Coord::new(-1, 0, 7);
    let gone = Coord::new(5, 5, 5);
    let never = Coord::new(9, 9, 9);
    let empty = Coord::new(0, 0, 0);
    client.put("default", a, b"alpha").unwrap();
    client.put("default", b, &[0xff, 0x00, 0x7f]).unwrap();
    client.put("default", gone, b"soon gone").unwrap();
    client.put("default", empty, b"").unwrap();
    assert!(client.del("default", gone).unwrap());

    let coords = [a, never, b, gone, a, empty, b, a];
    let values = client.mget("default", &coords).unwrap();
    assert_eq!(
        values,
        vec![
            Some(b"alpha".to_vec()),
            None,
            Some(vec![0xff, 0x00, 0x7f]),
            None,
            Some(b"alpha".to_vec()),
            Some(Vec::new()),
            Some(vec![0xff, 0x00, 0x7f]),
            Some(b"alpha".to_vec()),
        ]
    );
    // The same answers as one get each.
    for (c, v) in coords.iter().zip(&values) {
        assert_eq!(&client.get("default", *c).unwrap(), v, "{c}");
    }
    // An empty list sends nothing and answers nothing.
    assert_eq!(
        client.mget("default", &[]).unwrap(),
        Vec::<Option<Vec<u8>>>::new()
    );
    // The command is counted like every other.
    let stats = client.stats().unwrap();
    let count = stats
        .iter()
        .find(|e| e.name == "cmd.mget.count")
        .map(|e| e.value.clone());
    assert_eq!(count, Some(cube_client::StatsValue::Count(1)), "{stats:?}");
    assert!(stats.iter().any(|e| e.name == "cmd.mget.latency_us_p99"));
}

#[test]
fn the_largest_request_is_served_and_one_more_cell_is_refused() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut client = daemon.client().unwrap();
    for i in (0..MAX_MGET_CELLS as i32).step_by(3) {
        client
            .put("default", Coord::new(i, 0, 0), format!("v{i}").as_bytes())
            .unwrap();
    }
    let coords: Vec<Coord> = (0..MAX_MGET_CELLS as i32)
        .map(|i| Coord::new(i, 0, 0))
        .collect();
    let expected: Vec<Option<Vec<u8>>> = (0..MAX_MGET_CELLS as i32)
        .map(|i| (i % 3 == 0).then(|| format!("v{i}").into_bytes()))
        .collect();
    match client.call(&mget_request(coords.clone())).unwrap() {
        Response::Mget(values) => assert_eq!(values, expected),
        other => panic!("{other:?}"),
    }

    let mut too_many = coords.clone();
    too_many.push(Coord::new(-1, 0, 0));
    let err = client.call(&mget_request(too_many.clone())).unwrap_err();
    assert_eq!(err.server_code(), Some(ErrorCode::MalformedFrame), "{err}");
    assert!(err.to_string().contains("mget cell count"), "{err}");
    assert!(err.to_string().contains("4096"), "{err}");
    let err = client.call(&mget_request(Vec::new())).unwrap_err();
    assert_eq!(err.server_code(), Some(ErrorCode::MalformedFrame), "{err}");
    assert!(err.to_string().contains("1 to 4096"), "{err}");

    // The connection is still fine, and the client splits long lists.
    let values = client.mget("default", &too_many).unwrap();
    assert_eq!(values.len(), too_many.len());
    assert_eq!(&values[..expected.len()], &expected[..]);
    assert_eq!(values[expected.len()], None);
    let doubled: Vec<Coord> = coords.iter().chain(&coords).copied().collect();
    let values = client.mget("default", &doubled).unwrap();
    assert_eq!(&values[..expected.len()], &expected[..]);
    assert_eq!(&values[expected.len()..], &expected[..]);
}

#[test]
fn an_unknown_namespace_is_the_same_error_as_for_get() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut client = daemon.client().unwrap();
    let c = Coord::new(1, 2, 3);
    let get_err = client.get("nope", c).unwrap_err();
    let mget_err = client.mget("nope", &[c, c]).unwrap_err();
    assert_eq!(mget_err.server_code(), Some(ErrorCode::NoSuchNamespace));
    assert_eq!(mget_err.to_string(), get_err.to_string());
    // Still usable afterwards.
    assert_eq!(client.mget("default", &[c]).unwrap(), vec![None]);
}

#[test]
fn an_answer_over_the_frame_limit_is_a_clear_error() {
    // 1 MiB frames, 200 KiB values: four values fit an answer, six do not.
    let daemon = LocalDaemon::start_fresh(&[
        "--max-frame-bytes",
        "1048576",
        "--max-value-bytes",
        "204800",
    ])
    .unwrap();
    let mut client = daemon.client().unwrap();
    let coords: Vec<Coord> = (0..6).map(|i| Coord::new(i, 0, 0)).collect();
    for (i, c) in coords.iter().enumerate() {
        client
            .put("default", *c, &vec![i as u8; 200 * 1024])
            .unwrap();
    }
    let four = client.mget("default", &coords[..4]).unwrap();
    for (i, v) in four.iter().enumerate() {
        let v = v.as_ref().unwrap();
        assert!(v.len() == 200 * 1024 && v.iter().all(|b| *b == i as u8));
    }

    let err = client.mget("default", &coords).unwrap_err();
    assert_eq!(err.server_code(), Some(ErrorCode::LimitExceeded), "{err}");
    let text = err.to_string();
    let needed = 20 + 1 + 4 + 6 * (1 + 4 + 200 * 1024);
    assert!(text.contains(&format!("{needed} bytes")), "{text}");
    assert!(text.contains("1048576"), "{text}");
    assert!(text.contains("fewer cells"), "{text}");
    // Missing cells cost a byte each; the connection carries on.
    let mut mostly_missing = coords[..4].to_vec();
    mostly_missing.extend((100..4000).map(|i| Coord::new(i, 0, 0)));
    let values = client.mget("default", &mostly_missing).unwrap();
    assert_eq!(values.iter().filter(|v| v.is_some()).count(), 4);
    client.ping().unwrap();
    assert_eq!(
        client.get("default", coords[5]).unwrap().map(|v| v.len()),
        Some(200 * 1024)
    );
}

/// The value a writer stores: the cell and a version, padded so a torn
/// value would show.
fn value(c: Coord, version: u32) -> String {
    format!("{c}@{version}@{}", "x".repeat(version as usize % 37))
}

fn version_of(c: Coord, bytes: &[u8]) -> u32 {
    let text = std::str::from_utf8(bytes).unwrap();
    let mut parts = text.split('@');
    assert_eq!(parts.next(), Some(c.to_string().as_str()), "{text}");
    let version: u32 = parts.next().unwrap().parse().unwrap();
    assert_eq!(
        parts.next().unwrap().len(),
        version as usize % 37,
        "torn {text}"
    );
    version
}

/// One writer rewrites a block of cells with a version at a time, each
/// version one atomic batch (one commit group, applied under one hold of
/// the store's write lock) acknowledged before the next. Readers ask for
/// the whole block (and, in a second request order, for it backwards): one
/// state of the store shows every cell at the same version, never one newer
/// than the writer has sent, and never one older than an earlier read
/// showed. After a crash (kill -9) every cell is at least the version any
/// mget showed: nothing shown was undurable.
#[test]
fn reads_beside_durable_writes_see_one_durable_state() {
    const SIDE: i32 = 4;
    const VERSIONS: u32 = 150;
    let mut daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let sent = Arc::new(AtomicU32::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let coords: Vec<Coord> = (0..SIDE)
        .flat_map(|x| (0..SIDE).flat_map(move |y| (0..SIDE).map(move |z| Coord::new(x, y, z))))
        .collect();
    let writer = {
        let mut client = daemon.client().unwrap();
        let (sent, coords) = (Arc::clone(&sent), coords.clone());
        std::thread::spawn(move || {
            for version in 1..=VERSIONS {
                let mut ops: Vec<BatchOp> = coords
                    .iter()
                    .map(|c| BatchOp::Put {
                        coord: *c,
                        value: value(*c, version).into_bytes(),
                    })
                    .collect();
                sent.fetch_max(version, Ordering::SeqCst);
                client.batch("default", &mut ops).unwrap();
            }
        })
    };
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let mut client = daemon.client().unwrap();
            let (sent, stop) = (Arc::clone(&sent), Arc::clone(&stop));
            let mut coords = coords.clone();
            if r == 1 {
                coords.reverse();
            }
            std::thread::spawn(move || {
                let mut newest_seen = 0;
                let mut reads = 0u32;
                while !stop.load(Ordering::SeqCst) || reads == 0 {
                    reads += 1;
                    let values = client.mget("default", &coords).unwrap();
                    let newest_sent = sent.load(Ordering::SeqCst);
                    let versions: Vec<u32> = coords
                        .iter()
                        .zip(&values)
                        .map(|(c, v)| v.as_deref().map_or(0, |v| version_of(*c, v)))
                        .collect();
                    let version = versions[0];
                    assert!(
                        versions.iter().all(|v| *v == version),
                        "not one state of the store: {versions:?}"
                    );
                    assert!(version <= newest_sent, "version {version} was never sent");
                    assert!(
                        version >= newest_seen,
                        "went from {newest_seen} to {version}"
                    );
                    newest_seen = version;
                }
                (reads, newest_seen)
            })
        })
        .collect();
    writer.join().unwrap();
    stop.store(true, Ordering::SeqCst);
    let mut shown = 0;
    for reader in readers {
        let (reads, newest_seen) = reader.join().unwrap();
        assert!(reads > 0);
        shown = shown.max(newest_seen);
    }
    daemon.kill9().unwrap();
    daemon.restart().unwrap();
    let mut client = daemon.client().unwrap();
    let values = client.mget("default", &coords).unwrap();
    for (c, v) in coords.iter().zip(values) {
        let recovered = version_of(*c, &v.unwrap());
        assert_eq!(recovered, VERSIONS, "{c}");
        assert!(recovered >= shown, "{c}");
    }
}
