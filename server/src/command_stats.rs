//! Per-command counters and server-side latency, updated lock-free by every
//! connection thread.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use cube_protocol::Opcode;

#[derive(Default)]
struct CommandCounters {
    count: AtomicU64,
    errors: AtomicU64,
    latency_us_total: AtomicU64,
    latency_us_max: AtomicU64,
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

pub struct CommandFigures {
    pub name: &'static str,
    pub count: u64,
    pub errors: u64,
    pub latency_us_mean: f64,
    pub latency_us_max: u64,
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
    }

    pub fn figures(&self) -> Vec<CommandFigures> {
        Opcode::ALL
            .iter()
            .map(|op| {
                let c = &self.per_opcode[slot(*op)];
                let count = c.count.load(Relaxed);
                CommandFigures {
                    name: op.name(),
                    count,
                    errors: c.errors.load(Relaxed),
                    latency_us_mean: if count == 0 {
                        0.0
                    } else {
                        c.latency_us_total.load(Relaxed) as f64 / count as f64
                    },
                    latency_us_max: c.latency_us_max.load(Relaxed),
                }
            })
            .collect()
    }
}
