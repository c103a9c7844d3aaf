//! The stable-toolchain fuzzer: what `make fuzz` runs when nightly or
//! cargo-fuzz is missing (CI machines have one toolchain, stable).
//!
//! It runs the same target functions as the libFuzzer targets
//! (`cube_fuzz::TARGETS`) over the checked-in seeds (`fuzz/seeds/NAME/`)
//! and libFuzzer's working corpus (`fuzz/corpus/NAME/`, if any), then over
//! seeded random mutations of them: bit flips, interesting integers,
//! truncations, deleted, duplicated and inserted chunks, splices and the
//! formats' magic numbers, stacked up to 8 deep. There is no coverage
//! feedback (that needs nightly's sanitizer-coverage); the targets make up
//! for part of it by also running every input with its checksums repaired.
//!
//! Any panic is saved to `fuzz/artifacts/NAME/crash-<hash>` and makes the
//! exit status 1; an input that runs for more than 20 s is saved as
//! `timeout-<hash>` and ends the run. Replay one with
//! `cube-fuzz-stable NAME --replay FILE`.
//!
//! Usage: `cube-fuzz-stable [NAME...] [--seconds N] [--seed N] [--runs N] [--replay FILE...]`
//! (`FUZZ_SECONDS` and `FUZZ_SEED` set the defaults; seconds are per target).

use std::collections::HashSet;
use std::fs;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cube_fuzz::{MAX_INPUT_BYTES, TARGETS};

/// Seconds per target when neither `--seconds` nor `FUZZ_SECONDS` says.
const DEFAULT_SECONDS: u64 = 60;
/// An execution longer than this is a hang.
const HANG_AFTER: Duration = Duration::from_secs(20);
/// Mutants kept beside the seeds, so that mutations compound.
const POOL_MUTANTS: usize = 256;
/// Most mutations stacked on one input.
const MAX_STACK: u64 = 8;
/// Distinct crashes saved per target before the rest are only counted.
const MAX_SAVED_CRASHES: usize = 20;

/// The formats' magic numbers and values that matter to them, then Lua
/// (the program targets: without coverage feedback, random bytes rarely
/// make a program that parses; a NUL starts `program_run`'s arguments).
const DICTIONARY: &[&[u8]] = &[
    b"CUBEWAL\0",
    b"CUBECKPT",
    b"CUBEFOOT",
    b"CUBEMANI",
    b"CUBERUNF",
    &[1, 0, 0, 0],
    &[0x80],
    &[0x81],
    &[7, b'd', b'e', b'f', b'a', b'u', b'l', b't'],
    &[0; 17],
    &[0xff, 0xff, 0xff, 0xff],
    b" local x = ",
    b" return ",
    b" end ",
    b" while true do ",
    b" for i = 1, 1e6 do ",
    b" function(...) ",
    b" cube.put(0, 0, 0, ",
    b" cube.rincr(0, 0, 0) ",
    b" cube.count(-9, -9, -9, 9, 9, 9) ",
    b" cube.walk(3, 'both') ",
    b" string.rep('x', 1e6) ",
    b" setmetatable({}, {__index = ",
    b" pcall(",
    b" error(",
    b" {} ",
    b"..",
    b"\0",
];

/// SplitMix64: seeded, fast, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`; 0 when `n` is 0.
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
        }
    }

    fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }
}

struct Options {
    targets: Vec<String>,
    seconds: u64,
    seed: u64,
    runs: Option<u64>,
    replay: Vec<PathBuf>,
}

fn env_u64(name: &str) -> Result<Option<u64>, String> {
    match std::env::var(name) {
        Ok(text) if !text.is_empty() => text
            .parse()
            .map(Some)
            .map_err(|_| format!("${name} is {text:?}, not a number")),
        _ => Ok(None),
    }
}

fn parse_args() -> Result<Options, String> {
    let default_seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    let mut options = Options {
        targets: Vec::new(),
        seconds: env_u64("FUZZ_SECONDS")?.unwrap_or(DEFAULT_SECONDS),
        seed: env_u64("FUZZ_SEED")?.unwrap_or(default_seed),
        runs: None,
        replay: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    let number = |flag: &str, value: Option<String>| -> Result<u64, String> {
        let value = value.ok_or_else(|| format!("{flag} needs a value"))?;
        value
            .parse()
            .map_err(|_| format!("{flag} {value:?} is not a number"))
    };
    let mut replaying = false;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seconds" => options.seconds = number("--seconds", args.next())?,
            "--seed" => options.seed = number("--seed", args.next())?,
            "--runs" => options.runs = Some(number("--runs", args.next())?),
            "--replay" => replaying = true,
            "-h" | "--help" => {
                return Err(format!(
                    "usage: cube-fuzz-stable [TARGET...] [--seconds N] [--seed N] [--runs N] \
                     [--replay FILE...]\ntargets: {}",
                    target_names()
                ));
            }
            _ if replaying => options.replay.push(PathBuf::from(arg)),
            _ if TARGETS.iter().any(|(name, _)| *name == arg) => options.targets.push(arg),
            _ => {
                return Err(format!(
                    "unknown target or flag {arg:?}; targets: {}",
                    target_names()
                ));
            }
        }
    }
    if options.targets.is_empty() {
        options.targets = TARGETS.iter().map(|(name, _)| (*name).to_owned()).collect();
    }
    if !options.replay.is_empty() && options.targets.len() != 1 {
        return Err("--replay needs exactly one target name".to_owned());
    }
    Ok(options)
}

fn target_names() -> String {
    TARGETS
        .iter()
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}

fn fuzz_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Files of `dir` (not recursive), sorted by name; none if it is missing.
fn read_inputs(dir: &Path) -> Vec<Vec<u8>> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    paths.sort();
    paths
        .iter()
        .filter_map(|p| fs::read(p).ok())
        .map(|mut bytes| {
            bytes.truncate(MAX_INPUT_BYTES);
            bytes
        })
        .collect()
}

/// FNV-1a, for artifact names.
fn hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn save_artifact(target: &str, kind: &str, input: &[u8]) -> PathBuf {
    let dir = fuzz_dir().join("artifacts").join(target);
    let path = dir.join(format!("{kind}-{:016x}", hash(input)));
    if let Err(e) = fs::create_dir_all(&dir).and_then(|()| fs::write(&path, input)) {
        eprintln!("cube-fuzz-stable: cannot save {}: {e}", path.display());
    }
    path
}

/// Applies one random mutation.
fn mutate_once(rng: &mut Rng, input: &mut Vec<u8>, pool: &[Vec<u8>]) {
    let len = input.len();
    match rng.below(13) {
        0 if len > 0 => {
            let i = rng.index(len);
            input[i] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let i = rng.index(len);
            input[i] = [0, 1, 0x7f, 0x80, 0xff, rng.next() as u8][rng.index(6)];
        }
        2 if len > 0 => {
            let i = rng.index(len);
            input[i] = input[i].wrapping_add((rng.below(33) as u8).wrapping_sub(16));
        }
        3 | 4 if len >= 2 => {
            // An interesting integer, 2, 4 or 8 bytes wide, little-endian.
            let width = [2usize, 4, 8][rng.index(3)].min(len);
            let at = rng.index(len - width + 1);
            let value: u64 = match rng.below(8) {
                0 => 0,
                1 => 1,
                2 => u64::MAX,
                3 => len as u64,
                4 => rng.below(64),
                5 => 1 << rng.below(63),
                6 => (1 << (8 * width as u64 - 1)) - 1,
                _ => {
                    let old = input[at..at + width]
                        .iter()
                        .rev()
                        .fold(0u64, |v, b| (v << 8) | u64::from(*b));
                    old.wrapping_add(rng.below(17)).wrapping_sub(8)
                }
            };
            input[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]);
        }
        5 if len > 0 => input.truncate(rng.index(len)),
        6 if len > 1 => {
            let at = rng.index(len);
            let n = 1 + rng.index((len - at).min(64));
            input.drain(at..at + n);
        }
        7 if len > 0 => {
            // Duplicate a chunk somewhere else.
            let at = rng.index(len);
            let n = 1 + rng.index((len - at).min(256));
            let chunk = input[at..at + n].to_vec();
            let to = rng.index(len + 1);
            input.splice(to..to, chunk);
        }
        8 => {
            let to = rng.index(len + 1);
            let n = 1 + rng.index(32);
            let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
            input.splice(to..to, bytes);
        }
        9 if !pool.is_empty() => {
            // Splice: a prefix of this one, a suffix of another.
            let other = &pool[rng.index(pool.len())];
            let cut = rng.index(len + 1);
            let from = rng.index(other.len() + 1);
            input.truncate(cut);
            input.extend_from_slice(&other[from..]);
        }
        10 if !pool.is_empty() => {
            let other = &pool[rng.index(pool.len())];
            input.extend_from_slice(other);
        }
        11 => {
            let token = DICTIONARY[rng.index(DICTIONARY.len())];
            let at = rng.index(len + 1);
            if rng.below(2) == 0 || at + token.len() > len {
                input.splice(at..at, token.iter().copied());
            } else {
                input[at..at + token.len()].copy_from_slice(token);
            }
        }
        _ => {
            let n = 1 + rng.index(64);
            input.extend((0..n).map(|_| rng.next() as u8));
        }
    }
    input.truncate(MAX_INPUT_BYTES);
}

/// What the watchdog needs to see: the input running and since when.
struct Watch {
    current: Mutex<Vec<u8>>,
    started_ms: AtomicU64,
    running: AtomicBool,
    target: Mutex<String>,
}

fn now_ms(origin: Instant) -> u64 {
    origin.elapsed().as_millis() as u64
}

/// Saves and exits on an execution that runs past [`HANG_AFTER`]: a hang
/// cannot be caught from inside.
fn start_watchdog(watch: Arc<Watch>, origin: Instant) {
    let spawned = thread::Builder::new()
        .name("watchdog".into())
        .spawn(move || {
            loop {
                thread::sleep(Duration::from_millis(500));
                let started = watch.started_ms.load(Ordering::SeqCst);
                if watch.running.load(Ordering::SeqCst)
                    && now_ms(origin).saturating_sub(started) > HANG_AFTER.as_millis() as u64
                {
                    let input = watch.current.lock().map(|g| g.clone()).unwrap_or_default();
                    let target = watch.target.lock().map(|g| g.clone()).unwrap_or_default();
                    let path = save_artifact(&target, "timeout", &input);
                    eprintln!(
                        "cube-fuzz-stable: {target}: an input ran for more than {} s; saved to {}",
                        HANG_AFTER.as_secs(),
                        path.display()
                    );
                    std::process::exit(1);
                }
            }
        });
    if let Err(e) = spawned {
        eprintln!("cube-fuzz-stable: no watchdog ({e}); hangs will not be caught");
    }
}

/// One execution; `Err(message)` if the target panicked.
fn execute(
    target: fn(&[u8]),
    input: &[u8],
    watch: &Watch,
    origin: Instant,
    last_panic: &Mutex<String>,
) -> Result<(), String> {
    if let Ok(mut current) = watch.current.lock() {
        current.clear();
        current.extend_from_slice(input);
    }
    watch.started_ms.store(now_ms(origin), Ordering::SeqCst);
    watch.running.store(true, Ordering::SeqCst);
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| target(input)));
    watch.running.store(false, Ordering::SeqCst);
    outcome.map_err(|_| last_panic.lock().map(|m| m.clone()).unwrap_or_default())
}

struct TargetOutcome {
    execs: u64,
    seconds: f64,
    crashes: u64,
    saved: Vec<(PathBuf, String)>,
}

fn fuzz_target(
    name: &str,
    target: fn(&[u8]),
    options: &Options,
    watch: &Watch,
    origin: Instant,
    last_panic: &Mutex<String>,
) -> TargetOutcome {
    if let Ok(mut t) = watch.target.lock() {
        name.clone_into(&mut t);
    }
    let mut seeds = read_inputs(&fuzz_dir().join("seeds").join(name));
    seeds.extend(read_inputs(&fuzz_dir().join("corpus").join(name)));
    if seeds.is_empty() {
        seeds.push(Vec::new());
    }
    let mut rng = Rng(options.seed ^ hash(name.as_bytes()));
    let mut outcome = TargetOutcome {
        execs: 0,
        seconds: 0.0,
        crashes: 0,
        saved: Vec::new(),
    };
    let mut seen = HashSet::new();
    let mut record = |input: &[u8], result: Result<(), String>, outcome: &mut TargetOutcome| {
        outcome.execs += 1;
        if let Err(message) = result {
            outcome.crashes += 1;
            // One artifact per distinct panic message (location included).
            if seen.insert(message.clone()) && outcome.saved.len() < MAX_SAVED_CRASHES {
                let path = save_artifact(name, "crash", input);
                eprintln!(
                    "cube-fuzz-stable: {name}: CRASH saved to {}\n  {message}",
                    path.display()
                );
                outcome.saved.push((path, message));
            }
        }
    };
    let started = Instant::now();
    let budget = Duration::from_secs(options.seconds);
    // The seeds as they are, first.
    for seed in &seeds {
        let result = execute(target, seed, watch, origin, last_panic);
        record(seed, result, &mut outcome);
    }
    let mut mutants: Vec<Vec<u8>> = Vec::with_capacity(POOL_MUTANTS);
    let mut input = Vec::new();
    loop {
        if options.runs.is_some_and(|runs| outcome.execs >= runs)
            || (options.runs.is_none() && started.elapsed() >= budget)
        {
            break;
        }
        let from_mutants = !mutants.is_empty() && rng.below(4) == 0;
        let base = if from_mutants {
            &mutants[rng.index(mutants.len())]
        } else {
            &seeds[rng.index(seeds.len())]
        };
        input.clear();
        input.extend_from_slice(base);
        for _ in 0..1 + rng.below(MAX_STACK) {
            mutate_once(&mut rng, &mut input, &seeds);
        }
        let result = execute(target, &input, watch, origin, last_panic);
        record(&input, result, &mut outcome);
        if mutants.len() < POOL_MUTANTS {
            mutants.push(input.clone());
        } else {
            let slot = rng.index(POOL_MUTANTS);
            mutants[slot].clone_from(&input);
        }
    }
    outcome.seconds = started.elapsed().as_secs_f64();
    outcome
}

fn main() -> ExitCode {
    let options = match parse_args() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("cube-fuzz-stable: {message}");
            return ExitCode::from(2);
        }
    };
    // Panics are findings, reported once per distinct message; the default
    // hook would print every one of thousands.
    let last_panic = Arc::new(Mutex::new(String::new()));
    let hook_slot = Arc::clone(&last_panic);
    panic::set_hook(Box::new(move |info| {
        if let Ok(mut slot) = hook_slot.lock() {
            *slot = info.to_string();
        }
    }));
    let origin = Instant::now();
    let watch = Arc::new(Watch {
        current: Mutex::new(Vec::new()),
        started_ms: AtomicU64::new(0),
        running: AtomicBool::new(false),
        target: Mutex::new(String::new()),
    });
    start_watchdog(Arc::clone(&watch), origin);

    if !options.replay.is_empty() {
        let name = &options.targets[0];
        let Some((_, target)) = TARGETS.iter().find(|(n, _)| n == name) else {
            return ExitCode::from(2);
        };
        let mut failed = false;
        for path in &options.replay {
            match fs::read(path) {
                Ok(input) => match execute(*target, &input, &watch, origin, &last_panic) {
                    Ok(()) => println!("{}: ok", path.display()),
                    Err(message) => {
                        println!("{}: CRASH\n  {message}", path.display());
                        failed = true;
                    }
                },
                Err(e) => {
                    eprintln!("cube-fuzz-stable: cannot read {}: {e}", path.display());
                    return ExitCode::from(2);
                }
            }
        }
        return if failed {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        };
    }

    println!(
        "cube-fuzz-stable: seed {} (FUZZ_SEED={} repeats the mutations), {}",
        options.seed,
        options.seed,
        match options.runs {
            Some(runs) => format!("{runs} runs per target"),
            None => format!("{} s per target", options.seconds),
        }
    );
    let mut crashed = false;
    for name in &options.targets {
        let Some((_, target)) = TARGETS.iter().find(|(n, _)| n == name) else {
            continue;
        };
        let outcome = fuzz_target(name, *target, &options, &watch, origin, &last_panic);
        crashed |= outcome.crashes > 0;
        println!(
            "{name:<16} {:>9} execs in {:>5.1} s = {:>8.0} execs/s, {} crash(es){}",
            outcome.execs,
            outcome.seconds,
            outcome.execs as f64 / outcome.seconds.max(1e-9),
            outcome.crashes,
            if outcome.saved.is_empty() {
                String::new()
            } else {
                format!(
                    " -> {}",
                    outcome
                        .saved
                        .iter()
                        .map(|(p, _)| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        );
    }
    if crashed {
        println!("FAILED: replay with `cube-fuzz-stable TARGET --replay FILE`");
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
