//! Checked little-endian field readers and writers for message bodies.
//!
//! The reader never panics and never allocates more than the bytes that are
//! actually present: every length is compared with what remains before a
//! buffer is created.

use crate::error::DecodeError;
use crate::model::{Coord, NamespaceName};

/// Longest client name, server version or stats name accepted.
pub(crate) const MAX_NAME_BYTES: usize = 256;
/// Longest error message or stats text accepted.
pub(crate) const MAX_MESSAGE_BYTES: usize = 4096;

pub(crate) struct BodyReader<'a> {
    bytes: &'a [u8],
    offset: usize,
}

impl<'a> BodyReader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> BodyReader<'a> {
        BodyReader { bytes, offset: 0 }
    }

    fn take(&mut self, len: usize) -> Result<&'a [u8], DecodeError> {
        let remaining = self.bytes.len() - self.offset;
        if len > remaining {
            return Err(DecodeError::Truncated {
                offset: self.offset,
                needed: len - remaining,
            });
        }
        let slice = &self.bytes[self.offset..self.offset + len];
        self.offset += len;
        Ok(slice)
    }

    /// The next `N` bytes, for the fixed-width integers.
    fn take_array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.take_array()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take_array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.take_array()?))
    }

    pub(crate) fn i32(&mut self) -> Result<i32, DecodeError> {
        Ok(i32::from_le_bytes(self.take_array()?))
    }

    pub(crate) fn bool(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(DecodeError::BadField {
                what: "boolean",
                got: u64::from(other),
            }),
        }
    }

    /// A flags byte whose bits outside `allowed` must be zero.
    pub(crate) fn flags(&mut self, allowed: u8, what: &'static str) -> Result<u8, DecodeError> {
        let flags = self.u8()?;
        if flags & !allowed != 0 {
            return Err(DecodeError::BadField {
                what,
                got: u64::from(flags),
            });
        }
        Ok(flags)
    }

    pub(crate) fn coord(&mut self) -> Result<Coord, DecodeError> {
        Ok(Coord::new(self.i32()?, self.i32()?, self.i32()?))
    }

    /// A `bool`, then a coordinate only if it is 1.
    pub(crate) fn optional_coord(&mut self) -> Result<Option<Coord>, DecodeError> {
        Ok(if self.bool()? {
            Some(self.coord()?)
        } else {
            None
        })
    }

    /// A `u16` length followed by UTF-8 text of at most `limit` bytes.
    pub(crate) fn short_string(
        &mut self,
        what: &'static str,
        limit: usize,
    ) -> Result<String, DecodeError> {
        let len = usize::from(self.u16()?);
        if len > limit {
            return Err(DecodeError::TooLarge {
                what,
                got: len as u64,
                limit: limit as u64,
            });
        }
        let bytes = self.take(len)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| DecodeError::BadUtf8(what))
    }

    /// A `u8` length followed by the name bytes.
    pub(crate) fn namespace(&mut self) -> Result<NamespaceName, DecodeError> {
        let len = usize::from(self.u8()?);
        let bytes = self.take(len)?;
        // Bytes that are not UTF-8 are certainly not `[a-z0-9_-]`: the same
        // bad_namespace answer as any other rule break.
        let text = std::str::from_utf8(bytes).map_err(|_| {
            DecodeError::BadNamespace("namespace name is not valid UTF-8".to_owned())
        })?;
        NamespaceName::new(text)
    }

    /// A `u32` length followed by that many bytes, at most `limit`.
    pub(crate) fn blob(
        &mut self,
        what: &'static str,
        limit: usize,
    ) -> Result<Vec<u8>, DecodeError> {
        Ok(self.blob_ref(what, limit)?.to_vec())
    }

    /// Like [`Self::blob`], the bytes borrowed rather than copied.
    pub(crate) fn blob_ref(
        &mut self,
        what: &'static str,
        limit: usize,
    ) -> Result<&'a [u8], DecodeError> {
        let len = self.u32()? as usize;
        if len > limit {
            return Err(DecodeError::TooLarge {
                what,
                got: len as u64,
                limit: limit as u64,
            });
        }
        self.take(len)
    }

    /// How many bytes have been read.
    pub(crate) fn offset(&self) -> usize {
        self.offset
    }

    /// The bytes read since offset `start` (an earlier [`Self::offset`]).
    pub(crate) fn since(&self, start: usize) -> &'a [u8] {
        self.bytes.get(start..self.offset).unwrap_or_default()
    }

    /// [`Self::finish`] without giving up the reader.
    pub(crate) fn check_finished(&self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            trailing => Err(DecodeError::TrailingBytes { trailing }),
        }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len() - self.offset
    }

    pub(crate) fn finish(self) -> Result<(), DecodeError> {
        self.check_finished()
    }
}

pub(crate) fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_coord(out: &mut Vec<u8>, c: Coord) {
    out.extend_from_slice(&c.x.to_le_bytes());
    out.extend_from_slice(&c.y.to_le_bytes());
    out.extend_from_slice(&c.z.to_le_bytes());
}

pub(crate) fn put_optional_coord(out: &mut Vec<u8>, c: Option<Coord>) {
    match c {
        None => out.push(0),
        Some(c) => {
            out.push(1);
            put_coord(out, c);
        }
    }
}

/// A `u16` length and the text, cut at a character boundary to at most
/// `limit` bytes (and never more than `u16::MAX`): these fields are names and
/// messages, never data, and the decoder refuses any longer than its limit,
/// so cutting here keeps every encoded frame decodable.
pub(crate) fn put_short_string(out: &mut Vec<u8>, s: &str, limit: usize) {
    let mut end = s.len().min(limit).min(usize::from(u16::MAX));
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    put_u16(out, end as u16);
    out.extend_from_slice(&s.as_bytes()[..end]);
}

pub(crate) fn put_namespace(out: &mut Vec<u8>, ns: &NamespaceName) {
    // NamespaceName guarantees at most 64 bytes.
    out.push(ns.as_str().len() as u8);
    out.extend_from_slice(ns.as_str().as_bytes());
}

/// Callers check the value limit first; a blob is at most `u32::MAX` bytes
/// because frames are.
pub(crate) fn put_blob(out: &mut Vec<u8>, bytes: &[u8]) {
    put_u32(out, bytes.len() as u32);
    out.extend_from_slice(bytes);
}
