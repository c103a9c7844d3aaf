//! libFuzzer target: `cube_fuzz::wal_segment` (see fuzz/src/lib.rs for what it
//! checks). Run with `cargo +nightly fuzz run wal_segment`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cube_fuzz::wal_segment(data));
