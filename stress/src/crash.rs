//! `cube-stress crash`: crash torture (`make crash`).
//!
//! Many clients run a mixed workload (puts, deletes, edges, cell programs,
//! checkpoints, reads) against a real `cubed` whose WAL segments, fold threshold and
//! compaction threshold are tiny, so folds and compactions run all the
//! time. At a random moment of every cycle the daemon is SIGKILLed: at a
//! random time, or just after the driver asked for a checkpoint or a
//! compaction (so the kill lands inside one), or, now and then, asked to
//! shut down cleanly mid-load. It is restarted on the same data and every
//! client's keys and edges are read back.
//!
//! The check is exact because each client owns its keys (coordinates
//! `(client, key, 0)`, and its program plane `(client, 0..5, 1)`) and
//! issues one request at a time: it knows the state its acknowledged
//! operations made, and the one operation in flight when the daemon died,
//! which may or may not have landed. After a restart a client's whole state
//! (values of every key, edges in both directions, its program, the
//! program's cells and its telemetry counts) must equal either the
//! acknowledged state or the acknowledged state with the in-flight
//! operation applied *whole* (a detach half done, or a run whose counter
//! moved but whose marks did not, is a violation). Nothing may exist
//! outside the clients' keys. What recovery shows then becomes the truth
//! for the next cycle.
//!
//! Cell programs: each client stores one of [`PROGRAM_VARIANTS`] programs
//! at `(client, 0, 1)` (`prog`, now and then replaced or deleted) and runs
//! it (`run TAG`). A run increments the counter in its own cell and writes
//! the same mark `COUNT:TAG:vVARIANT` into 2 to 4 cells beside it, so a run
//! applied in part shows as cells that disagree, and a lost acknowledged
//! run as a counter, marks or telemetry count behind the model's. The
//! variants have sources of distinct lengths, so `cell-stats`' program size
//! says which one is stored. Now and then the program runs through `step
//! TAG` over the client's whole program plane instead: its one program
//! runs from the state before the step, which for this program is the same
//! effect, committed as the step's group.
//!
//! The seed fixes the kill schedule and every client's operation stream;
//! thread timing is not replayable, so a violation also keeps the data
//! dir and the daemon's log for forensics and prints where they are.
//!
//! This file holds the flags and the model (a client's state, its
//! operations); `crash/clients.rs` the client threads, `crash/driver.rs`
//! the kill schedule and the cycles, `crash/checker.rs` the read-back and
//! the judgement, `crash/watch.rs` the watcher of client 0's box, and
//! `crash/report.rs` the report.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use clap::Args;
use cube_client::{
    CellBox, Client, ClientError, Coord, Direction, ErrorCode, LocalDaemon, ProgramValue, RunReply,
    StatsEntry, StatsValue, StepReply,
};
use cube_protocol::ProtocolError;

use crate::error::StressError;
use crate::rng::Rng;

mod checker;
mod clients;
mod driver;
mod report;
mod watch;

use checker::*;
use clients::*;
pub use driver::{KillMode, torture};
pub use report::{TortureReport, Violation};
pub use watch::WatchFigures;
use watch::{WATCHED_CLIENT, Watcher};

/// Every key and edge lives in this namespace.
pub(crate) const NAMESPACE: &str = "default";
/// The one edge label the torture uses.
const LABEL: &str = "t";
/// The daemon flags that make folds and compactions constant: 64 KiB
/// segments, a fold every 128 KiB of closed segments, a compaction once
/// deltas pass ~200 KB. Later `--daemon-arg`s override them.
pub const TORTURE_DAEMON_ARGS: [&str; 6] = [
    "--wal-segment-bytes",
    "65536",
    "--checkpoint-wal-bytes",
    "131072",
    "--delta-compact-bytes",
    "200000",
];
/// A request slower than this means a wedged daemon: the cycle fails
/// instead of hanging the run.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Violations printed in full; the count is always exact.
const SHOWN_VIOLATIONS: usize = 20;
/// Differences listed per client state mismatch.
const SHOWN_DIFFERENCES: usize = 8;
/// Cells per scan page when reading a client's keys back.
const SCAN_PAGE_CELLS: u32 = 4096;
/// Bytes of a value shown in a violation.
const SHOWN_VALUE_BYTES: usize = 48;
/// Most clients and keys: the key space is `clients * keys` coordinates
/// and each is read back after every cycle.
const MAX_CLIENTS: usize = 256;
const MAX_KEYS_PER_CLIENT: u32 = 4096;
/// Largest value the torture writes: well under the daemon's 1 MiB limit.
const MAX_VALUE_BYTES: usize = 256 * 1024;
/// The plane (z) of the clients' program cells, apart from their keys.
pub(crate) const PROGRAM_Z: i32 = 1;
/// Cells of a client's program plane: `(client, 0, 1)` holds the program
/// and its run counter, `(client, 1..=4, 1)` the marks its runs write.
pub(crate) const PROGRAM_CELLS: u32 = 5;
/// Programs a client may store; variant `v` writes its mark into `2 + v`
/// cells, so every mark cell is written by some variant.
pub const PROGRAM_VARIANTS: u8 = 3;

/// Flags of `cube-stress crash`.
#[derive(Args, Debug, Clone)]
pub struct CrashArgs {
    /// Kill-and-restart cycles.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub cycles: usize,

    /// Seed of the kill schedule and of every client's operations.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub seed: u64,

    /// Client threads, each with its own connection and its own keys.
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub clients: usize,

    /// Keys (coordinates) per client.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub keys: u32,

    /// Shortest load before a kill: milliseconds (50) or with units (50ms, 1s).
    #[arg(long, value_name = "MS", default_value_t = 50, value_parser = cube_client::parse_millis)]
    pub min_run_ms: u64,

    /// Longest load before a kill: milliseconds (600) or with units (600ms, 2s).
    #[arg(long, value_name = "MS", default_value_t = 600, value_parser = cube_client::parse_millis)]
    pub max_run_ms: u64,

    /// Largest value written; sizes are random up to it.
    #[arg(long, value_name = "BYTES", default_value_t = 2048)]
    pub max_value_bytes: usize,

    /// Puts and deletes only (no link, unlink, detach).
    #[arg(long)]
    pub no_edges: bool,

    /// No cell programs (prog, run).
    #[arg(long)]
    pub no_programs: bool,

    /// No watcher (by default a `watch` follows client 0's box through
    /// every kill, resuming `--from` its last LSN, and is checked).
    #[arg(long)]
    pub no_watch: bool,

    /// Extra flag for cubed (repeatable), after the torture's own
    /// (`--wal-segment-bytes 65536 --checkpoint-wal-bytes 131072
    /// --delta-compact-bytes 200000`), e.g. --daemon-arg=--wal-segment-bytes=1048576.
    #[arg(long = "daemon-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub daemon_args: Vec<String>,

    /// Keep the data dir and daemon log even when every check passes.
    #[arg(long)]
    pub keep_data: bool,

    /// No progress lines on stderr.
    #[arg(long)]
    pub quiet: bool,
}

impl Default for CrashArgs {
    fn default() -> CrashArgs {
        CrashArgs {
            cycles: 100,
            seed: 1,
            clients: 16,
            keys: 64,
            min_run_ms: 50,
            max_run_ms: 600,
            max_value_bytes: 2048,
            no_edges: false,
            no_programs: false,
            no_watch: false,
            daemon_args: Vec::new(),
            keep_data: false,
            quiet: false,
        }
    }
}

impl CrashArgs {
    /// Refuses flags that cannot make a meaningful run, before anything
    /// starts.
    pub fn validate(&self) -> Result<(), StressError> {
        let usage = |m: String| Err(StressError::Usage(m));
        if self.cycles == 0 {
            return usage("--cycles must be at least 1".to_owned());
        }
        if self.clients == 0 || self.clients > MAX_CLIENTS {
            return usage(format!("--clients must be 1..={MAX_CLIENTS}"));
        }
        if self.keys < 2 || self.keys > MAX_KEYS_PER_CLIENT {
            return usage(format!(
                "--keys must be 2..={MAX_KEYS_PER_CLIENT} (an edge needs two keys)"
            ));
        }
        if self.min_run_ms > self.max_run_ms {
            return usage(format!(
                "--min-run-ms {} is above --max-run-ms {}",
                self.min_run_ms, self.max_run_ms
            ));
        }
        if self.max_value_bytes < MIN_VALUE_BYTES || self.max_value_bytes > MAX_VALUE_BYTES {
            return usage(format!(
                "--max-value-bytes must be {MIN_VALUE_BYTES}..={MAX_VALUE_BYTES}"
            ));
        }
        Ok(())
    }

    /// The command line that repeats this run's schedule.
    pub fn replay_command(&self) -> String {
        let mut out = format!(
            "cube-stress crash --seed {} --cycles {} --clients {} --keys {} \
             --min-run-ms {} --max-run-ms {} --max-value-bytes {}",
            self.seed,
            self.cycles,
            self.clients,
            self.keys,
            self.min_run_ms,
            self.max_run_ms,
            self.max_value_bytes
        );
        if self.no_edges {
            out.push_str(" --no-edges");
        }
        if self.no_programs {
            out.push_str(" --no-programs");
        }
        if self.no_watch {
            out.push_str(" --no-watch");
        }
        for arg in &self.daemon_args {
            let _ = write!(out, " --daemon-arg={arg}");
        }
        out
    }
}

// ---------------------------------------------------------------------------
// The model
// ---------------------------------------------------------------------------

/// A client's own state: values by key index, edges by (from, to) key
/// index with their weight, and its program plane. Everything else in the
/// store must be absent.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ClientState {
    pub(crate) cells: BTreeMap<u32, Vec<u8>>,
    pub(crate) edges: BTreeMap<(u32, u32), f64>,
    /// Values of the program plane `(client, i, 1)`, by `i`: the run
    /// counter at 0, the runs' marks at 1..
    pub(crate) prog_cells: BTreeMap<u32, Vec<u8>>,
    /// The variant of the program stored at `(client, 0, 1)`, if any.
    pub(crate) program: Option<u8>,
    /// The program cell's telemetry: runs recorded, and failed ones (the
    /// torture's programs never fail, so always 0).
    pub(crate) runs: u64,
    pub(crate) failures: u64,
}

impl ClientState {
    /// The run counter in the program cell (absent is 0).
    fn run_counter(&self) -> u64 {
        self.prog_cells
            .get(&0)
            .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
            .unwrap_or(0)
    }
}

/// A state-changing operation of one client. `Prog` stores program
/// `variant` at the client's program cell, `ProgDelete` removes it (an
/// empty source), `Run` runs it with the argument `tag`.
#[derive(Clone, Debug, PartialEq)]
enum Op {
    Put {
        key: u32,
        value: Vec<u8>,
    },
    Del {
        key: u32,
    },
    Link {
        from: u32,
        to: u32,
        weight: f64,
    },
    Unlink {
        from: u32,
        to: u32,
    },
    Detach {
        key: u32,
    },
    Prog {
        variant: u8,
    },
    ProgDelete,
    Run {
        tag: u64,
    },
    /// `step TAG` over the client's program plane: the same effect as
    /// `Run`, as a step's one run.
    Step {
        tag: u64,
    },
}

impl Op {
    fn name(&self) -> &'static str {
        match self {
            Op::Put { .. } => "put",
            Op::Del { .. } => "del",
            Op::Link { .. } => "link",
            Op::Unlink { .. } => "unlink",
            Op::Detach { .. } => "detach",
            Op::Prog { .. } => "prog",
            Op::ProgDelete => "prog-delete",
            Op::Run { .. } => "run",
            Op::Step { .. } => "step",
        }
    }

    fn apply(&self, state: &mut ClientState) {
        match self {
            Op::Put { key, value } => {
                state.cells.insert(*key, value.clone());
            }
            Op::Del { key } => {
                state.cells.remove(key);
            }
            Op::Link { from, to, weight } => {
                state.edges.insert((*from, *to), *weight);
            }
            Op::Unlink { from, to } => {
                state.edges.remove(&(*from, *to));
            }
            Op::Detach { key } => {
                state.cells.remove(key);
                state.edges.retain(|(from, to), _| from != key && to != key);
            }
            Op::Prog { variant } => state.program = Some(*variant),
            Op::ProgDelete => state.program = None,
            Op::Run { tag } | Op::Step { tag } => {
                // Without a program the daemon refuses the run and records
                // nothing (the driver never sends one then).
                let Some(variant) = state.program else {
                    return;
                };
                let count = state.run_counter() + 1;
                state.prog_cells.insert(0, count.to_string().into_bytes());
                let mark = run_mark(count, *tag, variant);
                for cell in 1..=marked_cells(variant) {
                    state.prog_cells.insert(cell, mark.clone());
                }
                state.runs += 1;
            }
        }
    }

    fn describe(&self, client: usize) -> String {
        let at = |key: u32| coord(client, key);
        match self {
            Op::Put { key, value } => format!("put {} {}", at(*key), show_value(value)),
            Op::Del { key } => format!("del {}", at(*key)),
            Op::Link { from, to, weight } => {
                format!("link {} -> {} weight {weight}", at(*from), at(*to))
            }
            Op::Unlink { from, to } => format!("unlink {} -> {}", at(*from), at(*to)),
            Op::Detach { key } => format!("detach {}", at(*key)),
            Op::Prog { variant } => {
                format!("prog {} (variant {variant})", program_coord(client))
            }
            Op::ProgDelete => format!("prog --delete {}", program_coord(client)),
            Op::Run { tag } => format!("run {} {tag}", program_coord(client)),
            Op::Step { tag } => {
                let (lo, hi) = program_plane(client);
                format!("step {lo} {hi} {tag}")
            }
        }
    }
}

/// Client `client`'s program cell; its program plane is
/// `(client, 0..PROGRAM_CELLS, PROGRAM_Z)`.
fn program_coord(client: usize) -> Coord {
    Coord::new(client as i32, 0, PROGRAM_Z)
}

/// The corners of client `client`'s program plane.
fn program_plane(client: usize) -> (Coord, Coord) {
    (
        program_coord(client),
        Coord::new(client as i32, PROGRAM_CELLS as i32 - 1, PROGRAM_Z),
    )
}

/// The index of `c` in client `client`'s program plane, if it is there.
fn owned_program_cell(client: usize, c: Coord) -> Option<u32> {
    (c.x == client as i32 && c.z == PROGRAM_Z && c.y >= 0 && (c.y as u32) < PROGRAM_CELLS)
        .then_some(c.y as u32)
}

/// Cells (beside the counter) into which variant `variant` writes its mark.
fn marked_cells(variant: u8) -> u32 {
    2 + u32::from(variant)
}

/// What run number `count`, tagged `tag`, of variant `variant` writes.
fn run_mark(count: u64, tag: u64, variant: u8) -> Vec<u8> {
    format!("{count}:{tag}:v{variant}").into_bytes()
}

/// The Lua source of program `variant`: increment the counter in its own
/// cell, write one mark (the new count, the run's tag, the variant) into
/// the next `2 + variant` cells, return the count. The comment is padded
/// by the variant, so each source has its own length: `cell-stats`
/// reports only the size of the stored program.
pub fn program_source(variant: u8) -> String {
    let pad = "#".repeat(usize::from(variant));
    format!(
        "-- cube-stress crash torture, variant {variant} {pad}\n\
         local tag = ...\n\
         local n = cube.rincr(0, 0, 0)\n\
         local mark = n .. \":\" .. tag .. \":v{variant}\"\n\
         for i = 1, {cells} do\n\
         \x20 cube.rput(0, i, 0, mark)\n\
         end\n\
         return n\n",
        cells = marked_cells(variant)
    )
}

/// The variant whose source is `bytes` long.
pub(crate) fn variant_of_length(bytes: u32) -> Option<u8> {
    (0..PROGRAM_VARIANTS).find(|v| program_source(*v).len() == bytes as usize)
}

/// Client `client`'s key `key`.
fn coord(client: usize, key: u32) -> Coord {
    Coord::new(client as i32, key as i32, 0)
}

/// The key index of `c` if client `client` owns it.
fn owned_key(client: usize, keys: u32, c: Coord) -> Option<u32> {
    (c.x == client as i32 && c.z == 0 && c.y >= 0 && (c.y as u32) < keys).then_some(c.y as u32)
}

/// Shortest value: room for the identifying prefix.
const MIN_VALUE_BYTES: usize = 48;

/// A value that names its writer, key, sequence number and cycle, padded
/// with bytes derived from them: a torn or misplaced value never equals
/// what the model expects.
fn make_value(client: usize, key: u32, seq: u64, cycle: usize, len: usize) -> Vec<u8> {
    let mut value = format!("c{client} k{key} s{seq} y{cycle} |").into_bytes();
    let mut filler = Rng::new(seq ^ ((client as u64) << 40) ^ (u64::from(key) << 20));
    // Never shorter than the prefix: the prefix is what makes it unique.
    while value.len() < len {
        value.push(b'a' + (filler.below(26) as u8));
    }
    value
}

fn show_value(value: &[u8]) -> String {
    let shown = &value[..value.len().min(SHOWN_VALUE_BYTES)];
    format!(
        "{:?}{} ({} bytes)",
        String::from_utf8_lossy(shown),
        if value.len() > shown.len() { "..." } else { "" },
        value.len()
    )
}

fn show_cell(value: Option<&Vec<u8>>) -> String {
    value.map_or_else(|| "absent".to_owned(), |v| show_value(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detach_removes_the_value_and_every_edge_touching_the_key() {
        let mut state = ClientState::default();
        for op in [
            Op::Put {
                key: 1,
                value: b"v".to_vec(),
            },
            Op::Link {
                from: 1,
                to: 2,
                weight: 1.0,
            },
            Op::Link {
                from: 3,
                to: 1,
                weight: 2.0,
            },
            Op::Link {
                from: 2,
                to: 3,
                weight: 3.0,
            },
            Op::Detach { key: 1 },
        ] {
            op.apply(&mut state);
        }
        assert!(state.cells.is_empty());
        assert_eq!(state.edges.keys().copied().collect::<Vec<_>>(), [(2, 3)]);
    }

    #[test]
    fn values_name_their_writer_and_differ_per_sequence() {
        let a = make_value(3, 7, 10, 2, 100);
        let b = make_value(3, 7, 11, 2, 100);
        assert_eq!(a.len(), 100);
        assert!(a.starts_with(b"c3 k7 s10 y2 |"));
        assert_ne!(a, b);
        assert!(make_value(1, 1, 1, 1, MIN_VALUE_BYTES).len() >= MIN_VALUE_BYTES);
    }

    #[test]
    fn the_schedule_and_op_streams_follow_the_seed() {
        let args = CrashArgs::default();
        let steps = |seed: u64| {
            let mut run = ClientRun::new(
                0,
                &CrashArgs {
                    seed,
                    ..args.clone()
                },
            );
            (0..50)
                .map(|_| match run.next_step(1) {
                    Step::Mutate(op) => op.describe(0),
                    Step::Get(k) => format!("get {k}"),
                    Step::Checkpoint { compact } => format!("checkpoint {compact}"),
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(steps(5), steps(5));
        assert_ne!(steps(5), steps(6));
        let mut rng = Rng::for_stream(9, 0);
        let modes: Vec<KillMode> = (0..400).map(|_| KillMode::pick(&mut rng)).collect();
        for mode in KillMode::ALL {
            assert!(modes.contains(&mode), "{mode:?} never picked");
        }
    }

    #[test]
    fn a_mismatch_is_reported_with_the_differences() {
        let mut client = ClientRun::new(2, &CrashArgs::default());
        client.acked.cells.insert(4, b"old".to_vec());
        client.in_flight = Some(Op::Del { key: 4 });
        let mut report = TortureReport::default();
        // Landed whole: fine.
        judge(&mut client, ClientState::default(), 1, &mut report);
        assert!(report.violations.is_empty());
        assert_eq!(report.in_flight_landed, 1);
        // A value nobody wrote: a violation naming the key.
        let mut wrong = ClientState::default();
        wrong.cells.insert(5, b"ghost".to_vec());
        judge(&mut client, wrong, 2, &mut report);
        assert_eq!(report.violations.len(), 1);
        let text = report.violations[0].to_string();
        assert!(text.contains("cycle 2") && text.contains("2,5,0"), "{text}");
        assert!(text.contains("ghost"), "{text}");
    }

    #[test]
    fn program_variants_are_told_apart_by_their_length() {
        for variant in 0..PROGRAM_VARIANTS {
            let source = program_source(variant);
            assert_eq!(
                variant_of_length(source.len() as u32),
                Some(variant),
                "{source}"
            );
            assert!(source.contains("cube.rincr(0, 0, 0)"), "{source}");
        }
        assert_eq!(variant_of_length(3), None);
    }

    #[test]
    fn a_run_moves_the_counter_marks_and_telemetry_together() {
        let mut state = ClientState::default();
        Op::Run { tag: 5 }.apply(&mut state);
        assert_eq!(state, ClientState::default(), "no program, no run");
        Op::Prog { variant: 1 }.apply(&mut state);
        Op::Run { tag: 7 }.apply(&mut state);
        Op::Run { tag: 9 }.apply(&mut state);
        assert_eq!(state.run_counter(), 2);
        assert_eq!(state.runs, 2);
        let mark = run_mark(2, 9, 1);
        assert_eq!(state.prog_cells.len(), 1 + 3);
        for cell in 1..=3 {
            assert_eq!(state.prog_cells.get(&cell), Some(&mark));
        }
        Op::Prog { variant: 0 }.apply(&mut state);
        Op::Run { tag: 11 }.apply(&mut state);
        // Variant 0 writes two marks; the third keeps the older run's.
        assert_eq!(state.prog_cells.get(&2), Some(&run_mark(3, 11, 0)));
        assert_eq!(state.prog_cells.get(&3), Some(&mark));
    }

    #[test]
    fn a_step_over_the_program_plane_is_modelled_as_its_one_run() {
        let (mut by_run, mut by_step) = (ClientState::default(), ClientState::default());
        for state in [&mut by_run, &mut by_step] {
            Op::Prog { variant: 2 }.apply(state);
        }
        Op::Run { tag: 4 }.apply(&mut by_run);
        Op::Step { tag: 4 }.apply(&mut by_step);
        assert_eq!(by_run, by_step);
        let (lo, hi) = program_plane(3);
        assert_eq!(owned_program_cell(3, lo), Some(0));
        assert_eq!(owned_program_cell(3, hi), Some(PROGRAM_CELLS - 1));
    }

    #[test]
    fn a_run_applied_in_part_is_a_violation() {
        let mut client = ClientRun::new(1, &CrashArgs::default());
        Op::Prog { variant: 0 }.apply(&mut client.acked);
        Op::Run { tag: 3 }.apply(&mut client.acked);
        let before = client.acked.clone();
        client.in_flight = Some(Op::Run { tag: 4 });
        let mut whole = before.clone();
        Op::Run { tag: 4 }.apply(&mut whole);
        let mut report = TortureReport::default();
        judge(&mut client, whole.clone(), 1, &mut report);
        assert!(report.violations.is_empty());
        assert_eq!(report.in_flight_landed, 1);
        assert_eq!(report.in_flight_runs_landed, 1);
        // The counter and the first mark moved, the second mark did not.
        client.in_flight = Some(Op::Run { tag: 5 });
        let mut half = whole.clone();
        half.prog_cells.insert(0, b"3".to_vec());
        half.prog_cells.insert(1, run_mark(3, 5, 0));
        half.runs += 1;
        judge(&mut client, half, 2, &mut report);
        assert_eq!(report.violations.len(), 1);
        let text = report.violations[0].to_string();
        assert!(text.contains("program plane 1,1,1"), "{text}");
        assert!(
            text.contains("or it plus the in-flight `run 1,0,1 5`"),
            "{text}"
        );
        // An acknowledged run missing after the restart.
        client.acked = whole.clone();
        Op::Run { tag: 6 }.apply(&mut client.acked);
        judge(&mut client, whole, 3, &mut report);
        assert_eq!(report.violations.len(), 2);
        let text = report.violations[1].to_string();
        assert!(text.contains("telemetry at 1,0,1"), "{text}");
    }

    #[test]
    fn bad_flags_are_refused() {
        let ok = CrashArgs::default();
        assert!(ok.validate().is_ok());
        assert!(
            CrashArgs {
                cycles: 0,
                ..ok.clone()
            }
            .validate()
            .is_err()
        );
        assert!(
            CrashArgs {
                keys: 1,
                ..ok.clone()
            }
            .validate()
            .is_err()
        );
        assert!(
            CrashArgs {
                min_run_ms: 10,
                max_run_ms: 5,
                ..ok.clone()
            }
            .validate()
            .is_err()
        );
        assert!(
            CrashArgs {
                max_value_bytes: 1,
                ..ok
            }
            .validate()
            .is_err()
        );
    }
}
