//! libFuzzer target: `cube_fuzz::run_file` (see fuzz/src/lib.rs for what it
//! checks). Run with `cargo +nightly fuzz run run_file`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cube_fuzz::run_file(data));
