//! Guards edges end to end through a real `cubed`: link/unlink/edges/walk/path/detach answers, bad input (NaN, infinite and negative weights, over-long labels, walks past the limits, a walk from a coordinate with no edges), `--max-edges-per-cell` under concurrent links, and edges surviving `kill -9` + restart and checkpoint + compaction exactly.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::thread;

use cube_client::{
    Client, ClientError, Coord, Direction, EdgeLabel, ErrorCode, LocalDaemon, NamespaceName,
    Request, Response, WalkOptions, WalkStop,
};

const NS: &str = "default";

fn c(x: i32, y: i32, z: i32) -> Coord {
    Coord::new(x, y, z)
}

fn code(err: &ClientError) -> Option<ErrorCode> {
    err.server_code()
}

/// `(from, to, label) -> weight`: what the daemon must hold.
type Model = BTreeMap<(Coord, Coord, String), f64>;

/// Every edge the daemon holds among `coords`, as outgoing edges.
fn snapshot(client: &mut Client, coords: &[Coord]) -> Model {
    let mut found = Model::new();
    for &coord in coords {
        for e in client.edges(NS, coord, Direction::Out, None).unwrap() {
            found.insert((coord, e.other, e.label.as_str().to_owned()), e.weight);
        }
        // The incoming side must agree with the outgoing side.
        for e in client.edges(NS, coord, Direction::In, None).unwrap() {
            let outgoing = client.edges(NS, e.other, Direction::Out, None).unwrap();
            assert!(
                outgoing
                    .iter()
                    .any(|o| o.other == coord && o.label == e.label && o.weight == e.weight),
                "{} -> {coord} ({}) is incoming but not outgoing",
                e.other,
                e.label
            );
        }
    }
    found
}

/// A deterministic mix of links (some re-links), unlinks and detaches
/// over a 4x4x1 grid, applied to the daemon and the model alike.
fn scramble(client: &mut Client, model: &mut Model, seed: u64, ops: usize) {
    let mut state = seed;
    let mut next = move |n: u64| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) % n
    };
    let labels = ["", "road", "pipe"];
    for _ in 0..ops {
        let from = c(next(4) as i32, next(4) as i32, 0);
        let to = c(next(4) as i32, next(4) as i32, 0);
        let label = labels[next(3) as usize];
        match next(10) {
            0..=5 => {
                let weight = next(100) as f64 / 4.0;
                let created = client.link(NS, from, to, label, weight).unwrap().created;
                let key = (from, to, label.to_owned());
                assert_eq!(created, !model.contains_key(&key));
                model.insert(key, weight);
            }
            6..=8 => {
                let existed = client.unlink(NS, from, to, label).unwrap();
                assert_eq!(
                    existed,
                    model.remove(&(from, to, label.to_owned())).is_some()
                );
            }
            _ => {
                let detached = client.detach(NS, from).unwrap();
                let before = model.len();
                model.retain(|(a, b, _), _| *a != from && *b != from);
                assert_eq!(detached.edges_removed as usize, before - model.len());
            }
        }
    }
}

fn grid() -> Vec<Coord> {
    (0..4)
        .flat_map(|x| (0..4).map(move |y| c(x, y, 0)))
        .collect()
}

#[test]
fn link_walk_path_and_detach_answer_as_documented() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut client = daemon.client().unwrap();
    // a -> b -> c -> a (a cycle), a -> c costs more than a -> b -> c.
    let (a, b, cc, d) = (c(0, 0, 0), c(1, 0, 0), c(2, 0, 0), c(9, 9, 9));
    assert!(client.link(NS, a, b, "", 1.0).unwrap().created);
    assert!(client.link(NS, b, cc, "", 1.5).unwrap().created);
    assert!(client.link(NS, cc, a, "back", 1.0).unwrap().created);
    assert!(client.link(NS, a, cc, "", 5.0).unwrap().created);
    // Re-linking updates the weight.
    assert!(!client.link(NS, a, cc, "", 4.0).unwrap().created);
    client.put(NS, b, b"bee").unwrap();

    let out = client.edges(NS, a, Direction::Out, None).unwrap();
    assert_eq!(out.len(), 2);
    assert!(out.iter().any(|e| e.other == cc && e.weight == 4.0));
    let inc = client.edges(NS, a, Direction::In, None).unwrap();
    assert_eq!(inc.len(), 1);
    assert_eq!((inc[0].other, inc[0].label.as_str()), (cc, "back"));
    assert_eq!(
        client
            .edges(NS, a, Direction::Both, Some("back"))
            .unwrap()
            .len(),
        1
    );

    let walk = client
        .walk(
            NS,
            a,
            &WalkOptions {
                with_values: true,
                ..WalkOptions::default()
            },
        )
        .unwrap();
    assert_eq!(walk.stop, WalkStop::Complete);
    let reached: Vec<(Coord, u32, Option<Vec<u8>>)> = walk
        .nodes
        .iter()
        .map(|n| (n.coord, n.distance, n.value.clone()))
        .collect();
    assert_eq!(reached.len(), 2, "{reached:?}: the start is never listed");
    assert!(reached.contains(&(b, 1, Some(b"bee".to_vec()))));
    assert!(reached.contains(&(cc, 1, None)));

    let path = client
        .path(NS, a, cc, None, f64::INFINITY)
        .unwrap()
        .path
        .unwrap();
    assert_eq!(path.coords, vec![a, b, cc]);
    assert_eq!(path.cost, 2.5);
    assert!(
        client.path(NS, a, cc, None, 2.0).unwrap().path.is_none(),
        "beyond max_cost"
    );
    assert!(
        client
            .path(NS, a, d, None, f64::INFINITY)
            .unwrap()
            .path
            .is_none()
    );

    // A walk from a coordinate with no edges is empty, not an error.
    let lonely = client.walk(NS, d, &WalkOptions::default()).unwrap();
    assert!(lonely.nodes.is_empty() && lonely.stop == WalkStop::Complete);

    // Plain del keeps the edges; detach removes value and edges together.
    assert!(client.del(NS, b).unwrap());
    assert_eq!(client.edges(NS, b, Direction::Both, None).unwrap().len(), 2);
    client.put(NS, b, b"again").unwrap();
    let detached = client.detach(NS, b).unwrap();
    assert!(detached.existed);
    assert_eq!(detached.edges_removed, 2);
    assert!(client.get(NS, b).unwrap().is_none());
    assert!(
        client
            .edges(NS, b, Direction::Both, None)
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        client
            .path(NS, a, cc, None, f64::INFINITY)
            .unwrap()
            .path
            .unwrap()
            .cost,
        4.0
    );
}

#[test]
fn bad_input_gets_clear_errors() {
    let daemon = LocalDaemon::start_fresh(&["--max-walk-depth", "5"]).unwrap();
    let mut client = daemon.client().unwrap();
    let ns = NamespaceName::new(NS).unwrap();
    for weight in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1.0] {
        // The client refuses before sending ...
        let err = client
            .link(NS, c(0, 0, 0), c(1, 0, 0), "", weight)
            .unwrap_err();
        assert!(matches!(err, ClientError::BadArgument(_)), "{err:?}");
        // ... and so does the server, for clients that do not.
        let err = client
            .call(&Request::Link {
                ns: ns.clone(),
                from: c(0, 0, 0),
                to: c(1, 0, 0),
                label: EdgeLabel::default(),
                weight,
            })
            .unwrap_err();
        assert_eq!(code(&err), Some(ErrorCode::BadWeight), "{err}");
        assert!(err.to_string().contains("weight"), "{err}");
    }
    assert!(
        client
            .edges(NS, c(0, 0, 0), Direction::Both, None)
            .unwrap()
            .is_empty()
    );
    let err = client
        .link(NS, c(0, 0, 0), c(1, 0, 0), &"x".repeat(65), 1.0)
        .unwrap_err();
    assert!(err.to_string().contains("at most 64"), "{err}");
    let err = client
        .walk(
            NS,
            c(0, 0, 0),
            &WalkOptions {
                max_depth: 6,
                ..WalkOptions::default()
            },
        )
        .unwrap_err();
    assert_eq!(code(&err), Some(ErrorCode::LimitExceeded), "{err}");
    assert!(err.to_string().contains("--max-walk-depth"), "{err}");
    let err = client
        .call(&Request::Path {
            ns: ns.clone(),
            from: c(0, 0, 0),
            to: c(1, 0, 0),
            label: None,
            max_cost: f64::NAN,
        })
        .unwrap_err();
    assert_eq!(code(&err), Some(ErrorCode::InvalidArgument), "{err}");
    let err = client
        .link("nope", c(0, 0, 0), c(1, 0, 0), "", 1.0)
        .unwrap_err();
    assert_eq!(code(&err), Some(ErrorCode::NoSuchNamespace), "{err}");
    let err = client
        .walk("nope", c(0, 0, 0), &WalkOptions::default())
        .unwrap_err();
    assert_eq!(code(&err), Some(ErrorCode::NoSuchNamespace), "{err}");
    // The connection is still fine after all that.
    client.ping().unwrap();
}

#[test]
fn walks_stop_at_the_node_and_work_limits() {
    let daemon = LocalDaemon::start_fresh(&["--max-walk-work", "10"]).unwrap();
    let mut client = daemon.client().unwrap();
    // A chain of 20.
    for x in 0..20 {
        client
            .link(NS, c(x, 0, 0), c(x + 1, 0, 0), "", 1.0)
            .unwrap();
    }
    let walk = client
        .walk(
            NS,
            c(0, 0, 0),
            &WalkOptions {
                max_nodes: 3,
                ..WalkOptions::default()
            },
        )
        .unwrap();
    assert_eq!(walk.stop, WalkStop::MaxNodes);
    let distances: Vec<u32> = walk.nodes.iter().map(|n| n.distance).collect();
    assert_eq!(distances, [1, 2, 3]);
    let walk = client
        .walk(NS, c(0, 0, 0), &WalkOptions::default())
        .unwrap();
    assert_eq!(walk.stop, WalkStop::MaxWork);
    assert_eq!((walk.nodes.len(), walk.edges_examined), (10, 10));
    let err = client
        .path(NS, c(0, 0, 0), c(20, 0, 0), None, f64::INFINITY)
        .unwrap_err();
    assert_eq!(code(&err), Some(ErrorCode::LimitExceeded), "{err}");
    assert!(err.to_string().contains("--max-walk-work"), "{err}");
    // In reverse, from the end, following incoming edges.
    let back = client
        .walk(
            NS,
            c(20, 0, 0),
            &WalkOptions {
                direction: Direction::In,
                max_depth: 2,
                ..WalkOptions::default()
            },
        )
        .unwrap();
    let coords: Vec<Coord> = back.nodes.iter().map(|n| n.coord).collect();
    assert_eq!(coords, [c(19, 0, 0), c(18, 0, 0)]);
}

#[test]
fn edges_per_cell_limit_holds_under_concurrent_links() {
    let daemon = LocalDaemon::start_fresh(&["--max-edges-per-cell", "10"]).unwrap();
    let hub = c(0, 0, 0);
    // 8 clients race to link 5 sources each into one hub: only 10 may win.
    let results: Vec<(usize, usize)> = thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|t| {
                let mut client = daemon.client().unwrap();
                scope.spawn(move || {
                    let (mut ok, mut refused) = (0, 0);
                    for i in 0..5 {
                        match client.link(NS, c(t + 1, i, 0), hub, "", 1.0) {
                            Ok(linked) if linked.created => ok += 1,
                            Err(e) if code(&e) == Some(ErrorCode::LimitExceeded) => {
                                assert!(e.to_string().contains("--max-edges-per-cell"), "{e}");
                                refused += 1;
                            }
                            other => panic!("unexpected {other:?}"),
                        }
                    }
                    (ok, refused)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let linked: usize = results.iter().map(|(ok, _)| ok).sum();
    assert_eq!(linked, 10, "{results:?}");
    let mut client = daemon.client().unwrap();
    assert_eq!(
        client.edges(NS, hub, Direction::In, None).unwrap().len(),
        10
    );
    // Re-linking an existing edge is not a new edge; unlinking makes room.
    let first = client.edges(NS, hub, Direction::In, None).unwrap()[0].other;
    assert!(!client.link(NS, first, hub, "", 2.0).unwrap().created);
    assert!(client.link(NS, c(50, 0, 0), hub, "", 1.0).is_err());
    assert!(client.unlink(NS, first, hub, "").unwrap());
    assert!(client.link(NS, c(50, 0, 0), hub, "", 1.0).unwrap().created);
}

#[test]
fn edges_survive_kill9_and_restart() {
    let mut daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut client = daemon.client().unwrap();
    let mut model = Model::new();
    scramble(&mut client, &mut model, 7, 400);
    assert_eq!(snapshot(&mut client, &grid()), model);
    drop(client);
    daemon.kill9().unwrap();
    daemon.restart().unwrap();
    let mut client = daemon.client().unwrap();
    assert_eq!(snapshot(&mut client, &grid()), model, "after kill -9");
    scramble(&mut client, &mut model, 8, 200);
    drop(client);
    daemon.terminate().unwrap();
    daemon.restart().unwrap();
    let mut client = daemon.client().unwrap();
    assert_eq!(
        snapshot(&mut client, &grid()),
        model,
        "after a clean restart"
    );
}

#[test]
fn edges_survive_checkpoint_and_compaction() {
    let mut daemon = LocalDaemon::start_fresh(&["--wal-segment-bytes", "65536"]).unwrap();
    let mut client = daemon.client().unwrap();
    let mut model = Model::new();
    scramble(&mut client, &mut model, 11, 600);
    client.checkpoint(false).unwrap();
    // Later links, unlinks and detaches land in a second delta over the first.
    scramble(&mut client, &mut model, 12, 300);
    client.checkpoint(true).unwrap();
    // And some only in the WAL tail.
    scramble(&mut client, &mut model, 13, 100);
    drop(client);
    daemon.kill9().unwrap();
    daemon.restart().unwrap();
    let mut client = daemon.client().unwrap();
    let loaded = client
        .stats()
        .unwrap()
        .into_iter()
        .find(|e| e.name == "recovery.checkpoint_entries")
        .map(|e| e.value);
    assert!(
        matches!(loaded, Some(cube_client::StatsValue::Count(n)) if n > 0),
        "{loaded:?}"
    );
    assert_eq!(snapshot(&mut client, &grid()), model);
}

#[test]
fn a_walk_never_sees_half_of_a_detach() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut client = daemon.client().unwrap();
    // A star: hub -> 50 spokes, and spoke 0 -> hub, linked last. A walk
    // from spoke 0 reaches nothing until that last link, then the whole
    // star (the hub and 49 other spokes). A detach of the hub removes all 51
    // edges in one record, so a walk sees the whole star or nothing, never
    // part of it.
    let hub = c(0, 0, 0);
    let spokes: Vec<Coord> = (1..=50).map(|i| c(i, 0, 0)).collect();
    let build = |client: &mut Client| {
        for &s in &spokes {
            client.link(NS, hub, s, "", 1.0).unwrap();
        }
        client.link(NS, spokes[0], hub, "", 1.0).unwrap();
    };
    build(&mut client);
    thread::scope(|scope| {
        let mut walker = daemon.client().unwrap();
        let start = spokes[0];
        let watcher = scope.spawn(move || {
            for _ in 0..300 {
                let walk = walker.walk(NS, start, &WalkOptions::default()).unwrap();
                assert!(
                    walk.nodes.len() == 50 || walk.nodes.is_empty(),
                    "a walk saw {} nodes: half of a detach",
                    walk.nodes.len()
                );
            }
        });
        for _ in 0..5 {
            assert_eq!(client.detach(NS, hub).unwrap().edges_removed, 51);
            build(&mut client);
        }
        watcher.join().unwrap();
    });
}

#[test]
fn responses_encode_what_the_server_holds() {
    // `Response::Link` and `Response::Unlink` answers carry real LSNs.
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut client = daemon.client().unwrap();
    let ns = NamespaceName::new(NS).unwrap();
    let answer = client
        .call(&Request::Link {
            ns: ns.clone(),
            from: c(0, 0, 0),
            to: c(0, 0, 0),
            label: EdgeLabel::new("self").unwrap(),
            weight: 0.0,
        })
        .unwrap();
    let Response::Link { lsn, created } = answer else {
        panic!("{answer:?}")
    };
    assert!(lsn > 0 && created);
    let answer = client
        .call(&Request::Unlink {
            ns,
            from: c(0, 0, 0),
            to: c(0, 0, 0),
            label: EdgeLabel::new("self").unwrap(),
        })
        .unwrap();
    assert!(matches!(answer, Response::Unlink { lsn: l, existed: true } if l > lsn));
}
