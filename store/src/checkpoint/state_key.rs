//! State entries: the key/value form of the store that checkpoint files
//! hold. A WAL record is an *event*; a state entry is *what is true*
//! after it. Folding the log is last-write-wins per state key.
//!
//! Keys sort by kind first (namespaces before cells before edges ...), then
//! namespace id, then the kind's own order (Morton order for cells), so a
//! base file loads each namespace's metadata first and its cells already
//! sorted.
//!
//! ```text
//! namespace key: 0x01 | ns_len u8 | ns bytes
//!           value: the namespace's metadata (namespace.rs)
//! cell key: 0x10 | ns_id u64 BE | morton key, 12 bytes big-endian
//! edge key: 0x20 | ns_id u64 BE | from morton key (12, BE) |
//!           to morton key (12, BE) | label bytes (0-64, to the end)
//!           value: the weight, f64 bits as u64 little-endian
//! ```
//! Everything but the namespace entry is keyed by the namespace's **id**,
//! not its name: a namespace dropped and created again gets a new id, so
//! entries of the old one left in older checkpoint files can never be read
//! as the new one's. Loading skips entries whose id is not a live
//! namespace; compaction drops them.
//!
//! An edge's key is its identity `(ns, from, to, label)`, so the fold's
//! last write per key is the edge's last link (its weight) or unlink (a
//! tombstone). A detach record becomes a cell tombstone plus one edge
//! tombstone per edge it lists. Edges sort by `from`, so a base file loads
//! each coordinate's outgoing edges together.
//! Programs (tag 0x30) and run telemetry (tag 0x40) are keyed and encoded
//! in `crate::programs`, with the same `ns_id` prefix.

use byteorder::{ByteOrder, LittleEndian};
use cube_protocol::{Coord, EdgeLabel, EdgeWeight, NamespaceName};

use crate::curve::{morton_decode, morton_key};
use crate::edges::EdgeKey;
use crate::mutation::Mutation;
use crate::namespace::NamespaceMeta;

pub(crate) const TAG_NAMESPACE: u8 = 0x01;
pub(crate) const TAG_CELL: u8 = 0x10;
pub(crate) const TAG_EDGE: u8 = 0x20;

/// A state change: `None` is a tombstone.
pub(crate) type StateUpdate = (Vec<u8>, Option<Vec<u8>>);

pub(crate) fn namespace_key(ns: &NamespaceName) -> Vec<u8> {
    let name = ns.as_str().as_bytes();
    let mut key = Vec::with_capacity(2 + name.len());
    key.push(TAG_NAMESPACE);
    key.push(name.len() as u8);
    key.extend_from_slice(name);
    key
}

pub(crate) fn cell_key(ns_id: u64, coord: Coord) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + 8 + 12);
    key.push(TAG_CELL);
    key.extend_from_slice(&ns_id.to_be_bytes());
    key.extend_from_slice(&morton_key(coord).to_be_bytes()[4..]);
    key
}

pub(crate) fn edge_key(ns_id: u64, edge: &EdgeKey) -> Vec<u8> {
    let label = edge.label.as_str().as_bytes();
    let mut key = Vec::with_capacity(1 + 8 + 24 + label.len());
    key.push(TAG_EDGE);
    key.extend_from_slice(&ns_id.to_be_bytes());
    key.extend_from_slice(&morton_key(edge.from).to_be_bytes()[4..]);
    key.extend_from_slice(&morton_key(edge.to).to_be_bytes()[4..]);
    key.extend_from_slice(label);
    key
}

/// The namespace id of any entry but a namespace entry; `None` for those
/// (and for a key too short to hold one).
pub(crate) fn entry_ns_id(key: &[u8]) -> Option<u64> {
    match key.first() {
        Some(&TAG_NAMESPACE) | None => None,
        Some(_) => Some(u64::from_be_bytes(key.get(1..9)?.try_into().ok()?)),
    }
}

/// A cell key's namespace id and Morton key, without allocating; `None`
/// for any other kind of key (or a malformed one, left to the slow path).
pub(crate) fn cell_key_parts(key: &[u8]) -> Option<(u64, u128)> {
    if key.len() != 1 + 8 + 12 || key[0] != TAG_CELL {
        return None;
    }
    let ns_id = u64::from_be_bytes(key[1..9].try_into().ok()?);
    let mut morton = [0u8; 16];
    morton[4..].copy_from_slice(&key[9..]);
    Some((ns_id, u128::from_be_bytes(morton)))
}

/// What a mutation makes true, as state updates; `ns_id` is the id of the
/// mutation's namespace when it was logged.
pub(crate) fn state_updates(mutation: &Mutation, ns_id: u64, out: &mut Vec<StateUpdate>) {
    match mutation {
        Mutation::Put { coord, value, .. } => {
            out.push((cell_key(ns_id, *coord), Some(value.clone())))
        }
        Mutation::Del { coord, .. } => out.push((cell_key(ns_id, *coord), None)),
        Mutation::Link { edge, weight, .. } => out.push((
            edge_key(ns_id, edge),
            Some(weight.get().to_bits().to_le_bytes().to_vec()),
        )),
        Mutation::Unlink { edge, .. } => out.push((edge_key(ns_id, edge), None)),
        Mutation::Detach { coord, edges, .. } => {
            out.push((cell_key(ns_id, *coord), None));
            out.extend(edges.iter().map(|edge| (edge_key(ns_id, edge), None)));
        }
        Mutation::ProgramPut { .. } | Mutation::ProgramDel { .. } | Mutation::Telemetry { .. } => {
            crate::programs::state_updates(mutation, ns_id, out)
        }
        Mutation::NamespaceCreate { ns, meta } | Mutation::NamespaceAlter { ns, meta } => {
            let mut value = Vec::with_capacity(meta.encoded_len());
            meta.encode(&mut value);
            out.push((namespace_key(ns), Some(value)));
        }
        Mutation::NamespaceDrop { ns } => out.push((namespace_key(ns), None)),
    }
}

fn morton_from(bytes: &[u8]) -> Coord {
    let mut morton = [0u8; 16];
    morton[4..].copy_from_slice(bytes);
    morton_decode(u128::from_be_bytes(morton))
}

fn edge_entry_to_mutation(
    ns: NamespaceName,
    rest: &[u8],
    value: Option<Vec<u8>>,
) -> Result<Mutation, String> {
    if rest.len() < 24 {
        return Err(format!(
            "edge key ends {} bytes into its coordinates",
            rest.len()
        ));
    }
    let label = std::str::from_utf8(&rest[24..]).map_err(|_| "edge label not UTF-8")?;
    let edge = EdgeKey::new(
        morton_from(&rest[..12]),
        morton_from(&rest[12..24]),
        EdgeLabel::new(label)?,
    );
    Ok(match value {
        None => Mutation::Unlink { ns, edge },
        Some(value) => {
            if value.len() != 8 {
                return Err(format!("edge weight of {} bytes, not 8", value.len()));
            }
            let weight = EdgeWeight::new(LittleEndian::read_f64(&value))?;
            Mutation::Link { ns, edge, weight }
        }
    })
}

/// The mutation that re-creates a state entry when loading a checkpoint.
/// `name_of` maps a namespace id to its live name; `Ok(None)` for an entry
/// of a namespace that is no longer live (dropped, or replaced by a new
/// one of the same name).
pub(crate) fn entry_to_mutation(
    key: &[u8],
    value: Option<Vec<u8>>,
    name_of: &dyn Fn(u64) -> Option<NamespaceName>,
) -> Result<Option<Mutation>, String> {
    let (&tag, rest) = key.split_first().ok_or("empty state key")?;
    if tag == TAG_NAMESPACE {
        let (&ns_len, name) = rest.split_first().ok_or("namespace key without a name")?;
        if name.len() != usize::from(ns_len) {
            return Err(format!("namespace key of {} bytes is malformed", key.len()));
        }
        let name = std::str::from_utf8(name).map_err(|_| "namespace not UTF-8")?;
        let ns = NamespaceName::new(name).map_err(|e| e.to_string())?;
        return Ok(Some(match value {
            Some(value) => Mutation::NamespaceCreate {
                ns,
                meta: NamespaceMeta::decode(&value)?,
            },
            None => Mutation::NamespaceDrop { ns },
        }));
    }
    if rest.len() < 8 {
        return Err(format!(
            "state key of {} bytes has no namespace id",
            key.len()
        ));
    }
    let ns_id = u64::from_be_bytes(rest[..8].try_into().map_err(|_| "short namespace id")?);
    let rest = &rest[8..];
    let Some(ns) = name_of(ns_id) else {
        return Ok(None);
    };
    match tag {
        TAG_CELL => {
            if rest.len() != 12 {
                return Err(format!("cell key of {} bytes is malformed", key.len()));
            }
            let coord = morton_from(rest);
            Ok(Some(match value {
                Some(value) => Mutation::Put { ns, coord, value },
                None => Mutation::Del { ns, coord },
            }))
        }
        TAG_EDGE => edge_entry_to_mutation(ns, rest, value).map(Some),
        crate::programs::TAG_PROGRAM | crate::programs::TAG_TELEMETRY => {
            crate::programs::entry_to_mutation(tag, ns, rest, value).map(Some)
        }
        other => Err(format!("unknown state key tag 0x{other:02x}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(id: u64) -> Option<NamespaceName> {
        (id == 9).then(|| NamespaceName::new("default").unwrap())
    }

    #[test]
    fn cell_keys_round_trip_and_sort_by_morton_order_within_a_namespace() {
        let ns = NamespaceName::new("default").unwrap();
        let a = Coord::new(-5, 7, i32::MAX);
        let b = Coord::new(i32::MIN, 0, 3);
        let ka = cell_key(9, a);
        let kb = cell_key(9, b);
        assert_eq!(ka.cmp(&kb), morton_key(a).cmp(&morton_key(b)));
        let m = entry_to_mutation(&ka, Some(b"v".to_vec()), &names).unwrap();
        assert_eq!(
            m,
            Some(Mutation::Put {
                ns: ns.clone(),
                coord: a,
                value: b"v".to_vec()
            })
        );
        assert_eq!(
            entry_to_mutation(&kb, None, &names).unwrap(),
            Some(Mutation::Del { ns, coord: b })
        );
        // Another id: an entry of a namespace that is gone.
        assert_eq!(
            entry_to_mutation(&cell_key(8, a), None, &names).unwrap(),
            None
        );
        assert!(entry_to_mutation(&ka[..5], None, &names).is_err());
        assert!(entry_to_mutation(&[0x77], None, &names).is_err());
        assert_eq!(cell_key_parts(&ka), Some((9, morton_key(a))));
        assert_eq!(entry_ns_id(&ka), Some(9));
    }

    #[test]
    fn namespace_entries_sort_first_and_round_trip() {
        let ns = NamespaceName::new("zz").unwrap();
        let mut meta = NamespaceMeta::implicit_default(5);
        meta.id = 42;
        let create = Mutation::NamespaceCreate {
            ns: ns.clone(),
            meta,
        };
        let mut updates = Vec::new();
        state_updates(&create, 42, &mut updates);
        let (key, value) = updates.pop().unwrap();
        assert!(key < cell_key(0, Coord::new(0, 0, 0)));
        assert_eq!(entry_ns_id(&key), None);
        assert_eq!(
            entry_to_mutation(&key, value, &names).unwrap(),
            Some(create)
        );
        assert_eq!(
            entry_to_mutation(&key, None, &names).unwrap(),
            Some(Mutation::NamespaceDrop { ns })
        );
    }
}

#[cfg(test)]
mod edge_tests {
    use super::*;

    #[test]
    fn edge_entries_round_trip_and_detach_folds_to_tombstones() {
        let ns = NamespaceName::new("default").unwrap();
        let names = |id: u64| (id == 3).then(|| NamespaceName::new("default").unwrap());
        let edge = EdgeKey::new(
            Coord::new(-1, 2, i32::MIN),
            Coord::new(7, 7, 7),
            EdgeLabel::new("road").unwrap(),
        );
        let link = Mutation::Link {
            ns: ns.clone(),
            edge: edge.clone(),
            weight: EdgeWeight::new(0.25).unwrap(),
        };
        let mut updates = Vec::new();
        state_updates(&link, 3, &mut updates);
        let (key, value) = updates.pop().unwrap();
        assert_eq!(entry_to_mutation(&key, value, &names).unwrap(), Some(link));
        assert_eq!(
            entry_to_mutation(&key, None, &names).unwrap(),
            Some(Mutation::Unlink {
                ns: ns.clone(),
                edge: edge.clone()
            })
        );
        // Edge keys sort after every cell key.
        assert!(key > cell_key(u64::MAX, Coord::new(i32::MAX, i32::MAX, i32::MAX)));
        let detach = Mutation::Detach {
            ns: ns.clone(),
            coord: edge.from,
            edges: vec![edge.clone()],
        };
        state_updates(&detach, 3, &mut updates);
        assert_eq!(
            updates,
            vec![(cell_key(3, edge.from), None), (edge_key(3, &edge), None)]
        );
        // Damage is refused, not guessed at.
        assert!(entry_to_mutation(&key[..key.len() - 10], None, &names).is_err());
        assert!(entry_to_mutation(&key, Some(vec![1, 2, 3]), &names).is_err());
        let nan = f64::NAN.to_bits().to_le_bytes().to_vec();
        assert!(entry_to_mutation(&key, Some(nan), &names).is_err());
    }
}
