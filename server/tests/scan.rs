//! Guards `scan` end to end against a real `cubed`: cells come back in curve order exactly once across pages (also when large values make pages stop at the frame limit), bad boxes and limits are clear errors, counting the whole space is cheap, scans survive a restart, and scans beside durable writers never see a torn value or one that was never written.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use cube_client::{
    CellBox, Client, ClientError, Coord, ErrorCode, LocalDaemon, Request, Response, ScanResult,
};
use cube_store::Curve;

fn cube_box(lo: i32, hi: i32) -> CellBox {
    CellBox::new(Coord::new(lo, lo, lo), Coord::new(hi, hi, hi)).unwrap()
}

fn all_space() -> CellBox {
    CellBox::new(
        Coord::new(i32::MIN, i32::MIN, i32::MIN),
        Coord::new(i32::MAX, i32::MAX, i32::MAX),
    )
    .unwrap()
}

fn scan_all(client: &mut Client, region: CellBox, page: u32) -> Vec<(Coord, Vec<u8>)> {
    client
        .scan("default", region, page)
        .map(|cell| {
            let cell = cell.unwrap();
            (cell.coord, cell.value)
        })
        .collect()
}

#[test]
fn pages_return_every_cell_once_in_curve_order() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut client = daemon.client().unwrap();
    let mut model = BTreeMap::new();
    for x in -3..3 {
        for y in -3..3 {
            for z in [-1, 0, 5] {
                let c = Coord::new(x, y, z);
                let value = format!("v{c}").into_bytes();
                client.put("default", c, &value).unwrap();
                model.insert(c, value);
            }
        }
    }
    let region = CellBox::new(Coord::new(-2, -3, -1), Coord::new(2, 1, 4)).unwrap();
    let mut expected: Vec<(Coord, Vec<u8>)> = model
        .iter()
        .filter(|(c, _)| region.contains(**c))
        .map(|(c, v)| (*c, v.clone()))
        .collect();
    expected.sort_by_key(|(c, _)| Curve::DEFAULT.key(*c));
    for page in [1, 2, 7, 1000] {
        assert_eq!(scan_all(&mut client, region, page), expected, "page {page}");
    }
    assert_eq!(
        client.scan_count("default", &region).unwrap(),
        expected.len() as u64
    );
    assert_eq!(
        client.scan_count("default", &all_space()).unwrap(),
        model.len() as u64
    );
    // A single page says where to resume, and resuming there continues.
    let first = client.scan_page("default", &region, 5, None).unwrap();
    assert_eq!(first.cells.len(), 5);
    assert_eq!(first.resume_after, Some(first.cells[4].coord));
    let second = client
        .scan_page("default", &region, 5, first.resume_after)
        .unwrap();
    assert_eq!(second.cells[0].coord, expected[5].0);
}

#[test]
fn scan_pages_lend_every_cell_once_in_curve_order() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut client = daemon.client().unwrap();
    let mut expected = Vec::new();
    for x in 0..10 {
        for y in 0..6 {
            for z in 0..5 {
                let c = Coord::new(x, y, z);
                // Values of varied length, empty ones included.
                let value = vec![(x + y + z) as u8; ((x * y + z) % 9) as usize];
                client.put("default", c, &value).unwrap();
                expected.push((c, value));
            }
        }
    }
    client
        .put("default", Coord::new(50, 0, 0), b"outside")
        .unwrap();
    expected.sort_by_key(|(c, _)| Curve::DEFAULT.key(*c));
    let region = CellBox::new(Coord::new(0, 0, 0), Coord::new(9, 5, 4)).unwrap();
    for page_cells in [1, 7, 64, 1000] {
        let mut got = Vec::new();
        let mut pages = 0;
        let mut scan = client.scan_pages("default", region, page_cells);
        while let Some(cells) = scan.next_page().unwrap() {
            pages += 1;
            assert!(cells.len() <= page_cells as usize);
            got.extend(cells.iter().map(|(c, v)| (c, v.to_vec())));
        }
        assert_eq!(scan.cursor(), None);
        assert!(scan.next_page().unwrap().is_none());
        assert_eq!(got, expected, "pages of {page_cells}");
        assert!(pages >= expected.len().div_ceil(page_cells as usize));
        assert_eq!(scan_all(&mut client, region, page_cells), expected);
    }
    // A refusal is the server's error, once; the connection stays usable.
    let mut scan = client.scan_pages("nowhere", region, 10);
    match scan.next_page() {
        Err(ClientError::Server(e)) => assert_eq!(e.code, ErrorCode::NoSuchNamespace as u16),
        other => panic!("expected no_such_namespace, got {other:?}"),
    }
    assert!(scan.next_page().unwrap().is_none());
    let mut scan = client.scan_pages("Bad Name", region, 10);
    assert!(matches!(scan.next_page(), Err(ClientError::BadArgument(_))));
    assert_eq!(
        client.get("default", Coord::new(50, 0, 0)).unwrap(),
        Some(b"outside".to_vec())
    );
}

#[test]
fn large_values_end_pages_at_the_frame_limit() {
    // 1 MiB frames, 200 KiB values: at most 4 cells fit a page, whatever
    // the limit asked for.
    let daemon = LocalDaemon::start_fresh(&[
        "--max-frame-bytes",
        "1048576",
        "--max-value-bytes",
        "204800",
    ])
    .unwrap();
    let mut client = daemon.client().unwrap();
    for i in 0..12 {
        client
            .put("default", Coord::new(i, 0, 0), &vec![i as u8; 200 * 1024])
            .unwrap();
    }
    let page = client
        .scan_page("default", &cube_box(-1, 20), 1000, None)
        .unwrap();
    assert!(
        (1..=5).contains(&page.cells.len()),
        "{} cells",
        page.cells.len()
    );
    assert!(page.resume_after.is_some());
    let cells = scan_all(&mut client, cube_box(-1, 20), 1000);
    let coords: HashSet<Coord> = cells.iter().map(|(c, _)| *c).collect();
    assert_eq!((cells.len(), coords.len()), (12, 12));
    for (c, v) in cells {
        assert!(v.len() == 200 * 1024 && v.iter().all(|b| *b == c.x as u8));
    }
}

#[test]
fn bad_boxes_limits_and_namespaces_are_clear_errors() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut client = daemon.client().unwrap();
    let scan = |lo: Coord, hi: Coord, limit: u32, ns: &str| Request::Scan {
        ns: cube_client::NamespaceName::new(ns).unwrap(),
        lo,
        hi,
        limit,
        count_only: false,
        after: None,
        with_lsn: false,
    };
    let err = client
        .call(&scan(
            Coord::new(0, 5, 0),
            Coord::new(1, 4, 1),
            10,
            "default",
        ))
        .unwrap_err();
    assert_eq!(err.server_code(), Some(ErrorCode::InvalidArgument), "{err}");
    assert!(err.to_string().contains("y0 = 5 is above y1 = 4"), "{err}");
    let err = client
        .call(&scan(
            Coord::new(0, 0, 0),
            Coord::new(1, 1, 1),
            0,
            "default",
        ))
        .unwrap_err();
    assert_eq!(err.server_code(), Some(ErrorCode::InvalidArgument), "{err}");
    let err = client
        .call(&scan(Coord::new(0, 0, 0), Coord::new(1, 1, 1), 5, "nope"))
        .unwrap_err();
    assert_eq!(err.server_code(), Some(ErrorCode::NoSuchNamespace), "{err}");
    // The connection is still fine, and an empty box is an empty answer.
    let empty = client
        .call(&scan(
            Coord::new(0, 0, 0),
            Coord::new(9, 9, 9),
            5,
            "default",
        ))
        .unwrap();
    assert_eq!(
        empty,
        Response::Scan {
            result: ScanResult::Cells(Vec::new()),
            resume_after: None,
            lsn: None,
        }
    );
}

#[test]
fn counting_all_of_space_touches_only_what_exists() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut client = daemon.client().unwrap();
    let corners = [i32::MIN, -1, 0, i32::MAX];
    for x in corners {
        for y in corners {
            client.put("default", Coord::new(x, y, x), b"c").unwrap();
        }
    }
    let started = Instant::now();
    assert_eq!(client.scan_count("default", &all_space()).unwrap(), 16);
    assert_eq!(scan_all(&mut client, all_space(), 3).len(), 16);
    // A box of 2^96 cells, answered like a small one.
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[test]
fn scans_see_the_same_cells_after_a_restart() {
    let mut daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut client = daemon.client().unwrap();
    for i in 0..50 {
        client
            .put(
                "default",
                Coord::new(i % 7, i / 7, -i),
                format!("{i}").as_bytes(),
            )
            .unwrap();
    }
    let before = scan_all(&mut client, cube_box(-60, 60), 11);
    drop(client);
    daemon.kill9().unwrap();
    daemon.restart().unwrap();
    let mut client = daemon.client().unwrap();
    assert_eq!(scan_all(&mut client, cube_box(-60, 60), 11), before);
}

/// Writers rewrite a block of cells with values naming the cell and a
/// version; scanners check each value against its cell, that no cell comes
/// twice in one scan, that versions never go backwards for one scanner, and
/// that no version is newer than the newest one a writer has sent. At the
/// end a scan must show exactly the last acknowledged version of each cell.
#[test]
fn scans_beside_durable_writers_are_consistent() {
    const SIDE: i32 = 6;
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let sent = Arc::new(AtomicU32::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let value =
        |c: Coord, version: u32| format!("{c}@{version}@{}", "x".repeat(version as usize % 50));
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let mut client = daemon.client().unwrap();
            let sent = Arc::clone(&sent);
            std::thread::spawn(move || {
                let mut last = BTreeMap::new();
                for version in 1..=25u32 {
                    // Writer w owns the cells with x % 2 == w.
                    sent.fetch_max(version, Ordering::SeqCst);
                    for x in (w..SIDE).step_by(2) {
                        for y in 0..SIDE {
                            for z in 0..SIDE {
                                let c = Coord::new(x, y, z);
                                client
                                    .put("default", c, value(c, version).as_bytes())
                                    .unwrap();
                                last.insert(c, version);
                            }
                        }
                    }
                }
                last
            })
        })
        .collect();
    let scanners: Vec<_> = (0..2)
        .map(|_| {
            let mut client = daemon.client().unwrap();
            let (sent, stop) = (Arc::clone(&sent), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut seen: BTreeMap<Coord, u32> = BTreeMap::new();
                let mut scans = 0;
                while !stop.load(Ordering::SeqCst) {
                    scans += 1;
                    let mut this_scan = HashSet::new();
                    for cell in client.scan("default", cube_box(0, SIDE - 1), 17) {
                        let cell = cell.unwrap();
                        let text = String::from_utf8(cell.value).unwrap();
                        let mut parts = text.split('@');
                        assert_eq!(
                            parts.next(),
                            Some(cell.coord.to_string().as_str()),
                            "{text}"
                        );
                        let version: u32 = parts.next().unwrap().parse().unwrap();
                        assert_eq!(
                            parts.next().unwrap().len(),
                            version as usize % 50,
                            "torn {text}"
                        );
                        assert!(version <= sent.load(Ordering::SeqCst), "never sent: {text}");
                        assert!(this_scan.insert(cell.coord), "{} twice", cell.coord);
                        let before = seen.insert(cell.coord, version).unwrap_or(0);
                        assert!(
                            version >= before,
                            "{} went from {before} to {version}",
                            cell.coord
                        );
                    }
                }
                scans
            })
        })
        .collect();
    let mut last = BTreeMap::new();
    for writer in writers {
        last.extend(writer.join().unwrap());
    }
    stop.store(true, Ordering::SeqCst);
    for scanner in scanners {
        assert!(scanner.join().unwrap() > 0);
    }
    let mut client = daemon.client().unwrap();
    let finals = scan_all(&mut client, cube_box(0, SIDE - 1), 1000);
    assert_eq!(finals.len(), last.len());
    for (c, v) in finals {
        assert_eq!(v, value(c, last[&c]).into_bytes());
    }
}
