//! Mutations: the logical content of a WAL record.
//!
//! Each record kind has one payload layout (see `docs/storage-format.md`).
//! Adding a kind means adding a variant here, its encode/decode arms, and
//! its apply arm in [`crate::MemStore`].

use byteorder::{ByteOrder, LittleEndian};
use cube_protocol::{Coord, EdgeLabel, EdgeWeight, NamespaceName};

use crate::edges::EdgeKey;
use crate::namespace::NamespaceMeta;
use crate::programs::{
    TelemetryChange, put_telemetry_payload, read_telemetry_payload, telemetry_payload_len,
};

/// Record kinds as stored on disk. Numbers never change meaning.
pub(crate) const KIND_PUT: u8 = 1;
pub(crate) const KIND_DEL: u8 = 2;
pub(crate) const KIND_LINK: u8 = 3;
pub(crate) const KIND_UNLINK: u8 = 4;
pub(crate) const KIND_DETACH: u8 = 5;
pub(crate) const KIND_NAMESPACE_CREATE: u8 = 6;
pub(crate) const KIND_NAMESPACE_DROP: u8 = 7;
pub(crate) const KIND_PROGRAM_PUT: u8 = 8;
pub(crate) const KIND_PROGRAM_DEL: u8 = 9;
pub(crate) const KIND_TELEMETRY: u8 = 10;
pub(crate) const KIND_NAMESPACE_ALTER: u8 = 11;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mutation {
    Put {
        ns: NamespaceName,
        coord: Coord,
        value: Vec<u8>,
    },
    Del {
        ns: NamespaceName,
        coord: Coord,
    },
    /// Creates the edge, or sets its weight if it exists.
    Link {
        ns: NamespaceName,
        edge: EdgeKey,
        weight: EdgeWeight,
    },
    /// Removes the edge if it exists.
    Unlink {
        ns: NamespaceName,
        edge: EdgeKey,
    },
    /// Deletes the value at `coord` and exactly the listed edges. The
    /// writer fills `edges` with every edge incident to `coord` at commit
    /// time, so the record says what it removes: recovery and the
    /// checkpoint fold (which sees records, not state) both need that.
    Detach {
        ns: NamespaceName,
        coord: Coord,
        edges: Vec<EdgeKey>,
    },
    /// Stores a cell's program source (replacing any), compiled and
    /// checked by the server first. Recovery restores the source; it never
    /// runs a program.
    ProgramPut {
        ns: NamespaceName,
        coord: Coord,
        source: Vec<u8>,
    },
    /// Removes a cell's program.
    ProgramDel {
        ns: NamespaceName,
        coord: Coord,
    },
    /// A cell's run telemetry (`crate::programs`).
    Telemetry {
        ns: NamespaceName,
        coord: Coord,
        change: TelemetryChange,
    },
    /// Creates a namespace. The writer sets `meta.id` to this record's LSN.
    NamespaceCreate {
        ns: NamespaceName,
        meta: NamespaceMeta,
    },
    /// Drops a namespace and everything in it.
    NamespaceDrop {
        ns: NamespaceName,
    },
    /// Replaces a namespace's metadata (grants, revokes); same id.
    NamespaceAlter {
        ns: NamespaceName,
        meta: NamespaceMeta,
    },
}

impl Mutation {
    pub fn namespace(&self) -> &NamespaceName {
        match self {
            Mutation::Put { ns, .. }
            | Mutation::Del { ns, .. }
            | Mutation::Link { ns, .. }
            | Mutation::Unlink { ns, .. }
            | Mutation::Detach { ns, .. }
            | Mutation::ProgramPut { ns, .. }
            | Mutation::ProgramDel { ns, .. }
            | Mutation::Telemetry { ns, .. }
            | Mutation::NamespaceCreate { ns, .. }
            | Mutation::NamespaceDrop { ns }
            | Mutation::NamespaceAlter { ns, .. } => ns,
        }
    }

    /// Whether this changes a namespace itself rather than its contents.
    pub fn is_namespace_change(&self) -> bool {
        matches!(
            self,
            Mutation::NamespaceCreate { .. }
                | Mutation::NamespaceDrop { .. }
                | Mutation::NamespaceAlter { .. }
        )
    }

    pub(crate) fn kind(&self) -> u8 {
        match self {
            Mutation::Put { .. } => KIND_PUT,
            Mutation::Del { .. } => KIND_DEL,
            Mutation::Link { .. } => KIND_LINK,
            Mutation::Unlink { .. } => KIND_UNLINK,
            Mutation::Detach { .. } => KIND_DETACH,
            Mutation::ProgramPut { .. } => KIND_PROGRAM_PUT,
            Mutation::ProgramDel { .. } => KIND_PROGRAM_DEL,
            Mutation::Telemetry { .. } => KIND_TELEMETRY,
            Mutation::NamespaceCreate { .. } => KIND_NAMESPACE_CREATE,
            Mutation::NamespaceDrop { .. } => KIND_NAMESPACE_DROP,
            Mutation::NamespaceAlter { .. } => KIND_NAMESPACE_ALTER,
        }
    }

    /// Payload bytes this mutation will take in a record.
    pub(crate) fn payload_len(&self) -> usize {
        match self {
            Mutation::Put { ns, value, .. } => 1 + ns.as_str().len() + 12 + 4 + value.len(),
            Mutation::Del { ns, .. } => 1 + ns.as_str().len() + 12,
            Mutation::Link { ns, edge, .. } => 1 + ns.as_str().len() + edge_key_len(edge) + 8,
            Mutation::Unlink { ns, edge } => 1 + ns.as_str().len() + edge_key_len(edge),
            Mutation::Detach { ns, edges, .. } => {
                1 + ns.as_str().len() + 12 + 4 + edges.iter().map(edge_key_len).sum::<usize>()
            }
            Mutation::ProgramPut { ns, source, .. } => {
                1 + ns.as_str().len() + 12 + 4 + source.len()
            }
            Mutation::ProgramDel { ns, .. } => 1 + ns.as_str().len() + 12,
            Mutation::Telemetry { ns, change, .. } => {
                1 + ns.as_str().len() + 12 + telemetry_payload_len(change)
            }
            Mutation::NamespaceCreate { ns, meta } | Mutation::NamespaceAlter { ns, meta } => {
                1 + ns.as_str().len() + meta.encoded_len()
            }
            Mutation::NamespaceDrop { ns } => 1 + ns.as_str().len(),
        }
    }

    pub(crate) fn encode_payload(&self, out: &mut Vec<u8>) {
        match self {
            Mutation::Put { ns, coord, value } => {
                put_ns_coord(out, ns, *coord);
                out.extend_from_slice(&(value.len() as u32).to_le_bytes());
                out.extend_from_slice(value);
            }
            Mutation::Del { ns, coord } => put_ns_coord(out, ns, *coord),
            Mutation::Link { ns, edge, weight } => {
                put_ns_coord(out, ns, edge.from);
                put_edge_rest(out, edge);
                out.extend_from_slice(&weight.get().to_bits().to_le_bytes());
            }
            Mutation::Unlink { ns, edge } => {
                put_ns_coord(out, ns, edge.from);
                put_edge_rest(out, edge);
            }
            Mutation::Detach { ns, coord, edges } => {
                put_ns_coord(out, ns, *coord);
                out.extend_from_slice(&(edges.len() as u32).to_le_bytes());
                for edge in edges {
                    put_coord(out, edge.from);
                    put_edge_rest(out, edge);
                }
            }
            Mutation::ProgramPut { ns, coord, source } => {
                put_ns_coord(out, ns, *coord);
                out.extend_from_slice(&(source.len() as u32).to_le_bytes());
                out.extend_from_slice(source);
            }
            Mutation::ProgramDel { ns, coord } => put_ns_coord(out, ns, *coord),
            Mutation::Telemetry { ns, coord, change } => {
                put_ns_coord(out, ns, *coord);
                put_telemetry_payload(out, change);
            }
            Mutation::NamespaceCreate { ns, meta } | Mutation::NamespaceAlter { ns, meta } => {
                put_ns(out, ns);
                meta.encode(out);
            }
            Mutation::NamespaceDrop { ns } => put_ns(out, ns),
        }
    }

    /// Decodes a payload whose CRC already matched. A failure here means the
    /// log was written by something else, so the caller reports corruption.
    pub(crate) fn decode(kind: u8, payload: &[u8]) -> Result<Mutation, String> {
        let mut reader = PayloadReader {
            payload,
            at: 0,
            kind,
        };
        let ns_len = usize::from(reader.take(1)?[0]);
        let ns_text =
            std::str::from_utf8(reader.take(ns_len)?).map_err(|_| "namespace not UTF-8")?;
        let ns = NamespaceName::new(ns_text).map_err(|e| e.to_string())?;
        match kind {
            KIND_NAMESPACE_CREATE | KIND_NAMESPACE_ALTER => {
                let meta = NamespaceMeta::decode(reader.rest())?;
                return Ok(if kind == KIND_NAMESPACE_CREATE {
                    Mutation::NamespaceCreate { ns, meta }
                } else {
                    Mutation::NamespaceAlter { ns, meta }
                });
            }
            KIND_NAMESPACE_DROP if payload.len() == 1 + ns_len => {
                return Ok(Mutation::NamespaceDrop { ns });
            }
            KIND_NAMESPACE_DROP => return Err("trailing bytes in a namespace drop record".into()),
            _ => {}
        }
        let coord = reader.coord()?;
        let mutation = decode_cell_change(&mut reader, ns, coord)?;
        if reader.at != payload.len() {
            return Err(format!(
                "{} trailing bytes in a kind {kind} payload",
                payload.len() - reader.at
            ));
        }
        Ok(mutation)
    }
}

/// A payload read front to back; every read past its end is an error
/// naming the record kind and the byte.
struct PayloadReader<'a> {
    payload: &'a [u8],
    at: usize,
    kind: u8,
}

impl<'a> PayloadReader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|end| *end <= self.payload.len())
            .ok_or_else(|| {
                format!(
                    "payload of kind {} truncated at byte {}",
                    self.kind, self.at
                )
            })?;
        let slice = &self.payload[self.at..end];
        self.at = end;
        Ok(slice)
    }

    /// Everything not read yet.
    fn rest(&mut self) -> &'a [u8] {
        let rest = &self.payload[self.at..];
        self.at = self.payload.len();
        rest
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(LittleEndian::read_u32(self.take(4)?))
    }

    fn coord(&mut self) -> Result<Coord, String> {
        let c = self.take(12)?;
        Ok(Coord::new(
            LittleEndian::read_i32(&c[0..4]),
            LittleEndian::read_i32(&c[4..8]),
            LittleEndian::read_i32(&c[8..12]),
        ))
    }

    /// An edge from `from`: its other end and its label.
    fn edge_from(&mut self, from: Coord) -> Result<EdgeKey, String> {
        let to = self.coord()?;
        let len = usize::from(self.take(1)?[0]);
        let text = std::str::from_utf8(self.take(len)?).map_err(|_| "edge label not UTF-8")?;
        let label = EdgeLabel::new(text)?;
        Ok(EdgeKey::new(from, to, label))
    }
}

/// The change of a record about one cell (its kind is the reader's), read
/// after its namespace and coordinate.
fn decode_cell_change(
    reader: &mut PayloadReader<'_>,
    ns: NamespaceName,
    coord: Coord,
) -> Result<Mutation, String> {
    Ok(match reader.kind {
        KIND_PUT => {
            let len = reader.u32()? as usize;
            let value = reader.take(len)?.to_vec();
            Mutation::Put { ns, coord, value }
        }
        KIND_DEL => Mutation::Del { ns, coord },
        KIND_LINK => {
            let edge = reader.edge_from(coord)?;
            let bits = LittleEndian::read_u64(reader.take(8)?);
            let weight = EdgeWeight::new(f64::from_bits(bits))?;
            Mutation::Link { ns, edge, weight }
        }
        KIND_UNLINK => Mutation::Unlink {
            edge: reader.edge_from(coord)?,
            ns,
        },
        KIND_DETACH => {
            let count = reader.u32()? as usize;
            // Each listed edge is at least 25 bytes; never reserve more
            // than the payload could hold.
            let mut edges = Vec::with_capacity(count.min(reader.payload.len() / 25));
            for _ in 0..count {
                let from = reader.coord()?;
                edges.push(reader.edge_from(from)?);
            }
            Mutation::Detach { ns, coord, edges }
        }
        KIND_PROGRAM_PUT => {
            let len = reader.u32()? as usize;
            let source = reader.take(len)?.to_vec();
            Mutation::ProgramPut { ns, coord, source }
        }
        KIND_PROGRAM_DEL => Mutation::ProgramDel { ns, coord },
        KIND_TELEMETRY => Mutation::Telemetry {
            ns,
            coord,
            // The rest of the payload, after `ns` and `coord`.
            change: read_telemetry_payload(reader.rest())?,
        },
        other => return Err(format!("unknown record kind {other}")),
    })
}

fn put_ns(out: &mut Vec<u8>, ns: &NamespaceName) {
    out.push(ns.as_str().len() as u8);
    out.extend_from_slice(ns.as_str().as_bytes());
}

fn put_ns_coord(out: &mut Vec<u8>, ns: &NamespaceName, coord: Coord) {
    put_ns(out, ns);
    put_coord(out, coord);
}

fn put_coord(out: &mut Vec<u8>, coord: Coord) {
    out.extend_from_slice(&coord.x.to_le_bytes());
    out.extend_from_slice(&coord.y.to_le_bytes());
    out.extend_from_slice(&coord.z.to_le_bytes());
}

/// An edge's bytes after `from`: `to` (12), label length (`u8`), label.
fn put_edge_rest(out: &mut Vec<u8>, edge: &EdgeKey) {
    put_coord(out, edge.to);
    // EdgeLabel guarantees at most 64 bytes.
    out.push(edge.label.as_str().len() as u8);
    out.extend_from_slice(edge.label.as_str().as_bytes());
}

/// `from` + [`put_edge_rest`].
fn edge_key_len(edge: &EdgeKey) -> usize {
    12 + 12 + 1 + edge.label.as_str().len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_round_trip_and_sizes_match() {
        let ns = NamespaceName::new("default").unwrap();
        for m in [
            Mutation::Put {
                ns: ns.clone(),
                coord: Coord::new(-1, 2, i32::MIN),
                value: (0..=255).collect(),
            },
            Mutation::Del {
                ns: ns.clone(),
                coord: Coord::new(5, 6, 7),
            },
            Mutation::Link {
                ns: ns.clone(),
                edge: EdgeKey::new(
                    Coord::new(1, 2, 3),
                    Coord::new(-4, 5, i32::MAX),
                    EdgeLabel::new("road").unwrap(),
                ),
                weight: EdgeWeight::new(2.5).unwrap(),
            },
            Mutation::Unlink {
                ns: ns.clone(),
                edge: EdgeKey::new(
                    Coord::new(1, 2, 3),
                    Coord::new(1, 2, 3),
                    EdgeLabel::default(),
                ),
            },
            Mutation::Detach {
                ns: ns.clone(),
                coord: Coord::new(0, 0, 0),
                edges: vec![
                    EdgeKey::new(
                        Coord::new(0, 0, 0),
                        Coord::new(1, 0, 0),
                        EdgeLabel::new("é").unwrap(),
                    ),
                    EdgeKey::new(
                        Coord::new(9, 9, 9),
                        Coord::new(0, 0, 0),
                        EdgeLabel::default(),
                    ),
                ],
            },
            Mutation::Detach {
                ns: ns.clone(),
                coord: Coord::new(0, 0, 0),
                edges: Vec::new(),
            },
            Mutation::NamespaceCreate {
                ns: ns.clone(),
                meta: crate::namespace::NamespaceMeta::implicit_default(7),
            },
            Mutation::NamespaceAlter {
                ns: ns.clone(),
                meta: crate::namespace::NamespaceMeta::implicit_default(8),
            },
            Mutation::NamespaceDrop { ns },
        ] {
            let mut out = Vec::new();
            m.encode_payload(&mut out);
            assert_eq!(out.len(), m.payload_len());
            assert_eq!(Mutation::decode(m.kind(), &out).unwrap(), m);
            for cut in 0..out.len() {
                assert!(Mutation::decode(m.kind(), &out[..cut]).is_err());
            }
        }
    }
}

#[cfg(test)]
mod edge_tests {
    use super::*;

    #[test]
    fn a_link_record_with_a_bad_weight_is_refused() {
        let m = Mutation::Link {
            ns: NamespaceName::new("default").unwrap(),
            edge: EdgeKey::new(
                Coord::new(0, 0, 0),
                Coord::new(1, 0, 0),
                EdgeLabel::default(),
            ),
            weight: EdgeWeight::DEFAULT,
        };
        let mut out = Vec::new();
        m.encode_payload(&mut out);
        let at = out.len() - 8;
        out[at..].copy_from_slice(&f64::NAN.to_bits().to_le_bytes());
        assert!(
            Mutation::decode(KIND_LINK, &out)
                .unwrap_err()
                .contains("NaN")
        );
    }
}
