//! `cube-stress compare`: the same workloads against cube and its peers in
//! one go, one table with the ratios cube / peer, and the goals of issue 3
//! checked against the figures.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::error::StressError;
use crate::json::{self, Json};
use crate::report::RunReport;
use crate::run::{RunConfig, run};
use crate::target::redis::{INSTALL_HINT, find_redis_server};
use crate::target::{TargetKind, TargetSpec};
use crate::verify::VerifyMode;
use crate::workload::{Workload, WorkloadKind};

#[derive(Args, Debug, Clone)]
pub struct CompareArgs {
    /// Measured time per cell (one workload, client count and target):
    /// seconds (5) or a duration with units (5s, 1m).
    #[arg(long, value_name = "DURATION", default_value_t = 5.0,
          value_parser = cube_client::parse_seconds)]
    pub duration: f64,

    /// Unmeasured load before each cell's measurement (seconds, or 1s, 500ms).
    #[arg(long, value_name = "DURATION", default_value_t = 1.0,
          value_parser = cube_client::parse_seconds)]
    pub warmup: f64,

    /// Client counts, comma-separated.
    #[arg(long, value_name = "N,..", value_delimiter = ',', default_values = ["1", "16", "64"])]
    pub clients: Vec<usize>,

    /// Targets, comma-separated; Redis targets are skipped when redis-server
    /// is not installed. ceiling-echo and ceiling-sync (cube's design bare,
    /// what it allows at best) run only when named.
    #[arg(long, value_name = "TARGET,..", value_enum, value_delimiter = ',',
          default_values = ["cube", "redis-always", "redis-everysec", "redis-none", "sqlite"])]
    pub targets: Vec<TargetKind>,

    /// Workloads, comma-separated.
    #[arg(long, value_name = "WORKLOAD,..", value_enum, value_delimiter = ',',
          default_values = ["put", "get"])]
    pub workloads: Vec<WorkloadKind>,

    /// Bytes per value.
    #[arg(long, value_name = "BYTES", default_value_t = 64)]
    pub value_size: usize,

    /// Size of the key space.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    pub keys: u64,

    #[arg(long, value_name = "N", default_value_t = 1)]
    pub seed: u64,

    /// Run every cell N times (in N rounds over all cells) and keep the run
    /// with the median throughput: steadier figures on a shared machine.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub repeat: usize,

    /// Extra flag for the throwaway cubed (repeatable), e.g. --daemon-arg=--sync=never.
    #[arg(long = "daemon-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub daemon_args: Vec<String>,

    /// Write every cell, the ratios and the goal checks as JSON here.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// The command whose throughput and latency stand for `workload` in the
/// comparison.
fn headline_command(workload: WorkloadKind) -> &'static str {
    match workload {
        WorkloadKind::Get => "get",
        WorkloadKind::Mget => "mget",
        _ => "put",
    }
}

const _: () = assert!(crate::workload::DEFAULT_MGET_BATCH == 64);

/// One workload × client count × target.
pub struct Cell {
    pub workload: WorkloadKind,
    pub clients: usize,
    pub target: TargetKind,
    /// The median run (or the first failed one).
    pub outcome: Result<RunReport, String>,
    /// Throughput of every repeat, in the order they ran.
    pub ops_per_sec_runs: Vec<f64>,
}

impl Cell {
    fn command(&self) -> &'static str {
        headline_command(self.workload)
    }

    pub fn ops_per_sec(&self) -> Option<f64> {
        let report = self.outcome.as_ref().ok()?;
        Some(report.summary(self.command())?.ops_per_sec)
    }

    pub fn p50_us(&self) -> Option<u64> {
        let report = self.outcome.as_ref().ok()?;
        Some(report.summary(self.command())?.p50_us)
    }

    pub fn p99_us(&self) -> Option<u64> {
        let report = self.outcome.as_ref().ok()?;
        Some(report.summary(self.command())?.p99_us)
    }

    pub fn passed(&self) -> bool {
        self.outcome.as_ref().is_ok_and(RunReport::passed)
    }
}

/// The whole comparison.
pub struct Comparison {
    pub args: CompareArgs,
    pub skipped: Vec<String>,
    pub cells: Vec<Cell>,
}

impl Comparison {
    fn cell(&self, workload: WorkloadKind, clients: usize, target: TargetKind) -> Option<&Cell> {
        self.cells
            .iter()
            .find(|c| c.workload == workload && c.clients == clients && c.target == target)
    }

    fn targets(&self) -> Vec<TargetKind> {
        TargetKind::ALL
            .into_iter()
            .filter(|t| self.cells.iter().any(|c| c.target == *t))
            .collect()
    }

    pub fn passed(&self) -> bool {
        self.cells.iter().all(Cell::passed)
    }

    /// Throughput with ratios, then latency, per workload.
    pub fn to_table(&self) -> String {
        let targets = self.targets();
        let mut out = String::new();
        for &workload in &self.args.workloads {
            self.write_throughput(&mut out, workload, &targets);
            self.write_latency(&mut out, workload, &targets);
        }
        let failures = self.failures();
        if !failures.is_empty() {
            let _ = writeln!(out, "\nFAILED cells:\n{}", failures.join("\n"));
        }
        for skipped in &self.skipped {
            let _ = writeln!(out, "\nskipped: {skipped}");
        }
        let goals = self.goals();
        if !goals.is_empty() {
            let _ = writeln!(out, "\ngoals of issue 3 (64-byte values):");
            for goal in goals {
                let _ = writeln!(out, "  {}", goal.line());
            }
        }
        out
    }

    /// `workload`'s throughput table: ops/s per client count and target,
    /// with cube's ratio to each peer.
    fn write_throughput(&self, out: &mut String, workload: WorkloadKind, targets: &[TargetKind]) {
        let _ = writeln!(
            out,
            "\n{}, {}-byte values: ops/s (cube / peer){}",
            workload_title(workload),
            self.args.value_size,
            if self.args.repeat > 1 {
                format!(", the median of {} runs", self.args.repeat)
            } else {
                String::new()
            }
        );
        write_target_names(out, targets);
        for &clients in &self.args.clients {
            let _ = write!(out, "{clients:>8}");
            let cube = self
                .cell(workload, clients, TargetKind::Cube)
                .and_then(Cell::ops_per_sec);
            for &t in targets {
                let cell = self.cell(workload, clients, t);
                let text = match (cell.and_then(Cell::ops_per_sec), cube) {
                    (None, _) => cell.map_or("-", |_| "failed").to_owned(),
                    (Some(ops), Some(cube)) if t != TargetKind::Cube && ops > 0.0 => {
                        format!("{ops:.0} ({:.2}x)", cube / ops)
                    }
                    (Some(ops), _) => format!("{ops:.0}"),
                };
                let _ = write!(out, " {text:>18}");
            }
            out.push('\n');
        }
    }

    /// `workload`'s latency table: p50 / p99 per client count and target.
    fn write_latency(&self, out: &mut String, workload: WorkloadKind, targets: &[TargetKind]) {
        let _ = writeln!(out, "{}: latency p50 / p99 (µs)", workload_title(workload));
        write_target_names(out, targets);
        for &clients in &self.args.clients {
            let _ = write!(out, "{clients:>8}");
            for &t in targets {
                let cell = self.cell(workload, clients, t);
                let text = match cell.and_then(|c| Some((c.p50_us()?, c.p99_us()?))) {
                    Some((p50, p99)) => format!("{p50} / {p99}"),
                    None => "-".to_owned(),
                };
                let _ = write!(out, " {text:>18}");
            }
            out.push('\n');
        }
    }

    /// One line per cell that failed, saying why.
    fn failures(&self) -> Vec<String> {
        self.cells
            .iter()
            .filter(|c| !c.passed())
            .map(|c| {
                let why = match &c.outcome {
                    Err(e) => e.clone(),
                    Ok(r) => format!(
                        "{} errors, {} read-back mismatches, {} read mismatches{}",
                        r.errors,
                        r.verification.mismatches,
                        r.live_mismatches.mismatches,
                        r.error_samples
                            .first()
                            .map(|e| format!("; first error: {e}"))
                            .unwrap_or_default()
                    ),
                };
                format!(
                    "  {} {} clients {}: {why}",
                    c.workload.name(),
                    c.clients,
                    c.target.name()
                )
            })
            .collect()
    }

    /// The issue's goals, where the figures to judge them exist.
    pub fn goals(&self) -> Vec<Goal> {
        if self.args.value_size != 64 {
            return Vec::new();
        }
        let mut goals = self.put_goals();
        goals.extend(self.get_goals());
        goals.push(Goal::at_least(
            "put, 16 clients: cube / sqlite",
            self.ratio(WorkloadKind::Put, 16, TargetKind::Sqlite),
            15.0,
        ));
        goals
    }

    fn ops(&self, workload: WorkloadKind, clients: usize, target: TargetKind) -> Option<f64> {
        self.cell(workload, clients, target)
            .and_then(Cell::ops_per_sec)
    }

    fn p50(&self, workload: WorkloadKind, clients: usize, target: TargetKind) -> Option<u64> {
        self.cell(workload, clients, target).and_then(Cell::p50_us)
    }

    /// cube's throughput over `peer`'s.
    fn ratio(&self, workload: WorkloadKind, clients: usize, peer: TargetKind) -> Option<f64> {
        Some(self.ops(workload, clients, TargetKind::Cube)? / self.ops(workload, clients, peer)?)
    }

    /// Durable puts against Redis (sqlite's goal comes last).
    fn put_goals(&self) -> Vec<Goal> {
        let put = WorkloadKind::Put;
        vec![
            Goal::at_least(
                "put, 64 clients: cube / redis-always",
                self.ratio(put, 64, TargetKind::RedisAlways),
                1.5,
            ),
            Goal::at_least(
                "put, 64 clients: cube / redis-none",
                self.ratio(put, 64, TargetKind::RedisNone),
                0.9,
            ),
            Goal::at_least(
                "put, 16 clients: cube / redis-always",
                self.ratio(put, 16, TargetKind::RedisAlways),
                2.0,
            ),
            Goal::at_most_us(
                "put, 1 client: cube p50 vs redis-always p50",
                self.p50(put, 1, TargetKind::Cube),
                self.p50(put, 1, TargetKind::RedisAlways),
            ),
        ]
    }

    /// Reads do not depend on Redis's fsync setting: cube is held to the
    /// best of the three.
    fn get_goals(&self) -> Vec<Goal> {
        let get = WorkloadKind::Get;
        let redis = [
            TargetKind::RedisAlways,
            TargetKind::RedisEverysec,
            TargetKind::RedisNone,
        ];
        let over_best_redis = |clients| {
            let best = redis
                .iter()
                .filter_map(|&t| self.ops(get, clients, t))
                .reduce(f64::max);
            self.ops(get, clients, TargetKind::Cube)
                .zip(best)
                .map(|(c, r)| c / r)
        };
        let best_redis_p50 = redis.iter().filter_map(|&t| self.p50(get, 1, t)).min();
        vec![
            Goal::at_least(
                "get, 16 clients: cube / best redis",
                over_best_redis(16),
                1.2,
            ),
            Goal::at_least(
                "get, 64 clients: cube / best redis",
                over_best_redis(64),
                1.2,
            ),
            Goal::at_most_us(
                "get, 1 client: cube p50 vs best redis p50",
                self.p50(get, 1, TargetKind::Cube),
                best_redis_p50,
            ),
        ]
    }

    pub fn to_json(&self) -> Json {
        let cells = self
            .cells
            .iter()
            .map(|c| {
                let cube = self
                    .cell(c.workload, c.clients, TargetKind::Cube)
                    .and_then(Cell::ops_per_sec);
                let ratio = match (cube, c.ops_per_sec()) {
                    (Some(cube), Some(ops)) if ops > 0.0 => Json::from(cube / ops),
                    _ => Json::Null,
                };
                json::object([
                    ("workload", Json::from(c.workload.name())),
                    ("clients", Json::from(c.clients as u64)),
                    ("target", Json::from(c.target.name())),
                    (
                        "ops_per_sec",
                        c.ops_per_sec().map_or(Json::Null, Json::from),
                    ),
                    ("p50_us", c.p50_us().map_or(Json::Null, Json::from)),
                    ("p99_us", c.p99_us().map_or(Json::Null, Json::from)),
                    ("cube_over_this", ratio),
                    (
                        "ops_per_sec_runs",
                        Json::Array(c.ops_per_sec_runs.iter().map(|x| Json::from(*x)).collect()),
                    ),
                    ("passed", Json::Bool(c.passed())),
                    (
                        "error",
                        c.outcome
                            .as_ref()
                            .err()
                            .map_or(Json::Null, |e| Json::from(e.as_str())),
                    ),
                    (
                        "run",
                        c.outcome.as_ref().map_or(Json::Null, RunReport::to_json),
                    ),
                ])
            })
            .collect();
        json::object([
            ("duration_s", Json::from(self.args.duration)),
            ("warmup_s", Json::from(self.args.warmup)),
            ("value_size_bytes", Json::from(self.args.value_size as u64)),
            ("keys", Json::from(self.args.keys)),
            ("seed", Json::from(self.args.seed)),
            ("repeat", Json::from(self.args.repeat as u64)),
            (
                "skipped",
                Json::Array(
                    self.skipped
                        .iter()
                        .map(|s| Json::from(s.as_str()))
                        .collect(),
                ),
            ),
            ("cells", Json::Array(cells)),
            (
                "goals",
                Json::Array(self.goals().iter().map(Goal::to_json).collect()),
            ),
            ("passed", Json::Bool(self.passed())),
        ])
    }
}

/// What a workload's tables are titled.
fn workload_title(workload: WorkloadKind) -> &'static str {
    match workload {
        WorkloadKind::Put => "put: durable writes",
        WorkloadKind::Get => "get: reads of written keys",
        WorkloadKind::Mixed => "mixed",
        // compare has no --batch: the default batch.
        WorkloadKind::Mget => "mget: requests reading 64 written keys each",
        WorkloadKind::Walk => "walk: walks and paths with links",
        WorkloadKind::Programs => "seed: prog, run and step of cell programs",
        WorkloadKind::Watch => "watch: puts followed by watchers",
    }
}

/// A table's header row: `clients`, then each target's name.
fn write_target_names(out: &mut String, targets: &[TargetKind]) {
    let _ = write!(out, "{:>8}", "clients");
    for t in targets {
        let _ = write!(out, " {:>18}", t.name());
    }
    out.push('\n');
}

/// One goal of the issue and whether the figures meet it.
pub struct Goal {
    pub name: &'static str,
    /// The measured figure (a ratio, or cube's p50 in µs).
    pub measured: Option<f64>,
    /// The bound (a minimum ratio, or the peer's p50 as a maximum).
    pub bound: Option<f64>,
    /// Whether a larger measured figure is better.
    pub higher_is_better: bool,
}

impl Goal {
    fn at_least(name: &'static str, measured: Option<f64>, bound: f64) -> Goal {
        Goal {
            name,
            measured,
            bound: Some(bound),
            higher_is_better: true,
        }
    }

    fn at_most_us(name: &'static str, cube_us: Option<u64>, peer_us: Option<u64>) -> Goal {
        Goal {
            name,
            measured: cube_us.map(|v| v as f64),
            bound: peer_us.map(|v| v as f64),
            higher_is_better: false,
        }
    }

    /// `None` when a figure is missing (a skipped or failed cell).
    pub fn hit(&self) -> Option<bool> {
        let (measured, bound) = (self.measured?, self.bound?);
        Some(if self.higher_is_better {
            measured >= bound
        } else {
            measured <= bound
        })
    }

    fn line(&self) -> String {
        let verdict = match self.hit() {
            Some(true) => "HIT ",
            Some(false) => "MISS",
            None => "n/a ",
        };
        let figures = match (self.measured, self.bound, self.higher_is_better) {
            (Some(m), Some(b), true) => format!("{m:.2}x (goal >= {b}x)"),
            (Some(m), Some(b), false) => format!("{m:.0} µs (goal <= {b:.0} µs)"),
            _ => "not measured".to_owned(),
        };
        format!("{verdict}  {:<44} {figures}", self.name)
    }

    fn to_json(&self) -> Json {
        json::object([
            ("name", Json::from(self.name)),
            ("measured", self.measured.map_or(Json::Null, Json::from)),
            ("bound", self.bound.map_or(Json::Null, Json::from)),
            (
                "kind",
                Json::from(if self.higher_is_better {
                    "ratio_at_least"
                } else {
                    "p50_us_at_most"
                }),
            ),
            ("hit", self.hit().map_or(Json::Null, Json::Bool)),
        ])
    }
}

/// The failed run if any (a failure must show), else the one with the
/// median throughput.
fn median_run(
    mut results: Vec<Result<RunReport, String>>,
    throughput: impl Fn(&RunReport) -> f64,
) -> Result<RunReport, String> {
    if let Some(at) = results
        .iter()
        .position(|r| r.as_ref().map_or(true, |r| !r.passed()))
    {
        return results.swap_remove(at);
    }
    let mut reports: Vec<RunReport> = results.into_iter().filter_map(Result::ok).collect();
    reports.sort_by(|a, b| throughput(a).total_cmp(&throughput(b)));
    let middle = reports.len() / 2;
    reports
        .into_iter()
        .nth(middle)
        .ok_or_else(|| "no run".to_owned())
}

/// Runs every cell; cells interleave the targets (and repeats go in rounds
/// over all cells) so a noisy moment of the machine hits them alike.
pub fn compare(args: &CompareArgs) -> Result<Comparison, StressError> {
    let duration = seconds("duration", args.duration)?;
    let warmup = seconds("warmup", args.warmup)?;
    let mut skipped = Vec::new();
    let targets = available_targets(&args.targets, &mut skipped);
    if args.repeat == 0 {
        return Err(StressError::Usage("--repeat must be at least 1".to_owned()));
    }
    let mut plan = Vec::new();
    for &workload in &args.workloads {
        for &clients in &args.clients {
            for &target in &targets {
                plan.push((workload, clients, target));
            }
        }
    }
    let total = plan.len() * args.repeat;
    let mut runs: Vec<Vec<Result<RunReport, String>>> = plan.iter().map(|_| Vec::new()).collect();
    let mut done = 0;
    for round in 1..=args.repeat {
        for (&(workload, clients, target), results) in plan.iter().zip(runs.iter_mut()) {
            done += 1;
            eprintln!(
                "cube-stress compare [{done}/{total}]: {} with {clients} clients against {}{}",
                workload.name(),
                target.name(),
                if args.repeat > 1 {
                    format!(" (round {round} of {})", args.repeat)
                } else {
                    String::new()
                }
            );
            let config = cell_config(args, (workload, clients, target), duration, warmup)?;
            let outcome = run(&config).map_err(|e| e.to_string());
            if let Err(e) = &outcome {
                eprintln!("cube-stress compare: that cell failed: {e}");
            }
            results.push(outcome);
        }
    }
    let cells = plan
        .into_iter()
        .zip(runs)
        .map(|(planned, results)| median_cell(planned, results))
        .collect();
    Ok(Comparison {
        args: args.clone(),
        skipped,
        cells,
    })
}

/// `value` seconds of the flag `--flag`, refused when not a number of
/// seconds.
fn seconds(flag: &str, value: f64) -> Result<Duration, StressError> {
    if value.is_finite() && value >= 0.0 {
        Ok(Duration::from_secs_f64(value))
    } else {
        Err(StressError::Usage(format!(
            "--{flag} {value} is not a number of seconds"
        )))
    }
}

/// The `targets` this machine can run: the Redis ones are left out (and
/// said so in `skipped`) when redis-server is not installed.
fn available_targets(targets: &[TargetKind], skipped: &mut Vec<String>) -> Vec<TargetKind> {
    let mut targets = targets.to_vec();
    if targets.iter().any(|t| t.is_redis()) && find_redis_server().is_none() {
        eprintln!("cube-stress: {INSTALL_HINT}; skipping the Redis targets");
        let names: Vec<&str> = targets
            .iter()
            .filter(|t| t.is_redis())
            .map(|t| t.name())
            .collect();
        skipped.push(format!("{}: {INSTALL_HINT}", names.join(", ")));
        targets.retain(|t| !t.is_redis());
    }
    targets
}

/// The run of one cell: its workload, client count and target, the
/// comparison's other settings.
fn cell_config(
    args: &CompareArgs,
    (workload, clients, target): (WorkloadKind, usize, TargetKind),
    duration: Duration,
    warmup: Duration,
) -> Result<RunConfig, StressError> {
    let mut spec = TargetSpec::new(target);
    if target == TargetKind::Cube {
        spec.daemon_args = args.daemon_args.clone();
    }
    let workload =
        Workload::new(workload, crate::workload::DEFAULT_READ_RATIO).map_err(StressError::Usage)?;
    Ok(RunConfig {
        clients,
        duration,
        warmup,
        value_size: args.value_size,
        seed: args.seed,
        verify: VerifyMode::Sample,
        ..RunConfig::new(spec, workload, args.keys.max(clients as u64))
    })
}

/// A cell from every repeat of its run: the median run (or the first
/// failed one), and every run's throughput.
fn median_cell(
    (workload, clients, target): (WorkloadKind, usize, TargetKind),
    results: Vec<Result<RunReport, String>>,
) -> Cell {
    let command = headline_command(workload);
    let throughput = |r: &RunReport| r.summary(command).map_or(0.0, |s| s.ops_per_sec);
    let ops_per_sec_runs = results
        .iter()
        .filter_map(|r| r.as_ref().ok().map(throughput))
        .collect();
    Cell {
        workload,
        clients,
        target,
        outcome: median_run(results, throughput),
        ops_per_sec_runs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn goals_compare_in_the_right_direction() {
        assert_eq!(Goal::at_least("r", Some(1.6), 1.5).hit(), Some(true));
        assert_eq!(Goal::at_least("r", Some(1.4), 1.5).hit(), Some(false));
        assert_eq!(Goal::at_least("r", None, 1.5).hit(), None);
        assert_eq!(
            Goal::at_most_us("p", Some(200), Some(250)).hit(),
            Some(true)
        );
        assert_eq!(
            Goal::at_most_us("p", Some(300), Some(250)).hit(),
            Some(false)
        );
        assert_eq!(Goal::at_most_us("p", Some(300), None).hit(), None);
        assert!(
            Goal::at_least("r", Some(1.6), 1.5)
                .line()
                .starts_with("HIT")
        );
        assert!(
            Goal::at_least("r", None, 1.5)
                .line()
                .contains("not measured")
        );
    }

    #[test]
    fn ceiling_targets_get_a_ratio_column_and_leave_the_goals_alone() {
        // sample_report: 100 puts; over 2 s that is 50 ops/s.
        let cell = |target, seconds: f64| {
            let mut report = crate::report::tests::sample_report();
            report.duration_s = seconds;
            Cell {
                workload: WorkloadKind::Put,
                clients: 16,
                target,
                outcome: Ok(report),
                ops_per_sec_runs: Vec::new(),
            }
        };
        let mut args = default_args();
        args.workloads = vec![WorkloadKind::Put];
        args.clients = vec![16];
        let comparison = Comparison {
            args,
            skipped: Vec::new(),
            cells: vec![
                cell(TargetKind::Cube, 2.0),
                cell(TargetKind::CeilingSync, 4.0),
                cell(TargetKind::CeilingEcho, 1.0),
            ],
        };
        let table = comparison.to_table();
        assert!(table.contains("ceiling-sync"), "{table}");
        assert!(table.contains("25 (2.00x)"), "{table}");
        assert!(table.contains("100 (0.50x)"), "{table}");
        // The goals name Redis and SQLite only: with neither measured,
        // none is judged, whatever the ceilings did.
        assert!(comparison.goals().iter().all(|g| g.hit().is_none()));
        let json = comparison.to_json();
        let Some(Json::Array(cells)) = json.get("cells") else {
            panic!("no cells");
        };
        assert_eq!(cells[1].get("cube_over_this"), Some(&Json::from(2.0)));
    }

    /// `CompareArgs` on its own, as the `compare` subcommand parses it.
    #[derive(clap::Parser)]
    struct CompareOnly {
        #[command(flatten)]
        args: CompareArgs,
    }

    fn default_args() -> CompareArgs {
        use clap::Parser as _;
        CompareOnly::parse_from(["compare"]).args
    }

    #[test]
    fn the_median_run_is_kept_unless_one_failed() {
        let throughput = |r: &RunReport| r.duration_s;
        let report = |seconds: f64| {
            let mut r = crate::report::tests::sample_report();
            r.duration_s = seconds;
            r
        };
        let kept = median_run(
            vec![Ok(report(3.0)), Ok(report(1.0)), Ok(report(2.0))],
            throughput,
        );
        assert_eq!(kept.unwrap().duration_s, 2.0);
        let failed = median_run(
            vec![Ok(report(3.0)), Err("boom".to_owned()), Ok(report(2.0))],
            throughput,
        );
        assert_eq!(failed.unwrap_err(), "boom");
    }
}
