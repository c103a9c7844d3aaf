//! The little-endian integers of the store's formats (WAL segments and
//! records, checkpoint files, namespace metadata), read from the slice a
//! parser holds. Writing them is std's `to_le_bytes`; std's
//! `from_le_bytes` takes an array, so these take a slice, read its first
//! bytes, and panic if it is shorter, as indexing it would (every caller
//! has checked the length first).

#[inline]
fn first<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&bytes[..N]);
    out
}

#[inline]
pub(crate) fn read_u16(bytes: &[u8]) -> u16 {
    u16::from_le_bytes(first(bytes))
}

#[inline]
pub(crate) fn read_u32(bytes: &[u8]) -> u32 {
    u32::from_le_bytes(first(bytes))
}

#[inline]
pub(crate) fn read_i32(bytes: &[u8]) -> i32 {
    i32::from_le_bytes(first(bytes))
}

#[inline]
pub(crate) fn read_u64(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(first(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_first_bytes_little_endian() {
        let bytes = [1, 2, 3, 4, 5, 6, 7, 8, 9];
        assert_eq!(read_u16(&bytes), 0x0201);
        assert_eq!(read_u32(&bytes), 0x0403_0201);
        assert_eq!(read_i32(&[0xff; 4]), -1);
        assert_eq!(read_u64(&bytes), 0x0807_0605_0403_0201);
    }
}
