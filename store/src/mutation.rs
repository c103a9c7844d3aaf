//! Mutations: the logical content of a WAL record.
//!
//! Each record kind has one payload layout (see `docs/storage-format.md`).
//! Adding a kind means adding a variant here, its encode/decode arms, and
//! its apply arm in [`crate::MemStore`].

use byteorder::{ByteOrder, LittleEndian};
use cube_protocol::{Coord, NamespaceName};

/// Record kinds as stored on disk. Numbers never change meaning.
pub(crate) const KIND_PUT: u8 = 1;
pub(crate) const KIND_DEL: u8 = 2;

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
}

impl Mutation {
    pub fn namespace(&self) -> &NamespaceName {
        match self {
            Mutation::Put { ns, .. } | Mutation::Del { ns, .. } => ns,
        }
    }

    pub(crate) fn kind(&self) -> u8 {
        match self {
            Mutation::Put { .. } => KIND_PUT,
            Mutation::Del { .. } => KIND_DEL,
        }
    }

    /// Payload bytes this mutation will take in a record.
    pub(crate) fn payload_len(&self) -> usize {
        match self {
            Mutation::Put { ns, value, .. } => 1 + ns.as_str().len() + 12 + 4 + value.len(),
            Mutation::Del { ns, .. } => 1 + ns.as_str().len() + 12,
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
        }
    }

    /// Decodes a payload whose CRC already matched. A failure here means the
    /// log was written by something else, so the caller reports corruption.
    pub(crate) fn decode(kind: u8, payload: &[u8]) -> Result<Mutation, String> {
        let mut at = 0usize;
        let mut take = |n: usize| -> Result<&[u8], String> {
            let end = at
                .checked_add(n)
                .filter(|end| *end <= payload.len())
                .ok_or_else(|| format!("payload of kind {kind} truncated at byte {at}"))?;
            let slice = &payload[at..end];
            at = end;
            Ok(slice)
        };
        let ns_len = usize::from(take(1)?[0]);
        let ns_text = std::str::from_utf8(take(ns_len)?).map_err(|_| "namespace not UTF-8")?;
        let ns = NamespaceName::new(ns_text).map_err(|e| e.to_string())?;
        let c = take(12)?;
        let coord = Coord::new(
            LittleEndian::read_i32(&c[0..4]),
            LittleEndian::read_i32(&c[4..8]),
            LittleEndian::read_i32(&c[8..12]),
        );
        let mutation = match kind {
            KIND_PUT => {
                let len = LittleEndian::read_u32(take(4)?) as usize;
                let value = take(len)?.to_vec();
                Mutation::Put { ns, coord, value }
            }
            KIND_DEL => Mutation::Del { ns, coord },
            other => return Err(format!("unknown record kind {other}")),
        };
        if at != payload.len() {
            return Err(format!(
                "{} trailing bytes in a kind {kind} payload",
                payload.len() - at
            ));
        }
        Ok(mutation)
    }
}

fn put_ns_coord(out: &mut Vec<u8>, ns: &NamespaceName, coord: Coord) {
    out.push(ns.as_str().len() as u8);
    out.extend_from_slice(ns.as_str().as_bytes());
    out.extend_from_slice(&coord.x.to_le_bytes());
    out.extend_from_slice(&coord.y.to_le_bytes());
    out.extend_from_slice(&coord.z.to_le_bytes());
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
                ns,
                coord: Coord::new(5, 6, 7),
            },
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
