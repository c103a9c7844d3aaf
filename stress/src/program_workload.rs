//! The `seed` workload: cell programs, as the predecessor drove them.
//!
//! Before the clock starts every counter cell gets a counter program. Then
//! each client stores programs (`prog`, 46.5 %) and runs them (`run`,
//! 46.5 %) at random counter cells, now and then runs every program of a short
//! row segment at once (`step`, 1 %: [`STEP_CELLS`] consecutive cells of one
//! row, each run +1 at its own cell), and every so often asks a cell for
//! its telemetry (`cell-stats`, 6 %). Every stored variant is a counter,
//! so a cell's value, its telemetry run count and the runs the driver saw
//! acknowledged (single runs and steps over it) must all be equal at the
//! end, exactly: that is the check (the predecessor's "C=77 accumulated
//! records as expected"). Pairs per second are (prog + run) / 2, which is
//! also run's (and prog's) own rate: the two keep equal shares.
//!
//! Counter cells live in the plane z = -1, outside the key space (which has
//! z >= 0), so the key space's own read-back is not disturbed.

use std::sync::atomic::{AtomicU64, Ordering};

use cube_protocol::Coord;

use crate::keyspace::KeySpace;
use crate::rng::Rng;
use crate::target::{Connection, Connector, ProgramConnection};
use crate::verify::{VerifyMode, VerifyReport};
use crate::workload::Op;

/// Most counter cells: enough to spread 16 clients, few enough that each
/// cell's telemetry sees many runs (and trimming) in a long run.
pub const MAX_COUNTER_CELLS: u64 = 4096;
/// Cells per row of the counter plane.
const ROW: u64 = 1024;
/// Counter variants stored by `prog`: different sources (each compiled
/// once by the daemon), the same effect.
const VARIANTS: u64 = 8;
/// Counter cells per `step` (fewer when a row has fewer counter cells).
pub const STEP_CELLS: u64 = 8;

/// How many counter cells a key space of this size gets.
pub fn cells(keys: &KeySpace) -> u64 {
    keys.keys().clamp(1, MAX_COUNTER_CELLS)
}

/// Where counter cell `cell` is.
pub fn coord(cell: u64) -> Coord {
    Coord::new((cell % ROW) as i32, (cell / ROW) as i32, -1)
}

/// The counter program variant `variant`.
pub fn source(variant: u64) -> String {
    format!("-- seed counter, variant {variant}\nreturn cube.rincr(0, 0, 0, 1)\n")
}

/// The next request. With `pipeline`, every `prog` and `run` (93 %) is a
/// pipelined pair of both at one cell instead ([`Op::ProgRun`]).
pub fn next_op(rng: &mut Rng, keys: &KeySpace, pipeline: bool) -> Op {
    let cells = cells(keys);
    let cell = rng.below(cells);
    // In half-percents: prog 46.5 %, run 46.5 %, step 1 %, cell-stats 6 %.
    match rng.below(200) {
        0..186 if pipeline => Op::ProgRun {
            cell,
            variant: rng.below(VARIANTS),
        },
        0..93 => Op::Prog {
            cell,
            variant: rng.below(VARIANTS),
        },
        93..186 => Op::Run { cell },
        186..188 => step_around(rng, cell, cells),
        _ => Op::CellStats { cell },
    }
}

/// A step over up to [`STEP_CELLS`] consecutive counter cells of `cell`'s
/// row, all below `cells`: a box of existing counter cells only.
fn step_around(rng: &mut Rng, cell: u64, cells: u64) -> Op {
    let row_start = cell - cell % ROW;
    let row_cells = (row_start + ROW).min(cells) - row_start;
    let len = STEP_CELLS.min(row_cells);
    Op::Step {
        first_cell: row_start + rng.below(row_cells - len + 1),
        cells: len,
    }
}

/// The box `lo..=hi` of a step over `cells` counter cells from `first_cell`
/// on (one row, so the box holds exactly those cells).
pub fn step_box(first_cell: u64, cells: u64) -> (Coord, Coord) {
    (
        coord(first_cell),
        coord(first_cell + cells.saturating_sub(1)),
    )
}

/// What the driver saw per counter cell: runs acknowledged (each one
/// recorded in the cell's telemetry) and runs whose answer never came
/// (recorded or not: a crash or a broken connection).
pub struct CounterLedger {
    acked: Vec<AtomicU64>,
    uncertain: Vec<AtomicU64>,
    /// Per cell, the run count and counter value before the run (not 0
    /// on a running daemon that saw an earlier run).
    baseline: Vec<(u64, u64)>,
}

impl CounterLedger {
    /// A ledger for counter cells whose counts before the run were
    /// `baseline` (empty for workloads without programs).
    pub fn new(baseline: Vec<(u64, u64)>) -> CounterLedger {
        CounterLedger {
            acked: baseline.iter().map(|_| AtomicU64::new(0)).collect(),
            uncertain: baseline.iter().map(|_| AtomicU64::new(0)).collect(),
            baseline,
        }
    }

    pub fn acked(&self, cell: u64) {
        if let Some(count) = self.acked.get(cell as usize) {
            count.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn uncertain(&self, cell: u64) {
        if let Some(count) = self.uncertain.get(cell as usize) {
            count.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn acked_count(&self, cell: u64) -> u64 {
        self.acked
            .get(cell as usize)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    fn uncertain_count(&self, cell: u64) -> u64 {
        self.uncertain
            .get(cell as usize)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    pub fn cells(&self) -> u64 {
        self.acked.len() as u64
    }
}

/// Stores the first counter program at every counter cell; returns each
/// cell's run count and counter value as found (the baseline).
pub fn prefill(connection: &mut dyn Connection, cells: u64) -> Result<Vec<(u64, u64)>, String> {
    let mut baseline = Vec::with_capacity(cells as usize);
    for cell in 0..cells {
        let at = coord(cell);
        connection
            .prog(at, source(cell % VARIANTS).as_bytes())
            .map_err(|e| format!("prog at seed cell {at}: {e}"))?;
        let (runs, _) = connection
            .cell_stats(at)
            .map_err(|e| format!("cell-stats at seed cell {at}: {e}"))?;
        let value = connection
            .get(at)
            .map_err(|e| format!("get at seed cell {at}: {e}"))?;
        baseline.push((runs, counter_value(value.as_deref())));
    }
    Ok(baseline)
}

fn counter_value(value: Option<&[u8]>) -> u64 {
    value
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
}

/// Checks, with no client running, that every counter cell's telemetry
/// count and counter value equal the runs acknowledged for it (or lie
/// within the runs whose answer was lost).
pub fn check(connector: &dyn Connector, ledger: &CounterLedger) -> VerifyReport {
    let mut report = VerifyReport::new(VerifyMode::All);
    if ledger.cells() == 0 {
        return report;
    }
    let mut connection = match connector.connect() {
        Ok(connection) => connection,
        Err(e) => {
            report
                .errors
                .push(format!("checking seed telemetry: cannot connect: {e}"));
            return report;
        }
    };
    for cell in 0..ledger.cells() {
        let at = coord(cell);
        let (base_runs, base_value) = ledger
            .baseline
            .get(cell as usize)
            .copied()
            .unwrap_or_default();
        let acked = base_runs + ledger.acked_count(cell);
        let most = acked + ledger.uncertain_count(cell);
        let (runs, failures) = match connection.cell_stats(at) {
            Ok(counts) => counts,
            Err(e) => {
                report
                    .errors
                    .push(format!("cell-stats of seed cell {at}: {e}"));
                return report;
            }
        };
        report.keys_checked += 1;
        if !(acked..=most).contains(&runs) || failures > 0 && base_runs == 0 {
            report.add_mismatch(format!(
                "seed cell {at}: telemetry counts {runs} runs ({failures} failed); \
                 the driver saw {acked} acknowledged (+ {} uncertain)",
                most - acked
            ));
            continue;
        }
        let value = match connection.get(at) {
            Ok(value) => value,
            Err(e) => {
                report.errors.push(format!("get of seed cell {at}: {e}"));
                return report;
            }
        };
        let counted = counter_value(value.as_deref());
        if counted.wrapping_sub(base_value) != runs - base_runs {
            report.add_mismatch(format!(
                "seed cell {at}: its counter went from {base_value} to {counted}, but its \
                 telemetry counts {} runs in this run",
                runs - base_runs
            ));
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_cells_stay_outside_the_key_space_and_ops_mix() {
        let keys = KeySpace::new(100_000, 4).unwrap();
        assert_eq!(cells(&keys), MAX_COUNTER_CELLS);
        assert!((0..cells(&keys)).all(|c| coord(c).z == -1));
        let mut rng = Rng::new(5);
        let mut counts = [0; 4];
        for _ in 0..10_000 {
            match next_op(&mut rng, &keys, false) {
                Op::Prog { cell, variant } => {
                    assert!(cell < MAX_COUNTER_CELLS && variant < VARIANTS);
                    counts[0] += 1;
                }
                Op::Run { .. } => counts[1] += 1,
                Op::Step { first_cell, cells } => {
                    assert_eq!(cells, STEP_CELLS);
                    assert!(first_cell + cells <= MAX_COUNTER_CELLS);
                    counts[2] += 1;
                }
                Op::CellStats { .. } => counts[3] += 1,
                other => panic!("{other:?}"),
            }
        }
        // prog and run keep equal shares, so run's rate is the pair rate.
        assert!(
            counts[0] > 4000 && counts[1] > 4000 && counts[2] > 40 && counts[3] > 300,
            "{counts:?}"
        );
        assert!(counts[2] < 200, "{counts:?}");
    }

    /// Every step's box holds existing counter cells only, all in one row,
    /// whatever the key space's size.
    #[test]
    fn steps_cover_existing_cells_of_one_row() {
        for keys in [1, 2, 15, 16, 17, 1023, 1024, 1025, 1030, 2048, 5000] {
            let space = KeySpace::new(keys, 1).unwrap();
            let n = cells(&space);
            let mut rng = Rng::new(keys);
            let mut steps = 0;
            for _ in 0..5_000 {
                let Op::Step { first_cell, cells } = next_op(&mut rng, &space, false) else {
                    continue;
                };
                steps += 1;
                let last = first_cell + cells - 1;
                assert!((1..=STEP_CELLS).contains(&cells), "{keys}: {cells}");
                assert!(last < n, "{keys}: {first_cell}+{cells} > {n}");
                assert_eq!(first_cell / ROW, last / ROW, "{keys}: crosses a row");
                // As long as the row has room, a step is STEP_CELLS long.
                let row_cells = (first_cell / ROW * ROW + ROW).min(n) - first_cell / ROW * ROW;
                assert_eq!(cells, STEP_CELLS.min(row_cells), "{keys}");
                let (lo, hi) = step_box(first_cell, cells);
                assert_eq!((lo.y, lo.z, hi.y, hi.z), (hi.y, -1, lo.y, -1));
                assert_eq!((hi.x - lo.x + 1) as u64, cells);
            }
            assert!(steps > 0, "{keys}");
        }
    }
}
