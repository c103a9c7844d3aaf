//! `cube-stress --workload watch`: writers in a plane, watchers on tiles
//! of it, and whether each watcher saw exactly the acknowledged writes of
//! its tile, in LSN order.
//!
//! Three runs, each on a fresh throwaway `cubed` with the same flags:
//! 1. the writers alone (`--clients` threads of durable puts on random
//!    cells of a `PLANE`-square plane) for `--duration`: their throughput;
//! 2. the same with `--watchers` watches on `TILE`-square tiles (several
//!    per tile when there are more watchers than tiles) and `--stalled`
//!    watches of the whole plane that never read: the writers' throughput again, the
//!    commit-to-delivery latency (from the writer receiving its
//!    acknowledgement to a watcher receiving the change; a change that
//!    reaches the watcher first counts as 1 µs), the daemon's RSS growth,
//!    and the check: after the writers stop, one end marker per tile, and
//!    each watcher must have seen exactly its tile's acknowledged writes
//!    (the watchers are followed from `--follower-threads` threads polling
//!    their sockets, `watch_follow.rs`, not a thread each);
//! 3. `--replay-changes` puts written in batches, then one watch of the
//!    whole plane `--from 1`: the replay's changes per second.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use clap::Args;
use cube_client::{BatchOp, CellBox, Coord, LocalDaemon};
use hdrhistogram::Histogram;

use crate::error::StressError;
use crate::latency::new_histogram;
use crate::watch_follow::{self, Seen};

/// The plane the writers write: cells `0..PLANE` on x and y, z = 0.
const PLANE: i32 = 256;
/// A watcher's tile side; `(PLANE / TILE)^2` tiles.
const TILE: i32 = 16;
/// The value a tile's end marker holds.
const END: &[u8] = b"end";
/// Puts per batch when filling the log for the replay.
const REPLAY_BATCH: usize = 8192;

/// The flags only this workload has (the rest come from the run's).
#[derive(Args, Clone, Debug)]
pub struct WatchArgs {
    /// watch only: watches following tiles of the plane.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub watchers: usize,

    /// watch only: watches of the whole plane that subscribe and never
    /// read (their buffers fill; they are cut off, the writers must not
    /// notice).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub stalled: usize,

    /// watch only: threads following the watchers' sockets (each polls
    /// its share and reads every ready one per wakeup).
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub follower_threads: usize,

    /// watch only: changes written for the replay measurement (0: skip it).
    #[arg(long, value_name = "N", default_value_t = 1_000_000)]
    pub replay_changes: u64,
}

/// What one run of the workload found.
pub struct WatchReport {
    pub writers_alone_ops: f64,
    pub writers_watched_ops: f64,
    pub latency: Histogram<u64>,
    pub delivered: u64,
    pub rss_growth_kib: i64,
    /// The same without watchers: what the writes themselves cost.
    pub alone_rss_growth_kib: i64,
    pub replay_changes: u64,
    pub replay_secs: f64,
    pub failures: Vec<String>,
}

/// The settings the run takes from the common flags.
pub struct WatchSetup<'a> {
    pub clients: usize,
    pub duration: Duration,
    pub value_size: usize,
    pub daemon_args: &'a [String],
    pub progress: bool,
}

pub fn run(setup: &WatchSetup<'_>, args: &WatchArgs) -> Result<WatchReport, StressError> {
    let daemon_args = daemon_args(setup);
    let say = |text: String| {
        if setup.progress {
            eprintln!("cube-stress: {text}");
        }
    };
    say(format!("watch: {} writers alone", setup.clients));
    let (alone, alone_rss_growth_kib) = {
        let daemon = start(&daemon_args)?;
        let before = rss_kib(daemon.pid());
        let ops = write_for(&daemon, setup, &[])?.ops_per_sec;
        (ops, rss_kib(daemon.pid()) as i64 - before as i64)
    };
    say(format!(
        "watch: {} writers beside {} watchers and {} stalled ones",
        setup.clients, args.watchers, args.stalled
    ));
    let daemon = start(&daemon_args)?;
    let rss_before = rss_kib(daemon.pid());
    let watchers = start_watchers(&daemon, args.watchers, args.follower_threads)?;
    let stalled: Vec<cube_client::Watch> = (0..args.stalled)
        .map(|_| {
            let client = daemon.client()?;
            client.watch("default", plane(), None)
        })
        .collect::<Result<_, _>>()
        .map_err(|e| StressError::Usage(format!("a stalled watch did not start: {e}")))?;
    let tiles: Vec<usize> = (0..tile_count()).collect();
    let written = write_for(&daemon, setup, &tiles)?;
    let rss_growth_kib = rss_kib(daemon.pid()) as i64 - rss_before as i64;
    drop(stalled);
    let seen_by_watcher = watchers
        .join()
        .map_err(|_| StressError::Usage("a watcher thread panicked".into()))?;
    let Deliveries {
        failures,
        latency,
        delivered,
    } = check_all(seen_by_watcher, &written);
    let (replay_changes, replay_secs) = if args.replay_changes > 0 {
        say(format!("watch: replaying {} changes", args.replay_changes));
        replay(&daemon, args.replay_changes)?
    } else {
        (0, 0.0)
    };
    Ok(WatchReport {
        writers_alone_ops: alone,
        writers_watched_ops: written.ops_per_sec,
        latency,
        delivered,
        rss_growth_kib,
        alone_rss_growth_kib,
        replay_changes,
        replay_secs,
        failures,
    })
}

/// The daemon's flags: the setup's, with the whole log kept (the replay
/// reads history from it) and room for every watcher's connection unless
/// the setup says otherwise.
fn daemon_args<'s>(setup: &'s WatchSetup<'_>) -> Vec<&'s str> {
    let mut daemon_args: Vec<&str> = setup.daemon_args.iter().map(String::as_str).collect();
    if !daemon_args
        .iter()
        .any(|a| a.starts_with("--checkpoint-wal-bytes"))
    {
        daemon_args.extend(["--checkpoint-wal-bytes", "17179869184"]);
    }
    if !daemon_args
        .iter()
        .any(|a| a.starts_with("--max-connections"))
    {
        daemon_args.extend(["--max-connections", "4096"]);
    }
    daemon_args
}

/// What the watchers were delivered, checked against what was written.
struct Deliveries {
    failures: Vec<String>,
    /// Commit-to-delivery latency of every change delivered.
    latency: Histogram<u64>,
    delivered: u64,
}

/// Checks each watcher's changes against the writes of its tile.
fn check_all(seen_by_watcher: Vec<Result<Seen, String>>, written: &Written) -> Deliveries {
    let mut deliveries = Deliveries {
        failures: Vec::new(),
        latency: new_histogram(),
        delivered: 0,
    };
    for (index, seen) in seen_by_watcher.into_iter().enumerate() {
        let seen = match seen {
            Ok(seen) => seen,
            Err(e) => {
                deliveries.failures.push(format!("watcher {index}: {e}"));
                continue;
            }
        };
        deliveries.delivered += seen.len() as u64;
        if let Err(e) = check(index, &seen, written, &mut deliveries.latency) {
            deliveries.failures.push(e);
        }
    }
    deliveries
}

fn start(args: &[&str]) -> Result<LocalDaemon, StressError> {
    LocalDaemon::start_fresh(args)
        .map_err(|e| StressError::Usage(format!("cannot start cubed: {e}")))
}

fn tile_count() -> usize {
    ((PLANE / TILE) * (PLANE / TILE)) as usize
}

/// Tile `i` (modulo the tile count) of the plane.
fn tile(i: usize) -> CellBox {
    let i = (i % tile_count()) as i32;
    let per_row = PLANE / TILE;
    let lo = Coord::new(i % per_row * TILE, i / per_row * TILE, 0);
    let hi = Coord::new(lo.x + TILE - 1, lo.y + TILE - 1, 0);
    CellBox::new(lo, hi).expect("a tile's corners are ordered")
}

/// The whole plane the writers write.
fn plane() -> CellBox {
    CellBox::new(Coord::new(0, 0, 0), Coord::new(PLANE - 1, PLANE - 1, 0))
        .expect("a plane's corners are ordered")
}

/// Starts `n` watchers, each subscribed before this returns, followed by
/// `threads` threads (`watch_follow`).
fn start_watchers(
    daemon: &LocalDaemon,
    n: usize,
    threads: usize,
) -> Result<thread::JoinHandle<Vec<Result<Seen, String>>>, StressError> {
    let mut watches = Vec::with_capacity(n);
    for i in 0..n {
        let watch = watch_follow::start_watch(daemon.socket(), "default", tile(i), END)
            .map_err(|e| StressError::Usage(format!("watcher {i} did not start: {e}")))?;
        watches.push(watch);
    }
    watch_follow::follow_on_threads(watches, threads).map_err(StressError::Usage)
}

/// Every acknowledged put: LSN to (coordinate, value, acknowledged at).
struct Written {
    puts: HashMap<u64, (Coord, Vec<u8>, Instant)>,
    ops_per_sec: f64,
}

/// Runs the writers for the duration, then puts the end marker of each
/// of `end_tiles`.
fn write_for(
    daemon: &LocalDaemon,
    setup: &WatchSetup<'_>,
    end_tiles: &[usize],
) -> Result<Written, StressError> {
    let stop = Arc::new(AtomicBool::new(false));
    let barrier = Arc::new(Barrier::new(setup.clients + 1));
    let mut handles = Vec::new();
    for writer in 0..setup.clients {
        let mut client = daemon
            .client()
            .map_err(|e| StressError::Usage(format!("writer {writer} cannot connect: {e}")))?;
        let stop = Arc::clone(&stop);
        let barrier = Arc::clone(&barrier);
        let value_size = setup.value_size.max(16);
        handles.push(thread::spawn(move || {
            let mut puts = Vec::new();
            let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ writer as u64;
            barrier.wait();
            let mut seq = 0u64;
            while !stop.load(Ordering::Relaxed) {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1);
                let x = ((state >> 33) % PLANE as u64) as i32;
                let y = ((state >> 13) % PLANE as u64) as i32;
                let coord = Coord::new(x, y, 0);
                let mut value = format!("{writer}:{seq}:").into_bytes();
                value.resize(value_size, b'.');
                let lsn = client
                    .put("default", coord, &value)
                    .map_err(|e| format!("writer {writer}: {e}"))?;
                puts.push((lsn, coord, value, Instant::now()));
                seq += 1;
            }
            Ok::<_, String>(puts)
        }));
    }
    barrier.wait();
    let started = Instant::now();
    thread::sleep(setup.duration);
    stop.store(true, Ordering::Relaxed);
    let mut puts = HashMap::new();
    for handle in handles {
        let list = handle
            .join()
            .map_err(|_| StressError::Usage("a writer thread panicked".into()))?
            .map_err(StressError::Usage)?;
        for (lsn, coord, value, at) in list {
            puts.insert(lsn, (coord, value, at));
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let ops_per_sec = puts.len() as f64 / seconds;
    let mut client = daemon
        .client()
        .map_err(|e| StressError::Usage(format!("cannot connect: {e}")))?;
    for &i in end_tiles {
        client
            .put("default", tile(i).lo(), END)
            .map_err(|e| StressError::Usage(format!("end marker: {e}")))?;
    }
    Ok(Written { puts, ops_per_sec })
}

/// Watcher `index` must have seen exactly its tile's acknowledged puts,
/// in LSN order; records the latency of each.
fn check(
    index: usize,
    seen: &Seen,
    written: &Written,
    latency: &mut Histogram<u64>,
) -> Result<(), String> {
    let region = tile(index);
    let mut expected: Vec<u64> = written
        .puts
        .iter()
        .filter(|(_, (coord, _, _))| region.contains(*coord))
        .map(|(lsn, _)| *lsn)
        .collect();
    expected.sort_unstable();
    let got: Vec<u64> = seen.iter().map(|s| s.0).collect();
    if got != expected {
        let missing = expected.iter().filter(|l| !got.contains(l)).count();
        return Err(format!(
            "watcher {index} (tile {region}): saw {} changes, expected {} ({missing} missing, \
             in order: {})",
            got.len(),
            expected.len(),
            got.windows(2).all(|p| p[0] < p[1])
        ));
    }
    for (lsn, coord, value, at) in seen {
        let (w_coord, w_value, acked) = &written.puts[lsn];
        if w_coord != coord || w_value != value {
            return Err(format!(
                "watcher {index}: LSN {lsn} came as {coord} {value:?}, was written as {w_coord}"
            ));
        }
        let us = at.saturating_duration_since(*acked).as_micros() as u64;
        let _ = latency.record(us.max(1));
    }
    Ok(())
}

/// Writes `n` puts in batches, then times one watch of the whole plane
/// replaying them `--from 1`.
fn replay(daemon: &LocalDaemon, n: u64) -> Result<(u64, f64), StressError> {
    let fail = |e: cube_client::ClientError| StressError::Usage(format!("replay: {e}"));
    let mut client = daemon.client().map_err(fail)?;
    let mut written = 0u64;
    let mut last = 0u64;
    while written < n {
        let count = (n - written).min(REPLAY_BATCH as u64);
        let mut ops: Vec<BatchOp> = (0..count)
            .map(|i| {
                let k = (written + i) as i32;
                BatchOp::Put {
                    coord: Coord::new(k % PLANE, k / PLANE % PLANE, 0),
                    value: b"replayed".to_vec(),
                }
            })
            .collect();
        let ack = client.batch("default", &mut ops).map_err(fail)?;
        last = ack.lsn + u64::from(ack.applied) - 1;
        written += count;
    }
    let started = Instant::now();
    let mut watch = daemon
        .client()
        .map_err(fail)?
        .watch("default", plane(), Some(1))
        .map_err(fail)?;
    let mut changes = 0u64;
    for group in watch.by_ref() {
        let group = group.map_err(fail)?;
        changes += group.changes.len() as u64;
        if group.last_lsn() >= last {
            break;
        }
    }
    Ok((changes, started.elapsed().as_secs_f64()))
}

/// A process's resident memory in KiB (0 if unreadable).
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

impl WatchReport {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    pub fn to_table(&self) -> String {
        let q = |p: f64| self.latency.value_at_quantile(p);
        let ratio = if self.writers_alone_ops > 0.0 {
            self.writers_watched_ops / self.writers_alone_ops
        } else {
            0.0
        };
        let mut out = format!(
            "watch: writers alone {:.0} puts/s, beside the watchers {:.0} puts/s ({ratio:.2}x)\n\
             commit-to-delivery ({} changes delivered): p50 {} us, p99 {} us, p99.9 {} us, \
             max {} us\n\
             daemon RSS growth over the run: {} KiB with the watchers, {} KiB without\n",
            self.writers_alone_ops,
            self.writers_watched_ops,
            self.delivered,
            q(0.5),
            q(0.99),
            q(0.999),
            self.latency.max(),
            self.rss_growth_kib,
            self.alone_rss_growth_kib
        );
        if self.replay_changes > 0 {
            out.push_str(&format!(
                "replay --from 1: {} changes in {:.2} s = {:.0} changes/s\n",
                self.replay_changes,
                self.replay_secs,
                self.replay_changes as f64 / self.replay_secs.max(1e-9)
            ));
        }
        if self.failures.is_empty() {
            out.push_str("check: every watcher saw exactly its tile's acknowledged writes\n");
        } else {
            for failure in self.failures.iter().take(20) {
                out.push_str(&format!("FAILED: {failure}\n"));
            }
        }
        out
    }
}
