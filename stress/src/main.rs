//! `cube-stress`: the command line over the `cube_stress` library.

use std::process::ExitCode;

fn main() -> ExitCode {
    cube_stress::cli::main_with_args(std::env::args_os())
}
