//! A hint to start loading a cache line the code will read soon.
//!
//! Batched point reads ([`crate::MemStore::read_cells`]) look up many keys
//! whose loads are cache misses; asking for the next keys' lines before
//! reading this key's lets the misses overlap instead of queueing one
//! memory latency after another.

/// Starts loading the cache line holding `address` into every cache
/// level. Never faults, whatever the address; a no-op where the
/// architecture has no such hint here.
#[inline(always)]
pub(crate) fn prefetch<T>(address: *const T) {
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    // SAFETY: PREFETCHT0 is only a hint: it reads nothing into the program,
    // and the CPU ignores addresses it cannot load (it never faults).
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(address.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = address;
}
