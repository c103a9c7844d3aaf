//! Bulk transfer on the wire: `batch` (0x0014), `edge-list` (0x0026) and
//! `prog-list` (0x0043), `docs/protocol.md` section 6.8.
//!
//! `batch` is what `cubec import` sends: many writes of one namespace (cell
//! values, edges, programs) applied as one atomic unit, so an import that
//! fails part-way leaves whole batches, never half of one. `edge-list` and
//! `prog-list` are what `cubec export` reads besides `scan`: every edge and
//! every program of a namespace, a page at a time.
//!
//! As everywhere in this crate, every count and length is checked against
//! what the body still holds before anything is allocated.

use crate::edge::{EdgeLabel, put_f64, put_label, read_f64, read_label};
use crate::error::DecodeError;
use crate::model::Coord;
use crate::program::MAX_PROGRAM_BYTES;
use crate::wire::{BodyReader, put_blob, put_coord, put_u32, put_u64};

/// Most operations in one `batch`. The same as the store's cap on the
/// mutations of one transaction (`cube_store::MAX_TXN_MUTATIONS`), the
/// largest unit the writer commits atomically.
pub const MAX_BATCH_OPS: u32 = 65_536;

/// What a batch's operation count is called in a [`DecodeError::TooMany`]
/// (answered with `limit_exceeded`, not `malformed_frame`).
pub(crate) const BATCH_OPERATIONS: &str =
    "the operations of a batch (send smaller batches: cubec import --batch)";
/// Most encoded operation bytes in one `batch` (the sum of
/// [`BatchOp::encoded_len`]): the writer's cap on one commit group's bytes,
/// so a batch costs other clients no more latency than a full group does.
pub const MAX_BATCH_BYTES: u64 = 8 * 1024 * 1024;
/// Most edges in one `edge-list` page.
pub const MAX_EDGE_PAGE: u32 = 65_536;
/// Most programs in one `prog-list` page (each may be up to
/// [`MAX_PROGRAM_BYTES`]; the server also stops a page before it would
/// outgrow a frame).
pub const MAX_PROGRAM_PAGE: u32 = 4096;

/// Operation tags inside a batch body.
const OP_PUT: u8 = 1;
const OP_LINK: u8 = 2;
const OP_PROG: u8 = 3;

/// The smallest encoded operation: a tag, a coordinate and an empty blob.
const MIN_OP_BYTES: usize = 1 + 12 + 4;
/// The smallest encoded `edge-list` entry: two coordinates, an empty
/// label and the weight.
const MIN_LISTED_EDGE_BYTES: usize = 12 + 12 + 2 + 8;
/// The smallest encoded `prog-list` entry: a coordinate and an empty blob.
const MIN_LISTED_PROGRAM_BYTES: usize = 12 + 4;

/// One write inside a [`crate::Request::Batch`].
#[derive(Clone, Debug, PartialEq)]
pub enum BatchOp {
    /// Store `value` at `coord`, like `put`.
    Put { coord: Coord, value: Vec<u8> },
    /// Create the edge `from -> to` with `label` or set its weight, like
    /// `link` (the same weight rules and `--max-edges-per-cell`).
    Link {
        from: Coord,
        to: Coord,
        label: EdgeLabel,
        weight: f64,
    },
    /// Store a cell's program, like `prog` (compiled first; an empty
    /// source removes the cell's program).
    Prog { coord: Coord, source: Vec<u8> },
}

impl BatchOp {
    /// Bytes this operation takes in the batch body; their sum is what
    /// [`MAX_BATCH_BYTES`] bounds.
    pub fn encoded_len(&self) -> usize {
        match self {
            BatchOp::Put { value, .. } => MIN_OP_BYTES + value.len(),
            BatchOp::Link { label, .. } => 1 + 12 + 12 + 2 + label.as_str().len() + 8,
            BatchOp::Prog { source, .. } => MIN_OP_BYTES + source.len(),
        }
    }

    /// What kind of write this is, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            BatchOp::Put { .. } => "put",
            BatchOp::Link { .. } => "link",
            BatchOp::Prog { .. } => "prog",
        }
    }
}

/// One edge of an `edge-list` page.
#[derive(Clone, Debug, PartialEq)]
pub struct ListedEdge {
    pub from: Coord,
    pub to: Coord,
    pub label: EdgeLabel,
    pub weight: f64,
}

/// One page of a namespace's edges.
#[derive(Clone, Debug, PartialEq)]
pub struct EdgePage {
    pub edges: Vec<ListedEdge>,
    /// `None`: every edge has been listed. Otherwise ask again with this
    /// as `after`: an opaque cursor (the page may be short, even empty).
    pub resume_after: Option<u64>,
}

/// One program of a `prog-list` page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedProgram {
    pub coord: Coord,
    pub source: Vec<u8>,
}

/// One page of a namespace's programs, in coordinate order (x, then y,
/// then z).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramPage {
    pub programs: Vec<ListedProgram>,
    /// `None`: every program has been listed. Otherwise ask again with
    /// this as `after`.
    pub resume_after: Option<Coord>,
}

pub(crate) fn put_batch_ops(b: &mut Vec<u8>, ops: &[BatchOp]) {
    // Frames are at most u32::MAX bytes, so a count that does not fit
    // could never be sent anyway; the decoder and the server refuse
    // anything past MAX_BATCH_OPS.
    put_u32(b, ops.len().min(u32::MAX as usize) as u32);
    for op in ops {
        match op {
            BatchOp::Put { coord, value } => {
                b.push(OP_PUT);
                put_coord(b, *coord);
                put_blob(b, value);
            }
            BatchOp::Link {
                from,
                to,
                label,
                weight,
            } => {
                b.push(OP_LINK);
                put_coord(b, *from);
                put_coord(b, *to);
                put_label(b, label);
                put_f64(b, *weight);
            }
            BatchOp::Prog { coord, source } => {
                b.push(OP_PROG);
                put_coord(b, *coord);
                put_blob(b, source);
            }
        }
    }
}

/// The operations of a batch body. A count over [`MAX_BATCH_OPS`] is
/// refused before any operation is read (`limit_exceeded`): a 16 MiB frame
/// of empty puts would otherwise decode into about a million operations,
/// six times the frame in memory, only to be refused afterwards.
pub(crate) fn read_batch_ops(
    r: &mut BodyReader<'_>,
    max_value_bytes: usize,
) -> Result<Vec<BatchOp>, DecodeError> {
    let count = r.u32()?;
    if count > MAX_BATCH_OPS {
        return Err(DecodeError::TooMany {
            what: BATCH_OPERATIONS,
            got: u64::from(count),
            limit: u64::from(MAX_BATCH_OPS),
        });
    }
    let count = count as usize;
    // Reserve no more memory than the body has bytes; a real batch grows
    // the vector as its operations are actually read.
    let fits = r.remaining() / MIN_OP_BYTES.max(std::mem::size_of::<BatchOp>());
    let mut ops = Vec::with_capacity(count.min(fits));
    for _ in 0..count {
        let op = match r.u8()? {
            OP_PUT => BatchOp::Put {
                coord: r.coord()?,
                // "value": the same limit, and the same value_too_large
                // code, as a put.
                value: r.blob("value", max_value_bytes)?,
            },
            OP_LINK => BatchOp::Link {
                from: r.coord()?,
                to: r.coord()?,
                label: read_label(r)?,
                weight: read_f64(r)?,
            },
            OP_PROG => BatchOp::Prog {
                coord: r.coord()?,
                source: r.blob("program source", MAX_PROGRAM_BYTES)?,
            },
            other => {
                return Err(DecodeError::BadField {
                    what: "batch operation tag",
                    got: u64::from(other),
                });
            }
        };
        ops.push(op);
    }
    Ok(ops)
}

/// A `bool`, then a `u64` only if it is 1.
pub(crate) fn put_optional_u64(b: &mut Vec<u8>, v: Option<u64>) {
    match v {
        None => b.push(0),
        Some(v) => {
            b.push(1);
            put_u64(b, v);
        }
    }
}

pub(crate) fn read_optional_u64(r: &mut BodyReader<'_>) -> Result<Option<u64>, DecodeError> {
    Ok(if r.bool()? { Some(r.u64()?) } else { None })
}

pub(crate) fn put_edge_list_request(b: &mut Vec<u8>, limit: u32, after: Option<u64>) {
    put_u32(b, limit);
    put_optional_u64(b, after);
}

pub(crate) fn put_edge_page(b: &mut Vec<u8>, page: &EdgePage) {
    let edges = &page.edges[..page.edges.len().min(MAX_EDGE_PAGE as usize)];
    put_u32(b, edges.len() as u32);
    for edge in edges {
        put_coord(b, edge.from);
        put_coord(b, edge.to);
        put_label(b, &edge.label);
        put_f64(b, edge.weight);
    }
    put_optional_u64(b, page.resume_after);
}

pub(crate) fn read_edge_page(r: &mut BodyReader<'_>) -> Result<EdgePage, DecodeError> {
    let count = r.u32()?;
    if count > MAX_EDGE_PAGE {
        return Err(DecodeError::TooMany {
            what: "edge-list page edge count",
            got: u64::from(count),
            limit: u64::from(MAX_EDGE_PAGE),
        });
    }
    let fits = r.remaining() / MIN_LISTED_EDGE_BYTES.max(std::mem::size_of::<ListedEdge>());
    let mut edges = Vec::with_capacity((count as usize).min(fits));
    for _ in 0..count {
        edges.push(ListedEdge {
            from: r.coord()?,
            to: r.coord()?,
            label: read_label(r)?,
            weight: read_f64(r)?,
        });
    }
    Ok(EdgePage {
        edges,
        resume_after: read_optional_u64(r)?,
    })
}

pub(crate) fn put_program_page(b: &mut Vec<u8>, page: &ProgramPage) {
    let programs = &page.programs[..page.programs.len().min(MAX_PROGRAM_PAGE as usize)];
    put_u32(b, programs.len() as u32);
    for program in programs {
        put_coord(b, program.coord);
        put_blob(b, &program.source);
    }
    crate::wire::put_optional_coord(b, page.resume_after);
}

pub(crate) fn read_program_page(r: &mut BodyReader<'_>) -> Result<ProgramPage, DecodeError> {
    let count = r.u32()?;
    if count > MAX_PROGRAM_PAGE {
        return Err(DecodeError::TooMany {
            what: "prog-list page program count",
            got: u64::from(count),
            limit: u64::from(MAX_PROGRAM_PAGE),
        });
    }
    let fits = r.remaining() / MIN_LISTED_PROGRAM_BYTES.max(std::mem::size_of::<ListedProgram>());
    let mut programs = Vec::with_capacity((count as usize).min(fits));
    for _ in 0..count {
        programs.push(ListedProgram {
            coord: r.coord()?,
            source: r.blob("program source", MAX_PROGRAM_BYTES)?,
        });
    }
    Ok(ProgramPage {
        programs,
        resume_after: r.optional_coord()?,
    })
}

#[cfg(test)]
mod tests {
    use crate::frame::{FrameHeader, HEADER_BYTES, Limits};
    use crate::model::NamespaceName;
    use crate::{ErrorCode, Request, Response};

    use super::*;

    fn split(frame: &[u8]) -> (FrameHeader, &[u8]) {
        let header = FrameHeader::parse(frame[..HEADER_BYTES].try_into().unwrap());
        header.verify_body(&frame[HEADER_BYTES..]).unwrap();
        (header, &frame[HEADER_BYTES..])
    }

    fn round_trip_request(request: &Request) -> Request {
        let mut out = Vec::new();
        request.encode(5, &mut out);
        let (header, body) = split(&out);
        Request::decode(&header, body, &Limits::default()).unwrap()
    }

    fn round_trip_response(response: &Response) -> Response {
        let mut out = Vec::new();
        response.encode(5, &mut out);
        let (header, body) = split(&out);
        Response::decode(&header, body, &Limits::default())
            .unwrap()
            .unwrap()
    }

    fn every_byte() -> Vec<u8> {
        (0..=255).collect()
    }

    #[test]
    fn batch_request_and_response_round_trip() {
        let ops = vec![
            BatchOp::Put {
                coord: Coord::new(i32::MIN, -1, i32::MAX),
                value: every_byte(),
            },
            BatchOp::Put {
                coord: Coord::new(0, 0, 0),
                value: Vec::new(),
            },
            BatchOp::Link {
                from: Coord::new(1, 2, 3),
                to: Coord::new(-4, 5, -6),
                label: EdgeLabel::new("road ☃").unwrap(),
                weight: 0.1 + 0.2,
            },
            BatchOp::Prog {
                coord: Coord::new(7, 8, 9),
                source: b"return 1".to_vec(),
            },
        ];
        let request = Request::Batch {
            ns: NamespaceName::new("default").unwrap(),
            ops,
        };
        let mut out = Vec::new();
        request.encode(1, &mut out);
        let body_len = out.len() - HEADER_BYTES;
        if let Request::Batch { ops, .. } = &request {
            let op_bytes: usize = ops.iter().map(BatchOp::encoded_len).sum();
            // namespace (1 + 7) and the count (4) besides the operations.
            assert_eq!(body_len, 1 + 7 + 4 + op_bytes);
        }
        assert_eq!(round_trip_request(&request), request);
        let empty = Request::Batch {
            ns: NamespaceName::new("default").unwrap(),
            ops: Vec::new(),
        };
        assert_eq!(round_trip_request(&empty), empty);
        let response = Response::Batch {
            lsn: 77,
            applied: 4,
        };
        assert_eq!(round_trip_response(&response), response);
    }

    #[test]
    fn batch_decoding_refuses_bad_tags_big_values_and_lying_counts() {
        let request = Request::Batch {
            ns: NamespaceName::new("default").unwrap(),
            ops: vec![BatchOp::Put {
                coord: Coord::new(0, 0, 0),
                value: vec![1; 100],
            }],
        };
        let mut out = Vec::new();
        request.encode(1, &mut out);
        let small = Limits {
            max_value_bytes: 99,
            ..Limits::default()
        };
        let (header, body) = split(&out);
        let err = Request::decode(&header, body, &small).unwrap_err();
        assert_eq!(err.code(), ErrorCode::ValueTooLarge);

        // An unknown tag (the first operation's tag byte follows the
        // namespace and the count).
        let mut body = out[HEADER_BYTES..].to_vec();
        body[1 + 7 + 4] = 9;
        let mut header = FrameHeader::parse(out[..HEADER_BYTES].try_into().unwrap());
        header.body_crc32c = crc32c::crc32c(&body);
        let err = Request::decode(&header, &body, &Limits::default()).unwrap_err();
        assert_eq!(err.code(), ErrorCode::MalformedFrame);

        // A count of u32::MAX: over the limit, refused before anything
        // is read; the limit itself with nothing behind it: truncated, and
        // the decoder reserved nothing for it.
        let mut body = b"\x07default".to_vec();
        body.extend_from_slice(&u32::MAX.to_le_bytes());
        header.body_len = body.len() as u32;
        header.body_crc32c = crc32c::crc32c(&body);
        let err = Request::decode(&header, &body, &Limits::default()).unwrap_err();
        assert!(matches!(err, DecodeError::TooMany { .. }), "{err:?}");
        assert_eq!(err.code(), ErrorCode::LimitExceeded);
        let mut body = b"\x07default".to_vec();
        body.extend_from_slice(&MAX_BATCH_OPS.to_le_bytes());
        header.body_len = body.len() as u32;
        header.body_crc32c = crc32c::crc32c(&body);
        assert!(matches!(
            Request::decode(&header, &body, &Limits::default()),
            Err(DecodeError::Truncated { .. })
        ));
    }

    #[test]
    fn list_requests_and_pages_round_trip() {
        let ns = NamespaceName::new("default").unwrap();
        for after in [None, Some(u64::MAX)] {
            let request = Request::EdgeList {
                ns: ns.clone(),
                limit: 100,
                after,
            };
            assert_eq!(round_trip_request(&request), request);
            let page = Response::EdgeList(EdgePage {
                edges: vec![ListedEdge {
                    from: Coord::new(1, 2, 3),
                    to: Coord::new(3, 2, 1),
                    label: EdgeLabel::new("").unwrap(),
                    weight: 2.5,
                }],
                resume_after: after,
            });
            assert_eq!(round_trip_response(&page), page);
        }
        for after in [None, Some(Coord::new(-1, 0, 1))] {
            let request = Request::ProgramList {
                ns: ns.clone(),
                limit: 3,
                after,
            };
            assert_eq!(round_trip_request(&request), request);
            let page = Response::ProgramList(ProgramPage {
                programs: vec![ListedProgram {
                    coord: Coord::new(0, 0, 1),
                    source: every_byte(),
                }],
                resume_after: after,
            });
            assert_eq!(round_trip_response(&page), page);
        }
    }

    #[test]
    fn oversized_page_counts_are_refused() {
        for (opcode, limit) in [
            (crate::Opcode::EdgeList, MAX_EDGE_PAGE),
            (crate::Opcode::ProgramList, MAX_PROGRAM_PAGE),
        ] {
            let mut out = Vec::new();
            crate::frame::encode_frame(
                &mut out,
                opcode as u16 | crate::frame::RESPONSE_BIT,
                1,
                |b| {
                    b.push(0);
                    put_u32(b, limit + 1);
                },
            );
            let (header, body) = split(&out);
            assert!(Response::decode(&header, body, &Limits::default()).is_err());
        }
    }
}
