//! The torture's driver: the kill schedule, one cycle of load ended by a
//! kill (or a clean shutdown), the restart and read-back, and the
//! watcher's syncs.

use super::*;

/// How a cycle ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum KillMode {
    /// SIGKILL at a random moment of the load.
    Random,
    /// SIGKILL 0-3 ms after the driver asked for a checkpoint (a fold).
    DuringCheckpoint,
    /// SIGKILL 0-3 ms after the driver asked for a checkpoint with compaction.
    DuringCompaction,
    /// SIGTERM mid-load: the clean shutdown path (drain, final fold).
    CleanShutdown,
}

impl KillMode {
    pub const ALL: [KillMode; 4] = [
        KillMode::Random,
        KillMode::DuringCheckpoint,
        KillMode::DuringCompaction,
        KillMode::CleanShutdown,
    ];

    pub fn name(self) -> &'static str {
        match self {
            KillMode::Random => "SIGKILL at a random moment",
            KillMode::DuringCheckpoint => "SIGKILL during a requested checkpoint",
            KillMode::DuringCompaction => "SIGKILL during a requested compaction",
            KillMode::CleanShutdown => "SIGTERM (clean shutdown) under load",
        }
    }

    /// 55 % random, 20 % each inside a checkpoint or a compaction, 5 %
    /// clean shutdown.
    pub(super) fn pick(rng: &mut Rng) -> KillMode {
        match rng.below(100) {
            0..55 => KillMode::Random,
            55..75 => KillMode::DuringCheckpoint,
            75..95 => KillMode::DuringCompaction,
            _ => KillMode::CleanShutdown,
        }
    }
}

/// Runs the torture to the end (or to the first cycle with a violation).
/// `Err` means it could not run at all (no `cubed` binary, a daemon that
/// would not start the first time); a daemon that refuses to restart on
/// its own data is a violation in the report.
pub fn torture(args: &CrashArgs) -> Result<TortureReport, StressError> {
    args.validate()?;
    let started = Instant::now();
    let dir = tempfile::Builder::new()
        .prefix("cube-crash-")
        .tempdir()
        .map_err(|e| StressError::io("cannot create a temporary directory", e))?;
    let socket = dir.path().join("cubed.sock");
    let mut daemon = start_first_daemon(args, dir.path(), &socket)?;
    let mut report = TortureReport {
        seed: args.seed,
        replay_command: args.replay_command(),
        cycles_planned: args.cycles,
        ..TortureReport::default()
    };
    let mut clients: Vec<ClientRun> = (0..args.clients)
        .map(|id| ClientRun::new(id, args))
        .collect();
    let mut watcher = (!args.no_watch).then(|| Watcher::new(args.keys));
    if let Some(watcher) = watcher.as_mut() {
        // Nothing is written yet: the box is empty up to the first sync.
        sync_watcher(watcher, daemon.socket(), 1, &mut clients, &mut report);
    }
    run_cycles(
        args,
        &mut daemon,
        &socket,
        &mut clients,
        watcher.as_mut(),
        &mut report,
    )?;
    if report.violations.is_empty() && report.cycles_run == args.cycles {
        final_clean_restart(
            args,
            &mut daemon,
            &mut clients,
            watcher.as_mut(),
            &mut report,
        );
    }
    let _ = daemon.kill9();
    report.watch = watcher.map(|w| w.figures);
    report.duration = started.elapsed();
    if !report.passed() || args.keep_data {
        let kept = dir.keep();
        report.kept = Some(kept);
    }
    Ok(report)
}

/// Starts the daemon on a new data dir in `dir`, then says what the run
/// will do.
fn start_first_daemon(
    args: &CrashArgs,
    dir: &Path,
    socket: &Path,
) -> Result<LocalDaemon, StressError> {
    let say = |text: String| {
        if !args.quiet {
            eprintln!("cube-stress crash: {text}");
        }
    };
    let data_dir = dir.join("data");
    let daemon_args: Vec<&str> = TORTURE_DAEMON_ARGS
        .iter()
        .copied()
        .chain(args.daemon_args.iter().map(String::as_str))
        .collect();
    let daemon = LocalDaemon::start_in(&data_dir, socket, &daemon_args)?;
    say(format!(
        "{} cycles, {} clients x {} keys{}, seed {}; data in {}",
        args.cycles,
        args.clients,
        args.keys,
        if args.no_edges { "" } else { " with edges" },
        args.seed,
        dir.display()
    ));
    Ok(daemon)
}

/// The cycles of the schedule: each a load ended as its kill mode says,
/// then the restart and the read-back; up to the first cycle whose
/// restart fails or that finds a violation.
fn run_cycles(
    args: &CrashArgs,
    daemon: &mut LocalDaemon,
    socket: &Path,
    clients: &mut [ClientRun],
    mut watcher: Option<&mut Watcher>,
    report: &mut TortureReport,
) -> Result<(), StressError> {
    let mut schedule = Rng::for_stream(args.seed, 0);
    for cycle in 1..=args.cycles {
        let mode = KillMode::pick(&mut schedule);
        let run_ms = args.min_run_ms + schedule.below(args.max_run_ms - args.min_run_ms + 1);
        let kill_delay_us = schedule.below(3001);
        let outcome = run_one_cycle(
            daemon,
            socket,
            clients,
            cycle,
            mode,
            Duration::from_millis(run_ms),
            Duration::from_micros(kill_delay_us),
            watcher.as_deref_mut(),
            report,
        )?;
        *report.kills.entry(mode).or_default() += 1;
        let restarted = restart_and_verify(daemon, clients, args, cycle, report);
        if let Some(ms) = report.restart_ms.last().filter(|_| !args.quiet) {
            eprintln!(
                "cube-stress crash: cycle {cycle}/{}: {} after {run_ms} ms, {} ops acked; restarted in {ms:.0} ms",
                args.cycles,
                mode.name(),
                outcome
            );
        }
        if restarted && mode == KillMode::CleanShutdown {
            report.nothing_replayed(cycle);
        }
        if let (true, Some(watcher)) = (restarted, watcher.as_deref_mut()) {
            sync_watcher(watcher, daemon.socket(), cycle, clients, report);
        }
        if !restarted || !report.violations.is_empty() {
            break;
        }
        report.cycles_run = cycle;
    }
    Ok(())
}

/// After the last cycle: a clean shutdown, then the restart and the
/// read-back after it (cycle 0 in the report).
fn final_clean_restart(
    args: &CrashArgs,
    daemon: &mut LocalDaemon,
    clients: &mut [ClientRun],
    watcher: Option<&mut Watcher>,
    report: &mut TortureReport,
) {
    // A clean shutdown folds the whole WAL: the next start replays
    // nothing and finds everything.
    match daemon.terminate() {
        Ok(status) if status.success() => {
            if restart_and_verify(daemon, clients, args, 0, report) {
                report.nothing_replayed(0);
                if let Some(watcher) = watcher {
                    sync_watcher(watcher, daemon.socket(), 0, clients, report);
                }
            }
        }
        Ok(status) => report.bad_exit(0, status, daemon),
        Err(e) => report.violations.push(Violation {
            cycle: 0,
            client: None,
            coord: None,
            what: format!("clean shutdown failed: {e}"),
            expected: String::new(),
            found: String::new(),
        }),
    }
}

/// Runs the load, ends it as `mode` says, and collects the clients.
/// Returns how many operations were acknowledged in the cycle.
#[allow(clippy::too_many_arguments)]
pub(super) fn run_one_cycle(
    daemon: &mut LocalDaemon,
    socket: &Path,
    clients: &mut [ClientRun],
    cycle: usize,
    mode: KillMode,
    run_for: Duration,
    kill_delay: Duration,
    watcher: Option<&mut Watcher>,
    report: &mut TortureReport,
) -> Result<u64, StressError> {
    let stop = AtomicBool::new(false);
    let acked = AtomicU64::new(0);
    let shared = CycleShared {
        socket,
        cycle,
        stop: &stop,
        acked: &acked,
    };
    let control = connect(socket)?;
    thread::scope(|scope| -> Result<(), StressError> {
        let shared = &shared;
        let mut spawned = Ok(());
        if let Some(watcher) = watcher {
            // Follows the box until the cycle's kill ends its connection.
            if let Err(e) = thread::Builder::new()
                .name("crash-watcher".into())
                .spawn_scoped(scope, move || watcher.follow_live(socket, cycle))
            {
                spawned = Err(StressError::io("cannot start the watcher thread", e));
            }
        }
        for client in clients.iter_mut() {
            if let Err(e) = thread::Builder::new()
                .name(format!("crash-client-{}", client.id))
                .spawn_scoped(scope, move || client.run_cycle(shared))
            {
                spawned = Err(StressError::io("cannot start a client thread", e));
                break;
            }
        }
        // Whatever happens, the clients are told to stop, or the scope
        // would wait for them forever.
        let outcome = spawned.and_then(|()| {
            end_cycle(
                scope, daemon, control, cycle, mode, run_for, kill_delay, report,
            )
        });
        stop.store(true, Ordering::SeqCst);
        outcome
    })?;
    for client in clients.iter_mut() {
        report.violations.append(&mut client.problems);
    }
    Ok(acked.load(Ordering::Relaxed))
}

/// The controller's part of a cycle: let the load run, then end it as
/// `mode` says.
#[allow(clippy::too_many_arguments)]
pub(super) fn end_cycle<'scope>(
    scope: &'scope thread::Scope<'scope, '_>,
    daemon: &mut LocalDaemon,
    mut control: Client,
    cycle: usize,
    mode: KillMode,
    run_for: Duration,
    kill_delay: Duration,
    report: &mut TortureReport,
) -> Result<(), StressError> {
    {
        thread::sleep(run_for);
        // What the daemon had done by now: proof that folds and compactions
        // ran under the load that is about to be cut.
        if let Ok(figures) = control.stats() {
            report.folds_before_kills += count_figure(&figures, "checkpoint.count").unwrap_or(0);
            report.compactions_before_kills +=
                count_figure(&figures, "checkpoint.compactions").unwrap_or(0);
        }
        match mode {
            KillMode::Random => daemon.kill9()?,
            KillMode::CleanShutdown => {
                // Clients keep going: the ones cut off see "shutting down"
                // or a closed connection.
                let status = daemon.terminate()?;
                if !status.success() {
                    report.bad_exit(cycle, status, daemon);
                }
            }
            KillMode::DuringCheckpoint | KillMode::DuringCompaction => {
                let compact = mode == KillMode::DuringCompaction;
                let request = scope.spawn(move || control.checkpoint(compact));
                thread::sleep(kill_delay);
                daemon.kill9()?;
                match request.join() {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) if is_disconnect(&e) => {
                        report.kills_inside_requested_checkpoint += 1
                    }
                    Ok(Err(e)) => report.violations.push(Violation {
                        cycle,
                        client: None,
                        coord: None,
                        what: format!("the driver's checkpoint (compact: {compact}) failed: {e}"),
                        expected: "success or a cut connection".to_owned(),
                        found: e.to_string(),
                    }),
                    Err(_) => {
                        return Err(StressError::target(
                            "crash",
                            "the checkpoint thread panicked",
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// After a restart and read-back: catches the watcher up and checks it
/// against client 0's read-back state and acknowledged puts.
pub(super) fn sync_watcher(
    watcher: &mut Watcher,
    socket: &Path,
    cycle: usize,
    clients: &mut [ClientRun],
    report: &mut TortureReport,
) {
    let Some(client) = clients.get_mut(WATCHED_CLIENT) else {
        return;
    };
    let puts = std::mem::take(&mut client.acked_puts);
    let synced = connect(socket)
        .and_then(|mut conn| watcher.sync(&mut conn, socket, cycle, &client.acked, &puts));
    if let Err(e) = synced {
        report.violations.push(Violation {
            cycle,
            client: Some(WATCHED_CLIENT),
            coord: None,
            what: format!("watch: catching the watcher up after the restart failed: {e}"),
            expected: String::new(),
            found: String::new(),
        });
    }
    report.violations.append(&mut watcher.problems);
}
