//! `cubed`'s command line and the configuration it produces.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use cube_protocol::Limits;
use cube_store::SyncPolicy;

use crate::log::Level;

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

    /// Socket file permissions, octal. 600 lets only this user connect.
    #[arg(long, value_name = "OCTAL", default_value = "600", value_parser = parse_mode)]
    pub socket_mode: u32,

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

    /// Largest value accepted, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = Limits::DEFAULT_MAX_VALUE_BYTES)]
    pub max_value_bytes: u32,

    /// Largest frame accepted (header + body), in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = Limits::DEFAULT_MAX_FRAME_BYTES)]
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

    pub fn idle_timeout(&self) -> Option<Duration> {
        (self.idle_timeout_secs > 0).then(|| Duration::from_secs(self.idle_timeout_secs))
    }

    pub fn frame_timeout(&self) -> Duration {
        Duration::from_millis(self.frame_timeout_ms.max(1))
    }

    pub fn write_timeout(&self) -> Duration {
        Duration::from_millis(self.write_timeout_ms.max(1))
    }
}
