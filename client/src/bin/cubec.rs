//! `cubec`: the command line for a running `cubed`. Thin over
//! `cube_client::Client`; its own job is arguments, output formats and exit
//! codes, which scripts depend on and therefore never change meaning.

use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{ArgGroup, Args, Parser, Subcommand};
use cube_client::{
    CellBox, Client, ClientError, Coord, DEFAULT_SOCKET_PATH, ErrorCode, MAX_SCAN_PAGE_CELLS,
    NamespaceName, StatsEntry, StatsValue, base64, json, parse_coord,
};
use serde_json::{Value, json};

#[path = "cubec/edges.rs"]
mod edges;
#[path = "cubec/mget.rs"]
mod mget;
#[path = "cubec/namespaces.rs"]
mod namespaces;
#[path = "cubec/programs.rs"]
mod programs;
#[path = "cubec/transfer.rs"]
mod transfer;
#[path = "cubec/watch.rs"]
mod watch;

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
    Put(PutArgs),

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
    Del(DelArgs),

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
    Scan(ScanArgs),

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

#[derive(Debug, Args)]
struct ScanArgs {
    /// Namespace: 1 to 64 of a-z, 0-9, '_' and '-' (a fresh server has `default`)
    #[arg(value_parser = parse_namespace_arg, value_name = "NS")]
    ns: NamespaceName,

    /// The box's low corner, e.g. -10,-10,0
    #[arg(value_parser = parse_coord, allow_hyphen_values = true, value_name = "X0,Y0,Z0")]
    lo: Coord,

    /// The box's high corner, e.g. 10,10,0
    #[arg(value_parser = parse_coord, allow_hyphen_values = true, value_name = "X1,Y1,Z1")]
    hi: Coord,

    /// Print at most N cells; if the box holds more, say on stderr how to continue
    #[arg(long, value_name = "N")]
    limit: Option<u64>,

    /// Print only the number of cells in the box
    #[arg(long, conflicts_with_all = ["limit", "after"])]
    count: bool,

    /// Start strictly after this cell (the position printed when --limit stopped early)
    #[arg(long, value_parser = parse_coord, allow_hyphen_values = true, value_name = "X,Y,Z")]
    after: Option<Coord>,

    /// Also say which LSN the cells are at (on stderr; with --json, a first
    /// line `{"lsn":N}`): `cubec watch --from N+1` then misses no change
    #[arg(long, conflicts_with = "count")]
    lsn: bool,

    /// Cells fetched per request (at most 65536)
    #[arg(long, value_name = "N", default_value_t = 4096,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_SCAN_PAGE_CELLS)))]
    page_size: u32,
}

#[derive(Debug, Args)]
struct CellArgs {
    /// Namespace: 1 to 64 of a-z, 0-9, '_' and '-' (a fresh server has `default`)
    #[arg(value_parser = parse_namespace_arg, value_name = "NS")]
    ns: NamespaceName,

    /// Cell coordinate as X,Y,Z: three 32-bit signed integers, e.g. -1,2,3
    #[arg(value_parser = parse_coord, allow_hyphen_values = true, value_name = "X,Y,Z")]
    coord: Coord,
}

#[derive(Debug, Args)]
struct DelArgs {
    #[command(flatten)]
    cell: CellArgs,

    /// Also remove every edge into or out of the cell, atomically with the value
    #[arg(long)]
    detach: bool,
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("source").required(true).args(["value", "file"])))]
struct PutArgs {
    #[command(flatten)]
    cell: CellArgs,

    /// The value's bytes, or `-` to read them from stdin
    #[arg(allow_hyphen_values = true, value_name = "VALUE")]
    value: Option<OsString>,

    /// Read the value from this file
    #[arg(long, value_name = "PATH")]
    file: Option<PathBuf>,
}

fn parse_namespace_arg(text: &str) -> Result<NamespaceName, String> {
    NamespaceName::new(text).map_err(|e| e.to_string())
}

/// A failure on its way to stderr: what went wrong, what to do about it,
/// and the exit code that classifies it.
struct Failure {
    code: u8,
    message: String,
    /// The command already printed its own JSON answer saying so (an
    /// import's summary), so `--json` adds no failure object.
    reported_as_json: bool,
}

impl Failure {
    fn usage(message: String) -> Failure {
        Failure {
            code: EXIT_USAGE,
            message,
            reported_as_json: false,
        }
    }
}

impl From<ClientError> for Failure {
    fn from(error: ClientError) -> Failure {
        let code = match &error {
            ClientError::Connect { .. } => EXIT_CONNECT,
            ClientError::BadArgument(_) => EXIT_USAGE,
            _ => EXIT_SERVER,
        };
        let message = with_next_step(&error);
        Failure {
            code,
            message,
            reported_as_json: false,
        }
    }
}

/// `error`'s message, followed by what the user can do about it unless the
/// message already says so (the daemon's own messages often name the
/// command that helps: the first `command` of the advice then appears in it).
fn with_next_step(error: &ClientError) -> String {
    let message = error.to_string();
    match next_step(error) {
        Some(step) if !already_advised(&message, step) => format!("{message}; {step}"),
        _ => message,
    }
}

fn already_advised(message: &str, step: &str) -> bool {
    let mut quoted = step.split('`');
    match (quoted.next(), quoted.next()) {
        (Some(_), Some(command)) if !command.is_empty() => message.contains(command),
        _ => false,
    }
}

/// The advice for a value over the daemon's limit: the flag that raises it.
const RAISE_VALUE_LIMIT: &str = "store a smaller value, or restart cubed with a higher limit: \
     `cubed --max-value-bytes BYTES` (with --max-frame-bytes at least 1 KiB larger; \
     `cubed --help` gives the most)";

/// What the user can do about `error`, unless its message already says.
fn next_step(error: &ClientError) -> Option<&'static str> {
    Some(match error {
        ClientError::Connect { .. } | ClientError::VersionMismatch { .. } => return None,
        ClientError::BadArgument(message) if message.contains("max_value_bytes") => {
            RAISE_VALUE_LIMIT
        }
        ClientError::BadArgument(_) => "see `cubec help <command>`",
        ClientError::Io(_) | ClientError::Protocol(_) => {
            "cubed may have stopped or restarted; check its log, then retry"
        }
        ClientError::UnexpectedResponse(_) => {
            "this is a bug; check that cubec and cubed come from the same build and report it"
        }
        ClientError::Daemon(_) => "check the daemon log above",
        // Its message says what to do.
        ClientError::Resync { .. } => return None,
        ClientError::Server(e) => match e.known_code() {
            Some(ErrorCode::NoSuchNamespace) => {
                "check the namespace name; `cubec ns list` shows the namespaces you may see \
                 (a fresh data directory has only `default`)"
            }
            Some(ErrorCode::QuotaExceeded) => {
                "`cubec ns info NS` shows the namespace's use and quotas; delete data to make \
                 room, or write to a namespace with a larger quota"
            }
            Some(ErrorCode::PermissionDenied) => {
                "ask the namespace owner or an administrator (root or cubed's uid): \
                 cubec ns grant NS --uid YOUR_UID (`id -u` prints it); \
                 checkpoint and backup are for administrators only"
            }
            Some(ErrorCode::NamespaceExists) => {
                "choose another name, or `cubec ns drop NAME` first"
            }
            Some(ErrorCode::EncryptionUnavailable) => {
                "start cubed with --key-file PATH, or create the namespace without --encrypted"
            }
            Some(ErrorCode::BadNamespace) => "use 1 to 64 of a-z, 0-9, '_' and '-'",
            Some(ErrorCode::ValueTooLarge | ErrorCode::FrameTooLarge) => RAISE_VALUE_LIMIT,
            Some(ErrorCode::WritesDisabled) => {
                "cubed refuses writes until restarted after a storage failure; \
                 check its log, fix the cause and restart it"
            }
            Some(ErrorCode::ShuttingDown) => "retry once cubed is running again",
            Some(ErrorCode::TooManyConnections | ErrorCode::Overloaded) => {
                "retry shortly, or raise cubed's limits"
            }
            Some(ErrorCode::DiskFull) => "free space on cubed's data volume, then retry",
            Some(ErrorCode::InvalidArgument) => "see `cubec help <command>`",
            Some(ErrorCode::ProgramSyntax) => "fix the source and store it again",
            Some(ErrorCode::ProgramError | ErrorCode::ProgramFuel | ErrorCode::ProgramMemory) => {
                "`cubec stats NS X,Y,Z` shows the cell's recent runs; docs/programs.md the limits"
            }
            Some(ErrorCode::LimitExceeded) => {
                "ask for less (the message names the limit), or raise that cubed flag"
            }
            Some(ErrorCode::BadWeight) => "give a weight that is a finite number >= 0",
            _ => "check cubed's log for details",
        },
    })
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

/// `{"ok":false,"exit":N,"error":"..."}`: what `--json` prints on stdout
/// when a command fails (the message also goes to stderr, as without it).
fn failure_json(failure: &Failure) -> String {
    json::to_string(&json!({"ok": false, "exit": failure.code, "error": failure.message}))
}

fn run(cli: &Cli) -> Result<u8, Failure> {
    let mut client = Client::connect(&cli.socket)?;
    let mut stdout = io::stdout().lock();
    let outcome = match &cli.command {
        Command::Ping => ping(&mut client, cli.json, &mut stdout),
        Command::Put(args) => put(&mut client, args, cli.json, &mut stdout),
        Command::Get(args) => get(&mut client, args, cli.json, &mut stdout),
        Command::Mget(args) => mget::mget(&mut client, args, cli.json, &mut stdout),
        Command::Del(args) if args.detach => edges::detach(
            &mut client,
            &args.cell.ns,
            args.cell.coord,
            cli.json,
            &mut stdout,
        ),
        Command::Del(args) => del(&mut client, &args.cell, cli.json, &mut stdout),
        Command::Link(args) => edges::link(&mut client, args, cli.json, &mut stdout),
        Command::Unlink(args) => edges::unlink(&mut client, args, cli.json, &mut stdout),
        Command::Edges(args) => edges::edges(&mut client, args, cli.json, &mut stdout),
        Command::Walk(args) => edges::walk(&mut client, args, cli.json, &mut stdout),
        Command::Path(args) => edges::path(&mut client, args, cli.json, &mut stdout),
        Command::Scan(args) => scan(&mut client, args, cli.json, &mut stdout),
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
            let text = prometheus_text(&client.stats()?)?;
            emit(&mut stdout, text.as_bytes()).map(|()| 0)
        }
        Command::Stats(programs::StatsArgs {
            watch: Some(secs),
            all,
            ..
        }) => watch_stats(&mut client, *secs, *all, cli.json, &mut stdout),
        Command::Stats(programs::StatsArgs { all, .. }) => {
            stats(&mut client, *all, cli.json, &mut stdout)
        }
        Command::Prog(args) => programs::prog(&mut client, args, cli.json, &mut stdout),
        Command::Run(args) => programs::run(&mut client, args, cli.json, &mut stdout),
        Command::Step(args) => programs::step(&mut client, args, cli.json, &mut stdout),
        Command::Ns(args) => namespaces::run(&mut client, args, cli.json, &mut stdout),
        Command::Export(args) => transfer::export(&mut client, args, &mut stdout),
        Command::Import(args) => transfer::import(&mut client, args, cli.json, &mut stdout),
        Command::Checkpoint { compact } => {
            report(client.checkpoint(*compact)?, cli.json, &mut stdout)
        }
        Command::Backup { dir } => {
            let dir = std::path::absolute(dir).map_err(|e| {
                Failure::usage(format!("cannot make {} absolute: {e}", dir.display()))
            })?;
            report(client.backup(&dir)?, cli.json, &mut stdout)
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

fn output_failure(e: &io::Error) -> Failure {
    Failure::usage(format!(
        "cannot write to stdout: {e}; check where the output goes"
    ))
}

/// Writes `bytes` to stdout, treating a closed pipe as the reader being done.
fn emit(out: &mut impl Write, bytes: &[u8]) -> Result<(), Failure> {
    match out.write_all(bytes) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(output_failure(&e)),
        Ok(()) => Ok(()),
    }
}

fn emit_line(out: &mut impl Write, line: &str) -> Result<(), Failure> {
    emit(out, format!("{line}\n").as_bytes())
}

/// `{"ns":..,"coord":[x,y,z]}` followed by `more` (an object's fields).
fn cell_json(cell: &CellArgs, more: Value) -> String {
    let mut object = json!({"ns": cell.ns.as_str(), "coord": coord_json(cell.coord)});
    if let (Some(fields), Value::Object(more)) = (object.as_object_mut(), more) {
        fields.extend(more);
    }
    json::to_string(&object)
}

fn ping(client: &mut Client, as_json: bool, out: &mut impl Write) -> Result<u8, Failure> {
    let started = Instant::now();
    client.ping()?;
    let round_trip_ms = started.elapsed().as_secs_f64() * 1000.0;
    let line = if as_json {
        json::to_string(&json!({
            "ok": true,
            "server_version": client.server_version(),
            "round_trip_ms": round_trip_ms,
        }))
    } else {
        format!(
            "pong from cubed {} in {round_trip_ms:.3} ms",
            client.server_version()
        )
    };
    emit_line(out, &line)?;
    Ok(0)
}

fn read_value(args: &PutArgs) -> Result<Vec<u8>, Failure> {
    match (&args.value, &args.file) {
        (Some(value), None) if value == "-" => {
            let mut bytes = Vec::new();
            io::stdin().lock().read_to_end(&mut bytes).map_err(|e| {
                Failure::usage(format!(
                    "cannot read the value from stdin: {e}; pipe the value in or pass it as an argument"
                ))
            })?;
            Ok(bytes)
        }
        // Unix arguments are bytes; keep them exactly, even when not UTF-8.
        (Some(value), None) => Ok(value.clone().into_vec()),
        (None, Some(path)) => std::fs::read(path).map_err(|e| {
            Failure::usage(format!(
                "cannot read value file {}: {e}; check the path and permissions",
                path.display()
            ))
        }),
        // clap's "source" group already demands exactly one.
        _ => Err(Failure::usage(
            "give exactly one value source: VALUE, `-` for stdin, or --file PATH; \
             see `cubec help put`"
                .to_owned(),
        )),
    }
}

fn put(
    client: &mut Client,
    args: &PutArgs,
    as_json: bool,
    out: &mut impl Write,
) -> Result<u8, Failure> {
    let value = read_value(args)?;
    let lsn = client.put(args.cell.ns.as_str(), args.cell.coord, &value)?;
    let line = if as_json {
        cell_json(&args.cell, json!({"bytes": value.len(), "lsn": lsn}))
    } else {
        format!(
            "stored {} bytes at {} {} (lsn {lsn})",
            value.len(),
            args.cell.ns,
            args.cell.coord
        )
    };
    emit_line(out, &line)?;
    Ok(0)
}

fn get(
    client: &mut Client,
    args: &CellArgs,
    as_json: bool,
    out: &mut impl Write,
) -> Result<u8, Failure> {
    let value = client.get(args.ns.as_str(), args.coord)?;
    if as_json {
        let line = match &value {
            Some(bytes) => cell_json(
                args,
                json!({
                    "found": true,
                    "value": std::str::from_utf8(bytes).ok(),
                    "value_base64": base64::encode(bytes),
                }),
            ),
            None => cell_json(
                args,
                json!({"found": false, "value": null, "value_base64": null}),
            ),
        };
        emit_line(out, &line)?;
    } else if let Some(bytes) = &value {
        emit(out, bytes)?;
    } else {
        eprintln!("cubec: no value at {} {}", args.ns, args.coord);
    }
    Ok(if value.is_some() { 0 } else { EXIT_NOT_FOUND })
}

fn del(
    client: &mut Client,
    args: &CellArgs,
    as_json: bool,
    out: &mut impl Write,
) -> Result<u8, Failure> {
    let existed = client.del(args.ns.as_str(), args.coord)?;
    if as_json {
        emit_line(out, &cell_json(args, json!({"existed": existed})))?;
    } else if existed {
        emit_line(out, &format!("deleted {} {}", args.ns, args.coord))?;
    } else {
        eprintln!(
            "cubec: no value at {} {}; nothing deleted",
            args.ns, args.coord
        );
    }
    Ok(if existed { 0 } else { EXIT_NOT_FOUND })
}

fn scan(
    client: &mut Client,
    args: &ScanArgs,
    as_json: bool,
    out: &mut impl Write,
) -> Result<u8, Failure> {
    let region = CellBox::new(args.lo, args.hi)
        .map_err(|why| Failure::usage(format!("{why}; see `cubec help scan`")))?;
    if args.count {
        let count = client.scan_count(args.ns.as_str(), &region)?;
        let line = if as_json {
            json::to_string(&json!({
                "ns": args.ns.as_str(),
                "lo": coord_json(args.lo),
                "hi": coord_json(args.hi),
                "count": count,
            }))
        } else {
            count.to_string()
        };
        emit_line(out, &line)?;
        return Ok(0);
    }
    let limit = args.limit.unwrap_or(u64::MAX);
    let mut printed = 0u64;
    let mut after = args.after;
    let mut line = Vec::with_capacity(256);
    while printed < limit {
        let want = (limit - printed).min(u64::from(args.page_size)) as u32;
        let page = if args.lsn && printed == 0 && after == args.after {
            let (page, lsn) = client.scan_page_with_lsn(args.ns.as_str(), &region, want, after)?;
            if as_json {
                emit_line(out, &json::to_string(&json!({"lsn": lsn})))?;
            } else {
                eprintln!(
                    "cubec: the cells are at LSN {lsn} (every change up to it is in them); \
                     follow on with `cubec watch {} {} {} --from {}`",
                    args.ns,
                    args.lo,
                    args.hi,
                    lsn + 1
                );
            }
            page
        } else {
            client.scan_page(args.ns.as_str(), &region, want, after)?
        };
        for cell in &page.cells {
            line.clear();
            if as_json {
                line.extend_from_slice(scan_cell_json(cell.coord, &cell.value).as_bytes());
            } else {
                line.extend_from_slice(format!("{}\t", cell.coord).as_bytes());
                escape_value(&cell.value, &mut line);
            }
            line.push(b'\n');
            emit(out, &line)?;
            printed += 1;
        }
        match page.resume_after {
            None => return Ok(0),
            Some(next) => after = Some(next),
        }
    }
    if let Some(position) = after {
        eprintln!(
            "cubec: stopped after {printed} cells (--limit); the box may hold more: \
             continue with --after {position}"
        );
    }
    Ok(0)
}

fn coord_json(c: Coord) -> Value {
    json!([c.x, c.y, c.z])
}

fn scan_cell_json(coord: Coord, value: &[u8]) -> String {
    json::to_string(&json!({
        "coord": coord_json(coord),
        "value": std::str::from_utf8(value).ok(),
        "value_base64": base64::encode(value),
    }))
}

/// Appends `value` as one line of text: valid UTF-8 as is, except that the
/// backslash, tab, newline, carriage return and other control bytes
/// (`\xNN`), other control characters and the Unicode line and paragraph
/// separators (`\u{NNNN}`), and bytes that are not UTF-8 become escapes, so
/// every cell stays one line and nothing is lost.
fn escape_value(value: &[u8], out: &mut Vec<u8>) {
    for chunk in value.utf8_chunks() {
        for ch in chunk.valid().chars() {
            match ch {
                '\\' => out.extend_from_slice(b"\\\\"),
                '\t' => out.extend_from_slice(b"\\t"),
                '\n' => out.extend_from_slice(b"\\n"),
                '\r' => out.extend_from_slice(b"\\r"),
                c if c.is_control() && c.is_ascii() => {
                    out.extend_from_slice(format!("\\x{:02x}", c as u32).as_bytes());
                }
                // Other characters that tools treat as line breaks (NEL,
                // C1 controls, the line and paragraph separators).
                c if c.is_control() || c == '\u{2028}' || c == '\u{2029}' => {
                    out.extend_from_slice(format!("\\u{{{:x}}}", c as u32).as_bytes());
                }
                c => {
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
            }
        }
        for byte in chunk.invalid() {
            out.extend_from_slice(format!("\\x{byte:02x}").as_bytes());
        }
    }
}

/// Most refreshes `--watch` does before it stops by itself (a day at 2 s).
const MAX_WATCH_REFRESHES: u32 = 43_200;

/// Redraws the stats every `secs` seconds: clear the screen, home the
/// cursor, print the table (or one JSON object per line with --json).
fn watch_stats(
    client: &mut Client,
    secs: f64,
    all: bool,
    as_json: bool,
    out: &mut impl Write,
) -> Result<u8, Failure> {
    if !(secs.is_finite() && secs >= 0.1) {
        return Err(Failure::usage(format!(
            "--watch {secs}: give an interval of at least 0.1 seconds"
        )));
    }
    for _ in 0..MAX_WATCH_REFRESHES {
        let entries = client.stats()?;
        let text = if as_json {
            stats_json(&entries)
        } else {
            let (table, hidden) = happened_table(&entries, all);
            let note = hidden_rows_note(hidden).unwrap_or_default();
            format!("\x1b[2J\x1b[H{table}{note}\n")
        };
        emit(out, text.as_bytes())?;
        out.flush().map_err(|e| output_failure(&e))?;
        std::thread::sleep(std::time::Duration::from_secs_f64(secs));
    }
    Ok(0)
}

/// The Prometheus text exposition (format 0.0.4), the same that
/// `cubed --metrics-listen` serves at /metrics (`cube_metrics`).
fn prometheus_text(entries: &[StatsEntry]) -> Result<String, Failure> {
    cube_metrics::exposition(entries).map_err(|why| Failure {
        code: EXIT_SERVER,
        message: why,
        reported_as_json: false,
    })
}

/// `cubec stats`: JSON carries every row (scripts look rows up by name);
/// the table shows what has happened unless `all`.
fn stats(
    client: &mut Client,
    all: bool,
    as_json: bool,
    out: &mut impl Write,
) -> Result<u8, Failure> {
    let entries = client.stats()?;
    if as_json {
        return report(entries, true, out);
    }
    let (table, hidden) = happened_table(&entries, all);
    emit(out, table.as_bytes())?;
    if let Some(note) = hidden_rows_note(hidden) {
        eprintln!("cubec: {note}");
    }
    Ok(0)
}

/// The stats table without what has not happened (unless `all`): the rows
/// of commands never served, other counts and figures that are zero, and
/// the latency histogram's rows (for Prometheus); with how many it hid.
fn happened_table(entries: &[StatsEntry], all: bool) -> (String, usize) {
    if all {
        return (stats_table(entries), 0);
    }
    let served = |command: &str| {
        entries.iter().any(|e| {
            e.name == format!("cmd.{command}.count") && !matches!(e.value, StatsValue::Count(0))
        })
    };
    let shown: Vec<StatsEntry> = entries
        .iter()
        .filter(|e| !cube_metrics::is_histogram_row(&e.name))
        .filter(|e| match &e.value {
            StatsValue::Count(0) => false,
            StatsValue::Float(f) if *f == 0.0 => false,
            _ => true,
        })
        .filter(|e| match e.name.strip_prefix("cmd.") {
            Some(rest) => rest
                .split_once('.')
                .is_some_and(|(command, _)| served(command)),
            None => true,
        })
        .cloned()
        .collect();
    (stats_table(&shown), entries.len() - shown.len())
}

/// What `cubec stats` says (on stderr, so stdout stays one table) about
/// the rows it hid.
fn hidden_rows_note(hidden: usize) -> Option<String> {
    (hidden > 0).then(|| {
        format!(
            "({hidden} rows of what has not happened yet or of the latency histograms hidden; \
             `cubec stats --all` shows every row)"
        )
    })
}

/// Prints named figures (stats, or what a checkpoint or backup did).
fn report(entries: Vec<StatsEntry>, as_json: bool, out: &mut impl Write) -> Result<u8, Failure> {
    let text = if as_json {
        stats_json(&entries)
    } else {
        stats_table(&entries)
    };
    emit(out, text.as_bytes())?;
    Ok(0)
}

fn stats_json(entries: &[StatsEntry]) -> String {
    let fields: serde_json::Map<String, Value> = entries
        .iter()
        .map(|entry| {
            let value = match &entry.value {
                StatsValue::Count(n) => Value::from(*n),
                StatsValue::Float(f) => Value::from(*f),
                StatsValue::Text(t) => Value::from(t.as_str()),
            };
            (entry.name.clone(), value)
        })
        .collect();
    format!("{}\n", json::to_string(&fields))
}

fn format_float(value: f64) -> String {
    if value == 0.0 || value.abs() >= 0.001 || !value.is_finite() {
        format!("{value:.3}")
    } else {
        format!("{value:e}")
    }
}

/// Names left-aligned, numbers right-aligned on their last digit, text
/// left-aligned where the numbers start, so columns read at a glance.
fn stats_table(entries: &[StatsEntry]) -> String {
    let rendered: Vec<(&str, String, bool)> = entries
        .iter()
        .map(|entry| match &entry.value {
            StatsValue::Count(n) => (entry.name.as_str(), n.to_string(), true),
            StatsValue::Float(f) => (entry.name.as_str(), format_float(*f), true),
            StatsValue::Text(t) => (entry.name.as_str(), t.clone(), false),
        })
        .collect();
    let name_width = rendered
        .iter()
        .map(|(n, _, _)| n.chars().count())
        .max()
        .unwrap_or(0);
    let number_width = rendered
        .iter()
        .filter(|(_, _, numeric)| *numeric)
        .map(|(_, v, _)| v.chars().count())
        .max()
        .unwrap_or(0);
    let mut table = String::new();
    for (name, value, numeric) in rendered {
        let line = if numeric {
            format!("{name:<name_width$}  {value:>number_width$}")
        } else {
            format!("{name:<name_width$}  {value}")
        };
        table.push_str(line.trim_end());
        table.push('\n');
    }
    table
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use clap::CommandFactory;
    use clap::error::ErrorKind;

    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("cubec").chain(args.iter().copied()))
    }

    #[test]
    fn advice_the_daemon_already_gave_is_not_repeated() {
        use cube_client::ServerError;
        let unknown = |message: &str| {
            ClientError::Server(ServerError::new(ErrorCode::NoSuchNamespace, message))
        };
        // The connection's answer names `cubec ns list`; the writer's does not.
        let named = with_next_step(&unknown(
            "no such namespace \"x\"; `cubec ns list` shows the ones you may use",
        ));
        assert_eq!(named.matches("cubec ns list").count(), 1, "{named}");
        let bare = with_next_step(&unknown("no such namespace \"x\""));
        assert!(
            bare.contains("; check the namespace name; `cubec ns list`"),
            "{bare}"
        );
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
            (args.lo, args.hi),
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

    #[test]
    fn scan_values_are_escaped_to_one_line() {
        let mut out = Vec::new();
        escape_value(b"a\tb\nc\\d\x01\xffz\xc3\xa9", &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "a\\tb\\nc\\\\d\\x01\\xffz\u{e9}"
        );
        // Characters other tools split lines at.
        let mut out = Vec::new();
        escape_value("\u{85}\u{2028}\u{2029} nel".as_bytes(), &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "\\u{85}\\u{2028}\\u{2029} nel"
        );
        assert_eq!(
            scan_cell_json(Coord::new(1, -2, 3), b"hi"),
            "{\"coord\":[1,-2,3],\"value\":\"hi\",\"value_base64\":\"aGk=\"}"
        );
    }

    #[test]
    fn stats_render_as_table_and_json() {
        let entries = vec![
            StatsEntry {
                name: "puts".to_owned(),
                value: StatsValue::Count(12345),
            },
            StatsEntry {
                name: "fsync_p99_ms".to_owned(),
                value: StatsValue::Float(1.5),
            },
            StatsEntry {
                name: "sync_mode".to_owned(),
                value: StatsValue::Text("always \"x\"".to_owned()),
            },
        ];
        assert_eq!(
            stats_table(&entries),
            "puts          12345\nfsync_p99_ms  1.500\nsync_mode     always \"x\"\n"
        );
        assert_eq!(
            stats_json(&entries),
            "{\"puts\":12345,\"fsync_p99_ms\":1.5,\"sync_mode\":\"always \\\"x\\\"\"}\n"
        );
        assert_eq!(stats_json(&[]), "{}\n");
    }

    #[test]
    fn failures_say_what_to_do_and_pick_the_exit_code() {
        let f = Failure::from(ClientError::Server(cube_client::ServerError::new(
            ErrorCode::NoSuchNamespace,
            "no such namespace \"nosuch\"",
        )));
        assert_eq!(f.code, EXIT_SERVER);
        assert!(f.message.contains("no such namespace"), "{}", f.message);
        assert!(
            f.message.contains("; check the namespace name"),
            "{}",
            f.message
        );
        let f = Failure::from(ClientError::BadArgument("value is too big".to_owned()));
        assert_eq!(f.code, EXIT_USAGE);
        let f = Failure::from(ClientError::Connect {
            path: PathBuf::from("/nope.sock"),
            source: io::Error::from(io::ErrorKind::NotFound),
        });
        assert_eq!(f.code, EXIT_CONNECT);
        assert!(f.message.contains("make run"), "{}", f.message);
    }
}

#[cfg(test)]
mod edge_arg_tests {
    #![allow(clippy::unwrap_used)]

    use clap::Parser;
    use clap::error::ErrorKind;

    use super::*;

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
            Command::Del(DelArgs { detach: true, .. })
        ));
    }
}
