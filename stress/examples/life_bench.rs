//! One Game of Life generation over a SIDE^3 region (32^3 = 32 768 cells
//! by default), run cell by cell through a real `cubed`, as issue 8 asks:
//! every cell holds the rule program of docs/programs.md ("The 3-D Game of
//! Life rule for one cell"), and each cell's `run` computes its next state.
//!
//! ```text
//! cargo build --release -p cube-server -p cube-stress --examples
//! target/release/examples/life_bench [SIDE] [CLIENTS] [--sync always|never] [--steps N] [--step-threads N] [--step-program life|life-in-place]
//! ```
//! It prints wall-clock runs per second and, from the daemon's own
//! figures, cell-programs per second of daemon time: runs divided by the
//! writer time spent executing them (`programs.exec_us_*`, loading the
//! program, running it and recording its telemetry; fsync excluded).
//! With `--steps N` it then computes the same generation N more times as
//! one `step` request each (every program of the region in one writer
//! transaction and one commit group), and prints each step's wall time and
//! writer time (`programs.step_us_*`); `--step-threads N` passes
//! `--program-step-threads N` to the daemon (default: its cores).
//! The steps run the docs' "life-in-place" rule, so each computes the next
//! generation, and the bench checks each one's live cells against the rule
//! computed here; `--step-program life` steps the shifted rule instead.
//! Figures go to `docs/benchmarks.md` ("Cell programs").
#![allow(clippy::unwrap_used)]

use std::thread;
use std::time::Instant;

use cube_client::{Coord, LocalDaemon, ProgramValue, StatsValue};

const NS: &str = "default";
const DOC: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/programs.md"));

/// The ```lua block after `<!-- program: NAME -->` in docs/programs.md.
fn doc_program(name: &str) -> String {
    let marker = format!("<!-- program: {name} -->");
    let rest = &DOC[DOC.find(&marker).unwrap() + marker.len()..];
    let start = rest.find("```lua\n").unwrap() + "```lua\n".len();
    let end = rest[start..].find("```").unwrap();
    rest[start..start + end].to_owned()
}

fn figure(stats: &[cube_client::StatsEntry], name: &str) -> f64 {
    match stats.iter().find(|e| e.name == name).map(|e| &e.value) {
        Some(StatsValue::Count(n)) => *n as f64,
        Some(StatsValue::Float(f)) => *f,
        _ => 0.0,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let side: i32 = args.first().map_or(32, |a| a.parse().unwrap());
    let clients: i32 = args.get(1).map_or(16, |a| a.parse().unwrap());
    let sync = args
        .iter()
        .position(|a| a == "--sync")
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| "always".to_owned());
    let steps: usize = args
        .iter()
        .position(|a| a == "--steps")
        .and_then(|i| args.get(i + 1))
        .map_or(0, |n| n.parse().unwrap());
    let step_threads = args
        .iter()
        .position(|a| a == "--step-threads")
        .and_then(|i| args.get(i + 1).cloned());
    let mut daemon_args = vec!["--sync", &sync];
    if let Some(threads) = &step_threads {
        daemon_args.extend(["--program-step-threads", threads]);
    }
    let daemon = LocalDaemon::start_fresh(&daemon_args).unwrap();
    let source = doc_program("life");

    // A pseudo-random soup, about 30 % alive, and the rule at every cell.
    let started = Instant::now();
    on_every_cell(&daemon, side, clients, |client, at| {
        let h =
            (at.x as u64 * 73_856_093) ^ (at.y as u64 * 19_349_663) ^ (at.z as u64 * 83_492_791);
        if h % 10 < 3 {
            client.put(NS, at, b"1").unwrap();
        }
        client.prog(NS, at, source.as_bytes()).unwrap();
    });
    let cells = i64::from(side).pow(3);
    println!(
        "set up {cells} cells (soup + rule program each) in {:.2} s over {clients} connections",
        started.elapsed().as_secs_f64()
    );

    let before = daemon.client().unwrap().stats().unwrap();
    let started = Instant::now();
    let alive: i64 = thread::scope(|scope| {
        let workers: Vec<_> = (0..clients)
            .map(|t| {
                let mut client = daemon.client().unwrap();
                scope.spawn(move || {
                    let mut alive = 0i64;
                    for x in (t..side).step_by(clients as usize) {
                        for y in 0..side {
                            for z in 0..side {
                                let reply =
                                    client.run(NS, Coord::new(x, y, z), &[b"1000"]).unwrap();
                                if reply.value == ProgramValue::Bool(true) {
                                    alive += 1;
                                }
                            }
                        }
                    }
                    alive
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    let wall = started.elapsed().as_secs_f64();
    let after = daemon.client().unwrap().stats().unwrap();
    let runs = figure(&after, "programs.runs") - figure(&before, "programs.runs");
    let exec_total_us = figure(&after, "programs.exec_us_mean") * figure(&after, "programs.runs")
        - figure(&before, "programs.exec_us_mean") * figure(&before, "programs.runs");
    println!(
        "one generation: {cells} runs in {wall:.2} s wall = {:.0} runs/s ({clients} clients, --sync {sync}); \
         {alive} cells alive next",
        cells as f64 / wall
    );
    println!(
        "daemon time executing them: {:.1} ms = {:.2} us per cell-program = {:.0} cell-programs/s of daemon time \
         (exec max {:.1} us)",
        exec_total_us / 1000.0,
        exec_total_us / runs,
        runs / (exec_total_us / 1e6),
        figure(&after, "programs.exec_us_max")
    );
    println!(
        "server-side run excluding the fsync wait: mean {:.2} us; cmd.run latency mean {:.1} us; wal fsyncs {}",
        figure(&after, "programs.run_us_mean"),
        figure(&after, "cmd.run.latency_us_mean"),
        figure(&after, "wal.fsyncs") - figure(&before, "wal.fsyncs")
    );

    if steps == 0 {
        return;
    }
    // The steps run the rule written for `step` (each cell writes its own
    // next state), so each one computes the next generation, checked
    // against the same rule computed here; `--step-program life` steps the
    // rule above instead, which recomputes the same shifted generation.
    let step_program = args
        .iter()
        .position(|a| a == "--step-program")
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| "life-in-place".to_owned());
    let in_place = step_program == "life-in-place";
    if in_place {
        let source = doc_program(&step_program);
        on_every_cell(&daemon, side, clients, |client, at| {
            client.prog(NS, at, source.as_bytes()).unwrap();
        });
    }
    let mut client = daemon.client().unwrap();
    let (lo, hi) = (
        Coord::new(0, 0, 0),
        Coord::new(side - 1, side - 1, side - 1),
    );
    let region = cube_client::CellBox::new(lo, hi).unwrap();
    let mut grid = LifeGrid::read(&mut client, side);
    let mut writer_us = Vec::new();
    for i in 0..steps {
        let before = client.stats().unwrap();
        let started = Instant::now();
        let reply = client.step(NS, lo, hi, &[b"1000"]).unwrap();
        let wall = started.elapsed().as_secs_f64();
        let after = client.stats().unwrap();
        assert_eq!((reply.programs as i64, reply.failed), (cells, 0));
        if in_place {
            grid = grid.next();
            assert_eq!(
                client.scan_count(NS, &region).unwrap(),
                grid.alive(),
                "step {i} computed another generation than the rule"
            );
        }
        let step_us = figure(&after, "programs.step_us_mean") * figure(&after, "programs.steps")
            - figure(&before, "programs.step_us_mean") * figure(&before, "programs.steps");
        writer_us.push(step_us);
        println!(
            "step {i}: {} programs in {:.1} ms wall, {:.1} ms of writer time = {:.2} us per cell-program \
             = {:.0} cell-programs/s of daemon time ({} cells written)",
            reply.programs,
            wall * 1000.0,
            step_us / 1000.0,
            step_us / f64::from(reply.programs),
            f64::from(reply.programs) / (step_us / 1e6),
            reply.cells_written
        );
    }
    writer_us.sort_by(f64::total_cmp);
    let median = writer_us[writer_us.len() / 2];
    println!(
        "median step ({step_program}): {:.1} ms of writer time = {:.0} cell-programs/s of daemon time",
        median / 1000.0,
        cells as f64 / (median / 1e6)
    );
}

/// Calls `visit` at every cell of the SIDE^3 region, from `clients`
/// connections at once (each takes every `clients`-th x plane).
fn on_every_cell(
    daemon: &LocalDaemon,
    side: i32,
    clients: i32,
    visit: impl Fn(&mut cube_client::Client, Coord) + Sync,
) {
    thread::scope(|scope| {
        for t in 0..clients {
            let mut client = daemon.client().unwrap();
            let visit = &visit;
            scope.spawn(move || {
                for x in (t..side).step_by(clients as usize) {
                    for y in 0..side {
                        for z in 0..side {
                            visit(&mut client, Coord::new(x, y, z));
                        }
                    }
                }
            });
        }
    });
}

/// The region's cells, alive or not, to check each step against.
struct LifeGrid {
    side: i32,
    alive: Vec<bool>,
}

impl LifeGrid {
    fn read(client: &mut cube_client::Client, side: i32) -> LifeGrid {
        let mut alive = vec![false; (side as usize).pow(3)];
        for x in 0..side {
            for y in 0..side {
                for z in 0..side {
                    alive[Self::index(side, x, y, z)] =
                        client.get(NS, Coord::new(x, y, z)).unwrap().is_some();
                }
            }
        }
        LifeGrid { side, alive }
    }

    fn index(side: i32, x: i32, y: i32, z: i32) -> usize {
        ((x * side + y) * side + z) as usize
    }

    fn is_alive(&self, x: i32, y: i32, z: i32) -> bool {
        let inside = |v: i32| (0..self.side).contains(&v);
        inside(x) && inside(y) && inside(z) && self.alive[Self::index(self.side, x, y, z)]
    }

    /// The docs' rule: born with 5 neighbours, kept with 4 or 5.
    fn next(&self) -> LifeGrid {
        let side = self.side;
        let mut alive = vec![false; self.alive.len()];
        for x in 0..side {
            for y in 0..side {
                for z in 0..side {
                    let mut n = 0;
                    for dx in -1..=1 {
                        for dy in -1..=1 {
                            for dz in -1..=1 {
                                let me = (dx, dy, dz) == (0, 0, 0);
                                n += usize::from(!me && self.is_alive(x + dx, y + dy, z + dz));
                            }
                        }
                    }
                    let was = self.is_alive(x, y, z);
                    alive[Self::index(side, x, y, z)] = n == 5 || (was && n == 4);
                }
            }
        }
        LifeGrid { side, alive }
    }

    fn alive(&self) -> u64 {
        self.alive.iter().filter(|a| **a).count() as u64
    }
}
