//! One run: start the target, fill the key space if the workload reads,
//! let the client threads loose for the warmup and the measured window
//! (crashing the daemon on schedule), then read back and report.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use cube_client::{StatsEntry, StatsValue};

use crate::error::{OpError, StressError};
use crate::hostile::{self, HostileCounts, MAX_HOSTILE};
use crate::keyspace::{KeySpace, MIN_VALUE_BYTES, coord_of, decode_value, encode_value};
use crate::latency::Recorder;
use crate::ledger::Ledger;
use crate::program_workload::{self, CounterLedger};
use crate::report::{CrashReport, RunReport};
use crate::rng::Rng;
use crate::target::ProgramConnection;
use crate::target::{Connection, Connector, RunningTarget, TargetKind, TargetSpec};
use crate::verify::{self, ReadBack, VerifyMode, VerifyReport};
use crate::walk_workload;
use crate::workload::{Command, Op, Workload, WorkloadKind, mget_keys};

/// Error descriptions kept per run; the count is always exact.
const KEPT_ERRORS: usize = 10;
/// Keys per batch when filling the key space.
const PREFILL_BATCH: usize = 256;
/// Connections used to fill the key space (the durable targets commit a
/// batch per request, so parallel batches share fsyncs).
const PREFILL_THREADS: usize = 16;
/// How long the crash controller waits for every client to stop after a
/// kill; past it the run fails rather than verify a moving state.
const PARK_DEADLINE: Duration = Duration::from_secs(90);
/// How often the main thread looks at the clock and the clients.
const TICK: Duration = Duration::from_millis(20);

/// Everything a run needs to know.
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub target: TargetSpec,
    pub workload: Workload,
    pub clients: usize,
    pub duration: Duration,
    pub warmup: Duration,
    pub value_size: usize,
    pub keys: u64,
    pub seed: u64,
    /// Total requests per second across clients (open loop); `None` for a
    /// closed loop.
    pub rate: Option<f64>,
    pub verify: VerifyMode,
    pub crash_every: Option<Duration>,
    /// Hostile threads beside the clients (`hostile.rs`), from the start
    /// of the warmup to the end of the measured window; 0 for none.
    pub hostile: usize,
    /// Progress lines on stderr.
    pub progress: bool,
    /// The key space already holds version 1 of every key (`cube-stress
    /// scale`'s data set): nothing is filled, and the ledgers start from
    /// that version without a state per key.
    pub preloaded: bool,
}

impl RunConfig {
    /// A closed-loop run of `workload` against `target` with every other
    /// setting at its plainest: one client for a second, no warmup, 64-byte
    /// values over `keys` keys, seed 1, no read-back, no crashes, no hostile
    /// threads, no progress lines, nothing preloaded. Callers change what
    /// they need with struct update syntax.
    pub fn new(target: TargetSpec, workload: Workload, keys: u64) -> RunConfig {
        RunConfig {
            target,
            workload,
            clients: 1,
            duration: Duration::from_secs(1),
            warmup: Duration::ZERO,
            value_size: 64,
            keys,
            seed: 1,
            rate: None,
            verify: VerifyMode::None,
            crash_every: None,
            hostile: 0,
            progress: false,
            preloaded: false,
        }
    }

    /// Checks what can be checked before anything starts.
    pub fn validate(&self) -> Result<KeySpace, StressError> {
        let keys = KeySpace::new(self.keys, self.clients).map_err(StressError::Usage)?;
        if self.value_size < MIN_VALUE_BYTES {
            return Err(StressError::Usage(format!(
                "--value-size {} is too small: values carry a {MIN_VALUE_BYTES}-byte header \
                 (key and version) so reads can be checked",
                self.value_size
            )));
        }
        if self.duration.is_zero() {
            return Err(StressError::Usage(
                "--duration must be more than 0".to_owned(),
            ));
        }
        if let Some(rate) = self.rate
            && !(rate.is_finite() && rate > 0.0)
        {
            return Err(StressError::Usage(format!(
                "--rate {rate} must be a positive number of requests per second"
            )));
        }
        self.check_workload_on_target()?;
        self.check_hostile_and_crashes()?;
        Ok(keys)
    }

    /// The workload against the target: edges and programs are cube's
    /// only; a preloaded key space holds cells only.
    fn check_workload_on_target(&self) -> Result<(), StressError> {
        if self.workload.kind.needs_edges() && self.target.kind != TargetKind::Cube {
            return Err(StressError::Usage(format!(
                "the {} workload needs edges (link, walk, path), which only cube has; \
                 use --target cube",
                self.workload.name()
            )));
        }
        if self.workload.kind == WorkloadKind::Programs && self.target.kind != TargetKind::Cube {
            return Err(StressError::Usage(
                "the seed workload runs cell programs (prog, run), which only cube has; \
                 use --target cube"
                    .to_owned(),
            ));
        }
        if self.preloaded
            && !matches!(
                self.workload.kind,
                WorkloadKind::Get | WorkloadKind::Mget | WorkloadKind::Mixed | WorkloadKind::Put
            )
        {
            return Err(StressError::Usage(format!(
                "the {} workload does not run on a preloaded key space (cells only)",
                self.workload.name()
            )));
        }
        Ok(())
    }

    /// `--hostile` and `--crash-every`: cube's only, within their limits,
    /// and not together.
    fn check_hostile_and_crashes(&self) -> Result<(), StressError> {
        if self.hostile > 0 {
            if self.target.kind != TargetKind::Cube {
                return Err(StressError::Usage(
                    "--hostile is for --target cube: the hostile clients speak cube's protocol"
                        .to_owned(),
                ));
            }
            if self.hostile > MAX_HOSTILE {
                return Err(StressError::Usage(format!(
                    "--hostile {} is over {MAX_HOSTILE}",
                    self.hostile
                )));
            }
            if self.crash_every.is_some() {
                return Err(StressError::Usage(
                    "--hostile and --crash-every do not mix: a crash would cut the hostile \
                     clients off too, and the comparison would measure restarts"
                        .to_owned(),
                ));
            }
        }
        if let Some(every) = self.crash_every {
            if every.is_zero() {
                return Err(StressError::Usage(
                    "--crash-every must be more than 0 seconds".to_owned(),
                ));
            }
            if self.target.kind != TargetKind::Cube || self.target.socket.is_some() {
                return Err(StressError::Usage(
                    "--crash-every needs a throwaway cubed (--target cube without --socket): \
                     the driver can only kill a daemon it started"
                        .to_owned(),
                ));
            }
        }
        Ok(())
    }
}

/// Runs `config` to the end. `Err` means the run could not happen; a run
/// that found errors or lost writes returns a report that says so.
pub fn run(config: &RunConfig) -> Result<RunReport, StressError> {
    let keys = config.validate()?;
    say(config, format!("starting {}", config.target.kind.name()));
    let mut target = RunningTarget::start(&config.target)?;
    say(config, target.detail.clone());
    let connector = target.connector.clone();
    let baseline = u64::from(config.preloaded);
    let ledgers: Vec<Mutex<Ledger>> = (0..config.clients)
        .map(|client| Mutex::new(Ledger::with_baseline(client, keys, baseline)))
        .collect();
    let prefilled = if config.preloaded {
        Prefilled {
            seconds: None,
            counter_baseline: Vec::new(),
        }
    } else {
        prefill_workload(config, connector.as_ref(), &ledgers, &keys)?
    };
    let hostile_socket = start_hostile(config, &target)?;

    let counter_ledger = CounterLedger::new(prefilled.counter_baseline);
    let control = Control::new(config.clients);
    let shared = Shared {
        connector: connector.as_ref(),
        ledgers: &ledgers,
        keys,
        config,
        control: &control,
        counters: &counter_ledger,
    };
    let ran = run_clients(&shared, &mut target, hostile_socket.as_deref())?;
    let tally = Tally::of(config.verify, ran.outcomes)?;

    let (server, server_error) = match connector.server_figures() {
        Ok(figures) => (figures, None),
        Err(e) => (Vec::new(), Some(e)),
    };
    let verification = read_back_at_end(&shared, target.fresh);
    let daemon_log = (tally.errors > 0 || !verification.passed() || tally.live.mismatches > 0)
        .then(|| target.log_text())
        .flatten();
    Ok(RunReport {
        target: target.name().to_owned(),
        target_detail: target.detail.clone(),
        workload: config.workload,
        clients: config.clients,
        duration_s: ran.measured.as_secs_f64(),
        warmup_s: config.warmup.as_secs_f64(),
        value_size_bytes: config.value_size,
        keys: keys.keys(),
        seed: config.seed,
        rate_ops_per_sec: config.rate,
        prefill_s: prefilled.seconds,
        errors: tally.errors,
        error_samples: tally.error_samples,
        reconnects: tally.reconnects,
        live_mismatches: tally.live,
        latencies: tally.latencies,
        server,
        server_error,
        verification,
        crashes: ran.crashes,
        daemon_log,
        hostile: ran.hostile,
    })
}

/// A progress line on stderr, when `--progress` asked for them.
fn say(config: &RunConfig, text: String) {
    if config.progress {
        eprintln!("cube-stress: {text}");
    }
}

/// What filling the key space before the run did.
struct Prefilled {
    /// How long it took; `None`: the workload needs nothing filled.
    seconds: Option<f64>,
    /// The counter cells' baseline (empty but for the seed workload).
    counter_baseline: Vec<(u64, u64)>,
}

/// Fills what the workload reads before the clients start: every key,
/// the lattice's edges, or a counter program in each seed cell.
fn prefill_workload(
    config: &RunConfig,
    connector: &dyn Connector,
    ledgers: &[Mutex<Ledger>],
    keys: &KeySpace,
) -> Result<Prefilled, StressError> {
    let mut counter_baseline = Vec::new();
    let started = Instant::now();
    let filled = if config.workload.needs_prefill() {
        prefill(connector, ledgers, keys, config.value_size)?;
        format!("wrote all {} keys", keys.keys())
    } else if config.workload.kind.needs_edges() {
        let edges = prefill_edges(connector, keys)?;
        format!("linked {edges} lattice edges between {} keys", keys.keys())
    } else if config.workload.kind == WorkloadKind::Programs {
        let cells = program_workload::cells(keys);
        let mut connection = connector
            .connect()
            .map_err(|e| StressError::target("prefill", e.to_string()))?;
        counter_baseline = program_workload::prefill(connection.as_mut(), cells)
            .map_err(|e| StressError::target("prefill", e))?;
        format!("stored a counter program at {cells} seed cells")
    } else {
        return Ok(Prefilled {
            seconds: None,
            counter_baseline,
        });
    };
    let seconds = started.elapsed().as_secs_f64();
    say(config, format!("{filled} in {seconds:.2} s"));
    Ok(Prefilled {
        seconds: Some(seconds),
        counter_baseline,
    })
}

/// Readies the target for `--hostile` threads: the socket they are
/// hostile to, or `None` when the run has none.
fn start_hostile(
    config: &RunConfig,
    target: &RunningTarget,
) -> Result<Option<std::path::PathBuf>, StressError> {
    if config.hostile == 0 {
        return Ok(None);
    }
    let socket = hostile::socket_of(target.socket())?;
    hostile::prepare(&socket)?;
    say(
        config,
        format!(
            "{} hostile threads (slowloris, non-readers, connection flood) beside the clients",
            config.hostile
        ),
    );
    Ok(Some(socket))
}

/// What the client threads, and the hostile ones, did over the run.
struct ClientsRan {
    outcomes: Vec<ClientOutcome>,
    /// The measured window, crash pauses excluded.
    measured: Duration,
    crashes: Vec<CrashReport>,
    hostile: Option<HostileCounts>,
}

/// Lets the client threads (and the hostile ones, on `hostile_socket`)
/// loose for the warmup and the measured window, crashing the target on
/// schedule, and joins them.
fn run_clients(
    shared: &Shared<'_>,
    target: &mut RunningTarget,
    hostile_socket: Option<&std::path::Path>,
) -> Result<ClientsRan, StressError> {
    let config = shared.config;
    let hostile_stop = AtomicBool::new(false);
    let mut ran = ClientsRan {
        outcomes: Vec::new(),
        measured: Duration::ZERO,
        crashes: Vec::new(),
        hostile: None,
    };
    thread::scope(|scope| -> Result<(), StressError> {
        // Whatever happens, the hostile threads are told to stop, or the
        // scope would wait for them forever.
        let _stop_hostile = SetOnDrop(&hostile_stop);
        let hostile_handles = match hostile_socket {
            Some(socket) => hostile::start(scope, socket, config.hostile, &hostile_stop)?,
            None => Vec::new(),
        };
        let handles: Vec<_> = (0..config.clients)
            .map(|client| {
                thread::Builder::new()
                    .name(format!("client-{client}"))
                    .spawn_scoped(scope, move || client_loop(shared, client))
            })
            .collect::<Result<_, _>>()
            .map_err(|e| StressError::io("cannot start a client thread", e))?;
        say(
            config,
            format!(
                "{} clients running {}: {:.1} s warmup, then {:.1} s measured",
                config.clients,
                config.workload.name(),
                config.warmup.as_secs_f64(),
                config.duration.as_secs_f64()
            ),
        );
        let timeline = drive(shared, target, &mut ran.crashes);
        shared.control.finish();
        hostile_stop.store(true, Ordering::Relaxed);
        if hostile_socket.is_some() {
            ran.hostile = Some(hostile::finish(hostile_handles));
        }
        for handle in handles {
            match handle.join() {
                Ok(outcome) => ran.outcomes.push(outcome),
                Err(_) => ran.outcomes.push(ClientOutcome::panicked()),
            }
        }
        ran.measured = timeline?;
        Ok(())
    })?;
    Ok(ran)
}

/// The client threads' outcomes added up.
struct Tally {
    latencies: Recorder,
    errors: u64,
    error_samples: Vec<String>,
    reconnects: u64,
    live: VerifyReport,
}

impl Tally {
    fn of(verify: VerifyMode, outcomes: Vec<ClientOutcome>) -> Result<Tally, StressError> {
        let mut tally = Tally {
            latencies: Recorder::default(),
            errors: 0,
            error_samples: Vec::new(),
            reconnects: 0,
            live: VerifyReport::new(verify),
        };
        for outcome in outcomes {
            tally
                .latencies
                .merge(&outcome.recorder)
                .map_err(|e| StressError::target("cube-stress", e))?;
            tally.errors += outcome.errors;
            tally.reconnects += outcome.reconnects;
            let room = KEPT_ERRORS.saturating_sub(tally.error_samples.len());
            tally
                .error_samples
                .extend(outcome.error_samples.into_iter().take(room));
            tally.live.absorb(outcome.mismatches);
        }
        Ok(tally)
    }
}

/// Reads every key back as `--verify` asks, and checks the seed cells'
/// telemetry against the runs acknowledged.
fn read_back_at_end(shared: &Shared<'_>, fresh: bool) -> VerifyReport {
    let config = shared.config;
    if config.verify != VerifyMode::None {
        say(config, format!("reading back ({})", config.verify.name()));
    }
    let mut verification = verify::read_back(
        shared.connector,
        shared.ledgers,
        &shared.keys,
        ReadBack {
            mode: config.verify,
            value_size: config.value_size,
            fresh,
            settle: false,
            seed: config.seed,
        },
    );
    if shared.counters.cells() > 0 {
        say(
            config,
            format!(
                "checking the telemetry of {} seed cells",
                shared.counters.cells()
            ),
        );
        verification.absorb(program_workload::check(shared.connector, shared.counters));
    }
    verification
}

/// The main thread's part while the clients run: warmup, the measured
/// window, crashes on schedule. Returns the measured time (crash pauses
/// excluded).
fn drive(
    shared: &Shared<'_>,
    target: &mut RunningTarget,
    crashes: &mut Vec<CrashReport>,
) -> Result<Duration, StressError> {
    let config = shared.config;
    let control = shared.control;
    let warmup_end = Instant::now() + config.warmup;
    while Instant::now() < warmup_end && !control.all_exited() {
        thread::sleep(TICK.min(warmup_end.saturating_duration_since(Instant::now())));
    }
    control.recording.store(true, Ordering::Relaxed);
    let measure_start = Instant::now();
    let mut paused = Duration::ZERO;
    let mut next_crash = config.crash_every;
    loop {
        let active = measure_start.elapsed().saturating_sub(paused);
        if active >= config.duration || control.all_exited() {
            break;
        }
        if let Some(at) = next_crash
            && active >= at
        {
            let started = Instant::now();
            let report = crash_cycle(shared, target, active)?;
            paused += started.elapsed();
            let passed = report.verification.passed();
            if config.progress {
                eprintln!(
                    "cube-stress: crash {} at {:.1} s: restarted in {:.0} ms, {} keys verified{}",
                    crashes.len() + 1,
                    report.at_s,
                    report.restart_ms,
                    report.verification.keys_checked,
                    if passed { "" } else { ", MISMATCHES" }
                );
            }
            crashes.push(report);
            if !passed {
                break;
            }
            next_crash = config.crash_every.map(|every| at + every);
            continue;
        }
        let until = next_crash.map_or(config.duration, |at| at.min(config.duration));
        thread::sleep(
            TICK.min(until.saturating_sub(active))
                .max(Duration::from_millis(1)),
        );
    }
    Ok(measure_start.elapsed().saturating_sub(paused))
}

/// Kill -9, restart on the same data, wait for every client to stop, read
/// back every key, let the clients go on.
fn crash_cycle(
    shared: &Shared<'_>,
    target: &mut RunningTarget,
    active: Duration,
) -> Result<CrashReport, StressError> {
    let control = shared.control;
    // Clients see the pause only between requests, so the ones waiting for
    // an answer are cut off by the kill: the writes in flight are the
    // interesting part.
    control.paused.store(true, Ordering::SeqCst);
    let restart = target.crash_and_restart()?;
    if !control.wait_all_parked(PARK_DEADLINE) {
        return Err(StressError::target(
            target.name(),
            format!(
                "client threads did not stop within {} s of the crash",
                PARK_DEADLINE.as_secs()
            ),
        ));
    }
    let uncertain_writes = shared
        .ledgers
        .iter()
        .map(|l| lock(l).uncertain_count() as u64)
        .sum();
    let figures = shared.connector.server_figures().unwrap_or_default();
    let verification = verify::read_back(
        shared.connector,
        shared.ledgers,
        &shared.keys,
        ReadBack {
            mode: VerifyMode::All,
            value_size: shared.config.value_size,
            fresh: true,
            settle: true,
            seed: shared.config.seed,
        },
    );
    control.resume();
    Ok(CrashReport {
        at_s: active.as_secs_f64(),
        restart_ms: restart.as_secs_f64() * 1000.0,
        server_recovery_ms: count_figure(&figures, "recovery.ms"),
        records_replayed: count_figure(&figures, "recovery.records_replayed"),
        uncertain_writes,
        verification,
    })
}

fn count_figure(figures: &[StatsEntry], name: &str) -> Option<u64> {
    figures.iter().find_map(|entry| match entry.value {
        StatsValue::Count(n) if entry.name == name => Some(n),
        _ => None,
    })
}

/// Writes version 1 of every key, in batches over parallel connections.
fn prefill(
    connector: &dyn Connector,
    ledgers: &[Mutex<Ledger>],
    keys: &KeySpace,
    value_size: usize,
) -> Result<(), StressError> {
    let batches: Vec<(u64, u64)> = (0..keys.keys())
        .step_by(PREFILL_BATCH)
        .map(|start| (start, (start + PREFILL_BATCH as u64).min(keys.keys())))
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = PREFILL_THREADS.min(batches.len()).max(1);
    let failures: Vec<String> = thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| -> Result<(), OpError> {
                    let mut connection = connector.connect()?;
                    let mut value = Vec::with_capacity(value_size);
                    while let Some(&(start, end)) =
                        batches.get(next.fetch_add(1, Ordering::Relaxed))
                    {
                        let items: Vec<_> = (start..end)
                            .map(|key| {
                                encode_value(key, 1, value_size, &mut value);
                                (coord_of(key), value.clone())
                            })
                            .collect();
                        connection.put_many(&items)?;
                    }
                    Ok(())
                })
            })
            .collect();
        prefill_failures(workers)
    });
    prefill_outcome(&failures, "write the key space")?;
    for ledger in ledgers {
        let mut ledger = lock(ledger);
        let version = ledger.next_version();
        let owned: Vec<u64> = ledger.iter().map(|(key, _)| key).collect();
        for key in owned {
            ledger.acked(key, version);
        }
    }
    Ok(())
}

/// Links every key to its lattice neighbours (the `walk` workload's
/// starting graph), over parallel connections; returns the edge count.
fn prefill_edges(connector: &dyn Connector, keys: &KeySpace) -> Result<u64, StressError> {
    let edges: Vec<(u64, u64)> = walk_workload::lattice(keys).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = PREFILL_THREADS.min(edges.len()).max(1);
    let failures: Vec<String> = thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| -> Result<(), OpError> {
                    let mut connection = connector.connect()?;
                    while let Some(&(from, to)) = edges.get(next.fetch_add(1, Ordering::Relaxed)) {
                        let (from, to) = walk_workload::edge_coords(from, to);
                        connection.link(from, to)?;
                    }
                    Ok(())
                })
            })
            .collect();
        prefill_failures(workers)
    });
    prefill_outcome(&failures, "link the lattice")?;
    Ok(edges.len() as u64)
}

/// What every client thread shares.
struct Shared<'a> {
    connector: &'a dyn Connector,
    ledgers: &'a [Mutex<Ledger>],
    keys: KeySpace,
    config: &'a RunConfig,
    control: &'a Control,
    /// Runs acknowledged per counter cell (`seed` workload only).
    counters: &'a CounterLedger,
}

/// Sets its flag when dropped: a stop signal that no early return skips.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Start, pause and stop signals between the main thread and the clients.
struct Control {
    stop: AtomicBool,
    recording: AtomicBool,
    paused: AtomicBool,
    threads: Mutex<ThreadCounts>,
    changed: Condvar,
}

struct ThreadCounts {
    running: usize,
    parked: usize,
}

impl Control {
    fn new(clients: usize) -> Control {
        Control {
            stop: AtomicBool::new(false),
            recording: AtomicBool::new(false),
            paused: AtomicBool::new(false),
            threads: Mutex::new(ThreadCounts {
                running: clients,
                parked: 0,
            }),
            changed: Condvar::new(),
        }
    }

    fn counts(&self) -> MutexGuard<'_, ThreadCounts> {
        self.threads
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// Called by a client thread that saw the pause: waits for the resume.
    fn park(&self) {
        let mut counts = self.counts();
        counts.parked += 1;
        self.changed.notify_all();
        while self.paused() && !self.stopping() {
            counts = self
                .changed
                .wait(counts)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        counts.parked -= 1;
    }

    fn exited(&self) {
        let mut counts = self.counts();
        counts.running -= 1;
        self.changed.notify_all();
    }

    fn all_exited(&self) -> bool {
        self.counts().running == 0
    }

    fn wait_all_parked(&self, deadline: Duration) -> bool {
        let until = Instant::now() + deadline;
        let mut counts = self.counts();
        while counts.parked < counts.running {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            counts = self
                .changed
                .wait_timeout(counts, left)
                .map(|(guard, _)| guard)
                .unwrap_or_else(|poisoned| poisoned.into_inner().0);
        }
        true
    }

    fn resume(&self) {
        self.paused.store(false, Ordering::SeqCst);
        // Taking the lock orders the store before any parked thread's
        // next look at `paused`.
        let _counts = self.counts();
        self.changed.notify_all();
    }

    fn finish(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.resume();
    }
}

fn lock(ledger: &Mutex<Ledger>) -> MutexGuard<'_, Ledger> {
    ledger
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What one client thread brings back.
struct ClientOutcome {
    recorder: Recorder,
    errors: u64,
    error_samples: Vec<String>,
    reconnects: u64,
    mismatches: VerifyReport,
}

impl ClientOutcome {
    fn new() -> ClientOutcome {
        ClientOutcome {
            recorder: Recorder::default(),
            errors: 0,
            error_samples: Vec::new(),
            reconnects: 0,
            mismatches: VerifyReport::new(VerifyMode::None),
        }
    }

    fn panicked() -> ClientOutcome {
        let mut outcome = ClientOutcome::new();
        outcome.error("a client thread panicked".to_owned());
        outcome
    }

    fn error(&mut self, description: String) {
        self.errors += 1;
        if self.error_samples.len() < KEPT_ERRORS {
            self.error_samples.push(description);
        }
    }
}

/// Why one request did not count as a success.
enum Failure {
    Op(OpError),
    /// The answer was wrong: a read found what no write put there.
    Mismatch(String),
    /// Several wrong answers in one request (an `mget`), one description
    /// each.
    Mismatches(Vec<String>),
}

fn client_loop(shared: &Shared<'_>, client: usize) -> ClientOutcome {
    let config = shared.config;
    let control = shared.control;
    let mut outcome = ClientOutcome::new();
    let mut rng = Rng::for_stream(config.seed, client as u64);
    let mut connection: Option<Box<dyn Connection>> = None;
    let mut value = Vec::with_capacity(config.value_size);
    let mut pacer = Pacer::new(
        config
            .rate
            .map(|rate| Duration::from_secs_f64(config.clients as f64 / rate)),
    );
    while !control.stopping() {
        if control.paused() {
            connection = None;
            control.park();
            pacer.restart();
            continue;
        }
        let live = match &mut connection {
            Some(live) => live,
            None => match shared.connector.connect() {
                Ok(fresh) => connection.insert(fresh),
                Err(_) if control.paused() => continue,
                Err(e) => {
                    outcome.error(format!("client {client}: cannot connect: {e}"));
                    break;
                }
            },
        };
        let op = config.workload.next_op(&mut rng, &shared.keys, client);
        let started = pacer.wait_turn();
        let recording = control.recording.load(Ordering::Relaxed);
        let result = execute(shared, client, live.as_mut(), op, &mut value);
        let connected = outcome.note(client, op, result, started, recording, control.paused());
        if !connected {
            connection = None;
        }
    }
    control.exited();
    outcome
}

/// When each request of a client is due at `--rate`: one every
/// `interval`, or as fast as answers come without a rate.
struct Pacer {
    interval: Option<Duration>,
    due: Instant,
}

impl Pacer {
    fn new(interval: Option<Duration>) -> Pacer {
        Pacer {
            interval,
            due: Instant::now(),
        }
    }

    /// After a pause: the next request is due now.
    fn restart(&mut self) {
        self.due = Instant::now();
    }

    /// Waits until the next request is due; the instant it is timed from.
    /// Open loop: a request sent late because earlier answers were slow
    /// is timed from when it was due, so the wait counts (no coordinated
    /// omission). One sent on time is timed from when it was sent, so the
    /// sleep's own overshoot is not blamed on the target.
    fn wait_turn(&mut self) -> Instant {
        let Some(interval) = self.interval else {
            return Instant::now();
        };
        let now = Instant::now();
        let scheduled = self.due;
        self.due += interval;
        if scheduled > now {
            thread::sleep(scheduled - now);
            Instant::now()
        } else {
            scheduled
        }
    }
}

impl ClientOutcome {
    /// Records how `op` (timed from `started`) went: its latency while
    /// `recording`, or its error. Whether the connection is still usable.
    fn note(
        &mut self,
        client: usize,
        op: Op,
        result: Result<(), Failure>,
        started: Instant,
        recording: bool,
        paused: bool,
    ) -> bool {
        match result {
            Ok(()) => {
                if recording {
                    let elapsed = started.elapsed();
                    self.recorder.record(op.command(), elapsed);
                    // A pipelined pair is a prog and a run, both answered
                    // in one round trip.
                    if let Op::ProgRun { .. } = op {
                        self.recorder.record(Command::Run, elapsed);
                    }
                }
            }
            Err(Failure::Op(OpError::Disconnected(_))) if paused => {
                self.reconnects += 1;
                return false;
            }
            Err(Failure::Op(e)) => {
                self.error(format!("client {client}: {}: {e}", describe(op)));
                return !matches!(e, OpError::Disconnected(_));
            }
            Err(Failure::Mismatch(problem)) => self.mismatches.add_mismatch(problem),
            Err(Failure::Mismatches(problems)) => problems
                .into_iter()
                .for_each(|problem| self.mismatches.add_mismatch(problem)),
        }
        true
    }
}

fn describe(op: Op) -> String {
    match op {
        Op::Put { key } => format!("put key {key} at {}", coord_of(key)),
        Op::Get { key } => format!("get key {key} at {}", coord_of(key)),
        Op::Mget { batch, .. } => format!("mget of {batch} keys"),
        Op::Link { from, to } => format!("link {} -> {}", coord_of(from), coord_of(to)),
        Op::Unlink { from, to } => format!("unlink {} -> {}", coord_of(from), coord_of(to)),
        Op::Walk { key } => format!("walk from key {key} at {}", coord_of(key)),
        Op::Path { from, to } => format!("path {} -> {}", coord_of(from), coord_of(to)),
        Op::Prog { cell, .. } => format!("prog at seed cell {}", program_workload::coord(cell)),
        Op::Run { cell } => format!("run at seed cell {}", program_workload::coord(cell)),
        Op::ProgRun { cell, .. } => format!(
            "pipelined prog and run at seed cell {}",
            program_workload::coord(cell)
        ),
        Op::Step { first_cell, cells } => {
            let (lo, hi) = program_workload::step_box(first_cell, cells);
            format!("step over seed cells {lo}..={hi}")
        }
        Op::CellStats { cell } => {
            format!("cell-stats at seed cell {}", program_workload::coord(cell))
        }
    }
}

/// Runs one request and checks its answer.
fn execute(
    shared: &Shared<'_>,
    client: usize,
    connection: &mut dyn Connection,
    op: Op,
    value: &mut Vec<u8>,
) -> Result<(), Failure> {
    match op {
        Op::Put { key } => execute_put(shared, client, connection, key, value),
        Op::Get { key } => {
            let found = connection.get(coord_of(key)).map_err(Failure::Op)?;
            check_read(shared, client, key, found.as_deref()).map_err(Failure::Mismatch)
        }
        Op::Mget { draw, batch } => execute_mget(shared, client, connection, draw, batch),
        Op::Link { from, to } => connection
            .link(coord_of(from), coord_of(to))
            .map_err(Failure::Op),
        Op::Unlink { from, to } => connection
            .unlink(coord_of(from), coord_of(to))
            .map_err(Failure::Op),
        Op::Walk { key } => {
            let start = coord_of(key);
            let nodes = connection
                .walk(start, walk_workload::WALK_DEPTH)
                .map_err(Failure::Op)?;
            walk_workload::check_walk(start, &nodes).map_err(Failure::Mismatch)
        }
        Op::Path { from, to } => {
            let (from, to) = (coord_of(from), coord_of(to));
            match connection.path(from, to).map_err(Failure::Op)? {
                Some((coords, cost)) => {
                    walk_workload::check_path(from, to, &coords, cost).map_err(Failure::Mismatch)
                }
                // Unlinks can cut a key off; no path is a fine answer.
                None => Ok(()),
            }
        }
        Op::Prog { cell, variant } => connection
            .prog(
                program_workload::coord(cell),
                program_workload::source(variant).as_bytes(),
            )
            .map_err(Failure::Op),
        Op::Run { cell } => match connection.run(program_workload::coord(cell)) {
            Ok(_) => {
                shared.counters.acked(cell);
                Ok(())
            }
            Err(e) => {
                shared.counters.uncertain(cell);
                Err(Failure::Op(e))
            }
        },
        Op::ProgRun { cell, variant } => execute_prog_run(shared, connection, cell, variant),
        Op::Step { first_cell, cells } => execute_step(shared, connection, first_cell, cells),
        Op::CellStats { cell } => execute_cell_stats(shared, connection, cell),
    }
}

/// A put of the next version of `key`, in the client's ledger as acked or
/// as unknown.
fn execute_put(
    shared: &Shared<'_>,
    client: usize,
    connection: &mut dyn Connection,
    key: u64,
    value: &mut Vec<u8>,
) -> Result<(), Failure> {
    let ledger = &shared.ledgers[client];
    let version = lock(ledger).next_version();
    encode_value(key, version, shared.config.value_size, value);
    match connection.put(coord_of(key), value) {
        Ok(()) => {
            lock(ledger).acked(key, version);
            Ok(())
        }
        Err(e) => {
            lock(ledger).unknown(key, version);
            Err(Failure::Op(e))
        }
    }
}

/// An mget of the `batch` keys drawn from `draw`, each cell checked as a
/// get's answer would be.
fn execute_mget(
    shared: &Shared<'_>,
    client: usize,
    connection: &mut dyn Connection,
    draw: u64,
    batch: u32,
) -> Result<(), Failure> {
    let keys: Vec<u64> = mget_keys(draw, batch, &shared.keys).collect();
    let coords: Vec<_> = keys.iter().map(|&key| coord_of(key)).collect();
    let values = connection.mget(&coords).map_err(Failure::Op)?;
    if values.len() != keys.len() {
        return Err(Failure::Mismatch(format!(
            "mget of {} keys answered {} values",
            keys.len(),
            values.len()
        )));
    }
    // Every cell is checked as a get's answer would be, each
    // wrong one counted.
    let problems: Vec<String> = keys
        .iter()
        .zip(&values)
        .filter_map(|(&key, found)| check_read(shared, client, key, found.as_deref()).err())
        .map(|problem| format!("mget: {problem}"))
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Failure::Mismatches(problems))
    }
}

/// A `prog` and a `run` of it, pipelined; the run counted in the counter
/// ledger as acked or uncertain.
fn execute_prog_run(
    shared: &Shared<'_>,
    connection: &mut dyn Connection,
    cell: u64,
    variant: u64,
) -> Result<(), Failure> {
    let pair = connection
        .prog_and_run(
            program_workload::coord(cell),
            program_workload::source(variant).as_bytes(),
        )
        .inspect_err(|_| shared.counters.uncertain(cell))
        .map_err(Failure::Op)?;
    match pair.run {
        Ok(_) => shared.counters.acked(cell),
        Err(_) => shared.counters.uncertain(cell),
    }
    pair.prog.map_err(Failure::Op)?;
    pair.run.map(|_| ()).map_err(Failure::Op)
}

/// A `step` over `cells` counter cells from `first_cell`: each of them ran
/// once, and none failed.
fn execute_step(
    shared: &Shared<'_>,
    connection: &mut dyn Connection,
    first_cell: u64,
    cells: u64,
) -> Result<(), Failure> {
    let (lo, hi) = program_workload::step_box(first_cell, cells);
    let box_cells = first_cell..first_cell + cells;
    match connection.step(lo, hi) {
        Ok(answer) => {
            // Acknowledged: every run in the box is in its cell's
            // telemetry, failed or not.
            box_cells.for_each(|cell| shared.counters.acked(cell));
            if answer.programs != cells {
                return Err(Failure::Mismatch(format!(
                    "step over seed cells {lo}..={hi} ran {} programs, but each of \
                     its {cells} cells holds one",
                    answer.programs
                )));
            }
            if answer.failed > 0 {
                // A counter never fails: its cell's counter now
                // lags its telemetry, which the end check reports.
                return Err(Failure::Op(OpError::Failed(format!(
                    "{} of its {} runs failed, the first: {}",
                    answer.failed,
                    answer.programs,
                    answer.first_failure.as_deref().unwrap_or("(not described)")
                ))));
            }
            Ok(())
        }
        Err(e) => {
            box_cells.for_each(|cell| shared.counters.uncertain(cell));
            Err(Failure::Op(e))
        }
    }
}

/// A counter cell's telemetry, which counts at least the runs acknowledged
/// before asking.
fn execute_cell_stats(
    shared: &Shared<'_>,
    connection: &mut dyn Connection,
    cell: u64,
) -> Result<(), Failure> {
    // Runs acknowledged before asking are all recorded by then.
    let floor = shared.counters.acked_count(cell);
    let (runs, _) = connection
        .cell_stats(program_workload::coord(cell))
        .map_err(Failure::Op)?;
    if runs < floor {
        return Err(Failure::Mismatch(format!(
            "seed cell {}: telemetry counts {runs} runs, but {floor} were acknowledged \
             before asking",
            program_workload::coord(cell)
        )));
    }
    Ok(())
}

/// Checks what a read of `key` found (every key was written before the
/// run); the error describes what is wrong.
fn check_read(
    shared: &Shared<'_>,
    client: usize,
    key: u64,
    found: Option<&[u8]>,
) -> Result<(), String> {
    let Some(bytes) = found else {
        return Err(format!(
            "key {key} at {}: read found nothing, but every key was written before the run",
            coord_of(key)
        ));
    };
    let stored = decode_value(bytes, shared.config.value_size)
        .map_err(|problem| format!("key {key}: {problem}"))?;
    if stored.key != key {
        return Err(format!(
            "key {key} at {}: read found the value of key {}",
            coord_of(key),
            stored.key
        ));
    }
    // A client's own keys change only through it, so the exact version is
    // known; other keys may be mid-change.
    if shared.keys.owner(key) == client {
        lock(&shared.ledgers[client]).check_read(key, Some(stored))?;
    }
    Ok(())
}

/// Joins prefill threads; returns what went wrong in each that failed.
fn prefill_failures<E: std::fmt::Display>(
    workers: Vec<thread::ScopedJoinHandle<'_, Result<(), E>>>,
) -> Vec<String> {
    workers
        .into_iter()
        .filter_map(|w| match w.join() {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some("a prefill thread panicked".to_owned()),
        })
        .collect()
}

fn prefill_outcome(failures: &[String], what: &str) -> Result<(), StressError> {
    match failures.first() {
        Some(first) => Err(StressError::target(
            "prefill",
            format!("cannot {what} before the run: {first}"),
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use cube_protocol::Coord;

    use super::*;

    /// Answers `mget` with what it holds: version 1 of every key, except
    /// what a test changed.
    struct FakeConnection {
        cells: std::collections::HashMap<Coord, Vec<u8>>,
    }

    impl Connection for FakeConnection {
        fn put(&mut self, coord: Coord, value: &[u8]) -> Result<(), OpError> {
            self.cells.insert(coord, value.to_vec());
            Ok(())
        }

        fn get(&mut self, coord: Coord) -> Result<Option<Vec<u8>>, OpError> {
            Ok(self.cells.get(&coord).cloned())
        }

        fn mget(&mut self, coords: &[Coord]) -> Result<Vec<Option<Vec<u8>>>, OpError> {
            Ok(coords.iter().map(|c| self.cells.get(c).cloned()).collect())
        }
    }

    struct NoConnector;

    impl Connector for NoConnector {
        fn connect(&self) -> Result<Box<dyn Connection>, OpError> {
            Err(OpError::Failed("not in this test".to_owned()))
        }

        fn server_figures(&self) -> Result<Vec<StatsEntry>, String> {
            Ok(Vec::new())
        }
    }

    /// A one-client run of `workload` over `keys` keys, values of `size`
    /// bytes, no read-back at the end.
    fn one_client(workload: Workload, keys: u64, size: usize, preloaded: bool) -> RunConfig {
        RunConfig {
            value_size: size,
            preloaded,
            ..RunConfig::new(TargetSpec::new(TargetKind::Cube), workload, keys)
        }
    }

    /// What `execute` shares among the clients of `config`, with no way
    /// to connect: the tests hand it a `FakeConnection`.
    fn one_client_shared<'a>(
        config: &'a RunConfig,
        ledgers: &'a [Mutex<Ledger>],
        keys: KeySpace,
        control: &'a Control,
        counters: &'a CounterLedger,
    ) -> Shared<'a> {
        Shared {
            connector: &NoConnector,
            ledgers,
            keys,
            config,
            control,
            counters,
        }
    }

    #[test]
    fn every_wrong_cell_of_an_mget_is_a_mismatch_of_its_own() {
        const KEYS: u64 = 8;
        const SIZE: usize = 32;
        let workload = Workload::new(WorkloadKind::Mget, 0.9)
            .unwrap()
            .with_batch(64)
            .unwrap();
        let config = one_client(workload, KEYS, SIZE, false);
        let keys = config.validate().unwrap();
        let ledgers = [Mutex::new(Ledger::new(0, keys))];
        let mut fake = FakeConnection {
            cells: Default::default(),
        };
        // The prefill's state: version 1 of every key, acknowledged.
        let mut value = Vec::new();
        {
            let mut ledger = lock(&ledgers[0]);
            let version = ledger.next_version();
            for key in 0..KEYS {
                encode_value(key, version, SIZE, &mut value);
                fake.put(coord_of(key), &value).unwrap();
                ledger.acked(key, version);
            }
        }
        let (control, counters) = (Control::new(1), CounterLedger::new(Vec::new()));
        let shared = one_client_shared(&config, &ledgers, keys, &control, &counters);
        let mut rng = Rng::new(9);
        let op = config.workload.next_op(&mut rng, &keys, 0);
        let Op::Mget { draw, batch } = op else {
            panic!("not an mget: {op:?}");
        };
        let asked: Vec<u64> = mget_keys(draw, batch, &keys).collect();
        assert!(matches!(
            execute(&shared, 0, &mut fake, op, &mut value),
            Ok(())
        ));

        // Key 1 lost, key 2 holding key 3's value, key 4 at a version
        // never written: each read of them is one mismatch.
        fake.cells.remove(&coord_of(1));
        let foreign = fake.cells[&coord_of(3)].clone();
        fake.cells.insert(coord_of(2), foreign);
        encode_value(4, 7, SIZE, &mut value);
        fake.cells.insert(coord_of(4), value.clone());
        let expected = asked.iter().filter(|k| matches!(k, 1 | 2 | 4)).count();
        assert!(expected > 0, "the batch missed keys 1, 2 and 4: {asked:?}");
        match execute(&shared, 0, &mut fake, op, &mut value) {
            Err(Failure::Mismatches(problems)) => {
                assert_eq!(problems.len(), expected, "{problems:?}");
                assert!(problems.iter().all(|p| p.starts_with("mget: key ")));
                let all = problems.join("\n");
                for needle in ["found nothing", "the value of key 3", "found version 7"] {
                    assert!(all.contains(needle), "{needle} not in {all}");
                }
            }
            Err(_) => panic!("another failure than mismatches"),
            Ok(()) => panic!("wrong cells passed"),
        }
    }

    #[test]
    fn a_preloaded_run_checks_every_read_against_version_1() {
        const SIZE: usize = 32;
        let workload = Workload::new(WorkloadKind::Get, 1.0).unwrap();
        let config = one_client(workload, 1 << 40, SIZE, true);
        let keys = config.validate().unwrap();
        // 2^40 keys: only a ledger without a state per key fits.
        let ledgers = [Mutex::new(Ledger::with_baseline(0, keys, 1))];
        let (control, counters) = (Control::new(1), CounterLedger::new(Vec::new()));
        let shared = one_client_shared(&config, &ledgers, keys, &control, &counters);
        let mut fake = FakeConnection {
            cells: Default::default(),
        };
        let mut value = Vec::new();
        let key = (1 << 39) + 5;
        encode_value(key, 1, SIZE, &mut value);
        fake.put(coord_of(key), &value).unwrap();
        let get = Op::Get { key };
        assert!(execute(&shared, 0, &mut fake, get, &mut value).is_ok());
        encode_value(key, 2, SIZE, &mut value);
        fake.put(coord_of(key), &value).unwrap();
        match execute(&shared, 0, &mut fake, get, &mut value) {
            Err(Failure::Mismatch(problem)) => {
                assert!(
                    problem.contains("expected version 1, found version 2"),
                    "{problem}"
                );
            }
            _ => panic!("a version never written passed"),
        }
        match execute(&shared, 0, &mut fake, Op::Get { key: key + 1 }, &mut value) {
            Err(Failure::Mismatch(problem)) => assert!(problem.contains("found nothing")),
            _ => panic!("a missing key passed"),
        }
        assert!(!lock(&ledgers[0]).allocated());

        let walk = RunConfig {
            workload: Workload::new(WorkloadKind::Walk, 1.0).unwrap(),
            keys: 64,
            ..config
        };
        let refused = walk.validate().unwrap_err().to_string();
        assert!(refused.contains("preloaded"), "{refused}");
    }
}
