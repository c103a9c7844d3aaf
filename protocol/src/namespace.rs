//! Namespaces on the wire: the body codecs of `ns-create`, `ns-drop`,
//! `ns-list`, `ns-info`, `ns-grant` and `ns-revoke` (opcodes
//! 0x0030-0x0035, `docs/protocol.md` section 6.9), and the vocabulary they
//! carry: how a namespace is asked for ([`NamespaceSpec`]) and what the
//! daemon says about one ([`NamespaceInfo`]).
//!
//! A namespace is a tenant: its cells, edges and programs are its own, it
//! has an owner (the uid that created it), an access list, optional quotas
//! and, optionally, encryption at rest. Every list here is bounded
//! ([`MAX_GRANTS`], [`MAX_LISTED_NAMESPACES`]) and checked against the bytes
//! the body still holds before anything is reserved.

use std::fmt;

use crate::error::DecodeError;
use crate::model::NamespaceName;
use crate::wire::{BodyReader, put_namespace, put_u16, put_u32, put_u64};

/// Most grants one namespace's access list holds. The daemon refuses a
/// grant past it (`limit_exceeded`); a decoder refuses a longer list.
pub const MAX_GRANTS: usize = 256;
/// Most names in one `ns-list` answer.
pub const MAX_LISTED_NAMESPACES: usize = 65_536;

/// Bits of a namespace's `flags` byte (in `ns-create` and in every
/// namespace description): which quotas follow, and encryption.
const FLAG_MAX_CELLS: u8 = 0x01;
const FLAG_MAX_BYTES: u8 = 0x02;
const FLAG_MAX_EDGES: u8 = 0x04;
const FLAG_ENCRYPTED: u8 = 0x08;
const KNOWN_FLAGS: u8 = FLAG_MAX_CELLS | FLAG_MAX_BYTES | FLAG_MAX_EDGES | FLAG_ENCRYPTED;

/// The smallest encoded grant: `uid: u32`, `read_only: bool`.
const GRANT_BYTES: usize = 4 + 1;
/// The smallest encoded namespace name: a length and one byte.
const MIN_NAME_BYTES: usize = 2;

/// The space-filling curve a namespace orders its cells along, fixed when
/// it is created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CurveChoice {
    /// Whatever the daemon is configured to use. Only ever asked for: a
    /// namespace that exists always reports the curve it actually has.
    #[default]
    ServerDefault = 0,
    /// Z-order: cheap to compute.
    Morton = 1,
    /// Hilbert: better locality for region reads.
    Hilbert = 2,
}

impl CurveChoice {
    pub fn from_u8(raw: u8) -> Option<CurveChoice> {
        match raw {
            0 => Some(CurveChoice::ServerDefault),
            1 => Some(CurveChoice::Morton),
            2 => Some(CurveChoice::Hilbert),
            _ => None,
        }
    }

    /// `default`, `morton` or `hilbert`: the CLI's spelling.
    pub fn name(self) -> &'static str {
        match self {
            CurveChoice::ServerDefault => "default",
            CurveChoice::Morton => "morton",
            CurveChoice::Hilbert => "hilbert",
        }
    }
}

impl fmt::Display for CurveChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What `ns-create` asks for. The default is the server's curve, no
/// quotas, not encrypted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NamespaceSpec {
    pub curve: CurveChoice,
    /// Most cells holding a value; `None`: no quota.
    pub max_cells: Option<u64>,
    /// Most value bytes stored (the sum of the values' lengths); `None`:
    /// no quota.
    pub max_bytes: Option<u64>,
    /// Most edges; `None`: no quota.
    pub max_edges: Option<u64>,
    /// Seal the namespace's log records and checkpoint blocks with
    /// AES-256-GCM (the daemon needs `--key-file`).
    pub encrypted: bool,
}

/// One entry of a namespace's access list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NamespaceGrant {
    /// The user the grant is for (a connection's peer uid).
    pub uid: u32,
    /// `true`: read only; `false`: read and write.
    pub read_only: bool,
}

/// What the daemon says about a namespace: identity, settings, use and
/// access list. The answer to `ns-create`, `ns-info`, `ns-grant` and
/// `ns-revoke`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceInfo {
    pub name: NamespaceName,
    /// The daemon's own id for the namespace, never reused (the name can
    /// be, after a drop). Encryption keys derive from it.
    pub id: u64,
    /// The curve it actually uses: [`CurveChoice::Morton`] or
    /// [`CurveChoice::Hilbert`], never `ServerDefault`.
    pub curve: CurveChoice,
    pub encrypted: bool,
    /// The uid that created it.
    pub owner_uid: u32,
    /// Cells holding a value.
    pub cells: u64,
    /// Value bytes stored.
    pub bytes: u64,
    pub edges: u64,
    /// Cells holding a program.
    pub programs: u64,
    pub max_cells: Option<u64>,
    pub max_bytes: Option<u64>,
    pub max_edges: Option<u64>,
    /// At most [`MAX_GRANTS`], in ascending uid order, each uid once.
    pub grants: Vec<NamespaceGrant>,
}

// ---------------------------------------------------------------------------
// Field codecs (used by `request.rs` and `response.rs`).
// ---------------------------------------------------------------------------

fn quota_flags(max_cells: Option<u64>, max_bytes: Option<u64>, max_edges: Option<u64>) -> u8 {
    let mut flags = 0;
    if max_cells.is_some() {
        flags |= FLAG_MAX_CELLS;
    }
    if max_bytes.is_some() {
        flags |= FLAG_MAX_BYTES;
    }
    if max_edges.is_some() {
        flags |= FLAG_MAX_EDGES;
    }
    flags
}

fn put_quotas(b: &mut Vec<u8>, quotas: [Option<u64>; 3]) {
    for quota in quotas.into_iter().flatten() {
        put_u64(b, quota);
    }
}

/// Reads the quotas whose presence bits are set in `flags`, in the order
/// cells, bytes, edges.
fn read_quotas(r: &mut BodyReader<'_>, flags: u8) -> Result<[Option<u64>; 3], DecodeError> {
    let mut quotas = [None; 3];
    for (slot, bit) in quotas
        .iter_mut()
        .zip([FLAG_MAX_CELLS, FLAG_MAX_BYTES, FLAG_MAX_EDGES])
    {
        if flags & bit != 0 {
            *slot = Some(r.u64()?);
        }
    }
    Ok(quotas)
}

fn read_curve(r: &mut BodyReader<'_>, what: &'static str) -> Result<CurveChoice, DecodeError> {
    let raw = r.u8()?;
    CurveChoice::from_u8(raw).ok_or(DecodeError::BadField {
        what,
        got: u64::from(raw),
    })
}

/// `curve: u8`, `flags: u8`, then the quotas `flags` announces.
pub(crate) fn put_spec(b: &mut Vec<u8>, spec: &NamespaceSpec) {
    b.push(spec.curve as u8);
    let mut flags = quota_flags(spec.max_cells, spec.max_bytes, spec.max_edges);
    if spec.encrypted {
        flags |= FLAG_ENCRYPTED;
    }
    b.push(flags);
    put_quotas(b, [spec.max_cells, spec.max_bytes, spec.max_edges]);
}

pub(crate) fn read_spec(r: &mut BodyReader<'_>) -> Result<NamespaceSpec, DecodeError> {
    let curve = read_curve(r, "namespace curve")?;
    let flags = r.flags(KNOWN_FLAGS, "namespace flags")?;
    let [max_cells, max_bytes, max_edges] = read_quotas(r, flags)?;
    Ok(NamespaceSpec {
        curve,
        max_cells,
        max_bytes,
        max_edges,
        encrypted: flags & FLAG_ENCRYPTED != 0,
    })
}

/// `name: ns`, `id: u64`, `curve: u8` (1 or 2), `flags: u8`, `owner_uid:
/// u32`, `cells`, `bytes`, `edges`, `programs` (each `u64`), the quotas
/// `flags` announces, `grant count: u16` (at most [`MAX_GRANTS`]) and per
/// grant `uid: u32`, `read_only: bool`.
pub(crate) fn put_info(b: &mut Vec<u8>, info: &NamespaceInfo) {
    put_namespace(b, &info.name);
    put_u64(b, info.id);
    b.push(info.curve as u8);
    let mut flags = quota_flags(info.max_cells, info.max_bytes, info.max_edges);
    if info.encrypted {
        flags |= FLAG_ENCRYPTED;
    }
    b.push(flags);
    put_u32(b, info.owner_uid);
    for figure in [info.cells, info.bytes, info.edges, info.programs] {
        put_u64(b, figure);
    }
    put_quotas(b, [info.max_cells, info.max_bytes, info.max_edges]);
    let grants = &info.grants[..info.grants.len().min(MAX_GRANTS)];
    put_u16(b, grants.len() as u16);
    for grant in grants {
        put_u32(b, grant.uid);
        b.push(u8::from(grant.read_only));
    }
}

pub(crate) fn read_info(r: &mut BodyReader<'_>) -> Result<NamespaceInfo, DecodeError> {
    let name = r.namespace()?;
    let id = r.u64()?;
    let curve = read_curve(r, "namespace curve")?;
    if curve == CurveChoice::ServerDefault {
        // An existing namespace has a real curve; 0 is only a request.
        return Err(DecodeError::BadField {
            what: "curve of an existing namespace",
            got: 0,
        });
    }
    let flags = r.flags(KNOWN_FLAGS, "namespace flags")?;
    let owner_uid = r.u32()?;
    let cells = r.u64()?;
    let bytes = r.u64()?;
    let edges = r.u64()?;
    let programs = r.u64()?;
    let [max_cells, max_bytes, max_edges] = read_quotas(r, flags)?;
    let count = usize::from(r.u16()?);
    if count > MAX_GRANTS {
        return Err(DecodeError::TooMany {
            what: "namespace grant count",
            got: count as u64,
            limit: MAX_GRANTS as u64,
        });
    }
    check_fits(r, count, GRANT_BYTES)?;
    let mut grants = Vec::with_capacity(count);
    for _ in 0..count {
        grants.push(NamespaceGrant {
            uid: r.u32()?,
            read_only: r.bool()?,
        });
    }
    Ok(NamespaceInfo {
        name,
        id,
        curve,
        encrypted: flags & FLAG_ENCRYPTED != 0,
        owner_uid,
        cells,
        bytes,
        edges,
        programs,
        max_cells,
        max_bytes,
        max_edges,
        grants,
    })
}

/// `count: u32` (at most [`MAX_LISTED_NAMESPACES`]), then `count` names.
pub(crate) fn put_name_list(b: &mut Vec<u8>, names: &[NamespaceName]) {
    let names = &names[..names.len().min(MAX_LISTED_NAMESPACES)];
    put_u32(b, names.len() as u32);
    for name in names {
        put_namespace(b, name);
    }
}

pub(crate) fn read_name_list(r: &mut BodyReader<'_>) -> Result<Vec<NamespaceName>, DecodeError> {
    let count = r.u32()?;
    if count as usize > MAX_LISTED_NAMESPACES {
        return Err(DecodeError::TooMany {
            what: "namespace count",
            got: u64::from(count),
            limit: MAX_LISTED_NAMESPACES as u64,
        });
    }
    let count = count as usize;
    check_fits(r, count, MIN_NAME_BYTES)?;
    let mut names = Vec::with_capacity(count);
    for _ in 0..count {
        names.push(r.namespace()?);
    }
    Ok(names)
}

/// A list of `count` items of at least `min_bytes` each must fit in what
/// the body still holds, so a forged count reserves nothing.
fn check_fits(r: &BodyReader<'_>, count: usize, min_bytes: usize) -> Result<(), DecodeError> {
    let needed = count.saturating_mul(min_bytes);
    if needed > r.remaining() {
        return Err(DecodeError::Truncated {
            offset: 0,
            needed: needed - r.remaining(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;
    use crate::frame::{FrameHeader, HEADER_BYTES, Limits, Opcode, RESPONSE_BIT, encode_frame};
    use crate::{Request, Response};

    fn ns(name: &str) -> NamespaceName {
        NamespaceName::new(name).unwrap()
    }

    fn info() -> NamespaceInfo {
        NamespaceInfo {
            name: ns("tenant-a"),
            id: 7,
            curve: CurveChoice::Hilbert,
            encrypted: true,
            owner_uid: 1000,
            cells: 12,
            bytes: 345,
            edges: 6,
            programs: 1,
            max_cells: Some(1000),
            max_bytes: None,
            max_edges: Some(u64::MAX),
            grants: vec![
                NamespaceGrant {
                    uid: 1001,
                    read_only: true,
                },
                NamespaceGrant {
                    uid: 1002,
                    read_only: false,
                },
            ],
        }
    }

    fn requests() -> Vec<Request> {
        let full = NamespaceSpec {
            curve: CurveChoice::Morton,
            max_cells: Some(1),
            max_bytes: Some(10 << 20),
            max_edges: Some(0),
            encrypted: true,
        };
        vec![
            Request::NsCreate {
                ns: ns("a"),
                spec: NamespaceSpec::default(),
            },
            Request::NsCreate {
                ns: ns(&"z".repeat(64)),
                spec: full,
            },
            Request::NsCreate {
                ns: ns("b"),
                spec: NamespaceSpec {
                    curve: CurveChoice::Hilbert,
                    max_bytes: Some(5),
                    ..NamespaceSpec::default()
                },
            },
            Request::NsDrop { ns: ns("a") },
            Request::NsList,
            Request::NsInfo { ns: ns("a_b") },
            Request::NsGrant {
                ns: ns("a"),
                uid: u32::MAX,
                read_only: true,
            },
            Request::NsRevoke {
                ns: ns("a"),
                uid: 0,
            },
        ]
    }

    fn responses() -> Vec<Response> {
        let bare = NamespaceInfo {
            curve: CurveChoice::Morton,
            encrypted: false,
            max_cells: None,
            max_edges: None,
            grants: Vec::new(),
            ..info()
        };
        vec![
            Response::NsCreated(bare.clone()),
            Response::NsInfo(info()),
            Response::NsGranted(info()),
            Response::NsRevoked(bare),
            Response::NsDropped { lsn: 99, cells: 12 },
            Response::NsList(Vec::new()),
            Response::NsList(vec![ns("a"), ns("default"), ns(&"z".repeat(64))]),
        ]
    }

    fn split(frame: &[u8]) -> (FrameHeader, &[u8]) {
        let header = FrameHeader::parse(frame[..HEADER_BYTES].try_into().unwrap());
        header.verify_body(&frame[HEADER_BYTES..]).unwrap();
        (header, &frame[HEADER_BYTES..])
    }

    fn body_frame(opcode: u16, body: &[u8]) -> (FrameHeader, Vec<u8>) {
        let mut out = Vec::new();
        encode_frame(&mut out, opcode, 1, |b| b.extend_from_slice(body));
        let (header, body) = split(&out);
        (header, body.to_vec())
    }

    #[test]
    fn opcodes_are_0x0030_to_0x0035() {
        let ops: Vec<u16> = requests().iter().map(|r| r.opcode() as u16).collect();
        assert_eq!(ops, [0x30, 0x30, 0x30, 0x31, 0x32, 0x33, 0x34, 0x35]);
        assert_eq!(Response::NsCreated(info()).opcode(), Opcode::NsCreate);
        assert_eq!(Response::NsInfo(info()).opcode(), Opcode::NsInfo);
        assert_eq!(Response::NsGranted(info()).opcode(), Opcode::NsGrant);
        assert_eq!(Response::NsRevoked(info()).opcode(), Opcode::NsRevoke);
        assert_eq!(Opcode::NsCreate.name(), "ns-create");
        assert_eq!(Opcode::from_u16(0x0035), Some(Opcode::NsRevoke));
    }

    #[test]
    fn every_request_and_response_round_trips() {
        for req in requests() {
            let mut out = Vec::new();
            req.encode(5, &mut out);
            let (header, body) = split(&out);
            assert_eq!(
                Request::decode(&header, body, &Limits::default()).unwrap(),
                req
            );
        }
        for resp in responses() {
            let mut out = Vec::new();
            resp.encode(6, &mut out);
            let (header, body) = split(&out);
            assert_eq!(
                Response::decode(&header, body, &Limits::default()).unwrap(),
                Ok(resp)
            );
        }
    }

    #[test]
    fn truncation_at_every_offset_is_refused() {
        for req in requests() {
            let mut out = Vec::new();
            req.encode(5, &mut out);
            let (header, body) = split(&out);
            for cut in 0..body.len() {
                let err = Request::decode(&header, &body[..cut], &Limits::default()).unwrap_err();
                assert!(
                    matches!(
                        err,
                        DecodeError::Truncated { .. } | DecodeError::BadNamespace(_)
                    ),
                    "{req:?} cut at {cut}: {err:?}"
                );
            }
            let mut longer = body.to_vec();
            longer.push(0);
            assert_eq!(
                Request::decode(&header, &longer, &Limits::default()),
                Err(DecodeError::TrailingBytes { trailing: 1 })
            );
        }
        for resp in responses() {
            let mut out = Vec::new();
            resp.encode(6, &mut out);
            let (header, body) = split(&out);
            for cut in 0..body.len() {
                let err = Response::decode(&header, &body[..cut], &Limits::default()).unwrap_err();
                assert!(
                    matches!(
                        err,
                        DecodeError::Truncated { .. } | DecodeError::BadNamespace(_)
                    ),
                    "{resp:?} cut at {cut}: {err:?}"
                );
            }
        }
    }

    #[test]
    fn spec_layout_is_curve_flags_then_present_quotas() {
        let req = Request::NsCreate {
            ns: ns("q"),
            spec: NamespaceSpec {
                curve: CurveChoice::Hilbert,
                max_cells: None,
                max_bytes: Some(0x0102),
                max_edges: Some(3),
                encrypted: true,
            },
        };
        let mut out = Vec::new();
        req.encode(1, &mut out);
        let body = &out[HEADER_BYTES..];
        let mut expected = vec![1, b'q', 2, 0x02 | 0x04 | 0x08];
        expected.extend_from_slice(&0x0102u64.to_le_bytes());
        expected.extend_from_slice(&3u64.to_le_bytes());
        assert_eq!(body, &expected[..]);
    }

    #[test]
    fn unknown_flags_and_curves_are_malformed() {
        // ns-create "q": curve, flags.
        for (curve, flags) in [(3u8, 0u8), (0xff, 0), (0, 0x10), (1, 0x80), (2, 0xf0)] {
            let (header, body) = body_frame(Opcode::NsCreate as u16, &[1, b'q', curve, flags]);
            let err = Request::decode(&header, &body, &Limits::default()).unwrap_err();
            assert_eq!(err.code(), ErrorCode::MalformedFrame, "{curve} {flags}");
        }
        // ns-grant with read_only = 2.
        let mut grant = vec![1, b'q'];
        grant.extend_from_slice(&5u32.to_le_bytes());
        grant.push(2);
        let (header, body) = body_frame(Opcode::NsGrant as u16, &grant);
        let err = Request::decode(&header, &body, &Limits::default()).unwrap_err();
        assert_eq!(err.code(), ErrorCode::MalformedFrame);
        // A bad name is bad_namespace, as everywhere.
        let (header, body) = body_frame(Opcode::NsInfo as u16, &[2, b'Q', b'!']);
        let err = Request::decode(&header, &body, &Limits::default()).unwrap_err();
        assert_eq!(err.code(), ErrorCode::BadNamespace);
    }

    /// An ok info body for namespace "q" up to (not including) the grant
    /// count, with `curve` and `flags` as given and no quotas.
    fn info_prefix(curve: u8, flags: u8) -> Vec<u8> {
        let mut b = vec![0u8, 1, b'q'];
        b.extend_from_slice(&1u64.to_le_bytes());
        b.push(curve);
        b.push(flags);
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&[0u8; 32]);
        b
    }

    #[test]
    fn info_answers_refuse_default_curve_unknown_flags_and_bad_grants() {
        let opcode = Opcode::NsInfo as u16 | RESPONSE_BIT;
        let mut good = info_prefix(1, 0);
        good.extend_from_slice(&0u16.to_le_bytes());
        let (header, body) = body_frame(opcode, &good);
        assert!(matches!(
            Response::decode(&header, &body, &Limits::default()),
            Ok(Ok(Response::NsInfo(_)))
        ));
        for (curve, flags) in [(0u8, 0u8), (3, 0), (1, 0x10), (2, 0x80)] {
            let mut b = info_prefix(curve, flags);
            b.extend_from_slice(&0u16.to_le_bytes());
            let (header, body) = body_frame(opcode, &b);
            let err = Response::decode(&header, &body, &Limits::default()).unwrap_err();
            assert_eq!(err.code(), ErrorCode::MalformedFrame, "{curve} {flags}");
        }
        // A grant whose read_only byte is not a bool.
        let mut b = info_prefix(1, 0);
        b.extend_from_slice(&1u16.to_le_bytes());
        b.extend_from_slice(&7u32.to_le_bytes());
        b.push(9);
        let (header, body) = body_frame(opcode, &b);
        let err = Response::decode(&header, &body, &Limits::default()).unwrap_err();
        assert_eq!(err.code(), ErrorCode::MalformedFrame);
    }

    #[test]
    fn oversized_or_lying_counts_are_refused_before_reserving() {
        let opcode = Opcode::NsInfo as u16 | RESPONSE_BIT;
        // 257 grants: over the limit, whatever follows.
        let mut b = info_prefix(2, 0);
        b.extend_from_slice(&(MAX_GRANTS as u16 + 1).to_le_bytes());
        b.extend_from_slice(&vec![0u8; GRANT_BYTES * (MAX_GRANTS + 1)]);
        let (header, body) = body_frame(opcode, &b);
        assert!(matches!(
            Response::decode(&header, &body, &Limits::default()),
            Err(DecodeError::TooMany { .. })
        ));
        // 256 grants claimed, 4 bytes present.
        let mut b = info_prefix(2, 0);
        b.extend_from_slice(&(MAX_GRANTS as u16).to_le_bytes());
        b.extend_from_slice(&[0u8; 4]);
        let (header, body) = body_frame(opcode, &b);
        assert!(matches!(
            Response::decode(&header, &body, &Limits::default()),
            Err(DecodeError::Truncated { .. })
        ));
        // Exactly 256 grants is fine.
        let mut b = info_prefix(2, 0);
        b.extend_from_slice(&(MAX_GRANTS as u16).to_le_bytes());
        for uid in 0..MAX_GRANTS as u32 {
            b.extend_from_slice(&uid.to_le_bytes());
            b.push(1);
        }
        let (header, body) = body_frame(opcode, &b);
        match Response::decode(&header, &body, &Limits::default()) {
            Ok(Ok(Response::NsInfo(info))) => assert_eq!(info.grants.len(), MAX_GRANTS),
            other => panic!("{other:?}"),
        }

        let opcode = Opcode::NsList as u16 | RESPONSE_BIT;
        for (count, tail) in [
            (u32::MAX, 0usize),
            (MAX_LISTED_NAMESPACES as u32 + 1, 0),
            (MAX_LISTED_NAMESPACES as u32, 3),
        ] {
            let mut b = vec![0u8];
            b.extend_from_slice(&count.to_le_bytes());
            b.extend_from_slice(&vec![b'a'; tail]);
            let (header, body) = body_frame(opcode, &b);
            assert!(
                matches!(
                    Response::decode(&header, &body, &Limits::default()),
                    Err(DecodeError::TooMany { .. } | DecodeError::Truncated { .. })
                ),
                "{count}"
            );
        }
    }

    #[test]
    fn encoders_cut_lists_to_what_decoders_accept() {
        let mut many = info();
        many.grants = (0..MAX_GRANTS as u32 + 10)
            .map(|uid| NamespaceGrant {
                uid,
                read_only: false,
            })
            .collect();
        let mut out = Vec::new();
        Response::NsInfo(many.clone()).encode(1, &mut out);
        let (header, body) = split(&out);
        many.grants.truncate(MAX_GRANTS);
        assert_eq!(
            Response::decode(&header, body, &Limits::default()).unwrap(),
            Ok(Response::NsInfo(many))
        );
    }

    #[test]
    fn curve_names() {
        assert_eq!(CurveChoice::default(), CurveChoice::ServerDefault);
        assert_eq!(CurveChoice::Hilbert.to_string(), "hilbert");
        assert_eq!(CurveChoice::from_u8(1), Some(CurveChoice::Morton));
        assert_eq!(CurveChoice::from_u8(3), None);
    }
}
