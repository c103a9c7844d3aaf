//! One WAL record.
//!
//! ```text
//! offset size field
//! 0      4    crc32c       u32 LE, CRC32C of bytes 4..17+len
//! 4      4    payload_len  u32 LE
//! 8      8    lsn          u64 LE, log sequence number
//! 16     1    kind         bits 0-6: 1 = put, 2 = del, 3 = link,
//!                          4 = unlink, 5 = detach (see mutation.rs);
//!                          bit 7: last record of its commit group
//! 17     len  payload
//! ```
//! The CRC covers the length, so a torn or flipped length field is caught
//! like any other damage.
//!
//! The group-end bit makes a commit group atomic on disk: recovery applies
//! a group only once it has read the group's last record, so a group torn
//! by a crash (never acknowledged) is dropped whole, even when some of its
//! later sectors reached the disk and earlier ones did not.

use byteorder::{ByteOrder, LittleEndian};

use crate::mutation::Mutation;

pub const RECORD_HEADER_BYTES: usize = 17;

/// No record is ever larger; a length field above it is damage, not data.
pub const MAX_RECORD_PAYLOAD_BYTES: usize = 64 * 1024 * 1024;

/// Bit 7 of the kind byte: this record ends its commit group.
pub const GROUP_END_BIT: u8 = 0x80;

/// Appends one record for `mutation` at `lsn` to `out`.
pub fn encode_record(out: &mut Vec<u8>, lsn: u64, mutation: &Mutation, group_end: bool) {
    let start = out.len();
    let payload_len = mutation.payload_len();
    debug_assert!(payload_len <= MAX_RECORD_PAYLOAD_BYTES);
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
    let crc = crc32c::crc32c(&out[start + 4..]);
    out[start..start + 4].copy_from_slice(&crc.to_le_bytes());
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

/// Parses the record at the start of `bytes`. Never panics.
pub fn parse_record(bytes: &[u8]) -> Result<RawRecord<'_>, RecordDamage> {
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
    let computed = crc32c::crc32c(&bytes[4..total_bytes]);
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
        encode_record(&mut buf, 77, &m, true);
        let rec = parse_record(&buf).unwrap();
        assert_eq!(
            (rec.lsn, rec.total_bytes, rec.group_end),
            (77, buf.len(), true)
        );
        for bit in 0..buf.len() * 8 {
            let mut bad = buf.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(
                parse_record(&bad).is_err(),
                "flip of bit {bit} went unnoticed"
            );
        }
    }
}
