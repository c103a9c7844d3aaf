//! The machine's floor for a cold read: `pread` of one 4 KiB block at a
//! random aligned offset of a large file, with `O_DIRECT` where the file
//! system allows it (so the page cache does not answer); where it does
//! not, the figure says it measured buffered reads. Measured one read at
//! a time and with as many reads in flight as the cold gets have clients
//! (a device's read takes longer with others queued beside it): a burst
//! of [`Budget::BURST`] reads, and for as long as the cold gets run
//! ([`Budget::sustained`]). The two differ where the device is rate
//! limited, as a VM's virtual disk often is (the development VM's
//! answers 50-70 k reads/s at 16 in flight for about five seconds, then
//! 15-20 k: `fio --rw=randread --bs=4k --direct=1 --numjobs=16`).

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::error::StressError;
use crate::latency::new_histogram;
use crate::rng::Rng;

pub const BLOCK_BYTES: u64 = 4096;
/// How much a floor measurement reads: `reads` blocks (all threads
/// together) or for `time`, whichever ends first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    pub reads: u64,
    pub time: Duration,
}

impl Budget {
    /// A burst: 4000 reads (at most 10 s), a fraction of a second on a
    /// device that is not rate limited, and inside its burst on one that is.
    pub const BURST: Budget = Budget {
        reads: 4000,
        time: Duration::from_secs(10),
    };

    /// Reads for `time`, however many.
    pub fn sustained(time: Duration) -> Budget {
        Budget {
            reads: u64::MAX,
            time,
        }
    }
}
const WRITE_CHUNK_BYTES: usize = 1 << 20;

/// What the floor measurement found.
#[derive(Clone, Debug, PartialEq)]
pub struct Floor {
    /// Reads in flight: threads each reading one block at a time.
    pub in_flight: usize,
    pub reads: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub reads_per_sec: f64,
    pub file_bytes: u64,
    /// `O_DIRECT`, or why the reads went through the page cache.
    pub mode: String,
    pub direct: bool,
}

/// The floor file's size for a data set of `data_bytes`: as large as the
/// data (so offsets spread as cold gets do), between 64 MiB and 4 GiB.
pub fn file_bytes_for(data_bytes: u64) -> u64 {
    data_bytes.clamp(64 << 20, 4 << 30) / BLOCK_BYTES * BLOCK_BYTES
}

/// Makes `path` ([`ensure_file`]), then measures reads of it,
/// `in_flight` at a time, within `budget`.
pub fn measure(
    path: &Path,
    bytes: u64,
    seed: u64,
    in_flight: usize,
    budget: Budget,
) -> Result<Floor, StressError> {
    ensure_file(path, bytes)?;
    let (file, direct, mode) = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(file) => (file, true, "O_DIRECT".to_owned()),
        Err(e) => (
            File::open(path)
                .map_err(|e| StressError::io(format!("cannot open {}", path.display()), e))?,
            false,
            format!("buffered, through the page cache (O_DIRECT refused: {e})"),
        ),
    };
    match read_blocks(&file, bytes, seed, in_flight, budget) {
        Ok(floor) => Ok(Floor {
            direct,
            mode,
            file_bytes: bytes,
            ..floor
        }),
        // Some file systems accept the flag at open and refuse the reads.
        Err(e) if direct => {
            let file = File::open(path)
                .map_err(|e| StressError::io(format!("cannot open {}", path.display()), e))?;
            let floor = read_blocks(&file, bytes, seed, in_flight, budget)
                .map_err(|e| StressError::io(format!("cannot read {}", path.display()), e))?;
            Ok(Floor {
                direct: false,
                mode: format!("buffered, through the page cache (O_DIRECT reads failed: {e})"),
                file_bytes: bytes,
                ..floor
            })
        }
        Err(e) => Err(StressError::io(
            format!("cannot read {}", path.display()),
            e,
        )),
    }
}

/// Makes `path`, `bytes` of incompressible data, synced, unless it is
/// already that size.
pub fn ensure_file(path: &Path, bytes: u64) -> Result<(), StressError> {
    if fs::metadata(path).is_ok_and(|m| m.len() == bytes) {
        return Ok(());
    }
    let io = |e| StressError::io(format!("cannot write {}", path.display()), e);
    let mut file = File::create(path).map_err(io)?;
    let mut rng = Rng::new(bytes);
    let mut chunk = vec![0u8; WRITE_CHUNK_BYTES];
    let mut written = 0u64;
    while written < bytes {
        for word in chunk.chunks_mut(8) {
            word.copy_from_slice(&rng.next_u64().to_le_bytes());
        }
        let take = (bytes - written).min(WRITE_CHUNK_BYTES as u64) as usize;
        file.write_all(&chunk[..take]).map_err(io)?;
        written += take as u64;
    }
    file.sync_all().map_err(io)
}

/// Reads random aligned blocks on `in_flight` threads, each one at a
/// time into its own aligned buffer.
fn read_blocks(
    file: &File,
    bytes: u64,
    seed: u64,
    in_flight: usize,
    budget: Budget,
) -> std::io::Result<Floor> {
    let in_flight = in_flight.max(1);
    let began = Instant::now();
    let per_thread = Budget {
        reads: budget.reads.div_ceil(in_flight as u64),
        ..budget
    };
    let histograms = std::thread::scope(|scope| {
        let readers: Vec<_> = (0..in_flight as u64)
            .map(|thread| {
                scope.spawn(move || read_on_thread(file, bytes, seed ^ thread, per_thread))
            })
            .collect();
        readers
            .into_iter()
            .map(|reader| {
                reader
                    .join()
                    .unwrap_or_else(|e| std::panic::resume_unwind(e))
            })
            .collect::<std::io::Result<Vec<_>>>()
    })?;
    let seconds = began.elapsed().as_secs_f64();
    let mut histogram = new_histogram();
    for h in &histograms {
        let _ = histogram.add(h);
    }
    let reads = histogram.len();
    Ok(Floor {
        in_flight,
        reads,
        p50_us: histogram.value_at_quantile(0.5),
        p99_us: histogram.value_at_quantile(0.99),
        reads_per_sec: reads as f64 / seconds.max(1e-9),
        file_bytes: bytes,
        mode: String::new(),
        direct: true,
    })
}

/// One thread's reads, within `budget`.
fn read_on_thread(
    file: &File,
    bytes: u64,
    seed: u64,
    budget: Budget,
) -> std::io::Result<hdrhistogram::Histogram<u64>> {
    // O_DIRECT needs a block-aligned buffer: the aligned block inside a
    // buffer twice its size.
    let mut buffer = vec![0u8; 2 * BLOCK_BYTES as usize];
    let start = buffer.as_ptr().align_offset(BLOCK_BYTES as usize);
    let block = &mut buffer[start..start + BLOCK_BYTES as usize];
    let mut rng = Rng::new(seed ^ 0x00F1_0012);
    let blocks = (bytes / BLOCK_BYTES).max(1);
    let mut histogram = new_histogram();
    let began = Instant::now();
    while histogram.len() < budget.reads && began.elapsed() < budget.time {
        let offset = rng.below(blocks) * BLOCK_BYTES;
        let at = Instant::now();
        file.read_exact_at(block, offset)?;
        let us = at.elapsed().as_micros().max(1) as u64;
        let _ = histogram.record(us.min(histogram.high()));
    }
    Ok(histogram)
}
