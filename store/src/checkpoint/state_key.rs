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
//! ```
//! Tags reserved for later kinds: 0x01 namespace, 0x20 edge, 0x30 program,
//! 0x40 telemetry.

use cube_protocol::{Coord, NamespaceName};

use crate::curve::{morton_decode, morton_key};
use crate::mutation::Mutation;

pub(crate) const TAG_CELL: u8 = 0x10;

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

/// What a mutation makes true, as state updates.
pub(crate) fn state_updates(mutation: &Mutation, out: &mut Vec<StateUpdate>) {
    match mutation {
        Mutation::Put { ns, coord, value } => out.push((cell_key(ns, *coord), Some(value.clone()))),
        Mutation::Del { ns, coord } => out.push((cell_key(ns, *coord), None)),
    }
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
