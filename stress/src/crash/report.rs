//! What a torture run did and found: the violations and the summary
//! people read (`cube-stress crash`).

use super::*;

/// One thing found wrong, with what is needed to look into it.
#[derive(Clone, Debug)]
pub struct Violation {
    /// 1-based; 0 is the final clean restart after the last cycle.
    pub cycle: usize,
    pub client: Option<usize>,
    pub coord: Option<Coord>,
    pub what: String,
    pub expected: String,
    pub found: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.cycle == 0 {
            write!(f, "final clean restart")?;
        } else {
            write!(f, "cycle {}", self.cycle)?;
        }
        if let Some(client) = self.client {
            write!(f, ", client {client}")?;
        }
        if let Some(coord) = self.coord {
            write!(f, ", key {coord}")?;
        }
        write!(f, ": {}", self.what)?;
        if !self.expected.is_empty() || !self.found.is_empty() {
            write!(
                f,
                "\n      expected: {}\n      found:    {}",
                self.expected, self.found
            )?;
        }
        Ok(())
    }
}

/// What a torture run did and found.
#[derive(Clone, Debug, Default)]
pub struct TortureReport {
    pub seed: u64,
    pub replay_command: String,
    pub cycles_planned: usize,
    /// Cycles whose kill, restart and read-back all happened.
    pub cycles_run: usize,
    pub kills: BTreeMap<KillMode, u64>,
    /// Kills that landed while the driver's checkpoint or compaction
    /// request was still unanswered.
    pub kills_inside_requested_checkpoint: u64,
    /// Folds and compactions the daemon had done by the moment of each
    /// kill, summed over cycles.
    pub folds_before_kills: u64,
    pub compactions_before_kills: u64,
    /// Acknowledged state-changing operations, by command: each one is
    /// covered by the read-back after the next restart.
    pub acked: BTreeMap<&'static str, u64>,
    /// Checkpoints (and compactions) the clients asked for and got.
    pub client_checkpoints: u64,
    pub client_compactions: u64,
    /// Operations in flight at a kill that were found applied, and not.
    pub in_flight_landed: u64,
    pub in_flight_lost: u64,
    /// Of those, program runs: every one of them all or nothing.
    pub in_flight_runs_landed: u64,
    pub in_flight_runs_lost: u64,
    /// Writes refused with `shutting_down` ("not stored"), checked absent.
    pub refused_shutting_down: u64,
    /// Live reads checked against the acknowledged state.
    pub reads_checked: u64,
    /// Keys and per-key edge lists compared after restarts.
    pub keys_verified: u64,
    pub edge_lists_verified: u64,
    /// Program planes (program, counter, marks, telemetry counts) compared
    /// after restarts, one per client per restart.
    pub program_planes_verified: u64,
    /// From the restart to the first accepted connection, per cycle (ms).
    pub restart_ms: Vec<f64>,
    /// The daemon's own figure: checkpoint load plus WAL replay (ms).
    pub server_recovery_ms: Vec<u64>,
    pub records_replayed_max: u64,
    /// Records replayed at the latest start.
    pub(super) last_replayed: u64,
    pub violations: Vec<Violation>,
    /// Where the data dir and the daemon log were kept, if they were.
    pub kept: Option<PathBuf>,
    /// What the watcher of client 0's box saw (none with `--no-watch`).
    pub watch: Option<WatchFigures>,
    pub duration: Duration,
}

impl TortureReport {
    pub fn passed(&self) -> bool {
        self.violations.is_empty() && self.cycles_run == self.cycles_planned
    }

    pub fn acked_total(&self) -> u64 {
        self.acked.values().sum()
    }

    /// The summary people read.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        self.write_kills(&mut out);
        self.write_checks(&mut out);
        self.write_recovery(&mut out);
        self.write_verdict(&mut out);
        out
    }

    /// The run's first lines: its seed and cycles, and how the cycles
    /// ended.
    fn write_kills(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "crash torture, seed {}: {} of {} cycles in {:.1} s",
            self.seed,
            self.cycles_run,
            self.cycles_planned,
            self.duration.as_secs_f64()
        );
        for mode in KillMode::ALL {
            let n = self.kills.get(&mode).copied().unwrap_or(0);
            let _ = writeln!(out, "  {:<42} {n}", mode.name());
        }
        let _ = writeln!(
            out,
            "  kills inside an unanswered checkpoint/compaction request: {}",
            self.kills_inside_requested_checkpoint
        );
        let _ = writeln!(
            out,
            "  folds / compactions done by the daemon before the kills: {} / {}",
            self.folds_before_kills, self.compactions_before_kills
        );
    }

    /// What was checked: the operations acknowledged, those in flight at
    /// a kill, what was read back, and what the watcher saw.
    fn write_checks(&self, out: &mut String) {
        let by_command: Vec<String> = self
            .acked
            .iter()
            .map(|(name, n)| format!("{name} {n}"))
            .collect();
        let _ = writeln!(
            out,
            "operations acknowledged and verified: {} ({}); client checkpoints {}, compactions {}",
            self.acked_total(),
            by_command.join(", "),
            self.client_checkpoints,
            self.client_compactions
        );
        let _ = writeln!(
            out,
            "  in flight at a kill: {} landed whole, {} not at all (runs among them: {} whole, {} not at all); \
             {} refused as shutting down (checked absent)",
            self.in_flight_landed,
            self.in_flight_lost,
            self.in_flight_runs_landed,
            self.in_flight_runs_lost,
            self.refused_shutting_down
        );
        let _ = writeln!(
            out,
            "  read back after restarts: {} keys, {} edge lists, {} program planes; {} live reads checked",
            self.keys_verified,
            self.edge_lists_verified,
            self.program_planes_verified,
            self.reads_checked
        );
        if let Some(w) = &self.watch {
            let _ = writeln!(
                out,
                "watch of client {WATCHED_CLIENT}'s box: {} changes in {} groups over {} resumes; \
                 {} acknowledged puts found at their LSN ({} covered by a resync's snapshot); \
                 {} states rebuilt from the changes matched the read-back; resyncs: {} history gone, {} too slow",
                w.changes,
                w.groups,
                w.resumes,
                w.puts_checked,
                w.puts_snapshotted,
                w.states_matched,
                w.resyncs_history_gone,
                w.resyncs_too_slow
            );
        }
    }

    /// How long the restarts took and how much WAL they replayed.
    fn write_recovery(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "recovery: restart to ready {}; daemon's own (checkpoint load + replay) {}; at most {} records replayed",
            spread(&self.restart_ms, "ms"),
            spread(
                &self
                    .server_recovery_ms
                    .iter()
                    .map(|ms| *ms as f64)
                    .collect::<Vec<_>>(),
                "ms"
            ),
            self.records_replayed_max
        );
    }

    /// Passed, or the violations and how to replay the schedule; and
    /// where the data dir was kept.
    fn write_verdict(&self, out: &mut String) {
        if self.violations.is_empty() {
            if self.cycles_run == self.cycles_planned {
                let _ = writeln!(
                    out,
                    "PASSED: no acknowledged operation lost, nothing half-applied"
                );
            }
        } else {
            let _ = writeln!(out, "FAILED: {} violation(s)", self.violations.len());
            for v in self.violations.iter().take(SHOWN_VIOLATIONS) {
                let _ = writeln!(out, "  {v}");
            }
            if self.violations.len() > SHOWN_VIOLATIONS {
                let _ = writeln!(
                    out,
                    "  ... and {} more",
                    self.violations.len() - SHOWN_VIOLATIONS
                );
            }
            let _ = writeln!(
                out,
                "replay the schedule: {}\n(thread timing is not replayable; the kept data dir is)",
                self.replay_command
            );
        }
        if let Some(kept) = &self.kept {
            let _ = writeln!(
                out,
                "data dir and daemon log kept in {} (data/, cubed.log)",
                kept.display()
            );
        }
    }
}

/// "min 3.1 / median 4.0 / max 9.2 ms", or "-" with no samples.
pub(super) fn spread(samples: &[f64], unit: &str) -> String {
    let mut sorted: Vec<f64> = samples.iter().copied().filter(|s| s.is_finite()).collect();
    if sorted.is_empty() {
        return "-".to_owned();
    }
    sorted.sort_by(f64::total_cmp);
    format!(
        "min {:.1} / median {:.1} / max {:.1} {unit}",
        sorted[0],
        sorted[sorted.len() / 2],
        sorted[sorted.len() - 1]
    )
}

impl TortureReport {
    /// A clean shutdown folds the whole WAL, so the start after it must
    /// replay nothing.
    pub(super) fn nothing_replayed(&mut self, cycle: usize) {
        let replayed = self.last_replayed;
        if replayed != 0 {
            self.violations.push(Violation {
                cycle,
                client: None,
                coord: None,
                what: "the start after a clean shutdown replayed WAL records; \
                       the shutdown should have folded them all"
                    .to_owned(),
                expected: "0 records replayed".to_owned(),
                found: format!("{replayed} records replayed"),
            });
        }
    }

    pub(super) fn bad_exit(
        &mut self,
        cycle: usize,
        status: std::process::ExitStatus,
        daemon: &LocalDaemon,
    ) {
        let log = daemon.log_text();
        let tail: Vec<&str> = log.lines().rev().take(5).collect();
        self.violations.push(Violation {
            cycle,
            client: None,
            coord: None,
            what: format!("clean shutdown exited with {status}"),
            expected: "exit 0".to_owned(),
            found: tail.join(" | "),
        });
    }

    /// Set by each read-back: records the daemon replayed at its last start.
    pub(super) fn note_recovery(&mut self, figures: &[StatsEntry]) {
        let replayed = count_figure(figures, "recovery.records_replayed").unwrap_or(0);
        self.records_replayed_max = self.records_replayed_max.max(replayed);
        self.last_replayed = replayed;
        let load = count_figure(figures, "recovery.checkpoint_ms").unwrap_or(0);
        let replay = count_figure(figures, "recovery.ms").unwrap_or(0);
        self.server_recovery_ms.push(load + replay);
    }
}
