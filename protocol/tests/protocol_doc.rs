//! Keeps `docs/protocol.md` true: every worked hex example in it must be exactly what the real encoders produce, and its opcode, error-code, limit and checksum tables must match the code.
//!
//! To regenerate the examples after a deliberate wire change, run
//! `cargo test -p cube-protocol --test protocol_doc -- --ignored --nocapture`
//! and paste the printed blocks over the old ones.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use cube_protocol::frame::{self, RESPONSE_BIT};
use cube_protocol::{
    CellStats, ProgramValue, RunOutcome, RunRecord, RunReply, StepFailure, StepReply,
};
use cube_protocol::{
    Coord, Direction, EdgeInfo, EdgeLabel, ErrorCode, FrameHeader, HEADER_BYTES, Limits,
    MAX_EDGE_LIST, MAX_LABEL_BYTES, MAX_MGET_CELLS, MAX_SCAN_PAGE_CELLS, MAX_STATS_ENTRIES,
    MAX_WALK_NODES, NamespaceName, Opcode, PROTOCOL_VERSION, PathFound, Request, Response,
    ScanCell, ScanResult, ServerError, StatsEntry, StatsValue, WalkNode, WalkResult, WalkStop,
};
use cube_protocol::{
    CurveChoice, MAX_GRANTS, MAX_LISTED_NAMESPACES, NamespaceGrant, NamespaceInfo, NamespaceSpec,
};
use cube_protocol::{MAX_BATCH_BYTES, MAX_BATCH_OPS, MAX_EDGE_PAGE, MAX_PROGRAM_PAGE};

const DOC: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/protocol.md"));

/// One worked example: its name in the doc, the frame the encoder makes, and
/// a label for each body field (byte count, description).
struct Example {
    name: &'static str,
    frame: Vec<u8>,
    fields: Vec<(usize, String)>,
}

fn request(name: &'static str, id: u64, req: Request, fields: Vec<(usize, String)>) -> Example {
    let mut frame = Vec::new();
    req.encode(id, &mut frame);
    Example {
        name,
        frame,
        fields,
    }
}

fn response(name: &'static str, id: u64, resp: Response, fields: Vec<(usize, String)>) -> Example {
    let mut frame = Vec::new();
    resp.encode(id, &mut frame);
    Example {
        name,
        frame,
        fields,
    }
}

fn error(name: &'static str, opcode: u16, id: u64, code: ErrorCode, message: &str) -> Example {
    let mut frame = Vec::new();
    Response::encode_error(opcode, id, &ServerError::new(code, message), &mut frame);
    let fields = vec![
        (1, "status = 1 (error)".to_owned()),
        (2, format!("code = {} ({})", code as u16, code.name())),
        (2, format!("message length = {}", message.len())),
        (message.len(), format!("message = {message:?}")),
    ];
    Example {
        name,
        frame,
        fields,
    }
}

fn f(len: usize, label: impl Into<String>) -> (usize, String) {
    (len, label.into())
}

fn default_ns() -> NamespaceName {
    NamespaceName::new("default").unwrap()
}

fn ns_and_coord_fields() -> Vec<(usize, String)> {
    vec![
        f(1, "namespace length = 7"),
        f(7, "namespace = \"default\""),
        f(4, "x = 1 (i32)"),
        f(4, "y = -2 (i32)"),
        f(4, "z = 3 (i32)"),
    ]
}

fn scan_request_fields(limit: &str, flags: &str, after: Option<Coord>) -> Vec<(usize, String)> {
    let mut fields = vec![
        f(1, "namespace length = 7"),
        f(7, "namespace = \"default\""),
        f(4, "lo x = -1 (i32)"),
        f(4, "lo y = 0"),
        f(4, "lo z = 0"),
        f(4, "hi x = 1"),
        f(4, "hi y = 1"),
        f(4, "hi z = 0"),
        f(4, limit),
        f(1, flags),
    ];
    match after {
        None => fields.push(f(1, "has_after = 0 (start of the box; no cursor follows)")),
        Some(c) => fields.extend([
            f(1, "has_after = 1"),
            f(4, format!("after x = {}", c.x)),
            f(4, format!("after y = {}", c.y)),
            f(4, format!("after z = {}", c.z)),
        ]),
    }
    fields
}

fn ns_fields() -> Vec<(usize, String)> {
    vec![
        f(1, "namespace length = 7"),
        f(7, "namespace = \"default\""),
    ]
}

fn coord_fields(name: &str, c: Coord) -> Vec<(usize, String)> {
    vec![
        f(4, format!("{name} x = {} (i32)", c.x)),
        f(4, format!("{name} y = {}", c.y)),
        f(4, format!("{name} z = {}", c.z)),
    ]
}

fn label_fields(what: &str, label: &str) -> Vec<(usize, String)> {
    let mut fields = vec![f(2, format!("{what} length = {}", label.len()))];
    if !label.is_empty() {
        fields.push(f(label.len(), format!("{what} = {label:?}")));
    }
    fields
}

fn float_field(name: &str, v: f64) -> (usize, String) {
    f(8, format!("{name} = {v} (f64 bits 0x{:016x})", v.to_bits()))
}

fn road() -> EdgeLabel {
    EdgeLabel::new("road").unwrap()
}

/// The examples of the edge commands (section 6, opcodes 0x0020-0x0025).
fn edge_examples() -> Vec<Example> {
    let a = Coord::new(0, 0, 0);
    let b = Coord::new(1, 0, 0);
    let corner = Coord::new(1, 1, 0);
    let below = Coord::new(0, -1, 0);
    let mut link_fields = ns_fields();
    link_fields.extend(coord_fields("from", a));
    link_fields.extend(coord_fields("to", b));
    link_fields.extend(label_fields("label", "road"));
    let unlink_fields = link_fields.clone();
    link_fields.push(float_field("weight", 2.5));
    let mut edges_fields = ns_fields();
    edges_fields.extend(coord_fields("coord", a));
    edges_fields.extend([
        f(1, "direction = 2 (both)"),
        f(1, "has_label = 0 (every label; no label follows)"),
    ]);
    let mut walk_fields = ns_fields();
    walk_fields.extend(coord_fields("from", a));
    walk_fields.extend([f(1, "direction = 0 (out)"), f(1, "has_label = 1")]);
    walk_fields.extend(label_fields("label", "road"));
    walk_fields.extend([
        f(4, "max_depth = 3 (u32)"),
        f(4, "max_nodes = 0 (the server's limit)"),
        f(1, "flags = 1 (values)"),
    ]);
    let mut path_fields = ns_fields();
    path_fields.extend(coord_fields("from", a));
    path_fields.extend(coord_fields("to", corner));
    path_fields.extend([
        f(1, "has_label = 0"),
        float_field("max_cost", f64::INFINITY),
    ]);
    let mut detach_fields = ns_fields();
    detach_fields.extend(coord_fields("coord", b));
    vec![
        request(
            "link-request",
            11,
            Request::Link {
                ns: default_ns(),
                from: a,
                to: b,
                label: road(),
                weight: 2.5,
            },
            link_fields,
        ),
        response(
            "link-response",
            11,
            Response::Link {
                lsn: 19,
                created: true,
            },
            vec![
                f(1, "status = 0 (ok)"),
                f(8, "lsn = 19 (u64)"),
                f(1, "created = 1 (a new edge)"),
            ],
        ),
        request(
            "unlink-request",
            12,
            Request::Unlink {
                ns: default_ns(),
                from: a,
                to: b,
                label: road(),
            },
            unlink_fields,
        ),
        response(
            "unlink-response",
            12,
            Response::Unlink {
                lsn: 20,
                existed: true,
            },
            vec![
                f(1, "status = 0 (ok)"),
                f(8, "lsn = 20 (u64)"),
                f(1, "existed = 1"),
            ],
        ),
        request(
            "edges-request",
            13,
            Request::Edges {
                ns: default_ns(),
                coord: a,
                direction: Direction::Both,
                label: None,
            },
            edges_fields,
        ),
        response(
            "edges-response",
            13,
            Response::Edges(vec![
                EdgeInfo {
                    direction: Direction::Out,
                    other: b,
                    label: road(),
                    weight: 2.5,
                },
                EdgeInfo {
                    direction: Direction::In,
                    other: below,
                    label: EdgeLabel::default(),
                    weight: 1.0,
                },
            ]),
            [
                vec![f(1, "status = 0 (ok)"), f(4, "edge count = 2 (u32)")],
                vec![f(1, "direction = 0 (out: 0,0,0 -> other)")],
                coord_fields("other", b),
                label_fields("label", "road"),
                vec![float_field("weight", 2.5)],
                vec![f(1, "direction = 1 (in: other -> 0,0,0)")],
                coord_fields("other", below),
                label_fields("label", ""),
                vec![float_field("weight", 1.0)],
            ]
            .concat(),
        ),
        request(
            "walk-request",
            14,
            Request::Walk {
                ns: default_ns(),
                from: a,
                direction: Direction::Out,
                label: Some(road()),
                max_depth: 3,
                max_nodes: 0,
                with_values: true,
            },
            walk_fields,
        ),
        response(
            "walk-response",
            14,
            Response::Walk(WalkResult {
                stop: WalkStop::Complete,
                edges_examined: 3,
                with_values: true,
                nodes: vec![
                    WalkNode {
                        coord: b,
                        distance: 1,
                        value: Some(b"a".to_vec()),
                    },
                    WalkNode {
                        coord: corner,
                        distance: 2,
                        value: None,
                    },
                ],
            }),
            [
                vec![
                    f(1, "status = 0 (ok)"),
                    f(1, "stop = 0 (complete)"),
                    f(8, "edges_examined = 3 (u64)"),
                    f(1, "with_values = 1"),
                    f(4, "node count = 2 (u32)"),
                ],
                coord_fields("coord", b),
                vec![
                    f(4, "distance = 1 (u32)"),
                    f(1, "found = 1"),
                    f(4, "value length = 1"),
                    f(1, "value = \"a\""),
                ],
                coord_fields("coord", corner),
                vec![f(4, "distance = 2"), f(1, "found = 0 (no value follows)")],
            ]
            .concat(),
        ),
        request(
            "path-request",
            15,
            Request::Path {
                ns: default_ns(),
                from: a,
                to: corner,
                label: None,
                max_cost: f64::INFINITY,
            },
            path_fields,
        ),
        response(
            "path-response",
            15,
            Response::Path {
                edges_examined: 4,
                path: Some(PathFound {
                    coords: vec![a, b, corner],
                    cost: 4.5,
                }),
            },
            [
                vec![
                    f(1, "status = 0 (ok)"),
                    f(8, "edges_examined = 4 (u64)"),
                    f(1, "found = 1"),
                    float_field("cost", 4.5),
                    f(4, "coordinate count = 3 (u32)"),
                ],
                coord_fields("1st", a),
                coord_fields("2nd", b),
                coord_fields("3rd", corner),
            ]
            .concat(),
        ),
        response(
            "path-response-none",
            16,
            Response::Path {
                edges_examined: 2,
                path: None,
            },
            vec![
                f(1, "status = 0 (ok)"),
                f(8, "edges_examined = 2 (u64)"),
                f(1, "found = 0 (no path; nothing follows)"),
            ],
        ),
        request(
            "detach-request",
            17,
            Request::Detach {
                ns: default_ns(),
                coord: b,
            },
            detach_fields,
        ),
        response(
            "detach-response",
            17,
            Response::Detach {
                lsn: 21,
                existed: true,
                edges_removed: 3,
            },
            vec![
                f(1, "status = 0 (ok)"),
                f(8, "lsn = 21 (u64)"),
                f(1, "existed = 1 (a value was deleted)"),
                f(4, "edges_removed = 3 (u32)"),
            ],
        ),
    ]
}

fn examples() -> Vec<Example> {
    let mut all = base_examples();
    all.extend(edge_examples());
    all.extend(program_examples());
    all.extend(bulk_examples());
    all.extend(namespace_examples());
    all.extend(watch_examples());
    all
}

/// `watch` (opcode 0x0050) and `scan` with its LSN.
fn watch_examples() -> Vec<Example> {
    use cube_protocol::{ResyncReason, WatchChange, WatchFrame, WatchOp};
    let mut watch_fields = ns_fields();
    watch_fields.extend(coord_fields("lo", Coord::new(0, 0, 0)));
    watch_fields.extend(coord_fields("hi", Coord::new(15, 15, 15)));
    watch_fields.extend([f(1, "has_from = 1"), f(8, "from = 40 (u64)")]);
    let mut changes_fields = vec![
        f(1, "status = 0 (ok)"),
        f(1, "frame = 1 (changes)"),
        f(1, "flags = 0 (the commit group ends in this frame)"),
        f(4, "change count = 2 (u32)"),
        f(8, "lsn = 41 (u64)"),
        f(1, "op = 1 (put)"),
    ];
    changes_fields.extend(coord_fields("coord", Coord::new(1, 2, 3)));
    changes_fields.extend([
        f(4, "value length = 2"),
        f(2, "value = \"hi\""),
        f(8, "lsn = 42 (u64)"),
        f(1, "op = 2 (del)"),
    ]);
    changes_fields.extend(coord_fields("coord", Coord::new(4, 5, 6)));
    let mut scan_fields = ns_fields();
    scan_fields.extend(coord_fields("lo", Coord::new(0, 0, 0)));
    scan_fields.extend(coord_fields("hi", Coord::new(15, 15, 15)));
    scan_fields.extend([
        f(4, "limit = 100"),
        f(1, "flags = 2 (return values, and the LSN)"),
        f(1, "has_after = 0 (start of the box; no cursor follows)"),
    ]);
    let mut scan_answer = vec![
        f(1, "status = 0 (ok)"),
        f(1, "kind = 0x81 (cells, an LSN follows)"),
        f(8, "lsn = 39 (u64: every change up to it is in the page)"),
        f(4, "cell count = 1 (u32)"),
    ];
    scan_answer.extend(coord_fields("coord", Coord::new(1, 2, 3)));
    scan_answer.extend([
        f(4, "value length = 1"),
        f(1, "value = \"a\""),
        f(1, "more = 0 (the box is finished; no cursor follows)"),
    ]);
    vec![
        request(
            "watch-request",
            50,
            Request::Watch {
                ns: default_ns(),
                lo: Coord::new(0, 0, 0),
                hi: Coord::new(15, 15, 15),
                from: Some(40),
            },
            watch_fields,
        ),
        response(
            "watch-response",
            50,
            Response::Watch(WatchFrame::Started { next_lsn: 40 }),
            vec![
                f(1, "status = 0 (ok)"),
                f(1, "frame = 0 (started)"),
                f(8, "next_lsn = 40 (u64)"),
            ],
        ),
        response(
            "watch-changes-response",
            50,
            Response::Watch(WatchFrame::Changes {
                more: false,
                changes: vec![
                    WatchChange {
                        lsn: 41,
                        coord: Coord::new(1, 2, 3),
                        op: WatchOp::Put(b"hi".to_vec()),
                    },
                    WatchChange {
                        lsn: 42,
                        coord: Coord::new(4, 5, 6),
                        op: WatchOp::Del,
                    },
                ],
            }),
            changes_fields,
        ),
        response(
            "watch-resync-response",
            50,
            Response::Watch(WatchFrame::Resync {
                lsn: 97,
                reason: ResyncReason::TooSlow,
            }),
            vec![
                f(1, "status = 0 (ok)"),
                f(1, "frame = 2 (resync)"),
                f(8, "lsn = 97 (u64)"),
                f(1, "reason = 2 (too slow)"),
            ],
        ),
        request(
            "scan-lsn-request",
            51,
            Request::Scan {
                ns: default_ns(),
                lo: Coord::new(0, 0, 0),
                hi: Coord::new(15, 15, 15),
                limit: 100,
                count_only: false,
                after: None,
                with_lsn: true,
            },
            scan_fields,
        ),
        response(
            "scan-lsn-response",
            51,
            Response::Scan {
                result: ScanResult::Cells(vec![ScanCell {
                    coord: Coord::new(1, 2, 3),
                    value: b"a".to_vec(),
                }]),
                resume_after: None,
                lsn: Some(39),
            },
            scan_answer,
        ),
    ]
}

fn tenant() -> NamespaceName {
    NamespaceName::new("tenant-a").unwrap()
}

fn tenant_fields() -> Vec<(usize, String)> {
    vec![
        f(1, "namespace length = 8"),
        f(8, "namespace = \"tenant-a\""),
    ]
}

/// `tenant-a` as the daemon describes it in the namespace examples.
fn tenant_info(cells: u64, bytes: u64, grants: Vec<NamespaceGrant>) -> NamespaceInfo {
    NamespaceInfo {
        name: tenant(),
        id: 2,
        curve: CurveChoice::Hilbert,
        encrypted: true,
        owner_uid: 1000,
        cells,
        bytes,
        edges: 0,
        programs: 0,
        max_cells: Some(1000),
        max_bytes: Some(10 << 20),
        max_edges: None,
        grants,
    }
}

/// The labels of a namespace description (section 6.9).
fn info_fields(info: &NamespaceInfo) -> Vec<(usize, String)> {
    let mut fields = vec![f(1, "status = 0 (ok)")];
    fields.extend(tenant_fields());
    fields.extend([
        f(8, format!("id = {} (u64)", info.id)),
        f(1, "curve = 2 (hilbert)"),
        f(
            1,
            "flags = 0x0b (max_cells and max_bytes follow; encrypted)",
        ),
        f(4, format!("owner_uid = {} (u32)", info.owner_uid)),
        f(8, format!("cells = {} (u64)", info.cells)),
        f(8, format!("bytes = {} (u64)", info.bytes)),
        f(8, format!("edges = {} (u64)", info.edges)),
        f(8, format!("programs = {} (u64)", info.programs)),
        f(8, "max_cells = 1000 (u64)"),
        f(8, "max_bytes = 10485760 (u64, 10 MiB)"),
        f(2, format!("grant count = {} (u16)", info.grants.len())),
    ]);
    for grant in &info.grants {
        fields.push(f(4, format!("uid = {} (u32)", grant.uid)));
        fields.push(f(
            1,
            if grant.read_only {
                "read_only = 1"
            } else {
                "read_only = 0 (read and write)"
            },
        ));
    }
    fields
}

/// `ns-create`, `ns-drop`, `ns-list`, `ns-info`, `ns-grant` and
/// `ns-revoke` (opcodes 0x0030-0x0035).
fn namespace_examples() -> Vec<Example> {
    let reader = NamespaceGrant {
        uid: 1001,
        read_only: true,
    };
    let created = tenant_info(0, 0, Vec::new());
    let described = tenant_info(12, 345, vec![reader]);
    let mut create_fields = tenant_fields();
    create_fields.extend([
        f(1, "curve = 2 (hilbert)"),
        f(
            1,
            "flags = 0x0b (max_cells and max_bytes follow; encrypted)",
        ),
        f(8, "max_cells = 1000 (u64)"),
        f(8, "max_bytes = 10485760 (u64, 10 MiB)"),
    ]);
    let mut grant_fields = tenant_fields();
    grant_fields.extend([f(4, "uid = 1001 (u32)"), f(1, "read_only = 1")]);
    let mut revoke_fields = tenant_fields();
    revoke_fields.push(f(4, "uid = 1001 (u32)"));
    vec![
        request(
            "ns-create-request",
            21,
            Request::NsCreate {
                ns: tenant(),
                spec: NamespaceSpec {
                    curve: CurveChoice::Hilbert,
                    max_cells: Some(1000),
                    max_bytes: Some(10 << 20),
                    max_edges: None,
                    encrypted: true,
                },
            },
            create_fields,
        ),
        response(
            "ns-create-response",
            21,
            Response::NsCreated(created.clone()),
            info_fields(&created),
        ),
        request("ns-list-request", 22, Request::NsList, vec![]),
        response(
            "ns-list-response",
            22,
            Response::NsList(vec![default_ns(), tenant()]),
            [
                vec![f(1, "status = 0 (ok)"), f(4, "namespace count = 2 (u32)")],
                ns_fields(),
                tenant_fields(),
            ]
            .concat(),
        ),
        request(
            "ns-grant-request",
            23,
            Request::NsGrant {
                ns: tenant(),
                uid: 1001,
                read_only: true,
            },
            grant_fields,
        ),
        response(
            "ns-grant-response",
            23,
            Response::NsGranted(tenant_info(0, 0, vec![reader])),
            info_fields(&tenant_info(0, 0, vec![reader])),
        ),
        request(
            "ns-info-request",
            24,
            Request::NsInfo { ns: tenant() },
            tenant_fields(),
        ),
        response(
            "ns-info-response",
            24,
            Response::NsInfo(described.clone()),
            info_fields(&described),
        ),
        error(
            "quota-error-response",
            Opcode::Put as u16,
            25,
            ErrorCode::QuotaExceeded,
            "namespace \"tenant-a\" is over its max-cells quota: it holds 1000 cells, \
             this write would make it 1001, the limit is 1000; nothing was applied",
        ),
        request(
            "ns-revoke-request",
            26,
            Request::NsRevoke {
                ns: tenant(),
                uid: 1001,
            },
            revoke_fields,
        ),
        response(
            "ns-revoke-response",
            26,
            Response::NsRevoked(tenant_info(12, 345, Vec::new())),
            info_fields(&tenant_info(12, 345, Vec::new())),
        ),
        request(
            "ns-drop-request",
            27,
            Request::NsDrop { ns: tenant() },
            tenant_fields(),
        ),
        response(
            "ns-drop-response",
            27,
            Response::NsDropped { lsn: 40, cells: 12 },
            vec![
                f(1, "status = 0 (ok)"),
                f(8, "lsn = 40 (u64)"),
                f(8, "cells = 12 (u64, values dropped with it)"),
            ],
        ),
    ]
}

/// `batch`, `edge-list` and `prog-list` (opcodes 0x0014, 0x0026, 0x0043):
/// import and export.
fn bulk_examples() -> Vec<Example> {
    use cube_protocol::{BatchOp, EdgePage, ListedEdge, ListedProgram, ProgramPage};
    let origin = Coord::new(0, 0, 0);
    let east = Coord::new(1, 0, 0);
    let mut batch_fields = ns_fields();
    batch_fields.extend([f(4, "operation count = 3 (u32)"), f(1, "tag = 1 (put)")]);
    batch_fields.extend(coord_fields("coord", east));
    batch_fields.extend([f(4, "value length = 2"), f(2, "value = \"hi\"")]);
    batch_fields.push(f(1, "tag = 2 (link)"));
    batch_fields.extend(coord_fields("from", origin));
    batch_fields.extend(coord_fields("to", east));
    batch_fields.extend(label_fields("label", "road"));
    batch_fields.push(float_field("weight", 2.5));
    batch_fields.push(f(1, "tag = 3 (prog)"));
    batch_fields.extend(coord_fields("coord", origin));
    batch_fields.extend([f(4, "source length = 8"), f(8, "source = \"return 1\"")]);
    let mut edge_list_fields = ns_fields();
    edge_list_fields.extend([
        f(4, "limit = 1000 (u32)"),
        f(1, "has_after = 0 (the first page; no cursor follows)"),
    ]);
    let mut edge_page_fields = vec![f(1, "status = 0 (ok)"), f(4, "edge count = 1 (u32)")];
    edge_page_fields.extend(coord_fields("from", origin));
    edge_page_fields.extend(coord_fields("to", east));
    edge_page_fields.extend(label_fields("label", "road"));
    edge_page_fields.extend([
        float_field("weight", 2.5),
        f(1, "more = 1"),
        f(8, "resume_after = 0 (u64, an opaque cursor)"),
    ]);
    let mut prog_list_fields = ns_fields();
    prog_list_fields.extend([f(4, "limit = 1000 (u32)"), f(1, "has_after = 1")]);
    prog_list_fields.extend(coord_fields("after", Coord::new(-1, 0, 0)));
    let mut prog_page_fields = vec![f(1, "status = 0 (ok)"), f(4, "program count = 1 (u32)")];
    prog_page_fields.extend(coord_fields("coord", origin));
    prog_page_fields.extend([
        f(4, "source length = 8"),
        f(8, "source = \"return 1\""),
        f(1, "more = 0 (the last page; no cursor follows)"),
    ]);
    vec![
        request(
            "batch-request",
            30,
            Request::Batch {
                ns: default_ns(),
                ops: vec![
                    BatchOp::Put {
                        coord: east,
                        value: b"hi".to_vec(),
                    },
                    BatchOp::Link {
                        from: origin,
                        to: east,
                        label: road(),
                        weight: 2.5,
                    },
                    BatchOp::Prog {
                        coord: origin,
                        source: b"return 1".to_vec(),
                    },
                ],
            },
            batch_fields,
        ),
        response(
            "batch-response",
            30,
            Response::Batch {
                lsn: 40,
                applied: 3,
            },
            vec![
                f(1, "status = 0 (ok)"),
                f(8, "lsn = 40 (u64, the first of 3 consecutive records)"),
                f(4, "applied = 3 (u32)"),
            ],
        ),
        error(
            "batch-error-response",
            Opcode::Batch as u16,
            31,
            ErrorCode::ProgramSyntax,
            "op 2 (prog): program at 0,0,0: line 1: unexpected symbol near <eof>; nothing of the batch was applied",
        ),
        request(
            "edge-list-request",
            32,
            Request::EdgeList {
                ns: default_ns(),
                limit: 1000,
                after: None,
            },
            edge_list_fields,
        ),
        response(
            "edge-list-response",
            32,
            Response::EdgeList(EdgePage {
                edges: vec![ListedEdge {
                    from: origin,
                    to: east,
                    label: road(),
                    weight: 2.5,
                }],
                resume_after: Some(0),
            }),
            edge_page_fields,
        ),
        request(
            "prog-list-request",
            33,
            Request::ProgramList {
                ns: default_ns(),
                limit: 1000,
                after: Some(Coord::new(-1, 0, 0)),
            },
            prog_list_fields,
        ),
        response(
            "prog-list-response",
            33,
            Response::ProgramList(ProgramPage {
                programs: vec![ListedProgram {
                    coord: origin,
                    source: b"return 1".to_vec(),
                }],
                resume_after: None,
            }),
            prog_page_fields,
        ),
    ]
}

/// `prog`, `run`, `cell-stats` (opcodes 0x0040-0x0042) and `step`
/// (0x0044).
fn program_examples() -> Vec<Example> {
    let at = Coord::new(1, -2, 3);
    let mut prog_fields = ns_fields();
    prog_fields.extend(coord_fields("coord", at));
    prog_fields.extend([f(4, "source length = 8"), f(8, "source = \"return 1\"")]);
    let mut run_fields = ns_fields();
    run_fields.extend(coord_fields("coord", at));
    run_fields.extend([
        f(2, "argument count = 1"),
        f(4, "argument length = 1"),
        f(1, "argument = \"5\""),
    ]);
    let mut stats_fields = ns_fields();
    stats_fields.extend(coord_fields("coord", at));
    stats_fields.push(f(4, "limit = 1 (most recent records wanted)"));
    let (lo, hi, failed_at) = (
        Coord::new(0, 0, 0),
        Coord::new(2, 2, 0),
        Coord::new(1, 1, 0),
    );
    let mut step_fields = ns_fields();
    step_fields.extend(coord_fields("lo", lo));
    step_fields.extend(coord_fields("hi", hi));
    step_fields.extend([
        f(2, "argument count = 1"),
        f(4, "argument length = 1"),
        f(1, "argument = \"1\""),
    ]);
    let step_message = "line 2: boom";
    let mut step_reply_fields = vec![
        f(1, "status = 0 (ok)"),
        f(8, "lsn = 40 (u64, the step's first record)"),
        f(4, "programs = 9 (u32)"),
        f(4, "failed = 1 (u32)"),
        f(4, "cells_written = 8 (u32, by the 8 runs that succeeded)"),
        f(8, "instructions = 12000 (u64, all runs together)"),
        f(
            1,
            "has_failure = 1 (a run failed; the first failure follows)",
        ),
    ];
    step_reply_fields.extend(coord_fields("failure", failed_at));
    step_reply_fields.extend([
        f(8, "seq = 3 (u64, the failed run's number at its cell)"),
        f(1, "outcome = 1 (error)"),
        f(2, format!("message length = {}", step_message.len())),
        f(step_message.len(), format!("message = {step_message:?}")),
    ]);
    vec![
        request(
            "prog-request",
            11,
            Request::Prog {
                ns: default_ns(),
                coord: at,
                source: b"return 1".to_vec(),
            },
            prog_fields,
        ),
        response(
            "prog-response",
            11,
            Response::Prog {
                lsn: 19,
                replaced: false,
            },
            vec![
                f(1, "status = 0 (ok)"),
                f(8, "lsn = 19 (u64)"),
                f(1, "replaced = 0 (the cell had no program)"),
            ],
        ),
        request(
            "run-request",
            12,
            Request::Run {
                ns: default_ns(),
                coord: at,
                args: vec![b"5".to_vec()],
            },
            run_fields,
        ),
        response(
            "run-response",
            12,
            Response::Run(RunReply {
                lsn: 20,
                seq: 3,
                instructions: 1000,
                cells_written: 1,
                value: ProgramValue::Int(6),
            }),
            vec![
                f(1, "status = 0 (ok)"),
                f(8, "lsn = 20 (u64, the run's first record)"),
                f(8, "seq = 3 (u64, the cell's third run)"),
                f(8, "instructions = 1000 (u64)"),
                f(4, "cells_written = 1 (u32)"),
                f(1, "value tag = 3 (integer)"),
                f(8, "value = 6 (i64)"),
            ],
        ),
        response(
            "run-response-table",
            13,
            Response::Run(RunReply {
                lsn: 21,
                seq: 4,
                instructions: 0,
                cells_written: 0,
                value: ProgramValue::Table(vec![
                    (ProgramValue::Int(1), ProgramValue::Bool(true)),
                    (ProgramValue::Bytes(b"n".to_vec()), ProgramValue::Float(0.5)),
                ]),
            }),
            vec![
                f(1, "status = 0 (ok)"),
                f(8, "lsn = 21 (u64)"),
                f(8, "seq = 4 (u64)"),
                f(8, "instructions = 0 (u64; under 1000 counts as 0)"),
                f(4, "cells_written = 0 (u32)"),
                f(1, "value tag = 6 (table)"),
                f(4, "entry count = 2 (u32)"),
                f(1, "key tag = 3 (integer)"),
                f(8, "key = 1 (i64)"),
                f(1, "value tag = 2 (true)"),
                f(1, "key tag = 5 (string)"),
                f(4, "key length = 1"),
                f(1, "key = \"n\""),
                f(1, "value tag = 4 (float)"),
                float_field("value", 0.5),
            ],
        ),
        request(
            "cell-stats-request",
            14,
            Request::CellStats {
                ns: default_ns(),
                coord: at,
                limit: 1,
            },
            stats_fields,
        ),
        response(
            "cell-stats-response",
            14,
            Response::CellStats(CellStats {
                program_bytes: Some(8),
                runs: 4,
                failures: 1,
                records: vec![RunRecord {
                    seq: 4,
                    started_unix_us: 1_767_225_600_000_000,
                    duration_ns: 2500,
                    instructions: 0,
                    cells_written: 0,
                    outcome: RunOutcome::Error,
                    message: "line 1: boom".to_owned(),
                }],
            }),
            vec![
                f(1, "status = 0 (ok)"),
                f(1, "has_program = 1"),
                f(4, "program_bytes = 8 (u32)"),
                f(8, "runs = 4 (u64)"),
                f(8, "failures = 1 (u64)"),
                f(4, "record count = 1 (u32)"),
                f(8, "seq = 4 (u64)"),
                f(8, "started_unix_us = 1767225600000000 (u64)"),
                f(8, "duration_ns = 2500 (u64)"),
                f(8, "instructions = 0 (u64)"),
                f(4, "cells_written = 0 (u32)"),
                f(1, "outcome = 1 (error)"),
                f(2, "message length = 12"),
                f(12, "message = \"line 1: boom\""),
            ],
        ),
        error(
            "run-error-response",
            Opcode::Run as u16,
            15,
            ErrorCode::ProgramFuel,
            "out of fuel (run 5 at default 1,-2,3)",
        ),
        request(
            "step-request",
            16,
            Request::Step {
                ns: default_ns(),
                lo,
                hi,
                args: vec![b"1".to_vec()],
            },
            step_fields,
        ),
        response(
            "step-response",
            16,
            Response::Step(StepReply {
                lsn: 40,
                programs: 9,
                failed: 1,
                cells_written: 8,
                instructions: 12_000,
                first_failure: Some(StepFailure {
                    coord: failed_at,
                    seq: 3,
                    outcome: RunOutcome::Error,
                    message: step_message.to_owned(),
                }),
            }),
            step_reply_fields,
        ),
        response(
            "step-response-empty",
            17,
            Response::Step(StepReply {
                lsn: 0,
                programs: 0,
                failed: 0,
                cells_written: 0,
                instructions: 0,
                first_failure: None,
            }),
            vec![
                f(1, "status = 0 (ok)"),
                f(8, "lsn = 0 (u64; nothing was written)"),
                f(4, "programs = 0 (u32)"),
                f(4, "failed = 0 (u32)"),
                f(4, "cells_written = 0 (u32)"),
                f(8, "instructions = 0 (u64)"),
                f(1, "has_failure = 0 (no run failed; nothing follows)"),
            ],
        ),
    ]
}

fn base_examples() -> Vec<Example> {
    let coord = Coord::new(1, -2, 3);
    let limits = Limits::default();
    let mut put_fields = ns_and_coord_fields();
    put_fields.extend([f(4, "value length = 5"), f(5, "value = \"hello\"")]);
    vec![
        request(
            "hello-request",
            1,
            Request::Hello {
                client_version: PROTOCOL_VERSION,
                client_name: "cubec 0.1.0".to_owned(),
            },
            vec![
                f(2, "client_version = 1"),
                f(2, "client_name length = 11"),
                f(11, "client_name = \"cubec 0.1.0\""),
            ],
        ),
        response(
            "hello-response",
            1,
            Response::Hello {
                protocol_version: PROTOCOL_VERSION,
                server_version: "cubed 0.1.0".to_owned(),
                max_frame_bytes: limits.max_frame_bytes,
                max_value_bytes: limits.max_value_bytes,
            },
            vec![
                f(1, "status = 0 (ok)"),
                f(2, "protocol_version = 1"),
                f(2, "server_version length = 11"),
                f(11, "server_version = \"cubed 0.1.0\""),
                f(4, "max_frame_bytes = 16777216"),
                f(4, "max_value_bytes = 1048576"),
            ],
        ),
        request("ping-request", 2, Request::Ping, vec![]),
        response(
            "ping-response",
            2,
            Response::Pong,
            vec![f(1, "status = 0 (ok)")],
        ),
        request(
            "checkpoint-request",
            9,
            Request::Checkpoint { compact: false },
            vec![f(1, "compact = 0 (false)")],
        ),
        response(
            "checkpoint-response",
            9,
            Response::Checkpoint(vec![StatsEntry {
                name: "checkpoint.lsn".to_owned(),
                value: StatsValue::Count(1200),
            }]),
            vec![
                f(1, "status = 0 (ok)"),
                f(2, "entry count = 1"),
                f(2, "name length = 14"),
                f(14, "name = \"checkpoint.lsn\""),
                f(1, "tag = 0 (count)"),
                f(8, "count = 1200 (u64)"),
            ],
        ),
        request(
            "backup-request",
            10,
            Request::Backup {
                dest: "/srv/b1".to_owned(),
            },
            vec![f(2, "dest length = 7"), f(7, "dest = \"/srv/b1\"")],
        ),
        response(
            "backup-response",
            10,
            Response::Backup(vec![StatsEntry {
                name: "backup.lsn".to_owned(),
                value: StatsValue::Count(1300),
            }]),
            vec![
                f(1, "status = 0 (ok)"),
                f(2, "entry count = 1"),
                f(2, "name length = 10"),
                f(10, "name = \"backup.lsn\""),
                f(1, "tag = 0 (count)"),
                f(8, "count = 1300 (u64)"),
            ],
        ),
        error(
            "backup-error-response",
            Opcode::Backup as u16,
            11,
            ErrorCode::BadPath,
            "bad path /d/wal/b: it is inside the live data dir /d",
        ),
        request("stats-request", 3, Request::Stats, vec![]),
        response(
            "stats-response",
            3,
            Response::Stats(vec![
                StatsEntry {
                    name: "connections".to_owned(),
                    value: StatsValue::Count(1),
                },
                StatsEntry {
                    name: "uptime_s".to_owned(),
                    value: StatsValue::Float(12.5),
                },
                StatsEntry {
                    name: "sync".to_owned(),
                    value: StatsValue::Text("always".to_owned()),
                },
            ]),
            vec![
                f(1, "status = 0 (ok)"),
                f(2, "entry count = 3"),
                f(2, "name length = 11"),
                f(11, "name = \"connections\""),
                f(1, "tag = 0 (count)"),
                f(8, "count = 1 (u64)"),
                f(2, "name length = 8"),
                f(8, "name = \"uptime_s\""),
                f(1, "tag = 1 (float)"),
                f(8, "float = 12.5 (f64 bits 0x4029000000000000)"),
                f(2, "name length = 4"),
                f(4, "name = \"sync\""),
                f(1, "tag = 2 (text)"),
                f(2, "text length = 6"),
                f(6, "text = \"always\""),
            ],
        ),
        request(
            "put-request",
            4,
            Request::Put {
                ns: default_ns(),
                coord,
                value: b"hello".to_vec(),
            },
            put_fields,
        ),
        response(
            "put-response",
            4,
            Response::Put { lsn: 17 },
            vec![f(1, "status = 0 (ok)"), f(8, "lsn = 17 (u64)")],
        ),
        request(
            "get-request",
            5,
            Request::Get {
                ns: default_ns(),
                coord,
            },
            ns_and_coord_fields(),
        ),
        response(
            "get-response",
            5,
            Response::Get(Some(b"hello".to_vec())),
            vec![
                f(1, "status = 0 (ok)"),
                f(1, "found = 1"),
                f(4, "value length = 5"),
                f(5, "value = \"hello\""),
            ],
        ),
        response(
            "get-response-not-found",
            6,
            Response::Get(None),
            vec![
                f(1, "status = 0 (ok)"),
                f(1, "found = 0 (no value field follows)"),
            ],
        ),
        request(
            "del-request",
            7,
            Request::Del {
                ns: default_ns(),
                coord,
            },
            ns_and_coord_fields(),
        ),
        response(
            "del-response",
            7,
            Response::Del {
                lsn: 18,
                existed: true,
            },
            vec![
                f(1, "status = 0 (ok)"),
                f(8, "lsn = 18 (u64)"),
                f(1, "existed = 1"),
            ],
        ),
        request(
            "scan-request",
            9,
            Request::Scan {
                ns: default_ns(),
                lo: Coord::new(-1, 0, 0),
                hi: Coord::new(1, 1, 0),
                limit: 2,
                count_only: false,
                after: None,
                with_lsn: false,
            },
            scan_request_fields("limit = 2", "flags = 0 (return values)", None),
        ),
        response(
            "scan-response",
            9,
            Response::Scan {
                result: ScanResult::Cells(vec![
                    ScanCell {
                        coord: Coord::new(-1, 0, 0),
                        value: b"a".to_vec(),
                    },
                    ScanCell {
                        coord: Coord::new(-1, 1, 0),
                        value: b"bc".to_vec(),
                    },
                ]),
                resume_after: Some(Coord::new(-1, 1, 0)),
                lsn: None,
            },
            vec![
                f(1, "status = 0 (ok)"),
                f(1, "kind = 1 (cells)"),
                f(4, "cell count = 2 (u32)"),
                f(4, "x = -1"),
                f(4, "y = 0"),
                f(4, "z = 0"),
                f(4, "value length = 1"),
                f(1, "value = \"a\""),
                f(4, "x = -1"),
                f(4, "y = 1"),
                f(4, "z = 0"),
                f(4, "value length = 2"),
                f(2, "value = \"bc\""),
                f(1, "more = 1"),
                f(4, "resume_after x = -1"),
                f(4, "resume_after y = 1"),
                f(4, "resume_after z = 0"),
            ],
        ),
        request(
            "scan-count-request",
            10,
            Request::Scan {
                ns: default_ns(),
                lo: Coord::new(-1, 0, 0),
                hi: Coord::new(1, 1, 0),
                limit: 2,
                count_only: true,
                after: Some(Coord::new(-1, 1, 0)),
                with_lsn: false,
            },
            scan_request_fields(
                "limit = 2 (ignored when counting)",
                "flags = 1 (count only)",
                Some(Coord::new(-1, 1, 0)),
            ),
        ),
        response(
            "scan-count-response",
            10,
            Response::Scan {
                result: ScanResult::Count(3),
                resume_after: None,
                lsn: None,
            },
            vec![
                f(1, "status = 0 (ok)"),
                f(1, "kind = 0 (count)"),
                f(8, "count = 3 (u64)"),
                f(1, "more = 0 (the box is finished; no cursor follows)"),
            ],
        ),
        request(
            "mget-request",
            11,
            Request::Mget {
                ns: default_ns(),
                coords: vec![
                    Coord::new(1, -2, 3),
                    Coord::new(9, 9, 9),
                    Coord::new(1, -2, 3),
                ],
            },
            vec![
                f(1, "namespace length = 7"),
                f(7, "namespace = \"default\""),
                f(4, "count = 3 (u32; 1 to 4096)"),
                f(4, "x = 1 (i32)"),
                f(4, "y = -2 (i32)"),
                f(4, "z = 3 (i32)"),
                f(4, "x = 9"),
                f(4, "y = 9"),
                f(4, "z = 9"),
                f(4, "x = 1 (the same cell again)"),
                f(4, "y = -2"),
                f(4, "z = 3"),
            ],
        ),
        response(
            "mget-response",
            11,
            Response::Mget(vec![Some(b"hello".to_vec()), None, Some(b"hello".to_vec())]),
            vec![
                f(1, "status = 0 (ok)"),
                f(4, "count = 3 (u32, one per coordinate asked)"),
                f(1, "found = 1"),
                f(4, "value length = 5"),
                f(5, "value = \"hello\""),
                f(1, "found = 0 (empty cell; no value field follows)"),
                f(1, "found = 1"),
                f(4, "value length = 5"),
                f(5, "value = \"hello\""),
            ],
        ),
        error(
            "error-response",
            Opcode::Get as u16,
            8,
            ErrorCode::NoSuchNamespace,
            "no namespace \"nope\"",
        ),
        error(
            "refusal-frame",
            0,
            0,
            ErrorCode::TooManyConnections,
            "too many connections",
        ),
    ]
}

fn header_fields(h: &FrameHeader) -> Vec<(usize, String)> {
    let opcode = if h.opcode & RESPONSE_BIT != 0 {
        match Opcode::from_u16(h.opcode & !RESPONSE_BIT) {
            Some(op) => format!("opcode = 0x{:04x} ({} response)", h.opcode, op.name()),
            None => format!("opcode = 0x{:04x} (response, no request opcode)", h.opcode),
        }
    } else {
        let op = Opcode::from_u16(h.opcode).unwrap();
        format!("opcode = 0x{:04x} ({})", h.opcode, op.name())
    };
    vec![
        f(4, format!("body_len = {}", h.body_len)),
        f(4, format!("body_crc32c = 0x{:08x}", h.body_crc32c)),
        f(2, format!("version = {}", h.version)),
        f(2, opcode),
        f(8, format!("request_id = {}", h.request_id)),
    ]
}

/// The annotated hex block for an example, as it appears in the doc.
fn render(example: &Example) -> String {
    let header = FrameHeader::parse(example.frame[..HEADER_BYTES].try_into().unwrap());
    let mut fields = header_fields(&header);
    fields.extend(example.fields.iter().cloned());
    let total: usize = fields.iter().map(|(len, _)| len).sum();
    assert_eq!(
        total,
        example.frame.len(),
        "the field labels of {} do not cover the frame",
        example.name
    );
    let mut out = format!("<!-- example: {} -->\n```text\n", example.name);
    let mut offset = 0;
    for (len, label) in fields {
        let bytes = &example.frame[offset..offset + len];
        for (i, chunk) in bytes.chunks(16).enumerate() {
            let hex: Vec<String> = chunk.iter().map(|b| format!("{b:02x}")).collect();
            let hex = hex.join(" ");
            if i == 0 {
                out.push_str(&format!("{hex:<48} # {label}\n"));
            } else {
                out.push_str(&format!("{hex}\n"));
            }
        }
        offset += len;
    }
    out.push_str("```\n");
    out
}

/// Every `<!-- example: NAME -->` block in the doc, as bytes. Each line of a
/// block is hex byte pairs, optionally followed by `# comment`.
fn doc_examples() -> BTreeMap<String, Vec<u8>> {
    let mut found = BTreeMap::new();
    let mut lines = DOC.lines();
    while let Some(line) = lines.next() {
        let Some(name) = line
            .trim()
            .strip_prefix("<!-- example:")
            .and_then(|rest| rest.strip_suffix("-->"))
        else {
            continue;
        };
        let name = name.trim().to_owned();
        assert_eq!(
            lines.next().map(str::trim),
            Some("```text"),
            "example {name}: the marker must be followed by a ```text block"
        );
        let mut bytes = Vec::new();
        for line in lines.by_ref() {
            if line.trim() == "```" {
                break;
            }
            let hex = line.split('#').next().unwrap();
            for token in hex.split_whitespace() {
                assert!(
                    token.len() == 2 && token.chars().all(|c| c.is_ascii_hexdigit()),
                    "example {name}: {token:?} is not a hex byte"
                );
                bytes.push(u8::from_str_radix(token, 16).unwrap());
            }
        }
        assert!(
            found.insert(name.clone(), bytes).is_none(),
            "example {name} appears twice"
        );
    }
    found
}

#[test]
fn doc_examples_match_the_encoders() {
    let in_doc = doc_examples();
    let examples = examples();
    let mut stale = Vec::new();
    for example in &examples {
        match in_doc.get(example.name) {
            Some(bytes) if *bytes == example.frame => {}
            _ => stale.push(render(example)),
        }
    }
    assert!(
        stale.is_empty(),
        "docs/protocol.md examples are missing or stale; the encoders produce:\n\n{}",
        stale.join("\n")
    );
    let known: Vec<&str> = examples.iter().map(|e| e.name).collect();
    for name in in_doc.keys() {
        assert!(
            known.contains(&name.as_str()),
            "docs/protocol.md has an example {name:?} this test does not check"
        );
    }
}

#[test]
fn every_opcode_has_a_request_and_a_response_example() {
    let names: Vec<&str> = examples().iter().map(|e| e.name).collect();
    for op in Opcode::ALL {
        for side in ["request", "response"] {
            let name = format!("{}-{side}", op.name());
            assert!(names.contains(&name.as_str()), "no example {name}");
        }
    }
}

#[test]
fn examples_decode_to_what_they_say() {
    // The examples are built from real messages, so decoding them must work,
    // and exactly the error examples must decode as server errors.
    for example in examples() {
        let header = FrameHeader::parse(example.frame[..HEADER_BYTES].try_into().unwrap());
        let body = &example.frame[HEADER_BYTES..];
        header.verify_body(body).unwrap();
        if header.opcode & RESPONSE_BIT == 0 {
            Request::decode(&header, body, &Limits::default()).unwrap();
        } else {
            let answer = Response::decode(&header, body, &Limits::default()).unwrap();
            let is_error = matches!(
                example.name,
                "error-response"
                    | "refusal-frame"
                    | "run-error-response"
                    | "batch-error-response"
                    | "quota-error-response"
                    | "backup-error-response"
            );
            assert_eq!(answer.is_err(), is_error, "{}", example.name);
        }
    }
}

fn doc_has_row(prefix: &str) -> bool {
    DOC.lines()
        .any(|line| line.replace(' ', "").starts_with(&prefix.replace(' ', "")))
}

#[test]
fn opcode_table_matches() {
    for op in Opcode::ALL {
        let row = format!("| `0x{:04x}` | `{}` |", op as u16, op.name());
        assert!(
            doc_has_row(&row),
            "docs/protocol.md lacks the opcode row {row}"
        );
    }
}

#[test]
fn error_code_table_matches() {
    let mut rows = 0;
    for n in 0..=u16::MAX {
        if let Some(code) = ErrorCode::from_u16(n) {
            let row = format!("| {n} | `{}` |", code.name());
            assert!(
                doc_has_row(&row),
                "docs/protocol.md lacks the error row {row}"
            );
            rows += 1;
        }
    }
    // No row for a code that does not exist.
    let next = format!("| {} | `", rows + 1);
    assert!(
        !doc_has_row(&next),
        "docs/protocol.md lists error code {}",
        rows + 1
    );
}

#[test]
fn stated_constants_match() {
    let limits = Limits::default();
    let facts = [
        format!("`max_frame_bytes` | {}", limits.max_frame_bytes),
        format!("`max_value_bytes` | {}", limits.max_value_bytes),
        format!("stats entries | {MAX_STATS_ENTRIES}"),
        format!("scan page cells | {MAX_SCAN_PAGE_CELLS}"),
        format!("cells per `mget` | {MAX_MGET_CELLS}"),
        format!("edge label | {MAX_LABEL_BYTES} bytes"),
        format!("edges per `edges` answer | {MAX_EDGE_LIST}"),
        format!("nodes per `walk` answer, coordinates per `path` answer | {MAX_WALK_NODES}"),
        format!("grants per namespace | {MAX_GRANTS}"),
        format!("names per `ns-list` answer | {MAX_LISTED_NAMESPACES}"),
        format!("header | {HEADER_BYTES}"),
        format!("operations per `batch` | {MAX_BATCH_OPS}"),
        format!("operation bytes per `batch` | {MAX_BATCH_BYTES}"),
        format!("edges per `edge-list` page | {MAX_EDGE_PAGE}"),
        format!("programs per `prog-list` page | {MAX_PROGRAM_PAGE}"),
        format!("protocol version | {PROTOCOL_VERSION}"),
    ];
    for fact in facts {
        assert!(
            DOC.lines()
                .any(|l| l.replace(' ', "").contains(&fact.replace(' ', ""))),
            "docs/protocol.md does not state {fact:?}"
        );
    }
    // The CRC check value quoted in the doc is what the frame encoder computes.
    let mut frame = Vec::new();
    frame::encode_frame(&mut frame, 0, 0, |b| b.extend_from_slice(b"123456789"));
    let crc = FrameHeader::parse(frame[..HEADER_BYTES].try_into().unwrap()).body_crc32c;
    assert_eq!(crc, 0xE306_9283);
    assert!(DOC.contains("0xE3069283"));
}

/// Prints every example block; see the module comment.
#[test]
#[ignore = "prints the doc's example blocks for regeneration"]
fn print_examples() {
    for example in examples() {
        println!("{}", render(&example));
    }
}
