//! `cube-stress`: the command line over the `cube_stress` library.

// A function past a screen is split into its steps (clippy counts lines
// of code; the limit is in clippy.toml). Tests may run longer.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

use std::process::ExitCode;

fn main() -> ExitCode {
    cube_stress::cli::main_with_args(std::env::args_os())
}
