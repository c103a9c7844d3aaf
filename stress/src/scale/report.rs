//! The scale benchmark's report: each figure beside the target issue 32
//! names for it and whether it is met, as a table and as JSON (shape in
//! docs/benchmarks.md, "Scale").

use std::fmt::Write as _;

use crate::json::{self, Json};

/// One measured figure.
#[derive(Clone, Debug)]
pub struct Figure {
    /// Its key in the JSON's `figures`.
    pub name: &'static str,
    /// What it is, for the table.
    pub label: String,
    /// The headline number in `unit`; `None` when it could not be measured.
    pub value: Option<f64>,
    pub unit: &'static str,
    /// Further numbers (p50, p99, the comparison's other side).
    pub details: Vec<(&'static str, Json)>,
    /// The target, in words.
    pub target: String,
    /// Met, missed, or `None`: not decidable in this run (the note says why).
    pub met: Option<bool>,
    pub note: String,
}

impl Figure {
    pub fn new(name: &'static str, label: impl Into<String>, unit: &'static str) -> Figure {
        Figure {
            name,
            label: label.into(),
            value: None,
            unit,
            details: Vec::new(),
            target: String::new(),
            met: None,
            note: String::new(),
        }
    }

    pub fn value(mut self, value: f64) -> Figure {
        self.value = Some(value);
        self
    }

    pub fn detail(mut self, key: &'static str, value: impl Into<Json>) -> Figure {
        self.details.push((key, value.into()));
        self
    }

    pub fn target(mut self, target: impl Into<String>, met: Option<bool>) -> Figure {
        self.target = target.into();
        self.met = met;
        self
    }

    pub fn note(mut self, note: impl Into<String>) -> Figure {
        self.note = note.into();
        self
    }

    fn to_json(&self) -> Json {
        let mut fields = vec![
            ("label", Json::from(self.label.as_str())),
            ("value", self.value.map_or(Json::Null, Json::from)),
            ("unit", Json::from(self.unit)),
        ];
        fields.extend(self.details.iter().cloned());
        fields.push(("target", Json::from(self.target.as_str())));
        fields.push(("met", self.met.map_or(Json::Null, Json::Bool)));
        fields.push(("note", Json::from(self.note.as_str())));
        json::object(fields)
    }

    fn shown_value(&self) -> String {
        let Some(value) = self.value else {
            return "-".to_owned();
        };
        let number = match self.unit {
            "bytes" => return format!("{:.1} MiB", value / (1024.0 * 1024.0)),
            "ms" if value < 10.0 => format!("{value:.2}"),
            _ => format!("{value:.0}"),
        };
        let mut shown = format!("{number} {}", self.unit);
        for (key, detail) in &self.details {
            if let (true, Some(n)) = (key.ends_with("_us"), detail.as_u64()) {
                let _ = write!(shown, ", {} {n} µs", key.trim_end_matches("_us"));
            }
        }
        shown
    }
}

/// Everything a scale run reports.
#[derive(Clone, Debug)]
pub struct ScaleReport {
    /// The data set and whether this run built it.
    pub dataset: Json,
    /// Load average and processors at the start and the end.
    pub machine: Json,
    pub figures: Vec<Figure>,
    /// Requests that failed and reads that found wrong values, over all
    /// phases; a report with any is a failed run.
    pub problems: Vec<String>,
}

impl ScaleReport {
    pub fn passed(&self) -> bool {
        self.problems.is_empty()
    }

    pub fn to_json(&self) -> Json {
        json::object([
            ("dataset", self.dataset.clone()),
            ("machine", self.machine.clone()),
            (
                "figures",
                json::object(self.figures.iter().map(|f| (f.name, f.to_json()))),
            ),
            (
                "problems",
                Json::Array(
                    self.problems
                        .iter()
                        .map(|p| Json::from(p.as_str()))
                        .collect(),
                ),
            ),
            ("passed", Json::Bool(self.passed())),
        ])
    }

    pub fn to_table(&self) -> String {
        let rows: Vec<[String; 4]> = self
            .figures
            .iter()
            .map(|f| {
                let met = match f.met {
                    Some(true) => "yes",
                    Some(false) => "NO",
                    None => "n/a",
                };
                [
                    f.label.clone(),
                    f.shown_value(),
                    f.target.clone(),
                    met.to_owned(),
                ]
            })
            .collect();
        let header = ["figure", "measured", "target (issue 32)", "met"].map(str::to_owned);
        let widths: Vec<usize> = (0..4)
            .map(|c| {
                rows.iter()
                    .chain([&header])
                    .map(|r| r[c].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for row in [&header].into_iter().chain(&rows) {
            let cells: Vec<String> = row
                .iter()
                .zip(&widths)
                .map(|(cell, &width)| format!("{cell:<width$}"))
                .collect();
            let _ = writeln!(out, "{}", cells.join("  ").trim_end());
        }
        let notes: Vec<&Figure> = self.figures.iter().filter(|f| !f.note.is_empty()).collect();
        if !notes.is_empty() {
            out.push('\n');
            for f in notes {
                let _ = writeln!(out, "{}: {}", f.label, f.note);
            }
        }
        if self.problems.is_empty() {
            out.push_str(
                "\nevery request succeeded and every value read was its key's version 1\n",
            );
        } else {
            let _ = writeln!(out, "\nPROBLEMS ({}):", self.problems.len());
            for p in &self.problems {
                let _ = writeln!(out, "  {p}");
            }
        }
        out
    }
}

/// The machine's state: processors and load average, for the record.
pub fn machine_now() -> Json {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let processors = std::thread::available_parallelism().map_or(0, usize::from);
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    json::object([
        ("processors", Json::from(processors)),
        ("loadavg_1_5_15", Json::from(load.join(" "))),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_shows_each_figure_its_target_and_verdict() {
        let report = ScaleReport {
            dataset: Json::Null,
            machine: Json::Null,
            figures: vec![
                Figure::new("import", "import rate", "cells/s")
                    .value(250_000.0)
                    .target(">= 200000 cells/s", Some(true)),
                Figure::new("hot", "hot gets, 16 clients", "gets/s")
                    .value(90_000.0)
                    .detail("p50_us", 120u64)
                    .detail("p99_us", 400u64)
                    .target(">= 0.9x before", None)
                    .note("compare with the reference"),
            ],
            problems: Vec::new(),
        };
        let table = report.to_table();
        assert!(table.contains("250000 cells/s"), "{table}");
        assert!(
            table.contains("90000 gets/s, p50 120 µs, p99 400 µs"),
            "{table}"
        );
        assert!(table.contains("n/a"), "{table}");
        assert!(table.contains("hot gets, 16 clients: compare with the reference"));
        let json = report.to_json();
        assert_eq!(json["figures"]["hot"]["p99_us"], Json::from(400u64));
        assert_eq!(json["figures"]["import"]["met"], Json::Bool(true));
        assert_eq!(json["passed"], Json::Bool(true));
    }
}
