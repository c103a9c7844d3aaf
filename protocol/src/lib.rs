//! The cube wire protocol: how a client and `cubed` talk over a Unix socket.
//!
//! One job: turn requests and responses into length-prefixed, CRC32C-checked
//! frames and back, without ever panicking or over-allocating on hostile
//! input. Everything here is pure (no I/O besides the `Read`/`Write` helpers
//! in [`frame`]), so the server, the client, the stress driver and the fuzz
//! targets all share one definition. `docs/protocol.md` specifies every byte.
//!
//! The data model types ([`Coord`], [`NamespaceName`]) live here too because
//! they are the shared vocabulary of every crate above this one.
#![cfg_attr(test, allow(clippy::unwrap_used))]
// A function past a screen is split into its steps (clippy counts lines
// of code; the limit is in clippy.toml). Tests may run longer.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

pub mod bulk;
pub mod edge;
mod error;
pub mod frame;
mod model;
pub mod namespace;
mod page_encoder;
pub mod program;
mod request;
mod response;
mod scan_cells;
pub mod watch;
mod wire;

pub use bulk::{
    BatchOp, EdgePage, ListedEdge, ListedProgram, MAX_BATCH_BYTES, MAX_BATCH_OPS, MAX_EDGE_PAGE,
    MAX_PROGRAM_PAGE, ProgramPage,
};
pub use edge::{
    Direction, EdgeInfo, EdgeLabel, EdgeWeight, MAX_EDGE_LIST, MAX_LABEL_BYTES, MAX_WALK_NODES,
    PathFound, WalkNode, WalkResult, WalkStop,
};
pub use error::{DecodeError, ErrorCode, ProtocolError};
pub use frame::{FrameHeader, HEADER_BYTES, Limits, Opcode};
pub use model::{CellBox, Coord, NamespaceName, parse_coord};
pub use namespace::{
    CurveChoice, MAX_GRANTS, MAX_LISTED_NAMESPACES, NamespaceGrant, NamespaceInfo, NamespaceSpec,
};
pub use page_encoder::{MgetEncoder, ScanPageEncoder};
pub use program::{
    CellStats, MAX_CELL_STATS_RECORDS, MAX_OUTCOME_MESSAGE_BYTES, MAX_PROGRAM_BYTES,
    MAX_RESULT_ENTRIES, MAX_RUN_ARG_BYTES, MAX_RUN_ARGS, ProgramValue, RunOutcome, RunRecord,
    RunReply, StepFailure, StepReply,
};
pub use request::{MAX_MGET_CELLS, Request};
pub use response::{
    MAX_SCAN_PAGE_CELLS, MAX_STATS_ENTRIES, Response, ScanCell, ScanResult, ServerError,
    StatsEntry, StatsValue,
};
pub use scan_cells::{
    ScanCells, ScanCellsIter, ScanPageRef, ScanResultRef, decode_scan_page, split_scan_cell,
};

pub use watch::{
    MAX_WATCH_FRAME_CHANGES, ResyncReason, WatchChange, WatchFrame, WatchFrameEncoder, WatchOp,
};

/// The protocol version this crate speaks. Bumped on any incompatible change.
pub const PROTOCOL_VERSION: u16 = 1;
