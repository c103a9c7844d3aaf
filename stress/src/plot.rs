//! A latency-by-percentile chart as a standalone SVG, drawn the way the
//! HdrHistogram plotter draws it: the x axis spreads the tail out
//! (0 %, 90 %, 99 %, 99.9 %, … at equal steps, i.e. log10 of 1/(1-q)),
//! the y axis is latency in microseconds, one line per command.

use std::fmt::Write as _;

use hdrhistogram::Histogram;

/// One line of the chart.
pub struct Series<'a> {
    pub name: &'a str,
    pub histogram: &'a Histogram<u64>,
}

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 540.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 230.0;
const TOP: f64 = 70.0;
const BOTTOM: f64 = 70.0;
const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];
/// Points per halving of the distance to 100 % (HdrHistogram's own
/// plotter uses 5).
const TICKS_PER_HALF_DISTANCE: u32 = 5;

/// The SVG document. `title` is the first line, `subtitle` the second.
pub fn latency_by_percentile(title: &str, subtitle: &str, series: &[Series<'_>]) -> String {
    let most_samples = series.iter().map(|s| s.histogram.len()).max().unwrap_or(0);
    // Enough decades to resolve the rarest sample, at least to 99 %.
    let x_decades = (most_samples.max(1) as f64).log10().ceil().clamp(2.0, 7.0);
    let highest = series
        .iter()
        .map(|s| s.histogram.max())
        .max()
        .unwrap_or(0)
        .max(1);
    let (y_max, y_step) = nice_axis(highest as f64);
    let plot_width = WIDTH - LEFT - RIGHT;
    let plot_height = HEIGHT - TOP - BOTTOM;
    let x_of = |decades: f64| LEFT + plot_width * (decades.min(x_decades) / x_decades);
    let y_of = |us: f64| TOP + plot_height * (1.0 - us.min(y_max) / y_max);

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="Helvetica, Arial, sans-serif">"#
    );
    let _ = writeln!(
        svg,
        r#"<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#
    );
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="30" font-size="18" font-weight="bold" text-anchor="middle">{}</text>"#,
        WIDTH / 2.0,
        escape(title)
    );
    let _ = writeln!(
        svg,
        r##"<text x="{}" y="52" font-size="13" fill="#555" text-anchor="middle">{}</text>"##,
        WIDTH / 2.0,
        escape(subtitle)
    );

    // Grid and axis labels.
    let mut tick = 0.0;
    while tick <= y_max + y_step / 2.0 {
        let y = y_of(tick);
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e3e3e3"/>"##,
            LEFT + plot_width
        );
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="end">{}</text>"#,
            LEFT - 8.0,
            y + 4.0,
            format_us(tick)
        );
        tick += y_step;
    }
    for decade in 0..=(x_decades as u32) {
        let x = x_of(f64::from(decade));
        let _ = writeln!(
            svg,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#e3e3e3"/>"##,
            TOP + plot_height
        );
        let _ = writeln!(
            svg,
            r#"<text x="{x:.1}" y="{:.1}" font-size="12" text-anchor="middle">{}</text>"#,
            TOP + plot_height + 18.0,
            percentile_label(decade)
        );
    }
    let _ = writeln!(
        svg,
        r##"<rect x="{LEFT}" y="{TOP}" width="{plot_width}" height="{plot_height}" fill="none" stroke="#888"/>"##
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" font-size="13" text-anchor="middle">percentile</text>"#,
        LEFT + plot_width / 2.0,
        HEIGHT - 22.0
    );
    let _ = writeln!(
        svg,
        r#"<text x="22" y="{:.1}" font-size="13" text-anchor="middle" transform="rotate(-90 22 {:.1})">latency (µs)</text>"#,
        TOP + plot_height / 2.0,
        TOP + plot_height / 2.0
    );

    // The lines and the legend.
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let points: Vec<String> = percentile_points(s.histogram)
            .into_iter()
            .map(|(decades, us)| format!("{:.1},{:.1}", x_of(decades), y_of(us as f64)))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            points.join(" ")
        );
        let legend_x = LEFT + plot_width + 20.0;
        let legend_y = TOP + 10.0 + 64.0 * i as f64;
        let _ = writeln!(
            svg,
            r#"<line x1="{legend_x:.1}" y1="{legend_y:.1}" x2="{:.1}" y2="{legend_y:.1}" stroke="{color}" stroke-width="3"/>"#,
            legend_x + 24.0
        );
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" font-size="14" font-weight="bold">{}</text>"#,
            legend_x + 32.0,
            legend_y + 5.0,
            escape(s.name)
        );
        let figures = [
            format!(
                "p50 {} · p99 {} µs",
                s.histogram.value_at_quantile(0.5),
                s.histogram.value_at_quantile(0.99)
            ),
            format!(
                "p99.9 {} · max {} µs",
                s.histogram.value_at_quantile(0.999),
                s.histogram.max()
            ),
        ];
        for (line, text) in figures.iter().enumerate() {
            let _ = writeln!(
                svg,
                r##"<text x="{:.1}" y="{:.1}" font-size="11" fill="#555">{text}</text>"##,
                legend_x + 32.0,
                legend_y + 21.0 + 14.0 * line as f64,
            );
        }
    }
    if series.iter().all(|s| s.histogram.is_empty()) {
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" font-size="16" text-anchor="middle">no requests recorded</text>"#,
            LEFT + plot_width / 2.0,
            TOP + plot_height / 2.0
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// `(decades, latency)` along the histogram: decades = log10(1/(1-q)),
/// with 100 % placed at the right edge.
pub fn percentile_points(histogram: &Histogram<u64>) -> Vec<(f64, u64)> {
    if histogram.is_empty() {
        return Vec::new();
    }
    let mut points: Vec<(f64, u64)> = histogram
        .iter_quantiles(TICKS_PER_HALF_DISTANCE)
        .map(|v| {
            let q = v.quantile_iterated_to();
            let decades = if q >= 1.0 {
                f64::INFINITY
            } else {
                -(1.0 - q).log10()
            };
            (decades, v.value_iterated_to())
        })
        .collect();
    points.insert(0, (0.0, histogram.min()));
    points
}

/// `0%`, `90%`, `99%`, `99.9%`, …
pub fn percentile_label(decades: u32) -> String {
    match decades {
        0 => "0%".to_owned(),
        1 => "90%".to_owned(),
        2 => "99%".to_owned(),
        n => format!("99.{}%", "9".repeat(n as usize - 2)),
    }
}

/// An axis top at or above `highest` with a step of 1, 2 or 5 × 10^k
/// giving 4 to 10 ticks.
fn nice_axis(highest: f64) -> (f64, f64) {
    let raw_step = highest / 5.0;
    let magnitude = 10f64.powf(raw_step.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw_step)
        .unwrap_or(10.0 * magnitude)
        .max(1.0);
    ((highest / step).ceil() * step, step)
}

fn format_us(us: f64) -> String {
    format!("{us:.0}")
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::latency::new_histogram;

    #[test]
    fn percentile_labels_follow_the_nines() {
        let labels: Vec<String> = (0..5).map(percentile_label).collect();
        assert_eq!(labels, ["0%", "90%", "99%", "99.9%", "99.99%"]);
    }

    #[test]
    fn axis_steps_are_round() {
        assert_eq!(nice_axis(97.0), (100.0, 20.0));
        assert_eq!(nice_axis(1234.0), (1500.0, 500.0));
        assert_eq!(nice_axis(1.0), (1.0, 1.0));
    }

    #[test]
    fn points_climb_to_the_maximum() {
        let mut h = new_histogram();
        for us in 1..=1000u64 {
            h.record(us).unwrap();
        }
        let points = percentile_points(&h);
        assert_eq!(points.first(), Some(&(0.0, 1)));
        assert!(
            points
                .windows(2)
                .all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1)
        );
        assert_eq!(points.last().map(|p| p.1), Some(1000));
    }

    #[test]
    fn svg_has_a_line_and_legend_per_command_and_escapes_text() {
        let mut put = new_histogram();
        let mut get = new_histogram();
        for us in 1..=500u64 {
            put.record(us * 2).unwrap();
            get.record(us).unwrap();
        }
        let svg = latency_by_percentile(
            "cube <put & get>",
            "16 clients",
            &[
                Series {
                    name: "put",
                    histogram: &put,
                },
                Series {
                    name: "get",
                    histogram: &get,
                },
            ],
        );
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains(">put<") && svg.contains(">get<"));
        assert!(svg.contains("cube &lt;put &amp; get&gt;"));
        assert!(svg.contains(">99%<") && svg.contains(">99.9%<"));
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
        let empty = latency_by_percentile("t", "s", &[]);
        assert!(empty.contains("no requests recorded"));
    }
}
