//! The `cubed` binary: parse flags, run the server, map failure to exit 1.

// A function past a screen is split into its steps (clippy counts lines
// of code; the limit is in clippy.toml). Tests may run longer.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

use clap::{CommandFactory, Parser};

#[cfg(all(feature = "mimalloc", feature = "jemalloc"))]
compile_error!(
    "features `jemalloc` (the default) and `mimalloc` each pick cubed's allocator: \
     build with `--no-default-features --features mimalloc`"
);

#[cfg(feature = "jemalloc")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    cube_server::panic_policy::install();
    let args = cube_server::Args::parse();
    if let Err(why) = args.check() {
        cube_server::Args::command()
            .error(clap::error::ErrorKind::ArgumentConflict, why)
            .exit();
    }
    let rust_log = std::env::var("RUST_LOG").ok();
    if let Err(why) = cube_server::log::init(args.log_level, rust_log.as_deref()) {
        cube_server::Args::command()
            .error(clap::error::ErrorKind::InvalidValue, why)
            .exit();
    }
    // The data dir is 0700: a socket inside it is out of other users'
    // reach whatever its own mode.
    if args.socket_mode & 0o077 != 0 && args.socket_path().starts_with(&args.data) {
        log::warn!(
            "--socket-mode {:o} opens the socket to other users, but it is inside the data dir \
             {}, which only cubed's user may enter; give --socket a path outside it (e.g. \
             /run/cube/cubed.sock)",
            args.socket_mode,
            args.data.display()
        );
    }
    if let Some(dir) = &args.verify {
        std::process::exit(cube_server::verify::run(dir, args.key_file.as_deref()));
    }
    if let Err(e) = cube_server::run(args) {
        eprintln!("cubed: error: {e}");
        std::process::exit(1);
    }
}
