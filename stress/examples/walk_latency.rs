//! Round trips of walks and paths through a real `cubed`, on a lattice of
//! SIDE^3 coordinates each linked to its 6 neighbours (1 M coordinates and
//! 5.94 M edges at the default side of 100), as issue 6 asks: a 3-hop walk
//! (62 coordinates) end to end, with and without values, and a 50-hop
//! path. The lattice is built over the socket by parallel connections.
//!
//! ```text
//! cargo build --release -p cube-server            # the cubed it starts
//! cargo build --release -p cube-stress --examples
//! target/release/examples/walk_latency [SIDE] [SAMPLES]
//! ```
//! It starts a throwaway `cubed --sync never` (building 6 M durable edges
//! one fdatasync group at a time would only measure the disk) and prints
//! latency percentiles; figures go to `docs/benchmarks.md` ("Edges and
//! walks").
#![allow(clippy::unwrap_used)]

use std::thread;
use std::time::{Duration, Instant};

use cube_client::{Coord, Direction, LocalDaemon, WalkOptions};

const NS: &str = "default";
const BUILD_CONNECTIONS: i32 = 16;

fn percentiles(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let at = |p: f64| {
        let i = ((samples.len() as f64 * p) as usize).min(samples.len() - 1);
        samples[i].as_secs_f64() * 1e6
    };
    let mean = samples.iter().sum::<Duration>().as_secs_f64() * 1e6 / samples.len() as f64;
    println!(
        "{name:<28} n={:<6} mean {mean:7.1} us  p50 {:7.1}  p90 {:7.1}  p99 {:7.1}  p99.9 {:7.1}  max {:7.1}",
        samples.len(),
        at(0.5),
        at(0.9),
        at(0.99),
        at(0.999),
        at(1.0)
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let side: i32 = args.next().map_or(100, |a| a.parse().unwrap());
    let samples: usize = args.next().map_or(20_000, |a| a.parse().unwrap());
    let daemon =
        // A 50-hop path from inside the cube settles the whole L1 ball of
        // radius 50 around its start: about 1 M edges.
        LocalDaemon::start_fresh(&["--sync", "never", "--max-walk-work", "4000000"]).unwrap();

    let started = Instant::now();
    thread::scope(|scope| {
        for t in 0..BUILD_CONNECTIONS {
            let mut client = daemon.client().unwrap();
            scope.spawn(move || {
                for x in (t..side).step_by(BUILD_CONNECTIONS as usize) {
                    for y in 0..side {
                        for z in 0..side {
                            let from = Coord::new(x, y, z);
                            client
                                .put(NS, from, &(x * 10_000 + y * 100 + z).to_le_bytes())
                                .unwrap();
                            for (dx, dy, dz) in [
                                (1, 0, 0),
                                (-1, 0, 0),
                                (0, 1, 0),
                                (0, -1, 0),
                                (0, 0, 1),
                                (0, 0, -1),
                            ] {
                                let to = Coord::new(x + dx, y + dy, z + dz);
                                if [to.x, to.y, to.z].iter().all(|v| (0..side).contains(v)) {
                                    client.link(NS, from, to, "", 1.0).unwrap();
                                }
                            }
                        }
                    }
                }
            });
        }
    });
    let build = started.elapsed().as_secs_f64();
    let mut client = daemon.client().unwrap();
    let stats = client.stats().unwrap();
    let stored = stats
        .iter()
        .find(|e| e.name == "store.edges")
        .map(|e| format!("store.edges = {:?}", e.value))
        .unwrap_or_default();
    let edges = 6 * i64::from(side).pow(3) - 6 * i64::from(side).pow(2);
    println!(
        "built {side}^3 lattice ({edges} edges, {} cells) over the socket in {build:.1} s \
         ({:.0} links/s); {stored}",
        i64::from(side).pow(3),
        edges as f64 / build
    );

    // Starts at least 3 from every face, in a fixed pseudo-random order.
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut interior = |margin: i32| {
        let mut next = || {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            margin + (state.wrapping_mul(0x9e37_79b9_7f4a_7c15) % (side - 2 * margin) as u64) as i32
        };
        Coord::new(next(), next(), next())
    };

    let mut ping = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t = Instant::now();
        client.ping().unwrap();
        ping.push(t.elapsed());
    }
    percentiles("ping", ping);

    for with_values in [false, true] {
        let options = WalkOptions {
            direction: Direction::Out,
            max_depth: 3,
            with_values,
            ..WalkOptions::default()
        };
        let mut times = Vec::with_capacity(samples);
        let mut nodes = 0;
        for _ in 0..samples {
            let start = interior(3);
            let t = Instant::now();
            let walk = client.walk(NS, start, &options).unwrap();
            times.push(t.elapsed());
            nodes += walk.nodes.len();
        }
        percentiles(
            &format!(
                "walk 3 hops{} ({} nodes)",
                if with_values { " +values" } else { "" },
                nodes / samples
            ),
            times,
        );
    }

    let mut times = Vec::with_capacity(samples / 20);
    let mut examined = 0;
    for _ in 0..(samples / 20).max(10) {
        let from = interior(0);
        // 50 hops away (17 + 17 + 16), inside the cube.
        let step = |v: i32, d: i32| if v + d < side { v + d } else { v - d };
        let to = Coord::new(step(from.x, 17), step(from.y, 17), step(from.z, 16));
        let t = Instant::now();
        let answer = client.path(NS, from, to, None, f64::INFINITY).unwrap();
        times.push(t.elapsed());
        assert_eq!(answer.path.unwrap().coords.len(), 51);
        examined += answer.edges_examined;
    }
    let n = times.len() as u64;
    let total = times.iter().sum::<Duration>().as_secs_f64();
    percentiles(&format!("path 50 hops ({} edges)", examined / n), times);
    println!(
        "path: {:.1} M edges examined per second of round trip",
        examined as f64 / total / 1e6
    );
    // What the daemon itself measured per request (frame read to answer written).
    for entry in client.stats().unwrap() {
        if entry.name.starts_with("cmd.walk.") || entry.name.starts_with("cmd.path.") {
            println!("server {} = {:?}", entry.name, entry.value);
        }
    }
}
