//! Guards the wire codec against hostile and damaged input: decoding never panics or trusts a length field, `read_frame` never reads past the frame limit, every message round-trips exactly, and bit flips or truncation are always caught.
#![allow(clippy::unwrap_used)]

use std::io::{self, Read};
use std::time::{Duration, Instant};

use cube_protocol::frame::{self, RESPONSE_BIT, read_frame};
use cube_protocol::{
    CellStats, ProgramValue, RunOutcome, RunRecord, RunReply, StepFailure, StepReply,
};
use cube_protocol::{
    Coord, DecodeError, Direction, EdgeInfo, EdgeLabel, ErrorCode, FrameHeader, HEADER_BYTES,
    Limits, MAX_OUTCOME_MESSAGE_BYTES, MAX_STATS_ENTRIES, NamespaceName, Opcode, PROTOCOL_VERSION,
    PathFound, ProtocolError, Request, Response, ScanCell, ScanResult, ServerError, StatsEntry,
    StatsValue, WalkNode, WalkResult, WalkStop,
};
use cube_protocol::{CurveChoice, NamespaceGrant, NamespaceInfo, NamespaceSpec};
use cube_protocol::{ResyncReason, WatchChange, WatchFrame, WatchOp};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::{Index, select};

/// Longest hello name / server version / stats name the decoder accepts.
const MAX_NAME_BYTES: usize = 256;
/// Longest error message / stats text the decoder accepts.
const MAX_MESSAGE_BYTES: usize = 4096;

// ---------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------

fn namespace() -> impl Strategy<Value = NamespaceName> {
    "[a-z0-9_-]{1,64}".prop_map(|s| NamespaceName::new(&s).unwrap())
}

fn coord() -> impl Strategy<Value = Coord> {
    (any::<i32>(), any::<i32>(), any::<i32>()).prop_map(|(x, y, z)| Coord::new(x, y, z))
}

fn value() -> impl Strategy<Value = Vec<u8>> {
    bytes(2048)
}

/// Up to `max - 1` arbitrary bytes. Short ones are generated (and shrunk)
/// byte by byte; long ones are filled from a seed, which is much faster in a
/// debug build and just as arbitrary for a decoder.
fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        vec(any::<u8>(), 0..64.min(max)),
        (0..max, any::<u64>()).prop_map(|(len, seed)| noise(len, seed)),
    ]
}

/// `len` pseudo-random bytes from `seed` (splitmix64).
fn noise(len: usize, mut seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Any text of at most 64 chars, so at most 256 bytes: within the name limit.
fn name_text() -> impl Strategy<Value = String> {
    "\\PC{0,64}"
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        (any::<u16>(), name_text()).prop_map(|(client_version, client_name)| Request::Hello {
            client_version,
            client_name
        }),
        Just(Request::Ping),
        Just(Request::Stats),
        any::<bool>().prop_map(|compact| Request::Checkpoint { compact }),
        name_text().prop_map(|dest| Request::Backup { dest }),
        (namespace(), coord(), value()).prop_map(|(ns, coord, value)| Request::Put {
            ns,
            coord,
            value
        }),
        (namespace(), coord()).prop_map(|(ns, coord)| Request::Get { ns, coord }),
        // 1 to a few dozen coordinates, duplicates likely (0 is refused).
        (namespace(), vec(coord(), 1..40)).prop_map(|(ns, coords)| Request::Mget { ns, coords }),
        (namespace(), coord()).prop_map(|(ns, coord)| Request::Del { ns, coord }),
        (
            namespace(),
            coord(),
            coord(),
            any::<u32>(),
            any::<bool>(),
            proptest::option::of(coord()),
            any::<bool>()
        )
            .prop_map(
                |(ns, lo, hi, limit, count_only, after, with_lsn)| Request::Scan {
                    ns,
                    lo,
                    hi,
                    limit,
                    count_only,
                    after,
                    with_lsn,
                }
            ),
        (
            namespace(),
            coord(),
            coord(),
            proptest::option::of(any::<u64>())
        )
            .prop_map(|(ns, lo, hi, from)| Request::Watch { ns, lo, hi, from }),
        edge_request(),
        program_request(),
        namespace_request(),
        bulk_request(),
    ]
}

// Edges (opcodes 0x0020-0x0025).

/// Up to 64 bytes of any text (at most 16 chars of up to 4 bytes each).
fn edge_label() -> impl Strategy<Value = EdgeLabel> {
    "\\PC{0,16}".prop_map(|s| EdgeLabel::new(&s).unwrap())
}

fn direction() -> impl Strategy<Value = Direction> {
    select(vec![Direction::Out, Direction::In, Direction::Both])
}

/// Any float but NaN, which never compares equal (its bits travel
/// unchanged like any other float's).
fn float() -> impl Strategy<Value = f64> {
    any::<f64>().prop_filter("NaN never compares equal", |f| !f.is_nan())
}

fn edge_request() -> impl Strategy<Value = Request> {
    let filter = || proptest::option::of(edge_label());
    prop_oneof![
        (namespace(), coord(), coord(), edge_label(), float()).prop_map(
            |(ns, from, to, label, weight)| Request::Link {
                ns,
                from,
                to,
                label,
                weight
            }
        ),
        (namespace(), coord(), coord(), edge_label()).prop_map(|(ns, from, to, label)| {
            Request::Unlink {
                ns,
                from,
                to,
                label,
            }
        }),
        (namespace(), coord(), direction(), filter()).prop_map(|(ns, coord, direction, label)| {
            Request::Edges {
                ns,
                coord,
                direction,
                label,
            }
        }),
        (
            namespace(),
            coord(),
            direction(),
            filter(),
            any::<u32>(),
            any::<u32>(),
            any::<bool>()
        )
            .prop_map(
                |(ns, from, direction, label, max_depth, max_nodes, with_values)| Request::Walk {
                    ns,
                    from,
                    direction,
                    label,
                    max_depth,
                    max_nodes,
                    with_values,
                }
            ),
        (namespace(), coord(), coord(), filter(), float()).prop_map(
            |(ns, from, to, label, max_cost)| Request::Path {
                ns,
                from,
                to,
                label,
                max_cost
            }
        ),
        (namespace(), coord()).prop_map(|(ns, coord)| Request::Detach { ns, coord }),
    ]
}

fn edge_response() -> impl Strategy<Value = Response> {
    let edge = (
        select(vec![Direction::Out, Direction::In]),
        coord(),
        edge_label(),
        float(),
    )
        .prop_map(|(direction, other, label, weight)| EdgeInfo {
            direction,
            other,
            label,
            weight,
        });
    let stop = select(vec![
        WalkStop::Complete,
        WalkStop::MaxNodes,
        WalkStop::MaxWork,
        WalkStop::FrameFull,
    ]);
    let walk = (
        stop,
        any::<u64>(),
        any::<bool>(),
        vec(
            (coord(), any::<u32>(), proptest::option::of(bytes(64))),
            0..8,
        ),
    )
        .prop_map(|(stop, edges_examined, with_values, nodes)| {
            Response::Walk(WalkResult {
                stop,
                edges_examined,
                with_values,
                nodes: nodes
                    .into_iter()
                    .map(|(coord, distance, value)| WalkNode {
                        coord,
                        distance,
                        // Without values every node has none.
                        value: value.filter(|_| with_values),
                    })
                    .collect(),
            })
        });
    let path = (
        any::<u64>(),
        proptest::option::of((vec(coord(), 0..8), float())),
    )
        .prop_map(|(edges_examined, found)| Response::Path {
            edges_examined,
            path: found.map(|(coords, cost)| PathFound { coords, cost }),
        });
    prop_oneof![
        (any::<u64>(), any::<bool>()).prop_map(|(lsn, created)| Response::Link { lsn, created }),
        (any::<u64>(), any::<bool>()).prop_map(|(lsn, existed)| Response::Unlink { lsn, existed }),
        vec(edge, 0..8).prop_map(Response::Edges),
        walk,
        path,
        (any::<u64>(), any::<bool>(), any::<u32>()).prop_map(|(lsn, existed, edges_removed)| {
            Response::Detach {
                lsn,
                existed,
                edges_removed,
            }
        }),
    ]
}

fn scan_result() -> impl Strategy<Value = ScanResult> {
    prop_oneof![
        any::<u64>().prop_map(ScanResult::Count),
        vec(
            (coord(), value()).prop_map(|(coord, value)| ScanCell { coord, value }),
            0..8
        )
        .prop_map(ScanResult::Cells),
    ]
}

// Watch (opcode 0x0050): the frames of a watch stream.

fn watch_op() -> impl Strategy<Value = WatchOp> {
    prop_oneof![
        value().prop_map(WatchOp::Put),
        Just(WatchOp::Del),
        (coord(), edge_label(), float()).prop_map(|(to, label, weight)| WatchOp::Link {
            to,
            label,
            weight
        }),
        (coord(), edge_label()).prop_map(|(to, label)| WatchOp::Unlink { to, label }),
        bytes(512).prop_map(WatchOp::ProgramPut),
        Just(WatchOp::ProgramDel),
    ]
}

fn watch_frame() -> impl Strategy<Value = WatchFrame> {
    let change = (any::<u64>(), coord(), watch_op()).prop_map(|(lsn, coord, op)| WatchChange {
        lsn,
        coord,
        op,
    });
    prop_oneof![
        any::<u64>().prop_map(|next_lsn| WatchFrame::Started { next_lsn }),
        (any::<bool>(), vec(change, 0..12))
            .prop_map(|(more, changes)| WatchFrame::Changes { more, changes }),
        (
            any::<u64>(),
            select(vec![ResyncReason::HistoryGone, ResyncReason::TooSlow])
        )
            .prop_map(|(lsn, reason)| WatchFrame::Resync { lsn, reason }),
    ]
}

fn stats_value() -> impl Strategy<Value = StatsValue> {
    prop_oneof![
        any::<u64>().prop_map(StatsValue::Count),
        // NaN is excluded only because NaN != NaN would fail the equality
        // check; its bits travel unchanged like any other float.
        any::<f64>()
            .prop_filter("NaN never compares equal", |f| !f.is_nan())
            .prop_map(StatsValue::Float),
        "\\PC{0,256}".prop_map(StatsValue::Text),
    ]
}

fn stats_entry() -> impl Strategy<Value = StatsEntry> {
    (name_text(), stats_value()).prop_map(|(name, value)| StatsEntry { name, value })
}

fn response() -> impl Strategy<Value = Response> {
    prop_oneof![
        (any::<u16>(), name_text(), any::<u32>(), any::<u32>()).prop_map(
            |(protocol_version, server_version, max_frame_bytes, max_value_bytes)| {
                Response::Hello {
                    protocol_version,
                    server_version,
                    max_frame_bytes,
                    max_value_bytes,
                }
            }
        ),
        Just(Response::Pong),
        vec(stats_entry(), 0..32).prop_map(Response::Stats),
        vec(stats_entry(), 0..32).prop_map(Response::Checkpoint),
        vec(stats_entry(), 0..32).prop_map(Response::Backup),
        any::<u64>().prop_map(|lsn| Response::Put { lsn }),
        proptest::option::of(value()).prop_map(Response::Get),
        vec(proptest::option::of(bytes(256)), 0..24).prop_map(Response::Mget),
        (any::<u64>(), any::<bool>()).prop_map(|(lsn, existed)| Response::Del { lsn, existed }),
        (
            scan_result(),
            proptest::option::of(coord()),
            proptest::option::of(any::<u64>())
        )
            .prop_map(|(result, resume_after, lsn)| Response::Scan {
                result,
                resume_after,
                lsn,
            }),
        watch_frame().prop_map(Response::Watch),
        edge_response(),
        program_response(),
        namespace_response(),
        bulk_response(),
    ]
}

/// `prog`, `run`, `cell-stats` and `step` requests.
fn program_request() -> impl Strategy<Value = Request> {
    prop_oneof![
        (namespace(), coord(), bytes(4096)).prop_map(|(ns, coord, source)| Request::Prog {
            ns,
            coord,
            source
        }),
        (namespace(), coord(), vec(bytes(256), 0..8)).prop_map(|(ns, coord, args)| Request::Run {
            ns,
            coord,
            args
        }),
        // Any two corners: an inverted box is the server's to refuse
        // (invalid_argument), not the codec's.
        (namespace(), coord(), coord(), vec(bytes(256), 0..8))
            .prop_map(|(ns, lo, hi, args)| Request::Step { ns, lo, hi, args }),
        (namespace(), coord(), any::<u32>()).prop_map(|(ns, coord, limit)| Request::CellStats {
            ns,
            coord,
            limit
        }),
    ]
}

/// A scalar a run's table may hold (no NaN: it never compares equal).
fn program_scalar() -> impl Strategy<Value = ProgramValue> {
    prop_oneof![
        any::<bool>().prop_map(ProgramValue::Bool),
        any::<i64>().prop_map(ProgramValue::Int),
        any::<f64>()
            .prop_filter("NaN never compares equal", |f| !f.is_nan())
            .prop_map(ProgramValue::Float),
        bytes(64).prop_map(ProgramValue::Bytes),
    ]
}

fn program_value() -> impl Strategy<Value = ProgramValue> {
    let key = prop_oneof![
        any::<i64>().prop_map(ProgramValue::Int),
        bytes(16).prop_map(ProgramValue::Bytes),
    ];
    prop_oneof![
        Just(ProgramValue::Nil),
        program_scalar(),
        vec((key, program_scalar()), 0..8).prop_map(ProgramValue::Table),
    ]
}

fn run_outcome() -> impl Strategy<Value = RunOutcome> {
    select(vec![
        RunOutcome::Ok,
        RunOutcome::Error,
        RunOutcome::Fuel,
        RunOutcome::Memory,
    ])
}

/// A step's answer as a server may send it: `failed` at most `programs`,
/// and a first failure exactly when `failed` > 0.
fn step_reply() -> impl Strategy<Value = StepReply> {
    let failed_outcome = select(vec![
        RunOutcome::Error,
        RunOutcome::Fuel,
        RunOutcome::Memory,
    ]);
    let failure = (coord(), any::<u64>(), failed_outcome, "\\PC{0,100}").prop_map(
        |(coord, seq, outcome, message)| StepFailure {
            coord,
            seq,
            outcome,
            message,
        },
    );
    (
        any::<u64>(),
        prop_oneof![Just(0u32), Just(1), Just(u32::MAX), any::<u32>()],
        any::<u32>(),
        any::<u32>(),
        any::<u64>(),
        proptest::option::of(failure),
    )
        .prop_map(
            |(lsn, programs, failed_raw, cells_written, instructions, first_failure)| {
                let (programs, failed) = match first_failure {
                    None => (programs, 0),
                    Some(_) => {
                        let programs = programs.max(1);
                        (programs, 1 + failed_raw % programs)
                    }
                };
                StepReply {
                    lsn,
                    programs,
                    failed,
                    cells_written,
                    instructions,
                    first_failure,
                }
            },
        )
}

fn program_response() -> impl Strategy<Value = Response> {
    let outcome = run_outcome();
    let record = (any::<[u64; 4]>(), any::<u32>(), outcome, "\\PC{0,100}").prop_map(
        |([seq, started_unix_us, duration_ns, instructions], cells_written, outcome, message)| {
            RunRecord {
                seq,
                started_unix_us,
                duration_ns,
                instructions,
                cells_written,
                outcome,
                message,
            }
        },
    );
    prop_oneof![
        (any::<u64>(), any::<bool>()).prop_map(|(lsn, replaced)| Response::Prog { lsn, replaced }),
        (any::<[u64; 3]>(), any::<u32>(), program_value()).prop_map(
            |([lsn, seq, instructions], cells_written, value)| Response::Run(RunReply {
                lsn,
                seq,
                instructions,
                cells_written,
                value,
            })
        ),
        (
            proptest::option::of(any::<u32>()),
            any::<u64>(),
            any::<u64>(),
            vec(record, 0..6)
        )
            .prop_map(|(program_bytes, runs, failures, records)| {
                Response::CellStats(CellStats {
                    program_bytes,
                    runs,
                    failures,
                    records,
                })
            }),
        step_reply().prop_map(Response::Step),
    ]
}

// Namespaces (opcodes 0x0030-0x0035).

fn quota() -> impl Strategy<Value = Option<u64>> {
    proptest::option::of(prop_oneof![Just(0u64), Just(u64::MAX), any::<u64>()])
}

fn namespace_spec() -> impl Strategy<Value = NamespaceSpec> {
    (
        select(vec![
            CurveChoice::ServerDefault,
            CurveChoice::Morton,
            CurveChoice::Hilbert,
        ]),
        quota(),
        quota(),
        quota(),
        any::<bool>(),
    )
        .prop_map(
            |(curve, max_cells, max_bytes, max_edges, encrypted)| NamespaceSpec {
                curve,
                max_cells,
                max_bytes,
                max_edges,
                encrypted,
            },
        )
}

fn namespace_request() -> impl Strategy<Value = Request> {
    prop_oneof![
        (namespace(), namespace_spec()).prop_map(|(ns, spec)| Request::NsCreate { ns, spec }),
        namespace().prop_map(|ns| Request::NsDrop { ns }),
        Just(Request::NsList),
        namespace().prop_map(|ns| Request::NsInfo { ns }),
        (namespace(), any::<u32>(), any::<bool>())
            .prop_map(|(ns, uid, read_only)| { Request::NsGrant { ns, uid, read_only } }),
        (namespace(), any::<u32>()).prop_map(|(ns, uid)| Request::NsRevoke { ns, uid }),
    ]
}

/// A namespace description as the daemon sends it: a real curve (never
/// the server-default request value), up to a few dozen grants.
fn namespace_info() -> impl Strategy<Value = NamespaceInfo> {
    let grant = (any::<u32>(), any::<bool>())
        .prop_map(|(uid, read_only)| NamespaceGrant { uid, read_only });
    (
        (
            namespace(),
            any::<u64>(),
            select(vec![CurveChoice::Morton, CurveChoice::Hilbert]),
            any::<bool>(),
            any::<u32>(),
        ),
        any::<[u64; 4]>(),
        (quota(), quota(), quota()),
        vec(grant, 0..40),
    )
        .prop_map(
            |(
                (name, id, curve, encrypted, owner_uid),
                [cells, bytes, edges, programs],
                (max_cells, max_bytes, max_edges),
                grants,
            )| NamespaceInfo {
                name,
                id,
                curve,
                encrypted,
                owner_uid,
                cells,
                bytes,
                edges,
                programs,
                max_cells,
                max_bytes,
                max_edges,
                grants,
            },
        )
}

fn namespace_response() -> impl Strategy<Value = Response> {
    prop_oneof![
        namespace_info().prop_map(Response::NsCreated),
        namespace_info().prop_map(Response::NsInfo),
        namespace_info().prop_map(Response::NsGranted),
        namespace_info().prop_map(Response::NsRevoked),
        (any::<u64>(), any::<u64>()).prop_map(|(lsn, cells)| Response::NsDropped { lsn, cells }),
        vec(namespace(), 0..16).prop_map(Response::NsList),
    ]
}

// Import and export (opcodes 0x0014, 0x0026, 0x0043).

fn batch_op() -> impl Strategy<Value = cube_protocol::BatchOp> {
    use cube_protocol::BatchOp;
    prop_oneof![
        (coord(), bytes(256)).prop_map(|(coord, value)| BatchOp::Put { coord, value }),
        (coord(), coord(), edge_label(), float()).prop_map(|(from, to, label, weight)| {
            BatchOp::Link {
                from,
                to,
                label,
                weight,
            }
        }),
        (coord(), bytes(256)).prop_map(|(coord, source)| BatchOp::Prog { coord, source }),
    ]
}

fn bulk_request() -> impl Strategy<Value = Request> {
    prop_oneof![
        (namespace(), vec(batch_op(), 0..24)).prop_map(|(ns, ops)| Request::Batch { ns, ops }),
        (
            namespace(),
            any::<u32>(),
            proptest::option::of(any::<u64>())
        )
            .prop_map(|(ns, limit, after)| Request::EdgeList { ns, limit, after }),
        (namespace(), any::<u32>(), proptest::option::of(coord()))
            .prop_map(|(ns, limit, after)| Request::ProgramList { ns, limit, after }),
    ]
}

fn bulk_response() -> impl Strategy<Value = Response> {
    use cube_protocol::{EdgePage, ListedEdge, ListedProgram, ProgramPage};
    let edge = (coord(), coord(), edge_label(), float()).prop_map(|(from, to, label, weight)| {
        ListedEdge {
            from,
            to,
            label,
            weight,
        }
    });
    let program = (coord(), bytes(256)).prop_map(|(coord, source)| ListedProgram { coord, source });
    prop_oneof![
        (any::<u64>(), any::<u32>()).prop_map(|(lsn, applied)| Response::Batch { lsn, applied }),
        (vec(edge, 0..16), proptest::option::of(any::<u64>())).prop_map(|(edges, resume_after)| {
            Response::EdgeList(EdgePage {
                edges,
                resume_after,
            })
        }),
        (vec(program, 0..8), proptest::option::of(coord())).prop_map(|(programs, resume_after)| {
            Response::ProgramList(ProgramPage {
                programs,
                resume_after,
            })
        }),
    ]
}

fn error_code() -> impl Strategy<Value = u16> {
    prop_oneof![
        // Every known code...
        (1u16..=27).prop_map(|c| ErrorCode::from_u16(c).unwrap() as u16),
        // ...and codes this build does not know, which must survive as raw numbers.
        any::<u16>(),
    ]
}

fn request_opcode() -> impl Strategy<Value = u16> {
    prop_oneof![
        select(Opcode::ALL.to_vec()).prop_map(|op| op as u16),
        Just(0u16),
        any::<u16>(),
    ]
}

/// Anything that can be put on the wire.
#[derive(Clone, Debug, PartialEq)]
enum Msg {
    Req(Request),
    Resp(Response),
    Err { opcode: u16, error: ServerError },
}

fn msg() -> impl Strategy<Value = Msg> {
    prop_oneof![
        request().prop_map(Msg::Req),
        response().prop_map(Msg::Resp),
        (request_opcode(), error_code(), "\\PC{0,200}").prop_map(|(opcode, code, message)| {
            Msg::Err {
                // The response bit is always set on the wire; keep the raw
                // request opcode here so decoding gives back the same value.
                opcode: opcode & !RESPONSE_BIT,
                error: ServerError { code, message },
            }
        }),
    ]
}

impl Msg {
    fn encode(&self, request_id: u64, out: &mut Vec<u8>) {
        match self {
            Msg::Req(r) => r.encode(request_id, out),
            Msg::Resp(r) => r.encode(request_id, out),
            Msg::Err { opcode, error } => Response::encode_error(*opcode, request_id, error, out),
        }
    }

    fn to_frame(&self, request_id: u64) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(request_id, &mut out);
        out
    }

    fn expected_opcode(&self) -> u16 {
        match self {
            Msg::Req(r) => r.opcode() as u16,
            Msg::Resp(r) => r.opcode() as u16 | RESPONSE_BIT,
            Msg::Err { opcode, .. } => opcode | RESPONSE_BIT,
        }
    }

    /// Decodes a body as the same kind of message this one is.
    fn decode_like(&self, header: &FrameHeader, body: &[u8]) -> Result<Msg, DecodeError> {
        let limits = Limits::default();
        match self {
            Msg::Req(_) => Request::decode(header, body, &limits).map(Msg::Req),
            Msg::Resp(_) | Msg::Err { .. } => {
                Response::decode(header, body, &limits).map(|r| match r {
                    Ok(resp) => Msg::Resp(resp),
                    Err(error) => Msg::Err {
                        opcode: header.opcode & !RESPONSE_BIT,
                        error,
                    },
                })
            }
        }
    }
}

/// `cases` per property, unless `PROPTEST_CASES` asks for more (`make check`
/// does: the rare damaged bodies show only in many cases).
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases: cases_from_env().map_or(cases, |asked| asked.max(cases)),
        ..ProptestConfig::default()
    }
}

fn cases_from_env() -> Option<u32> {
    std::env::var("PROPTEST_CASES").ok()?.parse().ok()
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Wraps `encode_frame` so tests can build a frame with a correct checksum
/// around any body bytes.
fn frame_around(opcode: u16, request_id: u64, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    frame::encode_frame(&mut out, opcode, request_id, |b| b.extend_from_slice(body));
    out
}

fn header_of(frame: &[u8]) -> FrameHeader {
    FrameHeader::parse(frame[..HEADER_BYTES].try_into().unwrap())
}

/// If a decoder accepted `body`, re-encoding what it produced must give the
/// same bytes back: the decoder accepts exactly one encoding per message, so
/// nothing it lets through can be misread.
fn assert_canonical(header: &FrameHeader, body: &[u8], limits: &Limits) {
    if let Ok(req) = Request::decode(header, body, limits) {
        let mut out = Vec::new();
        req.encode(header.request_id, &mut out);
        assert_eq!(
            &out[HEADER_BYTES..],
            body,
            "request {req:?} re-encodes differently"
        );
        assert_eq!(header_of(&out).opcode, header.opcode);
        if let Request::Put { value, .. } = &req {
            assert!(value.len() <= limits.max_value_bytes as usize);
        }
        if let Request::Mget { coords, .. } = &req {
            assert!((1..=cube_protocol::MAX_MGET_CELLS as usize).contains(&coords.len()));
        }
    }
    match Response::decode(header, body, limits) {
        Ok(Ok(resp)) => {
            let mut out = Vec::new();
            resp.encode(header.request_id, &mut out);
            assert_eq!(
                &out[HEADER_BYTES..],
                body,
                "response {resp:?} re-encodes differently"
            );
            assert_eq!(header_of(&out).opcode, header.opcode);
            if let Response::Get(Some(value)) = &resp {
                assert!(value.len() <= limits.max_value_bytes as usize);
            }
            if let Response::Mget(values) = &resp {
                assert!(values.len() <= cube_protocol::MAX_MGET_CELLS as usize);
                for value in values.iter().flatten() {
                    assert!(value.len() <= limits.max_value_bytes as usize);
                }
            }
        }
        Ok(Err(error)) => {
            let mut out = Vec::new();
            Response::encode_error(header.opcode, header.request_id, &error, &mut out);
            assert_eq!(
                &out[HEADER_BYTES..],
                body,
                "error {error:?} re-encodes differently"
            );
        }
        Err(_) => {}
    }
}

/// Every message kind, drawn deterministically until each request and
/// response opcode (and an error answer) has been seen `PER_KIND` times; then
/// every single byte of each body is set to each of its 255 other values.
/// Each changed body must be refused or re-encode to exactly itself: a field
/// the decoder reads and then ignores (or normalises) shows here on every run,
/// not one run in twenty as in the random property above.
#[test]
fn every_single_byte_change_is_refused_or_canonical() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    use std::collections::HashMap;

    const PER_KIND: usize = 3;
    /// Fixed fields sit at both ends of a body; the middle of a long value is
    /// opaque bytes, so only every 127th byte of it is changed.
    const EDGE_BYTES: usize = 48;
    let per_kind = cases_from_env().map_or(PER_KIND, |cases| (cases as usize / 512).max(PER_KIND));
    let mut runner = TestRunner::deterministic();
    let strategy = msg();
    let mut seen: HashMap<u16, usize> = HashMap::new();
    let wanted = Opcode::ALL.len() * 2 + 1;
    for _ in 0..200_000 {
        let enough = seen.len() == wanted && seen.values().all(|n| *n >= per_kind);
        if enough {
            break;
        }
        let msg = strategy.new_tree(&mut runner).unwrap().current();
        let kind = match &msg {
            Msg::Err { .. } => 0xffff,
            other => other.expected_opcode(),
        };
        let count = seen.entry(kind).or_default();
        if *count >= per_kind {
            continue;
        }
        *count += 1;
        let frame = msg.to_frame(7);
        let header = header_of(&frame);
        let body = &frame[HEADER_BYTES..];
        for at in (0..body.len())
            .filter(|&i| i < EDGE_BYTES || i + EDGE_BYTES >= body.len() || i % 127 == 0)
        {
            let mut changed = body.to_vec();
            for delta in 1..=255u8 {
                changed[at] = body[at].wrapping_add(delta);
                let header = FrameHeader {
                    body_len: changed.len() as u32,
                    ..header
                };
                assert_canonical(&header, &changed, &Limits::default());
            }
        }
    }
    let missing: Vec<_> = Opcode::ALL
        .iter()
        .flat_map(|op| [*op as u16, *op as u16 | RESPONSE_BIT])
        .filter(|op| seen.get(op).is_none_or(|n| *n < per_kind))
        .collect();
    assert!(
        missing.is_empty(),
        "the strategies never drew opcodes {missing:04x?}"
    );
}

/// The case the random property found one run in twenty: cell stats with no
/// program and a non-zero program size. It is refused by name.
#[test]
fn cell_stats_without_program_must_say_size_zero() {
    let stats = Response::CellStats(CellStats {
        program_bytes: None,
        runs: 3,
        failures: 1,
        records: Vec::new(),
    });
    let mut frame = Vec::new();
    stats.encode(9, &mut frame);
    let mut body = frame[HEADER_BYTES..].to_vec();
    assert_eq!(
        &body[..5],
        &[0, 0, 0, 0, 0],
        "has_program = 0, program_bytes = 0"
    );
    body[1] = 5;
    let header = FrameHeader {
        body_len: body.len() as u32,
        ..header_of(&frame)
    };
    let err = Response::decode(&header, &body, &Limits::default()).unwrap_err();
    assert!(
        matches!(err, DecodeError::BadField { got: 5, .. }),
        "{err:?}"
    );
}

/// A reader that hands out its bytes in irregular pieces, sometimes fails
/// with `Interrupted` (which `read_frame` must retry), and counts what it
/// gave away.
struct ChoppyReader {
    data: Vec<u8>,
    pos: usize,
    chunks: Vec<usize>,
    calls: usize,
    interrupt_every: usize,
}

impl ChoppyReader {
    fn new(data: Vec<u8>, chunks: Vec<usize>, interrupt_every: usize) -> ChoppyReader {
        ChoppyReader {
            data,
            pos: 0,
            chunks,
            calls: 0,
            interrupt_every,
        }
    }
}

impl Read for ChoppyReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.calls += 1;
        if self.interrupt_every > 0 && self.calls.is_multiple_of(self.interrupt_every) {
            return Err(io::ErrorKind::Interrupted.into());
        }
        let chunk = self.chunks[self.calls % self.chunks.len()].max(1);
        let n = chunk.min(buf.len()).min(self.data.len() - self.pos);
        buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

// ---------------------------------------------------------------------------
// (a) Decoders never panic, and never trust a length field
// ---------------------------------------------------------------------------

fn any_limits() -> impl Strategy<Value = Limits> {
    prop_oneof![
        Just(Limits::default()),
        (0u32..4096).prop_map(|max_value_bytes| Limits {
            max_value_bytes,
            ..Limits::default()
        }),
        Just(Limits {
            max_frame_bytes: u32::MAX,
            max_value_bytes: u32::MAX,
        }),
    ]
}

fn any_opcode() -> impl Strategy<Value = u16> {
    prop_oneof![
        select(Opcode::ALL.to_vec()).prop_map(|op| op as u16),
        select(Opcode::ALL.to_vec()).prop_map(|op| op as u16 | RESPONSE_BIT),
        Just(RESPONSE_BIT),
        any::<u16>(),
    ]
}

/// A damaging edit to a body.
#[derive(Clone, Debug)]
enum Edit {
    Xor(Index, u8),
    Set(Index, u8),
    Truncate(Index),
    Insert(Index, u8),
    Append(Vec<u8>),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<Index>(), 1u8..).prop_map(|(i, x)| Edit::Xor(i, x)),
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Edit::Set(i, b)),
        any::<Index>().prop_map(Edit::Truncate),
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Edit::Insert(i, b)),
        vec(any::<u8>(), 1..8).prop_map(Edit::Append),
    ]
}

fn apply(body: &mut Vec<u8>, edit: &Edit) {
    match edit {
        Edit::Xor(i, x) if !body.is_empty() => {
            let i = i.index(body.len());
            body[i] ^= x;
        }
        Edit::Set(i, b) if !body.is_empty() => {
            let i = i.index(body.len());
            body[i] = *b;
        }
        Edit::Truncate(i) => {
            let len = i.index(body.len() + 1);
            body.truncate(len);
        }
        Edit::Insert(i, b) => {
            let i = i.index(body.len() + 1);
            body.insert(i, *b);
        }
        Edit::Append(bytes) => body.extend_from_slice(bytes),
        Edit::Xor(..) | Edit::Set(..) => {}
    }
}

proptest! {
    #![proptest_config(config(512))]

    /// Random headers (any opcode, any version, any length/checksum fields)
    /// with random bodies: both decoders return, and whatever they accept is
    /// the one canonical encoding of what they returned.
    #[test]
    fn decoders_never_panic_on_arbitrary_bodies(
        opcode in any_opcode(),
        version in any::<u16>(),
        body_len in any::<u32>(),
        body_crc32c in any::<u32>(),
        request_id in any::<u64>(),
        body in bytes(4096),
        limits in any_limits(),
    ) {
        let header = FrameHeader { body_len, body_crc32c, version, opcode, request_id };
        let _ = header.verify_body(&body);
        let _ = Request::decode(&header, &body, &limits);
        let _ = Response::decode(&header, &body, &limits);
        assert_canonical(&header, &body, &limits);
    }

    /// Random bytes rarely get past the first field, so also damage valid
    /// bodies (flip, overwrite, cut, insert, append) and decode them under
    /// every opcode: the decoders reach their deep paths and still never
    /// panic or accept a non-canonical body.
    #[test]
    fn decoders_never_panic_on_damaged_valid_bodies(
        msg in msg(),
        edits in vec(edit(), 1..4),
        opcode in any_opcode(),
        limits in any_limits(),
    ) {
        let frame = msg.to_frame(7);
        let mut body = frame[HEADER_BYTES..].to_vec();
        for e in &edits {
            apply(&mut body, e);
        }
        for op in [header_of(&frame).opcode, opcode] {
            let header = FrameHeader { opcode: op, ..header_of(&frame) };
            let _ = Request::decode(&header, &body, &limits);
            let _ = Response::decode(&header, &body, &limits);
            assert_canonical(&header, &body, &limits);
        }
    }

    /// A length field claiming up to 4 GiB inside a tiny body is refused at
    /// once (Truncated, TooLarge or TooMany), never allocated and never read past.
    #[test]
    fn huge_length_fields_in_tiny_bodies_fail_fast(
        claim in prop_oneof![Just(u32::MAX), Just(1u32 << 31), 2048u32..],
        tail in vec(any::<u8>(), 0..16),
        limits in any_limits(),
    ) {
        for (opcode, body) in hostile_bodies(claim, &tail) {
            let header = FrameHeader {
                body_len: body.len() as u32,
                body_crc32c: 0,
                version: PROTOCOL_VERSION,
                opcode,
                request_id: 1,
            };
            let started = Instant::now();
            let request = Request::decode(&header, &body, &limits);
            let response = Response::decode(&header, &body, &limits);
            prop_assert!(started.elapsed() < Duration::from_secs(1), "decode was slow");
            let err = if opcode & RESPONSE_BIT == 0 {
                request.unwrap_err()
            } else {
                response.unwrap_err()
            };
            prop_assert!(
                matches!(
                    err,
                    DecodeError::Truncated { .. }
                        | DecodeError::TooLarge { .. }
                        | DecodeError::TooMany { .. }
                ),
                "opcode {opcode:#06x}: {err:?}"
            );
        }
    }
}

/// Bodies whose one length field (`u32` blob, `u16` string or count, `u8`
/// namespace) claims far more than the few bytes that follow it.
fn hostile_bodies(claim: u32, tail: &[u8]) -> Vec<(u16, Vec<u8>)> {
    let short = claim.clamp(300, u32::from(u16::MAX)) as u16;
    let ns_default = {
        let mut b = vec![7u8];
        b.extend_from_slice(b"default");
        b
    };
    let coord = [0u8; 12];
    let with_tail = |mut b: Vec<u8>| {
        b.extend_from_slice(tail);
        b
    };
    let mut out = Vec::new();
    // put: value length
    let mut put = ns_default.clone();
    put.extend_from_slice(&coord);
    put.extend_from_slice(&claim.to_le_bytes());
    out.push((Opcode::Put as u16, with_tail(put)));
    // put/get/del: namespace length 255 (more than the tail holds, unless it
    // is all there, which the tail never is)
    out.push((Opcode::Get as u16, with_tail(vec![255])));
    // hello: client name length
    let mut hello = 1u16.to_le_bytes().to_vec();
    hello.extend_from_slice(&short.to_le_bytes());
    out.push((Opcode::Hello as u16, with_tail(hello)));
    // get response: found, value length
    let mut get = vec![0u8, 1];
    get.extend_from_slice(&claim.to_le_bytes());
    out.push((Opcode::Get as u16 | RESPONSE_BIT, with_tail(get)));
    // hello response: server version length
    let mut hello_resp = vec![0u8];
    hello_resp.extend_from_slice(&1u16.to_le_bytes());
    hello_resp.extend_from_slice(&short.to_le_bytes());
    out.push((Opcode::Hello as u16 | RESPONSE_BIT, with_tail(hello_resp)));
    // stats response: entry count (4096 is allowed but the body is tiny;
    // anything above is over the limit)
    for count in [MAX_STATS_ENTRIES as u16, short] {
        let mut stats = vec![0u8];
        stats.extend_from_slice(&count.to_le_bytes());
        out.push((Opcode::Stats as u16 | RESPONSE_BIT, stats));
    }
    // stats response: one text entry with a long text length
    let mut text = vec![0u8];
    text.extend_from_slice(&1u16.to_le_bytes());
    text.extend_from_slice(&1u16.to_le_bytes());
    text.push(b'n');
    text.push(2);
    text.extend_from_slice(&short.to_le_bytes());
    out.push((Opcode::Stats as u16 | RESPONSE_BIT, with_tail(text)));
    // ns-list response: a name count far beyond the names present
    let mut list = vec![0u8];
    list.extend_from_slice(&claim.to_le_bytes());
    out.push((Opcode::NsList as u16 | RESPONSE_BIT, with_tail(list)));
    // ns-info response: the most grants allowed, but a tiny body
    let mut info = vec![0u8, 1, b'q'];
    info.extend_from_slice(&1u64.to_le_bytes());
    info.extend_from_slice(&[1, 0]);
    info.extend_from_slice(&[0u8; 4 + 32]);
    info.extend_from_slice(&256u16.to_le_bytes());
    out.push((Opcode::NsInfo as u16 | RESPONSE_BIT, with_tail(info)));
    // mget: a cell count over the limit, or within it but far beyond the
    // coordinates present
    for count in [claim.max(cube_protocol::MAX_MGET_CELLS + 1), 4096] {
        let mut mget = ns_default.clone();
        mget.extend_from_slice(&count.to_le_bytes());
        out.push((Opcode::Mget as u16, with_tail(mget)));
    }
    // mget response: a cell count; then one present value with a long length
    let mut mget_resp = vec![0u8];
    mget_resp.extend_from_slice(&claim.to_le_bytes());
    out.push((Opcode::Mget as u16 | RESPONSE_BIT, with_tail(mget_resp)));
    let mut mget_value = vec![0u8];
    mget_value.extend_from_slice(&1u32.to_le_bytes());
    mget_value.push(1);
    mget_value.extend_from_slice(&claim.to_le_bytes());
    out.push((Opcode::Mget as u16 | RESPONSE_BIT, with_tail(mget_value)));
    // error response: message length
    let mut err = vec![1u8];
    err.extend_from_slice(&(ErrorCode::Internal as u16).to_le_bytes());
    err.extend_from_slice(&short.to_le_bytes());
    out.push((RESPONSE_BIT, with_tail(err)));
    out
}

#[test]
fn four_gib_value_length_is_refused_by_the_value_limit() {
    let mut body = vec![7u8];
    body.extend_from_slice(b"default");
    body.extend_from_slice(&[0u8; 12]);
    body.extend_from_slice(&u32::MAX.to_le_bytes());
    body.extend_from_slice(b"abc");
    let header = FrameHeader {
        body_len: body.len() as u32,
        body_crc32c: 0,
        version: PROTOCOL_VERSION,
        opcode: Opcode::Put as u16,
        request_id: 1,
    };
    let err = Request::decode(&header, &body, &Limits::default()).unwrap_err();
    assert_eq!(
        err,
        DecodeError::TooLarge {
            what: "value",
            got: u64::from(u32::MAX),
            limit: u64::from(Limits::DEFAULT_MAX_VALUE_BYTES),
        }
    );
    assert_eq!(err.code(), ErrorCode::ValueTooLarge);

    // Even with no value limit at all, the claim is checked against what is
    // actually present before anything is allocated.
    let unlimited = Limits {
        max_frame_bytes: u32::MAX,
        max_value_bytes: u32::MAX,
    };
    let err = Request::decode(&header, &body, &unlimited).unwrap_err();
    assert_eq!(
        err,
        DecodeError::Truncated {
            offset: 24,
            needed: u32::MAX as usize - 3,
        }
    );
}

#[test]
fn damaged_namespaces_are_bad_namespace() {
    for name in [&b""[..], b"Upper", b"a b", b"\xff\xfe", &[b'a'; 65]] {
        let mut body = vec![name.len() as u8];
        body.extend_from_slice(name);
        body.extend_from_slice(&[0u8; 12]);
        let header = FrameHeader {
            body_len: body.len() as u32,
            body_crc32c: 0,
            version: PROTOCOL_VERSION,
            opcode: Opcode::Get as u16,
            request_id: 1,
        };
        let err = Request::decode(&header, &body, &Limits::default()).unwrap_err();
        assert_eq!(err.code(), ErrorCode::BadNamespace, "{name:?}: {err:?}");
    }
}

/// A `step` response body (status 0 first) with the given counts and,
/// after the presence byte `has_failure`, `failure` as raw bytes.
fn step_body(programs: u32, failed: u32, has_failure: u8, failure: &[u8]) -> Vec<u8> {
    let mut body = vec![0u8];
    body.extend_from_slice(&7u64.to_le_bytes());
    body.extend_from_slice(&programs.to_le_bytes());
    body.extend_from_slice(&failed.to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes());
    body.extend_from_slice(&0u64.to_le_bytes());
    body.push(has_failure);
    body.extend_from_slice(failure);
    body
}

/// A first failure at (1, 2, 3), run 9, with `outcome` and `message`.
fn step_failure_bytes(outcome: u8, message: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    for v in [1i32, 2, 3] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b.extend_from_slice(&9u64.to_le_bytes());
    b.push(outcome);
    b.extend_from_slice(&(message.len() as u16).to_le_bytes());
    b.extend_from_slice(message);
    b
}

#[test]
fn step_replies_that_contradict_themselves_are_malformed() {
    let decode = |body: &[u8]| {
        let header = FrameHeader {
            body_len: body.len() as u32,
            body_crc32c: 0,
            version: PROTOCOL_VERSION,
            opcode: Opcode::Step as u16 | RESPONSE_BIT,
            request_id: 1,
        };
        Response::decode(&header, body, &Limits::default())
    };
    let boom = step_failure_bytes(RunOutcome::Error as u8, b"boom");
    // The well-formed shapes decode.
    let ok = decode(&step_body(3, 1, 1, &boom)).unwrap().unwrap();
    let Response::Step(reply) = ok else {
        panic!("not a step reply: {ok:?}")
    };
    assert_eq!(
        reply.first_failure,
        Some(StepFailure {
            coord: Coord::new(1, 2, 3),
            seq: 9,
            outcome: RunOutcome::Error,
            message: "boom".to_owned(),
        })
    );
    assert!(decode(&step_body(0, 0, 0, &[])).unwrap().is_ok());
    assert!(
        decode(&step_body(u32::MAX, u32::MAX, 1, &boom))
            .unwrap()
            .is_ok()
    );
    let longest = step_failure_bytes(RunOutcome::Fuel as u8, &[b'm'; 512]);
    assert!(decode(&step_body(1, 1, 1, &longest)).unwrap().is_ok());
    // More failures than programs.
    assert!(decode(&step_body(2, 3, 1, &boom)).is_err());
    // A failure without a failed run, and failed runs without a failure.
    assert!(decode(&step_body(2, 0, 1, &boom)).is_err());
    assert!(decode(&step_body(2, 1, 0, &[])).is_err());
    // A presence byte that is not a bool.
    assert!(decode(&step_body(2, 1, 2, &boom)).is_err());
    // An outcome out of range, or "ok" for a failure; a message over 512
    // bytes or not UTF-8.
    assert!(decode(&step_body(2, 1, 1, &step_failure_bytes(4, b"x"))).is_err());
    let ok_failure = step_failure_bytes(RunOutcome::Ok as u8, b"x");
    assert!(decode(&step_body(2, 1, 1, &ok_failure)).is_err());
    let long = step_failure_bytes(RunOutcome::Error as u8, &[b'm'; 513]);
    assert!(decode(&step_body(2, 1, 1, &long)).is_err());
    let bad_utf8 = step_failure_bytes(RunOutcome::Error as u8, b"\xff");
    assert!(decode(&step_body(2, 1, 1, &bad_utf8)).is_err());
    // Bytes after the reply.
    let mut trailing = step_body(0, 0, 0, &[]);
    trailing.push(0);
    assert!(decode(&trailing).is_err());
    for body in [
        step_body(2, 3, 1, &boom),
        step_body(2, 0, 1, &boom),
        step_body(2, 1, 0, &[]),
    ] {
        let err = decode(&body).unwrap_err();
        assert_eq!(err.code(), ErrorCode::MalformedFrame, "{err:?}");
    }
}

#[test]
fn unknown_opcodes_are_unknown_opcode() {
    for raw in [0u16, 0x0006, 0x0017, 0x7fff, 0x8001, 0xffff] {
        let header = FrameHeader {
            body_len: 0,
            body_crc32c: 0,
            version: PROTOCOL_VERSION,
            opcode: raw,
            request_id: 1,
        };
        let err = Request::decode(&header, &[], &Limits::default()).unwrap_err();
        assert_eq!(err, DecodeError::UnknownOpcode(raw));
        assert_eq!(err.code(), ErrorCode::UnknownOpcode);
    }
}

// ---------------------------------------------------------------------------
// (b) read_frame on arbitrary streams
// ---------------------------------------------------------------------------

/// A stream that is either pure noise or a plausible header (with a body
/// length that is small, around the limit or huge) followed by noise.
fn stream() -> impl Strategy<Value = Vec<u8>> {
    let header_then_noise = (
        prop_oneof![0u32..64, 0u32..8192, any::<u32>()],
        any::<[u8; 16]>(),
        bytes(4096),
    )
        .prop_map(|(body_len, rest_of_header, noise)| {
            let mut s = body_len.to_le_bytes().to_vec();
            s.extend_from_slice(&rest_of_header);
            s.extend_from_slice(&noise);
            s
        });
    prop_oneof![bytes(4096), header_then_noise]
}

proptest! {
    #![proptest_config(config(512))]

    /// `read_frame` over any byte stream, delivered in any pieces: it never
    /// panics, never takes more than one frame's bytes from the reader per
    /// call, refuses an oversized frame after its header alone, and hands
    /// back exactly the body bytes the header announced.
    #[test]
    fn read_frame_never_panics_or_reads_past_the_limit(
        data in stream(),
        max_frame_bytes in prop_oneof![0u32..64, 0u32..8192],
        chunks in vec(1usize..64, 1..8),
        interrupt_every in prop_oneof![Just(0usize), 2usize..5],
    ) {
        let limits = Limits { max_frame_bytes, ..Limits::default() };
        let mut reader = ChoppyReader::new(data.clone(), chunks, interrupt_every);
        let mut body = Vec::new();
        loop {
            let start = reader.pos;
            let result = read_frame(&mut reader, &limits, &mut body);
            let taken = reader.pos - start;
            prop_assert!(
                taken <= HEADER_BYTES.max(max_frame_bytes as usize),
                "read {taken} bytes for one frame with a limit of {max_frame_bytes}"
            );
            prop_assert!(body.capacity() <= 2 * max_frame_bytes as usize + 64);
            match result {
                Ok(header) => {
                    prop_assert!(header.frame_bytes() <= u64::from(max_frame_bytes));
                    prop_assert_eq!(body.len(), header.body_len as usize);
                    prop_assert_eq!(taken, HEADER_BYTES + body.len());
                    prop_assert_eq!(&body[..], &data[start + HEADER_BYTES..reader.pos]);
                }
                Err(ProtocolError::FrameTooLarge { got, limit }) => {
                    prop_assert_eq!(taken, HEADER_BYTES, "no body byte read");
                    prop_assert!(got > limit);
                    prop_assert_eq!(limit, u64::from(max_frame_bytes));
                    break;
                }
                Err(ProtocolError::TruncatedFrame { got, expected }) => {
                    prop_assert_eq!(reader.pos, data.len());
                    prop_assert_eq!(got, taken);
                    prop_assert!(got < expected);
                    break;
                }
                Err(ProtocolError::Closed) => {
                    prop_assert_eq!(start, data.len());
                    break;
                }
                Err(other) => prop_assert!(false, "unexpected {other:?}"),
            }
        }
    }
}

#[test]
fn default_limit_is_sixteen_mib_including_the_header() {
    let limits = Limits::default();
    assert_eq!(limits.max_frame_bytes, 16 * 1024 * 1024);
    assert_eq!(limits.max_value_bytes, 1024 * 1024);
    let largest_body = limits.max_frame_bytes - HEADER_BYTES as u32;
    for (body_len, too_large) in [(largest_body, false), (largest_body + 1, true)] {
        let header = FrameHeader {
            body_len,
            body_crc32c: 0,
            version: PROTOCOL_VERSION,
            opcode: Opcode::Ping as u16,
            request_id: 1,
        };
        let mut reader = ChoppyReader::new(header.to_bytes().to_vec(), vec![4096], 0);
        let mut body = Vec::new();
        let err = read_frame(&mut reader, &limits, &mut body).unwrap_err();
        if too_large {
            assert!(
                matches!(err, ProtocolError::FrameTooLarge { .. }),
                "{err:?}"
            );
            assert_eq!(err.code(), ErrorCode::FrameTooLarge);
            assert_eq!(body.capacity(), 0, "nothing allocated for a refused frame");
        } else {
            assert!(
                matches!(err, ProtocolError::TruncatedFrame { .. }),
                "{err:?}"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// (c) Round trips
// ---------------------------------------------------------------------------

fn round_trip(msg: &Msg, request_id: u64) -> Result<(), TestCaseError> {
    let frame = msg.to_frame(request_id);
    let mut reader = &frame[..];
    let mut body = Vec::new();
    let header = read_frame(&mut reader, &Limits::default(), &mut body).unwrap();
    prop_assert!(reader.is_empty(), "the frame is exactly header + body");
    prop_assert_eq!(header.version, PROTOCOL_VERSION);
    prop_assert_eq!(header.request_id, request_id);
    prop_assert_eq!(header.opcode, msg.expected_opcode());
    prop_assert_eq!(header.body_len as usize, frame.len() - HEADER_BYTES);
    header.verify_body(&body).unwrap();
    let decoded = msg.decode_like(&header, &body).unwrap();
    prop_assert_eq!(&decoded, msg);
    Ok(())
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn every_request_round_trips(req in request(), request_id in any::<u64>()) {
        round_trip(&Msg::Req(req), request_id)?;
    }

    #[test]
    fn every_response_round_trips(resp in response(), request_id in any::<u64>()) {
        round_trip(&Msg::Resp(resp), request_id)?;
    }

    #[test]
    fn every_error_response_round_trips(
        opcode in request_opcode(),
        code in error_code(),
        message in "\\PC{0,200}",
        request_id in any::<u64>(),
    ) {
        let msg = Msg::Err { opcode: opcode & !RESPONSE_BIT, error: ServerError { code, message } };
        round_trip(&msg, request_id)?;
    }

}

proptest! {
    #![proptest_config(config(256))]

    /// Pipelined frames on one stream come back one by one, in order, and the
    /// stream then reports a clean close.
    #[test]
    fn pipelined_frames_read_back_in_order(msgs in vec(msg(), 1..8), first_id in any::<u64>()) {
        let mut stream = Vec::new();
        for (i, m) in msgs.iter().enumerate() {
            m.encode(first_id.wrapping_add(i as u64), &mut stream);
        }
        let mut reader = ChoppyReader::new(stream, vec![1, 7, 100, 3], 3);
        let mut body = Vec::new();
        for (i, m) in msgs.iter().enumerate() {
            let header = read_frame(&mut reader, &Limits::default(), &mut body).unwrap();
            prop_assert_eq!(header.request_id, first_id.wrapping_add(i as u64));
            header.verify_body(&body).unwrap();
            let decoded = m.decode_like(&header, &body).unwrap();
            prop_assert_eq!(&decoded, m);
        }
        prop_assert!(matches!(
            read_frame(&mut reader, &Limits::default(), &mut body),
            Err(ProtocolError::Closed)
        ));
    }

    /// Whatever text the caller passes, the encoder emits something the
    /// decoder takes back: names and messages are cut to the decoder's limits
    /// at a character boundary, never sent whole and refused.
    #[test]
    fn long_texts_are_cut_to_decodable_lengths(
        name in "\\PC{0,300}",
        text in "\\PC{1,100}",
    ) {
        // Repeated to just over the message limit, whatever the text's size.
        let long = text.repeat(MAX_MESSAGE_BYTES / text.len() + 1);
        let cut = |s: &str, limit: usize| {
            let mut end = s.len().min(limit);
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            s[..end].to_owned()
        };
        let msgs = [
            (
                Msg::Req(Request::Hello { client_version: 1, client_name: name.clone() }),
                Msg::Req(Request::Hello { client_version: 1, client_name: cut(&name, MAX_NAME_BYTES) }),
            ),
            (
                Msg::Resp(Response::Hello {
                    protocol_version: 1,
                    server_version: name.clone(),
                    max_frame_bytes: 1,
                    max_value_bytes: 1,
                }),
                Msg::Resp(Response::Hello {
                    protocol_version: 1,
                    server_version: cut(&name, MAX_NAME_BYTES),
                    max_frame_bytes: 1,
                    max_value_bytes: 1,
                }),
            ),
            (
                Msg::Resp(Response::Stats(vec![StatsEntry {
                    name: name.clone(),
                    value: StatsValue::Text(long.clone()),
                }])),
                Msg::Resp(Response::Stats(vec![StatsEntry {
                    name: cut(&name, MAX_NAME_BYTES),
                    value: StatsValue::Text(cut(&long.clone(), MAX_MESSAGE_BYTES)),
                }])),
            ),
            (
                Msg::Err { opcode: 0, error: ServerError::new(ErrorCode::Internal, long.clone()) },
                Msg::Err {
                    opcode: 0,
                    error: ServerError::new(ErrorCode::Internal, cut(&long.clone(), MAX_MESSAGE_BYTES)),
                },
            ),
            (
                Msg::Resp(step_with_failure_message(long.clone())),
                Msg::Resp(step_with_failure_message(cut(&long, MAX_OUTCOME_MESSAGE_BYTES))),
            ),
        ];
        for (sent, expected) in msgs {
            let frame = sent.to_frame(1);
            let header = header_of(&frame);
            let decoded = sent.decode_like(&header, &frame[HEADER_BYTES..]).unwrap();
            prop_assert_eq!(decoded, expected);
        }
    }
}

/// A step reply whose one failed run says `message`.
fn step_with_failure_message(message: String) -> Response {
    Response::Step(StepReply {
        lsn: 1,
        programs: 2,
        failed: 1,
        cells_written: 0,
        instructions: 0,
        first_failure: Some(StepFailure {
            coord: Coord::new(0, 0, 0),
            seq: 1,
            outcome: RunOutcome::Error,
            message,
        }),
    })
}

#[test]
fn every_error_code_round_trips() {
    let mut seen = 0;
    for raw in 0..=u16::MAX {
        let Some(code) = ErrorCode::from_u16(raw) else {
            continue;
        };
        seen += 1;
        let error = ServerError::new(code, format!("{} happened", code.name()));
        for opcode in [0, Opcode::Put as u16] {
            let mut frame = Vec::new();
            Response::encode_error(opcode, 3, &error, &mut frame);
            let header = header_of(&frame);
            assert_eq!(header.opcode, opcode | RESPONSE_BIT);
            header.verify_body(&frame[HEADER_BYTES..]).unwrap();
            let decoded = Response::decode(&header, &frame[HEADER_BYTES..], &Limits::default());
            assert_eq!(decoded, Ok(Err(error.clone())));
            assert_eq!(decoded.unwrap().unwrap_err().known_code(), Some(code));
        }
    }
    assert_eq!(seen, 28);
}

#[test]
fn largest_messages_round_trip() {
    let limits = Limits::default();
    let msgs = [
        Msg::Req(Request::Put {
            ns: NamespaceName::new(&"n".repeat(64)).unwrap(),
            coord: Coord::new(i32::MIN, i32::MAX, -1),
            value: vec![0xa5; limits.max_value_bytes as usize],
        }),
        Msg::Resp(Response::Get(Some(vec![
            0x5a;
            limits.max_value_bytes as usize
        ]))),
        Msg::Resp(Response::Stats(
            (0..MAX_STATS_ENTRIES)
                .map(|i| StatsEntry {
                    name: format!("{i:0>256}"),
                    // 4096 × (256-byte name + 2 KiB text) ≈ 9.4 MiB, under 16 MiB.
                    value: StatsValue::Text("t".repeat(MAX_MESSAGE_BYTES / 2)),
                })
                .collect(),
        )),
        Msg::Err {
            opcode: Opcode::Stats as u16,
            error: ServerError::new(ErrorCode::Overloaded, "é".repeat(MAX_MESSAGE_BYTES / 2)),
        },
    ];
    for msg in &msgs {
        round_trip(msg, u64::MAX).unwrap();
    }
    // More stats entries than the limit: the encoder sends the first 4096.
    let entries: Vec<StatsEntry> = (0..MAX_STATS_ENTRIES + 5)
        .map(|i| StatsEntry {
            name: i.to_string(),
            value: StatsValue::Count(i as u64),
        })
        .collect();
    let frame = Msg::Resp(Response::Stats(entries.clone())).to_frame(1);
    let decoded = Response::decode(&header_of(&frame), &frame[HEADER_BYTES..], &limits);
    assert_eq!(
        decoded,
        Ok(Ok(Response::Stats(entries[..MAX_STATS_ENTRIES].to_vec())))
    );
}

// ---------------------------------------------------------------------------
// (d) Bit flips are caught by the checksum
// ---------------------------------------------------------------------------

/// Frames with at least one body byte (every response; every request but
/// ping and stats).
fn frame_with_body() -> impl Strategy<Value = Vec<u8>> {
    (msg(), any::<u64>())
        .prop_map(|(m, id)| m.to_frame(id))
        .prop_filter("needs a body", |f| f.len() > HEADER_BYTES)
}

fn read_and_verify(frame: &[u8]) -> Result<FrameHeader, ProtocolError> {
    let mut body = Vec::new();
    let header = read_frame(&mut &frame[..], &Limits::default(), &mut body)?;
    header.verify_body(&body)?;
    Ok(header)
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn any_single_bit_flip_in_the_body_is_a_bad_checksum(frame in frame_with_body(), bit in any::<Index>()) {
        let original = header_of(&frame);
        let bit = bit.index((frame.len() - HEADER_BYTES) * 8);
        let mut damaged = frame.clone();
        damaged[HEADER_BYTES + bit / 8] ^= 1 << (bit % 8);
        match read_and_verify(&damaged) {
            Err(ProtocolError::BadChecksum { expected, actual }) => {
                prop_assert_eq!(expected, original.body_crc32c);
                prop_assert_ne!(actual, expected);
            }
            other => prop_assert!(false, "bit {bit}: {other:?}"),
        }
    }

    /// CRC32C catches every error burst of up to 32 bits, not just single flips.
    #[test]
    fn any_burst_of_up_to_32_bits_is_a_bad_checksum(
        frame in frame_with_body(),
        start in any::<Index>(),
        pattern in any::<u32>(),
    ) {
        let bits = (frame.len() - HEADER_BYTES) * 8;
        let start = start.index(bits);
        let pattern = pattern | 1; // the burst starts at `start`
        let mut damaged = frame.clone();
        for i in 0..32 {
            let bit = start + i;
            if pattern >> i & 1 == 1 && bit < bits {
                damaged[HEADER_BYTES + bit / 8] ^= 1 << (bit % 8);
            }
        }
        let result = read_and_verify(&damaged);
        prop_assert!(matches!(result, Err(ProtocolError::BadChecksum { .. })), "{result:?}");
    }

    /// A flipped bit in the checksum field is a bad checksum; one in the
    /// version field is a version mismatch (checked first).
    #[test]
    fn bit_flips_in_the_checked_header_fields_are_caught(frame in frame_with_body(), bit in 0usize..48) {
        let mut damaged = frame.clone();
        damaged[4 + bit / 8] ^= 1 << (bit % 8);
        let result = read_and_verify(&damaged);
        if bit < 32 {
            prop_assert!(matches!(result, Err(ProtocolError::BadChecksum { .. })), "{result:?}");
        } else {
            prop_assert!(
                matches!(result, Err(ProtocolError::VersionMismatch { supported: PROTOCOL_VERSION, .. })),
                "{result:?}"
            );
        }
    }
}

#[test]
fn every_single_bit_flip_is_caught_in_small_frames() {
    let frames = [
        Msg::Req(Request::Put {
            ns: NamespaceName::new("default").unwrap(),
            coord: Coord::new(1, -2, 3),
            value: b"hello".to_vec(),
        })
        .to_frame(7),
        Msg::Resp(Response::Pong).to_frame(1),
        Msg::Resp(Response::Del {
            lsn: 42,
            existed: true,
        })
        .to_frame(9),
        frame_around(Opcode::Ping as u16, 1, &[0; 64]),
    ];
    for frame in frames {
        assert!(read_and_verify(&frame).is_ok());
        for bit in 0..(frame.len() - HEADER_BYTES) * 8 {
            let mut damaged = frame.clone();
            damaged[HEADER_BYTES + bit / 8] ^= 1 << (bit % 8);
            assert!(
                matches!(
                    read_and_verify(&damaged),
                    Err(ProtocolError::BadChecksum { .. })
                ),
                "bit {bit} of {frame:02x?}"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// (e) Truncation is never a message
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(256))]

    /// Cutting a frame at any byte gives `Closed` (nothing sent) or
    /// `TruncatedFrame` with the right counts, never a header or message;
    /// the same holds after a complete frame on the same stream.
    #[test]
    fn truncation_at_every_offset_is_closed_or_truncated(m in msg(), id in any::<u64>()) {
        let frame = m.to_frame(id);
        let mut body = Vec::new();
        let limits = Limits::default();
        for cut in 0..frame.len() {
            let result = read_frame(&mut &frame[..cut], &limits, &mut body);
            let expected = if cut < HEADER_BYTES { HEADER_BYTES } else { frame.len() };
            match result {
                Err(ProtocolError::Closed) => prop_assert_eq!(cut, 0),
                Err(ProtocolError::TruncatedFrame { got, expected: e }) => {
                    prop_assert!(cut > 0);
                    prop_assert_eq!(got, cut);
                    prop_assert_eq!(e, expected);
                }
                other => prop_assert!(false, "cut at {cut}: {other:?}"),
            }
        }
        // A whole frame, then the same frame cut short, in one stream.
        let cut = frame.len() / 2;
        let mut stream = frame.clone();
        stream.extend_from_slice(&frame[..cut]);
        let mut reader = &stream[..];
        prop_assert!(read_frame(&mut reader, &limits, &mut body).is_ok());
        let second = read_frame(&mut reader, &limits, &mut body);
        if cut == 0 {
            prop_assert!(matches!(second, Err(ProtocolError::Closed)));
        } else {
            prop_assert!(matches!(second, Err(ProtocolError::TruncatedFrame { .. })), "{second:?}");
        }
    }
}

#[test]
fn truncated_and_closed_map_to_malformed_frame() {
    // They close the connection; the code is only for logs.
    let err = read_frame(&mut &[1u8, 2, 3][..], &Limits::default(), &mut Vec::new()).unwrap_err();
    assert_eq!(err.code(), ErrorCode::MalformedFrame);
}
