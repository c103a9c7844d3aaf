//! The machine's floor for moving a box's scan page: its bytes (64 000
//! cells of the data set's value size, encoded as `scan` sends them)
//! through a `UnixStream` pair, one thread writing the whole page when the
//! other asks with one byte, as a daemon answers a request. Nothing is
//! encoded or decoded, so the box from the cache can never beat this.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::thread;
use std::time::{Duration, Instant};

use cube_protocol::{HEADER_BYTES, ScanPageEncoder};

use crate::error::StressError;
use crate::scale::report::Figure;

/// Pages moved; the figure is their median.
const ROUNDS: usize = 15;

/// What the measurement found.
#[derive(Clone, Debug, PartialEq)]
pub struct SocketFloor {
    pub page_bytes: usize,
    pub rounds: usize,
    pub p50_ms: f64,
    pub best_ms: f64,
}

/// A full scan page of `cells` cells with `value_size`-byte values: the
/// header, status, kind, count, the cells and a cursor flag.
pub fn page_bytes(cells: u64, value_size: usize) -> usize {
    let cells = usize::try_from(cells).unwrap_or(usize::MAX);
    let encoded = cells.saturating_mul(ScanPageEncoder::cell_bytes(value_size));
    encoded.saturating_add(HEADER_BYTES + 1 + 1 + 4 + 1)
}

/// Moves a page of `page_bytes` [`ROUNDS`] times, each from the ask to
/// its last byte read.
pub fn measure(page_bytes: usize) -> Result<SocketFloor, StressError> {
    let (mut asker, mut answerer) =
        UnixStream::pair().map_err(|e| StressError::io("cannot make a socket pair", e))?;
    let writer = thread::spawn(move || -> std::io::Result<()> {
        let page = vec![0x5au8; page_bytes];
        let mut ask = [0u8; 1];
        for _ in 0..ROUNDS {
            answerer.read_exact(&mut ask)?;
            answerer.write_all(&page)?;
        }
        Ok(())
    });
    let mut page = vec![0u8; page_bytes];
    let mut times = Vec::with_capacity(ROUNDS);
    let mut failure = None;
    for _ in 0..ROUNDS {
        let started = Instant::now();
        let moved = asker
            .write_all(&[1])
            .and_then(|()| asker.read_exact(&mut page));
        if let Err(e) = moved {
            failure = Some(e);
            break;
        }
        times.push(started.elapsed());
    }
    // Unblocks the writer if the reads stopped early.
    drop(asker);
    let written = writer
        .join()
        .map_err(|_| StressError::Usage("the socket floor's writer thread panicked".into()))?;
    if let Some(e) = failure.or(written.err()) {
        return Err(StressError::io("moving pages through a socket pair", e));
    }
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    Ok(SocketFloor {
        page_bytes,
        rounds: times.len(),
        p50_ms: times.get(times.len() / 2).copied().map_or(0.0, ms),
        best_ms: times.first().copied().map_or(0.0, ms),
    })
}

impl SocketFloor {
    pub fn figure(&self) -> Figure {
        let mib_per_sec = if self.p50_ms > 0.0 {
            self.page_bytes as f64 / (1024.0 * 1024.0) / (self.p50_ms / 1000.0)
        } else {
            0.0
        };
        Figure::new("socket_floor", "socket floor, one box page", "ms")
            .value(self.p50_ms)
            .detail("page_bytes", self.page_bytes as u64)
            .detail("best_ms", self.best_ms)
            .detail("mib_per_sec", mib_per_sec)
            .detail("rounds", self.rounds as u64)
            .target(
                "the machine's floor for the box from the cache (no target)",
                None,
            )
            .note(format!(
                "median of {} pages of {} bytes (64 000 cells as scan encodes them) through a \
                 UnixStream pair between two threads, each from a 1-byte ask to its last byte",
                self.rounds, self.page_bytes
            ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_is_its_cells_and_framing() {
        // 64 000 cells of 64-byte values: 80 bytes each, plus 27.
        assert_eq!(page_bytes(64_000, 64), 5_120_027);
        let floor = measure(page_bytes(100, 8)).unwrap();
        assert_eq!((floor.rounds, floor.page_bytes), (ROUNDS, 2427));
        assert!(floor.best_ms <= floor.p50_ms);
    }
}
