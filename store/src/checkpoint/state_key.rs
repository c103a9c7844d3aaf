//! State entries: the key/value form of the store that checkpoint files
//! hold. A WAL record is an *event*; a state entry is *what is true*
//! after it. Folding the log is last-write-wins per state key.
//!
//! Keys sort by kind first (namespaces before cells before edges ...), then
//! namespace, then the kind's own order (Morton order for cells), so a base
//! file loads each namespace's cells already sorted.
//!
//! ```text
//! cell key: 0x10 | ns_len u8 | ns bytes | morton key, 12 bytes big-endian
//! edge key: 0x20 | ns_len u8 | ns bytes | from morton key (12, BE) |
//!           to morton key (12, BE) | label bytes (0-64, to the end)
//!           value: the weight, f64 bits as u64 little-endian
//! ```
//! An edge's key is its identity `(ns, from, to, label)`, so the fold's
//! last write per key is the edge's last link (its weight) or unlink (a
//! tombstone). A detach record becomes a cell tombstone plus one edge
//! tombstone per edge it lists. Edges sort by `from`, so a base file loads
//! each coordinate's outgoing edges together.
//! Programs (tag 0x30) and run telemetry (tag 0x40) are keyed and encoded
//! in `crate::programs`.
//! Tags reserved for later kinds: 0x01 namespace.

use cube_protocol::{Coord, EdgeLabel, EdgeWeight, NamespaceName};

use crate::curve::{morton_decode, morton_key};
use crate::edges::EdgeKey;
use crate::mutation::Mutation;

pub(crate) const TAG_CELL: u8 = 0x10;
pub(crate) const TAG_EDGE: u8 = 0x20;

/// A state change: `None` is a tombstone.
pub(crate) type StateUpdate = (Vec<u8>, Option<Vec<u8>>);

pub(crate) fn cell_key(ns: &NamespaceName, coord: Coord) -> Vec<u8> {
    let name = ns.as_str().as_bytes();
    let mut key = Vec::with_capacity(2 + name.len() + 12);
    key.push(TAG_CELL);
    key.push(name.len() as u8);
    key.extend_from_slice(name);
    key.extend_from_slice(&morton_key(coord).to_be_bytes()[4..]);
    key
}

pub(crate) fn edge_key(ns: &NamespaceName, edge: &EdgeKey) -> Vec<u8> {
    let name = ns.as_str().as_bytes();
    let label = edge.label.as_str().as_bytes();
    let mut key = Vec::with_capacity(2 + name.len() + 24 + label.len());
    key.push(TAG_EDGE);
    key.push(name.len() as u8);
    key.extend_from_slice(name);
    key.extend_from_slice(&morton_key(edge.from).to_be_bytes()[4..]);
    key.extend_from_slice(&morton_key(edge.to).to_be_bytes()[4..]);
    key.extend_from_slice(label);
    key
}

/// A cell key's namespace bytes and Morton key, without allocating; `None`
/// for any other kind of key (or a malformed one, left to the slow path).
pub(crate) fn cell_key_parts(key: &[u8]) -> Option<(&[u8], u128)> {
    let (&tag, rest) = key.split_first()?;
    let (&ns_len, rest) = rest.split_first()?;
    let ns_len = usize::from(ns_len);
    if tag != TAG_CELL || rest.len() != ns_len + 12 {
        return None;
    }
    let mut morton = [0u8; 16];
    morton[4..].copy_from_slice(&rest[ns_len..]);
    Some((&rest[..ns_len], u128::from_be_bytes(morton)))
}

/// What a mutation makes true, as state updates.
pub(crate) fn state_updates(mutation: &Mutation, out: &mut Vec<StateUpdate>) {
    match mutation {
        Mutation::Put { ns, coord, value } => out.push((cell_key(ns, *coord), Some(value.clone()))),
        Mutation::Del { ns, coord } => out.push((cell_key(ns, *coord), None)),
        Mutation::Link { ns, edge, weight } => out.push((
            edge_key(ns, edge),
            Some(weight.get().to_bits().to_le_bytes().to_vec()),
        )),
        Mutation::Unlink { ns, edge } => out.push((edge_key(ns, edge), None)),
        Mutation::Detach { ns, coord, edges } => {
            out.push((cell_key(ns, *coord), None));
            out.extend(edges.iter().map(|edge| (edge_key(ns, edge), None)));
        }
        Mutation::ProgramPut { .. } | Mutation::ProgramDel { .. } | Mutation::Telemetry { .. } => {
            crate::programs::state_updates(mutation, out)
        }
    }
}

/// Splits `ns_len u8 | ns bytes | rest`.
fn split_namespace<'a>(rest: &'a [u8], what: &str) -> Result<(NamespaceName, &'a [u8]), String> {
    let (&ns_len, rest) = rest
        .split_first()
        .ok_or_else(|| format!("{what} key without a namespace"))?;
    let ns_len = usize::from(ns_len);
    if rest.len() < ns_len {
        return Err(format!("{what} key shorter than its namespace"));
    }
    let name = std::str::from_utf8(&rest[..ns_len]).map_err(|_| "namespace not UTF-8")?;
    let ns = NamespaceName::new(name).map_err(|e| e.to_string())?;
    Ok((ns, &rest[ns_len..]))
}

fn morton_from(bytes: &[u8]) -> Coord {
    let mut morton = [0u8; 16];
    morton[4..].copy_from_slice(bytes);
    morton_decode(u128::from_be_bytes(morton))
}

fn edge_entry_to_mutation(rest: &[u8], value: Option<Vec<u8>>) -> Result<Mutation, String> {
    let (ns, rest) = split_namespace(rest, "edge")?;
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
            let bits: [u8; 8] = value
                .as_slice()
                .try_into()
                .map_err(|_| format!("edge weight of {} bytes, not 8", value.len()))?;
            let weight = EdgeWeight::new(f64::from_bits(u64::from_le_bytes(bits)))?;
            Mutation::Link { ns, edge, weight }
        }
    })
}

/// The mutation that re-creates a state entry when loading a checkpoint.
pub(crate) fn entry_to_mutation(key: &[u8], value: Option<Vec<u8>>) -> Result<Mutation, String> {
    let (&tag, rest) = key.split_first().ok_or("empty state key")?;
    match tag {
        TAG_CELL => {
            let (&ns_len, rest) = rest.split_first().ok_or("cell key without a namespace")?;
            let ns_len = usize::from(ns_len);
            if rest.len() != ns_len + 12 {
                return Err(format!("cell key of {} bytes is malformed", key.len()));
            }
            let name = std::str::from_utf8(&rest[..ns_len]).map_err(|_| "namespace not UTF-8")?;
            let ns = NamespaceName::new(name).map_err(|e| e.to_string())?;
            let mut morton = [0u8; 16];
            morton[4..].copy_from_slice(&rest[ns_len..]);
            let coord = morton_decode(u128::from_be_bytes(morton));
            Ok(match value {
                Some(value) => Mutation::Put { ns, coord, value },
                None => Mutation::Del { ns, coord },
            })
        }
        TAG_EDGE => edge_entry_to_mutation(rest, value),
        crate::programs::TAG_PROGRAM | crate::programs::TAG_TELEMETRY => {
            crate::programs::entry_to_mutation(tag, rest, value)
        }
        other => Err(format!("unknown state key tag 0x{other:02x}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cell_keys_round_trip_and_sort_by_morton_order_within_a_namespace() {
        let ns = NamespaceName::new("default").unwrap();
        let a = Coord::new(-5, 7, i32::MAX);
        let b = Coord::new(i32::MIN, 0, 3);
        let ka = cell_key(&ns, a);
        let kb = cell_key(&ns, b);
        assert_eq!(ka.cmp(&kb), morton_key(a).cmp(&morton_key(b)));
        let m = entry_to_mutation(&ka, Some(b"v".to_vec())).unwrap();
        assert_eq!(
            m,
            Mutation::Put {
                ns: ns.clone(),
                coord: a,
                value: b"v".to_vec()
            }
        );
        assert_eq!(
            entry_to_mutation(&kb, None).unwrap(),
            Mutation::Del { ns, coord: b }
        );
        assert!(entry_to_mutation(&ka[..5], None).is_err());
        assert!(entry_to_mutation(&[0x77], None).is_err());
    }
}

#[cfg(test)]
mod edge_tests {
    use super::*;

    #[test]
    fn edge_entries_round_trip_and_detach_folds_to_tombstones() {
        let ns = NamespaceName::new("default").unwrap();
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
        state_updates(&link, &mut updates);
        let (key, value) = updates.pop().unwrap();
        assert_eq!(entry_to_mutation(&key, value).unwrap(), link);
        assert_eq!(
            entry_to_mutation(&key, None).unwrap(),
            Mutation::Unlink {
                ns: ns.clone(),
                edge: edge.clone()
            }
        );
        // Edge keys sort after every cell key.
        assert!(key > cell_key(&ns, Coord::new(i32::MAX, i32::MAX, i32::MAX)));
        let detach = Mutation::Detach {
            ns: ns.clone(),
            coord: edge.from,
            edges: vec![edge.clone()],
        };
        state_updates(&detach, &mut updates);
        assert_eq!(
            updates,
            vec![
                (cell_key(&ns, edge.from), None),
                (edge_key(&ns, &edge), None)
            ]
        );
        // Damage is refused, not guessed at.
        assert!(entry_to_mutation(&key[..key.len() - 10], None).is_err());
        assert!(entry_to_mutation(&key, Some(vec![1, 2, 3])).is_err());
        let nan = f64::NAN.to_bits().to_le_bytes().to_vec();
        assert!(entry_to_mutation(&key, Some(nan)).is_err());
    }
}
