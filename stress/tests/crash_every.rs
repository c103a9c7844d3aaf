//! Guards `--crash-every`: the driver SIGKILLs the throwaway cubed under
//! write load, restarts it, finds every acknowledged write after each
//! restart, and carries on measuring.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use cube_stress::run::{RunConfig, run};
use cube_stress::target::{TargetKind, TargetSpec};
use cube_stress::verify::VerifyMode;
use cube_stress::workload::{Workload, WorkloadKind};

#[test]
fn every_acknowledged_write_survives_each_kill() {
    let config = RunConfig {
        target: TargetSpec::new(TargetKind::Cube),
        workload: Workload::new(WorkloadKind::Mixed, 0.3).unwrap(),
        clients: 4,
        duration: Duration::from_secs(3),
        warmup: Duration::from_millis(200),
        value_size: 64,
        keys: 1000,
        seed: 7,
        rate: None,
        verify: VerifyMode::All,
        crash_every: Some(Duration::from_secs(1)),
        hostile: 0,
        progress: false,
        preloaded: false,
    };
    let report = run(&config).unwrap();
    let table = report.to_table();
    assert!(report.passed(), "{table}");
    assert!(report.crashes.len() >= 2, "{table}");
    for crash in &report.crashes {
        assert_eq!(crash.verification.keys_checked, 1000, "{table}");
        assert!(crash.verification.passed(), "{table}");
        assert!(crash.restart_ms > 0.0);
        assert!(crash.server_recovery_ms.is_some(), "{table}");
    }
    // Writes went on between the crashes.
    let puts = report.summary("put").unwrap();
    assert!(puts.count > 0, "{table}");
    assert_eq!(report.verification.keys_checked, 1000);
    assert!(table.contains("SIGKILLs"), "{table}");
}
