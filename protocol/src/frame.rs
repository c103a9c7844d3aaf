//! Frames: a fixed 20-byte header followed by a body.
//!
//! ```text
//! offset size field
//! 0      4    body_len     u32 LE, bytes after the header
//! 4      4    body_crc32c  u32 LE, CRC32C (Castagnoli) of the body
//! 8      2    version      u16 LE, PROTOCOL_VERSION
//! 10     2    opcode       u16 LE, request opcode; responses set bit 15
//! 12     8    request_id   u64 LE, chosen by the client, echoed back
//! ```

use std::io::{self, Read};

use crate::PROTOCOL_VERSION;
use crate::error::ProtocolError;

pub const HEADER_BYTES: usize = 20;

/// Bit 15 of the opcode marks a response.
pub const RESPONSE_BIT: u16 = 0x8000;

/// Request opcodes. A response carries `opcode | RESPONSE_BIT`; a response
/// to a frame whose opcode could not be decoded carries `RESPONSE_BIT` alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Opcode {
    Hello = 0x0001,
    Ping = 0x0002,
    Stats = 0x0003,
    Checkpoint = 0x0004,
    Backup = 0x0005,
    Put = 0x0010,
    Get = 0x0011,
    Del = 0x0012,
    /// Region read: the cells of a box, a page at a time.
    Scan = 0x0013,
    /// Many writes of one namespace (values, edges, programs) applied
    /// atomically: all of them or none (`cubec import`).
    Batch = 0x0014,
    /// Many point reads of one namespace, answered from one state of the
    /// store (`cubec mget`).
    Mget = 0x0015,
    /// Create an edge between two coordinates, or set its weight.
    Link = 0x0020,
    /// Remove an edge.
    Unlink = 0x0021,
    /// List the edges of a coordinate.
    Edges = 0x0022,
    /// Breadth-first walk from a coordinate.
    Walk = 0x0023,
    /// Cheapest path between two coordinates.
    Path = 0x0024,
    /// Delete a cell's value and every edge that touches it, atomically.
    Detach = 0x0025,
    /// Every edge of a namespace, a page at a time (`cubec export`).
    EdgeList = 0x0026,
    /// Create a namespace (curve, quotas, encryption).
    NsCreate = 0x0030,
    /// Drop a namespace and everything in it; the name can be reused.
    NsDrop = 0x0031,
    /// The namespaces this connection may see.
    NsList = 0x0032,
    /// A namespace's settings, use and access list.
    NsInfo = 0x0033,
    /// Give a uid read or read-write access to a namespace.
    NsGrant = 0x0034,
    /// Take a uid's access to a namespace away.
    NsRevoke = 0x0035,
    /// Store (or remove) the program of a cell.
    Prog = 0x0040,
    /// Run the program of a cell, atomically, on the writer thread.
    Run = 0x0041,
    /// A cell's program telemetry: run counts and recent records.
    CellStats = 0x0042,
    /// Every program of a namespace, a page at a time (`cubec export`).
    ProgramList = 0x0043,
    /// Run every program stored in a box once, each seeing the state from
    /// before the step; all writes commit as one group.
    Step = 0x0044,
    /// Follow the changes inside a box: answered by a stream of frames
    /// (`protocol/src/watch.rs`).
    Watch = 0x0050,
}

/// The command families the request and response codecs are split by
/// (`request.rs`, `response.rs`): one encoder and one decoder each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Family {
    /// hello, ping, stats, checkpoint, backup.
    Session,
    /// put, get, del, mget, scan.
    Cells,
    /// link, unlink, edges, walk, path, detach.
    Graph,
    /// ns-create, ns-drop, ns-list, ns-info, ns-grant, ns-revoke.
    Namespaces,
    /// prog, run, cell-stats, step.
    Programs,
    /// batch, edge-list, program-list, watch.
    Bulk,
}

impl Opcode {
    /// The family whose codec reads and writes this opcode's bodies.
    pub(crate) fn family(self) -> Family {
        match self {
            Opcode::Hello | Opcode::Ping | Opcode::Stats | Opcode::Checkpoint | Opcode::Backup => {
                Family::Session
            }
            Opcode::Put | Opcode::Get | Opcode::Del | Opcode::Mget | Opcode::Scan => Family::Cells,
            Opcode::Link
            | Opcode::Unlink
            | Opcode::Edges
            | Opcode::Walk
            | Opcode::Path
            | Opcode::Detach => Family::Graph,
            Opcode::NsCreate
            | Opcode::NsDrop
            | Opcode::NsList
            | Opcode::NsInfo
            | Opcode::NsGrant
            | Opcode::NsRevoke => Family::Namespaces,
            Opcode::Prog | Opcode::Run | Opcode::CellStats | Opcode::Step => Family::Programs,
            Opcode::Batch | Opcode::EdgeList | Opcode::ProgramList | Opcode::Watch => Family::Bulk,
        }
    }

    pub const ALL: [Opcode; 30] = [
        Opcode::Hello,
        Opcode::Ping,
        Opcode::Stats,
        Opcode::Checkpoint,
        Opcode::Backup,
        Opcode::Put,
        Opcode::Get,
        Opcode::Del,
        Opcode::Scan,
        Opcode::Batch,
        Opcode::Mget,
        Opcode::Link,
        Opcode::Unlink,
        Opcode::Edges,
        Opcode::Walk,
        Opcode::Path,
        Opcode::Detach,
        Opcode::EdgeList,
        Opcode::NsCreate,
        Opcode::NsDrop,
        Opcode::NsList,
        Opcode::NsInfo,
        Opcode::NsGrant,
        Opcode::NsRevoke,
        Opcode::Prog,
        Opcode::Run,
        Opcode::CellStats,
        Opcode::ProgramList,
        Opcode::Step,
        Opcode::Watch,
    ];

    pub fn from_u16(raw: u16) -> Option<Opcode> {
        Opcode::ALL.into_iter().find(|op| *op as u16 == raw)
    }

    /// The command name used in stats, logs and the CLI.
    pub fn name(self) -> &'static str {
        match self {
            Opcode::Hello => "hello",
            Opcode::Ping => "ping",
            Opcode::Stats => "stats",
            Opcode::Checkpoint => "checkpoint",
            Opcode::Backup => "backup",
            Opcode::Put => "put",
            Opcode::Get => "get",
            Opcode::Del => "del",
            Opcode::Scan => "scan",
            Opcode::Batch => "batch",
            Opcode::Mget => "mget",
            Opcode::Link => "link",
            Opcode::Unlink => "unlink",
            Opcode::Edges => "edges",
            Opcode::Walk => "walk",
            Opcode::Path => "path",
            Opcode::Detach => "detach",
            Opcode::EdgeList => "edge-list",
            Opcode::NsCreate => "ns-create",
            Opcode::NsDrop => "ns-drop",
            Opcode::NsList => "ns-list",
            Opcode::NsInfo => "ns-info",
            Opcode::NsGrant => "ns-grant",
            Opcode::NsRevoke => "ns-revoke",
            Opcode::Prog => "prog",
            Opcode::Run => "run",
            Opcode::CellStats => "cell-stats",
            Opcode::ProgramList => "prog-list",
            Opcode::Step => "step",
            Opcode::Watch => "watch",
        }
    }
}

/// Size limits. Both sides enforce them; the server announces its own in
/// the hello response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Header plus body.
    pub max_frame_bytes: u32,
    pub max_value_bytes: u32,
}

impl Limits {
    pub const DEFAULT_MAX_FRAME_BYTES: u32 = 16 * 1024 * 1024;
    pub const DEFAULT_MAX_VALUE_BYTES: u32 = 1024 * 1024;
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_frame_bytes: Limits::DEFAULT_MAX_FRAME_BYTES,
            max_value_bytes: Limits::DEFAULT_MAX_VALUE_BYTES,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub body_len: u32,
    pub body_crc32c: u32,
    pub version: u16,
    pub opcode: u16,
    pub request_id: u64,
}

/// The `N` header bytes at `at` (a field offset inside the fixed header).
fn header_field<const N: usize>(bytes: &[u8; HEADER_BYTES], at: usize) -> [u8; N] {
    let mut field = [0u8; N];
    field.copy_from_slice(&bytes[at..at + N]);
    field
}

impl FrameHeader {
    pub fn parse(bytes: &[u8; HEADER_BYTES]) -> FrameHeader {
        FrameHeader {
            body_len: u32::from_le_bytes(header_field(bytes, 0)),
            body_crc32c: u32::from_le_bytes(header_field(bytes, 4)),
            version: u16::from_le_bytes(header_field(bytes, 8)),
            opcode: u16::from_le_bytes(header_field(bytes, 10)),
            request_id: u64::from_le_bytes(header_field(bytes, 12)),
        }
    }

    pub fn to_bytes(&self) -> [u8; HEADER_BYTES] {
        let mut out = [0u8; HEADER_BYTES];
        out[0..4].copy_from_slice(&self.body_len.to_le_bytes());
        out[4..8].copy_from_slice(&self.body_crc32c.to_le_bytes());
        out[8..10].copy_from_slice(&self.version.to_le_bytes());
        out[10..12].copy_from_slice(&self.opcode.to_le_bytes());
        out[12..20].copy_from_slice(&self.request_id.to_le_bytes());
        out
    }

    /// Whole frame size, for limit checks.
    pub fn frame_bytes(&self) -> u64 {
        HEADER_BYTES as u64 + u64::from(self.body_len)
    }

    /// Checks the length against the limit before any body byte is read or
    /// any buffer is sized: a failure here means framing is lost.
    pub fn check_size(&self, limits: &Limits) -> Result<(), ProtocolError> {
        if self.frame_bytes() > u64::from(limits.max_frame_bytes) {
            return Err(ProtocolError::FrameTooLarge {
                got: self.frame_bytes(),
                limit: u64::from(limits.max_frame_bytes),
            });
        }
        Ok(())
    }

    /// Checks version and checksum once the body is in hand. A failure here
    /// leaves framing intact: answer with an error and read the next frame.
    pub fn verify_body(&self, body: &[u8]) -> Result<(), ProtocolError> {
        if self.version != PROTOCOL_VERSION {
            return Err(ProtocolError::VersionMismatch {
                got: self.version,
                supported: PROTOCOL_VERSION,
            });
        }
        let actual = crc32c::crc32c(body);
        if actual != self.body_crc32c {
            return Err(ProtocolError::BadChecksum {
                expected: self.body_crc32c,
                actual,
            });
        }
        Ok(())
    }
}

/// Appends a whole frame to `out`: the header, then whatever `write_body`
/// appends, with length and checksum filled in afterwards.
pub fn encode_frame(
    out: &mut Vec<u8>,
    opcode: u16,
    request_id: u64,
    write_body: impl FnOnce(&mut Vec<u8>),
) {
    let start = out.len();
    out.extend_from_slice(&[0u8; HEADER_BYTES]);
    write_body(out);
    let body = &out[start + HEADER_BYTES..];
    let header = FrameHeader {
        body_len: body.len() as u32,
        body_crc32c: crc32c::crc32c(body),
        version: PROTOCOL_VERSION,
        opcode,
        request_id,
    };
    out[start..start + HEADER_BYTES].copy_from_slice(&header.to_bytes());
}

/// Reads one frame into `body` (reused between calls). Only errors that lose
/// framing are returned here; call [`FrameHeader::verify_body`] next.
pub fn read_frame<R: Read>(
    reader: &mut R,
    limits: &Limits,
    body: &mut Vec<u8>,
) -> Result<FrameHeader, ProtocolError> {
    let mut header_bytes = [0u8; HEADER_BYTES];
    let got = read_full(reader, &mut header_bytes)?;
    if got == 0 {
        return Err(ProtocolError::Closed);
    }
    if got < HEADER_BYTES {
        return Err(ProtocolError::TruncatedFrame {
            got,
            expected: HEADER_BYTES,
        });
    }
    let header = FrameHeader::parse(&header_bytes);
    header.check_size(limits)?;
    // Grow the buffer with the bytes that actually arrive, a chunk at a
    // time, rather than to the declared length up front: a peer that sends
    // only a header cannot make the reader reserve 16 MiB.
    let declared = header.body_len as usize;
    body.clear();
    while body.len() < declared {
        let start = body.len();
        let chunk = (declared - start).min(BODY_CHUNK_BYTES);
        body.resize(start + chunk, 0);
        let got = read_full(reader, &mut body[start..])?;
        if got < chunk {
            body.truncate(start + got);
            return Err(ProtocolError::TruncatedFrame {
                got: HEADER_BYTES + body.len(),
                expected: HEADER_BYTES + declared,
            });
        }
    }
    Ok(header)
}

/// How much of a frame body is read (and allocated) at a time.
const BODY_CHUNK_BYTES: usize = 64 * 1024;

/// Reads until `buf` is full or the peer closes; returns the bytes read.
pub fn read_full<R: Read>(reader: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// A whole frame's header and body, the body checked against the header's
/// CRC (for the codec tests).
#[cfg(test)]
pub(crate) fn split_frame(frame: &[u8]) -> (FrameHeader, &[u8]) {
    let header = FrameHeader::parse(frame[..HEADER_BYTES].try_into().unwrap());
    header.verify_body(&frame[HEADER_BYTES..]).unwrap();
    (header, &frame[HEADER_BYTES..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let h = FrameHeader {
            body_len: 7,
            body_crc32c: 0xdead_beef,
            version: 1,
            opcode: 0x8010,
            request_id: u64::MAX - 3,
        };
        assert_eq!(FrameHeader::parse(&h.to_bytes()), h);
    }

    #[test]
    fn oversized_frame_is_refused_before_reading_the_body() {
        let h = FrameHeader {
            body_len: u32::MAX,
            body_crc32c: 0,
            version: 1,
            opcode: 2,
            request_id: 1,
        };
        let mut bytes = h.to_bytes().to_vec();
        bytes.extend_from_slice(b"short");
        let mut body = Vec::new();
        let err = read_frame(&mut bytes.as_slice(), &Limits::default(), &mut body).unwrap_err();
        assert!(matches!(err, ProtocolError::FrameTooLarge { .. }));
        assert!(body.capacity() < 1024, "no allocation for a refused frame");
    }

    #[test]
    fn truncated_and_closed_are_told_apart() {
        let mut body = Vec::new();
        let empty: &[u8] = &[];
        assert!(matches!(
            read_frame(&mut &*empty, &Limits::default(), &mut body),
            Err(ProtocolError::Closed)
        ));
        let partial: &[u8] = &[1, 2, 3];
        assert!(matches!(
            read_frame(&mut &*partial, &Limits::default(), &mut body),
            Err(ProtocolError::TruncatedFrame { got: 3, .. })
        ));
    }
}
