//! Large in-memory arrays on transparent huge pages.
//!
//! A point read over a 1 M-cell namespace touches three or four places
//! scattered over tens of MiB (the key index, the key, the value, the
//! value's bytes). With 4 KiB pages nearly each of them is also a TLB
//! miss, and under virtualisation a TLB miss is a two-dimensional page
//! walk, itself several dependent memory loads. Backing the big arrays
//! with 2 MiB pages removes most of those walks. Linux's default THP mode
//! (`madvise`) grants huge pages only where asked, and only to memory not
//! yet touched, so the arrays are advised right after they are allocated
//! and before they are filled. Elsewhere, or if the kernel says no, this
//! does nothing and everything works the same, only slower.

/// A 2 MiB huge page.
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// An empty `Vec` with room for `capacity` elements, whose spare memory is
/// advised for huge pages when it spans at least two of them.
pub(crate) fn huge_vec<T>(capacity: usize) -> Vec<T> {
    let vec = Vec::with_capacity(capacity);
    let bytes = capacity.saturating_mul(std::mem::size_of::<T>());
    if bytes >= 2 * HUGE_PAGE_BYTES {
        advise_huge(vec.as_ptr() as usize, bytes);
    }
    vec
}

// `madvise` has no safe wrapper. It cannot change memory contents or
// validity, only how pages are backed.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn advise_huge(start: usize, bytes: usize) {
    // Only whole huge pages inside the allocation.
    let first = start.next_multiple_of(HUGE_PAGE_BYTES);
    let end = (start + bytes) / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES;
    if end > first {
        // SAFETY: the range lies inside an allocation this process owns,
        // and MADV_HUGEPAGE changes how it is backed, never its contents
        // or validity. A failure (e.g. THP disabled) is only advice refused.
        unsafe {
            libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge(_start: usize, _bytes: usize) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_vec_is_an_ordinary_vec() {
        let mut big: Vec<u64> = huge_vec(1 << 20);
        assert!(big.capacity() >= 1 << 20);
        big.extend(0..1 << 20);
        assert_eq!(big.iter().sum::<u64>(), (1u64 << 20) * ((1 << 20) - 1) / 2);
        let small: Vec<u8> = huge_vec(10);
        assert!(small.is_empty());
    }
}
