//! Reading back what the ledgers say must be there.

use std::sync::{Mutex, MutexGuard};
use std::thread;

use clap::ValueEnum;

use crate::error::OpError;
use crate::keyspace::{KeySpace, StoredValue, coord_of, decode_value};
use crate::ledger::Ledger;
use crate::rng::Rng;
use crate::target::{Connection, Connector};

/// How many keys `--verify sample` reads back at most.
pub const SAMPLE_KEYS: u64 = 10_000;
/// Mismatch descriptions kept for the report; the count is always exact.
pub const KEPT_MISMATCHES: usize = 20;
/// Connections used to read back.
const VERIFY_THREADS: usize = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum VerifyMode {
    /// Up to 10 000 randomly chosen keys.
    Sample,
    /// Every key.
    All,
    /// No read-back at the end (checks during the run and after crashes still happen).
    None,
}

impl VerifyMode {
    pub fn name(self) -> &'static str {
        match self {
            VerifyMode::Sample => "sample",
            VerifyMode::All => "all",
            VerifyMode::None => "none",
        }
    }
}

/// What a read-back found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyReport {
    pub mode: VerifyMode,
    pub keys_checked: u64,
    pub mismatches: u64,
    /// The first few mismatches, described.
    pub mismatch_samples: Vec<String>,
    /// Failures to read at all.
    pub errors: Vec<String>,
}

impl VerifyReport {
    pub fn new(mode: VerifyMode) -> VerifyReport {
        VerifyReport {
            mode,
            keys_checked: 0,
            mismatches: 0,
            mismatch_samples: Vec::new(),
            errors: Vec::new(),
        }
    }

    pub fn passed(&self) -> bool {
        self.mismatches == 0 && self.errors.is_empty()
    }

    pub fn add_mismatch(&mut self, description: String) {
        self.mismatches += 1;
        if self.mismatch_samples.len() < KEPT_MISMATCHES {
            self.mismatch_samples.push(description);
        }
    }

    pub fn absorb(&mut self, other: VerifyReport) {
        self.keys_checked += other.keys_checked;
        self.mismatches += other.mismatches;
        let room = KEPT_MISMATCHES.saturating_sub(self.mismatch_samples.len());
        self.mismatch_samples
            .extend(other.mismatch_samples.into_iter().take(room));
        self.errors.extend(other.errors);
    }
}

/// What to read back and what to do with it.
#[derive(Clone, Copy, Debug)]
pub struct ReadBack {
    pub mode: VerifyMode,
    pub value_size: usize,
    /// The target started empty, so keys never written must be absent;
    /// otherwise they are skipped (they may hold an earlier run's values).
    pub fresh: bool,
    /// Take what was found as the new known state (after a crash, this
    /// settles which writes in flight landed).
    pub settle: bool,
    pub seed: u64,
}

fn lock(ledger: &Mutex<Ledger>) -> MutexGuard<'_, Ledger> {
    ledger
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Reads back the keys `how` selects over a few connections. The client
/// threads must not be writing meanwhile.
pub fn read_back(
    connector: &dyn Connector,
    ledgers: &[Mutex<Ledger>],
    keys: &KeySpace,
    how: ReadBack,
) -> VerifyReport {
    let mut report = VerifyReport::new(how.mode);
    if how.mode == VerifyMode::None {
        return report;
    }
    let candidates: u64 = if how.fresh {
        keys.keys()
    } else {
        ledgers
            .iter()
            .map(|l| lock(l).iter().filter(|(_, s)| s.written()).count() as u64)
            .sum()
    };
    let share = match how.mode {
        VerifyMode::Sample if candidates > SAMPLE_KEYS => SAMPLE_KEYS as f64 / candidates as f64,
        _ => 1.0,
    };
    let threads = VERIFY_THREADS.min(ledgers.len()).max(1);
    thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|worker| {
                scope.spawn(move || {
                    let mut part = VerifyReport::new(how.mode);
                    let mut connection: Option<Box<dyn Connection>> = None;
                    for ledger in ledgers.iter().skip(worker).step_by(threads) {
                        let mut ledger = lock(ledger);
                        let mut rng = Rng::for_stream(how.seed ^ 0x5EED, ledger.client() as u64);
                        if let Err(e) = check_ledger(
                            connector,
                            &mut connection,
                            &mut ledger,
                            &mut rng,
                            share,
                            how,
                            &mut part,
                        ) {
                            part.errors.push(format!("reading back: {e}"));
                            break;
                        }
                    }
                    part
                })
            })
            .collect();
        for worker in workers {
            match worker.join() {
                Ok(part) => report.absorb(part),
                Err(_) => report.errors.push("a read-back thread panicked".to_owned()),
            }
        }
    });
    report
}

fn check_ledger(
    connector: &dyn Connector,
    connection: &mut Option<Box<dyn Connection>>,
    ledger: &mut Ledger,
    rng: &mut Rng,
    share: f64,
    how: ReadBack,
    report: &mut VerifyReport,
) -> Result<(), OpError> {
    let selected: Vec<u64> = ledger
        .iter()
        .filter(|(_, state)| how.fresh || state.written())
        .map(|(key, _)| key)
        .filter(|_| share >= 1.0 || rng.chance(share))
        .collect();
    for key in selected {
        let found = read_with_one_retry(connector, connection, key)?;
        report.keys_checked += 1;
        let decoded = match found.as_deref().map(|v| decode_value(v, how.value_size)) {
            None => None,
            Some(Ok(value)) => Some(value),
            Some(Err(problem)) => {
                report.add_mismatch(format!("key {key} at {}: {problem}", coord_of(key)));
                continue;
            }
        };
        match ledger.check_read(key, decoded) {
            Ok(()) => {
                if how.settle {
                    ledger.settle(key, decoded.map(|v: StoredValue| v.version));
                }
            }
            Err(problem) => report.add_mismatch(problem),
        }
    }
    Ok(())
}

/// A dropped connection is retried once on a fresh one.
fn read_with_one_retry(
    connector: &dyn Connector,
    connection: &mut Option<Box<dyn Connection>>,
    key: u64,
) -> Result<Option<Vec<u8>>, OpError> {
    for attempt in 0..2 {
        let live = match connection {
            Some(live) => live,
            None => connection.insert(connector.connect()?),
        };
        match live.get(coord_of(key)) {
            Ok(found) => return Ok(found),
            Err(OpError::Disconnected(_)) if attempt == 0 => *connection = None,
            Err(e) => return Err(e),
        }
    }
    Err(OpError::Disconnected(
        "reconnected and lost the connection again".to_owned(),
    ))
}
