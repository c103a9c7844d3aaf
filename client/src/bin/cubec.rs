//! `cubec`: the command line for a running `cubed`. Thin over
//! `cube_client::Client`; its own job is arguments, output formats and exit
//! codes, which scripts depend on and therefore never change meaning.

// A function past a screen is split into its steps (clippy counts lines
// of code; the limit is in clippy.toml). Tests may run longer.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

use std::ffi::OsString;
use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use cube_client::{Client, DEFAULT_SOCKET_PATH};

#[path = "cubec/admin.rs"]
mod admin;
#[path = "cubec/args.rs"]
mod args;
#[path = "cubec/cells.rs"]
mod cells;
#[path = "cubec/edges.rs"]
mod edges;
#[path = "cubec/failure.rs"]
mod failure;
#[path = "cubec/mget.rs"]
mod mget;
#[path = "cubec/namespaces.rs"]
mod namespaces;
#[path = "cubec/output.rs"]
mod output;
#[path = "cubec/programs.rs"]
mod programs;
#[path = "cubec/transfer.rs"]
mod transfer;
#[path = "cubec/watch.rs"]
mod watch;

use args::{CellArgs, parse_namespace_arg};
use failure::{Failure, failure_json};
use output::{cell_json, coord_json, emit, emit_line, escape_value, output_failure};

const EXIT_NOT_FOUND: u8 = 1;
const EXIT_USAGE: u8 = 2;
const EXIT_SERVER: u8 = 3;
const EXIT_CONNECT: u8 = 4;

const TOP_AFTER_HELP: &str = "\
Exit codes (stable; scripts may rely on them):
  0  success
  1  not found: get or del of an empty cell, mget with an empty cell among
     those asked, unlink of a missing edge, path with no path
  2  usage: bad arguments, coordinate or namespace name, an unreadable --file,
     or a value over the server's max_value_bytes (checked before sending);
     for import, a bad line in the input
  3  cubed answered with an error, or the connection broke mid-request;
     for run, the program failed; for step, at least one program failed
  4  cannot connect to cubed (not running, or wrong --socket / CUBE_SOCKET)

Examples:
  cubec ping
  cubec put default 1,-2,3 'hello'
  cubec get default 1,-2,3 > value.bin
  cubec mget default 1,-2,3 0,0,0
  cubec scan default -10,-10,0 10,10,0
  cubec link default 0,0,0 1,0,0 --label road --weight 2
  cubec walk default 0,0,0 --depth 3
  cubec prog default 0,0,0 'return cube.rincr(0, 0, 0, 1)'
  cubec run default 0,0,0
  cubec step default 0,0,0 63,63,0
  cubec stats default 0,0,0
  cubec ns create tenant-a --max-cells 1000000
  cubec ns list
  cubec export default > default.jsonl
  cubec import default default.jsonl
  cubec --json stats";

#[derive(Debug, Parser)]
#[command(
    name = "cubec",
    version,
    about = "Store, read and delete cells in a running cubed",
    after_help = TOP_AFTER_HELP
)]
struct Cli {
    /// Unix socket of the cubed to talk to
    #[arg(
        long,
        global = true,
        env = "CUBE_SOCKET",
        default_value = DEFAULT_SOCKET_PATH,
        value_name = "PATH"
    )]
    socket: PathBuf,

    /// Print machine-readable JSON on stdout instead of text
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check that cubed is up and answering
    #[command(after_help = "Example:\n  cubec ping\n  cubec --socket /tmp/cubed.sock ping")]
    Ping,

    /// Store a value at a cell (binary-safe)
    #[command(
        override_usage = "cubec put [OPTIONS] <NS> <X,Y,Z> <VALUE | - | --file PATH>",
        after_help = "\
Exactly one value source: the VALUE argument, `-` for stdin, or --file.

Examples:
  cubec put default 1,2,3 'hello'
  cubec put default -1,0,7 - < image.png
  cubec put default 0,0,0 --file image.png"
    )]
    Put(cells::PutArgs),

    /// Print the value at a cell: exactly the stored bytes, nothing added
    #[command(after_help = "\
Exits 1 (printing nothing on stdout) when the cell is empty.

Examples:
  cubec get default 1,2,3
  cubec get default -1,0,7 > image.png
  cubec --json get default 1,2,3")]
    Get(CellArgs),

    /// Print the values at many cells, read in one request from one state of the store
    #[command(after_help = mget::MGET_HELP)]
    Mget(mget::MgetArgs),

    /// Delete the value at a cell (with --detach, also every edge into or out of it)
    #[command(after_help = "\
Exits 1 when there was no value to delete (with --detach: no value and no
edges). Plain del keeps the cell's edges; --detach removes the value and
every edge into or out of the cell in one atomic write.

Examples:
  cubec del default 1,2,3
  cubec del default 1,2,3 --detach")]
    Del(cells::DelArgs),

    /// Create an edge FROM -> TO (or set its weight)
    #[command(after_help = edges::LINK_HELP)]
    Link(edges::LinkArgs),

    /// Remove an edge FROM -> TO
    #[command(after_help = edges::UNLINK_HELP)]
    Unlink(edges::EdgeArgs),

    /// List the edges of a coordinate
    #[command(after_help = edges::EDGES_HELP)]
    Edges(edges::EdgesArgs),

    /// Walk breadth-first from a coordinate: every coordinate reached, with its distance
    #[command(after_help = edges::WALK_HELP)]
    Walk(edges::WalkArgs),

    /// The cheapest path between two coordinates, by edge weight
    #[command(after_help = edges::PATH_HELP)]
    Path(edges::PathArgs),

    /// Print the cells inside a box, in the namespace's curve order
    #[command(after_help = "\
The box is every cell with X0 <= x <= X1, Y0 <= y <= Y1 and Z0 <= z <= Z1
(both corners included). Output is one line per cell: `x,y,z<TAB>value`,
where the value's bytes are printed as text with `\\`, tab, newline, carriage
return, other control bytes and invalid UTF-8 written as `\\\\`, `\\t`, `\\n`,
`\\r` and `\\xNN`, and other characters that end lines (NEL, U+2028, U+2029)
as `\\u{NNNN}`. With --json, one JSON object per line with the exact bytes in
base64. Cells come a page at a time, so any box is fine, even all of space;
--count counts without transferring values. An empty box prints nothing
and exits 0.

Examples:
  cubec scan default -10,-10,0 10,10,0
  cubec scan default 0,0,0 99,99,99 --limit 10
  cubec scan default -2147483648,-2147483648,-2147483648 2147483647,2147483647,2147483647 --count
  cubec --json scan default 0,0,0 3,3,3")]
    Scan(cells::ScanArgs),

    /// Follow the changes inside a box as they commit (from --from LSN, if given)
    #[command(after_help = watch::WATCH_HELP)]
    Watch(watch::WatchArgs),

    /// Show the server's counters and gauges, or (with NS X,Y,Z) a cell's program telemetry
    #[command(after_help = programs::STATS_HELP)]
    Stats(programs::StatsArgs),

    /// Store (or remove) the Lua program of a cell
    #[command(
        override_usage = "cubec prog [OPTIONS] <NS> <X,Y,Z> <SOURCE | - | --file PATH | --delete>",
        after_help = programs::PROG_HELP
    )]
    Prog(programs::ProgArgs),

    /// Run the program of a cell, atomically, and print what it returned
    #[command(after_help = programs::RUN_HELP)]
    Run(programs::RunArgs),

    /// Run every program in a box once, all reading the state from before the step
    #[command(after_help = programs::STEP_HELP)]
    Step(programs::StepArgs),

    /// Create, list, inspect, drop and share namespaces
    #[command(after_help = namespaces::NS_HELP)]
    Ns(namespaces::NsArgs),

    /// Write a namespace's cells, edges and programs to stdout (JSON lines or CSV)
    #[command(after_help = transfer::EXPORT_HELP)]
    Export(transfer::ExportArgs),

    /// Load a file written by export into a namespace, in atomic batches
    #[command(after_help = transfer::IMPORT_HELP)]
    Import(transfer::ImportArgs),

    /// Fold the write-ahead log into a checkpoint now, and report what was written
    #[command(
        after_help = "Waits until the checkpoint is durable. --compact also merges the \
base and all deltas into a new base (dropping deleted cells).

Examples:
  cubec checkpoint
  cubec checkpoint --compact"
    )]
    Checkpoint {
        /// Also merge base + deltas into one new base
        #[arg(long)]
        compact: bool,
    },

    /// Copy a consistent, self-contained data dir while cubed keeps serving
    #[command(
        after_help = "DIR must not exist; cubed creates it (on the daemon's machine) and \
copies (or hard-links) the checkpoint files and closed WAL segments into it. \
`cubed --data DIR` then starts on exactly the writes acknowledged before the backup began.

Examples:
  cubec backup /var/backups/cube-2026-12-02
  cubed --verify /var/backups/cube-2026-12-02"
    )]
    Backup {
        /// Where the copy goes (made absolute from the current directory)
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return argument_error(&error, std::env::args_os().skip(1)),
    };
    match run(&cli) {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            eprintln!("cubec: {}", failure.message);
            if cli.json && !failure.reported_as_json {
                // Scripts read stdout: a failure is an object there too.
                println!("{}", failure_json(&failure));
            }
            ExitCode::from(failure.code)
        }
    }
}

/// A command line clap refused (or `--help`, `--version`): printed as clap
/// prints it, and with `--json` also as a failure object on stdout, so a
/// script reading stdout sees every failure the same way.
fn argument_error(error: &clap::Error, args: impl Iterator<Item = OsString>) -> ExitCode {
    let code = u8::try_from(error.exit_code()).unwrap_or(EXIT_USAGE);
    let _ = error.print();
    if code != 0 && json_asked(args) {
        let rendered = error.render().to_string();
        let first = rendered.lines().next().unwrap_or_default();
        let failure = Failure {
            code,
            message: first.strip_prefix("error: ").unwrap_or(first).to_owned(),
            reported_as_json: false,
        };
        println!("{}", failure_json(&failure));
    }
    ExitCode::from(code)
}

/// Whether `--json` was among the arguments clap could not make sense of
/// (before a `--`, after which everything is a value).
fn json_asked(args: impl Iterator<Item = OsString>) -> bool {
    args.take_while(|arg| arg != "--")
        .any(|arg| arg == "--json")
}

fn run(cli: &Cli) -> Result<u8, Failure> {
    let mut client = Client::connect(&cli.socket)?;
    let mut stdout = io::stdout().lock();
    let outcome = match &cli.command {
        Command::Ping => admin::ping(&mut client, cli.json, &mut stdout),
        Command::Put(args) => cells::put(&mut client, args, cli.json, &mut stdout),
        Command::Get(args) => cells::get(&mut client, args, cli.json, &mut stdout),
        Command::Mget(args) => mget::mget(&mut client, args, cli.json, &mut stdout),
        Command::Del(args) if args.detach => edges::detach(
            &mut client,
            &args.cell.ns,
            args.cell.coord,
            cli.json,
            &mut stdout,
        ),
        Command::Del(args) => cells::del(&mut client, &args.cell, cli.json, &mut stdout),
        Command::Link(args) => edges::link(&mut client, args, cli.json, &mut stdout),
        Command::Unlink(args) => edges::unlink(&mut client, args, cli.json, &mut stdout),
        Command::Edges(args) => edges::edges(&mut client, args, cli.json, &mut stdout),
        Command::Walk(args) => edges::walk(&mut client, args, cli.json, &mut stdout),
        Command::Path(args) => edges::path(&mut client, args, cli.json, &mut stdout),
        Command::Scan(args) => cells::scan(&mut client, args, cli.json, &mut stdout),
        Command::Watch(args) => watch::watch(client, args, cli.json, &mut stdout),
        Command::Stats(programs::StatsArgs {
            ns: Some(ns),
            coord: Some(coord),
            records,
            ..
        }) => programs::cell_stats(&mut client, ns, *coord, *records, cli.json, &mut stdout),
        Command::Stats(programs::StatsArgs {
            prometheus: true, ..
        }) => {
            let text = admin::prometheus_text(&client.stats()?)?;
            emit(&mut stdout, text.as_bytes()).map(|()| 0)
        }
        Command::Stats(programs::StatsArgs {
            watch: Some(secs),
            all,
            ..
        }) => admin::watch_stats(&mut client, *secs, *all, cli.json, &mut stdout),
        Command::Stats(programs::StatsArgs { all, .. }) => {
            admin::stats(&mut client, *all, cli.json, &mut stdout)
        }
        Command::Prog(args) => programs::prog(&mut client, args, cli.json, &mut stdout),
        Command::Run(args) => programs::run(&mut client, args, cli.json, &mut stdout),
        Command::Step(args) => programs::step(&mut client, args, cli.json, &mut stdout),
        Command::Ns(args) => namespaces::run(&mut client, args, cli.json, &mut stdout),
        Command::Export(args) => transfer::export(&mut client, args, &mut stdout),
        Command::Import(args) => transfer::import(&mut client, args, cli.json, &mut stdout),
        Command::Checkpoint { compact } => {
            admin::report(client.checkpoint(*compact)?, cli.json, &mut stdout)
        }
        Command::Backup { dir } => {
            let dir = std::path::absolute(dir).map_err(|e| {
                Failure::usage(format!("cannot make {} absolute: {e}", dir.display()))
            })?;
            admin::report(client.backup(&dir)?, cli.json, &mut stdout)
        }
    };
    let code = outcome?;
    match stdout.flush() {
        // The reader went away (`cubec get ... | head -c1`): not our error.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(code),
        Err(e) => Err(output_failure(&e)),
        Ok(()) => Ok(code),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use clap::CommandFactory;
    use clap::error::ErrorKind;

    use super::*;
    use cube_client::Coord;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("cubec").chain(args.iter().copied()))
    }

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn negative_coordinates_are_positionals_not_flags() {
        let cli = parse(&["get", "default", "-1,-2,-3"]).unwrap();
        let Command::Get(args) = cli.command else {
            panic!("not get")
        };
        assert_eq!(args.coord, Coord::new(-1, -2, -3));
        let cli = parse(&["put", "default", "-5,0,5", "-"]).unwrap();
        let Command::Put(args) = cli.command else {
            panic!("not put")
        };
        assert_eq!(args.cell.coord, Coord::new(-5, 0, 5));
        assert_eq!(args.value.as_deref(), Some(std::ffi::OsStr::new("-")));
    }

    #[test]
    fn value_may_start_with_a_dash() {
        let cli = parse(&["put", "default", "1,2,3", "-x-"]).unwrap();
        let Command::Put(args) = cli.command else {
            panic!("not put")
        };
        assert_eq!(args.value.as_deref(), Some(std::ffi::OsStr::new("-x-")));
    }

    #[test]
    fn file_flag_and_globals_after_positionals() {
        let cli = parse(&["put", "default", "1,2,3", "--file", "v.bin", "--json"]).unwrap();
        assert!(cli.json);
        let Command::Put(args) = cli.command else {
            panic!("not put")
        };
        assert_eq!(args.file, Some(PathBuf::from("v.bin")));
        assert_eq!(args.value, None);
        let cli = parse(&["get", "default", "-1,2,3", "--socket", "/x.sock"]).unwrap();
        assert_eq!(cli.socket, PathBuf::from("/x.sock"));
    }

    #[test]
    fn put_needs_exactly_one_source() {
        let err = parse(&["put", "default", "1,2,3"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::MissingRequiredArgument);
        let err = parse(&["put", "default", "1,2,3", "v", "--file", "f"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ArgumentConflict);
    }

    #[test]
    fn bad_coordinates_and_namespaces_are_usage_errors() {
        let err = parse(&["get", "default", "1,2"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ValueValidation);
        assert!(err.to_string().contains("X,Y,Z"), "{err}");
        let err = parse(&["get", "default", "1,2,99999999999"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ValueValidation);
        let err = parse(&["get", "Not-Valid", "1,2,3"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ValueValidation);
        assert!(err.to_string().contains("only a-z"), "{err}");
        assert_eq!(err.exit_code(), i32::from(EXIT_USAGE));
    }

    #[test]
    fn help_documents_exit_codes_and_examples() {
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("Exit codes"), "{help}");
        assert!(help.contains("4  cannot connect"), "{help}");
        let mut cmd = Cli::command();
        for sub in [
            "ping", "put", "get", "mget", "del", "scan", "stats", "link", "unlink", "edges",
            "walk", "path", "ns", "export", "import", "prog", "run", "step",
        ] {
            let help = cmd
                .find_subcommand_mut(sub)
                .unwrap()
                .render_long_help()
                .to_string();
            assert!(help.contains("cubec "), "{sub} help has no example: {help}");
        }
    }

    #[test]
    fn scan_arguments_parse_with_negative_corners() {
        let cli = parse(&["scan", "default", "-1,-2,-3", "4,5,6", "--limit", "7"]).unwrap();
        let Command::Scan(args) = cli.command else {
            panic!("not scan")
        };
        assert_eq!(
            (args.region.lo, args.region.hi),
            (Coord::new(-1, -2, -3), Coord::new(4, 5, 6))
        );
        assert_eq!(args.limit, Some(7));
        assert!(!args.count);
        let err = parse(&[
            "scan", "default", "0,0,0", "1,1,1", "--count", "--limit", "3",
        ])
        .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ArgumentConflict);
        let err = parse(&["scan", "default", "0,0,0", "1,1,1", "--page-size", "0"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ValueValidation);
    }
}

#[cfg(test)]
mod edge_arg_tests {
    #![allow(clippy::unwrap_used)]

    use clap::Parser;
    use clap::error::ErrorKind;

    use super::*;
    use cube_client::Coord;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("cubec").chain(args.iter().copied()))
    }

    #[test]
    fn link_takes_negative_coordinates_labels_and_weights() {
        let cli = parse(&[
            "link", "default", "-1,0,0", "0,-1,0", "--label", "road", "--weight", "2.5",
        ])
        .unwrap();
        let Command::Link(args) = cli.command else {
            panic!("not link")
        };
        assert_eq!(args.edge.from, Coord::new(-1, 0, 0));
        assert_eq!(args.edge.to, Coord::new(0, -1, 0));
        assert_eq!(args.edge.label.as_str(), "road");
        assert_eq!(args.weight, 2.5);
        let cli = parse(&["link", "default", "0,0,0", "1,0,0"]).unwrap();
        let Command::Link(args) = cli.command else {
            panic!("not link")
        };
        assert_eq!((args.weight, args.edge.label.as_str()), (1.0, ""));
    }

    #[test]
    fn bad_weights_labels_and_directions_are_usage_errors() {
        for weight in ["-1", "nan", "inf", "x"] {
            let err =
                parse(&["link", "default", "0,0,0", "1,0,0", "--weight", weight]).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::ValueValidation, "{weight}");
            assert_eq!(err.exit_code(), i32::from(EXIT_USAGE));
        }
        let long = "x".repeat(65);
        let err = parse(&["link", "default", "0,0,0", "1,0,0", "--label", &long]).unwrap_err();
        assert!(err.to_string().contains("at most 64"), "{err}");
        let err = parse(&["walk", "default", "0,0,0", "--in", "--out"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ArgumentConflict);
        let err = parse(&["path", "default", "0,0,0", "1,0,0", "--max-cost", "-2"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ValueValidation);
        let cli = parse(&["del", "default", "1,2,3", "--detach"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Del(cells::DelArgs { detach: true, .. })
        ));
    }
}
