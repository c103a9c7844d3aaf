//! `cubed --verify DIR`: print what the offline check found.

use std::path::Path;

use std::sync::Arc;

use cube_store::crypto::{Keyring, load_key_file};
use cube_store::verify::verify_data_dir_with_key;

/// Runs the check and returns the process exit code (0 clean, 1 problems
/// or the check could not run). With `key_file`, sealed records and blocks
/// of encrypted namespaces are opened (authenticated) too.
pub fn run(dir: &Path, key_file: Option<&Path>) -> i32 {
    let keyring = match key_file.map(load_key_file).transpose() {
        // Start id 0: a keyring that only opens (every sealed record and
        // block carries the start id it was sealed under), never seals.
        Ok(master) => master.map(|m| Arc::new(Keyring::new(Some(m), 0))),
        Err(e) => {
            eprintln!("cubed: {e}");
            return 1;
        }
    };
    let report = match verify_data_dir_with_key(dir, keyring) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("cubed: cannot verify {}: {e}", dir.display());
            return 1;
        }
    };
    println!("data dir    {}", dir.display());
    println!(
        "checkpoint  {} file(s), {} entries, up to LSN {}",
        report.checkpoint_files, report.checkpoint_entries, report.checkpoint_lsn
    );
    println!(
        "runs        {} file(s), {} entries",
        report.run_files, report.run_entries
    );
    println!(
        "wal         {} segment(s), {} records",
        report.wal_segments, report.wal_records
    );
    match report.cells {
        Some(cells) => println!("cells       {cells}"),
        None => println!("cells       (not counted: fix the problems first)"),
    }
    for note in &report.notes {
        println!("note        {note}");
    }
    for p in &report.problems {
        println!(
            "PROBLEM     {} at offset {}: {}",
            p.path.display(),
            p.offset,
            p.reason
        );
    }
    if report.is_clean() {
        println!("OK: every checksum verified, no problems");
        0
    } else {
        println!(
            "FAILED: {} problem(s). `cubed --repair` cuts the log at the first bad record; a damaged checkpoint file needs a backup",
            report.problems.len()
        );
        1
    }
}
