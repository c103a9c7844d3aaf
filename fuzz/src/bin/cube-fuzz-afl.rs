//! The coverage-guided fuzzer on the stable toolchain: AFL++ through
//! afl.rs (`cargo afl`), what `make fuzz` runs when `cargo afl` is
//! installed (`make fuzz-setup` installs it).
//!
//! One binary for all targets, chosen by its first argument, so one
//! instrumented build serves them all:
//!
//! ```text
//! cargo afl build --release --manifest-path fuzz/Cargo.toml \
//!     --no-default-features --features afl --bin cube-fuzz-afl
//! cargo afl fuzz -i fuzz/corpus/wal_segment -o /tmp/afl-out -x fuzz/fuzz.dict \
//!     -- fuzz/target/release/cube-fuzz-afl wal_segment
//! ```
//!
//! Without AFL (`cube-fuzz-afl NAME < FILE`) it runs one input from
//! standard input, which is how a crash file is replayed.

use std::process::ExitCode;

use cube_fuzz::TARGETS;

fn main() -> ExitCode {
    let name = std::env::args().nth(1).unwrap_or_default();
    let Some(&(_, target)) = TARGETS.iter().find(|(n, _)| *n == name) else {
        let names: Vec<&str> = TARGETS.iter().map(|(n, _)| *n).collect();
        eprintln!(
            "cube-fuzz-afl: unknown target {name:?}; give one of: {}",
            names.join(", ")
        );
        return ExitCode::from(2);
    };
    // A panic aborts the process, which AFL records as a crash.
    afl::fuzz!(|data: &[u8]| { target(data) });
    ExitCode::SUCCESS
}
