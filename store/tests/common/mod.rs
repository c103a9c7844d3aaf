//! Helpers shared by the store's test binaries (not a test itself).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cube_store::EngineConfig;
use cube_store::sim_disk::SimDisk;

/// An engine on `disk` at `/sim/data`: small segments, so rolls happen, and
/// no background checkpoints, so a test decides when one runs.
pub fn sim_config(disk: &SimDisk) -> EngineConfig {
    let mut c = EngineConfig::new(Path::new("/sim/data"));
    c.storage = Arc::new(disk.clone());
    c.group_commit.segment_bytes = 4096;
    c.checkpoint.poll_interval = Duration::from_secs(3600);
    c
}
