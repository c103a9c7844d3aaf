//! libFuzzer target: `cube_fuzz::protocol_frames` (see fuzz/src/lib.rs for what it
//! checks). Run with `cargo +nightly fuzz run protocol_frames`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cube_fuzz::protocol_frames(data));
