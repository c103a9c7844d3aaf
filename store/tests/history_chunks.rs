//! Guards the memory a `watch --from` replay holds: the log is read back
//! in chunks of `HISTORY_CHUNK_BYTES`, never a whole segment at once, and
//! every record still comes back in LSN order with its group ends.
#![allow(clippy::unwrap_used)]

mod common;

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use cube_protocol::{Coord, NamespaceName};
use cube_store::sim_disk::{FaultPlan, SimDisk};
use cube_store::storage::{OpenMode, Storage, StorageFile};
use cube_store::wal::{HISTORY_CHUNK_BYTES, History};
use cube_store::{Engine, Mutation};

/// A disk that, once armed, counts whole-file reads of WAL segments and
/// the largest positioned read.
#[derive(Debug, Clone)]
struct Counting {
    inner: SimDisk,
    armed: Arc<AtomicBool>,
    whole_segment_reads: Arc<AtomicUsize>,
    largest_read_bytes: Arc<AtomicUsize>,
}

#[derive(Debug)]
struct CountingFile {
    inner: Box<dyn StorageFile>,
    disk: Counting,
}

impl StorageFile for CountingFile {
    fn write_all_at(&mut self, bytes: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_all_at(bytes, offset)
    }
    fn read_exact_at(&self, bytes: &mut [u8], offset: u64) -> io::Result<()> {
        if self.disk.armed.load(Ordering::SeqCst) {
            self.disk
                .largest_read_bytes
                .fetch_max(bytes.len(), Ordering::SeqCst);
        }
        self.inner.read_exact_at(bytes, offset)
    }
    fn sync_data(&mut self) -> io::Result<()> {
        self.inner.sync_data()
    }
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
}

impl Storage for Counting {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>> {
        Ok(Box::new(CountingFile {
            inner: self.inner.open(path, mode)?,
            disk: self.clone(),
        }))
    }
    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>> {
        if self.armed.load(Ordering::SeqCst) && path.extension().is_some_and(|e| e == "wal") {
            self.whole_segment_reads.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.read_file(path)
    }
    fn file_len(&self, path: &Path) -> io::Result<u64> {
        self.inner.file_len(path)
    }
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.inner.list_dir(dir)
    }
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.inner.create_dir_all(dir)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_file(path)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.inner.sync_dir(dir)
    }
}

#[test]
fn a_replay_reads_the_log_in_bounded_chunks_and_misses_nothing() {
    let disk = Counting {
        inner: SimDisk::new(FaultPlan::default()),
        armed: Arc::default(),
        whole_segment_reads: Arc::default(),
        largest_read_bytes: Arc::default(),
    };
    let mut config = common::sim_config(&disk.inner);
    config.storage = Arc::new(disk.clone());
    // One segment far bigger than a chunk holds all the writes.
    config.group_commit.segment_bytes = 16 * 1024 * 1024;
    let engine = Engine::open(config).unwrap();
    let ns = NamespaceName::new("default").unwrap();
    let puts = 800u64;
    let value_bytes = 4_000;
    for i in 0..puts {
        let value = vec![(i % 251) as u8; value_bytes];
        let mutation = Mutation::Put {
            ns: ns.clone(),
            coord: Coord::new(i as i32, 0, 0),
            value,
        };
        engine.session().unwrap().write(mutation).unwrap();
    }
    let last = engine.last_lsn();
    assert!(
        last as usize * value_bytes > 8 * HISTORY_CHUNK_BYTES,
        "the log must be many chunks long for this test to mean anything"
    );

    disk.armed.store(true, Ordering::SeqCst);
    let mut next = 1;
    let mut put_values = 0u64;
    let history = engine
        .read_history(1, last, |lsn, mutation, group_end| {
            assert_eq!(lsn, next, "records come in LSN order, none skipped");
            next += 1;
            if let Mutation::Put { coord, value, .. } = mutation {
                assert_eq!(value, vec![(coord.x % 251) as u8; value_bytes]);
                put_values += 1;
                // Each put was its own commit group.
                assert!(group_end, "LSN {lsn} ends its group");
            }
            true
        })
        .unwrap();
    assert_eq!(history, History::Read);
    assert_eq!(next, last + 1);
    assert_eq!(put_values, puts);
    assert_eq!(
        disk.whole_segment_reads.load(Ordering::SeqCst),
        0,
        "a segment was read whole"
    );
    let largest = disk.largest_read_bytes.load(Ordering::SeqCst);
    assert!(
        largest <= HISTORY_CHUNK_BYTES,
        "a read of {largest} bytes, past the chunk of {HISTORY_CHUNK_BYTES}"
    );
}
