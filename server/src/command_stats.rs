//! Per-command counters and server-side latency, updated by every
//! connection thread (and by the writer thread, which answers writes).
//!
//! Counts are atomics. Latency goes into HdrHistograms (microseconds, 3
//! significant digits), one per command per stripe: a thread records into
//! the stripe its id picks, so 64 connection threads rarely meet on one
//! lock; `stats` merges the stripes.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

use cube_metrics::{LATENCY_BUCKETS_US, latency_bucket_row, latency_sum_row};
use cube_protocol::{Opcode, StatsEntry, StatsValue};
use hdrhistogram::Histogram;

/// Histogram stripes per command.
const STRIPES: usize = 8;
/// Latencies above this (60 s) are clamped: nothing answers that slowly
/// without having failed already.
const MAX_LATENCY_US: u64 = 60_000_000;

#[derive(Default)]
struct CommandCounters {
    count: AtomicU64,
    errors: AtomicU64,
    latency_us_total: AtomicU64,
    latency_us_max: AtomicU64,
    latency: [Mutex<Option<Histogram<u64>>>; STRIPES],
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn new_histogram() -> Option<Histogram<u64>> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).ok()
}

static NEXT_STRIPE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static STRIPE: Cell<usize> = Cell::new(NEXT_STRIPE.fetch_add(1, Relaxed) % STRIPES);
}

/// Counters for each opcode plus connection-level events.
#[derive(Default)]
pub struct CommandStats {
    per_opcode: [CommandCounters; Opcode::ALL.len()],
    pub connections_accepted: AtomicU64,
    pub connections_refused: AtomicU64,
    pub connections_timed_out: AtomicU64,
    pub bad_frames: AtomicU64,
}

fn slot(op: Opcode) -> usize {
    Opcode::ALL.iter().position(|o| *o == op).unwrap_or(0)
}

/// Cumulative counts up to each of [`LATENCY_BUCKETS_US`], then the total,
/// in one pass over the recorded values (a `count_between` per bound walks
/// the whole histogram each time: 100 ms for a `stats` in a debug build).
fn cumulative_buckets(h: &Histogram<u64>) -> Vec<u64> {
    let mut counts = vec![0u64; LATENCY_BUCKETS_US.len()];
    for v in h.iter_recorded() {
        let value = v.value_iterated_to();
        let slot = LATENCY_BUCKETS_US.partition_point(|bound| *bound < value);
        if let Some(count) = counts.get_mut(slot) {
            *count += v.count_at_value();
        }
    }
    let mut so_far = 0;
    for count in &mut counts {
        so_far += *count;
        *count = so_far;
    }
    counts.push(h.len());
    counts
}

pub struct CommandFigures {
    pub name: &'static str,
    pub count: u64,
    pub errors: u64,
    pub latency_us_mean: f64,
    pub latency_us_max: u64,
    pub latency_us_p50: u64,
    pub latency_us_p99: u64,
    pub latency_us_p999: u64,
    /// Sum of every latency (us), for the histogram's `_sum`.
    pub latency_us_total: u64,
    /// Cumulative counts up to each of [`LATENCY_BUCKETS_US`], then the
    /// total the histogram holds; empty for a command never served.
    pub latency_us_buckets: Vec<u64>,
}

impl CommandStats {
    pub fn record(&self, op: Opcode, latency_us: u64, ok: bool) {
        let c = &self.per_opcode[slot(op)];
        c.count.fetch_add(1, Relaxed);
        if !ok {
            c.errors.fetch_add(1, Relaxed);
        }
        c.latency_us_total.fetch_add(latency_us, Relaxed);
        c.latency_us_max.fetch_max(latency_us, Relaxed);
        let stripe = STRIPE.with(Cell::get);
        let mut histogram = lock(&c.latency[stripe]);
        if histogram.is_none() {
            *histogram = new_histogram();
        }
        if let Some(h) = histogram.as_mut() {
            h.saturating_record(latency_us.clamp(1, MAX_LATENCY_US));
        }
    }

    pub fn figures(&self) -> Vec<CommandFigures> {
        Opcode::ALL
            .iter()
            .map(|op| {
                let c = &self.per_opcode[slot(*op)];
                let count = c.count.load(Relaxed);
                let mut merged = new_histogram();
                for stripe in &c.latency {
                    if let (Some(m), Some(h)) = (merged.as_mut(), lock(stripe).as_ref()) {
                        let _ = m.add(h);
                    }
                }
                let quantile = |q: f64| merged.as_ref().map_or(0, |h| h.value_at_quantile(q));
                let buckets = merged
                    .as_ref()
                    .filter(|h| !h.is_empty())
                    .map_or_else(Vec::new, cumulative_buckets);
                CommandFigures {
                    latency_us_p50: quantile(0.5),
                    latency_us_p99: quantile(0.99),
                    latency_us_p999: quantile(0.999),
                    name: op.name(),
                    count,
                    errors: c.errors.load(Relaxed),
                    latency_us_mean: if count == 0 {
                        0.0
                    } else {
                        c.latency_us_total.load(Relaxed) as f64 / count as f64
                    },
                    latency_us_max: c.latency_us_max.load(Relaxed),
                    latency_us_total: c.latency_us_total.load(Relaxed),
                    latency_us_buckets: buckets,
                }
            })
            .collect()
    }

    /// The `cmd.NAME.*` rows of `stats`: count, errors, latency mean,
    /// percentiles and maximum; and, for commands served at least once, the
    /// histogram rows Prometheus needs (`cube_metrics`: the latency sum and
    /// cumulative bucket counts), which `cubec stats` shows with `--all`.
    pub fn entries(&self) -> Vec<StatsEntry> {
        let count = |name: String, value: u64| StatsEntry {
            name,
            value: StatsValue::Count(value),
        };
        let mut entries = Vec::new();
        for c in self.figures() {
            entries.push(count(format!("cmd.{}.count", c.name), c.count));
            entries.push(count(format!("cmd.{}.errors", c.name), c.errors));
            entries.push(StatsEntry {
                name: format!("cmd.{}.latency_us_mean", c.name),
                value: StatsValue::Float(c.latency_us_mean),
            });
            for (figure, value) in [
                ("p50", c.latency_us_p50),
                ("p99", c.latency_us_p99),
                ("p999", c.latency_us_p999),
                ("max", c.latency_us_max),
            ] {
                entries.push(count(format!("cmd.{}.latency_us_{figure}", c.name), value));
            }
            if c.latency_us_buckets.is_empty() {
                continue;
            }
            entries.push(count(latency_sum_row(c.name), c.latency_us_total));
            let bounds = LATENCY_BUCKETS_US.iter().map(|b| Some(*b)).chain([None]);
            for (bound, cumulative) in bounds.zip(&c.latency_us_buckets) {
                entries.push(count(latency_bucket_row(c.name, bound), *cumulative));
            }
        }
        entries
    }
}
