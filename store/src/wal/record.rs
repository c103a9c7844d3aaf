//! One WAL record.
//!
//! ```text
//! offset size field
//! 0      4    crc32c       u32 LE, CRC32C of bytes 4..17+len, starting
//!                          from the segment's seed (crc_seed.rs)
//! 4      4    payload_len  u32 LE
//! 8      8    lsn          u64 LE, log sequence number
//! 16     1    kind         bits 0-5: 1 = put, 2 = del, 3 = link,
//!                          4 = unlink, 5 = detach, ... (see mutation.rs);
//!                          bit 6: the payload is sealed;
//!                          bit 7: last record of its commit group
//! 17     len  payload
//! ```
//! A payload starts with its namespace (`ns_len u8 | ns`). A **sealed**
//! payload (a record of an encrypted namespace) keeps that prefix in the
//! clear, so recovery knows whose key to use, and seals the rest:
//! ```text
//! ns_len u8 | ns | ns_id u64 LE | start u64 LE | AES-256-GCM(rest) | tag (16)
//! ```
//! `start` is the random id of the daemon start that sealed it: the key is
//! the namespace's WAL key for that start, the nonce low 32 bits of start
//! (BE) | lsn (u64 BE) (`crypto.rs`). Associated data: lsn u64 LE | kind
//! byte (with both flag bits) | ns_len | ns | ns_id | start, and in a
//! chained segment (version 3) the data dir's 16-byte id, so a record
//! moved to another LSN, namespace, data dir or kind of segment fails to
//! open.
//! The CRC covers the length, so a torn or flipped length field is caught
//! like any other damage.
//!
//! The group-end bit makes a commit group atomic on disk: recovery applies
//! a group only once it has read the group's last record, so a group torn
//! by a crash (never acknowledged) is dropped whole, even when some of its
//! later sectors reached the disk and earlier ones did not.

use byteorder::{ByteOrder, LittleEndian};
use cube_protocol::NamespaceName;

use super::crc_seed::CrcSeed;
use crate::crypto::{CryptoError, DIR_ID_BYTES, Keyring, TAG_BYTES};
use crate::mutation::Mutation;

pub const RECORD_HEADER_BYTES: usize = 17;

/// No record is ever larger; a length field above it is damage, not data.
pub const MAX_RECORD_PAYLOAD_BYTES: usize = 64 * 1024 * 1024;

/// Bit 7 of the kind byte: this record ends its commit group.
pub const GROUP_END_BIT: u8 = 0x80;

/// Bit 6 of the kind byte: the payload after the namespace is sealed.
pub const SEALED_BIT: u8 = 0x40;

/// ns_id and start id after the namespace of a sealed payload.
const SEALED_PREFIX_BYTES: usize = 8 + 8;

/// Appends one record for a mutation of an encrypted namespace (id
/// `ns_id`), its payload sealed, checksummed for a segment with `seed`.
/// `scratch` is reused between calls.
#[allow(clippy::too_many_arguments)]
pub fn encode_sealed_record(
    out: &mut Vec<u8>,
    scratch: &mut Vec<u8>,
    lsn: u64,
    mutation: &Mutation,
    group_end: bool,
    keyring: &Keyring,
    ns_id: u64,
    seed: CrcSeed,
    dir_id: Option<&[u8; DIR_ID_BYTES]>,
) -> Result<(), CryptoError> {
    let ns_prefix = 1 + mutation.namespace().as_str().len();
    scratch.clear();
    mutation.encode_payload(scratch);
    debug_assert_eq!(scratch.len(), mutation.payload_len());
    let mut sealed = scratch.split_off(ns_prefix);
    let kind = mutation.kind() | SEALED_BIT | if group_end { GROUP_END_BIT } else { 0 };
    let start_id = keyring.start();
    let aad = record_aad(lsn, kind, &scratch[..ns_prefix], ns_id, start_id, dir_id);
    keyring.seal_wal(ns_id, start_id, lsn, &aad, &mut sealed)?;
    let payload_len = ns_prefix + SEALED_PREFIX_BYTES + sealed.len();
    let start = out.len();
    out.extend_from_slice(&[0u8; 4]);
    out.extend_from_slice(&(payload_len as u32).to_le_bytes());
    out.extend_from_slice(&lsn.to_le_bytes());
    out.push(kind);
    out.extend_from_slice(&scratch[..ns_prefix]);
    out.extend_from_slice(&ns_id.to_le_bytes());
    out.extend_from_slice(&start_id.to_le_bytes());
    out.extend_from_slice(&sealed);
    assert_eq!(out.len() - start, RECORD_HEADER_BYTES + payload_len);
    let crc = seed.checksum(&out[start + 4..]);
    out[start..start + 4].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

fn record_aad(
    lsn: u64,
    kind_byte: u8,
    ns_prefix: &[u8],
    ns_id: u64,
    start_id: u64,
    dir_id: Option<&[u8; DIR_ID_BYTES]>,
) -> Vec<u8> {
    let mut aad = Vec::with_capacity(8 + 1 + ns_prefix.len() + SEALED_PREFIX_BYTES + DIR_ID_BYTES);
    aad.extend_from_slice(&lsn.to_le_bytes());
    aad.push(kind_byte);
    aad.extend_from_slice(ns_prefix);
    aad.extend_from_slice(&ns_id.to_le_bytes());
    aad.extend_from_slice(&start_id.to_le_bytes());
    if let Some(id) = dir_id {
        aad.extend_from_slice(id);
    }
    aad
}

/// Why a record whose checksum matched still cannot be read.
#[derive(Debug, PartialEq, Eq)]
pub enum RecordOpenError {
    /// Not a record cube wrote, or (sealed) tampered with: corruption.
    Damage(String),
    /// A sealed record without the key to open it, or with a key that was
    /// never confirmed for its namespace: refuse to start, never repair.
    Key(String),
}

/// Decodes a record's mutation, opening a sealed payload with `keyring`;
/// `dir_id` is that of a chained segment's header.
pub fn decode_record(
    record: &RawRecord<'_>,
    keyring: Option<&Keyring>,
    dir_id: Option<&[u8; DIR_ID_BYTES]>,
) -> Result<Mutation, RecordOpenError> {
    if record.kind & SEALED_BIT == 0 {
        return Mutation::decode(record.kind, record.payload).map_err(RecordOpenError::Damage);
    }
    let damage = |why: &str| RecordOpenError::Damage(why.to_string());
    let payload = record.payload;
    let ns_len = usize::from(
        *payload
            .first()
            .ok_or_else(|| damage("empty sealed payload"))?,
    );
    let ns_prefix = 1 + ns_len;
    if payload.len() < ns_prefix + SEALED_PREFIX_BYTES + TAG_BYTES {
        return Err(damage("sealed payload too short for its nonce and tag"));
    }
    let ns_name = std::str::from_utf8(&payload[1..ns_prefix])
        .ok()
        .and_then(|name| NamespaceName::new(name).ok())
        .ok_or_else(|| damage("sealed payload with a malformed namespace"))?;
    let ns_id = LittleEndian::read_u64(&payload[ns_prefix..ns_prefix + 8]);
    let start_id = LittleEndian::read_u64(&payload[ns_prefix + 8..ns_prefix + 16]);
    let Some(keyring) = keyring.filter(|k| k.has_key()) else {
        return Err(RecordOpenError::Key(format!(
            "namespace {:?} is encrypted and no master key was given; start cubed with --key-file PATH",
            ns_name.as_str()
        )));
    };
    let kind_byte = record.kind | SEALED_BIT | if record.group_end { GROUP_END_BIT } else { 0 };
    let aad = record_aad(
        record.lsn,
        kind_byte,
        &payload[..ns_prefix],
        ns_id,
        start_id,
        dir_id,
    );
    let mut plain = Vec::with_capacity(payload.len());
    plain.extend_from_slice(&payload[..ns_prefix]);
    let sealed_at = plain.len();
    plain.extend_from_slice(&payload[ns_prefix + SEALED_PREFIX_BYTES..]);
    match keyring.open_wal(ns_id, start_id, record.lsn, &aad, &mut plain[sealed_at..]) {
        Ok(len) => plain.truncate(sealed_at + len),
        Err(_) if !keyring.is_verified(ns_id) => {
            return Err(RecordOpenError::Key(format!(
                "a record of encrypted namespace {:?} at LSN {} does not open with this master key; start cubed with the key the namespace was created with",
                ns_name.as_str(),
                record.lsn
            )));
        }
        Err(_) => {
            return Err(damage(
                "sealed record failed authentication: it was tampered with or moved",
            ));
        }
    }
    Mutation::decode(record.kind & !SEALED_BIT, &plain).map_err(RecordOpenError::Damage)
}

/// Appends one record for `mutation` at `lsn` to `out`, checksummed for a
/// segment with `seed`.
pub fn encode_record(
    out: &mut Vec<u8>,
    lsn: u64,
    mutation: &Mutation,
    group_end: bool,
    seed: CrcSeed,
) {
    let start = out.len();
    let payload_len = mutation.payload_len();
    // A larger record would be logged and then refused by recovery as damage:
    // an acknowledged write that cannot be read back. Checked in every build.
    assert!(
        payload_len <= MAX_RECORD_PAYLOAD_BYTES,
        "record payload of {payload_len} bytes is over {MAX_RECORD_PAYLOAD_BYTES}"
    );
    out.extend_from_slice(&[0u8; 4]);
    out.extend_from_slice(&(payload_len as u32).to_le_bytes());
    out.extend_from_slice(&lsn.to_le_bytes());
    debug_assert!(mutation.kind() & GROUP_END_BIT == 0);
    out.push(mutation.kind() | if group_end { GROUP_END_BIT } else { 0 });
    mutation.encode_payload(out);
    assert_eq!(
        out.len() - start,
        RECORD_HEADER_BYTES + payload_len,
        "payload_len must match encode_payload"
    );
    let crc = seed.checksum(&out[start + 4..]);
    out[start..start + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Recomputes the checksum of every record in `records` (whole records
/// back to back, as this build encoded them) for a segment with `seed`:
/// the writer encodes a group before it knows whether the group fits its
/// segment, and a group that rolls to a new segment takes that one's seed.
pub fn reseed_records(records: &mut [u8], seed: CrcSeed) {
    let mut at = 0;
    while at < records.len() {
        assert!(at + RECORD_HEADER_BYTES <= records.len(), "whole records");
        let payload_len = LittleEndian::read_u32(&records[at + 4..at + 8]) as usize;
        let end = at + RECORD_HEADER_BYTES + payload_len;
        assert!(end <= records.len(), "whole records");
        let crc = seed.checksum(&records[at + 4..end]);
        records[at..at + 4].copy_from_slice(&crc.to_le_bytes());
        at = end;
    }
}

/// A record read back from disk, borrowing its payload.
#[derive(Debug)]
pub struct RawRecord<'a> {
    pub lsn: u64,
    /// The mutation kind, without the group-end bit.
    pub kind: u8,
    pub group_end: bool,
    pub payload: &'a [u8],
    /// Header plus payload.
    pub total_bytes: usize,
}

/// Why bytes at an offset are not a valid record.
#[derive(Debug, PartialEq, Eq)]
pub enum RecordDamage {
    /// Fewer bytes remain than the header or the declared length needs.
    Short,
    /// The length field is beyond [`MAX_RECORD_PAYLOAD_BYTES`].
    BadLength(u32),
    BadChecksum {
        stored: u32,
        computed: u32,
    },
}

impl std::fmt::Display for RecordDamage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecordDamage::Short => write!(f, "record runs past the end of the file"),
            RecordDamage::BadLength(len) => write!(f, "record length {len} is over the limit"),
            RecordDamage::BadChecksum { stored, computed } => write!(
                f,
                "record checksum mismatch (stored {stored:08x}, computed {computed:08x})"
            ),
        }
    }
}

/// Parses the record at the start of `bytes`, in a segment whose records
/// are checksummed with `seed`. Never panics.
pub fn parse_record(bytes: &[u8], seed: CrcSeed) -> Result<RawRecord<'_>, RecordDamage> {
    if bytes.len() < RECORD_HEADER_BYTES {
        return Err(RecordDamage::Short);
    }
    let stored = LittleEndian::read_u32(&bytes[0..4]);
    let payload_len = LittleEndian::read_u32(&bytes[4..8]);
    if payload_len as usize > MAX_RECORD_PAYLOAD_BYTES {
        return Err(RecordDamage::BadLength(payload_len));
    }
    let total_bytes = RECORD_HEADER_BYTES + payload_len as usize;
    if bytes.len() < total_bytes {
        return Err(RecordDamage::Short);
    }
    let computed = seed.checksum(&bytes[4..total_bytes]);
    if computed != stored {
        return Err(RecordDamage::BadChecksum { stored, computed });
    }
    Ok(RawRecord {
        lsn: LittleEndian::read_u64(&bytes[8..16]),
        kind: bytes[16] & !GROUP_END_BIT,
        group_end: bytes[16] & GROUP_END_BIT != 0,
        payload: &bytes[RECORD_HEADER_BYTES..total_bytes],
        total_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cube_protocol::{Coord, NamespaceName};

    #[test]
    fn every_single_bit_flip_is_caught() {
        let mut buf = Vec::new();
        let m = Mutation::Put {
            ns: NamespaceName::new("default").unwrap(),
            coord: Coord::new(1, 2, 3),
            value: b"value".to_vec(),
        };
        let seed = CrcSeed::from_u32(0x1234_5678);
        encode_record(&mut buf, 77, &m, true, seed);
        let rec = parse_record(&buf, seed).unwrap();
        assert_eq!(
            (rec.lsn, rec.total_bytes, rec.group_end),
            (77, buf.len(), true)
        );
        for bit in 0..buf.len() * 8 {
            let mut bad = buf.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(
                parse_record(&bad, seed).is_err(),
                "flip of bit {bit} went unnoticed"
            );
        }
    }

    #[test]
    fn a_record_checksummed_for_another_seed_is_damage() {
        let m = Mutation::Del {
            ns: NamespaceName::new("default").unwrap(),
            coord: Coord::new(1, 2, 3),
        };
        let (ours, theirs) = (CrcSeed::from_u32(5), CrcSeed::UNSEEDED);
        let mut forged = Vec::new();
        encode_record(&mut forged, 1, &m, true, theirs);
        assert!(matches!(
            parse_record(&forged, ours),
            Err(RecordDamage::BadChecksum { .. })
        ));
        // Reseeding a group makes every record valid under the new seed.
        encode_record(&mut forged, 2, &m, false, theirs);
        encode_record(&mut forged, 3, &m, true, theirs);
        reseed_records(&mut forged, ours);
        let mut at = 0;
        for lsn in 1..=3 {
            let record = parse_record(&forged[at..], ours).unwrap();
            assert_eq!(record.lsn, lsn);
            at += record.total_bytes;
        }
        assert_eq!(at, forged.len());
    }
}
