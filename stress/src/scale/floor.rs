//! The machine's floor for a cold read: `pread` of one 4 KiB block at a
//! random aligned offset of the data set's own run files (the files cold
//! gets read, each picked in proportion to its size, as uniformly random
//! gets pick them), with `O_DIRECT` where the file system allows it (so
//! the page cache does not answer); where it does not, the figure says it
//! measured buffered reads. Measured one read at a time and with as many
//! reads in flight as the cold gets have clients (a device's read takes
//! longer with others queued beside it): a burst of [`Budget::BURST`]
//! reads, and for as long as the cold gets run ([`Budget::sustained`]).
//!
//! Why the data set's files and not a file of its own: under a VM the
//! host may still hold what the guest wrote last. On the development VM
//! a 4 GiB file of random bytes, written and synced just before, read at
//! 55-58 k reads/s at 16 in flight (`fio --rw=randread --bs=4k --direct=1
//! --numjobs=16`), while the 17 GB run file written minutes earlier read
//! at 7.9-9.3 k reads/s (p50 about 1.8 ms) on the same device in the
//! same minutes: a floor file of its own measured the host's cache, not
//! the reads the cold gets wait on.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
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

/// The data set's run files, open for the floor's reads.
pub struct FloorFiles {
    /// Each file with its whole 4 KiB blocks, in name order.
    files: Vec<(PathBuf, File, u64)>,
    /// `O_DIRECT`, or why the reads go through the page cache.
    mode: String,
    direct: bool,
}

impl FloorFiles {
    /// Opens every `*.run` file under `checkpoint_dir` (at least one whole
    /// block long), with `O_DIRECT` if the file system takes it.
    pub fn open(checkpoint_dir: &Path) -> Result<FloorFiles, StressError> {
        let io = |what: &str, e| {
            StressError::io(format!("cannot {what} {}", checkpoint_dir.display()), e)
        };
        let mut paths: Vec<_> = fs::read_dir(checkpoint_dir)
            .map_err(|e| io("list", e))?
            .filter_map(|entry| entry.ok().map(|entry| entry.path()))
            .filter(|path| path.extension().is_some_and(|ext| ext == "run"))
            .collect();
        paths.sort();
        let mut files = Vec::new();
        let (mut direct, mut mode) = (true, "O_DIRECT".to_owned());
        for path in paths {
            let opened = if direct {
                OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(&path)
            } else {
                File::open(&path)
            };
            let file = match opened {
                Ok(file) => file,
                Err(e) if direct => {
                    direct = false;
                    mode = format!("buffered, through the page cache (O_DIRECT refused: {e})");
                    File::open(&path).map_err(|e| io("open a run file in", e))?
                }
                Err(e) => return Err(io("open a run file in", e)),
            };
            let blocks = file
                .metadata()
                .map_err(|e| io("stat a run file in", e))?
                .len()
                / BLOCK_BYTES;
            if blocks > 0 {
                files.push((path, file, blocks));
            }
        }
        if files.is_empty() {
            return Err(StressError::Usage(format!(
                "no run file of a block or more in {} to measure the pread floor on: \
                 the data set keeps its cells in memory; ask for more --cells",
                checkpoint_dir.display()
            )));
        }
        Ok(FloorFiles {
            files,
            mode,
            direct,
        })
    }

    /// The files' whole blocks, in bytes.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|(_, _, blocks)| blocks).sum::<u64>() * BLOCK_BYTES
    }

    /// The file and offset of block `n` of them all (`n` below their
    /// total): files in proportion to their size.
    fn block(&self, mut n: u64) -> (&File, u64) {
        for (_, file, blocks) in &self.files {
            if n < *blocks {
                return (file, n * BLOCK_BYTES);
            }
            n -= blocks;
        }
        unreachable!("block {n} past the files' end")
    }

    /// `floor` as measured on these files.
    fn describe(&self, floor: Floor) -> Floor {
        Floor {
            direct: self.direct,
            mode: format!(
                "{}, the data set's {} run files",
                self.mode,
                self.files.len()
            ),
            file_bytes: self.bytes(),
            ..floor
        }
    }

    /// Reopens the files without `O_DIRECT`, after reads with it failed
    /// (some file systems accept the flag at open and refuse the reads).
    fn buffered(&self, why: &std::io::Error) -> std::io::Result<FloorFiles> {
        let files = self
            .files
            .iter()
            .map(|(path, _, blocks)| File::open(path).map(|file| (path.clone(), file, *blocks)))
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(FloorFiles {
            files,
            mode: format!("buffered, through the page cache (O_DIRECT reads failed: {why})"),
            direct: false,
        })
    }
}

/// Measures reads of `files`, `in_flight` at a time, within `budget`.
pub fn measure(
    files: &FloorFiles,
    seed: u64,
    in_flight: usize,
    budget: Budget,
) -> Result<Floor, StressError> {
    let failed = |e| StressError::io("cannot read the data set's run files".to_owned(), e);
    match read_blocks(files, seed, in_flight, budget) {
        Ok(floor) => Ok(files.describe(floor)),
        Err(e) if files.direct => {
            let buffered = files.buffered(&e).map_err(failed)?;
            let floor = read_blocks(&buffered, seed, in_flight, budget).map_err(failed)?;
            Ok(buffered.describe(floor))
        }
        Err(e) => Err(failed(e)),
    }
}

/// Reads random aligned blocks on `in_flight` threads, each one at a
/// time into its own aligned buffer.
fn read_blocks(
    files: &FloorFiles,
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
            .map(|thread| scope.spawn(move || read_on_thread(files, seed ^ thread, per_thread)))
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
        file_bytes: files.bytes(),
        mode: String::new(),
        direct: files.direct,
    })
}

/// One thread's reads, within `budget`.
fn read_on_thread(
    files: &FloorFiles,
    seed: u64,
    budget: Budget,
) -> std::io::Result<hdrhistogram::Histogram<u64>> {
    // O_DIRECT needs a block-aligned buffer: the aligned block inside a
    // buffer twice its size.
    let mut buffer = vec![0u8; 2 * BLOCK_BYTES as usize];
    let start = buffer.as_ptr().align_offset(BLOCK_BYTES as usize);
    let block = &mut buffer[start..start + BLOCK_BYTES as usize];
    let mut rng = Rng::new(seed ^ 0x00F1_0012);
    let blocks = files.bytes() / BLOCK_BYTES;
    let mut histogram = new_histogram();
    let began = Instant::now();
    while histogram.len() < budget.reads && began.elapsed() < budget.time {
        let (file, offset) = files.block(rng.below(blocks));
        let at = Instant::now();
        file.read_exact_at(block, offset)?;
        let us = at.elapsed().as_micros().max(1) as u64;
        let _ = histogram.record(us.min(histogram.high()));
    }
    Ok(histogram)
}
