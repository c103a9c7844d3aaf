//! The log's chain: in a data dir with a master key, every commit group
//! ends with a chain record whose payload is a MAC over the group and the
//! MAC of the group before it.
//!
//! Why: record CRCs (even seeded ones) only catch damage; someone who can
//! write the data dir recomputes them. A sealed record cannot be forged,
//! but without the chain it could be removed, replaced by a plaintext
//! record of another namespace at the same LSN, moved, or taken from
//! another copy of the data dir. With the chain, any change to a group,
//! any group removed or reordered in the middle of the log, and any group
//! or segment from another copy (whose history differs from the point the
//! copies diverged) breaks a MAC that only the key can compute.
//!
//! ```text
//! chain record: an ordinary record (record.rs) with
//!   kind        0x3f | group-end bit (0xbf), never sealed
//!   lsn         the next LSN: the chain record takes one
//!   payload     32 bytes: HMAC-SHA256 under the integrity key of
//!               "cube wal group v1" || dir_id (16) || previous (32) ||
//!               every record of the group but this one, each without
//!               its 4 CRC bytes || this record's lsn (u64 LE)
//! ```
//! `previous` is the chain value before the group: the MAC of the group
//! before it, or, for the first group of a chained log, the chain value the
//! first chained segment's header starts from (segment.rs, version 3).
//! CRCs are left out so a group keeps its MAC when the writer reseeds it
//! for a new segment.
//!
//! What it cannot tell: the end of the log. A zeroed or removed last
//! group (or last segments) reads as a log that ends earlier, like a crash
//! before the group was written; it is detected only when something later
//! records the chain value past it (a later segment's header, the
//! authenticated manifest after a fold).

use byteorder::{ByteOrder, LittleEndian};

use super::crc_seed::CrcSeed;
use super::record::{GROUP_END_BIT, RECORD_HEADER_BYTES};
use crate::crypto::{CryptoError, DIR_ID_BYTES, Keyring, MAC_BYTES};

/// The kind of a chain record (bits 0-5; no mutation uses it).
pub const KIND_CHAIN: u8 = 0x3f;
const LABEL: &[u8] = b"cube wal group v1";

/// Where the chain stands: the data dir's id and the last group's MAC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainState {
    pub dir_id: [u8; DIR_ID_BYTES],
    pub prev: [u8; MAC_BYTES],
}

/// The MAC of a group: `records` are the group's records back to back
/// (without its chain record), `chain_lsn` the chain record's LSN.
pub fn group_mac(
    keyring: &Keyring,
    state: &ChainState,
    records: &[u8],
    chain_lsn: u64,
) -> Result<[u8; MAC_BYTES], CryptoError> {
    let mut mac = keyring.mac_context(LABEL)?;
    mac.update(&state.dir_id);
    mac.update(&state.prev);
    let mut at = 0;
    while at + RECORD_HEADER_BYTES <= records.len() {
        let len = LittleEndian::read_u32(&records[at + 4..at + 8]) as usize;
        let end = (at + RECORD_HEADER_BYTES + len).min(records.len());
        mac.update(&records[at + 4..end]);
        at = end;
    }
    mac.update(&chain_lsn.to_le_bytes());
    Ok(mac.finish())
}

/// Appends the chain record that ends a group.
pub fn encode_chain_record(out: &mut Vec<u8>, lsn: u64, mac: &[u8; MAC_BYTES], seed: CrcSeed) {
    let start = out.len();
    out.extend_from_slice(&[0u8; 4]);
    out.extend_from_slice(&(MAC_BYTES as u32).to_le_bytes());
    out.extend_from_slice(&lsn.to_le_bytes());
    out.push(KIND_CHAIN | GROUP_END_BIT);
    out.extend_from_slice(mac);
    let crc = seed.checksum(&out[start + 4..]);
    out[start..start + 4].copy_from_slice(&crc.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::MasterKey;
    use crate::mutation::Mutation;
    use crate::wal::record::{encode_record, parse_record};
    use cube_protocol::{Coord, NamespaceName};

    #[test]
    fn a_group_mac_covers_every_record_its_position_and_the_chain() {
        let key = Keyring::new(Some(MasterKey::from_bytes([5; 32])), 1);
        let seed = CrcSeed::from_u32(9);
        let put = |i: i32| Mutation::Put {
            ns: NamespaceName::new("default").unwrap(),
            coord: Coord::new(i, 0, 0),
            value: b"v".to_vec(),
        };
        let mut group = Vec::new();
        encode_record(&mut group, 1, &put(1), false, seed);
        encode_record(&mut group, 2, &put(2), false, seed);
        let state = ChainState {
            dir_id: [1; DIR_ID_BYTES],
            prev: [2; MAC_BYTES],
        };
        let mac = group_mac(&key, &state, &group, 3).unwrap();
        // Reseeding (CRCs only) keeps the MAC.
        let mut reseeded = group.clone();
        crate::wal::record::reseed_records(&mut reseeded, CrcSeed::from_u32(10));
        assert_eq!(group_mac(&key, &state, &reseeded, 3).unwrap(), mac);
        // Anything else changes it.
        let mut other = Vec::new();
        encode_record(&mut other, 1, &put(1), false, seed);
        encode_record(&mut other, 2, &put(9), false, seed);
        assert_ne!(group_mac(&key, &state, &other, 3).unwrap(), mac);
        assert_ne!(group_mac(&key, &state, &group, 4).unwrap(), mac);
        let moved = ChainState {
            prev: [3; MAC_BYTES],
            ..state
        };
        assert_ne!(group_mac(&key, &moved, &group, 3).unwrap(), mac);
        let copied = ChainState {
            dir_id: [7; DIR_ID_BYTES],
            ..state
        };
        assert_ne!(group_mac(&key, &copied, &group, 3).unwrap(), mac);
        let mut out = Vec::new();
        encode_chain_record(&mut out, 3, &mac, seed);
        let record = parse_record(&out, seed).unwrap();
        assert_eq!(
            (record.lsn, record.kind, record.group_end),
            (3, KIND_CHAIN, true)
        );
        assert_eq!(record.payload, mac);
    }
}
