//! The reactor: binds the socket, accepts clients, hands each to its own
//! thread, and runs the clean shutdown on SIGINT/SIGTERM (and the other
//! stop signals, `crate::signals`).

use log::{debug, error, info, warn};
use std::collections::HashMap;
use std::fs;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use cube_protocol::{ErrorCode, Response, ServerError, StatsEntry, StatsValue};
use cube_store::disk_tier::TierConfig;
use cube_store::{
    CheckpointConfig, Engine, EngineConfig, GroupCommitConfig, RealDisk, RecoveryOptions,
    StoreError, StoreStatsSnapshot, SyncPolicy,
};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};

use crate::client_memory::ClientMemory;
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
                "another cubed (serving another data dir) is already listening on {}; \
                 pass a different --socket, or stop that cubed first",
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
    /// Every client's buffers against `--max-client-memory`; also holds
    /// each open connection's socket, for the shutdown.
    pub(crate) client_memory: Arc<ClientMemory>,
    /// Open connections per uid (administrators not counted), against
    /// `--max-connections-per-uid`.
    per_uid: Mutex<HashMap<u32, u32>>,
    active: AtomicUsize,
    started: Instant,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs the daemon until SIGINT/SIGTERM, then shuts down cleanly.
pub fn run(args: Args) -> Result<(), DaemonError> {
    let socket_path = args.socket_path();
    // The data dir first: when its daemon also holds the socket (the
    // default, DATA/cubed.sock), the lock is what is really in use.
    data_dir_free(&args.data)?;
    if UnixStream::connect(&socket_path).is_ok() {
        return Err(DaemonError::AlreadyRunning(socket_path));
    }
    ensure_file_descriptors(args.max_connections);
    warn_of_unsynced_writes(args.sync);
    let watch = crate::watch_hub::WatchHub::start().map_err(DaemonError::Io)?;
    let engine = open_engine(&args, &watch)?;
    log_recovery(&engine);
    watch.set_applied(engine.last_lsn());
    warm_writer_vm(&engine);

    let listener = bind_socket(&socket_path, args.socket_mode)?;
    let shared = Arc::new(Shared::new(args, engine, watch));

    if let Some(addr) = shared.args.metrics_listen {
        let bound = crate::metrics_http::start(addr, Arc::clone(&shared))?;
        info!("serving Prometheus metrics on http://{bound}/metrics");
    }

    let mut poll = Poll::new().map_err(DaemonError::Io)?;
    let (_waker, stop_requested) = watch_listener_and_signals(&poll, &listener)?;

    info!(
        "listening on {} (data {}, sync {}, pid {})",
        socket_path.display(),
        shared.args.data.display(),
        shared.args.sync,
        std::process::id()
    );
    accept_until_stopped(&mut poll, &listener, &shared, &stop_requested)?;

    info!("shutting down: no new connections; finishing in-flight requests");
    drop(listener);
    let _ = fs::remove_file(&socket_path);
    shutdown(&shared);
    Ok(())
}

/// Says, once at start, what a `--sync` that acknowledges writes before
/// their fsync can lose.
fn warn_of_unsynced_writes(sync: SyncPolicy) {
    if sync == SyncPolicy::Never {
        warn!(
            "--sync never: writes are NEVER fsynced; a crash of the machine loses acknowledged writes. Benchmarks only."
        );
    } else if let SyncPolicy::Interval { every, max_writes } = sync {
        warn!(
            "--sync {}: writes are acknowledged before fsync; a crash can lose up to {} ms or {max_writes} writes",
            sync,
            every.as_millis()
        );
    }
}

/// Opens (recovers) the store as the flags say, its applied groups told
/// to `watch`.
fn open_engine(
    args: &Args,
    watch: &Arc<crate::watch_hub::WatchHub>,
) -> Result<Engine, DaemonError> {
    Ok(Engine::open(EngineConfig {
        data_dir: args.data.clone(),
        storage: Arc::new(RealDisk),
        group_commit: GroupCommitConfig {
            sync: args.sync,
            segment_bytes: args.wal_segment_bytes,
            max_group_records: args.max_group_records.max(1),
            max_namespaces_per_owner: args.max_namespaces_per_uid as usize,
            unlimited_owners: vec![0, crate::access::daemon_uid()],
            answer_batch: Some(crate::write_reply::Cork::new_batch),
            commit_listener: Some(Arc::clone(watch) as Arc<dyn cube_store::CommitListener>),
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
        tiers: TierConfig::from_cache_bytes(args.cache_bytes(), args.memtable_bytes),
    })?)
}

/// Makes the writer's Lua VM now rather than inside the first `run` (half
/// a millisecond of that run's latency, and of every write queued behind
/// it).
fn warm_writer_vm(engine: &Engine) {
    if let Some(session) = engine.session()
        && let Ok((Err(why), _)) = session.transact(|_| crate::programs::warm_writer_vm())
    {
        warn!("{why}; cell programs will fail until it can start");
    }
}

impl Shared {
    fn new(args: Args, engine: Engine, watch: Arc<crate::watch_hub::WatchHub>) -> Shared {
        let programs = crate::programs::ProgramService::new(&args);
        let args_memory = args.max_client_memory;
        Shared {
            programs,
            watch,
            engine,
            args,
            stats: CommandStats::default(),
            shutting_down: AtomicBool::new(false),
            client_memory: ClientMemory::new(args_memory),
            per_uid: Mutex::new(HashMap::new()),
            active: AtomicUsize::new(0),
            started: Instant::now(),
        }
    }
}

/// Registers the listener with `poll`, and the stop signals: the flag
/// they set, and the waker (kept for as long as the poll) that wakes the
/// poll when they do.
fn watch_listener_and_signals(
    poll: &Poll,
    listener: &UnixListener,
) -> Result<(Arc<Waker>, Arc<AtomicBool>), DaemonError> {
    let waker = Arc::new(Waker::new(poll.registry(), WAKER).map_err(DaemonError::Io)?);
    poll.registry()
        .register(
            &mut SourceFd(&listener.as_raw_fd()),
            LISTENER,
            Interest::READABLE,
        )
        .map_err(DaemonError::Io)?;
    let stop_requested = Arc::new(AtomicBool::new(false));
    crate::signals::watch(Arc::clone(&stop_requested), Arc::clone(&waker))
        .map_err(DaemonError::Io)?;
    Ok((waker, stop_requested))
}

/// The reactor's loop: accepts every client that connects until a stop is
/// asked for.
fn accept_until_stopped(
    poll: &mut Poll,
    listener: &UnixListener,
    shared: &Arc<Shared>,
    stop_requested: &AtomicBool,
) -> Result<(), DaemonError> {
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
            retry_accept = accept_all(listener, shared, &next_id, stop_requested, retry_accept)
                == Backlog::RetryLater;
        }
    }
    Ok(())
}

/// Refuses (as `Engine::open` would, but before the socket is looked at) a
/// data dir whose LOCK another cubed holds. The probe's own lock is
/// dropped at once; a missing LOCK file means no daemon ever ran there.
fn data_dir_free(data: &Path) -> Result<(), DaemonError> {
    use std::io::Read;
    let Ok(mut lock) = fs::File::open(data.join("LOCK")) else {
        return Ok(());
    };
    match lock.try_lock_shared() {
        Err(fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = lock.read_to_string(&mut holder);
            Err(DaemonError::Store(StoreError::Locked {
                path: data.to_path_buf(),
                holder: holder.trim().to_owned(),
            }))
        }
        _ => Ok(()),
    }
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
    let tiers = engine.memstore().tier_stats();
    info!(
        "cells: {} namespace(s) in memory ({} of {} bytes), {} on disk (row cache {} bytes, \
         block cache {} bytes, run indexes {} bytes); memtables up to {} bytes (--cache-bytes, --memtable-bytes)",
        tiers.namespaces_in_memory,
        tiers.resident_bytes,
        tiers.resident_limit_bytes,
        tiers.namespaces_on_disk,
        tiers.rows.budget_bytes,
        tiers.cache.budget_bytes,
        tiers.run_index_bytes,
        tiers.memtable_limit_bytes
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
        let Some((peer, uid_slot)) = admit(shared, &stream) else {
            continue;
        };
        let id = next_id.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = spawn_connection(id, stream, shared, peer, uid_slot) {
            warn!("could not start a connection thread: {e}");
            count_refused(shared);
        }
    }
}

/// Checks a new client against `--max-connections`, the access lists and
/// `--max-connections-per-uid`: its peer and its uid's slot, or `None`
/// when it was refused (told why, and counted, when it can be).
fn admit(shared: &Arc<Shared>, stream: &UnixStream) -> Option<(crate::access::Peer, UidSlot)> {
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
        count_refused(shared);
        return None;
    }
    let peer = match crate::access::Peer::of(stream) {
        Ok(peer) => peer,
        Err(e) => {
            warn!("refused a connection whose peer credentials cannot be read: {e}");
            return None;
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
        count_refused(shared);
        return None;
    }
    let Some(uid_slot) = UidSlot::take(shared, &peer) else {
        let most = shared.args.max_connections_per_uid;
        warn!(
            "refused a connection from uid {}: it holds {most} connections, its --max-connections-per-uid",
            peer.uid
        );
        refuse(
            stream,
            ErrorCode::TooManyConnections,
            &format!(
                "uid {} already holds {most} connections, the most one uid may \
                 (--max-connections-per-uid {most}); close one and retry",
                peer.uid
            ),
        );
        count_refused(shared);
        return None;
    };
    Some((peer, uid_slot))
}

fn count_refused(shared: &Shared) {
    shared
        .stats
        .connections_refused
        .fetch_add(1, Ordering::Relaxed);
}

fn spawn_connection(
    id: u64,
    stream: UnixStream,
    shared: &Arc<Shared>,
    peer: crate::access::Peer,
    uid_slot: UidSlot,
) -> io::Result<()> {
    // Out of descriptors (or threads), the client is told so on the
    // stream already accepted, which needs none, instead of being dropped
    // without a word.
    let registered = match stream.try_clone() {
        Ok(registered) => registered,
        Err(e) => {
            refuse_unserved(&stream, &e);
            return Err(e);
        }
    };
    let account = shared.client_memory.open(id, peer.uid, registered);
    let slot = ConnectionSlot::take(id, shared, uid_slot);
    let unserved = |e: &io::Error| refuse_unserved(account.stream(), e);
    let mut connection = match Connection::new(stream, Arc::clone(shared), peer, &account) {
        Ok(connection) => connection,
        Err(e) => {
            unserved(&e);
            return Err(e);
        }
    };
    shared
        .stats
        .connections_accepted
        .fetch_add(1, Ordering::Relaxed);
    let thread_shared = Arc::clone(shared);
    let spawned = thread::Builder::new()
        .name(format!("cube-conn-{id}"))
        .stack_size(CONNECTION_STACK_BYTES)
        .spawn(move || {
            // Given back when this thread ends, also by a panic (and, if
            // the thread cannot start, when the closure is dropped).
            let _slot = slot;
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
        });
    if let Err(e) = spawned {
        unserved(&e);
        return Err(e);
    }
    Ok(())
}

/// A connection's place among `--max-connections` and its uid's
/// `--max-connections-per-uid`, and its memory account: all given back
/// when dropped, so a connection thread that panics releases them too.
struct ConnectionSlot {
    id: u64,
    shared: Arc<Shared>,
    _uid: UidSlot,
}

impl ConnectionSlot {
    fn take(id: u64, shared: &Arc<Shared>, uid: UidSlot) -> ConnectionSlot {
        shared.active.fetch_add(1, Ordering::SeqCst);
        ConnectionSlot {
            id,
            shared: Arc::clone(shared),
            _uid: uid,
        }
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.shared.client_memory.close(self.id);
        self.shared.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One connection of a uid, counted against `--max-connections-per-uid`
/// (administrators are not counted).
struct UidSlot {
    uid: Option<u32>,
    shared: Arc<Shared>,
}

impl UidSlot {
    /// `None` if the uid already holds its most.
    fn take(shared: &Arc<Shared>, peer: &crate::access::Peer) -> Option<UidSlot> {
        let uid = (!peer.is_admin).then_some(peer.uid);
        if let Some(uid) = uid {
            let mut per_uid = lock(&shared.per_uid);
            let held = per_uid.entry(uid).or_default();
            if *held >= shared.args.max_connections_per_uid {
                return None;
            }
            *held += 1;
        }
        Some(UidSlot {
            uid,
            shared: Arc::clone(shared),
        })
    }
}

impl Drop for UidSlot {
    fn drop(&mut self) {
        if let Some(uid) = self.uid {
            let mut per_uid = lock(&self.shared.per_uid);
            if let Some(held) = per_uid.get_mut(&uid) {
                *held -= 1;
                if *held == 0 {
                    per_uid.remove(&uid);
                }
            }
        }
    }
}

/// Tells an accepted client that the daemon lacks the resources to serve
/// it (`e`: out of file descriptors, usually).
fn refuse_unserved(stream: &UnixStream, e: &io::Error) {
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
fn refuse(stream: &UnixStream, code: ErrorCode, message: &str) {
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
    shared.client_memory.shutdown_reads();
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
        let s = self.engine.stats();
        let mut entries = self.daemon_entries();
        entries.extend(self.stats.entries());
        entries.extend(wal_entries(&s));
        entries.extend(checkpoint_entries(&s));
        entries.extend(cell_storage_entries(
            &s,
            &self.engine.memstore().tier_stats(),
        ));
        entries.extend(self.recovery_entries());
        entries.extend(self.programs.stats_entries(self.engine.memstore()));
        entries.extend(self.watch.stats_entries());
        entries
    }

    /// The daemon's own figures: version, uptime, connections, clients'
    /// memory, the store's size.
    fn daemon_entries(&self) -> Vec<StatsEntry> {
        vec![
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
            count("clients.memory_bytes", self.client_memory.used_bytes()),
            count(
                "clients.memory_limit_bytes",
                self.client_memory.limit_bytes(),
            ),
            count("clients.memory_cuts", self.client_memory.cuts()),
            count("store.cells", self.engine.memstore().cell_count()),
            count("store.edges", self.engine.memstore().edge_count()),
        ]
    }

    /// What recovery replayed at start.
    fn recovery_entries(&self) -> Vec<StatsEntry> {
        let r = self.engine.recovery_report();
        vec![
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
        ]
    }
}

/// The log's figures.
fn wal_entries(s: &StoreStatsSnapshot) -> Vec<StatsEntry> {
    vec![
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
            s.writer_failure.clone().unwrap_or_else(|| "none".into()),
        ),
        count("wal.disk_bytes", s.wal_disk_bytes),
        count("wal.group_records_p50", s.group_records_p50),
        count("wal.group_records_p99", s.group_records_p99),
        count("wal.fsync_us_p50", s.fsync_us_p50),
        count("wal.fsync_us_p99", s.fsync_us_p99),
    ]
}

/// The checkpointer's figures.
fn checkpoint_entries(s: &StoreStatsSnapshot) -> Vec<StatsEntry> {
    vec![
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
    ]
}

/// Where the cells are kept (`cube_store::disk_tier`): bytes on disk,
/// memory in use against its budgets, the block cache, work in flight.
fn cell_storage_entries(
    s: &StoreStatsSnapshot,
    tiers: &cube_store::disk_tier::TierStats,
) -> Vec<StatsEntry> {
    let mut entries = vec![
        count(
            "storage.disk_bytes",
            s.wal_disk_bytes + s.base_bytes + s.delta_bytes,
        ),
        count("storage.namespaces_in_memory", tiers.namespaces_in_memory),
        count("storage.namespaces_migrating", tiers.namespaces_migrating),
        count("storage.namespaces_on_disk", tiers.namespaces_on_disk),
        count("storage.resident_bytes", tiers.resident_bytes),
        count("storage.resident_limit_bytes", tiers.resident_limit_bytes),
        count("storage.run_index_bytes", tiers.run_index_bytes),
        count("storage.memtable_bytes", tiers.memtable_bytes),
        count("storage.memtable_limit_bytes", tiers.memtable_limit_bytes),
        count("storage.write_pause_us", s.write_pause_us),
        count("storage.folds_in_flight", s.folds_in_flight),
        count("storage.merges_in_flight", s.merges_in_flight),
        count("storage.migrations", tiers.migrations),
        count("storage.lookup_failures", tiers.lookup_failures),
        count(
            "storage.filter_loads_pending",
            cube_store::run_file::filter_loads_pending(),
        ),
    ];
    let (blocks, rows) = (&tiers.cache, &tiers.rows);
    entries.extend(cache_entries(
        "storage.cache",
        (
            blocks.bytes,
            blocks.budget_bytes,
            blocks.hits,
            blocks.misses,
        ),
    ));
    entries.extend(cache_entries(
        "storage.row_cache",
        (rows.bytes, rows.budget_bytes, rows.hits, rows.misses),
    ));
    entries.push(count("storage.row_cache_rows", rows.entries));
    entries
}

/// A cache's bytes against its budget, hits, misses and hit rate.
fn cache_entries(
    prefix: &str,
    (bytes, limit, hits, misses): (u64, u64, u64, u64),
) -> [StatsEntry; 5] {
    let rate = if hits + misses == 0 {
        0.0
    } else {
        hits as f64 / (hits + misses) as f64
    };
    [
        count(&format!("{prefix}_bytes"), bytes),
        count(&format!("{prefix}_limit_bytes"), limit),
        count(&format!("{prefix}_hits"), hits),
        count(&format!("{prefix}_misses"), misses),
        float(&format!("{prefix}_hit_rate"), rate),
    ]
}

fn text(name: &str, value: String) -> StatsEntry {
    StatsEntry {
        name: name.to_string(),
        value: StatsValue::Text(value),
    }
}

fn float(name: &str, value: f64) -> StatsEntry {
    StatsEntry {
        name: name.to_string(),
        value: StatsValue::Float(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A daemon's shared state over a throwaway data dir, no socket.
    fn shared(dir: &Path, extra: &[&str]) -> Arc<Shared> {
        let mut argv = vec!["cubed", "--data", dir.to_str().unwrap()];
        argv.extend_from_slice(extra);
        let args = <Args as clap::Parser>::try_parse_from(argv).unwrap();
        let engine = Engine::open(EngineConfig::new(dir)).unwrap();
        Arc::new(Shared {
            programs: crate::programs::ProgramService::new(&args),
            watch: crate::watch_hub::WatchHub::start().unwrap(),
            engine,
            client_memory: ClientMemory::new(args.max_client_memory),
            args,
            stats: CommandStats::default(),
            shutting_down: AtomicBool::new(false),
            per_uid: Mutex::new(HashMap::new()),
            active: AtomicUsize::new(0),
            started: Instant::now(),
        })
    }

    /// A connection thread that panics gives back its place, its uid's
    /// count and its memory account (a past bug: the cleanup ran
    /// after `Connection::run`, so a panic leaked a `--max-connections`
    /// slot for good).
    #[test]
    fn a_panicking_connection_thread_gives_its_slot_back() {
        let dir = tempfile::tempdir().unwrap();
        let shared = shared(dir.path(), &["--max-connections-per-uid", "1"]);
        let peer = crate::access::Peer {
            uid: 4242,
            gid: 4242,
            is_admin: false,
        };
        let (ours, _theirs) = UnixStream::pair().unwrap();
        let account = shared.client_memory.open(7, peer.uid, ours);
        account.charge(1000).unwrap();
        drop(account);
        let uid_slot = UidSlot::take(&shared, &peer).unwrap();
        assert!(UidSlot::take(&shared, &peer).is_none(), "one per uid");
        let slot = ConnectionSlot::take(7, &shared, uid_slot);
        assert_eq!(shared.active.load(Ordering::SeqCst), 1);
        let thread = thread::spawn(move || {
            let _slot = slot;
            panic!("a bug in a request handler");
        });
        assert!(thread.join().is_err());
        assert_eq!(shared.active.load(Ordering::SeqCst), 0);
        assert_eq!(shared.client_memory.used_bytes(), 0);
        assert!(lock(&shared.per_uid).is_empty());
        assert!(UidSlot::take(&shared, &peer).is_some());
        shared.engine.shutdown().unwrap();
    }
}
