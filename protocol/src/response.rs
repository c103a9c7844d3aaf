//! Responses: what `cubed` answers, and their body encodings.
//!
//! A response body starts with a status byte: `0` then the result fields of
//! the request's opcode, or `1` then an error (`u16` code, `u16` length,
//! UTF-8 message). As for requests, the codec is split by command family.

use crate::bulk::{
    EdgePage, ProgramPage, put_edge_page, put_program_page, read_edge_page, read_program_page,
};
use crate::edge::{
    EdgeInfo, PathFound, WalkResult, put_edge_list, put_path, put_walk, read_count, read_edge_list,
    read_path, read_walk,
};
use crate::error::{DecodeError, ErrorCode};
use crate::frame::{Family, FrameHeader, Limits, Opcode, RESPONSE_BIT, encode_frame};
use crate::model::{Coord, NamespaceName};
use crate::namespace::{NamespaceInfo, put_info, put_name_list, read_info, read_name_list};
use crate::page_encoder::put_mget_cell;
use crate::program::{
    CellStats, RunReply, StepReply, put_cell_stats, put_run_reply, put_step_reply, read_cell_stats,
    read_run_reply, read_step_reply,
};
use crate::request::MAX_MGET_CELLS;
use crate::scan_cells::read_scan_page_ref;
use crate::watch::{WatchFrame, put_watch_frame, read_watch_frame};
use crate::wire::{
    BodyReader, MAX_MESSAGE_BYTES, MAX_NAME_BYTES, put_blob, put_coord, put_optional_coord,
    put_short_string, put_u16, put_u32, put_u64,
};

/// Most entries in one stats response.
pub const MAX_STATS_ENTRIES: usize = 4096;
/// Most cells in one scan page. A request may ask for more; the server
/// answers at most this many (and fewer when the page would outgrow a
/// frame), so a huge box never becomes one giant response.
pub const MAX_SCAN_PAGE_CELLS: u32 = 65_536;

/// Set in a scan response's `kind` when a `u64` LSN follows the kind byte.
pub(crate) const SCAN_KIND_WITH_LSN: u8 = 0x80;
/// A scan response's `kind`: a count, or cells with their values.
pub(crate) const SCAN_KIND_COUNT: u8 = 0;
pub(crate) const SCAN_KIND_CELLS: u8 = 1;
/// The smallest encoded scan cell: a coordinate and an empty blob.
pub(crate) const MIN_SCAN_CELL_BYTES: usize = 12 + 4;
/// The smallest encoded `mget` answer cell: the presence byte of a missing one.
const MIN_MGET_CELL_BYTES: usize = 1;

pub(crate) const STATUS_OK: u8 = 0;
const STATUS_ERROR: u8 = 1;

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
        if let Some(error) = read_status(&mut r)? {
            return Ok(Err(error));
        }
        let raw = header.opcode & !RESPONSE_BIT;
        if header.opcode & RESPONSE_BIT == 0 {
            return Err(DecodeError::BadField {
                what: "response opcode without the response bit",
                got: u64::from(header.opcode),
            });
        }
        let opcode = Opcode::from_u16(raw).ok_or(DecodeError::UnknownOpcode(raw))?;
        let response = read_success(opcode, &mut r, limits.max_value_bytes as usize)?;
        r.finish()?;
        Ok(Ok(response))
    }

    // The family encoders. `encode` routes each response by its opcode's
    // family (`Opcode::family`), so
    // each sees only its own family's variants; the `_` arms are never taken.

    fn put_session(&self, b: &mut Vec<u8>) {
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
            Response::Stats(entries)
            | Response::Checkpoint(entries)
            | Response::Backup(entries) => put_entries(b, entries),
            _ => {}
        }
    }

    fn put_cells(&self, b: &mut Vec<u8>) {
        match self {
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
            Response::Del { lsn, existed } => {
                put_u64(b, *lsn);
                b.push(u8::from(*existed));
            }
            Response::Scan {
                result,
                resume_after,
                lsn,
            } => put_scan_page(b, result, *resume_after, *lsn),
            _ => {}
        }
    }

    fn put_graph(&self, b: &mut Vec<u8>) {
        match self {
            Response::Unlink { lsn, existed }
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
            _ => {}
        }
    }

    fn put_namespaces(&self, b: &mut Vec<u8>) {
        match self {
            Response::NsCreated(info)
            | Response::NsInfo(info)
            | Response::NsGranted(info)
            | Response::NsRevoked(info) => put_info(b, info),
            Response::NsDropped { lsn, cells } => {
                put_u64(b, *lsn);
                put_u64(b, *cells);
            }
            Response::NsList(names) => put_name_list(b, names),
            _ => {}
        }
    }

    fn put_programs(&self, b: &mut Vec<u8>) {
        match self {
            Response::Prog { lsn, replaced } => {
                put_u64(b, *lsn);
                b.push(u8::from(*replaced));
            }
            Response::Run(reply) => put_run_reply(b, reply),
            Response::CellStats(stats) => put_cell_stats(b, stats),
            Response::Step(reply) => put_step_reply(b, reply),
            _ => {}
        }
    }

    fn put_bulk(&self, b: &mut Vec<u8>) {
        match self {
            Response::Batch { lsn, applied } => {
                put_u64(b, *lsn);
                put_u32(b, *applied);
            }
            Response::EdgeList(page) => put_edge_page(b, page),
            Response::ProgramList(page) => put_program_page(b, page),
            Response::Watch(frame) => put_watch_frame(b, frame),
            _ => {}
        }
    }
}

/// A scan page: the kind byte (with the LSN flag), the LSN if any, the
/// count or the cells, then the resume cursor.
fn put_scan_page(
    b: &mut Vec<u8>,
    result: &ScanResult,
    resume_after: Option<Coord>,
    lsn: Option<u64>,
) {
    let kind = match result {
        ScanResult::Count(_) => SCAN_KIND_COUNT,
        ScanResult::Cells(_) => SCAN_KIND_CELLS,
    };
    match lsn {
        None => b.push(kind),
        Some(lsn) => {
            b.push(kind | SCAN_KIND_WITH_LSN);
            put_u64(b, lsn);
        }
    }
    match result {
        ScanResult::Count(count) => put_u64(b, *count),
        ScanResult::Cells(cells) => {
            put_u32(b, cells.len() as u32);
            for cell in cells {
                put_coord(b, cell.coord);
                put_blob(b, &cell.value);
            }
        }
    }
    put_optional_coord(b, resume_after);
}

/// The fields of a success answer to `opcode`, routed by command family.
fn read_success(
    opcode: Opcode,
    r: &mut BodyReader<'_>,
    max_value_bytes: usize,
) -> Result<Response, DecodeError> {
    match opcode.family() {
        Family::Session => read_session(opcode, r),
        Family::Cells => read_cells(opcode, r, max_value_bytes),
        Family::Graph => read_graph(opcode, r, max_value_bytes),
        Family::Namespaces => read_namespaces(opcode, r),
        Family::Programs => read_programs(opcode, r, max_value_bytes),
        Family::Bulk => read_bulk(opcode, r, max_value_bytes),
    }
}

// The family decoders. `read_success` routes each opcode to its family; an
// opcode of another family (never routed here) is refused as unknown rather
// than panicking.

fn read_session(opcode: Opcode, r: &mut BodyReader<'_>) -> Result<Response, DecodeError> {
    Ok(match opcode {
        Opcode::Hello => Response::Hello {
            protocol_version: r.u16()?,
            server_version: r.short_string("server version", MAX_NAME_BYTES)?,
            max_frame_bytes: r.u32()?,
            max_value_bytes: r.u32()?,
        },
        Opcode::Ping => Response::Pong,
        Opcode::Stats => Response::Stats(read_entries(r)?),
        Opcode::Checkpoint => Response::Checkpoint(read_entries(r)?),
        Opcode::Backup => Response::Backup(read_entries(r)?),
        other => return Err(DecodeError::UnknownOpcode(other as u16)),
    })
}

fn read_cells(
    opcode: Opcode,
    r: &mut BodyReader<'_>,
    max_value_bytes: usize,
) -> Result<Response, DecodeError> {
    Ok(match opcode {
        Opcode::Put => Response::Put { lsn: r.u64()? },
        Opcode::Get => {
            if r.bool()? {
                Response::Get(Some(r.blob("value", max_value_bytes)?))
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
                r,
                "mget answer cell count",
                MAX_MGET_CELLS,
                MIN_MGET_CELL_BYTES,
            )?;
            let mut values = Vec::with_capacity(count);
            for _ in 0..count {
                values.push(if r.bool()? {
                    Some(r.blob("value", max_value_bytes)?)
                } else {
                    None
                });
            }
            Response::Mget(values)
        }
        Opcode::Scan => read_scan_page(r, max_value_bytes)?,
        other => return Err(DecodeError::UnknownOpcode(other as u16)),
    })
}

/// The status byte; for an error answer (`Some`), its code and message,
/// which must end the body.
pub(crate) fn read_status(r: &mut BodyReader<'_>) -> Result<Option<ServerError>, DecodeError> {
    let status = r.u8()?;
    if status == STATUS_ERROR {
        let code = r.u16()?;
        let message = r.short_string("error message", MAX_MESSAGE_BYTES)?;
        r.check_finished()?;
        return Ok(Some(ServerError { code, message }));
    }
    if status != STATUS_OK {
        return Err(DecodeError::BadField {
            what: "response status",
            got: u64::from(status),
        });
    }
    Ok(None)
}

/// A scan page, owned: the cells checked in place
/// ([`crate::scan_cells::read_scan_page_ref`]), then each value copied.
fn read_scan_page(r: &mut BodyReader<'_>, max_value_bytes: usize) -> Result<Response, DecodeError> {
    Ok(read_scan_page_ref(r, max_value_bytes)?.to_response())
}

fn read_graph(
    opcode: Opcode,
    r: &mut BodyReader<'_>,
    max_value_bytes: usize,
) -> Result<Response, DecodeError> {
    Ok(match opcode {
        Opcode::Link => Response::Link {
            lsn: r.u64()?,
            created: r.bool()?,
        },
        Opcode::Unlink => Response::Unlink {
            lsn: r.u64()?,
            existed: r.bool()?,
        },
        Opcode::Edges => Response::Edges(read_edge_list(r)?),
        Opcode::Walk => Response::Walk(read_walk(r, max_value_bytes)?),
        Opcode::Path => {
            let (edges_examined, path) = read_path(r)?;
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
        other => return Err(DecodeError::UnknownOpcode(other as u16)),
    })
}

fn read_namespaces(opcode: Opcode, r: &mut BodyReader<'_>) -> Result<Response, DecodeError> {
    Ok(match opcode {
        Opcode::NsCreate => Response::NsCreated(read_info(r)?),
        Opcode::NsInfo => Response::NsInfo(read_info(r)?),
        Opcode::NsGrant => Response::NsGranted(read_info(r)?),
        Opcode::NsRevoke => Response::NsRevoked(read_info(r)?),
        Opcode::NsDrop => Response::NsDropped {
            lsn: r.u64()?,
            cells: r.u64()?,
        },
        Opcode::NsList => Response::NsList(read_name_list(r)?),
        other => return Err(DecodeError::UnknownOpcode(other as u16)),
    })
}

fn read_programs(
    opcode: Opcode,
    r: &mut BodyReader<'_>,
    max_value_bytes: usize,
) -> Result<Response, DecodeError> {
    Ok(match opcode {
        Opcode::Prog => Response::Prog {
            lsn: r.u64()?,
            replaced: r.bool()?,
        },
        Opcode::Run => Response::Run(read_run_reply(r, max_value_bytes)?),
        Opcode::CellStats => Response::CellStats(read_cell_stats(r)?),
        Opcode::Step => Response::Step(read_step_reply(r)?),
        other => return Err(DecodeError::UnknownOpcode(other as u16)),
    })
}

fn read_bulk(
    opcode: Opcode,
    r: &mut BodyReader<'_>,
    max_value_bytes: usize,
) -> Result<Response, DecodeError> {
    Ok(match opcode {
        Opcode::Batch => Response::Batch {
            lsn: r.u64()?,
            applied: r.u32()?,
        },
        Opcode::EdgeList => Response::EdgeList(read_edge_page(r)?),
        Opcode::ProgramList => Response::ProgramList(read_program_page(r)?),
        Opcode::Watch => Response::Watch(read_watch_frame(r, max_value_bytes)?),
        other => return Err(DecodeError::UnknownOpcode(other as u16)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::split_frame;

    #[test]
    fn error_response_round_trips() {
        let mut out = Vec::new();
        let e = ServerError::new(ErrorCode::NoSuchNamespace, "no namespace \"x\"");
        Response::encode_error(Opcode::Get as u16, 9, &e, &mut out);
        let (header, body) = split_frame(&out);
        assert_eq!(header.opcode, Opcode::Get as u16 | RESPONSE_BIT);
        assert_eq!(
            Response::decode(&header, body, &Limits::default()).unwrap(),
            Err(e)
        );
    }

    #[test]
    fn oversized_or_lying_page_counts_are_refused_without_allocating() {
        let mut out = Vec::new();
        encode_frame(&mut out, Opcode::Scan as u16 | RESPONSE_BIT, 1, |b| {
            b.push(STATUS_OK);
            b.push(SCAN_KIND_CELLS);
            put_u32(b, MAX_SCAN_PAGE_CELLS + 1);
        });
        let (header, body) = split_frame(&out);
        assert!(Response::decode(&header, body, &Limits::default()).is_err());
        let mut out = Vec::new();
        encode_frame(&mut out, Opcode::Scan as u16 | RESPONSE_BIT, 1, |b| {
            b.push(STATUS_OK);
            b.push(SCAN_KIND_CELLS);
            put_u32(b, MAX_SCAN_PAGE_CELLS);
            b.push(0);
        });
        let (header, body) = split_frame(&out);
        assert!(matches!(
            Response::decode(&header, body, &Limits::default()),
            Err(DecodeError::Truncated { .. })
        ));
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
            let (header, body) = split_frame(out);
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
