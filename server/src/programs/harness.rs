//! A cell program stored and run outside the daemon, through exactly the
//! code `prog` and `run` use: for the `program_run` fuzz target (`fuzz/`)
//! and the garbage-source test (`server/tests/program_garbage.rs`). The
//! daemon never uses it; it is public (and hidden) only for them.
//!
//! Why a whole engine: a run executes inside [`WriteSession::transact`],
//! on the writer thread, against the store and the commit group's overlay,
//! in the writer's own VM, and only an engine has those. It runs on a
//! simulated in-memory disk with fsync off, so a run costs tens of
//! microseconds and nothing touches the file system; its checkpointer folds
//! the log now and then, so what a long fuzzing session leaves behind stays
//! bounded (and a caller replaces the harness now and then, see
//! [`ProgramHarness::runs`]).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cube_protocol::{
    Coord, EdgeLabel, EdgeWeight, MAX_PROGRAM_BYTES, MAX_RESULT_ENTRIES, MAX_RUN_ARG_BYTES,
    MAX_RUN_ARGS, NamespaceName, ProgramValue, RunOutcome,
};
use cube_store::sim_disk::{FaultPlan, SimDisk};
use cube_store::{
    CheckpointConfig, EdgeKey, Engine, EngineConfig, GroupCommitConfig, Mutation, Storage,
    SyncPolicy, WalkLimits, WriteSession,
};

use super::sandbox::{self, RunBudget};
use super::{ProgramSettings, ProgramStats, RunOutput, run_in_writer};

/// Budgets and limits of the harness's runs: small, so that running out of
/// fuel, memory, time or value size is within a fuzzer's reach and every
/// run is short.
#[derive(Clone, Copy, Debug)]
pub struct HarnessLimits {
    /// VM instructions per run (`--program-fuel`).
    pub fuel: u64,
    /// VM memory per run (`--program-memory`).
    pub memory_bytes: usize,
    /// Writer time per run (`--program-time-ms`).
    pub time: Duration,
    /// Largest value a run may write or return (`--max-value-bytes`).
    pub max_value_bytes: usize,
}

impl HarnessLimits {
    /// What the fuzz target and the regression test use: a hundredth of the
    /// daemon's default fuel, an eighth of its memory, a fifth of its time.
    pub const SMALL: HarnessLimits = HarnessLimits {
        fuel: 10_000,
        memory_bytes: 1024 * 1024,
        time: Duration::from_millis(50),
        max_value_bytes: 4096,
    };
}

/// What became of one source.
#[derive(Debug)]
pub enum HarnessOutcome {
    /// `prog` refuses it (a syntax error, a binary chunk, over the size
    /// limit), or `run` would refuse its arguments: the reason.
    Refused(String),
    /// It was stored and run.
    Ran(HarnessRun),
}

/// One run, as the daemon would have answered it, plus what a checker
/// needs to hold it to its bounds.
#[derive(Debug)]
pub struct HarnessRun {
    /// The run's telemetry sequence number at [`ProgramHarness::HOME`].
    pub seq: u64,
    /// Fuel used, as telemetry records it.
    pub instructions: u64,
    /// Cells written by the run (0 when it failed: nothing is applied).
    pub cells_written: u32,
    /// The value returned, or how the run failed and why.
    pub result: Result<ProgramValue, (RunOutcome, String)>,
    /// Cells in the store before the program was stored, and after the run.
    pub cells_before: u64,
    pub cells_after: u64,
    /// From storing the program to the run's answer.
    pub elapsed: Duration,
}

/// Wall time a run may take, compilation included, before [`HarnessRun::check`]
/// calls it a hang: far above the time budget (a backstop checked every
/// thousand instructions), so only a run that escaped its budgets, inside
/// one long C call, gets near it, even on a loaded machine.
pub const HARNESS_MAX_RUN_WALL: Duration = Duration::from_secs(10);

impl HarnessRun {
    /// The bounds every run keeps, whatever its source and arguments. `Ok`,
    /// or what was broken:
    /// - telemetry counted this run as the `expected_seq`th (exactly once);
    /// - it ended within [`HARNESS_MAX_RUN_WALL`];
    /// - a run that succeeded used at most its fuel, wrote at most 16 384
    ///   cells (the per-run write limit), added at most that many, and
    ///   returned a value the protocol can carry: a
    ///   scalar, or a flat table of at most `MAX_RESULT_ENTRIES` scalar
    ///   entries, strings within the value limit;
    /// - a run that failed says why, in a message made within its memory
    ///   budget, and left every cell as it was (nothing it wrote applied).
    pub fn check(&self, limits: &HarnessLimits, expected_seq: u64) -> Result<(), String> {
        if self.seq != expected_seq {
            return Err(format!(
                "telemetry counted this run as run {}, not {expected_seq}",
                self.seq
            ));
        }
        if self.elapsed > HARNESS_MAX_RUN_WALL {
            return Err(format!(
                "the run took {:?}, past {HARNESS_MAX_RUN_WALL:?} (time budget {:?})",
                self.elapsed, limits.time
            ));
        }
        match &self.result {
            Ok(value) => {
                if self.instructions > limits.fuel {
                    return Err(format!(
                        "a successful run used {} fuel of {}",
                        self.instructions, limits.fuel
                    ));
                }
                if self.cells_written > super::api::MAX_RUN_WRITES {
                    return Err(format!("a run wrote {} cells", self.cells_written));
                }
                if self.cells_after > self.cells_before + u64::from(self.cells_written) {
                    return Err(format!(
                        "cells went from {} to {} after {} writes",
                        self.cells_before, self.cells_after, self.cells_written
                    ));
                }
                check_value(value, limits, true)
            }
            Err((outcome, message)) => {
                if *outcome == RunOutcome::Ok {
                    return Err(format!("a failed run recorded as ok: {message}"));
                }
                if message.is_empty() || message.len() > limits.memory_bytes + 4096 {
                    return Err(format!(
                        "a failed run's message is {} bytes long",
                        message.len()
                    ));
                }
                if self.cells_written != 0 || self.cells_after != self.cells_before {
                    return Err(format!(
                        "a failed run ({outcome:?}: {message}) changed cells: {} written, \
                         {} cells before, {} after",
                        self.cells_written, self.cells_before, self.cells_after
                    ));
                }
                Ok(())
            }
        }
    }
}

/// A run's value within what the protocol carries (`top`: tables allowed).
fn check_value(value: &ProgramValue, limits: &HarnessLimits, top: bool) -> Result<(), String> {
    match value {
        ProgramValue::Bytes(bytes) if bytes.len() > limits.max_value_bytes => Err(format!(
            "a returned string of {} bytes, over {}",
            bytes.len(),
            limits.max_value_bytes
        )),
        ProgramValue::Table(entries) if top => {
            if entries.len() > MAX_RESULT_ENTRIES as usize {
                return Err(format!("a returned table of {} entries", entries.len()));
            }
            for (key, value) in entries {
                if !matches!(key, ProgramValue::Int(_) | ProgramValue::Bytes(_)) {
                    return Err(format!("a returned table key {key:?}"));
                }
                if !value.is_scalar() {
                    return Err(format!("a returned table value {value:?}"));
                }
                check_value(key, limits, false)?;
                check_value(value, limits, false)?;
            }
            Ok(())
        }
        ProgramValue::Table(_) => Err("a nested table in a result".to_owned()),
        _ => Ok(()),
    }
}

/// An engine with a few cells and edges around [`ProgramHarness::HOME`],
/// where each source is stored and run.
pub struct ProgramHarness {
    engine: Engine,
    session: WriteSession,
    settings: ProgramSettings,
    stats: Arc<ProgramStats>,
    ns: NamespaceName,
    limits: HarnessLimits,
    runs: u64,
}

/// Where the harness's simulated data dir lives (on the simulated disk).
const DATA_DIR: &str = "/harness/data";

impl ProgramHarness {
    /// Every source is stored and run here.
    pub const HOME: Coord = Coord { x: 0, y: 0, z: 0 };

    /// A fresh engine on a simulated disk, with numbers, text and edges
    /// near [`ProgramHarness::HOME`] for programs to read and change.
    pub fn new(limits: HarnessLimits) -> Result<ProgramHarness, String> {
        let disk = SimDisk::new(FaultPlan::default());
        let root = Path::new(DATA_DIR);
        disk.create_dir_all(root)
            .map_err(|e| format!("harness: cannot create the simulated data dir: {e}"))?;
        let mut config = EngineConfig::new(root);
        config.storage = Arc::new(disk);
        config.group_commit = GroupCommitConfig {
            sync: SyncPolicy::Never,
            // Small segments and thresholds: each segment is zero-filled in
            // memory, and folds keep the simulated disk small.
            segment_bytes: 1024 * 1024,
            ..GroupCommitConfig::default()
        };
        config.checkpoint = CheckpointConfig {
            checkpoint_wal_bytes: 4 * 1024 * 1024,
            delta_compact_bytes: 8 * 1024 * 1024,
            poll_interval: Duration::from_millis(100),
            ..CheckpointConfig::default()
        };
        let engine = Engine::open(config).map_err(|e| format!("harness: engine: {e}"))?;
        let session = engine
            .session()
            .ok_or_else(|| "harness: the engine has no writer".to_owned())?;
        let ns = NamespaceName::new("default").map_err(|e| format!("harness: {e}"))?;
        if !engine.memstore().has_namespace(&ns) {
            return Err("harness: a fresh engine has no default namespace".to_owned());
        }
        let settings = ProgramSettings {
            budget: RunBudget {
                fuel: limits.fuel,
                memory_bytes: limits.memory_bytes,
                time: limits.time,
            },
            keep: 16,
            max_value_bytes: limits.max_value_bytes,
            max_frame_bytes: 1024 * 1024,
            walk_limits: WalkLimits {
                max_depth: 8,
                max_nodes: 1000,
                max_work: 10_000,
                max_answer_bytes: 64 * 1024,
            },
            step_time: limits.time,
            step_threads: 1,
        };
        let harness = ProgramHarness {
            engine,
            session,
            settings,
            stats: Arc::default(),
            ns,
            limits,
            runs: 0,
        };
        harness.furnish()?;
        Ok(harness)
    }

    /// Numbers (integer, float, negative, the largest integer), text, a
    /// number with a space (which the numeric helpers refuse), a large
    /// value, and edges in and out of HOME and along the x axis.
    fn furnish(&self) -> Result<(), String> {
        let at = |x, y, z| Coord::new(x, y, z);
        let mut writes: Vec<Mutation> = [
            (at(1, 0, 0), b"1".to_vec()),
            (at(-1, 0, 0), b"2.5".to_vec()),
            (at(0, 1, 0), b"-3".to_vec()),
            (at(0, -1, 0), b"abc".to_vec()),
            (at(0, 0, 1), b" 7".to_vec()),
            (at(1, 1, 1), vec![b'x'; self.limits.max_value_bytes]),
            (at(2, 0, 0), b"9223372036854775807".to_vec()),
        ]
        .into_iter()
        .map(|(coord, value)| Mutation::Put {
            ns: self.ns.clone(),
            coord,
            value,
        })
        .collect();
        let label = EdgeLabel::new("e").map_err(|e| format!("harness: {e}"))?;
        for (from, to) in [
            (Self::HOME, at(1, 0, 0)),
            (at(1, 0, 0), at(2, 0, 0)),
            (at(0, 1, 0), Self::HOME),
            (at(2, 0, 0), Self::HOME),
        ] {
            writes.push(Mutation::Link {
                ns: self.ns.clone(),
                edge: EdgeKey::new(from, to, label.clone()),
                weight: EdgeWeight::DEFAULT,
            });
        }
        for mutation in writes {
            self.session
                .write(mutation)
                .map_err(|e| format!("harness: setting up: {e}"))?;
        }
        Ok(())
    }

    /// What the runs are allowed.
    pub fn limits(&self) -> HarnessLimits {
        self.limits
    }

    /// Runs made so far: a caller replaces the harness after some number,
    /// so that what programs wrote does not pile up.
    pub fn runs(&self) -> u64 {
        self.runs
    }

    /// Stores `source` at HOME as `prog` does (refused if it does not
    /// compile) and runs it with `args` as `run` does. `Err` only when the
    /// engine failed (a writer that died, say): for a checker, a finding.
    pub fn run(&mut self, source: &[u8], args: &[Vec<u8>]) -> Result<HarnessOutcome, String> {
        if source.is_empty() {
            return Ok(HarnessOutcome::Refused(
                "an empty source deletes the program".to_owned(),
            ));
        }
        if source.len() > MAX_PROGRAM_BYTES {
            return Ok(HarnessOutcome::Refused(format!(
                "{} bytes of source, over {MAX_PROGRAM_BYTES}",
                source.len()
            )));
        }
        if args.len() > MAX_RUN_ARGS || args.iter().any(|a| a.len() > MAX_RUN_ARG_BYTES) {
            return Ok(HarnessOutcome::Refused(
                "too many or too long arguments".to_owned(),
            ));
        }
        if let Err(e) = sandbox::check_syntax(source) {
            return Ok(HarnessOutcome::Refused(e.message));
        }
        let started = Instant::now();
        let cells_before = self.engine.memstore().cell_count();
        self.session
            .write(Mutation::ProgramPut {
                ns: self.ns.clone(),
                coord: Self::HOME,
                source: source.to_vec(),
            })
            .map_err(|e| format!("harness: storing the program: {e}"))?;
        let (ns, args) = (self.ns.clone(), args.to_vec());
        let (settings, stats) = (self.settings, Arc::clone(&self.stats));
        let (output, _) = self
            .session
            .transact(move |view| run_in_writer(view, ns, Self::HOME, &args, &settings, &stats))
            .map_err(|e| format!("harness: the run's transaction: {e}"))?;
        self.runs += 1;
        match output {
            RunOutput::Ran {
                seq,
                instructions,
                cells_written,
                result,
                ..
            } => Ok(HarnessOutcome::Ran(HarnessRun {
                seq,
                instructions,
                cells_written,
                result,
                cells_before,
                cells_after: self.engine.memstore().cell_count(),
                elapsed: started.elapsed(),
            })),
            RunOutput::NoNamespace(ns) => Err(format!("harness: namespace {ns} vanished")),
            RunOutput::NoProgram => Err("harness: the program just stored is not there".into()),
            RunOutput::Unavailable(why) => Err(format!("harness: no VM: {why}")),
        }
    }
}

impl Drop for ProgramHarness {
    fn drop(&mut self) {
        self.engine.close_without_checkpoint();
    }
}
