//! A cell's value as the in-memory store keeps it: small values inline,
//! larger ones behind a shared pointer.
//!
//! A random point read of a large store is a chain of cache misses (index
//! slot, key, value, value bytes). With every value behind a pointer, the
//! last miss was a quarter to half of a `get` (`memstore-1M/get-memo`
//! against `get-memo-len` in `store/benches/memstore.rs`). Cells of voxel
//! worlds and grids mostly hold a few bytes, so values up to
//! [`INLINE_VALUE_BYTES`] live in the 24 bytes the value takes in the
//! store's arrays anyway, and the read ends one miss earlier. They also
//! cost no allocation when written, no reference count when a run is
//! merged, and no allocator overhead in memory.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// The longest value kept inline: what fits beside a length byte in the
/// space a shared pointer and the enum's tag take.
pub const INLINE_VALUE_BYTES: usize = 22;

/// A cell's value: bytes, cheap to clone (a copy of at most 24 bytes, or a
/// reference count).
#[derive(Clone)]
pub struct CellValue(Repr);

#[derive(Clone)]
enum Repr {
    Inline {
        len: u8,
        bytes: [u8; INLINE_VALUE_BYTES],
    },
    Shared(Arc<[u8]>),
}

// The arrays of values are sized by it: keep it three words.
const _: () = assert!(std::mem::size_of::<CellValue>() == 24);

impl CellValue {
    pub fn new(bytes: &[u8]) -> CellValue {
        match Self::inline(bytes) {
            Some(value) => value,
            None => CellValue(Repr::Shared(Arc::from(bytes))),
        }
    }

    fn inline(bytes: &[u8]) -> Option<CellValue> {
        let len = u8::try_from(bytes.len())
            .ok()
            .filter(|&len| usize::from(len) <= INLINE_VALUE_BYTES)?;
        let mut inline = [0u8; INLINE_VALUE_BYTES];
        inline[..bytes.len()].copy_from_slice(bytes);
        Some(CellValue(Repr::Inline { len, bytes: inline }))
    }

    pub fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            Repr::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Repr::Shared(bytes) => bytes,
        }
    }

    /// How many holders share the bytes (`None`: inline), for tests that
    /// a store let go of a value.
    #[cfg(test)]
    pub(crate) fn shared_count(&self) -> Option<usize> {
        match &self.0 {
            Repr::Inline { .. } => None,
            Repr::Shared(bytes) => Some(Arc::strong_count(bytes)),
        }
    }

    /// Whether the bytes are kept inline (for tests of the layout).
    pub fn is_inline(&self) -> bool {
        matches!(self.0, Repr::Inline { .. })
    }
}

impl Deref for CellValue {
    type Target = [u8];

    #[inline]
    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl AsRef<[u8]> for CellValue {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl From<&[u8]> for CellValue {
    fn from(bytes: &[u8]) -> CellValue {
        CellValue::new(bytes)
    }
}

impl From<Vec<u8>> for CellValue {
    /// Takes the vector's bytes inline, or as the shared allocation (one
    /// copy, as `Arc::from` makes).
    fn from(bytes: Vec<u8>) -> CellValue {
        match Self::inline(&bytes) {
            Some(value) => value,
            None => CellValue(Repr::Shared(Arc::from(bytes))),
        }
    }
}

impl PartialEq for CellValue {
    fn eq(&self, other: &CellValue) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for CellValue {}

impl PartialEq<[u8]> for CellValue {
    fn eq(&self, other: &[u8]) -> bool {
        self.as_bytes() == other
    }
}

impl fmt::Debug for CellValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_bytes(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_length_round_trips_inline_up_to_the_limit_and_shared_beyond() {
        for len in 0..=64usize {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 37 + 1) as u8).collect();
            for value in [CellValue::new(&bytes), CellValue::from(bytes.clone())] {
                assert_eq!(value.as_bytes(), &bytes[..]);
                assert_eq!(value.len(), len);
                assert_eq!(value.is_inline(), len <= INLINE_VALUE_BYTES, "len {len}");
                assert_eq!(value.clone(), value);
            }
        }
    }

    #[test]
    fn equality_is_by_bytes_whatever_the_layout() {
        let long = vec![7u8; 100];
        assert_eq!(CellValue::new(&long), CellValue::from(long.clone()));
        assert_ne!(CellValue::new(b"a"), CellValue::new(b"b"));
        assert_ne!(CellValue::new(b""), CellValue::new(b"\0"));
    }
}
