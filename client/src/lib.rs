//! Talk to `cubed`, the cube storage daemon.
//!
//! One job: be the synchronous, typed way in. [`Client`] speaks the wire
//! protocol from `cube-protocol` over a Unix socket (handshake, request ids,
//! limits, error frames), and `LocalDaemon` (cargo feature `local-daemon`,
//! off by default so the library and `cubec` carry no `tempfile` or `libc`)
//! launches a throwaway `cubed` on a temporary data directory for
//! integration tests, the stress driver and the `cubec` tests. The `cubec` binary is a thin command line over
//! [`Client`].
#![cfg_attr(test, allow(clippy::unwrap_used))]
// A function past a screen is split into its steps (clippy counts lines
// of code; the limit is in clippy.toml). Tests may run longer.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

pub mod base64;
mod bulk;
mod client;
mod duration;
mod edges;
mod error;
pub mod json;
#[cfg(feature = "local-daemon")]
pub mod local_daemon;
mod namespaces;
mod programs;
mod scan;
mod watch;

pub use bulk::{BatchAck, failed_op_index};
pub use client::{
    Client, DEFAULT_SOCKET_PATH, MAX_PIPELINE_BYTES, MAX_PIPELINE_REQUESTS, SOCKET_ENV_VAR,
    default_socket_path,
};
pub use cube_protocol::{
    BatchOp, EdgePage, ListedEdge, ListedProgram, MAX_BATCH_BYTES, MAX_BATCH_OPS, MAX_EDGE_PAGE,
    MAX_PROGRAM_BYTES, MAX_PROGRAM_PAGE, ProgramPage,
};
pub use cube_protocol::{
    CellBox, Coord, Direction, EdgeInfo, EdgeLabel, EdgeWeight, ErrorCode, Limits, MAX_MGET_CELLS,
    MAX_SCAN_PAGE_CELLS, NamespaceName, PathFound, Request, Response, ScanCell, ScanResult,
    ServerError, StatsEntry, StatsValue, WalkNode, WalkResult, WalkStop, parse_coord,
};
pub use cube_protocol::{
    CellStats, ProgramValue, RunOutcome, RunRecord, RunReply, StepFailure, StepReply,
};
pub use cube_protocol::{CurveChoice, MAX_GRANTS, NamespaceGrant, NamespaceInfo, NamespaceSpec};
pub use cube_protocol::{ResyncReason, WatchChange, WatchOp};
pub use cube_protocol::{ScanCells, ScanCellsIter};
pub use duration::{parse_millis, parse_seconds};
pub use edges::{Detached, Linked, PathAnswer, WalkOptions};
pub use error::ClientError;
#[cfg(feature = "local-daemon")]
pub use local_daemon::LocalDaemon;
pub use programs::Stored;
pub use scan::{ScanIter, ScanPage, ScanPages};
pub use watch::{Watch, WatchGroup, describe_resync};
