//! libFuzzer target: `cube_fuzz::program_source` (see fuzz/src/lib.rs for
//! what it checks). Run with `cargo +nightly fuzz run program_source`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cube_fuzz::program_source(data));
