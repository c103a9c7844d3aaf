//! The x86-64 vector features the curves' batch paths need, checked at run
//! time. `is_x86_feature_detected!` caches what it learns in a static, so a
//! check is a few loads; no cache of our own is needed.

/// AVX-512 foundation and byte/word instructions: Hilbert's gather walks.
#[inline]
pub(crate) fn has_avx512() -> bool {
    std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bw")
}

/// Also VBMI byte permutes and GFNI bit-matrix products (Ice Lake, Zen 4
/// and later): the byte-lane paths of both curves.
#[inline]
pub(crate) fn has_avx512_gfni() -> bool {
    has_avx512()
        && std::is_x86_feature_detected!("avx512vbmi")
        && std::is_x86_feature_detected!("gfni")
}
