//! The write-ahead log: append-only segment files of CRC32C-framed records.
//!
//! - [`record`]: one record's framing (`crc | len | lsn | kind | payload`).
//! - [`segment`]: one file, named by its first LSN, with a fixed header.
//! - [`chain`]: with a master key, the MAC that ends every commit group.
//! - [`crc_seed`]: the secret per-segment seed of the record checksums.
//! - [`recovery`]: reading every segment back at start, deciding torn tail
//!   versus corruption, and the explicit `--repair`.

pub mod chain;
pub mod crc_seed;
pub mod history;
pub mod preallocator;
pub mod record;
pub mod recovery;
pub mod sealing_rule;
pub mod segment;

pub use crc_seed::{CrcSeed, SegmentSeeds};
pub use history::{HISTORY_CHUNK_BYTES, History, read_history};
pub use preallocator::SegmentPreallocator;
pub use recovery::{
    RecoveryOptions, RecoveryReport, list_segments, read_closed_segment, recover, recover_with,
};
pub use sealing_rule::SealingRule;
pub use segment::WalSegment;
