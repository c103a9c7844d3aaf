//! `cubec ping`, `stats` (the daemon's figures), and the reports of
//! `checkpoint` and `backup`: the daemon as a whole.

use std::io::Write;
use std::time::Instant;

use cube_client::{Client, StatsEntry, StatsValue, json};
use serde_json::{Value, json};

use crate::EXIT_SERVER;
use crate::failure::Failure;
use crate::output::{emit, emit_line, output_failure};

pub(crate) fn ping(
    client: &mut Client,
    as_json: bool,
    out: &mut impl Write,
) -> Result<u8, Failure> {
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

/// Most refreshes `--watch` does before it stops by itself (a day at 2 s).
const MAX_WATCH_REFRESHES: u32 = 43_200;

/// Redraws the stats every `secs` seconds: clear the screen, home the
/// cursor, print the table (or one JSON object per line with --json).
pub(crate) fn watch_stats(
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
pub(crate) fn prometheus_text(entries: &[StatsEntry]) -> Result<String, Failure> {
    cube_metrics::exposition(entries).map_err(|why| Failure {
        code: EXIT_SERVER,
        message: why,
        reported_as_json: false,
    })
}

/// `cubec stats`: JSON carries every row (scripts look rows up by name);
/// the table shows what has happened unless `all`.
pub(crate) fn stats(
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
pub(crate) fn report(
    entries: Vec<StatsEntry>,
    as_json: bool,
    out: &mut impl Write,
) -> Result<u8, Failure> {
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

    use super::*;

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
}
