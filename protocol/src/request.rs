//! Requests: what a client asks, and their body encodings.
//!
//! The codec is split by command family (the session, cells, graph,
//! namespaces, programs, bulk), one encoder and one decoder each, so each
//! family reads on one screen; `docs/protocol.md` gives every byte.

use crate::bulk::{
    BatchOp, put_batch_ops, put_edge_list_request, read_batch_ops, read_optional_u64,
};
use crate::edge::{
    Direction, EdgeLabel, WALK_FLAG_VALUES, put_f64, put_label, put_label_filter, read_count,
    read_direction, read_f64, read_label, read_label_filter,
};
use crate::error::DecodeError;
use crate::frame::{Family, FrameHeader, Limits, Opcode, encode_frame};
use crate::model::{Coord, NamespaceName};
use crate::namespace::{NamespaceSpec, put_spec, read_spec};
use crate::program::{MAX_PROGRAM_BYTES, put_args, read_args};
use crate::watch::{put_watch_request, read_watch_request};
use crate::wire::{
    BodyReader, MAX_NAME_BYTES, put_blob, put_coord, put_namespace, put_optional_coord,
    put_short_string, put_u16, put_u32,
};

/// Most coordinates in one `mget` request (and values in its answer). The
/// server reads them all under one hold of the namespace's read lock, so
/// the batch is bounded; `Client::mget` splits longer lists.
pub const MAX_MGET_CELLS: u32 = 4096;
/// Longest path accepted (Linux PATH_MAX).
const MAX_PATH_BYTES: usize = 4096;
/// Bit 0 of a scan request's flags: count the cells, send no values.
const SCAN_FLAG_COUNT_ONLY: u8 = 1;
/// Bit 1: also answer the LSN the page's state is at least at.
const SCAN_FLAG_WITH_LSN: u8 = 2;
/// An encoded coordinate.
const COORD_BYTES: usize = 12;

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
        encode_frame(out, self.opcode() as u16, request_id, |b| {
            match self.opcode().family() {
                Family::Session => self.put_session(b),
                Family::Cells => self.put_cells(b),
                Family::Graph => self.put_graph(b),
                Family::Namespaces => self.put_namespaces(b),
                Family::Programs => self.put_programs(b),
                Family::Bulk => self.put_bulk(b),
            }
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
        let max_value_bytes = limits.max_value_bytes as usize;
        let request = match opcode.family() {
            Family::Session => read_session(opcode, &mut r)?,
            Family::Cells => read_cells(opcode, &mut r, max_value_bytes)?,
            Family::Graph => read_graph(opcode, &mut r)?,
            Family::Namespaces => read_namespaces(opcode, &mut r)?,
            Family::Programs => read_programs(opcode, &mut r)?,
            Family::Bulk => read_bulk(opcode, &mut r, max_value_bytes)?,
        };
        r.finish()?;
        Ok(request)
    }

    // The family encoders. `encode` routes each request by its opcode's
    // family (`Opcode::family`), so
    // each sees only its own family's variants; the `_` arms are never taken.

    fn put_session(&self, b: &mut Vec<u8>) {
        match self {
            Request::Hello {
                client_version,
                client_name,
            } => {
                put_u16(b, *client_version);
                put_short_string(b, client_name, MAX_NAME_BYTES);
            }
            Request::Checkpoint { compact } => b.push(u8::from(*compact)),
            Request::Backup { dest } => put_short_string(b, dest, MAX_PATH_BYTES),
            _ => {}
        }
    }

    fn put_cells(&self, b: &mut Vec<u8>) {
        match self {
            Request::Put { ns, coord, value } => {
                put_namespace(b, ns);
                put_coord(b, *coord);
                put_blob(b, value);
            }
            Request::Get { ns, coord } | Request::Del { ns, coord } => {
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
            _ => {}
        }
    }

    fn put_graph(&self, b: &mut Vec<u8>) {
        match self {
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
            Request::Walk { .. } => self.put_walk(b),
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
            Request::Detach { ns, coord } => {
                put_namespace(b, ns);
                put_coord(b, *coord);
            }
            _ => {}
        }
    }

    fn put_walk(&self, b: &mut Vec<u8>) {
        if let Request::Walk {
            ns,
            from,
            direction,
            label,
            max_depth,
            max_nodes,
            with_values,
        } = self
        {
            put_namespace(b, ns);
            put_coord(b, *from);
            b.push(*direction as u8);
            put_label_filter(b, label);
            put_u32(b, *max_depth);
            put_u32(b, *max_nodes);
            b.push(if *with_values { WALK_FLAG_VALUES } else { 0 });
        }
    }

    fn put_namespaces(&self, b: &mut Vec<u8>) {
        match self {
            Request::NsCreate { ns, spec } => {
                put_namespace(b, ns);
                put_spec(b, spec);
            }
            Request::NsDrop { ns } | Request::NsInfo { ns } => put_namespace(b, ns),
            Request::NsGrant { ns, uid, read_only } => {
                put_namespace(b, ns);
                put_u32(b, *uid);
                b.push(u8::from(*read_only));
            }
            Request::NsRevoke { ns, uid } => {
                put_namespace(b, ns);
                put_u32(b, *uid);
            }
            _ => {}
        }
    }

    fn put_programs(&self, b: &mut Vec<u8>) {
        match self {
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
            Request::Step { ns, lo, hi, args } => {
                put_namespace(b, ns);
                put_coord(b, *lo);
                put_coord(b, *hi);
                put_args(b, args);
            }
            _ => {}
        }
    }

    fn put_bulk(&self, b: &mut Vec<u8>) {
        match self {
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
            Request::Watch { ns, lo, hi, from } => put_watch_request(b, ns, *lo, *hi, *from),
            _ => {}
        }
    }
}

// The family decoders. `Request::decode` routes each opcode to its family;
// an opcode of another family (never routed here) is refused as unknown
// rather than panicking.

fn read_session(opcode: Opcode, r: &mut BodyReader<'_>) -> Result<Request, DecodeError> {
    Ok(match opcode {
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
        other => return Err(DecodeError::UnknownOpcode(other as u16)),
    })
}

fn read_cells(
    opcode: Opcode,
    r: &mut BodyReader<'_>,
    max_value_bytes: usize,
) -> Result<Request, DecodeError> {
    Ok(match opcode {
        Opcode::Put => Request::Put {
            ns: r.namespace()?,
            coord: r.coord()?,
            value: r.blob("value", max_value_bytes)?,
        },
        Opcode::Get => Request::Get {
            ns: r.namespace()?,
            coord: r.coord()?,
        },
        Opcode::Del => Request::Del {
            ns: r.namespace()?,
            coord: r.coord()?,
        },
        Opcode::Mget => read_mget(r)?,
        Opcode::Scan => read_scan(r)?,
        other => return Err(DecodeError::UnknownOpcode(other as u16)),
    })
}

fn read_mget(r: &mut BodyReader<'_>) -> Result<Request, DecodeError> {
    let ns = r.namespace()?;
    let count = read_count(r, "mget cell count", MAX_MGET_CELLS, COORD_BYTES)?;
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
    Ok(Request::Mget { ns, coords })
}

fn read_scan(r: &mut BodyReader<'_>) -> Result<Request, DecodeError> {
    let ns = r.namespace()?;
    let lo = r.coord()?;
    let hi = r.coord()?;
    let limit = r.u32()?;
    let flags = r.flags(SCAN_FLAG_COUNT_ONLY | SCAN_FLAG_WITH_LSN, "scan flags")?;
    Ok(Request::Scan {
        ns,
        lo,
        hi,
        limit,
        count_only: flags & SCAN_FLAG_COUNT_ONLY != 0,
        after: r.optional_coord()?,
        with_lsn: flags & SCAN_FLAG_WITH_LSN != 0,
    })
}

fn read_graph(opcode: Opcode, r: &mut BodyReader<'_>) -> Result<Request, DecodeError> {
    Ok(match opcode {
        Opcode::Link => Request::Link {
            ns: r.namespace()?,
            from: r.coord()?,
            to: r.coord()?,
            label: read_label(r)?,
            weight: read_f64(r)?,
        },
        Opcode::Unlink => Request::Unlink {
            ns: r.namespace()?,
            from: r.coord()?,
            to: r.coord()?,
            label: read_label(r)?,
        },
        Opcode::Edges => Request::Edges {
            ns: r.namespace()?,
            coord: r.coord()?,
            direction: read_direction(r)?,
            label: read_label_filter(r)?,
        },
        Opcode::Walk => read_walk_request(r)?,
        Opcode::Path => Request::Path {
            ns: r.namespace()?,
            from: r.coord()?,
            to: r.coord()?,
            label: read_label_filter(r)?,
            max_cost: read_f64(r)?,
        },
        Opcode::Detach => Request::Detach {
            ns: r.namespace()?,
            coord: r.coord()?,
        },
        other => return Err(DecodeError::UnknownOpcode(other as u16)),
    })
}

fn read_walk_request(r: &mut BodyReader<'_>) -> Result<Request, DecodeError> {
    let ns = r.namespace()?;
    let from = r.coord()?;
    let direction = read_direction(r)?;
    let label = read_label_filter(r)?;
    let max_depth = r.u32()?;
    let max_nodes = r.u32()?;
    let flags = r.flags(WALK_FLAG_VALUES, "walk flags")?;
    Ok(Request::Walk {
        ns,
        from,
        direction,
        label,
        max_depth,
        max_nodes,
        with_values: flags & WALK_FLAG_VALUES != 0,
    })
}

fn read_namespaces(opcode: Opcode, r: &mut BodyReader<'_>) -> Result<Request, DecodeError> {
    Ok(match opcode {
        Opcode::NsCreate => Request::NsCreate {
            ns: r.namespace()?,
            spec: read_spec(r)?,
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
        other => return Err(DecodeError::UnknownOpcode(other as u16)),
    })
}

fn read_programs(opcode: Opcode, r: &mut BodyReader<'_>) -> Result<Request, DecodeError> {
    Ok(match opcode {
        Opcode::Prog => Request::Prog {
            ns: r.namespace()?,
            coord: r.coord()?,
            source: r.blob("program source", MAX_PROGRAM_BYTES)?,
        },
        Opcode::Run => Request::Run {
            ns: r.namespace()?,
            coord: r.coord()?,
            args: read_args(r)?,
        },
        Opcode::CellStats => Request::CellStats {
            ns: r.namespace()?,
            coord: r.coord()?,
            limit: r.u32()?,
        },
        Opcode::Step => Request::Step {
            ns: r.namespace()?,
            lo: r.coord()?,
            hi: r.coord()?,
            args: read_args(r)?,
        },
        other => return Err(DecodeError::UnknownOpcode(other as u16)),
    })
}

fn read_bulk(
    opcode: Opcode,
    r: &mut BodyReader<'_>,
    max_value_bytes: usize,
) -> Result<Request, DecodeError> {
    Ok(match opcode {
        Opcode::Batch => Request::Batch {
            ns: r.namespace()?,
            ops: read_batch_ops(r, max_value_bytes)?,
        },
        Opcode::EdgeList => Request::EdgeList {
            ns: r.namespace()?,
            limit: r.u32()?,
            after: read_optional_u64(r)?,
        },
        Opcode::ProgramList => Request::ProgramList {
            ns: r.namespace()?,
            limit: r.u32()?,
            after: r.optional_coord()?,
        },
        Opcode::Watch => {
            let (ns, lo, hi, from) = read_watch_request(r)?;
            Request::Watch { ns, lo, hi, from }
        }
        other => return Err(DecodeError::UnknownOpcode(other as u16)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PROTOCOL_VERSION;
    use crate::error::ErrorCode;
    use crate::frame::{HEADER_BYTES, split_frame};

    fn ns() -> NamespaceName {
        NamespaceName::new("default").unwrap()
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
        let (header, body) = split_frame(&out);
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
        let (header, body) = split_frame(&out);
        let limits = Limits {
            max_value_bytes: 99,
            ..Limits::default()
        };
        let err = Request::decode(&header, body, &limits).unwrap_err();
        assert_eq!(err.code(), ErrorCode::ValueTooLarge);
    }

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
            let (header, body) = split_frame(&out);
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
        let (header, body) = split_frame(&out);
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
            let (header, body) = split_frame(&out);
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
}
