//! `cubed`'s command line and the configuration it produces.

use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use clap::builder::RangedU64ValueParser;
use cube_protocol::{Limits, MAX_EDGE_LIST, MAX_WALK_NODES};
use cube_store::{SyncPolicy, WalkLimits};

use crate::duration_flag::{TimeUnit, in_unit};
use crate::log::Level;

/// The most `--max-value-bytes` and `--max-frame-bytes` may be: anything
/// one request stores (a value, a program's source) becomes one entry of a
/// checkpoint block, and a block holds at most 64 MiB
/// (`docs/storage-format.md`), so one entry plus a block's other entries
/// must stay well under that.
pub const MAX_STORED_BYTES: u32 = 32 * 1024 * 1024;

/// `cubed --version`: the version and the global allocator the binary was
/// built with (cargo features of this crate; `src/main.rs` links it), so a
/// build on another allocator than the measured one shows
/// (docs/benchmarks.md, "Allocator"; `tests/allocator.rs`).
#[cfg(feature = "jemalloc")]
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (allocator: jemalloc)");
#[cfg(all(feature = "mimalloc", not(feature = "jemalloc")))]
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (allocator: mimalloc)");
#[cfg(not(any(feature = "jemalloc", feature = "mimalloc")))]
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (allocator: system malloc)");

/// cubed: the cube daemon. Stores values at 3-D integer coordinates, durably.
///
/// Every write is appended to a write-ahead log and acknowledged only after
/// fdatasync (group commit batches concurrent writers into one sync).
#[derive(Parser, Debug, Clone)]
#[command(name = "cubed", version = VERSION, after_help = AFTER_HELP)]
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
    #[arg(long, value_name = "N", default_value_t = 1024,
          value_parser = ranged::<usize>(MAX_CONNECTIONS_RANGE))]
    pub max_connections: usize,

    /// Close a connection that sends nothing for this long (0 = never);
    /// seconds, or with units (5m).
    #[arg(long, value_name = "SECS", default_value_t = 300,
          value_parser = in_unit(TimeUnit::Secs, IDLE_TIMEOUT_SECS_RANGE))]
    pub idle_timeout_secs: u64,

    /// Close a connection that starts a frame and does not finish it in this long
    /// (milliseconds, or with units: 10s).
    #[arg(long, value_name = "MS", default_value_t = 10_000,
          value_parser = in_unit(TimeUnit::Millis, CONNECTION_TIMEOUT_MS_RANGE))]
    pub frame_timeout_ms: u64,

    /// Close a connection that does not read its responses for this long
    /// (milliseconds, or with units: 30s).
    #[arg(long, value_name = "MS", default_value_t = 30_000,
          value_parser = in_unit(TimeUnit::Millis, CONNECTION_TIMEOUT_MS_RANGE))]
    pub write_timeout_ms: u64,

    /// Largest value accepted, in bytes (at most 32 MiB less 1 KiB).
    #[arg(long, value_name = "BYTES", default_value_t = Limits::DEFAULT_MAX_VALUE_BYTES,
          value_parser = ranged::<u32>(MAX_VALUE_BYTES_RANGE))]
    pub max_value_bytes: u32,

    /// Largest frame accepted (header + body), in bytes (4 KiB to 32 MiB).
    #[arg(long, value_name = "BYTES", default_value_t = Limits::DEFAULT_MAX_FRAME_BYTES,
          value_parser = ranged::<u32>(MAX_FRAME_BYTES_RANGE))]
    pub max_frame_bytes: u32,

    /// A WAL segment is closed and a new one started past this size.
    #[arg(long, value_name = "BYTES", default_value_t = 32 * 1024 * 1024,
          value_parser = ranged::<u64>(WAL_SEGMENT_BYTES_RANGE))]
    pub wal_segment_bytes: u64,

    /// Most writes committed by one fdatasync.
    #[arg(long, value_name = "N", default_value_t = 4096,
          value_parser = ranged::<usize>(MAX_GROUP_RECORDS_RANGE))]
    pub max_group_records: usize,

    /// Fold closed WAL segments into a checkpoint delta once they hold this many bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 64 * 1024 * 1024,
          value_parser = ranged::<u64>(CHECKPOINT_BYTES_RANGE))]
    pub checkpoint_wal_bytes: u64,

    /// Memory for cells, in bytes: a quarter keeps namespaces in memory
    /// (the largest moves to its run files past it); for those on disk a
    /// quarter is the row cache (values point reads read) and half the
    /// block cache. Default: a quarter of the machine's RAM (printed at
    /// start).
    #[arg(long, value_name = "BYTES", value_parser = ranged::<u64>(CACHE_BYTES_RANGE))]
    pub cache_bytes: Option<u64>,

    /// Memory for the recent writes of namespaces on disk, in bytes: past
    /// half of it a checkpoint folds them into run files; past all of it
    /// writes slow down (a pause per write growing with the excess).
    #[arg(long, value_name = "BYTES", default_value_t = 256 * 1024 * 1024,
          value_parser = ranged::<u64>(MEMTABLE_BYTES_RANGE))]
    pub memtable_bytes: u64,

    /// Merge deltas into a new base once they exceed this many bytes (or
    /// half the base, whichever is larger).
    #[arg(long, value_name = "BYTES", default_value_t = 64 * 1024 * 1024,
          value_parser = ranged::<u64>(CHECKPOINT_BYTES_RANGE))]
    pub delta_compact_bytes: u64,

    /// Most hops a walk may ask for (its default when it asks for none).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_WALK_DEPTH,
          value_parser = ranged::<u32>(MAX_WALK_NODES_RANGE))]
    pub max_walk_depth: u32,

    /// Most coordinates one walk returns, and most on one path.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_WALK_NODES,
          value_parser = ranged::<u32>(MAX_WALK_NODES_RANGE))]
    pub max_walk_nodes: u32,

    /// Most edges one walk or path examines. It bounds how long a walk
    /// holds its namespace's graph read lock, which delays the writer.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_WALK_WORK,
          value_parser = ranged::<u64>(MAX_WALK_WORK_RANGE))]
    pub max_walk_work: u64,

    /// Most edges leaving one coordinate, and most arriving at one; a link
    /// past it is refused (limit_exceeded).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_EDGES_PER_CELL,
          value_parser = ranged::<u32>(MAX_EDGES_PER_CELL_RANGE))]
    pub max_edges_per_cell: u32,

    /// Instruction budget of one program run (Lua VM instructions, plus
    /// what region reads and bulk library calls charge); a run past it
    /// fails with program_fuel and applies nothing.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_PROGRAM_FUEL,
          value_parser = ranged::<u64>(PROGRAM_FUEL_RANGE))]
    pub program_fuel: u64,

    /// Memory budget of one program run, in bytes; a run past it fails
    /// with program_memory and applies nothing.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_PROGRAM_MEMORY,
          value_parser = ranged::<usize>(PROGRAM_MEMORY_RANGE))]
    pub program_memory: usize,

    /// Writer-time backstop of one program run, in milliseconds: catches
    /// programs whose single instructions are heavy (copying megabyte strings),
    /// which instruction counting cannot see. Counts as out of fuel.
    #[arg(long, value_name = "MS", default_value_t = DEFAULT_PROGRAM_TIME_MS,
          value_parser = in_unit(TimeUnit::Millis, PROGRAM_TIME_MS_RANGE))]
    pub program_time_ms: u64,

    /// Writer-time backstop of one `step` (all its runs), in milliseconds:
    /// a step holds the writer, so its runs left after this fail as out of
    /// fuel without running.
    #[arg(long, value_name = "MS", default_value_t = DEFAULT_PROGRAM_STEP_MS,
          value_parser = in_unit(TimeUnit::Millis, PROGRAM_TIME_MS_RANGE))]
    pub program_step_ms: u64,

    /// Threads one big `step` runs its programs on (the writer and helpers,
    /// each with its own VM); 1 runs every step on the writer alone.
    /// Default: the machine's cores, at most 8.
    #[arg(long, value_name = "N",
          value_parser = ranged::<u64>(PROGRAM_STEP_THREADS_RANGE))]
    pub program_step_threads: Option<u64>,

    /// Telemetry records kept per cell (the run count is exact regardless).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_PROGRAM_TELEMETRY_KEEP,
          value_parser = ranged::<u32>(PROGRAM_TELEMETRY_KEEP_RANGE))]
    pub program_telemetry_keep: u32,

    /// Tenancy limits (`docs/operations.md`, "Per-uid limits and the client
    /// memory budget"). Most connections one uid may hold at once; root and
    /// the daemon's own uid are not limited. Past it: too_many_connections.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_CONNECTIONS_PER_UID,
          value_parser = ranged::<u32>(MAX_CONNECTIONS_RANGE))]
    pub max_connections_per_uid: u32,

    /// Most namespaces one uid may own; root and the daemon's own uid are
    /// limited only by the store's total. Past it: limit_exceeded.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_NAMESPACES_PER_UID,
          value_parser = ranged::<u32>(MAX_NAMESPACES_PER_UID_RANGE))]
    pub max_namespaces_per_uid: u32,

    /// Who may create namespaces besides root and the daemon's own uid:
    /// `any` served uid, `none`, or a comma-separated list of uids.
    #[arg(long, value_name = "any|none|UID,UID...", default_value = "any",
          value_parser = parse_ns_create_uids)]
    pub ns_create_uids: NsCreators,

    /// One budget, in bytes, for every client's input and output buffers
    /// together (frame bodies being read, answers not yet sent); when it is
    /// reached the connections holding the most are cut, largest first.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_CLIENT_MEMORY,
          value_parser = ranged::<u64>(MAX_CLIENT_MEMORY_RANGE))]
    pub max_client_memory: u64,

    /// Bytes of changes a `watch` may have waiting for its client; a
    /// watcher further behind is cut off with "resync from LSN N"
    /// (docs/operations.md, "Following a box").
    #[arg(long, value_name = "BYTES", default_value_t = crate::watch_hub::DEFAULT_WATCH_BUFFER_BYTES,
          value_parser = ranged::<u64>(WATCH_BUFFER_BYTES_RANGE))]
    pub watch_buffer_bytes: u64,

    /// Check every checksum of the data dir DIR offline, print a summary and
    /// exit: 0 if clean, 1 on any problem. Does not start the daemon.
    #[arg(long, value_name = "DIR")]
    pub verify: Option<PathBuf>,

    /// Truncate the log at the first bad record instead of refusing to start.
    /// What is dropped is reported and saved under DATA/wal/repair-*/.
    #[arg(long)]
    pub repair: bool,

    /// Serve Prometheus metrics over HTTP at ADDR (`GET /metrics`), e.g.
    /// 127.0.0.1:9464; port 0 picks one (logged). Off by default.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<std::net::SocketAddr>,

    /// Allow --metrics-listen on a non-loopback address (whoever reaches it
    /// sees every namespace's name and size).
    #[arg(long, requires = "metrics_listen")]
    pub metrics_listen_any: bool,

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

Exit status: 0 after a clean shutdown (SIGINT/SIGTERM, and the other
signals docs/operations.md lists), 1 if it could not start, 2 on a bad flag
(every number has a range, given in the message).";

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

/// Tenancy defaults: a user never needs more connections or namespaces than
/// this legitimately, and 256 MiB of client buffers is sixteen frames of
/// the largest size in flight at once.
pub const DEFAULT_MAX_CONNECTIONS_PER_UID: u32 = 128;
pub const DEFAULT_MAX_NAMESPACES_PER_UID: u32 = 64;
pub const DEFAULT_MAX_CLIENT_MEMORY: u64 = 256 * 1024 * 1024;
pub const MIN_CLIENT_MEMORY: u64 = 1024 * 1024;

/// `--ns-create-uids`: who besides the administrators may create namespaces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NsCreators {
    Any,
    Only(Vec<u32>),
}

impl NsCreators {
    pub fn allows(&self, uid: u32) -> bool {
        match self {
            NsCreators::Any => true,
            NsCreators::Only(uids) => uids.contains(&uid),
        }
    }
}

fn parse_ns_create_uids(text: &str) -> Result<NsCreators, String> {
    match text {
        "any" => return Ok(NsCreators::Any),
        "none" => return Ok(NsCreators::Only(Vec::new())),
        _ => {}
    }
    text.split(',')
        .map(|uid| uid.trim().parse::<u32>().ok())
        .collect::<Option<Vec<u32>>>()
        .filter(|uids| !uids.is_empty())
        .map(NsCreators::Only)
        .ok_or_else(|| {
            format!("bad --ns-create-uids {text:?}: give any, none, or uids such as 1000,1001")
        })
}

/// The parser of every size, count and time flag: an unsigned integer
/// within `range`, anything else refused (exit 2) with the range in the
/// message (`0 is not in 65536..=1073741824`). A new flag takes a
/// `*_RANGE` constant here, `value_parser = ranged::<T>(ITS_RANGE)`, and a
/// row in [`FLAG_RANGES`] (`server/tests/flag_ranges.rs` tests the edges
/// of every row and fails on a numeric flag without one).
pub fn ranged<T>(range: RangeInclusive<u64>) -> RangedU64ValueParser<T>
where
    T: TryFrom<u64> + Clone + Send + Sync + 'static,
{
    RangedU64ValueParser::<T>::new().range(range)
}

/// Why each bound: `docs/operations.md`, "Flag ranges".
pub const MAX_CONNECTIONS_RANGE: RangeInclusive<u64> = 1..=65_536;
/// Up to a day; 0 keeps silent connections open forever.
pub const IDLE_TIMEOUT_SECS_RANGE: RangeInclusive<u64> = 0..=86_400;
/// `--frame-timeout-ms`, `--write-timeout-ms`: 100 ms to 10 minutes.
pub const CONNECTION_TIMEOUT_MS_RANGE: RangeInclusive<u64> = 100..=600_000;
/// An answer must carry a value with [`ANSWER_OVERHEAD_BYTES`] around it
/// in the largest frame.
pub const MAX_VALUE_BYTES_RANGE: RangeInclusive<u64> =
    1..=(MAX_STORED_BYTES - ANSWER_OVERHEAD_BYTES) as u64;
pub const MAX_FRAME_BYTES_RANGE: RangeInclusive<u64> =
    MIN_FRAME_BYTES as u64..=MAX_STORED_BYTES as u64;
/// Each segment is zero-filled ahead of need: below 64 KiB the log is a
/// file per few writes, past 1 GiB one preallocation fills a disk.
pub const WAL_SEGMENT_BYTES_RANGE: RangeInclusive<u64> = 65_536..=1 << 30;
pub const MAX_GROUP_RECORDS_RANGE: RangeInclusive<u64> = 1..=65_536;
/// `--checkpoint-wal-bytes`, `--delta-compact-bytes`: 64 KiB to 16 GiB
/// (past it, a restart replays or loads for minutes).
pub const CHECKPOINT_BYTES_RANGE: RangeInclusive<u64> = 65_536..=16 << 30;
/// `--cache-bytes`: 16 MiB (a few namespaces' blocks) to 1 TiB.
pub const CACHE_BYTES_RANGE: RangeInclusive<u64> = 16 << 20..=1 << 40;
/// `--memtable-bytes`: 4 MiB (a fold every few thousand writes) to 64 GiB.
pub const MEMTABLE_BYTES_RANGE: RangeInclusive<u64> = 4 << 20..=64 << 30;
/// `--max-walk-depth`, `--max-walk-nodes`: a walk deeper than the nodes
/// it may return finds nothing more.
pub const MAX_WALK_NODES_RANGE: RangeInclusive<u64> = 1..=MAX_WALK_NODES as u64;
/// About 10 s of one graph read lock at most.
pub const MAX_WALK_WORK_RANGE: RangeInclusive<u64> = 1..=100_000_000;
pub const MAX_EDGES_PER_CELL_RANGE: RangeInclusive<u64> = 1..=(MAX_EDGE_LIST / 2) as u64;
/// The time backstop bounds a run whatever its fuel.
pub const PROGRAM_FUEL_RANGE: RangeInclusive<u64> = 1000..=1_000_000_000_000;
pub const PROGRAM_MEMORY_RANGE: RangeInclusive<u64> = 64 * 1024..=1 << 32;
/// `--program-time-ms`, `--program-step-ms`: a minute of writer time at most.
pub const PROGRAM_TIME_MS_RANGE: RangeInclusive<u64> = 1..=60_000;
pub const PROGRAM_STEP_THREADS_RANGE: RangeInclusive<u64> = 1..=MAX_STEP_THREADS as u64;
pub const PROGRAM_TELEMETRY_KEEP_RANGE: RangeInclusive<u64> =
    1..=cube_store::MAX_TELEMETRY_KEEP as u64;
/// As many as the store holds.
pub const MAX_NAMESPACES_PER_UID_RANGE: RangeInclusive<u64> = 1..=65_536;
/// At least a megabyte (smaller cuts every client); at most a terabyte.
pub const MAX_CLIENT_MEMORY_RANGE: RangeInclusive<u64> = MIN_CLIENT_MEMORY..=1 << 40;
/// A watch must hold at least a few changes; at most 4 GiB waits for one client.
pub const WATCH_BUFFER_BYTES_RANGE: RangeInclusive<u64> = 4096..=1 << 32;
/// `--sync interval=MS`: a minute of acknowledged writes at risk at most.
pub const SYNC_INTERVAL_MS_RANGE: RangeInclusive<u64> = 1..=60_000;

/// Every size, count and time flag and its range.
pub const FLAG_RANGES: &[(&str, RangeInclusive<u64>)] = &[
    ("--max-connections", MAX_CONNECTIONS_RANGE),
    ("--idle-timeout-secs", IDLE_TIMEOUT_SECS_RANGE),
    ("--frame-timeout-ms", CONNECTION_TIMEOUT_MS_RANGE),
    ("--write-timeout-ms", CONNECTION_TIMEOUT_MS_RANGE),
    ("--max-value-bytes", MAX_VALUE_BYTES_RANGE),
    ("--max-frame-bytes", MAX_FRAME_BYTES_RANGE),
    ("--wal-segment-bytes", WAL_SEGMENT_BYTES_RANGE),
    ("--max-group-records", MAX_GROUP_RECORDS_RANGE),
    ("--checkpoint-wal-bytes", CHECKPOINT_BYTES_RANGE),
    ("--delta-compact-bytes", CHECKPOINT_BYTES_RANGE),
    ("--cache-bytes", CACHE_BYTES_RANGE),
    ("--memtable-bytes", MEMTABLE_BYTES_RANGE),
    ("--max-walk-depth", MAX_WALK_NODES_RANGE),
    ("--max-walk-nodes", MAX_WALK_NODES_RANGE),
    ("--max-walk-work", MAX_WALK_WORK_RANGE),
    ("--max-edges-per-cell", MAX_EDGES_PER_CELL_RANGE),
    ("--program-fuel", PROGRAM_FUEL_RANGE),
    ("--program-memory", PROGRAM_MEMORY_RANGE),
    ("--program-time-ms", PROGRAM_TIME_MS_RANGE),
    ("--program-step-ms", PROGRAM_TIME_MS_RANGE),
    ("--program-step-threads", PROGRAM_STEP_THREADS_RANGE),
    ("--program-telemetry-keep", PROGRAM_TELEMETRY_KEEP_RANGE),
    ("--max-connections-per-uid", MAX_CONNECTIONS_RANGE),
    ("--max-namespaces-per-uid", MAX_NAMESPACES_PER_UID_RANGE),
    ("--max-client-memory", MAX_CLIENT_MEMORY_RANGE),
    ("--watch-buffer-bytes", WATCH_BUFFER_BYTES_RANGE),
];

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
    /// `--cache-bytes`, or its default: a quarter of the machine's RAM
    /// (1 GiB if /proc/meminfo cannot say), within its range.
    pub fn cache_bytes(&self) -> u64 {
        self.cache_bytes.unwrap_or_else(|| {
            let ram = machine_ram_bytes().unwrap_or(4 << 30);
            (ram / 4).clamp(*CACHE_BYTES_RANGE.start(), *CACHE_BYTES_RANGE.end())
        })
    }

    pub fn check(&self) -> Result<(), String> {
        if let SyncPolicy::Interval { every, .. } = self.sync {
            let ms = every.as_millis() as u64;
            if !SYNC_INTERVAL_MS_RANGE.contains(&ms) {
                return Err(format!(
                    "--sync interval={ms}: the interval is not in {}..={} ms",
                    SYNC_INTERVAL_MS_RANGE.start(),
                    SYNC_INTERVAL_MS_RANGE.end()
                ));
            }
        }
        if let Some(addr) = self.metrics_listen {
            crate::metrics_http::check_address(addr, self.metrics_listen_any)?;
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
        // One request in and its answer out must fit, or a lone client
        // sending the largest frame would be cut.
        let frames = 2 * u64::from(self.max_frame_bytes);
        if self.max_client_memory < frames {
            return Err(format!(
                "--max-client-memory {} cannot hold one largest frame in and one out: raise it \
                 to at least {frames} (twice --max-frame-bytes) or lower --max-frame-bytes",
                self.max_client_memory
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

/// The machine's RAM, from /proc/meminfo's MemTotal.
fn machine_ram_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A value or frame limit past what one checkpoint block can hold is
    /// refused at startup (a past bug: a value near 64 MiB stopped
    /// the checkpointer on an assertion, and the WAL grew without bound).
    #[test]
    fn value_and_frame_limits_stay_within_a_checkpoint_block() {
        for (flag, most) in [
            (
                "--max-value-bytes",
                MAX_STORED_BYTES - ANSWER_OVERHEAD_BYTES,
            ),
            ("--max-frame-bytes", MAX_STORED_BYTES),
        ] {
            let most_text = most.to_string();
            assert!(Args::try_parse_from(["cubed", flag, most_text.as_str()]).is_ok());
            let over = (most + 1).to_string();
            let refused = Args::try_parse_from(["cubed", flag, over.as_str()]).unwrap_err();
            assert!(
                refused.to_string().contains(&format!("..={most}")),
                "{refused}"
            );
        }
    }

    /// A frame must carry the largest value with room for an answer's
    /// fixed parts (a past bug: with both limits at 4096 a stored
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
        assert!(Args::try_parse_from(["cubed", "--max-frame-bytes", "4095"]).is_err());
        assert!(args("5120", "4096").check().is_ok());
        assert!(Args::try_parse_from(["cubed"]).unwrap().check().is_ok());
    }
}
