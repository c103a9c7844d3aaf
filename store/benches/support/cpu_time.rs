//! A criterion measurement of this thread's CPU time instead of wall time.
//!
//! The project's machines are shared 2-core VMs where other builds and
//! stress runs come and go; wall-clock samples then measure the scheduler
//! as much as the code. The kernel's per-thread run time
//! (`/proc/thread-self/schedstat`) counts only the time this thread was on
//! a CPU. It advances in scheduler ticks (4 ms here), so benches using it
//! take flat samples of ~100 ms or more, keeping the tick error near 4 %.
//! Where the file cannot be read, it falls back to wall time.

use std::time::{Duration, Instant};

use criterion::measurement::{Measurement, ValueFormatter, WallTime};

static WALL: WallTime = WallTime;

/// Nanoseconds this thread has run, or `None` without `/proc`.
pub fn thread_cpu_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

pub struct CpuTime {
    /// Wall time stands in when `/proc` is not there.
    epoch: Instant,
}

impl CpuTime {
    pub fn new() -> CpuTime {
        CpuTime {
            epoch: Instant::now(),
        }
    }

    fn now_ns(&self) -> u64 {
        thread_cpu_ns().unwrap_or_else(|| self.epoch.elapsed().as_nanos() as u64)
    }
}

impl Measurement for CpuTime {
    type Intermediate = u64;
    type Value = Duration;

    fn start(&self) -> u64 {
        self.now_ns()
    }

    fn end(&self, started: u64) -> Duration {
        Duration::from_nanos(self.now_ns().saturating_sub(started))
    }

    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }

    fn zero(&self) -> Duration {
        Duration::ZERO
    }

    fn to_f64(&self, value: &Duration) -> f64 {
        value.as_nanos() as f64
    }

    fn formatter(&self) -> &dyn ValueFormatter {
        WALL.formatter()
    }
}
