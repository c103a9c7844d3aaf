//! The scale benchmark's data set: `DIR/data`, a cubed data directory
//! holding version 1 of keys `0..cells` in the stress key space
//! (`keyspace::coord_of`, `keyspace::encode_value`), and `DIR/dataset.json`,
//! which describes it and is written only after a complete import ended in
//! a clean shutdown. A run whose description matches reuses the data;
//! anything else (no description, other cells, value size or key layout)
//! builds it again.

use std::fs::{self, DirBuilder};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use cube_client::{BatchOp, Client};
use serde_json::Value;

use super::daemon::{NAMESPACE, ScaleDaemon};
use crate::error::StressError;
use crate::json::{self, Json};
use crate::keyspace::{coord_of, encode_value};

/// What the key layout is called in the description; a change to
/// `coord_of` or `encode_value` must change it, so old data sets rebuild.
pub const KEY_LAYOUT: &str = "stress keyspace v1: key k at (k % 1024, k / 1024 % 1024, k / 2^20), \
     value = encode_value(k, version 1)";
/// Cells per `batch` request of the import (well inside the protocol's
/// 65 536 operations and 8 MiB).
const IMPORT_BATCH_CELLS: u64 = 4096;
/// Connections importing in parallel (each batch is one group commit, so
/// parallel batches share fsyncs).
const IMPORT_CONNECTIONS: usize = 4;
/// The window of the import's slowest-interval figure.
pub const INTERVAL: Duration = Duration::from_secs(10);
/// How often the import prints its progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// Marks a directory as made by `cube-stress scale`, so a rebuild never
/// deletes a data directory it did not make.
const MARKER: &str = "cube-stress-scale";
const DESCRIPTION: &str = "dataset.json";

/// What the data set holds and how it was built.
#[derive(Clone, Debug, PartialEq)]
pub struct Description {
    pub cells: u64,
    pub value_size: usize,
    pub key_layout: String,
    /// The cubed that wrote it: its path and version.
    pub writer: String,
    pub import: ImportFigures,
    /// When the import finished, seconds since the Unix epoch.
    pub built_unix_s: u64,
}

/// The figures of one import.
#[derive(Clone, Debug, PartialEq)]
pub struct ImportFigures {
    pub seconds: f64,
    pub cells_per_sec: f64,
    /// The slowest whole [`INTERVAL`]; `None` when the import was shorter.
    pub slowest_interval_cells_per_sec: Option<f64>,
    pub peak_rss_bytes: u64,
}

impl Description {
    fn to_json(&self) -> Json {
        json::object([
            ("cells", Json::from(self.cells)),
            ("value_size_bytes", Json::from(self.value_size)),
            ("key_layout", Json::from(self.key_layout.as_str())),
            ("writer", Json::from(self.writer.as_str())),
            ("built_unix_s", Json::from(self.built_unix_s)),
            ("import", self.import.to_json()),
        ])
    }

    fn from_json(value: &Value) -> Option<Description> {
        let import = value.get("import")?;
        Some(Description {
            cells: value.get("cells")?.as_u64()?,
            value_size: usize::try_from(value.get("value_size_bytes")?.as_u64()?).ok()?,
            key_layout: value.get("key_layout")?.as_str()?.to_owned(),
            writer: value.get("writer")?.as_str()?.to_owned(),
            built_unix_s: value.get("built_unix_s")?.as_u64()?,
            import: ImportFigures {
                seconds: import.get("seconds")?.as_f64()?,
                cells_per_sec: import.get("cells_per_sec")?.as_f64()?,
                slowest_interval_cells_per_sec: import.get("slowest_10s_cells_per_sec")?.as_f64(),
                peak_rss_bytes: import.get("peak_rss_bytes")?.as_u64()?,
            },
        })
    }

    /// Whether this data set is the one asked for.
    pub fn matches(&self, cells: u64, value_size: usize) -> bool {
        self.cells == cells && self.value_size == value_size && self.key_layout == KEY_LAYOUT
    }
}

impl ImportFigures {
    pub fn to_json(&self) -> Json {
        json::object([
            ("seconds", Json::from(self.seconds)),
            ("cells_per_sec", Json::from(self.cells_per_sec)),
            (
                "slowest_10s_cells_per_sec",
                self.slowest_interval_cells_per_sec
                    .map_or(Json::Null, Json::from),
            ),
            ("peak_rss_bytes", Json::from(self.peak_rss_bytes)),
        ])
    }
}

/// The data set's directory.
pub struct DataSet {
    pub dir: PathBuf,
}

/// What a run found in the directory.
pub enum Found {
    /// A complete data set of the cells asked for.
    Reusable(Description),
    /// Nothing to reuse, and why.
    Rebuild(String),
}

impl DataSet {
    pub fn new(dir: &Path) -> DataSet {
        DataSet {
            dir: dir.to_owned(),
        }
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn description_path(&self) -> PathBuf {
        self.dir.join(DESCRIPTION)
    }

    /// Looks at the description: reuse the data, or build it and why.
    pub fn inspect(&self, cells: u64, value_size: usize) -> Found {
        let path = self.description_path();
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Found::Rebuild(format!(
                    "no complete data set in {} yet",
                    self.dir.display()
                ));
            }
            Err(e) => return Found::Rebuild(format!("cannot read {}: {e}", path.display())),
        };
        let parsed = serde_json::from_str::<Value>(&text)
            .ok()
            .as_ref()
            .and_then(Description::from_json);
        match parsed {
            None => Found::Rebuild(format!(
                "{} is not a description it can read",
                path.display()
            )),
            Some(found) if found.matches(cells, value_size) => Found::Reusable(found),
            Some(found) => Found::Rebuild(format!(
                "the data set in {} holds {} cells of {} bytes ({}), not {cells} of {value_size}",
                self.dir.display(),
                found.cells,
                found.value_size,
                found.key_layout
            )),
        }
    }

    /// Removes what an earlier build left (only in a directory this tool
    /// made) and makes an empty data directory, mode 0700.
    pub fn prepare_empty(&self) -> Result<(), StressError> {
        let marker = self.dir.join(MARKER);
        let data = self.data_dir();
        if data.exists() && !marker.exists() {
            return Err(StressError::Usage(format!(
                "{} exists but was not made by cube-stress scale (no {} beside it); \
                 remove it or pick another --dir",
                data.display(),
                marker.display()
            )));
        }
        let io = |what: String| move |e| StressError::io(what, e);
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(io(format!("cannot create {}", self.dir.display())))?;
        fs::write(
            &marker,
            "made by cube-stress scale: data/ here is rebuilt at will\n",
        )
        .map_err(io(format!("cannot write {}", marker.display())))?;
        let description = self.description_path();
        if description.exists() {
            fs::remove_file(&description)
                .map_err(io(format!("cannot remove {}", description.display())))?;
        }
        if data.exists() {
            fs::remove_dir_all(&data).map_err(io(format!("cannot remove {}", data.display())))?;
        }
        DirBuilder::new()
            .mode(0o700)
            .create(&data)
            .map_err(io(format!("cannot create {}", data.display())))?;
        Ok(())
    }

    /// Records a complete, cleanly shut down import.
    pub fn describe(&self, description: &Description) -> Result<(), StressError> {
        let path = self.description_path();
        let temporary = self.dir.join(format!("{DESCRIPTION}.new"));
        fs::write(&temporary, json::pretty(&description.to_json()))
            .and_then(|()| fs::rename(&temporary, &path))
            .map_err(|e| StressError::io(format!("cannot write {}", path.display()), e))
    }
}

/// Writes version 1 of keys `0..cells` into the running `daemon`, in key
/// order, `IMPORT_BATCH_CELLS` per batch over parallel connections, with a
/// progress line every few seconds.
pub fn import(
    daemon: &ScaleDaemon,
    cells: u64,
    value_size: usize,
    progress: bool,
) -> Result<ImportFigures, StressError> {
    let batches = cells.div_ceil(IMPORT_BATCH_CELLS);
    let shared = ImportShared {
        next: AtomicU64::new(0),
        done: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        running: AtomicUsize::new(IMPORT_CONNECTIONS),
    };
    let started = Instant::now();
    let mut watch = ImportWatch::new(started);
    let mut out_of_memory = None;
    let failures: Vec<String> = thread::scope(|scope| {
        let workers: Vec<_> = (0..IMPORT_CONNECTIONS)
            .map(|_| {
                scope.spawn(|| {
                    let outcome =
                        import_batches(daemon.socket(), &shared, batches, cells, value_size);
                    if outcome.is_err() {
                        shared.stop.store(true, Ordering::Relaxed);
                    }
                    shared.running.fetch_sub(1, Ordering::Relaxed);
                    outcome
                })
            })
            .collect();
        out_of_memory = watch_import(daemon, &shared, cells, &mut watch, progress);
        workers
            .into_iter()
            .filter_map(|w| match w.join() {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e),
                Err(_) => Some("an import thread panicked".to_owned()),
            })
            .collect()
    });
    if let Some(short) = out_of_memory {
        return Err(StressError::target(
            "cube",
            format!(
                "the import stopped at {} of {cells} cells: {short}; this cubed does not fit \
                 the data set in this machine's memory, so ask for fewer --cells",
                shared.done.load(Ordering::Relaxed)
            ),
        ));
    }
    if let Some(first) = failures.first() {
        return Err(StressError::target(
            "cube",
            format!("the import failed: {first}"),
        ));
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(ImportFigures {
        seconds,
        cells_per_sec: cells as f64 / seconds.max(1e-9),
        slowest_interval_cells_per_sec: watch.slowest_interval(),
        peak_rss_bytes: daemon.peak_rss_bytes(),
    })
}

/// What the import's connections share: the next batch to send, the
/// cells acknowledged, whether to stop, and how many are still running.
struct ImportShared {
    next: AtomicU64,
    done: AtomicU64,
    stop: AtomicBool,
    running: AtomicUsize,
}

/// Samples the import until its connections have all ended: prints a
/// progress line every few seconds, and stops the import if the machine
/// runs short of memory (then says why).
fn watch_import(
    daemon: &ScaleDaemon,
    shared: &ImportShared,
    cells: u64,
    watch: &mut ImportWatch,
    progress: bool,
) -> Option<String> {
    let mut out_of_memory = None;
    while shared.running.load(Ordering::Relaxed) > 0 {
        thread::sleep(Duration::from_millis(100));
        if let Some(short) = memory_short() {
            shared.stop.store(true, Ordering::Relaxed);
            out_of_memory = Some(short);
        }
        let cells_done = shared.done.load(Ordering::Relaxed);
        let line = watch.tick(cells_done, cells, daemon.rss_bytes());
        if let Some(line) = line.filter(|_| progress) {
            eprintln!("cube-stress: import: {line}");
        }
    }
    out_of_memory
}

/// The share of the machine's memory under which the import stops
/// rather than push the machine into the OOM killer (a cubed that keeps
/// every cell in RAM cannot hold 200 M of them).
const MIN_AVAILABLE_SHARE: f64 = 0.10;

/// Why the machine is short of memory, if it is: available memory under
/// [`MIN_AVAILABLE_SHARE`] of the total (`/proc/meminfo`).
fn memory_short() -> Option<String> {
    let meminfo = fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<u64> {
        meminfo.lines().find_map(|line| {
            let rest = line.strip_prefix(name)?.strip_prefix(':')?;
            rest.trim().trim_end_matches("kB").trim().parse().ok()
        })
    };
    let (total, available) = (field("MemTotal")?, field("MemAvailable")?);
    (available as f64 <= total as f64 * MIN_AVAILABLE_SHARE).then(|| {
        format!(
            "the machine has only {} MiB of its {} MiB available",
            available / 1024,
            total / 1024
        )
    })
}

/// One import connection's loop: claim the next batch, write it.
fn import_batches(
    socket: &Path,
    shared: &ImportShared,
    batches: u64,
    cells: u64,
    value_size: usize,
) -> Result<(), String> {
    let mut client = Client::connect(socket).map_err(|e| e.to_string())?;
    let mut ops = Vec::with_capacity(IMPORT_BATCH_CELLS as usize);
    let mut value = Vec::with_capacity(value_size);
    while !shared.stop.load(Ordering::Relaxed) {
        let batch = shared.next.fetch_add(1, Ordering::Relaxed);
        if batch >= batches {
            break;
        }
        let first = batch * IMPORT_BATCH_CELLS;
        let end = (first + IMPORT_BATCH_CELLS).min(cells);
        ops.clear();
        for key in first..end {
            encode_value(key, 1, value_size, &mut value);
            ops.push(BatchOp::Put {
                coord: coord_of(key),
                value: value.clone(),
            });
        }
        client
            .batch(NAMESPACE, &mut ops)
            .map_err(|e| format!("batch of keys {first}..{end}: {e}"))?;
        shared.done.fetch_add(end - first, Ordering::Relaxed);
    }
    Ok(())
}

/// The import's clock: whole-interval rates and progress lines.
struct ImportWatch {
    started: Instant,
    /// Cells done at the start of the current interval, and when it began.
    interval_start: (u64, Instant),
    slowest: Option<f64>,
    last_line: Instant,
}

impl ImportWatch {
    fn new(started: Instant) -> ImportWatch {
        ImportWatch {
            started,
            interval_start: (0, started),
            slowest: None,
            last_line: started,
        }
    }

    /// Closes an interval when one is complete; returns a progress line
    /// when one is due.
    fn tick(&mut self, done: u64, total: u64, rss_bytes: u64) -> Option<String> {
        let now = Instant::now();
        let (interval_done, interval_began) = self.interval_start;
        let in_interval = now - interval_began;
        if in_interval >= INTERVAL {
            let rate = (done - interval_done) as f64 / in_interval.as_secs_f64();
            self.slowest = Some(self.slowest.map_or(rate, |s| s.min(rate)));
            self.interval_start = (done, now);
        }
        if now - self.last_line < PROGRESS_EVERY {
            return None;
        }
        self.last_line = now;
        let elapsed = (now - self.started).as_secs_f64();
        let rate = done as f64 / elapsed.max(1e-9);
        let eta = if rate > 0.0 {
            format!("{:.0} s", (total - done) as f64 / rate)
        } else {
            "?".to_owned()
        };
        Some(format!(
            "{done} of {total} cells ({:.1} %), {rate:.0} cells/s, cubed RSS {} MiB, ETA {eta}",
            done as f64 * 100.0 / total.max(1) as f64,
            rss_bytes / (1024 * 1024)
        ))
    }

    fn slowest_interval(&self) -> Option<f64> {
        self.slowest
    }
}
