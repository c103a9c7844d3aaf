//! The ceiling server behind `ceiling-echo` and `ceiling-sync`
//! (`ceiling.rs` has the why and the wire format): the hidden subcommand
//! `cube-stress ceiling-server --socket PATH --mode echo|sync --dir DIR`.
//!
//! Threads: an accept loop, one thread per connection (blocking reads and
//! writes), and in sync mode one writer thread plus a preallocator that
//! keeps the next log segment zero-filled, as cube's does. In sync mode
//! the log is segments of [`SEGMENT_BYTES`] in DIR, records back to back:
//! x, y, z as i32 LE, value length u32 LE, value. Nothing reads it back:
//! there is no recovery, only the cost of making writes durable.
//!
//! The queues are std's bounded `sync_channel` (since Rust 1.67 the same
//! implementation as crossbeam-channel, which cube uses), so the driver
//! needs no new dependency.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::hash::{BuildHasher, RandomState};
use std::io::{self, BufReader, Read, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, sync_channel};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use clap::Args;
use cube_protocol::Coord;

use super::ceiling::{
    CeilingMode, FrameError, MAX_VALUE_BYTES, Op, REQUEST_HEADER_BYTES, STATUS_FOUND, STATUS_OK,
    encode_reply, read_request,
};
use crate::error::StressError;

/// Connections served at once; one past it is closed as soon as accepted
/// (each costs a thread).
const MAX_CONNECTIONS: usize = 1024;
/// Stack of a connection thread: it only decodes frames and copies values.
const CONNECTION_STACK_BYTES: usize = 256 << 10;
/// Read buffer per connection: a request of a typical value arrives in one
/// `read`.
const CONNECTION_READ_BUFFER_BYTES: usize = 16 << 10;
/// A client that does not take its reply within this long is dropped, so
/// it cannot pin a thread forever.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Writes queued for the writer. Each connection has at most one write in
/// flight and there are at most [`MAX_CONNECTIONS`], so a send never waits.
const WRITE_QUEUE_CAPACITY: usize = 4096;
/// The most records one group commits. cube's writer caps its groups too
/// (more loosely); with one write in flight per connection, neither cap is
/// reached below 1024 clients.
const MAX_GROUP_RECORDS: usize = 1024;
/// A group stops taking records once its bytes reach this.
const MAX_GROUP_BYTES: usize = 4 << 20;
/// x, y, z, value length.
const LOG_RECORD_HEADER_BYTES: usize = 3 * 4 + 4;
/// One log segment, zero-filled and synced before use so that a group's
/// `fdatasync` flushes data only, never a file-size change (cube's reason
/// for preallocating; it makes each sync several times cheaper). Smaller
/// than cubed's 64 MiB only so that the server starts quickly: the zeros
/// written per logged byte are the same.
pub const SEGMENT_BYTES: u64 = 16 << 20;
/// The largest group always fits in an empty segment.
const _: () = assert!(
    (MAX_GROUP_BYTES + LOG_RECORD_HEADER_BYTES + MAX_VALUE_BYTES as usize) as u64 <= SEGMENT_BYTES
);
/// Zeros written per `write` while preparing a segment.
const ZERO_CHUNK_BYTES: usize = 1 << 20;
/// Shards of the in-memory map: few enough to be cheap, enough that
/// connection threads rarely wait for each other.
const CELL_SHARDS: usize = 64;

#[derive(Args, Debug, Clone)]
pub struct CeilingServerArgs {
    /// Where to listen (created; must not exist).
    #[arg(long, value_name = "PATH")]
    pub socket: PathBuf,

    /// echo: puts answered at once; sync: after a group-commit fdatasync.
    #[arg(long, value_enum)]
    pub mode: CeilingMode,

    /// Directory for the log segments (sync mode).
    #[arg(long, value_name = "DIR", required_if_eq("mode", "sync"))]
    pub dir: Option<PathBuf>,

    /// Exit when stdin reaches its end: the parent holds the other end of
    /// a pipe, so the server goes away with it even after a SIGKILL.
    #[arg(long)]
    pub exit_with_stdin: bool,
}

/// Runs the server until the process is killed (or stdin closes with
/// `--exit-with-stdin`); returns only when it cannot start.
pub fn serve(args: &CeilingServerArgs) -> Result<(), StressError> {
    let (queue, writer_parts) = match args.mode {
        CeilingMode::Echo => (None, None),
        CeilingMode::Sync => {
            let dir = args.dir.as_deref().ok_or_else(|| {
                StressError::Usage("ceiling-server --mode sync needs --dir".to_owned())
            })?;
            let log = open_log(dir)?;
            let (queue_tx, queue_rx) = sync_channel(WRITE_QUEUE_CAPACITY);
            (Some(queue_tx), Some((queue_rx, log)))
        }
    };
    let shared = Arc::new(Shared {
        cells: ShardedCells::new(),
        writer: queue,
        wal: WalFigures::default(),
        bad_frames: AtomicU64::new(0),
        last_bad_frame: Mutex::new(None),
        live_connections: AtomicUsize::new(0),
    });
    if let Some((queue_rx, log)) = writer_parts {
        let writer_shared = Arc::clone(&shared);
        thread::Builder::new()
            .name("ceiling-writer".to_owned())
            .spawn(move || {
                let _exit = ExitWhenWriterStops;
                run_writer(&queue_rx, log, &writer_shared);
            })
            .map_err(|e| StressError::io("cannot start the writer", e))?;
    }
    if args.exit_with_stdin {
        thread::Builder::new()
            .name("ceiling-stdin".to_owned())
            .spawn(exit_when_stdin_closes)
            .map_err(|e| StressError::io("cannot start the stdin watcher", e))?;
    }
    let listener = UnixListener::bind(&args.socket)
        .map_err(|e| StressError::io(format!("cannot listen on {}", args.socket.display()), e))?;
    // A plain blocking accept loop: cubed accepts in a mio reactor (so it
    // can also wake for shutdown and enforce its limits there), but the
    // accept path is not what a ceiling measures.
    for stream in listener.incoming() {
        match stream {
            Ok(stream) => admit(stream, &shared),
            Err(e) => {
                eprintln!("ceiling-server: accept failed: {e}");
                // Out of descriptors, say: let connections close first.
                thread::sleep(Duration::from_millis(10));
            }
        }
    }
    Ok(())
}

fn exit_when_stdin_closes() {
    let mut buffer = [0u8; 64];
    loop {
        match io::stdin().read(&mut buffer) {
            Ok(0) => std::process::exit(0),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                eprintln!("ceiling-server: stdin failed ({e}); exiting");
                std::process::exit(1);
            }
        }
    }
}

/// What every thread shares.
struct Shared {
    cells: ShardedCells,
    /// The writer's queue; `None` in echo mode.
    writer: Option<SyncSender<WriteRequest>>,
    /// Kept by the writer alone; read by stats.
    wal: WalFigures,
    bad_frames: AtomicU64,
    /// Why the latest bad frame was refused (one line, for stats).
    last_bad_frame: Mutex<Option<String>>,
    live_connections: AtomicUsize,
}

/// Holds one of the [`MAX_CONNECTIONS`] places until dropped.
struct ConnectionPlace(Arc<Shared>);

impl Drop for ConnectionPlace {
    fn drop(&mut self) {
        self.0.live_connections.fetch_sub(1, Relaxed);
    }
}

/// Gives an accepted connection its own thread, or closes it when the
/// server is full or no thread can be started.
fn admit(stream: UnixStream, shared: &Arc<Shared>) {
    if shared.live_connections.fetch_add(1, Relaxed) >= MAX_CONNECTIONS {
        shared.live_connections.fetch_sub(1, Relaxed);
        return;
    }
    // Taken before the spawn and moved into the thread: if the spawn
    // fails, the closure and the place are dropped together.
    let place = ConnectionPlace(Arc::clone(shared));
    let spawned = thread::Builder::new()
        .name("ceiling-conn".to_owned())
        .stack_size(CONNECTION_STACK_BYTES)
        .spawn(move || {
            let ConnectionPlace(shared) = &place;
            serve_connection(stream, shared);
        });
    if let Err(e) = spawned {
        eprintln!("ceiling-server: cannot start a connection thread: {e}");
    }
}

/// Answers one connection's requests in order until it closes or sends a
/// bad frame.
fn serve_connection(stream: UnixStream, shared: &Shared) {
    if stream.set_write_timeout(Some(WRITE_TIMEOUT)).is_err() {
        return;
    }
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::with_capacity(CONNECTION_READ_BUFFER_BYTES, read_half);
    let mut writer = stream;
    // This connection's "your write is durable" signal; one write in
    // flight at a time, so one slot.
    let (durable_tx, durable_rx) = sync_channel::<()>(1);
    let mut reply = Vec::with_capacity(REQUEST_HEADER_BYTES + 256);
    loop {
        let request = match read_request(&mut reader) {
            Ok(Some(request)) => request,
            Ok(None) | Err(FrameError::SocketFailed) => return,
            Err(FrameError::Malformed(why)) => {
                shared.bad_frames.fetch_add(1, Relaxed);
                *lock(&shared.last_bad_frame) = Some(why);
                return;
            }
        };
        reply.clear();
        match request.op {
            Op::Put => {
                match &shared.writer {
                    None => shared.cells.insert(request.coord, request.value),
                    Some(queue) => {
                        let write = WriteRequest {
                            coord: request.coord,
                            value: request.value,
                            durable: durable_tx.clone(),
                        };
                        // Fails only when the writer is gone, and then the
                        // process is exiting (ExitWhenWriterStops).
                        if queue.send(write).is_err() || durable_rx.recv().is_err() {
                            return;
                        }
                    }
                }
                encode_reply(STATUS_OK, &[], &mut reply);
            }
            Op::Get => shared.cells.read(request.coord, |value| match value {
                Some(value) => encode_reply(STATUS_FOUND, value, &mut reply),
                None => encode_reply(STATUS_OK, &[], &mut reply),
            }),
            Op::Stats => encode_reply(STATUS_OK, stats_text(shared).as_bytes(), &mut reply),
        }
        if writer.write_all(&reply).is_err() {
            return;
        }
    }
}

/// The stats reply (`KIND NAME VALUE` lines), in cube's names.
fn stats_text(shared: &Shared) -> String {
    let mut lines = vec![format!("c frames.bad {}", shared.bad_frames.load(Relaxed))];
    if let Some(why) = lock(&shared.last_bad_frame).as_deref() {
        lines.push(format!("t frames.last_bad {why}"));
    }
    if shared.writer.is_none() {
        lines.push("t server.sync none (puts answered at once from memory)".to_owned());
    } else {
        let wal = &shared.wal;
        let records = wal.records.load(Relaxed);
        let groups = wal.groups.load(Relaxed);
        let fsync_us_total = wal.fsync_us_total.load(Relaxed);
        let mean = |total: u64, count: u64| {
            if count == 0 {
                0.0
            } else {
                total as f64 / count as f64
            }
        };
        lines.extend([
            "t server.sync fdatasync per group (group commit)".to_owned(),
            format!("c cmd.put.count {records}"),
            format!("c wal.records {records}"),
            format!("c wal.bytes {}", wal.bytes.load(Relaxed)),
            format!("c wal.groups {groups}"),
            // One fdatasync per group.
            format!("c wal.fsyncs {groups}"),
            format!("f wal.group_records_mean {}", mean(records, groups)),
            format!(
                "c wal.group_records_max {}",
                wal.group_records_max.load(Relaxed)
            ),
            format!("f wal.fsync_us_mean {}", mean(fsync_us_total, groups)),
            format!("c wal.fsync_us_max {}", wal.fsync_us_max.load(Relaxed)),
        ]);
    }
    lines.join("\n")
}

/// The in-memory map, sharded by coordinate so that connection threads
/// (and the writer) rarely wait for the same lock.
struct ShardedCells {
    shards: Vec<Mutex<HashMap<Coord, Vec<u8>>>>,
    hasher: RandomState,
}

impl ShardedCells {
    fn new() -> ShardedCells {
        ShardedCells {
            shards: (0..CELL_SHARDS)
                .map(|_| Mutex::new(HashMap::new()))
                .collect(),
            hasher: RandomState::new(),
        }
    }

    fn shard(&self, coord: Coord) -> MutexGuard<'_, HashMap<Coord, Vec<u8>>> {
        let index = self.hasher.hash_one(coord) as usize % self.shards.len();
        lock(&self.shards[index])
    }

    fn insert(&self, coord: Coord, value: Vec<u8>) {
        self.shard(coord).insert(coord, value);
    }

    /// Calls `answer` with the value at `coord` under the shard's lock (no
    /// copy of the value besides the reply's).
    fn read(&self, coord: Coord, answer: impl FnOnce(Option<&[u8]>)) {
        answer(self.shard(coord).get(&coord).map(Vec::as_slice));
    }
}

/// A poisoned lock is taken anyway: a thread that panicked holding one
/// cannot have left a map entry or a reason half-written.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A put on its way to the writer.
struct WriteRequest {
    coord: Coord,
    value: Vec<u8>,
    /// Signalled once the write is durable and visible to gets.
    durable: SyncSender<()>,
}

/// The writer's figures, in cube's units; written by the writer only.
#[derive(Default)]
struct WalFigures {
    records: AtomicU64,
    bytes: AtomicU64,
    groups: AtomicU64,
    group_records_max: AtomicU64,
    fsync_us_total: AtomicU64,
    fsync_us_max: AtomicU64,
}

/// Prepares the first segment (before the socket exists, so a client never
/// waits on it) and starts the preallocator for the next ones.
fn open_log(dir: &Path) -> Result<Log, StressError> {
    let first = prepare_segment(dir, 0).map_err(|e| {
        StressError::io(
            format!("cannot prepare a log segment in {}", dir.display()),
            e,
        )
    })?;
    // A rendezvous channel: exactly one prepared segment waits at a time.
    let (segment_tx, segment_rx) = sync_channel(0);
    let segment_dir = dir.to_owned();
    thread::Builder::new()
        .name("ceiling-prealloc".to_owned())
        .spawn(move || {
            for number in 1u64.. {
                if segment_tx
                    .send(prepare_segment(&segment_dir, number))
                    .is_err()
                {
                    return;
                }
            }
        })
        .map_err(|e| StressError::io("cannot start the preallocator", e))?;
    Ok(Log {
        segment: first,
        written: 0,
        next_segments: segment_rx,
    })
}

/// Creates segment `number` in `dir`, zero-filled to [`SEGMENT_BYTES`] and
/// synced, with the directory synced so the file itself is durable.
fn prepare_segment(dir: &Path, number: u64) -> io::Result<File> {
    let path = dir.join(format!("{number:08}.log"));
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)?;
    let zeros = vec![0u8; ZERO_CHUNK_BYTES];
    let mut left = SEGMENT_BYTES;
    while left > 0 {
        let chunk = left.min(ZERO_CHUNK_BYTES as u64) as usize;
        file.write_all(&zeros[..chunk])?;
        left -= chunk as u64;
    }
    file.sync_all()?;
    File::open(dir)?.sync_all()?;
    Ok(file)
}

/// The log the writer appends to.
struct Log {
    segment: File,
    /// Bytes of records in `segment`; the rest is zeros.
    written: u64,
    next_segments: Receiver<io::Result<File>>,
}

impl Log {
    /// Writes `records` with one `pwrite` and makes them durable with one
    /// `fdatasync`; returns how long the `fdatasync` took.
    fn append_durably(&mut self, records: &[u8]) -> io::Result<Duration> {
        let length = records.len() as u64;
        if self.written + length > SEGMENT_BYTES {
            self.segment = self
                .next_segments
                .recv()
                .map_err(|_| io::Error::other("the preallocator stopped without saying why"))??;
            self.written = 0;
        }
        self.segment.write_all_at(records, self.written)?;
        self.written += length;
        let started = Instant::now();
        self.segment.sync_data()?;
        Ok(started.elapsed())
    }
}

/// Ends the process when the writer thread ends (it never returns, so
/// only by a panic, dropping this while unwinding): connection threads
/// waiting for their writes would otherwise wait forever, and no write may
/// be answered without the writer.
struct ExitWhenWriterStops;

impl Drop for ExitWhenWriterStops {
    fn drop(&mut self) {
        eprintln!("ceiling-server: the writer thread stopped; exiting");
        std::process::exit(1);
    }
}

/// The writer: takes everything queued (a group), logs it with one write
/// and one `fdatasync`, applies it to the map, then wakes each waiting
/// connection. Runs as long as the process (`Shared` holds a sender of
/// its queue, so the queue never closes).
fn run_writer(queue: &Receiver<WriteRequest>, mut log: Log, shared: &Shared) {
    let mut group: Vec<WriteRequest> = Vec::with_capacity(MAX_GROUP_RECORDS);
    let mut records: Vec<u8> = Vec::with_capacity(MAX_GROUP_BYTES);
    while let Ok(first) = queue.recv() {
        group.clear();
        records.clear();
        encode_record(&first, &mut records);
        group.push(first);
        while group.len() < MAX_GROUP_RECORDS && records.len() < MAX_GROUP_BYTES {
            match queue.try_recv() {
                Ok(write) => {
                    encode_record(&write, &mut records);
                    group.push(write);
                }
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        let fsync = match log.append_durably(&records) {
            Ok(fsync) => fsync,
            Err(e) => {
                // After a failed fsync the page cache may hold data the disk
                // does not: nothing may be answered as durable, ever again.
                eprintln!(
                    "ceiling-server: cannot make a group of {} writes durable: {e}; exiting",
                    group.len()
                );
                std::process::exit(1);
            }
        };
        let wal = &shared.wal;
        let fsync_us = u64::try_from(fsync.as_micros()).unwrap_or(u64::MAX);
        wal.records.fetch_add(group.len() as u64, Relaxed);
        wal.bytes.fetch_add(records.len() as u64, Relaxed);
        wal.groups.fetch_add(1, Relaxed);
        wal.group_records_max.fetch_max(group.len() as u64, Relaxed);
        wal.fsync_us_total.fetch_add(fsync_us, Relaxed);
        wal.fsync_us_max.fetch_max(fsync_us, Relaxed);
        for write in group.drain(..) {
            shared.cells.insert(write.coord, write.value);
            // The connection waits on the other end; if it is gone there
            // is no one to tell.
            let _ = write.durable.send(());
        }
    }
}

/// x, y, z as i32 LE, the value's length as u32 LE, the value.
fn encode_record(write: &WriteRequest, out: &mut Vec<u8>) {
    for axis in [write.coord.x, write.coord.y, write.coord.z] {
        out.extend_from_slice(&axis.to_le_bytes());
    }
    // Values are bounded by MAX_VALUE_BYTES when read off the socket.
    let length = u32::try_from(write.value.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&length.to_le_bytes());
    out.extend_from_slice(&write.value);
}
