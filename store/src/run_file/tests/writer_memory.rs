//! What a writer holds while it writes: run alone, since peak RSS is the
//! process's (`cargo test -p cube-store --lib writer_peak_memory --
//! --ignored --nocapture`, `N=` entries, 10 M by default). Prints the
//! bytes held per entry; docs/storage-format.md ("Writing") quotes it.

use super::*;

/// A field of /proc/self/status, in KiB.
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Writes N tombstones (the smallest entries: what is held per entry
/// weighs most) and reports the peak RSS the writer added.
#[test]
#[ignore = "a measurement: run alone, see the module doc"]
fn writer_peak_memory() {
    let n: u64 = std::env::var("N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("r");
    let base = status_kib("VmRSS:");
    let mut w = RunFileWriter::create(&RealDisk, &path, 1, 1, &Protection::Plain, n).unwrap();
    for key in 0..n {
        w.push(u128::from(key), None).unwrap();
    }
    w.finish().unwrap();
    let held = status_kib("VmHWM:") - base;
    println!(
        "{n} entries: the writer held {held} KiB at its peak, {:.2} bytes an entry",
        held as f64 * 1024.0 / n as f64
    );
}
