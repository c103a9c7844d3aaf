//! Guards the crash torture (`make crash`) and, through it, durability under
//! kill -9: a few cycles of SIGKILL (at random, inside a checkpoint, inside a
//! compaction) under puts, deletes, edges, cell programs (prog, run) and
//! checkpoints from several clients, each followed by a restart that finds
//! every acknowledged operation and nothing half-applied, and a watcher
//! that resumes after each kill and was told every change exactly once.
#![allow(clippy::unwrap_used)]

use cube_stress::crash::{CrashArgs, KillMode, torture};

#[test]
fn every_acknowledged_operation_survives_each_kill() {
    let args = CrashArgs {
        cycles: 5,
        seed: 11,
        clients: 4,
        keys: 24,
        min_run_ms: 100,
        max_run_ms: 400,
        quiet: true,
        ..CrashArgs::default()
    };
    let report = torture(&args).unwrap();
    let text = report.to_text();
    assert!(report.passed(), "{text}");
    assert_eq!(report.cycles_run, 5, "{text}");
    assert_eq!(
        report.restart_ms.len(),
        6,
        "five crashes and the final clean restart: {text}"
    );
    assert!(report.acked_total() > 0, "{text}");
    for command in ["put", "link", "prog", "run"] {
        assert!(
            report.acked.get(command).copied().unwrap_or(0) > 0,
            "no {command} acknowledged: {text}"
        );
    }
    assert!(report.keys_verified >= 6 * 4 * 24, "{text}");
    assert_eq!(report.program_planes_verified, 6 * 4, "{text}");
    assert!(report.kept.is_none(), "{text}");
    let kills: u64 = report.kills.values().sum();
    assert_eq!(kills, 5, "{text}");
    // Seed 11 puts at least one kill inside a requested checkpoint or
    // compaction (the schedule depends on the seed only).
    assert!(
        report.kills.contains_key(&KillMode::DuringCheckpoint)
            || report.kills.contains_key(&KillMode::DuringCompaction),
        "{text}"
    );
    // The watcher of client 0's box resumed after every kill and was
    // checked at every sync: the first, one per cycle, the final one.
    let watch = report.watch.as_ref().unwrap();
    assert_eq!(watch.states_matched, 7, "{text}");
    assert!(watch.resumes >= 7, "{text}");
    assert!(watch.changes > 0, "{text}");
    assert!(watch.puts_checked + watch.puts_snapshotted > 0, "{text}");
    assert!(text.contains("PASSED"), "{text}");
}
