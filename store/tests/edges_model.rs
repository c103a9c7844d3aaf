//! Guards edges in the store against a plain in-test graph model: random links (re-links, self-loops, parallel edges with different labels), unlinks, detaches and deletes of endpoints, then `edges`, `walk` (every direction, depth, label filter and node limit) and `path` (Dijkstra against a brute-force Bellman-Ford, `max_cost`) must agree with the model; the same ops through the engine survive checkpoints, compaction and reopening; and a detach sees a link queued just before it.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use cube_protocol::{Coord, Direction, EdgeLabel, EdgeWeight, NamespaceName, WalkStop};
use cube_store::{EdgeKey, Engine, EngineConfig, MemStore, Mutation, WalkLimits};
use proptest::prelude::*;

fn ns() -> NamespaceName {
    NamespaceName::new("default").unwrap()
}

/// Six coordinates, some far apart, so walks and paths cross the map.
fn point(i: u8) -> Coord {
    match i % 6 {
        0 => Coord::new(0, 0, 0),
        1 => Coord::new(1, 0, 0),
        2 => Coord::new(-1, 2, 3),
        3 => Coord::new(i32::MAX, i32::MIN, 0),
        4 => Coord::new(5, 5, 5),
        _ => Coord::new(0, -7, 1),
    }
}

const LABELS: [&str; 3] = ["", "road", "pipe"];
const WEIGHTS: [f64; 5] = [0.0, 0.5, 1.0, 2.0, 7.25];

#[derive(Clone, Debug)]
enum Op {
    Link(u8, u8, u8, u8),
    Unlink(u8, u8, u8),
    Detach(u8),
    Del(u8),
    Put(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..6u8, 0..6u8, 0..3u8, 0..5u8).prop_map(|(a, b, l, w)| Op::Link(a, b, l, w)),
        2 => (0..6u8, 0..6u8, 0..3u8).prop_map(|(a, b, l)| Op::Unlink(a, b, l)),
        1 => (0..6u8).prop_map(Op::Detach),
        1 => (0..6u8).prop_map(Op::Del),
        1 => (0..6u8).prop_map(Op::Put),
    ]
}

/// The model: `(from, to, label) -> weight`, and the cells with values.
#[derive(Default)]
struct Model {
    edges: BTreeMap<(Coord, Coord, String), f64>,
    cells: BTreeSet<Coord>,
}

fn edge(a: u8, b: u8, l: u8) -> EdgeKey {
    EdgeKey::new(
        point(a),
        point(b),
        EdgeLabel::new(LABELS[l as usize]).unwrap(),
    )
}

/// Applies `op` to both; checks what the store says existed.
fn apply(store: &MemStore, model: &mut Model, op: &Op) {
    match *op {
        Op::Link(a, b, l, w) => {
            let weight = WEIGHTS[w as usize];
            let existed = store.apply(&Mutation::Link {
                ns: ns(),
                edge: edge(a, b, l),
                weight: EdgeWeight::new(weight).unwrap(),
            });
            let old = model
                .edges
                .insert((point(a), point(b), LABELS[l as usize].to_owned()), weight);
            assert_eq!(existed, old.is_some());
        }
        Op::Unlink(a, b, l) => {
            let existed = store.apply(&Mutation::Unlink {
                ns: ns(),
                edge: edge(a, b, l),
            });
            let old = model
                .edges
                .remove(&(point(a), point(b), LABELS[l as usize].to_owned()));
            assert_eq!(existed, old.is_some());
        }
        Op::Detach(a) => {
            let coord = point(a);
            // What the writer does: list the incident edges, then apply.
            let edges = store.incident_edges(&ns(), coord).unwrap();
            let mut listed: Vec<_> = edges
                .iter()
                .map(|e| (e.from, e.to, e.label.as_str().to_owned()))
                .collect();
            listed.sort();
            let before = listed.len();
            listed.dedup();
            assert_eq!(listed.len(), before, "an edge listed twice");
            let expected: Vec<_> = model
                .edges
                .keys()
                .filter(|(f, t, _)| *f == coord || *t == coord)
                .cloned()
                .collect();
            assert_eq!(listed, expected);
            let existed = store.apply(&Mutation::Detach {
                ns: ns(),
                coord,
                edges,
            });
            assert_eq!(existed, model.cells.remove(&coord));
            model
                .edges
                .retain(|(f, t, _), _| *f != coord && *t != coord);
        }
        Op::Del(a) => {
            let existed = store.apply(&Mutation::Del {
                ns: ns(),
                coord: point(a),
            });
            assert_eq!(existed, model.cells.remove(&point(a)));
        }
        Op::Put(a) => {
            store.apply(&Mutation::Put {
                ns: ns(),
                coord: point(a),
                value: format!("v{a}").into_bytes(),
            });
            model.cells.insert(point(a));
        }
    }
}

fn accepts(label: &str, filter: Option<&str>) -> bool {
    filter.is_none_or(|f| f == label)
}

/// Neighbours of `c` in the model along `direction` with `filter`.
fn neighbours(model: &Model, c: Coord, direction: Direction, filter: Option<&str>) -> Vec<Coord> {
    let mut out = Vec::new();
    for (f, t, l) in model.edges.keys() {
        if !accepts(l, filter) {
            continue;
        }
        if direction.includes_out() && *f == c {
            out.push(*t);
        }
        if direction.includes_in() && *t == c {
            out.push(*f);
        }
    }
    out
}

/// Model BFS: every coordinate within `depth` hops (not the start) and its distance.
fn model_walk(
    model: &Model,
    start: Coord,
    direction: Direction,
    filter: Option<&str>,
    depth: u32,
) -> BTreeMap<Coord, u32> {
    let mut dist = BTreeMap::new();
    let mut queue = VecDeque::from([(start, 0u32)]);
    let mut seen = BTreeSet::from([start]);
    while let Some((c, d)) = queue.pop_front() {
        if d == depth {
            continue;
        }
        for n in neighbours(model, c, direction, filter) {
            if seen.insert(n) {
                dist.insert(n, d + 1);
                queue.push_back((n, d + 1));
            }
        }
    }
    dist
}

/// Model cheapest cost by Bellman-Ford (weights are non-negative).
fn model_cost(model: &Model, from: Coord, to: Coord, filter: Option<&str>) -> Option<f64> {
    let mut best: BTreeMap<Coord, f64> = BTreeMap::from([(from, 0.0)]);
    for _ in 0..=model.edges.len() {
        let mut changed = false;
        for ((f, t, l), w) in &model.edges {
            if !accepts(l, filter) {
                continue;
            }
            if let Some(&cf) = best.get(f) {
                let candidate = cf + w;
                if best.get(t).is_none_or(|&ct| candidate < ct) {
                    best.insert(*t, candidate);
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    best.get(&to).copied()
}

fn limits(depth: u32, nodes: u32) -> WalkLimits {
    WalkLimits {
        max_depth: depth,
        max_nodes: nodes,
        max_work: u64::MAX,
        max_answer_bytes: usize::MAX,
    }
}

fn check(store: &MemStore, model: &Model) {
    let directions = [Direction::Out, Direction::In, Direction::Both];
    let filters = [None, Some(""), Some("road"), Some("nowhere")];
    for a in 0..6u8 {
        let c = point(a);
        // edges
        for direction in directions {
            for filter in filters {
                let label = filter.map(|f| EdgeLabel::new(f).unwrap());
                let listed = store
                    .edges(&ns(), c, direction, label.as_ref(), usize::MAX)
                    .unwrap();
                let mut got: Vec<_> = listed
                    .iter()
                    .map(|e| {
                        let (f, t) = match e.direction {
                            Direction::Out => (c, e.other),
                            _ => (e.other, c),
                        };
                        (f, t, e.label.as_str().to_owned(), e.weight.to_bits())
                    })
                    .collect();
                got.sort();
                let mut want: Vec<_> = model
                    .edges
                    .iter()
                    .filter(|((_, _, l), _)| accepts(l, filter))
                    .flat_map(|((f, t, l), w)| {
                        let mut rows = Vec::new();
                        if direction.includes_out() && *f == c {
                            rows.push((*f, *t, l.clone(), w.to_bits()));
                        }
                        if direction.includes_in() && *t == c {
                            rows.push((*f, *t, l.clone(), w.to_bits()));
                        }
                        rows
                    })
                    .collect();
                want.sort();
                assert_eq!(got, want, "edges of {c} {direction:?} {filter:?}");
            }
        }
        // walks
        for direction in directions {
            for filter in filters {
                let label = filter.map(|f| EdgeLabel::new(f).unwrap());
                for depth in [1, 2, 64] {
                    let walk = store
                        .walk(
                            &ns(),
                            c,
                            direction,
                            label.as_ref(),
                            true,
                            limits(depth, 1000),
                        )
                        .unwrap()
                        .unwrap();
                    assert_eq!(walk.stop, WalkStop::Complete);
                    let want = model_walk(model, c, direction, filter, depth);
                    let got: BTreeMap<Coord, u32> =
                        walk.nodes.iter().map(|n| (n.coord, n.distance)).collect();
                    assert_eq!(got.len(), walk.nodes.len(), "a coordinate twice");
                    assert_eq!(
                        got, want,
                        "walk from {c} {direction:?} {filter:?} depth {depth}"
                    );
                    assert!(
                        walk.nodes
                            .windows(2)
                            .all(|w| w[0].distance <= w[1].distance),
                        "nearest first"
                    );
                    for n in &walk.nodes {
                        assert_eq!(n.value.is_some(), model.cells.contains(&n.coord));
                    }
                    // Cut short by the node limit: complete levels, then part of one.
                    if want.len() > 1 {
                        let cut = store
                            .walk(&ns(), c, direction, label.as_ref(), false, limits(depth, 1))
                            .unwrap()
                            .unwrap();
                        assert_eq!(cut.stop, WalkStop::MaxNodes);
                        assert_eq!(cut.nodes.len(), 1);
                        assert_eq!(cut.nodes[0].distance, 1);
                        assert_eq!(want.get(&cut.nodes[0].coord), Some(&1));
                    }
                }
            }
        }
        // paths
        for b in 0..6u8 {
            let to = point(b);
            for filter in [None, Some("road")] {
                let label = filter.map(|f| EdgeLabel::new(f).unwrap());
                let want = if c == to {
                    Some(0.0)
                } else {
                    model_cost(model, c, to, filter)
                };
                let found = store
                    .path(
                        &ns(),
                        c,
                        to,
                        label.as_ref(),
                        f64::INFINITY,
                        limits(64, 1000),
                    )
                    .unwrap()
                    .unwrap()
                    .path;
                assert_eq!(
                    found.as_ref().map(|p| p.cost),
                    want,
                    "path {c} -> {to} {filter:?}"
                );
                if let Some(path) = found {
                    assert_eq!((path.coords[0], *path.coords.last().unwrap()), (c, to));
                    // Every step is a real edge (cheapest among parallel
                    // ones) and the steps add up to the cost.
                    let mut total = 0.0;
                    for step in path.coords.windows(2) {
                        total += model
                            .edges
                            .iter()
                            .filter(|((f, t, l), _)| {
                                *f == step[0] && *t == step[1] && accepts(l, filter)
                            })
                            .map(|(_, w)| *w)
                            .fold(f64::INFINITY, f64::min);
                    }
                    assert_eq!(total, path.cost);
                    // Just under the cost: no path.
                    if path.cost > 0.0 {
                        let bounded = store
                            .path(
                                &ns(),
                                c,
                                to,
                                label.as_ref(),
                                path.cost - 0.25,
                                limits(64, 1000),
                            )
                            .unwrap()
                            .unwrap();
                        assert!(bounded.path.is_none());
                    }
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn the_store_agrees_with_the_model(ops in proptest::collection::vec(op(), 0..60)) {
        let store = MemStore::new();
        let mut model = Model::default();
        for op in &ops {
            apply(&store, &mut model, op);
        }
        check(&store, &model);
        prop_assert_eq!(store.edge_count(), model.edges.len() as u64);
    }
}

#[test]
fn work_limits_stop_walks_and_paths() {
    let store = MemStore::new();
    // A complete graph on the six points: 30 edges.
    for a in 0..6u8 {
        for b in 0..6u8 {
            if a != b {
                store.apply(&Mutation::Link {
                    ns: ns(),
                    edge: edge(a, b, 0),
                    weight: EdgeWeight::DEFAULT,
                });
            }
        }
    }
    let mut tight = limits(64, 1000);
    tight.max_work = 3;
    let walk = store
        .walk(&ns(), point(0), Direction::Out, None, false, tight)
        .unwrap()
        .unwrap();
    assert_eq!((walk.stop, walk.edges_examined), (WalkStop::MaxWork, 3));
    assert_eq!(walk.nodes.len(), 3);
    let path = store
        .path(&ns(), point(0), point(5), None, f64::INFINITY, tight)
        .unwrap();
    assert!(path.is_err());
    // The answer-size bound: values of 100 bytes, room for about two.
    for a in 1..6u8 {
        store.apply(&Mutation::Put {
            ns: ns(),
            coord: point(a),
            value: vec![b'x'; 100],
        });
    }
    let mut small = limits(64, 1000);
    small.max_answer_bytes = 250;
    let walk = store
        .walk(&ns(), point(0), Direction::Out, None, true, small)
        .unwrap()
        .unwrap();
    assert_eq!(walk.stop, WalkStop::FrameFull);
    assert_eq!(walk.nodes.len(), 2);
}

/// The engine applies ops through the WAL; checkpoints and compaction fold
/// them; reopening must give back exactly the model.
#[test]
fn edges_survive_checkpoints_compaction_and_reopening() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = EngineConfig::new(tmp.path());
    config.group_commit.segment_bytes = 16 * 1024;
    let mut model = Model::default();
    let mut seed = 99u64;
    let mut next = move |n: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((seed >> 33) % n) as u8
    };
    for round in 0..4 {
        let engine = Engine::open(config.clone()).unwrap();
        assert_check_engine(&engine, &model);
        let session = engine.session().unwrap();
        for i in 0..400 {
            let op = match next(10) {
                0..=5 => Op::Link(next(6), next(6), next(3), next(5)),
                6 | 7 => Op::Unlink(next(6), next(6), next(3)),
                8 => Op::Detach(next(6)),
                _ => Op::Put(next(6)),
            };
            let mutation = match op {
                Op::Link(a, b, l, w) => {
                    model.edges.insert(
                        (point(a), point(b), LABELS[l as usize].to_owned()),
                        WEIGHTS[w as usize],
                    );
                    Mutation::Link {
                        ns: ns(),
                        edge: edge(a, b, l),
                        weight: EdgeWeight::new(WEIGHTS[w as usize]).unwrap(),
                    }
                }
                Op::Unlink(a, b, l) => {
                    model
                        .edges
                        .remove(&(point(a), point(b), LABELS[l as usize].to_owned()));
                    Mutation::Unlink {
                        ns: ns(),
                        edge: edge(a, b, l),
                    }
                }
                Op::Put(a) => {
                    model.cells.insert(point(a));
                    Mutation::Put {
                        ns: ns(),
                        coord: point(a),
                        value: b"v".to_vec(),
                    }
                }
                Op::Detach(a) | Op::Del(a) => {
                    let coord = point(a);
                    model.cells.remove(&coord);
                    model
                        .edges
                        .retain(|(f, t, _), _| *f != coord && *t != coord);
                    let (removed, _) = session
                        .transact(move |view| {
                            let edges = view.incident_edges(&ns(), coord);
                            let n = edges.len();
                            view.emit(Mutation::Detach {
                                ns: ns(),
                                coord,
                                edges,
                            });
                            n
                        })
                        .unwrap();
                    let _ = removed;
                    continue;
                }
            };
            session.write(mutation).unwrap();
            if i % 150 == 149 {
                if round % 2 == 0 {
                    engine.checkpoint().unwrap();
                } else {
                    engine.compact().unwrap();
                }
            }
        }
        assert_check_engine(&engine, &model);
        drop(session);
        if round == 3 {
            engine.shutdown().unwrap();
        } else {
            engine.close_without_checkpoint();
        }
    }
    let engine = Engine::open(config).unwrap();
    assert_check_engine(&engine, &model);
    engine.close_without_checkpoint();
}

fn assert_check_engine(engine: &Engine, model: &Model) {
    let store: &Arc<MemStore> = engine.memstore();
    check(store, model);
    for a in 0..6u8 {
        assert_eq!(
            engine.get(&ns(), point(a)).unwrap().unwrap().is_some(),
            model.cells.contains(&point(a))
        );
    }
}

/// A detach queued right behind links must remove them, whether or not
/// the writer put them in the same group (the transaction then reads them
/// from the group's overlay, not from the store).
#[test]
fn a_detach_sees_links_queued_before_it() {
    let tmp = tempfile::tempdir().unwrap();
    let engine = Engine::open(EngineConfig::new(tmp.path())).unwrap();
    let linker = engine.session().unwrap();
    let detacher = engine.session().unwrap();
    let hub = point(0);
    for round in 0..200u8 {
        let spokes = [point(1 + round % 5), point(2 + round % 4)];
        for (i, spoke) in spokes.iter().enumerate() {
            let edge = if i == 0 {
                EdgeKey::new(hub, *spoke, EdgeLabel::default())
            } else {
                EdgeKey::new(*spoke, hub, EdgeLabel::new("in").unwrap())
            };
            linker.submit(
                Mutation::Link {
                    ns: ns(),
                    edge,
                    weight: EdgeWeight::DEFAULT,
                },
                |reply, _| {
                    reply.unwrap();
                },
            );
        }
        let (removed, _) = detacher
            .transact(move |view| {
                let edges = view.incident_edges(&ns(), hub);
                let (out, inc) = view.edge_degree(&ns(), hub);
                assert_eq!(out + inc, edges.len());
                let n = edges.len();
                view.emit(Mutation::Detach {
                    ns: ns(),
                    coord: hub,
                    edges,
                });
                n
            })
            .unwrap();
        assert_eq!(removed, 2, "round {round}");
        assert!(
            engine
                .memstore()
                .incident_edges(&ns(), hub)
                .unwrap()
                .is_empty()
        );
    }
    engine.close_without_checkpoint();
}
