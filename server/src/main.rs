//! The `cubed` binary: parse flags, run the server, map failure to exit 1.

use clap::{CommandFactory, Parser};

fn main() {
    cube_server::panic_policy::install();
    let args = cube_server::Args::parse();
    if let Err(why) = args.check() {
        cube_server::Args::command()
            .error(clap::error::ErrorKind::ArgumentConflict, why)
            .exit();
    }
    cube_server::log::set_level(args.log_level);
    if let Some(dir) = &args.verify {
        std::process::exit(cube_server::verify::run(dir, args.key_file.as_deref()));
    }
    if let Err(e) = cube_server::run(args) {
        eprintln!("cubed: error: {e}");
        std::process::exit(1);
    }
}
