//! `cube-stress scale` (`make scale`): cube on a data set too big to keep
//! in RAM, measured against the targets of issue 32 ("Cells on disk").
//!
//! Builds the data set once (`scale/dataset.rs`: keys `0..--cells` of the
//! stress key space, version 1 each, imported in batches) and reuses it on
//! later runs; then restarts cubed on it and measures, in this order: the
//! time to its first answer, a 64 k-cell box scanned cold, random gets
//! over every cell (16 clients) between two measurements of the machine's
//! `pread` floor (`scale/floor.rs`: a burst before, and as long as the
//! gets right after), the box again from the cache (the median of nine
//! scans), gets of a hot key range (16 and 64 clients, warmed first), the
//! daemon's memory, and Redis holding the hot keys. The get phases are `run::run` against the running
//! daemon with a preloaded key space: every read is checked to be its
//! key's version 1. `scale/report.rs` puts each figure beside its target.

mod daemon;
mod dataset;
mod floor;
mod page_cache;
mod report;
mod socket_floor;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use cube_client::{CellBox, Client, LocalDaemon, StatsValue};
use cube_protocol::Coord;

use crate::error::StressError;
use crate::json::{self, Json};
use crate::keyspace::{KeySpace, MIN_VALUE_BYTES, coord_of, decode_value, encode_value, key_of};
use crate::run::{RunConfig, run};
use crate::target::redis::{Persistence, RedisServer};
use crate::target::{Connector, TargetKind, TargetSpec};
use crate::workload::{Workload, WorkloadKind};

use daemon::{NAMESPACE, ScaleDaemon};
use dataset::{DataSet, Description, Found, ImportFigures};
pub use report::{Figure, ScaleReport};

/// Issue 32's targets.
const IMPORT_TARGET_CELLS_PER_SEC: f64 = 200_000.0;
const RSS_TARGET_BYTES: u64 = 3 << 30;
const RESTART_TARGET_MS: f64 = 1000.0;
const COLD_GETS_TARGET_PER_SEC: f64 = 10_000.0;
const BOX_COLD_TARGET_MS: f64 = 20.0;
const BOX_CACHED_TARGET_MS: f64 = 1.0;
/// The box: 40 × 40 × 40 cells.
const BOX_SIDE: i32 = 40;
const BOX_CELLS: u64 = 64_000;
/// Scans of the box from the cache; the figure is their median.
const BOX_CACHED_SCANS: usize = 9;
/// Clients of the cold gets, and the floor's reads in flight beside them.
const COLD_CLIENTS: usize = 16;
/// Keys per `mget` when warming the hot range, and per Redis pipeline.
const WARM_BATCH: usize = 1024;

#[derive(Args, Debug, Clone)]
pub struct ScaleArgs {
    /// Cells in the data set (keys 0..N, one 64-byte value each by default).
    #[arg(long, value_name = "N", default_value_t = 200_000_000)]
    pub cells: u64,

    /// Where the data set lives (DIR/data, DIR/dataset.json); built there
    /// once and reused by later runs with the same --cells and --value-size.
    #[arg(long, value_name = "PATH", default_value = "target/scale")]
    pub dir: PathBuf,

    /// The cubed to run (default: $CUBED_BIN, else the one beside cube-stress).
    #[arg(long, value_name = "PATH")]
    pub cubed: Option<PathBuf>,

    /// Extra flag for cubed (repeatable), e.g. --daemon-arg=--cache-bytes=2GiB.
    #[arg(long = "daemon-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub daemon_args: Vec<String>,

    /// Bytes per value (at least 16).
    #[arg(long, value_name = "BYTES", default_value_t = 64)]
    pub value_size: usize,

    /// The hot range: keys 0..N, warmed before the hot gets and loaded
    /// into Redis for the memory comparison (default: 1 000 000, or every
    /// cell of a smaller data set).
    #[arg(long, value_name = "N")]
    pub hot_keys: Option<u64>,

    /// Measured time of each get phase: seconds (10) or with units (10s).
    #[arg(long, value_name = "DURATION", default_value_t = 10.0,
          value_parser = cube_client::parse_seconds)]
    pub duration: f64,

    /// Unmeasured load before each get phase's measurement.
    #[arg(long, value_name = "DURATION", default_value_t = 1.0,
          value_parser = cube_client::parse_seconds)]
    pub warmup: f64,

    /// Build the data set again even if a matching one is there.
    #[arg(long)]
    pub rebuild: bool,

    /// Write the report as JSON here (shape in docs/benchmarks.md).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// No progress lines on stderr.
    #[arg(long)]
    pub quiet: bool,
}

impl ScaleArgs {
    fn hot_keys(&self) -> u64 {
        self.hot_keys.unwrap_or(1_000_000).min(self.cells)
    }

    fn check(&self) -> Result<(), StressError> {
        let usage = |m: String| Err(StressError::Usage(m));
        if self.cells < 64 {
            return usage(format!(
                "--cells {} is too few: at least 64 (one per client)",
                self.cells
            ));
        }
        KeySpace::new(self.cells, 64).map_err(StressError::Usage)?;
        if self.value_size < MIN_VALUE_BYTES {
            return usage(format!(
                "--value-size {} is too small: values carry a {MIN_VALUE_BYTES}-byte header",
                self.value_size
            ));
        }
        if self.hot_keys() < 64 {
            return usage("--hot-keys must be at least 64 (one per client)".to_owned());
        }
        for (flag, value) in [("duration", self.duration), ("warmup", self.warmup)] {
            if !(value.is_finite() && value >= 0.0) {
                return usage(format!("--{flag} {value} is not a number of seconds"));
            }
        }
        if self.duration <= 0.0 {
            return usage("--duration must be more than 0".to_owned());
        }
        Ok(())
    }
}

/// The whole benchmark; `Err` when it could not run, a report with
/// problems when requests failed or values were wrong.
pub fn scale(args: &ScaleArgs) -> Result<ScaleReport, StressError> {
    args.check()?;
    let say = |text: String| {
        if !args.quiet {
            eprintln!("cube-stress: {text}");
        }
    };
    let binary = match &args.cubed {
        Some(path) => path.clone(),
        None => LocalDaemon::find_binary()?,
    };
    let machine_before = report::machine_now();
    let data = DataSet::new(&args.dir);
    let (description, imported) = ensure_dataset(args, &binary, &data, &say)?;

    // Earlier versions measured the floor on a file of their own; the
    // floor now reads the data set's run files (`scale/floor.rs`).
    let _ = std::fs::remove_file(args.dir.join("floor.bin"));
    say(format!(
        "restarting {} on {}",
        binary.display(),
        data.data_dir().display()
    ));
    let (daemon, restart) = ScaleDaemon::start(&binary, &args.dir, &args.daemon_args, true)?;
    let serving = serve_phases(args, &daemon, &data.data_dir(), &say)?;
    let rss_after_hot = serving.rss_after_hot_bytes;
    let serving_peak = daemon.peak_rss_bytes();
    daemon.stop()?;
    // With the daemon stopped: the floor beside the box from the cache.
    say("measuring the socket floor for one box page".to_owned());
    let socket_floor = socket_floor::measure(socket_floor::page_bytes(BOX_CELLS, args.value_size))?;
    let redis = redis_rss(args.hot_keys(), args.value_size, &say);

    let mut figures = import_figures(&description.import, imported);
    figures.push(rss_figure(
        "serving_peak_rss",
        "cubed peak RSS, serving",
        serving_peak,
    ));
    figures.push(restart_figure(restart));
    figures.extend(serving.figures());
    figures.push(socket_floor.figure());
    figures.push(in_cache_figure(args, rss_after_hot, &redis));
    let dataset = json::object([
        ("dir", Json::from(args.dir.display().to_string())),
        ("cells", Json::from(description.cells)),
        ("value_size_bytes", Json::from(description.value_size)),
        ("key_layout", Json::from(description.key_layout.as_str())),
        ("written_by", Json::from(description.writer.as_str())),
        ("built_unix_s", Json::from(description.built_unix_s)),
        ("imported", Json::Bool(imported)),
        ("cubed", Json::from(binary.display().to_string())),
        ("daemon_args", Json::from(args.daemon_args.clone())),
        ("hot_keys", Json::from(args.hot_keys())),
        ("duration_s", Json::from(args.duration)),
    ]);
    Ok(ScaleReport {
        dataset,
        machine: json::object([("before", machine_before), ("after", report::machine_now())]),
        figures,
        problems: serving.problems,
    })
}

/// Reuses the data set if its description matches, else builds it:
/// import into a fresh cubed, clean shutdown, description. Returns the
/// description and whether this run imported.
fn ensure_dataset(
    args: &ScaleArgs,
    binary: &Path,
    data: &DataSet,
    say: &dyn Fn(String),
) -> Result<(Description, bool), StressError> {
    let reason = match data.inspect(args.cells, args.value_size) {
        Found::Reusable(description) if !args.rebuild => {
            say(format!(
                "reusing the data set in {}: {} cells of {} bytes, written by {}",
                args.dir.display(),
                description.cells,
                description.value_size,
                description.writer
            ));
            return Ok((description, false));
        }
        Found::Reusable(_) => "--rebuild asked for a new one".to_owned(),
        Found::Rebuild(reason) => reason,
    };
    say(format!(
        "building the data set: {reason}; importing {} cells of {} bytes",
        args.cells, args.value_size
    ));
    data.prepare_empty()?;
    let (daemon, _) = ScaleDaemon::start(binary, &args.dir, &args.daemon_args, false)?;
    let writer = format!("{} ({})", binary.display(), daemon_version(daemon.socket()));
    let mut figures = dataset::import(&daemon, args.cells, args.value_size, !args.quiet)?;
    say(format!(
        "imported {} cells in {:.1} s ({:.0} cells/s); waiting for its merges",
        args.cells, figures.seconds, figures.cells_per_sec
    ));
    let settled_s = settle_merges(daemon.socket())?;
    // The high-water mark covers the merges after the import too.
    figures.peak_rss_bytes = daemon.peak_rss_bytes();
    say(format!(
        "merges settled {settled_s:.0} s after the import; stopping cubed cleanly"
    ));
    daemon.stop()?;
    let description = Description {
        cells: args.cells,
        value_size: args.value_size,
        key_layout: dataset::KEY_LAYOUT.to_owned(),
        writer,
        import: figures,
        built_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    data.describe(&description)?;
    Ok((description, true))
}

/// `cubed 0.1.0`, from the daemon's stats.
fn daemon_version(socket: &Path) -> String {
    Client::connect(socket)
        .and_then(|mut c| c.stats())
        .ok()
        .and_then(|stats| {
            stats.into_iter().find_map(|e| match e.value {
                StatsValue::Text(t) if e.name == "server.version" => Some(format!("cubed {t}")),
                _ => None,
            })
        })
        .unwrap_or_else(|| "cubed, version unknown".to_owned())
}

/// The `pread` floor: a burst one read at a time and with as many in
/// flight as the cold gets have clients, before them; and as many in
/// flight for as long as they ran, right after them (the device as they
/// found it: a rate-limited one answers slower once its burst is spent).
struct Floors {
    alone: floor::Floor,
    queued: floor::Floor,
    sustained: floor::Floor,
}

/// Longest wait for the restarted daemon's Bloom filters, or for the
/// imported data set's merges.
const BACKGROUND_WAIT: Duration = Duration::from_secs(1800);

/// A count from cubed's stats; `None` if this cubed has no such stat.
fn stat_count(client: &mut Client, name: &str) -> Result<Option<u64>, StressError> {
    Ok(client.stats()?.into_iter().find_map(|e| match e.value {
        StatsValue::Count(n) if e.name == name => Some(n),
        _ => None,
    }))
}

/// Waits until stat `name` is 0 (a cubed without it counts as 0); what
/// the wait was for names it in the error after [`BACKGROUND_WAIT`].
fn wait_for_zero(client: &mut Client, name: &str, what: &str) -> Result<(), StressError> {
    let began = Instant::now();
    loop {
        let left = stat_count(client, name)?.unwrap_or(0);
        if left == 0 {
            return Ok(());
        }
        if began.elapsed() > BACKGROUND_WAIT {
            return Err(StressError::Usage(format!(
                "cubed still had {left} {what} after {} s ({name})",
                BACKGROUND_WAIT.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the daemon has loaded every run file's filter
/// (`storage.filter_loads_pending`), so cold gets measure block reads,
/// not the filters' load beside them; returns the milliseconds waited.
fn wait_for_filters(client: &mut Client) -> Result<f64, StressError> {
    let began = Instant::now();
    wait_for_zero(
        client,
        "storage.filter_loads_pending",
        "Bloom filters to load",
    )?;
    Ok(began.elapsed().as_secs_f64() * 1000.0)
}

/// After the import: folds the log's tail and waits for the merges that
/// follow, until a fold starts none, so that the data set is stored as
/// the daemon leaves it and a serving run does not measure a merge left
/// over from the import (a clean shutdown cancels one in flight, and the
/// next start does it again). Returns the seconds it took.
fn settle_merges(socket: &Path) -> Result<f64, StressError> {
    let began = Instant::now();
    let mut client = Client::connect(socket)?;
    loop {
        client.checkpoint(false)?;
        // A merge a fold starts is counted before the fold returns.
        if stat_count(&mut client, "storage.merges_in_flight")?.unwrap_or(0) == 0 {
            return Ok(began.elapsed().as_secs_f64());
        }
        wait_for_zero(&mut client, "storage.merges_in_flight", "merges in flight")?;
    }
}

/// What the serving phases measured.
struct Serving {
    box_shape: String,
    box_cells: u64,
    box_cold_ms: f64,
    box_cached_ms: f64,
    cold: GetFigures,
    hot_16: GetFigures,
    hot_64: GetFigures,
    rss_after_hot_bytes: u64,
    floors: Floors,
    problems: Vec<String>,
}

#[derive(Clone, Copy, Debug)]
struct GetFigures {
    ops_per_sec: f64,
    p50_us: u64,
    p99_us: u64,
}

/// The phases against the restarted daemon, in the order that keeps
/// "cold" cold: filters loaded and pages dropped, the `pread` floors
/// (right before the cold reads: the device's speed varies, after an
/// import's writes most), box cold, gets over every cell, box from the
/// cache, the hot range warmed, hot gets at 16 and 64 clients.
fn serve_phases(
    args: &ScaleArgs,
    daemon: &ScaleDaemon,
    data_dir: &Path,
    say: &dyn Fn(String),
) -> Result<Serving, StressError> {
    let mut problems = Vec::new();
    let region = scan_box(args.cells).map_err(StressError::Usage)?;
    let mut client = Client::connect(daemon.socket())?;
    let floor_files = make_cold(&mut client, data_dir, say)?;
    let burst = floor::Budget::BURST;
    let alone = floor::measure(&floor_files, 1, 1, burst)?;
    let queued = floor::measure(&floor_files, 2, COLD_CLIENTS, burst)?;
    let mut scanner = BoxScanner::new(&region, args);
    let box_cold_ms = scanner.scan(&mut client, &mut problems)?;
    let box_cells = scanner.cells();
    say(format!(
        "box scanned cold: {box_cells} cells in {box_cold_ms:.2} ms"
    ));
    say(format!(
        "cold gets: 16 clients over all {} cells",
        args.cells
    ));
    let cold = get_phase(args, daemon, args.cells, COLD_CLIENTS, &mut problems)?;
    say(format!(
        "measuring the pread floor again: {COLD_CLIENTS} in flight for as long as the cold gets ran"
    ));
    let phase = Duration::from_secs_f64(args.warmup + args.duration);
    let floors = Floors {
        alone,
        queued,
        sustained: floor::measure(
            &floor_files,
            3,
            COLD_CLIENTS,
            floor::Budget::sustained(phase),
        )?,
    };
    let box_cached_ms = scan_cached(&mut scanner, &mut client, &mut problems, say)?;
    say(format!(
        "warming the hot range: keys 0..{}",
        args.hot_keys()
    ));
    warm(&mut client, args, &mut problems)?;
    let hot_16 = get_phase(args, daemon, args.hot_keys(), 16, &mut problems)?;
    let hot_64 = get_phase(args, daemon, args.hot_keys(), 64, &mut problems)?;
    Ok(Serving {
        box_shape: format!("{} .. {}", region.lo(), region.hi()),
        box_cells,
        box_cold_ms,
        box_cached_ms,
        cold,
        hot_16,
        hot_64,
        rss_after_hot_bytes: daemon.rss_bytes(),
        floors,
        problems,
    })
}

/// Makes the data set cold once every run's filter is loaded: its pages
/// dropped from the page cache; the run files the floor reads, opened.
fn make_cold(
    client: &mut Client,
    data_dir: &Path,
    say: &dyn Fn(String),
) -> Result<floor::FloorFiles, StressError> {
    let filters_ms = wait_for_filters(client)?;
    say(format!(
        "filters loaded {filters_ms:.0} ms after the first answer; dropping the data set's \
         pages from the page cache"
    ));
    let evicted = page_cache::evict(data_dir)?;
    say(format!(
        "asked the kernel to drop {} MiB of {} files",
        evicted.bytes >> 20,
        evicted.files
    ));
    // The run files cubed keeps its cells in (`CheckpointStore`'s
    // directory): the floor reads the blocks the cold gets read.
    let floor_files = floor::FloorFiles::open(&data_dir.join("checkpoint"))?;
    say(format!(
        "measuring the pread floor on the data set's run files ({} MiB), one read at a time \
         and 16 in flight",
        floor_files.bytes() >> 20
    ));
    Ok(floor_files)
}

/// The box scanned [`BOX_CACHED_SCANS`] times from the cache: the median.
fn scan_cached(
    scanner: &mut BoxScanner,
    client: &mut Client,
    problems: &mut Vec<String>,
    say: &dyn Fn(String),
) -> Result<f64, StressError> {
    let mut cached_ms = (0..BOX_CACHED_SCANS)
        .map(|_| scanner.scan(client, problems))
        .collect::<Result<Vec<f64>, StressError>>()?;
    cached_ms.sort_by(f64::total_cmp);
    let box_cached_ms = cached_ms[cached_ms.len() / 2];
    say(format!(
        "box scanned from the cache: median {box_cached_ms:.2} ms of {BOX_CACHED_SCANS} \
         (fastest {:.2}, slowest {:.2})",
        cached_ms[0],
        cached_ms[cached_ms.len() - 1]
    ));
    Ok(box_cached_ms)
}

/// The 40 × 40 × 40 box at the origin when the data set fills it; else
/// 64 000 cells of plane z = 0 (160 × 400) when that is full; else the
/// 40³ box, partly filled.
fn scan_box(cells: u64) -> Result<CellBox, String> {
    let side = BOX_SIDE - 1;
    let full_planes = cells >> 20;
    let hi = if full_planes >= BOX_SIDE as u64 || cells < 400 * 1024 {
        Coord::new(side, side, side)
    } else {
        Coord::new(159, 399, 0)
    };
    CellBox::new(Coord::new(0, 0, 0), hi)
}

/// How many of the data set's cells lie in `region`.
fn cells_in(region: &CellBox, cells: u64) -> u64 {
    let (lo, hi) = (region.lo(), region.hi());
    let mut count = 0;
    for z in lo.z..=hi.z {
        for y in lo.y..=hi.y {
            count += (lo.x..=hi.x)
                .filter(|&x| key_of(Coord::new(x, y, z)).is_some_and(|k| k < cells))
                .count() as u64;
        }
    }
    count
}

/// Scans one box again and again, checking every value, into buffers
/// made and touched once (as a client that keeps a box's values and
/// scans boxes repeatedly would), so that a scan's time is cube's and
/// not the first touch of the client's fresh memory.
struct BoxScanner {
    region: CellBox,
    expected: u64,
    value_size: usize,
    coords: Vec<(Coord, usize)>,
    values: Vec<u8>,
}

impl BoxScanner {
    fn new(region: &CellBox, args: &ScaleArgs) -> BoxScanner {
        let expected = cells_in(region, args.cells);
        let cells = expected as usize;
        let mut coords = vec![(Coord::new(0, 0, 0), 0); cells];
        let mut values = vec![0u8; cells * args.value_size];
        coords.clear();
        values.clear();
        BoxScanner {
            region: *region,
            expected,
            value_size: args.value_size,
            coords,
            values,
        }
    }

    /// The cells the last scan found.
    fn cells(&self) -> u64 {
        self.coords.len() as u64
    }

    /// Scans the box once; returns the milliseconds. Timed: the pages
    /// (`Client::scan_pages`, cells read in place) with every cell copied
    /// out into one buffer; the checks come after the clock stops.
    fn scan(
        &mut self,
        client: &mut Client,
        problems: &mut Vec<String>,
    ) -> Result<f64, StressError> {
        let (coords, values) = (&mut self.coords, &mut self.values);
        coords.clear();
        values.clear();
        let started = Instant::now();
        let mut pages = client.scan_pages(NAMESPACE, self.region, cube_client::MAX_SCAN_PAGE_CELLS);
        while let Some(cells) = pages.next_page()? {
            for (coord, value) in cells {
                values.extend_from_slice(value);
                coords.push((coord, values.len()));
            }
        }
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        if coords.len() as u64 != self.expected {
            problems.push(format!(
                "scan of {} .. {} found {} cells, the data set has {} there",
                self.region.lo(),
                self.region.hi(),
                coords.len(),
                self.expected
            ));
        }
        let mut start = 0;
        for &(coord, end) in coords.iter() {
            if let Err(problem) = check_value(coord, Some(&values[start..end]), self.value_size) {
                problems.push(format!("scan: {problem}"));
            }
            start = end;
        }
        Ok(ms)
    }
}

/// Whether the value at `coord` is its key's version 1.
fn check_value(coord: Coord, found: Option<&[u8]>, value_size: usize) -> Result<(), String> {
    let key = key_of(coord).ok_or_else(|| format!("{coord} is outside the key space"))?;
    let bytes = found.ok_or_else(|| format!("key {key} at {coord} is missing"))?;
    let stored = decode_value(bytes, value_size).map_err(|e| format!("key {key}: {e}"))?;
    if (stored.key, stored.version) == (key, 1) {
        Ok(())
    } else {
        Err(format!(
            "key {key} at {coord} holds key {} version {}, not version 1 of key {key}",
            stored.key, stored.version
        ))
    }
}

/// Reads every hot key once (mget), checked, so the hot range is cached.
fn warm(
    client: &mut Client,
    args: &ScaleArgs,
    problems: &mut Vec<String>,
) -> Result<(), StressError> {
    let keys: Vec<u64> = (0..args.hot_keys()).collect();
    for chunk in keys.chunks(WARM_BATCH) {
        let coords: Vec<Coord> = chunk.iter().map(|&k| coord_of(k)).collect();
        let values = client.mget(NAMESPACE, &coords)?;
        for (coord, value) in coords.iter().zip(&values) {
            if let Err(problem) = check_value(*coord, value.as_deref(), args.value_size) {
                problems.push(format!("warming: {problem}"));
            }
        }
    }
    Ok(())
}

/// Gets of keys `0..keys` at `clients` clients, with `run::run` against
/// the running daemon (every read checked).
fn get_phase(
    args: &ScaleArgs,
    daemon: &ScaleDaemon,
    keys: u64,
    clients: usize,
    problems: &mut Vec<String>,
) -> Result<GetFigures, StressError> {
    let mut target = TargetSpec::new(TargetKind::Cube);
    target.socket = Some(daemon.socket().to_owned());
    let workload = Workload::new(WorkloadKind::Get, 1.0).map_err(StressError::Usage)?;
    let config = RunConfig {
        clients,
        duration: Duration::from_secs_f64(args.duration),
        warmup: Duration::from_secs_f64(args.warmup),
        value_size: args.value_size,
        progress: !args.quiet,
        preloaded: true,
        ..RunConfig::new(target, workload, keys)
    };
    let report = run(&config)?;
    let phase = format!("gets of keys 0..{keys}, {clients} clients");
    problems.extend(report.error_samples.iter().map(|e| format!("{phase}: {e}")));
    if report.errors > report.error_samples.len() as u64 {
        problems.push(format!("{phase}: {} failed requests in all", report.errors));
    }
    let mismatches = &report.live_mismatches;
    problems.extend(
        mismatches
            .mismatch_samples
            .iter()
            .map(|m| format!("{phase}: {m}")),
    );
    if mismatches.mismatches > mismatches.mismatch_samples.len() as u64 {
        problems.push(format!(
            "{phase}: {} wrong values read in all",
            mismatches.mismatches
        ));
    }
    let get = report
        .summary("get")
        .ok_or_else(|| StressError::target("cube", format!("{phase}: no get was measured")))?;
    Ok(GetFigures {
        ops_per_sec: get.ops_per_sec,
        p50_us: get.p50_us,
        p99_us: get.p99_us,
    })
}

/// Redis (appendfsync always, as `--target redis`) holding keys
/// `0..keys` with the same values: its RSS, or why there is none.
fn redis_rss(keys: u64, value_size: usize, say: &dyn Fn(String)) -> Result<(u64, String), String> {
    say(format!(
        "loading keys 0..{keys} into redis-server for the memory comparison"
    ));
    let server = RedisServer::start(Persistence::Always).map_err(|e| e.to_string())?;
    let connector = server.connector();
    let mut connection = connector.connect().map_err(|e| e.to_string())?;
    let mut value = Vec::with_capacity(value_size);
    let all: Vec<u64> = (0..keys).collect();
    for chunk in all.chunks(WARM_BATCH * 8) {
        let items: Vec<_> = chunk
            .iter()
            .map(|&key| {
                encode_value(key, 1, value_size, &mut value);
                (coord_of(key), value.clone())
            })
            .collect();
        connection.put_many(&items).map_err(|e| e.to_string())?;
    }
    let pid = server.pid().ok_or("redis-server exited")?;
    let rss = daemon::proc_status_kib(pid, "VmRSS") * 1024;
    Ok((rss, server.describe()))
}

fn import_figures(import: &ImportFigures, imported: bool) -> Vec<Figure> {
    let when = if imported {
        String::new()
    } else {
        "from the run that built the data set (this run reused it)".to_owned()
    };
    let overall_met = import.cells_per_sec >= IMPORT_TARGET_CELLS_PER_SEC;
    let slowest = Figure::new(
        "import_slowest_10s",
        "import, slowest 10-s interval",
        "cells/s",
    );
    let slowest = match import.slowest_interval_cells_per_sec {
        Some(rate) => slowest
            .value(rate)
            .target(
                ">= 200000 cells/s",
                Some(rate >= IMPORT_TARGET_CELLS_PER_SEC),
            )
            .note(when.clone()),
        None => slowest
            .target(">= 200000 cells/s", None)
            .note("the import took less than 10 s"),
    };
    vec![
        Figure::new("import_rate", "import, start to end", "cells/s")
            .value(import.cells_per_sec)
            .detail("seconds", import.seconds)
            .target(">= 200000 cells/s", Some(overall_met))
            .note(when.clone()),
        slowest,
        rss_figure(
            "import_peak_rss",
            "cubed peak RSS, import",
            import.peak_rss_bytes,
        )
        .note(when),
    ]
}

fn rss_figure(name: &'static str, label: &str, bytes: u64) -> Figure {
    Figure::new(name, label, "bytes")
        .value(bytes as f64)
        .target(
            "<= 3 GiB (200 M cells, --cache-bytes 2GiB)",
            Some(bytes <= RSS_TARGET_BYTES),
        )
}

fn restart_figure(restart: Duration) -> Figure {
    let ms = restart.as_secs_f64() * 1000.0;
    Figure::new("restart_to_first_request", "restart to first answer", "ms")
        .value(ms)
        .target("<= 1000 ms", Some(ms <= RESTART_TARGET_MS))
        .note("from spawning cubed on the cleanly shut down data set to its answer to a get")
}

impl Serving {
    fn figures(&self) -> Vec<Figure> {
        let floors = &self.floors;
        let hot = |name, label: &str, g: GetFigures| {
            Figure::new(name, label, "gets/s")
                .value(g.ops_per_sec)
                .detail("p50_us", g.p50_us)
                .detail("p99_us", g.p99_us)
                .target(">= 0.9x the build before, p99 <= 1.2x", None)
                .note("a ratio to the build before: see the reference in docs/benchmarks.md")
        };
        let [box_cold, box_cached] = self.box_figures();
        vec![
            hot("hot_get_16", "hot gets, 16 clients", self.hot_16),
            hot("hot_get_64", "hot gets, 64 clients", self.hot_64),
            self.cold_get_figure(),
            floor_figure(
                ("pread_floor", "pread floor, one 4 KiB block"),
                &floors.alone,
            ),
            floor_figure(
                (
                    "pread_floor_queued",
                    "pread floor, 4 KiB blocks, 16 in flight",
                ),
                &floors.queued,
            ),
            floor_figure(
                (
                    "pread_floor_sustained",
                    "pread floor, 16 in flight, sustained",
                ),
                &floors.sustained,
            ),
            box_cold,
            box_cached,
        ]
    }

    /// Cold gets, held to the target rate and to "within one disk read".
    fn cold_get_figure(&self) -> Figure {
        let floors = &self.floors;
        // "Within one disk read": at most a cached get plus a read of the
        // device with as many reads in flight as the gets have clients,
        // for as long as they ran (a rate-limited device answers slower
        // once its burst is spent, and the gets outlast the burst).
        let cold_p50_bound = self.hot_16.p50_us + floors.sustained.p50_us;
        let burst_bound = self.hot_16.p50_us + floors.queued.p50_us;
        let cold_met =
            self.cold.ops_per_sec >= COLD_GETS_TARGET_PER_SEC && self.cold.p50_us <= cold_p50_bound;
        Figure::new("cold_get_16", "cold gets (all cells), 16 clients", "gets/s")
            .value(self.cold.ops_per_sec)
            .detail("p50_us", self.cold.p50_us)
            .detail("p99_us", self.cold.p99_us)
            .target(
                format!(
                    ">= 10000 gets/s, p50 <= {cold_p50_bound} µs (hot p50 + floor p50 at \
                     {COLD_CLIENTS} in flight, sustained)"
                ),
                Some(cold_met),
            )
            .note(format!(
                "against the floor's burst ({} reads) the p50 bound would be {burst_bound} µs",
                floors.queued.reads
            ))
    }

    /// The box cold and from the cache; decided only for a full box.
    fn box_figures(&self) -> [Figure; 2] {
        let full_box = self.box_cells == BOX_CELLS;
        let box_figure = |(name, label), ms: f64, bound_ms: f64, note: String| {
            Figure::new(name, label, "ms")
                .value(ms)
                .detail("cells", self.box_cells)
                .target(
                    format!("<= {bound_ms} ms"),
                    full_box.then_some(ms <= bound_ms),
                )
                .note(note)
        };
        let box_note = if full_box {
            format!("box {}", self.box_shape)
        } else {
            format!(
                "box {} holds only {} cells of this data set: the target is for 64 000",
                self.box_shape, self.box_cells
            )
        };
        [
            box_figure(
                ("box_scan_cold", "64 k-cell box, cold scan"),
                self.box_cold_ms,
                BOX_COLD_TARGET_MS,
                format!("right after the restart; {box_note}"),
            ),
            box_figure(
                ("box_scan_cached", "64 k-cell box, from the cache"),
                self.box_cached_ms,
                BOX_CACHED_TARGET_MS,
                format!("median of {BOX_CACHED_SCANS} scans; {box_note}"),
            ),
        ]
    }
}

fn floor_figure((name, label): (&'static str, &str), floor: &floor::Floor) -> Figure {
    Figure::new(name, label, "reads/s")
        .value(floor.reads_per_sec)
        .detail("p50_us", floor.p50_us)
        .detail("p99_us", floor.p99_us)
        .detail("reads", floor.reads)
        .detail("in_flight", floor.in_flight as u64)
        .detail("file_bytes", floor.file_bytes)
        .detail("direct", floor.direct)
        .target("the machine's floor (no target)", None)
        .note(format!(
            "{} reads, {} in flight, {}",
            floor.reads, floor.in_flight, floor.mode
        ))
}

fn in_cache_figure(
    args: &ScaleArgs,
    cube_rss: u64,
    redis: &Result<(u64, String), String>,
) -> Figure {
    let hot = args.hot_keys();
    let figure = Figure::new(
        "in_cache_rss",
        format!("RSS, {hot} cells in cache"),
        "bytes",
    )
    .value(cube_rss as f64);
    match redis {
        Ok((redis_rss, detail)) => {
            let comparable = hot == args.cells;
            let figure = figure.detail("redis_rss_bytes", *redis_rss).target(
                format!(
                    "<= Redis's {:.1} MiB",
                    *redis_rss as f64 / (1024.0 * 1024.0)
                ),
                comparable.then_some(cube_rss <= *redis_rss),
            );
            if comparable {
                figure.note(format!(
                    "cubed after the hot gets beside {detail} holding the same cells"
                ))
            } else {
                figure.note(format!(
                    "cubed serves {} cells here, Redis holds {hot}: run with --cells {hot} \
                     for the comparison ({detail})",
                    args.cells
                ))
            }
        }
        Err(why) => figure
            .detail("redis_rss_bytes", Json::Null)
            .target("<= Redis's", None)
            .note(format!("no Redis figure: {why}")),
    }
}
