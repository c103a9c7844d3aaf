//! A latency-by-percentile chart as a standalone SVG, drawn the way the
//! HdrHistogram plotter draws it: the x axis spreads the tail out
//! (0 %, 90 %, 99 %, 99.9 %, … at equal steps, i.e. log10 of 1/(1-q)),
//! one line per command. The y axis is latency on a log scale: a linear
//! one up to the maximum flattened everything below p99.9 onto zero, so
//! p50 and p99 could not be read off the picture; with decades of latency
//! each getting the same height, the body and the tail both show.

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
const PLOT_WIDTH: f64 = WIDTH - LEFT - RIGHT;
const PLOT_HEIGHT: f64 = HEIGHT - TOP - BOTTOM;
const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];
/// Points per halving of the distance to 100 % (HdrHistogram's own
/// plotter uses 5).
const TICKS_PER_HALF_DISTANCE: u32 = 5;

/// The SVG document. `title` is the first line, `subtitle` the second.
pub fn latency_by_percentile(title: &str, subtitle: &str, series: &[Series<'_>]) -> String {
    let chart = Chart::covering(series);
    let mut svg = String::new();
    write_header(&mut svg, title, subtitle);
    write_latency_grid(&mut svg, &chart);
    write_percentile_grid(&mut svg, &chart);
    write_frame(&mut svg);
    // The lines and the legend.
    for (i, s) in series.iter().enumerate() {
        write_series(&mut svg, &chart, i, s);
    }
    if series.iter().all(|s| s.histogram.is_empty()) {
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" font-size="16" text-anchor="middle">no requests recorded</text>"#,
            LEFT + PLOT_WIDTH / 2.0,
            TOP + PLOT_HEIGHT / 2.0
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// Where a point of the chart goes: the percentile decades the x axis
/// spans and the latency axis.
struct Chart {
    x_decades: f64,
    axis: LogAxis,
}

impl Chart {
    fn covering(series: &[Series<'_>]) -> Chart {
        let most_samples = series.iter().map(|s| s.histogram.len()).max().unwrap_or(0);
        // Enough decades to resolve the rarest sample, at least to 99 %.
        let x_decades = (most_samples.max(1) as f64).log10().ceil().clamp(2.0, 7.0);
        let recorded = || series.iter().filter(|s| !s.histogram.is_empty());
        let highest = recorded().map(|s| s.histogram.max()).max().unwrap_or(1);
        let lowest = recorded().map(|s| s.histogram.min()).min().unwrap_or(1);
        Chart {
            x_decades,
            axis: LogAxis::covering(lowest as f64, highest as f64),
        }
    }

    fn x_of(&self, decades: f64) -> f64 {
        LEFT + PLOT_WIDTH * (decades.min(self.x_decades) / self.x_decades)
    }

    fn y_of(&self, us: f64) -> f64 {
        TOP + PLOT_HEIGHT * (1.0 - self.axis.fraction(us))
    }
}

/// The SVG element, its white background, the title and the subtitle.
fn write_header(svg: &mut String, title: &str, subtitle: &str) {
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
}

/// The latency grid and its labels: a darker line at each power of ten.
fn write_latency_grid(svg: &mut String, chart: &Chart) {
    for (tick, major) in chart.axis.ticks() {
        let y = chart.y_of(tick);
        let stroke = if major { "#c8c8c8" } else { "#ececec" };
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{stroke}"/>"##,
            LEFT + PLOT_WIDTH
        );
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="end">{}</text>"#,
            LEFT - 8.0,
            y + 4.0,
            format_us(tick)
        );
    }
}

/// The percentile grid and its labels: the median, then 0 %, 90 %, 99 %, …
fn write_percentile_grid(svg: &mut String, chart: &Chart) {
    // The median gets its own line: where p50 is read off.
    let median_x = chart.x_of(2f64.log10());
    let _ = writeln!(
        svg,
        r##"<line x1="{median_x:.1}" y1="{TOP}" x2="{median_x:.1}" y2="{:.1}" stroke="#e3e3e3" stroke-dasharray="4 3"/>"##,
        TOP + PLOT_HEIGHT
    );
    let _ = writeln!(
        svg,
        r#"<text x="{median_x:.1}" y="{:.1}" font-size="12" text-anchor="middle">50%</text>"#,
        TOP + PLOT_HEIGHT + 18.0
    );
    for decade in 0..=(chart.x_decades as u32) {
        let x = chart.x_of(f64::from(decade));
        let _ = writeln!(
            svg,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#e3e3e3"/>"##,
            TOP + PLOT_HEIGHT
        );
        let _ = writeln!(
            svg,
            r#"<text x="{x:.1}" y="{:.1}" font-size="12" text-anchor="middle">{}</text>"#,
            TOP + PLOT_HEIGHT + 18.0,
            percentile_label(decade)
        );
    }
}

/// The plot's frame and the axes' names.
fn write_frame(svg: &mut String) {
    let _ = writeln!(
        svg,
        r##"<rect x="{LEFT}" y="{TOP}" width="{PLOT_WIDTH}" height="{PLOT_HEIGHT}" fill="none" stroke="#888"/>"##
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" font-size="13" text-anchor="middle">percentile</text>"#,
        LEFT + PLOT_WIDTH / 2.0,
        HEIGHT - 22.0
    );
    let _ = writeln!(
        svg,
        r#"<text x="22" y="{:.1}" font-size="13" text-anchor="middle" transform="rotate(-90 22 {:.1})">latency (log scale)</text>"#,
        TOP + PLOT_HEIGHT / 2.0,
        TOP + PLOT_HEIGHT / 2.0
    );
}

/// The `i`th series' line, and its legend entry with its figures.
fn write_series(svg: &mut String, chart: &Chart, i: usize, s: &Series<'_>) {
    let color = COLORS[i % COLORS.len()];
    let points: Vec<String> = percentile_points(s.histogram)
        .into_iter()
        .map(|(decades, us)| format!("{:.1},{:.1}", chart.x_of(decades), chart.y_of(us as f64)))
        .collect();
    let _ = writeln!(
        svg,
        r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
        points.join(" ")
    );
    let legend_x = LEFT + PLOT_WIDTH + 20.0;
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

/// A log10 latency axis from a power of ten at or below the lowest
/// latency to one at or above the highest (at least one decade).
struct LogAxis {
    low_decade: f64,
    high_decade: f64,
}

impl LogAxis {
    fn covering(lowest_us: f64, highest_us: f64) -> LogAxis {
        let low_decade = lowest_us.max(1.0).log10().floor();
        let high_decade = highest_us.max(1.0).log10().ceil().max(low_decade + 1.0);
        LogAxis {
            low_decade,
            high_decade,
        }
    }

    /// Where `us` sits, 0 at the bottom and 1 at the top.
    fn fraction(&self, us: f64) -> f64 {
        let decade = us.max(1.0).log10();
        ((decade - self.low_decade) / (self.high_decade - self.low_decade)).clamp(0.0, 1.0)
    }

    /// 1, 2 and 5 times each power of ten on the axis; `true` for the
    /// powers of ten themselves.
    fn ticks(&self) -> Vec<(f64, bool)> {
        let mut ticks = Vec::new();
        let mut decade = self.low_decade;
        while decade < self.high_decade {
            let power = 10f64.powf(decade);
            ticks.extend([(power, true), (2.0 * power, false), (5.0 * power, false)]);
            decade += 1.0;
        }
        ticks.push((10f64.powf(self.high_decade), true));
        ticks
    }
}

/// `20 µs`, `1.5 ms`, `2 s`.
fn format_us(us: f64) -> String {
    if us < 1000.0 {
        format!("{us:.0} µs")
    } else if us < 1_000_000.0 {
        format!("{} ms", trim(us / 1000.0))
    } else {
        format!("{} s", trim(us / 1_000_000.0))
    }
}

/// At most one decimal, none when it is 0.
fn trim(value: f64) -> String {
    let text = format!("{value:.1}");
    text.strip_suffix(".0").map_or(text.clone(), str::to_owned)
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
    fn the_latency_axis_is_logarithmic_in_round_ticks() {
        let axis = LogAxis::covering(37.0, 25_000.0);
        assert_eq!((axis.low_decade, axis.high_decade), (1.0, 5.0));
        // Every decade gets the same height, so p50 (40 us) and a 25 ms
        // maximum are both readable.
        assert!((axis.fraction(100.0) - 0.25).abs() < 1e-9);
        assert!((axis.fraction(1000.0) - 0.5).abs() < 1e-9);
        assert!(axis.fraction(40.0) > 0.1);
        let labels: Vec<String> = axis.ticks().iter().map(|(t, _)| format_us(*t)).collect();
        assert_eq!(labels.first().map(String::as_str), Some("10 µs"));
        assert!(labels.contains(&"2 ms".to_owned()), "{labels:?}");
        assert_eq!(labels.last().map(String::as_str), Some("100 ms"));
        let flat = LogAxis::covering(5.0, 5.0);
        assert_eq!((flat.low_decade, flat.high_decade), (0.0, 1.0));
        assert_eq!(format_us(1500.0), "1.5 ms");
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
