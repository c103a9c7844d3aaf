//! The reactor: binds the socket, accepts clients, hands each to its own
//! thread, and runs the clean shutdown on SIGINT/SIGTERM.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Write};
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use cube_protocol::{ErrorCode, Response, ServerError, StatsEntry, StatsValue};
use cube_store::{
    CheckpointConfig, Engine, EngineConfig, GroupCommitConfig, RealDisk, RecoveryOptions,
    StoreError, SyncPolicy,
};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::command_stats::CommandStats;
use crate::config::Args;
use crate::connection::{Connection, count};

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);

/// Stack of each connection thread: request handling is shallow, and a
/// small stack is what lets a thousand connections cost little memory.
const CONNECTION_STACK_BYTES: usize = 256 * 1024;

/// How long a clean shutdown waits for in-flight requests.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// The daemon's one error enum.
#[derive(Debug)]
pub enum DaemonError {
    Store(StoreError),
    AlreadyRunning(PathBuf),
    Socket { path: PathBuf, source: io::Error },
    Io(io::Error),
}

impl std::fmt::Display for DaemonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DaemonError::Store(e) => write!(f, "{e}"),
            DaemonError::AlreadyRunning(path) => write!(
                f,
                "another cubed is already listening on {}; stop it first or pass a different --socket",
                path.display()
            ),
            DaemonError::Socket { path, source } => {
                write!(f, "cannot listen on {}: {source}", path.display())
            }
            DaemonError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for DaemonError {}

impl From<StoreError> for DaemonError {
    fn from(e: StoreError) -> DaemonError {
        DaemonError::Store(e)
    }
}

/// State every connection thread shares.
pub(crate) struct Shared {
    pub(crate) engine: Engine,
    pub(crate) args: Args,
    pub(crate) stats: CommandStats,
    /// Cell programs: budgets and figures.
    pub(crate) programs: crate::programs::ProgramService,
    /// Where applied groups meet the watches (`watch_hub.rs`).
    pub(crate) watch: Arc<crate::watch_hub::WatchHub>,
    pub(crate) shutting_down: AtomicBool,
    connections: Mutex<HashMap<u64, UnixStream>>,
    active: AtomicUsize,
    started: Instant,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs the daemon until SIGINT/SIGTERM, then shuts down cleanly.
pub fn run(args: Args) -> Result<(), DaemonError> {
    let socket_path = args.socket_path();
    if UnixStream::connect(&socket_path).is_ok() {
        return Err(DaemonError::AlreadyRunning(socket_path));
    }
    ensure_file_descriptors(args.max_connections);
    if args.sync == SyncPolicy::Never {
        warn!(
            "--sync never: writes are NEVER fsynced; a crash of the machine loses acknowledged writes. Benchmarks only."
        );
    } else if let SyncPolicy::Interval { every, max_writes } = args.sync {
        warn!(
            "--sync {}: writes are acknowledged before fsync; a crash can lose up to {} ms or {max_writes} writes",
            args.sync,
            every.as_millis()
        );
    }
    let watch = crate::watch_hub::WatchHub::start().map_err(DaemonError::Io)?;
    let engine = Engine::open(EngineConfig {
        data_dir: args.data.clone(),
        storage: Arc::new(RealDisk),
        group_commit: GroupCommitConfig {
            sync: args.sync,
            segment_bytes: args.wal_segment_bytes,
            max_group_records: args.max_group_records.max(1),
            answer_hooks: Some(crate::write_reply::ANSWER_HOOKS),
            commit_listener: Some(Arc::clone(&watch) as Arc<dyn cube_store::CommitListener>),
            ..GroupCommitConfig::default()
        },
        recovery: RecoveryOptions {
            repair: args.repair,
        },
        checkpoint: CheckpointConfig {
            checkpoint_wal_bytes: args.checkpoint_wal_bytes,
            delta_compact_bytes: args.delta_compact_bytes,
            ..CheckpointConfig::default()
        },
        key_file: args.key_file.clone(),
    })?;
    log_recovery(&engine);
    watch.set_applied(engine.last_lsn());
    // The writer's Lua VM, made now rather than inside the first `run`
    // (half a millisecond of that run's latency, and of every write
    // queued behind it).
    if let Some(session) = engine.session()
        && let Ok((Err(why), _)) = session.transact(|_| crate::programs::warm_writer_vm())
    {
        warn!("{why}; cell programs will fail until it can start");
    }

    let listener = bind_socket(&socket_path, args.socket_mode)?;
    let programs = crate::programs::ProgramService::new(&args);
    let shared = Arc::new(Shared {
        programs,
        watch,
        engine,
        args,
        stats: CommandStats::default(),
        shutting_down: AtomicBool::new(false),
        connections: Mutex::new(HashMap::new()),
        active: AtomicUsize::new(0),
        started: Instant::now(),
    });

    let mut poll = Poll::new().map_err(DaemonError::Io)?;
    let waker = Arc::new(Waker::new(poll.registry(), WAKER).map_err(DaemonError::Io)?);
    poll.registry()
        .register(
            &mut SourceFd(&listener.as_raw_fd()),
            LISTENER,
            Interest::READABLE,
        )
        .map_err(DaemonError::Io)?;
    let stop_requested = Arc::new(AtomicBool::new(false));
    watch_signals(Arc::clone(&stop_requested), Arc::clone(&waker))?;

    info!(
        "listening on {} (data {}, sync {}, pid {})",
        socket_path.display(),
        shared.args.data.display(),
        shared.args.sync,
        std::process::id()
    );
    let next_id = AtomicU64::new(1);
    let mut events = Events::with_capacity(64);
    // Set when accepting failed (out of file descriptors, say) with clients
    // still waiting: the listener is edge-triggered, so no new event may
    // come for them; the loop retries on a timer instead.
    let mut retry_accept = false;
    while !stop_requested.load(Ordering::SeqCst) {
        let timeout = retry_accept.then_some(ACCEPT_RETRY);
        if let Err(e) = poll.poll(&mut events, timeout) {
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(DaemonError::Io(e));
        }
        let listener_ready = events.iter().any(|event| event.token() == LISTENER);
        if listener_ready || retry_accept {
            retry_accept = accept_all(&listener, &shared, &next_id, &stop_requested, retry_accept)
                == Backlog::RetryLater;
        }
    }

    info!("shutting down: no new connections; finishing in-flight requests");
    drop(listener);
    let _ = fs::remove_file(&socket_path);
    shutdown(&shared);
    Ok(())
}

/// File descriptors a connection holds (its socket, the clones its
/// reader and the writer's answers use) and what the daemon needs besides
/// (log segments, checkpoint files, the listener, the poll).
const FDS_PER_CONNECTION: u64 = 4;
const FDS_BESIDES_CONNECTIONS: u64 = 256;

/// Raises the soft open-file limit towards what `max_connections` needs,
/// up to the hard limit. Below it, a connection past the descriptors would
/// be reset with no word (the cap's refusal frame needs a descriptor too),
/// and a common soft limit of 1024 runs out at about 250 connections.
fn ensure_file_descriptors(max_connections: usize) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let needed = max_connections as u64 * FDS_PER_CONNECTION + FDS_BESIDES_CONNECTIONS;
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    if soft >= needed {
        return;
    }
    let raised = needed.min(hard);
    let now = match setrlimit(Resource::RLIMIT_NOFILE, raised, hard) {
        Ok(()) => raised,
        Err(_) => soft,
    };
    if now < needed {
        warn!(
            "--max-connections {max_connections} needs about {needed} open files, but the limit is \
             {now} (hard limit {hard}): past about {} connections new clients will be cut off; \
             raise the limit (ulimit -n, or LimitNOFILE= in the service unit) or lower \
             --max-connections",
            now.saturating_sub(FDS_BESIDES_CONNECTIONS) / FDS_PER_CONNECTION
        );
    } else {
        info!(
            "raised the open-file limit from {soft} to {now} for --max-connections {max_connections}"
        );
    }
}

fn log_recovery(engine: &Engine) {
    let r = engine.recovery_report();
    if let Some(repair) = &r.repaired {
        warn!(
            "REPAIRED the log: cut {} at offset {} ({}); dropped {} bytes and {} later segment(s); saved in {}",
            repair.path.display(),
            repair.offset,
            repair.reason,
            repair.bytes_dropped,
            repair.segments_dropped,
            repair.saved_to.display()
        );
    }
    if let Some(torn) = &r.torn_tail {
        warn!(
            "truncated a torn tail of {} bytes at offset {} of {} (a write that was never acknowledged)",
            torn.bytes_truncated,
            torn.offset,
            torn.path.display()
        );
    }
    if let Some(path) = &r.torn_segment_removed {
        warn!(
            "removed {}: its creation was torn and it held no records",
            path.display()
        );
    }
    let c = engine.checkpoint_load();
    info!(
        "recovered: {} entries from checkpoint files ({} bytes base, {} bytes in {} delta(s), up to LSN {}) in {} ms, \
         then {} WAL records from {} segment(s) in {} ms; next LSN {}",
        c.entries,
        c.base_bytes,
        c.delta_bytes,
        c.delta_files,
        c.checkpoint_lsn,
        c.duration.as_millis(),
        r.records_replayed,
        r.segments,
        r.duration.as_millis(),
        r.next_lsn
    );
}

/// Binds at a temporary name, sets the mode, then renames into place, so
/// the socket is never reachable with looser permissions than asked for,
/// and a stale socket file from a dead daemon is replaced atomically.
fn bind_socket(path: &Path, mode: u32) -> Result<UnixListener, DaemonError> {
    let socket_error = |source| DaemonError::Socket {
        path: path.to_path_buf(),
        source,
    };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let _ = fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp).map_err(socket_error)?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(mode)).map_err(socket_error)?;
    fs::rename(&tmp, path).map_err(socket_error)?;
    listener.set_nonblocking(true).map_err(socket_error)?;
    Ok(listener)
}

fn watch_signals(stop: Arc<AtomicBool>, waker: Arc<Waker>) -> Result<(), DaemonError> {
    let mut signals = Signals::new([SIGINT, SIGTERM]).map_err(DaemonError::Io)?;
    thread::Builder::new()
        .name("cube-signals".into())
        .spawn(move || {
            let mut seen = 0;
            for signal in signals.forever() {
                seen += 1;
                if seen == 1 {
                    info!("signal {signal} received: shutting down cleanly");
                    stop.store(true, Ordering::SeqCst);
                    let _ = waker.wake();
                } else {
                    // Acknowledged writes are already durable; a second
                    // signal only gives up on waiting for slow clients.
                    warn!("second signal {signal}: exiting now");
                    std::process::exit(1);
                }
            }
        })
        .map_err(DaemonError::Io)?;
    Ok(())
}

/// How long the reactor waits before accepting again after `accept`
/// failed with clients still queued.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// How [`accept_all`] left the listener's queue.
#[derive(Debug, PartialEq, Eq)]
enum Backlog {
    /// Empty, or a stop was asked for: wait for the next event.
    Drained,
    /// `accept` failed (EMFILE and friends): clients may still be queued.
    RetryLater,
}

fn accept_all(
    listener: &UnixListener,
    shared: &Arc<Shared>,
    next_id: &AtomicU64,
    stop_requested: &AtomicBool,
    retrying: bool,
) -> Backlog {
    loop {
        // A flood of connects must not hold off a SIGTERM: the queue is
        // left to the shutdown, which closes the listener.
        if stop_requested.load(Ordering::SeqCst) {
            return Backlog::Drained;
        }
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Backlog::Drained,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // Said once, not at every retry.
                if !retrying {
                    warn!(
                        "accept failed: {e}; retrying every {} ms",
                        ACCEPT_RETRY.as_millis()
                    );
                }
                return Backlog::RetryLater;
            }
        };
        let active = shared.active.load(Ordering::SeqCst);
        if active >= shared.args.max_connections {
            refuse(
                stream,
                ErrorCode::TooManyConnections,
                &format!(
                    "too many connections ({active} of --max-connections {}); retry later or raise the cap",
                    shared.args.max_connections
                ),
            );
            shared
                .stats
                .connections_refused
                .fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let peer = match crate::access::Peer::of(&stream) {
            Ok(peer) => peer,
            Err(e) => {
                warn!("refused a connection whose peer credentials cannot be read: {e}");
                continue;
            }
        };
        if !peer.allowed_by(&shared.args) {
            warn!(
                "refused a connection from uid {} gid {}: not in --allow-uid / --allow-gid",
                peer.uid, peer.gid
            );
            refuse(
                stream,
                ErrorCode::PermissionDenied,
                &format!(
                    "uid {} (gid {}) may not use this daemon; its operator can add --allow-uid {}",
                    peer.uid, peer.gid, peer.uid
                ),
            );
            shared
                .stats
                .connections_refused
                .fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let id = next_id.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = spawn_connection(id, stream, shared, peer) {
            warn!("could not start a connection thread: {e}");
            shared
                .stats
                .connections_refused
                .fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn spawn_connection(
    id: u64,
    stream: UnixStream,
    shared: &Arc<Shared>,
    peer: crate::access::Peer,
) -> io::Result<()> {
    // Out of descriptors (or threads), the client is told so on the
    // stream already accepted, which needs none, instead of being dropped
    // without a word.
    let registered = match stream.try_clone() {
        Ok(registered) => registered,
        Err(e) => {
            refuse_unserved(stream, &e);
            return Err(e);
        }
    };
    let mut connection = match Connection::new(stream, Arc::clone(shared), peer) {
        Ok(connection) => connection,
        Err(e) => {
            refuse_unserved(registered, &e);
            return Err(e);
        }
    };
    shared.active.fetch_add(1, Ordering::SeqCst);
    lock(&shared.connections).insert(id, registered);
    shared
        .stats
        .connections_accepted
        .fetch_add(1, Ordering::Relaxed);
    let thread_shared = Arc::clone(shared);
    let spawned = thread::Builder::new()
        .name(format!("cube-conn-{id}"))
        .stack_size(CONNECTION_STACK_BYTES)
        .spawn(move || {
            let close = connection.run();
            if matches!(
                close,
                crate::connection::Close::IdleTimeout | crate::connection::Close::StalledMidFrame
            ) {
                thread_shared
                    .stats
                    .connections_timed_out
                    .fetch_add(1, Ordering::Relaxed);
            }
            debug!("connection {id} closed: {close}");
            drop(connection);
            lock(&thread_shared.connections).remove(&id);
            thread_shared.active.fetch_sub(1, Ordering::SeqCst);
        });
    if let Err(e) = spawned {
        // Taken out first: the write must not hold the connections' lock.
        let registered = lock(&shared.connections).remove(&id);
        if let Some(registered) = registered {
            refuse_unserved(registered, &e);
        }
        shared.active.fetch_sub(1, Ordering::SeqCst);
        return Err(e);
    }
    Ok(())
}

/// Tells an accepted client that the daemon lacks the resources to serve
/// it (`e`: out of file descriptors, usually).
fn refuse_unserved(stream: UnixStream, e: &io::Error) {
    refuse(
        stream,
        ErrorCode::TooManyConnections,
        &format!(
            "cubed cannot serve another connection now ({e}); retry later, \
             or raise its open-file limit (ulimit -n) or lower --max-connections"
        ),
    );
}

/// Tells a client why it is not being served, without letting a slow peer
/// stall the reactor.
fn refuse(stream: UnixStream, code: ErrorCode, message: &str) {
    let mut out = Vec::new();
    Response::encode_error(0, 0, &ServerError::new(code, message), &mut out);
    let mut stream = stream;
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
    let _ = stream.write_all(&out);
}

fn shutdown(shared: &Arc<Shared>) {
    shared.shutting_down.store(true, Ordering::SeqCst);
    // Wake every connection blocked in read: it sees end-of-file after
    // answering whatever it is in the middle of.
    for stream in lock(&shared.connections).values() {
        let _ = stream.shutdown(Shutdown::Read);
    }
    let deadline = Instant::now() + SHUTDOWN_GRACE;
    while shared.active.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
    }
    let left = shared.active.load(Ordering::SeqCst);
    if left > 0 {
        warn!(
            "{left} connection(s) still busy after {SHUTDOWN_GRACE:?}; stopping the writer anyway"
        );
    }
    match shared.engine.shutdown() {
        Ok(Some(report)) => info!(
            "final checkpoint: folded {} records from {} segment(s) into {} bytes in {} ms; checkpoint LSN {}",
            report.records_folded,
            report.segments_folded,
            report.delta_bytes,
            report.duration.as_millis(),
            report.checkpoint_lsn
        ),
        Ok(None) => {}
        Err(e) => {
            error!("final checkpoint failed (the WAL is kept; the next start replays it): {e}")
        }
    }
    let s = shared.engine.stats();
    info!(
        "stopped cleanly at LSN {} ({} WAL records written this run)",
        s.last_lsn, s.wal_records
    );
}

impl Shared {
    pub(crate) fn stats_entries(&self) -> Vec<StatsEntry> {
        let text = |name: &str, value: String| StatsEntry {
            name: name.to_string(),
            value: StatsValue::Text(value),
        };
        let float = |name: &str, value: f64| StatsEntry {
            name: name.to_string(),
            value: StatsValue::Float(value),
        };
        let s = self.engine.stats();
        let r = self.engine.recovery_report();
        let mut entries = vec![
            text("server.version", env!("CARGO_PKG_VERSION").to_string()),
            count("server.uptime_s", self.started.elapsed().as_secs()),
            text("server.sync", self.args.sync.to_string()),
            count(
                "connections.active",
                self.active.load(Ordering::Relaxed) as u64,
            ),
            count(
                "connections.accepted",
                self.stats.connections_accepted.load(Ordering::Relaxed),
            ),
            count(
                "connections.refused",
                self.stats.connections_refused.load(Ordering::Relaxed),
            ),
            count(
                "connections.timed_out",
                self.stats.connections_timed_out.load(Ordering::Relaxed),
            ),
            count("frames.bad", self.stats.bad_frames.load(Ordering::Relaxed)),
            count("store.cells", self.engine.memstore().cell_count()),
            count("store.edges", self.engine.memstore().edge_count()),
        ];
        for c in self.stats.figures() {
            entries.push(count(&format!("cmd.{}.count", c.name), c.count));
            entries.push(count(&format!("cmd.{}.errors", c.name), c.errors));
            entries.push(float(
                &format!("cmd.{}.latency_us_mean", c.name),
                c.latency_us_mean,
            ));
            for (figure, value) in [
                ("p50", c.latency_us_p50),
                ("p99", c.latency_us_p99),
                ("p999", c.latency_us_p999),
                ("max", c.latency_us_max),
            ] {
                entries.push(count(&format!("cmd.{}.latency_us_{figure}", c.name), value));
            }
        }
        entries.extend([
            count("wal.records", s.wal_records),
            count("wal.bytes", s.wal_bytes),
            count("wal.fsyncs", s.wal_fsyncs),
            count("wal.groups", s.wal_groups),
            float("wal.group_records_mean", s.group_records_mean),
            count("wal.group_records_max", s.group_records_max),
            float("wal.fsync_us_mean", s.fsync_us_mean),
            count("wal.fsync_us_max", s.fsync_us_max),
            count("wal.segments_created", s.segments_created),
            count("wal.last_lsn", s.last_lsn),
            count("wal.write_errors", s.write_errors),
            text(
                "writer.failure",
                s.writer_failure.unwrap_or_else(|| "none".into()),
            ),
            count("wal.disk_bytes", s.wal_disk_bytes),
            count("wal.group_records_p50", s.group_records_p50),
            count("wal.group_records_p99", s.group_records_p99),
            count("wal.fsync_us_p50", s.fsync_us_p50),
            count("wal.fsync_us_p99", s.fsync_us_p99),
            count("checkpoint.count", s.checkpoints),
            count("checkpoint.compactions", s.compactions),
            count("checkpoint.failures", s.checkpoint_failures),
            count("checkpoint.lsn", s.checkpoint_lsn),
            count("checkpoint.last_us", s.last_checkpoint_us),
            count("checkpoint.last_bytes", s.last_checkpoint_bytes),
            count("checkpoint.last_compaction_us", s.last_compaction_us),
            count("checkpoint.last_compaction_bytes", s.last_compaction_bytes),
            count("checkpoint.base_bytes", s.base_bytes),
            count("checkpoint.delta_bytes", s.delta_bytes),
            count("checkpoint.delta_files", s.delta_files),
            text(
                "checkpoint.last_failure",
                s.last_checkpoint_failure
                    .clone()
                    .unwrap_or_else(|| "none".into()),
            ),
            count(
                "recovery.checkpoint_entries",
                self.engine.checkpoint_load().entries,
            ),
            count(
                "recovery.checkpoint_ms",
                self.engine.checkpoint_load().duration.as_millis() as u64,
            ),
            count("recovery.records_replayed", r.records_replayed),
            count("recovery.ms", r.duration.as_millis() as u64),
            count(
                "recovery.torn_bytes_truncated",
                r.torn_tail.as_ref().map_or(0, |t| t.bytes_truncated),
            ),
        ]);
        entries.extend(self.programs.stats_entries(self.engine.memstore()));
        entries
    }
}
