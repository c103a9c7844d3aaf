//! `cubed`'s command line and the configuration it produces.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use cube_protocol::{Limits, MAX_EDGE_LIST, MAX_WALK_NODES};
use cube_store::{SyncPolicy, WalkLimits};

use crate::log::Level;

/// The most `--max-value-bytes` and `--max-frame-bytes` may be: anything
/// one request stores (a value, a program's source) becomes one entry of a
/// checkpoint block, and a block holds at most 64 MiB
/// (`docs/storage-format.md`), so one entry plus a block's other entries
/// must stay well under that.
pub const MAX_STORED_BYTES: u32 = 32 * 1024 * 1024;

/// cubed: the cube daemon. Stores values at 3-D integer coordinates, durably.
///
/// Every write is appended to a write-ahead log and acknowledged only after
/// fdatasync (group commit batches concurrent writers into one sync).
#[derive(Parser, Debug, Clone)]
#[command(name = "cubed", version, after_help = AFTER_HELP)]
pub struct Args {
    /// Data directory (created if missing; locked while cubed runs).
    #[arg(long, value_name = "DIR", default_value = "./cube-data")]
    pub data: PathBuf,

    /// Unix socket path [default: DATA/cubed.sock].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,

    /// Socket file permissions, octal. 600 lets only this user connect;
    /// widen it (e.g. 660, 666) to serve other users, and see --allow-uid.
    #[arg(long, value_name = "OCTAL", default_value = "600", value_parser = parse_mode)]
    pub socket_mode: u32,

    /// Serve only these uids besides root and the daemon's own (repeatable).
    /// Without --allow-uid and --allow-gid, anyone the socket mode lets in
    /// may connect; namespace access lists still decide what they see.
    #[arg(long, value_name = "UID")]
    pub allow_uid: Vec<u32>,

    /// Serve members of these primary gids too (repeatable).
    #[arg(long, value_name = "GID")]
    pub allow_gid: Vec<u32>,

    /// Master key for encrypted namespaces: 32 raw bytes or 64 hex digits,
    /// in a file readable by its owner only (chmod 600).
    #[arg(long, value_name = "PATH")]
    pub key_file: Option<PathBuf>,

    /// When writes are acknowledged: `always` (after fdatasync), `interval=MS`
    /// (at once; fdatasync every MS ms or 1000 writes: a crash loses that
    /// window), or `never` (benchmarks only).
    #[arg(long, value_name = "POLICY", default_value = "always")]
    pub sync: SyncPolicy,

    /// Most concurrent client connections; more are refused with an error.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub max_connections: usize,

    /// Close a connection that sends nothing for this long (0 = never).
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    pub idle_timeout_secs: u64,

    /// Close a connection that starts a frame and does not finish it in this long.
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    pub frame_timeout_ms: u64,

    /// Close a connection that does not read its responses for this long.
    #[arg(long, value_name = "MS", default_value_t = 30_000)]
    pub write_timeout_ms: u64,

    /// Largest value accepted, in bytes (at most 32 MiB).
    #[arg(long, value_name = "BYTES", default_value_t = Limits::DEFAULT_MAX_VALUE_BYTES,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_STORED_BYTES)))]
    pub max_value_bytes: u32,

    /// Largest frame accepted (header + body), in bytes (at most 32 MiB).
    #[arg(long, value_name = "BYTES", default_value_t = Limits::DEFAULT_MAX_FRAME_BYTES,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_STORED_BYTES)))]
    pub max_frame_bytes: u32,

    /// A WAL segment is closed and a new one started past this size.
    #[arg(long, value_name = "BYTES", default_value_t = 32 * 1024 * 1024)]
    pub wal_segment_bytes: u64,

    /// Most writes committed by one fdatasync.
    #[arg(long, value_name = "N", default_value_t = 4096)]
    pub max_group_records: usize,

    /// Fold closed WAL segments into a checkpoint delta once they hold this many bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 64 * 1024 * 1024)]
    pub checkpoint_wal_bytes: u64,

    /// Merge deltas into a new base once they exceed this many bytes (or
    /// half the base, whichever is larger).
    #[arg(long, value_name = "BYTES", default_value_t = 64 * 1024 * 1024)]
    pub delta_compact_bytes: u64,

    /// Most hops a walk may ask for (its default when it asks for none).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_WALK_DEPTH,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_walk_depth: u32,

    /// Most coordinates one walk returns, and most on one path.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_WALK_NODES,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_WALK_NODES)))]
    pub max_walk_nodes: u32,

    /// Most edges one walk or path examines. It bounds how long a walk
    /// holds its namespace's graph read lock, which delays the writer.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_WALK_WORK,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_walk_work: u64,

    /// Most edges leaving one coordinate, and most arriving at one; a link
    /// past it is refused (limit_exceeded).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_EDGES_PER_CELL,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_EDGE_LIST / 2)))]
    pub max_edges_per_cell: u32,

    /// Instruction budget of one program run (Lua VM instructions, plus
    /// what region reads and bulk library calls charge); a run past it
    /// fails with program_fuel and applies nothing.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_PROGRAM_FUEL,
          value_parser = clap::value_parser!(u64).range(1000..))]
    pub program_fuel: u64,

    /// Memory budget of one program run, in bytes; a run past it fails
    /// with program_memory and applies nothing.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_PROGRAM_MEMORY,
          value_parser = parse_program_memory)]
    pub program_memory: usize,

    /// Writer-time backstop of one program run, in milliseconds: catches
    /// programs whose single steps are heavy (copying megabyte strings),
    /// which instruction counting cannot see. Counts as out of fuel.
    #[arg(long, value_name = "MS", default_value_t = DEFAULT_PROGRAM_TIME_MS,
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub program_time_ms: u64,

    /// Writer-time backstop of one `step` (all its runs), in milliseconds:
    /// a step holds the writer, so its runs left after this fail as out of
    /// fuel without running.
    #[arg(long, value_name = "MS", default_value_t = DEFAULT_PROGRAM_STEP_MS,
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub program_step_ms: u64,

    /// Threads one big `step` runs its programs on (the writer and helpers,
    /// each with its own VM); 1 runs every step on the writer alone.
    /// Default: the machine's cores, at most 8.
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=MAX_STEP_THREADS as u64))]
    pub program_step_threads: Option<u64>,

    /// Telemetry records kept per cell (the run count is exact regardless).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_PROGRAM_TELEMETRY_KEEP,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(cube_store::MAX_TELEMETRY_KEEP)))]
    pub program_telemetry_keep: u32,

    /// Bytes of changes a `watch` may have waiting for its client; a
    /// watcher further behind is cut off with "resync from LSN N"
    /// (docs/operations.md, "Following a box").
    #[arg(long, value_name = "BYTES", default_value_t = crate::watch_hub::DEFAULT_WATCH_BUFFER_BYTES,
          value_parser = clap::value_parser!(u64).range(4096..=1 << 32))]
    pub watch_buffer_bytes: u64,

    /// Check every checksum of the data dir DIR offline, print a summary and
    /// exit: 0 if clean, 1 on any problem. Does not start the daemon.
    #[arg(long, value_name = "DIR")]
    pub verify: Option<PathBuf>,

    /// Truncate the log at the first bad record instead of refusing to start.
    /// What is dropped is reported and saved under DATA/wal/repair-*/.
    #[arg(long)]
    pub repair: bool,

    /// error, warn, info or debug.
    #[arg(long, value_name = "LEVEL", env = "CUBE_LOG", default_value = "info")]
    pub log_level: Level,
}

const AFTER_HELP: &str = "\
Examples:
  cubed                                   # ./cube-data, socket ./cube-data/cubed.sock
  cubed --data /var/lib/cube --socket /run/cube/cubed.sock
  cubed --repair                          # start after truncating a corrupt log
  cubed --verify ./cube-data              # offline: check every checksum, then exit

Exit status: 0 after a clean shutdown (SIGINT/SIGTERM), 1 if it could not start.";

/// Defaults of the walk limits: deep enough for any neighbourhood query,
/// and a work bound (edges examined) that a walk or path covers in about
/// 10-40 ms on a 1 M-node graph (`docs/benchmarks.md`, "Edges and walks"):
/// the longest a walk can keep the writer waiting for the graph lock.
pub const DEFAULT_MAX_WALK_DEPTH: u32 = 64;
pub const DEFAULT_MAX_WALK_NODES: u32 = 100_000;
pub const DEFAULT_MAX_WALK_WORK: u64 = 250_000;
pub const DEFAULT_MAX_EDGES_PER_CELL: u32 = 4096;

/// Program budgets (`docs/programs.md`, "Limits"): a million
/// instructions is a few milliseconds of writer time; 8 MiB is far more
/// than a rule over its neighbourhood needs, and small enough that a
/// runaway allocation is stopped before it matters.
pub const DEFAULT_PROGRAM_FUEL: u64 = 1_000_000;
pub const DEFAULT_PROGRAM_MEMORY: usize = 8 * 1024 * 1024;
pub const DEFAULT_PROGRAM_TIME_MS: u64 = 250;
/// A step's writer-time backstop: long enough for a 32^3 step of small
/// rules (tens of milliseconds), short enough that other writers wait
/// seconds at most.
pub const DEFAULT_PROGRAM_STEP_MS: u64 = 2000;
/// Most threads one `step` runs its programs on: each holds a VM, and a
/// step's runs are a few microseconds each, so more rarely pays.
pub const MAX_STEP_THREADS: usize = 8;
pub const DEFAULT_PROGRAM_TELEMETRY_KEEP: u32 = 1000;

fn parse_program_memory(text: &str) -> Result<usize, String> {
    text.parse::<usize>()
        .ok()
        .filter(|bytes| (64 * 1024..=1 << 32).contains(bytes))
        .ok_or_else(|| {
            format!("bad program memory {text:?}: give bytes between 65536 and 4294967296")
        })
}

fn parse_mode(text: &str) -> Result<u32, String> {
    u32::from_str_radix(text, 8)
        .ok()
        .filter(|mode| *mode <= 0o777)
        .ok_or_else(|| {
            format!("bad socket mode {text:?}: give octal permissions such as 600 or 660")
        })
}

impl Args {
    pub fn socket_path(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(|| self.data.join("cubed.sock"))
    }

    pub fn limits(&self) -> Limits {
        Limits {
            max_frame_bytes: self.max_frame_bytes,
            max_value_bytes: self.max_value_bytes,
        }
    }

    /// The walk and path bounds; answers stay within one frame.
    pub fn walk_limits(&self) -> WalkLimits {
        WalkLimits {
            max_depth: self.max_walk_depth,
            max_nodes: self.max_walk_nodes,
            max_work: self.max_walk_work,
            // Header, status and the walk answer's fixed fields.
            max_answer_bytes: (self.max_frame_bytes as usize).saturating_sub(64),
        }
    }

    /// `--program-step-threads`, or the machine's cores (at most
    /// [`MAX_STEP_THREADS`]).
    pub fn step_threads(&self) -> usize {
        match self.program_step_threads {
            Some(n) => n as usize,
            None => std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .min(MAX_STEP_THREADS),
        }
    }

    pub fn idle_timeout(&self) -> Option<Duration> {
        (self.idle_timeout_secs > 0).then(|| Duration::from_secs(self.idle_timeout_secs))
    }

    pub fn frame_timeout(&self) -> Duration {
        Duration::from_millis(self.frame_timeout_ms.max(1))
    }

    pub fn write_timeout(&self) -> Duration {
        Duration::from_millis(self.write_timeout_ms.max(1))
    }

    /// Checks what one flag's range cannot: that the limits fit together.
    /// A frame must carry the largest value with room for the fixed parts
    /// of any answer around it (a scan page, a walk node, a `get`), or a
    /// stored value could never be read back whole.
    pub fn check(&self) -> Result<(), String> {
        if self.max_frame_bytes < MIN_FRAME_BYTES {
            return Err(format!(
                "--max-frame-bytes {} is below the least a frame must carry, {MIN_FRAME_BYTES}",
                self.max_frame_bytes
            ));
        }
        let needed = u64::from(self.max_value_bytes) + u64::from(ANSWER_OVERHEAD_BYTES);
        if u64::from(self.max_frame_bytes) < needed {
            return Err(format!(
                "--max-frame-bytes {} cannot carry a value of --max-value-bytes {} in an answer \
                 (it needs {ANSWER_OVERHEAD_BYTES} bytes more than the value): raise \
                 --max-frame-bytes to at least {needed} or lower --max-value-bytes",
                self.max_frame_bytes, self.max_value_bytes
            ));
        }
        Ok(())
    }
}

/// The least `--max-frame-bytes` may be.
pub const MIN_FRAME_BYTES: u32 = 4096;

/// Room an answer needs around one value: frame header, status, counts,
/// coordinates, lengths, a scan cursor, a walk node's fields.
pub const ANSWER_OVERHEAD_BYTES: u32 = 1024;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A value or frame limit past what one checkpoint block can hold is
    /// refused at startup (found by review: a value near 64 MiB stopped
    /// the checkpointer on an assertion, and the WAL grew without bound).
    #[test]
    fn value_and_frame_limits_stay_within_a_checkpoint_block() {
        for flag in ["--max-value-bytes", "--max-frame-bytes"] {
            let most = MAX_STORED_BYTES.to_string();
            assert!(Args::try_parse_from(["cubed", flag, most.as_str()]).is_ok());
            let over = (MAX_STORED_BYTES + 1).to_string();
            let refused = Args::try_parse_from(["cubed", flag, over.as_str()]).unwrap_err();
            assert!(
                refused.to_string().contains("not in 1..=33554432"),
                "{refused}"
            );
        }
    }

    /// A frame must carry the largest value with room for an answer's
    /// fixed parts (found by review: with both limits at 4096 a stored
    /// value's scan answer was 4107 bytes, over the frame, so it could
    /// never be scanned or exported).
    #[test]
    fn the_frame_limit_must_carry_the_value_limit() {
        let args = |frame: &str, value: &str| {
            Args::try_parse_from([
                "cubed",
                "--max-frame-bytes",
                frame,
                "--max-value-bytes",
                value,
            ])
            .unwrap()
        };
        assert!(
            args("4096", "4096")
                .check()
                .unwrap_err()
                .contains("at least 5120")
        );
        assert!(
            args("1", "1")
                .check()
                .unwrap_err()
                .contains("below the least")
        );
        assert!(args("5120", "4096").check().is_ok());
        assert!(Args::try_parse_from(["cubed"]).unwrap().check().is_ok());
    }
}
