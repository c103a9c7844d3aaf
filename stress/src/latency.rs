//! Latency histograms: one per command per client thread, merged at the end.
//!
//! Values are recorded in whole microseconds (HdrHistogram, 3 significant
//! digits, 1 µs to 1 h). What they mean depends on the driver's loop:
//! closed loop (the default) times each request from send to answer, with
//! the next request sent only after the answer, i.e. service time; a
//! stalled server delays the requests that would have been sent meanwhile
//! instead of making them slow, so the tail under a fixed arrival rate is
//! worse than reported (coordinated omission). `--rate` runs an open loop:
//! a request sent late because earlier answers were slow is timed from
//! when it was due, which counts that waiting.

use std::time::Duration;

use hdrhistogram::Histogram;

use crate::workload::Command;

/// The largest latency a histogram holds; longer ones are clamped to it.
pub const MAX_LATENCY_US: u64 = 3_600_000_000;
const SIGNIFICANT_DIGITS: u8 = 3;

pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, SIGNIFICANT_DIGITS)
        .expect("constant histogram bounds are valid: 1 <= 1 h, 3 digits")
}

/// One histogram per [`Command`].
#[derive(Clone, Debug)]
pub struct Recorder {
    histograms: Vec<Histogram<u64>>,
}

impl Default for Recorder {
    fn default() -> Recorder {
        Recorder {
            histograms: Command::ALL.iter().map(|_| new_histogram()).collect(),
        }
    }
}

impl Recorder {
    pub fn record(&mut self, command: Command, latency: Duration) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        if let Some(histogram) = self.histograms.get_mut(command.index()) {
            histogram.saturating_record(us.min(MAX_LATENCY_US));
        }
    }

    /// Adds another thread's figures to these.
    pub fn merge(&mut self, other: &Recorder) -> Result<(), String> {
        for (mine, theirs) in self.histograms.iter_mut().zip(&other.histograms) {
            mine.add(theirs)
                .map_err(|e| format!("cannot merge latency histograms: {e:?}"))?;
        }
        Ok(())
    }

    pub fn histogram(&self, command: Command) -> Option<&Histogram<u64>> {
        self.histograms.get(command.index())
    }

    /// The commands that were recorded at least once, in [`Command::ALL`]
    /// order, with their histograms.
    pub fn used(&self) -> Vec<(Command, &Histogram<u64>)> {
        Command::ALL
            .iter()
            .filter_map(|c| self.histogram(*c).map(|h| (*c, h)))
            .filter(|(_, h)| !h.is_empty())
            .collect()
    }
}

/// The figures reported for one command.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LatencySummary {
    pub count: u64,
    pub ops_per_sec: f64,
    pub mean_us: f64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
}

impl LatencySummary {
    /// Figures of `histogram` over a measured window of `seconds`.
    pub fn of(histogram: &Histogram<u64>, seconds: f64) -> LatencySummary {
        let count = histogram.len();
        let ops_per_sec = if seconds > 0.0 {
            count as f64 / seconds
        } else {
            0.0
        };
        LatencySummary {
            count,
            ops_per_sec,
            mean_us: if count == 0 { 0.0 } else { histogram.mean() },
            p50_us: histogram.value_at_quantile(0.50),
            p90_us: histogram.value_at_quantile(0.90),
            p99_us: histogram.value_at_quantile(0.99),
            p999_us: histogram.value_at_quantile(0.999),
            max_us: histogram.max(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_histograms_hold_every_thread_sample() {
        let mut a = Recorder::default();
        let mut b = Recorder::default();
        for us in 1..=100 {
            a.record(Command::Put, Duration::from_micros(us));
        }
        for us in 101..=200 {
            b.record(Command::Put, Duration::from_micros(us));
        }
        b.record(Command::Get, Duration::from_micros(7));
        a.merge(&b).unwrap();
        let put = LatencySummary::of(a.histogram(Command::Put).unwrap(), 2.0);
        assert_eq!(put.count, 200);
        assert_eq!(put.ops_per_sec, 100.0);
        assert_eq!(put.p50_us, 100);
        assert_eq!(put.p99_us, 198);
        assert_eq!(put.max_us, 200);
        assert!((put.mean_us - 100.5).abs() < 0.1, "{}", put.mean_us);
        let used: Vec<&str> = a.used().iter().map(|(c, _)| c.name()).collect();
        assert_eq!(used, ["put", "get"]);
    }

    #[test]
    fn huge_latencies_are_clamped_not_lost() {
        let mut r = Recorder::default();
        r.record(Command::Get, Duration::from_secs(10 * 3600));
        let h = r.histogram(Command::Get).unwrap();
        assert_eq!(h.len(), 1);
        assert!(h.max() >= MAX_LATENCY_US);
        let empty = LatencySummary::of(r.histogram(Command::Put).unwrap(), 1.0);
        assert_eq!((empty.count, empty.mean_us), (0, 0.0));
    }
}
