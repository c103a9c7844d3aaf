//! Helpers shared by the store's test binaries (not a test itself).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cube_store::EngineConfig;
use cube_store::sim_disk::SimDisk;

/// An engine on `disk` at `/sim/data`: small segments, so rolls happen, and
/// no background checkpoints, so a test decides when one runs.
#[allow(dead_code)] // not every test binary uses every helper
pub fn sim_config(disk: &SimDisk) -> EngineConfig {
    let mut c = EngineConfig::new(Path::new("/sim/data"));
    c.storage = Arc::new(disk.clone());
    c.group_commit.segment_bytes = 4096;
    c.checkpoint.poll_interval = Duration::from_secs(3600);
    // Merges on the merge thread, but waited for: one order of I/O per seed.
    c.checkpoint.wait_for_merges = true;
    c
}

/// Where each record of a WAL segment's bytes ends (up to the first
/// record that does not parse).
#[allow(dead_code)] // not every test binary uses every helper
pub fn record_ends(bytes: &[u8]) -> Vec<u64> {
    let header = cube_store::wal::segment::parse_segment_header(bytes).unwrap();
    let mut ends = Vec::new();
    let mut at = header.header_bytes;
    while let Ok(record) = cube_store::wal::record::parse_record(&bytes[at..], header.crc_seed) {
        at += record.total_bytes;
        ends.push(at as u64);
    }
    ends
}
