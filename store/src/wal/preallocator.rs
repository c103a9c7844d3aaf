//! A background thread that keeps the next WAL segment zero-filled and
//! ready, so rolling to a new segment costs a rename, not a 64 MiB write.

use std::path::PathBuf;
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use crossbeam_channel::{Receiver, SendError, bounded};

use crate::error::StoreError;
use crate::storage::Storage;
use crate::wal::segment::PreparedSegment;

pub struct SegmentPreallocator {
    rx: Option<Receiver<Result<PreparedSegment, StoreError>>>,
    thread: Option<JoinHandle<()>>,
}

impl SegmentPreallocator {
    /// Starts preparing segments of `bytes` in `dir`, one ahead of need.
    pub fn start(
        storage: Arc<dyn Storage>,
        dir: PathBuf,
        bytes: u64,
    ) -> std::io::Result<SegmentPreallocator> {
        // A rendezvous channel: exactly one prepared segment waits at a time.
        let (tx, rx) = bounded(0);
        let thread = thread::Builder::new()
            .name("cube-wal-prealloc".into())
            .spawn(move || {
                for n in 0u64.. {
                    match tx.send(PreparedSegment::prepare(storage.as_ref(), &dir, bytes, n)) {
                        Ok(()) => {}
                        Err(SendError(Ok(unused))) => {
                            unused.discard(storage.as_ref());
                            return;
                        }
                        Err(SendError(Err(_))) => return,
                    }
                }
            })?;
        Ok(SegmentPreallocator {
            rx: Some(rx),
            thread: Some(thread),
        })
    }

    /// The next prepared segment (waits if it is still being zero-filled).
    /// A preparation failure (e.g. ENOSPC) is returned as is.
    pub fn take(&self) -> Result<PreparedSegment, StoreError> {
        let gone = || StoreError::WritesDisabled("the WAL preallocation thread has stopped".into());
        self.rx
            .as_ref()
            .ok_or_else(gone)?
            .recv()
            .map_err(|_| gone())?
    }
}

impl Drop for SegmentPreallocator {
    fn drop(&mut self) {
        // Closing the channel makes the thread's pending send fail; it then
        // deletes the file it prepared and exits.
        drop(self.rx.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
