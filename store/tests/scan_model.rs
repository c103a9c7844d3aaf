//! Guards region reads: for both curves, `MemStore::scan` and `count` agree with a brute-force model over random boxes and random sparse and dense data (including boxes that cross zero and touch `i32::MIN`/`i32::MAX`), pages return every cell exactly once in curve order, and scans running beside the writer never see a torn value.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use cube_protocol::{CellBox, Coord, NamespaceName};
use cube_store::{Curve, MemStore, Mutation, ScanLimits, Visit};
use proptest::prelude::*;

fn ns(curve: Curve) -> NamespaceName {
    NamespaceName::new(curve.name()).unwrap()
}

fn store_with(curve: Curve, cells: &BTreeMap<Coord, Vec<u8>>) -> MemStore {
    let store = MemStore::new();
    assert!(store.create_namespace(&ns(curve), curve));
    for (coord, value) in cells {
        store.apply(&Mutation::Put {
            ns: ns(curve),
            coord: *coord,
            value: value.clone(),
        });
    }
    store
}

/// Every page of a scan with pages of `page` cells, checking that cursors
/// move forward; returns the cells in the order they came.
fn scan_all(
    store: &MemStore,
    curve: Curve,
    region: &CellBox,
    page: u64,
    steps: u64,
) -> Vec<(Coord, Vec<u8>)> {
    let mut out = Vec::new();
    let mut after = None;
    for _ in 0..1_000_000 {
        let mut cells = Vec::new();
        let outcome = store
            .scan(
                &ns(curve),
                region,
                after,
                ScanLimits {
                    max_cells: page,
                    max_steps: steps,
                },
                |coord, value| {
                    cells.push((coord, value.to_vec()));
                    Visit::Take
                },
            )
            .unwrap()
            .unwrap();
        assert_eq!(outcome.cells, cells.len() as u64);
        assert!(outcome.cells <= page);
        out.extend(cells);
        match outcome.resume_after {
            None => return out,
            Some(next) => {
                if let Some(previous) = after {
                    assert!(
                        curve.key(next) > curve.key(previous),
                        "cursor must move forward"
                    );
                }
                after = Some(next);
            }
        }
    }
    panic!("scan did not finish");
}

fn expected(
    curve: Curve,
    model: &BTreeMap<Coord, Vec<u8>>,
    region: &CellBox,
) -> Vec<(Coord, Vec<u8>)> {
    let mut cells: Vec<(Coord, Vec<u8>)> = model
        .iter()
        .filter(|(c, _)| region.contains(**c))
        .map(|(c, v)| (*c, v.clone()))
        .collect();
    cells.sort_by_key(|(c, _)| curve.key(*c));
    cells
}

fn count_all(store: &MemStore, curve: Curve, region: &CellBox, steps: u64) -> u64 {
    let mut total = 0;
    let mut after = None;
    loop {
        let outcome = store
            .count(
                &ns(curve),
                region,
                after,
                ScanLimits {
                    max_cells: u64::MAX,
                    max_steps: steps,
                },
            )
            .unwrap()
            .unwrap();
        total += outcome.cells;
        match outcome.resume_after {
            None => return total,
            Some(next) => after = Some(next),
        }
    }
}

fn coord_strategy(span: i32) -> impl Strategy<Value = Coord> {
    // Values near zero (crossing it), and near both ends of i32.
    let axis = prop_oneof![
        -span..span,
        i32::MIN..i32::MIN.saturating_add(span),
        i32::MAX.saturating_sub(span)..=i32::MAX,
    ];
    (axis.clone(), axis.clone(), axis).prop_map(|(x, y, z)| Coord::new(x, y, z))
}

fn box_strategy(span: i32) -> impl Strategy<Value = CellBox> {
    (coord_strategy(span), coord_strategy(span)).prop_map(|(a, b)| {
        CellBox::new(
            Coord::new(a.x.min(b.x), a.y.min(b.y), a.z.min(b.z)),
            Coord::new(a.x.max(b.x), a.y.max(b.y), a.z.max(b.z)),
        )
        .unwrap()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Sparse data anywhere (mostly near zero and the two ends of i32),
    /// boxes likewise; small pages and tiny step budgets force many cursors.
    #[test]
    fn sparse_data_matches_the_model(
        cells in prop::collection::btree_map(coord_strategy(12), prop::collection::vec(any::<u8>(), 0..4), 0..300),
        boxes in prop::collection::vec(box_strategy(12), 1..6),
        page in 1u64..50,
        steps in 1u64..64,
    ) {
        for curve in Curve::ALL {
            let store = store_with(curve, &cells);
            for region in &boxes {
                let want = expected(curve, &cells, region);
                prop_assert_eq!(&scan_all(&store, curve, region, page, steps), &want);
                prop_assert_eq!(&scan_all(&store, curve, region, u64::MAX, u64::MAX), &want);
                prop_assert_eq!(count_all(&store, curve, region, steps), want.len() as u64);
            }
        }
    }
}

/// A fully populated cube, boxes inside, across and around it.
#[test]
fn dense_data_matches_the_model() {
    let mut cells = BTreeMap::new();
    for x in -6..6 {
        for y in -6..6 {
            for z in -6..6 {
                cells.insert(Coord::new(x, y, z), vec![(x + y + z) as u8]);
            }
        }
    }
    let mut seed = 0x1234_5678_u64;
    let mut next = |range: i32| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % (2 * range as u64 + 1)) as i32 - range
    };
    for curve in Curve::ALL {
        let store = store_with(curve, &cells);
        for _ in 0..150 {
            let (a, b) = (
                Coord::new(next(9), next(9), next(9)),
                Coord::new(next(9), next(9), next(9)),
            );
            let region = CellBox::new(
                Coord::new(a.x.min(b.x), a.y.min(b.y), a.z.min(b.z)),
                Coord::new(a.x.max(b.x), a.y.max(b.y), a.z.max(b.z)),
            )
            .unwrap();
            let want = expected(curve, &cells, &region);
            assert_eq!(scan_all(&store, curve, &region, 7, 5), want);
            assert_eq!(scan_all(&store, curve, &region, 1 << 20, 1 << 20), want);
            assert_eq!(count_all(&store, curve, &region, 3), want.len() as u64);
        }
    }
}

/// Cells at the eight corners of the i32 cube and around zero; the whole
/// space is one box, counted without touching anything but those cells.
#[test]
fn extremes_and_the_whole_space() {
    let mut cells = BTreeMap::new();
    for x in [i32::MIN, -1, 0, i32::MAX] {
        for y in [i32::MIN, 0, i32::MAX] {
            for z in [i32::MIN, 1, i32::MAX] {
                cells.insert(Coord::new(x, y, z), format!("{x},{y},{z}").into_bytes());
            }
        }
    }
    let all = CellBox::new(
        Coord::new(i32::MIN, i32::MIN, i32::MIN),
        Coord::new(i32::MAX, i32::MAX, i32::MAX),
    )
    .unwrap();
    for curve in Curve::ALL {
        let store = store_with(curve, &cells);
        assert_eq!(
            scan_all(&store, curve, &all, 5, 1000),
            expected(curve, &cells, &all)
        );
        let outcome = store
            .count(
                &ns(curve),
                &all,
                None,
                ScanLimits {
                    max_cells: u64::MAX,
                    max_steps: u64::MAX,
                },
            )
            .unwrap()
            .unwrap();
        assert_eq!(outcome.cells, cells.len() as u64);
        assert_eq!(
            outcome.visited,
            cells.len() as u64,
            "only stored cells are touched"
        );
        assert!(outcome.resume_after.is_none());
        // Half-spaces and slabs that end exactly at the extremes.
        for region in [
            CellBox::new(
                Coord::new(0, i32::MIN, i32::MIN),
                Coord::new(i32::MAX, i32::MAX, i32::MAX),
            )
            .unwrap(),
            CellBox::new(
                Coord::new(i32::MIN, i32::MIN, i32::MIN),
                Coord::new(-1, 0, 1),
            )
            .unwrap(),
            CellBox::new(
                Coord::new(i32::MAX, i32::MIN, i32::MAX),
                Coord::new(i32::MAX, i32::MAX, i32::MAX),
            )
            .unwrap(),
        ] {
            assert_eq!(
                scan_all(&store, curve, &region, 2, 3),
                expected(curve, &cells, &region)
            );
        }
    }
}

#[test]
fn missing_namespace_and_a_cursor_at_the_last_key() {
    let store = MemStore::new();
    let region = CellBox::new(Coord::new(0, 0, 0), Coord::new(1, 1, 1)).unwrap();
    let limits = ScanLimits {
        max_cells: 10,
        max_steps: 10,
    };
    let nope = NamespaceName::new("nope").unwrap();
    assert!(
        store
            .scan(&nope, &region, None, limits, |_, _| Visit::Take)
            .map(Result::unwrap)
            .is_none()
    );
    let default = NamespaceName::new("default").unwrap();
    assert_eq!(store.curve(&default), Some(Curve::DEFAULT));
    let max = Coord::new(i32::MAX, i32::MAX, i32::MAX);
    let outcome = store
        .scan(
            &default,
            &CellBox::new(max, max).unwrap(),
            Some(max),
            limits,
            |_, _| Visit::Take,
        )
        .unwrap()
        .unwrap();
    assert_eq!((outcome.cells, outcome.resume_after), (0, None));
    assert!(
        !store.create_namespace(&default, Curve::Hilbert),
        "exists already"
    );
}

/// The visitor can end a page early (the server does when a response is
/// full); the cell it refused comes first on the next page.
#[test]
fn a_visitor_stop_resumes_at_the_refused_cell() {
    let mut cells = BTreeMap::new();
    for x in 0..4 {
        for y in 0..4 {
            cells.insert(Coord::new(x, y, 0), vec![x as u8, y as u8]);
        }
    }
    let region = CellBox::new(Coord::new(0, 0, 0), Coord::new(3, 3, 0)).unwrap();
    for curve in Curve::ALL {
        let store = store_with(curve, &cells);
        let mut got = Vec::new();
        let mut after = None;
        loop {
            let mut page = Vec::new();
            let outcome = store
                .scan(
                    &ns(curve),
                    &region,
                    after,
                    ScanLimits {
                        max_cells: 100,
                        max_steps: 100,
                    },
                    |c, v| {
                        if page.len() == 3 {
                            return Visit::Stop;
                        }
                        page.push((c, v.to_vec()));
                        Visit::Take
                    },
                )
                .unwrap()
                .unwrap();
            assert_eq!(outcome.cells, page.len() as u64);
            got.extend(page);
            match outcome.resume_after {
                Some(c) => after = Some(c),
                None => break,
            }
        }
        assert_eq!(got, expected(curve, &cells, &region));
    }
}

/// One writer rewrites a cube of cells with values that name their own
/// cell and a version; readers scan the cube meanwhile and check that every
/// value belongs to the cell it is returned for, that no cell appears twice
/// in a scan, and that versions seen by one reader never go backwards
/// (the writer applies in order, so anything else would be a torn read).
#[test]
fn scans_beside_the_writer_see_whole_values() {
    // 27 000 cells, rewritten 6 times: the delta is frozen and merged into
    // the sorted base several times while the readers scan.
    const SIDE: i32 = 30;
    const VERSIONS: u32 = 6;
    for curve in Curve::ALL {
        let store = Arc::new(MemStore::new());
        store.create_namespace(&ns(curve), curve);
        let value = |c: Coord, version: u32| {
            let mut v = format!("{},{},{}@", c.x, c.y, c.z).into_bytes();
            v.extend_from_slice(&version.to_le_bytes());
            // Long enough that a torn copy would show.
            v.extend(std::iter::repeat_n((version % 251) as u8, 64));
            v
        };
        let done = Arc::new(AtomicBool::new(false));
        let writer = {
            let store = Arc::clone(&store);
            let done = Arc::clone(&done);
            std::thread::spawn(move || {
                let mut existed = Vec::new();
                for version in 1..=VERSIONS {
                    let group: Vec<Mutation> = (0..SIDE * SIDE * SIDE)
                        .map(|i| {
                            let c = Coord::new(
                                i % SIDE - 15,
                                (i / SIDE) % SIDE - 15,
                                i / (SIDE * SIDE) - 15,
                            );
                            Mutation::Put {
                                ns: ns(curve),
                                coord: c,
                                value: value(c, version),
                            }
                        })
                        .collect();
                    for part in group.chunks(4096) {
                        let refs: Vec<&Mutation> = part.iter().collect();
                        store.apply_group(&refs, 0, &mut existed);
                    }
                }
                done.store(true, Ordering::SeqCst);
            })
        };
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let store = Arc::clone(&store);
                let done = Arc::clone(&done);
                std::thread::spawn(move || {
                    let region =
                        CellBox::new(Coord::new(-15, -15, -15), Coord::new(14, 14, 14)).unwrap();
                    let mut last_seen: BTreeMap<Coord, u32> = BTreeMap::new();
                    let mut scans = 0;
                    while !done.load(Ordering::SeqCst) || scans < 3 {
                        scans += 1;
                        let mut seen_now = std::collections::HashSet::new();
                        let mut after = None;
                        loop {
                            let outcome = store
                                .scan(
                                    &ns(curve),
                                    &region,
                                    after,
                                    ScanLimits {
                                        max_cells: 997,
                                        max_steps: 5000,
                                    },
                                    |c, v| {
                                        let prefix = format!("{},{},{}@", c.x, c.y, c.z);
                                        assert!(
                                            v.starts_with(prefix.as_bytes()),
                                            "value of another cell at {c}"
                                        );
                                        let at = prefix.len();
                                        let version =
                                            u32::from_le_bytes(v[at..at + 4].try_into().unwrap());
                                        assert!(
                                            v[at + 4..].iter().all(|b| *b == (version % 251) as u8),
                                            "torn value at {c}"
                                        );
                                        assert!(seen_now.insert(c), "{c} twice in one scan");
                                        let previous = last_seen.insert(c, version).unwrap_or(0);
                                        assert!(
                                            version >= previous,
                                            "{c} went back from {previous} to {version}"
                                        );
                                        Visit::Take
                                    },
                                )
                                .unwrap()
                                .unwrap();
                            match outcome.resume_after {
                                Some(c) => after = Some(c),
                                None => break,
                            }
                        }
                    }
                    scans
                })
            })
            .collect();
        writer.join().unwrap();
        for reader in readers {
            assert!(reader.join().unwrap() >= 3);
        }
        let region = CellBox::new(Coord::new(-15, -15, -15), Coord::new(14, 14, 14)).unwrap();
        let all = scan_all(&store, curve, &region, 1000, 1000);
        assert_eq!(all.len(), (SIDE * SIDE * SIDE) as usize);
        assert!(all.iter().all(|(c, v)| *v == value(*c, VERSIONS)));
        assert_eq!(store.cell_count(), (SIDE * SIDE * SIDE) as u64);
    }
}
