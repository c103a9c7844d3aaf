//! What the driver talks to: a throwaway or running `cubed`, a throwaway
//! `redis-server`, an SQLite file, or a ceiling server (cube's design and
//! nothing more, `ceiling.rs`).
//!
//! Each target provides a [`Connector`] (shared by the client threads,
//! each of which opens its own [`Connection`]) and, through
//! [`RunningTarget`], owns the process or files it started and removes them
//! when dropped.

pub mod ceiling;
pub mod ceiling_server;
pub mod cube;
pub mod redis;
pub mod server_process;
pub mod sqlite;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use cube_client::{LocalDaemon, StatsEntry};
use cube_protocol::Coord;

use crate::error::{OpError, StressError};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, ValueEnum)]
pub enum TargetKind {
    /// cubed (a throwaway one unless --socket names a running one).
    Cube,
    /// redis-server with appendonly yes, appendfsync always: durable like cube.
    #[value(alias = "redis")]
    RedisAlways,
    /// redis-server with appendfsync everysec: up to a second of writes lost on a crash.
    RedisEverysec,
    /// redis-server without persistence.
    RedisNone,
    /// SQLite in WAL mode, synchronous=FULL, one transaction per write.
    Sqlite,
    /// cube's design bare: thread per connection, puts answered at once
    /// from memory (not durable). The socket round-trip ceiling.
    CeilingEcho,
    /// cube's design bare: thread per connection + one group-commit
    /// thread, one fdatasync per group. The durable-put ceiling.
    CeilingSync,
}

impl TargetKind {
    pub const ALL: [TargetKind; 7] = [
        TargetKind::Cube,
        TargetKind::RedisAlways,
        TargetKind::RedisEverysec,
        TargetKind::RedisNone,
        TargetKind::Sqlite,
        TargetKind::CeilingEcho,
        TargetKind::CeilingSync,
    ];

    pub fn name(self) -> &'static str {
        match self {
            TargetKind::Cube => "cube",
            TargetKind::RedisAlways => "redis-always",
            TargetKind::RedisEverysec => "redis-everysec",
            TargetKind::RedisNone => "redis-none",
            TargetKind::Sqlite => "sqlite",
            TargetKind::CeilingEcho => "ceiling-echo",
            TargetKind::CeilingSync => "ceiling-sync",
        }
    }

    pub fn is_redis(self) -> bool {
        matches!(
            self,
            TargetKind::RedisAlways | TargetKind::RedisEverysec | TargetKind::RedisNone
        )
    }
}

/// One client's session with the target. Requests are one at a time.
pub trait Connection: Send {
    /// Stores `value` at `coord`; returns once the target acknowledged it
    /// (durably, for the durable targets).
    fn put(&mut self, coord: Coord, value: &[u8]) -> Result<(), OpError>;

    /// The value at `coord`, or `None` when there is none.
    fn get(&mut self, coord: Coord) -> Result<Option<Vec<u8>>, OpError>;

    /// The values at `coords`, in order (repeats allowed), each `None`
    /// when its cell is empty, read in one request: cube's `mget` (one
    /// consistent state), Redis `MGET`, one SQLite `SELECT`.
    fn mget(&mut self, coords: &[Coord]) -> Result<Vec<Option<Vec<u8>>>, OpError>;

    /// Many writes, for filling the key space before the clock starts.
    /// Targets with a batch form (a pipeline, a transaction) override this.
    fn put_many(&mut self, items: &[(Coord, Vec<u8>)]) -> Result<(), OpError> {
        items
            .iter()
            .try_for_each(|(coord, value)| self.put(*coord, value))
    }

    /// A durable edge `from -> to` of weight 1 and the empty label. Only
    /// cube has edges; the `walk` workload is refused for other targets
    /// before it starts, so these defaults are never reached in a run.
    fn link(&mut self, from: Coord, to: Coord) -> Result<(), OpError> {
        let _ = (from, to);
        Err(unsupported("link"))
    }

    fn unlink(&mut self, from: Coord, to: Coord) -> Result<(), OpError> {
        let _ = (from, to);
        Err(unsupported("unlink"))
    }

    /// The coordinates within `depth` outgoing hops of `from`, with their
    /// distances, nearest first.
    fn walk(&mut self, from: Coord, depth: u32) -> Result<Vec<(Coord, u32)>, OpError> {
        let _ = (from, depth);
        Err(unsupported("walk"))
    }

    /// The cheapest path's coordinates and cost, or `None` for no path.
    fn path(&mut self, from: Coord, to: Coord) -> Result<Option<(Vec<Coord>, f64)>, OpError> {
        let _ = (from, to);
        Err(unsupported("path"))
    }

    /// `prog` of `source` at `coord` and a `run` of it, pipelined in one
    /// round trip; each request's own outcome (the run's telemetry seq).
    /// Only cube has programs.
    fn prog_and_run(&mut self, coord: Coord, source: &[u8]) -> Result<PairOutcome, OpError> {
        let _ = (coord, source);
        Err(unsupported("cell programs"))
    }

    /// A cell-program request and its answer (see [`ProgramAnswer`]).
    /// Only cube has programs.
    fn program_request(&mut self, request: ProgramRequest<'_>) -> Result<ProgramAnswer, OpError> {
        let _ = request;
        Err(unsupported("cell programs"))
    }
}

/// Cell programs: only cube has them; the `seed` workload is refused for
/// other targets before it starts.
pub trait ProgramConnection {
    /// Stores a program at `coord`.
    fn prog(&mut self, coord: Coord, source: &[u8]) -> Result<(), OpError>;
    /// Runs the program at `coord`; returns its telemetry seq.
    fn run(&mut self, coord: Coord) -> Result<u64, OpError>;
    /// Runs every program in the box `lo..=hi` once, as one step (no
    /// arguments); failed runs are in the answer, not an error.
    fn step(&mut self, lo: Coord, hi: Coord) -> Result<StepAnswer, OpError>;
    /// `(runs, failures)` of the program telemetry at `coord`.
    fn cell_stats(&mut self, coord: Coord) -> Result<(u64, u64), OpError>;
}

impl<T: Connection + ?Sized> ProgramConnection for T {
    fn prog(&mut self, coord: Coord, source: &[u8]) -> Result<(), OpError> {
        match self.program_request(ProgramRequest::Prog(coord, source))? {
            ProgramAnswer::Stored => Ok(()),
            other => Err(mismatched("prog", &other)),
        }
    }

    fn run(&mut self, coord: Coord) -> Result<u64, OpError> {
        match self.program_request(ProgramRequest::Run(coord))? {
            ProgramAnswer::Ran { seq } => Ok(seq),
            other => Err(mismatched("run", &other)),
        }
    }

    fn step(&mut self, lo: Coord, hi: Coord) -> Result<StepAnswer, OpError> {
        match self.program_request(ProgramRequest::Step(lo, hi))? {
            ProgramAnswer::Stepped(answer) => Ok(answer),
            other => Err(mismatched("step", &other)),
        }
    }

    fn cell_stats(&mut self, coord: Coord) -> Result<(u64, u64), OpError> {
        match self.program_request(ProgramRequest::CellStats(coord))? {
            ProgramAnswer::Stats { runs, failures } => Ok((runs, failures)),
            other => Err(mismatched("cell-stats", &other)),
        }
    }
}

/// One cell-program request (see [`ProgramConnection`]).
pub enum ProgramRequest<'a> {
    Prog(Coord, &'a [u8]),
    Run(Coord),
    /// The box `lo..=hi`.
    Step(Coord, Coord),
    CellStats(Coord),
}

/// What a pipelined `prog` + `run` pair answered, each on its own.
pub struct PairOutcome {
    pub prog: Result<(), OpError>,
    /// The run's telemetry seq.
    pub run: Result<u64, OpError>,
}

/// The answer to a [`ProgramRequest`], one variant per request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProgramAnswer {
    /// `prog`: stored.
    Stored,
    /// `run`: the run's telemetry seq at its cell.
    Ran { seq: u64 },
    /// `step`.
    Stepped(StepAnswer),
    /// `cell-stats`: the cell's run and failure counts.
    Stats { runs: u64, failures: u64 },
}

/// What a `step` answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepAnswer {
    /// Programs that ran, one per cell of the box holding one.
    pub programs: u64,
    /// Of those, the runs that failed (recorded in telemetry, nothing applied).
    pub failed: u64,
    /// The first failed run, described (where, how, why), if any.
    pub first_failure: Option<String>,
}

/// A target answered a program request with another request's answer.
fn mismatched(request: &str, answer: &ProgramAnswer) -> OpError {
    OpError::Failed(format!(
        "{request} got an answer of another kind: {answer:?}"
    ))
}

fn unsupported(command: &str) -> OpError {
    OpError::Failed(format!(
        "{command} is not supported by this target (edges are cube's)"
    ))
}

/// Opens connections to one target; shared by all client threads.
pub trait Connector: Send + Sync {
    fn connect(&self) -> Result<Box<dyn Connection>, OpError>;

    /// The target's own figures, in cube's `stats` naming where there is a
    /// counterpart (`cmd.<name>.count`, `cmd.<name>.latency_us_mean`);
    /// empty for a target that keeps none.
    fn server_figures(&self) -> Result<Vec<StatsEntry>, String>;
}

/// Which target to run against and how to reach or start it.
#[derive(Clone, Debug)]
pub struct TargetSpec {
    pub kind: TargetKind,
    /// A running cubed's socket; `None` starts a throwaway one.
    pub socket: Option<PathBuf>,
    /// Extra flags for a throwaway cubed.
    pub daemon_args: Vec<String>,
    /// cube's namespace for the run (`default` when `None`), created
    /// before the run if it does not exist.
    pub namespace: Option<String>,
    /// Create `namespace` encrypted (the daemon needs `--key-file`).
    pub encrypted: bool,
    /// The executable whose hidden `ceiling-server` subcommand serves the
    /// ceiling targets; `None`: this process's own, right when it is
    /// `cube-stress` (a test harness names the binary instead).
    pub ceiling_binary: Option<PathBuf>,
}

impl TargetSpec {
    pub fn new(kind: TargetKind) -> TargetSpec {
        TargetSpec {
            kind,
            socket: None,
            daemon_args: Vec::new(),
            namespace: None,
            encrypted: false,
            ceiling_binary: None,
        }
    }
}

/// `, namespace NS (encrypted)` for a run outside `default`.
fn namespace_note(spec: &TargetSpec) -> String {
    match &spec.namespace {
        Some(ns) if spec.encrypted => format!(", namespace {ns} (encrypted)"),
        Some(ns) => format!(", namespace {ns}"),
        None => String::new(),
    }
}

/// The process or files a target runs on; dropping it stops and removes
/// what the driver started (never a daemon it was pointed at).
enum Backing {
    ThrowawayCube(LocalDaemon),
    RunningCube(PathBuf),
    Redis(redis::RedisServer),
    /// Held only so the file is removed after the run.
    Sqlite {
        _file: sqlite::SqliteFile,
    },
    Ceiling(ceiling::CeilingServer),
}

/// A started (or reached) target.
pub struct RunningTarget {
    pub kind: TargetKind,
    /// One line for people: what runs where, with which durability.
    pub detail: String,
    pub connector: Arc<dyn Connector>,
    /// Whether it started empty, so keys never written must be absent.
    pub fresh: bool,
    backing: Backing,
}

impl RunningTarget {
    pub fn start(spec: &TargetSpec) -> Result<RunningTarget, StressError> {
        if spec.kind != TargetKind::Cube
            && (spec.socket.is_some() || !spec.daemon_args.is_empty() || spec.namespace.is_some())
        {
            return Err(StressError::Usage(format!(
                "--socket, --daemon-arg and --namespace are for --target cube, not {}",
                spec.kind.name()
            )));
        }
        if spec.encrypted && spec.namespace.is_none() {
            return Err(StressError::Usage(
                "--encrypted creates the run's --namespace encrypted; name one".to_owned(),
            ));
        }
        let namespace = spec.namespace.as_deref().unwrap_or(cube::DEFAULT_NAMESPACE);
        match spec.kind {
            TargetKind::Cube => match &spec.socket {
                Some(socket) => RunningTarget::reach_cube(spec, socket, namespace),
                None => RunningTarget::start_throwaway_cube(spec, namespace),
            },
            TargetKind::RedisAlways | TargetKind::RedisEverysec | TargetKind::RedisNone => {
                let fsync = match spec.kind {
                    TargetKind::RedisAlways => redis::Persistence::Always,
                    TargetKind::RedisEverysec => redis::Persistence::Everysec,
                    _ => redis::Persistence::None,
                };
                let server = redis::RedisServer::start(fsync)?;
                let detail = server.describe();
                Ok(RunningTarget {
                    kind: spec.kind,
                    detail,
                    connector: Arc::new(server.connector()),
                    fresh: true,
                    backing: Backing::Redis(server),
                })
            }
            TargetKind::Sqlite => {
                let file = sqlite::SqliteFile::create()?;
                let detail = file.describe();
                Ok(RunningTarget {
                    kind: spec.kind,
                    detail,
                    connector: Arc::new(file.connector()),
                    fresh: true,
                    backing: Backing::Sqlite { _file: file },
                })
            }
            TargetKind::CeilingEcho | TargetKind::CeilingSync => {
                let mode = if spec.kind == TargetKind::CeilingSync {
                    ceiling::CeilingMode::Sync
                } else {
                    ceiling::CeilingMode::Echo
                };
                let server = ceiling::CeilingServer::start(mode, spec.ceiling_binary.as_deref())?;
                Ok(RunningTarget {
                    kind: spec.kind,
                    detail: server.describe(),
                    connector: Arc::new(server.connector()),
                    fresh: true,
                    backing: Backing::Ceiling(server),
                })
            }
        }
    }

    /// A running cubed at `socket`, which the driver never stops.
    fn reach_cube(
        spec: &TargetSpec,
        socket: &Path,
        namespace: &str,
    ) -> Result<RunningTarget, StressError> {
        if !spec.daemon_args.is_empty() {
            return Err(StressError::Usage(
                "--daemon-arg starts a throwaway cubed with extra flags; \
                 it cannot change a running one given with --socket"
                    .to_owned(),
            ));
        }
        RunningTarget::cube(
            spec,
            cube::CubeConnector::new(socket.to_owned(), namespace),
            format!("running cubed at {}", socket.display()),
            Backing::RunningCube(socket.to_owned()),
        )
    }

    /// A throwaway cubed on a fresh data dir, with `--daemon-arg`'s flags.
    fn start_throwaway_cube(
        spec: &TargetSpec,
        namespace: &str,
    ) -> Result<RunningTarget, StressError> {
        let args: Vec<&str> = spec.daemon_args.iter().map(String::as_str).collect();
        let daemon = LocalDaemon::start_fresh(&args)?;
        let connector = cube::CubeConnector::new(daemon.socket().to_owned(), namespace);
        let place = format!(
            "throwaway cubed in {}",
            daemon
                .data_dir()
                .parent()
                .unwrap_or(daemon.data_dir())
                .display()
        );
        RunningTarget::cube(spec, connector, place, Backing::ThrowawayCube(daemon))
    }

    /// A cube target on `connector`, `place` in its detail: the run's
    /// namespace made first when it names one. Only a throwaway cubed
    /// starts fresh.
    fn cube(
        spec: &TargetSpec,
        connector: cube::CubeConnector,
        place: String,
        backing: Backing,
    ) -> Result<RunningTarget, StressError> {
        if spec.namespace.is_some() {
            connector.ensure_namespace(spec.encrypted)?;
        }
        let detail = format!(
            "{place} ({}){}",
            connector.describe()?,
            namespace_note(spec)
        );
        Ok(RunningTarget {
            kind: spec.kind,
            detail,
            connector: Arc::new(connector),
            fresh: matches!(backing, Backing::ThrowawayCube(_)),
            backing,
        })
    }

    pub fn name(&self) -> &'static str {
        self.kind.name()
    }

    /// Only a throwaway cubed can be crashed: the driver owns its process.
    pub fn can_crash(&self) -> bool {
        matches!(self.backing, Backing::ThrowawayCube(_))
    }

    /// SIGKILLs the daemon and starts it again on the same data; returns how
    /// long the restart took until it accepted connections.
    pub fn crash_and_restart(&mut self) -> Result<Duration, StressError> {
        let Backing::ThrowawayCube(daemon) = &mut self.backing else {
            return Err(StressError::Usage(format!(
                "--crash-every needs a throwaway cubed; {} cannot be crashed by the driver",
                self.kind.name()
            )));
        };
        daemon.kill9()?;
        let started = Instant::now();
        daemon.restart()?;
        Ok(started.elapsed())
    }

    /// The socket of a cube target (throwaway or running), `None` for the
    /// others.
    pub fn socket(&self) -> Option<PathBuf> {
        match &self.backing {
            Backing::ThrowawayCube(daemon) => Some(daemon.socket().to_owned()),
            Backing::RunningCube(socket) => Some(socket.clone()),
            _ => None,
        }
    }

    /// The throwaway daemon's log, for error reports.
    pub fn log_text(&self) -> Option<String> {
        match &self.backing {
            Backing::ThrowawayCube(daemon) => Some(daemon.log_text()),
            Backing::Redis(server) => Some(server.log_text()),
            Backing::Ceiling(server) => Some(server.log_text()),
            _ => None,
        }
    }
}
