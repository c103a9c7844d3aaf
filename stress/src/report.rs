//! A run's results: the terminal table and the JSON document.
//!
//! The JSON shape is stable (scripts rely on it) and documented in
//! `docs/benchmarks.md`; add fields, never rename or remove them.

use std::fmt::Write as _;

use cube_client::{StatsEntry, StatsValue};

use crate::hostile::HostileCounts;
use crate::json::{self, Json};
use crate::latency::{LatencySummary, Recorder};
use crate::verify::VerifyReport;
use crate::workload::{Command, Workload, WorkloadKind};

/// One SIGKILL and what followed.
#[derive(Clone, Debug)]
pub struct CrashReport {
    /// Measured seconds into the run.
    pub at_s: f64,
    /// From the kill until the restarted daemon accepted a connection.
    pub restart_ms: f64,
    /// The daemon's own figure for replaying its log (`recovery.ms`).
    pub server_recovery_ms: Option<u64>,
    pub records_replayed: Option<u64>,
    /// Writes in flight at the kill (either outcome is correct).
    pub uncertain_writes: u64,
    /// Every key, read back after the restart.
    pub verification: VerifyReport,
}

#[derive(Clone, Debug)]
pub struct RunReport {
    pub target: String,
    pub target_detail: String,
    pub workload: Workload,
    pub clients: usize,
    /// The measured window, crash pauses excluded.
    pub duration_s: f64,
    pub warmup_s: f64,
    pub value_size_bytes: usize,
    pub keys: u64,
    pub seed: u64,
    pub rate_ops_per_sec: Option<f64>,
    pub prefill_s: Option<f64>,
    /// Requests that failed (crash-cut requests are not errors).
    pub errors: u64,
    pub error_samples: Vec<String>,
    pub reconnects: u64,
    /// Reads during the run that found what no write put there.
    pub live_mismatches: VerifyReport,
    pub latencies: Recorder,
    pub server: Vec<StatsEntry>,
    pub server_error: Option<String>,
    /// The read-back at the end.
    pub verification: VerifyReport,
    pub crashes: Vec<CrashReport>,
    /// The daemon's log, kept when something went wrong.
    pub daemon_log: Option<String>,
    /// What the hostile threads did (`--hostile`), if there were any.
    pub hostile: Option<HostileCounts>,
}

impl RunReport {
    pub fn passed(&self) -> bool {
        self.errors == 0
            && self.live_mismatches.mismatches == 0
            && self.verification.passed()
            && self.crashes.iter().all(|c| c.verification.passed())
    }

    /// The effective share of reads: 0 for `put`, 1 for `get`.
    pub fn read_ratio(&self) -> f64 {
        match self.workload.kind {
            WorkloadKind::Put | WorkloadKind::Watch => 0.0,
            WorkloadKind::Get | WorkloadKind::Mget => 1.0,
            WorkloadKind::Mixed => self.workload.read_ratio,
            // Walks and paths are the reads; links and unlinks the writes.
            WorkloadKind::Walk => 0.6,
            // cell-stats reads; prog, run and step write.
            WorkloadKind::Programs => 0.06,
        }
    }

    /// Per-command figures, in command order.
    pub fn summaries(&self) -> Vec<(&'static str, LatencySummary)> {
        self.latencies
            .used()
            .into_iter()
            .map(|(command, h)| (command.name(), LatencySummary::of(h, self.duration_s)))
            .collect()
    }

    pub fn summary(&self, command: &str) -> Option<LatencySummary> {
        self.summaries()
            .into_iter()
            .find(|(name, _)| *name == command)
            .map(|(_, s)| s)
    }

    /// One line naming what was measured, for titles.
    pub fn headline(&self) -> String {
        let workload = match self.workload.kind {
            WorkloadKind::Mixed => format!("mixed ({:.0}% reads)", self.read_ratio() * 100.0),
            WorkloadKind::Mget => format!("mget ({} keys per request)", self.workload.batch),
            other => other.name().to_owned(),
        };
        format!(
            "{}: {workload}, {} clients, {}-byte values",
            self.target, self.clients, self.value_size_bytes
        )
    }

    /// The `mget` workload's keys read per second: batch × mget/s.
    pub fn cells_per_sec(&self) -> Option<f64> {
        if self.workload.kind != WorkloadKind::Mget {
            return None;
        }
        let mget = self.summary(Command::Mget.name())?;
        Some(mget.ops_per_sec * f64::from(self.workload.batch))
    }

    pub fn to_json(&self) -> Json {
        json::object([
            ("target", Json::from(self.target.as_str())),
            ("target_detail", Json::from(self.target_detail.as_str())),
            ("workload", Json::from(self.workload.name())),
            ("read_ratio", Json::from(self.read_ratio())),
            (
                "batch",
                if self.workload.kind == WorkloadKind::Mget {
                    Json::from(u64::from(self.workload.batch))
                } else {
                    Json::Null
                },
            ),
            ("clients", Json::from(self.clients as u64)),
            ("duration_s", Json::from(self.duration_s)),
            ("warmup_s", Json::from(self.warmup_s)),
            ("value_size_bytes", Json::from(self.value_size_bytes as u64)),
            ("keys", Json::from(self.keys)),
            ("seed", Json::from(self.seed)),
            (
                "loop",
                Json::from(if self.rate_ops_per_sec.is_some() {
                    "open"
                } else {
                    "closed"
                }),
            ),
            (
                "rate_ops_per_sec",
                self.rate_ops_per_sec.map_or(Json::Null, Json::from),
            ),
            ("prefill_s", self.prefill_s.map_or(Json::Null, Json::from)),
            ("errors", Json::from(self.errors)),
            ("error_samples", strings(&self.error_samples)),
            ("reconnects", Json::from(self.reconnects)),
            ("commands", self.commands_json()),
            ("server", server_json(&self.server)),
            (
                "server_error",
                self.server_error.as_deref().map_or(Json::Null, Json::from),
            ),
            ("verification", self.verification_json()),
            (
                "crashes",
                Json::Array(self.crashes.iter().map(crash_json).collect()),
            ),
            (
                "hostile",
                self.hostile
                    .as_ref()
                    .map_or(Json::Null, HostileCounts::to_json),
            ),
            ("passed", Json::Bool(self.passed())),
        ])
    }

    /// Each command's figures; mget's with the cells it read per second.
    fn commands_json(&self) -> Json {
        let cells_per_sec = self.cells_per_sec();
        let commands = self
            .summaries()
            .into_iter()
            .map(|(name, s)| {
                let mut figures = summary_json(&s);
                if let (Some(cells), Json::Object(fields)) = (cells_per_sec, &mut figures)
                    && name == Command::Mget.name()
                {
                    fields.insert("cells_per_sec".to_owned(), Json::from(cells));
                }
                (name, figures)
            })
            .collect::<Vec<_>>();
        json::object(commands)
    }

    /// The read-back at the end and the reads checked during the run.
    fn verification_json(&self) -> Json {
        json::object([
            ("mode", Json::from(self.verification.mode.name())),
            ("keys_checked", Json::from(self.verification.keys_checked)),
            ("mismatches", Json::from(self.verification.mismatches)),
            (
                "mismatch_samples",
                strings(&self.verification.mismatch_samples),
            ),
            ("errors", strings(&self.verification.errors)),
            (
                "read_mismatches_during_run",
                Json::from(self.live_mismatches.mismatches),
            ),
            (
                "read_mismatch_samples",
                strings(&self.live_mismatches.mismatch_samples),
            ),
        ])
    }

    /// The human report: what ran, the latency table, the server's own
    /// figures, crashes, the read-back, and a closing verdict.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        self.write_what_ran(&mut out);
        out.push('\n');
        out.push_str(&latency_table(&self.summaries()));
        if let Some(cells) = self.cells_per_sec() {
            let _ = writeln!(
                out,
                "cells/s  {cells:.0} ({} keys per mget x mget/s; latency is per mget request)",
                self.workload.batch
            );
        }
        self.write_server_highlights(&mut out);
        if let Some(e) = &self.server_error {
            let _ = writeln!(out, "\nserver figures unavailable: {e}");
        }
        if !self.crashes.is_empty() {
            out.push_str(&self.crash_lines());
        }
        if let Some(hostile) = &self.hostile {
            let _ = writeln!(
                out,
                "\nhostile   {} threads beside the clients, from warmup to the end:",
                hostile.total_threads()
            );
            out.push_str(&hostile.to_lines());
        }
        out.push('\n');
        out.push_str(&self.verdict_lines());
        out
    }

    /// The run's first lines: target, workload, what was measured, and
    /// what the latencies mean (closed or open loop).
    fn write_what_ran(&self, out: &mut String) {
        let _ = writeln!(out, "target    {}", self.target_detail);
        let _ = writeln!(
            out,
            "workload  {}; {} keys, seed {}",
            self.headline(),
            self.keys,
            self.seed
        );
        let _ = writeln!(
            out,
            "measured  {:.2} s after {:.1} s warmup{}",
            self.duration_s,
            self.warmup_s,
            self.prefill_s
                .map(|s| format!(" (key space written first in {s:.2} s)"))
                .unwrap_or_default()
        );
        let _ = match self.rate_ops_per_sec {
            None => writeln!(
                out,
                "latency   closed loop: each client waits for its answer before the next request, \
                 so this is service time;\n          under a fixed arrival rate the tail would be \
                 worse (coordinated omission; try --rate)"
            ),
            Some(rate) => writeln!(
                out,
                "latency   open loop at {rate:.0} requests/s: a request sent late behind slow answers \
                 is timed from when it was due,\n          so that wait counts (no coordinated omission)"
            ),
        };
    }

    /// The server's own figures for the commands measured, with how they
    /// differ from the clients'.
    fn write_server_highlights(&self, out: &mut String) {
        let figures = self.server_highlights();
        if !figures.is_empty() {
            let _ = writeln!(
                out,
                "\nserver's own figures (all of them in --json), counted since cubed started: \
                 they include the {:.1} s warmup{} that the table above leaves out,\n\
                 so the server's counts are higher than the clients' and its latencies \
                 cover more requests:",
                self.warmup_s,
                if self.prefill_s.is_some() {
                    " and the key-space prefill"
                } else {
                    ""
                }
            );
            let width = figures.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
            for (name, value) in figures {
                let _ = writeln!(out, "  {name:<width$}  {value}");
            }
        }
    }

    fn server_highlights(&self) -> Vec<(String, String)> {
        let used: Vec<String> = self
            .summaries()
            .iter()
            .map(|(name, _)| format!("cmd.{name}."))
            .collect();
        self.server
            .iter()
            .filter(|e| {
                used.iter().any(|prefix| e.name.starts_with(prefix))
                    || e.name.starts_with("wal.")
                    || e.name.starts_with("redis.")
                    || e.name == "server.sync"
            })
            .filter(|e| !matches!(e.name.as_str(), "wal.last_lsn" | "wal.segments_created"))
            .filter(|e| !cube_metrics::is_histogram_row(&e.name))
            .map(|e| (e.name.clone(), stats_text(&e.value)))
            .collect()
    }

    fn crash_lines(&self) -> String {
        let mut out = String::new();
        let restarts: Vec<f64> = self.crashes.iter().map(|c| c.restart_ms).collect();
        let mean = restarts.iter().sum::<f64>() / restarts.len() as f64;
        let max = restarts.iter().copied().fold(0.0, f64::max);
        let _ = writeln!(
            out,
            "\ncrashes   {} SIGKILLs; restart until accepting connections: mean {mean:.0} ms, max {max:.0} ms",
            self.crashes.len()
        );
        for (i, crash) in self.crashes.iter().enumerate() {
            let replay = match (crash.server_recovery_ms, crash.records_replayed) {
                (Some(ms), Some(records)) => format!(", replayed {records} records in {ms} ms"),
                _ => String::new(),
            };
            let _ = writeln!(
                out,
                "  #{:<3} at {:>6.1} s: restart {:>5.0} ms{replay}, {} writes in flight, {} keys read back: {}",
                i + 1,
                crash.at_s,
                crash.restart_ms,
                crash.uncertain_writes,
                crash.verification.keys_checked,
                if crash.verification.passed() {
                    "all as acknowledged".to_owned()
                } else {
                    format!("{} MISMATCHES", crash.verification.mismatches)
                }
            );
            for problem in crash
                .verification
                .mismatch_samples
                .iter()
                .chain(&crash.verification.errors)
            {
                let _ = writeln!(out, "        {problem}");
            }
        }
        out
    }

    fn verdict_lines(&self) -> String {
        let mut out = String::new();
        let v = &self.verification;
        let _ = writeln!(
            out,
            "read-back ({}): {} keys checked, {} mismatches; reads during the run: {} mismatches",
            v.mode.name(),
            v.keys_checked,
            v.mismatches,
            self.live_mismatches.mismatches
        );
        for problem in v
            .mismatch_samples
            .iter()
            .chain(&v.errors)
            .chain(&self.live_mismatches.mismatch_samples)
        {
            let _ = writeln!(out, "  {problem}");
        }
        let _ = writeln!(
            out,
            "errors: {}{}",
            self.errors,
            if self.reconnects > 0 {
                format!(
                    " ({} requests cut off by crashes, reconnected)",
                    self.reconnects
                )
            } else {
                String::new()
            }
        );
        for e in &self.error_samples {
            let _ = writeln!(out, "  {e}");
        }
        if self.passed() {
            let _ = writeln!(out, "PASSED");
        } else {
            if let Some(log) = &self.daemon_log {
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                let _ = writeln!(out, "last lines of the daemon's log:");
                for line in tail.iter().rev() {
                    let _ = writeln!(out, "  | {line}");
                }
            }
            let _ = writeln!(out, "FAILED");
        }
        out
    }
}

/// The aligned per-command table.
pub fn latency_table(rows: &[(&str, LatencySummary)]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<8} {:>10} {:>10} {:>9} {:>8} {:>8} {:>8} {:>9} {:>8}",
        "command", "count", "ops/s", "mean_us", "p50_us", "p90_us", "p99_us", "p99.9_us", "max_us"
    );
    for (name, s) in rows {
        let _ = writeln!(
            out,
            "{:<8} {:>10} {:>10.0} {:>9.1} {:>8} {:>8} {:>8} {:>9} {:>8}",
            name,
            s.count,
            s.ops_per_sec,
            s.mean_us,
            s.p50_us,
            s.p90_us,
            s.p99_us,
            s.p999_us,
            s.max_us
        );
    }
    if rows.is_empty() {
        let _ = writeln!(out, "(no requests completed in the measured window)");
    }
    out
}

pub fn summary_json(s: &LatencySummary) -> Json {
    json::object([
        ("count", Json::from(s.count)),
        ("ops_per_sec", Json::from(s.ops_per_sec)),
        ("mean_us", Json::from(s.mean_us)),
        ("p50_us", Json::from(s.p50_us)),
        ("p90_us", Json::from(s.p90_us)),
        ("p99_us", Json::from(s.p99_us)),
        ("p999_us", Json::from(s.p999_us)),
        ("max_us", Json::from(s.max_us)),
    ])
}

fn crash_json(crash: &CrashReport) -> Json {
    json::object([
        ("at_s", Json::from(crash.at_s)),
        ("restart_ms", Json::from(crash.restart_ms)),
        (
            "server_recovery_ms",
            crash.server_recovery_ms.map_or(Json::Null, Json::from),
        ),
        (
            "records_replayed",
            crash.records_replayed.map_or(Json::Null, Json::from),
        ),
        ("uncertain_writes", Json::from(crash.uncertain_writes)),
        ("keys_checked", Json::from(crash.verification.keys_checked)),
        ("mismatches", Json::from(crash.verification.mismatches)),
        (
            "mismatch_samples",
            strings(&crash.verification.mismatch_samples),
        ),
        ("errors", strings(&crash.verification.errors)),
    ])
}

fn server_json(entries: &[StatsEntry]) -> Json {
    json::object(entries.iter().map(|e| {
        let value = match &e.value {
            StatsValue::Count(n) => Json::from(*n),
            StatsValue::Float(x) => Json::from(*x),
            StatsValue::Text(t) => Json::from(t.as_str()),
        };
        (e.name.clone(), value)
    }))
}

fn stats_text(value: &StatsValue) -> String {
    match value {
        StatsValue::Count(n) => n.to_string(),
        StatsValue::Float(x) => format!("{x:.1}"),
        StatsValue::Text(t) => t.clone(),
    }
}

fn strings(items: &[String]) -> Json {
    Json::Array(items.iter().map(|s| Json::from(s.as_str())).collect())
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Duration;

    use super::*;
    use crate::verify::VerifyMode;

    pub(crate) fn sample_report() -> RunReport {
        let mut latencies = Recorder::default();
        for us in 1..=100 {
            latencies.record(Command::Put, Duration::from_micros(us));
        }
        RunReport {
            target: "cube".to_owned(),
            target_detail: "throwaway cubed".to_owned(),
            workload: Workload::new(WorkloadKind::Put, 0.9).unwrap(),
            clients: 4,
            duration_s: 2.0,
            warmup_s: 0.5,
            value_size_bytes: 64,
            keys: 100,
            seed: 1,
            rate_ops_per_sec: None,
            prefill_s: None,
            errors: 0,
            error_samples: Vec::new(),
            reconnects: 0,
            live_mismatches: VerifyReport::new(VerifyMode::Sample),
            latencies,
            server: vec![
                StatsEntry {
                    name: "cmd.put.count".to_owned(),
                    value: StatsValue::Count(100),
                },
                StatsEntry {
                    name: "wal.fsync_us_mean".to_owned(),
                    value: StatsValue::Float(210.5),
                },
                StatsEntry {
                    name: "server.version".to_owned(),
                    value: StatsValue::Text("0.1.0".to_owned()),
                },
            ],
            server_error: None,
            verification: VerifyReport::new(VerifyMode::Sample),
            crashes: Vec::new(),
            daemon_log: None,
            hostile: None,
        }
    }

    #[test]
    fn json_has_the_documented_shape() {
        let json = sample_report().to_json();
        for key in [
            "target",
            "workload",
            "clients",
            "duration_s",
            "errors",
            "commands",
            "server",
            "verification",
            "crashes",
            "passed",
        ] {
            assert!(json.get(key).is_some(), "missing {key}");
        }
        let put = json.get("commands").and_then(|c| c.get("put")).unwrap();
        assert_eq!(put.get("count"), Some(&Json::from(100)));
        assert_eq!(put.get("ops_per_sec"), Some(&Json::from(50.0)));
        assert_eq!(put.get("p50_us"), Some(&Json::from(50)));
        assert_eq!(put.get("max_us"), Some(&Json::from(100)));
        for key in ["mean_us", "p90_us", "p99_us", "p999_us"] {
            assert!(put.get(key).is_some(), "missing commands.put.{key}");
        }
        let server = json.get("server").unwrap();
        assert_eq!(server.get("wal.fsync_us_mean"), Some(&Json::from(210.5)));
        assert_eq!(server.get("server.version"), Some(&Json::from("0.1.0")));
        assert_eq!(json.get("passed"), Some(&Json::Bool(true)));
    }

    #[test]
    fn table_is_aligned_and_says_closed_loop() {
        let report = sample_report();
        let table = report.to_table();
        assert!(table.contains("closed loop"), "{table}");
        assert!(table.contains("coordinated omission"), "{table}");
        assert!(table.contains("wal.fsync_us_mean"), "{table}");
        // Why the server's counts differ from the clients'.
        assert!(table.contains("include the 0.5 s warmup"), "{table}");
        assert!(!table.contains("server.version"), "{table}");
        assert!(table.trim_end().ends_with("PASSED"), "{table}");
        let lines: Vec<&str> = table
            .lines()
            .filter(|l| l.starts_with("command") || l.starts_with("put "))
            .collect();
        assert_eq!(lines.len(), 2, "{table}");
        assert_eq!(lines[0].len(), lines[1].len(), "{table}");
    }

    #[test]
    fn mget_reports_cells_per_second_beside_its_requests() {
        let mut report = sample_report();
        assert_eq!(report.cells_per_sec(), None);
        assert_eq!(report.to_json().get("batch"), Some(&Json::Null));
        report.workload = Workload::new(WorkloadKind::Mget, 0.9)
            .unwrap()
            .with_batch(16)
            .unwrap();
        report.latencies = Recorder::default();
        for us in 1..=100 {
            report
                .latencies
                .record(Command::Mget, Duration::from_micros(us));
        }
        // 100 mgets in 2 s, 16 keys each.
        assert_eq!(report.cells_per_sec(), Some(800.0));
        let json = report.to_json();
        assert_eq!(json.get("batch"), Some(&Json::from(16)));
        assert_eq!(json.get("read_ratio"), Some(&Json::from(1.0)));
        let mget = json.get("commands").and_then(|c| c.get("mget")).unwrap();
        assert_eq!(mget.get("ops_per_sec"), Some(&Json::from(50.0)));
        assert_eq!(mget.get("cells_per_sec"), Some(&Json::from(800.0)));
        let table = report.to_table();
        assert!(table.contains("mget (16 keys per request)"), "{table}");
        assert!(table.contains("cells/s  800 (16 keys per mget"), "{table}");
    }

    #[test]
    fn any_error_or_mismatch_fails_the_run() {
        let mut report = sample_report();
        report.errors = 1;
        assert!(!report.passed());
        let mut report = sample_report();
        report.verification.add_mismatch("key 1: lost".to_owned());
        assert!(!report.passed());
        assert!(report.to_table().contains("key 1: lost"));
        assert!(report.to_table().trim_end().ends_with("FAILED"));
    }
}
