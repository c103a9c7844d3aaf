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

use crate::crash_watch::{WATCHED_CLIENT, WatchFigures, Watcher};
use crate::error::StressError;
use crate::rng::Rng;

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

/// How a cycle ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum KillMode {
    /// SIGKILL at a random moment of the load.
    Random,
    /// SIGKILL 0-3 ms after the driver asked for a checkpoint (a fold).
    DuringCheckpoint,
    /// SIGKILL 0-3 ms after the driver asked for a checkpoint with compaction.
    DuringCompaction,
    /// SIGTERM mid-load: the clean shutdown path (drain, final fold).
    CleanShutdown,
}

impl KillMode {
    pub const ALL: [KillMode; 4] = [
        KillMode::Random,
        KillMode::DuringCheckpoint,
        KillMode::DuringCompaction,
        KillMode::CleanShutdown,
    ];

    pub fn name(self) -> &'static str {
        match self {
            KillMode::Random => "SIGKILL at a random moment",
            KillMode::DuringCheckpoint => "SIGKILL during a requested checkpoint",
            KillMode::DuringCompaction => "SIGKILL during a requested compaction",
            KillMode::CleanShutdown => "SIGTERM (clean shutdown) under load",
        }
    }

    /// 55 % random, 20 % each inside a checkpoint or a compaction, 5 %
    /// clean shutdown.
    fn pick(rng: &mut Rng) -> KillMode {
        match rng.below(100) {
            0..55 => KillMode::Random,
            55..75 => KillMode::DuringCheckpoint,
            75..95 => KillMode::DuringCompaction,
            _ => KillMode::CleanShutdown,
        }
    }
}

/// One thing found wrong, with what is needed to look into it.
#[derive(Clone, Debug)]
pub struct Violation {
    /// 1-based; 0 is the final clean restart after the last cycle.
    pub cycle: usize,
    pub client: Option<usize>,
    pub coord: Option<Coord>,
    pub what: String,
    pub expected: String,
    pub found: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.cycle == 0 {
            write!(f, "final clean restart")?;
        } else {
            write!(f, "cycle {}", self.cycle)?;
        }
        if let Some(client) = self.client {
            write!(f, ", client {client}")?;
        }
        if let Some(coord) = self.coord {
            write!(f, ", key {coord}")?;
        }
        write!(f, ": {}", self.what)?;
        if !self.expected.is_empty() || !self.found.is_empty() {
            write!(
                f,
                "\n      expected: {}\n      found:    {}",
                self.expected, self.found
            )?;
        }
        Ok(())
    }
}

/// What a torture run did and found.
#[derive(Clone, Debug, Default)]
pub struct TortureReport {
    pub seed: u64,
    pub replay_command: String,
    pub cycles_planned: usize,
    /// Cycles whose kill, restart and read-back all happened.
    pub cycles_run: usize,
    pub kills: BTreeMap<KillMode, u64>,
    /// Kills that landed while the driver's checkpoint or compaction
    /// request was still unanswered.
    pub kills_inside_requested_checkpoint: u64,
    /// Folds and compactions the daemon had done by the moment of each
    /// kill, summed over cycles.
    pub folds_before_kills: u64,
    pub compactions_before_kills: u64,
    /// Acknowledged state-changing operations, by command: each one is
    /// covered by the read-back after the next restart.
    pub acked: BTreeMap<&'static str, u64>,
    /// Checkpoints (and compactions) the clients asked for and got.
    pub client_checkpoints: u64,
    pub client_compactions: u64,
    /// Operations in flight at a kill that were found applied, and not.
    pub in_flight_landed: u64,
    pub in_flight_lost: u64,
    /// Of those, program runs: every one of them all or nothing.
    pub in_flight_runs_landed: u64,
    pub in_flight_runs_lost: u64,
    /// Writes refused with `shutting_down` ("not stored"), checked absent.
    pub refused_shutting_down: u64,
    /// Live reads checked against the acknowledged state.
    pub reads_checked: u64,
    /// Keys and per-key edge lists compared after restarts.
    pub keys_verified: u64,
    pub edge_lists_verified: u64,
    /// Program planes (program, counter, marks, telemetry counts) compared
    /// after restarts, one per client per restart.
    pub program_planes_verified: u64,
    /// From the restart to the first accepted connection, per cycle (ms).
    pub restart_ms: Vec<f64>,
    /// The daemon's own figure: checkpoint load plus WAL replay (ms).
    pub server_recovery_ms: Vec<u64>,
    pub records_replayed_max: u64,
    /// Records replayed at the latest start.
    last_replayed: u64,
    pub violations: Vec<Violation>,
    /// Where the data dir and the daemon log were kept, if they were.
    pub kept: Option<PathBuf>,
    /// What the watcher of client 0's box saw (none with `--no-watch`).
    pub watch: Option<WatchFigures>,
    pub duration: Duration,
}

impl TortureReport {
    pub fn passed(&self) -> bool {
        self.violations.is_empty() && self.cycles_run == self.cycles_planned
    }

    pub fn acked_total(&self) -> u64 {
        self.acked.values().sum()
    }

    /// The summary people read.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "crash torture, seed {}: {} of {} cycles in {:.1} s",
            self.seed,
            self.cycles_run,
            self.cycles_planned,
            self.duration.as_secs_f64()
        );
        for mode in KillMode::ALL {
            let n = self.kills.get(&mode).copied().unwrap_or(0);
            let _ = writeln!(out, "  {:<42} {n}", mode.name());
        }
        let _ = writeln!(
            out,
            "  kills inside an unanswered checkpoint/compaction request: {}",
            self.kills_inside_requested_checkpoint
        );
        let _ = writeln!(
            out,
            "  folds / compactions done by the daemon before the kills: {} / {}",
            self.folds_before_kills, self.compactions_before_kills
        );
        let by_command: Vec<String> = self
            .acked
            .iter()
            .map(|(name, n)| format!("{name} {n}"))
            .collect();
        let _ = writeln!(
            out,
            "operations acknowledged and verified: {} ({}); client checkpoints {}, compactions {}",
            self.acked_total(),
            by_command.join(", "),
            self.client_checkpoints,
            self.client_compactions
        );
        let _ = writeln!(
            out,
            "  in flight at a kill: {} landed whole, {} not at all (runs among them: {} whole, {} not at all); \
             {} refused as shutting down (checked absent)",
            self.in_flight_landed,
            self.in_flight_lost,
            self.in_flight_runs_landed,
            self.in_flight_runs_lost,
            self.refused_shutting_down
        );
        let _ = writeln!(
            out,
            "  read back after restarts: {} keys, {} edge lists, {} program planes; {} live reads checked",
            self.keys_verified,
            self.edge_lists_verified,
            self.program_planes_verified,
            self.reads_checked
        );
        if let Some(w) = &self.watch {
            let _ = writeln!(
                out,
                "watch of client {WATCHED_CLIENT}'s box: {} changes in {} groups over {} resumes; \
                 {} acknowledged puts found at their LSN ({} covered by a resync's snapshot); \
                 {} states rebuilt from the changes matched the read-back; resyncs: {} history gone, {} too slow",
                w.changes,
                w.groups,
                w.resumes,
                w.puts_checked,
                w.puts_snapshotted,
                w.states_matched,
                w.resyncs_history_gone,
                w.resyncs_too_slow
            );
        }
        let _ = writeln!(
            out,
            "recovery: restart to ready {}; daemon's own (checkpoint load + replay) {}; at most {} records replayed",
            spread(&self.restart_ms, "ms"),
            spread(
                &self
                    .server_recovery_ms
                    .iter()
                    .map(|ms| *ms as f64)
                    .collect::<Vec<_>>(),
                "ms"
            ),
            self.records_replayed_max
        );
        if self.violations.is_empty() {
            if self.cycles_run == self.cycles_planned {
                let _ = writeln!(
                    out,
                    "PASSED: no acknowledged operation lost, nothing half-applied"
                );
            }
        } else {
            let _ = writeln!(out, "FAILED: {} violation(s)", self.violations.len());
            for v in self.violations.iter().take(SHOWN_VIOLATIONS) {
                let _ = writeln!(out, "  {v}");
            }
            if self.violations.len() > SHOWN_VIOLATIONS {
                let _ = writeln!(
                    out,
                    "  ... and {} more",
                    self.violations.len() - SHOWN_VIOLATIONS
                );
            }
            let _ = writeln!(
                out,
                "replay the schedule: {}\n(thread timing is not replayable; the kept data dir is)",
                self.replay_command
            );
        }
        if let Some(kept) = &self.kept {
            let _ = writeln!(
                out,
                "data dir and daemon log kept in {} (data/, cubed.log)",
                kept.display()
            );
        }
        out
    }
}

/// "min 3.1 / median 4.0 / max 9.2 ms", or "-" with no samples.
fn spread(samples: &[f64], unit: &str) -> String {
    let mut sorted: Vec<f64> = samples.iter().copied().filter(|s| s.is_finite()).collect();
    if sorted.is_empty() {
        return "-".to_owned();
    }
    sorted.sort_by(f64::total_cmp);
    format!(
        "min {:.1} / median {:.1} / max {:.1} {unit}",
        sorted[0],
        sorted[sorted.len() / 2],
        sorted[sorted.len() - 1]
    )
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

/// The differences between two states of one client, for a violation.
fn differences(client: usize, expected: &ClientState, found: &ClientState) -> Vec<String> {
    let mut out = Vec::new();
    let keys: std::collections::BTreeSet<u32> = expected
        .cells
        .keys()
        .chain(found.cells.keys())
        .copied()
        .collect();
    for key in keys {
        let (e, f) = (expected.cells.get(&key), found.cells.get(&key));
        if e != f {
            out.push(format!(
                "{}: value {} instead of {}",
                coord(client, key),
                show_cell(f),
                show_cell(e)
            ));
        }
    }
    let prog_cells: std::collections::BTreeSet<u32> = expected
        .prog_cells
        .keys()
        .chain(found.prog_cells.keys())
        .copied()
        .collect();
    for cell in prog_cells {
        let (e, f) = (expected.prog_cells.get(&cell), found.prog_cells.get(&cell));
        if e != f {
            out.push(format!(
                "program plane {}: value {} instead of {}",
                Coord::new(client as i32, cell as i32, PROGRAM_Z),
                show_cell(f),
                show_cell(e)
            ));
        }
    }
    if expected.program != found.program {
        let show = |p: Option<u8>| p.map_or_else(|| "none".to_owned(), |v| format!("variant {v}"));
        out.push(format!(
            "program at {}: {} instead of {}",
            program_coord(client),
            show(found.program),
            show(expected.program)
        ));
    }
    if (expected.runs, expected.failures) != (found.runs, found.failures) {
        out.push(format!(
            "telemetry at {}: {} runs, {} failed instead of {} runs, {} failed",
            program_coord(client),
            found.runs,
            found.failures,
            expected.runs,
            expected.failures
        ));
    }
    let edges: std::collections::BTreeSet<(u32, u32)> = expected
        .edges
        .keys()
        .chain(found.edges.keys())
        .copied()
        .collect();
    for (from, to) in edges {
        let (e, f) = (
            expected.edges.get(&(from, to)),
            found.edges.get(&(from, to)),
        );
        if e != f {
            let show =
                |w: Option<&f64>| w.map_or_else(|| "absent".to_owned(), |w| format!("weight {w}"));
            out.push(format!(
                "edge {} -> {}: {} instead of {}",
                coord(client, from),
                coord(client, to),
                show(f),
                show(e)
            ));
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Client threads
// ---------------------------------------------------------------------------

/// One client across cycles: its model, and its operation stream.
struct ClientRun {
    id: usize,
    keys: u32,
    edges: bool,
    programs: bool,
    max_value_bytes: usize,
    rng: Rng,
    seq: u64,
    /// What its acknowledged operations made true.
    acked: ClientState,
    /// The operation sent but not answered when the daemon went away.
    in_flight: Option<Op>,
    /// Its box is watched (`crash_watch`): its acknowledged puts since the
    /// last sync are kept, LSN, key and value.
    watched: bool,
    acked_puts: Vec<(u64, u32, Vec<u8>)>,
    counts: BTreeMap<&'static str, u64>,
    checkpoints: u64,
    compactions: u64,
    reads_checked: u64,
    refused_shutting_down: u64,
    problems: Vec<Violation>,
}

/// What the driver's threads share during one cycle.
struct CycleShared<'a> {
    socket: &'a Path,
    cycle: usize,
    stop: &'a AtomicBool,
    acked: &'a AtomicU64,
}

/// The connection is gone: whatever was in flight may or may not have
/// landed.
pub(crate) fn is_disconnect(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::Connect { .. }
            | ClientError::Io(_)
            | ClientError::Protocol(ProtocolError::Closed | ProtocolError::TruncatedFrame { .. })
    )
}

/// What the next step of a client is.
enum Step {
    Mutate(Op),
    Get(u32),
    Checkpoint { compact: bool },
}

impl ClientRun {
    fn new(id: usize, args: &CrashArgs) -> ClientRun {
        ClientRun {
            id,
            keys: args.keys,
            edges: !args.no_edges,
            programs: !args.no_programs,
            max_value_bytes: args.max_value_bytes,
            rng: Rng::for_stream(args.seed, id as u64 + 1),
            seq: 0,
            acked: ClientState::default(),
            in_flight: None,
            watched: !args.no_watch && id == crate::crash_watch::WATCHED_CLIENT,
            acked_puts: Vec::new(),
            counts: BTreeMap::new(),
            checkpoints: 0,
            compactions: 0,
            reads_checked: 0,
            refused_shutting_down: 0,
            problems: Vec::new(),
        }
    }

    fn problem(
        &mut self,
        cycle: usize,
        coord: Option<Coord>,
        what: String,
        expected: String,
        found: String,
    ) {
        self.problems.push(Violation {
            cycle,
            client: Some(self.id),
            coord,
            what,
            expected,
            found,
        });
    }

    /// The next step. Checkpoints are rare (each one closes the segment
    /// and folds): 3 in 1000 steps. With edges: 5.7 % reads, then of the
    /// rest about 41 % puts, 16 % deletes, 27 % links, 12 % unlinks, 4 %
    /// detaches; without, 84 % puts and 16 % deletes. With programs, a
    /// tenth of those mutations are program steps instead.
    fn next_step(&mut self, cycle: usize) -> Step {
        self.seq += 1;
        let key = self.rng.below(u64::from(self.keys)) as u32;
        let roll = self.rng.below(1000);
        if roll >= 60 && self.programs && self.rng.below(10) == 0 {
            return Step::Mutate(self.program_step());
        }
        let mutation_roll = if self.edges { roll } else { roll % 600 };
        match (roll, mutation_roll) {
            (0..3, _) => Step::Checkpoint {
                compact: self.rng.below(3) == 0,
            },
            (3..60, _) => Step::Get(key),
            (_, 0..450) => {
                // Mostly small values, now and then a large one, so that
                // segments fill and roll quickly.
                let len = if self.rng.below(10) == 0 {
                    self.max_value_bytes
                } else {
                    MIN_VALUE_BYTES + self.rng.below(256) as usize
                }
                .min(self.max_value_bytes);
                Step::Mutate(Op::Put {
                    key,
                    value: make_value(self.id, key, self.seq, cycle, len),
                })
            }
            (_, 450..600) => Step::Mutate(Op::Del { key }),
            (_, 600..850) => {
                let to = (key + 1 + self.rng.below(u64::from(self.keys) - 1) as u32) % self.keys;
                Step::Mutate(Op::Link {
                    from: key,
                    to,
                    // Quarter steps are exact in binary: no rounding can
                    // make a correct answer look wrong.
                    weight: self.rng.below(4000) as f64 / 4.0,
                })
            }
            (_, 850..960) => {
                // Unlink an edge that exists when there is one.
                let existing: Vec<(u32, u32)> = self
                    .acked
                    .edges
                    .range((key, 0)..=(key, u32::MAX))
                    .map(|(e, _)| *e)
                    .collect();
                let (from, to) = match existing.as_slice() {
                    [] => (key, (key + 1) % self.keys),
                    some => some[self.rng.below(some.len() as u64) as usize],
                };
                Step::Mutate(Op::Unlink { from, to })
            }
            _ => Step::Mutate(Op::Detach { key }),
        }
    }

    /// A program step: store a program when there is none; otherwise 83 %
    /// runs, 10 % steps, 5 % replacements by a random variant, 2 %
    /// deletions.
    fn program_step(&mut self) -> Op {
        let variant = self.rng.below(u64::from(PROGRAM_VARIANTS)) as u8;
        if self.acked.program.is_none() {
            return Op::Prog { variant };
        }
        match self.rng.below(100) {
            0..5 => Op::Prog { variant },
            5..7 => Op::ProgDelete,
            7..17 => Op::Step { tag: self.seq },
            _ => Op::Run { tag: self.seq },
        }
    }

    /// Checks a run's answer against the model: the count it returns, its
    /// telemetry sequence number and the cells it wrote follow from the
    /// acknowledged state. `false` (and a violation) if not.
    fn check_run_reply(&mut self, cycle: usize, reply: &RunReply) -> bool {
        let Some(variant) = self.acked.program else {
            return true;
        };
        let count = self.acked.run_counter() + 1;
        let expected = (
            ProgramValue::Int(count as i64),
            self.acked.runs + 1,
            1 + marked_cells(variant),
        );
        let found = (reply.value.clone(), reply.seq, reply.cells_written);
        if found == expected {
            return true;
        }
        self.problem(
            cycle,
            Some(program_coord(self.id)),
            "a run's answer disagrees with the acknowledged state".to_owned(),
            format!(
                "returns {:?}, telemetry seq {}, {} cells written",
                expected.0, expected.1, expected.2
            ),
            format!(
                "returns {:?}, telemetry seq {}, {} cells written",
                found.0, found.1, found.2
            ),
        );
        false
    }

    /// Checks a step's answer against the model: one program ran (or none,
    /// with no program stored), none failed, and it wrote the cells the run
    /// would have. `false` (and a violation) if not.
    fn check_step_reply(&mut self, cycle: usize, reply: &StepReply) -> bool {
        let expected = match self.acked.program {
            Some(variant) => (1, 0, 1 + marked_cells(variant)),
            None => (0, 0, 0),
        };
        let found = (reply.programs, reply.failed, reply.cells_written);
        if found == expected {
            return true;
        }
        self.problem(
            cycle,
            Some(program_coord(self.id)),
            "a step's answer disagrees with the acknowledged state".to_owned(),
            format!(
                "{} program(s) ran, {} failed, {} cells written",
                expected.0, expected.1, expected.2
            ),
            format!(
                "{} program(s) ran, {} failed, {} cells written ({:?})",
                found.0, found.1, found.2, reply.first_failure
            ),
        );
        false
    }

    /// Runs operations until the daemon goes away or the cycle stops.
    fn run_cycle(&mut self, shared: &CycleShared<'_>) {
        self.in_flight = None;
        let mut client = match connect(shared.socket) {
            Ok(client) => client,
            Err(e) => {
                if !shared.stop.load(Ordering::SeqCst) && !is_disconnect(&e) {
                    self.problem(
                        shared.cycle,
                        None,
                        format!("cannot connect: {e}"),
                        String::new(),
                        String::new(),
                    );
                }
                return;
            }
        };
        while !shared.stop.load(Ordering::SeqCst) {
            match self.next_step(shared.cycle) {
                Step::Get(key) => match client.get(NAMESPACE, coord(self.id, key)) {
                    Ok(found) => {
                        self.reads_checked += 1;
                        let expected = self.acked.cells.get(&key);
                        if found.as_ref() != expected {
                            self.problem(
                                shared.cycle,
                                Some(coord(self.id, key)),
                                "a live read disagrees with the acknowledged state".to_owned(),
                                show_cell(expected),
                                show_cell(found.as_ref()),
                            );
                            return;
                        }
                    }
                    Err(e) => {
                        self.failed(shared.cycle, "get", &e);
                        return;
                    }
                },
                Step::Checkpoint { compact } => match client.checkpoint(compact) {
                    Ok(_) if compact => self.compactions += 1,
                    Ok(_) => self.checkpoints += 1,
                    Err(e) => {
                        self.failed(shared.cycle, "checkpoint", &e);
                        return;
                    }
                },
                Step::Mutate(op) => {
                    self.in_flight = Some(op.clone());
                    match send(&mut client, self.id, &op) {
                        Ok(reply) => {
                            let agrees = match &reply {
                                Answer::Done => true,
                                Answer::Put(lsn) => {
                                    if let (true, Op::Put { key, value }) = (self.watched, &op) {
                                        self.acked_puts.push((*lsn, *key, value.clone()));
                                    }
                                    true
                                }
                                Answer::Run(reply) => self.check_run_reply(shared.cycle, reply),
                                Answer::Step(reply) => self.check_step_reply(shared.cycle, reply),
                            };
                            if !agrees {
                                return;
                            }
                            op.apply(&mut self.acked);
                            self.in_flight = None;
                            *self.counts.entry(op.name()).or_default() += 1;
                            shared.acked.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) if e.server_code() == Some(ErrorCode::ShuttingDown) => {
                            // "The write was not stored": checked absent.
                            self.in_flight = None;
                            self.refused_shutting_down += 1;
                            return;
                        }
                        Err(e) => {
                            self.failed(shared.cycle, op.name(), &e);
                            return;
                        }
                    }
                }
            }
        }
    }

    /// A request failed: expected once the daemon is killed (the in-flight
    /// operation stays uncertain), a violation otherwise.
    fn failed(&mut self, cycle: usize, what: &str, e: &ClientError) {
        if is_disconnect(e) || e.server_code() == Some(ErrorCode::ShuttingDown) {
            return;
        }
        let op = self.in_flight.as_ref().map(|op| op.describe(self.id));
        self.problem(
            cycle,
            None,
            format!("{what} failed while the daemon was up: {e}"),
            "success".to_owned(),
            op.unwrap_or_default(),
        );
    }
}

pub(crate) fn connect(socket: &Path) -> Result<Client, ClientError> {
    let mut client = Client::connect(socket)?;
    client.set_timeout(Some(REQUEST_TIMEOUT))?;
    Ok(client)
}

/// What an operation's answer leaves to check.
enum Answer {
    Done,
    /// A put's LSN (the watcher checks it was delivered).
    Put(u64),
    Run(RunReply),
    Step(StepReply),
}

/// Sends one operation; a run's or a step's answer comes back for
/// checking.
fn send(client: &mut Client, id: usize, op: &Op) -> Result<Answer, ClientError> {
    fn done<T>(_: T) -> Answer {
        Answer::Done
    }
    let at = |key: u32| coord(id, key);
    match op {
        Op::Put { key, value } => client.put(NAMESPACE, at(*key), value).map(Answer::Put),
        Op::Del { key } => client.del(NAMESPACE, at(*key)).map(done),
        Op::Link { from, to, weight } => client
            .link(NAMESPACE, at(*from), at(*to), LABEL, *weight)
            .map(done),
        Op::Unlink { from, to } => client
            .unlink(NAMESPACE, at(*from), at(*to), LABEL)
            .map(done),
        Op::Detach { key } => client.detach(NAMESPACE, at(*key)).map(done),
        Op::Prog { variant } => client
            .prog(
                NAMESPACE,
                program_coord(id),
                program_source(*variant).as_bytes(),
            )
            .map(done),
        Op::ProgDelete => client.prog(NAMESPACE, program_coord(id), b"").map(done),
        Op::Run { tag } => client
            .run(NAMESPACE, program_coord(id), &[tag.to_string().as_bytes()])
            .map(Answer::Run),
        Op::Step { tag } => {
            let (lo, hi) = program_plane(id);
            client
                .step(NAMESPACE, lo, hi, &[tag.to_string().as_bytes()])
                .map(Answer::Step)
        }
    }
}

// ---------------------------------------------------------------------------
// Reading back
// ---------------------------------------------------------------------------

/// Reads client `id`'s whole state back. Anything that is not one of its
/// own edges with the torture's label is a violation (returned as text).
fn read_state(
    conn: &mut Client,
    id: usize,
    args: &CrashArgs,
) -> Result<(ClientState, Vec<String>), ClientError> {
    let (keys, with_edges) = (args.keys, !args.no_edges);
    let mut state = ClientState::default();
    let mut strays = Vec::new();
    if !args.no_programs {
        read_program_plane(conn, id, &mut state, &mut strays)?;
    }
    let region =
        CellBox::new(coord(id, 0), coord(id, keys - 1)).map_err(ClientError::BadArgument)?;
    for cell in conn.scan(NAMESPACE, region, SCAN_PAGE_CELLS) {
        let cell = cell?;
        match owned_key(id, keys, cell.coord) {
            Some(key) => {
                if state.cells.insert(key, cell.value).is_some() {
                    strays.push(format!("{} came twice in one scan", cell.coord));
                }
            }
            None => strays.push(format!("scan of the client's box returned {}", cell.coord)),
        }
    }
    if !with_edges {
        return Ok((state, strays));
    }
    // Outgoing edges make the state; incoming ones must mirror them.
    let mut incoming = BTreeMap::new();
    for key in 0..keys {
        let at = coord(id, key);
        for edge in conn.edges(NAMESPACE, at, Direction::Both, None)? {
            let other = owned_key(id, keys, edge.other);
            match (edge.direction, other) {
                (_, None) => strays.push(format!(
                    "{at} has a {:?} edge with {}, outside the client's keys",
                    edge.direction, edge.other
                )),
                _ if edge.label.as_str() != LABEL => strays.push(format!(
                    "{at} has an edge labelled {:?}, never written",
                    edge.label.as_str()
                )),
                (Direction::Out, Some(to)) => {
                    state.edges.insert((key, to), edge.weight);
                }
                (_, Some(from)) => {
                    incoming.insert((from, key), edge.weight);
                }
            }
        }
    }
    if incoming != state.edges {
        let out_only: Vec<_> = state
            .edges
            .keys()
            .filter(|e| !incoming.contains_key(e))
            .collect();
        let in_only: Vec<_> = incoming
            .keys()
            .filter(|e| !state.edges.contains_key(e))
            .collect();
        strays.push(format!(
            "incoming and outgoing edge indexes disagree: only outgoing {out_only:?}, only incoming {in_only:?} \
             (key indexes), or weights differ"
        ));
    }
    Ok((state, strays))
}

/// Reads client `id`'s program plane: its cells, which program variant is
/// stored, and the program cell's telemetry counts.
fn read_program_plane(
    conn: &mut Client,
    id: usize,
    state: &mut ClientState,
    strays: &mut Vec<String>,
) -> Result<(), ClientError> {
    let at = program_coord(id);
    let plane = CellBox::new(
        at,
        Coord::new(id as i32, PROGRAM_CELLS as i32 - 1, PROGRAM_Z),
    )
    .map_err(ClientError::BadArgument)?;
    for cell in conn.scan(NAMESPACE, plane, SCAN_PAGE_CELLS) {
        let cell = cell?;
        match owned_program_cell(id, cell.coord) {
            Some(i) => {
                if state.prog_cells.insert(i, cell.value).is_some() {
                    strays.push(format!("{} came twice in one scan", cell.coord));
                }
            }
            None => strays.push(format!(
                "scan of the client's program plane returned {}",
                cell.coord
            )),
        }
    }
    let stats = conn.cell_stats(NAMESPACE, at, 1)?;
    state.program = match stats.program_bytes {
        None => None,
        Some(bytes) => match variant_of_length(bytes) {
            Some(variant) => Some(variant),
            None => {
                strays.push(format!(
                    "{at} holds a program of {bytes} bytes, which is no variant's length"
                ));
                None
            }
        },
    };
    state.runs = stats.runs;
    state.failures = stats.failures;
    if let Some(newest) = stats.records.last()
        && newest.seq != stats.runs
    {
        strays.push(format!(
            "{at}: the newest telemetry record is run {} but the count is {}",
            newest.seq, stats.runs
        ));
    }
    Ok(())
}

fn count_figure(figures: &[StatsEntry], name: &str) -> Option<u64> {
    figures.iter().find_map(|entry| match entry.value {
        StatsValue::Count(n) if entry.name == name => Some(n),
        _ => None,
    })
}

// ---------------------------------------------------------------------------
// The driver
// ---------------------------------------------------------------------------

/// Runs the torture to the end (or to the first cycle with a violation).
/// `Err` means it could not run at all (no `cubed` binary, a daemon that
/// would not start the first time); a daemon that refuses to restart on
/// its own data is a violation in the report.
pub fn torture(args: &CrashArgs) -> Result<TortureReport, StressError> {
    args.validate()?;
    let started = Instant::now();
    let say = |text: String| {
        if !args.quiet {
            eprintln!("cube-stress crash: {text}");
        }
    };
    let dir = tempfile::Builder::new()
        .prefix("cube-crash-")
        .tempdir()
        .map_err(|e| StressError::io("cannot create a temporary directory", e))?;
    let data_dir = dir.path().join("data");
    let socket = dir.path().join("cubed.sock");
    let daemon_args: Vec<&str> = TORTURE_DAEMON_ARGS
        .iter()
        .copied()
        .chain(args.daemon_args.iter().map(String::as_str))
        .collect();
    let mut daemon = LocalDaemon::start_in(&data_dir, &socket, &daemon_args)?;
    say(format!(
        "{} cycles, {} clients x {} keys{}, seed {}; data in {}",
        args.cycles,
        args.clients,
        args.keys,
        if args.no_edges { "" } else { " with edges" },
        args.seed,
        dir.path().display()
    ));

    let mut report = TortureReport {
        seed: args.seed,
        replay_command: args.replay_command(),
        cycles_planned: args.cycles,
        ..TortureReport::default()
    };
    let mut clients: Vec<ClientRun> = (0..args.clients)
        .map(|id| ClientRun::new(id, args))
        .collect();
    let mut watcher = (!args.no_watch).then(|| Watcher::new(args.keys));
    if let Some(watcher) = watcher.as_mut() {
        // Nothing is written yet: the box is empty up to the first sync.
        sync_watcher(watcher, daemon.socket(), 1, &mut clients, &mut report);
    }
    let mut schedule = Rng::for_stream(args.seed, 0);
    for cycle in 1..=args.cycles {
        let mode = KillMode::pick(&mut schedule);
        let run_ms = args.min_run_ms + schedule.below(args.max_run_ms - args.min_run_ms + 1);
        let kill_delay_us = schedule.below(3001);
        let outcome = run_one_cycle(
            &mut daemon,
            &socket,
            &mut clients,
            cycle,
            mode,
            Duration::from_millis(run_ms),
            Duration::from_micros(kill_delay_us),
            watcher.as_mut(),
            &mut report,
        )?;
        *report.kills.entry(mode).or_default() += 1;
        let restarted = restart_and_verify(&mut daemon, &mut clients, args, cycle, &mut report);
        if let Some(ms) = report.restart_ms.last().filter(|_| !args.quiet) {
            eprintln!(
                "cube-stress crash: cycle {cycle}/{}: {} after {run_ms} ms, {} ops acked; restarted in {ms:.0} ms",
                args.cycles,
                mode.name(),
                outcome
            );
        }
        if restarted && mode == KillMode::CleanShutdown {
            report.nothing_replayed(cycle);
        }
        if let (true, Some(watcher)) = (restarted, watcher.as_mut()) {
            sync_watcher(watcher, daemon.socket(), cycle, &mut clients, &mut report);
        }
        if !restarted || !report.violations.is_empty() {
            break;
        }
        report.cycles_run = cycle;
    }
    if report.violations.is_empty() && report.cycles_run == args.cycles {
        // A clean shutdown folds the whole WAL: the next start replays
        // nothing and finds everything.
        match daemon.terminate() {
            Ok(status) if status.success() => {
                if restart_and_verify(&mut daemon, &mut clients, args, 0, &mut report) {
                    report.nothing_replayed(0);
                    if let Some(watcher) = watcher.as_mut() {
                        sync_watcher(watcher, daemon.socket(), 0, &mut clients, &mut report);
                    }
                }
            }
            Ok(status) => report.bad_exit(0, status, &daemon),
            Err(e) => report.violations.push(Violation {
                cycle: 0,
                client: None,
                coord: None,
                what: format!("clean shutdown failed: {e}"),
                expected: String::new(),
                found: String::new(),
            }),
        }
    }
    let _ = daemon.kill9();
    report.watch = watcher.map(|w| w.figures);
    report.duration = started.elapsed();
    if !report.passed() || args.keep_data {
        let kept = dir.keep();
        report.kept = Some(kept);
    }
    Ok(report)
}

impl TortureReport {
    /// A clean shutdown folds the whole WAL, so the start after it must
    /// replay nothing.
    fn nothing_replayed(&mut self, cycle: usize) {
        let replayed = self.last_replayed;
        if replayed != 0 {
            self.violations.push(Violation {
                cycle,
                client: None,
                coord: None,
                what: "the start after a clean shutdown replayed WAL records; \
                       the shutdown should have folded them all"
                    .to_owned(),
                expected: "0 records replayed".to_owned(),
                found: format!("{replayed} records replayed"),
            });
        }
    }

    fn bad_exit(&mut self, cycle: usize, status: std::process::ExitStatus, daemon: &LocalDaemon) {
        let log = daemon.log_text();
        let tail: Vec<&str> = log.lines().rev().take(5).collect();
        self.violations.push(Violation {
            cycle,
            client: None,
            coord: None,
            what: format!("clean shutdown exited with {status}"),
            expected: "exit 0".to_owned(),
            found: tail.join(" | "),
        });
    }

    /// Set by each read-back: records the daemon replayed at its last start.
    fn note_recovery(&mut self, figures: &[StatsEntry]) {
        let replayed = count_figure(figures, "recovery.records_replayed").unwrap_or(0);
        self.records_replayed_max = self.records_replayed_max.max(replayed);
        self.last_replayed = replayed;
        let load = count_figure(figures, "recovery.checkpoint_ms").unwrap_or(0);
        let replay = count_figure(figures, "recovery.ms").unwrap_or(0);
        self.server_recovery_ms.push(load + replay);
    }
}

/// Runs the load, ends it as `mode` says, and collects the clients.
/// Returns how many operations were acknowledged in the cycle.
#[allow(clippy::too_many_arguments)]
fn run_one_cycle(
    daemon: &mut LocalDaemon,
    socket: &Path,
    clients: &mut [ClientRun],
    cycle: usize,
    mode: KillMode,
    run_for: Duration,
    kill_delay: Duration,
    watcher: Option<&mut Watcher>,
    report: &mut TortureReport,
) -> Result<u64, StressError> {
    let stop = AtomicBool::new(false);
    let acked = AtomicU64::new(0);
    let shared = CycleShared {
        socket,
        cycle,
        stop: &stop,
        acked: &acked,
    };
    let control = connect(socket)?;
    thread::scope(|scope| -> Result<(), StressError> {
        let shared = &shared;
        let mut spawned = Ok(());
        if let Some(watcher) = watcher {
            // Follows the box until the cycle's kill ends its connection.
            if let Err(e) = thread::Builder::new()
                .name("crash-watcher".into())
                .spawn_scoped(scope, move || watcher.follow_live(socket, cycle))
            {
                spawned = Err(StressError::io("cannot start the watcher thread", e));
            }
        }
        for client in clients.iter_mut() {
            if let Err(e) = thread::Builder::new()
                .name(format!("crash-client-{}", client.id))
                .spawn_scoped(scope, move || client.run_cycle(shared))
            {
                spawned = Err(StressError::io("cannot start a client thread", e));
                break;
            }
        }
        // Whatever happens, the clients are told to stop, or the scope
        // would wait for them forever.
        let outcome = spawned.and_then(|()| {
            end_cycle(
                scope, daemon, control, cycle, mode, run_for, kill_delay, report,
            )
        });
        stop.store(true, Ordering::SeqCst);
        outcome
    })?;
    for client in clients.iter_mut() {
        report.violations.append(&mut client.problems);
    }
    Ok(acked.load(Ordering::Relaxed))
}

/// The controller's part of a cycle: let the load run, then end it as
/// `mode` says.
#[allow(clippy::too_many_arguments)]
fn end_cycle<'scope>(
    scope: &'scope thread::Scope<'scope, '_>,
    daemon: &mut LocalDaemon,
    mut control: Client,
    cycle: usize,
    mode: KillMode,
    run_for: Duration,
    kill_delay: Duration,
    report: &mut TortureReport,
) -> Result<(), StressError> {
    {
        thread::sleep(run_for);
        // What the daemon had done by now: proof that folds and compactions
        // ran under the load that is about to be cut.
        if let Ok(figures) = control.stats() {
            report.folds_before_kills += count_figure(&figures, "checkpoint.count").unwrap_or(0);
            report.compactions_before_kills +=
                count_figure(&figures, "checkpoint.compactions").unwrap_or(0);
        }
        match mode {
            KillMode::Random => daemon.kill9()?,
            KillMode::CleanShutdown => {
                // Clients keep going: the ones cut off see "shutting down"
                // or a closed connection.
                let status = daemon.terminate()?;
                if !status.success() {
                    report.bad_exit(cycle, status, daemon);
                }
            }
            KillMode::DuringCheckpoint | KillMode::DuringCompaction => {
                let compact = mode == KillMode::DuringCompaction;
                let request = scope.spawn(move || control.checkpoint(compact));
                thread::sleep(kill_delay);
                daemon.kill9()?;
                match request.join() {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) if is_disconnect(&e) => {
                        report.kills_inside_requested_checkpoint += 1
                    }
                    Ok(Err(e)) => report.violations.push(Violation {
                        cycle,
                        client: None,
                        coord: None,
                        what: format!("the driver's checkpoint (compact: {compact}) failed: {e}"),
                        expected: "success or a cut connection".to_owned(),
                        found: e.to_string(),
                    }),
                    Err(_) => {
                        return Err(StressError::target(
                            "crash",
                            "the checkpoint thread panicked",
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// After a restart and read-back: catches the watcher up and checks it
/// against client 0's read-back state and acknowledged puts.
fn sync_watcher(
    watcher: &mut Watcher,
    socket: &Path,
    cycle: usize,
    clients: &mut [ClientRun],
    report: &mut TortureReport,
) {
    let Some(client) = clients.get_mut(WATCHED_CLIENT) else {
        return;
    };
    let puts = std::mem::take(&mut client.acked_puts);
    let synced = connect(socket)
        .and_then(|mut conn| watcher.sync(&mut conn, socket, cycle, &client.acked, &puts));
    if let Err(e) = synced {
        report.violations.push(Violation {
            cycle,
            client: Some(WATCHED_CLIENT),
            coord: None,
            what: format!("watch: catching the watcher up after the restart failed: {e}"),
            expected: String::new(),
            found: String::new(),
        });
    }
    report.violations.append(&mut watcher.problems);
}

/// Restarts the daemon and compares every client's state with its model.
/// Returns false when the daemon would not come back (a violation).
fn restart_and_verify(
    daemon: &mut LocalDaemon,
    clients: &mut [ClientRun],
    args: &CrashArgs,
    cycle: usize,
    report: &mut TortureReport,
) -> bool {
    let restart_started = Instant::now();
    if let Err(e) = daemon.restart() {
        report.violations.push(Violation {
            cycle,
            client: None,
            coord: None,
            what: "cubed did not come back on its own data".to_owned(),
            expected: "a successful restart".to_owned(),
            found: e.to_string(),
        });
        return false;
    }
    report
        .restart_ms
        .push(restart_started.elapsed().as_secs_f64() * 1000.0);
    let outcome = (|| -> Result<(), ClientError> {
        let mut conn = connect(daemon.socket())?;
        let figures = conn.stats()?;
        report.note_recovery(&figures);
        let mut present = 0u64;
        for client in clients.iter_mut() {
            let (found, strays) = read_state(&mut conn, client.id, args)?;
            report.keys_verified += u64::from(args.keys);
            if !args.no_edges {
                report.edge_lists_verified += u64::from(args.keys);
            }
            if !args.no_programs {
                report.program_planes_verified += 1;
            }
            present += (found.cells.len() + found.prog_cells.len()) as u64;
            for stray in strays {
                report.violations.push(Violation {
                    cycle,
                    client: Some(client.id),
                    coord: None,
                    what: stray,
                    expected: String::new(),
                    found: String::new(),
                });
            }
            judge(client, found, cycle, report);
        }
        let everything = CellBox::new(
            Coord::new(i32::MIN, i32::MIN, i32::MIN),
            Coord::new(i32::MAX, i32::MAX, i32::MAX),
        )
        .map_err(ClientError::BadArgument)?;
        let total = conn.scan_count(NAMESPACE, &everything)?;
        if total != present {
            report.violations.push(Violation {
                cycle,
                client: None,
                coord: None,
                what: "cells exist outside the clients' keys".to_owned(),
                expected: format!("{present} cells in the namespace"),
                found: format!("{total} cells"),
            });
        }
        Ok(())
    })();
    if let Err(e) = outcome {
        report.violations.push(Violation {
            cycle,
            client: None,
            coord: None,
            what: format!("reading back after the restart failed: {e}"),
            expected: String::new(),
            found: String::new(),
        });
    }
    true
}

/// Compares what was found with the two states the client allows, and
/// adopts what was found as the truth for the next cycle.
fn judge(client: &mut ClientRun, found: ClientState, cycle: usize, report: &mut TortureReport) {
    let in_flight = client.in_flight.take();
    let landed_state = in_flight.as_ref().map(|op| {
        let mut state = client.acked.clone();
        op.apply(&mut state);
        state
    });
    let run_in_flight = matches!(in_flight, Some(Op::Run { .. } | Op::Step { .. }));
    if found == client.acked {
        if in_flight.is_some() {
            report.in_flight_lost += 1;
            report.in_flight_runs_lost += u64::from(run_in_flight);
        }
    } else if landed_state.as_ref() == Some(&found) {
        report.in_flight_landed += 1;
        report.in_flight_runs_landed += u64::from(run_in_flight);
    } else {
        let diffs = differences(client.id, &client.acked, &found);
        let mut expected = format!(
            "the acknowledged state ({} values, {} edges, {} program runs)",
            client.acked.cells.len(),
            client.acked.edges.len(),
            client.acked.runs
        );
        if let Some(op) = &in_flight {
            let _ = write!(
                expected,
                ", or it plus the in-flight `{}`",
                op.describe(client.id)
            );
        }
        let shown: Vec<&str> = diffs
            .iter()
            .take(SHOWN_DIFFERENCES)
            .map(String::as_str)
            .collect();
        report.violations.push(Violation {
            cycle,
            client: Some(client.id),
            coord: None,
            what: "state after restart is neither the acknowledged one nor it plus the in-flight operation".to_owned(),
            expected,
            found: format!(
                "{} difference(s) from the acknowledged state: {}{}",
                diffs.len(),
                shown.join("; "),
                if diffs.len() > shown.len() { "; ..." } else { "" }
            ),
        });
    }
    client.acked = found;
    for (name, n) in std::mem::take(&mut client.counts) {
        *report.acked.entry(name).or_default() += n;
    }
    report.reads_checked += std::mem::take(&mut client.reads_checked);
    report.client_checkpoints += std::mem::take(&mut client.checkpoints);
    report.client_compactions += std::mem::take(&mut client.compactions);
    report.refused_shutting_down += std::mem::take(&mut client.refused_shutting_down);
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
