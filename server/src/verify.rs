//! `cubed --verify DIR`: print what the offline check found.

use std::path::Path;

use cube_store::verify::verify_data_dir;

/// Runs the check and returns the process exit code (0 clean, 1 problems
/// or the check could not run).
pub fn run(dir: &Path) -> i32 {
    let report = match verify_data_dir(dir) {
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
