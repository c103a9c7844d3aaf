//! Requests and responses and their body encodings.
//!
//! A response body starts with a status byte: `0` then the result fields of
//! the request's opcode, or `1` then an error (`u16` code, `u16` length,
//! UTF-8 message).

use crate::PROTOCOL_VERSION;
use crate::bulk::{
    BatchOp, EdgePage, ProgramPage, put_batch_ops, put_edge_list_request, put_edge_page,
    put_program_page, read_batch_ops, read_edge_page, read_optional_u64, read_program_page,
};
use crate::edge::{
    Direction, EdgeInfo, EdgeLabel, PathFound, WALK_FLAG_VALUES, WalkResult, put_edge_list,
    put_f64, put_label, put_label_filter, put_path, put_walk, read_count, read_direction,
    read_edge_list, read_f64, read_label, read_label_filter, read_path, read_walk,
};
use crate::error::{DecodeError, ErrorCode};
use crate::frame::{FrameHeader, HEADER_BYTES, Limits, Opcode, RESPONSE_BIT, encode_frame};
use crate::model::{Coord, NamespaceName};
use crate::namespace::{
    NamespaceInfo, NamespaceSpec, put_info, put_name_list, put_spec, read_info, read_name_list,
    read_spec,
};
use crate::program::{
    CellStats, MAX_PROGRAM_BYTES, RunReply, StepReply, put_args, put_cell_stats, put_run_reply,
    put_step_reply, read_args, read_cell_stats, read_run_reply, read_step_reply,
};
use crate::watch::{
    WatchFrame, put_watch_frame, put_watch_request, read_watch_frame, read_watch_request,
};
use crate::wire::{
    BodyReader, put_blob, put_coord, put_namespace, put_optional_coord, put_short_string, put_u16,
    put_u32, put_u64,
};

/// Longest client name, server version or stats name accepted.
const MAX_NAME_BYTES: usize = 256;
/// Longest error message or stats text accepted.
const MAX_MESSAGE_BYTES: usize = 4096;
/// Longest path accepted (Linux PATH_MAX).
const MAX_PATH_BYTES: usize = 4096;
/// Most entries in one stats response.
pub const MAX_STATS_ENTRIES: usize = 4096;
/// Most cells in one scan page. A request may ask for more; the server
/// answers at most this many (and fewer when the page would outgrow a
/// frame), so a huge box never becomes one giant response.
pub const MAX_SCAN_PAGE_CELLS: u32 = 65_536;
/// Most coordinates in one `mget` request (and values in its answer). The
/// server reads them all under one hold of the namespace's read lock, so
/// the batch is bounded; `Client::mget` splits longer lists.
pub const MAX_MGET_CELLS: u32 = 4096;

/// Bit 0 of a scan request's flags: count the cells, send no values.
const SCAN_FLAG_COUNT_ONLY: u8 = 1;
/// Bit 1: also answer the LSN the page's state is at least at.
const SCAN_FLAG_WITH_LSN: u8 = 2;
/// Set in a scan response's `kind` when a `u64` LSN follows the kind byte.
const SCAN_KIND_WITH_LSN: u8 = 0x80;
/// A scan response's `kind`: a count, or cells with their values.
const SCAN_KIND_COUNT: u8 = 0;
const SCAN_KIND_CELLS: u8 = 1;
/// The smallest encoded scan cell: a coordinate and an empty blob.
const MIN_SCAN_CELL_BYTES: usize = 12 + 4;
/// An encoded coordinate.
const COORD_BYTES: usize = 12;
/// The smallest encoded `mget` answer cell: the presence byte of a missing one.
const MIN_MGET_CELL_BYTES: usize = 1;

const STATUS_OK: u8 = 0;
const STATUS_ERROR: u8 = 1;

#[derive(Clone, Debug, PartialEq)]
pub enum Request {
    Hello {
        client_version: u16,
        client_name: String,
    },
    Ping,
    Stats,
    /// Close the current WAL segment and fold the closed ones into a
    /// checkpoint delta; with `compact`, merge base + deltas afterwards.
    /// Answered when done, with a report.
    Checkpoint {
        compact: bool,
    },
    /// Copy a consistent, self-contained data dir to `dest` (a path on the
    /// daemon's machine, which must not exist yet). Answered with a report.
    Backup {
        dest: String,
    },
    Put {
        ns: NamespaceName,
        coord: Coord,
        value: Vec<u8>,
    },
    Get {
        ns: NamespaceName,
        coord: Coord,
    },
    /// The values at many coordinates of one namespace, read from one
    /// state of the store, in request order (duplicates allowed). 1 to
    /// [`MAX_MGET_CELLS`] coordinates; the decoder refuses other counts.
    Mget {
        ns: NamespaceName,
        coords: Vec<Coord>,
    },
    Del {
        ns: NamespaceName,
        coord: Coord,
    },
    /// The cells inside the box `lo..=hi`, in the namespace's curve order,
    /// one page at a time.
    Scan {
        ns: NamespaceName,
        lo: Coord,
        hi: Coord,
        /// Cells wanted in this page (the server caps it at
        /// [`MAX_SCAN_PAGE_CELLS`]); must be at least 1.
        limit: u32,
        /// Count the cells instead of returning them.
        count_only: bool,
        /// Resume strictly after this position (the previous page's
        /// `resume_after`); `None` starts at the beginning of the box.
        after: Option<Coord>,
        /// Also answer the LSN the page reflects (every change up to it,
        /// maybe later ones): the start of an exact `watch --from`.
        with_lsn: bool,
    },
    /// Create the edge `from -> to` with `label`, or set its weight if it
    /// exists. The server refuses a weight that is NaN, infinite or
    /// negative (`bad_weight`).
    Link {
        ns: NamespaceName,
        from: Coord,
        to: Coord,
        label: EdgeLabel,
        weight: f64,
    },
    /// Remove the edge `from -> to` with `label`, if there is one.
    Unlink {
        ns: NamespaceName,
        from: Coord,
        to: Coord,
        label: EdgeLabel,
    },
    /// The edges of `coord` in `direction`, optionally only one label's.
    Edges {
        ns: NamespaceName,
        coord: Coord,
        direction: Direction,
        label: Option<EdgeLabel>,
    },
    /// Breadth-first from `from`: every coordinate reached within
    /// `max_depth` hops, once, with its distance.
    Walk {
        ns: NamespaceName,
        from: Coord,
        direction: Direction,
        label: Option<EdgeLabel>,
        /// Most hops; 0 means the server's maximum.
        max_depth: u32,
        /// Most coordinates returned; 0 means the server's maximum.
        max_nodes: u32,
        /// Also return each reached cell's value.
        with_values: bool,
    },
    /// The cheapest path `from -> ... -> to` along outgoing edges, by
    /// total weight.
    Path {
        ns: NamespaceName,
        from: Coord,
        to: Coord,
        label: Option<EdgeLabel>,
        /// Paths costing more are not looked for; `+inf` means no bound.
        max_cost: f64,
    },
    /// Delete the value at `coord` and every edge into or out of it, in
    /// one atomic write.
    Detach {
        ns: NamespaceName,
        coord: Coord,
    },
    /// Create the namespace `ns` as `spec` asks, owned by the
    /// connection's uid. Answered with its description.
    NsCreate {
        ns: NamespaceName,
        spec: NamespaceSpec,
    },
    /// Drop `ns` and everything in it (durably); the name can be reused.
    NsDrop {
        ns: NamespaceName,
    },
    /// The names of the namespaces this connection may see, sorted.
    NsList,
    /// A namespace's settings, use and access list.
    NsInfo {
        ns: NamespaceName,
    },
    /// Give `uid` access to `ns` (read only or read-write), replacing any
    /// grant it had. Answered with the namespace's new description.
    NsGrant {
        ns: NamespaceName,
        uid: u32,
        read_only: bool,
    },
    /// Take `uid`'s grant on `ns` away. Answered with the namespace's new
    /// description.
    NsRevoke {
        ns: NamespaceName,
        uid: u32,
    },
    /// Store the program `source` (Lua 5.4, at most
    /// [`MAX_PROGRAM_BYTES`]) at a cell, replacing any program there; an
    /// empty source removes the cell's program. Compiled before it is
    /// stored: a syntax error is refused and nothing is stored.
    Prog {
        ns: NamespaceName,
        coord: Coord,
        source: Vec<u8>,
    },
    /// Run the program stored at a cell with `args` (at most
    /// [`MAX_RUN_ARGS`], each at most [`MAX_RUN_ARG_BYTES`]).
    Run {
        ns: NamespaceName,
        coord: Coord,
        args: Vec<Vec<u8>>,
    },
    /// A cell's program telemetry: counts and the `limit` most recent
    /// records (the server sends at most [`MAX_CELL_STATS_RECORDS`]).
    CellStats {
        ns: NamespaceName,
        coord: Coord,
        limit: u32,
    },
    /// Many writes of one namespace, applied atomically: every operation
    /// is checked first, then all commit in one WAL commit group, or none
    /// does. At most [`crate::MAX_BATCH_OPS`] operations and
    /// [`crate::MAX_BATCH_BYTES`] of them (`limit_exceeded` otherwise).
    Batch {
        ns: NamespaceName,
        ops: Vec<BatchOp>,
    },
    /// One page of every edge of a namespace: at most `limit` (capped at
    /// [`crate::MAX_EDGE_PAGE`]), resuming after the opaque cursor `after`.
    EdgeList {
        ns: NamespaceName,
        limit: u32,
        after: Option<u64>,
    },
    /// One page of every program of a namespace, in coordinate order: at
    /// most `limit` (capped at [`crate::MAX_PROGRAM_PAGE`]), strictly
    /// after `after`.
    ProgramList {
        ns: NamespaceName,
        limit: u32,
        after: Option<Coord>,
    },
    /// Runs every program stored in the box `lo..=hi` once, in the
    /// namespace's curve order, each with `args`. Every run reads the
    /// state from before the step; the writes of the runs that succeed,
    /// and every run's telemetry record, commit as one group.
    Step {
        ns: NamespaceName,
        lo: Coord,
        hi: Coord,
        args: Vec<Vec<u8>>,
    },
    /// Follows the changes inside the box `lo..=hi`: answered by a stream
    /// of [`Response::Watch`] frames until it ends. With `from`, history
    /// from that LSN comes first.
    Watch {
        ns: NamespaceName,
        lo: Coord,
        hi: Coord,
        from: Option<u64>,
    },
}

impl Request {
    pub fn opcode(&self) -> Opcode {
        match self {
            Request::Hello { .. } => Opcode::Hello,
            Request::Ping => Opcode::Ping,
            Request::Stats => Opcode::Stats,
            Request::Checkpoint { .. } => Opcode::Checkpoint,
            Request::Backup { .. } => Opcode::Backup,
            Request::Put { .. } => Opcode::Put,
            Request::Get { .. } => Opcode::Get,
            Request::Mget { .. } => Opcode::Mget,
            Request::Del { .. } => Opcode::Del,
            Request::Scan { .. } => Opcode::Scan,
            Request::Link { .. } => Opcode::Link,
            Request::Unlink { .. } => Opcode::Unlink,
            Request::Edges { .. } => Opcode::Edges,
            Request::Walk { .. } => Opcode::Walk,
            Request::Path { .. } => Opcode::Path,
            Request::Detach { .. } => Opcode::Detach,
            Request::NsCreate { .. } => Opcode::NsCreate,
            Request::NsDrop { .. } => Opcode::NsDrop,
            Request::NsList => Opcode::NsList,
            Request::NsInfo { .. } => Opcode::NsInfo,
            Request::NsGrant { .. } => Opcode::NsGrant,
            Request::NsRevoke { .. } => Opcode::NsRevoke,
            Request::Prog { .. } => Opcode::Prog,
            Request::Run { .. } => Opcode::Run,
            Request::CellStats { .. } => Opcode::CellStats,
            Request::Batch { .. } => Opcode::Batch,
            Request::EdgeList { .. } => Opcode::EdgeList,
            Request::ProgramList { .. } => Opcode::ProgramList,
            Request::Step { .. } => Opcode::Step,
            Request::Watch { .. } => Opcode::Watch,
        }
    }

    /// Appends the whole frame for this request to `out`.
    pub fn encode(&self, request_id: u64, out: &mut Vec<u8>) {
        encode_frame(out, self.opcode() as u16, request_id, |b| match self {
            Request::Hello {
                client_version,
                client_name,
            } => {
                put_u16(b, *client_version);
                put_short_string(b, client_name, MAX_NAME_BYTES);
            }
            Request::Ping | Request::Stats => {}
            Request::Checkpoint { compact } => b.push(u8::from(*compact)),
            Request::Backup { dest } => put_short_string(b, dest, MAX_PATH_BYTES),
            Request::Put { ns, coord, value } => {
                put_namespace(b, ns);
                put_coord(b, *coord);
                put_blob(b, value);
            }
            Request::Get { ns, coord }
            | Request::Del { ns, coord }
            | Request::Detach { ns, coord } => {
                put_namespace(b, ns);
                put_coord(b, *coord);
            }
            Request::Mget { ns, coords } => {
                put_namespace(b, ns);
                put_u32(b, coords.len() as u32);
                for coord in coords {
                    put_coord(b, *coord);
                }
            }
            Request::Scan {
                ns,
                lo,
                hi,
                limit,
                count_only,
                after,
                with_lsn,
            } => {
                put_namespace(b, ns);
                put_coord(b, *lo);
                put_coord(b, *hi);
                put_u32(b, *limit);
                let mut flags = if *count_only { SCAN_FLAG_COUNT_ONLY } else { 0 };
                if *with_lsn {
                    flags |= SCAN_FLAG_WITH_LSN;
                }
                b.push(flags);
                put_optional_coord(b, *after);
            }
            Request::Link {
                ns,
                from,
                to,
                label,
                weight,
            } => {
                put_namespace(b, ns);
                put_coord(b, *from);
                put_coord(b, *to);
                put_label(b, label);
                put_f64(b, *weight);
            }
            Request::Unlink {
                ns,
                from,
                to,
                label,
            } => {
                put_namespace(b, ns);
                put_coord(b, *from);
                put_coord(b, *to);
                put_label(b, label);
            }
            Request::Edges {
                ns,
                coord,
                direction,
                label,
            } => {
                put_namespace(b, ns);
                put_coord(b, *coord);
                b.push(*direction as u8);
                put_label_filter(b, label);
            }
            Request::Walk {
                ns,
                from,
                direction,
                label,
                max_depth,
                max_nodes,
                with_values,
            } => {
                put_namespace(b, ns);
                put_coord(b, *from);
                b.push(*direction as u8);
                put_label_filter(b, label);
                put_u32(b, *max_depth);
                put_u32(b, *max_nodes);
                b.push(if *with_values { WALK_FLAG_VALUES } else { 0 });
            }
            Request::Path {
                ns,
                from,
                to,
                label,
                max_cost,
            } => {
                put_namespace(b, ns);
                put_coord(b, *from);
                put_coord(b, *to);
                put_label_filter(b, label);
                put_f64(b, *max_cost);
            }
            Request::NsCreate { ns, spec } => {
                put_namespace(b, ns);
                put_spec(b, spec);
            }
            Request::NsDrop { ns } | Request::NsInfo { ns } => put_namespace(b, ns),
            Request::NsList => {}
            Request::NsGrant { ns, uid, read_only } => {
                put_namespace(b, ns);
                put_u32(b, *uid);
                b.push(u8::from(*read_only));
            }
            Request::NsRevoke { ns, uid } => {
                put_namespace(b, ns);
                put_u32(b, *uid);
            }
            Request::Prog { ns, coord, source } => {
                put_namespace(b, ns);
                put_coord(b, *coord);
                put_blob(b, source);
            }
            Request::Run { ns, coord, args } => {
                put_namespace(b, ns);
                put_coord(b, *coord);
                put_args(b, args);
            }
            Request::CellStats { ns, coord, limit } => {
                put_namespace(b, ns);
                put_coord(b, *coord);
                put_u32(b, *limit);
            }
            Request::Batch { ns, ops } => {
                put_namespace(b, ns);
                put_batch_ops(b, ops);
            }
            Request::EdgeList { ns, limit, after } => {
                put_namespace(b, ns);
                put_edge_list_request(b, *limit, *after);
            }
            Request::ProgramList { ns, limit, after } => {
                put_namespace(b, ns);
                put_u32(b, *limit);
                put_optional_coord(b, *after);
            }
            Request::Step { ns, lo, hi, args } => {
                put_namespace(b, ns);
                put_coord(b, *lo);
                put_coord(b, *hi);
                put_args(b, args);
            }
            Request::Watch { ns, lo, hi, from } => put_watch_request(b, ns, *lo, *hi, *from),
        });
    }

    /// Decodes a verified frame body. Never panics; allocates at most the
    /// body's length.
    pub fn decode(
        header: &FrameHeader,
        body: &[u8],
        limits: &Limits,
    ) -> Result<Request, DecodeError> {
        let opcode =
            Opcode::from_u16(header.opcode).ok_or(DecodeError::UnknownOpcode(header.opcode))?;
        let mut r = BodyReader::new(body);
        let request = match opcode {
            Opcode::Hello => Request::Hello {
                client_version: r.u16()?,
                client_name: r.short_string("client name", MAX_NAME_BYTES)?,
            },
            Opcode::Ping => Request::Ping,
            Opcode::Stats => Request::Stats,
            Opcode::Checkpoint => Request::Checkpoint { compact: r.bool()? },
            Opcode::Backup => Request::Backup {
                dest: r.short_string("backup path", MAX_PATH_BYTES)?,
            },
            Opcode::Put => Request::Put {
                ns: r.namespace()?,
                coord: r.coord()?,
                value: r.blob("value", limits.max_value_bytes as usize)?,
            },
            Opcode::Get => Request::Get {
                ns: r.namespace()?,
                coord: r.coord()?,
            },
            Opcode::Del => Request::Del {
                ns: r.namespace()?,
                coord: r.coord()?,
            },
            Opcode::Mget => {
                let ns = r.namespace()?;
                let count = read_count(&mut r, "mget cell count", MAX_MGET_CELLS, COORD_BYTES)?;
                if count == 0 {
                    return Err(DecodeError::BadField {
                        what: "mget cell count (must be 1 to 4096)",
                        got: 0,
                    });
                }
                let mut coords = Vec::with_capacity(count);
                for _ in 0..count {
                    coords.push(r.coord()?);
                }
                Request::Mget { ns, coords }
            }
            Opcode::Scan => {
                let ns = r.namespace()?;
                let lo = r.coord()?;
                let hi = r.coord()?;
                let limit = r.u32()?;
                let flags = r.flags(SCAN_FLAG_COUNT_ONLY | SCAN_FLAG_WITH_LSN, "scan flags")?;
                Request::Scan {
                    ns,
                    lo,
                    hi,
                    limit,
                    count_only: flags & SCAN_FLAG_COUNT_ONLY != 0,
                    after: r.optional_coord()?,
                    with_lsn: flags & SCAN_FLAG_WITH_LSN != 0,
                }
            }
            Opcode::Link => Request::Link {
                ns: r.namespace()?,
                from: r.coord()?,
                to: r.coord()?,
                label: read_label(&mut r)?,
                weight: read_f64(&mut r)?,
            },
            Opcode::Unlink => Request::Unlink {
                ns: r.namespace()?,
                from: r.coord()?,
                to: r.coord()?,
                label: read_label(&mut r)?,
            },
            Opcode::Edges => Request::Edges {
                ns: r.namespace()?,
                coord: r.coord()?,
                direction: read_direction(&mut r)?,
                label: read_label_filter(&mut r)?,
            },
            Opcode::Walk => {
                let ns = r.namespace()?;
                let from = r.coord()?;
                let direction = read_direction(&mut r)?;
                let label = read_label_filter(&mut r)?;
                let max_depth = r.u32()?;
                let max_nodes = r.u32()?;
                let flags = r.flags(WALK_FLAG_VALUES, "walk flags")?;
                Request::Walk {
                    ns,
                    from,
                    direction,
                    label,
                    max_depth,
                    max_nodes,
                    with_values: flags & WALK_FLAG_VALUES != 0,
                }
            }
            Opcode::Path => Request::Path {
                ns: r.namespace()?,
                from: r.coord()?,
                to: r.coord()?,
                label: read_label_filter(&mut r)?,
                max_cost: read_f64(&mut r)?,
            },
            Opcode::Detach => Request::Detach {
                ns: r.namespace()?,
                coord: r.coord()?,
            },
            Opcode::NsCreate => Request::NsCreate {
                ns: r.namespace()?,
                spec: read_spec(&mut r)?,
            },
            Opcode::NsDrop => Request::NsDrop { ns: r.namespace()? },
            Opcode::NsList => Request::NsList,
            Opcode::NsInfo => Request::NsInfo { ns: r.namespace()? },
            Opcode::NsGrant => Request::NsGrant {
                ns: r.namespace()?,
                uid: r.u32()?,
                read_only: r.bool()?,
            },
            Opcode::NsRevoke => Request::NsRevoke {
                ns: r.namespace()?,
                uid: r.u32()?,
            },
            Opcode::Prog => Request::Prog {
                ns: r.namespace()?,
                coord: r.coord()?,
                source: r.blob("program source", MAX_PROGRAM_BYTES)?,
            },
            Opcode::Run => Request::Run {
                ns: r.namespace()?,
                coord: r.coord()?,
                args: read_args(&mut r)?,
            },
            Opcode::CellStats => Request::CellStats {
                ns: r.namespace()?,
                coord: r.coord()?,
                limit: r.u32()?,
            },
            Opcode::Batch => Request::Batch {
                ns: r.namespace()?,
                ops: read_batch_ops(&mut r, limits.max_value_bytes as usize)?,
            },
            Opcode::EdgeList => Request::EdgeList {
                ns: r.namespace()?,
                limit: r.u32()?,
                after: read_optional_u64(&mut r)?,
            },
            Opcode::ProgramList => Request::ProgramList {
                ns: r.namespace()?,
                limit: r.u32()?,
                after: r.optional_coord()?,
            },
            Opcode::Step => Request::Step {
                ns: r.namespace()?,
                lo: r.coord()?,
                hi: r.coord()?,
                args: read_args(&mut r)?,
            },
            Opcode::Watch => {
                let (ns, lo, hi, from) = read_watch_request(&mut r)?;
                Request::Watch { ns, lo, hi, from }
            }
        };
        r.finish()?;
        Ok(request)
    }
}

/// One named figure in a stats response.
#[derive(Clone, Debug, PartialEq)]
pub enum StatsValue {
    Count(u64),
    Float(f64),
    Text(String),
}

#[derive(Clone, Debug, PartialEq)]
pub struct StatsEntry {
    pub name: String,
    pub value: StatsValue,
}

/// One cell of a scan page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScanCell {
    pub coord: Coord,
    pub value: Vec<u8>,
}

/// What a scan page carries: a count, or the cells themselves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScanResult {
    /// Cells counted in this page (a `count_only` request).
    Count(u64),
    /// Cells in curve order, with their values.
    Cells(Vec<ScanCell>),
}

#[derive(Clone, Debug, PartialEq)]
pub enum Response {
    Hello {
        protocol_version: u16,
        server_version: String,
        max_frame_bytes: u32,
        max_value_bytes: u32,
    },
    Pong,
    Stats(Vec<StatsEntry>),
    /// What a checkpoint did, as named figures (encoded like stats).
    Checkpoint(Vec<StatsEntry>),
    /// What a backup copied, as named figures (encoded like stats).
    Backup(Vec<StatsEntry>),
    /// The write is durable (or, under a relaxed sync mode, logged) at `lsn`.
    Put {
        lsn: u64,
    },
    Get(Option<Vec<u8>>),
    /// One entry per requested coordinate, in request order: the value, or
    /// `None` when the cell is empty.
    Mget(Vec<Option<Vec<u8>>>),
    Del {
        lsn: u64,
        existed: bool,
    },
    /// One page of a region read.
    Scan {
        result: ScanResult,
        /// `None`: the box is finished. Otherwise ask again with this as
        /// `after`. A page may be short (even empty) and still have a next.
        resume_after: Option<Coord>,
        /// With `with_lsn` asked: every change up to this LSN is in the
        /// page (later ones may be too).
        lsn: Option<u64>,
    },
    /// The edge is durable at `lsn`; `created` is false when it existed
    /// and only its weight was set.
    Link {
        lsn: u64,
        created: bool,
    },
    Unlink {
        lsn: u64,
        existed: bool,
    },
    /// The edges asked for, outgoing first.
    Edges(Vec<EdgeInfo>),
    Walk(WalkResult),
    /// `path` is `None` when no path within `max_cost` exists.
    Path {
        edges_examined: u64,
        path: Option<PathFound>,
    },
    /// The value (if `existed`) and `edges_removed` edges are gone, all at `lsn`.
    Detach {
        lsn: u64,
        existed: bool,
        edges_removed: u32,
    },
    /// The namespace `ns-create` made. Each namespace answer is its own
    /// variant because a response's opcode is its request's: the same
    /// description answers `ns-create`, `ns-info`, `ns-grant` and
    /// `ns-revoke`.
    NsCreated(NamespaceInfo),
    /// The answer to `ns-info`.
    NsInfo(NamespaceInfo),
    /// The namespace after `ns-grant`.
    NsGranted(NamespaceInfo),
    /// The namespace after `ns-revoke`.
    NsRevoked(NamespaceInfo),
    /// The drop is durable at `lsn`; `cells` values went with it.
    NsDropped {
        lsn: u64,
        cells: u64,
    },
    /// The namespaces the connection may see, sorted by name.
    NsList(Vec<NamespaceName>),
    /// The program (or its removal) is durable at `lsn`; `replaced` says
    /// whether the cell had a program before.
    Prog {
        lsn: u64,
        replaced: bool,
    },
    /// A run that succeeded, with what it returned.
    Run(RunReply),
    CellStats(CellStats),
    /// Every operation of the batch is durable; `lsn` is the first of its
    /// `applied` consecutive log records (0 for an empty batch).
    Batch {
        lsn: u64,
        applied: u32,
    },
    EdgeList(EdgePage),
    ProgramList(ProgramPage),
    /// Every program in the box ran; what succeeded is durable.
    Step(StepReply),
    /// One frame of a watch stream.
    Watch(WatchFrame),
}

/// Named figures (stats and reports): a `u16` count, then per entry a
/// `str16` name, a tag byte and the value (0: `u64`, 1: `f64` bits, 2: `str16`).
fn put_entries(b: &mut Vec<u8>, entries: &[StatsEntry]) {
    let entries = &entries[..entries.len().min(MAX_STATS_ENTRIES)];
    put_u16(b, entries.len() as u16);
    for entry in entries {
        put_short_string(b, &entry.name, MAX_NAME_BYTES);
        match &entry.value {
            StatsValue::Count(v) => {
                b.push(0);
                put_u64(b, *v);
            }
            StatsValue::Float(v) => {
                b.push(1);
                put_u64(b, v.to_bits());
            }
            StatsValue::Text(t) => {
                b.push(2);
                put_short_string(b, t, MAX_MESSAGE_BYTES);
            }
        }
    }
}

fn read_entries(r: &mut BodyReader<'_>) -> Result<Vec<StatsEntry>, DecodeError> {
    let count = usize::from(r.u16()?);
    if count > MAX_STATS_ENTRIES {
        return Err(DecodeError::TooMany {
            what: "stats entry count",
            got: count as u64,
            limit: MAX_STATS_ENTRIES as u64,
        });
    }
    // Each entry is at least 3 bytes; never reserve more than the body
    // could hold.
    let mut entries = Vec::with_capacity(count.min(r.remaining() / 3));
    for _ in 0..count {
        let name = r.short_string("stats name", MAX_NAME_BYTES)?;
        let value = match r.u8()? {
            0 => StatsValue::Count(r.u64()?),
            1 => StatsValue::Float(f64::from_bits(r.u64()?)),
            2 => StatsValue::Text(r.short_string("stats text", MAX_MESSAGE_BYTES)?),
            other => {
                return Err(DecodeError::BadField {
                    what: "stats value tag",
                    got: u64::from(other),
                });
            }
        };
        entries.push(StatsEntry { name, value });
    }
    Ok(entries)
}

/// An error response: a stable code and a human message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerError {
    /// The raw code, kept even when this build does not know it.
    pub code: u16,
    pub message: String,
}

impl ServerError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ServerError {
        ServerError {
            code: code as u16,
            message: message.into(),
        }
    }

    pub fn known_code(&self) -> Option<ErrorCode> {
        ErrorCode::from_u16(self.code)
    }
}

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = self.known_code().map_or("unknown_error", ErrorCode::name);
        write!(f, "{} ({name}, code {})", self.message, self.code)
    }
}

impl std::error::Error for ServerError {}

impl Response {
    pub fn opcode(&self) -> Opcode {
        match self {
            Response::Hello { .. } => Opcode::Hello,
            Response::Pong => Opcode::Ping,
            Response::Stats(_) => Opcode::Stats,
            Response::Checkpoint(_) => Opcode::Checkpoint,
            Response::Backup(_) => Opcode::Backup,
            Response::Put { .. } => Opcode::Put,
            Response::Get(_) => Opcode::Get,
            Response::Mget(_) => Opcode::Mget,
            Response::Del { .. } => Opcode::Del,
            Response::Scan { .. } => Opcode::Scan,
            Response::Link { .. } => Opcode::Link,
            Response::Unlink { .. } => Opcode::Unlink,
            Response::Edges(_) => Opcode::Edges,
            Response::Walk(_) => Opcode::Walk,
            Response::Path { .. } => Opcode::Path,
            Response::Detach { .. } => Opcode::Detach,
            Response::NsCreated(_) => Opcode::NsCreate,
            Response::NsInfo(_) => Opcode::NsInfo,
            Response::NsGranted(_) => Opcode::NsGrant,
            Response::NsRevoked(_) => Opcode::NsRevoke,
            Response::NsDropped { .. } => Opcode::NsDrop,
            Response::NsList(_) => Opcode::NsList,
            Response::Prog { .. } => Opcode::Prog,
            Response::Run(_) => Opcode::Run,
            Response::CellStats(_) => Opcode::CellStats,
            Response::Batch { .. } => Opcode::Batch,
            Response::EdgeList(_) => Opcode::EdgeList,
            Response::ProgramList(_) => Opcode::ProgramList,
            Response::Step(_) => Opcode::Step,
            Response::Watch(_) => Opcode::Watch,
        }
    }

    /// Appends a success frame answering `request_id`.
    pub fn encode(&self, request_id: u64, out: &mut Vec<u8>) {
        encode_frame(out, self.opcode() as u16 | RESPONSE_BIT, request_id, |b| {
            b.push(STATUS_OK);
            match self {
                Response::Hello {
                    protocol_version,
                    server_version,
                    max_frame_bytes,
                    max_value_bytes,
                } => {
                    put_u16(b, *protocol_version);
                    put_short_string(b, server_version, MAX_NAME_BYTES);
                    put_u32(b, *max_frame_bytes);
                    put_u32(b, *max_value_bytes);
                }
                Response::Pong => {}
                Response::Stats(entries)
                | Response::Checkpoint(entries)
                | Response::Backup(entries) => put_entries(b, entries),
                Response::Put { lsn } => put_u64(b, *lsn),
                Response::Get(value) => match value {
                    None => b.push(0),
                    Some(v) => {
                        b.push(1);
                        put_blob(b, v);
                    }
                },
                Response::Mget(values) => {
                    put_u32(b, values.len() as u32);
                    for value in values {
                        put_mget_cell(b, value.as_deref());
                    }
                }
                Response::Del { lsn, existed }
                | Response::Unlink { lsn, existed }
                | Response::Link {
                    lsn,
                    created: existed,
                } => {
                    put_u64(b, *lsn);
                    b.push(u8::from(*existed));
                }
                Response::Edges(edges) => put_edge_list(b, edges),
                Response::Walk(walk) => put_walk(b, walk),
                Response::Path {
                    edges_examined,
                    path,
                } => put_path(b, *edges_examined, path),
                Response::Detach {
                    lsn,
                    existed,
                    edges_removed,
                } => {
                    put_u64(b, *lsn);
                    b.push(u8::from(*existed));
                    put_u32(b, *edges_removed);
                }
                Response::NsCreated(info)
                | Response::NsInfo(info)
                | Response::NsGranted(info)
                | Response::NsRevoked(info) => put_info(b, info),
                Response::NsDropped { lsn, cells } => {
                    put_u64(b, *lsn);
                    put_u64(b, *cells);
                }
                Response::NsList(names) => put_name_list(b, names),
                Response::Prog { lsn, replaced } => {
                    put_u64(b, *lsn);
                    b.push(u8::from(*replaced));
                }
                Response::Run(reply) => put_run_reply(b, reply),
                Response::CellStats(stats) => put_cell_stats(b, stats),
                Response::Batch { lsn, applied } => {
                    put_u64(b, *lsn);
                    put_u32(b, *applied);
                }
                Response::EdgeList(page) => put_edge_page(b, page),
                Response::ProgramList(page) => put_program_page(b, page),
                Response::Step(reply) => put_step_reply(b, reply),
                Response::Watch(frame) => put_watch_frame(b, frame),
                Response::Scan {
                    result,
                    resume_after,
                    lsn,
                } => {
                    let kind = match result {
                        ScanResult::Count(_) => SCAN_KIND_COUNT,
                        ScanResult::Cells(_) => SCAN_KIND_CELLS,
                    };
                    match lsn {
                        None => b.push(kind),
                        Some(lsn) => {
                            b.push(kind | SCAN_KIND_WITH_LSN);
                            put_u64(b, *lsn);
                        }
                    }
                    match result {
                        ScanResult::Count(count) => {
                            put_u64(b, *count);
                        }
                        ScanResult::Cells(cells) => {
                            put_u32(b, cells.len() as u32);
                            for cell in cells {
                                put_coord(b, cell.coord);
                                put_blob(b, &cell.value);
                            }
                        }
                    }
                    put_optional_coord(b, *resume_after);
                }
            }
        });
    }

    /// Appends an error frame. `opcode` is the raw request opcode (0 when
    /// the request could not be read at all).
    pub fn encode_error(opcode: u16, request_id: u64, error: &ServerError, out: &mut Vec<u8>) {
        encode_frame(
            out,
            (opcode & !RESPONSE_BIT) | RESPONSE_BIT,
            request_id,
            |b| {
                b.push(STATUS_ERROR);
                put_u16(b, error.code);
                put_short_string(b, &error.message, MAX_MESSAGE_BYTES);
            },
        );
    }

    /// Decodes a verified response body: the outer `Result` is about bytes,
    /// the inner one is what the server said.
    pub fn decode(
        header: &FrameHeader,
        body: &[u8],
        limits: &Limits,
    ) -> Result<Result<Response, ServerError>, DecodeError> {
        let mut r = BodyReader::new(body);
        let status = r.u8()?;
        if status == STATUS_ERROR {
            let code = r.u16()?;
            let message = r.short_string("error message", MAX_MESSAGE_BYTES)?;
            r.finish()?;
            return Ok(Err(ServerError { code, message }));
        }
        if status != STATUS_OK {
            return Err(DecodeError::BadField {
                what: "response status",
                got: u64::from(status),
            });
        }
        let raw = header.opcode & !RESPONSE_BIT;
        if header.opcode & RESPONSE_BIT == 0 {
            return Err(DecodeError::BadField {
                what: "response opcode without the response bit",
                got: u64::from(header.opcode),
            });
        }
        let opcode = Opcode::from_u16(raw).ok_or(DecodeError::UnknownOpcode(raw))?;
        let response = match opcode {
            Opcode::Hello => Response::Hello {
                protocol_version: r.u16()?,
                server_version: r.short_string("server version", MAX_NAME_BYTES)?,
                max_frame_bytes: r.u32()?,
                max_value_bytes: r.u32()?,
            },
            Opcode::Ping => Response::Pong,
            Opcode::Stats => Response::Stats(read_entries(&mut r)?),
            Opcode::Checkpoint => Response::Checkpoint(read_entries(&mut r)?),
            Opcode::Backup => Response::Backup(read_entries(&mut r)?),
            Opcode::Put => Response::Put { lsn: r.u64()? },
            Opcode::Get => {
                if r.bool()? {
                    Response::Get(Some(r.blob("value", limits.max_value_bytes as usize)?))
                } else {
                    Response::Get(None)
                }
            }
            Opcode::Del => Response::Del {
                lsn: r.u64()?,
                existed: r.bool()?,
            },
            Opcode::Mget => {
                let count = read_count(
                    &mut r,
                    "mget answer cell count",
                    MAX_MGET_CELLS,
                    MIN_MGET_CELL_BYTES,
                )?;
                let mut values = Vec::with_capacity(count);
                for _ in 0..count {
                    values.push(if r.bool()? {
                        Some(r.blob("value", limits.max_value_bytes as usize)?)
                    } else {
                        None
                    });
                }
                Response::Mget(values)
            }
            Opcode::Scan => {
                let kind = r.u8()?;
                let lsn = if kind & SCAN_KIND_WITH_LSN != 0 {
                    Some(r.u64()?)
                } else {
                    None
                };
                let result = match kind & !SCAN_KIND_WITH_LSN {
                    SCAN_KIND_COUNT => ScanResult::Count(r.u64()?),
                    SCAN_KIND_CELLS => {
                        let count = read_count(
                            &mut r,
                            "scan page cell count",
                            MAX_SCAN_PAGE_CELLS,
                            MIN_SCAN_CELL_BYTES,
                        )?;
                        let mut cells = Vec::with_capacity(count);
                        for _ in 0..count {
                            cells.push(ScanCell {
                                coord: r.coord()?,
                                value: r.blob("value", limits.max_value_bytes as usize)?,
                            });
                        }
                        ScanResult::Cells(cells)
                    }
                    other => {
                        return Err(DecodeError::BadField {
                            what: "scan result kind",
                            got: u64::from(other),
                        });
                    }
                };
                Response::Scan {
                    result,
                    resume_after: r.optional_coord()?,
                    lsn,
                }
            }
            Opcode::Link => Response::Link {
                lsn: r.u64()?,
                created: r.bool()?,
            },
            Opcode::Unlink => Response::Unlink {
                lsn: r.u64()?,
                existed: r.bool()?,
            },
            Opcode::Edges => Response::Edges(read_edge_list(&mut r)?),
            Opcode::Walk => Response::Walk(read_walk(&mut r, limits.max_value_bytes as usize)?),
            Opcode::Path => {
                let (edges_examined, path) = read_path(&mut r)?;
                Response::Path {
                    edges_examined,
                    path,
                }
            }
            Opcode::Detach => Response::Detach {
                lsn: r.u64()?,
                existed: r.bool()?,
                edges_removed: r.u32()?,
            },
            Opcode::NsCreate => Response::NsCreated(read_info(&mut r)?),
            Opcode::NsInfo => Response::NsInfo(read_info(&mut r)?),
            Opcode::NsGrant => Response::NsGranted(read_info(&mut r)?),
            Opcode::NsRevoke => Response::NsRevoked(read_info(&mut r)?),
            Opcode::NsDrop => Response::NsDropped {
                lsn: r.u64()?,
                cells: r.u64()?,
            },
            Opcode::NsList => Response::NsList(read_name_list(&mut r)?),
            Opcode::Prog => Response::Prog {
                lsn: r.u64()?,
                replaced: r.bool()?,
            },
            Opcode::Run => Response::Run(read_run_reply(&mut r, limits.max_value_bytes as usize)?),
            Opcode::CellStats => Response::CellStats(read_cell_stats(&mut r)?),
            Opcode::Batch => Response::Batch {
                lsn: r.u64()?,
                applied: r.u32()?,
            },
            Opcode::EdgeList => Response::EdgeList(read_edge_page(&mut r)?),
            Opcode::ProgramList => Response::ProgramList(read_program_page(&mut r)?),
            Opcode::Step => Response::Step(read_step_reply(&mut r)?),
            Opcode::Watch => {
                Response::Watch(read_watch_frame(&mut r, limits.max_value_bytes as usize)?)
            }
        };
        r.finish()?;
        Ok(Ok(response))
    }
}

/// Builds a scan response frame with values cell by cell, straight from
/// the store, so a page of thousands of cells costs no per-cell allocation.
/// The bytes are exactly those of [`Response::encode`] for the same page.
pub struct ScanPageEncoder<'a> {
    out: &'a mut Vec<u8>,
    frame: CountedFrame,
    cells: u32,
}

impl<'a> ScanPageEncoder<'a> {
    /// Starts the frame answering `request_id` at the end of `out`.
    pub fn begin(out: &'a mut Vec<u8>, request_id: u64) -> ScanPageEncoder<'a> {
        ScanPageEncoder::begin_at(out, request_id, None)
    }

    /// [`Self::begin`], the page saying it is at `lsn` when given.
    pub fn begin_at(
        out: &'a mut Vec<u8>,
        request_id: u64,
        lsn: Option<u64>,
    ) -> ScanPageEncoder<'a> {
        let mut prefix = Vec::with_capacity(9);
        match lsn {
            None => prefix.push(SCAN_KIND_CELLS),
            Some(lsn) => {
                prefix.push(SCAN_KIND_CELLS | SCAN_KIND_WITH_LSN);
                put_u64(&mut prefix, lsn);
            }
        }
        let frame = CountedFrame::begin(out, request_id, &prefix);
        ScanPageEncoder {
            out,
            frame,
            cells: 0,
        }
    }

    /// The frame's size if it were finished now (counting the largest
    /// cursor [`Self::finish`] can add).
    pub fn frame_bytes(&self) -> usize {
        self.out.len() - self.frame.start + 1 + 12
    }

    /// The bytes one more cell with a value of `value_len` bytes adds.
    pub fn cell_bytes(value_len: usize) -> usize {
        12 + 4 + value_len
    }

    pub fn cells(&self) -> u32 {
        self.cells
    }

    /// Appends one cell. Callers keep pages within [`MAX_SCAN_PAGE_CELLS`]
    /// and the frame limit (see [`Self::frame_bytes`]).
    pub fn push(&mut self, coord: Coord, value: &[u8]) {
        put_coord(self.out, coord);
        put_blob(self.out, value);
        self.cells += 1;
    }

    /// Writes the cursor, the cell count and the header.
    pub fn finish(self, resume_after: Option<Coord>) {
        put_optional_coord(self.out, resume_after);
        self.frame.seal(self.out, self.cells, Opcode::Scan);
    }
}

/// A successful response frame encoded in place at the end of a buffer
/// (by [`ScanPageEncoder`] and [`MgetEncoder`]), whose item count and
/// header are filled in once the items are known.
struct CountedFrame {
    /// Where the frame (its header) starts in the buffer.
    start: usize,
    /// Where its `u32` item count goes.
    count_at: usize,
    request_id: u64,
}

impl CountedFrame {
    /// Appends room for the header, the OK status, `prefix` (fields that
    /// come before the count) and room for the count.
    fn begin(out: &mut Vec<u8>, request_id: u64, prefix: &[u8]) -> CountedFrame {
        let start = out.len();
        out.extend_from_slice(&[0u8; HEADER_BYTES]);
        out.push(STATUS_OK);
        out.extend_from_slice(prefix);
        let count_at = out.len();
        put_u32(out, 0);
        CountedFrame {
            start,
            count_at,
            request_id,
        }
    }

    /// Writes the item count, then the header with the body's length and
    /// CRC.
    fn seal(&self, out: &mut [u8], count: u32, opcode: Opcode) {
        out[self.count_at..self.count_at + 4].copy_from_slice(&count.to_le_bytes());
        let body = &out[self.start + HEADER_BYTES..];
        let header = FrameHeader {
            body_len: body.len() as u32,
            body_crc32c: crc32c::crc32c(body),
            version: PROTOCOL_VERSION,
            opcode: opcode as u16 | RESPONSE_BIT,
            request_id: self.request_id,
        };
        out[self.start..self.start + HEADER_BYTES].copy_from_slice(&header.to_bytes());
    }
}

/// One cell of an `mget` answer: a presence byte, then the value as a blob
/// if it is 1.
fn put_mget_cell(out: &mut Vec<u8>, value: Option<&[u8]>) {
    match value {
        None => out.push(0),
        Some(v) => {
            out.push(1);
            put_blob(out, v);
        }
    }
}

/// Builds an `mget` answer frame value by value, straight from the store,
/// so each value is copied once (into the frame). The bytes are exactly
/// those of [`Response::encode`] for the same values.
pub struct MgetEncoder<'a> {
    out: &'a mut Vec<u8>,
    frame: CountedFrame,
    cells: u32,
}

impl<'a> MgetEncoder<'a> {
    /// Starts the frame answering `request_id` at the end of `out`.
    pub fn begin(out: &'a mut Vec<u8>, request_id: u64) -> MgetEncoder<'a> {
        let frame = CountedFrame::begin(out, request_id, &[]);
        MgetEncoder {
            out,
            frame,
            cells: 0,
        }
    }

    /// The frame's size so far (header included); it is the finished size.
    pub fn frame_bytes(&self) -> usize {
        self.out.len() - self.frame.start
    }

    /// The size of a frame holding no cell yet.
    pub const EMPTY_FRAME_BYTES: usize = HEADER_BYTES + 1 + 4;

    /// The bytes one more cell adds: a value of `value_len` bytes, or a
    /// missing one (`None`).
    pub fn cell_bytes(value_len: Option<usize>) -> usize {
        match value_len {
            None => 1,
            Some(len) => 1 + 4 + len,
        }
    }

    pub fn cells(&self) -> u32 {
        self.cells
    }

    /// Appends one cell. Callers keep answers within [`MAX_MGET_CELLS`]
    /// cells and the frame limit (see [`Self::cell_bytes`]).
    pub fn push(&mut self, value: Option<&[u8]>) {
        put_mget_cell(self.out, value);
        self.cells += 1;
    }

    /// Writes the cell count and the header.
    pub fn finish(self) {
        self.frame.seal(self.out, self.cells, Opcode::Mget);
    }

    /// Drops the partial frame, leaving `out` as it was before [`Self::begin`].
    pub fn abandon(self) {
        self.out.truncate(self.frame.start);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn split(frame: &[u8]) -> (FrameHeader, &[u8]) {
        let header = FrameHeader::parse(frame[..HEADER_BYTES].try_into().unwrap());
        header.verify_body(&frame[HEADER_BYTES..]).unwrap();
        (header, &frame[HEADER_BYTES..])
    }

    #[test]
    fn put_request_round_trips() {
        let req = Request::Put {
            ns: NamespaceName::new("default").unwrap(),
            coord: Coord::new(1, -2, 3),
            value: b"hello".to_vec(),
        };
        let mut out = Vec::new();
        req.encode(42, &mut out);
        let (header, body) = split(&out);
        assert_eq!(header.request_id, 42);
        assert_eq!(
            Request::decode(&header, body, &Limits::default()).unwrap(),
            req
        );
    }

    #[test]
    fn value_over_the_limit_is_value_too_large() {
        let req = Request::Put {
            ns: NamespaceName::new("default").unwrap(),
            coord: Coord::new(0, 0, 0),
            value: vec![7; 100],
        };
        let mut out = Vec::new();
        req.encode(1, &mut out);
        let (header, body) = split(&out);
        let limits = Limits {
            max_value_bytes: 99,
            ..Limits::default()
        };
        let err = Request::decode(&header, body, &limits).unwrap_err();
        assert_eq!(err.code(), ErrorCode::ValueTooLarge);
    }

    #[test]
    fn error_response_round_trips() {
        let mut out = Vec::new();
        let e = ServerError::new(ErrorCode::NoSuchNamespace, "no namespace \"x\"");
        Response::encode_error(Opcode::Get as u16, 9, &e, &mut out);
        let (header, body) = split(&out);
        assert_eq!(header.opcode, Opcode::Get as u16 | RESPONSE_BIT);
        assert_eq!(
            Response::decode(&header, body, &Limits::default()).unwrap(),
            Err(e)
        );
    }
}

#[cfg(test)]
mod scan_tests {
    use super::tests::split;
    use super::*;

    #[test]
    fn scan_request_round_trips_and_rejects_unknown_flags() {
        for after in [None, Some(Coord::new(i32::MIN, 0, i32::MAX))] {
            let req = Request::Scan {
                ns: NamespaceName::new("default").unwrap(),
                lo: Coord::new(-1, -2, -3),
                hi: Coord::new(4, 5, 6),
                limit: 1000,
                count_only: after.is_some(),
                after,
                with_lsn: after.is_none(),
            };
            let mut out = Vec::new();
            req.encode(3, &mut out);
            let (header, body) = split(&out);
            assert_eq!(
                Request::decode(&header, body, &Limits::default()).unwrap(),
                req
            );
        }
        let req = Request::Scan {
            ns: NamespaceName::new("default").unwrap(),
            lo: Coord::new(0, 0, 0),
            hi: Coord::new(0, 0, 0),
            limit: 1,
            count_only: false,
            after: None,
            with_lsn: false,
        };
        let mut out = Vec::new();
        req.encode(3, &mut out);
        let flags_at = out.len() - 2;
        out[flags_at] = 0x80;
        let body = out[HEADER_BYTES..].to_vec();
        let mut header = FrameHeader::parse(out[..HEADER_BYTES].try_into().unwrap());
        header.body_crc32c = crc32c::crc32c(&body);
        let err = Request::decode(&header, &body, &Limits::default()).unwrap_err();
        assert_eq!(err.code(), ErrorCode::MalformedFrame);
    }

    #[test]
    fn streamed_page_is_byte_identical_to_encode() {
        let cells = vec![
            ScanCell {
                coord: Coord::new(1, 2, 3),
                value: b"abc".to_vec(),
            },
            ScanCell {
                coord: Coord::new(-1, 0, 7),
                value: Vec::new(),
            },
        ];
        for (resume_after, lsn) in [(None, None), (Some(Coord::new(-1, 0, 7)), Some(42))] {
            let response = Response::Scan {
                result: ScanResult::Cells(cells.clone()),
                resume_after,
                lsn,
            };
            let mut expected = Vec::new();
            response.encode(77, &mut expected);
            let mut streamed = vec![9u8; 5];
            let mut encoder = ScanPageEncoder::begin_at(&mut streamed, 77, lsn);
            for cell in &cells {
                encoder.push(cell.coord, &cell.value);
            }
            let predicted = encoder.frame_bytes();
            encoder.finish(resume_after);
            assert_eq!(&streamed[5..], &expected[..]);
            assert!(predicted >= expected.len());
            let (header, body) = split(&expected);
            assert_eq!(
                Response::decode(&header, body, &Limits::default()).unwrap(),
                Ok(response)
            );
        }
    }

    #[test]
    fn oversized_or_lying_page_counts_are_refused_without_allocating() {
        let mut out = Vec::new();
        encode_frame(&mut out, Opcode::Scan as u16 | RESPONSE_BIT, 1, |b| {
            b.push(STATUS_OK);
            b.push(SCAN_KIND_CELLS);
            put_u32(b, MAX_SCAN_PAGE_CELLS + 1);
        });
        let (header, body) = split(&out);
        assert!(Response::decode(&header, body, &Limits::default()).is_err());
        let mut out = Vec::new();
        encode_frame(&mut out, Opcode::Scan as u16 | RESPONSE_BIT, 1, |b| {
            b.push(STATUS_OK);
            b.push(SCAN_KIND_CELLS);
            put_u32(b, MAX_SCAN_PAGE_CELLS);
            b.push(0);
        });
        let (header, body) = split(&out);
        assert!(matches!(
            Response::decode(&header, body, &Limits::default()),
            Err(DecodeError::Truncated { .. })
        ));
    }
}

#[cfg(test)]
mod mget_tests {
    use super::tests::split;
    use super::*;

    fn ns() -> NamespaceName {
        NamespaceName::new("default").unwrap()
    }

    /// A request frame with the namespace "default", `count` as the cell
    /// count and `coords` coordinates after it.
    fn raw_request(count: u32, coords: usize) -> (FrameHeader, Vec<u8>) {
        let mut out = Vec::new();
        encode_frame(&mut out, Opcode::Mget as u16, 5, |b| {
            put_namespace(b, &ns());
            put_u32(b, count);
            for i in 0..coords {
                put_coord(b, Coord::new(i as i32, -1, 2));
            }
        });
        let (header, body) = split(&out);
        (header, body.to_vec())
    }

    #[test]
    fn mget_request_round_trips_with_duplicates_and_the_largest_count() {
        let many: Vec<Coord> = (0..MAX_MGET_CELLS as i32)
            .map(|i| Coord::new(i, -i, i32::MIN + i))
            .collect();
        let dup = Coord::new(1, 2, 3);
        for coords in [vec![dup], vec![dup, Coord::new(-1, 0, 7), dup], many] {
            let req = Request::Mget { ns: ns(), coords };
            let mut out = Vec::new();
            req.encode(11, &mut out);
            let (header, body) = split(&out);
            assert_eq!(header.opcode, Opcode::Mget as u16);
            assert_eq!(
                Request::decode(&header, body, &Limits::default()).unwrap(),
                req
            );
        }
    }

    #[test]
    fn mget_counts_of_zero_or_over_the_limit_are_refused() {
        let (header, body) = raw_request(0, 0);
        let err = Request::decode(&header, &body, &Limits::default()).unwrap_err();
        assert_eq!(err.code(), ErrorCode::MalformedFrame);
        assert!(err.to_string().contains("mget cell count"), "{err}");
        assert!(err.to_string().contains("1 to 4096"), "{err}");

        let (header, body) = raw_request(MAX_MGET_CELLS + 1, MAX_MGET_CELLS as usize + 1);
        let err = Request::decode(&header, &body, &Limits::default()).unwrap_err();
        assert_eq!(
            err,
            DecodeError::TooMany {
                what: "mget cell count",
                got: u64::from(MAX_MGET_CELLS) + 1,
                limit: u64::from(MAX_MGET_CELLS),
            }
        );
        assert_eq!(err.code(), ErrorCode::MalformedFrame);

        // A huge claim in a tiny body is refused before anything is read.
        let (header, body) = raw_request(u32::MAX, 1);
        assert!(matches!(
            Request::decode(&header, &body, &Limits::default()),
            Err(DecodeError::TooMany { .. })
        ));
    }

    #[test]
    fn mget_request_with_fewer_coords_than_claimed_or_trailing_bytes_is_refused() {
        let (header, body) = raw_request(3, 2);
        assert!(matches!(
            Request::decode(&header, &body, &Limits::default()),
            Err(DecodeError::Truncated { .. })
        ));
        let (header, body) = raw_request(2, 3);
        assert!(matches!(
            Request::decode(&header, &body, &Limits::default()),
            Err(DecodeError::TrailingBytes { trailing: 12 })
        ));
        // A bad namespace is bad_namespace, as for get.
        let mut body = vec![3u8];
        body.extend_from_slice(b"A B");
        body.extend_from_slice(&1u32.to_le_bytes());
        body.extend_from_slice(&[0u8; 12]);
        let header = FrameHeader {
            body_len: body.len() as u32,
            body_crc32c: crc32c::crc32c(&body),
            version: PROTOCOL_VERSION,
            opcode: Opcode::Mget as u16,
            request_id: 1,
        };
        let err = Request::decode(&header, &body, &Limits::default()).unwrap_err();
        assert_eq!(err.code(), ErrorCode::BadNamespace);
    }

    #[test]
    fn mget_response_round_trips_and_streams_identically() {
        let values = vec![
            Some(b"abc".to_vec()),
            None,
            Some(Vec::new()),
            Some(vec![0xff, 0x00]),
            None,
        ];
        for values in [values, Vec::new()] {
            let response = Response::Mget(values.clone());
            let mut expected = Vec::new();
            response.encode(77, &mut expected);
            let (header, body) = split(&expected);
            assert_eq!(
                Response::decode(&header, body, &Limits::default()).unwrap(),
                Ok(response)
            );

            let mut streamed = vec![9u8; 3];
            let mut encoder = MgetEncoder::begin(&mut streamed, 77);
            assert_eq!(encoder.frame_bytes(), MgetEncoder::EMPTY_FRAME_BYTES);
            let mut predicted = MgetEncoder::EMPTY_FRAME_BYTES;
            for value in &values {
                predicted += MgetEncoder::cell_bytes(value.as_ref().map(Vec::len));
                encoder.push(value.as_deref());
                assert_eq!(encoder.frame_bytes(), predicted);
            }
            assert_eq!(encoder.cells() as usize, values.len());
            encoder.finish();
            assert_eq!(&streamed[3..], &expected[..]);
            assert_eq!(predicted, expected.len());
        }
        // An abandoned frame leaves nothing behind.
        let mut out = vec![1u8, 2];
        let mut encoder = MgetEncoder::begin(&mut out, 1);
        encoder.push(Some(b"x"));
        encoder.abandon();
        assert_eq!(out, vec![1, 2]);
    }

    #[test]
    fn mget_response_refuses_bad_counts_presence_bytes_and_big_values() {
        let frame = |write: &dyn Fn(&mut Vec<u8>)| {
            let mut out = Vec::new();
            encode_frame(&mut out, Opcode::Mget as u16 | RESPONSE_BIT, 1, |b| {
                b.push(STATUS_OK);
                write(b);
            });
            out
        };
        let decode = |out: &[u8], limits: &Limits| {
            let (header, body) = split(out);
            Response::decode(&header, body, limits)
        };
        let over = frame(&|b| put_u32(b, MAX_MGET_CELLS + 1));
        assert!(matches!(
            decode(&over, &Limits::default()),
            Err(DecodeError::TooMany { .. })
        ));
        // The most cells allowed, claimed in a tiny body.
        let lying = frame(&|b| {
            put_u32(b, MAX_MGET_CELLS);
            b.push(0);
        });
        assert!(matches!(
            decode(&lying, &Limits::default()),
            Err(DecodeError::Truncated { .. })
        ));
        let bad_presence = frame(&|b| {
            put_u32(b, 1);
            b.push(2);
        });
        assert!(matches!(
            decode(&bad_presence, &Limits::default()),
            Err(DecodeError::BadField { .. })
        ));
        let big = frame(&|b| {
            put_u32(b, 1);
            put_mget_cell(b, Some(&[7; 100]));
        });
        let limits = Limits {
            max_value_bytes: 99,
            ..Limits::default()
        };
        assert_eq!(
            decode(&big, &limits).unwrap_err().code(),
            ErrorCode::ValueTooLarge
        );
        assert!(decode(&big, &Limits::default()).is_ok());
    }
}
