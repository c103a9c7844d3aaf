//! libFuzzer target: `cube_fuzz::program_run` (see fuzz/src/lib.rs for
//! what it checks). Run with `cargo +nightly fuzz run program_run`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cube_fuzz::program_run(data));
