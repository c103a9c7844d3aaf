//! The `walk` workload's pieces: a lattice of edges over the key space,
//! the requests (walks and paths mixed with links and unlinks), and the
//! checks of what walks and paths return.
//!
//! Key `k` lives at `coord_of(k)`; before the clock starts every key is
//! linked to its lattice neighbours (x +- 1 within its row, y +- 1 within
//! its plane, z +- 1), weight 1, empty label. During the run each client
//! links and unlinks only edges leaving its own keys, and only between
//! lattice neighbours. So whatever the interleaving, every edge joins two
//! coordinates one lattice unit apart, and an answer can be checked without
//! knowing the exact graph: a coordinate at walk distance `d` is at most
//! `d` lattice units away, and a path moves one lattice unit at a time and
//! costs exactly its hop count.

use std::collections::HashSet;

use cube_protocol::Coord;

use crate::keyspace::{KeySpace, coord_of};
use crate::rng::Rng;
use crate::workload::Op;

/// Keys per row and per plane, as in [`coord_of`].
const SIDE: u64 = 1024;

/// How deep the workload's walks go: a 3-hop neighbourhood (about 25
/// coordinates in a full 2-D lattice, 63 in 3-D).
pub const WALK_DEPTH: u32 = 3;

/// How far (in lattice units per axis) a path's target is from its start.
const PATH_REACH: u64 = 4;

/// The lattice neighbours of `key` that exist in the key space.
pub fn neighbours(keys: &KeySpace, key: u64) -> Vec<u64> {
    let n = keys.keys();
    let x = key % SIDE;
    let y = (key / SIDE) % SIDE;
    let mut out = Vec::with_capacity(6);
    if x > 0 {
        out.push(key - 1);
    }
    if x + 1 < SIDE && key + 1 < n {
        out.push(key + 1);
    }
    if y > 0 {
        out.push(key - SIDE);
    }
    if y + 1 < SIDE && key + SIDE < n {
        out.push(key + SIDE);
    }
    if key >= SIDE * SIDE {
        out.push(key - SIDE * SIDE);
    }
    if key + SIDE * SIDE < n {
        out.push(key + SIDE * SIDE);
    }
    out
}

/// Every lattice edge of the key space, `(from, to)`, both directions.
pub fn lattice(keys: &KeySpace) -> impl Iterator<Item = (u64, u64)> + '_ {
    (0..keys.keys()).flat_map(move |k| neighbours(keys, k).into_iter().map(move |n| (k, n)))
}

/// The next request of client `client`: 50 % walks, 10 % paths, 25 %
/// links and 15 % unlinks (of edges leaving the client's own keys), so the
/// lattice stays mostly linked.
pub fn next_op(rng: &mut Rng, keys: &KeySpace, client: usize) -> Op {
    let roll = rng.below(100);
    if roll < 50 {
        return Op::Walk {
            key: keys.random_key(rng),
        };
    }
    if roll < 60 {
        let from = keys.random_key(rng);
        return Op::Path {
            from,
            to: nearby(rng, keys, from),
        };
    }
    let from = keys.random_owned_key(client, rng);
    let choices = neighbours(keys, from);
    let to = if choices.is_empty() {
        from
    } else {
        choices[rng.below(choices.len() as u64) as usize]
    };
    if roll < 85 {
        Op::Link { from, to }
    } else {
        Op::Unlink { from, to }
    }
}

/// A key up to [`PATH_REACH`] lattice units away on x and y (same z), inside
/// the key space; `from` itself when that lands outside it.
fn nearby(rng: &mut Rng, keys: &KeySpace, from: u64) -> u64 {
    let mut shift = |v: u64| {
        (v + rng.below(2 * PATH_REACH + 1))
            .saturating_sub(PATH_REACH)
            .min(SIDE - 1)
    };
    let x = shift(from % SIDE);
    let y = shift((from / SIDE) % SIDE);
    let to = from - from % (SIDE * SIDE) + y * SIDE + x;
    if to < keys.keys() { to } else { from }
}

/// Lattice units between two coordinates (L1 distance).
pub fn lattice_distance(a: Coord, b: Coord) -> u64 {
    let d = |p: i32, q: i32| (i64::from(p) - i64::from(q)).unsigned_abs();
    d(a.x, b.x) + d(a.y, b.y) + d(a.z, b.z)
}

/// Checks a walk answer from `start` (depth [`WALK_DEPTH`]): each
/// coordinate once, not the start, nearest first, within the depth, and
/// never closer in hops than in lattice units.
pub fn check_walk(start: Coord, nodes: &[(Coord, u32)]) -> Result<(), String> {
    let mut seen = HashSet::with_capacity(nodes.len());
    let mut last = 1;
    for &(coord, distance) in nodes {
        if coord == start {
            return Err(format!("walk from {start} listed its start"));
        }
        if !seen.insert(coord) {
            return Err(format!("walk from {start} listed {coord} twice"));
        }
        if distance < last || distance > WALK_DEPTH {
            return Err(format!(
                "walk from {start}: {coord} at distance {distance} after distance {last} (depth {WALK_DEPTH})"
            ));
        }
        last = distance;
        let apart = lattice_distance(start, coord);
        if apart > u64::from(distance) {
            return Err(format!(
                "walk from {start} reached {coord}, {apart} lattice units away, in {distance} hops: \
                 an edge that was never linked"
            ));
        }
    }
    Ok(())
}

/// Checks a path answer: from `from` to `to`, one lattice unit per hop,
/// costing its hop count (every weight is 1).
pub fn check_path(from: Coord, to: Coord, coords: &[Coord], cost: f64) -> Result<(), String> {
    if coords.first() != Some(&from) || coords.last() != Some(&to) {
        return Err(format!(
            "path {from} -> {to} runs from {:?} to {:?}",
            coords.first(),
            coords.last()
        ));
    }
    if let Some(jump) = coords
        .windows(2)
        .find(|w| lattice_distance(w[0], w[1]) != 1)
    {
        return Err(format!(
            "path {from} -> {to} jumps from {} to {}: an edge that was never linked",
            jump[0], jump[1]
        ));
    }
    let hops = coords.len() - 1;
    if cost != hops as f64 {
        return Err(format!(
            "path {from} -> {to} has {hops} hops of weight 1 but costs {cost}"
        ));
    }
    if (hops as u64) < lattice_distance(from, to) {
        return Err(format!(
            "path {from} -> {to} is shorter than the lattice distance"
        ));
    }
    Ok(())
}

/// The keys of [`lattice`] as coordinates, for link requests.
pub fn edge_coords(from: u64, to: u64) -> (Coord, Coord) {
    (coord_of(from), coord_of(to))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neighbours_are_one_lattice_unit_away_and_inside_the_key_space() {
        let keys = KeySpace::new(3000, 4).unwrap();
        for key in [0, 1, 1023, 1024, 2047, 2999] {
            for n in neighbours(&keys, key) {
                assert!(n < 3000);
                assert_eq!(
                    lattice_distance(coord_of(key), coord_of(n)),
                    1,
                    "{key} -> {n}"
                );
            }
        }
        assert_eq!(neighbours(&keys, 0), [1, 1024]);
        assert_eq!(lattice(&keys).count() % 2, 0, "every edge both ways");
    }

    #[test]
    fn ops_keep_to_owned_keys_and_nearby_targets() {
        let keys = KeySpace::new(5000, 4).unwrap();
        let mut rng = Rng::new(9);
        for _ in 0..2000 {
            match next_op(&mut rng, &keys, 3) {
                Op::Link { from, to } | Op::Unlink { from, to } => {
                    assert_eq!(keys.owner(from), 3);
                    assert_eq!(lattice_distance(coord_of(from), coord_of(to)), 1);
                }
                Op::Path { from, to } => {
                    assert!(to < 5000);
                    assert!(lattice_distance(coord_of(from), coord_of(to)) <= 2 * PATH_REACH);
                }
                Op::Walk { key } => assert!(key < 5000),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn checks_catch_impossible_answers() {
        let o = Coord::new(5, 5, 0);
        let far = Coord::new(9, 5, 0);
        assert!(check_walk(o, &[(Coord::new(6, 5, 0), 1), (Coord::new(6, 6, 0), 2)]).is_ok());
        assert!(check_walk(o, &[(far, 2)]).is_err());
        assert!(check_walk(o, &[(o, 1)]).is_err());
        assert!(check_walk(o, &[(Coord::new(6, 5, 0), 2), (Coord::new(4, 5, 0), 1)]).is_err());
        let line: Vec<Coord> = (5..=9).map(|x| Coord::new(x, 5, 0)).collect();
        assert!(check_path(o, far, &line, 4.0).is_ok());
        assert!(check_path(o, far, &line, 5.0).is_err());
        assert!(check_path(o, far, &[o, far], 1.0).is_err());
    }
}
