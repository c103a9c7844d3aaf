//! The Prometheus exposition of cubed's `stats`: one job, turn the named
//! figures of a stats reply into metric families, and let the `prometheus`
//! crate write them in the text format (version 0.0.4, which Prometheus
//! scrapes and `promtool check metrics` checks).
//!
//! cubed's `GET /metrics` and `cubec stats --prometheus` both call
//! [`exposition`] on the same figures, so they print the same thing.
//!
//! The mapping (docs/operations.md, "Prometheus" lists every metric):
//! - `cmd.NAME.*` become families with a `command="NAME"` label: requests
//!   and errors as counters, the latency as a histogram in seconds (from
//!   the `cmd.NAME.latency_us_le_*` rows cubed adds for commands it has
//!   served), the maximum as a gauge;
//! - `ns.NAME.*` become `cube_namespace_*` gauges with `namespace="NAME"`;
//! - the ever-growing counts (connections, WAL records, checkpoints, runs)
//!   are counters; every other number is a gauge, with a `_us`, `_ms` or
//!   `_s` unit turned into `_seconds`;
//! - text rows (version, sync policy, last failure) are `*_info` gauges of
//!   value 1 with the text in a `value` label.

// A function past a screen is split into its steps (clippy counts lines
// of code; the limit is in clippy.toml). Tests may run longer.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

use std::collections::HashMap;

use cube_protocol::{StatsEntry, StatsValue};
use prometheus::TextEncoder;
use prometheus::proto::{
    Bucket, Counter, Gauge, Histogram, LabelPair, Metric, MetricFamily, MetricType,
};

/// The `Content-Type` of [`exposition`]'s text.
pub const CONTENT_TYPE: &str = prometheus::TEXT_FORMAT;

/// Upper bounds (microseconds) of the command latency histogram's buckets:
/// 1-2.5-5 steps from 10 us to 10 s. cubed writes one cumulative count per
/// bound ([`latency_bucket_row`]) plus the `+Inf` one.
pub const LATENCY_BUCKETS_US: [u64; 19] = [
    10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
    500_000, 1_000_000, 2_500_000, 5_000_000, 10_000_000,
];

const BUCKET_ROW: &str = ".latency_us_le_";

/// The stats row of command `command`'s cumulative latency count up to
/// `bound_us` (`None`: every request, the `+Inf` bucket).
pub fn latency_bucket_row(command: &str, bound_us: Option<u64>) -> String {
    match bound_us {
        Some(bound) => format!("cmd.{command}{BUCKET_ROW}{bound}"),
        None => format!("cmd.{command}{BUCKET_ROW}inf"),
    }
}

/// The stats row of the sum of command `command`'s latencies (us).
pub fn latency_sum_row(command: &str) -> String {
    format!("cmd.{command}.latency_us_sum")
}

/// Whether `name` is one of the histogram's rows (bucket counts and the
/// sum): for machines, so `cubec stats` shows them only with `--all`.
pub fn is_histogram_row(name: &str) -> bool {
    name.starts_with("cmd.") && (name.contains(BUCKET_ROW) || name.ends_with(".latency_us_sum"))
}

/// Counts that only grow (while cubed runs): stats row, metric name, help.
const COUNTERS: &[(&str, &str, &str)] = &[
    (
        "connections.accepted",
        "cube_connections_accepted_total",
        "Client connections accepted.",
    ),
    (
        "connections.refused",
        "cube_connections_refused_total",
        "Client connections refused (over --max-connections or not allowed).",
    ),
    (
        "connections.timed_out",
        "cube_connections_timed_out_total",
        "Client connections closed for idling or a slow frame.",
    ),
    (
        "frames.bad",
        "cube_bad_frames_total",
        "Frames that could not be decoded.",
    ),
    (
        "wal.records",
        "cube_wal_records_total",
        "Records appended to the write-ahead log.",
    ),
    (
        "wal.bytes",
        "cube_wal_written_bytes_total",
        "Bytes appended to the write-ahead log.",
    ),
    (
        "wal.fsyncs",
        "cube_wal_fsyncs_total",
        "fdatasync calls on the write-ahead log.",
    ),
    (
        "wal.groups",
        "cube_wal_groups_total",
        "Group commits (writes made durable together).",
    ),
    (
        "wal.segments_created",
        "cube_wal_segments_created_total",
        "Write-ahead log segments started.",
    ),
    (
        "wal.write_errors",
        "cube_wal_write_errors_total",
        "Failed writes or syncs of the write-ahead log.",
    ),
    (
        "checkpoint.count",
        "cube_checkpoints_total",
        "Checkpoints written.",
    ),
    (
        "checkpoint.compactions",
        "cube_checkpoint_compactions_total",
        "Checkpoint compactions (deltas merged into a new base).",
    ),
    (
        "checkpoint.failures",
        "cube_checkpoint_failures_total",
        "Checkpoints that failed.",
    ),
    (
        "programs.runs",
        "cube_program_runs_total",
        "Cell program runs.",
    ),
    (
        "programs.failed",
        "cube_program_runs_failed_total",
        "Cell program runs that failed.",
    ),
    (
        "programs.out_of_fuel",
        "cube_program_runs_out_of_fuel_total",
        "Cell program runs stopped by their instruction or time budget.",
    ),
    (
        "programs.out_of_memory",
        "cube_program_runs_out_of_memory_total",
        "Cell program runs stopped by their memory budget.",
    ),
    (
        "programs.compiles",
        "cube_program_compiles_total",
        "Cell program compilations.",
    ),
    (
        "programs.steps",
        "cube_program_steps_total",
        "Steps (every program of a box run once).",
    ),
    (
        "programs.steps_parallel",
        "cube_program_steps_parallel_total",
        "Steps split into lanes on several threads.",
    ),
    (
        "programs.steps_redone",
        "cube_program_steps_redone_total",
        "Parallel steps redone on the writer alone.",
    ),
    (
        "watch.changes_delivered",
        "cube_watch_changes_delivered_total",
        "Changes written to watchers, live and replayed.",
    ),
    (
        "watch.direct_writes",
        "cube_watch_direct_writes_total",
        "Deliveries the watch dispatcher wrote to a caught-up watcher's socket itself.",
    ),
    (
        "watch.queued_deliveries",
        "cube_watch_queued_deliveries_total",
        "Deliveries handed to a watch's own thread.",
    ),
    (
        "watch.resyncs_history_gone",
        "cube_watch_resyncs_history_gone_total",
        "Watches answered resync: the history asked for is gone.",
    ),
    (
        "watch.resyncs_too_slow",
        "cube_watch_resyncs_too_slow_total",
        "Watches answered resync: the watcher fell past --watch-buffer-bytes.",
    ),
];

/// Units per second of the stats rows' unit suffixes (a division by them
/// rounds exactly: 10 us is 0.00001 s, not 0.000009999...).
const UNITS: &[(&str, f64)] = &[("us", 1e6), ("ms", 1e3), ("s", 1.0)];

/// The text exposition of `entries` (a `stats` reply).
pub fn exposition(entries: &[StatsEntry]) -> Result<String, String> {
    let mut families = Families::default();
    let mut histograms = Histograms::default();
    for entry in entries {
        if let Some((command, field)) = labelled(&entry.name, "cmd.") {
            command_row(&mut families, &mut histograms, command, field, &entry.value);
        } else if let Some((ns, field)) = labelled(&entry.name, "ns.") {
            if let Some(value) = number(&entry.value) {
                let name = format!("cube_namespace_{}", metric_name(field).0);
                let help = format!("Namespace {field} (`cubec stats` row ns.NAME.{field}).");
                families.push(&name, &help, MetricType::GAUGE, &[("namespace", ns)], value);
            }
        } else {
            plain_row(&mut families, entry);
        }
    }
    histograms.add_to(&mut families);
    let encoded = TextEncoder::new()
        .encode_to_string(&families.into_vec())
        .map_err(|e| format!("cannot encode the metrics: {e}"))?;
    Ok(encoded)
}

/// `prefix LABEL.FIELD` split into the label and the field.
fn labelled<'a>(name: &'a str, prefix: &str) -> Option<(&'a str, &'a str)> {
    name.strip_prefix(prefix)?.split_once('.')
}

fn number(value: &StatsValue) -> Option<f64> {
    match value {
        StatsValue::Count(n) => Some(*n as f64),
        StatsValue::Float(f) if f.is_finite() => Some(*f),
        _ => None,
    }
}

fn command_row(
    families: &mut Families,
    histograms: &mut Histograms,
    command: &str,
    field: &str,
    value: &StatsValue,
) {
    let Some(n) = number(value) else { return };
    let label = [("command", command)];
    match field {
        "count" => families.push(
            "cube_commands_total",
            "Requests answered, by command.",
            MetricType::COUNTER,
            &label,
            n,
        ),
        "errors" => families.push(
            "cube_command_errors_total",
            "Requests answered with an error, by command.",
            MetricType::COUNTER,
            &label,
            n,
        ),
        "latency_us_max" => families.push(
            "cube_command_latency_max_seconds",
            "Slowest request since cubed started, by command.",
            MetricType::GAUGE,
            &label,
            n / 1e6,
        ),
        "latency_us_sum" => histograms.get(command).sum_us = n,
        // The percentiles and the mean are the histogram's to give.
        "latency_us_mean" | "latency_us_p50" | "latency_us_p99" | "latency_us_p999" => {}
        _ => match field.strip_prefix("latency_us_le_") {
            Some("inf") => histograms.get(command).count = Some(n as u64),
            Some(bound) => {
                if let Ok(bound) = bound.parse::<u64>() {
                    histograms.get(command).buckets.push((bound, n as u64));
                }
            }
            None => {
                let name = format!("cube_command_{}", metric_name(field).0);
                let help = format!("`cubec stats` row cmd.NAME.{field}, by command.");
                families.push(&name, &help, MetricType::GAUGE, &label, n);
            }
        },
    }
}

fn plain_row(families: &mut Families, entry: &StatsEntry) {
    match &entry.value {
        StatsValue::Text(text) => {
            let name = format!("cube_{}_info", sanitize(&entry.name));
            let help = format!(
                "`cubec stats` row {} (text, in the value label).",
                entry.name
            );
            families.push(&name, &help, MetricType::GAUGE, &[("value", text)], 1.0);
        }
        value => {
            let Some(n) = number(value) else { return };
            if let Some((_, name, help)) = COUNTERS.iter().find(|(row, _, _)| *row == entry.name) {
                families.push(name, help, MetricType::COUNTER, &[], n);
            } else {
                let (name, scale) = metric_name(&entry.name);
                let help = format!("`cubec stats` row {}.", entry.name);
                families.push(
                    &format!("cube_{name}"),
                    &help,
                    MetricType::GAUGE,
                    &[],
                    n / scale,
                );
            }
        }
    }
}

/// `a.b_c` as `a_b_c`: only `[a-zA-Z0-9_]` stay.
fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// A stats row's name as a metric name in base units, and what to divide
/// its value by: `wal.fsync_us_max` is `wal_fsync_max_seconds`, / 1e6.
fn metric_name(name: &str) -> (String, f64) {
    let clean = sanitize(name);
    let mut scale = None;
    let mut words = Vec::new();
    for word in clean.split('_') {
        match UNITS.iter().find(|(unit, _)| *unit == word) {
            Some((_, factor)) if scale.is_none() => scale = Some(*factor),
            _ => words.push(word),
        }
    }
    if scale.is_some() {
        words.push("seconds");
    }
    (words.join("_"), scale.unwrap_or(1.0))
}

/// Metric families in the order their first row came.
#[derive(Default)]
struct Families {
    order: Vec<String>,
    by_name: HashMap<String, MetricFamily>,
}

impl Families {
    fn push(
        &mut self,
        name: &str,
        help: &str,
        kind: MetricType,
        labels: &[(&str, &str)],
        value: f64,
    ) {
        let mut metric = Metric::default();
        metric.set_label(label_pairs(labels));
        match kind {
            MetricType::COUNTER => {
                let mut counter = Counter::default();
                counter.set_value(value);
                metric.set_counter(counter);
            }
            _ => {
                let mut gauge = Gauge::default();
                gauge.set_value(value);
                metric.set_gauge(gauge);
            }
        }
        self.family(name, help, kind).mut_metric().push(metric);
    }

    fn family(&mut self, name: &str, help: &str, kind: MetricType) -> &mut MetricFamily {
        if !self.by_name.contains_key(name) {
            let mut family = MetricFamily::default();
            family.set_name(name.to_owned());
            family.set_help(help.to_owned());
            family.set_field_type(kind);
            self.order.push(name.to_owned());
            self.by_name.insert(name.to_owned(), family);
        }
        self.by_name.entry(name.to_owned()).or_default()
    }

    fn into_vec(mut self) -> Vec<MetricFamily> {
        self.order
            .iter()
            .filter_map(|name| self.by_name.remove(name))
            .collect()
    }
}

fn label_pairs(labels: &[(&str, &str)]) -> Vec<LabelPair> {
    labels
        .iter()
        .map(|(name, value)| {
            let mut pair = LabelPair::default();
            pair.set_name((*name).to_owned());
            pair.set_value((*value).to_owned());
            pair
        })
        .collect()
}

/// One command's latency histogram, gathered from its rows.
#[derive(Default)]
struct CommandHistogram {
    sum_us: f64,
    /// (upper bound in us, cumulative count)
    buckets: Vec<(u64, u64)>,
    /// The `+Inf` bucket: every request. Without it there is no histogram.
    count: Option<u64>,
}

#[derive(Default)]
struct Histograms {
    order: Vec<String>,
    by_command: HashMap<String, CommandHistogram>,
}

impl Histograms {
    fn get(&mut self, command: &str) -> &mut CommandHistogram {
        if !self.by_command.contains_key(command) {
            self.order.push(command.to_owned());
        }
        self.by_command.entry(command.to_owned()).or_default()
    }

    fn add_to(mut self, families: &mut Families) {
        for command in &self.order {
            let Some(h) = self.by_command.remove(command) else {
                continue;
            };
            let Some(count) = h.count else { continue };
            let mut histogram = Histogram::default();
            histogram.set_sample_count(count);
            histogram.set_sample_sum(h.sum_us / 1e6);
            let mut buckets = h.buckets;
            buckets.sort_unstable();
            // Cumulative counts never fall and never pass the total, even
            // if a request was recorded between two of cubed's reads.
            let mut so_far = 0;
            histogram.set_bucket(
                buckets
                    .into_iter()
                    .map(|(bound_us, cumulative)| {
                        so_far = cumulative.clamp(so_far, count);
                        let mut bucket = Bucket::default();
                        bucket.set_upper_bound(bound_us as f64 / 1e6);
                        bucket.set_cumulative_count(so_far);
                        bucket
                    })
                    .collect(),
            );
            let mut metric = Metric::default();
            metric.set_label(label_pairs(&[("command", command)]));
            metric.set_histogram(histogram);
            families
                .family(
                    "cube_command_duration_seconds",
                    "Time cubed took to answer a request (server side), by command.",
                    MetricType::HISTOGRAM,
                )
                .mut_metric()
                .push(metric);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn row(name: &str, value: StatsValue) -> StatsEntry {
        StatsEntry {
            name: name.to_owned(),
            value,
        }
    }

    #[test]
    fn names_take_base_units() {
        assert_eq!(
            metric_name("wal.fsync_us_max"),
            ("wal_fsync_max_seconds".into(), 1e6)
        );
        assert_eq!(
            metric_name("server.uptime_s"),
            ("server_uptime_seconds".into(), 1.0)
        );
        assert_eq!(metric_name("recovery.ms"), ("recovery_seconds".into(), 1e3));
        assert_eq!(metric_name("store.cells"), ("store_cells".into(), 1.0));
    }

    #[test]
    fn counters_histograms_and_labels() {
        let text = exposition(&[
            row("server.version", StatsValue::Text("0.1.0".into())),
            row("connections.accepted", StatsValue::Count(7)),
            row("cmd.get.count", StatsValue::Count(3)),
            row("cmd.get.latency_us_sum", StatsValue::Count(300)),
            row("cmd.get.latency_us_le_100", StatsValue::Count(2)),
            row("cmd.get.latency_us_le_10", StatsValue::Count(0)),
            row("cmd.get.latency_us_le_inf", StatsValue::Count(3)),
            row("cmd.get.latency_us_p99", StatsValue::Count(150)),
            row("ns.default.cells", StatsValue::Count(5)),
            row("wal.fsync_us_max", StatsValue::Count(2500)),
        ])
        .unwrap();
        for line in [
            "# TYPE cube_connections_accepted_total counter",
            "cube_connections_accepted_total 7",
            "cube_commands_total{command=\"get\"} 3",
            "# TYPE cube_command_duration_seconds histogram",
            "cube_command_duration_seconds_bucket{command=\"get\",le=\"0.00001\"} 0",
            "cube_command_duration_seconds_bucket{command=\"get\",le=\"0.0001\"} 2",
            "cube_command_duration_seconds_bucket{command=\"get\",le=\"+Inf\"} 3",
            "cube_command_duration_seconds_sum{command=\"get\"} 0.0003",
            "cube_command_duration_seconds_count{command=\"get\"} 3",
            "cube_namespace_cells{namespace=\"default\"} 5",
            "cube_wal_fsync_max_seconds 0.0025",
            "cube_server_version_info{value=\"0.1.0\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} not in:\n{text}");
        }
        assert!(!text.contains("p99"), "{text}");
        assert!(!text.contains("default_cells"), "{text}");
    }
}
