//! The `cube-stress` command line: a run (flags at the top level, so
//! `cube-stress --clients 16 --duration 10` just works) or `compare`.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use cube_client::parse_seconds;

use crate::compare::{CompareArgs, compare};
use crate::crash::{CrashArgs, torture};
use crate::error::StressError;
use crate::hostile::HostileComparison;
use crate::json;
use crate::plot::{Series, latency_by_percentile};
use crate::report::RunReport;
use crate::run::{RunConfig, run};
use crate::scale::{ScaleArgs, scale};
use crate::target::ceiling_server::{self, CeilingServerArgs};
use crate::target::{TargetKind, TargetSpec};
use crate::verify::VerifyMode;
use crate::workload::{DEFAULT_MGET_BATCH, DEFAULT_READ_RATIO, Workload, WorkloadKind};

/// Exit status of a run whose requests failed or whose read-back found
/// lost or wrong values.
pub const EXIT_CHECKS_FAILED: u8 = 1;
/// Exit status when the run could not start or finish (bad flags, a target
/// that would not start).
pub const EXIT_CANNOT_RUN: u8 = 2;

const AFTER_HELP: &str = "\
Examples:
  cube-stress                                     # seed workload (prog + run, step), 16 clients, 10 s, throwaway cubed
  cube-stress --workload mixed                    # puts and gets
  cube-stress --workload mget --batch 256         # 256 random keys per mget request
  cube-stress --workload put --clients 64 --json put.json --plot put.svg
  cube-stress --crash-every 2s --duration 20s     # SIGKILL cubed every 2 s, verify after each restart
  cube-stress --workload mixed --hostile 48       # the same run alone, then beside 48 hostile clients
  cube-stress --target redis-always --workload put
  cube-stress --target ceiling-sync --workload put # cube's design bare: the durable-put ceiling
  cube-stress --workload put --namespace enc --encrypted --daemon-arg=--key-file=master.key
  cube-stress --socket ./cube-data/cubed.sock     # a running daemon (keys 0..--keys get overwritten)
  cube-stress compare --json compare.json         # cube vs Redis and SQLite, put and get at 1/16/64 clients
  cube-stress crash --cycles 100 --seed 7         # crash torture: kill -9 mid-load and mid-checkpoint, check everything
  cube-stress scale --cells 10000000              # a large data set, built once in target/scale, then measured

Exit status: 0 when every request succeeded and every read-back matched,
1 when a request failed or a value was lost or wrong (details printed),
2 when the run could not start. docs/benchmarks.md explains the figures.";

/// cube-stress: load a storage daemon, measure latency, check every write.
///
/// Without a subcommand, runs one workload against one target and prints
/// per-command latency percentiles, the server's own figures and the
/// outcome of reading back every acknowledged write.
#[derive(Parser, Debug)]
#[command(
    name = "cube-stress",
    version,
    args_conflicts_with_subcommands = true,
    after_help = AFTER_HELP
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<CliCommand>,

    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Subcommand, Debug)]
pub enum CliCommand {
    /// put and get at 1, 16 and 64 clients against cube, Redis (appendfsync
    /// always, everysec, no persistence) and SQLite; one table with the
    /// ratios cube / peer.
    Compare(CompareArgs),
    /// Crash torture: SIGKILL cubed at random moments (also inside
    /// checkpoints and compactions) under a mixed load, restart it, and
    /// check every acknowledged operation, for --cycles cycles.
    Crash(CrashArgs),
    /// cube on a large data set (issue 32's targets): builds it once under
    /// --dir and reuses it; import rate, restart time, hot and cold gets
    /// beside the pread floor, a 64 k-cell box, RSS beside Redis's.
    Scale(ScaleArgs),
    /// The server of the ceiling targets, started by the driver itself
    /// (target/ceiling.rs); not for people.
    #[command(hide = true)]
    CeilingServer(CeilingServerArgs),
}

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// What to run against. Redis targets need redis-server installed.
    #[arg(long, value_enum, default_value = "cube")]
    pub target: TargetKind,

    /// A running cubed's socket instead of a throwaway daemon. Keys in
    /// 0..--keys are overwritten.
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,

    /// Extra flag for the throwaway cubed (repeatable), e.g. --daemon-arg=--sync=never.
    #[arg(long = "daemon-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub daemon_args: Vec<String>,

    /// cube namespace to run in (created first if missing) instead of `default`.
    #[arg(long, value_name = "NS")]
    pub namespace: Option<String>,

    /// Create --namespace encrypted (AES-256-GCM at rest); the daemon needs
    /// a key, e.g. --daemon-arg=--key-file=PATH.
    #[arg(long, requires = "namespace")]
    pub encrypted: bool,

    /// Client threads, each with its own connection.
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub clients: usize,

    /// How long to measure: seconds (10) or a duration with units (10s, 2m).
    #[arg(long, value_name = "DURATION", default_value_t = 10.0, value_parser = parse_seconds)]
    pub duration: f64,

    /// Load before measuring starts: seconds (1) or with units (1s, 500ms).
    #[arg(long, value_name = "DURATION", default_value_t = 1.0, value_parser = parse_seconds)]
    pub warmup: f64,

    /// What the clients ask for. The default, seed, runs cell programs (the
    /// predecessor's workload); mixed is puts and gets.
    #[arg(long, value_enum, default_value = "seed")]
    pub workload: WorkloadKind,

    /// Share of reads in the mixed workload.
    #[arg(long, value_name = "0..1", default_value_t = DEFAULT_READ_RATIO)]
    pub read_ratio: f64,

    /// Keys per request of the mget workload (1..=4096).
    #[arg(long, value_name = "N", default_value_t = u64::from(DEFAULT_MGET_BATCH))]
    pub batch: u64,

    /// seed only: send each prog together with a run of the same cell,
    /// pipelined (one round trip for the pair, one shared group commit).
    #[arg(long)]
    pub pipeline: bool,

    /// Bytes per value (at least 16: each value carries its key and version).
    #[arg(long, value_name = "BYTES", default_value_t = 64)]
    pub value_size: usize,

    /// Size of the key space; each client writes its own share of it.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    pub keys: u64,

    /// Seed of the request stream, for repeatable runs.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub seed: u64,

    /// Open loop: send this many requests per second in total, timing each
    /// from when it was due (no coordinated omission). Default: closed loop.
    #[arg(long, value_name = "OPS_PER_SEC")]
    pub rate: Option<f64>,

    /// What to read back at the end.
    #[arg(long, value_enum, default_value = "sample")]
    pub verify: VerifyMode,

    /// SIGKILL the throwaway cubed every INTERVAL of measuring (seconds, or
    /// with units: 2s, 500ms), restart it, read back every key, and go on.
    #[arg(long, value_name = "INTERVAL", value_parser = parse_seconds)]
    pub crash_every: Option<f64>,

    /// Run twice on fresh daemons: alone, then beside N hostile threads
    /// (slowloris half-frames, clients that never read, a connection
    /// flood), and compare the clients' latency (cube only).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub hostile: usize,

    /// Write the report as JSON here (shape in docs/benchmarks.md).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Write a latency-by-percentile chart (SVG) here.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,

    /// No progress lines on stderr.
    #[arg(long)]
    pub quiet: bool,

    #[command(flatten)]
    pub watch: crate::watch_workload::WatchArgs,
}

impl RunArgs {
    pub fn config(&self) -> Result<RunConfig, StressError> {
        let seconds = |flag: &str, value: f64| {
            if value.is_finite() && value >= 0.0 {
                Ok(Duration::from_secs_f64(value))
            } else {
                Err(StressError::Usage(format!(
                    "--{flag} {value} is not a number of seconds"
                )))
            }
        };
        Ok(RunConfig {
            target: TargetSpec {
                kind: self.target,
                socket: self.socket.clone(),
                daemon_args: self.daemon_args.clone(),
                namespace: self.namespace.clone(),
                encrypted: self.encrypted,
                ceiling_binary: None,
            },
            workload: Workload::new(self.workload, self.read_ratio)
                .and_then(|workload| workload.with_batch(self.batch))
                .and_then(|workload| workload.with_pipeline(self.pipeline))
                .map_err(StressError::Usage)?,
            clients: self.clients,
            duration: seconds("duration", self.duration)?,
            warmup: seconds("warmup", self.warmup)?,
            value_size: self.value_size,
            keys: self.keys,
            seed: self.seed,
            rate: self.rate,
            verify: self.verify,
            crash_every: self
                .crash_every
                .map(|s| seconds("crash-every", s))
                .transpose()?,
            hostile: self.hostile,
            progress: !self.quiet,
            preloaded: false,
        })
    }
}

/// Parses `args` (program name first) and runs; what `main` calls.
pub fn main_with_args(args: impl IntoIterator<Item = impl Into<OsString> + Clone>) -> ExitCode {
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let outcome = match &cli.command {
        None => run_command(&cli.run),
        Some(CliCommand::Compare(args)) => compare_command(args),
        Some(CliCommand::Crash(args)) => crash_command(args),
        Some(CliCommand::Scale(args)) => scale_command(args),
        Some(CliCommand::CeilingServer(args)) => ceiling_server::serve(args).map(|()| true),
    };
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(EXIT_CHECKS_FAILED),
        Err(e) => {
            eprintln!("cube-stress: {e}");
            ExitCode::from(EXIT_CANNOT_RUN)
        }
    }
}

/// One run; `Ok(passed)`.
fn run_command(args: &RunArgs) -> Result<bool, StressError> {
    let config = args.config()?;
    if config.workload.kind == WorkloadKind::Watch {
        return watch_command(args, &config);
    }
    if config.hostile > 0 {
        return hostile_command(args, config);
    }
    let report = run(&config)?;
    println!("{}", report.to_table());
    write_json(args.json.as_deref(), &report.to_json())?;
    if let Some(path) = &args.plot {
        write_file(path, &plot(&report))?;
        eprintln!("cube-stress: wrote {}", path.display());
    }
    Ok(report.passed())
}

/// `cube-stress scale`: the table on stdout, JSON if asked.
fn scale_command(args: &ScaleArgs) -> Result<bool, StressError> {
    let report = scale(args)?;
    println!("{}", report.to_table());
    write_json(args.json.as_deref(), &report.to_json())?;
    Ok(report.passed())
}

/// `--workload watch` (`watch_workload`): a throwaway cubed per run.
fn watch_command(args: &RunArgs, config: &RunConfig) -> Result<bool, StressError> {
    if config.target.kind != TargetKind::Cube || config.target.socket.is_some() {
        return Err(StressError::Usage(
            "--workload watch needs a throwaway cubed (--target cube without --socket)".into(),
        ));
    }
    let setup = crate::watch_workload::WatchSetup {
        clients: config.clients,
        duration: config.duration,
        value_size: config.value_size,
        daemon_args: &config.target.daemon_args,
        progress: config.progress,
    };
    let report = crate::watch_workload::run(&setup, &args.watch)?;
    println!("{}", report.to_table());
    Ok(report.passed())
}

/// `--hostile N`: the run alone, then beside the hostile threads, each on
/// a fresh daemon (or the same running one); the two tables and the
/// ratios. The plot shows the run beside the hostile threads.
fn hostile_command(args: &RunArgs, config: RunConfig) -> Result<bool, StressError> {
    config.validate()?;
    let alone = RunConfig {
        hostile: 0,
        ..config.clone()
    };
    if config.progress {
        eprintln!(
            "cube-stress: first alone, then beside {} hostile threads",
            config.hostile
        );
    }
    let comparison = HostileComparison {
        baseline: run(&alone)?,
        hostile: run(&config)?,
    };
    println!("{}", comparison.to_table());
    write_json(args.json.as_deref(), &comparison.to_json())?;
    if let Some(path) = &args.plot {
        write_file(path, &plot(&comparison.hostile))?;
        eprintln!("cube-stress: wrote {}", path.display());
    }
    Ok(comparison.passed())
}

/// The SVG chart of a run.
pub fn plot(report: &RunReport) -> String {
    let used = report.latencies.used();
    let series: Vec<Series<'_>> = used
        .iter()
        .map(|(command, histogram)| Series {
            name: command.name(),
            histogram,
        })
        .collect();
    let subtitle = format!(
        "{:.1} s measured, {} keys, {} loop; {}",
        report.duration_s,
        report.keys,
        if report.rate_ops_per_sec.is_some() {
            "open"
        } else {
            "closed"
        },
        report.target_detail
    );
    latency_by_percentile(
        &format!("Latency by percentile — {}", report.headline()),
        &subtitle,
        &series,
    )
}

fn compare_command(args: &CompareArgs) -> Result<bool, StressError> {
    let comparison = compare(args)?;
    println!("{}", comparison.to_table());
    write_json(args.json.as_deref(), &comparison.to_json())?;
    Ok(comparison.passed())
}

fn crash_command(args: &CrashArgs) -> Result<bool, StressError> {
    let report = torture(args)?;
    println!("{}", report.to_text());
    Ok(report.passed())
}

/// Writes `report` as JSON to `path`, when `--json` asked for it.
fn write_json(path: Option<&Path>, report: &json::Json) -> Result<(), StressError> {
    if let Some(path) = path {
        write_file(path, &json::pretty(report))?;
        eprintln!("cube-stress: wrote {}", path.display());
    }
    Ok(())
}

fn write_file(path: &Path, text: &str) -> Result<(), StressError> {
    fs::write(path, text)
        .map_err(|e| StressError::io(format!("cannot write {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_flags_live_at_the_top_level() {
        let cli = Cli::try_parse_from([
            "cube-stress",
            "--duration",
            "3",
            "--clients",
            "4",
            "--json",
            "x.json",
            "--daemon-arg",
            "--sync=never",
            "--workload",
            "put",
        ])
        .unwrap();
        assert!(cli.command.is_none());
        let config = cli.run.config().unwrap();
        assert_eq!(config.clients, 4);
        assert_eq!(config.duration, Duration::from_secs(3));
        assert_eq!(config.target.daemon_args, ["--sync=never"]);
        assert_eq!(config.workload.kind, WorkloadKind::Put);
        assert_eq!(
            (config.target.namespace, config.target.encrypted),
            (None, false)
        );
    }

    /// Durations as people type them (issue 29): `6s` used to be refused
    /// as an invalid float; plain seconds still work.
    #[test]
    fn durations_take_units_and_plain_seconds() {
        let cli = Cli::try_parse_from([
            "cube-stress",
            "--duration",
            "6s",
            "--warmup",
            "500ms",
            "--crash-every",
            "2s",
        ])
        .unwrap();
        let config = cli.run.config().unwrap();
        assert_eq!(config.duration, Duration::from_secs(6));
        assert_eq!(config.warmup, Duration::from_millis(500));
        assert_eq!(config.crash_every, Some(Duration::from_secs(2)));
        let cli = Cli::try_parse_from(["cube-stress", "--duration", "1.5"]).unwrap();
        assert_eq!(cli.run.duration, 1.5);
        let cli = Cli::try_parse_from(["cube-stress", "compare", "--duration", "1m"]).unwrap();
        let Some(CliCommand::Compare(args)) = cli.command else {
            panic!("not compare")
        };
        assert_eq!(args.duration, 60.0);
        let cli = Cli::try_parse_from(["cube-stress", "crash", "--max-run-ms", "2s"]).unwrap();
        let Some(CliCommand::Crash(args)) = cli.command else {
            panic!("not crash")
        };
        assert_eq!(args.max_run_ms, 2000);
        let refused = Cli::try_parse_from(["cube-stress", "--duration", "6 parsecs"]).unwrap_err();
        assert!(refused.to_string().contains("e.g. 6s"), "{refused}");
    }

    #[test]
    fn encrypted_needs_a_namespace() {
        assert!(Cli::try_parse_from(["cube-stress", "--encrypted"]).is_err());
        let cli =
            Cli::try_parse_from(["cube-stress", "--namespace", "enc", "--encrypted"]).unwrap();
        let config = cli.run.config().unwrap();
        assert_eq!(config.target.namespace.as_deref(), Some("enc"));
        assert!(config.target.encrypted);
    }

    #[test]
    fn the_ceiling_server_is_a_hidden_subcommand() {
        let cli = Cli::try_parse_from([
            "cube-stress",
            "ceiling-server",
            "--socket",
            "s.sock",
            "--mode",
            "echo",
        ])
        .unwrap();
        assert!(matches!(cli.command, Some(CliCommand::CeilingServer(_))));
        // sync mode logs, so it needs a directory.
        let sync = [
            "cube-stress",
            "ceiling-server",
            "--socket",
            "s",
            "--mode",
            "sync",
        ];
        assert!(Cli::try_parse_from(sync).is_err());
        let mut help = Vec::new();
        <Cli as clap::CommandFactory>::command()
            .write_long_help(&mut help)
            .unwrap();
        let help = String::from_utf8(help).unwrap();
        assert!(!help.contains("ceiling-server"), "{help}");
        assert!(help.contains("ceiling-sync"), "{help}");
    }

    #[test]
    fn compare_has_its_own_flags() {
        let cli = Cli::try_parse_from([
            "cube-stress",
            "compare",
            "--clients",
            "1,4",
            "--targets",
            "cube,sqlite",
        ])
        .unwrap();
        let Some(CliCommand::Compare(args)) = cli.command else {
            panic!("not compare");
        };
        assert_eq!(args.clients, [1, 4]);
        assert_eq!(args.targets, [TargetKind::Cube, TargetKind::Sqlite]);
        assert_eq!(args.workloads, [WorkloadKind::Put, WorkloadKind::Get]);
        let defaults = Cli::try_parse_from(["cube-stress", "compare"]).unwrap();
        let Some(CliCommand::Compare(args)) = defaults.command else {
            panic!("not compare");
        };
        assert_eq!(args.clients, [1, 16, 64]);
        assert_eq!(args.targets.len(), 5);
        assert!(
            !args
                .targets
                .iter()
                .any(|t| matches!(t, TargetKind::CeilingEcho | TargetKind::CeilingSync))
        );
        let ceilings = Cli::try_parse_from([
            "cube-stress",
            "compare",
            "--targets",
            "cube,ceiling-sync,ceiling-echo",
        ])
        .unwrap();
        let Some(CliCommand::Compare(args)) = ceilings.command else {
            panic!("not compare");
        };
        assert_eq!(
            args.targets,
            [
                TargetKind::Cube,
                TargetKind::CeilingSync,
                TargetKind::CeilingEcho
            ]
        );
    }

    #[test]
    fn bad_values_are_refused_before_anything_starts() {
        let parse = |extra: &[&str]| {
            let mut args = vec!["cube-stress"];
            args.extend_from_slice(extra);
            Cli::try_parse_from(args)
                .unwrap()
                .run
                .config()
                .unwrap()
                .validate()
        };
        assert!(parse(&["--value-size", "8"]).is_err());
        assert!(parse(&["--keys", "3", "--clients", "4"]).is_err());
        assert!(parse(&["--crash-every", "1", "--target", "sqlite"]).is_err());
        assert!(parse(&["--rate", "0"]).is_err());
        assert!(parse(&["--hostile", "3", "--target", "sqlite"]).is_err());
        assert!(parse(&["--hostile", "3", "--crash-every", "1"]).is_err());
        assert!(parse(&["--hostile", "100000"]).is_err());
        assert!(parse(&["--hostile", "3"]).is_ok());
        for batch in ["0", "4097"] {
            let err = Cli::try_parse_from(["cube-stress", "--workload", "mget", "--batch", batch])
                .unwrap()
                .run
                .config()
                .unwrap_err()
                .to_string();
            assert!(err.contains("between 1 and 4096"), "{err}");
        }
        for batch in ["1", "4096"] {
            assert!(parse(&["--workload", "mget", "--batch", batch]).is_ok());
        }
        let err = Cli::try_parse_from(["cube-stress", "--workload", "put", "--pipeline"])
            .unwrap()
            .run
            .config()
            .unwrap_err()
            .to_string();
        assert!(err.contains("needs --workload seed"), "{err}");
        assert!(parse(&["--pipeline"]).is_ok());
        assert_eq!(
            Cli::try_parse_from(["cube-stress", "--workload", "mget"])
                .unwrap()
                .run
                .config()
                .unwrap()
                .workload
                .batch,
            DEFAULT_MGET_BATCH
        );
        assert!(parse(&[]).is_ok());
        // The ceiling servers have puts and gets only, and the driver
        // cannot crash them or aim hostile clients at them.
        for target in ["ceiling-echo", "ceiling-sync"] {
            for workload in ["put", "get", "mixed", "mget"] {
                assert!(parse(&["--target", target, "--workload", workload]).is_ok());
            }
            for workload in ["walk", "seed"] {
                let err = parse(&["--target", target, "--workload", workload])
                    .unwrap_err()
                    .to_string();
                assert!(err.contains("only cube has"), "{workload}: {err}");
            }
            assert!(parse(&["--target", target, "--workload", "put", "--hostile", "3"]).is_err());
            let crash = [
                "--target",
                target,
                "--workload",
                "put",
                "--crash-every",
                "1",
            ];
            assert!(parse(&crash).is_err());
        }
        let alias = Cli::try_parse_from(["cube-stress", "--target", "redis"]).unwrap();
        assert_eq!(alias.run.target, TargetKind::RedisAlways);
    }
}
