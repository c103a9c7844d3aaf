//! Keeps docs/programs.md true: every worked example (counter, heat diffusion step, 3-D Game of Life rule by runs and in place by steps, propagation along edges) is read from the doc and run against a real cubed, with its documented effect checked.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;

use cube_client::{CellBox, Client, Coord, LocalDaemon, ProgramValue};

const DOC: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/programs.md"));
const NS: &str = "default";

/// The ```lua block after `<!-- program: NAME -->` in the doc.
fn example(name: &str) -> String {
    let marker = format!("<!-- program: {name} -->");
    let at = DOC
        .find(&marker)
        .unwrap_or_else(|| panic!("docs/programs.md has no example {name}"));
    let rest = &DOC[at + marker.len()..];
    let start = rest.find("```lua\n").unwrap() + "```lua\n".len();
    let end = rest[start..].find("```").unwrap();
    rest[start..start + end].to_owned()
}

fn run(client: &mut Client, at: Coord, args: &[&str]) -> ProgramValue {
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    client.run(NS, at, &args).unwrap().value
}

fn number(client: &mut Client, at: Coord) -> f64 {
    let bytes = client.get(NS, at).unwrap().unwrap();
    std::str::from_utf8(&bytes).unwrap().parse().unwrap()
}

#[test]
fn every_example_in_the_doc_is_tested() {
    let tested = ["counter", "heat", "life", "life-in-place", "propagate"];
    let in_doc: Vec<&str> = DOC
        .match_indices("<!-- program: ")
        .map(|(at, m)| {
            let rest = &DOC[at + m.len()..];
            &rest[..rest.find(" -->").unwrap()]
        })
        .collect();
    assert_eq!(in_doc, tested);
}

#[test]
fn counter_counts_its_runs() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut c = daemon.client().unwrap();
    let at = Coord::new(3, -4, 5);
    c.prog(NS, at, example("counter").as_bytes()).unwrap();
    assert_eq!(run(&mut c, at, &[]), ProgramValue::Int(1));
    assert_eq!(run(&mut c, at, &[]), ProgramValue::Int(2));
    assert_eq!(run(&mut c, at, &["40"]), ProgramValue::Int(42));
    assert_eq!(c.get(NS, at).unwrap().unwrap(), b"42");
    let stats = c.cell_stats(NS, at, 10).unwrap();
    assert_eq!((stats.runs, stats.failures, stats.records.len()), (3, 0, 3));
}

#[test]
fn heat_step_averages_each_cell_over_its_neighbourhood() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut c = daemon.client().unwrap();
    // A 5x5 plate at z = 0, all 0 but the middle at 100.
    for x in 0..5 {
        for y in 0..5 {
            let t = if (x, y) == (2, 2) { "100" } else { "0" };
            c.put(NS, Coord::new(x, y, 0), t.as_bytes()).unwrap();
        }
    }
    let at = Coord::new(0, 0, 0);
    c.prog(NS, at, example("heat").as_bytes()).unwrap();
    assert_eq!(
        run(&mut c, at, &["0", "0", "4", "4"]),
        ProgramValue::Int(25)
    );
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    // The middle and its 8 neighbours see the hot cell among 9 present.
    for (x, y) in [(2, 2), (1, 1), (1, 2), (3, 3)] {
        let t = number(&mut c, Coord::new(x, y, 0));
        assert!(close(t, 100.0 / 9.0), "{x},{y}: {t}");
    }
    // Cells two away do not; a corner averages 4 cold cells.
    for (x, y) in [(0, 0), (4, 4), (0, 2)] {
        assert!(close(number(&mut c, Coord::new(x, y, 0)), 0.0), "{x},{y}");
    }
    // Heat is conserved only approximately (edges average fewer cells),
    // but the step is one atomic run: one record, 25 cells written.
    let stats = c.cell_stats(NS, at, 1).unwrap();
    assert_eq!(stats.records[0].cells_written, 25);
}

/// Bays' 4555 rule by brute force, for comparison.
fn life_step(alive: &HashSet<(i32, i32, i32)>, x: i32, y: i32, z: i32) -> bool {
    let mut n = 0;
    for dx in -1..=1 {
        for dy in -1..=1 {
            for dz in -1..=1 {
                if (dx, dy, dz) != (0, 0, 0) && alive.contains(&(x + dx, y + dy, z + dz)) {
                    n += 1;
                }
            }
        }
    }
    n == 5 || (alive.contains(&(x, y, z)) && n == 4)
}

/// Stores a deterministic pseudo-random soup (`tenths` in ten cells alive,
/// value `1`) and `source` at every cell of the cube `0..side`; returns the
/// live cells.
fn soup_with_rule(
    c: &mut Client,
    side: i32,
    seed: u64,
    tenths: u64,
    source: &str,
) -> HashSet<(i32, i32, i32)> {
    let mut alive = HashSet::new();
    let mut state = seed;
    for x in 0..side {
        for y in 0..side {
            for z in 0..side {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                if (state >> 33) % 10 < tenths {
                    alive.insert((x, y, z));
                    c.put(NS, Coord::new(x, y, z), b"1").unwrap();
                }
                c.prog(NS, Coord::new(x, y, z), source.as_bytes()).unwrap();
            }
        }
    }
    alive
}

#[test]
fn life_rule_computes_one_generation_cell_by_cell() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut c = daemon.client().unwrap();
    let side = 6;
    let alive = soup_with_rule(&mut c, side, 12345, 4, &example("life"));
    for x in 0..side {
        for y in 0..side {
            for z in 0..side {
                let expected = life_step(&alive, x, y, z);
                let got = run(&mut c, Coord::new(x, y, z), &["100"]);
                assert_eq!(got, ProgramValue::Bool(expected), "{x},{y},{z}");
                let stored = c.get(NS, Coord::new(x, y, z + 100)).unwrap();
                assert_eq!(stored.is_some(), expected, "{x},{y},{z}");
            }
        }
    }
}

#[test]
fn life_in_place_computes_generations_by_steps_and_survives_kill_9() {
    let side = 6;
    let mut daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut c = daemon.client().unwrap();
    let mut alive = soup_with_rule(&mut c, side, 2545, 3, &example("life-in-place"));
    let (lo, hi) = (
        Coord::new(0, 0, 0),
        Coord::new(side - 1, side - 1, side - 1),
    );
    for generation in 1..=3u64 {
        let reply = c.step(NS, lo, hi, &[]).unwrap();
        assert_eq!(
            (reply.programs, reply.failed),
            ((side * side * side) as u32, 0)
        );
        let mut next = HashSet::new();
        for x in 0..side {
            for y in 0..side {
                for z in 0..side {
                    if life_step(&alive, x, y, z) {
                        next.insert((x, y, z));
                    }
                }
            }
        }
        let changed = alive.symmetric_difference(&next).count() as u32;
        assert_eq!(reply.cells_written, changed, "generation {generation}");
        alive = next;
        if generation == 2 {
            drop(c);
            daemon.kill9().unwrap();
            daemon.restart().unwrap();
            c = daemon.client().unwrap();
        }
        let stored: HashSet<(i32, i32, i32)> = c
            .scan(NS, CellBox::new(lo, hi).unwrap(), 4096)
            .map(|cell| {
                let at = cell.unwrap().coord;
                (at.x, at.y, at.z)
            })
            .collect();
        assert_eq!(stored, alive, "generation {generation}");
        let stats = c.cell_stats(NS, Coord::new(1, 2, 3), 10).unwrap();
        assert_eq!(stats.runs, generation);
    }
}

#[test]
fn propagate_copies_the_value_along_edges_within_the_depth() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut c = daemon.client().unwrap();
    // A chain 0 -> 1 -> 2 -> 3 -> 4 along x, and a side branch 1 -> (1,1,0).
    for x in 0..4 {
        c.link(NS, Coord::new(x, 0, 0), Coord::new(x + 1, 0, 0), "", 1.0)
            .unwrap();
    }
    c.link(NS, Coord::new(1, 0, 0), Coord::new(1, 1, 0), "", 1.0)
        .unwrap();
    let at = Coord::new(0, 0, 0);
    c.put(NS, at, b"news").unwrap();
    c.prog(NS, at, example("propagate").as_bytes()).unwrap();
    assert_eq!(run(&mut c, at, &["2"]), ProgramValue::Int(3));
    for reached in [
        Coord::new(1, 0, 0),
        Coord::new(2, 0, 0),
        Coord::new(1, 1, 0),
    ] {
        assert_eq!(c.get(NS, reached).unwrap().as_deref(), Some(&b"news"[..]));
    }
    for beyond in [Coord::new(3, 0, 0), Coord::new(4, 0, 0)] {
        assert_eq!(c.get(NS, beyond).unwrap(), None);
    }
    // A cell without a value fails clearly and writes nothing.
    c.prog(NS, Coord::new(9, 9, 9), example("propagate").as_bytes())
        .unwrap();
    let err = c.run(NS, Coord::new(9, 9, 9), &[]).unwrap_err();
    assert!(err.to_string().contains("no value to propagate"), "{err}");
}
